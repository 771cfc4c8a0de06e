//! Capture files: a classic pcap writer for `-w FILE.pcap`, and a reader for classic pcap and
//! pcapng files (tests and `-r`).
//!
//! The framing is the [`pcap_file`] crate's; this module adds what the decoder needs on top:
//! records that borrow the file's bytes, timestamps to the nanosecond in either format, the
//! link type of every record, and errors that say where a file is broken.
//!
//! A classic pcap file is a 24-byte global header followed by records of a 16-byte header and
//! the captured bytes. [`PcapWriter`] writes little-endian; the magic number tells readers the
//! byte order and whether timestamps are in micro- or nanoseconds. Wireshark, tcpdump and
//! tshark read both, and so does [`read`], in either byte order.
//!
//! A pcapng file is a sequence of blocks: a section header, interface descriptions (each with
//! its own link type and timestamp resolution) and packet blocks naming their interface.
//! [`read`] follows sections and interfaces, so each [`Record`] carries its own [`LinkType`].
//!
//! Frames from XDP/TC go into `LINKTYPE_ETHERNET` files. Datagrams from the rxe kprobes start
//! at the IP header; write those to a separate [`LinkType::Raw`] (`LINKTYPE_RAW`, 101) file,
//! which Wireshark dissects as IPv4/IPv6 by the version nibble and then as RoCEv2 by UDP port
//! 4791. Where a single Ethernet file is wanted, [`ethernet_for_ip`] prepends a synthetic
//! Ethernet header (zero MACs, ethertype from the IP version) instead.

use std::borrow::Cow;
use std::fmt;
use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use byteorder_slice::{BigEndian, ByteOrder, LittleEndian};
use pcap_file::pcap::{PcapHeader, PcapPacket, RawPcapPacket};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::{
    ENHANCED_PACKET_BLOCK, INTERFACE_DESCRIPTION_BLOCK, PACKET_BLOCK, SECTION_HEADER_BLOCK,
    SIMPLE_PACKET_BLOCK,
};
use pcap_file::pcapng::{Block, RawBlock};
use pcap_file::{DataLink, Endianness, TsResolution};
use serde::{Serialize, Serializer};

use crate::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};

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

/// A capture timestamp: seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timestamp {
    /// Whole seconds.
    pub secs: u64,
    /// Nanoseconds within the second (`< 1_000_000_000`).
    pub nanos: u32,
}

impl Timestamp {
    /// A timestamp from seconds and nanoseconds; excess nanoseconds carry into seconds.
    pub fn new(secs: u64, nanos: u32) -> Timestamp {
        Timestamp {
            secs: secs.saturating_add(u64::from(nanos / 1_000_000_000)),
            nanos: nanos % 1_000_000_000,
        }
    }

    /// The current wall-clock time.
    pub fn now() -> Timestamp {
        Timestamp::from(SystemTime::now())
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Timestamp {
        let d = t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
        Timestamp {
            secs: d.as_secs(),
            nanos: d.subsec_nanos(),
        }
    }
}

impl fmt::Display for Timestamp {
    /// `seconds.nanoseconds`, as `tcpdump -tt --nano` prints it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}", self.secs, self.nanos)
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

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

/// Writes a classic pcap file, little-endian, version 2.4.
///
/// ```
/// use roce::pcap::{LinkType, PcapWriter, Resolution, Timestamp};
///
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 96, Resolution::Nanos)?;
/// w.write_packet(Timestamp::new(1_700_000_000, 5), &[0u8; 60], 60)?;
/// let file = w.into_inner()?;
/// assert_eq!(file.len(), 24 + 16 + 60);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    inner: pcap_file::pcap::PcapWriter<W>,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header. Records longer than `snaplen` are cut to it.
    pub fn new(out: W, link: LinkType, snaplen: u32, resolution: Resolution) -> io::Result<Self> {
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            // Timestamps are UTC and as accurate as the clock: both fields stay 0.
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen,
            datalink: link.into(),
            ts_resolution: resolution.into(),
            // Fixed rather than native, so a file is the same bytes on every host.
            endianness: Endianness::Little,
        };
        let inner = pcap_file::pcap::PcapWriter::with_header(out, header).map_err(io_error)?;
        Ok(PcapWriter { inner })
    }

    /// Appends a record. `data` is what was captured; `orig_len` is the packet's length on the
    /// wire (raised to `data.len()` if smaller). Data beyond the snap length is not written.
    pub fn write_packet(&mut self, ts: Timestamp, data: &[u8], orig_len: usize) -> io::Result<()> {
        let too_long = |what| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} does not fit the 32 bits a pcap record has for it"),
            )
        };
        // Checked before building the Duration, which could otherwise overflow on carry.
        let secs = u32::try_from(ts.secs).map_err(|_| too_long("timestamp"))?;
        let orig32 =
            u32::try_from(orig_len.max(data.len())).map_err(|_| too_long("original length"))?;
        let snap = usize::try_from(self.inner.snaplen()).unwrap_or(usize::MAX);
        let captured = data.get(..snap).unwrap_or(data);
        let packet = PcapPacket::new(Duration::new(u64::from(secs), ts.nanos), orig32, captured);
        self.inner.write_packet(&packet).map_err(io_error)?;
        Ok(())
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(self) -> io::Result<W> {
        let mut out = self.inner.into_writer();
        out.flush()?;
        Ok(out)
    }
}

