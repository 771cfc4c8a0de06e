//! scripts/bench-latency.sh's command line, on the host (no VM, no build): `--help` says what
//! it measures and what it writes, and a wrong argument is refused before anything is built,
//! naming it, with exit code 2.

use secure_rdma_tests::scripts;

#[test]
fn help_says_what_is_measured_and_written() {
    scripts::help(
        "bench-latency.sh",
        &[
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
        ],
    );
}

#[test]
fn wrong_arguments_are_refused_with_exit_code_2_and_a_reason() {
    let empty = tempfile::tempdir().expect("tempdir");
    let empty = format!("old={}", empty.path().display());
    scripts::refuses(
        "bench-latency.sh",
        &[
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
        ],
    );
}
