//! Hostile peers against secure-server on real Soft-RoCE (issue: the server stays up and fair
//! under abuse). The server on 10.77.0.1 (`rxe-a`), clients from 10.77.0.2 (`rxe-b`).
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use secure_rdma::client::{Client, ClientConfig};
use secure_rdma_tests::secure::{
    bin, client, hostile_client as hostile, small_tcp_buffers, Held, Lines, Pki, ServerProc,
};
use secure_rdma_tests::{require_lab, spawn, text, wait_with_deadline, ADDR_A};

const STEP: Duration = Duration::from_secs(120);

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_client_that_never_reads_its_tls_socket_is_disconnected() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["greedy".to_owned()]);
    let _buffers = small_tcp_buffers();
    let server = ServerProc::start(&pki, 4601, &["--write-timeout", "3"]);
    let (child, out) = hostile(&pki, &server, "greedy");
    out.wait_for("connected", 1, STEP, |l| l.contains("\"connected\""));
    let t0 = Instant::now();
    let is_gone = |l: &str| l.contains("client gone") && l.contains("greedy");
    let line = server.log.wait_for("client gone", 1, STEP, is_gone);
    println!(
        "non-reading client disconnected after {:?}: {line}",
        t0.elapsed()
    );
    assert!(
        line.contains("did not read its TLS socket"),
        "disconnected for another reason: {line}"
    );
    wait_with_deadline(child, STEP, "hostile-client");
    // Its own count: how many SENDs it made before the server's writes blocked for 3 s.
    println!(
        "hostile-client: {}",
        out.snapshot().last().map_or("", String::as_str)
    );
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn sigterm_wins_over_a_client_that_blocks_the_server_s_writes() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["greedy".to_owned()]);
    // Writes that would wait for ever, and no idle timeout to rescue us: only shutdown.
    let _buffers = small_tcp_buffers();
    let server = ServerProc::start(&pki, 4602, &["--write-timeout", "3600"]);
    let (mut child, out) = hostile(&pki, &server, "greedy");
    out.wait_for("connected", 1, STEP, |l| l.contains("\"connected\""));
    // The server is blocked in a write once the client's sends stop completing (the server's
    // task no longer reposts its receives).
    out.wait_for("stalled", 1, STEP, |l| l.contains("\"stalled\""));
    let t0 = Instant::now();
    server.signal(libc::SIGTERM);
    server
        .log
        .wait_for("server stopped", 1, Duration::from_secs(30), |l| {
            l.contains("server stopped")
        });
    let took = t0.elapsed();
    println!("SIGTERM with a blocked write: server stopped after {took:?}");
    assert!(took < Duration::from_secs(15), "shutdown took {took:?}");
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn one_identity_cannot_take_more_than_its_sessions() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["alice".to_owned(), "bob".to_owned()]);
    let server = ServerProc::start(
        &pki,
        4603,
        &["--max-clients", "10", "--max-sessions-per-identity", "2"],
    );
    let held: Vec<Held> = (0..2)
        .map(|_| Held::start(client(&pki, &server, Some("alice"))))
        .collect();
    for h in &held {
        h.wait_connected();
    }
    let third = wait_with_deadline(
        spawn(client(&pki, &server, Some("alice")).args(["-e", "quit"])),
        STEP,
        "third alice",
    );
    let err = text(&third.stderr);
    assert_eq!(third.status.code(), Some(3), "{err}");
    assert!(
        err.contains("identity alice already has 2 sessions"),
        "{err}"
    );
    let bob = wait_with_deadline(
        spawn(client(&pki, &server, Some("bob")).args(["-e", "send hi from bob", "-e", "quit"])),
        STEP,
        "bob",
    );
    assert!(bob.status.success(), "{}", text(&bob.stderr));
    assert!(text(&bob.stdout).contains("server acknowledged send #1"));
    // A freed session of alice's makes room for alice again.
    let mut held = held;
    let first = held.remove(0);
    assert!(first.quit().success());
    server
        .log
        .wait_for("client gone", 2, STEP, |l| l.contains("client gone"));
    let again = wait_with_deadline(
        spawn(client(&pki, &server, Some("alice")).args(["-e", "quit"])),
        STEP,
        "alice again",
    );
    assert!(again.status.success(), "{}", text(&again.stderr));
    for h in held {
        h.quit();
    }
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_killed_server_is_reported_and_the_client_reconnects_when_it_is_back() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["carol".to_owned()]);
    let port = 4604;
    let server = ServerProc::start(&pki, port, &[]);
    let mut c = client(&pki, &server, Some("carol"));
    c.args(["--reconnect-attempts", "30"]);
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn client");
    let out = Lines::collect(child.stdout.take().expect("stdout"));
    let err = Lines::collect(child.stderr.take().expect("stderr"));
    out.wait_for("connected", 1, STEP, |l| l.starts_with("connected to "));

    let t0 = Instant::now();
    server.signal(libc::SIGKILL);
    drop(server);
    // The idle client notices on its own, without a command.
    err.wait_for("session lost", 1, STEP, |l| l.contains("session lost"));
    let noticed = t0.elapsed();
    println!("client noticed the killed server after {noticed:?}");
    assert!(
        noticed < Duration::from_secs(10),
        "noticed after {noticed:?}"
    );

    let server = ServerProc::start(&pki, port, &[]);
    out.wait_for("reconnected", 1, STEP, |l| l.starts_with("reconnected to "));
    println!("reconnected {:?} after the kill", t0.elapsed());
    let stdin = child.stdin.as_mut().expect("stdin");
    stdin
        .write_all(b"send after the restart\nquit\n")
        .expect("write");
    let done = wait_with_deadline(child, STEP, "client");
    assert!(done.status.success(), "{:?}", err.snapshot());
    let sends = server.events("SEND received");
    assert_eq!(sends.len(), 1, "{sends:?}");
    assert_eq!(sends[0]["content"], "\"after the restart\"");
    let attempts = err
        .snapshot()
        .iter()
        .filter(|l| l.contains("connection attempt"))
        .count();
    println!("{attempts} failed reconnection attempts logged while the server was down");
}

