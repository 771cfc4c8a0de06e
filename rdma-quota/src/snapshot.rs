//! A point-in-time copy of what admission has counted.

use std::collections::BTreeMap;

use crate::key::LimitKey;
use crate::refusal::Scope;
use crate::verb::{Resource, Verb};

/// Who a registration is: the identity its limits are looked up by, and
/// where it runs, to match it with kernel telemetry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantInfo {
    /// The client certificate name; the key of its limits.
    pub identity: String,
    /// The process acting for the tenant.
    pub pid: u32,
    /// That process's cgroup v2 id (the cgroup directory's inode number).
    pub cgroup_id: u64,
}

/// What one scope has: live resources and calls so far.
///
/// Every resource and every verb has an entry, zero included, so that
/// consumers need no defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageSnapshot {
    /// Live resources: admitted and their tickets not yet dropped.
    pub live: BTreeMap<Resource, u64>,
    /// Bytes of live memory regions.
    pub mr_bytes: u64,
    /// Calls admitted, by verb.
    pub admitted: BTreeMap<Verb, u64>,
    /// Calls refused (intercepted), by verb.
    pub intercepted: BTreeMap<Verb, u64>,
}

/// One tenant's registrations and usage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantSnapshot {
    /// The live registrations of this identity (one per session).
    pub sessions: Vec<TenantInfo>,
    /// Usage of all of them together, which the tenant's limits apply to.
    pub usage: UsageSnapshot,
}

/// How often one limit refused one verb.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusalCount {
    /// The refused verb.
    pub verb: Verb,
    /// Whose limit refused.
    pub scope: Scope,
    /// Which limit.
    pub key: LimitKey,
    /// Its value.
    pub limit: u64,
    /// Refusals since the start.
    pub count: u64,
}

/// Everything [`Quotas`](crate::Quotas) has counted, at one moment.
///
/// Tenants appear while they are registered or still hold live resources;
/// the global usage and the refusals cover the whole run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaSnapshot {
    /// All tenants together.
    pub global: UsageSnapshot,
    /// Each tenant, by identity.
    pub tenants: BTreeMap<String, TenantSnapshot>,
    /// Refusals by verb, scope and limit, in that order.
    pub refusals: Vec<RefusalCount>,
}
