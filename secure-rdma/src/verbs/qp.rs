//! The RC queue pair as a typestate: `Reset -> Init -> Rtr -> Rts`.
//!
//! Each transition consumes the queue pair and returns it in the next state,
//! taking exactly what that transition needs: INIT the access rights, RTR
//! the peer's QPN, PSN and GID and the path MTU, RTS our own PSN. Receives
//! may be posted from INIT on (so they are ready before the peer can send);
//! sends, writes and writes with immediate compile only in RTS.
//!
//! If a transition fails the queue pair is destroyed and the error names the
//! states and the device's reason; a half-configured RC QP is of no use.

use std::marker::PhantomData;
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use super::cq::CompletionQueue;
use super::device::{PathMtu, ProtectionDomain, PORT};
use super::gid::{Gid, GidEntry};
use super::mr::{MemoryRegion, RemoteBuffer};
use super::mw::MemoryWindow;
use super::srq::SharedReceiveQueue;
use super::VerbsError;
use crate::psn::{Psn, Qpn};
use rdma_mummy_sys::{
    bind_mw_t, ibv_access_flags, ibv_create_qp, ibv_destroy_qp, ibv_gid, ibv_modify_qp,
    ibv_mw_bind_info, ibv_post_recv, ibv_post_send, ibv_qp, ibv_qp_attr, ibv_qp_attr_mask,
    ibv_qp_cap, ibv_qp_init_attr, ibv_qp_state, ibv_qp_type, ibv_query_qp, ibv_recv_wr,
    ibv_send_flags, ibv_send_wr, ibv_sge, ibv_wr_opcode, rdma_t,
};

mod sealed {
    pub trait Sealed {}
}

/// A queue pair state marker.
pub trait QpState: sealed::Sealed {
    /// Name as in the IBA spec.
    const NAME: &'static str;
}

/// Receives may be posted in this state.
pub trait CanRecv: QpState {}

macro_rules! state {
    ($(#[$doc:meta])* $name:ident, $text:literal) => {
        $(#[$doc])*
        #[derive(Debug)]
        pub enum $name {}
        impl sealed::Sealed for $name {}
        impl QpState for $name {
            const NAME: &'static str = $text;
        }
    };
}

state!(
    /// Just created: nothing configured.
    Reset,
    "RESET"
);
state!(
    /// Port, P_Key and access rights set; receives may be posted.
    Init,
    "INIT"
);
state!(
    /// Ready to receive: bound to the peer's QPN, PSN and GID.
    Rtr,
    "RTR"
);
state!(
    /// Ready to send.
    Rts,
    "RTS"
);
state!(
    /// Out of service: every posted work request is flushed (completed with a flush error),
    /// nothing is sent or received any more. Where a session ends so that nothing of it can
    /// land afterwards.
    Error,
    "ERROR"
);
impl CanRecv for Init {}
impl CanRecv for Rtr {}
impl CanRecv for Rts {}

/// Queue sizes of a new queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Outstanding send work requests.
    pub max_send_wr: u32,
    /// Outstanding receive work requests.
    pub max_recv_wr: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
        }
    }
}

/// Parameters of the RTR transition: who the peer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrParams {
    /// The peer's queue pair number.
    pub remote_qpn: Qpn,
    /// The first PSN the peer will send (our receive PSN).
    pub remote_psn: Psn,
    /// The peer's GID.
    pub remote_gid: Gid,
    /// Path MTU: the smaller of both ports' active MTUs.
    pub path_mtu: PathMtu,
}

impl RtrParams {
    /// Validates raw values as received from a peer.
    ///
    /// ```
    /// use secure_rdma::verbs::{PathMtu, RtrParams};
    /// let gid = "::ffff:10.77.0.2".parse().unwrap();
    /// assert!(RtrParams::new(0x11, 0xabcdef, gid, PathMtu::Mtu1024).is_ok());
    /// assert!(RtrParams::new(1 << 24, 0, gid, PathMtu::Mtu1024).is_err());
    /// assert!(RtrParams::new(0x11, 1 << 24, gid, PathMtu::Mtu1024).is_err());
    /// ```
    pub fn new(
        remote_qpn: u32,
        remote_psn: u32,
        remote_gid: Gid,
        path_mtu: PathMtu,
    ) -> Result<Self, VerbsError> {
        let remote_qpn = Qpn::new(remote_qpn)?;
        if remote_qpn.get() < 2 {
            // QP0 and QP1 are the management QPs, never an RC peer.
            return Err(VerbsError::ReservedQpn(remote_qpn));
        }
        if remote_gid.is_zero() {
            return Err(VerbsError::ZeroGid);
        }
        Ok(RtrParams {
            remote_qpn,
            remote_psn: Psn::new(remote_psn)?,
            remote_gid,
            path_mtu,
        })
    }
}

