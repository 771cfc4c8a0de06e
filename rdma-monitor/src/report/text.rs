//! The human-readable report, one block per interval.

use std::collections::BTreeMap;
use std::fmt::Write;

use rdma_quota::{Resource, Verb};

use super::snapshot::{Interception, PortCounter, Snapshot};
use super::timestamp::rfc3339;

/// What [`render_text_with`] shows beyond [`render_text`]'s defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TextOptions {
    /// List every port hardware counter with its total, not only those that moved during
    /// the interval.
    pub all_hw_counters: bool,
}

/// Renders one interval as text sections, in the layout of the original
/// rdma monitor:
///
/// ```text
/// === 2024-05-01T12:00:00Z (interval 1.0s) ===
/// Interception configuration:
///   QP_COUNT 4
/// Resource counts:
///   QP             3 (limit 4)
///   PD             1
///   CQ             2
///   MR             0
///   MR bytes       0
/// Per-cgroup statistics:
///   /system.slice/x (id 1234): QP_CREATE 3, MR_REG 1; live QP 3
/// Operation frequency:
///   QP_CREATE         2.00/s (total 5)  INTERCEPTED 1 (global: QP_COUNT limit 4)
///   ...
/// Port hardware counters (changed in this interval):
///   rxe-a/1 out_of_seq_request           +1 (total 1)  SECURITY
///   rxe-a/1 rcvd_pkts                   +12 (total 4711)
/// Authentication failures (RDMA messages, per identity):
///   alice 1
/// Lost events: 0
/// ```
///
/// Every verb gets a frequency line, so that intervals line up. Hardware
/// counters are listed only when they moved during the interval, the
/// [security-relevant](crate::hw_counters::SECURITY_COUNTERS) ones first and
/// marked `SECURITY` ([`render_text_with`] lists them all); counter files that
/// could not be read are listed with the reason. Authentication failures get a
/// section only when the snapshot's builder counts them, attach failures only
/// when there are any.
pub fn render_text(snapshot: &Snapshot) -> String {
    render_text_with(snapshot, &TextOptions::default())
}

/// [`render_text`] with options.
///
/// ```
/// use std::time::{Duration, SystemTime};
/// use rdma_monitor::report::{render_text_with, PortCounter, Snapshot, TextOptions};
///
/// let mut s = Snapshot::new(SystemTime::UNIX_EPOCH, Duration::from_secs(1));
/// s.hw_counters.push(PortCounter {
///     device: "rxe-a".into(), port: 1, counter: "rcvd_pkts".into(), total: 7, delta: Some(0),
/// });
/// let all = render_text_with(&s, &TextOptions { all_hw_counters: true });
/// assert!(all.contains("  rxe-a/1 rcvd_pkts                    +0 (total 7)\n"));
/// ```
pub fn render_text_with(snapshot: &Snapshot, options: &TextOptions) -> String {
    let mut out = String::new();
    // `fmt::Write` for `String` never fails.
    let _ = write_report(&mut out, snapshot, options);
    out
}

