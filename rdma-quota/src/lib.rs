//! # rdma-quota
//!
//! Quotas on the RDMA control path: thresholds, rates and admission, the
//! tenants they apply to, and the collector's wire protocol.
//!
//! The same thresholds drive the in-process admission of `secure-server`, the
//! collector (`rdma-collector`) that the `LD_PRELOAD` interceptor asks, and
//! the reports of `rdma-monitor`. Only `std` and `thiserror`: every one of
//! those builds on this crate, the preloaded interceptor included.
//!
//! Modules, in reading order (the types are re-exported at the root):
//! - `verb`: [`Verb`] and [`Resource`], the operations observed and limited;
//!   verb ids are the one definition of the kernel programs' contract.
//! - `key`: [`LimitKey`], the names of the limits a quota file can set.
//! - `config`: [`QuotaConfig`], the threshold file and `--limit` flags.
//! - `rate`: [`RateWindow`], calls per sliding second.
//! - `admission`: [`Quotas`], [`TenantQuota`] and the RAII [`Admission`].
//! - `refusal`: [`Refusal`], why a call was refused and for whom.
//! - `snapshot`: [`QuotaSnapshot`], what admission has counted, for reports.
//! - [`tenant`]: tenant names and how a connected program's tenant is found.
//! - [`spiffe`]: SPIFFE IDs, the tenant names of X509-SVIDs.
//! - [`cgroup`]: which cgroup v2 a process is in, and ids back to paths.
//! - [`rdma_cgroup`]: the kernel's rdma cgroup limits (`rdma.max`).
//! - [`wire`]: the collector protocol, both halves, and its socket path.
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
//! use rdma_quota::{QuotaConfig, Quotas, TenantInfo, Verb};
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

#![warn(missing_docs)]

mod admission;
pub mod cgroup;
mod config;
mod key;
mod rate;
pub mod rdma_cgroup;
mod refusal;
mod snapshot;
pub mod spiffe;
pub mod tenant;
mod verb;
pub mod wire;

pub use admission::{Admission, Quotas, TenantQuota};
pub use config::{ConfigError, EntryError, LimitSetting, Limits, QuotaConfig};
pub use key::LimitKey;
pub use rate::{rate_per_second, RateWindow};
pub use refusal::{Refusal, Scope};
pub use snapshot::{QuotaSnapshot, RefusalCount, TenantInfo, TenantSnapshot, UsageSnapshot};
pub use verb::{Resource, UnknownVerb, Verb};

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
