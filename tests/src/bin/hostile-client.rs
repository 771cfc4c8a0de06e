//! A client that misbehaves on purpose, for the hostile-peer lab tests: it connects like
//! secure-client (library, same certificates), then RDMA SENDs as fast as it can and never
//! reads its TLS socket, so the server's acknowledgements pile up until the server's writes
//! block. Prints one JSON line per second of progress and a final one.

use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Parser;
use secure_rdma::client::Client;

/// Misbehaving secure-client for the lab: sends without ever reading acknowledgements.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    client: secure_rdma_tests::LabClientArgs,
    /// Messages to send at most.
    #[arg(long, default_value_t = 1_000_000)]
    count: u64,
    /// Seconds one send may take before the client reports it stalled (and keeps waiting up
    /// to --timeout).
    #[arg(long, default_value_t = 2)]
    stall: u64,
    /// Seconds each step may take.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Milliseconds between two sends (0: back to back): slow enough and the server keeps up
    /// with the messages until its acknowledgements fill the TCP buffers and its writes block.
    #[arg(long, default_value_t = 0)]
    interval_ms: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let cfg = args.client.config(Duration::from_secs(args.timeout));
    let mut client = Client::connect(&cfg).await?;
    println!("{}", serde_json::json!({"connected": true}));
    let started = Instant::now();
    let mut last_report = Instant::now();
    let mut stalled = false;
    let mut sent = 0u64;
    let payload = [b'x'; 64];
    let outcome = loop {
        if sent == args.count {
            break "count reached".to_owned();
        }
        if args.interval_ms > 0 {
            tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
        }
        let send = client.session_mut().send(&payload);
        tokio::pin!(send);
        let result = tokio::select! {
            r = &mut send => r,
            _ = tokio::time::sleep(Duration::from_secs(args.stall)), if !stalled => {
                stalled = true;
                println!("{}", serde_json::json!({"stalled": true, "sent": sent}));
                send.await
            }
        };
        match result {
            Ok(()) => sent += 1,
            Err(e) => break e.to_string(),
        }
        if last_report.elapsed() >= Duration::from_secs(1) {
            println!("{}", serde_json::json!({"sent": sent}));
            last_report = Instant::now();
        }
    };
    println!(
        "{}",
        serde_json::json!({"done": true, "sent": sent, "outcome": outcome, "secs": started.elapsed().as_secs_f64()})
    );
    Ok(())
}
