//! Whether the server's own connection setup has slowed: the median RDMA setup (PD, CQs, MRs,
//! QP to RTS) of the last few sessions against the calmest median seen so far.
//!
//! Another tenant flooding the RDMA control path (creating and destroying objects in a loop)
//! slows every setup on the host: in the lab the victim's median went from 10.7 ms to 27.2 ms.
//! The server cannot see the other tenant, but it sees its own setups; [`SetupWatch`] turns
//! them into one signal, raised once when the median of the last
//! [`window`](SetupWatchConfig::window) setups reaches [`factor`](SetupWatchConfig::factor)
//! times the baseline, and lowered once when it is back below halfway between the two.
//!
//! The baseline is the lowest median of any [`window`](SetupWatchConfig::window) consecutive
//! setups seen so far, so a server that starts under a flood learns its calm speed once the
//! flood stops (and reports nothing until then).
//!
//! ```
//! use std::time::Duration;
//! use secure_rdma::setup_watch::{SetupChange, SetupWatch, SetupWatchConfig};
//!
//! let mut watch = SetupWatch::new(SetupWatchConfig::new(5, 2.0));
//! let ms = Duration::from_millis;
//! for _ in 0..5 {
//!     assert_eq!(watch.observe(ms(10)), None);
//! }
//! let mut changes = Vec::new();
//! for _ in 0..5 {
//!     changes.extend(watch.observe(ms(30)));
//! }
//! assert!(matches!(changes[..], [SetupChange::Slowed { .. }]));
//! ```

use std::collections::VecDeque;
use std::time::Duration;

/// How [`SetupWatch`] judges: over how many setups, and how much slower is slow.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct SetupWatchConfig {
    /// Setups the median is taken over (at least 1).
    pub window: usize,
    /// The median is slow at this multiple of the baseline or more; 0 turns the watch off.
    pub factor: f64,
}

impl SetupWatchConfig {
    /// Judges the median of the last `window` setups against `factor` times the baseline.
    pub fn new(window: usize, factor: f64) -> SetupWatchConfig {
        SetupWatchConfig {
            window: window.max(1),
            factor,
        }
    }

    /// The watch switched off.
    pub fn off() -> SetupWatchConfig {
        SetupWatchConfig::new(1, 0.0)
    }

    /// Whether it judges anything.
    pub fn is_on(&self) -> bool {
        self.factor > 0.0
    }
}

impl Default for SetupWatchConfig {
    /// The median of the last 20 setups at twice the baseline (the lab's floods made it 2.5x).
    fn default() -> Self {
        SetupWatchConfig::new(20, 2.0)
    }
}

/// The setup speed crossing the line, as [`SetupWatch::observe`] reports it.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum SetupChange {
    /// The median reached `factor` times the baseline.
    Slowed {
        /// The median of the last `window` setups.
        median: Duration,
        /// The calm median.
        baseline: Duration,
    },
    /// The median is back below halfway between the baseline and the slow line.
    Recovered {
        /// The median of the last `window` setups.
        median: Duration,
        /// The calm median.
        baseline: Duration,
    },
}

/// The server's setup speed over its last sessions (see the module docs).
#[derive(Debug, Clone)]
pub struct SetupWatch {
    config: SetupWatchConfig,
    recent: VecDeque<Duration>,
    baseline: Option<Duration>,
    median: Option<Duration>,
    slow: bool,
}

impl SetupWatch {
    /// A watch with no setup seen yet.
    pub fn new(config: SetupWatchConfig) -> SetupWatch {
        SetupWatch {
            config,
            recent: VecDeque::with_capacity(config.window),
            baseline: None,
            median: None,
            slow: false,
        }
    }

    /// Records one setup's duration; returns the change it caused, if any.
    pub fn observe(&mut self, took: Duration) -> Option<SetupChange> {
        if !self.config.is_on() {
            return None;
        }
        if self.recent.len() == self.config.window {
            self.recent.pop_front();
        }
        self.recent.push_back(took);
        if self.recent.len() < self.config.window {
            return None;
        }
        let mut sorted: Vec<Duration> = self.recent.iter().copied().collect();
        sorted.sort();
        let median = sorted[sorted.len() / 2];
        self.median = Some(median);
        let baseline = *self
            .baseline
            .insert(self.baseline.map_or(median, |b| b.min(median)));
        let slow_line = baseline.mul_f64(self.config.factor);
        let clear_line = baseline.mul_f64((1.0 + self.config.factor) / 2.0);
        if !self.slow && median >= slow_line {
            self.slow = true;
            Some(SetupChange::Slowed { median, baseline })
        } else if self.slow && median < clear_line {
            self.slow = false;
            Some(SetupChange::Recovered { median, baseline })
        } else {
            None
        }
    }

    /// Whether setup is slow now.
    pub fn is_slow(&self) -> bool {
        self.slow
    }

    /// The median of the last `window` setups, once there were that many.
    pub fn median(&self) -> Option<Duration> {
        self.median
    }

    /// The calm median, once there were `window` setups.
    pub fn baseline(&self) -> Option<Duration> {
        self.baseline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_flood_is_reported_once_when_setup_slows_and_once_when_it_recovers() {
        let mut w = SetupWatch::new(SetupWatchConfig::new(20, 2.0));
        let mut changes = Vec::new();
        // Calm at 10-12 ms, then 27 ms under a flood (the lab's numbers), then calm again.
        let calm = (0..40).map(|i| ms(10 + i % 3));
        let flood = (0..40).map(|i| ms(26 + i % 3));
        for took in calm.clone().chain(flood).chain(calm) {
            changes.extend(w.observe(took));
        }
        assert_eq!(changes.len(), 2, "{changes:?}");
        assert!(
            matches!(changes[0], SetupChange::Slowed { median, baseline } if median >= ms(26) && baseline == ms(11)),
            "{changes:?}"
        );
        assert!(matches!(changes[1], SetupChange::Recovered { .. }));
        assert!(!w.is_slow());
        assert_eq!(w.baseline(), Some(ms(11)));
    }

    #[test]
    fn single_slow_setups_do_not_move_the_median() {
        let mut w = SetupWatch::new(SetupWatchConfig::new(20, 2.0));
        for i in 0..200 {
            // One setup in five takes 100 ms (a page fault storm, a busy CPU).
            let took = if i % 5 == 0 { ms(100) } else { ms(10) };
            assert_eq!(w.observe(took), None);
        }
    }

    #[test]
    fn nothing_is_judged_before_a_window_of_setups_or_when_off() {
        let mut w = SetupWatch::new(SetupWatchConfig::new(20, 2.0));
        for _ in 0..19 {
            assert_eq!(w.observe(ms(500)), None);
        }
        assert_eq!(w.median(), None);
        let mut off = SetupWatch::new(SetupWatchConfig::off());
        for took in [ms(1), ms(1), ms(1000), ms(1000)] {
            assert_eq!(off.observe(took), None);
        }
    }

    #[test]
    fn a_server_started_under_a_flood_learns_its_calm_speed_later() {
        let mut w = SetupWatch::new(SetupWatchConfig::new(5, 2.0));
        let mut changes = Vec::new();
        for took in std::iter::repeat_n(ms(30), 10)
            .chain(std::iter::repeat_n(ms(10), 10))
            .chain(std::iter::repeat_n(ms(30), 10))
        {
            changes.extend(w.observe(took));
        }
        assert_eq!(w.baseline(), Some(ms(10)));
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert!(matches!(changes[0], SetupChange::Slowed { .. }));
    }
}
