//! The TLS acceptor, rebuilt when the certificate revocation list changes:
//! a revocation applies from the next handshake on, without a restart.

use std::path::Path;
use std::sync::Mutex;
use std::time::SystemTime;

use tokio_rustls::TlsAcceptor;

use super::ServerConfig;
use crate::tls;

/// The TLS acceptor and the CRL it was built with.
pub(super) struct Acceptor(Mutex<Tls>);

struct Tls {
    acceptor: TlsAcceptor,
    /// Modification time and length of the CRL file it read; `None` when there was none.
    crl_stamp: Option<(SystemTime, u64)>,
}

fn crl_stamp(path: Option<&Path>) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path?).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

impl Acceptor {
    /// Loads the CA, the server's certificate and key, and the CRL if its file exists.
    pub(super) fn new(cfg: &ServerConfig) -> Result<Acceptor, tls::TlsError> {
        let crl = cfg.crl.as_deref();
        let crl_stamp = crl_stamp(crl);
        let config = tls::server_config_with_crl(
            &cfg.ca,
            &cfg.cert,
            &cfg.key,
            crl.filter(|_| crl_stamp.is_some()),
        )?;
        Ok(Acceptor(Mutex::new(Tls {
            acceptor: TlsAcceptor::from(config),
            crl_stamp,
        })))
    }

    /// The TLS acceptor for a new connection, rebuilt first if the CRL file changed.
    pub(super) fn current(&self, cfg: &ServerConfig) -> TlsAcceptor {
        let mut tls = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let stamp = crl_stamp(cfg.crl.as_deref());
        if stamp != tls.crl_stamp {
            let crl = cfg.crl.as_deref().filter(|_| stamp.is_some());
            match tls::server_config_with_crl(&cfg.ca, &cfg.cert, &cfg.key, crl) {
                Ok(config) => {
                    tls.acceptor = TlsAcceptor::from(config);
                    tls.crl_stamp = stamp;
                    tracing::info!(crl = ?crl, "certificate revocation list (re)loaded");
                }
                // Keep the revocations already in force rather than drop them all.
                Err(e) => tracing::error!(
                    error = %e,
                    "the CRL changed but cannot be read; keeping the previous one"
                ),
            }
        }
        tls.acceptor.clone()
    }
}
