//! The RoCEv2 invariant CRC (IBA annex A17.3.3).
//!
//! The ICRC is the IEEE 802.3 CRC-32 (reflected, init `0xFFFFFFFF`, final XOR `0xFFFFFFFF`,
//! i.e. what `crc32fast` and zlib compute) over:
//!
//! 1. eight `0xFF` bytes standing in for the masked InfiniBand LRH;
//! 2. the IP header with its variant fields set to all ones — IPv4: TOS (DSCP+ECN), TTL and
//!    header checksum; IPv6: traffic class, flow label and hop limit;
//! 3. the UDP header with its checksum set to all ones;
//! 4. the BTH with byte 4 (FECN, BECN and the six reserved bits) set to all ones;
//! 5. everything after the BTH up to the ICRC: extension headers, payload and pad bytes.
//!
//! The CRC is stored after the pad bytes with its least significant byte first.
//!
//! This matches Linux `drivers/infiniband/sw/rxe/rxe_icrc.c`: `rxe_icrc_hdr` seeds `crc32_le`
//! with `0xdebb20e3` (the raw CRC register after `0xFFFFFFFF` and eight `0xFF` bytes), sets
//! `tos`/`ttl`/`check` (IPv4) or `priority`/`flow_lbl`/`hop_limit` (IPv6) and the UDP `check`
//! to ones, ORs `0xff000000` into the BTH word holding the QPN (byte 4), and `rxe_icrc_generate`
//! stores `~crc` in host order, i.e. little-endian on the wire. The known-answer tests below
//! are a ConnectX-4 Lx capture and scapy's RoCE layer test.
//!
//! rxe masks only a 20-byte IPv4 header; IPv4 options (which RoCEv2 senders do not emit) are
//! covered unmasked here, as the annex covers the whole IP header.

use crate::ip::Ipv6;
use crate::udp::Udp;

/// Size of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Length of the UDP header plus BTH, the part of the transport headers with masked fields.
const UDP_BTH_LEN: usize = Udp::LEN + 12;

/// Computes the ICRC of a RoCEv2 packet.
///
/// `ip_header` is the complete IPv4 (20–60 bytes) or IPv6 (40 bytes) header; `transport` runs
/// from the UDP header up to, but excluding, the ICRC. Returns `None` if `ip_header` is not an
/// IPv4/IPv6 header of a plausible length or `transport` is shorter than UDP + BTH.
///
/// ```
/// use roce::icrc;
///
/// // A CNP captured from a ConnectX-4 Lx (scapy test/contrib/roce.uts), IPv4 onwards.
/// let ip = [0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61,
///           0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00, 0x12, 0x01];
/// let mut transport = vec![0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, // UDP
///                          0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0, 0, 0, 0]; // BTH
/// transport.extend([0u8; 16]); // the CNP's reserved bytes
/// let crc = icrc::compute(&ip, &transport).unwrap();
/// assert_eq!(icrc::to_wire(crc), [0x82, 0xfd, 0x00, 0x2a]);
/// ```
pub fn compute(ip_header: &[u8], transport: &[u8]) -> Option<u32> {
    let mut ip = [0u8; 60];
    let ip = ip.get_mut(..ip_header.len())?;
    ip.copy_from_slice(ip_header);
    match (ip.first().map(|b| b >> 4), ip.len()) {
        (Some(4), 20..=60) => {
            set_ones(ip, 1..2); // TOS: DSCP and ECN
            set_ones(ip, 8..9); // TTL
            set_ones(ip, 10..12); // header checksum
        }
        (Some(6), Ipv6::LEN) => {
            // Keep the version nibble; traffic class and flow label fill the rest of word 0.
            if let Some(b) = ip.get_mut(0) {
                *b |= 0x0f;
            }
            set_ones(ip, 1..4);
            set_ones(ip, 7..8); // hop limit
        }
        _ => return None,
    }

    let (udp_bth, rest) = (transport.get(..UDP_BTH_LEN)?, transport.get(UDP_BTH_LEN..)?);
    let mut fixed = [0u8; UDP_BTH_LEN];
    fixed.copy_from_slice(udp_bth);
    set_ones(&mut fixed, 6..8); // UDP checksum
    set_ones(&mut fixed, 12..13); // BTH byte 4: FECN, BECN, resv6

    let mut h = crc32fast::Hasher::new();
    h.update(&[0xff; 8]);
    h.update(ip);
    h.update(&fixed);
    h.update(rest);
    Some(h.finalize())
}

/// Computes the ICRC of a whole IP datagram that ends with its 4-byte ICRC field (whose
/// contents are ignored). Returns `None` if the datagram is too short or not IPv4/IPv6.
pub fn compute_datagram(datagram: &[u8]) -> Option<u32> {
    let header_len = match datagram.first()? >> 4 {
        4 => usize::from(datagram.first()? & 0x0f) * 4,
        6 => Ipv6::LEN,
        _ => return None,
    };
    let end = datagram.len().checked_sub(ICRC_LEN)?;
    compute(datagram.get(..header_len)?, datagram.get(header_len..end)?)
}

/// The ICRC's bytes as they appear on the wire (least significant first).
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// The ICRC value from its wire bytes.
pub fn from_wire(bytes: [u8; 4]) -> u32 {
    u32::from_le_bytes(bytes)
}

