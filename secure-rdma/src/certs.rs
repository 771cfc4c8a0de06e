//! A small private PKI for a deployment: one CA, a server certificate, and a
//! certificate per client whose name is the client's identity (its tenant).
//!
//! Layout of the server's certificate directory:
//!
//! | file | what |
//! |---|---|
//! | `ca.pem` | the CA certificate (public: clients are verified against it) |
//! | `server.pem`, `server.key` | the server certificate (SANs: names and addresses) |
//! | `NAME.pem`, `NAME.key` | the client certificate of `NAME` |
//! | `crl.pem` | revoked client certificates ([`revoke`]), checked at every handshake |
//!
//! The CA key lives apart, in the CA directory (by default the sibling
//! `<certs>-ca`, mode 0700): whoever can read it can mint any identity, and the server never
//! needs it. [`init`] (used by tests and demos) keeps everything in one directory.
//!
//! Keys are written with mode 0600 and never overwritten by accident.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// Errors of certificate creation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CertError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file that would be overwritten exists.
    #[error("{0} already exists; remove it first or write to another directory")]
    Exists(PathBuf),
    /// The CA is missing: no CA was made there ([`init_with_ca_dir`]), or the
    /// CA lives in another directory.
    #[error("no CA key in {0}: make a CA first, or use the directory that holds it")]
    NoCa(PathBuf),
    /// A client name cannot be used as a file name and identity.
    #[error("invalid client name {0:?}: use 1-64 characters from a-z, A-Z, 0-9, '-', '_', '.' (not starting with '.')")]
    BadName(String),
    /// rcgen failed.
    #[error("certificate generation failed: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// [`revoke`] for a client that has no certificate here.
    #[error("{0} does not exist: no client certificate of that name to revoke")]
    NotIssued(PathBuf),
    /// A certificate or CRL that does not parse.
    #[error("{path}: not a valid {what}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it should have been.
        what: &'static str,
    },
}

/// Names that may not be used for a client: they would overwrite the CA or
/// server files.
const RESERVED: [&str; 2] = ["ca", "server"];

/// Checks a client name: it becomes a file name and the identity in logs.
pub fn validate_name(name: &str) -> Result<(), CertError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && !RESERVED.contains(&name)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(CertError::BadName(name.to_owned()))
    }
}

/// Paths of one identity's certificate and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pair {
    /// Certificate (PEM).
    pub cert: PathBuf,
    /// Private key (PEM, mode 0600).
    pub key: PathBuf,
}

impl Pair {
    fn in_dir(dir: &Path, stem: &str) -> Self {
        Pair {
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
        }
    }
}

/// The CA files in `dir`.
pub fn ca_paths(dir: &Path) -> Pair {
    Pair::in_dir(dir, "ca")
}

/// The server files in `dir`.
pub fn server_paths(dir: &Path) -> Pair {
    Pair::in_dir(dir, "server")
}

/// The files of client `name` in `dir`.
pub fn client_paths(dir: &Path, name: &str) -> Pair {
    Pair::in_dir(dir, name)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io {
        path: path.to_owned(),
        source,
    }
}

fn write_new(path: &Path, contents: &str, mode: u32) -> Result<(), CertError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                CertError::Exists(path.to_owned())
            } else {
                CertError::Io {
                    path: path.to_owned(),
                    source: e,
                }
            }
        })?;
    f.write_all(contents.as_bytes()).map_err(io(path))
}

fn write_pair(pair: &Pair, cert_pem: &str, key: &KeyPair) -> Result<(), CertError> {
    for p in [&pair.cert, &pair.key] {
        if p.exists() {
            return Err(CertError::Exists(p.clone()));
        }
    }
    write_new(&pair.key, &key.serialize_pem(), 0o600)?;
    write_new(&pair.cert, cert_pem, 0o644)
}

fn leaf_params(cn: &str, sans: Vec<SanType>, eku: ExtendedKeyUsagePurpose) -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, cn);
    dn.push(DnType::OrganizationName, "secure-rdma");
    p.distinguished_name = dn;
    p.subject_alt_names = sans;
    p.is_ca = IsCa::ExplicitNoCa;
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![eku];
    let now = OffsetDateTime::now_utc();
    p.not_before = now - Duration::hours(1);
    p.not_after = now + Duration::days(365);
    p
}

