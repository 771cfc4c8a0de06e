//! Telemetry for secure-rdma: RoCEv2 capture and control-path monitoring with eBPF.
//!
//! Kernel-side programs are C (`bpf/*.bpf.c`, CO-RE), built by `build.rs` and loaded with aya;
//! everything else is user space. In reading order:
//! - [`abi`]: the contract with the kernel programs (constants, record layouts), written once;
//! - [`capture`]: `rdma-capture`'s XDP/TC/rxe-probe capture, filters and output (decoding,
//!   pcap files and QP following are the `roce` crate's);
//! - [`monitor`]: `rdma-monitor`'s control-path probes and their counters and events;
//! - [`hw_counters`]: the RDMA ports' hardware counters from sysfs (no eBPF), which show
//!   packet injection and PSN guessing;
//! - [`report`]: per-interval snapshots rendered as text, JSON and Prometheus metrics.
//!
//! Quota types, tenants, cgroup helpers and the admission collector are their own crates
//! (`rdma-quota`, `rdma-collector`); `rdma-monitor --collector` runs the collector in-process.

pub mod abi;
pub mod capture;
pub mod hw_counters;
pub mod monitor;
pub mod report;
/// One ring-buffer wait shared by capture and monitor.
mod ring;
