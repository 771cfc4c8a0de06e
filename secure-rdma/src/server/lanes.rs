//! The server's side of [lanes](crate::lanes): a client's request for one more QP on its live
//! session, admitted against the identity's lane cap and its quotas, set up and answered over
//! the session's TLS connection; then the lane's own loop, which delivers and acknowledges
//! what arrives on it until the session ends or the lane fails.
//!
//! A lane's loop runs inside its session's task ([`super::session_loop`]), beside lane 0: a
//! lane that fails (a forged packet, an RDMA error) ends alone, drained, while the session and
//! its other lanes go on.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::admission::KeyCounts;
use super::handler::{Delivery, Peer};
use super::session_loop::{datapath_failure, log_arrival, RotationsCounted};
use super::streams::StreamLease;
use super::Shared;
use crate::datapath::{Ack, AckStatus, Op, StreamId};
use crate::events::DataPathCause;
use crate::handshake::RejectReason;
use crate::lanes::LaneRequest;
use crate::metrics::ActiveLane;
use crate::protect::{Cipher, Protection, RekeyPolicy, Side};
use crate::ratelimit::LogLimiter;
use crate::server::handler::HandlerError;
use crate::session::{
    Confirm, Secrets, SessionAdmission, SessionConfig, SessionError, Unconfirmed,
};
use crate::verbs::{Device, GidEntry};

/// What every lane of one session shares with it.
pub(super) struct LaneContext<'a> {
    pub(super) shared: &'a Shared,
    pub(super) identity: &'a str,
    pub(super) peer: Arc<Peer>,
    pub(super) device: Arc<Device>,
    pub(super) sgid: GidEntry,
    /// The session's own configuration: a lane has the same slots and buffers.
    pub(super) session_cfg: SessionConfig,
    pub(super) cipher: Option<Cipher>,
    pub(super) rekey: RekeyPolicy,
    /// The session negotiated lanes.
    pub(super) enabled: bool,
    /// When the last arrival on any lane but lane 0 came: the session's idle timeout counts
    /// from it too.
    pub(super) last_arrival: crate::clock::LatestCoarse,
}

/// One lane counted against its identity's cap until dropped.
pub(super) struct LaneSlot<'a> {
    identity: String,
    counts: &'a KeyCounts<String>,
}

impl Drop for LaneSlot<'_> {
    fn drop(&mut self) {
        self.counts.release(&self.identity);
    }
}

/// What an open lane holds until its loop ends: its quota counts, its place under the cap and
/// its place in the metrics. Dropped after its RDMA resources.
pub(super) struct LaneHeld<'a> {
    _active: ActiveLane,
    _quota: Option<(SessionAdmission, crate::quota::TenantQuota)>,
    _slot: LaneSlot<'a>,
}

/// The session's running lanes by lane number, each with its stream and its "end now".
///
/// Keyed by lane, not by stream: a lane asked to end stays here, its stream still carried,
/// until its loop has ended and drained. A resume of that stream is answered only then, from
/// the stream's final state; answered earlier (the drain outlived its wait), it would start
/// the new lane where the old one might still deliver, and the old lane's end, found by its
/// stream, would take the new lane's "end now" with it.
#[derive(Default)]
pub(super) struct RunningLanes {
    lanes: std::collections::HashMap<u32, Running>,
}

struct Running {
    stream: StreamId,
    ender: watch::Sender<bool>,
    /// Asked to end (a resume of its stream, the session's end): its end is not news.
    asked: bool,
}

impl RunningLanes {
    /// `lane` runs, carrying `stream`, until `ender` says otherwise.
    pub(super) fn start(&mut self, lane: u32, stream: StreamId, ender: watch::Sender<bool>) {
        self.lanes.insert(
            lane,
            Running {
                stream,
                ender,
                asked: false,
            },
        );
    }

    /// A running lane, asked to end or not, still carries `stream`.
    pub(super) fn carries(&self, stream: StreamId) -> bool {
        self.lanes.values().any(|r| r.stream == stream)
    }

    /// Asks the lane that carries `stream` to end; its number, if one does.
    pub(super) fn ask_to_end(&mut self, stream: StreamId) -> Option<u32> {
        let (lane, running) = self.lanes.iter_mut().find(|(_, r)| r.stream == stream)?;
        running.asked = true;
        let _ = running.ender.send(true);
        Some(*lane)
    }

    /// Asks every running lane to end.
    pub(super) fn ask_all(&mut self) {
        for running in self.lanes.values_mut() {
            running.asked = true;
            let _ = running.ender.send(true);
        }
    }

    /// `lane`'s loop ended: true when it ended on its own (a forgery, its QP failed), which
    /// its client is told of; false when it was asked to, or is not known.
    pub(super) fn ended(&mut self, lane: u32) -> bool {
        self.lanes.remove(&lane).is_some_and(|r| !r.asked)
    }
}

