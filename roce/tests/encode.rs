//! The encoder: its packets are the bytes the independent test builder (`common::Pkt`) writes,
//! and every packet it builds decodes back to the same fields with a valid ICRC.

mod common;

use std::net::{Ipv4Addr, Ipv6Addr};

use common::*;
use roce::{
    decode_ethernet, decode_ip, decode_udp_payload, Aeth, AethSyndrome, AtomicAckEth, AtomicEth,
    Bth, Deth, Ecn, EncodeError, ExtHeaderKind, ExtHeaders, Feth, IcrcCheck, Ieth, ImmDt, IpHeader,
    MacAddr, NakCode, Opcode, PacketBuilder, PayloadRule, Rdeth, Reth, VlanTag, XrcEth,
};

/// The typed form of `common::default_ext`: the same values, header by header.
fn default_ext_typed(op: Opcode) -> ExtHeaders {
    let mut e = ExtHeaders::default();
    for kind in op.ext_headers() {
        match kind {
            ExtHeaderKind::Rdeth => e.rdeth = Some(Rdeth { eecnxt: 0x000abc }),
            ExtHeaderKind::Deth => {
                e.deth = Some(Deth {
                    qkey: 0x8001_0000,
                    src_qp: 0x000123,
                })
            }
            ExtHeaderKind::XrcEth => e.xrceth = Some(XrcEth { xrcsrq: 0x000042 }),
            ExtHeaderKind::Feth => {
                e.feth = Some(Feth {
                    selectivity: 1,
                    placement_type: 3,
                })
            }
            ExtHeaderKind::Reth => {
                e.reth = Some(Reth {
                    va: 0x7f00_0000_1000,
                    rkey: 0x1234,
                    dma_len: 1024,
                })
            }
            ExtHeaderKind::AtomicEth => {
                e.atomic_eth = Some(AtomicEth {
                    va: 0x7f00_0000_2000,
                    rkey: 0x5678,
                    swap_or_add: 1,
                    compare: 0,
                })
            }
            ExtHeaderKind::Aeth => {
                e.aeth = Some(Aeth {
                    syndrome: AethSyndrome::Ack { credits: 31 },
                    msn: 5,
                })
            }
            ExtHeaderKind::AtomicAckEth => e.atomic_ack_eth = Some(AtomicAckEth { orig: 41 }),
            ExtHeaderKind::ImmDt => e.immdt = Some(ImmDt(0xdead_beef)),
            ExtHeaderKind::Ieth => e.ieth = Some(Ieth { rkey: 0x9abc }),
        }
    }
    e
}

/// A builder set to `common::Pkt::new`'s defaults.
fn like_pkt(pkt: &Pkt) -> PacketBuilder {
    let op = Opcode::new(pkt.opcode).unwrap();
    let mut b = PacketBuilder::new(op)
        .src_mac(MacAddr(pkt.src_mac))
        .dst_mac(MacAddr(pkt.dst_mac))
        .dscp(pkt.tos >> 2)
        .ecn(Ecn::from_bits(pkt.tos))
        .ttl(pkt.ttl)
        .ip_id(0x1234)
        .flow_label(pkt.flow_label)
        .src_port(pkt.src_port)
        .pkey(pkt.pkey)
        .dest_qp(pkt.dqpn)
        .psn(pkt.psn)
        .ext(default_ext_typed(op))
        .payload(pkt.payload.clone());
    b = if pkt.ipv6 {
        b.ipv6(pkt.src_ip6.into(), pkt.dst_ip6.into())
    } else {
        b.ipv4(pkt.src_ip4.into(), pkt.dst_ip4.into())
    };
    if let Some(vid) = pkt.vlan {
        b = b.vlan(VlanTag {
            pcp: 3,
            dei: false,
            vid,
        });
    }
    b
}

