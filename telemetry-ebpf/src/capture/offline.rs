//! Decoding a capture file instead of live traffic (`rdma-capture -r FILE`): classic pcap or
//! pcapng, Ethernet or raw IP.
//!
//! Needs no privileges and no kernel support, so a capture taken elsewhere (tcpdump on a
//! ConnectX port, or `rdma-capture -w`) gets the same decoding, filters and QP following.

use std::io::{self, Write};

use super::processor::Processor;
use super::record::{Record, Source};
use roce::pcap::{self, LinkType, PcapError};

/// Why a file could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The file is not a pcap or pcapng file, or is cut short.
    #[error("{0}")]
    Pcap(#[from] PcapError),
    /// The file's link type holds neither Ethernet nor raw IP.
    #[error("link type {0} is not supported (Ethernet and raw IP are)")]
    LinkType(u32),
    /// Writing output or the new pcap file failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Feeds every record of `file` to `processor`, handing each line it returns to `emit`, and
/// stops after `limit` shown packets if given. Returns the number of records read.
///
/// ```
/// use telemetry_ebpf::capture::offline::replay;
/// use telemetry_ebpf::capture::processor::{Output, Processor, ProcessorConfig};
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

/// Where a file's records start: Ethernet or IP; other link types are not decoded.
fn source_of(link: LinkType) -> Result<Source, OfflineError> {
    match link {
        LinkType::Ethernet => Ok(Source::File),
        LinkType::Raw => Ok(Source::FileRaw),
        LinkType::Other(code) => Err(OfflineError::LinkType(code)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::processor::{KernelCounters, ProcessorConfig};
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
            "link type 105 is not supported (Ethernet and raw IP are)"
        );
        assert!(replay(b"not a pcap", &mut p, |_| Ok(()), None).is_err());
        // Cut in the middle of the record: an error, after nothing was lost silently.
        let cut = &file[..file.len() - 3];
        assert!(replay(cut, &mut p, |_| Ok(()), None).is_err());
    }
}
