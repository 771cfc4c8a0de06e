//! Sealed messages: what an on-path attacker learns from secure-rdma's clear header, and the
//! forgeries that get past every check of the receiver but the AEAD tag.
//!
//! secure-rdma seals every RDMA SEND and WRITE WITH IMMEDIATE it makes: a 16-byte header in
//! clear, the ciphertext, a 16-byte tag. The header is
//!
//! | bytes | field |
//! |---|---|
//! | 0 | version, 2 |
//! | 1 | operation: 1 SEND, 2 WRITE |
//! | 2 | key epoch |
//! | 3 | lane |
//! | 4..12 | sequence, u64 big endian (the AEAD nonce) |
//! | 12..16 | plaintext length, u32 big endian |
//!
//! and the receiver checks, in this order: at least 32 bytes, the version, the operation, that
//! the sequence is exactly the next one, that the length matches the bytes that arrived, and
//! only then the tag. A SEND carries the whole sealed message as its payload; a WRITE WITH
//! IMMEDIATE puts it at the start of the receiver's write slot, with the sealed length (header,
//! ciphertext and tag) as the immediate. So everything the first five checks look at is on the
//! wire: a forgery built from the last observed header, with the sequence one further and a
//! length that matches its ciphertext, is refused by the tag alone — which is what the lab
//! tests need to show that the tag check (and the keys and nonces under it) is there.
//!
//! Decoding never panics and never trusts a length: [`SealedHeader::parse`] looks at 16 bytes,
//! [`sealed_in`] decides whether a packet carries a sealed message only when every length it
//! can check agrees (payload, RETH length, immediate).
//!
//! ```
//! use rdma_inject::sealed::{renumbered, SealedHeader};
//!
//! // A sealed SEND of 3 plaintext bytes, sequence 7.
//! let mut msg = vec![2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 3];
//! msg.extend_from_slice(&[0xaa; 3 + 16]);
//! let h = SealedHeader::parse_message(&msg).expect("sealed");
//! assert_eq!((h.seq, h.len), (7, 3));
//! let again = renumbered(&msg, 9).expect("renumbered");
//! assert_eq!(SealedHeader::parse_message(&again).map(|h| h.seq), Some(9));
//! assert_eq!(&again[16..], &msg[16..]);
//! ```

use std::collections::VecDeque;
use std::net::IpAddr;
use std::path::PathBuf;

use roce::{Operation, Packet, Transport};
use serde::Serialize;

use crate::learn::{Flow, FlowLearner, Verdict};

/// Bytes of the clear header.
pub const HEADER_LEN: usize = 16;
/// Bytes of the tag after the ciphertext.
pub const TAG_LEN: usize = 16;
/// What sealing adds to a message.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// The header version secure-rdma speaks.
pub const WIRE_VERSION: u8 = 2;
/// The header's operation byte of a SEND.
pub const OP_SEND: u8 = 1;
/// The header's operation byte of a WRITE.
pub const OP_WRITE: u8 = 2;
/// The reverse direction's sealed SENDs kept for `--reflect`-style attacks: enough for any
/// window of messages in flight, bounded whatever the traffic.
pub const MAX_REVERSE: usize = 64;

/// A sealed message's clear header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SealedHeader {
    /// Format version (2).
    pub version: u8,
    /// Operation: [`OP_SEND`] or [`OP_WRITE`].
    pub op: u8,
    /// Key epoch.
    pub epoch: u8,
    /// Lane.
    pub lane: u8,
    /// The direction's message sequence (the nonce).
    pub seq: u64,
    /// Plaintext (= ciphertext) bytes.
    pub len: u32,
}

impl SealedHeader {
    /// The header at the start of `bytes`, if it is one: version 2 and a known operation.
    /// Looks at the first 16 bytes only; `None` for fewer.
    pub fn parse(bytes: &[u8]) -> Option<SealedHeader> {
        let b: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
        let (version, op) = (b[0], b[1]);
        if version != WIRE_VERSION || !matches!(op, OP_SEND | OP_WRITE) {
            return None;
        }
        let seq = u64::from_be_bytes(b[4..12].try_into().ok()?);
        let len = u32::from_be_bytes(b[12..16].try_into().ok()?);
        Some(SealedHeader {
            version,
            op,
            epoch: b[2],
            lane: b[3],
            seq,
            len,
        })
    }

    /// A whole sealed message: a header whose length accounts for exactly the bytes after it
    /// (ciphertext and tag).
    pub fn parse_message(msg: &[u8]) -> Option<SealedHeader> {
        let h = SealedHeader::parse(msg)?;
        (h.wire_len() == Some(msg.len())).then_some(h)
    }

