//! Memory regions that own their buffers.
//!
//! The buffer is allocated here, registered here, and freed only after it
//! has been deregistered: a registered buffer cannot be freed or moved by
//! safe code. Queue pairs keep an `Arc` of every region they post, so a
//! region also outlives any work request that might still touch it.

use std::alloc::{self, Layout};
use std::ops::Range;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys::{ibv_access_flags, ibv_dereg_mr, ibv_mr, ibv_reg_mr_iova2};
use serde::{Deserialize, Serialize};

use super::device::ProtectionDomain;
use super::VerbsError;

/// What the remote side may do with a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MrAccess {
    /// Local use only (send buffers, receive buffers).
    Local,
    /// The peer may RDMA WRITE into it.
    RemoteWrite,
    /// The peer may RDMA WRITE and RDMA READ.
    RemoteReadWrite,
    /// No remote access of its own: a type 2 [`MemoryWindow`](super::MemoryWindow) bound over
    /// it grants the peer remote writes, with the window's rkey.
    WindowBind,
}

impl MrAccess {
    fn flags(self) -> std::os::raw::c_uint {
        let local = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
        let write = ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
        let read = ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
        match self {
            MrAccess::Local => local,
            MrAccess::RemoteWrite => local | write,
            MrAccess::RemoteReadWrite => local | write | read,
            MrAccess::WindowBind => local | ibv_access_flags::IBV_ACCESS_MW_BIND.0,
        }
    }

    fn remote(self) -> bool {
        !matches!(self, MrAccess::Local)
    }
}

/// One `ibv_reg_mr_iova2` registration, deregistered on drop.
///
/// sideway's `reg_mr` registers at the buffer's virtual address, which would then be what the
/// peer sees in every RETH: a heap address handed to the network (ReDMArk). Registering with an
/// explicit IOVA makes remotely accessible regions zero-based.
struct Registration(NonNull<ibv_mr>);

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: registered in `MemoryRegion::new`, deregistered once, here; the QPs that may
        // use it hold an Arc of the region, so none is left when this runs.
        unsafe { ibv_dereg_mr(self.0.as_ptr()) };
    }
}

/// What a peer needs to RDMA WRITE into a region: its address, rkey and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteBuffer {
    /// Virtual address of the first byte, in the owner's address space.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Size in bytes.
    pub len: u64,
}

impl RemoteBuffer {
    /// The absolute address of `offset`, checking that `len` bytes from there
    /// fit in the buffer.
    pub fn at(&self, offset: u64, len: u64) -> Result<u64, VerbsError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.addr.wrapping_add(offset)),
            _ => Err(VerbsError::OutOfBounds {
                start: offset,
                end: offset.saturating_add(len),
                len: self.len,
            }),
        }
    }
}

struct Buffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `MemoryRegion::new` with this layout.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A registered, zero-initialised, page-aligned buffer.
///
/// Reads and writes copy: the device may write the memory at any time
/// (an RDMA WRITE from the peer), so no Rust reference into it is handed out.
///
/// ```no_run
/// # fn f(pd: &std::sync::Arc<secure_rdma::verbs::ProtectionDomain>) -> Result<(), secure_rdma::verbs::VerbsError> {
/// use secure_rdma::verbs::{MemoryRegion, MrAccess};
/// let mr = MemoryRegion::new(pd, 4096, MrAccess::RemoteWrite)?;
/// mr.write(0, b"hello")?;
/// assert_eq!(mr.read(0, 5)?, b"hello");
/// let remote = mr.remote(); // addr + rkey + len, for the peer
/// # Ok(()) }
/// ```
pub struct MemoryRegion {
    // Field order is drop order: deregister before the buffer is freed.
    mr: Registration,
    buf: Buffer,
    len: usize,
    /// The address work requests and the peer use for the first byte: 0 for
    /// regions the peer can reach, the buffer's own address otherwise.
    iova: u64,
    /// Whether the peer may reach it (a region rkey or a window bound over it).
    remote: bool,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: the buffer is only accessed through raw copies; the registration
// handle is Send + Sync.
unsafe impl Send for MemoryRegion {}
unsafe impl Sync for MemoryRegion {}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryRegion")
            .field("len", &self.len)
            .field("lkey", &self.lkey())
            .finish()
    }
}

const PAGE: usize = 4096;