/// How a lane's loop ended. Where its stream stands is in the server's stream registry
/// ([`super::streams`]), which a lane that resumes the stream, in this session or a later one,
/// is answered from.
pub(super) struct LaneEnd {
    pub(super) lane: u32,
    pub(super) reason: String,
}

/// A lane refused: the reason the client hears and the metric's label.
pub(super) struct Refused {
    pub(super) reason: RejectReason,
    pub(super) label: &'static str,
}

impl<'a> LaneContext<'a> {
    /// Admits and sets up the lane `req` asks for: the cap, the quotas, then its QP connected
    /// to the client's (RTS). `used` are the lane numbers this session opened so far. Nothing
    /// of a refused lane stays behind.
    pub(super) async fn open(
        &self,
        req: &LaneRequest,
        used: &[u32],
        first: u64,
        conn: &rustls::ServerConnection,
    ) -> Result<(Unconfirmed, LaneHeld<'a>), Refused> {
        let policy = |detail: String| Refused {
            reason: RejectReason::Policy { detail },
            label: "policy",
        };
        if !self.enabled {
            return Err(policy(
                "this session has no lanes: a client asks for them in its hello (capability \
                 'lanes') on the streaming data path (RDMA acknowledgements), and the server \
                 offers them when its lane cap is above 1"
                    .into(),
            ));
        }
        if used.contains(&req.lane) {
            // The number names the lane's keys: opened again, its sequences would start again
            // under the same keys and reuse their nonces.
            return Err(policy(format!(
                "lane {} was already opened on this session; lane numbers are not reused (each names its keys): ask for the next number",
                req.lane
            )));
        }
        let cfg = &self.shared.config;
        let max = cfg.max_lanes_per_identity;
        // Every session of the identity holds its first lane: what is left is for more lanes.
        let sessions = self
            .shared
            .sessions_by_identity
            .count(&self.identity.to_owned());
        let identity = self.identity.to_owned();
        if let Err(lanes) = self
            .shared
            .lanes_by_identity
            .take(&identity, Some(max.saturating_sub(sessions)))
        {
            return Err(Refused {
                reason: RejectReason::LaneLimit {
                    identity,
                    active: sessions + lanes,
                    max,
                },
                label: "lane_limit",
            });
        }
        let slot = LaneSlot {
            identity,
            counts: &self.shared.lanes_by_identity,
        };
        // A lane makes what a session makes, and counts against the same quota.
        let quota = match &cfg.quotas {
            None => None,
            Some(quotas) => {
                let tenant = quotas.register(crate::quota::TenantInfo {
                    identity: self.identity.to_owned(),
                    pid: std::process::id(),
                    cgroup_id: self.shared.cgroup_id,
                });
                let admitted = match self.shared.config.shared_receive_queue {
                    0 => self.session_cfg.admit(&tenant),
                    _ => self.session_cfg.admit_on_shared(&tenant),
                };
                match admitted {
                    Ok(admission) => Some((admission, tenant)),
                    Err(refusal) => {
                        tracing::warn!(client = %self.identity, lane = req.lane, "INTERCEPTED: {refusal}");
                        return Err(Refused {
                            reason: RejectReason::Quota {
                                detail: refusal.to_string(),
                            },
                            label: "quota",
                        });
                    }
                }
            }
        };
        let setup_failed = |detail: String| Refused {
            reason: RejectReason::Unavailable { detail },
            label: "setup",
        };
        let secrets = lane_secrets(conn, req, first, self.cipher, self.rekey)
            .map_err(|e| setup_failed(format!("TLS exporter: {e}")))?;
        let (prepared, path) =
            self.shared
                .prepare(&self.device, &self.sgid, secrets, self.session_cfg);
        self.shared
            .metrics
            .rdma_setup(path, self.shared.warm.stats().ready);
        let prepared = prepared.map_err(|e| setup_failed(e.to_string()))?;
        let unconfirmed = prepared
            .connect(req.endpoint)
            .await
            .map_err(|e| setup_failed(e.to_string()))?;
        Ok((
            unconfirmed,
            LaneHeld {
                _active: self.shared.metrics.lane_opened(),
                _quota: quota,
                _slot: slot,
            },
        ))
    }

