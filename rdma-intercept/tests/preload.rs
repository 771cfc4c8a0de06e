//! The preloaded object in a real process, on a host without RDMA: the
//! refusal paths never reach libibverbs' real functions, so null objects are
//! safe. What admitted calls do on real devices is the lab's test
//! (tests/tests/intercept_lab.rs).

mod common;

use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, Output};
use std::sync::mpsc;
use std::time::Duration;

/// The pid of a connected peer (`SO_PEERCRED`).
fn peer_pid(stream: &UnixStream) -> i32 {
    // SAFETY: all-zero is a valid ucred; getsockopt fills it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` outlive the call.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    assert_eq!(rc, 0, "SO_PEERCRED");
    cred.pid
}

/// A collector stand-in on a socket in `dir` that answers each request line with
/// `reply(line)` and reports the line (a `HELLO` it answers `OK`, as a version 2
/// collector, without reporting it); with `connects`, each connection first reports
/// "connect <pid>".
fn fake_collector(
    dir: &Path,
    connects: bool,
    reply: impl Fn(&str) -> String + Clone + Send + 'static,
) -> (std::path::PathBuf, mpsc::Receiver<String>) {
    let path = dir.join("collector.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let tx = tx.clone();
            if connects {
                let _ = tx.send(format!("connect {}", peer_pid(&stream)));
            }
            let reply = reply.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut writer = stream;
                let mut line = String::new();
                while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                    // The interceptor's HELLO on each new connection is answered as
                    // a version 2 collector would, and not reported: the tests
                    // count admissions.
                    if line.starts_with("HELLO ") {
                        if writer.write_all(b"OK\n").is_err() {
                            break;
                        }
                        line.clear();
                        continue;
                    }
                    let _ = tx.send(line.trim_end().to_owned());
                    if writer.write_all(reply(line.trim_end()).as_bytes()).is_err() {
                        break;
                    }
                    line.clear();
                }
            });
        }
    });
    (path, rx)
}

/// A collector stand-in that DENYs everything and reports each request
/// line, and for each connection "connect <pid>" first.
fn denying_collector(dir: &Path) -> (std::path::PathBuf, mpsc::Receiver<String>) {
    fake_collector(dir, true, |line| format!("DENY test limit for {line}\n"))
}

/// True (and says so) when this host has no libibverbs.so.1: the probe cannot start.
fn skipped_without_libibverbs() -> bool {
    // SAFETY: loading a system library by soname, to probe for it.
    let handle = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), libc::RTLD_LAZY) };
    if handle.is_null() {
        eprintln!("skipped: libibverbs.so.1 is not installed on this host");
    }
    handle.is_null()
}

fn probe(call: &str, env: &[(&str, &dyn AsRef<OsStr>)]) -> Output {
    probe_args(&[call], env)
}

