//! The connection-setup wire format: length-prefixed JSON frames.
//!
//! The sequence, all over the mutually authenticated TLS 1.3 stream:
//!
//! 1. client → [`Message::Hello`] (protocol version, capabilities, and its
//!    operation stream: [`StreamHello`])
//! 2. server → [`Message::Accept`] (with what it knows of that stream:
//!    [`Resume`]) or [`Message::Reject`] (server full, quota, version);
//!    nothing RDMA exists on the server before this. A resumed stream is
//!    answered only after its previous session is torn down and its QP
//!    drained, so nothing of the old session is delivered after the answer.
//! 3. both → [`Message::Endpoint`] (GID, QPN, PSN, MTU, buffer)
//! 4. both bring their QP to RTS, then → [`Message::Ready`]
//! 5. both SEND their confirmation token as the first RDMA message; each
//!    checks the peer's and answers [`Message::Confirmed`]. Only then is the
//!    connection established.
//! 6. afterwards, the steady state ([`crate::datapath`]): an acknowledgement
//!    for every operation the server saw land ([`Message::Ack`] over TLS, or,
//!    when the client asked for [`RDMA_ACKS`], an [`Ack`](crate::datapath::Ack) record SENT back
//!    over RDMA, sealed like any payload), and [`Message::Bye`] to close.
//! 7. at any time in step 6, with [`LANES`](crate::lanes::LANES) agreed: one more QP on the same
//!    TLS connection ([`Message::LaneOpen`], answered [`Message::LaneAccept`] or
//!    [`Message::LaneReject`]; see [`crate::lanes`]).
//! 8. with [`WRITE_ON_DEMAND`] agreed, before the client's first RDMA WRITE on the session's
//!    first QP: [`Message::WriteOpen`], answered [`Message::WriteGrant`] (the write region,
//!    registered and bound only now) or [`Message::WriteReject`]. Until then the server's
//!    endpoint carries no buffer: an idle session holds no memory its peer can write.
//!
//! **The early endpoint.** A client that has a QP ready before it says hello (from its warm
//! pool, for the kind of session the server gave it last) sends that QP's endpoint in its
//! hello ([`EarlyEndpoint`], with the session it was made for). A server whose accept
//! describes that same session takes its own QP, brings it to RTR toward the client's and
//! answers with its endpoint inside the accept; its RTS follows while the accept travels.
//! Steps 3 to 5 then take no TLS message at all: the client brings its QP to RTS and SENDs its
//! token first, the server checks it and SENDs its own ([`crate::session::Confirm`]). No
//! `ready` (each QP is known to be in RTR by what came before it: the server's by its accept,
//! the client's by its token), no `confirmed` (the server's token answers the client's). A
//! server that ignores the early endpoint (another session, an earlier release) answers
//! without one, and the client frees that QP and follows steps 3 to 5.
//!
//! This module is the setup: the framing, the one JSON enum of the control
//! channel ([`Message`], whose step-6 variants carry the records of
//! [`crate::datapath`]) and the receivers of steps 1–5. The receivers of
//! step 6 are in [`crate::session`].
//!
//! A frame is a 4-byte big-endian length followed by that many bytes of
//! UTF-8 JSON ([`tokio_util::codec::LengthDelimitedCodec`]). Frames above [`MAX_FRAME`] are refused before any allocation,
//! so a peer cannot make us buffer gigabytes by announcing a huge length.

use std::net::IpAddr;

use serde::{de::DeserializeOwned, Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::datapath::{AbortReason, Ack, AckStatus, Op, StreamId};
use crate::protect::{Cipher, RekeyPolicy};
use crate::psn::{Psn, Qpn};
use crate::verbs::{Gid, PathMtu, RemoteBuffer};

/// Largest frame accepted, in bytes.
pub const MAX_FRAME: usize = 64 * 1024;

/// What a [`Channel`]'s read and write buffers start with, each. Control messages are a few
/// hundred bytes, and a channel lives as long as its session: the framing's default of 8 KiB
/// for each buffer was 16 KiB of every held session's memory. A larger frame grows its
/// buffer as it needs, and a buffer left empty after a message is let go
/// ([`Channel::release_empty`]): an idle session keeps neither.
const CHANNEL_BUFFER: usize = 1024;

/// Errors of framing and message validation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The transport failed.
    #[error("connection error during handshake: {0}")]
    Io(#[from] std::io::Error),
    /// The peer closed the connection.
    #[error("peer closed the connection during the handshake")]
    Closed,
    /// A frame announced more than [`MAX_FRAME`] bytes.
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    /// The frame was not the expected JSON message.
    #[error("malformed handshake message: {0}")]
    Malformed(#[source] serde_json::Error),
    /// A field had an invalid value.
    #[error("invalid {field} in handshake message: {reason}")]
    Invalid {
        /// Field name.
        field: &'static str,
        /// Why it was refused.
        reason: String,
    },
    /// The peer ended the session and said why.
    #[error("the server ended the session: {0}")]
    Aborted(AbortReason),
    /// A well-formed message that does not belong at this step.
    #[error("protocol error: expected {expected}, got {got}{}", if *got == Kind::Bye { " (the peer closed the connection)" } else { "" })]
    Unexpected {
        /// What this step waits for.
        expected: Kind,
        /// What arrived.
        got: Kind,
    },
}

/// Everything a peer needs to connect its RC queue pair to ours and write
/// into our buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoint {
    /// Our GID (RoCEv2: the IP address our RDMA traffic comes from).
    pub gid: Gid,
    /// Our queue pair number.
    pub qpn: Qpn,
    /// The first PSN we will send.
    pub psn: Psn,
    /// Our port's active MTU; the connection uses the smaller of both.
    pub mtu: PathMtu,
    /// The buffer the peer may RDMA WRITE into; `None` when this side
    /// accepts no writes (its memory then has no remote access at all).
    #[serde(default)]
    pub buffer: Option<RemoteBuffer>,
}

impl Endpoint {
    /// Checks the fields serde cannot: a usable GID and a non-empty buffer.
    pub fn validate(&self) -> Result<(), HandshakeError> {
        if self.gid.is_zero() {
            return Err(HandshakeError::Invalid {
                field: "gid",
                reason: "all zeros".to_owned(),
            });
        }
        if let IpAddr::V4(v4) = self.gid.ip() {
            if v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast() {
                return Err(HandshakeError::Invalid {
                    field: "gid",
                    reason: format!("{v4} is not a unicast address"),
                });
            }
        }
        if self.qpn.get() < 2 {
            return Err(HandshakeError::Invalid {
                field: "qpn",
                reason: format!("{} is a reserved QP", self.qpn),
            });
        }
        match &self.buffer {
            Some(buffer) => check_buffer(buffer),
            None => Ok(()),
        }
    }
}

/// Checks a write region the peer announced (in its endpoint, or granted later): not empty,
/// and not past the end of the address space.
pub fn check_buffer(buffer: &RemoteBuffer) -> Result<(), HandshakeError> {
    if buffer.len == 0 || buffer.addr.checked_add(buffer.len).is_none() {
        return Err(HandshakeError::Invalid {
            field: "buffer",
            reason: format!(
                "{} bytes at {:#x} is not a valid region",
                buffer.len, buffer.addr
            ),
        });
    }
    Ok(())
}

/// Version of this protocol; a peer with another version is rejected.
/// Version 2 added payload protection (ciphers in the hello, the choice in
/// the accept, [`Message::Abort`]); version 3 operation streams (the stream in
/// the hello, [`Resume`] in the accept, stream sequences in acknowledgements,
/// sealed messages of format 2).
pub const VERSION: u32 = 3;

/// The client's operation stream, named in its hello: which stream, and where
/// the client stands in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamHello {
    /// The stream, drawn once by the client and kept across its reconnects.
    pub id: StreamId,
    /// The lowest sequence the client has no acknowledgement for (1 for a
    /// fresh stream).
    pub next: u64,
    /// The highest sequence the client ever sent (0 if none): the operations
    /// `next..=sent` may or may not have reached the server.
    pub sent: u64,
}

