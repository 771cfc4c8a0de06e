//! An established secure RDMA session: the RDMA half of a connection whose
//! control half is a TLS [`Channel`].
//!
//! [`Session::establish`] runs steps 3–5 of the [handshake](crate::handshake):
//! it makes this connection's PD, CQs, memory regions and QP, exchanges
//! endpoints over TLS, drives the QP RESET → INIT → RTR → RTS with a fresh
//! CSPRNG PSN, and confirms the connection by exchanging TLS-derived tokens
//! as the first RDMA messages. Dropping the session frees every resource it
//! made.
//!
//! Step 6, the steady state, is here too: the control channel's receivers of
//! the acknowledgements and the client's requests ([`Channel::expect_ack`],
//! [`Channel::expect_client_request`]), whose records are
//! [`crate::datapath`]'s. What the server says between operations (its bye,
//! an abort, a lane it closed) is [`Channel::expect_control`]'s, in
//! [`crate::lanes`].

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::datapath::{Ack, ClientRequest, Op};
use crate::handshake::{unexpected, Channel, Endpoint, HandshakeError, Kind, Message};
use crate::protect::{AuthError, Protection, SealError, HEADER_LEN, OVERHEAD};
use crate::psn::Psn;
use crate::quota::{Admission, Refusal, TenantQuota, Verb};
use crate::shared_queue::{Inbox, InboxError, SharedQueue, SharedQueueError};
use crate::slots::Slots;
use crate::tls::{Tokens, TOKEN_LEN};
use crate::verbs::{
    Completion, CompletionQueue, Device, GidEntry, MemoryRegion, MemoryWindow, MrAccess, Poll,
    QpAttributes, QpCaps, QueuePair, RemoteBuffer, RtrParams, Rts, RtsParams, VerbsError, WcOpcode,
};

/// The next completion of a queue pair's sends, `what` naming it in a timeout: from its own
/// send CQ, or, on a shared queue ([`Resources::on_shared`] attaches with
/// [`SharedQueue::attach_sending`]), as its send CQ's pump routed it to the inbox (polling a
/// shared CQ here would take other sessions' completions).
async fn next_sent(
    send_cq: &CompletionQueue,
    receive: &mut Receive,
    what: &str,
    timeout: Duration,
) -> Result<Completion, SessionError> {
    let named = |after| VerbsError::Timeout {
        what: what.to_owned(),
        after,
    };
    match receive {
        Receive::Shared(inbox) => inbox.next_sent(timeout).await.map_err(|e| match e {
            InboxError::Timeout(after) => named(after).into(),
            other => SessionError::SharedReceive(other),
        }),
        Receive::Own(_) => send_cq.next(timeout).await.map_err(|e| match e {
            VerbsError::Timeout { after, .. } => named(after).into(),
            other => other.into(),
        }),
    }
}

/// [`next_sent`], an error status an error ([`VerbsError::WorkCompletion`]).
async fn next_sent_ok(
    send_cq: &CompletionQueue,
    receive: &mut Receive,
    what: &str,
    timeout: Duration,
) -> Result<Completion, SessionError> {
    succeeded(next_sent(send_cq, receive, what, timeout).await?)
}

/// Whether `device` binds type 2 memory windows; a warning when it does not, since the peer then
/// gets the write region's own rkey.
fn has_windows(device: &Device) -> bool {
    let has = device.has_type2_windows();
    if !has {
        tracing::warn!(device = %device.name(), "no type 2 memory windows on this device; the peer gets the write region's own rkey");
    }
    has
}

/// `wc`, or its error status as [`VerbsError::WorkCompletion`].
fn succeeded(wc: Completion) -> Result<Completion, SessionError> {
    if !wc.status.is_success() {
        return Err(VerbsError::WorkCompletion {
            wr_id: wc.wr_id,
            opcode: wc.opcode,
            status: wc.status,
        }
        .into());
    }
    Ok(wc)
}

