//! A refusal that costs nothing and slows the offender (issue 23), on real
//! Soft-RoCE: an unmodified verbs program (`verbs-churn`) creates and
//! destroys completion queues in a loop under `LD_PRELOAD=librdma_intercept.so`,
//! with the collector limiting `CQ_CREATE` to 20 calls a second.
//!
//! - `fail` (the default): the refusals are answered by the interceptor
//!   itself until the collector's retry time, so the collector serves a few
//!   requests per admitted call while the flooder collects thousands of
//!   refusals (before protocol version 2 it served every one of them). Since
//!   version 3 the admission that fills the limit says how long it stays
//!   full, so the refusal of the next call is not asked for either: the
//!   collector refuses (almost) nothing and wakes once per admitted call;
//! - `wait`: the flooder sleeps until its next token instead, so it runs at
//!   the limit's rate (±10 %) and is refused nothing. The sliding window
//!   makes the rate L / (1 s + the mean lateness of each admission after its
//!   token), so a VM starved of CPU by its host (several VMs on two cores)
//!   measures lower; the test prints that lateness. Measured: 12.00/s at
//!   12/s, 20.00/s at 20/s (lateness a few ms); 17.8/s at 20/s with four
//!   lab VMs sharing two host cores.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh`. Build the interceptor,
//! the collector and the flooder into the same target directory first:
//!
//! ```text
//! cargo build -p rdma-intercept -p rdma-collector -p secure-rdma-tests --bins
//! cargo test -p secure-rdma-tests --no-run --test isolation_lab
//! ```

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use secure_rdma_tests::collector::{activity_sum, preload, Collector};
use secure_rdma_tests::secure::{client, Lines, Pki, ServerProc};
use secure_rdma_tests::{require_lab, spawn, text, wait_with_deadline};
use serde_json::Value;

const CHURN: &str = env!("CARGO_BIN_EXE_verbs-churn");
const DEADLINE: Duration = Duration::from_secs(120);
/// The collector's limit in these tests, in CQ creations per second.
const LIMIT: u64 = 20;

/// Runs `verbs-churn` on rxe-a for `millis` under the interceptor with
/// `RDMA_INTERCEPT_ON_LIMIT=on_limit`; its report and its stderr.
fn churn(collector: &Collector, on_limit: &str, millis: u64) -> (Value, String) {
    let child = Command::new(CHURN)
        .args(["--device", "rxe-a", "--millis", &millis.to_string()])
        .env("LD_PRELOAD", preload())
        .env("RDMA_COLLECTOR", &collector.socket)
        .env("RDMA_INTERCEPT_ON_LIMIT", on_limit)
        .env_remove("RDMA_INTERCEPT_FAIL")
        .env_remove("RDMA_INTERCEPT_MAX_WAIT_MS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn verbs-churn");
    let out = wait_with_deadline(child, DEADLINE, "verbs-churn");
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "verbs-churn: {}\n{stderr}",
        out.status
    );
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("verbs-churn report: {e}: {}", text(&out.stdout)));
    (report, stderr)
}

fn number(report: &Value, key: &str) -> u64 {
    report[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} in {report}"))
}

