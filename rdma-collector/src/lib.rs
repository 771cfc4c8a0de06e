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
//! its socket and connections), `registry` (who is connected, the caps on
//! connections and tickets, which idle connection to close for room),
//! `session` (one connection's tickets), `peer` (the peer's pidfd),
//! `activity` (counters, the periodic summary, rate-limited warnings) and
//! `users` ([`user_name`], the user database lookup behind
//! `--tenant-by user`). The binary `rdma-collector` (`src/main.rs`) parses
//! arguments, sets up logging and runs a [`Collector`], on the socket systemd
//! passes (`rdma-collector.socket`, via [`Collector::from_listener`]) when
//! started by socket activation, else on `--socket`.
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
//! uid's user name or from its whole cgroup v2 path (`/lab.slice/job.scope`,
//! never its last component alone, which anyone with a delegated subtree
//! could copy); the tenant is the name matched against `tenant NAME ...`
//! lines of the quota file. `/proc/<pid>` is read after `accept`, so the
//! peer is pinned by a pidfd (`SO_PEERPIDFD`, Linux 6.5; `pidfd_open` after
//! `accept` before that) and refused if it exited meanwhile: a recycled pid
//! cannot lend its cgroup. A failing user database refuses the peer rather
//! than naming it `uid-N`. The socket is
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
//! only closes that connection. [`ConnectionBounds`] caps connections (in
//! all and per uid) and live tickets (per connection, uid and tenant), so a
//! local user cannot grow the daemon without limit. Connections without
//! tickets are closed when idle, or when room is needed for a new program;
//! `max_connections` stays below the descriptor limit and a spare descriptor
//! answers even when the table is full, so a new program is always answered
//! (the fail-closed interceptor would otherwise refuse every creation).
//! Accept errors back off. Decisions are logged at `debug`, with a summary
//! of counts at `info` every 10 s; warnings a client can provoke (denials,
//! refusals, malformed requests) are rate-limited and say how many were
//! suppressed.
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

mod activity;
mod peer;
mod registry;
mod session;
mod users;

pub use users::user_name;

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::{Path, PathBuf};
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

use activity::{count, Activity, Noisy};
use registry::{ConnId, Opened, Registry};
use session::{Ledger, Session};

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

