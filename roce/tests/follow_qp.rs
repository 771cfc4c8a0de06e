//! Following a QP through a synthetic RC conversation, and the capture summary.
//!
//! How `rdma-capture` shows what the follower decides (held packets, file order) is tested in
//! rdma-capture's `tests/follow_capture.rs`.

mod common;

use common::*;
use roce::follow::{FollowConfig, Follower, PsnEvent, Stream};
use roce::stats::Stats;
use roce::{decode_ethernet, Packet};

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
        ..FollowConfig::default()
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
        ..FollowConfig::default()
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
