//! The multi-client secure server: TLS accept, admission, one task and one
//! set of RDMA resources per client.
//!
//! Admission happens before any RDMA resource exists for a client: TLS
//! (mutual authentication), then the hello (protocol version), then a free
//! client slot. A refused client gets
//! the reason over TLS. Each admitted client gets its own PD, CQs, MRs and QP
//! in its own tokio task; a disconnect, a crash of the client, an idle
//! timeout or server shutdown drops them all.
//!
//! What clients send is logged, or handed to the application's
//! [`Handler`] ([`Server::with_handler`], module [`handler`]).
//!
//! The modules, in the order a client meets them:
//! - `config`: what the server is told ([`ServerConfig`], [`Limits`],
//!   [`ProtectionPolicy`]);
//! - `accept`: the accept loop ([`Server::run`], [`Summary`]) and each
//!   connection's TLS handshake;
//! - `preauth`: source prefixes, and the bound on what failures before TLS
//!   write to the log;
//! - `watch`: the TLS files reloaded as they change, and live sessions ended
//!   when their client certificate is revoked or expires;
//! - `admission`: pending limits (in all, per address, per prefix), per-identity sessions, slots, quotas, and
//!   the refusals;
//! - `devices`: the RDMA device and GID for a connection;
//! - `streams`: each client's operation stream, remembered across its
//!   sessions so a reconnect resumes it (exactly once);
//! - `session_loop`: RDMA setup and the session until it ends;
//! - [`handler`] and `render`: what the application or the log receives.
//!
//! The live counts ([`ServerMetrics`]) belong to the [`Server`], not to its
//! configuration: [`Server::metrics`] hands them out, [`Server::with_metrics`]
//! shares counts made beforehand.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::handshake::Channel;
use crate::metrics::ServerMetrics;
use crate::verbs::Device;

mod accept;
mod admission;
mod config;
mod devices;
mod error;
pub mod handler;
mod lanes;
mod preauth;
mod render;
mod session_loop;
mod streams;
mod watch;

pub use accept::Summary;
pub use admission::RDMA_WINDOW;
pub use config::{Limits, ProtectionPolicy, ServerConfig};
pub use error::{ConfigError, RdmaSetting, ServerError};
pub use handler::{handler_fn, Delivery, Handler, HandlerError, HandlerFn, Peer};
pub use preauth::{PrefixLengths, SourcePrefix};
pub use render::{preview, render};
pub use streams::{ACK_MEMORY, MAX_STREAMS, MAX_STREAMS_PER_IDENTITY};
pub use watch::{CertFile, POLL as CERT_POLL};

use admission::KeyCounts;
use devices::Devices;
use handler::DynHandler;

/// The TLS channel to one client.
type ServerChannel = Channel<tokio_rustls::server::TlsStream<TcpStream>>;

/// The value a box holds, the box freed now.
///
/// In an async fn, `*boxed` moves the value out but frees the box only when `boxed` goes out
/// of scope: for a parameter or a capture, when the whole future completes. A connection's
/// task handed its channel and its admission on in boxes and so kept both allocations, dead,
/// for as long as it served the session (heaptrack on 1,000 held sessions: 1.4 and 3.2 KiB
/// per session); a lane kept its unconfirmed QP's (2 KiB) for as long as the lane. Passing
/// the box here moves it into this call, which frees it on return.
// The box is the point: it is the caller's, to be freed here.
#[allow(clippy::boxed_local)]
fn unbox<T>(boxed: Box<T>) -> T {
    *boxed
}

/// What every client task shares: the settings, the counts, and the server-wide resources
/// admission hands out.
struct Shared {
    config: ServerConfig,
    /// Sessions, handshakes, refusals, traffic and authentication failures.
    metrics: ServerMetrics,
    /// The TLS material, reloaded by a background task, and the live sessions it may end.
    tls: watch::Credentials,
    devices: Devices,
    /// Session resources made ahead ([`crate::warm`]), when configured.
    warm: crate::warm::WarmPools,
    /// The shared receive queue of each device, made by the first session that needs it,
    /// when configured ([`ServerConfig::shared_receive_queue`]).
    shared_queues:
        std::sync::Mutex<std::collections::HashMap<String, Arc<crate::shared_queue::SharedQueue>>>,
    slots: Arc<Semaphore>,
    /// Connections not yet admitted, in all and per source address.
    pending: Arc<Semaphore>,
    pending_by_address: KeyCounts<std::net::IpAddr>,
    /// Connections not yet admitted, per source prefix.
    pending_by_prefix: KeyCounts<SourcePrefix>,
    /// Which failures before TLS completes are logged.
    pre_auth_log: std::sync::Mutex<preauth::PreAuthLog>,
    /// Live sessions per identity.
    sessions_by_identity: KeyCounts<String>,
    /// Live lanes per identity beyond each session's first ([`crate::lanes`]).
    lanes_by_identity: KeyCounts<String>,
    /// This process's cgroup v2 id (0 if unknown), for quota registrations.
    cgroup_id: u64,
    /// Where arrivals go; `None` logs them.
    handler: Option<Box<dyn DynHandler>>,
    /// Every client's operation stream, across its sessions.
    streams: Arc<streams::Streams>,
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    /// Shared with the client tasks once [`Server::run`] starts them.
    shared: Shared,
}

