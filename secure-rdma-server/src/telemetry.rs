//! `--telemetry`: eBPF control-path telemetry inside the server, or the
//! server's own counts when eBPF is not available (on the host, or in a build
//! without the `telemetry` feature). Wiring only.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};
use rdma_monitor::monitor::KernelCounters;
use rdma_monitor::report::{self, BuildInfo, Sampler, Snapshot};
use secure_rdma::metrics::ServerMetrics;
use secure_rdma::quota::Quotas;
use tokio::sync::watch;

/// The `secure_server_build_info` metric.
pub const BUILD: BuildInfo = BuildInfo {
    exporter: "secure_server",
    version: env!("CARGO_PKG_VERSION"),
};

/// Starts the probes (when it can) and a task logging one report per `every`;
/// serves Prometheus metrics at `metrics` if given: the build info, the
/// server's own counts (current at each scrape) and the latest report.
pub async fn start(
    quotas: Quotas,
    every: Duration,
    metrics: Option<SocketAddr>,
    server_metrics: ServerMetrics,
) -> Result<()> {
    let monitor = probes().await?;
    let auth_failures = server_metrics.clone();
    let tx = match metrics {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} for --metrics"))?;
            let (tx, latest) = watch::channel(None::<Arc<Snapshot>>);
            tracing::info!(addr = %listener.local_addr()?, "telemetry: Prometheus metrics at /metrics");
            // Rendered per scrape: sessions and handshakes change between reports.
            tokio::spawn(report::serve_metrics_with(listener, move || {
                let snapshot = latest.borrow().clone();
                report::render_exposition(snapshot.as_deref(), &BUILD, |registry| {
                    server_metrics.register(registry)
                })
            }));
            Some(tx)
        }
        None => None,
    };
    tokio::spawn(async move {
        // Messages that failed authentication, per identity, next to the port counters that
        // show the same injection from the device's side.
        let mut sampler = Sampler::new(Some(quotas.config().clone()))
            .auth_failures_from(move || auth_failures.auth_failures());
        let mut ticker = tokio::time::interval(every);
        loop {
            ticker.tick().await;
            let kernel = monitor.as_ref().and_then(counters);
            let snapshot = sampler.sample(
                Instant::now(),
                SystemTime::now(),
                kernel.as_ref(),
                Some(&quotas.snapshot()),
                &[],
            );
            let source = if kernel.is_some() {
                "ebpf"
            } else {
                "in-process"
            };
            let json = report::render_json(&snapshot);
            // Published before it is logged: whoever reads the log line and then scrapes must
            // find this report (metrics_endpoint.rs once scraped between the two and missed it).
            if let Some(tx) = &tx {
                tx.send_replace(Some(Arc::new(snapshot)));
            }
            tracing::info!(source, report = %json, "telemetry");
        }
    });
    Ok(())
}

/// The eBPF probes, when they load on this host; `None`, after a warning, when they do not.
#[cfg(feature = "telemetry")]
async fn probes() -> Result<Option<Probes>> {
    use rdma_monitor::monitor::{Monitor, MonitorOptions};

    let options = MonitorOptions {
        events: false,
        ..MonitorOptions::default()
    };
    Ok(
        match tokio::task::spawn_blocking(move || Monitor::start(options)).await? {
            Ok(m) => {
                let attached = m.attach_report().iter().filter(|a| a.attached).count();
                tracing::info!(
                    attached,
                    "telemetry: eBPF probes attached (system-wide counts)"
                );
                Some(m)
            }
            Err(e) => {
                tracing::warn!(error = %e, "telemetry: eBPF unavailable; falling back to the server's own counts");
                None
            }
        },
    )
}

/// This build has no eBPF: the reports are the server's own counts, and the log says why.
#[cfg(not(feature = "telemetry"))]
async fn probes() -> Result<Option<Probes>> {
    tracing::warn!(
        error = "this secure-server was built without the `telemetry` feature (rebuild: cargo build -p secure-rdma-server --features telemetry)",
        "telemetry: eBPF unavailable; falling back to the server's own counts"
    );
    Ok(None)
}

/// The running probes.
#[cfg(feature = "telemetry")]
type Probes = rdma_monitor::monitor::Monitor;

/// No probes can run in a build without eBPF: a value of this type never exists.
#[cfg(not(feature = "telemetry"))]
enum Probes {}

/// What the probes counted, or `None` (after a warning) when their maps cannot be read.
#[cfg(feature = "telemetry")]
fn counters(monitor: &Probes) -> Option<KernelCounters> {
    match monitor.counters() {
        Ok(k) => Some(k),
        Err(e) => {
            tracing::warn!(error = %e, "telemetry: cannot read the BPF maps");
            None
        }
    }
}

#[cfg(not(feature = "telemetry"))]
fn counters(monitor: &Probes) -> Option<KernelCounters> {
    match *monitor {}
}
