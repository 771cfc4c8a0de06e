//! The Base Transport Header that starts every RoCEv2 UDP payload.

use serde::Serialize;

use crate::error::DecodeError;
use crate::opcode::Opcode;
use crate::reader::{be16, be24};

/// The 12-byte Base Transport Header (IBA 9.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Bth {
    /// The opcode, known to the IBA table.
    pub opcode: Opcode,
    /// Solicited event.
    pub se: bool,
    /// Migration request (APM state).
    pub migreq: bool,
    /// Pad bytes (0–3) between the payload and the ICRC.
    pub pad_count: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    #[serde(serialize_with = "crate::hex::u16")]
    pub pkey: u16,
    /// Forward ECN: set by a switch that saw congestion (RoCEv2 marks congestion in IP ECN
    /// instead, so this is normally 0).
    pub fecn: bool,
    /// Backward ECN: set in CNPs to tell the sender to slow down.
    pub becn: bool,
    /// The six reserved bits after FECN/BECN (should be 0).
    pub resv6: u8,
    /// Destination queue pair (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// The seven reserved bits after AckReq (should be 0).
    pub resv7: u8,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// Length of the header.
    pub const LEN: usize = 12;

    /// Decodes a BTH; fails only on an opcode IBA does not define.
    pub fn parse(h: &[u8; 12]) -> Result<Bth, DecodeError> {
        let opcode = Opcode::new(h[0]).ok_or(DecodeError::UnknownOpcode(h[0]))?;
        Ok(Bth {
            opcode,
            se: h[1] & 0x80 != 0,
            migreq: h[1] & 0x40 != 0,
            pad_count: (h[1] >> 4) & 0x03,
            tver: h[1] & 0x0f,
            pkey: be16([h[2], h[3]]),
            fecn: h[4] & 0x80 != 0,
            becn: h[4] & 0x40 != 0,
            resv6: h[4] & 0x3f,
            dest_qp: be24([h[5], h[6], h[7]]),
            ack_req: h[8] & 0x80 != 0,
            resv7: h[8] & 0x7f,
            psn: be24([h[9], h[10], h[11]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field() {
        let h = [
            0x0a, 0xe5, 0xff, 0xff, 0xc1, 0x00, 0x00, 0x11, 0x85, 0x83, 0xf2, 0x47,
        ];
        let b = Bth::parse(&h).unwrap();
        assert_eq!(b.opcode, Opcode::RC_RDMA_WRITE_ONLY);
        assert!(b.se && b.migreq && b.fecn && b.becn && b.ack_req);
        assert_eq!((b.pad_count, b.tver, b.pkey), (2, 5, 0xffff));
        assert_eq!((b.resv6, b.dest_qp, b.resv7, b.psn), (1, 0x11, 5, 0x83f247));
    }

    #[test]
    fn unknown_opcode_is_named() {
        let mut h = [0u8; 12];
        h[0] = 0x15;
        assert_eq!(Bth::parse(&h), Err(DecodeError::UnknownOpcode(0x15)));
    }
}
