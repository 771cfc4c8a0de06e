//! secure-server on a host without RDMA (this one; the lab VM has rxe): the quick start a user
//! follows without RDMA. The server still starts, says once what the host lacks and how to fix
//! it, and a client is refused with that same text.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use secure_rdma::client::{Client, ClientConfig, ClientError};
use secure_rdma::handshake::RejectReason;
use secure_rdma_tests::no_rdma::NoRdma;

mod common;

/// Kills the server even when an assertion fails.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_rdma_the_server_starts_names_the_fix_and_clients_hear_it() {
    let Some(NoRdma {
        availability,
        certs,
        dir: _dir,
    }) = NoRdma::setup()
    else {
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_secure-server"))
        .args(["--listen", "127.0.0.1:0", "--log-format", "json", "--certs"])
        .arg(&certs)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn secure-server");
    let stderr = child.stderr.take().expect("stderr");
    let _server = Killed(child);
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });

    // Before "ready": one warning that names what is missing and the fix.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut warnings = Vec::new();
    let port: u16 = loop {
        let line = lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("secure-server ready within 60 s (it must start without RDMA)");
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if v["level"] == "WARN" && v["message"].as_str().is_some_and(|m| m.contains("RDMA")) {
            warnings.push(v["message"].as_str().unwrap_or_default().to_owned());
        }
        if let Some(port) = common::ready_port(&line) {
            break port;
        }
    };
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let warning = &warnings[0];
    assert!(warning.contains(&availability.to_string()), "{warning}");
    assert!(warning.contains("scripts/setup-softroce.sh"), "{warning}");

    // A client gets through TLS and admission, then is refused with the same text.
    let cfg = ClientConfig::new("127.0.0.1")
        .with_port(port)
        .with_ca(certs.join("ca.pem"))
        .with_identity(certs.join("alice.pem"), certs.join("alice.key"))
        .with_timeout(Duration::from_secs(20));
    let Err(err) = Client::connect(&cfg).await else {
        panic!("connected without RDMA");
    };
    let ClientError::Rejected(RejectReason::Unavailable { detail }) = &err else {
        panic!("not the no-RDMA rejection: {err}");
    };
    assert_eq!(detail, &availability.to_string());
    // secure-client exits 3 on this rejection: its own test (secure-rdma-client's
    // no_rdma_device.rs) runs the binary against a server without RDMA.
    let text = err.to_string();
    assert!(
        text.starts_with("rejected by server: server cannot serve RDMA: ")
            && text.contains("scripts/setup-softroce.sh"),
        "{text}"
    );
}

#[test]
fn without_rdma_a_named_device_is_an_error_with_the_same_fix() {
    let Some(NoRdma {
        availability,
        certs,
        dir: _dir,
    }) = NoRdma::setup()
    else {
        return;
    };
    let out = Command::new(env!("CARGO_BIN_EXE_secure-server"))
        .args(["--listen", "127.0.0.1:0", "--device", "rxe0", "--certs"])
        .arg(&certs)
        .output()
        .expect("run secure-server");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "secure-server: error: --device rxe0 needs an RDMA device, and {availability}"
        )),
        "{err}"
    );
}
