//! How `rdma-capture` shows a followed QP's conversation, live and from a file. The follower's
//! own PSN judgements are tested with the decoder, in the roce crate's `tests/follow_qp.rs`.

use std::net::Ipv4Addr;

use rdma_capture::offline::replay;
use rdma_capture::processor::{Output, Processor, ProcessorConfig};
use rdma_capture::record::{Record, Source};
use roce::follow::Stream;
use roce::pcap::{self, LinkType, PcapWriter, Resolution, Timestamp};
use roce::{Aeth, AethSyndrome, Opcode, PacketBuilder};

const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const QP_A: u32 = 0x000100; // requester on A
const QP_B: u32 = 0x000200; // responder on B

/// A packet from A's QP to B's QP.
fn from_a(op: Opcode, psn: u32) -> PacketBuilder {
    PacketBuilder::new(op)
        .ipv4(A, B)
        .src_port(0xc100)
        .dest_qp(QP_B)
        .psn(psn)
}

/// A packet from B's QP to A's QP.
fn from_b(op: Opcode, psn: u32) -> PacketBuilder {
    PacketBuilder::new(op)
        .ipv4(B, A)
        .src_port(0xc200)
        .dest_qp(QP_A)
        .psn(psn)
}

fn ack(msn: u32) -> Aeth {
    Aeth {
        syndrome: AethSyndrome::Ack { credits: 31 },
        msn,
    }
}

/// The race the lab met: when each side of a connection starts with a SEND, the peer's first
/// request can reach the wire before anything addressed to the followed QP, so nothing pairs
/// its direction yet. Following QP B must still show it: live, once the pairing response
/// arrives; from a file, in the file's order.
#[test]
fn the_peers_request_before_the_first_pairing_is_shown_not_lost() {
    // B's confirmation SEND to A leaves first; then A's SEND to B; then the ACKs.
    let send = Opcode::RC_SEND_ONLY;
    let pkts = [
        // to QP A: B's first request, unpaired
        from_b(send, 0x500).payload(*b"token"),
        // to QP 0x300: another QP pair, never shown
        from_a(send, 0x777)
            .dest_qp(0x300)
            .src_port(0xc300)
            .payload(*b"data"),
        // to QP B: A's first request
        from_a(send, 0x900).payload(*b"data"),
        // to QP B: A's ACK of B's SEND
        from_a(Opcode::RC_ACKNOWLEDGE, 0x500).aeth(ack(1)),
        // to QP A: B's ACK of A's SEND
        from_b(Opcode::RC_ACKNOWLEDGE, 0x900).aeth(ack(0x900)),
    ];
    let frames: Vec<Vec<u8>> = pkts.iter().map(|p| p.frame().unwrap()).collect();
    let config = ProcessorConfig {
        qpn: Some(QP_B),
        output: Output::Json,
        ..ProcessorConfig::default()
    };
    let psns = |lines: &[String]| -> Vec<(u64, u64)> {
        lines
            .iter()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                let bth = &v["bth"];
                (
                    bth["dest_qp"].as_u64().unwrap(),
                    bth["psn"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let a = u64::from(QP_A);
    let b = u64::from(QP_B);

    // Live: each record's lines, in the order they are printed.
    let mut live = Processor::new(config.clone(), Some(Vec::new()), 2048).unwrap();
    let printed: Vec<Vec<String>> = frames
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let record = Record {
                ifindex: 1,
                source: Source::Ingress,
                orig_len: f.len() as u32,
                ktime_ns: 0,
                data: f,
            };
            live.process(&record, Timestamp::new(1_700_000_000, i as u32))
                .unwrap()
        })
        .collect();
    assert_eq!(
        printed[0],
        Vec::<String>::new(),
        "held: nothing pairs it yet"
    );
    assert_eq!(printed[1], Vec::<String>::new(), "another QP");
    assert_eq!(psns(&printed[2]), [(b, 0x900)]);
    // A's ACK of PSN 0x500 pairs B's direction: the held SEND comes out first.
    assert_eq!(psns(&printed[3]), [(a, 0x500), (b, 0x500)]);
    assert_eq!(psns(&printed[4]), [(a, 0x900)]);
    let first: serde_json::Value = serde_json::from_str(&printed[3][0]).unwrap();
    assert_eq!(first["psn_event"]["event"], "first");
    assert_eq!(live.shown(), 4);
    let summary = live.summary(Default::default());
    // Each direction carries two independent PSN sequences, the sender's requests and its
    // responses to the other side's; mixed into one, 0x500 then 0x900 would be a "gap".
    let flows: Vec<(u32, Stream, u32, u64, u64)> = summary
        .flows
        .iter()
        .map(|f| {
            let s = &f.summary;
            (
                f.flow.dest_qp,
                f.flow.stream,
                s.first_psn,
                s.packets,
                s.gaps,
            )
        })
        .collect();
    assert_eq!(
        flows,
        [
            (QP_B, Stream::Requests, 0x900, 1, 0),
            (QP_B, Stream::Responses, 0x500, 1, 0),
            (QP_A, Stream::Requests, 0x500, 1, 0),
            (QP_A, Stream::Responses, 0x900, 1, 0),
        ]
    );
    // The pcap holds the same four packets.
    let saved = live.finish().unwrap().unwrap();
    let (_, records) = pcap::read(&saved).unwrap();
    assert_eq!(records.count(), 4);

    // From a file: every packet of the connection, in the file's order.
    let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 2048, Resolution::Nanos).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(Timestamp::new(1_700_000_000, i as u32), f, f.len())
            .unwrap();
    }
    let file = w.into_inner().unwrap();
    let mut offline = Processor::new(config, None::<Vec<u8>>, 2048).unwrap();
    let mut lines = Vec::new();
    replay(
        &file,
        &mut offline,
        |l| {
            lines.push(l);
            Ok(())
        },
        None,
    )
    .unwrap();
    assert_eq!(
        psns(&lines),
        [(a, 0x500), (b, 0x900), (b, 0x500), (a, 0x900)]
    );
}