/// Why [`Session::open_writes`] gave no write region.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenWritesError {
    /// Nothing was made (the session accepts no writes, or its region or window could not be
    /// made): the session goes on as it was, without writes.
    #[error("no write region: {0}")]
    Refused(#[source] SessionError),
    /// What was in flight, or the window's bind, failed on the QP: the session cannot go on.
    #[error("binding the write region's window failed: {0}")]
    Lost(#[source] SessionError),
}

/// Errors of session setup and use.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The control channel failed.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// The RDMA path did not deliver the peer's token in time.
    #[error("RDMA connection not confirmed within {0:?}: the peer's token never arrived over RDMA (a PSN or GID mismatch drops RC packets silently)")]
    ConfirmTimeout(Duration),
    /// The RDMA path failed the confirmation: a token's SEND or receive completed in error
    /// (our SEND never acknowledged by the peer's QP: retries exceeded).
    #[error("RDMA connection not confirmed: {0}; the peer's QP does not answer over RDMA (a PSN or GID mismatch, or a path that drops RDMA packets)")]
    ConfirmFailed(VerbsError),
    /// A token arrived but it is not this TLS session's.
    #[error("RDMA connection not confirmed: the peer's token does not belong to this TLS session")]
    BadToken,
    /// Data larger than the negotiated buffer.
    #[error("{len} bytes exceed the {max}-byte buffer of this connection")]
    TooLarge {
        /// Requested size.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The server acknowledged another operation than the one just made.
    #[error("protocol error: the server acknowledged a {acked} after our {sent}")]
    WrongAck {
        /// What this side did.
        sent: crate::datapath::Op,
        /// What the acknowledgement names.
        acked: crate::datapath::Op,
    },
    /// An RDMA message from the server where an acknowledgement record
    /// ([`crate::datapath::Ack::encode`]) belongs was not one.
    #[error("protocol error: the server's RDMA acknowledgement is malformed ({len} bytes)")]
    BadAck {
        /// Bytes that arrived.
        len: usize,
    },
    /// An acknowledgement was awaited while no operation was in flight.
    #[error("no operation is in flight: nothing to acknowledge")]
    NothingInFlight,
    /// The control channel did not answer in time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
    /// The server ended this lane on its own and said so over TLS
    /// ([`crate::lanes::LANE_CLOSED`]); the session and its other lanes go on.
    #[error("the server closed the lane: {0}")]
    LaneClosed(String),
    /// A message that arrived over RDMA is not the peer's: nothing of it was delivered. The
    /// QP accepted a packet the peer never sent, so the session must end.
    #[error("RDMA message failed authentication (forged, replayed or corrupted): {0}")]
    Auth(#[source] AuthError),
    /// A message could not be sealed.
    #[error(transparent)]
    Seal(#[from] SealError),
    /// Payload protection was configured without keys, or keys given with
    /// protection off.
    #[error("payload protection: SessionConfig::protected and Secrets::protection disagree")]
    ProtectionMismatch,
    /// The peer's GID is not the address its TLS connection came from.
    #[error("the peer's RDMA GID {gid} does not carry its TLS address {address}: refusing to connect RDMA to another host")]
    GidMismatch {
        /// The GID the peer announced.
        gid: crate::verbs::Gid,
        /// The address of the TLS peer.
        address: std::net::IpAddr,
    },
    /// The peer registered no buffer for RDMA WRITE (clients never do).
    #[error("the peer accepts no RDMA WRITE")]
    NoRemoteBuffer,
    /// Resources made ahead of time were given to a session of another shape (sizes).
    #[error("the resources made ahead were made for other sizes than this session's")]
    ShapeMismatch,
    /// The session's resources could not be made on a shared receive queue.
    #[error(transparent)]
    SharedQueue(#[from] SharedQueueError),
    /// A session on a shared receive queue must grant remote writes through a memory window
    /// (`memory_window`), and its messages must fit the queue's slots.
    #[error("this session cannot use the shared receive queue: {0}")]
    SharedQueueUnsuitable(&'static str),
    /// The shared receive queue gave this session no message (see [`InboxError`]).
    #[error(transparent)]
    SharedReceive(InboxError),
}

/// Sizes, timeouts and what the peer may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Largest SEND or WRITE payload, in bytes.
    pub buffer_size: usize,
    /// Receive slots kept posted.
    pub recv_slots: usize,
    /// Messages this side may have posted and not yet seen complete
    /// ([`Session::post`]): each has its own slot in the send region, so a
    /// pipelined sender never overwrites bytes still on their way.
    pub send_slots: usize,
    /// Slots of the region the peer WRITEs into (with `accept_writes`): the
    /// peer's n-th WRITE lands in slot n mod `write_slots`, so that many can
    /// be in flight before the first is consumed.
    pub write_slots: usize,
    /// Timeout of each step (completions, control replies, confirmation).
    pub timeout: Duration,
    /// Payloads are sealed ([`crate::protect`]): every buffer grows by
    /// [`OVERHEAD`] bytes for the header and tag.
    pub protected: bool,
    /// Register a buffer the peer may RDMA WRITE into and give the QP remote
    /// write access. Only the side that receives writes (the server) needs
    /// it; the other side's memory then has no remote access at all.
    pub accept_writes: bool,
    /// When set, the peer's GID must carry this address (the TLS peer's):
    /// see [`Gid::carries`](crate::verbs::Gid::carries).
    pub peer_address: Option<std::net::IpAddr>,
    /// With `accept_writes`: give the peer the rkey of a type 2 memory window bound to this
    /// session's QP over the write slots, invalidated when the session is drained, instead of
    /// the region's own rkey (the region then grants no remote access itself). Falls back to
    /// the region's rkey, with a warning, on a device without type 2 windows.
    pub memory_window: bool,
    /// The largest payload this side posts (SENDs or WRITEs), when that is less than
    /// `buffer_size`: its send slots are made that size (plus header and tag when protected).
    /// A server posts nothing but its acknowledgements
    /// ([`Ack::WIRE_LEN`](crate::datapath::Ack::WIRE_LEN) bytes), so send slots of the
    /// client's buffer size, one per operation in flight, were memory every session held for
    /// nothing. `None`: `buffer_size`.
    pub max_post: Option<usize>,
    /// The largest payload the peer posts to us, when that is less than `buffer_size`: the
    /// receive slots are made that size. A client hears nothing over RDMA but the server's
    /// token and acknowledgements, so sixteen receive slots of its buffer size (64 KiB of
    /// every session and lane at the default 4 KiB) held 46-byte records. A larger SEND from
    /// the peer then fails its receive (a local length error) and ends the session. `None`:
    /// `buffer_size`.
    pub max_receive: Option<usize>,
    /// With `accept_writes`: the write region (and its memory window) is made only when the
    /// peer asks for it ([`Session::open_writes`], [`crate::handshake::WRITE_ON_DEMAND`]),
    /// not with the session. Its QP accepts remote writes from the start, but nothing grants
    /// one until then: a session that never receives a WRITE holds no region, no window and
    /// no rkey (a registered page and its kernel records per held session).
    pub writes_on_demand: bool,
}

impl SessionConfig {
    /// Bytes of one message slot (payload, plus header and tag when
    /// protected) and receive slots, as [`Session::establish`] uses them.
    fn layout(&self) -> (usize, usize) {
        (self.slot_for(self.buffer_size), self.recv_slots.max(2))
    }

    /// Bytes of a slot holding a payload of `len`: the header and tag when protected, and
    /// room for the confirmation token in every case.
    fn slot_for(&self, len: usize) -> usize {
        let overhead = if self.protected { OVERHEAD } else { 0 };
        len.saturating_add(overhead).max(TOKEN_LEN)
    }

    /// The largest payload this side posts: `buffer_size`, or less ([`SessionConfig::max_post`]).
    fn post_len(&self) -> usize {
        self.max_post
            .map_or(self.buffer_size, |m| m.min(self.buffer_size))
    }

    /// The largest payload the peer SENDs us: `buffer_size`, or less
    /// ([`SessionConfig::max_receive`]).
    fn receive_len(&self) -> usize {
        self.max_receive
            .map_or(self.buffer_size, |m| m.min(self.buffer_size))
    }

    /// Send slots and write slots, at least one each.
    fn slots(&self) -> (usize, usize) {
        (self.send_slots.max(1), self.write_slots.max(1))
    }

    /// Admits, against `quota`, every control-path call [`Session::establish`]
    /// makes, before any of them reaches the kernel: one QP and its three state
    /// transitions, one PD, two CQs and its MRs with their sizes (send, receive and, unless it
    /// waits for the peer to ask, [`SessionConfig::writes_on_demand`], write slots).
    ///
    /// All or nothing: on a refusal the calls admitted so far are released, so
    /// a refused client leaves no count behind and no half-built session. Keep
    /// the result as long as the session lives; dropping it releases the counts.
    ///
    /// ```
    /// use secure_rdma::quota::{QuotaConfig, Quotas, TenantInfo};
    /// use secure_rdma::session::SessionConfig;
    ///
    /// let quotas = Quotas::new(QuotaConfig::parse("tenant alice QP_COUNT 1\n", "q")?);
    /// let alice = quotas.register(TenantInfo { identity: "alice".into(), pid: 1, cgroup_id: 1 });
    /// let first = SessionConfig::default().admit(&alice)?;
    /// let refused = SessionConfig::default().admit(&alice).unwrap_err();
    /// assert_eq!(refused.to_string(), "QP_COUNT limit 1 reached for tenant alice (1 live)");
    /// drop(first);
    /// assert!(SessionConfig::default().admit(&alice).is_ok());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit(&self, quota: &TenantQuota) -> Result<SessionAdmission, Refusal> {
        self.admit_calls(quota, false)
    }

    /// [`SessionConfig::admit`] for a session on a server's shared receive queue
    /// ([`Resources::on_shared`]): it makes its send slots' region and its write region (unless
    /// made on demand, [`SessionConfig::admit_writes`]), and no
    /// PD or CQ; the queue's PD, SRQ, CQs and receive slots are the server's, counted against
    /// no tenant, as a warm pool's are until taken.
    ///
    /// ```
    /// use secure_rdma::quota::{QuotaConfig, Quotas, TenantInfo};
    /// use secure_rdma::session::SessionConfig;
    ///
    /// let quotas = Quotas::new(QuotaConfig::parse("tenant alice CQ_COUNT 1\n", "q")?);
    /// let alice = quotas.register(TenantInfo { identity: "alice".into(), pid: 1, cgroup_id: 1 });
    /// // A session of its own needs a send CQ and a receive CQ; on the shared queue, none, so
    /// // the one CQ alice may hold does not bound her sessions there.
    /// assert!(SessionConfig::default().admit(&alice).is_err());
    /// let first = SessionConfig::default().admit_on_shared(&alice)?;
    /// let second = SessionConfig::default().admit_on_shared(&alice)?;
    /// # drop((first, second));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit_on_shared(&self, quota: &TenantQuota) -> Result<SessionAdmission, Refusal> {
        self.admit_calls(quota, true)
    }

    fn admit_calls(&self, quota: &TenantQuota, shared: bool) -> Result<SessionAdmission, Refusal> {
        // The sizes Resources registers, from the one place that derives them.
        let shape = self.shape();
        let bytes = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        // The QP first: it is what operators limit most, and its refusal
        // reason is the one a client can act on.
        let mut held = vec![quota.admit(Verb::QpCreate)?];
        for _ in 0..3 {
            held.push(quota.admit(Verb::QpModify)?);
        }
        // On a shared queue the PD and the CQs are the queue's.
        if !shared {
            held.push(quota.admit(Verb::PdAlloc)?);
            for _ in 0..2 {
                held.push(quota.admit(Verb::CqCreate)?);
            }
        }
        // A region made on demand is admitted when it is asked for ([`SessionConfig::admit_writes`]).
        let data = shape.write_region().then_some(shape.write_len());
        let receive = (!shared).then_some(shape.recv_len.saturating_mul(shape.recv_slots));
        let send = shape.send_len.saturating_mul(shape.send_slots);
        for size in [Some(send), receive, data].into_iter().flatten() {
            held.push(quota.admit_mr(bytes(size))?);
        }
        Ok(SessionAdmission { _held: held })
    }

    /// Admits, against `quota`, the write region a session made with
    /// [`SessionConfig::writes_on_demand`] registers when its peer asks for it
    /// ([`Session::open_writes`]): one MR of its size. Keep it as long as the session.
    ///
    /// ```
    /// use secure_rdma::quota::{QuotaConfig, Quotas, TenantInfo};
    /// use secure_rdma::session::SessionConfig;
    ///
    /// let quotas = Quotas::new(QuotaConfig::parse("tenant alice MR_COUNT 2\n", "q")?);
    /// let alice = quotas.register(TenantInfo { identity: "alice".into(), pid: 1, cgroup_id: 1 });
    /// let cfg = SessionConfig { writes_on_demand: true, ..SessionConfig::default() };
    /// // On a shared queue a session registers its send slots and its write region: the
    /// // second only once asked for.
    /// let first = cfg.admit_on_shared(&alice)?;
    /// let second = cfg.admit_on_shared(&alice)?;
    /// let refused = cfg.admit_writes(&alice).unwrap_err();
    /// assert_eq!(refused.to_string(), "MR_COUNT limit 2 reached for tenant alice (2 live)");
    /// drop(second);
    /// let writes = cfg.admit_writes(&alice)?;
    /// # drop((first, writes));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn admit_writes(&self, quota: &TenantQuota) -> Result<SessionAdmission, Refusal> {
        let len = u64::try_from(self.shape().write_len()).unwrap_or(u64::MAX);
        Ok(SessionAdmission {
            _held: vec![quota.admit_mr(len)?],
        })
    }
}

/// The quota admissions of one session's resources (see
/// [`SessionConfig::admit`]); dropping it releases their counts.
#[derive(Debug)]
pub struct SessionAdmission {
    _held: Vec<Admission>,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            buffer_size: 4096,
            recv_slots: 16,
            send_slots: 1,
            write_slots: 1,
            timeout: Duration::from_secs(5),
            protected: true,
            accept_writes: true,
            peer_address: None,
            memory_window: true,
            max_post: None,
            max_receive: None,
            writes_on_demand: false,
        }
    }
}

