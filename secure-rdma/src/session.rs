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

use crate::handshake::{Channel, Endpoint, HandshakeError, Message};
use crate::psn::Psn;
use crate::quota::{Admission, Refusal, TenantQuota, Verb};
use crate::tls::TOKEN_LEN;
use crate::verbs::{
    Completion, CompletionQueue, Device, GidEntry, MemoryRegion, MrAccess, QpAttributes, QpCaps,
    QueuePair, RemoteBuffer, RtrParams, Rts, RtsParams, VerbsError, WcOpcode,
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
}

/// Sizes and timeouts of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionConfig {
    /// Largest SEND or WRITE, in bytes (also the receive slot size).
    pub buffer_size: usize,
    /// Receive slots kept posted.
    pub recv_slots: usize,
    /// Timeout of each step (completions, control replies, confirmation).
    pub timeout: Duration,
}

impl SessionConfig {
    /// Buffer size and receive slots as [`Session::establish`] uses them.
    fn layout(&self) -> (usize, usize) {
        (self.buffer_size.max(TOKEN_LEN), self.recv_slots.max(2))
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
        for size in [bs, bs.saturating_mul(slots), bs] {
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
    data_mr: Arc<MemoryRegion>,
    remote_buffer: RemoteBuffer,
    config: SessionConfig,
    wiring: Wiring,
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
    /// steps); `tokens` come from the TLS session
    /// ([`crate::tls::confirmation_token`]).
    ///
    /// ```no_run
    /// use secure_rdma::handshake::Channel;
    /// use secure_rdma::session::{Session, SessionConfig, Tokens};
    /// use secure_rdma::verbs::Device;
    ///
    /// # async fn demo(tls: tokio::net::TcpStream, tokens: Tokens) -> Result<(), Box<dyn std::error::Error>> {
    /// let (device, sgid) = Device::open_for_address("10.77.0.1".parse()?)?;
    /// let mut chan = Channel::new(tls);
    /// let mut session =
    ///     Session::establish(&mut chan, &device, sgid, tokens, SessionConfig::default()).await?;
    /// session.send(b"first message").await?;
    /// # Ok(()) }
    /// ```
    pub async fn establish<S: AsyncRead + AsyncWrite + Unpin>(
        chan: &mut Channel<S>,
        device: &Arc<Device>,
        sgid: GidEntry,
        tokens: Tokens,
        config: SessionConfig,
    ) -> Result<Session, SessionError> {
        let (bs, slots) = config.layout();
        let pd = device.alloc_pd()?;
        let depth = u32::try_from(slots * 2).unwrap_or(u32::MAX);
        let send_cq = CompletionQueue::new(device, depth)?;
        let recv_cq = CompletionQueue::new(device, depth)?;
        let send_mr = MemoryRegion::new(&pd, bs, MrAccess::Local)?;
        let recv_mr = MemoryRegion::new(&pd, bs * slots, MrAccess::Local)?;
        let data_mr = MemoryRegion::new(&pd, bs, MrAccess::RemoteWrite)?;
        let caps = QpCaps {
            max_send_wr: 16,
            max_recv_wr: depth,
        };
        let mut qp =
            QueuePair::create(&pd, &send_cq, &recv_cq, sgid.clone(), caps)?.into_init(true)?;
        for slot in 0..slots {
            qp.post_recv(slot as u64, &recv_mr, slot * bs..(slot + 1) * bs)?;
        }

        let psn = Psn::random();
        let local = Endpoint {
            gid: sgid.gid,
            qpn: qp.qpn(),
            psn,
            mtu: device.active_mtu()?,
            buffer: data_mr.remote(),
        };
        chan.send(&Message::Endpoint { endpoint: local }).await?;
        let remote = within(
            config.timeout,
            "the peer's endpoint",
            chan.expect_endpoint(),
        )
        .await?;

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
            config: SessionConfig {
                buffer_size: bs,
                recv_slots: slots,
                ..config
            },
            wiring: Wiring {
                local,
                remote,
                queried,
            },
        })
    }

    /// What was exchanged and read back while connecting.
    pub fn wiring(&self) -> &Wiring {
        &self.wiring
    }

    /// Largest SEND or WRITE, in bytes (the smaller of both sides' buffers
    /// for writes).
    pub fn max_len(&self) -> usize {
        self.config
            .buffer_size
            .min(usize::try_from(self.remote_buffer.len).unwrap_or(usize::MAX))
    }

    fn stage(&self, data: &[u8]) -> Result<(), SessionError> {
        if data.len() > self.max_len() {
            return Err(SessionError::TooLarge {
                len: data.len(),
                max: self.max_len(),
            });
        }
        self.send_mr.write(0, data)?;
        Ok(())
    }

    /// RDMA SENDs `data` to the peer and waits for its completion.
    pub async fn send(&mut self, data: &[u8]) -> Result<(), SessionError> {
        self.stage(data)?;
        self.qp.post_send(SEND_WR, &self.send_mr, 0..data.len())?;
        self.qp
            .send_cq()
            .next_ok("the SEND to complete", self.config.timeout)
            .await?;
        Ok(())
    }

    /// RDMA WRITEs `data` into the peer's buffer at offset 0 with its length
    /// as the immediate, so the peer learns the write landed and its size.
    pub async fn write(&mut self, data: &[u8]) -> Result<(), SessionError> {
        self.stage(data)?;
        let len = u32::try_from(data.len()).map_err(|_| SessionError::TooLarge {
            len: data.len(),
            max: self.max_len(),
        })?;
        let remote = self.remote_buffer;
        self.qp
            .post_write_imm(WRITE_WR, &self.send_mr, 0..data.len(), &remote, 0, len)?;
        self.qp
            .send_cq()
            .next_ok("the RDMA WRITE to complete", self.config.timeout)
            .await?;
        Ok(())
    }

    /// Waits (without timeout: the caller selects on it) for the next SEND or
    /// WRITE the peer makes land, and re-posts its receive slot.
    pub async fn arrival(&mut self) -> Result<Arrival, SessionError> {
        let wc = self.qp.recv_cq().next_ok_unbounded().await?;
        let bs = self.config.buffer_size;
        let slot = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
        if slot >= self.config.recv_slots {
            return Err(VerbsError::UnknownReceive(wc.wr_id).into());
        }
        let arrival = match wc.opcode {
            WcOpcode::Recv => Arrival::Send(self.recv_mr.read(slot * bs, wc.byte_len as usize)?),
            WcOpcode::RecvRdmaWithImm => {
                let len = wc.imm_data.unwrap_or(0) as usize;
                Arrival::Write(self.data_mr.read(0, len)?)
            }
            other => return Err(VerbsError::UnexpectedCompletion(other).into()),
        };
        self.qp
            .post_recv(slot as u64, &self.recv_mr, slot * bs..(slot + 1) * bs)?;
        Ok(arrival)
    }
}
