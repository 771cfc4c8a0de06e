//! The server's own metrics: sessions, handshakes, refusals, traffic per
//! tenant, authentication failures and how long the RDMA steps take.
//!
//! [`ServerMetrics`] holds `prometheus-client` counters, gauges and
//! histograms that the [server](crate::server) updates as clients come and
//! go; an exporter (secure-server's `--metrics`) registers them in its
//! registry with [`ServerMetrics::register`]. The library only counts: it
//! serves nothing and installs nothing. Authentication failures are counted
//! once, here: the same counters feed the exposition and the per-identity
//! snapshot a telemetry report shows ([`ServerMetrics::auth_failures`]).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `secure_rdma_sessions_active` | gauge | `device` |
//! | `secure_rdma_handshakes_total` | counter | `outcome` ([`HandshakeOutcome`]) |
//! | `secure_rdma_rejections_total` | counter | `reason` ([`rejection_reason`]) |
//! | `secure_rdma_messages_received_total` | counter | `tenant`, `op` (`send`, `write`) |
//! | `secure_rdma_received_bytes_total` | counter | `tenant`, `op` |
//! | `secure_rdma_auth_failures_total` | counter | `tenant` |
//! | `secure_rdma_handshake_duration_seconds` | histogram | |
//! | `secure_rdma_verb_duration_seconds` | histogram | `device`, `verb` ([`TimedVerb`]) |
//! | `secure_rdma_stream_resumes_total` | counter | `outcome` (`resumed`: the server knew the stream; `expired`: it did not) |
//! | `secure_rdma_operations_replayed_total` | counter | |
//! | `secure_rdma_duplicates_suppressed_total` | counter | |
//! | `secure_rdma_streams_expired_total` | counter | |
//! | `secure_rdma_key_rotations_total` | counter | `direction` (`send`: the server's keys; `receive`: the clients') |
//! | `secure_rdma_auth_failures_by_check_total` | counter | `check` ([`AUTH_CHECKS`]: which check of the receiver refused it; `tag` is the AEAD tag) |
//! | `secure_rdma_pre_auth_failures_total` | counter | `reason` ([`PreAuthFailure`]) |
//! | `secure_rdma_pre_auth_log_suppressed_total` | counter | |
//! | `secure_rdma_cert_reloads_total` | counter | `file` (`ca`, `cert`, `key`, `crl`) |
//! | `secure_rdma_cert_reload_failures_total` | counter | `file` (a file gone or unreadable: the last good one stays in force) |
//! | `secure_rdma_sessions_ended_by_certificate_total` | counter | `reason` (`certificate_revoked`, `certificate_expired`) |
//! | `secure_rdma_datapath_events_total` | counter | `cause` ([`DataPathCause`]) |
//! | `secure_rdma_lanes_active` | gauge | (lanes beyond each session's first, [`crate::lanes`]) |
//! | `secure_rdma_lanes_opened_total` | counter | |
//! | `secure_rdma_lanes_refused_total` | counter | `reason` ([`LANE_REFUSALS`]) |
//! | `secure_rdma_write_regions_total` | counter | `outcome` ([`WRITE_REGION_OUTCOMES`]: write regions clients asked for, [`crate::handshake::WRITE_ON_DEMAND`]) |
//! | `secure_rdma_lane_messages_received_total` | counter | `lane` (0 to [`crate::lanes::MAX_LANE`]) |
//! | `secure_rdma_rdma_setups_total` | counter | `path` (`warm`: a session or lane took resources made ahead, [`crate::warm`]; `cold`: it made its own; `shared`: it made its own on the shared receive queue, [`crate::shared_queue`]) |
//! | `secure_rdma_warm_ready` | gauge | (resources ready in the warm pools, as of the last take) |
//! | `secure_rdma_shared_queue_over_credit_total` | counter | (queue pairs cut off for sending beyond their credit, [`crate::shared_queue`]) |
//! | `secure_rdma_shared_queue_unrouted_total` | counter | (messages dropped: their queue pair had ended or was cut off) |
//! | `secure_rdma_setup_slow` | gauge | (1 while the median RDMA setup of the last sessions is slow, [`crate::setup_watch`]) |
//! | `secure_rdma_setup_slowdowns_total` | counter | |
//! | `secure_rdma_setup_median_seconds` | gauge | (the median RDMA setup of the last sessions) |
//! | `secure_rdma_setup_baseline_seconds` | gauge | (the calmest such median seen) |
//!
//! The stream counters: a resume is a client that reconnected and named its
//! operation stream; a replayed operation is one the client sent again after
//! a lost session; a suppressed duplicate is one the client had no
//! acknowledgement for but the server had already delivered, answered from
//! the stream's state instead of delivered twice; an expired stream is one
//! the server forgot (its resume window passed, or room was needed).
//!
//! Names follow the Prometheus conventions: base units (seconds, bytes),
//! `_total` on counters, snake_case labels; `tenant` is the client's
//! certificate identity. Every outcome and reason has its series from the
//! start, at 0, so `rate()` and alerts see the first one happen; families
//! labelled by tenant or device appear with their first sample.
//!
//! ```
//! use prometheus_client::registry::Registry;
//! use secure_rdma::metrics::ServerMetrics;
//!
//! let metrics = ServerMetrics::default();
//! let mut registry = Registry::default();
//! metrics.register(&mut registry);
//! let mut text = String::new();
//! prometheus_client::encoding::text::encode(&mut text, &registry)?;
//! assert!(text.contains("# TYPE secure_rdma_handshakes counter"));
//! assert!(text.contains("\nsecure_rdma_handshakes_total{outcome=\"established\"} 0\n"));
//! # Ok::<(), std::fmt::Error>(())
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use crate::datapath::Op;
use crate::events::DataPathCause;
use crate::handshake::RejectReason;
use crate::protect::AUTH_CHECKS;
use crate::setup_watch::{SetupChange, SetupWatch, SetupWatchConfig};