/// What only the two ends of the TLS session know: the confirmation tokens
/// and, when payloads are protected, the keys.
#[derive(Debug)]
pub struct Secrets {
    /// The tokens each side proves over RDMA first.
    pub tokens: Tokens,
    /// The payload keys ([`Protection::from_tls`]); `None` sends
    /// payloads in clear, which the peer must have agreed to.
    pub protection: Option<Protection>,
}

/// What was set on the QP, for audits and tests (PSNs are secrets: log them at debug level
/// only). [`Session::query`] reads back what the device holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Wiring {
    /// Our endpoint as sent to the peer.
    pub local: Endpoint,
    /// The peer's endpoint as received.
    pub remote: Endpoint,
}

/// How long [`Session::establish`] took, in its two phases (for benchmarks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EstablishTiming {
    /// PD, CQs, MRs and QP made, endpoints exchanged over TLS, QP in RTS, both sides ready.
    pub setup: Duration,
    /// The tokens exchanged over RDMA and the confirmations over TLS.
    pub confirmation: Duration,
}

/// Something the peer made land on this side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// An RDMA SEND with these bytes.
    Send(Vec<u8>),
    /// An RDMA WRITE of these bytes into our buffer, signalled by its
    /// immediate (the length).
    Write(Vec<u8>),
}

impl Arrival {
    /// The operation that made it land.
    pub fn op(&self) -> Op {
        match self {
            Arrival::Send(_) => Op::Send,
            Arrival::Write(_) => Op::Write,
        }
    }

    /// The bytes that arrived.
    pub fn data(&self) -> &[u8] {
        match self {
            Arrival::Send(d) | Arrival::Write(d) => d,
        }
    }

    /// The bytes that arrived, owned.
    pub fn into_data(self) -> Vec<u8> {
        match self {
            Arrival::Send(d) | Arrival::Write(d) => d,
        }
    }
}

const TOKEN_WR: u64 = u64::MAX;
const SEND_WR: u64 = 1;
const WRITE_WR: u64 = 2;
const BIND_WR: u64 = 3;
const INVALIDATE_WR: u64 = 4;

/// Where a session's receives come from.
enum Receive {
    /// Its own receive queue, with a slot of this region per posted receive (`wr_id` = slot).
    Own(Arc<MemoryRegion>),
    /// A server's [`SharedQueue`], whose pump routes this QP's messages here.
    Shared(Inbox),
}

/// One receive, as [`Session::next_received`] returns it.
struct Received {
    opcode: WcOpcode,
    /// A SEND's bytes (empty for a WRITE, whose bytes are in the write region).
    data: Result<Vec<u8>, SessionError>,
    imm: Option<u32>,
}

/// One connection's RDMA resources in RTS, confirmed.
pub struct Session {
    // The bound window is shared with the QP, which deallocates it just before the QP is
    // destroyed, on every path (drained, dropped, or an error in `establish`): deallocating it
    // releases the QP and the region it is bound to. Then the QP goes, then the regions.
    window: Option<Arc<MemoryWindow>>,
    qp: QueuePair<Rts>,
    send: Slots,
    receive: Receive,
    data_mr: Option<Arc<MemoryRegion>>,
    remote_buffer: Option<RemoteBuffer>,
    /// The peer grants its write region when asked ([`crate::handshake::WRITE_ON_DEMAND`]):
    /// until [`Session::granted_writes`], WRITEs wait for it rather than being refused.
    peer_grants_writes: bool,
    protection: Option<Protection>,
    /// Bytes of a message slot: payload plus overhead when protected.
    slot_len: usize,
    /// Bytes of one of our send slots ([`Shape::send_len`]).
    send_len: usize,
    /// Bytes of one of our receive slots ([`Shape::recv_len`]).
    recv_len: usize,
    /// Operations posted, and how many of them have completed: the
    /// difference is in flight, each in its own send slot.
    posted: u64,
    completed: u64,
    /// Receives posted on the session's own receive queue and not yet consumed as a
    /// completion (none on a shared queue, whose receives are the queue's).
    recv_posted: usize,
    /// WRITEs posted to the peer (the next lands in slot `writes_posted`
    /// mod the peer's write slots) and WRITEs that landed here.
    writes_posted: u64,
    writes_landed: u64,
    config: SessionConfig,
    wiring: Wiring,
    timing: EstablishTiming,
    /// When setting this session up began: [`Session::timing`]'s origin.
    started: std::time::Instant,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("qp", &self.qp).finish()
    }
}

/// Bounds one control-channel step in time: `step` names it in the timeout error.
async fn within<T>(
    timeout: Duration,
    step: &'static str,
    fut: impl std::future::Future<Output = Result<T, HandshakeError>>,
) -> Result<T, SessionError> {
    Ok(tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| SessionError::Timeout(timeout, step))??)
}

impl Session {
    /// Creates this connection's resources on `device`, sending from `sgid`,
    /// and connects and confirms them with the peer over `chan`.
    ///
    /// Both ends call it once admission is done (the peer runs the same
    /// steps); the secrets come from the TLS session
    /// ([`crate::tls::confirmation_token`]).
    ///
    /// ```no_run
    /// use secure_rdma::handshake::Channel;
    /// use secure_rdma::session::{Secrets, Session, SessionConfig};
    /// use secure_rdma::verbs::Device;
    ///
    /// # async fn demo(tls: tokio::net::TcpStream, secrets: Secrets) -> Result<(), Box<dyn std::error::Error>> {
    /// // `secrets`: the TLS session's confirmation tokens and payload keys
    /// // (secure_rdma::tls::confirmation_tokens, secure_rdma::protect::Protection::from_tls).
    /// let (device, sgid) = Device::open_for_address("10.77.0.1".parse()?)?;
    /// let mut chan = Channel::new(tls);
    /// let mut session =
    ///     Session::establish(&mut chan, &device, sgid, secrets, SessionConfig::default()).await?;
    /// session.send(b"first message").await?;
    /// # Ok(()) }
    /// ```
    pub async fn establish<S: AsyncRead + AsyncWrite + Unpin>(
        chan: &mut Channel<S>,
        device: &Arc<Device>,
        sgid: GidEntry,
        secrets: Secrets,
        config: SessionConfig,
    ) -> Result<Session, SessionError> {
        let prepared = Prepared::new(device, sgid, secrets, config)?;
        Session::establish_prepared(chan, prepared).await
    }

    /// [`Session::establish`] with resources already made: from [`Prepared::new`], or from
    /// [`Prepared::from_resources`] on the warm path ([`crate::warm`]), where only connecting
    /// and confirming the QP are left.
    pub async fn establish_prepared<S: AsyncRead + AsyncWrite + Unpin>(
        chan: &mut Channel<S>,
        prepared: Prepared,
    ) -> Result<Session, SessionError> {
        let config = prepared.config;
        chan.send(&Message::Endpoint {
            endpoint: prepared.local(),
        })
        .await?;
        let remote = within(
            config.timeout,
            "the peer's endpoint",
            chan.expect_endpoint(),
        )
        .await?;
        let unconfirmed = prepared.connect(remote).await?;
        // Both QPs in RTS before the first RDMA message.
        chan.send(&Message::Ready).await?;
        within(config.timeout, "the peer's ready", chan.expect_ready()).await?;
        let mut session = unconfirmed.confirm(Confirm::Together).await?;
        chan.send(&Message::Confirmed).await?;
        within(
            config.timeout,
            "the peer's confirmation",
            chan.expect_confirmed(),
        )
        .await?;
        session.timing.confirmation = session
            .started
            .elapsed()
            .saturating_sub(session.timing.setup);
        Ok(session)
    }

