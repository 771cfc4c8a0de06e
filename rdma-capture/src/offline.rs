//! Decoding a capture file instead of live traffic (`rdma-capture -r FILE`, or `-r -` from a
//! pipe): classic pcap or pcapng (told apart by their magic numbers, not the file name), with
//! Ethernet, raw IP or Linux cooked (SLL, SLL2: `tcpdump -i any`) records.
//!
//! Needs no privileges and no kernel support, so a capture taken elsewhere (tcpdump on a
//! ConnectX port, tshark, or `rdma-capture -w`) gets the same decoding, filters and QP
//! following.

use std::io::{self, Read, Write};

use crate::processor::Processor;
use crate::record::{Record, Source};
use roce::pcap::{self, LinkType, PcapError, StreamError, StreamReader};

/// The link types `-r` decodes, for error messages.
const SUPPORTED: &str = "Ethernet (1), raw IP (101, 228, 229) and Linux cooked captures \
                         (LINUX_SLL 113, LINUX_SLL2 276)";

/// Why a file could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The file is not a pcap or pcapng file, or is cut short.
    #[error("{0}")]
    Pcap(#[from] PcapError),
    /// Reading a stream failed, or what it carried is not a capture file.
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// The file's link type is not one the decoder knows.
    #[error(
        "link type {code} ({name}) is not supported: rdma-capture reads {SUPPORTED}; capture \
         on the Ethernet interface or with `tcpdump -i any`"
    )]
    LinkType {
        /// The link type's number.
        code: u32,
        /// Its name as libpcap spells it.
        name: String,
    },
    /// Writing output or the new pcap file failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Feeds every record of `file` to `processor`, handing each line it returns to `emit`, and
/// stops after `limit` shown packets if given. Returns the number of records read.
///
/// ```
/// use rdma_capture::offline::replay;
/// use rdma_capture::processor::{Output, Processor, ProcessorConfig};
/// use roce::pcap::{LinkType, PcapWriter, Resolution, Timestamp};
/// # let frame = roce::doc_example_frame();
///
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 2048, Resolution::Nanos)?;
/// w.write_packet(Timestamp::new(1_700_000_000, 0), &frame, frame.len())?;
/// let file = w.into_inner()?;
///
/// let config = ProcessorConfig { output: Output::Json, ..ProcessorConfig::default() };
/// let mut p = Processor::new(config, None::<Vec<u8>>, 2048)?;
/// let mut lines = Vec::new();
/// replay(&file, &mut p, |l| Ok(lines.push(l)), None)?;
/// assert_eq!(lines.len(), 1);
/// assert!(lines[0].contains("\"source\":\"file\""));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn replay<'a, W: Write>(
    file: &'a [u8],
    processor: &mut Processor<W>,
    mut emit: impl FnMut(String) -> io::Result<()>,
    limit: Option<u64>,
) -> Result<u64, OfflineError> {
    let (header, records) = pcap::read(file)?;
    // Refuse a file of another link type before printing anything. A pcapng file may describe
    // more interfaces later; each record is checked again below.
    source_of(header.link)?;
    let as_live = |record: pcap::Record<'a>| -> Result<Record<'a>, OfflineError> {
        Ok(Record {
            ifindex: 0,
            source: source_of(record.link)?,
            orig_len: record.orig_len,
            ktime_ns: 0,
            data: record.data,
        })
    };
    // A file is known in advance: learn which flows belong to a followed QP first, so the
    // peer's packets show in file order from the first one.
    processor.learn_flows(
        records
            .clone()
            .map(|r| r.map_err(OfflineError::from).and_then(as_live)),
    );
    let mut read = 0;
    for record in records {
        if limit.is_some_and(|l| processor.shown() >= l) {
            break;
        }
        let record = record?;
        read += 1;
        let ts = record.ts;
        for line in processor.process(&as_live(record)?, ts)? {
            emit(line)?;
        }
    }
    Ok(read)
}

