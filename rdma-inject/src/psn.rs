//! 24-bit packet sequence numbers: the one field an on-path attacker must get exactly right.
//!
//! An RC responder delivers a request only when its PSN is the next one it expects; anything
//! behind is a duplicate (acknowledged and dropped), anything ahead is out of sequence (one
//! NAK, then silence). PSNs wrap at 2^24, so "next" and "ahead" are modular; the comparisons
//! are the `roce` follower's, so the tool and the capture agree on what "ahead" means.

pub use roce::follow::{psn_ahead, psn_distance, PSN_MASK};

/// The number of distinct PSNs (2^24).
pub const PSN_SPACE: u32 = PSN_MASK + 1;

/// The PSN `n` packets after `psn`, wrapping at 2^24.
///
/// ```
/// use rdma_inject::psn::advance;
///
/// assert_eq!(advance(0x12, 1), 0x13);
/// assert_eq!(advance(0xff_ffff, 1), 0);
/// assert_eq!(advance(0xff_fffe, 5), 3);
/// ```
pub fn advance(psn: u32, n: u32) -> u32 {
    psn.wrapping_add(n) & PSN_MASK
}

/// The PSN right after `psn`: the one the responder expects once `psn` was delivered.
///
/// ```
/// assert_eq!(rdma_inject::psn::next(0xff_ffff), 0);
/// ```
pub fn next(psn: u32) -> u32 {
    advance(psn, 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_wraps_at_two_to_the_24() {
        assert_eq!(next(0), 1);
        assert_eq!(next(PSN_MASK - 1), PSN_MASK);
        assert_eq!(next(PSN_MASK), 0);
        // Stray high bits (a PSN read from a wider field) never leak into the result.
        assert_eq!(next(0x0100_0005), 6);
        assert_eq!(advance(PSN_MASK, PSN_SPACE), PSN_MASK);
        assert_eq!(advance(PSN_MASK, u32::MAX), PSN_MASK - 1);
    }

    #[test]
    fn ahead_is_modular() {
        assert!(psn_ahead(0, PSN_MASK));
        assert!(!psn_ahead(PSN_MASK, 0));
        assert!(!psn_ahead(7, 7));
        assert_eq!(psn_distance(2, PSN_MASK), 3);
    }
}
