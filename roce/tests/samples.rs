//! The sample captures shipped in `roce/samples/`, generated here so they cannot rot: the test
//! fails when a committed file differs from what this generator writes. After changing the
//! generator (or the encoder), write them again with
//! `ROCE_WRITE_SAMPLES=1 cargo test -p roce --test samples`.
//!
//! The session: host A (10.77.0.1, QP 0x11) and host B (10.77.0.2, QP 0x12) on one RC
//! connection with a 512-byte path MTU. Each sends the other a message, A writes 1224 bytes
//! with an immediate (WRITE First, Middle, Last with Immediate) and 16 more (WRITE Only with
//! Immediate), B reads 64 bytes back; every request is acknowledged.

use std::borrow::Cow;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::{PcapNgBlock, PcapNgWriter};
use pcap_file::{DataLink, Endianness};
use roce::pcap::{self, LinkType, PcapWriter, Resolution, Timestamp};
use roce::sll::{LinuxSll, PacketType, SllVersion};
use roce::{Aeth, AethSyndrome, ImmDt, MacAddr, Opcode, PacketBuilder, Reth, ETHERTYPE_IPV4};

const A: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 77, 0, 2);
const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
const QP_A: u32 = 0x11;
const QP_B: u32 = 0x12;
/// When the session starts: 2023-11-14 22:13:20 UTC.
const START: u64 = 1_700_000_000;

/// The opcodes of the session, in order, as `rdma-capture` names them.
pub const OPCODES: [&str; 12] = [
    "RC SEND Only",
    "RC Acknowledge",
    "RC SEND Only",
    "RC Acknowledge",
    "RC RDMA WRITE First",
    "RC RDMA WRITE Middle",
    "RC RDMA WRITE Last with Immediate",
    "RC Acknowledge",
    "RC RDMA WRITE Only with Immediate",
    "RC Acknowledge",
    "RC RDMA READ Request",
    "RC RDMA READ response Only",
];

fn op(code: u8) -> Opcode {
    Opcode::new(code).expect("a defined opcode")
}

fn ack(msn: u32) -> Aeth {
    Aeth {
        syndrome: AethSyndrome::Ack { credits: 31 },
        msn,
    }
}

/// A packet from A's QP to B's QP, or from B's to A's.
fn from(a: bool, opcode: Opcode, psn: u32) -> PacketBuilder {
    let b = PacketBuilder::new(opcode).psn(psn);
    if a {
        b.src_mac(MacAddr(MAC_A))
            .dst_mac(MacAddr(MAC_B))
            .ipv4(A, B)
            .src_port(0xc011)
            .dest_qp(QP_B)
    } else {
        b.src_mac(MacAddr(MAC_B))
            .dst_mac(MacAddr(MAC_A))
            .ipv4(B, A)
            .src_port(0xc012)
            .dest_qp(QP_A)
    }
}

/// The session's packets: (sent by A, Ethernet frame).
fn session() -> Vec<(bool, Vec<u8>)> {
    let reth = |dma_len| Reth {
        va: 0x7f00_0000_1000,
        rkey: 0x2345,
        dma_len,
    };
    let data =
        |n: usize, seed: u8| -> Vec<u8> { (0..n).map(|i| seed.wrapping_add(i as u8)).collect() };
    let packets = [
        (
            true,
            from(true, Opcode::RC_SEND_ONLY, 0x100)
                .ack_req(true)
                .payload(*b"hello from A: a SEND on RC QP 0x11 to QP 0x12"),
        ),
        (
            false,
            from(false, Opcode::RC_ACKNOWLEDGE, 0x100).aeth(ack(1)),
        ),
        (
            false,
            from(false, Opcode::RC_SEND_ONLY, 0x500)
                .ack_req(true)
                .payload(*b"hello from B: a SEND on RC QP 0x12 to QP 0x11"),
        ),
        (true, from(true, Opcode::RC_ACKNOWLEDGE, 0x500).aeth(ack(1))),
        (
            true,
            from(true, op(0x06), 0x101)
                .reth(reth(1224))
                .payload(data(512, 0)),
        ),
        (true, from(true, op(0x07), 0x102).payload(data(512, 0x80))),
        (
            true,
            from(true, op(0x09), 0x103)
                .ack_req(true)
                .immdt(ImmDt(0xc0ffee))
                .payload(data(200, 0x40)),
        ),
        (
            false,
            from(false, Opcode::RC_ACKNOWLEDGE, 0x103).aeth(ack(2)),
        ),
        (
            true,
            from(true, Opcode::RC_RDMA_WRITE_ONLY_IMM, 0x104)
                .ack_req(true)
                .reth(reth(16))
                .immdt(ImmDt(0xbeef))
                .payload(*b"sixteen bytes..."),
        ),
        (
            false,
            from(false, Opcode::RC_ACKNOWLEDGE, 0x104).aeth(ack(3)),
        ),
        (
            false,
            from(false, Opcode::RC_RDMA_READ_REQUEST, 0x501).reth(reth(64)),
        ),
        (
            true,
            from(true, op(0x10), 0x501)
                .aeth(ack(2))
                .payload(data(64, 0x20)),
        ),
    ];
    packets
        .into_iter()
        .map(|(a, p)| (a, p.frame().expect("sample packet")))
        .collect()
}

