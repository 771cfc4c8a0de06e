//! Bring your own PKI on real rxe (issue 21, test 4, first half): a CA, a server certificate and
//! client X509-SVIDs made by openssl (the README's "Bring your own PKI" block, run as written),
//! `secure-server --ca/--cert/--key` on them, and a quota naming a SPIFFE ID.
//!
//! - alice (CN `alice`, URI SAN `spiffe://example.org/ns/prod/sa/alice`) holds a session and
//!   sends; the server delivers it under her SPIFFE ID, in its log and its metrics;
//! - a second alice is refused by the quota naming that SPIFFE ID, and the refusal names it;
//! - the same path under another trust domain is another tenant: served meanwhile;
//! - the other half: with `--identity cn` the same quota names nobody, and two alices are served.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use secure_rdma_tests::readme;
use secure_rdma_tests::secure::{client_command, server_command, unquote, Held, ServerProc};
use secure_rdma_tests::{require_lab, spawn, text, wait_with_deadline};

const DEADLINE: Duration = Duration::from_secs(90);
const ALICE: &str = "spiffe://example.org/ns/prod/sa/alice";
const OTHER_ALICE: &str = "spiffe://other.example/ns/prod/sa/alice";
const METRICS: &str = "127.0.0.1:19436";

/// The README's PKI, plus `other`: alice's path under another trust domain.
fn openssl_pki() -> tempfile::TempDir {
    let dir = readme::byo_pki();
    readme::openssl_client(dir.path(), "other", "alice", &format!("URI:{OTHER_ALICE}"));
    dir
}

/// A killed-at-the-end `secure-server` on the openssl files of `pki`, from an empty working
/// directory (no `certs/` it could fall back to).
struct Server {
    // Field order is drop order: the server before its working directory.
    server: ServerProc,
    _cwd: tempfile::TempDir,
}

impl Server {
    fn start(pki: &Path, port: u16, extra: &[&str]) -> Server {
        let cwd = tempfile::tempdir().expect("tempdir");
        let mut cmd = server_command(port, "info");
        cmd.arg("--ca")
            .arg(pki.join("ca.pem"))
            .arg("--cert")
            .arg(pki.join("server.pem"))
            .arg("--key")
            .arg(pki.join("server.key"))
            .arg("--quota")
            .arg(pki.join("quota.conf"))
            .args(extra)
            .current_dir(cwd.path());
        Server {
            server: ServerProc::spawn(cmd, port),
            _cwd: cwd,
        }
    }

    /// Waits for a "SEND received" from `client` with `content`.
    fn wait_send(&self, client: &str, content: &str) {
        self.log.wait_for("SEND received", 1, DEADLINE, |l| {
            serde_json::from_str::<serde_json::Value>(l).is_ok_and(|e| {
                e["message"] == "SEND received"
                    && e["client"] == client
                    && unquote(&e["content"]) == content
            })
        });
    }
}

impl std::ops::Deref for Server {
    type Target = ServerProc;

    fn deref(&self) -> &ServerProc {
        &self.server
    }
}

/// A secure-client of `name` (files `pki/name.{pem,key}`, CA `pki/ca.pem`).
fn client(pki: &Path, server: &Server, name: &str) -> Command {
    client_command(pki, server.port, Some(name), 30)
}

fn once(pki: &Path, server: &Server, name: &str, message: &str) -> Output {
    wait_with_deadline(
        spawn(client(pki, server, name).args(["-e", &format!("send {message}"), "-e", "quit"])),
        DEADLINE,
        name,
    )
}

/// `GET /metrics` from `addr` (HTTP/1.0): the body.
fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to --metrics");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// Waits until the metrics have `line` (a whole sample line).
fn wait_metric(line: &str) {
    let start = Instant::now();
    loop {
        let body = scrape(METRICS);
        if body.lines().any(|l| l == line) {
            return;
        }
        assert!(
            start.elapsed() < DEADLINE,
            "no {line:?} in the metrics:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn send_on(held: &mut Held, message: &str) {
    let stdin = held.child.stdin.as_mut().expect("stdin");
    writeln!(stdin, "send {message}").expect("write to the held client");
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn an_openssl_x509_svid_is_admitted_by_its_spiffe_id_and_its_quota_applies() {
    require_lab();
    let pki = openssl_pki();
    let dir = pki.path();
    // The README's quota line, and the other trust domain's alice with a limit of her own.
    std::fs::write(
        dir.join("quota.conf"),
        format!("tenant {ALICE} QP_COUNT 1   # one session\ntenant {OTHER_ALICE} QP_COUNT 4\n"),
    )
    .expect("quota file");

    let server = Server::start(dir, 4597, &["--metrics", METRICS]);
    // alice holds a session and sends: delivered under her SPIFFE ID.
    let mut alice = Held::start(client(dir, &server, "alice"));
    alice.wait_connected();
    assert!(
        alice
            .out
            .snapshot()
            .iter()
            .any(|l| l.contains(&format!("as {ALICE}"))),
        "the client was told another identity: {:?}",
        alice.out.snapshot()
    );
    send_on(&mut alice, "from alice");
    server.wait_send(ALICE, "from alice");
    wait_metric(&format!(
        r#"secure_rdma_messages_received_total{{tenant="{ALICE}",op="send"}} 1"#
    ));

    // A second alice meanwhile: the quota naming her SPIFFE ID refuses it, and says whose.
    let second = once(dir, &server, "alice", "second alice");
    let err = text(&second.stderr);
    assert_eq!(second.status.code(), Some(3), "{err}");
    let refusal = format!("QP_COUNT limit 1 reached for tenant {ALICE} (1 live)");
    assert!(
        err.contains(&format!("rejected by server: quota exceeded: {refusal}")),
        "{err}"
    );
    assert_eq!(
        server
            .log
            .events()
            .iter()
            .filter(|e| e["message"] == format!("INTERCEPTED: {refusal}"))
            .count(),
        1,
        "{:#?}",
        server.log.snapshot()
    );

    // The same path under another trust domain is another tenant: served meanwhile.
    let other = once(dir, &server, "other", "from the other alice");
    assert!(other.status.success(), "{}", text(&other.stderr));
    server.wait_send(OTHER_ALICE, "from the other alice");
    wait_metric(&format!(
        r#"secure_rdma_messages_received_total{{tenant="{OTHER_ALICE}",op="send"}} 1"#
    ));
    // Nothing arrived under the CN.
    assert!(
        !server
            .log
            .snapshot()
            .iter()
            .any(|l| l.contains(r#""client":"alice""#)),
        "{:#?}",
        server.log.snapshot()
    );
    assert!(alice.quit().success());
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn with_identities_from_the_cn_the_spiffe_quota_names_nobody() {
    require_lab();
    let pki = openssl_pki();
    let dir = pki.path();
    std::fs::write(
        dir.join("quota.conf"),
        format!("tenant {ALICE} QP_COUNT 1\n"),
    )
    .expect("quota file");
    // The same certificates and quota; identities from the CN: alice is "alice", whom the
    // quota does not name, so two sessions of her are served.
    let server = Server::start(dir, 4598, &["--identity", "cn"]);
    let alice = Held::start(client(dir, &server, "alice"));
    alice.wait_connected();
    let second = once(dir, &server, "alice", "second alice");
    assert!(second.status.success(), "{}", text(&second.stderr));
    server.wait_send("alice", "second alice");
    assert!(alice.quit().success());
}
