//! scripts/bench-isolation.sh's command line, on the host (no VM, no build):
//! `--help` says what it measures and how to shorten it, and a wrong
//! argument is refused before anything is built, naming the argument.

use secure_rdma_tests::scripts;

#[test]
fn help_names_the_layers_the_kinds_and_the_options() {
    scripts::help(
        "bench-isolation.sh",
        &[
            "--connections",
            "--rounds",
            "median",
            "--seconds",
            "--kinds",
            "--layers",
            "--out",
            "raw.csv",
            "table.md",
            "plot.svg",
            "intercept",
            "cgroup",
            "cpu.max",
            "--kernel-limit",
            "bypass",
            "hoard",
            "--flag-rate",
            "--flag-window",
            "exits 3",
        ],
    );
}

#[test]
fn wrong_arguments_are_refused_with_exit_code_2_and_a_reason() {
    scripts::refuses(
        "bench-isolation.sh",
        &[
            (&["--connections", "0"][..], "--connections 0"),
            (&["--seconds", "ten"][..], "--seconds ten"),
            (&["--cpu-max", "150"][..], "--cpu-max 150"),
            (&["--kinds", "qp,flood"][..], "unknown kind flood"),
            (&["--kinds", "mr:big"][..], "mr:BYTES"),
            (&["--layers", "none,ebpf"][..], "unknown layer ebpf"),
            (&["--rounds", "0"][..], "--rounds 0"),
            (&["--rounds", "many"][..], "--rounds many"),
            (&["--repeat", "3"][..], "unknown argument --repeat"),
            (&["--out"][..], "--out needs a value"),
            (&["--flag-rate", "0"][..], "--flag-rate 0"),
            (&["--flag-window", "0.05"][..], "--flag-window 0.05"),
            (&["--flag-window", "soon"][..], "--flag-window soon"),
        ],
    );
}

/// Runs the report on `rows` (raw.csv without its header) in a fresh directory: its exit
/// code, table.md and stderr.
fn report(rows: &str) -> (Option<i32>, String, String) {
    let r = scripts::report(
        "bench-isolation-report.py",
        "kind,layer,metric,value,unit",
        rows,
    );
    (r.code, r.table, r.stderr)
}

const ALONE: &str = "alone,none,setup_p50,10,ms
alone,none,setup_p99,20,ms
alone,none,send64_p99,100,us
alone,none,write64k_bw,10,MB/s
";

/// The victim's rows under an enforced churn flood and the collector's: all within the goals.
fn enforced(p50: f64, detected: f64, collector: f64) -> String {
    format!(
        "{ALONE}cq,none,setup_p50,30,ms
cq,none,setup_p99,60,ms
cq,none,write64k_bw,5,MB/s
cq,none,flood_cycles_per_s,3000,1/s
cq,none,detected_after,{detected},s
cq,intercept,setup_p50,{p50},ms
cq,intercept,setup_p99,30,ms
cq,intercept,write64k_bw,9,MB/s
cq,intercept,flood_cycles_per_s,20,1/s
cq,intercept,collector_requests,120,requests
refused,intercept-fail,collector_cpu,{collector},% of a core
refused,intercept-fail,collector_requests,400,requests
victim,monitor,victim_flagged,0,times
"
    )
}

#[test]
fn the_report_exits_0_when_every_goal_is_met_and_3_naming_each_miss() {
    let (code, table, err) = report(&enforced(12.0, 0.8, 1.5));
    assert_eq!(code, Some(0), "{err}\n{table}");
    assert!(table.contains("All judged goals met."), "{table}");
    assert!(table.contains("| 0.80 s |"), "{table}");
    assert!(
        table.contains("| 120 |"),
        "the collector's requests: {table}"
    );
    // The victim's own cgroup row and the refused flood are notes, not rows of the table.
    assert!(!table.contains("| victim |"), "{table}");

    for (rows, says) in [
        (enforced(14.0, 0.8, 1.5), "cq/intercept: miss: p50 > 1.3x"),
        (enforced(12.0, 1.4, 1.5), "cq/none: miss: detection > 1 s"),
        (
            enforced(12.0, 0.8, 22.4),
            "the collector under a refused flood: 22.4 %",
        ),
        (
            enforced(12.0, 0.8, 1.5).replace("cq,none,detected_after,0.8,s\n", ""),
            "cq/none: miss: not detected",
        ),
    ] {
        let (code, table, err) = report(&rows);
        assert_eq!(code, Some(3), "{says}: {err}\n{table}");
        assert!(table.contains(says), "{says}:\n{table}");
        assert!(err.contains("goal(s) missed"), "{says}: {err}");
    }
}

