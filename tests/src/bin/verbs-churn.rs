//! `verbs-churn`: an unmodified verbs program that floods the control path.
//! For a fixed time it creates a completion queue and destroys it again, in
//! a loop; a refused creation is simply retried, as a careless program
//! would. The noisy neighbour of the isolation lab test
//! (tests/tests/isolation_lab.rs).
//!
//! libibverbs is resolved through the global scope (`dlopen` with
//! `RTLD_GLOBAL`, then `dlsym(RTLD_DEFAULT, ...)`), the way the dynamic
//! linker binds a linked program's imports, so an `LD_PRELOAD` object
//! comes first. No link-time dependency on libibverbs, no C.
//!
//! Prints one JSON line at the end:
//! `{"ok":N,"refused":N,"errno":{"122":N},"elapsed_ms":N,"ok_at_ms":[...]}`,
//! where `ok_at_ms` are the times (since the start) of the successful
//! creations, for measuring the rate over a window.

use std::collections::BTreeMap;
use std::ptr;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Parser;
use secure_rdma_tests::dlverbs::{Resolve, Verbs};
use serde_json::json;

/// Creates and destroys completion queues in a loop, retrying refusals.
#[derive(Debug, Parser)]
struct Args {
    /// RDMA device.
    #[arg(long, default_value = "rxe-a")]
    device: String,
    /// How long to churn, in milliseconds.
    #[arg(long, default_value_t = 5000)]
    millis: u64,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("verbs-churn: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<()> {
    let verbs = Verbs::load(Resolve::Global)?;
    let ctx = verbs.open(&args.device)?;
    let (create_cq, destroy_cq) = (verbs.create_cq, verbs.destroy_cq);
    // Tells a test the flood is on (the device is open, the loop starts).
    eprintln!("verbs-churn: churning on {}", args.device);
    let window = Duration::from_millis(args.millis);
    let started = Instant::now();
    let (mut ok, mut refused) = (0u64, 0u64);
    let mut errnos: BTreeMap<i32, u64> = BTreeMap::new();
    let mut ok_at_ms = Vec::new();
    while started.elapsed() < window {
        // SAFETY: a valid context; no channel, vector 0.
        let cq = unsafe { create_cq(ctx, 16, ptr::null_mut(), ptr::null_mut(), 0) };
        if cq.is_null() {
            refused += 1;
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            *errnos.entry(errno).or_default() += 1;
            continue;
        }
        ok += 1;
        ok_at_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        // SAFETY: the CQ this loop just created.
        if unsafe { destroy_cq(cq) } != 0 {
            bail!("ibv_destroy_cq failed: {}", std::io::Error::last_os_error());
        }
    }
    let errno: BTreeMap<String, u64> = errnos
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    println!(
        "{}",
        json!({
            "ok": ok,
            "refused": refused,
            "errno": errno,
            "elapsed_ms": started.elapsed().as_millis() as u64,
            "ok_at_ms": ok_at_ms,
        })
    );
    Ok(())
}
