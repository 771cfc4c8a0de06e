//! The secure client: TLS connect, admission, RDMA setup and the `send` /
//! `write` operations, each acknowledged by the server: over TLS, or, on the
//! streaming data path ([`ClientConfig::rdma_acks`]), over RDMA with up to a
//! window of operations in flight ([`Client::post`], [`Client::flush`]).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::datapath::{AbortReason, StreamId};
use crate::handshake::{
    Accepted, Channel, EarlyEndpoint, Endpoint, HandshakeError, Kind, Message, RejectReason,
    Resume, StreamHello, Verdict, CAPABILITIES, RDMA_ACKS, VERSION,
};
use crate::protect::{Cipher, Protection, Side};
use crate::session::{Prepared, Secrets, Session, SessionConfig, SessionError};

mod lanes;
mod link;
mod provision;
mod source_ports;
mod stream;

use crate::tls;
use crate::verbs::{Device, GidSelector, VerbsError};
pub use lanes::{LaneOpened, LaneStats};
use link::Link;
pub use stream::{Client, Recovering, Recovery, ResumeEvent, ResumeOutcome};

/// Client settings. Built with [`ClientConfig::new`] and the `with_*`
/// setters, so that new settings can come without breaking callers:
///
/// ```
/// use std::time::Duration;
/// use secure_rdma::client::ClientConfig;
///
/// let cfg = ClientConfig::new("10.77.0.1")
///     .with_identity("certs/alice.pem", "certs/alice.key")
///     .with_timeout(Duration::from_secs(10));
/// assert_eq!(cfg.port, 4433);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ClientConfig {
    /// Server host (name or address).
    pub host: String,
    /// Server port.
    pub port: u16,
    /// Name the server certificate must carry (default: `host`).
    pub server_name: String,
    /// CA certificate the server must chain to.
    pub ca: PathBuf,
    /// Our certificate and key; `None` connects without one (the server
    /// refuses that; it exists to show the refusal).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// RDMA device; default: the one carrying our local address.
    pub device: Option<String>,
    /// Source GID index; default: the RoCEv2 GID of our local address.
    pub gid_index: Option<u32>,
    /// Timeout of each step.
    pub timeout: Duration,
    /// Payload ciphers this client accepts, preferred first; empty asks for
    /// payloads in clear. A server that chooses
    /// none while we offered some is refused: never silently unprotected.
    pub ciphers: Vec<Cipher>,
    /// The largest per-message buffer this client agrees to allocate; a
    /// server asking for more is refused (it would make us pin its size in
    /// memory for every slot).
    pub max_buffer_size: usize,
    /// Accept a server whose RDMA GID is not the address we reached over TLS.
    pub allow_gid_mismatch: bool,
    /// Ask for the streaming data path: the server acknowledges over RDMA
    /// (sealed records, no TLS round trip per operation), and the client may
    /// keep a window of operations in flight. A server that does not offer
    /// it acknowledges over TLS as usual.
    pub rdma_acks: bool,
    /// What a lost session does to the operations in flight: resumed exactly
    /// once (the default), sent again at least once, or reported.
    pub recovery: Recovery,
    /// How the reconnects of a recovery are spaced and how many are tried.
    pub backoff: Backoff,
    /// Lanes (RC QPs) the session opens on connecting, its first included ([`crate::lanes`]):
    /// 1, the default, is a session as before. More than 1 asks for the streaming data path
    /// too (each lane's acknowledgements come over its own QP), and the extra lanes are
    /// opened over the session's TLS connection with [`Client::add_lane`].
    pub lanes: usize,
    /// Session resources (PD, CQs, memory regions, QP in INIT with its receives posted) a
    /// [`Connector`] keeps ready for its next connections and lanes ([`crate::warm`]), made by
    /// a thread of its own; each serves one session. 0, the default, makes each connection's
    /// on its path.
    pub warm_pool: usize,
    /// Receive slots of one shared receive queue per device that all of a [`Connector`]'s
    /// sessions and lanes take their receives from, their sends completing on shared CQs too
    /// ([`crate::shared_queue`]): one process holding many sessions (`secure-client bench
    /// hold`) then makes no receive queue, receive slots or CQ per session. A session whose
    /// messages are larger than the first session's makes its own. 0, the default, gives each
    /// session its own, and only then does the warm pool serve them.
    pub shared_receive_queue: usize,
    /// Source ports the control connections are bound to, each taken in turn (one in use is
    /// passed over); `None`, the default, leaves the choice to the kernel. For one process
    /// holding tens of thousands of sessions to one server from one address (`secure-client
    /// bench hold`): past about 32,000 there, Linux's `connect()` walks every port it has
    /// given out on each new connection (one parity of the ephemeral range is full), where
    /// binding a chosen port is one lookup.
    pub source_ports: Option<std::ops::RangeInclusive<u16>>,
    /// Send a warm QP's endpoint with the hello, made for the session the server gave this
    /// [`Connector`] last (see [`crate::handshake::EarlyEndpoint`]): a server that takes it
    /// answers with its own endpoint in the accept, and the setup needs no TLS message after
    /// it. On by default; it applies only with a warm pool and without a shared receive queue,
    /// from the second connection on. `false` follows the endpoint, ready and confirmed steps.
    pub early_endpoint: bool,
}

impl ClientConfig {
    /// Settings for `host` with the defaults: port 4433, CA `certs/ca.pem`,
    /// no identity, both ciphers, 16 MiB buffers at most, 5-second steps.
    pub fn new(host: &str) -> ClientConfig {
        ClientConfig {
            host: host.to_owned(),
            port: 4433,
            server_name: host.to_owned(),
            ca: "certs/ca.pem".into(),
            identity: None,
            device: None,
            gid_index: None,
            timeout: Duration::from_secs(5),
            ciphers: Cipher::preference().to_vec(),
            max_buffer_size: DEFAULT_MAX_BUFFER,
            allow_gid_mismatch: false,
            rdma_acks: false,
            recovery: Recovery::default(),
            backoff: Backoff::default(),
            lanes: 1,
            warm_pool: 0,
            shared_receive_queue: 0,
            source_ports: None,
            early_endpoint: true,
        }
    }

