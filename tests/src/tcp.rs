//! TCP segments as an on-path attacker reads and forges them, for `tcp-reset` (issue 20,
//! test 3: a reset to the client right after its SEND).
//!
//! Pure: frames in, frames out, no sockets, so the host tests check every byte.
//!
//! A forged reset is accepted only if its sequence number is exactly the receiver's next
//! expected one (RFC 5961, 3.2; Linux `tcp_validate_incoming`): one inside the window but not
//! exact only draws a challenge ACK. [`Flow`] keeps that number for one direction of a
//! connection from the segments it has seen.

use std::net::{Ipv4Addr, SocketAddrV4};

use roce::{internet_checksum, MacAddr};

/// TCP header flags.
pub mod flags {
    /// No more data from the sender.
    pub const FIN: u8 = 0x01;
    /// Synchronise sequence numbers.
    pub const SYN: u8 = 0x02;
    /// Reset the connection.
    pub const RST: u8 = 0x04;
    /// Push.
    pub const PSH: u8 = 0x08;
    /// The acknowledgement field is significant.
    pub const ACK: u8 = 0x10;
}

const ETH_LEN: usize = 14;
const IPV4_LEN: usize = 20;
const TCP_LEN: usize = 20;
const ETHERTYPE_IPV4: u16 = 0x0800;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// One TCP segment of an Ethernet frame (IPv4 only: the lab's addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Sender.
    pub src: SocketAddrV4,
    /// Receiver.
    pub dst: SocketAddrV4,
    /// Sequence number of the first byte (or of the SYN/FIN).
    pub seq: u32,
    /// Acknowledgement number (meaningful with [`flags::ACK`]).
    pub ack: u32,
    /// The flag bits.
    pub flags: u8,
    /// Payload bytes.
    pub payload_len: u32,
}

impl Segment {
    /// The TCP segment in `frame`, or `None` for anything else (another protocol, a fragment,
    /// a header cut short).
    pub fn parse(frame: &[u8]) -> Option<Segment> {
        let (src_ip, dst_ip, l4) = ipv4_payload(frame, IPPROTO_TCP)?;
        let tcp = l4;
        if tcp.len() < TCP_LEN {
            return None;
        }
        let data_offset = usize::from(tcp[12] >> 4) * 4;
        if data_offset < TCP_LEN || data_offset > tcp.len() {
            return None;
        }
        Some(Segment {
            src: SocketAddrV4::new(src_ip, u16::from_be_bytes([tcp[0], tcp[1]])),
            dst: SocketAddrV4::new(dst_ip, u16::from_be_bytes([tcp[2], tcp[3]])),
            seq: u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]),
            ack: u32::from_be_bytes([tcp[8], tcp[9], tcp[10], tcp[11]]),
            flags: tcp[13],
            payload_len: u32::try_from(tcp.len() - data_offset).ok()?,
        })
    }

    /// The sequence number the receiver expects after this segment: SYN and FIN count one.
    pub fn next_seq(&self) -> u32 {
        let syn_fin =
            u32::from(self.flags & flags::SYN != 0) + u32::from(self.flags & flags::FIN != 0);
        self.seq
            .wrapping_add(self.payload_len)
            .wrapping_add(syn_fin)
    }

    /// True if the flag bits include all of `f`.
    pub fn has(&self, f: u8) -> bool {
        self.flags & f == f
    }
}

