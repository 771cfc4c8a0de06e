//! # rdma-collector
//!
//! The collector daemon: admission decisions for the `LD_PRELOAD`
//! interceptor (`rdma-intercept`), enforcing a [`Quotas`] on programs that
//! were not written for it.
//!
//! Every program running with `librdma_intercept.so` keeps one connection to
//! the collector's Unix socket and asks it before each RDMA resource it
//! creates. The collector counts what it admitted per tenant and globally in
//! the same [`Quotas`] object `rdma-monitor` renders; [`Collector::quotas`]
//! gives access to it (`Quotas::snapshot()`).
//!
//! Modules, in reading order: this crate root (the daemon: [`Collector`],
//! its socket and connections), `session` (one connection's tickets) and
//! `users` ([`user_name`], the user database lookup behind
//! `--tenant-by user`). The binary `rdma-collector` (`src/main.rs`) parses
//! arguments, sets up logging and runs a [`Collector`].
//!
//! # Protocol
//!
//! Line-based UTF-8 text, one request and one reply at a time, described
//! with its table of requests and replies in [`rdma_quota::wire`], the
//! module the interceptor uses too. `DENY` reasons are the quota's
//! [`Refusal`] messages. A connection's tickets are released when it
//! closes, however it closes, so a crashed program's resources leave the
//! counts.
//!
//! # Identity and trust
//!
//! The collector believes nothing a client says about itself. Its pid and
//! uid come from `SO_PEERCRED` (taken by the kernel at `connect`), its
//! `comm` from `/proc/<pid>/comm`, and its tenant ([`TenantBy`]) from the
//! uid's user name or from its cgroup v2 path; the tenant is the name
//! matched against `tenant NAME ...` lines of the quota file. The socket is
//! created mode 0666 so that any local user's program can connect; that is
//! safe because fairness rests on `SO_PEERCRED`, which a client cannot
//! forge.
//!
//! What a client *can* do is under-report: skip the interceptor, or
//! `RELEASE` tickets of resources it keeps. The collector is a quota service
//! for cooperating programs; the kernel's rdma cgroup controller is the
//! enforcement against hostile ones. A client can also hold global quota
//! without creating anything, so give every tenant its own limits where the
//! global ones must be shared fairly.
//!
//! # Robustness
//!
//! One tokio task per connection; a panic in one is caught by tokio and
//! only closes that connection. Connections per uid
//! ([`ConnectionBounds::per_uid`]) and live tickets per connection
//! ([`ConnectionBounds::tickets`]) are bounded, so a local user cannot grow
//! the daemon without limit. Connections have no idle timeout: a program
//! keeps its connection for its whole life.
//!
//! # Examples
//!
//! ```no_run
//! use rdma_collector::Collector;
//! use rdma_quota::tenant::TenantBy;
//! use rdma_quota::wire::DEFAULT_SOCKET;
//! use rdma_quota::{QuotaConfig, Quotas};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let quotas = Quotas::new(QuotaConfig::parse("QP_COUNT 64\ntenant alice QP_COUNT 4\n", "quota.conf")?);
//! let collector = Collector::bind(DEFAULT_SOCKET, quotas.clone(), TenantBy::User)?;
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! collector.run(shutdown).await?;
//! println!("{:?}", quotas.snapshot().global.live);
//! # Ok(()) }
//! ```
//!
//! [`Refusal`]: rdma_quota::Refusal

#![warn(missing_docs)]

mod session;
mod users;

pub use users::user_name;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma_quota::cgroup::CGROUP_ROOT;
use rdma_quota::tenant::{self, PeerError, TenantBy};
use rdma_quota::wire::{BadRequest, Reply, Request, MAX_LINE};
use rdma_quota::Quotas;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::task::JoinSet;

use session::Session;

