//! TLS 1.3 with mutual certificate authentication, and what the connection
//! setup derives from it: the peer's identity and the confirmation tokens.
//!
//! Only TLS 1.3 is offered. The server requires a client certificate from the
//! deployment's CA; the client verifies the server against the same CA and
//! the name it dialled. The client certificate's common name is the client's
//! identity (its tenant) everywhere: logs, telemetry, quotas.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::protect::Side;

/// Errors of TLS configuration and identity extraction.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{path}: {source}")]
    Pem {
        /// The file.
        path: String,
        /// What was wrong.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A PEM file holds no certificate.
    #[error("{path}: no certificate in file")]
    NoCertificate {
        /// The file.
        path: String,
    },
    /// A CA certificate was not accepted as a trust anchor.
    #[error("{path}: {source}")]
    BadCa {
        /// The file.
        path: String,
        /// Why webpki refused it.
        #[source]
        source: rustls::Error,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    /// The client verifier could not be built.
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The peer presented no usable certificate.
    #[error("peer certificate: {0}")]
    Identity(#[from] IdentityError),
}

/// Why a certificate gives no identity.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The client sent no certificate.
    #[error("client presented no certificate")]
    NoCertificate,
    /// The certificate is not valid X.509 DER.
    #[error("{0}")]
    Parse(#[from] x509_parser::nom::Err<x509_parser::error::X509Error>),
    /// The subject has no common name.
    #[error("no common name")]
    NoCommonName,
    /// The common name is not a UTF-8 string.
    #[error("{0}")]
    CommonName(#[source] x509_parser::error::X509Error),
    /// The common name is not a valid identity.
    #[error("{0}")]
    Name(#[from] crate::certs::CertError),
}

fn pem_err(path: &Path, source: rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Pem {
        path: path.display().to_string(),
        source,
    }
}

/// Reads every certificate of a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(path, e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: path.display().to_string(),
        });
    }
    Ok(certs)
}

/// Reads a private key (PKCS#8, SEC1 or PKCS#1) from a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| pem_err(path, e))
}

fn roots(ca: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots.add(cert).map_err(|source| TlsError::BadCa {
            path: ca.display().to_string(),
            source,
        })?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Server configuration: TLS 1.3 only, client certificates from `ca`
/// required.
pub fn server_config(ca: &Path, cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    server_config_with_crl(ca, cert, key, None)
}

/// [`server_config`] that also refuses client certificates listed in the CRL
/// file `crl` (PEM, from [`crate::certs::revoke`]).
pub fn server_config_with_crl(
    ca: &Path,
    cert: &Path,
    key: &Path,
    crl: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider());
    if let Some(path) = crl {
        use rustls::pki_types::CertificateRevocationListDer;
        let crls = CertificateRevocationListDer::pem_file_iter(path)
            .map_err(|e| pem_err(path, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pem_err(path, e))?;
        // Our CA signs only end-entity certificates, and only its own CRL exists.
        builder = builder.with_crls(crls).only_check_end_entity_revocation();
    }
    let verifier = builder.build()?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(load_certs(cert)?, load_key(key)?)?;
    // Resumption: a client that connects again resumes its session (a ticket naming an entry
    // of this cache) and skips the certificate signatures, a third of the setup under
    // emulation. A resumed session carries the certificate verified when it was made, and the
    // verifier is not asked again, so the cache belongs to this configuration alone: the server
    // builds a new one when the CRL changes, and every session made before a revocation is
    // forgotten with the old cache (tested in hostile_peers.rs). rustls sends two tickets per
    // handshake, so a client may open two connections at once and resume both.
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE);
    Ok(Arc::new(config))
}

/// Sessions a server configuration remembers for resumption (the oldest are forgotten first,
/// and their clients make a full handshake).
const SESSION_CACHE: usize = 1024;

/// Client configuration: TLS 1.3 only, server verified against `ca`, our
/// certificate presented for client authentication.
pub fn client_config(ca: &Path, cert: &Path, key: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(ca)?)
        .with_client_auth_cert(load_certs(cert)?, load_key(key)?)?;
    Ok(Arc::new(config))
}

/// Client configuration without a client certificate. The server refuses
/// such clients; this exists so that refusal can be tested and reported.
pub fn client_config_without_cert(ca: &Path) -> Result<Arc<ClientConfig>, TlsError> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots(ca)?)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The identity in a certificate: its subject common name.
pub fn identity_of(cert: &CertificateDer<'_>) -> Result<String, TlsError> {
    let (_, x509) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(IdentityError::from)?;
    let cn = x509
        .subject()
        .iter_common_name()
        .next()
        .ok_or(IdentityError::NoCommonName)?;
    let name = cn.as_str().map_err(IdentityError::CommonName)?;
    crate::certs::validate_name(name).map_err(IdentityError::from)?;
    Ok(name.to_owned())
}

/// The authenticated identity of the client on a server-side connection.
pub fn client_identity(conn: &rustls::ServerConnection) -> Result<String, TlsError> {
    let cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or(TlsError::Identity(IdentityError::NoCertificate))?;
    identity_of(cert)
}

/// The two confirmation tokens of a TLS session (see [`confirmation_token`]), as
/// [`confirmation_tokens`] derives them for one side.
#[derive(Clone, Copy)]
pub struct Tokens {
    /// The one this side sends.
    pub mine: [u8; TOKEN_LEN],
    /// The one the peer must send.
    pub peer: [u8; TOKEN_LEN],
}

impl std::fmt::Debug for Tokens {
    // The tokens are secrets: never in a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tokens(..)")
    }
}

