//! Man pages and shell completions, generated from a binary's own clap definition.
//!
//! Each binary calls [`generate_if_asked`] first thing in `main`. Run as
//! `TOOL --generate-docs DIR` (a hidden option, alone on the command line), it writes its
//! pages and completions under `DIR` in the layout of [`generate`] and exits; otherwise it
//! returns at once and the binary parses its arguments as usual. Generating from the binary
//! itself, rather than from a copy of its arguments in a build script, means the pages cannot
//! drift from what the binary accepts. `scripts/package.sh` runs it for the Debian package.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use clap::{Arg, Command};
use clap_complete::Shell;

/// The hidden option [`generate_if_asked`] answers.
pub const GENERATE_DOCS: &str = "generate-docs";

/// Why the pages or completions could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DocsError {
    /// A directory or file under the output directory could not be created or written.
    #[error("cannot write {}: {source} (is the directory writable?)", path.display())]
    Write {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The shells completions are written for, with where each file goes under `DIR/completions`
/// and what Debian's shells load it as (see [`generate`]).
const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// A completion file's name, as each shell's completion loader looks it up: bash by the
/// command's name, zsh by `_NAME`, fish by `NAME.fish`.
fn completion_file(shell: Shell, name: &str) -> String {
    match shell {
        Shell::Zsh => format!("_{name}"),
        Shell::Fish => format!("{name}.fish"),
        _ => name.to_owned(),
    }
}

/// Writes the man pages and shell completions of `cmd` under `dir`, returning the files:
///
/// - `man/man1/NAME.1`, and `NAME-SUB.1` for each subcommand (clap_mangen);
/// - `completions/bash/NAME`, `completions/zsh/_NAME`, `completions/fish/NAME.fish`
///   (clap_complete), named as `/usr/share/bash-completion/completions`,
///   `/usr/share/zsh/vendor-completions` and `/usr/share/fish/vendor_completions.d` expect.
///
/// # Examples
///
/// ```
/// use clap::{CommandFactory, Parser};
///
/// /// Frobnicate things.
/// #[derive(Parser)]
/// #[command(name = "frob", version)]
/// struct Cli {
///     /// How hard
///     #[arg(long)]
///     force: bool,
/// }
///
/// let dir = std::env::temp_dir().join(format!("rdma-cli-docs-{}", std::process::id()));
/// let files = rdma_cli::docs::generate(Cli::command(), &dir)?;
/// let page = std::fs::read_to_string(dir.join("man/man1/frob.1"))?;
/// assert!(page.contains("force"));
/// assert!(dir.join("completions/zsh/_frob").exists());
/// assert_eq!(files.len(), 4);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn generate(cmd: Command, dir: &Path) -> Result<Vec<PathBuf>, DocsError> {
    let mut cmd = cmd;
    // Subcommands' names and flags (help, version) are only filled in by build().
    cmd.build();
    let name = cmd.get_name().to_owned();
    let mut written = Vec::new();

    let man_dir = dir.join("man").join("man1");
    create_dir(&man_dir)?;
    write_pages(&cmd, &name, &man_dir, &mut written)?;

    for shell in SHELLS {
        let shell_dir = dir.join("completions").join(shell.to_string());
        create_dir(&shell_dir)?;
        let path = shell_dir.join(completion_file(shell, &name));
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut cmd, &name, &mut script);
        write(&path, &script)?;
        written.push(path);
    }
    Ok(written)
}