#[test]
fn every_opcode_is_byte_for_byte_what_the_reference_builder_writes() {
    for op in Opcode::all() {
        let v4 = packet_for(op);
        let mut v6_vlan = v4.clone().v6();
        v6_vlan.vlan = Some(42);
        for pkt in [v4, v6_vlan] {
            let b = like_pkt(&pkt);
            assert_eq!(b.frame().unwrap(), pkt.frame(), "{op:?} frame");
            assert_eq!(b.datagram().unwrap(), pkt.datagram(), "{op:?} datagram");
            let udp = b.udp_payload().unwrap();
            let reference = pkt.datagram();
            let ip_len = if pkt.ipv6 { 40 } else { 20 };
            assert_eq!(udp, reference[ip_len + 8..], "{op:?} UDP payload");
        }
    }
}

/// The doc examples' RC Acknowledge, as it was written out by hand before the encoder existed.
#[test]
fn doc_example_frame_is_the_hand_written_bytes() {
    let mut f = vec![
        0x02, 0, 0, 0, 0, 0x02, 0x02, 0, 0, 0, 0, 0x01, 0x08, 0x00, // Ethernet
        0x45, 0x02, 0x00, 0x30, 0x00, 0x01, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 77, 0, 1, 10,
        77, 0, 2, // IPv4, ECT(0); checksum filled below
        0xc0, 0x01, 0x12, 0xb7, 0x00, 0x1c, 0x00, 0x00, // UDP
        0x11, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x00, 0x83, 0xf2, 0x47, // BTH
        0x1f, 0x00, 0x00, 0x05, // AETH
    ];
    let csum = checksum(&f[14..34]);
    f[24..26].copy_from_slice(&csum.to_be_bytes());
    let crc = reference_icrc(&f[14..34], &f[34..]);
    f.extend(crc.to_le_bytes());
    assert_eq!(roce::doc_example_frame(), f);
}

/// Random values for every field the builder takes, within each field's width.
struct Fields {
    op: Opcode,
    ipv6: bool,
    vlan: Option<VlanTag>,
    macs: ([u8; 6], [u8; 6]),
    v4: (Ipv4Addr, Ipv4Addr),
    v6: (Ipv6Addr, Ipv6Addr),
    dscp: u8,
    ecn: Ecn,
    ttl: u8,
    id: u16,
    df: bool,
    flow: u32,
    port: u16,
    flags: [bool; 5], // se, migreq, fecn, becn, ack_req
    pkey: u16,
    qpn: u32,
    psn: u32,
    ext: ExtHeaders,
    payload: Vec<u8>,
}

