//! The accept loop: [`Server::run`] takes connections until shutdown, one
//! task per connection; each task runs the TLS handshake, then admission,
//! then the session, and ends with an [`Outcome`] that the loop tallies
//! into the run's [`Summary`].
//!
//! The loop itself never waits on a peer: pending limits are checked at
//! accept (a connection over them is closed before TLS), and a failing
//! `accept()` (descriptors exhausted) pauses it with a back-off instead of
//! spinning.
//!
//! Until TLS completes, the peer is anyone who can reach the port: what it
//! makes the server write is bounded. Each failure before TLS (a refusal at
//! accept, a failed or timed-out handshake) is counted in the metrics, but
//! logged only within a budget per source prefix and in all
//! ([`preauth`](super::preauth)); what was held back is summarised every
//! 10 s, one line per prefix.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use super::admission::{admit, refuse_unidentified, Pending};
use super::preauth::{SourcePrefix, SUMMARY_EVERY};
use super::session_loop::serve_session;
use super::{Server, Shared};
use crate::handshake::Channel;
use crate::metrics::{self, HandshakeOutcome, PreAuthFailure};
use crate::ratelimit::LogLimiter;
use crate::tls;

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// Clients that completed the handshake.
    pub served: u64,
    /// Clients refused at admission.
    pub rejected: u64,
}

/// How one connection's task ended.
pub(super) enum Outcome {
    /// A session was established and has ended.
    Served,
    /// Admission refused the client, and told it why.
    Rejected,
    /// The handshake broke, timed out or failed before a session existed.
    Failed,
}

impl Server {
    /// Serves until `shutdown` resolves; then stops accepting, says bye to
    /// every client, frees everything and returns.
    ///
    /// ```no_run
    /// # async fn demo(server: secure_rdma::server::Server) {
    /// // Serve until Ctrl-C; every client's RDMA resources are freed before `run` returns.
    /// let summary = server
    ///     .run(async {
    ///         let _ = tokio::signal::ctrl_c().await;
    ///     })
    ///     .await;
    /// println!("served {} clients, rejected {}", summary.served, summary.rejected);
    /// # }
    /// ```
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) -> Summary {
        let (stop_tx, stop_rx) = watch::channel(false);
        let shared = Arc::new(self.shared);
        // The TLS files are watched apart from accepts: a revocation ends live sessions even
        // when no connection arrives.
        let watcher = tokio::spawn(super::watch::watch(Arc::clone(&shared), stop_rx.clone()));
        let mut tasks = JoinSet::new();
        let mut summary = Summary {
            served: 0,
            rejected: 0,
        };
        tokio::pin!(shutdown);
        // accept() fails with EMFILE/ENFILE while descriptors are exhausted, and fails again at
        // once: without a pause the loop spins and logs millions of lines. Back off (10 ms
        // doubling to 1 s) and rate-limit the warnings.
        const MIN_PAUSE: Duration = Duration::from_millis(10);
        let mut pause_for = MIN_PAUSE;
        let pause = tokio::time::sleep(Duration::ZERO);
        tokio::pin!(pause);
        let mut paused = false;
        let mut accept_log = LogLimiter::new(5, Duration::from_secs(1));
        // What the pre-TLS log bound held back is summarised on a timer, so a flood that stops
        // is still reported.
        let mut pre_auth_summary =
            tokio::time::interval_at(tokio::time::Instant::now() + SUMMARY_EVERY, SUMMARY_EVERY);
        pre_auth_summary.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = &mut pause, if paused => paused = false,
                _ = pre_auth_summary.tick() => shared.summarise_pre_auth(),
                accepted = self.listener.accept(), if !paused => match accepted {
                    Ok((conn, peer)) => {
                        pause_for = MIN_PAUSE;
                        match Pending::take(&shared, peer.ip()) {
                            Ok(pending) => {
                                let shared = Arc::clone(&shared);
                                let stop = stop_rx.clone();
                                tasks.spawn(serve(conn, peer, shared, stop, pending));
                            }
                            Err(why) => {
                                // Closed before TLS: it costs nothing but this descriptor, now freed.
                                drop(conn);
                                shared.metrics.rejected(metrics::PENDING_LIMIT);
                                if let Some(prefix) = shared.pre_auth_failed(peer, why.failure()) {
                                    tracing::warn!(%peer, %prefix, "connection closed at accept: {why}");
                                }
                            }
                        }
                    }
                    Err(e) => {
                        if let Some(suppressed) = accept_log.check() {
                            tracing::warn!(error = %e, suppressed, retry_in_ms = pause_for.as_millis() as u64, "accept failed; pausing accepts");
                        }
                        pause.as_mut().reset(tokio::time::Instant::now() + pause_for);
                        paused = true;
                        pause_for = (pause_for * 2).min(Duration::from_secs(1));
                    }
                },
                Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                    tally(&mut summary, done);
                }
            }
        }
        tracing::info!(clients = tasks.len(), "shutting down: closing clients");
        let _ = stop_tx.send(true);
        let _ = watcher.await;
        while let Some(done) = tasks.join_next().await {
            tally(&mut summary, done);
        }
        tracing::info!(
            served = summary.served,
            rejected = summary.rejected,
            "server stopped; every client resource freed"
        );
        summary
    }
}