impl StreamHello {
    /// A stream the client has not used yet.
    pub fn fresh(id: StreamId) -> StreamHello {
        StreamHello {
            id,
            next: 1,
            sent: 0,
        }
    }

    /// Checks what serde cannot: sequences start at 1, and `sent` is at
    /// least `next - 1`.
    pub fn validate(&self) -> Result<(), HandshakeError> {
        if self.next == 0 || self.sent < self.next - 1 || self.next == u64::MAX {
            return Err(HandshakeError::Invalid {
                field: "stream",
                reason: format!(
                    "next {} and sent {} do not describe a stream (next >= 1, sent >= next - 1)",
                    self.next, self.sent
                ),
            });
        }
        Ok(())
    }
}

/// What the server knows of the stream a client named, in its accept.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Resume {
    /// A fresh stream: nothing to resume.
    #[default]
    New,
    /// The server knew the stream: its application answered every operation
    /// up to `delivered`; `acks` are the answers of the client's
    /// `next..=delivered`. The client sends only what follows `delivered`.
    Resumed {
        /// The highest sequence the server's application answered.
        delivered: u64,
        /// The answers the client has not seen, oldest first.
        acks: Vec<AckRecord>,
    },
    /// The server has no state for a stream the client says is not fresh (a
    /// server restart, or the resume window passed): the client sends
    /// `next..=sent` again, and the server flags those deliveries as
    /// possibly delivered before, for the application's idempotency key.
    Expired,
}

/// An acknowledgement as the resume answer carries it (JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckRecord {
    /// The operation.
    pub op: Op,
    /// Its stream sequence.
    pub seq: u64,
    /// Bytes that arrived.
    pub bytes: u32,
    /// What the application made of it.
    #[serde(default)]
    pub status: AckStatus,
}

impl From<Ack> for AckRecord {
    fn from(a: Ack) -> AckRecord {
        AckRecord {
            op: a.op,
            seq: a.seq,
            bytes: a.bytes,
            status: a.status,
        }
    }
}

impl From<AckRecord> for Ack {
    fn from(a: AckRecord) -> Ack {
        Ack {
            op: a.op,
            seq: a.seq,
            bytes: a.bytes,
            status: a.status,
        }
    }
}

/// Capabilities this implementation offers in its hello.
pub const CAPABILITIES: [&str; 6] = [
    "send",
    "write-with-imm",
    "confirm-token",
    "payload-protection",
    KEY_ROTATION,
    WRITE_ON_DEMAND,
];

/// The capability of a client that follows and applies key rotation: the
/// server rotates the payload keys of its session by its policy, announced
/// in [`Message::Accept`]'s `rekey`. A client without it (an earlier release)
/// keeps one key per direction, as it expects.
pub const KEY_ROTATION: &str = "key-rotation";

/// The capability a client lists in its hello to have its operations
/// acknowledged over RDMA instead of TLS: the streaming data path. The server
/// answers with [`Accepted::rdma_window`], the operations the client
/// may have unacknowledged at once (its receive slots and write slots).
pub const RDMA_ACKS: &str = "rdma-acks";

/// The capability of a client that asks for the server's write region when it first WRITEs
/// ([`Message::WriteOpen`]) instead of receiving it in the server's endpoint. A server that
/// agrees says so in its accept ([`Accepted::writes_on_demand`]) and registers no
/// write region, and binds no memory window, until asked: a held session that never WRITEs
/// costs neither, and exposes no memory to its peer. The session's first QP only: a lane
/// ([`crate::lanes`]) is opened to carry traffic, and gets its region with its endpoint.
pub const WRITE_ON_DEMAND: &str = "write-on-demand";

/// Why the server refused a client.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RejectReason {
    /// Every client slot is taken.
    ServerFull {
        /// Clients connected.
        active: usize,
        /// The limit.
        max: usize,
    },
    /// A quota of this identity or of the server would be exceeded.
    Quota {
        /// Which limit, in the quota file's words.
        detail: String,
    },
    /// The client speaks another protocol version.
    Version {
        /// The server's version.
        server: u32,
        /// The client's version.
        client: u32,
    },
    /// The server is shutting down.
    ShuttingDown,
    /// The server cannot serve RDMA for this connection (no device or GID
    /// for the address the client reached it on).
    Unavailable {
        /// What is missing.
        detail: String,
    },
    /// The identity already holds as many sessions as the server allows one
    /// identity.
    IdentityLimit {
        /// The identity.
        identity: String,
        /// Its live sessions.
        active: usize,
        /// The limit.
        max: usize,
    },
    /// The server's policy refuses what the client asked for (e.g. a
    /// session without payload protection).
    Policy {
        /// Which policy, and how to comply.
        detail: String,
    },
    /// The identity already holds as many lanes (QPs of its sessions) as the server allows
    /// one identity ([`crate::lanes`]).
    LaneLimit {
        /// The identity.
        identity: String,
        /// Its live lanes, the first lane of each session included.
        active: usize,
        /// The limit.
        max: usize,
    },
}

impl std::fmt::Display for RejectReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RejectReason::ServerFull { active, max } => write!(f, "server full ({active}/{max})"),
            RejectReason::Quota { detail } => write!(f, "quota exceeded: {detail}"),
            RejectReason::Version { server, client } => write!(
                f,
                "protocol version mismatch (server {server}, client {client})"
            ),
            RejectReason::ShuttingDown => f.write_str("server is shutting down"),
            RejectReason::Unavailable { detail } => write!(f, "server cannot serve RDMA: {detail}"),
            RejectReason::Policy { detail } => write!(f, "refused by server policy: {detail}"),
            RejectReason::IdentityLimit {
                identity,
                active,
                max,
            } => write!(
                f,
                "identity {identity} already has {active} sessions (the server allows {max} per identity)"
            ),
            RejectReason::LaneLimit {
                identity,
                active,
                max,
            } => write!(
                f,
                "identity {identity} already has {active} lanes (the server allows {max} per identity); use the lanes it has, or close some"
            ),
        }
    }
}

