//! What `rdma-capture` does with each captured record: decode, filter, follow, print, save.
//!
//! Everything here is independent of the kernel, so it is tested on the host with frames built
//! by hand; the binary only feeds it records from the ring buffer.

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::{self, Write as _};
use std::io::{self, Write};

use serde::Serialize;

use crate::filter::ClassFilter;
use crate::record::{Record, Source};
use roce::follow::{
    DirectionSummary, FlowKey, FollowConfig, Follower, PsnEvent, DEFAULT_MAX_FLOWS,
};
use roce::pcap::{self, LinkType, PcapWriter, Resolution, Timestamp};
use roce::sll::{ethernet_for_cooked, SllVersion};
use roce::stats::Stats;
use roce::{internet_checksum, render, DecodeError, Packet};

/// How packets are printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    /// One line per packet ([`render::line`]), as tcpdump prints them.
    #[default]
    Text,
    /// Every header on a line of its own ([`render::text`]): `rdma-capture -v`.
    Verbose,
    /// One JSON object per line.
    Json,
    /// Nothing per packet; only the summary.
    Quiet,
}

/// Settings of a [`Processor`].
#[derive(Clone, Debug)]
pub struct ProcessorConfig {
    /// Show only this QP's traffic: packets to it and its peer's packets back, paired by PSN
    /// (a response in one direction answering a request in the other). The peer's packets
    /// that come before the first pairing response are held back and shown when it arrives;
    /// a file is scanned once beforehand instead ([`Processor::learn_flows`]), so its output
    /// keeps the file's order.
    pub qpn: Option<u32>,
    /// Show only these opcode classes.
    pub classes: ClassFilter,
    /// Path MTU, so the follower knows how many PSNs an RDMA READ reserves.
    pub path_mtu: Option<u32>,
    /// Per-packet output.
    pub output: Output,
    /// With text output: follow each packet with a hex dump of its captured bytes
    /// (`rdma-capture -x`).
    pub hex: bool,
    /// The most PSN flows followed at once ([`FollowConfig::max_flows`]); the summary counts
    /// the ones forgotten beyond it.
    pub max_flows: usize,
}

impl Default for ProcessorConfig {
    fn default() -> Self {
        ProcessorConfig {
            qpn: None,
            classes: ClassFilter::default(),
            path_mtu: None,
            output: Output::default(),
            hex: false,
            max_flows: DEFAULT_MAX_FLOWS,
        }
    }
}

impl ProcessorConfig {
    /// The follower's settings.
    fn follow(&self) -> FollowConfig {
        FollowConfig {
            qpn: self.qpn,
            path_mtu: self.path_mtu,
            max_flows: self.max_flows,
        }
    }
}

/// Kernel-side counters, read from the BPF programs' per-CPU map at the end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KernelCounters {
    /// Packets the hooks looked at.
    pub inspected: u64,
    /// Packets that matched (RoCEv2, right device).
    pub matched: u64,
    /// Records lost because the ring buffer was full.
    pub dropped: u64,
}

/// Decodes records one by one and keeps what the summary needs.
///
/// ```
/// use rdma_capture::processor::{Output, Processor, ProcessorConfig};
/// use rdma_capture::record::{Record, Source};
/// use roce::pcap::Timestamp;
/// # let frame = roce::doc_example_frame();
///
/// let config = ProcessorConfig { output: Output::Json, ..ProcessorConfig::default() };
/// let mut p = Processor::new(config, None::<Vec<u8>>, 2048)?;
/// let record = Record {
///     ifindex: 2,
///     source: Source::Ingress,
///     orig_len: frame.len() as u32,
///     ktime_ns: 0,
///     data: &frame,
/// };
/// let lines = p.process(&record, Timestamp::new(1_700_000_000, 0))?;
/// assert!(lines[0].contains("\"RC Acknowledge\""));
/// assert_eq!(p.summary(Default::default()).stats.bad_icrc, 0);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Processor<W: Write> {
    config: ProcessorConfig,
    follower: Follower,
    stats: Stats,
    by_source: BTreeMap<Source, u64>,
    records: u64,
    shown: u64,
    ip_checksums_filled: u64,
    pcap: Option<PcapWriter<W>>,
    /// With a QPN filter: recent packets of flows not (yet) known to be the followed QP's.
    held: VecDeque<HeldPacket>,
    /// False once [`Processor::learn_flows`] has found every followed flow in advance: then
    /// no later response can pair another, and holding packets would be wasted copies.
    hold_unpaired: bool,
}

