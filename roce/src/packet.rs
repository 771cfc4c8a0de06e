//! A decoded RoCEv2 packet and the layer-by-layer decoding that produces it.

use std::net::SocketAddr;

use serde::Serialize;

use crate::bth::Bth;
use crate::error::{DecodeError, NotRoce, PayloadExpectation};
use crate::eth::{Ethernet, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::ext::ExtHeaders;
use crate::icrc::{self, ICRC_LEN};
use crate::ip::{IpHeader, Ipv4, Ipv6};
use crate::opcode::{Opcode, PayloadRule};
use crate::reader::Reader;
use crate::sll::{LinuxSll, SllVersion};
use crate::udp::{Udp, ROCE_V2_PORT};

/// The outcome of checking the ICRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum IcrcCheck {
    /// The ICRC in the packet matches the one recomputed over the invariant fields.
    Valid,
    /// The ICRC in the packet differs from the recomputed one.
    Invalid {
        /// The ICRC the packet should carry, in the same byte order as [`Packet::icrc`].
        #[serde(serialize_with = "crate::hex::u32")]
        computed: u32,
    },
    /// Not checkable: the ICRC covers the IP and UDP headers, which the caller did not supply
    /// ([`decode_udp_payload`](crate::decode_udp_payload)).
    NoIpHeader,
    /// Not checkable: the capture's snap length cut the packet before its end.
    Truncated,
}

/// A decoded RoCEv2 packet. Borrows its payload from the buffer it was decoded from.
///
/// Layers the caller did not supply are `None`: `ethernet` for
/// [`decode_ip`](crate::decode_ip), and `ethernet`, `ip`, `udp` for
/// [`decode_udp_payload`](crate::decode_udp_payload).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Packet<'a> {
    /// The Ethernet header, when decoding a frame.
    pub ethernet: Option<Ethernet>,
    /// The Linux cooked capture header, when decoding a `tcpdump -i any` record
    /// ([`decode_sll_snapped`](crate::decode_sll_snapped)). Left out of JSON when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cooked: Option<LinuxSll>,
    /// The IP header.
    pub ip: Option<IpHeader>,
    /// The UDP header.
    pub udp: Option<Udp>,
    /// The Base Transport Header.
    pub bth: Bth,
    /// The extension headers the opcode implies.
    pub ext: ExtHeaders,
    /// The payload as captured: no pad bytes, no ICRC; shorter than `payload_len` when the
    /// capture was truncated.
    #[serde(serialize_with = "crate::hex::bytes")]
    pub payload: &'a [u8],
    /// The payload length on the wire.
    pub payload_len: usize,
    /// True if the capture's snap length cut this packet (the payload is incomplete and the
    /// ICRC missing).
    pub truncated: bool,
    /// The ICRC's four bytes read in network order: the value Wireshark ("Invariant CRC") and
    /// scapy display. The CRC-32 itself is stored least significant byte first, so it is
    /// `icrc::from_wire(icrc.to_be_bytes())`.
    #[serde(serialize_with = "crate::hex::opt_u32")]
    pub icrc: Option<u32>,
    /// The result of recomputing the ICRC.
    pub icrc_check: IcrcCheck,
    /// Shorthand for `icrc_check == IcrcCheck::Valid`.
    pub icrc_ok: bool,
}

impl Packet<'_> {
    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        self.bth.opcode
    }

    /// Source IP address and UDP port, if the IP and UDP headers were decoded.
    pub fn src(&self) -> Option<SocketAddr> {
        Some(SocketAddr::new(self.ip?.src(), self.udp?.src_port))
    }

    /// Destination IP address and UDP port, if the IP and UDP headers were decoded.
    pub fn dst(&self) -> Option<SocketAddr> {
        Some(SocketAddr::new(self.ip?.dst(), self.udp?.dst_port))
    }
}

/// Where the bytes after the end of the buffer went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Capture {
    /// The buffer is everything: a length field pointing past it means a malformed packet.
    Whole,
    /// A snap length cut the buffer: length fields may point past it.
    Snapped,
}

impl Capture {
    fn of(captured: usize, orig_len: usize) -> Capture {
        if orig_len > captured {
            Capture::Snapped
        } else {
            Capture::Whole
        }
    }
}

