//! The server's TLS material, kept current while the server runs, and the
//! live sessions it may have to end.
//!
//! A background task ([`watch`]) looks at the four files (CA bundle, server
//! certificate, its key, CRL) every [`POLL`], not only when a connection
//! arrives. A file whose stamp (inode, size, modification and change times)
//! changed and then held still for one more look is reloaded on its own: a
//! new server certificate and key are presented from the next handshake on,
//! a new CA bundle verifies the next clients, a new CRL refuses the next
//! handshakes of the certificates it lists **and** ends the live sessions of
//! those certificates ([`Live`]). Live sessions are never touched by a reload
//! that revokes nothing.
//!
//! Fail closed: a file that disappears or does not parse (or a key that does
//! not match its certificate) keeps the last good material in force, with a
//! warning and `secure_rdma_cert_reload_failures_total{file}`. A deleted CRL
//! therefore keeps refusing what it listed.
//!
//! TLS resumption: the session cache is kept across reloads, so a reload
//! that revokes nothing (a new server certificate, a CRL re-signed with the
//! same entries) keeps resumption working. A resumed handshake is not
//! verified again, so the cache is replaced when the CRL lists a
//! certificate it did not list before or when the CA bundle changes: every
//! client then makes a full handshake, checked against the new material.
//! Each session's certificate is also checked when it registers ([`Live`]),
//! which covers a resumed session whose certificate has expired since.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use rustls::server::{StoresServerSessions, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::RootCertStore;
use tokio::sync::{oneshot, watch as tokio_watch};
use tokio_rustls::TlsAcceptor;

use super::ServerConfig;
use crate::metrics::ServerMetrics;
use crate::tls::{self, TlsError};

/// How often the files are looked at (and at every accepted connection). A new CRL is acted on
/// at the first look that sees it: a revocation ends its sessions within one poll plus the work,
/// far inside the promised second.
pub const POLL: Duration = Duration::from_millis(50);

/// How long the server's certificate and key must hold still before they are read as a pair.
const PAIR_HOLD: Duration = Duration::from_millis(50);

/// Sessions a server remembers for resumption (the oldest are forgotten first, and their
/// clients make a full handshake).
const SESSION_CACHE: usize = 1024;

/// One of the watched files, as named in the metrics' `file` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CertFile {
    /// The CA bundle client certificates are verified against.
    Ca,
    /// The server's certificate chain.
    Cert,
    /// The server's private key.
    Key,
    /// The certificate revocation list.
    Crl,
}

impl CertFile {
    /// Every file, in the order they are looked at.
    pub const ALL: [CertFile; 4] = [CertFile::Ca, CertFile::Cert, CertFile::Key, CertFile::Crl];

    /// The `file` label of the reload metrics.
    pub fn label(self) -> &'static str {
        match self {
            CertFile::Ca => "ca",
            CertFile::Cert => "cert",
            CertFile::Key => "key",
            CertFile::Crl => "crl",
        }
    }
}

/// Why the server ends a live session because of its client's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CertEnd {
    /// The CRL lists the certificate.
    Revoked,
    /// The certificate's notAfter has passed (seconds since the epoch).
    Expired { not_after: i64 },
}

/// What identifies a certificate in a CRL: its issuer's encoded name and its serial (leading
/// zero bytes dropped, as encoders differ on them).
type CertId = (Vec<u8>, Vec<u8>);

fn serial_key(raw: &[u8]) -> Vec<u8> {
    let first = raw.iter().position(|b| *b != 0).unwrap_or(raw.len());
    raw[first..].to_vec()
}

/// A file's identity and version as `stat` sees it; `None` when it does not exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn stamp(path: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        dev: m.dev(),
        ino: m.ino(),
        len: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

/// Where a watched file stands: what was last seen (and since when), and what was last acted
/// on.
#[derive(Debug, Clone, Copy)]
struct Watched {
    seen: Option<Stamp>,
    seen_since: Instant,
    acted: Option<Stamp>,
}

impl Watched {
    fn at(stamp: Option<Stamp>) -> Watched {
        Watched {
            seen: stamp,
            seen_since: Instant::now(),
            acted: stamp,
        }
    }