    /// Confirms lane `lane` (the client's token first, then ours) and delivers what arrives on
    /// it, in order, each acknowledged over the lane's own QP, until `ending` says the session
    /// ends, a newer lane takes its stream over or the lane fails. Each answer is recorded in
    /// `lease`, its stream's, before the client hears it. Returns the lane's number and why it
    /// ended; its QP is drained before the stream is let go.
    pub(super) async fn serve(
        &self,
        lane: u32,
        mut lease: StreamLease,
        unconfirmed: Box<Unconfirmed>,
        held: LaneHeld<'a>,
        mut ending: watch::Receiver<bool>,
    ) -> LaneEnd {
        let mut seq = lease.first.saturating_sub(1);
        let reason = self
            .run(lane, &mut lease, &mut seq, unconfirmed, &mut ending)
            .await;
        drop(held);
        tracing::info!(client = %self.identity, lane, %reason, delivered = seq, "lane closed; its QP is freed");
        // Drained: nothing more of the lane can be delivered, so a resume waiting for the
        // stream reads its final state.
        drop(lease);
        LaneEnd { lane, reason }
    }

    /// [`LaneContext::serve`]'s loop: `seq` follows what it delivered. Returns why it ended,
    /// once its QP is drained.
    async fn run(
        &self,
        lane: u32,
        lease: &mut StreamLease,
        seq: &mut u64,
        unconfirmed: Box<Unconfirmed>,
        ending: &mut watch::Receiver<bool>,
    ) -> String {
        let stream = lease.id();
        let metrics = &self.shared.metrics;
        let timeout = self.session_cfg.timeout;
        // The lane's future is held as long as the lane: the confirmation and the drain, taken
        // once, are boxed, and what they leave is scoped, so that neither is carried across
        // the lane's life (see the connection's task in `accept`).
        let mut session = {
            let confirmed = tokio::select! {
                c = tokio::time::timeout(timeout * 2, Box::pin(super::unbox(unconfirmed).confirm(Confirm::Second))) => c,
                _ = ending.changed() => return "the session ended before the lane was confirmed".into(),
            };
            match confirmed {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::warn!(client = %self.identity, lane, error = %e, "lane not confirmed; its resources are freed");
                    return format!("not confirmed: {e}");
                }
                Err(_) => return "not confirmed in time".into(),
            }
        };
        session.set_poll(self.shared.config.poll);
        let w = *session.wiring();
        // QPNs help an attacker aim (ReDMArk): debug only, as lane 0's wiring.
        tracing::debug!(client = %self.identity, lane, qpn = %w.local.qpn, peer_qpn = %w.remote.qpn, "lane wiring");
        tracing::info!(client = %self.identity, lane, stream = %stream.short(), "lane open");
        let counter = metrics.lane_counter(lane);
        let traffic = metrics.session(self.identity, self.device.name());
        let mut content_log = LogLimiter::new(20, Duration::from_millis(100));
        // Each lane's keys rotate on their own (the session's policy, per lane): the server's
        // rotation counters add them all, not lane 0's alone.
        let mut rotations = RotationsCounted::default();
        let reason = loop {
            rotations.count(metrics, &session);
            tokio::select! {
                _ = ending.changed() => break "the session ended".to_owned(),
                // A lane of a later session resumes this stream (this session was lost to its
                // client): this lane ends, drained, before that lane is answered.
                _ = lease.evicted() => break "the client resumed the lane's stream on a new session".to_owned(),
                arrival = session.arrival() => {
                    let arrival = match arrival {
                        Ok(a) => a,
                        Err(SessionError::Auth(e)) => {
                            // As on lane 0, nothing of it was delivered and the QP cannot go
                            // on; but only this lane ends: the others have their own keys and
                            // QPs, which the forgery did not touch.
                            metrics.auth_failure(self.identity);
                            metrics.datapath_event(DataPathCause::AuthFailure);
                            metrics.auth_failure_check(e.check());
                            tracing::warn!(client = %self.identity, lane, detail = %e, check = e.check(),
                                "RDMA message failed authentication on a lane (forged, replayed or corrupted); tearing that lane down");
                            break "RDMA message failed authentication".to_owned();
                        }
                        Err(e) => break datapath_failure(metrics, self.identity, &e),
                    };
                    *seq += 1;
                    let seq = *seq;
                    counter.inc();
                    self.last_arrival.note_now();
                    let op = arrival.op();
                    traffic.received(op, arrival.data().len());
                    let bytes = u32::try_from(arrival.data().len()).unwrap_or(u32::MAX);
                    let mut status = AckStatus::Delivered;
                    match &self.shared.handler {
                        None => log_arrival(self.identity, op, seq, seq <= lease.flagged_through, arrival.data(), &mut content_log),
                        Some(handler) => {
                            // The server had lost the stream's state (an expired resume): what
                            // the client sends again may have been delivered before.
                            let delivery = Delivery::new(Arc::clone(&self.peer), seq, arrival)
                                .in_stream(stream, seq <= lease.flagged_through);
                            let handled = tokio::select! {
                                handled = handler.handle_boxed(delivery) => handled,
                                _ = ending.changed() => break "the session ended".to_owned(),
                                // Over its credit on a shared receive queue: cut now, not when
                                // the application catches up.
                                cut = session.cut_off() => break datapath_failure(metrics, self.identity, &cut),
                            };
                            match handled {
                                Ok(()) => {}
                                Err(e @ HandlerError::Refused(_)) => {
                                    tracing::warn!(client = %self.identity, lane, seq, error = %e, "the application refused an operation; answering it as refused");
                                    status = AckStatus::Refused;
                                }
                                Err(e) => break format!("{e}"),
                            }
                        }
                    }
                    let ack = Ack { op, seq, bytes, status };
                    // Remembered before the client hears it: a lane that resumes this stream
                    // is answered from here.
                    lease.answered(ack);
                    if let Err(e) = session.post(Op::Send, &ack.encode()).await {
                        break datapath_failure(metrics, self.identity, &e);
                    }
                }
            }
        };
        // Rotations of the last iteration (an arrival, then the lane ended).
        rotations.count(metrics, &session);
        let courtesy = self
            .shared
            .config
            .limits
            .write_timeout
            .min(Duration::from_secs(2));
        if let Err(e) = Box::pin(session.drain(courtesy)).await {
            tracing::warn!(client = %self.identity, lane, error = %e, "draining the lane's QP");
        }
        reason
    }
}