/// Bounds that keep local users from growing the daemon without limit or
/// crowding each other out.
///
/// Every intercepted process (and each forked child that creates resources)
/// holds one connection, and one ticket per live resource. A connection that
/// holds no ticket can be closed without loss (the interceptor reconnects
/// when it next asks), so when a cap on connections is reached the collector
/// closes such a connection to make room: first of the uid with the most
/// connections, the one idle the longest. Connections holding tickets are
/// never closed.
///
/// # Examples
///
/// ```
/// use rdma_collector::ConnectionBounds;
///
/// let bounds = ConnectionBounds { per_uid: 16, ..ConnectionBounds::default() };
/// assert_eq!(bounds.tickets, 8192);
/// assert_eq!(bounds.max_connections, 4096);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionBounds {
    /// Open connections in all. At run time it is lowered to the descriptor
    /// limit (`ulimit -n`) less 64 kept for everything else, so the collector
    /// can always accept a new program.
    pub max_connections: usize,
    /// Open connections per uid; one more closes an idle ticketless one of
    /// the same uid, or gets `ERR` and is closed if all hold tickets.
    pub per_uid: usize,
    /// Live tickets per connection; creations beyond are denied.
    pub tickets: usize,
    /// Live tickets per uid, all its connections together.
    pub tickets_per_uid: usize,
    /// Live tickets per tenant, all its connections together.
    pub tickets_per_tenant: usize,
    /// A connection without tickets that sends nothing this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ConnectionBounds {
    fn default() -> Self {
        // A ticket costs about 120 bytes: 16,384 per uid or tenant is 2 MB.
        ConnectionBounds {
            max_connections: 4096,
            per_uid: 256,
            tickets: 8192,
            tickets_per_uid: 16_384,
            tickets_per_tenant: 16_384,
            idle_timeout: Duration::from_secs(60),
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
///     .with_bounds(ConnectionBounds { per_uid: 32, tickets: 4096, ..ConnectionBounds::default() });
/// let quotas = collector.quotas().clone(); // for reports while it runs
/// collector.run(std::future::pending::<()>()).await
/// # }
/// ```
#[derive(Debug)]
pub struct Collector {
    listener: StdUnixListener,
    path: PathBuf,
    /// (dev, inode) of the socket we bound, to remove only our own at exit;
    /// `None` for a listener handed to us (systemd's socket activation), whose
    /// path belongs to whoever made it and must outlive us.
    identity: Option<(u64, u64)>,
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
            identity: Some((meta.dev(), meta.ino())),
            quotas,
            tenant_by,
            bounds: ConnectionBounds::default(),
        })
    }

    /// Serves on a listener that is already bound, such as the one systemd
    /// passes to a socket-activated service (`rdma-collector.socket`).
    ///
    /// The socket's path and mode are its creator's business: they are left
    /// as they are, and the socket is not removed when the collector stops,
    /// so programs keep connecting to the same path (queued by the kernel)
    /// while the collector restarts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::os::unix::net::UnixListener;
    ///
    /// use rdma_collector::Collector;
    /// use rdma_quota::tenant::TenantBy;
    /// use rdma_quota::Quotas;
    ///
    /// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let listener = UnixListener::bind("/tmp/collector.sock")?;
    /// let collector = Collector::from_listener(listener, Quotas::default(), TenantBy::User)?;
    /// assert_eq!(collector.path(), std::path::Path::new("/tmp/collector.sock"));
    /// # Ok(()) }
    /// ```
    pub fn from_listener(
        listener: StdUnixListener,
        quotas: Quotas,
        tenant_by: TenantBy,
    ) -> Result<Collector, CollectorError> {
        // The path only names the socket in logs; an unnamed or abstract
        // socket has none, which is not a reason to refuse it.
        let path = listener
            .local_addr()
            .ok()
            .and_then(|addr| addr.as_pathname().map(Path::to_owned))
            .unwrap_or_else(|| PathBuf::from("(inherited socket)"));
        listener
            .set_nonblocking(true)
            .map_err(|source| CollectorError::Register {
                path: path.clone(),
                source,
            })?;
        Ok(Collector {
            listener,
            path,
            identity: None,
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
    /// (releasing their tickets) and removes the socket it bound (not one
    /// from [`from_listener`](Self::from_listener)).
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
        let bounds = fit_to_fd_limit(bounds);
        let shared = Arc::new(Shared {
            quotas,
            tenant_by,
            registry: Arc::new(Mutex::new(Registry::new(bounds))),
            activity: Arc::new(Activity::default()),
            identifying: Semaphore::new(IDENTIFYING),
            task_ended: Notify::new(),
        });
        tracing::info!(
            socket = %path.display(),
            tenant_by = %tenant_by,
            max_connections = bounds.max_connections,
            max_connections_per_uid = bounds.per_uid,
            max_tickets_per_connection = bounds.tickets,
            max_tickets_per_uid = bounds.tickets_per_uid,
            max_tickets_per_tenant = bounds.tickets_per_tenant,
            idle_timeout_s = bounds.idle_timeout.as_secs_f64(),
            "collector listening"
        );
        // Kept for the moment the descriptor table is full: closing it makes
        // room to accept one connection and tell it why it is refused.
        let mut spare = spare_fd();
        let mut tasks = JoinSet::new();
        let mut summary = tokio::time::interval(SUMMARY_EVERY);
        summary.tick().await;
        let mut backoff = Duration::ZERO;
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => {
                        backoff = Duration::ZERO;
                        admit_connection(stream, &shared, &mut tasks);
                        // Connections closed to make room still hold their
                        // descriptors until their tasks run: accept no faster
                        // than they go, or a burst fills the table anyway.
                        // CLOSING_SLACK of the reserved descriptors absorb them.
                        let limit = bounds.max_connections + CLOSING_SLACK;
                        let deadline = Instant::now() + Duration::from_millis(100);
                        while shared.registry().held() > limit && Instant::now() < deadline {
                            let _ = tokio::time::timeout_at(
                                deadline.into(),
                                shared.task_ended.notified(),
                            )
                            .await;
                        }
                    }
                    Err(e) => {
                        count(&shared.activity.accept_errors);
                        let fd_pressure =
                            matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                        let made_room = fd_pressure
                            && shared.registry().evict(Instant::now(), None);
                        let answered = if made_room {
                            count(&shared.activity.evicted);
                            false
                        } else {
                            fd_pressure && refuse_with_spare(&listener, &mut spare).await
                        };
                        if let Some(suppressed) = shared.activity.allow(Noisy::Accept) {
                            tracing::warn!(
                                error = %e,
                                made_room,
                                answered_on_spare = answered,
                                suppressed,
                                "accept failed; serving the connections we have"
                            );
                        }
                        // Each pass that made room or answered a newcomer made
                        // progress (and a pass only comes with a pending
                        // connection): go on at once, or after the closed
                        // connection's task has freed its descriptor. Back off
                        // only when nothing could be done, without spinning.
                        backoff = if answered {
                            Duration::ZERO
                        } else if made_room {
                            Duration::from_millis(5)
                        } else {
                            (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1))
                        };
                        if !backoff.is_zero() {
                            tokio::time::sleep(backoff).await;
                        }
                    }
                },
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    if let Err(e) = done {
                        if e.is_panic() {
                            tracing::error!("a connection task panicked; its connection was closed");
                        }
                    }
                }
                _ = summary.tick() => log_summary(&shared),
            }
        }
        tasks.shutdown().await;
        log_summary(&shared);
        drop(listener);
        // Only our own socket: a newer collector may have replaced it, and an
        // inherited one (identity None) stays for the next activation.
        if let (Some(identity), Ok(meta)) = (identity, std::fs::symlink_metadata(&path)) {
            if (meta.dev(), meta.ino()) == identity {
                let _ = std::fs::remove_file(&path);
            }
        }
        tracing::info!(socket = %path.display(), "collector stopped");
        Ok(())
    }
}

