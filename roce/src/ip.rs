//! IPv4 and IPv6 headers, as far as RoCEv2 needs them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Serialize, Serializer};

use crate::error::{DecodeError, NotRoce};
use crate::reader::{be16, be32, sub};

/// IP protocol / IPv6 next header number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// The two-bit ECN field (RFC 3168). Switches mark congestion with CE; a RoCEv2 receiver
/// answers CE-marked packets with CNPs (DCQCN), so it is decoded by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ecn {
    /// 00: not ECN-capable.
    NotEct,
    /// 01: ECN-capable transport (1).
    Ect1,
    /// 10: ECN-capable transport (0).
    Ect0,
    /// 11: congestion experienced.
    Ce,
}

impl Ecn {
    /// The ECN codepoint in the two low bits of `tos`.
    pub fn from_bits(tos: u8) -> Ecn {
        match tos & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// The RFC 3168 name.
    pub fn as_str(self) -> &'static str {
        match self {
            Ecn::NotEct => "Not-ECT",
            Ecn::Ect1 => "ECT(1)",
            Ecn::Ect0 => "ECT(0)",
            Ecn::Ce => "CE",
        }
    }
}

impl fmt::Display for Ecn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Ecn {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// An IPv4 header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Ipv4 {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Header length in bytes (IHL × 4).
    pub header_len: u8,
    /// Differentiated services code point (6 bits).
    pub dscp: u8,
    /// ECN codepoint.
    pub ecn: Ecn,
    /// Total length of the datagram.
    pub total_length: u16,
    /// Identification.
    #[serde(serialize_with = "crate::hex::u16")]
    pub identification: u16,
    /// Don't Fragment flag.
    pub dont_fragment: bool,
    /// Time to live.
    pub ttl: u8,
    /// Protocol (17 for RoCEv2).
    pub protocol: u8,
    /// Header checksum as sent.
    #[serde(serialize_with = "crate::hex::u16")]
    pub checksum: u16,
    /// Whether the header checksum verifies.
    pub checksum_ok: bool,
}

impl Ipv4 {
    /// Parses the header at the start of `buf`; `base` is its offset for error messages.
    /// Only UDP, unfragmented datagrams are accepted.
    pub(crate) fn parse(buf: &[u8], base: usize) -> Result<Ipv4, DecodeError> {
        let fixed: [u8; 20] = match buf.get(..20).and_then(|b| <[u8; 20]>::try_from(b).ok()) {
            Some(h) => h,
            None => return Err(truncated("IPv4 header", base, 20, buf.len())),
        };
        let version = fixed[0] >> 4;
        if version != 4 {
            return Err(DecodeError::BadIpVersion {
                version,
                expected: "4",
                offset: base,
            });
        }
        let ihl = fixed[0] & 0x0f;
        if ihl < 5 {
            return Err(DecodeError::BadIpv4HeaderLength { ihl, offset: base });
        }
        let header_len = usize::from(ihl) * 4;
        let header = buf
            .get(..header_len)
            .ok_or_else(|| truncated("IPv4 options", base + 20, header_len - 20, buf.len() - 20))?;
        let protocol = fixed[9];
        if protocol != IPPROTO_UDP {
            return Err(DecodeError::NotRoce(NotRoce::IpProtocol(protocol)));
        }
        let total_length = be16([fixed[2], fixed[3]]);
        if usize::from(total_length) < header_len + 8 {
            return Err(DecodeError::BadIpLength {
                field: "IPv4 total length",
                value: usize::from(total_length),
                minimum: header_len + 8,
            });
        }
        let flags_frag = be16([fixed[6], fixed[7]]);
        let more_fragments = flags_frag & 0x2000 != 0;
        let fragment_offset = flags_frag & 0x1fff;
        if more_fragments || fragment_offset != 0 {
            return Err(DecodeError::Fragmented {
                fragment_offset,
                more_fragments,
            });
        }
        Ok(Ipv4 {
            src: Ipv4Addr::from(be32(sub(&fixed, 12))),
            dst: Ipv4Addr::from(be32(sub(&fixed, 16))),
            header_len: ihl * 4,
            dscp: fixed[1] >> 2,
            ecn: Ecn::from_bits(fixed[1]),
            total_length,
            identification: be16([fixed[4], fixed[5]]),
            dont_fragment: flags_frag & 0x4000 != 0,
            ttl: fixed[8],
            protocol,
            checksum: be16([fixed[10], fixed[11]]),
            checksum_ok: internet_checksum(header) == 0,
        })
    }
}

