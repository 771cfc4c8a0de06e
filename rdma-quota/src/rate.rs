//! Calls per second: enforcing a rate and reporting one.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The span a rate limit counts over.
const WINDOW: Duration = Duration::from_secs(1);

/// A sliding one-second window for "at most N calls per second".
///
/// A sliding window, unlike per-second buckets, never admits 2N calls
/// across a bucket boundary. It remembers only admitted calls, so it holds
/// at most `limit` instants.
///
/// `now` should not go backwards between calls (it comes from a monotonic
/// clock); if it does, the window errs towards refusing.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use rdma_quota::RateWindow;
///
/// let mut window = RateWindow::default();
/// let t0 = Instant::now();
/// assert!(window.try_acquire(t0, 2));
/// assert!(window.try_acquire(t0, 2));
/// assert!(!window.try_acquire(t0 + Duration::from_millis(999), 2));
/// assert!(window.try_acquire(t0 + Duration::from_secs(1), 2));
/// assert_eq!(window.current(t0 + Duration::from_secs(1)), 1);
/// ```
#[derive(Debug, Clone, Default)]
pub struct RateWindow {
    /// Admitted calls, oldest first.
    admitted: VecDeque<Instant>,
}

impl RateWindow {
    /// Admits and records one call at `now` if fewer than `limit` calls were
    /// admitted in the second before it; `limit == 0` means unlimited, as in
    /// quota files, and records nothing.
    pub fn try_acquire(&mut self, now: Instant, limit: u64) -> bool {
        if limit == 0 {
            return true;
        }
        self.expire(now);
        // `>=`, not `==`: a lowered limit can leave more calls than it allows.
        let cap = usize::try_from(limit).unwrap_or(usize::MAX);
        if self.admitted.len() >= cap {
            return false;
        }
        self.admitted.push_back(now);
        true
    }

    /// How long after `now` a call would be admitted under `limit` (zero if
    /// one would be admitted now), or `None` for no limit (`limit == 0`).
    ///
    /// This is when the oldest call that keeps the window full leaves it: the
    /// "retry after" a refused caller is told, so that it need not ask again
    /// before then.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use rdma_quota::RateWindow;
    ///
    /// let mut window = RateWindow::default();
    /// let t0 = Instant::now();
    /// assert!(window.try_acquire(t0, 2));
    /// assert!(window.try_acquire(t0 + Duration::from_millis(300), 2));
    /// let at = t0 + Duration::from_millis(400);
    /// assert_eq!(window.next_free(at, 2), Some(Duration::from_millis(600)));
    /// assert_eq!(window.next_free(at, 3), Some(Duration::ZERO));
    /// assert_eq!(window.next_free(at, 0), None);
    /// ```
    pub fn next_free(&self, now: Instant, limit: u64) -> Option<Duration> {
        if limit == 0 {
            return None;
        }
        let expired = self.admitted.partition_point(|t| expired(*t, now));
        let live = self.admitted.len() - expired;
        let cap = usize::try_from(limit).unwrap_or(usize::MAX);
        if live < cap {
            return Some(Duration::ZERO);
        }
        // With `live >= cap`, a call is admitted once `live - cap + 1` calls
        // have left: the one at index `live - cap` among the unexpired.
        let blocking = self.admitted[expired + (live - cap)];
        Some((blocking + WINDOW).saturating_duration_since(now))
    }

    /// How many calls were admitted in the second up to `now`.
    pub fn current(&self, now: Instant) -> u64 {
        let expired = self.admitted.partition_point(|t| expired(*t, now));
        u64::try_from(self.admitted.len() - expired).unwrap_or(u64::MAX)
    }

    fn expire(&mut self, now: Instant) {
        let expired = self.admitted.partition_point(|t| expired(*t, now));
        self.admitted.drain(..expired);
    }
}

fn expired(call: Instant, now: Instant) -> bool {
    now.saturating_duration_since(call) >= WINDOW
}

