//! One admitted client's session, steps 3–6 of the
//! [handshake](crate::handshake) and after: RDMA setup and confirmation,
//! then what the client sends, acknowledged, until it leaves, goes idle,
//! outlives its lifetime or the server stops.
//!
//! Every wait on the client is bounded ([`send_within`]) and loses to
//! shutdown, so a peer that stops reading cannot keep its task. Arrivals go
//! to the application's [`Handler`](super::Handler), or to the log
//! ([`log_arrival`], rate-limited) when there is none.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::accept::Outcome;
use super::admission::{Admitted, EarlyStart};
use super::handler::{Delivery, Peer};
use super::lanes::{LaneContext, LaneEnd, Refused, RunningLanes};
use super::render::{preview, render};
use super::watch::CertEnd;
use super::{ServerChannel, Shared};
use crate::clock::Coarse;
use crate::datapath::StreamId;
use crate::datapath::{AbortReason, Ack, AckStatus, Op};
use crate::handshake::{RejectReason, Resume};
use crate::lanes::SessionRequest;
use futures_util::stream::{FuturesUnordered, StreamExt};

/// What a client that listed [`crate::lanes::LANE_CLOSED`] hears of a lane that ended on its
/// own.
fn lane_closed_notice(end: &LaneEnd) -> Message {
    Message::LaneClosed {
        lane: end.lane,
        reason: end.reason.clone(),
    }
}

/// One lane's loop ([`LaneContext::serve`]), run beside its session's.
type LaneLoop<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = LaneEnd> + Send + 'a>>;

/// Takes the stream a lane request names from the server's stream registry: a resumed one is
/// answered from what the registry knows (its holder, a lane of an earlier session, ended and
/// drained first); a fresh one must be new. `lane0` is this session's first stream; `carried`:
/// a running lane of this session still carries the stream.
async fn claim_lane(
    req: &crate::lanes::LaneRequest,
    lane0: StreamId,
    carried: bool,
    streams: &Arc<super::streams::Streams>,
    identity: &str,
    wait: Duration,
) -> Result<super::streams::StreamLease, String> {
    if req.stream == lane0 {
        return Err("a lane names its session's first stream: draw a new one".into());
    }
    if carried {
        return Err("the lane's stream is still carried by another lane of this session".into());
    }
    match req.resume {
        Some(hello) => streams.claim(identity, hello, wait).await,
        None => streams.claim_fresh(identity, req.stream),
    }
    .map_err(|e| e.to_string())
}
use crate::events::DataPathCause;
use crate::handshake::{HandshakeError, Message};
use crate::metrics::{HandshakeOutcome, KeyDirection, ServerMetrics, TimedVerb};
use crate::ratelimit::LogLimiter;
use crate::server::handler::HandlerError;
use crate::session::{OpenWritesError, Session, SessionAdmission, SessionConfig, SessionError};
use crate::setup_watch::SetupChange;

/// The write region a client asks for before its first WRITE ([`Message::WriteOpen`]):
/// admitted against its tenant's quota (once: `admitted` keeps it for the session), then
/// registered and bound to the session's QP. The answer the client hears, a grant or why not;
/// an error only when the session cannot go on (the window's bind failed on its QP).
async fn grant_writes(
    session: &mut Session,
    cfg: &SessionConfig,
    tenant: Option<&crate::quota::TenantQuota>,
    admitted: &mut Option<SessionAdmission>,
    identity: &str,
    metrics: &ServerMetrics,
) -> Result<Message, SessionError> {
    let unmade = session.wiring().local.buffer.is_none();
    if let (true, None, Some(tenant)) = (unmade, admitted.as_ref(), tenant) {
        match cfg.admit_writes(tenant) {
            Ok(a) => *admitted = Some(a),
            Err(refusal) => {
                tracing::warn!(client = %identity, "INTERCEPTED: {refusal}");
                metrics.write_region("quota");
                return Ok(Message::WriteReject {
                    reason: RejectReason::Quota {
                        detail: refusal.to_string(),
                    },
                });
            }
        }
    }
    match session.open_writes().await {
        Ok(buffer) => {
            // rkeys and addresses help an attacker aim (ReDMArk): debug only.
            tracing::debug!(client = %identity, rkey = buffer.rkey, len = buffer.len, "write region granted");
            metrics.write_region("granted");
            Ok(Message::WriteGrant { buffer })
        }
        Err(OpenWritesError::Refused(e)) => {
            tracing::warn!(client = %identity, error = %e, "no write region for the client; its session goes on");
            metrics.write_region("unavailable");
            // Nothing was made: nothing stays counted.
            if unmade {
                *admitted = None;
            }
            Ok(Message::WriteReject {
                reason: RejectReason::Unavailable {
                    detail: e.to_string(),
                },
            })
        }
        Err(OpenWritesError::Lost(e)) => Err(e),
    }
}

