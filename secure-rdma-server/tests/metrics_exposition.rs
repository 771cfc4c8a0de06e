//! The metrics of both exporters (rdma-monitor's and secure-server's), rendered
//! from representative sample data, checked by Prometheus' own `promtool`; and
//! the files of docs/monitoring: the alert rules and scrape config are valid,
//! and the dashboard and the alerts use only metrics the exporters emit.
//!
//! `promtool` comes with Debian's `prometheus` package. Without it these tests
//! say so and pass on a developer's machine, but fail under `CI=true`.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, UNIX_EPOCH};

use rdma_monitor::hw_counters::{SkipReason, Skipped};
use rdma_monitor::report::{
    render_exposition, to_text_format, AttachReport, BuildInfo, CgroupStats, CountSource,
    Interception, PortCounter, Snapshot,
};
use secure_rdma::datapath::Op;
use secure_rdma::handshake::RejectReason;
use secure_rdma::metrics::{
    rejection_reason, HandshakeOutcome, ServerMetrics, TimedVerb, PENDING_LIMIT,
};
use secure_rdma::quota::{QuotaConfig, Resource, Verb};

/// One interval with something in every section.
fn sample_snapshot(source: CountSource) -> Snapshot {
    let mut s = Snapshot::new(
        UNIX_EPOCH + Duration::from_secs(1_714_564_800),
        Duration::from_secs(5),
    );
    s.config = Some(
        QuotaConfig::parse(
            "QP_COUNT 8\nQP_CREATE 20\ntenant alice QP_COUNT 2\n",
            "sample",
        )
        .expect("the sample thresholds parse"),
    );
    s.source = Some(source);
    s.live = BTreeMap::from([
        (Resource::Qp, 2),
        (Resource::Pd, 2),
        (Resource::Cq, 4),
        (Resource::Mr, 4),
    ]);
    s.mr_bytes = 65_536;
    s.totals = BTreeMap::from([(Verb::QpCreate, 7), (Verb::QpModify, 21), (Verb::MrReg, 14)]);
    s.cgroups = vec![CgroupStats {
        id: 4242,
        path: "/system.slice/secure-server.service".to_owned(),
        ops: BTreeMap::from([(Verb::QpCreate, 7)]),
        live: BTreeMap::from([(Resource::Qp, 2)]),
    }];
    s.intercepted = vec![Interception {
        verb: Verb::QpCreate,
        scope: "alice".to_owned(),
        key: "QP_COUNT".to_owned(),
        limit: 2,
        count: 3,
        in_interval: 1,
    }];
    s.lost_events = 0;
    s.attach = vec![AttachReport {
        hook: "ib_create_qp".to_owned(),
        kind: "kprobe+kretprobe".to_owned(),
        attached: true,
        reason: None,
    }];
    s.hw_counters = ["duplicate_request", "out_of_seq_request", "rcvd_pkts"]
        .iter()
        .map(|counter| PortCounter {
            device: "rxe-a".to_owned(),
            port: 1,
            counter: (*counter).to_owned(),
            total: 12,
            delta: Some(1),
        })
        .collect();
    s.hw_counters_skipped = vec![Skipped {
        path: "rxe-a/ports/1/hw_counters/lifespan".to_owned(),
        reason: SkipReason::NotANumber("n/a".to_owned()),
    }];
    s.auth_failures = Some(BTreeMap::from([("mallory".to_owned(), 1)]));
    s
}

/// What `rdma-monitor --metrics` serves to curl and promtool (the format 0.0.4).
fn monitor_exposition() -> String {
    let build = BuildInfo {
        exporter: "rdma_monitor",
        version: env!("CARGO_PKG_VERSION"),
    };
    let snapshot = sample_snapshot(CountSource::Ebpf);
    to_text_format(&render_exposition(Some(&snapshot), &build, |_| {}))
}

/// What `secure-server --metrics` serves, after a few sessions.
fn server_exposition() -> String {
    let metrics = ServerMetrics::default();
    let _active = metrics.session_started("rxe-a");
    metrics.established(Duration::from_millis(40));
    metrics.handshake(HandshakeOutcome::TlsFailed);
    metrics.handshake(HandshakeOutcome::Rejected);
    metrics.rejected(rejection_reason(&RejectReason::ServerFull {
        active: 1,
        max: 1,
    }));
    metrics.rejected(PENDING_LIMIT);
    let alice = metrics.session("alice", "rxe-a");
    alice.received(Op::Send, 64);
    alice.received(Op::Write, 4096);
    metrics.auth_failure("mallory");
    metrics.verb("rxe-a", TimedVerb::QpSetup, Duration::from_millis(3));
    metrics.verb("rxe-a", TimedVerb::QpConfirm, Duration::from_millis(1));
    metrics.verb("rxe-a", TimedVerb::PostSend, Duration::from_micros(20));
    let build = BuildInfo {
        exporter: "secure_server",
        version: env!("CARGO_PKG_VERSION"),
    };
    let snapshot = sample_snapshot(CountSource::Process);
    to_text_format(&render_exposition(Some(&snapshot), &build, |registry| {
        metrics.register(registry)
    }))
}

/// Whether promtool can run here; without it, a failure under CI and a notice elsewhere.
fn have_promtool() -> bool {
    let found = Command::new("promtool")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is missing: install Debian's `prometheus` package (scripts/test.sh does)"
        );
        eprintln!("promtool is missing (apt-get install prometheus): skipped");
    }
    found
}

