//! A bounds-checked cursor over a byte slice: every read either succeeds or names what was cut.

use crate::error::DecodeError;

/// Reads fixed-size headers off the front of a buffer, tracking the absolute offset so errors
/// point at the right byte of the caller's buffer.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Offset of `buf[0]` within the buffer the caller handed to the entry point.
    base: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], base: usize) -> Self {
        Reader { buf, pos: 0, base }
    }

    /// Absolute offset of the next unread byte.
    pub(crate) fn offset(&self) -> usize {
        self.base + self.pos
    }

    /// The bytes not yet read.
    pub(crate) fn rest(&self) -> &'a [u8] {
        self.buf.get(self.pos..).unwrap_or(&[])
    }

    /// Takes the next `n` bytes, or reports `layer` as truncated.
    pub(crate) fn take(&mut self, n: usize, layer: &'static str) -> Result<&'a [u8], DecodeError> {
        let rest = self.rest();
        match rest.get(..n) {
            Some(bytes) => {
                self.pos += n;
                Ok(bytes)
            }
            None => Err(DecodeError::Truncated {
                layer,
                offset: self.offset(),
                needed: n,
                available: rest.len(),
            }),
        }
    }

    /// Takes the next `N` bytes as an array, or reports `layer` as truncated.
    pub(crate) fn array<const N: usize>(
        &mut self,
        layer: &'static str,
    ) -> Result<&'a [u8; N], DecodeError> {
        let bytes = self.take(N, layer)?;
        // `take` returned exactly N bytes, so the conversion cannot fail; map it to the same
        // truncation error rather than unwrap.
        bytes.try_into().map_err(|_| DecodeError::Truncated {
            layer,
            offset: self.offset(),
            needed: N,
            available: bytes.len(),
        })
    }
}

/// Big-endian field extraction from fixed arrays; infallible because the sizes are static.
pub(crate) fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

pub(crate) fn be24(b: [u8; 3]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}

pub(crate) fn be32(b: [u8; 4]) -> u32 {
    u32::from_be_bytes(b)
}

pub(crate) fn be64(b: [u8; 8]) -> u64 {
    u64::from_be_bytes(b)
}

/// Copies `N` bytes starting at `at` out of a fixed header array. `at + N <= M` is checked at
/// compile time by the callers' constant arguments; a bad pair yields zeros instead of a panic.
pub(crate) fn sub<const N: usize, const M: usize>(h: &[u8; M], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    if let Some(src) = h.get(at..at + N) {
        out.copy_from_slice(src);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_reports_offset_and_shortfall() {
        let data = [1u8, 2, 3, 4, 5];
        let mut r = Reader::new(&data, 100);
        assert_eq!(r.take(2, "a"), Ok(&data[..2]));
        assert_eq!(r.offset(), 102);
        let err = r.take(4, "b");
        assert_eq!(
            err,
            Err(DecodeError::Truncated {
                layer: "b",
                offset: 102,
                needed: 4,
                available: 3
            })
        );
        assert_eq!(r.array::<3>("c"), Ok(&[3, 4, 5]));
        assert!(r.rest().is_empty());
        assert!(r.array::<1>("d").is_err());
    }

    #[test]
    fn field_helpers() {
        assert_eq!(be24([0x12, 0x34, 0x56]), 0x123456);
        let h = [0u8, 1, 2, 3, 4, 5];
        assert_eq!(sub::<2, 6>(&h, 4), [4, 5]);
        assert_eq!(sub::<2, 6>(&h, 5), [0, 0]);
    }
}
