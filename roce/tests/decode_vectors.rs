//! Byte vectors for every header type and opcode class, decoded field by field.

mod common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use common::*;
use roce::{
    decode_ethernet, AethSyndrome, Deth, Ecn, ExtHeaderKind, Feth, IcrcCheck, IpHeader, NakCode,
    Opcode, Rdeth, Reth, Transport, VlanTag, XrcEth,
};

/// A CNP captured on a ConnectX-4 Lx (scapy `test/contrib/roce.uts`, "RoCE CNP captured on
/// ConnectX-4 Lx"); its ICRC bytes `82 fd 00 2a` were computed by the NIC.
const CX4_CNP_FRAME: [u8; 74] = [
    0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00, 0x45, 0xc2,
    0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00,
    0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff, 0xff, 0x40, 0x00,
    0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x82, 0xfd,
    0x00, 0x2a,
];

/// scapy's "RoCE layer" test packet (`test/contrib/roce.uts`): a UC SEND Only with MigReq and
/// two pad bytes; scapy computes IPv4 checksum 0xb4d5, UDP checksum 0xaca2, ICRC `78 f3 53 f3`.
const SCAPY_UC_SEND_FRAME: [u8; 78] = [
    0x24, 0x8a, 0x07, 0xa8, 0xfa, 0x22, 0x24, 0x8a, 0x07, 0xa8, 0xfa, 0x22, 0x08, 0x00, 0x45, 0x01,
    0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8, 0x00, 0x07, 0xc0, 0xa8,
    0x00, 0x07, 0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2, 0x24, 0x60, 0xff, 0xff, 0x00, 0x00,
    0x00, 0xd3, 0x00, 0xcf, 0x17, 0x10, b'F', b'0', 0x81, 0x8b, 0xe2, 0x89, b'5', 0xd9, 0x0e, 0x9a,
    0x95, b'P', b'T', 0x01, 0xbe, 0x88, b'^', b'P', 0x00, 0x00, 0x78, 0xf3, 0x53, 0xf3,
];

#[test]
fn hardware_cnp_known_answer() {
    let p = decode_ethernet(&CX4_CNP_FRAME).unwrap();
    assert_eq!(p.opcode(), Opcode::CNP);
    assert_eq!(p.opcode().transport(), Transport::Cnp);
    let Some(IpHeader::V4(ip)) = p.ip else {
        panic!("not IPv4")
    };
    assert_eq!(
        (ip.src, ip.dst),
        (Ipv4Addr::new(10, 0, 17, 1), Ipv4Addr::new(10, 0, 18, 1))
    );
    assert_eq!((ip.dscp, ip.ecn, ip.checksum_ok), (48, Ecn::Ect0, true));
    assert_eq!(
        p.udp.map(|u| (u.src_port, u.dst_port, u.length)),
        Some((0, 4791, 40))
    );
    assert!(p.bth.becn && !p.bth.fecn);
    assert_eq!(
        (p.bth.dest_qp, p.bth.psn, p.bth.pkey),
        (0x000118, 0, 0xffff)
    );
    assert_eq!(p.payload, &[0u8; 16]);
    assert_eq!(p.icrc, Some(0x82fd002a), "as scapy and Wireshark show it");
    assert_eq!(p.icrc_check, IcrcCheck::Valid);
    assert!(p.icrc_ok);
}

#[test]
fn scapy_uc_send_known_answer() {
    let p = decode_ethernet(&SCAPY_UC_SEND_FRAME).unwrap();
    assert_eq!(p.opcode().name(), "UC SEND Only");
    assert_eq!(
        p.ethernet.map(|e| e.src.to_string()),
        Some("24:8a:07:a8:fa:22".into())
    );
    assert!(p.bth.migreq && !p.bth.se);
    assert_eq!(
        (p.bth.pad_count, p.bth.dest_qp, p.bth.psn),
        (2, 211, 13571856)
    );
    assert_eq!(
        p.payload,
        b"F0\x81\x8b\xe2\x895\xd9\x0e\x9a\x95PT\x01\xbe\x88^P"
    );
    assert_eq!(p.payload_len, 18);
    assert_eq!(p.udp.map(|u| u.checksum), Some(0xaca2));
    assert!(p.icrc_ok, "{:?}", p.icrc_check);
    assert_eq!(
        p.icrc,
        Some(0x78f353f3),
        "scapy: pkt[BTH].icrc == 0x78f353f3"
    );
    let crc = roce::icrc::from_wire(0x78f353f3u32.to_be_bytes());
    assert_eq!(roce::icrc::to_wire(crc), [0x78, 0xf3, 0x53, 0xf3]);
}

