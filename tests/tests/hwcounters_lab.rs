//! Detection on real Soft-RoCE: RoCEv2 packets with wrong PSNs, forged with the `roce`
//! encoder and sent on-path out of `veth-b` into a live queue pair on `rxe-a`, move rxe-a's
//! `duplicate_request` and `out_of_seq_request` port counters, and `rdma-monitor --no-ebpf`
//! (plain sysfs reads) reports their growth in its JSON reports, as does
//! `secure-server --telemetry` through the same sampler.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::time::Duration;

use secure_rdma_tests::inject::{
    hw_counter, hw_counter_settled, mac_of, send_frame, send_only, wait_hw_counter, LivePair,
    FORGED_SRC_PORT,
};
use secure_rdma_tests::secure::{Pki, ServerProc};
use secure_rdma_tests::{rdma_monitor, require_lab};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(90);

/// Requests with a PSN the QP already consumed: each one counts as a duplicate.
const DUPLICATES: u64 = 3;

/// rxe-a's port-1 counter `name` in one report: (total, delta).
fn rxe_a(report: &Value, name: &str) -> (u64, Option<u64>) {
    let c = &report["hw_counters"]["rxe-a"]["1"][name];
    let total = c["total"]
        .as_u64()
        .unwrap_or_else(|| panic!("no rxe-a/1/{name} in {report:#}"));
    (total, c["delta"].as_u64())
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn forged_packets_with_wrong_psns_show_in_rdma_monitor_port_counters() {
    require_lab();
    let mut pair = LivePair::connect();
    pair.exchange(2).expect("the pair works before the attack");

    let monitor = rdma_monitor(&["--no-ebpf", "--json", "--interval", "0.5"]);
    let stdout = monitor.out.clone();
    stdout.wait_for("first report", 1, DEADLINE, |l| l.starts_with('{'));
    let pki = Pki::new();
    let server = ServerProc::start(&pki, 4540, &["--telemetry", "--telemetry-interval", "1"]);

    let dup0 = hw_counter("rxe-a", "duplicate_request");
    let oos0 = hw_counter("rxe-a", "out_of_seq_request");
    let rcvd0 = hw_counter("rxe-a", "rcvd_pkts");
    let (qpn, expected) = (pair.a_qpn(), pair.a_expected_psn());
    let (mac_a, mac_b) = (mac_of("veth-a"), mac_of("veth-b"));
    let forge = |psn: u32| {
        send_only(qpn, psn, FORGED_SRC_PORT)
            .src_mac(mac_b)
            .dst_mac(mac_a)
            .frame()
            .expect("build the forged frame")
    };

    // Behind the expected PSN: duplicates, each counted (and ACKed again, nothing delivered).
    for back in 1..=DUPLICATES as u32 {
        send_frame("veth-b", &forge(expected.wrapping_sub(back))).expect("AF_PACKET send");
    }
    wait_hw_counter("rxe-a", "duplicate_request", dup0 + DUPLICATES);
    let dup = hw_counter_settled("rxe-a", "duplicate_request");
    // Ahead of it: out of sequence. rxe counts the first and NAKs it; until an in-order
    // packet arrives, further ones are dropped uncounted.
    for ahead in [1000, 1001] {
        send_frame("veth-b", &forge(expected.wrapping_add(ahead))).expect("AF_PACKET send");
    }
    wait_hw_counter("rxe-a", "out_of_seq_request", oos0 + 1);
    let oos = hw_counter_settled("rxe-a", "out_of_seq_request");
    let rcvd = hw_counter("rxe-a", "rcvd_pkts");
    assert_eq!(
        dup - dup0,
        DUPLICATES,
        "one duplicate_request per duplicate"
    );
    // Every forged packet passed rxe's header and ICRC checks.
    assert!(
        rcvd - rcvd0 >= DUPLICATES + 2,
        "rcvd_pkts moved by {}",
        rcvd - rcvd0
    );

    // The monitor's reports catch up with sysfs.
    let caught_up = |l: &str| {
        serde_json::from_str::<Value>(l).is_ok_and(|v| {
            v.get("hw_counters").is_some()
                && rxe_a(&v, "duplicate_request").0 == dup
                && rxe_a(&v, "out_of_seq_request").0 == oos
        })
    };
    stdout.wait_for("a report with the forged packets", 1, DEADLINE, caught_up);
    server
        .log
        .wait_for("a server telemetry report with them", 1, DEADLINE, |l| {
            serde_json::from_str::<Value>(l).is_ok_and(|v| {
                v["message"] == "telemetry"
                    && v["report"]
                        .as_str()
                        .and_then(|r| serde_json::from_str::<Value>(r).ok())
                        .is_some_and(|r| caught_up(&r.to_string()))
            })
        });
    drop(server);

    // The real client's next message is in order: the QP still works.
    pair.exchange(1).expect("the pair works after the attack");

    monitor.stop(DEADLINE);
    stdout.wait_for("final report", 1, Duration::from_secs(10), |l| {
        l.contains("\"final\":true")
    });
    let reports: Vec<Value> = stdout
        .snapshot()
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v.get("hw_counters").is_some())
        .collect();
    for name in ["duplicate_request", "out_of_seq_request"] {
        let deltas: Vec<u64> = reports
            .iter()
            .map(|r| rxe_a(r, name).1.expect("every printed report has a delta"))
            .collect();
        // The reports' deltas add up to what the counter grew while the monitor ran.
        let (first_total, first_delta) = rxe_a(&reports[0], name);
        let last_total = rxe_a(reports.last().expect("reports"), name).0;
        assert_eq!(
            deltas.iter().sum::<u64>(),
            last_total - (first_total - first_delta.unwrap_or(0)),
            "{name}: deltas {deltas:?}"
        );
        let grew = if name == "duplicate_request" {
            DUPLICATES
        } else {
            1
        };
        assert!(
            deltas.iter().sum::<u64>() >= grew,
            "{name}: deltas {deltas:?}"
        );
        assert!(deltas.iter().any(|d| *d > 0), "{name}: no report shows it");
        println!(
            "rxe-a {name}: {} in sysfs, reported deltas {deltas:?}",
            hw_counter("rxe-a", name)
        );
    }
    println!(
        "forged {DUPLICATES} duplicates and 2 out-of-sequence requests into QP {qpn:#x}: \
         duplicate_request +{}, out_of_seq_request +{}, rcvd_pkts +{} ({} reports)",
        dup - dup0,
        oos - oos0,
        rcvd - rcvd0,
        reports.len()
    );
}
