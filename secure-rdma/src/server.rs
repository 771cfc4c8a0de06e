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

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::Instrument;

use crate::datapath::{AbortReason, Ack, ClientRequest, Op};
use crate::handshake::{Channel, HandshakeError, Message, RejectReason, RDMA_ACKS, VERSION};
use crate::metrics::{self, HandshakeOutcome, ServerMetrics, TimedVerb};
use crate::protect::Cipher;
use crate::protect::{Protection, Side};
use crate::quota::{Quotas, TenantInfo, TenantQuota};
use crate::ratelimit::LogLimiter;
use crate::session::{Secrets, Session, SessionAdmission, SessionConfig, SessionError};
use crate::tls;
use crate::verbs::{Availability, Device, GidEntry, GidSelector, Poll, VerbsError};

pub mod handler;
use handler::DynHandler;
pub use handler::{handler_fn, Delivery, Handler, HandlerError, HandlerFn, Peer};

/// Server settings (the `secure-server` flags).
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Clients served at once; the next one is refused with "server full".
    pub max_clients: usize,
    /// RDMA device; default: the one carrying the connection's local address.
    pub device: Option<String>,
    /// Source GID index; default: the RoCEv2 GID of the local address.
    pub gid_index: Option<u32>,
    /// Per-client buffer size in bytes.
    pub buffer_size: usize,
    /// CA certificate that client certificates must chain to.
    pub ca: PathBuf,
    /// Server certificate.
    pub cert: PathBuf,
    /// Server key.
    pub key: PathBuf,
    /// Revoked client certificates (PEM CRL, `secure-server certs revoke`).
    /// Read again whenever the file changes, so a revocation applies from
    /// the next handshake on; `None` or a missing file revokes nothing.
    pub crl: Option<PathBuf>,
    /// Limit for TLS + hello + RDMA setup of one client.
    pub handshake_timeout: Duration,
    /// A client silent this long is disconnected.
    pub idle_timeout: Duration,
    /// Thresholds enforced on every client's RDMA resources before they are
    /// made; `None` admits everything. Keep a clone to read its counts.
    pub quotas: Option<Quotas>,
    /// Payload protection: which ciphers, and whether clients without it
    /// are served.
    pub protection: ProtectionPolicy,
    /// Accept a client whose RDMA GID is not the address its TLS connection
    /// comes from (NAT, multi-homed hosts). Off by default: a client could
    /// otherwise point the server's QP at another host.
    pub allow_gid_mismatch: bool,
    /// Counts of messages that failed authentication, per identity. Keep a
    /// clone to read them (telemetry, metrics).
    pub auth_failures: AuthFailures,
    /// Sessions, handshakes, refusals, traffic per tenant and RDMA step
    /// durations. Keep a clone to register them with an exporter.
    pub metrics: ServerMetrics,
    /// Limits that keep one peer from taking the server down.
    pub limits: Limits,
    /// How sessions wait for RDMA completions: event-driven (the default,
    /// no CPU while idle) or busy polling (the lowest latency, a core per
    /// busy session: for dedicated hosts and benchmarks).
    pub poll: Poll,
}

impl ServerConfig {
    /// `secure-server`'s defaults: listen on `listen`, the certificates of
    /// `certs` (`ca.pem`, `server.pem`, `server.key`, `crl.pem` if clients
    /// were revoked), 10 clients, 4096-byte buffers, 10-second handshakes,
    /// 5-minute idle timeout, payload protection required, no quotas.
    ///
    /// ```
    /// use secure_rdma::server::ServerConfig;
    ///
    /// let config = ServerConfig {
    ///     max_clients: 100,
    ///     ..ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref())
    /// };
    /// assert_eq!(config.ca, std::path::Path::new("certs/ca.pem"));
    /// ```
    pub fn new(listen: SocketAddr, certs: &std::path::Path) -> ServerConfig {
        let server = crate::certs::server_paths(certs);
        ServerConfig {
            listen,
            max_clients: 10,
            device: None,
            gid_index: None,
            buffer_size: 4096,
            ca: crate::certs::ca_paths(certs).cert,
            cert: server.cert,
            key: server.key,
            crl: Some(crate::certs::crl_path(certs)),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            quotas: None,
            protection: ProtectionPolicy::default(),
            allow_gid_mismatch: false,
            auth_failures: AuthFailures::default(),
            limits: Limits::default(),
            poll: Poll::default(),
            metrics: crate::metrics::ServerMetrics::default(),
        }
    }
}

/// Operations a client on the streaming data path ([`RDMA_ACKS`]) may have
/// unacknowledged at once: the receive slots the server keeps posted per
/// session, and the write slots it registers for it.
pub const RDMA_WINDOW: usize = 16;

/// What one peer may hold: connections before TLS completes, sessions per
/// identity, time per write and per session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections in TLS handshake or admission at once; more are closed at
    /// accept. Bounds the memory and descriptors idle or slow peers can pin.
    pub max_pending: usize,
    /// Of those, from one source address.
    pub max_pending_per_address: usize,
    /// Longest wait for one write to a client's TLS socket: a client that
    /// stops reading is disconnected instead of pinning its task.
    pub write_timeout: Duration,
    /// Sessions one identity may hold at once; `None` for no limit.
    pub max_sessions_per_identity: Option<usize>,
    /// Sessions older than this are ended (the client may reconnect);
    /// `None` for no limit.
    pub max_session_lifetime: Option<Duration>,
}

impl Default for Limits {
    /// 64 pending connections, 8 per address, 10-second writes, no
    /// per-identity or lifetime limit.
    fn default() -> Self {
        Limits {
            max_pending: 64,
            max_pending_per_address: 8,
            write_timeout: Duration::from_secs(10),
            max_sessions_per_identity: None,
            max_session_lifetime: None,
        }
    }
}

