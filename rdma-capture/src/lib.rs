//! RoCEv2 capture on Soft-RoCE with eBPF: what `rdma-capture` does, as a library.
//!
//! Kernel side (`bpf/capture.bpf.c` of `telemetry-ebpf`): XDP on the netdev's ingress and a TC
//! classifier on its egress keep UDP/4791 frames; kprobes on `rxe_rcv` and on the return of
//! `rxe_icrc_generate` see every packet an rxe device receives or sends, including traffic
//! between two QPs of one device, which rxe loops back without a netdev. Records reach user
//! space through one ring buffer; drops are counted in the kernel.
//!
//! User side, one concept per module:
//! - [`record`]: the ring-buffer record format and clock conversion;
//! - [`netdev`]: the netdev under an rxe device;
//! - [`offline`]: decoding a pcap file instead of live traffic;
//! - [`filter`]: opcode classes;
//! - [`processor`]: decode, filter, follow a QP's PSNs, print, write pcap, summarize;
//! - [`output`]: the `-w` file, private and never through a symlink;
//! - [`loader`]: loading and attaching the programs with aya.

pub mod filter;
pub mod loader;
pub mod netdev;
pub mod offline;
pub mod output;
pub mod processor;
pub mod record;

pub use record::{parse_record, wall_time, Record, Source, MAX_SNAPLEN, RECORD_HEADER_LEN};

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
