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
use super::admission::Admitted;
use super::handler::{Delivery, Peer};
use super::render::{preview, render};
use super::watch::CertEnd;
use super::{ServerChannel, Shared};
use crate::datapath::{AbortReason, Ack, AckStatus, ClientRequest, Op};
use crate::events::DataPathCause;
use crate::handshake::{HandshakeError, Message};
use crate::metrics::{HandshakeOutcome, KeyDirection, ServerMetrics, TimedVerb};
use crate::ratelimit::LogLimiter;
use crate::server::handler::HandlerError;
use crate::session::{Session, SessionError};
use crate::setup_watch::SetupChange;

/// Steps 3–6: RDMA setup and confirmation, then the client's operations
/// until it leaves, goes idle or the server stops; then everything the
/// client held is freed, RDMA resources first.
pub(super) async fn serve_session(
    admitted: Admitted,
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
    } = admitted;
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
        let _ = send_within(&mut chan, &Message::Abort { reason }, courtesy).await;
        return Outcome::Failed;
    }
    let setup = Session::establish(&mut chan, &device, sgid, secrets, session_cfg);
    let mut session = match tokio::time::timeout(cfg.handshake_timeout, setup).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "RDMA setup failed; resources freed");
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
            tracing::warn!("RDMA setup timed out; resources freed");
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
    let mut epochs_counted = (0u64, 0u64);
    let reason = loop {
        let epochs = session.key_epochs();
        if epochs != epochs_counted {
            metrics.key_rotated(KeyDirection::Send, epochs.0 - epochs_counted.0);
            metrics.key_rotated(KeyDirection::Receive, epochs.1 - epochs_counted.1);
            epochs_counted = epochs;
        }
        tokio::select! {
            _ = stream.evicted() => {
                // The client reconnected and resumed this stream: this session ends (and drains)
                // before its new session is answered.
                break "the client resumed its stream on a new connection".to_owned();
            }
            request = chan.expect_client_request() => match request {
                Ok(ClientRequest::Bye) => {
                    let _ = send_within(&mut chan, &Message::Bye, courtesy).await;
                    break "client quit".to_owned();
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
                seq += 1;
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
                    let posting = Instant::now();
                    if let Err(e) = session.post(Op::Send, &record).await {
                        break datapath_failure(metrics, &identity, &e);
                    }
                    traffic.post_send(posting.elapsed());
                    continue;
                }
                let ack = Message::Ack { op, seq, bytes, status };
                // Bounded, and shutdown wins even while a client that stopped reading blocks
                // the write.
                let sent = tokio::select! {
                    sent = send_within(&mut chan, &ack, limits.write_timeout) => sent,
                    _ = stop.changed() => Err("server shutdown".to_owned()),
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
            _ = tokio::time::sleep(cfg.idle_timeout) => {
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
    // Rotations of the last iteration (an arrival, then the session ended).
    let epochs = session.key_epochs();
    metrics.key_rotated(KeyDirection::Send, epochs.0 - epochs_counted.0);
    metrics.key_rotated(KeyDirection::Receive, epochs.1 - epochs_counted.1);
    // Nothing of this session may land after it: its QP goes to ERROR and every work request
    // still posted is consumed before the resources are freed and the stream let go (a resume
    // waiting for this session reads the stream's final state).
    match session.drain(courtesy).await {
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

/// Counts a failure of the session's data path by its cause, logs it (a WARN that says "likely
/// attack" when a well-behaved peer on a working network never causes it) and returns the
/// session's end reason, which names the cause.
fn datapath_failure(metrics: &ServerMetrics, identity: &str, e: &SessionError) -> String {
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
async fn send_within(
    chan: &mut ServerChannel,
    msg: &Message,
    limit: Duration,
) -> Result<(), String> {
    match tokio::time::timeout(limit, chan.send(msg)).await {
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
fn log_arrival(
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
