//! The Prometheus text exposition format (version 0.0.4).

use std::collections::BTreeMap;
use std::fmt::Write;

use rdma_quota::{Resource, Verb};

use super::snapshot::Snapshot;
use crate::hw_counters::SkipReason;

/// Renders one interval in the Prometheus text exposition format 0.0.4.
///
/// Metrics, prefixed `rdma_` (those of the secure server's own checks `secure_rdma_`):
///
/// | metric | type | labels |
/// |---|---|---|
/// | `rdma_live_resources` | gauge | `resource` (`qp`, `pd`, `cq`, `mr`) |
/// | `rdma_mr_bytes` | gauge | |
/// | `rdma_limit` | gauge | `scope` (`global` or tenant), `key` |
/// | `rdma_verb_calls_total` | counter | `verb` |
/// | `rdma_verb_calls_per_second` | gauge | `verb` |
/// | `rdma_cgroup_verb_calls_total` | counter | `cgroup`, `cgroup_id`, `verb` |
/// | `rdma_cgroup_live_resources` | gauge | `cgroup`, `cgroup_id`, `resource` |
/// | `rdma_intercepted_total` | counter | `verb`, `scope`, `key` |
/// | `rdma_lost_events_total` | counter | |
/// | `rdma_probe_attached` | gauge | `hook`, `kind` |
/// | `rdma_port_hw_counter` | counter | `device`, `port`, `counter` |
/// | `rdma_port_hw_counters_skipped` | gauge | `reason` (`unreadable`, `not_a_number`) |
/// | `secure_rdma_auth_failures_total` | counter | `identity` |
///
/// `rdma_port_hw_counter` is every port hardware counter under the driver's own
/// name (see [`crate::hw_counters`]; `rate()` gives what the text report's
/// deltas show); `rdma_port_hw_counters_skipped` counts the counter files the
/// last reading could not use. `secure_rdma_auth_failures_total` counts the
/// RDMA messages that failed authentication per identity; it has samples only
/// where they are counted (secure-server), never in rdma-monitor on its own.
///
/// Every family has its `# HELP` and `# TYPE` lines even without samples.
/// Label values are escaped as the format requires (`\\`, `\"`, `\n`).
/// Interceptions repeated for the same labels are summed, since a series
/// may appear only once.
pub fn render_prometheus(snapshot: &Snapshot) -> String {
    let mut out = Exposition::default();
    let s = snapshot;

    out.family(
        "rdma_live_resources",
        "gauge",
        "Live RDMA resources, system-wide.",
    );
    for r in Resource::ALL {
        let live = s.live.get(&r).copied().unwrap_or(0);
        out.sample(
            "rdma_live_resources",
            &[("resource", &r.name().to_ascii_lowercase())],
            live,
        );
    }

    out.family(
        "rdma_mr_bytes",
        "gauge",
        "Bytes of registered memory regions, system-wide.",
    );
    out.sample("rdma_mr_bytes", &[], s.mr_bytes);

    out.family(
        "rdma_limit",
        "gauge",
        "Quota thresholds in force: live counts, bytes, or calls per second.",
    );
    if let Some(config) = &s.config {
        for entry in config.entries() {
            let scope = entry.tenant().unwrap_or("global");
            out.sample(
                "rdma_limit",
                &[("scope", scope), ("key", entry.key().name())],
                entry.value(),
            );
        }
    }

    out.family(
        "rdma_verb_calls_total",
        "counter",
        "Calls of each RDMA control verb.",
    );
    for v in Verb::ALL {
        let total = s.totals.get(&v).copied().unwrap_or(0);
        out.sample("rdma_verb_calls_total", &[("verb", v.name())], total);
    }

    out.family(
        "rdma_verb_calls_per_second",
        "gauge",
        "Calls per second of each RDMA control verb over the last interval.",
    );
    for v in Verb::ALL {
        let rate = s.rates.get(&v).copied().unwrap_or(0.0);
        out.sample(
            "rdma_verb_calls_per_second",
            &[("verb", v.name())],
            Float(rate),
        );
    }

    out.family(
        "rdma_cgroup_verb_calls_total",
        "counter",
        "Calls of each RDMA control verb, per cgroup.",
    );
    for c in &s.cgroups {
        let id = c.id.to_string();
        for (v, n) in &c.ops {
            let labels = [
                ("cgroup", c.path.as_str()),
                ("cgroup_id", &id),
                ("verb", v.name()),
            ];
            out.sample("rdma_cgroup_verb_calls_total", &labels, n);
        }
    }

    out.family(
        "rdma_cgroup_live_resources",
        "gauge",
        "Live RDMA resources, per cgroup.",
    );
    for c in &s.cgroups {
        let id = c.id.to_string();
        for (r, n) in &c.live {
            let resource = r.name().to_ascii_lowercase();
            let labels = [
                ("cgroup", c.path.as_str()),
                ("cgroup_id", &id),
                ("resource", &resource),
            ];
            out.sample("rdma_cgroup_live_resources", &labels, n);
        }
    }

    out.family(
        "rdma_intercepted_total",
        "counter",
        "Calls refused by a quota, by verb, scope and limit.",
    );
    let mut intercepted: BTreeMap<(Verb, &str, &str), u64> = BTreeMap::new();
    for i in &s.intercepted {
        let count = intercepted.entry((i.verb, &i.scope, &i.key)).or_default();
        *count = count.saturating_add(i.count);
    }
    for ((verb, scope, key), count) in intercepted {
        let labels = [("verb", verb.name()), ("scope", scope), ("key", key)];
        out.sample("rdma_intercepted_total", &labels, count);
    }

    out.family(
        "rdma_lost_events_total",
        "counter",
        "Kernel events lost because the ring buffer was full.",
    );
    out.sample("rdma_lost_events_total", &[], s.lost_events);

    out.family(
        "rdma_probe_attached",
        "gauge",
        "Whether each kernel hook is attached (1) or not (0).",
    );
    for a in &s.attach {
        let labels = [("hook", a.hook.as_str()), ("kind", a.kind.as_str())];
        out.sample("rdma_probe_attached", &labels, u8::from(a.attached));
    }

    out.family(
        "rdma_port_hw_counter",
        "counter",
        "RDMA port hardware counters from sysfs, under the driver's names.",
    );
    for c in &s.hw_counters {
        let port = c.port.to_string();
        let labels = [
            ("device", c.device.as_str()),
            ("port", &port),
            ("counter", c.counter.as_str()),
        ];
        out.sample("rdma_port_hw_counter", &labels, c.total);
    }

    out.family(
        "rdma_port_hw_counters_skipped",
        "gauge",
        "Port hardware counter files the last reading could not use, by reason.",
    );
    for reason in SkipReason::LABELS {
        let n = s
            .hw_counters_skipped
            .iter()
            .filter(|k| k.reason.label() == reason)
            .count();
        out.sample("rdma_port_hw_counters_skipped", &[("reason", reason)], n);
    }

    out.family(
        "secure_rdma_auth_failures_total",
        "counter",
        "RDMA messages that failed authentication (forged, replayed or corrupted), per identity.",
    );
    for (identity, n) in s.auth_failures.iter().flatten() {
        out.sample(
            "secure_rdma_auth_failures_total",
            &[("identity", identity.as_str())],
            n,
        );
    }

    out.text
}

