//! One connection: admitting it (or refusing it at once), identifying its
//! peer from the kernel's word, then serving its requests one line at a time
//! until it closes, goes idle without tickets, or is closed to make room.
//! [`Shared`] is what every connection's task shares with the accept loop.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdma_quota::cgroup::CGROUP_ROOT;
use rdma_quota::tenant::{self, Peer, PeerError, TenantBy};
use rdma_quota::wire::{BadRequest, Reply, Request, MAX_LINE};
use rdma_quota::Quotas;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::UCred;
use tokio::net::UnixStream;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

use crate::activity::{count, Activity, Noisy};
use crate::peer;
use crate::registry::{ConnId, Opened, Registry};
use crate::session::{Ledger, Session};
use crate::users::user_name;

/// What a connection closed to make room before it was ever answered hears.
const MADE_ROOM: &str = "the collector closed this connection to make room for another \
                         (connection or descriptor limit reached); try again later";

/// How long a reply may take to write: a client reads each reply before it
/// asks again, so only one that stopped reading takes longer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Identifications (reading `/proc`, asking the user database) at once; each
/// holds a few descriptors for a moment.
pub(crate) const IDENTIFYING: usize = 8;

/// What the accept loop and every connection's task share.
pub(crate) struct Shared {
    /// The quotas enforced.
    pub(crate) quotas: Quotas,
    /// What a tenant is.
    pub(crate) tenant_by: TenantBy,
    /// Who is connected and what they hold.
    pub(crate) registry: Arc<Mutex<Registry>>,
    /// Counters and rate-limited warnings.
    pub(crate) activity: Arc<Activity>,
    /// Bounds identifications at once ([`IDENTIFYING`]).
    pub(crate) identifying: Semaphore,
    /// Signalled when a connection's task ends and frees its descriptor.
    pub(crate) task_ended: Notify,
}

impl Shared {
    pub(crate) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Registers an accepted connection (making room if a cap is reached) and
/// starts its task, or refuses it at once.
pub(crate) fn admit_connection(stream: UnixStream, shared: &Arc<Shared>, tasks: &mut JoinSet<()>) {
    let cred = match stream.peer_cred() {
        Ok(cred) => cred,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the peer's credentials (SO_PEERCRED)");
            return;
        }
    };
    let uid = cred.uid();
    let opened = shared.registry().open_connection(uid, Instant::now());
    match opened {
        Ok(opened) => {
            count(&shared.activity.connected);
            shared
                .activity
                .evicted
                .fetch_add(opened.evicted, Ordering::Relaxed);
            tasks.spawn(serve(stream, cred, opened, Arc::clone(shared)));
        }
        Err(refused) => {
            count(&shared.activity.refused);
            let reason = refused.reason(shared.registry().names());
            if let Some(suppressed) = shared.activity.allow(Noisy::Refused) {
                tracing::warn!(uid, reason = %reason, suppressed, "connection refused");
            }
            say(&stream, &Reply::Err(reason));
        }
    }
}

