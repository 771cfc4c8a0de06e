//! Ethernet addresses as people type them (`--dst-mac`, `--src-mac`) and as Linux shows them
//! (`/sys/class/net/IFACE/address`).

use roce::MacAddr;

/// Why a MAC address did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad MAC address {input:?}: {reason} (expected six hex bytes separated by ':' or '-', \
     e.g. 02:00:00:00:00:01)"
)]
pub struct MacError {
    /// What was given.
    pub input: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with `-`), case-insensitive, one or two hex digits a byte.
///
/// ```
/// use rdma_inject::mac::parse_mac;
///
/// let mac = parse_mac("02:AB:0:00:00:1")?;
/// assert_eq!(mac.0, [0x02, 0xab, 0, 0, 0, 0x01]);
/// assert!(parse_mac("02:ab:00:00:00").is_err());
/// # Ok::<(), rdma_inject::mac::MacError>(())
/// ```
pub fn parse_mac(input: &str) -> Result<MacAddr, MacError> {
    let fail = |reason| MacError {
        input: input.to_owned(),
        reason,
    };
    let s = input.trim();
    let sep = if s.contains('-') { '-' } else { ':' };
    let mut out = [0u8; 6];
    let mut parts = s.split(sep);
    for byte in &mut out {
        let part = parts.next().ok_or_else(|| fail("fewer than six bytes"))?;
        if part.is_empty() || part.len() > 2 {
            return Err(fail("each byte is one or two hex digits"));
        }
        *byte = u8::from_str_radix(part, 16).map_err(|_| fail("not a hex digit"))?;
    }
    if parts.next().is_some() {
        return Err(fail("more than six bytes"));
    }
    Ok(MacAddr(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_usual_spellings() {
        let want = MacAddr([0x02, 0x42, 0xac, 0x11, 0x00, 0x02]);
        for s in [
            "02:42:ac:11:00:02",
            "02:42:AC:11:00:02",
            "02-42-ac-11-00-02",
            " 2:42:ac:11:0:2\n",
        ] {
            assert_eq!(parse_mac(s), Ok(want), "{s:?}");
        }
    }

    #[test]
    fn refuses_with_a_reason_and_never_panics() {
        for (s, reason) in [
            ("", "each byte is one or two hex digits"),
            ("02:42:ac:11:00", "fewer than six bytes"),
            ("02:42:ac:11:00:02:03", "more than six bytes"),
            ("02:42:ac:11:00:zz", "not a hex digit"),
            ("02:42:ac:11:00:123", "each byte is one or two hex digits"),
            ("02::ac:11:00:02", "each byte is one or two hex digits"),
            ("0242.ac11.0002", "each byte is one or two hex digits"),
            ("é2:42:ac:11:00:02", "each byte is one or two hex digits"),
        ] {
            let e = parse_mac(s).unwrap_err();
            assert_eq!(e.reason, reason, "{s:?}");
            assert!(e.to_string().contains("e.g. 02:00:00:00:00:01"), "{e}");
        }
    }
}
