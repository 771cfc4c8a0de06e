//! Linux "cooked" capture headers: what `tcpdump -i any` writes instead of an Ethernet header.
//!
//! Capturing on the `any` pseudo-device, libpcap cannot give every interface's own link-layer
//! header, so it replaces it with a header of its own: `LINKTYPE_LINUX_SLL` (113, 16 bytes,
//! older libpcap) or `LINKTYPE_LINUX_SLL2` (276, 20 bytes, libpcap 1.10 and later, which adds
//! the interface index). Both carry the direction (packet type), the ARPHRD type of the
//! interface, the sender's link-layer address and the protocol (an ethertype), after which the
//! IP header follows.
//!
//! Layouts (all fields big-endian), from <https://www.tcpdump.org/linktypes/LINKTYPE_LINUX_SLL.html>
//! and `LINKTYPE_LINUX_SLL2.html`:
//!
//! ```text
//! SLL:  packet type (2) | ARPHRD type (2) | address length (2) | address (8) | protocol (2)
//! SLL2: protocol (2) | reserved (2) | interface index (4) | ARPHRD type (2) | packet type (1)
//!       | address length (1) | address (8)
//! ```

use std::fmt;

use serde::Serialize;

use crate::error::DecodeError;
use crate::eth::MacAddr;
use crate::reader::{be16, be32, sub, Reader};

/// Length of a `LINKTYPE_LINUX_SLL` header.
pub const SLL_HEADER_LEN: usize = 16;
/// Length of a `LINKTYPE_LINUX_SLL2` header.
pub const SLL2_HEADER_LEN: usize = 20;
/// `ARPHRD_ETHER`: the interface is Ethernet and the address a 6-byte MAC.
pub const ARPHRD_ETHER: u16 = 1;

/// Which of the two cooked header formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum SllVersion {
    /// `LINKTYPE_LINUX_SLL` (113), 16 bytes.
    #[serde(rename = "SLL")]
    V1,
    /// `LINKTYPE_LINUX_SLL2` (276), 20 bytes, with the interface index.
    #[serde(rename = "SLL2")]
    V2,
}

impl SllVersion {
    /// The header's length on the wire.
    pub fn header_len(self) -> usize {
        match self {
            SllVersion::V1 => SLL_HEADER_LEN,
            SllVersion::V2 => SLL2_HEADER_LEN,
        }
    }

    /// `SLL` or `SLL2`.
    pub fn as_str(self) -> &'static str {
        match self {
            SllVersion::V1 => "SLL",
            SllVersion::V2 => "SLL2",
        }
    }
}

/// Where the packet went relative to the capturing host (`PACKET_*` in `linux/if_packet.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PacketType {
    /// `PACKET_HOST` (0): addressed to this host.
    Host,
    /// `PACKET_BROADCAST` (1).
    Broadcast,
    /// `PACKET_MULTICAST` (2).
    Multicast,
    /// `PACKET_OTHERHOST` (3): to another host, seen in promiscuous mode.
    OtherHost,
    /// `PACKET_OUTGOING` (4): sent by this host.
    Outgoing,
    /// Any other value.
    Other(u16),
}

impl PacketType {
    fn from_code(code: u16) -> PacketType {
        match code {
            0 => PacketType::Host,
            1 => PacketType::Broadcast,
            2 => PacketType::Multicast,
            3 => PacketType::OtherHost,
            4 => PacketType::Outgoing,
            c => PacketType::Other(c),
        }
    }

    /// The numeric value.
    pub fn code(self) -> u16 {
        match self {
            PacketType::Host => 0,
            PacketType::Broadcast => 1,
            PacketType::Multicast => 2,
            PacketType::OtherHost => 3,
            PacketType::Outgoing => 4,
            PacketType::Other(c) => c,
        }
    }
}

impl fmt::Display for PacketType {
    /// As tcpdump prints the direction: `In`, `B`, `M`, `P`, `Out`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PacketType::Host => f.write_str("In"),
            PacketType::Broadcast => f.write_str("B"),
            PacketType::Multicast => f.write_str("M"),
            PacketType::OtherHost => f.write_str("P"),
            PacketType::Outgoing => f.write_str("Out"),
            PacketType::Other(c) => write!(f, "type{c}"),
        }
    }
}