    /// Sets [`ClientConfig::early_endpoint`].
    ///
    /// ```
    /// use secure_rdma::client::ClientConfig;
    /// let cfg = ClientConfig::new("10.77.0.1").with_early_endpoint(false);
    /// assert!(!cfg.early_endpoint);
    /// ```
    pub fn with_early_endpoint(mut self, early: bool) -> ClientConfig {
        self.early_endpoint = early;
        self
    }

    /// Sets the lanes opened on connecting ([`ClientConfig::lanes`]; at least 1).
    ///
    /// ```
    /// use secure_rdma::client::ClientConfig;
    /// let cfg = ClientConfig::new("10.77.0.1").with_lanes(4);
    /// assert_eq!(cfg.lanes, 4);
    /// ```
    pub fn with_lanes(mut self, lanes: usize) -> ClientConfig {
        self.lanes = lanes.max(1);
        self
    }

    /// Sets [`ClientConfig::warm_pool`].
    ///
    /// ```
    /// use secure_rdma::client::ClientConfig;
    /// let cfg = ClientConfig::new("10.77.0.1").with_warm_pool(4);
    /// assert_eq!(cfg.warm_pool, 4);
    /// ```
    pub fn with_warm_pool(mut self, resources: usize) -> ClientConfig {
        self.warm_pool = resources;
        self
    }

    /// Sets [`ClientConfig::shared_receive_queue`].
    ///
    /// ```
    /// use secure_rdma::client::ClientConfig;
    /// let cfg = ClientConfig::new("10.77.0.1").with_shared_receive_queue(1024);
    /// assert_eq!(cfg.shared_receive_queue, 1024);
    /// ```
    pub fn with_shared_receive_queue(mut self, slots: usize) -> ClientConfig {
        self.shared_receive_queue = slots;
        self
    }

    /// Sets the source ports of the control connections ([`ClientConfig::source_ports`]).
    ///
    /// ```
    /// use secure_rdma::client::ClientConfig;
    /// let cfg = ClientConfig::new("10.77.0.1").with_source_ports(Some(10_000..=60_000));
    /// assert_eq!(cfg.source_ports, Some(10_000..=60_000));
    /// ```
    pub fn with_source_ports(
        mut self,
        ports: Option<std::ops::RangeInclusive<u16>>,
    ) -> ClientConfig {
        self.source_ports = ports;
        self
    }

    /// Whether the hello asks for the streaming data path: asked for, or needed by lanes.
    fn wants_rdma_acks(&self) -> bool {
        self.rdma_acks || self.lanes > 1
    }

    /// Sets what a lost session does ([`ClientConfig::recovery`]).
    pub fn with_recovery(mut self, recovery: Recovery) -> ClientConfig {
        self.recovery = recovery;
        self
    }

    /// Sets the reconnects' backoff ([`ClientConfig::backoff`]).
    pub fn with_backoff(mut self, backoff: Backoff) -> ClientConfig {
        self.backoff = backoff;
        self
    }

    /// Sets the server port.
    pub fn with_port(mut self, port: u16) -> ClientConfig {
        self.port = port;
        self
    }

    /// Sets the name the server certificate must carry ([`ClientConfig::server_name`]).
    pub fn with_server_name(mut self, name: impl Into<String>) -> ClientConfig {
        self.server_name = name.into();
        self
    }

    /// Sets the CA certificate the server must chain to.
    pub fn with_ca(mut self, ca: impl Into<PathBuf>) -> ClientConfig {
        self.ca = ca.into();
        self
    }

    /// Sets the RDMA device (`None`: the one carrying our local address).
    pub fn with_device(mut self, device: Option<String>) -> ClientConfig {
        self.device = device;
        self
    }

    /// Sets the source GID index (`None`: the RoCEv2 GID of our local address).
    pub fn with_gid_index(mut self, gid_index: Option<u32>) -> ClientConfig {
        self.gid_index = gid_index;
        self
    }

    /// Sets the timeout of each step.
    pub fn with_timeout(mut self, timeout: Duration) -> ClientConfig {
        self.timeout = timeout;
        self
    }

    /// Sets the payload ciphers accepted, preferred first; empty asks for payloads in clear.
    pub fn with_ciphers(mut self, ciphers: Vec<Cipher>) -> ClientConfig {
        self.ciphers = ciphers;
        self
    }

    /// Sets the largest per-message buffer this client agrees to allocate.
    pub fn with_max_buffer_size(mut self, max_buffer_size: usize) -> ClientConfig {
        self.max_buffer_size = max_buffer_size;
        self
    }

    /// Sets whether a server whose RDMA GID is not the address reached over TLS is accepted.
    pub fn with_allow_gid_mismatch(mut self, allow: bool) -> ClientConfig {
        self.allow_gid_mismatch = allow;
        self
    }

    /// Sets whether to ask for the streaming data path ([`ClientConfig::rdma_acks`]).
    pub fn with_rdma_acks(mut self, rdma_acks: bool) -> ClientConfig {
        self.rdma_acks = rdma_acks;
        self
    }

