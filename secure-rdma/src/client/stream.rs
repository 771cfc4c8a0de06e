//! The client: an operation stream carried by one session at a time.
//!
//! Every operation gets the next sequence of the client's stream (a random
//! [`StreamId`] drawn once) and is kept until the server acknowledges it.
//! When a session is lost (the server tore it down after a forged packet, the
//! connection was reset, an acknowledgement never came, an RDMA error), the
//! client reconnects with [`Backoff`] and names its stream and where it
//! stands in it; the server answers with what it already delivered and those
//! acknowledgements, and the client sends only the rest, in order, with their
//! original sequences. The caller sees each operation's acknowledgement once,
//! in order, as if nothing happened ([`Recovery::Resume`]).
//!
//! A server that no longer knows the stream (it restarted, or its resume
//! window passed) says so ([`ResumeOutcome::Expired`]): the client sends
//! every unacknowledged operation again with its original sequence, and the
//! server flags those deliveries as possibly delivered before, so an
//! application that keeps its last sequence per stream delivers each once.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lanes::Lane;
use super::link::Link;
use super::{Backoff, ClientError, Connector};
use crate::datapath::{AbortReason, Ack, Op, StreamId};
use crate::handshake::{HandshakeError, Kind, Resume, StreamHello};
use crate::session::{Session, SessionError};
use crate::verbs::Device;

/// What the client does when a session is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Recovery {
    /// Reconnect and resume the stream: every operation delivered exactly
    /// once (the default).
    #[default]
    Resume,
    /// Reconnect with a new stream and send every unacknowledged operation
    /// again: at least once (an operation whose acknowledgement was lost is
    /// delivered twice). For comparison with [`Recovery::Resume`].
    Resend,
    /// Report the lost session to the caller; nothing is sent again.
    Fail,
}

/// How a resume went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResumeOutcome {
    /// The server knew the stream: `acknowledged` operations had been
    /// delivered while the client waited (their acknowledgements came with
    /// the answer), the rest were sent again.
    Resumed {
        /// Acknowledgements learned from the answer.
        acknowledged: usize,
    },
    /// The server no longer knew the stream: every unacknowledged operation
    /// was sent again, flagged as possibly delivered.
    Expired,
    /// A new stream, every unacknowledged operation sent again: with
    /// [`Recovery::Resend`], or after the server delivered operations of the
    /// old stream this client never sent (forged without payload protection).
    WithoutResume,
}

/// One recovered session, for the caller to report ([`Client::take_resumes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResumeEvent {
    /// Why the session was lost.
    pub cause: String,
    /// What the server knew.
    pub outcome: ResumeOutcome,
    /// Operations sent again on the new session.
    pub resent: usize,
    /// The stream, after the recovery (a new one with [`Recovery::Resend`]).
    pub stream: StreamId,
    /// Connection attempts it took.
    pub attempts: u32,
    /// From the loss to the new session's answer.
    pub took: Duration,
    /// The identity the server authenticated on the new session.
    pub identity: String,
    /// The new session's payload cipher (`None`: payloads in clear).
    pub cipher: Option<crate::protect::Cipher>,
    /// The lost session's other lanes, each of whose streams was resumed on a new lane of the
    /// new session (0 without lanes).
    pub lanes_resumed: usize,
    /// Of those lanes' operations: acknowledged by the server's answers (delivered while
    /// their acknowledgement was lost)...
    pub lanes_acknowledged: usize,
    /// ...and sent again on the new lanes (not delivered).
    pub lanes_resent: usize,
}

/// What a recovery is doing, as it happens ([`Client::on_recovery`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Recovering<'a> {
    /// The session was lost; a new one is being made.
    Lost {
        /// Why.
        cause: &'a str,
    },
    /// A connection attempt failed; the next comes after `delay`.
    Retrying {
        /// The attempt that failed (1-based).
        attempt: u32,
        /// Its error.
        error: &'a ClientError,
        /// The wait before the next.
        delay: Duration,
    },
    /// A new session carries the stream again.
    Recovered(&'a ResumeEvent),
}