/// Steps 3–6: RDMA setup and confirmation, then the client's operations
/// until it leaves, goes idle or the server stops; then everything the
/// client held is freed, RDMA resources first.
pub(super) async fn serve_session(
    admitted: Box<Admitted>,
    peer: SocketAddr,
    shared: &Shared,
    mut stop: watch::Receiver<bool>,
    accepted: Instant,
) -> Outcome {
    let cfg = &shared.config;
    let metrics = &shared.metrics;
    let Admitted {
        mut chan,
        identity,
        device,
        sgid,
        secrets,
        session_cfg,
        rdma_acks,
        held,
        mut stream,
        lanes,
        lane_closed,
        cipher,
        rekey,
        early,
    } = super::unbox(admitted);
    // A goodbye or an abort is a courtesy: never worth more than a short wait on a peer that
    // stopped reading.
    let courtesy = cfg.limits.write_timeout.min(Duration::from_secs(2));
    // The session ends when its client's certificate is revoked or expires: registered before
    // any RDMA resource exists, so a certificate revoked since its (possibly resumed) TLS
    // handshake, or expired, is refused here.
    let Some(cert) = chan
        .get_ref()
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .cloned()
    else {
        tracing::warn!("no client certificate on an admitted connection; refused");
        metrics.handshake(HandshakeOutcome::TlsFailed);
        return Outcome::Failed;
    };
    let mut live = shared.tls.register(&cert);
    if let Some(end) = live.already_ended() {
        let (reason, _) = cert_end(end, metrics);
        tracing::warn!(client = %identity, %reason, "refused: the client's certificate no longer admits it");
        metrics.handshake(HandshakeOutcome::TlsFailed);
        // Dropped before the await, not after it: held across it, the keys (1,376 bytes)
        // would size this future for every session.
        drop(secrets);
        let _ = send_within(&mut chan, &Message::Abort { reason }, courtesy).await;
        return Outcome::Failed;
    }
    let (prepared, path) = shared.prepare(&device, &sgid, secrets, session_cfg);
    metrics.rdma_setup(path, shared.warm.stats().ready);
    // Boxed, as are the lane's opening and the drain below: this task's future is as large as
    // its largest step, and it is held for the whole session. The setup alone was 16 KiB,
    // more than all an idle session keeps; a step taken once should not be paid for by every
    // session a server holds.
    // The session itself is boxed too: the timeout's result lives through the match's arms
    // (their awaits), so a session held inline had two slots of its size in this future, the
    // result's and the local's (1,952 bytes each).
    let early_setup = early.is_some();
    let setup = Box::pin(async {
        match early {
            // The client's QP came with its hello: ours goes to RTR toward it before the
            // accept (with our endpoint) leaves, and the tokens follow over RDMA alone.
            Some(early) => {
                let EarlyStart { remote, mut accept } = *early;
                let prepared = prepared?;
                if let Message::Accept { endpoint, .. } = &mut accept {
                    *endpoint = Some(prepared.local());
                }
                Session::establish_early_server(&mut chan, prepared, remote, &accept).await
            }
            None => Session::establish_prepared(&mut chan, prepared?).await,
        }
        .map(Box::new)
    });
    let mut session = match tokio::time::timeout(cfg.handshake_timeout, setup).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(client = %identity, error = %e, early = early_setup, "RDMA setup failed; resources freed");
            metrics.handshake(HandshakeOutcome::Failed);
            // The client waits for our endpoint or confirmation: tell it why none comes,
            // rather than close the connection on it (bounded: it may have gone).
            let abort = Message::Abort {
                reason: AbortReason::RdmaSetup {
                    detail: e.to_string(),
                },
            };
            let _ = send_within(&mut chan, &abort, courtesy).await;
            return Outcome::Failed;
        }
        Err(_) => {
            tracing::warn!(client = %identity, early = early_setup, "RDMA setup timed out; resources freed");
            metrics.handshake(HandshakeOutcome::TimedOut);
            return Outcome::Failed;
        }
    };
    let timing = session.timing();
    metrics.verb(device.name(), TimedVerb::QpSetup, timing.setup);
    match metrics.setup_finished(timing.setup, cfg.setup_watch) {
        Some(SetupChange::Slowed { median, baseline }) => tracing::warn!(
            median_ms = median.as_secs_f64() * 1e3,
            baseline_ms = baseline.as_secs_f64() * 1e3,
            sessions = cfg.setup_watch.window,
            "RDMA setup slowed: the median of the last sessions is {:.1}x the calm median; another tenant may be flooding the RDMA control path (the host's monitor names noisy tenants)",
            median.as_secs_f64() / baseline.as_secs_f64().max(1e-9)
        ),
        Some(SetupChange::Recovered { median, baseline }) => tracing::info!(
            median_ms = median.as_secs_f64() * 1e3,
            baseline_ms = baseline.as_secs_f64() * 1e3,
            "RDMA setup back to normal speed"
        ),
        _ => {}
    }
    metrics.verb(device.name(), TimedVerb::QpConfirm, timing.confirmation);
    metrics.established(accepted.elapsed());
    // Counted until the session's resources are freed, below.
    let active = metrics.session_started(device.name());
    let traffic = metrics.session(&identity, device.name());
    let w = *session.wiring();
    // QPNs, rkeys and addresses help an attacker aim (ReDMArk): debug only.
    tracing::debug!(
        client = %identity,
        qpn = %w.local.qpn,
        peer_qpn = %w.remote.qpn,
        rkey = w.local.buffer.map(|b| b.rkey),
        "RDMA wiring"
    );
    tracing::info!(
        client = %identity,
        device = device.name(),
        gid = %w.local.gid,
        peer_gid = %w.remote.gid,
        cipher = session.cipher().map_or("none", |c| c.name()),
        active = cfg.max_clients - shared.slots.available_permits(),
        max = cfg.max_clients,
        setup_ms = timing.setup.as_secs_f64() * 1e3,
        // The client's QP came with its hello (handshake::EarlyEndpoint).
        early = early_setup,
        "client connected"
    );

    session.set_poll(cfg.poll);
    let limits = cfg.limits;
    let lifetime = tokio::time::sleep(limits.max_session_lifetime.unwrap_or(Duration::MAX / 4));
    tokio::pin!(lifetime);
    // At info, a bounded preview of what arrived, at most 20 lines at once and 10 a second per
    // client: one client cannot flood the log (the full content is at debug).
    let mut content_log = LogLimiter::new(20, Duration::from_millis(100));
    let peer = Arc::new(Peer {
        identity: identity.clone(),
        address: peer,
    });
    // Stream sequences: the first operation of this session is the stream's next undelivered.
    let mut seq = stream.first - 1;
    let first = stream.first;
    // Key rotations already counted, per direction: each arrival or post adds what changed.
    let mut rotations = RotationsCounted::default();
    // More lanes the client opens on this session ([`crate::lanes`]): each runs its own loop
    // here, beside lane 0, until `ending` says the session ends.
    let lane_ctx = LaneContext {
        shared,
        identity: &identity,
        peer: Arc::clone(&peer),
        device: Arc::clone(&device),
        sgid,
        // A lane is opened to carry traffic: its write region comes with its endpoint.
        session_cfg: SessionConfig {
            writes_on_demand: false,
            ..session_cfg
        },
        cipher,
        rekey,
        enabled: lanes,
        last_arrival: crate::clock::LatestCoarse::default(),
    };
    // One idle timer for the session, not one per message: each arrival or request notes the
    // coarse time, and the timer, when it fires, either ends an idle session or moves to when
    // it would be idle.
    let mut idle = IdleWatch::new(cfg.idle_timeout);
    let idle_timer = tokio::time::sleep(idle.left().unwrap_or_default());
    tokio::pin!(idle_timer);
    // The running lanes, by number: the session's end ends them all, and a lane that resumes a
    // stream ends the lane that still carries it first.
    let mut running = RunningLanes::default();
    let mut lane_loops: FuturesUnordered<LaneLoop<'_>> = FuturesUnordered::new();
    // Every lane number this session opened, closed ones too: a number names the lane's keys,
    // so it is never opened twice (its sequences would start again under the same keys).
    let mut used_lanes: Vec<u32> = Vec::new();
    let lane0 = metrics.lane_counter(0);
    // The write region's quota count, once the client asks for it (kept until the session's
    // resources are freed, as `held` is).
    let mut writes_admitted: Option<SessionAdmission> = None;
    let reason = loop {
        rotations.count(metrics, &session);
        tokio::select! {
            _ = stream.evicted() => {
                // The client reconnected and resumed this stream: this session ends (and drains)
                // before its new session is answered.
                break "the client resumed its stream on a new connection".to_owned();
            }
            Some(end) = lane_loops.next(), if !lane_loops.is_empty() => {
                idle.touch();
                // One lane ended (it failed, or was not confirmed): the session goes on, and
                // remembers where the lane's stream stands.
                tracing::debug!(client = %identity, lane = end.lane, why = %end.reason, "lane ended; the session goes on");
                // A lane this loop did not ask to end ended on its own (a forgery, its QP
                // failed): a client that understands it hears so now, and resumes the lane's
                // stream at once rather than after its ack timeout.
                let on_its_own = running.ended(end.lane);
                let notice = lane_closed_notice(&end);
                if on_its_own && lane_closed {
                    if let Err(reason) = send_within(&mut chan, &notice, limits.write_timeout).await {
                        break reason;
                    }
                }
            }
            request = chan.expect_session_request() => match request {
                Ok(SessionRequest::Bye) => {
                    let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                    break "client quit".to_owned();
                }
                Ok(SessionRequest::LaneOpen(req)) => {
                    idle.touch();
                    let opening = Instant::now();
                    if req.resume.is_some() {
                        // A lane that still carries the stream ends first, drained, so that
                        // the answer is final (as a resumed session's is).
                        // Another lane that ends on its own meanwhile is told of as the
                        // branch above tells of it, once the wait is over.
                        let mut notices = Vec::new();
                        if let Some(carrier) = running.ask_to_end(req.stream) {
                            let wait = async {
                                while let Some(end) = lane_loops.next().await {
                                    let done = end.lane == carrier;
                                    if running.ended(end.lane) && lane_closed {
                                        notices.push(lane_closed_notice(&end));
                                    }
                                    if done {
                                        break;
                                    }
                                }
                            };
                            let _ = tokio::time::timeout(courtesy * 2, wait).await;
                        }
                        let mut failed = None;
                        for notice in &notices {
                            if let Err(reason) = send_within(&mut chan, notice, limits.write_timeout).await {
                                failed = Some(reason);
                                break;
                            }
                        }
                        if let Some(reason) = failed {
                            break reason;
                        }
                    }
                    // Still carried after the wait (its drain outlived it): refused, not
                    // answered from a stream state that may still move. Otherwise the
                    // registry answers, as it answers a session's first stream, so a lane
                    // resumes its stream in this session or in the next one.
                    let claimed = claim_lane(&req, stream.id(), running.carries(req.stream), &shared.streams, &identity, cfg.handshake_timeout).await;
                    let opened = match claimed {
                        Err(refused) => Err(Refused { reason: RejectReason::Policy { detail: refused }, label: "policy" }),
                        Ok(lease) => {
                            let conn = chan.get_ref().get_ref().1;
                            Box::pin(lane_ctx.open(&req, &used_lanes, lease.first, conn)).await.map(|(u, h)| Box::new((u, h, lease)))
                        }
                    };
                    // Boxed as it comes back: an unconfirmed lane inline was 2 KiB of this
                    // future, held for the whole session although a lane opens only here.
                    let answer = match opened.map(|b| *b) {
                        Ok((unconfirmed, held, lease)) => {
                            let endpoint = unconfirmed.local();
                            used_lanes.push(req.lane);
                            // A fresh lane's stream is new (one claimed before and let go with
                            // nothing answered reads as resumed at 0).
                            let resume = match req.resume {
                                Some(_) => lease.resume.clone(),
                                None => Resume::New,
                            };
                            let (ender, end) = watch::channel(false);
                            running.start(req.lane, req.stream, ender);
                            lane_loops.push(Box::pin(lane_ctx.serve(req.lane, lease, Box::new(unconfirmed), held, end)));
                            metrics.verb(device.name(), TimedVerb::QpSetup, opening.elapsed());
                            Message::LaneAccept { lane: req.lane, endpoint, resume }
                        }
                        Err(refused) => {
                            metrics.lane_refused(refused.label);
                            tracing::warn!(client = %identity, lane = req.lane, reason = %refused.reason, "lane refused; the session goes on");
                            Message::LaneReject { lane: req.lane, reason: refused.reason }
                        }
                    };
                    if let Err(reason) = send_within(&mut chan, &answer, limits.write_timeout).await {
                        break reason;
                    }
                }
                Ok(SessionRequest::WriteOpen) => {
                    idle.touch();
                    let answer = match Box::pin(grant_writes(&mut session, &session_cfg, held.tenant(), &mut writes_admitted, &identity, metrics)).await {
                        Ok(answer) => answer,
                        Err(e) => break datapath_failure(metrics, &identity, &e),
                    };
                    if let Err(reason) = send_within(&mut chan, &answer, limits.write_timeout).await {
                        break reason;
                    }
                }
                Err(e @ HandshakeError::Unexpected { .. }) => break e.to_string(),
                Err(e) => break format!("disconnected: {e}"),
            },
            arrival = session.arrival() => {
                let arrival = match arrival {
                    Ok(a) => a,
                    Err(SessionError::Auth(e)) => {
                        // Nothing of the message was delivered. The QP consumed a PSN the
                        // client never sent, so its next message would be dropped as a
                        // duplicate: end the session and tell the client why.
                        metrics.auth_failure(&identity);
                        metrics.datapath_event(DataPathCause::AuthFailure);
                        tracing::warn!(
                            client = %identity,
                            detail = %e,
                            check = e.check(),
                            failures = metrics.auth_failures_total(),
                            "RDMA message failed authentication (forged, replayed or corrupted); tearing the session down"
                        );
                        metrics.auth_failure_check(e.check());
                        let abort = Message::Abort { reason: AbortReason::AuthenticationFailed };
                        let _ = send_within(&mut chan, &abort, courtesy).await;
                        break "RDMA message failed authentication".to_owned();
                    }
                    Err(e) => break datapath_failure(metrics, &identity, &e),
                };
                idle.touch();
                seq += 1;
                lane0.inc();
                let op = arrival.op();
                traffic.received(op, arrival.data().len());
                if seq <= stream.sent {
                    metrics.operation_replayed();
                }
                let possibly_delivered = seq <= stream.flagged_through;
                let bytes = u32::try_from(arrival.data().len()).unwrap_or(u32::MAX);
                let mut status = AckStatus::Delivered;
                match &shared.handler {
                    None => log_arrival(&identity, op, seq, possibly_delivered, arrival.data(), &mut content_log),
                    Some(handler) => {
                        // The content is the application's now: only its size is logged.
                        tracing::debug!(client = %identity, seq, bytes, %op, possibly_delivered, "handing the arrival to the application");
                        let delivery = Delivery::new(Arc::clone(&peer), seq, arrival)
                            .in_stream(stream.id(), possibly_delivered);
                        // Acknowledged only once the application has it (a full channel holds
                        // the client back here); shutdown still wins over a handler that waits.
                        let handled = tokio::select! {
                            handled = handler.handle_boxed(delivery) => handled,
                            _ = stop.changed() => {
                                let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                                break "server shutdown".to_owned();
                            }
                            // A client over its credit on a shared receive queue: its flood is
                            // cut now, not when the application catches up.
                            cut = session.cut_off() => break datapath_failure(metrics, &identity, &cut),
                        };
                        match handled {
                            Ok(()) => {}
                            Err(e @ HandlerError::Refused(_)) => {
                                // Answered as refused: the client hears it and does not send it
                                // again, and a resume answers it the same way.
                                tracing::warn!(client = %identity, seq, error = %e, "the application refused an operation; answering it as refused");
                                status = AckStatus::Refused;
                            }
                            Err(e) => {
                                tracing::warn!(client = %identity, seq, error = %e, "the application did not take an arrival; ending the session unacknowledged");
                                let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                                break format!("{e}");
                            }
                        }
                        // The session was busy while the application took its time.
                        idle.touch();
                    }
                }
                let ack = Ack { op, seq, bytes, status };
                // Remembered before the client hears it: a resume after this point answers it
                // from the stream's state instead of taking it again.
                stream.answered(ack);
                if rdma_acks {
                    // The streaming data path: the acknowledgement is the client's credit back,
                    // SENT over RDMA (sealed like a payload). Posted without waiting: the send
                    // slots bound what is in flight.
                    let record = ack.encode();
                    // One post in POST_SEND_SAMPLE is timed: a timing is two precise clock
                    // reads, and the histogram needs a sample of posts, not every one.
                    let posting = (seq % POST_SEND_SAMPLE == 0).then(Instant::now);
                    if let Err(e) = session.post(Op::Send, &record).await {
                        break datapath_failure(metrics, &identity, &e);
                    }
                    if let Some(posting) = posting {
                        traffic.post_send(posting.elapsed());
                    }
                    continue;
                }
                let ack = Message::Ack { op, seq, bytes, status };
                // Bounded, and shutdown wins even while a client that stopped reading blocks
                // the write.
                let sent = tokio::select! {
                    sent = send_within(&mut chan, &ack, limits.write_timeout) => sent,
                    _ = stop.changed() => Err("server shutdown".to_owned()),
                    // A client that does not read its acknowledgements and goes on sending, on
                    // a shared receive queue: cut off there at its credit, and ended now rather
                    // than after the write timeout, while its messages take shared receives.
                    cut = session.cut_off() => Err(datapath_failure(metrics, &identity, &cut)),
                };
                if let Err(reason) = sent {
                    break reason;
                }
            }
            _ = stop.changed() => {
                let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                break "server shutdown".to_owned();
            }
            end = live.ended() => {
                // Revoked by a new CRL, or past its notAfter: the client hears why (and does
                // not retry), then the session is torn down as any other.
                let (reason, why) = cert_end(end, metrics);
                tracing::warn!(client = %identity, %reason, "ending the session: {why}");
                let _ = send_within(&mut chan, &Message::Abort { reason }, courtesy).await;
                break why.to_owned();
            }
            () = &mut idle_timer => {
                // Traffic on the other lanes keeps the session alive as lane 0's does, from
                // the lane's last arrival (each lane notes its time; nothing wakes this loop).
                if let Some(at) = lane_ctx.last_arrival.get() {
                    idle.touched_at(at);
                }
                if let Some(left) = idle.left() {
                    idle_timer.as_mut().reset(tokio::time::Instant::now() + left);
                    continue;
                }
                let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                break format!("idle for {:?}", cfg.idle_timeout);
            }
            _ = &mut lifetime, if limits.max_session_lifetime.is_some() => {
                let max = limits.max_session_lifetime.unwrap_or_default();
                let abort = Message::Abort { reason: AbortReason::Lifetime { seconds: max.as_secs() } };
                let _ = send_within(&mut chan, &abort, courtesy).await;
                break format!("session lifetime {max:?} reached");
            }
        }
    };
    // The other lanes end first, each drained, bounded: they hold nothing lane 0 needs.
    running.ask_all();
    let lanes_closed = async { while lane_loops.next().await.is_some() {} };
    if tokio::time::timeout(courtesy * 2, lanes_closed)
        .await
        .is_err()
    {
        tracing::warn!(client = %identity, "lanes did not close in time; their resources are freed without a drain");
    }
    drop(lane_loops);
    // Rotations of the last iteration (an arrival, then the session ended).
    rotations.count(metrics, &session);
    // Nothing of this session may land after it: its QP goes to ERROR and every work request
    // still posted is consumed before the resources are freed and the stream let go (a resume
    // waiting for this session reads the stream's final state).
    match Box::pin(session.drain(courtesy)).await {
        Ok(d) => {
            if d.discarded > 0 {
                tracing::debug!(client = %identity, discarded = d.discarded, "arrivals not taken before the session ended; the client's resume sends them again")
            }
            // The rkey the client had is dead either way (the window is deallocated); this says
            // whether a local invalidate did it while the QP still ran.
            if let Some(invalidated) = d.window_invalidated {
                tracing::debug!(client = %identity, invalidated, "memory window revoked");
            }
        }
        Err(e) => tracing::warn!(client = %identity, error = %e, "draining the session's QP"),
    }
    drop(active);
    drop(held);
    let stream_id = stream.id();
    drop(stream);
    let _ = tokio::time::timeout(courtesy, chan.close()).await;
    tracing::info!(
        client = %identity,
        %reason,
        stream = %stream_id.short(),
        operations = seq + 1 - first,
        unlogged = content_log.suppressed(),
        "client gone; its PD, CQs, MRs and QP are freed"
    );
    Outcome::Served
}

