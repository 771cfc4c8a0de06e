//! The extension transport headers that follow the BTH (IBA 9.3–9.7, 9.2 for the order).

use std::fmt;

use serde::ser::SerializeMap;
use serde::{Serialize, Serializer};

use crate::error::DecodeError;
use crate::opcode::ExtHeaderKind;
use crate::reader::{be24, be32, be64, sub, Reader};

/// Reliable Datagram Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Rdeth {
    /// End-to-end context number (24 bits).
    pub eecnxt: u32,
}

/// Datagram Extended Transport Header (UD and RD).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Deth {
    /// Queue key the receiving QP checks.
    #[serde(serialize_with = "crate::hex::u32")]
    pub qkey: u32,
    /// Source queue pair (24 bits).
    pub src_qp: u32,
}

/// XRC Extended Transport Header (XRC requests).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct XrcEth {
    /// The XRC shared receive queue the request targets (24 bits).
    pub xrcsrq: u32,
}

/// FLUSH Extended Transport Header (IBA 1.5 memory placement extensions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Feth {
    /// Selectivity level (bits 5–4): 0 the memory region, 1 the whole address range.
    pub selectivity: u8,
    /// Placement type (bits 3–0): bit 0 global visibility, bit 1 persistence.
    pub placement_type: u8,
}

/// RDMA Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Reth {
    /// Remote virtual address.
    #[serde(serialize_with = "crate::hex::u64")]
    pub va: u64,
    /// Remote key.
    #[serde(serialize_with = "crate::hex::u32")]
    pub rkey: u32,
    /// Length of the whole RDMA operation, not of this packet.
    pub dma_len: u32,
}

/// Atomic Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    #[serde(serialize_with = "crate::hex::u64")]
    pub va: u64,
    /// Remote key.
    #[serde(serialize_with = "crate::hex::u32")]
    pub rkey: u32,
    /// The swap value (CmpSwap) or the addend (FetchAdd).
    #[serde(serialize_with = "crate::hex::u64")]
    pub swap_or_add: u64,
    /// The compare value (CmpSwap only).
    #[serde(serialize_with = "crate::hex::u64")]
    pub compare: u64,
}

/// Atomic Acknowledge Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct AtomicAckEth {
    /// The remote memory's value before the atomic operation.
    #[serde(serialize_with = "crate::hex::u64")]
    pub orig: u64,
}

/// Immediate data, as the 32 bits appear on the wire (network order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ImmDt(#[serde(serialize_with = "crate::hex::u32")] pub u32);

/// Invalidate Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Ieth {
    /// The R_Key the responder invalidates.
    #[serde(serialize_with = "crate::hex::u32")]
    pub rkey: u32,
}

/// A NAK code: the low five bits of an AETH syndrome whose top bits are `011` (IBA 9.7.5.2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NakCode {
    /// 0: the responder expected another PSN; the requester goes back to it.
    PsnSequenceError,
    /// 1: invalid request (unsupported opcode, bad length, …).
    InvalidRequest,
    /// 2: remote access error (R_Key, bounds, permissions).
    RemoteAccessError,
    /// 3: remote operational error.
    RemoteOperationalError,
    /// 4: invalid RD request.
    InvalidRdRequest,
    /// 5–31: reserved.
    Reserved(u8),
}

impl NakCode {
    /// Decodes the five-bit code.
    pub fn from_bits(code: u8) -> NakCode {
        match code & 0x1f {
            0 => NakCode::PsnSequenceError,
            1 => NakCode::InvalidRequest,
            2 => NakCode::RemoteAccessError,
            3 => NakCode::RemoteOperationalError,
            4 => NakCode::InvalidRdRequest,
            other => NakCode::Reserved(other),
        }
    }

    /// The five-bit code.
    pub fn code(self) -> u8 {
        match self {
            NakCode::PsnSequenceError => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessError => 2,
            NakCode::RemoteOperationalError => 3,
            NakCode::InvalidRdRequest => 4,
            NakCode::Reserved(c) => c & 0x1f,
        }
    }

    /// The IBA name.
    pub fn as_str(self) -> &'static str {
        match self {
            NakCode::PsnSequenceError => "PSN sequence error",
            NakCode::InvalidRequest => "invalid request",
            NakCode::RemoteAccessError => "remote access error",
            NakCode::RemoteOperationalError => "remote operational error",
            NakCode::InvalidRdRequest => "invalid RD request",
            NakCode::Reserved(_) => "reserved",
        }
    }
}