/// pcap-file reports its writer's I/O failures inside its own error; hand them back as they
/// were, and anything else (a field the format cannot hold) as invalid input.
fn io_error(e: pcap_file::PcapError) -> io::Error {
    match e {
        pcap_file::PcapError::IoError(e) => e,
        other => io::Error::new(io::ErrorKind::InvalidInput, other),
    }
}

/// Prepends a synthetic Ethernet header to a datagram that starts at its IP header, so rxe
/// kprobe captures can share a `LINKTYPE_ETHERNET` file. Both MACs are zero; the ethertype
/// follows the IP version nibble. Returns `None` if the datagram is neither IPv4 nor IPv6.
///
/// ```
/// let frame = roce::pcap::ethernet_for_ip(&[0x45, 0, 0, 20]).unwrap();
/// assert_eq!(&frame[12..], &[0x08, 0x00, 0x45, 0, 0, 20]);
/// ```
pub fn ethernet_for_ip(ip_packet: &[u8]) -> Option<Vec<u8>> {
    let ethertype = match ip_packet.first()? >> 4 {
        4 => ETHERTYPE_IPV4,
        6 => ETHERTYPE_IPV6,
        _ => return None,
    };
    let mut frame = Vec::with_capacity(14 + ip_packet.len());
    frame.extend_from_slice(&[0u8; 12]);
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(ip_packet);
    Some(frame)
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

/// Why a capture file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PcapError {
    /// The file is shorter than a classic pcap global header.
    #[error("file too short for a pcap header ({0} bytes, 24 needed): empty or cut off")]
    ShortHeader(usize),
    /// The file starts with neither a classic pcap magic number nor a pcapng section header.
    #[error(
        "not a pcap or pcapng file: magic 0x{0:08x} (pcap starts with a1b2c3d4 or a1b23c4d in \
         either byte order, pcapng with 0a0d0d0a)"
    )]
    BadMagic(u32),
    /// A classic pcap record header or its data runs past the end of the file.
    #[error(
        "pcap record at offset {offset} truncated: need {needed} bytes, {available} left \
         (was the capture stopped while writing?)"
    )]
    TruncatedRecord {
        /// Offset of the record header.
        offset: usize,
        /// Bytes the record needs.
        needed: usize,
        /// Bytes left in the file.
        available: usize,
    },
    /// A pcapng block runs past the end of the file.
    #[error(
        "pcapng block at offset {offset} truncated: {available} bytes left \
         (was the capture stopped while writing?)"
    )]
    TruncatedBlock {
        /// Offset of the block.
        offset: usize,
        /// Bytes left in the file.
        available: usize,
    },
    /// A pcapng block is malformed.
    #[error("malformed pcapng block at offset {offset}: {reason}")]
    BadBlock {
        /// Offset of the block.
        offset: usize,
        /// What is wrong with it, as the pcap-file parser put it.
        reason: &'static str,
    },
    /// A pcapng packet block names an interface its section has not described.
    #[error(
        "pcapng packet block at offset {offset} names interface {interface}, which its section \
         does not describe"
    )]
    UnknownInterface {
        /// Offset of the packet block.
        offset: usize,
        /// The interface number it names.
        interface: u32,
    },
    /// A pcapng file ends without describing any interface, so it cannot hold packets.
    #[error("pcapng file describes no capture interface, so it holds no packets")]
    NoInterface,
}

impl PcapError {
    /// A pcapng parsing failure at `offset`, from pcap-file's error.
    fn block(offset: usize, available: usize, e: pcap_file::PcapError) -> PcapError {
        match e {
            pcap_file::PcapError::IncompleteBuffer => {
                PcapError::TruncatedBlock { offset, available }
            }
            pcap_file::PcapError::InvalidField(reason) => PcapError::BadBlock { offset, reason },
            pcap_file::PcapError::InvalidInterfaceId(interface) => {
                PcapError::UnknownInterface { offset, interface }
            }
            pcap_file::PcapError::Utf8Error(_) | pcap_file::PcapError::FromUtf8Error(_) => {
                PcapError::BadBlock {
                    offset,
                    reason: "an option's text is not UTF-8",
                }
            }
            // Parsing a slice does no I/O; keep the variant total anyway.
            pcap_file::PcapError::IoError(_) => PcapError::BadBlock {
                offset,
                reason: "read error",
            },
        }
    }
}