impl MemoryRegion {
    /// Allocates `len` zeroed bytes and registers them with `access`.
    pub fn new(
        pd: &Arc<ProtectionDomain>,
        len: usize,
        access: MrAccess,
    ) -> Result<Arc<Self>, VerbsError> {
        if len == 0 {
            return Err(VerbsError::EmptyRegion);
        }
        let layout =
            Layout::from_size_align(len, PAGE).map_err(|_| VerbsError::RegionAlloc(len))?;
        // SAFETY: layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) })
            .ok_or(VerbsError::RegionAlloc(len))?;
        let buf = Buffer { ptr, layout };
        let iova = if access.remote() {
            0
        } else {
            ptr.as_ptr() as u64
        };
        // SAFETY: the PD outlives the registration (we keep an Arc of it); the buffer is valid
        // for `len` bytes and lives in `Self`, which deregisters before freeing it.
        let raw = unsafe {
            ibv_reg_mr_iova2(
                pd.pd.pd().as_ptr(),
                ptr.as_ptr().cast(),
                len,
                iova,
                access.flags(),
            )
        };
        let mr = NonNull::new(raw).map(Registration).ok_or_else(|| {
            VerbsError::verb(
                "ibv_reg_mr_iova2",
                pd.device.name(),
                std::io::Error::last_os_error(),
            )
        })?;
        Ok(Arc::new(MemoryRegion {
            mr,
            buf,
            len,
            iova,
            remote: access.remote(),
            pd: Arc::clone(pd),
        }))
    }

    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub(crate) fn raw(&self) -> *mut ibv_mr {
        self.mr.0.as_ptr()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: empty regions are refused at creation.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Local key, for work requests posted on this side.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the registration is valid while `self` lives.
        unsafe { self.mr.0.as_ref().lkey }
    }

    /// Remote key, for the peer.
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.mr.0.as_ref().rkey }
    }

    /// Address of the first byte as work requests and the peer name it:
    /// 0 for a region the peer may access (zero-based), the buffer's
    /// virtual address for a local one.
    pub fn addr(&self) -> u64 {
        self.iova
    }

    /// Address, rkey and size for the peer.
    pub fn remote(&self) -> RemoteBuffer {
        RemoteBuffer {
            addr: self.addr(),
            rkey: self.rkey(),
            len: self.len as u64,
        }
    }

    /// The scatter entry of `range`, which the caller has checked: inside the region
    /// ([`MemoryRegion::check`]) and at most `u32::MAX` bytes.
    pub(crate) fn sge(&self, range: &Range<usize>) -> rdma_mummy_sys::ibv_sge {
        rdma_mummy_sys::ibv_sge {
            addr: self.addr() + range.start as u64,
            length: range.len() as u32,
            lkey: self.lkey(),
        }
    }

    pub(crate) fn check(&self, range: &Range<usize>) -> Result<(), VerbsError> {
        if range.start <= range.end && range.end <= self.len {
            Ok(())
        } else {
            Err(VerbsError::OutOfBounds {
                start: range.start as u64,
                end: range.end as u64,
                len: self.len as u64,
            })
        }
    }

    /// Copies `len` bytes starting at `offset` out of the region.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>, VerbsError> {
        let range = offset..offset.saturating_add(len);
        self.check(&range)?;
        let mut out = vec![0u8; len];
        // SAFETY: bounds checked above; the source may be written by the
        // device concurrently, which a byte copy tolerates.
        unsafe {
            std::ptr::copy_nonoverlapping(self.buf.ptr.as_ptr().add(offset), out.as_mut_ptr(), len)
        };
        Ok(out)
    }

    /// Copies `data` into the region at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), VerbsError> {
        let range = offset..offset.saturating_add(data.len());
        self.check(&range)?;
        // SAFETY: bounds checked above.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.buf.ptr.as_ptr().add(offset),
                data.len(),
            )
        };
        Ok(())
    }

    /// `range` of a region the peer cannot reach, to be filled in place (a message sealed
    /// straight into its send slot); refused for a region the peer may write.
    ///
    /// # Safety
    /// While the slice lives, no posted work request may use `range` (a send reading it, a
    /// receive landing there) and nothing else may read or write it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn local_bytes_mut(
        &self,
        range: Range<usize>,
    ) -> Result<&mut [u8], VerbsError> {
        if self.remote {
            return Err(VerbsError::RemotelyWritable);
        }
        self.check(&range)?;
        // SAFETY: inside the buffer (checked); exclusive for the slice's life by the caller's
        // contract; the device cannot write it from the wire (no remote access).
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.buf.ptr.as_ptr().add(range.start), range.len())
        })
    }

    /// Sets every byte of `range` to `byte`.
    pub fn fill(&self, range: Range<usize>, byte: u8) -> Result<(), VerbsError> {
        self.check(&range)?;
        // SAFETY: bounds checked above.
        unsafe { std::ptr::write_bytes(self.buf.ptr.as_ptr().add(range.start), byte, range.len()) };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_buffer_bounds() {
        let r = RemoteBuffer {
            addr: 0x1000,
            rkey: 7,
            len: 100,
        };
        assert_eq!(r.at(0, 100).unwrap(), 0x1000);
        assert_eq!(r.at(99, 1).unwrap(), 0x1063);
        assert!(r.at(99, 2).is_err());
        assert!(r.at(u64::MAX, 2).is_err());
        assert_eq!(
            r.at(50, 51).unwrap_err().to_string(),
            "range 50..101 is outside the 100-byte memory region"
        );
    }
}