/// Parameters of the RTS transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsParams {
    /// Our first send PSN: the value we announced to the peer.
    pub local_psn: Psn,
}

impl RtsParams {
    /// Validates a raw PSN.
    ///
    /// ```
    /// use secure_rdma::verbs::RtsParams;
    /// assert!(RtsParams::new(0xffffff).is_ok());
    /// assert!(RtsParams::new(0x1000000).is_err());
    /// ```
    pub fn new(local_psn: u32) -> Result<Self, VerbsError> {
        Ok(RtsParams {
            local_psn: Psn::new(local_psn)?,
        })
    }
}

/// What `ibv_query_qp` reports about a connected queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QpAttributes {
    /// Current state name ("RTS", "ERR", …).
    pub state: &'static str,
    /// Next send PSN.
    pub sq_psn: u32,
    /// Next expected receive PSN.
    pub rq_psn: u32,
    /// The peer's QPN.
    pub dest_qpn: u32,
}

/// One `ibv_create_qp` queue pair, destroyed on drop.
///
/// Made with the plain verbs rather than sideway's builder, which always passes `srq: NULL`:
/// a queue pair that takes its receives from a [`SharedReceiveQueue`] must name it when it is
/// created.
struct RawQp(NonNull<ibv_qp>);

// SAFETY: libibverbs verbs on one QP are thread-safe; `QueuePair` takes `&mut self` to post.
unsafe impl Send for RawQp {}
// SAFETY: as above; `&self` methods only query.
unsafe impl Sync for RawQp {}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: created in `QueuePair::create_with`, destroyed once, here.
        super::warn_if_not_destroyed(unsafe { ibv_destroy_qp(self.0.as_ptr()) }, "ibv_destroy_qp");
    }
}

/// An RC queue pair in state `S`.
pub struct QueuePair<S: QpState> {
    // Field order is drop order: deallocate the windows bound on the QP first (rxe holds a
    // reference on the QP for each bound window, and destroying the QP before them waits for
    // it: 50 s on Linux 6.1, see the README's memory windows), then destroy the QP before
    // releasing the regions it may still reference, the CQs it reports to and the shared
    // receive queue it takes its receives from.
    windows: Vec<Arc<MemoryWindow>>,
    qp: RawQp,
    pinned: Vec<Arc<MemoryRegion>>,
    /// What the caller asked to keep until the QP is destroyed ([`QueuePair::retain`]).
    retained: Vec<Arc<dyn std::any::Any + Send + Sync>>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    srq: Option<Arc<SharedReceiveQueue>>,
    pd: Arc<ProtectionDomain>,
    sgid: GidEntry,
    qpn: Qpn,
    _state: PhantomData<S>,
}

impl<S: QpState> std::fmt::Debug for QueuePair<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &self.qpn)
            .field("state", &S::NAME)
            .field("device", &self.pd.device().name())
            .finish()
    }
}

impl QueuePair<Reset> {
    /// Creates an RC queue pair that sends from GID `sgid`, with its own receive queue.
    pub fn create(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        sgid: GidEntry,
        caps: QpCaps,
    ) -> Result<Self, VerbsError> {
        Self::create_with(pd, send_cq, recv_cq, None, sgid, caps)
    }

