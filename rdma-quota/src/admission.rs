//! In-process enforcement: whether the server may make an RDMA resource now.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::{Limits, QuotaConfig};
use crate::key::LimitKey;
use crate::rate::RateWindow;
use crate::refusal::{Refusal, Scope};
use crate::snapshot::{QuotaSnapshot, RefusalCount, TenantInfo, TenantSnapshot, UsageSnapshot};
use crate::verb::{Resource, Verb};

const RESOURCES: usize = Resource::ALL.len();
const VERBS: usize = Verb::ALL.len();

/// The quotas of one server: shared by all sessions, cheap to clone.
///
/// # Examples
///
/// ```
/// use rdma_quota::{QuotaConfig, Quotas, Resource, TenantInfo, Verb};
///
/// let quotas = Quotas::new(QuotaConfig::parse("QP_COUNT 2\n", "quota.conf")?);
/// let alice = quotas.register(TenantInfo { identity: "alice".into(), pid: 10, cgroup_id: 7 });
///
/// let qp = alice.admit(Verb::QpCreate)?; // hold it as long as the QP lives
/// assert_eq!(quotas.snapshot().global.live[&Resource::Qp], 1);
/// drop(qp); // the QP was destroyed
/// assert_eq!(quotas.snapshot().global.live[&Resource::Qp], 0);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Quotas {
    shared: Arc<Shared>,
}

struct Shared {
    config: QuotaConfig,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    global: Usage,
    tenants: BTreeMap<String, TenantState>,
    refusals: BTreeMap<(Verb, Scope, LimitKey), (u64, u64)>,
    next_session: u64,
}

#[derive(Default)]
struct TenantState {
    sessions: BTreeMap<u64, TenantInfo>,
    usage: Usage,
}