/// Every message of the control channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// Client's opening message.
    Hello {
        /// Protocol version, [`VERSION`].
        version: u32,
        /// Features the client supports.
        capabilities: Vec<String>,
        /// The payload ciphers the client accepts, preferred first; empty
        /// asks for payloads in clear.
        #[serde(default)]
        ciphers: Vec<Cipher>,
        /// The client's operation stream and where it stands in it; absent
        /// only in the hello of an older version, which is refused by version.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream: Option<StreamHello>,
        /// A QP the client already has, for the session it names: see [`EarlyEndpoint`].
        #[serde(default, skip_serializing_if = "Option::is_none")]
        early: Option<EarlyEndpoint>,
    },
    /// The server admits the client.
    Accept {
        /// The largest message or write the server takes, in bytes.
        buffer_size: u32,
        /// The identity the server authenticated.
        identity: String,
        /// The cipher protecting payloads, `None` for payloads in clear.
        #[serde(default)]
        cipher: Option<Cipher>,
        /// When the client asked for [`RDMA_ACKS`] and the server agrees: how
        /// many operations the client may have unacknowledged at once.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rdma_window: Option<u32>,
        /// What the server knows of the client's stream.
        #[serde(default)]
        resume: Resume,
        /// When each direction's payload key rotates (with a cipher): the client applies it
        /// to what it sends, as the server does. Absent: never (a server of an earlier
        /// release, which follows no epoch).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rekey: Option<RekeyPolicy>,
        /// When the client listed [`LANES`](crate::lanes::LANES) and the server agrees: the
        /// most lanes (QPs, this first one included) the client's identity may hold at once.
        /// Absent: the session has one lane (a server of an earlier release, or no lanes
        /// asked for).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lanes: Option<u32>,
        /// When the client listed [`WRITE_ON_DEMAND`] and the server agrees: its endpoint
        /// carries no write region, which the client asks for before its first WRITE
        /// ([`Message::WriteOpen`]). Absent: the region comes with the endpoint.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        writes_on_demand: bool,
        /// The server's endpoint, its QP already in RTR toward the client's early endpoint
        /// (the hello's [`EarlyEndpoint`]): steps 3 to 5 follow over RDMA alone. Absent: the
        /// early endpoint was not used (or none was sent), and both ends send theirs (step 3).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        endpoint: Option<Endpoint>,
    },
    /// The server refuses the client.
    Reject {
        /// Why.
        reason: RejectReason,
    },
    /// Connection parameters of one side.
    Endpoint {
        /// The endpoint.
        endpoint: Endpoint,
    },
    /// This side's QP is in RTS.
    Ready,
    /// This side received the peer's correct confirmation token over RDMA.
    Confirmed,
    /// The server saw an operation land.
    Ack {
        /// What landed.
        op: Op,
        /// Its sequence in the client's stream.
        seq: u64,
        /// Bytes that arrived.
        bytes: u32,
        /// What the server's application made of it.
        #[serde(default)]
        status: AckStatus,
    },
    /// Orderly close.
    Bye,
    /// The client asks for one more lane on its live session ([`crate::lanes`]): its QP's
    /// parameters and the lane's operation stream.
    LaneOpen {
        /// The lane's number (1 for the second lane, and so on).
        lane: u32,
        /// The lane's operation stream, drawn by the client.
        stream: StreamId,
        /// The client's QP of the lane.
        endpoint: Endpoint,
        /// When the lane carries on the stream of a lane of this session that was lost: where
        /// the client stands in it (`stream` is its id). Absent: a fresh stream.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume: Option<StreamHello>,
    },
    /// The server opened the lane: its QP is in RTS, connected to the client's.
    LaneAccept {
        /// The lane's number, as asked.
        lane: u32,
        /// The server's QP of the lane.
        endpoint: Endpoint,
        /// What the server knows of the stream the lane resumes ([`Resume::New`] for a fresh
        /// stream).
        #[serde(default)]
        resume: Resume,
    },
    /// The server refuses the lane; the session and its other lanes go on.
    LaneReject {
        /// The lane's number, as asked.
        lane: u32,
        /// Why.
        reason: RejectReason,
    },
    /// The server ended a lane on its own (a message on it failed authentication, its QP
    /// failed); the session and its other lanes go on. Sent only to a client that listed
    /// [`LANE_CLOSED`](crate::lanes::LANE_CLOSED), which then resumes the lane's stream at
    /// once instead of after its acknowledgement timeout.
    LaneClosed {
        /// The lane's number.
        lane: u32,
        /// Why, for people.
        reason: String,
    },
    /// The sender ends the session on its own, and says why.
    Abort {
        /// Why.
        reason: AbortReason,
    },
    /// The client asks for the write region of the session's first QP, before its first
    /// RDMA WRITE ([`WRITE_ON_DEMAND`]).
    WriteOpen,
    /// The server registered the write region and bound its window to the session's first
    /// QP: the client's WRITEs may go to `buffer` from now on.
    WriteGrant {
        /// Where the client WRITEs, as an endpoint's buffer says it.
        buffer: RemoteBuffer,
    },
    /// The server refuses the write region (a quota, the device); the session goes on, with
    /// SENDs only.
    WriteReject {
        /// Why.
        reason: RejectReason,
    },
}

/// The kind of a [`Message`], without its fields: what a step expects and what came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// [`Message::Hello`].
    Hello,
    /// [`Message::Accept`].
    Accept,
    /// [`Message::Reject`].
    Reject,
    /// [`Message::Endpoint`].
    Endpoint,
    /// [`Message::Ready`].
    Ready,
    /// [`Message::Confirmed`].
    Confirmed,
    /// [`Message::Ack`].
    Ack,
    /// [`Message::Bye`].
    Bye,
    /// [`Message::Abort`].
    Abort,
    /// [`Message::LaneOpen`].
    LaneOpen,
    /// [`Message::LaneAccept`].
    LaneAccept,
    /// [`Message::LaneReject`].
    LaneReject,
    /// [`Message::LaneClosed`].
    LaneClosed,
    /// [`Message::WriteOpen`].
    WriteOpen,
    /// [`Message::WriteGrant`].
    WriteGrant,
    /// [`Message::WriteReject`].
    WriteReject,
}

impl Kind {
    /// The message's `type` on the wire.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::Hello => "hello",
            Kind::Accept => "accept",
            Kind::Reject => "reject",
            Kind::Endpoint => "endpoint",
            Kind::Ready => "ready",
            Kind::Confirmed => "confirmed",
            Kind::Ack => "ack",
            Kind::Bye => "bye",
            Kind::Abort => "abort",
            Kind::LaneOpen => "lane_open",
            Kind::LaneAccept => "lane_accept",
            Kind::LaneReject => "lane_reject",
            Kind::LaneClosed => "lane_closed",
            Kind::WriteOpen => "write_open",
            Kind::WriteGrant => "write_grant",
            Kind::WriteReject => "write_reject",
        }
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Message {
    /// Which message this is, for "expected X, got Y" errors.
    pub fn kind(&self) -> Kind {
        match self {
            Message::Hello { .. } => Kind::Hello,
            Message::Accept { .. } => Kind::Accept,
            Message::Reject { .. } => Kind::Reject,
            Message::Endpoint { .. } => Kind::Endpoint,
            Message::Ready => Kind::Ready,
            Message::Confirmed => Kind::Confirmed,
            Message::Ack { .. } => Kind::Ack,
            Message::Bye => Kind::Bye,
            Message::Abort { .. } => Kind::Abort,
            Message::LaneOpen { .. } => Kind::LaneOpen,
            Message::LaneAccept { .. } => Kind::LaneAccept,
            Message::LaneReject { .. } => Kind::LaneReject,
            Message::LaneClosed { .. } => Kind::LaneClosed,
            Message::WriteOpen => Kind::WriteOpen,
            Message::WriteGrant { .. } => Kind::WriteGrant,
            Message::WriteReject { .. } => Kind::WriteReject,
        }
    }
}