#[test]
fn rc_send_only_all_three_entry_points() {
    let pkt = Pkt::new(0x04).payload(b"ping");
    let f = eth(&pkt);
    assert_eq!(f.opcode(), Opcode::RC_SEND_ONLY);
    assert_eq!(f.payload, b"ping");
    assert_eq!(
        f.src().map(|a| a.to_string()),
        Some("10.77.0.2:49152".into())
    );
    assert_eq!(
        f.dst().map(|a| a.to_string()),
        Some("10.77.0.1:4791".into())
    );
    assert_eq!(f.ip.map(|ip| (ip.dscp(), ip.ecn())), Some((26, Ecn::Ect0)));
    assert!(f.icrc_ok);

    let i = ip(&pkt);
    assert!(i.ethernet.is_none());
    assert_eq!(
        (i.bth, i.payload, i.icrc_check),
        (f.bth, f.payload, IcrcCheck::Valid)
    );

    let u = udp(&pkt);
    assert!(u.ip.is_none() && u.udp.is_none());
    assert_eq!((u.bth, u.payload), (f.bth, f.payload));
    assert_eq!(u.icrc_check, IcrcCheck::NoIpHeader);
    assert!(!u.icrc_ok);
}

#[test]
fn bth_fields() {
    let mut pkt = Pkt::new(0x0a).payload(&[7; 5]);
    pkt.se = true;
    pkt.migreq = true;
    pkt.tver = 0;
    pkt.pkey = 0x8001;
    pkt.byte4 = 0x80;
    pkt.dqpn = 0xabcdef;
    pkt.ack_req = true;
    pkt.psn = 0xffffff;
    let p = eth(&pkt);
    let b = p.bth;
    assert!(b.se && b.migreq && b.fecn && !b.becn && b.ack_req);
    assert_eq!(
        (b.pad_count, b.pkey, b.dest_qp, b.psn),
        (3, 0x8001, 0xabcdef, 0xffffff)
    );
    assert_eq!((p.payload.len(), p.payload_len), (5, 5));
    assert!(p.icrc_ok, "FECN is masked out of the ICRC");
}

#[test]
fn rc_write_family() {
    let first = Pkt::new(0x06)
        .ext(reth(0x0000_7f12_3456_7000, 0xcafe_0001, 3000))
        .payload(&[1; 1024]);
    let p = eth(&first);
    assert_eq!(p.opcode().name(), "RC RDMA WRITE First");
    assert_eq!(
        p.ext.reth,
        Some(Reth {
            va: 0x0000_7f12_3456_7000,
            rkey: 0xcafe_0001,
            dma_len: 3000
        })
    );
    assert_eq!(p.payload.len(), 1024);

    let middle = eth(&Pkt::new(0x07).payload(&[2; 1024]));
    assert_eq!((middle.ext.reth, middle.payload_len), (None, 1024));

    let last_imm = Pkt::new(0x09).ext(u32be(0x0102_0304)).payload(&[3; 952]);
    let p = eth(&last_imm);
    assert_eq!(p.opcode().name(), "RC RDMA WRITE Last with Immediate");
    assert_eq!(p.ext.immdt.map(|i| i.0), Some(0x0102_0304));

    let only_imm = [reth(0x1000, 0x42, 6), u32be(0xffff_0000)].concat();
    let p = eth(&Pkt::new(0x0b).ext(only_imm).payload(b"abcdef"));
    assert_eq!(p.opcode().name(), "RC RDMA WRITE Only with Immediate");
    assert_eq!(
        p.ext.reth.map(|r| (r.va, r.rkey, r.dma_len)),
        Some((0x1000, 0x42, 6))
    );
    assert_eq!(p.ext.immdt.map(|i| i.0), Some(0xffff_0000));
    assert_eq!((p.payload, p.bth.pad_count), (&b"abcdef"[..], 2));
    assert!(p.icrc_ok);
}

