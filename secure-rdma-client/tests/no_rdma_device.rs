//! `secure-client` against a server on a host without RDMA (this one; the lab VM has rxe), as
//! in the quick start: one line that says the server cannot serve RDMA and how to fix it, and
//! exit code 3 (rejected by the server).

use std::process::Command;
use std::time::Duration;

use secure_rdma::server::{Server, ServerConfig};
use secure_rdma_tests::no_rdma::NoRdma;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_rdma_refuses_with_the_fix_and_exit_code_3() {
    let Some(NoRdma {
        availability,
        certs,
        dir: _dir,
    }) = NoRdma::setup()
    else {
        return;
    };
    // secure-server's defaults, but two clients, no CRL and a short idle timeout.
    let server = Server::bind(
        ServerConfig::new("127.0.0.1:0".parse().expect("address"), &certs)
            .with_max_clients(2)
            .with_crl(None)
            .with_idle_timeout(Duration::from_secs(30)),
    )
    .await
    .expect("the server starts without RDMA");
    let port = server.local_addr().expect("bound").port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async {
        let _ = stopped.await;
    }));

    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_secure-client"))
            .args(["127.0.0.1", "--port", &port.to_string(), "--name", "alice"])
            .args(["--timeout", "20", "--no-reconnect", "-e", "send hello"])
            .arg("--certs")
            .arg(&certs)
            .output()
            .expect("run secure-client")
    })
    .await
    .expect("client task");
    let _ = stop.send(());
    let _ = serving.await;

    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert_eq!(
        err.trim_end(),
        format!("secure-client: rejected by server: server cannot serve RDMA: {availability}"),
    );
    assert!(err.contains("scripts/setup-softroce.sh"), "{err}");
    // Nothing printed as if connected.
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
