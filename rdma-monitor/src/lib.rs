//! RDMA monitoring for secure-rdma: what `rdma-monitor` does, as a library.
//!
//! In reading order:
//! - [`monitor`]: the control-path probes (telemetry-ebpf's `bpf/monitor.bpf.c`) and what they
//!   count; loading them needs the `ebpf` feature, the counters themselves do not;
//! - [`hw_counters`]: the RDMA ports' hardware counters from sysfs (no eBPF), which show
//!   packet injection and PSN guessing;
//! - [`report`]: per-interval snapshots rendered as text, JSON and Prometheus metrics, and the
//!   HTTP exporter that serves them;
//! - [`detect`]: noisy tenants, the processes, cgroups or users whose control-verb rate stays
//!   above a threshold for a window;
//! - [`enforce`]: a rate limit on a cgroup's RDMA object creations, enforced in the kernel by a
//!   BPF LSM program (needs the `ebpf` feature), which no user-space bypass gets around.
//!
//! Without default features (`default-features = false`) the crate is the reports and the
//! hardware counters alone: no aya, no BPF objects, no command line. Quota types, tenants,
//! cgroup helpers and the admission collector are their own crates (`rdma-quota`,
//! `rdma-collector`); `rdma-monitor --collector` runs the collector in-process.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use rdma_monitor::report::{render_text, Snapshot};
//!
//! let snapshot = Snapshot::new(SystemTime::now(), Duration::from_secs(5));
//! assert!(!render_text(&snapshot).is_empty());
//! ```

pub mod detect;
#[cfg(feature = "ebpf")]
pub mod enforce;
pub mod hw_counters;
pub mod monitor;
pub mod report;

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