#[test]
fn rc_read_request_and_responses() {
    let req = eth(&Pkt::new(0x0c).ext(reth(0x2000, 0x77, 8192)));
    assert_eq!(req.opcode().name(), "RC RDMA READ Request");
    assert_eq!(req.ext.reth.map(|r| r.dma_len), Some(8192));
    assert!(req.payload.is_empty());

    for (code, name, has_aeth) in [
        (0x0d, "RC RDMA READ response First", true),
        (0x0e, "RC RDMA READ response Middle", false),
        (0x0f, "RC RDMA READ response Last", true),
        (0x10, "RC RDMA READ response Only", true),
    ] {
        let pkt = Pkt::new(code).payload(&[0xab; 256]);
        let p = eth(&pkt);
        assert_eq!(p.opcode().name(), name);
        assert_eq!(p.ext.aeth.is_some(), has_aeth, "{name}");
        assert_eq!(p.payload_len, 256);
        assert!(p.icrc_ok);
    }
}

#[test]
fn acknowledge_syndromes() {
    let cases: [(u8, AethSyndrome); 9] = [
        (0x1f, AethSyndrome::Ack { credits: 31 }),
        (0x09, AethSyndrome::Ack { credits: 9 }),
        (0x2e, AethSyndrome::RnrNak { timer: 14 }),
        (0x60, AethSyndrome::Nak(NakCode::PsnSequenceError)),
        (0x61, AethSyndrome::Nak(NakCode::InvalidRequest)),
        (0x62, AethSyndrome::Nak(NakCode::RemoteAccessError)),
        (0x63, AethSyndrome::Nak(NakCode::RemoteOperationalError)),
        (0x64, AethSyndrome::Nak(NakCode::InvalidRdRequest)),
        (0x7f, AethSyndrome::Nak(NakCode::Reserved(31))),
    ];
    for (byte, syndrome) in cases {
        let p = eth(&Pkt::new(0x11).ext(aeth(byte, 0x00abcd)));
        assert_eq!(p.opcode().name(), "RC Acknowledge");
        let a = p.ext.aeth.unwrap();
        assert_eq!((a.syndrome, a.msn), (syndrome, 0x00abcd), "{byte:#x}");
        assert!(p.icrc_ok);
    }
}

#[test]
fn atomics() {
    let cas = atomic_eth(
        0x7f00_0000_0008,
        0x1111,
        0xaaaa_bbbb_cccc_dddd,
        0x0123_4567_89ab_cdef,
    );
    let p = eth(&Pkt::new(0x13).ext(cas));
    assert_eq!(p.opcode().name(), "RC CmpSwap");
    let a = p.ext.atomic_eth.unwrap();
    assert_eq!(
        (a.va, a.rkey, a.swap_or_add, a.compare),
        (
            0x7f00_0000_0008,
            0x1111,
            0xaaaa_bbbb_cccc_dddd,
            0x0123_4567_89ab_cdef
        )
    );

    let p = eth(&Pkt::new(0x14).ext(atomic_eth(8, 2, 5, 0)));
    assert_eq!(
        (p.opcode().name(), p.ext.atomic_eth.map(|a| a.swap_or_add)),
        ("RC FetchAdd", Some(5))
    );

    let ack = [aeth(0x00, 12), u64be(0xfeed_face_0000_0001)].concat();
    let p = eth(&Pkt::new(0x12).ext(ack));
    assert_eq!(p.opcode().name(), "RC ATOMIC Acknowledge");
    assert_eq!(p.ext.aeth.map(|a| a.msn), Some(12));
    assert_eq!(
        p.ext.atomic_ack_eth.map(|a| a.orig),
        Some(0xfeed_face_0000_0001)
    );

    let p = eth(&Pkt::new(0x1d).ext(reth(0x40, 9, 8)).payload(&u64be(77)));
    assert_eq!(p.opcode().name(), "RC ATOMIC WRITE");
    assert_eq!(p.payload, &u64be(77)[..]);
}

