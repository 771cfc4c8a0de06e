//! Lanes: several RC queue pairs in one authenticated session, over its one TLS control
//! connection.
//!
//! A session starts with one lane, lane 0: the QP its handshake set up. A client that listed
//! [`LANES`] in its hello, on the streaming data path ([`RDMA_ACKS`]), is told in the
//! server's accept how many lanes its identity may hold ([`Message::Accept`]'s `lanes`); it
//! then opens more on the live session without a new TCP connection or TLS handshake:
//!
//! 1. client → [`Message::LaneOpen`]: the lane's number, its operation stream (a fresh
//!    [`StreamId`]) and the client's QP of it ([`Endpoint`], its PSN drawn from the CSPRNG);
//! 2. server → [`Message::LaneAccept`] with its own QP, already in RTS, once the lane passed
//!    the identity's lane cap and the quotas; or [`Message::LaneReject`] with the reason
//!    (the session and its other lanes go on);
//! 3. over the new QP: the client's confirmation token first, then the server's;
//! 4. whenever the server ends a lane on its own (a forged message on it, its QP failed):
//!    server → [`Message::LaneClosed`], to a client that listed [`LANE_CLOSED`]. The client
//!    hears it beside its acknowledgements ([`Channel::expect_control`]) and resumes the lane's
//!    stream at the lane's next use, instead of after that lane's acknowledgement timeout.
//!
//! One round trip over TLS and one over RDMA, against a new session's TCP and TLS handshakes,
//! admission and three TLS round trips.
//!
//! Each lane has keys of its own: the TLS exporter's context names the lane
//! ([`lane_context`]). Lane 0's context is the one a session without lanes uses, so its
//! keys, tokens and wire format are exactly what they were before lanes. Each lane carries
//! its own operation stream (sequences from 1, acknowledged over that lane's QP), sealed under
//! that lane's keys: a message replayed from one lane into another fails its tag.
//!
//! A lane that is lost (its QP failed, an acknowledgement never came, the server closed it
//! after a forged packet and said so) is resumed within the session: the client opens a new lane (a new
//! number, so new keys) with [`Message::LaneOpen`]'s `resume` naming the lost lane's stream
//! and where it stands; the server ends the old lane first if it still runs, then answers, in
//! [`Message::LaneAccept`]'s `resume`, what it delivered of that stream and the answers the
//! client has not seen; the client sends only the rest again, with their sequences. The server
//! keeps a lane's stream in the registry it keeps lane 0's in, so a lost session's lanes are
//! resumed the same way on the session that replaces it, once lane 0's stream is.

use tokio::io::{AsyncRead, AsyncWrite};

use crate::datapath::StreamId;
use crate::handshake::{
    unexpected, Channel, Endpoint, HandshakeError, Kind, Message, RejectReason, Resume, StreamHello,
};
use crate::verbs::RemoteBuffer;

/// The capability of a client that opens lanes ([`Message::LaneOpen`]). A server of an
/// earlier release ignores it and announces no `lanes` in its accept: the client then keeps
/// its one lane.
pub const LANES: &str = "lanes";

/// The capability of a client that understands [`Message::LaneClosed`]: the server tells it
/// over TLS when it ends one of its lanes on its own, and the client resumes that lane's stream
/// at once, instead of learning it when the lane's acknowledgement fails to come within its
/// timeout. A client of an earlier release does not list it, and hears nothing of the kind.
pub const LANE_CLOSED: &str = "lane-closed";

/// What the server may say over TLS while a client's operations travel over RDMA
/// ([`Channel::expect_control`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Control {
    /// The session ends: `None` for an orderly bye, or the server's reason.
    Closed(Option<crate::datapath::AbortReason>),
    /// The server ended one lane on its own; the session and its other lanes go on.
    LaneClosed {
        /// The lane.
        lane: u32,
        /// Why, for people.
        reason: String,
    },
}

/// Lanes the server said it closed ([`Control::LaneClosed`]) and that the client has not yet
/// acted on, heard while it waited for something else.
#[derive(Debug, Default)]
pub struct ClosedLanes(Vec<(u32, String)>);

