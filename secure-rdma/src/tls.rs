//! TLS 1.3 with mutual certificate authentication, and what the connection
//! setup derives from it: the peer's identity and the confirmation tokens.
//!
//! Only TLS 1.3 is offered. The server requires a client certificate from the
//! deployment's CA; the client verifies the server against the same CA and
//! the name it dialled. The client certificate names the client's identity (its
//! tenant) everywhere: logs, telemetry, quotas, streams. Which of its names is
//! the identity is an [`IdentitySource`]: by default the SPIFFE ID of an
//! X509-SVID (its one URI SAN) when the certificate has one, else the subject's
//! common name, as `secure-server certs` writes it.

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
    /// An extension (subject alternative names, basic constraints, key usage) does not parse.
    #[error("certificate extension: {0}")]
    San(#[source] x509_parser::error::X509Error),
    /// A SPIFFE ID was required and the certificate has no URI SAN.
    #[error(
        "no SPIFFE ID: the certificate has no URI SAN (an X509-SVID carries its SPIFFE ID \
         there); issue one with a spiffe:// URI SAN, or take identities from the DNS name or \
         common name"
    )]
    NoSpiffeId,
    /// An X509-SVID carries exactly one URI SAN; this certificate has several.
    #[error(
        "{count} URI SANs ({uris}): an X509-SVID carries exactly one, its SPIFFE ID; \
         issue the certificate with a single URI SAN"
    )]
    UriCount {
        /// How many.
        count: usize,
        /// Them, comma-separated.
        uris: String,
    },
    /// The URI SAN is not a valid SPIFFE ID.
    #[error("URI SAN {uri:?} is not a valid SPIFFE ID: {reason}")]
    SpiffeId {
        /// The URI as the certificate carries it.
        uri: String,
        /// Which rule it breaks.
        #[source]
        reason: crate::quota::spiffe::SpiffeIdError,
    },
    /// A DNS name was required and the certificate has none.
    #[error("no DNS name: the certificate has no DNS SAN; issue one with a DNS SAN, or take identities from the SPIFFE ID or common name")]
    NoDnsName,
    /// Several DNS SANs: which one is the identity would be a guess.
    #[error("{count} DNS SANs ({names}): the identity is ambiguous; issue the client certificate with one DNS SAN, or take identities from the SPIFFE ID or common name")]
    DnsNameCount {
        /// How many.
        count: usize,
        /// Them, comma-separated.
        names: String,
    },
    /// The certificate carries a SPIFFE ID but is not a leaf X509-SVID (X509-SVID standard,
    /// §4): a CA, or key usages other than a leaf's.
    #[error("not an X509-SVID leaf: {0}; issue the client certificate with CA:FALSE and keyUsage digitalSignature (without keyCertSign or cRLSign)")]
    NotSvidLeaf(&'static str),
    /// A SPIFFE ID of a trust domain the server does not accept.
    #[error("trust domain {trust_domain} of {id} is not one this server accepts ({accepted})")]
    TrustDomain {
        /// The SPIFFE ID.
        id: String,
        /// Its trust domain.
        trust_domain: String,
        /// The accepted ones, comma-separated.
        accepted: String,
    },
    /// The DNS SAN is not a usable name.
    #[error("DNS SAN {0:?} is not a host name (letters, digits, '-', '_' in dot-separated labels of 1-63, at most 253 in all; no wildcards)")]
    DnsName(String),
}

/// Which name of a client certificate is the client's identity.
///
/// ```
/// use secure_rdma::tls::IdentitySource;
///
/// assert_eq!(IdentitySource::default(), IdentitySource::Auto);
/// assert_eq!("spiffe".parse::<IdentitySource>().unwrap(), IdentitySource::Spiffe);
/// assert_eq!(IdentitySource::Dns.to_string(), "dns");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum IdentitySource {
    /// The SPIFFE ID when the certificate has a `spiffe:` URI SAN (it must then be a valid
    /// X509-SVID identity), else the common name. The default: certificates of
    /// [`crate::certs`] keep their names, and X509-SVIDs are named by their SPIFFE IDs.
    #[default]
    Auto,
    /// The SPIFFE ID of an X509-SVID: exactly one URI SAN, a valid SPIFFE ID; certificates
    /// without one are refused.
    Spiffe,
    /// The one DNS SAN, lowercased (DNS names are case-insensitive).
    Dns,
    /// The subject's common name (1-64 of `A-Z a-z 0-9 . _ -`).
    Cn,
}

