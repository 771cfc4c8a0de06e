//! The shared receive queue: one pool of posted receives for many queue pairs.
//!
//! A queue pair with its own receive queue keeps its receives posted (and their buffers
//! registered) whether its peer sends or not: for thousands of mostly idle sessions that is
//! most of a session's memory. Queue pairs created with
//! [`QueuePair::create_on_srq`](super::QueuePair::create_on_srq) take each arriving SEND or
//! WRITE WITH IMMEDIATE from one pool instead, and the completion names the queue pair it
//! arrived on ([`Completion::qp_num`](super::Completion::qp_num)).
//!
//! sideway 0.4 has no SRQ and its QP builder passes `srq: NULL`, so this is made with the plain
//! verbs (`ibv_create_srq`, `ibv_post_srq_recv`, `ibv_destroy_srq`), as memory windows are.
//!
//! An SRQ lives in one protection domain, and so do the queue pairs on it: sessions that share
//! one share a PD, and an rkey of one is then valid on another's QP unless every remote grant
//! is a type 2 memory window bound to its own QP (see the README's shared queues).

use std::ops::Range;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use rdma_mummy_sys::{
    ibv_create_srq, ibv_destroy_srq, ibv_post_srq_recv, ibv_srq, ibv_srq_attr, ibv_srq_init_attr,
};

use super::device::ProtectionDomain;
use super::mr::MemoryRegion;
use super::qp::one_receive;
use super::VerbsError;

/// A shared receive queue of at most `max_wr` posted receives.
///
/// ```no_run
/// # fn f(pd: std::sync::Arc<secure_rdma::verbs::ProtectionDomain>) -> Result<(), secure_rdma::verbs::VerbsError> {
/// use secure_rdma::verbs::{MemoryRegion, MrAccess, SharedReceiveQueue};
/// let srq = SharedReceiveQueue::new(&pd, 64)?;
/// let slots = MemoryRegion::new(&pd, 64 * 4096, MrAccess::Local)?;
/// for i in 0..64 {
///     srq.post_recv(i, &slots, (i as usize * 4096)..((i as usize + 1) * 4096))?;
/// }
/// # Ok(()) }
/// ```
pub struct SharedReceiveQueue {
    // Field order is drop order: destroy the SRQ before releasing the regions its receives
    // point into.
    srq: RawSrq,
    pinned: Mutex<Vec<Arc<MemoryRegion>>>,
    pd: Arc<ProtectionDomain>,
    max_wr: u32,
}

struct RawSrq(NonNull<ibv_srq>);

// SAFETY: libibverbs' SRQ verbs are thread-safe (the provider locks its producer index).
unsafe impl Send for RawSrq {}
// SAFETY: as above.
unsafe impl Sync for RawSrq {}

impl Drop for RawSrq {
    fn drop(&mut self) {
        // SAFETY: created in `SharedReceiveQueue::new`, destroyed once, here, after every QP
        // on it (each QP keeps an `Arc` of the queue).
        super::warn_if_not_destroyed(
            unsafe { ibv_destroy_srq(self.0.as_ptr()) },
            "ibv_destroy_srq",
        );
    }
}

impl std::fmt::Debug for SharedReceiveQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedReceiveQueue")
            .field("device", &self.pd.device().name())
            .field("max_wr", &self.max_wr)
            .finish()
    }
}

impl SharedReceiveQueue {
    /// Creates a shared receive queue in `pd` for up to `max_wr` posted receives of one
    /// scatter entry each.
    pub fn new(pd: &Arc<ProtectionDomain>, max_wr: u32) -> Result<Arc<Self>, VerbsError> {
        let mut init = ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ibv_srq_attr {
                max_wr: max_wr.max(1),
                max_sge: 1,
                srq_limit: 0,
            },
        };
        // SAFETY: the PD is valid while `pd` lives, and this queue keeps it.
        let raw = unsafe { ibv_create_srq(pd.pd.pd().as_ptr(), &mut init) };
        let raw = VerbsError::created(raw, "ibv_create_srq", pd.device().name())?;
        Ok(Arc::new(SharedReceiveQueue {
            srq: RawSrq(raw),
            pinned: Mutex::new(Vec::new()),
            pd: Arc::clone(pd),
            // The device may round up; what it granted is what may be posted.
            max_wr: init.attr.max_wr,
        }))
    }

    /// The protection domain of the queue and of every queue pair on it.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// How many receives the device allows posted at once.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    pub(crate) fn raw(&self) -> *mut ibv_srq {
        self.srq.0.as_ptr()
    }

    /// Posts a receive for `range` of `mr`: the next SEND (or WRITE WITH IMMEDIATE) to arrive on
    /// any queue pair of this queue may land there. The queue keeps `mr` alive.
    pub fn post_recv(
        &self,
        wr_id: u64,
        mr: &Arc<MemoryRegion>,
        range: Range<usize>,
    ) -> Result<(), VerbsError> {
        if !Arc::ptr_eq(mr.pd(), &self.pd) {
            return Err(VerbsError::ForeignRegion);
        }
        mr.check(&range)?;
        u32::try_from(range.len()).map_err(|_| VerbsError::WorkRequestTooLarge(range.len()))?;
        {
            let mut pinned = self.pinned.lock().unwrap_or_else(|p| p.into_inner());
            if !pinned.iter().any(|p| Arc::ptr_eq(p, mr)) {
                pinned.push(Arc::clone(mr));
            }
        }
        let srq = self.raw();
        // SAFETY: the SRQ is valid while `self` lives; the range was checked against the
        // region, which the queue keeps alive.
        let rc = one_receive(wr_id, mr.sge(&range), |wr, bad| unsafe {
            ibv_post_srq_recv(srq, wr, bad)
        });
        VerbsError::check(rc, "ibv_post_srq_recv", self.pd.device().name())
    }
}
