//! Fixtures for the secure server/client lab tests: a PKI in a temporary
//! directory, a `secure-server` process whose JSON log lines are collected,
//! and `secure-client` commands.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{bin_dir, rdma_resources_of, wait_with_deadline, Sysctl, ADDR_A};

/// A CA, a server certificate for the lab address and client certificates.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// Creates a CA and a server certificate valid for 10.77.0.1.
    pub fn new() -> Pki {
        let dir = tempfile::tempdir().expect("tempdir");
        secure_rdma::certs::init(dir.path(), &[ADDR_A.to_owned(), "localhost".to_owned()])
            .expect("certs init");
        Pki { dir }
    }

    /// The directory (`--certs`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Issues client certificates for these names.
    pub fn clients(&self, names: &[String]) {
        for n in names {
            secure_rdma::certs::issue_client(self.dir(), n).expect("issue client");
        }
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

/// Lines a child wrote, shared with the thread reading them.
#[derive(Clone, Default)]
pub struct Lines(Arc<(Mutex<Collected>, Condvar)>);

/// What the reading thread has collected.
#[derive(Default)]
struct Collected {
    lines: Vec<String>,
    /// The writer closed its end (or a read failed): no more lines will come.
    closed: bool,
}

impl Lines {
    /// Starts a thread copying `r` line by line.
    pub fn collect(r: impl std::io::Read + Send + 'static) -> Lines {
        let lines = Lines::default();
        let sink = lines.clone();
        std::thread::spawn(move || {
            let (m, cv) = &*sink.0;
            for line in BufReader::new(r).lines() {
                let Ok(line) = line else { break };
                m.lock().unwrap().lines.push(line);
                cv.notify_all();
            }
            m.lock().unwrap().closed = true;
            cv.notify_all();
        });
        lines
    }

    /// A copy of every line so far.
    pub fn snapshot(&self) -> Vec<String> {
        self.0 .0.lock().unwrap().lines.clone()
    }

    /// Waits until `count` lines satisfy `pred` and returns the first of them (empty if none
    /// and `count` is 0); fails the test at the deadline.
    pub fn wait_for(
        &self,
        what: &str,
        count: usize,
        deadline: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> String {
        let (m, cv) = &*self.0;
        let start = Instant::now();
        let mut g = m.lock().unwrap();
        loop {
            let mut matching = g.lines.iter().filter(|l| pred(l));
            let first = matching.next();
            if usize::from(first.is_some()) + matching.count() >= count {
                return first.cloned().unwrap_or_default();
            }
            let left = deadline.checked_sub(start.elapsed()).unwrap_or_else(|| {
                panic!(
                    "timed out waiting for {count} x {what}; lines:\n{}",
                    g.lines.join("\n")
                )
            });
            g = cv.wait_timeout(g, left).unwrap().0;
        }
    }

    /// Waits until the writer closed its end, so that every line it wrote is here (a process
    /// that exited may still have lines in the pipe); false if it had not within `deadline`
    /// (a grandchild may hold the pipe open).
    pub fn wait_closed(&self, deadline: Duration) -> bool {
        let (m, cv) = &*self.0;
        let start = Instant::now();
        let mut g = m.lock().unwrap();
        while !g.closed {
            let Some(left) = deadline.checked_sub(start.elapsed()) else {
                return false;
            };
            g = cv.wait_timeout(g, left).unwrap().0;
        }
        true
    }

    /// JSON log events (lines that parse as objects).
    pub fn events(&self) -> Vec<Value> {
        self.snapshot()
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(Value::is_object)
            .collect()
    }
}

/// A running `secure-server`.
pub struct ServerProc {
    /// The process.
    pub child: Child,
    /// Its stderr (JSON log lines).
    pub log: Lines,
    /// The port it listens on.
    pub port: u16,
}

/// Path of a workspace binary.
pub fn bin(name: &str) -> PathBuf {
    bin_dir().join(name)
}

/// `secure-server --listen 10.77.0.1:PORT --log-format json` with `RUST_LOG` set to `filter`:
/// the caller adds its certificates and other arguments and starts it with
/// [`ServerProc::spawn`].
pub fn server_command(port: u16, filter: &str) -> Command {
    let mut cmd = Command::new(bin("secure-server"));
    cmd.args([
        "--listen",
        &format!("{ADDR_A}:{port}"),
        "--log-format",
        "json",
    ])
    .env("RUST_LOG", filter);
    cmd
}

impl ServerProc {
    /// Starts `secure-server` on 10.77.0.1:`port` and waits until it is ready.
    pub fn start(pki: &Pki, port: u16, extra: &[&str]) -> ServerProc {
        ServerProc::start_with_log(pki, port, extra, "info,secure_rdma=debug")
    }

    /// [`ServerProc::start`] with `RUST_LOG` set to `filter`.
    pub fn start_with_log(pki: &Pki, port: u16, extra: &[&str], filter: &str) -> ServerProc {
        let mut cmd = server_command(port, filter);
        cmd.arg("--certs").arg(pki.dir()).args(extra);
        ServerProc::spawn(cmd, port)
    }

    /// Starts `cmd` (a [`server_command`] for `port` with its certificate and other arguments
    /// added) and waits until it is ready.
    pub fn spawn(mut cmd: Command, port: u16) -> ServerProc {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn secure-server");
        let log = Lines::collect(child.stderr.take().expect("stderr"));
        // With --telemetry the server loads and attaches eBPF programs first.
        log.wait_for("secure-server ready", 1, STEP, |l| {
            l.contains("secure-server ready")
        });
        ServerProc { child, log, port }
    }

    /// The server's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS")
    }

    /// Runs `f` and returns its result with this server's resident memory in KiB: before
    /// `f`, and the peak while `f` ran (sampled every 250 ms until it returns, also when it
    /// panics).
    pub fn rss_during<T>(&self, f: impl FnOnce() -> T) -> (u64, u64, T) {
        /// Sets its flag when dropped: the watch stops however `f` ends.
        struct SetOnDrop<'a>(&'a AtomicBool);
        impl Drop for SetOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let idle = self.rss_kib();
        let done = AtomicBool::new(false);
        let (peak, out) = std::thread::scope(|s| {
            let watch = s.spawn(|| {
                let mut peak = idle;
                while !done.load(Ordering::Relaxed) {
                    peak = peak.max(self.rss_kib());
                    std::thread::sleep(Duration::from_millis(250));
                }
                peak
            });
            let stop = SetOnDrop(&done);
            let out = f();
            drop(stop);
            (watch.join().expect("rss watch"), out)
        });
        (idle, peak, out)
    }

    /// Sends a signal to the server.
    pub fn signal(&self, sig: i32) {
        // SAFETY: plain kill(2) on our own child.
        let rc = unsafe { libc::kill(self.pid() as i32, sig) };
        assert_eq!(rc, 0, "kill({sig})");
    }

    /// Log events with this message.
    pub fn events(&self, message: &str) -> Vec<Value> {
        self.log
            .events()
            .into_iter()
            .filter(|e| e["message"] == message)
            .collect()
    }

    /// The messages the server delivered as `kind` ("SEND received", "WRITE landed"), as
    /// (client, seq, content) in log order.
    pub fn delivered(&self, kind: &str) -> Vec<(String, u64, String)> {
        self.events(kind)
            .into_iter()
            .map(|e| {
                (
                    e["client"].as_str().unwrap_or("").to_owned(),
                    e["seq"].as_u64().unwrap_or(0),
                    unquote(&e["content"]),
                )
            })
            .collect()
    }

    /// Its "failed authentication" warnings (a message refused by the AEAD checks), in log
    /// order.
    pub fn auth_failures(&self) -> Vec<Value> {
        self.log
            .events()
            .into_iter()
            .filter(|e| {
                e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("failed authentication"))
            })
            .collect()
    }
}