/// Writes one short reply to a connection about to be closed, without
/// waiting: it fits in a new connection's empty socket buffer. (tokio's
/// `try_write` would refuse until the runtime has seen the socket writable.)
pub(crate) fn say(stream: &UnixStream, reply: &Reply) {
    let line = reply.to_line();
    // SAFETY: `line` is valid for its length; MSG_DONTWAIT never blocks and
    // MSG_NOSIGNAL turns a closed peer into EPIPE instead of SIGPIPE.
    let _ = unsafe {
        libc::send(
            stream.as_raw_fd(),
            line.as_ptr().cast(),
            line.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

/// Gives the connection's slot back when its task ends, however it ends.
struct Registered {
    shared: Arc<Shared>,
    id: ConnId,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.shared.registry().close_connection(self.id);
        self.shared.task_ended.notify_one();
    }
}

/// Whether the peer's identity comes through a pidfd, said once.
static PIDFD_REPORTED: AtomicBool = AtomicBool::new(false);

/// Identifies the peer from the kernel's word: `SO_PEERCRED`, `/proc` and
/// the user database, checked against the peer's pidfd afterwards.
async fn identify_peer(
    stream: &UnixStream,
    uid: u32,
    pid: Option<u32>,
    shared: &Shared,
) -> Result<Peer, PeerError> {
    let pid = pid.ok_or(PeerError::NoPid)?;
    let Ok(_permit) = shared.identifying.acquire().await else {
        return Err(PeerError::Exited { pid });
    };
    let (pidfd, source) = peer::pidfd(stream.as_fd(), pid).map_err(|e| match e.raw_os_error() {
        Some(libc::ESRCH) => PeerError::Exited { pid },
        Some(libc::EMFILE | libc::ENFILE) => PeerError::Busy {
            pid,
            reason: "the collector is out of file descriptors".to_owned(),
        },
        _ => PeerError::Cgroup {
            pid,
            reason: format!("cannot get a pidfd: {e}"),
        },
    })?;
    if !PIDFD_REPORTED.swap(true, Ordering::Relaxed) {
        tracing::info!(pidfd = ?source, "peer identity: {}", source.describe());
    }
    let tenant_by = shared.tenant_by;
    tokio::task::spawn_blocking(move || {
        let peer = tenant::identify(
            pid,
            uid,
            tenant_by,
            Path::new("/proc"),
            Path::new(CGROUP_ROOT),
            user_name,
        )?;
        // What /proc/<pid> showed was the peer's only if its pid was not
        // reused meanwhile, which a live pidfd proves.
        if pidfd.as_ref().is_some_and(|fd| !peer::alive(fd.as_fd())) {
            return Err(PeerError::Exited { pid });
        }
        Ok(peer)
    })
    .await
    .unwrap_or_else(|e| {
        Err(PeerError::Cgroup {
            pid,
            reason: format!("identification task failed: {e}"),
        })
    })
}

async fn serve(stream: UnixStream, cred: UCred, opened: Opened, shared: Arc<Shared>) {
    let Opened { id, wake, .. } = opened;
    let _registered = Registered {
        shared: Arc::clone(&shared),
        id,
    };
    let uid = cred.uid();
    let pid = cred.pid().and_then(|p| u32::try_from(p).ok());
    let identified = tokio::select! {
        // Closed to make room before it was even identified.
        () = wake.notified() => {
            say(&stream, &Reply::Err(MADE_ROOM.into()));
            return;
        }
        identified = identify_peer(&stream, uid, pid, &shared) => identified,
    };
    let peer = match identified {
        Ok(peer) => peer,
        Err(e) => {
            count(&shared.activity.refused);
            if let Some(suppressed) = shared.activity.allow(Noisy::Refused) {
                tracing::warn!(uid, pid, error = %e, suppressed, "refusing a connection");
            }
            say(&stream, &Reply::Err(e.to_string()));
            return;
        }
    };
    tracing::debug!(
        pid = peer.pid,
        uid = peer.uid,
        comm = %peer.comm,
        tenant = %peer.tenant,
        cgroup_id = peer.cgroup_id,
        "client connected"
    );
    let idle_timeout = shared.registry().bounds().idle_timeout;
    let ledger = Ledger {
        registry: Arc::clone(&shared.registry),
        activity: Arc::clone(&shared.activity),
        id,
    };
    let mut session = Session::new(&shared.quotas, peer, ledger);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::with_capacity(MAX_LINE, read);
    let mut line = Vec::with_capacity(MAX_LINE);
    let mut answered = false;
    // Replies not written yet: while the client's next request is already
    // buffered (the interceptor sends its waiting RELEASEs and an ADMIT in one
    // write), the replies are written together once it is not, so one wake-up
    // of the client's costs one write here.
    let mut replies = String::new();
    loop {
        // Without tickets the connection may be closed (idle, or to make
        // room): nothing is lost, the interceptor reconnects when it next
        // asks. With tickets it never is: closing would release them.
        let idle = session.live_tickets() == 0;
        let read = tokio::select! {
            () = wake.notified() => {
                tracing::debug!(pid = session.peer().pid, "closing an idle connection to make room");
                // One that was never answered is told why; an idle one is
                // closed silently, and its program reconnects when it next asks
                // (a reply nobody asked for would be read as the next answer).
                if !answered {
                    say(write.as_ref(), &Reply::Err(MADE_ROOM.into()));
                }
                break;
            }
            () = tokio::time::sleep(idle_timeout), if idle => {
                count(&shared.activity.idle_closed);
                tracing::debug!(pid = session.peer().pid, "closing an idle connection without tickets");
                break;
            }
            read = read_line(&mut reader, &mut line) => read,
        };
        let (reply, close) = match read {
            Ok(false) => break,
            Ok(true) => {
                shared.registry().touch(id, Instant::now());
                match Request::parse(&line) {
                    Ok(request) => (session.handle(request), false),
                    Err(e) => (protocol_error(&session, &shared.activity, &e), true),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::InvalidData => (
                protocol_error(&session, &shared.activity, &BadRequest::TooLong),
                true,
            ),
            Err(_) => break,
        };
        replies.push_str(&reply.to_line());
        if !close && reader.buffer().contains(&b'\n') {
            continue;
        }
        // A client that does not read its replies must not pin this task
        // (it could then be neither closed for room nor idle): writes are
        // bounded in time, and one that cannot finish closes the connection.
        let written = tokio::select! {
            () = wake.notified() => break,
            written = tokio::time::timeout(WRITE_TIMEOUT, write.write_all(replies.as_bytes())) => written,
        };
        replies.clear();
        count(&shared.activity.writes);
        answered = true;
        if !matches!(written, Ok(Ok(()))) || close {
            if written.is_err() {
                count(&shared.activity.malformed);
                if let Some(suppressed) = shared.activity.allow(Noisy::Refused) {
                    tracing::warn!(
                        pid = session.peer().pid,
                        tenant = %session.peer().tenant,
                        suppressed,
                        "the client does not read its replies; closing the connection"
                    );
                }
            }
            break;
        }
    }
    drop(session);
}

fn protocol_error(session: &Session, activity: &Activity, e: &BadRequest) -> Reply {
    count(&activity.malformed);
    let peer = session.peer();
    if let Some(suppressed) = activity.allow(Noisy::Refused) {
        tracing::warn!(
            pid = peer.pid,
            comm = %peer.comm,
            tenant = %peer.tenant,
            error = %e,
            suppressed,
            "malformed request; closing the connection"
        );
    }
    Reply::Err(e.to_string())
}

/// Reads one line into `line` (without its `\n`). `Ok(false)` at the end of
/// the stream, also after a partial line; `InvalidData` if the line exceeds
/// [`MAX_LINE`] (nothing more is read then).
async fn read_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    line: &mut Vec<u8>,
) -> io::Result<bool> {
    line.clear();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(false);
        }
        let (chunk, found) = match available.iter().position(|&b| b == b'\n') {
            Some(i) => (&available[..i], true),
            None => (available, false),
        };
        // `\n` included, a line may be MAX_LINE bytes.
        if line.len() + chunk.len() >= MAX_LINE {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
        }
        line.extend_from_slice(chunk);
        let used = chunk.len() + usize::from(found);
        reader.consume(used);
        if found {
            return Ok(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn lines(input: &[u8]) -> Vec<Result<String, io::ErrorKind>> {
        let mut reader = BufReader::with_capacity(16, input);
        let mut line = Vec::new();
        let mut out = Vec::new();
        loop {
            match read_line(&mut reader, &mut line).await {
                Ok(true) => out.push(Ok(String::from_utf8_lossy(&line).into_owned())),
                Ok(false) => break,
                Err(e) => {
                    out.push(Err(e.kind()));
                    break;
                }
            }
        }
        out
    }

    #[tokio::test]
    async fn lines_are_split_and_bounded() {
        assert_eq!(
            lines(b"STATS\nRELEASE 1\npartial").await,
            [Ok("STATS".to_owned()), Ok("RELEASE 1".to_owned())]
        );
        let exact = [vec![b'a'; MAX_LINE - 1], vec![b'\n']].concat();
        assert_eq!(lines(&exact).await, [Ok("a".repeat(MAX_LINE - 1))]);
        let over = [vec![b'a'; MAX_LINE], vec![b'\n']].concat();
        assert_eq!(lines(&over).await, [Err(io::ErrorKind::InvalidData)]);
        let endless = vec![b'a'; 10 * MAX_LINE];
        assert_eq!(lines(&endless).await, [Err(io::ErrorKind::InvalidData)]);
    }
}