/// How a connection's handshake ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandshakeOutcome {
    /// TLS, admission, RDMA setup and confirmation all done: a session.
    Established,
    /// Admission refused the client and told it why (see `secure_rdma_rejections_total`).
    Rejected,
    /// The TLS handshake failed: no valid client certificate, a revoked one, or not TLS.
    TlsFailed,
    /// A step (TLS, hello, RDMA setup) did not finish within the handshake timeout.
    TimedOut,
    /// The connection broke or RDMA setup failed.
    Failed,
}

impl HandshakeOutcome {
    /// Every outcome.
    pub const ALL: [HandshakeOutcome; 5] = [
        HandshakeOutcome::Established,
        HandshakeOutcome::Rejected,
        HandshakeOutcome::TlsFailed,
        HandshakeOutcome::TimedOut,
        HandshakeOutcome::Failed,
    ];

    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            HandshakeOutcome::Established => "established",
            HandshakeOutcome::Rejected => "rejected",
            HandshakeOutcome::TlsFailed => "tls_failed",
            HandshakeOutcome::TimedOut => "timed_out",
            HandshakeOutcome::Failed => "failed",
        }
    }
}

/// The `reason` label of a refusal at admission.
///
/// ```
/// use secure_rdma::handshake::RejectReason;
/// use secure_rdma::metrics::rejection_reason;
///
/// assert_eq!(rejection_reason(&RejectReason::ServerFull { active: 2, max: 2 }), "server_full");
/// ```
pub fn rejection_reason(reason: &RejectReason) -> &'static str {
    match reason {
        RejectReason::ServerFull { .. } => "server_full",
        RejectReason::Quota { .. } => "quota",
        RejectReason::Version { .. } => "version",
        RejectReason::ShuttingDown => "shutting_down",
        RejectReason::Unavailable { .. } => "unavailable",
        RejectReason::IdentityLimit { .. } => "identity_limit",
        RejectReason::Policy { .. } => "policy",
        // Never a refusal at admission: a lane is refused on a live session, and counted in
        // `secure_rdma_lanes_refused_total`.
        RejectReason::LaneLimit { .. } => "lane_limit",
    }
}

/// The `reason` of connections closed at accept, before TLS, because too many
/// were pending (in all or from one address).
pub const PENDING_LIMIT: &str = "pending_limit";

/// Every `reason` label of `secure_rdma_rejections_total`: the values of
/// [`rejection_reason`] and [`PENDING_LIMIT`].
pub const REJECTION_REASONS: [&str; 8] = [
    "server_full",
    "quota",
    "version",
    "shutting_down",
    "unavailable",
    "identity_limit",
    "policy",
    PENDING_LIMIT,
];

/// Why a connection ended before TLS authenticated its peer (the `reason` label of
/// `secure_rdma_pre_auth_failures_total`). Every one is counted, while the log shows a
/// bounded number of them (`secure_rdma_pre_auth_log_suppressed_total` counts the lines held
/// back).
///
/// ```
/// use secure_rdma::metrics::PreAuthFailure;
///
/// assert_eq!(PreAuthFailure::PendingPrefix.label(), "pending_prefix");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PreAuthFailure {
    /// The TLS handshake failed: not TLS, no valid client certificate, a revoked one.
    TlsFailed,
    /// The TLS handshake did not finish within the handshake timeout.
    TimedOut,
    /// The connection was gone before TLS started.
    ConnectionLost,
    /// Closed at accept: `max_pending` connections were pending.
    PendingTotal,
    /// Closed at accept: its address had `max_pending_per_address` pending.
    PendingAddress,
    /// Closed at accept: its source prefix had `max_pending_per_prefix` pending.
    PendingPrefix,
}

impl PreAuthFailure {
    /// Every reason.
    pub const ALL: [PreAuthFailure; 6] = [
        PreAuthFailure::TlsFailed,
        PreAuthFailure::TimedOut,
        PreAuthFailure::ConnectionLost,
        PreAuthFailure::PendingTotal,
        PreAuthFailure::PendingAddress,
        PreAuthFailure::PendingPrefix,
    ];

    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            PreAuthFailure::TlsFailed => "tls_failed",
            PreAuthFailure::TimedOut => "timed_out",
            PreAuthFailure::ConnectionLost => "connection_lost",
            PreAuthFailure::PendingTotal => "pending_total",
            PreAuthFailure::PendingAddress => "pending_address",
            PreAuthFailure::PendingPrefix => "pending_prefix",
        }
    }
}

/// Which direction of a session a payload key protects (the `direction` label of
/// `secure_rdma_key_rotations_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyDirection {
    /// What the server seals (its acknowledgements over RDMA).
    Send,
    /// What the server opens (its clients' operations).
    Receive,
}

impl KeyDirection {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            KeyDirection::Send => "send",
            KeyDirection::Receive => "receive",
        }
    }
}

/// The RDMA steps the server times (the `verb` label of
/// `secure_rdma_verb_duration_seconds`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TimedVerb {
    /// PD, CQs, MRs and QP created, endpoints exchanged over TLS, the QP
    /// modified RESET → INIT → RTR → RTS.
    QpSetup,
    /// The confirmation: tokens over RDMA (a posted SEND and its completion
    /// each way) and the confirmations over TLS.
    QpConfirm,
    /// Posting an acknowledgement SEND on the streaming path, including the
    /// wait for a free send slot (that is, for earlier completions); the
    /// server times one post in 16, as a timing is two precise clock reads.
    PostSend,
}

