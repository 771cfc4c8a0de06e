//! Streams of numbered operations across lost sessions (issue 20): the `stream-client` driver
//! and its JSON summary, the check that the `message_server --ids` example
//! ([`crate::example::MessageServer`]) saw every operation once, in order, and the
//! faults a test puts on the lab's link (an nftables drop rule, netem qdiscs), each undone by a
//! guard when it drops, so a failing test leaves the lab as it found it.
//!
//! Operation `n` of a stream carries [`op_content`]`(n)` (`op-000001`, …); the stream's
//! sequence numbers are the same `n`, so a run is correct when the server application saw
//! exactly `op-000001 ..= op-N`, each once, in order ([`assert_exactly_once_in_order`]).

use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

pub use crate::example::{Delivered, MessageServer};
use crate::secure::{bin, Lines, Pki};
use crate::{text, wait_with_deadline, ADDR_A};

/// The content of operation `n` of a stream.
pub fn op_content(n: u64) -> String {
    format!("op-{n:06}")
}

/// Percentiles of a set of durations, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// How many samples.
    pub count: usize,
    /// The median.
    pub p50: f64,
    /// The 99th percentile (nearest rank).
    pub p99: f64,
    /// The largest.
    pub max: f64,
    /// Every sample, in the order measured.
    pub samples: Vec<f64>,
}

impl Stats {
    /// The statistics of `samples` (nearest-rank percentiles; zeros when empty).
    pub fn of(samples: Vec<f64>) -> Stats {
        let mut sorted = samples.clone();
        sorted.sort_by(f64::total_cmp);
        let rank = |p: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
            sorted[i.clamp(1, sorted.len()) - 1]
        };
        Stats {
            count: sorted.len(),
            p50: rank(50.0),
            p99: rank(99.0),
            max: sorted.last().copied().unwrap_or(0.0),
            samples,
        }
    }
}

/// What `stream-client` prints as its last stdout line.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StreamSummary {
    /// Operations the stream was to make.
    pub ops: u64,
    /// The session's lanes at the start (`--lanes`), lane 0 included.
    #[serde(default)]
    pub lanes: usize,
    /// The session's lanes at the end: a lost session's lanes are resumed on the new session,
    /// so this matches `lanes`.
    #[serde(default)]
    pub lanes_at_end: usize,
    /// Lanes resumed on new sessions, over every recovery (each lost session's other lanes).
    #[serde(default)]
    pub lanes_resumed: u64,
    /// Of the resumed lanes' operations: acknowledged by the server's answers.
    #[serde(default)]
    pub lanes_acknowledged_while_away: u64,
    /// Of the resumed lanes' operations: sent again.
    #[serde(default)]
    pub lanes_resent: u64,
    /// Operations the application posted (each once; the library's replays are not counted).
    pub sent: u64,
    /// Acknowledgements the application received, in order and each once.
    pub acknowledged: u64,
    /// Sessions the library lost (each noticed once).
    pub losses: u64,
    /// Resumes the library made (lost sessions it recovered from).
    pub resumes: u64,
    /// Acknowledgements the library learned from the server's resume answers: operations
    /// delivered while their acknowledgement was lost.
    pub acknowledged_while_away: u64,
    /// Operations the library sent again on a new session.
    pub resent: u64,
    /// How long each recovery took, from the loss to the new session's answer, in ms (the
    /// library's own measure).
    pub resume_took_ms: Stats,
    /// What the library said of each resume (its events, as Debug text).
    pub resume_events: Vec<String>,
    /// Operations the client had in flight when each resume was noticed: the most of them.
    pub in_flight_at_resume_max: u64,
    /// From each session loss to the first acknowledgement handed back after it, in ms.
    pub recovery_ms: Stats,
    /// The longest gap between two acknowledgements outside any resume, in ms.
    pub longest_other_gap_ms: f64,
    /// From the first post to the last acknowledgement, in seconds.
    pub elapsed_s: f64,
    /// Acknowledged operations per second over `elapsed_s`.
    pub throughput_per_s: f64,
    /// The pace asked for (operations per second; 0: as fast as the window allows).
    pub rate: f64,
    /// Operations allowed in flight.
    pub window: u64,
    /// Operations posted together at each step of the pace.
    pub burst: u64,
    /// Acknowledgements that were not the next operation's, or not delivered.
    pub violations: Vec<String>,
    /// The error that ended the stream early, if one did.
    pub error: Option<String>,
    /// True when every operation was acknowledged exactly once, in order.
    pub ok: bool,
}