pub(crate) fn ethernet(frame: &[u8], orig_len: usize) -> Result<Packet<'_>, DecodeError> {
    let capture = Capture::of(frame.len(), orig_len);
    let mut r = Reader::new(frame, 0);
    let eth = Ethernet::parse(&mut r)?;
    let expected = match eth.ethertype {
        ETHERTYPE_IPV4 => IpExpect::V4,
        ETHERTYPE_IPV6 => IpExpect::V6,
        other => return Err(DecodeError::UnsupportedEthertype(other)),
    };
    let mut p = ip(r.rest(), r.offset(), capture, expected)?;
    p.ethernet = Some(eth);
    Ok(p)
}

pub(crate) fn cooked(
    record: &[u8],
    orig_len: usize,
    version: SllVersion,
) -> Result<Packet<'_>, DecodeError> {
    let capture = Capture::of(record.len(), orig_len);
    let mut r = Reader::new(record, 0);
    let sll = LinuxSll::read(&mut r, version)?;
    let expected = match sll.protocol {
        ETHERTYPE_IPV4 => IpExpect::V4,
        ETHERTYPE_IPV6 => IpExpect::V6,
        other => return Err(DecodeError::UnsupportedEthertype(other)),
    };
    let mut p = ip(r.rest(), r.offset(), capture, expected)?;
    p.cooked = Some(sll);
    Ok(p)
}

pub(crate) fn raw_ip(packet: &[u8], orig_len: usize) -> Result<Packet<'_>, DecodeError> {
    ip(
        packet,
        0,
        Capture::of(packet.len(), orig_len),
        IpExpect::Either,
    )
}

pub(crate) fn udp_payload(payload: &[u8]) -> Result<Packet<'_>, DecodeError> {
    let t = transport(payload, payload.len(), 0, Capture::Whole)?;
    let icrc_check = if t.icrc.is_some() {
        IcrcCheck::NoIpHeader
    } else {
        IcrcCheck::Truncated
    };
    Ok(t.into_packet(None, None, icrc_check))
}

/// Which IP version the layer below announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IpExpect {
    V4,
    V6,
    Either,
}

fn ip(
    buf: &[u8],
    base: usize,
    capture: Capture,
    expect: IpExpect,
) -> Result<Packet<'_>, DecodeError> {
    let version = match buf.first() {
        Some(b) => b >> 4,
        None => {
            return Err(DecodeError::Truncated {
                layer: "IP header",
                offset: base,
                needed: 20,
                available: 0,
            })
        }
    };
    let header = match (version, expect) {
        (4, IpExpect::V4 | IpExpect::Either) => IpHeader::V4(Ipv4::parse(buf, base)?),
        (6, IpExpect::V6 | IpExpect::Either) => IpHeader::V6(Ipv6::parse(buf, base)?),
        (version, expect) => {
            let expected = match expect {
                IpExpect::V4 => "4, per the ethertype",
                IpExpect::V6 => "6, per the ethertype",
                IpExpect::Either => "4 or 6",
            };
            return Err(DecodeError::BadIpVersion {
                version,
                expected,
                offset: base,
            });
        }
    };
    let header_len = header.header_len();
    let datagram_len = header.datagram_len();

    // Trailing bytes past the datagram are Ethernet padding or an FCS: drop them. A datagram
    // longer than the buffer is malformed unless a snap length explains it.
    let datagram = match buf.get(..datagram_len) {
        Some(d) => d,
        None if capture == Capture::Snapped => buf,
        None => {
            return Err(DecodeError::Truncated {
                layer: "IP datagram",
                offset: base,
                needed: datagram_len,
                available: buf.len(),
            })
        }
    };
    let ip_header = datagram.get(..header_len).unwrap_or(&[]);

    let mut r = Reader::new(datagram.get(header_len..).unwrap_or(&[]), base + header_len);
    let udp = Udp::parse(r.array("UDP header")?);
    if udp.dst_port != ROCE_V2_PORT {
        return Err(DecodeError::NotRoce(NotRoce::UdpPort {
            src: udp.src_port,
            dst: udp.dst_port,
        }));
    }
    let ip_payload = datagram_len - header_len;
    if usize::from(udp.length) != ip_payload {
        return Err(DecodeError::UdpLengthMismatch {
            udp_length: udp.length,
            ip_payload,
        });
    }

    let t = transport(r.rest(), ip_payload - Udp::LEN, r.offset(), capture)?;
    let icrc_check = match t.icrc {
        None => IcrcCheck::Truncated,
        Some(found) => {
            // The ICRC covers the UDP header onwards up to the ICRC itself.
            let covered = datagram
                .get(header_len..datagram_len - ICRC_LEN)
                .unwrap_or(&[]);
            match icrc::compute(ip_header, covered)
                .map(|crc| u32::from_be_bytes(icrc::to_wire(crc)))
            {
                Some(computed) if computed == found => IcrcCheck::Valid,
                Some(computed) => IcrcCheck::Invalid { computed },
                // Unreachable for headers that parsed; report it as not checkable, not valid.
                None => IcrcCheck::Truncated,
            }
        }
    };
    Ok(t.into_packet(Some(header), Some(udp), icrc_check))
}

