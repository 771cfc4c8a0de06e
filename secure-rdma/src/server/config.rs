//! What a server is told: its [`ServerConfig`], the per-peer [`Limits`] and
//! the payload [`ProtectionPolicy`].
//!
//! Settings only, fixed once the server is bound: the live counts a running
//! server keeps ([`ServerMetrics`](crate::metrics::ServerMetrics)) belong to
//! the [`Server`](super::Server), not here. Every struct is
//! `#[non_exhaustive]`, so settings can be added without breaking callers:
//! start from [`ServerConfig::new`], [`Limits::default`] or
//! [`ProtectionPolicy::default`] and change what differs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::preauth::PrefixLengths;
use crate::handshake::RejectReason;
use crate::protect::{Cipher, RekeyPolicy};
use crate::quota::Quotas;
use crate::tls::IdentitySource;
use crate::verbs::Poll;

/// Server settings (what `secure-server`'s flags fill in).
///
/// ```
/// use secure_rdma::server::ServerConfig;
///
/// let config = ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref())
///     .with_max_clients(100);
/// assert_eq!(config.ca, std::path::Path::new("certs/ca.pem"));
/// assert_eq!(config.max_clients, 100);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
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
    /// Revoked client certificates (PEM CRL, written by
    /// [`certs::revoke`](crate::certs::revoke)). Read again whenever the file
    /// changes, so a revocation applies from the next handshake on; `None`
    /// or a missing file revokes nothing.
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
    /// Limits that keep one peer from taking the server down.
    pub limits: Limits,
    /// How sessions wait for RDMA completions: event-driven (the default,
    /// no CPU while idle) or busy polling (the lowest latency, a core per
    /// busy session: for dedicated hosts and benchmarks).
    pub poll: Poll,
    /// How long a client's operation stream is remembered after its session
    /// ends, so a client that reconnects within it resumes exactly where its
    /// operations were delivered (default 120 s; zero remembers nothing, and
    /// every reconnect is answered "expired").
    pub resume_window: Duration,
    /// Which name of a client certificate is the client's identity (default
    /// [`IdentitySource::Auto`]: the SPIFFE ID of an X509-SVID, else the common name). A
    /// certificate without that name is refused with the reason.
    pub identity: IdentitySource,
    /// SPIFFE IDs are accepted only from these trust domains (empty: from any the CA signs).
    /// Every CA of [`ca`](Self::ca) can sign any SPIFFE ID; this keeps a deployment of one
    /// trust domain to its own.
    pub spiffe_trust_domains: Vec<String>,
    /// When the payload keys of every protected session rotate, in both directions: announced
    /// to each client in the accept, which applies it to what it sends, as the server does
    /// (default: [`RekeyPolicy::default`], inside the AEAD usage limits).
    pub rekey: RekeyPolicy,
    /// Give each session's peer the rkey of a type 2 memory window bound to the session's QP
    /// over its write slots, invalidated when the session ends, rather than the write region's
    /// own rkey (default on; devices without type 2 windows fall back to the region's rkey).
    pub memory_windows: bool,
    /// Register a session's write region (and bind its window) only when its client asks for
    /// it, before its first RDMA WRITE ([`crate::handshake::WRITE_ON_DEMAND`]; default on): a
    /// session that only SENDs, or is idle, then holds no memory its peer can write and no
    /// registration. Off, or for a client of an earlier release, the region comes with the
    /// session's endpoint. A lane gets its region when it opens either way.
    pub writes_on_demand: bool,
    /// Lanes (RC QPs) one identity may hold at once across its sessions, the first lane of
    /// each session included ([`crate::lanes`]): a client that opens more lanes on a live
    /// session is refused beyond it, so lanes do not buy a tenant more than its share (default
    /// [`DEFAULT_MAX_LANES_PER_IDENTITY`](crate::lanes::DEFAULT_MAX_LANES_PER_IDENTITY)). A
    /// session's first lane is admitted by the session limits, never by this one; 1 offers
    /// no lanes at all.
    pub max_lanes_per_identity: usize,
    /// When to say the server's own setup has slowed (the median RDMA setup of the last
    /// sessions against its calm median): a warning in the log and `secure_rdma_setup_slow`.
    /// Default: the last 20 sessions, twice the baseline.
    pub setup_watch: crate::setup_watch::SetupWatchConfig,
    /// Session resources (PD, CQs, memory regions, window, QP in INIT with its receives
    /// posted) kept ready per device, GID and size ([`crate::warm`]), made by a thread of the
    /// server's own, so a session or lane takes a ready QP and only connects it. Each serves
    /// one session. They are the server's objects while they wait (no tenant's quota counts
    /// them until a session takes one). 0, the default, makes every session's on its path.
    pub warm_pool: usize,
    /// Receive slots of one shared receive queue per device that every session and lane
    /// takes its receives from ([`crate::shared_queue`]), instead of a receive queue, receive
    /// slots and a receive CQ of each session's own; their sends complete on the queue's shared
    /// send CQs too, so a session makes no CQ. Sessions then share one protection
    /// domain, so they need memory windows. 0, the default, gives each session its own. The
    /// warm pool does not serve sessions on the shared queue.
    pub shared_receive_queue: usize,
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
    /// let config = ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref());
    /// assert_eq!((config.max_clients, config.buffer_size), (10, 4096));
    /// ```
    pub fn new(listen: SocketAddr, certs: &Path) -> ServerConfig {
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
            limits: Limits::default(),
            poll: Poll::default(),
            resume_window: Duration::from_secs(120),
            identity: IdentitySource::default(),
            spiffe_trust_domains: Vec::new(),
            rekey: RekeyPolicy::default(),
            memory_windows: true,
            writes_on_demand: true,
            max_lanes_per_identity: crate::lanes::DEFAULT_MAX_LANES_PER_IDENTITY,
            setup_watch: crate::setup_watch::SetupWatchConfig::default(),
            warm_pool: 0,
            shared_receive_queue: 0,
        }
    }

    /// Sets [`rekey`](Self::rekey).
    ///
    /// ```
    /// use secure_rdma::protect::RekeyPolicy;
    /// use secure_rdma::server::ServerConfig;
    ///
    /// let config = ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref())
    ///     .with_rekey(RekeyPolicy::default().with_messages(100));
    /// assert_eq!(config.rekey.messages, 100);
    /// ```
    pub fn with_rekey(mut self, rekey: RekeyPolicy) -> Self {
        self.rekey = rekey;
        self
    }

    /// Sets [`resume_window`](Self::resume_window).
    pub fn with_resume_window(mut self, window: Duration) -> Self {
        self.resume_window = window;
        self
    }

    /// Sets [`max_clients`](Self::max_clients).
    pub fn with_max_clients(mut self, max_clients: usize) -> Self {
        self.max_clients = max_clients;
        self
    }

    /// Sets [`device`](Self::device).
    pub fn with_device(mut self, device: Option<String>) -> Self {
        self.device = device;
        self
    }

    /// Sets [`gid_index`](Self::gid_index).
    pub fn with_gid_index(mut self, gid_index: Option<u32>) -> Self {
        self.gid_index = gid_index;
        self
    }

    /// Sets [`buffer_size`](Self::buffer_size).
    pub fn with_buffer_size(mut self, buffer_size: usize) -> Self {
        self.buffer_size = buffer_size;
        self
    }

    /// Sets [`crl`](Self::crl).
    ///
    /// ```
    /// use secure_rdma::server::ServerConfig;
    ///
    /// let config = ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref()).with_crl(None);
    /// assert_eq!(config.crl, None);
    /// ```
    pub fn with_crl(mut self, crl: Option<PathBuf>) -> Self {
        self.crl = crl;
        self
    }

    /// Sets [`handshake_timeout`](Self::handshake_timeout).
    pub fn with_handshake_timeout(mut self, timeout: Duration) -> Self {
        self.handshake_timeout = timeout;
        self
    }

    /// Sets [`idle_timeout`](Self::idle_timeout).
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Sets [`quotas`](Self::quotas).
    pub fn with_quotas(mut self, quotas: Option<Quotas>) -> Self {
        self.quotas = quotas;
        self
    }

    /// Sets [`protection`](Self::protection).
    pub fn with_protection(mut self, protection: ProtectionPolicy) -> Self {
        self.protection = protection;
        self
    }

    /// Sets [`allow_gid_mismatch`](Self::allow_gid_mismatch).
    pub fn with_allow_gid_mismatch(mut self, allow: bool) -> Self {
        self.allow_gid_mismatch = allow;
        self
    }

    /// Sets [`limits`](Self::limits).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Sets [`poll`](Self::poll).
    pub fn with_poll(mut self, poll: Poll) -> Self {
        self.poll = poll;
        self
    }

    /// Sets [`Limits::max_pending_per_prefix`] and [`Limits::pending_prefix`]: at most `max`
    /// pending connections from one source prefix of `lengths` bits.
    ///
    /// ```
    /// use secure_rdma::server::{PrefixLengths, ServerConfig};
    ///
    /// let config = ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref())
    ///     .with_pending_per_prefix(4, PrefixLengths::new(16, 48)?);
    /// assert_eq!(config.limits.max_pending_per_prefix, 4);
    /// assert_eq!(config.limits.pending_prefix.v4, 16);
    /// # Ok::<(), secure_rdma::server::ConfigError>(())
    /// ```
    pub fn with_pending_per_prefix(mut self, max: usize, lengths: PrefixLengths) -> Self {
        self.limits.max_pending_per_prefix = max;
        self.limits.pending_prefix = lengths;
        self
    }

    /// Sets [`identity`](Self::identity).
    pub fn with_identity(mut self, identity: IdentitySource) -> Self {
        self.identity = identity;
        self
    }

    /// Sets [`spiffe_trust_domains`](Self::spiffe_trust_domains).
    pub fn with_spiffe_trust_domains(mut self, trust_domains: Vec<String>) -> Self {
        self.spiffe_trust_domains = trust_domains;
        self
    }

    /// Sets the CA bundle, server certificate and server key to files anywhere (a PKI other
    /// than [`crate::certs`]'s directory layout: openssl, cert-manager, Vault, SPIRE).
    ///
    /// ```
    /// use secure_rdma::server::ServerConfig;
    ///
    /// let config = ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref())
    ///     .with_certificate_files("/etc/pki/ca.pem".into(), "/etc/pki/srv.pem".into(), "/etc/pki/srv.key".into());
    /// assert_eq!(config.cert, std::path::Path::new("/etc/pki/srv.pem"));
    /// ```
    pub fn with_certificate_files(mut self, ca: PathBuf, cert: PathBuf, key: PathBuf) -> Self {
        self.ca = ca;
        self.cert = cert;
        self.key = key;
        self
    }

    /// Sets [`memory_windows`](Self::memory_windows).
    pub fn with_memory_windows(mut self, on: bool) -> Self {
        self.memory_windows = on;
        self
    }

    /// Sets [`writes_on_demand`](Self::writes_on_demand).
    pub fn with_writes_on_demand(mut self, on: bool) -> Self {
        self.writes_on_demand = on;
        self
    }

    /// Sets [`max_lanes_per_identity`](Self::max_lanes_per_identity).
    ///
    /// ```
    /// use secure_rdma::server::ServerConfig;
    ///
    /// let config = ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref())
    ///     .with_max_lanes_per_identity(4);
    /// assert_eq!(config.max_lanes_per_identity, 4);
    /// ```
    pub fn with_max_lanes_per_identity(mut self, max: usize) -> Self {
        self.max_lanes_per_identity = max;
        self
    }

    /// Sets [`warm_pool`](Self::warm_pool).
    ///
    /// ```
    /// use secure_rdma::server::ServerConfig;
    ///
    /// let config = ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref())
    ///     .with_warm_pool(8);
    /// assert_eq!(config.warm_pool, 8);
    /// ```
    pub fn with_warm_pool(mut self, resources: usize) -> Self {
        self.warm_pool = resources;
        self
    }

    /// Sets [`shared_receive_queue`](Self::shared_receive_queue).
    ///
    /// ```
    /// use secure_rdma::server::ServerConfig;
    ///
    /// let config = ServerConfig::new("0.0.0.0:4433".parse().unwrap(), "certs".as_ref())
    ///     .with_shared_receive_queue(4096);
    /// assert_eq!(config.shared_receive_queue, 4096);
    /// ```
    pub fn with_shared_receive_queue(mut self, slots: usize) -> Self {
        self.shared_receive_queue = slots;
        self
    }

    /// Sets [`setup_watch`](Self::setup_watch).
    pub fn with_setup_watch(mut self, watch: crate::setup_watch::SetupWatchConfig) -> Self {
        self.setup_watch = watch;
        self
    }
}

