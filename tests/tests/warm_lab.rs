//! Issue 22, the warm path on real Soft-RoCE: with `--warm-pool` on both ends, a burst of ten
//! times the pool's size in connections makes no QP, CQ or memory registration on any
//! connection's path. rdma-monitor's per-call events name the calling thread: every
//! `ibv_create_qp`, `ibv_create_cq` and `ibv_reg_mr` of either end comes from its `warm-refill`
//! thread, except the first connection's (which starts each end's pool), while the refill runs
//! beside the burst. The same burst without the pools is the control: every connection's
//! creations then come from the connection's own threads, so the count would catch a warm
//! path that still made resources.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use secure_rdma_tests::secure::{client, Pki, ServerProc};
use secure_rdma_tests::{rdma_monitor, require_lab, wait_until, wait_with_deadline};

/// Resources each end keeps ready.
const POOL: usize = 4;
/// Connections in the burst: ten times the pool.
const BURST: usize = 10 * POOL;
/// How long a lab step may take under TCG.
const STEP: Duration = Duration::from_secs(120);
/// The refill thread's name, as the kernel's `comm` of its calls.
const REFILL: &str = "warm-refill";
/// The verbs that make a session's resources.
const CREATES: [&str; 3] = ["QP_CREATE", "CQ_CREATE", "MR_REG"];

/// One `{"event": …}` line of `rdma-monitor --events --json`: (pid, comm, verb).
fn event(line: &str) -> Option<(u64, String, String)> {
    let v: Value = serde_json::from_str(line).ok()?;
    let e = v.get("event")?;
    Some((
        e["pid"].as_u64()?,
        e["comm"].as_str()?.to_owned(),
        e["verb"].as_str()?.to_owned(),
    ))
}

/// Calls of `pid` by (verb, whether the refill thread made them).
fn calls_of(lines: &[String], pid: u64) -> BTreeMap<(String, bool), usize> {
    let mut out = BTreeMap::new();
    for (p, comm, verb) in lines.iter().filter_map(|l| event(l)) {
        if p == pid {
            *out.entry((verb, comm == REFILL)).or_default() += 1;
        }
    }
    out
}

fn count(calls: &BTreeMap<(String, bool), usize>, verb: &str, refill: bool) -> usize {
    calls.get(&(verb.to_owned(), refill)).copied().unwrap_or(0)
}