/// The abort that tells the client why its certificate ended its session, and the reason
/// logged; counted in the metrics.
fn cert_end(end: CertEnd, metrics: &crate::metrics::ServerMetrics) -> (AbortReason, &'static str) {
    let (reason, label, why) = match end {
        CertEnd::Revoked => (
            AbortReason::CertificateRevoked,
            "certificate_revoked",
            "certificate revoked",
        ),
        CertEnd::Expired { not_after } => (
            AbortReason::CertificateExpired { not_after },
            "certificate_expired",
            "certificate expired",
        ),
    };
    metrics.session_ended_by_cert(label);
    (reason, why)
}

/// The key rotations of one QP's session (lane 0's, or another lane's) already added to the
/// server's `secure_rdma_key_rotations_total`: each loop iteration adds what changed since.
#[derive(Debug, Default)]
pub(super) struct RotationsCounted {
    send: u64,
    receive: u64,
}

impl RotationsCounted {
    /// Adds the rotations `session` made since the last call.
    pub(super) fn count(&mut self, metrics: &ServerMetrics, session: &Session) {
        let (send, receive) = session.key_epochs();
        if (send, receive) != (self.send, self.receive) {
            metrics.key_rotated(KeyDirection::Send, send.saturating_sub(self.send));
            metrics.key_rotated(KeyDirection::Receive, receive.saturating_sub(self.receive));
            (self.send, self.receive) = (send, receive);
        }
    }
}

