//! The collector over a real Unix socket: admission up to the limits, the
//! reasons of refusals, release on RELEASE and on disconnect, and a client
//! sending garbage.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rdma_collector::{user_name, Collector, ConnectionBounds};
use rdma_quota::tenant::TenantBy;
use rdma_quota::{QuotaConfig, Quotas, Resource};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const STEP: Duration = Duration::from_secs(5);

struct Running {
    _dir: tempfile::TempDir,
    path: PathBuf,
    quotas: Quotas,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(STEP, &mut self.task)
            .await
            .expect("collector stops")
            .expect("collector task");
    }
}

fn start(config: &str) -> Running {
    start_with(config, ConnectionBounds::default())
}

fn start_with(config: &str, bounds: ConnectionBounds) -> Running {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("run/collector.sock");
    let quotas = Quotas::new(QuotaConfig::parse(config, "test.conf").expect("config"));
    let collector = Collector::bind(&path, quotas.clone(), TenantBy::User)
        .expect("bind")
        .with_bounds(bounds);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        collector
            .run(async {
                let _ = rx.await;
            })
            .await
            .expect("collector runs");
    });
    Running {
        _dir: dir,
        path,
        quotas,
        stop: Some(tx),
        task,
    }
}

struct Client {
    read: BufReader<OwnedReadHalf>,
    write: OwnedWriteHalf,
}

impl Client {
    async fn connect(path: &Path) -> Client {
        let stream = UnixStream::connect(path).await.expect("connect");
        let (read, write) = stream.into_split();
        Client {
            read: BufReader::new(read),
            write,
        }
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.write.write_all(bytes).await.expect("send");
    }

    /// The next reply line, or "<closed>" at the end of the stream.
    async fn reply(&mut self) -> String {
        let mut line = String::new();
        let n = tokio::time::timeout(STEP, self.read.read_line(&mut line))
            .await
            .expect("reply in time")
            .expect("read");
        if n == 0 {
            return "<closed>".to_owned();
        }
        line.trim_end_matches('\n').to_owned()
    }

    async fn ask(&mut self, request: &str) -> String {
        self.send_raw(format!("{request}\n").as_bytes()).await;
        self.reply().await
    }

    /// Whether the collector closed the connection without sending more.
    /// A reset counts as closed: closing with unread input (the rest of an
    /// overlong line) makes the kernel report ECONNRESET to this side.
    async fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        match tokio::time::timeout(STEP, self.read.read_to_end(&mut rest)).await {
            Ok(Ok(_)) => rest.is_empty(),
            Ok(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionReset && rest.is_empty(),
            Err(_) => false,
        }
    }
}

fn live(quotas: &Quotas, r: Resource) -> u64 {
    quotas.snapshot().global.live[&r]
}