/// Feeds the records of a capture arriving on `reader` (a pipe from `tcpdump -U -w -`) to
/// `processor` as they arrive, handing each line it returns to `emit`, and stops after `limit`
/// shown packets if given. Returns the number of records read.
///
/// Unlike [`replay`], the capture is not known in advance: a followed QP's peer packets are
/// held back until a response pairs them, as in a live capture.
///
/// ```
/// use rdma_capture::offline::replay_stream;
/// use rdma_capture::processor::{Processor, ProcessorConfig};
/// use roce::pcap::{LinkType, PcapWriter, Resolution, Timestamp};
/// # let frame = roce::doc_example_frame();
///
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 2048, Resolution::Nanos)?;
/// w.write_packet(Timestamp::new(1_700_000_000, 0), &frame, frame.len())?;
/// let file = w.into_inner()?;
///
/// let mut p = Processor::new(ProcessorConfig::default(), None::<Vec<u8>>, 2048)?;
/// let mut lines = Vec::new();
/// replay_stream(&file[..], &mut p, |l| Ok(lines.push(l)), None)?;
/// assert!(lines[0].starts_with("file 1700000000.000000000 10.77.0.1:49153 -> "));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn replay_stream<R: Read, W: Write>(
    reader: R,
    processor: &mut Processor<W>,
    mut emit: impl FnMut(String) -> io::Result<()>,
    limit: Option<u64>,
) -> Result<u64, OfflineError> {
    let mut stream = StreamReader::new(reader)?;
    source_of(stream.header().link)?;
    let mut read = 0;
    while limit.is_none_or(|l| processor.shown() < l) {
        let Some(record) = stream.next_record() else {
            break;
        };
        let record = record?;
        read += 1;
        let live = Record {
            ifindex: 0,
            source: source_of(record.link)?,
            orig_len: record.orig_len,
            ktime_ns: 0,
            data: record.data,
        };
        for line in processor.process(&live, record.ts)? {
            emit(line)?;
        }
    }
    Ok(read)
}

/// Where a file's records start; link types the decoder does not know are refused.
fn source_of(link: LinkType) -> Result<Source, OfflineError> {
    match link {
        LinkType::Ethernet => Ok(Source::File),
        LinkType::Raw | LinkType::IPV4 | LinkType::IPV6 => Ok(Source::FileRaw),
        LinkType::LINUX_SLL => Ok(Source::FileSll),
        LinkType::LINUX_SLL2 => Ok(Source::FileSll2),
        LinkType::Other(code) => Err(OfflineError::LinkType {
            code,
            name: link.name(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::processor::{KernelCounters, ProcessorConfig};
    use roce::pcap::{PcapWriter, Resolution, Timestamp};

    #[test]
    fn raw_ip_files_decode_and_other_link_types_are_refused() {
        let frame = roce::doc_example_frame();
        let mut w = PcapWriter::new(Vec::new(), LinkType::Raw, 2048, Resolution::Micros).unwrap();
        w.write_packet(Timestamp::new(1, 0), &frame[14..], frame.len() - 14)
            .unwrap();
        let file = w.into_inner().unwrap();
        let mut p = Processor::new(ProcessorConfig::default(), None::<Vec<u8>>, 2048).unwrap();
        assert_eq!(replay(&file, &mut p, |_| Ok(()), None).unwrap(), 1);
        let s = p.summary(KernelCounters::default());
        assert_eq!((s.stats.bad_icrc, s.stats.decode_errors), (0, 0));

        let mut other = file.clone();
        other[20..24].copy_from_slice(&105u32.to_le_bytes());
        let err = replay(&other, &mut p, |_| Ok(()), None).unwrap_err();
        assert_eq!(
            err.to_string(),
            "link type 105 (IEEE802_11) is not supported: rdma-capture reads Ethernet (1), raw \
             IP (101, 228, 229) and Linux cooked captures (LINUX_SLL 113, LINUX_SLL2 276); \
             capture on the Ethernet interface or with `tcpdump -i any`"
        );
        let err = replay_stream(&other[..], &mut p, |_| Ok(()), None).unwrap_err();
        assert!(
            err.to_string().starts_with("link type 105 (IEEE802_11)"),
            "{err}"
        );
        assert!(replay(b"not a pcap", &mut p, |_| Ok(()), None).is_err());
        // Cut in the middle of the record: an error, after nothing was lost silently.
        let cut = &file[..file.len() - 3];
        assert!(replay(cut, &mut p, |_| Ok(()), None).is_err());
    }
}
