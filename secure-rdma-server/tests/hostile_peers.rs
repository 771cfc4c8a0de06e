//! Hostile peers against a real `secure-server`, on the host: everything here happens before
//! any RDMA resource exists, so no RDMA device is needed. A client that gets through is
//! answered "server cannot serve RDMA" on the host, which is exactly the proof that it was
//! served (TLS, identity, hello, admission) despite the attack.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use secure_rdma::client::{Client, ClientConfig, ClientError};

mod common;

struct Server {
    child: Child,
    port: u16,
    log_bytes: Arc<AtomicUsize>,
    lines: mpsc::Receiver<String>,
}

impl Server {
    /// Starts secure-server on 127.0.0.1 with `args`, its descriptor limit set to `nofile`.
    fn start(certs: &Path, nofile: u64, args: &[&str]) -> Server {
        // SECURE_SERVER_BIN runs another build (e.g. one without the fixes, to see these tests
        // fail against it).
        let bin = std::env::var("SECURE_SERVER_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_secure-server").to_owned());
        let mut cmd = Command::new(bin);
        // 127.0.0.1 unless the test listens elsewhere (a dual-stack [::]).
        if !args.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        cmd.args(["--log-format", "json", "--certs"])
            .arg(certs)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: nofile,
                    rlim_max: nofile,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("spawn secure-server");
        let stderr = child.stderr.take().expect("stderr");
        let log_bytes = Arc::new(AtomicUsize::new(0));
        let (tx, lines) = mpsc::channel();
        let counted = Arc::clone(&log_bytes);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                counted.fetch_add(line.len() + 1, Ordering::Relaxed);
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let port = loop {
            let line = lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("secure-server ready within 60 s");
            if let Some(port) = common::ready_port(&line) {
                break port;
            }
        };
        Server {
            child,
            port,
            log_bytes,
            lines,
        }
    }

    /// User + system CPU seconds the server has used so far.
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .expect("server /proc stat");
        // Fields after the command name (which may contain spaces) start after the last ')'.
        let rest = &stat[stat.rfind(')').expect("comm") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 =
            f[11].parse::<f64>().expect("utime") + f[12].parse::<f64>().expect("stime");
        // SAFETY: sysconf has no preconditions.
        ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
    }

    /// Log lines so far whose message contains `needle`.
    fn count(&self, needle: &str) -> usize {
        self.lines.try_iter().filter(|l| l.contains(needle)).count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    secure_rdma::certs::init(dir.path(), &["localhost".into(), "127.0.0.1".into()]).expect("certs");
    secure_rdma::certs::issue_client(dir.path(), "alice").expect("client cert");
    dir
}

/// Idle TCP connections from `source` (they never send a ClientHello).
async fn idle_connections(port: u16, source: &str, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(format!("{source}:0").parse().expect("addr"))
            .expect("bind source");
        match tokio::time::timeout(
            Duration::from_secs(5),
            socket.connect(format!("127.0.0.1:{port}").parse().expect("addr")),
        )
        .await
        {
            Ok(Ok(s)) => held.push(s),
            // The listen backlog is finite: a connect that does not complete is an attacker's
            // problem, not ours.
            _ => break,
        }
    }
    held
}

