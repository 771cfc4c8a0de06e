//! The LD_PRELOAD interceptor (`librdma_intercept.so`) with its collector
//! (`rdma-collector`) on real Soft-RoCE: a program that asks for more RDMA
//! resources than its quota gets them all without the interceptor, and
//! exactly the quota with it; the rest fail with EDQUOT and say why.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh`. The interceptor and the
//! collector are not dependencies of this crate; build them first into the
//! same target directory:
//!
//! ```text
//! cargo build -p rdma-intercept -p rdma-collector
//! cargo test -p secure-rdma-tests --no-run
//! ```

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use secure_rdma_tests::collector::{preload, Collector};
use secure_rdma_tests::secure::{count_kind, Lines};
use secure_rdma_tests::{
    rdma_resources_of, require_lab, text, wait_listening, wait_with_deadline, ADDR_A,
};
use serde_json::Value;

const FLOOD: &str = env!("CARGO_BIN_EXE_verbs-flood");
const DEADLINE: Duration = Duration::from_secs(60);
const EDQUOT: i64 = libc::EDQUOT as i64;
const EACCES: i64 = libc::EACCES as i64;
/// What verbs-flood writes to stderr just before each report line.
const REPORT_MARKER: &str = "verbs-flood: report";

/// A collector that logs each admission decision (at debug only; info has a periodic
/// summary): these tests count them.
fn start_collector(limits: &[&str]) -> Collector {
    Collector::start_with_log(limits, "info,rdma_collector=debug")
}

/// How to run a program: with or without the interceptor.
enum Run<'a> {
    Plain,
    Preloaded(&'a Path),
    PreloadedFail(&'a Path, &'a str),
}

