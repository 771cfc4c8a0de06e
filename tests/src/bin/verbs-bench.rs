//! `verbs-bench`: the two control- and data-path loops whose cost telemetry
//! could change, measured in one process on the lab's two rxe devices:
//!
//! - QP create + destroy cycles per second (the control path the probes hook);
//! - SEND round trips between a QP on `rxe-a` and one on `rxe-b` (the data
//!   path, which the probes must leave alone).
//!
//! Prints one JSON line. `scripts/bench-telemetry.sh` runs it with and without
//! rdma-monitor and writes the comparison table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use secure_rdma::psn::Psn;
use secure_rdma::verbs::{
    CompletionQueue, Device, GidEntry, GidSelector, MemoryRegion, MrAccess, ProtectionDomain,
    QpCaps, QueuePair, RtrParams, Rts, RtsParams,
};
use serde_json::json;

/// Measures QP create+destroy throughput and SEND round-trip latency.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// QP create + destroy cycles.
    #[arg(long, default_value_t = 300)]
    qp_cycles: u32,
    /// SEND round trips (A -> B -> A).
    #[arg(long, default_value_t = 2000)]
    round_trips: u32,
    /// Device of the first QP.
    #[arg(long, default_value = "rxe-a")]
    device_a: String,
    /// Device of the second QP.
    #[arg(long, default_value = "rxe-b")]
    device_b: String,
    /// Message size in bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
}

const TIMEOUT: Duration = Duration::from_secs(5);

struct End {
    pd: Arc<ProtectionDomain>,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    sgid: GidEntry,
    device: Arc<Device>,
}

fn end(name: &str) -> Result<End> {
    let device = Device::open(Some(name))?;
    // The lab's RoCEv2 GID is the IPv4-mapped one at index 1.
    let sgid = device.select_gid(&GidSelector::Index(1))?;
    Ok(End {
        pd: device.alloc_pd()?,
        send_cq: CompletionQueue::new(&device, 64)?,
        recv_cq: CompletionQueue::new(&device, 64)?,
        sgid,
        device,
    })
}

fn connect(a: &End, b: &End) -> Result<(QueuePair<Rts>, QueuePair<Rts>)> {
    let qa = QueuePair::create(
        &a.pd,
        &a.send_cq,
        &a.recv_cq,
        a.sgid.clone(),
        QpCaps::default(),
    )?
    .into_init(false)?;
    let qb = QueuePair::create(
        &b.pd,
        &b.send_cq,
        &b.recv_cq,
        b.sgid.clone(),
        QpCaps::default(),
    )?
    .into_init(false)?;
    let (pa, pb) = (Psn::random(), Psn::random());
    let mtu = a.device.active_mtu()?.min(b.device.active_mtu()?);
    let qa = qa
        .into_rtr(RtrParams {
            remote_qpn: qb.qpn(),
            remote_psn: pb,
            remote_gid: b.sgid.gid,
            path_mtu: mtu,
        })?
        .into_rts(RtsParams { local_psn: pa })?;
    let qb = qb
        .into_rtr(RtrParams {
            remote_qpn: qa.qpn(),
            remote_psn: pa,
            remote_gid: a.sgid.gid,
            path_mtu: mtu,
        })?
        .into_rts(RtsParams { local_psn: pb })?;
    Ok((qa, qb))
}

/// Busy-polls one completion: the loop measures verbs, not the event channel.
fn poll(cq: &CompletionQueue, what: &str) -> Result<()> {
    let start = Instant::now();
    loop {
        if let Some(wc) = cq.try_next()? {
            if !wc.status.is_success() {
                bail!("{what}: completion {}", wc.status.name());
            }
            return Ok(());
        }
        if start.elapsed() > TIMEOUT {
            bail!("{what}: no completion within {TIMEOUT:?}");
        }
        std::hint::spin_loop();
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

// Completion queues register their event channel with tokio, so a runtime
// must exist; the loops themselves busy-poll and never await.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args = Args::parse();
    let a = end(&args.device_a)?;
    let b = end(&args.device_b)?;

    let start = Instant::now();
    for _ in 0..args.qp_cycles {
        let qp = QueuePair::create(
            &a.pd,
            &a.send_cq,
            &a.recv_cq,
            a.sgid.clone(),
            QpCaps::default(),
        )?;
        drop(qp);
    }
    let qp_secs = start.elapsed().as_secs_f64();

    let (mut qa, mut qb) = connect(&a, &b)?;
    let size = args.size.max(1);
    let (ma, mb) = (
        MemoryRegion::new(&a.pd, size, MrAccess::Local)?,
        MemoryRegion::new(&b.pd, size, MrAccess::Local)?,
    );
    let mut rtts = Vec::with_capacity(args.round_trips as usize);
    let loop_start = Instant::now();
    for i in 0..u64::from(args.round_trips) {
        qb.post_recv(i, &mb, 0..size)?;
        qa.post_recv(i, &ma, 0..size)?;
        let t = Instant::now();
        qa.post_send(i, &ma, 0..size)?;
        poll(&b.recv_cq, "B's receive")?;
        qb.post_send(i, &mb, 0..size)?;
        poll(&a.recv_cq, "A's receive")?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
        poll(&a.send_cq, "A's send")?;
        poll(&b.send_cq, "B's send")?;
    }
    let loop_secs = loop_start.elapsed().as_secs_f64();
    rtts.sort_by(f64::total_cmp);
    let mean = rtts.iter().sum::<f64>() / rtts.len().max(1) as f64;
    println!(
        "{}",
        json!({
            "qp_cycles": args.qp_cycles,
            "qp_cycles_per_s": f64::from(args.qp_cycles) / qp_secs,
            "round_trips": args.round_trips,
            "round_trips_per_s": f64::from(args.round_trips) / loop_secs,
            "rtt_us_mean": mean,
            "rtt_us_p50": percentile(&rtts, 0.5),
            "rtt_us_p99": percentile(&rtts, 0.99),
        })
    );
    Ok(())
}