/// A legitimate client from 127.0.0.1; `Ok(elapsed)` when the server answered it.
async fn legit_client(certs: &Path, port: u16) -> Result<Duration, String> {
    let cfg = ClientConfig::new("127.0.0.1")
        .with_port(port)
        .with_ca(certs.join("ca.pem"))
        .with_identity(certs.join("alice.pem"), certs.join("alice.key"))
        .with_timeout(Duration::from_secs(20));
    let started = Instant::now();
    match Client::connect(&cfg).await {
        // The host has no RDMA device: being told so ("server cannot serve RDMA") means TLS,
        // identity, hello and admission all happened. Any answer of the server's is an answer.
        Err(ClientError::Rejected(_)) | Ok(_) => Ok(started.elapsed()),
        Err(e) => Err(e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_idle_connections_from_one_address_do_not_lock_others_out() {
    let certs = pki();
    // Far fewer descriptors than attacking connections.
    let server = Server::start(certs.path(), 64, &[]);
    let cpu_before = server.cpu_seconds();
    let t0 = Instant::now();
    let held = idle_connections(server.port, "127.0.0.2", 1000).await;
    // Some connects may not complete when the kernel's backlog is full: that is the attacker's
    // problem. What matters is what the server does with the ones that do.

    let served = legit_client(certs.path(), server.port).await;
    let elapsed = t0.elapsed();
    let cpu = server.cpu_seconds() - cpu_before;
    let log = server.log_bytes.load(Ordering::Relaxed);
    let closed_lines = server.count("connection closed at accept");
    println!(
        "{} idle connections from 127.0.0.2, fd limit 64: legit client answered after {:?}; \
         server CPU {cpu:.2} s in {elapsed:?}; log {log} bytes ({closed_lines} 'closed at accept' lines)",
        held.len(),
        served
    );
    let served = served.expect("the client from another address was served");
    assert!(
        served < Duration::from_secs(10),
        "served only after {served:?}"
    );
    assert!(log < 1 << 20, "server log grew to {log} bytes");
    // Bounded CPU: far below one core busy over the attack.
    assert!(
        cpu < elapsed.as_secs_f64() * 0.5 + 1.0,
        "server burnt {cpu:.2} s CPU in {elapsed:?}"
    );
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_exhaustion_backs_off_instead_of_spinning() {
    let certs = pki();
    // Limits raised so that the connections really exhaust the descriptor table (EMFILE).
    let server = Server::start(
        certs.path(),
        48,
        &[
            "--max-pending",
            "1000",
            "--max-pending-per-address",
            "1000",
            "--max-pending-per-prefix",
            "1000",
            "--handshake-timeout",
            "60",
        ],
    );
    let held = idle_connections(server.port, "127.0.0.3", 200).await;
    // Wait until the server reports the exhaustion, then watch it for 3 s.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut failures = 0;
    while failures == 0 && Instant::now() < deadline {
        if let Ok(line) = server.lines.recv_timeout(Duration::from_millis(200)) {
            if line.contains("accept failed") {
                failures += 1;
            }
        }
    }
    assert!(failures > 0, "the server never ran out of descriptors");
    let cpu_before = server.cpu_seconds();
    let bytes_before = server.log_bytes.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cpu = server.cpu_seconds() - cpu_before;
    let logged = server.log_bytes.load(Ordering::Relaxed) - bytes_before;
    let lines = server.count("accept failed");
    println!("EMFILE for 3 s: {lines} 'accept failed' lines, {logged} log bytes, {cpu:.2} s CPU");
    assert!(cpu < 0.5, "accept loop spun: {cpu:.2} s CPU in 3 s");
    assert!(logged < 16 << 10, "{logged} log bytes in 3 s");
    assert!(lines <= 20, "{lines} accept warnings in 3 s");

    // The attack ends: descriptors come back and a client is served again.
    drop(held);
    let served = legit_client(certs.path(), server.port).await;
    assert!(served.is_ok(), "not served after the attack: {served:?}");
}

/// `secure-server certs ...` in `dir`'s parent.
fn certs_cli(args: &[&str]) -> std::process::Output {
    let bin = std::env::var("SECURE_SERVER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_secure-server").to_owned());
    Command::new(bin)
        .arg("certs")
        .args(args)
        .output()
        .expect("run secure-server certs")
}

#[test]
fn a_missing_certificate_directory_is_refused_with_the_fix() {
    let root = tempfile::tempdir().expect("tempdir");
    let typo = root.path().join("cetrs");
    let out = Command::new(env!("CARGO_BIN_EXE_secure-server"))
        .args(["--listen", "127.0.0.1:0", "--certs"])
        .arg(&typo)
        .output()
        .expect("run secure-server");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no usable certificates"), "{err}");
    assert!(err.contains("secure-server certs init --dir"), "{err}");
    assert!(!typo.exists(), "the server created {}", typo.display());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certs_init_keeps_the_ca_key_apart_and_a_revoked_client_is_refused_at_tls() {
    use std::os::unix::fs::PermissionsExt;
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("certs");
    let d = dir.to_str().expect("utf-8");
    let init = certs_cli(&["init", "--dir", d, "--san", "127.0.0.1"]);
    assert!(
        init.status.success(),
        "{}",
        String::from_utf8_lossy(&init.stderr)
    );
    let ca_dir = root.path().join("certs-ca");
    assert!(
        !dir.join("ca.key").exists(),
        "the CA key is in the server's directory"
    );
    assert!(ca_dir.join("ca.key").exists());
    let mode = std::fs::metadata(&ca_dir)
        .expect("ca dir")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o700, "CA directory mode {mode:o}");
    for name in ["alice", "bob"] {
        let out = certs_cli(&["client", name, "--dir", d]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let server = Server::start(&dir, 1024, &[]);
    let connect = |name: &'static str| {
        let dir = dir.clone();
        let port = server.port;
        async move {
            let cfg = ClientConfig::new("127.0.0.1")
                .with_port(port)
                .with_ca(dir.join("ca.pem"))
                .with_identity(
                    dir.join(format!("{name}.pem")),
                    dir.join(format!("{name}.key")),
                )
                .with_timeout(Duration::from_secs(20));
            Client::connect(&cfg).await.map(|_| ())
        }
    };
    // Before: bob gets through TLS (and is told the host has no RDMA).
    assert!(matches!(
        connect("bob").await,
        Err(ClientError::Rejected(_))
    ));

    let out = certs_cli(&["revoke", "bob", "--dir", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("revoked bob"));
    // The running server refuses him from the next handshake on, at TLS: nothing after it
    // (admission, RDMA) ever happens for him.
    match connect("bob").await {
        Err(e @ ClientError::Tls(_)) => {
            // A TLS refusal: secure-client exits 4 on it (its errors module's tests).
            assert!(e.to_string().to_lowercase().contains("revoked"), "{e}");
        }
        other => panic!("revoked client got {other:?}"),
    }
    // Everyone else is unaffected.
    assert!(matches!(
        connect("alice").await,
        Err(ClientError::Rejected(_))
    ));
    let reloaded = server.count("TLS material reloaded");
    assert!(reloaded >= 1, "the server did not reload the CRL");
    // Revoking again keeps the list (no duplicate), revoking a stranger is a clear error.
    let again = certs_cli(&["revoke", "bob", "--dir", d]);
    assert!(String::from_utf8_lossy(&again.stdout).contains("lists 1 certificate"));
    let nobody = certs_cli(&["revoke", "mallory", "--dir", d]);
    assert!(!nobody.status.success());
    assert!(String::from_utf8_lossy(&nobody.stderr).contains("no client certificate of that name"));
}

/// TLS resumption must not outlive a revocation. A client that connects again resumes its
/// session with a ticket, and rustls does not ask the certificate verifier (with its CRL) about
/// a resumed session: it carries the certificate checked when the session was made. The attack:
/// keep the ticket from before the revocation and connect with it. The server builds a new TLS
/// configuration, with a new session cache, whenever the CRL changes, so the ticket names
/// nothing and the client must show its (revoked) certificate again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_resumed_from_before_a_revocation_is_refused() {
    use secure_rdma::client::Connector;
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("certs");
    let d = dir.to_str().expect("utf-8");
    for args in [
        &["init", "--dir", d, "--san", "127.0.0.1"][..],
        &["client", "alice", "--dir", d],
    ] {
        let out = certs_cli(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let server = Server::start(&dir, 1024, &[]);
    let connector = Connector::new(
        ClientConfig::new("127.0.0.1")
            .with_port(server.port)
            .with_ca(dir.join("ca.pem"))
            .with_identity(dir.join("alice.pem"), dir.join("alice.key"))
            .with_timeout(Duration::from_secs(20)),
    );
    // Lines of the server's log with `needle`, waiting up to 10 s for `n` of them.
    let seen = |needle: &str, n: usize| {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut found = 0;
        while found < n {
            let left = deadline.saturating_duration_since(Instant::now());
            match server.lines.recv_timeout(left) {
                Ok(l) => found += usize::from(l.contains(needle)),
                Err(_) => break,
            }
        }
        found
    };
    // Twice through TLS (the host has no RDMA: "rejected" is the proof of getting through);
    // the second time with the first one's ticket.
    for _ in 0..2 {
        let got = connector.connect_timed().await.map(|_| ());
        assert!(matches!(got, Err(ClientError::Rejected(_))), "{got:?}");
    }
    assert_eq!(
        seen(r#""tls":"resumed""#, 1),
        1,
        "the second connection did not resume"
    );

    let out = certs_cli(&["revoke", "alice", "--dir", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same connector, holding the ticket from before the revocation.
    match connector.connect_timed().await.map(|_| ()) {
        Err(e @ ClientError::Tls(_)) => {
            assert!(e.to_string().to_lowercase().contains("revoked"), "{e}");
        }
        other => panic!("a revoked client resumed its session: {other:?}"),
    }
}

/// A loop that writes `garbage` bytes of random data to the port, waits until the server has
/// closed the connection (so every connection reaches the TLS handshake, and the loop holds at
/// most one pending connection), and starts again until `until`; from `source`. Returns how
/// many connections it made.
async fn garbage_loop(
    source: std::net::IpAddr,
    target: std::net::SocketAddr,
    until: Instant,
) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut urandom = std::fs::File::open("/dev/urandom").expect("/dev/urandom");
    let mut made = 0;
    while Instant::now() < until {
        let mut junk = [0u8; 64];
        std::io::Read::read_exact(&mut urandom, &mut junk).expect("random bytes");
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(std::net::SocketAddr::new(source, 0))
            .expect("bind source");
        let Ok(Ok(mut s)) =
            tokio::time::timeout(Duration::from_secs(5), socket.connect(target)).await
        else {
            continue;
        };
        made += 1;
        let _ = s.write_all(&junk).await;
        let _ = s.shutdown().await;
        let mut sink = [0u8; 256];
        // The server answers garbage with an alert, or nothing, and closes.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            while matches!(s.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
    }
    made
}

/// Random bytes to the port from eight loops (eight addresses of 127.0.5.0/24): every
/// connection is a failed TLS handshake, each used to be a warning line; now a few per second
/// per prefix are logged, the rest are summarised every 10 s with their exact count, and a
/// client from another prefix is served during the flood.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_from_eight_loops_is_counted_exactly_but_logged_within_a_bound() {
    let certs = pki();
    let server = Server::start(certs.path(), 1024, &[]);
    let target: std::net::SocketAddr = format!("127.0.0.1:{}", server.port).parse().expect("addr");
    let secs = 4;
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs(secs);
    let loops: Vec<_> = (10..18u8)
        .map(|i| tokio::spawn(garbage_loop([127, 0, 5, i].into(), target, until)))
        .collect();
    // During the flood, a client from another prefix.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let served = legit_client(certs.path(), server.port).await;
    let mut made = 0;
    for l in loops {
        made += l.await.expect("loop");
    }
    let elapsed = t0.elapsed();
    // The summary comes at the server's next 10 s tick; collect lines until it has.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut logged, mut summarised, mut summaries) = (0u64, 0u64, Vec::new());
    while logged + summarised < made && Instant::now() < deadline {
        let Ok(line) = server.lines.recv_timeout(Duration::from_millis(500)) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        let message = v["fields"]["message"]
            .as_str()
            .or(v["message"].as_str())
            .unwrap_or("");
        if message.contains("TLS handshake failed") {
            logged += 1;
        } else if message.contains("suppressed in the last") {
            summarised += v["fields"]["suppressed"]
                .as_u64()
                .or(v["suppressed"].as_u64())
                .unwrap_or(0);
            summaries.push(message.to_owned());
        }
    }
    let log = server.log_bytes.load(Ordering::Relaxed);
    println!(
        "{made} garbage connections from 127.0.5.0/24 in {elapsed:?}: {logged} warning lines, \
         {summarised} suppressed and summarised ({summaries:?}); log {log} bytes; \
         client from 127.0.0.1: {served:?}"
    );
    served.expect("a client from another prefix was served during the flood");
    assert!(made > 50, "the flood made only {made} connections");
    // 5 at once, then 1 a second, from the one prefix.
    assert!(
        logged <= 5 + secs + 2,
        "{logged} warnings for {made} failures in {elapsed:?}"
    );
    // Every failure is accounted for: logged, or counted in a summary naming the prefix.
    assert_eq!(logged + summarised, made, "{summaries:?}");
    assert!(
        summaries
            .iter()
            .any(|s| s.contains("from 127.0.5.0/24 suppressed in the last")),
        "{summaries:?}"
    );
}

/// Idle connections that never send a ClientHello, from `sources` (`per` each), to 127.0.0.1;
/// returns how many the server kept open (the others it closed at accept).
async fn idle_from(
    port: u16,
    sources: &[std::net::IpAddr],
    per: usize,
) -> (Vec<tokio::net::TcpStream>, usize) {
    let mut held = Vec::new();
    for source in sources {
        let socket_addr = source.to_string();
        held.extend(idle_connections(port, &socket_addr, per).await);
    }
    // A connection closed at accept reads EOF at once; one the server keeps does not.
    let mut kept = 0;
    for s in &held {
        let mut b = [0u8; 1];
        if tokio::time::timeout(Duration::from_millis(300), s.peek(&mut b))
            .await
            .is_err()
        {
            kept += 1;
        }
    }
    (held, kept)
}

/// Eight addresses of one /24 with eight idle connections each: with the cap per address alone
/// they take all 64 pending slots and a client from another /24 is closed at accept; with the
/// cap per /24 (16 by default) they hold 16 and the client is served. On a dual-stack listener
/// the same connections arrive as IPv4-mapped IPv6 addresses (::ffff:127.0.6.10) and must still
/// count as their /24, not as one IPv6 /64 holding every IPv4 address (which would lock the
/// client out too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slash_24_cannot_take_every_pending_slot() {
    let certs = pki();
    let sources: Vec<std::net::IpAddr> = (10..18u8).map(|i| [127, 0, 6, i].into()).collect();
    // With the defence (on 127.0.0.1, then dual-stack), then with the cap per prefix raised out
    // of the way.
    for (cap, listen, expect_served) in [
        ("16", "127.0.0.1:0", true),
        ("16", "[::]:0", true),
        ("64", "127.0.0.1:0", false),
    ] {
        let server = Server::start(
            certs.path(),
            1024,
            &[
                "--listen",
                listen,
                "--max-pending-per-prefix",
                cap,
                "--handshake-timeout",
                "60",
            ],
        );
        let (held, kept) = idle_from(server.port, &sources, 8).await;
        let served = legit_client(certs.path(), server.port).await;
        println!(
            "--max-pending-per-prefix {cap} on {listen}: {} idle connections from 127.0.6.10-17, \
             {kept} kept pending; client from 127.0.0.1: {served:?}",
            held.len()
        );
        if expect_served {
            assert_eq!(kept, 16, "the /24 holds more than its 16 pending slots");
            served.expect("a client from another /24 is served");
        } else {
            assert_eq!(kept, 64);
            assert!(
                served.is_err(),
                "served although every pending slot was taken"
            );
        }
        drop(held);
    }
}