/// An IPv6 fixed header (extension headers are not followed: RoCEv2 does not use them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Ipv6 {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Differentiated services code point (upper 6 bits of the traffic class).
    pub dscp: u8,
    /// ECN codepoint (lower 2 bits of the traffic class).
    pub ecn: Ecn,
    /// Flow label (20 bits); RoCEv2 stacks often derive it from the QP numbers.
    #[serde(serialize_with = "crate::hex::u32")]
    pub flow_label: u32,
    /// Payload length (everything after the 40-byte header).
    pub payload_length: u16,
    /// Next header (17 for RoCEv2).
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Ipv6 {
    /// Length of the fixed header.
    pub const LEN: usize = 40;

    /// Parses the fixed header at the start of `buf`; `base` is its offset for errors.
    pub(crate) fn parse(buf: &[u8], base: usize) -> Result<Ipv6, DecodeError> {
        let h: [u8; 40] = match buf.get(..40).and_then(|b| <[u8; 40]>::try_from(b).ok()) {
            Some(h) => h,
            None => return Err(truncated("IPv6 header", base, 40, buf.len())),
        };
        let version = h[0] >> 4;
        if version != 6 {
            return Err(DecodeError::BadIpVersion {
                version,
                expected: "6",
                offset: base,
            });
        }
        let next_header = h[6];
        if next_header != IPPROTO_UDP {
            return Err(DecodeError::NotRoce(NotRoce::IpProtocol(next_header)));
        }
        let word0 = be32(sub(&h, 0));
        let traffic_class = ((word0 >> 20) & 0xff) as u8;
        let payload_length = be16([h[4], h[5]]);
        if payload_length < 8 {
            return Err(DecodeError::BadIpLength {
                field: "IPv6 payload length",
                value: usize::from(payload_length),
                minimum: 8,
            });
        }
        Ok(Ipv6 {
            src: Ipv6Addr::from(sub::<16, 40>(&h, 8)),
            dst: Ipv6Addr::from(sub::<16, 40>(&h, 24)),
            dscp: traffic_class >> 2,
            ecn: Ecn::from_bits(traffic_class),
            flow_label: word0 & 0x000f_ffff,
            payload_length,
            next_header,
            hop_limit: h[7],
        })
    }
}

/// The network layer of a RoCEv2 packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "version")]
pub enum IpHeader {
    /// IPv4.
    #[serde(rename = "4")]
    V4(Ipv4),
    /// IPv6.
    #[serde(rename = "6")]
    V6(Ipv6),
}

impl IpHeader {
    /// Source address.
    pub fn src(&self) -> IpAddr {
        match self {
            IpHeader::V4(h) => IpAddr::V4(h.src),
            IpHeader::V6(h) => IpAddr::V6(h.src),
        }
    }

    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        match self {
            IpHeader::V4(h) => IpAddr::V4(h.dst),
            IpHeader::V6(h) => IpAddr::V6(h.dst),
        }
    }

    /// ECN codepoint.
    pub fn ecn(&self) -> Ecn {
        match self {
            IpHeader::V4(h) => h.ecn,
            IpHeader::V6(h) => h.ecn,
        }
    }

    /// DSCP.
    pub fn dscp(&self) -> u8 {
        match self {
            IpHeader::V4(h) => h.dscp,
            IpHeader::V6(h) => h.dscp,
        }
    }

    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        match self {
            IpHeader::V4(h) => usize::from(h.header_len),
            IpHeader::V6(_) => Ipv6::LEN,
        }
    }

    /// Length of the whole datagram according to the header.
    pub fn datagram_len(&self) -> usize {
        match self {
            IpHeader::V4(h) => usize::from(h.total_length),
            IpHeader::V6(h) => Ipv6::LEN + usize::from(h.payload_length),
        }
    }
}