#[derive(Default)]
struct Usage {
    live: [u64; RESOURCES],
    mr_bytes: u64,
    admitted: [u64; VERBS],
    intercepted: [u64; VERBS],
    windows: [RateWindow; VERBS],
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update below completes without panicking, so a poisoned lock
        // still guards consistent counts; refusing all service would be worse.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Quotas {
    /// Enforces `config`; an empty configuration admits everything but
    /// still counts.
    pub fn new(config: QuotaConfig) -> Self {
        Quotas {
            shared: Arc::new(Shared {
                config,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The thresholds being enforced.
    pub fn config(&self) -> &QuotaConfig {
        &self.shared.config
    }

    /// Starts accounting for one session of `tenant`; its limits are those of
    /// its identity, shared by all sessions of that identity.
    pub fn register(&self, tenant: TenantInfo) -> TenantQuota {
        let mut state = self.shared.lock();
        let session = state.next_session;
        state.next_session += 1;
        let identity: Arc<str> = Arc::from(tenant.identity.as_str());
        state
            .tenants
            .entry(tenant.identity.clone())
            .or_default()
            .sessions
            .insert(session, tenant);
        TenantQuota {
            shared: Arc::clone(&self.shared),
            identity,
            session,
        }
    }

    /// What has been counted so far.
    pub fn snapshot(&self) -> QuotaSnapshot {
        let state = self.shared.lock();
        QuotaSnapshot {
            global: state.global.snapshot(),
            tenants: state
                .tenants
                .iter()
                .map(|(name, tenant)| {
                    let snapshot = TenantSnapshot {
                        sessions: tenant.sessions.values().cloned().collect(),
                        usage: tenant.usage.snapshot(),
                    };
                    (name.clone(), snapshot)
                })
                .collect(),
            refusals: state
                .refusals
                .iter()
                .map(|((verb, scope, key), (limit, count))| RefusalCount {
                    verb: *verb,
                    scope: scope.clone(),
                    key: *key,
                    limit: *limit,
                    count: *count,
                })
                .collect(),
        }
    }
}

impl Default for Quotas {
    /// No limits; everything is admitted and counted.
    fn default() -> Self {
        Quotas::new(QuotaConfig::default())
    }
}

impl fmt::Debug for Quotas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Quotas")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

/// One registered session of a tenant; dropping it deregisters the session.
///
/// Both the global limits and the tenant's own limits apply to each call.
/// Resources admitted through it stay counted until their [`Admission`]s are
/// dropped, even after the session ends.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use rdma_quota::{QuotaConfig, Quotas, TenantInfo, Verb};
///
/// let quotas = Quotas::new(QuotaConfig::parse("tenant bob QP_CREATE 1\n", "q")?);
/// let bob = quotas.register(TenantInfo { identity: "bob".into(), pid: 1, cgroup_id: 1 });
/// let t0 = Instant::now();
///
/// let _qp = bob.admit_at(Verb::QpCreate, t0)?;
/// let err = bob.admit_at(Verb::QpCreate, t0).unwrap_err();
/// assert_eq!(err.to_string(), "QP_CREATE limit 1/s exceeded for tenant bob (1 calls in the last second)");
/// let _qp2 = bob.admit_at(Verb::QpCreate, t0 + Duration::from_secs(1))?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct TenantQuota {
    shared: Arc<Shared>,
    identity: Arc<str>,
    session: u64,
}

impl TenantQuota {
    /// The tenant's identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Admits one call of `verb` now; see [`admit_at`](Self::admit_at).
    pub fn admit(&self, verb: Verb) -> Result<Admission, Refusal> {
        self.admit_at(verb, Instant::now())
    }

    /// Admits one call of `verb` at `now`, or refuses it and counts it as
    /// intercepted.
    ///
    /// A creating verb is checked against its rate and its count limit and
    /// its [`Admission`] holds the new resource's live count. Other verbs are
    /// only rate-checked. Destroying verbs are always admitted (only
    /// counted); the live count drops when the creating admission is dropped.
    /// `MR_REG` here registers zero bytes: use [`admit_mr`](Self::admit_mr).
    pub fn admit_at(&self, verb: Verb, now: Instant) -> Result<Admission, Refusal> {
        self.admit_inner(verb, 0, now)
    }

    /// Admits registering a memory region of `bytes` now: the `MR_REG` rate,
    /// `MR_COUNT` and `MR_BYTES`.
    pub fn admit_mr(&self, bytes: u64) -> Result<Admission, Refusal> {
        self.admit_mr_at(bytes, Instant::now())
    }

    /// [`admit_mr`](Self::admit_mr) at `now`.
    pub fn admit_mr_at(&self, bytes: u64, now: Instant) -> Result<Admission, Refusal> {
        self.admit_inner(Verb::MrReg, bytes, now)
    }

    /// For a rate refusal, how long after `now` the limit that refused would
    /// admit a call again (the time a refused caller can be told to retry
    /// after); `None` for other refusals, which wait on a destruction that
    /// no clock can predict.
    ///
    /// The other scope's limit may still refuse then: this is the earliest
    /// time worth asking again, not a promise.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use rdma_quota::{QuotaConfig, Quotas, TenantInfo, Verb};
    ///
    /// let config = QuotaConfig::parse("CQ_CREATE 2\n", "quota.conf")?;
    /// let quotas = Quotas::new(config);
    /// let t = quotas.register(TenantInfo { identity: "a".into(), pid: 1, cgroup_id: 1 });
    /// let t0 = Instant::now();
    /// let _one = t.admit_at(Verb::CqCreate, t0)?;
    /// let _two = t.admit_at(Verb::CqCreate, t0 + Duration::from_millis(100))?;
    /// let later = t0 + Duration::from_millis(250);
    /// let refusal = t.admit_at(Verb::CqCreate, later).unwrap_err();
    /// assert_eq!(t.retry_after(&refusal, later), Some(Duration::from_millis(750)));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn retry_after(&self, refusal: &Refusal, now: Instant) -> Option<Duration> {
        let Refusal::Rate { key, scope, .. } = refusal else {
            return None;
        };
        let tenant = match scope {
            Scope::Global => None,
            Scope::Tenant(name) => Some(name.as_str()),
        };
        self.shared
            .lock()
            .rate_wait(&self.shared.config, tenant, key.verb()?, now)
    }

    /// How long after `now` every call of `verb` would be refused by a rate
    /// limit, or `None` if one would be admitted now: the longest wait among
    /// the tenant's and the global limit that are full.
    ///
    /// [`Admission::held`] gives the same, taken with the admission itself.
    /// The windows only fill further until then (refusals are not recorded),
    /// so no call in that span could be admitted.
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use rdma_quota::{QuotaConfig, Quotas, TenantInfo, Verb};
    ///
    /// let quotas = Quotas::new(QuotaConfig::parse("CQ_CREATE 2\n", "quota.conf")?);
    /// let t = quotas.register(TenantInfo { identity: "a".into(), pid: 1, cgroup_id: 1 });
    /// let t0 = Instant::now();
    /// let one = t.admit_at(Verb::CqCreate, t0)?;
    /// assert_eq!(one.held(), None);
    /// let at = t0 + Duration::from_millis(100);
    /// let two = t.admit_at(Verb::CqCreate, at)?;
    /// assert_eq!(two.held(), Some(Duration::from_millis(900)));
    /// assert_eq!(t.held_after(Verb::CqCreate, at), Some(Duration::from_millis(900)));
    /// assert_eq!(t.held_after(Verb::QpCreate, at), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn held_after(&self, verb: Verb, now: Instant) -> Option<Duration> {
        self.shared
            .lock()
            .held(&self.shared.config, &self.identity, verb, now)
    }

    fn admit_inner(&self, verb: Verb, bytes: u64, now: Instant) -> Result<Admission, Refusal> {
        let config = &self.shared.config;
        let no_limits = Limits::default();
        let own = config.tenant(&self.identity).unwrap_or(&no_limits);
        let mut guard = self.shared.lock();
        let state = &mut *guard;
        let tenant = state.tenants.entry(self.identity.to_string()).or_default();
        let scope = || Scope::Tenant(self.identity.to_string());
        // All checks before any update, so that a refusal by one scope does
        // not use up the rate of the other.
        let checked = tenant
            .usage
            .check(own, verb, bytes, now, scope)
            .and_then(|()| {
                state
                    .global
                    .check(&config.global, verb, bytes, now, || Scope::Global)
            });
        let v = verb_index(verb);
        if let Err(refusal) = checked {
            tenant.usage.intercepted[v] += 1;
            state.global.intercepted[v] += 1;
            let entry = state
                .refusals
                .entry((verb, refusal.scope().clone(), refusal.key()))
                .or_default();
            *entry = (refusal.limit(), entry.1 + 1);
            return Err(refusal);
        }
        tenant.usage.record(own, verb, bytes, now);
        state.global.record(&config.global, verb, bytes, now);
        // Under the same lock: what the next call would hear, with no second look.
        let held = state.held(config, &self.identity, verb, now);
        let ticket = verb.creates().map(|resource| Ticket {
            shared: Arc::clone(&self.shared),
            identity: Arc::clone(&self.identity),
            resource,
            bytes,
        });
        Ok(Admission { verb, ticket, held })
    }
}

impl Drop for TenantQuota {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        if let Some(tenant) = state.tenants.get_mut(&*self.identity) {
            tenant.sessions.remove(&self.session);
        }
        state.prune(&self.identity);
    }
}