/// Reads a classic pcap or pcapng file held in memory; the format is told by its first bytes.
///
/// ```
/// use roce::pcap::{read, Format, LinkType, PcapWriter, Resolution, Timestamp};
///
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Raw, 65535, Resolution::Micros)?;
/// w.write_packet(Timestamp::new(1, 2_000), &[0x45, 0, 0, 20], 40)?;
/// let file = w.into_inner()?;
/// let (header, records) = read(&file).unwrap();
/// assert_eq!((header.format, header.link), (Format::Pcap, LinkType::Raw));
/// let records: Vec<_> = records.collect::<Result<_, _>>().unwrap();
/// assert_eq!((records[0].ts.nanos, records[0].orig_len), (2_000, 40));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn read(file: &[u8]) -> Result<(FileHeader, Records<'_>), PcapError> {
    match file.get(..4) {
        Some(m) if m == PCAPNG_MAGIC.to_be_bytes() => read_pcapng(file),
        _ => read_pcap(file),
    }
}

fn read_pcap(file: &[u8]) -> Result<(FileHeader, Records<'_>), PcapError> {
    let (_, h) = PcapHeader::from_slice(file).map_err(|e| match e {
        pcap_file::PcapError::IncompleteBuffer => PcapError::ShortHeader(file.len()),
        _ => PcapError::BadMagic(le32(file, 0).unwrap_or(0)),
    })?;
    let link = LinkType::from(h.datalink);
    let header = FileHeader {
        format: Format::Pcap,
        link,
        snaplen: h.snaplen,
        resolution: h.ts_resolution.into(),
        big_endian: h.endianness.is_big(),
        version: (h.version_major, h.version_minor),
    };
    let state = State::Pcap {
        endianness: h.endianness,
        resolution: h.ts_resolution.into(),
        link,
    };
    Ok((header, Records::new(file, GLOBAL_HEADER_LEN, state)))
}

fn read_pcapng(file: &[u8]) -> Result<(FileHeader, Records<'_>), PcapError> {
    // The section header fixes the byte order (pcap-file detects it, whatever it is told).
    let (after, shb) = match Block::from_slice::<BigEndian>(file) {
        Ok((rem, Block::SectionHeader(shb))) => (file.len() - rem.len(), shb),
        Ok(_) => {
            return Err(PcapError::BadBlock {
                offset: 0,
                reason: "the first block is not a section header",
            })
        }
        Err(e) => return Err(PcapError::block(0, file.len(), e)),
    };
    let state = State::PcapNg {
        endianness: shb.endianness,
        interfaces: Vec::new(),
    };
    let records = Records::new(file, after, state);
    // The header describes the first interface: find it without consuming any record.
    let mut scan = records.clone();
    let first = loop {
        match scan.next_block() {
            None => return Err(PcapError::NoInterface),
            Some(Err(e)) => return Err(e),
            Some(Ok(NgItem::Interface(i))) => break i,
            Some(Ok(NgItem::Record(_))) => {
                // Unreachable: a packet before any interface fails as UnknownInterface.
                return Err(PcapError::NoInterface);
            }
            Some(Ok(NgItem::Other)) => {}
        }
    };
    let header = FileHeader {
        format: Format::PcapNg,
        link: first.link,
        snaplen: first.snaplen,
        resolution: if first.units_per_sec() > 1_000_000 {
            Resolution::Nanos
        } else {
            Resolution::Micros
        },
        big_endian: shb.endianness.is_big(),
        version: (shb.major_version, shb.minor_version),
    };
    Ok((header, records))
}

/// Iterator over the records of a capture file; see [`read`]. After an error it ends.
#[derive(Debug, Clone)]
pub struct Records<'a> {
    file: &'a [u8],
    pos: usize,
    state: State,
    failed: bool,
}

/// What reading the rest of a file needs to know.
#[derive(Debug, Clone)]
enum State {
    Pcap {
        endianness: Endianness,
        resolution: Resolution,
        link: LinkType,
    },
    PcapNg {
        endianness: Endianness,
        /// The current section's interfaces, in the order they were described.
        interfaces: Vec<Interface>,
    },
}

/// A pcapng interface description, as far as records need it.
#[derive(Debug, Clone, Copy)]
struct Interface {
    link: LinkType,
    snaplen: u32,
    /// `if_tsresol`: bit 7 clear, 10^-n seconds; set, 2^-n. Default 6 (microseconds).
    tsresol: u8,
    /// `if_tsoffset`: seconds to add to every timestamp.
    tsoffset: u64,
}

impl Interface {
    fn of(idb: &InterfaceDescriptionBlock<'_>) -> Interface {
        let mut i = Interface {
            link: LinkType::from(idb.linktype),
            snaplen: idb.snaplen,
            tsresol: 6,
            tsoffset: 0,
        };
        for option in &idb.options {
            match *option {
                InterfaceDescriptionOption::IfTsResol(r) => i.tsresol = r,
                InterfaceDescriptionOption::IfTsOffset(o) => i.tsoffset = o,
                _ => {}
            }
        }
        i
    }