#[test]
#[ignore = "needs the Soft-RoCE lab VM (scripts/softroce-vm.sh)"]
fn a_refused_flooder_is_answered_by_its_interceptor_not_the_collector() {
    require_lab();
    let limit = format!("CQ_CREATE={LIMIT}");
    let collector = Collector::start(&[&limit]);
    let millis = 4000;
    // The collector's CPU with nobody asking, over a fixed second: the
    // baseline for what it uses under the flood (a measurement, not a wait
    // for anything).
    let idle_from = collector.cpu();
    std::thread::sleep(Duration::from_secs(1));
    let idle = collector.cpu() - idle_from;
    let cpu_before = collector.cpu();
    let (report, stderr) = churn(&collector, "fail", millis);
    let cpu = collector.cpu() - cpu_before;
    let (requests, log) = collector.stop_and_count_requests();
    let (writes, released) = (activity_sum(&log, "writes"), activity_sum(&log, "released"));
    let denied = activity_sum(&log, "denied");
    let (ok, refused) = (number(&report, "ok"), number(&report, "refused"));
    let seconds = number(&report, "elapsed_ms") as f64 / 1000.0;
    println!(
        "fail mode, CQ_CREATE={LIMIT}/s, {seconds:.1} s: {ok} created, {refused} refused \
         ({:.0}/s), collector served {requests} requests ({:.2} % of the refusals; {released} \
         releases, {denied} refused) in {writes} writes, using {} ms of CPU ({:.1} % of one core; {} ms in an \
         idle second before)",
        refused as f64 / seconds,
        100.0 * requests as f64 / refused.max(1) as f64,
        cpu.as_millis(),
        100.0 * cpu.as_secs_f64() / seconds,
        idle.as_millis()
    );
    // Every refusal is the quota's: EDQUOT, nothing else.
    let errnos = report["errno"].as_object().expect("errno map");
    assert_eq!(
        errnos.keys().collect::<Vec<_>>(),
        [&(libc::EDQUOT).to_string()],
        "{report}"
    );
    // The limit held: a sliding second never admits more than LIMIT.
    let bound = LIMIT * (millis / 1000 + 1);
    assert!(
        ok > 0 && ok <= bound,
        "{ok} created, at most {bound} allowed"
    );
    assert!(
        refused >= 2000,
        "only {refused} refusals: not a flood\n{stderr}"
    );
    // The collector's work: an ADMIT and a RELEASE per created CQ, and about
    // one refused ADMIT per token; never one per refusal.
    assert!(
        requests * 20 < refused,
        "the collector served {requests} requests for {refused} refusals (>= 5 %)\n{log}"
    );
    // Version 3: the admission that fills the limit says for how long, so
    // the next call's refusal is not asked for. Per created CQ the collector
    // serves its ADMIT and its RELEASE (riding in one write with the next
    // ADMIT), not also a refused ADMIT as version 2 did (3 requests in 2
    // writes per CQ). It refuses only when a hold ran out a moment before
    // the window freed (clocks of two processes), never once per token.
    assert!(
        requests <= 2 * ok + 10 && writes <= ok + 10,
        "{requests} requests in {writes} writes for {ok} admissions\n{log}"
    );
    // One flooder: a hold ends after the window has a free slot (it counts
    // from the reply, the collector's time for it rounded up), so its next
    // ADMIT is admitted. Version 2 refused one at every token that came
    // after the window had been full (18 in 4 s in the README's run).
    assert!(
        denied <= 2,
        "the collector refused {denied} calls for {ok} admissions: the admissions' holds \
         were not used\n{log}"
    );
    // Every ticket was given back (a CQ destroyed, or a creation that failed after its
    // admission), and the releases rode with the next ADMIT rather than waking the collector
    // on their own: one write answers both. A release still waiting when the program exits
    // is the close's (at most the last); one that waited longer than the interceptor's delay
    // goes alone.
    let admitted = activity_sum(&log, "admitted");
    assert!(
        released <= admitted && admitted - released <= 1,
        "{released} of {admitted} admissions released\n{log}"
    );
    assert!(
        requests - writes + 2 >= released * 9 / 10,
        "{requests} requests in {writes} writes for {released} releases: the releases went \
         alone\n{log}"
    );
    // The interceptor said once per collector refusal that it answers the
    // repeats itself; the local refusals are silent.
    let said = stderr
        .lines()
        .filter(|l| l.contains("without asking the collector"))
        .count() as u64;
    assert!(said >= 1 && said <= requests, "{said} lines:\n{stderr}");
}

#[test]
#[ignore = "needs the Soft-RoCE lab VM (scripts/softroce-vm.sh)"]
fn in_wait_mode_a_flooder_runs_at_the_limits_rate() {
    require_lab();
    // The claim holds for a flooder that could go faster than the limit:
    // measure how fast this one goes unlimited here (under TCG, with the
    // round trips to the collector, it can be a few dozen cycles a second),
    // and limit it to at most a third of that.
    let unlimited = Collector::start(&[]);
    let (free, _) = churn(&unlimited, "wait", 3000);
    drop(unlimited);
    let natural = number(&free, "ok") as f64 / (number(&free, "elapsed_ms") as f64 / 1000.0);
    let limit_rate = LIMIT.min((natural / 3.0) as u64);
    println!("unlimited: {natural:.1} cycles/s; limit for this test: {limit_rate}/s");
    assert!(
        limit_rate >= 3,
        "the flooder manages only {natural:.1} cycles/s unlimited: too slow to measure a limit"
    );
    let limit = format!("CQ_CREATE={limit_rate}");
    let collector = Collector::start(&[&limit]);
    let millis = 7000;
    let (report, stderr) = churn(&collector, "wait", millis);
    let (requests, _log) = collector.stop_and_count_requests();
    let refused = number(&report, "refused");
    // The first second holds the initial burst of a sliding window; measure
    // the steady state over a fixed window after it.
    let (from, to) = (2000.0, 7000.0);
    let times: Vec<f64> = report["ok_at_ms"]
        .as_array()
        .expect("ok_at_ms")
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let in_window = times.iter().filter(|t| **t >= from && **t < to).count();
    let rate = in_window as f64 / ((to - from) / 1000.0);
    // A sliding window admits call k+L one second after call k at the
    // earliest; how much later it came is what the rate loses (the rate is
    // L / (1 s + mean lateness)): sleep overshoot, the round trip, and on a
    // starved VM the time the flooder was not scheduled.
    let l = limit_rate as usize;
    let late: Vec<f64> = (l..times.len())
        .filter(|k| times[*k] >= from && times[*k] < to)
        .map(|k| times[k] - (times[k - l] + 1000.0))
        .collect();
    let mean_late = late.iter().sum::<f64>() / late.len().max(1) as f64;
    println!(
        "wait mode, CQ_CREATE={limit_rate}/s: {in_window} created in [{from}, {to}) ms = {rate:.2}/s, \
         {} in all, {refused} refused, collector served {requests} requests; \
         in that window call k came {mean_late:.1} ms more than 1 s after call k-{limit_rate} on average",
        times.len()
    );
    assert_eq!(refused, 0, "wait mode refused calls:\n{stderr}");
    let limit = limit_rate as f64;
    assert!(
        (rate - limit).abs() <= 0.1 * limit,
        "rate {rate:.2}/s is not {limit_rate}/s ± 10 % (calls {mean_late:.1} ms later than \
         1 s after the call they replace in the window: a starved VM?)"
    );
}

