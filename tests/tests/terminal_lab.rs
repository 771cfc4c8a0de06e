//! secure-client on a terminal, driven through tmux as a user would type:
//! Tab completion of the commands, history recalled and edited with the
//! arrow keys, history kept in `$XDG_STATE_HOME` across runs, Ctrl-D to
//! leave. The server must receive exactly the messages typed.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use secure_rdma_tests::secure::{bin, Pki, ServerProc};
use secure_rdma_tests::{require_lab, text, ADDR_A};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(90);

/// A tmux server of this test alone (its own socket), one session, one pane.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// Starts `command` in a detached 200x50 session. Panes stay after their command exits
    /// (remain-on-exit, set by the config file before the session exists) so the test reads the
    /// last screen.
    fn start(dir: &Path, command: &str) -> Tmux {
        let conf = dir.join("tmux.conf");
        std::fs::write(&conf, "set -g remain-on-exit on\n").expect("write tmux.conf");
        let tmux = Tmux {
            socket: format!("secure-rdma-terminal-lab-{}", std::process::id()),
        };
        let out = tmux.run(&[
            "-f",
            conf.to_str().expect("utf-8 path"),
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            "200",
            "-y",
            "50",
            command,
        ]);
        assert!(
            out.status.success(),
            "tmux new-session: {}",
            text(&out.stderr)
        );
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket])
            .args(args)
            // tmux refuses to start without a terminal type; the pane gets its own.
            .env(
                "TERM",
                std::env::var("TERM").unwrap_or_else(|_| "xterm".into()),
            )
            .output()
            .unwrap_or_else(|e| panic!("running tmux {args:?}: {e}"))
    }

    /// Types text literally.
    fn type_text(&self, s: &str) {
        let out = self.run(&["send-keys", "-t", "t", "-l", s]);
        assert!(out.status.success(), "send-keys: {}", text(&out.stderr));
    }

    /// Presses keys by tmux name (Tab, Enter, Up, Left, C-d).
    fn press(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "t"];
        args.extend(keys);
        let out = self.run(&args);
        assert!(out.status.success(), "send-keys: {}", text(&out.stderr));
    }

    /// What the pane's processes are doing (state, kernel wait channel, kernel stack of every
    /// thread), for the message of a test that timed out.
    fn pane_processes(&self) -> String {
        let pid = text(
            &self
                .run(&["display-message", "-p", "-t", "t", "#{pane_pid}"])
                .stdout,
        );
        let pid = pid.trim();
        let mut report = format!("pane pid {pid}\n");
        let ps = Command::new("ps")
            .args(["-eLo", "pid,ppid,tid,stat,wchan:32,comm"])
            .output()
            .map(|o| text(&o.stdout))
            .unwrap_or_default();
        report.push_str(&ps);
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for t in tasks.flatten() {
                let stack = std::fs::read_to_string(t.path().join("stack")).unwrap_or_default();
                let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
                report.push_str(&format!("task {:?} {comm}{stack}\n", t.file_name()));
            }
        }
        report
    }

    fn screen(&self) -> String {
        text(&self.run(&["capture-pane", "-p", "-t", "t"]).stdout)
    }

    /// Polls the screen until `pred` holds; fails with the screen at the deadline.
    fn wait_screen(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "timed out waiting for {what}; screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The exit status once the pane's command has exited, as the shell around it printed it
    /// (`{command}; echo "exited with $?"`). Not tmux's `pane_dead_status`: in the lab VM tmux
    /// did not reap the pane's process (a zombie, `pane_dead` 1 and the status empty).
    fn wait_exit(&self) -> i32 {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if let Some(code) = screen.lines().find_map(|l| l.strip_prefix(EXITED)) {
                return code
                    .trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("{code:?}: {e}"));
            }
            assert!(
                start.elapsed() < DEADLINE,
                "secure-client still running; screen:\n{screen}\n{}",
                self.pane_processes()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What the pane's shell prints when secure-client has exited, before the status.
const EXITED: &str = "secure-client exited with ";

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.run(&["kill-server"]);
    }
}