/// Checks that `identity`'s deliveries are exactly operations 1 ..= `n`, each once, in order,
/// each under its own stream sequence; panics with what went wrong (duplicates, gaps, order).
pub fn assert_exactly_once_in_order(all: &[Delivered], identity: &str, n: u64) {
    assert_exactly_once(all, identity, n, true)
}

/// Checks that `identity`'s deliveries are exactly operations 1 ..= `n`, each once, in any
/// order: what a client with several lanes sends (each lane keeps its own order and stream
/// sequences, the lanes in no set order). Panics with what went wrong (duplicates, gaps).
pub fn assert_exactly_once_any_order(all: &[Delivered], identity: &str, n: u64) {
    assert_exactly_once(all, identity, n, false)
}

fn assert_exactly_once(all: &[Delivered], identity: &str, n: u64, in_order: bool) {
    let mine: Vec<&Delivered> = all.iter().filter(|d| d.identity == identity).collect();
    let mut problems = Vec::new();
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    for d in &mine {
        *seen.entry(d.content.clone()).or_default() += 1;
    }
    let duplicates: Vec<_> = seen.iter().filter(|(_, &c)| c > 1).collect();
    if !duplicates.is_empty() {
        problems.push(format!(
            "{} contents delivered more than once, first: {:?}",
            duplicates.len(),
            &duplicates[..duplicates.len().min(10)]
        ));
    }
    let missing: Vec<u64> = (1..=n)
        .filter(|&i| !seen.contains_key(&op_content(i)))
        .collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{} operations never delivered, first: {:?}",
            missing.len(),
            &missing[..missing.len().min(10)]
        ));
    }
    let strays: Vec<&String> = seen
        .keys()
        .filter(|c| {
            c.strip_prefix("op-")
                .and_then(|s| s.parse::<u64>().ok())
                .is_none_or(|i| i == 0 || i > n)
        })
        .collect();
    if !strays.is_empty() {
        problems.push(format!(
            "contents that are no operation of the stream: {strays:?}"
        ));
    }
    let misplaced: Vec<String> = mine
        .iter()
        .enumerate()
        .filter(|_| in_order)
        .filter(|(i, d)| {
            let want = *i as u64 + 1;
            d.content != op_content(want) || d.seq != want
        })
        .take(10)
        .map(|(i, d)| format!("delivery {} was #{} {:?}", i + 1, d.seq, d.content))
        .collect();
    if !misplaced.is_empty() && problems.is_empty() {
        problems.push(format!("out of order: {misplaced:?}"));
    }
    assert!(
        problems.is_empty() && mine.len() as u64 == n,
        "{identity}: {} deliveries for {n} operations: {}",
        mine.len(),
        problems.join("; ")
    );
}

// ------------------------------------------------------------------ the stream driver

/// What a stream run asks for.
#[derive(Clone, Debug)]
pub struct StreamSpec {
    /// Operations in all.
    pub ops: u64,
    /// Operations per second (0: as fast as the window allows).
    pub rate: f64,
    /// Operations in flight at most.
    pub window: u64,
    /// Operations posted together at each step of the pace (1: evenly spaced).
    pub burst: u64,
    /// The client's per-step timeout, in seconds (how long it waits for an acknowledgement
    /// before it gives the session up).
    pub timeout_secs: u64,
    /// The session's lanes (1: lane 0 alone, every acknowledgement in order). With more, the
    /// operations spread over the lanes and are acknowledged in no set order.
    pub lanes: u32,
}

/// A running `stream-client`.
pub struct StreamRun {
    child: Option<Child>,
    /// Its stdout (the summary is the last line).
    pub out: Lines,
    /// Its stderr (one JSON line per resume; the library's warnings).
    pub err: Lines,
    started: Instant,
}

/// How a stream run ended.
#[derive(Debug)]
pub struct StreamOutcome {
    /// Its exit status.
    pub status: ExitStatus,
    /// Its summary.
    pub summary: StreamSummary,
    /// The summary line as printed (JSON).
    pub summary_line: String,
    /// Its stderr.
    pub stderr: String,
    /// Wall-clock time of the whole process, start to exit.
    pub wall: Duration,
}

impl StreamRun {
    /// Starts `stream-client` as `name` against the server on 10.77.0.1:`port`.
    pub fn start(pki: &Pki, port: u16, name: &str, spec: &StreamSpec) -> StreamRun {
        StreamRun::start_with(pki, port, name, spec, &[])
    }

