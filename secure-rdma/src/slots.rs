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
    pools: Mutex<HashMap<usize, Extents<Region>>>,
}

/// A chunk's registration, the same chunk only if the same registration.
#[derive(Clone)]
struct Region(Arc<MemoryRegion>);

impl PartialEq for Region {
    fn eq(&self, other: &Region) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// The extents of one size across its chunks: which has room, and which to let go. Only
/// bookkeeping (a chunk is any `C`), so that its rules are tested without a device.
struct Extents<C> {
    extent: usize,
    /// Each chunk, with the offsets of the extents nobody holds.
    chunks: Vec<(C, Vec<usize>)>,
}

impl<C: Clone + PartialEq> Extents<C> {
    fn new(extent: usize) -> Extents<C> {
        Extents {
            extent,
            chunks: Vec::new(),
        }
    }

    /// A free extent of the fullest chunk with room (so that the emptiest chunks drain and can
    /// be let go), or none.
    fn take(&mut self) -> Option<(C, usize)> {
        let (chunk, free) = self
            .chunks
            .iter_mut()
            .filter(|(_, free)| !free.is_empty())
            .min_by_key(|(_, free)| free.len())?;
        Some((chunk.clone(), free.pop()?))
    }

    /// A chunk just registered: its first extent is taken, the others free.
    fn add(&mut self, chunk: C) -> (C, usize) {
        let free = (1..EXTENTS_PER_CHUNK)
            .rev()
            .map(|i| i * self.extent)
            .collect();
        self.chunks.push((chunk.clone(), free));
        (chunk, 0)
    }

    /// The extent at `offset` of `chunk` is free again; the chunk, when it is now all free and
    /// not the last of its size, is let go and returned.
    fn give_back(&mut self, chunk: &C, offset: usize) -> Option<C> {
        let at = self.chunks.iter().position(|(c, _)| c == chunk)?;
        let free = &mut self.chunks[at].1;
        free.push(offset);
        (free.len() == EXTENTS_PER_CHUNK && self.chunks.len() > 1)
            .then(|| self.chunks.swap_remove(at).0)
    }

    fn chunks(&self) -> usize {
        self.chunks.len()
    }

    fn free(&self) -> usize {
        self.chunks.iter().map(|(_, free)| free.len()).sum()
    }
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
        let extents = pools.entry(extent).or_insert_with(|| Extents::new(extent));
        let (Region(mr), offset) = match extents.take() {
            Some(found) => found,
            None => {
                let size = extent
                    .checked_mul(EXTENTS_PER_CHUNK)
                    .ok_or(VerbsError::RegionAlloc(len))?;
                // Registered under the lock: one registration per 64 sessions, and two
                // sessions that found no room must not both register a chunk.
                let mr = MemoryRegion::new(&self.inner.pd, size, MrAccess::Local)?;
                tracing::debug!(extent, chunk_bytes = size, "send slots: a chunk registered");
                extents.add(Region(mr))
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
        let chunks = pools.values().map(Extents::chunks).sum();
        let free: usize = pools.values().map(Extents::free).sum();
        ArenaStats {
            chunks,
            taken: chunks * EXTENTS_PER_CHUNK - free,
        }
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Extents<Region>>> {
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
        if self.mr.fill(self.range.clone(), 0).is_err() {
            return;
        }
        let mut pools = arena.lock();
        let Some(extents) = pools.get_mut(&self.range.len()) else {
            return;
        };
        if extents
            .give_back(&Region(Arc::clone(&self.mr)), self.range.start)
            .is_some()
        {
            // Deregistered when the last Arc goes: the queue pairs that pinned it are gone
            // (every extent's lease outlives its queue pair).
            tracing::debug!(
                extent = self.range.len(),
                "send slots: an empty chunk let go"
            );
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

    /// Takes like the arena: from a chunk with room, or a new chunk (numbered from 1).
    fn take(e: &mut Extents<u32>) -> (u32, usize) {
        e.take().unwrap_or_else(|| {
            let next = e.chunks() as u32 + 1;
            e.add(next)
        })
    }

    #[test]
    fn extents_fill_a_chunk_before_the_next_and_never_overlap() {
        let mut e = Extents::new(4160);
        let taken: Vec<_> = (0..EXTENTS_PER_CHUNK + 1).map(|_| take(&mut e)).collect();
        assert_eq!(e.chunks(), 2);
        assert_eq!(e.free(), EXTENTS_PER_CHUNK - 1);
        let mut seen = std::collections::HashSet::new();
        for (chunk, offset) in &taken {
            assert_eq!(offset % 4160, 0);
            assert!(
                *offset < 4160 * EXTENTS_PER_CHUNK,
                "{offset} past its chunk"
            );
            assert!(
                seen.insert((*chunk, *offset)),
                "{chunk}/{offset} handed out twice"
            );
        }
        assert_eq!(
            taken.iter().filter(|(c, _)| *c == 1).count(),
            EXTENTS_PER_CHUNK
        );
    }

    #[test]
    fn a_returned_extent_is_taken_from_the_fullest_chunk_first() {
        let mut e = Extents::new(64);
        let taken: Vec<_> = (0..EXTENTS_PER_CHUNK + 2).map(|_| take(&mut e)).collect();
        // Chunk 1 full but for one extent given back, chunk 2 with two taken: the next take
        // is chunk 1's, so that chunk 2 can drain.
        assert_eq!(e.give_back(&1, taken[5].1), None);
        assert_eq!(e.take(), Some((1, taken[5].1)));
        assert_eq!(e.take().map(|(c, _)| c), Some(2));
    }

    #[test]
    fn a_chunk_all_free_is_let_go_unless_it_is_the_last() {
        let mut e = Extents::new(64);
        let taken: Vec<_> = (0..EXTENTS_PER_CHUNK + 1).map(|_| take(&mut e)).collect();
        let (last, rest) = taken.split_last().expect("taken");
        assert_eq!(*last, (2, 0));
        // Chunk 2's only extent back: chunk 2 is let go.
        assert_eq!(e.give_back(&2, 0), Some(2));
        assert_eq!(e.chunks(), 1);
        // Every one of chunk 1's back: it stays, the last of its size.
        for (chunk, offset) in rest {
            assert_eq!(e.give_back(chunk, *offset), None);
        }
        assert_eq!((e.chunks(), e.free()), (1, EXTENTS_PER_CHUNK));
        // An extent of a chunk let go is nobody's to give back.
        assert_eq!(e.give_back(&2, 64), None);
        assert_eq!(e.free(), EXTENTS_PER_CHUNK);
    }
}
