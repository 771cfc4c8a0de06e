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
//!
//! The module is split by concept: `format` (what a file says about itself: [`LinkType`],
//! [`Resolution`], [`Format`], [`FileHeader`], [`Record`] and the magic numbers), `writer`
//! ([`PcapWriter`], [`ethernet_for_ip`]), `reader` ([`read`] of a whole file held in memory,
//! its [`Records`]) and `stream` ([`StreamReader`], records as they arrive on a pipe). Why a
//! file cannot be read, [`PcapError`], is here. [`Timestamp`] is the crate's (`roce::Timestamp`),
//! re-exported here, since the renderer uses it without capture files.

mod format;
mod reader;
mod stream;
mod writer;

pub use crate::timestamp::Timestamp;
pub use format::{
    FileHeader, Format, LinkType, Record, Resolution, DEFAULT_SNAPLEN, GLOBAL_HEADER_LEN,
    MAGIC_MICROS, MAGIC_NANOS, PCAPNG_MAGIC, RECORD_HEADER_LEN,
};
pub use reader::{read, Records};
pub use stream::{StreamError, StreamReader};
pub use writer::{ethernet_for_ip, PcapWriter};

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
