//! The client's lanes beyond the first ([`crate::lanes`]): each its own QP, keys and
//! operation stream, opened over the session's TLS connection, acknowledged over its own QP.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use futures_util::TryFutureExt;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::link::session_ended;
use super::{setup_failed, tls_or, ClientError};
use crate::datapath::{Ack, Op, StreamId};
use crate::handshake::{Channel, HandshakeError, Message, Resume};
use crate::lanes::{ClosedLanes, Control, LaneAnswer};
use crate::protect::{Protection, Side};
use crate::session::{Arrival, Confirm, Secrets, Session, SessionError};
use crate::verbs::{VerbsError, WcOpcode};

/// One more lane of a session: its session (QP, keys) and its own operation stream.
pub(crate) struct Lane {
    pub(crate) index: u32,
    session: Session,
    stream: StreamId,
    next_seq: u64,
    /// Operations posted and not acknowledged, oldest first, kept to be sent again on the
    /// lane that resumes this one's stream.
    pub(crate) outstanding: VecDeque<Kept>,
    /// The highest sequence ever posted in the lane's stream.
    sent: u64,
    window: usize,
    timeout: Duration,
    posted: u64,
    /// The server's answer about the stream when the lane opened, until applied.
    answered: Resume,
}

impl Lane {
    /// What a lane that resumes this one's stream says of it: the oldest operation it keeps
    /// (or the next it would send) and the highest it sent.
    fn hello(&self) -> crate::handshake::StreamHello {
        crate::handshake::StreamHello {
            id: self.stream,
            next: self.outstanding.front().map_or(self.next_seq, |k| k.seq),
            sent: self.sent,
        }
    }
}

/// What resuming a lost session's other lanes did (`Client::resume_lanes`).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct LanesResumed {
    /// Lanes resumed.
    pub(crate) lanes: usize,
    /// Their operations the server's answers acknowledged.
    pub(crate) acknowledged: usize,
    /// Their operations sent again.
    pub(crate) resent: usize,
}

/// An operation kept until the server acknowledges it.
pub(crate) struct Kept {
    seq: u64,
    op: Op,
    data: Vec<u8>,
}

/// How opening a lane went ([`Client::add_lane`](super::Client::add_lane)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneOpened {
    /// The lane's number (1 for the second lane).
    pub lane: u32,
    /// From the request to a confirmed lane.
    pub took: Duration,
    /// Our QP made, the request and the server's answer over TLS, our QP in RTS.
    pub setup: Duration,
    /// Of `setup`: our PD, CQs, MRs and QP made, receives posted (before the request).
    pub prepare: Duration,
    /// Of `setup`: the request to the server's answer (a TLS round trip and the server's own
    /// QP made and brought to RTS).
    pub answer: Duration,
    /// The tokens exchanged over the lane's QP.
    pub confirmation: Duration,
    /// Our resources came from the connector's warm pool ([`crate::warm`]).
    pub warm: bool,
}

/// One lane's traffic so far ([`Client::lane_stats`](super::Client::lane_stats)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LaneStats {
    /// The lane's number (0: the session's first QP).
    pub lane: u32,
    /// Operations posted on it.
    pub posted: u64,
    /// Of those, awaiting their acknowledgement.
    pub in_flight: usize,
    /// The lane's operation stream (the server's deliveries of the lane name it).
    pub stream: StreamId,
}

impl Lane {
    /// Operations this lane may have unacknowledged at once.
    pub(crate) fn window(&self) -> usize {
        self.window
    }

    /// This lane's traffic.
    pub(crate) fn stats(&self) -> LaneStats {
        LaneStats {
            lane: self.index,
            posted: self.posted,
            in_flight: self.outstanding.len(),
            stream: self.stream,
        }
    }

    fn lost(&self, source: SessionError) -> ClientError {
        ClientError::LaneLost {
            lane: self.index,
            unacknowledged: self.outstanding.len(),
            source,
        }
    }