/// The server's payload-protection policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtectionPolicy {
    /// Ciphers the server uses, preferred first; empty never protects
    /// (`--no-payload-protection`).
    pub ciphers: Vec<Cipher>,
    /// Serve clients that ask for payloads in clear. Off by default: an
    /// on-path attacker can forge and read such a session's messages.
    pub allow_unprotected: bool,
}

impl Default for ProtectionPolicy {
    /// Both ciphers, fastest on this CPU first; unprotected clients refused.
    fn default() -> Self {
        ProtectionPolicy {
            ciphers: Cipher::preference().to_vec(),
            allow_unprotected: false,
        }
    }
}

impl ProtectionPolicy {
    /// Payloads in clear for everyone (`--no-payload-protection`: to measure
    /// the cost, and to show the attack it invites).
    pub fn off() -> Self {
        ProtectionPolicy {
            ciphers: Vec::new(),
            allow_unprotected: true,
        }
    }

    /// The cipher for a client that accepts `offered` (its preference
    /// order), or why the client cannot be served.
    ///
    /// ```
    /// use secure_rdma::protect::Cipher;
    /// use secure_rdma::server::ProtectionPolicy;
    ///
    /// let strict = ProtectionPolicy { ciphers: vec![Cipher::Aes256Gcm], allow_unprotected: false };
    /// assert_eq!(strict.choose(&[Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm]), Ok(Some(Cipher::Aes256Gcm)));
    /// assert!(strict.choose(&[]).is_err());
    /// assert_eq!(ProtectionPolicy::off().choose(&[Cipher::Aes256Gcm]), Ok(None));
    /// ```
    pub fn choose(&self, offered: &[Cipher]) -> Result<Option<Cipher>, RejectReason> {
        if self.ciphers.is_empty() {
            return Ok(None);
        }
        if offered.is_empty() {
            return match self.allow_unprotected {
                true => Ok(None),
                false => Err(RejectReason::Policy {
                    detail: "this server requires payload protection and the client offered none \
                             (it runs with --no-payload-protection)"
                        .to_owned(),
                }),
            };
        }
        match self.ciphers.iter().find(|c| offered.contains(c)) {
            Some(c) => Ok(Some(*c)),
            None => Err(RejectReason::Policy {
                detail: format!(
                    "no common payload cipher: the server uses {}, the client offered {}",
                    names(&self.ciphers),
                    names(offered)
                ),
            }),
        }
    }
}

fn names(ciphers: &[Cipher]) -> String {
    ciphers
        .iter()
        .map(|c| c.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Messages that failed authentication, per client identity: each one is a
/// forgery, a replay or corruption on the RDMA path, and ended its session.
#[derive(Debug, Clone, Default)]
pub struct AuthFailures(Arc<Mutex<std::collections::BTreeMap<String, u64>>>);

impl AuthFailures {
    /// Counts one failure of `identity`'s session.
    pub fn record(&self, identity: &str) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry(identity.to_owned()).or_insert(0) += 1;
    }

    /// The counts so far.
    pub fn snapshot(&self) -> std::collections::BTreeMap<String, u64> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// All failures so far.
    pub fn total(&self) -> u64 {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .sum()
    }
}

/// Errors that stop the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// TLS configuration failed.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The configured device cannot be used.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The configuration names a device (`--device`, `--gid-index`) and this host has no RDMA
    /// device at all.
    #[error("{flag} needs an RDMA device, and {availability}")]
    NoRdma {
        /// The setting that needs a device.
        flag: String,
        /// What the host lacks, with the fix.
        availability: Availability,
    },
    /// Invalid settings.
    #[error("invalid configuration: {0}")]
    Config(String),
}

/// Opens each RDMA device once and finds the GID for a local address.
struct Devices {
    fixed: Option<Arc<Device>>,
    gid_index: Option<u32>,
    cache: Mutex<HashMap<String, Arc<Device>>>,
    /// The device and GID last chosen for each local address. Reading the whole GID table per
    /// connection cost most of a millisecond of every handshake; a cached choice is checked
    /// with one query instead, and chosen afresh when its entry changed.
    chosen: Mutex<HashMap<IpAddr, (Arc<Device>, GidEntry)>>,
}

impl Devices {
    fn resolve(&self, local: IpAddr) -> Result<(Arc<Device>, GidEntry), VerbsError> {
        let cached = self
            .chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&local)
            .cloned();
        if let Some((dev, gid)) = cached {
            if dev.gid_still_at(&gid) {
                return Ok((dev, gid));
            }
            tracing::info!(device = dev.name(), %local, index = gid.index, "GID table changed; choosing the GID again");
        }
        let (dev, gid) = self.choose(local)?;
        self.chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(local, (Arc::clone(&dev), gid.clone()));
        Ok((dev, gid))
    }

    /// The device and GID for connections to `local`, from the GID tables.
    fn choose(&self, local: IpAddr) -> Result<(Arc<Device>, GidEntry), VerbsError> {
        let selector = match self.gid_index {
            Some(i) => GidSelector::Index(i),
            None => GidSelector::Address(local),
        };
        if let Some(dev) = &self.fixed {
            let gid = dev.select_gid(&selector)?;
            return Ok((Arc::clone(dev), gid));
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        for dev in cache.values() {
            if let Ok(gid) = dev.select_gid(&selector) {
                return Ok((Arc::clone(dev), gid));
            }
        }
        let (dev, gid) = Device::open_for_address(local)?;
        let dev = Arc::clone(
            cache
                .entry(dev.name().to_owned())
                .or_insert_with(|| Arc::clone(&dev)),
        );
        Ok((dev, gid))
    }
}

