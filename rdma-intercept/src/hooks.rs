//! The exported `ibv_*` functions that shadow libibverbs under `LD_PRELOAD`.
//!
//! Each hook finds the real function with `dlvsym(RTLD_NEXT, name, version)`
//! (the version libibverbs exports as the default, `@@`), caches it, and
//! wraps it:
//!
//! - creations ask the collector first ([`Interceptor::admit`]) and return
//!   NULL with `errno` set when refused;
//! - destructions call the real function, then release the ticket; they are
//!   never refused.
//!
//! **Reentrancy.** libibverbs' own `ibv_reg_mr` and `ibv_reg_mr_iova` call
//! `ibv_reg_mr_iova2` through its PLT, which resolves to *our* hook. A
//! thread-local flag makes every hook entered while another one runs on the
//! same thread a plain pass-through, so one registration is counted once. The
//! same flag keeps a signal handler that calls verbs from deadlocking on the
//! state lock.
//!
//! **Fork.** The state lock is a `pthread_mutex_t` taken around `fork` by
//! `pthread_atfork` handlers, so the child never inherits it locked; the
//! child then notices its new pid and opens its own connection
//! ([`Interceptor`]).

use std::cell::{Cell, UnsafeCell};
use std::ffi::{c_int, c_uint, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};

use std::thread::Thread;
use std::time::Instant;

use crate::intercept::{Decision, Interceptor, Settings, ERRNO_DENIED, RELEASE_DELAY};
use crate::limit::{self, Next};
use rdma_quota::Resource;

/// A real libibverbs function, found once.
struct Real {
    name: &'static CStr,
    version: &'static CStr,
    addr: AtomicPtr<c_void>,
}

impl Real {
    const fn new(name: &'static CStr, version: &'static CStr) -> Real {
        Real {
            name,
            version,
            addr: AtomicPtr::new(ptr::null_mut()),
        }
    }

    /// The real function's address, or `None` after printing why not.
    fn get(&self) -> Option<*mut c_void> {
        let cached = self.addr.load(Ordering::Acquire);
        if !cached.is_null() {
            return Some(cached);
        }
        // SAFETY: both strings are NUL-terminated constants.
        let mut addr =
            unsafe { libc::dlvsym(libc::RTLD_NEXT, self.name.as_ptr(), self.version.as_ptr()) };
        if addr.is_null() {
            // A program that dlopen()s libibverbs with RTLD_LOCAL keeps it out
            // of the global scope RTLD_NEXT searches, yet libibverbs' internal
            // PLT calls (ibv_reg_mr -> ibv_reg_mr_iova2) still reach us.
            // SAFETY: RTLD_NOLOAD only looks the library up; the handle is
            // released right after the lookup, the library stays loaded.
            unsafe {
                let handle = libc::dlopen(
                    c"libibverbs.so.1".as_ptr(),
                    libc::RTLD_NOW | libc::RTLD_NOLOAD,
                );
                if !handle.is_null() {
                    addr = libc::dlvsym(handle, self.name.as_ptr(), self.version.as_ptr());
                    libc::dlclose(handle);
                }
            }
        }
        if addr.is_null() {
            print_line(&format!(
                "rdma-intercept: cannot find the real {}@{} in libibverbs.so.1",
                self.name.to_string_lossy(),
                self.version.to_string_lossy()
            ));
            return None;
        }
        self.addr.store(addr, Ordering::Release);
        Some(addr)
    }
}