/// The probe example under the interceptor with `args`, and `env` on top of the default
/// (fail closed) settings.
fn probe_args(args: &[&str], env: &[(&str, &dyn AsRef<OsStr>)]) -> Output {
    let mut cmd = Command::new(common::example("preload-probe"));
    cmd.args(args)
        .env("LD_PRELOAD", common::cdylib())
        .env_remove("RDMA_INTERCEPT_FAIL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("running preload-probe")
}

/// The probe's `elapsed_ms=N` line's N; `stdout`, all of it, for the failure message.
fn elapsed_ms(line: Option<&&str>, stdout: &str) -> u64 {
    line.and_then(|l| l.strip_prefix("elapsed_ms="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no elapsed_ms in {stdout}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn refused_creations_return_null_with_edquot_and_say_why() {
    if skipped_without_libibverbs() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (socket, seen) = denying_collector(dir.path());
    let cases = [
        ("create_qp", "ADMIT QP_CREATE", "QP_CREATE"),
        ("alloc_pd", "ADMIT PD_ALLOC", "PD_ALLOC"),
        ("create_cq", "ADMIT CQ_CREATE", "CQ_CREATE"),
        ("reg_mr", "ADMIT MR_REG 4096", "MR_REG"),
        ("reg_mr_iova2", "ADMIT MR_REG 4096", "MR_REG"),
    ];
    for (call, request, verb) in cases {
        let out = probe(call, &[("RDMA_COLLECTOR", &socket)]);
        assert!(out.status.success(), "{call}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout), "null errno=122\n", "{call}: EDQUOT");
        assert_eq!(
            text(&out.stderr),
            format!("rdma-intercept: {verb} refused: test limit for {request}\n"),
            "{call}"
        );
        let connect = seen
            .recv_timeout(Duration::from_secs(5))
            .expect("connected");
        assert!(connect.starts_with("connect "), "{connect}");
        let line = seen
            .recv_timeout(Duration::from_secs(5))
            .expect("the collector was asked");
        assert_eq!(line, request, "{call}");
    }
    // One request per call: nothing else was sent.
    assert!(seen.recv_timeout(Duration::from_millis(100)).is_err());
}

#[test]
fn without_a_collector_creations_fail_closed() {
    if skipped_without_libibverbs() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("absent.sock");
    let out = probe("create_qp", &[("RDMA_COLLECTOR", &socket)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "null errno=13\n", "EACCES");
    assert_eq!(
        text(&out.stderr),
        format!(
            "rdma-intercept: collector at {} unreachable: connect: No such file or directory \
             (os error 2); refusing QP_CREATE (RDMA_INTERCEPT_FAIL=closed)\n",
            socket.display()
        )
    );
}

#[test]
fn a_forked_child_asks_on_its_own_connection() {
    if skipped_without_libibverbs() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (socket, seen) = denying_collector(dir.path());
    let out = probe_args(&["create_qp", "--fork"], &[("RDMA_COLLECTOR", &socket)]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert_eq!(lines[0], "null errno=122");
    let child_pid: i32 = lines[1]
        .strip_prefix("child null errno=122 pid=")
        .unwrap_or_else(|| panic!("child line {:?}", lines[1]))
        .parse()
        .expect("pid");
    let mut events: Vec<String> = (0..4)
        .map(|_| seen.recv_timeout(Duration::from_secs(5)).expect("event"))
        .collect();
    // Each connection's "connect" precedes its request; across the two
    // connections the order is the scheduler's.
    let connects: Vec<i32> = events
        .iter()
        .filter_map(|e| e.strip_prefix("connect "))
        .map(|p| p.parse().expect("pid"))
        .collect();
    assert_eq!(connects.len(), 2, "two connections: {events:?}");
    assert!(
        connects.contains(&child_pid),
        "{connects:?} vs child {child_pid}"
    );
    assert_ne!(
        connects[0], connects[1],
        "parent and child each have their own"
    );
    events.retain(|e| !e.starts_with("connect "));
    assert_eq!(events, ["ADMIT QP_CREATE", "ADMIT QP_CREATE"]);
}

/// A collector stand-in that refuses every `ADMIT` as a rate limit would,
/// with a retry time of `retry_ms` (protocol version 2), and reports each
/// request line.
fn rate_limited_collector(
    dir: &Path,
    retry_ms: u64,
) -> (std::path::PathBuf, mpsc::Receiver<String>) {
    fake_collector(dir, false, move |_| {
        format!(
            "DENY CQ_CREATE limit 1/s exceeded globally (1 calls in the last \
             second); retry_after_ms={retry_ms}\n"
        )
    })
}

#[test]
fn repeated_refusals_are_answered_without_asking_until_the_retry_time() {
    if skipped_without_libibverbs() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // One second (the most the interceptor believes): far longer than the
    // 500 calls take, so exactly one of them may ask.
    let (socket, seen) = rate_limited_collector(dir.path(), 1000);
    let out = probe_args(
        &["create_cq", "--repeat", "500"],
        &[("RDMA_COLLECTOR", &socket)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    let elapsed_ms = elapsed_ms(lines.last(), &stdout);
    assert!(
        elapsed_ms < 1000,
        "500 calls took {elapsed_ms} ms: the test needs them within the retry time"
    );
    assert_eq!(lines.len(), 501, "{stdout}");
    assert!(
        lines[..500].iter().all(|l| *l == "null errno=122"),
        "{stdout}"
    );
    assert_eq!(
        seen.recv_timeout(Duration::from_secs(5))
            .expect("asked once"),
        "ADMIT CQ_CREATE"
    );
    assert!(
        seen.recv_timeout(Duration::from_millis(100)).is_err(),
        "the collector was asked more than once for 500 refusals"
    );
    // One line for the collector's refusal; the 499 repeats are silent.
    assert_eq!(
        text(&out.stderr),
        "rdma-intercept: CQ_CREATE refused: CQ_CREATE limit 1/s exceeded globally (1 calls in \
         the last second); refusing CQ_CREATE here for the next 1000 ms without asking the \
         collector\n"
    );
}

#[test]
fn wait_mode_sleeps_to_each_retry_time_and_gives_up_at_the_maximum_wait() {
    if skipped_without_libibverbs() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    // Every answer says "in 100 ms"; the call may wait 350 ms in all. (The
    // probe's objects are null, so this collector never admits.)
    let (socket, seen) = rate_limited_collector(dir.path(), 100);
    let out = probe_args(
        &["create_cq", "--repeat", "1"],
        &[
            ("RDMA_COLLECTOR", &socket),
            ("RDMA_INTERCEPT_ON_LIMIT", &"wait"),
            ("RDMA_INTERCEPT_MAX_WAIT_MS", &"350"),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"null errno=122"), "{stdout}");
    let elapsed_ms = elapsed_ms(lines.get(1), &stdout);
    // It slept to each retry time and asked again: at t = 0, 100, 200 and
    // 300 ms at the earliest (later on a slow host); it gave up when the
    // next time (400 ms) passed the 350 ms bound, not before.
    let asked: Vec<String> =
        std::iter::from_fn(|| seen.recv_timeout(Duration::from_millis(200)).ok()).collect();
    assert!(
        (2..=4).contains(&asked.len()) && asked.iter().all(|l| l == "ADMIT CQ_CREATE"),
        "{asked:?}"
    );
    let slept = 100 * (asked.len() as u64 - 1);
    assert!(
        elapsed_ms >= slept && elapsed_ms < 350 + 2000,
        "{elapsed_ms} ms for {} requests",
        asked.len()
    );
    // Waiting is quiet; giving up says why, once.
    assert_eq!(
        text(&out.stderr),
        "rdma-intercept: CQ_CREATE refused: its rate limit admits no call within \
         RDMA_INTERCEPT_MAX_WAIT_MS=350 of this one (EDQUOT; this note is printed once)\n"
    );
}
