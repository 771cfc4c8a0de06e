//! RoCEv2 packets in pure Rust: decode them, build them, check their ICRC, read and write
//! capture files, follow a queue pair's PSNs. No eBPF, no async runtime, no RDMA library.
//!
//! The decoder takes Ethernet (with an optional 802.1Q tag), IPv4/IPv6, UDP to port 4791, the
//! BTH and every extension header its opcode implies (RC, UC, RD, UD, XRC and CNP), the
//! payload, and recomputes the ICRC. Nothing in it panics on any input: every length is
//! checked and every failure is a [`DecodeError`] naming the layer and offset.
//!
//! Four entry points match the four places a capture can start:
//!
//! * [`decode_ethernet`] — a whole frame, as XDP/TC or a pcap with `LINKTYPE_ETHERNET` sees it;
//! * [`decode_ip`] — a datagram starting at the IP header, as the rxe kprobes see `skb` data;
//! * [`decode_sll_snapped`] — a Linux cooked capture record (`tcpdump -i any`: SLL or SLL2
//!   header, then IP);
//! * [`decode_udp_payload`] — BTH onwards, when only the UDP payload is known (the ICRC then
//!   cannot be checked: [`IcrcCheck::NoIpHeader`]).
//!
//! The `_snapped` variants take the packet's original length for captures cut by a snap length:
//! as long as the headers are complete they decode what there is and mark the packet
//! [`truncated`](Packet::truncated) instead of failing.
//!
//! [`PacketBuilder`] goes the other way: it builds a frame or datagram with correct lengths,
//! IPv4 checksum and ICRC, which decodes back to the same fields.
//!
//! Modules, in reading order (the decoding layers are private; their types are re-exported
//! here):
//!
//! 1. `opcode` — the IBA opcode table: [`Opcode`], [`Transport`], [`Operation`], which
//!    extension headers ([`ExtHeaderKind`]) and payload ([`PayloadRule`]) each opcode has;
//! 2. `eth`, [`sll`], `ip`, `udp`, `bth`, `ext` — one header type each, outermost first:
//!    [`Ethernet`] or the Linux cooked capture header [`sll::LinuxSll`], [`IpHeader`], [`Udp`],
//!    [`Bth`], [`ExtHeaders`];
//! 3. `packet` and `error` — the decoded [`Packet`] with its [`IcrcCheck`], and why a buffer
//!    is not one ([`DecodeError`]); `reader` is the bounds-checked cursor they parse with;
//! 4. [`icrc`] — the invariant CRC both directions compute;
//! 5. [`encode`] — [`PacketBuilder`], packets from fields;
//! 6. [`psn`] — 24-bit PSN arithmetic: next, distance, "ahead" (wrapping at 2^24);
//! 7. `timestamp` — [`Timestamp`], when a packet was captured;
//! 8. `render` — packets as text or JSON lines (`hex` formats their opaque values);
//! 9. `pcap` — capture files: a pcap writer, a pcap and pcapng reader (of a whole file, or
//!    streaming from a pipe);
//! 10. `follow` — a QP's PSN sequence per direction: gaps, duplicates, retransmissions;
//! 11. [`stats`] — counts over a capture.
//!
//! # Features
//!
//! The core (decoding, encoding, ICRC, PSN arithmetic, statistics) needs no feature and no
//! optional crate. All of these are on by default:
//!
//! * `pcap` — the `pcap` module (the `pcap-file` crate);
//! * `follow` — the `follow` module, the QP follower (the `lru` crate for its flow table);
//! * `render` — the `render` module (`serde_json` for JSON lines).
//!
//! ```
//! use roce::{AethSyndrome, IcrcCheck};
//!
//! # let frame = roce::doc_example_frame();
//! let pkt = roce::decode_ethernet(&frame)?;
//! assert_eq!(pkt.opcode().name(), "RC Acknowledge");
//! assert_eq!(pkt.ext.aeth.map(|a| a.syndrome), Some(AethSyndrome::Ack { credits: 31 }));
//! assert_eq!(pkt.icrc_check, IcrcCheck::Valid);
//! # #[cfg(feature = "render")]
//! println!("{}", roce::render::text(&pkt, None));
//! # Ok::<(), roce::DecodeError>(())
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
mod timestamp;
mod udp;

pub mod encode;
#[cfg(feature = "follow")]
pub mod follow;
pub mod icrc;
#[cfg(feature = "pcap")]
pub mod pcap;
pub mod psn;
#[cfg(feature = "render")]
pub mod render;
pub mod sll;
pub mod stats;

pub use bth::Bth;
pub use encode::{EncodeError, PacketBuilder};
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
pub use timestamp::Timestamp;
pub use udp::{Udp, ROCE_V2_PORT};

/// Decodes a whole Ethernet frame (without FCS; a trailing FCS or padding is ignored).
///
/// ```
/// # let frame = roce::doc_example_frame();
/// let pkt = roce::decode_ethernet(&frame)?;
/// assert_eq!(pkt.dst().map(|a| a.port()), Some(4791));
/// assert!(pkt.icrc_ok);
/// # Ok::<(), roce::DecodeError>(())
/// ```
pub fn decode_ethernet(frame: &[u8]) -> Result<Packet<'_>, DecodeError> {
    packet::ethernet(frame, frame.len())
}