fn random_fields(rng: &mut Rng) -> Fields {
    let ops: Vec<Opcode> = Opcode::all().collect();
    let op = ops[rng.below(ops.len())];
    let u32r = |rng: &mut Rng, bits: u32| (rng.next_u64() & ((1u64 << bits) - 1)) as u32;
    let mut ext = ExtHeaders::default();
    for kind in op.ext_headers() {
        match kind {
            ExtHeaderKind::Rdeth => {
                ext.rdeth = Some(Rdeth {
                    eecnxt: u32r(rng, 24),
                })
            }
            ExtHeaderKind::Deth => {
                ext.deth = Some(Deth {
                    qkey: u32r(rng, 32),
                    src_qp: u32r(rng, 24),
                })
            }
            ExtHeaderKind::XrcEth => {
                ext.xrceth = Some(XrcEth {
                    xrcsrq: u32r(rng, 24),
                })
            }
            ExtHeaderKind::Feth => {
                ext.feth = Some(Feth {
                    selectivity: u32r(rng, 2) as u8,
                    placement_type: u32r(rng, 4) as u8,
                })
            }
            ExtHeaderKind::Reth => {
                ext.reth = Some(Reth {
                    va: rng.next_u64(),
                    rkey: u32r(rng, 32),
                    dma_len: u32r(rng, 32),
                })
            }
            ExtHeaderKind::AtomicEth => {
                ext.atomic_eth = Some(AtomicEth {
                    va: rng.next_u64(),
                    rkey: u32r(rng, 32),
                    swap_or_add: rng.next_u64(),
                    compare: rng.next_u64(),
                })
            }
            ExtHeaderKind::Aeth => {
                ext.aeth = Some(Aeth {
                    syndrome: AethSyndrome::from_byte(rng.byte()),
                    msn: u32r(rng, 24),
                })
            }
            ExtHeaderKind::AtomicAckEth => {
                ext.atomic_ack_eth = Some(AtomicAckEth {
                    orig: rng.next_u64(),
                })
            }
            ExtHeaderKind::ImmDt => ext.immdt = Some(ImmDt(u32r(rng, 32))),
            ExtHeaderKind::Ieth => {
                ext.ieth = Some(Ieth {
                    rkey: u32r(rng, 32),
                })
            }
        }
    }
    let payload_len = match op.payload() {
        PayloadRule::None => 0,
        PayloadRule::Exactly(n) => n,
        // Mostly small, sometimes a full 4096-byte MTU.
        PayloadRule::Any if rng.below(16) == 0 => 4096,
        PayloadRule::Any => rng.below(300),
    };
    let mut v6 = [[0u8; 16]; 2];
    v6.iter_mut()
        .for_each(|a| a.copy_from_slice(&rng.bytes(16)));
    Fields {
        op,
        ipv6: rng.below(2) == 0,
        vlan: (rng.below(3) == 0).then(|| VlanTag {
            pcp: u32r(rng, 3) as u8,
            dei: rng.below(2) == 0,
            vid: u32r(rng, 12) as u16,
        }),
        macs: (
            rng.bytes(6).try_into().unwrap(),
            rng.bytes(6).try_into().unwrap(),
        ),
        v4: (u32r(rng, 32).into(), u32r(rng, 32).into()),
        v6: (v6[0].into(), v6[1].into()),
        dscp: u32r(rng, 6) as u8,
        ecn: Ecn::from_bits(rng.byte()),
        ttl: rng.byte(),
        id: u32r(rng, 16) as u16,
        df: rng.below(2) == 0,
        flow: u32r(rng, 20),
        port: u32r(rng, 16) as u16,
        flags: [(); 5].map(|_| rng.below(2) == 0),
        pkey: u32r(rng, 16) as u16,
        qpn: u32r(rng, 24),
        psn: u32r(rng, 24),
        ext,
        payload: rng.bytes(payload_len),
    }
}

fn builder(f: &Fields) -> PacketBuilder {
    let [se, migreq, fecn, becn, ack_req] = f.flags;
    let b = PacketBuilder::new(f.op)
        .src_mac(MacAddr(f.macs.0))
        .dst_mac(MacAddr(f.macs.1))
        .vlan(f.vlan)
        .dscp(f.dscp)
        .ecn(f.ecn)
        .ttl(f.ttl)
        .ip_id(f.id)
        .dont_fragment(f.df)
        .flow_label(f.flow)
        .src_port(f.port)
        .solicited(se)
        .migreq(migreq)
        .fecn(fecn)
        .becn(becn)
        .ack_req(ack_req)
        .pkey(f.pkey)
        .dest_qp(f.qpn)
        .psn(f.psn)
        .ext(f.ext)
        .payload(f.payload.clone());
    if f.ipv6 {
        b.ipv6(f.v6.0, f.v6.1)
    } else {
        b.ipv4(f.v4.0, f.v4.1)
    }
}