fn tally(summary: &mut Summary, done: Result<Outcome, tokio::task::JoinError>) {
    match done {
        Ok(Outcome::Served) => summary.served += 1,
        Ok(Outcome::Rejected) => summary.rejected += 1,
        Ok(Outcome::Failed) => {}
        Err(e) => tracing::error!(error = %e, "client task panicked"),
    }
}

/// One connection's task: the TLS handshake, then admission, then the session.
async fn serve(
    conn: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
    pending: Pending,
) -> Outcome {
    let cfg = &shared.config;
    // The handshake's duration counts from here: TLS, admission and RDMA setup.
    let accepted = Instant::now();
    let failed = |outcome: HandshakeOutcome| {
        shared.metrics.handshake(outcome);
        Outcome::Failed
    };
    let local_ip = match conn.local_addr() {
        Ok(a) => a.ip(),
        Err(e) => {
            if let Some(prefix) = shared.pre_auth_failed(peer, PreAuthFailure::ConnectionLost) {
                tracing::warn!(%peer, %prefix, error = %e, "connection lost before TLS");
            }
            return failed(HandshakeOutcome::Failed);
        }
    };
    // This task's future is held for the whole session, and sized by its largest step: the
    // steps taken once (TLS, admission, RDMA setup) are boxed or scoped so that their state is
    // freed, not carried, while the session is served. A value moved out of a local or a
    // parameter keeps its place in the future, so what is carried across the session's awaits
    // is boxed (the channel, the admission).
    let session = {
        let _ = conn.set_nodelay(true);
        let acceptor = shared.tls.current(&shared.metrics);
        let tls = match tokio::time::timeout(cfg.handshake_timeout, acceptor.accept(conn)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                if let Some(prefix) = shared.pre_auth_failed(peer, PreAuthFailure::TlsFailed) {
                    tracing::warn!(%peer, %prefix, error = %e, "TLS handshake failed: client refused");
                }
                return failed(HandshakeOutcome::TlsFailed);
            }
            Err(_) => {
                if let Some(prefix) = shared.pre_auth_failed(peer, PreAuthFailure::TimedOut) {
                    tracing::warn!(%peer, %prefix, "TLS handshake timed out");
                }
                return failed(HandshakeOutcome::TimedOut);
            }
        };
        let conn_state = &tls.get_ref().1;
        let identity = match tls::client_identity_from(conn_state, cfg.identity).and_then(|id| {
            tls::check_trust_domain(&id, &cfg.spiffe_trust_domains)?;
            Ok(id)
        }) {
            Ok(id) => id,
            Err(e) => {
                // The certificate verified, so the client is told why it is refused.
                let span = tracing::info_span!(parent: None, "client", %peer);
                return refuse_unidentified(Channel::new(tls), e, &shared)
                    .instrument(span)
                    .await;
            }
        };
        let chan = Box::new(Channel::new(tls));
        // Whether the TLS handshake resumed an earlier session rides on every line of the
        // connection's log: a resumed session was authenticated by the certificate checked then.
        let tls = match chan.get_ref().get_ref().1.handshake_kind() {
            Some(rustls::HandshakeKind::Resumed) => "resumed",
            _ => "full",
        };
        // An explicit root: a connection's span must never nest under whatever
        // span happens to be current on the accepting thread.
        let span = tracing::info_span!(parent: None, "client", id = %identity, %peer, tls);
        async move {
            // Admission boxed, and its outcome too (see above): a step taken once, whose
            // state is not to be carried across the session.
            let admitted = {
                let admitted = Box::pin(admit(
                    super::unbox(chan),
                    identity,
                    local_ip,
                    peer.ip(),
                    &shared,
                    &stop,
                ))
                .await;
                // Admitted or not, this connection is no longer pending.
                drop(pending);
                match admitted {
                    Ok(admitted) => Box::new(admitted),
                    Err(outcome) => return outcome,
                }
            };
            serve_session(admitted, peer, &shared, stop, accepted).await
        }
        .instrument(span)
    };
    session.await
}

