//! The daemon: [`Collector`], a listening socket and the quotas it enforces,
//! and its accept loop, which admits connections, backs off on accept
//! errors, answers newcomers even when the descriptor table is full, and logs
//! a summary of activity.

use std::future::Future;
use std::os::unix::net::UnixListener as StdUnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdma_quota::tenant::TenantBy;
use rdma_quota::wire::Reply;
use rdma_quota::Quotas;
use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinSet;

use crate::activity::{count, Activity, Noisy};
use crate::bounds::{fit_to_fd_limit, BoundNames, ConnectionBounds};
use crate::connection::{admit_connection, say, Shared, IDENTIFYING};
use crate::listen::{self, CollectorError};
use crate::registry::Registry;

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
    names: BoundNames,
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
        let (listener, path, identity) = listen::bind(path.as_ref())?;
        Ok(Collector {
            listener,
            path,
            identity: Some(identity),
            quotas,
            tenant_by,
            bounds: ConnectionBounds::default(),
            names: BoundNames::default(),
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
        let path = listen::adopt(&listener)?;
        Ok(Collector {
            listener,
            path,
            identity: None,
            quotas,
            tenant_by,
            bounds: ConnectionBounds::default(),
            names: BoundNames::default(),
        })
    }

    /// Replaces the default [`ConnectionBounds`].
    pub fn with_bounds(mut self, bounds: ConnectionBounds) -> Collector {
        self.bounds = bounds;
        self
    }

    /// Names the bounds as the program running the collector calls them
    /// (flags, configuration keys), so that a connection or ticket refused by
    /// a bound is told how to raise it. Without names, refusals give the
    /// limit and no hint.
    pub fn with_bound_names(mut self, names: BoundNames) -> Collector {
        self.names = names;
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
            names,
        } = self;
        let listener = tokio::net::UnixListener::from_std(listener).map_err(|source| {
            CollectorError::Register {
                path: path.clone(),
                source,
            }
        })?;
        let bounds = fit_to_fd_limit(bounds, &names);
        let shared = Arc::new(Shared {
            quotas,
            tenant_by,
            registry: Arc::new(Mutex::new(Registry::new(bounds).with_names(names))),
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
        if let Some(identity) = identity {
            listen::remove_own(&path, identity);
        }
        tracing::info!(socket = %path.display(), "collector stopped");
        Ok(())
    }
}

/// How often the activity summary is logged (when something happened).
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// Connections closed to make room whose tasks have not ended yet may hold
/// this many descriptors beyond `max_connections` (out of the descriptors kept from `max_connections`).
const CLOSING_SLACK: usize = 16;

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

fn log_summary(shared: &Shared) {
    if let Some(counts) = shared.activity.summary() {
        let (open, tickets) = {
            let r = shared.registry();
            (r.open(), r.tickets())
        };
        tracing::info!(connections = open, tickets, "activity: {counts}");
    }
}
