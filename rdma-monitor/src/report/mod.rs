//! `rdma-monitor` reports: one [`Snapshot`] per interval, rendered as text,
//! JSON or Prometheus metrics, and served over HTTP for scraping.
//!
//! The snapshot gathers what the kernel programs counted (calls per verb and
//! cgroup, live resources, lost events, attach results), what quota
//! enforcement counted ([`rdma_quota::Quotas::snapshot`]), the ports' hardware
//! counters ([`crate::hw_counters`]) and, when the process counts them, the RDMA
//! messages that failed authentication per identity. The
//! renderers are pure functions of it, so every output format shows the same
//! interval:
//!
//! - [`render_text`]: sections for people, in the original monitor's layout
//!   ([`render_text_with`] to list every hardware counter);
//! - [`render_json`]: one object per interval, with a documented schema;
//! - [`render_exposition`]: every metric of an exporter (its build info, the
//!   snapshot's [`SnapshotMetrics`], its own), encoded by `prometheus-client`
//!   in the OpenMetrics format ([`render_prometheus`]: the snapshot's alone;
//!   [`to_text_format`]: the format 0.0.4), served by [`serve_metrics`] or
//!   [`serve_metrics_with`].
//!
//! [`Sampler`] turns successive counter readings into snapshots with rates,
//! naming the cgroup ids the kernel reports by their paths
//! ([`rdma_quota::cgroup::path_of_id`]).
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use rdma_monitor::report::{render_text, Snapshot};
//!
//! let snapshot = Snapshot::new(SystemTime::now(), Duration::from_secs(5));
//! print!("{}", render_text(&snapshot));
//! ```

#![warn(missing_docs)]

mod http;
mod json;
mod prometheus;
mod sampler;
mod snapshot;
#[cfg(test)]
mod test_support;
mod text;
mod timestamp;

pub use http::{serve_metrics, serve_metrics_with, CONTENT_TYPE};
pub use json::render_json;
pub use prometheus::{
    render_exposition, render_prometheus, to_text_format, BuildInfo, SnapshotMetrics,
    OPENMETRICS_CONTENT_TYPE,
};
pub use sampler::Sampler;
pub use snapshot::{AttachReport, CgroupStats, CountSource, Interception, PortCounter, Snapshot};
pub use text::{render_text, render_text_with, TextOptions};
