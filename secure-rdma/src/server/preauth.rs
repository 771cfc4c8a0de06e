//! What a peer that has not authenticated can cost: pending connections are
//! counted per source prefix (a /24 for IPv4, a /64 for IPv6 by default, as
//! well as per address), and the warnings its failures cause are bounded per
//! prefix and in all.
//!
//! Whoever holds one address usually holds its neighbours too: a cloud VM
//! can add addresses of its /24, and an IPv6 host is routinely handed a
//! whole /64. A bound per exact address alone is one bound per neighbour.
//! [`SourcePrefix`] groups addresses the way they are handed out;
//! IPv4-mapped IPv6 addresses (what a dual-stack listener sees from IPv4
//! clients) count as the IPv4 address they carry.
//!
//! [`PreAuthLog`] decides which failure before TLS completes is logged: a
//! token bucket per prefix (a flood from one prefix does not silence
//! another's failures), one for the whole server (many prefixes together
//! stay bounded), the rest counted and summarised per prefix every
//! [`SUMMARY_EVERY`]. Its table of prefixes is bounded too
//! ([`MAX_PREFIXES`]), and counting stays exact when an entry is evicted.
//! It reads no clock: callers pass `now`, so tests drive time.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use super::error::ConfigError;

/// How many leading bits of a source address make its prefix, per family.
///
/// ```
/// use secure_rdma::server::PrefixLengths;
///
/// let lengths = PrefixLengths::new(24, 64)?;
/// assert_eq!((lengths.v4, lengths.v6), (24, 64));
/// assert!(PrefixLengths::new(33, 64).is_err());
/// # Ok::<(), secure_rdma::server::ConfigError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PrefixLengths {
    /// IPv4 prefix length, 0 to 32 (32: one address).
    pub v4: u8,
    /// IPv6 prefix length, 0 to 128 (128: one address).
    pub v6: u8,
}

impl PrefixLengths {
    /// `v4` and `v6` bits, or which of them is longer than its address.
    pub fn new(v4: u8, v6: u8) -> Result<PrefixLengths, ConfigError> {
        if v4 > 32 {
            return Err(ConfigError::PrefixLength {
                family: "IPv4",
                length: v4,
                max: 32,
            });
        }
        if v6 > 128 {
            return Err(ConfigError::PrefixLength {
                family: "IPv6",
                length: v6,
                max: 128,
            });
        }
        Ok(PrefixLengths { v4, v6 })
    }
}

impl Default for PrefixLengths {
    /// A /24 for IPv4, a /64 for IPv6: the units addresses are commonly handed out in.
    fn default() -> Self {
        PrefixLengths { v4: 24, v6: 64 }
    }
}

/// The prefix a source address belongs to, e.g. `10.77.0.0/24` or `2001:db8::/64`.
///
/// ```
/// use secure_rdma::server::{PrefixLengths, SourcePrefix};
///
/// let lengths = PrefixLengths::default();
/// let a = SourcePrefix::of("10.77.0.17".parse().unwrap(), lengths);
/// let mapped = SourcePrefix::of("::ffff:10.77.0.200".parse().unwrap(), lengths);
/// assert_eq!(a, mapped);
/// assert_eq!(a.to_string(), "10.77.0.0/24");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourcePrefix {
    network: IpAddr,
    length: u8,
}

impl SourcePrefix {
    /// The prefix of `address` (IPv4-mapped IPv6 addresses as IPv4).
    pub fn of(address: IpAddr, lengths: PrefixLengths) -> SourcePrefix {
        match address.to_canonical() {
            IpAddr::V4(a) => {
                let length = lengths.v4.min(32);
                let mask = u32::MAX.checked_shl(32 - u32::from(length)).unwrap_or(0);
                SourcePrefix {
                    network: IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask)),
                    length,
                }
            }
            IpAddr::V6(a) => {
                let length = lengths.v6.min(128);
                let mask = u128::MAX.checked_shl(128 - u32::from(length)).unwrap_or(0);
                SourcePrefix {
                    network: IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask)),
                    length,
                }
            }
        }
    }

    /// The network address (the host bits are 0).
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length in bits.
    pub fn length(&self) -> u8 {
        self.length
    }
}

