//! A running summary of a capture: packets and bytes per opcode, bad ICRCs, decode errors.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use crate::error::DecodeError;
use crate::ext::AethSyndrome;
use crate::ip::Ecn;
use crate::packet::{IcrcCheck, Packet};

/// Packets and bytes of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Count {
    /// Packets.
    pub packets: u64,
    /// Bytes on the wire (as the caller measured them).
    pub bytes: u64,
}

impl Count {
    fn add(&mut self, bytes: usize) {
        self.packets += 1;
        self.bytes += u64::try_from(bytes).unwrap_or(u64::MAX);
    }
}

/// Counters over every frame seen, decoded or not.
///
/// ```
/// use roce::{decode_ethernet, stats::Stats};
/// # let frame = roce::doc_example_frame();
///
/// let mut stats = Stats::default();
/// stats.record(&decode_ethernet(&frame), frame.len());
/// stats.record(&decode_ethernet(&frame[..20]), 20);
/// assert_eq!(stats.by_opcode["RC Acknowledge"].packets, 1);
/// assert_eq!((stats.total.packets, stats.decode_errors), (2, 1));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Every frame recorded.
    pub total: Count,
    /// Decoded RoCEv2 packets per opcode name.
    pub by_opcode: BTreeMap<&'static str, Count>,
    /// Packets whose ICRC did not verify.
    pub bad_icrc: u64,
    /// Packets whose ICRC could not be checked (no IP header, or truncated).
    pub icrc_unchecked: u64,
    /// Packets cut by the snap length.
    pub truncated: u64,
    /// IPv4 headers whose checksum did not verify.
    pub bad_ip_checksum: u64,
    /// Packets whose IP ECN field was CE (congestion experienced).
    pub ecn_ce: u64,
    /// ACK packets whose AETH was a NAK.
    pub naks: u64,
    /// ACK packets whose AETH was an RNR NAK.
    pub rnr_naks: u64,
    /// Frames that did not decode.
    pub decode_errors: u64,
    /// Decode errors per [`DecodeError::kind`].
    pub errors_by_kind: BTreeMap<&'static str, u64>,
}

impl Stats {
    /// Records a decoding result; `wire_len` is the frame's length on the wire.
    pub fn record(&mut self, result: &Result<Packet<'_>, DecodeError>, wire_len: usize) {
        match result {
            Ok(p) => self.record_packet(p, wire_len),
            Err(e) => self.record_error(e, wire_len),
        }
    }

    /// Records a decoded packet.
    pub fn record_packet(&mut self, p: &Packet<'_>, wire_len: usize) {
        self.total.add(wire_len);
        self.by_opcode
            .entry(p.opcode().name())
            .or_default()
            .add(wire_len);
        match p.icrc_check {
            IcrcCheck::Valid => {}
            IcrcCheck::Invalid { .. } => self.bad_icrc += 1,
            IcrcCheck::NoIpHeader | IcrcCheck::Truncated => self.icrc_unchecked += 1,
        }
        self.truncated += u64::from(p.truncated);
        if let Some(crate::IpHeader::V4(h)) = p.ip {
            self.bad_ip_checksum += u64::from(!h.checksum_ok);
        }
        self.ecn_ce += u64::from(p.ip.is_some_and(|ip| ip.ecn() == Ecn::Ce));
        match p.ext.aeth.map(|a| a.syndrome) {
            Some(AethSyndrome::Nak(_)) => self.naks += 1,
            Some(AethSyndrome::RnrNak { .. }) => self.rnr_naks += 1,
            _ => {}
        }
    }

    /// Records a frame that did not decode.
    pub fn record_error(&mut self, e: &DecodeError, wire_len: usize) {
        self.total.add(wire_len);
        self.decode_errors += 1;
        *self.errors_by_kind.entry(e.kind()).or_default() += 1;
    }
}

impl fmt::Display for Stats {
    /// A multi-line summary, opcodes sorted by name.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} frames, {} bytes",
            self.total.packets, self.total.bytes
        )?;
        for (name, c) in &self.by_opcode {
            writeln!(
                f,
                "  {name:<40} {:>10} pkts {:>14} bytes",
                c.packets, c.bytes
            )?;
        }
        write!(
            f,
            "bad ICRC {}, ICRC unchecked {}, truncated {}, bad IPv4 checksum {}, ECN CE {}, NAK {}, RNR NAK {}, decode errors {}",
            self.bad_icrc,
            self.icrc_unchecked,
            self.truncated,
            self.bad_ip_checksum,
            self.ecn_ce,
            self.naks,
            self.rnr_naks,
            self.decode_errors
        )?;
        for (kind, n) in &self.errors_by_kind {
            write!(f, "\n  {kind:<40} {n:>10}")?;
        }
        Ok(())
    }
}
