//! Serde helpers that write opaque values (keys, addresses, CRCs) as `0x…` hex strings, which
//! read better in JSON than 20-digit decimals and survive JavaScript's 53-bit numbers.

use serde::Serializer;

pub(crate) fn u16<S: Serializer>(v: &u16, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("0x{v:04x}"))
}

pub(crate) fn u32<S: Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("0x{v:08x}"))
}

pub(crate) fn u64<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("0x{v:016x}"))
}

pub(crate) fn opt_u32<S: Serializer>(v: &Option<u32>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => u32(v, s),
        None => s.serialize_none(),
    }
}

/// Bytes as one lowercase hex string.
pub(crate) fn bytes<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&HexBytes(v))
}

/// Displays bytes as contiguous lowercase hex.
pub(crate) struct HexBytes<'a>(pub(crate) &'a [u8]);

impl std::fmt::Display for HexBytes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}