    /// The client's end of an early-endpoint setup ([`crate::handshake::EarlyEndpoint`]): the
    /// server took the endpoint of `prepared` from the hello and answered with its own,
    /// `remote`, its QP already in RTR. Ours goes to RTS and SENDs its token first; the
    /// server's token, which it SENDs once it has checked ours, confirms both. No TLS message
    /// is sent; `chan` is listened to meanwhile ([`Channel::unless_told`]): a server that
    /// refuses our token, or fails after its accept, says why there with an abort, which ends
    /// the setup at once with its reason instead of the confirmation's timeout.
    pub async fn establish_early_client<S: AsyncRead + AsyncWrite + Unpin>(
        chan: &mut Channel<S>,
        prepared: Prepared,
        remote: Endpoint,
    ) -> Result<Session, SessionError> {
        let confirm = async {
            prepared
                .connect(remote)
                .await?
                .confirm(Confirm::First)
                .await
        };
        chan.unless_told(confirm, |m| Some(m.into_abort().into()))
            .await
    }

    /// The server's end of an early-endpoint setup: `remote` is the client's endpoint from its
    /// hello. The QP goes to RTR toward it, and only then is `accept` sent (the accept with
    /// this end's endpoint): a token that reached a QP in INIT would be dropped, and the
    /// client's retransmission would wait out rxe's ACK timeout (tens of milliseconds). RTS
    /// follows while the accept travels; our token goes once the client's has been checked.
    pub async fn establish_early_server<S: AsyncRead + AsyncWrite + Unpin>(
        chan: &mut Channel<S>,
        prepared: Prepared,
        remote: Endpoint,
        accept: &Message,
    ) -> Result<Session, SessionError> {
        let announce = async {
            chan.send(accept).await?;
            Ok(())
        };
        prepared
            .connect_with(remote, announce)
            .await?
            .confirm(Confirm::Second)
            .await
    }

    /// How long setting up and confirming this session took.
    pub fn timing(&self) -> EstablishTiming {
        self.timing
    }

    /// Chooses how this session waits for its completions (both CQs): event-driven (the
    /// default) or busy polling, which takes a core for the lowest latency.
    pub fn set_poll(&self, poll: Poll) {
        // A shared queue's CQs are their pumps', which wait on events for every session: a
        // session there is always event-driven.
        match &self.receive {
            Receive::Own(_) => {
                self.qp.send_cq().set_poll(poll);
                self.qp.recv_cq().set_poll(poll);
            }
            Receive::Shared(_) => {}
        }
    }

    /// What was exchanged while connecting.
    pub fn wiring(&self) -> &Wiring {
        &self.wiring
    }

    /// What the device reports for this session's QP now (`ibv_query_qp`): its state, PSNs
    /// and peer QPN, to check against [`Session::wiring`].
    pub fn query(&self) -> Result<QpAttributes, VerbsError> {
        self.qp.query()
    }

    /// The cipher protecting payloads, `None` when they travel in clear.
    pub fn cipher(&self) -> Option<crate::protect::Cipher> {
        self.protection.as_ref().map(|p| p.sealer.cipher())
    }

    /// Binds the payload keys to `stream` from its operation `first` ([`Protection::bind_stream`];
    /// nothing when payloads travel in clear): a lane that resumes a stream learns where from
    /// the server's answer, after its keys were made.
    pub(crate) fn bind_stream(
        &mut self,
        side: crate::protect::Side,
        stream: crate::datapath::StreamId,
        first: u64,
    ) {
        if let Some(p) = self.protection.as_mut() {
            p.bind_stream(side, stream, first);
        }
    }

    /// How many times the payload keys rotated so far: what this side sends, and what it
    /// received ([`Protection::epochs`]); `(0, 0)` unprotected.
    pub fn key_epochs(&self) -> (u64, u64) {
        self.protection.as_ref().map_or((0, 0), |p| p.epochs())
    }

    /// Largest SEND payload, in bytes.
    pub fn max_len(&self) -> usize {
        self.config.post_len()
    }

    /// Largest WRITE payload, in bytes: the smaller of ours and what one
    /// slot of the peer's buffer holds (0 when the peer accepts no writes).
    pub fn max_write_len(&self) -> usize {
        let overhead = self.slot_len - self.config.buffer_size.min(self.slot_len);
        // A region granted on request holds a slot of the common length, as one announced
        // with the endpoint does.
        let remote = match self.remote_buffer {
            Some(b) => usize::try_from(b.len).unwrap_or(usize::MAX),
            None if self.peer_grants_writes => self.slot_len,
            None => 0,
        };
        self.max_len()
            .min(remote.min(self.slot_len).saturating_sub(overhead))
    }

    /// The peer grants its write region when asked ([`crate::handshake::WRITE_ON_DEMAND`]):
    /// the session's WRITEs need [`Session::granted_writes`] first.
    pub(crate) fn expect_write_grant(&mut self) {
        self.peer_grants_writes = true;
    }

    /// Whether a WRITE must first ask the peer for its region (granted on request, and not
    /// granted yet).
    pub(crate) fn needs_write_grant(&self) -> bool {
        self.peer_grants_writes && self.remote_buffer.is_none()
    }

    /// The region the peer granted on request: WRITEs go to it from now on.
    pub(crate) fn granted_writes(&mut self, buffer: RemoteBuffer) {
        self.remote_buffer = Some(buffer);
        self.wiring.remote.buffer = Some(buffer);
    }

    /// This side's write region, made now if it was left for the peer to ask for
    /// ([`SessionConfig::writes_on_demand`]): registered, and on a device with type 2 memory
    /// windows a window bound to this session's QP over it, exactly as a region made with the
    /// session. Asked again, the same region. What the peer needs is returned (and is this
    /// side's [`Wiring::local`] buffer from now on).
    ///
    /// The window's bind goes on the send queue: what is in flight completes first, so that
    /// no completion of the bind is taken for an operation's.
    pub async fn open_writes(&mut self) -> Result<RemoteBuffer, OpenWritesError> {
        if let Some(buffer) = self.wiring.local.buffer {
            return Ok(buffer);
        }
        let shape = self.config.shape();
        if !shape.accept_writes {
            return Err(OpenWritesError::Refused(SessionError::NoRemoteBuffer));
        }
        let pd = Arc::clone(self.qp.pd());
        // On a shared protection domain a region's own rkey would reach every session's
        // memory: a window there, or nothing ([`Resources::on_shared`] asks the same).
        let windows = match &self.receive {
            Receive::Shared(_) => true,
            Receive::Own(_) => shape.memory_window && has_windows(pd.device()),
        };
        let access = match windows {
            true => MrAccess::WindowBind,
            false => MrAccess::RemoteWrite,
        };
        let refused = |e: VerbsError| OpenWritesError::Refused(e.into());
        let mr = MemoryRegion::new(&pd, shape.write_len(), access).map_err(refused)?;
        let buffer = match windows {
            false => mr.remote(),
            true => {
                let window = Arc::new(MemoryWindow::alloc(&pd).map_err(refused)?);
                self.flush().await.map_err(OpenWritesError::Lost)?;
                self.qp
                    .post_bind_window(BIND_WR, &window, &mr)
                    .map_err(|e| OpenWritesError::Lost(e.into()))?;
                next_sent_ok(
                    self.qp.send_cq(),
                    &mut self.receive,
                    "the memory window's bind",
                    self.config.timeout,
                )
                .await
                .map_err(OpenWritesError::Lost)?;
                let buffer = window.remote(&mr);
                self.window = Some(window);
                buffer
            }
        };
        self.data_mr = Some(mr);
        self.wiring.local.buffer = Some(buffer);
        Ok(buffer)
    }

    /// Slots of the peer's write buffer: WRITEs go to them in turn. The peer
    /// registered `write_slots` slots of our common slot length.
    fn remote_write_slots(&self, remote: &RemoteBuffer) -> u64 {
        (remote.len / self.slot_len as u64).max(1)
    }