#[test]
fn random_packets_decode_back_to_their_fields() {
    let mut rng = Rng(0x00e1_c0de);
    for i in 0..4000 {
        let f = random_fields(&mut rng);
        let b = builder(&f);
        let frame = b.frame().unwrap_or_else(|e| panic!("#{i} {:?}: {e}", f.op));
        let p = decode_ethernet(&frame).unwrap_or_else(|e| panic!("#{i} {:?}: {e}", f.op));
        let ctx = format!("#{i} {:?}", f.op);

        assert_eq!(p.icrc_check, IcrcCheck::Valid, "{ctx}");
        assert!(!p.truncated, "{ctx}");
        let eth = p.ethernet.unwrap();
        assert_eq!(
            (eth.src.0, eth.dst.0, eth.vlan),
            (f.macs.0, f.macs.1, f.vlan)
        );
        match p.ip.unwrap() {
            IpHeader::V4(h) => {
                assert!(!f.ipv6, "{ctx}");
                assert_eq!((h.src, h.dst), f.v4, "{ctx}");
                assert_eq!((h.identification, h.dont_fragment), (f.id, f.df), "{ctx}");
                assert_eq!((h.ttl, h.header_len), (f.ttl, 20), "{ctx}");
                assert!(h.checksum_ok, "{ctx}");
            }
            IpHeader::V6(h) => {
                assert!(f.ipv6, "{ctx}");
                assert_eq!((h.src, h.dst), f.v6, "{ctx}");
                assert_eq!((h.flow_label, h.hop_limit), (f.flow, f.ttl), "{ctx}");
            }
        }
        let ip = p.ip.unwrap();
        assert_eq!((ip.dscp(), ip.ecn()), (f.dscp, f.ecn), "{ctx}");
        let udp = p.udp.unwrap();
        assert_eq!(
            (udp.src_port, udp.dst_port, udp.checksum),
            (f.port, 4791, 0)
        );
        let [se, migreq, fecn, becn, ack_req] = f.flags;
        assert_eq!(
            p.bth,
            Bth {
                opcode: f.op,
                se,
                migreq,
                pad_count: ((4 - f.payload.len() % 4) % 4) as u8,
                tver: 0,
                pkey: f.pkey,
                fecn,
                becn,
                resv6: 0,
                dest_qp: f.qpn,
                ack_req,
                resv7: 0,
                psn: f.psn,
            },
            "{ctx}"
        );
        assert_eq!(p.ext, f.ext, "{ctx}");
        assert_eq!(p.payload, &f.payload[..], "{ctx}");

        // The datagram and UDP payload are the frame's tail, and decode the same way.
        let datagram = b.datagram().unwrap();
        assert!(frame.ends_with(&datagram), "{ctx}");
        let from_ip = decode_ip(&datagram).unwrap();
        assert_eq!((from_ip.bth, from_ip.icrc_ok), (p.bth, true), "{ctx}");
        let udp_payload = b.udp_payload().unwrap();
        assert!(frame.ends_with(&udp_payload), "{ctx}");
        let from_udp = decode_udp_payload(&udp_payload).unwrap();
        assert_eq!((from_udp.ext, from_udp.icrc), (p.ext, p.icrc), "{ctx}");

        // And a decoded packet builds again into the same bytes.
        assert_eq!(
            PacketBuilder::from_packet(&p).frame().unwrap(),
            frame,
            "{ctx}"
        );
    }
}