    /// What this look at the file says: changed and unchanged for `hold`, it has settled.
    fn look(&mut self, now: Option<Stamp>, hold: Duration) -> Look {
        if now != self.seen {
            self.seen = now;
            self.seen_since = Instant::now();
        }
        if now == self.acted {
            Look::Unchanged
        } else if self.seen_since.elapsed() >= hold {
            Look::Settled
        } else {
            Look::Moving
        }
    }
}

/// A file since it was last acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// As it was.
    Unchanged,
    /// Changed a moment ago: maybe still being replaced.
    Moving,
    /// Changed, and held still long enough to be read.
    Settled,
}

/// The material in force: the last good version of each file.
struct Material {
    roots: Arc<RootCertStore>,
    /// The CA bundle's certificates, which must have signed a CRL.
    ca_certs: Vec<CertificateDer<'static>>,
    crls: Vec<CertificateRevocationListDer<'static>>,
    /// The certificates the CRL lists.
    revoked: HashSet<CertId>,
    key: Arc<CertifiedKey>,
    /// Kept across reloads that revoke nothing (see the module docs).
    cache: Arc<dyn StoresServerSessions>,
    acceptor: TlsAcceptor,
    files: HashMap<CertFile, Watched>,
}

/// The TLS material of a running server, the acceptor built from it, and the live sessions
/// whose certificates a reload may end.
pub(super) struct Credentials {
    paths: Paths,
    material: Mutex<Material>,
    live: Live,
}

#[derive(Debug, Clone)]
struct Paths {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    crl: Option<PathBuf>,
}

impl Paths {
    fn of(&self, file: CertFile) -> Option<&Path> {
        match file {
            CertFile::Ca => Some(&self.ca),
            CertFile::Cert => Some(&self.cert),
            CertFile::Key => Some(&self.key),
            CertFile::Crl => self.crl.as_deref(),
        }
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_err(path: &Path, source: rustls::pki_types::pem::Error) -> TlsError {
    TlsError::Pem {
        path: path.display().to_string(),
        source,
    }
}

/// The trust anchors of a CA bundle, and its certificates (to check a CRL's signature).
fn load_roots(ca: &Path) -> Result<(Arc<RootCertStore>, Vec<CertificateDer<'static>>), TlsError> {
    let certs = tls::load_certs(ca)?;
    let mut roots = RootCertStore::empty();
    for cert in &certs {
        roots.add(cert.clone()).map_err(|source| TlsError::BadCa {
            path: ca.display().to_string(),
            source,
        })?;
    }
    Ok((Arc::new(roots), certs))
}

/// Why a changed CRL is not taken.
#[derive(Debug, thiserror::Error)]
enum CrlError {
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("{path}: not a CRL ({detail})")]
    NotCrl { path: String, detail: String },
    #[error(
        "{path}: not signed by a CA of the bundle; sign it with the CA whose clients it revokes"
    )]
    Unsigned { path: String },
}

fn load_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = tls::load_certs(cert)?;
    let key = tls::load_key(key)?;
    // Also checks that the key is the certificate's: a certificate replaced without its key
    // (or the reverse) is refused and the previous pair kept.
    Ok(Arc::new(CertifiedKey::from_der(chain, key, &provider())?))
}

