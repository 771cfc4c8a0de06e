//! The metrics exposition: a `prometheus-client` collector over a
//! [`Snapshot`], the exporters' build info, and the two text formats
//! Prometheus reads (OpenMetrics, and the older 0.0.4 for everything else).

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use rdma_quota::{Resource, Verb};

use super::snapshot::Snapshot;
use crate::hw_counters::SkipReason;

/// The content type of the OpenMetrics text format, what
/// [`render_exposition`] produces.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The metrics of one [`Snapshot`], for a `prometheus-client` registry.
///
/// Metrics, prefixed `rdma_` (names as scraped; see [`render_prometheus`]):
///
/// | metric | type | labels |
/// |---|---|---|
/// | `rdma_live_resources` | gauge | `resource` (`qp`, `pd`, `cq`, `mr`), `source` |
/// | `rdma_mr_bytes` | gauge | `source` |
/// | `rdma_limit` | gauge | `scope` (`global` or tenant), `key` |
/// | `rdma_verb_calls_total` | counter | `verb`, `source` |
/// | `rdma_cgroup_verb_calls_total` | counter | `cgroup`, `cgroup_id`, `verb` |
/// | `rdma_cgroup_live_resources` | gauge | `cgroup`, `cgroup_id`, `resource` |
/// | `rdma_intercepted_total` | counter | `verb`, `scope`, `key` |
/// | `rdma_lost_events_total` | counter | |
/// | `rdma_probe_attached` | gauge | `hook`, `kind` |
/// | `rdma_port_hw_events_total` | counter | `device`, `port`, `counter` |
/// | `rdma_port_hw_counters_skipped` | gauge | `reason` (`unreadable`, `not_a_number`) |
///
/// `source` says who counted: `ebpf` (the kernel probes, every process on
/// the host) or `process` (the exporter's own quota accounting, without
/// eBPF); the families carrying it have no samples when nobody counted
/// ([`Snapshot::source`] is `None`). Per-cgroup counts exist only with eBPF.
/// `rdma_port_hw_events_total` is every port hardware counter under the
/// driver's own name (see [`crate::hw_counters`]; `rate()` gives what the
/// text report's deltas show). There is no per-second gauge: Prometheus
/// computes rates from the counters.
///
/// Every family has its `# HELP` and `# TYPE` lines even without samples.
/// Interceptions repeated for the same labels are summed, since a series
/// may appear only once.
#[derive(Debug, Clone)]
pub struct SnapshotMetrics(pub Arc<Snapshot>);

/// Label sets: a few `(name, value)` pairs, in the order they are written.
type Labels<'a, const N: usize> = [(&'static str, &'a str); N];