    /// Sets our certificate and key: the certificate's name is our identity.
    pub fn with_identity(
        mut self,
        cert: impl Into<PathBuf>,
        key: impl Into<PathBuf>,
    ) -> ClientConfig {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    /// Connects without a certificate (the server refuses that; it exists to
    /// show the refusal).
    pub fn without_identity(mut self) -> ClientConfig {
        self.identity = None;
        self
    }
}

/// The largest window of unacknowledged operations a client accepts from a
/// server: each one costs a send slot of the server's buffer size here.
pub const MAX_RDMA_WINDOW: u32 = 64;

/// What [`ClientConfig::max_buffer_size`] is unless set: 16 MiB.
pub const DEFAULT_MAX_BUFFER: usize = 16 << 20;

/// Why the client stopped. Each variant is a distinct cause, for a binary to
/// map to its own exit code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The TCP connection failed (refused, no route, or no answer in time).
    #[error("server {addr} unreachable: {source}")]
    Unreachable {
        /// What was dialled.
        addr: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// TLS failed: a certificate was refused on either side, or the peer
    /// sent an alert.
    #[error("TLS refused: {0}")]
    Tls(#[from] rustls::Error),
    /// The TLS connection broke before it was established (not a refusal
    /// rustls could name, e.g. the server reset the connection).
    #[error("TLS refused: {0}")]
    TlsIo(#[source] std::io::Error),
    /// The TLS handshake did not finish in time.
    #[error("TLS refused: handshake timed out after {0:?}")]
    TlsTimeout(Duration),
    /// The name the server certificate must carry is not a valid DNS name or
    /// address.
    #[error("TLS refused: invalid server name {name:?}: {source}")]
    ServerName {
        /// The name given.
        name: String,
        /// Why it is invalid.
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    /// Local TLS material is unusable.
    #[error(transparent)]
    TlsConfig(#[from] tls::TlsError),
    /// The server refused us after authenticating.
    #[error("rejected by server: {0}")]
    Rejected(RejectReason),
    /// No RDMA device or GID for our address.
    #[error(transparent)]
    Device(VerbsError),
    /// The RDMA connection could not be confirmed.
    #[error(transparent)]
    Confirm(SessionError),
    /// The server would protect nothing (or not with a cipher we accept).
    #[error("the server chose {chosen} for payloads, but this client requires {required}; refusing the session")]
    Unprotected {
        /// What the server chose ("no protection" or a cipher).
        chosen: String,
        /// What we offered.
        required: String,
    },
    /// The server asks for larger buffers than this client allocates.
    #[error("the server asks for {asked}-byte buffers; this client allocates at most {max}")]
    BufferTooLarge {
        /// The server's buffer size.
        asked: usize,
        /// Our limit.
        max: usize,
    },
    /// The server acknowledged an operation this client did not make: a
    /// message was forged into the session (possible only without payload
    /// protection). The session cannot be trusted any more.
    #[error("the server acknowledged operation #{acked}, but this client made {made}: an RDMA message was forged into this session (payload protection is off)")]
    Forged {
        /// The sequence number the server acknowledged.
        acked: u64,
        /// Operations this client made in the session.
        made: u64,
    },
    /// Anything else in the protocol or on the RDMA path.
    #[error(transparent)]
    Session(SessionError),
    /// The server offers no lanes on this session: a server of an earlier release, one that
    /// allows one lane per identity, or a session without the streaming data path.
    #[error("the server offers no lanes on this session (it allows one QP per session, or is of an earlier release); the session keeps its one lane")]
    NoLanes,
    /// The server refused its write region (a quota, its device): nothing was sent, and the
    /// session goes on with SENDs.
    #[error("the server refused its write region: {0}; nothing was written, and the session goes on (SENDs only)")]
    WriteRejected(RejectReason),
    /// The server refused one more lane; the session and its other lanes go on.
    #[error("lane {lane} refused by the server: {reason}; the session and its other lanes go on")]
    LaneRejected {
        /// The lane asked for.
        lane: u32,
        /// Why.
        reason: RejectReason,
    },
    /// The server closed a lane while it was being confirmed (it refused the lane's token, or
    /// its QP failed): the reason is the server's, said over TLS.
    #[error("lane {lane} was not confirmed: the server closed it ({reason}); the session and its other lanes go on")]
    LaneNotConfirmed {
        /// The lane asked for.
        lane: u32,
        /// The server's reason.
        reason: String,
    },
    /// A lane other than the first failed (its QP errored, an acknowledgement never came or
    /// failed authentication). The client resumes its stream on a new lane once
    /// ([`Client::flush`]); this is the error when that is not possible, or the new lane fails
    /// too, with the operations left unacknowledged.
    #[error("lane {lane} failed with {unacknowledged} operations unacknowledged: {source}")]
    LaneLost {
        /// The lane.
        lane: u32,
        /// Its operations without an acknowledgement.
        unacknowledged: usize,
        /// Why.
        #[source]
        source: SessionError,
    },
}

impl ClientError {
    /// True when the session was lost but a new one may well work: the
    /// server ended it (an authentication failure, a restart, shutdown), the
    /// connection broke, or the server is not reachable (yet). False for
    /// what a retry cannot fix: certificates (also a session the server ended
    /// because this client's certificate was revoked or expired, see
    /// [`ClientError::certificate_ended`]), rejections, configuration.
    pub fn is_session_lost(&self) -> bool {
        match self {
            ClientError::Unreachable { .. }
            | ClientError::TlsIo(_)
            | ClientError::Forged { .. } => true,
            ClientError::Session(SessionError::Handshake(h))
            | ClientError::Confirm(SessionError::Handshake(h)) => {
                // A revoked or expired certificate is refused again: not worth a retry.
                matches!(h, HandshakeError::Aborted(reason) if reason.retry_may_help())
                    || matches!(
                        h,
                        HandshakeError::Closed
                            | HandshakeError::Io(_)
                            | HandshakeError::Unexpected {
                                got: Kind::Bye | Kind::Abort,
                                ..
                            }
                    )
            }
            ClientError::Session(
                SessionError::Verbs(_) | SessionError::Timeout(..) | SessionError::Auth(_),
            ) => true,
            ClientError::Rejected(RejectReason::ShuttingDown) => true,
            _ => false,
        }
    }

    /// True when a resume's attempt that failed with this error is worth another: a lost
    /// session ([`ClientError::is_session_lost`]), and also a confirmation that failed over
    /// RDMA ([`ClientError::Confirm`] with [`SessionError::ConfirmTimeout`] or
    /// [`SessionError::ConfirmFailed`]). On a first
    /// connection that is as likely a configuration that can never work (a GID or PSN
    /// mismatch drops RC packets silently), so it is reported at once; on a resume the same
    /// configuration and path carried the lost session, so a token lost on the way is the
    /// path's fault, as the lost session itself was, and the next attempt may well pass.
    ///
    /// ```
    /// use secure_rdma::client::ClientError;
    /// use secure_rdma::session::SessionError;
    /// use std::time::Duration;
    ///
    /// let lost_token = ClientError::Confirm(SessionError::ConfirmTimeout(Duration::from_secs(5)));
    /// assert!(!lost_token.is_session_lost() && lost_token.worth_another_resume());
    /// assert!(!ClientError::Confirm(SessionError::BadToken).worth_another_resume());
    /// ```
    pub fn worth_another_resume(&self) -> bool {
        self.is_session_lost()
            || matches!(
                self,
                ClientError::Confirm(
                    SessionError::ConfirmTimeout(_) | SessionError::ConfirmFailed(_)
                )
            )
    }

    /// The abort that ended the session because this client's certificate no longer admits it
    /// (revoked, or expired during the session): a new connection with the same certificate
    /// is refused, so nothing retries it. `None` for any other error.
    pub fn certificate_ended(&self) -> Option<&AbortReason> {
        match self {
            ClientError::Session(SessionError::Handshake(HandshakeError::Aborted(reason)))
            | ClientError::Confirm(SessionError::Handshake(HandshakeError::Aborted(reason)))
                if !reason.retry_may_help() =>
            {
                Some(reason)
            }
            _ => None,
        }
    }

    /// The operation in flight may have reached the server although no acknowledgement of it
    /// could be trusted: a message from the server failed authentication (forged on the path,
    /// replayed or corrupted). A new session is safe; sending the operation again blindly is
    /// not, since the server may already have it: the client's resume
    /// ([`Recovery::Resume`]) asks the server instead. Only a caller that recovers on its own
    /// ([`Recovery::Fail`]) sees this error.
    ///
    /// ```
    /// use secure_rdma::client::ClientError;
    /// use secure_rdma::protect::AuthError;
    /// use secure_rdma::session::SessionError;
    ///
    /// let forged = ClientError::Session(SessionError::Auth(AuthError::Truncated(13)));
    /// assert!(forged.is_session_lost() && forged.delivery_unknown());
    /// ```
    pub fn delivery_unknown(&self) -> bool {
        matches!(self, ClientError::Session(SessionError::Auth(_)))
    }
}

/// How [`connect_with_retry`] retries: exponential backoff with full jitter,
/// bounded in attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Attempts after the first failure; 0 never retries.
    pub attempts: u32,
    /// The first delay's upper bound; doubled after each failure.
    pub base: Duration,
    /// No delay exceeds this.
    pub max: Duration,
}

impl Default for Backoff {
    /// 6 retries from 200 ms, at most 5 s apart.
    fn default() -> Self {
        Backoff {
            attempts: 6,
            base: Duration::from_millis(200),
            max: Duration::from_secs(5),
        }
    }
}

impl Backoff {
    /// The delay before retry `n` (0-based): uniform in
    /// `[cap/2, cap]` with `cap = min(max, base * 2^n)`. The jitter keeps
    /// many clients that lost one server from reconnecting in lockstep; the
    /// floor keeps a retry from hammering a restarting server.
    pub fn delay(&self, n: u32) -> Duration {
        use rand_core::RngCore;
        let cap = self
            .base
            .saturating_mul(1u32.checked_shl(n.min(31)).unwrap_or(u32::MAX))
            .min(self.max);
        let half = cap / 2;
        let span = u64::try_from((cap - half).as_micros()).unwrap_or(u64::MAX);
        let jitter = if span == 0 {
            0
        } else {
            rand_core::OsRng.next_u64() % (span + 1)
        };
        half + Duration::from_micros(jitter)
    }
}

/// Connects, retrying with [`Backoff`] while the failure is one a new
/// attempt can fix ([`ClientError::is_session_lost`]). `on_retry` is told
/// each failed attempt (1-based), its error and the delay before the next,
/// so the caller can log it.
///
/// ```no_run
/// use secure_rdma::client::{connect_with_retry, Backoff, ClientConfig};
///
/// # async fn demo() -> Result<(), secure_rdma::client::ClientError> {
/// let cfg = ClientConfig::new("10.77.0.1");
/// let client = connect_with_retry(&cfg, Backoff::default(), |attempt, err, delay| {
///     eprintln!("attempt {attempt} failed: {err}; retrying in {delay:?}");
/// })
/// .await?;
/// # Ok(()) }
/// ```
pub async fn connect_with_retry(
    cfg: &ClientConfig,
    backoff: Backoff,
    mut on_retry: impl FnMut(u32, &ClientError, Duration),
) -> Result<Client, ClientError> {
    let mut n = 0;
    loop {
        match Client::connect(cfg).await {
            Ok(c) => return Ok(c),
            Err(e) if e.is_session_lost() && n < backoff.attempts => {
                let delay = backoff.delay(n);
                n += 1;
                on_retry(n, &e, delay);
                tokio::time::sleep(delay).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// In TLS 1.3 the server judges the client's certificate after the client's
/// handshake has completed, so its refusal (an alert) surfaces on the first
/// read or write of the control channel: report that as a TLS refusal, not a
/// protocol error.
fn tls_or(e: HandshakeError) -> ClientError {
    if let HandshakeError::Io(io) = &e {
        if let Some(inner) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return ClientError::Tls(inner.clone());
        }
    }
    ClientError::Session(e.into())
}

/// A control channel's error as the client reports it ([`tls_or`]).
impl From<HandshakeError> for ClientError {
    fn from(e: HandshakeError) -> Self {
        tls_or(e)
    }
}

/// An RDMA setup's error as the client reports it, a session's first QP or a lane's: a
/// confirmation that failed, the device's, or the session's.
fn setup_failed(e: SessionError) -> ClientError {
    match e {
        SessionError::ConfirmTimeout(_)
        | SessionError::ConfirmFailed(_)
        | SessionError::BadToken => ClientError::Confirm(e),
        SessionError::Verbs(v) => ClientError::Device(v),
        other => ClientError::Session(other),
    }
}

/// How long each phase of one connection took (see [`Connector::connect_timed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Phases {
    /// TCP connect and the TLS 1.3 handshake with mutual authentication.
    pub tcp_tls: Duration,
    /// Hello sent until the server's verdict.
    pub admission: Duration,
    /// Device and GID, PD, CQs, MRs, QP, endpoints exchanged, QP in RTS.
    pub rdma_setup: Duration,
    /// Tokens over RDMA (and, without the early endpoint, the confirmations over TLS).
    pub confirmation: Duration,
    /// The TLS handshake resumed an earlier session of this [`Connector`] (a ticket: no
    /// certificates sent or verified, a fresh ECDHE all the same).
    pub tls_resumed: bool,
    /// The RDMA resources were made ahead by the connector's warm pool
    /// ([`ClientConfig::warm_pool`]): only connecting the QP was left.
    pub warm: bool,
    /// The server took the hello's early endpoint ([`ClientConfig::early_endpoint`]): no TLS
    /// message after the accept.
    pub early: bool,
}

/// A warm QP whose endpoint goes with the hello: its resources, the first PSN announced, the
/// configuration they were made for.
struct EarlyQp {
    resources: crate::session::Resources,
    psn: crate::psn::Psn,
    config: SessionConfig,
}

/// What a session's resources are made for, as the server's accept decides it: the client's
/// send slots hold the buffer size (sealed with the cipher), its receive slots the window's
/// acknowledgements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SessionKind {
    buffer_size: usize,
    window: Option<usize>,
    cipher: Option<Cipher>,
}

impl std::fmt::Display for SessionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}-byte buffers, {}, {}",
            self.buffer_size,
            match self.window {
                Some(w) => format!("a window of {w}"),
                None => "acknowledgements over TLS".to_owned(),
            },
            self.cipher.map_or("in clear", |c| c.name())
        )
    }
}

/// Makes many connections with one configuration: the TLS configuration (certificates read and
/// parsed) and the RDMA device (opened once, `ibv_open_device` and GID table read) are made on
/// first use and shared by every connection, as one process serving many sessions should.
/// Later connections resume the TLS session of an earlier one (the server's tickets), which
/// skips the certificate signatures; a server that reloaded its revocation list since honours
/// no earlier ticket.
/// [`Client::connect`] is a connector used once.
///
/// ```no_run
/// use secure_rdma::client::{ClientConfig, Connector};
///
/// # async fn demo() -> Result<(), secure_rdma::client::ClientError> {
/// let connector = Connector::new(
///     ClientConfig::new("10.77.0.1").with_identity("certs/alice.pem", "certs/alice.key"),
/// );
/// for _ in 0..10 {
///     let (client, phases) = connector.connect_timed().await?;
///     println!("TLS in {:?}, RDMA setup in {:?}", phases.tcp_tls, phases.rdma_setup);
///     client.quit().await;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Connector {
    inner: Arc<ConnectorInner>,
}

