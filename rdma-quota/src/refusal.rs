//! Why a call was refused, and for whom.

use std::fmt;

use crate::key::LimitKey;
use crate::verb::Verb;

/// Whose limit decided: everyone's together, or one tenant's own.
///
/// Displays as `global` or `tenant NAME`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// The global limits, counting every tenant.
    Global,
    /// The limits of one tenant (its identity).
    Tenant(String),
}

impl Scope {
    /// The tenant, for a tenant scope.
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Scope::Global => None,
            Scope::Tenant(name) => Some(name),
        }
    }

    /// The scope as an adverbial phrase, for messages.
    fn phrase(&self) -> String {
        match self {
            Scope::Global => "globally".to_owned(),
            Scope::Tenant(name) => format!("for tenant {name}"),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Global => f.write_str("global"),
            Scope::Tenant(name) => write!(f, "tenant {name}"),
        }
    }
}

/// A call that a quota does not allow; nothing was recorded as live.
///
/// # Examples
///
/// ```
/// use rdma_quota::{LimitKey, QuotaConfig, Quotas, Resource, Scope, TenantInfo, Verb};
///
/// let config = QuotaConfig::parse("tenant alice QP_COUNT 1\n", "quota.conf")?;
/// let quotas = Quotas::new(config);
/// let alice = quotas.register(TenantInfo { identity: "alice".into(), pid: 1, cgroup_id: 1 });
///
/// let _qp = alice.admit(Verb::QpCreate)?;
/// let refusal = alice.admit(Verb::QpCreate).unwrap_err();
/// assert_eq!(refusal.key(), LimitKey::count(Resource::Qp));
/// assert_eq!(refusal.limit(), 1);
/// assert_eq!(refusal.scope(), &Scope::Tenant("alice".into()));
/// assert_eq!(refusal.to_string(), "QP_COUNT limit 1 reached for tenant alice (1 live)");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A live-count limit is reached.
    #[error("{key} limit {limit} reached {} ({current} live)", .scope.phrase())]
    Count {
        /// The count key (`QP_COUNT`, ...).
        key: LimitKey,
        /// The limit.
        limit: u64,
        /// Live resources of this kind in `scope`.
        current: u64,
        /// Whose limit.
        scope: Scope,
    },
    /// Registering the memory region would exceed `MR_BYTES`.
    #[error(
        "MR_BYTES limit {limit} would be exceeded {} ({current} registered + {requested} requested)",
        .scope.phrase()
    )]
    Bytes {
        /// The limit.
        limit: u64,
        /// Registered bytes in `scope`.
        current: u64,
        /// The size of the refused registration.
        requested: u64,
        /// Whose limit.
        scope: Scope,
    },
    /// A verb's calls-per-second limit is exceeded.
    #[error(
        "{key} limit {limit}/s exceeded {} ({current} calls in the last second)",
        .scope.phrase()
    )]
    Rate {
        /// The rate key (the verb's name).
        key: LimitKey,
        /// The limit, in calls per second.
        limit: u64,
        /// Calls admitted in the second before this one, in `scope`.
        current: u64,
        /// Whose limit.
        scope: Scope,
    },
}

impl Refusal {
    /// The limit that refused.
    pub fn key(&self) -> LimitKey {
        match self {
            Refusal::Count { key, .. } | Refusal::Rate { key, .. } => *key,
            Refusal::Bytes { .. } => LimitKey::MR_BYTES,
        }
    }

    /// The value of that limit.
    pub fn limit(&self) -> u64 {
        match self {
            Refusal::Count { limit, .. }
            | Refusal::Bytes { limit, .. }
            | Refusal::Rate { limit, .. } => *limit,
        }
    }

    /// The value the limit was measured against: live resources, registered
    /// bytes, or calls in the last second.
    pub fn current(&self) -> u64 {
        match self {
            Refusal::Count { current, .. }
            | Refusal::Bytes { current, .. }
            | Refusal::Rate { current, .. } => *current,
        }
    }

    /// Whose limit refused.
    pub fn scope(&self) -> &Scope {
        match self {
            Refusal::Count { scope, .. }
            | Refusal::Bytes { scope, .. }
            | Refusal::Rate { scope, .. } => scope,
        }
    }

    /// The verb whose call was refused.
    pub fn verb(&self) -> Verb {
        let key = self.key();
        match (key.verb(), key.resource()) {
            (Some(verb), _) => verb,
            (None, Some(resource)) => resource.create_verb(),
            // Only MR_BYTES has neither.
            (None, None) => Verb::MrReg,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Resource;

    #[test]
    fn messages_name_key_limit_value_and_scope() {
        let rate = Refusal::Rate {
            key: LimitKey::rate(Verb::QpCreate).expect("creating verb"),
            limit: 2,
            current: 2,
            scope: Scope::Global,
        };
        assert_eq!(
            rate.to_string(),
            "QP_CREATE limit 2/s exceeded globally (2 calls in the last second)"
        );
        assert_eq!(rate.verb(), Verb::QpCreate);
        let bytes = Refusal::Bytes {
            limit: 4096,
            current: 4000,
            requested: 100,
            scope: Scope::Tenant("bob".into()),
        };
        assert_eq!(
            bytes.to_string(),
            "MR_BYTES limit 4096 would be exceeded for tenant bob (4000 registered + 100 requested)"
        );
        assert_eq!(bytes.verb(), Verb::MrReg);
        assert_eq!(bytes.key(), LimitKey::MR_BYTES);
        let count = Refusal::Count {
            key: LimitKey::count(Resource::Cq),
            limit: 3,
            current: 3,
            scope: Scope::Global,
        };
        assert_eq!(count.verb(), Verb::CqCreate);
        assert_eq!(count.scope().to_string(), "global");
        assert_eq!(Scope::Tenant("a".into()).to_string(), "tenant a");
    }
}
