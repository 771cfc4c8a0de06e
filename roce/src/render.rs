//! Human-readable text and JSON lines for decoded packets.
//!
//! [`line`] is one line per packet, as tcpdump prints them by default: timestamp, addresses,
//! opcode, destination QP, PSN, the extension headers' fields, payload length and the ICRC
//! verdict:
//!
//! ```text
//! 1700000000.000000001 10.77.0.2:49152 -> 10.77.0.1:4791 RC RDMA WRITE Only dqpn=0x000011 psn=0x83f247 RETH va=0x00007f0000001000 rkey=0x00001234 len=1024 data=1024 icrc=ok
//! ```
//!
//! [`text`] is that summary line (without the per-packet fields) followed by one indented line
//! per header in wire order, a hex + ASCII preview of the first 32 payload bytes and the ICRC
//! verdict:
//!
//! ```text
//! 1700000000.000000001 10.77.0.2:49152 -> 10.77.0.1:4791 RC RDMA WRITE Only
//!   ETH  02:00:00:00:00:02 -> 02:00:00:00:00:01 type=0x0800
//!   IPv4 10.77.0.2 -> 10.77.0.1 dscp=26 ecn=ECT(0) ttl=64 id=0x1234 len=1084 df=1 csum=0x0f77 ok
//!   UDP  49152 -> 4791 len=1064 csum=0x0000
//!   BTH  opcode=0x0a (RC RDMA WRITE Only) se=0 m=0 pad=0 tver=0 pkey=0xffff fecn=0 becn=0 dqpn=0x000011 a=1 psn=0x83f247
//!   RETH va=0x00007f0000001000 rkey=0x00001234 len=1024
//!   DATA len=1024
//!        0000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f  |................|
//!        0010  10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f  |................|
//!        ... 992 more bytes
//!   ICRC 0x538a6a7a ok
//! ```
//!
//! JSON is one object per packet and line: the [`Packet`] fields, plus `ts` when a timestamp is
//! given. Keys, addresses and CRCs are `"0x…"` strings, counters and sequence numbers numbers.

use std::fmt::Write as _;

use serde::Serialize;

use crate::error::DecodeError;
use crate::ext::ExtHeaders;
use crate::ip::IpHeader;
use crate::opcode::{ExtHeaderKind, Opcode};
use crate::packet::{IcrcCheck, Packet};
use crate::timestamp::Timestamp;

/// Payload bytes shown in the text preview.
pub const PREVIEW_BYTES: usize = 32;

/// Renders a packet as one line (no trailing newline); see the module documentation.
///
/// ```
/// # let frame = roce::doc_example_frame();
/// let pkt = roce::decode_ethernet(&frame)?;
/// assert_eq!(
///     roce::render::line(&pkt, None),
///     "10.77.0.1:49153 -> 10.77.0.2:4791 RC Acknowledge dqpn=0x000011 psn=0x83f247 \
///      AETH syndrome=ACK credits=31 msn=5 icrc=ok"
/// );
/// # Ok::<(), roce::DecodeError>(())
/// ```
pub fn line(p: &Packet<'_>, ts: Option<Timestamp>) -> String {
    let mut s = String::with_capacity(160);
    // Writing to a String cannot fail; the results are ignored rather than unwrapped.
    let _ = write_line(&mut s, p, ts);
    s
}

fn write_line(s: &mut String, p: &Packet<'_>, ts: Option<Timestamp>) -> std::fmt::Result {
    write_summary(s, p, ts)?;
    write!(s, " dqpn=0x{:06x} psn=0x{:06x}", p.bth.dest_qp, p.bth.psn)?;
    for &kind in p.opcode().ext_headers() {
        s.push(' ');
        write_ext(s, kind, &p.ext)?;
    }
    if p.opcode().has_payload() && p.opcode() != Opcode::CNP {
        write!(s, " data={}", p.payload_len)?;
        if p.truncated {
            write!(s, " captured={}", p.payload.len())?;
        }
    }
    s.push_str(" icrc=");
    s.push_str(match p.icrc_check {
        IcrcCheck::Valid => "ok",
        IcrcCheck::Invalid { .. } => "BAD",
        IcrcCheck::NoIpHeader => "unchecked",
        IcrcCheck::Truncated => "cut",
    });
    Ok(())
}

/// `[timestamp] src -> dst opcode`, the start of both forms.
fn write_summary(s: &mut String, p: &Packet<'_>, ts: Option<Timestamp>) -> std::fmt::Result {
    if let Some(ts) = ts {
        write!(s, "{ts} ")?;
    }
    match (p.src(), p.dst()) {
        (Some(src), Some(dst)) => write!(s, "{src} -> {dst} ")?,
        _ => s.push_str("(UDP payload only) "),
    }
    s.push_str(p.opcode().name());
    Ok(())
}