struct ConnectorInner {
    cfg: ClientConfig,
    tls: Mutex<Option<Arc<rustls::ClientConfig>>>,
    /// The device and GID for the local address they were picked for.
    device: Mutex<Option<(std::net::IpAddr, Arc<Device>, crate::verbs::GidEntry)>>,
    /// Resources made ahead for the next connections and lanes, and the shared queues.
    provision: Arc<provision::Provision>,
    /// The source ports in turn, when the configuration chooses them.
    source_ports: Option<source_ports::SourcePorts>,
    /// The session the server gave the last connection: what an early endpoint is made for.
    last_session: Mutex<Option<SessionKind>>,
}

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("host", &self.inner.cfg.host)
            .field("port", &self.inner.cfg.port)
            .finish()
    }
}

impl Connector {
    /// A connector for `cfg`; nothing is opened until the first connection.
    pub fn new(cfg: ClientConfig) -> Connector {
        Connector {
            inner: Arc::new(ConnectorInner {
                provision: Arc::new(provision::Provision::new(
                    cfg.warm_pool,
                    cfg.shared_receive_queue,
                )),
                source_ports: cfg.source_ports.clone().map(source_ports::SourcePorts::new),
                cfg,
                tls: Mutex::new(None),
                device: Mutex::new(None),
                last_session: Mutex::new(None),
            }),
        }
    }