thread_local! {
    static IN_HOOK: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as inside a hook; `None` if it already is.
struct Reentry;

impl Reentry {
    fn enter() -> Option<Reentry> {
        // try_with: during thread teardown the slot may be gone; then act as
        // a pass-through rather than abort.
        let entered = IN_HOOK.try_with(|f| !f.replace(true)).unwrap_or(false);
        entered.then_some(Reentry)
    }
}

impl Drop for Reentry {
    fn drop(&mut self) {
        let _ = IN_HOOK.try_with(|f| f.set(false));
    }
}

/// The process's interceptor state behind a fork-safe lock.
struct Global {
    lock: UnsafeCell<libc::pthread_mutex_t>,
    state: UnsafeCell<Interceptor>,
    /// Who sends the `RELEASE`s that waited their delay.
    flusher: UnsafeCell<Flusher>,
}

/// Who sends a process's `RELEASE`s that waited [`RELEASE_DELAY`] with no
/// request to ride on. Each state names the process it holds for: a forked
/// child has no copy of its parent's thread and starts its own.
#[derive(Debug)]
enum Flusher {
    /// No release has waited yet.
    None,
    /// The thread, parked until a release starts waiting or one is due.
    Running(u32, Thread),
    /// The thread could not be started in this process: releases go at once.
    /// Not retried, so a process at its thread limit is told once, not at
    /// every destroyed object.
    Unavailable(u32),
}

/// What [`Flusher::wake`] leaves to its caller.
#[derive(Debug)]
enum Wake {
    /// The thread will send the release when it is due.
    Thread,
    /// No thread: send it now. `Some` the first time, with why.
    SendNow(Option<std::io::Error>),
}

impl Flusher {
    /// A release started waiting in `pid`: wake the thread, or start it with
    /// `spawn` if this process has none and has not failed to start one.
    fn wake(&mut self, pid: u32, spawn: impl FnOnce() -> std::io::Result<Thread>) -> Wake {
        match self {
            Flusher::Running(owner, thread) if *owner == pid => {
                thread.unpark();
                Wake::Thread
            }
            Flusher::Unavailable(owner) if *owner == pid => Wake::SendNow(None),
            _ => match spawn() {
                Ok(thread) => {
                    *self = Flusher::Running(pid, thread);
                    Wake::Thread
                }
                Err(e) => {
                    *self = Flusher::Unavailable(pid);
                    Wake::SendNow(Some(e))
                }
            },
        }
    }
}

// SAFETY: `state` and `flusher` are only reached through `with_state`, which
// holds `lock`.
unsafe impl Sync for Global {}

static GLOBAL: Global = Global {
    lock: UnsafeCell::new(libc::PTHREAD_MUTEX_INITIALIZER),
    state: UnsafeCell::new(Interceptor::new()),
    flusher: UnsafeCell::new(Flusher::None),
};

static ATFORK: AtomicBool = AtomicBool::new(false);

/// Whether a wait that could not be honoured was reported already.
static GAVE_UP: AtomicBool = AtomicBool::new(false);

extern "C" fn before_fork() {
    // SAFETY: the lock is a valid, initialised mutex.
    unsafe { libc::pthread_mutex_lock(GLOBAL.lock.get()) };
}

extern "C" fn after_fork_in_parent() {
    // SAFETY: locked by `before_fork` on this thread.
    unsafe { libc::pthread_mutex_unlock(GLOBAL.lock.get()) };
}

extern "C" fn after_fork_in_child() {
    // The child has one thread, a copy of the one that locked; starting from
    // a fresh mutex avoids unlocking one owned by a thread that is not there.
    // SAFETY: no other thread exists in the child to hold or wait on it.
    unsafe { GLOBAL.lock.get().write(libc::PTHREAD_MUTEX_INITIALIZER) };
}

struct Locked;

impl Drop for Locked {
    fn drop(&mut self) {
        // SAFETY: locked in `with_state` on this thread.
        unsafe { libc::pthread_mutex_unlock(GLOBAL.lock.get()) };
    }
}

/// Runs `f` on the state under the lock, then prints what it logged (after
/// unlocking, so a slow stderr never holds up other threads).
fn with_state<R>(f: impl FnOnce(&mut Interceptor, u32, &mut Vec<String>) -> R) -> R {
    let mut log = Vec::new();
    let result = {
        // SAFETY: a valid mutex; `Locked` unlocks it.
        unsafe { libc::pthread_mutex_lock(GLOBAL.lock.get()) };
        let _locked = Locked;
        if !ATFORK.swap(true, Ordering::Relaxed) {
            // Registered lazily, under the lock: nothing runs at load time.
            // SAFETY: the handlers are plain functions that live forever.
            unsafe {
                libc::pthread_atfork(
                    Some(before_fork),
                    Some(after_fork_in_parent),
                    Some(after_fork_in_child),
                )
            };
        }
        // SAFETY: getpid cannot fail.
        let pid = unsafe { libc::getpid() } as u32;
        // SAFETY: the lock is held, so this is the only reference.
        let state = unsafe { &mut *GLOBAL.state.get() };
        let waiting = state.releases_due().is_some();
        let result = f(state, pid, &mut log);
        if !waiting && state.releases_due().is_some() {
            // A release started waiting: make sure someone sends it if the
            // program asks nothing more for a while. Only on that change, so
            // a flood's calls do not wake the flusher each time.
            // SAFETY: the lock is held, so this is the only reference.
            let flusher = unsafe { &mut *GLOBAL.flusher.get() };
            let wake = flusher.wake(pid, || {
                std::thread::Builder::new()
                    .name("rdma-intercept".into())
                    .spawn(flush_releases)
                    .map(|handle| handle.thread().clone())
            });
            if let Wake::SendNow(why) = wake {
                // No thread: send them now rather than leave them to the
                // program's next call, which may never come.
                if let Some(e) = why {
                    log.push(format!(
                        "rdma-intercept: cannot start the thread that sends releases \
                         ({e}); sending each at once"
                    ));
                }
                state.flush_releases(pid, Instant::now() + RELEASE_DELAY);
            }
        }
        result
    };
    for line in &log {
        print_line(line);
    }
    result
}

/// The flusher thread: sends the `RELEASE`s that waited [`RELEASE_DELAY`]
/// without a request to ride on, then sleeps until the next are due, or until
/// `with_state` wakes it because one started waiting.
fn flush_releases() {
    loop {
        let next = with_state(|s, pid, _| s.flush_releases(pid, Instant::now()));
        match next {
            Some(due) => std::thread::park_timeout(due.saturating_duration_since(Instant::now())),
            None => std::thread::park(),
        }
    }
}

/// Writes one line to stderr with a single write(2), bypassing any stdio
/// buffering of the host program.
fn print_line(line: &str) {
    let mut buf = Vec::with_capacity(line.len() + 1);
    buf.extend_from_slice(line.as_bytes());
    buf.push(b'\n');
    // SAFETY: `buf` is valid for its length. A failed or short write to
    // stderr has nowhere better to be reported.
    unsafe { libc::write(libc::STDERR_FILENO, buf.as_ptr().cast(), buf.len()) };
}

fn errno() -> c_int {
    // SAFETY: the thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn set_errno(value: c_int) {
    // SAFETY: the thread's errno slot.
    unsafe { *libc::__errno_location() = value };
}

/// A creating hook: admission, the real call, the ticket's fate.
fn create(resource: Resource, bytes: u64, real: impl FnOnce() -> *mut c_void) -> *mut c_void {
    let Some(_reentry) = Reentry::enter() else {
        return real();
    };
    let settings = Settings::from_env();
    let started = Instant::now();
    let decision = loop {
        let decision = with_state(|s, pid, log| s.admit(pid, &settings, resource, bytes, log));
        let Decision::Wait(until) = decision else {
            break decision;
        };
        match limit::next_step(
            settings.on_limit,
            started,
            Instant::now(),
            until,
            settings.max_wait,
        ) {
            // Sleeping here blocks no one else: the state lock was released
            // when `with_state` returned, and libibverbs has not been entered
            // yet, so none of its locks is held by this thread. Only
            // creations get here; destroys never wait, so a program freeing
            // resources to make room is never held up by this sleep.
            Next::Sleep(wait) => std::thread::sleep(wait),
            Next::GiveUp => {
                // Once per process: with a small maximum wait every held call
                // gives up at once, and a line each would flood stderr.
                if !GAVE_UP.swap(true, Ordering::Relaxed) {
                    print_line(&format!(
                        "rdma-intercept: {} refused: its rate limit admits no call within \
                         RDMA_INTERCEPT_MAX_WAIT_MS={} of this one (EDQUOT; this note is \
                         printed once)",
                        resource.create_verb(),
                        settings.max_wait.as_millis()
                    ));
                }
                break Decision::Refuse(ERRNO_DENIED);
            }
        }
    };
    match decision {
        Decision::Refuse(err) => {
            set_errno(err);
            ptr::null_mut()
        }
        // Waits end in the loop above; were one to get here, it is a refusal
        // (never a panic inside someone else's program).
        Decision::Wait(_) => {
            set_errno(ERRNO_DENIED);
            ptr::null_mut()
        }
        Decision::Proceed(None) => real(),
        Decision::Proceed(Some(ticket)) => {
            let object = real();
            // The program reads errno after a NULL: our bookkeeping must not change it.
            let saved = errno();
            with_state(|s, pid, _| {
                if object.is_null() {
                    s.failed(pid, ticket);
                } else {
                    s.created(pid, object as usize, ticket);
                }
            });
            set_errno(saved);
            object
        }
    }
}

/// A destroying hook: never refused; releases the ticket if it worked.
fn destroy(object: *mut c_void, real: impl FnOnce() -> c_int) -> c_int {
    let Some(_reentry) = Reentry::enter() else {
        return real();
    };
    let taken = with_state(|s, pid, _| s.take(pid, object as usize));
    let rc = real();
    let saved = errno();
    with_state(|s, pid, _| {
        if rc == 0 {
            s.release(pid, taken);
        } else {
            s.restore(pid, taken);
        }
    });
    set_errno(saved);
    rc
}

/// The real function is missing: fail like libibverbs would.
fn missing_object() -> *mut c_void {
    set_errno(libc::ENOSYS);
    ptr::null_mut()
}

macro_rules! real {
    ($name:literal, $version:literal, $ty:ty) => {{
        static REAL: Real = Real::new($name, $version);
        // SAFETY: the symbol is the libibverbs function of that name and
        // version, whose C prototype `$ty` mirrors.
        REAL.get()
            .map(|addr| unsafe { std::mem::transmute::<*mut c_void, $ty>(addr) })
    }};
}

type CreateQp = unsafe extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void;
type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CreateCq =
    unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void;
type RegMrIova = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64, c_int) -> *mut c_void;
type RegMrIova2 = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64, c_uint) -> *mut c_void;
type RegDmabufMr = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut c_void;

