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
//!
//! With `--persist FILE` it keeps, per client identity and operation stream,
//! the last sequence it took (written and fsynced before the delivery is
//! acknowledged), and skips a delivery it already has: the library delivers
//! each operation once while the server runs, and this makes it once across a
//! restart too, where a client sends its unacknowledged operations again
//! flagged as possibly delivered. `--ids` prints each delivery's sequence.
//!
//! `--rekey-after`, `--rekey-after-bytes` and `--rekey-after-seconds` set when the payload
//! keys rotate (as `secure-server`'s flags do); the summary at the end says how many times
//! they did, per direction. `--shared-receive-queue SLOTS` gives every session its receives from
//! one shared receive queue; the summary's `rdma setups` line says how many sessions and lanes
//! were set up on it (`shared`) or with their own queues (`cold`).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;
use secure_rdma::metrics::{KeyDirection, ServerMetrics};
use secure_rdma::protect::RekeyPolicy;
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
    /// Keep the last sequence taken per client stream in FILE, and skip what it already has
    /// (exactly once across a restart)
    #[arg(long, value_name = "FILE")]
    persist: Option<PathBuf>,
    /// Print each delivery's stream sequence: `identity #SEQ: "content"`
    #[arg(long)]
    ids: bool,
    /// Rotate each direction's payload key after this many messages under one key (0: no
    /// message threshold) [default: the library's, 2^24]
    #[arg(long, value_name = "MESSAGES")]
    rekey_after: Option<u64>,
    /// Rotate after this many payload bytes under one key (0: no byte threshold) [default:
    /// 2^32]
    #[arg(long, value_name = "BYTES")]
    rekey_after_bytes: Option<u64>,
    /// Rotate once a key is this many seconds old (0: no time threshold) [default: 3600]
    #[arg(long, value_name = "SECS")]
    rekey_after_seconds: Option<u64>,
    /// Take every session's receives from one shared receive queue of this many slots (as
    /// `secure-server --shared-receive-queue`) [default: 0, a receive queue per session]
    #[arg(long, value_name = "SLOTS", default_value_t = 0)]
    shared_receive_queue: usize,
}

/// The last sequence taken per (identity, stream), kept in a file: one line
/// `IDENTITY STREAM SEQ` per stream, rewritten and fsynced on every change.
struct Taken {
    path: PathBuf,
    last: BTreeMap<(String, String), u64>,
}

impl Taken {
    fn load(path: &Path) -> std::io::Result<Taken> {
        let mut last = BTreeMap::new();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                for line in text.lines() {
                    let mut f = line.split_whitespace();
                    if let (Some(who), Some(stream), Some(Ok(seq))) =
                        (f.next(), f.next(), f.next().map(str::parse::<u64>))
                    {
                        last.insert((who.to_owned(), stream.to_owned()), seq);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(Taken {
            path: path.to_owned(),
            last,
        })
    }

    /// Whether `d` is new; if so it is recorded (on disk) before returning.
    fn take(&mut self, d: &Delivery) -> std::io::Result<bool> {
        let key = (d.identity().to_owned(), d.stream.to_string());
        if self.last.get(&key).is_some_and(|&last| d.seq <= last) {
            return Ok(false);
        }
        self.last.insert(key, d.seq);
        // Written whole to a temporary file, fsynced, then renamed over: a crash leaves the old
        // or the new state, never half of one.
        let tmp = self.path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        for ((who, stream), seq) in &self.last {
            writeln!(f, "{who} {stream} {seq}")?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, &self.path)?;
        Ok(true)
    }
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
    let mut taken = match &args.persist {
        Some(path) => Some(Taken::load(path)?),
        None => None,
    };
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Delivery>(usize::from(args.capacity));
    let default = RekeyPolicy::default();
    let rekey = default
        .with_messages(args.rekey_after.unwrap_or(default.messages))
        .with_bytes(args.rekey_after_bytes.unwrap_or(default.bytes))
        .with_seconds(args.rekey_after_seconds.unwrap_or(default.seconds));
    let metrics = ServerMetrics::default();
    let config = ServerConfig::new(args.listen, &args.certs)
        .with_rekey(rekey)
        .with_shared_receive_queue(args.shared_receive_queue);
    let server = Server::bind(config)
        .await?
        .with_handler(tx)
        .with_metrics(metrics.clone());
    println!("message_server listening on {}", server.local_addr()?);
    let serving = tokio::spawn(server.run(shutdown()));

    // (messages, bytes) per client identity.
    let mut counts: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    // Ends once the server has stopped: it held the only sender.
    while let Some(d) = rx.recv().await {
        if let Some(taken) = taken.as_mut() {
            if !taken.take(&d)? {
                println!("{}: skipped duplicate #{}", d.identity(), d.seq);
                std::io::stdout().flush()?;
                continue;
            }
        }
        match (args.ids, d.possibly_delivered) {
            (false, _) => println!("{}: {}", d.identity(), render(d.data())),
            (true, false) => println!("{} #{}: {}", d.identity(), d.seq, render(d.data())),
            (true, true) => println!(
                "{} #{}: {} (possibly delivered)",
                d.identity(),
                d.seq,
                render(d.data())
            ),
        }
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
    println!(
        "key rotations ({rekey}): send {}, receive {}",
        metrics.key_rotations(KeyDirection::Send),
        metrics.key_rotations(KeyDirection::Receive)
    );
    println!(
        "rdma setups: cold {}, warm {}, shared {}",
        metrics.rdma_setups("cold"),
        metrics.rdma_setups("warm"),
        metrics.rdma_setups("shared")
    );
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