/// How many packets of unpaired flows a live capture keeps while it waits for a response that
/// pairs the peer's direction with the followed QP. Pairing normally happens within a round
/// trip; more than this many unrelated packets before it loses the oldest.
const HELD_MAX: usize = 1024;

/// A packet held back until its flow is paired with the followed QP.
#[derive(Debug)]
struct HeldPacket {
    flow: FlowKey,
    source: Source,
    ts: Timestamp,
    frame: Vec<u8>,
    orig_len: usize,
    event: PsnEvent,
}

impl<W: Write> Processor<W> {
    /// A processor writing the packets it shows to `pcap`, if given, as an Ethernet pcap with
    /// nanosecond timestamps. `snaplen` is the capture's snap length.
    pub fn new(config: ProcessorConfig, pcap: Option<W>, snaplen: u32) -> io::Result<Self> {
        // rxe records start at the IP header and get a 14-byte Ethernet header prepended.
        let file_snaplen = snaplen.saturating_add(14);
        let pcap = pcap
            .map(|w| PcapWriter::new(w, LinkType::Ethernet, file_snaplen, Resolution::Nanos))
            .transpose()?;
        Ok(Processor {
            follower: Follower::new(config.follow()),
            hold_unpaired: config.qpn.is_some(),
            config,
            stats: Stats::default(),
            by_source: BTreeMap::new(),
            records: 0,
            shown: 0,
            ip_checksums_filled: 0,
            pcap,
            held: VecDeque::new(),
        })
    }

    /// Handles one record. Returns the lines to print: none if the packet is not shown or
    /// output is quiet, and more than one when a QP is followed and this packet paired the
    /// peer's direction, whose earlier packets were held back until then (see
    /// [`ProcessorConfig::qpn`]). Packets that are shown are also written to the pcap file.
    pub fn process(&mut self, record: &Record<'_>, ts: Timestamp) -> io::Result<Vec<String>> {
        self.records += 1;
        *self.by_source.entry(record.source).or_default() += 1;
        let (frame, orig_len, filled) = as_ethernet(record);
        if filled {
            self.ip_checksums_filled += 1;
        }
        let result = decode(record.source, &frame, orig_len);
        self.stats.record(&result, orig_len);

        let packet = match result {
            Ok(packet) => packet,
            Err(e) => {
                // A frame that does not decode cannot be matched to a QP or class; show it
                // only when nothing is filtered, so filtered output stays about the QP asked for.
                if self.config.qpn.is_some() || !self.config.classes.classes().is_empty() {
                    return Ok(Vec::new());
                }
                self.save(record.source, ts, &frame, orig_len)?;
                self.shown += 1;
                let line = match self.config.output {
                    Output::Quiet => None,
                    Output::Text | Output::Verbose => {
                        let mut line = format!(
                            "{} decode error ({} bytes): {e}",
                            record.source.as_str(),
                            frame.len()
                        );
                        self.append_hex(&mut line, &frame);
                        Some(line)
                    }
                    Output::Json => Some(render::json_error(&e, frame.len(), Some(ts))),
                };
                return Ok(line.into_iter().collect());
            }
        };

        let observation = self.follower.observe(&packet);
        let mut lines = self.release_held()?;
        if !self.config.classes.matches(&packet) {
            return Ok(lines);
        }
        if observation.followed {
            lines.extend(self.show(
                record.source,
                ts,
                &frame,
                orig_len,
                &packet,
                observation.event,
            )?);
        } else if self.hold_unpaired {
            self.hold(HeldPacket {
                flow: observation.flow,
                source: record.source,
                ts,
                frame: frame.into_owned(),
                orig_len,
                event: observation.event,
            });
        }
        Ok(lines)
    }