fn san(name: &str) -> Result<SanType, CertError> {
    Ok(match name.parse::<IpAddr>() {
        Ok(ip) => SanType::IpAddress(ip),
        Err(_) => SanType::DnsName(name.try_into()?),
    })
}

/// What [`init`] created.
#[derive(Debug)]
pub struct Created {
    /// The CA files.
    pub ca: Pair,
    /// The server files.
    pub server: Pair,
    /// The server certificate's subject alternative names.
    pub sans: Vec<String>,
}

/// Creates a CA and a server certificate valid for `sans` (DNS names or IP
/// addresses) in `dir`, refusing to overwrite existing files.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// let made = secure_rdma::certs::init(dir.path(), &["localhost".into(), "10.77.0.1".into()]).unwrap();
/// assert!(made.ca.cert.exists() && made.server.key.exists());
/// ```
pub fn init(dir: &Path, sans: &[String]) -> Result<Created, CertError> {
    init_with_ca_dir(dir, dir, sans)
}

/// The CA directory of certificate directory `dir` unless told otherwise: its sibling
/// `<dir>-ca` (`certs` → `certs-ca`).
pub fn default_ca_dir(dir: &Path) -> PathBuf {
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "certs".to_owned());
    dir.with_file_name(format!("{name}-ca"))
}

/// Like [`init`], but the CA certificate and key go to `ca_dir` (created mode 0700) and only
/// the CA certificate is copied into `dir`: the server's directory never holds the CA key.
///
/// ```
/// let root = tempfile::tempdir().unwrap();
/// let (dir, ca_dir) = (root.path().join("certs"), root.path().join("certs-ca"));
/// secure_rdma::certs::init_with_ca_dir(&dir, &ca_dir, &["localhost".into()]).unwrap();
/// assert!(ca_dir.join("ca.key").exists() && !dir.join("ca.key").exists());
/// assert!(dir.join("ca.pem").exists() && dir.join("server.key").exists());
/// ```
pub fn init_with_ca_dir(dir: &Path, ca_dir: &Path, sans: &[String]) -> Result<Created, CertError> {
    use std::os::unix::fs::DirBuilderExt;
    fs::create_dir_all(dir).map_err(io(dir))?;
    if !ca_dir.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(ca_dir)
            .map_err(io(ca_dir))?;
    }
    let ca = ca_paths(ca_dir);
    let server = server_paths(dir);
    let public_ca = ca_paths(dir).cert;
    for p in [&ca.cert, &ca.key, &server.cert, &server.key, &public_ca] {
        if p.exists() {
            return Err(CertError::Exists(p.clone()));
        }
    }
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "secure-rdma CA");
    dn.push(DnType::OrganizationName, "secure-rdma");
    ca_params.distinguished_name = dn;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let now = OffsetDateTime::now_utc();
    ca_params.not_before = now - Duration::hours(1);
    ca_params.not_after = now + Duration::days(3650);
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, &ca_key);

    let san_types = sans.iter().map(|s| san(s)).collect::<Result<Vec<_>, _>>()?;
    let server_key = KeyPair::generate()?;
    let server_cert = leaf_params(
        "secure-rdma server",
        san_types,
        ExtendedKeyUsagePurpose::ServerAuth,
    )
    .signed_by(&server_key, &issuer)?;

    write_pair(&ca, &ca_cert.pem(), &ca_key)?;
    if public_ca != ca.cert {
        write_new(&public_ca, &ca_cert.pem(), 0o644)?;
    }
    write_pair(&server, &server_cert.pem(), &server_key)?;
    Ok(Created {
        ca,
        server,
        sans: sans.to_vec(),
    })
}

/// Issues a client certificate for `name` (its identity) signed by the CA in
/// `dir`.
pub fn issue_client(dir: &Path, name: &str) -> Result<Pair, CertError> {
    issue_client_from(dir, dir, name)
}

