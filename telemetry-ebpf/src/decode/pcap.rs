//! Classic libpcap files: a writer for `-w FILE.pcap` and a reader for tests and `-r`.
//!
//! The format is a 24-byte global header followed by records of a 16-byte header and the
//! captured bytes. Everything is written little-endian; the magic number tells readers the byte
//! order and whether timestamps are in micro- or nanoseconds. Wireshark, tcpdump and tshark
//! read both.
//!
//! Frames from XDP/TC go into `LINKTYPE_ETHERNET` files. Datagrams from the rxe kprobes start
//! at the IP header; write those to a separate [`LinkType::Raw`] (`LINKTYPE_RAW`, 101) file,
//! which Wireshark dissects as IPv4/IPv6 by the version nibble and then as RoCEv2 by UDP port
//! 4791. Where a single Ethernet file is wanted, [`ethernet_for_ip`] prepends a synthetic
//! Ethernet header (zero MACs, ethertype from the IP version) instead.

use std::fmt;
use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};

use super::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};

/// Magic number of a file with microsecond timestamps.
pub const MAGIC_MICROS: u32 = 0xa1b2_c3d4;
/// Magic number of a file with nanosecond timestamps.
pub const MAGIC_NANOS: u32 = 0xa1b2_3c4d;
/// Size of the global header.
pub const GLOBAL_HEADER_LEN: usize = 24;
/// Size of a record header.
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

/// The link-layer type of a capture file (the "network" field of the global header).
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

/// Timestamp precision of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resolution {
    /// Microseconds (magic `0xa1b2c3d4`), the most widely read.
    Micros,
    /// Nanoseconds (magic `0xa1b23c4d`).
    Nanos,
}

/// Writes a classic pcap file.
///
/// ```
/// use telemetry_ebpf::decode::pcap::{LinkType, PcapWriter, Resolution, Timestamp};
///
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 96, Resolution::Nanos)?;
/// w.write_packet(Timestamp::new(1_700_000_000, 5), &[0u8; 60], 60)?;
/// let file = w.into_inner()?;
/// assert_eq!(file.len(), 24 + 16 + 60);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    out: W,
    snaplen: u32,
    resolution: Resolution,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header. Records longer than `snaplen` are cut to it.
    pub fn new(
        mut out: W,
        link: LinkType,
        snaplen: u32,
        resolution: Resolution,
    ) -> io::Result<Self> {
        let magic = match resolution {
            Resolution::Micros => MAGIC_MICROS,
            Resolution::Nanos => MAGIC_NANOS,
        };
        let mut h = [0u8; GLOBAL_HEADER_LEN];
        put(&mut h, 0, &magic.to_le_bytes());
        put(&mut h, 4, &2u16.to_le_bytes()); // version 2.4
        put(&mut h, 6, &4u16.to_le_bytes());
        // thiszone and sigfigs (8..16) stay 0: timestamps are UTC.
        put(&mut h, 16, &snaplen.to_le_bytes());
        put(&mut h, 20, &link.code().to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter {
            out,
            snaplen,
            resolution,
        })
    }

    /// Appends a record. `data` is what was captured; `orig_len` is the packet's length on the
    /// wire (raised to `data.len()` if smaller). Data beyond the snap length is not written.
    pub fn write_packet(&mut self, ts: Timestamp, data: &[u8], orig_len: usize) -> io::Result<()> {
        let snap = usize::try_from(self.snaplen).unwrap_or(usize::MAX);
        let caplen = data.len().min(snap);
        let orig_len = orig_len.max(data.len());
        let frac = match self.resolution {
            Resolution::Micros => ts.nanos / 1_000,
            Resolution::Nanos => ts.nanos,
        };
        let too_long = |what| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} does not fit 32 bits"),
            )
        };
        let secs = u32::try_from(ts.secs).map_err(|_| too_long("timestamp"))?;
        let caplen32 = u32::try_from(caplen).map_err(|_| too_long("captured length"))?;
        let orig32 = u32::try_from(orig_len).map_err(|_| too_long("original length"))?;
        let mut h = [0u8; RECORD_HEADER_LEN];
        put(&mut h, 0, &secs.to_le_bytes());
        put(&mut h, 4, &frac.to_le_bytes());
        put(&mut h, 8, &caplen32.to_le_bytes());
        put(&mut h, 12, &orig32.to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(data.get(..caplen).unwrap_or(data))
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Prepends a synthetic Ethernet header to a datagram that starts at its IP header, so rxe
/// kprobe captures can share a `LINKTYPE_ETHERNET` file. Both MACs are zero; the ethertype
/// follows the IP version nibble. Returns `None` if the datagram is neither IPv4 nor IPv6.
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

/// The global header of a pcap file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    /// Link type of every record.
    pub link: LinkType,
    /// Snap length.
    pub snaplen: u32,
    /// Timestamp precision.
    pub resolution: Resolution,
    /// True if the file was written big-endian.
    pub big_endian: bool,
    /// Format version (major, minor); 2.4 for every file written today.
    pub version: (u16, u16),
}

/// One record of a pcap file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// When the packet was captured.
    pub ts: Timestamp,
    /// The packet's length on the wire.
    pub orig_len: u32,
    /// The captured bytes.
    pub data: &'a [u8],
}