    /// [`StreamRun::start`] with more of stream-client's flags (`--warm-pool 2`).
    pub fn start_with(
        pki: &Pki,
        port: u16,
        name: &str,
        spec: &StreamSpec,
        extra: &[&str],
    ) -> StreamRun {
        let mut child = Command::new(bin("stream-client"))
            .arg(ADDR_A)
            .args(["--port", &port.to_string(), "--certs"])
            .arg(pki.dir())
            .args(["--name", name])
            .args(["--ops", &spec.ops.to_string()])
            .args(["--rate", &spec.rate.to_string()])
            .args(["--window", &spec.window.to_string()])
            .args(["--burst", &spec.burst.to_string()])
            .args(["--timeout", &spec.timeout_secs.to_string()])
            .args(["--lanes", &spec.lanes.to_string()])
            .args(extra)
            .env("RUST_LOG", "warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn stream-client (built by cargo build --workspace --bins)");
        let out = Lines::collect(child.stdout.take().expect("stdout"));
        let err = Lines::collect(child.stderr.take().expect("stderr"));
        StreamRun {
            child: Some(child),
            out,
            err,
            started: Instant::now(),
        }
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Its stdout and stderr so far, for failure messages.
    pub fn context(&self) -> String {
        format!(
            "stream-client stdout:\n{}\nstream-client stderr:\n{}",
            self.out.snapshot().join("\n"),
            self.err.snapshot().join("\n")
        )
    }

    /// Waits for the exit (killing it at `deadline`) and reads the summary.
    pub fn finish(mut self, deadline: Duration) -> StreamOutcome {
        let child = self.child.take().expect("a stream run finishes once");
        // Its pipes are already taken: wait_with_deadline only waits and kills.
        let status = wait_with_deadline(child, deadline, "stream-client").status;
        let wall = self.started.elapsed();
        // The reader thread may hold the last line for a moment after the exit.
        let start = Instant::now();
        let summary_line = loop {
            let last = self
                .out
                .snapshot()
                .into_iter()
                .rev()
                .find(|l| l.starts_with('{'));
            if let Some(l) = last {
                break l;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "stream-client exited {status} without a summary\n{}",
                self.context()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let summary: StreamSummary = serde_json::from_str(&summary_line)
            .unwrap_or_else(|e| panic!("stream-client's summary: {e}\n{}", self.context()));
        StreamOutcome {
            status,
            summary,
            summary_line,
            stderr: self.err.snapshot().join("\n"),
            wall,
        }
    }
}

impl Drop for StreamRun {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ------------------------------------------------------------------ faults on the link

/// Runs a command that must succeed (root lab tools: nft, tc); its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// A netem qdisc at the root of each of some interfaces; deleted when this guard drops.
pub struct Netem {
    devs: Vec<String>,
}

impl Netem {
    /// `tc qdisc add dev DEV root netem ARGS…` on each of `devs`.
    pub fn add(devs: &[&str], args: &[&str]) -> Netem {
        let mut guard = Netem { devs: Vec::new() };
        for dev in devs {
            run(Command::new("tc")
                .args(["qdisc", "add", "dev", dev, "root", "netem"])
                .args(args));
            // Pushed once added: a failure on the next one still deletes this one.
            guard.devs.push((*dev).to_owned());
        }
        guard
    }

    /// `tc -s qdisc show` of the interfaces (what netem did: sent, dropped, …).
    pub fn stats(&self) -> String {
        self.devs
            .iter()
            .map(|d| run(Command::new("tc").args(["-s", "qdisc", "show", "dev", d])))
            .collect::<Vec<_>>()
            .join("")
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        for dev in &self.devs {
            let _ = Command::new("tc")
                .args(["qdisc", "del", "dev", dev, "root"])
                .output();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(contents: &[u64]) -> Vec<Delivered> {
        contents
            .iter()
            .map(|&i| Delivered {
                identity: "v".into(),
                seq: i,
                content: op_content(i),
                possibly: false,
            })
            .collect()
    }

    #[test]
    fn exactly_once_in_order_passes_only_for_the_whole_stream() {
        assert_exactly_once_in_order(&stream(&[1, 2, 3]), "v", 3);
        for bad in [&[1, 2][..], &[1, 2, 2, 3], &[1, 3, 2], &[1, 2, 3, 4]] {
            let d = stream(bad);
            let r = std::panic::catch_unwind(|| assert_exactly_once_in_order(&d, "v", 3));
            assert!(r.is_err(), "{bad:?} passed");
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let s = Stats::of((1..=100).map(f64::from).collect());
        assert_eq!((s.count, s.p50, s.p99, s.max), (100, 50.0, 99.0, 100.0));
        let one = Stats::of(vec![7.0]);
        assert_eq!((one.p50, one.p99, one.max), (7.0, 7.0, 7.0));
        assert_eq!(Stats::of(Vec::new()).count, 0);
    }
}