impl fmt::Display for SourcePrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.length)
    }
}

/// Lines per prefix at once, before the steady rate applies.
pub const PREFIX_BURST: u32 = 5;
/// Then one line per prefix this often.
pub const PREFIX_EVERY: Duration = Duration::from_secs(1);
/// Lines from all prefixes together at once.
pub const GLOBAL_BURST: u32 = 20;
/// Then one line in all this often (5 a second).
pub const GLOBAL_EVERY: Duration = Duration::from_millis(200);
/// How often the suppressed lines are summarised.
pub const SUMMARY_EVERY: Duration = Duration::from_secs(10);
/// Prefixes named in one summary (the most suppressed first); the rest are one more line.
pub const SUMMARY_PREFIXES: usize = 8;
/// Prefixes tracked at once; the one seen longest ago makes room (its count is kept).
pub const MAX_PREFIXES: usize = 4096;

/// A token bucket driven by the caller's clock.
#[derive(Debug, Clone)]
struct Bucket {
    tokens: u32,
    refilled: Instant,
}

impl Bucket {
    fn full(burst: u32, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            refilled: now,
        }
    }

    fn refill(&mut self, burst: u32, every: Duration, now: Instant) {
        let earned = now.saturating_duration_since(self.refilled).as_nanos() / every.as_nanos();
        if earned > 0 {
            self.tokens = u32::try_from(earned)
                .unwrap_or(u32::MAX)
                .saturating_add(self.tokens)
                .min(burst);
            // Partial progress toward the next token is kept.
            let spent = every.saturating_mul(u32::try_from(earned).unwrap_or(u32::MAX));
            self.refilled = if self.tokens == burst {
                now
            } else {
                self.refilled + spent
            };
        }
    }

    fn take(&mut self, burst: u32, every: Duration, now: Instant) -> bool {
        self.refill(burst, every, now);
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }

    /// Would be full at `now`: the entry holds nothing a fresh one would not.
    fn is_full(&self, burst: u32, every: Duration, now: Instant) -> bool {
        let mut b = self.clone();
        b.refill(burst, every, now);
        b.tokens >= burst
    }
}

#[derive(Debug)]
struct Entry {
    bucket: Bucket,
    /// Lines held back since the last summary.
    suppressed: u64,
    last_seen: Instant,
}

/// What was held back in one summary period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Suppressed {
    /// The prefixes with the most lines held back, most first, at most [`SUMMARY_PREFIXES`].
    pub(super) top: Vec<(SourcePrefix, u64)>,
    /// The other prefixes (including evicted ones' counts): how many lines, from how many
    /// prefixes (evicted ones are not told apart, so this counts at least one for them).
    pub(super) others: u64,
    /// How many prefixes `others` comes from.
    pub(super) other_prefixes: usize,
    /// Since the previous summary.
    pub(super) period: Duration,
}

impl Suppressed {
    /// Nothing was held back.
    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.top.is_empty() && self.others == 0
    }
}

/// Which pre-TLS failures are logged (see the [module docs](self)).
#[derive(Debug)]
pub(super) struct PreAuthLog {
    global: Bucket,
    table: HashMap<SourcePrefix, Entry>,
    /// Lines held back for prefixes evicted from the table since the last summary.
    evicted: u64,
    evicted_prefixes: usize,
    last_summary: Instant,
}

impl PreAuthLog {
    pub(super) fn new(now: Instant) -> PreAuthLog {
        PreAuthLog {
            global: Bucket::full(GLOBAL_BURST, now),
            table: HashMap::new(),
            evicted: 0,
            evicted_prefixes: 0,
            last_summary: now,
        }
    }