#[test]
fn send_with_invalidate_and_flush() {
    let p = eth(&Pkt::new(0x17).ext(u32be(0x0bad_cafe)).payload(b"x"));
    assert_eq!(p.opcode().name(), "RC SEND Only with Invalidate");
    assert_eq!(p.ext.ieth.map(|i| i.rkey), Some(0x0bad_cafe));
    let p = eth(&Pkt::new(0x16).ext(u32be(1)).payload(b"yz"));
    assert_eq!(p.opcode().name(), "RC SEND Last with Invalidate");

    let p = eth(&Pkt::new(0x1c).ext([feth(1, 2), reth(0x9000, 3, 4096)].concat()));
    assert_eq!(p.opcode().name(), "RC FLUSH");
    assert_eq!(
        p.ext.feth,
        Some(Feth {
            selectivity: 1,
            placement_type: 2
        })
    );
    assert_eq!(p.ext.reth.map(|r| r.dma_len), Some(4096));
}

#[test]
fn uc_class() {
    let p = eth(&Pkt::new(0x2a).ext(reth(0x5000, 0x99, 4)).payload(b"data"));
    assert_eq!(
        (p.opcode().name(), p.opcode().transport()),
        ("UC RDMA WRITE Only", Transport::Uc)
    );
    assert_eq!(p.ext.reth.map(|r| r.rkey), Some(0x99));
    let p = eth(&Pkt::new(0x25).ext(u32be(7)).payload(b"imm"));
    assert_eq!(
        (p.opcode().name(), p.ext.immdt.map(|i| i.0)),
        ("UC SEND Only with Immediate", Some(7))
    );
}

#[test]
fn rd_class_with_rdeth_and_deth() {
    let ext = [rdeth(0x00beef), deth(0x1234_5678, 0x00c0de)].concat();
    let p = eth(&Pkt::new(0x44).ext(ext).payload(b"rd!"));
    assert_eq!(p.opcode().name(), "RD SEND Only");
    assert_eq!(p.ext.rdeth, Some(Rdeth { eecnxt: 0x00beef }));
    assert_eq!(
        p.ext.deth,
        Some(Deth {
            qkey: 0x1234_5678,
            src_qp: 0x00c0de
        })
    );
    assert!(p.icrc_ok);

    let ext = [rdeth(1), deth(2, 3), reth(4, 5, 6), u32be(7)].concat();
    let p = eth(&Pkt::new(0x4b).ext(ext).payload(&[0; 6]));
    assert_eq!(p.opcode().name(), "RD RDMA WRITE Only with Immediate");
    assert_eq!(p.ext.reth.map(|r| r.dma_len), Some(6));
    assert_eq!(p.ext.immdt.map(|i| i.0), Some(7));

    let p = eth(&Pkt::new(0x51).ext([rdeth(9), aeth(0x61, 3)].concat()));
    assert_eq!(p.opcode().name(), "RD Acknowledge");
    assert_eq!(p.ext.deth, None);
    assert_eq!(
        p.ext.aeth.map(|a| a.syndrome),
        Some(AethSyndrome::Nak(NakCode::InvalidRequest))
    );

    let p = eth(&Pkt::new(0x55).ext([rdeth(9), deth(1, 2)].concat()));
    assert_eq!(p.opcode().name(), "RD RESYNC");
}

#[test]
fn ud_class_with_deth_and_immdt() {
    let p = eth(&Pkt::new(0x64)
        .ext(deth(0x1111_1111, 0x000001))
        .payload(&[0x55; 40]));
    assert_eq!(p.opcode(), Opcode::UD_SEND_ONLY);
    assert_eq!(
        p.ext.deth,
        Some(Deth {
            qkey: 0x1111_1111,
            src_qp: 1
        })
    );
    let ext = [deth(0x8001_0000, 0xffffff), u32be(0xabad_1dea)].concat();
    let p = eth(&Pkt::new(0x65).ext(ext).payload(b"mad").v6());
    assert_eq!(p.opcode().name(), "UD SEND only with Immediate");
    assert_eq!(p.ext.deth.map(|d| d.src_qp), Some(0xffffff));
    assert_eq!(p.ext.immdt.map(|i| i.0), Some(0xabad_1dea));
    assert!(p.icrc_ok);
}