impl IdentitySource {
    /// Every source, as [`std::fmt::Display`] writes them.
    pub const ALL: [IdentitySource; 4] = [
        IdentitySource::Auto,
        IdentitySource::Spiffe,
        IdentitySource::Dns,
        IdentitySource::Cn,
    ];

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentitySource::Auto => "auto",
            IdentitySource::Spiffe => "spiffe",
            IdentitySource::Dns => "dns",
            IdentitySource::Cn => "cn",
        }
    }
}

impl std::fmt::Display for IdentitySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no [`IdentitySource`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown identity source {0:?} (expected auto, spiffe, dns or cn)")]
pub struct UnknownIdentitySource(pub String);

impl std::str::FromStr for IdentitySource {
    type Err = UnknownIdentitySource;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        IdentitySource::ALL
            .into_iter()
            .find(|source| source.as_str() == s)
            .ok_or_else(|| UnknownIdentitySource(s.to_owned()))
    }
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

/// ring's provider with its TLS 1.3 suites fastest first on this CPU: the control channel
/// follows the payload cipher's choice ([`crate::protect::Cipher::preferred`]). rustls lists
/// AES-GCM first everywhere; without AES and carry-less multiplication instructions ring's
/// AES-GCM is a constant-time software implementation, and on the lab's CPU model (Nehalem,
/// under emulation) sealing one handshake message took about 0.3 ms of the 0.3-0.5 ms a send
/// cost, on every message of the setup.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    order_suites(
        &mut provider.cipher_suites,
        crate::protect::Cipher::preferred(),
    );
    Arc::new(provider)
}

/// Puts the suites of `first`'s AEAD ahead of the others, keeping rustls's order within each.
fn order_suites(suites: &mut [rustls::SupportedCipherSuite], first: crate::protect::Cipher) {
    use rustls::CipherSuite as S;
    let chacha = |s: &rustls::SupportedCipherSuite| {
        matches!(
            s.suite(),
            S::TLS13_CHACHA20_POLY1305_SHA256
                | S::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
                | S::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256
        )
    };
    // A stable sort: false (the preferred AEAD) first.
    match first {
        crate::protect::Cipher::ChaCha20Poly1305 => suites.sort_by_key(|s| !chacha(s)),
        crate::protect::Cipher::Aes256Gcm => suites.sort_by_key(chacha),
    }
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
    // The server's order, fastest first on its CPU, as it chooses the payload cipher: a client
    // of another CPU (or of another TLS library) does not make it seal in software.
    config.ignore_client_order = true;
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

/// The identity in a certificate, as [`IdentitySource::Auto`] finds it: the SPIFFE ID of an
/// X509-SVID, else the subject common name.
pub fn identity_of(cert: &CertificateDer<'_>) -> Result<String, TlsError> {
    identity_from(cert, IdentitySource::Auto)
}

/// The identity in a certificate, taken from `source`.
pub fn identity_from(
    cert: &CertificateDer<'_>,
    source: IdentitySource,
) -> Result<String, TlsError> {
    let (_, x509) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(IdentityError::from)?;
    Ok(identity_in(&x509, source)?)
}

fn identity_in(
    x509: &x509_parser::certificate::X509Certificate<'_>,
    source: IdentitySource,
) -> Result<String, IdentityError> {
    use x509_parser::extensions::GeneralName;
    let sans: Vec<&GeneralName<'_>> = match x509.subject_alternative_name() {
        Ok(Some(ext)) => ext.value.general_names.iter().collect(),
        Ok(None) => Vec::new(),
        Err(e) => return Err(IdentityError::San(e)),
    };
    let uris: Vec<&str> = sans
        .iter()
        .filter_map(|n| match n {
            GeneralName::URI(u) => Some(*u),
            _ => None,
        })
        .collect();
    let dns: Vec<&str> = sans
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some(*d),
            _ => None,
        })
        .collect();
    match source {
        IdentitySource::Spiffe => svid_leaf(x509).and_then(|()| spiffe_id(&uris)),
        // A certificate that means to be an X509-SVID is judged as one: a broken SPIFFE ID is
        // refused, never quietly replaced by the common name.
        IdentitySource::Auto
            if uris
                .iter()
                .any(|u| crate::quota::spiffe::looks_like_spiffe_id(u)) =>
        {
            svid_leaf(x509).and_then(|()| spiffe_id(&uris))
        }
        IdentitySource::Auto | IdentitySource::Cn => common_name(x509),
        IdentitySource::Dns => dns_name(&dns),
    }
}

