//! A real Prometheus (Debian's `/usr/bin/prometheus`) scrapes secure-server's
//! and rdma-monitor's `--metrics` while clients connect, send, write and are
//! refused; its HTTP API must then return the series the exporters promise,
//! with the values of what the test did. It also loads the shipped alert
//! rules (docs/monitoring/alerts.yml), which must all evaluate without error.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use secure_rdma_tests::secure::{bin, client, Held, Lines, Pki, ServerProc};
use secure_rdma_tests::{require_lab, text, wait_with_deadline};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(90);
const SERVER_METRICS: &str = "127.0.0.1:19435";
const MONITOR_METRICS: &str = "127.0.0.1:19464";
const PROMETHEUS: &str = "127.0.0.1:19090";

/// A child killed when the test ends, pass or fail.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET path` on `addr` over HTTP/1.0: the status code and the body.
fn http_get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_owned()))
}

/// Percent-encodes a query parameter (everything but the unreserved characters).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The result vector of an instant query, or why there is none yet.
fn query(expr: &str) -> Result<Vec<Value>, String> {
    let (status, body) = http_get(PROMETHEUS, &format!("/api/v1/query?query={}", encode(expr)))
        .map_err(|e| format!("Prometheus unreachable: {e}"))?;
    let v: Value = serde_json::from_str(&body).map_err(|e| format!("{status}: {e}: {body}"))?;
    if v["status"] != "success" {
        return Err(format!("{status}: {body}"));
    }
    Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
}

/// The value of a one-series result.
fn value(series: &[Value]) -> Option<f64> {
    match series {
        [one] => one["value"][1].as_str()?.parse().ok(),
        _ => None,
    }
}

