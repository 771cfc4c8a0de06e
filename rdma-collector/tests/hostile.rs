//! The `rdma-collector` binary against hostile local users (issue 12): a
//! flood of idle connections from several uids with the descriptor limit
//! below it, a connection asking for 65,536 tickets, and a cgroup named like
//! another tenant's in a delegated subtree.
//!
//! These need root (other uids, real cgroups); they are skipped without it,
//! except under `CI=true`, where a skip would hide a failure.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::FromRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdma_collector::ConnectionBounds;

/// Whether the test can run: as root; otherwise it is skipped, or fails in CI.
fn privileged(what: &str) -> bool {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    assert_ne!(
        std::env::var("CI").as_deref(),
        Ok("true"),
        "{what} needs root, which CI has"
    );
    eprintln!("skipped: {what} needs root");
    false
}

/// A collector process with its stderr in a file.
struct Collector {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    log: PathBuf,
    child: Child,
}

impl Collector {
    fn spawn(args: &[&str], fd_limit: Option<u64>) -> Collector {
        let dir = tempfile::tempdir().expect("temp dir");
        // Other uids must reach the socket.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let socket = dir.path().join("run/collector.sock");
        let log = dir.path().join("collector.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_rdma-collector"));
        cmd.arg("--socket")
            .arg(&socket)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        if let Some(n) = fd_limit {
            // SAFETY: only setrlimit between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd.spawn().expect("start rdma-collector");
        let c = Collector {
            _dir: dir,
            socket,
            log,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while UnixStream::connect(&c.socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "collector did not start: {}",
                c.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        c
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn log_bytes(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }

    /// Peak resident memory so far, in KB.
    fn peak_rss_kb(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM")
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects without blocking on a full backlog: retries until `deadline`.
fn connect_by(path: &Path, deadline: Instant) -> Option<UnixStream> {
    loop {
        // SAFETY: plain socket calls on a descriptor we own.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        // SAFETY: we own `fd`.
        let stream = unsafe { UnixStream::from_raw_fd(fd) };
        let sun = sockaddr(path);
        // SAFETY: `sun` is a valid address of the given size.
        let rc = unsafe {
            libc::connect(
                fd,
                (&sun as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            stream.set_nonblocking(false).expect("blocking");
            return Some(stream);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sends one request line and reads the reply within `timeout`.
fn ask(stream: &mut UnixStream, request: &str, timeout: Duration) -> std::io::Result<String> {
    stream.set_read_timeout(Some(timeout))?;
    stream.write_all(format!("{request}\n").as_bytes())?;
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte)? {
            0 => return Ok("<closed>".into()),
            _ if byte[0] == b'\n' => break,
            _ => reply.push(byte[0]),
        }
    }
    Ok(String::from_utf8_lossy(&reply).into_owned())
}

/// Runs `f` on a thread whose effective uid is `uid` (the raw syscall changes
/// only the calling thread; SO_PEERCRED records the connecting thread's).
fn as_uid<T: Send>(uid: u32, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setresuid on this thread only; saved uid 0 is kept.
            let rc = unsafe { libc::syscall(libc::SYS_setresuid, uid, uid, 0) };
            assert_eq!(rc, 0, "setresuid: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("uid thread")
    })
}

#[test]
fn a_new_program_is_answered_within_a_second_under_fd_pressure() {
    if !privileged("connecting as other uids") {
        return;
    }
    // Descriptor limit 100; 300 idle connections from two uids. Before,
    // the collector sat at EMFILE and a new program waited forever, which the
    // fail-closed interceptor turns into EACCES for everyone.
    let c = Collector::spawn(&["--idle-timeout", "600"], Some(100));
    let mut holder = UnixStream::connect(&c.socket).expect("holder");
    let step = Duration::from_secs(5);
    assert_eq!(
        ask(&mut holder, "ADMIT PD_ALLOC", step).expect("admit"),
        "OK 1"
    );

    let deadline = Instant::now() + Duration::from_secs(20);
    let mut idle = Vec::new();
    for uid in [65_534, 65_533] {
        let socket = c.socket.clone();
        idle.extend(as_uid(uid, move || {
            (0..150)
                .filter_map(|_| connect_by(&socket, deadline))
                .collect::<Vec<_>>()
        }));
    }
    eprintln!("{} idle connections made", idle.len());

    let start = Instant::now();
    let budget = Duration::from_secs(1);
    let mut program = connect_by(&c.socket, start + budget).expect("connected within 1 s");
    let left = |start: Instant| {
        budget
            .saturating_sub(start.elapsed())
            .max(Duration::from_millis(1))
    };
    let hello = ask(&mut program, "HELLO new-program", left(start));
    let admit = ask(&mut program, "ADMIT QP_CREATE", left(start));
    let took = start.elapsed();
    eprintln!("new program answered in {took:?}: {hello:?} {admit:?}");
    assert_eq!(hello.as_deref().ok(), Some("OK"), "{}", c.log_text());
    assert!(
        admit.as_deref().is_ok_and(|a| a.starts_with("OK ")),
        "{admit:?}"
    );
    assert!(took < budget, "answered after {took:?}");
    // The connection holding a ticket was never closed to make room.
    let stats = ask(&mut holder, "STATS", step).expect("holder still served");
    assert!(stats.starts_with("OK global QP=1 PD=1 "), "{stats}");
    // Accept errors did not flood the log.
    assert!(c.log_bytes() < 64 * 1024, "log {} bytes", c.log_bytes());
    drop(idle);
}

#[test]
fn a_full_descriptor_table_answers_with_the_reason_and_backs_off() {
    if !privileged("lowering the collector's descriptor limit") {
        return;
    }
    // Twenty programs hold tickets (none can be closed for room); then the
    // descriptor limit drops to what is open, so every accept fails with
    // EMFILE. Before, the collector logged and retried, and a new program
    // waited in the backlog for ever.
    let c = Collector::spawn(&[], Some(100));
    let step = Duration::from_secs(5);
    let mut holders: Vec<UnixStream> = (0..20)
        .map(|_| UnixStream::connect(&c.socket).expect("holder"))
        .collect();
    for h in &mut holders {
        assert_eq!(ask(h, "ADMIT PD_ALLOC", step).expect("admit"), "OK 1");
    }
    let pid = libc::pid_t::try_from(c.child.id()).expect("pid");
    // RLIMIT_NOFILE bounds descriptor numbers: at the lowest free number no
    // new descriptor can be had, except by closing one (the spare, opened at
    // start). Read once the holders' identifications have closed theirs.
    std::thread::sleep(Duration::from_millis(200));
    let open: std::collections::BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fds")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let lowest_free = (0..).find(|n| !open.contains(n)).expect("a free number");
    let limit = libc::rlimit {
        rlim_cur: lowest_free,
        rlim_max: 100,
    };
    // SAFETY: sets our child's limit; no old value asked for.
    let rc = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &limit, std::ptr::null_mut()) };
    assert_eq!(rc, 0, "prlimit: {}", std::io::Error::last_os_error());

    // A burst of newcomers: each is answered at once, with the reason.
    let start = Instant::now();
    for i in 0..200 {
        let mut s = connect_by(&c.socket, Instant::now() + Duration::from_secs(1))
            .unwrap_or_else(|| panic!("connection {i} not accepted within 1 s"));
        s.set_read_timeout(Some(Duration::from_secs(1)))
            .expect("timeout");
        let mut reply = String::new();
        BufReader::new(&mut s)
            .read_line(&mut reply)
            .unwrap_or_else(|e| panic!("newcomer {i} not answered: {e}\n{}", c.log_text()));
        // On the spare descriptor, from identification (if a descriptor was
        // free), or when closed to make room for the next newcomer.
        assert!(
            reply.starts_with("ERR ")
                && (reply.contains("out of file descriptors")
                    || reply.contains("Too many open files")
                    || reply.contains("to make room"))
                && reply.trim_end().ends_with("try again later"),
            "newcomer {i}: {reply:?}; collector log:\n{}",
            c.log_text()
        );
    }
    eprintln!("200 newcomers answered in {:?}", start.elapsed());
    // The programs holding tickets are still served.
    let stats = ask(&mut holders[0], "STATS", step).expect("stats");
    assert!(stats.starts_with("OK global QP=0 PD=20 "), "{stats}");
    // Warnings about it are rate-limited.
    let log = c.log_text();
    let warnings = log.matches("accept failed").count();
    eprintln!("{warnings} accept warnings");
    assert!(
        (1..=30).contains(&warnings),
        "{warnings} accept warnings:\n{log}"
    );
}

/// Pipelines `n` identical requests and counts the replies.
fn flood(socket: &Path, request: &str, n: usize) -> (usize, Vec<String>) {
    let mut stream = UnixStream::connect(socket).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut writer = stream.try_clone().expect("clone");
    let line = format!("{request}\n").repeat(n);
    let sender = std::thread::spawn(move || writer.write_all(line.as_bytes()));
    let mut reader = BufReader::new(&mut stream);
    let (mut ok, mut denied) = (0, Vec::new());
    let mut reply = String::new();
    for _ in 0..n {
        reply.clear();
        reader.read_line(&mut reply).expect("reply");
        match reply.trim_end().strip_prefix("DENY ") {
            Some(reason) => denied.push(reason.to_owned()),
            None => {
                assert!(reply.starts_with("OK "), "{reply:?}");
                ok += 1;
            }
        }
    }
    sender.join().expect("sender").expect("send");
    // Keep the connection (and its tickets) until the counts are checked.
    std::mem::forget(stream);
    (ok, denied)
}

#[test]
fn ticket_caps_hold_and_the_log_stays_small() {
    if !privileged("reading the collector's memory") {
        return;
    }
    // Before: one connection took all 65,536 tickets (7.8 MB) and wrote
    // 11 MB of log in 0.4 s.
    let c = Collector::spawn(&["--max-tickets-per-uid", "10000"], None);
    let per_connection = ConnectionBounds::default().tickets;
    let (ok, denied) = flood(&c.socket, "ADMIT PD_ALLOC", 65_536);
    assert_eq!(ok, per_connection);
    assert_eq!(denied.len(), 65_536 - per_connection);
    let reason = format!(
        "{per_connection} live tickets on one connection is the collector's maximum \
         (--max-tickets-per-connection)"
    );
    assert!(denied.iter().all(|r| *r == reason), "{:?}", denied.first());
    // A second connection of the same uid gets what the uid has left.
    let (ok, denied) = flood(&c.socket, "ADMIT CQ_CREATE", 65_536);
    assert_eq!(ok, 10_000 - per_connection);
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let reason = format!(
        "10000 live tickets for uid {uid} is the collector's maximum (--max-tickets-per-uid)"
    );
    assert!(denied.iter().all(|r| *r == reason), "{:?}", denied.first());
    let rss = c.peak_rss_kb();
    let log = c.log_bytes();
    eprintln!("131072 requests: peak RSS {rss} KB, log {log} bytes");
    assert!(rss < 32 * 1024, "peak RSS {rss} KB");
    assert!(log < 64 * 1024, "log {log} bytes:\n{}", c.log_text());
}

/// Where cgroup v2 is mounted, from /proc/self/mountinfo.
fn cgroup2_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mount = left.split_whitespace().nth(4)?;
        (right.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(mount))
    })
}

/// A cgroup tree made for the test, this process moved back and the tree
/// removed at the end.
struct Cgroups {
    root: PathBuf,
    base: PathBuf,
    home: PathBuf,
}

impl Cgroups {
    fn enter(&self, relative: &str) {
        let procs = self.base.join(relative).join("cgroup.procs");
        std::fs::write(&procs, std::process::id().to_string())
            .unwrap_or_else(|e| panic!("{}: {e}", procs.display()));
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        let _ = std::fs::write(
            self.root
                .join(self.home.strip_prefix("/").unwrap_or(&self.home))
                .join("cgroup.procs"),
            std::process::id().to_string(),
        );
        for dir in [
            "lab/alice",
            "lab",
            "users/mallory/alice",
            "users/mallory",
            "users",
            "",
        ] {
            let _ = std::fs::remove_dir(self.base.join(dir));
        }
    }
}

/// Creates `/<name>/lab/alice` and `/<name>/users/mallory/alice` in the
/// cgroup v2 hierarchy, or says why the test is skipped.
fn make_cgroups(tag: &str) -> Option<(Cgroups, String)> {
    if !privileged("creating cgroups") {
        return None;
    }
    let in_ci = std::env::var("CI").as_deref() == Ok("true");
    let Some(root) = cgroup2_mount() else {
        assert!(!in_ci, "no cgroup v2 in CI");
        eprintln!("skipped: no cgroup v2 mounted");
        return None;
    };
    let home = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|t| rdma_quota::cgroup::parse_v2_path(&t))
        .expect("our cgroup v2 path");
    let name = format!("secure-rdma-{tag}-{}", std::process::id());
    let cg = Cgroups {
        base: root.join(&name),
        root,
        home: PathBuf::from(home),
    };
    for dir in ["lab/alice", "users/mallory/alice"] {
        if let Err(e) = std::fs::create_dir_all(cg.base.join(dir)) {
            assert!(!in_ci, "cgroups: {e}");
            eprintln!("skipped: cannot create cgroups: {e}");
            return None;
        }
    }
    Some((cg, name))
}

#[test]
fn a_cgroup_named_like_another_tenant_does_not_get_its_quota() {
    let Some((cg, name)) = make_cgroups("spoof") else {
        return;
    };
    let alice = format!("/{name}/lab/alice");
    let mallory = format!("/{name}/users/mallory/alice");
    let c = Collector::spawn(
        &[
            "--tenant-by",
            "cgroup",
            "--limit",
            &format!("tenant:{alice}:QP_COUNT=1"),
        ],
        None,
    );
    let step = Duration::from_secs(5);
    // Mallory, delegated /users/mallory, names a cgroup "alice". Her tenant
    // is identified (and fixed) by the time the collector answers.
    cg.enter("users/mallory/alice");
    let mut m = UnixStream::connect(&c.socket).expect("mallory");
    assert_eq!(ask(&mut m, "HELLO mallory", step).expect("hello"), "OK");
    cg.enter("lab/alice");
    let mut a = UnixStream::connect(&c.socket).expect("alice");
    assert_eq!(ask(&mut a, "HELLO alice", step).expect("hello"), "OK");
    drop(cg);

    // Mallory's QPs are hers, not alice's: alice still gets her one.
    assert_eq!(ask(&mut m, "ADMIT QP_CREATE", step).expect("admit"), "OK 1");
    assert_eq!(ask(&mut m, "ADMIT QP_CREATE", step).expect("admit"), "OK 2");
    assert_eq!(ask(&mut a, "ADMIT QP_CREATE", step).expect("admit"), "OK 1");
    assert_eq!(
        ask(&mut a, "ADMIT QP_CREATE", step).expect("admit"),
        format!("DENY QP_COUNT limit 1 reached for tenant {alice} (1 live)")
    );
    let stats = ask(&mut m, "STATS", step).expect("stats");
    assert!(
        stats.ends_with(&format!("tenant {mallory} QP=2 PD=0 CQ=0 MR=0 MR_BYTES=0")),
        "{stats}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycled_pid_does_not_lend_its_cgroup() {
    let Some((cg, name)) = make_cgroups("reuse") else {
        return;
    };
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("collector.sock");
    let quotas = rdma_quota::Quotas::default();
    // Bound but not accepting yet: the connection waits in the backlog.
    let collector = rdma_collector::Collector::bind(
        &path,
        quotas.clone(),
        rdma_quota::tenant::TenantBy::Cgroup,
    )
    .expect("bind");

    // Process A connects, hands the connection to a background child that
    // keeps it open, and exits; its pid is free again.
    let addr = sockaddr(&path);
    let mut a = Command::new("sh");
    a.args(["-c", "sleep 30 >/dev/null & echo $!"])
        .stdout(Stdio::piped());
    // SAFETY: only socket and connect between fork and exec.
    unsafe {
        a.pre_exec(move || {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let size = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if fd < 0 || libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), size) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let a = a.spawn().expect("process A");
    let a_pid = a.id();
    let out = a.wait_with_output().expect("A exits");
    let holder: u32 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the background child's pid");
    let _holder = Kill(holder);

    // Process B gets A's pid (ns_last_pid), in alice's cgroup.
    let alice_procs = cg.base.join("lab/alice/cgroup.procs");
    let alice_procs =
        std::ffi::CString::new(alice_procs.to_string_lossy().as_bytes()).expect("path");
    let mut b = None;
    for _ in 0..50 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (a_pid - 1).to_string())
            .expect("ns_last_pid");
        let procs = alice_procs.clone();
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        // SAFETY: open/write/close only between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
                if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(fd);
                Ok(())
            });
        }
        let mut child = cmd.spawn().expect("process B");
        if child.id() == a_pid {
            b = Some(child);
            break;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    let Some(mut b) = b else {
        panic!("could not give pid {a_pid} to a new process");
    };

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(collector.run(async {
        let _ = stopped.await;
    }));
    // The collector reads /proc/<A's pid>: it is B's now, in alice's cgroup.
    // Before, A's connection became a session of alice's tenant.
    let alice = format!("/{name}/lab/alice");
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let snapshot = quotas.snapshot();
        let posing: Vec<&String> = snapshot
            .tenants
            .iter()
            .filter(|(_, t)| t.sessions.iter().any(|s| s.pid == a_pid))
            .map(|(name, _)| name)
            .collect();
        assert!(
            posing.is_empty(),
            "pid {a_pid} (exited) taken for tenant {posing:?}; alice is {alice}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop.send(());
    task.await.expect("collector task").expect("collector");
    let _ = b.kill();
    let _ = b.wait();
    drop(cg);
}

/// Kills a process (not our child) at the end of the test.
struct Kill(u32);

impl Drop for Kill {
    fn drop(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.0) {
            // SAFETY: signals the process the test made.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// The address of a Unix socket path, made before `fork`.
fn sockaddr(path: &Path) -> libc::sockaddr_un {
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    assert!(bytes.len() < sun.sun_path.len(), "socket path too long");
    for (d, s) in sun.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    sun
}
