//! Builds RoCEv2 test packets byte by byte.
//!
//! Lengths, the IPv4 checksum and the ICRC are computed here independently of the decoder
//! (the ICRC by masking a copy and running plain CRC-32 over it), so decoding these packets
//! cross-checks the decoder rather than repeating it.

#![allow(dead_code)] // each test binary uses a different subset

use roce::{decode_ethernet, decode_ip, decode_udp_payload, ExtHeaderKind, Opcode, Packet};

// Decoded packets borrow their buffer; tests leak it to keep assertions short.

/// Decodes `pkt.frame()`, panicking with the error.
pub fn eth(pkt: &Pkt) -> Packet<'static> {
    decode_ethernet(Vec::leak(pkt.frame())).unwrap_or_else(|e| panic!("{pkt:?}: {e}"))
}

/// Decodes `pkt.datagram()`.
pub fn ip(pkt: &Pkt) -> Packet<'static> {
    decode_ip(Vec::leak(pkt.datagram())).unwrap_or_else(|e| panic!("{pkt:?}: {e}"))
}

/// Decodes `pkt.udp_payload()`.
pub fn udp(pkt: &Pkt) -> Packet<'static> {
    decode_udp_payload(Vec::leak(pkt.udp_payload())).unwrap_or_else(|e| panic!("{pkt:?}: {e}"))
}

/// A RoCEv2 packet description; `frame()`, `datagram()` and `udp_payload()` serialize it.
#[derive(Clone, Debug)]
pub struct Pkt {
    pub ipv6: bool,
    pub vlan: Option<u16>,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src_ip4: [u8; 4],
    pub dst_ip4: [u8; 4],
    pub src_ip6: [u8; 16],
    pub dst_ip6: [u8; 16],
    /// IPv4 TOS / IPv6 traffic class.
    pub tos: u8,
    pub ttl: u8,
    pub flow_label: u32,
    pub src_port: u16,
    pub dst_port: u16,
    pub udp_checksum: u16,
    pub opcode: u8,
    pub se: bool,
    pub migreq: bool,
    /// `None`: pad the payload to a multiple of 4 and set PadCnt accordingly.
    pub pad: Option<u8>,
    pub tver: u8,
    pub pkey: u16,
    /// BTH byte 4 (FECN, BECN, resv6).
    pub byte4: u8,
    pub dqpn: u32,
    pub ack_req: bool,
    pub psn: u32,
    pub ext: Vec<u8>,
    pub payload: Vec<u8>,
}

impl Pkt {
    pub fn new(opcode: u8) -> Pkt {
        Pkt {
            ipv6: false,
            vlan: None,
            src_mac: [0x02, 0, 0, 0, 0, 0x02],
            dst_mac: [0x02, 0, 0, 0, 0, 0x01],
            src_ip4: [10, 77, 0, 2],
            dst_ip4: [10, 77, 0, 1],
            src_ip6: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            dst_ip6: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            tos: 0x6a, // DSCP 26, ECT(0)
            ttl: 64,
            flow_label: 0,
            src_port: 49152,
            dst_port: 4791,
            udp_checksum: 0,
            opcode,
            se: false,
            migreq: false,
            pad: None,
            tver: 0,
            pkey: 0xffff,
            byte4: 0,
            dqpn: 0x11,
            ack_req: false,
            psn: 0x83f247,
            ext: default_ext(opcode),
            payload: Vec::new(),
        }
    }

    pub fn ext(mut self, ext: Vec<u8>) -> Pkt {
        self.ext = ext;
        self
    }

    pub fn payload(mut self, payload: &[u8]) -> Pkt {
        self.payload = payload.to_vec();
        self
    }

    pub fn v6(mut self) -> Pkt {
        self.ipv6 = true;
        self
    }

    pub fn psn(mut self, psn: u32) -> Pkt {
        self.psn = psn;
        self
    }

    pub fn dqpn(mut self, dqpn: u32) -> Pkt {
        self.dqpn = dqpn;
        self
    }