    /// The 16 header bytes.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = self.version;
        b[1] = self.op;
        b[2] = self.epoch;
        b[3] = self.lane;
        b[4..12].copy_from_slice(&self.seq.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// The sealed message's bytes on the wire: header, ciphertext, tag (`None` if that
    /// overflows, which no real header does).
    pub fn wire_len(self) -> Option<usize> {
        usize::try_from(self.len).ok()?.checked_add(OVERHEAD)
    }
}

/// The sealed message a request packet carries (or starts), if it carries one:
///
/// * SEND Only (with or without immediate): the payload is the whole message;
/// * RDMA WRITE Only with Immediate: the same, and the immediate (the sealed length) agrees;
/// * SEND First, RDMA WRITE First: the header starts the payload and promises more bytes
///   than this packet carries (a WRITE's RETH length must be the sealed length).
///
/// Anything else (ACKs, READs, middle and last packets, payloads that do not parse or whose
/// lengths disagree) is `None`.
pub fn sealed_in(p: &Packet<'_>) -> Option<SealedHeader> {
    if p.opcode().transport() != Transport::Rc {
        return None;
    }
    use Operation::*;
    match p.opcode().operation() {
        SendOnly | SendOnlyImm | SendOnlyInvalidate => SealedHeader::parse_message(p.payload),
        WriteOnlyImm => {
            let h = SealedHeader::parse_message(p.payload)?;
            let imm = usize::try_from(p.ext.immdt?.0).ok()?;
            (Some(imm) == h.wire_len()).then_some(h)
        }
        SendFirst | WriteFirst => {
            let h = SealedHeader::parse(p.payload)?;
            let wire = h.wire_len()?;
            let dma_ok = match p.ext.reth {
                Some(r) => usize::try_from(r.dma_len).ok() == Some(wire),
                None => p.opcode().operation() == SendFirst,
            };
            (wire > p.payload.len() && dma_ok).then_some(h)
        }
        _ => None,
    }
}

/// `msg` (a whole sealed message) with its header's sequence set to `seq`; everything else,
/// ciphertext and tag included, unchanged. `None` if `msg` is not a sealed message.
pub fn renumbered(msg: &[u8], seq: u64) -> Option<Vec<u8>> {
    let h = SealedHeader::parse_message(msg)?;
    let mut out = msg.to_vec();
    out[..HEADER_LEN].copy_from_slice(&SealedHeader { seq, ..h }.to_bytes());
    Some(out)
}

/// A forged sealed message: `template`'s version, operation, epoch and lane, sequence `seq`, a
/// length field that matches `ciphertext`, then `ciphertext` and `tag`. `None` if the
/// ciphertext is longer than a length field holds.
pub fn forgery(
    template: SealedHeader,
    seq: u64,
    ciphertext: &[u8],
    tag: [u8; TAG_LEN],
) -> Option<Vec<u8>> {
    let len = u32::try_from(ciphertext.len()).ok()?;
    let mut out = Vec::with_capacity(ciphertext.len() + OVERHEAD);
    out.extend_from_slice(
        &SealedHeader {
            seq,
            len,
            ..template
        }
        .to_bytes(),
    );
    out.extend_from_slice(ciphertext);
    out.extend_from_slice(&tag);
    Some(out)
}

/// The sealed-message attacks on a live flow.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SealedAttack {
    /// The last observed header with the next sequence, a length matching the ciphertext,
    /// the ciphertext (`text`'s bytes, or random bytes as long as the observed message's),
    /// a random tag: past every check but the tag.
    Forge {
        /// The ciphertext; `None`: random, the observed message's length.
        text: Option<Vec<u8>>,
    },
    /// The first sealed message of a capture, its header renumbered to the flow's next
    /// sealed sequence, at the flow's next PSN (an old epoch's message, another session's).
    Renumber {
        /// The capture (`--save` of an earlier observation, or any pcap).
        file: PathBuf,
    },
    /// Reflection: a sealed SEND the flow's *responder* sent (the reverse direction), whose
    /// sequence is the one the responder expects next from the flow's requester, pushed back
    /// into the responder's QP unchanged: it can only fail at the tag, since each direction
    /// has its own key.
    Reflect,
}