    /// Creates an RC queue pair that takes its receives from `srq`: it has no receive queue of
    /// its own (`caps.max_recv_wr` is ignored, and [`QueuePair::post_recv`] is refused), and
    /// every SEND or WRITE WITH IMMEDIATE that arrives on it consumes one of the receives
    /// posted to `srq`, completing on `recv_cq` with this QP's number
    /// ([`Completion::qp_num`](super::Completion::qp_num)). `srq` must belong to `pd`
    /// ([`VerbsError::ForeignSharedQueue`] otherwise).
    ///
    /// ```no_run
    /// # async fn f(pd: std::sync::Arc<secure_rdma::verbs::ProtectionDomain>,
    /// #            gid: secure_rdma::verbs::GidEntry) -> Result<(), secure_rdma::verbs::VerbsError> {
    /// use secure_rdma::verbs::{CompletionQueue, QpCaps, QueuePair, SharedReceiveQueue};
    /// let cq = CompletionQueue::new(pd.device(), 256)?; // one CQ for every QP below
    /// let srq = SharedReceiveQueue::new(&pd, 128)?; // 128 receives shared by all
    /// let qps = (0..4)
    ///     .map(|_| QueuePair::create_on_srq(&pd, &cq, &cq, &srq, gid.clone(), QpCaps::default()))
    ///     .collect::<Result<Vec<_>, _>>()?;
    /// # Ok(()) }
    /// ```
    pub fn create_on_srq(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: &Arc<SharedReceiveQueue>,
        sgid: GidEntry,
        caps: QpCaps,
    ) -> Result<Self, VerbsError> {
        if !Arc::ptr_eq(srq.pd(), pd) {
            return Err(VerbsError::ForeignSharedQueue);
        }
        Self::create_with(pd, send_cq, recv_cq, Some(srq), sgid, caps)
    }

    fn create_with(
        pd: &Arc<ProtectionDomain>,
        send_cq: &Arc<CompletionQueue>,
        recv_cq: &Arc<CompletionQueue>,
        srq: Option<&Arc<SharedReceiveQueue>>,
        sgid: GidEntry,
        caps: QpCaps,
    ) -> Result<Self, VerbsError> {
        let mut init = ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            // The CQs, the PD and the SRQ stay valid while the QP keeps their owners, which it
            // does for its whole life (field order).
            send_cq: send_cq.raw(),
            recv_cq: recv_cq.raw(),
            srq: srq.map_or(std::ptr::null_mut(), |s| s.raw()),
            cap: ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                // With a shared receive queue the QP has none of its own.
                max_recv_wr: if srq.is_some() { 0 } else { caps.max_recv_wr },
                max_send_sge: 1,
                max_recv_sge: if srq.is_some() { 0 } else { 1 },
                max_inline_data: 0,
            },
            qp_type: ibv_qp_type::IBV_QPT_RC,
            // Each work request says whether it is signalled (all of ours are).
            sq_sig_all: 0,
        };
        // SAFETY: `init` is complete; the PD is valid while `pd` lives.
        let raw = unsafe { ibv_create_qp(pd.pd.pd().as_ptr(), &mut init) };
        let raw = VerbsError::created(raw, "ibv_create_qp", pd.device().name())?;
        let qp = RawQp(raw);
        // SAFETY: `raw` is the QP just created.
        let qpn = Qpn::new(unsafe { raw.as_ref() }.qp_num)?;
        Ok(QueuePair {
            windows: Vec::new(),
            qp,
            pinned: Vec::new(),
            retained: Vec::new(),
            send_cq: Arc::clone(send_cq),
            recv_cq: Arc::clone(recv_cq),
            srq: srq.cloned(),
            pd: Arc::clone(pd),
            sgid,
            qpn,
            _state: PhantomData,
        })
    }

    /// RESET → INIT. `remote_write` lets the peer RDMA WRITE into regions
    /// registered for it.
    pub fn into_init(mut self, remote_write: bool) -> Result<QueuePair<Init>, VerbsError> {
        let mut access = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        if remote_write {
            access |= ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        }
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
        attr.pkey_index = 0;
        attr.port_num = PORT;
        attr.qp_access_flags = access;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS;
        self.modify(&mut attr, mask, Init::NAME)?;
        Ok(self.into_state())
    }
}

