//! Send slots for many sessions carved out of a few registrations on their shared protection
//! domain, instead of a registration each.
//!
//! A session's send slots hold what its own queue pair sends: they are registered for local
//! access only, so no rkey opens them, and sessions on one protection domain (a
//! [`SharedQueue`](crate::shared_queue::SharedQueue)'s) may take them from one region. A
//! registration of its own costs a session the kernel's record of the region (rxe keeps a page
//! map of 4 KiB for every region, however small) and whole pages: a slot of 4,128 bytes (4 KiB
//! of payload, the header and the tag) takes two. An [`Arena`] registers a chunk of
//! [`EXTENTS_PER_CHUNK`] extents at a time, each extent a session's slots rounded to a cache
//! line, and hands them out as [`Slots`].
//!
//! **Only send slots.** A peer's remote writes go through a type 2 memory window bound over the
//! session's write slots, and a window over part of a region would seem to bound the peer to that
//! part. On Linux 6.1's rxe it does not: the responder checks a WRITE's address against the
//! region the window is bound to, not the window (`tests/tests/srq_lab.rs` lands a peer's WRITE
//! in the neighbouring part through its own window). Write slots therefore stay a region per
//! session.
//!
//! **Nothing of an earlier session.** An extent goes back to its chunk only when every owner
//! has let go of it: the session's [`Slots`] and the queue pair it was given to
//! ([`QueuePair::retain`](crate::verbs::QueuePair::retain)), which keeps it until the queue
//! pair is destroyed, so no work request can still read it. It is zeroed then, before anyone
//! else can take it. A chunk whose extents are all free is deregistered, unless it is the last
//! one of its size.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, Weak};

use crate::verbs::{MemoryRegion, MrAccess, ProtectionDomain, VerbsError};

/// Extents registered at once: 64 sessions' send slots of 4 KiB make a chunk of about 260 KiB,
/// one registration (and one page map in rxe) for all of them.
pub const EXTENTS_PER_CHUNK: usize = 64;

/// What each extent is aligned to: a cache line, so two sessions' slots never share one.
const ALIGN: usize = 64;

/// Send slots of many sessions on one protection domain, registered a chunk at a time.
///
/// ```no_run
/// # fn f(pd: std::sync::Arc<secure_rdma::verbs::ProtectionDomain>) -> Result<(), secure_rdma::verbs::VerbsError> {
/// use secure_rdma::slots::Arena;
/// let arena = Arena::new(&pd);
/// let slots = arena.take(4128)?; // one slot: 4 KiB of payload, header and tag
/// slots.write(0, b"sealed bytes")?;
/// // Post from slots.region() at slots.absolute(0..12)?; hand slots.lease() to the QP.
/// # Ok(()) }
/// ```
pub struct Arena {
    inner: Arc<Inner>,
}

struct Inner {
    pd: Arc<ProtectionDomain>,
    /// Chunks by extent length.
    pools: Mutex<HashMap<usize, Vec<Chunk>>>,
}

struct Chunk {
    mr: Arc<MemoryRegion>,
    /// Offsets of the extents nobody holds.
    free: Vec<usize>,
}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("stats", &self.stats())
            .finish()
    }
}

/// How much an [`Arena`] holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct ArenaStats {
    /// Chunks registered now (all sizes).
    pub chunks: usize,
    /// Extents handed out and not yet returned.
    pub taken: usize,
}