/// `secure_rdma_rdma_setups_total{path}` from the server's metrics.
fn setups(metrics: &str, path: &str) -> Option<u64> {
    let mut s = TcpStream::connect(metrics).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: lab\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let key = format!("secure_rdma_rdma_setups_total{{path=\"{path}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(key.as_str()))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
}

/// What one burst showed.
struct Burst {
    /// The bench report.
    report: Value,
    /// Each end's calls by (verb, from the refill thread).
    server: BTreeMap<(String, bool), usize>,
    client: BTreeMap<(String, bool), usize>,
    /// The server's setups: (warm, cold).
    server_setups: (u64, u64),
}

/// A server (with `--warm-pool POOL` when `warm`) and `bench connect -n BURST` (with `--warm
/// --warm-pool POOL`), both watched by rdma-monitor's per-call events.
fn burst(port: u16, metrics_port: u16, warm: bool) -> Burst {
    require_lab();
    let monitor = rdma_monitor(&["--json", "--events", "--interval", "1"]);
    let (events, monitor_err) = (&monitor.out, &monitor.err);
    // Attached once the first report is out.
    events.wait_for("rdma-monitor's first report", 1, STEP, |l| {
        l.starts_with("{\"") && l.contains("\"live\"")
    });

    let pki = Pki::new();
    pki.clients(&["burst".to_owned()]);
    let metrics = format!("127.0.0.1:{metrics_port}");
    let pool = POOL.to_string();
    let mut flags = vec!["--metrics", metrics.as_str(), "--max-clients", "64"];
    if warm {
        flags.extend(["--warm-pool", pool.as_str()]);
    }
    let server = ServerProc::start(&pki, port, &flags);
    let mut cmd = client(&pki, &server, Some("burst"));
    if warm {
        cmd.args(["--warm-pool", &pool]);
    }
    cmd.args(["bench", "connect", "-n", &BURST.to_string(), "--json"]);
    if warm {
        cmd.arg("--warm");
    }
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn secure-client bench connect");
    let client_pid = u64::from(child.id());
    let out = wait_with_deadline(child, Duration::from_secs(600), "bench connect");
    assert!(
        out.status.success(),
        "bench connect failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "bench connect's report: {e}\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    let server_pid = u64::from(server.pid());
    let sessions = BURST + 1; // bench connect's first connection is not timed
                              // Every event of the burst has been read once the client's QPs are all destroyed (it
                              // exited) and the server has destroyed each session's QP.
    let context = || {
        format!(
            "server calls {:?}\nclient calls {:?}\nrdma-monitor stderr:\n{}",
            calls_of(&events.snapshot(), server_pid),
            calls_of(&events.snapshot(), client_pid),
            monitor_err.snapshot().join("\n")
        )
    };
    wait_until(
        "every QP of the burst destroyed, as rdma-monitor saw it",
        STEP,
        || {
            let lines = events.snapshot();
            let (c, s) = (calls_of(&lines, client_pid), calls_of(&lines, server_pid));
            let all = |calls: &BTreeMap<(String, bool), usize>, verb: &str| {
                count(calls, verb, true) + count(calls, verb, false)
            };
            all(&c, "QP_CREATE") >= sessions
                && all(&c, "QP_DESTROY") == all(&c, "QP_CREATE")
                && all(&s, "QP_DESTROY") >= sessions
        },
        context,
    );
    let lines = events.snapshot();
    let last_report = lines
        .iter()
        .rev()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v.get("live").is_some());
    if let Some(r) = last_report {
        assert_eq!(r["lost_events"], 0, "rdma-monitor lost events: {r}");
    }
    let server_setups = (
        setups(&metrics, "warm").expect("the server's metrics"),
        setups(&metrics, "cold").expect("the server's metrics"),
    );
    Burst {
        report,
        server: calls_of(&lines, server_pid),
        client: calls_of(&lines, client_pid),
        server_setups,
    }
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_burst_of_ten_times_the_pool_makes_no_resource_on_a_warm_connections_path() {
    let b = burst(4611, 9611, true);
    let warm = &b.report["warm"];
    eprintln!(
        "warm burst: {BURST} connections, pool {POOL}: {warm}; after TCP + TLS {} us; server \
         setups (warm, cold) {:?}\nserver calls {:?}\nclient calls {:?}",
        b.report["after_tls_us"], b.server_setups, b.server, b.client
    );
    let warm_connections = warm["warm_connections"].as_u64().unwrap_or(0) as usize;
    // The refill keeps up with a burst made one connection at a time: nearly every connection
    // finds its resources ready on the client, and so on the server.
    assert!(warm_connections * 10 >= BURST * 9, "{warm}");
    // And nearly every one sent its QP's endpoint with its hello, taken by the server: only a
    // warm QP goes early (one found ready after the hello left counts warm, not early).
    let early = b.report["early_setups"].as_u64().unwrap_or(0) as usize;
    assert!(early <= warm_connections, "{}", b.report);
    assert!(early * 10 >= BURST * 8, "{}", b.report);
    let (server_warm, server_cold) = b.server_setups;
    assert!(
        server_warm as usize * 10 >= BURST * 9,
        "{:?}",
        b.server_setups
    );
    assert_eq!((server_warm + server_cold) as usize, BURST + 1);
    // No creation on a warm path: each end's creations outside its refill thread are exactly
    // those of its cold setups (the first connection, and any that found the pool empty).
    let client_cold = BURST + 1 - warm_connections;
    for (end, calls, cold, mrs) in [
        ("client", &b.client, client_cold, 2),
        // Its send and receive slots: a session that only SENDs is given no write region
        // (the client asks for one before its first WRITE).
        ("server", &b.server, server_cold as usize, 2),
    ] {
        assert_eq!(count(calls, "QP_CREATE", false), cold, "{end}: {calls:?}");
        assert_eq!(
            count(calls, "CQ_CREATE", false),
            2 * cold,
            "{end}: {calls:?}"
        );
        assert_eq!(
            count(calls, "MR_REG", false),
            mrs * cold,
            "{end}: {calls:?}"
        );
        // The pool made the others, beside the burst.
        assert!(
            count(calls, "QP_CREATE", true) >= BURST + 1 - cold,
            "{end}: {calls:?}"
        );
    }
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn without_the_pools_every_connection_makes_its_resources_on_its_path() {
    let b = burst(4612, 9612, false);
    eprintln!(
        "cold burst: {BURST} connections; after TCP + TLS {} us; server setups (warm, cold) \
         {:?}\nserver calls {:?}\nclient calls {:?}",
        b.report["after_tls_us"], b.server_setups, b.server, b.client
    );
    assert!(b.report.get("warm").is_none());
    assert_eq!(b.report["early_setups"], 0, "no warm QP, no early endpoint");
    assert_eq!(b.server_setups, (0, (BURST + 1) as u64));
    for (end, calls) in [("client", &b.client), ("server", &b.server)] {
        assert_eq!(
            count(calls, "QP_CREATE", false),
            BURST + 1,
            "{end}: {calls:?}"
        );
        for verb in CREATES {
            assert_eq!(count(calls, verb, true), 0, "{end}: {calls:?}");
        }
    }
}

/// Sessions whose first QP was set up with the early endpoint (a warm QP's endpoint in the
/// hello, the server's in its accept, then only the tokens over RDMA) carry traffic: `bench
/// hold` opens them one at a time from a client with a warm pool, holds them, and sends one
/// 64-byte SEND on each at the end; the server's log has each exactly once. The same with
/// `--setup symmetric` is the control (no early endpoint, the same deliveries).
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn sessions_set_up_with_the_early_endpoint_deliver_every_message_once() {
    require_lab();
    const N: usize = 12;
    let pki = Pki::new();
    pki.clients(&["hold".to_owned()]);
    let pool = POOL.to_string();
    let server = ServerProc::start(&pki, 4613, &["--warm-pool", &pool, "--max-clients", "64"]);
    for (round, setup) in ["early", "symmetric"].into_iter().enumerate() {
        let mut cmd = client(&pki, &server, Some("hold"));
        cmd.args(["--warm-pool", &pool, "--setup", setup, "bench", "hold"])
            .args([
                "-n",
                &N.to_string(),
                "--concurrency",
                "1",
                "--hold",
                "1",
                "--json",
            ]);
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn secure-client bench hold");
        let out = wait_with_deadline(child, Duration::from_secs(600), setup);
        assert!(
            out.status.success(),
            "{setup}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let r: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{setup}: {e}: {}", String::from_utf8_lossy(&out.stdout)));
        eprintln!("{setup}: {r}");
        assert_eq!(r["established"], N, "{setup}: {r}");
        assert_eq!(r["delivered"], N, "{setup}: {r}");
        let early = r["early_setups"].as_u64().unwrap_or(0) as usize;
        match setup {
            // The first session tells the client what the server gives (and starts its pool);
            // a later one goes early whenever its pool had a QP ready before its hello.
            "early" => assert!(early * 2 >= N, "{setup}: {r}"),
            _ => assert_eq!(early, 0, "{setup}: {r}"),
        }
        // Every held session's one message, once, at the server.
        server.log.wait_for(
            "every held session's SEND in the server's log",
            (round + 1) * N,
            STEP,
            |l| l.contains("SEND received"),
        );
    }
    let got = server.delivered("SEND received");
    assert_eq!(got.len(), 2 * N, "{got:?}");
    let sixty_four = "h".repeat(64);
    for (client, seq, content) in &got {
        assert_eq!(
            (client.as_str(), *seq, content.as_str()),
            ("hold", 1, sixty_four.as_str())
        );
    }
}