    /// Shows the held packets of the flows the follower has just started following, oldest
    /// first.
    fn release_held(&mut self) -> io::Result<Vec<String>> {
        let flows = self.follower.take_newly_followed();
        if flows.is_empty() || self.held.is_empty() {
            return Ok(Vec::new());
        }
        let (release, keep): (VecDeque<HeldPacket>, VecDeque<HeldPacket>) =
            std::mem::take(&mut self.held)
                .into_iter()
                .partition(|h| flows.contains(&h.flow));
        self.held = keep;
        let mut lines = Vec::new();
        for h in release {
            // It decoded when it was held, and its bytes have not changed since.
            if let Ok(packet) = decode(h.source, &h.frame, h.orig_len) {
                lines.extend(self.show(h.source, h.ts, &h.frame, h.orig_len, &packet, h.event)?);
            }
        }
        Ok(lines)
    }

    /// Keeps a packet of an unfollowed flow in case a later response pairs the flow with the
    /// followed QP; the oldest goes when the buffer is full.
    fn hold(&mut self, packet: HeldPacket) {
        if self.held.len() == HELD_MAX {
            self.held.pop_front();
        }
        self.held.push_back(packet);
    }

    /// Counts, saves and renders one packet that passed the filters.
    fn show(
        &mut self,
        source: Source,
        ts: Timestamp,
        frame: &[u8],
        orig_len: usize,
        packet: &roce::Packet<'_>,
        event: PsnEvent,
    ) -> io::Result<Option<String>> {
        self.save(source, ts, frame, orig_len)?;
        self.shown += 1;
        let psn_note = self.config.qpn.map(|_| event);
        Ok(match self.config.output {
            Output::Quiet => None,
            Output::Text => {
                let mut line = format!("{} {}", source.as_str(), render::line(packet, Some(ts)));
                if let Some(event) = psn_note {
                    let _ = write!(line, " [PSN {}]", describe(event));
                }
                self.append_hex(&mut line, frame);
                Some(line)
            }
            Output::Verbose => {
                let mut line = format!("{} {}", source.as_str(), render::text(packet, Some(ts)));
                if let Some(event) = psn_note {
                    let _ = write!(line, "\n  PSN  {}", describe(event));
                }
                self.append_hex(&mut line, frame);
                Some(line)
            }
            Output::Json => {
                let mut line = render::json(packet, Some(ts));
                // Add the capture point (and the PSN verdict when following a QP) to the
                // packet's object without re-serializing it.
                if line.ends_with('}') {
                    line.pop();
                    let _ = write!(line, ",\"source\":\"{}\"", source.as_str());
                    if let Some(event) = psn_note {
                        let event = serde_json::to_string(&event).unwrap_or_default();
                        let _ = write!(line, ",\"psn_event\":{event}");
                    }
                    line.push('}');
                }
                Some(line)
            }
        })
    }

    /// Learns, from the whole of a capture known in advance, which flows belong to the
    /// followed QP, so that [`Processor::process`] shows them from their first packet and in
    /// order, instead of holding back the peer's packets until a response pairs them. Without
    /// a QPN filter there is nothing to learn. Stops at the first record that is an error; the
    /// real pass reports it.
    pub fn learn_flows<'a, E>(&mut self, records: impl IntoIterator<Item = Result<Record<'a>, E>>) {
        if self.config.qpn.is_none() {
            return;
        }
        // Bounded like the real pass: the file can hold as many flows as the wire.
        let mut scout = Follower::new(self.config.follow());
        for record in records {
            let Ok(record) = record else { break };
            let (frame, orig_len, _) = as_ethernet(&record);
            if let Ok(packet) = decode(record.source, &frame, orig_len) {
                scout.observe(&packet);
            }
        }
        self.follower.follow(scout.followed());
        self.hold_unpaired = false;
    }

    /// Packets that passed the filters so far.
    pub fn shown(&self) -> u64 {
        self.shown
    }

    /// The summary so far.
    pub fn summary(&self, kernel: KernelCounters) -> Summary {
        Summary {
            records: self.records,
            shown: self.shown,
            by_source: self
                .by_source
                .iter()
                .map(|(s, n)| (s.as_str(), *n))
                .collect(),
            ip_checksums_filled: self.ip_checksums_filled,
            stats: self.stats.clone(),
            kernel,
            flows_kept: self.follower.flows(),
            flows_evicted: self.follower.evicted(),
            max_flows: self.follower.config().max_flows,
            flows: self
                .follower
                .summaries()
                .map(|(key, summary)| FlowSummary {
                    flow: *key,
                    summary: *summary,
                })
                .collect(),
        }
    }

    /// Flushes and closes the pcap file, returning its writer.
    pub fn finish(self) -> io::Result<Option<W>> {
        self.pcap.map(PcapWriter::into_inner).transpose()
    }

    /// With `-x`, a hex dump of the captured bytes on the lines after the packet's.
    fn append_hex(&self, line: &mut String, frame: &[u8]) {
        if self.config.hex && !frame.is_empty() {
            line.push('\n');
            line.push_str(&render::hex_dump(frame, 2));
        }
    }

    /// Writes a shown packet to the pcap file, which is always Ethernet: a cooked capture's
    /// header becomes an Ethernet header (see [`roce::sll::ethernet_for_cooked`]).
    fn save(
        &mut self,
        source: Source,
        ts: Timestamp,
        frame: &[u8],
        orig_len: usize,
    ) -> io::Result<()> {
        let Some(w) = self.pcap.as_mut() else {
            return Ok(());
        };
        let version = match source {
            Source::FileSll => SllVersion::V1,
            Source::FileSll2 => SllVersion::V2,
            _ => return w.write_packet(ts, frame, orig_len),
        };
        match ethernet_for_cooked(frame, version) {
            Some(eth) => {
                let orig_len = (orig_len + 14).saturating_sub(version.header_len());
                w.write_packet(ts, &eth, orig_len)
            }
            // Shorter than its cooked header: kept as it came, like any undecodable frame.
            None => w.write_packet(ts, frame, orig_len),
        }
    }
}

