//! Truncated and malformed packets: a clear error, never a panic.

mod common;

use common::*;
use roce::{
    decode_ethernet, decode_ethernet_snapped, decode_ip, decode_ip_snapped, decode_udp_payload,
    render, DecodeError, IcrcCheck, NotRoce, Opcode, PayloadExpectation,
};

fn samples() -> Vec<Pkt> {
    let mut v6_vlan = Pkt::new(0x65).payload(b"UD over IPv6 + VLAN").v6();
    v6_vlan.vlan = Some(7);
    vec![
        Pkt::new(0x0b).payload(&(0..=99).collect::<Vec<u8>>()),
        Pkt::new(0x11),
        Pkt::new(0x12),
        Pkt::new(0x13),
        Pkt::new(0x4b).payload(b"rd"),
        Pkt::new(0x81).payload(&[0; 16]),
        v6_vlan,
    ]
}

/// Bytes from the start of the frame to the end of the last extension header.
fn headers_end(pkt: &Pkt) -> usize {
    let op = Opcode::new(pkt.opcode).unwrap();
    let l2 = if pkt.vlan.is_some() { 18 } else { 14 };
    let l3 = if pkt.ipv6 { 40 } else { 20 };
    l2 + l3 + 8 + 12 + op.ext_headers_len()
}

#[test]
fn every_prefix_of_a_frame_is_a_truncation_error() {
    for pkt in samples() {
        let frame = pkt.frame();
        assert!(decode_ethernet(&frame).is_ok());
        for n in 0..frame.len() {
            match decode_ethernet(&frame[..n]) {
                Err(e @ DecodeError::Truncated { .. }) => {
                    let msg = e.to_string();
                    assert!(msg.starts_with("truncated "), "{msg}");
                    assert!(
                        msg.contains(&format!("only {}", n.saturating_sub(offset_of(&e)))),
                        "{msg}"
                    );
                }
                other => panic!(
                    "opcode {:#x}, prefix {n}/{}: {other:?}",
                    pkt.opcode,
                    frame.len()
                ),
            }
        }
    }
}

fn offset_of(e: &DecodeError) -> usize {
    match e {
        DecodeError::Truncated { offset, .. } => *offset,
        _ => 0,
    }
}

#[test]
fn every_prefix_of_a_datagram_is_a_truncation_error() {
    for pkt in samples() {
        let d = pkt.datagram();
        for n in 0..d.len() {
            let r = decode_ip(&d[..n]);
            assert!(
                matches!(r, Err(DecodeError::Truncated { .. })),
                "prefix {n}: {r:?}"
            );
        }
    }
}

#[test]
fn every_prefix_of_a_udp_payload_decodes_or_errs() {
    // Without the IP/UDP lengths a short UDP payload is indistinguishable from a shorter packet,
    // so some prefixes decode; what matters is that none panics and short ones fail.
    for pkt in samples() {
        let u = pkt.udp_payload();
        let op = Opcode::new(pkt.opcode).unwrap();
        for n in 0..u.len() {
            let r = decode_udp_payload(&u[..n]);
            if n < 12 + op.ext_headers_len() + 4 {
                assert!(r.is_err(), "prefix {n}: {r:?}");
            }
        }
        assert_eq!(
            decode_udp_payload(&u[..15]),
            Err(DecodeError::RoceTooShort { len: 15 })
        );
    }
}

#[test]
fn snapped_frames_decode_their_headers_and_flag_truncation() {
    for pkt in samples() {
        let frame = pkt.frame();
        let whole = decode_ethernet(&frame).unwrap();
        let end = headers_end(&pkt);
        for n in 0..frame.len() {
            let r = decode_ethernet_snapped(&frame[..n], frame.len());
            if n < end {
                assert!(
                    matches!(r, Err(DecodeError::Truncated { .. })),
                    "prefix {n}: {r:?}"
                );
                continue;
            }
            let p = r.unwrap_or_else(|e| panic!("opcode {:#x} prefix {n}: {e}", pkt.opcode));
            assert!(p.truncated, "prefix {n}");
            assert_eq!(p.icrc_check, IcrcCheck::Truncated);
            assert!(!p.icrc_ok);
            assert_eq!((p.icrc, p.bth, p.ext), (None, whole.bth, whole.ext));
            assert_eq!(p.payload_len, whole.payload_len);
            assert_eq!(p.payload, &whole.payload[..p.payload.len()]);
            assert!(render::text(&p, None).contains("missing (cut by the capture's snap length)"));
        }
        let p = decode_ethernet_snapped(&frame, frame.len() + 4).unwrap();
        assert!(!p.truncated && p.icrc_ok, "a cut FCS only");
    }
}

#[test]
fn snapped_datagrams_too() {
    let pkt = Pkt::new(0x0a).payload(&[9; 300]);
    let d = pkt.datagram();
    let p = decode_ip_snapped(&d[..100], d.len()).unwrap();
    assert!(p.truncated);
    assert_eq!(
        (p.payload.len(), p.payload_len),
        (100 - 20 - 8 - 12 - 16, 300)
    );
    assert!(decode_ip_snapped(&d[..50], d.len()).is_err());
}