/// The IPv4 source, destination and layer-4 bytes of `frame` if it carries `proto`; the
/// IPv4 total length bounds the payload (a short frame is padded to 60 bytes).
fn ipv4_payload(frame: &[u8], proto: u8) -> Option<(Ipv4Addr, Ipv4Addr, &[u8])> {
    if frame.len() < ETH_LEN + IPV4_LEN
        || u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_IPV4
    {
        return None;
    }
    let ip = &frame[ETH_LEN..];
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    // Version 4, a whole header, the protocol, and no fragment after the first.
    let frag_offset = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
    if ip[0] >> 4 != 4 || ihl < IPV4_LEN || ip[9] != proto || frag_offset != 0 {
        return None;
    }
    if total < ihl || total > ip.len() {
        return None;
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    Some((src, dst, &ip[ihl..total]))
}

/// A reset "from" `src` to `dst`: an Ethernet frame with valid IPv4 and TCP checksums, flags
/// RST and ACK. `seq` must be the receiver's next expected sequence number ([`Flow::next`]);
/// `ack` is what the forged sender claims to have received.
pub fn rst_frame(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: SocketAddrV4,
    dst: SocketAddrV4,
    seq: u32,
    ack: u32,
) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_LEN + IPV4_LEN + TCP_LEN);
    f.extend_from_slice(&dst_mac.0);
    f.extend_from_slice(&src_mac.0);
    f.extend_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    // IPv4: no options, Don't Fragment, TTL 64.
    let total = (IPV4_LEN + TCP_LEN) as u16;
    let mut ip = [0u8; IPV4_LEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = IPPROTO_TCP;
    ip[12..16].copy_from_slice(&src.ip().octets());
    ip[16..20].copy_from_slice(&dst.ip().octets());
    let sum = internet_checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&ip);
    // TCP: no options, window 0 (a reset advertises none).
    let mut tcp = [0u8; TCP_LEN];
    tcp[0..2].copy_from_slice(&src.port().to_be_bytes());
    tcp[2..4].copy_from_slice(&dst.port().to_be_bytes());
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    tcp[8..12].copy_from_slice(&ack.to_be_bytes());
    tcp[12] = ((TCP_LEN / 4) as u8) << 4;
    tcp[13] = flags::RST | flags::ACK;
    let sum = tcp_checksum(*src.ip(), *dst.ip(), &tcp);
    tcp[16..18].copy_from_slice(&sum.to_be_bytes());
    f.extend_from_slice(&tcp);
    f
}

/// The TCP checksum over the IPv4 pseudo-header and `segment` (its checksum field zero).
fn tcp_checksum(src: Ipv4Addr, dst: Ipv4Addr, segment: &[u8]) -> u16 {
    let mut buf = Vec::with_capacity(12 + segment.len());
    buf.extend_from_slice(&src.octets());
    buf.extend_from_slice(&dst.octets());
    buf.push(0);
    buf.push(IPPROTO_TCP);
    buf.extend_from_slice(&(segment.len() as u16).to_be_bytes());
    buf.extend_from_slice(segment);
    internet_checksum(&buf)
}

/// True if `frame` is a RoCEv2 request from `src` to `dst` that ends a message the requester
/// sends (a SEND or RDMA WRITE, Last or Only, with or without immediate: what the lab's client
/// does when it sends a command over RDMA) and carries at least `min_payload` bytes.
pub fn ends_rdma_message(frame: &[u8], src: Ipv4Addr, dst: Ipv4Addr, min_payload: usize) -> bool {
    let Some((s, d, _)) = ipv4_payload(frame, IPPROTO_UDP) else {
        return false;
    };
    if s != src || d != dst {
        return false;
    }
    let Ok(pkt) = roce::decode_ethernet(frame) else {
        return false;
    };
    // RC: SEND Last 0x02, Last with Immediate 0x03, Only 0x04, Only with Immediate 0x05;
    // RDMA WRITE Last 0x08, Last with Immediate 0x09, Only 0x0a, Only with Immediate 0x0b.
    matches!(pkt.opcode().code(), 0x02..=0x05 | 0x08..=0x0b) && pkt.payload_len >= min_payload
}

/// One direction of a TCP connection as an observer follows it: the next sequence number the
/// receiver expects, and the last acknowledgement the sender sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flow {
    /// Sender.
    pub src: SocketAddrV4,
    /// Receiver.
    pub dst: SocketAddrV4,
    /// The receiver's next expected sequence number.
    pub next: u32,
    /// The sender's last acknowledgement number.
    pub ack: u32,
}

