//! The machine-readable report: one JSON object per interval.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use rdma_quota::{Limits, QuotaConfig, Resource, Verb};

use super::snapshot::{PortCounter, Snapshot};
use super::timestamp::rfc3339;

/// Renders one interval as a JSON object (write one per line for JSON Lines).
///
/// The schema is stable; fields are only ever added:
///
/// ```text
/// {
///   "time": "2024-05-01T12:00:00Z",           // end of the interval, UTC
///   "interval_seconds": 2.0,
///   "config": null | {                         // interception configuration
///     "global": {"QP_COUNT": 4, ...},          // enabled limits only
///     "tenants": {"alice": {"QP_COUNT": 2}}
///   },
///   "live": {"QP": 3, "PD": 1, "CQ": 2, "MR": 1},   // every resource
///   "mr_bytes": 4096,
///   "totals": {"QP_CREATE": 5, ...},           // every verb, cumulative
///   "rates": {"QP_CREATE": 1.5, ...},          // every verb, calls/s
///   "cgroups": [{"id": 4242, "path": "/x", "ops": {"QP_CREATE": 3}, "live": {"QP": 3}}],
///   "intercepted": [{"verb": "QP_CREATE", "scope": "alice", "key": "QP_COUNT",
///                    "limit": 2, "count": 5, "in_interval": 1}],
///   "lost_events": 3,
///   "attach": [{"hook": "ib_create_qp", "kind": "kprobe", "attached": true, "reason": null}],
///   "hw_counters": {                           // device -> port -> counter
///     "rxe-a": {"1": {"out_of_seq_request": {"total": 1, "delta": 1},
///                     "rcvd_pkts": {"total": 4711, "delta": 12}, ...}}
///   },
///   "hw_counters_skipped": [{"path": "rxe-a/ports/1/hw_counters/x",
///                            "kind": "not_a_number", "reason": "not a number: \"garbage\""}],
///   "auth_failures": null | {"alice": 2}       // per identity, since start
/// }
/// ```
///
/// Verb and resource names are those of [`Verb::name`] and
/// [`Resource::name`]; per-cgroup maps hold only what the cgroup reported. A
/// rate that is not a finite number is `null`.
///
/// `hw_counters` holds every port hardware counter read from sysfs
/// ([`crate::hw_counters`]) under the driver's name: `total` is the driver's
/// count, `delta` its growth since the previous report (`null` when there was
/// no earlier reading: the first report, a new device). The counters that show
/// injection and PSN guessing are listed in
/// [`SECURITY_COUNTERS`](crate::hw_counters::SECURITY_COUNTERS).
/// `hw_counters_skipped` lists the counter files that could not be read, `kind`
/// being `unreadable` or `not_a_number`. `auth_failures` counts the RDMA
/// messages that failed authentication per identity; it is `null` when the
/// reporting process does not count them (rdma-monitor on its own) and an
/// object, maybe empty, when it does (secure-server --telemetry).
pub fn render_json(snapshot: &Snapshot) -> Value {
    let s = snapshot;
    json!({
        "time": rfc3339(s.time),
        "interval_seconds": s.interval.as_secs_f64(),
        "config": s.config.as_ref().map(config_json),
        "live": Resource::ALL
            .into_iter()
            .map(|r| (r.name().to_owned(), json!(s.live.get(&r).copied().unwrap_or(0))))
            .collect::<Map<_, _>>(),
        "mr_bytes": s.mr_bytes,
        "totals": Verb::ALL
            .into_iter()
            .map(|v| (v.name().to_owned(), json!(s.totals.get(&v).copied().unwrap_or(0))))
            .collect::<Map<_, _>>(),
        "rates": Verb::ALL
            .into_iter()
            .map(|v| (v.name().to_owned(), json!(s.rates.get(&v).copied().unwrap_or(0.0))))
            .collect::<Map<_, _>>(),
        "cgroups": s.cgroups.iter().map(|c| json!({
            "id": c.id,
            "path": c.path,
            "ops": c.ops.iter().map(|(v, n)| (v.name().to_owned(), json!(n))).collect::<Map<_, _>>(),
            "live": c.live.iter().map(|(r, n)| (r.name().to_owned(), json!(n))).collect::<Map<_, _>>(),
        })).collect::<Vec<_>>(),
        "intercepted": s.intercepted.iter().map(|i| json!({
            "verb": i.verb.name(),
            "scope": i.scope,
            "key": i.key,
            "limit": i.limit,
            "count": i.count,
            "in_interval": i.in_interval,
        })).collect::<Vec<_>>(),
        "lost_events": s.lost_events,
        "attach": s.attach.iter().map(|a| json!({
            "hook": a.hook,
            "kind": a.kind,
            "attached": a.attached,
            "reason": a.reason,
        })).collect::<Vec<_>>(),
        "hw_counters": hw_counters_json(&s.hw_counters),
        "hw_counters_skipped": s.hw_counters_skipped.iter().map(|k| json!({
            "path": k.path,
            "kind": k.reason.label(),
            "reason": k.reason.to_string(),
        })).collect::<Vec<_>>(),
        "auth_failures": s.auth_failures,
    })
}

