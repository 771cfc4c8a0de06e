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
