//! The client's lanes beyond the first ([`crate::lanes`]): each its own QP, keys and
//! operation stream, opened over the session's TLS connection, acknowledged over its own QP.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::{tls_or, ClientError};
use crate::datapath::{Ack, Op, StreamId};
use crate::handshake::Message;
use crate::lanes::LaneAnswer;
use crate::protect::{Protection, Side};
use crate::session::{Arrival, Confirm, Prepared, Secrets, Session, SessionError};
use crate::verbs::{VerbsError, WcOpcode};

/// One more lane of a session: its session (QP, keys) and its own operation stream.
pub(crate) struct Lane {
    pub(crate) index: u32,
    session: Session,
    stream: StreamId,
    next_seq: u64,
    /// Operations posted and not acknowledged, oldest first.
    pub(crate) outstanding: VecDeque<(u64, Op)>,
    window: usize,
    timeout: Duration,
    posted: u64,
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

    /// Posts one operation with the lane's next sequence.
    pub(crate) async fn post(&mut self, op: Op, data: &[u8]) -> Result<(), ClientError> {
        if let Err(e) = self.session.post(op, data).await {
            return Err(self.lost(e));
        }
        self.outstanding.push_back((self.next_seq, op));
        self.next_seq += 1;
        self.posted += 1;
        Ok(())
    }

    /// The acknowledgement of the lane's oldest operation, over the lane's QP, checked to name
    /// it; bounded by the client's timeout.
    pub(crate) async fn next_ack(&mut self) -> Result<Ack, ClientError> {
        let arrival = tokio::time::timeout(self.timeout, self.session.arrival()).await;
        let record = match arrival {
            Err(_) => {
                return Err(self.lost(SessionError::Timeout(
                    self.timeout,
                    "the server's acknowledgement on a lane",
                )))
            }
            Ok(Err(e)) => return Err(self.lost(e)),
            Ok(Ok(Arrival::Send(record))) => record,
            Ok(Ok(Arrival::Write(_))) => {
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
            Some(&(seq, op)) if seq == ack.seq && op == ack.op => {
                self.outstanding.pop_front();
                Ok(ack)
            }
            Some(&(_, op)) => Err(self.lost(SessionError::WrongAck {
                sent: op,
                acked: ack.op,
            })),
            None => Err(self.lost(SessionError::NothingInFlight)),
        }
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
        let started = Instant::now();
        let Some(setup) = self.link.lanes.as_ref() else {
            return Err(ClientError::NoLanes);
        };
        let lane = self.lanes.last().map_or(1, |l| l.index + 1);
        let stream = StreamId::random();
        let timeout = self.link.timeout;
        let conn = self.link.chan.get_ref().get_ref().1;
        let tokens = crate::tls::lane_confirmation_tokens(conn, Side::Client, lane)?;
        let protection = match setup.cipher {
            None => None,
            Some(c) => {
                let mut p = Protection::from_tls_lane(conn, Side::Client, c, lane)
                    .map_err(crate::tls::TlsError::Config)?;
                p.bind_stream(Side::Client, stream, 1);
                p.set_rekey(setup.rekey);
                Some(p)
            }
        };
        let prepared = Prepared::new(
            &setup.device,
            setup.sgid.clone(),
            Secrets { tokens, protection },
            setup.session_cfg,
        )
        .map_err(device_or_session)?;
        let prepare = started.elapsed();
        let window = self.link.window();
        self.link
            .chan
            .send(&Message::LaneOpen {
                lane,
                stream,
                endpoint: prepared.local(),
            })
            .await
            .map_err(tls_or)?;
        let answer = tokio::time::timeout(timeout, self.link.chan.expect_lane_answer(lane))
            .await
            .map_err(|_| {
                ClientError::Session(SessionError::Timeout(
                    timeout,
                    "the server's answer to a lane",
                ))
            })?
            .map_err(tls_or)?;
        let answer_took = started.elapsed().saturating_sub(prepare);
        let remote = match answer {
            LaneAnswer::Accepted(remote) => remote,
            LaneAnswer::Rejected(reason) => return Err(ClientError::LaneRejected { lane, reason }),
        };
        let unconfirmed = prepared.connect(remote).await.map_err(device_or_session)?;
        let session = unconfirmed
            .confirm(Confirm::First)
            .await
            .map_err(|e| match e {
                SessionError::ConfirmTimeout(_) | SessionError::BadToken => ClientError::Confirm(e),
                other => device_or_session(other),
            })?;
        let timing = session.timing();
        tracing::debug!(lane, stream = %stream.short(), took = ?started.elapsed(), "lane open");
        self.lanes.push(Lane {
            index: lane,
            session,
            stream,
            next_seq: 1,
            outstanding: VecDeque::new(),
            window,
            timeout,
            posted: 0,
        });
        Ok(LaneOpened {
            lane,
            took: started.elapsed(),
            setup: timing.setup,
            prepare,
            answer: answer_took,
            confirmation: timing.confirmation,
        })
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