/// The acknowledgements on the streaming path whose post is timed: one in this many
/// (`secure_rdma_verb_duration_seconds{verb="post_send"}`).
pub(super) const POST_SEND_SAMPLE: u64 = 16;

/// Slack on the coarse clock's tick: a session is never ended before its idle timeout has
/// passed, though its last message was stamped up to a tick early.
const IDLE_SLACK: Duration = Duration::from_millis(10);

/// A session's idle timeout, kept without a timer or a precise clock read per message: each
/// arrival or request notes the coarse time ([`Coarse`]), and the session's one timer asks
/// [`IdleWatch::left`] when it fires.
#[derive(Debug)]
pub(super) struct IdleWatch {
    limit: Duration,
    last: Coarse,
}

impl IdleWatch {
    pub(super) fn new(limit: Duration) -> IdleWatch {
        IdleWatch {
            limit,
            last: Coarse::now(),
        }
    }

    /// Something happened on the session now.
    pub(super) fn touch(&mut self) {
        self.last = Coarse::now();
    }

    /// Something happened on the session at `at` (noted by a lane); an instant before the
    /// last touch changes nothing.
    pub(super) fn touched_at(&mut self, at: Coarse) {
        self.last = self.last.max(at);
    }

    /// How long until the session is idle, `None` once it is (the limit passed since the last
    /// [`IdleWatch::touch`], plus the coarse clock's slack).
    pub(super) fn left(&self) -> Option<Duration> {
        // At most a year at a time: a timer's deadline must be representable.
        const YEAR: Duration = Duration::from_secs(365 * 86_400);
        (self.limit.saturating_add(IDLE_SLACK))
            .checked_sub(self.last.elapsed())
            .filter(|left| !left.is_zero())
            .map(|left| left.min(YEAR))
    }
}

