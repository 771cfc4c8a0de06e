//! In-process connect/disconnect cycles against secure-server, for the soak test: each cycle is
//! a whole secure session (TLS, admission, RDMA setup, confirmation, one SEND, quit) from one
//! process, `--concurrency` at a time. Prints a JSON progress line every `--every` cycles, the
//! process's own RSS included, and a final summary; exits non-zero on the first failed cycle.

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use secure_rdma::client::{Client, ClientConfig};

/// Soak client: N in-process secure sessions, connect + send + quit each.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    client: secure_rdma_tests::LabClientArgs,
    /// Cycles in all.
    #[arg(long, default_value_t = 1000)]
    cycles: u64,
    /// Cycles in flight at once.
    #[arg(long, default_value_t = 2)]
    concurrency: u64,
    /// Progress line every this many cycles.
    #[arg(long, default_value_t = 1000)]
    every: u64,
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

async fn cycle(cfg: &ClientConfig, n: u64) -> Result<()> {
    let mut client = Client::connect(cfg)
        .await
        .with_context(|| format!("cycle {n}: connect"))?;
    client
        .send(format!("soak {n}").as_bytes())
        .await
        .with_context(|| format!("cycle {n}: send"))?;
    client.quit().await;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let cfg = args.client.config(Duration::from_secs(30));
    let started = Instant::now();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency.max(1) {
        let (cfg, next, done) = (cfg.clone(), next.clone(), done.clone());
        let (cycles, every) = (args.cycles, args.every.max(1));
        workers.spawn(async move {
            use std::sync::atomic::Ordering::Relaxed;
            loop {
                let n = next.fetch_add(1, Relaxed);
                if n >= cycles {
                    return Ok::<(), anyhow::Error>(());
                }
                cycle(&cfg, n).await?;
                let d = done.fetch_add(1, Relaxed) + 1;
                if d % every == 0 {
                    println!(
                        "{}",
                        serde_json::json!({"cycles": d, "secs": started.elapsed().as_secs_f64(), "rss_kib": rss_kib()})
                    );
                }
            }
        });
    }
    while let Some(joined) = workers.join_next().await {
        if let Err(e) = joined.context("soak worker panicked")? {
            bail!("{e:#}");
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let cycles = done.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "{}",
        serde_json::json!({"done": true, "cycles": cycles, "secs": secs, "per_cycle_ms": secs * 1000.0 / cycles.max(1) as f64, "rss_kib": rss_kib()})
    );
    Ok(())
}
