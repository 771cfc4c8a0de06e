//! Following a QP through a synthetic RC conversation, and the capture summary.

mod common;

use common::*;
use telemetry_ebpf::decode::follow::{FollowConfig, Follower, PsnEvent, Stream};
use telemetry_ebpf::decode::stats::Stats;
use telemetry_ebpf::decode::{decode_ethernet, Packet};

const A: [u8; 4] = [10, 0, 0, 1];
const B: [u8; 4] = [10, 0, 0, 2];
const QP_A: u32 = 0x000100; // requester on A
const QP_B: u32 = 0x000200; // responder on B

/// A request from A's QP to B's QP.
fn req(code: u8, psn: u32) -> Pkt {
    let mut p = Pkt::new(code).dqpn(QP_B).psn(psn);
    if matches!(code, 0x04 | 0x0a) {
        p = p.payload(b"data");
    }
    p.src_ip4 = A;
    p.dst_ip4 = B;
    p.src_port = 0xc100;
    p
}

/// A response from B's QP to A's QP.
fn resp(code: u8, psn: u32, syndrome: u8) -> Pkt {
    let mut p = Pkt::new(code).dqpn(QP_A).psn(psn);
    if code == 0x11 {
        p = p.ext(aeth(syndrome, psn));
    } else {
        p = p.payload(&[0; 1024]);
    }
    p.src_ip4 = B;
    p.dst_ip4 = A;
    p.src_port = 0xc200;
    p
}

fn conversation() -> Vec<Pkt> {
    let read = |psn| req(0x0c, psn).ext(reth(0x1000, 7, 4096));
    vec![
        req(0x0a, 0xfffffe),        // WRITE Only
        req(0x0a, 0xffffff),        // WRITE Only
        resp(0x11, 0xffffff, 0x1f), // ACK coalescing both
        read(0),                    // READ of 4 packets at 1024 MTU: PSNs 0..=3
        resp(0x0d, 0, 0),           // READ Response First
        resp(0x0e, 1, 0),
        resp(0x0e, 2, 0),
        resp(0x0f, 3, 0),    // READ Response Last
        req(0x04, 4),        // SEND
        req(0x04, 6),        // SEND, PSN 5 lost on the wire
        resp(0x11, 5, 0x60), // NAK PSN sequence error, expecting 5
        req(0x04, 5),        // go-back-N: 5, 6
        req(0x04, 6),
        req(0x04, 6),        // a duplicate
        resp(0x11, 6, 0x1f), // ACK
    ]
}

fn decode_all(pkts: &[Pkt]) -> Vec<Packet<'static>> {
    pkts.iter().map(eth).collect()
}

#[test]
fn follows_both_directions_of_a_qp() {
    let mut pkts = conversation();
    // An unrelated QP pair between the same hosts, with its own random PSNs.
    pkts.insert(3, {
        let mut p = req(0x04, 0x123456).dqpn(0x300);
        p.src_port = 0xc300;
        p
    });
    pkts.insert(5, {
        let mut p = resp(0x11, 0x123456, 0x1f).dqpn(0x400);
        p.src_port = 0xc400;
        p
    });

    let mut f = Follower::new(FollowConfig {
        qpn: Some(QP_B),
        path_mtu: Some(1024),
    });
    let obs: Vec<_> = decode_all(&pkts).iter().map(|p| f.observe(p)).collect();

    let to_b: Vec<_> = obs
        .iter()
        .filter(|o| o.flow.dest_qp == QP_B)
        .map(|o| (o.psn, o.event))
        .collect();
    assert_eq!(
        to_b,
        [
            (0xfffffe, PsnEvent::First),
            (0xffffff, PsnEvent::InOrder),
            (0, PsnEvent::InOrder),
            (4, PsnEvent::InOrder), // after the READ's 4 reserved PSNs
            (
                6,
                PsnEvent::Gap {
                    expected: 5,
                    missing: 1
                }
            ),
            (5, PsnEvent::Retransmission { highest: 6 }),
            (6, PsnEvent::Retransmission { highest: 6 }),
            (6, PsnEvent::Duplicate),
        ]
    );
    let to_a: Vec<_> = obs
        .iter()
        .filter(|o| o.flow.dest_qp == QP_A)
        .map(|o| (o.psn, o.event))
        .collect();
    assert_eq!(
        to_a,
        [
            (0xffffff, PsnEvent::First),
            (0, PsnEvent::InOrder),
            (1, PsnEvent::InOrder),
            (2, PsnEvent::InOrder),
            (3, PsnEvent::InOrder),
            (5, PsnEvent::Coalesced { skipped: 1 }),
            (6, PsnEvent::InOrder),
        ]
    );
    // The reverse direction is followed from the ACK that answered a request to QP B.
    assert!(obs
        .iter()
        .filter(|o| o.flow.dest_qp == QP_A)
        .all(|o| o.followed));
    assert!(obs
        .iter()
        .filter(|o| o.flow.dest_qp >= 0x300)
        .all(|o| !o.followed));

    let summaries: Vec<_> = f.summaries().collect();
    assert_eq!(summaries.len(), 2, "{summaries:?}");
    let (_, s_b) = summaries
        .iter()
        .find(|(k, _)| k.dest_qp == QP_B)
        .copied()
        .unwrap();
    assert_eq!(
        (s_b.first_psn, s_b.last_psn, s_b.highest_psn, s_b.packets),
        (0xfffffe, 6, 6, 8)
    );
    assert_eq!(
        (s_b.gaps, s_b.missing, s_b.duplicates, s_b.retransmissions),
        (1, 1, 1, 2)
    );
    let (k_b, _) = summaries.iter().find(|(k, _)| k.dest_qp == QP_B).unwrap();
    assert_eq!(k_b.stream, Stream::Requests);
    let (k_a, s_a) = summaries
        .iter()
        .find(|(k, _)| k.dest_qp == QP_A)
        .copied()
        .unwrap();
    assert_eq!(
        k_a.src.map(|s| s.to_string()),
        Some("10.0.0.2:49664".into())
    );
    assert_eq!(k_a.stream, Stream::Responses);
    assert_eq!(
        (s_a.packets, s_a.naks, s_a.coalesced, s_a.gaps),
        (7, 1, 1, 0)
    );
}