impl Shared {
    /// Counts a failure before TLS from `peer`; `Some(its prefix)` when it may also be logged
    /// (within the per-prefix and global budgets), `None` when the line is held back for the
    /// next summary.
    fn pre_auth_failed(&self, peer: SocketAddr, failure: PreAuthFailure) -> Option<SourcePrefix> {
        self.metrics.pre_auth_failure(failure);
        let prefix = SourcePrefix::of(peer.ip(), self.config.limits.pending_prefix);
        let pass = self
            .pre_auth_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check(prefix, Instant::now());
        if !pass {
            self.metrics.pre_auth_log_suppressed();
        }
        pass.then_some(prefix)
    }

    /// Logs what the pre-TLS log bound held back since the last summary: one line per prefix
    /// for the [`SUMMARY_PREFIXES`](super::preauth::SUMMARY_PREFIXES) with the most, one for the rest.
    fn summarise_pre_auth(&self) {
        let held = self
            .pre_auth_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .summary(Instant::now());
        let secs = held.period.as_secs_f64().round() as u64;
        for (prefix, suppressed) in &held.top {
            tracing::warn!(
                %prefix,
                suppressed,
                period_s = secs,
                "{suppressed} more failures before TLS from {prefix} suppressed in the last {secs} s"
            );
        }
        if held.others > 0 {
            tracing::warn!(
                suppressed = held.others,
                prefixes = held.other_prefixes,
                period_s = secs,
                "{} more failures before TLS from {} other prefixes suppressed in the last {secs} s",
                held.others,
                held.other_prefixes
            );
        }
    }
}

#[cfg(test)]
mod tests {
    /// The size of the future an async fn of five parameters returns, without calling it.
    fn future_size<A, B, C, D, E, F>(_: impl Fn(A, B, C, D, E) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// The same, for a method of five parameters.
    fn method_future_size<S, A, B, C, D, E, F>(_: impl Fn(S, A, B, C, D, E) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Each connection's task is one allocation of this future's size, held as long as the
    /// session: at 50,000 held sessions every KiB here is 50 MB of the server's memory. It was
    /// 35 KiB, sized by the RDMA setup's 16 KiB and by copies of the channel and of the
    /// admission that had been moved on, all carried for the whole session; the steps taken
    /// once were then boxed and what is carried boxed once (11,248 bytes). Then the session
    /// itself had two slots of its 1,952 bytes (the setup's result lives through the match's
    /// arms beside the local it is moved to), an unconfirmed lane being opened 2,256 and the
    /// keys 1,376 (held across an early refusal's await): the session and the lane are boxed
    /// and the keys dropped before that await (5,560 bytes, plus the boxed session's 1,952).
    #[test]
    fn a_held_connection_costs_its_task_under_6_kib_and_a_lane_under_8() {
        let serve = future_size(super::serve);
        let session = future_size(super::super::session_loop::serve_session);
        assert!(
            serve <= 6 * 1024,
            "a connection's task future is {serve} bytes (its session loop's: {session})"
        );
        assert!(
            serve < session + 2048,
            "the connection's task carries {} bytes beyond its session loop's {session}: \
             something moved into the session is still held by the task",
            serve - session
        );
        // Each lane's loop is held as long as the lane, boxed in its session's task: 14 KiB
        // before its confirmation and drain were boxed.
        let lane = method_future_size(super::super::lanes::LaneContext::serve);
        assert!(lane <= 8 * 1024, "a lane's loop future is {lane} bytes");
    }
}
