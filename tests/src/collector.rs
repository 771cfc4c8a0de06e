//! The quota pieces of the preload lab tests (`intercept_lab.rs`, `isolation_lab.rs`): the
//! LD_PRELOAD interceptor built next to the test binaries, and an `rdma-collector` process on a
//! socket of its own.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::secure::{bin, Lines};
use crate::wait_with_deadline;

/// How long the collector may take to listen, to release what a program held, and to stop.
const DEADLINE: Duration = Duration::from_secs(120);

/// The interceptor, built next to the test's binaries: `cargo build` puts it in the target
/// directory, `cargo test` only in its `deps/` (scripts/test.sh does the latter). The newer
/// one wins.
pub fn preload() -> PathBuf {
    let built = bin("librdma_intercept.so");
    let tested = built
        .parent()
        .expect("target dir")
        .join("deps/librdma_intercept.so");
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match (modified(&built), modified(&tested)) {
        (Some(b), Some(t)) if t > b => tested,
        (Some(_), _) => built,
        (None, Some(_)) => tested,
        (None, None) => panic!(
            "{} missing: build it first with `cargo build -p rdma-intercept` (same target dir)",
            built.display()
        ),
    }
}

/// A running `rdma-collector` on a socket in its own temp dir; killed when dropped.
pub struct Collector {
    child: Option<Child>,
    log: Lines,
    /// Its socket: the interceptor's `RDMA_COLLECTOR`.
    pub socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Collector {
    /// Starts it with these `--limit`s, logging at info; waits until it listens.
    pub fn start(limits: &[&str]) -> Collector {
        Collector::start_with_log(limits, "info")
    }

    /// Starts it with these `--limit`s and the log filter `filter` (`RUST_LOG`); waits until it
    /// listens.
    pub fn start_with_log(limits: &[&str], filter: &str) -> Collector {
        let exe = bin("rdma-collector");
        assert!(
            exe.exists(),
            "{} missing: build it first with `cargo build -p rdma-collector --bin rdma-collector`",
            exe.display()
        );
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("collector.sock");
        let mut cmd = Command::new(exe);
        cmd.arg("--socket").arg(&socket);
        for limit in limits {
            cmd.args(["--limit", limit]);
        }
        let mut child = cmd
            .env("RUST_LOG", filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rdma-collector");
        let log = Lines::collect(child.stderr.take().expect("stderr"));
        let started = Instant::now();
        while UnixStream::connect(&socket).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "rdma-collector exited ({status}):\n{}",
                    log.snapshot().join("\n")
                );
            }
            assert!(
                started.elapsed() < DEADLINE,
                "rdma-collector never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Collector {
            child: Some(child),
            log,
            socket,
            _dir: dir,
        }
    }

    /// The collector's global live counts (`STATS`).
    pub fn live(&self) -> BTreeMap<String, u64> {
        let mut stream = UnixStream::connect(&self.socket).expect("connect for STATS");
        stream.write_all(b"STATS\n").expect("send STATS");
        let mut line = String::new();
        BufReader::new(stream)
            .read_line(&mut line)
            .expect("read STATS");
        let body = line
            .trim_end()
            .strip_prefix("OK global ")
            .unwrap_or_else(|| panic!("bad STATS reply {line:?}"));
        body.split(' ')
            .take_while(|w| *w != "tenant")
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.parse().expect("count")))
            .collect()
    }

    /// Waits until the live counts are all zero.
    pub fn wait_all_released(&self) {
        let started = Instant::now();
        loop {
            let live = self.live();
            if live.values().all(|&n| n == 0) {
                return;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "the collector still counts {live:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The CPU time (user + system) the collector has used so far.
    pub fn cpu(&self) -> Duration {
        let pid = self.child.as_ref().expect("running").id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("collector stat");
        // Fields after the command name, which is in parentheses: utime and
        // stime are the 12th and 13th of them, in clock ticks.
        let rest = stat.rsplit_once(')').expect("stat format").1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 =
            fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// Stops it (SIGTERM; exit status 0 required) and returns its log.
    pub fn stop(mut self) -> String {
        let child = self.child.take().expect("running");
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = wait_with_deadline(child, DEADLINE, "rdma-collector");
        assert!(out.status.success(), "rdma-collector: {}", out.status);
        // The reader thread may still hold the last lines for a moment.
        self.log
            .wait_for("final counts", 1, Duration::from_secs(10), |l| {
                l.contains("final counts")
            });
        self.log.snapshot().join("\n")
    }

    /// Stops it and returns the requests it served in all, the sum of `requests=` over its
    /// activity summaries (the last one is logged on the way out), and its log.
    pub fn stop_and_count_requests(self) -> (u64, String) {
        let log = self.stop();
        (activity_sum(&log, "requests"), log)
    }
}

/// The sum of `KEY=` over a collector log's activity summaries (`requests`, `writes`, ...).
pub fn activity_sum(log: &str, key: &str) -> u64 {
    let tag = format!(" {key}=");
    log.lines()
        .filter(|l| l.contains("activity:"))
        .filter_map(|l| {
            let (_, rest) = l.split_once(&tag)?;
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse::<u64>().ok()
        })
        .sum()
}

impl Drop for Collector {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
