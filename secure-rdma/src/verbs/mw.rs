//! Type 2 memory windows: the rkey a peer gets for a session's writable slots, bound to that
//! session's QP and invalidated when the session ends.
//!
//! A region registered with [`MrAccess::WindowBind`](super::MrAccess::WindowBind) grants no
//! remote access of its own: its rkey is never handed out and opens nothing. Remote writes go
//! through a type 2 window bound over the region by a BIND_MW work request on the session's QP
//! (`ibv_alloc_mw`, `IBV_WR_BIND_MW`); the device then accepts the window's rkey only on that
//! QP. [`QueuePair::post_local_invalidate`](super::QueuePair::post_local_invalidate) revokes
//! it while the QP still runs (`IBV_WR_LOCAL_INV`), and dropping the window deallocates it
//! (`ibv_dealloc_mw`), which revokes it in any case.

use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys::{ibv_alloc_mw, ibv_dealloc_mw, ibv_mw, ibv_mw_type};

use super::device::ProtectionDomain;
use super::mr::{MemoryRegion, RemoteBuffer};
use super::VerbsError;

/// One type 2 memory window, deallocated on drop.
pub struct MemoryWindow {
    mw: NonNull<ibv_mw>,
    /// The rkey the next bind gives the window (its key byte moved on from the current one).
    rkey: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the handle is only used through libibverbs calls, which are thread-safe.
unsafe impl Send for MemoryWindow {}
unsafe impl Sync for MemoryWindow {}

impl std::fmt::Debug for MemoryWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryWindow").finish_non_exhaustive()
    }
}

/// `rkey` with its low (key) byte advanced by one, as a type 2 bind must change it
/// (`ibv_inc_rkey`).
fn next_key(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

impl MemoryWindow {
    /// Allocates a type 2 window in `pd` (`ibv_alloc_mw`). Fails on a device without type 2
    /// windows (`IBV_DEVICE_MEM_WINDOW_TYPE_2B`).
    pub fn alloc(pd: &Arc<ProtectionDomain>) -> Result<MemoryWindow, VerbsError> {
        // SAFETY: the PD is valid while `pd` lives; the window keeps an Arc of it.
        let raw = unsafe { ibv_alloc_mw(pd.pd.pd().as_ptr(), ibv_mw_type::IBV_MW_TYPE_2) };
        let mw = VerbsError::created(raw, "ibv_alloc_mw", pd.device().name())?;
        // SAFETY: just allocated.
        let current = unsafe { mw.as_ref().rkey };
        Ok(MemoryWindow {
            mw,
            rkey: next_key(current),
            pd: Arc::clone(pd),
        })
    }

    pub(crate) fn raw(&self) -> *mut ibv_mw {
        self.mw.as_ptr()
    }

    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The rkey the window has once bound: what the peer is given.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// What the peer needs to write through the window bound over all of `mr`.
    pub fn remote(&self, mr: &MemoryRegion) -> RemoteBuffer {
        self.remote_over(mr, 0..mr.len())
    }

    /// What the peer needs to write through the window bound over `range` of `mr`
    /// ([`QueuePair::post_bind_window_over`](super::QueuePair::post_bind_window_over)).
    pub fn remote_over(&self, mr: &MemoryRegion, range: std::ops::Range<usize>) -> RemoteBuffer {
        RemoteBuffer {
            addr: mr.addr() + range.start as u64,
            rkey: self.rkey,
            len: range.len() as u64,
        }
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: allocated in `alloc`, deallocated once, here. Deallocating a bound window
        // invalidates it and releases the region it was bound to.
        unsafe { ibv_dealloc_mw(self.mw.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::next_key;

    #[test]
    fn the_key_byte_moves_and_the_index_stays() {
        assert_eq!(next_key(0x0001_2345), 0x0001_2346);
        assert_eq!(next_key(0x0001_23ff), 0x0001_2300);
        assert_eq!(next_key(u32::MAX), 0xffff_ff00);
    }
}