fn write_report(out: &mut String, s: &Snapshot, options: &TextOptions) -> std::fmt::Result {
    writeln!(
        out,
        "=== {} (interval {:.1}s) ===",
        rfc3339(s.time),
        s.interval.as_secs_f64()
    )?;

    writeln!(out, "Interception configuration:")?;
    match s.config.as_ref().filter(|c| !c.is_empty()) {
        None => writeln!(out, "  none")?,
        Some(config) => {
            for entry in config.entries() {
                writeln!(out, "  {entry}")?;
            }
        }
    }

    writeln!(out, "Resource counts:")?;
    let global = s.config.as_ref().map(|c| &c.global);
    for resource in Resource::ALL {
        let live = s.live.get(&resource).copied().unwrap_or(0);
        let limit = global.and_then(|g| g.count(resource));
        writeln!(
            out,
            "  {:<10} {live:>4}{}",
            resource.name(),
            limit_note(limit)
        )?;
    }
    let limit = global.and_then(|g| g.mr_bytes());
    writeln!(
        out,
        "  {:<10} {:>4}{}",
        "MR bytes",
        s.mr_bytes,
        limit_note(limit)
    )?;

    writeln!(out, "Per-cgroup statistics:")?;
    if s.cgroups.is_empty() {
        writeln!(out, "  none")?;
    }
    for cgroup in &s.cgroups {
        let path = if cgroup.path.is_empty() {
            "(unknown cgroup)".to_owned()
        } else {
            printable(&cgroup.path)
        };
        let ops = joined(cgroup.ops.iter().filter(|(_, n)| **n != 0));
        let live = joined(cgroup.live.iter().filter(|(_, n)| **n != 0));
        let ops = if ops.is_empty() { "no calls" } else { &ops };
        write!(out, "  {path} (id {}): {ops}", cgroup.id)?;
        if !live.is_empty() {
            write!(out, "; live {live}")?;
        }
        writeln!(out)?;
    }

    writeln!(out, "Operation frequency:")?;
    let mut recent: BTreeMap<Verb, Vec<&Interception>> = BTreeMap::new();
    for i in s.intercepted.iter().filter(|i| i.in_interval > 0) {
        recent.entry(i.verb).or_default().push(i);
    }
    for verb in Verb::ALL {
        let rate = s.rates.get(&verb).copied().unwrap_or(0.0);
        let total = s.totals.get(&verb).copied().unwrap_or(0);
        write!(out, "  {:<12} {rate:>10.2}/s (total {total})", verb.name())?;
        if let Some(hits) = recent.get(&verb) {
            let count: u64 = hits.iter().map(|i| i.in_interval).sum();
            let why: Vec<String> = hits
                .iter()
                .map(|i| format!("{}: {} limit {}", i.scope, i.key, i.limit))
                .collect();
            write!(out, "  INTERCEPTED {count} ({})", why.join("; "))?;
        }
        writeln!(out)?;
    }

    write_hw_counters(out, s, options)?;

    if let Some(failures) = &s.auth_failures {
        writeln!(
            out,
            "Authentication failures (RDMA messages, per identity):"
        )?;
        if failures.is_empty() {
            writeln!(out, "  none")?;
        }
        for (identity, count) in failures {
            writeln!(out, "  {} {count}", printable(identity))?;
        }
    }

    writeln!(out, "Lost events: {}", s.lost_events)?;

    let failed: Vec<_> = s.attach.iter().filter(|a| !a.attached).collect();
    if !failed.is_empty() {
        writeln!(out, "Attach failures:")?;
        for a in failed {
            let reason = a.reason.as_deref().unwrap_or("no reason given");
            writeln!(out, "  {} {}: {reason}", a.kind, a.hook)?;
        }
    }
    Ok(())
}

fn write_hw_counters(out: &mut String, s: &Snapshot, options: &TextOptions) -> std::fmt::Result {
    let shown: Vec<&PortCounter> = if options.all_hw_counters {
        writeln!(out, "Port hardware counters:")?;
        s.hw_counters.iter().collect()
    } else {
        writeln!(out, "Port hardware counters (changed in this interval):")?;
        s.hw_counters.iter().filter(|c| c.changed()).collect()
    };
    if shown.is_empty() {
        let ports: std::collections::BTreeSet<(&str, u32)> = s
            .hw_counters
            .iter()
            .map(|c| (c.device.as_str(), c.port))
            .collect();
        match s.hw_counters.len() {
            0 => writeln!(out, "  none")?,
            n => writeln!(out, "  no change ({n} counters on {} ports)", ports.len())?,
        }
    }
    // Security-relevant counters first; the order within each group is the snapshot's.
    let (security, other): (Vec<&PortCounter>, Vec<&PortCounter>) =
        shown.into_iter().partition(|c| c.is_security_relevant());
    for c in security.into_iter().chain(other) {
        let delta = c
            .delta
            .map_or_else(|| "new".to_owned(), |d| format!("+{d}"));
        let name = format!(
            "{}/{} {}",
            printable(&c.device),
            c.port,
            printable(&c.counter)
        );
        write!(out, "  {name:<30} {delta:>8} (total {})", c.total)?;
        if c.is_security_relevant() {
            write!(out, "  SECURITY")?;
        }
        writeln!(out)?;
    }
    for skipped in &s.hw_counters_skipped {
        writeln!(
            out,
            "  skipped {}: {}",
            printable(&skipped.path),
            skipped.reason
        )?;
    }
    Ok(())
}