/// `struct ibv_qp *ibv_create_qp(struct ibv_pd *, struct ibv_qp_init_attr *)`, admitted as `QP_CREATE`.
///
/// # Safety
///
/// As for libibverbs' `ibv_create_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut c_void, attr: *mut c_void) -> *mut c_void {
    let Some(f) = real!(c"ibv_create_qp", c"IBVERBS_1.1", CreateQp) else {
        return missing_object();
    };
    create(Resource::Qp, 0, || unsafe { f(pd, attr) })
}

/// `int ibv_destroy_qp(struct ibv_qp *)`; releases the QP's ticket.
///
/// # Safety
///
/// As for libibverbs' `ibv_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut c_void) -> c_int {
    let Some(f) = real!(c"ibv_destroy_qp", c"IBVERBS_1.1", Destroy) else {
        return libc::ENOSYS;
    };
    destroy(qp, || unsafe { f(qp) })
}

/// `struct ibv_pd *ibv_alloc_pd(struct ibv_context *)`, admitted as `PD_ALLOC`.
///
/// # Safety
///
/// As for libibverbs' `ibv_alloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut c_void) -> *mut c_void {
    let Some(f) = real!(c"ibv_alloc_pd", c"IBVERBS_1.1", AllocPd) else {
        return missing_object();
    };
    create(Resource::Pd, 0, || unsafe { f(context) })
}