impl fmt::Display for NakCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The AETH syndrome (IBA 9.7.5.2.2): bits 6–5 choose ACK (`00`), RNR NAK (`01`) or NAK (`11`);
/// the low five bits are the credit count, the RNR timer or the NAK code. Bit 7 is reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AethSyndrome {
    /// Positive acknowledgement with the encoded end-to-end credit count (31: credits invalid).
    Ack {
        /// The five-bit credit code; see [`credit_count`].
        credits: u8,
    },
    /// Receiver not ready: retry after the encoded timer.
    RnrNak {
        /// The five-bit timer code; see [`rnr_timer_micros`].
        timer: u8,
    },
    /// Negative acknowledgement.
    Nak(NakCode),
    /// A syndrome with bit 7 set or the reserved type `10`.
    Reserved(u8),
}

impl AethSyndrome {
    /// Decodes the syndrome byte.
    pub fn from_byte(b: u8) -> AethSyndrome {
        let low = b & 0x1f;
        match b >> 5 {
            0b000 => AethSyndrome::Ack { credits: low },
            0b001 => AethSyndrome::RnrNak { timer: low },
            0b011 => AethSyndrome::Nak(NakCode::from_bits(low)),
            _ => AethSyndrome::Reserved(b),
        }
    }

    /// Encodes the syndrome byte.
    pub fn to_byte(self) -> u8 {
        match self {
            AethSyndrome::Ack { credits } => credits & 0x1f,
            AethSyndrome::RnrNak { timer } => 0x20 | (timer & 0x1f),
            AethSyndrome::Nak(code) => 0x60 | code.code(),
            AethSyndrome::Reserved(b) => b,
        }
    }

    /// True for RNR NAK and NAK.
    pub fn is_nak(self) -> bool {
        matches!(self, AethSyndrome::RnrNak { .. } | AethSyndrome::Nak(_))
    }
}

impl fmt::Display for AethSyndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AethSyndrome::Ack { credits } => write!(f, "ACK credits={credits}"),
            AethSyndrome::RnrNak { timer } => {
                let us = rnr_timer_micros(timer);
                write!(
                    f,
                    "RNR-NAK timer={timer} ({}.{:02} ms)",
                    us / 1000,
                    (us % 1000) / 10
                )
            }
            AethSyndrome::Nak(code) => write!(f, "NAK code={} ({code})", code.code()),
            AethSyndrome::Reserved(b) => write!(f, "reserved 0x{b:02x}"),
        }
    }
}

impl Serialize for AethSyndrome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(3))?;
        match *self {
            AethSyndrome::Ack { credits } => {
                m.serialize_entry("type", "ACK")?;
                m.serialize_entry("credits", &credits)?;
                m.serialize_entry("credit_count", &credit_count(credits))?;
            }
            AethSyndrome::RnrNak { timer } => {
                m.serialize_entry("type", "RNR_NAK")?;
                m.serialize_entry("timer", &timer)?;
                m.serialize_entry("timer_us", &rnr_timer_micros(timer))?;
            }
            AethSyndrome::Nak(code) => {
                m.serialize_entry("type", "NAK")?;
                m.serialize_entry("code", &code.code())?;
                m.serialize_entry("reason", code.as_str())?;
            }
            AethSyndrome::Reserved(b) => {
                m.serialize_entry("type", "reserved")?;
                m.serialize_entry("syndrome", &b)?;
            }
        }
        m.end()
    }
}

/// ACK Extended Transport Header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Aeth {
    /// The decoded syndrome.
    pub syndrome: AethSyndrome,
    /// Message sequence number (24 bits): the last request message completed.
    pub msn: u32,
}

/// Minimum RNR NAK delays in microseconds, indexed by the five-bit timer code (IBA table 45).
const RNR_TIMER_MICROS: [u32; 32] = [
    655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1_280, 1_920, 2_560, 3_840,
    5_120, 7_680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840,
    245_760, 327_680, 491_520,
];

/// The RNR NAK delay a five-bit timer code asks for, in microseconds.
pub fn rnr_timer_micros(code: u8) -> u32 {
    RNR_TIMER_MICROS[usize::from(code & 0x1f)]
}