/// Soak cycles: `SOAK_CYCLES`, in one process. 1,000 by default: under TCG a session costs
/// about 130 ms, so the 10,000 the issue asks for take 20 minutes or more; run them with
/// `SOAK_CYCLES=10000`. (2,000 until the VM suite grew past CI's 60-minute budget.)
fn soak_cycles() -> u64 {
    std::env::var("SOAK_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000)
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn soak_in_process_sessions_leave_nothing_behind_and_flat_rss() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["soak".to_owned()]);
    // Quiet logs: 20,000 connect/gone lines would only measure the log collector.
    let server = ServerProc::start_with_log(
        &pki,
        4605,
        &["--max-clients", "16"],
        "warn,secure_server=info",
    );
    let cycles = soak_cycles();
    let every = (cycles / 10).max(1);
    let mut child = Command::new(bin("soak-client"))
        .arg(ADDR_A)
        .args([
            "--port",
            &server.port.to_string(),
            "--name",
            "soak",
            "--certs",
        ])
        .arg(pki.dir())
        .args([
            "--cycles",
            &cycles.to_string(),
            "--every",
            &every.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn soak-client");
    let out = Lines::collect(child.stdout.take().expect("stdout"));
    // Server RSS at every tenth: the first ones warm the allocator up, the rest must be flat.
    let mut rss = Vec::new();
    for k in 1..=10 {
        out.wait_for("progress", k, Duration::from_secs(3600), |l| {
            l.contains("\"cycles\"")
        });
        rss.push(server.rss_kib());
    }
    let rss_warm = rss[2];
    let done = wait_with_deadline(child, Duration::from_secs(3600), "soak-client");
    assert!(
        done.status.success(),
        "soak failed: {}",
        out.snapshot().join("\n")
    );
    let rss_end = server.rss_kib();
    // stdout was read by the collector: the last line is the summary.
    let summary = out
        .snapshot()
        .last()
        .and_then(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .expect("summary line");
    assert_eq!(summary["cycles"].as_u64(), Some(cycles), "{summary}");
    let left = secure_rdma_tests::secure::wait_resources(server.pid(), 0, STEP);
    println!(
        "soak: {cycles} sessions in {:.0} s ({:.1} ms each); server RSS (KiB) at each tenth \
         {rss:?}, {rss_end} at the end; client RSS at the end {} KiB; left: {left:?}",
        summary["secs"].as_f64().unwrap_or(0.0),
        summary["per_cycle_ms"].as_f64().unwrap_or(0.0),
        summary["rss_kib"]
    );
    assert!(left.is_empty(), "{left:?}");
    // Flat from the third tenth on: a leak of 1 KiB per session would add 7 KiB per 10
    // sessions here, 7 MB over 10,000.
    let allowed = 2 * 1024 + cycles / 10;
    assert!(
        rss_end <= rss_warm + allowed,
        "server RSS grew from {rss_warm} KiB to {rss_end} KiB (allowed +{allowed} KiB): {rss:?}"
    );
}

/// A server with `--idle-timeout 2` on `port` (and its PKI), and the configuration and
/// runtime of a client `name` with `lanes` lanes.
fn idle_lab(
    port: u16,
    name: &str,
    lanes: usize,
) -> (Pki, ServerProc, ClientConfig, tokio::runtime::Runtime) {
    require_lab();
    let pki = Pki::new();
    pki.clients(&[name.to_owned()]);
    let server = ServerProc::start(&pki, port, &["--idle-timeout", "2"]);
    let cfg = secure_rdma_tests::LabClientArgs {
        host: ADDR_A.to_owned(),
        port: server.port,
        certs: pki.dir().to_owned(),
        name: name.to_owned(),
    }
    .config(STEP)
    .with_lanes(lanes);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    (pki, server, cfg, rt)
}

/// How long after `last` the server ended `client`'s session with an orderly goodbye.
async fn ended_after(client: &mut Client, last: Instant) -> Duration {
    let ended = tokio::time::timeout(STEP, client.closed())
        .await
        .expect("the server never ended the silent session");
    let quiet = last.elapsed();
    assert!(ended.is_ok(), "{ended:?}");
    quiet
}

/// A message on another lane keeps the session alive as one on lane 0 does, and the idle
/// timeout counts from it: each lane notes when its last message came. Until stop 38 the
/// server saw another lane's traffic only when its timer fired, and counted from then, so a
/// session whose last message came on lane 1 ended up to twice the timeout after it.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn the_idle_timeout_counts_from_the_last_message_on_any_lane() {
    let (_pki, server, cfg, rt) = idle_lab(4607, "laned", 2);
    rt.block_on(async {
        let mut client = Client::connect(&cfg).await.expect("connect");
        let started = Instant::now();
        // 4 messages 0.8 s apart, which the client spreads over its two lanes in turn: the
        // last one on lane 1. The old server would end the session 3.6 s after it.
        let mut last = started;
        let mut lanes = Vec::new();
        for i in 1..=4u64 {
            if i > 1 {
                tokio::time::sleep(Duration::from_millis(800)).await;
            }
            let before: Vec<u64> = client.lane_stats().iter().map(|l| l.posted).collect();
            last = Instant::now();
            client
                .send(format!("on some lane {i}").as_bytes())
                .await
                .unwrap_or_else(|e| panic!("message {i} after {:?}: {e}", started.elapsed()));
            let after: Vec<u64> = client.lane_stats().iter().map(|l| l.posted).collect();
            lanes.extend(
                (0..after.len()).filter(|&k| after[k] != before.get(k).copied().unwrap_or(0)),
            );
        }
        assert_eq!(lanes, [0, 1, 0, 1], "the lanes each message went on");
        let quiet = ended_after(&mut client, last).await;
        // Not before the timeout, and well before the 3.6 s the old server took (a round
        // trip and the coarse clock's tick are milliseconds).
        assert!(
            quiet >= Duration::from_secs(2) && quiet < Duration::from_millis(2_800),
            "ended {quiet:?} after the last message, on lane 1: the timeout is 2 s"
        );
        println!("idle on lanes: the session ended {quiet:?} after its last message (lane 1)");
    });
    server
        .log
        .wait_for("idle", 1, STEP, |l| l.contains("idle for 2s"));
}

/// The idle timeout counts from the last message, not from the session's start: a client that
/// keeps sending with gaps shorter than `--idle-timeout` stays, for longer than the timeout in
/// all, and one that falls silent is told goodbye once the timeout has passed since its last
/// message.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn the_idle_timeout_counts_from_the_last_message() {
    let (_pki, server, cfg, rt) = idle_lab(4606, "quiet", 1);
    rt.block_on(async {
        let mut client = Client::connect(&cfg).await.expect("connect");
        let started = Instant::now();
        // 4 messages 0.8 s apart: 2.4 s of traffic, more than the 2 s timeout.
        // `last` is taken before the last send, not after its acknowledgement: the server's
        // idle clock starts when the message arrives, up to one round trip before the ack is
        // back here, so only an instant from before the send bounds the timeout from below.
        let mut last = started;
        for i in 1..=4u64 {
            if i > 1 {
                tokio::time::sleep(Duration::from_millis(800)).await;
            }
            last = Instant::now();
            let ack = client
                .send(format!("still here {i}").as_bytes())
                .await
                .unwrap_or_else(|e| panic!("message {i} after {:?}: {e}", started.elapsed()));
            assert_eq!(ack.seq, i);
        }
        let quiet = ended_after(&mut client, last).await;
        assert!(
            quiet >= Duration::from_secs(2),
            "ended {quiet:?} after the last message: the timeout is 2 s"
        );
    });
    server
        .log
        .wait_for("idle", 1, STEP, |l| l.contains("idle for 2s"));
    assert_eq!(
        server
            .log
            .snapshot()
            .iter()
            .filter(|l| l.contains("client gone"))
            .count(),
        1,
        "one session, ended once"
    );
}