/// The calls per second between two readings of a cumulative counter.
///
/// A zero interval gives `0.0` rather than infinity. A counter that went
/// backwards was reset (its map was recreated or its process restarted), so
/// everything it now holds counts as new.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use rdma_quota::rate_per_second;
///
/// assert_eq!(rate_per_second(100, 150, Duration::from_secs(2)), 25.0);
/// assert_eq!(rate_per_second(100, 150, Duration::ZERO), 0.0);
/// assert_eq!(rate_per_second(100, 10, Duration::from_secs(1)), 10.0);
/// ```
pub fn rate_per_second(prev_total: u64, total: u64, elapsed: Duration) -> f64 {
    let seconds = elapsed.as_secs_f64();
    if seconds <= 0.0 {
        return 0.0;
    }
    let calls = total.checked_sub(prev_total).unwrap_or(total);
    // Precision loss above 2^53 calls is irrelevant for a report.
    calls as f64 / seconds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn admits_up_to_the_limit_within_a_second() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        for i in 0..3 {
            assert!(w.try_acquire(t0 + ms(i * 100), 3), "call {i}");
        }
        assert!(!w.try_acquire(t0 + ms(500), 3));
        assert!(!w.try_acquire(t0 + ms(999), 3));
        assert_eq!(w.current(t0 + ms(999)), 3);
        // The first call leaves the window exactly one second after it.
        assert!(w.try_acquire(t0 + ms(1000), 3));
        assert!(!w.try_acquire(t0 + ms(1050), 3));
        assert!(w.try_acquire(t0 + ms(1100), 3));
    }

    #[test]
    fn refused_calls_are_not_recorded() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        assert!(w.try_acquire(t0, 1));
        for i in 1..100 {
            assert!(!w.try_acquire(t0 + ms(i), 1));
        }
        assert_eq!(w.current(t0 + ms(100)), 1);
        // Refusals did not push the window out: the next second is open.
        assert!(w.try_acquire(t0 + ms(1000), 1));
    }

    #[test]
    fn memory_is_bounded_by_the_limit() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        for i in 0..10_000 {
            w.try_acquire(t0 + Duration::from_micros(i), 5);
        }
        assert_eq!(w.admitted.len(), 5);
        // Lowering the limit shrinks the window as calls expire, never grows it.
        assert!(!w.try_acquire(t0 + ms(20), 2));
        assert_eq!(w.admitted.len(), 5);
        assert!(w.try_acquire(t0 + ms(2000), 2));
        assert_eq!(w.admitted.len(), 1);
    }

    #[test]
    fn zero_limit_is_unlimited_and_records_nothing() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        for _ in 0..1000 {
            assert!(w.try_acquire(t0, 0));
        }
        assert_eq!(w.current(t0), 0);
    }

    #[test]
    fn current_decays_without_new_calls() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        for i in 0..4 {
            w.try_acquire(t0 + ms(i * 250), 10);
        }
        assert_eq!(w.current(t0 + ms(750)), 4);
        assert_eq!(w.current(t0 + ms(1000)), 3);
        assert_eq!(w.current(t0 + ms(1600)), 1);
        assert_eq!(w.current(t0 + ms(5000)), 0);
        // A reading from before the calls sees them all (saturating).
        assert_eq!(w.current(t0), 4);
    }

    #[test]
    fn next_free_is_when_the_blocking_call_leaves() {
        let t0 = Instant::now();
        let mut w = RateWindow::default();
        assert_eq!(w.next_free(t0, 2), Some(Duration::ZERO));
        for i in 0..3 {
            assert!(w.try_acquire(t0 + ms(i * 100), 3));
        }
        assert_eq!(w.next_free(t0 + ms(250), 3), Some(ms(750)));
        // The limit lowered to 2: the second call (at 100 ms) must leave.
        assert_eq!(w.next_free(t0 + ms(250), 2), Some(ms(850)));
        assert_eq!(w.next_free(t0 + ms(1000), 3), Some(Duration::ZERO));
        // Whatever next_free says, try_acquire agrees at that instant.
        let wait = w.next_free(t0 + ms(500), 3).expect("limited");
        assert!(!w.try_acquire(t0 + ms(500) + wait - ms(1), 3));
        assert!(w.try_acquire(t0 + ms(500) + wait, 3));
    }

    #[test]
    fn rate_per_second_edge_cases() {
        assert_eq!(rate_per_second(0, 0, Duration::from_secs(1)), 0.0);
        assert_eq!(rate_per_second(10, 30, ms(500)), 40.0);
        assert_eq!(rate_per_second(10, 30, Duration::ZERO), 0.0);
        assert_eq!(rate_per_second(30, 5, Duration::from_secs(5)), 1.0);
        assert_eq!(rate_per_second(u64::MAX, u64::MAX, ms(1)), 0.0);
        assert!(rate_per_second(0, u64::MAX, Duration::from_nanos(1)).is_finite());
    }
}