/// The number of end-to-end credits an ACK's five-bit credit code grants (IBA table 44),
/// or `None` for code 31, "invalid" (the responder does not use credit flow control).
pub fn credit_count(code: u8) -> Option<u32> {
    match code & 0x1f {
        31 => None,
        // Codes 0..=3 are 0..=3 credits; from there the count alternates ×1.5 and ×4/3 steps:
        // 4, 6, 8, 12, 16, 24, … i.e. 2^(k/2 + 1) for even k, 3·2^((k-1)/2) for odd k, k = code - 4.
        c @ 0..=3 => Some(u32::from(c)),
        c => {
            let k = u32::from(c) - 4;
            Some(if k % 2 == 0 {
                1 << (k / 2 + 2)
            } else {
                3 << ((k - 1) / 2 + 1)
            })
        }
    }
}

/// Every extension header a packet carried; which ones are present follows from the opcode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct ExtHeaders {
    /// RDETH (RD).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rdeth: Option<Rdeth>,
    /// DETH (UD, RD requests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deth: Option<Deth>,
    /// XRCETH (XRC requests).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xrceth: Option<XrcEth>,
    /// FETH (FLUSH).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feth: Option<Feth>,
    /// RETH (RDMA WRITE First/Only, READ Request, FLUSH, ATOMIC WRITE).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reth: Option<Reth>,
    /// AtomicETH (CmpSwap, FetchAdd).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_eth: Option<AtomicEth>,
    /// AETH (Acknowledge, ATOMIC Acknowledge, READ Response First/Last/Only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aeth: Option<Aeth>,
    /// AtomicAckETH (ATOMIC Acknowledge).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub atomic_ack_eth: Option<AtomicAckEth>,
    /// ImmDt (the "with Immediate" opcodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub immdt: Option<ImmDt>,
    /// IETH (the "with Invalidate" opcodes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ieth: Option<Ieth>,
}