/// What one peer may hold: connections before TLS completes, sessions per
/// identity, time per write and per session.
///
/// ```
/// use std::time::Duration;
/// use secure_rdma::server::Limits;
///
/// let mut limits = Limits::default();
/// limits.max_session_lifetime = Some(Duration::from_secs(3600));
/// assert_eq!(limits.max_pending, 64);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Limits {
    /// Connections in TLS handshake or admission at once; more are closed at
    /// accept. Bounds the memory and descriptors idle or slow peers can pin.
    pub max_pending: usize,
    /// Of those, from one source address.
    pub max_pending_per_address: usize,
    /// Of those, from one source prefix ([`pending_prefix`](Self::pending_prefix)): whoever
    /// holds one address often holds its neighbours, so a bound per address alone is one
    /// bound per neighbour.
    pub max_pending_per_prefix: usize,
    /// How source addresses group into prefixes, for
    /// [`max_pending_per_prefix`](Self::max_pending_per_prefix) and for the bound on the
    /// warnings failures before TLS cause (IPv4-mapped IPv6 addresses count as IPv4).
    pub pending_prefix: PrefixLengths,
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
    /// 64 pending connections, 8 per address, 16 per /24 (IPv4) or /64 (IPv6), 10-second
    /// writes, no per-identity or lifetime limit.
    fn default() -> Self {
        Limits {
            max_pending: 64,
            max_pending_per_address: 8,
            max_pending_per_prefix: 16,
            pending_prefix: PrefixLengths::default(),
            write_timeout: Duration::from_secs(10),
            max_sessions_per_identity: None,
            max_session_lifetime: None,
        }
    }
}