/// Counts a failure of the session's data path by its cause, logs it (a WARN that says "likely
/// attack" when a well-behaved peer on a working network never causes it) and returns the
/// session's end reason, which names the cause.
pub(super) fn datapath_failure(
    metrics: &ServerMetrics,
    identity: &str,
    e: &SessionError,
) -> String {
    let cause = DataPathCause::of(e);
    metrics.datapath_event(cause);
    if cause.likely_attack() {
        tracing::warn!(
            client = %identity,
            cause = cause.label(),
            error = %e,
            "likely attack on the RDMA data path ({cause}); tearing the session down"
        );
    } else {
        tracing::warn!(
            client = %identity,
            cause = cause.label(),
            error = %e,
            "the RDMA data path failed ({cause}); tearing the session down"
        );
    }
    format!("{cause}: {e}")
}

/// Writes one message to a client, or says why it could not within `limit`.
pub(super) async fn send_within(
    chan: &mut ServerChannel,
    msg: &Message,
    limit: Duration,
) -> Result<(), String> {
    // A write the socket takes at once (nearly all of them) reads no clock.
    match crate::clock::within(limit, chan.send(msg)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("disconnected: {e}")),
        Err(_) => Err(format!(
            "the client did not read its TLS socket for {limit:?}; disconnected"
        )),
    }
}