    /// Posts one operation with the lane's next sequence; a lane the server said it closed is
    /// lost at once, before anything is sent into it.
    pub(crate) async fn post(
        &mut self,
        op: Op,
        data: &[u8],
        closed: &mut ClosedLanes,
    ) -> Result<(), ClientError> {
        if let Some(reason) = closed.reason(self.index) {
            return Err(self.lost(SessionError::LaneClosed(reason)));
        }
        if let Err(e) = self.session.post(op, data).await {
            return Err(self.lost(e));
        }
        self.outstanding.push_back(Kept {
            seq: self.next_seq,
            op,
            data: data.to_vec(),
        });
        self.sent = self.next_seq;
        self.next_seq += 1;
        self.posted += 1;
        Ok(())
    }

    /// The acknowledgement of the lane's oldest operation, over the lane's QP, checked to name
    /// it; bounded by the client's timeout. Meanwhile the session's TLS connection is heard:
    /// the server closing this lane loses it at once (no waiting out the timeout), another
    /// lane's closing is remembered in `closed`. The session's end (a bye, an abort with its
    /// reason, the connection broken) is the session's error, not this lane's: there is no
    /// session left to resume the lane in.
    pub(crate) async fn next_ack(
        &mut self,
        chan: &mut Channel<TlsStream<TcpStream>>,
        closed: &mut ClosedLanes,
    ) -> Result<Ack, ClientError> {
        if let Some(reason) = closed.reason(self.index) {
            return Err(self.lost(SessionError::LaneClosed(reason)));
        }
        let index = self.index;
        let wait = async {
            loop {
                tokio::select! {
                    arrival = self.session.arrival() => return Ok(arrival),
                    control = chan.expect_control() => match control {
                        // Kept until the lane's stream resumes elsewhere, so that a resume that
                        // fails leaves the lane known closed for its next use.
                        Ok(Control::LaneClosed { lane, reason }) => {
                            closed.record(lane, reason.clone());
                            if lane == index {
                                return Ok(Err(SessionError::LaneClosed(reason)));
                            }
                        }
                        Ok(Control::Closed(reason)) => return Err(session_ended(Ok(reason))),
                        Err(e) => return Err(session_ended(Err(e))),
                    },
                }
            }
        };
        let arrival = match crate::clock::within(self.timeout, wait).await {
            Err(_) => Err(SessionError::Timeout(
                self.timeout,
                "the server's acknowledgement on a lane",
            )),
            Ok(Err(ended)) => return Err(ended),
            Ok(Ok(arrival)) => arrival,
        };
        let record = match arrival {
            Err(e) => return Err(self.lost(e)),
            Ok(Arrival::Send(record)) => record,
            Ok(Arrival::Write(_)) => {
                return Err(
                    self.lost(SessionError::Verbs(VerbsError::UnexpectedCompletion(
                        WcOpcode::RecvRdmaWithImm,
                    ))),
                )
            }
        };
        let Some(ack) = Ack::decode(&record) else {
            return Err(self.lost(SessionError::BadAck { len: record.len() }));
        };
        match self.outstanding.front() {
            Some(k) if k.seq == ack.seq && k.op == ack.op => {
                self.outstanding.pop_front();
                Ok(ack)
            }
            Some(k) => Err(self.lost(SessionError::WrongAck {
                sent: k.op,
                acked: ack.op,
            })),
            None => Err(self.lost(SessionError::NothingInFlight)),
        }
    }
}

/// What a message from the server means while lane `lane` is being confirmed over RDMA: the
/// server closed this lane (its token refused, its QP failed) or ended the session, each with
/// its reason; another lane it closed is remembered in `closed` and the confirmation goes on.
fn heard_while_confirming(lane: u32, closed: &mut ClosedLanes, m: Message) -> Option<ClientError> {
    match m {
        Message::LaneClosed { lane: l, reason } if l == lane => {
            Some(ClientError::LaneNotConfirmed { lane, reason })
        }
        Message::LaneClosed { lane: l, reason } => {
            closed.record(l, reason);
            None
        }
        other => Some(tls_or(other.into_abort())),
    }
}

