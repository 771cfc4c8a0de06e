//! The IBA BTH opcode table: name, transport, and which extension headers follow the BTH.
//!
//! The opcode's top three bits select the transport service (RC `0x00`, UC `0x20`, RD `0x40`,
//! UD `0x60`, CNP `0x80`, XRC `0xA0`), the low five bits the operation (IBA vol. 1, table 38).
//! The header order for each opcode follows IBA 9.2 and cross-checks against the Linux rxe
//! driver (`drivers/infiniband/sw/rxe/rxe_opcode.c`) and Wireshark's `packet-infiniband.c`.
//!
//! Names are the transport's abbreviation and the operation as Wireshark's `infiniband.bth.opcode`
//! field spells it ("RC RDMA WRITE Only with Immediate", "RC RDMA READ response First",
//! "UD SEND only"), which follows IBA table 38. [`Opcode::wireshark_name`] gives Wireshark's full
//! string ("Reliable Connection (RC) - SEND First"); both were checked against tshark 4.0.17
//! decoding a capture of every opcode written by this crate.

use std::fmt;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

/// The transport service an opcode belongs to (its top three bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Transport {
    /// Reliable Connection, opcodes `0x00..=0x1F`.
    Rc,
    /// Unreliable Connection, opcodes `0x20..=0x3F`.
    Uc,
    /// Reliable Datagram, opcodes `0x40..=0x5F`.
    Rd,
    /// Unreliable Datagram, opcodes `0x60..=0x7F`.
    Ud,
    /// Congestion Notification Packet (RoCEv2, IBA annex A17), opcode `0x81`.
    Cnp,
    /// Extended Reliable Connection, opcodes `0xA0..=0xBF`.
    Xrc,
}

impl Transport {
    /// The short name used as the prefix of opcode names ("RC", "UD", …).
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Rc => "RC",
            Transport::Uc => "UC",
            Transport::Rd => "RD",
            Transport::Ud => "UD",
            Transport::Cnp => "CNP",
            Transport::Xrc => "XRC",
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The operation an opcode performs, independent of its transport (its low five bits).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Operation {
    /// SEND First.
    SendFirst,
    /// SEND Middle.
    SendMiddle,
    /// SEND Last.
    SendLast,
    /// SEND Last with Immediate.
    SendLastImm,
    /// SEND Only.
    SendOnly,
    /// SEND Only with Immediate.
    SendOnlyImm,
    /// RDMA WRITE First.
    WriteFirst,
    /// RDMA WRITE Middle.
    WriteMiddle,
    /// RDMA WRITE Last.
    WriteLast,
    /// RDMA WRITE Last with Immediate.
    WriteLastImm,
    /// RDMA WRITE Only.
    WriteOnly,
    /// RDMA WRITE Only with Immediate.
    WriteOnlyImm,
    /// RDMA READ Request.
    ReadRequest,
    /// RDMA READ Response First.
    ReadResponseFirst,
    /// RDMA READ Response Middle.
    ReadResponseMiddle,
    /// RDMA READ Response Last.
    ReadResponseLast,
    /// RDMA READ Response Only.
    ReadResponseOnly,
    /// Acknowledge (ACK, RNR NAK or NAK, per the AETH syndrome).
    Acknowledge,
    /// ATOMIC Acknowledge.
    AtomicAcknowledge,
    /// Atomic compare and swap.
    CompareSwap,
    /// Atomic fetch and add.
    FetchAdd,
    /// RD end-to-end context resynchronisation.
    Resync,
    /// SEND Last with Invalidate.
    SendLastInvalidate,
    /// SEND Only with Invalidate.
    SendOnlyInvalidate,
    /// FLUSH (IBA 1.5 memory placement extensions).
    Flush,
    /// ATOMIC WRITE (IBA 1.5 memory placement extensions).
    AtomicWrite,
    /// RoCEv2 congestion notification.
    Cnp,
}

impl Operation {
    /// True for packets a requester sends (SEND, WRITE, READ request, atomics, FLUSH, RESYNC).
    pub fn is_request(self) -> bool {
        !self.is_response() && self != Operation::Cnp
    }

    /// True for packets a responder sends: READ responses, ACK/NAK and ATOMIC ACK.
    ///
    /// Their PSN is the PSN of the request they answer, not a new sequence number.
    pub fn is_response(self) -> bool {
        matches!(
            self,
            Operation::ReadResponseFirst
                | Operation::ReadResponseMiddle
                | Operation::ReadResponseLast
                | Operation::ReadResponseOnly
                | Operation::Acknowledge
                | Operation::AtomicAcknowledge
        )
    }

