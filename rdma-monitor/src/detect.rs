//! Noisy-tenant detection: which process, cgroup or user keeps calling control verbs faster
//! than a threshold, for longer than a window.
//!
//! A tenant that floods the control path (creating and destroying QPs, CQs or MRs in a loop)
//! slows every other tenant's connection setup on the same host (issue 23 measured 2.5x on
//! the victim's median). [`Detector`] is the pure decision: it is fed each tenant's
//! cumulative call count at a timestamp (no clock of its own, so it is tested with synthetic
//! samples) and answers with [`Transition`]s:
//!
//! - **started**: the tenant's call rate, averaged over the last half second (or the window,
//!   if shorter), has stayed at or above [`DetectorConfig::rate`] for
//!   [`DetectorConfig::window`];
//! - **ended**: a flagged tenant's rate has then stayed below the threshold for a whole
//!   window again.
//!
//! The time hysteresis (a window above to start, a window below to end) is why a flood is
//! reported once when it starts and once when it ends, even when its rate wobbles around the
//! threshold. The number of tenants followed is bounded ([`DetectorConfig::max_tenants`]),
//! idle ones are forgotten, and the metrics label at most [`MAX_LABELLED`] flagged tenants
//! per kind, so a host with many short-lived processes cannot grow the monitor without limit.
//!
//! ```
//! use std::time::Duration;
//! use rdma_monitor::detect::{Change, Detector, DetectorConfig, Tenant};
//!
//! let mut d = Detector::new(DetectorConfig::new(100.0, Duration::from_secs(2)));
//! let flooder = Tenant::cgroup(7, "/flood");
//! let mut flagged = Vec::new();
//! // 1000 calls per second, sampled every 100 ms.
//! for tick in 0..=40u64 {
//!     let now = Duration::from_millis(tick * 100);
//!     flagged.extend(d.observe(now, [(flooder.clone(), tick * 100)]));
//! }
//! assert_eq!(flagged.len(), 1);
//! assert_eq!(flagged[0].change, Change::Started);
//! ```

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use serde_json::{json, Value};

/// Flagged tenants of one kind that get their own `rdma_noisy_tenant` series; more are only
/// counted in `rdma_noisy_tenants` (bounded label cardinality).
pub const MAX_LABELLED: usize = 32;

/// The longest span the call rate is averaged over.
// Short enough that the average trails a flood's end by half a second at most (a burst is not
// stretched into a longer flood), long enough to smooth the scheduling jitter of 100 ms
// observations.
const RATE_SPAN: Duration = Duration::from_millis(500);

/// What a tenant is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum TenantKind {
    /// One process (thread group), by pid.
    Process,
    /// One cgroup v2, by id.
    Cgroup,
    /// One user, by uid.
    User,
}

impl TenantKind {
    /// Every kind, in report order.
    pub const ALL: [TenantKind; 3] = [TenantKind::Process, TenantKind::Cgroup, TenantKind::User];

    /// The name used in reports and the `kind` label: `process`, `cgroup` or `user`.
    pub fn name(self) -> &'static str {
        match self {
            TenantKind::Process => "process",
            TenantKind::Cgroup => "cgroup",
            TenantKind::User => "user",
        }
    }
}

impl fmt::Display for TenantKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A tenant kind that is not `process`, `cgroup` or `user`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tenant kind {0:?} (expected process, cgroup or user)")]
pub struct UnknownTenantKind(pub String);

impl FromStr for TenantKind {
    type Err = UnknownTenantKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "process" => Ok(TenantKind::Process),
            "cgroup" => Ok(TenantKind::Cgroup),
            "user" => Ok(TenantKind::User),
            _ => Err(UnknownTenantKind(s.to_owned())),
        }
    }
}

/// Who made calls: a kind, its numeric id (pid, cgroup id or uid) and a name for people
/// (the command, the cgroup path, the user name).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant {
    /// What the id is.
    pub kind: TenantKind,
    /// pid, cgroup id or uid.
    pub id: u64,
    /// Command name, cgroup path or user name (may be empty when unknown).
    pub name: String,
}

