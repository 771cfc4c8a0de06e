//! Admission: who may take a client slot, before any RDMA resource exists
//! for them.
//!
//! A connection is counted as pending from accept until admitted or refused
//! ([`Pending`], bounded in all, per source address and per source prefix), so idle or slow
//! peers cannot pin unbounded descriptors. Once TLS names the client,
//! [`admit`] reads its hello, picks a cipher, takes a per-identity session
//! ([`IdentitySession`]), a client slot, a device and the quota counts, and
//! tells the client `accept` or why not ([`reject`]). What it reserved is
//! held ([`Held`]) until the session is gone.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, OwnedSemaphorePermit};

use super::accept::Outcome;
use super::streams::{ClaimError, StreamLease};
use super::SourcePrefix;
use super::{ServerChannel, Shared};
use crate::handshake::{
    Channel, HandshakeError, Message, RejectReason, Resume, KEY_ROTATION, RDMA_ACKS, VERSION,
};
use crate::metrics::{self, HandshakeOutcome, PreAuthFailure, ServerMetrics};
use crate::protect::{Protection, RekeyPolicy, Side};
use crate::quota::{TenantInfo, TenantQuota};
use crate::session::{Secrets, SessionAdmission, SessionConfig};
use crate::tls;
use crate::verbs::{Device, GidEntry};

/// Operations a client on the streaming data path ([`RDMA_ACKS`]) may have
/// unacknowledged at once: the receive slots the server keeps posted per
/// session, and the write slots it registers for it.
pub const RDMA_WINDOW: usize = 16;

/// Live counts per key (connections per address, sessions per identity); a key leaves the map
/// when its count returns to 0, so the map holds only keys in use.
pub(super) struct KeyCounts<K>(Mutex<HashMap<K, usize>>);

impl<K> Default for KeyCounts<K> {
    fn default() -> Self {
        KeyCounts(Mutex::new(HashMap::new()))
    }
}

impl<K: Eq + std::hash::Hash + Clone> KeyCounts<K> {
    /// Counts one more for `key`, unless it already has `max`: then `Err` with its count.
    pub(super) fn take(&self, key: &K, max: Option<usize>) -> Result<(), usize> {
        let mut by = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = by.entry(key.clone()).or_insert(0);
        if max.is_some_and(|max| *n >= max) {
            return Err(*n);
        }
        *n += 1;
        Ok(())
    }

    /// The count of `key` now.
    pub(super) fn count(&self, key: &K) -> usize {
        let by = self.0.lock().unwrap_or_else(|p| p.into_inner());
        by.get(key).copied().unwrap_or(0)
    }

    /// Counts one less for `key`.
    pub(super) fn release(&self, key: &K) {
        let mut by = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = by.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                by.remove(key);
            }
        }
    }
}

/// Which pending limit a new connection would exceed; it names the [`Limits`](super::Limits)
/// field to raise.
#[derive(Debug)]
pub(super) enum PendingLimit {
    /// [`Limits::max_pending`](super::Limits::max_pending) connections are pending.
    Total { max: usize },
    /// `address` has `count` pending, the per-address maximum.
    PerAddress { address: IpAddr, count: usize },
    /// `prefix` has `count` pending, the per-prefix maximum.
    PerPrefix { prefix: SourcePrefix, count: usize },
}

impl PendingLimit {
    /// Which pre-TLS failure this is, for the metrics.
    pub(super) fn failure(&self) -> PreAuthFailure {
        match self {
            PendingLimit::Total { .. } => PreAuthFailure::PendingTotal,
            PendingLimit::PerAddress { .. } => PreAuthFailure::PendingAddress,
            PendingLimit::PerPrefix { .. } => PreAuthFailure::PendingPrefix,
        }
    }
}

impl std::fmt::Display for PendingLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PendingLimit::Total { max } => write!(
                f,
                "{max} connections already in TLS handshake or admission (max_pending)"
            ),
            PendingLimit::PerAddress { address, count } => write!(
                f,
                "{address} already has {count} connections in TLS handshake or admission (max_pending_per_address)"
            ),
            PendingLimit::PerPrefix { prefix, count } => write!(
                f,
                "{prefix} already has {count} connections in TLS handshake or admission (max_pending_per_prefix)"
            ),
        }
    }
}

/// A connection that is not admitted yet: counted against the pending limits until dropped.
pub(super) struct Pending {
    _permit: OwnedSemaphorePermit,
    address: IpAddr,
    prefix: SourcePrefix,
    shared: Arc<Shared>,
}

