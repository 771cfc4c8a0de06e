//! The prompt on a terminal: line editing, history kept in a file and Tab
//! completion of the commands (rustyline).
//!
//! rustyline blocks in `read(2)` on the terminal, so it runs on a thread of
//! its own and hands each line to the async command loop over a channel.
//! The loop asks for a line only when it is ready for one, so the prompt is
//! drawn after the previous command's output, never in the middle of it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use rustyline::completion::{Completer, Pair};
use rustyline::error::ReadlineError;
use rustyline::highlight::Highlighter;
use rustyline::hint::Hinter;
use rustyline::history::FileHistory;
use rustyline::validate::Validator;
use rustyline::{Config, Context, Editor, Helper};

/// What the prompt shows.
const PROMPT: &str = "secure-client> ";

/// Entries kept in the history file.
const HISTORY_SIZE: usize = 1000;

/// The commands Tab completes, and whether each takes an argument (then the
/// completion ends with a space, ready for it).
pub const COMMANDS: &[(&str, bool)] = &[
    ("send", true),
    ("write", true),
    ("lane", false),
    ("lanes", false),
    ("help", false),
    ("quit", false),
    ("exit", false),
];

/// Why no line could be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// Standard input (not a terminal) failed.
    #[error("reading stdin: {0}")]
    Stdin(#[source] std::io::Error),
    /// The terminal failed under the line editor.
    #[error("reading the terminal: {0}")]
    Terminal(#[source] ReadlineError),
    /// The prompt's thread could not be started.
    #[error("cannot start the prompt's thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The prompt's thread ended (it panicked).
    #[error("the prompt stopped; use -e or pipe commands into stdin instead")]
    Gone,
}

/// The history file: `$XDG_STATE_HOME/secure-rdma/client_history`, else
/// `~/.local/state/secure-rdma/client_history`; `None` without either.
pub fn history_path() -> Option<PathBuf> {
    history_path_from(std::env::var_os("XDG_STATE_HOME"), std::env::var_os("HOME"))
}

fn history_path_from(xdg_state_home: Option<OsString>, home: Option<OsString>) -> Option<PathBuf> {
    // The XDG base directory spec: a relative path is invalid and is ignored.
    let state = xdg_state_home
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            home.map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".local/state"))
        })?;
    Some(state.join("secure-rdma").join("client_history"))
}

/// Completes the command word; what follows it is the user's own text.
struct Commands;

impl Completer for Commands {
    type Candidate = Pair;

    fn complete(
        &self,
        line: &str,
        pos: usize,
        _ctx: &Context<'_>,
    ) -> rustyline::Result<(usize, Vec<Pair>)> {
        Ok(complete(line, pos))
    }
}

/// Candidates for the word before `pos`, and where that word starts.
fn complete(line: &str, pos: usize) -> (usize, Vec<Pair>) {
    let head = line.get(..pos).unwrap_or(line);
    let word = head.trim_start();
    let start = head.len() - word.len();
    if word.contains(char::is_whitespace) {
        return (pos, Vec::new());
    }
    let candidates = COMMANDS
        .iter()
        .filter(|(name, _)| name.starts_with(word))
        .map(|&(name, takes_argument)| Pair {
            display: name.to_owned(),
            replacement: if takes_argument {
                format!("{name} ")
            } else {
                name.to_owned()
            },
        })
        .collect();
    (start, candidates)
}

// No hints, colours or multi-line input: the defaults of these traits.
impl Hinter for Commands {
    type Hint = String;
}
impl Highlighter for Commands {}
impl Validator for Commands {}
impl Helper for Commands {}

/// What the prompt's thread read.
type Read = Result<Option<String>, ReadlineError>;

/// The terminal prompt, running on its own thread.
pub struct Prompt {
    /// One message per line wanted.
    wanted: std::sync::mpsc::Sender<()>,
    lines: tokio::sync::mpsc::Receiver<Read>,
    /// A line was asked for and has not come yet.
    asked: bool,
    /// The terminal's settings at start, put back when the prompt is dropped: the client may
    /// exit while the editor holds the terminal in raw mode (a lost session, no reconnection).
    termios: Option<libc::termios>,
}

impl Prompt {
    /// Starts the editor with the history of `history` (created 0600 in a 0700 directory if
    /// missing; its messages may be confidential).
    pub fn start(history: Option<PathBuf>) -> Result<Prompt, InputError> {
        let config = Config::builder()
            .max_history_size(HISTORY_SIZE)
            .and_then(|c| c.history_ignore_dups(true))
            .map_err(InputError::Terminal)?
            .auto_add_history(false)
            .build();
        let mut editor: Editor<Commands, FileHistory> =
            Editor::with_config(config).map_err(InputError::Terminal)?;
        editor.set_helper(Some(Commands));
        let history = history.and_then(|path| match open_history(&mut editor, &path) {
            Ok(()) => Some(path),
            Err(e) => {
                eprintln!(
                    "secure-client: warning: history file {}: {e}; history is kept for this run only",
                    path.display()
                );
                None
            }
        });
        let termios = saved_termios();
        let (wanted, asks) = std::sync::mpsc::channel::<()>();
        // One line at a time: the thread reads the next only when asked.
        let (tx, lines) = tokio::sync::mpsc::channel::<Read>(1);
        std::thread::Builder::new()
            .name("prompt".into())
            .spawn(move || edit(editor, history, asks, tx))
            .map_err(InputError::Thread)?;
        Ok(Prompt {
            wanted,
            lines,
            asked: false,
            termios,
        })
    }