/// The TLS acceptor and the CRL it was built with.
struct Tls {
    acceptor: TlsAcceptor,
    /// Modification time and length of the CRL file it read; `None` when there was none.
    crl_stamp: Option<(std::time::SystemTime, u64)>,
}

fn crl_stamp(path: Option<&std::path::Path>) -> Option<(std::time::SystemTime, u64)> {
    let meta = std::fs::metadata(path?).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

struct Shared {
    config: ServerConfig,
    tls: Mutex<Tls>,
    devices: Devices,
    slots: Arc<Semaphore>,
    /// Connections not yet admitted, in all and per source address.
    pending: Arc<Semaphore>,
    pending_by_address: KeyCounts<IpAddr>,
    /// Live sessions per identity.
    sessions_by_identity: KeyCounts<String>,
    /// This process's cgroup v2 id (0 if unknown), for quota registrations.
    cgroup_id: u64,
    /// Where arrivals go; `None` logs them.
    handler: Option<Box<dyn DynHandler>>,
}

/// A bound, not yet running server.
pub struct Server {
    listener: TcpListener,
    /// Shared with the client tasks once [`Server::run`] starts them.
    shared: Shared,
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Clients that completed the handshake.
    pub served: u64,
    /// Clients refused at admission.
    pub rejected: u64,
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
    /// let server = Server::bind(ServerConfig {
    ///     listen: "0.0.0.0:4433".parse()?,
    ///     max_clients: 10,
    ///     device: None, // the device carrying each connection's local address
    ///     gid_index: None,
    ///     buffer_size: 4096,
    ///     ca: "certs/ca.pem".into(),
    ///     cert: "certs/server.pem".into(),
    ///     key: "certs/server.key".into(),
    ///     crl: Some("certs/crl.pem".into()),
    ///     handshake_timeout: Duration::from_secs(10),
    ///     idle_timeout: Duration::from_secs(300),
    ///     quotas: None,
    ///     protection: Default::default(), // AEAD on every payload, unprotected clients refused
    ///     allow_gid_mismatch: false,
    ///     auth_failures: Default::default(),
    ///     metrics: Default::default(),
    ///     limits: Default::default(),
    ///     poll: Default::default(), // event-driven completions
    /// })
    /// .await?;
    /// println!("listening on {}", server.local_addr()?);
    /// # Ok(()) }
    /// ```
    pub async fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        if config.max_clients == 0 {
            return Err(ServerError::Config(
                "--max-clients must be at least 1".into(),
            ));
        }
        if !(64..=1 << 30).contains(&config.buffer_size) {
            return Err(ServerError::Config(format!(
                "--buffer-size {} must be between 64 bytes and 1 GiB",
                config.buffer_size
            )));
        }
        let crl = config.crl.as_deref();
        let crl_stamp = crl_stamp(crl);
        let tls = tls::server_config_with_crl(
            &config.ca,
            &config.cert,
            &config.key,
            crl.filter(|_| crl_stamp.is_some()),
        )?;
        // Checked once at start: a host without RDMA still serves (each client is told why it
        // cannot be served, with the fix), and the operator reads the fix now, not in the first
        // client's failure. A device named in the configuration is opened now, so without RDMA
        // that is an error naming the same fix.
        let availability = Device::availability();
        let no_rdma = |flag: String| ServerError::NoRdma {
            flag,
            availability: availability.clone(),
        };
        let fixed = match &config.device {
            Some(name) if !availability.is_available() => {
                return Err(no_rdma(format!("--device {name}")))
            }
            None if config.gid_index.is_some() && !availability.is_available() => {
                return Err(no_rdma("--gid-index".to_owned()))
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
            return Err(ServerError::Config(
                "--max-pending and --max-pending-per-address must be at least 1".into(),
            ));
        }
        if config.limits.max_sessions_per_identity == Some(0) {
            return Err(ServerError::Config(
                "--max-sessions-per-identity must be at least 1".into(),
            ));
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
            sessions_by_identity: KeyCounts::default(),
            cgroup_id: crate::quota::cgroup::id_of(std::process::id()).unwrap_or(0),
            devices: Devices {
                fixed,
                gid_index: config.gid_index,
                cache: Mutex::new(HashMap::new()),
                chosen: Mutex::new(HashMap::new()),
            },
            tls: Mutex::new(Tls {
                acceptor: TlsAcceptor::from(tls),
                crl_stamp,
            }),
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

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves; then stops accepting, says bye to
    /// every client, frees everything and returns.
    ///
    /// ```no_run
    /// # async fn demo(server: secure_rdma::server::Server) {
    /// // Serve until Ctrl-C; every client's RDMA resources are freed before `run` returns.
    /// let summary = server
    ///     .run(async {
    ///         let _ = tokio::signal::ctrl_c().await;
    ///     })
    ///     .await;
    /// println!("served {} clients, rejected {}", summary.served, summary.rejected);
    /// # }
    /// ```
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> Summary {
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(self.shared);
        let mut tasks = JoinSet::new();
        let mut summary = Summary {
            served: 0,
            rejected: 0,
        };
        tokio::pin!(shutdown);
        // accept() fails with EMFILE/ENFILE while descriptors are exhausted, and fails again at
        // once: without a pause the loop spins and logs millions of lines. Back off (10 ms
        // doubling to 1 s) and rate-limit the warnings.
        const MIN_PAUSE: Duration = Duration::from_millis(10);
        let mut pause_for = MIN_PAUSE;
        let pause = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(pause);
        let mut paused = false;
        let mut accept_log = LogLimiter::new(5, Duration::from_secs(1));
        let mut refused_log = LogLimiter::new(5, Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = &mut pause, if paused => paused = false,
                accepted = self.listener.accept(), if !paused => match accepted {
                    Ok((conn, peer)) => {
                        pause_for = MIN_PAUSE;
                        match Pending::take(&shared, peer.ip()) {
                            Ok(pending) => {
                                let shared = Arc::clone(&shared);
                                let stop = stop_rx.clone();
                                tasks.spawn(serve(conn, peer, shared, stop, pending));
                            }
                            Err(why) => {
                                // Closed before TLS: it costs nothing but this descriptor, now freed.
                                drop(conn);
                                shared.config.metrics.rejected(metrics::PENDING_LIMIT);
                                if let Some(suppressed) = refused_log.check() {
                                    tracing::warn!(%peer, suppressed, "connection closed at accept: {why}");
                                }
                            }
                        }
                    }
                    Err(e) => {
                        if let Some(suppressed) = accept_log.check() {
                            tracing::warn!(error = %e, suppressed, retry_in_ms = pause_for.as_millis() as u64, "accept failed; pausing accepts");
                        }
                        pause.as_mut().reset(tokio::time::Instant::now() + pause_for);
                        paused = true;
                        pause_for = (pause_for * 2).min(Duration::from_secs(1));
                    }
                },
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    tally(&mut summary, done);
                }
            }
        }
        tracing::info!(clients = tasks.len(), "shutting down: closing clients");
        let _ = stop_tx.send(true);
        while let Some(done) = tasks.join_next().await {
            tally(&mut summary, done);
        }
        tracing::info!(
            served = summary.served,
            rejected = summary.rejected,
            "server stopped; every client resource freed"
        );
        summary
    }
}

fn tally(summary: &mut Summary, done: Result<Outcome, tokio::task::JoinError>) {
    match done {
        Ok(Outcome::Served) => summary.served += 1,
        Ok(Outcome::Rejected) => summary.rejected += 1,
        Ok(Outcome::Failed) => {}
        Err(e) => tracing::error!(error = %e, "client task panicked"),
    }
}

enum Outcome {
    Served,
    Rejected,
    Failed,
}

/// Shows received bytes as text when printable, as hex otherwise.
pub fn render(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) if s.chars().all(|c| !c.is_control() || c == '\n' || c == '\t') => format!("{s:?}"),
        _ => {
            let mut hex = String::with_capacity(bytes.len() * 2 + 4);
            hex.push_str("hex:");
            for b in bytes {
                hex.push_str(&format!("{b:02x}"));
            }
            hex
        }
    }
}