/// A client's QP made before its hello, and the session it was made for: the server uses it
/// only when its accept describes that same session (buffer size, acknowledgement window,
/// cipher), since the client's slots were sized for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EarlyEndpoint {
    /// The client's QP, in INIT.
    pub endpoint: Endpoint,
    /// The server's buffer size the client's slots were made for.
    pub buffer_size: u32,
    /// The acknowledgement window its receive slots were made for (`None`: over TLS).
    #[serde(default)]
    pub rdma_window: Option<u32>,
    /// The payload cipher its keys are for (`None`: in clear).
    #[serde(default)]
    pub cipher: Option<Cipher>,
}

impl EarlyEndpoint {
    /// Whether a session of these parameters is the one the client's QP was made for.
    pub fn fits(&self, buffer_size: u32, rdma_window: Option<u32>, cipher: Option<Cipher>) -> bool {
        (self.buffer_size, self.rdma_window, self.cipher) == (buffer_size, rdma_window, cipher)
    }
}

/// The client's opening message, as the server receives it (step 1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The client's protocol version; [`VERSION`] is the only one served.
    pub version: u32,
    /// Features the client supports.
    pub capabilities: Vec<String>,
    /// Payload ciphers the client accepts, preferred first; empty for none.
    pub ciphers: Vec<Cipher>,
    /// The client's operation stream (`None` only from a client of an older
    /// [`VERSION`], which the server refuses by version).
    pub stream: Option<StreamHello>,
    /// The client's QP made before its hello, checked ([`Endpoint::validate`]).
    pub early: Option<EarlyEndpoint>,
}

/// The server's answer to a hello, as the client receives it (step 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted: RDMA setup follows.
    Accepted(Accepted),
    /// Refused, with the reason.
    Rejected(RejectReason),
}

/// What the server's accept says (step 2), as the client receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Accepted {
    /// The largest message or write the server takes, in bytes.
    pub buffer_size: u32,
    /// The identity the server authenticated.
    pub identity: String,
    /// The payload cipher, `None` for payloads in clear.
    pub cipher: Option<Cipher>,
    /// Acknowledgements come over RDMA, with this many operations allowed
    /// unacknowledged; `None`: over TLS, one at a time.
    pub rdma_window: Option<u32>,
    /// What the server knows of the client's stream.
    pub resume: Resume,
    /// When the payload keys rotate; `None`: never.
    pub rekey: Option<RekeyPolicy>,
    /// The most lanes the identity may hold, when the server offers lanes; `None`: one.
    pub lanes: Option<u32>,
    /// The server grants its write region when the client first asks
    /// ([`WRITE_ON_DEMAND`]); `false`: it comes with the server's endpoint.
    pub writes_on_demand: bool,
    /// The server's endpoint, when it took the hello's early endpoint (checked).
    pub endpoint: Option<Endpoint>,
}