/// The server's payload-protection policy.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProtectionPolicy {
    /// Ciphers the server uses, preferred first; empty never protects
    /// ([`ProtectionPolicy::off`]).
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
    /// Payloads in clear for everyone: to measure the cost, and to show the
    /// attack it invites.
    pub fn off() -> Self {
        ProtectionPolicy {
            ciphers: Vec::new(),
            allow_unprotected: true,
        }
    }

    /// `ciphers`, preferred first; clients that offer none are served only
    /// if `allow_unprotected`.
    ///
    /// ```
    /// use secure_rdma::protect::Cipher;
    /// use secure_rdma::server::ProtectionPolicy;
    ///
    /// let strict = ProtectionPolicy::new(vec![Cipher::Aes256Gcm], false);
    /// assert_eq!(strict.ciphers, [Cipher::Aes256Gcm]);
    /// ```
    pub fn new(ciphers: Vec<Cipher>, allow_unprotected: bool) -> Self {
        ProtectionPolicy {
            ciphers,
            allow_unprotected,
        }
    }

    /// The cipher for a client that accepts `offered` (its preference
    /// order), or why the client cannot be served.
    ///
    /// ```
    /// use secure_rdma::protect::Cipher;
    /// use secure_rdma::server::ProtectionPolicy;
    ///
    /// let strict = ProtectionPolicy::new(vec![Cipher::Aes256Gcm], false);
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
                // The client reads this text (its flag is the likely cause): it is part of the
                // refusal on the wire, so it stays as clients have always received it.
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

#[cfg(test)]
mod tests {
    use super::{Cipher, ProtectionPolicy, RejectReason};

    #[test]
    fn protection_policy_picks_a_common_cipher_or_says_why_not() {
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
}