/// Bytes of received content shown at info level.
const PREVIEW_BYTES: usize = 64;

/// Logs one arrival when no handler takes it: the full content at debug, a
/// bounded preview at info while `limit` allows.
pub(super) fn log_arrival(
    identity: &str,
    op: Op,
    seq: u64,
    possibly_delivered: bool,
    data: &[u8],
    limit: &mut LogLimiter,
) {
    let what = match op {
        Op::Send => "SEND received",
        Op::Write => "WRITE landed",
    };
    tracing::debug!(client = %identity, seq, bytes = data.len(), content = %render(data), possibly_delivered, "{what} (full content)");
    if let Some(suppressed) = limit.check() {
        let content = preview(data, PREVIEW_BYTES);
        match op {
            Op::Send => {
                tracing::info!(client = %identity, seq, bytes = data.len(), %content, suppressed, possibly_delivered, "SEND received")
            }
            Op::Write => {
                tracing::info!(client = %identity, seq, bytes = data.len(), %content, suppressed, possibly_delivered, "WRITE landed")
            }
        }
    }
}

#[cfg(test)]
mod idle_tests {
    use super::*;

    /// A session is idle once the limit has passed since its last touch, never before: the
    /// timer that asks is told how long is left, and a touch gives the whole limit back.
    #[test]
    fn a_session_is_idle_only_once_the_limit_has_passed_since_its_last_touch() {
        let limit = Duration::from_millis(60);
        let mut idle = IdleWatch::new(limit);
        let left = idle.left().expect("just made");
        assert!(left > limit && left <= limit + IDLE_SLACK, "{left:?}");
        std::thread::sleep(Duration::from_millis(40));
        let left = idle.left().expect("40 of 60 ms");
        assert!(
            left <= limit + IDLE_SLACK - Duration::from_millis(20),
            "{left:?}"
        );
        idle.touch();
        assert!(idle.left().expect("touched") > limit);
        let touched = std::time::Instant::now();
        while idle.left().is_some() {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            touched.elapsed() >= limit,
            "idle after {:?}",
            touched.elapsed()
        );
        // A lane's arrival counts from when it came, not from when the timer asks, and an
        // older one does not take time back.
        let mut idle = IdleWatch::new(limit);
        let lane = crate::clock::LatestCoarse::default();
        std::thread::sleep(Duration::from_millis(30));
        lane.note_now();
        let noted = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(40));
        idle.touched_at(lane.get().expect("noted"));
        let left = idle.left().expect("40 ms after the lane's arrival");
        let since = noted.elapsed();
        assert!(
            left <= (limit + IDLE_SLACK).saturating_sub(since) + IDLE_SLACK,
            "{left:?} left {since:?} after the lane's arrival"
        );
        let before = idle.left();
        idle.touched_at(crate::clock::Coarse::now().earlier_by(Duration::from_secs(5)));
        assert!(idle.left() <= before, "{:?} {before:?}", idle.left());
        // A limit no timer can hold is waited a year at a time.
        let forever = IdleWatch::new(Duration::MAX);
        assert_eq!(forever.left(), Some(Duration::from_secs(365 * 86_400)));
    }
}

