//! One session of a client's operation stream: its RDMA session and its TLS
//! control channel, what is posted on it and the acknowledgements it brings
//! back. A [`Client`](super::Client) keeps one link at a time and makes a new
//! one when a session is lost; the link itself knows nothing of streams.

use std::time::Duration;

use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

use super::{tls_or, ClientError};
use crate::datapath::{AbortReason, Ack, Op};
use crate::handshake::{Channel, HandshakeError, Kind, Message};
use crate::lanes::{ClosedLanes, Control};
use crate::session::{Arrival, Session, SessionError};
use crate::verbs::VerbsError;

/// A connected, confirmed session.
pub(crate) struct Link {
    // Drop order: the RDMA session before the TLS channel.
    pub(crate) session: Session,
    /// `Some(window)` on the streaming data path: acknowledgements come over
    /// RDMA and up to `window` operations may await theirs.
    pub(crate) window: Option<usize>,
    /// Operations posted on this link and not yet acknowledged.
    pub(crate) in_flight: usize,
    pub(crate) chan: Channel<TlsStream<TcpStream>>,
    /// Lanes the server said it closed, heard while waiting for something else.
    pub(crate) closed_lanes: ClosedLanes,
    pub(crate) timeout: Duration,
    /// What opening more lanes on this session takes, when the server offers them.
    pub(crate) lanes: Option<LaneSetup>,
}

/// What a lane is made of: the session's device, GID and settings, its cipher and rotation,
/// and the most lanes the server allows the identity.
pub(crate) struct LaneSetup {
    pub(crate) max: u32,
    pub(crate) device: std::sync::Arc<crate::verbs::Device>,
    pub(crate) sgid: crate::verbs::GidEntry,
    pub(crate) session_cfg: crate::session::SessionConfig,
    pub(crate) cipher: Option<crate::protect::Cipher>,
    pub(crate) rekey: crate::protect::RekeyPolicy,
    /// The connector's sources of resources: its shared queues and pools made ahead.
    pub(crate) provision: std::sync::Arc<super::provision::Provision>,
}

impl Link {
    /// Operations this link may have unacknowledged at once.
    pub(crate) fn window(&self) -> usize {
        self.window.unwrap_or(1)
    }

    /// Posts one operation (sealed under this session's keys, with the next
    /// sequence of the stream the keys are bound to). A WRITE first asks for the server's
    /// write region when it grants it on request ([`Link::open_writes`]).
    pub(crate) async fn post(&mut self, op: Op, data: &[u8]) -> Result<(), ClientError> {
        if op == Op::Write {
            self.open_writes().await?;
        }
        self.session
            .post(op, data)
            .await
            .map_err(ClientError::Session)?;
        self.in_flight += 1;
        Ok(())
    }

    /// Asks the server for its write region, when it grants it on request and has not yet
    /// ([`crate::handshake::WRITE_ON_DEMAND`]), and waits for the answer: bounded by the
    /// client's timeout, a refusal [`ClientError::WriteRejected`] (the session goes on). Asked
    /// with nothing awaiting a TLS acknowledgement: the answer is the next message over TLS
    /// but for a lane the server closes, which is remembered.
    pub(crate) async fn open_writes(&mut self) -> Result<(), ClientError> {
        if !self.session.needs_write_grant() {
            return Ok(());
        }
        self.chan.send(&Message::WriteOpen).await.map_err(tls_or)?;
        let answer = tokio::time::timeout(
            self.timeout,
            self.chan.expect_write_answer(&mut self.closed_lanes),
        )
        .await
        .map_err(|_| {
            ClientError::Session(SessionError::Timeout(
                self.timeout,
                "the server's write region",
            ))
        })?
        .map_err(tls_or)?;
        match answer {
            Ok(buffer) => {
                self.session.granted_writes(buffer);
                Ok(())
            }
            Err(reason) => Err(ClientError::WriteRejected(reason)),
        }
    }

