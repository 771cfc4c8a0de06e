//! The secure-rdma crate's examples as lab programs: `message_server`, an application that
//! receives through the library's handler API and prints each delivery, and `message_client`
//! (driven through [`crate::piped::Piped`]). `scripts/test.sh` builds them
//! (`cargo build --examples`).

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::secure::Lines;
use crate::{bin_dir, ADDR_A};

/// How long a lab step may take under TCG before the test fails.
const STEP: Duration = Duration::from_secs(90);

/// A command for the built example `name`; fails the test if it was not built.
pub fn example(name: &str) -> Command {
    let path = bin_dir().join("examples").join(name);
    assert!(
        path.exists(),
        "{} missing: build the examples first (cargo build -p secure-rdma --examples)",
        path.display()
    );
    Command::new(path)
}

/// One delivery line of `message_server --ids`: `identity #SEQ: "content"`, with
/// ` (possibly delivered)` when the library flagged it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivered {
    /// The client's identity.
    pub identity: String,
    /// The stream sequence.
    pub seq: u64,
    /// The content as printed, without its quotes.
    pub content: String,
    /// Flagged as possibly delivered before (replayed after the server lost the stream).
    pub possibly: bool,
}

impl Delivered {
    /// The delivery a line of `message_server --ids` shows, if it is one.
    pub fn parse(line: &str) -> Option<Delivered> {
        let (head, rest) = line.split_once(": ")?;
        let (identity, seq) = head.rsplit_once(" #")?;
        let seq = seq.parse().ok()?;
        let (content, possibly) = match rest.strip_suffix(" (possibly delivered)") {
            Some(c) => (c, true),
            None => (rest, false),
        };
        let content = content.strip_prefix('"')?.strip_suffix('"')?;
        Some(Delivered {
            identity: identity.to_owned(),
            seq,
            content: content.to_owned(),
            possibly,
        })
    }
}

/// The sequence number of a `skipped duplicate #N` line.
pub fn skipped_duplicate(line: &str) -> Option<u64> {
    let (_, n) = line.split_once("skipped duplicate #")?;
    let digits: String = n.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// A running `message_server` on 10.77.0.1.
pub struct MessageServer {
    /// The process.
    pub child: Child,
    /// Its stdout: the listening line, one line per delivery, the summary.
    pub out: Lines,
    /// Its stderr (the library's warnings).
    pub err: Lines,
    /// Its port.
    pub port: u16,
}

impl MessageServer {
    /// Starts `message_server --listen 10.77.0.1:PORT --certs DIR EXTRA...` and waits until it
    /// listens.
    pub fn start(certs: &Path, port: u16, extra: &[&str]) -> MessageServer {
        let mut child = example("message_server")
            .args(["--listen", &format!("{ADDR_A}:{port}")])
            .arg("--certs")
            .arg(certs)
            .args(extra)
            // Info: "client connected", "client gone" and the authentication warnings.
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn message_server");
        let out = Lines::collect(child.stdout.take().expect("stdout"));
        let err = Lines::collect(child.stderr.take().expect("stderr"));
        let s = MessageServer {
            child,
            out,
            err,
            port,
        };
        s.out.wait_for("listening line", 1, STEP, |l| {
            l.starts_with("message_server listening on ")
        });
        s
    }

    /// Both outputs, for failure messages.
    pub fn context(&self) -> String {
        format!(
            "message_server stdout:\n{}\nmessage_server stderr:\n{}",
            self.out.snapshot().join("\n"),
            self.err.snapshot().join("\n")
        )
    }

    /// The deliveries it printed so far (with `--ids`).
    pub fn deliveries(&self) -> Vec<Delivered> {
        self.out
            .snapshot()
            .iter()
            .filter_map(|l| Delivered::parse(l))
            .collect()
    }

    /// The sequence numbers it skipped as duplicates (with `--persist`).
    pub fn skipped(&self) -> Vec<u64> {
        self.out
            .snapshot()
            .iter()
            .filter_map(|l| skipped_duplicate(l))
            .collect()
    }

    /// Stderr lines containing `needle` (the library's log at info).
    pub fn log_count(&self, needle: &str) -> usize {
        self.err
            .snapshot()
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Sessions set up ("client connected").
    pub fn sessions(&self) -> usize {
        self.log_count("client connected")
    }

    /// Sessions ended ("client gone").
    pub fn sessions_ended(&self) -> usize {
        self.log_count("client gone")
    }

    /// RDMA messages that failed authentication (each tears its session down).
    pub fn auth_failures(&self) -> usize {
        self.log_count("failed authentication (forged, replayed or corrupted); tearing")
    }

    /// Waits until `cond` holds on the server; fails with its context at `deadline`.
    pub fn wait_until(
        &self,
        what: &str,
        deadline: Duration,
        cond: impl Fn(&MessageServer) -> bool,
    ) {
        let start = Instant::now();
        while !cond(self) {
            assert!(
                start.elapsed() < deadline,
                "timed out after {deadline:?} waiting for {what}\n{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends it a signal.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        let rc = unsafe { libc::kill(self.child.id() as i32, sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// Stops it (SIGTERM), checks that it exited cleanly, and returns every line it printed
    /// (its deliveries and, last, its summary).
    pub fn stop(&mut self) -> Vec<String> {
        self.signal(libc::SIGTERM);
        let status = self.wait();
        assert!(
            status.success(),
            "message_server: {status}\n{}",
            self.context()
        );
        self.out.snapshot()
    }

    /// Waits for its exit after a signal; every line it printed is then in `out`.
    pub fn wait(&mut self) -> ExitStatus {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                start.elapsed() < STEP,
                "message_server did not exit\n{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.out.wait_closed(Duration::from_secs(10));
        status
    }
}

impl Drop for MessageServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_lines_parse_and_other_lines_do_not() {
        assert_eq!(
            Delivered::parse("victim #12: \"MSG-12\""),
            Some(Delivered {
                identity: "victim".into(),
                seq: 12,
                content: "MSG-12".into(),
                possibly: false,
            })
        );
        assert_eq!(
            Delivered::parse("victim #7: \"a: b\" (possibly delivered)"),
            Some(Delivered {
                identity: "victim".into(),
                seq: 7,
                content: "a: b".into(),
                possibly: true,
            })
        );
        for other in [
            "message_server listening on 10.77.0.1:4433",
            "victim: \"no ids\"",
            "victim: 200 messages, 1000 bytes",
            "served 1 clients (0 refused)",
            "victim: skipped duplicate #5",
        ] {
            assert_eq!(Delivered::parse(other), None, "{other}");
        }
        assert_eq!(skipped_duplicate("victim: skipped duplicate #5"), Some(5));
        assert_eq!(
            skipped_duplicate("skipped duplicate #17 (already delivered)"),
            Some(17)
        );
        assert_eq!(skipped_duplicate("victim #5: \"x\""), None);
    }
}