impl TimedVerb {
    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            TimedVerb::QpSetup => "qp_setup",
            TimedVerb::QpConfirm => "qp_confirm",
            TimedVerb::PostSend => "post_send",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DirectionLabels {
    direction: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DeviceLabels {
    device: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TenantLabels {
    tenant: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CheckLabels {
    check: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TenantOpLabels {
    tenant: String,
    op: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DeviceVerbLabels {
    device: String,
    verb: &'static str,
}

/// Handshakes take milliseconds to seconds (a TLS round trip, QP setup, the
/// handshake timeout is 10 s by default): 1 ms to ~16 s.
fn handshake_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Posting takes microseconds; setup and confirmation milliseconds, more on
/// Soft-RoCE under emulation: 10 µs to ~20 s.
fn verb_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 2.0, 22))
}

/// The server's metrics. Clones share the same counts, so give one to the
/// [`Server`](crate::server::Server::with_metrics) and register another.
#[derive(Debug, Clone)]
pub struct ServerMetrics {
    sessions_active: Family<DeviceLabels, Gauge>,
    handshakes: Family<OutcomeLabels, Counter>,
    rejections: Family<ReasonLabels, Counter>,
    messages: Family<TenantOpLabels, Counter>,
    bytes: Family<TenantOpLabels, Counter>,
    auth_failures: Family<TenantLabels, Counter>,
    /// The same counters as `auth_failures`, by identity: a `Family` cannot be listed, and the
    /// telemetry report shows every identity's count.
    auth_failures_by_tenant: Arc<Mutex<BTreeMap<String, Counter>>>,
    handshake_duration: Histogram,
    verb_duration: Family<DeviceVerbLabels, Histogram, fn() -> Histogram>,
    stream_resumes: Family<OutcomeLabels, Counter>,
    operations_replayed: Counter,
    duplicates_suppressed: Counter,
    streams_expired: Counter,
    key_rotations: Family<DirectionLabels, Counter>,
    auth_failure_checks: Family<CheckLabels, Counter>,
    pre_auth_failures: Family<ReasonLabels, Counter>,
    pre_auth_log_suppressed: Counter,
    cert_reloads: Family<FileLabels, Counter>,
    cert_reload_failures: Family<FileLabels, Counter>,
    sessions_ended_by_cert: Family<ReasonLabels, Counter>,
    datapath_events: Family<CauseLabels, Counter>,
    lanes_active: Gauge,
    lanes_opened: Counter,
    write_regions: Family<OutcomeLabels, Counter>,
    lanes_refused: Family<ReasonLabels, Counter>,
    lane_messages: Family<LaneLabels, Counter>,
    rdma_setups: Family<PathLabels, Counter>,
    warm_ready: Gauge,
    shared_queue: crate::shared_queue::SharedQueueCounters,
    /// Made with the server's settings at its first setup.
    setup_watch: Arc<Mutex<Option<SetupWatch>>>,
    setup_slow: Gauge,
    setup_slowdowns: Counter,
    setup_median: Gauge<f64, std::sync::atomic::AtomicU64>,
    setup_baseline: Gauge<f64, std::sync::atomic::AtomicU64>,
}

/// The `lane` label: a lane's number, bounded by [`crate::lanes::MAX_LANE`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LaneLabels {
    lane: u32,
}

/// The `path` label: `warm` or `cold` ([`crate::warm`]), or `shared` ([`crate::shared_queue`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PathLabels {
    path: &'static str,
}

/// Every `reason` label of `secure_rdma_lanes_refused_total`.
pub const LANE_REFUSALS: [&str; 4] = ["lane_limit", "quota", "policy", "setup"];

/// Every `outcome` label of `secure_rdma_write_regions_total`: `granted`, or refused for the
/// tenant's `quota` or because the region or its window could not be made (`unavailable`).
pub const WRITE_REGION_OUTCOMES: [&str; 3] = ["granted", "quota", "unavailable"];

/// Keeps one lane counted in `secure_rdma_lanes_active` until dropped.
#[derive(Debug)]
pub struct ActiveLane {
    gauge: Gauge,
}

impl Drop for ActiveLane {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FileLabels {
    file: &'static str,
}

/// Every `file` label of the certificate reload counters.
const CERT_FILES: [&str; 4] = ["ca", "cert", "key", "crl"];
/// Every `reason` label of `secure_rdma_sessions_ended_by_certificate_total`.
const CERT_ENDS: [&str; 2] = ["certificate_revoked", "certificate_expired"];

impl Default for ServerMetrics {
    fn default() -> Self {
        let metrics = ServerMetrics {
            sessions_active: Family::default(),
            handshakes: Family::default(),
            rejections: Family::default(),
            messages: Family::default(),
            bytes: Family::default(),
            auth_failures: Family::default(),
            auth_failures_by_tenant: Arc::default(),
            handshake_duration: handshake_buckets(),
            verb_duration: Family::new_with_constructor(verb_buckets),
            stream_resumes: Family::default(),
            operations_replayed: Counter::default(),
            duplicates_suppressed: Counter::default(),
            streams_expired: Counter::default(),
            key_rotations: Family::default(),
            auth_failure_checks: Family::default(),
            pre_auth_failures: Family::default(),
            pre_auth_log_suppressed: Counter::default(),
            cert_reloads: Family::default(),
            cert_reload_failures: Family::default(),
            sessions_ended_by_cert: Family::default(),
            datapath_events: Family::default(),
            lanes_active: Gauge::default(),
            lanes_opened: Counter::default(),
            write_regions: Family::default(),
            lanes_refused: Family::default(),
            lane_messages: Family::default(),
            rdma_setups: Family::default(),
            warm_ready: Gauge::default(),
            shared_queue: crate::shared_queue::SharedQueueCounters::default(),
            setup_watch: Arc::default(),
            setup_slow: Gauge::default(),
            setup_slowdowns: Counter::default(),
            setup_median: Gauge::default(),
            setup_baseline: Gauge::default(),
        };
        for reason in LANE_REFUSALS {
            drop(
                metrics
                    .lanes_refused
                    .get_or_create(&ReasonLabels { reason }),
            );
        }
        for path in ["warm", "cold"] {
            drop(metrics.rdma_setups.get_or_create(&PathLabels { path }));
        }
        for outcome in WRITE_REGION_OUTCOMES {
            drop(
                metrics
                    .write_regions
                    .get_or_create(&OutcomeLabels { outcome }),
            );
        }
        for direction in ["send", "receive"] {
            drop(
                metrics
                    .key_rotations
                    .get_or_create(&DirectionLabels { direction }),
            );
        }
        for check in AUTH_CHECKS {
            drop(
                metrics
                    .auth_failure_checks
                    .get_or_create(&CheckLabels { check }),
            );
        }
        for reason in PreAuthFailure::ALL {
            drop(metrics.pre_auth_failures.get_or_create(&ReasonLabels {
                reason: reason.label(),
            }));
        }
        for file in CERT_FILES {
            drop(metrics.cert_reloads.get_or_create(&FileLabels { file }));
            drop(
                metrics
                    .cert_reload_failures
                    .get_or_create(&FileLabels { file }),
            );
        }
        for reason in CERT_ENDS {
            drop(
                metrics
                    .sessions_ended_by_cert
                    .get_or_create(&ReasonLabels { reason }),
            );
        }
        for cause in DataPathCause::ALL {
            drop(metrics.datapath_events.get_or_create(&CauseLabels {
                cause: cause.label(),
            }));
        }
        for outcome in ["resumed", "expired"] {
            drop(
                metrics
                    .stream_resumes
                    .get_or_create(&OutcomeLabels { outcome }),
            );
        }
        for outcome in HandshakeOutcome::ALL {
            // Creating the child is the point; the guard it returns is not needed.
            drop(metrics.handshakes.get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            }));
        }
        for reason in REJECTION_REASONS {
            drop(metrics.rejections.get_or_create(&ReasonLabels { reason }));
        }
        metrics
    }
}

