//! The ring-buffer record format written by `bpf/capture.bpf.c`, and clock conversion.

use roce::pcap::Timestamp;

use telemetry_ebpf::abi::{self, capture_header as off};

/// Largest snap length the BPF programs support (`SNAP` in `capture.bpf.c`).
pub const MAX_SNAPLEN: u32 = abi::SNAP;

/// Size of the record header before the frame bytes.
pub const RECORD_HEADER_LEN: usize = abi::CAPTURE_HEADER_LEN;

/// Where a packet was seen, and so where its bytes start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// XDP on the netdev: received from the wire. Bytes start at the Ethernet header.
    Ingress,
    /// TC egress on the netdev: sent to the wire. Bytes start at the Ethernet header.
    Egress,
    /// The rxe transmit probe: sent by an rxe device, looped back or not. Bytes start at the
    /// IP header.
    RxeSend,
    /// The rxe receive probe: received by an rxe device, from the wire or looped back. Bytes
    /// start at the IP header.
    RxeRecv,
    /// Read from an Ethernet pcap file (`-r`). Bytes start at the Ethernet header.
    File,
    /// Read from a raw-IP pcap file (`LINKTYPE_RAW`, `LINKTYPE_IPV4`, `LINKTYPE_IPV6`). Bytes
    /// start at the IP header.
    FileRaw,
    /// Read from a Linux cooked capture (`LINKTYPE_LINUX_SLL`, older `tcpdump -i any`). Bytes
    /// start at the 16-byte SLL header.
    FileSll,
    /// Read from a Linux cooked capture v2 (`LINKTYPE_LINUX_SLL2`, `tcpdump -i any` with
    /// libpcap 1.10 and later). Bytes start at the 20-byte SLL2 header.
    FileSll2,
}

impl Source {
    /// Short label used in text output: `in`, `out`, `rxe-tx`, `rxe-rx`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Ingress => "in",
            Source::Egress => "out",
            Source::RxeSend => "rxe-tx",
            Source::RxeRecv => "rxe-rx",
            Source::File | Source::FileRaw | Source::FileSll | Source::FileSll2 => "file",
        }
    }

    /// True when the record's bytes start at the IP header rather than at Ethernet.
    pub fn starts_at_ip(self) -> bool {
        matches!(self, Source::RxeSend | Source::RxeRecv | Source::FileRaw)
    }

    /// True for the rxe probes, which see packets before the IP layer finishes them.
    pub fn is_rxe_probe(self) -> bool {
        matches!(self, Source::RxeSend | Source::RxeRecv)
    }
}

/// One ring-buffer record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    /// Interface index.
    pub ifindex: u32,
    /// Hook that saw the frame.
    pub source: Source,
    /// Frame length on the wire.
    pub orig_len: u32,
    /// `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`).
    pub ktime_ns: u64,
    /// Captured bytes (at most the snap length).
    pub data: &'a [u8],
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// Parses a record; `None` when it is shorter than its header, names an unknown source, or its
/// lengths are inconsistent.
pub fn parse_record(b: &[u8]) -> Option<Record<'_>> {
    let ifindex = u32_at(b, off::IFINDEX)?;
    let source = match u32::from(*b.get(off::DIR)?) {
        abi::SOURCE_INGRESS => Source::Ingress,
        abi::SOURCE_EGRESS => Source::Egress,
        abi::SOURCE_RXE_SEND => Source::RxeSend,
        abi::SOURCE_RXE_RECV => Source::RxeRecv,
        _ => return None,
    };
    let orig_len = u32_at(b, off::ORIG_LEN)?;
    let cap_len = usize::try_from(u32_at(b, off::CAP_LEN)?).ok()?;
    let ktime_ns = u64::from_le_bytes(b.get(off::KTIME_NS..off::KTIME_NS + 8)?.try_into().ok()?);
    let data = b.get(RECORD_HEADER_LEN..RECORD_HEADER_LEN.checked_add(cap_len)?)?;
    Some(Record {
        ifindex,
        source,
        orig_len,
        ktime_ns,
        data,
    })
}

/// Converts `CLOCK_MONOTONIC` nanoseconds to wall-clock time, given the offset
/// `realtime - monotonic` in nanoseconds measured once at start.
pub fn wall_time(ktime_ns: u64, offset_ns: i128) -> Timestamp {
    let ns = i128::from(ktime_ns) + offset_ns;
    let ns = u128::try_from(ns.max(0)).unwrap_or(0);
    let secs = u64::try_from(ns / 1_000_000_000).unwrap_or(u64::MAX);
    let nanos = u32::try_from(ns % 1_000_000_000).unwrap_or(0);
    Timestamp::new(secs, nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_record() {
        let mut b = vec![0u8; RECORD_HEADER_LEN + 256];
        b[0..4].copy_from_slice(&7u32.to_le_bytes());
        b[4] = 1;
        b[8..12].copy_from_slice(&1078u32.to_le_bytes());
        b[12..16].copy_from_slice(&60u32.to_le_bytes());
        b[16..24].copy_from_slice(&5u64.to_le_bytes());
        let r = parse_record(&b).unwrap();
        assert_eq!(
            (r.ifindex, r.source, r.orig_len, r.ktime_ns, r.data.len()),
            (7, Source::Egress, 1078, 5, 60)
        );
        b[4] = 3;
        assert_eq!(parse_record(&b).map(|r| r.source), Some(Source::RxeRecv));
        b[4] = 9;
        assert!(parse_record(&b).is_none(), "unknown source byte");
        b[4] = 1;
        b[12..16].copy_from_slice(&1000u32.to_le_bytes());
        assert!(parse_record(&b).is_none());
        assert!(parse_record(&b[..10]).is_none());
    }

    #[test]
    fn converts_time() {
        let t = wall_time(1_500_000_000, 1_700_000_000_000_000_000);
        assert_eq!(t, Timestamp::new(1_700_000_001, 500_000_000));
    }
}