/// Polls `expr` until `ok` holds for its single value; fails with the last answer after
/// [`DEADLINE`]. Scrapes are 1 s apart, so a value appears within seconds of being counted.
fn wait_value(expr: &str, ok: impl Fn(f64) -> bool) -> f64 {
    let start = Instant::now();
    loop {
        let answer = query(expr);
        if let Some(v) = answer.as_ref().ok().and_then(|r| value(r)) {
            if ok(v) {
                return v;
            }
        }
        assert!(
            start.elapsed() < DEADLINE,
            "{expr}: still {answer:?} after {DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Starts Prometheus on [`PROMETHEUS`], scraping both exporters every second and loading
/// the shipped alert rules, and waits until it is ready.
fn start_prometheus(dir: &Path) -> Killed {
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring/alerts.yml");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n\
             \x20 - job_name: secure-server\n    static_configs:\n      - targets: [\"{SERVER_METRICS}\"]\n\
             \x20 - job_name: rdma-monitor\n    static_configs:\n      - targets: [\"{MONITOR_METRICS}\"]\n",
            rules = rules.display()
        ),
    )
    .expect("write the Prometheus config");
    let child = Command::new("/usr/bin/prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={PROMETHEUS}"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start /usr/bin/prometheus (Debian package `prometheus`)");
    let prometheus = Killed(child);
    let start = Instant::now();
    while !http_get(PROMETHEUS, "/-/ready").is_ok_and(|(s, _)| s == 200) {
        assert!(
            start.elapsed() < DEADLINE,
            "Prometheus not ready after {DEADLINE:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    prometheus
}

/// Starts `rdma-monitor --metrics` and waits until it serves.
fn start_monitor() -> (Killed, Lines) {
    let mut child = Command::new(bin("rdma-monitor"))
        .args(["--interval", "1", "--metrics", MONITOR_METRICS])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rdma-monitor");
    let stderr = Lines::collect(child.stderr.take().expect("stderr"));
    stderr.wait_for("rdma-monitor metrics", 1, DEADLINE, |l| {
        l.contains("metrics at http://")
    });
    (Killed(child), stderr)
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn prometheus_scrapes_both_exporters_and_sees_what_the_clients_did() {
    require_lab();
    let dir = tempfile::tempdir().expect("temp dir");
    let pki = Pki::new();
    pki.clients(&["alice".to_owned(), "bob".to_owned()]);
    let (_monitor, _monitor_log) = start_monitor();
    let server = ServerProc::start(
        &pki,
        4570,
        &[
            "--metrics",
            SERVER_METRICS,
            "--telemetry-interval",
            "1",
            "--max-sessions-per-identity",
            "1",
        ],
    );
    let _prometheus = start_prometheus(dir.path());
    for job in ["secure-server", "rdma-monitor"] {
        wait_value(&format!("up{{job=\"{job}\"}}"), |v| v == 1.0);
    }

    // bob holds a session; a second bob is refused (one session per identity).
    let bob = Held::start(client(&pki, &server, Some("bob")));
    bob.wait_connected();
    let second = wait_with_deadline(
        client(&pki, &server, Some("bob"))
            .args(["-e", "quit"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn the second bob"),
        DEADLINE,
        "second bob",
    );
    assert!(
        !second.status.success(),
        "a second session of bob was served"
    );
    wait_value("sum(secure_rdma_sessions_active)", |v| v == 1.0);
    wait_value("secure_rdma_sessions_active{device=\"rxe-a\"}", |v| {
        v == 1.0
    });

    // alice sends and writes, then leaves.
    let sent = "hello prometheus";
    let written = "bytes for the metrics";
    let alice = wait_with_deadline(
        client(&pki, &server, Some("alice"))
            .args([
                "-e",
                &format!("send {sent}"),
                "-e",
                &format!("write {written}"),
                "-e",
                "quit",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn alice"),
        DEADLINE,
        "alice",
    );
    assert!(alice.status.success(), "alice: {}", text(&alice.stderr));
    assert!(bob.quit().success());
    server
        .log
        .wait_for("client gone", 2, DEADLINE, |l| l.contains("client gone"));

    wait_value("sum(secure_rdma_sessions_active)", |v| v == 0.0);
    let established = wait_value(
        "secure_rdma_handshakes_total{outcome=\"established\"}",
        |v| v == 2.0,
    );
    wait_value("secure_rdma_handshakes_total{outcome=\"rejected\"}", |v| {
        v == 1.0
    });
    wait_value(
        "secure_rdma_rejections_total{reason=\"identity_limit\"}",
        |v| v == 1.0,
    );
    wait_value(
        "secure_rdma_messages_received_total{tenant=\"alice\",op=\"send\"}",
        |v| v == 1.0,
    );
    wait_value(
        "secure_rdma_messages_received_total{tenant=\"alice\",op=\"write\"}",
        |v| v == 1.0,
    );
    wait_value(
        "secure_rdma_received_bytes_total{tenant=\"alice\",op=\"send\"}",
        |v| v == sent.len() as f64,
    );
    wait_value(
        "secure_rdma_received_bytes_total{tenant=\"alice\",op=\"write\"}",
        |v| v == written.len() as f64,
    );
    wait_value("sum(secure_rdma_auth_failures_total) or vector(0)", |v| {
        v == 0.0
    });
    wait_value("secure_rdma_handshake_duration_seconds_count", |v| {
        v == established
    });
    wait_value(
        "sum(secure_rdma_verb_duration_seconds_count{device=\"rxe-a\",verb=\"qp_setup\"})",
        |v| v == 2.0,
    );

    // The kernel probes saw every QP of both sessions, on both sides (the refused client
    // made none): at least 4 creations.
    let qp_creates = wait_value(
        "rdma_verb_calls_total{job=\"rdma-monitor\",source=\"ebpf\",verb=\"QP_CREATE\"}",
        |v| v >= 4.0,
    );
    // The server reports the same control path through its own probes.
    wait_value(
        "rdma_verb_calls_total{job=\"secure-server\",source=\"ebpf\",verb=\"QP_CREATE\"}",
        |v| v >= 4.0,
    );
    wait_value(
        "count(rdma_port_hw_events_total{job=\"rdma-monitor\",device=\"rxe-a\"})",
        |v| v > 0.0,
    );
    for build in ["secure_server_build_info", "rdma_monitor_build_info"] {
        wait_value(
            &format!("{build}{{version=\"{}\"}}", env!("CARGO_PKG_VERSION")),
            |v| v == 1.0,
        );
    }

    // Every shipped alert rule evaluates (health "ok", not "err"), and none fires for this run.
    let start = Instant::now();
    let rules = loop {
        let (_, body) = http_get(PROMETHEUS, "/api/v1/rules").expect("rules API");
        let v: Value = serde_json::from_str(&body).expect("rules JSON");
        let rules: Vec<Value> = v["data"]["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        if !rules.is_empty() && rules.iter().all(|r| r["health"] != "unknown") {
            break rules;
        }
        assert!(start.elapsed() < DEADLINE, "rules not evaluated: {body}");
        std::thread::sleep(Duration::from_millis(250));
    };
    // As many rules as the shipped file defines (one is added with each alert, so no count here
    // goes stale when docs/monitoring/alerts.yml grows).
    let shipped = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring/alerts.yml"),
    )
    .expect("docs/monitoring/alerts.yml")
    .lines()
    .filter(|l| l.trim_start().starts_with("- alert:"))
    .count();
    assert!(
        shipped >= 10,
        "{shipped} alert rules in docs/monitoring/alerts.yml"
    );
    assert_eq!(rules.len(), shipped, "{rules:#?}");
    for r in &rules {
        assert_eq!(r["health"], "ok", "{r:#}");
    }
    // Nothing failed authentication here, so that alert must be quiet. (Others may
    // legitimately fire in a shared lab VM: earlier tests inject packets into rxe-a.)
    let auth = rules
        .iter()
        .find(|r| r["name"] == "SecureRdmaAuthenticationFailures")
        .expect("the authentication alert is loaded");
    assert_eq!(auth["state"], "inactive", "{auth:#}");
    println!(
        "prometheus: 2 sessions established, 1 refused (identity_limit), alice's bytes counted; \
         rdma-monitor counted {qp_creates} QP_CREATE through eBPF; {} alert rules healthy",
        rules.len()
    );
}