/// `int ibv_dealloc_pd(struct ibv_pd *)`; releases the PD's ticket.
///
/// # Safety
///
/// As for libibverbs' `ibv_dealloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut c_void) -> c_int {
    let Some(f) = real!(c"ibv_dealloc_pd", c"IBVERBS_1.1", Destroy) else {
        return libc::ENOSYS;
    };
    destroy(pd, || unsafe { f(pd) })
}

/// `struct ibv_cq *ibv_create_cq(struct ibv_context *, int cqe, void *cq_context,
/// struct ibv_comp_channel *, int comp_vector)`, admitted as `CQ_CREATE`.
///
/// # Safety
///
/// As for libibverbs' `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut c_void,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut c_void,
    comp_vector: c_int,
) -> *mut c_void {
    let Some(f) = real!(c"ibv_create_cq", c"IBVERBS_1.1", CreateCq) else {
        return missing_object();
    };
    create(Resource::Cq, 0, || unsafe {
        f(context, cqe, cq_context, channel, comp_vector)
    })
}

/// `int ibv_destroy_cq(struct ibv_cq *)`; releases the CQ's ticket.
///
/// # Safety
///
/// As for libibverbs' `ibv_destroy_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut c_void) -> c_int {
    let Some(f) = real!(c"ibv_destroy_cq", c"IBVERBS_1.1", Destroy) else {
        return libc::ENOSYS;
    };
    destroy(cq, || unsafe { f(cq) })
}