/// `promtool ARGS` with `input` on stdin: its exit status and everything it printed.
fn promtool(args: &[&str], input: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(input.as_bytes())
        .expect("promtool reads the exposition");
    let out = child.wait_with_output().expect("promtool finishes");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

fn monitoring_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/monitoring")
}

#[test]
fn promtool_check_metrics_is_clean_for_both_exporters() {
    if !have_promtool() {
        return;
    }
    for (exporter, text) in [
        ("rdma-monitor", monitor_exposition()),
        ("secure-server", server_exposition()),
    ] {
        let (ok, said) = promtool(&["check", "metrics"], &text);
        assert!(
            ok && said.trim().is_empty(),
            "promtool check metrics on {exporter}'s exposition: {said}\n{text}"
        );
    }
    // The checker does find problems: a counter without `_total` fails it.
    let (ok, said) = promtool(
        &["check", "metrics"],
        "# HELP bad Bad.\n# TYPE bad counter\nbad 1\n",
    );
    assert!(!ok && said.contains("_total"), "{said}");
}

#[test]
fn promtool_accepts_the_alert_rules_and_the_scrape_config() {
    if !have_promtool() {
        return;
    }
    let dir = monitoring_dir();
    let rules = dir.join("alerts.yml");
    let config = dir.join("prometheus.yml");
    let (ok, said) = promtool(&["check", "rules", &rules.to_string_lossy()], "");
    assert!(ok, "promtool check rules: {said}");
    // The config names alerts.yml, so this checks the rules again as loaded from it.
    let (ok, said) = promtool(&["check", "config", &config.to_string_lossy()], "");
    assert!(
        ok && said.contains("1 rule files found"),
        "promtool check config: {said}"
    );
}

/// The series names of an exposition in the format 0.0.4.
fn series_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let end = l.find(['{', ' ']).unwrap_or(l.len());
            l[..end].to_owned()
        })
        .collect()
}

/// The names of our metrics in a PromQL expression: identifiers with one of
/// the exporters' prefixes, outside quoted strings (label values).
fn metric_names(expr: &str) -> Vec<String> {
    let mut unquoted = String::new();
    let mut quoted = false;
    let mut escaped = false;
    for c in expr.chars() {
        match (quoted, escaped, c) {
            (true, false, '\\') => escaped = true,
            (true, true, _) => escaped = false,
            (_, false, '"') => {
                quoted = !quoted;
                unquoted.push(' ');
            }
            (false, _, c) => unquoted.push(c),
            (true, false, _) => {}
        }
    }
    unquoted
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| {
            ["rdma_", "secure_rdma_", "secure_server_"]
                .iter()
                .any(|p| w.starts_with(p))
        })
        .map(str::to_owned)
        .collect()
}

/// Every `"expr"` string anywhere in a JSON document.
fn json_exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, v) in map {
                match (key.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => json_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| json_exprs(v, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_and_the_alerts_use_only_emitted_metrics() {
    let emitted: BTreeSet<String> = series_names(&monitor_exposition())
        .into_iter()
        .chain(series_names(&server_exposition()))
        .collect();
    let dir = monitoring_dir();

    let dashboard = std::fs::read_to_string(dir.join("grafana-dashboard.json"))
        .expect("docs/monitoring/grafana-dashboard.json is readable");
    let dashboard: serde_json::Value =
        serde_json::from_str(&dashboard).expect("the dashboard is valid JSON");
    assert!(dashboard["panels"]
        .as_array()
        .is_some_and(|p| !p.is_empty()));
    let mut exprs = Vec::new();
    json_exprs(&dashboard, &mut exprs);
    assert!(
        exprs.len() >= 10,
        "the dashboard has {} queries",
        exprs.len()
    );

    let alerts = std::fs::read_to_string(dir.join("alerts.yml"))
        .expect("docs/monitoring/alerts.yml is readable");
    let alert_exprs: Vec<String> = alerts
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("expr:"))
        .map(|e| e.trim().to_owned())
        .collect();
    // A block scalar (`expr: |`) would hide the query on the following lines.
    assert!(
        alert_exprs
            .iter()
            .all(|e| !e.is_empty() && !e.starts_with(['|', '>'])),
        "{alert_exprs:?}"
    );
    assert!(alert_exprs.len() >= 5, "{alert_exprs:?}");

    let mut used = BTreeSet::new();
    for expr in exprs.iter().chain(&alert_exprs) {
        for name in metric_names(expr) {
            assert!(
                emitted.contains(&name),
                "{name} (in `{expr}`) is not emitted by the exporters; they emit {emitted:?}"
            );
            used.insert(name);
        }
    }
    // Every family is on the dashboard or in an alert, build info included.
    for must in [
        "secure_rdma_sessions_active",
        "secure_rdma_handshakes_total",
        "secure_rdma_verb_duration_seconds_bucket",
        "rdma_verb_calls_total",
        "rdma_port_hw_events_total",
        "rdma_monitor_build_info",
        "secure_server_build_info",
    ] {
        assert!(used.contains(must), "{must} is used nowhere: {used:?}");
    }
}

#[test]
fn the_name_extraction_skips_label_values_and_functions() {
    assert_eq!(
        metric_names(
            r#"sum by (tenant) (rate(secure_rdma_auth_failures_total{job="rdma_x\"y"}[5m]))"#
        ),
        ["secure_rdma_auth_failures_total"]
    );
}
