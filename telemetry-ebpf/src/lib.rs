//! Telemetry for secure-rdma: RDMA traffic capture and decoding.
//!
//! [`decode`] is the pure-Rust RoCEv2 packet decoder behind the `rdma-capture` tool; it does not
//! depend on eBPF and can decode frames from XDP/TC, datagrams from the rxe kprobes, or pcap
//! files.

pub mod capture;
pub mod collector;
pub mod decode;
pub mod monitor;
pub mod rdma_cgroup;
pub mod report;
