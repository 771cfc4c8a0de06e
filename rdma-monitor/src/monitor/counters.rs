//! What the kernel programs counted and how attaching went: plain data, which the reports
//! read whether or not this build loads the programs.

use std::collections::BTreeMap;

use rdma_quota::{Resource, Verb};

/// The outcome of attaching one hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachReport {
    /// Kernel function, or `category:name` for a tracepoint.
    pub hook: String,
    /// `kprobe+kretprobe`, `kprobe` or `tracepoint`.
    pub kind: String,
    /// Whether it is attached now.
    pub attached: bool,
    /// Why not (or, for an attached clone such as `foo.isra.0`, which symbol was used).
    pub reason: Option<String>,
}

/// Counters of one cgroup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CgroupCounters {
    /// Calls per verb made from this cgroup since the monitor started (failed calls included).
    pub ops: BTreeMap<Verb, u64>,
    /// Live objects created from this cgroup (since the monitor started) and not destroyed yet.
    pub live: BTreeMap<Resource, i64>,
}

/// A snapshot of the kernel-side counters (per-CPU values summed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelCounters {
    /// Live user objects per resource, created since the monitor started.
    pub live: BTreeMap<Resource, i64>,
    /// Bytes of the live memory regions counted in `live[Mr]`.
    pub mr_bytes: i64,
    /// Calls per verb since the monitor started (every verb present; failures included).
    /// Per-second rates are deltas between snapshots.
    pub totals: BTreeMap<Verb, u64>,
    /// Failed calls per verb (every verb present).
    pub errors: BTreeMap<Verb, u64>,
    /// Per cgroup id (see [`rdma_quota::cgroup::path_of_id`]).
    pub per_cgroup: BTreeMap<u64, CgroupCounters>,
    /// Events dropped because the ring buffer was full (their counters were still updated).
    pub lost_events: u64,
}

/// Kernel-side bookkeeping counters, for diagnosing unexpected numbers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MonitorDiagnostics {
    /// Successful destroys of objects created before the monitor started (not in `live`).
    pub untracked_destroys: u64,
    /// New objects not counted because the kernel `tracked` map (65536 entries) was full.
    pub tracked_full: u64,
    /// Tracked objects whose address was reused without a destroy being seen.
    pub stale_tracked: u64,
    /// Calls not counted because the kernel `inflight` map was full.
    pub inflight_full: u64,
    /// Ring-buffer records user space could not parse.
    pub bad_records: u64,
}