/// `struct ibv_mr *ibv_reg_mr(struct ibv_pd *, void *addr, size_t length, int access)`,
/// admitted as `MR_REG length`. What `ibv_rc_pingpong` imports (`@IBVERBS_1.1`).
///
/// # Safety
///
/// As for libibverbs' `ibv_reg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut c_void {
    let Some(f) = real!(c"ibv_reg_mr", c"IBVERBS_1.1", RegMr) else {
        return missing_object();
    };
    create(Resource::Mr, length as u64, || unsafe {
        f(pd, addr, length, access)
    })
}

/// `struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *, void *addr, size_t length,
/// uint64_t iova, int access)` (`@IBVERBS_1.7`), admitted as `MR_REG length`.
///
/// # Safety
///
/// As for libibverbs' `ibv_reg_mr_iova`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut c_void {
    let Some(f) = real!(c"ibv_reg_mr_iova", c"IBVERBS_1.7", RegMrIova) else {
        return missing_object();
    };
    create(Resource::Mr, length as u64, || unsafe {
        f(pd, addr, length, iova, access)
    })
}

/// `struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *, void *addr, size_t length,
/// uint64_t iova, unsigned int access)` (`@IBVERBS_1.8`), admitted as
/// `MR_REG length`. rdma-core's `ibv_reg_mr()` macro calls it when the access
/// flags are not a compile-time constant; perftest imports it.
///
/// # Safety
///
/// As for libibverbs' `ibv_reg_mr_iova2`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut c_void,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut c_void {
    let Some(f) = real!(c"ibv_reg_mr_iova2", c"IBVERBS_1.8", RegMrIova2) else {
        return missing_object();
    };
    create(Resource::Mr, length as u64, || unsafe {
        f(pd, addr, length, iova, access)
    })
}

/// `struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *, uint64_t offset, size_t length,
/// uint64_t iova, int fd, int access)` (`@IBVERBS_1.12`), admitted as `MR_REG length`.
///
/// # Safety
///
/// As for libibverbs' `ibv_reg_dmabuf_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    pd: *mut c_void,
    offset: u64,
    length: usize,
    iova: u64,
    fd: c_int,
    access: c_int,
) -> *mut c_void {
    let Some(f) = real!(c"ibv_reg_dmabuf_mr", c"IBVERBS_1.12", RegDmabufMr) else {
        return missing_object();
    };
    create(Resource::Mr, length as u64, || unsafe {
        f(pd, offset, length, iova, fd, access)
    })
}

/// `int ibv_dereg_mr(struct ibv_mr *)`; releases the MR's ticket and bytes.
///
/// # Safety
///
/// As for libibverbs' `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut c_void) -> c_int {
    let Some(f) = real!(c"ibv_dereg_mr", c"IBVERBS_1.1", Destroy) else {
        return libc::ENOSYS;
    };
    destroy(mr, || unsafe { f(mr) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::io;

    fn refused() -> io::Result<Thread> {
        Err(io::Error::from(io::ErrorKind::WouldBlock))
    }

    #[test]
    fn a_thread_that_cannot_start_is_reported_once_per_process() {
        let mut flusher = Flusher::None;
        let spawns = Cell::new(0);
        let spawn = || {
            spawns.set(spawns.get() + 1);
            refused()
        };
        assert!(matches!(flusher.wake(7, spawn), Wake::SendNow(Some(_))));
        // Every later release of that process goes at once, silently, and
        // no thread is tried again.
        for _ in 0..3 {
            assert!(matches!(flusher.wake(7, spawn), Wake::SendNow(None)));
        }
        assert_eq!(spawns.get(), 1);
        // A forked child tries for itself.
        assert!(matches!(flusher.wake(8, spawn), Wake::SendNow(Some(_))));
        assert_eq!(spawns.get(), 2);
    }

    #[test]
    fn a_started_thread_is_woken_not_started_again() {
        let mut flusher = Flusher::None;
        let spawns = Cell::new(0);
        let spawn = || {
            spawns.set(spawns.get() + 1);
            Ok(std::thread::current())
        };
        assert!(matches!(flusher.wake(7, spawn), Wake::Thread));
        assert!(matches!(flusher.wake(7, spawn), Wake::Thread));
        assert_eq!(spawns.get(), 1);
        assert!(matches!(flusher, Flusher::Running(7, _)));
        // A child of a fork has no copy of the thread.
        assert!(matches!(flusher.wake(8, spawn), Wake::Thread));
        assert_eq!(spawns.get(), 2);
    }
}
