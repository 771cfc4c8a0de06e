//! rdma-monitor's noisy-tenant detection on real Soft-RoCE: an unmodified
//! verbs program (`verbs-churn`, a CQ create/destroy loop) floods the control
//! path from its own cgroup while an `ibv_rc_pingpong` pair works quietly in
//! another. `rdma-monitor --flag-rate 100 --flag-window 2 --flag-by
//! process,cgroup,user` must name the flooder's cgroup, its pid and its user,
//! once when the flood starts and once when it ends, in its JSON lines, its
//! reports and its metrics; the quiet pair must never be named. The cgroup
//! must come within 1 s of the window's end (+1 s for the emulated VM), the
//! window computed from the flooder's own record of its calls; the pid and
//! user ride on the per-call event stream, which lags under CPU starvation,
//! and get a printed, looser bound.
//!
//! secure-server's own side of it: its setup watch (`--setup-slow-factor`) warns, and sets
//! `secure_rdma_setup_slow`, when its sessions' RDMA setup slows beside floods of CQ and
//! context churn (four, up to twelve until it slows), once, and says so again when the floods
//! stop; calm connections before and after raise nothing.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use secure_rdma_tests::secure::{client, sample, scrape as scrape_at, Lines, Pki, ServerProc};
use secure_rdma_tests::{
    rdma_monitor, require_lab, spawn, text, wait_listening, wait_until, wait_with_deadline, Killed,
    TestCgroup, ADDR_A,
};
use serde_json::Value;

const CHURN: &str = env!("CARGO_BIN_EXE_verbs-churn");
const DEADLINE: Duration = Duration::from_secs(90);
/// `--flag-rate`: a CQ create+destroy loop made 1,200 calls a second in a calm lab VM and
/// 100 in one starved of CPU (several VMs on two host cores); a pingpong pair makes 17 calls
/// in all, at most 34/s over the detector's half-second average.
const RATE: &str = "100";
/// `--flag-window`, in seconds.
const WINDOW: Duration = Duration::from_secs(2);
/// How long the flood lasts.
const FLOOD: Duration = Duration::from_secs(8);
/// The promise: a flood is reported at most this long after its window ends.
const PROMISED: Duration = Duration::from_secs(1);
/// Added to the promise in the lab only: the VM emulates its CPUs (TCG), the flooder spins on
/// one of its two, and the host's two cores are shared by several such VMs. The measured
/// delays are printed; README has them.
const TCG_MARGIN: Duration = Duration::from_secs(1);
/// Per-process and per-user counts come from the per-call ring buffer, which the monitor reads
/// no faster than its CPU share allows: in a VM starved of CPU they lagged the cgroup's kernel
/// counts by 1.4-1.8 s. Bound, printed, not promised (README says so).
const EVENT_LAG: Duration = Duration::from_secs(4);
const METRICS_ADDR: &str = "127.0.0.1:9471";

/// The `noisy_tenant` object of a JSON line, if it is one.
fn transition(line: &str) -> Option<Value> {
    let v: Value = serde_json::from_str(line).ok()?;
    v.get("noisy_tenant").cloned()
}

/// Whether `line` says a flood of tenant (`kind`, `id`) changed as `change`.
fn says(line: &str, change: &str, kind: &str, id: u64) -> bool {
    transition(line).is_some_and(|t| t["change"] == change && t["kind"] == kind && t["id"] == id)
}