/// A float sample value, spelled as the format wants non-finite values.
struct Float(f64);

impl std::fmt::Display for Float {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v = self.0;
        if v.is_nan() {
            f.write_str("NaN")
        } else if v.is_infinite() {
            f.write_str(if v > 0.0 { "+Inf" } else { "-Inf" })
        } else {
            write!(f, "{v}")
        }
    }
}

#[derive(Default)]
struct Exposition {
    text: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        // `fmt::Write` for `String` never fails.
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.text.push_str(name);
        if !labels.is_empty() {
            let rendered: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let _ = write!(self.text, "{{{}}}", rendered.join(","));
        }
        let _ = writeln!(self.text, " {value}");
    }
}

/// Label values: backslash, double quote and line feed are escaped.
fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Help text: backslash and line feed are escaped (quotes are not).
fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
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
        let text = render_prometheus(&example());
        let lines = lines(&text);
        for expected in [
            "# HELP rdma_live_resources Live RDMA resources, system-wide.",
            "# TYPE rdma_live_resources gauge",
            "rdma_live_resources{resource=\"qp\"} 3",
            "rdma_live_resources{resource=\"mr\"} 1",
            "rdma_mr_bytes 4096",
            "rdma_limit{scope=\"global\",key=\"QP_COUNT\"} 4",
            "rdma_limit{scope=\"alice\",key=\"QP_COUNT\"} 2",
            "# TYPE rdma_verb_calls_total counter",
            "rdma_verb_calls_total{verb=\"QP_CREATE\"} 5",
            "rdma_verb_calls_total{verb=\"CM_SEND_REQ\"} 0",
            "rdma_verb_calls_per_second{verb=\"QP_CREATE\"} 1.5",
            "rdma_verb_calls_per_second{verb=\"GID_QUERY\"} 0",
            "rdma_intercepted_total{verb=\"QP_CREATE\",scope=\"alice\",key=\"QP_COUNT\"} 5",
            "rdma_intercepted_total{verb=\"MR_REG\",scope=\"bob\",key=\"MR_REG\"} 4",
            "# TYPE rdma_lost_events_total counter",
            "rdma_lost_events_total 3",
            "rdma_probe_attached{hook=\"ib_create_qp\",kind=\"kprobe\"} 1",
            "rdma_probe_attached{hook=\"ib_uverbs_reg_mr\",kind=\"kprobe\"} 0",
            "# TYPE rdma_port_hw_counter counter",
            "rdma_port_hw_counter{device=\"rxe-a\",port=\"1\",counter=\"out_of_seq_request\"} 1",
            "rdma_port_hw_counter{device=\"rxe-a\",port=\"1\",counter=\"duplicate_request\"} 5",
            "rdma_port_hw_counter{device=\"mlx5_0\",port=\"1\",counter=\"packet_seq_err\"} 9",
            "rdma_port_hw_counter{device=\"mlx5_0\",port=\"1\",counter=\"out_of_sequence\"} 0",
            "# TYPE rdma_port_hw_counters_skipped gauge",
            "rdma_port_hw_counters_skipped{reason=\"unreadable\"} 0",
            "rdma_port_hw_counters_skipped{reason=\"not_a_number\"} 1",
            "# TYPE secure_rdma_auth_failures_total counter",
            "secure_rdma_auth_failures_total{identity=\"alice\"} 2",
        ] {
            assert!(lines.contains(&expected), "missing {expected:?} in\n{text}");
        }
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn escapes_quotes_backslashes_and_newlines_in_labels() {
        let text = render_prometheus(&example());
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
        for expected in [
            "rdma_port_hw_counter{device=\"we\\\"ird\\n\",port=\"2\",counter=\"rcvd_pkts\"} 1",
            "secure_rdma_auth_failures_total{identity=\"b\\\"o\\\\b\\n\"} 1",
        ] {
            assert!(
                lines(&text).contains(&expected),
                "missing {expected:?} in\n{text}"
            );
        }
        // A raw newline inside a label would split a sample over two lines.
        assert!(lines(&text).iter().all(|l| l.starts_with('#')
            || l.starts_with("rdma_")
            || l.starts_with("secure_rdma_")));
    }

    #[test]
    fn every_family_is_announced_once_and_series_are_unique() {
        let mut snapshot = example();
        let again = snapshot.intercepted[0].clone();
        snapshot.intercepted.push(again);
        let text = render_prometheus(&snapshot);
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
        assert_eq!(types.len(), 13);
        let unique: std::collections::BTreeSet<_> = types.iter().collect();
        assert_eq!(unique.len(), types.len());
        assert!(text.lines().any(|l| l
            == "rdma_intercepted_total{verb=\"QP_CREATE\",scope=\"alice\",key=\"QP_COUNT\"} 10"));
    }

    #[test]
    fn non_finite_values_use_the_format_spelling() {
        assert_eq!(Float(f64::NAN).to_string(), "NaN");
        assert_eq!(Float(f64::INFINITY).to_string(), "+Inf");
        assert_eq!(Float(f64::NEG_INFINITY).to_string(), "-Inf");
        assert_eq!(Float(0.25).to_string(), "0.25");
        assert_eq!(escape_help("a\\b\nc\""), "a\\\\b\\nc\"");
    }
}