/// Decodes a record's bytes (after [`as_ethernet`]) by what they start with.
fn decode(source: Source, frame: &[u8], orig_len: usize) -> Result<Packet<'_>, DecodeError> {
    match source {
        Source::FileSll => roce::decode_sll_snapped(frame, orig_len, SllVersion::V1),
        Source::FileSll2 => roce::decode_sll_snapped(frame, orig_len, SllVersion::V2),
        _ => roce::decode_ethernet_snapped(frame, orig_len),
    }
}

/// The record as an Ethernet frame, its length on the wire, and whether an IPv4 checksum was
/// filled in.
///
/// rxe probe records start at the IP header: they get a synthetic Ethernet header (zero MACs)
/// so one pcap holds both kinds. The probes also see packets before `ip_local_out` computes the
/// IPv4 header checksum (looped-back packets never get one), so a zero checksum is filled in
/// with the value the kernel would write; a non-zero wrong one is kept and counted as bad.
/// Packets read from a file are never changed.
fn as_ethernet<'a>(record: &Record<'a>) -> (Cow<'a, [u8]>, usize, bool) {
    let orig_len = usize::try_from(record.orig_len).unwrap_or(usize::MAX);
    if !record.source.starts_at_ip() {
        return (Cow::Borrowed(record.data), orig_len, false);
    }
    let Some(mut frame) = pcap::ethernet_for_ip(record.data) else {
        return (Cow::Borrowed(record.data), orig_len, false);
    };
    let filled = record.source.is_rxe_probe() && fill_ipv4_checksum(&mut frame[14..]);
    (Cow::Owned(frame), orig_len.saturating_add(14), filled)
}

/// Writes the header checksum of an IPv4 header whose checksum field is zero; true if it did.
fn fill_ipv4_checksum(ip: &mut [u8]) -> bool {
    let Some(&first) = ip.first() else {
        return false;
    };
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < 20 || ip.len() < ihl || ip[10..12] != [0, 0] {
        return false;
    }
    let sum = internet_checksum(&ip[..ihl]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    true
}

fn describe(event: PsnEvent) -> String {
    match event {
        PsnEvent::First => "first of this direction".into(),
        PsnEvent::InOrder => "in order".into(),
        PsnEvent::Gap { expected, missing } => {
            format!("GAP: expected up to {expected:#08x}, at least {missing} missing")
        }
        PsnEvent::Coalesced { skipped } => format!("coalesced ACK ({skipped} PSNs implied)"),
        PsnEvent::Duplicate => "DUPLICATE".into(),
        PsnEvent::Retransmission { highest } => {
            format!("RETRANSMISSION (highest seen {highest:#08x})")
        }
    }
}

/// One followed PSN sequence (a direction's requests or its responses) in the summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FlowSummary {
    /// Addresses and destination QP.
    pub flow: FlowKey,
    /// Its PSN history.
    pub summary: DirectionSummary,
}