/// The RFC 1071 one's-complement sum, complemented: 0 over a header whose checksum is right.
pub fn internet_checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|c| match *c {
            [hi, lo] => u32::from(u16::from_be_bytes([hi, lo])),
            [hi] => u32::from(hi) << 8,
            _ => 0,
        })
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn truncated(layer: &'static str, offset: usize, needed: usize, available: usize) -> DecodeError {
    DecodeError::Truncated {
        layer,
        offset,
        needed,
        available,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The IPv4 header of the ConnectX-4 Lx CNP capture in scapy's test/contrib/roce.uts.
    const CX4_CNP_IPV4: [u8; 20] = [
        0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11,
        0x01, 0x0a, 0x00, 0x12, 0x01,
    ];

    #[test]
    fn ipv4_fields_and_checksum() {
        let h = Ipv4::parse(&CX4_CNP_IPV4, 14).unwrap();
        assert_eq!(h.src, Ipv4Addr::new(10, 0, 17, 1));
        assert_eq!(h.dst, Ipv4Addr::new(10, 0, 18, 1));
        assert_eq!((h.dscp, h.ecn), (48, Ecn::Ect0));
        assert_eq!(
            (h.total_length, h.ttl, h.protocol, h.header_len),
            (60, 64, 17, 20)
        );
        assert!(h.dont_fragment);
        assert!(h.checksum_ok);
        let mut bad = CX4_CNP_IPV4;
        bad[11] ^= 1;
        assert!(!Ipv4::parse(&bad, 0).unwrap().checksum_ok);
    }

    #[test]
    fn ipv4_rejects_malformed() {
        let mut h = CX4_CNP_IPV4;
        h[0] = 0x65;
        assert_eq!(
            Ipv4::parse(&h, 14),
            Err(DecodeError::BadIpVersion {
                version: 6,
                expected: "4",
                offset: 14
            })
        );
        h[0] = 0x44;
        assert_eq!(
            Ipv4::parse(&h, 14),
            Err(DecodeError::BadIpv4HeaderLength { ihl: 4, offset: 14 })
        );
        h[0] = 0x46;
        assert!(matches!(
            Ipv4::parse(&h, 14),
            Err(DecodeError::Truncated {
                layer: "IPv4 options",
                ..
            })
        ));
        let mut h = CX4_CNP_IPV4;
        h[9] = 6;
        assert_eq!(
            Ipv4::parse(&h, 0),
            Err(DecodeError::NotRoce(NotRoce::IpProtocol(6)))
        );
        let mut h = CX4_CNP_IPV4;
        h[6] = 0x20;
        assert_eq!(
            Ipv4::parse(&h, 0),
            Err(DecodeError::Fragmented {
                fragment_offset: 0,
                more_fragments: true
            })
        );
        let mut h = CX4_CNP_IPV4;
        h[3] = 27;
        assert!(matches!(
            Ipv4::parse(&h, 0),
            Err(DecodeError::BadIpLength {
                value: 27,
                minimum: 28,
                ..
            })
        ));
    }

    #[test]
    fn ipv6_fields() {
        let mut h = [0u8; 40];
        h[..4].copy_from_slice(&[0x6a, 0x3f, 0x23, 0x45]); // tc 0xa3, flow 0xf2345
        h[4..8].copy_from_slice(&[0x00, 0x20, 17, 63]);
        h[23] = 1;
        h[39] = 2;
        let v6 = Ipv6::parse(&h, 0).unwrap();
        assert_eq!(
            (v6.dscp, v6.ecn, v6.flow_label),
            (0xa3 >> 2, Ecn::Ce, 0xf2345)
        );
        assert_eq!((v6.payload_length, v6.hop_limit), (32, 63));
        assert_eq!(v6.src, "::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(IpHeader::V6(v6).datagram_len(), 72);
        h[6] = 58;
        assert_eq!(
            Ipv6::parse(&h, 0),
            Err(DecodeError::NotRoce(NotRoce::IpProtocol(58)))
        );
        assert!(matches!(
            Ipv6::parse(&h[..39], 0),
            Err(DecodeError::Truncated {
                needed: 40,
                available: 39,
                ..
            })
        ));
    }

    #[test]
    fn checksum_of_odd_length() {
        assert_eq!(internet_checksum(&[0xff]), 0x00ff);
        assert_eq!(internet_checksum(&[]), 0xffff);
    }
}
