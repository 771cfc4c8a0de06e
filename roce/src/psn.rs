//! 24-bit packet sequence numbers and their wrap-around arithmetic.
//!
//! Every BTH carries a 24-bit PSN. An RC responder delivers a request only when its PSN is the
//! next one it expects; anything behind is a duplicate (acknowledged and dropped), anything
//! ahead is out of sequence (one NAK, then silence). PSNs wrap at 2^24, so "next", "distance"
//! and "ahead" are modular, and "ahead" uses the half-window rule: a PSN less than 2^23 ahead
//! of another is ahead of it, anything else is behind (or the same).
//!
//! This is the one place the arithmetic is written: the QP follower (`follow`) judges captured
//! sequences with it, and the lab's injection tool guesses and forges with it, so the tool and
//! the capture agree on what "ahead" means. Every function masks its result to 24 bits, so a
//! PSN read from a wider field (stray high bits) never leaks into a result.
//!
//! ```
//! use roce::psn;
//!
//! assert_eq!(psn::next(0xff_ffff), 0);
//! assert_eq!(psn::distance(2, 0xff_fffe), 4);
//! assert!(psn::ahead(2, 0xff_fffe));
//! assert!(!psn::ahead(0xff_fffe, 2));
//! ```

/// PSNs are 24 bits: the mask that keeps a value within them.
pub const PSN_MASK: u32 = 0x00ff_ffff;

/// The number of distinct PSNs (2^24).
pub const PSN_SPACE: u32 = PSN_MASK + 1;

/// Half the PSN space (2^23): forward distances below this are "ahead".
pub const HALF_WINDOW: u32 = 1 << 23;

/// The PSN `n` packets after `psn`, wrapping at 2^24.
///
/// ```
/// use roce::psn::advance;
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
/// assert_eq!(roce::psn::next(0xff_ffff), 0);
/// ```
pub fn next(psn: u32) -> u32 {
    advance(psn, 1)
}

/// `(a - b) mod 2^24`: how many packets forward `a` is from `b`.
///
/// ```
/// assert_eq!(roce::psn::distance(0, 0xff_ffff), 1);
/// ```
pub fn distance(a: u32, b: u32) -> u32 {
    a.wrapping_sub(b) & PSN_MASK
}

/// True if `a` is ahead of `b` by less than half the PSN space ([`HALF_WINDOW`]); a PSN is not
/// ahead of itself.
///
/// ```
/// assert!(roce::psn::ahead(0, 0xff_ffff));
/// assert!(!roce::psn::ahead(7, 7));
/// ```
pub fn ahead(a: u32, b: u32) -> bool {
    let d = distance(a, b);
    d != 0 && d < HALF_WINDOW
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distance_and_half_window() {
        assert_eq!(distance(0, 0xffffff), 1);
        assert_eq!(distance(0xffffff, 0), 0xffffff);
        assert!(ahead(2, 0xfffffe));
        assert!(!ahead(0xfffffe, 2));
        assert!(ahead(0x7fffff, 0));
        assert!(!ahead(0x800000, 0));
        assert!(!ahead(5, 5));
    }

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
        assert!(ahead(0, PSN_MASK));
        assert!(!ahead(PSN_MASK, 0));
        assert!(!ahead(7, 7));
        assert_eq!(distance(2, PSN_MASK), 3);
    }

    #[test]
    fn stray_high_bits_do_not_leak() {
        assert_eq!(distance(0x0100_0003, 1), 2);
        assert_eq!(distance(1, 0xff00_0000), 1);
        assert!(ahead(0x0100_0001, 0));
        assert_eq!(advance(0xffff_ffff, 0), PSN_MASK);
    }

    #[test]
    fn advance_and_distance_agree() {
        for psn in [0, 1, 0x7f_ffff, 0x80_0000, PSN_MASK - 1, PSN_MASK] {
            for n in [0, 1, 2, HALF_WINDOW - 1, HALF_WINDOW, PSN_MASK] {
                let later = advance(psn, n);
                assert_eq!(distance(later, psn), n, "psn {psn:#x} n {n:#x}");
                assert_eq!(ahead(later, psn), n != 0 && n < HALF_WINDOW);
            }
        }
    }
}