impl SealedAttack {
    /// The attack's name in reports: "forge", "renumber", "reflect".
    pub fn name(&self) -> &'static str {
        match self {
            SealedAttack::Forge { .. } => "forge",
            SealedAttack::Renumber { .. } => "renumber",
            SealedAttack::Reflect => "reflect",
        }
    }
}

/// A sealed message seen in the reverse direction (sent by the flow's responder).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReverseMessage {
    /// Its header.
    pub header: SealedHeader,
    /// The whole frame as seen.
    pub frame: Vec<u8>,
}

/// A [`FlowLearner`] that also follows the flow's sealed sequence, and keeps the last sealed
/// SENDs the responder sent the other way (for reflection).
///
/// ```
/// use rdma_inject::sealed::SealedLearner;
/// use roce::{Opcode, PacketBuilder};
///
/// let mut msg = vec![2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 2];
/// msg.extend_from_slice(&[0; 2 + 16]);
/// let frame = PacketBuilder::new(Opcode::RC_SEND_ONLY)
///     .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
///     .dest_qp(17)
///     .psn(100)
///     .payload(msg)
///     .frame()?;
/// let mut l = SealedLearner::new(Some([10, 77, 0, 1].into()));
/// l.observe(&roce::decode_ethernet(&frame)?);
/// assert_eq!(l.next_seq(), Some(5));
/// assert_eq!(l.flow().map(|f| f.next_psn), Some(101));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct SealedLearner {
    dst: Option<IpAddr>,
    flow: FlowLearner,
    last: Option<SealedHeader>,
    sealed_seen: u64,
    reverse: VecDeque<ReverseMessage>,
}

impl SealedLearner {
    /// Learns the flow towards `dst` (`None`: the first request flow seen; reflection needs
    /// `dst`, to know which packets come back from the responder).
    pub fn new(dst: Option<IpAddr>) -> SealedLearner {
        SealedLearner {
            dst,
            flow: FlowLearner::new(dst),
            ..SealedLearner::default()
        }
    }

    /// The flow learned so far.
    pub fn flow(&self) -> Option<&Flow> {
        self.flow.flow()
    }

    /// The header of the flow's most advanced sealed message.
    pub fn last(&self) -> Option<SealedHeader> {
        self.last
    }

    /// Sealed messages of the flow seen (retransmissions and older ones included).
    pub fn sealed_seen(&self) -> u64 {
        self.sealed_seen
    }

    /// The sequence the responder expects next: the last one seen plus one.
    pub fn next_seq(&self) -> Option<u64> {
        self.last.map(|h| h.seq.saturating_add(1))
    }

    /// The responder's own sealed SEND with sequence `seq`, if it was seen.
    pub fn reverse_with_seq(&self, seq: u64) -> Option<&ReverseMessage> {
        self.reverse.iter().rev().find(|m| m.header.seq == seq)
    }

    /// The reverse direction's sealed SENDs kept (at most [`MAX_REVERSE`], newest last).
    pub fn reverse(&self) -> impl Iterator<Item = &ReverseMessage> {
        self.reverse.iter()
    }

    /// Feeds one decoded packet (`frame`: its bytes, kept if it is a reverse sealed SEND).
    pub fn observe_frame(&mut self, p: &Packet<'_>, frame: &[u8]) -> Verdict {
        let verdict = self.flow.observe(p);
        match verdict {
            Verdict::Request { advanced } => {
                if let Some(h) = sealed_in(p) {
                    self.sealed_seen += 1;
                    // Only a packet that moved the PSN forward moves the sequence: a
                    // retransmission carries an older one. The PSN decides, not the sequence,
                    // so a sender that numbers anew (a new key epoch) is followed too.
                    if advanced {
                        self.last = Some(h);
                    }
                }
            }
            Verdict::Other => self.maybe_reverse(p, frame),
            _ => {}
        }
        verdict
    }

    /// [`SealedLearner::observe_frame`] without keeping reverse frames.
    pub fn observe(&mut self, p: &Packet<'_>) -> Verdict {
        self.observe_frame(p, &[])
    }

    fn maybe_reverse(&mut self, p: &Packet<'_>, frame: &[u8]) {
        let (Some(dst), Some(src)) = (self.dst, p.src()) else {
            return;
        };
        let to_requester = match (self.flow.flow(), p.dst()) {
            (Some(f), Some(d)) => d.ip() == f.src_ip,
            (None, Some(_)) => true,
            _ => false,
        };
        if frame.is_empty() || src.ip() != dst || !to_requester || !p.icrc_ok {
            return;
        }
        let op = p.opcode().operation();
        if !matches!(op, Operation::SendOnly) {
            return;
        }
        let Some(header) = SealedHeader::parse_message(p.payload) else {
            return;
        };
        if header.op != OP_SEND {
            return;
        }
        if self.reverse.len() == MAX_REVERSE {
            self.reverse.pop_front();
        }
        self.reverse.push_back(ReverseMessage {
            header,
            frame: frame.to_vec(),
        });
    }
}

