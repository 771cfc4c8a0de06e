//! What rdma-inject prints on stdout: one line (or `{"injected": …}` object) per injected
//! packet, then one summary (`{"summary": …}`), so a test or script can check exactly what
//! went on the wire.

use std::io::{self, Write};
use std::net::IpAddr;
use std::path::PathBuf;

use serde::Serialize;

use crate::forge::Forged;
use crate::learn::Flow;

/// The observe mode's summary.
#[derive(Clone, Debug, Serialize)]
pub struct ObserveSummary {
    /// The interface observed (and sent on).
    pub iface: String,
    /// The responder asked for, if any.
    pub dst: Option<IpAddr>,
    /// Frames seen on the interface.
    pub frames_seen: u64,
    /// Of those, RoCEv2 packets.
    pub roce_packets: u64,
    /// The flow learned.
    pub flow: Option<Flow>,
    /// Packets injected (0 when only learning).
    pub injected: usize,
    /// Request packets saved to the plan's capture file, if it names one.
    pub saved: Option<u64>,
    /// Milliseconds from start to the end.
    pub elapsed_ms: u64,
}

/// The blind mode's summary.
#[derive(Clone, Debug, Serialize)]
pub struct BlindSummary {
    /// The interface sent on.
    pub iface: String,
    /// The target.
    pub dst: IpAddr,
    /// The target QP.
    pub qpn: u32,
    /// Guesses asked for.
    pub guesses: u32,
    /// Guesses sent.
    pub sent: u64,
    /// The PRNG seed (the same seed in the plan sends the same PSNs again).
    pub seed: u64,
    /// Milliseconds spent sending.
    pub elapsed_ms: u64,
    /// Sending rate.
    pub packets_per_sec: f64,
    /// True if the plan's timeout stopped it before all guesses were sent.
    pub timed_out: bool,
}

/// The replay mode's summary.
#[derive(Clone, Debug, Serialize)]
pub struct ReplaySummary {
    /// The interface sent on.
    pub iface: String,
    /// The capture.
    pub file: PathBuf,
    /// Request packets in the capture.
    pub requests_in_file: usize,
    /// Packets sent.
    pub injected: usize,
    /// True if renumbered into a live flow, false if sent verbatim.
    pub renumbered: bool,
    /// The live flow (renumbered replays).
    pub flow: Option<Flow>,
    /// Milliseconds from start to the end.
    pub elapsed_ms: u64,
}

/// The sealed-message attacks' summary.
#[derive(Clone, Debug, Serialize)]
pub struct SealedSummary {
    /// The interface observed (and sent on).
    pub iface: String,
    /// The responder asked for, if any.
    pub dst: Option<IpAddr>,
    /// Frames seen on the interface.
    pub frames_seen: u64,
    /// Of those, RoCEv2 packets.
    pub roce_packets: u64,
    /// The flow learned.
    pub flow: Option<Flow>,
    /// Packets injected.
    pub injected: usize,
    /// The sealed headers: observed, injected, and the source's.
    pub sealed: crate::sealed::SealedReport,
    /// Milliseconds from start to the end.
    pub elapsed_ms: u64,
}

/// A run's summary.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Summary {
    /// [`Plan::Observe`](crate::plan::Plan::Observe).
    Observe(ObserveSummary),
    /// [`Plan::Blind`](crate::plan::Plan::Blind).
    Blind(BlindSummary),
    /// [`Plan::Sealed`](crate::plan::Plan::Sealed).
    Sealed(SealedSummary),
    /// [`Plan::Replay`](crate::plan::Plan::Replay).
    Replay(ReplaySummary),
    /// [`Plan::Memory`](crate::plan::Plan::Memory).
    Memory(crate::memory::MemorySummary),
}

/// `{"injected": …}`, fields in declaration order.
#[derive(Serialize)]
struct InjectedLine<'a> {
    injected: &'a crate::forge::InjectedReport,
}

/// `{"summary": …}`.
#[derive(Serialize)]
struct SummaryLine<'a> {
    summary: &'a Summary,
}

/// Writes the report, as text or JSON lines.
///
/// ```
/// use rdma_inject::report::{BlindSummary, Reporter, Summary};
///
/// let mut out = Vec::new();
/// let mut r = Reporter::new(&mut out, true);
/// r.summary(&Summary::Blind(BlindSummary {
///     iface: "veth-b".into(),
///     dst: [10, 77, 0, 1].into(),
///     qpn: 17,
///     guesses: 1,
///     sent: 1,
///     seed: 7,
///     elapsed_ms: 1,
///     packets_per_sec: 1000.0,
///     timed_out: false,
/// }))?;
/// let line = String::from_utf8(out).unwrap();
/// assert!(line.starts_with(r#"{"summary":{"mode":"blind","iface":"veth-b""#));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct Reporter<W: Write> {
    out: W,
    json: bool,
    /// What the program calls the plan's timeout, for the text summary.
    timeout_name: Option<String>,
}

