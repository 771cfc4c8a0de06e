//! rdma-capture on real Soft-RoCE: what it decodes must match what the
//! programs did, what the kernel set, and what tshark reads from its pcap.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use secure_rdma_tests::secure::{bin, client, Lines, Pki, ServerProc};
use secure_rdma_tests::{
    interrupt_and_wait, require_lab, spawn, text, wait_listening, wait_with_deadline, ADDR_A,
    ADDR_B,
};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(90);

/// A running `rdma-capture --json`.
struct CaptureProc {
    child: Child,
    stdout: Lines,
    stderr: Lines,
}

impl CaptureProc {
    /// Starts the capture and waits until every hook in `attached` is reported attached.
    fn start(args: &[&str], pcap: &Path, attached: &[&str]) -> CaptureProc {
        let mut child = Command::new(bin("rdma-capture"))
            .args(args)
            .args(["--json", "-w"])
            .arg(pcap)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rdma-capture");
        let stdout = Lines::collect(child.stdout.take().expect("stdout"));
        let stderr = Lines::collect(child.stderr.take().expect("stderr"));
        for hook in attached {
            stderr.wait_for(hook, 1, Duration::from_secs(60), |l| {
                l.starts_with("rdma-capture: attached") && l.contains(hook)
            });
        }
        CaptureProc {
            child,
            stdout,
            stderr,
        }
    }

    /// Stops it with SIGINT; returns the packet objects and the summary.
    fn stop(self) -> (Vec<Value>, Value) {
        let out = interrupt_and_wait(self.child, DEADLINE, "rdma-capture");
        assert!(
            out.status.success(),
            "rdma-capture failed: {}",
            self.stderr.snapshot().join("\n")
        );
        // The reader threads may still hold the last lines for a moment after exit; the
        // summary is the last thing written to each stream.
        self.stderr
            .wait_for("stderr summary", 1, Duration::from_secs(10), |l| {
                l.starts_with("--- rdma-capture summary")
            });
        let stderr = self.stderr.snapshot().join("\n");
        self.stdout
            .wait_for("summary line", 1, Duration::from_secs(10), |l| {
                l.starts_with("{\"summary\"")
            });
        let mut lines: Vec<Value> = self
            .stdout
            .snapshot()
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        let summary = lines.pop().expect("summary")["summary"].clone();
        assert!(!summary.is_null(), "last line is the summary");
        assert!(stderr.contains("--- rdma-capture summary"), "{stderr}");
        (lines, summary)
    }
}

fn opcode(p: &Value) -> &str {
    p["bth"]["opcode"]["name"].as_str().expect("opcode name")
}
fn psn(p: &Value) -> u64 {
    p["bth"]["psn"].as_u64().expect("psn")
}
fn dest_qp(p: &Value) -> u64 {
    p["bth"]["dest_qp"].as_u64().expect("dest_qp")
}
fn is_ack(p: &Value) -> bool {
    opcode(p) == "RC Acknowledge"
}

/// (opcode, QPN, PSN) of every packet in a pcap, as tshark decodes it.
fn tshark_fields(pcap: &Path) -> Vec<(u64, u64, u64)> {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args([
            "-T",
            "fields",
            "-E",
            "separator=,",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.bth.psn",
        ])
        .output()
        .expect("run tshark (scripts/test.sh installs it)");
    assert!(out.status.success(), "tshark: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .map(|l| {
            let f: Vec<u64> = l
                .split(',')
                .map(|x| {
                    let x = x.trim();
                    match x.strip_prefix("0x") {
                        Some(h) => u64::from_str_radix(h, 16),
                        None => x.parse(),
                    }
                    .unwrap_or_else(|e| panic!("tshark field {x:?} in {l:?}: {e}"))
                })
                .collect();
            assert_eq!(f.len(), 3, "tshark line {l:?}");
            (f[0], f[1], f[2])
        })
        .collect()
}