/// Disconnect cleanup runs in the connection's task; wait for it.
async fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + STEP;
    while !ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admits_up_to_the_count_limit_then_denies_with_the_reason() {
    let c = start("QP_COUNT 2\nMR_BYTES 8192\n");
    let mut client = Client::connect(&c.path).await;
    assert_eq!(client.ask("ADMIT QP_CREATE").await, "OK 1");
    assert_eq!(client.ask("ADMIT QP_CREATE").await, "OK 2");
    assert_eq!(
        client.ask("ADMIT QP_CREATE").await,
        "DENY QP_COUNT limit 2 reached globally (2 live)"
    );
    assert_eq!(client.ask("ADMIT MR_REG 8192").await, "OK 3");
    assert_eq!(
        client.ask("ADMIT MR_REG 1").await,
        "DENY MR_BYTES limit 8192 would be exceeded globally (8192 registered + 1 requested)"
    );
    // Unlimited resources are still counted.
    assert_eq!(client.ask("ADMIT PD_ALLOC").await, "OK 4");
    let stats = client.ask("STATS").await;
    assert!(
        stats.starts_with("OK global QP=2 PD=1 CQ=0 MR=1 MR_BYTES=8192 tenant "),
        "{stats}"
    );
    // The same object rdma-monitor renders.
    let snapshot = c.quotas.snapshot();
    assert_eq!(snapshot.global.live[&Resource::Qp], 2);
    assert_eq!(snapshot.global.mr_bytes, 8192);
    let refused: u64 = snapshot.refusals.iter().map(|r| r.count).sum();
    assert_eq!(refused, 2);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_frees_a_slot_and_unknown_tickets_are_errors() {
    let c = start("QP_COUNT 1\n");
    let mut client = Client::connect(&c.path).await;
    assert_eq!(client.ask("ADMIT QP_CREATE").await, "OK 1");
    assert!(client.ask("ADMIT QP_CREATE").await.starts_with("DENY "));
    assert_eq!(client.ask("RELEASE 1").await, "OK");
    assert_eq!(live(&c.quotas, Resource::Qp), 0);
    assert_eq!(client.ask("ADMIT QP_CREATE").await, "OK 2");
    // A ticket is released once; an unknown one is an error, not a disconnect.
    assert_eq!(client.ask("RELEASE 1").await, "ERR unknown ticket 1");
    assert_eq!(client.ask("RELEASE 99").await, "ERR unknown ticket 99");
    assert_eq!(live(&c.quotas, Resource::Qp), 1);
    // Tickets belong to their connection: another client cannot release them.
    let mut other = Client::connect(&c.path).await;
    assert_eq!(other.ask("RELEASE 2").await, "ERR unknown ticket 2");
    assert_eq!(live(&c.quotas, Resource::Qp), 1);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_sent_ahead_of_an_admission_are_applied_first_and_answered_together() {
    // The interceptor sends the RELEASEs that waited and its next ADMIT in one write.
    let c = start("QP_COUNT 1\n");
    let mut client = Client::connect(&c.path).await;
    assert_eq!(client.ask("ADMIT QP_CREATE").await, "OK 1");
    client
        .send_raw(b"RELEASE 1\nRELEASE 77\nADMIT QP_CREATE\n")
        .await;
    // In order: the slot the release freed is the one the admission gets; an unknown
    // ticket is an ERR that keeps the connection. (That the three replies are one write is
    // counted by the activity summary's writes=, seen in tests/tests/isolation_lab.rs.)
    let first = tokio::time::timeout(STEP, client.read.fill_buf())
        .await
        .expect("replies in time")
        .expect("read")
        .to_vec();
    assert_eq!(
        String::from_utf8_lossy(&first),
        "OK\nERR unknown ticket 77\nOK 2\n"
    );
    assert_eq!(live(&c.quotas, Resource::Qp), 1);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_connection_releases_everything_it_held() {
    let c = start("QP_COUNT 3\n");
    let mut crashing = Client::connect(&c.path).await;
    for i in 1..=3 {
        assert_eq!(crashing.ask("ADMIT QP_CREATE").await, format!("OK {i}"));
    }
    assert_eq!(crashing.ask("ADMIT MR_REG 4096").await, "OK 4");
    assert_eq!(live(&c.quotas, Resource::Qp), 3);
    let mut waiting = Client::connect(&c.path).await;
    assert!(waiting.ask("ADMIT QP_CREATE").await.starts_with("DENY "));
    // The program dies without destroying anything.
    drop(crashing);
    wait_for("the dead client's tickets to be released", || {
        let g = c.quotas.snapshot().global;
        g.live[&Resource::Qp] == 0 && g.live[&Resource::Mr] == 0 && g.mr_bytes == 0
    })
    .await;
    assert_eq!(waiting.ask("ADMIT QP_CREATE").await, "OK 1");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_gets_err_and_a_disconnect_and_the_daemon_keeps_serving() {
    let c = start("QP_COUNT 5\n");
    let cases: [(&[u8], &str); 5] = [
        (
            b"HACK THE PLANET\n",
            "ERR unknown command \"HACK\" (expected HELLO, ADMIT, RELEASE or STATS)",
        ),
        (b"ADMIT \xff\xfe\n", "ERR line is not valid UTF-8"),
        (
            b"ADMIT QP_DESTROY\n",
            "ERR QP_DESTROY destroys a resource: send RELEASE <ticket> instead",
        ),
        (
            b"RELEASE -1\n",
            "ERR ticket \"-1\" is not a non-negative integer",
        ),
        (b"\n", "ERR empty request"),
    ];
    for (garbage, expected) in cases {
        let mut client = Client::connect(&c.path).await;
        assert_eq!(client.ask("ADMIT QP_CREATE").await, "OK 1");
        client.send_raw(garbage).await;
        assert_eq!(client.reply().await, expected);
        assert!(client.closed().await, "disconnected after {garbage:?}");
        // Its ticket went with the connection.
        wait_for("release after a protocol error", || {
            live(&c.quotas, Resource::Qp) == 0
        })
        .await;
    }
    // An overlong line, without ever sending a newline.
    let mut client = Client::connect(&c.path).await;
    client.send_raw(&[b'A'; 4096]).await;
    assert_eq!(client.reply().await, "ERR line longer than 512 bytes");
    assert!(client.closed().await);
    // A client that connects and hangs up at once.
    drop(UnixStream::connect(&c.path).await.expect("connect"));
    // Still serving.
    let mut fine = Client::connect(&c.path).await;
    assert_eq!(fine.ask("ADMIT QP_CREATE").await, "OK 1");
    assert_eq!(fine.ask("HELLO some program").await, "OK");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_refuses_the_second_quick_call() {
    let c = start("QP_CREATE 1\n");
    let mut client = Client::connect(&c.path).await;
    assert_eq!(client.ask("ADMIT QP_CREATE").await, "OK 1");
    let denied = client.ask("ADMIT QP_CREATE").await;
    let reason = denied.strip_prefix("DENY ").expect("a DENY");
    // Protocol version 2: the refusal says when the limit admits again.
    let (text, retry) = rdma_quota::wire::retry_after(reason);
    assert_eq!(
        text,
        "QP_CREATE limit 1/s exceeded globally (1 calls in the last second)"
    );
    let retry = retry.unwrap_or_else(|| panic!("no retry time in {denied:?}"));
    assert!(
        retry > std::time::Duration::ZERO && retry <= std::time::Duration::from_secs(1),
        "{denied}"
    );
    // Releasing does not give back rate: the call happened.
    assert_eq!(client.ask("RELEASE 1").await, "OK");
    assert!(client
        .ask("ADMIT QP_CREATE")
        .await
        .starts_with("DENY QP_CREATE limit 1/s"));
    // The retry time is right: once it has passed, the call is admitted.
    tokio::time::sleep(retry).await;
    assert_eq!(client.ask("ADMIT QP_CREATE").await, "OK 2");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenant_is_the_peers_user_name_from_so_peercred() {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let me = user_name(uid)
        .expect("user database")
        .unwrap_or_else(|| format!("uid-{uid}"));
    let c = start(&format!(
        "QP_COUNT 10\ntenant {me} QP_COUNT 1\ntenant someone-else QP_COUNT 5\n"
    ));
    let mut client = Client::connect(&c.path).await;
    // Claiming another name changes nothing.
    assert_eq!(client.ask("HELLO someone-else").await, "OK");
    assert_eq!(client.ask("ADMIT QP_CREATE").await, "OK 1");
    assert_eq!(
        client.ask("ADMIT QP_CREATE").await,
        format!("DENY QP_COUNT limit 1 reached for tenant {me} (1 live)")
    );
    let stats = client.ask("STATS").await;
    assert!(
        stats.ends_with(&format!("tenant {me} QP=1 PD=0 CQ=0 MR=0 MR_BYTES=0")),
        "{stats}"
    );
    let sessions = &c.quotas.snapshot().tenants[&me].sessions;
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].pid, std::process::id());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_uid_are_bounded() {
    let c = start_with(
        "",
        ConnectionBounds {
            per_uid: 2,
            tickets: 10,
            ..ConnectionBounds::default()
        },
    );
    let mut a = Client::connect(&c.path).await;
    let mut b = Client::connect(&c.path).await;
    assert_eq!(a.ask("ADMIT PD_ALLOC").await, "OK 1");
    assert_eq!(b.ask("ADMIT PD_ALLOC").await, "OK 1");
    let mut third = Client::connect(&c.path).await;
    let reply = third.reply().await;
    assert!(
        reply.starts_with("ERR too many connections for uid "),
        "{reply}"
    );
    assert!(reply.ends_with("(limit 2)"), "{reply}");
    assert!(third.closed().await);
    drop(a);
    // The slot comes back when a connection closes.
    let mut again = None;
    for _ in 0..100 {
        let mut d = Client::connect(&c.path).await;
        // Until then it is refused, and closed perhaps before the request
        // is even sent.
        let sent = d.write.write_all(b"ADMIT PD_ALLOC\n").await.is_ok();
        if sent && d.reply().await == "OK 1" {
            again = Some(d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(again.is_some(), "a freed slot is reusable");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_all_and_removes_the_socket() {
    let c = start("");
    let mut client = Client::connect(&c.path).await;
    assert_eq!(client.ask("ADMIT CQ_CREATE").await, "OK 1");
    let (path, quotas) = (c.path.clone(), c.quotas.clone());
    let dir_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(path.parent().expect("dir"))
            .expect("stat")
            .permissions(),
    );
    assert_eq!(dir_mode & 0o777, 0o755);
    c.stop().await;
    assert!(!path.exists(), "socket removed");
    assert_eq!(quotas.snapshot().global.live[&Resource::Cq], 0);
    assert!(client.closed().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_without_tickets_are_closed_and_others_kept() {
    let c = start_with(
        "",
        ConnectionBounds {
            idle_timeout: Duration::from_millis(300),
            ..ConnectionBounds::default()
        },
    );
    let mut idle = Client::connect(&c.path).await;
    assert_eq!(idle.ask("HELLO idle").await, "OK");
    let mut holding = Client::connect(&c.path).await;
    assert_eq!(holding.ask("ADMIT QP_CREATE").await, "OK 1");
    // Closed without a word once idle; the interceptor reconnects when it
    // next asks.
    assert!(idle.closed().await, "idle connection kept");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(holding.ask("RELEASE 1").await, "OK");
    // Without tickets now, it goes too.
    assert!(holding.closed().await);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_collector_closes_an_idle_connection_for_a_new_program() {
    let c = start_with(
        "",
        ConnectionBounds {
            max_connections: 2,
            ..ConnectionBounds::default()
        },
    );
    let mut holding = Client::connect(&c.path).await;
    assert_eq!(holding.ask("ADMIT PD_ALLOC").await, "OK 1");
    let mut idle = Client::connect(&c.path).await;
    assert_eq!(idle.ask("HELLO idle").await, "OK");
    let mut new = Client::connect(&c.path).await;
    assert_eq!(new.ask("ADMIT PD_ALLOC").await, "OK 1");
    assert!(idle.closed().await, "the idle connection made room");
    assert_eq!(holding.ask("ADMIT PD_ALLOC").await, "OK 2");
    // Everyone holds tickets: the next is refused with the reason.
    let mut refused = Client::connect(&c.path).await;
    let reply = refused.reply().await;
    assert!(
        reply.starts_with("ERR the collector is at its limit of 2 connections"),
        "{reply}"
    );
    c.stop().await;
}