impl ClosedLanes {
    /// Remembers that the server closed `lane`.
    pub fn record(&mut self, lane: u32, reason: String) {
        // Logged once per lane, like it is kept once.
        if !self.0.iter().any(|(l, _)| *l == lane) {
            tracing::info!(lane, %reason, "the server closed a lane; its stream resumes on a new lane at its next use");
            self.0.push((lane, reason));
        }
    }

    /// Why the server closed `lane`, if it did.
    pub fn reason(&self, lane: u32) -> Option<String> {
        self.0
            .iter()
            .find(|(l, _)| *l == lane)
            .map(|(_, r)| r.clone())
    }

    /// Why the server closed `lane`, if it did; forgets it (its stream went on elsewhere).
    pub fn take(&mut self, lane: u32) -> Option<String> {
        let i = self.0.iter().position(|(l, _)| *l == lane)?;
        Some(self.0.swap_remove(i).1)
    }
}

/// The streaming data path's capability, which lanes need: each lane's acknowledgements come
/// back over that lane's QP, since acknowledgements over TLS would queue every lane behind
/// the one control connection.
pub use crate::handshake::RDMA_ACKS;

/// The lane cap per identity unless set ([`ServerConfig::max_lanes_per_identity`](crate::server::ServerConfig::max_lanes_per_identity)): 8 lanes (QPs) per identity at once, the
/// first lane of each of its sessions included.
pub const DEFAULT_MAX_LANES_PER_IDENTITY: usize = 8;

/// The highest lane number a client may ask for: lane numbers label the per-lane metrics,
/// so they are bounded whatever the cap.
pub const MAX_LANE: u32 = 64;

/// The TLS exporter context of `lane` for a key or token whose lane-0 context is `base`:
/// `base` itself for lane 0 (unchanged from a session without lanes), `base` followed by
/// ` lane N` otherwise.
///
/// ```
/// use secure_rdma::lanes::lane_context;
/// assert_eq!(lane_context(b"client to server", 0), b"client to server");
/// assert_eq!(lane_context(b"client to server", 3), b"client to server lane 3");
/// ```
pub fn lane_context(base: &[u8], lane: u32) -> Vec<u8> {
    let mut context = base.to_vec();
    if lane > 0 {
        context.extend_from_slice(format!(" lane {lane}").as_bytes());
    }
    context
}

/// A client's request for one more lane, as the server receives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneRequest {
    /// The lane's number.
    pub lane: u32,
    /// The lane's operation stream.
    pub stream: StreamId,
    /// The client's QP of the lane.
    pub endpoint: Endpoint,
    /// Where the client stands in `stream` when the lane resumes a lost lane's stream.
    pub resume: Option<StreamHello>,
}

impl LaneRequest {
    /// Checks what serde cannot: a lane number in `1..=MAX_LANE` and a usable endpoint.
    pub fn validate(&self) -> Result<(), HandshakeError> {
        if !(1..=MAX_LANE).contains(&self.lane) {
            return Err(HandshakeError::Invalid {
                field: "lane",
                reason: format!(
                    "{} is not a lane a client may open (1..={MAX_LANE}; lane 0 is the session's first QP)",
                    self.lane
                ),
            });
        }
        if let Some(r) = &self.resume {
            r.validate()?;
            if r.id != self.stream {
                return Err(HandshakeError::Invalid {
                    field: "resume",
                    reason: "names another stream than the lane's".into(),
                });
            }
        }
        self.endpoint.validate()
    }
}

/// The server's answer to a [`LaneRequest`], as the client receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LaneAnswer {
    /// Opened: the server's QP of the lane, in RTS, and what it knows of the lane's stream.
    Accepted(Endpoint, Resume),
    /// Refused, with the reason; the session goes on.
    Rejected(RejectReason),
}