impl super::Client {
    /// Opens one more lane on this live session: a QP of its own (fresh CSPRNG PSN, keys and
    /// confirmation tokens whose exporter context names the lane), asked for and answered
    /// over the session's TLS connection, with no new TCP connection or TLS handshake, then
    /// confirmed over the new QP. Operations spread over every lane from then on
    /// ([`Client::post`](super::Client::post)).
    ///
    /// A refusal ([`ClientError::LaneRejected`]: the identity's lane cap, its quota) leaves
    /// the session and its other lanes as they were. Wait for the operations in flight first
    /// ([`Client::flush`](super::Client::flush)): the answer comes over the TLS connection,
    /// the acknowledgements of the streaming data path do not.
    pub async fn add_lane(&mut self) -> Result<LaneOpened, ClientError> {
        let (lane, opened) = self.open_lane(StreamId::random(), None).await?;
        self.lanes.push(lane);
        Ok(opened)
    }

    /// Opens a lane carrying `stream`: a fresh one, or, with `resume`, the stream of a lane
    /// that was lost, from where the client stands in it. Returns the lane (its stream bound
    /// from the first operation the server has not delivered), with the server's answer about
    /// the stream applied by the caller.
    async fn open_lane(
        &mut self,
        stream: StreamId,
        resume: Option<crate::handshake::StreamHello>,
    ) -> Result<(Lane, LaneOpened), ClientError> {
        let started = Instant::now();
        let Some(setup) = self.link.lanes.as_ref() else {
            return Err(ClientError::NoLanes);
        };
        // A lane number names the lane's keys: never used twice in a session.
        let lane = self.next_lane;
        self.next_lane += 1;
        let timeout = self.link.timeout;
        let conn = self.link.chan.get_ref().get_ref().1;
        let tokens = crate::tls::lane_confirmation_tokens(conn, Side::Client, lane)?;
        let protection = match setup.cipher {
            None => None,
            Some(c) => {
                let mut p = Protection::from_tls_lane(conn, Side::Client, c, lane)
                    .map_err(crate::tls::TlsError::Config)?;
                p.set_rekey(setup.rekey);
                Some(p)
            }
        };
        let (prepared, path) = setup.provision.prepare(
            &setup.device,
            &setup.sgid,
            Secrets { tokens, protection },
            setup.session_cfg,
        );
        let prepared = prepared.map_err(device_or_session)?;
        let prepare = started.elapsed();
        let window = self.link.window();
        self.link
            .chan
            .send(&Message::LaneOpen {
                lane,
                stream,
                endpoint: prepared.local(),
                resume,
            })
            .await
            .map_err(tls_or)?;
        let answer = tokio::time::timeout(
            timeout,
            self.link
                .chan
                .expect_lane_answer(lane, &mut self.link.closed_lanes),
        )
        .await
        .map_err(|_| {
            ClientError::Session(SessionError::Timeout(
                timeout,
                "the server's answer to a lane",
            ))
        })?
        .map_err(tls_or)?;
        let answer_took = started.elapsed().saturating_sub(prepare);
        let (remote, answered) = match answer {
            LaneAnswer::Accepted(remote, answered) => (remote, answered),
            LaneAnswer::Rejected(reason) => return Err(ClientError::LaneRejected { lane, reason }),
        };
        let confirm = async {
            prepared
                .connect(remote)
                .await?
                .confirm(Confirm::First)
                .await
        };
        // The server's word on this lane comes over TLS: heard while the tokens travel.
        let closed = &mut self.link.closed_lanes;
        let mut session = self
            .link
            .chan
            .unless_told(confirm.map_err(setup_failed), |m| {
                heard_while_confirming(lane, closed, m)
            })
            .await?;
        // Where the stream goes on: a fresh one from 1, a resumed one after what the server
        // delivered, an expired one from the oldest operation kept.
        let first = match (&answered, resume) {
            (Resume::New, None) => 1,
            (Resume::Resumed { delivered, .. }, Some(h)) if *delivered <= h.sent => delivered + 1,
            (Resume::Expired, Some(h)) => h.next,
            (other, _) => {
                return Err(tls_or(HandshakeError::Invalid {
                    field: "resume",
                    reason: format!("{other:?} for a lane that asked {resume:?}"),
                }))
            }
        };
        session.bind_stream(Side::Client, stream, first);
        let timing = session.timing();
        tracing::debug!(lane, stream = %stream.short(), took = ?started.elapsed(), "lane open");
        Ok((
            Lane {
                index: lane,
                session,
                stream,
                next_seq: first,
                outstanding: VecDeque::new(),
                sent: first - 1,
                window,
                timeout,
                posted: 0,
                answered,
            },
            LaneOpened {
                lane,
                took: started.elapsed(),
                setup: timing.setup,
                prepare,
                answer: answer_took,
                confirmation: timing.confirmation,
                warm: path == crate::warm::Path::Warm,
            },
        ))
    }