/// The CRLs of a PEM file and the certificates they list. Each must be signed by a CA of
/// `cas`: only then may it end live sessions (and a CRL webpki could not verify would refuse
/// every client of its issuer).
fn load_crls(
    path: &Path,
    cas: &[CertificateDer<'static>],
) -> Result<(Vec<CertificateRevocationListDer<'static>>, HashSet<CertId>), CrlError> {
    let crls = CertificateRevocationListDer::pem_file_iter(path)
        .map_err(|e| pem_err(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(path, e))?;
    if crls.is_empty() {
        return Err(pem_err(path, rustls::pki_types::pem::Error::NoItemsFound).into());
    }
    let cas: Vec<_> = cas
        .iter()
        .filter_map(|c| x509_parser::parse_x509_certificate(c.as_ref()).ok())
        .map(|(_, ca)| ca)
        .collect();
    let mut revoked = HashSet::new();
    for crl in &crls {
        let (_, parsed) =
            x509_parser::parse_x509_crl(crl.as_ref()).map_err(|e| CrlError::NotCrl {
                path: path.display().to_string(),
                detail: e.to_string(),
            })?;
        let issuer = parsed.issuer().as_raw();
        let signed = cas.iter().any(|ca| {
            ca.subject().as_raw() == issuer && parsed.verify_signature(ca.public_key()).is_ok()
        });
        if !signed {
            return Err(CrlError::Unsigned {
                path: path.display().to_string(),
            });
        }
        for r in parsed.iter_revoked_certificates() {
            revoked.insert((issuer.to_vec(), serial_key(r.raw_serial())));
        }
    }
    Ok((crls, revoked))
}

fn build(
    roots: &Arc<RootCertStore>,
    crls: &[CertificateRevocationListDer<'static>],
    key: &Arc<CertifiedKey>,
    cache: &Arc<dyn StoresServerSessions>,
) -> Result<TlsAcceptor, TlsError> {
    let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::clone(roots), provider());
    if !crls.is_empty() {
        // The CA signs only end-entity certificates, and only its own CRL exists.
        verifier = verifier
            .with_crls(crls.iter().cloned())
            .only_check_end_entity_revocation();
    }
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier.build()?)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(Arc::clone(key))));
    // Resumption skips the certificate signatures, a third of the setup under emulation.
    // rustls sends two tickets per handshake, so a client may open two connections at once
    // and resume both.
    config.session_storage = Arc::clone(cache);
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn new_cache() -> Arc<dyn StoresServerSessions> {
    rustls::server::ServerSessionMemoryCache::new(SESSION_CACHE)
}

impl Credentials {
    /// Loads the CA, the server's certificate and key, and the CRL if its file exists.
    pub(super) fn new(cfg: &ServerConfig) -> Result<Credentials, TlsError> {
        let paths = Paths {
            ca: cfg.ca.clone(),
            cert: cfg.cert.clone(),
            key: cfg.key.clone(),
            crl: cfg.crl.clone(),
        };
        let files: HashMap<_, _> = CertFile::ALL
            .iter()
            .map(|f| (*f, Watched::at(paths.of(*f).and_then(stamp))))
            .collect();
        let (roots, ca_certs) = load_roots(&paths.ca)?;
        let key = load_key(&paths.cert, &paths.key)?;
        let (crls, revoked) = match &paths.crl {
            Some(crl) if crl.exists() => load_crls(crl, &ca_certs).map_err(|e| match e {
                CrlError::Tls(e) => e,
                other => TlsError::Config(rustls::Error::General(other.to_string())),
            })?,
            _ => (Vec::new(), HashSet::new()),
        };
        let cache = new_cache();
        let acceptor = build(&roots, &crls, &key, &cache)?;
        Ok(Credentials {
            paths,
            material: Mutex::new(Material {
                roots,
                ca_certs,
                crls,
                revoked,
                key,
                cache,
                acceptor,
                files,
            }),
            live: Live::default(),
        })
    }