    /// The configuration every connection uses.
    pub fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// What this connector's warm pools ([`ClientConfig::warm_pool`]) have done, and waits up
    /// to `timeout` for every pool started so far to be full first, when asked: a benchmark
    /// of the warm path starts its clock on full pools.
    pub fn warm_stats(&self, wait_full: Option<Duration>) -> crate::warm::WarmStats {
        if let Some(timeout) = wait_full {
            self.inner.provision.warm.wait_full(timeout);
        }
        self.inner.provision.warm.stats()
    }

    /// Connects like [`Client::connect`].
    pub async fn connect(&self) -> Result<Client, ClientError> {
        Ok(self.connect_timed().await?.0)
    }

    fn tls_config(&self) -> Result<Arc<rustls::ClientConfig>, ClientError> {
        let mut slot = self.inner.tls.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = &*slot {
            return Ok(c.clone());
        }
        let cfg = &self.inner.cfg;
        let c = match &cfg.identity {
            Some((cert, key)) => tls::client_config(&cfg.ca, cert, key)?,
            None => tls::client_config_without_cert(&cfg.ca)?,
        };
        *slot = Some(c.clone());
        Ok(c)
    }

    /// The device and GID for connections from `local`: opened for the first, then shared
    /// (a connection from another local address picks again).
    fn device(
        &self,
        local: SocketAddr,
    ) -> Result<(Arc<Device>, crate::verbs::GidEntry), VerbsError> {
        let mut slot = self.inner.device.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((ip, dev, gid)) = &*slot {
            if *ip == local.ip() {
                return Ok((dev.clone(), gid.clone()));
            }
        }
        let (dev, gid) = pick_device(&self.inner.cfg, local)?;
        *slot = Some((local.ip(), dev.clone(), gid.clone()));
        Ok((dev, gid))
    }

    /// Connects, authenticates, is admitted, sets up and confirms RDMA (as [`Client::connect`]),
    /// and says how long each phase took. The client starts a new operation stream.
    pub async fn connect_timed(&self) -> Result<(Client, Phases), ClientError> {
        let stream = StreamId::random();
        let (link, identity, device, resume, phases) =
            self.connect_link(StreamHello::fresh(stream)).await?;
        if resume != Resume::New {
            return Err(tls_or(HandshakeError::Invalid {
                field: "resume",
                reason: format!("{resume:?} for a stream this client just drew"),
            }));
        }
        let mut client = Client::new(self.clone(), link, stream, identity, device);
        // The other lanes the configuration asks for, over this session's TLS connection.
        for _ in 1..self.inner.cfg.lanes {
            client.add_lane().await?;
        }
        Ok((client, phases))
    }