impl Shared {
    /// The TLS acceptor for a new connection, rebuilt first if the CRL file changed: a
    /// revocation applies from the next handshake on, without a restart.
    fn acceptor(&self) -> TlsAcceptor {
        let cfg = &self.config;
        let mut tls = self.tls.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = crl_stamp(cfg.crl.as_deref());
        if stamp != tls.crl_stamp {
            let crl = cfg.crl.as_deref().filter(|_| stamp.is_some());
            match tls::server_config_with_crl(&cfg.ca, &cfg.cert, &cfg.key, crl) {
                Ok(config) => {
                    tls.acceptor = TlsAcceptor::from(config);
                    tls.crl_stamp = stamp;
                    tracing::info!(crl = ?crl, "certificate revocation list (re)loaded");
                }
                // Keep the revocations already in force rather than drop them all.
                Err(e) => tracing::error!(
                    error = %e,
                    "the CRL changed but cannot be read; keeping the previous one"
                ),
            }
        }
        tls.acceptor.clone()
    }
}

/// Live counts per key (connections per address, sessions per identity); a key leaves the map
/// when its count returns to 0, so the map holds only keys in use.
struct KeyCounts<K>(Mutex<HashMap<K, usize>>);

impl<K> Default for KeyCounts<K> {
    fn default() -> Self {
        KeyCounts(Mutex::new(HashMap::new()))
    }
}

impl<K: Eq + std::hash::Hash + Clone> KeyCounts<K> {
    /// Counts one more for `key`, unless it already has `max`: then `Err` with its count.
    fn take(&self, key: &K, max: Option<usize>) -> Result<(), usize> {
        let mut by = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = by.entry(key.clone()).or_insert(0);
        if max.is_some_and(|max| *n >= max) {
            return Err(*n);
        }
        *n += 1;
        Ok(())
    }

    /// Counts one less for `key`.
    fn release(&self, key: &K) {
        let mut by = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                by.remove(key);
            }
        }
    }
}

/// A connection that is not admitted yet: counted against the pending limits until dropped.
struct Pending {
    _permit: OwnedSemaphorePermit,
    address: IpAddr,
    shared: Arc<Shared>,
}