    /// Timestamp units per second; saturates for resolutions finer than any clock.
    fn units_per_sec(self) -> u128 {
        let exp = u32::from(self.tsresol & 0x7f);
        if self.tsresol & 0x80 == 0 {
            10u128.checked_pow(exp).unwrap_or(u128::MAX)
        } else {
            1u128.checked_shl(exp).unwrap_or(u128::MAX)
        }
    }

    /// A packet block's raw 64-bit timestamp, in this interface's units, as a [`Timestamp`].
    fn timestamp(self, raw: u64) -> Timestamp {
        let units = self.units_per_sec();
        let raw = u128::from(raw);
        // raw < 2^64, so raw % units * 10^9 < 2^94: no overflow.
        let nanos = (raw % units) * 1_000_000_000 / units;
        let secs = u64::try_from(raw / units).unwrap_or(u64::MAX);
        Timestamp::new(
            secs.saturating_add(self.tsoffset),
            u32::try_from(nanos).unwrap_or(0),
        )
    }
}

/// One pcapng block, as the record iterator sees it.
enum NgItem<'a> {
    Record(Record<'a>),
    Interface(Interface),
    Other,
}

impl<'a> Records<'a> {
    fn new(file: &'a [u8], pos: usize, state: State) -> Records<'a> {
        Records {
            file,
            pos,
            state,
            failed: false,
        }
    }

    fn next_pcap_record(
        &mut self,
        endianness: Endianness,
        resolution: Resolution,
        link: LinkType,
    ) -> Result<Record<'a>, PcapError> {
        let (pos, rest) = (self.pos, self.file.get(self.pos..).unwrap_or(&[]));
        // Raw packets, not pcap-file's validated ones: those refuse records whose original
        // length exceeds the snap length, which is every record a snap length cut.
        let parsed = match endianness {
            Endianness::Big => RawPcapPacket::from_slice::<BigEndian>(rest),
            Endianness::Little => RawPcapPacket::from_slice::<LittleEndian>(rest),
        };
        let truncated = || {
            let caplen = match endianness {
                Endianness::Big => be32(rest, 8),
                Endianness::Little => le32(rest, 8),
            };
            let needed = caplen.map_or(RECORD_HEADER_LEN, |c| {
                RECORD_HEADER_LEN.saturating_add(usize::try_from(c).unwrap_or(usize::MAX))
            });
            PcapError::TruncatedRecord {
                offset: pos,
                needed,
                available: rest.len(),
            }
        };
        let (rem, raw) = parsed.map_err(|_| truncated())?;
        let end = rest.len() - rem.len();
        let data = rest.get(RECORD_HEADER_LEN..end).ok_or_else(truncated)?;
        self.pos += end;
        let nanos = match resolution {
            Resolution::Micros => raw.ts_frac.saturating_mul(1_000),
            Resolution::Nanos => raw.ts_frac,
        };
        Ok(Record {
            ts: Timestamp::new(u64::from(raw.ts_sec), nanos),
            orig_len: raw.orig_len,
            data,
            link,
        })
    }

    /// Reads the next pcapng block, keeping track of sections and interfaces.
    fn next_block(&mut self) -> Option<Result<NgItem<'a>, PcapError>> {
        let State::PcapNg {
            endianness,
            interfaces,
        } = &mut self.state
        else {
            return None;
        };
        let (pos, rest) = (self.pos, self.file.get(self.pos..)?);
        if rest.is_empty() {
            return None;
        }
        // Frame every block, but parse only the ones records need: a malformed name
        // resolution or statistics block, or one of a kind pcap-file does not know, is skipped
        // rather than ending the file.
        let parsed = match endianness {
            Endianness::Big => next_block::<BigEndian>(rest),
            Endianness::Little => next_block::<LittleEndian>(rest),
        };
        let (rem, block) = match parsed {
            Ok(ok) => ok,
            Err(e) => return Some(Err(PcapError::block(pos, rest.len(), e))),
        };
        self.pos += rest.len() - rem.len();
        let Some(block) = block else {
            return Some(Ok(NgItem::Other));
        };
        let interface = |id: u32| {
            usize::try_from(id)
                .ok()
                .and_then(|i| interfaces.get(i).copied())
                .ok_or(PcapError::UnknownInterface {
                    offset: pos,
                    interface: id,
                })
        };
        let borrowed = |data: Cow<'a, [u8]>| match data {
            Cow::Borrowed(d) => Ok(d),
            // Parsing a slice always borrows; never copy a packet to get around it.
            Cow::Owned(_) => Err(PcapError::BadBlock {
                offset: pos,
                reason: "packet data not borrowed from the file",
            }),
        };
        let item = match block {
            Block::SectionHeader(shb) => {
                *endianness = shb.endianness;
                interfaces.clear();
                Ok(NgItem::Other)
            }
            Block::InterfaceDescription(idb) => {
                let i = Interface::of(&idb);
                interfaces.push(i);
                Ok(NgItem::Interface(i))
            }
            Block::EnhancedPacket(epb) => interface(epb.interface_id).and_then(|i| {
                // pcap-file hands the raw 64-bit timestamp over as if it were nanoseconds.
                let raw = u64::try_from(epb.timestamp.as_nanos()).unwrap_or(u64::MAX);
                Ok(NgItem::Record(Record {
                    ts: i.timestamp(raw),
                    orig_len: epb.original_len,
                    data: borrowed(epb.data)?,
                    link: i.link,
                }))
            }),
            Block::Packet(pb) => interface(u32::from(pb.interface_id)).and_then(|i| {
                Ok(NgItem::Record(Record {
                    ts: i.timestamp(pb.timestamp),
                    orig_len: pb.original_len,
                    data: borrowed(pb.data)?,
                    link: i.link,
                }))
            }),
            Block::SimplePacket(spb) => interface(0).and_then(|i| {
                // The block holds the data padded to 32 bits and no captured length: the
                // captured part is the original length, cut by the snap length (0: none).
                let data = borrowed(spb.data)?;
                let orig = usize::try_from(spb.original_len).unwrap_or(usize::MAX);
                let snap = match usize::try_from(i.snaplen) {
                    Ok(0) | Err(_) => usize::MAX,
                    Ok(s) => s,
                };
                Ok(NgItem::Record(Record {
                    ts: Timestamp::default(),
                    orig_len: spb.original_len,
                    data: data.get(..orig.min(snap)).unwrap_or(data),
                    link: i.link,
                }))
            }),
            _ => Ok(NgItem::Other),
        };
        Some(item)
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let result = match self.state {
            State::Pcap {
                endianness,
                resolution,
                link,
            } => {
                if self.pos >= self.file.len() {
                    return None;
                }
                self.next_pcap_record(endianness, resolution, link)
            }
            State::PcapNg { .. } => loop {
                match self.next_block()? {
                    Ok(NgItem::Record(r)) => break Ok(r),
                    Ok(NgItem::Interface(_) | NgItem::Other) => {}
                    Err(e) => break Err(e),
                }
            },
        };
        self.failed = result.is_err();
        Some(result)
    }
}