#[test]
fn bad_ip_version() {
    let mut f = Pkt::new(0x04).frame();
    f[14] = 0x65;
    let e = decode_ethernet(&f).unwrap_err();
    assert_eq!(
        e,
        DecodeError::BadIpVersion {
            version: 6,
            expected: "4, per the ethertype",
            offset: 14
        }
    );
    assert_eq!(
        e.to_string(),
        "bad IP version 6 at offset 14 (expected 4, per the ethertype)"
    );
    let mut d = Pkt::new(0x04).datagram();
    d[0] = 0x55;
    assert_eq!(
        decode_ip(&d),
        Err(DecodeError::BadIpVersion {
            version: 5,
            expected: "4 or 6",
            offset: 0
        })
    );
}

#[test]
fn ihl_below_five() {
    let mut d = Pkt::new(0x04).datagram();
    d[0] = 0x44;
    let e = decode_ip(&d).unwrap_err();
    assert_eq!(e, DecodeError::BadIpv4HeaderLength { ihl: 4, offset: 0 });
    assert!(e.to_string().contains("IHL 4"));
}

#[test]
fn ip_total_length_inconsistent() {
    let mut d = Pkt::new(0x11).datagram();
    d[3] = 27; // total length 27 < 20 + 8
    assert!(matches!(
        decode_ip(&d),
        Err(DecodeError::BadIpLength {
            value: 27,
            minimum: 28,
            ..
        })
    ));
    let mut d = Pkt::new(0x11).datagram();
    d[3] += 4; // claims 4 bytes that are not there
    assert!(matches!(
        decode_ip(&d),
        Err(DecodeError::Truncated {
            layer: "IP datagram",
            ..
        })
    ));
}

#[test]
fn udp_length_inconsistent() {
    for delta in [-1i32, 1, -100] {
        let mut d = Pkt::new(0x11).datagram();
        let len = i32::from(u16::from_be_bytes([d[24], d[25]])) + delta;
        d[24..26].copy_from_slice(&(len as u16).to_be_bytes());
        let e = decode_ip(&d).unwrap_err();
        assert_eq!(
            e,
            DecodeError::UdpLengthMismatch {
                udp_length: len as u16,
                ip_payload: 28
            }
        );
        assert!(e.to_string().starts_with("UDP length"));
    }
}

#[test]
fn wrong_port_and_protocol() {
    let mut pkt = Pkt::new(0x04);
    pkt.dst_port = 4792;
    let e = decode_ethernet(&pkt.frame()).unwrap_err();
    assert_eq!(
        e,
        DecodeError::NotRoce(NotRoce::UdpPort {
            src: 49152,
            dst: 4792
        })
    );
    assert!(e.to_string().contains("4792"));

    let mut d = Pkt::new(0x04).datagram();
    d[9] = 6;
    assert_eq!(
        decode_ip(&d),
        Err(DecodeError::NotRoce(NotRoce::IpProtocol(6)))
    );
    let mut d = Pkt::new(0x04).v6().datagram();
    d[6] = 58;
    assert_eq!(
        decode_ip(&d),
        Err(DecodeError::NotRoce(NotRoce::IpProtocol(58)))
    );
}

