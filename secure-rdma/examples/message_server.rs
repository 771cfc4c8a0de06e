//! A server application: receives what clients send through the library's
//! handler API and prints each message as `identity: "message"`; at the end
//! (Ctrl-C or SIGTERM), how many messages and bytes each client sent.
//!
//! ```text
//! cargo run -p secure-rdma --example message_server -- --listen 10.77.0.1:4433 --certs certs
//! ```
//!
//! Deliveries come through a bounded channel: while the loop below is
//! behind by `--capacity` messages, the sessions wait and so do their
//! clients' acknowledgements (backpressure, no unbounded queue).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use secure_rdma::server::{render, Delivery, Server, ServerConfig};

/// Receives messages over secure RDMA and prints them.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on; its RDMA device serves the clients
    #[arg(long, default_value = "0.0.0.0:4433")]
    listen: SocketAddr,
    /// Certificate directory made by `secure-server certs init`
    #[arg(long, default_value = "certs")]
    certs: PathBuf,
    /// Deliveries waiting for this program before clients are held back
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..))]
    capacity: u16,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A binary decides where logs go: the library's warnings on stderr.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Delivery>(usize::from(args.capacity));
    let server = Server::bind(ServerConfig::new(args.listen, &args.certs))
        .await?
        .with_handler(tx);
    println!("message_server listening on {}", server.local_addr()?);
    let serving = tokio::spawn(server.run(shutdown()));

    // (messages, bytes) per client identity.
    let mut counts: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    // Ends once the server has stopped: it held the only sender.
    while let Some(d) = rx.recv().await {
        println!("{}: {}", d.identity(), render(d.data()));
        // Flushed per line so whoever reads a pipe sees each message as it comes.
        std::io::stdout().flush()?;
        let c = counts.entry(d.identity().to_owned()).or_default();
        c.0 += 1;
        c.1 += d.data().len() as u64;
    }
    let summary = serving.await?;
    println!(
        "served {} clients ({} refused)",
        summary.served, summary.rejected
    );
    for (identity, (messages, bytes)) in counts {
        println!("{identity}: {messages} messages, {bytes} bytes");
    }
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        },
        // Without a SIGTERM handler, Ctrl-C still stops it.
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
