//! Rate-limited logging: a hostile peer must not be able to fill the disk through our logs.
//!
//! A [`LogLimiter`] lets a burst of lines through, then at most a steady rate, and counts what
//! it held back so the next line that passes can say how many were suppressed.

use std::time::Duration;

use crate::clock::Coarse;

/// A token bucket for log lines.
///
/// ```
/// use std::time::Duration;
/// use secure_rdma::ratelimit::LogLimiter;
///
/// let mut limit = LogLimiter::new(2, Duration::from_secs(1));
/// assert_eq!(limit.check(), Some(0));
/// assert_eq!(limit.check(), Some(0));
/// assert_eq!(limit.check(), None); // burst used up: counted, not logged
/// ```
#[derive(Debug, Clone)]
pub struct LogLimiter {
    burst: u32,
    every: Duration,
    tokens: u32,
    /// The coarse clock: a check per message of a flood reads no clock device.
    refilled: Coarse,
    suppressed: u64,
}

impl LogLimiter {
    /// Up to `burst` lines at once, then one more per `every`.
    pub fn new(burst: u32, every: Duration) -> LogLimiter {
        LogLimiter {
            burst: burst.max(1),
            every,
            tokens: burst.max(1),
            refilled: Coarse::now(),
            suppressed: 0,
        }
    }

    /// `Some(n)` when this line may be logged, `n` being how many were suppressed since the
    /// last one that was; `None` when it must be dropped (it is counted).
    pub fn check(&mut self) -> Option<u64> {
        let now = Coarse::now();
        if !self.every.is_zero() {
            let earned = now.since(self.refilled).as_nanos() / self.every.as_nanos();
            if earned > 0 {
                let earned = u32::try_from(earned).unwrap_or(u32::MAX);
                self.tokens = self.tokens.saturating_add(earned).min(self.burst);
                self.refilled = now;
            }
        }
        if self.tokens == 0 {
            self.suppressed += 1;
            return None;
        }
        self.tokens -= 1;
        Some(std::mem::take(&mut self.suppressed))
    }

    /// Lines dropped since the last one that passed.
    pub fn suppressed(&self) -> u64 {
        self.suppressed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_passes_the_burst_then_the_rate_and_counts_the_rest() {
        let mut l = LogLimiter::new(10, Duration::from_millis(100));
        let passed = (0..100_000).filter(|_| l.check().is_some()).count();
        // 10 at once, plus at most a few refills while the loop ran.
        assert!((10..=20).contains(&passed), "{passed}");
        assert_eq!(l.suppressed(), 100_000 - passed as u64);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(l.check(), Some(100_000 - passed as u64));
    }
}