    /// The TLS acceptor for a new connection: the material in force now, after a look at the
    /// files (a few `stat`s), so a revocation made just before applies to this handshake even if
    /// the watcher has not looked yet.
    pub(super) fn current(&self, metrics: &ServerMetrics) -> TlsAcceptor {
        self.poll(metrics);
        self.lock().acceptor.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Material> {
        self.material.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Looks at the files once and reloads each that changed and settled; then ends the live
    /// sessions a new CRL revokes. Returns how many sessions it ended.
    pub(super) fn poll(&self, metrics: &ServerMetrics) -> usize {
        let started = Instant::now();
        let mut m = self.lock();
        let mut looks = HashMap::new();
        for file in CertFile::ALL {
            let Some(path) = self.paths.of(file) else {
                continue;
            };
            let now = stamp(path);
            // The CA bundle and the CRL are read as soon as they change (`certs revoke`
            // replaces the CRL atomically; one caught half-written fails, keeps the last good
            // one, and is read again when its writer finishes, which changes it again). The
            // certificate and its key are two files replaced one after the other: each must
            // hold still for PAIR_HOLD first.
            let hold = match file {
                CertFile::Cert | CertFile::Key => PAIR_HOLD,
                CertFile::Ca | CertFile::Crl => Duration::ZERO,
            };
            if let Some(w) = m.files.get_mut(&file) {
                looks.insert(file, w.look(now, hold));
            }
        }
        let look = |f: CertFile| looks.get(&f).copied().unwrap_or(Look::Unchanged);
        let mut changed: Vec<CertFile> = [CertFile::Ca, CertFile::Crl]
            .into_iter()
            .filter(|f| look(*f) == Look::Settled)
            .collect();
        // The certificate and its key are one pair: acted on once neither is moving, so a
        // pair replaced file by file is not read half new, half old.
        let pair = [CertFile::Cert, CertFile::Key];
        if pair.iter().any(|f| look(*f) == Look::Settled)
            && pair.iter().all(|f| look(*f) != Look::Moving)
        {
            changed.extend(pair.into_iter().filter(|f| look(*f) == Look::Settled));
        }
        for f in &changed {
            if let Some(w) = m.files.get_mut(f) {
                w.acted = w.seen;
            }
        }
        if changed.is_empty() {
            return 0;
        }
        let fail = |file: CertFile, why: &dyn std::fmt::Display| {
            metrics.cert_reload_failed(file.label());
            tracing::warn!(
                file = file.label(),
                path = %self.paths.of(file).map(Path::display).map(|d| d.to_string()).unwrap_or_default(),
                "{why}; keeping the last good one in force (fail closed)"
            );
        };
        let mut roots = Arc::clone(&m.roots);
        let mut ca_certs = m.ca_certs.clone();
        let mut crls = m.crls.clone();
        let mut revoked = m.revoked.clone();
        let mut key = Arc::clone(&m.key);
        let mut fresh_cache = false;
        let mut reloaded = Vec::new();
        if changed.contains(&CertFile::Ca) {
            match load_roots(&self.paths.ca) {
                Ok((r, certs)) => {
                    roots = r;
                    ca_certs = certs;
                    // A CA removed from the bundle must not keep its clients through resumption.
                    fresh_cache = true;
                    reloaded.push(CertFile::Ca);
                }
                Err(e) => fail(
                    CertFile::Ca,
                    &format_args!("the CA bundle cannot be loaded ({e})"),
                ),
            }
        }
        if changed.contains(&CertFile::Cert) || changed.contains(&CertFile::Key) {
            match load_key(&self.paths.cert, &self.paths.key) {
                Ok(k) => {
                    key = k;
                    reloaded.extend(
                        [CertFile::Cert, CertFile::Key]
                            .into_iter()
                            .filter(|f| changed.contains(f)),
                    );
                }
                Err(e) => {
                    let file = if changed.contains(&CertFile::Cert) {
                        CertFile::Cert
                    } else {
                        CertFile::Key
                    };
                    fail(
                        file,
                        &format_args!("the server certificate and key cannot be loaded ({e})"),
                    )
                }
            }
        }
        let mut newly_revoked = false;
        if changed.contains(&CertFile::Crl) {
            match self.paths.crl.as_deref() {
                Some(path) if !path.exists() => {
                    if m.crls.is_empty() {
                        // There never was one: nothing to keep, nothing wrong.
                    } else {
                        fail(
                            CertFile::Crl,
                            &format_args!("the CRL disappeared; its revocations stay in force"),
                        )
                    }
                }
                Some(path) => match load_crls(path, &ca_certs) {
                    Ok((c, r)) => {
                        newly_revoked = r.difference(&m.revoked).next().is_some();
                        // A CRL that no longer lists a certificate un-revokes it: the CA signed
                        // it (checked above), so its word stands.
                        crls = c;
                        revoked = r;
                        reloaded.push(CertFile::Crl);
                    }
                    Err(e) => fail(
                        CertFile::Crl,
                        &format_args!("the CRL cannot be loaded ({e})"),
                    ),
                },
                None => {}
            }
        }
        if reloaded.is_empty() {
            return 0;
        }
        // The live sessions a CA-signed CRL revokes end first: the one-second promise should
        // not wait for the new TLS configuration to be built.
        let mut ended = 0;
        if revoked != m.revoked {
            m.revoked = revoked;
            ended = self.live.revoke(&m.revoked);
            // Counted by each session as it ends (with the sessions refused at registration).
            if ended > 0 {
                tracing::warn!(
                    sessions = ended,
                    "the new CRL revokes live sessions' certificates; ending them"
                );
            }
        }
        let cache = if fresh_cache || newly_revoked {
            new_cache()
        } else {
            Arc::clone(&m.cache)
        };
        match build(&roots, &crls, &key, &cache) {
            Ok(acceptor) => {
                m.acceptor = acceptor;
                m.roots = roots;
                m.ca_certs = ca_certs;
                m.crls = crls;
                m.key = key;
                m.cache = cache;
                for f in &reloaded {
                    metrics.cert_reloaded(f.label());
                }
                tracing::info!(
                    files = ?reloaded.iter().map(|f| f.label()).collect::<Vec<_>>(),
                    resumption_reset = fresh_cache || newly_revoked,
                    took_us = started.elapsed().as_micros() as u64,
                    "TLS material reloaded; new handshakes use it"
                );
            }
            Err(e) => {
                // webpki refused the combination. The revocations of a CA-signed CRL stay in
                // force for live sessions and registrations all the same (fail closed).
                for f in reloaded {
                    fail(
                        f,
                        &format_args!("the reloaded TLS material is refused ({e})"),
                    );
                }
            }
        }
        ended
    }

    /// Registers a session of the client whose certificate is `cert`: it ends (with the
    /// returned [`LiveSession::ended`]) when a CRL revokes the certificate or its notAfter
    /// passes. A certificate already revoked or expired ends it at once.
    pub(super) fn register(&self, cert: &CertificateDer<'_>) -> LiveSession<'_> {
        let parsed = x509_parser::parse_x509_certificate(cert.as_ref()).ok();
        let (id, not_after) = match &parsed {
            Some((_, x509)) => (
                Some((
                    x509.issuer().as_raw().to_vec(),
                    serial_key(x509.raw_serial()),
                )),
                x509.validity().not_after.timestamp(),
            ),
            // The verifier accepted it, but if this parser cannot read it neither its
            // revocation nor its expiry could be followed: fail closed, end it at once.
            None => (None, 0),
        };
        // Checked under the material's lock: a CRL reloaded while this registers either sees
        // the session or is seen by it.
        let m = self.lock();
        let revoked = id.as_ref().is_some_and(|id| m.revoked.contains(id));
        self.live.add(id, not_after, revoked)
    }
}

/// Live sessions by certificate, so a new CRL can end those it revokes.
#[derive(Default)]
pub(super) struct Live(Mutex<LiveInner>);

#[derive(Default)]
struct LiveInner {
    next: u64,
    sessions: HashMap<u64, (Option<CertId>, oneshot::Sender<CertEnd>)>,
}

impl Live {
    fn inner(&self) -> std::sync::MutexGuard<'_, LiveInner> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, id: Option<CertId>, not_after: i64, revoked: bool) -> LiveSession<'_> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.inner();
        let key = inner.next;
        inner.next += 1;
        if revoked {
            let _ = tx.send(CertEnd::Revoked);
        } else {
            inner.sessions.insert(key, (id, tx));
        }
        LiveSession {
            live: self,
            key,
            rx,
            not_after,
        }
    }

    /// Ends every session whose certificate `revoked` lists; returns how many.
    fn revoke(&self, revoked: &HashSet<CertId>) -> usize {
        let mut inner = self.inner();
        let hit: Vec<u64> = inner
            .sessions
            .iter()
            .filter(|(_, (id, _))| id.as_ref().is_some_and(|id| revoked.contains(id)))
            .map(|(k, _)| *k)
            .collect();
        let mut ended = 0;
        for k in hit {
            if let Some((_, tx)) = inner.sessions.remove(&k) {
                if tx.send(CertEnd::Revoked).is_ok() {
                    ended += 1;
                }
            }
        }
        ended
    }

    /// Sessions registered now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner().sessions.len()
    }
}

/// One registered session: resolves [`LiveSession::ended`] when its certificate is revoked
/// or expires; unregisters when dropped.
pub(super) struct LiveSession<'a> {
    live: &'a Live,
    key: u64,
    rx: oneshot::Receiver<CertEnd>,
    not_after: i64,
}