/// A decoded Linux cooked capture header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct LinuxSll {
    /// SLL or SLL2.
    pub version: SllVersion,
    /// Direction of the packet.
    pub packet_type: PacketType,
    /// The interface's `ARPHRD_*` type ([`ARPHRD_ETHER`] for Ethernet).
    pub arphrd: u16,
    /// Interface index (SLL2 only).
    pub ifindex: Option<u32>,
    /// Length of the link-layer address as the header states it (may exceed the 8 bytes kept).
    pub addr_len: u16,
    /// The sender's link-layer address, zero-padded to 8 bytes.
    #[serde(serialize_with = "crate::hex::bytes")]
    pub addr: [u8; 8],
    /// The protocol of what follows: an ethertype.
    #[serde(serialize_with = "crate::hex::u16")]
    pub protocol: u16,
}

impl LinuxSll {
    /// Reads a cooked header off the front of `buf`.
    ///
    /// ```
    /// use roce::sll::{LinuxSll, PacketType, SllVersion};
    ///
    /// let sll = LinuxSll::ethernet(SllVersion::V2, PacketType::Outgoing, 3, [2, 0, 0, 0, 0, 1], 0x0800);
    /// let bytes = sll.to_bytes();
    /// assert_eq!(bytes.len(), 20);
    /// assert_eq!(LinuxSll::parse(&bytes, SllVersion::V2)?, sll);
    /// # Ok::<(), roce::DecodeError>(())
    /// ```
    pub fn parse(buf: &[u8], version: SllVersion) -> Result<LinuxSll, DecodeError> {
        Self::read(&mut Reader::new(buf, 0), version)
    }

    pub(crate) fn read(r: &mut Reader<'_>, version: SllVersion) -> Result<LinuxSll, DecodeError> {
        Ok(match version {
            SllVersion::V1 => {
                let h: &[u8; SLL_HEADER_LEN] = r.array("Linux cooked (SLL) header")?;
                LinuxSll {
                    version,
                    packet_type: PacketType::from_code(be16(sub(h, 0))),
                    arphrd: be16(sub(h, 2)),
                    ifindex: None,
                    addr_len: be16(sub(h, 4)),
                    addr: sub(h, 6),
                    protocol: be16(sub(h, 14)),
                }
            }
            SllVersion::V2 => {
                let h: &[u8; SLL2_HEADER_LEN] = r.array("Linux cooked (SLL2) header")?;
                LinuxSll {
                    version,
                    protocol: be16(sub(h, 0)),
                    ifindex: Some(be32(sub(h, 4))),
                    arphrd: be16(sub(h, 8)),
                    packet_type: PacketType::from_code(u16::from(h[10])),
                    addr_len: u16::from(h[11]),
                    addr: sub(h, 12),
                }
            }
        })
    }

    /// The header of an Ethernet interface's packet: `mac` is the sender's address.
    pub fn ethernet(
        version: SllVersion,
        packet_type: PacketType,
        ifindex: u32,
        mac: [u8; 6],
        protocol: u16,
    ) -> LinuxSll {
        let mut addr = [0u8; 8];
        addr[..6].copy_from_slice(&mac);
        LinuxSll {
            version,
            packet_type,
            arphrd: ARPHRD_ETHER,
            ifindex: (version == SllVersion::V2).then_some(ifindex),
            addr_len: 6,
            addr,
            protocol,
        }
    }

    /// The header's bytes, as libpcap writes them.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(self.version.header_len());
        match self.version {
            SllVersion::V1 => {
                b.extend(self.packet_type.code().to_be_bytes());
                b.extend(self.arphrd.to_be_bytes());
                b.extend(self.addr_len.to_be_bytes());
                b.extend(self.addr);
                b.extend(self.protocol.to_be_bytes());
            }
            SllVersion::V2 => {
                b.extend(self.protocol.to_be_bytes());
                b.extend([0, 0]);
                b.extend(self.ifindex.unwrap_or(0).to_be_bytes());
                b.extend(self.arphrd.to_be_bytes());
                // One byte each in SLL2; the values libpcap writes fit.
                b.push(u8::try_from(self.packet_type.code()).unwrap_or(u8::MAX));
                b.push(u8::try_from(self.addr_len).unwrap_or(u8::MAX));
                b.extend(self.addr);
            }
        }
        b
    }

    /// The sender's MAC, when the interface is Ethernet and the address a MAC.
    pub fn mac(&self) -> Option<MacAddr> {
        (self.arphrd == ARPHRD_ETHER && self.addr_len == 6).then(|| MacAddr(sub(&self.addr, 0)))
    }

    /// The address as colon-separated hex, `addr_len` bytes of it (at most 8).
    fn addr_text(&self) -> String {
        let len = usize::from(self.addr_len).min(self.addr.len());
        let parts: Vec<String> = self.addr[..len]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if parts.is_empty() {
            "-".to_owned()
        } else {
            parts.join(":")
        }
    }
}

