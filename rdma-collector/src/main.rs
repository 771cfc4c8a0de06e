//! `rdma-collector`: the admission daemon of the `LD_PRELOAD` interceptor
//! (`librdma_intercept.so`). Argument parsing, log setup and wiring only; the
//! work is in the `rdma_collector` library.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Parser;
use rdma_cli::logging::{self, LogFormat};
use rdma_collector::{Collector, ConnectionBounds};
use rdma_quota::tenant::TenantBy;
use rdma_quota::wire::DEFAULT_SOCKET;
use rdma_quota::{LimitSetting, QuotaConfig, Quotas, Verb};

/// Decide RDMA resource quotas for programs run with
/// LD_PRELOAD=librdma_intercept.so.
///
/// Each intercepted program connects to --socket and asks before it creates
/// a QP, PD, CQ or MR; this daemon admits or denies by the quota file and
/// --limit flags, per tenant (--tenant-by) and globally. A program's
/// resources are released when it destroys them or when it exits. Logs one
/// line per decision on stderr (RUST_LOG=debug for more). Stops on SIGINT or
/// SIGTERM.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Unix socket to listen on (mode 0666; its directory is created 0755).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Quota file: `KEY VALUE` and `tenant NAME KEY VALUE` lines, as for rdma-monitor.
    #[arg(long, value_name = "FILE")]
    quota: Option<PathBuf>,
    /// A limit, overriding the file: KEY=VALUE or tenant:NAME:KEY=VALUE (repeatable).
    #[arg(long = "limit", value_name = "KEY=VALUE")]
    limits: Vec<LimitSetting>,
    /// What a tenant is: the user name of the program's uid, or the last
    /// component of its cgroup v2 path.
    #[arg(long, value_name = "user|cgroup", default_value_t = TenantBy::User)]
    tenant_by: TenantBy,
    /// Open connections allowed per uid.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().per_uid)]
    max_connections_per_uid: usize,
}

fn main() {
    logging::init(LogFormat::Text, "info");
    if let Err(e) = run(Args::parse()) {
        eprintln!("rdma-collector: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    let mut config = match &args.quota {
        Some(path) => QuotaConfig::load(path)?,
        None => QuotaConfig::default(),
    };
    for setting in &args.limits {
        config.apply(setting);
    }
    tracing::info!(limits = %config.to_string().trim_end().replace('\n', "; "), "quotas");
    let quotas = Quotas::new(config);
    let bounds = ConnectionBounds {
        per_uid: args.max_connections_per_uid,
        ..ConnectionBounds::default()
    };
    let collector =
        Collector::bind(&args.socket, quotas.clone(), args.tenant_by)?.with_bounds(bounds);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        collector.run(shutdown).await?;
        anyhow::Ok(())
    })?;
    let global = quotas.snapshot().global;
    let live: Vec<String> = global
        .live
        .iter()
        .map(|(r, n)| format!("{r}={n}"))
        .collect();
    let nonzero = |counts: &BTreeMap<Verb, u64>| {
        let v: Vec<String> = counts
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(verb, n)| format!("{verb}={n}"))
            .collect();
        v.join(" ")
    };
    tracing::info!(
        live = %live.join(" "),
        mr_bytes = global.mr_bytes,
        admitted = %nonzero(&global.admitted),
        denied = %nonzero(&global.intercepted),
        "final counts"
    );
    Ok(())
}