impl Tenant {
    /// A process: its pid and command name.
    pub fn process(pid: u32, comm: impl Into<String>) -> Tenant {
        Tenant {
            kind: TenantKind::Process,
            id: u64::from(pid),
            name: comm.into(),
        }
    }

    /// A cgroup: its id and path.
    pub fn cgroup(id: u64, path: impl Into<String>) -> Tenant {
        Tenant {
            kind: TenantKind::Cgroup,
            id,
            name: path.into(),
        }
    }

    /// A user: its uid and name.
    pub fn user(uid: u32, name: impl Into<String>) -> Tenant {
        Tenant {
            kind: TenantKind::User,
            id: u64::from(uid),
            name: name.into(),
        }
    }

    /// The `tenant` label and the text report's name: `comm/pid`, the cgroup path (or
    /// `cgroup-ID` when unknown), the user name (or `uid-N`).
    pub fn label(&self) -> String {
        match self.kind {
            TenantKind::Process => format!("{}/{}", self.name, self.id),
            TenantKind::Cgroup if self.name.is_empty() => format!("cgroup-{}", self.id),
            TenantKind::User if self.name.is_empty() => format!("uid-{}", self.id),
            _ => self.name.clone(),
        }
    }

    /// The JSON form: `{"kind", "id", "name"}`.
    pub fn to_json(&self) -> Value {
        json!({ "kind": self.kind.name(), "id": self.id, "name": self.name })
    }
}

/// The detector's settings, built with [`DetectorConfig::new`] and `with_*`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct DetectorConfig {
    /// Control-verb calls per second at or above which a tenant counts as flooding.
    pub rate: f64,
    /// How long the rate must stay at or above [`rate`](Self::rate) before the tenant is
    /// flagged, and below it before the flag is lifted.
    pub window: Duration,
    /// Tenants followed at most; new ones beyond it are not followed until others go idle
    /// (counted in [`Detector::untracked`]).
    pub max_tenants: usize,
}

impl DetectorConfig {
    /// Flags tenants above `rate` calls per second for `window`; follows at most 4096 tenants.
    pub fn new(rate: f64, window: Duration) -> DetectorConfig {
        DetectorConfig {
            rate,
            window,
            max_tenants: 4096,
        }
    }

    /// Follows at most `max` tenants at a time.
    pub fn with_max_tenants(mut self, max: usize) -> DetectorConfig {
        self.max_tenants = max;
        self
    }

    /// The span the rate is averaged over: half a second, or the window if shorter.
    fn rate_span(&self) -> Duration {
        self.window.min(RATE_SPAN).max(Duration::from_millis(1))
    }
}

/// A flood starting or ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Change {
    /// The tenant's rate stayed above the threshold for the window.
    Started,
    /// The flagged tenant's rate stayed below the threshold for the window.
    Ended,
}

impl Change {
    /// `started` or `ended`.
    pub fn name(self) -> &'static str {
        match self {
            Change::Started => "started",
            Change::Ended => "ended",
        }
    }
}

/// A tenant's flood starting or ending, as [`Detector::observe`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// Who.
    pub tenant: Tenant,
    /// Started or ended.
    pub change: Change,
    /// When the decision was made (the `now` of the observation).
    pub at: Duration,
    /// When the rate first went above the threshold (the flood's start as seen).
    pub above_since: Duration,
    /// The rate (calls per second, averaged over the last half second) at `at`.
    pub rate: f64,
    /// The highest rate seen while flagged (so far, for `Started`).
    pub peak_rate: f64,
    /// Calls made from `above_since` to `at`.
    pub calls: u64,
}