impl ExtHeaders {
    /// Reads `kinds` in order from `r`.
    pub(crate) fn parse(
        kinds: &[ExtHeaderKind],
        r: &mut Reader<'_>,
    ) -> Result<ExtHeaders, DecodeError> {
        let mut e = ExtHeaders::default();
        for &kind in kinds {
            let layer = kind.as_str();
            match kind {
                ExtHeaderKind::Rdeth => {
                    let h: &[u8; 4] = r.array(layer)?;
                    e.rdeth = Some(Rdeth {
                        eecnxt: be24(sub(h, 1)),
                    });
                }
                ExtHeaderKind::Deth => {
                    let h: &[u8; 8] = r.array(layer)?;
                    e.deth = Some(Deth {
                        qkey: be32(sub(h, 0)),
                        src_qp: be24(sub(h, 5)),
                    });
                }
                ExtHeaderKind::XrcEth => {
                    let h: &[u8; 4] = r.array(layer)?;
                    e.xrceth = Some(XrcEth {
                        xrcsrq: be24(sub(h, 1)),
                    });
                }
                ExtHeaderKind::Feth => {
                    let h: &[u8; 4] = r.array(layer)?;
                    let bits = be32(*h);
                    e.feth = Some(Feth {
                        selectivity: ((bits >> 4) & 0x3) as u8,
                        placement_type: (bits & 0xf) as u8,
                    });
                }
                ExtHeaderKind::Reth => {
                    let h: &[u8; 16] = r.array(layer)?;
                    e.reth = Some(Reth {
                        va: be64(sub(h, 0)),
                        rkey: be32(sub(h, 8)),
                        dma_len: be32(sub(h, 12)),
                    });
                }
                ExtHeaderKind::AtomicEth => {
                    let h: &[u8; 28] = r.array(layer)?;
                    e.atomic_eth = Some(AtomicEth {
                        va: be64(sub(h, 0)),
                        rkey: be32(sub(h, 8)),
                        swap_or_add: be64(sub(h, 12)),
                        compare: be64(sub(h, 20)),
                    });
                }
                ExtHeaderKind::Aeth => {
                    let h: &[u8; 4] = r.array(layer)?;
                    e.aeth = Some(Aeth {
                        syndrome: AethSyndrome::from_byte(h[0]),
                        msn: be24(sub(h, 1)),
                    });
                }
                ExtHeaderKind::AtomicAckEth => {
                    let h: &[u8; 8] = r.array(layer)?;
                    e.atomic_ack_eth = Some(AtomicAckEth { orig: be64(*h) });
                }
                ExtHeaderKind::ImmDt => {
                    let h: &[u8; 4] = r.array(layer)?;
                    e.immdt = Some(ImmDt(be32(*h)));
                }
                ExtHeaderKind::Ieth => {
                    let h: &[u8; 4] = r.array(layer)?;
                    e.ieth = Some(Ieth { rkey: be32(*h) });
                }
            }
        }
        Ok(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syndrome_classes() {
        assert_eq!(
            AethSyndrome::from_byte(0x1f),
            AethSyndrome::Ack { credits: 31 }
        );
        assert_eq!(
            AethSyndrome::from_byte(0x00),
            AethSyndrome::Ack { credits: 0 }
        );
        assert_eq!(
            AethSyndrome::from_byte(0x2e),
            AethSyndrome::RnrNak { timer: 14 }
        );
        assert_eq!(
            AethSyndrome::from_byte(0x60),
            AethSyndrome::Nak(NakCode::PsnSequenceError)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x61),
            AethSyndrome::Nak(NakCode::InvalidRequest)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x62),
            AethSyndrome::Nak(NakCode::RemoteAccessError)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x63),
            AethSyndrome::Nak(NakCode::RemoteOperationalError)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x64),
            AethSyndrome::Nak(NakCode::InvalidRdRequest)
        );
        assert_eq!(
            AethSyndrome::from_byte(0x65),
            AethSyndrome::Nak(NakCode::Reserved(5))
        );
        assert_eq!(AethSyndrome::from_byte(0x40), AethSyndrome::Reserved(0x40));
        assert_eq!(AethSyndrome::from_byte(0x80), AethSyndrome::Reserved(0x80));
        for b in 0..=255u8 {
            assert_eq!(AethSyndrome::from_byte(b).to_byte(), b, "{b:#x}");
        }
    }

    #[test]
    fn syndrome_text() {
        assert_eq!(
            AethSyndrome::Ack { credits: 31 }.to_string(),
            "ACK credits=31"
        );
        assert_eq!(
            AethSyndrome::RnrNak { timer: 14 }.to_string(),
            "RNR-NAK timer=14 (1.28 ms)"
        );
        assert_eq!(
            AethSyndrome::Nak(NakCode::RemoteAccessError).to_string(),
            "NAK code=2 (remote access error)"
        );
    }

    #[test]
    fn rnr_and_credit_tables() {
        assert_eq!(rnr_timer_micros(0), 655_360);
        assert_eq!(rnr_timer_micros(1), 10);
        assert_eq!(rnr_timer_micros(12), 640);
        assert_eq!(rnr_timer_micros(31), 491_520);
        let credits: Vec<u32> = (0..31).filter_map(credit_count).collect();
        assert_eq!(
            credits,
            [
                0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768,
                1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768
            ]
        );
        assert_eq!(credit_count(31), None);
    }

    #[test]
    fn parses_in_order_and_names_the_truncated_header() {
        let bytes = [
            0x00, 0x00, 0x00, 0x07, // RDETH eecnxt 7
            0x11, 0x22, 0x33, 0x44, 0x00, 0x00, 0x00, 0x09, // DETH
            0x00, 0x00, 0x7f, 0x00, 0x00, 0x00, 0x10, 0x00, 0xca, 0xfe, 0x00, 0x01, 0x00, 0x00,
            0x04, 0x00, // RETH
            0xde, 0xad, 0xbe, 0xef, // ImmDt
        ];
        use ExtHeaderKind::*;
        let kinds = [Rdeth, Deth, Reth, ImmDt];
        let e = ExtHeaders::parse(&kinds, &mut Reader::new(&bytes, 0)).unwrap();
        assert_eq!(e.rdeth, Some(super::Rdeth { eecnxt: 7 }));
        assert_eq!(
            e.deth,
            Some(super::Deth {
                qkey: 0x11223344,
                src_qp: 9
            })
        );
        assert_eq!(
            e.reth,
            Some(super::Reth {
                va: 0x7f00_0000_1000,
                rkey: 0xcafe0001,
                dma_len: 1024
            })
        );
        assert_eq!(e.immdt, Some(super::ImmDt(0xdeadbeef)));
        let err = ExtHeaders::parse(&kinds, &mut Reader::new(&bytes[..20], 42)).unwrap_err();
        assert_eq!(
            err,
            DecodeError::Truncated {
                layer: "RETH",
                offset: 54,
                needed: 16,
                available: 8
            }
        );
    }
}