impl fmt::Display for LinuxSll {
    /// `SLL2 Out if=3 hatype=1 addr=02:00:00:00:00:01 proto=0x0800`; `SLL` is padded to the
    /// same width, so the fields line up with the other headers of `rdma-capture -v`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:<4} {}", self.version.as_str(), self.packet_type)?;
        if let Some(i) = self.ifindex {
            write!(f, " if={i}")?;
        }
        write!(
            f,
            " hatype={} addr={} proto=0x{:04x}",
            self.arphrd,
            self.addr_text(),
            self.protocol
        )
    }
}

/// Turns a cooked-capture record into an Ethernet frame, so it can be written to an Ethernet
/// pcap file: the sender's MAC (when the interface is Ethernet) becomes the source, the
/// destination is zero, and the protocol becomes the ethertype. `None` if `record` is shorter
/// than the header.
///
/// ```
/// use roce::sll::{ethernet_for_cooked, LinuxSll, PacketType, SllVersion};
///
/// let mut record = LinuxSll::ethernet(SllVersion::V1, PacketType::Host, 0, [2, 0, 0, 0, 0, 9], 0x86dd).to_bytes();
/// record.extend([0x60, 0, 0, 0]);
/// let frame = ethernet_for_cooked(&record, SllVersion::V1).unwrap();
/// assert_eq!(frame, [0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 9, 0x86, 0xdd, 0x60, 0, 0, 0]);
/// ```
pub fn ethernet_for_cooked(record: &[u8], version: SllVersion) -> Option<Vec<u8>> {
    let header = LinuxSll::parse(record, version).ok()?;
    let rest = record.get(version.header_len()..)?;
    let mut frame = Vec::with_capacity(14 + rest.len());
    frame.extend([0u8; 6]);
    frame.extend(header.mac().unwrap_or_default().0);
    frame.extend(header.protocol.to_be_bytes());
    frame.extend_from_slice(rest);
    Some(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_layouts_byte_for_byte() {
        // As tcpdump -i any wrote them for an outgoing IPv4 packet on ifindex 3.
        let v1 = [0, 4, 0, 1, 0, 6, 2, 0, 0, 0, 0, 1, 0, 0, 0x08, 0x00];
        let h = LinuxSll::parse(&v1, SllVersion::V1).unwrap();
        assert_eq!(
            h,
            LinuxSll::ethernet(
                SllVersion::V1,
                PacketType::Outgoing,
                0,
                [2, 0, 0, 0, 0, 1],
                0x0800
            )
        );
        assert_eq!(h.to_bytes(), v1);
        assert_eq!(
            h.to_string(),
            "SLL  Out hatype=1 addr=02:00:00:00:00:01 proto=0x0800"
        );

        let v2 = [
            0x86, 0xdd, 0, 0, 0, 0, 0, 3, 0, 1, 0, 6, 2, 0, 0, 0, 0, 2, 0, 0,
        ];
        let h = LinuxSll::parse(&v2, SllVersion::V2).unwrap();
        assert_eq!(
            (h.packet_type, h.ifindex, h.protocol, h.mac()),
            (
                PacketType::Host,
                Some(3),
                0x86dd,
                Some(MacAddr([2, 0, 0, 0, 0, 2]))
            )
        );
        assert_eq!(h.to_bytes(), v2);
        assert_eq!(
            h.to_string(),
            "SLL2 In if=3 hatype=1 addr=02:00:00:00:00:02 proto=0x86dd"
        );
    }

    #[test]
    fn short_and_odd_headers() {
        assert!(matches!(
            LinuxSll::parse(&[0; 15], SllVersion::V1),
            Err(DecodeError::Truncated {
                needed: 16,
                available: 15,
                ..
            })
        ));
        assert!(LinuxSll::parse(&[0; 19], SllVersion::V2).is_err());
        assert_eq!(ethernet_for_cooked(&[0; 10], SllVersion::V2), None);
        // A loopback interface (ARPHRD_LOOPBACK 772) has no MAC; the address length is 0.
        let mut lo = [0u8; 16];
        lo[2..4].copy_from_slice(&772u16.to_be_bytes());
        lo[14..16].copy_from_slice(&0x0800u16.to_be_bytes());
        let h = LinuxSll::parse(&lo, SllVersion::V1).unwrap();
        assert_eq!(h.mac(), None);
        assert!(h.to_string().contains("addr=-"), "{h}");
        // An address length beyond the 8 bytes the header holds is shown cut, not a panic.
        lo[4..6].copy_from_slice(&300u16.to_be_bytes());
        let h = LinuxSll::parse(&lo, SllVersion::V1).unwrap();
        assert_eq!(h.addr_len, 300);
        assert!(
            h.to_string().contains("addr=00:00:00:00:00:00:00:00"),
            "{h}"
        );
    }
}
