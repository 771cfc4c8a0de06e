//! A client application: connects with its certificate and RDMA SENDs each
//! message given on the command line (or each line of standard input),
//! printing the server's acknowledgement of each.
//!
//! ```text
//! cargo run -p secure-rdma --example message_client -- 10.77.0.1 --name alice "hello" "again"
//! ```

use std::io::BufRead;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use secure_rdma::client::{Client, ClientConfig};

/// Sends messages over secure RDMA.
#[derive(Debug, Parser)]
struct Args {
    /// Server address (the name its certificate carries)
    host: String,
    /// Server port
    #[arg(long, default_value_t = 4433)]
    port: u16,
    /// Certificate directory (ca.pem, NAME.pem, NAME.key)
    #[arg(long, default_value = "certs")]
    certs: PathBuf,
    /// Client identity: its certificate is DIR/NAME.pem
    #[arg(long)]
    name: String,
    /// RDMA WRITE the messages into the server's buffer instead of SENDing them
    #[arg(long)]
    write: bool,
    /// Messages to send; none: each line of standard input
    messages: Vec<String>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let messages = if args.messages.is_empty() {
        std::io::stdin().lock().lines().collect::<Result<_, _>>()?
    } else {
        args.messages
    };
    let mut client = Client::connect(
        &ClientConfig::new(&args.host)
            .with_port(args.port)
            .with_ca(args.certs.join("ca.pem"))
            .with_identity(
                args.certs.join(format!("{}.pem", args.name)),
                args.certs.join(format!("{}.key", args.name)),
            )
            .with_timeout(Duration::from_secs(10)),
    )
    .await?;
    println!("connected as {}", client.identity());
    for message in &messages {
        let ack = match args.write {
            true => client.write(message.as_bytes()).await?,
            false => client.send(message.as_bytes()).await?,
        };
        println!("acknowledged {} #{}: {} bytes", ack.op, ack.seq, ack.bytes);
    }
    client.quit().await;
    Ok(())
}
