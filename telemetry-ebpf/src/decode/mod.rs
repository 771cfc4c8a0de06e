//! Pure-Rust RoCEv2 packet decoder, independent of eBPF.
//!
//! Decodes Ethernet (with an optional 802.1Q tag), IPv4/IPv6, UDP to port 4791, the BTH and
//! every extension header its opcode implies (RC, UC, RD, UD, XRC and CNP), the payload, and
//! recomputes the ICRC. Nothing here panics on any input: every length is checked and every
//! failure is a [`DecodeError`] naming the layer and offset.
//!
//! Three entry points match the three places a capture can start:
//!
//! * [`decode_ethernet`] — a whole frame, as XDP/TC or a pcap with `LINKTYPE_ETHERNET` sees it;
//! * [`decode_ip`] — a datagram starting at the IP header, as the rxe kprobes see `skb` data;
//! * [`decode_udp_payload`] — BTH onwards, when only the UDP payload is known (the ICRC then
//!   cannot be checked: [`IcrcCheck::NoIpHeader`]).
//!
//! The `_snapped` variants take the packet's original length for captures cut by a snap length:
//! as long as the headers are complete they decode what there is and mark the packet
//! [`truncated`](Packet::truncated) instead of failing.
//!
//! Around the decoder: [`render`] prints packets as text or JSON lines, [`pcap`] writes and
//! reads capture files, [`follow`] tracks a QP's PSN sequence, [`stats`] counts what was seen.
//!
//! ```
//! use telemetry_ebpf::decode::{self, AethSyndrome, IcrcCheck};
//!
//! # let frame = telemetry_ebpf::decode::doc_example_frame();
//! let pkt = decode::decode_ethernet(&frame)?;
//! assert_eq!(pkt.opcode().name(), "RC Acknowledge");
//! assert_eq!(pkt.ext.aeth.map(|a| a.syndrome), Some(AethSyndrome::Ack { credits: 31 }));
//! assert_eq!(pkt.icrc_check, IcrcCheck::Valid);
//! println!("{}", decode::render::text(&pkt, None));
//! # Ok::<(), decode::DecodeError>(())
//! ```

#![warn(missing_docs)]

mod bth;
mod error;
mod eth;
mod ext;
mod hex;
mod ip;
mod opcode;
mod packet;
mod reader;
mod udp;

pub mod follow;
pub mod icrc;
pub mod pcap;
pub mod render;
pub mod stats;

pub use bth::Bth;
pub use error::{DecodeError, NotRoce, PayloadExpectation};
pub use eth::{
    Ethernet, MacAddr, VlanTag, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_ROCE_V1, ETHERTYPE_VLAN,
};
pub use ext::{
    credit_count, rnr_timer_micros, Aeth, AethSyndrome, AtomicAckEth, AtomicEth, Deth, ExtHeaders,
    Feth, Ieth, ImmDt, NakCode, Rdeth, Reth, XrcEth,
};
pub use ip::{internet_checksum, Ecn, IpHeader, Ipv4, Ipv6, IPPROTO_UDP};
pub use opcode::{ExtHeaderKind, Opcode, Operation, PayloadRule, Transport};
pub use packet::{IcrcCheck, Packet};
pub use udp::{Udp, ROCE_V2_PORT};

/// Decodes a whole Ethernet frame (without FCS; a trailing FCS or padding is ignored).
///
/// ```
/// # let frame = telemetry_ebpf::decode::doc_example_frame();
/// let pkt = telemetry_ebpf::decode::decode_ethernet(&frame)?;
/// assert_eq!(pkt.dst().map(|a| a.port()), Some(4791));
/// assert!(pkt.icrc_ok);
/// # Ok::<(), telemetry_ebpf::decode::DecodeError>(())
/// ```
pub fn decode_ethernet(frame: &[u8]) -> Result<Packet<'_>, DecodeError> {
    packet::ethernet(frame, frame.len())
}

/// Decodes an Ethernet frame that a capture's snap length may have cut: `orig_len` is the
/// frame's length on the wire. Headers through the last extension header must be present;
/// a cut payload gives a packet with `truncated == true` and [`IcrcCheck::Truncated`].
///
/// ```
/// # let frame = telemetry_ebpf::decode::doc_example_frame();
/// use telemetry_ebpf::decode::{decode_ethernet_snapped, IcrcCheck};
///
/// let pkt = decode_ethernet_snapped(&frame[..frame.len() - 2], frame.len())?;
/// assert!(pkt.truncated);
/// assert_eq!(pkt.icrc_check, IcrcCheck::Truncated);
/// # Ok::<(), telemetry_ebpf::decode::DecodeError>(())
/// ```
pub fn decode_ethernet_snapped(frame: &[u8], orig_len: usize) -> Result<Packet<'_>, DecodeError> {
    packet::ethernet(frame, orig_len)
}

/// Decodes a datagram that starts at its IPv4 or IPv6 header (the version nibble decides).
///
/// ```
/// # let frame = telemetry_ebpf::decode::doc_example_frame();
/// let pkt = telemetry_ebpf::decode::decode_ip(&frame[14..])?;
/// assert!(pkt.ethernet.is_none());
/// assert!(pkt.icrc_ok);
/// # Ok::<(), telemetry_ebpf::decode::DecodeError>(())
/// ```
pub fn decode_ip(packet: &[u8]) -> Result<Packet<'_>, DecodeError> {
    packet::raw_ip(packet, packet.len())
}

/// [`decode_ip`] for a datagram a snap length may have cut; `orig_len` is its length on the
/// wire. See [`decode_ethernet_snapped`].
pub fn decode_ip_snapped(packet: &[u8], orig_len: usize) -> Result<Packet<'_>, DecodeError> {
    packet::raw_ip(packet, orig_len)
}

/// Decodes a UDP payload: BTH, extension headers, payload, pad and ICRC. The ICRC is reported
/// but cannot be verified ([`IcrcCheck::NoIpHeader`]) because it covers the IP and UDP headers.
///
/// ```
/// # let frame = telemetry_ebpf::decode::doc_example_frame();
/// use telemetry_ebpf::decode::{decode_udp_payload, IcrcCheck};
///
/// let pkt = decode_udp_payload(&frame[14 + 20 + 8..])?;
/// assert_eq!(pkt.icrc_check, IcrcCheck::NoIpHeader);
/// assert!(!pkt.icrc_ok);
/// # Ok::<(), telemetry_ebpf::decode::DecodeError>(())
/// ```
pub fn decode_udp_payload(payload: &[u8]) -> Result<Packet<'_>, DecodeError> {
    packet::udp_payload(payload)
}

/// An RC Acknowledge frame (10.77.0.1:49153 -> 10.77.0.2:4791, ACK credits 31, MSN 5) used by
/// the documentation examples.
#[doc(hidden)]
pub fn doc_example_frame() -> Vec<u8> {
    let mut f = vec![
        0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00, // Ethernet
        0x45, 0x02, 0x00, 0x30, 0x00, 0x01, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 77, 0, 1, 10,
        77, 0, 2, // IPv4, ECT(0); checksum filled below
        0xc0, 0x01, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, // UDP
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x83, 0xf2, 0x47, // BTH
        0x1f, 0x00, 0x00, 0x05, // AETH
    ];
    let csum = internet_checksum(f.get(14..34).unwrap_or(&[]));
    if let Some(c) = f.get_mut(24..26) {
        c.copy_from_slice(&csum.to_be_bytes());
    }
    let crc = icrc::compute(f.get(14..34).unwrap_or(&[]), f.get(34..).unwrap_or(&[])).unwrap_or(0);
    f.extend(icrc::to_wire(crc));
    f
}