/// Starts a family, then writes one sample per `(labels, metric)`.
fn family<'a, S: EncodeLabelSet + 'a, M: EncodeMetric + 'a>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    kind: MetricType,
    samples: impl IntoIterator<Item = (S, M)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, unit, kind)?;
    for (labels, metric) in samples {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Collector for SnapshotMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &*self.0;
        let e = &mut encoder;
        let source = s.source.map(|c| c.label());

        let resources: Vec<String> = Resource::ALL
            .iter()
            .map(|r| r.name().to_ascii_lowercase())
            .collect();
        let resources = &resources;
        family(
            e,
            "rdma_live_resources",
            "Live RDMA resources, system-wide.",
            None,
            MetricType::Gauge,
            source.into_iter().flat_map(|source| {
                Resource::ALL.iter().zip(resources).map(move |(r, name)| {
                    let live = s.live.get(r).copied().unwrap_or(0);
                    (
                        [("resource", name.as_str()), ("source", source)],
                        ConstGauge::new(live),
                    )
                })
            }),
        )?;

        family(
            e,
            "rdma_mr",
            "Bytes of registered memory regions, system-wide.",
            Some(&Unit::Bytes),
            MetricType::Gauge,
            source.map(|source| ([("source", source)], ConstGauge::new(s.mr_bytes))),
        )?;

        let limits: Vec<(String, &str, u64)> = s
            .config
            .iter()
            .flat_map(|config| config.entries())
            .map(|entry| {
                let scope = entry.tenant().unwrap_or("global").to_owned();
                (scope, entry.key().name(), entry.value())
            })
            .collect();
        family(
            e,
            "rdma_limit",
            "Quota thresholds in force: live counts, bytes, or calls per second.",
            None,
            MetricType::Gauge,
            limits.iter().map(|(scope, key, value)| {
                (
                    [("scope", scope.as_str()), ("key", *key)],
                    ConstGauge::new(*value),
                )
            }),
        )?;

        family(
            e,
            "rdma_verb_calls",
            "Calls of each RDMA control verb.",
            None,
            MetricType::Counter,
            source.into_iter().flat_map(|source| {
                Verb::ALL.iter().map(move |v| {
                    let total = s.totals.get(v).copied().unwrap_or(0);
                    (
                        [("verb", v.name()), ("source", source)],
                        ConstCounter::new(total),
                    )
                })
            }),
        )?;

        let ids: Vec<String> = s.cgroups.iter().map(|c| c.id.to_string()).collect();
        family(
            e,
            "rdma_cgroup_verb_calls",
            "Calls of each RDMA control verb, per cgroup (eBPF).",
            None,
            MetricType::Counter,
            s.cgroups.iter().zip(&ids).flat_map(|(c, id)| {
                c.ops.iter().map(move |(v, n)| {
                    (
                        [
                            ("cgroup", c.path.as_str()),
                            ("cgroup_id", id.as_str()),
                            ("verb", v.name()),
                        ],
                        ConstCounter::new(*n),
                    )
                })
            }),
        )?;

        let cgroup_live: Vec<(Labels<3>, ConstGauge)> = s
            .cgroups
            .iter()
            .zip(&ids)
            .flat_map(|(c, id)| {
                c.live.iter().map(move |(r, n)| {
                    let index = Resource::ALL.iter().position(|x| x == r).unwrap_or(0);
                    (
                        [
                            ("cgroup", c.path.as_str()),
                            ("cgroup_id", id.as_str()),
                            ("resource", resources[index].as_str()),
                        ],
                        ConstGauge::new(*n),
                    )
                })
            })
            .collect();
        family(
            e,
            "rdma_cgroup_live_resources",
            "Live RDMA resources, per cgroup (eBPF).",
            None,
            MetricType::Gauge,
            cgroup_live,
        )?;

        let mut intercepted: BTreeMap<(Verb, &str, &str), u64> = BTreeMap::new();
        for i in &s.intercepted {
            let count = intercepted.entry((i.verb, &i.scope, &i.key)).or_default();
            *count = count.saturating_add(i.count);
        }
        family(
            e,
            "rdma_intercepted",
            "Calls refused by a quota, by verb, scope and limit.",
            None,
            MetricType::Counter,
            intercepted.into_iter().map(|((verb, scope, key), count)| {
                (
                    [("verb", verb.name()), ("scope", scope), ("key", key)],
                    ConstCounter::new(count),
                )
            }),
        )?;

        // Unlabelled: written straight, since an empty label set would print as `{}`.
        let lost = ConstCounter::new(s.lost_events);
        lost.encode(e.encode_descriptor(
            "rdma_lost_events",
            "Kernel events lost because the ring buffer was full.",
            None,
            lost.metric_type(),
        )?)?;

        family(
            e,
            "rdma_probe_attached",
            "Whether each kernel hook is attached (1) or not (0).",
            None,
            MetricType::Gauge,
            s.attach.iter().map(|a| {
                (
                    [("hook", a.hook.as_str()), ("kind", a.kind.as_str())],
                    ConstGauge::new(i64::from(a.attached)),
                )
            }),
        )?;

        let ports: Vec<String> = s.hw_counters.iter().map(|c| c.port.to_string()).collect();
        family(
            e,
            "rdma_port_hw_events",
            "RDMA port hardware counters from sysfs, under the driver's names.",
            None,
            MetricType::Counter,
            s.hw_counters.iter().zip(&ports).map(|(c, port)| {
                (
                    [
                        ("device", c.device.as_str()),
                        ("port", port.as_str()),
                        ("counter", c.counter.as_str()),
                    ],
                    ConstCounter::new(c.total),
                )
            }),
        )?;

        family(
            e,
            "rdma_port_hw_counters_skipped",
            "Port hardware counter files the last reading could not use, by reason.",
            None,
            MetricType::Gauge,
            SkipReason::LABELS.iter().map(|reason| {
                let n = s
                    .hw_counters_skipped
                    .iter()
                    .filter(|k| k.reason.label() == *reason)
                    .count();
                ([("reason", *reason)], ConstGauge::new(n))
            }),
        )?;
        Ok(())
    }
}

