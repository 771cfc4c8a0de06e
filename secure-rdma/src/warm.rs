//! The warm path: a connection's RDMA resources made before it asks for them.
//!
//! Making a session's protection domain, completion queues, memory regions and queue pair is
//! most of its RDMA setup (each is a system call, and rxe zeroes and pins the memory). A
//! [`WarmPool`] keeps up to a target number of them ready, and a background thread makes new
//! ones as they are taken, so a new session or lane only moves a ready QP to RTR and RTS and
//! confirms it.
//!
//! **An item serves once.** A taken item belongs to the taker and is freed with it; nothing is
//! ever put back. So nothing of one session can reach another: its QP (and so its PSNs), its
//! keys, its memory window and rkey, and the bytes of its slots are all made for it alone. The
//! pool trades memory (the ready items) for time, never isolation.
//!
//! The refill thread is named `warm-refill`: a per-thread trace of the verbs a process calls
//! (rdma-monitor's events name the calling thread) tells the pool's creations apart from a
//! connection's.
//!
//! [`WarmPool`] is generic over what it keeps, so its bounds and refill are tested without a
//! device; [`WarmPools`] keeps one pool of [`Resources`] per device, GID and [`Shape`].

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::session::{Prepared, Resources, Secrets, SessionConfig, SessionError, Shape};
use crate::verbs::{Device, GidEntry};

/// A failed creation is retried after this long, doubling up to [`MAX_BACKOFF`]: a device
/// that refuses (a quota, the rdma cgroup, resources exhausted) must not be asked in a loop.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// What a pool has done since it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct WarmStats {
    /// Items ready now.
    pub ready: usize,
    /// Items handed out.
    pub taken: u64,
    /// Takes that found no ready item (the caller made its own).
    pub missed: u64,
    /// Items found unusable when taken, and freed.
    pub discarded: u64,
    /// Items the refill made.
    pub made: u64,
    /// Creations that failed.
    pub failed: u64,
}

struct State<T> {
    ready: VecDeque<T>,
    stop: bool,
}

struct Shared<T> {
    state: Mutex<State<T>>,
    /// Wakes the refill (an item taken, or stop) and those waiting for items.
    changed: Condvar,
    target: usize,
    healthy: Box<dyn Fn(&T) -> bool + Send + Sync>,
    taken: AtomicU64,
    missed: AtomicU64,
    discarded: AtomicU64,
    made: AtomicU64,
    failed: AtomicU64,
}

impl<T> Shared<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic elsewhere while holding the lock leaves a queue that is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Up to `target` items made ahead of time, refilled by a thread of its own.
///
/// ```
/// use secure_rdma::warm::WarmPool;
/// use std::time::Duration;
///
/// // Items are anything made ahead; a session's are `secure_rdma::session::Resources`.
/// let mut next = 0u32;
/// let pool = WarmPool::new(2, move || { next += 1; Ok::<_, String>(next) }, |_| true)?;
/// assert!(pool.wait_ready(2, Duration::from_secs(5)));
/// assert_eq!(pool.take(), Some(1));
/// assert!(pool.wait_ready(2, Duration::from_secs(5))); // refilled: 2 and 3 ready
/// assert_eq!(pool.stats().taken, 1);
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct WarmPool<T: Send + 'static> {
    shared: Arc<Shared<T>>,
    refill: Option<std::thread::JoinHandle<()>>,
}

impl<T: Send + 'static> std::fmt::Debug for WarmPool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmPool")
            .field("target", &self.shared.target)
            .field("stats", &self.stats())
            .finish()
    }
}

