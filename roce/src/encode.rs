//! Building RoCEv2 packets: the decoder's inverse.
//!
//! [`PacketBuilder`] takes the fields a sender chooses — addresses, UDP source port, the BTH,
//! the extension headers the opcode implies, the payload — and computes the rest: IP and UDP
//! lengths, the IPv4 header checksum, the BTH pad count and pad bytes, and the ICRC (the same
//! [`icrc::compute`] the decoder checks against). The UDP checksum is 0, as RoCEv2 senders
//! leave it; reserved bits are 0.
//!
//! Whatever it builds decodes back to the same fields with
//! [`IcrcCheck::Valid`](crate::IcrcCheck::Valid): rather than emit a packet the decoder would
//! read differently, building fails with an [`EncodeError`] naming the field — a header the
//! opcode needs but was not set, one it does not carry, a payload it does not allow, a value
//! wider than its field.
//!
//! [`PacketBuilder::from_packet`] starts from a decoded packet, so a captured packet can be
//! changed and sent again.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::error::PayloadExpectation;
use crate::eth::{MacAddr, VlanTag, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN};
use crate::ext::{
    Aeth, AethSyndrome, AtomicAckEth, AtomicEth, Deth, ExtHeaders, Feth, Ieth, ImmDt, Rdeth, Reth,
    XrcEth,
};
use crate::icrc::{self, ICRC_LEN};
use crate::ip::{internet_checksum, Ecn, IpHeader, Ipv6, IPPROTO_UDP};
use crate::opcode::{ExtHeaderKind, Opcode, PayloadRule};
use crate::packet::Packet;
use crate::udp::{Udp, ROCE_V2_PORT};
use crate::Bth;

/// Length of an IPv4 header without options, the only kind built here.
const IPV4_HEADER_LEN: usize = 20;

/// Why a packet could not be built. Each variant names the field and how to fix it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The opcode implies an extension header that was not set.
    #[error("{opcode} needs a {header}: set it with PacketBuilder::{}", setter(*.header))]
    MissingHeader {
        /// The opcode's name.
        opcode: &'static str,
        /// The header it needs.
        header: ExtHeaderKind,
    },
    /// An extension header was set that the opcode does not carry.
    #[error(
        "{opcode} carries no {header}: leave it unset, or choose an opcode whose packets carry one"
    )]
    UnexpectedHeader {
        /// The opcode's name.
        opcode: &'static str,
        /// The header that was set.
        header: ExtHeaderKind,
    },
    /// The payload's length is not one the opcode allows.
    #[error("{opcode} carries {expected}, but the payload has {found} bytes")]
    Payload {
        /// The opcode's name.
        opcode: &'static str,
        /// What the opcode allows.
        expected: PayloadExpectation,
        /// The payload's length.
        found: usize,
    },
    /// A value does not fit the bits its field has on the wire.
    #[error("{field} 0x{value:x} does not fit its {bits} bits (at most 0x{:x})", (1u64 << .bits) - 1)]
    OutOfRange {
        /// The field, e.g. "PSN", "DETH source QP".
        field: &'static str,
        /// The value given.
        value: u64,
        /// The field's width.
        bits: u32,
    },
    /// The AETH syndrome has no byte that decodes back to it: credit counts and RNR timers are
    /// five bits, NAK codes 0–31, and a reserved syndrome must use a reserved bit pattern.
    #[error("AETH syndrome {0} cannot be encoded so that it decodes back to itself")]
    Syndrome(AethSyndrome),
    /// The packet is longer than an IP (and UDP) length field can describe.
    #[error(
        "{len} bytes of UDP datagram exceed the {max} an IP or UDP length field can describe: \
         send a shorter payload"
    )]
    TooLong {
        /// UDP header, BTH, extension headers, payload, pad and ICRC.
        len: usize,
        /// The largest that fits.
        max: usize,
    },
}

