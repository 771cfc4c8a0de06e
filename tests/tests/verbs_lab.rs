//! The verbs layer on real Soft-RoCE: two processes, one on `rxe-a` and one
//! on `rxe-b`, whose traffic crosses the `veth-a`/`veth-b` pair.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::process::Command;
use std::time::Duration;

use secure_rdma_tests::{
    netdev_counter, rdma_resources_of, require_lab, spawn, wait_with_deadline, ADDR_A,
};
use serde_json::Value;

const EXCHANGE: &str = env!("CARGO_BIN_EXE_verbs-exchange");
const DEADLINE: Duration = Duration::from_secs(60);

struct Run {
    server: std::process::Output,
    client: std::process::Output,
}

fn exchange(port: u16, server_args: &[&str], client_args: &[&str]) -> Run {
    require_lab();
    let listen = format!("{ADDR_A}:{port}");
    let server = spawn(
        Command::new(EXCHANGE)
            .args(["--role", "server", "--device", "rxe-a", "--listen", &listen])
            .args(server_args),
    );
    let client = spawn(
        Command::new(EXCHANGE)
            .args([
                "--role",
                "client",
                "--device",
                "rxe-b",
                "--connect",
                &listen,
            ])
            .args(client_args),
    );
    let client = wait_with_deadline(client, DEADLINE, "verbs-exchange client");
    let server = wait_with_deadline(server, DEADLINE, "verbs-exchange server");
    Run { server, client }
}

fn report(out: &std::process::Output, who: &str) -> Value {
    assert!(
        out.status.success(),
        "{who} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{who} printed no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn send_write_and_write_imm_cross_the_veth_pair() {
    require_lab();
    let before = netdev_counter("veth-a", "tx_packets") + netdev_counter("veth-a", "rx_packets");
    let run = exchange(18601, &[], &[]);
    let after = netdev_counter("veth-a", "tx_packets") + netdev_counter("veth-a", "rx_packets");
    let s = report(&run.server, "server");
    let c = report(&run.client, "client");

    // Each side's SEND arrived byte for byte on the other.
    assert_eq!(s["received"], "hello from the client on rxe-b");
    assert_eq!(c["received"], "hello from the server on rxe-a");
    // 1 MiB RDMA WRITE checked byte by byte, and the immediate delivered.
    assert_eq!(s["verdict"]["write_bytes"], 1 << 20);
    assert_eq!(s["verdict"]["bad_bytes"], 0);
    assert_eq!(s["verdict"]["imm"], 0xC0FF_EE01u32);
    assert_eq!(s["verdict"]["write_verified"], true);
    assert_eq!(s["local"]["gid"], "::ffff:10.77.0.1");
    assert_eq!(c["local"]["gid"], "::ffff:10.77.0.2");

    // The packets crossed veth-a: at least one per message (2 SENDs, the
    // 1 MiB WRITE at MTU 1024 is 1024 packets, the WRITE WITH IMM) plus ACKs.
    let mtu = s["mtu"].as_u64().expect("mtu");
    let min_packets = 2 + (1 << 20) / mtu;
    assert!(
        after - before >= min_packets,
        "veth-a counted {} packets, expected at least {min_packets}",
        after - before
    );
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn query_qp_reads_back_the_psns_and_qpn_that_were_set() {
    let run = exchange(18602, &[], &[]);
    let s = report(&run.server, "server");
    let c = report(&run.client, "client");
    for (me, peer) in [(&s, &c), (&c, &s)] {
        let q = &me["queried"];
        assert_eq!(q["state"], "RTS");
        assert_eq!(q["sq_psn"], me["local"]["psn"], "sq_psn is our PSN");
        assert_eq!(
            q["rq_psn"], peer["local"]["psn"],
            "rq_psn is the peer's PSN"
        );
        assert_eq!(
            q["dest_qpn"], peer["local"]["qpn"],
            "dest QPN is the peer's QPN"
        );
        assert_eq!(me["remote"]["psn"], peer["local"]["psn"]);
        let psn = me["local"]["psn"].as_u64().expect("psn");
        assert!(psn < 1 << 24);
    }
    assert_ne!(
        s["local"]["psn"], c["local"]["psn"],
        "two CSPRNG PSNs collided (1 in 2^24)"
    );
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn wrong_psn_fails_with_a_timeout_error_not_a_hang() {
    let started = std::time::Instant::now();
    let run = exchange(
        18603,
        &["--timeout", "3"],
        &["--wrong-psn", "--timeout", "3"],
    );
    let elapsed = started.elapsed();
    let server_err = String::from_utf8_lossy(&run.server.stderr);
    let client_err = String::from_utf8_lossy(&run.client.stderr);
    assert!(
        !run.server.status.success(),
        "server succeeded despite the wrong PSN"
    );
    assert!(
        !run.client.status.success(),
        "client succeeded despite the wrong PSN"
    );
    // The server's receive PSN does not match what the client sends: the
    // client's SEND is dropped silently and the server times out.
    assert!(
        server_err.contains("timed out after 3s waiting for the peer's SEND to arrive"),
        "server stderr: {server_err}"
    );
    assert!(client_err.contains("error:"), "client stderr: {client_err}");
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn no_qp_mr_cq_or_pd_is_left_after_both_processes_exit() {
    let run = exchange(18604, &[], &[]);
    let s = report(&run.server, "server");
    let c = report(&run.client, "client");
    for r in [&s, &c] {
        let pid = r["pid"].as_u64().expect("pid") as u32;
        let left = rdma_resources_of(pid);
        assert!(left.is_empty(), "resources of pid {pid} remain: {left:#?}");
    }
    // And `rdma resource show` does see user resources while they exist: a
    // process that is still connected is listed (guards against a parser that
    // never matches anything).
    require_lab();
    let listen = format!("{ADDR_A}:18605");
    let server = spawn(Command::new(EXCHANGE).args([
        "--role",
        "server",
        "--device",
        "rxe-a",
        "--listen",
        &listen,
        "--timeout",
        "2",
    ]));
    let pid = server.id();
    // The server opens its resources only after a peer connects; connect and
    // never answer, so it sits in the handshake with PD, CQs, MRs and QP made.
    let sock = std::net::TcpStream::connect(&listen);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    let _sock = match sock {
        Ok(s) => s,
        Err(_) => {
            // The listener was not up yet: retry until it is.
            loop {
                if let Ok(s) = std::net::TcpStream::connect(&listen) {
                    break s;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "server never listened"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    while std::time::Instant::now() < deadline {
        seen = rdma_resources_of(pid);
        if seen.iter().any(|l| l.starts_with("qp:")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let kinds: Vec<&str> = seen.iter().filter_map(|l| l.split(':').next()).collect();
    for k in ["qp", "cq", "mr", "pd"] {
        assert!(
            kinds.contains(&k),
            "no {k} listed for live pid {pid}: {seen:#?}"
        );
    }
    drop(_sock);
    let out = wait_with_deadline(server, DEADLINE, "server with a silent peer");
    assert!(!out.status.success());
    let left = rdma_resources_of(pid);
    assert!(left.is_empty(), "resources of pid {pid} remain: {left:#?}");
}