/// Keeps one session counted in `secure_rdma_sessions_active` until dropped.
#[derive(Debug)]
pub struct ActiveSession {
    gauge: Gauge,
}

impl Drop for ActiveSession {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl ServerMetrics {
    /// Adds every metric to `registry` (names as in the [module docs](self)).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "secure_rdma_setup_slow",
            "1 while the median RDMA setup of the server's last sessions is at least the slow factor times its calm median (a tenant may be flooding the control path)",
            self.setup_slow.clone(),
        );
        registry.register(
            "secure_rdma_setup_slowdowns",
            "Times the median RDMA setup became slow",
            self.setup_slowdowns.clone(),
        );
        registry.register_with_unit(
            "secure_rdma_setup_median",
            "Median RDMA setup (PD, CQs, MRs, QP to RTS) of the server's last sessions",
            Unit::Seconds,
            self.setup_median.clone(),
        );
        registry.register_with_unit(
            "secure_rdma_setup_baseline",
            "The calmest median RDMA setup seen: what slow is judged against",
            Unit::Seconds,
            self.setup_baseline.clone(),
        );
        registry.register(
            "secure_rdma_sessions_active",
            "Established client sessions, per RDMA device",
            self.sessions_active.clone(),
        );
        registry.register(
            "secure_rdma_handshakes",
            "Client connections by how their handshake ended",
            self.handshakes.clone(),
        );
        registry.register(
            "secure_rdma_rejections",
            "Clients refused at admission, by reason",
            self.rejections.clone(),
        );
        registry.register(
            "secure_rdma_messages_received",
            "RDMA SENDs and WRITEs received, per tenant",
            self.messages.clone(),
        );
        registry.register_with_unit(
            "secure_rdma_received",
            "Payload bytes received by RDMA SEND and WRITE, per tenant",
            Unit::Bytes,
            self.bytes.clone(),
        );
        registry.register(
            "secure_rdma_auth_failures",
            "RDMA messages that failed authentication (forged, replayed or corrupted), per tenant",
            self.auth_failures.clone(),
        );
        registry.register_with_unit(
            "secure_rdma_handshake_duration",
            "Time from TCP accept to an established session",
            Unit::Seconds,
            self.handshake_duration.clone(),
        );
        registry.register_with_unit(
            "secure_rdma_verb_duration",
            "Time the server spends in RDMA setup steps and posts, per device",
            Unit::Seconds,
            self.verb_duration.clone(),
        );
        registry.register(
            "secure_rdma_stream_resumes",
            "Clients that reconnected naming their operation stream, by whether the server still knew it",
            self.stream_resumes.clone(),
        );
        registry.register(
            "secure_rdma_operations_replayed",
            "Operations clients sent again after a lost session",
            self.operations_replayed.clone(),
        );
        registry.register(
            "secure_rdma_duplicates_suppressed",
            "Operations a reconnecting client had no acknowledgement for that the server had already delivered: answered, not delivered again",
            self.duplicates_suppressed.clone(),
        );
        registry.register(
            "secure_rdma_streams_expired",
            "Operation streams forgotten: their resume window passed, or room was needed",
            self.streams_expired.clone(),
        );
        registry.register(
            "secure_rdma_datapath_events",
            "Established sessions whose RDMA data path failed, by cause (authentication failure, remote access error, a refused request, retry exceeded, unexpected opcode, ...)",
            self.datapath_events.clone(),
        );
        registry.register(
            "secure_rdma_cert_reloads",
            "TLS files (CA bundle, server certificate, key, CRL) reloaded while running, per file",
            self.cert_reloads.clone(),
        );
        registry.register(
            "secure_rdma_cert_reload_failures",
            "TLS files that changed but were gone or unreadable; the last good one stayed in force",
            self.cert_reload_failures.clone(),
        );
        registry.register(
            "secure_rdma_sessions_ended_by_certificate",
            "Live sessions ended because their client certificate was revoked or expired",
            self.sessions_ended_by_cert.clone(),
        );
        registry.register(
            "secure_rdma_pre_auth_failures",
            "Connections that ended before TLS authenticated the peer, by reason (each counted; the log shows a bounded number)",
            self.pre_auth_failures.clone(),
        );
        registry.register(
            "secure_rdma_pre_auth_log_suppressed",
            "Warnings about failures before TLS held back by the per-prefix and global log bounds (summarised in the log every 10 s)",
            self.pre_auth_log_suppressed.clone(),
        );
        registry.register(
            "secure_rdma_key_rotations",
            "Payload key rotations (a session's key moving to its next epoch), by direction: send for the server's own keys, receive for its clients'",
            self.key_rotations.clone(),
        );
        registry.register(
            "secure_rdma_auth_failures_by_check",
            "RDMA messages that failed authentication, by the receiver's check that refused them (tag: the AEAD tag)",
            self.auth_failure_checks.clone(),
        );
        registry.register(
            "secure_rdma_lanes_active",
            "Lanes (QPs) opened on live sessions beyond each session's first",
            self.lanes_active.clone(),
        );
        registry.register(
            "secure_rdma_lanes_opened",
            "Lanes opened on live sessions over their TLS connection (no new TCP or TLS handshake)",
            self.lanes_opened.clone(),
        );
        registry.register(
            "secure_rdma_lanes_refused",
            "Lanes refused on live sessions, by reason (lane_limit: the identity's lane cap; quota; policy: lanes not negotiated or a lane number used before; setup: RDMA setup failed)",
            self.lanes_refused.clone(),
        );
        registry.register(
            "secure_rdma_write_regions",
            "Write regions clients asked for before their first RDMA WRITE, by outcome (granted; quota: the tenant's quota refused it; unavailable: the region or its window could not be made); a refusal leaves the session sending",
            self.write_regions.clone(),
        );
        registry.register(
            "secure_rdma_rdma_setups",
            "RDMA setups of sessions and lanes, by path (warm: resources made ahead by the warm pool were taken; cold: the setup made its own; shared: it made its own on the shared receive queue)",
            self.rdma_setups.clone(),
        );
        registry.register(
            "secure_rdma_warm_ready",
            "Session resources ready in the warm pools, as of the last setup that looked",
            self.warm_ready.clone(),
        );
        registry.register(
            "secure_rdma_shared_queue_over_credit",
            "Queue pairs the shared receive queue cut off because their peer sent more messages than the receives it was given, without waiting for acknowledgements",
            self.shared_queue.over_credit.clone(),
        );
        registry.register(
            "secure_rdma_shared_queue_unrouted",
            "Messages the shared receive queue dropped because their queue pair had ended or was cut off",
            self.shared_queue.unrouted.clone(),
        );
        registry.register(
            "secure_rdma_lane_messages_received",
            "RDMA SENDs and WRITEs received, per lane number (0: each session's first QP; bounded by the highest lane number a client may open)",
            self.lane_messages.clone(),
        );
    }

    /// Counts one lane opened on a live session ([`crate::lanes`]), active until the result is
    /// dropped.
    pub fn lane_opened(&self) -> ActiveLane {
        self.lanes_opened.inc();
        self.lanes_active.inc();
        ActiveLane {
            gauge: self.lanes_active.clone(),
        }
    }

    /// Counts one RDMA setup (a session's or a lane's) by its `path`, `"warm"` or `"cold"`
    /// ([`crate::warm::Path::name`]), with `ready` resources left in the warm pools.
    pub fn rdma_setup(&self, path: &'static str, ready: usize) {
        self.rdma_setups.get_or_create(&PathLabels { path }).inc();
        self.warm_ready
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    /// The counters a server's [`SharedQueue`](crate::shared_queue::SharedQueue) counts its
    /// drops in (`secure_rdma_shared_queue_over_credit_total`,
    /// `secure_rdma_shared_queue_unrouted_total`).
    pub fn shared_queue_counters(&self) -> crate::shared_queue::SharedQueueCounters {
        self.shared_queue.clone()
    }

    /// RDMA setups so far by `path` (`"warm"`, `"cold"` or `"shared"`).
    pub fn rdma_setups(&self, path: &'static str) -> u64 {
        self.rdma_setups.get_or_create(&PathLabels { path }).get()
    }

    /// Counts one write region asked for, by `outcome` (one of [`WRITE_REGION_OUTCOMES`]).
    pub fn write_region(&self, outcome: &'static str) {
        self.write_regions
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Write regions asked for so far that had `outcome`.
    pub fn write_regions(&self, outcome: &'static str) -> u64 {
        self.write_regions
            .get_or_create(&OutcomeLabels { outcome })
            .get()
    }

    /// Counts one lane refused, by `reason` (one of [`LANE_REFUSALS`]).
    pub fn lane_refused(&self, reason: &'static str) {
        self.lanes_refused
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// The counter of messages received on lane `lane` of every session (lane 0 is each
    /// session's first QP): kept by the session, so counting costs no lookup per message.
    pub fn lane_counter(&self, lane: u32) -> Counter {
        self.lane_messages.get_or_create_owned(&LaneLabels { lane })
    }

    /// Lanes opened so far, lanes active now, lanes refused for `reason`.
    pub fn lane_counts(&self, reason: &'static str) -> (u64, i64, u64) {
        (
            self.lanes_opened.get(),
            self.lanes_active.get(),
            self.lanes_refused
                .get_or_create(&ReasonLabels { reason })
                .get(),
        )
    }

    /// Counts `n` payload key rotations of sessions' `direction`: `send` (what the server
    /// seals) or `receive` (what it opens).
    pub fn key_rotated(&self, direction: KeyDirection, n: u64) {
        if n > 0 {
            self.key_rotations
                .get_or_create(&DirectionLabels {
                    direction: direction.label(),
                })
                .inc_by(n);
        }
    }

    /// Payload key rotations so far in `direction`, over all sessions.
    ///
    /// ```
    /// use secure_rdma::metrics::{KeyDirection, ServerMetrics};
    ///
    /// let metrics = ServerMetrics::default();
    /// metrics.key_rotated(KeyDirection::Receive, 3);
    /// assert_eq!(metrics.key_rotations(KeyDirection::Receive), 3);
    /// assert_eq!(metrics.key_rotations(KeyDirection::Send), 0);
    /// ```
    pub fn key_rotations(&self, direction: KeyDirection) -> u64 {
        self.key_rotations
            .get_or_create(&DirectionLabels {
                direction: direction.label(),
            })
            .get()
    }

    /// Counts which check refused a message that failed authentication (`check`: one of
    /// [`AUTH_CHECKS`], from [`AuthError::check`](crate::protect::AuthError::check)), next to
    /// [`ServerMetrics::auth_failure`]'s count by tenant.
    ///
    /// ```
    /// use secure_rdma::metrics::ServerMetrics;
    /// use secure_rdma::protect::AuthError;
    ///
    /// let metrics = ServerMetrics::default();
    /// metrics.auth_failure_check(AuthError::Tag.check());
    /// assert_eq!(metrics.auth_failure_checks().get("tag"), Some(&1));
    /// assert_eq!(metrics.auth_failure_checks().get("sequence"), Some(&0));
    /// ```
    pub fn auth_failure_check(&self, check: &'static str) {
        self.auth_failure_checks
            .get_or_create(&CheckLabels { check })
            .inc();
    }

    /// Authentication failures so far by the check that refused them, every check listed.
    pub fn auth_failure_checks(&self) -> BTreeMap<&'static str, u64> {
        AUTH_CHECKS
            .iter()
            .map(|&check| {
                (
                    check,
                    self.auth_failure_checks
                        .get_or_create(&CheckLabels { check })
                        .get(),
                )
            })
            .collect()
    }

    /// Counts one connection that ended before TLS authenticated its peer.
    pub fn pre_auth_failure(&self, reason: PreAuthFailure) {
        self.pre_auth_failures
            .get_or_create(&ReasonLabels {
                reason: reason.label(),
            })
            .inc();
    }

    /// Counts one warning about a pre-TLS failure that the log bound held back.
    pub fn pre_auth_log_suppressed(&self) {
        self.pre_auth_log_suppressed.inc();
    }

    /// How many connections ended before TLS for `reason`, and how many warnings were held
    /// back in all.
    pub fn pre_auth_counts(&self, reason: PreAuthFailure) -> (u64, u64) {
        let failures = self
            .pre_auth_failures
            .get_or_create(&ReasonLabels {
                reason: reason.label(),
            })
            .get();
        (failures, self.pre_auth_log_suppressed.get())
    }

    /// Counts one reload of the TLS file labelled `file` (`ca`, `cert`, `key`, `crl`).
    pub fn cert_reloaded(&self, file: &'static str) {
        self.cert_reloads.get_or_create(&FileLabels { file }).inc();
    }

    /// Counts one change of the TLS file labelled `file` that could not be loaded.
    pub fn cert_reload_failed(&self, file: &'static str) {
        self.cert_reload_failures
            .get_or_create(&FileLabels { file })
            .inc();
    }

    /// Reloads and failed reloads of the TLS file labelled `file` so far.
    pub fn cert_reload_counts(&self, file: &'static str) -> (u64, u64) {
        (
            self.cert_reloads.get_or_create(&FileLabels { file }).get(),
            self.cert_reload_failures
                .get_or_create(&FileLabels { file })
                .get(),
        )
    }

    /// Counts one live session ended by its certificate (`certificate_revoked` or
    /// `certificate_expired`).
    pub fn session_ended_by_cert(&self, reason: &'static str) {
        self.sessions_ended_by_cert
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Sessions ended by their certificate so far, for `reason`.
    pub fn sessions_ended_by_cert(&self, reason: &'static str) -> u64 {
        self.sessions_ended_by_cert
            .get_or_create(&ReasonLabels { reason })
            .get()
    }

    /// Counts one data-path failure of an established session by its cause
    /// (`secure_rdma_datapath_events_total`).
    pub fn datapath_event(&self, cause: DataPathCause) {
        self.datapath_events
            .get_or_create(&CauseLabels {
                cause: cause.label(),
            })
            .inc();
    }

    /// Data-path failures of `cause` so far.
    ///
    /// ```
    /// use secure_rdma::events::DataPathCause;
    /// use secure_rdma::metrics::ServerMetrics;
    ///
    /// let metrics = ServerMetrics::default();
    /// metrics.datapath_event(DataPathCause::RequestRefused);
    /// assert_eq!(metrics.datapath_events(DataPathCause::RequestRefused), 1);
    /// assert_eq!(metrics.datapath_events(DataPathCause::AuthFailure), 0);
    /// ```
    pub fn datapath_events(&self, cause: DataPathCause) -> u64 {
        self.datapath_events
            .get_or_create(&CauseLabels {
                cause: cause.label(),
            })
            .get()
    }

    /// Counts a resume of a stream the server knew, whose answers spared the
    /// client `suppressed` operations it would otherwise have sent again.
    pub fn stream_resumed(&self, suppressed: usize) {
        self.stream_resumes
            .get_or_create(&OutcomeLabels { outcome: "resumed" })
            .inc();
        self.duplicates_suppressed.inc_by(suppressed as u64);
    }

    /// Counts a resume of a stream the server no longer knew.
    pub fn stream_expired(&self) {
        self.stream_resumes
            .get_or_create(&OutcomeLabels { outcome: "expired" })
            .inc();
    }

    /// Counts `n` streams forgotten.
    pub fn streams_forgotten(&self, n: usize) {
        self.streams_expired.inc_by(n as u64);
    }

    /// Counts one operation a client sent again after a lost session.
    pub fn operation_replayed(&self) {
        self.operations_replayed.inc();
    }

    /// What the stream counters say: (resumed, expired, replayed, suppressed, forgotten).
    pub fn stream_counts(&self) -> (u64, u64, u64, u64, u64) {
        let outcome = |o| {
            self.stream_resumes
                .get_or_create(&OutcomeLabels { outcome: o })
                .get()
        };
        (
            outcome("resumed"),
            outcome("expired"),
            self.operations_replayed.get(),
            self.duplicates_suppressed.get(),
            self.streams_expired.get(),
        )
    }

    /// Counts one handshake that ended with `outcome`.
    pub fn handshake(&self, outcome: HandshakeOutcome) {
        self.handshakes
            .get_or_create(&OutcomeLabels {
                outcome: outcome.label(),
            })
            .inc();
    }

    /// Counts one established handshake that took `took` since accept.
    pub fn established(&self, took: Duration) {
        self.handshake(HandshakeOutcome::Established);
        self.handshake_duration.observe(took.as_secs_f64());
    }

    /// Counts one refusal; `reason` is a [`rejection_reason`] or [`PENDING_LIMIT`].
    pub fn rejected(&self, reason: &'static str) {
        self.rejections
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// Counts a session on `device` as active until the result is dropped.
    pub fn session_started(&self, device: &str) -> ActiveSession {
        let gauge = self.sessions_active.get_or_create_owned(&DeviceLabels {
            device: device.to_owned(),
        });
        gauge.inc();
        ActiveSession { gauge }
    }

    /// Counts one message of `tenant` that failed authentication: a forgery, a replay or
    /// corruption on the RDMA path, which ended its session.
    pub fn auth_failure(&self, tenant: &str) {
        let mut by_tenant = self
            .auth_failures_by_tenant
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        by_tenant
            .entry(tenant.to_owned())
            .or_insert_with(|| {
                self.auth_failures.get_or_create_owned(&TenantLabels {
                    tenant: tenant.to_owned(),
                })
            })
            .inc();
    }

    /// Authentication failures so far, per identity (the telemetry report's `auth_failures`).
    ///
    /// ```
    /// use secure_rdma::metrics::ServerMetrics;
    ///
    /// let metrics = ServerMetrics::default();
    /// metrics.auth_failure("mallory");
    /// assert_eq!(metrics.auth_failures().get("mallory"), Some(&1));
    /// ```
    pub fn auth_failures(&self) -> BTreeMap<String, u64> {
        self.auth_failures_by_tenant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(tenant, counter)| (tenant.clone(), counter.get()))
            .collect()
    }

    /// Authentication failures so far, of every identity.
    pub fn auth_failures_total(&self) -> u64 {
        self.auth_failures_by_tenant
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .map(Counter::get)
            .sum()
    }

    /// The series one session of `tenant` on `device` writes to per message, looked up once:
    /// counting a message is then an atomic add, with no label allocated or hashed on the data
    /// path.
    ///
    /// ```
    /// use std::time::Duration;
    /// use secure_rdma::datapath::Op;
    /// use secure_rdma::metrics::ServerMetrics;
    ///
    /// let metrics = ServerMetrics::default();
    /// let session = metrics.session("alice", "rxe-a");
    /// session.received(Op::Send, 5);
    /// session.post_send(Duration::from_micros(3));
    /// ```
    pub fn session(&self, tenant: &str, device: &str) -> SessionMetrics {
        let of = |op: &'static str| {
            let labels = TenantOpLabels {
                tenant: tenant.to_owned(),
                op,
            };
            (
                self.messages.get_or_create_owned(&labels),
                self.bytes.get_or_create_owned(&labels),
            )
        };
        SessionMetrics {
            send: of("send"),
            write: of("write"),
            post_send: self.verb_duration.get_or_create_owned(&DeviceVerbLabels {
                device: device.to_owned(),
                verb: TimedVerb::PostSend.label(),
            }),
        }
    }

    /// Records one session's RDMA setup (PD, CQs, MRs, QP to RTS) in the setup watch made
    /// with `config` (at the first call); returns when setup slowed or recovered.
    pub fn setup_finished(&self, took: Duration, config: SetupWatchConfig) -> Option<SetupChange> {
        let mut watch = self.setup_watch.lock().unwrap_or_else(|p| p.into_inner());
        let watch = watch.get_or_insert_with(|| SetupWatch::new(config));
        let change = watch.observe(took);
        if let Some(m) = watch.median() {
            self.setup_median.set(m.as_secs_f64());
        }
        if let Some(b) = watch.baseline() {
            self.setup_baseline.set(b.as_secs_f64());
        }
        self.setup_slow.set(i64::from(watch.is_slow()));
        if matches!(change, Some(SetupChange::Slowed { .. })) {
            self.setup_slowdowns.inc();
        }
        change
    }

    /// Records that `verb` took `took` on `device`.
    pub fn verb(&self, device: &str, verb: TimedVerb, took: Duration) {
        self.verb_duration
            .get_or_create(&DeviceVerbLabels {
                device: device.to_owned(),
                verb: verb.label(),
            })
            .observe(took.as_secs_f64());
    }
}

/// One session's message counters and its post-send latency histogram, from
/// [`ServerMetrics::session`].
#[derive(Debug, Clone)]
pub struct SessionMetrics {
    send: (Counter, Counter),
    write: (Counter, Counter),
    post_send: Histogram,
}

impl SessionMetrics {
    /// Counts one message of `bytes` (`secure_rdma_messages_received_total` and its bytes).
    pub fn received(&self, op: Op, bytes: usize) {
        let (messages, total) = match op {
            Op::Send => &self.send,
            Op::Write => &self.write,
        };
        messages.inc();
        total.inc_by(u64::try_from(bytes).unwrap_or(u64::MAX));
    }

    /// Records one acknowledgement's post on the streaming data path.
    pub fn post_send(&self, took: Duration) {
        self.post_send.observe(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(metrics: &ServerMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        text
    }

    #[test]
    fn every_rejection_reason_is_announced_from_the_start() {
        let detail = String::new;
        for reason in [
            RejectReason::ServerFull { active: 1, max: 1 },
            RejectReason::Quota { detail: detail() },
            RejectReason::Version {
                server: 1,
                client: 2,
            },
            RejectReason::ShuttingDown,
            RejectReason::Unavailable { detail: detail() },
            RejectReason::IdentityLimit {
                identity: detail(),
                active: 1,
                max: 1,
            },
            RejectReason::Policy { detail: detail() },
        ] {
            assert!(REJECTION_REASONS.contains(&rejection_reason(&reason)));
        }
    }

    #[test]
    fn counts_what_the_server_reports() {
        let metrics = ServerMetrics::default();
        let kept = metrics.clone();
        let active = metrics.session_started("rxe-a");
        metrics.established(Duration::from_millis(30));
        metrics.handshake(HandshakeOutcome::TlsFailed);
        metrics.rejected(rejection_reason(&RejectReason::ShuttingDown));
        metrics.rejected(PENDING_LIMIT);
        let alice = metrics.session("alice", "rxe-a");
        alice.received(Op::Send, 100);
        alice.received(Op::Send, 28);
        alice.received(Op::Write, 4096);
        metrics.auth_failure("mallory");
        metrics.datapath_event(DataPathCause::RemoteAccessError);
        metrics.verb("rxe-a", TimedVerb::QpSetup, Duration::from_millis(5));
        // What the server hands its shared receive queue counts where the exporter reads.
        metrics.shared_queue_counters().over_credit.inc();
        let text = render(&kept);
        for expected in [
            "secure_rdma_sessions_active{device=\"rxe-a\"} 1",
            "secure_rdma_handshakes_total{outcome=\"established\"} 1",
            "secure_rdma_handshakes_total{outcome=\"tls_failed\"} 1",
            "secure_rdma_rejections_total{reason=\"shutting_down\"} 1",
            "secure_rdma_rejections_total{reason=\"pending_limit\"} 1",
            "secure_rdma_messages_received_total{tenant=\"alice\",op=\"send\"} 2",
            "secure_rdma_received_bytes_total{tenant=\"alice\",op=\"send\"} 128",
            "secure_rdma_received_bytes_total{tenant=\"alice\",op=\"write\"} 4096",
            "secure_rdma_auth_failures_total{tenant=\"mallory\"} 1",
            "secure_rdma_handshake_duration_seconds_count 1",
            "secure_rdma_verb_duration_seconds_count{device=\"rxe-a\",verb=\"qp_setup\"} 1",
            "secure_rdma_datapath_events_total{cause=\"remote_access_error\"} 1",
            "secure_rdma_datapath_events_total{cause=\"request_refused\"} 0",
            "secure_rdma_datapath_events_total{cause=\"over_credit\"} 0",
            "secure_rdma_shared_queue_over_credit_total 1",
            "secure_rdma_shared_queue_unrouted_total 0",
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "missing {expected:?} in\n{text}"
            );
        }
        assert!(text
            .lines()
            .any(|l| l == "secure_rdma_rejections_total{reason=\"quota\"} 0"));
        assert!(text
            .lines()
            .any(|l| l == "secure_rdma_handshakes_total{outcome=\"timed_out\"} 0"));
        drop(active);
        assert!(render(&kept)
            .lines()
            .any(|l| l == "secure_rdma_sessions_active{device=\"rxe-a\"} 0"));
    }

    #[test]
    fn auth_failures_count_per_identity() {
        let f = ServerMetrics::default();
        f.auth_failure("alice");
        f.auth_failure("alice");
        f.clone().auth_failure("bob");
        assert_eq!(f.auth_failures_total(), 3);
        assert_eq!(f.auth_failures().get("alice"), Some(&2));
    }
}
