//! Turns successive counter readings into one [`Snapshot`] per interval.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use rdma_quota::cgroup;
use rdma_quota::{rate_per_second, QuotaConfig, QuotaSnapshot, Scope, Verb};

use super::snapshot::{AttachReport, CgroupStats, Interception, Snapshot};
use crate::monitor::KernelCounters;

/// Keeps the previous reading, so each snapshot carries per-second rates and
/// which refusals are new in its interval.
///
/// The kernel counters, when there are any, are the system-wide truth; without
/// them (no eBPF) the quota counts of the process stand in, so a report is
/// always available.
///
/// ```
/// use std::time::{Duration, Instant, SystemTime};
/// use rdma_quota::{QuotaConfig, Quotas, TenantInfo, Verb};
/// use telemetry_ebpf::report::Sampler;
///
/// let quotas = Quotas::new(QuotaConfig::parse("QP_COUNT 1\n", "q")?);
/// let t = quotas.register(TenantInfo { identity: "a".into(), pid: 1, cgroup_id: 1 });
/// let mut sampler = Sampler::new(Some(quotas.config().clone()));
/// let t0 = Instant::now();
/// sampler.sample(t0, SystemTime::now(), None, Some(&quotas.snapshot()), &[]);
///
/// let _qp = t.admit(Verb::QpCreate)?;
/// assert!(t.admit(Verb::QpCreate).is_err());
/// let s = sampler.sample(t0 + Duration::from_secs(2), SystemTime::now(), None, Some(&quotas.snapshot()), &[]);
/// assert_eq!(s.rates[&Verb::QpCreate], 0.5);
/// assert_eq!(s.intercepted[0].key, "QP_COUNT");
/// assert_eq!(s.intercepted[0].in_interval, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Sampler {
    config: Option<QuotaConfig>,
    cgroup_root: PathBuf,
    previous: Option<(Instant, BTreeMap<Verb, u64>)>,
    refusals: BTreeMap<(Verb, String, String), u64>,
    cgroup_paths: BTreeMap<u64, String>,
}

impl Sampler {
    /// A sampler reporting `config` as the interception configuration.
    pub fn new(config: Option<QuotaConfig>) -> Sampler {
        Sampler {
            config,
            cgroup_root: PathBuf::from(cgroup::CGROUP_ROOT),
            previous: None,
            refusals: BTreeMap::new(),
            cgroup_paths: BTreeMap::new(),
        }
    }

    /// The snapshot of the interval ending `now` (`time` is its wall-clock time).
    pub fn sample(
        &mut self,
        now: Instant,
        time: SystemTime,
        kernel: Option<&KernelCounters>,
        quotas: Option<&QuotaSnapshot>,
        attach: &[AttachReport],
    ) -> Snapshot {
        let interval = self
            .previous
            .as_ref()
            .map(|(then, _)| now.saturating_duration_since(*then))
            .unwrap_or_default();
        let mut s = Snapshot::new(time, interval);
        s.config = self.config.clone().filter(|c| !c.is_empty());
        s.attach = attach.to_vec();
        match (kernel, quotas) {
            (Some(k), _) => {
                s.live = k.live.clone();
                s.mr_bytes = k.mr_bytes;
                s.totals = k.totals.clone();
                s.lost_events = k.lost_events;
                for (id, c) in &k.per_cgroup {
                    let root = &self.cgroup_root;
                    let path = self
                        .cgroup_paths
                        .entry(*id)
                        .or_insert_with(|| {
                            cgroup::path_of_id(root, *id).unwrap_or_else(|| "(gone)".to_owned())
                        })
                        .clone();
                    s.cgroups.push(CgroupStats {
                        id: *id,
                        path,
                        ops: c.ops.clone(),
                        live: c.live.clone(),
                    });
                }
            }
            (None, Some(q)) => {
                s.live = q
                    .global
                    .live
                    .iter()
                    .map(|(r, n)| (*r, i64::try_from(*n).unwrap_or(i64::MAX)))
                    .collect();
                s.mr_bytes = i64::try_from(q.global.mr_bytes).unwrap_or(i64::MAX);
                s.totals = q.global.admitted.clone();
            }
            (None, None) => {}
        }
        if let Some((_, before)) = &self.previous {
            for (verb, total) in &s.totals {
                let prev = before.get(verb).copied().unwrap_or(0);
                s.rates
                    .insert(*verb, rate_per_second(prev, *total, interval));
            }
        }
        if let Some(q) = quotas {
            for r in &q.refusals {
                let scope = match &r.scope {
                    Scope::Global => "global".to_owned(),
                    Scope::Tenant(name) => name.clone(),
                };
                let key = r.key.to_string();
                let seen = self
                    .refusals
                    .insert((r.verb, scope.clone(), key.clone()), r.count)
                    .unwrap_or(0);
                s.intercepted.push(Interception {
                    verb: r.verb,
                    scope,
                    key,
                    limit: r.limit,
                    count: r.count,
                    in_interval: r.count.saturating_sub(seen),
                });
            }
        }
        self.previous = Some((now, s.totals.clone()));
        s
    }
}