impl Pending {
    /// Counts a new connection from `address`, or says which limit it would exceed.
    fn take(shared: &Arc<Shared>, address: IpAddr) -> Result<Pending, String> {
        let limits = &shared.config.limits;
        let Ok(permit) = Arc::clone(&shared.pending).try_acquire_owned() else {
            return Err(format!(
                "{} connections already in TLS handshake or admission (--max-pending)",
                limits.max_pending
            ));
        };
        if let Err(n) = shared
            .pending_by_address
            .take(&address, Some(limits.max_pending_per_address))
        {
            return Err(format!(
                "{address} already has {n} connections in TLS handshake or admission (--max-pending-per-address)"
            ));
        }
        Ok(Pending {
            _permit: permit,
            address,
            shared: Arc::clone(shared),
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.shared.pending_by_address.release(&self.address);
    }
}

/// One live session of an identity, counted until dropped.
struct IdentitySession {
    identity: String,
    shared: Arc<Shared>,
}

impl IdentitySession {
    fn take(shared: &Arc<Shared>, identity: &str) -> Result<IdentitySession, RejectReason> {
        let identity = identity.to_owned();
        let max = shared.config.limits.max_sessions_per_identity;
        if let Err(active) = shared.sessions_by_identity.take(&identity, max) {
            return Err(RejectReason::IdentityLimit {
                identity,
                active,
                max: max.unwrap_or(active),
            });
        }
        Ok(IdentitySession {
            identity,
            shared: Arc::clone(shared),
        })
    }
}

impl Drop for IdentitySession {
    fn drop(&mut self) {
        self.shared.sessions_by_identity.release(&self.identity);
    }
}

async fn serve(
    conn: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    pending: Pending,
) -> Outcome {
    let cfg = &shared.config;
    // The handshake's duration counts from here: TLS, admission and RDMA setup.
    let accepted = Instant::now();
    let failed = |outcome: HandshakeOutcome| {
        cfg.metrics.handshake(outcome);
        Outcome::Failed
    };
    let local_ip = match conn.local_addr() {
        Ok(a) => a.ip(),
        Err(e) => {
            tracing::warn!(%peer, error = %e, "connection lost before TLS");
            return failed(HandshakeOutcome::Failed);
        }
    };
    let _ = conn.set_nodelay(true);
    let acceptor = shared.acceptor();
    let tls = match tokio::time::timeout(cfg.handshake_timeout, acceptor.accept(conn)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::warn!(%peer, error = %e, "TLS handshake failed: client refused");
            return failed(HandshakeOutcome::TlsFailed);
        }
        Err(_) => {
            tracing::warn!(%peer, "TLS handshake timed out");
            return failed(HandshakeOutcome::TimedOut);
        }
    };
    let conn_state = &tls.get_ref().1;
    let identity = match tls::client_identity(conn_state) {
        Ok(id) => id,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "client refused");
            return failed(HandshakeOutcome::TlsFailed);
        }
    };
    let chan = Channel::new(tls);
    // An explicit root: a connection's span must never nest under whatever
    // span happens to be current on the accepting thread.
    // Whether the TLS handshake resumed an earlier session rides on every line of the
    // connection's log: a resumed session was authenticated by the certificate checked then.
    let tls = match chan.get_ref().get_ref().1.handshake_kind() {
        Some(rustls::HandshakeKind::Resumed) => "resumed",
        _ => "full",
    };
    let span = tracing::info_span!(parent: None, "client", id = %identity, %peer, tls);
    async move {
        let admitted = admit(chan, identity, local_ip, peer.ip(), &shared, &stop).await;
        // Admitted or not, this connection is no longer pending.
        drop(pending);
        match admitted {
            Ok(admitted) => serve_session(admitted, peer, &shared, stop, accepted).await,
            Err(outcome) => outcome,
        }
    }
    .instrument(span)
    .await
}

type ServerChannel = Channel<tokio_rustls::server::TlsStream<TcpStream>>;

/// What an admitted client holds until its session is gone. Field order is
/// drop order: the quota counts, then the slot. Both go with the RDMA
/// resources, not after the goodbye, so a client waiting for this one to
/// leave finds room as soon as its kernel objects are gone.
struct Held {
    _quota: Option<(SessionAdmission, TenantQuota)>,
    _identity: IdentitySession,
    _slot: OwnedSemaphorePermit,
}

/// A client that passed admission: authenticated by TLS, a supported
/// protocol version, a free slot, a device for its address and its quota
/// counts reserved. Nothing RDMA exists for it yet.
struct Admitted {
    chan: ServerChannel,
    identity: String,
    device: Arc<Device>,
    sgid: GidEntry,
    secrets: Secrets,
    session_cfg: SessionConfig,
    /// Acknowledgements go over RDMA (the client asked for [`RDMA_ACKS`]).
    rdma_acks: bool,
    held: Held,
}