impl<W: Write> Reporter<W> {
    /// A reporter writing JSON lines (`json`) or text to `out`.
    pub fn new(out: W, json: bool) -> Reporter<W> {
        Reporter {
            out,
            json,
            timeout_name: None,
        }
    }

    /// Names the setting behind the plan's timeout (a command-line flag, a configuration
    /// key), so that a text summary of a run it stopped says what to raise: ", stopped by
    /// NAME" instead of ", stopped by the timeout". JSON reports only `timed_out`.
    ///
    /// ```
    /// use rdma_inject::report::Reporter;
    ///
    /// let r = Reporter::new(Vec::new(), false).with_timeout_name("timeout_secs in lab.toml");
    /// # drop(r);
    /// ```
    pub fn with_timeout_name(mut self, name: impl Into<String>) -> Reporter<W> {
        self.timeout_name = Some(name.into());
        self
    }

    /// One injected packet.
    pub fn injected(&mut self, f: &Forged) -> io::Result<()> {
        let r = f.report();
        if self.json {
            let line = serde_json::to_string(&InjectedLine { injected: &r })?;
            writeln!(self.out, "{line}")
        } else {
            writeln!(
                self.out,
                "injected {} to QPN {:#x} PSN {:#08x} ({} bytes, payload {})",
                r.opcode, r.dst_qpn, r.psn, r.bytes, r.payload_len
            )
        }
    }

    /// The learned flow, in text mode only (JSON carries it in the summary).
    pub fn learned(&mut self, flow: &Flow) -> io::Result<()> {
        if self.json {
            return Ok(());
        }
        writeln!(self.out, "learned: {}", flow_text(flow))?;
        self.out.flush()
    }

    /// The summary; flushes.
    pub fn summary(&mut self, s: &Summary) -> io::Result<()> {
        if self.json {
            let line = serde_json::to_string(&SummaryLine { summary: s })?;
            writeln!(self.out, "{line}")?;
        } else {
            match s {
                Summary::Observe(o) => {
                    writeln!(
                        self.out,
                        "observe {}: {} frames, {} RoCEv2, {} injected in {} ms",
                        o.iface, o.frames_seen, o.roce_packets, o.injected, o.elapsed_ms
                    )?;
                    if let Some(n) = o.saved {
                        writeln!(self.out, "saved {n} request packets")?;
                    }
                }
                Summary::Blind(b) => writeln!(
                    self.out,
                    "blind: {} of {} guesses sent to {} QPN {:#x} in {} ms ({:.0} packets/s, \
                     seed {}){}",
                    b.sent,
                    b.guesses,
                    b.dst,
                    b.qpn,
                    b.elapsed_ms,
                    b.packets_per_sec,
                    b.seed,
                    match (b.timed_out, &self.timeout_name) {
                        (false, _) => String::new(),
                        (true, Some(name)) => format!(", stopped by {name}"),
                        (true, None) => ", stopped by the timeout".to_owned(),
                    }
                )?,
                Summary::Sealed(x) => writeln!(
                    self.out,
                    "sealed {} on {}: injected sequence {} ({} bytes, epoch {}) after {} sealed \
                     messages seen (last sequence {}), in {} ms",
                    x.sealed.attack,
                    x.iface,
                    x.sealed.injected.seq,
                    x.sealed.injected.len,
                    x.sealed.injected.epoch,
                    x.sealed.sealed_seen,
                    x.sealed
                        .observed
                        .map_or("none".to_owned(), |h| h.seq.to_string()),
                    x.elapsed_ms
                )?,
                Summary::Replay(r) => writeln!(
                    self.out,
                    "replay {}: {} of {} requests sent on {} ({}) in {} ms",
                    r.file.display(),
                    r.injected,
                    r.requests_in_file,
                    r.iface,
                    if r.renumbered {
                        "renumbered into the live flow"
                    } else {
                        "verbatim"
                    },
                    r.elapsed_ms
                )?,
                Summary::Memory(m) => writeln!(self.out, "{}", m.text())?,
            }
        }
        self.out.flush()
    }