impl fmt::Debug for TenantQuota {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantQuota")
            .field("identity", &self.identity)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// An admitted call. For a creating verb it is the resource's ticket: keep it
/// as long as the resource lives; dropping it releases the live count (and
/// the memory region's bytes). Release is never refused.
///
/// # Examples
///
/// ```
/// use rdma_quota::{QuotaConfig, Quotas, Resource, TenantInfo};
///
/// let quotas = Quotas::new(QuotaConfig::parse("MR_BYTES 4096\n", "q")?);
/// let t = quotas.register(TenantInfo { identity: "t".into(), pid: 1, cgroup_id: 1 });
/// let mr = t.admit_mr(4096)?;
/// assert_eq!(mr.resource(), Some(Resource::Mr));
/// assert!(t.admit_mr(1).is_err());
/// drop(mr);
/// assert!(t.admit_mr(1).is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[must_use = "dropping an admission of a creating verb releases the resource's count at once"]
#[derive(Debug)]
pub struct Admission {
    verb: Verb,
    ticket: Option<Ticket>,
    held: Option<Duration>,
}

impl Admission {
    /// The admitted verb.
    pub fn verb(&self) -> Verb {
        self.verb
    }

    /// The resource this admission keeps counted, for creating verbs.
    pub fn resource(&self) -> Option<Resource> {
        self.ticket.as_ref().map(|t| t.resource)
    }