impl QueuePair<Init> {
    /// INIT → RTR: binds the queue pair to its peer.
    pub fn into_rtr(mut self, p: RtrParams) -> Result<QueuePair<Rtr>, VerbsError> {
        let sgid_index = u8::try_from(self.sgid.index)
            .map_err(|_| VerbsError::GidIndexTooLarge(self.sgid.index))?;
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
        attr.path_mtu = p.path_mtu.to_raw();
        attr.dest_qp_num = p.remote_qpn.get();
        attr.rq_psn = p.remote_psn.get();
        attr.max_dest_rd_atomic = 1;
        attr.min_rnr_timer = 12;
        // RoCE: no LID, the peer is named by its GID in a global route header.
        attr.ah_attr.is_global = 1;
        attr.ah_attr.port_num = PORT;
        attr.ah_attr.grh.dgid = ibv_gid {
            raw: p.remote_gid.0,
        };
        attr.ah_attr.grh.sgid_index = sgid_index;
        attr.ah_attr.grh.hop_limit = 64;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_AV
            | ibv_qp_attr_mask::IBV_QP_PATH_MTU
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_MAX_DEST_RD_ATOMIC
            | ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER;
        self.modify(&mut attr, mask, Rtr::NAME)?;
        Ok(self.into_state())
    }
}

impl QueuePair<Rtr> {
    /// RTR → RTS with our first send PSN.
    pub fn into_rts(mut self, p: RtsParams) -> Result<QueuePair<Rts>, VerbsError> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
        attr.sq_psn = p.local_psn.get();
        // 4.096 µs * 2^14 ≈ 67 ms per try, 7 tries: a lost peer is noticed
        // in about half a second instead of never.
        attr.timeout = 14;
        attr.retry_cnt = 7;
        attr.rnr_retry = 7;
        attr.max_rd_atomic = 1;
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_TIMEOUT
            | ibv_qp_attr_mask::IBV_QP_RETRY_CNT
            | ibv_qp_attr_mask::IBV_QP_RNR_RETRY
            | ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC;
        self.modify(&mut attr, mask, Rts::NAME)?;
        Ok(self.into_state())
    }
}

/// Posts one receive of one scatter entry with `post` (`ibv_post_recv` or `ibv_post_srq_recv`,
/// which copy the request before returning) and returns its code.
pub(super) fn one_receive(
    wr_id: u64,
    mut sge: ibv_sge,
    post: impl FnOnce(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> std::os::raw::c_int,
) -> std::os::raw::c_int {
    let mut wr = ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: 1,
    };
    let mut bad = std::ptr::null_mut();
    post(&mut wr, &mut bad)
}

