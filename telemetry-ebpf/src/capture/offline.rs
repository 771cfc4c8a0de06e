//! Decoding a pcap file instead of live traffic (`rdma-capture -r FILE`).
//!
//! Needs no privileges and no kernel support, so a capture taken elsewhere (tcpdump on a
//! ConnectX port, or `rdma-capture -w`) gets the same decoding, filters and QP following.

use std::io::{self, Write};

use super::processor::Processor;
use super::record::{Record, Source};
use crate::decode::pcap::{self, LinkType, PcapError};

/// Why a file could not be replayed.
#[derive(Debug, thiserror::Error)]
pub enum OfflineError {
    /// The file is not a pcap file, or is cut short.
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
/// use telemetry_ebpf::decode::pcap::{LinkType, PcapWriter, Resolution, Timestamp};
/// # let frame = telemetry_ebpf::decode::doc_example_frame();
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
    let source = match header.link {
        LinkType::Ethernet => Source::File,
        LinkType::Raw => Source::FileRaw,
        LinkType::Other(code) => return Err(OfflineError::LinkType(code)),
    };
    // A file is known in advance: learn which flows belong to a followed QP first, so the
    // peer's packets show in file order from the first one.
    let as_live = |record: pcap::Record<'a>| Record {
        ifindex: 0,
        source,
        orig_len: record.orig_len,
        ktime_ns: 0,
        data: record.data,
    };
    processor.learn_flows(records.clone().map(|r| r.map(as_live)));
    let mut read = 0;
    for record in records {
        if limit.is_some_and(|l| processor.shown() >= l) {
            break;
        }
        let record = record?;
        read += 1;
        let ts = record.ts;
        for line in processor.process(&as_live(record), ts)? {
            emit(line)?;
        }
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::processor::{KernelCounters, ProcessorConfig};
    use crate::decode::pcap::{PcapWriter, Resolution, Timestamp};

    #[test]
    fn raw_ip_files_decode_and_other_link_types_are_refused() {
        let frame = crate::decode::doc_example_frame();
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