    /// The memory-region bytes this admission keeps counted.
    pub fn bytes(&self) -> u64 {
        self.ticket.as_ref().map_or(0, |t| t.bytes)
    }

    /// How long a rate limit stays full after this admission (the longest of
    /// the tenant's and the global one), or `None` if the next call of the
    /// same verb would be admitted: what protocol version 3 tells an
    /// interceptor as `next_ms`, so that the next call need not be asked
    /// about only to be refused. See [`TenantQuota::held_after`].
    pub fn held(&self) -> Option<Duration> {
        self.held
    }
}

struct Ticket {
    shared: Arc<Shared>,
    identity: Arc<str>,
    resource: Resource,
    bytes: u64,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.shared.lock();
        state.global.release(self.resource, self.bytes);
        if let Some(tenant) = state.tenants.get_mut(&*self.identity) {
            tenant.usage.release(self.resource, self.bytes);
        }
        state.prune(&self.identity);
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("identity", &self.identity)
            .field("resource", &self.resource)
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl State {
    /// How long after `now` the rate limit of `verb` in one scope (`tenant`,
    /// or the global one for `None`) admits a call again; `None` without such
    /// a limit or usage.
    fn rate_wait(
        &self,
        config: &QuotaConfig,
        tenant: Option<&str>,
        verb: Verb,
        now: Instant,
    ) -> Option<Duration> {
        let (limits, usage) = match tenant {
            None => (&config.global, &self.global),
            Some(name) => (config.tenant(name)?, &self.tenants.get(name)?.usage),
        };
        usage.windows[verb_index(verb)].next_free(now, limits.rate(verb)?)
    }

    /// The longer wait of the tenant's and the global rate limit of `verb`,
    /// when one is full.
    fn held(
        &self,
        config: &QuotaConfig,
        identity: &str,
        verb: Verb,
        now: Instant,
    ) -> Option<Duration> {
        let own = self.rate_wait(config, Some(identity), verb, now);
        let global = self.rate_wait(config, None, verb, now);
        own.max(global).filter(|wait| !wait.is_zero())
    }

    /// Forgets a tenant that has neither sessions nor live resources, so that
    /// memory follows the tenants present, not all that ever connected.
    fn prune(&mut self, identity: &str) {
        let gone = self
            .tenants
            .get(identity)
            .is_some_and(|t| t.sessions.is_empty() && t.usage.is_idle());
        if gone {
            self.tenants.remove(identity);
        }
    }
}

impl Usage {
    fn check(
        &self,
        limits: &Limits,
        verb: Verb,
        bytes: u64,
        now: Instant,
        scope: impl Fn() -> Scope,
    ) -> Result<(), Refusal> {
        if let (Some(key), Some(limit)) = (LimitKey::rate(verb), limits.rate(verb)) {
            let current = self.windows[verb_index(verb)].current(now);
            if current >= limit {
                return Err(Refusal::Rate {
                    key,
                    limit,
                    current,
                    scope: scope(),
                });
            }
        }
        let Some(resource) = verb.creates() else {
            return Ok(());
        };
        if let Some(limit) = limits.count(resource) {
            let current = self.live[resource_index(resource)];
            if current >= limit {
                return Err(Refusal::Count {
                    key: LimitKey::count(resource),
                    limit,
                    current,
                    scope: scope(),
                });
            }
        }
        if resource == Resource::Mr {
            if let Some(limit) = limits.mr_bytes() {
                let fits = self.mr_bytes.checked_add(bytes).is_some_and(|b| b <= limit);
                if !fits {
                    return Err(Refusal::Bytes {
                        limit,
                        current: self.mr_bytes,
                        requested: bytes,
                        scope: scope(),
                    });
                }
            }
        }
        Ok(())
    }