    /// A warm QP for the session the server gave the last connection, and its first PSN, for
    /// the hello's early endpoint: `None` when the configuration does not send one, no session
    /// is known yet, or no resource is ready (a QP made now would delay the hello by what the
    /// early endpoint saves).
    fn early_qp(
        &self,
        local: SocketAddr,
        server_ip: std::net::IpAddr,
    ) -> Result<Option<(EarlyQp, SessionKind)>, ClientError> {
        let cfg = &self.inner.cfg;
        if !cfg.early_endpoint {
            return Ok(None);
        }
        let Some(kind) = *self
            .inner
            .last_session
            .lock()
            .unwrap_or_else(|p| p.into_inner())
        else {
            return Ok(None);
        };
        let (device, sgid) = self.device(local).map_err(ClientError::Device)?;
        let config = session_config(
            cfg,
            kind.buffer_size,
            kind.window,
            kind.cipher.is_some(),
            server_ip,
        );
        Ok(self
            .inner
            .provision
            .take_warm(&device, &sgid, &config)
            .map(|resources| {
                let qp = EarlyQp {
                    resources,
                    // Drawn for this session alone, as every session's first PSN is.
                    psn: crate::psn::Psn::random(),
                    config,
                };
                (qp, kind)
            }))
    }

    /// The control connection's TCP connection to `addr` (host:port), from a source port of
    /// the configuration's range when it has one.
    async fn tcp_connect(&self, addr: &str) -> std::io::Result<TcpStream> {
        let Some(ports) = &self.inner.source_ports else {
            return TcpStream::connect(addr).await;
        };
        let target = tokio::net::lookup_host(addr).await?.next().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "the host has no address")
        })?;
        ports.connect(target).await
    }

    /// One session of the operation stream `hello` names: connected, admitted with what the
    /// server knows of the stream, RDMA set up and confirmed, the payload keys bound to the
    /// stream from the first operation this session carries.
    pub(crate) async fn connect_link(
        &self,
        hello: StreamHello,
    ) -> Result<(Link, String, Arc<Device>, Resume, Phases), ClientError> {
        let cfg = &self.inner.cfg;
        let tls_config = self.tls_config()?;
        let started = Instant::now();
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let unreachable = |source: std::io::Error| ClientError::Unreachable {
            addr: addr.clone(),
            source,
        };
        let tcp = tokio::time::timeout(cfg.timeout, self.tcp_connect(&addr))
            .await
            .map_err(|_| {
                unreachable(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {:?}", cfg.timeout),
                ))
            })?
            .map_err(unreachable)?;
        let _ = tcp.set_nodelay(true);
        let local: SocketAddr = tcp.local_addr().map_err(unreachable)?;
        let name = ServerName::try_from(cfg.server_name.clone()).map_err(|source| {
            ClientError::ServerName {
                name: cfg.server_name.clone(),
                source,
            }
        })?;
        let tls = tokio::time::timeout(
            cfg.timeout,
            TlsConnector::from(tls_config).connect(name, tcp),
        )
        .await
        .map_err(|_| ClientError::TlsTimeout(cfg.timeout))?
        .map_err(|e| {
            match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                Some(inner) => ClientError::Tls(inner.clone()),
                None => ClientError::TlsIo(e),
            }
        })?;
        let tcp_tls = started.elapsed();
        let tls_resumed = tls.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        let mut chan = Channel::new(tls);
        let server_ip = chan
            .get_ref()
            .get_ref()
            .0
            .peer_addr()
            .map_err(unreachable)?
            .ip();
        // A QP ready for the session this server gave us last goes with the hello (see
        // [`crate::handshake::EarlyEndpoint`]); its tokens and keys, like the others, while the
        // hello travels.
        let early = self.early_qp(local, server_ip)?;
        chan.send(&Message::Hello {
            version: VERSION,
            capabilities: CAPABILITIES
                .iter()
                .copied()
                .chain(cfg.wants_rdma_acks().then_some(RDMA_ACKS))
                .chain(cfg.wants_rdma_acks().then_some(crate::lanes::LANES))
                .chain(cfg.wants_rdma_acks().then_some(crate::lanes::LANE_CLOSED))
                .map(str::to_owned)
                .collect(),
            ciphers: cfg.ciphers.clone(),
            stream: Some(hello),
            early: early.as_ref().map(|(qp, kind)| EarlyEndpoint {
                endpoint: qp.resources.endpoint(qp.psn),
                buffer_size: u32::try_from(kind.buffer_size).unwrap_or(u32::MAX),
                rdma_window: kind.window.map(|w| w as u32),
                cipher: kind.cipher,
            }),
        })
        .await
        .map_err(tls_or)?;
        let admission_started = Instant::now();
        // Derived while the hello travels and the server admits us (a few hundred microseconds
        // under emulation), not before the hello leaves.
        let tokens = tls::confirmation_tokens(chan.get_ref().get_ref().1, Side::Client)?;
        // The payload keys too (both ciphers take the same 256-bit keys): only the cipher
        // waits for the accept. None when we offered no cipher.
        let keys = match cfg.ciphers.is_empty() {
            true => None,
            false => Some(
                crate::protect::ProtectionSecrets::from_tls_lane(
                    chan.get_ref().get_ref().1,
                    Side::Client,
                    0,
                )
                .map_err(tls::TlsError::Config)?,
            ),
        };
        let verdict = tokio::time::timeout(cfg.timeout, chan.expect_verdict())
            .await
            .map_err(|_| ClientError::Session(SessionError::Timeout(cfg.timeout, "admission")))?
            .map_err(tls_or)?;
        let Accepted {
            buffer_size,
            identity,
            cipher,
            rdma_window,
            resume,
            rekey,
            lanes,
            writes_on_demand,
            endpoint: server_endpoint,
            ..
        } = match verdict {
            Verdict::Accepted(accepted) => accepted,
            Verdict::Rejected(reason) => return Err(ClientError::Rejected(reason)),
        };
        let buffer_size = buffer_size as usize;
        // The accept is authenticated by TLS, so a downgrade here is the
        // server's own choice; still, never run unprotected unless asked to.
        let acceptable = match cipher {
            None => cfg.ciphers.is_empty(),
            Some(c) => cfg.ciphers.contains(&c),
        };
        if !acceptable {
            let list: Vec<&str> = cfg.ciphers.iter().map(|c| c.name()).collect();
            return Err(ClientError::Unprotected {
                chosen: cipher.map_or("no protection".to_owned(), |c| c.to_string()),
                required: if list.is_empty() {
                    "no protection".to_owned()
                } else {
                    list.join(" or ")
                },
            });
        }
        if buffer_size > cfg.max_buffer_size {
            return Err(ClientError::BufferTooLarge {
                asked: buffer_size,
                max: cfg.max_buffer_size,
            });
        }
        let window = match rdma_window {
            // Acknowledgements over RDMA only when we asked: an unasked window is a server
            // that does not follow the protocol.
            Some(w) if cfg.wants_rdma_acks() && (1..=MAX_RDMA_WINDOW).contains(&w) => {
                Some(w as usize)
            }
            None => None,
            Some(w) => {
                return Err(tls_or(HandshakeError::Invalid {
                    field: "rdma_window",
                    reason: match cfg.wants_rdma_acks() {
                        true => format!("{w} is outside 1..={MAX_RDMA_WINDOW}"),
                        false => {
                            "offered, but this client did not ask for RDMA acknowledgements".into()
                        }
                    },
                }))
            }
        };
        let kind = SessionKind {
            buffer_size,
            window,
            cipher,
        };
        // The early endpoint was taken only for the session it was made for.
        let early = early_answer(server_endpoint, early, kind).map_err(tls_or)?;
        *self
            .inner
            .last_session
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(kind);
        // The first operation this session carries: where the server's delivery of the stream
        // stopped, or where the client's acknowledgements stop when the server has forgotten.
        let first = match &resume {
            Resume::New => 1,
            Resume::Resumed { delivered, .. } => delivered.saturating_add(1),
            Resume::Expired => hello.next,
        };
        let protection = match cipher {
            None => None,
            Some(c) => {
                // Checked above: a cipher only when we offered one, so the keys are there;
                // derived now otherwise, rather than trusted to be.
                let mut p = match keys {
                    Some(keys) => keys.protection(c),
                    None => Protection::from_tls(chan.get_ref().get_ref().1, Side::Client, c)
                        .map_err(tls::TlsError::Config)?,
                };
                p.bind_stream(Side::Client, hello.id, first);
                // The server's policy, for what we send (no announcement: never rotate, as
                // a server of an earlier release follows no epoch).
                let policy = rekey.unwrap_or_else(crate::protect::RekeyPolicy::off);
                tracing::debug!(%policy, "payload keys rotate by the server's policy");
                p.set_rekey(policy);
                Some(p)
            }
        };
        let secrets = Secrets { tokens, protection };
        let admission = admission_started.elapsed();
        let (device, sgid) = self.device(local).map_err(ClientError::Device)?;
        let session_cfg = session_config(cfg, buffer_size, window, cipher.is_some(), server_ip);
        let (established, path, early_taken) = match early {
            Some((qp, remote)) => {
                // The session it was made for (early_answer), so the same configuration.
                let established = match Prepared::from_resources_announced(
                    qp.resources,
                    qp.psn,
                    secrets,
                    qp.config,
                ) {
                    Ok(prepared) => {
                        Session::establish_early_client(&mut chan, prepared, remote).await
                    }
                    Err(e) => Err(e),
                };
                (established, crate::warm::Path::Warm, true)
            }
            None => {
                let (prepared, path) =
                    self.inner
                        .provision
                        .prepare(&device, &sgid, secrets, session_cfg);
                let established = match prepared {
                    Ok(prepared) => Session::establish_prepared(&mut chan, prepared).await,
                    Err(e) => Err(e),
                };
                (established, path, false)
            }
        };
        let mut session = established.map_err(setup_failed)?;
        // The hello lists WRITE_ON_DEMAND: a server that agrees sends its write region when
        // asked, before the first WRITE (one that sent it anyway has it in its endpoint).
        if writes_on_demand {
            session.expect_write_grant();
        }
        let timing = session.timing();
        let phases = Phases {
            tcp_tls,
            admission,
            // Opening the device (the first time) and picking the GID belong to RDMA setup.
            rdma_setup: started
                .elapsed()
                .saturating_sub(tcp_tls + admission + timing.confirmation),
            confirmation: timing.confirmation,
            tls_resumed,
            warm: path == crate::warm::Path::Warm,
            early: early_taken,
        };
        // Lanes only where we asked and the acknowledgements come over RDMA.
        let lanes = lanes.filter(|_| window.is_some() && cfg.wants_rdma_acks());
        let link = Link {
            session,
            window,
            in_flight: 0,
            chan,
            closed_lanes: crate::lanes::ClosedLanes::default(),
            timeout: cfg.timeout,
            lanes: lanes.map(|max| link::LaneSetup {
                max,
                device: Arc::clone(&device),
                sgid,
                session_cfg,
                cipher,
                rekey: rekey.unwrap_or_else(crate::protect::RekeyPolicy::off),
                provision: Arc::clone(&self.inner.provision),
            }),
        };
        Ok((link, identity, device, resume, phases))
    }
}