/// The leaf rules of the X509-SVID standard (§4.1, §4.3), as go-spiffe checks them: not a CA,
/// key usage digitalSignature, and neither keyCertSign nor cRLSign. A signing certificate's
/// SPIFFE ID names a trust domain's authority, never a workload.
fn svid_leaf(x509: &x509_parser::certificate::X509Certificate<'_>) -> Result<(), IdentityError> {
    match x509.basic_constraints() {
        Ok(Some(bc)) if bc.value.ca => return Err(IdentityError::NotSvidLeaf("it is a CA")),
        Ok(_) => {}
        Err(e) => return Err(IdentityError::San(e)),
    }
    let usage = match x509.key_usage() {
        Ok(Some(ku)) => ku.value,
        Ok(None) => return Err(IdentityError::NotSvidLeaf("it has no key usage extension")),
        Err(e) => return Err(IdentityError::San(e)),
    };
    if !usage.digital_signature() {
        return Err(IdentityError::NotSvidLeaf(
            "its key usage lacks digitalSignature",
        ));
    }
    if usage.key_cert_sign() || usage.crl_sign() {
        return Err(IdentityError::NotSvidLeaf(
            "its key usage includes keyCertSign or cRLSign",
        ));
    }
    Ok(())
}

/// The SPIFFE ID of an X509-SVID: its only URI SAN (X509-SVID standard, §2).
fn spiffe_id(uris: &[&str]) -> Result<String, IdentityError> {
    match uris {
        [] => Err(IdentityError::NoSpiffeId),
        [uri] => crate::quota::spiffe::SpiffeId::parse(uri)
            .map(crate::quota::spiffe::SpiffeId::into_string)
            .map_err(|reason| IdentityError::SpiffeId {
                uri: (*uri).to_owned(),
                reason,
            }),
        many => Err(IdentityError::UriCount {
            count: many.len(),
            uris: many.join(", "),
        }),
    }
}

fn common_name(
    x509: &x509_parser::certificate::X509Certificate<'_>,
) -> Result<String, IdentityError> {
    let cn = x509
        .subject()
        .iter_common_name()
        .next()
        .ok_or(IdentityError::NoCommonName)?;
    let name = cn.as_str().map_err(IdentityError::CommonName)?;
    crate::certs::validate_name(name)?;
    Ok(name.to_owned())
}

fn dns_name(names: &[&str]) -> Result<String, IdentityError> {
    let name = match names {
        [] => return Err(IdentityError::NoDnsName),
        [one] => *one,
        many => {
            return Err(IdentityError::DnsNameCount {
                count: many.len(),
                names: many.join(", "),
            })
        }
    };
    let label_ok = |l: &str| {
        (1..=63).contains(&l.len())
            && l.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    };
    if name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(IdentityError::DnsName(name.to_owned()));
    }
    // One name, one tenant: `Alice.example` and `alice.example` are the same host.
    Ok(name.to_ascii_lowercase())
}