    /// The next line; `None` at end of input (Ctrl-D). Ctrl-C gives an empty line, a new
    /// prompt. Cancel-safe: a line asked for and not read yet is kept for the next call.
    pub async fn next_line(&mut self) -> Result<Option<String>, InputError> {
        if !self.asked {
            self.wanted.send(()).map_err(|_| InputError::Gone)?;
            self.asked = true;
        }
        let read = self.lines.recv().await.ok_or(InputError::Gone)?;
        self.asked = false;
        match read {
            Ok(line) => Ok(line),
            Err(ReadlineError::Interrupted) => Ok(Some(String::new())),
            Err(e) => Err(InputError::Terminal(e)),
        }
    }
}

impl Drop for Prompt {
    fn drop(&mut self) {
        if let Some(t) = &self.termios {
            // SAFETY: tcsetattr(3) on standard input with settings tcgetattr gave for it.
            unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t) };
        }
    }
}

fn saved_termios() -> Option<libc::termios> {
    // SAFETY: tcgetattr(3) fills the zeroed struct (plain integers) or fails.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    (unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut t) } == 0).then_some(t)
}

/// Makes the history file private if new and loads it.
fn open_history(
    editor: &mut Editor<Commands, FileHistory>,
    path: &Path,
) -> Result<(), ReadlineError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(path)?;
    editor.load_history(path)
}

/// The prompt's thread: a line per request until the command loop is gone.
fn edit(
    mut editor: Editor<Commands, FileHistory>,
    mut history: Option<PathBuf>,
    asks: std::sync::mpsc::Receiver<()>,
    lines: tokio::sync::mpsc::Sender<Read>,
) {
    while asks.recv().is_ok() {
        let read = match editor.readline(PROMPT) {
            Ok(line) => {
                remember(&mut editor, &mut history, &line);
                Ok(Some(line))
            }
            Err(ReadlineError::Eof) => Ok(None),
            Err(e) => Err(e),
        };
        if lines.blocking_send(read).is_err() {
            break;
        }
    }
}

/// Adds a line to the history and appends it to the file at once, so a client that is killed
/// keeps its history; after a failure to write, the rest of the run keeps it in memory only.
fn remember(editor: &mut Editor<Commands, FileHistory>, history: &mut Option<PathBuf>, line: &str) {
    if line.trim().is_empty() || !editor.add_history_entry(line).unwrap_or(false) {
        return;
    }
    if let Some(path) = history.as_deref() {
        if let Err(e) = editor.append_history(path) {
            eprintln!(
                "secure-client: warning: cannot save history to {}: {e}; history is kept for this run only",
                path.display()
            );
            *history = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(line: &str) -> (usize, Vec<String>) {
        let (start, c) = complete(line, line.len());
        (start, c.into_iter().map(|p| p.replacement).collect())
    }

    #[test]
    fn tab_completes_the_command_word_only() {
        assert_eq!(names("se"), (0, vec!["send ".to_owned()]));
        assert_eq!(names("  w"), (2, vec!["write ".to_owned()]));
        assert_eq!(names("q"), (0, vec!["quit".to_owned()]));
        assert_eq!(names("").1.len(), COMMANDS.len());
        assert!(names("send he").1.is_empty());
        assert!(names("x").1.is_empty());
        // Every command it offers is one the prompt understands.
        for (name, takes_argument) in COMMANDS {
            let line = if *takes_argument {
                format!("{name} x")
            } else {
                (*name).to_owned()
            };
            assert!(matches!(crate::parse(&line), Ok(Some(_))), "{line}");
        }
    }

    #[test]
    fn history_follows_the_xdg_state_directory() {
        let p = |x: Option<&str>, h: Option<&str>| {
            history_path_from(x.map(Into::into), h.map(Into::into))
        };
        assert_eq!(
            p(Some("/state"), Some("/home/a")),
            Some(PathBuf::from("/state/secure-rdma/client_history"))
        );
        assert_eq!(
            p(None, Some("/home/a")),
            Some(PathBuf::from(
                "/home/a/.local/state/secure-rdma/client_history"
            ))
        );
        // A relative XDG_STATE_HOME is invalid by the spec: ignored.
        assert_eq!(
            p(Some("rel"), Some("/home/a")),
            Some(PathBuf::from(
                "/home/a/.local/state/secure-rdma/client_history"
            ))
        );
        assert_eq!(p(None, None), None);
    }
}
