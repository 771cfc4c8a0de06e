//! The attacker of the attack lab tests (`attack_lab.rs`, `tag_lab.rs`, `memory_lab.rs`,
//! `rekey_lab.rs`): the `rdma-inject` binary with `--json`, started, awaited until it observes,
//! and read back as the packets it injected and its summary.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::secure::{bin, Lines};
use crate::spawn;

/// How long rdma-inject may take to start observing under TCG.
const OBSERVING: Duration = Duration::from_secs(90);
/// How long rdma-inject may run in all: its `--timeout 150` of [`Injector::observe`] and the
/// time to exit.
const EXIT: Duration = Duration::from_secs(180);

/// A running `rdma-inject --json`, its stdout and stderr collected line by line.
pub struct Injector {
    child: Child,
    out: Lines,
    err: Lines,
}

/// What rdma-inject reported on stdout.
#[derive(Debug)]
pub struct Report {
    /// Each `{"injected": …}` line's object, in order.
    pub injected: Vec<Value>,
    /// The `{"summary": …}` line's object.
    pub summary: Value,
}

impl Injector {
    /// Starts `rdma-inject ARGS --json`; when ARGS has `--observe`, waits until it observes
    /// (its "observing" log line), so that what the test does next is seen.
    pub fn start(args: &[&str]) -> Injector {
        // Built by `cargo build --workspace --bins`.
        let mut child = spawn(
            Command::new(bin("rdma-inject"))
                .args(args)
                .arg("--json")
                .env("RUST_LOG", "info"),
        );
        let out = Lines::collect(child.stdout.take().expect("stdout"));
        let err = Lines::collect(child.stderr.take().expect("stderr"));
        let mut inj = Injector { child, out, err };
        if args.contains(&"--observe") {
            let start = Instant::now();
            while !inj.err.snapshot().iter().any(|l| l.contains("observing")) {
                if let Some(status) = inj.child.try_wait().expect("try_wait") {
                    panic!("rdma-inject exited early: {status}\n{}", inj.context());
                }
                assert!(
                    start.elapsed() < OBSERVING,
                    "rdma-inject not observing\n{}",
                    inj.context()
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        inj
    }

    /// Starts `rdma-inject --observe IFACE --dst DST --timeout 150 EXTRA --json`: it learns the
    /// flow to DST it sees on IFACE; waits until it observes.
    pub fn observe(iface: &str, dst: &str, extra: &[&str]) -> Injector {
        let mut args = vec!["--observe", iface, "--dst", dst, "--timeout", "150"];
        args.extend_from_slice(extra);
        Injector::start(&args)
    }

    /// Its stdout and stderr so far, for failure messages.
    pub fn context(&self) -> String {
        format!(
            "rdma-inject stdout:\n{}\nrdma-inject stderr:\n{}",
            self.out.snapshot().join("\n"),
            self.err.snapshot().join("\n")
        )
    }

    /// Waits for its exit (status 0 required) and reads its report: every stdout line is a
    /// JSON object, one of them the summary.
    pub fn finish(mut self) -> Report {
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            if start.elapsed() > EXIT {
                let _ = self.child.kill();
                panic!(
                    "rdma-inject still running after {EXIT:?}\n{}",
                    self.context()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "rdma-inject failed: {status}\n{}",
            self.context()
        );
        // The reader thread may still hold the last lines for a moment after the exit.
        self.out.wait_closed(Duration::from_secs(10));
        let mut injected = Vec::new();
        let mut summary = Value::Null;
        for l in self.out.snapshot() {
            let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
            if !v["injected"].is_null() {
                injected.push(v["injected"].clone());
            } else if !v["summary"].is_null() {
                summary = v["summary"].clone();
            }
        }
        assert!(summary.is_object(), "no summary\n{}", self.context());
        Report { injected, summary }
    }

    /// [`finish`](Injector::finish)'s summary alone.
    pub fn summary(self) -> Value {
        self.finish().summary
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