/// Admission, steps 1–2 of the [handshake](crate::handshake): the hello, a
/// slot, a device, the quotas; the client is told `accept` or why not. On a
/// refusal everything reserved so far is released and the outcome returned.
#[allow(clippy::too_many_arguments)] // one per fact about the connection, named
async fn admit(
    mut chan: ServerChannel,
    identity: String,
    local_ip: IpAddr,
    peer_ip: IpAddr,
    shared: &Arc<Shared>,
    stop: &watch::Receiver<bool>,
) -> Result<Admitted, Outcome> {
    let cfg = &shared.config;
    let hello = match tokio::time::timeout(cfg.handshake_timeout, chan.expect_hello()).await {
        Ok(Ok(hello)) if hello.version == VERSION => hello,
        Ok(Ok(hello)) => {
            let reason = RejectReason::Version {
                server: VERSION,
                client: hello.version,
            };
            return Err(reject(&cfg.metrics, &mut chan, reason).await);
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "no hello; closing");
            cfg.metrics.handshake(HandshakeOutcome::Failed);
            return Err(Outcome::Failed);
        }
        Err(_) => {
            tracing::warn!("no hello in time");
            cfg.metrics.handshake(HandshakeOutcome::TimedOut);
            return Err(Outcome::Failed);
        }
    };
    if *stop.borrow() {
        return Err(reject(&cfg.metrics, &mut chan, RejectReason::ShuttingDown).await);
    }
    let cipher = match cfg.protection.choose(&hello.ciphers) {
        Ok(c) => c,
        Err(reason) => return Err(reject(&cfg.metrics, &mut chan, reason).await),
    };
    // One identity cannot hold every slot.
    let identity_session = match IdentitySession::take(shared, &identity) {
        Ok(s) => s,
        Err(reason) => return Err(reject(&cfg.metrics, &mut chan, reason).await),
    };
    // A client slot before any RDMA resource exists.
    let Ok(slot) = Arc::clone(&shared.slots).try_acquire_owned() else {
        let max = cfg.max_clients;
        let active = max - shared.slots.available_permits();
        return Err(reject(
            &cfg.metrics,
            &mut chan,
            RejectReason::ServerFull { active, max },
        )
        .await);
    };
    let (device, sgid) = match shared.devices.resolve(local_ip) {
        Ok(found) => found,
        Err(e) => {
            // Without RDMA on this host, the client hears what the host lacks and the fix, not
            // libibverbs' errno (ENOSYS when the kernel has no RDMA support).
            let availability = Device::availability();
            let detail = if availability.is_available() {
                e.to_string()
            } else {
                availability.to_string()
            };
            tracing::error!(error = %e, "no RDMA device for this connection");
            return Err(reject(
                &cfg.metrics,
                &mut chan,
                RejectReason::Unavailable { detail },
            )
            .await);
        }
    };
    // The streaming data path: acknowledgements over RDMA, so the client may keep a window of
    // operations in flight; each needs a receive slot (16 posted) and, for WRITEs, a slot of
    // its own in the write region.
    let rdma_window = hello
        .capabilities
        .iter()
        .any(|c| c == RDMA_ACKS)
        .then_some(RDMA_WINDOW);
    let session_cfg = SessionConfig {
        buffer_size: cfg.buffer_size,
        recv_slots: RDMA_WINDOW,
        send_slots: rdma_window.unwrap_or(1),
        write_slots: rdma_window.unwrap_or(1),
        protected: cipher.is_some(),
        accept_writes: true,
        peer_address: (!cfg.allow_gid_mismatch).then_some(peer_ip),
        ..SessionConfig::default()
    };
    // Quotas are checked for everything the session will make, before any of
    // it reaches the kernel; the counts stay held until the session is gone.
    let quota = match &cfg.quotas {
        None => None,
        Some(quotas) => {
            let tenant = quotas.register(TenantInfo {
                identity: identity.clone(),
                pid: std::process::id(),
                cgroup_id: shared.cgroup_id,
            });
            match session_cfg.admit(&tenant) {
                Ok(admission) => Some((admission, tenant)),
                Err(refusal) => {
                    tracing::warn!(
                        client = %identity,
                        verb = %refusal.verb(),
                        key = %refusal.key(),
                        limit = refusal.limit(),
                        current = refusal.current(),
                        "INTERCEPTED: {refusal}"
                    );
                    let detail = refusal.to_string();
                    return Err(
                        reject(&cfg.metrics, &mut chan, RejectReason::Quota { detail }).await,
                    );
                }
            }
        }
    };
    let accept = Message::Accept {
        buffer_size: u32::try_from(cfg.buffer_size).unwrap_or(u32::MAX),
        identity: identity.clone(),
        cipher,
        rdma_window: rdma_window.map(|w| w as u32),
    };
    if chan.send(&accept).await.is_err() {
        cfg.metrics.handshake(HandshakeOutcome::Failed);
        return Err(Outcome::Failed);
    }
    // The confirmation tokens and payload keys are derived while the accept travels: the
    // client needs neither before it has made its QP, and under emulation the four exporter
    // calls take a few hundred microseconds of the handshake.
    let secrets = match derive_secrets(chan.get_ref().get_ref().1, cipher) {
        Ok(secrets) => secrets,
        Err(e) => {
            tracing::error!(error = %e, "TLS exporter failed");
            cfg.metrics.handshake(HandshakeOutcome::Failed);
            return Err(Outcome::Failed);
        }
    };
    Ok(Admitted {
        chan,
        identity,
        device,
        sgid,
        secrets,
        session_cfg,
        rdma_acks: rdma_window.is_some(),
        held: Held {
            _quota: quota,
            _identity: identity_session,
            _slot: slot,
        },
    })
}

/// The server's confirmation tokens (its own and the one it expects) and, with a cipher, its
/// payload keys, from the TLS session's exporter.
fn derive_secrets(
    conn: &rustls::ServerConnection,
    cipher: Option<crate::protect::Cipher>,
) -> Result<Secrets, tls::TlsError> {
    let tokens = tls::confirmation_tokens(conn, Side::Server)?;
    let protection = match cipher {
        None => None,
        Some(c) => Some(Protection::from_tls(conn, Side::Server, c)?),
    };
    Ok(Secrets { tokens, protection })
}