impl<T: Send + 'static> WarmPool<T> {
    /// A pool that keeps `target` items made by `make` ready; `healthy` is asked of each item
    /// as it is taken, and an item it refuses is freed and the next one tried. The refill
    /// thread starts at once. Fails only if the thread cannot be started.
    pub fn new<M, E, H>(target: usize, make: M, healthy: H) -> std::io::Result<WarmPool<T>>
    where
        M: FnMut() -> Result<T, E> + Send + 'static,
        E: std::fmt::Display,
        H: Fn(&T) -> bool + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                ready: VecDeque::with_capacity(target),
                stop: false,
            }),
            changed: Condvar::new(),
            target,
            healthy: Box::new(healthy),
            taken: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            discarded: AtomicU64::new(0),
            made: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        });
        let refill = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("warm-refill".into())
                .spawn(move || refill(&shared, make))?
        };
        Ok(WarmPool {
            shared,
            refill: Some(refill),
        })
    }

    /// A ready item, or `None` when none is (the caller makes its own, as without a pool).
    /// Wakes the refill either way.
    pub fn take(&self) -> Option<T> {
        loop {
            let item = self.shared.lock().ready.pop_front();
            self.shared.changed.notify_all();
            let Some(item) = item else {
                self.shared.missed.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            // Asked outside the lock: for a QP it is a system call, and the refill must be
            // able to add items meanwhile.
            if (self.shared.healthy)(&item) {
                self.shared.taken.fetch_add(1, Ordering::Relaxed);
                return Some(item);
            }
            self.shared.discarded.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("a warm resource was no longer usable; freed, trying the next");
        }
    }

    /// Waits until at least `n` items are ready (at most the target), up to `timeout`; says
    /// whether they are. For a caller that wants the pool full before a burst.
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> bool {
        let n = n.min(self.shared.target);
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        while state.ready.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self
                .shared
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// The items ready and what the pool has done.
    pub fn stats(&self) -> WarmStats {
        WarmStats {
            ready: self.shared.lock().ready.len(),
            taken: self.shared.taken.load(Ordering::Relaxed),
            missed: self.shared.missed.load(Ordering::Relaxed),
            discarded: self.shared.discarded.load(Ordering::Relaxed),
            made: self.shared.made.load(Ordering::Relaxed),
            failed: self.shared.failed.load(Ordering::Relaxed),
        }
    }

    /// How many items the pool keeps ready.
    pub fn target(&self) -> usize {
        self.shared.target
    }
}

impl<T: Send + 'static> Drop for WarmPool<T> {
    /// Stops the refill (after the item it is making, if any) and frees every ready item.
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.refill.take() {
            let _ = t.join();
        }
        let ready = std::mem::take(&mut self.shared.lock().ready);
        drop(ready);
    }
}