/// `GET /metrics` over HTTP/1.0: the body.
fn scrape() -> String {
    let get = || -> std::io::Result<String> {
        let mut s = TcpStream::connect(METRICS_ADDR)?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {METRICS_ADDR}\r\n\r\n")?;
        let mut r = String::new();
        s.read_to_string(&mut r)?;
        Ok(r)
    };
    get().unwrap_or_default()
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// When the flood's window ends by the detector's own definition, computed from the flooder's
/// record of its CQ creations (`created`, seconds since its loop started; each cycle is two
/// calls, create and destroy): the first time `t` such that, on a 10 ms grid, the calls of the
/// half second before every instant of `[t - WINDOW, t]` make at least RATE per second.
fn window_end(created: &[f64]) -> Option<f64> {
    let threshold: f64 = RATE.parse().expect("RATE is a number");
    let rate_at = |t: f64| {
        let n = created.iter().filter(|&&c| c > t - 0.5 && c <= t).count();
        2.0 * n as f64 / 0.5
    };
    let step = 0.01;
    let window = WINDOW.as_secs_f64();
    let last = created.last().copied()?;
    let mut above_since: Option<f64> = None;
    let mut t = 0.0;
    while t <= last + 0.5 {
        if rate_at(t) >= threshold {
            let since = *above_since.get_or_insert(t);
            if t - since >= window {
                return Some(t);
            }
        } else {
            above_since = None;
        }
        t += step;
    }
    None
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_flooding_cgroup_process_and_user_are_flagged_within_a_second_of_the_window_and_a_quiet_one_is_not(
) {
    require_lab();
    let (flood_cg, quiet_cg) = (
        TestCgroup::new("detect-flood"),
        TestCgroup::new("detect-quiet"),
    );
    let monitor = rdma_monitor(&[
        "--json",
        "--interval",
        "1",
        "--flag-rate",
        RATE,
        "--flag-window",
        &WINDOW.as_secs_f64().to_string(),
        "--flag-by",
        "process,cgroup,user",
        "--metrics",
        METRICS_ADDR,
    ]);
    let out = monitor.out.clone();
    // Attached once the first report is out.
    out.wait_for("first report", 1, Duration::from_secs(60), |l| {
        l.starts_with("{\"") && l.contains("\"live\"")
    });

    // The quiet pair: a server in the quiet cgroup, its client beside it.
    let port = 18_515;
    let args = format!("-g 1 -n 50 -s 64 -p {port}");
    let quiet_server = spawn(&mut quiet_cg.command(&format!("ibv_rc_pingpong -d rxe-a {args}")));
    let quiet_server_pid = quiet_server.id();
    let quiet_server = Killed(Some(quiet_server));
    assert!(wait_listening(port), "pingpong server on {port}");

    let mut churn = flood_cg
        .command(&format!(
            "{CHURN} --device rxe-a --millis {}",
            FLOOD.as_millis()
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn verbs-churn");
    // `sh -c 'echo $$ > cgroup.procs && exec ...'`: the flooder keeps the shell's pid.
    let churn_pid = u64::from(churn.id());
    let churn_err = Lines::collect(churn.stderr.take().expect("stderr"));
    churn_err.wait_for("the flood's start", 1, DEADLINE, |l| {
        l.contains("churning on")
    });
    // verbs-churn's clock starts right after that line; its first call's time, from its
    // report, moves this to the flood's real start below.
    let loop_start = Instant::now();
    let loop_start_unix = unix_now();
    let quiet_client = spawn(
        Command::new("ibv_rc_pingpong")
            .args(["-d", "rxe-b", "-g", "1", "-n", "50", "-s", "64"])
            .args(["-p", &port.to_string(), ADDR_A]),
    );
    let quiet_client_pid = u64::from(quiet_client.id());

    // Started: the cgroup (kernel counts), the process and the user (per-call events).
    let cgroup_id = |path: &str| -> Option<u64> {
        out.snapshot().iter().find_map(|l| {
            let t = transition(l)?;
            (t["kind"] == "cgroup" && t["name"] == path).then(|| t["id"].as_u64())?
        })
    };
    let mut delays = Vec::new();
    out.wait_for("the flood's cgroup flagged", 1, DEADLINE, |l| {
        transition(l).is_some_and(|t| {
            t["change"] == "started" && t["kind"] == "cgroup" && t["name"] == flood_cg.path()
        })
    });
    delays.push(("cgroup", loop_start.elapsed()));
    let flood_cg_id = cgroup_id(&flood_cg.path()).expect("the cgroup's id");
    out.wait_for("the flooder's pid flagged", 1, DEADLINE, |l| {
        says(l, "started", "process", churn_pid)
    });
    delays.push(("process", loop_start.elapsed()));
    out.wait_for("the flooder's user flagged", 1, DEADLINE, |l| {
        says(l, "started", "user", 0)
    });
    delays.push(("user", loop_start.elapsed()));

    // While flagged: the reports list it and the metrics label it.
    let series = format!(
        "rdma_noisy_tenant{{kind=\"cgroup\",tenant=\"{}\",id=\"{flood_cg_id}\"}} 1",
        flood_cg.path()
    );
    wait_until(
        "the flood in the metrics",
        Duration::from_secs(10),
        || scrape().contains(&series),
        || format!("no {series} in:\n{}", scrape()),
    );
    out.wait_for(
        "a report listing the flooder",
        1,
        Duration::from_secs(10),
        |l| {
            serde_json::from_str::<Value>(l).is_ok_and(|v| {
                v["noisy_tenants"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|t| t["name"] == flood_cg.path()))
            })
        },
    );

    let churn = wait_with_deadline(churn, DEADLINE, "verbs-churn");
    assert!(churn.status.success(), "verbs-churn: {}", churn.status);
    let report: Value = serde_json::from_slice(&churn.stdout)
        .unwrap_or_else(|e| panic!("verbs-churn report: {e}: {}", text(&churn.stdout)));
    let cycles = report["ok"].as_u64().unwrap_or(0);
    // The first CQ of a process takes longer (the provider maps its queues): the flood starts
    // with the first call that returned.
    let first_call = Duration::from_secs_f64(
        report["ok_at_ms"][0]
            .as_f64()
            .unwrap_or_else(|| panic!("no ok_at_ms in {report}"))
            / 1000.0,
    );
    let created: Vec<f64> = report["ok_at_ms"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t.as_f64())
        .map(|ms| ms / 1000.0)
        .collect();
    let window_end = window_end(&created).unwrap_or_else(|| {
        panic!(
            "inconclusive: the VM was too starved of CPU for verbs-churn's rate to stay at {RATE}/s for {WINDOW:?} (its CQ cycles: {report})"
        )
    });
    out.wait_for("the cgroup's flood ended", 1, DEADLINE, |l| {
        says(l, "ended", "cgroup", flood_cg_id)
    });
    let ended_after = loop_start.elapsed();
    out.wait_for("the process's flood ended", 1, DEADLINE, |l| {
        says(l, "ended", "process", churn_pid)
    });
    let c = wait_with_deadline(quiet_client, DEADLINE, "pingpong client");
    let mut quiet_server = quiet_server;
    let s = wait_with_deadline(
        quiet_server.0.take().expect("server"),
        DEADLINE,
        "pingpong server",
    );
    assert!(c.status.success(), "{}", text(&c.stderr));
    assert!(s.status.success(), "{}", text(&s.stderr));

    // SIGINT, then the final report: nothing flagged any more.
    monitor.stop(DEADLINE);
    out.wait_for("final report", 1, Duration::from_secs(10), |l| {
        l.contains("\"final\":true")
    });
    let lines = out.snapshot();
    let last: Value = lines
        .iter()
        .rev()
        .find_map(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .filter(|v| v["final"] == true)
        })
        .expect("final report");
    assert_eq!(last["noisy_tenants"], serde_json::json!([]), "{last:#}");

    // Each flood reported exactly once when it started and once when it ended (hysteresis).
    let transitions: Vec<Value> = lines.iter().filter_map(|l| transition(l)).collect();
    for (kind, id) in [("cgroup", flood_cg_id), ("process", churn_pid)] {
        for change in ["started", "ended"] {
            let n = transitions
                .iter()
                .filter(|t| t["kind"] == kind && t["id"] == id && t["change"] == change)
                .count();
            assert_eq!(n, 1, "{kind} {id} {change}: {transitions:#?}");
        }
    }
    // The quiet pair is never named.
    for t in &transitions {
        assert_ne!(
            t["name"],
            quiet_cg.path().as_str(),
            "quiet cgroup flagged: {t}"
        );
        if t["kind"] == "process" {
            assert!(
                t["id"] != u64::from(quiet_server_pid) && t["id"] != quiet_client_pid,
                "quiet process flagged: {t}"
            );
        }
    }

    let started = transitions
        .iter()
        .find(|t| t["kind"] == "cgroup" && t["id"] == flood_cg_id)
        .expect("cgroup started");
    println!(
        "detection: verbs-churn's first CQ {:.3} s after its loop started; the monitor saw the cgroup above the rate for {:.3} s when it flagged it",
        first_call.as_secs_f64(),
        started["above_for_seconds"].as_f64().unwrap_or(0.0)
    );
    println!(
        "detection: verbs-churn {cycles} CQ cycles in {:.1} s ({:.0} calls/s, the cgroup's rate when flagged {:.0}/s); threshold {RATE}/s over {:.1} s",
        FLOOD.as_secs_f64(),
        2.0 * cycles as f64 / FLOOD.as_secs_f64(),
        started["rate"].as_f64().unwrap_or(0.0),
        WINDOW.as_secs_f64()
    );
    // Where the time went, if it is long: the flooder's pace per second (its own clock) and,
    // report by report, the flood cgroup's calls as the monitor counted them.
    let mut pace = vec![0u64; FLOOD.as_secs() as usize + 1];
    for t in report["ok_at_ms"].as_array().into_iter().flatten() {
        let sec = (t.as_f64().unwrap_or(0.0) / 1000.0) as usize;
        if let Some(p) = pace.get_mut(sec) {
            *p += 1;
        }
    }
    println!("detection: verbs-churn's CQ cycles per second of its loop: {pace:?}");
    let timeline: Vec<String> = lines
        .iter()
        .filter_map(|l| {
            if let Some(t) = transition(l) {
                return Some(format!("[{} {} {}]", t["change"], t["kind"], t["name"]));
            }
            let v: Value = serde_json::from_str(l).ok()?;
            let cg = v["cgroups"]
                .as_array()?
                .iter()
                .find(|c| c["id"] == flood_cg_id)?;
            Some(cg["ops"]["CQ_CREATE"].to_string())
        })
        .collect();
    println!(
        "detection: the flood cgroup's CQ_CREATE count in each 1 s report, with the transitions: {}",
        timeline.join(" ")
    );
    println!(
        "detection: by verbs-churn's own clock its half-second rate first stayed at {RATE}/s or more for the {:.1} s window from {:.3} s to {window_end:.3} s",
        WINDOW.as_secs_f64(),
        window_end - WINDOW.as_secs_f64()
    );
    for (kind, seen) in &delays {
        println!(
            "detection: {kind} line arrived {:.3} s after the flood's first call, {:+.3} s after the window ended",
            (seen.as_secs_f64() - first_call.as_secs_f64()),
            seen.as_secs_f64() - window_end
        );
    }
    println!(
        "detection: the cgroup's flood reported ended {:.3} s after it stopped ({:+.3} s after a window of quiet)",
        ended_after.as_secs_f64() - FLOOD.as_secs_f64(),
        ended_after.as_secs_f64() - FLOOD.as_secs_f64() - WINDOW.as_secs_f64()
    );
    // The first delay is measured when its line arrives; the later ones were waited for after
    // it, so they are upper bounds.
    for (kind, seen) in &delays {
        let decided = transitions
            .iter()
            .find(|t| {
                t["kind"] == *kind
                    && t["change"] == "started"
                    && t["id"]
                        == match *kind {
                            "cgroup" => flood_cg_id,
                            "process" => churn_pid,
                            _ => 0,
                        }
            })
            .and_then(|t| t["time_unix_s"].as_f64())
            .expect("the transition's time");
        // The monitor's own stamp: how late it decided, without the time its line took to
        // reach this test in a starved VM (printed above as the arrival).
        let delay = decided - loop_start_unix - window_end;
        println!("detection: {kind} decided {delay:+.3} s after the window ended (the monitor's timestamp)");
        let bound = match *kind {
            "cgroup" => PROMISED + TCG_MARGIN,
            _ => PROMISED + TCG_MARGIN + EVENT_LAG,
        };
        assert!(
            delay <= bound.as_secs_f64(),
            "{kind} flagged {delay:.3} s after the window ended: more than {bound:?} (the promise {PROMISED:?}, +{TCG_MARGIN:?} for the emulated VM, +{EVENT_LAG:?} for the event stream but for cgroups)"
        );
        // Not before the flood had lasted a window. (Not checked against `window_end`: when
        // the whole VM stalls, the flooder's record shows a gap that the monitor, stalled too,
        // does not see as a dip; measured: flagged 1.0 s before that reference.)
        assert!(
            seen.as_secs_f64() >= first_call.as_secs_f64() + WINDOW.as_secs_f64() - 0.2,
            "{kind} flagged {:.3} s after the flood's first call, before a {WINDOW:?} window",
            seen.as_secs_f64() - first_call.as_secs_f64()
        );
    }
    drop(quiet_server);
}

/// `secure-client bench connect -n n` against `server`: the median setup per connection, ms.
fn bench_connect(pki: &Pki, server: &ServerProc, n: usize) -> f64 {
    let out = client(pki, server, Some("victim"))
        .args(["bench", "connect", "-n", &n.to_string(), "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("run secure-client bench connect");
    assert!(out.status.success(), "bench connect: {}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bench connect's report: {e}: {}", text(&out.stdout)));
    report["per_connection_us"]["p50"]
        .as_f64()
        .expect("per_connection_us.p50")
        / 1000.0
}

/// A metric's value from a scrape of `addr`.
fn metric(addr: &str, name: &str) -> Option<f64> {
    sample(&scrape_at(addr), name)
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn secure_server_warns_once_when_its_setup_slows_beside_a_flood_and_once_when_it_recovers() {
    require_lab();
    const N: usize = 20;
    const METRICS: &str = "127.0.0.1:9621";
    let pki = Pki::new();
    pki.clients(&["victim".to_owned()]);
    // Slow at twice the calm median of 10 sessions (the default factor): the four floods below
    // made the server's median setup 2.3x to 3.4x its baseline in four runs, and 1.5x was
    // within the noise of the sessions right after them (medians 1.2x to 1.8x the baseline
    // while the host settled), which one CI run of this test reported as a second slowdown.
    let server = ServerProc::start(
        &pki,
        4621,
        &[
            "--setup-slow-factor",
            "2",
            "--setup-slow-window",
            "10",
            "--metrics",
            METRICS,
            "--max-clients",
            "16",
        ],
    );
    let slowed = |l: &str| l.contains("RDMA setup slowed");
    let recovered = |l: &str| l.contains("RDMA setup back to normal speed");
    let said =
        |pred: &dyn Fn(&str) -> bool| server.log.snapshot().iter().filter(|l| pred(l)).count();

    let calm = bench_connect(&pki, &server, N);
    assert_eq!(said(&slowed), 0, "calm sessions were judged slow");
    assert_eq!(metric(METRICS, "secure_rdma_setup_slow"), Some(0.0));

    // Floods of four, a CQ churn and a context churn per device (with two CQ churns alone, one
    // of two runs was never judged slow even at 1.5x), until the server's own median doubles.
    // Four made its median setup 2.3x to 3.4x its baseline in four runs, but 1.44x in one CI
    // run on a slow host (calm median 46 ms per connection): the test then adds four more, up
    // to twelve. Each round where the server stays silent, its own gauges must agree that its
    // median has not reached twice its baseline, or it missed a slowdown.
    let spawn_flood = |dev: &str, kind: &str| {
        let mut c = Command::new(CHURN)
            .args(["--device", dev, "--kind", kind, "--millis", "600000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn verbs-churn");
        let err = Lines::collect(c.stderr.take().expect("stderr"));
        err.wait_for("the flood's start", 1, DEADLINE, |l| {
            l.contains("churning on")
        });
        Killed(Some(c))
    };
    let mut floods: Vec<Killed> = Vec::new();
    let mut flooded = Vec::new();
    while floods.len() < 12 && said(&slowed) == 0 {
        for (dev, kind) in [
            ("rxe-a", "cq"),
            ("rxe-b", "cq"),
            ("rxe-a", "pd"),
            ("rxe-b", "pd"),
        ] {
            floods.push(spawn_flood(dev, kind));
        }
        flooded.push(bench_connect(&pki, &server, N));
        if said(&slowed) == 0 {
            let median = metric(METRICS, "secure_rdma_setup_median_seconds");
            let baseline = metric(METRICS, "secure_rdma_setup_baseline_seconds");
            println!(
                "setup watch: {} floods, median per connection {:.1} ms, no warning; the \
                 server's median {median:?} s against its baseline {baseline:?} s",
                floods.len(),
                flooded[flooded.len() - 1]
            );
            if let (Some(m), Some(b)) = (median, baseline) {
                assert!(
                    m <= 2.0 * b,
                    "the server's median setup {m:.4} s is over twice its baseline {b:.4} s \
                     yet it did not warn"
                );
            }
        }
    }
    let flooded_median = flooded[flooded.len() - 1];
    // Judged as each session's setup ends: by the end of the flooded connections, or never.
    assert_eq!(
        said(&slowed),
        1,
        "no slowdown reported beside {} floods (median per connection {calm:.1} ms alone, \
         {flooded:.1?} ms flooded)",
        floods.len()
    );
    assert_eq!(metric(METRICS, "secure_rdma_setup_slow"), Some(1.0));
    let flood_count = floods.len();
    drop(floods);

    // The floods' processes are killed and reaped, their RDMA objects freed with them. The
    // watch clears below 1.5x its baseline, the calmest median of 10 it ever saw: under TCG
    // one batch of 20 right after the floods was once still above it (one CI run of two).
    // Up to 4 batches, and the server's own numbers if it never clears.
    let mut after = Vec::new();
    while after.len() < 4 && said(&recovered) == 0 {
        after.push(bench_connect(&pki, &server, N));
    }
    let watch_lines = || {
        server
            .log
            .snapshot()
            .into_iter()
            .filter(|l| slowed(l) || recovered(l))
            .collect::<Vec<_>>()
    };
    // Each session's RDMA setup as the server timed it (its "client connected" line), in
    // order: what the watch's medians were taken over.
    let setups = || {
        server
            .log
            .snapshot()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["message"] == "client connected")
            .filter_map(|v| v["setup_ms"].as_f64())
            .map(|ms| format!("{ms:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(
        said(&recovered),
        1,
        "no recovery reported within {} sessions after the floods (median per connection \
         {calm:.1} ms alone, {flooded:.1?} ms flooded, then {after:.1?} ms); the server's setup \
         per session (ms): {}; the server said {:?}",
        after.len() * N,
        setups(),
        watch_lines()
    );
    println!(
        "setup watch: median setup per connection alone {calm:.1} ms, beside {flood_count} \
         floods {flooded_median:.1} ms ({:.2}x), after them {after:.1?} ms; the server's setup per session \
         (ms, in order; each batch is bench connect's \
         first connection, which opens the device, and {N} more): {}; the server said {:?}",
        flooded_median / calm,
        setups(),
        watch_lines()
    );
    assert_eq!(said(&slowed), 1, "one warning per slowdown");
    assert_eq!(said(&recovered), 1);
    assert_eq!(metric(METRICS, "secure_rdma_setup_slow"), Some(0.0));
    assert_eq!(
        metric(METRICS, "secure_rdma_setup_slowdowns_total"),
        Some(1.0)
    );
}