#[test]
fn headers_must_match_the_opcode() {
    let mut rng = Rng(0x5eed);
    let all = [
        ExtHeaderKind::Rdeth,
        ExtHeaderKind::Deth,
        ExtHeaderKind::XrcEth,
        ExtHeaderKind::Feth,
        ExtHeaderKind::Reth,
        ExtHeaderKind::AtomicEth,
        ExtHeaderKind::Aeth,
        ExtHeaderKind::AtomicAckEth,
        ExtHeaderKind::ImmDt,
        ExtHeaderKind::Ieth,
    ];
    // One of every header, from the opcodes that carry them.
    let mut every = ExtHeaders::default();
    for code in [0x4b, 0x1c, 0x13, 0x12, 0x17, 0xa4] {
        // RD WRITE Only Imm, FLUSH, CmpSwap, ATOMIC ACK, SEND Only Inv, XRC SEND Only
        let e = default_ext_typed(Opcode::new(code).unwrap());
        every.rdeth = every.rdeth.or(e.rdeth);
        every.deth = every.deth.or(e.deth);
        every.xrceth = every.xrceth.or(e.xrceth);
        every.feth = every.feth.or(e.feth);
        every.reth = every.reth.or(e.reth);
        every.atomic_eth = every.atomic_eth.or(e.atomic_eth);
        every.aeth = every.aeth.or(e.aeth);
        every.atomic_ack_eth = every.atomic_ack_eth.or(e.atomic_ack_eth);
        every.immdt = every.immdt.or(e.immdt);
        every.ieth = every.ieth.or(e.ieth);
    }
    assert!(all.iter().all(|&k| is_set(&every, k)));
    for op in Opcode::all() {
        for _ in 0..20 {
            // A random subset of every header.
            let mut e = every;
            for kind in all {
                if rng.below(2) == 0 {
                    clear(&mut e, kind);
                }
            }
            let result = PacketBuilder::new(op)
                .ext(e)
                .payload(default_payload(op))
                .frame();
            let wanted = op.ext_headers();
            let has = |k: &ExtHeaderKind| is_set(&e, *k);
            let exact = all
                .iter()
                .filter(|k| has(k))
                .eq(all.iter().filter(|k| wanted.contains(k)));
            match result {
                Ok(frame) => {
                    assert!(exact, "{op:?} built with {e:?}");
                    assert!(decode_ethernet(&frame).unwrap().icrc_ok);
                }
                Err(EncodeError::MissingHeader { header, .. }) => {
                    assert!(wanted.contains(&header) && !has(&header), "{op:?}");
                }
                Err(EncodeError::UnexpectedHeader { header, .. }) => {
                    assert!(!wanted.contains(&header) && has(&header), "{op:?}");
                }
                Err(other) => panic!("{op:?}: {other}"),
            }
        }
    }
}

fn is_set(e: &ExtHeaders, kind: ExtHeaderKind) -> bool {
    match kind {
        ExtHeaderKind::Rdeth => e.rdeth.is_some(),
        ExtHeaderKind::Deth => e.deth.is_some(),
        ExtHeaderKind::XrcEth => e.xrceth.is_some(),
        ExtHeaderKind::Feth => e.feth.is_some(),
        ExtHeaderKind::Reth => e.reth.is_some(),
        ExtHeaderKind::AtomicEth => e.atomic_eth.is_some(),
        ExtHeaderKind::Aeth => e.aeth.is_some(),
        ExtHeaderKind::AtomicAckEth => e.atomic_ack_eth.is_some(),
        ExtHeaderKind::ImmDt => e.immdt.is_some(),
        ExtHeaderKind::Ieth => e.ieth.is_some(),
    }
}

fn clear(e: &mut ExtHeaders, kind: ExtHeaderKind) {
    match kind {
        ExtHeaderKind::Rdeth => e.rdeth = None,
        ExtHeaderKind::Deth => e.deth = None,
        ExtHeaderKind::XrcEth => e.xrceth = None,
        ExtHeaderKind::Feth => e.feth = None,
        ExtHeaderKind::Reth => e.reth = None,
        ExtHeaderKind::AtomicEth => e.atomic_eth = None,
        ExtHeaderKind::Aeth => e.aeth = None,
        ExtHeaderKind::AtomicAckEth => e.atomic_ack_eth = None,
        ExtHeaderKind::ImmDt => e.immdt = None,
        ExtHeaderKind::Ieth => e.ieth = None,
    }
}

