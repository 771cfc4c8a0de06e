//! The README's quick start, run as written (issue 14, "First five minutes"): the block between
//! `<!-- quickstart -->` and `<!-- /quickstart -->`, with its first line (`cargo build --release`
//! and PATH) replaced by this build's binaries on PATH. Run as `nobody` when the test runs as
//! root, so "no root" is what is tested. A host test: on a machine with RDMA (the lab VM) the
//! block's premise, no RDMA, does not hold and the test says so and passes without running it.

use std::path::Path;
use std::process::Command;

use secure_rdma::verbs::Device;
use secure_rdma_tests::{bin_dir, readme};

#[test]
fn the_readme_quick_start_runs_as_an_ordinary_user_without_rdma() {
    let availability = Device::availability();
    if availability.is_available() {
        eprintln!(
            "not run: this machine has RDMA ({availability}); the quick start is for one without"
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let block = readme::block("quickstart");
    let mut lines = block.lines();
    let first = lines.next().unwrap_or_default();
    assert!(
        first.starts_with("cargo build --release"),
        "the block starts by building: {first}"
    );
    // The block runs in a staged copy (the tools and the sample it reads, in a 0755 directory):
    // a checkout under a 0700 directory, as CI's clones are, is out of nobody's reach.
    let stage = tempfile::tempdir().expect("tempdir");
    let bin = stage.path().join("bin");
    let samples = stage.path().join("roce/samples");
    std::fs::create_dir_all(&bin).expect("stage bin");
    std::fs::create_dir_all(&samples).expect("stage samples");
    for tool in [
        "secure-server",
        "secure-client",
        "rdma-capture",
        "rdma-monitor",
    ] {
        std::fs::copy(bin_dir().join(tool), bin.join(tool)).unwrap_or_else(|e| {
            panic!("staging {tool} (build it with cargo build --workspace --bins): {e}")
        });
    }
    std::fs::copy(
        root.join("roce/samples/rc-session.pcapng"),
        samples.join("rc-session.pcapng"),
    )
    .expect("stage the sample capture");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(stage.path(), std::fs::Permissions::from_mode(0o755))
            .expect("stage readable by all");
    }
    let script = format!(
        "set -u\nexport PATH={}:$PATH\n{}\nrm -rf \"$Q\"\n",
        bin.display(),
        lines.collect::<Vec<_>>().join("\n")
    );
    let mut cmd = if is_root() {
        // setpriv (util-linux) drops to nobody with no supplementary groups; HOME and TMPDIR
        // point where nobody may write.
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "bash",
            "-c",
            &script,
        ]);
        c
    } else {
        let mut c = Command::new("bash");
        c.args(["-c", &script]);
        c
    };
    let out = cmd
        .current_dir(stage.path())
        .env("HOME", "/tmp")
        .env("TMPDIR", "/tmp")
        .output()
        .expect("run the quick start");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let both = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(out.status.success(), "quick start failed\n{both}");
    // The client's one-line answer and exit 3.
    assert!(
        stderr.contains("rejected by server: server cannot serve RDMA")
            && stderr.contains("scripts/setup-softroce.sh"),
        "{both}"
    );
    assert!(stdout.contains("exit 3"), "{both}");
    // Four decoded packets with good ICRCs.
    let packets: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains("-> ") && l.contains("icrc=ok"))
        .collect();
    assert_eq!(packets.len(), 4, "{both}");
    assert!(packets[0].contains("RC SEND Only"), "{both}");
    // The monitor's report.
    assert!(stdout.contains("Resource counts:"), "{both}");
    eprintln!("{both}");
}

/// Whether this process runs as root (the quick start then runs as nobody).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn the_block_is_found_between_its_markers() {
    let text = "intro\n<!-- quickstart -->\n```sh\na\nb\n```\n<!-- /quickstart -->\nrest";
    assert_eq!(readme::block_of(text, "quickstart"), "a\nb");
}
