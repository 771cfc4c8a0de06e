//! What `secure-server` says about the library's errors that a flag, a
//! subcommand or a script fixes: the library names the cause, the binary
//! names its own flags.

use secure_rdma::certs::CertError;
use secure_rdma::server::{ConfigError, RdmaSetting, ServerError};
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

/// Why the server did not start, worded for secure-server: the library names the setting, this
/// names the flag (or config-file key) that sets it, and the script that creates a missing
/// device.
pub fn server_error(e: ServerError) -> anyhow::Error {
    let flag = match &e {
        ServerError::Verbs(VerbsError::NoDevice) => {
            return anyhow::anyhow!(
                "{} (for Soft-RoCE run scripts/setup-softroce.sh)",
                VerbsError::NoDevice
            )
        }
        ServerError::Config(ConfigError::MaxClients) => "--max-clients must be at least 1".into(),
        ServerError::Config(ConfigError::BufferSize { size }) => {
            format!("--buffer-size {size} must be between 64 bytes and 1 GiB")
        }
        ServerError::Config(ConfigError::MaxPending) => {
            "--max-pending and --max-pending-per-address must be at least 1".into()
        }
        ServerError::Config(ConfigError::MaxSessionsPerIdentity) => {
            "--max-sessions-per-identity must be at least 1".into()
        }
        ServerError::NoRdma {
            setting,
            availability,
        } => {
            let flag = match setting {
                RdmaSetting::Device(name) => format!("--device {name}"),
                RdmaSetting::GidIndex => "--gid-index".to_owned(),
                _ => setting.to_string(),
            };
            return anyhow::anyhow!("{flag} needs an RDMA device, and {availability}");
        }
        _ => return e.into(),
    };
    anyhow::anyhow!("invalid configuration: {flag}")
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
