//! Data-path events by cause: why an established session's RDMA path failed,
//! so an attack that is not an AEAD failure is still seen and counted.
//!
//! A peer (or an on-path attacker with the session's QPN and PSN) can make
//! the responder refuse a request: an RDMA READ of a QP that grants none, a
//! WRITE with an rkey or address this session did not grant (a previous
//! session's, a guessed one), an operation out of sequence. rxe answers such a
//! request with a NAK and moves the QP to ERROR; what the server's completion
//! queues then show depends on whether the request consumed a receive:
//!
//! | what arrived | the responder's completion | [`DataPathCause`] |
//! |---|---|---|
//! | a WRITE WITH IMMEDIATE outside the granted rkey/range | the receive completes with *remote access error* | `remote_access_error` |
//! | an operation the QP does not allow, consuming a receive | *remote invalid request* | `remote_invalid_request` |
//! | an RDMA READ, or a plain WRITE, that is refused (no receive consumed) | none of its own: every posted receive is *flushed* | `request_refused` |
//! | a SEND longer than a receive slot, a WRITE length beyond a slot | *local length error*, or the length check | `length_error` |
//! | a completion of an operation the receive queue never expects | | `unexpected_opcode` |
//! | a sealed message that fails its check | | `auth_failure` |
//! | more messages than the receives it was given, on a shared receive queue | | `over_credit` |
//!
//! And on this side's own sends: *transport retry counter exceeded* (the peer
//! stopped acknowledging: gone, or its QP stopped), *RNR retry exceeded*, and
//! a peer's NAK of them (*remote access error*, *remote invalid request*).
//!
//! A plain RDMA WRITE *inside* the granted slots with the session's own rkey
//! is not refused by the device and raises no completion: it is not an event
//! here. What it can do is bounded by the protocol: the slot's next message
//! is verified when its WRITE WITH IMMEDIATE lands, so altered bytes fail as
//! `auth_failure` and are never delivered; and the PSN the forged WRITE took
//! makes the client's next packet a duplicate, which the client notices as a
//! missing acknowledgement (it resumes on a new session, exactly once).

use crate::session::SessionError;
use crate::shared_queue::InboxError;
use crate::verbs::{VerbsError, WcStatus};

/// Why a session's data path failed (the `cause` label of
/// `secure_rdma_datapath_events_total`).
///
/// ```
/// use secure_rdma::events::DataPathCause;
/// use secure_rdma::verbs::{VerbsError, WcOpcode, WcStatus};
///
/// let e = VerbsError::WorkCompletion {
///     wr_id: 3,
///     opcode: WcOpcode::RecvRdmaWithImm,
///     status: WcStatus(10),
/// };
/// let cause = DataPathCause::of(&e.into());
/// assert_eq!(cause.label(), "remote_access_error");
/// assert!(cause.likely_attack());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DataPathCause {
    /// A sealed message failed verification (forged, replayed or corrupted).
    AuthFailure,
    /// A request named an rkey or address this session did not grant, or a
    /// peer refused ours for that reason.
    RemoteAccessError,
    /// A request the QP does not allow (an RDMA READ or atomic on a QP that
    /// grants only writes), reported by a completion.
    RemoteInvalidRequest,
    /// The QP stopped on its own, flushing every posted receive, without a
    /// completion that names the request: the responder refused a request
    /// that consumes no receive (an RDMA READ, a plain WRITE outside what was
    /// granted) and NAKed it.
    RequestRefused,
    /// A message longer than the slot it arrived in.
    LengthError,
    /// A completion of an operation that never belongs on that queue (or
    /// an unexpected response opcode to one of our requests).
    UnexpectedOpcode,
    /// Our request was retried until the retry count ran out: the peer
    /// stopped acknowledging.
    RetryExceeded,
    /// The peer had no receive posted for our message, retried until the
    /// RNR retry count ran out.
    RnrRetryExceeded,
    /// On a shared receive queue, the peer sent more messages than the receive slots it was
    /// given without waiting for their acknowledgements, and its queue pair was cut off
    /// ([`crate::shared_queue`]).
    OverCredit,
    /// Anything else (a completion that timed out, a local verbs error).
    Other,
}