/// The CA key and certificate of `ca_dir`.
fn load_ca(ca_dir: &Path) -> Result<(String, KeyPair), CertError> {
    let ca = ca_paths(ca_dir);
    if !ca.cert.exists() || !ca.key.exists() {
        return Err(CertError::NoCa(ca_dir.to_owned()));
    }
    let ca_key_pem = fs::read_to_string(&ca.key).map_err(io(&ca.key))?;
    let ca_cert_pem = fs::read_to_string(&ca.cert).map_err(io(&ca.cert))?;
    Ok((ca_cert_pem, KeyPair::from_pem(&ca_key_pem)?))
}

/// Issues a client certificate for `name` signed by the CA in `ca_dir`, written to `dir`.
pub fn issue_client_from(ca_dir: &Path, dir: &Path, name: &str) -> Result<Pair, CertError> {
    issue_client_with_spiffe_id(ca_dir, dir, name, None)
}

/// [`issue_client_from`], and with `spiffe_id` the certificate is an X509-SVID: that SPIFFE ID
/// is its one URI SAN, and the server (identities from SPIFFE IDs, the default) knows the
/// client by it rather than by `name`, which still names the files.
///
/// ```
/// use secure_rdma::quota::spiffe::SpiffeId;
///
/// let dir = tempfile::tempdir().unwrap();
/// secure_rdma::certs::init(dir.path(), &["localhost".into()]).unwrap();
/// let id: SpiffeId = "spiffe://example.org/ns/prod/sa/api".parse().unwrap();
/// let pair = secure_rdma::certs::issue_client_with_spiffe_id(dir.path(), dir.path(), "api", Some(&id)).unwrap();
/// let cert = secure_rdma::tls::load_certs(&pair.cert).unwrap();
/// assert_eq!(secure_rdma::tls::identity_of(&cert[0]).unwrap(), id.as_str());
/// ```
pub fn issue_client_with_spiffe_id(
    ca_dir: &Path,
    dir: &Path,
    name: &str,
    spiffe_id: Option<&crate::quota::spiffe::SpiffeId>,
) -> Result<Pair, CertError> {
    validate_name(name)?;
    let (ca_cert_pem, ca_key) = load_ca(ca_dir)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert_pem, &ca_key)?;
    let key = KeyPair::generate()?;
    let mut sans = vec![san(name)?];
    if let Some(id) = spiffe_id {
        sans.push(SanType::URI(id.as_str().try_into()?));
    }
    let cert =
        leaf_params(name, sans, ExtendedKeyUsagePurpose::ClientAuth).signed_by(&key, &issuer)?;
    let pair = client_paths(dir, name);
    write_pair(&pair, &cert.pem(), &key)?;
    Ok(pair)
}

/// Where the server reads revoked certificates: `dir/crl.pem`.
pub fn crl_path(dir: &Path) -> PathBuf {
    dir.join("crl.pem")
}

/// What [`revoke`] did.
#[derive(Debug)]
pub struct Revoked {
    /// The CRL written.
    pub crl: PathBuf,
    /// Certificates it lists, this one included.
    pub count: usize,
}

fn parse_err(path: &Path, what: &'static str) -> CertError {
    CertError::Parse {
        path: path.to_owned(),
        what,
    }
}