/// Steps 3–6: RDMA setup and confirmation, then the client's operations
/// until it leaves, goes idle or the server stops; then everything the
/// client held is freed, RDMA resources first.
async fn serve_session(
    admitted: Admitted,
    peer: SocketAddr,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
    accepted: Instant,
) -> Outcome {
    let cfg = &shared.config;
    let Admitted {
        mut chan,
        identity,
        device,
        sgid,
        secrets,
        session_cfg,
        rdma_acks,
        held,
    } = admitted;
    // A goodbye or an abort is a courtesy: never worth more than a short wait on a peer that
    // stopped reading.
    let courtesy = cfg.limits.write_timeout.min(Duration::from_secs(2));
    let setup = Session::establish(&mut chan, &device, sgid, secrets, session_cfg);
    let mut session = match tokio::time::timeout(cfg.handshake_timeout, setup).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "RDMA setup failed; resources freed");
            cfg.metrics.handshake(HandshakeOutcome::Failed);
            // The client waits for our endpoint or confirmation: tell it why none comes,
            // rather than close the connection on it (bounded: it may have gone).
            let abort = Message::Abort {
                reason: AbortReason::RdmaSetup {
                    detail: e.to_string(),
                },
            };
            let _ = send_within(&mut chan, &abort, courtesy).await;
            return Outcome::Failed;
        }
        Err(_) => {
            tracing::warn!("RDMA setup timed out; resources freed");
            cfg.metrics.handshake(HandshakeOutcome::TimedOut);
            return Outcome::Failed;
        }
    };
    let timing = session.timing();
    cfg.metrics
        .verb(device.name(), TimedVerb::QpSetup, timing.setup);
    cfg.metrics
        .verb(device.name(), TimedVerb::QpConfirm, timing.confirmation);
    cfg.metrics.established(accepted.elapsed());
    // Counted until the session's resources are freed, below.
    let active = cfg.metrics.session_started(device.name());
    let traffic = cfg.metrics.session(&identity, device.name());
    let w = *session.wiring();
    // QPNs, rkeys and addresses help an attacker aim (ReDMArk): debug only.
    tracing::debug!(
        client = %identity,
        qpn = %w.local.qpn,
        peer_qpn = %w.remote.qpn,
        rkey = w.local.buffer.map(|b| b.rkey),
        "RDMA wiring"
    );
    tracing::info!(
        client = %identity,
        device = device.name(),
        gid = %w.local.gid,
        peer_gid = %w.remote.gid,
        cipher = session.cipher().map_or("none", |c| c.name()),
        active = cfg.max_clients - shared.slots.available_permits(),
        max = cfg.max_clients,
        "client connected"
    );

    session.set_poll(cfg.poll);
    let limits = cfg.limits;
    let lifetime = tokio::time::sleep(limits.max_session_lifetime.unwrap_or(Duration::MAX / 4));
    tokio::pin!(lifetime);
    // At info, a bounded preview of what arrived, at most 20 lines at once and 10 a second per
    // client: one client cannot flood the log (the full content is at debug).
    let mut content_log = LogLimiter::new(20, Duration::from_millis(100));
    let peer = Arc::new(Peer {
        identity: identity.clone(),
        address: peer,
    });
    let mut seq = 0u64;
    let reason = loop {
        tokio::select! {
            request = chan.expect_client_request() => match request {
                Ok(ClientRequest::Bye) => {
                    let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                    break "client quit".to_owned();
                }
                Err(e @ HandshakeError::Unexpected { .. }) => break e.to_string(),
                Err(e) => break format!("disconnected: {e}"),
            },
            arrival = session.arrival() => {
                let arrival = match arrival {
                    Ok(a) => a,
                    Err(SessionError::Auth(e)) => {
                        // Nothing of the message was delivered. The QP consumed a PSN the
                        // client never sent, so its next message would be dropped as a
                        // duplicate: end the session and tell the client why.
                        cfg.auth_failures.record(&identity);
                        cfg.metrics.auth_failure(&identity);
                        tracing::warn!(
                            client = %identity,
                            detail = %e,
                            failures = cfg.auth_failures.total(),
                            "RDMA message failed authentication (forged, replayed or corrupted); tearing the session down"
                        );
                        let abort = Message::Abort { reason: AbortReason::AuthenticationFailed };
                        let _ = send_within(&mut chan, &abort, courtesy).await;
                        break "RDMA message failed authentication".to_owned();
                    }
                    Err(e) => break format!("RDMA error: {e}"),
                };
                seq += 1;
                let op = arrival.op();
                traffic.received(op, arrival.data().len());
                let bytes = u32::try_from(arrival.data().len()).unwrap_or(u32::MAX);
                match &shared.handler {
                    None => log_arrival(&identity, op, seq, arrival.data(), &mut content_log),
                    Some(handler) => {
                        // The content is the application's now: only its size is logged.
                        tracing::debug!(client = %identity, seq, bytes, %op, "handing the arrival to the application");
                        let delivery = Delivery { peer: Arc::clone(&peer), seq, arrival };
                        // Acknowledged only once the application has it (a full channel holds
                        // the client back here); shutdown still wins over a handler that waits.
                        let handled = tokio::select! {
                            handled = handler.handle_boxed(delivery) => handled,
                            _ = stop.changed() => {
                                let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                                break "server shutdown".to_owned();
                            }
                        };
                        if let Err(e) = handled {
                            tracing::warn!(client = %identity, seq, error = %e, "the application did not take an arrival; ending the session unacknowledged");
                            let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                            break format!("{e}");
                        }
                    }
                }
                if rdma_acks {
                    // The streaming data path: the acknowledgement is the client's credit back,
                    // SENT over RDMA (sealed like a payload). Posted without waiting: the send
                    // slots bound what is in flight.
                    let record = Ack { op, seq, bytes }.encode();
                    let posting = Instant::now();
                    if let Err(e) = session.post(Op::Send, &record).await {
                        break format!("RDMA error: {e}");
                    }
                    traffic.post_send(posting.elapsed());
                    continue;
                }
                let ack = Message::Ack { op, seq, bytes };
                // Bounded, and shutdown wins even while a client that stopped reading blocks
                // the write.
                let sent = tokio::select! {
                    sent = send_within(&mut chan, &ack, limits.write_timeout) => sent,
                    _ = stop.changed() => Err("server shutdown".to_owned()),
                };
                if let Err(reason) = sent {
                    break reason;
                }
            }
            _ = stop.changed() => {
                let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                break "server shutdown".to_owned();
            }
            _ = tokio::time::sleep(cfg.idle_timeout) => {
                let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                break format!("idle for {:?}", cfg.idle_timeout);
            }
            _ = &mut lifetime, if limits.max_session_lifetime.is_some() => {
                let max = limits.max_session_lifetime.unwrap_or_default();
                let abort = Message::Abort { reason: AbortReason::Lifetime { seconds: max.as_secs() } };
                let _ = send_within(&mut chan, &abort, courtesy).await;
                break format!("session lifetime {max:?} reached");
            }
        }
    };
    drop(session);
    drop(active);
    drop(held);
    let _ = tokio::time::timeout(courtesy, chan.close()).await;
    tracing::info!(
        client = %identity,
        %reason,
        operations = seq,
        unlogged = content_log.suppressed(),
        "client gone; its PD, CQs, MRs and QP are freed"
    );
    Outcome::Served
}