/// What became of the hello's early endpoint (`sent`: what it was made with, and for which
/// session), by the accept's `endpoint`: taken, with the server's endpoint, when the accept
/// describes the session it was made for; not taken (`None`: that QP is freed, and the endpoints
/// are exchanged as step 3 says) when the accept has no endpoint. An endpoint in an accept that
/// answers no early endpoint, or one for another session, is the server breaking the protocol.
fn early_answer<T>(
    server_endpoint: Option<Endpoint>,
    sent: Option<(T, SessionKind)>,
    accepted: SessionKind,
) -> Result<Option<(T, Endpoint)>, HandshakeError> {
    match (server_endpoint, sent) {
        (None, _) => Ok(None),
        (Some(remote), Some((made, made_for))) if made_for == accepted => Ok(Some((made, remote))),
        (Some(_), sent) => Err(HandshakeError::Invalid {
            field: "endpoint",
            reason: match sent {
                None => "in the accept, but this client sent no early endpoint".into(),
                Some((_, made_for)) => format!(
                    "the server took the early endpoint made for {made_for} into a session of {accepted}"
                ),
            },
        }),
    }
}

/// What the server acknowledged.
pub use crate::datapath::Ack;

fn pick_device(
    cfg: &ClientConfig,
    local: SocketAddr,
) -> Result<(Arc<Device>, crate::verbs::GidEntry), VerbsError> {
    let selector = match cfg.gid_index {
        Some(i) => GidSelector::Index(i),
        None => GidSelector::Address(local.ip()),
    };
    match (&cfg.device, cfg.gid_index) {
        (None, None) => Device::open_for_address(local.ip()),
        (name, _) => {
            let dev = Device::open(name.as_deref())?;
            let gid = dev.select_gid(&selector)?;
            Ok((dev, gid))
        }
    }
}

