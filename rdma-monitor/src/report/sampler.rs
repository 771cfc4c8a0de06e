//! Turns successive counter readings into one [`Snapshot`] per interval.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

use rdma_quota::cgroup;
use rdma_quota::{rate_per_second, QuotaConfig, QuotaSnapshot, Scope, Verb};

use super::snapshot::{
    AttachReport, CgroupStats, CountSource, Interception, PortCounter, Snapshot,
};
use crate::hw_counters::{CounterId, PortCounterReader};
use crate::monitor::KernelCounters;

/// Where a sampler gets the authentication failures per identity (see
/// [`Sampler::auth_failures_from`]).
type AuthFailureSource = Box<dyn Fn() -> BTreeMap<String, u64> + Send + Sync>;

/// Keeps the previous reading, so each snapshot carries per-second rates and
/// which refusals are new in its interval.
///
/// The kernel counters, when there are any, are the system-wide truth; without
/// them (no eBPF) the quota counts of the process stand in, so a report is
/// always available.
///
/// Each sample also reads the port hardware counters of every RDMA device
/// ([`crate::hw_counters`], from `/sys/class/infiniband` unless
/// [`with_hw_counters`](Self::with_hw_counters) says otherwise) with their growth
/// since the previous sample, and the authentication failures of an
/// [`auth_failures_from`](Self::auth_failures_from) source if there is one.
///
/// ```
/// use std::time::{Duration, Instant, SystemTime};
/// use rdma_quota::{QuotaConfig, Quotas, TenantInfo, Verb};
/// use rdma_monitor::report::Sampler;
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
pub struct Sampler {
    config: Option<QuotaConfig>,
    cgroup_root: PathBuf,
    previous: Option<(Instant, BTreeMap<Verb, u64>)>,
    refusals: BTreeMap<(Verb, String, String), u64>,
    cgroup_paths: BTreeMap<u64, String>,
    hw_reader: Option<PortCounterReader>,
    /// The last value read of every hardware counter ever seen: a device that goes away and
    /// comes back (counting from zero again) then shows everything since as new.
    hw_previous: BTreeMap<CounterId, u64>,
    /// Paths already warned about, so a broken file is logged once, not every interval.
    hw_warned: BTreeSet<String>,
    auth_failures: Option<AuthFailureSource>,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("config", &self.config)
            .field("cgroup_root", &self.cgroup_root)
            .field("hw_reader", &self.hw_reader)
            .field("auth_failures", &self.auth_failures.is_some())
            .finish_non_exhaustive()
    }
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
            hw_reader: Some(PortCounterReader::system()),
            hw_previous: BTreeMap::new(),
            hw_warned: BTreeSet::new(),
            auth_failures: None,
        }
    }

    /// Reads the port hardware counters with `reader` (a test's fake sysfs tree), or not at
    /// all with `None`. By default they come from [`crate::hw_counters::SYSFS_ROOT`].
    ///
    /// ```
    /// use std::time::{Instant, SystemTime};
    /// use rdma_monitor::hw_counters::PortCounterReader;
    /// use rdma_monitor::report::Sampler;
    ///
    /// let root = tempfile::tempdir()?;
    /// let dir = root.path().join("rxe-a/ports/1/hw_counters");
    /// std::fs::create_dir_all(&dir)?;
    /// std::fs::write(dir.join("duplicate_request"), "1\n")?;
    /// let mut sampler = Sampler::new(None).with_hw_counters(Some(PortCounterReader::at(root.path())));
    /// let first = sampler.sample(Instant::now(), SystemTime::now(), None, None, &[]);
    /// assert_eq!((first.hw_counters[0].total, first.hw_counters[0].delta), (1, None));
    ///
    /// std::fs::write(dir.join("duplicate_request"), "4\n")?;
    /// let next = sampler.sample(Instant::now(), SystemTime::now(), None, None, &[]);
    /// assert_eq!((next.hw_counters[0].total, next.hw_counters[0].delta), (4, Some(3)));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn with_hw_counters(mut self, reader: Option<PortCounterReader>) -> Sampler {
        self.hw_reader = reader;
        self
    }

    /// Fills every snapshot's [`auth_failures`](Snapshot::auth_failures) from `source`:
    /// the count of RDMA messages that failed authentication per identity, since the process
    /// started. It is called once per sample, so it should only copy counts out.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use std::sync::{Arc, Mutex};
    /// use std::time::{Instant, SystemTime};
    /// use rdma_monitor::report::Sampler;
    ///
    /// let failures = Arc::new(Mutex::new(BTreeMap::new()));
    /// let counts = Arc::clone(&failures);
    /// let mut sampler = Sampler::new(None)
    ///     .with_hw_counters(None)
    ///     .auth_failures_from(move || counts.lock().map(|m| m.clone()).unwrap_or_default());
    /// failures.lock().unwrap().insert("alice".to_owned(), 1);
    /// let s = sampler.sample(Instant::now(), SystemTime::now(), None, None, &[]);
    /// assert_eq!(s.auth_failures, Some(BTreeMap::from([("alice".to_owned(), 1)])));
    /// ```
    pub fn auth_failures_from(
        mut self,
        source: impl Fn() -> BTreeMap<String, u64> + Send + Sync + 'static,
    ) -> Sampler {
        self.auth_failures = Some(Box::new(source));
        self
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
                s.source = Some(CountSource::Ebpf);
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
                s.source = Some(CountSource::Process);
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
        self.sample_hw_counters(&mut s);
        s.auth_failures = self.auth_failures.as_ref().map(|source| source());
        self.previous = Some((now, s.totals.clone()));
        s
    }

    fn sample_hw_counters(&mut self, s: &mut Snapshot) {
        let Some(reader) = &self.hw_reader else {
            return;
        };
        let reading = reader.read();
        for skipped in &reading.skipped {
            if self.hw_warned.insert(skipped.path.clone()) {
                tracing::warn!(
                    root = %reader.root().display(),
                    path = %skipped.path,
                    reason = %skipped.reason,
                    "skipping a port hardware counter"
                );
            }
        }
        s.hw_counters = reading
            .values
            .iter()
            .map(|(id, &total)| PortCounter {
                device: id.device.clone(),
                port: id.port,
                counter: id.counter.clone(),
                total,
                delta: self
                    .hw_previous
                    .get(id)
                    .map(|&prev| total.checked_sub(prev).unwrap_or(total)),
            })
            .collect();
        s.hw_counters_skipped = reading.skipped;
        self.hw_previous.extend(reading.values);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::time::Duration;

    fn set(root: &Path, device: &str, port: u32, counter: &str, value: &str) {
        let dir = root.join(format!("{device}/ports/{port}/hw_counters"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join(counter), value).expect("write counter");
    }

    /// `device/port/counter total delta` of every counter.
    fn hw(s: &Snapshot) -> Vec<String> {
        s.hw_counters
            .iter()
            .map(|c| {
                let delta = c.delta.map_or("-".to_owned(), |d| d.to_string());
                format!("{}/{}/{} {} {delta}", c.device, c.port, c.counter, c.total)
            })
            .collect()
    }

    #[test]
    fn hw_counter_totals_and_deltas_over_two_devices_and_ports() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        set(r, "rxe-a", 1, "rcvd_pkts", "10\n");
        set(r, "rxe-a", 1, "out_of_seq_request", "0\n");
        set(r, "rxe-a", 1, "rcvd_seq_err", "garbage\n");
        set(r, "mlx5_0", 1, "out_of_sequence", "5\n");
        set(r, "mlx5_0", 2, "duplicate_request", "1\n");
        let mut sampler =
            Sampler::new(None).with_hw_counters(Some(PortCounterReader::at(root.path())));
        let t0 = Instant::now();
        let mut at = |secs: u64| {
            let now = t0 + Duration::from_secs(secs);
            sampler.sample(now, SystemTime::UNIX_EPOCH, None, None, &[])
        };

        let first = at(0);
        assert_eq!(
            hw(&first),
            [
                "mlx5_0/1/out_of_sequence 5 -",
                "mlx5_0/2/duplicate_request 1 -",
                "rxe-a/1/out_of_seq_request 0 -",
                "rxe-a/1/rcvd_pkts 10 -",
            ]
        );
        assert_eq!(first.hw_counters_skipped.len(), 1);
        assert_eq!(
            first.hw_counters_skipped[0].path,
            "rxe-a/ports/1/hw_counters/rcvd_seq_err"
        );
        assert_eq!(first.auth_failures, None);

        set(r, "rxe-a", 1, "rcvd_pkts", "15\n");
        set(r, "rxe-a", 1, "out_of_seq_request", "2\n");
        set(r, "rxe-a", 1, "rcvd_seq_err", "1\n");
        set(r, "rxe-b", 1, "rcvd_pkts", "3\n");
        let second = at(1);
        assert_eq!(
            hw(&second),
            [
                "mlx5_0/1/out_of_sequence 5 0",
                "mlx5_0/2/duplicate_request 1 0",
                // Unreadable last time: no earlier value to compare with.
                "rxe-a/1/out_of_seq_request 2 2",
                "rxe-a/1/rcvd_pkts 15 5",
                "rxe-a/1/rcvd_seq_err 1 -",
                "rxe-b/1/rcvd_pkts 3 -",
            ]
        );
        assert!(second.hw_counters_skipped.is_empty());
        let security: Vec<&str> = second
            .hw_counters
            .iter()
            .filter(|c| c.is_security_relevant() && c.changed())
            .map(|c| c.counter.as_str())
            .collect();
        assert_eq!(security, ["out_of_seq_request"]);

        // rxe-b goes away; rxe-a is re-created and counts from zero again.
        std::fs::remove_dir_all(r.join("rxe-b")).expect("rm");
        set(r, "rxe-a", 1, "rcvd_pkts", "4\n");
        let third = at(2);
        assert_eq!(
            hw(&third),
            [
                "mlx5_0/1/out_of_sequence 5 0",
                "mlx5_0/2/duplicate_request 1 0",
                "rxe-a/1/out_of_seq_request 2 0",
                "rxe-a/1/rcvd_pkts 4 4",
                "rxe-a/1/rcvd_seq_err 1 0",
            ]
        );
    }

    #[test]
    fn without_a_reader_there_are_no_hw_counters_and_auth_failures_come_from_the_source() {
        let mut sampler = Sampler::new(None)
            .with_hw_counters(None)
            .auth_failures_from(|| BTreeMap::from([("alice".to_owned(), 3)]));
        let s = sampler.sample(Instant::now(), SystemTime::UNIX_EPOCH, None, None, &[]);
        assert!(s.hw_counters.is_empty() && s.hw_counters_skipped.is_empty());
        assert_eq!(
            s.auth_failures,
            Some(BTreeMap::from([("alice".to_owned(), 3)]))
        );
        assert!(format!("{sampler:?}").contains("auth_failures: true"));
    }
}