/// What a connection closed to make room before it was ever answered hears.
const MADE_ROOM: &str = "the collector closed this connection to make room for another \
                         (connection or descriptor limit reached); try again later";

/// How long a reply may take to write: a client reads each reply before it
/// asks again, so only one that stopped reading takes longer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the activity summary is logged (when something happened).
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// Identifications (reading `/proc`, asking the user database) at once; each
/// holds a few descriptors for a moment.
const IDENTIFYING: usize = 8;

/// Connections closed to make room whose tasks have not ended yet may hold
/// this many descriptors beyond `max_connections` (out of [`RESERVED_FDS`]).
const CLOSING_SLACK: usize = 16;

/// Descriptors kept out of `max_connections`: stdio, the listener, the
/// runtime's, the spare, and those identifications hold.
const RESERVED_FDS: usize = 64;

/// Lowers `max_connections` to what the descriptor limit allows, keeping
/// [`RESERVED_FDS`] for everything else, so that the table never fills with
/// connections and a new program can always be accepted.
fn fit_to_fd_limit(mut bounds: ConnectionBounds) -> ConnectionBounds {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into a valid rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return bounds;
    }
    let fds = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
    let fit = fds.saturating_sub(RESERVED_FDS).max(1);
    if fit < bounds.max_connections {
        tracing::warn!(
            fd_limit = fds,
            max_connections = fit,
            asked = bounds.max_connections,
            "the descriptor limit (ulimit -n) lowers --max-connections"
        );
        bounds.max_connections = fit;
    }
    bounds
}

fn spare_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// The descriptor table is full and no connection can be closed: accept one
/// pending connection on the spare descriptor, tell it why, and close it, so
/// that programs get an answer instead of waiting in the backlog.
/// True if one was answered.
async fn refuse_with_spare(
    listener: &tokio::net::UnixListener,
    spare: &mut Option<std::fs::File>,
) -> bool {
    if spare.take().is_none() {
        *spare = spare_fd();
        return false;
    }
    let mut answered = false;
    if let Ok(Ok((stream, _))) =
        tokio::time::timeout(Duration::from_millis(10), listener.accept()).await
    {
        let reply = Reply::Err("the collector is out of file descriptors; try again later".into());
        say(&stream, &reply);
        answered = true;
    }
    *spare = spare_fd();
    answered
}

/// Writes one short reply to a connection about to be closed, without
/// waiting: it fits in a new connection's empty socket buffer. (tokio's
/// `try_write` would refuse until the runtime has seen the socket writable.)
fn say(stream: &UnixStream, reply: &Reply) {
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

fn log_summary(shared: &Shared) {
    if let Some(counts) = shared.activity.summary() {
        let (open, tickets) = {
            let r = shared.registry();
            (r.open(), r.tickets())
        };
        tracing::info!(connections = open, tickets, "activity: {counts}");
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
    registry: Arc<Mutex<Registry>>,
    activity: Arc<Activity>,
    identifying: Semaphore,
    /// Signalled when a connection's task ends and frees its descriptor.
    task_ended: Notify,
}

impl Shared {
    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Registers an accepted connection (making room if a cap is reached) and
/// starts its task, or refuses it at once.
fn admit_connection(stream: UnixStream, shared: &Arc<Shared>, tasks: &mut JoinSet<()>) {
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
            let reason = refused.reason();
            if let Some(suppressed) = shared.activity.allow(Noisy::Refused) {
                tracing::warn!(uid, reason = %reason, suppressed, "connection refused");
            }
            say(&stream, &Reply::Err(reason));
        }
    }
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
        // A client that does not read its replies must not pin this task
        // (it could then be neither closed for room nor idle): writes are
        // bounded in time, and one that cannot finish closes the connection.
        let bytes = reply.to_line();
        let written = tokio::select! {
            () = wake.notified() => break,
            written = tokio::time::timeout(WRITE_TIMEOUT, write.write_all(bytes.as_bytes())) => written,
        };
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
