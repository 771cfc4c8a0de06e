//! The allocator of the library's unit tests: the system's, with a count of the bytes each
//! thread has allocated and not freed, so that a test can weigh one of its values on the heap
//! while other tests run on other threads ([`held_by`]).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // Constant-initialised and without a destructor: usable from the allocator at any time
    // in a thread's life, its start and its end included.
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    let _ = LIVE.try_with(|live| live.set(live.get() + delta));
}

struct Counting;

// SAFETY: every call is passed to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count(new as isize - layout.size() as isize);
        // SAFETY: as the caller's contract.
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `make` leaves allocated on this thread, in bytes, and what it made: run it on a
/// current-thread runtime or none, so that nothing it allocates is counted elsewhere.
pub(crate) fn held_by<T>(make: impl FnOnce() -> T) -> (isize, T) {
    let before = LIVE.with(Cell::get);
    let made = make();
    (LIVE.with(Cell::get) - before, made)
}
