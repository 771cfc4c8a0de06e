//! Bring your own PKI, on the host: a CA, a server certificate and client X509-SVIDs made by
//! openssl (the README's "Bring your own PKI" block, run as written), a `secure-server` started
//! on those files with `--ca/--cert/--key` (no certificate directory at all), and clients known
//! by their SPIFFE IDs. Everything checked here happens before any RDMA resource exists: on a
//! host without RDMA a client that gets through hears "server cannot serve RDMA", which proves
//! TLS, the identity and admission let it through; the session itself and the quota that
//! refuses a second one are `tests/tests/pki_lab.rs`, on rxe.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use secure_rdma::client::{Client, ClientConfig, ClientError};
use secure_rdma::handshake::RejectReason;
use secure_rdma_tests::readme;

mod common;

const ALICE: &str = "spiffe://example.org/ns/prod/sa/alice";
/// The same path as alice's under another trust domain: another tenant.
const OTHER_ALICE: &str = "spiffe://other.example/ns/prod/sa/alice";

/// Another client certificate from the README's CA, its subject CN `name`, with `san` as its
/// subjectAltName.
fn openssl_client(dir: &Path, name: &str, san: &str) {
    readme::openssl_client(dir, name, name, san);
}

/// The README's PKI in a fresh directory, plus the test's other clients.
fn openssl_pki() -> tempfile::TempDir {
    let dir = readme::byo_pki();
    openssl_client(dir.path(), "other", &format!("URI:{OTHER_ALICE}"));
    openssl_client(
        dir.path(),
        "two",
        "URI:spiffe://example.org/a,URI:spiffe://example.org/b",
    );
    openssl_client(
        dir.path(),
        "upper",
        "URI:spiffe://Example.org/ns/prod/sa/alice",
    );
    openssl_client(dir.path(), "plain", "DNS:plain.example.org");
    dir
}

struct Server {
    child: Child,
    port: u16,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Server {
    /// secure-server on the openssl files of `pki`, from an empty working directory (so no
    /// `certs/` directory could be what it reads).
    fn start(pki: &Path, args: &[&str]) -> (Server, tempfile::TempDir) {
        let files = [
            "--ca".into(),
            pki.join("ca.pem"),
            "--cert".into(),
            pki.join("server.pem"),
            "--key".into(),
            pki.join("server.key"),
        ];
        Server::start_with(&files, args)
    }

    /// secure-server with `files` and `args`, from an empty working directory.
    fn start_with(files: &[std::path::PathBuf], args: &[&str]) -> (Server, tempfile::TempDir) {
        let cwd = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_secure-server"))
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .args(files)
            .args(args)
            .current_dir(cwd.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn secure-server");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        let port = loop {
            let line = lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| {
                    panic!("secure-server ready within 60 s; log:\n{}", seen.join("\n"))
                });
            seen.push(line.clone());
            if let Some(port) = common::ready_port(&line) {
                break port;
            }
        };
        (
            Server {
                child,
                port,
                lines,
                seen,
            },
            cwd,
        )
    }

