//! `secure-server --telemetry` on a machine where eBPF cannot run (no kprobes,
//! no root): a warning, then reports of the server's own counts. On the lab VM
//! the eBPF side is tested instead (tests/tests/monitor_lab.rs). A build without the
//! `telemetry` feature falls back the same way.

use std::time::{Duration, Instant};

mod common;

#[test]
fn telemetry_falls_back_to_in_process_counts_with_a_warning() {
    let (mut child, rx, _certs) = common::spawn_logging_server(&[
        "--telemetry",
        "--telemetry-interval",
        "1",
        "--limit",
        "QP_COUNT=3",
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut fell_back = false;
    let mut report = None;
    while report.is_none() && Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let msg = v["fields"]["message"]
            .as_str()
            .or(v["message"].as_str())
            .unwrap_or("");
        if msg.contains("eBPF unavailable") {
            fell_back = true;
        }
        if msg == "telemetry" {
            report = Some(v);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let v = report.expect("a telemetry report within 60 s");
    let fields = if v["fields"].is_object() {
        &v["fields"]
    } else {
        &v
    };
    let source = fields["source"].as_str().unwrap_or("");
    if fell_back {
        assert_eq!(source, "in-process", "{v}");
    } else {
        assert_eq!(source, "ebpf", "{v}");
    }
    let report: serde_json::Value =
        serde_json::from_str(fields["report"].as_str().expect("report")).expect("JSON report");
    assert_eq!(report["config"]["global"]["QP_COUNT"], 3);
    assert_eq!(report["live"]["QP"], 0);
    // Port hardware counters come from sysfs through the same sampler, eBPF or not (none on
    // a machine without RDMA devices).
    assert!(report["hw_counters"].is_object(), "{report}");
}
