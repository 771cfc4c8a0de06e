//! A client application: connects with its certificate and RDMA SENDs each
//! message given on the command line (or each line of standard input, as it
//! comes), printing the server's acknowledgement of each.
//!
//! ```text
//! cargo run -p secure-rdma --example message_client -- 10.77.0.1 --name alice "hello" "again"
//! ```
//!
//! It uses only the library's [`Client`]: a lost session (a forged packet, a
//! reset connection, a lost acknowledgement, a server restart) is recovered
//! inside it, the operation stream resumed, so each message is delivered
//! exactly once; the recoveries are reported on stderr as they happen.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use secure_rdma::client::{Client, ClientConfig, Recovering, Recovery};
use secure_rdma::datapath::{AckStatus, Op};
use tokio::io::AsyncBufReadExt;

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
    /// Acknowledgements over RDMA (the streaming data path)
    #[arg(long)]
    rdma_acks: bool,
    /// Seconds each step may take, an acknowledgement included
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    /// After a lost session, send the unacknowledged messages again on a new stream (at least
    /// once) instead of resuming (exactly once)
    #[arg(long)]
    no_resume: bool,
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
    let mut client = Client::connect(
        &ClientConfig::new(&args.host)
            .with_port(args.port)
            .with_ca(args.certs.join("ca.pem"))
            .with_identity(
                args.certs.join(format!("{}.pem", args.name)),
                args.certs.join(format!("{}.key", args.name)),
            )
            .with_timeout(Duration::from_secs(args.timeout.max(1)))
            .with_rdma_acks(args.rdma_acks)
            .with_recovery(match args.no_resume {
                true => Recovery::Resend,
                false => Recovery::Resume,
            }),
    )
    .await?;
    client.on_recovery(|step| match step {
        Recovering::Lost { cause } => eprintln!("message_client: session lost: {cause}"),
        Recovering::Recovered(ev) => eprintln!("message_client: {ev}"),
        _ => {}
    });
    println!("connected as {}", client.identity());
    let op = if args.write { Op::Write } else { Op::Send };
    let mut refused = 0;
    let from_stdin = args.messages.is_empty();
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut given = args.messages.into_iter();
    loop {
        // The command line's messages, else standard input's lines as they come (so whoever
        // writes them can pace them).
        let next = match from_stdin {
            true => lines.next_line().await?,
            false => given.next(),
        };
        let Some(message) = next else { break };
        let ack = match op {
            Op::Write => client.write(message.as_bytes()).await?,
            _ => client.send(message.as_bytes()).await?,
        };
        if ack.status == AckStatus::Refused {
            refused += 1;
            println!("refused {} #{}", ack.op, ack.seq);
        } else {
            println!("acknowledged {} #{}: {} bytes", ack.op, ack.seq, ack.bytes);
        }
    }
    client.quit().await;
    if refused > 0 {
        return Err(format!("{refused} messages refused by the server").into());
    }
    Ok(())
}