    /// Whether a failure from `prefix` at `now` may be logged; if not it is counted for the
    /// next summary.
    pub(super) fn check(&mut self, prefix: SourcePrefix, now: Instant) -> bool {
        if !self.table.contains_key(&prefix) && self.table.len() >= MAX_PREFIXES {
            self.evict_oldest();
        }
        let entry = self.table.entry(prefix).or_insert_with(|| Entry {
            bucket: Bucket::full(PREFIX_BURST, now),
            suppressed: 0,
            last_seen: now,
        });
        entry.last_seen = now;
        // The prefix's own bucket first: a flooding prefix spends its tokens, not the others'.
        let pass = entry.bucket.take(PREFIX_BURST, PREFIX_EVERY, now)
            && self.global.take(GLOBAL_BURST, GLOBAL_EVERY, now);
        if !pass {
            entry.suppressed += 1;
        }
        pass
    }

    /// O(table) but only when the table is full, that is under a flood of new prefixes, and
    /// bounded by [`MAX_PREFIXES`].
    fn evict_oldest(&mut self) {
        let oldest = self
            .table
            .iter()
            .min_by_key(|(_, e)| e.last_seen)
            .map(|(p, _)| *p);
        if let Some(entry) = oldest.and_then(|p| self.table.remove(&p)) {
            if entry.suppressed > 0 {
                self.evicted += entry.suppressed;
                self.evicted_prefixes += 1;
            }
        }
    }

    /// What was held back since the last summary (counts reset), and forgets prefixes that
    /// hold nothing a fresh entry would not.
    pub(super) fn summary(&mut self, now: Instant) -> Suppressed {
        let mut all: Vec<(SourcePrefix, u64)> = self
            .table
            .iter_mut()
            .filter(|(_, e)| e.suppressed > 0)
            .map(|(p, e)| (*p, std::mem::take(&mut e.suppressed)))
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let rest = all.split_off(all.len().min(SUMMARY_PREFIXES));
        let others = rest.iter().map(|(_, n)| n).sum::<u64>() + self.evicted;
        let other_prefixes = rest.len() + self.evicted_prefixes;
        self.evicted = 0;
        self.evicted_prefixes = 0;
        self.table
            .retain(|_, e| !e.bucket.is_full(PREFIX_BURST, PREFIX_EVERY, now));
        let period = now.saturating_duration_since(self.last_summary);
        self.last_summary = now;
        Suppressed {
            top: all,
            others,
            other_prefixes,
            period,
        }
    }

    /// Prefixes tracked now.
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.table.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> SourcePrefix {
        SourcePrefix::of(s.parse().unwrap(), PrefixLengths::default())
    }

    #[test]
    fn addresses_group_by_their_prefix() {
        let d = PrefixLengths::default();
        assert_eq!(p("10.77.0.10"), p("10.77.0.17"));
        assert_ne!(p("10.77.0.10"), p("10.78.0.10"));
        assert_eq!(p("10.77.0.255").to_string(), "10.77.0.0/24");
        // IPv4-mapped IPv6 counts as IPv4.
        assert_eq!(p("::ffff:10.77.0.3"), p("10.77.0.250"));
        assert_eq!(p("::ffff:10.77.0.3").to_string(), "10.77.0.0/24");
        // IPv6 by /64.
        assert_eq!(p("2001:db8:1:2::1"), p("2001:db8:1:2:ffff:ffff:ffff:ffff"));
        assert_ne!(p("2001:db8:1:2::1"), p("2001:db8:1:3::1"));
        assert_eq!(p("2001:db8:1:2:3:4:5:6").to_string(), "2001:db8:1:2::/64");
        // Other lengths, and the edges: 32/128 is the address, 0 is everyone.
        let l = PrefixLengths::new(16, 48).unwrap();
        let of = |s: &str, l| SourcePrefix::of(s.parse().unwrap(), l);
        assert_eq!(of("10.77.9.9", l).to_string(), "10.77.0.0/16");
        assert_eq!(of("2001:db8:1:2::1", l).to_string(), "2001:db8:1::/48");
        let exact = PrefixLengths::new(32, 128).unwrap();
        assert_eq!(of("10.77.0.9", exact).to_string(), "10.77.0.9/32");
        assert_eq!(of("::1", exact).to_string(), "::1/128");
        let all = PrefixLengths::new(0, 0).unwrap();
        assert_eq!(of("10.77.0.9", all), of("192.168.1.1", all));
        assert_eq!(of("10.77.0.9", all).to_string(), "0.0.0.0/0");
        assert_eq!(of("2001:db8::1", all).to_string(), "::/0");
        assert_eq!(d, PrefixLengths::new(24, 64).unwrap());
        assert!(PrefixLengths::new(24, 129)
            .unwrap_err()
            .to_string()
            .contains("IPv6"));
    }

