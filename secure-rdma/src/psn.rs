//! Packet sequence numbers and queue pair numbers: the two 24-bit values that
//! identify an RC connection on the wire.
//!
//! Both are carried in the 24-bit fields of the InfiniBand Base Transport
//! Header, so any value at or above 2^24 is not a valid PSN or QPN. The types
//! here can only be built from valid values, which is why the queue-pair
//! transitions in [`crate::verbs::qp`] take them instead of raw integers.
//!
//! PSNs must be unpredictable: an RC responder accepts a packet only when its
//! PSN matches the expected one, so a guessable PSN (0, a counter, a time
//! stamp) lets an off-path attacker who knows the QPN inject packets.
//! [`Psn::random`] draws all 24 bits from the operating system's CSPRNG.

use std::fmt;

use rand_core::{OsRng, RngCore};
use serde::{Deserialize, Serialize};

/// Number of distinct PSN (and QPN) values: the fields are 24 bits wide.
pub const SPACE: u32 = 1 << 24;

/// A 24-bit value was out of range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what} {value:#x} does not fit in 24 bits (must be below {SPACE:#x})")]
pub struct OutOfRange {
    /// Which field was being built ("PSN" or "QPN").
    pub what: &'static str,
    /// The rejected value.
    pub value: u32,
}

/// A packet sequence number: 24 bits.
///
/// ```
/// use secure_rdma::psn::Psn;
/// let psn = Psn::new(0x00ab_cdef).unwrap();
/// assert_eq!(psn.get(), 0xabcdef);
/// assert!(Psn::new(1 << 24).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Psn(u32);

impl Psn {
    /// Builds a PSN, rejecting values of 2^24 and above.
    pub fn new(value: u32) -> Result<Self, OutOfRange> {
        if value < SPACE {
            Ok(Self(value))
        } else {
            Err(OutOfRange { what: "PSN", value })
        }
    }

    /// Draws a fresh PSN uniformly from all 2^24 values with the OS CSPRNG.
    ///
    /// No bit is forced: masking a uniform 32-bit draw to its low 24 bits
    /// keeps it uniform, because 2^24 divides 2^32.
    ///
    /// ```
    /// use secure_rdma::psn::Psn;
    /// let a = Psn::random();
    /// assert!(a.get() < 1 << 24);
    /// ```
    pub fn random() -> Self {
        Self::from_rng(&mut OsRng)
    }

    /// Draws a PSN from the given RNG (tests use a seeded one).
    pub fn from_rng<R: RngCore + ?Sized>(rng: &mut R) -> Self {
        Self(rng.next_u32() & (SPACE - 1))
    }

    /// The raw 24-bit value.
    pub fn get(self) -> u32 {
        self.0
    }
}

// PSNs are secrets until the connection is up: Debug output goes to logs, so
// it is deliberately opaque; use `get()` at debug level when needed.
impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Psn(..)")
    }
}

impl TryFrom<u32> for Psn {
    type Error = OutOfRange;
    fn try_from(value: u32) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<Psn> for u32 {
    fn from(psn: Psn) -> u32 {
        psn.0
    }
}

/// A queue pair number: 24 bits.
///
/// ```
/// use secure_rdma::psn::Qpn;
/// assert_eq!(Qpn::new(17).unwrap().get(), 17);
/// assert!(Qpn::new(0x0100_0000).is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct Qpn(u32);

impl Qpn {
    /// Builds a QPN, rejecting values of 2^24 and above.
    pub fn new(value: u32) -> Result<Self, OutOfRange> {
        if value < SPACE {
            Ok(Self(value))
        } else {
            Err(OutOfRange { what: "QPN", value })
        }
    }

    /// The raw 24-bit value.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Debug for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Qpn({:#08x})", self.0)
    }
}

impl fmt::Display for Qpn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

impl TryFrom<u32> for Qpn {
    type Error = OutOfRange;
    fn try_from(value: u32) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<Qpn> for u32 {
    fn from(qpn: Qpn) -> u32 {
        qpn.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_exactly_24_bits() {
        assert_eq!(Psn::new(SPACE - 1).map(Psn::get), Ok(0xff_ffff));
        assert_eq!(
            Psn::new(SPACE),
            Err(OutOfRange {
                what: "PSN",
                value: SPACE
            })
        );
        assert!(Qpn::new(u32::MAX).is_err());
        assert_eq!(
            Qpn::new(SPACE).unwrap_err().to_string(),
            "QPN 0x1000000 does not fit in 24 bits (must be below 0x1000000)"
        );
    }

    #[test]
    fn serde_rejects_out_of_range() {
        assert!(serde_json::from_str::<Psn>("16777216").is_err());
        assert_eq!(
            serde_json::from_str::<Psn>("16777215").unwrap().get(),
            0xffffff
        );
        assert!(serde_json::from_str::<Qpn>("4294967295").is_err());
    }

    #[test]
    fn debug_does_not_leak_psn() {
        let psn = Psn::new(0x123456).unwrap();
        assert!(!format!("{psn:?}").contains("123456"));
        assert!(!format!("{psn:?}").contains("1193046"));
    }

    /// A million CSPRNG PSNs: all in range and each of the 24 bits set in
    /// 50% ± 1% of them (a forced bit or a short range would show up here).
    #[test]
    fn million_random_psns_are_uniform_per_bit() {
        const N: u32 = 1_000_000;
        let mut ones = [0u32; 24];
        for _ in 0..N {
            let v = Psn::random().get();
            assert!(v < SPACE);
            for (bit, count) in ones.iter_mut().enumerate() {
                *count += (v >> bit) & 1;
            }
        }
        for (bit, count) in ones.iter().enumerate() {
            let share = f64::from(*count) / f64::from(N);
            assert!(
                (0.49..=0.51).contains(&share),
                "bit {bit} set in {:.3}% of PSNs",
                share * 100.0
            );
        }
    }
}