/// Revokes client `name`: adds its certificate's serial to `dir/crl.pem`, signed by the CA in
/// `ca_dir` (a new CRL that keeps every earlier revocation). A running server reloads the CRL
/// when it changes, without a restart: the client's live sessions end within a second, and its
/// next connection is refused at TLS.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// secure_rdma::certs::init(dir.path(), &["localhost".into()]).unwrap();
/// secure_rdma::certs::issue_client(dir.path(), "bob").unwrap();
/// let r = secure_rdma::certs::revoke(dir.path(), dir.path(), "bob").unwrap();
/// assert_eq!(r.count, 1);
/// ```
pub fn revoke(ca_dir: &Path, dir: &Path, name: &str) -> Result<Revoked, CertError> {
    use rcgen::{
        CertificateRevocationListParams, KeyIdMethod, RevocationReason, RevokedCertParams,
        SerialNumber,
    };
    validate_name(name)?;
    let cert_path = client_paths(dir, name).cert;
    if !cert_path.exists() {
        return Err(CertError::NotIssued(cert_path));
    }
    let pem = fs::read(&cert_path).map_err(io(&cert_path))?;
    let (_, parsed) =
        x509_parser::pem::parse_x509_pem(&pem).map_err(|_| parse_err(&cert_path, "certificate"))?;
    let cert = parsed
        .parse_x509()
        .map_err(|_| parse_err(&cert_path, "certificate"))?;
    let serial = cert.raw_serial().to_vec();

    let crl = crl_path(dir);
    let now = OffsetDateTime::now_utc();
    let mut revoked: Vec<RevokedCertParams> = Vec::new();
    if crl.exists() {
        let pem = fs::read(&crl).map_err(io(&crl))?;
        let (_, parsed) =
            x509_parser::pem::parse_x509_pem(&pem).map_err(|_| parse_err(&crl, "CRL"))?;
        let (_, old) =
            x509_parser::parse_x509_crl(&parsed.contents).map_err(|_| parse_err(&crl, "CRL"))?;
        for r in old.iter_revoked_certificates() {
            revoked.push(RevokedCertParams {
                serial_number: SerialNumber::from_slice(r.raw_serial()),
                revocation_time: OffsetDateTime::from_unix_timestamp(r.revocation_date.timestamp())
                    .unwrap_or(now),
                reason_code: Some(RevocationReason::CessationOfOperation),
                invalidity_date: None,
            });
        }
    }
    let serial_number = SerialNumber::from_slice(&serial);
    if !revoked.iter().any(|r| r.serial_number == serial_number) {
        revoked.push(RevokedCertParams {
            serial_number,
            revocation_time: now,
            reason_code: Some(RevocationReason::CessationOfOperation),
            invalidity_date: None,
        });
    }
    let (ca_cert_pem, ca_key) = load_ca(ca_dir)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert_pem, &ca_key)?;
    let count = revoked.len();
    let params = CertificateRevocationListParams {
        this_update: now - Duration::minutes(5),
        next_update: now + Duration::days(365),
        // Seconds since the epoch: increases with every CRL this CA issues.
        crl_number: SerialNumber::from(u64::try_from(now.unix_timestamp()).unwrap_or(0)),
        issuing_distribution_point: None,
        revoked_certs: revoked,
        key_identifier_method: KeyIdMethod::Sha256,
    };
    let signed = params.signed_by(&issuer)?;
    // Replace atomically: the server may read it at any moment.
    let tmp = dir.join(".crl.pem.tmp");
    let _ = fs::remove_file(&tmp);
    write_new(&tmp, &signed.pem()?, 0o644)?;
    fs::rename(&tmp, &crl).map_err(io(&crl))?;
    Ok(Revoked { crl, count })
}

/// Issues a client certificate for `name` signed by the CA in `ca_dir`, written to `dir`, that
/// expires `valid_for` from now (short-lived certificates, as SPIRE or Vault issue them; a
/// server ends a session when its certificate's notAfter passes). Valid from a minute ago, so
/// a clock a little behind still accepts it. notAfter has a resolution of one second.
///
/// ```
/// let dir = tempfile::tempdir().unwrap();
/// secure_rdma::certs::init(dir.path(), &["localhost".into()]).unwrap();
/// let p = secure_rdma::certs::issue_client_valid_for(
///     dir.path(), dir.path(), "eve", std::time::Duration::from_secs(30)).unwrap();
/// assert!(p.cert.exists());
/// ```
pub fn issue_client_valid_for(
    ca_dir: &Path,
    dir: &Path,
    name: &str,
    valid_for: std::time::Duration,
) -> Result<Pair, CertError> {
    validate_name(name)?;
    let (ca_cert_pem, ca_key) = load_ca(ca_dir)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert_pem, &ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = leaf_params(name, vec![san(name)?], ExtendedKeyUsagePurpose::ClientAuth);
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::minutes(1);
    params.not_after = now + Duration::try_from(valid_for).unwrap_or(Duration::MAX);
    let cert = params.signed_by(&key, &issuer)?;
    let pair = client_paths(dir, name);
    write_pair(&pair, &cert.pem(), &key)?;
    Ok(pair)
}