impl Transition {
    /// One text line: `noisy tenant started: cgroup /flood (id 7): 2950 calls/s for 2.0 s (threshold 100/s over 2.0 s)`.
    pub fn render_text(&self, config: &DetectorConfig) -> String {
        let t = &self.tenant;
        let what = match self.change {
            Change::Started => format!(
                "{:.0} calls/s, above {:.0}/s for {:.1} s (window {:.1} s)",
                self.rate,
                config.rate,
                (self.at.saturating_sub(self.above_since)).as_secs_f64(),
                config.window.as_secs_f64()
            ),
            Change::Ended => format!(
                "{:.0} calls/s now, below {:.0}/s for {:.1} s; {} calls in {:.1} s, peak {:.0}/s",
                self.rate,
                config.rate,
                config.window.as_secs_f64(),
                self.calls,
                (self.at.saturating_sub(self.above_since)).as_secs_f64(),
                self.peak_rate
            ),
        };
        format!(
            "noisy tenant {}: {} {} (id {}): {what}",
            self.change.name(),
            t.kind,
            t.label(),
            t.id
        )
    }

    /// The JSON line: `{"noisy_tenant": {"change", "kind", "id", "name", "rate", ...}}`.
    pub fn to_json(&self, config: &DetectorConfig) -> Value {
        json!({ "noisy_tenant": {
            "change": self.change.name(),
            "kind": self.tenant.kind.name(),
            "id": self.tenant.id,
            "name": self.tenant.name,
            "rate": self.rate,
            "peak_rate": self.peak_rate,
            "calls": self.calls,
            "above_for_seconds": self.at.saturating_sub(self.above_since).as_secs_f64(),
            "threshold_rate": config.rate,
            "window_seconds": config.window.as_secs_f64(),
        }})
    }
}

/// A tenant flagged now.
#[derive(Debug, Clone, PartialEq)]
pub struct Flagged {
    /// Who.
    pub tenant: Tenant,
    /// When its rate went above the threshold.
    pub above_since: Duration,
    /// When it was flagged.
    pub flagged_at: Duration,
    /// Its rate at the last observation.
    pub rate: f64,
    /// The highest rate seen while flagged.
    pub peak_rate: f64,
}

#[derive(Debug)]
struct State {
    tenant: Tenant,
    /// (time, cumulative calls), oldest first, covering a little more than the rate span.
    samples: VecDeque<(Duration, u64)>,
    above_since: Option<(Duration, u64)>,
    below_since: Option<Duration>,
    flagged_at: Option<Duration>,
    rate: f64,
    peak_rate: f64,
    last_change: Duration,
}

impl State {
    fn rate(&self, now: Duration, span: Duration) -> f64 {
        let Some(&(_, latest)) = self.samples.back() else {
            return 0.0;
        };
        // The newest sample at least `span` old, else the oldest one.
        let base = self
            .samples
            .iter()
            .rev()
            .find(|(t, _)| now.saturating_sub(*t) >= span)
            .or(self.samples.front());
        match base {
            Some(&(t, n)) if now > t => latest.saturating_sub(n) as f64 / (now - t).as_secs_f64(),
            _ => 0.0,
        }
    }
}

/// Flags tenants whose control-verb rate stays above a threshold (see the module docs).
#[derive(Debug)]
pub struct Detector {
    config: DetectorConfig,
    tenants: HashMap<(TenantKind, u64), State>,
    floods: BTreeMap<TenantKind, u64>,
    untracked: u64,
}

impl Detector {
    /// A detector with nothing observed yet.
    pub fn new(config: DetectorConfig) -> Detector {
        Detector {
            config,
            tenants: HashMap::new(),
            floods: BTreeMap::new(),
            untracked: 0,
        }
    }

    /// Its settings.
    pub fn config(&self) -> &DetectorConfig {
        &self.config
    }