fn command(program: &str, run: &Run) -> Command {
    let mut cmd = Command::new(program);
    cmd.env_remove("LD_PRELOAD")
        .env_remove("RDMA_INTERCEPT_FAIL")
        .env_remove("RDMA_COLLECTOR");
    match run {
        Run::Plain => {}
        Run::Preloaded(socket) => {
            cmd.env("LD_PRELOAD", preload())
                .env("RDMA_COLLECTOR", socket);
        }
        Run::PreloadedFail(socket, mode) => {
            cmd.env("LD_PRELOAD", preload())
                .env("RDMA_COLLECTOR", socket)
                .env("RDMA_INTERCEPT_FAIL", mode);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// A running `verbs-flood --hold`.
struct Flood {
    child: Child,
    report: Value,
    stdout: Lines,
    stderr: Lines,
}

impl Flood {
    /// Starts it and waits for its first report.
    fn start(args: &[&str], run: &Run) -> Flood {
        require_lab();
        let mut child = command(FLOOD, run)
            .args(args)
            .spawn()
            .expect("spawn verbs-flood");
        let stdout = Lines::collect(child.stdout.take().expect("stdout"));
        let stderr = Lines::collect(child.stderr.take().expect("stderr"));
        let started = Instant::now();
        let report = loop {
            if let Some(first) = stdout.snapshot().first() {
                break serde_json::from_str::<Value>(first)
                    .unwrap_or_else(|e| panic!("bad report {first:?}: {e}"));
            }
            if let Ok(Some(status)) = child.try_wait() {
                // The report may be written and still on its way through the reader threads;
                // without the marker before it (the lines shown on timeout), it never was.
                eprintln!("verbs-flood exited ({status}); waiting for its report");
                stderr.wait_for("report marker", 1, Duration::from_secs(10), |l| {
                    l == REPORT_MARKER
                });
                stdout.wait_for("report", 1, DEADLINE, |_| true);
                continue;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "verbs-flood printed no report"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        // Everything it wrote to stderr before the report (the interceptor's refusals) is in.
        stderr.wait_for("report marker", 1, DEADLINE, |l| l == REPORT_MARKER);
        Flood {
            child,
            report,
            stdout,
            stderr,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// (succeeded, errnos of the failures) for one kind.
    fn tally(&self, kind: &str) -> (u64, Vec<i64>) {
        let k = &self.report[kind];
        let ok = k["ok"].as_u64().expect("ok count");
        let errnos = k["errno"]
            .as_array()
            .expect("errno list")
            .iter()
            .map(|e| e.as_i64().expect("errno"))
            .collect();
        (ok, errnos)
    }

    fn stderr(&self) -> Vec<String> {
        self.stderr.snapshot()
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kills it like a crash: nothing destroyed, nothing released by the program.
    fn crash(mut self) {
        self.child.kill().expect("SIGKILL verbs-flood");
        self.child.wait().expect("reap verbs-flood");
    }

    /// Waits for the normal end of a run without --hold.
    fn finish(self) {
        let out = wait_with_deadline(self.child, DEADLINE, "verbs-flood");
        assert!(out.status.success(), "verbs-flood: {}", out.status);
    }
}

fn kernel_qps(pid: u32) -> usize {
    count_kind(&rdma_resources_of(pid), "qp")
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn qp_flood_gets_everything_without_the_preload_and_exactly_the_quota_with_it() {
    let collector = start_collector(&["QP_COUNT=1"]);
    let args = ["--qps", "4", "--hold"];

    // The attack without the defense: a collector that nobody asks limits nothing.
    let plain = Flood::start(&args, &Run::Plain);
    assert_eq!(plain.tally("qp"), (4, vec![]), "{:?}", plain.stderr());
    assert_eq!(kernel_qps(plain.pid()), 4, "the kernel holds all four");
    assert_eq!(collector.live()["QP"], 0);
    plain.crash();

    // With the defense: exactly the quota, the rest EDQUOT with the reason.
    let guarded = Flood::start(&args, &Run::Preloaded(&collector.socket));
    assert_eq!(
        guarded.tally("qp"),
        (1, vec![EDQUOT, EDQUOT, EDQUOT]),
        "{:?}",
        guarded.stderr()
    );
    assert_eq!(guarded.tally("pd"), (1, vec![]));
    assert_eq!(guarded.tally("cq"), (1, vec![]));
    let refusals: Vec<String> = guarded
        .stderr()
        .into_iter()
        .filter(|l| l.starts_with("rdma-intercept:"))
        .collect();
    assert_eq!(
        refusals,
        vec!["rdma-intercept: QP_CREATE refused: QP_COUNT limit 1 reached globally (1 live)"; 3]
    );
    assert!(
        guarded
            .stderr()
            .iter()
            .any(|l| l.contains("ibv_create_qp #1 failed: Disk quota exceeded")),
        "{:?}",
        guarded.stderr()
    );
    assert_eq!(kernel_qps(guarded.pid()), 1, "the kernel holds only one");
    let live = collector.live();
    assert_eq!((live["QP"], live["PD"], live["CQ"]), (1, 1, 1), "{live:?}");

    // A crash releases everything: the collector sees the connection close.
    guarded.crash();
    collector.wait_all_released();

    let log = collector.stop();
    let denied = log
        .lines()
        .filter(|l| {
            l.contains("comm=verbs-flood")
                && l.contains("verb=QP_CREATE")
                && l.contains("result=\"denied\"")
                && l.contains("tenant=root")
        })
        .count();
    assert_eq!(denied, 3, "collector log:\n{log}");
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn memory_registrations_count_once_and_destroys_release_them() {
    let collector = start_collector(&["MR_COUNT=2", "MR_BYTES=65536"]);
    // ibv_reg_mr calls ibv_reg_mr_iova2 through libibverbs' PLT, which the
    // preload also shadows: counted twice, only one of three would pass.
    for call in ["reg-mr", "reg-mr-iova2"] {
        let flood = Flood::start(
            &["--mrs", "3", "--mr-call", call, "--hold"],
            &Run::Preloaded(&collector.socket),
        );
        assert_eq!(
            flood.tally("mr"),
            (2, vec![EDQUOT]),
            "{call}: {:?}",
            flood.stderr()
        );
        let live = collector.live();
        assert_eq!(
            (live["MR"], live["MR_BYTES"]),
            (2, 8192),
            "{call}: {live:?}"
        );
        assert!(
            flood.stderr().contains(
                &"rdma-intercept: MR_REG refused: MR_COUNT limit 2 reached globally (2 live)"
                    .to_owned()
            ),
            "{call}: {:?}",
            flood.stderr()
        );
        flood.crash();
        collector.wait_all_released();
    }

    // MR_BYTES (checked after MR_COUNT): 48 KiB fits in 64 KiB, twice does not.
    let mut flood = Flood::start(
        &["--mrs", "2", "--mr-size", "49152", "--destroy", "--hold"],
        &Run::Preloaded(&collector.socket),
    );
    assert_eq!(flood.tally("mr"), (1, vec![EDQUOT]), "{:?}", flood.stderr());
    assert!(
        flood.stderr().contains(
            &"rdma-intercept: MR_REG refused: MR_BYTES limit 65536 would be exceeded globally \
              (49152 registered + 49152 requested)"
                .to_owned()
        ),
        "{:?}",
        flood.stderr()
    );
    // --destroy: the program deregisters and deallocates while it keeps
    // running, so only RELEASE (not a disconnect) can bring the counts to 0.
    flood.stdout.wait_for("destroy report", 1, DEADLINE, |l| {
        l.contains("\"destroyed\"")
    });
    collector.wait_all_released();
    assert!(
        flood.alive(),
        "the counts fell to 0 while the program still ran"
    );
    flood.crash();
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn without_a_collector_creations_fail_closed_unless_told_to_fail_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let absent = dir.path().join("no-collector.sock");
    let args = ["--pds", "2", "--cqs", "2", "--qps", "1", "--mrs", "1"];

    let closed = Flood::start(&args, &Run::Preloaded(&absent));
    assert_eq!(
        closed.tally("pd"),
        (0, vec![EACCES, EACCES]),
        "{:?}",
        closed.stderr()
    );
    assert_eq!(closed.tally("cq"), (0, vec![EACCES, EACCES]));
    let stderr = closed.stderr();
    let expected = format!(
        "rdma-intercept: collector at {} unreachable: connect: No such file or directory \
         (os error 2); refusing PD_ALLOC (RDMA_INTERCEPT_FAIL=closed)",
        absent.display()
    );
    assert!(stderr.contains(&expected), "{stderr:?}");
    closed.finish();

    let open = Flood::start(&args, &Run::PreloadedFail(&absent, "open"));
    for kind in ["pd", "cq", "qp", "mr"] {
        assert_eq!(
            open.tally(kind).1,
            Vec::<i64>::new(),
            "{kind}: {:?}",
            open.stderr()
        );
    }
    assert_eq!(open.tally("pd").0, 2);
    let warnings: Vec<String> = open
        .stderr()
        .into_iter()
        .filter(|l| l.starts_with("rdma-intercept:"))
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one warning for six creations: {warnings:?}"
    );
    assert!(
        warnings[0]
            .contains("allowing RDMA resources without quota checks (RDMA_INTERCEPT_FAIL=open)"),
        "{warnings:?}"
    );
    open.finish();
}

fn pingpong(device: &str, port: u16, server: Option<&str>, run: &Run) -> Child {
    let mut cmd = command("ibv_rc_pingpong", run);
    cmd.args(["-d", device, "-g", "1", "-n", "50", "-p", &port.to_string()]);
    if let Some(addr) = server {
        cmd.arg(addr);
    }
    cmd.spawn().expect("spawn ibv_rc_pingpong (ibverbs-utils)")
}

fn succeeded(out: &Output, who: &str) {
    assert!(
        out.status.success(),
        "{who} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn ibv_rc_pingpong_runs_unchanged_under_the_preload() {
    require_lab();
    let collector = start_collector(&["QP_COUNT=8", "MR_BYTES=16777216"]);
    let run = Run::Preloaded(&collector.socket);
    let port = 18661;
    let server = pingpong("rxe-a", port, None, &run);
    assert!(wait_listening(port), "nothing listens on port {port}");
    let client = pingpong("rxe-b", port, Some(ADDR_A), &run);
    let client = wait_with_deadline(client, DEADLINE, "ibv_rc_pingpong client");
    let server = wait_with_deadline(server, DEADLINE, "ibv_rc_pingpong server");
    succeeded(&client, "client");
    succeeded(&server, "server");
    for out in [&client, &server] {
        // "204800 bytes in 0.05 seconds = ..." and "50 iters in ...".
        let printed = text(&out.stdout);
        assert!(printed.contains("50 iters in"), "{printed}");
        assert!(
            !text(&out.stderr).contains("rdma-intercept"),
            "{}",
            text(&out.stderr)
        );
    }
    collector.wait_all_released();
    let log = collector.stop();
    // Both processes really went through the hooks: one PD, CQ, QP and MR
    // each, and one registration of pingpong's 4096-byte buffer (not two:
    // ibv_reg_mr@IBVERBS_1.1 calls ibv_reg_mr_iova2 inside libibverbs).
    for verb in ["PD_ALLOC", "CQ_CREATE", "QP_CREATE", "MR_REG"] {
        let admitted = log
            .lines()
            .filter(|l| {
                l.contains("comm=ibv_rc_pingpong")
                    && l.contains(&format!("verb={verb} "))
                    && l.contains("result=\"admitted\"")
            })
            .count();
        assert_eq!(admitted, 2, "{verb}: collector log:\n{log}");
    }
    assert!(
        log.contains("verb=MR_REG bytes=4096 result=\"admitted\""),
        "{log}"
    );
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn ibv_rc_pingpong_is_refused_by_a_quota_it_exceeds() {
    require_lab();
    let collector = start_collector(&["MR_BYTES=1024"]);
    let server = pingpong("rxe-a", 18662, None, &Run::Preloaded(&collector.socket));
    let out = wait_with_deadline(server, DEADLINE, "ibv_rc_pingpong server");
    assert!(!out.status.success(), "pingpong ran despite MR_BYTES 1024");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(
            "rdma-intercept: MR_REG refused: MR_BYTES limit 1024 would be exceeded globally \
             (0 registered + 4096 requested)"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("Couldn't register MR"), "{stderr}");
    collector.wait_all_released();
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_private_dlopen_bypasses_the_preload_for_what_it_calls_directly() {
    // The limitation, measured: a program that resolves libibverbs through
    // its own RTLD_LOCAL handle (as the sideway crate does) never calls the
    // preloaded ibv_create_qp. Only calls libibverbs makes through its own
    // PLT (ibv_reg_mr -> ibv_reg_mr_iova2 in rdma-core 44) still reach the
    // interceptor, which must then find the real function without RTLD_NEXT.
    let collector = start_collector(&["QP_COUNT=1", "MR_COUNT=1"]);
    let flood = Flood::start(
        &["--resolve", "private", "--qps", "3", "--mrs", "2", "--hold"],
        &Run::Preloaded(&collector.socket),
    );
    assert_eq!(
        flood.tally("qp"),
        (3, vec![]),
        "bypassed: {:?}",
        flood.stderr()
    );
    assert_eq!(kernel_qps(flood.pid()), 3);
    let live = collector.live();
    assert_eq!(live["QP"], 0, "the collector never heard of them: {live:?}");
    assert_eq!(
        flood.tally("mr"),
        (1, vec![EDQUOT]),
        "the internal PLT call is still intercepted: {:?}",
        flood.stderr()
    );
    assert_eq!(live["MR"], 1);
    flood.crash();
    collector.wait_all_released();
}