fn fields_of(packets: &[Value]) -> Vec<(u64, u64, u64)> {
    packets
        .iter()
        .map(|p| {
            (
                p["bth"]["opcode"]["code"].as_u64().expect("opcode code"),
                dest_qp(p),
                psn(p),
            )
        })
        .collect()
}

fn hex(v: &Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("{v} is not a string"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex")
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn secure_session_on_the_wire_matches_operations_psns_icrcs_and_tshark() {
    require_lab();
    let dir = tempfile::tempdir().expect("tempdir");
    let pcap = dir.path().join("session.pcap");
    let capture = CaptureProc::start(&["-d", "rxe-a"], &pcap, &["XDP on veth-a", "TC egress"]);

    let pki = Pki::new();
    pki.clients(&["wire".to_owned()]);
    let server = ServerProc::start(&pki, 4510, &[]);
    // 3000 bytes at MTU 1024: RDMA WRITE First, Middle, Last with Immediate.
    let big = "w".repeat(3000);
    let out = wait_with_deadline(
        spawn(client(&pki, &server, Some("wire")).args([
            "-e",
            "send hello over the wire",
            "-e",
            &format!("write {big}"),
            "-e",
            "write tiny",
            "-e",
            "quit",
        ])),
        DEADLINE,
        "client",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    server
        .log
        .wait_for("client gone", 1, DEADLINE, |l| l.contains("client gone"));
    let (packets, summary) = capture.stop();

    let client_rts: Value = text(&out.stderr)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|e| e["message"] == "QP in RTS")
        .expect("client QP in RTS event");
    let server_rts = server
        .events("QP in RTS")
        .pop()
        .expect("server QP in RTS event");
    let (client_qpn, server_qpn) = (hex(&client_rts["qpn"]), hex(&server_rts["qpn"]));

    // Only this session's traffic crossed veth-a. The client's packets arrive at veth-a (XDP,
    // "in"), the server's leave it (TC, "out"); the direction tells them apart, since both QPs
    // may well have the same number on their two devices.
    let to_server = |p: &Value| p["source"] == "in" && dest_qp(p) == server_qpn;
    let to_client = |p: &Value| p["source"] == "out" && dest_qp(p) == client_qpn;
    let session: Vec<Value> = packets
        .iter()
        .filter(|p| to_server(p) || to_client(p))
        .cloned()
        .collect();
    assert_eq!(
        session.len(),
        packets.len(),
        "foreign packets: {packets:#?}"
    );

    // The operations made, and nothing else: each side's confirmation SEND, the client's send,
    // the 3000-byte WRITE WITH IMMEDIATE in three packets, the tiny one in one. Counted by
    // distinct (QP, PSN) so that a retransmission under emulation cannot fail the test.
    let mut requests: BTreeMap<(&str, &str), BTreeSet<u64>> = BTreeMap::new();
    for p in session.iter().filter(|p| !is_ack(p)) {
        let direction = if to_server(p) {
            "to server"
        } else {
            "to client"
        };
        requests
            .entry((direction, opcode(p)))
            .or_default()
            .insert(psn(p));
    }
    let counts: BTreeMap<(&str, &str), usize> =
        requests.iter().map(|(k, v)| (*k, v.len())).collect();
    let expected: BTreeMap<(&str, &str), usize> = [
        (("to server", "RC SEND Only"), 2),
        (("to server", "RC RDMA WRITE First"), 1),
        (("to server", "RC RDMA WRITE Middle"), 1),
        (("to server", "RC RDMA WRITE Last with Immediate"), 1),
        (("to server", "RC RDMA WRITE Only with Immediate"), 1),
        (("to client", "RC SEND Only"), 1),
    ]
    .into_iter()
    .collect();
    assert_eq!(counts, expected, "requests seen");
    assert!(
        session.iter().any(|p| is_ack(p) && to_server(p)),
        "no ACK to the server"
    );
    assert!(
        session.iter().any(|p| is_ack(p) && to_client(p)),
        "no ACK to the client"
    );

    // The first PSN in each direction is the PSN set for that QP over TLS.
    let first_request = |towards: &dyn Fn(&Value) -> bool| {
        session.iter().find(|p| towards(p) && !is_ack(p)).map(psn)
    };
    assert_eq!(
        first_request(&to_server),
        client_rts["local_psn"].as_u64(),
        "client -> server"
    );
    assert_eq!(
        first_request(&to_client),
        server_rts["local_psn"].as_u64(),
        "server -> client"
    );

    // Every ICRC verifies.
    assert!(session.iter().all(|p| p["icrc_ok"] == true), "bad ICRC");
    assert_eq!(summary["stats"]["bad_icrc"], 0);
    assert_eq!(summary["stats"]["decode_errors"], 0);
    assert_eq!(summary["kernel"]["dropped"], 0);
    assert_eq!(summary["shown"].as_u64(), Some(session.len() as u64));

    // tshark reads the same packets from the pcap.
    assert_eq!(tshark_fields(&pcap), fields_of(&session));

    // Following the server's QP in the file gives both directions of the connection, in order.
    let out = Command::new(bin("rdma-capture"))
        .arg("-r")
        .arg(&pcap)
        .args(["--json", "--qpn", &server_qpn.to_string()])
        .output()
        .expect("rdma-capture -r");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut replayed: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let followed = replayed.pop().expect("summary");
    // Every packet of the session belongs to the followed connection.
    assert_eq!(fields_of(&replayed), fields_of(&session));
    let flows = followed["summary"]["flows"]
        .as_array()
        .expect("flows")
        .clone();
    // Each direction is two PSN sequences: its sender's requests, and its ACKs of the other
    // side's requests.
    assert_eq!(flows.len(), 4, "{flows:#?}");
    let flow = |addr: &str, stream: &str| {
        flows
            .iter()
            .find(|f| {
                f["flow"]["stream"] == stream
                    && f["flow"]["dst"]
                        .as_str()
                        .is_some_and(|d| d.starts_with(&format!("{addr}:")))
            })
            .unwrap_or_else(|| panic!("no {stream} to {addr}: {flows:#?}"))["summary"]
            .clone()
    };
    let mut followed_packets = 0;
    for (addr, towards) in [
        (ADDR_A, &to_server as &dyn Fn(&Value) -> bool),
        (ADDR_B, &to_client),
    ] {
        for (stream, acks) in [("requests", false), ("responses", true)] {
            let f = flow(addr, stream);
            let first = session
                .iter()
                .find(|p| towards(p) && is_ack(p) == acks)
                .map(psn);
            assert_eq!(f["first_psn"].as_u64(), first, "{stream} to {addr}: {f}");
            assert_eq!(f["gaps"], 0, "{stream} to {addr}: {f}");
            followed_packets += f["packets"].as_u64().unwrap_or(0);
        }
    }
    assert_eq!(
        flow(ADDR_A, "requests")["first_psn"].as_u64(),
        client_rts["local_psn"].as_u64()
    );
    assert_eq!(
        flow(ADDR_B, "requests")["first_psn"].as_u64(),
        server_rts["local_psn"].as_u64()
    );
    assert_eq!(followed_packets, session.len() as u64);
    println!(
        "capture: {} packets on veth-a, {} requests, first PSNs {:#08x} / {:#08x}, all ICRCs good, tshark agrees",
        session.len(),
        counts.values().sum::<usize>(),
        client_rts["local_psn"].as_u64().unwrap_or(0),
        server_rts["local_psn"].as_u64().unwrap_or(0),
    );
}

/// `ibv_rc_pingpong`'s "local address: LID 0x0000, QPN 0x000011, PSN 0x1f2e3d, GID ..." line.
fn pingpong_address(output: &str, which: &str) -> (u64, u64) {
    let line = output
        .lines()
        .find(|l| l.trim_start().starts_with(which))
        .unwrap_or_else(|| panic!("no {which:?} line in {output}"));
    let field = |name: &str| {
        let v = line
            .split(',')
            .find_map(|f| f.trim().strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line}"));
        u64::from_str_radix(v.trim().trim_start_matches("0x"), 16).expect("hex")
    };
    (field("QPN "), field("PSN "))
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn same_device_traffic_is_captured_through_the_rxe_probes() {
    require_lab();
    let dir = tempfile::tempdir().expect("tempdir");
    let pcap = dir.path().join("loop.pcap");
    let wire = CaptureProc::start(
        &["-i", "veth-a"],
        &dir.path().join("wire.pcap"),
        &["TC egress"],
    );
    let probes = CaptureProc::start(
        &["-d", "rxe-a", "--rxe"],
        &pcap,
        &["kprobe rxe_rcv", "kretprobe rxe_icrc_generate"],
    );

    // Both ends of the pingpong on rxe-a: rxe loops the traffic back internally.
    const ITERS: usize = 20;
    let pingpong = |extra: &[&str]| {
        let mut cmd = Command::new("ibv_rc_pingpong");
        cmd.args(["-d", "rxe-a", "-g", "1", "-s", "64", "-p", "18611"])
            .args(["-n", &ITERS.to_string()])
            .args(extra);
        cmd
    };
    let server = spawn(&mut pingpong(&[]));
    assert!(wait_listening(18611), "pingpong server listening on 18611");
    let client = spawn(&mut pingpong(&[ADDR_A]));
    let c = wait_with_deadline(client, DEADLINE, "pingpong client");
    let s = wait_with_deadline(server, DEADLINE, "pingpong server");
    assert!(c.status.success(), "{}", text(&c.stderr));
    assert!(s.status.success(), "{}", text(&s.stderr));
    let (packets, summary) = probes.stop();
    let (wire_packets, _) = wire.stop();

    let (client_qpn, client_psn) = pingpong_address(&text(&c.stdout), "local address");
    let (server_qpn, server_psn) = pingpong_address(&text(&s.stdout), "local address");
    let ours: Vec<&Value> = packets
        .iter()
        .filter(|p| [client_qpn, server_qpn].contains(&dest_qp(p)))
        .collect();
    // Nothing of it reached the netdev (the pingpong's TCP setup does, hence no packet counters).
    assert!(
        wire_packets
            .iter()
            .all(|p| ![client_qpn, server_qpn].contains(&dest_qp(p))),
        "same-device traffic showed up on veth-a"
    );

    // Every packet is seen twice: sent by rxe-a, then received by rxe-a.
    let sends = |source: &str, qpn: u64| {
        ours.iter()
            .filter(|p| p["source"] == source && dest_qp(p) == qpn && opcode(p) == "RC SEND Only")
            .map(|p| psn(p))
            .collect::<BTreeSet<u64>>()
            .len()
    };
    for source in ["rxe-tx", "rxe-rx"] {
        assert_eq!(
            sends(source, server_qpn),
            ITERS,
            "{source} client -> server"
        );
        assert_eq!(
            sends(source, client_qpn),
            ITERS,
            "{source} server -> client"
        );
    }
    let first = |qpn: u64| {
        ours.iter()
            .find(|p| p["source"] == "rxe-tx" && dest_qp(p) == qpn && !is_ack(p))
            .map(|p| psn(p))
    };
    assert_eq!(first(server_qpn), Some(client_psn), "client's first PSN");
    assert_eq!(first(client_qpn), Some(server_psn), "server's first PSN");
    assert!(ours.iter().all(|p| p["icrc_ok"] == true), "bad ICRC");
    assert_eq!(summary["stats"]["bad_icrc"], 0);
    assert_eq!(summary["kernel"]["dropped"], 0);
    let expected_owned: Vec<Value> = ours.iter().map(|p| (*p).clone()).collect();
    let on_file: Vec<_> = tshark_fields(&pcap)
        .into_iter()
        .filter(|(_, qp, _)| [client_qpn, server_qpn].contains(qp))
        .collect();
    assert_eq!(on_file, fields_of(&expected_owned));
    println!(
        "rxe probes: {} packets of a same-device pingpong ({} x 2 SENDs each seen at send and receive), none on veth-a",
        ours.len(),
        ITERS
    );
}