#[test]
fn xrc_class() {
    let ext = [xrceth(0x0000aa), reth(0x10, 0x20, 3)].concat();
    let p = eth(&Pkt::new(0xaa).ext(ext).payload(b"xrc"));
    assert_eq!(p.opcode().name(), "XRC RDMA WRITE Only");
    assert_eq!(p.ext.xrceth, Some(XrcEth { xrcsrq: 0xaa }));
    let p = eth(&Pkt::new(0xb1).ext(aeth(0x1f, 1)));
    assert_eq!((p.opcode().name(), p.ext.xrceth), ("XRC Acknowledge", None));
}

#[test]
fn cnp_built_and_ecn_ce() {
    let mut pkt = Pkt::new(0x81).payload(&[0; 16]);
    pkt.byte4 = 0x40;
    pkt.tos = 0x03;
    let p = eth(&pkt);
    assert_eq!(p.opcode().name(), "CNP");
    assert!(p.bth.becn);
    assert_eq!(p.ip.map(|ip| ip.ecn()), Some(Ecn::Ce));
    assert!(p.icrc_ok);
}

#[test]
fn ipv6_and_vlan() {
    let mut pkt = Pkt::new(0x04).payload(b"v6 payload").v6();
    pkt.vlan = Some(100);
    pkt.tos = 0xb9; // DSCP 46, ECT(1)
    pkt.flow_label = 0xabcde;
    pkt.ttl = 3;
    let p = eth(&pkt);
    assert_eq!(
        p.ethernet.and_then(|e| e.vlan),
        Some(VlanTag {
            pcp: 3,
            dei: false,
            vid: 100
        })
    );
    let Some(IpHeader::V6(v6)) = p.ip else {
        panic!("not IPv6")
    };
    assert_eq!(
        (v6.dscp, v6.ecn, v6.flow_label, v6.hop_limit),
        (46, Ecn::Ect1, 0xabcde, 3)
    );
    assert_eq!(
        p.src().map(|a| a.ip()),
        Some(IpAddr::V6("fe80::2".parse::<Ipv6Addr>().unwrap()))
    );
    assert!(p.icrc_ok);
    assert!(ip(&pkt).icrc_ok);
}

#[test]
fn ethernet_padding_and_fcs_are_ignored() {
    let mut frame = Pkt::new(0x11).frame();
    assert_eq!(frame.len(), 62);
    frame.extend([0xde, 0xad, 0xbe, 0xef]); // an FCS
    let p = decode_ethernet(&frame).unwrap();
    assert_eq!(p.udp.map(|u| u.length), Some(28));
    assert!(p.icrc_ok);
}

#[test]
fn every_opcode_in_the_table_decodes_with_its_headers() {
    let mut seen = 0;
    for op in Opcode::all() {
        for v6 in [false, true] {
            let mut pkt = packet_for(op);
            pkt.ipv6 = v6;
            let p =
                decode_ethernet(Vec::leak(pkt.frame())).unwrap_or_else(|e| panic!("{op:?}: {e}"));
            assert_eq!(p.opcode(), op);
            let e = &p.ext;
            let present = [
                (ExtHeaderKind::Rdeth, e.rdeth.is_some()),
                (ExtHeaderKind::Deth, e.deth.is_some()),
                (ExtHeaderKind::XrcEth, e.xrceth.is_some()),
                (ExtHeaderKind::Feth, e.feth.is_some()),
                (ExtHeaderKind::Reth, e.reth.is_some()),
                (ExtHeaderKind::AtomicEth, e.atomic_eth.is_some()),
                (ExtHeaderKind::Aeth, e.aeth.is_some()),
                (ExtHeaderKind::AtomicAckEth, e.atomic_ack_eth.is_some()),
                (ExtHeaderKind::ImmDt, e.immdt.is_some()),
                (ExtHeaderKind::Ieth, e.ieth.is_some()),
            ];
            for (kind, is_present) in present {
                assert_eq!(
                    op.ext_headers().contains(&kind),
                    is_present,
                    "{op:?} {kind}"
                );
            }
            assert_eq!(p.payload, &default_payload(op)[..], "{op:?}");
            assert_eq!(p.icrc_check, IcrcCheck::Valid, "{op:?} v6={v6}");
            assert!(ip(&pkt).icrc_ok);
            assert_eq!(udp(&pkt).bth, p.bth);
            seen += 1;
        }
    }
    assert_eq!(seen, 2 * 86);
}
