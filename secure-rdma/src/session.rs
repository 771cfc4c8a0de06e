//! An established secure RDMA session: the RDMA half of a connection whose
//! control half is a TLS [`Channel`].
//!
//! [`Session::establish`] runs steps 3–5 of the [handshake](crate::handshake):
//! it makes this connection's PD, CQs, memory regions and QP, exchanges
//! endpoints over TLS, drives the QP RESET → INIT → RTR → RTS with a fresh
//! CSPRNG PSN, and confirms the connection by exchanging TLS-derived tokens
//! as the first RDMA messages. Dropping the session frees every resource it
//! made.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};

use crate::handshake::{Channel, Endpoint, HandshakeError, Message, Op};
use crate::protect::{AuthError, Protection, SealError, HEADER_LEN, OVERHEAD};
use crate::psn::Psn;
use crate::quota::{Admission, Refusal, TenantQuota, Verb};
use crate::tls::TOKEN_LEN;
use crate::verbs::{
    Completion, CompletionQueue, Device, GidEntry, MemoryRegion, MrAccess, Poll, QpAttributes,
    QpCaps, QueuePair, RemoteBuffer, RtrParams, Rts, RtsParams, VerbsError, WcOpcode,
};

/// Errors of session setup and use.
#[derive(Debug, thiserror::Error)]
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
        sent: crate::handshake::Op,
        /// What the acknowledgement names.
        acked: crate::handshake::Op,
    },
    /// The control channel did not answer in time.
    #[error("timed out after {0:?} waiting for {1}")]
    Timeout(Duration, &'static str),
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
}

/// Sizes, timeouts and what the peer may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Largest SEND or WRITE payload, in bytes.
    pub buffer_size: usize,
    /// Receive slots kept posted.
    pub recv_slots: usize,
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
}

impl SessionConfig {
    /// Bytes of one message slot (payload, plus header and tag when
    /// protected) and receive slots, as [`Session::establish`] uses them.
    fn layout(&self) -> (usize, usize) {
        let overhead = if self.protected { OVERHEAD } else { 0 };
        (
            self.buffer_size.saturating_add(overhead).max(TOKEN_LEN),
            self.recv_slots.max(2),
        )
    }

    /// Admits, against `quota`, every control-path call [`Session::establish`]
    /// makes, before any of them reaches the kernel: one QP and its three state
    /// transitions, one PD, two CQs and three MRs with their sizes.
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
        let (bs, slots) = self.layout();
        let bytes = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        // The QP first: it is what operators limit most, and its refusal
        // reason is the one a client can act on.
        let mut held = vec![quota.admit(Verb::QpCreate)?];
        for _ in 0..3 {
            held.push(quota.admit(Verb::QpModify)?);
        }
        held.push(quota.admit(Verb::PdAlloc)?);
        for _ in 0..2 {
            held.push(quota.admit(Verb::CqCreate)?);
        }
        let data = self.accept_writes.then_some(bs);
        for size in [Some(bs), Some(bs.saturating_mul(slots)), data]
            .into_iter()
            .flatten()
        {
            held.push(quota.admit_mr(bytes(size))?);
        }
        Ok(SessionAdmission { _held: held })
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
            timeout: Duration::from_secs(5),
            protected: true,
            accept_writes: true,
            peer_address: None,
        }
    }
}

/// The two confirmation tokens of a TLS session (see
/// [`crate::tls::confirmation_token`]).
#[derive(Clone, Copy)]
pub struct Tokens {
    /// The one this side sends.
    pub mine: [u8; TOKEN_LEN],
    /// The one the peer must send.
    pub peer: [u8; TOKEN_LEN],
}

/// What only the two ends of the TLS session know: the confirmation tokens
/// and, when payloads are protected, the keys.
#[derive(Debug)]
pub struct Secrets {
    /// The tokens each side proves over RDMA first.
    pub tokens: Tokens,
    /// The payload keys ([`crate::tls::payload_protection`]); `None` sends
    /// payloads in clear, which the peer must have agreed to.
    pub protection: Option<Protection>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens(..)")
    }
}

/// What was set on the QP and what the device reports back, for audits and
/// tests (PSNs are secrets: log them at debug level only).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Wiring {
    /// Our endpoint as sent to the peer.
    pub local: Endpoint,
    /// The peer's endpoint as received.
    pub remote: Endpoint,
    /// `ibv_query_qp` right after RTS.
    pub queried: QpAttributes,
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

const TOKEN_WR: u64 = u64::MAX;
const SEND_WR: u64 = 1;
const WRITE_WR: u64 = 2;