/// Length of a confirmation token.
pub const TOKEN_LEN: usize = 32;
const EXPORTER_LABEL: &[u8] = b"EXPORTER-secure-rdma-confirm";

/// The token `side` sends as its first RDMA message on the new QP.
///
/// Both ends derive both tokens from the TLS session's exporter secret
/// (RFC 8446 §7.5), so only the two ends of this TLS session know them. A
/// peer that proves the token over RDMA proves its QP is really connected to
/// ours: a wrong PSN or GID drops packets silently on RC, and this is what
/// turns that silence into an error.
pub fn confirmation_token<D>(
    conn: &rustls::ConnectionCommon<D>,
    side: Side,
) -> Result<[u8; TOKEN_LEN], TlsError> {
    let context: &[u8] = match side {
        Side::Server => b"server",
        Side::Client => b"client",
    };
    conn.export_keying_material([0u8; TOKEN_LEN], EXPORTER_LABEL, Some(context))
        .map_err(TlsError::Config)
}

/// Both confirmation tokens seen from `side`: the one it sends and the one it expects from the
/// peer ([`confirmation_token`] of each end).
pub fn confirmation_tokens<D>(
    conn: &rustls::ConnectionCommon<D>,
    side: Side,
) -> Result<Tokens, TlsError> {
    Ok(Tokens {
        mine: confirmation_token(conn, side)?,
        peer: confirmation_token(conn, side.peer())?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::Op;
    use crate::protect::{Cipher, Protection, OVERHEAD};
    use rustls::pki_types::ServerName;

    /// Two ends of a real mutually authenticated TLS 1.3 session over an in-memory pipe.
    async fn session(
        dir: &Path,
    ) -> (
        tokio_rustls::client::TlsStream<tokio::io::DuplexStream>,
        tokio_rustls::server::TlsStream<tokio::io::DuplexStream>,
    ) {
        let (ca, server) = (crate::certs::ca_paths(dir), crate::certs::server_paths(dir));
        let alice = crate::certs::client_paths(dir, "alice");
        let sc = server_config(&ca.cert, &server.cert, &server.key).unwrap();
        let cc = client_config(&ca.cert, &alice.cert, &alice.key).unwrap();
        let (a, b) = tokio::io::duplex(1 << 16);
        let name = ServerName::try_from("localhost").unwrap();
        let (c, s) = tokio::join!(
            tokio_rustls::TlsConnector::from(cc).connect(name, a),
            tokio_rustls::TlsAcceptor::from(sc).accept(b)
        );
        (c.unwrap(), s.unwrap())
    }

    fn seal(p: &mut Protection, msg: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; msg.len() + OVERHEAD];
        let n = p.sealer.seal(Op::Send, msg, &mut out).unwrap();
        out.truncate(n);
        out
    }

    #[tokio::test]
    async fn payload_keys_pair_up_differ_per_direction_and_per_session() {
        let dir = tempfile::tempdir().unwrap();
        crate::certs::init(dir.path(), &["localhost".to_owned()]).unwrap();
        crate::certs::issue_client(dir.path(), "alice").unwrap();
        let cipher = Cipher::ChaCha20Poly1305;
        let (c, s) = session(dir.path()).await;
        let mut client = Protection::from_tls(c.get_ref().1, Side::Client, cipher).unwrap();
        let mut server = Protection::from_tls(s.get_ref().1, Side::Server, cipher).unwrap();

        // What the client seals, the server opens, and the reverse.
        let mut to_server = seal(&mut client, b"up");
        let mut to_client = seal(&mut server, b"down");
        // Per direction: a client message cannot be reflected back to the client.
        let mut reflected = to_server.clone();
        assert!(client.opener.open(Op::Send, &mut reflected).is_err());
        assert_eq!(server.opener.open(Op::Send, &mut to_server).unwrap(), b"up");
        assert_eq!(
            client.opener.open(Op::Send, &mut to_client).unwrap(),
            b"down"
        );

        // Per session: a second session's keys open nothing of the first.
        let (c2, s2) = session(dir.path()).await;
        let mut client2 = Protection::from_tls(c2.get_ref().1, Side::Client, cipher).unwrap();
        let mut server2 = Protection::from_tls(s2.get_ref().1, Side::Server, cipher).unwrap();
        let mut from_first = seal(&mut client, b"old session");
        assert!(server2.opener.open(Op::Send, &mut from_first).is_err());
        let mut fresh = seal(&mut client2, b"new session");
        assert_eq!(
            server2.opener.open(Op::Send, &mut fresh).unwrap(),
            b"new session"
        );

        // And they are not the confirmation tokens.
        let token = confirmation_token(c.get_ref().1, Side::Client).unwrap();
        let mine = c
            .get_ref()
            .1
            .export_keying_material(
                [0u8; 32],
                crate::protect::KEY_LABEL,
                Some(crate::protect::key_context(Side::Client)),
            )
            .unwrap();
        assert_ne!(token, mine);

        // Epoch 0 is sealed under that exported key itself, as before keys rotated: a peer of
        // the earlier release (an opener of that one key) opens it.
        let mut earlier_release = crate::protect::Opener::new(cipher, &mine);
        let mut third = seal(&mut client, b"epoch 0");
        // The client's sealer numbered two messages already; the old opener starts at 1.
        earlier_release.bind(crate::datapath::StreamId([0; 16]), 3);
        assert_eq!(
            earlier_release.open(Op::Send, &mut third).unwrap(),
            b"epoch 0"
        );
        // After a rotation it cannot: the next key comes from a secret it never had.
        client.sealer.rotate();
        let mut fourth = seal(&mut client, b"epoch 1");
        assert!(earlier_release.open(Op::Send, &mut fourth).is_err());
    }
}
