//! Helpers shared by the lab tests, which run inside the Soft-RoCE VM
//! (`scripts/softroce-vm.sh`) where `rxe-a` (10.77.0.1 on `veth-a`) and
//! `rxe-b` (10.77.0.2 on `veth-b`) behave like two hosts.
//!
//! The lab tests are `#[ignore]`d on the host, which has no RDMA; the test
//! script runs them in the VM with `--include-ignored`. Inside, a missing lab
//! is a test failure, never a skip.

pub mod collector;
pub mod dlverbs;
pub mod example;
pub mod faults;
pub mod inject;
pub mod injector;
pub mod no_rdma;
pub mod piped;
pub mod readme;
pub mod scripts;
pub mod secure;
pub mod stream;
pub mod tcp;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Server-side lab address (`veth-a`, `rxe-a`).
pub const ADDR_A: &str = "10.77.0.1";
/// Client-side lab address (`veth-b`, `rxe-b`).
pub const ADDR_B: &str = "10.77.0.2";

/// Fails the test unless both lab devices exist.
pub fn require_lab() {
    for dev in ["rxe-a", "rxe-b"] {
        let p = Path::new("/sys/class/infiniband").join(dev);
        assert!(
            p.exists(),
            "Soft-RoCE lab device {dev} missing: run the lab tests through scripts/softroce-vm.sh (scripts/test.sh does)"
        );
    }
}

/// A child's output bytes as text, for messages and `contains` checks.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Reads a netdev statistics counter.
pub fn netdev_counter(dev: &str, counter: &str) -> u64 {
    let p = format!("/sys/class/net/{dev}/statistics/{counter}");
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {p}: {e}"));
    s.trim()
        .parse()
        .unwrap_or_else(|e| panic!("parsing {p}: {e}"))
}

/// Interrupts a child (SIGINT, as Ctrl-C would: the tools print their final summary on it) and
/// waits for it with [`wait_with_deadline`].
pub fn interrupt_and_wait(child: Child, deadline: Duration, what: &str) -> Output {
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    assert_eq!(
        unsafe { libc::kill(pid, libc::SIGINT) },
        0,
        "SIGINT to {what}"
    );
    wait_with_deadline(child, deadline, what)
}

/// Waits for a child with a deadline; kills it and fails the test on expiry,
/// so a hung verbs process never hangs the suite.
///
/// Its stdout and stderr (when piped) are read while it runs: a child that writes more than a
/// pipe holds (64 KiB) would otherwise block in write(2) and look hung.
pub fn wait_with_deadline(mut child: Child, deadline: Duration, what: &str) -> Output {
    fn drain(
        pipe: Option<impl std::io::Read + Send + 'static>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                // A read error ends the capture; what arrived before it is kept.
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                // A grandchild may still hold the pipe open: do not wait for it for long.
                let gave_up = Instant::now() + Duration::from_secs(2);
                while !stderr.is_finished() && Instant::now() < gave_up {
                    std::thread::sleep(Duration::from_millis(20));
                }
                let stderr = match stderr.is_finished() {
                    true => stderr.join().unwrap_or_default(),
                    false => b"(still held open by another process)".to_vec(),
                };
                panic!(
                    "{what} still running after {deadline:?}; stderr:\n{}",
                    String::from_utf8_lossy(&stderr)
                );
            }
            Err(e) => panic!("waiting for {what}: {e}"),
        }
    };
    Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// Polls `cond` until it holds; fails the test with `context()` at the deadline.
pub fn wait_until(
    what: &str,
    deadline: Duration,
    mut cond: impl FnMut() -> bool,
    context: impl Fn() -> String,
) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}\n{}",
            context()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A child process killed (and reaped) when this is dropped, so a failing test leaves no
/// server, monitor or flooder behind.
pub struct Killed(pub Option<Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts a command with piped stdout/stderr.
pub fn spawn(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"))
}

/// A kernel setting changed for one test and put back when the guard drops (also when the
/// test fails). The lab VM runs its tests one at a time, so nothing else sees the change.
pub struct Sysctl {
    path: PathBuf,
    was: String,
}

impl Sysctl {
    /// Writes `value` to `/proc/sys/<key>` (`key` as in `sysctl`, dots for slashes).
    pub fn set(key: &str, value: &str) -> Sysctl {
        let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
        let was = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("sysctl {key}={value}: {e}"));
        Sysctl {
            path,
            was: was.trim_end().to_owned(),
        }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(&self.path, &self.was) {
            eprintln!("restoring {} to {:?}: {e}", self.path.display(), self.was);
        }
    }
}

/// A running rdma-monitor, its stdout and stderr read line by line as they come: the monitor
/// writes a report every interval, and the tests wait on those lines. Killed when dropped;
/// [`Monitor::stop`] ends it the way an operator does (SIGINT) and checks that it exited well.
pub struct Monitor {
    child: Killed,
    /// Its reports.
    pub out: secure::Lines,
    /// Its notices and errors.
    pub err: secure::Lines,
}

impl Monitor {
    /// SIGINT, then waits (up to `deadline`) for its exit; fails the test, with the monitor's
    /// stderr, unless it exited with success.
    pub fn stop(mut self, deadline: Duration) {
        let child = self
            .child
            .0
            .take()
            .expect("the monitor is running until stopped");
        let status = interrupt_and_wait(child, deadline, "rdma-monitor").status;
        assert!(
            status.success(),
            "rdma-monitor exited with {status}: {}",
            self.err.snapshot().join("\n")
        );
    }
}