impl Shared {
    /// A session's (or lane's) resources with its `secrets`: on the device's shared receive
    /// queue when one is configured, else from the warm pool or made now; and the metrics'
    /// name for where they came from (`shared`, `warm` or `cold`).
    fn prepare(
        &self,
        device: &Arc<crate::verbs::Device>,
        sgid: &crate::verbs::GidEntry,
        secrets: crate::session::Secrets,
        config: crate::session::SessionConfig,
    ) -> (
        Result<crate::session::Prepared, crate::session::SessionError>,
        &'static str,
    ) {
        if self.config.shared_receive_queue == 0 {
            let (prepared, path) = self.warm.prepare(device, sgid, secrets, config);
            return (prepared, path.name());
        }
        let queue = {
            let mut queues = self.shared_queues.lock().unwrap_or_else(|p| p.into_inner());
            match queues.get(device.name()) {
                Some(q) => Ok(Arc::clone(q)),
                None => crate::shared_queue::SharedQueue::counted(
                    device,
                    self.config.shared_receive_queue,
                    config.shape().recv_len(),
                    self.metrics.shared_queue_counters(),
                )
                .inspect(|q| {
                    tracing::info!(device = %device.name(), slots = q.slots(), slot_len = q.slot_len(), "shared receive queue made");
                    queues.insert(device.name().to_owned(), Arc::clone(q));
                }),
            }
        };
        let prepared = queue
            .map_err(crate::session::SessionError::from)
            .and_then(|q| crate::session::Prepared::on_shared(&q, sgid.clone(), secrets, config));
        (prepared, "shared")
    }
}