    /// True for the two acknowledgement opcodes, which carry no data of their own.
    pub fn is_acknowledge(self) -> bool {
        matches!(self, Operation::Acknowledge | Operation::AtomicAcknowledge)
    }
}

/// An extension header that may follow the BTH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum ExtHeaderKind {
    /// Reliable Datagram ETH (4 bytes): the EE context.
    Rdeth,
    /// Datagram ETH (8 bytes): Q_Key and source QP.
    Deth,
    /// XRC ETH (4 bytes): the XRC SRQ number (XRC requests only).
    XrcEth,
    /// FLUSH ETH (4 bytes): selectivity level and placement type.
    Feth,
    /// RDMA ETH (16 bytes): virtual address, R_Key, DMA length.
    Reth,
    /// Atomic ETH (28 bytes): virtual address, R_Key, swap/add and compare data.
    AtomicEth,
    /// ACK ETH (4 bytes): syndrome and MSN.
    Aeth,
    /// Atomic ACK ETH (8 bytes): the original remote data.
    AtomicAckEth,
    /// Immediate data (4 bytes).
    ImmDt,
    /// Invalidate ETH (4 bytes): the R_Key to invalidate.
    Ieth,
}

impl ExtHeaderKind {
    /// Size of the header on the wire, in bytes.
    pub const fn wire_len(self) -> usize {
        match self {
            ExtHeaderKind::Rdeth
            | ExtHeaderKind::XrcEth
            | ExtHeaderKind::Feth
            | ExtHeaderKind::Aeth
            | ExtHeaderKind::ImmDt
            | ExtHeaderKind::Ieth => 4,
            ExtHeaderKind::Deth | ExtHeaderKind::AtomicAckEth => 8,
            ExtHeaderKind::Reth => 16,
            ExtHeaderKind::AtomicEth => 28,
        }
    }

    /// The header's name as printed ("RETH", "ImmDt", …).
    pub fn as_str(self) -> &'static str {
        match self {
            ExtHeaderKind::Rdeth => "RDETH",
            ExtHeaderKind::Deth => "DETH",
            ExtHeaderKind::XrcEth => "XRCETH",
            ExtHeaderKind::Feth => "FETH",
            ExtHeaderKind::Reth => "RETH",
            ExtHeaderKind::AtomicEth => "AtomicETH",
            ExtHeaderKind::Aeth => "AETH",
            ExtHeaderKind::AtomicAckEth => "AtomicAckETH",
            ExtHeaderKind::ImmDt => "ImmDt",
            ExtHeaderKind::Ieth => "IETH",
        }
    }
}

impl fmt::Display for ExtHeaderKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What may follow an opcode's extension headers, up to the pad bytes and ICRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum PayloadRule {
    /// No payload: anything after the headers is malformed.
    None,
    /// Any number of payload bytes, including zero.
    Any,
    /// Exactly this many bytes: ATOMIC WRITE's 8-byte value, or the CNP's 16 reserved bytes.
    Exactly(usize),
}

/// Everything the table knows about one opcode.
#[derive(Clone, Copy, Debug)]
struct OpcodeInfo {
    code: u8,
    transport: Transport,
    operation: Operation,
    name: &'static str,
    wireshark: Option<&'static str>,
    headers: &'static [ExtHeaderKind],
    payload: PayloadRule,
}

const fn info(
    code: u8,
    transport: Transport,
    operation: Operation,
    name: &'static str,
    wireshark: Option<&'static str>,
    headers: &'static [ExtHeaderKind],
    payload: PayloadRule,
) -> OpcodeInfo {
    OpcodeInfo {
        code,
        transport,
        operation,
        name,
        wireshark,
        headers,
        payload,
    }
}