fn hw_counters_json(counters: &[PortCounter]) -> Value {
    let mut devices: BTreeMap<&str, BTreeMap<String, Map<String, Value>>> = BTreeMap::new();
    for c in counters {
        devices
            .entry(&c.device)
            .or_default()
            .entry(c.port.to_string())
            .or_default()
            .insert(
                c.counter.clone(),
                json!({"total": c.total, "delta": c.delta}),
            );
    }
    json!(devices)
}

fn config_json(config: &QuotaConfig) -> Value {
    json!({
        "global": limits_json(&config.global),
        "tenants": config
            .tenants
            .iter()
            .map(|(name, limits)| (name.clone(), limits_json(limits)))
            .collect::<Map<_, _>>(),
    })
}

fn limits_json(limits: &Limits) -> Value {
    Value::Object(
        limits
            .iter()
            .map(|(key, value)| (key.name().to_owned(), json!(value)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::test_support::example;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn renders_the_documented_schema() {
        let v = render_json(&example());
        assert_eq!(v["time"], "2024-05-01T12:00:00Z");
        assert_eq!(v["interval_seconds"], 2.0);
        assert_eq!(
            v["config"],
            json!({
                "global": {"QP_COUNT": 4, "MR_BYTES": 1_048_576, "QP_CREATE": 10},
                "tenants": {"alice": {"QP_COUNT": 2}},
            })
        );
        assert_eq!(v["live"], json!({"QP": 3, "PD": 1, "CQ": 2, "MR": 1}));
        assert_eq!(v["mr_bytes"], 4096);
        assert_eq!(v["totals"]["QP_CREATE"], 5);
        assert_eq!(v["totals"]["CM_SEND_REQ"], 0);
        assert_eq!(v["totals"]["CTX_OPEN"], 0);
        assert_eq!(v["totals"].as_object().map(|o| o.len()), Some(12));
        assert_eq!(v["rates"]["QP_CREATE"], 1.5);
        assert_eq!(
            v["cgroups"][0],
            json!({
                "id": 4242,
                "path": "/system.slice/\"odd\\name\"\n.service",
                "ops": {"QP_CREATE": 3, "MR_REG": 1},
                "live": {"QP": 3, "MR": 1},
            })
        );
        assert_eq!(
            v["intercepted"][0],
            json!({"verb": "QP_CREATE", "scope": "alice", "key": "QP_COUNT",
                   "limit": 2, "count": 5, "in_interval": 1})
        );
        assert_eq!(v["lost_events"], 3);
        assert_eq!(
            v["attach"][1],
            json!({"hook": "ib_uverbs_reg_mr", "kind": "kprobe", "attached": false,
                   "reason": "symbol not found"})
        );
        assert_eq!(
            v["hw_counters"]["rxe-a"],
            json!({"1": {
                "duplicate_request": {"total": 5, "delta": 2},
                "out_of_seq_request": {"total": 1, "delta": 1},
                "rcvd_pkts": {"total": 4711, "delta": 12},
                "sent_pkts": {"total": 4700, "delta": 0},
            }})
        );
        assert_eq!(
            v["hw_counters"]["mlx5_0"]["1"]["packet_seq_err"],
            json!({"total": 9, "delta": null})
        );
        assert_eq!(v["hw_counters"]["we\"ird\n"]["2"]["rcvd_pkts"]["total"], 1);
        assert_eq!(
            v["hw_counters_skipped"],
            json!([{"path": "rxe-a/ports/1/hw_counters/rcvd_seq_err", "kind": "not_a_number",
                    "reason": "not a number: \"garbage\""}])
        );
        assert_eq!(v["auth_failures"], json!({"alice": 2, "b\"o\\b\n": 1}));
    }

    #[test]
    fn empty_snapshot_has_every_field() {
        let mut s = Snapshot::new(UNIX_EPOCH, Duration::from_secs(1));
        s.rates.insert(Verb::QpCreate, f64::NAN);
        let v = render_json(&s);
        let fields: Vec<_> = v
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        let mut expected = vec![
            "time",
            "interval_seconds",
            "config",
            "live",
            "mr_bytes",
            "totals",
            "rates",
            "cgroups",
            "intercepted",
            "lost_events",
            "attach",
            "hw_counters",
            "hw_counters_skipped",
            "auth_failures",
        ];
        expected.sort_unstable();
        assert_eq!(fields, expected);
        assert_eq!(v["config"], Value::Null);
        assert_eq!(v["hw_counters"], json!({}));
        assert_eq!(v["hw_counters_skipped"], json!([]));
        assert_eq!(v["auth_failures"], Value::Null);
        assert_eq!(v["rates"]["QP_CREATE"], Value::Null);
        assert_eq!(v["live"]["MR"], 0);
    }
}