    /// Operations posted whose completion has not been seen yet.
    pub fn in_flight(&self) -> usize {
        (self.posted - self.completed) as usize
    }

    /// Operations this side may have in flight at once (its send slots).
    pub fn send_slots(&self) -> usize {
        self.config.send_slots
    }

    /// Waits for the oldest operation in flight to complete (completions of
    /// one RC send queue come in posting order).
    async fn complete_one(&mut self) -> Result<(), SessionError> {
        let wc = next_sent(
            self.qp.send_cq(),
            &mut self.receive,
            "an RDMA operation to complete",
            self.config.timeout,
        )
        .await?;
        // Consumed whatever its status: a failed operation is no longer in flight either (what
        // [`Session::drain`] counts on).
        self.completed += 1;
        succeeded(wc).map(drop)
    }

    /// Puts `data` into the next send slot as it goes on the wire (sealed
    /// when protected), first waiting for that slot's previous operation to
    /// complete; returns the slot's byte range.
    async fn stage(
        &mut self,
        op: Op,
        data: &[u8],
        max: usize,
    ) -> Result<std::ops::Range<usize>, SessionError> {
        if data.len() > max {
            return Err(SessionError::TooLarge {
                len: data.len(),
                max,
            });
        }
        while self.in_flight() >= self.config.send_slots {
            self.complete_one().await?;
        }
        let at = (self.posted % self.config.send_slots as u64) as usize * self.send_len;
        let n = match &mut self.protection {
            None => {
                self.send.write(at, data)?;
                data.len()
            }
            Some(p) => {
                // Sealed in place in the registered slot: no copy through a buffer of the
                // session's own (a slot's worth of memory per session, and a copy per message).
                // SAFETY: the slot at `at` is not in flight: the loop above waited until fewer
                // than `send_slots` operations were, and they are the ones just before this one,
                // each in its own slot.
                unsafe {
                    self.send.fill_in_place(at, data.len() + OVERHEAD, |out| {
                        p.sealer.seal(op, data, out)
                    })
                }??
            }
        };
        Ok(at..at + n)
    }

    /// Posts an RDMA SEND (`Op::Send`) or WRITE WITH IMMEDIATE (`Op::Write`)
    /// of `data` without waiting for it to complete: up to
    /// [`SessionConfig::send_slots`] operations stay in flight, and a post
    /// beyond that first waits for the oldest. [`Session::flush`] waits for
    /// all of them. The peer must have a receive posted for each (its
    /// acknowledgements are the credits: see [`crate::client::Client::post`]).
    pub async fn post(&mut self, op: Op, data: &[u8]) -> Result<(), SessionError> {
        match op {
            Op::Send => {
                let range = self.stage(Op::Send, data, self.max_len()).await?;
                let range = self.send.absolute(range)?;
                self.qp.post_send(SEND_WR, self.send.region(), range)?;
            }
            Op::Write => {
                let remote = self.remote_buffer.ok_or(SessionError::NoRemoteBuffer)?;
                let max = self.max_write_len();
                let range = self.stage(Op::Write, data, max).await?;
                let len = u32::try_from(range.len()).map_err(|_| SessionError::TooLarge {
                    len: data.len(),
                    max,
                })?;
                let slot = self.writes_posted % self.remote_write_slots(&remote);
                let offset = slot * self.slot_len as u64;
                let range = self.send.absolute(range)?;
                self.qp.post_write_imm(
                    WRITE_WR,
                    self.send.region(),
                    range,
                    &remote,
                    offset,
                    len,
                )?;
                self.writes_posted += 1;
            }
        }
        self.posted += 1;
        Ok(())
    }

    /// Waits until every posted operation has completed.
    pub async fn flush(&mut self) -> Result<(), SessionError> {
        while self.in_flight() > 0 {
            self.complete_one().await?;
        }
        Ok(())
    }

    /// RDMA SENDs `data` to the peer and waits for its completion.
    pub async fn send(&mut self, data: &[u8]) -> Result<(), SessionError> {
        self.post(Op::Send, data).await?;
        self.flush().await
    }

    /// RDMA WRITEs `data` into the peer's buffer (its next write slot) with
    /// the wire length as the immediate, so the peer learns the write landed
    /// and its size, and waits for its completion.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), SessionError> {
        self.post(Op::Write, data).await?;
        self.flush().await
    }

    /// Resolves when the shared receive queue has cut this session's queue pair off for its
    /// peer sending beyond its credit ([`SessionError::SharedReceive`] with
    /// [`InboxError::OverCredit`]); never on a receive queue of its own. For a loop busy with
    /// something else than [`Session::arrival`] (a write its flooding peer does not read), so
    /// the session ends when the flood is cut, not when that wait ends. Cancel-safe.
    pub async fn cut_off(&self) -> SessionError {
        match &self.receive {
            Receive::Shared(inbox) => SessionError::SharedReceive(inbox.cut_off().await),
            Receive::Own(_) => std::future::pending().await,
        }
    }

    /// The next receive that completed, with a SEND's bytes copied out of its slot and the
    /// slot posted again (the session's own receive queue), or as the shared queue's pump
    /// routed it here. Cancel-safe.
    async fn next_received(&mut self) -> Result<Received, SessionError> {
        let mr = match &mut self.receive {
            Receive::Shared(inbox) => {
                let incoming = inbox.next().await.map_err(|e| match e {
                    // The same error as on a receive queue of the session's own, so that what
                    // the peer did (a bad rkey, a bad length) is sorted by its cause.
                    InboxError::Completion { wr_id, status } => VerbsError::WorkCompletion {
                        wr_id,
                        opcode: WcOpcode::Recv,
                        status,
                    }
                    .into(),
                    other => SessionError::SharedReceive(other),
                })?;
                return Ok(Received {
                    opcode: incoming.opcode,
                    data: Ok(incoming.data),
                    imm: incoming.imm,
                });
            }
            Receive::Own(mr) => Arc::clone(mr),
        };
        let wc = match self.qp.recv_cq().next_ok_unbounded().await {
            Ok(wc) => wc,
            Err(VerbsError::WorkCompletion { wr_id, status, .. }) => {
                // A receive completed in error is not posted again: one fewer to drain. Its
                // opcode field is undefined (libibverbs fills it only on success): on this
                // queue it was a receive.
                self.recv_posted = self.recv_posted.saturating_sub(1);
                return Err(VerbsError::WorkCompletion {
                    wr_id,
                    opcode: WcOpcode::Recv,
                    status,
                }
                .into());
            }
            Err(e) => return Err(e.into()),
        };
        let bs = self.recv_len;
        let slot = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
        if slot >= self.config.recv_slots {
            return Err(VerbsError::UnknownReceive(wc.wr_id).into());
        }
        let data = match wc.opcode {
            WcOpcode::Recv => mr
                .read(slot * bs, wc.byte_len as usize)
                .map_err(SessionError::from),
            // A WRITE's bytes are in the write region, not in the slot.
            _ => Ok(Vec::new()),
        };
        // The slot is free again whatever the verdict: its bytes were copied out.
        self.qp
            .post_recv(slot as u64, &mr, slot * bs..(slot + 1) * bs)?;
        Ok(Received {
            opcode: wc.opcode,
            data,
            imm: wc.imm_data,
        })
    }

    /// Waits (without timeout: the caller selects on it) for the next SEND or
    /// WRITE the peer makes land, verifies it when payloads are protected,
    /// and re-posts its receive slot.
    ///
    /// A message that fails verification is [`SessionError::Auth`]: none of
    /// it is returned, and the session must not be used any more (its QP has
    /// consumed a PSN the peer never sent, so the peer's next message would
    /// be dropped as a duplicate).
    pub async fn arrival(&mut self) -> Result<Arrival, SessionError> {
        let received = self.next_received().await?;
        let bs = self.slot_len;
        let (op, raw) = match received.opcode {
            WcOpcode::Recv => (Op::Send, received.data),
            WcOpcode::RecvRdmaWithImm => {
                let len = received.imm.unwrap_or(0) as usize;
                // WRITEs land in our slots in turn, and an RC QP delivers them in order, so
                // the slot is ours to know, not the peer's to say.
                let at = (self.writes_landed % self.config.write_slots as u64) as usize * bs;
                self.writes_landed += 1;
                match &self.data_mr {
                    // A length beyond the slot is not a WRITE we allowed (it would read the
                    // next slot): refused (its receive is already posted again).
                    Some(_) if len > bs => {
                        (Op::Write, Err(SessionError::TooLarge { len, max: bs }))
                    }
                    Some(mr) => (Op::Write, mr.read(at, len).map_err(SessionError::from)),
                    // We registered nothing for writes and gave the QP no remote write access:
                    // the device should have refused this.
                    None => return Err(VerbsError::UnexpectedCompletion(received.opcode).into()),
                }
            }
            other => return Err(VerbsError::UnexpectedCompletion(other).into()),
        };
        let mut raw = raw?;
        if let Some(p) = &mut self.protection {
            let len = p
                .opener
                .open(op, &mut raw)
                .map_err(SessionError::Auth)?
                .len();
            raw.drain(..HEADER_LEN);
            raw.truncate(len);
        }
        Ok(match op {
            Op::Send => Arrival::Send(raw),
            Op::Write => Arrival::Write(raw),
        })
    }
}