/// Packet `i`'s timestamp: 100 µs apart.
fn ts(i: usize) -> Timestamp {
    Timestamp::new(START, 100_000 * (i as u32 + 1))
}

/// `rc-session.pcap`: Ethernet, nanosecond timestamps, as `rdma-capture -w` writes.
fn pcap_ethernet() -> Vec<u8> {
    let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 65535, Resolution::Nanos).unwrap();
    for (i, (_, frame)) in session().iter().enumerate() {
        w.write_packet(ts(i), frame, frame.len()).unwrap();
    }
    w.into_inner().unwrap()
}

/// `rc-session.pcapng`: the same packets in pcapng, as tshark and dumpcap write by default
/// (one Ethernet interface with nanosecond resolution, enhanced packet blocks).
fn pcapng_ethernet() -> Vec<u8> {
    let mut w = PcapNgWriter::with_endianness(Vec::new(), Endianness::Little).unwrap();
    let mut idb = InterfaceDescriptionBlock::new(DataLink::ETHERNET, 65535);
    idb.options = vec![InterfaceDescriptionOption::IfTsResol(9)];
    w.write_block(&idb.into_block()).unwrap();
    for (i, (_, frame)) in session().iter().enumerate() {
        let t = ts(i);
        let epb = EnhancedPacketBlock {
            interface_id: 0,
            // pcap-file writes the Duration's nanoseconds as the raw timestamp, which
            // if_tsresol 9 makes nanoseconds.
            timestamp: Duration::new(t.secs, t.nanos),
            original_len: frame.len() as u32,
            data: Cow::Borrowed(frame),
            options: vec![],
        };
        w.write_block(&epb.into_block()).unwrap();
    }
    w.into_inner()
}

/// `rc-session-sll2.pcap`: the session as `tcpdump -i any` on host A records it (libpcap
/// 1.10+): a 20-byte SLL2 header instead of Ethernet, `Out` for A's packets, `In` for B's.
fn pcap_sll2() -> Vec<u8> {
    let mut w = PcapWriter::new(
        Vec::new(),
        LinkType::LINUX_SLL2,
        262_144,
        Resolution::Micros,
    )
    .unwrap();
    for (i, (sent_by_a, frame)) in session().iter().enumerate() {
        let (kind, mac) = if *sent_by_a {
            (PacketType::Outgoing, MAC_A)
        } else {
            (PacketType::Host, MAC_B)
        };
        let mut record =
            LinuxSll::ethernet(SllVersion::V2, kind, 3, mac, ETHERTYPE_IPV4).to_bytes();
        record.extend_from_slice(&frame[14..]);
        w.write_packet(ts(i), &record, record.len()).unwrap();
    }
    w.into_inner().unwrap()
}

fn samples() -> [(&'static str, Vec<u8>); 3] {
    [
        ("rc-session.pcap", pcap_ethernet()),
        ("rc-session.pcapng", pcapng_ethernet()),
        ("rc-session-sll2.pcap", pcap_sll2()),
    ]
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("samples")
}

#[test]
fn committed_samples_match_the_generator() {
    let write = std::env::var_os("ROCE_WRITE_SAMPLES").is_some();
    for (name, bytes) in samples() {
        let path = dir().join(name);
        if write {
            std::fs::write(&path, &bytes).unwrap();
            continue;
        }
        let committed = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (write it with ROCE_WRITE_SAMPLES=1)",
                path.display()
            )
        });
        assert!(
            committed == bytes,
            "{} differs from what tests/samples.rs generates; if the change is intended, \
             write it again with ROCE_WRITE_SAMPLES=1 cargo test -p roce --test samples",
            path.display()
        );
        assert!(bytes.len() < 8 * 1024, "{name}: keep samples small");
    }
}

/// Every sample holds the session: the same opcodes in order, every ICRC valid, the same
/// timestamps, whatever the container or link layer.
#[test]
fn samples_decode_to_the_session() {
    for (name, bytes) in samples() {
        let (header, records) = pcap::read(&bytes).unwrap();
        let mut n = 0;
        for (i, record) in records.enumerate() {
            let record = record.unwrap();
            let p = match header.link {
                LinkType::Ethernet => roce::decode_ethernet(record.data),
                LinkType::LINUX_SLL2 => {
                    roce::decode_sll_snapped(record.data, record.orig_len as usize, SllVersion::V2)
                }
                other => panic!("{name}: link type {other:?}"),
            }
            .unwrap_or_else(|e| panic!("{name} packet {i}: {e}"));
            assert_eq!(p.opcode().name(), OPCODES[i], "{name} packet {i}");
            assert!(p.icrc_ok, "{name} packet {i}");
            assert_eq!(record.ts, ts(i), "{name} packet {i}");
            n += 1;
        }
        assert_eq!(n, OPCODES.len(), "{name}");
    }
}