/// Why a capture could not be read from a stream ([`StreamReader`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StreamError {
    /// Reading the stream failed.
    #[error("cannot read the capture: {source}")]
    Io {
        /// The read error.
        #[source]
        source: io::Error,
    },
    /// What was read is not a pcap or pcapng file, or stops in the middle of a record.
    #[error(transparent)]
    Pcap(#[from] PcapError),
}

/// Reads a classic pcap or pcapng file from a stream, such as a pipe from `tcpdump -U -w -`:
/// each record is handed out as soon as it has arrived, and only the records not yet handed
/// out are kept in memory. Formats and errors are those of [`read`]; a stream that ends in the
/// middle of a record is [`PcapError::TruncatedRecord`] or [`PcapError::TruncatedBlock`], with
/// offsets counted from the start of the stream.
///
/// ```
/// use roce::pcap::{LinkType, PcapWriter, Resolution, StreamReader, Timestamp};
///
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 65535, Resolution::Nanos)?;
/// w.write_packet(Timestamp::new(1, 5), &[0xaa; 60], 60)?;
/// let file = w.into_inner()?;
///
/// let mut stream = StreamReader::new(&file[..])?;
/// assert_eq!(stream.header().link, LinkType::Ethernet);
/// let record = stream.next_record().unwrap()?;
/// assert_eq!((record.ts, record.data.len()), (Timestamp::new(1, 5), 60));
/// assert!(stream.next_record().is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct StreamReader<R: io::Read> {
    reader: R,
    header: FileHeader,
    /// Bytes read and not yet dropped are `buf[..end]`; `pos` indexes into them.
    buf: Vec<u8>,
    end: usize,
    pos: usize,
    /// Bytes dropped from the front of `buf` so far, to report offsets in the stream.
    dropped: usize,
    state: State,
    eof: bool,
    failed: bool,
}

/// How much is read from the stream at a time.
const STREAM_CHUNK: usize = 64 * 1024;