impl DataPathCause {
    /// Every cause, in the order the metrics list them.
    pub const ALL: [DataPathCause; 10] = [
        DataPathCause::AuthFailure,
        DataPathCause::RemoteAccessError,
        DataPathCause::RemoteInvalidRequest,
        DataPathCause::RequestRefused,
        DataPathCause::LengthError,
        DataPathCause::UnexpectedOpcode,
        DataPathCause::RetryExceeded,
        DataPathCause::RnrRetryExceeded,
        DataPathCause::OverCredit,
        DataPathCause::Other,
    ];

    /// Its label value.
    pub fn label(self) -> &'static str {
        match self {
            DataPathCause::AuthFailure => "auth_failure",
            DataPathCause::RemoteAccessError => "remote_access_error",
            DataPathCause::RemoteInvalidRequest => "remote_invalid_request",
            DataPathCause::RequestRefused => "request_refused",
            DataPathCause::LengthError => "length_error",
            DataPathCause::UnexpectedOpcode => "unexpected_opcode",
            DataPathCause::RetryExceeded => "retry_exceeded",
            DataPathCause::RnrRetryExceeded => "rnr_retry_exceeded",
            DataPathCause::OverCredit => "over_credit",
            DataPathCause::Other => "other",
        }
    }

    /// What it means, in the words a session's end reason uses.
    pub fn explain(self) -> &'static str {
        match self {
            DataPathCause::AuthFailure => {
                "authentication failure: an RDMA message was forged, replayed or corrupted"
            }
            DataPathCause::RemoteAccessError => {
                "remote access error: a peer used an rkey or address this session did not grant"
            }
            DataPathCause::RemoteInvalidRequest => {
                "remote invalid request: a peer asked for an operation this session does not allow"
            }
            DataPathCause::RequestRefused => {
                "request refused: the QP stopped on an incoming request it refused (an RDMA READ, \
                 or a WRITE outside what this session granted)"
            }
            DataPathCause::LengthError => {
                "length error: a message longer than the slot it arrived in"
            }
            DataPathCause::UnexpectedOpcode => {
                "unexpected opcode: a completion of an operation this session never expects"
            }
            DataPathCause::RetryExceeded => {
                "retry exceeded: the peer stopped acknowledging (gone, or its QP stopped)"
            }
            DataPathCause::RnrRetryExceeded => {
                "RNR retry exceeded: the peer posted no receive for our messages"
            }
            DataPathCause::OverCredit => {
                "over credit: the peer sent more messages than the receives it was given, \
                 without waiting for their acknowledgements"
            }
            DataPathCause::Other => "RDMA error",
        }
    }

    /// True when a well-behaved peer on a working network never causes it:
    /// the server's log calls it a likely attack.
    pub fn likely_attack(self) -> bool {
        matches!(
            self,
            DataPathCause::AuthFailure
                | DataPathCause::RemoteAccessError
                | DataPathCause::RemoteInvalidRequest
                | DataPathCause::RequestRefused
                | DataPathCause::LengthError
                | DataPathCause::UnexpectedOpcode
                | DataPathCause::OverCredit
        )
    }

    /// The cause of a work completion's error status.
    ///
    /// A flushed receive (`IBV_WC_WR_FLUSH_ERR`) is [`DataPathCause::RequestRefused`]: only
    /// meaningful while the session itself has not moved its QP to ERROR (the server drains
    /// its QP only after the session's loop ended, so a flush seen in the loop is the
    /// device's doing).
    pub fn of_status(status: WcStatus) -> DataPathCause {
        match status.0 {
            // IBV_WC_LOC_LEN_ERR
            1 => DataPathCause::LengthError,
            // IBV_WC_WR_FLUSH_ERR
            5 => DataPathCause::RequestRefused,
            // IBV_WC_BAD_RESP_ERR: a response opcode that answers none of our requests.
            7 => DataPathCause::UnexpectedOpcode,
            // IBV_WC_LOC_ACCESS_ERR: on a responder, an incoming WRITE WITH IMMEDIATE hit
            // memory it may not; IBV_WC_REM_ACCESS_ERR.
            8 | 10 => DataPathCause::RemoteAccessError,
            // IBV_WC_REM_INV_REQ_ERR
            9 => DataPathCause::RemoteInvalidRequest,
            // IBV_WC_RETRY_EXC_ERR
            12 => DataPathCause::RetryExceeded,
            // IBV_WC_RNR_RETRY_EXC_ERR
            13 => DataPathCause::RnrRetryExceeded,
            _ => DataPathCause::Other,
        }
    }

    /// The cause of an error an established session's data path returned
    /// ([`Session::arrival`](crate::session::Session::arrival), a post).
    pub fn of(e: &SessionError) -> DataPathCause {
        match e {
            SessionError::Auth(_) => DataPathCause::AuthFailure,
            SessionError::TooLarge { .. } => DataPathCause::LengthError,
            SessionError::Verbs(v) => match v {
                VerbsError::WorkCompletion { status, .. } => DataPathCause::of_status(*status),
                VerbsError::UnexpectedCompletion(_) | VerbsError::UnknownReceive(_) => {
                    DataPathCause::UnexpectedOpcode
                }
                _ => DataPathCause::Other,
            },
            // Our own clients never send beyond the receives they were told of: they wait
            // for acknowledgements (`Client::post`).
            SessionError::SharedReceive(InboxError::OverCredit { .. }) => DataPathCause::OverCredit,
            SessionError::SharedReceive(InboxError::Completion { status, .. }) => {
                DataPathCause::of_status(*status)
            }
            _ => DataPathCause::Other,
        }
    }
}