    /// BTH onwards through the pad bytes (no ICRC).
    fn transport_body(&self) -> Vec<u8> {
        let pad = self.pad.unwrap_or(((4 - self.payload.len() % 4) % 4) as u8);
        let auto_pad = if self.pad.is_none() {
            usize::from(pad)
        } else {
            0
        };
        let mut b = vec![
            self.opcode,
            (u8::from(self.se) << 7)
                | (u8::from(self.migreq) << 6)
                | ((pad & 3) << 4)
                | (self.tver & 0xf),
        ];
        b.extend(self.pkey.to_be_bytes());
        b.push(self.byte4);
        b.extend(&self.dqpn.to_be_bytes()[1..]);
        b.push(u8::from(self.ack_req) << 7);
        b.extend(&self.psn.to_be_bytes()[1..]);
        b.extend(&self.ext);
        b.extend(&self.payload);
        b.extend(std::iter::repeat_n(0u8, auto_pad));
        b
    }

    /// UDP header onwards including the ICRC (zero: no IP header to compute it over).
    pub fn udp_payload(&self) -> Vec<u8> {
        let mut b = self.transport_body();
        b.extend([0; 4]);
        b
    }

    /// The IP datagram, with a correct IPv4 checksum and ICRC.
    pub fn datagram(&self) -> Vec<u8> {
        let mut udp = Vec::new();
        let body = self.transport_body();
        let udp_len = (8 + body.len() + 4) as u16;
        udp.extend(self.src_port.to_be_bytes());
        udp.extend(self.dst_port.to_be_bytes());
        udp.extend(udp_len.to_be_bytes());
        udp.extend(self.udp_checksum.to_be_bytes());
        udp.extend(&body);

        let mut ip = if self.ipv6 {
            let word0 = (6u32 << 28) | (u32::from(self.tos) << 20) | (self.flow_label & 0xfffff);
            let mut h = word0.to_be_bytes().to_vec();
            h.extend(udp_len.to_be_bytes());
            h.extend([17, self.ttl]);
            h.extend(self.src_ip6);
            h.extend(self.dst_ip6);
            h
        } else {
            let total = 20 + udp_len;
            let mut h = vec![0x45, self.tos];
            h.extend(total.to_be_bytes());
            h.extend([0x12, 0x34, 0x40, 0x00, self.ttl, 17, 0, 0]);
            h.extend(self.src_ip4);
            h.extend(self.dst_ip4);
            let c = checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            h
        };
        let crc = reference_icrc(&ip, &udp);
        ip.extend(udp);
        ip.extend(crc.to_le_bytes());
        ip
    }

    /// The Ethernet frame.
    pub fn frame(&self) -> Vec<u8> {
        let mut f = self.dst_mac.to_vec();
        f.extend(self.src_mac);
        if let Some(vid) = self.vlan {
            f.extend([0x81, 0x00]);
            f.extend((0x6000 | vid).to_be_bytes()); // PCP 3
        }
        f.extend(if self.ipv6 {
            [0x86, 0xdd]
        } else {
            [0x08, 0x00]
        });
        f.extend(self.datagram());
        f
    }
}

/// RFC 1071 checksum.
pub fn checksum(h: &[u8]) -> u16 {
    let mut sum: u32 = h
        .chunks(2)
        .map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0)))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The ICRC written out the long way: copy, mask, CRC-32.
pub fn reference_icrc(ip: &[u8], udp_to_pad: &[u8]) -> u32 {
    let mut buf = vec![0xffu8; 8];
    let mut ip = ip.to_vec();
    if ip[0] >> 4 == 4 {
        ip[1] = 0xff;
        ip[8] = 0xff;
        ip[10] = 0xff;
        ip[11] = 0xff;
    } else {
        ip[0] |= 0x0f;
        ip[1] = 0xff;
        ip[2] = 0xff;
        ip[3] = 0xff;
        ip[7] = 0xff;
    }
    buf.extend(ip);
    let mut t = udp_to_pad.to_vec();
    t[6] = 0xff;
    t[7] = 0xff;
    t[12] = 0xff;
    buf.extend(t);
    crc32fast::hash(&buf)
}

