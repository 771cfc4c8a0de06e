//! scripts/vm-suite.sh, which runs the lab binaries inside the VM, on the host with stand-in
//! binaries: a binary that hangs is stopped at its limit with its processes and their kernel
//! waits printed, everything it started is stopped with it, it counts as a failed test, and the
//! binaries after it still run.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use secure_rdma_tests::scripts;

/// Writes an executable shell script NAME in DIR.
fn stand_in(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write a stand-in binary");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

fn suite(limit: &str, binaries: &[&Path]) -> Output {
    Command::new("bash")
        .arg(scripts::path("vm-suite.sh"))
        .args(binaries)
        .env("VM_BINARY_TIMEOUT", limit)
        .output()
        .expect("run bash")
}

#[test]
fn a_hung_binary_is_stopped_at_its_limit_says_what_it_waited_on_and_the_next_one_runs() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let child_file = dir.path().join("child.pid");
    // Hangs the way a lab test would: a server it started, and itself waiting on it.
    let hangs = stand_in(
        dir.path(),
        "hangs",
        &format!("sleep 1000 &\necho $! > {}\nwait", child_file.display()),
    );
    let passes = stand_in(
        dir.path(),
        "passes",
        "echo 'test result: ok. 3 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out'",
    );
    let started = std::time::Instant::now();
    let out = suite("2", &[&hangs, &passes]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a timeout is a failure:\n{stdout}"
    );
    assert!(
        stdout.contains("vm suite: hangs timed out after 2 s"),
        "{stdout}"
    );
    // The diagnosis names the hung processes and what the kernel had them wait on.
    assert!(stdout.contains("---- processes"), "{stdout}");
    assert!(
        stdout.contains("sleep 1000"),
        "the hung server is listed:\n{stdout}"
    );
    assert!(stdout.contains("---- dmesg"), "{stdout}");
    if std::fs::read_to_string("/proc/self/stack").is_ok() {
        assert!(stdout.contains("---- kernel stack of"), "{stdout}");
    }
    // Counted by scripts/test.sh as one failed test.
    assert!(
        stdout.contains(
            "test result: FAILED. 0 passed; 1 failed; 0 ignored (hangs timed out after 2 s)"
        ),
        "{stdout}"
    );
    // The next binary ran after it.
    let hang_at = stdout.find("timed out").expect("reported above");
    let next = stdout
        .find("vm suite: passes took")
        .expect("the next binary ran");
    assert!(next > hang_at, "{stdout}");
    assert!(stdout.contains("3 passed"), "{stdout}");
    // What the hung binary started is stopped with it, not left holding ports for the next.
    let child: u32 = std::fs::read_to_string(&child_file)
        .expect("the stand-in wrote its child's pid")
        .trim()
        .parse()
        .expect("a pid");
    let alive = std::fs::read_to_string(format!("/proc/{child}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false);
    assert!(!alive, "the hung binary's child {child} still runs");
    // Its limit, not the child's 1000 s.
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
}

#[test]
fn a_failing_binary_fails_the_suite_and_the_others_still_run() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let fails = stand_in(dir.path(), "fails", "exit 101");
    let passes = stand_in(dir.path(), "passes", "exit 0");
    let out = suite("30", &[&fails, &passes]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("vm suite: fails took"), "{stdout}");
    assert!(stdout.contains("vm suite: passes took"), "{stdout}");
    assert!(!stdout.contains("timed out"), "{stdout}");

    let out = suite("30", &[&passes]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn a_wrong_limit_or_no_binary_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let passes = stand_in(dir.path(), "passes", "exit 0");
    for limit in ["0", "ten", "-5"] {
        let out = suite(limit, &[&passes]);
        assert_eq!(
            out.status.code(),
            Some(2),
            "VM_BINARY_TIMEOUT={limit:?}: {out:?}"
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("VM_BINARY_TIMEOUT must be a whole number"),
            "{stderr}"
        );
    }
    let out = suite("30", &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no test binaries given"));

    scripts::help(
        "vm-suite.sh",
        &[
            "VM_BINARY_TIMEOUT",
            "timed out",
            "dmesg",
            "D state",
            "process group",
        ],
    );
}
