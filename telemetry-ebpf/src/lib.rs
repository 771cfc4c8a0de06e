//! Telemetry for secure-rdma: RoCEv2 capture and control-path monitoring with eBPF.
//!
//! Kernel-side programs are C (`bpf/*.bpf.c`, CO-RE), built by `build.rs` and loaded with aya;
//! everything else is user space:
//! - [`decode`]: the pure-Rust RoCEv2 decoder (no eBPF needed: frames, datagrams or pcap files);
//! - [`capture`]: `rdma-capture`'s XDP/TC/rxe-probe capture, filters and output;
//! - [`monitor`]: `rdma-monitor`'s control-path probes and their counters and events;
//! - [`report`]: per-interval snapshots rendered as text, JSON and Prometheus metrics;
//! - [`collector`]: the admission daemon of the LD_PRELOAD interceptor;
//! - [`rdma_cgroup`]: the kernel's rdma cgroup limits.

pub mod capture;
pub mod collector;
pub mod decode;
pub mod monitor;
pub mod rdma_cgroup;
pub mod report;
mod ring;