/// `GET /metrics` from a `secure-server --metrics ADDR` (HTTP/1.0): the whole response, status
/// line included, so a failed assertion shows what the server answered.
pub fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr)
        .unwrap_or_else(|e| panic!("connect to the metrics endpoint {addr}: {e}"));
    stream.set_read_timeout(Some(STEP)).expect("read timeout");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("GET /metrics");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the metrics");
    response
}

/// The value of one sample of a [`scrape`]d page, `series` written as the page writes it
/// (`name{label="value"}`); `None` when the page has no such sample.
pub fn sample(page: &str, series: &str) -> Option<f64> {
    page.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// A log field rendered with `{:?}` ("\"text\"") back to the text.
pub fn unquote(v: &Value) -> String {
    let s = v.as_str().unwrap_or("");
    s.strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .unwrap_or(s)
        .to_owned()
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `secure-client` command for client `name` against `server`.
pub fn client(pki: &Pki, server: &ServerProc, name: Option<&str>) -> Command {
    client_command(pki.dir(), server.port, name, 10)
}

/// `secure-client bench hold -n N` as client `hold` against `server`: 16 connections in
/// flight, every session held 2 s, its report as one JSON line.
pub fn bench_hold(pki: &Pki, server: &ServerProc, n: u64) -> Command {
    bench_hold_with(pki, server, n, &[])
}

/// [`bench_hold`] with the client's own `flags` (before the subcommand).
pub fn bench_hold_with(pki: &Pki, server: &ServerProc, n: u64, flags: &[&str]) -> Command {
    let mut cmd = client(pki, server, Some("hold"));
    cmd.args(flags);
    cmd.args(["bench", "hold", "-n", &n.to_string()]).args([
        "--concurrency",
        "16",
        "--hold",
        "2",
        "--json",
    ]);
    cmd
}

/// A `secure-client` command for client `name` against 10.77.0.1:`port` (any server
/// program), each step bounded by `timeout_secs`.
pub fn client_command(certs: &Path, port: u16, name: Option<&str>, timeout_secs: u64) -> Command {
    let mut cmd = Command::new(bin("secure-client"));
    cmd.arg(ADDR_A)
        .args(["--port", &port.to_string(), "--certs"])
        .arg(certs)
        .args([
            "--log-format",
            "json",
            "--timeout",
            &timeout_secs.to_string(),
        ])
        .env("RUST_LOG", "secure_rdma=debug");
    if let Some(n) = name {
        cmd.args(["--name", n]);
    }
    cmd
}

/// How long a lab step may take under emulation before the test fails.
const STEP: Duration = Duration::from_secs(90);

/// A client kept connected: its stdin stays open until [`Held::quit`].
pub struct Held {
    /// The client process.
    pub child: Child,
    /// Its stdout lines.
    pub out: Lines,
}

impl Held {
    /// Starts `cmd` with a piped stdin, so it waits for commands.
    pub fn start(mut cmd: Command) -> Held {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn client");
        let out = Lines::collect(child.stdout.take().expect("stdout"));
        Held { child, out }
    }

    /// Waits for the "connected to" line.
    pub fn wait_connected(&self) {
        self.out
            .wait_for("connected", 1, STEP, |l| l.starts_with("connected to "));
    }

    /// Sends `quit` and waits for the exit.
    pub fn quit(mut self) -> std::process::ExitStatus {
        if let Some(stdin) = self.child.stdin.as_mut() {
            let _ = stdin.write_all(b"quit\n");
        }
        drop(self.child.stdin.take());
        wait_with_deadline(self.child, STEP, "held client").status
    }
}

/// Lines of [`rdma_resources_of`] of one kind (`qp`, `pd`, `cq`, `mr`).
pub fn count_kind(lines: &[String], kind: &str) -> usize {
    lines
        .iter()
        .filter(|l| l.starts_with(&format!("{kind}:")))
        .count()
}

/// Waits until `pid` holds exactly `want_qps` QPs (and nothing at all for 0).
pub fn wait_resources(pid: u32, want_qps: usize, deadline: Duration) -> Vec<String> {
    let start = Instant::now();
    loop {
        let now = rdma_resources_of(pid);
        if count_kind(&now, "qp") == want_qps && (want_qps > 0 || now.is_empty()) {
            return now;
        }
        assert!(
            start.elapsed() < deadline,
            "pid {pid}: expected {want_qps} QPs within {deadline:?}, have {now:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// TCP buffers of 8 KiB for the sockets opened while the guards live (the kernel reads these
/// when a socket is created; autotuning stays within the maximum). With the defaults, the
/// server's writes block only once the client's 128 KiB receive buffer and the server's send
/// buffer (autotuned up to 4 MiB) hold the acknowledgements: at the 28 SENDs a second the
/// hostile client once managed under TCG, 3,018 acknowledgements in 120 s did not fill them.
/// A bound in bytes, not in the VM's speed: a few hundred acknowledgements fill 8 KiB.
pub fn small_tcp_buffers() -> [Sysctl; 2] {
    [
        Sysctl::set("net.ipv4.tcp_rmem", "4096 8192 8192"),
        Sysctl::set("net.ipv4.tcp_wmem", "4096 8192 8192"),
    ]
}

/// `hostile-client` (`tests/src/bin/hostile-client.rs`) as `name` against `server`: connects,
/// then SENDs without ever reading its TLS socket; its JSON progress lines collected.
pub fn hostile_client(pki: &Pki, server: &ServerProc, name: &str) -> (std::process::Child, Lines) {
    hostile_client_with(pki, server, name, &[])
}

/// [`hostile_client`] with more of its flags (`--interval-ms`, `--count`).
pub fn hostile_client_with(
    pki: &Pki,
    server: &ServerProc,
    name: &str,
    extra: &[&str],
) -> (std::process::Child, Lines) {
    let mut child = Command::new(bin("hostile-client"))
        .arg(ADDR_A)
        .args([
            "--port",
            &server.port.to_string(),
            "--name",
            name,
            // Its last send never completes once the server is gone: 20 s, not the default 60,
            // before it reports that and exits.
            "--timeout",
            "20",
            "--certs",
        ])
        .arg(pki.dir())
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn hostile-client");
    let out = Lines::collect(child.stdout.take().expect("stdout"));
    (child, out)
}