    /// Feeds cumulative call counts at `now` (any monotonic origin; times must not go back)
    /// and returns the floods that started or ended.
    ///
    /// `counts` are each tenant's calls since some fixed point (they must not decrease); a
    /// followed tenant left out made no calls since the last observation. A tenant's first
    /// observation is its baseline: its rate is known from the second one on. Observe every
    /// 100 ms or so: a decision is made at an observation, so it comes at most one period
    /// after the window ends.
    pub fn observe(
        &mut self,
        now: Duration,
        counts: impl IntoIterator<Item = (Tenant, u64)>,
    ) -> Vec<Transition> {
        let span = self.config.rate_span();
        let mut seen = std::collections::HashSet::new();
        for (tenant, count) in counts {
            let key = (tenant.kind, tenant.id);
            seen.insert(key);
            if let Some(state) = self.tenants.get_mut(&key) {
                let last = state.samples.back().map_or(0, |s| s.1);
                if count > last {
                    state.last_change = now;
                }
                state.samples.push_back((now, count.max(last)));
                // A process may learn its name after its first call (a cgroup its path).
                if state.tenant.name.is_empty() && !tenant.name.is_empty() {
                    state.tenant.name = tenant.name;
                }
            } else if self.tenants.len() < self.config.max_tenants {
                self.tenants.insert(
                    key,
                    State {
                        tenant,
                        samples: VecDeque::from([(now, count)]),
                        above_since: None,
                        below_since: None,
                        flagged_at: None,
                        rate: 0.0,
                        peak_rate: 0.0,
                        last_change: now,
                    },
                );
            } else {
                self.untracked += 1;
            }
        }
        let mut out = Vec::new();
        let threshold = self.config.rate;
        let window = self.config.window;
        for (key, state) in self.tenants.iter_mut() {
            if !seen.contains(key) {
                let last = state.samples.back().map_or(0, |s| s.1);
                state.samples.push_back((now, last));
            }
            // Keep one sample at least `span` old, and nothing older than that.
            while state.samples.len() > 2
                && state
                    .samples
                    .get(1)
                    .is_some_and(|(t, _)| now.saturating_sub(*t) >= span)
            {
                state.samples.pop_front();
            }
            let rate = state.rate(now, span);
            state.rate = rate;
            let latest = state.samples.back().map_or(0, |s| s.1);
            if rate >= threshold && threshold > 0.0 {
                state.below_since = None;
                let (since, at_count) = *state.above_since.get_or_insert((now, latest));
                if state.flagged_at.is_some() {
                    state.peak_rate = state.peak_rate.max(rate);
                } else if now.saturating_sub(since) >= window {
                    state.flagged_at = Some(now);
                    state.peak_rate = rate;
                    *self.floods.entry(key.0).or_default() += 1;
                    out.push(Transition {
                        tenant: state.tenant.clone(),
                        change: Change::Started,
                        at: now,
                        above_since: since,
                        rate,
                        peak_rate: rate,
                        calls: latest.saturating_sub(at_count),
                    });
                }
            } else if state.flagged_at.is_some() {
                let below = *state.below_since.get_or_insert(now);
                if now.saturating_sub(below) >= window {
                    let (since, at_count) = state.above_since.unwrap_or((below, latest));
                    out.push(Transition {
                        tenant: state.tenant.clone(),
                        change: Change::Ended,
                        at: now,
                        above_since: since,
                        rate,
                        peak_rate: state.peak_rate,
                        calls: latest.saturating_sub(at_count),
                    });
                    state.flagged_at = None;
                    state.above_since = None;
                    state.below_since = None;
                }
            } else {
                // Not flagged and below: a dip restarts the window.
                state.above_since = None;
            }
        }
        // Forget tenants idle for longer than it takes to decide anything about them.
        let forget_after = span + window;
        self.tenants.retain(|_, s| {
            s.flagged_at.is_some()
                || s.above_since.is_some()
                || now.saturating_sub(s.last_change) < forget_after
        });
        out.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        out
    }

    /// The tenants flagged now, sorted by kind and id.
    pub fn flagged(&self) -> Vec<Flagged> {
        let mut v: Vec<Flagged> = self
            .tenants
            .values()
            .filter_map(|s| {
                Some(Flagged {
                    tenant: s.tenant.clone(),
                    above_since: s.above_since.map_or(Duration::ZERO, |a| a.0),
                    flagged_at: s.flagged_at?,
                    rate: s.rate,
                    peak_rate: s.peak_rate,
                })
            })
            .collect();
        v.sort_by(|a, b| a.tenant.cmp(&b.tenant));
        v
    }

    /// Floods started since the detector was made, per kind.
    pub fn floods(&self) -> &BTreeMap<TenantKind, u64> {
        &self.floods
    }

    /// Observations of tenants that were not followed because
    /// [`DetectorConfig::max_tenants`] were followed already.
    pub fn untracked(&self) -> u64 {
        self.untracked
    }