/// The builder method that sets an extension header, for error messages.
fn setter(kind: ExtHeaderKind) -> &'static str {
    match kind {
        ExtHeaderKind::Rdeth => "rdeth",
        ExtHeaderKind::Deth => "deth",
        ExtHeaderKind::XrcEth => "xrceth",
        ExtHeaderKind::Feth => "feth",
        ExtHeaderKind::Reth => "reth",
        ExtHeaderKind::AtomicEth => "atomic_eth",
        ExtHeaderKind::Aeth => "aeth",
        ExtHeaderKind::AtomicAckEth => "atomic_ack_eth",
        ExtHeaderKind::ImmDt => "immdt",
        ExtHeaderKind::Ieth => "ieth",
    }
}

/// The network layer's addresses; the version follows from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Addrs {
    V4(Ipv4Addr, Ipv4Addr),
    V6(Ipv6Addr, Ipv6Addr),
}

/// Builds a RoCEv2 packet field by field; see the [module documentation](self).
///
/// Every setter consumes and returns the builder; [`frame`](Self::frame),
/// [`datagram`](Self::datagram) and [`udp_payload`](Self::udp_payload) build from a borrowed
/// one, so it can be changed and built again.
///
/// Defaults: zero MACs and no VLAN tag, IPv4 `0.0.0.0 -> 0.0.0.0` with DSCP 0, Not-ECT, TTL
/// 64, identification 0 and Don't Fragment set (as rxe and RoCE NICs send), UDP source port
/// 49152, P_Key `0xffff`, destination QP 0, PSN 0, all flags clear, no payload.
///
/// An on-path forgery: the next RDMA WRITE with Immediate into a victim's QP.
///
/// ```
/// use std::net::Ipv4Addr;
/// use roce::{IcrcCheck, ImmDt, MacAddr, Opcode, PacketBuilder, Reth};
///
/// let frame = PacketBuilder::new(Opcode::RC_RDMA_WRITE_ONLY_IMM)
///     .dst_mac(MacAddr([0x02, 0, 0, 0, 0, 0x01]))
///     .ipv4(Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 1))
///     .src_port(49153)
///     .dest_qp(0x11)
///     .psn(0x83_f248)
///     .reth(Reth { va: 0x7f00_0000_1000, rkey: 0x1234, dma_len: 6 })
///     .immdt(ImmDt(0xdead_beef))
///     .payload(*b"forged")
///     .frame()?;
///
/// let pkt = roce::decode_ethernet(&frame)?;
/// assert_eq!((pkt.bth.dest_qp, pkt.bth.psn, pkt.payload), (0x11, 0x83_f248, &b"forged"[..]));
/// assert_eq!(pkt.icrc_check, IcrcCheck::Valid);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct PacketBuilder {
    src_mac: MacAddr,
    dst_mac: MacAddr,
    vlan: Option<VlanTag>,
    addrs: Addrs,
    dscp: u8,
    ecn: Ecn,
    ttl: u8,
    identification: u16,
    dont_fragment: bool,
    flow_label: u32,
    src_port: u16,
    opcode: Opcode,
    se: bool,
    migreq: bool,
    pkey: u16,
    fecn: bool,
    becn: bool,
    dest_qp: u32,
    ack_req: bool,
    psn: u32,
    ext: ExtHeaders,
    payload: Vec<u8>,
}

impl PacketBuilder {
    /// A packet of `opcode` with the defaults above. Set the extension headers the opcode
    /// implies ([`Opcode::ext_headers`]) before building.
    ///
    /// ```
    /// use roce::{Aeth, AethSyndrome, Opcode, PacketBuilder};
    ///
    /// let ack = PacketBuilder::new(Opcode::RC_ACKNOWLEDGE)
    ///     .aeth(Aeth { syndrome: AethSyndrome::Ack { credits: 31 }, msn: 5 })
    ///     .datagram()?;
    /// assert_eq!(ack.len(), 20 + 8 + 12 + 4 + 4);
    /// # Ok::<(), roce::EncodeError>(())
    /// ```
    pub fn new(opcode: Opcode) -> PacketBuilder {
        PacketBuilder {
            src_mac: MacAddr::default(),
            dst_mac: MacAddr::default(),
            vlan: None,
            addrs: Addrs::V4(Ipv4Addr::UNSPECIFIED, Ipv4Addr::UNSPECIFIED),
            dscp: 0,
            ecn: Ecn::NotEct,
            ttl: 64,
            identification: 0,
            dont_fragment: true,
            flow_label: 0,
            src_port: 0xc000,
            opcode,
            se: false,
            migreq: false,
            pkey: 0xffff,
            fecn: false,
            becn: false,
            dest_qp: 0,
            ack_req: false,
            psn: 0,
            ext: ExtHeaders::default(),
            payload: Vec::new(),
        }
    }

