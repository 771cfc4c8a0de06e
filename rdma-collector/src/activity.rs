//! What the collector did, counted, and how much of it reaches the log.
//!
//! Under load a line per decision is a denial of service on the log (65,536
//! tickets wrote 11 MB in 0.4 s), so decisions are logged at `debug` and
//! counted here; [`Activity::summary`] gives the periodic `info` line.
//! Warnings a client can provoke (refusals, denials, malformed requests,
//! accept errors) go through a [`Throttle`] that says how many it held back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most `burst` lines per `period`; counts the ones it suppressed.
#[derive(Debug)]
pub(crate) struct Throttle {
    period: Duration,
    burst: u32,
    start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

impl Throttle {
    pub(crate) const fn new(period: Duration, burst: u32) -> Throttle {
        Throttle {
            period,
            burst,
            start: None,
            used: 0,
            suppressed: 0,
        }
    }

    /// `Some(n)` if a line may be written now, `n` being how many were
    /// suppressed since the last one written; `None` to suppress this one.
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        let fresh = self
            .start
            .is_none_or(|s| now.saturating_duration_since(s) >= self.period);
        if fresh {
            self.start = Some(now);
            self.used = 0;
        }
        if self.used < self.burst {
            self.used += 1;
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// Which throttle a kind of line goes through.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Noisy {
    /// `DENY` replies (quota and collector caps).
    Deny,
    /// Connections refused or closed for a protocol error.
    Refused,
    /// `accept` failures (EMFILE and friends).
    Accept,
}

/// Counters since start; [`Activity::summary`] reports the change since the
/// last summary.
#[derive(Debug)]
pub(crate) struct Activity {
    pub(crate) admitted: AtomicU64,
    pub(crate) denied: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) connected: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) idle_closed: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) accept_errors: AtomicU64,
    /// Well-formed requests served (`HELLO`, `ADMIT`, `RELEASE`, `STATS`).
    pub(crate) requests: AtomicU64,
    /// Writes of replies: requests that came in one write (an interceptor's
    /// waiting `RELEASE`s and its next `ADMIT`) are answered in one, so
    /// `requests - writes` is the work batching saved.
    pub(crate) writes: AtomicU64,
    throttles: Mutex<[Throttle; 3]>,
    last: Mutex<[u64; 11]>,
}

impl Default for Activity {
    fn default() -> Self {
        // Ten lines a second of each kind: enough to see what happens, bounded
        // at a few KB/s whatever a client does.
        let t = || Throttle::new(Duration::from_secs(1), 10);
        Activity {
            admitted: AtomicU64::new(0),
            denied: AtomicU64::new(0),
            released: AtomicU64::new(0),
            connected: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
            idle_closed: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
            requests: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            throttles: Mutex::new([t(), t(), t()]),
            last: Mutex::new([0; 11]),
        }
    }
}

/// Adds one to a counter.
pub(crate) fn count(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Activity {
    /// Whether a line of this kind may be logged now, and how many of its kind
    /// were suppressed before it.
    pub(crate) fn allow(&self, kind: Noisy) -> Option<u64> {
        let mut throttles = self.throttles.lock().unwrap_or_else(|e| e.into_inner());
        throttles[kind as usize].allow(Instant::now())
    }

    fn now(&self) -> [u64; 11] {
        [
            &self.admitted,
            &self.denied,
            &self.released,
            &self.connected,
            &self.refused,
            &self.evicted,
            &self.idle_closed,
            &self.malformed,
            &self.accept_errors,
            &self.requests,
            &self.writes,
        ]
        .map(|c| c.load(Ordering::Relaxed))
    }

    /// The counts since the previous call, as `key=value` pairs, or `None` if
    /// nothing happened.
    pub(crate) fn summary(&self) -> Option<String> {
        let now = self.now();
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let delta: Vec<u64> = now.iter().zip(last.iter()).map(|(n, l)| n - l).collect();
        *last = now;
        if delta.iter().all(|d| *d == 0) {
            return None;
        }
        let names = [
            "admitted",
            "denied",
            "released",
            "connected",
            "refused",
            "evicted",
            "idle_closed",
            "malformed",
            "accept_errors",
            "requests",
            "writes",
        ];
        Some(
            names
                .iter()
                .zip(delta)
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn throttle_allows_a_burst_per_period_and_counts_the_rest() {
        let mut t = Throttle::new(Duration::from_secs(1), 2);
        let t0 = Instant::now();
        assert_eq!(t.allow(t0), Some(0));
        assert_eq!(t.allow(t0), Some(0));
        assert_eq!(t.allow(t0), None);
        assert_eq!(t.allow(t0 + Duration::from_millis(500)), None);
        assert_eq!(t.allow(t0 + Duration::from_secs(1)), Some(2));
    }

    #[test]
    fn summaries_report_changes_only() {
        let a = Activity::default();
        assert_eq!(a.summary(), None);
        count(&a.admitted);
        count(&a.admitted);
        count(&a.denied);
        let line = a.summary().expect("changed");
        assert!(line.starts_with("admitted=2 denied=1 released=0"), "{line}");
        assert_eq!(a.summary(), None);
    }
}
