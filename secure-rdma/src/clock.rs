//! The data path's time: timeouts that read no clock when the wait is already over, and a
//! coarse clock for what is counted in seconds.
//!
//! Reading the clock is cheap on a host whose TSC the kernel trusts: `clock_gettime` is then
//! answered in user space by the vDSO. It is not cheap everywhere. When the kernel does not
//! trust the TSC (its watchdog marks it unstable, as it does in the lab's emulated VM in many
//! boots) it falls back to the HPET, and then every precise read is a system call and an
//! emulated device access: counted in the lab VM with `strace`, 9.5 such calls per message of
//! `bench send` on the client and 13.9 on the server, where `ib_send_lat` makes none (it reads
//! the TSC itself). Two tools keep the per-message path off the precise clock (the counts are
//! 5.7 and 7.4-8.2 with them; the rest is tokio's time driver and the benchmark's own timing):
//!
//! - [`within`] bounds a wait from its first poll that did not complete: a completion already
//!   in the queue, or found within a busy poll's spin, costs no clock read and no timer.
//! - [`Coarse`] reads `CLOCK_MONOTONIC_COARSE`, which the vDSO answers from the kernel's tick
//!   without touching the clock device, whatever the clock source: precise to a tick (1 to
//!   10 ms), for thresholds counted in seconds (a key's age, a session's idle time) and in
//!   tenths of seconds (a log limiter).

use std::future::Future;
use std::task::Poll;
use std::time::Duration;

pub use tokio::time::error::Elapsed;

/// Awaits `fut` for at most `limit`, counted from its first poll that did not complete (a
/// future that completes at once never starts a timer).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// use std::time::Duration;
/// use secure_rdma::clock::within;
/// // Ready at once: no clock read, no timer.
/// assert_eq!(within(Duration::from_secs(1), async { 7 }).await, Ok(7));
/// // Never ready: the timeout is an error, as with tokio::time::timeout.
/// assert!(within(Duration::from_millis(5), std::future::pending::<()>()).await.is_err());
/// # }
/// ```
pub async fn within<F: Future>(limit: Duration, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = std::pin::pin!(fut);
    let first = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(output) => Ok(output),
        Poll::Pending => tokio::time::timeout(limit, fut).await,
    }
}

/// An instant of the coarse monotonic clock (`CLOCK_MONOTONIC_COARSE`): as cheap to read as a
/// memory load, precise to the kernel's tick.
///
/// ```
/// use secure_rdma::clock::Coarse;
/// let then = Coarse::now();
/// std::thread::sleep(std::time::Duration::from_millis(30));
/// // At least what passed, less up to one tick.
/// assert!(then.elapsed() >= std::time::Duration::from_millis(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Coarse(Duration);

impl Coarse {
    /// Now, to the kernel's last tick.
    pub fn now() -> Coarse {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC_COARSE exists on every
        // Linux since 2.6.32, and a clock that cannot fail to be read leaves no error to handle
        // (the zero it would leave is a valid, if early, instant).
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
        let nanos = u32::try_from(ts.tv_nsec).unwrap_or(0);
        Coarse(Duration::new(secs, nanos))
    }

    /// How long ago this was (zero for an instant not yet reached).
    pub fn elapsed(self) -> Duration {
        Coarse::now().since(self)
    }

    /// How long after `earlier` this is (zero if it is not after it).
    pub fn since(self, earlier: Coarse) -> Duration {
        self.0.saturating_sub(earlier.0)
    }
}

/// The latest [`Coarse`] instant any of several tasks noted (a session's lanes noting their
/// arrivals for its idle timeout): one relaxed atomic, no lock.
#[derive(Debug, Default)]
pub(crate) struct LatestCoarse(std::sync::atomic::AtomicU64);

impl LatestCoarse {
    /// Notes now; an earlier instant noted later does not move it back.
    pub(crate) fn note_now(&self) {
        // Nanoseconds of the monotonic clock fit in 64 bits for 584 years of uptime.
        let nanos = u64::try_from(Coarse::now().0.as_nanos()).unwrap_or(u64::MAX);
        self.0
            .fetch_max(nanos, std::sync::atomic::Ordering::Relaxed);
    }

    /// The latest instant noted, `None` before the first.
    pub(crate) fn get(&self) -> Option<Coarse> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            nanos => Some(Coarse(Duration::from_nanos(nanos))),
        }
    }
}

#[cfg(test)]
impl Coarse {
    /// The instant `by` before this one (the clock's zero at the earliest): how a test ages
    /// a stamp without waiting.
    pub(crate) fn earlier_by(self, by: Duration) -> Coarse {
        Coarse(self.0.saturating_sub(by))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A future pending on its first poll and ready on the next is still bounded: the wait
    /// after the first poll is the timed one.
    #[tokio::test]
    async fn a_wait_that_waits_is_bounded_from_its_first_pending_poll() {
        let slow = tokio::time::sleep(Duration::from_secs(10));
        let began = std::time::Instant::now();
        assert!(within(Duration::from_millis(50), slow).await.is_err());
        let took = began.elapsed();
        assert!(
            took >= Duration::from_millis(50) && took < Duration::from_secs(5),
            "{took:?}"
        );
        let quick = tokio::time::sleep(Duration::from_millis(10));
        assert_eq!(within(Duration::from_secs(5), quick).await, Ok(()));
    }

    /// What completes at its first poll registers no timer: it is returned even with no time
    /// left, where tokio's timeout (which reads the clock first) says it elapsed.
    #[tokio::test]
    async fn what_is_ready_at_its_first_poll_is_returned_even_with_no_time_left() {
        assert_eq!(within(Duration::ZERO, async { "done" }).await, Ok("done"));
        assert!(
            tokio::time::timeout(Duration::ZERO, std::future::pending::<()>())
                .await
                .is_err()
        );
    }

    /// The coarse clock keeps pace with the precise one, to a tick (at most 10 ms at HZ=100).
    #[test]
    fn the_coarse_clock_follows_the_precise_one_to_a_tick() {
        let (coarse, precise) = (Coarse::now(), std::time::Instant::now());
        std::thread::sleep(Duration::from_millis(50));
        let (c, p) = (coarse.elapsed(), precise.elapsed());
        let tick = Duration::from_millis(10);
        assert!(
            c + tick >= p && c <= p + tick,
            "coarse {c:?}, precise {p:?}"
        );
        assert_eq!(Coarse::now().since(Coarse(Duration::MAX)), Duration::ZERO);
    }

    /// What several tasks note is kept as the latest of them, and nothing reads as noted
    /// before the first note.
    #[test]
    fn the_latest_of_several_notes_is_kept() {
        let latest = LatestCoarse::default();
        assert_eq!(latest.get(), None);
        let before = Coarse::now();
        latest.note_now();
        let first = latest.get().expect("noted");
        assert!(first >= before, "{first:?} {before:?}");
        std::thread::sleep(Duration::from_millis(30));
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| latest.note_now());
            }
        });
        let last = latest.get().expect("noted");
        assert!(
            last.since(first) >= Duration::from_millis(10),
            "{last:?} {first:?}"
        );
    }
}