/// Told each step of a recovery.
type Observer = Box<dyn FnMut(Recovering<'_>) + Send>;

/// What the recovery did, in a line a program can print after its name: `resumed stream
/// 1a2b3c4d: 1 acknowledged while away, 0 sent again`, `stream expired on the server: 2
/// operations sent again, flagged as possibly delivered`, or `reconnected without resume: 2
/// operations sent again`.
impl std::fmt::Display for ResumeEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.fmt_lane0(f)?;
        if self.lanes_resumed > 0 {
            write!(
                f,
                "; {} more lanes resumed: {} acknowledged while away, {} sent again",
                self.lanes_resumed, self.lanes_acknowledged, self.lanes_resent
            )?;
        }
        Ok(())
    }
}

impl ResumeEvent {
    fn fmt_lane0(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.outcome {
            ResumeOutcome::Resumed { acknowledged } => write!(
                f,
                "resumed stream {}: {acknowledged} acknowledged while away, {} sent again",
                self.stream.short(),
                self.resent
            ),
            ResumeOutcome::Expired => write!(
                f,
                "stream expired on the server: {} operations sent again, flagged as possibly delivered",
                self.resent
            ),
            ResumeOutcome::WithoutResume => write!(
                f,
                "reconnected without resume: {} operations sent again",
                self.resent
            ),
        }
    }
}

/// An operation kept until the server acknowledges it.
struct Pending {
    seq: u64,
    op: Op,
    data: Vec<u8>,
    /// Posted on the current link (not just kept for the next one).
    posted: bool,
}

/// A connected client, whose operations survive a lost session.
pub struct Client {
    // Drop order: the lanes, then the link (RDMA, then TLS).
    /// The session's lanes beyond the first ([`crate::lanes`]), in the order opened.
    pub(super) lanes: Vec<Lane>,
    pub(super) link: Link,
    /// Where [`Client::pick_lane`] starts looking: the lane after the last one chosen.
    pub(super) lane_turn: usize,
    /// Operations posted on lane 0 (the session's first QP), resent ones included.
    pub(super) lane0_posted: u64,
    /// The number the next lane opened gets: numbers are never reused in a session.
    pub(super) next_lane: u32,
    connector: Connector,
    stream: StreamId,
    /// The sequence the next new operation gets.
    next_seq: u64,
    /// The highest sequence ever posted on any session of the stream.
    sent: u64,
    /// Operations without an acknowledgement, oldest first.
    unacked: VecDeque<Pending>,
    /// Acknowledgements learned (from a resume, or while waiting for room)
    /// and not yet returned to the caller, oldest first.
    ready: VecDeque<Ack>,
    observer: Option<Observer>,
    /// The stream was given up (forged deliveries): the next new one is reported so.
    restarted: bool,
    identity: String,
    device: Arc<Device>,
}

impl Client {
    pub(super) fn new(
        connector: Connector,
        link: Link,
        stream: StreamId,
        identity: String,
        device: Arc<Device>,
    ) -> Client {
        Client {
            lanes: Vec::new(),
            link,
            lane_turn: 0,
            lane0_posted: 0,
            next_lane: 1,
            connector,
            stream,
            next_seq: 1,
            sent: 0,
            unacked: VecDeque::new(),
            ready: VecDeque::new(),
            observer: None,
            restarted: false,
            identity,
            device,
        }
    }

    /// Connects, authenticates, is admitted, sets up and confirms RDMA.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use secure_rdma::client::{Client, ClientConfig};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut client = Client::connect(
    ///     &ClientConfig::new("10.77.0.1")
    ///         .with_identity("certs/alice.pem", "certs/alice.key")
    ///         .with_timeout(Duration::from_secs(5)),
    /// )
    /// .await?;
    /// let ack = client.send(b"hello over RDMA").await?;
    /// assert_eq!(ack.bytes, 15);
    /// client.quit().await;
    /// # Ok(()) }
    /// ```
    pub async fn connect(cfg: &super::ClientConfig) -> Result<Client, ClientError> {
        Ok(Connector::new(cfg.clone()).connect_timed().await?.0)
    }

    /// The identity the server authenticated.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The local RDMA device.
    pub fn device(&self) -> &str {
        self.device.name()
    }