/// `cmd`'s page as `NAME.1`, then each visible subcommand's as `NAME-SUB.1`, recursively.
fn write_pages(
    cmd: &Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> Result<(), DocsError> {
    let path = dir.join(format!("{name}.1"));
    let mut page = Vec::new();
    // A subcommand's page is titled by its full name (not just `init`), so that
    // `man secure-server-certs-init` finds what its header says.
    clap_mangen::Man::new(cmd.clone())
        .title(name.to_owned())
        .render(&mut page)
        .map_err(|source| DocsError::Write {
            path: path.clone(),
            source,
        })?;
    write(&path, &page)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

fn create_dir(path: &Path) -> Result<(), DocsError> {
    fs::create_dir_all(path).map_err(|source| DocsError::Write {
        path: path.to_owned(),
        source,
    })
}

fn write(path: &Path, bytes: &[u8]) -> Result<(), DocsError> {
    fs::write(path, bytes).map_err(|source| DocsError::Write {
        path: path.to_owned(),
        source,
    })
}

/// The output directory if `args` (the whole command line, program name first) is exactly
/// `PROGRAM --generate-docs DIR`; anything else is the binary's own business.
///
/// ```
/// use rdma_cli::docs::docs_dir;
///
/// assert_eq!(docs_dir(["tool", "--generate-docs", "out"]), Some("out".into()));
/// assert_eq!(docs_dir(["tool", "--generate-docs=out"]), Some("out".into()));
/// assert_eq!(docs_dir(["tool", "--generate-docs", "out", "--force"]), None);
/// assert_eq!(docs_dir(["tool", "--help"]), None);
/// ```
pub fn docs_dir<I, T>(args: I) -> Option<PathBuf>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    // A command of its own rather than an argument of every binary's: the binaries' required
    // arguments would otherwise have to be made optional for it.
    Command::new("docs")
        .arg(
            Arg::new(GENERATE_DOCS)
                .long(GENERATE_DOCS)
                .value_name("DIR")
                .required(true)
                .value_parser(clap::value_parser!(PathBuf)),
        )
        .disable_help_flag(true)
        .try_get_matches_from(args)
        .ok()?
        .remove_one::<PathBuf>(GENERATE_DOCS)
}

/// Answers `PROGRAM --generate-docs DIR`: writes the man pages and completions of the command
/// `cmd` builds (see [`generate`]), lists them on stdout and exits 0, or exits 1 with the
/// reason on stderr in the family's format. Any other command line returns at once, without
/// calling `cmd`.
///
/// ```no_run
/// use clap::{CommandFactory, Parser};
///
/// #[derive(Parser)]
/// #[command(name = "frob", version)]
/// struct Cli {
///     path: std::path::PathBuf,
/// }
///
/// rdma_cli::docs::generate_if_asked(Cli::command);
/// let cli = Cli::parse();
/// # let _ = cli.path;
/// ```
pub fn generate_if_asked(cmd: impl FnOnce() -> Command) {
    let Some(dir) = docs_dir(std::env::args_os()) else {
        return;
    };
    let cmd = cmd();
    let name = cmd.get_name().to_owned();
    match generate(cmd, &dir) {
        Ok(files) => {
            for file in files {
                println!("{}", file.display());
            }
            std::process::exit(0);
        }
        Err(e) => {
            eprintln!("{name}: error: {e}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Like secure-server: a subcommand with its own subcommands, and a required argument.
    fn family() -> Command {
        Command::new("tool")
            .version("1.2.3")
            .about("Does things")
            .arg(Arg::new("path").required(true))
            .subcommand(
                Command::new("certs")
                    .about("Certificates")
                    .subcommand(Command::new("init").about("Make them"))
                    .subcommand(Command::new("secret").hide(true)),
            )
    }

    #[test]
    fn pages_for_every_visible_subcommand_and_three_shells() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = generate(family(), dir.path()).expect("generate");
        let names: Vec<String> = files
            .iter()
            .map(|f| {
                f.strip_prefix(dir.path())
                    .expect("under dir")
                    .display()
                    .to_string()
            })
            .collect();
        assert_eq!(
            names,
            [
                "man/man1/tool.1",
                "man/man1/tool-certs.1",
                "man/man1/tool-certs-init.1",
                "completions/bash/tool",
                "completions/zsh/_tool",
                "completions/fish/tool.fish",
            ]
        );
        let page = fs::read_to_string(dir.path().join("man/man1/tool-certs-init.1"))
            .expect("read the page");
        assert!(page.contains(".TH tool-certs-init 1"), "{page}");
        let bash = fs::read_to_string(dir.path().join("completions/bash/tool")).expect("read");
        assert!(bash.contains("certs"), "{bash}");
    }

    #[test]
    fn an_unwritable_directory_is_a_typed_error_naming_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("file");
        fs::write(&file, b"").expect("write");
        let err = generate(family(), &file).expect_err("a file is no directory");
        let DocsError::Write { path, .. } = &err;
        assert!(path.starts_with(&file), "{err}");
        assert!(err.to_string().contains("cannot write"), "{err}");
    }
}