/// The BTH-onwards part of a packet.
struct Transport<'a> {
    bth: Bth,
    ext: ExtHeaders,
    payload: &'a [u8],
    payload_len: usize,
    icrc: Option<u32>,
}

impl<'a> Transport<'a> {
    fn into_packet(
        self,
        ip: Option<IpHeader>,
        udp: Option<Udp>,
        icrc_check: IcrcCheck,
    ) -> Packet<'a> {
        Packet {
            ethernet: None,
            cooked: None,
            ip,
            udp,
            bth: self.bth,
            ext: self.ext,
            payload: self.payload,
            payload_len: self.payload_len,
            truncated: self.icrc.is_none(),
            icrc: self.icrc,
            icrc_check,
            icrc_ok: icrc_check == IcrcCheck::Valid,
        }
    }
}

/// Decodes BTH, extension headers, payload and ICRC from `buf`, the captured part of a UDP
/// payload that is `wire_len` bytes long on the wire.
fn transport(
    buf: &[u8],
    wire_len: usize,
    base: usize,
    capture: Capture,
) -> Result<Transport<'_>, DecodeError> {
    if wire_len < Bth::LEN + ICRC_LEN {
        return Err(DecodeError::RoceTooShort { len: wire_len });
    }
    if buf.len() < wire_len && capture == Capture::Whole {
        // Only reachable from decode_udp_payload's callers that pass a shorter buffer; the IP
        // path checks the datagram length first.
        return Err(DecodeError::Truncated {
            layer: "UDP payload",
            offset: base,
            needed: wire_len,
            available: buf.len(),
        });
    }
    let body_end = wire_len - ICRC_LEN;
    // Headers must be complete in the capture and must not run into the ICRC.
    let mut r = Reader::new(buf.get(..body_end).unwrap_or(buf), base);
    let bth = Bth::parse(r.array("BTH")?)?;
    let opcode = bth.opcode;
    let ext = ExtHeaders::parse(opcode.ext_headers(), &mut r)?;

    let headers_len = Bth::LEN + opcode.ext_headers_len();
    let body_len = body_end - headers_len;
    let payload_len =
        body_len
            .checked_sub(usize::from(bth.pad_count))
            .ok_or(DecodeError::BadPadCount {
                pad_count: bth.pad_count,
                available: body_len,
                opcode: opcode.name(),
            })?;
    let expected = match opcode.payload() {
        PayloadRule::Any => None,
        PayloadRule::None if payload_len != 0 => Some(PayloadExpectation::Nothing),
        PayloadRule::Exactly(n) if payload_len != n => Some(PayloadExpectation::Exactly(n)),
        PayloadRule::None | PayloadRule::Exactly(_) => None,
    };
    if let Some(expected) = expected {
        return Err(DecodeError::BadPayloadLength {
            opcode: opcode.name(),
            code: opcode.code(),
            expected,
            found: payload_len,
        });
    }

    let payload_end = (headers_len + payload_len).min(buf.len());
    let payload = buf.get(headers_len..payload_end).unwrap_or(&[]);
    let icrc = buf
        .get(body_end..wire_len)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes);
    Ok(Transport {
        bth,
        ext,
        payload,
        payload_len,
        icrc,
    })
}