    /// Waits until a log line satisfies `pred`; fails the test at the deadline.
    fn wait_for(&mut self, what: &str, pred: impl Fn(&serde_json::Value) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let matches = |l: &str| serde_json::from_str(l).is_ok_and(|v| pred(&v));
        if self.seen.iter().any(|l| matches(l)) {
            return;
        }
        loop {
            let Ok(line) = self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            else {
                panic!("no log line {what} in 30 s; log:\n{}", self.seen.join("\n"));
            };
            self.seen.push(line.clone());
            if matches(&line) {
                return;
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Connects as the client whose files are `pki/name.{pem,key}`.
async fn connect(pki: &Path, port: u16, name: &str) -> Result<Client, ClientError> {
    let cfg = ClientConfig::new("127.0.0.1")
        .with_port(port)
        .with_ca(pki.join("ca.pem"))
        .with_identity(
            pki.join(format!("{name}.pem")),
            pki.join(format!("{name}.key")),
        )
        .with_timeout(Duration::from_secs(20));
    Client::connect(&cfg).await
}

/// The client got through TLS and the identity check: served (a host with RDMA) or told the
/// host has none (the only refusal that comes after both).
fn assert_identified(result: Result<Client, ClientError>, who: &str) {
    match result {
        Ok(_) | Err(ClientError::Rejected(RejectReason::Unavailable { .. })) => {}
        Err(e) => panic!("{who} was not admitted: {e}"),
    }
}

/// The refusal a client with no usable identity hears.
fn refusal(result: Result<Client, ClientError>) -> String {
    match result {
        Err(ClientError::Rejected(reason @ RejectReason::Policy { .. })) => reason.to_string(),
        Err(e) => panic!("expected a policy refusal, got: {e}"),
        Ok(_) => panic!("expected a policy refusal, got a session"),
    }
}

fn span_id(v: &serde_json::Value) -> Option<&str> {
    v["span"]["id"].as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openssl_certificates_name_clients_by_their_spiffe_ids() {
    let pki = openssl_pki();
    let quota = pki.path().join("quota.conf");
    // The README's quota line, and the same path under the other trust domain with its own.
    std::fs::write(
        &quota,
        format!("tenant {ALICE} QP_COUNT 1   # one session\ntenant {OTHER_ALICE} QP_COUNT 5\n"),
    )
    .expect("quota file");
    let quota_arg = quota.to_str().expect("utf-8 path");
    let (mut server, _cwd) = Server::start(
        pki.path(),
        &[
            "--quota",
            quota_arg,
            "--limit",
            &format!("tenant:{OTHER_ALICE}:QP_CREATE=9"),
        ],
    );
    // Both limits were read as SPIFFE ID tenants.
    for setting in [
        format!("tenant {ALICE} QP_COUNT 1"),
        format!("tenant {OTHER_ALICE} QP_COUNT 5"),
        format!("tenant {OTHER_ALICE} QP_CREATE 9"),
    ] {
        server.wait_for(&format!("quota {setting}"), |v| {
            v["message"] == "quota" && v["setting"] == setting.as_str()
        });
    }

    // alice (CN alice, URI SAN her SPIFFE ID) is known by the SPIFFE ID, not the CN.
    assert_identified(connect(pki.path(), server.port, "alice").await, "alice");
    server.wait_for("naming alice's SPIFFE ID", |v| span_id(v) == Some(ALICE));
    // The same path under another trust domain is another identity.
    assert_identified(connect(pki.path(), server.port, "other").await, "other");
    server.wait_for("naming the other trust domain's alice", |v| {
        span_id(v) == Some(OTHER_ALICE)
    });
    assert!(
        !server.seen.iter().any(|l| l.contains(r#""id":"alice""#)),
        "the CN was taken as an identity: {}",
        server.seen.join("\n")
    );

    // Certificates that verify but name no usable identity are refused with the reason.
    let two = refusal(connect(pki.path(), server.port, "two").await);
    assert_eq!(
        two,
        "refused by server policy: the client certificate names no usable identity (identities \
         from auto): peer certificate: 2 URI SANs (spiffe://example.org/a, spiffe://example.org/b): \
         an X509-SVID carries exactly one, its SPIFFE ID; issue the certificate with a single URI SAN"
    );
    let upper = refusal(connect(pki.path(), server.port, "upper").await);
    assert!(
        upper.ends_with(
            "URI SAN \"spiffe://Example.org/ns/prod/sa/alice\" is not a valid SPIFFE ID: 'E' is \
             not allowed in a trust domain: use lowercase letters, digits, '.', '-', '_'"
        ),
        "{upper}"
    );
    server.wait_for("the refusal, logged", |v| {
        v["message"] == "client rejected"
            && v["reason"]
                .as_str()
                .is_some_and(|r| r.contains("is not a valid SPIFFE ID"))
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_identity_source_is_chosen_with_identity() {
    let pki = openssl_pki();
    // --identity cn: alice is her CN, the SPIFFE ID notwithstanding.
    {
        let (mut server, _cwd) = Server::start(pki.path(), &["--identity", "cn"]);
        assert_identified(connect(pki.path(), server.port, "alice").await, "alice");
        server.wait_for("naming alice by her CN", |v| span_id(v) == Some("alice"));
    }
    // --identity spiffe: a certificate with no URI SAN is refused, and says so.
    {
        let (mut server, _cwd) = Server::start(pki.path(), &["--identity", "spiffe"]);
        let plain = refusal(connect(pki.path(), server.port, "plain").await);
        assert!(
            plain.contains("(identities from spiffe): peer certificate: no SPIFFE ID: the certificate has no URI SAN"),
            "{plain}"
        );
        assert_identified(connect(pki.path(), server.port, "alice").await, "alice");
        server.wait_for("naming alice's SPIFFE ID", |v| span_id(v) == Some(ALICE));
    }
    // --trust-domain: SPIFFE IDs of other trust domains are refused, whoever signed them.
    {
        let (mut server, _cwd) = Server::start(pki.path(), &["--trust-domain", "example.org"]);
        assert_identified(connect(pki.path(), server.port, "alice").await, "alice");
        server.wait_for("naming alice's SPIFFE ID", |v| span_id(v) == Some(ALICE));
        let other = refusal(connect(pki.path(), server.port, "other").await);
        assert!(
            other.ends_with(&format!(
                "trust domain other.example of {OTHER_ALICE} is not one this server accepts (example.org)"
            )),
            "{other}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_secure-server"))
        .args(["--trust-domain", "Example.org"])
        .output()
        .expect("run secure-server");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("not a SPIFFE trust domain: 'E' is not allowed"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // identity = "dns" in the --config file, with the files named there too: the DNS SAN.
    {
        let config = pki.path().join("server.toml");
        let p = |f: &str| pki.path().join(f).display().to_string();
        std::fs::write(
            &config,
            format!(
                "identity = \"dns\"\nca = {:?}\ncert = {:?}\nkey = {:?}\n",
                p("ca.pem"),
                p("server.pem"),
                p("server.key")
            ),
        )
        .expect("config file");
        let (mut server, _cwd) = Server::start_with(&["--config".into(), config], &[]);
        assert_identified(connect(pki.path(), server.port, "plain").await, "plain");
        server.wait_for("naming plain by its DNS name", |v| {
            span_id(v) == Some("plain.example.org")
        });
    }
}

#[test]
fn explicit_files_that_do_not_exist_are_named() {
    let cwd = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_secure-server"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--ca",
            "/nonexistent/ca.pem",
            "--cert",
            "srv.pem",
            "--key",
            "srv.key",
        ])
        .current_dir(cwd.path())
        .output()
        .expect("run secure-server");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("missing /nonexistent/ca.pem, srv.pem, srv.key: --ca, --cert and --key name"),
        "{err}"
    );
}

#[test]
fn certs_client_issues_an_x509_svid_with_spiffe_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_secure-server"))
            .arg("certs")
            .args(args)
            .arg("--dir")
            .arg(&certs)
            .output()
            .expect("run secure-server certs")
    };
    assert!(run(&["init", "--san", "127.0.0.1"]).status.success());
    let out = run(&["client", "api", "--spiffe-id", ALICE]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("identity: {ALICE}")));
    let cert = secure_rdma::tls::load_certs(&certs.join("api.pem")).expect("api.pem");
    assert_eq!(
        secure_rdma::tls::identity_of(&cert[0]).expect("identity"),
        ALICE
    );
    // A bad ID is a usage error naming the rule.
    let out = run(&["client", "bad", "--spiffe-id", "spiffe://example.org/a/"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a SPIFFE ID: a SPIFFE ID path has no empty segments"),
        "{err}"
    );
}
