//! What `secure-client` says about a [`ClientError`]: the library's message,
//! with the flag or script that fixes it where there is one, and the exit
//! code documented in `secure-client --help`. The library names causes; only
//! the binary knows its flags.

use std::fmt;

use secure_rdma::client::ClientError;
use secure_rdma::session::SessionError;
use secure_rdma::verbs::VerbsError;

/// Process exit code for `e` (documented in `secure-client --help`).
pub fn exit_code(e: &ClientError) -> i32 {
    match e {
        // The server ended the session over this client's certificate (revoked or expired):
        // a certificate problem, as a TLS refusal is.
        e if e.certificate_ended().is_some() => 4,
        ClientError::Rejected(_)
        | ClientError::LaneRejected { .. }
        | ClientError::WriteRejected(_)
        | ClientError::NoLanes => 3,
        ClientError::Tls(_)
        | ClientError::TlsIo(_)
        | ClientError::TlsTimeout(_)
        | ClientError::ServerName { .. }
        | ClientError::TlsConfig(_) => 4,
        ClientError::Unreachable { .. } => 5,
        ClientError::Device(_) => 6,
        ClientError::Confirm(_) | ClientError::LaneNotConfirmed { .. } => 7,
        ClientError::Session(_) | ClientError::Forged { .. } | ClientError::LaneLost { .. } => 8,
        ClientError::Unprotected { .. } | ClientError::BufferTooLarge { .. } => 9,
        // A cause this binary does not know yet: "other error".
        _ => 1,
    }
}

/// The flag or script that fixes `e`, said after the library's message.
fn hint(e: &ClientError) -> Option<&'static str> {
    match e {
        ClientError::Unprotected { .. } => {
            Some("--no-payload-protection accepts payloads in clear")
        }
        ClientError::BufferTooLarge { .. } => Some("--max-buffer-size"),
        ClientError::NoLanes => {
            Some("lanes need a server that offers them: --max-lanes-per-identity above 1")
        }
        ClientError::Device(VerbsError::NoDevice)
        | ClientError::Confirm(SessionError::Verbs(VerbsError::NoDevice))
        | ClientError::Session(SessionError::Verbs(VerbsError::NoDevice)) => {
            Some("for Soft-RoCE run scripts/setup-softroce.sh")
        }
        _ => None,
    }
}

/// Displays a [`ClientError`] as `secure-client` prints it.
pub struct Shown<'a>(pub &'a ClientError);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        match hint(self.0) {
            Some(h) => write!(f, " ({h})"),
            None => Ok(()),
        }
    }
}

/// A [`ClientError`] as an error of this binary: [`Shown`]'s message, the
/// library error's sources (for `anyhow`'s chain of causes).
#[derive(Debug)]
pub struct Hinted(pub ClientError);

impl fmt::Display for Hinted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Shown(&self.0).fmt(f)
    }
}

impl std::error::Error for Hinted {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use secure_rdma::handshake::RejectReason;

    // Moved from secure_rdma::client's tests with exit_code: the policy refusal's code and the
    // flag that lifts it.
    #[test]
    fn a_policy_refusal_exits_9_and_names_the_flag() {
        let policy = ClientError::Unprotected {
            chosen: "no protection".into(),
            required: "aes-256-gcm".into(),
        };
        assert_eq!(exit_code(&policy), 9);
        let shown = Shown(&policy).to_string();
        assert!(shown.contains("--no-payload-protection"), "{shown}");
        assert_eq!(
            shown,
            "the server chose no protection for payloads, but this client requires aes-256-gcm; \
             refusing the session (--no-payload-protection accepts payloads in clear)"
        );
    }

    #[test]
    fn each_cause_has_its_exit_code() {
        let full = ClientError::Rejected(RejectReason::ServerFull { active: 1, max: 1 });
        assert_eq!(exit_code(&full), 3);
        let refused = ClientError::Unreachable {
            addr: "10.77.0.1:4433".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(exit_code(&refused), 5);
        assert_eq!(
            exit_code(&ClientError::TlsTimeout(std::time::Duration::from_secs(1))),
            4
        );
        assert_eq!(exit_code(&ClientError::Device(VerbsError::NoDevice)), 6);
        let big = ClientError::BufferTooLarge { asked: 32, max: 16 };
        assert_eq!(exit_code(&big), 9);
        assert_eq!(
            Shown(&big).to_string(),
            "the server asks for 32-byte buffers; this client allocates at most 16 (--max-buffer-size)"
        );
    }

    #[test]
    fn a_certificate_abort_exits_4_and_is_not_retried() {
        use secure_rdma::datapath::AbortReason;
        use secure_rdma::handshake::HandshakeError;
        for reason in [
            AbortReason::CertificateRevoked,
            AbortReason::CertificateExpired { not_after: 0 },
        ] {
            let e = ClientError::Session(SessionError::Handshake(HandshakeError::Aborted(
                reason.clone(),
            )));
            assert_eq!(exit_code(&e), 4, "{e}");
            assert!(!e.is_session_lost(), "{e}");
            assert!(Shown(&e).to_string().contains("certificate"), "{e}");
        }
        // Other aborts are still a lost session, retried, exit 8 when they are final.
        let lifetime = ClientError::Session(SessionError::Handshake(HandshakeError::Aborted(
            AbortReason::Lifetime { seconds: 1 },
        )));
        assert!(lifetime.is_session_lost());
        assert_eq!(exit_code(&lifetime), 8);
    }

    #[test]
    fn no_device_names_the_setup_script() {
        assert_eq!(
            Shown(&ClientError::Device(VerbsError::NoDevice)).to_string(),
            "no RDMA device found (for Soft-RoCE run scripts/setup-softroce.sh)"
        );
        // Errors without a fix of this binary's read as the library's.
        let refused = ClientError::Unreachable {
            addr: "10.77.0.1:4433".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(Shown(&refused).to_string(), refused.to_string());
        let hinted = Hinted(refused);
        assert!(std::error::Error::source(&hinted).is_some());
    }
}