impl Flow {
    /// Updates the flow with a segment of the same direction; a reset is not data and leaves
    /// it as it was. A segment from before the newest one seen (a retransmission) never moves
    /// the number back.
    pub fn update(&mut self, s: &Segment) {
        if s.has(flags::RST) {
            return;
        }
        let next = s.next_seq();
        // Serial-number arithmetic: "after" within half the sequence space.
        if next.wrapping_sub(self.next) < 1 << 31 {
            self.next = next;
        }
        if s.has(flags::ACK) {
            self.ack = s.ack;
        }
    }

    /// The flow a first segment starts.
    pub fn from_segment(s: &Segment) -> Flow {
        Flow {
            src: s.src,
            dst: s.dst,
            next: s.next_seq(),
            ack: s.ack,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xa]);
    const B: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xb]);

    fn server() -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 1), 4710)
    }

    fn client() -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::new(10, 77, 0, 2), 51_234)
    }

    /// A data segment as the kernel sends it: with a timestamp option, padded as given.
    fn data_frame(seq: u32, ack: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut tcp = vec![0u8; 32];
        tcp[0..2].copy_from_slice(&server().port().to_be_bytes());
        tcp[2..4].copy_from_slice(&client().port().to_be_bytes());
        tcp[4..8].copy_from_slice(&seq.to_be_bytes());
        tcp[8..12].copy_from_slice(&ack.to_be_bytes());
        tcp[12] = 8 << 4;
        tcp[13] = flags;
        // NOP, NOP, timestamps.
        tcp[20..24].copy_from_slice(&[1, 1, 8, 10]);
        tcp.extend_from_slice(payload);
        let mut f = rst_frame(A, B, server(), client(), 0, 0);
        f.truncate(ETH_LEN + IPV4_LEN);
        let total = (IPV4_LEN + tcp.len()) as u16;
        f[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&total.to_be_bytes());
        f.extend_from_slice(&tcp);
        f
    }

    #[test]
    fn a_reset_frame_has_valid_checksums_and_parses_back() {
        let f = rst_frame(A, B, server(), client(), 0xfffffff0, 77);
        assert_eq!(f.len(), 54);
        assert_eq!(&f[0..6], &B.0);
        assert_eq!(&f[6..12], &A.0);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        // A header whose checksum is right sums to 0.
        assert_eq!(internet_checksum(&f[14..34]), 0);
        assert_eq!(tcp_checksum(*server().ip(), *client().ip(), &f[34..]), 0);
        let s = Segment::parse(&f).expect("parses");
        assert_eq!(
            s,
            Segment {
                src: server(),
                dst: client(),
                seq: 0xfffffff0,
                ack: 77,
                flags: flags::RST | flags::ACK,
                payload_len: 0,
            }
        );
        assert_eq!(s.next_seq(), 0xfffffff0);
    }

    /// The checksum against one worked by hand (RFC 1071): a reset of 10.77.0.1:4433 to
    /// 10.77.0.2:40000, seq 1, ack 1, no options.
    #[test]
    fn the_tcp_checksum_matches_rfc_1071_worked_by_hand() {
        let mut tcp = [0u8; 20];
        tcp[0..2].copy_from_slice(&4433u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&40000u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&1u32.to_be_bytes());
        tcp[8..12].copy_from_slice(&1u32.to_be_bytes());
        tcp[12] = 0x50;
        tcp[13] = flags::RST | flags::ACK;
        let sum = tcp_checksum(
            Ipv4Addr::new(10, 77, 0, 1),
            Ipv4Addr::new(10, 77, 0, 2),
            &tcp,
        );
        // Pseudo-header 0a4d 0001 0a4d 0002 0006 0014, header 1151 9c40 0000 0001 0000 0001
        // 5014: the sum is 0x1_125e, folded 0x125f, complemented 0xeda0.
        assert_eq!(sum, 0xeda0);
    }

    #[test]
    fn data_segments_move_the_flow_and_resets_and_retransmissions_do_not() {
        let first = Segment::parse(&data_frame(1000, 5, flags::ACK | flags::PSH, b"hello"))
            .expect("parses");
        assert_eq!(first.payload_len, 5);
        assert_eq!(first.next_seq(), 1005);
        let mut flow = Flow::from_segment(&first);
        assert_eq!((flow.next, flow.ack), (1005, 5));
        // A retransmission of the first leaves it.
        flow.update(&first);
        assert_eq!(flow.next, 1005);
        // A pure ACK (no data) neither.
        flow.update(&Segment::parse(&data_frame(1005, 9, flags::ACK, b"")).expect("ack"));
        assert_eq!((flow.next, flow.ack), (1005, 9));
        // A FIN counts one.
        flow.update(
            &Segment::parse(&data_frame(1005, 9, flags::ACK | flags::FIN, b"xy")).expect("fin"),
        );
        assert_eq!(flow.next, 1008);
        // Our own reset, seen coming back, is not data.
        let rst = rst_frame(A, B, server(), client(), 5000, 9);
        flow.update(&Segment::parse(&rst).expect("rst"));
        assert_eq!(flow.next, 1008);
        // Wrapping around 2^32 is "after".
        let mut wrap = Flow::from_segment(
            &Segment::parse(&data_frame(u32::MAX - 1, 0, flags::ACK, b"")).expect("seg"),
        );
        wrap.update(
            &Segment::parse(&data_frame(u32::MAX - 1, 0, flags::ACK, b"abcd")).expect("seg"),
        );
        assert_eq!(wrap.next, 2);
    }

    #[test]
    fn a_syn_counts_one_and_padding_is_not_payload() {
        let mut f = data_frame(41, 0, flags::SYN, b"");
        // Padded to the Ethernet minimum and beyond: the IPv4 length bounds the segment.
        f.resize(80, 0);
        let s = Segment::parse(&f).expect("parses");
        assert_eq!(s.payload_len, 0);
        assert_eq!(s.next_seq(), 42);
    }

    #[test]
    fn other_frames_are_not_segments() {
        let good = data_frame(1, 1, flags::ACK, b"x");
        assert!(Segment::parse(&good).is_some());
        // Cut inside the TCP header.
        assert!(Segment::parse(&good[..ETH_LEN + IPV4_LEN + 10]).is_none());
        // Not IPv4.
        let mut ipv6 = good.clone();
        ipv6[12..14].copy_from_slice(&[0x86, 0xdd]);
        assert!(Segment::parse(&ipv6).is_none());
        // UDP.
        let mut udp = good.clone();
        udp[ETH_LEN + 9] = IPPROTO_UDP;
        assert!(Segment::parse(&udp).is_none());
        // A later fragment.
        let mut frag = good.clone();
        frag[ETH_LEN + 7] = 1;
        assert!(Segment::parse(&frag).is_none());
        // A total length beyond the frame.
        let mut long = good;
        long[ETH_LEN + 2..ETH_LEN + 4].copy_from_slice(&9000u16.to_be_bytes());
        assert!(Segment::parse(&long).is_none());
    }

    #[test]
    fn the_end_of_a_client_send_is_recognised_and_nothing_else() {
        let b = Ipv4Addr::new(10, 77, 0, 2);
        let a = Ipv4Addr::new(10, 77, 0, 1);
        let frame = crate::inject::send_only(0x11, 5, crate::inject::FORGED_SRC_PORT)
            .frame()
            .expect("builds");
        assert!(ends_rdma_message(&frame, b, a, 0));
        // Its payload, "FORGED-BY-A-LAB-TEST", is 20 bytes: marked by size.
        assert!(ends_rdma_message(&frame, b, a, 20));
        assert!(!ends_rdma_message(&frame, b, a, 21));
        // The other direction is the server's.
        assert!(!ends_rdma_message(&frame, a, b, 0));
        // The first packet of a longer SEND does not end it.
        let send_first = crate::inject::send_only(0x11, 5, crate::inject::FORGED_SRC_PORT)
            .with_opcode(roce::Opcode::new(0x00).expect("RC SEND First"))
            .frame()
            .expect("builds");
        assert!(!ends_rdma_message(&send_first, b, a, 0));
        // Nor is a TCP segment.
        assert!(!ends_rdma_message(
            &data_frame(1, 1, flags::ACK, b"x"),
            b,
            a,
            0
        ));
    }
}