/// Why a pcap file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PcapError {
    /// The file is shorter than its global header.
    #[error("pcap file too short for its 24-byte header ({0} bytes)")]
    ShortHeader(usize),
    /// The magic number is not a classic pcap one (pcapng files start with 0x0a0d0d0a).
    #[error("not a classic pcap file: magic 0x{0:08x}")]
    BadMagic(u32),
    /// A record header or its data runs past the end of the file.
    #[error("pcap record at offset {offset} truncated: need {needed} bytes, {available} left")]
    TruncatedRecord {
        /// Offset of the record header.
        offset: usize,
        /// Bytes the record needs.
        needed: usize,
        /// Bytes left in the file.
        available: usize,
    },
}

/// Reads a pcap file held in memory.
///
/// ```
/// use telemetry_ebpf::decode::pcap::{read, LinkType, PcapWriter, Resolution, Timestamp};
///
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Raw, 65535, Resolution::Micros)?;
/// w.write_packet(Timestamp::new(1, 2_000), &[0x45, 0, 0, 20], 40)?;
/// let file = w.into_inner()?;
/// let (header, records) = read(&file).unwrap();
/// assert_eq!(header.link, LinkType::Raw);
/// let records: Vec<_> = records.collect::<Result<_, _>>().unwrap();
/// assert_eq!((records[0].ts.nanos, records[0].orig_len), (2_000, 40));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn read(file: &[u8]) -> Result<(FileHeader, Records<'_>), PcapError> {
    let h: [u8; GLOBAL_HEADER_LEN] = file
        .get(..GLOBAL_HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(PcapError::ShortHeader(file.len()))?;
    let magic_le = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
    let (big_endian, resolution) = match (magic_le, magic_le.swap_bytes()) {
        (MAGIC_MICROS, _) => (false, Resolution::Micros),
        (MAGIC_NANOS, _) => (false, Resolution::Nanos),
        (_, MAGIC_MICROS) => (true, Resolution::Micros),
        (_, MAGIC_NANOS) => (true, Resolution::Nanos),
        _ => return Err(PcapError::BadMagic(magic_le)),
    };
    let e = Endian(big_endian);
    let header = FileHeader {
        link: LinkType::from_code(e.u32([h[20], h[21], h[22], h[23]])),
        snaplen: e.u32([h[16], h[17], h[18], h[19]]),
        resolution,
        big_endian,
        version: (e.u16([h[4], h[5]]), e.u16([h[6], h[7]])),
    };
    Ok((
        header,
        Records {
            file,
            pos: GLOBAL_HEADER_LEN,
            endian: e,
            resolution,
            failed: false,
        },
    ))
}

/// Iterator over the records of a pcap file; see [`read`].
#[derive(Debug, Clone)]
pub struct Records<'a> {
    file: &'a [u8],
    pos: usize,
    endian: Endian,
    resolution: Resolution,
    failed: bool,
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<Record<'a>, PcapError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.pos >= self.file.len() {
            return None;
        }
        let (pos, rest) = (self.pos, self.file.get(self.pos..).unwrap_or(&[]));
        let truncated = |needed| PcapError::TruncatedRecord {
            offset: pos,
            needed,
            available: rest.len(),
        };
        let Some(h) = rest
            .get(..RECORD_HEADER_LEN)
            .and_then(|h| <[u8; RECORD_HEADER_LEN]>::try_from(h).ok())
        else {
            self.failed = true;
            return Some(Err(truncated(RECORD_HEADER_LEN)));
        };
        let e = self.endian;
        let field = |at: usize| e.u32(super::reader::sub(&h, at));
        let (secs, frac, caplen, orig_len) = (field(0), field(4), field(8), field(12));
        let caplen = usize::try_from(caplen).unwrap_or(usize::MAX);
        let needed = RECORD_HEADER_LEN.saturating_add(caplen);
        let Some(data) = rest.get(RECORD_HEADER_LEN..needed) else {
            self.failed = true;
            return Some(Err(truncated(needed)));
        };
        self.pos += needed;
        let nanos = match self.resolution {
            Resolution::Micros => frac.saturating_mul(1_000),
            Resolution::Nanos => frac,
        };
        Some(Ok(Record {
            ts: Timestamp::new(u64::from(secs), nanos),
            orig_len,
            data,
        }))
    }
}

#[derive(Debug, Clone, Copy)]
struct Endian(bool);

impl Endian {
    fn u16(self, b: [u8; 2]) -> u16 {
        if self.0 {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        }
    }

    fn u32(self, b: [u8; 4]) -> u32 {
        if self.0 {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }
    }
}

fn put(buf: &mut [u8], at: usize, bytes: &[u8]) {
    if let Some(dst) = buf.get_mut(at..at + bytes.len()) {
        dst.copy_from_slice(bytes);
    }
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
                data: &[0xaa, 0xbb]
            })]
        );

        assert_eq!(read(&file[..10]).err(), Some(PcapError::ShortHeader(10)));
        assert_eq!(
            read(&[
                0x0a, 0x0d, 0x0d, 0x0a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
            ])
            .err(),
            Some(PcapError::BadMagic(0x0a0d0d0a))
        );
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
}
