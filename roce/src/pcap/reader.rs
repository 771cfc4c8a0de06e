//! Reading a whole capture file held in memory: [`read`] tells classic pcap from pcapng by the
//! first bytes and hands out its [`Records`], each with its own link type and a timestamp to
//! the nanosecond.

use std::borrow::Cow;

use byteorder_slice::{BigEndian, ByteOrder, LittleEndian};
use pcap_file::pcap::{PcapHeader, RawPcapPacket};
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::{
    ENHANCED_PACKET_BLOCK, INTERFACE_DESCRIPTION_BLOCK, PACKET_BLOCK, SECTION_HEADER_BLOCK,
    SIMPLE_PACKET_BLOCK,
};
use pcap_file::pcapng::{Block, RawBlock};
use pcap_file::Endianness;

use super::{
    FileHeader, Format, LinkType, PcapError, Record, Resolution, Timestamp, GLOBAL_HEADER_LEN,
    PCAPNG_MAGIC, RECORD_HEADER_LEN,
};

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
    /// Where the next record starts; [`StreamReader`](super::StreamReader) resumes from here.
    pub(super) pos: usize,
    pub(super) state: State,
    failed: bool,
}

/// What reading the rest of a file needs to know.
#[derive(Debug, Clone)]
pub(super) enum State {
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
pub(super) struct Interface {
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
    pub(super) fn new(file: &'a [u8], pos: usize, state: State) -> Records<'a> {
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
    use std::time::Duration;

    use pcap_file::DataLink;

    use super::*;
    use crate::pcap::{PcapWriter, DEFAULT_SNAPLEN};

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
