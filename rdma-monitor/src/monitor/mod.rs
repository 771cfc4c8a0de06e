//! RDMA control-path monitor: loads telemetry-ebpf's `bpf/monitor.bpf.c` with aya, attaches its
//! probes, and reads the kernel-side counters and per-call events.
//!
//! The kernel programs count the verbs user space makes through `ib_uverbs` (QP/PD/CQ/MR
//! create and destroy, QP modify, GID queries) plus `rdma_cma:cm_send_req`, with results and
//! latencies, per cgroup; and the PD/CQ/QP/MR objects created through uverbs that are still
//! alive (plus registered MR bytes), charged to the creating cgroup. Objects that existed
//! before `Monitor::start` are not counted. Kernel-internal users of the RDMA stack (ULPs
//! such as NVMe-oF or NFS/RDMA) are excluded, except for `CM_SEND_REQ`, whose tracepoint fires
//! for every `rdma_connect()`.
//!
//! See `bpf/monitor.bpf.c` for the hook list and why each function was chosen.
//!
//! The counters ([`KernelCounters`], [`AttachReport`]) are plain data and always here; loading
//! the programs (`Monitor`) needs the `ebpf` feature (on by default).

mod counters;
#[cfg(feature = "ebpf")]
mod event;
#[cfg(feature = "ebpf")]
mod hooks;
#[cfg(feature = "ebpf")]
mod probes;

pub use counters::{AttachReport, CgroupCounters, KernelCounters, MonitorDiagnostics};
#[cfg(feature = "ebpf")]
pub use event::{parse_event, Event, EventParseError, EVENT_RECORD_LEN};
#[cfg(feature = "ebpf")]
pub use probes::{Monitor, MonitorError, MonitorOptions, MAX_EVENT_BATCH};