impl std::fmt::Display for DataPathCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.explain())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::WcOpcode;

    fn completion(status: u32) -> SessionError {
        VerbsError::WorkCompletion {
            wr_id: 0,
            opcode: WcOpcode::Recv,
            status: WcStatus(status),
        }
        .into()
    }

    #[test]
    fn statuses_map_to_causes() {
        for (status, label) in [
            (1, "length_error"),
            (5, "request_refused"),
            (7, "unexpected_opcode"),
            (8, "remote_access_error"),
            (9, "remote_invalid_request"),
            (10, "remote_access_error"),
            (12, "retry_exceeded"),
            (13, "rnr_retry_exceeded"),
            (19, "other"),
        ] {
            assert_eq!(
                DataPathCause::of(&completion(status)).label(),
                label,
                "{status}"
            );
        }
        assert_eq!(
            DataPathCause::of(&VerbsError::UnexpectedCompletion(WcOpcode::RdmaRead).into()),
            DataPathCause::UnexpectedOpcode
        );
        assert_eq!(
            DataPathCause::of(&SessionError::TooLarge { len: 9, max: 8 }),
            DataPathCause::LengthError
        );
    }

    /// A peer cut off by the shared receive queue for sending beyond its credit was counted as
    /// `other` ("RDMA error"), not as what it is, and not logged as a likely attack.
    #[test]
    fn a_peer_over_its_credit_on_a_shared_queue_is_its_own_cause_and_a_likely_attack() {
        let e = SessionError::SharedReceive(InboxError::OverCredit { credit: 16 });
        let cause = DataPathCause::of(&e);
        assert_eq!(cause.label(), "over_credit");
        assert!(cause.likely_attack());
        assert!(cause
            .explain()
            .contains("more messages than the receives it was given"));
        let failed = SessionError::SharedReceive(InboxError::Completion {
            wr_id: 3,
            status: WcStatus(1),
        });
        assert_eq!(DataPathCause::of(&failed), DataPathCause::LengthError);
        let stopped = SessionError::SharedReceive(InboxError::Stopped("gone".into()));
        assert_eq!(DataPathCause::of(&stopped), DataPathCause::Other);
    }

    #[test]
    fn attacks_are_told_from_a_lost_peer() {
        assert!(DataPathCause::RequestRefused.likely_attack());
        assert!(!DataPathCause::RetryExceeded.likely_attack());
        assert!(!DataPathCause::Other.likely_attack());
        assert!(DataPathCause::RemoteAccessError
            .explain()
            .contains("rkey or address this session did not grant"));
        let labels: std::collections::BTreeSet<_> =
            DataPathCause::ALL.iter().map(|c| c.label()).collect();
        assert_eq!(labels.len(), DataPathCause::ALL.len());
    }
}