    #[test]
    fn a_flooding_prefix_gets_its_burst_then_its_rate_and_the_rest_is_summarised() {
        let t0 = Instant::now();
        let mut log = PreAuthLog::new(t0);
        let flood = p("10.77.0.10");
        // 1,000 failures in 10 s from one /24 (100 a second).
        let mut logged = 0;
        for i in 0..1000u64 {
            let now = t0 + Duration::from_millis(i * 10);
            logged += u64::from(log.check(flood, now));
        }
        // The burst, then one a second.
        assert!(
            (PREFIX_BURST as u64..=PREFIX_BURST as u64 + 10).contains(&logged),
            "{logged}"
        );
        let s = log.summary(t0 + Duration::from_secs(10));
        assert_eq!(s.top, vec![(flood, 1000 - logged)]);
        assert_eq!((s.others, s.other_prefixes), (0, 0));
        assert_eq!(s.period, Duration::from_secs(10));
        // Counts restart with each summary.
        assert!(log.summary(t0 + Duration::from_secs(20)).is_empty());
    }

    #[test]
    fn another_prefix_is_still_logged_during_a_flood() {
        let t0 = Instant::now();
        let mut log = PreAuthLog::new(t0);
        for i in 0..500u64 {
            log.check(p("10.77.0.10"), t0 + Duration::from_millis(i));
        }
        // The flood used its own bucket, not the others'.
        assert!(log.check(p("10.78.0.2"), t0 + Duration::from_millis(500)));
    }

    #[test]
    fn many_prefixes_together_stay_under_the_global_bound() {
        let t0 = Instant::now();
        let mut log = PreAuthLog::new(t0);
        // An IPv6 attacker with a new /64 for each of 10,000 failures in 10 s.
        let mut logged = 0u64;
        for i in 0..10_000u64 {
            let addr = IpAddr::V6(Ipv6Addr::from(
                (0x2001_0db8_u128 << 96) | (u128::from(i) << 64),
            ));
            let now = t0 + Duration::from_millis(i);
            logged += u64::from(log.check(SourcePrefix::of(addr, PrefixLengths::default()), now));
        }
        let bound = GLOBAL_BURST as u64 + 10_000 / GLOBAL_EVERY.as_millis() as u64;
        assert!(logged <= bound, "{logged} > {bound}");
        // The table stayed bounded, and no suppressed line was lost from the counts.
        assert!(log.tracked() <= MAX_PREFIXES);
        let s = log.summary(t0 + Duration::from_secs(10));
        let counted: u64 = s.top.iter().map(|(_, n)| n).sum::<u64>() + s.others;
        assert_eq!(counted + logged, 10_000);
        assert!(s.top.len() <= SUMMARY_PREFIXES);
        assert!(s.other_prefixes > 0);
        // Idle prefixes are forgotten at the summary after their bucket refilled.
        log.summary(t0 + Duration::from_secs(30));
        assert_eq!(log.tracked(), 0);
    }

    #[test]
    fn a_quiet_prefix_refills_and_is_logged_again() {
        let t0 = Instant::now();
        let mut log = PreAuthLog::new(t0);
        let a = p("192.0.2.1");
        for _ in 0..PREFIX_BURST {
            assert!(log.check(a, t0));
        }
        assert!(!log.check(a, t0));
        assert!(!log.check(a, t0 + Duration::from_millis(999)));
        assert!(log.check(a, t0 + PREFIX_EVERY));
        assert!(!log.check(a, t0 + PREFIX_EVERY));
    }
}