    /// Tenants followed now.
    pub fn followed(&self) -> usize {
        self.tenants.len()
    }

    /// The flagged tenants as JSON (the reports' `noisy_tenants` array).
    pub fn flagged_json(&self, now: Duration) -> Value {
        Value::Array(
            self.flagged()
                .iter()
                .map(|f| {
                    let mut v = f.tenant.to_json();
                    v["rate"] = json!(f.rate);
                    v["peak_rate"] = json!(f.peak_rate);
                    v["flagged_for_seconds"] =
                        json!(now.saturating_sub(f.flagged_at).as_secs_f64());
                    v
                })
                .collect(),
        )
    }

    /// The text report's section: a line per flagged tenant, or nothing when none is.
    pub fn flagged_text(&self, now: Duration) -> String {
        let mut out = String::new();
        let flagged = self.flagged();
        if flagged.is_empty() {
            return out;
        }
        out.push_str(&format!(
            "Noisy tenants (above {:.0} control verbs/s for {:.1} s):\n",
            self.config.rate,
            self.config.window.as_secs_f64()
        ));
        for f in flagged {
            out.push_str(&format!(
                "  NOISY {} {} (id {}): {:.0} calls/s (peak {:.0}), flagged {:.1} s ago\n",
                f.tenant.kind,
                f.tenant.label(),
                f.tenant.id,
                f.rate,
                f.peak_rate,
                now.saturating_sub(f.flagged_at).as_secs_f64()
            ));
        }
        out
    }

    /// The detector's metrics, for a `prometheus-client` registry
    /// (`registry.register_collector(Box::new(detector.metrics()))`):
    ///
    /// | metric | type | labels |
    /// |---|---|---|
    /// | `rdma_noisy_tenant` | gauge (1 while flagged) | `kind`, `tenant`, `id` (at most [`MAX_LABELLED`] per kind) |
    /// | `rdma_noisy_tenants` | gauge | `kind`: tenants flagged now, all of them |
    /// | `rdma_noisy_tenant_floods_total` | counter | `kind`: floods started |
    pub fn metrics(&self) -> NoisyMetrics {
        let mut labelled = Vec::new();
        let mut current: BTreeMap<TenantKind, i64> = BTreeMap::new();
        for f in self.flagged() {
            let n = current.entry(f.tenant.kind).or_default();
            if (*n as usize) < MAX_LABELLED {
                labelled.push(f.tenant.clone());
            }
            *n += 1;
        }
        NoisyMetrics {
            labelled,
            current: TenantKind::ALL
                .iter()
                .map(|k| (*k, current.get(k).copied().unwrap_or(0)))
                .collect(),
            floods: TenantKind::ALL
                .iter()
                .map(|k| (*k, self.floods.get(k).copied().unwrap_or(0)))
                .collect(),
        }
    }
}

/// The detector's metrics at one moment (see [`Detector::metrics`]).
#[derive(Debug, Clone)]
pub struct NoisyMetrics {
    labelled: Vec<Tenant>,
    current: Vec<(TenantKind, i64)>,
    floods: Vec<(TenantKind, u64)>,
}

