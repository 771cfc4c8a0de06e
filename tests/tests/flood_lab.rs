//! What an unauthenticated peer can cost secure-server, on real Soft-RoCE (issue 21, test 6).
//! The server on 10.77.0.1 (`rxe-a`); the attackers are eight extra addresses of
//! 10.77.0.0/24 on `veth-b` (10.77.0.10-17), which never get past TLS.
//!
//! 1. Random bytes to the port from eight loops for 40 s (`SECURE_RDMA_FLOOD_SECS`): a
//!    legitimate client is served during the flood, every failure is counted in
//!    `secure_rdma_pre_auth_failures_total`, and the server's log stays under 2 MB (each
//!    failed handshake used to be a warning line).
//! 2. Eight idle connections from each of the eight addresses: the /24 holds 16 pending slots,
//!    not all 64, and a client from another /24 (10.78.0.2 on `veth-b`, to 10.78.0.1 on
//!    `veth-a`) is served; with the cap per prefix raised out of the way the same client is
//!    closed at accept.
//!
//! `SECURE_RDMA_FLOOD_SERVER_BIN` runs another secure-server build (e.g. one without these
//! bounds) to see the tests fail against it.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use secure_rdma_tests::secure::{bin, client_command, Lines};
use secure_rdma_tests::{require_lab, spawn, text, wait_with_deadline, ADDR_A};

const STEP: Duration = Duration::from_secs(120);
/// The attackers: eight addresses of the server's own /24, on the client end of the veth pair.
const ATTACKERS: std::ops::Range<u8> = 10..18;

/// Addresses and routes added for these tests, removed when dropped (the VM runs other tests
/// afterwards). 10.78.0.1 (veth-a) and 10.78.0.2 (veth-b) get the same policy routing as the
/// lab's two addresses, so their traffic, RoCE included, crosses the veth pair.
struct LabNet {
    undo: Vec<Vec<String>>,
}

impl LabNet {
    fn up() -> LabNet {
        let mut net = LabNet { undo: Vec::new() };
        for i in ATTACKERS {
            net.run(
                &format!("addr add 10.77.0.{i}/32 dev veth-b"),
                &format!("addr del 10.77.0.{i}/32 dev veth-b"),
            );
        }
        net.run(
            "addr add 10.78.0.1/32 dev veth-a",
            "addr del 10.78.0.1/32 dev veth-a",
        );
        net.run(
            "addr add 10.78.0.2/32 dev veth-b",
            "addr del 10.78.0.2/32 dev veth-b",
        );
        net.run(
            "route add 10.78.0.1 dev veth-b src 10.78.0.2 table 178",
            "route del 10.78.0.1 table 178",
        );
        net.run(
            "route add 10.78.0.2 dev veth-a src 10.78.0.1 table 179",
            "route del 10.78.0.2 table 179",
        );
        net.run(
            "rule add pref 12 iif lo to 10.78.0.1 lookup 178",
            "rule del pref 12",
        );
        net.run(
            "rule add pref 13 iif lo to 10.78.0.2 lookup 179",
            "rule del pref 13",
        );
        net
    }

    fn run(&mut self, args: &str, undo: &str) {
        let out = Command::new("ip")
            .args(args.split_whitespace())
            .output()
            .expect("run ip");
        assert!(out.status.success(), "ip {args}: {}", text(&out.stderr));
        self.undo
            .push(undo.split_whitespace().map(str::to_owned).collect());
    }
}

impl Drop for LabNet {
    fn drop(&mut self) {
        for args in self.undo.iter().rev() {
            let _ = Command::new("ip").args(args).output();
        }
    }
}

/// A CA, a server certificate for both server addresses, and client certificates.
fn pki(clients: &[&str]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    secure_rdma::certs::init(
        dir.path(),
        &[
            ADDR_A.to_owned(),
            "10.78.0.1".to_owned(),
            "localhost".to_owned(),
        ],
    )
    .expect("certs init");
    for c in clients {
        secure_rdma::certs::issue_client(dir.path(), c).expect("client certificate");
    }
    dir
}