#[test]
fn values_wider_than_their_field_are_refused() {
    let send = || PacketBuilder::new(Opcode::RC_SEND_ONLY);
    let field = |r: Result<Vec<u8>, EncodeError>| match r {
        Err(EncodeError::OutOfRange { field, .. }) => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(send().psn(0x100_0000).frame()), "PSN");
    assert_eq!(field(send().dest_qp(0x100_0000).frame()), "destination QP");
    assert_eq!(field(send().dscp(64).frame()), "DSCP");
    assert_eq!(field(send().flow_label(1 << 20).frame()), "IPv6 flow label");
    let tag = |pcp, vid| VlanTag {
        pcp,
        dei: false,
        vid,
    };
    assert_eq!(field(send().vlan(tag(8, 1)).frame()), "VLAN PCP");
    assert_eq!(field(send().vlan(tag(0, 4096)).frame()), "VLAN ID");
    let ud = PacketBuilder::new(Opcode::UD_SEND_ONLY);
    let deth = |src_qp| Deth { qkey: 0, src_qp };
    assert_eq!(field(ud.deth(deth(1 << 24)).frame()), "DETH source QP");
    let ack = |syndrome, msn| {
        PacketBuilder::new(Opcode::RC_ACKNOWLEDGE)
            .aeth(Aeth { syndrome, msn })
            .frame()
    };
    assert_eq!(
        field(ack(AethSyndrome::Ack { credits: 1 }, 1 << 24)),
        "AETH MSN"
    );
    for bad in [
        AethSyndrome::Ack { credits: 32 },
        AethSyndrome::RnrNak { timer: 40 },
        AethSyndrome::Nak(NakCode::Reserved(2)), // would decode as a remote access error
        AethSyndrome::Reserved(0x1f),            // would decode as an ACK
    ] {
        assert_eq!(ack(bad, 0), Err(EncodeError::Syndrome(bad)));
    }
    // Every syndrome byte is reachable.
    for b in 0..=255u8 {
        let s = AethSyndrome::from_byte(b);
        let frame = ack(s, 0).unwrap();
        assert_eq!(
            decode_ethernet(&frame).unwrap().ext.aeth.unwrap().syndrome,
            s
        );
    }
}

#[test]
fn forged_send_and_write_with_immediate_as_rdma_inject_builds_them() {
    // The attack in shared/notes/attacks.md: the next PSN of a victim's RC connection, from the
    // spoofed peer address and UDP source port, with a valid ICRC.
    let victim = PacketBuilder::new(Opcode::RC_SEND_ONLY)
        .src_mac(MacAddr([0x02, 0, 0, 0, 0, 0x02]))
        .dst_mac(MacAddr([0x02, 0, 0, 0, 0, 0x01]))
        .ipv4(Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 1))
        .src_port(0xe3a1)
        .dest_qp(17)
        .psn(0xff_ffff)
        .payload(*b"genuine");
    let captured_frame = victim.frame().unwrap();
    let captured = decode_ethernet(&captured_frame).unwrap();

    let next_psn = (captured.bth.psn + 1) & 0xff_ffff;
    let forged_send = PacketBuilder::from_packet(&captured)
        .psn(next_psn)
        .payload(*b"forged")
        .frame()
        .unwrap();
    let p = decode_ethernet(&forged_send).unwrap();
    assert_eq!(
        (p.bth.psn, p.bth.dest_qp, p.payload),
        (0, 17, &b"forged"[..])
    );
    assert_eq!((p.src(), captured.src()), (captured.src(), p.src()));
    assert_eq!(p.icrc_check, IcrcCheck::Valid);

    let forged_write = PacketBuilder::from_packet(&captured)
        .with_opcode(Opcode::RC_RDMA_WRITE_ONLY_IMM)
        .psn(next_psn)
        .reth(Reth {
            va: 0x7f12_3456_0000,
            rkey: 0x0bad_cafe,
            dma_len: 6,
        })
        .immdt(ImmDt(0x1234_5678))
        .payload(*b"forged")
        .frame()
        .unwrap();
    let p = decode_ethernet(&forged_write).unwrap();
    assert_eq!(p.opcode().name(), "RC RDMA WRITE Only with Immediate");
    assert_eq!(
        p.ext.reth.map(|r| (r.va, r.rkey)),
        Some((0x7f12_3456_0000, 0x0bad_cafe))
    );
    assert_eq!(p.ext.immdt, Some(ImmDt(0x1234_5678)));
    assert_eq!(p.icrc_check, IcrcCheck::Valid);
}