impl Pending {
    /// Counts a new connection from `address`, or says which limit it would exceed.
    pub(super) fn take(shared: &Arc<Shared>, address: IpAddr) -> Result<Pending, PendingLimit> {
        let limits = &shared.config.limits;
        // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d: one address either way.
        let address = address.to_canonical();
        let prefix = SourcePrefix::of(address, limits.pending_prefix);
        let Ok(permit) = Arc::clone(&shared.pending).try_acquire_owned() else {
            return Err(PendingLimit::Total {
                max: limits.max_pending,
            });
        };
        if let Err(count) = shared
            .pending_by_address
            .take(&address, Some(limits.max_pending_per_address))
        {
            return Err(PendingLimit::PerAddress { address, count });
        }
        if let Err(count) = shared
            .pending_by_prefix
            .take(&prefix, Some(limits.max_pending_per_prefix))
        {
            shared.pending_by_address.release(&address);
            return Err(PendingLimit::PerPrefix { prefix, count });
        }
        Ok(Pending {
            _permit: permit,
            address,
            prefix,
            shared: Arc::clone(shared),
        })
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.shared.pending_by_address.release(&self.address);
        self.shared.pending_by_prefix.release(&self.prefix);
    }
}

/// One live session of an identity, counted until dropped.
pub(super) struct IdentitySession {
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

/// What an admitted client holds until its session is gone. Field order is
/// drop order: the quota counts, then the slot. Both go with the RDMA
/// resources, not after the goodbye, so a client waiting for this one to
/// leave finds room as soon as its kernel objects are gone.
pub(super) struct Held {
    quota: Option<(SessionAdmission, TenantQuota)>,
    _identity: IdentitySession,
    _slot: OwnedSemaphorePermit,
}

impl Held {
    /// The tenant the session's resources are counted against (with quotas): what it makes
    /// later, its write region on demand, is admitted there too.
    pub(super) fn tenant(&self) -> Option<&TenantQuota> {
        self.quota.as_ref().map(|(_, tenant)| tenant)
    }
}

/// A client that passed admission: authenticated by TLS, a supported
/// protocol version, a free slot, a device for its address and its quota
/// counts reserved. Nothing RDMA exists for it yet.
pub(super) struct Admitted {
    pub(super) chan: ServerChannel,
    pub(super) identity: String,
    pub(super) device: Arc<Device>,
    pub(super) sgid: GidEntry,
    pub(super) secrets: Secrets,
    pub(super) session_cfg: SessionConfig,
    /// Acknowledgements go over RDMA (the client asked for [`RDMA_ACKS`]).
    pub(super) rdma_acks: bool,
    pub(super) held: Held,
    /// The client's operation stream, held for this session.
    pub(super) stream: StreamLease,
    /// The client may open lanes ([`crate::lanes`]): it asked, on the streaming data path.
    pub(super) lanes: bool,
    /// The client hears of a lane the server closed ([`crate::lanes::LANE_CLOSED`]).
    pub(super) lane_closed: bool,
    /// The session's payload cipher and key rotation, which its lanes use too.
    pub(super) cipher: Option<crate::protect::Cipher>,
    pub(super) rekey: RekeyPolicy,
    /// The client's early endpoint, taken: the accept is not sent yet, but once this end's QP
    /// is in RTR toward it ([`crate::handshake::EarlyEndpoint`]). Boxed: the session's task
    /// carries this field's place for the session's whole life.
    pub(super) early: Option<Box<EarlyStart>>,
}

/// What an early-endpoint setup still has to do on the server: connect to the client's QP,
/// then send the accept with its own endpoint.
pub(super) struct EarlyStart {
    /// The client's endpoint, from its hello.
    pub(super) remote: crate::handshake::Endpoint,
    /// The accept, to send with this end's endpoint once its QP is in RTR.
    pub(super) accept: Message,
}

/// Admission, steps 1–2 of the [handshake](crate::handshake): the hello, a
/// slot, a device, the quotas; the client is told `accept` or why not. On a
/// refusal everything reserved so far is released and the outcome returned.
pub(super) async fn admit(
    mut chan: ServerChannel,
    identity: String,
    local_ip: IpAddr,
    peer_ip: IpAddr,
    shared: &Arc<Shared>,
    stop: &watch::Receiver<bool>,
) -> Result<Admitted, Outcome> {
    let cfg = &shared.config;
    let counts = &shared.metrics;
    let hello = match tokio::time::timeout(cfg.handshake_timeout, chan.expect_hello()).await {
        Ok(Ok(hello)) if hello.version == VERSION => hello,
        Ok(Ok(hello)) => {
            let reason = RejectReason::Version {
                server: VERSION,
                client: hello.version,
            };
            return Err(reject(counts, &mut chan, reason).await);
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "no hello; closing");
            counts.handshake(HandshakeOutcome::Failed);
            return Err(Outcome::Failed);
        }
        Err(_) => {
            tracing::warn!("no hello in time");
            counts.handshake(HandshakeOutcome::TimedOut);
            return Err(Outcome::Failed);
        }
    };
    if *stop.borrow() {
        return Err(reject(counts, &mut chan, RejectReason::ShuttingDown).await);
    }
    let Some(stream_hello) = hello.stream else {
        // A client of this version always names its stream.
        let e = HandshakeError::Invalid {
            field: "stream",
            reason: "missing from the hello".into(),
        };
        tracing::warn!(error = %e, "bad hello; closing");
        counts.handshake(HandshakeOutcome::Failed);
        return Err(Outcome::Failed);
    };
    // The stream first: a session of it that is still alive (its client lost it, the server
    // did not notice yet) ends now, before this one counts against the identity's sessions or
    // the client slots, and before the answer, so nothing of it is delivered afterwards.
    let stream = match shared
        .streams
        .claim(&identity, stream_hello, cfg.handshake_timeout)
        .await
    {
        Ok(lease) => lease,
        Err(e @ ClaimError::NotYours(_)) => {
            tracing::warn!(client = %identity, error = %e, "a client named another identity's stream");
            let detail = e.to_string();
            return Err(reject(counts, &mut chan, RejectReason::Policy { detail }).await);
        }
        Err(e) => {
            tracing::warn!(client = %identity, error = %e, "cannot resume the stream");
            let detail = format!("{e}; reconnect later");
            return Err(reject(counts, &mut chan, RejectReason::Unavailable { detail }).await);
        }
    };
    counts.streams_forgotten(stream.forgotten);
    match &stream.resume {
        Resume::New => {}
        Resume::Resumed { delivered, acks } => {
            counts.stream_resumed(acks.len());
            tracing::info!(
                client = %identity,
                stream = %stream.id().short(),
                delivered,
                acks = acks.len(),
                "stream resumed"
            );
        }
        Resume::Expired => {
            counts.stream_expired();
            tracing::info!(
                client = %identity,
                stream = %stream.id().short(),
                next = stream_hello.next,
                sent = stream_hello.sent,
                "stream expired"
            );
        }
    }
    let cipher = match cfg.protection.choose(&hello.ciphers) {
        Ok(c) => c,
        Err(reason) => return Err(reject(counts, &mut chan, reason).await),
    };
    // One identity cannot hold every slot.
    let identity_session = match IdentitySession::take(shared, &identity) {
        Ok(s) => s,
        Err(reason) => return Err(reject(counts, &mut chan, reason).await),
    };
    // A client slot before any RDMA resource exists.
    let Ok(slot) = Arc::clone(&shared.slots).try_acquire_owned() else {
        let max = cfg.max_clients;
        let active = max - shared.slots.available_permits();
        return Err(reject(counts, &mut chan, RejectReason::ServerFull { active, max }).await);
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
            return Err(reject(counts, &mut chan, RejectReason::Unavailable { detail }).await);
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
    // Keys rotate only for a client that follows (an earlier release would fail the first
    // message of a new epoch at its tag).
    let rekey = session_rekey(cipher.is_some(), &hello.capabilities, cfg.rekey);
    if cipher.is_some() && rekey.is_off() && !cfg.rekey.is_off() {
        tracing::info!(
            client = %identity,
            "the client does not rotate payload keys (an earlier release): one key per direction for its session"
        );
    }
    // Lanes for a client that asks, on the streaming data path: each lane's acknowledgements
    // come over its own QP (over TLS they would queue every lane behind one connection).
    let lanes = rdma_window.is_some()
        && cfg.max_lanes_per_identity > 1
        && hello.capabilities.iter().any(|c| c == crate::lanes::LANES);
    let lane_closed = lanes
        && hello
            .capabilities
            .iter()
            .any(|c| c == crate::lanes::LANE_CLOSED);
    let writes_on_demand = writes_on_demand(cfg, &hello.capabilities);
    let session_cfg = SessionConfig {
        writes_on_demand,
        ..session_config(cfg, rdma_window, cipher.is_some(), peer_ip)
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
            let admitted = match shared.config.shared_receive_queue {
                0 => session_cfg.admit(&tenant),
                _ => session_cfg.admit_on_shared(&tenant),
            };
            match admitted {
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
                    return Err(reject(counts, &mut chan, RejectReason::Quota { detail }).await);
                }
            }
        }
    };
    let buffer_size = u32::try_from(cfg.buffer_size).unwrap_or(u32::MAX);
    let rdma_window_u32 = rdma_window.map(|w| w as u32);
    // The client's early endpoint serves only the session its slots and keys were made for.
    let early = hello
        .early
        .filter(|e| e.fits(buffer_size, rdma_window_u32, cipher));
    if let Some(e) = &hello.early {
        tracing::debug!(client = %identity, taken = early.is_some(), buffer_size = e.buffer_size, "early endpoint");
    }
    let accept = Message::Accept {
        buffer_size,
        identity: identity.clone(),
        cipher,
        rdma_window: rdma_window_u32,
        resume: stream.resume.clone(),
        // Only a protected session has keys to rotate.
        rekey: cipher.map(|_| rekey),
        lanes: lanes.then(|| u32::try_from(cfg.max_lanes_per_identity).unwrap_or(u32::MAX)),
        writes_on_demand,
        endpoint: None,
    };
    // With an early endpoint the accept waits for this end's QP (the session's setup sends it).
    let early = match early {
        Some(e) => Some(Box::new(EarlyStart {
            remote: e.endpoint,
            accept,
        })),
        None => {
            if chan.send(&accept).await.is_err() {
                counts.handshake(HandshakeOutcome::Failed);
                return Err(Outcome::Failed);
            }
            None
        }
    };
    // The confirmation tokens and payload keys are derived while the accept travels: the
    // client needs neither before it has made its QP, and under emulation the four exporter
    // calls take a few hundred microseconds of the handshake. (After an early endpoint they
    // come before the accept, which waits for this end's QP: the keys go into it at RTS.)
    let secrets = match derive_secrets(chan.get_ref().get_ref().1, cipher) {
        Ok(mut secrets) => {
            if let Some(p) = secrets.protection.as_mut() {
                p.bind_stream(Side::Server, stream.id(), stream.first);
                p.set_rekey(rekey);
            }
            secrets
        }
        Err(e) => {
            tracing::error!(error = %e, "TLS exporter failed");
            counts.handshake(HandshakeOutcome::Failed);
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
        stream,
        lanes,
        lane_closed,
        cipher,
        rekey,
        early,
        held: Held {
            quota,
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

/// Refuses a client whose certificate verified but names no usable identity (see
/// [`IdentitySource`](crate::tls::IdentitySource)): its hello is read, so that it hears the
/// reason as a refusal rather than a closed connection.
pub(super) async fn refuse_unidentified(
    mut chan: ServerChannel,
    error: crate::tls::TlsError,
    shared: &Arc<Shared>,
) -> Outcome {
    let counts = &shared.metrics;
    let timeout = shared.config.handshake_timeout;
    if !matches!(
        tokio::time::timeout(timeout, chan.expect_hello()).await,
        Ok(Ok(_))
    ) {
        tracing::warn!(error = %error, "client refused: its certificate names no usable identity");
        counts.handshake(HandshakeOutcome::Failed);
        return Outcome::Failed;
    }
    let detail = format!(
        "the client certificate names no usable identity (identities from {}): {error}",
        shared.config.identity
    );
    reject(counts, &mut chan, RejectReason::Policy { detail }).await
}

/// Refuses a client: counts it, tells it `reason` over TLS and closes.
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

/// The resources of a server's session: receive slots for the client's window, a write slot
/// per WRITE it may have in flight (`rdma_window`), and send slots that hold what the server
/// posts, its acknowledgements, and no more: a slot of the client's buffer size per operation
/// in flight was 4 KiB to 64 KiB of every session's memory holding 46-byte records.
fn session_config(
    cfg: &super::ServerConfig,
    rdma_window: Option<usize>,
    protected: bool,
    peer_ip: IpAddr,
) -> SessionConfig {
    SessionConfig {
        buffer_size: cfg.buffer_size,
        recv_slots: RDMA_WINDOW,
        send_slots: rdma_window.unwrap_or(1),
        write_slots: rdma_window.unwrap_or(1),
        protected,
        accept_writes: true,
        memory_window: cfg.memory_windows,
        peer_address: (!cfg.allow_gid_mismatch).then_some(peer_ip),
        max_post: Some(crate::datapath::Ack::WIRE_LEN),
        ..SessionConfig::default()
    }
}

/// Whether a session's write region waits for its client to ask ([`SessionConfig::writes_on_demand`]):
/// the server's choice, for a client that will ask (one of an earlier release gets it with the
/// session's endpoint, as it expects).
fn writes_on_demand(cfg: &super::ServerConfig, capabilities: &[String]) -> bool {
    cfg.writes_on_demand
        && capabilities
            .iter()
            .any(|c| c == crate::handshake::WRITE_ON_DEMAND)
}

/// The rotation policy of a session: the server's, when payloads are protected and the client
/// lists [`KEY_ROTATION`]; never otherwise (no keys, or a client of an earlier release, which
/// would fail the first message of a new epoch at its tag).
fn session_rekey(protected: bool, capabilities: &[String], server: RekeyPolicy) -> RekeyPolicy {
    if protected && capabilities.iter().any(|c| c == KEY_ROTATION) {
        server
    } else {
        RekeyPolicy::off()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_that_asks_gets_its_write_region_on_demand_and_admitted_apart() {
        let cfg = super::super::ServerConfig::new(
            "127.0.0.1:4433".parse().unwrap(),
            std::path::Path::new("certs"),
        );
        let new: Vec<String> = crate::handshake::CAPABILITIES
            .iter()
            .map(|c| (*c).to_owned())
            .collect();
        let old: Vec<String> = new
            .iter()
            .filter(|c| *c != crate::handshake::WRITE_ON_DEMAND)
            .cloned()
            .collect();
        assert!(writes_on_demand(&cfg, &new));
        // A client of an earlier release, or a server told to make it at setup.
        assert!(!writes_on_demand(&cfg, &old));
        assert!(!writes_on_demand(
            &cfg.clone().with_writes_on_demand(false),
            &new
        ));
        let at_setup = session_config(&cfg, Some(RDMA_WINDOW), true, "10.77.0.2".parse().unwrap());
        let on_demand = SessionConfig {
            writes_on_demand: true,
            ..at_setup
        };
        assert!(at_setup.shape().write_region());
        assert!(!on_demand.shape().write_region());
        // The same region either way: a slot per WRITE in flight, once asked for.
        assert_eq!(on_demand.shape().write_len(), at_setup.shape().write_len());
        assert_eq!(
            at_setup.shape().write_len(),
            RDMA_WINDOW * (cfg.buffer_size + crate::protect::OVERHEAD)
        );
        // Admitted without the region, which is admitted when asked for.
        let quotas = crate::quota::Quotas::new(
            crate::quota::QuotaConfig::parse("tenant alice MR_COUNT 2\n", "q").unwrap(),
        );
        let alice = quotas.register(crate::quota::TenantInfo {
            identity: "alice".into(),
            pid: 1,
            cgroup_id: 1,
        });
        assert!(at_setup.admit(&alice).is_err(), "three regions at setup");
        let session = on_demand.admit(&alice).expect("two regions");
        assert!(on_demand.admit_writes(&alice).is_err());
        drop(session);
    }

    #[test]
    fn only_a_protected_client_that_follows_gets_the_servers_rotation() {
        let policy = RekeyPolicy::default().with_messages(100);
        let new: Vec<String> = crate::handshake::CAPABILITIES
            .iter()
            .map(|c| c.to_string())
            .collect();
        let earlier: Vec<String> = new.iter().filter(|c| *c != KEY_ROTATION).cloned().collect();
        assert_eq!(session_rekey(true, &new, policy), policy);
        assert!(session_rekey(true, &earlier, policy).is_off());
        assert!(session_rekey(false, &new, policy).is_off());
    }

    #[test]
    fn a_server_session_s_send_slots_hold_its_acknowledgements_not_the_client_s_buffer() {
        let cfg = crate::server::ServerConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            std::path::Path::new("certs"),
        )
        .with_buffer_size(64 * 1024);
        let peer = "10.77.0.2".parse().unwrap();
        for window in [None, Some(RDMA_WINDOW)] {
            let shape = session_config(&cfg, window, true, peer).shape();
            let sealed_ack = crate::datapath::Ack::WIRE_LEN + crate::protect::OVERHEAD;
            assert_eq!(shape.send_len(), sealed_ack, "window {window:?}");
            // What the client sends and WRITEs still fits whole.
            assert_eq!(shape.slot_len(), 64 * 1024 + crate::protect::OVERHEAD);
        }
        let clear = session_config(&cfg, None, false, peer).shape();
        // In clear an acknowledgement is 14 bytes, but the slot carries the 32-byte token first.
        assert_eq!(clear.send_len(), crate::tls::TOKEN_LEN);
    }
}