#[cfg(test)]
mod lane_tests {
    use super::*;
    use crate::datapath::{Ack, AckStatus};
    use crate::handshake::StreamHello;
    use crate::lanes::LaneRequest;

    fn request(stream: StreamId, resume: Option<StreamHello>) -> LaneRequest {
        LaneRequest {
            lane: 3,
            stream,
            endpoint: crate::handshake::Endpoint {
                gid: "::ffff:10.77.0.2".parse().unwrap(),
                qpn: crate::psn::Qpn::new(0x42).unwrap(),
                psn: crate::psn::Psn::new(1).unwrap(),
                mtu: crate::verbs::PathMtu::Mtu1024,
                buffer: None,
            },
            resume,
        }
    }

    fn ack(seq: u64) -> Ack {
        Ack {
            op: Op::Send,
            seq,
            bytes: 1,
            status: AckStatus::Delivered,
        }
    }

    const LANE0: StreamId = StreamId([1; 16]);

    /// [`claim_lane`] for a lane of a session whose first stream is [`LANE0`].
    async fn claim(
        streams: &Arc<super::super::streams::Streams>,
        who: &str,
        id: StreamId,
        resume: Option<StreamHello>,
        carried: bool,
    ) -> Result<super::super::streams::StreamLease, String> {
        let wait = Duration::from_secs(1);
        claim_lane(&request(id, resume), LANE0, carried, streams, who, wait).await
    }

