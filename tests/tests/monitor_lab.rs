//! rdma-monitor and secure-server --telemetry on real Soft-RoCE: a workload
//! with a known number of verbs, run in known cgroups, must be counted exactly,
//! globally, per cgroup and per second, and live counts must return to the
//! baseline when it exits.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use secure_rdma_tests::secure::{bin, client, Held, Lines, Pki, ServerProc};
use secure_rdma_tests::{
    interrupt_and_wait, require_lab, spawn, text, wait_listening, wait_with_deadline, TestCgroup,
    ADDR_A,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(90);

/// A running `rdma-monitor --json`.
struct MonitorProc {
    child: Child,
    stdout: Lines,
    stderr: Lines,
}

impl MonitorProc {
    fn start() -> MonitorProc {
        let mut child = Command::new(bin("rdma-monitor"))
            .args(["--json", "--interval", "0.5"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rdma-monitor");
        let stdout = Lines::collect(child.stdout.take().expect("stdout"));
        let stderr = Lines::collect(child.stderr.take().expect("stderr"));
        // Attached once the first report is out.
        stdout.wait_for("first report", 1, Duration::from_secs(60), |l| {
            l.starts_with('{')
        });
        MonitorProc {
            child,
            stdout,
            stderr,
        }
    }

    /// Waits until a report printed from now on shows `live` equal to `want` for every
    /// resource: an earlier one (say, all zero before anything started) does not count.
    fn wait_live(&self, want: &BTreeMap<&str, i64>) {
        let shows = |l: &str| serde_json::from_str::<Value>(l).is_ok_and(|v| live(&v) == *want);
        let earlier = self.stdout.snapshot().iter().filter(|l| shows(l)).count();
        self.stdout
            .wait_for("live counts", earlier + 1, DEADLINE, shows);
    }

    /// SIGINT, then the final report.
    fn stop(self) -> (Vec<Value>, Value) {
        let MonitorProc {
            child,
            stdout,
            stderr,
        } = self;
        let out = interrupt_and_wait(child, DEADLINE, "rdma-monitor");
        assert!(
            out.status.success(),
            "rdma-monitor: {}",
            stderr.snapshot().join("\n")
        );
        stdout.wait_for("final report", 1, Duration::from_secs(10), |l| {
            l.contains("\"final\":true")
        });
        let mut reports: Vec<Value> = stdout
            .snapshot()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v.get("live").is_some())
            .collect();
        let last = reports.pop().expect("final report");
        (reports, last)
    }
}

fn live(report: &Value) -> BTreeMap<&'static str, i64> {
    ["QP", "PD", "CQ", "MR"]
        .into_iter()
        .map(|r| (r, report["live"][r].as_i64().unwrap_or(-1)))
        .collect()
}

fn zero() -> BTreeMap<&'static str, i64> {
    live(&serde_json::json!({"live": {"QP": 0, "PD": 0, "CQ": 0, "MR": 0}}))
}

fn verb(report: &Value, name: &str) -> u64 {
    report["totals"][name].as_u64().unwrap_or(0)
}

fn cgroup<'a>(report: &'a Value, path: &str) -> &'a Value {
    report["cgroups"]
        .as_array()
        .and_then(|cgs| cgs.iter().find(|c| c["path"] == path))
        .unwrap_or_else(|| panic!("no cgroup {path} in {report:#}"))
}

/// Sum over the interval reports of rate x interval: what the rates say was called.
fn from_rates(reports: &[Value], name: &str) -> f64 {
    reports
        .iter()
        .map(|r| {
            r["rates"][name].as_f64().unwrap_or(0.0) * r["interval_seconds"].as_f64().unwrap_or(0.0)
        })
        .sum()
}