fn set_ones(buf: &mut [u8], range: std::ops::Range<usize>) {
    if let Some(s) = buf.get_mut(range) {
        s.fill(0xff);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CNP captured on a Mellanox ConnectX-4 Lx, from scapy's `test/contrib/roce.uts`
    /// ("RoCE CNP captured on ConnectX-4 Lx"), whose ICRC bytes on the wire are `82 fd 00 2a`.
    pub(crate) const CX4_CNP_FRAME: [u8; 74] = [
        0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08,
        0x00, // Ethernet
        0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11,
        0x01, 0x0a, 0x00, 0x12, 0x01, // IPv4, DSCP 48 ECN ECT(0)
        0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, // UDP 0 -> 4791
        0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00, // BTH, BECN
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // CNP reserved
        0x82, 0xfd, 0x00, 0x2a, // ICRC
    ];

    /// scapy's "RoCE layer" test: a UC SEND Only with two pad bytes, for which scapy's RoCE
    /// layer computes `icrc == 0x78f353f3` (its big-endian view of the wire bytes) and the IPv4
    /// checksum 0xb4d5, UDP checksum 0xaca2.
    const SCAPY_UC_SEND_DATAGRAM: [u8; 64] = [
        0x45, 0x01, 0x00, 0x40, 0x04, 0x78, 0x40, 0x00, 0x40, 0x11, 0xb4, 0xd5, 0xc0, 0xa8, 0x00,
        0x07, 0xc0, 0xa8, 0x00, 0x07, // IPv4 192.168.0.7 -> 192.168.0.7, TOS 1
        0xc0, 0x00, 0x12, 0xb7, 0x00, 0x2c, 0xac, 0xa2, // UDP 49152 -> 4791
        0x24, 0x60, 0xff, 0xff, 0x00, 0x00, 0x00, 0xd3, 0x00, 0xcf, 0x17,
        0x10, // BTH M=1 pad 2
        b'F', b'0', 0x81, 0x8b, 0xe2, 0x89, b'5', 0xd9, 0x0e, 0x9a, 0x95, b'P', b'T', 0x01, 0xbe,
        0x88, b'^', b'P', 0x00, 0x00, // payload + pad
        0x78, 0xf3, 0x53, 0xf3, // ICRC
    ];

    fn wire_icrc(datagram: &[u8]) -> u32 {
        let n = datagram.len();
        from_wire([
            datagram[n - 4],
            datagram[n - 3],
            datagram[n - 2],
            datagram[n - 1],
        ])
    }

    #[test]
    fn known_answer_connectx4_cnp() {
        let datagram = &CX4_CNP_FRAME[14..];
        assert_eq!(compute_datagram(datagram), Some(0x2a00fd82));
        assert_eq!(compute_datagram(datagram), Some(wire_icrc(datagram)));
    }

    #[test]
    fn known_answer_scapy_uc_send() {
        assert_eq!(
            compute_datagram(&SCAPY_UC_SEND_DATAGRAM),
            Some(wire_icrc(&SCAPY_UC_SEND_DATAGRAM))
        );
        assert_eq!(
            to_wire(compute_datagram(&SCAPY_UC_SEND_DATAGRAM).unwrap_or(0)),
            [0x78, 0xf3, 0x53, 0xf3]
        );
    }

    #[test]
    fn known_answer_ipv6() {
        // Built by hand and checked against Python's zlib.crc32 over the masked bytes; the
        // variant fields (traffic class 0x8b, flow label 0x12345, hop limit 17, UDP checksum,
        // BTH FECN/BECN) are deliberately non-zero so that masking them is exercised.
        let mut d = vec![0x68, 0xb1, 0x23, 0x45, 0x00, 0x1c, 0x11, 0x11];
        d.extend([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        d.extend([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        d.extend([0xd0, 0x00, 0x12, 0xb7, 0x00, 0x1c, 0x12, 0x34]); // UDP
        d.extend([
            0x11, 0x00, 0xff, 0xff, 0xc0, 0x00, 0x00, 0x2a, 0x00, 0x00, 0x00, 0x07,
        ]); // BTH ACK
        d.extend([0x1f, 0x00, 0x00, 0x05]); // AETH
        d.extend([0, 0, 0, 0]);
        assert_eq!(compute_datagram(&d), Some(0xbb62de40));
    }

    #[test]
    fn variant_fields_do_not_change_the_crc() {
        let base = compute_datagram(&SCAPY_UC_SEND_DATAGRAM);
        for (at, v) in [
            (1, 0xb8),
            (8, 1),
            (10, 0),
            (11, 0),
            (26, 0),
            (27, 0),
            (32, 0xc0),
        ] {
            let mut d = SCAPY_UC_SEND_DATAGRAM;
            d[at] = v;
            assert_eq!(compute_datagram(&d), base, "byte {at}");
        }
        // ... and every invariant byte does.
        for at in [0, 2, 4, 9, 12, 20, 22, 24, 28, 29, 30, 33, 36, 40, 59] {
            let mut d = SCAPY_UC_SEND_DATAGRAM;
            d[at] ^= 0x04;
            assert_ne!(compute_datagram(&d), base, "byte {at}");
        }
    }

    #[test]
    fn rejects_what_is_not_ip() {
        assert_eq!(compute(&[0x55; 20], &[0; 20]), None);
        assert_eq!(compute(&[0x45; 19], &[0; 20]), None);
        assert_eq!(compute(&[0x45; 61], &[0; 20]), None);
        assert_eq!(compute(&[0x60; 40], &[0; 19]), None);
        assert_eq!(compute_datagram(&[]), None);
        assert_eq!(compute_datagram(&[0x45, 0, 0]), None);
    }
}
