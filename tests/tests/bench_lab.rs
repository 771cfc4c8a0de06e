//! `secure-client HOST bench …` against a real secure-server on Soft-RoCE: every subcommand
//! runs, exits 0 and prints one JSON object of the shape with sane values. No timing
//! assertions (TCG timings say nothing absolute); and `bench hold -n N` establishes all N
//! sessions on one secure-server and each delivers one message at the end, counted by the
//! server (N = BENCH_HOLD_SESSIONS, default 5,000: issue 22's figure for the suite); and the
//! precise clock reads of the data path, counted with `strace` on both ends.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::process::Command;
use std::time::Duration;

use secure_rdma_tests::secure::{bench_hold, client, sample, scrape, Pki, ServerProc};
use secure_rdma_tests::{require_lab, spawn, text, wait_with_deadline};
use serde_json::Value;

/// A bench of 5,000 sessions under TCG takes minutes.
const DEADLINE: Duration = Duration::from_secs(900);

/// Runs the bench and returns its JSON report; fails on a non-zero exit or other output.
fn bench(cmd: &mut Command, what: &str) -> Value {
    bench_output(wait_with_deadline(spawn(cmd), DEADLINE, what), what)
}

/// A bench's finished output as its JSON report: exit 0 and exactly one JSON line on stdout.
fn bench_output(out: std::process::Output, what: &str) -> Value {
    assert!(
        out.status.success(),
        "{what}: {:?}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: one JSON object: {stdout}");
    let v: Value =
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{what}: {e}: {stdout}"));
    eprintln!("{what}: {v}");
    v
}

