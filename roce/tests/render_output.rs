//! Text and JSON rendering.

mod common;

use common::*;
use roce::pcap::Timestamp;
use roce::{decode_ethernet_snapped, render, DecodeError};

fn write_only() -> Pkt {
    let mut pkt = Pkt::new(0x0a)
        .ext(reth(0x0000_7f00_0000_1000, 0x0000_1234, 1024))
        .payload(&(0..=255).cycle().take(1024).collect::<Vec<u8>>());
    pkt.ack_req = true;
    pkt
}

#[test]
fn text_of_an_rdma_write() {
    let p = eth(&write_only());
    let text = render::text(&p, Some(Timestamp::new(1_700_000_000, 1)));
    println!("{text}");
    let expected = "\
1700000000.000000001 10.77.0.2:49152 -> 10.77.0.1:4791 RC RDMA WRITE Only
  ETH  02:00:00:00:00:02 -> 02:00:00:00:00:01 type=0x0800
  IPv4 10.77.0.2 -> 10.77.0.1 dscp=26 ecn=ECT(0) ttl=64 id=0x1234 len=1084 df=1 csum=0xXCSUMX ok
  UDP  49152 -> 4791 len=1064 csum=0x0000
  BTH  opcode=0x0a (RC RDMA WRITE Only) se=0 m=0 pad=0 tver=0 pkey=0xffff fecn=0 becn=0 dqpn=0x000011 a=1 psn=0x83f247
  RETH va=0x00007f0000001000 rkey=0x00001234 len=1024
  DATA len=1024
       0000  00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f  |................|
       0010  10 11 12 13 14 15 16 17 18 19 1a 1b 1c 1d 1e 1f  |................|
       ... 992 more bytes
  ICRC 0xXICRCX ok";
    let Some(roce::IpHeader::V4(ip)) = p.ip else {
        panic!()
    };
    let expected = expected
        .replace("XCSUMX", &format!("{:04x}", ip.checksum))
        .replace("XICRCX", &format!("{:08x}", p.icrc.unwrap()));
    assert_eq!(text, expected);
}

#[test]
fn text_of_acks_naks_and_ascii_payloads() {
    let p = eth(&Pkt::new(0x11).ext(aeth(0x1f, 5)));
    assert!(render::text(&p, None).contains("\n  AETH syndrome=ACK credits=31 msn=5\n"));
    let p = eth(&Pkt::new(0x11).ext(aeth(0x2e, 6)));
    assert!(render::text(&p, None).contains("AETH syndrome=RNR-NAK timer=14 (1.28 ms) msn=6"));
    let p = eth(&Pkt::new(0x11).ext(aeth(0x60, 7)));
    assert!(render::text(&p, None).contains("AETH syndrome=NAK code=0 (PSN sequence error) msn=7"));

    let p = eth(&Pkt::new(0x04).payload(b"Hello, RDMA!"));
    let t = render::text(&p, None);
    assert!(
        t.starts_with("10.77.0.2:49152 -> 10.77.0.1:4791 RC SEND Only\n"),
        "{t}"
    );
    assert!(t.contains("|Hello, RDMA!|"), "{t}");
    assert!(!t.contains("more bytes"));

    let ud = [deth(0x11111111, 0x22), u32be(0x33)].concat();
    let t = render::text(&udp(&Pkt::new(0x65).ext(ud).payload(b"x")), None);
    assert!(
        t.starts_with("(UDP payload only) UD SEND only with Immediate\n"),
        "{t}"
    );
    assert!(
        t.contains("\n  DETH qkey=0x11111111 srcqp=0x000022\n  ImmDt 0x00000033\n"),
        "{t}"
    );
    assert!(t.ends_with("not checked (no IP header)"), "{t}");

    let mut v6 = Pkt::new(0x81).payload(&[0; 16]).v6();
    v6.vlan = Some(5);
    v6.byte4 = 0x40;
    let t = render::text(&eth(&v6), None);
    assert!(t.contains("vlan=5 pcp=3 dei=0"), "{t}");
    assert!(
        t.contains("IPv6 fe80::2 -> fe80::1 dscp=26 ecn=ECT(0) flow=0x00000 hlim=64 plen=40"),
        "{t}"
    );
    assert!(t.contains("becn=1") && t.contains("RSVD len=16"), "{t}");
}