/// An all-zero attribute set: every field a plain integer or address, zero where unset.
fn zeroed_attr() -> ibv_qp_attr {
    // SAFETY: ibv_qp_attr is plain old data; all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}

impl<S: QpState> QueuePair<S> {
    /// Any state → ERROR: the device stops the queue pair and flushes every work request still
    /// posted, each as a completion with a flush error, so its owner can consume them and know
    /// nothing more will land.
    pub fn into_error(mut self) -> Result<QueuePair<Error>, VerbsError> {
        let mut attr = zeroed_attr();
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut attr, ibv_qp_attr_mask::IBV_QP_STATE, Error::NAME)?;
        Ok(self.into_state())
    }

    /// The queue pair number.
    pub fn qpn(&self) -> Qpn {
        self.qpn
    }

    /// The GID this queue pair sends from.
    pub fn sgid(&self) -> &GidEntry {
        &self.sgid
    }

    /// The protection domain the QP was made on: a region or window bound to it must be too.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The CQ that reports sends and writes.
    pub fn send_cq(&self) -> &Arc<CompletionQueue> {
        &self.send_cq
    }

    /// The CQ that reports receives.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue> {
        &self.recv_cq
    }

    /// The shared receive queue this queue pair takes its receives from, if any.
    pub fn srq(&self) -> Option<&Arc<SharedReceiveQueue>> {
        self.srq.as_ref()
    }

    /// Reads state, PSNs and peer QPN back from the device.
    pub fn query(&self) -> Result<QpAttributes, VerbsError> {
        let mask = ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_SQ_PSN
            | ibv_qp_attr_mask::IBV_QP_RQ_PSN
            | ibv_qp_attr_mask::IBV_QP_DEST_QPN;
        let mut attr = zeroed_attr();
        // SAFETY: plain old data, filled in by the call.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the QP is valid while `self` lives; both structs are ours to fill.
        let rc = unsafe { ibv_query_qp(self.qp.0.as_ptr(), &mut attr, mask.0 as i32, &mut init) };
        VerbsError::check(rc, "ibv_query_qp", self.pd.device().name())?;
        Ok(QpAttributes {
            state: state_name(attr.qp_state),
            sq_psn: attr.sq_psn,
            rq_psn: attr.rq_psn,
            dest_qpn: attr.dest_qp_num,
        })
    }

    fn modify(
        &mut self,
        attr: &mut ibv_qp_attr,
        mask: ibv_qp_attr_mask,
        to: &'static str,
    ) -> Result<(), VerbsError> {
        // SAFETY: the QP is valid while `self` lives; `attr` holds every field `mask` names.
        let rc = unsafe { ibv_modify_qp(self.qp.0.as_ptr(), attr, mask.0 as i32) };
        if rc == 0 {
            return Ok(());
        }
        Err(VerbsError::Transition {
            device: self.pd.device().name().to_owned(),
            qpn: self.qpn,
            from: S::NAME,
            to,
            source: std::io::Error::from_raw_os_error(rc).into(),
        })
    }

    fn into_state<T: QpState>(self) -> QueuePair<T> {
        QueuePair {
            windows: self.windows,
            qp: self.qp,
            pinned: self.pinned,
            retained: self.retained,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            srq: self.srq,
            pd: self.pd,
            sgid: self.sgid,
            qpn: self.qpn,
            _state: PhantomData,
        }
    }

    /// Keeps `what` until this queue pair is destroyed: memory its work requests may read
    /// or write (a [`crate::slots::Slots`] lease) must not be reused before.
    pub fn retain(&mut self, what: Arc<dyn std::any::Any + Send + Sync>) {
        self.retained.push(what);
    }

    /// Keeps `mr` alive as long as this queue pair: a posted work request
    /// may reference it until the QP is destroyed.
    fn pin(&mut self, mr: &Arc<MemoryRegion>, range: &Range<usize>) -> Result<(), VerbsError> {
        if !Arc::ptr_eq(mr.pd(), &self.pd) {
            return Err(VerbsError::ForeignRegion);
        }
        mr.check(range)?;
        u32::try_from(range.len()).map_err(|_| VerbsError::WorkRequestTooLarge(range.len()))?;
        if !self.pinned.iter().any(|p| Arc::ptr_eq(p, mr)) {
            self.pinned.push(Arc::clone(mr));
        }
        Ok(())
    }
}

fn state_name(s: ibv_qp_state::Type) -> &'static str {
    match s {
        ibv_qp_state::IBV_QPS_RESET => "RESET",
        ibv_qp_state::IBV_QPS_INIT => "INIT",
        ibv_qp_state::IBV_QPS_RTR => "RTR",
        ibv_qp_state::IBV_QPS_RTS => "RTS",
        ibv_qp_state::IBV_QPS_SQD => "SQD",
        ibv_qp_state::IBV_QPS_SQE => "SQE",
        ibv_qp_state::IBV_QPS_ERR => "ERR",
        _ => "UNKNOWN",
    }
}

impl<S: CanRecv> QueuePair<S> {
    /// Posts a receive for `range` of `mr`; an incoming SEND lands there, an
    /// incoming WRITE WITH IMMEDIATE consumes it to deliver its immediate.
    pub fn post_recv(
        &mut self,
        wr_id: u64,
        mr: &Arc<MemoryRegion>,
        range: Range<usize>,
    ) -> Result<(), VerbsError> {
        if self.srq.is_some() {
            return Err(VerbsError::ReceiveOnSharedQueue(self.qpn));
        }
        self.pin(mr, &range)?;
        let qp = self.qp.0.as_ptr();
        // SAFETY: the QP is valid while `self` lives; the range was checked against the
        // region, which the QP keeps alive (pinned).
        let rc = one_receive(wr_id, mr.sge(&range), |wr, bad| unsafe {
            ibv_post_recv(qp, wr, bad)
        });
        VerbsError::check(rc, "ibv_post_recv", self.pd.device().name())
    }
}

