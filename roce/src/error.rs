//! Why a buffer is not a decodable RoCEv2 packet.

use std::fmt;

use serde::Serialize;

/// A decoding failure. Each variant names the problem and, where it has one, the byte offset
/// (from the start of the buffer handed to the entry point) at which it was found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[non_exhaustive]
pub enum DecodeError {
    /// The buffer ends before a header (or the payload its lengths announce) does.
    #[error(
        "truncated {layer}: need {needed} bytes at offset {offset}, only {available} available"
    )]
    Truncated {
        /// The header or region being read, e.g. "IPv4 header", "RETH".
        layer: &'static str,
        /// Offset of that header or region.
        offset: usize,
        /// Bytes it needs.
        needed: usize,
        /// Bytes left in the buffer from `offset`.
        available: usize,
    },

    /// A well-formed packet, but not RoCEv2 (not UDP to port 4791).
    #[error("not RoCEv2: {0}")]
    NotRoce(NotRoce),

    /// The Ethernet frame carries neither IPv4, IPv6 nor an 802.1Q tag in front of them.
    #[error("unsupported ethertype 0x{0:04x}")]
    UnsupportedEthertype(u16),

    /// The version nibble of the IP header is neither 4 nor the one the caller expected.
    #[error("bad IP version {version} at offset {offset} (expected {expected})")]
    BadIpVersion {
        /// The version found.
        version: u8,
        /// The version the ethertype (or, for raw IP, 4 or 6) announced.
        expected: &'static str,
        /// Offset of the IP header.
        offset: usize,
    },

    /// IPv4 IHL below 5 words: the header cannot hold its own fixed fields.
    #[error("bad IPv4 header length: IHL {ihl} (< 5) at offset {offset}")]
    BadIpv4HeaderLength {
        /// The IHL field, in 32-bit words.
        ihl: u8,
        /// Offset of the IP header.
        offset: usize,
    },

    /// An IP length field is smaller than the headers it must contain.
    #[error("bad {field}: {value} is smaller than the {minimum} bytes of headers it must cover")]
    BadIpLength {
        /// "IPv4 total length" or "IPv6 payload length".
        field: &'static str,
        /// The field's value.
        value: usize,
        /// The smallest legal value.
        minimum: usize,
    },

    /// The datagram is an IP fragment; RoCEv2 packets are never fragmented.
    #[error("IPv4 fragment (offset {fragment_offset}, more fragments: {more_fragments}); RoCEv2 is never fragmented")]
    Fragmented {
        /// Fragment offset, in 8-byte units.
        fragment_offset: u16,
        /// The MF flag.
        more_fragments: bool,
    },

    /// The UDP length field disagrees with the IP layer's length.
    #[error("UDP length {udp_length} inconsistent with the {ip_payload} bytes of IP payload")]
    UdpLengthMismatch {
        /// The UDP length field.
        udp_length: u16,
        /// The IP payload length.
        ip_payload: usize,
    },

    /// The UDP payload is too short for a BTH and an ICRC.
    #[error("UDP payload of {len} bytes is too short for a BTH (12) and ICRC (4)")]
    RoceTooShort {
        /// The UDP payload length.
        len: usize,
    },

    /// An opcode IBA reserves, or one outside the RoCE transports.
    #[error("unknown or reserved BTH opcode 0x{0:02x}")]
    UnknownOpcode(u8),

    /// The BTH pad count exceeds the bytes between the headers and the ICRC.
    #[error("bad pad count {pad_count}: only {available} bytes between the {opcode} headers and the ICRC")]
    BadPadCount {
        /// The BTH PadCnt field.
        pad_count: u8,
        /// Bytes available for payload plus pad.
        available: usize,
        /// The opcode's name.
        opcode: &'static str,
    },

    /// The payload length is not what the opcode allows.
    #[error("{opcode} (0x{code:02x}) carries {expected} but {found} bytes follow its headers")]
    BadPayloadLength {
        /// The opcode's name.
        opcode: &'static str,
        /// The opcode.
        code: u8,
        /// What the opcode allows, e.g. "no payload", "exactly 8 bytes".
        expected: PayloadExpectation,
        /// Bytes found.
        found: usize,
    },
}