impl Arena {
    /// An arena registering its chunks on `pd`.
    pub fn new(pd: &Arc<ProtectionDomain>) -> Arena {
        Arena {
            inner: Arc::new(Inner {
                pd: Arc::clone(pd),
                pools: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The protection domain the slots are registered on.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.inner.pd
    }

    /// `len` bytes of send slots, zeroed, from a chunk with room, or from a chunk registered
    /// now when none has.
    pub fn take(&self, len: usize) -> Result<Slots, VerbsError> {
        if len == 0 {
            return Err(VerbsError::EmptyRegion);
        }
        let extent = len
            .checked_next_multiple_of(ALIGN)
            .ok_or(VerbsError::RegionAlloc(len))?;
        let mut pools = self.inner.lock();
        let chunks = pools.entry(extent).or_default();
        // The fullest chunk with room: chunks left empty can then be deregistered.
        let found = chunks
            .iter_mut()
            .filter(|c| !c.free.is_empty())
            .min_by_key(|c| c.free.len());
        let (mr, offset) = match found {
            Some(chunk) => {
                let offset = chunk.free.pop().ok_or(VerbsError::RegionAlloc(len))?;
                (Arc::clone(&chunk.mr), offset)
            }
            None => {
                let size = extent
                    .checked_mul(EXTENTS_PER_CHUNK)
                    .ok_or(VerbsError::RegionAlloc(len))?;
                // Registered under the lock: one registration per 64 sessions, and two
                // sessions that found no room must not both register a chunk.
                let mr = MemoryRegion::new(&self.inner.pd, size, MrAccess::Local)?;
                let mut free: Vec<usize> = (1..EXTENTS_PER_CHUNK).map(|i| i * extent).collect();
                free.reverse();
                tracing::debug!(extent, chunk_bytes = size, "send slots: a chunk registered");
                chunks.push(Chunk {
                    mr: Arc::clone(&mr),
                    free,
                });
                (mr, 0)
            }
        };
        Ok(Slots {
            lease: Arc::new(Lease {
                arena: Arc::downgrade(&self.inner),
                mr,
                range: offset..offset + extent,
            }),
            len,
        })
    }

    /// Chunks registered and extents handed out now.
    pub fn stats(&self) -> ArenaStats {
        let pools = self.inner.lock();
        let chunks = pools.values().map(Vec::len).sum();
        let free: usize = pools.values().flatten().map(|c| c.free.len()).sum();
        ArenaStats {
            chunks,
            taken: chunks * EXTENTS_PER_CHUNK - free,
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Vec<Chunk>>> {
        self.pools.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One extent of a chunk, returned (zeroed) when its last holder lets go.
struct Lease {
    arena: Weak<Inner>,
    mr: Arc<MemoryRegion>,
    range: Range<usize>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        // A region of its own ([`Slots::whole`]), or an arena gone: nobody takes it again.
        let Some(arena) = self.arena.upgrade() else {
            return;
        };
        // Nothing of this session may reach the next: zeroed before it is free again.
        if self.mr.zero(self.range.clone()).is_err() {
            return;
        }
        let extent = self.range.len();
        let mut pools = arena.lock();
        let Some(chunks) = pools.get_mut(&extent) else {
            return;
        };
        let Some(at) = chunks.iter().position(|c| Arc::ptr_eq(&c.mr, &self.mr)) else {
            return;
        };
        chunks[at].free.push(self.range.start);
        if chunks[at].free.len() == EXTENTS_PER_CHUNK && chunks.len() > 1 {
            // Deregistered when the queue pairs that pinned it are gone (they are: every
            // extent's lease outlives its queue pair).
            chunks.swap_remove(at);
            tracing::debug!(extent, "send slots: an empty chunk deregistered");
        }
    }
}

/// A session's send slots: `len` bytes of a registered chunk, zeroed when taken.
pub struct Slots {
    lease: Arc<Lease>,
    len: usize,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("start", &self.lease.range.start)
            .field("len", &self.len)
            .finish()
    }
}

impl Slots {
    /// All of a region of its own (a session that makes its own registrations), which
    /// nothing else fills.
    pub(crate) fn whole(mr: Arc<MemoryRegion>) -> Slots {
        let len = mr.len();
        Slots {
            lease: Arc::new(Lease {
                arena: Weak::new(),
                mr,
                range: 0..len,
            }),
            len,
        }
    }

    /// The region the slots are in, for work requests.
    pub fn region(&self) -> &Arc<MemoryRegion> {
        &self.lease.mr
    }

    /// Bytes of slots.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an arena hands out no empty slots.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `range` of the slots as a range of [`Slots::region`], checked to lie inside them.
    pub fn absolute(&self, range: Range<usize>) -> Result<Range<usize>, VerbsError> {
        if range.start <= range.end && range.end <= self.len {
            let base = self.lease.range.start;
            Ok(base + range.start..base + range.end)
        } else {
            Err(VerbsError::OutOfBounds {
                start: range.start as u64,
                end: range.end as u64,
                len: self.len as u64,
            })
        }
    }

    /// Copies `data` into the slots at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), VerbsError> {
        let at = self.absolute(offset..offset.saturating_add(data.len()))?;
        self.lease.mr.write(at.start, data)
    }

    /// Runs `fill` on `len` bytes of the slots at `offset`, in place: a message is sealed
    /// straight into its send slot, with no copy through a buffer of its own.
    ///
    /// # Safety
    /// No posted work request may use those bytes until `fill` returns (the session fills a
    /// slot only once its previous send has completed).
    pub(crate) unsafe fn fill_in_place<R>(
        &mut self,
        offset: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> R,
    ) -> Result<R, VerbsError> {
        let at = self.absolute(offset..offset.saturating_add(len))?;
        // SAFETY: these bytes are this `Slots`' alone (an arena hands each extent to one
        // holder, `&mut self` keeps it to one caller here) and no work request uses them,
        // by the caller's contract.
        let bytes = unsafe { self.lease.mr.local_bytes_mut(at) }?;
        Ok(fill(bytes))
    }

    /// Copies `len` bytes at `offset` out of the slots.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>, VerbsError> {
        let at = self.absolute(offset..offset.saturating_add(len))?;
        self.lease.mr.read(at.start, len)
    }

    /// What keeps the extent from going back to its chunk: hand it to the queue pair that
    /// posts from the slots ([`QueuePair::retain`](crate::verbs::QueuePair::retain)).
    pub fn lease(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        self.lease.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extent_is_rounded_to_a_cache_line() {
        assert_eq!(4128usize.next_multiple_of(ALIGN), 4160);
        assert_eq!(64usize.next_multiple_of(ALIGN), 64);
    }
}