/// A session's resources made and its QP in INIT with its receives posted, not connected yet:
/// the first half of [`Session::establish`], and of a lane ([`crate::lanes`]), whose
/// endpoints travel in other messages.
pub struct Prepared {
    resources: Resources,
    protection: Option<Protection>,
    tokens: Tokens,
    local: Endpoint,
    config: SessionConfig,
    started: std::time::Instant,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("qp", &self.resources.qp)
            .finish()
    }
}

/// How the confirmation tokens are exchanged over the new QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirm {
    /// Both ends SEND theirs at once: both said over TLS that their QP is in RTS.
    Together,
    /// This end SENDs first, then waits for the peer's (a lane's client: the server's QP was
    /// in RTS before it answered).
    First,
    /// This end waits for the peer's token, then SENDs its own (a lane's server: the client's
    /// QP is in RTS once its token arrives).
    Second,
}

/// The sizes a session's resources are made with ([`SessionConfig::shape`]): resources made
/// for one shape serve any session whose configuration has the same shape
/// ([`Prepared::from_resources`]), whatever its keys, timeout or peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    slot_len: usize,
    send_len: usize,
    recv_len: usize,
    recv_slots: usize,
    send_slots: usize,
    write_slots: usize,
    accept_writes: bool,
    memory_window: bool,
    writes_on_demand: bool,
}

impl SessionConfig {
    /// The sizes of the resources a session of this configuration needs.
    pub fn shape(&self) -> Shape {
        let (slot_len, recv_slots) = self.layout();
        let (send_slots, write_slots) = self.slots();
        Shape {
            slot_len,
            send_len: self.slot_for(self.post_len()),
            recv_len: self.slot_for(self.receive_len()),
            recv_slots,
            send_slots,
            write_slots,
            accept_writes: self.accept_writes,
            memory_window: self.accept_writes && self.memory_window,
            writes_on_demand: self.accept_writes && self.writes_on_demand,
        }
    }
}

impl Shape {
    /// Bytes of one message slot: the payload, plus the header and tag when protected (what
    /// the peer's write slots are laid out in).
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Bytes of one send slot: a [`Shape::slot_len`], or less for a side that posts only
    /// smaller payloads ([`SessionConfig::max_post`]).
    pub fn send_len(&self) -> usize {
        self.send_len
    }

    /// Bytes of one receive slot: a [`Shape::slot_len`], or less for a side whose peer SENDs
    /// only smaller payloads ([`SessionConfig::max_receive`]). A [`SharedQueue`] serving such
    /// sessions needs slots of at least this size.
    pub fn recv_len(&self) -> usize {
        self.recv_len
    }

    /// Bytes of the write region: a slot per WRITE the peer may have in flight.
    pub fn write_len(&self) -> usize {
        self.slot_len.saturating_mul(self.write_slots)
    }

    /// Whether the write region is made with the session's resources: it accepts writes, and
    /// not only on demand ([`SessionConfig::writes_on_demand`]).
    pub fn write_region(&self) -> bool {
        self.accept_writes && !self.writes_on_demand
    }
}

/// A session's RDMA resources, made and ready to be connected: its PD, CQs, memory regions,
/// memory window and QP, the QP in INIT with every receive posted. Nothing in it belongs to a
/// TLS session yet (no PSN, no keys, no peer): [`Prepared::from_resources`] gives it those.
/// A [`crate::warm::WarmPool`] makes them ahead of time; each serves one session.
pub struct Resources {
    window: Option<Arc<MemoryWindow>>,
    qp: QueuePair<crate::verbs::Init>,
    send: Slots,
    receive: Receive,
    data_mr: Option<Arc<MemoryRegion>>,
    sgid: GidEntry,
    mtu: crate::verbs::PathMtu,
    shape: Shape,
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resources")
            .field("qp", &self.qp)
            .field("shape", &self.shape)
            .finish()
    }
}

impl Resources {
    /// Makes the PD, CQs, memory regions, window and QP a session of `config` needs on
    /// `device`, sending from `sgid`, and posts the receives.
    pub fn new(
        device: &Arc<Device>,
        sgid: GidEntry,
        config: &SessionConfig,
    ) -> Result<Resources, VerbsError> {
        let shape = config.shape();
        let (bs, slots) = (shape.slot_len, shape.recv_slots);
        let recv_len = shape.recv_len;
        let (send_slots, write_slots) = (shape.send_slots, shape.write_slots);
        let pd = device.alloc_pd()?;
        let depth = u32::try_from(slots * 2).unwrap_or(u32::MAX);
        let send_cq = CompletionQueue::new(device, depth)?;
        let recv_cq = CompletionQueue::new(device, depth)?;
        // Fresh registrations: their bytes are zero, whatever an earlier session put in its own.
        let send_mr = MemoryRegion::new(&pd, shape.send_len * send_slots, MrAccess::Local)?;
        let recv_mr = MemoryRegion::new(&pd, recv_len * slots, MrAccess::Local)?;
        // Only a side that receives RDMA WRITEs exposes memory, and only this one region:
        // registered per session (a fresh rkey) and zero-based, so no heap address leaks.
        let windows = shape.write_region() && shape.memory_window && has_windows(device);
        // On demand ([`SessionConfig::writes_on_demand`]), nothing yet: the QP still accepts
        // remote writes, but no rkey grants one before [`Session::open_writes`].
        let data_mr = match shape.write_region() {
            true => Some(MemoryRegion::new(
                &pd,
                bs * write_slots,
                match windows {
                    true => MrAccess::WindowBind,
                    false => MrAccess::RemoteWrite,
                },
            )?),
            false => None,
        };
        let caps = QpCaps {
            max_send_wr: u32::try_from(send_slots.max(16)).unwrap_or(u32::MAX),
            max_recv_wr: depth,
        };
        let mut qp = QueuePair::create(&pd, &send_cq, &recv_cq, sgid.clone(), caps)?
            .into_init(shape.accept_writes)?;
        // The window is allocated after the QP, as the session's newest kernel object: when a
        // process dies without draining (SIGKILL), the kernel destroys its objects newest first,
        // so the window goes (releasing rxe's reference on the QP it is bound to) before the
        // QP, whose destruction would otherwise wait 50 s for that reference (Linux 6.1; see
        // the README's memory windows).
        let window = match (windows, &data_mr) {
            (true, Some(_)) => Some(Arc::new(MemoryWindow::alloc(&pd)?)),
            _ => None,
        };
        for slot in 0..slots {
            qp.post_recv(
                slot as u64,
                &recv_mr,
                slot * recv_len..(slot + 1) * recv_len,
            )?;
        }
        Ok(Resources {
            window,
            qp,
            send: Slots::whole(send_mr),
            receive: Receive::Own(recv_mr),
            data_mr,
            sgid,
            mtu: device.active_mtu()?,
            shape,
        })
    }