fn pingpong_pair(server_cg: &TestCgroup, client_cg: &TestCgroup, port: u16) {
    let args = format!("-g 1 -n 10 -s 64 -p {port}");
    let server = spawn(&mut server_cg.command(&format!("ibv_rc_pingpong -d rxe-a {args}")));
    assert!(wait_listening(port), "pingpong server on {port}");
    let client =
        spawn(&mut client_cg.command(&format!("ibv_rc_pingpong -d rxe-b {args} {ADDR_A}")));
    let c = wait_with_deadline(client, DEADLINE, "pingpong client");
    let s = wait_with_deadline(server, DEADLINE, "pingpong server");
    assert!(c.status.success(), "{}", text(&c.stderr));
    assert!(s.status.success(), "{}", text(&s.stderr));
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn pingpong_pairs_in_two_cgroups_are_counted_exactly() {
    require_lab();
    let (a, b) = (TestCgroup::new("mon-a"), TestCgroup::new("mon-b"));
    let monitor = MonitorProc::start();
    const PAIRS: u64 = 3;
    for i in 0..PAIRS {
        pingpong_pair(&a, &b, 18630 + i as u16);
    }
    monitor.wait_live(&zero());
    let (reports, last) = monitor.stop();

    // Each ibv_rc_pingpong opens its device once, makes one PD, MR, CQ and QP, moves the QP
    // through INIT, RTR and RTS, and destroys all four; servers in a, clients in b.
    let per_process = [
        ("CTX_OPEN", 1),
        ("QP_CREATE", 1),
        ("QP_MODIFY", 3),
        ("QP_DESTROY", 1),
        ("PD_ALLOC", 1),
        ("PD_DEALLOC", 1),
        ("CQ_CREATE", 1),
        ("CQ_DESTROY", 1),
        ("MR_REG", 1),
        ("MR_DEREG", 1),
        ("GID_QUERY", 1),
    ];
    for (name, n) in per_process {
        assert_eq!(verb(&last, name), 2 * PAIRS * n, "global {name}: {last:#}");
        for cg in [&a, &b] {
            let ops = &cgroup(&last, &cg.path())["ops"];
            assert_eq!(
                ops[name].as_u64().unwrap_or(0),
                PAIRS * n,
                "{} {name}",
                cg.path()
            );
        }
        let rated = from_rates(&reports, name) + {
            // The final report's rates cover the time since the last interval report.
            let after =
                verb(&last, name) as f64 - reports.last().map_or(0.0, |r| verb(r, name) as f64);
            after
        };
        assert!(
            (rated - (2 * PAIRS * n) as f64).abs() < 0.01,
            "{name}: rates x intervals add up to {rated}"
        );
    }
    assert_eq!(live(&last), zero(), "back to the baseline");
    assert_eq!(last["lost_events"], 0);
    println!(
        "rdma-monitor: {PAIRS} pingpong pairs in 2 cgroups: {} QP creates, {} modifies, {} reports, live back to 0",
        verb(&last, "QP_CREATE"),
        verb(&last, "QP_MODIFY"),
        reports.len()
    );
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn secure_server_with_k_clients_is_counted_by_the_monitor_and_by_its_own_telemetry() {
    require_lab();
    const K: usize = 3;
    let pki = Pki::new();
    let names: Vec<String> = (0..K).map(|i| format!("t{i}")).collect();
    pki.clients(&names);
    let monitor = MonitorProc::start();
    let server = ServerProc::start(&pki, 4530, &["--telemetry", "--telemetry-interval", "1"]);
    let held: Vec<Held> = names
        .iter()
        .map(|n| Held::start(client(&pki, &server, Some(n))))
        .collect();
    for h in &held {
        h.wait_connected();
    }
    // Per session each side makes 1 PD, 2 CQs and 1 QP, and 2 MRs (its send and receive
    // slots): the server's write region waits for a client's first WRITE, and these clients
    // only connect; the client exposes no memory at all.
    const MRS: i64 = 2 + 2;
    let want: BTreeMap<&str, i64> = [("QP", 2), ("PD", 2), ("CQ", 4), ("MR", MRS)]
        .into_iter()
        .map(|(r, n)| (r, K as i64 * n))
        .collect();
    monitor.wait_live(&want);
    // The server's own --telemetry sees the same system-wide counts through eBPF.
    server.log.wait_for("server telemetry", 1, DEADLINE, |l| {
        let Ok(v) = serde_json::from_str::<Value>(l) else {
            return false;
        };
        v["message"] == "telemetry"
            && v["source"] == "ebpf"
            && v["report"]
                .as_str()
                .and_then(|r| serde_json::from_str::<Value>(r).ok())
                .is_some_and(|r| live(&r) == want)
    });
    for h in held {
        assert!(h.quit().success());
    }
    // The server logs this once a session's objects are destroyed.
    server
        .log
        .wait_for("client gone", K, DEADLINE, |l| l.contains("client gone"));
    monitor.wait_live(&zero());
    let (_, last) = monitor.stop();
    assert_eq!(verb(&last, "QP_CREATE"), 2 * K as u64);
    assert_eq!(verb(&last, "MR_REG"), MRS as u64 * K as u64);
    assert_eq!(verb(&last, "QP_DESTROY"), 2 * K as u64);
    println!(
        "rdma-monitor: secure server with {K} clients: live {want:?} while connected, 0 after"
    );
}