#[test]
fn without_a_filter_every_flow_is_followed() {
    let mut f = Follower::new(FollowConfig::default());
    for p in decode_all(&conversation()) {
        assert!(f.observe(&p).followed);
    }
    assert_eq!(f.summaries().count(), 2);
    // Without the MTU, the READ may reserve up to 4096/256 PSNs: 4 is still in order.
    let mut f = Follower::new(FollowConfig {
        qpn: None,
        path_mtu: None,
    });
    let events: Vec<_> = decode_all(&conversation())
        .iter()
        .map(|p| f.observe(p).event)
        .collect();
    assert_eq!(events[8], PsnEvent::InOrder);
}

#[test]
fn stats_over_the_conversation() {
    let mut stats = Stats::default();
    let pkts = conversation();
    for pkt in &pkts {
        let f = pkt.frame();
        stats.record(&decode_ethernet(&f), f.len());
    }
    let mut bad = pkts[0].frame();
    let n = bad.len();
    bad[n - 1] ^= 1;
    stats.record(&decode_ethernet(&bad), n);
    stats.record(&decode_ethernet(&bad[..30]), 30);
    stats.record(&decode_ethernet(&[0u8; 64]), 64);

    assert_eq!(stats.total.packets, pkts.len() as u64 + 3);
    assert_eq!(stats.by_opcode["RC RDMA WRITE Only"].packets, 3);
    assert_eq!(stats.by_opcode["RC Acknowledge"].packets, 3);
    assert_eq!(stats.by_opcode["RC SEND Only"].packets, 5);
    assert_eq!(
        stats.by_opcode["RC RDMA READ response Middle"].bytes,
        2 * (14 + 20 + 8 + 12 + 1024 + 4)
    );
    assert_eq!((stats.bad_icrc, stats.naks, stats.decode_errors), (1, 1, 2));
    assert_eq!(stats.errors_by_kind["truncated"], 1);
    assert_eq!(stats.errors_by_kind["unsupported_ethertype"], 1);
    let text = stats.to_string();
    assert!(text.starts_with("18 frames, "), "{text}");
    assert!(text.contains("bad ICRC 1"), "{text}");
    let json = serde_json::to_value(&stats).unwrap();
    assert_eq!(json["by_opcode"]["RC SEND Only"]["packets"], 5);
}

/// The race the lab met: when each side of a connection starts with a SEND, the peer's first
/// request can reach the wire before anything addressed to the followed QP, so nothing pairs
/// its direction yet. Following QP B must still show it: live, once the pairing response
/// arrives; from a file, in the file's order.
#[test]
fn the_peers_request_before_the_first_pairing_is_shown_not_lost() {
    use telemetry_ebpf::capture::offline::replay;
    use telemetry_ebpf::capture::processor::{Output, Processor, ProcessorConfig};
    use telemetry_ebpf::capture::record::{Record, Source};
    use telemetry_ebpf::decode::pcap::{LinkType, PcapWriter, Resolution, Timestamp};

    // B's confirmation SEND to A leaves first; then A's SEND to B; then the ACKs.
    let from_b = |code: u8, psn: u32| {
        let mut p = resp(code, psn, 0x1f);
        if code == 0x04 {
            p = Pkt::new(0x04).dqpn(QP_A).psn(psn).payload(b"token");
            (p.src_ip4, p.dst_ip4, p.src_port) = (B, A, 0xc200);
        }
        p
    };
    let unrelated = {
        let mut p = req(0x04, 0x777).dqpn(0x300);
        p.src_port = 0xc300;
        p
    };
    let pkts = [
        from_b(0x04, 0x500),                 // to QP A: B's first request, unpaired
        unrelated.clone(),                   // to QP 0x300: another QP pair, never shown
        req(0x04, 0x900),                    // to QP B: A's first request
        req(0x11, 0x500).ext(aeth(0x1f, 1)), // to QP B: A's ACK of B's SEND
        from_b(0x11, 0x900),                 // to QP A: B's ACK of A's SEND
    ];
    let frames: Vec<Vec<u8>> = pkts.iter().map(Pkt::frame).collect();
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
    let (_, records) = telemetry_ebpf::decode::pcap::read(&saved).unwrap();
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