/// Which exporter serves the metrics: the `<exporter>_build_info` metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildInfo {
    /// The metric's prefix, the exporter in snake_case (`rdma_monitor`,
    /// `secure_server`).
    pub exporter: &'static str,
    /// Its version (`env!("CARGO_PKG_VERSION")`).
    pub version: &'static str,
}

/// Every metric of an exporter, in the OpenMetrics text format: its
/// `<exporter>_build_info{version}` (value 1), the metrics of `snapshot`
/// ([`SnapshotMetrics`]) if there is one yet, then whatever `register` adds
/// (secure-server: its own counts).
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use rdma_monitor::report::{render_exposition, BuildInfo, Snapshot};
///
/// let snapshot = Snapshot::new(SystemTime::now(), Duration::from_secs(1));
/// let build = BuildInfo { exporter: "rdma_monitor", version: "0.1.0" };
/// let text = render_exposition(Some(&snapshot), &build, |_| {});
/// assert!(text.contains("\nrdma_monitor_build_info{version=\"0.1.0\"} 1\n"));
/// assert!(text.ends_with("# EOF\n"));
/// ```
pub fn render_exposition(
    snapshot: Option<&Snapshot>,
    build: &BuildInfo,
    register: impl FnOnce(&mut Registry),
) -> String {
    let mut registry = Registry::default();
    registry.register(
        format!("{}_build", build.exporter),
        "The exporter's version; always 1",
        Info::new([("version", build.version)]),
    );
    if let Some(snapshot) = snapshot {
        registry.register_collector(Box::new(SnapshotMetrics(Arc::new(snapshot.clone()))));
    }
    register(&mut registry);
    encode(&registry)
}

/// The metrics of `snapshot` alone ([`SnapshotMetrics`]), in the OpenMetrics
/// text format: counters are announced without their `_total` suffix, which
/// their samples carry (as scraped, and in [`to_text_format`], the names in
/// the table of [`SnapshotMetrics`]).
pub fn render_prometheus(snapshot: &Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(SnapshotMetrics(Arc::new(snapshot.clone()))));
    encode(&registry)
}

fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    // Writing to a String fails only if a collector fails, and ours do not.
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, registry) {
        tracing::warn!(error = %e, "cannot encode the metrics");
    }
    text
}