    /// A builder holding every field of a decoded packet, including its payload as captured.
    /// Layers the packet lacks keep the defaults of [`new`](Self::new).
    ///
    /// Building it unchanged gives the original bytes for packets that were not truncated and
    /// have no IPv4 options, a zero UDP checksum and zero reserved bits.
    ///
    /// ```
    /// use roce::PacketBuilder;
    /// # let frame = roce::doc_example_frame();
    ///
    /// let ack = roce::decode_ethernet(&frame)?;
    /// let again = PacketBuilder::from_packet(&ack).frame()?;
    /// assert_eq!(again, frame);
    /// let next = PacketBuilder::from_packet(&ack).psn(ack.bth.psn + 1).frame()?;
    /// assert_eq!(roce::decode_ethernet(&next)?.bth.psn, 0x83_f248);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn from_packet(p: &Packet<'_>) -> PacketBuilder {
        let mut b = PacketBuilder::new(p.bth.opcode);
        if let Some(e) = p.ethernet {
            (b.src_mac, b.dst_mac, b.vlan) = (e.src, e.dst, e.vlan);
        } else if let Some(mac) = p.cooked.and_then(|c| c.mac()) {
            // A cooked capture keeps only the sender's MAC.
            b.src_mac = mac;
        }
        match p.ip {
            Some(IpHeader::V4(h)) => {
                b.addrs = Addrs::V4(h.src, h.dst);
                (b.dscp, b.ecn, b.ttl) = (h.dscp, h.ecn, h.ttl);
                (b.identification, b.dont_fragment) = (h.identification, h.dont_fragment);
            }
            Some(IpHeader::V6(h)) => {
                b.addrs = Addrs::V6(h.src, h.dst);
                (b.dscp, b.ecn, b.ttl, b.flow_label) = (h.dscp, h.ecn, h.hop_limit, h.flow_label);
            }
            None => {}
        }
        if let Some(u) = p.udp {
            b.src_port = u.src_port;
        }
        let t = p.bth;
        (b.se, b.migreq, b.pkey, b.fecn, b.becn) = (t.se, t.migreq, t.pkey, t.fecn, t.becn);
        (b.dest_qp, b.ack_req, b.psn) = (t.dest_qp, t.ack_req, t.psn);
        b.ext = p.ext;
        b.payload = p.payload.to_vec();
        b
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        self.opcode
    }

    /// Changes the opcode; extension headers and payload stay as set.
    pub fn with_opcode(mut self, opcode: Opcode) -> Self {
        self.opcode = opcode;
        self
    }

    /// Ethernet source MAC.
    pub fn src_mac(mut self, mac: MacAddr) -> Self {
        self.src_mac = mac;
        self
    }

    /// Ethernet destination MAC.
    pub fn dst_mac(mut self, mac: MacAddr) -> Self {
        self.dst_mac = mac;
        self
    }

    /// An 802.1Q tag (PCP 3 bits, VID 12 bits), or `None` for an untagged frame.
    pub fn vlan(mut self, tag: impl Into<Option<VlanTag>>) -> Self {
        self.vlan = tag.into();
        self
    }

    /// IPv4 source and destination addresses.
    pub fn ipv4(mut self, src: Ipv4Addr, dst: Ipv4Addr) -> Self {
        self.addrs = Addrs::V4(src, dst);
        self
    }

    /// IPv6 source and destination addresses.
    pub fn ipv6(mut self, src: Ipv6Addr, dst: Ipv6Addr) -> Self {
        self.addrs = Addrs::V6(src, dst);
        self
    }

    /// The addresses' source, the one a forged packet spoofs.
    pub fn src_ip(&self) -> IpAddr {
        match self.addrs {
            Addrs::V4(s, _) => IpAddr::V4(s),
            Addrs::V6(s, _) => IpAddr::V6(s),
        }
    }

    /// The addresses' destination.
    pub fn dst_ip(&self) -> IpAddr {
        match self.addrs {
            Addrs::V4(_, d) => IpAddr::V4(d),
            Addrs::V6(_, d) => IpAddr::V6(d),
        }
    }

    /// DSCP (6 bits), the upper part of the IPv4 TOS / IPv6 traffic class.
    pub fn dscp(mut self, dscp: u8) -> Self {
        self.dscp = dscp;
        self
    }

    /// ECN codepoint, the lower two bits of the TOS / traffic class.
    pub fn ecn(mut self, ecn: Ecn) -> Self {
        self.ecn = ecn;
        self
    }

    /// IPv4 TTL or IPv6 hop limit.
    pub fn ttl(mut self, ttl: u8) -> Self {
        self.ttl = ttl;
        self
    }

    /// IPv4 identification (ignored for IPv6).
    pub fn ip_id(mut self, id: u16) -> Self {
        self.identification = id;
        self
    }

    /// IPv4 Don't Fragment flag (ignored for IPv6).
    pub fn dont_fragment(mut self, df: bool) -> Self {
        self.dont_fragment = df;
        self
    }

    /// IPv6 flow label (20 bits; ignored for IPv4).
    pub fn flow_label(mut self, label: u32) -> Self {
        self.flow_label = label;
        self
    }

    /// UDP source port (the destination is always 4791).
    pub fn src_port(mut self, port: u16) -> Self {
        self.src_port = port;
        self
    }

    /// BTH solicited event.
    pub fn solicited(mut self, se: bool) -> Self {
        self.se = se;
        self
    }

    /// BTH migration request.
    pub fn migreq(mut self, migreq: bool) -> Self {
        self.migreq = migreq;
        self
    }

    /// BTH partition key.
    pub fn pkey(mut self, pkey: u16) -> Self {
        self.pkey = pkey;
        self
    }

    /// BTH forward ECN.
    pub fn fecn(mut self, fecn: bool) -> Self {
        self.fecn = fecn;
        self
    }

    /// BTH backward ECN (set in CNPs).
    pub fn becn(mut self, becn: bool) -> Self {
        self.becn = becn;
        self
    }

    /// BTH destination QP (24 bits).
    pub fn dest_qp(mut self, qpn: u32) -> Self {
        self.dest_qp = qpn;
        self
    }

    /// BTH acknowledge request.
    pub fn ack_req(mut self, ack_req: bool) -> Self {
        self.ack_req = ack_req;
        self
    }

    /// BTH packet sequence number (24 bits; wrap it yourself: `(psn + 1) & 0xff_ffff`).
    pub fn psn(mut self, psn: u32) -> Self {
        self.psn = psn;
        self
    }

    /// Every extension header at once; the opcode decides which must be set.
    pub fn ext(mut self, ext: ExtHeaders) -> Self {
        self.ext = ext;
        self
    }

    /// The RDETH (RD opcodes).
    pub fn rdeth(mut self, h: Rdeth) -> Self {
        self.ext.rdeth = Some(h);
        self
    }

    /// The DETH (UD and RD requests).
    pub fn deth(mut self, h: Deth) -> Self {
        self.ext.deth = Some(h);
        self
    }

    /// The XRCETH (XRC requests).
    pub fn xrceth(mut self, h: XrcEth) -> Self {
        self.ext.xrceth = Some(h);
        self
    }

    /// The FETH (FLUSH).
    pub fn feth(mut self, h: Feth) -> Self {
        self.ext.feth = Some(h);
        self
    }

    /// The RETH (RDMA WRITE First/Only, READ Request, FLUSH, ATOMIC WRITE).
    pub fn reth(mut self, h: Reth) -> Self {
        self.ext.reth = Some(h);
        self
    }

    /// The AtomicETH (CmpSwap, FetchAdd).
    pub fn atomic_eth(mut self, h: AtomicEth) -> Self {
        self.ext.atomic_eth = Some(h);
        self
    }

    /// The AETH (Acknowledge, ATOMIC Acknowledge, READ Response First/Last/Only).
    pub fn aeth(mut self, h: Aeth) -> Self {
        self.ext.aeth = Some(h);
        self
    }

    /// The AtomicAckETH (ATOMIC Acknowledge).
    pub fn atomic_ack_eth(mut self, h: AtomicAckEth) -> Self {
        self.ext.atomic_ack_eth = Some(h);
        self
    }

    /// The immediate data ("with Immediate" opcodes).
    pub fn immdt(mut self, h: ImmDt) -> Self {
        self.ext.immdt = Some(h);
        self
    }

    /// The IETH ("with Invalidate" opcodes).
    pub fn ieth(mut self, h: Ieth) -> Self {
        self.ext.ieth = Some(h);
        self
    }

    /// The payload (pad bytes are added to a multiple of four). A CNP's payload is its 16
    /// reserved bytes; ATOMIC WRITE's is its 8-byte value.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = payload.into();
        self
    }

    /// The Ethernet frame: header (with the VLAN tag, if set), IP datagram. No FCS, and no
    /// padding to the 60-byte minimum: the NIC adds both when it sends the frame.
    ///
    /// ```
    /// use roce::{Opcode, PacketBuilder, VlanTag};
    ///
    /// let frame = PacketBuilder::new(Opcode::RC_SEND_ONLY)
    ///     .vlan(VlanTag { pcp: 3, dei: false, vid: 100 })
    ///     .payload(*b"hello")
    ///     .frame()?;
    /// let pkt = roce::decode_ethernet(&frame)?;
    /// assert_eq!(pkt.ethernet.and_then(|e| e.vlan).map(|v| v.vid), Some(100));
    /// assert!(pkt.icrc_ok);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn frame(&self) -> Result<Vec<u8>, EncodeError> {
        let datagram = self.datagram()?;
        let mut f = Vec::with_capacity(18 + datagram.len());
        f.extend_from_slice(&self.dst_mac.0);
        f.extend_from_slice(&self.src_mac.0);
        if let Some(tag) = self.vlan {
            let tci = (u16::from(tag.pcp) << 13) | (u16::from(tag.dei) << 12) | tag.vid;
            f.extend_from_slice(&ETHERTYPE_VLAN.to_be_bytes());
            f.extend_from_slice(&tci.to_be_bytes());
        }
        let ethertype = match self.addrs {
            Addrs::V4(..) => ETHERTYPE_IPV4,
            Addrs::V6(..) => ETHERTYPE_IPV6,
        };
        f.extend_from_slice(&ethertype.to_be_bytes());
        f.extend_from_slice(&datagram);
        Ok(f)
    }

    /// The IP datagram: IP header, UDP header, BTH, extension headers, payload, pad, ICRC.
    ///
    /// ```
    /// use std::net::Ipv6Addr;
    /// use roce::{Deth, ImmDt, Opcode, PacketBuilder};
    ///
    /// let ud = PacketBuilder::new(Opcode::new(0x65).unwrap()) // UD SEND only with Immediate
    ///     .ipv6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST)
    ///     .deth(Deth { qkey: 0x8001_0000, src_qp: 0x123 })
    ///     .immdt(ImmDt(7))
    ///     .datagram()?;
    /// assert!(roce::decode_ip(&ud)?.icrc_ok);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn datagram(&self) -> Result<Vec<u8>, EncodeError> {
        let body = self.transport_body()?;
        let udp_len = Udp::LEN + body.len() + ICRC_LEN;
        let ip_len = match self.addrs {
            Addrs::V4(..) => IPV4_HEADER_LEN,
            Addrs::V6(..) => Ipv6::LEN,
        };
        // IPv4's total length covers its header too; IPv6's payload length and UDP's do not.
        let max = match self.addrs {
            Addrs::V4(..) => usize::from(u16::MAX) - IPV4_HEADER_LEN,
            Addrs::V6(..) => usize::from(u16::MAX),
        };
        let udp_len16 = u16::try_from(udp_len)
            .ok()
            .filter(|_| udp_len <= max)
            .ok_or(EncodeError::TooLong { len: udp_len, max })?;
        let tos = (self.dscp << 2) | ecn_bits(self.ecn);

        let mut d = Vec::with_capacity(ip_len + udp_len);
        match self.addrs {
            Addrs::V4(src, dst) => {
                let flags = if self.dont_fragment { 0x40 } else { 0 };
                d.extend_from_slice(&[0x45, tos]);
                // udp_len <= 65535 - 20 was checked above.
                d.extend_from_slice(&(udp_len16 + IPV4_HEADER_LEN as u16).to_be_bytes());
                d.extend_from_slice(&self.identification.to_be_bytes());
                d.extend_from_slice(&[flags, 0, self.ttl, IPPROTO_UDP, 0, 0]);
                d.extend_from_slice(&src.octets());
                d.extend_from_slice(&dst.octets());
                let csum = internet_checksum(&d);
                if let Some(c) = d.get_mut(10..12) {
                    c.copy_from_slice(&csum.to_be_bytes());
                }
            }
            Addrs::V6(src, dst) => {
                let word0 = (6u32 << 28) | (u32::from(tos) << 20) | self.flow_label;
                d.extend_from_slice(&word0.to_be_bytes());
                d.extend_from_slice(&udp_len16.to_be_bytes());
                d.extend_from_slice(&[IPPROTO_UDP, self.ttl]);
                d.extend_from_slice(&src.octets());
                d.extend_from_slice(&dst.octets());
            }
        }
        d.extend_from_slice(&self.src_port.to_be_bytes());
        d.extend_from_slice(&ROCE_V2_PORT.to_be_bytes());
        d.extend_from_slice(&udp_len16.to_be_bytes());
        d.extend_from_slice(&[0, 0]); // UDP checksum: RoCEv2 relies on the ICRC
        d.extend_from_slice(&body);
        let (ip_header, transport) = d.split_at(ip_len);
        // `compute` is `Some` for every IP header and transport built above; the tests decode
        // every opcode's packets and check the ICRC verifies.
        let crc = icrc::compute(ip_header, transport).unwrap_or(0);
        d.extend_from_slice(&icrc::to_wire(crc));
        Ok(d)
    }

    /// The UDP payload: BTH onwards, with the ICRC computed over the IP and UDP headers this
    /// builder describes.
    pub fn udp_payload(&self) -> Result<Vec<u8>, EncodeError> {
        let mut d = self.datagram()?;
        let ip_len = match self.addrs {
            Addrs::V4(..) => IPV4_HEADER_LEN,
            Addrs::V6(..) => Ipv6::LEN,
        };
        Ok(d.split_off(ip_len + Udp::LEN))
    }

    /// Checks every field, then lays out the BTH, extension headers, payload and pad.
    fn transport_body(&self) -> Result<Vec<u8>, EncodeError> {
        self.check()?;
        let op = self.opcode;
        let pad = (4 - self.payload.len() % 4) % 4;
        let mut b = Vec::with_capacity(Bth::LEN + op.ext_headers_len() + self.payload.len() + pad);
        b.push(op.code());
        // pad < 4; TVer 0.
        b.push((u8::from(self.se) << 7) | (u8::from(self.migreq) << 6) | ((pad as u8) << 4));
        b.extend_from_slice(&self.pkey.to_be_bytes());
        b.push((u8::from(self.fecn) << 7) | (u8::from(self.becn) << 6));
        b.extend_from_slice(&be24(self.dest_qp));
        b.push(u8::from(self.ack_req) << 7);
        b.extend_from_slice(&be24(self.psn));
        let e = &self.ext;
        for &kind in op.ext_headers() {
            // `check` made sure each is set; a missing one would have failed there.
            match kind {
                ExtHeaderKind::Rdeth => {
                    if let Some(h) = e.rdeth {
                        b.push(0);
                        b.extend_from_slice(&be24(h.eecnxt));
                    }
                }
                ExtHeaderKind::Deth => {
                    if let Some(h) = e.deth {
                        b.extend_from_slice(&h.qkey.to_be_bytes());
                        b.push(0);
                        b.extend_from_slice(&be24(h.src_qp));
                    }
                }
                ExtHeaderKind::XrcEth => {
                    if let Some(h) = e.xrceth {
                        b.push(0);
                        b.extend_from_slice(&be24(h.xrcsrq));
                    }
                }
                ExtHeaderKind::Feth => {
                    if let Some(h) = e.feth {
                        b.extend_from_slice(&[0, 0, 0, (h.selectivity << 4) | h.placement_type]);
                    }
                }
                ExtHeaderKind::Reth => {
                    if let Some(h) = e.reth {
                        b.extend_from_slice(&h.va.to_be_bytes());
                        b.extend_from_slice(&h.rkey.to_be_bytes());
                        b.extend_from_slice(&h.dma_len.to_be_bytes());
                    }
                }
                ExtHeaderKind::AtomicEth => {
                    if let Some(h) = e.atomic_eth {
                        b.extend_from_slice(&h.va.to_be_bytes());
                        b.extend_from_slice(&h.rkey.to_be_bytes());
                        b.extend_from_slice(&h.swap_or_add.to_be_bytes());
                        b.extend_from_slice(&h.compare.to_be_bytes());
                    }
                }
                ExtHeaderKind::Aeth => {
                    if let Some(h) = e.aeth {
                        b.push(h.syndrome.to_byte());
                        b.extend_from_slice(&be24(h.msn));
                    }
                }
                ExtHeaderKind::AtomicAckEth => {
                    if let Some(h) = e.atomic_ack_eth {
                        b.extend_from_slice(&h.orig.to_be_bytes());
                    }
                }
                ExtHeaderKind::ImmDt => {
                    if let Some(h) = e.immdt {
                        b.extend_from_slice(&h.0.to_be_bytes());
                    }
                }
                ExtHeaderKind::Ieth => {
                    if let Some(h) = e.ieth {
                        b.extend_from_slice(&h.rkey.to_be_bytes());
                    }
                }
            }
        }
        b.extend_from_slice(&self.payload);
        b.resize(b.len() + pad, 0);
        Ok(b)
    }

    /// Every reason the decoder would not read back what was set.
    fn check(&self) -> Result<(), EncodeError> {
        let op = self.opcode;
        let e = &self.ext;
        let set = [
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
        for (header, is_set) in set {
            let needed = op.ext_headers().contains(&header);
            if needed && !is_set {
                return Err(EncodeError::MissingHeader {
                    opcode: op.name(),
                    header,
                });
            }
            if is_set && !needed {
                return Err(EncodeError::UnexpectedHeader {
                    opcode: op.name(),
                    header,
                });
            }
        }

        let found = self.payload.len();
        let expected = match op.payload() {
            PayloadRule::None if found != 0 => Some(PayloadExpectation::Nothing),
            PayloadRule::Exactly(n) if found != n => Some(PayloadExpectation::Exactly(n)),
            PayloadRule::Any | PayloadRule::None | PayloadRule::Exactly(_) => None,
        };
        if let Some(expected) = expected {
            return Err(EncodeError::Payload {
                opcode: op.name(),
                expected,
                found,
            });
        }

        let mut fields = vec![
            ("PSN", u64::from(self.psn), 24),
            ("destination QP", u64::from(self.dest_qp), 24),
            ("DSCP", u64::from(self.dscp), 6),
            ("IPv6 flow label", u64::from(self.flow_label), 20),
        ];
        if let Some(v) = self.vlan {
            fields.push(("VLAN PCP", u64::from(v.pcp), 3));
            fields.push(("VLAN ID", u64::from(v.vid), 12));
        }
        if let Some(h) = e.rdeth {
            fields.push(("RDETH EE context", u64::from(h.eecnxt), 24));
        }
        if let Some(h) = e.deth {
            fields.push(("DETH source QP", u64::from(h.src_qp), 24));
        }
        if let Some(h) = e.xrceth {
            fields.push(("XRCETH XRC SRQ", u64::from(h.xrcsrq), 24));
        }
        if let Some(h) = e.feth {
            fields.push(("FETH selectivity level", u64::from(h.selectivity), 2));
            fields.push(("FETH placement type", u64::from(h.placement_type), 4));
        }
        if let Some(h) = e.aeth {
            fields.push(("AETH MSN", u64::from(h.msn), 24));
        }
        if let Some((field, value, bits)) = fields.into_iter().find(|&(_, v, bits)| v >> bits != 0)
        {
            return Err(EncodeError::OutOfRange { field, value, bits });
        }
        if let Some(h) = e.aeth {
            if AethSyndrome::from_byte(h.syndrome.to_byte()) != h.syndrome {
                return Err(EncodeError::Syndrome(h.syndrome));
            }
        }
        Ok(())
    }
}

