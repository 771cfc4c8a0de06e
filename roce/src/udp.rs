//! The UDP header.

use serde::Serialize;

use crate::reader::be16;

/// The UDP destination port IANA assigned to RoCEv2.
pub const ROCE_V2_PORT: u16 = 4791;

/// A UDP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Udp {
    /// Source port; RoCEv2 senders hash the QP into it for ECMP entropy.
    pub src_port: u16,
    /// Destination port (4791).
    pub dst_port: u16,
    /// Length of header and payload.
    pub length: u16,
    /// Checksum; RoCEv2 senders normally leave it 0 and rely on the ICRC.
    #[serde(serialize_with = "crate::hex::u16")]
    pub checksum: u16,
}

impl Udp {
    /// Length of the header.
    pub const LEN: usize = 8;

    pub(crate) fn parse(h: &[u8; 8]) -> Udp {
        Udp {
            src_port: be16([h[0], h[1]]),
            dst_port: be16([h[2], h[3]]),
            length: be16([h[4], h[5]]),
            checksum: be16([h[6], h[7]]),
        }
    }
}
