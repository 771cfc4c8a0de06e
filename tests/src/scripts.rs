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