impl Collector for NoisyMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(
            "rdma_noisy_tenant",
            "1 for each tenant whose control-verb rate stayed above the flag rate for the flag window (at most 32 per kind)",
            None,
            MetricType::Gauge,
        )?;
        for t in &self.labelled {
            let id = t.id.to_string();
            let label = t.label();
            let labels = [
                ("kind", t.kind.name()),
                ("tenant", label.as_str()),
                ("id", id.as_str()),
            ];
            ConstGauge::new(1i64).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "rdma_noisy_tenants",
            "Tenants flagged as noisy now, per kind",
            None,
            MetricType::Gauge,
        )?;
        for (kind, n) in &self.current {
            ConstGauge::new(*n).encode(family.encode_family(&[("kind", kind.name())])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "rdma_noisy_tenant_floods",
            "Floods detected (a tenant flagged), per kind",
            None,
            MetricType::Counter,
        )?;
        for (kind, n) in &self.floods {
            ConstCounter::new(*n).encode(family.encode_family(&[("kind", kind.name())])?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(100);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Runs `d` from `from` to `to` (exclusive) every 100 ms, with `tenant` calling at
    /// `rate(t)` calls per second; returns the transitions with their times.
    fn run(
        d: &mut Detector,
        tenant: &Tenant,
        count: &mut u64,
        from: Duration,
        to: Duration,
        rate: impl Fn(Duration) -> u64,
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        let mut now = from;
        while now < to {
            *count += rate(now) / 10;
            out.extend(d.observe(now, [(tenant.clone(), *count)]));
            now += TICK;
        }
        out
    }

    #[test]
    fn a_sustained_flood_is_flagged_once_within_a_tick_of_the_window_and_ends_once() {
        let window = Duration::from_secs(3);
        let mut d = Detector::new(DetectorConfig::new(500.0, window));
        let t = Tenant::cgroup(42, "/flood");
        let mut n = 0;
        // Quiet for 2 s, then 3000 calls/s from 2 s to 10 s, then quiet again.
        let flood = |now: Duration| {
            if now >= ms(2000) && now < ms(10_000) {
                3000
            } else {
                5
            }
        };
        let tr = run(&mut d, &t, &mut n, ms(0), ms(20_000), flood);
        assert_eq!(tr.len(), 2, "{tr:#?}");
        let (start, end) = (&tr[0], &tr[1]);
        assert_eq!(start.change, Change::Started);
        assert_eq!(start.tenant, t);
        // The flood starts at 2.0 s; the window ends at 5.0 s; the rate crosses 500/s within
        // a tick of the start, so the decision lands at most 200 ms after the window's end.
        assert!(start.at >= ms(5000) && start.at <= ms(5200), "{start:?}");
        assert!((2900.0..=3100.0).contains(&start.rate), "{start:?}");
        assert_eq!(end.change, Change::Ended);
        // The flood stops at 10 s; the half-second average falls below 500/s within half a
        // second and must then stay below for the 3 s window.
        assert!(end.at >= ms(13_000) && end.at <= ms(14_200), "{end:?}");
        assert!(end.calls >= 20_000, "{end:?}");
        assert_eq!(d.floods()[&TenantKind::Cgroup], 1);
        assert!(d.flagged().is_empty());
    }

    #[test]
    fn a_burst_shorter_than_the_window_is_not_flagged() {
        let mut d = Detector::new(DetectorConfig::new(500.0, Duration::from_secs(3)));
        let t = Tenant::process(7, "burst");
        let mut n = 0;
        let burst = |now: Duration| {
            if now >= ms(1000) && now < ms(3000) {
                10_000
            } else {
                0
            }
        };
        assert!(run(&mut d, &t, &mut n, ms(0), ms(10_000), burst).is_empty());
        assert!(d.floods().is_empty());
    }

    #[test]
    fn a_rate_just_below_the_threshold_is_not_flagged() {
        let mut d = Detector::new(DetectorConfig::new(500.0, Duration::from_secs(1)));
        let t = Tenant::user(1000, "alice");
        let mut n = 0;
        assert!(run(&mut d, &t, &mut n, ms(0), ms(10_000), |_| 490).is_empty());
        assert!(d.flagged().is_empty());
    }

    #[test]
    fn dips_shorter_than_the_window_do_not_end_a_flood() {
        let mut d = Detector::new(DetectorConfig::new(500.0, Duration::from_secs(2)));
        let t = Tenant::cgroup(3, "/wobbly");
        let mut n = 0;
        // 1000/s with a 1.5 s pause every 4 s: the half-second average drops below 500/s
        // for about 1.5 s each time, less than the 2 s window.
        let wobble = |now: Duration| {
            if now.as_millis() % 4000 < 2500 {
                1000
            } else {
                0
            }
        };
        let tr = run(&mut d, &t, &mut n, ms(0), ms(30_000), wobble);
        assert_eq!(tr.len(), 1, "{tr:#?}");
        assert_eq!(tr[0].change, Change::Started);
        assert_eq!(d.flagged().len(), 1);
    }

    #[test]
    fn a_quiet_tenant_beside_a_flooder_is_not_flagged() {
        let mut d = Detector::new(DetectorConfig::new(100.0, Duration::from_secs(1)));
        let (loud, quiet) = (Tenant::process(1, "loud"), Tenant::process(2, "quiet"));
        let mut out = Vec::new();
        for tick in 0..50u64 {
            let now = ms(tick * 100);
            out.extend(d.observe(now, [(loud.clone(), tick * 50), (quiet.clone(), tick)]));
        }
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].tenant, loud);
        assert_eq!(
            d.flagged()
                .iter()
                .map(|f| f.tenant.clone())
                .collect::<Vec<_>>(),
            [loud]
        );
    }

    #[test]
    fn tenants_left_out_made_no_calls_and_idle_ones_are_forgotten() {
        let mut d = Detector::new(DetectorConfig::new(100.0, Duration::from_secs(1)));
        let t = Tenant::process(9, "x");
        // Flood for 2 s, then the tenant is never mentioned again (its process exited).
        for tick in 0..=20u64 {
            d.observe(ms(tick * 100), [(t.clone(), tick * 100)]);
        }
        assert_eq!(d.flagged().len(), 1);
        let mut ended = Vec::new();
        for tick in 21..60u64 {
            ended.extend(d.observe(ms(tick * 100), []));
        }
        assert_eq!(ended.len(), 1, "{ended:#?}");
        assert_eq!(ended[0].change, Change::Ended);
        assert_eq!(d.followed(), 0);
    }

    #[test]
    fn the_number_of_tenants_followed_is_bounded() {
        let mut d =
            Detector::new(DetectorConfig::new(100.0, Duration::from_secs(1)).with_max_tenants(10));
        let many = (0..100u32).map(|pid| (Tenant::process(pid, "p"), 1));
        d.observe(ms(0), many);
        assert_eq!(d.followed(), 10);
        assert_eq!(d.untracked(), 90);
    }

    #[test]
    fn metrics_label_at_most_32_flagged_tenants_per_kind() {
        let mut d = Detector::new(DetectorConfig::new(100.0, Duration::from_millis(500)));
        for tick in 0..=10u64 {
            let counts = (0..50u32).map(|pid| (Tenant::process(pid, "p"), tick * 100));
            d.observe(ms(tick * 100), counts);
        }
        assert_eq!(d.flagged().len(), 50);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(d.metrics()));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert_eq!(text.matches("\nrdma_noisy_tenant{").count(), MAX_LABELLED);
        assert!(text.contains("\nrdma_noisy_tenants{kind=\"process\"} 50\n"));
        assert!(text.contains("\nrdma_noisy_tenants{kind=\"cgroup\"} 0\n"));
        assert!(text.contains("\nrdma_noisy_tenant_floods_total{kind=\"process\"} 50\n"));
        assert!(text.contains("rdma_noisy_tenant{kind=\"process\",tenant=\"p/0\",id=\"0\"} 1"));
    }

    #[test]
    fn reports_name_the_tenant() {
        let config = DetectorConfig::new(100.0, Duration::from_secs(2));
        let tr = Transition {
            tenant: Tenant::cgroup(7, "/flood"),
            change: Change::Started,
            at: ms(5000),
            above_since: ms(3000),
            rate: 2950.0,
            peak_rate: 2950.0,
            calls: 5900,
        };
        assert_eq!(
            tr.render_text(&config),
            "noisy tenant started: cgroup /flood (id 7): 2950 calls/s, above 100/s for 2.0 s (window 2.0 s)"
        );
        let v = tr.to_json(&config);
        assert_eq!(v["noisy_tenant"]["name"], "/flood");
        assert_eq!(v["noisy_tenant"]["change"], "started");
        assert_eq!(v["noisy_tenant"]["kind"], "cgroup");
        assert_eq!(Tenant::user(5, "").label(), "uid-5");
        assert_eq!(Tenant::process(12, "churn").label(), "churn/12");
        assert_eq!("user".parse::<TenantKind>(), Ok(TenantKind::User));
        assert!("pid".parse::<TenantKind>().is_err());
    }
}
