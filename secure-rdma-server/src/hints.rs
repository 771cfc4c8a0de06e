//! What `secure-server` says about the library's errors that a flag, a
//! subcommand or a script fixes: the library names the cause, the binary
//! names its own flags.

use secure_rdma::certs::CertError;
use secure_rdma::server::ServerError;
use secure_rdma::verbs::VerbsError;

/// A `certs` subcommand's error, with the flag or subcommand that fixes it.
pub fn cert_error(e: CertError) -> anyhow::Error {
    match e {
        CertError::Exists(path) => anyhow::anyhow!(
            "{} already exists; remove it first or use another --dir",
            path.display()
        ),
        CertError::NoCa(dir) => anyhow::anyhow!(
            "no CA key in {}: run `secure-server certs init` first, or pass the CA directory with --ca-dir",
            dir.display()
        ),
        other => other.into(),
    }
}

/// A startup error, with the script that creates a missing device.
pub fn server_error(e: ServerError) -> anyhow::Error {
    match e {
        ServerError::Verbs(VerbsError::NoDevice) => anyhow::anyhow!(
            "{} (for Soft-RoCE run scripts/setup-softroce.sh)",
            VerbsError::NoDevice
        ),
        other => other.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Moved from secure_rdma::certs's tests: the library says the CA is missing, the binary
    // how to make one.
    #[test]
    fn issuing_without_a_ca_says_how_to_make_one() {
        let dir = tempfile::tempdir().unwrap();
        let err = secure_rdma::certs::issue_client(dir.path(), "bob").unwrap_err();
        let err = format!("{:#}", cert_error(err));
        assert!(err.contains("certs init"), "{err}");
        assert_eq!(
            err,
            format!(
                "no CA key in {}: run `secure-server certs init` first, or pass the CA directory with --ca-dir",
                dir.path().display()
            )
        );
    }

    #[test]
    fn an_existing_file_names_the_dir_flag() {
        let dir = tempfile::tempdir().unwrap();
        secure_rdma::certs::init(dir.path(), &["localhost".to_owned()]).unwrap();
        let err = secure_rdma::certs::init(dir.path(), &["localhost".to_owned()]).unwrap_err();
        let err = format!("{:#}", cert_error(err));
        assert!(
            err.ends_with(" already exists; remove it first or use another --dir"),
            "{err}"
        );
    }

    #[test]
    fn no_device_names_the_setup_script() {
        assert_eq!(
            format!(
                "{:#}",
                server_error(ServerError::Verbs(VerbsError::NoDevice))
            ),
            "no RDMA device found (for Soft-RoCE run scripts/setup-softroce.sh)"
        );
    }
}
