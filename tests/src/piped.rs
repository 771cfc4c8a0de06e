//! A client program driven through its standard input, one command at a time, with its
//! stdout and stderr collected line by line: `secure-client` in piped mode, or the library-only
//! `message_client` example (one message per line). The attack and resume lab tests type
//! commands, wait for acknowledgements and read the lines a lost session prints.

use std::io::Write;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::secure::Lines;
use crate::wait_until;

/// How long one lab step may take under TCG before the test fails.
const STEP: Duration = Duration::from_secs(90);

/// Which client program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// `secure-client HOST ...`: commands `send TEXT`, `write TEXT`, `quit`.
    SecureClient,
    /// The `message_client` example: each line is a message to SEND; end of input quits.
    MessageClient,
}

impl Program {
    /// The prefix of the program's own lines on stderr.
    pub fn prefix(self) -> &'static str {
        match self {
            Program::SecureClient => "secure-client: ",
            Program::MessageClient => "message_client: ",
        }
    }

    /// The start of its acknowledgement lines on stdout.
    pub fn ack_prefix(self) -> &'static str {
        match self {
            Program::SecureClient => "server acknowledged ",
            Program::MessageClient => "acknowledged ",
        }
    }

    /// The start of the line it prints once connected.
    fn connected_prefix(self) -> &'static str {
        match self {
            Program::SecureClient => "connected to ",
            Program::MessageClient => "connected as ",
        }
    }

    /// The stdin line that SENDs `msg`.
    pub fn send_line(self, msg: &str) -> String {
        match self {
            Program::SecureClient => format!("send {msg}"),
            Program::MessageClient => msg.to_owned(),
        }
    }
}

/// A client reading commands from a pipe.
pub struct Piped {
    /// The process.
    pub child: Child,
    stdin: Option<ChildStdin>,
    /// Its stdout lines.
    pub out: Lines,
    /// Its stderr lines.
    pub err: Lines,
    /// Which program it is.
    pub program: Program,
}

impl Piped {
    /// Starts `cmd` (a `program` with its arguments) with piped stdio and waits until it is
    /// connected.
    pub fn start(mut cmd: Command, program: Program) -> Piped {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
        let stdin = child.stdin.take();
        let out = Lines::collect(child.stdout.take().expect("stdout"));
        let err = Lines::collect(child.stderr.take().expect("stderr"));
        let p = Piped {
            child,
            stdin,
            out,
            err,
            program,
        };
        p.wait_out(
            "connected",
            |l| l.starts_with(program.connected_prefix()),
            1,
        );
        p
    }

    /// `secure-client` as `name` against the server on 10.77.0.1:`port`, each step bounded by
    /// `timeout_secs`, with `extra` flags.
    pub fn secure_client(
        certs: &Path,
        port: u16,
        name: &str,
        timeout_secs: u64,
        extra: &[&str],
    ) -> Piped {
        let mut cmd = crate::secure::client_command(certs, port, Some(name), timeout_secs);
        cmd.args(extra);
        Piped::start(cmd, Program::SecureClient)
    }

    /// The `message_client` example as `name` against 10.77.0.1:`port`, with `extra` flags;
    /// its messages come from stdin.
    pub fn message_client(certs: &Path, port: u16, name: &str, extra: &[&str]) -> Piped {
        let mut cmd = crate::example::example("message_client");
        cmd.args([crate::ADDR_A, "--port", &port.to_string(), "--name", name])
            .arg("--certs")
            .arg(certs)
            .args(extra)
            .env("RUST_LOG", "secure_rdma=debug");
        Piped::start(cmd, Program::MessageClient)
    }

    /// Both outputs, for failure messages.
    pub fn context(&self) -> String {
        format!(
            "client stdout:\n{}\nclient stderr:\n{}",
            self.out.snapshot().join("\n"),
            self.err.snapshot().join("\n")
        )
    }

    /// Waits until `n` stdout lines match.
    pub fn wait_out(&self, what: &str, pred: impl Fn(&str) -> bool, n: usize) {
        wait_until(
            &format!("client: {n} x {what}"),
            STEP,
            || self.out.snapshot().iter().filter(|l| pred(l)).count() >= n,
            || self.context(),
        );
    }

    /// Waits until `n` stderr lines match.
    pub fn wait_err(&self, what: &str, pred: impl Fn(&str) -> bool, n: usize) {
        wait_until(
            &format!("client stderr: {n} x {what}"),
            STEP,
            || self.err.snapshot().iter().filter(|l| pred(l)).count() >= n,
            || self.context(),
        );
    }

    /// The program's own stderr lines (its prefix taken off), without log lines.
    pub fn said(&self) -> Vec<String> {
        self.err
            .snapshot()
            .iter()
            .filter_map(|l| l.strip_prefix(self.program.prefix()))
            .map(str::to_owned)
            .collect()
    }

    /// Sends the client process a signal (e.g. SIGSTOP and SIGCONT to hold it still).
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// Types a line.
    pub fn command(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        let wrote = writeln!(stdin, "{line}").and_then(|()| stdin.flush());
        if let Err(e) = wrote {
            // The client exited: what it said is why.
            panic!("write to the client: {e}\n{}", self.context());
        }
    }

    /// Types the line that SENDs `msg`.
    pub fn send(&mut self, msg: &str) {
        let line = self.program.send_line(msg);
        self.command(&line);
    }

    /// The acknowledgements it printed.
    pub fn acks(&self) -> Vec<String> {
        let prefix = self.program.ack_prefix();
        self.out
            .snapshot()
            .into_iter()
            .filter(|l| l.starts_with(prefix))
            .collect()
    }

    /// Types `line` and waits for the next acknowledgement; returns it.
    pub fn op(&mut self, line: &str) -> String {
        let n = self.acks().len() + 1;
        self.command(line);
        let prefix = self.program.ack_prefix();
        self.wait_out("acknowledgement", |l| l.starts_with(prefix), n);
        self.acks().pop().expect("an acknowledgement")
    }

    /// SENDs `msg` and waits for its acknowledgement; returns it.
    pub fn send_acked(&mut self, msg: &str) -> String {
        let line = self.program.send_line(msg);
        self.op(&line)
    }

    /// Quits and says whether it exited 0 (printing what it said if not).
    pub fn quit_ok(self) -> bool {
        let ctx = self.context();
        let s = self.quit_status();
        if !s.success() {
            eprintln!("client exited {s}\n{ctx}");
        }
        s.success()
    }

    /// Quits (`quit` for secure-client, the end of input for message_client) and waits for
    /// the exit.
    pub fn quit_status(self) -> ExitStatus {
        // Moves out of self: Drop still reaps if quit panics.
        let mut this = self;
        if this.program == Program::SecureClient {
            this.command("quit");
        }
        drop(this.stdin.take());
        let start = Instant::now();
        loop {
            if let Some(s) = this.child.try_wait().expect("try_wait") {
                // Its last lines may still be in the pipes.
                this.out.wait_closed(Duration::from_secs(10));
                this.err.wait_closed(Duration::from_secs(10));
                return s;
            }
            assert!(
                start.elapsed() < STEP,
                "the client did not quit\n{}",
                this.context()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Piped {
    /// Waits for the program to exit on its own (nothing typed: it may have closed its
    /// stdin already) and returns its status, with every line it wrote collected.
    pub fn wait_exit(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                self.out.wait_closed(Duration::from_secs(10));
                self.err.wait_closed(Duration::from_secs(10));
                return s;
            }
            assert!(
                start.elapsed() < STEP,
                "the client did not exit\n{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Piped {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
