//! Quotas on the RDMA control path: thresholds, rates and admission.
//!
//! The same thresholds drive the in-process admission of `secure-server` and
//! the reports of `rdma-monitor`.
//!
//! # The model
//!
//! - **Count limits** (`QP_COUNT`, `PD_COUNT`, `CQ_COUNT`, `MR_COUNT`, and
//!   `MR_BYTES`) cap what is live. They are checked on creation only:
//!   modifying, querying and destroying are never refused by a count, and
//!   destruction is never limited at all, since refusing it would only keep
//!   resources alive longer.
//! - **Rate limits** are named by a verb (`QP_CREATE`, `MR_REG`, ...) and cap
//!   that verb's calls in any sliding second ([`RateWindow`]).
//! - **Scopes**: the global limits count all tenants together; a tenant's own
//!   limits (`tenant NAME KEY VALUE`) count only that identity, across all of
//!   its sessions. A call must pass both.
//!
//! [`QuotaConfig`] parses the thresholds, [`Quotas`] enforces them before the
//! server makes any resource, and each admitted creation returns an
//! [`Admission`] that keeps the resource counted until it is dropped. A
//! refused call is a [`Refusal`] and counts as intercepted.
//!
//! ```
//! use secure_rdma::quota::{QuotaConfig, Quotas, TenantInfo, Verb};
//!
//! let config = QuotaConfig::parse("QP_COUNT 100\ntenant alice QP_COUNT 1\n", "quota.conf")?;
//! let quotas = Quotas::new(config);
//! let alice = quotas.register(TenantInfo { identity: "alice".into(), pid: 42, cgroup_id: 7 });
//!
//! let qp = alice.admit(Verb::QpCreate)?;
//! assert!(alice.admit(Verb::QpCreate).is_err());
//! drop(qp);
//! assert!(alice.admit(Verb::QpCreate).is_ok());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod admission;
pub mod cgroup;
mod config;
mod key;
mod rate;
mod refusal;
mod snapshot;
mod verb;

pub use admission::{Admission, Quotas, TenantQuota};
pub use config::{ConfigError, EntryError, LimitSetting, Limits, QuotaConfig};
pub use key::LimitKey;
pub use rate::{rate_per_second, RateWindow};
pub use refusal::{Refusal, Scope};
pub use snapshot::{QuotaSnapshot, RefusalCount, TenantInfo, TenantSnapshot, UsageSnapshot};
pub use verb::{Resource, UnknownVerb, Verb};
