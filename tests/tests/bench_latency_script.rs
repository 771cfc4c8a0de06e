//! scripts/bench-latency.sh's command line, on the host (no VM, no build): `--help` says what
//! it measures and what it writes, and a wrong argument is refused before anything is built,
//! naming it, with exit code 2.

use std::process::Output;

use secure_rdma_tests::scripts;

fn script(args: &[&str]) -> Output {
    scripts::bash("bench-latency.sh", args)
}

#[test]
fn help_says_what_is_measured_and_written() {
    let out = script(&["--help"]);
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "NAME=DIR",
        "--rounds",
        "--iters",
        "--size",
        "--out",
        "ib_send_lat",
        "--poll busy",
        "taskset",
        "clock source",
        "raw.csv",
        "table.md",
        "plot.svg",
    ] {
        assert!(help.contains(word), "--help lacks {word}:\n{help}");
    }
    assert!(!help.lines().any(|l| l.starts_with('#')), "{help}");
}

#[test]
fn wrong_arguments_are_refused_with_exit_code_2_and_a_reason() {
    let empty = tempfile::tempdir().expect("tempdir");
    let empty = format!("old={}", empty.path().display());
    for (args, says) in [
        (
            &["--rounds", "0"][..],
            "--rounds takes a positive number, not '0'",
        ),
        (
            &["--iters", "many"][..],
            "--iters takes a positive number, not 'many'",
        ),
        (&["--size"][..], "--size takes a positive number, not ''"),
        (&["--out"][..], "--out takes a directory"),
        (
            &["old=/nonexistent/build"][..],
            "no directory /nonexistent/build",
        ),
        (&[empty.as_str()][..], "has no secure-server"),
        (&["a b=/tmp"][..], "a build's name is letters"),
        (&["--repeat"][..], "unknown argument '--repeat'"),
    ] {
        let out = script(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?} should say {says:?}: {err}");
    }
}