/// The operation of a send-queue work request.
enum SendOp {
    Send,
    Write(u32, u64),
    WriteImm(u32, u64, u32),
}

impl QueuePair<Rts> {
    /// Posts a SEND of `range` of `mr` (signalled).
    pub fn post_send(
        &mut self,
        wr_id: u64,
        mr: &Arc<MemoryRegion>,
        range: Range<usize>,
    ) -> Result<(), VerbsError> {
        self.post(wr_id, mr, range, SendOp::Send)
    }

    /// Posts an RDMA WRITE of `range` of `mr` to `remote` at `offset`.
    pub fn post_write(
        &mut self,
        wr_id: u64,
        mr: &Arc<MemoryRegion>,
        range: Range<usize>,
        remote: &RemoteBuffer,
        offset: u64,
    ) -> Result<(), VerbsError> {
        let addr = remote.at(offset, range.len() as u64)?;
        self.post(wr_id, mr, range, SendOp::Write(remote.rkey, addr))
    }

    /// Posts an RDMA WRITE WITH IMMEDIATE: the data lands like a WRITE, then
    /// `imm` is delivered to one of the peer's posted receives, telling it
    /// the write has landed.
    pub fn post_write_imm(
        &mut self,
        wr_id: u64,
        mr: &Arc<MemoryRegion>,
        range: Range<usize>,
        remote: &RemoteBuffer,
        offset: u64,
        imm: u32,
    ) -> Result<(), VerbsError> {
        let addr = remote.at(offset, range.len() as u64)?;
        self.post(wr_id, mr, range, SendOp::WriteImm(remote.rkey, addr, imm))
    }

    /// Binds the type 2 window `mw` over all of `mr` with remote write access (a signaled
    /// `IBV_WR_BIND_MW`): once it completes, the window's [`rkey`](MemoryWindow::rkey) lets
    /// the peer of this QP, and no other QP, write into `mr`. The QP keeps `mw` and deallocates
    /// it, at the latest, just before the QP is destroyed.
    pub fn post_bind_window(
        &mut self,
        wr_id: u64,
        mw: &Arc<MemoryWindow>,
        mr: &Arc<MemoryRegion>,
    ) -> Result<(), VerbsError> {
        self.post_bind_window_over(wr_id, mw, mr, 0..mr.len())
    }