/// A running secure-server (this build's, or `SECURE_RDMA_FLOOD_SERVER_BIN`), its JSON log
/// collected.
struct Server {
    child: Child,
    log: Lines,
    port: u16,
}

impl Server {
    fn start(certs: &Path, listen: &str, port: u16, extra: &[&str]) -> Server {
        let exe = std::env::var("SECURE_RDMA_FLOOD_SERVER_BIN")
            .map(Into::into)
            .unwrap_or_else(|_| bin("secure-server"));
        let mut child = Command::new(&exe)
            .args([
                "--listen",
                &format!("{listen}:{port}"),
                "--log-format",
                "json",
                "--certs",
            ])
            .arg(certs)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
        let log = Lines::collect(child.stderr.take().expect("stderr"));
        log.wait_for("secure-server ready", 1, STEP, |l| {
            l.contains("secure-server ready")
        });
        Server { child, log, port }
    }

    /// Bytes the server has logged so far.
    fn log_bytes(&self) -> usize {
        self.log.snapshot().iter().map(|l| l.len() + 1).sum()
    }

    /// Log events whose message contains `needle`.
    fn events(&self, needle: &str) -> Vec<serde_json::Value> {
        self.log
            .events()
            .into_iter()
            .filter(|e| e["message"].as_str().is_some_and(|m| m.contains(needle)))
            .collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /metrics` from the server's exporter.
fn scrape(addr: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// The sum of every series of `name` in an exposition.
fn metric_sum(exposition: &str, name: &str) -> u64 {
    exposition
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Writes 64 random bytes, closes its side, waits until the server has closed the connection
/// (so the loop holds at most one pending connection and every connection reaches the TLS
/// handshake), again until `until`. Only ever to the lab server.
async fn garbage_loop(source: IpAddr, target: SocketAddr, until: Instant) -> Flood {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Bounded to the lab: this loop never writes anywhere but the server under test.
    assert_eq!(target.ip().to_string(), ADDR_A, "flood only the lab server");
    let mut urandom = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
    let mut made = Flood::default();
    while Instant::now() < until {
        let mut junk = [0u8; 64];
        urandom.read_exact(&mut junk).expect("random bytes");
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(source, 0))
            .expect("bind an attacker address");
        let t = Instant::now();
        let Ok(Ok(mut s)) =
            tokio::time::timeout(Duration::from_secs(5), socket.connect(target)).await
        else {
            made.failed_connects += 1;
            continue;
        };
        made.connecting += t.elapsed();
        made.connections += 1;
        let t = Instant::now();
        let _ = s.write_all(&junk).await;
        let _ = s.shutdown().await;
        let mut sink = [0u8; 256];
        let _ = tokio::time::timeout(Duration::from_secs(10), async {
            while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
        made.closing += t.elapsed();
    }
    made
}

/// What the flood loops did.
#[derive(Debug, Default)]
struct Flood {
    connections: u64,
    failed_connects: u64,
    /// Time spent in connect().
    connecting: Duration,
    /// Time from the first byte written to the server's close.
    closing: Duration,
}

/// Reads `value` until it reaches `want` or `deadline` passes; returns the last reading (the
/// caller asserts on it, with its context).
fn poll(deadline: Duration, want: u64, mut value: impl FnMut() -> u64) -> u64 {
    let start = Instant::now();
    loop {
        let v = value();
        if v >= want || start.elapsed() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn flood_secs() -> u64 {
    std::env::var("SECURE_RDMA_FLOOD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn random_bytes_from_eight_loops_are_counted_but_the_log_stays_bounded() {
    require_lab();
    let _net = LabNet::up();
    let certs = pki(&["alice"]);
    let metrics = "127.0.0.1:9481";
    let server = Server::start(certs.path(), ADDR_A, 4881, &["--metrics", metrics]);
    let target: SocketAddr = format!("{ADDR_A}:{}", server.port).parse().expect("addr");
    let secs = flood_secs();
    let rt = runtime();
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(secs);
    let loops: Vec<_> = ATTACKERS
        .map(|i| rt.spawn(garbage_loop([10, 77, 0, i].into(), target, until)))
        .collect();
    // A legitimate client a quarter into the flood: connected, its message delivered.
    std::thread::sleep(Duration::from_secs(secs / 4));
    let started = Instant::now();
    let out = wait_with_deadline(
        spawn(
            client_command(certs.path(), server.port, Some("alice"), 60).args([
                "-e",
                "send during the flood",
                "-e",
                "quit",
            ]),
        ),
        STEP,
        "client during the flood",
    );
    let client_took = started.elapsed();
    let flood: Flood = rt.block_on(async {
        let mut all = Flood::default();
        for l in loops {
            let f = l.await.expect("flood loop");
            all.connections += f.connections;
            all.failed_connects += f.failed_connects;
            all.connecting += f.connecting;
            all.closing += f.closing;
        }
        all
    });
    let made = flood.connections;
    println!(
        "flood: {made} connections, {} connects timed out; per connection {:?} connecting, \
         {:?} until the server closed",
        flood.failed_connects,
        flood.connecting / made.max(1) as u32,
        flood.closing / made.max(1) as u32
    );
    let flood_took = t0.elapsed();
    let log_after_flood = server.log_bytes();
    // Every connection of the flood is counted (exactly), whether or not it was logged.
    let counted = poll(Duration::from_secs(30), made, || {
        metric_sum(&scrape(metrics), "secure_rdma_pre_auth_failures_total")
    });
    // The summary of what was held back comes every 10 s: wait until logged + summarised
    // accounts for every failure.
    let logged = |s: &Server| {
        [
            "TLS handshake failed",
            "closed at accept",
            "TLS handshake timed out",
            "lost before TLS",
        ]
        .iter()
        .map(|n| s.events(n).len() as u64)
        .sum::<u64>()
    };
    let summarised = |s: &Server| {
        s.events("suppressed in the last")
            .iter()
            .filter_map(|e| e["suppressed"].as_u64())
            .sum::<u64>()
    };
    let accounted = poll(Duration::from_secs(30), made, || {
        logged(&server) + summarised(&server)
    });
    for kind in [
        "TLS handshake failed",
        "closed at accept",
        "TLS handshake timed out",
        "lost before TLS",
    ] {
        println!("  {kind}: {} lines", server.events(kind).len());
    }
    if let Some(first) = server.events("TLS handshake failed").first() {
        println!("  e.g. {first}");
    }
    let summaries: Vec<String> = server
        .events("suppressed in the last")
        .iter()
        .map(|e| e["message"].as_str().unwrap_or("").to_owned())
        .collect();
    println!(
        "{made} garbage connections from 8 loops (10.77.0.10-17) in {flood_took:?}: server log \
         {log_after_flood} bytes ({} warning lines, {} summarised in {} summaries: {:?}); \
         counted {counted}; client served in {client_took:?}",
        logged(&server),
        summarised(&server),
        summaries.len(),
        summaries.first()
    );
    assert!(
        out.status.success(),
        "the client was not served during the flood: {}",
        text(&out.stderr)
    );
    // The flood must dwarf what may be logged of it (under TCG, on shared cores, about 30
    // connections a second get through the handshake's failure: the server's CPU is the limit).
    assert!(made >= 5 * secs, "the flood made only {made} connections");
    // One prefix: 5 lines at once, then 1 a second (and a summary's tick of slack).
    let tls_lines = server.events("TLS handshake failed").len() as u64;
    assert!(
        tls_lines <= 5 + secs + 5,
        "{tls_lines} warning lines for {made} failed handshakes in {secs} s"
    );
    assert!(
        log_after_flood < 2 << 20,
        "the server wrote {log_after_flood} bytes of log during a {secs} s flood"
    );
    assert_eq!(counted, made, "pre-auth failures counted");
    assert_eq!(accounted, made, "logged + summarised: {summaries:?}");
    assert!(
        summaries
            .iter()
            .any(|s| s.contains("from 10.77.0.0/24 suppressed in the last")),
        "{summaries:?}"
    );
    // The client's one message arrived, once.
    let sends: Vec<_> = server
        .log
        .events()
        .into_iter()
        .filter(|e| e["message"] == "SEND received")
        .collect();
    assert_eq!(sends.len(), 1, "{sends:?}");
    assert_eq!(sends[0]["content"], "\"during the flood\"");
}

/// Opens `per` connections from each of `sources` to `target` that never send a byte; returns
/// them and how many the server kept (one it closed at accept reads EOF at once).
async fn idle_from(
    target: SocketAddr,
    sources: &[IpAddr],
    per: usize,
) -> (Vec<tokio::net::TcpStream>, usize) {
    let mut held = Vec::new();
    for source in sources {
        for _ in 0..per {
            let socket = tokio::net::TcpSocket::new_v4().expect("socket");
            socket
                .bind(SocketAddr::new(*source, 0))
                .expect("bind an attacker address");
            if let Ok(Ok(s)) =
                tokio::time::timeout(Duration::from_secs(10), socket.connect(target)).await
            {
                held.push(s);
            }
        }
    }
    // Give the server time to close what it refuses: it does so at accept, right away.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut kept = 0;
    for s in &held {
        let mut b = [0u8; 1];
        if tokio::time::timeout(Duration::from_millis(200), s.peek(&mut b))
            .await
            .is_err()
        {
            kept += 1;
        }
    }
    (held, kept)
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn one_slash_24_of_idle_connections_leaves_room_for_another_prefix() {
    require_lab();
    let _net = LabNet::up();
    let certs = pki(&["bob"]);
    let sources: Vec<IpAddr> = ATTACKERS.map(|i| IpAddr::from([10, 77, 0, i])).collect();
    let rt = runtime();
    // With the cap per prefix (16 by default), then with it raised out of the way: the same
    // attack with only the per-address cap (8) and the total (64) left.
    for (port, extra, defended) in [
        (4882u16, &[][..], true),
        (4883, &["--max-pending-per-prefix", "64"][..], false),
    ] {
        let mut args = vec!["--handshake-timeout", "120"];
        args.extend_from_slice(extra);
        let server = Server::start(certs.path(), "0.0.0.0", port, &args);
        let target: SocketAddr = format!("{ADDR_A}:{port}").parse().expect("addr");
        let (held, kept) = rt.block_on(idle_from(target, &sources, 8));
        // The client from another /24: 10.78.0.2 to 10.78.0.1, RDMA included.
        let started = Instant::now();
        let out = wait_with_deadline(
            spawn(
                Command::new(bin("secure-client"))
                    .arg("10.78.0.1")
                    .args(["--port", &port.to_string(), "--certs"])
                    .arg(certs.path())
                    .args(["--name", "bob", "--timeout", "60"])
                    .args(["-e", "send from another prefix", "-e", "quit"]),
            ),
            STEP,
            "client from 10.78.0.2",
        );
        let took = started.elapsed();
        let sends = server.events("SEND received");
        println!(
            "{}: {} idle connections from 10.77.0.10-17, {kept} kept pending; client from \
             10.78.0.2: exit {:?} after {took:?}, {} message(s) delivered; {}",
            if defended {
                "per-prefix cap 16"
            } else {
                "per-prefix cap out of the way (64)"
            },
            held.len(),
            out.status.code(),
            sends.len(),
            text(&out.stderr).lines().last().unwrap_or("")
        );
        assert_eq!(held.len(), 64, "attacker connections made");
        if defended {
            assert_eq!(kept, 16, "the /24 holds more than its 16 pending slots");
            assert!(
                out.status.success(),
                "the client from another /24 was not served: {}",
                text(&out.stderr)
            );
            assert_eq!(sends.len(), 1, "{sends:?}");
            assert_eq!(sends[0]["content"], "\"from another prefix\"");
            // The connection's span names the peer it came from.
            let peer = sends[0]["span"]["peer"]
                .as_str()
                .or(sends[0]["peer"].as_str())
                .unwrap_or("");
            assert!(peer.starts_with("10.78.0.2:"), "{sends:?}");
        } else {
            assert_eq!(kept, 64);
            assert!(
                !out.status.success(),
                "served with every pending slot taken"
            );
            assert!(sends.is_empty());
        }
        drop(held);
    }
}