/// The refill thread: makes items while fewer than the target are ready, sleeps otherwise.
fn refill<T, M, E>(shared: &Shared<T>, mut make: M)
where
    M: FnMut() -> Result<T, E>,
    E: std::fmt::Display,
{
    // The refill is never urgent (a connection that finds no ready set makes its own), and on
    // a machine whose cores are busy it would take them from the connections it works for:
    // this thread alone runs at nice 10 (Linux's nice is per thread). Best effort: a failure
    // leaves it at the process's priority.
    // SAFETY: setpriority reads no memory of ours; it changes only this thread's priority.
    let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 10) };
    let mut backoff = FIRST_BACKOFF;
    let mut state = shared.lock();
    loop {
        if state.stop {
            return;
        }
        if state.ready.len() >= shared.target {
            state = shared
                .changed
                .wait(state)
                .unwrap_or_else(|p| p.into_inner());
            continue;
        }
        drop(state);
        // Made without the lock: takers are never held up by a creation.
        match make() {
            Ok(item) => {
                shared.made.fetch_add(1, Ordering::Relaxed);
                backoff = FIRST_BACKOFF;
                state = shared.lock();
                state.ready.push_back(item);
                shared.changed.notify_all();
            }
            Err(e) => {
                let failures = shared.failed.fetch_add(1, Ordering::Relaxed) + 1;
                // The first failure of a streak, then every tenth: a refusing device must not
                // flood the log.
                if backoff == FIRST_BACKOFF || failures.is_multiple_of(10) {
                    tracing::warn!(error = %e, failures, retry_in_ms = backoff.as_millis() as u64, "the warm pool could not make a resource; connections make their own meanwhile");
                }
                state = shared.lock();
                if !state.stop {
                    state = shared
                        .changed
                        .wait_timeout(state, backoff)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Pools of session [`Resources`], one per device, GID and [`Shape`], made as connections
/// first need them: the first connection of a kind makes its own and starts the pool, the
/// next ones take from it. At most [`WarmPools::MAX_POOLS`] kinds are kept, so a peer choosing
/// many sizes cannot make the server keep many pools.
pub struct WarmPools {
    per_pool: usize,
    pools: Mutex<HashMap<PoolKey, Arc<WarmPool<Resources>>>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct PoolKey {
    device: String,
    gid_index: u32,
    gid: crate::verbs::Gid,
    shape: Shape,
}

impl std::fmt::Debug for WarmPools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmPools")
            .field("per_pool", &self.per_pool)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Whether a [`WarmPools::take`] found a ready resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// A ready resource was taken.
    Warm,
    /// None was ready (or no pool serves this kind yet): the caller makes its own.
    Cold,
}

impl Path {
    /// `warm` or `cold`, as metrics label it.
    pub fn name(self) -> &'static str {
        match self {
            Path::Warm => "warm",
            Path::Cold => "cold",
        }
    }
}

impl WarmPools {
    /// Kinds of resources (device, GID, shape) kept at once.
    pub const MAX_POOLS: usize = 4;

    /// Pools of `per_pool` ready resources each.
    pub fn new(per_pool: usize) -> WarmPools {
        WarmPools {
            per_pool,
            pools: Mutex::new(HashMap::new()),
        }
    }

    /// A ready resource for a session of `config` on `device` from `sgid`, if one is. The first
    /// request of a kind starts its pool and gets `None`.
    pub fn take(
        &self,
        device: &Arc<Device>,
        sgid: &GidEntry,
        config: &SessionConfig,
    ) -> Option<Resources> {
        if self.per_pool == 0 {
            return None;
        }
        let key = PoolKey {
            device: device.name().to_owned(),
            gid_index: sgid.index,
            gid: sgid.gid,
            shape: config.shape(),
        };
        let pool = {
            let mut pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
            match pools.get(&key) {
                Some(p) => Arc::clone(p),
                None => {
                    if pools.len() >= Self::MAX_POOLS {
                        return None;
                    }
                    // A CQ's completion channel is registered with the tokio runtime that
                    // will poll it: the refill thread makes them inside the caller's runtime.
                    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                        tracing::warn!("no tokio runtime to register warm resources with; connections make their own");
                        return None;
                    };
                    let (device, sgid, config) = (Arc::clone(device), sgid.clone(), *config);
                    match WarmPool::new(
                        self.per_pool,
                        move || {
                            let _runtime = runtime.enter();
                            Resources::new(&device, sgid.clone(), &config)
                        },
                        Resources::is_ready,
                    ) {
                        Ok(p) => {
                            tracing::info!(device = %key.device, gid_index = key.gid_index, size = self.per_pool, "warm pool started");
                            pools.insert(key, Arc::new(p));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot start the warm pool's thread; connections make their own resources")
                        }
                    }
                    return None;
                }
            }
        };
        pool.take()
    }

    /// A session's (or lane's) resources with its `secrets`, from a ready resource when one is
    /// ([`Path::Warm`]), made now otherwise ([`Path::Cold`]), as [`Prepared::new`] would.
    pub fn prepare(
        &self,
        device: &Arc<Device>,
        sgid: &GidEntry,
        secrets: Secrets,
        config: SessionConfig,
    ) -> (Result<Prepared, SessionError>, Path) {
        match self.take(device, sgid, &config) {
            Some(ready) => (Prepared::from_resources(ready, secrets, config), Path::Warm),
            None => (
                Prepared::new(device, sgid.clone(), secrets, config),
                Path::Cold,
            ),
        }
    }

    /// Every pool's counts, added up.
    pub fn stats(&self) -> WarmStats {
        let pools = self.pools.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .values()
            .map(|p| p.stats())
            .fold(WarmStats::default(), |a, s| WarmStats {
                ready: a.ready + s.ready,
                taken: a.taken + s.taken,
                missed: a.missed + s.missed,
                discarded: a.discarded + s.discarded,
                made: a.made + s.made,
                failed: a.failed + s.failed,
            })
    }

    /// Waits until every pool started so far is full, up to `timeout` in all; says whether
    /// they are.
    pub fn wait_full(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let pools: Vec<_> = self
            .pools
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        pools.iter().all(|p| {
            p.wait_ready(
                p.target(),
                deadline.saturating_duration_since(Instant::now()),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    fn counting(target: usize) -> (WarmPool<u32>, Arc<AtomicU64>) {
        let made = Arc::new(AtomicU64::new(0));
        let m = Arc::clone(&made);
        let pool = WarmPool::new(
            target,
            move || Ok::<_, String>(m.fetch_add(1, Ordering::SeqCst) as u32 + 1),
            |_| true,
        )
        .unwrap();
        (pool, made)
    }

    #[test]
    fn fills_to_its_target_and_no_further() {
        let (pool, made) = counting(3);
        assert!(pool.wait_ready(3, Duration::from_secs(5)));
        // The refill sleeps once full: nothing more is made however long we wait.
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(made.load(Ordering::SeqCst), 3);
        assert_eq!(pool.stats().ready, 3);
        assert_eq!(pool.stats().made, 3);
    }

    #[test]
    fn each_take_is_refilled_and_items_are_never_handed_out_twice() {
        let (pool, _) = counting(2);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..20 {
            assert!(pool.wait_ready(2, Duration::from_secs(5)));
            let item = pool.take().expect("a ready item");
            assert!(seen.insert(item), "item {item} handed out twice");
        }
        assert!(pool.wait_ready(2, Duration::from_secs(5)));
        let s = pool.stats();
        assert_eq!((s.taken, s.missed, s.made, s.ready), (20, 0, 22, 2));
    }

    #[test]
    fn an_empty_pool_misses_and_the_caller_goes_on() {
        // A make that blocks until released: the pool stays empty meanwhile.
        let release = Arc::new((Mutex::new(false), Condvar::new()));
        let r = Arc::clone(&release);
        let pool = WarmPool::new(
            1,
            move || {
                let (lock, cv) = &*r;
                let mut open = lock.lock().unwrap();
                while !*open {
                    open = cv.wait(open).unwrap();
                }
                Ok::<_, String>(7u32)
            },
            |_| true,
        )
        .unwrap();
        assert_eq!(pool.take(), None);
        assert_eq!(pool.stats().missed, 1);
        *release.0.lock().unwrap() = true;
        release.1.notify_all();
        assert!(pool.wait_ready(1, Duration::from_secs(5)));
        assert_eq!(pool.take(), Some(7));
    }

    #[test]
    fn a_poisoned_item_is_discarded_and_the_next_one_taken() {
        // Odd items go bad while they wait.
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let mut next = 0u32;
        let pool = WarmPool::new(
            4,
            move || {
                next += 1;
                Ok::<_, String>(next)
            },
            move |item: &u32| {
                let ok = item.is_multiple_of(2);
                if !ok {
                    let _ = tx.send(*item);
                }
                ok
            },
        )
        .unwrap();
        assert!(pool.wait_ready(4, Duration::from_secs(5)));
        assert_eq!(pool.take(), Some(2));
        assert_eq!(rx.try_recv(), Ok(1), "item 1 was judged and refused");
        assert_eq!(pool.stats().discarded, 1);
        assert_eq!(pool.stats().taken, 1);
    }

    #[test]
    fn failed_creations_back_off_instead_of_spinning() {
        let tries = Arc::new(AtomicU64::new(0));
        let t = Arc::clone(&tries);
        let pool: WarmPool<u32> = WarmPool::new(
            2,
            move || {
                t.fetch_add(1, Ordering::SeqCst);
                Err("device refuses")
            },
            |_| true,
        )
        .unwrap();
        std::thread::sleep(Duration::from_millis(450));
        // 100 + 200 ms of backoff fit in 450 ms: 2 or 3 tries, not thousands.
        let n = tries.load(Ordering::SeqCst);
        assert!((1..=4).contains(&n), "{n} tries in 450 ms");
        assert_eq!(pool.take(), None);
        assert!(pool.stats().failed >= 1);
        assert_eq!(pool.stats().made, 0);
    }

    #[test]
    fn dropping_the_pool_stops_its_thread_and_frees_every_ready_item() {
        struct Tracked(Arc<AtomicU64>);
        impl Drop for Tracked {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let freed = Arc::new(AtomicU64::new(0));
        let made_after_drop = Arc::new(AtomicBool::new(false));
        let dropped = Arc::new(AtomicBool::new(false));
        let (f, d, late) = (
            Arc::clone(&freed),
            Arc::clone(&dropped),
            Arc::clone(&made_after_drop),
        );
        let pool = WarmPool::new(
            3,
            move || {
                late.fetch_or(d.load(Ordering::SeqCst), Ordering::SeqCst);
                Ok::<_, String>(Tracked(Arc::clone(&f)))
            },
            |_| true,
        )
        .unwrap();
        assert!(pool.wait_ready(3, Duration::from_secs(5)));
        let taken = pool.take();
        drop(pool);
        dropped.store(true, Ordering::SeqCst);
        // The thread was joined by the drop: nothing runs the make any more.
        std::thread::sleep(Duration::from_millis(50));
        assert!(!made_after_drop.load(Ordering::SeqCst));
        // The refill had made a fourth to replace the taken one (or was making it): every
        // item but the taken one is freed by the drop.
        let freed_by_drop = freed.load(Ordering::SeqCst);
        assert!((2..=3).contains(&freed_by_drop), "{freed_by_drop} freed");
        drop(taken);
        assert_eq!(freed.load(Ordering::SeqCst), freed_by_drop + 1);
    }
}