impl Server {
    /// Loads the TLS material, opens the configured device (if any) and
    /// binds the listening socket.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use secure_rdma::server::{Server, ServerConfig};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// // The certificates of certs/ (ca.pem, server.pem, server.key, crl.pem); the device
    /// // carrying each connection's local address; AEAD on every payload, unprotected
    /// // clients refused; event-driven completions.
    /// let config = ServerConfig::new("0.0.0.0:4433".parse()?, "certs".as_ref())
    ///     .with_max_clients(10)
    ///     .with_buffer_size(4096)
    ///     .with_idle_timeout(Duration::from_secs(300));
    /// let server = Server::bind(config).await?;
    /// println!("listening on {}", server.local_addr()?);
    /// # Ok(()) }
    /// ```
    pub async fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        if config.max_clients == 0 {
            return Err(ServerError::Config(ConfigError::MaxClients));
        }
        if !(64..=1 << 30).contains(&config.buffer_size) {
            return Err(ServerError::Config(ConfigError::BufferSize {
                size: config.buffer_size,
            }));
        }
        let tls = watch::Credentials::new(&config)?;
        // Checked once at start: a host without RDMA still serves (each client is told why it
        // cannot be served, with the fix), and the operator reads the fix now, not in the first
        // client's failure. A device named in the configuration is opened now, so without RDMA
        // that is an error naming the same fix.
        let availability = Device::availability();
        let no_rdma = |setting: RdmaSetting| ServerError::NoRdma {
            setting,
            availability: availability.clone(),
        };
        let fixed = match &config.device {
            Some(name) if !availability.is_available() => {
                return Err(no_rdma(RdmaSetting::Device(name.clone())))
            }
            None if config.gid_index.is_some() && !availability.is_available() => {
                return Err(no_rdma(RdmaSetting::GidIndex))
            }
            Some(name) => Some(Device::open(Some(name))?),
            None if config.gid_index.is_some() => Some(Device::open(None)?),
            None => None,
        };
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| ServerError::Listen {
                    addr: config.listen,
                    source,
                })?;
        if config.limits.max_pending == 0 || config.limits.max_pending_per_address == 0 {
            return Err(ServerError::Config(ConfigError::MaxPending));
        }
        if config.limits.max_pending_per_prefix == 0 {
            return Err(ServerError::Config(ConfigError::MaxPendingPerPrefix));
        }
        // The fields are public: a length set directly is checked here.
        let lengths = config.limits.pending_prefix;
        PrefixLengths::new(lengths.v4, lengths.v6).map_err(ServerError::Config)?;
        if config.limits.max_sessions_per_identity == Some(0) {
            return Err(ServerError::Config(ConfigError::MaxSessionsPerIdentity));
        }
        if !availability.is_available() {
            tracing::warn!(
                listen = %config.listen,
                "cannot serve RDMA: {availability}; clients are refused with this reason until a device exists"
            );
        }
        let shared = Shared {
            slots: Arc::new(Semaphore::new(config.max_clients)),
            pending: Arc::new(Semaphore::new(config.limits.max_pending)),
            pending_by_address: KeyCounts::default(),
            pending_by_prefix: KeyCounts::default(),
            pre_auth_log: std::sync::Mutex::new(
                preauth::PreAuthLog::new(std::time::Instant::now()),
            ),
            sessions_by_identity: KeyCounts::default(),
            lanes_by_identity: KeyCounts::default(),
            cgroup_id: crate::quota::cgroup::id_of(std::process::id()).unwrap_or(0),
            devices: Devices::new(fixed, config.gid_index),
            warm: crate::warm::WarmPools::new(config.warm_pool),
            shared_queues: std::sync::Mutex::default(),
            tls,
            metrics: ServerMetrics::default(),
            streams: Arc::new(streams::Streams::new(config.resume_window)),
            config,
            handler: None,
        };
        Ok(Server { listener, shared })
    }

    /// Hands what clients send to `handler` instead of logging it: each
    /// SEND and WRITE, authenticated and decrypted, as a [`Delivery`] naming
    /// its client. A client's acknowledgement waits until the handler has
    /// taken the delivery, so a slow application slows its clients down
    /// instead of queueing without bound (see [`handler`]).
    ///
    /// ```no_run
    /// use secure_rdma::server::{Server, ServerConfig};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let server = Server::bind(ServerConfig::new("0.0.0.0:4433".parse()?, "certs".as_ref())).await?;
    /// // At most 64 deliveries wait for the loop below; then the sessions wait.
    /// let (tx, mut rx) = tokio::sync::mpsc::channel(64);
    /// let serving = tokio::spawn(server.with_handler(tx).run(async {
    ///     let _ = tokio::signal::ctrl_c().await;
    /// }));
    /// // Ends when the server has stopped (it held the only sender).
    /// while let Some(d) = rx.recv().await {
    ///     println!("{}: {}", d.identity(), String::from_utf8_lossy(d.data()));
    /// }
    /// serving.await?;
    /// # Ok(()) }
    /// ```
    pub fn with_handler(mut self, handler: impl Handler) -> Server {
        self.shared.handler = Some(Box::new(handler));
        self
    }

    /// Counts into `metrics` instead of the server's own fresh set: for
    /// counts an exporter or a telemetry task was given before the server
    /// was bound. Clones of a [`ServerMetrics`] share their counts.
    ///
    /// ```no_run
    /// use secure_rdma::metrics::ServerMetrics;
    /// use secure_rdma::server::{Server, ServerConfig};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let metrics = ServerMetrics::default();
    /// let exported = metrics.clone(); // registered with an exporter
    /// let server = Server::bind(ServerConfig::new("0.0.0.0:4433".parse()?, "certs".as_ref()))
    ///     .await?
    ///     .with_metrics(metrics);
    /// # let _ = (server, exported);
    /// # Ok(()) }
    /// ```
    pub fn with_metrics(mut self, metrics: ServerMetrics) -> Server {
        self.shared.metrics = metrics;
        self
    }

    /// The server's counts: sessions, handshakes, refusals, traffic per
    /// tenant, authentication failures and RDMA step durations. Keep a
    /// clone to register them with an exporter or read them while it runs.
    pub fn metrics(&self) -> &ServerMetrics {
        &self.shared.metrics
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::task::{Context, Waker};

    /// What a connection's task handed on in a box (its channel, its admission).
    struct Big([u8; 3000]);

    /// Weighs what the future `make` makes holds on the heap (what it was given included)
    /// beside the future itself while it waits at its first await, and says whether it was
    /// waiting.
    fn held_while_waiting<F: Future<Output = u8>>(make: impl FnOnce() -> F) -> (isize, bool) {
        let (bytes, (pinned, waiting)) = crate::test_alloc::held_by(|| {
            let mut pinned = Box::pin(make());
            let mut cx = Context::from_waker(Waker::noop());
            let waiting = pinned.as_mut().poll(&mut cx).is_pending();
            (pinned, waiting)
        });
        let beside = bytes - std::mem::size_of_val(&*pinned) as isize;
        drop(pinned);
        (beside, waiting)
    }

    #[test]
    fn a_box_moved_out_of_in_an_async_fn_is_freed_at_once_only_through_unbox() {
        async fn star(boxed: Box<Big>, gate: tokio::sync::oneshot::Receiver<()>) -> u8 {
            let big = *boxed;
            let _ = gate.await;
            big.0[0]
        }
        async fn unboxed(boxed: Box<Big>, gate: tokio::sync::oneshot::Receiver<()>) -> u8 {
            let big = super::unbox(boxed);
            let _ = gate.await;
            big.0[0]
        }
        let (_open, gate) = tokio::sync::oneshot::channel();
        let (kept, waiting) = held_while_waiting(|| star(Box::new(Big([7; 3000])), gate));
        assert!(waiting);
        // The pitfall the connection's task fell into: the box stays allocated, dead, for as
        // long as the future lives (a session's whole life).
        assert!(
            kept >= 3000,
            "{kept} bytes held beside the future after *boxed"
        );
        let (_open, gate) = tokio::sync::oneshot::channel();
        let (kept, waiting) = held_while_waiting(|| unboxed(Box::new(Big([7; 3000])), gate));
        assert!(waiting);
        assert!(
            kept < 512,
            "{kept} bytes held beside the future after unbox"
        );
    }
}