pub fn reth(va: u64, rkey: u32, len: u32) -> Vec<u8> {
    [
        &va.to_be_bytes()[..],
        &rkey.to_be_bytes(),
        &len.to_be_bytes(),
    ]
    .concat()
}

pub fn aeth(syndrome: u8, msn: u32) -> Vec<u8> {
    let mut v = msn.to_be_bytes();
    v[0] = syndrome;
    v.to_vec()
}

pub fn deth(qkey: u32, src_qp: u32) -> Vec<u8> {
    let mut v = qkey.to_be_bytes().to_vec();
    v.extend((src_qp & 0xffffff).to_be_bytes());
    v
}

pub fn rdeth(eecnxt: u32) -> Vec<u8> {
    (eecnxt & 0xffffff).to_be_bytes().to_vec()
}

pub fn xrceth(srq: u32) -> Vec<u8> {
    (srq & 0xffffff).to_be_bytes().to_vec()
}

pub fn feth(sel: u8, plt: u8) -> Vec<u8> {
    vec![0, 0, 0, ((sel & 3) << 4) | (plt & 0xf)]
}

pub fn atomic_eth(va: u64, rkey: u32, swap: u64, compare: u64) -> Vec<u8> {
    [
        &va.to_be_bytes()[..],
        &rkey.to_be_bytes(),
        &swap.to_be_bytes(),
        &compare.to_be_bytes(),
    ]
    .concat()
}

pub fn u32be(v: u32) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

pub fn u64be(v: u64) -> Vec<u8> {
    v.to_be_bytes().to_vec()
}

/// Plausible extension header bytes for every header the opcode needs (empty if unknown).
pub fn default_ext(opcode: u8) -> Vec<u8> {
    let Some(op) = Opcode::new(opcode) else {
        return Vec::new();
    };
    op.ext_headers()
        .iter()
        .flat_map(|k| match k {
            ExtHeaderKind::Rdeth => rdeth(0x000abc),
            ExtHeaderKind::Deth => deth(0x8001_0000, 0x000123),
            ExtHeaderKind::XrcEth => xrceth(0x000042),
            ExtHeaderKind::Feth => feth(1, 3),
            ExtHeaderKind::Reth => reth(0x7f00_0000_1000, 0x0000_1234, 1024),
            ExtHeaderKind::AtomicEth => atomic_eth(0x7f00_0000_2000, 0x5678, 1, 0),
            ExtHeaderKind::Aeth => aeth(0x1f, 5),
            ExtHeaderKind::AtomicAckEth => u64be(41),
            ExtHeaderKind::ImmDt => u32be(0xdead_beef),
            ExtHeaderKind::Ieth => u32be(0x0000_9abc),
        })
        .collect()
}

/// A payload the opcode allows: 16 reserved zero bytes for a CNP, 8 bytes for ATOMIC WRITE,
/// 13 bytes (so 3 pad bytes) for data-carrying opcodes, nothing otherwise.
pub fn default_payload(op: Opcode) -> Vec<u8> {
    use roce::PayloadRule;
    match op.payload() {
        PayloadRule::None => vec![],
        PayloadRule::Exactly(n) if op == Opcode::CNP => vec![0; n],
        PayloadRule::Exactly(n) => (0..n as u8).collect(),
        PayloadRule::Any => b"Hello, RDMA!\n".to_vec(),
    }
}

/// A valid packet for `op` with default headers and payload.
pub fn packet_for(op: Opcode) -> Pkt {
    Pkt::new(op.code()).payload(&default_payload(op))
}

/// splitmix64: a tiny deterministic PRNG for property tests.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64() as u8
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.byte()).collect()
    }
}