/// Starts rdma-monitor with `args` (stdin closed).
pub fn rdma_monitor(args: &[&str]) -> Monitor {
    let mut child = spawn(Command::new(secure::bin("rdma-monitor")).args(args));
    let out = secure::Lines::collect(child.stdout.take().expect("piped stdout"));
    let err = secure::Lines::collect(child.stderr.take().expect("piped stderr"));
    Monitor {
        child: Killed(Some(child)),
        out,
        err,
    }
}

/// Resource lines of `rdma resource show <kind>` that belong to process
/// `pid`. The kernel records the *thread* that created a resource, so the
/// threads of a multi-threaded process (tokio workers) count as well.
pub fn rdma_resources_of(pid: u32) -> Vec<String> {
    let mut ids = vec![pid.to_string()];
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        ids.extend(
            tasks
                .flatten()
                .map(|t| t.file_name().to_string_lossy().into_owned()),
        );
    }
    let needles: Vec<String> = ids.iter().map(|id| format!(" pid {id} ")).collect();
    let mut found = Vec::new();
    for kind in ["qp", "cq", "mr", "pd"] {
        let out = Command::new("rdma")
            .args(["resource", "show", kind])
            .output()
            .unwrap_or_else(|e| panic!("running rdma resource show {kind}: {e}"));
        assert!(
            out.status.success(),
            "rdma resource show {kind}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        found.extend(
            text.lines()
                .filter(|l| {
                    let l = format!("{l} ");
                    needles.iter().any(|n| l.contains(n.as_str()))
                })
                .map(|l| format!("{kind}: {l}")),
        );
    }
    found
}

/// Directory of the workspace's built binaries (next to the test binary's
/// `deps/` directory).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("test binary has a parent dir");
    deps.parent().unwrap_or(deps).to_path_buf()
}

/// A cgroup v2 of one test, with the rdma controller enabled; removed when dropped.
pub struct TestCgroup(pub PathBuf);

impl TestCgroup {
    /// Creates `/sys/fs/cgroup/NAME-PID`.
    pub fn new(name: &str) -> TestCgroup {
        let dir = Path::new("/sys/fs/cgroup").join(format!("{name}-{}", std::process::id()));
        rdma_quota::rdma_cgroup::create(&dir)
            .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
        TestCgroup(dir)
    }

    /// Its path as rdma-monitor reports it (relative to the hierarchy's root).
    pub fn path(&self) -> String {
        let rel = self.0.strip_prefix("/sys/fs/cgroup").unwrap_or(&self.0);
        format!("/{}", rel.display())
    }

    /// `cmd` run inside this cgroup: the shell moves itself in, then execs.
    pub fn command(&self, cmd: &str) -> Command {
        let mut c = Command::new("sh");
        c.args([
            "-c",
            &format!(
                "echo $$ > {} && exec {cmd}",
                self.0.join("cgroup.procs").display()
            ),
        ]);
        c
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Waits up to 10 s for a TCP listener on `port`; true if one appeared.
pub fn wait_listening(port: u16) -> bool {
    for _ in 0..100 {
        let up = Command::new("ss")
            .args(["-ltn", &format!("sport = :{port}")])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!(":{port}")))
            .unwrap_or(false);
        if up {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Whom a lab client program connects to and as whom, in secure-client's spelling
/// (`HOST --port PORT --certs DIR --name NAME`): flattened into each program's own arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct LabClientArgs {
    /// Server address.
    pub host: String,
    /// Server port.
    #[arg(long)]
    pub port: u16,
    /// Certificate directory (ca.pem, NAME.pem, NAME.key).
    #[arg(long)]
    pub certs: PathBuf,
    /// Client identity.
    #[arg(long)]
    pub name: String,
}

impl LabClientArgs {
    /// The library client settings for these arguments, each step bounded by `timeout`.
    pub fn config(&self, timeout: Duration) -> secure_rdma::client::ClientConfig {
        secure_rdma::client::ClientConfig::new(&self.host)
            .with_port(self.port)
            .with_ca(self.certs.join("ca.pem"))
            .with_identity(
                self.certs.join(format!("{}.pem", self.name)),
                self.certs.join(format!("{}.key", self.name)),
            )
            .with_timeout(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A child that writes more than a pipe holds (64 KiB) before it exits: `secure-client
    /// bench hold -n 1000` logs a line per session. Waiting without reading its pipes left it
    /// blocked in write(2) until the deadline killed it.
    #[test]
    fn a_child_with_more_output_than_a_pipe_holds_finishes_and_all_of_it_is_kept() {
        let script =
            "head -c 1048576 /dev/zero | tr '\\0' e >&2; head -c 300000 /dev/zero | tr '\\0' o";
        let out = wait_with_deadline(
            spawn(Command::new("sh").args(["-c", script])),
            Duration::from_secs(20),
            "a chatty child",
        );
        assert!(out.status.success(), "{:?}", out.status);
        assert_eq!(out.stderr.len(), 1 << 20);
        assert!(out.stderr.iter().all(|&b| b == b'e'));
        assert_eq!(out.stdout.len(), 300_000);
    }

    /// A child that never exits is killed at the deadline, and what it said is in the panic.
    #[test]
    #[should_panic(expected = "still running after")]
    fn a_hung_child_is_killed_at_the_deadline() {
        wait_with_deadline(
            spawn(Command::new("sh").args(["-c", "echo started >&2; exec sleep 60"])),
            Duration::from_millis(300),
            "a hung child",
        );
    }
}