    /// Binds `mw` over `range` of `mr` only, as [`QueuePair::post_bind_window`] binds it over
    /// all of it: the peer is given [`MemoryWindow::remote_over`] with the same range.
    ///
    /// Whether the device then refuses a WRITE through the window outside `range` but inside
    /// `mr` is the device's: Linux 6.1's rxe does not (its responder checks the address
    /// against the region the window is bound to, not the window), so a range of a region is
    /// no boundary between two peers there (see the README's shared slots).
    pub fn post_bind_window_over(
        &mut self,
        wr_id: u64,
        mw: &Arc<MemoryWindow>,
        mr: &Arc<MemoryRegion>,
        range: Range<usize>,
    ) -> Result<(), VerbsError> {
        if !Arc::ptr_eq(mr.pd(), &self.pd) || !Arc::ptr_eq(mw.pd(), &self.pd) {
            return Err(VerbsError::ForeignRegion);
        }
        mr.check(&range)?;
        if !self.pinned.iter().any(|p| Arc::ptr_eq(p, mr)) {
            self.pinned.push(Arc::clone(mr));
        }
        if !self.windows.iter().any(|w| Arc::ptr_eq(w, mw)) {
            self.windows.push(Arc::clone(mw));
        }
        // SAFETY: all-zero is a valid ibv_send_wr (null pointers, no SGEs).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = ibv_wr_opcode::IBV_WR_BIND_MW;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.bind_mw_tso_union.bind_mw = bind_mw_t {
            mw: mw.raw(),
            rkey: mw.rkey(),
            bind_info: ibv_mw_bind_info {
                mr: mr.raw(),
                addr: mr.addr() + range.start as u64,
                length: range.len() as u64,
                mw_access_flags: ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0,
            },
        };
        self.post_raw(&mut wr)
    }

    /// Invalidates `rkey` (a signaled `IBV_WR_LOCAL_INV`): from its completion on, the device
    /// refuses every access with it.
    pub fn post_local_invalidate(&mut self, wr_id: u64, rkey: u32) -> Result<(), VerbsError> {
        // SAFETY: as above.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = ibv_wr_opcode::IBV_WR_LOCAL_INV;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
        self.post_raw(&mut wr)
    }

    /// `ibv_post_send` of one complete work request.
    fn post_raw(&mut self, wr: &mut ibv_send_wr) -> Result<(), VerbsError> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is valid while `self` lives; `wr` is a complete request whose SGE (if
        // any) lies in a pinned region, and the window and region it names outlive it (the
        // caller keeps the window until the session's completions are drained). The provider
        // copies the request before returning.
        let rc = unsafe { ibv_post_send(self.qp.0.as_ptr(), wr, &mut bad) };
        VerbsError::check(rc, "ibv_post_send", self.pd.device().name())
    }

    fn post(
        &mut self,
        wr_id: u64,
        mr: &Arc<MemoryRegion>,
        range: Range<usize>,
        op: SendOp,
    ) -> Result<(), VerbsError> {
        self.pin(mr, &range)?;
        let mut sge = mr.sge(&range);
        // SAFETY: all-zero is a valid ibv_send_wr (null pointers, no SGEs).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        // A zero-length WRITE WITH IMMEDIATE is legal and carries no SGE.
        if sge.length > 0 {
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
        }
        match op {
            SendOp::Send => wr.opcode = ibv_wr_opcode::IBV_WR_SEND,
            SendOp::Write(rkey, remote_addr) => {
                wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE;
                wr.wr.rdma = rdma_t { remote_addr, rkey };
            }
            SendOp::WriteImm(rkey, remote_addr, imm) => {
                wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.wr.rdma = rdma_t { remote_addr, rkey };
                // The immediate travels in network order, so a capture shows the same value
                // the application sent.
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
            }
        }
        self.post_raw(&mut wr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid() -> Gid {
        "::ffff:10.77.0.2".parse().unwrap()
    }

    #[test]
    fn rtr_rejects_out_of_range_and_reserved_values() {
        let ok = RtrParams::new(0x11, 0xff_ffff, gid(), PathMtu::Mtu1024).unwrap();
        assert_eq!(ok.remote_qpn.get(), 0x11);
        assert_eq!(ok.remote_psn.get(), 0xff_ffff);
        for (qpn, psn, g, want) in [
            (1 << 24, 0, gid(), "QPN 0x1000000 does not fit in 24 bits"),
            (
                0x11,
                1 << 24,
                gid(),
                "PSN 0x1000000 does not fit in 24 bits",
            ),
            (u32::MAX, 0, gid(), "QPN 0xffffffff"),
            (1, 0, gid(), "special QP"),
            (0, 0, gid(), "special QP"),
            (0x11, 0, Gid::default(), "remote GID is all zeros"),
        ] {
            let err = RtrParams::new(qpn, psn, g, PathMtu::Mtu1024)
                .unwrap_err()
                .to_string();
            assert!(err.contains(want), "{qpn:#x}/{psn:#x}: {err}");
        }
    }

    #[test]
    fn rts_rejects_psn_of_25_bits() {
        assert_eq!(RtsParams::new(0).unwrap().local_psn.get(), 0);
        assert!(RtsParams::new(0xff_ffff).is_ok());
        let err = RtsParams::new(0x100_0000).unwrap_err().to_string();
        assert!(
            err.contains("PSN 0x1000000 does not fit in 24 bits"),
            "{err}"
        );
    }

    #[test]
    fn state_names_follow_the_spec() {
        assert_eq!(Reset::NAME, "RESET");
        assert_eq!(Init::NAME, "INIT");
        assert_eq!(Rtr::NAME, "RTR");
        assert_eq!(Rts::NAME, "RTS");
        assert_eq!(state_name(ibv_qp_state::IBV_QPS_ERR), "ERR");
        assert_eq!(state_name(ibv_qp_state::IBV_QPS_RTS), "RTS");
        assert_eq!(state_name(99), "UNKNOWN");
    }
}