    fn registry() -> Arc<super::super::streams::Streams> {
        Arc::new(super::super::streams::Streams::new(Duration::from_secs(
            120,
        )))
    }

    #[tokio::test]
    async fn a_lane_resumes_its_stream_from_what_the_registry_knows() {
        let (streams, id) = (registry(), StreamId([7; 16]));
        let lease = claim(&streams, "alice", id, None, false).await.unwrap();
        assert_eq!((lease.resume.clone(), lease.first), (Resume::New, 1));
        for seq in 1..=5 {
            lease.answered(ack(seq));
        }
        // The lane ends (in this session, or with a lost session).
        drop(lease);
        // The client has answers up to 3 and sent up to 6: #4 and #5 are answered from the
        // registry, #6 goes again from the new lane's first sequence, 6.
        let hello = StreamHello {
            id,
            next: 4,
            sent: 6,
        };
        let lease = claim(&streams, "alice", id, Some(hello), false)
            .await
            .unwrap();
        let Resume::Resumed { delivered, acks } = &lease.resume else {
            panic!("{:?}", lease.resume)
        };
        assert_eq!((*delivered, lease.first), (5, 6));
        assert_eq!(acks.iter().map(|a| a.seq).collect::<Vec<_>>(), [4, 5]);
        drop(lease);
        // Another identity cannot name it.
        let refused = claim(&streams, "mallory", id, Some(hello), false).await;
        assert!(refused
            .err()
            .unwrap_or_default()
            .contains("another identity"));
    }

    #[tokio::test]
    async fn a_fresh_lane_needs_a_fresh_stream_and_a_running_one_is_not_taken_over() {
        let (streams, id) = (registry(), StreamId([8; 16]));
        let lease = claim(&streams, "alice", id, None, false).await.unwrap();
        lease.answered(ack(1));
        drop(lease);
        let refused = claim(&streams, "alice", id, None, false).await;
        assert!(refused.err().unwrap_or_default().contains("already in use"));
        let refused = claim(&streams, "alice", StreamId([9; 16]), None, true).await;
        assert!(refused
            .err()
            .unwrap_or_default()
            .contains("still carried by another lane"));
        // The session's own first stream is not a lane's.
        let refused = claim(&streams, "alice", LANE0, None, false).await;
        assert!(refused.err().unwrap_or_default().contains("first stream"));
        // A stream claimed and let go with nothing answered (a lane refused after its claim)
        // opens fresh again, from 1 (the session loop answers it as new).
        for _ in 0..2 {
            let lease = claim(&streams, "alice", StreamId([10; 16]), None, false).await;
            assert_eq!(lease.map(|l| l.first).ok(), Some(1));
        }
    }
}