    /// Makes the memory regions, window and QP a session of `config` needs, on `shared`'s
    /// protection domain, the QP taking its receives from `shared` and completing its sends on
    /// its shared send CQs: no receive queue, receive slots or CQ of its own. The peer's credit
    /// there is `config.recv_slots` messages waiting.
    ///
    /// Refused unless `config` grants remote writes through a memory window (its
    /// `memory_window`, or no `accept_writes`): on a shared protection domain a region's own
    /// rkey would reach every session's memory.
    pub fn on_shared(
        shared: &SharedQueue,
        sgid: GidEntry,
        config: &SessionConfig,
    ) -> Result<Resources, SessionError> {
        let shape = config.shape();
        if shape.accept_writes && !shape.memory_window {
            return Err(SessionError::SharedQueueUnsuitable(
                "it would grant remote writes with a region's rkey, which every session on the shared protection domain could use (enable memory windows)",
            ));
        }
        if shape.recv_len > shared.slot_len() {
            return Err(SessionError::SharedQueueUnsuitable(
                "its messages are larger than the shared queue's slots",
            ));
        }
        let bs = shape.slot_len;
        let (send_slots, write_slots) = (shape.send_slots, shape.write_slots);
        let pd = shared.pd();
        let device = pd.device();
        // What can be posted at once: a send per slot (the token goes alone, before any),
        // the window's bind and its invalidation. rxe's send queue entries are large (its
        // rings are most of what a session on the shared queue maps), so no more than that;
        // it is also what the session reserves of the shared send CQ.
        let max_send = (send_slots + 2).max(4);
        // From the queue's arena: a registration per 64 sessions, not one each.
        let send = shared.send_slots().take(shape.send_len * send_slots)?;
        let data_mr = match shape.write_region() {
            true => Some(MemoryRegion::new(
                pd,
                bs * write_slots,
                MrAccess::WindowBind,
            )?),
            false => None,
        };
        let caps = QpCaps {
            max_send_wr: u32::try_from(max_send).unwrap_or(u32::MAX),
            max_recv_wr: 0,
        };
        // Its sends complete on the queue's shared send CQ: the session makes no CQ.
        let (mut qp, inbox) =
            shared.attach_sending(sgid.clone(), caps, shape.recv_slots, shape.accept_writes)?;
        // The slots go back to the arena only once the QP is destroyed: no send of this
        // session can read them after another session has them.
        qp.retain(send.lease());
        // After the QP, as in `new`: the kernel destroys the window first on a process's death.
        let window = match &data_mr {
            Some(_) => Some(Arc::new(MemoryWindow::alloc(pd)?)),
            None => None,
        };
        Ok(Resources {
            window,
            qp,
            send,
            receive: Receive::Shared(inbox),
            data_mr,
            sgid,
            mtu: device.active_mtu()?,
            shape,
        })
    }

    /// The sizes these resources were made with.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Whether the QP is still in INIT, as made (one `ibv_query_qp`): a QP the device moved
    /// to ERROR while it waited in a pool (a port or device event) cannot be connected.
    pub fn is_ready(&self) -> bool {
        matches!(self.qp.query(), Ok(a) if a.state == <crate::verbs::Init as crate::verbs::QpState>::NAME)
    }

    /// What a peer needs to connect to these resources, with `psn` as this end's first PSN
    /// (drawn for the session alone, whenever its QP was made).
    pub fn endpoint(&self, psn: Psn) -> Endpoint {
        let buffer = match (&self.window, &self.data_mr) {
            (Some(w), Some(mr)) => Some(w.remote(mr)),
            (None, Some(mr)) => Some(mr.remote()),
            _ => None,
        };
        Endpoint {
            gid: self.sgid.gid,
            qpn: self.qp.qpn(),
            psn,
            mtu: self.mtu,
            buffer,
        }
    }
}

impl Prepared {
    /// Makes this connection's PD, CQs, memory regions and QP on `device`, sending from
    /// `sgid`, posts the receives and draws the first PSN: [`Prepared::local`] is what the
    /// peer needs.
    pub fn new(
        device: &Arc<Device>,
        sgid: GidEntry,
        secrets: Secrets,
        config: SessionConfig,
    ) -> Result<Prepared, SessionError> {
        let started = std::time::Instant::now();
        let resources = Resources::new(device, sgid, &config)?;
        // Drawn for this session alone, whenever its QP was made.
        Self::assemble(resources, secrets, config, started, Psn::random())
    }

    /// This connection's resources on `shared` ([`Resources::on_shared`]) with its secrets
    /// and a first PSN drawn now.
    pub fn on_shared(
        shared: &SharedQueue,
        sgid: GidEntry,
        secrets: Secrets,
        config: SessionConfig,
    ) -> Result<Prepared, SessionError> {
        let started = std::time::Instant::now();
        let resources = Resources::on_shared(shared, sgid, &config)?;
        Self::assemble(resources, secrets, config, started, Psn::random())
    }

    /// This connection's resources made ahead of time ([`Resources`], from a
    /// [`crate::warm::WarmPool`]) with its secrets and a first PSN drawn now: only the QP's
    /// moves to RTR and RTS are left. The resources must have `config`'s [`Shape`].
    pub fn from_resources(
        resources: Resources,
        secrets: Secrets,
        config: SessionConfig,
    ) -> Result<Prepared, SessionError> {
        Self::from_resources_announced(resources, Psn::random(), secrets, config)
    }

    /// [`Prepared::from_resources`] for resources whose endpoint was already announced with
    /// `psn` as its first PSN ([`Resources::endpoint`]): a client's early endpoint, sent with
    /// its hello before the TLS session's secrets were derived.
    pub fn from_resources_announced(
        resources: Resources,
        psn: Psn,
        secrets: Secrets,
        config: SessionConfig,
    ) -> Result<Prepared, SessionError> {
        if resources.shape != config.shape() {
            return Err(SessionError::ShapeMismatch);
        }
        Self::assemble(resources, secrets, config, std::time::Instant::now(), psn)
    }

    fn assemble(
        resources: Resources,
        secrets: Secrets,
        config: SessionConfig,
        started: std::time::Instant,
        psn: Psn,
    ) -> Result<Prepared, SessionError> {
        let Secrets { tokens, protection } = secrets;
        if config.protected != protection.is_some() {
            return Err(SessionError::ProtectionMismatch);
        }
        let local = resources.endpoint(psn);
        let shape = resources.shape;
        Ok(Prepared {
            resources,
            protection,
            tokens,
            local,
            config: SessionConfig {
                recv_slots: shape.recv_slots,
                send_slots: shape.send_slots,
                write_slots: shape.write_slots,
                ..config
            },
            started,
        })
    }

    /// Our endpoint, for the peer.
    pub fn local(&self) -> Endpoint {
        self.local
    }

    /// Connects our QP to the peer's `remote` (RTR, then RTS) after checking that its GID
    /// carries the TLS peer's address, and binds the memory window: nothing may land before
    /// the peer hears we are ready. The tokens are exchanged next ([`Unconfirmed::confirm`]).
    pub async fn connect(self, remote: Endpoint) -> Result<Unconfirmed, SessionError> {
        self.connect_with(remote, std::future::ready(Ok(()))).await
    }

    /// [`Prepared::connect`], awaiting `at_rtr` as soon as the QP is in RTR, before RTS and the
    /// window's bind: an end that answers second announces itself there, since a QP in RTR
    /// already takes (and acknowledges) the peer's first SEND, and its RTS then overlaps the
    /// announcement's journey. Nothing can land on the window before it is bound: the peer
    /// WRITEs only after this end's token, which follows the bind.
    pub async fn connect_with(
        self,
        remote: Endpoint,
        at_rtr: impl std::future::Future<Output = Result<(), SessionError>>,
    ) -> Result<Unconfirmed, SessionError> {
        let Prepared {
            resources,
            protection,
            tokens,
            local,
            config,
            started,
        } = self;
        let Resources {
            window,
            qp,
            send,
            mut receive,
            data_mr,
            shape,
            ..
        } = resources;
        let (slot_len, send_len, recv_len) = (shape.slot_len, shape.send_len, shape.recv_len);
        if let Some(address) = config.peer_address {
            // RoCEv2 traffic comes from the GID's address: a peer announcing another host's GID
            // would have us send to (and accept packets from) somebody else.
            if !remote.gid.carries(address) {
                return Err(SessionError::GidMismatch {
                    gid: remote.gid,
                    address,
                });
            }
        }
        let psn = local.psn;
        let qp = qp.into_rtr(RtrParams {
            remote_qpn: remote.qpn,
            remote_psn: remote.psn,
            remote_gid: remote.gid,
            path_mtu: local.mtu.min(remote.mtu),
        })?;
        at_rtr.await?;
        let mut qp = qp.into_rts(RtsParams { local_psn: psn })?;
        // What the device reports back, for audits: ibv_query_qp is a system call, which costs
        // a quarter of a millisecond of every handshake under emulation, so only when it is
        // logged ([`Session::query`] asks on demand).
        if tracing::enabled!(tracing::Level::DEBUG) {
            let queried = qp.query()?;
            tracing::debug!(
                qpn = %qp.qpn(),
                local_psn = psn.get(),
                remote_qpn = %remote.qpn,
                remote_psn = remote.psn.get(),
                sq_psn = queried.sq_psn,
                rq_psn = queried.rq_psn,
                dest_qpn = queried.dest_qpn,
                "QP in RTS"
            );
        }
        // The window is bound before the peer hears we are ready: no WRITE can come earlier.
        if let (Some(w), Some(mr)) = (&window, &data_mr) {
            qp.post_bind_window(BIND_WR, w, mr)?;
            next_sent_ok(
                qp.send_cq(),
                &mut receive,
                "the memory window's bind",
                config.timeout,
            )
            .await?;
        }
        let recv_posted = match receive {
            Receive::Own(_) => config.recv_slots,
            Receive::Shared(_) => 0,
        };
        Ok(Unconfirmed {
            session: Session {
                window,
                qp,
                send,
                receive,
                data_mr,
                remote_buffer: remote.buffer,
                peer_grants_writes: false,
                protection,
                slot_len,
                send_len,
                recv_len,
                posted: 0,
                completed: 0,
                recv_posted,
                writes_posted: 0,
                writes_landed: 0,
                config,
                wiring: Wiring { local, remote },
                timing: EstablishTiming::default(),
                started,
            },
            tokens,
        })
    }
}

