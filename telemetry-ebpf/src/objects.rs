//! The compiled kernel programs, embedded: `build.rs` writes them into this crate's `OUT_DIR`,
//! so this is the one crate that can include them, and the tools take them from here.
//!
//! An object is empty when `build.rs` could not compile it (no clang or no BTF at build time);
//! the tool that needs it then says so instead of loading it.
//!
//! ```
//! use telemetry_ebpf::objects;
//!
//! // Either a BPF ELF object or, built without clang, empty.
//! for object in [objects::MONITOR, objects::ENFORCE, objects::CAPTURE] {
//!     assert!(object.is_empty() || object.starts_with(b"\x7fELF"));
//! }
//! ```

/// `bpf/monitor.bpf.c` compiled: rdma-monitor's control-path probes.
pub static MONITOR: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/monitor.bpf.o"));

/// `bpf/enforce.bpf.c` compiled: rdma-monitor's kernel rate limit (a BPF LSM program).
pub static ENFORCE: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/enforce.bpf.o"));

/// `bpf/capture.bpf.c` compiled: rdma-capture's XDP, TC and rxe-probe programs.
pub static CAPTURE: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/capture.bpf.o"));