fn be24(v: u32) -> [u8; 3] {
    let [_, a, b, c] = v.to_be_bytes();
    [a, b, c]
}

fn ecn_bits(ecn: Ecn) -> u8 {
    match ecn {
        Ecn::NotEct => 0,
        Ecn::Ect1 => 1,
        Ecn::Ect0 => 2,
        Ecn::Ce => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_field_and_the_fix() {
        let e = PacketBuilder::new(Opcode::RC_RDMA_WRITE_ONLY).datagram();
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("RC RDMA WRITE Only needs a RETH: set it with PacketBuilder::reth".into())
        );
        let e = PacketBuilder::new(Opcode::RC_SEND_ONLY)
            .immdt(ImmDt(1))
            .datagram();
        assert_eq!(
            e,
            Err(EncodeError::UnexpectedHeader {
                opcode: "RC SEND Only",
                header: ExtHeaderKind::ImmDt
            })
        );
        let e = PacketBuilder::new(Opcode::CNP)
            .payload(vec![0; 4])
            .datagram();
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("CNP carries exactly 16 bytes, but the payload has 4 bytes".into())
        );
        let e = PacketBuilder::new(Opcode::RC_SEND_ONLY)
            .psn(1 << 24)
            .datagram();
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("PSN 0x1000000 does not fit its 24 bits (at most 0xffffff)".into())
        );
        let e = PacketBuilder::new(Opcode::RC_ACKNOWLEDGE)
            .aeth(Aeth {
                syndrome: AethSyndrome::Ack { credits: 32 },
                msn: 0,
            })
            .datagram();
        assert!(matches!(e, Err(EncodeError::Syndrome(_))), "{e:?}");
    }

    #[test]
    fn length_limits_per_ip_version() {
        // UDP + BTH + ICRC = 24 bytes around the payload.
        let v4_max = usize::from(u16::MAX) - 20 - 24;
        let b = PacketBuilder::new(Opcode::RC_SEND_ONLY);
        let at = |n: usize| b.clone().payload(vec![0; n]);
        assert_eq!(at(v4_max & !3).datagram().map(|d| d.len()), Ok(65532));
        assert_eq!(
            at(v4_max + 1).datagram(),
            Err(EncodeError::TooLong {
                len: 65516,
                max: 65515
            })
        );
        let v6 = |n: usize| at(n).ipv6(Ipv6Addr::LOCALHOST, Ipv6Addr::LOCALHOST);
        assert!(v6(v4_max + 1).datagram().is_ok());
        assert!(v6(usize::from(u16::MAX)).datagram().is_err());
    }
}