impl LiveSession<'_> {
    /// Why the session must end now, if it must already (a revoked or expired certificate at
    /// registration).
    pub(super) fn already_ended(&mut self) -> Option<CertEnd> {
        if let Ok(end) = self.rx.try_recv() {
            return Some(end);
        }
        (self.until_expiry() == Duration::ZERO).then_some(CertEnd::Expired {
            not_after: self.not_after,
        })
    }

    fn until_expiry(&self) -> Duration {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        // notAfter is inclusive (RFC 5280): the certificate is valid through that second.
        let end = Duration::from_secs(u64::try_from(self.not_after).unwrap_or(0) + 1);
        end.saturating_sub(now)
    }

    /// Resolves when the session must end because of its certificate. Cancel-safe.
    pub(super) async fn ended(&mut self) -> CertEnd {
        loop {
            let left = self.until_expiry();
            if left == Duration::ZERO {
                return CertEnd::Expired {
                    not_after: self.not_after,
                };
            }
            // Capped so a long wait re-reads the wall clock (a clock step is followed).
            tokio::select! {
                end = &mut self.rx => match end {
                    Ok(end) => return end,
                    // The registry is gone (the server is stopping): its shutdown ends this.
                    Err(_) => std::future::pending::<()>().await,
                },
                _ = tokio::time::sleep(left.min(Duration::from_secs(60))) => {}
            }
        }
    }
}