    /// Records an admitted call; `check` must have passed under the same lock.
    fn record(&mut self, limits: &Limits, verb: Verb, bytes: u64, now: Instant) {
        let v = verb_index(verb);
        self.admitted[v] = self.admitted[v].saturating_add(1);
        // Checked just before, so this admits; 0 (no limit) records nothing.
        self.windows[v].try_acquire(now, limits.rate(verb).unwrap_or(0));
        if let Some(resource) = verb.creates() {
            self.live[resource_index(resource)] += 1;
            self.mr_bytes = self.mr_bytes.saturating_add(bytes);
        }
    }

    fn release(&mut self, resource: Resource, bytes: u64) {
        let live = &mut self.live[resource_index(resource)];
        *live = live.saturating_sub(1);
        self.mr_bytes = self.mr_bytes.saturating_sub(bytes);
    }

    fn is_idle(&self) -> bool {
        self.live.iter().all(|&n| n == 0) && self.mr_bytes == 0
    }

    fn snapshot(&self) -> UsageSnapshot {
        let by_verb = |counts: &[u64; VERBS]| {
            Verb::ALL
                .into_iter()
                .map(|v| (v, counts[verb_index(v)]))
                .collect()
        };
        UsageSnapshot {
            live: Resource::ALL
                .into_iter()
                .map(|r| (r, self.live[resource_index(r)]))
                .collect(),
            mr_bytes: self.mr_bytes,
            admitted: by_verb(&self.admitted),
            intercepted: by_verb(&self.intercepted),
        }
    }
}

fn verb_index(verb: Verb) -> usize {
    usize::from(verb.id())
}

fn resource_index(resource: Resource) -> usize {
    resource as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    fn quotas(text: &str) -> Quotas {
        Quotas::new(QuotaConfig::parse(text, "test.conf").expect("test config parses"))
    }

    fn tenant(quotas: &Quotas, name: &str) -> TenantQuota {
        quotas.register(TenantInfo {
            identity: name.into(),
            pid: 100,
            cgroup_id: 200,
        })
    }

    #[test]
    fn count_limit_then_release_then_admit_again() {
        let q = quotas("QP_COUNT 2\n");
        let t = tenant(&q, "alice");
        let a = t.admit(Verb::QpCreate).expect("first");
        let b = t.admit(Verb::QpCreate).expect("second");
        let refusal = t.admit(Verb::QpCreate).expect_err("third");
        assert_eq!(
            refusal.to_string(),
            "QP_COUNT limit 2 reached globally (2 live)"
        );
        assert_eq!(refusal.scope(), &Scope::Global);
        drop(a);
        let c = t.admit(Verb::QpCreate).expect("after release");
        assert_eq!(q.snapshot().global.live[&Resource::Qp], 2);
        drop((b, c));
        assert_eq!(q.snapshot().global.live[&Resource::Qp], 0);
    }

    #[test]
    fn count_limits_apply_to_creation_only() {
        let q = quotas("QP_COUNT 1\n");
        let t = tenant(&q, "alice");
        let _qp = t.admit(Verb::QpCreate).expect("create");
        for verb in [Verb::QpModify, Verb::QpDestroy, Verb::GidQuery] {
            let admission = t.admit(verb).expect("not a creation");
            assert_eq!(admission.resource(), None);
        }
    }

    #[test]
    fn rate_limit_with_explicit_instants() {
        let q = quotas("QP_MODIFY 2\n");
        let t = tenant(&q, "alice");
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert!(t.admit_at(Verb::QpModify, t0).is_ok());
        assert!(t.admit_at(Verb::QpModify, t0 + ms(10)).is_ok());
        let refusal = t.admit_at(Verb::QpModify, t0 + ms(20)).expect_err("third");
        assert_eq!(
            refusal.to_string(),
            "QP_MODIFY limit 2/s exceeded globally (2 calls in the last second)"
        );
        assert_eq!(refusal.limit(), 2);
        assert!(t.admit_at(Verb::QpModify, t0 + ms(1000)).is_ok());
        assert!(t.admit_at(Verb::QpModify, t0 + ms(1001)).is_err());
        // Other verbs have their own rates.
        assert!(t.admit_at(Verb::GidQuery, t0 + ms(1001)).is_ok());
    }

    #[test]
    fn tenant_limits_apply_to_that_tenant_and_global_to_all() {
        let q = quotas("QP_COUNT 3\ntenant alice QP_COUNT 1\n");
        let alice = tenant(&q, "alice");
        let bob = tenant(&q, "bob");
        let _a = alice.admit(Verb::QpCreate).expect("alice's first");
        let refusal = alice.admit(Verb::QpCreate).expect_err("alice's own limit");
        assert_eq!(
            refusal.to_string(),
            "QP_COUNT limit 1 reached for tenant alice (1 live)"
        );
        assert_eq!(refusal.scope().tenant(), Some("alice"));
        let _b1 = bob
            .admit(Verb::QpCreate)
            .expect("bob is not limited by alice");
        let _b2 = bob.admit(Verb::QpCreate).expect("bob's second");
        let refusal = bob.admit(Verb::QpCreate).expect_err("global limit");
        assert_eq!(refusal.scope(), &Scope::Global);
        assert_eq!(refusal.current(), 3);
    }

    #[test]
    fn a_tenant_refusal_does_not_use_up_the_global_rate() {
        let q = quotas("QP_CREATE 2\ntenant alice QP_COUNT 1\n");
        let alice = tenant(&q, "alice");
        let bob = tenant(&q, "bob");
        let t0 = Instant::now();
        let _a = alice.admit_at(Verb::QpCreate, t0).expect("first");
        for _ in 0..5 {
            alice
                .admit_at(Verb::QpCreate, t0)
                .expect_err("alice's count");
        }
        let _b = bob
            .admit_at(Verb::QpCreate, t0)
            .expect("one global call left");
        assert!(bob.admit_at(Verb::QpCreate, t0).is_err());
    }

    #[test]
    fn sessions_of_one_identity_share_its_limits() {
        let q = quotas("tenant alice QP_COUNT 1\n");
        let first = tenant(&q, "alice");
        let second = tenant(&q, "alice");
        let _qp = first.admit(Verb::QpCreate).expect("first");
        assert!(second.admit(Verb::QpCreate).is_err());
        assert_eq!(q.snapshot().tenants["alice"].sessions.len(), 2);
    }

    #[test]
    fn mr_bytes_are_limited_and_released() {
        let q = quotas("MR_BYTES 10000\nMR_COUNT 3\ntenant t MR_BYTES 6000\n");
        let t = tenant(&q, "t");
        let u = tenant(&q, "u");
        let a = t.admit_mr(5000).expect("fits");
        let refusal = t.admit_mr(1001).expect_err("tenant bytes");
        assert_eq!(
            refusal.to_string(),
            "MR_BYTES limit 6000 would be exceeded for tenant t (5000 registered + 1001 requested)"
        );
        let _b = u.admit_mr(5000).expect("fits globally");
        let refusal = u.admit_mr(1).expect_err("global bytes");
        assert_eq!(refusal.scope(), &Scope::Global);
        assert!(u.admit_mr(u64::MAX).is_err(), "overflow is refused");
        assert_eq!(a.bytes(), 5000);
        let snapshot = q.snapshot();
        assert_eq!(snapshot.global.mr_bytes, 10000);
        assert_eq!(snapshot.tenants["t"].usage.mr_bytes, 5000);
        drop(a);
        assert_eq!(q.snapshot().global.mr_bytes, 5000);
        let _c = u.admit_mr(5000).expect("fits after release");
    }

    #[test]
    fn refusals_are_counted_as_intercepted_not_live() {
        let q = quotas("tenant alice QP_COUNT 1\nGID_QUERY 1\n");
        let alice = tenant(&q, "alice");
        let bob = tenant(&q, "bob");
        let t0 = Instant::now();
        let _qp = alice.admit_at(Verb::QpCreate, t0).expect("first");
        for _ in 0..3 {
            assert!(alice.admit_at(Verb::QpCreate, t0).is_err());
        }
        let _ = bob.admit_at(Verb::GidQuery, t0).expect("first query");
        assert!(bob.admit_at(Verb::GidQuery, t0).is_err());

        let s = q.snapshot();
        assert_eq!(s.global.live[&Resource::Qp], 1);
        assert_eq!(s.global.admitted[&Verb::QpCreate], 1);
        assert_eq!(s.global.intercepted[&Verb::QpCreate], 3);
        assert_eq!(s.global.intercepted[&Verb::GidQuery], 1);
        assert_eq!(s.tenants["alice"].usage.intercepted[&Verb::QpCreate], 3);
        assert_eq!(s.tenants["alice"].usage.intercepted[&Verb::GidQuery], 0);
        assert_eq!(s.tenants["bob"].usage.intercepted[&Verb::GidQuery], 1);
        assert_eq!(
            s.refusals,
            vec![
                RefusalCount {
                    verb: Verb::QpCreate,
                    scope: Scope::Tenant("alice".into()),
                    key: LimitKey::count(Resource::Qp),
                    limit: 1,
                    count: 3,
                },
                RefusalCount {
                    verb: Verb::GidQuery,
                    scope: Scope::Global,
                    key: LimitKey::rate(Verb::GidQuery).expect("rate key"),
                    limit: 1,
                    count: 1,
                },
            ]
        );
    }

    #[test]
    fn dropping_the_session_deregisters_but_tickets_keep_counts() {
        let q = quotas("tenant alice QP_COUNT 5\n");
        let alice = tenant(&q, "alice");
        let qp = alice.admit(Verb::QpCreate).expect("admitted");
        drop(alice);
        let s = q.snapshot();
        assert!(s.tenants["alice"].sessions.is_empty());
        assert_eq!(s.tenants["alice"].usage.live[&Resource::Qp], 1);
        assert_eq!(s.global.live[&Resource::Qp], 1);
        drop(qp);
        let s = q.snapshot();
        assert!(s.tenants.is_empty());
        assert_eq!(s.global.live[&Resource::Qp], 0);
    }

    #[test]
    fn no_limits_admit_everything_and_still_count() {
        let q = Quotas::default();
        let t = tenant(&q, "t");
        let tickets: Vec<_> = (0..100)
            .map(|_| t.admit(Verb::CqCreate).expect("unlimited"))
            .collect();
        assert_eq!(q.snapshot().global.live[&Resource::Cq], 100);
        assert_eq!(q.snapshot().global.admitted[&Verb::CqCreate], 100);
        drop(tickets);
        assert_eq!(q.snapshot().global.live[&Resource::Cq], 0);
    }

    #[test]
    fn concurrent_admission_never_exceeds_the_count_limit() {
        const LIMIT: u64 = 5;
        const THREADS: u64 = 8;
        const CALLS: u64 = 2000;
        let q = quotas("PD_COUNT 5\ntenant t0 PD_COUNT 2\n");
        let held = Arc::new(AtomicU64::new(0));
        let max_held = Arc::new(AtomicU64::new(0));
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let q = q.clone();
                let held = Arc::clone(&held);
                let max_held = Arc::clone(&max_held);
                std::thread::spawn(move || {
                    let t = tenant(&q, &format!("t{}", i % 3));
                    let mut mine = Vec::new();
                    for n in 0..CALLS {
                        if let Ok(ticket) = t.admit(Verb::PdAlloc) {
                            let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                            max_held.fetch_max(now, Ordering::SeqCst);
                            mine.push(ticket);
                        }
                        if n % 3 == 0 && !mine.is_empty() {
                            held.fetch_sub(1, Ordering::SeqCst);
                            mine.pop();
                        }
                    }
                    held.fetch_sub(mine.len() as u64, Ordering::SeqCst);
                })
            })
            .collect();
        for handle in handles {
            handle.join().expect("thread did not panic");
        }
        assert!(max_held.load(Ordering::SeqCst) <= LIMIT);
        let s = q.snapshot();
        assert_eq!(s.global.live[&Resource::Pd], 0);
        assert_eq!(
            s.global.admitted[&Verb::PdAlloc] + s.global.intercepted[&Verb::PdAlloc],
            THREADS * CALLS
        );
        assert!(s.tenants.is_empty());
    }
}