/// Why the collector cannot start or keep listening.
#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    /// The socket's directory cannot be created.
    #[error("cannot create the socket directory {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The socket path cannot be examined.
    #[error("cannot inspect {}: {source}", path.display())]
    Inspect {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Something other than a socket is at the path; it is left alone.
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Another collector answers on the path.
    #[error("another collector is already listening on {}", path.display())]
    AlreadyRunning {
        /// The path.
        path: PathBuf,
    },
    /// A stale socket from a previous run cannot be removed.
    #[error("cannot remove the stale socket {}: {source}", path.display())]
    RemoveStale {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// `bind` failed.
    #[error("cannot listen on {}: {source}", path.display())]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The socket's mode cannot be set to 0666.
    #[error("cannot make {} connectable for all users (chmod 0666): {source}", path.display())]
    Permissions {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The listener cannot be registered with the tokio runtime.
    #[error("cannot register the listener on {} with the runtime: {source}", path.display())]
    Register {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// Bounds that keep one local user from growing the daemon without limit.
///
/// # Examples
///
/// ```
/// use rdma_collector::ConnectionBounds;
///
/// let bounds = ConnectionBounds { per_uid: 16, ..ConnectionBounds::default() };
/// assert_eq!(bounds.tickets, 65_536);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionBounds {
    /// Open connections per uid; one more gets `ERR` and is closed. Each
    /// intercepted process (and each forked child that creates resources)
    /// holds one.
    pub per_uid: usize,
    /// Live tickets per connection; creations beyond are denied.
    pub tickets: usize,
}

impl Default for ConnectionBounds {
    fn default() -> Self {
        ConnectionBounds {
            per_uid: 256,
            tickets: 65_536,
        }
    }
}

/// The collector: a bound socket and the quotas it enforces.
///
/// # Examples
///
/// ```no_run
/// use rdma_collector::{Collector, ConnectionBounds};
/// use rdma_quota::tenant::TenantBy;
/// use rdma_quota::Quotas;
///
/// # async fn demo() -> Result<(), rdma_collector::CollectorError> {
/// let collector = Collector::bind("/tmp/collector.sock", Quotas::default(), TenantBy::Cgroup)?
///     .with_bounds(ConnectionBounds { per_uid: 32, tickets: 4096 });
/// let quotas = collector.quotas().clone(); // for reports while it runs
/// collector.run(std::future::pending::<()>()).await
/// # }
/// ```
#[derive(Debug)]
pub struct Collector {
    listener: StdUnixListener,
    path: PathBuf,
    /// (dev, inode) of the socket we bound, to remove only our own at exit.
    identity: (u64, u64),
    quotas: Quotas,
    tenant_by: TenantBy,
    bounds: ConnectionBounds,
}

impl Collector {
    /// Binds the socket at `path`.
    ///
    /// Creates the parent directory (mode 0755) if missing, replaces a stale
    /// socket left by a collector that is gone (but not a live one, nor a
    /// file that is not a socket), and makes the socket mode 0666. Needs no
    /// runtime; [`run`](Self::run) does.
    pub fn bind(
        path: impl AsRef<Path>,
        quotas: Quotas,
        tenant_by: TenantBy,
    ) -> Result<Collector, CollectorError> {
        let path = path.as_ref().to_owned();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(dir)
                    .map_err(|source| CollectorError::CreateDir {
                        path: dir.to_owned(),
                        source,
                    })?;
                // The umask may have narrowed it; clients must reach the socket.
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(
                    |source| CollectorError::CreateDir {
                        path: dir.to_owned(),
                        source,
                    },
                )?;
            }
        }
        remove_stale(&path)?;
        let listener = StdUnixListener::bind(&path).map_err(|source| CollectorError::Bind {
            path: path.clone(),
            source,
        })?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).map_err(
            |source| CollectorError::Permissions {
                path: path.clone(),
                source,
            },
        )?;
        listener
            .set_nonblocking(true)
            .map_err(|source| CollectorError::Bind {
                path: path.clone(),
                source,
            })?;
        let meta = std::fs::symlink_metadata(&path).map_err(|source| CollectorError::Inspect {
            path: path.clone(),
            source,
        })?;
        Ok(Collector {
            listener,
            path,
            identity: (meta.dev(), meta.ino()),
            quotas,
            tenant_by,
            bounds: ConnectionBounds::default(),
        })
    }

    /// Replaces the default [`ConnectionBounds`].
    pub fn with_bounds(mut self, bounds: ConnectionBounds) -> Collector {
        self.bounds = bounds;
        self
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The quotas being enforced; `snapshot()` shows what is admitted now.
    pub fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// Serves connections until `shutdown` completes, then closes them all
    /// (releasing their tickets) and removes the socket.
    ///
    /// Must run inside a tokio runtime with I/O enabled.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), CollectorError> {
        let Collector {
            listener,
            path,
            identity,
            quotas,
            tenant_by,
            bounds,
        } = self;
        let listener = tokio::net::UnixListener::from_std(listener).map_err(|source| {
            CollectorError::Register {
                path: path.clone(),
                source,
            }
        })?;
        let shared = Arc::new(Shared {
            quotas,
            tenant_by,
            bounds,
            per_uid: Mutex::new(HashMap::new()),
        });
        tracing::info!(socket = %path.display(), tenant_by = %tenant_by, "collector listening");
        let mut tasks = JoinSet::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        tasks.spawn(serve(stream, Arc::clone(&shared)));
                    }
                    Err(e) => {
                        // EMFILE and friends: keep serving the connections we
                        // have, and retry without spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                },
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = done {
                        if e.is_panic() {
                            tracing::error!("a connection task panicked; its connection was closed");
                        }
                    }
                }
            }
        }
        tasks.shutdown().await;
        drop(listener);
        // Only our own socket: a newer collector may have replaced it.
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            if (meta.dev(), meta.ino()) == identity {
                let _ = std::fs::remove_file(&path);
            }
        }
        tracing::info!(socket = %path.display(), "collector stopped");
        Ok(())
    }
}