/// Checks that `identity`, when it is a SPIFFE ID, belongs to one of the `accepted` trust
/// domains (none: any). Identities that are not SPIFFE IDs pass: they have no trust domain.
///
/// ```
/// use secure_rdma::tls::check_trust_domain;
///
/// let accepted = ["example.org".to_owned()];
/// assert!(check_trust_domain("spiffe://example.org/api", &accepted).is_ok());
/// assert!(check_trust_domain("spiffe://other.example/api", &accepted).is_err());
/// assert!(check_trust_domain("alice", &accepted).is_ok());
/// assert!(check_trust_domain("spiffe://other.example/api", &[]).is_ok());
/// ```
pub fn check_trust_domain(identity: &str, accepted: &[String]) -> Result<(), IdentityError> {
    let Ok(id) = crate::quota::spiffe::SpiffeId::parse(identity) else {
        return Ok(());
    };
    if accepted.is_empty() || accepted.iter().any(|td| td == id.trust_domain()) {
        return Ok(());
    }
    Err(IdentityError::TrustDomain {
        trust_domain: id.trust_domain().to_owned(),
        id: id.into_string(),
        accepted: accepted.join(", "),
    })
}

/// The authenticated identity of the client on a server-side connection, as
/// [`IdentitySource::Auto`] finds it.
pub fn client_identity(conn: &rustls::ServerConnection) -> Result<String, TlsError> {
    client_identity_from(conn, IdentitySource::Auto)
}

/// The authenticated identity of the client on a server-side connection, taken from `source`.
pub fn client_identity_from(
    conn: &rustls::ServerConnection,
    source: IdentitySource,
) -> Result<String, TlsError> {
    let cert = conn
        .peer_certificates()
        .and_then(|c| c.first())
        .ok_or(TlsError::Identity(IdentityError::NoCertificate))?;
    identity_from(cert, source)
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
    lane_confirmation_token(conn, side, 0)
}

/// The token `side` sends first on `lane` ([`crate::lanes`]): the exporter context names the
/// lane, so a lane's token proves that QP and no other. Lane 0's is [`confirmation_token`]'s.
pub fn lane_confirmation_token<D>(
    conn: &rustls::ConnectionCommon<D>,
    side: Side,
    lane: u32,
) -> Result<[u8; TOKEN_LEN], TlsError> {
    let context: &[u8] = match side {
        Side::Server => b"server",
        Side::Client => b"client",
    };
    let context = crate::lanes::lane_context(context, lane);
    conn.export_keying_material([0u8; TOKEN_LEN], EXPORTER_LABEL, Some(&context))
        .map_err(TlsError::Config)
}