    /// Flushes what was written.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// One line describing a flow.
pub fn flow_text(f: &Flow) -> String {
    let write = match f.write {
        Some(w) => format!("; WRITE rkey {:#x} va {:#x}", w.rkey, w.va),
        None => "; no WRITE seen".to_owned(),
    };
    format!(
        "{} ({}) port {} -> {} ({}) QPN {:#x}, last request PSN {:#08x}, next {:#08x} \
         ({} requests, {} responses{}){write}",
        f.src_ip,
        f.src_mac,
        f.src_port,
        f.dst_ip,
        f.dst_mac,
        f.dst_qpn,
        f.last_psn,
        f.next_psn,
        f.requests,
        f.responses,
        if f.message_open { ", message open" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::forge::{forge, Injection};
    use crate::learn::flow_of_one_send as flow;

    #[test]
    fn json_lines_are_one_object_per_packet_and_a_summary() {
        let f = flow();
        let forged = forge(&f, &Injection::Send(b"FORGED".to_vec())).unwrap();
        let mut out = Vec::new();
        let mut r = Reporter::new(&mut out, true);
        r.learned(&f).unwrap();
        r.injected(&forged).unwrap();
        r.summary(&Summary::Observe(ObserveSummary {
            iface: "veth-b".into(),
            dst: None,
            frames_seen: 3,
            roce_packets: 2,
            flow: Some(f),
            injected: 1,
            saved: None,
            elapsed_ms: 5,
        }))
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        let inj = &lines[0]["injected"];
        assert_eq!(inj["opcode"], "RC SEND Only");
        assert_eq!(
            (inj["dst_qpn"].as_u64(), inj["psn"].as_u64()),
            (Some(17), Some(0x42))
        );
        assert_eq!(inj["bytes"].as_u64(), Some(forged.frame.len() as u64));
        let s = &lines[1]["summary"];
        assert_eq!(s["mode"], "observe");
        assert_eq!(s["flow"]["next_psn"].as_u64(), Some(0x42));
        assert_eq!(s["flow"]["dst_ip"], "10.77.0.1");
        assert!(s["flow"].get("template").is_none());
    }

    #[test]
    fn text_names_the_flow_and_the_packet() {
        let f = flow();
        let forged = forge(&f, &Injection::Send(b"FORGED".to_vec())).unwrap();
        let mut out = Vec::new();
        let mut r = Reporter::new(&mut out, false);
        r.learned(&f).unwrap();
        r.injected(&forged).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("QPN 0x11, last request PSN 0x000041, next 0x000042"),
            "{text}"
        );
        assert!(
            text.contains("injected RC SEND Only to QPN 0x11 PSN 0x000042"),
            "{text}"
        );
    }

    fn blind_summary(timed_out: bool) -> Summary {
        Summary::Blind(BlindSummary {
            iface: "veth-b".into(),
            dst: [10, 77, 0, 1].into(),
            qpn: 17,
            guesses: 10,
            sent: 4,
            seed: 7,
            elapsed_ms: 2,
            packets_per_sec: 2000.0,
            timed_out,
        })
    }

    fn text(r: impl FnOnce(Vec<u8>) -> Reporter<Vec<u8>>, s: &Summary) -> String {
        let mut rep = r(Vec::new());
        rep.summary(s).unwrap();
        String::from_utf8(rep.out).unwrap()
    }

    #[test]
    fn a_timed_out_blind_run_names_the_timeout_as_the_program_calls_it() {
        let plain = |out| Reporter::new(out, false);
        let named = |out| Reporter::new(out, false).with_timeout_name("--timeout");
        assert_eq!(
            text(plain, &blind_summary(true)),
            "blind: 4 of 10 guesses sent to 10.77.0.1 QPN 0x11 in 2 ms (2000 packets/s, seed 7), \
             stopped by the timeout\n"
        );
        assert_eq!(
            text(named, &blind_summary(true)),
            "blind: 4 of 10 guesses sent to 10.77.0.1 QPN 0x11 in 2 ms (2000 packets/s, seed 7), \
             stopped by --timeout\n"
        );
        assert_eq!(
            text(named, &blind_summary(false)),
            "blind: 4 of 10 guesses sent to 10.77.0.1 QPN 0x11 in 2 ms (2000 packets/s, seed 7)\n"
        );
        // JSON carries the fact, not a name.
        let json = text(
            |out| Reporter::new(out, true).with_timeout_name("--timeout"),
            &blind_summary(true),
        );
        assert!(json.contains(r#""timed_out":true"#), "{json}");
        assert!(!json.contains("--timeout"), "{json}");
    }
}