#[test]
fn json_lines() {
    let p = eth(&write_only());
    let line = render::json(&p, Some(Timestamp::new(5, 6)));
    assert!(!line.contains('\n'));
    let v: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["ts"], "5.000000006");
    assert_eq!(v["ethernet"]["src"], "02:00:00:00:00:02");
    assert_eq!(v["ip"]["version"], "4");
    assert_eq!(v["ip"]["src"], "10.77.0.2");
    assert_eq!(v["ip"]["ecn"], "ECT(0)");
    assert_eq!(v["udp"]["dst_port"], 4791);
    assert_eq!(v["bth"]["opcode"]["code"], 10);
    assert_eq!(v["bth"]["opcode"]["name"], "RC RDMA WRITE Only");
    assert_eq!(v["bth"]["dest_qp"], 0x11);
    assert_eq!(v["bth"]["psn"], 0x83f247);
    assert_eq!(v["ext"]["reth"]["va"], "0x00007f0000001000");
    assert_eq!(v["ext"]["reth"]["dma_len"], 1024);
    assert!(v["ext"].get("aeth").is_none());
    assert_eq!(v["payload_len"], 1024);
    assert_eq!(v["payload"].as_str().map(str::len), Some(2048));
    assert_eq!(v["icrc_check"]["status"], "valid");
    assert_eq!(v["icrc_ok"], true);

    let v: serde_json::Value = serde_json::from_str(&render::json(
        &eth(&Pkt::new(0x11).ext(aeth(0x62, 9))),
        None,
    ))
    .unwrap();
    assert!(v.get("ts").is_none());
    assert_eq!(v["ext"]["aeth"]["syndrome"]["type"], "NAK");
    assert_eq!(
        v["ext"]["aeth"]["syndrome"]["reason"],
        "remote access error"
    );
    assert_eq!(v["ext"]["aeth"]["msn"], 9);
}

#[test]
fn json_errors() {
    let frame = write_only().frame();
    let e = decode_ethernet_snapped(&frame[..40], frame.len()).unwrap_err();
    let v: serde_json::Value =
        serde_json::from_str(&render::json_error(&e, frame.len(), None)).unwrap();
    assert_eq!(v["kind"], "truncated");
    assert_eq!(v["len"], frame.len());
    assert_eq!(
        v["error"],
        "truncated UDP header: need 8 bytes at offset 34, only 6 available"
    );
    assert_eq!(v["detail"]["Truncated"]["layer"], "UDP header");
    let v: serde_json::Value = serde_json::from_str(&render::json_error(
        &DecodeError::UnknownOpcode(0x15),
        60,
        Some(Timestamp::new(1, 0)),
    ))
    .unwrap();
    assert_eq!(
        (v["kind"].as_str(), v["ts"].as_str()),
        (Some("unknown_opcode"), Some("1.000000000"))
    );
}

/// The default of `rdma-capture`: one line a packet, with what identifies it (QP, PSN), every
/// extension header's fields, the payload length and the ICRC verdict.
#[test]
fn one_line_per_packet() {
    let p = eth(&write_only());
    let line = render::line(&p, Some(Timestamp::new(1_700_000_000, 1)));
    assert_eq!(
        line,
        "1700000000.000000001 10.77.0.2:49152 -> 10.77.0.1:4791 RC RDMA WRITE Only \
         dqpn=0x000011 psn=0x83f247 RETH va=0x00007f0000001000 rkey=0x00001234 len=1024 \
         data=1024 icrc=ok"
    );
    assert!(!line.contains('\n'));

    let frame = write_only().frame();
    let cut = decode_ethernet_snapped(&frame[..100], frame.len()).unwrap();
    assert!(render::line(&cut, None).ends_with(" data=1024 captured=30 icrc=cut"));

    let mut bad = frame.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    let p = roce::decode_ethernet(&bad).unwrap();
    assert!(render::line(&p, None).ends_with(" icrc=BAD"));
}

#[test]
fn text_shows_the_cooked_header_and_hex_dumps_pad_the_last_line() {
    use roce::sll::{LinuxSll, PacketType, SllVersion};

    let pkt = Pkt::new(0x11).ext(aeth(0x1f, 5));
    let header = LinuxSll::ethernet(SllVersion::V2, PacketType::Host, 4, pkt.src_mac, 0x0800);
    let mut record = header.to_bytes();
    record.extend(pkt.datagram());
    let p = roce::decode_sll_snapped(&record, record.len(), SllVersion::V2).unwrap();
    let text = render::text(&p, None);
    assert!(
        text.contains("\n  SLL2 In if=4 hatype=1 addr=02:00:00:00:00:02 proto=0x0800\n  IPv4 "),
        "{text}"
    );
    assert!(!text.contains("\n  ETH "), "{text}");

    let dump = render::hex_dump(&record[..20], 4);
    assert_eq!(
        dump,
        "    0000  08 00 00 00 00 00 00 04 00 01 00 06 02 00 00 00  |................|\n    \
         0010  00 02 00 00                                      |....|"
    );
    assert_eq!(render::hex_dump(&[], 2), "");
}