    /// Waits for the next acknowledgement: over TLS, or over RDMA on the
    /// streaming data path, where the server may meanwhile end the session
    /// over TLS (an abort says why). Bounded by the client's timeout.
    pub(crate) async fn next_ack(&mut self) -> Result<Ack, ClientError> {
        let wait = async {
            if self.window.is_none() {
                return self.chan.expect_ack().await.map_err(tls_or);
            }
            tokio::select! {
                arrival = self.session.arrival() => match arrival {
                    Ok(Arrival::Send(record)) => Ack::decode(&record).ok_or(ClientError::Session(
                        SessionError::BadAck { len: record.len() },
                    )),
                    Ok(Arrival::Write(_)) => Err(ClientError::Session(SessionError::Verbs(
                        VerbsError::UnexpectedCompletion(crate::verbs::WcOpcode::RecvRdmaWithImm),
                    ))),
                    Err(e) => Err(ClientError::Session(e)),
                },
                closed = closed_or_lane(&mut self.chan, &mut self.closed_lanes) => Err(session_ended(closed)),
            }
        };
        // Bounded from the first poll that did not find it: an acknowledgement a busy poll
        // finds at once costs no clock read.
        let ack = crate::clock::within(self.timeout, wait)
            .await
            .map_err(|_| {
                ClientError::Session(SessionError::Timeout(
                    self.timeout,
                    "the server's acknowledgement",
                ))
            })??;
        self.in_flight = self.in_flight.saturating_sub(1);
        Ok(ack)
    }

    /// Waits until every posted operation has completed on the RDMA side (a
    /// failed one is named by its own completion).
    pub(crate) async fn complete(&mut self) -> Result<(), ClientError> {
        self.session.flush().await.map_err(ClientError::Session)
    }

    /// Waits until the server ends the session on its own (see
    /// [`Client::closed`](super::Client::closed)).
    pub(crate) async fn closed(&mut self) -> Result<Option<AbortReason>, HandshakeError> {
        closed_or_lane(&mut self.chan, &mut self.closed_lanes).await
    }

    /// Says bye, waits briefly for the server's bye, and frees everything.
    pub(crate) async fn quit(mut self) {
        if self.chan.send(&Message::Bye).await.is_ok() {
            let _ = tokio::time::timeout(self.timeout, self.chan.recv::<Message>()).await;
        }
        self.chan.close().await;
    }
}

/// Waits for the session's end over TLS; a lane the server closed meanwhile is remembered in
/// `closed` for that lane's next use, and the wait goes on. Cancel-safe.
pub(crate) async fn closed_or_lane(
    chan: &mut Channel<TlsStream<TcpStream>>,
    closed: &mut ClosedLanes,
) -> Result<Option<AbortReason>, HandshakeError> {
    loop {
        match chan.expect_control().await? {
            Control::Closed(reason) => return Ok(reason),
            Control::LaneClosed { lane, reason } => closed.record(lane, reason),
        }
    }
}

/// The error of a session that ended over TLS while an acknowledgement was awaited: the
/// server's abort with its reason, a bye where an acknowledgement was due, or the broken
/// connection's error.
pub(crate) fn session_ended(closed: Result<Option<AbortReason>, HandshakeError>) -> ClientError {
    tls_or(match closed {
        Ok(Some(reason)) => HandshakeError::Aborted(reason),
        Ok(None) => HandshakeError::Unexpected {
            expected: Kind::Ack,
            got: Kind::Bye,
        },
        Err(e) => e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_that_ends_during_a_wait_keeps_the_servers_reason() {
        // A revoked certificate heard while a lane's acknowledgement was awaited stays a
        // revocation: nothing retries it, and the caller can say why.
        let revoked = session_ended(Ok(Some(AbortReason::CertificateRevoked)));
        assert_eq!(
            revoked.certificate_ended(),
            Some(&AbortReason::CertificateRevoked)
        );
        assert!(!matches!(revoked, ClientError::LaneLost { .. }));
        // A forgery's abort is the session's loss, which a reconnect may mend.
        let forged = session_ended(Ok(Some(AbortReason::AuthenticationFailed)));
        assert!(forged.certificate_ended().is_none());
        assert!(forged.is_session_lost(), "{forged}");
        let bye = session_ended(Ok(None));
        assert!(bye.to_string().contains("expected ack, got bye"), "{bye}");
        assert!(session_ended(Err(HandshakeError::Closed)).is_session_lost());
    }
}
