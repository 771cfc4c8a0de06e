//! What a capture file says about itself: the magic numbers and header sizes, the link type
//! and timestamp resolution, the file's [`FileHeader`] and each [`Record`].

use pcap_file::{DataLink, TsResolution};

use super::Timestamp;

/// Magic number of a classic pcap file with microsecond timestamps.
pub const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
/// Magic number of a classic pcap file with nanosecond timestamps.
pub const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// The block type a pcapng file starts with (its section header block); the same in either
/// byte order.
pub const PCAPNG_MAGIC: u32 = 0x0a0d_0d0a;
/// Size of the classic pcap global header.
pub const GLOBAL_HEADER_LEN: usize = 24;
/// Size of a classic pcap record header.
pub const RECORD_HEADER_LEN: usize = 16;
/// The default snap length, as tcpdump uses.
pub const DEFAULT_SNAPLEN: u32 = 262_144;

/// The link-layer type of a capture file or interface (the "network" field of a classic pcap
/// global header, the "LinkType" of a pcapng interface description).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkType {
    /// `LINKTYPE_ETHERNET` (1): records start with an Ethernet header.
    Ethernet,
    /// `LINKTYPE_RAW` (101): records start with an IPv4 or IPv6 header.
    Raw,
    /// Any other value, as read from a file.
    Other(u32),
}

impl LinkType {
    /// `LINKTYPE_LINUX_SLL` (113): records start with a 16-byte Linux cooked capture header
    /// (older `tcpdump -i any`); see [`crate::sll`]. A constant rather than a variant, so
    /// code matching on the variants keeps compiling; it can be used as a pattern.
    pub const LINUX_SLL: LinkType = LinkType::Other(113);
    /// `LINKTYPE_LINUX_SLL2` (276): records start with a 20-byte Linux cooked capture header
    /// (`tcpdump -i any` with libpcap 1.10 and later); see [`crate::sll`].
    pub const LINUX_SLL2: LinkType = LinkType::Other(276);
    /// `LINKTYPE_IPV4` (228): records start with an IPv4 header.
    pub const IPV4: LinkType = LinkType::Other(228);
    /// `LINKTYPE_IPV6` (229): records start with an IPv6 header.
    pub const IPV6: LinkType = LinkType::Other(229);

    /// The link type's name as libpcap spells it (`ETHERNET`, `LINUX_SLL2`, `IEEE802_11`…), or
    /// its number when it has none.
    ///
    /// ```
    /// use roce::pcap::LinkType;
    /// assert_eq!(LinkType::from_code(105).name(), "IEEE802_11");
    /// assert_eq!(LinkType::LINUX_SLL2.name(), "LINUX_SLL2");
    /// assert_eq!(LinkType::from_code(60000).name(), "60000");
    /// ```
    pub fn name(self) -> String {
        match DataLink::from(self) {
            DataLink::Unknown(code) => code.to_string(),
            // pcap-file's variants are named after libpcap's DLT_ constants.
            known => format!("{known:?}"),
        }
    }

    /// The numeric link type.
    pub fn code(self) -> u32 {
        match self {
            LinkType::Ethernet => 1,
            LinkType::Raw => 101,
            LinkType::Other(c) => c,
        }
    }

    /// The link type for a numeric code.
    pub fn from_code(code: u32) -> LinkType {
        match code {
            1 => LinkType::Ethernet,
            101 => LinkType::Raw,
            c => LinkType::Other(c),
        }
    }
}

impl From<DataLink> for LinkType {
    fn from(link: DataLink) -> LinkType {
        LinkType::from_code(u32::from(link))
    }
}

impl From<LinkType> for DataLink {
    fn from(link: LinkType) -> DataLink {
        DataLink::from(link.code())
    }
}

/// Timestamp precision of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// Microseconds (magic `0xa1b2c3d4`), the most widely read.
    Micros,
    /// Nanoseconds (magic `0xa1b23c4d`).
    Nanos,
}

impl From<Resolution> for TsResolution {
    fn from(r: Resolution) -> TsResolution {
        match r {
            Resolution::Micros => TsResolution::MicroSecond,
            Resolution::Nanos => TsResolution::NanoSecond,
        }
    }
}

impl From<TsResolution> for Resolution {
    fn from(r: TsResolution) -> Resolution {
        match r {
            TsResolution::MicroSecond => Resolution::Micros,
            TsResolution::NanoSecond => Resolution::Nanos,
        }
    }
}

/// Which of the two capture file formats a file is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// Classic libpcap: one global header, one link type.
    Pcap,
    /// pcapng: sections and interfaces, each interface with its own link type.
    PcapNg,
}

/// What a capture file says about itself before its first packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// Classic pcap or pcapng.
    pub format: Format,
    /// Link type of every record (classic pcap), or of the first interface (pcapng, whose
    /// later interfaces may differ: each [`Record`] carries its own).
    pub link: LinkType,
    /// Snap length (pcapng: the first interface's; 0 means none).
    pub snaplen: u32,
    /// Timestamp precision (pcapng: the first interface's, rounded to the nearer of the two).
    pub resolution: Resolution,
    /// True if the file (pcapng: its first section) was written big-endian.
    pub big_endian: bool,
    /// Format version (major, minor): 2.4 for classic pcap, 1.0 for pcapng.
    pub version: (u16, u16),
}

/// One packet of a capture file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// When the packet was captured (zero for pcapng simple packet blocks, which have none).
    pub ts: Timestamp,
    /// The packet's length on the wire.
    pub orig_len: u32,
    /// The captured bytes.
    pub data: &'a [u8],
    /// What the captured bytes start with.
    pub link: LinkType,
}