/// Cgroup names may hold any byte but `/`; escaping control characters keeps
/// one cgroup on one line.
fn printable(path: &str) -> String {
    path.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn limit_note(limit: Option<u64>) -> String {
    limit.map_or_else(String::new, |l| format!(" (limit {l})"))
}

/// `NAME n, NAME n` for a per-cgroup map.
fn joined<K: std::fmt::Display, V: std::fmt::Display>(
    items: impl Iterator<Item = (K, V)>,
) -> String {
    items
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::test_support::example;
    use crate::report::AttachReport;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn renders_every_section() {
        let text = render_text(&example());
        let expected = "\
=== 2024-05-01T12:00:00Z (interval 2.0s) ===
Interception configuration:
  QP_COUNT 4
  MR_BYTES 1048576
  QP_CREATE 10
  tenant alice QP_COUNT 2
Resource counts:
  QP            3 (limit 4)
  PD            1
  CQ            2
  MR            1
  MR bytes   4096 (limit 1048576)
Per-cgroup statistics:
  /system.slice/\"odd\\name\"\\n.service (id 4242): QP_CREATE 3, MR_REG 1; live QP 3, MR 1
  (unknown cgroup) (id 7): no calls
Operation frequency:
  QP_CREATE          1.50/s (total 5)  INTERCEPTED 2 (alice: QP_COUNT limit 2; global: QP_CREATE limit 10)
  QP_MODIFY          0.00/s (total 0)
  QP_DESTROY         0.50/s (total 2)
  PD_ALLOC           0.00/s (total 1)
  PD_DEALLOC         0.00/s (total 0)
  CQ_CREATE          0.00/s (total 2)
  CQ_DESTROY         0.00/s (total 0)
  MR_REG             0.00/s (total 1)
  MR_DEREG           0.00/s (total 0)
  GID_QUERY          0.00/s (total 0)
  CM_SEND_REQ        0.00/s (total 0)
  CTX_OPEN           0.00/s (total 0)
Port hardware counters (changed in this interval):
  rxe-a/1 duplicate_request            +2 (total 5)  SECURITY
  rxe-a/1 out_of_seq_request           +1 (total 1)  SECURITY
  rxe-a/1 rcvd_pkts                   +12 (total 4711)
  we\"ird\\n/2 rcvd_pkts                 +1 (total 1)
  skipped rxe-a/ports/1/hw_counters/rcvd_seq_err: not a number: \"garbage\"
Authentication failures (RDMA messages, per identity):
  alice 2
  b\"o\\b\\n 1
Lost events: 3
Attach failures:
  kprobe ib_uverbs_reg_mr: symbol not found
";
        assert_eq!(text, expected);
    }

    #[test]
    fn all_hw_counters_lists_unchanged_and_new_ones_security_first() {
        let text = render_text_with(
            &example(),
            &TextOptions {
                all_hw_counters: true,
            },
        );
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Port hardware counters"))
            .take_while(|l| !l.starts_with("Authentication failures"))
            .collect();
        assert_eq!(
            section,
            [
                "Port hardware counters:",
                "  mlx5_0/1 out_of_sequence             +0 (total 0)  SECURITY",
                "  mlx5_0/1 packet_seq_err             new (total 9)  SECURITY",
                "  rxe-a/1 duplicate_request            +2 (total 5)  SECURITY",
                "  rxe-a/1 out_of_seq_request           +1 (total 1)  SECURITY",
                "  rxe-a/1 rcvd_pkts                   +12 (total 4711)",
                "  rxe-a/1 sent_pkts                    +0 (total 4700)",
                "  we\"ird\\n/2 rcvd_pkts                 +1 (total 1)",
                "  skipped rxe-a/ports/1/hw_counters/rcvd_seq_err: not a number: \"garbage\"",
            ]
        );
    }

    #[test]
    fn unchanged_hw_counters_are_summed_up_in_one_line() {
        let mut s = example();
        s.hw_counters.iter_mut().for_each(|c| c.delta = Some(0));
        s.hw_counters_skipped.clear();
        let text = render_text(&s);
        assert!(
            text.contains(
                "Port hardware counters (changed in this interval):\n  no change (7 counters on 3 ports)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn empty_snapshot_says_none_and_hides_attach_failures() {
        let mut s = Snapshot::new(UNIX_EPOCH, Duration::from_millis(500));
        s.attach.push(AttachReport {
            hook: "ib_create_qp".into(),
            kind: "kprobe".into(),
            attached: true,
            reason: None,
        });
        let text = render_text(&s);
        assert!(text.starts_with("=== 1970-01-01T00:00:00Z (interval 0.5s) ===\n"));
        assert!(text.contains("Interception configuration:\n  none\n"));
        assert!(text.contains("Per-cgroup statistics:\n  none\n"));
        assert!(text.contains("  QP            0\n"));
        assert!(text.contains("Port hardware counters (changed in this interval):\n  none\n"));
        assert!(!text.contains("Authentication failures"));
        assert!(!text.contains("INTERCEPTED"));
        assert!(!text.contains("Attach failures"));
        assert!(text.ends_with("Lost events: 0\n"));
    }
}