impl Drop for LiveSession<'_> {
    fn drop(&mut self) {
        self.live.inner().sessions.remove(&self.key);
    }
}

/// Runs until `stop` says so: polls the files every [`POLL`] (see the module docs). Each look
/// runs on tokio's blocking pool: a reload parses, verifies and builds for a while (a second
/// under a starved emulator), and the sessions it ends must not wait behind it for a worker.
pub(super) async fn watch(shared: Arc<super::Shared>, mut stop: tokio_watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let shared = Arc::clone(&shared);
                let _ = tokio::task::spawn_blocking(move || shared.tls.poll(&shared.metrics)).await;
            }
            _ = stop.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs;
    use rustls::pki_types::ServerName;

    fn setup() -> (tempfile::TempDir, Credentials, ServerMetrics) {
        let dir = tempfile::tempdir().unwrap();
        certs::init(dir.path(), &["localhost".to_owned()]).unwrap();
        for name in ["alice", "bob"] {
            certs::issue_client(dir.path(), name).unwrap();
        }
        let cfg = ServerConfig::new("127.0.0.1:0".parse().unwrap(), dir.path());
        let creds = Credentials::new(&cfg).unwrap();
        (dir, creds, ServerMetrics::default())
    }

    fn client(dir: &Path, name: &str) -> Arc<rustls::ClientConfig> {
        let (ca, me) = (certs::ca_paths(dir), certs::client_paths(dir, name));
        tls::client_config(&ca.cert, &me.cert, &me.key).unwrap()
    }

    fn cert_of(dir: &Path, name: &str) -> CertificateDer<'static> {
        tls::load_certs(&certs::client_paths(dir, name).cert)
            .unwrap()
            .remove(0)
    }

    /// One TLS handshake: whether the server resumed it, and the server certificate the
    /// client saw (`None` on a resumed handshake, which sends none).
    async fn handshake(
        creds: &Credentials,
        metrics: &ServerMetrics,
        cc: &Arc<rustls::ClientConfig>,
    ) -> Result<(bool, Option<Vec<u8>>), String> {
        let (a, b) = tokio::io::duplex(1 << 16);
        let name = ServerName::try_from("localhost").unwrap();
        let (c, s) = tokio::join!(
            tokio_rustls::TlsConnector::from(Arc::clone(cc)).connect(name, a),
            creds.current(metrics).accept(b)
        );
        let s = s.map_err(|e| e.to_string())?;
        let c = c.map_err(|e| e.to_string())?;
        let resumed = s.get_ref().1.handshake_kind() == Some(rustls::HandshakeKind::Resumed);
        let seen = c
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec());
        // Rustls sends its tickets after the handshake: read them so the client can resume.
        let (mut c, mut s) = (c, s);
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"x").await.map_err(|e| e.to_string())?;
        let mut one = [0u8; 1];
        c.read_exact(&mut one).await.map_err(|e| e.to_string())?;
        Ok((resumed, seen))
    }

    /// Looks at the files as the watcher does, long enough for a change to settle.
    async fn settle(creds: &Credentials, metrics: &ServerMetrics) -> usize {
        let mut ended = 0;
        for _ in 0..3 {
            ended += creds.poll(metrics);
            tokio::time::sleep(PAIR_HOLD).await;
        }
        ended
    }

    async fn ends_soon(live: &mut LiveSession<'_>) -> Option<CertEnd> {
        tokio::time::timeout(Duration::from_millis(200), live.ended())
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_new_crl_ends_live_sessions_it_revokes_and_a_deleted_or_bad_one_keeps_refusing() {
        let (dir, creds, metrics) = setup();
        let (alice, bob) = (client(dir.path(), "alice"), client(dir.path(), "bob"));
        handshake(&creds, &metrics, &alice).await.unwrap();
        handshake(&creds, &metrics, &bob).await.unwrap();
        let mut alice_live = creds.register(&cert_of(dir.path(), "alice"));
        let mut bob_live = creds.register(&cert_of(dir.path(), "bob"));
        assert_eq!(creds.live.len(), 2);
        assert_eq!(settle(&creds, &metrics).await, 0, "nothing changed yet");

        certs::revoke(dir.path(), dir.path(), "bob").unwrap();
        assert_eq!(
            settle(&creds, &metrics).await,
            1,
            "bob's one live session ended"
        );
        assert_eq!(ends_soon(&mut bob_live).await, Some(CertEnd::Revoked));
        assert_eq!(
            ends_soon(&mut alice_live).await,
            None,
            "alice is not revoked"
        );
        assert_eq!(metrics.cert_reload_counts("crl"), (1, 0));
        // Bob's resumption was forgotten with the cache: he is refused at TLS.
        let refused = handshake(&creds, &metrics, &bob).await.unwrap_err();
        assert!(
            refused.contains("Revoked") || refused.contains("revoked") || refused.contains("alert"),
            "{refused}"
        );
        // And a session that registers now (a handshake that raced the reload) ends at once.
        let mut late = creds.register(&cert_of(dir.path(), "bob"));
        assert_eq!(late.already_ended(), Some(CertEnd::Revoked));

        // Deleted: the revocations stay in force (fail closed), counted.
        std::fs::remove_file(certs::crl_path(dir.path())).unwrap();
        assert_eq!(settle(&creds, &metrics).await, 0);
        assert_eq!(metrics.cert_reload_counts("crl"), (1, 1));
        assert!(
            handshake(&creds, &metrics, &bob).await.is_err(),
            "bob stays refused"
        );
        // Unparseable: the same.
        std::fs::write(
            certs::crl_path(dir.path()),
            "-----BEGIN X509 CRL-----\nAAAA\n-----END X509 CRL-----\n",
        )
        .unwrap();
        assert_eq!(settle(&creds, &metrics).await, 0);
        assert_eq!(metrics.cert_reload_counts("crl"), (1, 2));
        assert!(
            handshake(&creds, &metrics, &bob).await.is_err(),
            "bob stays refused"
        );
        assert!(
            handshake(&creds, &metrics, &alice).await.is_ok(),
            "alice is still served"
        );
        drop(alice_live);
        assert_eq!(creds.live.len(), 0, "a dropped session unregisters");
    }

    #[tokio::test]
    async fn a_new_server_certificate_is_presented_and_resumption_survives_it() {
        let (dir, creds, metrics) = setup();
        let alice = client(dir.path(), "alice");
        let (resumed, first_cert) = handshake(&creds, &metrics, &alice).await.unwrap();
        assert!(!resumed && first_cert.is_some());
        assert!(
            handshake(&creds, &metrics, &alice).await.unwrap().0,
            "resumed before the reload"
        );

        let mut live = creds.register(&cert_of(dir.path(), "alice"));
        certs::reissue_server(dir.path(), dir.path(), &["localhost".to_owned()]).unwrap();
        assert_eq!(settle(&creds, &metrics).await, 0);
        assert_eq!(metrics.cert_reload_counts("cert"), (1, 0));
        assert_eq!(metrics.cert_reload_counts("key"), (1, 0));
        assert_eq!(
            ends_soon(&mut live).await,
            None,
            "live sessions are untouched"
        );
        // A client without a session to resume sees the new certificate.
        let (_, seen) = handshake(&creds, &metrics, &client(dir.path(), "alice"))
            .await
            .unwrap();
        let on_disk = tls::load_certs(&certs::server_paths(dir.path()).cert).unwrap();
        assert_eq!(seen.as_deref(), Some(on_disk[0].as_ref()));
        assert_ne!(seen, first_cert);
        // A reload that revokes nothing keeps resumption.
        assert!(
            handshake(&creds, &metrics, &alice).await.unwrap().0,
            "resumed after the reload"
        );

        // A key that does not parse: the last good pair stays (fail closed), counted.
        std::fs::write(certs::server_paths(dir.path()).key, "not a key").unwrap();
        assert_eq!(settle(&creds, &metrics).await, 0);
        assert_eq!(metrics.cert_reload_counts("key"), (1, 1));
        let (_, still) = handshake(&creds, &metrics, &client(dir.path(), "alice"))
            .await
            .unwrap();
        assert_eq!(still.as_deref(), Some(on_disk[0].as_ref()));

        // A revocation (of someone else) forgets every resumable session: checked afresh.
        certs::revoke(dir.path(), dir.path(), "bob").unwrap();
        settle(&creds, &metrics).await;
        assert!(
            !handshake(&creds, &metrics, &alice).await.unwrap().0,
            "full handshake after a revocation"
        );
        // A CA bundle that vanishes is kept too.
        std::fs::remove_file(certs::ca_paths(dir.path()).cert).unwrap();
        settle(&creds, &metrics).await;
        assert_eq!(metrics.cert_reload_counts("ca"), (0, 1));
        assert!(handshake(&creds, &metrics, &alice).await.is_ok());
    }

    #[tokio::test]
    async fn a_crl_not_signed_by_the_ca_ends_nothing_and_is_counted() {
        let (dir, creds, metrics) = setup();
        let bob = client(dir.path(), "bob");
        let mut live = creds.register(&cert_of(dir.path(), "bob"));
        // Another CA (with the same name) signs a CRL listing bob's serial.
        let other = tempfile::tempdir().unwrap();
        certs::init(other.path(), &["localhost".to_owned()]).unwrap();
        certs::revoke(other.path(), dir.path(), "bob").unwrap();
        assert_eq!(settle(&creds, &metrics).await, 0);
        assert_eq!(metrics.cert_reload_counts("crl"), (0, 1));
        assert_eq!(
            ends_soon(&mut live).await,
            None,
            "a forged CRL ends nothing"
        );
        assert!(handshake(&creds, &metrics, &bob).await.is_ok());
        // The real CA's CRL replaces it and applies.
        std::fs::remove_file(certs::crl_path(dir.path())).unwrap();
        certs::revoke(dir.path(), dir.path(), "bob").unwrap();
        assert_eq!(settle(&creds, &metrics).await, 1);
        assert_eq!(ends_soon(&mut live).await, Some(CertEnd::Revoked));
    }

    #[tokio::test]
    async fn a_session_ends_when_its_certificate_expires() {
        let (dir, creds, _metrics) = setup();
        let short =
            certs::issue_client_valid_for(dir.path(), dir.path(), "eve", Duration::from_secs(2))
                .unwrap();
        let cert = tls::load_certs(&short.cert).unwrap().remove(0);
        let mut live = creds.register(&cert);
        assert_eq!(live.already_ended(), None);
        let started = std::time::Instant::now();
        let end = tokio::time::timeout(Duration::from_secs(5), live.ended())
            .await
            .expect("the session ends at notAfter");
        assert!(matches!(end, CertEnd::Expired { .. }), "{end:?}");
        assert!(
            started.elapsed() >= Duration::from_secs(1),
            "not before notAfter"
        );
    }
}