/// A hex and ASCII dump of `bytes`, 16 a line, each line indented by `indent` spaces and
/// starting with its offset (no trailing newline): what `rdma-capture -x` prints.
///
/// ```
/// let dump = roce::render::hex_dump(b"RoCEv2 over UDP, port 4791", 2);
/// assert_eq!(
///     dump,
///     "  0000  52 6f 43 45 76 32 20 6f 76 65 72 20 55 44 50 2c  |RoCEv2 over UDP,|\n\
///      \x20 0010  20 70 6f 72 74 20 34 37 39 31                    | port 4791|"
/// );
/// ```
pub fn hex_dump(bytes: &[u8], indent: usize) -> String {
    let mut s = String::with_capacity(bytes.len() * 5);
    for (i, line) in bytes.chunks(16).enumerate() {
        if i > 0 {
            s.push('\n');
        }
        let _ = write_hex_line(&mut s, indent, i * 16, line);
    }
    s
}

/// One line of a hex dump: offset, 16 hex bytes (padded), ASCII.
fn write_hex_line(s: &mut String, indent: usize, offset: usize, line: &[u8]) -> std::fmt::Result {
    write!(s, "{:indent$}{offset:04x} ", "")?;
    for b in line {
        write!(s, " {b:02x}")?;
    }
    for _ in line.len()..16 {
        s.push_str("   ");
    }
    s.push_str("  |");
    s.extend(line.iter().map(|&b| {
        if b.is_ascii_graphic() || b == b' ' {
            char::from(b)
        } else {
            '.'
        }
    }));
    s.push('|');
    Ok(())
}

/// Renders a packet as multi-line text, every header on a line of its own (no trailing
/// newline).
pub fn text(p: &Packet<'_>, ts: Option<Timestamp>) -> String {
    let mut s = String::with_capacity(512);
    // Writing to a String cannot fail; the results are ignored rather than unwrapped.
    let _ = write_text(&mut s, p, ts);
    s
}

fn write_text(s: &mut String, p: &Packet<'_>, ts: Option<Timestamp>) -> std::fmt::Result {
    write_summary(s, p, ts)?;
    if let Some(c) = &p.cooked {
        write!(s, "\n  {c}")?;
    }
    if let Some(e) = &p.ethernet {
        write!(
            s,
            "\n  ETH  {} -> {} type=0x{:04x}",
            e.src, e.dst, e.ethertype
        )?;
        if let Some(v) = e.vlan {
            write!(s, " vlan={} pcp={} dei={}", v.vid, v.pcp, u8::from(v.dei))?;
        }
    }
    match &p.ip {
        Some(IpHeader::V4(h)) => write!(
            s,
            "\n  IPv4 {} -> {} dscp={} ecn={} ttl={} id=0x{:04x} len={} df={} csum=0x{:04x} {}",
            h.src,
            h.dst,
            h.dscp,
            h.ecn,
            h.ttl,
            h.identification,
            h.total_length,
            u8::from(h.dont_fragment),
            h.checksum,
            if h.checksum_ok { "ok" } else { "BAD" }
        )?,
        Some(IpHeader::V6(h)) => write!(
            s,
            "\n  IPv6 {} -> {} dscp={} ecn={} flow=0x{:05x} hlim={} plen={}",
            h.src, h.dst, h.dscp, h.ecn, h.flow_label, h.hop_limit, h.payload_length
        )?,
        None => {}
    }
    if let Some(u) = &p.udp {
        write!(
            s,
            "\n  UDP  {} -> {} len={} csum=0x{:04x}",
            u.src_port, u.dst_port, u.length, u.checksum
        )?;
    }
    let b = &p.bth;
    write!(
        s,
        "\n  BTH  opcode=0x{:02x} ({}) se={} m={} pad={} tver={} pkey=0x{:04x} fecn={} becn={} dqpn=0x{:06x} a={} psn=0x{:06x}",
        b.opcode.code(),
        b.opcode.name(),
        u8::from(b.se),
        u8::from(b.migreq),
        b.pad_count,
        b.tver,
        b.pkey,
        u8::from(b.fecn),
        u8::from(b.becn),
        b.dest_qp,
        u8::from(b.ack_req),
        b.psn
    )?;
    for &kind in p.opcode().ext_headers() {
        s.push_str("\n  ");
        write_ext(s, kind, &p.ext)?;
    }
    if p.opcode().has_payload() {
        write_payload(s, p)?;
    }
    s.push_str("\n  ICRC ");
    match (p.icrc, p.icrc_check) {
        (Some(icrc), IcrcCheck::Valid) => write!(s, "0x{icrc:08x} ok"),
        (Some(icrc), IcrcCheck::Invalid { computed }) => {
            write!(s, "0x{icrc:08x} BAD (expected 0x{computed:08x})")
        }
        (Some(icrc), _) => write!(s, "0x{icrc:08x} not checked (no IP header)"),
        (None, _) => s.write_str("missing (cut by the capture's snap length)"),
    }
}

