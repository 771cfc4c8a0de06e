//! The steady-state protocol: what the two ends of an established session
//! exchange after the [connection setup](crate::handshake).
//!
//! - Every RDMA operation is an [`Op`], a SEND or a WRITE; the payload
//!   protection ([`crate::protect`]) binds each sealed message to its op.
//! - The server acknowledges every operation it saw land with an [`Ack`]:
//!   over TLS (the control channel's `ack` message), or, on the streaming
//!   data path, as the 14-byte record of [`Ack::encode`] SENT back over RDMA,
//!   sealed like any payload.
//! - Every operation has an identity that outlives its session: the client's
//!   [`StreamId`], drawn once and kept across reconnects, and the operation's
//!   sequence in that stream (1, 2, 3, … across sessions). A reconnecting
//!   client resumes its stream ([`crate::handshake`]'s resume exchange), so a
//!   lost session neither loses nor duplicates an operation.
//! - The client ends the session with a bye ([`ClientRequest::Bye`]); either
//!   side may end it on its own with an abort that says why ([`AbortReason`]).
//!
//! This module holds the records only: it sits below [`crate::protect`], so
//! the AEAD and the metrics can name an [`Op`] without depending on the
//! setup. The control channel's receivers for this step (`expect_ack`,
//! `expect_client_request`) are in [`crate::session`], `expect_control` in
//! [`crate::lanes`].

use serde::{Deserialize, Serialize};

/// A client's operation stream: a random 128-bit id drawn once and kept across
/// reconnects. With an operation's sequence it is the operation's identity
/// (the application's idempotency key), and it is bound into every sealed
/// message's authenticated data ([`crate::protect`]).
///
/// ```
/// use secure_rdma::datapath::StreamId;
///
/// let id = StreamId::random();
/// assert_ne!(id, StreamId::random());
/// let text = id.to_string();
/// assert_eq!(text.len(), 32);
/// assert_eq!(text.parse::<StreamId>(), Ok(id));
/// assert!("not hex".parse::<StreamId>().is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub [u8; 16]);

impl StreamId {
    /// A new id from the OS CSPRNG: two clients never pick the same one.
    pub fn random() -> StreamId {
        use rand_core::RngCore;
        let mut b = [0u8; 16];
        rand_core::OsRng.fill_bytes(&mut b);
        StreamId(b)
    }

    /// The first 8 hex digits, as logs show it.
    pub fn short(&self) -> String {
        self.to_string()[..8].to_owned()
    }
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl std::fmt::Debug for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamId({self})")
    }
}

/// Text that is not 32 hex digits.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a stream id is 32 hex digits, not {0:?}")]
pub struct BadStreamId(pub String);

impl std::str::FromStr for StreamId {
    type Err = BadStreamId;
    fn from_str(s: &str) -> Result<StreamId, BadStreamId> {
        let bad = || BadStreamId(s.chars().take(40).collect());
        if s.len() != 32 || !s.is_ascii() {
            return Err(bad());
        }
        let mut b = [0u8; 16];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(StreamId(b))
    }
}

impl Serialize for StreamId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for StreamId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<StreamId, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// What the server's application made of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckStatus {
    /// The application took it (its handler returned `Ok`, or there is no handler).
    #[default]
    Delivered,
    /// The application's handler refused it (returned an error). The client
    /// surfaces the refusal and never sends the operation again on its own.
    Refused,
}

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
    /// The client's certificate was revoked (the server's CRL lists it): the session was
    /// ended, and a new connection with the same certificate is refused. Retrying cannot help;
    /// the client needs a new certificate.
    CertificateRevoked,
    /// The client's certificate expired during the session (its notAfter passed). Retrying
    /// with the same certificate cannot help; the client needs a renewed one.
    CertificateExpired {
        /// The certificate's notAfter, in seconds since the Unix epoch.
        not_after: i64,
    },
}

impl AbortReason {
    /// True when a new session may well succeed (an authentication failure, a lifetime, a
    /// server-side setup failure); false when the client's certificate no longer admits it,
    /// so a retry would only be refused.
    pub fn retry_may_help(&self) -> bool {
        !matches!(
            self,
            AbortReason::CertificateRevoked | AbortReason::CertificateExpired { .. }
        )
    }
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
            AbortReason::CertificateRevoked => f.write_str(
                "certificate revoked: the server's CRL lists this client's certificate, so the \
                 session was ended and new connections with it are refused; ask the CA's \
                 operator for a new certificate",
            ),
            AbortReason::CertificateExpired { not_after } => {
                let when = time::OffsetDateTime::from_unix_timestamp(*not_after).map_or_else(
                    |_| format!("{not_after} s after the epoch"),
                    |t| t.to_string(),
                );
                write!(
                    f,
                    "certificate expired: this client's certificate was valid until {when}, so \
                     the session was ended; renew the certificate"
                )
            }
        }
    }
}

/// An operation the server saw land, as the client receives it (step 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The operation.
    pub op: Op,
    /// Its sequence in the client's stream: 1 for the stream's first
    /// operation, then 2, 3, … across sessions.
    pub seq: u64,
    /// Bytes the server saw arrive.
    pub bytes: u32,
    /// Whether the server's application took it.
    pub status: AckStatus,
}

impl Ack {
    /// Bytes of an acknowledgement record sent over RDMA.
    pub const WIRE_LEN: usize = 14;

    /// An acknowledgement of a delivered operation.
    pub fn delivered(op: Op, seq: u64, bytes: u32) -> Ack {
        Ack {
            op,
            seq,
            bytes,
            status: AckStatus::Delivered,
        }
    }

    /// The record SENT over RDMA on the streaming data path: the operation
    /// (0 SEND, 1 WRITE), then the sequence number (u64) and the byte count
    /// (u32), little-endian, then the status (0 delivered, 1 refused). Sealed
    /// like any payload when payloads are protected, so only the server can
    /// have made it.
    ///
    /// ```
    /// use secure_rdma::datapath::{Ack, Op};
    ///
    /// let ack = Ack::delivered(Op::Write, 7, 4096);
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
        out[13] = match self.status {
            AckStatus::Delivered => 0,
            AckStatus::Refused => 1,
        };
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
        let status = match b[13] {
            0 => AckStatus::Delivered,
            1 => AckStatus::Refused,
            _ => return None,
        };
        Some(Ack {
            op,
            seq,
            bytes,
            status,
        })
    }
}

/// What the server waits for from an established client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientRequest {
    /// The client says goodbye ([`Message::Bye`](crate::handshake::Message::Bye)).
    Bye,
}