/// Lines showing exactly this prompt and input.
fn shown(screen: &str, line: &str) -> usize {
    screen.lines().filter(|l| l.trim_end() == line).count()
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn the_prompt_completes_recalls_edits_and_keeps_history() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["tty".to_owned()]);
    let server = ServerProc::start(&pki, 4802, &[]);
    let state = tempfile::tempdir().expect("tempdir");
    let client = format!(
        "env XDG_STATE_HOME={state} {bin} {ADDR_A} --port 4802 --certs {certs} --name tty --timeout 10; \
         echo \"{EXITED}$?\"",
        state = state.path().display(),
        bin = bin("secure-client").display(),
        certs = pki.dir().display(),
    );

    let tmux = Tmux::start(state.path(), &client);
    tmux.wait_screen("the prompt", |s| s.contains("secure-client>"));
    // Tab completes the command word, ready for its argument.
    tmux.type_text("se");
    tmux.press(&["Tab"]);
    tmux.wait_screen("'se' completed to 'send '", |s| {
        shown(s, "secure-client> send") == 1
    });
    tmux.type_text("hello");
    tmux.press(&["Enter"]);
    tmux.wait_screen("the first acknowledgement", |s| {
        s.contains("server acknowledged send #1: 5 bytes")
    });
    // Up recalls it; typing appends.
    tmux.press(&["Up"]);
    tmux.wait_screen("'send hello' recalled", |s| {
        shown(s, "secure-client> send hello") == 2
    });
    tmux.type_text(" world");
    tmux.press(&["Enter"]);
    tmux.wait_screen("the second acknowledgement", |s| {
        s.contains("server acknowledged send #2: 11 bytes")
    });
    // Up, then the cursor moved left into the line: the edit lands in the middle.
    tmux.press(&["Up"]);
    tmux.wait_screen("'send hello world' recalled", |s| {
        shown(s, "secure-client> send hello world") == 2
    });
    tmux.press(&["Left", "Left", "Left", "Left", "Left", "Left"]);
    tmux.type_text(",");
    tmux.press(&["Enter"]);
    tmux.wait_screen("the third acknowledgement", |s| {
        s.contains("server acknowledged send #3: 12 bytes")
    });
    tmux.type_text("qu");
    tmux.press(&["Tab"]);
    tmux.wait_screen("'qu' completed to 'quit'", |s| {
        shown(s, "secure-client> quit") == 1
    });
    tmux.press(&["Enter"]);
    assert_eq!(tmux.wait_exit(), 0, "screen:\n{}", tmux.screen());
    assert!(tmux.screen().contains("disconnected"));
    drop(tmux);

    // The history is in $XDG_STATE_HOME, private, and a new run recalls it.
    let history = state.path().join("secure-rdma/client_history");
    let saved =
        std::fs::read_to_string(&history).unwrap_or_else(|e| panic!("{}: {e}", history.display()));
    let entries: Vec<&str> = saved.lines().filter(|l| !l.starts_with("#V")).collect();
    assert_eq!(
        entries,
        [
            "send hello",
            "send hello world",
            "send hello, world",
            "quit"
        ],
        "{saved}"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&history)
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "history file mode {mode:o}");

    let tmux = Tmux::start(state.path(), &client);
    tmux.wait_screen("the prompt", |s| s.contains("secure-client>"));
    tmux.press(&["Up", "Up"]);
    tmux.wait_screen("the previous run's 'send hello, world' recalled", |s| {
        shown(s, "secure-client> send hello, world") == 1
    });
    tmux.press(&["Enter"]);
    tmux.wait_screen("the acknowledgement in the second run", |s| {
        s.contains("server acknowledged send #1: 12 bytes")
    });
    // Ctrl-D on an empty line leaves like quit.
    tmux.press(&["C-d"]);
    assert_eq!(tmux.wait_exit(), 0, "screen:\n{}", tmux.screen());
    drop(tmux);

    server
        .log
        .wait_for("client gone", 2, DEADLINE, |l| l.contains("client gone"));
    let received: Vec<Value> = server
        .events("SEND received")
        .into_iter()
        .filter(|e| e["client"] == "tty")
        .map(|e| e["content"].clone())
        .collect();
    let want: Vec<Value> = ["hello", "hello world", "hello, world", "hello, world"]
        .iter()
        .map(|m| Value::from(format!("{m:?}")))
        .collect();
    assert_eq!(received, want);
}