// Every opcode IBA 1.5 defines for RoCE transports, plus the RoCEv2 CNP. Anything absent is
// reserved or manufacturer-specific (0xC0..) and decodes as `DecodeError::UnknownOpcode`.
// Wireshark 4.0 prints "Unknown" for FLUSH, ATOMIC WRITE and CNP, and decodes the RD range as
// Mellanox DC (a different header layout) in RoCEv2 captures.
#[rustfmt::skip]
const TABLE: &[OpcodeInfo] = &[
    info(0x00, Transport::Rc, Operation::SendFirst, "RC SEND First", Some("Reliable Connection (RC) - SEND First"), &[], PayloadRule::Any),
    info(0x01, Transport::Rc, Operation::SendMiddle, "RC SEND Middle", Some("Reliable Connection (RC) - SEND Middle"), &[], PayloadRule::Any),
    info(0x02, Transport::Rc, Operation::SendLast, "RC SEND Last", Some("Reliable Connection (RC) - SEND Last"), &[], PayloadRule::Any),
    info(0x03, Transport::Rc, Operation::SendLastImm, "RC SEND Last with Immediate", Some("Reliable Connection (RC) - SEND Last with Immediate"), &[ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x04, Transport::Rc, Operation::SendOnly, "RC SEND Only", Some("Reliable Connection (RC) - SEND Only"), &[], PayloadRule::Any),
    info(0x05, Transport::Rc, Operation::SendOnlyImm, "RC SEND Only with Immediate", Some("Reliable Connection (RC) - SEND Only with Immediate"), &[ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x06, Transport::Rc, Operation::WriteFirst, "RC RDMA WRITE First", Some("Reliable Connection (RC) - RDMA WRITE First"), &[ExtHeaderKind::Reth], PayloadRule::Any),
    info(0x07, Transport::Rc, Operation::WriteMiddle, "RC RDMA WRITE Middle", Some("Reliable Connection (RC) - RDMA WRITE Middle"), &[], PayloadRule::Any),
    info(0x08, Transport::Rc, Operation::WriteLast, "RC RDMA WRITE Last", Some("Reliable Connection (RC) - RDMA WRITE Last"), &[], PayloadRule::Any),
    info(0x09, Transport::Rc, Operation::WriteLastImm, "RC RDMA WRITE Last with Immediate", Some("Reliable Connection (RC) - RDMA WRITE Last with Immediate"), &[ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x0a, Transport::Rc, Operation::WriteOnly, "RC RDMA WRITE Only", Some("Reliable Connection (RC) - RDMA WRITE Only"), &[ExtHeaderKind::Reth], PayloadRule::Any),
    info(0x0b, Transport::Rc, Operation::WriteOnlyImm, "RC RDMA WRITE Only with Immediate", Some("Reliable Connection (RC) - RDMA WRITE Only with Immediate"), &[ExtHeaderKind::Reth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x0c, Transport::Rc, Operation::ReadRequest, "RC RDMA READ Request", Some("Reliable Connection (RC) - RDMA READ Request"), &[ExtHeaderKind::Reth], PayloadRule::None),
    info(0x0d, Transport::Rc, Operation::ReadResponseFirst, "RC RDMA READ response First", Some("Reliable Connection (RC) - RDMA READ response First"), &[ExtHeaderKind::Aeth], PayloadRule::Any),
    info(0x0e, Transport::Rc, Operation::ReadResponseMiddle, "RC RDMA READ response Middle", Some("Reliable Connection (RC) - RDMA READ response Middle"), &[], PayloadRule::Any),
    info(0x0f, Transport::Rc, Operation::ReadResponseLast, "RC RDMA READ response Last", Some("Reliable Connection (RC) - RDMA READ response Last"), &[ExtHeaderKind::Aeth], PayloadRule::Any),
    info(0x10, Transport::Rc, Operation::ReadResponseOnly, "RC RDMA READ response Only", Some("Reliable Connection (RC) - RDMA READ response Only"), &[ExtHeaderKind::Aeth], PayloadRule::Any),
    info(0x11, Transport::Rc, Operation::Acknowledge, "RC Acknowledge", Some("Reliable Connection (RC) - Acknowledge"), &[ExtHeaderKind::Aeth], PayloadRule::None),
    info(0x12, Transport::Rc, Operation::AtomicAcknowledge, "RC ATOMIC Acknowledge", Some("Reliable Connection (RC) - ATOMIC Acknowledge"), &[ExtHeaderKind::Aeth, ExtHeaderKind::AtomicAckEth], PayloadRule::None),
    info(0x13, Transport::Rc, Operation::CompareSwap, "RC CmpSwap", Some("Reliable Connection (RC) - CmpSwap"), &[ExtHeaderKind::AtomicEth], PayloadRule::None),
    info(0x14, Transport::Rc, Operation::FetchAdd, "RC FetchAdd", Some("Reliable Connection (RC) - FetchAdd"), &[ExtHeaderKind::AtomicEth], PayloadRule::None),
    info(0x16, Transport::Rc, Operation::SendLastInvalidate, "RC SEND Last with Invalidate", Some("Reliable Connection (RC) - SEND Last with Invalidate"), &[ExtHeaderKind::Ieth], PayloadRule::Any),
    info(0x17, Transport::Rc, Operation::SendOnlyInvalidate, "RC SEND Only with Invalidate", Some("Reliable Connection (RC) - SEND Only with Invalidate"), &[ExtHeaderKind::Ieth], PayloadRule::Any),
    info(0x1c, Transport::Rc, Operation::Flush, "RC FLUSH", None, &[ExtHeaderKind::Feth, ExtHeaderKind::Reth], PayloadRule::None),
    info(0x1d, Transport::Rc, Operation::AtomicWrite, "RC ATOMIC WRITE", None, &[ExtHeaderKind::Reth], PayloadRule::Exactly(8)),
    info(0x20, Transport::Uc, Operation::SendFirst, "UC SEND First", Some("Unreliable Connection (UC) - SEND First"), &[], PayloadRule::Any),
    info(0x21, Transport::Uc, Operation::SendMiddle, "UC SEND Middle", Some("Unreliable Connection (UC) - SEND Middle"), &[], PayloadRule::Any),
    info(0x22, Transport::Uc, Operation::SendLast, "UC SEND Last", Some("Unreliable Connection (UC) - SEND Last"), &[], PayloadRule::Any),
    info(0x23, Transport::Uc, Operation::SendLastImm, "UC SEND Last with Immediate", Some("Unreliable Connection (UC) - SEND Last with Immediate"), &[ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x24, Transport::Uc, Operation::SendOnly, "UC SEND Only", Some("Unreliable Connection (UC) - SEND Only"), &[], PayloadRule::Any),
    info(0x25, Transport::Uc, Operation::SendOnlyImm, "UC SEND Only with Immediate", Some("Unreliable Connection (UC) - SEND Only with Immediate"), &[ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x26, Transport::Uc, Operation::WriteFirst, "UC RDMA WRITE First", Some("Unreliable Connection (UC) - RDMA WRITE First"), &[ExtHeaderKind::Reth], PayloadRule::Any),
    info(0x27, Transport::Uc, Operation::WriteMiddle, "UC RDMA WRITE Middle", Some("Unreliable Connection (UC) - RDMA WRITE Middle"), &[], PayloadRule::Any),
    info(0x28, Transport::Uc, Operation::WriteLast, "UC RDMA WRITE Last", Some("Unreliable Connection (UC) - RDMA WRITE Last"), &[], PayloadRule::Any),
    info(0x29, Transport::Uc, Operation::WriteLastImm, "UC RDMA WRITE Last with Immediate", Some("Unreliable Connection (UC) - RDMA WRITE Last with Immediate"), &[ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x2a, Transport::Uc, Operation::WriteOnly, "UC RDMA WRITE Only", Some("Unreliable Connection (UC) - RDMA WRITE Only"), &[ExtHeaderKind::Reth], PayloadRule::Any),
    info(0x2b, Transport::Uc, Operation::WriteOnlyImm, "UC RDMA WRITE Only with Immediate", Some("Unreliable Connection (UC) - RDMA WRITE Only with Immediate"), &[ExtHeaderKind::Reth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x40, Transport::Rd, Operation::SendFirst, "RD SEND First", Some("Reliable Datagram (RD) - SEND First"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth], PayloadRule::Any),
    info(0x41, Transport::Rd, Operation::SendMiddle, "RD SEND Middle", Some("Reliable Datagram (RD) - SEND Middle"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth], PayloadRule::Any),
    info(0x42, Transport::Rd, Operation::SendLast, "RD SEND Last", Some("Reliable Datagram (RD) - SEND Last"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth], PayloadRule::Any),
    info(0x43, Transport::Rd, Operation::SendLastImm, "RD SEND Last with Immediate", Some("Reliable Datagram (RD) - SEND Last with Immediate"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x44, Transport::Rd, Operation::SendOnly, "RD SEND Only", Some("Reliable Datagram (RD) - SEND Only"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth], PayloadRule::Any),
    info(0x45, Transport::Rd, Operation::SendOnlyImm, "RD SEND Only with Immediate", Some("Reliable Datagram (RD) - SEND Only with Immediate"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x46, Transport::Rd, Operation::WriteFirst, "RD RDMA WRITE First", Some("Reliable Datagram (RD) - RDMA WRITE First"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::Reth], PayloadRule::Any),
    info(0x47, Transport::Rd, Operation::WriteMiddle, "RD RDMA WRITE Middle", Some("Reliable Datagram (RD) - RDMA WRITE Middle"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth], PayloadRule::Any),
    info(0x48, Transport::Rd, Operation::WriteLast, "RD RDMA WRITE Last", Some("Reliable Datagram (RD) - RDMA WRITE Last"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth], PayloadRule::Any),
    info(0x49, Transport::Rd, Operation::WriteLastImm, "RD RDMA WRITE Last with Immediate", Some("Reliable Datagram (RD) - RDMA WRITE Last with Immediate"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x4a, Transport::Rd, Operation::WriteOnly, "RD RDMA WRITE Only", Some("Reliable Datagram (RD) - RDMA WRITE Only"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::Reth], PayloadRule::Any),
    info(0x4b, Transport::Rd, Operation::WriteOnlyImm, "RD RDMA WRITE Only with Immediate", Some("Reliable Datagram (RD) - RDMA WRITE Only with Immediate"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::Reth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x4c, Transport::Rd, Operation::ReadRequest, "RD RDMA READ Request", Some("Reliable Datagram (RD) - RDMA READ Request"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::Reth], PayloadRule::None),
    info(0x4d, Transport::Rd, Operation::ReadResponseFirst, "RD RDMA READ response First", Some("Reliable Datagram (RD) - RDMA READ response First"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Aeth], PayloadRule::Any),
    info(0x4e, Transport::Rd, Operation::ReadResponseMiddle, "RD RDMA READ response Middle", Some("Reliable Datagram (RD) - RDMA READ response Middle"), &[ExtHeaderKind::Rdeth], PayloadRule::Any),
    info(0x4f, Transport::Rd, Operation::ReadResponseLast, "RD RDMA READ response Last", Some("Reliable Datagram (RD) - RDMA READ response Last"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Aeth], PayloadRule::Any),
    info(0x50, Transport::Rd, Operation::ReadResponseOnly, "RD RDMA READ response Only", Some("Reliable Datagram (RD) - RDMA READ response Only"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Aeth], PayloadRule::Any),
    info(0x51, Transport::Rd, Operation::Acknowledge, "RD Acknowledge", Some("Reliable Datagram (RD) - Acknowledge"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Aeth], PayloadRule::None),
    info(0x52, Transport::Rd, Operation::AtomicAcknowledge, "RD ATOMIC Acknowledge", Some("Reliable Datagram (RD) - ATOMIC Acknowledge"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Aeth, ExtHeaderKind::AtomicAckEth], PayloadRule::None),
    info(0x53, Transport::Rd, Operation::CompareSwap, "RD CmpSwap", Some("Reliable Datagram (RD) - CmpSwap"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::AtomicEth], PayloadRule::None),
    info(0x54, Transport::Rd, Operation::FetchAdd, "RD FetchAdd", Some("Reliable Datagram (RD) - FetchAdd"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::AtomicEth], PayloadRule::None),
    info(0x55, Transport::Rd, Operation::Resync, "RD RESYNC", Some("Reliable Datagram (RD) - RESYNC"), &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth], PayloadRule::None),
    info(0x5c, Transport::Rd, Operation::Flush, "RD FLUSH", None, &[ExtHeaderKind::Rdeth, ExtHeaderKind::Deth, ExtHeaderKind::Feth, ExtHeaderKind::Reth], PayloadRule::None),
    info(0x64, Transport::Ud, Operation::SendOnly, "UD SEND only", Some("Unreliable Datagram (UD) - SEND only"), &[ExtHeaderKind::Deth], PayloadRule::Any),
    info(0x65, Transport::Ud, Operation::SendOnlyImm, "UD SEND only with Immediate", Some("Unreliable Datagram (UD) - SEND only with Immediate"), &[ExtHeaderKind::Deth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0x81, Transport::Cnp, Operation::Cnp, "CNP", None, &[], PayloadRule::Exactly(16)),
    info(0xa0, Transport::Xrc, Operation::SendFirst, "XRC SEND First", Some("Extended Reliable Connection (XRC) - SEND First"), &[ExtHeaderKind::XrcEth], PayloadRule::Any),
    info(0xa1, Transport::Xrc, Operation::SendMiddle, "XRC SEND Middle", Some("Extended Reliable Connection (XRC) - SEND Middle"), &[ExtHeaderKind::XrcEth], PayloadRule::Any),
    info(0xa2, Transport::Xrc, Operation::SendLast, "XRC SEND Last", Some("Extended Reliable Connection (XRC) - SEND Last"), &[ExtHeaderKind::XrcEth], PayloadRule::Any),
    info(0xa3, Transport::Xrc, Operation::SendLastImm, "XRC SEND Last with Immediate", Some("Extended Reliable Connection (XRC) - SEND Last with Immediate"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0xa4, Transport::Xrc, Operation::SendOnly, "XRC SEND Only", Some("Extended Reliable Connection (XRC) - SEND Only"), &[ExtHeaderKind::XrcEth], PayloadRule::Any),
    info(0xa5, Transport::Xrc, Operation::SendOnlyImm, "XRC SEND Only with Immediate", Some("Extended Reliable Connection (XRC) - SEND Only with Immediate"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0xa6, Transport::Xrc, Operation::WriteFirst, "XRC RDMA WRITE First", Some("Extended Reliable Connection (XRC) - RDMA WRITE First"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::Reth], PayloadRule::Any),
    info(0xa7, Transport::Xrc, Operation::WriteMiddle, "XRC RDMA WRITE Middle", Some("Extended Reliable Connection (XRC) - RDMA WRITE Middle"), &[ExtHeaderKind::XrcEth], PayloadRule::Any),
    info(0xa8, Transport::Xrc, Operation::WriteLast, "XRC RDMA WRITE Last", Some("Extended Reliable Connection (XRC) - RDMA WRITE Last"), &[ExtHeaderKind::XrcEth], PayloadRule::Any),
    info(0xa9, Transport::Xrc, Operation::WriteLastImm, "XRC RDMA WRITE Last with Immediate", Some("Extended Reliable Connection (XRC) - RDMA WRITE Last with Immediate"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0xaa, Transport::Xrc, Operation::WriteOnly, "XRC RDMA WRITE Only", Some("Extended Reliable Connection (XRC) - RDMA WRITE Only"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::Reth], PayloadRule::Any),
    info(0xab, Transport::Xrc, Operation::WriteOnlyImm, "XRC RDMA WRITE Only with Immediate", Some("Extended Reliable Connection (XRC) - RDMA WRITE Only with Immediate"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::Reth, ExtHeaderKind::ImmDt], PayloadRule::Any),
    info(0xac, Transport::Xrc, Operation::ReadRequest, "XRC RDMA READ Request", Some("Extended Reliable Connection (XRC) - RDMA READ Request"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::Reth], PayloadRule::None),
    info(0xad, Transport::Xrc, Operation::ReadResponseFirst, "XRC RDMA READ response First", Some("Extended Reliable Connection (XRC) - RDMA READ response First"), &[ExtHeaderKind::Aeth], PayloadRule::Any),
    info(0xae, Transport::Xrc, Operation::ReadResponseMiddle, "XRC RDMA READ response Middle", Some("Extended Reliable Connection (XRC) - RDMA READ response Middle"), &[], PayloadRule::Any),
    info(0xaf, Transport::Xrc, Operation::ReadResponseLast, "XRC RDMA READ response Last", Some("Extended Reliable Connection (XRC) - RDMA READ response Last"), &[ExtHeaderKind::Aeth], PayloadRule::Any),
    info(0xb0, Transport::Xrc, Operation::ReadResponseOnly, "XRC RDMA READ response Only", Some("Extended Reliable Connection (XRC) - RDMA READ response Only"), &[ExtHeaderKind::Aeth], PayloadRule::Any),
    info(0xb1, Transport::Xrc, Operation::Acknowledge, "XRC Acknowledge", Some("Extended Reliable Connection (XRC) - Acknowledge"), &[ExtHeaderKind::Aeth], PayloadRule::None),
    info(0xb2, Transport::Xrc, Operation::AtomicAcknowledge, "XRC ATOMIC Acknowledge", Some("Extended Reliable Connection (XRC) - ATOMIC Acknowledge"), &[ExtHeaderKind::Aeth, ExtHeaderKind::AtomicAckEth], PayloadRule::None),
    info(0xb3, Transport::Xrc, Operation::CompareSwap, "XRC CmpSwap", Some("Extended Reliable Connection (XRC) - CmpSwap"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::AtomicEth], PayloadRule::None),
    info(0xb4, Transport::Xrc, Operation::FetchAdd, "XRC FetchAdd", Some("Extended Reliable Connection (XRC) - FetchAdd"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::AtomicEth], PayloadRule::None),
    info(0xb6, Transport::Xrc, Operation::SendLastInvalidate, "XRC SEND Last with Invalidate", Some("Extended Reliable Connection (XRC) - SEND Last with Invalidate"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::Ieth], PayloadRule::Any),
    info(0xb7, Transport::Xrc, Operation::SendOnlyInvalidate, "XRC SEND Only with Invalidate", Some("Extended Reliable Connection (XRC) - SEND Only with Invalidate"), &[ExtHeaderKind::XrcEth, ExtHeaderKind::Ieth], PayloadRule::Any),
];

/// `INDEX[code]` is 1 + the position of `code` in `TABLE`, or 0 for a reserved opcode.
const INDEX: [u8; 256] = build_index();

const fn build_index() -> [u8; 256] {
    let mut index = [0u8; 256];
    let mut i = 0;
    while i < TABLE.len() {
        // TABLE has fewer than 255 entries, so `i + 1` fits a u8.
        index[TABLE[i].code as usize] = (i + 1) as u8;
        i += 1;
    }
    index
}

/// A BTH opcode known to the IBA table.
///
/// Only defined opcodes can be constructed, so every `Opcode` has a name and a header layout.
///
/// ```
/// use roce::{ExtHeaderKind, Opcode, Transport};
///
/// let op = Opcode::new(0x0b).unwrap();
/// assert_eq!(op.name(), "RC RDMA WRITE Only with Immediate");
/// assert_eq!(op.transport(), Transport::Rc);
/// assert_eq!(op.ext_headers(), &[ExtHeaderKind::Reth, ExtHeaderKind::ImmDt]);
/// assert!(Opcode::new(0x15).is_none()); // reserved in RC
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(u8);

impl Opcode {
    /// RC SEND Only (`0x04`).
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// RC SEND Only with Immediate (`0x05`).
    pub const RC_SEND_ONLY_IMM: Opcode = Opcode(0x05);
    /// RC RDMA WRITE Only (`0x0a`).
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0a);
    /// RC RDMA WRITE Only with Immediate (`0x0b`).
    pub const RC_RDMA_WRITE_ONLY_IMM: Opcode = Opcode(0x0b);
    /// RC RDMA READ Request (`0x0c`).
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0c);
    /// RC Acknowledge (`0x11`).
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    /// UD SEND only (`0x64`).
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// The RoCEv2 congestion notification packet (`0x81`).
    pub const CNP: Opcode = Opcode(0x81);

    /// The opcode for `code`, or `None` if IBA reserves it.
    pub fn new(code: u8) -> Option<Opcode> {
        (INDEX[usize::from(code)] != 0).then_some(Opcode(code))
    }

    /// Every defined opcode, in numeric order.
    pub fn all() -> impl Iterator<Item = Opcode> {
        TABLE.iter().map(|i| Opcode(i.code))
    }

    fn info(self) -> &'static OpcodeInfo {
        // The constructor only admits codes present in INDEX, so the slot is non-zero; fall back
        // to the first entry rather than panic if that invariant were ever broken.
        let slot = usize::from(INDEX[usize::from(self.0)]);
        TABLE.get(slot.wrapping_sub(1)).unwrap_or(&TABLE[0])
    }

    /// The raw 8-bit opcode.
    pub fn code(self) -> u8 {
        self.0
    }

    /// The transport service.
    pub fn transport(self) -> Transport {
        self.info().transport
    }

    /// The operation.
    pub fn operation(self) -> Operation {
        self.info().operation
    }

    /// The name with its transport, as Wireshark spells the operation, e.g. "RC RDMA WRITE Only".
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// Wireshark's display string for the `infiniband.bth.opcode` field, e.g.
    /// "Reliable Connection (RC) - RDMA WRITE Only", or `None` where Wireshark shows "Unknown".
    pub fn wireshark_name(self) -> Option<&'static str> {
        self.info().wireshark
    }

    /// The extension headers that follow the BTH, in wire order.
    pub fn ext_headers(self) -> &'static [ExtHeaderKind] {
        self.info().headers
    }

    /// Total size of the extension headers, in bytes.
    pub fn ext_headers_len(self) -> usize {
        self.ext_headers().iter().map(|h| h.wire_len()).sum()
    }

    /// What may follow the extension headers.
    pub fn payload(self) -> PayloadRule {
        self.info().payload
    }

    /// True if the opcode may carry payload bytes.
    pub fn has_payload(self) -> bool {
        self.payload() != PayloadRule::None
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Opcode(0x{:02x} {})", self.0, self.name())
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Opcode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut s = serializer.serialize_struct("Opcode", 2)?;
        s.serialize_field("code", &self.0)?;
        s.serialize_field("name", self.name())?;
        s.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_sorted_unique_and_consistent_with_the_opcode_bits() {
        for pair in TABLE.windows(2) {
            assert!(
                pair[0].code < pair[1].code,
                "table out of order at {:#x}",
                pair[1].code
            );
        }
        for op in Opcode::all() {
            let expected = match op.code() >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                2 => Transport::Rd,
                3 => Transport::Ud,
                4 => Transport::Cnp,
                5 => Transport::Xrc,
                _ => panic!("opcode {:#x} outside the RoCE transports", op.code()),
            };
            assert_eq!(op.transport(), expected, "{op:?}");
            assert!(op.name().starts_with(expected.as_str()), "{op:?}");
        }
    }

    #[test]
    fn counts_per_transport() {
        let count = |t| Opcode::all().filter(|o| o.transport() == t).count();
        assert_eq!(count(Transport::Rc), 25);
        assert_eq!(count(Transport::Uc), 12);
        assert_eq!(count(Transport::Rd), 23);
        assert_eq!(count(Transport::Ud), 2);
        assert_eq!(count(Transport::Cnp), 1);
        assert_eq!(count(Transport::Xrc), 23);
        assert_eq!(Opcode::all().count(), 86);
    }

    #[test]
    fn every_undefined_code_is_rejected() {
        let defined: Vec<u8> = Opcode::all().map(Opcode::code).collect();
        for code in 0..=255u8 {
            assert_eq!(
                Opcode::new(code).is_some(),
                defined.contains(&code),
                "{code:#x}"
            );
        }
        for reserved in [
            0x15, 0x18, 0x1b, 0x1e, 0x1f, 0x2c, 0x3f, 0x56, 0x60, 0x63, 0x66, 0x80, 0x82, 0xb5,
            0xc0, 0xff,
        ] {
            assert!(Opcode::new(reserved).is_none(), "{reserved:#x}");
        }
    }

    #[test]
    fn names_follow_wireshark() {
        let name = |c| Opcode::new(c).map(Opcode::name);
        assert_eq!(name(0x00), Some("RC SEND First"));
        assert_eq!(name(0x0a), Some("RC RDMA WRITE Only"));
        assert_eq!(name(0x0b), Some("RC RDMA WRITE Only with Immediate"));
        assert_eq!(name(0x11), Some("RC Acknowledge"));
        assert_eq!(name(0x12), Some("RC ATOMIC Acknowledge"));
        assert_eq!(name(0x16), Some("RC SEND Last with Invalidate"));
        assert_eq!(name(0x0d), Some("RC RDMA READ response First"));
        assert_eq!(name(0x13), Some("RC CmpSwap"));
        assert_eq!(name(0x64), Some("UD SEND only"));
        assert_eq!(name(0x81), Some("CNP"));
        assert_eq!(
            Opcode::new(0x0b).and_then(Opcode::wireshark_name),
            Some("Reliable Connection (RC) - RDMA WRITE Only with Immediate")
        );
        assert_eq!(Opcode::new(0x1c).and_then(Opcode::wireshark_name), None);
        assert_eq!(Opcode::CNP.wireshark_name(), None);
    }

    #[test]
    fn header_layouts_of_each_class() {
        use ExtHeaderKind::*;
        let h = |c| Opcode::new(c).map(Opcode::ext_headers).unwrap_or(&[]);
        assert_eq!(h(0x0c), &[Reth]);
        assert_eq!(h(0x12), &[Aeth, AtomicAckEth]);
        assert_eq!(h(0x13), &[AtomicEth]);
        assert_eq!(h(0x17), &[Ieth]);
        assert_eq!(h(0x1c), &[Feth, Reth]);
        assert_eq!(h(0x2b), &[Reth, ImmDt]);
        assert_eq!(h(0x4b), &[Rdeth, Deth, Reth, ImmDt]);
        assert_eq!(h(0x4e), &[Rdeth]);
        assert_eq!(h(0x52), &[Rdeth, Aeth, AtomicAckEth]);
        assert_eq!(h(0x65), &[Deth, ImmDt]);
        assert_eq!(h(0xaa), &[XrcEth, Reth]);
        assert_eq!(h(0xb1), &[Aeth]);
        assert_eq!(
            Opcode::new(0x4b).map(Opcode::ext_headers_len),
            Some(4 + 8 + 16 + 4)
        );
        assert!(!Opcode::RC_ACKNOWLEDGE.has_payload());
        assert_eq!(Opcode::CNP.payload(), PayloadRule::Exactly(16));
    }

    #[test]
    fn request_response_split() {
        assert!(Opcode::RC_RDMA_READ_REQUEST.operation().is_request());
        assert!(Opcode::RC_ACKNOWLEDGE.operation().is_response());
        assert!(Opcode::RC_ACKNOWLEDGE.operation().is_acknowledge());
        assert!(!Opcode::CNP.operation().is_request());
        assert!(!Opcode::CNP.operation().is_response());
    }
}