/// The OpenMetrics text of [`render_exposition`] in the Prometheus text
/// format 0.0.4, for scrapers that do not ask for OpenMetrics (`curl`,
/// `promtool check metrics`, older Prometheus).
///
/// The two differ only in how families are announced: a counter `x` is
/// `x_total` in 0.0.4 (its samples already are), an info `x` a gauge
/// `x_info`, `unknown` is `untyped`; `# UNIT` and `# EOF` do not exist in
/// 0.0.4. Samples are copied unchanged (the encoder writes no exemplars or
/// `_created` series here).
///
/// ```
/// use rdma_monitor::report::to_text_format;
///
/// let om = "# HELP x Things.\n# TYPE x counter\nx_total 3\n# EOF\n";
/// assert_eq!(to_text_format(om), "# HELP x_total Things.\n# TYPE x_total counter\nx_total 3\n");
/// ```
pub fn to_text_format(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len());
    // The HELP line waits for its TYPE line, which decides the family's name.
    let mut help: Option<(&str, &str)> = None;
    let flush = |out: &mut String, help: &mut Option<(&str, &str)>| {
        if let Some((name, text)) = help.take() {
            out.push_str(&format!("# HELP {name} {text}\n"));
        }
    };
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            flush(&mut out, &mut help);
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help = Some((name, text));
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let (renamed, kind) = match kind {
                "counter" => (format!("{name}_total"), "counter"),
                "info" => (format!("{name}_info"), "gauge"),
                "stateset" => (name.to_owned(), "gauge"),
                "gaugehistogram" => (name.to_owned(), "histogram"),
                "unknown" => (name.to_owned(), "untyped"),
                other => (name.to_owned(), other),
            };
            match help.take() {
                Some((helped, text)) if helped == name => {
                    out.push_str(&format!("# HELP {renamed} {text}\n"));
                }
                other => {
                    help = other;
                    flush(&mut out, &mut help);
                }
            }
            out.push_str(&format!("# TYPE {renamed} {kind}\n"));
        } else if line.starts_with("# UNIT ") || line == "# EOF" {
            continue;
        } else {
            flush(&mut out, &mut help);
            out.push_str(line);
            out.push('\n');
        }
    }
    flush(&mut out, &mut help);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::test_support::example;

    fn lines(text: &str) -> Vec<&str> {
        text.lines().collect()
    }

    #[test]
    fn renders_samples_with_help_and_type() {
        let text = to_text_format(&render_prometheus(&example()));
        let lines = lines(&text);
        for expected in [
            "# HELP rdma_live_resources Live RDMA resources, system-wide.",
            "# TYPE rdma_live_resources gauge",
            "rdma_live_resources{resource=\"qp\",source=\"ebpf\"} 3",
            "rdma_live_resources{resource=\"mr\",source=\"ebpf\"} 1",
            "# TYPE rdma_mr_bytes gauge",
            "rdma_mr_bytes{source=\"ebpf\"} 4096",
            "rdma_limit{scope=\"global\",key=\"QP_COUNT\"} 4",
            "rdma_limit{scope=\"alice\",key=\"QP_COUNT\"} 2",
            "# HELP rdma_verb_calls_total Calls of each RDMA control verb.",
            "# TYPE rdma_verb_calls_total counter",
            "rdma_verb_calls_total{verb=\"QP_CREATE\",source=\"ebpf\"} 5",
            "rdma_verb_calls_total{verb=\"CM_SEND_REQ\",source=\"ebpf\"} 0",
            "rdma_intercepted_total{verb=\"QP_CREATE\",scope=\"alice\",key=\"QP_COUNT\"} 5",
            "rdma_intercepted_total{verb=\"MR_REG\",scope=\"bob\",key=\"MR_REG\"} 4",
            "# TYPE rdma_lost_events_total counter",
            "rdma_lost_events_total 3",
            "rdma_probe_attached{hook=\"ib_create_qp\",kind=\"kprobe\"} 1",
            "rdma_probe_attached{hook=\"ib_uverbs_reg_mr\",kind=\"kprobe\"} 0",
            "# TYPE rdma_port_hw_events_total counter",
            "rdma_port_hw_events_total{device=\"rxe-a\",port=\"1\",counter=\"out_of_seq_request\"} 1",
            "rdma_port_hw_events_total{device=\"rxe-a\",port=\"1\",counter=\"duplicate_request\"} 5",
            "rdma_port_hw_events_total{device=\"mlx5_0\",port=\"1\",counter=\"packet_seq_err\"} 9",
            "rdma_port_hw_events_total{device=\"mlx5_0\",port=\"1\",counter=\"out_of_sequence\"} 0",
            "# TYPE rdma_port_hw_counters_skipped gauge",
            "rdma_port_hw_counters_skipped{reason=\"unreadable\"} 0",
            "rdma_port_hw_counters_skipped{reason=\"not_a_number\"} 1",
        ] {
            assert!(lines.contains(&expected), "missing {expected:?} in\n{text}");
        }
        assert!(text.ends_with('\n'));
        // Prometheus computes rates: no precomputed ones are exported.
        assert!(!text.contains("per_second"), "{text}");
    }

    #[test]
    fn openmetrics_announces_counters_without_total_and_ends_with_eof() {
        let text = render_prometheus(&example());
        let lines = lines(&text);
        for expected in [
            "# TYPE rdma_verb_calls counter",
            "rdma_verb_calls_total{verb=\"QP_CREATE\",source=\"ebpf\"} 5",
            "# UNIT rdma_mr_bytes bytes",
            "# EOF",
        ] {
            assert!(lines.contains(&expected), "missing {expected:?} in\n{text}");
        }
    }

    #[test]
    fn without_a_source_the_source_labelled_families_are_empty() {
        let mut snapshot = example();
        snapshot.source = None;
        let text = to_text_format(&render_prometheus(&snapshot));
        assert!(text.contains("# TYPE rdma_verb_calls_total counter\n"));
        assert!(
            !text.contains(",source=") && !text.contains("{source="),
            "{text}"
        );
        snapshot.source = Some(crate::report::CountSource::Process);
        let text = to_text_format(&render_prometheus(&snapshot));
        assert!(text.contains("rdma_verb_calls_total{verb=\"QP_CREATE\",source=\"process\"} 5\n"));
    }

    #[test]
    fn escapes_quotes_backslashes_and_newlines_in_labels() {
        let text = to_text_format(&render_prometheus(&example()));
        let expected = "rdma_cgroup_verb_calls_total{cgroup=\"/system.slice/\\\"odd\\\\name\\\"\\n.service\",cgroup_id=\"4242\",verb=\"QP_CREATE\"} 3";
        assert!(
            lines(&text).contains(&expected),
            "missing {expected:?} in\n{text}"
        );
        let expected = "rdma_cgroup_live_resources{cgroup=\"/system.slice/\\\"odd\\\\name\\\"\\n.service\",cgroup_id=\"4242\",resource=\"qp\"} 3";
        assert!(
            lines(&text).contains(&expected),
            "missing {expected:?} in\n{text}"
        );
        let expected =
            "rdma_port_hw_events_total{device=\"we\\\"ird\\n\",port=\"2\",counter=\"rcvd_pkts\"} 1";
        assert!(
            lines(&text).contains(&expected),
            "missing {expected:?} in\n{text}"
        );
        // A raw newline inside a label would split a sample over two lines.
        assert!(lines(&text)
            .iter()
            .all(|l| l.starts_with('#') || l.starts_with("rdma_")));
    }

    #[test]
    fn every_family_is_announced_once_and_series_are_unique() {
        let mut snapshot = example();
        let again = snapshot.intercepted[0].clone();
        snapshot.intercepted.push(again);
        let build = BuildInfo {
            exporter: "rdma_monitor",
            version: "1.2.3",
        };
        let text = to_text_format(&render_exposition(Some(&snapshot), &build, |_| {}));
        let mut types = Vec::new();
        let mut series = std::collections::BTreeSet::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                types.push(rest.split(' ').next().unwrap_or_default().to_owned());
            } else if !line.starts_with('#') {
                let (name, _) = line.rsplit_once(' ').unwrap_or((line, ""));
                assert!(series.insert(name.to_owned()), "duplicate series {name}");
            }
        }
        assert_eq!(types.len(), 12, "{types:?}");
        let unique: std::collections::BTreeSet<_> = types.iter().collect();
        assert_eq!(unique.len(), types.len());
        assert!(text.lines().any(|l| l
            == "rdma_intercepted_total{verb=\"QP_CREATE\",scope=\"alice\",key=\"QP_COUNT\"} 10"));
        assert!(text.contains(
            "# TYPE rdma_monitor_build_info gauge\nrdma_monitor_build_info{version=\"1.2.3\"} 1\n"
        ));
    }

    #[test]
    fn the_text_format_renames_announcements_only() {
        let om = "# HELP a Gauge.\n# TYPE a gauge\n# UNIT a bytes\na 1\n\
                  # HELP b_build Info.\n# TYPE b_build info\nb_build_info{version=\"1\"} 1\n\
                  # HELP c Hist.\n# TYPE c_seconds histogram\nc_seconds_count 0\n# EOF\n";
        assert_eq!(
            to_text_format(om),
            "# HELP a Gauge.\n# TYPE a gauge\na 1\n\
             # HELP b_build_info Info.\n# TYPE b_build_info gauge\nb_build_info{version=\"1\"} 1\n\
             # HELP c Hist.\n# TYPE c_seconds histogram\nc_seconds_count 0\n"
        );
    }
}
