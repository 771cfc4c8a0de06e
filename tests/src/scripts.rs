//! The repository's scripts as host tests run them: a bash script with its arguments, and a
//! bench's Python report over raw rows, in a fresh directory.

use std::path::PathBuf;
use std::process::{Command, Output};

/// `scripts/NAME` in this checkout.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../scripts")
        .join(name)
}

/// Runs `bash scripts/NAME ARGS…` and returns what it did.
pub fn bash(name: &str, args: &[&str]) -> Output {
    Command::new("bash")
        .arg(path(name))
        .args(args)
        .output()
        .expect("run bash")
}

/// `bash scripts/NAME --help`'s text, once it has exited 0, named each of `words`, and shown
/// to be the script's header comment without its comment marks.
pub fn help(name: &str, words: &[&str]) -> String {
    let out = bash(name, &["--help"]);
    assert!(out.status.success(), "{name} --help: {out:?}");
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    for word in words {
        assert!(help.contains(word), "{name} --help lacks {word}:\n{help}");
    }
    assert!(!help.lines().any(|l| l.starts_with('#')), "{help}");
    help
}

/// Checks that `bash scripts/NAME ARGS` exits 2 and its stderr says `says`, for each case,
/// printing nothing on stdout: a wrong argument is refused before anything runs.
pub fn refuses(name: &str, cases: &[(&[&str], &str)]) {
    for (args, says) in cases {
        let out = bash(name, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name} {args:?}: {err}");
        assert!(
            err.contains(says),
            "{name} {args:?} should say {says:?}: {err}"
        );
        assert!(
            out.stdout.is_empty(),
            "{name} {args:?} printed {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// What a bench report made of its raw rows.
pub struct Report {
    /// The report's exit code.
    pub code: Option<i32>,
    /// Its table.md (empty when it wrote none).
    pub table: String,
    /// What it said on stderr.
    pub stderr: String,
    /// Whether it drew plot.svg.
    pub plot: bool,
    /// setup.svg's text (bench-report.py's setup plot), empty when it drew none.
    pub setup_plot: String,
}

/// Runs `python3 scripts/NAME RAW OUTDIR` on a raw.csv of `header` and `rows` in a fresh
/// directory.
pub fn report(name: &str, header: &str, rows: &str) -> Report {
    let dir = tempfile::tempdir().expect("temporary directory");
    let raw = dir.path().join("raw.csv");
    std::fs::write(&raw, format!("{header}\n{rows}")).expect("write raw.csv");
    let out = Command::new("python3")
        .arg(path(name))
        .arg(&raw)
        .arg(dir.path())
        .output()
        .expect("run python3");
    Report {
        code: out.status.code(),
        table: std::fs::read_to_string(dir.path().join("table.md")).unwrap_or_default(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        plot: dir.path().join("plot.svg").exists(),
        setup_plot: std::fs::read_to_string(dir.path().join("setup.svg")).unwrap_or_default(),
    }
}
