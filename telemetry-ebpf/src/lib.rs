//! The kernel side of secure-rdma's telemetry and its contract with user space.
//!
//! Kernel-side programs are C (`bpf/*.bpf.c`, CO-RE), built by `build.rs`; this crate embeds
//! them and holds what every tool that loads them shares. In reading order:
//! - [`abi`]: the contract with the kernel programs (constants, record layouts), written once
//!   and checked against the objects' BTF;
//! - [`objects`]: the compiled programs;
//! - [`host`]: whether the running kernel and process can load them;
//! - [`btf`]: the BTF to relocate against (vmlinux plus a module's split BTF);
//! - [`loader`]: finding and loading programs in an aya object;
//! - [`ring`]: waiting on a ring buffer.
//!
//! The tools are their own crates: `rdma-monitor` (control-path probes, reports) and
//! `rdma-capture` (RoCEv2 packet capture).
//!
//! ```
//! use telemetry_ebpf::{abi, objects};
//!
//! assert_eq!(abi::CAPTURE_HEADER_LEN, 24);
//! if objects::MONITOR.is_empty() {
//!     println!("built without clang: the monitor's programs are missing");
//! }
//! ```

pub mod abi;
pub mod btf;
pub mod host;
pub mod loader;
pub mod objects;
pub mod ring;

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
