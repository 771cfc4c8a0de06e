//! Capture timestamps: seconds and nanoseconds since the Unix epoch, as capture files, the
//! renderer and the capture tools carry them.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};

/// A capture timestamp: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp {
    /// Whole seconds.
    pub secs: u64,
    /// Nanoseconds within the second (`< 1_000_000_000`).
    pub nanos: u32,
}

impl Timestamp {
    /// A timestamp from seconds and nanoseconds; excess nanoseconds carry into seconds.
    pub fn new(secs: u64, nanos: u32) -> Timestamp {
        Timestamp {
            secs: secs.saturating_add(u64::from(nanos / 1_000_000_000)),
            nanos: nanos % 1_000_000_000,
        }
    }

    /// The current wall-clock time.
    pub fn now() -> Timestamp {
        Timestamp::from(SystemTime::now())
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Timestamp {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        Timestamp {
            secs: d.as_secs(),
            nanos: d.subsec_nanos(),
        }
    }
}

impl fmt::Display for Timestamp {
    /// `seconds.nanoseconds`, as `tcpdump -tt --nano` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}", self.secs, self.nanos)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps() {
        assert_eq!(
            Timestamp::new(1, 2_500_000_000),
            Timestamp {
                secs: 3,
                nanos: 500_000_000
            }
        );
        assert_eq!(Timestamp::new(12, 34).to_string(), "12.000000034");
        assert_eq!(
            Timestamp::from(UNIX_EPOCH + Duration::from_millis(1500)),
            Timestamp::new(1, 500_000_000)
        );
    }
}