/// Replaces the server's certificate and key in `dir` with new ones for `sans`, signed by the
/// CA in `ca_dir` (a renewal: nothing else changes). Each file is replaced atomically (a new
/// file renamed over the old), the key first; a running server reloads the pair once both
/// are in place.
pub fn reissue_server(ca_dir: &Path, dir: &Path, sans: &[String]) -> Result<Pair, CertError> {
    let (ca_cert_pem, ca_key) = load_ca(ca_dir)?;
    let issuer = Issuer::from_ca_cert_pem(&ca_cert_pem, &ca_key)?;
    let san_types = sans.iter().map(|s| san(s)).collect::<Result<Vec<_>, _>>()?;
    let key = KeyPair::generate()?;
    let cert = leaf_params(
        "secure-rdma server",
        san_types,
        ExtendedKeyUsagePurpose::ServerAuth,
    )
    .signed_by(&key, &issuer)?;
    let pair = server_paths(dir);
    for (path, contents, mode) in [
        (&pair.key, key.serialize_pem(), 0o600),
        (&pair.cert, cert.pem(), 0o644),
    ] {
        let tmp = path.with_extension("new.tmp");
        let _ = fs::remove_file(&tmp);
        write_new(&tmp, &contents, mode)?;
        fs::rename(&tmp, path).map_err(io(path))?;
    }
    Ok(pair)
}

/// Default SANs of a server certificate: `localhost`, the loopback
/// addresses and every address configured on this host.
pub fn default_sans() -> Vec<String> {
    let mut sans = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    for ip in host_addresses() {
        let s = ip.to_string();
        if !sans.contains(&s) {
            sans.push(s);
        }
    }
    sans
}

/// The unicast addresses configured on this host's interfaces.
pub fn host_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a linked list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return out;
    }
    let mut cur = ifap;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list returned by getifaddrs.
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of the family it names.
            let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
            if family == libc::AF_INET {
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                out.push(IpAddr::from(
                    u32::from_be(sin.sin_addr.s_addr).to_be_bytes(),
                ));
            } else if family == libc::AF_INET6 {
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                // Link-local addresses need a scope and are useless as SANs.
                if ip.segments()[0] & 0xffc0 != 0xfe80 {
                    out.push(IpAddr::V6(ip));
                }
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: allocated by getifaddrs above.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn init_then_issue_writes_private_keys_0600_and_refuses_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let made = init(dir.path(), &["localhost".into(), "10.77.0.1".into()]).unwrap();
        let alice = issue_client(dir.path(), "alice").unwrap();
        for key in [&made.ca.key, &made.server.key, &alice.key] {
            let mode = fs::metadata(key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        assert!(matches!(
            init(dir.path(), &["localhost".into()]),
            Err(CertError::Exists(_))
        ));
        assert!(matches!(
            issue_client(dir.path(), "alice"),
            Err(CertError::Exists(_))
        ));
    }

    #[test]
    fn client_names_are_checked() {
        for bad in [
            "",
            "../x",
            "a/b",
            ".hidden",
            "ca",
            "server",
            "sp ace",
            &"x".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["alice", "client-1", "tenant_a.prod"] {
            validate_name(good).unwrap();
        }
    }

    // What secure-server says about it (how to make a CA) is tested in its hints module.
    #[test]
    fn issuing_without_a_ca_says_the_ca_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let err = issue_client(dir.path(), "bob").unwrap_err();
        assert!(
            matches!(&err, CertError::NoCa(d) if d == dir.path()),
            "{err}"
        );
    }

    #[test]
    fn default_sans_include_localhost() {
        let sans = default_sans();
        assert!(sans.contains(&"localhost".to_owned()));
        assert!(sans.contains(&"127.0.0.1".to_owned()));
    }
}