    /// Carries the stream of the lost lane `i` on a new lane: the server answers what it
    /// delivered of the stream (the lost lane drained first), those operations' answers are
    /// returned, and the rest are posted again on the new lane with their sequences, so each
    /// is delivered once.
    pub(crate) async fn resume_lane(
        &mut self,
        i: usize,
        cause: ClientError,
    ) -> Result<Vec<Ack>, ClientError> {
        let old = &self.lanes[i];
        tracing::info!(lane = old.index, stream = %old.stream.short(), error = %cause, "lane lost; resuming its stream on a new lane");
        let (lane, _) = self.open_lane(old.stream, Some(old.hello())).await?;
        // The lost lane's QP goes now: the server drained its end before answering. A closing
        // of it the server sent meanwhile is moot.
        let old = self.lanes.remove(i);
        self.link.closed_lanes.take(old.index);
        let (lane, acks) = self.carry_on(old, lane).await?;
        self.lanes.insert(i, lane);
        Ok(acks)
    }

    /// Carries the streams of the lanes of a lost session on new lanes of the session that
    /// replaced it ([`Client::resume_lane`] for each, in order): the server ended and drained
    /// the old lanes with their session before it answers. Their answers go to `ready`. A lane
    /// that cannot be opened leaves it and the lanes after it in place, unresumed, for the next
    /// attempt (the error says why).
    pub(crate) async fn resume_lanes(
        &mut self,
        mut old: Vec<Lane>,
        ready: &mut VecDeque<Ack>,
    ) -> Result<LanesResumed, ClientError> {
        let mut done = LanesResumed::default();
        while !old.is_empty() {
            let opened = self.open_lane(old[0].stream, Some(old[0].hello())).await;
            let lane = match opened {
                Ok((lane, _)) => lane,
                Err(e) => {
                    self.lanes.append(&mut old);
                    return Err(e);
                }
            };
            let lost = old.remove(0);
            let kept = lost.outstanding.len();
            tracing::info!(lane = lost.index, new_lane = lane.index, stream = %lost.stream.short(), kept, "the lost session's lane resumed on the new session");
            let (lane, acks) = match self.carry_on(lost, lane).await {
                Ok(carried) => carried,
                Err(e) => {
                    // The lanes not tried yet keep their operations for the next resume, as
                    // when a lane cannot be opened.
                    self.lanes.append(&mut old);
                    return Err(e);
                }
            };
            done.lanes += 1;
            done.acknowledged += acks.len();
            done.resent += kept - acks.len();
            ready.extend(acks);
            self.lanes.push(lane);
        }
        Ok(done)
    }

    /// `lane`, just opened to resume `old`'s stream, goes on where the server's answer says:
    /// the answers it carried are returned (in `old`'s order), what it did not deliver is
    /// posted again with its sequences.
    async fn carry_on(
        &mut self,
        old: Lane,
        mut lane: Lane,
    ) -> Result<(Lane, Vec<Ack>), ClientError> {
        let posted = old.posted;
        let mut kept = old.outstanding;
        drop(old.session);
        let mut acks = Vec::new();
        if let Resume::Resumed { acks: answered, .. } = std::mem::take(&mut lane.answered) {
            for a in answered {
                let a = Ack::from(a);
                match kept.front() {
                    Some(k) if k.seq == a.seq && k.op == a.op => {
                        kept.pop_front();
                        acks.push(a);
                    }
                    _ => {
                        return Err(tls_or(HandshakeError::Invalid {
                            field: "resume",
                            reason: format!(
                                "an answer for {} #{} this lane did not keep",
                                a.op, a.seq
                            ),
                        }))
                    }
                }
            }
        }
        // What the server has not delivered goes again, in order, with its sequence.
        for k in kept {
            if k.seq != lane.next_seq {
                return Err(tls_or(HandshakeError::Invalid {
                    field: "resume",
                    reason: format!("the server's answer leaves a gap before #{}", k.seq),
                }));
            }
            lane.post(k.op, &k.data, &mut self.link.closed_lanes)
                .await?;
        }
        lane.posted += posted;
        Ok((lane, acks))
    }