/// Both tokens of `lane` seen from `side` ([`lane_confirmation_token`] of each end).
pub fn lane_confirmation_tokens<D>(
    conn: &rustls::ConnectionCommon<D>,
    side: Side,
    lane: u32,
) -> Result<Tokens, TlsError> {
    Ok(Tokens {
        mine: lane_confirmation_token(conn, side, lane)?,
        peer: lane_confirmation_token(conn, side.peer(), lane)?,
    })
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

    /// A self-signed certificate with this CN and these SANs (only its names matter here).
    fn cert_with(cn: &str, sans: &[&str]) -> CertificateDer<'static> {
        use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
        let mut p = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        p.distinguished_name = dn;
        p.subject_alt_names = sans
            .iter()
            .map(|s| match s.split_once(':') {
                Some(("dns", name)) => SanType::DnsName((*name).try_into().unwrap()),
                _ => SanType::URI((*s).try_into().unwrap()),
            })
            .collect();
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        p.self_signed(&key).unwrap().der().clone()
    }

    fn identity(cert: &CertificateDer<'_>, source: IdentitySource) -> Result<String, String> {
        identity_from(cert, source).map_err(|e| e.to_string())
    }

    #[test]
    fn identities_come_from_the_configured_name() {
        use IdentitySource::*;
        // As `certs client alice` writes it: CN and DNS SAN alice, no URI.
        let plain = cert_with("alice", &["dns:alice"]);
        assert_eq!(identity(&plain, Auto).as_deref(), Ok("alice"));
        assert_eq!(identity(&plain, Cn).as_deref(), Ok("alice"));
        assert_eq!(identity(&plain, Dns).as_deref(), Ok("alice"));
        let err = identity(&plain, Spiffe).unwrap_err();
        assert!(
            err.contains("no SPIFFE ID: the certificate has no URI SAN"),
            "{err}"
        );

        // An X509-SVID: auto and spiffe take the SPIFFE ID, cn and dns still what they name.
        let svid = cert_with(
            "alice",
            &["spiffe://a.example/ns/x/sa/alice", "dns:Api.Example"],
        );
        assert_eq!(
            identity(&svid, Auto).as_deref(),
            Ok("spiffe://a.example/ns/x/sa/alice")
        );
        assert_eq!(
            identity(&svid, Spiffe).as_deref(),
            Ok("spiffe://a.example/ns/x/sa/alice")
        );
        assert_eq!(identity(&svid, Cn).as_deref(), Ok("alice"));
        assert_eq!(identity(&svid, Dns).as_deref(), Ok("api.example"));

        // The same path under another trust domain is another identity.
        let other = cert_with("alice", &["spiffe://b.example/ns/x/sa/alice"]);
        assert_ne!(identity(&svid, Auto), identity(&other, Auto));

        // A URI that is not a SPIFFE ID does not make auto leave the common name.
        let web = cert_with("alice", &["https://example.org/alice"]);
        assert_eq!(identity(&web, Auto).as_deref(), Ok("alice"));
        let err = identity(&web, Spiffe).unwrap_err();
        assert!(
            err.contains("is not a valid SPIFFE ID: a SPIFFE ID starts with"),
            "{err}"
        );
    }

    #[test]
    fn certificates_without_a_usable_identity_are_refused_with_the_reason() {
        use IdentitySource::*;
        // A broken SPIFFE ID is refused, never replaced by the common name.
        let bad = cert_with("alice", &["spiffe://Example.org/alice"]);
        for source in [Auto, Spiffe] {
            let err = identity(&bad, source).unwrap_err();
            assert_eq!(
                err,
                "peer certificate: URI SAN \"spiffe://Example.org/alice\" is not a valid SPIFFE ID: \
                 'E' is not allowed in a trust domain: use lowercase letters, digits, '.', '-', '_'"
            );
        }
        // An X509-SVID has exactly one URI SAN.
        let two = cert_with("alice", &["spiffe://a.example/x", "spiffe://a.example/y"]);
        let err = identity(&two, Auto).unwrap_err();
        assert!(
            err.starts_with("peer certificate: 2 URI SANs (spiffe://a.example/x, spiffe://a.example/y): an X509-SVID carries exactly one"),
            "{err}"
        );
        // DNS: none, several, or not a host name.
        let none = cert_with("alice", &[]);
        assert!(identity(&none, Dns).unwrap_err().contains("no DNS name"));
        let several = cert_with("alice", &["dns:a.example", "dns:b.example"]);
        assert!(identity(&several, Dns)
            .unwrap_err()
            .contains("2 DNS SANs (a.example, b.example)"));
        let wildcard = cert_with("alice", &["dns:*.example"]);
        assert!(identity(&wildcard, Dns)
            .unwrap_err()
            .contains("\"*.example\" is not a host name"));
        // A SPIFFE ID on a certificate that is no X509-SVID leaf.
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.subject_alt_names = vec![rcgen::SanType::URI(
            "spiffe://a.example/x".try_into().unwrap(),
        )];
        let key = rcgen::KeyPair::generate().unwrap();
        for (usages, why) in [
            (vec![], "it has no key usage extension"),
            (
                vec![rcgen::KeyUsagePurpose::KeyEncipherment],
                "its key usage lacks digitalSignature",
            ),
            (
                vec![
                    rcgen::KeyUsagePurpose::DigitalSignature,
                    rcgen::KeyUsagePurpose::KeyCertSign,
                ],
                "its key usage includes keyCertSign or cRLSign",
            ),
        ] {
            p.key_usages = usages;
            let cert = p.self_signed(&key).unwrap().der().clone();
            let err = identity(&cert, Auto).unwrap_err();
            assert!(
                err.contains(&format!("not an X509-SVID leaf: {why}")),
                "{err}"
            );
        }
        p.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = p.self_signed(&key).unwrap().der().clone();
        assert!(identity(&ca, Spiffe)
            .unwrap_err()
            .contains("not an X509-SVID leaf: it is a CA"));
        // A common name that is no identity, as before.
        let slash = cert_with("a/b", &[]);
        assert!(identity(&slash, Cn)
            .unwrap_err()
            .contains("invalid client name \"a/b\""));
    }

    #[test]
    fn identity_sources_parse_from_their_names() {
        for source in IdentitySource::ALL {
            assert_eq!(source.to_string().parse::<IdentitySource>(), Ok(source));
        }
        assert_eq!(
            "uri".parse::<IdentitySource>().unwrap_err().to_string(),
            "unknown identity source \"uri\" (expected auto, spiffe, dns or cn)"
        );
    }

    #[tokio::test]
    async fn each_lane_has_its_own_keys_and_tokens_and_lane_0_is_the_session_without_lanes() {
        let dir = tempfile::tempdir().unwrap();
        crate::certs::init(dir.path(), &["localhost".to_owned()]).unwrap();
        crate::certs::issue_client(dir.path(), "alice").unwrap();
        let cipher = Cipher::Aes256Gcm;
        let (c, s) = session(dir.path()).await;
        let (c, s) = (c.get_ref().1, s.get_ref().1);
        // Lane 0 derives exactly what a session without lanes does: a peer of an earlier
        // release (from_tls, confirmation_tokens) pairs with it.
        let mut lane0 = Protection::from_tls_lane(c, Side::Client, cipher, 0).unwrap();
        let mut earlier = Protection::from_tls(s, Side::Server, cipher).unwrap();
        let mut msg = seal(&mut lane0, b"lane 0");
        assert_eq!(earlier.opener.open(Op::Send, &mut msg).unwrap(), b"lane 0");
        assert_eq!(
            lane_confirmation_tokens(c, Side::Client, 0).unwrap().mine,
            confirmation_tokens(c, Side::Client).unwrap().mine
        );
        // Lane 2's ends pair up with each other, and with nothing of another lane.
        let mut client2 = Protection::from_tls_lane(c, Side::Client, cipher, 2).unwrap();
        let mut server2 = Protection::from_tls_lane(s, Side::Server, cipher, 2).unwrap();
        let mut server1 = Protection::from_tls_lane(s, Side::Server, cipher, 1).unwrap();
        let mut on_lane2 = seal(&mut client2, b"lane 2");
        let mut replayed = on_lane2.clone();
        assert_eq!(
            server2.opener.open(Op::Send, &mut on_lane2).unwrap(),
            b"lane 2"
        );
        // Replayed onto lane 1 or lane 0, it fails at the tag.
        let e = server1
            .opener
            .open(Op::Send, &mut replayed.clone())
            .unwrap_err();
        assert_eq!(e.check(), "tag", "{e}");
        assert!(earlier.opener.open(Op::Send, &mut replayed).is_err());
        // The tokens: each lane's, both ends agreeing, none equal to another lane's.
        let t2c = lane_confirmation_tokens(c, Side::Client, 2).unwrap();
        let t2s = lane_confirmation_tokens(s, Side::Server, 2).unwrap();
        assert_eq!((t2c.mine, t2c.peer), (t2s.peer, t2s.mine));
        let t1c = lane_confirmation_tokens(c, Side::Client, 1).unwrap();
        let t0c = confirmation_tokens(c, Side::Client).unwrap();
        assert_ne!(t2c.mine, t1c.mine);
        assert_ne!(t1c.mine, t0c.mine);
    }

    #[test]
    fn the_control_channel_lists_the_cpu_s_fast_aead_first_and_keeps_every_suite() {
        use rustls::CipherSuite as S;
        let all = rustls::crypto::ring::default_provider().cipher_suites;
        for (first, want) in [
            (Cipher::ChaCha20Poly1305, S::TLS13_CHACHA20_POLY1305_SHA256),
            (Cipher::Aes256Gcm, S::TLS13_AES_256_GCM_SHA384),
        ] {
            let mut suites = all.clone();
            order_suites(&mut suites, first);
            assert_eq!(suites[0].suite(), want, "{first}");
            let mut names: Vec<_> = suites.iter().map(|s| u16::from(s.suite())).collect();
            let mut before: Vec<_> = all.iter().map(|s| u16::from(s.suite())).collect();
            names.sort_unstable();
            before.sort_unstable();
            assert_eq!(names, before, "{first}: a suite was lost or added");
        }
    }

    #[tokio::test]
    async fn the_server_chooses_the_control_channel_s_suite_by_its_own_cpu() {
        use rustls::CipherSuite as S;
        let dir = tempfile::tempdir().unwrap();
        crate::certs::init(dir.path(), &["localhost".to_owned()]).unwrap();
        crate::certs::issue_client(dir.path(), "alice").unwrap();
        let want = match Cipher::preferred() {
            Cipher::ChaCha20Poly1305 => S::TLS13_CHACHA20_POLY1305_SHA256,
            Cipher::Aes256Gcm => S::TLS13_AES_256_GCM_SHA384,
        };
        let (c, s) = session(dir.path()).await;
        assert_eq!(
            c.get_ref().1.negotiated_cipher_suite().unwrap().suite(),
            want
        );
        assert_eq!(
            s.get_ref().1.negotiated_cipher_suite().unwrap().suite(),
            want
        );
        // A client that prefers the other AEAD (another CPU, another library) still gets the
        // server's choice: the server does not seal in software because a client asked.
        let (ca, server) = (
            crate::certs::ca_paths(dir.path()),
            crate::certs::server_paths(dir.path()),
        );
        let alice = crate::certs::client_paths(dir.path(), "alice");
        let mut other = rustls::crypto::ring::default_provider();
        let opposite = match Cipher::preferred() {
            Cipher::ChaCha20Poly1305 => Cipher::Aes256Gcm,
            Cipher::Aes256Gcm => Cipher::ChaCha20Poly1305,
        };
        order_suites(&mut other.cipher_suites, opposite);
        let cc = ClientConfig::builder_with_provider(Arc::new(other))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .with_root_certificates(roots(&ca.cert).unwrap())
            .with_client_auth_cert(
                load_certs(&alice.cert).unwrap(),
                load_key(&alice.key).unwrap(),
            )
            .unwrap();
        let sc = server_config(&ca.cert, &server.cert, &server.key).unwrap();
        let (a, b) = tokio::io::duplex(1 << 16);
        let name = ServerName::try_from("localhost").unwrap();
        let (c, _s) = tokio::join!(
            tokio_rustls::TlsConnector::from(Arc::new(cc)).connect(name, a),
            tokio_rustls::TlsAcceptor::from(sc).accept(b)
        );
        let c = c.unwrap();
        assert_eq!(
            c.get_ref().1.negotiated_cipher_suite().unwrap().suite(),
            want
        );
    }

    #[tokio::test]
    async fn secrets_exported_before_the_cipher_is_chosen_make_the_same_keys_for_either_cipher() {
        let dir = tempfile::tempdir().unwrap();
        crate::certs::init(dir.path(), &["localhost".to_owned()]).unwrap();
        crate::certs::issue_client(dir.path(), "alice").unwrap();
        let (c, s) = session(dir.path()).await;
        let (c, s) = (c.get_ref().1, s.get_ref().1);
        for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
            // The client's, exported while its hello travels; the server's as it always was.
            let early =
                crate::protect::ProtectionSecrets::from_tls_lane(c, Side::Client, 0).unwrap();
            let mut client = early.protection(cipher);
            let mut server = Protection::from_tls(s, Side::Server, cipher).unwrap();
            let mut msg = seal(&mut client, b"sealed early");
            assert_eq!(
                server.opener.open(Op::Send, &mut msg).unwrap(),
                b"sealed early",
                "{cipher}"
            );
            // And the other way, after a rotation: the ratchet each direction rotates from
            // came early too (the opener follows the epoch of the header).
            server.sealer.rotate();
            let mut back = seal(&mut server, b"after a rotation");
            assert_eq!(
                client.opener.open(Op::Send, &mut back).unwrap(),
                b"after a rotation",
                "{cipher}"
            );
        }
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