/// A `verbs-churn` left running for the length of a measurement.
struct Flood {
    child: Child,
    _stderr: Lines,
}

impl Flood {
    /// Starts one on `device`, preloaded and limited by `collector` with
    /// `on_limit` if given, and returns once it churns.
    fn start(device: &str, limited: Option<(&Collector, &str)>) -> Flood {
        let mut cmd = Command::new(CHURN);
        cmd.args(["--device", device, "--millis", "600000"])
            .env_remove("LD_PRELOAD")
            .env_remove("RDMA_INTERCEPT_FAIL")
            .env_remove("RDMA_INTERCEPT_MAX_WAIT_MS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((collector, on_limit)) = limited {
            cmd.env("LD_PRELOAD", preload())
                .env("RDMA_COLLECTOR", &collector.socket)
                .env("RDMA_INTERCEPT_ON_LIMIT", on_limit);
        }
        let mut child = cmd.spawn().expect("spawn verbs-churn");
        let stderr = Lines::collect(child.stderr.take().expect("stderr"));
        stderr.wait_for("the flood started", 1, DEADLINE, |l| {
            l.starts_with("verbs-churn: churning on")
        });
        Flood {
            child,
            _stderr: stderr,
        }
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `secure-client bench connect` setup time per connection, p50 and p99 in ms.
fn victim_setup(pki: &Pki, server: &ServerProc, n: u32) -> (f64, f64) {
    let mut cmd = client(pki, server, Some("victim"));
    cmd.args(["bench", "connect", "-n", &n.to_string(), "--json"]);
    let out = wait_with_deadline(spawn(&mut cmd), DEADLINE, "bench connect");
    assert!(
        out.status.success(),
        "bench connect: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bench connect report: {e}: {}", text(&out.stdout)));
    assert_eq!(v["connections"], n, "{v}");
    let us = |k: &str| {
        v["per_connection_us"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} in {v}"))
    };
    (us("p50") / 1000.0, us("p99") / 1000.0)
}

/// The victim of issue 23, measured (printed, not judged: under TCG timings
/// are relative, and the goals are scripts/bench-isolation.sh's): a secure
/// client's connection setup alone, beside two CQ churn floods (one per
/// device) without a limit, and with the floods preloaded and limited to 20
/// CQ creations a second in `fail` and in `wait` mode.
#[test]
#[ignore = "needs the Soft-RoCE lab VM (scripts/softroce-vm.sh)"]
fn a_victims_setup_beside_churn_floods_is_measured() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["victim".to_owned()]);
    let server = ServerProc::start(&pki, 4733, &[]);
    let n = 40;
    // Warm up: the first connection opens the device and does a full handshake.
    victim_setup(&pki, &server, 2);
    let alone = victim_setup(&pki, &server, n);
    let unlimited = {
        let _floods = [Flood::start("rxe-a", None), Flood::start("rxe-b", None)];
        victim_setup(&pki, &server, n)
    };
    let limit = format!("CQ_CREATE={LIMIT}");
    let mut rows = vec![
        ("alone", alone),
        ("two CQ churn floods, no limit", unlimited),
    ];
    for mode in ["wait", "fail"] {
        let collector = Collector::start(&[&limit]);
        let measured = {
            let _floods = [
                Flood::start("rxe-a", Some((&collector, mode))),
                Flood::start("rxe-b", Some((&collector, mode))),
            ];
            victim_setup(&pki, &server, n)
        };
        let (requests, _) = collector.stop_and_count_requests();
        println!("{mode}: the collector served {requests} requests");
        rows.push((
            if mode == "fail" {
                "the floods preloaded, CQ_CREATE=20/s, fail"
            } else {
                "the floods preloaded, CQ_CREATE=20/s, wait"
            },
            measured,
        ));
    }
    // The same victim alone again: a drift of the lab itself (the server's
    // state, the host's load) shows here rather than being blamed on a flood.
    rows.push((
        "alone again, after the floods",
        victim_setup(&pki, &server, n),
    ));
    println!("| victim setup per connection ({n} connections) | p50 | p99 |");
    println!("|---|---:|---:|");
    for (what, (p50, p99)) in &rows {
        println!(
            "| {what} | {p50:.1} ms ({:.1}x) | {p99:.1} ms |",
            p50 / alone.0
        );
    }
}
