//! The contract between the kernel programs (`bpf/*.bpf.c`) and this crate, defined once.
//!
//! - **Numbers** (map slots, sizes, record sources) are written once, in `src/abi_consts.rs`.
//!   `build.rs` generates `$OUT_DIR/abi.h` from it, and the C programs include that header, so C
//!   and Rust cannot disagree on a slot.
//! - **Verb and resource ids** are [`rdma_quota::Verb::id`] and [`rdma_quota::Resource::id`], the
//!   ids the quotas, the collector and the interceptor use; `abi.h` carries them as `V_*` and
//!   `R_*`.
//! - **Records** the programs write to their ring buffers are mirrored by the `#[repr(C)]`
//!   structs below. The C side cannot include Rust, so the layouts are checked instead: a test
//!   reads the compiled objects' BTF and compares the size and every member offset.
//!
//! ```
//! use telemetry_ebpf::abi;
//!
//! assert_eq!(abi::MONITOR_EVENT_LEN, 120);
//! assert_eq!(abi::CAPTURE_HEADER_LEN, 24);
//! assert!(usize::from(rdma_quota::Verb::CmSendReq.id()) < abi::N_VERBS as usize);
//! ```

use std::mem::{offset_of, size_of};

macro_rules! abi_consts {
    ($( $(#[$doc:meta])* $name:ident = $value:expr; )*) => {
        $( $(#[$doc])* pub const $name: u32 = $value; )*
    };
}
include!("abi_consts.rs");

/// One control-path call, as `bpf/monitor.bpf.c` writes it (`struct event`), little endian.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct MonitorEvent {
    /// `bpf_ktime_get_ns()` when the call returned.
    pub ktime_ns: u64,
    /// cgroup v2 id of the caller.
    pub cgroup_id: u64,
    /// Entry to return, in nanoseconds.
    pub latency_ns: u64,
    /// Thread-group id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// 0, or the negative errno.
    pub result: i32,
    /// [`rdma_quota::Verb::id`].
    pub verb: u8,
    /// Zero.
    pub pad: [u8; 3],
    /// NUL-padded command name.
    pub comm: [u8; COMM_LEN as usize],
    /// NUL-padded RDMA device name.
    pub device: [u8; IB_DEVICE_NAME_MAX as usize],
}

/// Bytes of one monitor event record.
pub const MONITOR_EVENT_LEN: usize = size_of::<MonitorEvent>();

/// Byte offsets of the [`MonitorEvent`] fields the parser reads.
pub mod monitor_event {
    use super::{offset_of, MonitorEvent};

    /// `ktime_ns`.
    pub const KTIME_NS: usize = offset_of!(MonitorEvent, ktime_ns);
    /// `cgroup_id`.
    pub const CGROUP_ID: usize = offset_of!(MonitorEvent, cgroup_id);
    /// `latency_ns`.
    pub const LATENCY_NS: usize = offset_of!(MonitorEvent, latency_ns);
    /// `pid`.
    pub const PID: usize = offset_of!(MonitorEvent, pid);
    /// `tid`.
    pub const TID: usize = offset_of!(MonitorEvent, tid);
    /// `result`.
    pub const RESULT: usize = offset_of!(MonitorEvent, result);
    /// `verb`.
    pub const VERB: usize = offset_of!(MonitorEvent, verb);
    /// `comm`.
    pub const COMM: usize = offset_of!(MonitorEvent, comm);
    /// `device`.
    pub const DEVICE: usize = offset_of!(MonitorEvent, device);
}

/// The header of one captured packet, as `bpf/capture.bpf.c` writes it (`struct event`); the
/// packet's first `cap_len` bytes follow it.
#[derive(Debug, Clone, Copy)]
#[repr(C)]
pub struct CaptureHeader {
    /// Interface index.
    pub ifindex: u32,
    /// One of the `SOURCE_*` constants.
    pub dir: u8,
    /// Zero.
    pub pad: [u8; 3],
    /// The packet's length on the wire.
    pub orig_len: u32,
    /// Bytes that follow the header (at most [`SNAP`]).
    pub cap_len: u32,
    /// `bpf_ktime_get_ns()` when it was seen.
    pub ktime_ns: u64,
}

/// Bytes of a capture record before the packet bytes.
pub const CAPTURE_HEADER_LEN: usize = size_of::<CaptureHeader>();

/// Byte offsets of the [`CaptureHeader`] fields.
pub mod capture_header {
    use super::{offset_of, CaptureHeader};

    /// `ifindex`.
    pub const IFINDEX: usize = offset_of!(CaptureHeader, ifindex);
    /// `dir`.
    pub const DIR: usize = offset_of!(CaptureHeader, dir);
    /// `orig_len`.
    pub const ORIG_LEN: usize = offset_of!(CaptureHeader, orig_len);
    /// `cap_len`.
    pub const CAP_LEN: usize = offset_of!(CaptureHeader, cap_len);
    /// `ktime_ns`.
    pub const KTIME_NS: usize = offset_of!(CaptureHeader, ktime_ns);
}

#[cfg(test)]
mod tests;