/// Decodes an Ethernet frame that a capture's snap length may have cut: `orig_len` is the
/// frame's length on the wire. Headers through the last extension header must be present;
/// a cut payload gives a packet with `truncated == true` and [`IcrcCheck::Truncated`].
///
/// ```
/// # let frame = roce::doc_example_frame();
/// use roce::{decode_ethernet_snapped, IcrcCheck};
///
/// let pkt = decode_ethernet_snapped(&frame[..frame.len() - 2], frame.len())?;
/// assert!(pkt.truncated);
/// assert_eq!(pkt.icrc_check, IcrcCheck::Truncated);
/// # Ok::<(), roce::DecodeError>(())
/// ```
pub fn decode_ethernet_snapped(frame: &[u8], orig_len: usize) -> Result<Packet<'_>, DecodeError> {
    packet::ethernet(frame, orig_len)
}

/// Decodes a datagram that starts at its IPv4 or IPv6 header (the version nibble decides).
///
/// ```
/// # let frame = roce::doc_example_frame();
/// let pkt = roce::decode_ip(&frame[14..])?;
/// assert!(pkt.ethernet.is_none());
/// assert!(pkt.icrc_ok);
/// # Ok::<(), roce::DecodeError>(())
/// ```
pub fn decode_ip(packet: &[u8]) -> Result<Packet<'_>, DecodeError> {
    packet::raw_ip(packet, packet.len())
}

/// [`decode_ip`] for a datagram a snap length may have cut; `orig_len` is its length on the
/// wire. See [`decode_ethernet_snapped`].
pub fn decode_ip_snapped(packet: &[u8], orig_len: usize) -> Result<Packet<'_>, DecodeError> {
    packet::raw_ip(packet, orig_len)
}

/// Decodes a Linux cooked capture record, as `tcpdump -i any` writes them
/// (`LINKTYPE_LINUX_SLL` or `LINKTYPE_LINUX_SLL2`): the cooked header, whose protocol field
/// must announce IPv4 or IPv6, then the IP datagram. `orig_len` is the record's length on the
/// wire (see [`decode_ethernet_snapped`]); the header is kept in [`Packet::cooked`].
///
/// ```
/// use roce::sll::{LinuxSll, PacketType, SllVersion};
/// # let frame = roce::doc_example_frame();
///
/// let mut record =
///     LinuxSll::ethernet(SllVersion::V2, PacketType::Outgoing, 3, [2, 0, 0, 0, 0, 1], 0x0800)
///         .to_bytes();
/// record.extend_from_slice(&frame[14..]);
/// let pkt = roce::decode_sll_snapped(&record, record.len(), SllVersion::V2)?;
/// assert_eq!(pkt.cooked.and_then(|c| c.ifindex), Some(3));
/// assert!(pkt.icrc_ok);
/// # Ok::<(), roce::DecodeError>(())
/// ```
pub fn decode_sll_snapped(
    record: &[u8],
    orig_len: usize,
    version: sll::SllVersion,
) -> Result<Packet<'_>, DecodeError> {
    packet::cooked(record, orig_len, version)
}

/// Decodes a UDP payload: BTH, extension headers, payload, pad and ICRC. The ICRC is reported
/// but cannot be verified ([`IcrcCheck::NoIpHeader`]) because it covers the IP and UDP headers.
///
/// ```
/// # let frame = roce::doc_example_frame();
/// use roce::{decode_udp_payload, IcrcCheck};
///
/// let pkt = decode_udp_payload(&frame[14 + 20 + 8..])?;
/// assert_eq!(pkt.icrc_check, IcrcCheck::NoIpHeader);
/// assert!(!pkt.icrc_ok);
/// # Ok::<(), roce::DecodeError>(())
/// ```
pub fn decode_udp_payload(payload: &[u8]) -> Result<Packet<'_>, DecodeError> {
    packet::udp_payload(payload)
}

/// An RC Acknowledge frame (10.77.0.1:49153 -> 10.77.0.2:4791, ACK credits 31, MSN 5) used by
/// the documentation examples.
#[doc(hidden)]
pub fn doc_example_frame() -> Vec<u8> {
    PacketBuilder::new(Opcode::RC_ACKNOWLEDGE)
        .src_mac(MacAddr([0x02, 0, 0, 0, 0, 0x01]))
        .dst_mac(MacAddr([0x02, 0, 0, 0, 0, 0x02]))
        .ipv4([10, 77, 0, 1].into(), [10, 77, 0, 2].into())
        .ecn(Ecn::Ect0)
        .ip_id(1)
        .src_port(49153)
        .dest_qp(0x11)
        .psn(0x83_f247)
        .aeth(Aeth {
            syndrome: AethSyndrome::Ack { credits: 31 },
            msn: 5,
        })
        .frame()
        // Every field above fits; tests/encode.rs checks these are the expected bytes.
        .unwrap_or_default()
}

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