fn write_ext(s: &mut String, kind: ExtHeaderKind, e: &ExtHeaders) -> std::fmt::Result {
    // The opcode table and the decoder agree on which headers exist; a missing one would be a
    // decoder bug, shown rather than hidden.
    const MISSING: &str = "(missing)";
    match kind {
        ExtHeaderKind::Rdeth => match e.rdeth {
            Some(h) => write!(s, "RDETH eecnxt=0x{:06x}", h.eecnxt),
            None => write!(s, "RDETH {MISSING}"),
        },
        ExtHeaderKind::Deth => match e.deth {
            Some(h) => write!(s, "DETH qkey=0x{:08x} srcqp=0x{:06x}", h.qkey, h.src_qp),
            None => write!(s, "DETH {MISSING}"),
        },
        ExtHeaderKind::XrcEth => match e.xrceth {
            Some(h) => write!(s, "XRCETH xrcsrq=0x{:06x}", h.xrcsrq),
            None => write!(s, "XRCETH {MISSING}"),
        },
        ExtHeaderKind::Feth => match e.feth {
            Some(h) => write!(s, "FETH sel={} plt={}", h.selectivity, h.placement_type),
            None => write!(s, "FETH {MISSING}"),
        },
        ExtHeaderKind::Reth => match e.reth {
            Some(h) => write!(
                s,
                "RETH va=0x{:016x} rkey=0x{:08x} len={}",
                h.va, h.rkey, h.dma_len
            ),
            None => write!(s, "RETH {MISSING}"),
        },
        ExtHeaderKind::AtomicEth => match e.atomic_eth {
            Some(h) => write!(
                s,
                "AtomicETH va=0x{:016x} rkey=0x{:08x} swap_add=0x{:016x} compare=0x{:016x}",
                h.va, h.rkey, h.swap_or_add, h.compare
            ),
            None => write!(s, "AtomicETH {MISSING}"),
        },
        ExtHeaderKind::Aeth => match e.aeth {
            Some(h) => write!(s, "AETH syndrome={} msn={}", h.syndrome, h.msn),
            None => write!(s, "AETH {MISSING}"),
        },
        ExtHeaderKind::AtomicAckEth => match e.atomic_ack_eth {
            Some(h) => write!(s, "AtomicAckETH orig=0x{:016x}", h.orig),
            None => write!(s, "AtomicAckETH {MISSING}"),
        },
        ExtHeaderKind::ImmDt => match e.immdt {
            Some(h) => write!(s, "ImmDt 0x{:08x}", h.0),
            None => write!(s, "ImmDt {MISSING}"),
        },
        ExtHeaderKind::Ieth => match e.ieth {
            Some(h) => write!(s, "IETH rkey=0x{:08x}", h.rkey),
            None => write!(s, "IETH {MISSING}"),
        },
    }
}

fn write_payload(s: &mut String, p: &Packet<'_>) -> std::fmt::Result {
    // The CNP's 16 bytes are reserved, not data.
    let label = if p.opcode() == Opcode::CNP {
        "RSVD"
    } else {
        "DATA"
    };
    write!(s, "\n  {label} len={}", p.payload_len)?;
    if p.truncated {
        write!(s, " captured={} (truncated)", p.payload.len())?;
    }
    let shown = p.payload.get(..PREVIEW_BYTES).unwrap_or(p.payload);
    for (i, line) in shown.chunks(16).enumerate() {
        s.push('\n');
        write_hex_line(s, 7, i * 16, line)?;
    }
    let more = p.payload.len() - shown.len();
    if more > 0 {
        write!(s, "\n       ... {more} more bytes")?;
    }
    Ok(())
}

/// One packet as a single JSON line (no trailing newline).
///
/// ```
/// # let frame = roce::doc_example_frame();
/// let pkt = roce::decode_ethernet(&frame)?;
/// let line = roce::render::json(&pkt, None);
/// let v: serde_json::Value = serde_json::from_str(&line).unwrap();
/// assert_eq!(v["bth"]["opcode"]["name"], "RC Acknowledge");
/// assert_eq!(v["ext"]["aeth"]["syndrome"]["type"], "ACK");
/// assert_eq!(v["icrc_ok"], true);
/// # Ok::<(), roce::DecodeError>(())
/// ```
pub fn json(p: &Packet<'_>, ts: Option<Timestamp>) -> String {
    #[derive(Serialize)]
    struct Line<'p, 'a> {
        #[serde(skip_serializing_if = "Option::is_none")]
        ts: Option<Timestamp>,
        #[serde(flatten)]
        packet: &'p Packet<'a>,
    }
    to_line(&Line { ts, packet: p })
}

/// A decoding failure as a single JSON line, so `--json` output keeps one line per frame:
/// `{"ts":…,"len":…,"error":"…","kind":"truncated","detail":{…}}`.
pub fn json_error(err: &DecodeError, len: usize, ts: Option<Timestamp>) -> String {
    #[derive(Serialize)]
    struct Line<'e> {
        #[serde(skip_serializing_if = "Option::is_none")]
        ts: Option<Timestamp>,
        len: usize,
        error: String,
        kind: &'static str,
        detail: &'e DecodeError,
    }
    to_line(&Line {
        ts,
        len,
        error: err.to_string(),
        kind: err.kind(),
        detail: err,
    })
}

fn to_line<T: Serialize>(v: &T) -> String {
    // Serializing these plain structs to a String cannot fail; if it ever did, say so in-band.
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":\"json: {e}\"}}"))
}