/// What an opcode allows after its headers, for [`DecodeError::BadPayloadLength`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum PayloadExpectation {
    /// The opcode has no payload.
    Nothing,
    /// The opcode carries exactly this many bytes.
    Exactly(usize),
}

impl fmt::Display for PayloadExpectation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PayloadExpectation::Nothing => f.write_str("no payload"),
            PayloadExpectation::Exactly(n) => write!(f, "exactly {n} bytes"),
        }
    }
}

/// What a non-RoCEv2 packet turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[non_exhaustive]
pub enum NotRoce {
    /// Ethertype 0x8915: RoCE v1 (IB GRH straight over Ethernet), which this decoder does not read.
    RoceV1,
    /// An IP protocol (IPv4) or next header (IPv6) other than UDP.
    IpProtocol(u8),
    /// UDP, but the destination port is not 4791.
    UdpPort {
        /// Source port.
        src: u16,
        /// Destination port.
        dst: u16,
    },
}

impl fmt::Display for NotRoce {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotRoce::RoceV1 => f.write_str("RoCE v1 (ethertype 0x8915) is not decoded"),
            NotRoce::IpProtocol(p) => {
                write!(f, "IP protocol {p} ({}), not UDP", ip_protocol_name(*p))
            }
            NotRoce::UdpPort { src, dst } => {
                write!(f, "UDP {src} -> {dst}, not to the RoCEv2 port 4791")
            }
        }
    }
}

fn ip_protocol_name(p: u8) -> &'static str {
    match p {
        0 => "IPv6 hop-by-hop options",
        1 => "ICMP",
        2 => "IGMP",
        6 => "TCP",
        17 => "UDP",
        43 => "IPv6 routing header",
        44 => "IPv6 fragment header",
        47 => "GRE",
        50 => "ESP",
        51 => "AH",
        58 => "ICMPv6",
        60 => "IPv6 destination options",
        132 => "SCTP",
        _ => "other",
    }
}

impl DecodeError {
    /// A short stable identifier of the variant, for counting errors by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::NotRoce(_) => "not_roce",
            DecodeError::UnsupportedEthertype(_) => "unsupported_ethertype",
            DecodeError::BadIpVersion { .. } => "bad_ip_version",
            DecodeError::BadIpv4HeaderLength { .. } => "bad_ipv4_header_length",
            DecodeError::BadIpLength { .. } => "bad_ip_length",
            DecodeError::Fragmented { .. } => "fragmented",
            DecodeError::UdpLengthMismatch { .. } => "udp_length_mismatch",
            DecodeError::RoceTooShort { .. } => "roce_too_short",
            DecodeError::UnknownOpcode(_) => "unknown_opcode",
            DecodeError::BadPadCount { .. } => "bad_pad_count",
            DecodeError::BadPayloadLength { .. } => "bad_payload_length",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_problem() {
        let e = DecodeError::Truncated {
            layer: "RETH",
            offset: 54,
            needed: 16,
            available: 3,
        };
        assert_eq!(
            e.to_string(),
            "truncated RETH: need 16 bytes at offset 54, only 3 available"
        );
        assert_eq!(
            DecodeError::UnknownOpcode(0x15).to_string(),
            "unknown or reserved BTH opcode 0x15"
        );
        let e = DecodeError::NotRoce(NotRoce::UdpPort { src: 5000, dst: 53 });
        assert_eq!(
            e.to_string(),
            "not RoCEv2: UDP 5000 -> 53, not to the RoCEv2 port 4791"
        );
        let e = DecodeError::NotRoce(NotRoce::IpProtocol(6));
        assert_eq!(e.to_string(), "not RoCEv2: IP protocol 6 (TCP), not UDP");
        let e = DecodeError::BadPayloadLength {
            opcode: "RC Acknowledge",
            code: 0x11,
            expected: PayloadExpectation::Nothing,
            found: 4,
        };
        assert_eq!(
            e.to_string(),
            "RC Acknowledge (0x11) carries no payload but 4 bytes follow its headers"
        );
        assert_eq!(e.kind(), "bad_payload_length");
    }
}