    /// The most lanes the server allows this client's identity (its sessions' first lanes
    /// included); `None` when the session has no lanes to open.
    pub fn max_lanes(&self) -> Option<u32> {
        self.link.lanes.as_ref().map(|l| l.max)
    }

    /// The session's lanes, its first included.
    pub fn lanes(&self) -> usize {
        1 + self.lanes.len()
    }

    /// Each lane's traffic so far, lane 0 (the session's first QP) first.
    pub fn lane_stats(&self) -> Vec<LaneStats> {
        std::iter::once(LaneStats {
            lane: 0,
            posted: self.lane0_posted,
            in_flight: self.unacked_len(),
            stream: self.stream(),
        })
        .chain(self.lanes.iter().map(Lane::stats))
        .collect()
    }

    /// The lane the next operation goes on: the one with the fewest operations awaiting their
    /// acknowledgement, ties broken in turn from the last one chosen. Least-outstanding keeps
    /// a slow lane from collecting a queue while others are idle; the turn spreads a caller
    /// that waits for each acknowledgement (every lane then has none outstanding) over all
    /// lanes rather than always the first.
    pub(crate) fn pick_lane(&mut self) -> usize {
        let n = self.lanes();
        let load = |i: usize| match i {
            0 => self.unacked_len(),
            i => self.lanes[i - 1].outstanding.len(),
        };
        let start = self.lane_turn % n;
        let pick = (0..n)
            .map(|k| (start + k) % n)
            .min_by_key(|&i| load(i))
            .unwrap_or(0);
        self.lane_turn = pick + 1;
        pick
    }
}

/// A setup error as the client reports it: the device's, or the session's.
fn device_or_session(e: SessionError) -> ClientError {
    match e {
        SessionError::Verbs(v) => ClientError::Device(v),
        other => ClientError::Session(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::AbortReason;

    /// While a lane's tokens travel over RDMA, the server's word over TLS ends the wait with
    /// its reason: this lane closed (its token refused), the session aborted. Another lane's
    /// closing is remembered and the wait goes on.
    #[test]
    fn what_the_server_says_while_a_lane_is_confirmed() {
        let mut closed = ClosedLanes::default();
        let other = Message::LaneClosed {
            lane: 2,
            reason: "not confirmed in time".into(),
        };
        assert!(heard_while_confirming(3, &mut closed, other).is_none());
        assert_eq!(closed.reason(2).as_deref(), Some("not confirmed in time"));

        let ours = Message::LaneClosed {
            lane: 3,
            reason: "not confirmed: the peer's confirmation token did not match".into(),
        };
        let e = heard_while_confirming(3, &mut closed, ours).unwrap();
        assert!(
            matches!(e, ClientError::LaneNotConfirmed { lane: 3, .. }),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "lane 3 was not confirmed: the server closed it (not confirmed: the peer's \
             confirmation token did not match); the session and its other lanes go on"
        );
        assert_eq!(
            closed.reason(3),
            None,
            "this lane's end is the error, not a notice"
        );

        let abort = Message::Abort {
            reason: AbortReason::AuthenticationFailed,
        };
        let e = heard_while_confirming(3, &mut closed, abort).unwrap();
        assert!(e.is_session_lost(), "{e}");
        assert!(e.to_string().contains("failed authentication"), "{e}");

        let e = heard_while_confirming(3, &mut closed, Message::Ready).unwrap();
        assert!(e.to_string().contains("protocol error"), "{e}");
    }
}