/// Removes a socket nobody listens on; refuses anything else.
fn remove_stale(path: &Path) -> Result<(), CollectorError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CollectorError::Inspect {
                path: path.to_owned(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(CollectorError::NotASocket {
            path: path.to_owned(),
        });
    }
    match StdUnixStream::connect(path) {
        Ok(_) => Err(CollectorError::AlreadyRunning {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)
            .map_err(|source| CollectorError::RemoveStale {
                path: path.to_owned(),
                source,
            }),
        Err(source) => Err(CollectorError::Inspect {
            path: path.to_owned(),
            source,
        }),
    }
}

struct Shared {
    quotas: Quotas,
    tenant_by: TenantBy,
    bounds: ConnectionBounds,
    per_uid: Mutex<HashMap<u32, usize>>,
}

/// One connection slot of a uid, given back on drop.
struct UidSlot {
    shared: Arc<Shared>,
    uid: u32,
}

impl UidSlot {
    fn take(shared: &Arc<Shared>, uid: u32) -> Option<UidSlot> {
        let mut map = shared.per_uid.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(uid).or_insert(0);
        if *n >= shared.bounds.per_uid {
            return None;
        }
        *n += 1;
        Some(UidSlot {
            shared: Arc::clone(shared),
            uid,
        })
    }
}

impl Drop for UidSlot {
    fn drop(&mut self) {
        let mut map = self
            .shared
            .per_uid
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.uid);
            }
        }
    }
}

async fn serve(mut stream: UnixStream, shared: Arc<Shared>) {
    let cred = match stream.peer_cred() {
        Ok(cred) => cred,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the peer's credentials (SO_PEERCRED)");
            return;
        }
    };
    let uid = cred.uid();
    let Some(_slot) = UidSlot::take(&shared, uid) else {
        let limit = shared.bounds.per_uid;
        tracing::warn!(uid, limit, "too many connections for one uid");
        let reply = Reply::Err(format!(
            "too many connections for uid {uid} (limit {limit})"
        ));
        let _ = stream.write_all(reply.to_line().as_bytes()).await;
        return;
    };
    let tenant_by = shared.tenant_by;
    let pid = cred.pid().and_then(|p| u32::try_from(p).ok());
    let identified = match pid {
        None => Err(PeerError::NoPid),
        Some(pid) => tokio::task::spawn_blocking(move || {
            tenant::identify(
                pid,
                uid,
                tenant_by,
                Path::new("/proc"),
                Path::new(CGROUP_ROOT),
                user_name,
            )
        })
        .await
        .unwrap_or_else(|e| {
            Err(PeerError::Cgroup {
                pid,
                reason: format!("identification task failed: {e}"),
            })
        }),
    };
    let peer = match identified {
        Ok(peer) => peer,
        Err(e) => {
            tracing::warn!(uid, pid, error = %e, "refusing a connection");
            let _ = stream
                .write_all(Reply::Err(e.to_string()).to_line().as_bytes())
                .await;
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
    let mut session = Session::new(&shared.quotas, peer, shared.bounds.tickets);
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::with_capacity(MAX_LINE, read);
    let mut line = Vec::with_capacity(MAX_LINE);
    loop {
        let (reply, close) = match read_line(&mut reader, &mut line).await {
            Ok(false) => break,
            Ok(true) => match Request::parse(&line) {
                Ok(request) => (session.handle(request), false),
                Err(e) => (protocol_error(&session, &e), true),
            },
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                (protocol_error(&session, &BadRequest::TooLong), true)
            }
            Err(_) => break,
        };
        if write.write_all(reply.to_line().as_bytes()).await.is_err() || close {
            break;
        }
    }
    drop(session);
}

fn protocol_error(session: &Session, e: &BadRequest) -> Reply {
    let peer = session.peer();
    tracing::warn!(
        pid = peer.pid,
        comm = %peer.comm,
        tenant = %peer.tenant,
        error = %e,
        "malformed request; closing the connection"
    );
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

    #[test]
    fn bind_refuses_files_and_live_collectors_and_replaces_stale_sockets() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("file");
        std::fs::write(&file, "keep me").expect("write");
        let err = Collector::bind(&file, Quotas::default(), TenantBy::User).expect_err("file");
        assert!(matches!(err, CollectorError::NotASocket { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(&file).expect("still there"),
            "keep me"
        );

        let nested = dir.path().join("a/b/collector.sock");
        let live = Collector::bind(&nested, Quotas::default(), TenantBy::User).expect("bind");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&nested), 0o666);
        assert_eq!(mode(&dir.path().join("a/b")), 0o755);
        let err = Collector::bind(&nested, Quotas::default(), TenantBy::User).expect_err("live");
        assert_eq!(
            err.to_string(),
            format!(
                "another collector is already listening on {}",
                nested.display()
            )
        );
        // A dead collector's socket is replaced.
        drop(live);
        assert!(nested.exists());
        Collector::bind(&nested, Quotas::default(), TenantBy::User).expect("rebind over stale");
    }
}