/// A framed control channel over any byte stream (a TLS stream in the
/// product). Receiving is cancel-safe, so it can sit in a `select!` next to a
/// completion queue.
pub struct Channel<S> {
    framed: tokio_util::codec::Framed<S, tokio_util::codec::LengthDelimitedCodec>,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Channel<S> {
    /// Wraps a stream: 4-byte big-endian lengths, at most [`MAX_FRAME`].
    pub fn new(stream: S) -> Self {
        let codec = tokio_util::codec::LengthDelimitedCodec::builder()
            .length_field_length(4)
            .max_frame_length(MAX_FRAME)
            .new_codec();
        Channel {
            framed: tokio_util::codec::Framed::with_capacity(stream, codec, CHANNEL_BUFFER),
        }
    }

    /// Sends one message (any serde type; the product sends [`Message`]s).
    pub async fn send<T: Serialize + ?Sized>(&mut self, msg: &T) -> Result<(), HandshakeError> {
        use futures_util::SinkExt;
        let body = serde_json::to_vec(msg).map_err(HandshakeError::Malformed)?;
        if body.len() > MAX_FRAME {
            return Err(HandshakeError::TooLarge(body.len()));
        }
        self.framed.send(bytes::Bytes::from(body)).await?;
        self.release_empty();
        Ok(())
    }

    /// Lets go of a framing buffer that holds nothing: after a message, sent (and flushed) or
    /// received whole, the buffer's capacity would otherwise stay for the session's life (1 KiB
    /// or more each way, for a session that may then sit idle for hours). The next message
    /// allocates what it needs: the read side grows from a few bytes to the frame's announced
    /// length in one step.
    fn release_empty(&mut self) {
        if self.framed.write_buffer().is_empty() && self.framed.write_buffer().capacity() > 0 {
            *self.framed.write_buffer_mut() = bytes::BytesMut::new();
        }
        if self.framed.read_buffer().is_empty() && self.framed.read_buffer().capacity() > 0 {
            *self.framed.read_buffer_mut() = bytes::BytesMut::new();
        }
    }

    /// Bytes the framing buffers hold allocated (read, write): what an idle channel costs.
    #[cfg(test)]
    fn buffered_capacity(&self) -> (usize, usize) {
        (
            self.framed.read_buffer().capacity(),
            self.framed.write_buffer().capacity(),
        )
    }

    /// Receives one message; [`HandshakeError::Closed`] at end of stream.
    pub async fn recv<T: DeserializeOwned>(&mut self) -> Result<T, HandshakeError> {
        use futures_util::StreamExt;
        match self.framed.next().await {
            None => Err(HandshakeError::Closed),
            Some(Err(e))
                if e.get_ref().is_some_and(|inner| {
                    inner.is::<tokio_util::codec::LengthDelimitedCodecError>()
                }) =>
            {
                Err(HandshakeError::TooLarge(MAX_FRAME + 1))
            }
            Some(Err(e)) => Err(e.into()),
            Some(Ok(frame)) => {
                let parsed = serde_json::from_slice(&frame).map_err(HandshakeError::Malformed);
                // The frame shares the read buffer's allocation: let go of both now.
                drop(frame);
                self.release_empty();
                parsed
            }
        }
    }

    /// Receives the client's hello (step 1, server side).
    pub async fn expect_hello(&mut self) -> Result<Hello, HandshakeError> {
        match self.recv::<Message>().await? {
            Message::Hello {
                version,
                capabilities,
                ciphers,
                stream,
                early,
            } => {
                if let Some(s) = &stream {
                    s.validate()?;
                }
                if let Some(e) = &early {
                    e.endpoint.validate()?;
                }
                Ok(Hello {
                    version,
                    capabilities,
                    ciphers,
                    stream,
                    early,
                })
            }
            other => Err(unexpected(Kind::Hello, &other)),
        }
    }

    /// Receives the server's accept or reject (step 2, client side).
    pub async fn expect_verdict(&mut self) -> Result<Verdict, HandshakeError> {
        match self.recv::<Message>().await? {
            Message::Accept {
                buffer_size,
                identity,
                cipher,
                rdma_window,
                resume,
                rekey,
                lanes,
                writes_on_demand,
                endpoint,
            } => {
                if let Some(e) = &endpoint {
                    e.validate()?;
                }
                Ok(Verdict::Accepted(Accepted {
                    buffer_size,
                    identity,
                    cipher,
                    rdma_window,
                    resume,
                    rekey,
                    lanes,
                    writes_on_demand,
                    endpoint,
                }))
            }
            Message::Reject { reason } => Ok(Verdict::Rejected(reason)),
            // After an early endpoint the server sets its QP up before it answers: when that
            // fails it says why instead.
            Message::Abort { reason } => Err(HandshakeError::Aborted(reason)),
            other => Err(unexpected(Kind::Accept, &other)),
        }
    }

    /// Receives the peer's endpoint (step 3) and checks what serde cannot
    /// ([`Endpoint::validate`]).
    pub async fn expect_endpoint(&mut self) -> Result<Endpoint, HandshakeError> {
        match self.recv::<Message>().await? {
            Message::Endpoint { endpoint } => {
                endpoint.validate()?;
                Ok(endpoint)
            }
            // The server's side of the setup failed, and it says why.
            Message::Abort { reason } => Err(HandshakeError::Aborted(reason)),
            other => Err(unexpected(Kind::Endpoint, &other)),
        }
    }

    /// Receives the peer's "my QP is in RTS" (step 4).
    pub async fn expect_ready(&mut self) -> Result<(), HandshakeError> {
        match self.recv::<Message>().await? {
            Message::Ready => Ok(()),
            // The server's side of the setup failed, and it says why.
            Message::Abort { reason } => Err(HandshakeError::Aborted(reason)),
            other => Err(unexpected(Kind::Ready, &other)),
        }
    }

    /// Receives the peer's "your token arrived over RDMA" (step 5).
    pub async fn expect_confirmed(&mut self) -> Result<(), HandshakeError> {
        match self.recv::<Message>().await? {
            Message::Confirmed => Ok(()),
            // The server's side of the setup failed, and it says why.
            Message::Abort { reason } => Err(HandshakeError::Aborted(reason)),
            other => Err(unexpected(Kind::Confirmed, &other)),
        }
    }

    /// The underlying stream (e.g. to read TLS session data).
    pub fn get_ref(&self) -> &S {
        self.framed.get_ref()
    }

    /// Flushes and shuts the stream down.
    pub async fn close(&mut self) {
        use futures_util::SinkExt;
        let _ = SinkExt::<bytes::Bytes>::close(&mut self.framed).await;
    }

    /// Awaits `rdma`, a step carried over RDMA alone (a confirmation by tokens), while
    /// listening on this channel: each message that arrives meanwhile goes to `heard`, which
    /// ends the step with its error (the peer's abort, with the peer's reason) or lets it go
    /// on (`None`: a notice about something else). Without this, a peer that gave up and said
    /// why over TLS would leave the step to wait out its own timeout and report that instead.
    /// A channel that fails or closes ends the step too: the session cannot go on without it.
    /// When `rdma` finishes first, nothing unread is lost (receiving is cancel-safe).
    ///
    /// ```
    /// use secure_rdma::datapath::AbortReason;
    /// use secure_rdma::handshake::{Channel, HandshakeError, Message};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), HandshakeError> {
    /// let (a, b) = tokio::io::duplex(4096);
    /// let (mut client, mut server) = (Channel::new(a), Channel::new(b));
    /// let reason = AbortReason::RdmaSetup { detail: "bad token".into() };
    /// server.send(&Message::Abort { reason: reason.clone() }).await?;
    /// // A confirmation that would only have timed out ends with the server's reason.
    /// let never = std::future::pending::<Result<(), HandshakeError>>();
    /// let err = client.unless_told(never, |m| Some(m.into_abort())).await.unwrap_err();
    /// assert!(matches!(err, HandshakeError::Aborted(r) if r == reason));
    /// # Ok(()) }
    /// ```
    pub async fn unless_told<T, E: From<HandshakeError>>(
        &mut self,
        rdma: impl std::future::Future<Output = Result<T, E>>,
        mut heard: impl FnMut(Message) -> Option<E>,
    ) -> Result<T, E> {
        tokio::pin!(rdma);
        loop {
            tokio::select! {
                // The step's own result first: a confirmation that completed is not undone by
                // a message that came with it.
                biased;
                done = &mut rdma => return done,
                message = self.recv::<Message>() => {
                    if let Some(e) = heard(message?) {
                        return Err(e);
                    }
                }
            }
        }
    }
}

impl Message {
    /// What a message that arrives while only an abort may come means: the peer's reason for
    /// an [`Message::Abort`], a protocol error for anything else.
    pub fn into_abort(self) -> HandshakeError {
        match self {
            Message::Abort { reason } => HandshakeError::Aborted(reason),
            other => unexpected(Kind::Abort, &other),
        }
    }
}

/// The error of a step that received `got` where it expected `expected`.
pub(crate) fn unexpected(expected: Kind, got: &Message) -> HandshakeError {
    HandshakeError::Unexpected {
        expected,
        got: got.kind(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::Ack;
    use tokio::io::AsyncWriteExt;

    fn endpoint() -> Endpoint {
        Endpoint {
            gid: "::ffff:10.77.0.1".parse().unwrap(),
            qpn: Qpn::new(0x11).unwrap(),
            psn: Psn::new(0xabcdef).unwrap(),
            mtu: PathMtu::Mtu1024,
            buffer: Some(RemoteBuffer {
                addr: 0x7f00_0000_0000,
                rkey: 0x1234,
                len: 4096,
            }),
        }
    }

    #[tokio::test]
    async fn channel_round_trip_and_limits() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let (mut a, mut b) = (Channel::new(a), Channel::new(b));
        let hello = Message::Hello {
            version: VERSION,
            capabilities: vec!["send".into()],
            ciphers: vec![Cipher::Aes256Gcm],
            stream: Some(StreamHello::fresh(StreamId([3; 16]))),
            early: None,
        };
        a.send(&hello).await.unwrap();
        a.send(&Message::Endpoint {
            endpoint: endpoint(),
        })
        .await
        .unwrap();
        assert_eq!(b.recv::<Message>().await.unwrap(), hello);
        assert_eq!(
            b.recv::<Message>().await.unwrap(),
            Message::Endpoint {
                endpoint: endpoint()
            }
        );
        // a frame over the limit is refused from its header
        let (raw, c) = tokio::io::duplex(1 << 20);
        let mut c = Channel::new(c);
        let mut raw = raw;
        raw.write_all(&(MAX_FRAME as u32 + 1).to_be_bytes())
            .await
            .unwrap();
        assert!(matches!(
            c.recv::<Message>().await,
            Err(HandshakeError::TooLarge(_))
        ));
        // end of stream is Closed
        drop(a);
        assert!(matches!(
            b.recv::<Message>().await,
            Err(HandshakeError::Closed)
        ));
    }

    /// The buffers start small (a held session keeps its channel); frames of up to
    /// [`MAX_FRAME`] still pass whole, in order, both ways, through a pipe far smaller than
    /// them.
    #[tokio::test]
    async fn frames_larger_than_the_starting_buffers_pass_whole_both_ways() {
        let (a, b) = tokio::io::duplex(512);
        let (mut a, mut b) = (Channel::new(a), Channel::new(b));
        let sizes = [
            10,
            CHANNEL_BUFFER - 4,
            CHANNEL_BUFFER + 1,
            20_000,
            MAX_FRAME - 2,
            3,
        ];
        let texts: Vec<String> = sizes
            .iter()
            .enumerate()
            .map(|(i, n)| char::from(b'a' + i as u8).to_string().repeat(*n))
            .collect();
        let sent = texts.clone();
        let writer = tokio::spawn(async move {
            for t in &sent {
                a.send(t).await.unwrap();
            }
            for _ in &sent {
                assert_eq!(a.recv::<String>().await.unwrap().len(), 7);
            }
        });
        for t in &texts {
            let got: String = b.recv().await.unwrap();
            assert_eq!(got.len(), t.len());
            assert_eq!(&got, t);
            b.send(&"thanks!".to_owned()).await.unwrap();
        }
        writer.await.unwrap();
    }

    /// A held session's channel sits idle between messages: its framing buffers are let go
    /// once a message is through (a buffer that still holds part of the next frame is kept).
    #[tokio::test]
    async fn an_idle_channel_keeps_no_framing_buffer() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut a, mut b) = (Channel::new(a), Channel::new(b));
        assert_eq!(a.buffered_capacity(), (CHANNEL_BUFFER, CHANNEL_BUFFER));
        a.send(&Message::Ready).await.unwrap();
        assert_eq!(a.buffered_capacity().1, 0, "sent and flushed");
        b.expect_ready().await.unwrap();
        assert_eq!(b.buffered_capacity().0, 0, "received whole");
        // Two frames sent back to back arrive whole, in order.
        a.send(&Message::Confirmed).await.unwrap();
        a.send(&Message::Bye).await.unwrap();
        b.expect_confirmed().await.unwrap();
        assert_eq!(b.recv::<Message>().await.unwrap(), Message::Bye);
        assert_eq!(b.buffered_capacity(), (0, 0));
        // And the channel works on, both ways, from empty buffers.
        b.send(&Message::WriteOpen).await.unwrap();
        assert_eq!(a.recv::<Message>().await.unwrap(), Message::WriteOpen);
        assert_eq!(a.buffered_capacity(), (0, 0));
    }