/// One connection's RDMA resources in RTS, confirmed.
pub struct Session {
    // Field order is drop order: the QP goes first, then the regions.
    qp: QueuePair<Rts>,
    send_mr: Arc<MemoryRegion>,
    recv_mr: Arc<MemoryRegion>,
    data_mr: Option<Arc<MemoryRegion>>,
    remote_buffer: Option<RemoteBuffer>,
    protection: Option<Protection>,
    /// Reused for sealing, so a protected send allocates nothing.
    scratch: Vec<u8>,
    /// Bytes of a message slot: payload plus overhead when protected.
    slot_len: usize,
    config: SessionConfig,
    wiring: Wiring,
    timing: EstablishTiming,
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
    /// // (secure_rdma::tls::{confirmation_token, payload_protection}).
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
        let started = std::time::Instant::now();
        let Secrets { tokens, protection } = secrets;
        if config.protected != protection.is_some() {
            return Err(SessionError::ProtectionMismatch);
        }
        let (bs, slots) = config.layout();
        let pd = device.alloc_pd()?;
        let depth = u32::try_from(slots * 2).unwrap_or(u32::MAX);
        let send_cq = CompletionQueue::new(device, depth)?;
        let recv_cq = CompletionQueue::new(device, depth)?;
        let send_mr = MemoryRegion::new(&pd, bs, MrAccess::Local)?;
        let recv_mr = MemoryRegion::new(&pd, bs * slots, MrAccess::Local)?;
        // Only a side that receives RDMA WRITEs exposes memory, and only this one region:
        // registered per session (a fresh rkey) and zero-based, so no heap address leaks.
        let data_mr = match config.accept_writes {
            true => Some(MemoryRegion::new(&pd, bs, MrAccess::RemoteWrite)?),
            false => None,
        };
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: depth,
        };
        let mut qp = QueuePair::create(&pd, &send_cq, &recv_cq, sgid.clone(), caps)?
            .into_init(config.accept_writes)?;
        for slot in 0..slots {
            qp.post_recv(slot as u64, &recv_mr, slot * bs..(slot + 1) * bs)?;
        }

        let psn = Psn::random();
        let local = Endpoint {
            gid: sgid.gid,
            qpn: qp.qpn(),
            psn,
            mtu: device.active_mtu()?,
            buffer: data_mr.as_ref().map(|mr| mr.remote()),
        };
        chan.send(&Message::Endpoint { endpoint: local }).await?;
        let remote = within(
            config.timeout,
            "the peer's endpoint",
            chan.expect_endpoint(),
        )
        .await?;
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

        let qp = qp.into_rtr(RtrParams {
            remote_qpn: remote.qpn,
            remote_psn: remote.psn,
            remote_gid: remote.gid,
            path_mtu: local.mtu.min(remote.mtu),
        })?;
        let mut qp = qp.into_rts(RtsParams { local_psn: psn })?;
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

        // Both QPs in RTS before the first RDMA message.
        chan.send(&Message::Ready).await?;
        within(config.timeout, "the peer's ready", chan.expect_ready()).await?;

        let setup = started.elapsed();
        send_mr.write(0, &tokens.mine)?;
        qp.post_send(TOKEN_WR, &send_mr, 0..TOKEN_LEN)?;
        let confirm = async {
            qp.send_cq()
                .next_ok("the confirmation token SEND", config.timeout)
                .await?;
            let wc = qp
                .recv_cq()
                .next_ok("the peer's confirmation token", config.timeout)
                .await?;
            Ok::<Completion, VerbsError>(wc)
        };
        let wc = match confirm.await {
            Ok(wc) => wc,
            Err(VerbsError::Timeout { .. }) | Err(VerbsError::WorkCompletion { .. }) => {
                return Err(SessionError::ConfirmTimeout(config.timeout))
            }
            Err(e) => return Err(e.into()),
        };
        let slot = wc.wr_id as usize;
        let got = recv_mr.read(slot * bs, wc.byte_len as usize)?;
        if wc.opcode != WcOpcode::Recv || got != tokens.peer {
            return Err(SessionError::BadToken);
        }
        qp.post_recv(slot as u64, &recv_mr, slot * bs..(slot + 1) * bs)?;
        chan.send(&Message::Confirmed).await?;
        within(
            config.timeout,
            "the peer's confirmation",
            chan.expect_confirmed(),
        )
        .await?;

        Ok(Session {
            qp,
            send_mr,
            recv_mr,
            data_mr,
            remote_buffer: remote.buffer,
            protection,
            scratch: Vec::with_capacity(bs),
            slot_len: bs,
            config: SessionConfig {
                recv_slots: slots,
                ..config
            },
            wiring: Wiring {
                local,
                remote,
                queried,
            },
            timing: EstablishTiming {
                setup,
                confirmation: started.elapsed().saturating_sub(setup),
            },
        })
    }

    /// How long setting up and confirming this session took.
    pub fn timing(&self) -> EstablishTiming {
        self.timing
    }

    /// Chooses how this session waits for its completions (both CQs): event-driven (the
    /// default) or busy polling, which takes a core for the lowest latency.
    pub fn set_poll(&self, poll: Poll) {
        self.qp.send_cq().set_poll(poll);
        self.qp.recv_cq().set_poll(poll);
    }

    /// What was exchanged and read back while connecting.
    pub fn wiring(&self) -> &Wiring {
        &self.wiring
    }

    /// The cipher protecting payloads, `None` when they travel in clear.
    pub fn cipher(&self) -> Option<crate::protect::Cipher> {
        self.protection.as_ref().map(|p| p.sealer.cipher())
    }

    /// Largest SEND payload, in bytes.
    pub fn max_len(&self) -> usize {
        self.config.buffer_size
    }

    /// Largest WRITE payload, in bytes: the smaller of ours and what the
    /// peer's buffer holds (0 when the peer accepts no writes).
    pub fn max_write_len(&self) -> usize {
        let overhead = self.slot_len - self.config.buffer_size.min(self.slot_len);
        let remote = self.remote_buffer.map_or(0, |b| {
            usize::try_from(b.len)
                .unwrap_or(usize::MAX)
                .saturating_sub(overhead)
        });
        self.config.buffer_size.min(remote)
    }

    /// Puts `data` into the send region as it goes on the wire (sealed when
    /// protected); returns the wire length.
    fn stage(&mut self, op: Op, data: &[u8], max: usize) -> Result<usize, SessionError> {
        if data.len() > max {
            return Err(SessionError::TooLarge {
                len: data.len(),
                max,
            });
        }
        match &mut self.protection {
            None => {
                self.send_mr.write(0, data)?;
                Ok(data.len())
            }
            Some(p) => {
                self.scratch.resize(data.len() + OVERHEAD, 0);
                let n = p.sealer.seal(op, data, &mut self.scratch)?;
                self.send_mr.write(0, &self.scratch[..n])?;
                Ok(n)
            }
        }
    }

    /// RDMA SENDs `data` to the peer and waits for its completion.
    pub async fn send(&mut self, data: &[u8]) -> Result<(), SessionError> {
        let n = self.stage(Op::Send, data, self.max_len())?;
        self.qp.post_send(SEND_WR, &self.send_mr, 0..n)?;
        self.qp
            .send_cq()
            .next_ok("the SEND to complete", self.config.timeout)
            .await?;
        Ok(())
    }

    /// RDMA WRITEs `data` into the peer's buffer at offset 0 with its wire
    /// length as the immediate, so the peer learns the write landed and its
    /// size.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), SessionError> {
        let remote = self.remote_buffer.ok_or(SessionError::NoRemoteBuffer)?;
        let n = self.stage(Op::Write, data, self.max_write_len())?;
        let len = u32::try_from(n).map_err(|_| SessionError::TooLarge {
            len: data.len(),
            max: self.max_write_len(),
        })?;
        self.qp
            .post_write_imm(WRITE_WR, &self.send_mr, 0..n, &remote, 0, len)?;
        self.qp
            .send_cq()
            .next_ok("the RDMA WRITE to complete", self.config.timeout)
            .await?;
        Ok(())
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
        let wc = self.qp.recv_cq().next_ok_unbounded().await?;
        let bs = self.slot_len;
        let slot = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
        if slot >= self.config.recv_slots {
            return Err(VerbsError::UnknownReceive(wc.wr_id).into());
        }
        let (op, raw) = match wc.opcode {
            WcOpcode::Recv => (Op::Send, self.recv_mr.read(slot * bs, wc.byte_len as usize)),
            WcOpcode::RecvRdmaWithImm => {
                let len = wc.imm_data.unwrap_or(0) as usize;
                match &self.data_mr {
                    Some(mr) => (Op::Write, mr.read(0, len)),
                    // We registered nothing for writes and gave the QP no remote write access:
                    // the device should have refused this.
                    None => return Err(VerbsError::UnexpectedCompletion(wc.opcode).into()),
                }
            }
            other => return Err(VerbsError::UnexpectedCompletion(other).into()),
        };
        // The slot is free again whatever the verdict: its bytes were copied out.
        self.qp
            .post_recv(slot as u64, &self.recv_mr, slot * bs..(slot + 1) * bs)?;
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