/// What a capture saw, printed when it ends.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Records read from the ring buffer.
    pub records: u64,
    /// Packets that passed the filters (printed and saved).
    pub shown: u64,
    /// Records per capture point (`in`, `out`, `rxe-tx`, `rxe-rx`).
    pub by_source: BTreeMap<&'static str, u64>,
    /// IPv4 checksums filled in for rxe probe records (see [`Processor::process`]).
    pub ip_checksums_filled: u64,
    /// Per-opcode counts, bad ICRCs, decode errors.
    pub stats: Stats,
    /// The kernel side's counters, including drops.
    pub kernel: KernelCounters,
    /// Flows (followed or not) the PSN follower holds at the end.
    pub flows_kept: usize,
    /// Flows the PSN follower forgot to stay within `max_flows`; their PSN history is lost
    /// (a flow seen again starts afresh).
    pub flows_evicted: u64,
    /// The bound on flows held (`--max-flows`).
    pub max_flows: usize,
    /// Every followed PSN sequence (every flow without `--qpn`).
    pub flows: Vec<FlowSummary>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.stats)?;
        let sources: Vec<String> = self
            .by_source
            .iter()
            .map(|(s, n)| format!("{s} {n}"))
            .collect();
        writeln!(
            f,
            "records {} ({}), shown {}",
            self.records,
            if sources.is_empty() {
                "none".to_owned()
            } else {
                sources.join(", ")
            },
            self.shown
        )?;
        write!(
            f,
            "kernel: inspected {}, matched {}, dropped (ring buffer full) {}",
            self.kernel.inspected, self.kernel.matched, self.kernel.dropped
        )?;
        write!(
            f,
            "\nflows: {} kept, {} evicted (--max-flows {})",
            self.flows_kept, self.flows_evicted, self.max_flows
        )?;
        for flow in &self.flows {
            let s = &flow.summary;
            let addr = |a: Option<std::net::SocketAddr>| {
                a.map_or_else(|| "?".to_owned(), |a| a.to_string())
            };
            write!(
                f,
                "\n  {} -> {} QP {:#x} {}: PSN {:#08x}..{:#08x}, {} packets, gaps {} ({} missing), duplicates {}, retransmissions {}, NAKs {}, RNR NAKs {}",
                addr(flow.flow.src),
                addr(flow.flow.dst),
                flow.flow.dest_qp,
                flow.flow.stream.as_str(),
                s.first_psn,
                s.last_psn,
                s.packets,
                s.gaps,
                s.missing,
                s.duplicates,
                s.retransmissions,
                s.naks,
                s.rnr_naks
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce::pcap;

    fn ack_frame() -> Vec<u8> {
        roce::doc_example_frame()
    }

    fn record(data: &[u8], source: Source) -> Record<'_> {
        Record {
            ifindex: 1,
            source,
            orig_len: u32::try_from(data.len()).unwrap(),
            ktime_ns: 0,
            data,
        }
    }

    fn ts() -> Timestamp {
        Timestamp::new(1_700_000_000, 1)
    }

    #[test]
    fn rxe_records_get_ethernet_and_a_filled_checksum_and_land_in_the_pcap() {
        let frame = ack_frame();
        let mut ip = frame[14..].to_vec();
        ip[10..12].copy_from_slice(&[0, 0]); // as the transmit probe sees it
        let mut p = Processor::new(ProcessorConfig::default(), Some(Vec::new()), 2048).unwrap();
        let lines = p.process(&record(&ip, Source::RxeSend), ts()).unwrap();
        let line = &lines[0];
        assert!(line.starts_with("rxe-tx "), "{line}");
        let summary = p.summary(KernelCounters::default());
        assert_eq!(summary.ip_checksums_filled, 1);
        assert_eq!(summary.stats.bad_ip_checksum, 0);
        assert_eq!(
            summary.stats.bad_icrc, 0,
            "ICRC does not cover the IP checksum"
        );
        let file = p.finish().unwrap().unwrap();
        let (header, records) = pcap::read(&file).unwrap();
        assert_eq!(header.link, LinkType::Ethernet);
        let records: Vec<_> = records.collect::<Result<_, _>>().unwrap();
        assert_eq!(records.len(), 1);
        // The original frame had zero MACs too, so the saved frame equals it byte for byte.
        assert_eq!(&records[0].data[14..], &frame[14..]);
        assert_eq!(records[0].orig_len as usize, frame.len());
    }

    #[test]
    fn class_filter_hides_and_does_not_save() {
        let frame = ack_frame();
        let config = ProcessorConfig {
            classes: ClassFilter::parse("send").unwrap(),
            ..ProcessorConfig::default()
        };
        let mut p = Processor::new(config, Some(Vec::new()), 2048).unwrap();
        assert_eq!(
            p.process(&record(&frame, Source::Ingress), ts()).unwrap(),
            Vec::<String>::new()
        );
        let s = p.summary(KernelCounters::default());
        assert_eq!((s.records, s.shown), (1, 0));
        assert_eq!(
            s.stats.by_opcode["RC Acknowledge"].packets, 1,
            "stats see all"
        );
        let file = p.finish().unwrap().unwrap();
        assert_eq!(pcap::read(&file).unwrap().1.count(), 0);
    }

    #[test]
    fn qpn_filter_follows_and_reports_duplicates_in_json() {
        let frame = ack_frame();
        let qpn = roce::decode_ethernet(&frame).unwrap().bth.dest_qp;
        let config = ProcessorConfig {
            qpn: Some(qpn),
            output: Output::Json,
            ..ProcessorConfig::default()
        };
        let mut p = Processor::new(config.clone(), None::<Vec<u8>>, 2048).unwrap();
        let first = p
            .process(&record(&frame, Source::Egress), ts())
            .unwrap()
            .remove(0);
        let v: serde_json::Value = serde_json::from_str(&first).unwrap();
        assert_eq!(v["psn_event"]["event"], "first");
        assert_eq!(v["source"], "out");
        let second = p
            .process(&record(&frame, Source::Egress), ts())
            .unwrap()
            .remove(0);
        let v: serde_json::Value = serde_json::from_str(&second).unwrap();
        assert_eq!(v["psn_event"]["event"], "duplicate");
        let s = p.summary(KernelCounters::default());
        assert_eq!(s.flows.len(), 1);
        assert_eq!(
            (s.flows[0].summary.packets, s.flows[0].summary.duplicates),
            (2, 1)
        );
        assert!(s.to_string().contains("duplicates 1"), "{s}");

        // Another QP is not shown.
        let mut p = Processor::new(
            ProcessorConfig {
                qpn: Some(qpn ^ 1),
                ..config
            },
            None::<Vec<u8>>,
            2048,
        )
        .unwrap();
        assert_eq!(
            p.process(&record(&frame, Source::Egress), ts()).unwrap(),
            Vec::<String>::new()
        );
    }

    #[test]
    fn garbage_is_reported_not_panicked_on() {
        let mut p = Processor::new(ProcessorConfig::default(), None::<Vec<u8>>, 2048).unwrap();
        for len in [0usize, 1, 13, 14, 40, 60] {
            let junk = vec![0xa5u8; len];
            for source in [Source::Ingress, Source::RxeRecv] {
                let line = p.process(&record(&junk, source), ts()).unwrap();
                assert!(
                    line.len() == 1 && line[0].contains("decode error"),
                    "{line:?}"
                );
            }
        }
        let s = p.summary(KernelCounters::default());
        assert_eq!(s.stats.decode_errors, 12);
    }

    #[test]
    fn fills_only_zero_ipv4_checksums() {
        let frame = ack_frame();
        let mut ip = frame[14..].to_vec();
        assert!(!fill_ipv4_checksum(&mut ip), "already set");
        let good = [ip[10], ip[11]];
        ip[10..12].copy_from_slice(&[0, 0]);
        assert!(fill_ipv4_checksum(&mut ip));
        assert_eq!([ip[10], ip[11]], good);
        assert!(
            !fill_ipv4_checksum(&mut [0x60; 40]),
            "IPv6 has no header checksum"
        );
        assert!(!fill_ipv4_checksum(&mut [0x45; 10]), "short");
    }
}