/// p50 ≤ p99, all positive and finite.
fn sane_summary(v: &Value, what: &str) {
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{what}.{k} in {v}"));
    let (p50, p99, mean) = (f("p50"), f("p99"), f("mean"));
    assert!(p50 > 0.0 && p99 >= p50 && mean > 0.0, "{what}: {v}");
    assert!(
        p99 < 60e6,
        "{what}: a minute per operation is no measurement: {v}"
    );
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn bench_connect_send_write_print_sane_json() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["bench".to_owned()]);
    let server = ServerProc::start(&pki, 4701, &["--allow-unprotected"]);

    let v = bench(
        client(&pki, &server, Some("bench")).args([
            "bench",
            "connect",
            "-n",
            "10",
            "--concurrency",
            "2",
            "--json",
        ]),
        "bench connect",
    );
    assert_eq!(v["connections"], 10, "{v}");
    sane_summary(&v["per_connection_us"], "per_connection_us");
    for phase in ["tcp_tls", "admission", "rdma_setup", "confirmation"] {
        sane_summary(&v["phases_us"][phase], phase);
    }
    // The first connection (the device opened, a full TLS handshake) is reported apart; the
    // ten after it resume a TLS session (the server issues two tickets per handshake, enough
    // for two connections at once).
    assert!(
        v["first_connection_us"].as_f64().unwrap_or(0.0) > 0.0,
        "{v}"
    );
    assert_eq!(v["tls_resumed"], 10, "{v}");
    // Connections per second: the ten over the run's wall time (both rounded to 0.01).
    let total_s = v["total_ms"].as_f64().unwrap_or(0.0) / 1e3;
    let per_s = v["connections_per_s"].as_f64().unwrap_or(0.0);
    assert!(
        total_s > 0.0 && (per_s - 10.0 / total_s).abs() <= 0.01 * per_s.max(1.0),
        "{v}"
    );

    // The streaming data path (acknowledgements over RDMA, a window in flight) for both
    // operations, and the TLS-acknowledged path of the interactive client.
    for (op, poll, extra) in [
        ("send", "busy", vec!["--window", "8"]),
        ("send", "event", vec![]),
        ("write", "busy", vec![]),
        ("write", "event", vec!["--acks", "tls", "--window", "1"]),
    ] {
        for protected in [true, false] {
            let what = format!("bench {op} --poll {poll} {extra:?} protected={protected}");
            let mut cmd = client(&pki, &server, Some("bench"));
            if !protected {
                cmd.arg("--no-payload-protection");
            }
            cmd.args([
                "bench", op, "-s", "1024", "-n", "50", "--poll", poll, "--json",
            ])
            .args(&extra);
            let v = bench(&mut cmd, &what);
            assert_eq!(v["op"], op, "{what}: {v}");
            assert_eq!(v["size"], 1024, "{what}: {v}");
            assert_eq!(v["iters"], 50, "{what}: {v}");
            assert_eq!(v["poll"], poll, "{what}: {v}");
            let tls = extra.contains(&"tls");
            assert_eq!(v["acks"], if tls { "tls" } else { "rdma" }, "{what}: {v}");
            let window = match (tls, extra.contains(&"8")) {
                (true, _) => 1,
                (false, true) => 8,
                (false, false) => 16,
            };
            assert_eq!(v["window"], window, "{what}: {v}");
            assert_eq!(v["protection"] == "none", !protected, "{what}: {v}");
            sane_summary(&v["latency_us"], &what);
            // The cipher's own cost, timed in the same process with the session's cipher
            // (the lab's CPU has no AES-NI: ChaCha20-Poly1305); none when unprotected.
            if protected {
                assert_eq!(v["aead"]["cipher"], v["protection"], "{what}: {v}");
                sane_summary(&v["aead"]["seal_open_us"], &what);
                sane_summary(&v["aead"]["ack_seal_open_us"], &what);
            } else {
                assert!(v["aead"].is_null(), "{what}: {v}");
            }
            let bw = v["bandwidth_mb_s"].as_f64().unwrap_or(0.0);
            assert!(bw > 0.0 && bw.is_finite(), "{what}: {v}");
        }
    }

    // A size over the server's buffer is refused before anything is sent.
    let out = wait_with_deadline(
        spawn(client(&pki, &server, Some("bench")).args(["bench", "send", "-s", "1000000"])),
        DEADLINE,
        "bench send too large",
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("--buffer-size"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn bench_hold_establishes_every_session_it_asks_for() {
    require_lab();
    const METRICS: &str = "127.0.0.1:9702";
    let pki = Pki::new();
    pki.clients(&["hold".to_owned()]);
    // Each session holds a socket and completion channels on both sides.
    raise_fd_limit();
    // Issue 22's figure for the suite: 5,000 (about 40 s per 1,000 in the suite's debug builds
    // under TCG). BENCH_HOLD_SESSIONS overrides it.
    let n: u64 = std::env::var("BENCH_HOLD_SESSIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    let server = ServerProc::start_with_log(
        &pki,
        4702,
        &[
            "--max-clients",
            &n.to_string(),
            "--max-sessions-per-identity",
            &n.to_string(),
            "--max-pending-per-address",
            "16",
            "--max-pending",
            "64",
            // The first sessions wait, idle, until the last is open: never for the idle limit.
            "--idle-timeout",
            "3600",
            "--metrics",
            METRICS,
        ],
        // Quiet (10,000 connect/gone lines), but the readiness line is needed.
        "warn,secure_server=info",
    );
    let what = format!("bench hold -n {n}");
    let mut cmd = bench_hold(&pki, &server, n);
    // The server's memory while the sessions are held: its peak while the bench runs.
    let (rss_idle, peak, out) =
        server.rss_during(|| wait_with_deadline(spawn(&mut cmd), DEADLINE, &what));
    let v = bench_output(out, &what);
    eprintln!(
        "{what}: the client's report {v}; server RSS {rss_idle} KiB idle, {peak} KiB peak \
         ({:.1} KiB per held session)",
        peak.saturating_sub(rss_idle) as f64 / n as f64
    );
    assert_eq!(v["requested"], n, "{v}");
    assert_eq!(v["established"], n, "{v}");
    assert_eq!(v["failed"], 0, "{v}");
    // Every held session was in RTS and confirmed to the end: its message arrived, once.
    assert_eq!(v["delivered"], n, "{v}");
    assert_eq!(v["first_undelivered"], Value::Null, "{v}");
    let received = sample(
        &scrape(METRICS),
        "secure_rdma_messages_received_total{tenant=\"hold\",op=\"send\"}",
    );
    assert_eq!(
        received,
        Some(n as f64),
        "the server's count of held sessions' messages"
    );
    assert!(v["setup_ms"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
    assert!(v["rss_kib"].as_u64().unwrap_or(0) > 0, "{v}");
    // The breakdown covers the memory it breaks down (RSS moves a little between the reads).
    let kinds = v["per_session_kib_by_kind"]
        .as_object()
        .unwrap_or_else(|| panic!("per_session_kib_by_kind in {v}"));
    let sum: f64 = kinds.values().filter_map(Value::as_f64).sum();
    let whole = v["rss_per_session_kib"].as_f64().unwrap_or(0.0);
    assert!(
        (sum - whole).abs() <= 0.1 * whole,
        "the kinds add up to {sum:.1} KiB per session, the growth of RSS is {whole:.1}: {v}"
    );
    assert!(
        kinds
            .get("rdma_queues")
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
            > 0.0,
        "{v}"
    );
}

/// Soft limit up to the hard one, for this test and the server it starts.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// Restores the clock source it replaced when dropped.
struct ClockSource(String);

const CLOCK_SOURCE: &str = "/sys/devices/system/clocksource/clocksource0/current_clocksource";

impl ClockSource {
    /// Makes `name` the kernel's clock source (the VM is the test's own; root writes sysfs).
    fn set(name: &str) -> ClockSource {
        let was = std::fs::read_to_string(CLOCK_SOURCE).expect("read the clock source");
        std::fs::write(CLOCK_SOURCE, name)
            .unwrap_or_else(|e| panic!("cannot make {name} the clock source: {e}"));
        let now = std::fs::read_to_string(CLOCK_SOURCE).expect("read the clock source");
        assert_eq!(now.trim(), name, "the kernel kept {now:?}");
        ClockSource(was.trim().to_owned())
    }
}

impl Drop for ClockSource {
    fn drop(&mut self) {
        // A TSC the watchdog marked unstable meanwhile cannot come back: then HPET stays.
        let _ = std::fs::write(CLOCK_SOURCE, &self.0);
    }
}

/// Kills a process when dropped (a traced server that a failed assertion leaves behind).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a pid this test started; at worst it is already gone (ESRCH).
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// Calls of `clock_gettime` that reached the kernel, in a file `strace -e trace=clock_gettime`
/// wrote (with the HPET as clock source, every precise read does; the coarse clock's never).
fn clock_syscalls(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("clock_gettime("))
        .count()
}

/// `strace -f -qq -e trace=clock_gettime -o OUT` before `program`.
fn counting_clock_reads(out: &std::path::Path) -> Command {
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-qq", "-e", "trace=clock_gettime", "-o"])
        .arg(out);
    cmd
}

/// The data path reads the precise clock only where tokio's runtime and the benchmark's own
/// timing do. In the lab VM the kernel often marks the
/// emulated TSC unstable and falls back to the HPET; every precise `clock_gettime` is then a
/// system call and an emulated device read, which `ib_send_lat` (it reads the TSC itself)
/// never pays. Here the HPET is the clock source on purpose, and `strace` counts the reads
/// that reach the kernel on both ends of `bench send` (protected, event-driven: the server's
/// default): two runs of 100 and 900 messages, so the connection's own reads cancel out.
/// Before this was built, each message cost 9.5 on the client and 13.9 on the server (a
/// timeout per wait, an idle timer per message, the key's age before each seal, the post's
/// timing, the log limiter); now 5.7 and 7.4-8.2. What is left is not ours to save: the
/// benchmark's own two (its clock around each round trip), one for the acknowledgement's
/// timeout, and tokio's time driver, which reads the clock when its thread parks and wakes
/// (once or twice per wake-up, a wake-up or two per message when event-driven).
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn the_data_path_reads_the_precise_clock_only_where_the_runtime_does() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&["bench".to_owned()]);
    let _hpet = ClockSource::set("hpet");
    let dir = tempfile::tempdir().expect("tempdir");
    let server_trace = dir.path().join("server.strace");
    let mut cmd = counting_clock_reads(&server_trace);
    cmd.arg(secure_rdma_tests::secure::bin("secure-server"))
        .args(["--listen", "10.77.0.1:4704", "--log-format", "json"])
        .arg("--certs")
        .arg(pki.dir())
        .env("RUST_LOG", "info");
    let server = ServerProc::spawn(cmd, 4704);
    // The child is strace; the server is its child, which outlives a killed strace.
    let traced = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", server.pid()))
        .ok()
        .and_then(|c| c.split_whitespace().next()?.parse::<i32>().ok())
        .expect("the traced secure-server's pid");
    let _traced = KillOnDrop(traced);
    let mut runs = Vec::new();
    for (n, messages) in [(50, 100), (450, 900)] {
        let before = clock_syscalls(&server_trace);
        let trace = dir.path().join(format!("client-{n}.strace"));
        let mut cmd = counting_clock_reads(&trace);
        let secure_client = client(&pki, &server, Some("bench"));
        cmd.arg(secure_client.get_program())
            .args(secure_client.get_args())
            .args(["bench", "send", "-s", "64", "-n", &n.to_string(), "--json"])
            // A log line is a clock read too: only warnings.
            .env("RUST_LOG", "warn");
        let what = format!("bench send -n {n} under strace");
        let v = bench(&mut cmd, &what);
        assert_eq!(v["iters"], n, "{what}: {v}");
        // The server's reads of this run: its trace is written as the calls happen.
        let on_server = clock_syscalls(&server_trace) - before;
        runs.push((messages, clock_syscalls(&trace), on_server));
    }
    let [(m1, c1, s1), (m2, c2, s2)] = runs[..] else {
        unreachable!("two runs")
    };
    let per_message = |a: usize, b: usize| (b as f64 - a as f64) / (m2 - m1) as f64;
    let (client, server_side) = (per_message(c1, c2), per_message(s1, s2));
    println!(
        "precise clock reads per message under HPET: client {client:.2} ({c1} for {m1}, {c2} for {m2}), \
         server {server_side:.2} ({s1} for {m1}, {s2} for {m2})"
    );
    assert!(
        client < 7.5,
        "the client reads the clock {client:.2} times per message"
    );
    assert!(
        server_side < 10.5,
        "the server reads the clock {server_side:.2} times per message"
    );
}