/// The resources of a client's session: a send slot per operation in flight (`window`) of
/// the buffer's size, and receive slots for what the server SENDs, its token and
/// acknowledgements, and no larger: sixteen slots of the buffer's size were 64 KiB of every
/// session and lane (at the default 4 KiB) holding 46-byte records.
fn session_config(
    cfg: &ClientConfig,
    buffer_size: usize,
    window: Option<usize>,
    protected: bool,
    server_ip: std::net::IpAddr,
) -> SessionConfig {
    SessionConfig {
        buffer_size,
        timeout: cfg.timeout,
        protected,
        // The server never writes into a client: no client memory is remotely accessible.
        accept_writes: false,
        peer_address: (!cfg.allow_gid_mismatch).then_some(server_ip),
        // A slot per operation in flight, and a receive slot for each acknowledgement.
        send_slots: window.unwrap_or(1),
        recv_slots: SessionConfig::default().recv_slots.max(window.unwrap_or(0)),
        max_receive: Some(crate::datapath::Ack::WIRE_LEN),
        ..SessionConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::AbortReason;

    #[test]
    fn a_client_session_s_receive_slots_hold_the_server_s_acknowledgements_not_its_buffer() {
        let cfg = ClientConfig::new("10.77.0.1");
        let server = "10.77.0.1".parse().unwrap();
        let sealed_ack = crate::datapath::Ack::WIRE_LEN + crate::protect::OVERHEAD;
        for window in [None, Some(16)] {
            let shape = session_config(&cfg, 1 << 20, window, true, server).shape();
            assert_eq!(shape.recv_len(), sealed_ack, "window {window:?}");
            // What the client sends and WRITEs still fits whole.
            assert_eq!(shape.send_len(), (1 << 20) + crate::protect::OVERHEAD);
            assert_eq!(shape.slot_len(), (1 << 20) + crate::protect::OVERHEAD);
        }
        // In clear an acknowledgement is 14 bytes, but the first message is the 32-byte token.
        let clear = session_config(&cfg, 4096, None, false, server).shape();
        assert_eq!(clear.recv_len(), crate::tls::TOKEN_LEN);
    }

    #[test]
    fn the_early_endpoint_is_used_only_for_the_session_it_was_made_for() {
        let kind = SessionKind {
            buffer_size: 4096,
            window: Some(16),
            cipher: Some(Cipher::ChaCha20Poly1305),
        };
        let remote = Endpoint {
            gid: "::ffff:10.77.0.1".parse().unwrap(),
            qpn: crate::psn::Qpn::new(0x11).unwrap(),
            psn: crate::psn::Psn::new(7).unwrap(),
            mtu: crate::verbs::PathMtu::Mtu1024,
            buffer: None,
        };
        // Taken: the server's endpoint, for the QP that went with the hello.
        let taken = early_answer(Some(remote), Some(("qp", kind)), kind).unwrap();
        assert_eq!(taken, Some(("qp", remote)));
        // Not taken, or none sent: the symmetric steps.
        assert_eq!(early_answer(None, Some(("qp", kind)), kind).unwrap(), None);
        assert_eq!(early_answer::<&str>(None, None, kind).unwrap(), None);
        // An endpoint answering nothing, or a session the QP was not made for: refused.
        let e = early_answer::<&str>(Some(remote), None, kind).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid endpoint in handshake message: in the accept, but this client sent no early endpoint"
        );
        let bigger = SessionKind {
            buffer_size: 65536,
            ..kind
        };
        let e = early_answer(Some(remote), Some(("qp", kind)), bigger).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid endpoint in handshake message: the server took the early endpoint made for \
             4096-byte buffers, a window of 16, chacha20-poly1305 into a session of 65536-byte \
             buffers, a window of 16, chacha20-poly1305"
        );
    }

    #[test]
    fn backoff_grows_exponentially_with_jitter_and_stays_bounded() {
        let b = Backoff {
            attempts: 8,
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
        };
        for n in 0..12 {
            let cap = Duration::from_millis(100 * (1u64 << n.min(20))).min(b.max);
            let delays: Vec<Duration> = (0..50).map(|_| b.delay(n)).collect();
            for d in &delays {
                assert!(
                    *d >= cap / 2 && *d <= cap,
                    "retry {n}: {d:?} outside [{:?}, {cap:?}]",
                    cap / 2
                );
            }
            if cap >= Duration::from_millis(100) {
                let first = delays[0];
                assert!(delays.iter().any(|d| *d != first), "retry {n}: no jitter");
            }
        }
    }

    #[test]
    fn only_a_lost_session_is_retried() {
        let lost = ClientError::Session(SessionError::Handshake(HandshakeError::Aborted(
            AbortReason::AuthenticationFailed,
        )));
        assert!(lost.is_session_lost());
        let refused = ClientError::Unreachable {
            addr: "10.77.0.1:4433".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert!(
            refused.is_session_lost(),
            "a restarting server refuses for a while"
        );
        let full = ClientError::Rejected(RejectReason::ServerFull { active: 1, max: 1 });
        assert!(!full.is_session_lost());
        let policy = ClientError::Unprotected {
            chosen: "no protection".into(),
            required: "aes-256-gcm".into(),
        };
        assert!(!policy.is_session_lost());
    }
}