/// The server's confirmation tokens and payload keys of the lane `req` asks for: the exporter
/// context names the lane, and the keys are bound to the lane's stream from its first
/// operation.
fn lane_secrets(
    conn: &rustls::ServerConnection,
    req: &LaneRequest,
    first: u64,
    cipher: Option<Cipher>,
    rekey: RekeyPolicy,
) -> Result<Secrets, crate::tls::TlsError> {
    let tokens = crate::tls::lane_confirmation_tokens(conn, Side::Server, req.lane)?;
    let protection = match cipher {
        None => None,
        Some(c) => {
            let mut p = Protection::from_tls_lane(conn, Side::Server, c, req.lane)
                .map_err(crate::tls::TlsError::Config)?;
            p.bind_stream(Side::Server, req.stream, first);
            p.set_rekey(rekey);
            Some(p)
        }
    };
    Ok(Secrets { tokens, protection })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resume that asked lane 1 to end finds its stream still carried until lane 1's loop
    /// has ended: before, the lane left the table when asked, so a drain that outlived its
    /// wait let the resume be answered (and a new lane start) while lane 1 could still
    /// deliver.
    #[test]
    fn a_lane_asked_to_end_carries_its_stream_until_its_loop_ends() {
        let mut running = RunningLanes::default();
        let stream = StreamId([1; 16]);
        let (ender, mut end) = watch::channel(false);
        running.start(1, stream, ender);
        assert_eq!(running.ask_to_end(stream), Some(1));
        assert!(*end.borrow_and_update(), "lane 1 is told to end");
        assert!(running.carries(stream), "still carried while lane 1 drains");
        assert!(!running.ended(1), "an end it was asked for is not news");
        assert!(!running.carries(stream));
        assert_eq!(running.ask_to_end(stream), None);
    }

    /// The old lane of a stream ending after a new lane took the stream on leaves the new
    /// lane running and untold: before, the end was found by its stream, which dropped the new
    /// lane's "end now" (ending it) and told the client the old lane closed on its own.
    #[test]
    fn an_old_lane_ending_leaves_the_lane_that_took_its_stream_running() {
        let mut running = RunningLanes::default();
        let stream = StreamId([2; 16]);
        let (old, _old_end) = watch::channel(false);
        running.start(1, stream, old);
        running.ask_to_end(stream);
        let (new, new_end) = watch::channel(false);
        running.start(2, stream, new);
        assert!(!running.ended(1));
        assert_eq!(
            new_end.has_changed().ok(),
            Some(false),
            "lane 2's end now is neither sent nor dropped"
        );
        assert!(running.carries(stream));
    }

    /// Only a lane nobody asked to end is told of; the session's end asks them all.
    #[test]
    fn a_lane_that_ends_unasked_is_news_and_the_session_end_asks_every_lane() {
        let mut running = RunningLanes::default();
        let (a, mut a_end) = watch::channel(false);
        let (b, mut b_end) = watch::channel(false);
        running.start(1, StreamId([3; 16]), a);
        running.start(2, StreamId([4; 16]), b);
        assert!(running.ended(1), "lane 1 ended unasked");
        assert!(!running.ended(1), "told once");
        running.ask_all();
        assert!(!*a_end.borrow_and_update(), "an ended lane is not asked");
        assert!(*b_end.borrow_and_update());
        assert!(!running.ended(2));
        assert!(!running.ended(7), "an unknown lane is not news");
    }
}