/// What the server waits for from an established client that may open lanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionRequest {
    /// The client says goodbye.
    Bye,
    /// The client asks for one more lane.
    LaneOpen(LaneRequest),
    /// The client asks for the write region of the session's first QP
    /// ([`crate::handshake::WRITE_ON_DEMAND`]).
    WriteOpen,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Channel<S> {
    /// Receives what an established client may send (server side): a bye, or a request for
    /// one more lane (checked with [`LaneRequest::validate`]). Cancel-safe.
    pub async fn expect_session_request(&mut self) -> Result<SessionRequest, HandshakeError> {
        match self.recv::<Message>().await? {
            Message::Bye => Ok(SessionRequest::Bye),
            Message::LaneOpen {
                lane,
                stream,
                endpoint,
                resume,
            } => {
                let request = LaneRequest {
                    lane,
                    stream,
                    endpoint,
                    resume,
                };
                request.validate()?;
                Ok(SessionRequest::LaneOpen(request))
            }
            Message::WriteOpen => Ok(SessionRequest::WriteOpen),
            other => Err(unexpected(Kind::Bye, &other)),
        }
    }

    /// Receives the server's answer to [`Message::WriteOpen`] (client side): the region
    /// granted (checked with [`crate::handshake::check_buffer`]) or the reason it was refused.
    /// A lane the server closed meanwhile is remembered in `closed`; the session's end (a bye,
    /// an abort with its reason) is an error, as in [`Channel::expect_lane_answer`].
    pub async fn expect_write_answer(
        &mut self,
        closed: &mut ClosedLanes,
    ) -> Result<Result<RemoteBuffer, RejectReason>, HandshakeError> {
        loop {
            match self.recv::<Message>().await? {
                Message::LaneClosed { lane, reason } => closed.record(lane, reason),
                Message::WriteGrant { buffer } => {
                    crate::handshake::check_buffer(&buffer)?;
                    return Ok(Ok(buffer));
                }
                Message::WriteReject { reason } => return Ok(Err(reason)),
                Message::Abort { reason } => return Err(HandshakeError::Aborted(reason)),
                other => return Err(unexpected(Kind::WriteGrant, &other)),
            }
        }
    }

    /// Receives what the server says over TLS to an established client (client side): the
    /// session's end, or a lane it closed. Cancel-safe, so it can sit in a `select!` next to a
    /// completion queue.
    pub async fn expect_control(&mut self) -> Result<Control, HandshakeError> {
        match self.recv::<Message>().await? {
            Message::Bye => Ok(Control::Closed(None)),
            Message::Abort { reason } => Ok(Control::Closed(Some(reason))),
            Message::LaneClosed { lane, reason } => Ok(Control::LaneClosed { lane, reason }),
            other => Err(unexpected(Kind::Bye, &other)),
        }
    }

    /// Receives the server's answer to the request for `lane` (client side). An answer for
    /// another lane, or an endpoint that is not usable, is a protocol error; an abort carries
    /// the server's reason. A lane the server closed meanwhile is remembered in `closed`.
    pub async fn expect_lane_answer(
        &mut self,
        lane: u32,
        closed: &mut ClosedLanes,
    ) -> Result<LaneAnswer, HandshakeError> {
        let message = loop {
            match self.recv::<Message>().await? {
                Message::LaneClosed { lane, reason } => closed.record(lane, reason),
                other => break other,
            }
        };
        let (answered, answer) = match message {
            Message::LaneAccept {
                lane,
                endpoint,
                resume,
            } => {
                endpoint.validate()?;
                (lane, LaneAnswer::Accepted(endpoint, resume))
            }
            Message::LaneReject { lane, reason } => (lane, LaneAnswer::Rejected(reason)),
            Message::Abort { reason } => return Err(HandshakeError::Aborted(reason)),
            other => return Err(unexpected(Kind::LaneAccept, &other)),
        };
        if answered != lane {
            return Err(HandshakeError::Invalid {
                field: "lane",
                reason: format!("the server answered lane {answered} where lane {lane} was asked"),
            });
        }
        Ok(answer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::psn::{Psn, Qpn};
    use crate::verbs::PathMtu;

    fn endpoint() -> Endpoint {
        Endpoint {
            gid: "::ffff:10.77.0.2".parse().unwrap(),
            qpn: Qpn::new(0x42).unwrap(),
            psn: Psn::new(0x123456).unwrap(),
            mtu: PathMtu::Mtu1024,
            buffer: None,
        }
    }

    #[tokio::test]
    async fn the_lane_messages_round_trip_with_their_wire_names() {
        let open = Message::LaneOpen {
            lane: 2,
            stream: StreamId([0xcd; 16]),
            endpoint: endpoint(),
            resume: None,
        };
        let json = serde_json::to_string(&open).unwrap();
        assert!(
            json.starts_with(r#"{"type":"lane_open","lane":2,"stream":"cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd","endpoint":{"#),
            "{json}"
        );
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut client, mut server) = (Channel::new(a), Channel::new(b));
        client.send(&open).await.unwrap();
        assert_eq!(
            server.expect_session_request().await.unwrap(),
            SessionRequest::LaneOpen(LaneRequest {
                lane: 2,
                stream: StreamId([0xcd; 16]),
                endpoint: endpoint(),
                resume: None,
            })
        );
        client.send(&Message::Bye).await.unwrap();
        assert_eq!(
            server.expect_session_request().await.unwrap(),
            SessionRequest::Bye
        );
        // The answers, both ways.
        server
            .send(&Message::LaneAccept {
                lane: 2,
                endpoint: endpoint(),
                resume: Resume::New,
            })
            .await
            .unwrap();
        assert_eq!(
            client
                .expect_lane_answer(2, &mut ClosedLanes::default())
                .await
                .unwrap(),
            LaneAnswer::Accepted(endpoint(), Resume::New)
        );
        let reason = RejectReason::LaneLimit {
            identity: "alice".into(),
            active: 4,
            max: 4,
        };
        server
            .send(&Message::LaneReject {
                lane: 3,
                reason: reason.clone(),
            })
            .await
            .unwrap();
        let answer = client
            .expect_lane_answer(3, &mut ClosedLanes::default())
            .await
            .unwrap();
        assert_eq!(answer, LaneAnswer::Rejected(reason.clone()));
        assert_eq!(
            reason.to_string(),
            "identity alice already has 4 lanes (the server allows 4 per identity); use the lanes it has, or close some"
        );
        assert_eq!(
            serde_json::to_string(&Message::LaneReject { lane: 3, reason }).unwrap(),
            r#"{"type":"lane_reject","lane":3,"reason":{"kind":"lane_limit","identity":"alice","active":4,"max":4}}"#
        );
    }

    #[tokio::test]
    async fn the_write_region_is_asked_for_and_granted_or_refused_by_name() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut client, mut server) = (Channel::new(a), Channel::new(b));
        client.send(&Message::WriteOpen).await.unwrap();
        assert_eq!(
            server.expect_session_request().await.unwrap(),
            SessionRequest::WriteOpen
        );
        assert_eq!(
            serde_json::to_string(&Message::WriteOpen).unwrap(),
            r#"{"type":"write_open"}"#
        );
        // Granted, with a lane the server closed meanwhile remembered on the way.
        let buffer = RemoteBuffer {
            addr: 0,
            rkey: 0x1234,
            len: 4128,
        };
        server
            .send(&Message::LaneClosed {
                lane: 2,
                reason: "forged".into(),
            })
            .await
            .unwrap();
        server.send(&Message::WriteGrant { buffer }).await.unwrap();
        let mut closed = ClosedLanes::default();
        assert_eq!(
            client.expect_write_answer(&mut closed).await.unwrap(),
            Ok(buffer)
        );
        assert_eq!(closed.reason(2).as_deref(), Some("forged"));
        assert_eq!(
            serde_json::to_string(&Message::WriteGrant { buffer }).unwrap(),
            r#"{"type":"write_grant","buffer":{"addr":0,"rkey":4660,"len":4128}}"#
        );
        // Refused, with the reason the client shows.
        let reason = RejectReason::Quota {
            detail: "MR_COUNT limit 2 reached for tenant alice (2 live)".into(),
        };
        server
            .send(&Message::WriteReject {
                reason: reason.clone(),
            })
            .await
            .unwrap();
        assert_eq!(
            client.expect_write_answer(&mut closed).await.unwrap(),
            Err(reason)
        );
        // A region that cannot be one is refused by the client itself, and anything but an
        // answer is a protocol error that names what was expected.
        server
            .send(&Message::WriteGrant {
                buffer: RemoteBuffer { len: 0, ..buffer },
            })
            .await
            .unwrap();
        assert!(matches!(
            client.expect_write_answer(&mut closed).await,
            Err(HandshakeError::Invalid {
                field: "buffer",
                ..
            })
        ));
        server.send(&Message::Ready).await.unwrap();
        let err = client.expect_write_answer(&mut closed).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "protocol error: expected write_grant, got ready"
        );
        // An accept of an earlier release grants the region with the endpoint.
        let old: Message = serde_json::from_str(
            r#"{"type":"accept","buffer_size":64,"identity":"a","cipher":"aes-256-gcm"}"#,
        )
        .unwrap();
        assert!(matches!(
            old,
            Message::Accept {
                writes_on_demand: false,
                ..
            }
        ));
    }

    #[tokio::test]
    async fn bad_lane_requests_and_answers_are_refused_by_name() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut client, mut server) = (Channel::new(a), Channel::new(b));
        // Lane 0 is the session's own QP, and lane numbers are bounded.
        for lane in [0, MAX_LANE + 1] {
            client
                .send(&Message::LaneOpen {
                    lane,
                    stream: StreamId([1; 16]),
                    endpoint: endpoint(),
                    resume: None,
                })
                .await
                .unwrap();
            let e = server.expect_session_request().await.unwrap_err();
            assert!(
                matches!(e, HandshakeError::Invalid { field: "lane", .. }),
                "{e}"
            );
            assert!(
                e.to_string().contains("not a lane a client may open"),
                "{e}"
            );
        }
        // An unusable endpoint is refused as the setup's endpoint is.
        let mut bad = endpoint();
        bad.qpn = Qpn::new(1).unwrap();
        client
            .send(&Message::LaneOpen {
                lane: 1,
                stream: StreamId([1; 16]),
                endpoint: bad,
                resume: None,
            })
            .await
            .unwrap();
        assert!(server
            .expect_session_request()
            .await
            .unwrap_err()
            .to_string()
            .contains("reserved QP"));
        // Anything else from an established client is a protocol error.
        client.send(&Message::Ready).await.unwrap();
        assert_eq!(
            server
                .expect_session_request()
                .await
                .unwrap_err()
                .to_string(),
            "protocol error: expected bye, got ready"
        );
        // An answer for another lane is refused; so is one that is no answer.
        server
            .send(&Message::LaneAccept {
                lane: 5,
                endpoint: endpoint(),
                resume: Resume::New,
            })
            .await
            .unwrap();
        let e = client
            .expect_lane_answer(4, &mut ClosedLanes::default())
            .await
            .unwrap_err();
        assert!(
            e.to_string()
                .contains("the server answered lane 5 where lane 4 was asked"),
            "{e}"
        );
        server.send(&Message::Bye).await.unwrap();
        let e = client
            .expect_lane_answer(4, &mut ClosedLanes::default())
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "protocol error: expected lane_accept, got bye (the peer closed the connection)"
        );
        server
            .send(&Message::Abort {
                reason: crate::datapath::AbortReason::AuthenticationFailed,
            })
            .await
            .unwrap();
        assert!(matches!(
            client
                .expect_lane_answer(4, &mut ClosedLanes::default())
                .await,
            Err(HandshakeError::Aborted(_))
        ));
    }

    #[tokio::test]
    async fn a_lane_the_server_closed_is_heard_beside_acknowledgements_and_answers() {
        let (a, b) = tokio::io::duplex(1 << 16);
        let (mut client, mut server) = (Channel::new(a), Channel::new(b));
        let closed = |lane: u32| Message::LaneClosed {
            lane,
            reason: "RDMA message failed authentication".into(),
        };
        assert_eq!(
            serde_json::to_string(&closed(1)).unwrap(),
            r#"{"type":"lane_closed","lane":1,"reason":"RDMA message failed authentication"}"#
        );
        // While waiting for acknowledgements: a lane's end, then the session's.
        server.send(&closed(1)).await.unwrap();
        server.send(&Message::Bye).await.unwrap();
        assert_eq!(
            client.expect_control().await.unwrap(),
            Control::LaneClosed {
                lane: 1,
                reason: "RDMA message failed authentication".into()
            }
        );
        assert_eq!(
            client.expect_control().await.unwrap(),
            Control::Closed(None)
        );
        server.send(&Message::Ready).await.unwrap();
        assert_eq!(
            client.expect_control().await.unwrap_err().to_string(),
            "protocol error: expected bye, got ready"
        );
        // While waiting for a lane's answer: the closed lane is remembered, the answer returned.
        let mut lanes = ClosedLanes::default();
        server.send(&closed(1)).await.unwrap();
        server.send(&closed(2)).await.unwrap();
        server
            .send(&Message::LaneAccept {
                lane: 3,
                endpoint: endpoint(),
                resume: Resume::New,
            })
            .await
            .unwrap();
        assert_eq!(
            client.expect_lane_answer(3, &mut lanes).await.unwrap(),
            LaneAnswer::Accepted(endpoint(), Resume::New)
        );
        assert_eq!(
            lanes.take(2).as_deref(),
            Some("RDMA message failed authentication")
        );
        assert!(lanes.take(2).is_none(), "taken once");
        assert_eq!(
            lanes.reason(1).as_deref(),
            Some("RDMA message failed authentication"),
            "asking does not forget"
        );
        assert!(lanes.take(1).is_some());
        assert!(lanes.take(3).is_none());
    }

    #[test]
    fn a_resuming_lane_names_its_stream_and_where_it_stands() {
        let id = StreamId([0xab; 16]);
        let hello = StreamHello {
            id,
            next: 4,
            sent: 6,
        };
        let open = Message::LaneOpen {
            lane: 5,
            stream: id,
            endpoint: endpoint(),
            resume: Some(hello),
        };
        let json = serde_json::to_string(&open).unwrap();
        assert!(
            json.ends_with(
                r#","resume":{"id":"abababababababababababababababab","next":4,"sent":6}}"#
            ),
            "{json}"
        );
        let mut req = LaneRequest {
            lane: 5,
            stream: id,
            endpoint: endpoint(),
            resume: Some(hello),
        };
        assert!(req.validate().is_ok());
        // Resuming another stream than the lane's, or a stream that is no stream, is refused.
        req.stream = StreamId([1; 16]);
        let e = req.validate().unwrap_err();
        assert!(
            e.to_string()
                .contains("names another stream than the lane's"),
            "{e}"
        );
        req.stream = id;
        req.resume = Some(StreamHello {
            id,
            next: 5,
            sent: 3,
        });
        assert!(req.validate().is_err());
        // The answer: what the server delivered, and the answers the client has not seen.
        let accept = Message::LaneAccept {
            lane: 5,
            endpoint: endpoint(),
            resume: Resume::Resumed {
                delivered: 5,
                acks: vec![],
            },
        };
        let back: Message = serde_json::from_str(&serde_json::to_string(&accept).unwrap()).unwrap();
        assert_eq!(back, accept);
    }

    #[test]
    fn an_accept_without_lanes_reads_as_one_lane_and_lanes_have_their_wire_name() {
        let old: Message = serde_json::from_str(
            r#"{"type":"accept","buffer_size":64,"identity":"a","cipher":"aes-256-gcm"}"#,
        )
        .unwrap();
        assert!(matches!(old, Message::Accept { lanes: None, .. }));
        let json = serde_json::to_string(&Message::Accept {
            buffer_size: 64,
            identity: "a".into(),
            cipher: None,
            rdma_window: Some(16),
            resume: crate::handshake::Resume::New,
            rekey: None,
            lanes: Some(8),
            writes_on_demand: false,
            endpoint: None,
        })
        .unwrap();
        assert!(
            json.ends_with(r#""resume":{"kind":"new"},"lanes":8}"#),
            "{json}"
        );
    }
}