/// Writes one message to a client, or says why it could not within `limit`.
async fn send_within(
    chan: &mut ServerChannel,
    msg: &Message,
    limit: Duration,
) -> Result<(), String> {
    match tokio::time::timeout(limit, chan.send(msg)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("disconnected: {e}")),
        Err(_) => Err(format!(
            "the client did not read its TLS socket for {limit:?}; disconnected"
        )),
    }
}

/// Bytes of received content shown at info level.
const PREVIEW_BYTES: usize = 64;

fn log_arrival(identity: &str, op: Op, seq: u64, data: &[u8], limit: &mut LogLimiter) {
    let what = match op {
        Op::Send => "SEND received",
        Op::Write => "WRITE landed",
    };
    tracing::debug!(client = %identity, seq, bytes = data.len(), content = %render(data), "{what} (full content)");
    if let Some(suppressed) = limit.check() {
        let content = preview(data, PREVIEW_BYTES);
        match op {
            Op::Send => {
                tracing::info!(client = %identity, seq, bytes = data.len(), %content, suppressed, "SEND received")
            }
            Op::Write => {
                tracing::info!(client = %identity, seq, bytes = data.len(), %content, suppressed, "WRITE landed")
            }
        }
    }
}

/// [`render`] of at most `max` bytes, saying how many more there were.
pub fn preview(bytes: &[u8], max: usize) -> String {
    if bytes.len() <= max {
        return render(bytes);
    }
    // Cut text at a character boundary so a preview of text stays text.
    let cut = match std::str::from_utf8(bytes) {
        Ok(s) => s
            .char_indices()
            .map(|(i, _)| i)
            .take_while(|&i| i <= max)
            .last()
            .unwrap_or(0),
        Err(_) => max,
    };
    format!("{}… (+{} bytes)", render(&bytes[..cut]), bytes.len() - cut)
}

async fn reject<S>(counts: &ServerMetrics, chan: &mut Channel<S>, reason: RejectReason) -> Outcome
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    tracing::warn!(%reason, "client rejected");
    counts.handshake(HandshakeOutcome::Rejected);
    counts.rejected(metrics::rejection_reason(&reason));
    // Bounded: a refused client that does not read must not keep its task.
    let courtesy = Duration::from_secs(2);
    let _ = tokio::time::timeout(courtesy, chan.send(&Message::Reject { reason })).await;
    let _ = tokio::time::timeout(courtesy, chan.close()).await;
    Outcome::Rejected
}

#[cfg(test)]
mod tests {
    use super::{preview, render};

    #[test]
    fn previews_are_bounded_and_say_what_was_cut() {
        assert_eq!(preview(b"short", 64), "\"short\"");
        let long = "é".repeat(100); // 200 bytes
        let p = preview(long.as_bytes(), 64);
        assert!(p.starts_with("\"éé"), "{p}");
        assert!(p.ends_with("… (+136 bytes)"), "{p}");
        let bin = vec![0u8; 1000];
        let p = preview(&bin, 8);
        assert_eq!(p, "hex:0000000000000000… (+992 bytes)");
    }

    #[test]
    fn protection_policy_picks_a_common_cipher_or_says_why_not() {
        use super::{Cipher, ProtectionPolicy, RejectReason};
        let auto = ProtectionPolicy::default();
        assert!(!auto.allow_unprotected);
        // The server's preference wins among what the client accepts.
        let both = [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm];
        assert_eq!(auto.choose(&both), Ok(Some(auto.ciphers[0])));
        assert_eq!(
            auto.choose(&[Cipher::ChaCha20Poly1305]),
            Ok(Some(Cipher::ChaCha20Poly1305))
        );
        // A client asking for payloads in clear is refused, with the reason and the fix.
        match auto.choose(&[]) {
            Err(RejectReason::Policy { detail }) => {
                assert!(detail.contains("--no-payload-protection"), "{detail}")
            }
            other => panic!("unprotected client admitted: {other:?}"),
        }
        let lenient = ProtectionPolicy {
            allow_unprotected: true,
            ..ProtectionPolicy::default()
        };
        assert_eq!(lenient.choose(&[]), Ok(None));
        let only_aes = ProtectionPolicy {
            ciphers: vec![Cipher::Aes256Gcm],
            allow_unprotected: false,
        };
        let err = only_aes.choose(&[Cipher::ChaCha20Poly1305]).unwrap_err();
        assert!(
            err.to_string().contains("no common payload cipher"),
            "{err}"
        );
    }

    #[test]
    fn auth_failures_count_per_identity() {
        let f = super::AuthFailures::default();
        f.record("alice");
        f.record("alice");
        f.clone().record("bob");
        assert_eq!(f.total(), 3);
        assert_eq!(f.snapshot().get("alice"), Some(&2));
    }

    #[test]
    fn render_text_or_hex() {
        assert_eq!(render(b"hello"), "\"hello\"");
        assert_eq!(render(&[0, 1, 0xff]), "hex:0001ff");
        assert_eq!(render(b"a\x07b"), "hex:610762");
    }
}