impl<R: io::Read> StreamReader<R> {
    /// Reads the file header (and, for pcapng, up to the first interface description).
    pub fn new(reader: R) -> Result<StreamReader<R>, StreamError> {
        let mut s = StreamReader {
            reader,
            header: FileHeader {
                format: Format::Pcap,
                link: LinkType::Ethernet,
                snaplen: 0,
                resolution: Resolution::Micros,
                big_endian: false,
                version: (0, 0),
            },
            buf: Vec::new(),
            end: 0,
            pos: 0,
            dropped: 0,
            state: State::Pcap {
                endianness: Endianness::Little,
                resolution: Resolution::Micros,
                link: LinkType::Ethernet,
            },
            eof: false,
            failed: false,
        };
        loop {
            match read(&s.buf[..s.end]) {
                Ok((header, records)) => {
                    (s.header, s.pos, s.state) = (header, records.pos, records.state);
                    return Ok(s);
                }
                // Not all of it has arrived yet.
                Err(
                    PcapError::ShortHeader(_)
                    | PcapError::TruncatedBlock { .. }
                    | PcapError::NoInterface,
                ) if !s.eof => s.fill()?,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// What the file says about itself; see [`read`].
    pub fn header(&self) -> FileHeader {
        self.header
    }

    /// The next record, waiting for it to arrive; `None` at the end of the stream. After an
    /// error, the stream ends.
    pub fn next_record(&mut self) -> Option<Result<Record<'_>, StreamError>> {
        if self.failed {
            return None;
        }
        // Read until a whole record is buffered or the stream ends. The probe parses without
        // consuming; the record handed out is parsed again below, to borrow from the buffer.
        loop {
            let mut probe = Records::new(&self.buf[..self.end], self.pos, self.state.clone());
            let incomplete = match probe.next() {
                None => true,
                Some(Err(PcapError::TruncatedRecord { .. } | PcapError::TruncatedBlock { .. })) => {
                    true
                }
                Some(_) => false,
            };
            if !incomplete || self.eof {
                break;
            }
            if let Err(e) = self.fill() {
                self.failed = true;
                return Some(Err(e));
            }
        }
        let mut records = Records::new(&self.buf[..self.end], self.pos, self.state.clone());
        let item = records.next();
        self.pos = records.pos;
        self.state = records.state;
        match item? {
            Ok(record) => Some(Ok(record)),
            Err(e) => {
                self.failed = true;
                Some(Err(e.shifted(self.dropped).into()))
            }
        }
    }

    /// Reads the next chunk of the stream (or notes its end), first dropping the bytes of the
    /// records already handed out once they are most of the buffer.
    fn fill(&mut self) -> Result<(), StreamError> {
        if self.pos >= STREAM_CHUNK && self.pos * 2 >= self.end {
            self.buf.copy_within(self.pos..self.end, 0);
            self.end -= self.pos;
            self.dropped += self.pos;
            self.pos = 0;
        }
        // Grown (and zeroed) only by what the last read used, not by a chunk every call.
        if self.buf.len() < self.end + STREAM_CHUNK {
            self.buf.resize(self.end + STREAM_CHUNK, 0);
        }
        let n = loop {
            match self.reader.read(&mut self.buf[self.end..]) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(StreamError::Io { source }),
            }
        };
        self.end += n;
        self.eof = n == 0;
        Ok(())
    }
}

impl PcapError {
    /// The same error with its offset moved `by` bytes further into the stream.
    fn shifted(self, by: usize) -> PcapError {
        match self {
            PcapError::TruncatedRecord {
                offset,
                needed,
                available,
            } => PcapError::TruncatedRecord {
                offset: offset + by,
                needed,
                available,
            },
            PcapError::TruncatedBlock { offset, available } => PcapError::TruncatedBlock {
                offset: offset + by,
                available,
            },
            PcapError::BadBlock { offset, reason } => PcapError::BadBlock {
                offset: offset + by,
                reason,
            },
            PcapError::UnknownInterface { offset, interface } => PcapError::UnknownInterface {
                offset: offset + by,
                interface,
            },
            other => other,
        }
    }
}

/// The next pcapng block, parsed if records need it (`None` for every other kind).
fn next_block<B: ByteOrder>(
    rest: &[u8],
) -> Result<(&[u8], Option<Block<'_>>), pcap_file::PcapError> {
    let (rem, raw) = RawBlock::from_slice::<B>(rest)?;
    match raw.type_ {
        SECTION_HEADER_BLOCK
        | INTERFACE_DESCRIPTION_BLOCK
        | ENHANCED_PACKET_BLOCK
        | SIMPLE_PACKET_BLOCK
        | PACKET_BLOCK => Ok((rem, Some(raw.try_into_block::<B>()?))),
        _ => Ok((rem, None)),
    }
}

fn le32(buf: &[u8], at: usize) -> Option<u32> {
    let b = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(b.try_into().ok()?))
}