#[test]
fn other_ethertypes_and_fragments() {
    let mut f = Pkt::new(0x04).frame();
    f[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(
        decode_ethernet(&f),
        Err(DecodeError::UnsupportedEthertype(0x0806))
    );
    f[12..14].copy_from_slice(&[0x89, 0x15]);
    assert_eq!(
        decode_ethernet(&f),
        Err(DecodeError::NotRoce(NotRoce::RoceV1))
    );

    let mut d = Pkt::new(0x04).datagram();
    d[6] = 0x00;
    d[7] = 0x10; // fragment offset 16
    assert_eq!(
        decode_ip(&d),
        Err(DecodeError::Fragmented {
            fragment_offset: 16,
            more_fragments: false
        })
    );
}

#[test]
fn bad_pad_count() {
    let mut ack = Pkt::new(0x11);
    ack.pad = Some(1);
    let e = decode_ethernet(&ack.frame()).unwrap_err();
    assert_eq!(
        e,
        DecodeError::BadPadCount {
            pad_count: 1,
            available: 0,
            opcode: "RC Acknowledge"
        }
    );
    assert_eq!(
        e.to_string(),
        "bad pad count 1: only 0 bytes between the RC Acknowledge headers and the ICRC"
    );

    let mut send = Pkt::new(0x04).payload(b"ab");
    send.pad = Some(3);
    assert!(matches!(
        decode_ethernet(&send.frame()),
        Err(DecodeError::BadPadCount {
            pad_count: 3,
            available: 2,
            ..
        })
    ));
}

#[test]
fn unknown_opcodes_are_named() {
    for code in [0x15u8, 0x1e, 0x2c, 0x66, 0x80, 0xc0, 0xff] {
        let mut pkt = Pkt::new(0x04).payload(&[0; 8]);
        pkt.opcode = code;
        let e = decode_ethernet(&pkt.frame()).unwrap_err();
        assert_eq!(e, DecodeError::UnknownOpcode(code));
        assert!(e.to_string().contains(&format!("0x{code:02x}")));
    }
}

#[test]
fn payload_where_the_opcode_allows_none_or_a_fixed_size() {
    let e = decode_ethernet(&Pkt::new(0x11).payload(&[1, 2, 3, 4]).frame()).unwrap_err();
    assert_eq!(
        e,
        DecodeError::BadPayloadLength {
            opcode: "RC Acknowledge",
            code: 0x11,
            expected: PayloadExpectation::Nothing,
            found: 4
        }
    );
    let e = decode_ethernet(&Pkt::new(0x81).payload(&[0; 8]).frame()).unwrap_err();
    assert!(matches!(
        e,
        DecodeError::BadPayloadLength {
            expected: PayloadExpectation::Exactly(16),
            found: 8,
            ..
        }
    ));
    assert_eq!(
        e.to_string(),
        "CNP (0x81) carries exactly 16 bytes but 8 bytes follow its headers"
    );
}

#[test]
fn headers_may_not_run_into_the_icrc() {
    // An RDMA READ Request whose RETH is cut short: the UDP length leaves room for 8 of its 16
    // bytes before the ICRC.
    let pkt = Pkt::new(0x0c).ext(vec![0; 8]);
    let e = decode_ethernet(&pkt.frame()).unwrap_err();
    assert_eq!(
        e,
        DecodeError::Truncated {
            layer: "RETH",
            offset: 54,
            needed: 16,
            available: 8
        }
    );
}

#[test]
fn corrupted_icrc_and_ip_checksum() {
    let pkt = Pkt::new(0x0a).payload(b"0123456789abcdef");
    let good = eth(&pkt).icrc.unwrap();
    let mut f = pkt.frame();
    let n = f.len();
    f[n - 1] ^= 0x80;
    let p = decode_ethernet(&f).unwrap();
    assert_eq!(p.icrc_check, IcrcCheck::Invalid { computed: good });
    assert!(!p.icrc_ok);
    assert!(render::text(&p, None).contains(&format!("BAD (expected 0x{good:08x})")));

    let mut f = pkt.frame();
    f[60] ^= 1; // a payload bit
    assert!(!decode_ethernet(&f).unwrap().icrc_ok);

    let mut f = pkt.frame();
    f[24] ^= 0xff; // the IPv4 checksum: masked out of the ICRC
    let p = decode_ethernet(&f).unwrap();
    assert!(p.icrc_ok);
    assert_eq!(
        p.ip.map(|ip| matches!(ip, roce::IpHeader::V4(h) if !h.checksum_ok)),
        Some(true)
    );
}

#[test]
fn empty_and_tiny_inputs() {
    assert!(matches!(
        decode_ethernet(&[]),
        Err(DecodeError::Truncated {
            layer: "Ethernet header",
            ..
        })
    ));
    assert!(matches!(
        decode_ip(&[]),
        Err(DecodeError::Truncated {
            layer: "IP header",
            ..
        })
    ));
    assert_eq!(
        decode_udp_payload(&[]),
        Err(DecodeError::RoceTooShort { len: 0 })
    );
    assert!(decode_ethernet_snapped(&[], 1500).is_err());
    assert!(decode_ip_snapped(&[0x45], usize::MAX).is_err());
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x5eed_0001);
    for _ in 0..20_000 {
        let len = rng.below(160);
        let buf = rng.bytes(len);
        let orig = len + rng.below(3000);
        let _ = decode_ethernet(&buf);
        let _ = decode_ip(&buf);
        let _ = decode_udp_payload(&buf);
        let _ = decode_ethernet_snapped(&buf, orig);
        let _ = decode_ip_snapped(&buf, orig);
    }
}

#[test]
fn mutated_valid_packets_never_panic() {
    let mut rng = Rng(0x5eed_0002);
    let frames: Vec<Vec<u8>> = Opcode::all().map(|op| packet_for(op).frame()).collect();
    let mut decoded = 0;
    for i in 0..20_000 {
        let mut f = frames[i % frames.len()].clone();
        for _ in 0..=rng.below(4) {
            let at = rng.below(f.len());
            f[at] = rng.byte();
        }
        f.truncate(f.len() - rng.below(8));
        for r in [
            decode_ethernet(&f),
            decode_ethernet_snapped(&f, f.len() + rng.below(64)),
        ] {
            match r {
                Ok(p) => {
                    decoded += 1;
                    let _ = render::text(&p, None);
                    let _ = render::json(&p, None);
                }
                Err(e) => {
                    let _ = render::json_error(&e, f.len(), None);
                }
            }
        }
    }
    assert!(
        decoded > 1000,
        "mutations should leave many packets decodable ({decoded})"
    );
}
