//! `rdma-monitor` as a user runs it on a machine without the lab: clear errors
//! for what is missing or wrong, and reports without eBPF (`--no-ebpf`). The
//! probes themselves are tested in the VM (tests/tests/monitor_lab.rs).

use std::process::{Command, Output};

fn rdma_monitor(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-monitor"))
        .args(args)
        .output()
        .expect("run rdma-monitor")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn without_probes_it_names_what_is_missing() {
    // Whatever this machine lacks (privileges, BPF, BTF, kprobes, RDMA hooks),
    // the one error line says which.
    let out = rdma_monitor(&["--interval", "0.1", "--count", "1"]);
    if out.status.success() {
        return; // a machine with kprobes and ib_core: nothing is missing
    }
    let err = stderr(&out);
    assert!(err.starts_with("rdma-monitor: error: "), "{err}");
    let named = [
        "kprobes are not supported",
        "needs root",
        "no BPF support",
        "kernel BTF is missing",
        "no RDMA hook could be attached",
        "built without its BPF object",
    ];
    assert!(named.iter().any(|n| err.contains(n)), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn no_ebpf_reports_the_thresholds_as_json_and_a_final_summary() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("quota.conf");
    std::fs::write(
        &conf,
        "QP_COUNT 1000  # live QPs\nMR_REG 200\ntenant alice QP_COUNT 4\n",
    )
    .unwrap();
    let out = rdma_monitor(&[
        "--no-ebpf",
        "--json",
        "--interval",
        "0.1",
        "--count",
        "2",
        "--quota",
        &conf.to_string_lossy(),
        "--limit",
        "QP_CREATE=100",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reports: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(reports.len(), 3, "two interval reports and the final one");
    assert_eq!(reports[2]["final"], true);
    let config = &reports[0]["config"];
    assert_eq!(config["global"]["QP_COUNT"], 1000);
    assert_eq!(config["global"]["MR_REG"], 200);
    assert_eq!(config["global"]["QP_CREATE"], 100);
    assert_eq!(config["tenants"]["alice"]["QP_COUNT"], 4);
    assert_eq!(reports[1]["live"]["QP"], 0);
}

#[test]
fn text_reports_have_the_sections() {
    let out = rdma_monitor(&[
        "--no-ebpf",
        "--interval",
        "0.1",
        "--count",
        "1",
        "--limit",
        "QP_COUNT=4",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for section in [
        "Interception configuration:",
        "QP_COUNT 4",
        "Resource counts:",
        "Per-cgroup statistics:",
        "Operation frequency:",
        "=== rdma-monitor final summary ===",
    ] {
        assert!(text.contains(section), "{section:?} missing:\n{text}");
    }
}

#[test]
fn bad_input_is_an_error_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("bad.conf");
    std::fs::write(&conf, "QP_COUNT 10\nQP_CONT 5\n").unwrap();
    let conf = conf.to_string_lossy().into_owned();
    let cases: &[(&[&str], &str)] = &[
        (
            &["--no-ebpf", "--quota", &conf],
            "bad.conf:2: unknown key \"QP_CONT\"",
        ),
        (
            &["--no-ebpf", "--quota", "/nonexistent/q.conf"],
            "/nonexistent/q.conf",
        ),
        (
            &["--no-ebpf", "--limit", "QP_DESTROY=1"],
            "destruction is never limited",
        ),
        (&["--no-ebpf", "--limit", "QP_COUNT=many"], "QP_COUNT"),
        (&["--no-ebpf", "--interval", "0"], "out of range"),
        (
            &["--no-ebpf", "--interval", "soon"],
            "\"soon\" is not a number",
        ),
        (
            &["--no-ebpf", "--metrics", "not-an-address"],
            "not-an-address",
        ),
        (
            &["--kernel-limit", "/t:QP_MODIFY=5"],
            "the kernel limits QP_CREATE, CQ_CREATE, MR_REG, PD_ALLOC, CTX_OPEN only",
        ),
        (
            &["--kernel-limit", "QP_CREATE=5"],
            "is not CGROUP:VERB=RATE",
        ),
        // The kernel limit is an eBPF program: no eBPF, no limit.
        (
            &["--no-ebpf", "--kernel-limit", "/t:QP_CREATE=5"],
            "cannot be used with",
        ),
    ];
    for (args, want) in cases {
        let out = rdma_monitor(args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: want {want:?} in {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A fake `/sys/class/infiniband` with two devices, one with two ports, and a broken file.
fn fake_sysfs() -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    for (port_dir, values) in [
        (
            "rxe-a/ports/1/hw_counters",
            &[
                ("rcvd_pkts", "42\n"),
                ("out_of_seq_request", "3\n"),
                ("lifespan", "10\n"),
                ("rcvd_seq_err", "garbage\n"),
            ][..],
        ),
        (
            "mlx5_0/ports/1/hw_counters",
            &[("out_of_sequence", "7\n")][..],
        ),
        (
            "mlx5_0/ports/2/hw_counters",
            &[("duplicate_request", "0\n")][..],
        ),
    ] {
        let dir = root.path().join(port_dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, value) in values {
            std::fs::write(dir.join(name), value).unwrap();
        }
    }
    root
}

#[test]
fn no_ebpf_reports_port_hw_counters_and_skips_a_broken_one() {
    let root = fake_sysfs();
    let root_arg = root.path().to_string_lossy().into_owned();
    let out = rdma_monitor(&[
        "--no-ebpf",
        "--json",
        "--interval",
        "0.1",
        "--count",
        "1",
        "--hw-counters-root",
        &root_arg,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let reports: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let hw = &reports[0]["hw_counters"];
    assert_eq!(
        hw,
        &serde_json::json!({
            "rxe-a": {"1": {"rcvd_pkts": {"total": 42, "delta": 0},
                            "out_of_seq_request": {"total": 3, "delta": 0}}},
            "mlx5_0": {"1": {"out_of_sequence": {"total": 7, "delta": 0}},
                       "2": {"duplicate_request": {"total": 0, "delta": 0}}},
        })
    );
    assert_eq!(
        reports[0]["hw_counters_skipped"],
        serde_json::json!([{"path": "rxe-a/ports/1/hw_counters/rcvd_seq_err",
                            "kind": "not_a_number", "reason": "not a number: \"garbage\""}])
    );
    assert_eq!(reports[0]["auth_failures"], serde_json::Value::Null);
    // Logged once, not per report.
    let err = stderr(&out);
    assert_eq!(
        err.matches("skipping a port hardware counter").count(),
        1,
        "{err}"
    );

    let out = rdma_monitor(&[
        "--no-ebpf",
        "--interval",
        "0.1",
        "--count",
        "1",
        "--all-hw-counters",
        "--hw-counters-root",
        &root_arg,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "Port hardware counters:",
        "  rxe-a/1 out_of_seq_request           +0 (total 3)  SECURITY",
        "  rxe-a/1 rcvd_pkts                    +0 (total 42)",
        "  skipped rxe-a/ports/1/hw_counters/rcvd_seq_err: not a number: \"garbage\"",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
    }
    assert!(!text.contains("lifespan"), "{text}");
}

#[test]
fn version_help_and_errors_follow_the_family_conventions() {
    let out = rdma_monitor(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("rdma-monitor {}", env!("CARGO_PKG_VERSION"))
    );
    let help = String::from_utf8_lossy(&rdma_monitor(&["--help"]).stdout).into_owned();
    for documented in ["Exit codes:", "--log-format", "text", "json", "  2  usage"] {
        assert!(
            help.contains(documented),
            "{documented} missing from:\n{help}"
        );
    }
    // A bad choice is clap's usage error, listing the values.
    let out = rdma_monitor(&["--log-format", "xml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("[possible values: text, json]"),
        "{}",
        stderr(&out)
    );
    let out = rdma_monitor(&["--tenant-by", "uid"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("[possible values: user, cgroup]"),
        "{}",
        stderr(&out)
    );
    // Any failure after parsing: one line, exit 1.
    let out = rdma_monitor(&["--no-ebpf", "--quota", "/nonexistent/quota.conf"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("rdma-monitor: error: "),
        "{}",
        stderr(&out)
    );
}

/// `GET /metrics` on `addr` with these extra header lines: the response head and body.
fn scrape(addr: &str, headers: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).expect("connect to --metrics");
    write!(stream, "GET /metrics HTTP/1.1\r\n{headers}\r\n").expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    let (head, body) = response.split_once("\r\n\r\n").expect("head and body");
    (head.to_owned(), body.to_owned())
}

#[test]
fn the_metrics_endpoint_is_promtool_clean_and_speaks_openmetrics_to_prometheus() {
    use std::io::BufRead;
    let sysfs = fake_sysfs();
    let mut child = Command::new(env!("CARGO_BIN_EXE_rdma-monitor"))
        .args([
            "--no-ebpf",
            "--interval",
            "0.1",
            "--limit",
            "QP_COUNT=4",
            "--metrics",
            "127.0.0.1:0",
        ])
        .arg("--hw-counters-root")
        .arg(sysfs.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run rdma-monitor");
    let stderr = child.stderr.take().expect("stderr");
    // Read stderr to its end, so rdma-monitor never writes to a closed pipe, and pass on
    // where the metrics are: "rdma-monitor: metrics at http://127.0.0.1:PORT/metrics".
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if let Some((_, rest)) = line.split_once("metrics at http://") {
                let _ = tx.send(rest.trim_end_matches("/metrics").to_owned());
            }
        }
    });
    let addr = rx.recv_timeout(std::time::Duration::from_secs(30)).ok();
    let Some(addr) = addr else {
        let _ = child.kill();
        panic!("rdma-monitor never said where its metrics are");
    };
    // The first report replaces the build info alone within an interval or two.
    let start = std::time::Instant::now();
    let (head, body) = loop {
        let (head, body) = scrape(&addr, "");
        if body.contains("rdma_limit{") || start.elapsed() > std::time::Duration::from_secs(30) {
            break (head, body);
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (om_head, om_body) = scrape(
        &addr,
        "Accept: application/openmetrics-text;version=1.0.0\r\n",
    );
    let _ = child.kill();
    let _ = child.wait();

    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    for expected in [
        "rdma_monitor_build_info{version=\"",
        "rdma_limit{scope=\"global\",key=\"QP_COUNT\"} 4",
        "rdma_verb_calls_total{verb=\"QP_CREATE\",source=\"process\"} 0",
        "# TYPE rdma_port_hw_events_total counter",
        "rdma_port_hw_events_total{device=\"",
    ] {
        assert!(body.contains(expected), "{expected:?} missing in\n{body}");
    }
    assert!(
        om_head.contains("Content-Type: application/openmetrics-text"),
        "{om_head}"
    );
    assert!(om_body.ends_with("# EOF\n") && om_body.contains("# TYPE rdma_verb_calls counter"));

    let promtool = Command::new("promtool").arg("--version").output();
    if !promtool.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "promtool is missing: install Debian's `prometheus` package (scripts/test.sh does)"
        );
        eprintln!("promtool is missing (apt-get install prometheus): not checked");
        return;
    }
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool starts");
    std::io::Write::write_all(&mut check.stdin.take().expect("stdin"), body.as_bytes())
        .expect("promtool reads");
    let out = check.wait_with_output().expect("promtool finishes");
    let said = format!("{}{}", lossy(&out.stdout), lossy(&out.stderr));
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool: {said}\n{body}"
    );
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