    /// The operation stream (the application's idempotency key with each
    /// acknowledgement's `seq`).
    pub fn stream(&self) -> StreamId {
        self.stream
    }

    /// The current session (wiring, limits).
    pub fn session(&self) -> &Session {
        &self.link.session
    }

    /// The current session itself, to post RDMA operations past this
    /// client's bookkeeping (tests of clients that misbehave). Use
    /// [`Client::post`] to pipeline.
    pub fn session_mut(&mut self) -> &mut Session {
        &mut self.link.session
    }

    /// Acknowledgements come over RDMA (the streaming data path), with this
    /// many operations allowed in flight; `None`: over TLS, one at a time.
    pub fn rdma_window(&self) -> Option<usize> {
        self.link.window
    }

    /// Operations posted whose acknowledgement has not come yet, on every lane.
    pub fn in_flight(&self) -> usize {
        self.unacked.len()
            + self
                .lanes
                .iter()
                .map(|l| l.outstanding.len())
                .sum::<usize>()
    }

    /// Calls `observer` at each step of a recovery, as it happens: the loss,
    /// each failed attempt, the new session (to log them; a binary prints
    /// them).
    ///
    /// ```no_run
    /// # async fn demo(mut client: secure_rdma::client::Client) {
    /// use secure_rdma::client::Recovering;
    ///
    /// client.on_recovery(|step| match step {
    ///     Recovering::Lost { cause } => eprintln!("session lost: {cause}"),
    ///     Recovering::Recovered(ev) => eprintln!("resumed: {:?}, {} sent again", ev.outcome, ev.resent),
    ///     _ => {}
    /// });
    /// # }
    /// ```
    pub fn on_recovery(&mut self, observer: impl FnMut(Recovering<'_>) + Send + 'static) {
        self.observer = Some(Box::new(observer));
    }

    fn tell(&mut self, step: Recovering<'_>) {
        if let Some(o) = self.observer.as_mut() {
            o(step);
        }
    }

    /// The acknowledgement of the oldest operation in flight
    /// ([`Client::post`]), checked to name that operation; an error when none
    /// is in flight. With more lanes, this is lane 0's ([`Client::flush`] waits for every
    /// lane's). A lost session is recovered on the way (see the module
    /// docs): the acknowledgement may come from the server's resume answer.
    pub async fn ack(&mut self) -> Result<Ack, ClientError> {
        loop {
            if let Some(ack) = self.ready.pop_front() {
                return Ok(ack);
            }
            if self.unacked.is_empty() {
                return Err(ClientError::Session(SessionError::NothingInFlight));
            }
            let result = match self.link.next_ack().await {
                Ok(ack) => self.matched(ack),
                Err(e) => Err(e),
            };
            match result {
                Ok(ack) => return Ok(ack),
                Err(e) => self.recover(e).await?,
            }
        }
    }

    /// Pops the oldest unacknowledged operation if `ack` names it.
    fn matched(&mut self, ack: Ack) -> Result<Ack, ClientError> {
        let Some(front) = self.unacked.front() else {
            return Err(ClientError::Forged {
                acked: ack.seq,
                made: self.next_seq - 1,
            });
        };
        // The server numbers the stream as we do; a number other than our oldest means it
        // acknowledged something we never sent.
        if ack.seq != front.seq {
            return Err(ClientError::Forged {
                acked: ack.seq,
                made: self.next_seq - 1,
            });
        }
        if ack.op != front.op {
            return Err(ClientError::Session(SessionError::WrongAck {
                sent: front.op,
                acked: ack.op,
            }));
        }
        self.unacked.pop_front();
        Ok(ack)
    }

    /// Posts an RDMA SEND (`Op::Send`) or WRITE (`Op::Write`) without waiting
    /// for the server's acknowledgement: on the streaming data path up to
    /// [`Client::rdma_window`] operations are in flight, and a post beyond
    /// that first waits for the oldest acknowledgement (the server's credit).
    /// Over TLS acknowledgements, one operation at a time. Returns the
    /// acknowledgements that came while waiting for room. The operation is
    /// kept until acknowledged, so a lost session loses none.
    ///
    /// ```no_run
    /// use secure_rdma::client::{Client, ClientConfig};
    /// use secure_rdma::datapath::Op;
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut client = Client::connect(
    ///     &ClientConfig::new("10.77.0.1")
    ///         .with_identity("certs/alice.pem", "certs/alice.key")
    ///         .with_rdma_acks(true),
    /// )
    /// .await?;
    /// let mut acks = Vec::new();
    /// for chunk in [b"one".as_slice(), b"two", b"three"] {
    ///     acks.extend(client.post(Op::Send, chunk).await?);
    /// }
    /// acks.extend(client.flush().await?);
    /// assert_eq!(acks.iter().map(|a| a.seq).collect::<Vec<_>>(), [1, 2, 3]);
    /// client.quit().await;
    /// # Ok(()) }
    /// ```
    ///
    /// With more lanes ([`Client::add_lane`]), each operation goes on the lane with the fewest
    /// awaiting acknowledgement ([`Client::pick_lane`]); each lane keeps its own order and
    /// sequences, and the acknowledgements of different lanes come in no set order.
    pub async fn post(&mut self, op: Op, data: &[u8]) -> Result<Vec<Ack>, ClientError> {
        if self.lanes.is_empty() {
            return self.post_lane0(op, data).await;
        }
        match self.pick_lane() {
            0 => self.post_lane0(op, data).await,
            i => {
                let mut acks = Vec::new();
                let (mut resumes, mut recoveries) = (0, 0);
                loop {
                    let Some(lane) = self.lanes.get_mut(i - 1) else {
                        // A recovery below could not bring every lane back.
                        return Err(ClientError::NoLanes);
                    };
                    let (chan, closed) = (&mut self.link.chan, &mut self.link.closed_lanes);
                    let result = match lane.outstanding.len() >= lane.window() {
                        true => lane.next_ack(chan, closed).await.map(|a| acks.push(a)),
                        false => match lane.post(op, data, closed).await {
                            Ok(()) => return Ok(acks),
                            Err(e) => Err(e),
                        },
                    };
                    match result {
                        Ok(()) => {}
                        // The lane is lost: its stream goes on on a new lane (this operation
                        // not yet kept, so it is posted after the resume). Once: a lane that
                        // fails again right away is reported. The session's own end is not a
                        // lane's, and is reported as it is.
                        Err(e @ ClientError::LaneLost { .. }) if resumes == 0 => {
                            resumes += 1;
                            acks.extend(self.resume_lane(i - 1, e).await?);
                        }
                        // The whole session was lost (heard on this lane's wait): recovered
                        // as lane 0 recovers it, every lane's stream resumed on the new
                        // session, then this lane goes on. Once, as above.
                        Err(e) if recoveries == 0 && e.is_session_lost() => {
                            recoveries += 1;
                            self.recover(e).await?;
                            acks.extend(self.ready.drain(..));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
        }
    }

    /// Operations of lane 0 without an acknowledgement.
    pub(super) fn unacked_len(&self) -> usize {
        self.unacked.len()
    }

    /// [`Client::post`] on lane 0, the session's first QP, whose stream is resumed when the
    /// session is lost.
    async fn post_lane0(&mut self, op: Op, data: &[u8]) -> Result<Vec<Ack>, ClientError> {
        let mut acks = Vec::new();
        while self.link.in_flight >= self.link.window() && !self.unacked.is_empty() {
            acks.push(self.ack().await?);
        }
        // The write region first, if the server grants it on request: a refusal leaves the
        // operation unkept and unnumbered, so the stream goes on without it.
        if op == Op::Write {
            if let Err(e) = self.link.open_writes().await {
                self.recover(e).await?;
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.unacked.push_back(Pending {
            seq,
            op,
            data: data.to_vec(),
            posted: false,
        });
        if let Err(e) = self.post_pending().await {
            // Recovery sends every kept operation, this one included.
            self.recover(e).await?;
        }
        acks.extend(self.ready.drain(..));
        Ok(acks)
    }

    /// Posts every kept operation not yet posted on the current link, in
    /// order, waiting for acknowledgements (into `ready`) when the window is
    /// full.
    async fn post_pending(&mut self) -> Result<(), ClientError> {
        while let Some(i) = self.unacked.iter().position(|p| !p.posted) {
            if self.link.in_flight >= self.link.window() {
                let ack = self.link.next_ack().await?;
                let ack = self.matched(ack)?;
                self.ready.push_back(ack);
                continue;
            }
            let p = &self.unacked[i];
            let (op, seq) = (p.op, p.seq);
            self.link.post(op, &self.unacked[i].data).await?;
            self.lane0_posted += 1;
            self.unacked[i].posted = true;
            self.sent = self.sent.max(seq);
        }
        Ok(())
    }

    /// Waits for the acknowledgement of every operation in flight; returns
    /// them (and any learned while waiting), oldest first.
    pub async fn flush(&mut self) -> Result<Vec<Ack>, ClientError> {
        // A failed RDMA operation is named by its own completion, not by the acknowledgement
        // that will never come.
        if let Err(e) = self.link.complete().await {
            self.recover(e).await?;
        }
        let mut acks: Vec<Ack> = self.ready.drain(..).collect();
        while !self.unacked.is_empty() || !self.ready.is_empty() {
            acks.push(self.ack().await?);
        }
        let mut i = 0;
        while i < self.lanes.len() {
            let (mut resumes, mut recoveries) = (0, 0);
            while !self.lanes[i].outstanding.is_empty() {
                let (chan, closed) = (&mut self.link.chan, &mut self.link.closed_lanes);
                match self.lanes[i].next_ack(chan, closed).await {
                    Ok(a) => acks.push(a),
                    // Once per lane and flush: a lane that fails again right away is reported.
                    Err(e @ ClientError::LaneLost { .. }) if resumes == 0 => {
                        resumes += 1;
                        acks.extend(self.resume_lane(i, e).await?);
                    }
                    // The whole session was lost: recovered with every lane's stream (the
                    // lanes keep their order), then this lane's wait goes on.
                    Err(e) if recoveries == 0 && e.is_session_lost() => {
                        recoveries += 1;
                        self.recover(e).await?;
                        acks.extend(self.ready.drain(..));
                        if i >= self.lanes.len() {
                            return Err(ClientError::NoLanes);
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
            i += 1;
        }
        // A recovery while waiting for a lane sent lane 0's kept operations again.
        while !self.unacked.is_empty() || !self.ready.is_empty() {
            acks.push(self.ack().await?);
        }
        Ok(acks)
    }

    /// One operation, waited for: earlier ones in flight are acknowledged
    /// first, then this one; its acknowledgement is returned.
    async fn one(&mut self, op: Op, data: &[u8]) -> Result<Ack, ClientError> {
        self.flush().await?;
        self.post(op, data).await?;
        let mut acks = self.flush().await?;
        acks.pop()
            .ok_or(ClientError::Session(SessionError::NothingInFlight))
    }

    /// RDMA SENDs `msg` and waits for the server's acknowledgement.
    pub async fn send(&mut self, msg: &[u8]) -> Result<Ack, ClientError> {
        self.one(Op::Send, msg).await
    }

    /// RDMA WRITEs `data` into the server's buffer (with immediate) and waits
    /// for the acknowledgement.
    pub async fn write(&mut self, data: &[u8]) -> Result<Ack, ClientError> {
        self.one(Op::Write, data).await
    }

    /// Waits until the server ends the session on its own: `Ok(None)` for
    /// an orderly bye (shutdown, idle), `Ok(Some(reason))` for an abort (an
    /// RDMA message failed authentication), `Err` when the connection
    /// broke. Cancel-safe: select on it between operations to notice a lost
    /// session before the next command, then [`Client::reconnect`].
    pub async fn closed(&mut self) -> Result<Option<AbortReason>, ClientError> {
        match self.link.closed().await {
            // An acknowledgement while we made no operation: the server received a message
            // we never sent.
            Err(HandshakeError::Unexpected { got: Kind::Ack, .. }) => Err(ClientError::Forged {
                acked: self.next_seq,
                made: self.next_seq - 1,
            }),
            other => other.map_err(super::tls_or),
        }
    }

    /// A new session for the stream now (after [`Client::closed`] said the
    /// last one ended): resumes it as a lost session would be, and reports
    /// how it went.
    pub async fn reconnect(&mut self, cause: &str) -> Result<ResumeEvent, ClientError> {
        let recovery = match self.connector.config().recovery {
            Recovery::Fail => Recovery::Resume,
            other => other,
        };
        self.recover_from(cause.to_owned(), recovery).await
    }

    /// Says bye, waits briefly for the server's bye, and frees everything.
    pub async fn quit(mut self) {
        // The lanes' QPs first: the server ends them with the session.
        self.lanes.clear();
        self.link.quit().await;
    }

    /// Recovers from `e` if it is a lost session and the configuration says
    /// so; otherwise returns it.
    async fn recover(&mut self, e: ClientError) -> Result<(), ClientError> {
        let recovery = self.connector.config().recovery;
        if recovery == Recovery::Fail || !e.is_session_lost() {
            return Err(e);
        }
        let cause = e.to_string();
        self.recover_from(cause, recovery).await.map(drop)
    }

    /// Connects again (with the configured backoff) and resumes the stream
    /// (or, with [`Recovery::Resend`], starts a new one), then sends again
    /// what the server does not have.
    async fn recover_from(
        &mut self,
        cause: String,
        recovery: Recovery,
    ) -> Result<ResumeEvent, ClientError> {
        let lost = Instant::now();
        self.tell(Recovering::Lost { cause: &cause });
        let backoff: Backoff = self.connector.config().backoff;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            match self.resume_once(recovery).await {
                Ok((outcome, resent, lanes)) => {
                    tracing::info!(
                        stream = %self.stream.short(),
                        ?outcome,
                        resent,
                        attempts,
                        %cause,
                        "session recovered"
                    );
                    let event = ResumeEvent {
                        cause,
                        outcome,
                        resent,
                        stream: self.stream,
                        attempts,
                        took: lost.elapsed(),
                        identity: self.identity.clone(),
                        cipher: self.link.session.cipher(),
                        lanes_resumed: lanes.lanes,
                        lanes_acknowledged: lanes.acknowledged,
                        lanes_resent: lanes.resent,
                    };
                    self.tell(Recovering::Recovered(&event));
                    return Ok(event);
                }
                Err(e) if e.worth_another_resume() && attempts <= backoff.attempts => {
                    let delay = backoff.delay(attempts - 1);
                    tracing::debug!(error = %e, attempts, ?delay, "reconnecting");
                    self.tell(Recovering::Retrying {
                        attempt: attempts,
                        error: &e,
                        delay,
                    });
                    tokio::time::sleep(delay).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Goes on in a new stream: what is not acknowledged is numbered from 1 in it.
    fn restart_stream(&mut self) {
        self.stream = StreamId::random();
        let mut seq = 0;
        for p in self.unacked.iter_mut() {
            seq += 1;
            p.seq = seq;
        }
        self.next_seq = seq + 1;
        self.sent = 0;
        self.restarted = true;
    }

    /// One attempt: a new session, the server's answer applied, the rest sent again.
    async fn resume_once(
        &mut self,
        recovery: Recovery,
    ) -> Result<(ResumeOutcome, usize, super::lanes::LanesResumed), ClientError> {
        if recovery == Recovery::Resend {
            // A new stream: the server cannot know which of these it has, so they are sent
            // again under new sequences.
            self.restart_stream();
        }
        let hello = StreamHello {
            id: self.stream,
            next: self.unacked.front().map_or(self.next_seq, |p| p.seq),
            sent: self.sent,
        };
        let (link, identity, device, resume, _) = self.connector.connect_link(hello).await?;
        // The old link goes now: its QP can deliver nothing the new answer does not cover.
        self.link = link;
        // Lane numbers name keys within one TLS connection: the new one starts them again.
        self.next_lane = 1;
        self.lane_turn = 0;
        self.identity = identity;
        self.device = device;
        for p in self.unacked.iter_mut() {
            p.posted = false;
        }
        let kept: Vec<(u64, Op)> = self.unacked.iter().map(|p| (p.seq, p.op)).collect();
        let restarted = std::mem::take(&mut self.restarted);
        let outcome = match plan(&hello, &kept, resume, recovery, restarted)? {
            Plan::Proceed { outcome, acks } => {
                for ack in acks {
                    self.unacked.pop_front();
                    self.ready.push_back(ack);
                }
                outcome
            }
            Plan::RestartStream { delivered } => {
                tracing::warn!(
                    stream = %self.stream.short(),
                    delivered,
                    sent = hello.sent,
                    "the server delivered operations this client never sent (forged); starting a new stream"
                );
                self.restart_stream();
                return Err(ClientError::Forged {
                    acked: delivered,
                    made: hello.sent,
                });
            }
        };
        let resent = self.unacked.len();
        self.post_pending().await?;
        // The other lanes belonged to the lost session's TLS connection, which the server
        // ended with it (drained): each is resumed on the new session now that lane 0 is.
        // Until here they stay in place, so an attempt that fails above leaves them for the
        // next.
        let lost_lanes = std::mem::take(&mut self.lanes);
        let mut ready = std::mem::take(&mut self.ready);
        let resumed = self.resume_lanes(lost_lanes, &mut ready).await;
        self.ready = ready;
        Ok((outcome, resent, resumed?))
    }
}

/// What the client does with the server's answer to its resume.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// Go on: these acknowledgements (of the oldest kept operations, in order) came with the
    /// answer; the rest is sent again.
    Proceed {
        outcome: ResumeOutcome,
        acks: Vec<Ack>,
    },
    /// The server delivered operations of this stream the client never sent: forged into a
    /// session without payload protection. The numbering is the attacker's; go on in a new
    /// stream.
    RestartStream { delivered: u64 },
}

/// The answer `resume` to `hello`, judged against the operations the client keeps
/// (`(sequence, operation)`, oldest first): pure, so that every branch is tested without a
/// server. An answer that contradicts what the client knows is a protocol error, never
/// guessed around.
fn plan(
    hello: &StreamHello,
    kept: &[(u64, Op)],
    resume: Resume,
    recovery: Recovery,
    restarted: bool,
) -> Result<Plan, ClientError> {
    let invalid = |reason: String| {
        Err(super::tls_or(HandshakeError::Invalid {
            field: "resume",
            reason,
        }))
    };
    match resume {
        Resume::New if recovery == Recovery::Resend || restarted => Ok(Plan::Proceed {
            outcome: ResumeOutcome::WithoutResume,
            acks: Vec::new(),
        }),
        Resume::New if hello.sent > 0 || hello.next > 1 => {
            invalid("the server treats a stream already in use as new".into())
        }
        Resume::New => Ok(Plan::Proceed {
            outcome: ResumeOutcome::Resumed { acknowledged: 0 },
            acks: Vec::new(),
        }),
        Resume::Resumed { delivered, .. } if delivered > hello.sent => {
            Ok(Plan::RestartStream { delivered })
        }
        Resume::Resumed { delivered, .. } if delivered + 1 < hello.next => invalid(format!(
            "delivered {delivered}, but this client had acknowledgements up to {}",
            hello.next - 1
        )),
        Resume::Resumed { delivered, acks } => {
            // Exactly the kept operations up to `delivered`, in order, each for its operation.
            let due: Vec<&(u64, Op)> = kept
                .iter()
                .take_while(|(seq, _)| *seq <= delivered)
                .collect();
            if acks.len() != due.len() {
                return invalid(format!(
                    "delivered {delivered} with {} acknowledgements for {} operations",
                    acks.len(),
                    due.len()
                ));
            }
            let mut out = Vec::with_capacity(acks.len());
            for (ack, (seq, op)) in acks.into_iter().zip(due) {
                let ack = Ack::from(ack);
                if ack.seq != *seq || ack.op != *op {
                    return invalid(format!(
                        "an acknowledgement of {} #{} where {op} #{seq} was due",
                        ack.op, ack.seq
                    ));
                }
                out.push(ack);
            }
            Ok(Plan::Proceed {
                outcome: ResumeOutcome::Resumed {
                    acknowledged: out.len(),
                },
                acks: out,
            })
        }
        Resume::Expired => Ok(Plan::Proceed {
            outcome: ResumeOutcome::Expired,
            acks: Vec::new(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::AckStatus;
    use crate::handshake::AckRecord;

    const ID: StreamId = StreamId([1; 16]);

    fn hello(next: u64, sent: u64) -> StreamHello {
        StreamHello { id: ID, next, sent }
    }

    fn record(seq: u64, op: Op) -> AckRecord {
        AckRecord {
            op,
            seq,
            bytes: 1,
            status: AckStatus::Delivered,
        }
    }

    fn go(h: StreamHello, kept: &[(u64, Op)], resume: Resume) -> Result<Plan, ClientError> {
        plan(&h, kept, resume, Recovery::Resume, false)
    }

    #[test]
    fn a_resume_hands_over_the_missed_acknowledgements_in_order() {
        let kept = [(4, Op::Send), (5, Op::Write), (6, Op::Send)];
        let answer = Resume::Resumed {
            delivered: 5,
            acks: vec![record(4, Op::Send), record(5, Op::Write)],
        };
        let Plan::Proceed { outcome, acks } = go(hello(4, 6), &kept, answer).unwrap() else {
            panic!()
        };
        assert_eq!(outcome, ResumeOutcome::Resumed { acknowledged: 2 });
        assert_eq!(acks.iter().map(|a| a.seq).collect::<Vec<_>>(), [4, 5]);
        // Nothing delivered while away: nothing handed over, everything sent again.
        let answer = Resume::Resumed {
            delivered: 3,
            acks: vec![],
        };
        assert_eq!(
            go(hello(4, 6), &kept, answer).unwrap(),
            Plan::Proceed {
                outcome: ResumeOutcome::Resumed { acknowledged: 0 },
                acks: vec![]
            }
        );
    }

    #[test]
    fn an_answer_that_contradicts_the_client_is_refused_by_name() {
        let kept = [(4, Op::Send), (5, Op::Write)];
        for (answer, says) in [
            // An acknowledgement missing.
            (
                Resume::Resumed {
                    delivered: 5,
                    acks: vec![record(4, Op::Send)],
                },
                "with 1 acknowledgements for 2 operations",
            ),
            // An acknowledgement of the wrong operation.
            (
                Resume::Resumed {
                    delivered: 4,
                    acks: vec![record(4, Op::Write)],
                },
                "an acknowledgement of write #4 where send #4 was due",
            ),
            // Less delivered than the client already had acknowledged.
            (
                Resume::Resumed {
                    delivered: 1,
                    acks: vec![],
                },
                "delivered 1, but this client had acknowledgements up to 3",
            ),
            // A stream in use answered as new.
            (Resume::New, "treats a stream already in use as new"),
        ] {
            let e = go(hello(4, 5), &kept, answer).err().unwrap();
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn more_delivered_than_sent_is_a_forgery_and_restarts_the_stream() {
        let kept = [(2, Op::Send)];
        let answer = Resume::Resumed {
            delivered: 3,
            acks: vec![record(2, Op::Send), record(3, Op::Send)],
        };
        assert_eq!(
            go(hello(2, 2), &kept, answer).unwrap(),
            Plan::RestartStream { delivered: 3 }
        );
    }

    #[test]
    fn expired_and_new_streams_send_everything_again() {
        let kept = [(7, Op::Send), (8, Op::Send)];
        let Plan::Proceed { outcome, acks } = go(hello(7, 8), &kept, Resume::Expired).unwrap()
        else {
            panic!()
        };
        assert_eq!((outcome, acks.len()), (ResumeOutcome::Expired, 0));
        // A fresh stream is new; a resend's new stream is new too, and said to be.
        assert!(matches!(
            go(hello(1, 0), &[], Resume::New),
            Ok(Plan::Proceed {
                outcome: ResumeOutcome::Resumed { acknowledged: 0 },
                ..
            })
        ));
        assert!(matches!(
            plan(&hello(1, 0), &kept, Resume::New, Recovery::Resend, false),
            Ok(Plan::Proceed {
                outcome: ResumeOutcome::WithoutResume,
                ..
            })
        ));
    }
}