fn be32(buf: &[u8], at: usize) -> Option<u32> {
    le32(buf, at).map(u32::swap_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_headers_byte_for_byte() {
        let mut w =
            PcapWriter::new(Vec::new(), LinkType::Ethernet, 64, Resolution::Micros).unwrap();
        let data: Vec<u8> = (0..100).collect();
        w.write_packet(Timestamp::new(0x01020304, 5_006_007), &data, 100)
            .unwrap();
        w.write_packet(Timestamp::new(7, 999), &data[..10], 0)
            .unwrap();
        let file = w.into_inner().unwrap();
        #[rustfmt::skip]
        let expected_header = [
            0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 1, 0, 0, 0,
        ];
        assert_eq!(&file[..24], &expected_header);
        #[rustfmt::skip]
        let rec1 = [4, 3, 2, 1, 0x8e, 0x13, 0, 0, 64, 0, 0, 0, 100, 0, 0, 0]; // 5006 µs
        assert_eq!(&file[24..40], &rec1);
        assert_eq!(&file[40..104], &data[..64]);
        let rec2 = [7, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 10, 0, 0, 0];
        assert_eq!(&file[104..120], &rec2);
        assert_eq!(&file[120..], &data[..10]);
    }

    #[test]
    fn round_trips_nanosecond_raw_files() {
        let mut w = PcapWriter::new(
            Vec::new(),
            LinkType::Raw,
            DEFAULT_SNAPLEN,
            Resolution::Nanos,
        )
        .unwrap();
        w.write_packet(Timestamp::new(1_700_000_000, 123_456_789), &[0x45; 28], 28)
            .unwrap();
        let file = w.into_inner().unwrap();
        assert_eq!(&file[..4], &[0x4d, 0x3c, 0xb2, 0xa1]);
        assert_eq!(&file[20..24], &[101, 0, 0, 0]);
        let (h, mut recs) = read(&file).unwrap();
        assert_eq!(
            h,
            FileHeader {
                format: Format::Pcap,
                link: LinkType::Raw,
                snaplen: DEFAULT_SNAPLEN,
                resolution: Resolution::Nanos,
                big_endian: false,
                version: (2, 4)
            }
        );
        let r = recs.next().unwrap().unwrap();
        assert_eq!(r.ts, Timestamp::new(1_700_000_000, 123_456_789));
        assert_eq!((r.orig_len, r.data), (28, &[0x45u8; 28][..]));
        assert!(recs.next().is_none());
    }

    #[test]
    fn reads_big_endian_and_rejects_garbage() {
        let mut file = vec![
            0xa1, 0xb2, 0xc3, 0xd4, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1,
        ];
        file.extend([0, 0, 0, 9, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0xaa, 0xbb]);
        let (h, recs) = read(&file).unwrap();
        assert!(h.big_endian);
        assert_eq!(
            (h.link, h.snaplen, h.version),
            (LinkType::Ethernet, 256, (2, 4))
        );
        let recs: Vec<_> = recs.collect();
        assert_eq!(
            recs,
            vec![Ok(Record {
                ts: Timestamp::new(9, 1_000),
                orig_len: 3,
                data: &[0xaa, 0xbb],
                link: LinkType::Ethernet,
            })]
        );

        assert_eq!(read(&file[..10]).err(), Some(PcapError::ShortHeader(10)));
        assert_eq!(
            read(&[
                0xd4, 0xc3, 0xb2, 0xa2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            ])
            .err(),
            Some(PcapError::BadMagic(0xa2b2c3d4))
        );
        // A pcapng section header whose byte-order magic is garbage.
        assert!(matches!(
            read(&[0x0a, 0x0d, 0x0d, 0x0a, 28, 0, 0, 0, 1, 2, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(PcapError::BadBlock { offset: 0, .. } | PcapError::TruncatedBlock { .. })
        ));
        let (_, mut recs) = read(&file[..file.len() - 1]).unwrap();
        assert_eq!(
            recs.next(),
            Some(Err(PcapError::TruncatedRecord {
                offset: 24,
                needed: 18,
                available: 17
            }))
        );
        assert_eq!(recs.next(), None);
    }

    #[test]
    fn synthetic_ethernet() {
        let f = ethernet_for_ip(&[0x60, 1, 2]).unwrap();
        assert_eq!(&f[12..], &[0x86, 0xdd, 0x60, 1, 2]);
        assert_eq!(ethernet_for_ip(&[0x45]).map(|f| f[13]), Some(0x00));
        assert_eq!(ethernet_for_ip(&[0x15]), None);
        assert_eq!(ethernet_for_ip(&[]), None);
    }

    #[test]
    fn timestamps() {
        assert_eq!(
            Timestamp::new(1, 2_500_000_000),
            Timestamp {
                secs: 3,
                nanos: 500_000_000
            }
        );
        assert_eq!(Timestamp::new(12, 34).to_string(), "12.000000034");
        assert_eq!(
            Timestamp::from(UNIX_EPOCH + Duration::from_millis(1500)),
            Timestamp::new(1, 500_000_000)
        );
    }

    /// A pcapng file as dumpcap would write it: a section header, then per interface an IDB
    /// with `if_tsresol`, then packets, in the given byte order.
    fn pcapng(
        endianness: Endianness,
        interfaces: &[(DataLink, Option<u8>)],
        packets: &[(u32, u64, &[u8], u32)],
    ) -> Vec<u8> {
        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
        use pcap_file::pcapng::{PcapNgBlock, PcapNgWriter};

        let mut w = PcapNgWriter::with_endianness(Vec::new(), endianness).unwrap();
        for &(link, tsresol) in interfaces {
            let mut idb = InterfaceDescriptionBlock::new(link, 0);
            idb.options = tsresol
                .map(|r| vec![InterfaceDescriptionOption::IfTsResol(r)])
                .unwrap_or_default();
            w.write_block(&idb.into_block()).unwrap();
        }
        for &(interface_id, raw_ts, data, original_len) in packets {
            let epb = EnhancedPacketBlock {
                interface_id,
                // pcap-file writes the Duration's nanoseconds as the raw 64-bit timestamp.
                timestamp: Duration::from_nanos(raw_ts),
                original_len,
                data: Cow::Borrowed(data),
                options: vec![],
            };
            w.write_block(&epb.into_block()).unwrap();
        }
        w.into_inner()
    }

    #[test]
    fn reads_pcapng_in_both_byte_orders_with_per_interface_resolution() {
        for endianness in [Endianness::Little, Endianness::Big] {
            let file = pcapng(
                endianness,
                &[(DataLink::ETHERNET, Some(9)), (DataLink::RAW, None)],
                &[
                    (0, 1_700_000_000_123_456_789, &[1, 2, 3], 60),
                    // Interface 1 keeps the default resolution, microseconds.
                    (1, 1_700_000_001_000_002, &[0x45, 0, 0, 20], 20),
                ],
            );
            let (h, records) = read(&file).unwrap();
            assert_eq!(
                h,
                FileHeader {
                    format: Format::PcapNg,
                    link: LinkType::Ethernet,
                    snaplen: 0,
                    resolution: Resolution::Nanos,
                    big_endian: endianness == Endianness::Big,
                    version: (1, 0),
                }
            );
            let records: Vec<_> = records.collect::<Result<_, _>>().unwrap();
            assert_eq!(
                records,
                [
                    Record {
                        ts: Timestamp::new(1_700_000_000, 123_456_789),
                        orig_len: 60,
                        data: &[1, 2, 3],
                        link: LinkType::Ethernet,
                    },
                    Record {
                        ts: Timestamp::new(1_700_000_001, 2_000),
                        orig_len: 20,
                        data: &[0x45, 0, 0, 20],
                        link: LinkType::Raw,
                    },
                ]
            );
        }
    }

    #[test]
    fn pcapng_timestamp_units() {
        let ts = |tsresol, raw| {
            Interface {
                link: LinkType::Ethernet,
                snaplen: 0,
                tsresol,
                tsoffset: 0,
            }
            .timestamp(raw)
        };
        assert_eq!(ts(6, 1_500_000), Timestamp::new(1, 500_000_000));
        assert_eq!(ts(9, 1_500_000_000), Timestamp::new(1, 500_000_000));
        assert_eq!(ts(3, 1_500), Timestamp::new(1, 500_000_000));
        assert_eq!(ts(0x80 | 10, 1024 + 512), Timestamp::new(1, 500_000_000)); // 2^-10 s
        assert_eq!(ts(12, 1_000_000_000_001), Timestamp::new(1, 0)); // finer than a nanosecond
        assert_eq!(ts(0x7f, u64::MAX), Timestamp::new(0, 0)); // 10^-127: saturates, no panic
        assert_eq!(ts(0xff, u64::MAX), Timestamp::new(0, 0));
        assert_eq!(ts(0, u64::MAX), Timestamp::new(u64::MAX, 0));
    }

    #[test]
    fn pcapng_errors_name_the_block() {
        let file = pcapng(
            Endianness::Little,
            &[(DataLink::ETHERNET, None)],
            &[(0, 0, &[1, 2, 3, 4], 4)],
        );
        // Section header 28 bytes, IDB 20, EPB 36.
        assert_eq!(file.len(), 28 + 20 + 36);
        let (_, mut recs) = read(&file[..file.len() - 1]).unwrap();
        assert_eq!(
            recs.next(),
            Some(Err(PcapError::TruncatedBlock {
                offset: 48,
                available: 35
            }))
        );
        assert_eq!(recs.next(), None);

        let mut bad_interface = file.clone();
        bad_interface[56] = 1; // the EPB's interface ID
        let (_, mut recs) = read(&bad_interface).unwrap();
        assert_eq!(
            recs.next(),
            Some(Err(PcapError::UnknownInterface {
                offset: 48,
                interface: 1
            }))
        );

        // Blocks records do not need are skipped, even malformed: here a name resolution
        // block whose record runs past its end, and a block of a kind nobody defined.
        let mut skipped = file[..48].to_vec();
        skipped.extend([
            4, 0, 0, 0, 20, 0, 0, 0, 1, 0, 99, 0, 0, 0, 0, 0, 20, 0, 0, 0,
        ]);
        skipped.extend([0xad, 0x0b, 0, 0, 12, 0, 0, 0, 12, 0, 0, 0]);
        skipped.extend(&file[48..]);
        assert!(Block::from_slice::<LittleEndian>(&skipped[48..68]).is_err());
        let (_, recs) = read(&skipped).unwrap();
        assert_eq!(
            recs.map(|r| r.map(|r| r.data)).collect::<Vec<_>>(),
            [Ok(&[1u8, 2, 3, 4][..])]
        );

        assert_eq!(read(&file[..28]).err(), Some(PcapError::NoInterface));
        let no_idb = [&file[..28], &file[48..]].concat();
        assert_eq!(
            read(&no_idb).err(),
            Some(PcapError::UnknownInterface {
                offset: 28,
                interface: 0
            })
        );
    }
}