/// Three rounds of `enforced`'s rows, the given setup p50 and detection per round (`None`:
/// not flagged in that round).
fn three_rounds(p50: [f64; 3], detected: [Option<f64>; 3]) -> String {
    let mut rows = String::new();
    for (p50, detected) in p50.into_iter().zip(detected) {
        let round = enforced(p50, detected.unwrap_or(0.0), 1.5);
        // The collector's own measurement and the victim's flags come once per run.
        for line in round.lines().filter(|l| {
            !l.starts_with("refused,")
                && !l.starts_with("victim,")
                && (detected.is_some() || !l.starts_with("cq,none,detected_after"))
        }) {
            rows.push_str(line);
            rows.push('\n');
        }
    }
    rows + "refused,intercept-fail,collector_cpu,1.5,% of a core\n"
}

#[test]
fn rounds_are_judged_on_their_medians() {
    // One noisy round does not decide the verdict either way.
    let (code, table, err) = report(&three_rounds(
        [12.0, 14.0, 12.5],
        [Some(0.7), None, Some(0.9)],
    ));
    assert_eq!(code, Some(0), "{err}\n{table}");
    assert!(table.contains("median of 3 rounds"), "{table}");
    assert!(
        table.contains("| 12.5 (1.25x) |"),
        "the median p50: {table}"
    );
    // Unflagged counts as never: the median of 0.7, 0.9 and never is 0.9.
    assert!(
        table.contains("| 0.90 s (flagged in 2 of 3 rounds) |"),
        "{table}"
    );
    // Two rounds of three decide it.
    let (code, table, _) = report(&three_rounds([14.0, 12.0, 13.5], [Some(0.7), None, None]));
    assert_eq!(code, Some(3), "{table}");
    assert!(table.contains("cq/intercept: miss: p50 > 1.3x"), "{table}");
    assert!(
        table.contains("not flagged (flagged in 1 of 3 rounds)"),
        "{table}"
    );
    assert!(table.contains("cq/none: miss: not detected"), "{table}");
}

/// Three rounds of one boot (2026-11-29, `--rounds 3 --layers intercept`) in which the lab
/// slowed as the run went on: the victim alone took 51.5, 56.5 and 95.6 ms per connection at
/// the start of its three rounds, and 94.1 once more at the end.
const DRIFTING: &str = "alone,none,setup_p50,51.5,ms
alone,none,setup_p99,79.2,ms
alone,none,write64k_bw,13.44,MB/s
pd,intercept,setup_p50,54.9,ms
pd,intercept,setup_p99,111.9,ms
pd,intercept,write64k_bw,13.79,MB/s
pd,intercept,flood_cycles_per_s,20,1/s
alone,none,setup_p50,56.5,ms
alone,none,setup_p99,98.1,ms
alone,none,write64k_bw,12.83,MB/s
pd,intercept,setup_p50,110.8,ms
pd,intercept,setup_p99,256.5,ms
pd,intercept,write64k_bw,10.3,MB/s
pd,intercept,flood_cycles_per_s,20,1/s
alone,none,setup_p50,95.6,ms
alone,none,setup_p99,160.6,ms
alone,none,write64k_bw,7.98,MB/s
pd,intercept,setup_p50,88.6,ms
pd,intercept,setup_p99,186.2,ms
pd,intercept,write64k_bw,8.52,MB/s
pd,intercept,flood_cycles_per_s,20,1/s
alone-again,none,setup_p50,94.1,ms
alone-again,none,setup_p99,144.5,ms
alone-again,none,write64k_bw,8.43,MB/s
refused,intercept-fail,collector_cpu,3.5,% of a core
";

#[test]
fn each_round_is_set_against_its_own_alone_when_the_lab_drifts() {
    // The median of the flood's values (88.6 ms, from the slow third round) over the median
    // alone (56.5 ms, the second) read 1.57x, a miss; round by round the flood cost 1.07x,
    // 1.96x and 0.93x: one bad round of three.
    let (code, table, err) = report(DRIFTING);
    assert_eq!(code, Some(0), "{err}\n{table}");
    assert!(
        table.contains("| pd | intercept | 88.6 (1.07x) |"),
        "{table}"
    );
    // WRITE: 103 %, 80 % and 107 % of alone in its rounds.
    assert!(table.contains("| 10.3 (103 %) |"), "{table}");
    assert!(
        table.contains("setup p50 per round: 51.5, 56.5, 95.6 ms"),
        "the drift is shown: {table}"
    );
    // Alone again is set against the first round: the whole run's drift.
    assert!(
        table.contains("| alone-again |  | 94.1 (1.83x) |"),
        "{table}"
    );
    // A flood that costs too much in most rounds still misses.
    let worse = DRIFTING
        .replace(
            "pd,intercept,setup_p50,54.9,ms",
            "pd,intercept,setup_p50,80.0,ms",
        )
        .replace(
            "pd,intercept,setup_p50,88.6,ms",
            "pd,intercept,setup_p50,130.0,ms",
        );
    let (code, table, _) = report(&worse);
    assert_eq!(code, Some(3), "{table}");
    assert!(table.contains("pd/intercept: miss: p50 > 1.3x"), "{table}");
}
