//! `secure-server --metrics` serves its exporter whether or not the build has eBPF: the build
//! info, the server's own metrics and the latest report (the ports' hardware counters and the
//! server's own counts need no eBPF). `scripts/test.sh` runs it in both builds, the default
//! one and `--no-default-features`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

mod common;

/// One `GET /metrics` to `addr`: the whole response, status line and headers included.
fn scrape(addr: &str) -> String {
    let mut stream = TcpStream::connect(addr).expect("connect to --metrics");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .expect("send the request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .expect("read the response");
    response
}

#[test]
fn metrics_serve_the_server_metrics_and_a_report_with_or_without_ebpf() {
    let (mut child, rx, _certs) = common::spawn_logging_server(&[
        "--metrics",
        "127.0.0.1:0",
        "--telemetry-interval",
        "1",
        "--limit",
        "QP_COUNT=3",
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut addr, mut reported) = (None, false);
    while !(addr.is_some() && reported) && Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) else {
            continue;
        };
        if let Some(a) = common::logged(&line, "telemetry: Prometheus metrics at /metrics", "addr")
        {
            addr = Some(a);
        }
        reported |= common::logged(&line, "telemetry", "source").is_some();
    }
    let response = addr.as_deref().map(scrape);
    let _ = child.kill();
    let _ = child.wait();
    let addr = addr.expect("the metrics address logged within 60 s");
    assert!(reported, "a telemetry report within 60 s");
    let response = response.unwrap_or_default();
    assert!(response.starts_with("HTTP/1.1 200"), "{addr}: {response}");
    // The build info and the server's own metrics, current at the scrape.
    assert!(response.contains("secure_server_build_info"), "{response}");
    assert!(
        response.contains("# TYPE secure_rdma_handshakes"),
        "{response}"
    );
    // The latest report: the thresholds it was given.
    assert!(response.contains("rdma_limit"), "{response}");
}