/// A session whose QP is in RTS, connected to the peer's, before the confirmation tokens
/// proved the RDMA path: nothing but the tokens may go over it yet.
pub struct Unconfirmed {
    session: Session,
    tokens: Tokens,
}

impl std::fmt::Debug for Unconfirmed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unconfirmed")
            .field("qp", &self.session.qp)
            .finish()
    }
}

impl Unconfirmed {
    /// Our endpoint, for the peer.
    pub fn local(&self) -> Endpoint {
        self.session.wiring.local
    }

    /// Exchanges the confirmation tokens over the QP in the order `how` says, each bounded by
    /// the session's timeout, and checks the peer's: then the RDMA path is proven to be this
    /// TLS session's (a wrong PSN or GID drops RC packets silently; this turns that silence
    /// into [`SessionError::ConfirmTimeout`], or [`SessionError::ConfirmFailed`] when the
    /// token's SEND is never acknowledged).
    pub async fn confirm(self, how: Confirm) -> Result<Session, SessionError> {
        let Unconfirmed {
            mut session,
            tokens,
        } = self;
        let timeout = session.config.timeout;
        session.timing.setup = session.started.elapsed();
        // A token that never comes, or a SEND or receive that completes in error, is the RDMA
        // path not working: the PSN or GID mismatch the tokens are there to catch.
        let unconfirmed = |e: SessionError| match e {
            SessionError::Verbs(VerbsError::Timeout { .. }) => {
                SessionError::ConfirmTimeout(timeout)
            }
            SessionError::Verbs(e @ VerbsError::WorkCompletion { .. }) => {
                SessionError::ConfirmFailed(e)
            }
            other => other,
        };
        if how != Confirm::Second {
            session
                .send_token(&tokens.mine)
                .await
                .map_err(unconfirmed)?;
        }
        let got = match tokio::time::timeout(timeout, session.next_received()).await {
            Ok(got) => got.map_err(unconfirmed)?,
            Err(_) => return Err(SessionError::ConfirmTimeout(timeout)),
        };
        if got.opcode != WcOpcode::Recv || got.data? != tokens.peer {
            return Err(SessionError::BadToken);
        }
        if how == Confirm::Second {
            session
                .send_token(&tokens.mine)
                .await
                .map_err(unconfirmed)?;
        }
        session.timing.confirmation = session
            .started
            .elapsed()
            .saturating_sub(session.timing.setup);
        Ok(session)
    }
}

impl Session {
    /// SENDs this side's confirmation token and waits (the session's timeout) for its
    /// completion.
    async fn send_token(&mut self, token: &[u8]) -> Result<(), SessionError> {
        self.send.write(0, token)?;
        let range = self.send.absolute(0..TOKEN_LEN)?;
        self.qp.post_send(TOKEN_WR, self.send.region(), range)?;
        next_sent_ok(
            self.qp.send_cq(),
            &mut self.receive,
            "the confirmation token SEND",
            self.config.timeout,
        )
        .await?;
        Ok(())
    }
}

/// What [`Session::drain`] consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Drained {
    /// Messages that had landed and were not taken: never delivered, so the
    /// peer's resume sends them again.
    pub discarded: usize,
    /// Work requests the device flushed.
    pub flushed: usize,
    /// Whether the session's memory window was invalidated by a local invalidate before
    /// the QP stopped (`None`: the session had no window). `Some(false)`: the QP had already
    /// stopped (an attack or a lost peer), so it accepted nothing any more; the window is
    /// deallocated in every case before the drain returns.
    pub window_invalidated: Option<bool>,
}

impl Session {
    /// Ends the session so that nothing of it can land any more: the QP goes
    /// to ERROR, and every work request still posted (the receive slots, the
    /// operations in flight) is consumed as its completion, before the
    /// resources are freed. Messages that landed and were not taken through
    /// [`Session::arrival`] are discarded, never delivered. A resumed stream
    /// is answered only after its previous session is drained, so the answer
    /// is final.
    pub async fn drain(mut self, timeout: Duration) -> Result<Drained, SessionError> {
        let mut drained = Drained::default();
        let window = self.window.take();
        // First the window's rkey, while the QP still runs: invalidated, it grants nothing
        // from here on, whatever happens to the rest of the teardown.
        let mut invalidating = false;
        if let Some(w) = &window {
            invalidating = self
                .qp
                .post_local_invalidate(INVALIDATE_WR, w.rkey())
                .is_ok();
            if invalidating {
                self.posted += 1;
            }
            drained.window_invalidated = Some(false);
        }
        let outstanding_recv = self.recv_posted;
        let outstanding_send = self.in_flight();
        let qp = self.qp.into_error()?;
        // On a shared queue nothing of ours is posted to flush: the messages that landed and
        // were not taken are those routed to the inbox by now (in ERROR, nothing more comes).
        if let Receive::Shared(inbox) = &mut self.receive {
            drained.discarded += inbox
                .discard_all(timeout)
                .await
                .map_err(SessionError::SharedReceive)?;
        }
        for (n, receives, what) in [
            (outstanding_recv, true, "the receives flushed"),
            (outstanding_send, false, "the sends flushed"),
        ] {
            for _ in 0..n {
                let wc = match receives {
                    true => qp.recv_cq().next(timeout).await.map_err(Into::into),
                    false => next_sent(qp.send_cq(), &mut self.receive, what, timeout).await,
                }
                .map_err(|e| match e {
                    SessionError::Verbs(VerbsError::Timeout { after, .. }) => {
                        SessionError::Timeout(after, what)
                    }
                    other => other,
                })?;
                // A receive that completed successfully is a message that landed before the
                // QP stopped and that nobody took; everything else is a flush.
                if receives && wc.status.is_success() {
                    drained.discarded += 1;
                } else if !receives && invalidating && wc.wr_id == INVALIDATE_WR {
                    drained.window_invalidated = Some(wc.status.is_success());
                } else {
                    drained.flushed += 1;
                }
            }
        }
        // The QP holds the window too: both go when `qp` is dropped here, the window first (it
        // holds references on the QP and the region).
        drop(window);
        Ok(drained)
    }
}

/// The control channel's receivers of the steady state (step 6 of the
/// [handshake](crate::handshake), the records of [`crate::datapath`]): what an
/// established session's two ends wait for over TLS. They are methods of the
/// setup's [`Channel`], kept here with the session they belong to.
impl<S: AsyncRead + AsyncWrite + Unpin> Channel<S> {
    /// Receives the server's acknowledgement of an operation (step 6, client
    /// side). A [`Message::Bye`] here is an [`HandshakeError::Unexpected`]
    /// whose message says the server closed the connection.
    pub async fn expect_ack(&mut self) -> Result<Ack, HandshakeError> {
        match self.recv::<Message>().await? {
            Message::Ack {
                op,
                seq,
                bytes,
                status,
            } => Ok(Ack {
                op,
                seq,
                bytes,
                status,
            }),
            Message::Abort { reason } => Err(HandshakeError::Aborted(reason)),
            other => Err(unexpected(Kind::Ack, &other)),
        }
    }

    /// Receives what an established client may send (step 6, server side).
    pub async fn expect_client_request(&mut self) -> Result<ClientRequest, HandshakeError> {
        match self.recv::<Message>().await? {
            Message::Bye => Ok(ClientRequest::Bye),
            other => Err(unexpected(Kind::Bye, &other)),
        }
    }
}