    #[tokio::test]
    async fn each_step_names_what_it_expected_and_what_came() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut a, mut b) = (Channel::new(a), Channel::new(b));
        a.send(&Message::Ready).await.unwrap();
        let err = b.expect_endpoint().await.unwrap_err();
        assert!(
            matches!(
                err,
                HandshakeError::Unexpected {
                    expected: Kind::Endpoint,
                    got: Kind::Ready
                }
            ),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "protocol error: expected endpoint, got ready"
        );

        // An abort where an ack belongs carries the server's reason.
        a.send(&Message::Abort {
            reason: AbortReason::AuthenticationFailed,
        })
        .await
        .unwrap();
        let err = b.expect_ack().await.unwrap_err();
        assert!(matches!(
            err,
            HandshakeError::Aborted(AbortReason::AuthenticationFailed)
        ));
        assert!(err.to_string().contains("failed authentication"), "{err}");

        // The server's setup failing, at each setup step, reaches the client with its error.
        for step in 0..3 {
            a.send(&Message::Abort {
                reason: AbortReason::RdmaSetup {
                    detail: "ibv_reg_mr_iova2 failed on rxe-a: Operation not permitted".into(),
                },
            })
            .await
            .unwrap();
            let err = match step {
                0 => b.expect_endpoint().await.unwrap_err(),
                1 => b.expect_ready().await.unwrap_err(),
                _ => b.expect_confirmed().await.unwrap_err(),
            };
            assert!(
                matches!(err, HandshakeError::Aborted(AbortReason::RdmaSetup { .. })),
                "{err:?}"
            );
            assert_eq!(
                err.to_string(),
                "the server ended the session: the server could not set up RDMA for this \
                 session (ibv_reg_mr_iova2 failed on rxe-a: Operation not permitted); the fix is \
                 on the server's side: tell its operator"
            );
        }

        // A bye where an ack belongs says the peer left.
        a.send(&Message::Bye).await.unwrap();
        let err = b.expect_ack().await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "protocol error: expected ack, got bye (the peer closed the connection)"
        );

        // The right message gives its typed contents.
        a.send(&Message::Ack {
            op: Op::Write,
            seq: 7,
            bytes: 3,
            status: AckStatus::Refused,
        })
        .await
        .unwrap();
        assert_eq!(
            b.expect_ack().await.unwrap(),
            Ack {
                op: Op::Write,
                seq: 7,
                bytes: 3,
                status: AckStatus::Refused,
            }
        );
        a.send(&Message::Reject {
            reason: RejectReason::ShuttingDown,
        })
        .await
        .unwrap();
        assert_eq!(
            b.expect_verdict().await.unwrap(),
            Verdict::Rejected(RejectReason::ShuttingDown)
        );
        // An endpoint that parses but is unusable is refused by the receiver itself.
        let mut bad = endpoint();
        if let Some(b) = bad.buffer.as_mut() {
            b.len = 0;
        }
        a.send(&Message::Endpoint { endpoint: bad }).await.unwrap();
        assert!(matches!(
            b.expect_endpoint().await,
            Err(HandshakeError::Invalid {
                field: "buffer",
                ..
            })
        ));
        // Every kind's name is its wire `type`.
        for (msg, kind) in [
            (Message::Ready, Kind::Ready),
            (Message::Confirmed, Kind::Confirmed),
            (Message::Bye, Kind::Bye),
            (Message::WriteOpen, Kind::WriteOpen),
            (
                Message::WriteGrant {
                    buffer: RemoteBuffer {
                        addr: 0,
                        rkey: 1,
                        len: 1,
                    },
                },
                Kind::WriteGrant,
            ),
            (
                Message::WriteReject {
                    reason: RejectReason::ShuttingDown,
                },
                Kind::WriteReject,
            ),
        ] {
            assert_eq!(msg.kind(), kind);
            let json = serde_json::to_value(&msg).unwrap();
            assert_eq!(json["type"], kind.name());
        }
    }

    #[test]
    fn protection_fields_have_wire_names_and_defaults() {
        let json = serde_json::to_string(&Message::Accept {
            buffer_size: 4096,
            identity: "alice".into(),
            cipher: Some(Cipher::ChaCha20Poly1305),
            rdma_window: None,
            resume: Resume::New,
            rekey: None,
            lanes: None,
            writes_on_demand: false,
            endpoint: None,
        })
        .unwrap();
        assert_eq!(
            json,
            r#"{"type":"accept","buffer_size":4096,"identity":"alice","cipher":"chacha20-poly1305","resume":{"kind":"new"}}"#
        );
        // A peer that does not know the field asks for, or gets, no protection.
        let old: Message =
            serde_json::from_str(r#"{"type":"hello","version":1,"capabilities":[]}"#).unwrap();
        assert!(matches!(old, Message::Hello { ciphers, .. } if ciphers.is_empty()));
    }

    #[test]
    fn the_rekey_policy_round_trips_through_the_accept() {
        let policy = RekeyPolicy::default()
            .with_messages(100)
            .with_bytes(0)
            .with_seconds(7);
        let accept = Message::Accept {
            buffer_size: 4096,
            identity: "alice".into(),
            cipher: Some(Cipher::Aes256Gcm),
            rdma_window: None,
            resume: Resume::New,
            rekey: Some(policy),
            lanes: None,
            writes_on_demand: false,
            endpoint: None,
        };
        let json = serde_json::to_string(&accept).unwrap();
        assert!(
            json.ends_with(r#","rekey":{"messages":100,"bytes":0,"seconds":7}}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<Message>(&json).unwrap(), accept);
        // Over a channel, as the client receives it.
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut server, mut client) = (Channel::new(a), Channel::new(b));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let verdict = rt.block_on(async {
            server.send(&accept).await.unwrap();
            client.expect_verdict().await.unwrap()
        });
        assert!(
            matches!(verdict, Verdict::Accepted(Accepted { rekey: Some(p), .. }) if p == policy)
        );
        // An accept without the field (a server of an earlier release) rotates nothing, and a
        // policy missing a threshold has it off.
        let old: Message = serde_json::from_str(
            r#"{"type":"accept","buffer_size":64,"identity":"a","cipher":"aes-256-gcm"}"#,
        )
        .unwrap();
        assert!(matches!(old, Message::Accept { rekey: None, .. }));
        let partial: RekeyPolicy = serde_json::from_str(r#"{"messages":5}"#).unwrap();
        assert_eq!(partial, RekeyPolicy::off().with_messages(5));
    }

    #[tokio::test]
    async fn the_early_endpoint_travels_in_the_hello_and_the_server_s_in_the_accept() {
        let client_ep = Endpoint {
            buffer: None,
            qpn: Qpn::new(0x12).unwrap(),
            gid: "::ffff:10.77.0.2".parse().unwrap(),
            ..endpoint()
        };
        let early = EarlyEndpoint {
            endpoint: client_ep,
            buffer_size: 4096,
            rdma_window: Some(16),
            cipher: Some(Cipher::ChaCha20Poly1305),
        };
        // Only the session the client's QP was made for.
        assert!(early.fits(4096, Some(16), Some(Cipher::ChaCha20Poly1305)));
        assert!(!early.fits(8192, Some(16), Some(Cipher::ChaCha20Poly1305)));
        assert!(!early.fits(4096, None, Some(Cipher::ChaCha20Poly1305)));
        assert!(!early.fits(4096, Some(16), Some(Cipher::Aes256Gcm)));
        assert!(!early.fits(4096, Some(16), None));
        let hello = Message::Hello {
            version: VERSION,
            capabilities: vec![],
            ciphers: vec![Cipher::ChaCha20Poly1305],
            stream: Some(StreamHello::fresh(StreamId([1; 16]))),
            early: Some(early),
        };
        let accept = Message::Accept {
            buffer_size: 4096,
            identity: "alice".into(),
            cipher: Some(Cipher::ChaCha20Poly1305),
            rdma_window: Some(16),
            resume: Resume::New,
            rekey: None,
            lanes: None,
            writes_on_demand: true,
            endpoint: Some(endpoint()),
        };
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut client, mut server) = (Channel::new(a), Channel::new(b));
        client.send(&hello).await.unwrap();
        assert_eq!(server.expect_hello().await.unwrap().early, Some(early));
        server.send(&accept).await.unwrap();
        let Verdict::Accepted(accepted) = client.expect_verdict().await.unwrap() else {
            panic!("not accepted")
        };
        assert_eq!(accepted.endpoint, Some(endpoint()));
        // Earlier releases: a hello without one, an accept without one (the symmetric steps).
        let old: Message =
            serde_json::from_str(r#"{"type":"hello","version":3,"capabilities":[],"ciphers":[]}"#)
                .unwrap();
        assert!(matches!(old, Message::Hello { early: None, .. }));
        let old: Message =
            serde_json::from_str(r#"{"type":"accept","buffer_size":64,"identity":"a"}"#).unwrap();
        assert!(matches!(old, Message::Accept { endpoint: None, .. }));
        let mut without = accept.clone();
        if let Message::Accept { endpoint, .. } = &mut without {
            *endpoint = None;
        }
        let json = serde_json::to_string(&without).unwrap();
        assert!(!json.contains("endpoint"), "{json}");
        // An early endpoint is checked as step 3's is, before the server uses it.
        let bad = Message::Hello {
            version: VERSION,
            capabilities: vec![],
            ciphers: vec![],
            stream: Some(StreamHello::fresh(StreamId([1; 16]))),
            early: Some(EarlyEndpoint {
                endpoint: Endpoint {
                    gid: "::ffff:0.0.0.0".parse().unwrap(),
                    ..client_ep
                },
                ..early
            }),
        };
        client.send(&bad).await.unwrap();
        let e = server.expect_hello().await.unwrap_err();
        assert!(e.to_string().contains("gid"), "{e}");
        // A server whose setup failed before its accept says why, as it would later.
        server
            .send(&Message::Abort {
                reason: AbortReason::AuthenticationFailed,
            })
            .await
            .unwrap();
        let e = client.expect_verdict().await.unwrap_err();
        assert!(
            matches!(
                e,
                HandshakeError::Aborted(AbortReason::AuthenticationFailed)
            ),
            "{e}"
        );
    }

    /// After an early accept the client waits for the server's token over RDMA alone. A server
    /// that refused the client's token says why over TLS: the wait ends with that reason at
    /// once, not after the confirmation's timeout (5 s by default) with a timeout's message,
    /// as it did before `unless_told`.
    #[tokio::test(start_paused = true)]
    async fn a_step_over_rdma_ends_with_the_peer_s_abort_not_its_own_timeout() {
        use std::time::Duration;
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut client, mut server) = (Channel::new(a), Channel::new(b));
        // What the confirmation does when no token comes: it times out, as a paused clock
        // would let it at once were the abort not heard first.
        let confirm_timeout = || async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Err::<(), _>(HandshakeError::Invalid {
                field: "token",
                reason: "timed out".into(),
            })
        };
        let bad_token = AbortReason::RdmaSetup {
            detail: "the client's confirmation token did not match".into(),
        };
        server
            .send(&Message::Abort {
                reason: bad_token.clone(),
            })
            .await
            .unwrap();
        let started = tokio::time::Instant::now();
        let e = client
            .unless_told(confirm_timeout(), |m| Some(m.into_abort()))
            .await
            .unwrap_err();
        assert!(
            matches!(&e, HandshakeError::Aborted(r) if *r == bad_token),
            "{e}"
        );
        assert!(e.to_string().contains("did not match"), "{e}");
        assert_eq!(started.elapsed(), Duration::ZERO, "heard at once");

        // A message that only notifies goes to `heard` and the step goes on to its own end.
        server.send(&Message::Ready).await.unwrap();
        let mut notices = 0;
        let done = client
            .unless_told(
                async {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    Ok::<_, HandshakeError>(7)
                },
                |m| {
                    assert_eq!(m.kind(), Kind::Ready);
                    notices += 1;
                    None
                },
            )
            .await
            .unwrap();
        assert_eq!((done, notices), (7, 1));

        // Anything but an abort where only an abort may come is a protocol error.
        server.send(&Message::Confirmed).await.unwrap();
        let e = client
            .unless_told(confirm_timeout(), |m| Some(m.into_abort()))
            .await
            .unwrap_err();
        assert!(
            matches!(
                e,
                HandshakeError::Unexpected {
                    expected: Kind::Abort,
                    got: Kind::Confirmed
                }
            ),
            "{e}"
        );

        // A step that finishes first leaves what came meanwhile unread, whole.
        server.send(&Message::Bye).await.unwrap();
        let done = client
            .unless_told(async { Ok::<_, HandshakeError>(1) }, |m| {
                Some(m.into_abort())
            })
            .await
            .unwrap();
        assert_eq!(done, 1);
        assert_eq!(client.recv::<Message>().await.unwrap().kind(), Kind::Bye);

        // The channel closing ends the step: no session goes on without it.
        drop(server);
        let started = tokio::time::Instant::now();
        let e = client
            .unless_told(confirm_timeout(), |m| Some(m.into_abort()))
            .await
            .unwrap_err();
        assert!(matches!(e, HandshakeError::Closed), "{e}");
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[test]
    fn reject_reasons_read_well() {
        assert_eq!(
            RejectReason::ServerFull {
                active: 10,
                max: 10
            }
            .to_string(),
            "server full (10/10)"
        );
        let json = serde_json::to_string(&Message::Reject {
            reason: RejectReason::ServerFull {
                active: 10,
                max: 10,
            },
        })
        .unwrap();
        assert_eq!(
            json,
            r#"{"type":"reject","reason":{"kind":"server_full","active":10,"max":10}}"#
        );
    }

    async fn decode_raw(json: &str) -> Result<Endpoint, HandshakeError> {
        let (mut raw, c) = tokio::io::duplex(1 << 16);
        raw.write_all(&(json.len() as u32).to_be_bytes())
            .await
            .unwrap();
        raw.write_all(json.as_bytes()).await.unwrap();
        Channel::new(c).recv::<Endpoint>().await
    }

    #[tokio::test]
    async fn out_of_range_fields_are_refused() {
        let json = serde_json::to_string(&endpoint()).unwrap();
        assert_eq!(decode_raw(&json).await.unwrap(), endpoint());
        for (from, to) in [
            ("11259375", "16777216"),           // psn 2^24
            ("\"qpn\":17", "\"qpn\":16777216"), // qpn 2^24
            ("\"mtu\":1024", "\"mtu\":1500"),   // not an IB MTU
            ("::ffff:10.77.0.1", "not-a-gid"),  // GID syntax
            ("\"rkey\":4660", "\"rkey\":-1"),   // rkey is a u32
        ] {
            let bad = json.replace(from, to);
            assert_ne!(bad, json, "{from} not found in {json}");
            let err = decode_raw(&bad).await.unwrap_err();
            assert!(matches!(err, HandshakeError::Malformed(_)), "{err}");
        }
        let mut v = serde_json::to_value(endpoint()).unwrap();
        v["extra"] = serde_json::json!(1);
        assert!(
            decode_raw(&v.to_string()).await.is_err(),
            "unknown field accepted"
        );
    }

    #[test]
    fn validate_catches_semantic_errors() {
        assert!(endpoint().validate().is_ok());
        let mut e = endpoint();
        e.gid = Gid::default();
        assert!(e.validate().unwrap_err().to_string().contains("gid"));
        let mut e = endpoint();
        e.qpn = Qpn::new(1).unwrap();
        assert!(e.validate().unwrap_err().to_string().contains("reserved"));
        let mut e = endpoint();
        if let Some(b) = e.buffer.as_mut() {
            b.len = 0;
        }
        assert!(e.validate().is_err());
        let mut e = endpoint();
        if let Some(b) = e.buffer.as_mut() {
            b.addr = u64::MAX;
        }
        assert!(e.validate().is_err());
        let mut e = endpoint();
        e.gid = "::ffff:255.255.255.255".parse().unwrap();
        assert!(e.validate().is_err());
    }

    #[test]
    fn the_resume_exchange_has_wire_names_and_checks_what_serde_cannot() {
        let id = StreamId([0xab; 16]);
        let hello = Message::Hello {
            version: VERSION,
            capabilities: vec![],
            ciphers: vec![],
            stream: Some(StreamHello {
                id,
                next: 5,
                sent: 7,
            }),
            early: None,
        };
        let json = serde_json::to_string(&hello).unwrap();
        assert!(
            json.contains(
                r#""stream":{"id":"abababababababababababababababab","next":5,"sent":7}"#
            ),
            "{json}"
        );
        let resumed = Resume::Resumed {
            delivered: 6,
            acks: vec![AckRecord {
                op: Op::Send,
                seq: 5,
                bytes: 9,
                status: AckStatus::Delivered,
            }],
        };
        assert_eq!(
            serde_json::to_string(&resumed).unwrap(),
            r#"{"kind":"resumed","delivered":6,"acks":[{"op":"send","seq":5,"bytes":9,"status":"delivered"}]}"#
        );
        assert_eq!(
            serde_json::to_string(&Resume::Expired).unwrap(),
            r#"{"kind":"expired"}"#
        );
        // An accept without the field (never sent by this version) reads as a new stream.
        let accept: Message = serde_json::from_str(
            r#"{"type":"accept","buffer_size":64,"identity":"a","cipher":null}"#,
        )
        .unwrap();
        assert!(matches!(
            accept,
            Message::Accept {
                resume: Resume::New,
                ..
            }
        ));
        // Sequences start at 1, and what was sent is at least what was acknowledged.
        assert!(StreamHello::fresh(id).validate().is_ok());
        for (next, sent) in [(0, 0), (5, 3), (u64::MAX, u64::MAX)] {
            let e = StreamHello { id, next, sent }.validate().unwrap_err();
            assert!(e.to_string().contains("do not describe a stream"), "{e}");
        }
        // A malformed stream id is refused by the parser, with the reason.
        let bad = r#"{"type":"hello","version":3,"capabilities":[],"stream":{"id":"xyz","next":1,"sent":0}}"#;
        let e = serde_json::from_str::<Message>(bad).unwrap_err();
        assert!(e.to_string().contains("32 hex digits"), "{e}");
    }
}
