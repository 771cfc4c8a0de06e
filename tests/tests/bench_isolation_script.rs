//! scripts/bench-isolation.sh's command line, on the host (no VM, no build):
//! `--help` says what it measures and how to shorten it, and a wrong
//! argument is refused before anything is built, naming the argument.

use std::path::PathBuf;
use std::process::{Command, Output};

fn script(args: &[&str]) -> Output {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/bench-isolation.sh");
    Command::new("bash")
        .arg(path)
        .args(args)
        .output()
        .expect("run bash")
}

#[test]
fn help_names_the_layers_the_kinds_and_the_options() {
    let out = script(&["--help"]);
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for word in [
        "--connections",
        "--seconds",
        "--kinds",
        "--layers",
        "--out",
        "raw.csv",
        "table.md",
        "plot.svg",
        "intercept",
        "cgroup",
        "cpu.max",
        "bypass",
        "hoard",
    ] {
        assert!(help.contains(word), "--help lacks {word}:\n{help}");
    }
    // The help is the header comment without its comment marks.
    assert!(!help.lines().any(|l| l.starts_with('#')), "{help}");
}

#[test]
fn wrong_arguments_are_refused_with_exit_code_2_and_a_reason() {
    for (args, says) in [
        (&["--connections", "0"][..], "--connections 0"),
        (&["--seconds", "ten"][..], "--seconds ten"),
        (&["--cpu-max", "150"][..], "--cpu-max 150"),
        (&["--kinds", "qp,flood"][..], "unknown kind flood"),
        (&["--kinds", "mr:big"][..], "mr:BYTES"),
        (&["--layers", "none,ebpf"][..], "unknown layer ebpf"),
        (&["--rounds", "3"][..], "unknown argument --rounds"),
        (&["--out"][..], "--out needs a value"),
    ] {
        let out = script(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed {:?}", out.stdout);
    }
}
