//! What `rdma-monitor` knows at the end of one reporting interval.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use rdma_quota::{QuotaConfig, Resource, Verb};

use crate::hw_counters::{self, Skipped};

/// One reporting interval of `rdma-monitor`: the input of every renderer.
///
/// Counts of verbs are cumulative since the monitor started; `rates` and
/// [`Interception::in_interval`] cover the last interval only. Live counts
/// are `i64` because the monitor may start after resources were created and
/// then see more destructions than creations.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use rdma_quota::{Resource, Verb};
/// use rdma_monitor::report::{self, Snapshot};
///
/// let mut snapshot = Snapshot::new(SystemTime::UNIX_EPOCH, Duration::from_secs(1));
/// snapshot.live.insert(Resource::Qp, 3);
/// snapshot.totals.insert(Verb::QpCreate, 5);
/// snapshot.rates.insert(Verb::QpCreate, 2.0);
///
/// assert!(report::render_text(&snapshot).starts_with("=== 1970-01-01T00:00:00Z"));
/// assert_eq!(report::render_json(&snapshot)["live"]["QP"], 3);
/// snapshot.source = Some(report::CountSource::Ebpf);
/// assert!(report::render_prometheus(&snapshot)
///     .contains("\nrdma_live_resources{resource=\"qp\",source=\"ebpf\"} 3\n"));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// When the interval ended.
    pub time: SystemTime,
    /// How long the interval was.
    pub interval: Duration,
    /// The thresholds in force ("interception configuration"), if any.
    pub config: Option<QuotaConfig>,
    /// Who counted [`live`](Self::live), [`mr_bytes`](Self::mr_bytes) and
    /// [`totals`](Self::totals): the kernel probes or this process's quota
    /// accounting; `None` when nobody did (no eBPF and no quotas).
    pub source: Option<CountSource>,
    /// Live resources, system-wide.
    pub live: BTreeMap<Resource, i64>,
    /// Bytes of live memory regions, system-wide.
    pub mr_bytes: i64,
    /// Calls of each verb since the monitor started.
    pub totals: BTreeMap<Verb, u64>,
    /// Calls per second of each verb over the last interval.
    pub rates: BTreeMap<Verb, f64>,
    /// Per-cgroup activity.
    pub cgroups: Vec<CgroupStats>,
    /// Calls refused by a quota, one entry per verb, scope and limit.
    pub intercepted: Vec<Interception>,
    /// Kernel events dropped because the ring buffer was full, since start.
    pub lost_events: u64,
    /// How each kernel hook fared when attaching.
    pub attach: Vec<AttachReport>,
    /// Every port hardware counter (see [`crate::hw_counters`]), sorted by device, port and
    /// counter. Read from sysfs, so present with or without eBPF.
    pub hw_counters: Vec<PortCounter>,
    /// Counter files that could not be read for this interval, and why.
    pub hw_counters_skipped: Vec<Skipped>,
    /// RDMA messages that failed authentication (forged, replayed or corrupted), per
    /// identity, since the counting process started; `None` when whoever builds the snapshot
    /// does not count them (rdma-monitor on its own), `Some` (maybe empty) when it does
    /// (secure-server, through [`Sampler::auth_failures_from`](super::Sampler::auth_failures_from)).
    pub auth_failures: Option<BTreeMap<String, u64>>,
}

impl Snapshot {
    /// An interval with nothing observed yet.
    pub fn new(time: SystemTime, interval: Duration) -> Snapshot {
        Snapshot {
            time,
            interval,
            config: None,
            source: None,
            live: BTreeMap::new(),
            mr_bytes: 0,
            totals: BTreeMap::new(),
            rates: BTreeMap::new(),
            cgroups: Vec::new(),
            intercepted: Vec::new(),
            lost_events: 0,
            attach: Vec::new(),
            hw_counters: Vec::new(),
            hw_counters_skipped: Vec::new(),
            auth_failures: None,
        }
    }
}

/// Where a snapshot's verb calls and live resources were counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountSource {
    /// The kernel programs: every process on the host.
    Ebpf,
    /// This process's quota accounting (no eBPF): what it admitted.
    Process,
}

impl CountSource {
    /// The `source` label value of the metrics: `ebpf` or `process`.
    ///
    /// ```
    /// use rdma_monitor::report::CountSource;
    ///
    /// assert_eq!(CountSource::Ebpf.label(), "ebpf");
    /// ```
    pub fn label(self) -> &'static str {
        match self {
            CountSource::Ebpf => "ebpf",
            CountSource::Process => "process",
        }
    }
}

/// One port hardware counter at the end of an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortCounter {
    /// The RDMA device.
    pub device: String,
    /// The port number.
    pub port: u32,
    /// The counter's name, as the driver spells it.
    pub counter: String,
    /// Its value (the driver's count since the device was created).
    pub total: u64,
    /// How much it grew since the previous snapshot; `None` when there is no earlier reading
    /// of it (the first snapshot, a device that just appeared). A counter that went down
    /// (its device was re-created) counts from zero again, so the delta is its total.
    pub delta: Option<u64>,
}

impl PortCounter {
    /// Whether it is one of [`hw_counters::SECURITY_COUNTERS`].
    ///
    /// ```
    /// use rdma_monitor::report::PortCounter;
    ///
    /// let c = PortCounter {
    ///     device: "rxe-a".into(), port: 1, counter: "out_of_seq_request".into(),
    ///     total: 1, delta: Some(1),
    /// };
    /// assert!(c.is_security_relevant() && c.changed());
    /// ```
    pub fn is_security_relevant(&self) -> bool {
        hw_counters::is_security_counter(&self.counter)
    }

    /// Whether it moved during the interval.
    pub fn changed(&self) -> bool {
        self.delta.is_some_and(|d| d > 0)
    }
}

/// The activity of one cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupStats {
    /// The cgroup v2 id (inode number of its directory).
    pub id: u64,
    /// Its path below the cgroup root (`/system.slice/x`), or empty if
    /// unknown (the cgroup may be gone already).
    pub path: String,
    /// Calls of each verb since the monitor started.
    pub ops: BTreeMap<Verb, u64>,
    /// Live resources created from this cgroup.
    pub live: BTreeMap<Resource, i64>,
}

/// Calls of one verb refused by one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interception {
    /// The refused verb.
    pub verb: Verb,
    /// Whose limit: a tenant name, `global`, or a cgroup path.
    pub scope: String,
    /// The limit's key (`QP_COUNT`, `MR_REG`, ...).
    pub key: String,
    /// The limit's value.
    pub limit: u64,
    /// Refusals since the monitor started.
    pub count: u64,
    /// Refusals during this interval; text reports mark the verb
    /// `INTERCEPTED` when this is non-zero.
    pub in_interval: u64,
}

/// How attaching one kernel hook went (the monitor's own record).
pub use crate::monitor::AttachReport;