/// What a sealed attack reports in its summary.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SealedReport {
    /// "forge", "renumber" or "reflect".
    pub attack: &'static str,
    /// The flow's last sealed header seen (`None`: none, the sequence was given).
    pub observed: Option<SealedHeader>,
    /// Sealed messages of the flow seen.
    pub sealed_seen: u64,
    /// The header of the injected message.
    pub injected: SealedHeader,
    /// The header the source message had before renumbering (renumber, reflect).
    pub source: Option<SealedHeader>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce::{ImmDt, Opcode, PacketBuilder, Reth};

    const A: [u8; 4] = [10, 77, 0, 1];
    const B: [u8; 4] = [10, 77, 0, 2];

    fn sealed(op: u8, seq: u64, len: usize) -> Vec<u8> {
        let h = SealedHeader {
            version: 2,
            op,
            epoch: 3,
            lane: 0,
            seq,
            len: len as u32,
        };
        forgery(h, seq, &vec![0x5a; len], [0xee; TAG_LEN]).unwrap()
    }

    fn send(src: [u8; 4], dst: [u8; 4], qpn: u32, psn: u32, payload: Vec<u8>) -> Vec<u8> {
        PacketBuilder::new(Opcode::RC_SEND_ONLY)
            .ipv4(src.into(), dst.into())
            .dest_qp(qpn)
            .psn(psn)
            .payload(payload)
            .frame()
            .unwrap()
    }

    fn feed(l: &mut SealedLearner, frame: &[u8]) -> Verdict {
        l.observe_frame(&roce::decode_ethernet(frame).unwrap(), frame)
    }

    #[test]
    fn headers_round_trip_and_refuse_what_is_not_one() {
        let h = SealedHeader {
            version: 2,
            op: OP_WRITE,
            epoch: 7,
            lane: 1,
            seq: 0x0102_0304_0506_0708,
            len: 0x0a0b_0c0d,
        };
        let b = h.to_bytes();
        assert_eq!(
            b,
            [2, 2, 7, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d]
        );
        assert_eq!(SealedHeader::parse(&b), Some(h));
        // Version 1, an unknown operation, fewer than 16 bytes: not a header.
        let mut v1 = b;
        v1[0] = 1;
        assert_eq!(SealedHeader::parse(&v1), None);
        let mut op = b;
        op[1] = 3;
        assert_eq!(SealedHeader::parse(&op), None);
        assert_eq!(SealedHeader::parse(&b[..15]), None);
        assert_eq!(SealedHeader::parse(&[]), None);
        // A whole message: the length field must account for exactly the rest.
        let m = sealed(OP_SEND, 5, 10);
        assert_eq!(m.len(), 42);
        assert_eq!(SealedHeader::parse_message(&m).map(|h| h.len), Some(10));
        assert_eq!(SealedHeader::parse_message(&m[..41]), None);
        let mut longer = m.clone();
        longer.push(0);
        assert_eq!(SealedHeader::parse_message(&longer), None);
        // The largest length field does not overflow anything.
        let mut huge = b;
        huge[12..16].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(SealedHeader::parse_message(&huge).is_none());
    }

    #[test]
    fn renumbering_changes_the_sequence_only() {
        let m = sealed(OP_SEND, 41, 12);
        let r = renumbered(&m, 1000).unwrap();
        let h = SealedHeader::parse_message(&r).unwrap();
        assert_eq!((h.seq, h.len, h.epoch, h.op), (1000, 12, 3, OP_SEND));
        assert_eq!(r[..4], m[..4]);
        assert_eq!(r[12..], m[12..]);
        assert_eq!(renumbered(&m[..20], 1), None);
        assert_eq!(renumbered(b"plain text, not sealed", 1), None);
    }

    #[test]
    fn a_forgery_passes_every_header_check_of_the_receiver() {
        let observed = SealedHeader::parse_message(&sealed(OP_SEND, 9, 30)).unwrap();
        let f = forgery(observed, 10, b"FORGED", [1; TAG_LEN]).unwrap();
        // 16 + 6 + 16: longer than the overhead, so not refused as truncated.
        assert_eq!(f.len(), 38);
        let h = SealedHeader::parse_message(&f).unwrap();
        assert_eq!(
            (h.version, h.op, h.epoch, h.seq, h.len),
            (2, OP_SEND, 3, 10, 6)
        );
        assert_eq!(&f[16..22], b"FORGED");
        assert_eq!(&f[22..], &[1; TAG_LEN]);
    }

    #[test]
    fn sealed_messages_are_found_in_sends_and_writes_only_when_lengths_agree() {
        let m = sealed(OP_WRITE, 3, 5);
        let write = |imm: u32, dma: u32, op: Opcode, payload: Vec<u8>| {
            let f = PacketBuilder::new(op)
                .ipv4(B.into(), A.into())
                .dest_qp(17)
                .reth(Reth {
                    va: 0,
                    rkey: 9,
                    dma_len: dma,
                })
                .immdt(ImmDt(imm))
                .payload(payload)
                .frame()
                .unwrap();
            let p = roce::decode_ethernet(&f).unwrap();
            sealed_in(&p)
        };
        let n = m.len() as u32;
        assert_eq!(
            write(n, n, Opcode::RC_RDMA_WRITE_ONLY_IMM, m.clone()).map(|h| h.seq),
            Some(3)
        );
        // An immediate that is not the sealed length: not this project's WRITE.
        assert_eq!(
            write(n + 1, n, Opcode::RC_RDMA_WRITE_ONLY_IMM, m.clone()),
            None
        );
        // A multi-packet WRITE: the header starts the First packet, RETH gives the length.
        let big = sealed(OP_WRITE, 4, 3000);
        let first = Opcode::new(0x06).unwrap();
        let f = PacketBuilder::new(first)
            .ipv4(B.into(), A.into())
            .dest_qp(17)
            .reth(Reth {
                va: 0,
                rkey: 9,
                dma_len: big.len() as u32,
            })
            .payload(big[..1024].to_vec())
            .frame()
            .unwrap();
        let p = roce::decode_ethernet(&f).unwrap();
        assert_eq!(sealed_in(&p).map(|h| h.seq), Some(4));
        // A SEND of plain text is no sealed message.
        let plain = send(B, A, 17, 1, b"hello from the real client".to_vec());
        assert_eq!(sealed_in(&roce::decode_ethernet(&plain).unwrap()), None);
    }

    #[test]
    fn the_learner_follows_the_sealed_sequence_and_keeps_the_responders_sends() {
        let mut l = SealedLearner::new(Some(B.into()));
        // Server (A) to client (B): a 32-byte confirmation token, then sealed acks 1 and 2.
        feed(&mut l, &send(A, B, 0x12, 500, vec![7; 32]));
        assert_eq!(l.next_seq(), None);
        feed(&mut l, &send(A, B, 0x12, 501, sealed(OP_SEND, 1, 13)));
        // The client's own sealed SENDs to the server go the other way: kept for reflection.
        let c2 = send(B, A, 0x11, 9000, sealed(OP_SEND, 2, 20));
        assert_eq!(feed(&mut l, &c2), Verdict::Other);
        feed(&mut l, &send(A, B, 0x12, 502, sealed(OP_SEND, 2, 13)));
        // A retransmission does not move the sequence back.
        feed(&mut l, &send(A, B, 0x12, 501, sealed(OP_SEND, 1, 13)));
        assert_eq!(l.next_seq(), Some(3));
        assert_eq!(l.sealed_seen(), 3);
        assert_eq!(l.flow().unwrap().next_psn, 503);
        let c3 = send(B, A, 0x11, 9001, sealed(OP_SEND, 3, 20));
        feed(&mut l, &c3);
        assert_eq!(l.reverse_with_seq(3).map(|m| &m.frame), Some(&c3));
        assert_eq!(l.reverse_with_seq(2).map(|m| &m.frame), Some(&c2));
        assert!(l.reverse_with_seq(4).is_none());
        // The PSN decides: a sender that numbers anew is followed.
        feed(&mut l, &send(A, B, 0x12, 503, sealed(OP_SEND, 1, 13)));
        assert_eq!(l.next_seq(), Some(2));
        assert_eq!(l.last().map(|h| h.epoch), Some(3));
        // Bounded.
        for i in 0..2 * MAX_REVERSE as u64 {
            feed(&mut l, &send(B, A, 0x11, 9002, sealed(OP_SEND, 10 + i, 1)));
        }
        assert_eq!(l.reverse().count(), MAX_REVERSE);
    }
}
