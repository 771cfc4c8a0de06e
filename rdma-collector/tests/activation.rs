//! `rdma-collector` started the way systemd starts `rdma-collector.service` from
//! `rdma-collector.socket`: the listening socket on descriptor 3, `LISTEN_FDS=1` and
//! `LISTEN_PID` set to the collector's own pid. Programs talk to it as the interceptor does
//! (`rdma_quota::wire`), and keep their socket path across a restart of the collector.
//! Also: without socket activation it still binds `--socket` itself.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a reply may take: a debug build starting under load answers within a second or two.
const REPLY_TIMEOUT: Duration = Duration::from_secs(20);

/// Starts the collector with `listener` as systemd passes it. `LISTEN_PID` must be the
/// collector's own pid, unknown before the fork; `sh` sets it to `$$` and `exec`s the
/// collector, which keeps that pid (what `systemd-socket-activate` does too).
/// A collector that is killed if the test fails before stopping it, so that it does not
/// outlive the test holding the test harness's pipes.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn spawn_activated(listener: &UnixListener, extra: &[&str]) -> Running {
    let fd = listener.as_raw_fd();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"LISTEN_PID=$$ exec "$0" "$@""#)
        .arg(env!("CARGO_BIN_EXE_rdma-collector"))
        .args(extra)
        .env("LISTEN_FDS", "1")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: between fork and exec only async-signal-safe calls (dup2, fcntl).
    unsafe {
        cmd.pre_exec(move || {
            if fd == 3 {
                // dup2(3, 3) would leave close-on-exec set: clear it instead.
                let flags = libc::fcntl(3, libc::F_GETFD);
                if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Running(Some(cmd.spawn().expect("spawn rdma-collector")))
}

/// Stops the collector as systemd does (SIGTERM) and returns its stderr.
fn stop(mut running: Running) -> String {
    let child = running.0.take().expect("running");
    // SAFETY: kill with a pid we spawned and have not reaped.
    let pid = libc::pid_t::try_from(child.id()).expect("pid fits pid_t");
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let out = child.wait_with_output().expect("wait for rdma-collector");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "exit {:?}:\n{stderr}", out.status);
    stderr
}

/// A program's connection, speaking the interceptor's protocol.
struct Program {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Program {
    fn connect(path: &Path) -> Program {
        let stream = UnixStream::connect(path).expect("connect to the collector socket");
        stream
            .set_read_timeout(Some(REPLY_TIMEOUT))
            .expect("read timeout");
        Program {
            reader: BufReader::new(stream.try_clone().expect("clone stream")),
            writer: stream,
        }
    }

    fn send(&mut self, request: &str) {
        self.writer
            .write_all(format!("{request}\n").as_bytes())
            .expect("send a request");
    }

    fn reply(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("read a reply");
        line.trim_end().to_owned()
    }

    fn ask(&mut self, request: &str) -> String {
        self.send(request);
        self.reply()
    }
}

/// Connects once the collector has bound `path` itself (no socket activation).
fn connect_when_bound(path: &Path, running: &mut Running) -> Program {
    let child = running.0.as_mut().expect("running");
    let deadline = Instant::now() + REPLY_TIMEOUT;
    loop {
        if let Ok(stream) = UnixStream::connect(path) {
            drop(stream);
            return Program::connect(path);
        }
        if let Some(status) = child.try_wait().expect("poll rdma-collector") {
            panic!("rdma-collector exited before listening: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{} never accepted",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serves_the_socket_systemd_passes_and_keeps_it_across_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("collector.sock");
    let own = dir.path().join("not-used.sock");
    let own_arg = own.to_str().expect("utf-8 path");
    let listener = UnixListener::bind(&path).expect("bind as systemd would");

    let collector = spawn_activated(&listener, &["--limit", "QP_COUNT=1", "--socket", own_arg]);
    let mut program = Program::connect(&path);
    assert_eq!(program.ask("HELLO activation-test"), "OK");
    assert_eq!(program.ask("ADMIT QP_CREATE"), "OK 1");
    assert!(
        program
            .ask("ADMIT QP_CREATE")
            .starts_with("DENY QP_COUNT limit 1"),
        "the quota from --limit applies"
    );
    let log = stop(collector);
    assert!(!own.exists(), "bound --socket despite activation:\n{log}");
    assert!(
        log.contains("collector listening") && log.contains(path.to_str().expect("utf-8")),
        "{log}"
    );
    // The socket is systemd's: it outlives the collector, and the closed connection's
    // ticket went with the collector that held it.
    assert!(path.exists(), "the collector removed systemd's socket");
    assert_eq!(program.reply(), "", "the old connection is closed");

    // A program that connects while no collector runs is queued by the kernel on the
    // same path and answered by the next collector.
    let mut waiting = Program::connect(&path);
    waiting.send("ADMIT QP_CREATE");
    let restarted = spawn_activated(&listener, &["--limit", "QP_COUNT=1"]);
    assert_eq!(
        waiting.reply(),
        "OK 1",
        "the restarted collector starts from no tickets and answers the queued program"
    );
    stop(restarted);
    assert!(path.exists());
}

#[test]
fn without_socket_activation_it_binds_and_removes_its_own_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("run").join("collector.sock");
    let mut collector = Running(Some(
        Command::new(env!("CARGO_BIN_EXE_rdma-collector"))
            .args(["--limit", "QP_COUNT=1", "--socket"])
            .arg(&path)
            // A stale LISTEN_FDS meant for another process (LISTEN_PID is not ours) is ignored.
            .env("LISTEN_FDS", "1")
            .env("LISTEN_PID", "1")
            .stdin(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rdma-collector"),
    ));
    let mut program = connect_when_bound(&path, &mut collector);
    assert_eq!(program.ask("ADMIT QP_CREATE"), "OK 1");
    assert!(program.ask("ADMIT QP_CREATE").starts_with("DENY"));
    stop(collector);
    assert!(!path.exists(), "its own socket is removed at exit");
}
