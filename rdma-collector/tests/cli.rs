//! `rdma-collector` as a user first meets it: its name and version, its documented exit codes,
//! and the family's error formats.

use std::process::{Command, Output};

fn rdma_collector(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rdma-collector"))
        .args(args)
        .output()
        .expect("run rdma-collector")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn version_help_and_errors_follow_the_family_conventions() {
    let out = rdma_collector(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("rdma-collector {}", env!("CARGO_PKG_VERSION"))
    );
    let help = String::from_utf8_lossy(&rdma_collector(&["--help"]).stdout).into_owned();
    for documented in ["Exit codes:", "--log-format", "  2  usage"] {
        assert!(
            help.contains(documented),
            "{documented} missing from:\n{help}"
        );
    }
    let out = rdma_collector(&["--log-format", "xml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("[possible values: text, json]"),
        "{}",
        stderr(&out)
    );
    let out = rdma_collector(&["--tenant-by", "uid"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("[possible values: user, cgroup]"),
        "{}",
        stderr(&out)
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let out = rdma_collector(&[
        "--log-format",
        "json",
        "--quota",
        "/nonexistent/quota.conf",
        "--socket",
        dir.path().join("s").to_str().expect("utf-8 path"),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("rdma-collector: error: "),
        "{}",
        stderr(&out)
    );
}
