//! The steady-state protocol: what the two ends of an established session
//! exchange after the [connection setup](crate::handshake).
//!
//! - Every RDMA operation is an [`Op`], a SEND or a WRITE; the payload
//!   protection ([`crate::protect`]) binds each sealed message to its op.
//! - The server acknowledges every operation it saw land with an [`Ack`]:
//!   over TLS (the control channel's `ack` message), or, on the streaming
//!   data path, as the 13-byte record of [`Ack::encode`] SENT back over RDMA,
//!   sealed like any payload.
//! - The client ends the session with a bye ([`ClientRequest::Bye`]); either
//!   side may end it on its own with an abort that says why ([`AbortReason`]).
//!
//! This module holds the records only: it sits below [`crate::protect`], so
//! the AEAD and the metrics can name an [`Op`] without depending on the
//! setup. The control channel's receivers for this step (`expect_ack`,
//! `expect_close`, `expect_client_request`) are in [`crate::session`].

use serde::{Deserialize, Serialize};

/// An operation the server acknowledges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// An RDMA SEND arrived.
    Send,
    /// An RDMA WRITE landed (signalled by WRITE WITH IMMEDIATE).
    Write,
}

impl std::fmt::Display for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Op::Send => "send",
            Op::Write => "write",
        })
    }
}

/// Why a side ends an established session on its own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AbortReason {
    /// A message that arrived over RDMA failed authentication: forged,
    /// replayed or corrupted. Its QP accepted a packet the peer never sent,
    /// so the session cannot go on; the client may reconnect.
    AuthenticationFailed,
    /// The session reached the server's maximum lifetime; the client may
    /// reconnect.
    Lifetime {
        /// The limit, in seconds.
        seconds: u64,
    },
    /// The server could not make this session's RDMA resources or bring its QP up (after the
    /// accept: memory registration without `CAP_IPC_LOCK`, a device gone, an endpoint it
    /// refused). The fix is usually on the server's side, so it says what failed.
    RdmaSetup {
        /// The server's error.
        detail: String,
    },
}

impl std::fmt::Display for AbortReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AbortReason::AuthenticationFailed => f.write_str(
                "an RDMA message failed authentication (forged, replayed or corrupted); \
                 the session was torn down",
            ),
            AbortReason::Lifetime { seconds } => write!(
                f,
                "the session reached the server's maximum lifetime of {seconds} s; reconnect"
            ),
            AbortReason::RdmaSetup { detail } => write!(
                f,
                "the server could not set up RDMA for this session ({detail}); \
                 the fix is on the server's side: tell its operator"
            ),
        }
    }
}

/// An operation the server saw land, as the client receives it (step 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The operation.
    pub op: Op,
    /// Its sequence number on this connection: 1 for the first, then 2, 3, …
    pub seq: u64,
    /// Bytes the server saw arrive.
    pub bytes: u32,
}

impl Ack {
    /// Bytes of an acknowledgement record sent over RDMA.
    pub const WIRE_LEN: usize = 13;

    /// The record SENT over RDMA on the streaming data path: the operation
    /// (0 SEND, 1 WRITE), then the sequence number (u64) and the byte count
    /// (u32), little-endian. Sealed like any payload when payloads are
    /// protected, so only the server can have made it.
    ///
    /// ```
    /// use secure_rdma::datapath::{Ack, Op};
    ///
    /// let ack = Ack { op: Op::Write, seq: 7, bytes: 4096 };
    /// assert_eq!(Ack::decode(&ack.encode()), Some(ack));
    /// assert_eq!(Ack::decode(b"short"), None);
    /// ```
    pub fn encode(&self) -> [u8; Ack::WIRE_LEN] {
        let mut out = [0u8; Ack::WIRE_LEN];
        out[0] = match self.op {
            Op::Send => 0,
            Op::Write => 1,
        };
        out[1..9].copy_from_slice(&self.seq.to_le_bytes());
        out[9..13].copy_from_slice(&self.bytes.to_le_bytes());
        out
    }

    /// Reads a record made by [`Ack::encode`]; `None` for anything else.
    pub fn decode(b: &[u8]) -> Option<Ack> {
        let b: &[u8; Ack::WIRE_LEN] = b.try_into().ok()?;
        let op = match b[0] {
            0 => Op::Send,
            1 => Op::Write,
            _ => return None,
        };
        let seq = u64::from_le_bytes(b[1..9].try_into().ok()?);
        let bytes = u32::from_le_bytes(b[9..13].try_into().ok()?);
        Some(Ack { op, seq, bytes })
    }
}

/// What the server waits for from an established client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRequest {
    /// The client says goodbye ([`Message::Bye`](crate::handshake::Message::Bye)).
    Bye,
}
