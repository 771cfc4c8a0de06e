//! `monitor-probe`: starts the RDMA control-path monitor, prints its attach report, then one
//! JSON line per event, a counters snapshot on SIGUSR1, and final counters on exit (after
//! `--seconds`, SIGINT or SIGTERM). A test driver for the VM, not the `rdma-monitor` CLI.
//!
//! ```text
//! monitor-probe [--seconds N] [--no-events] [--quiet]
//! ```
//! Output: JSON lines on stdout, `{"type":"attach",...}`, `{"type":"event",...}`,
//! `{"type":"counters",...}`; "monitor-probe: ready" on stderr once attached.

use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdma_monitor::monitor::{Monitor, MonitorOptions};
use serde_json::{json, Map, Value};

static STOP: AtomicBool = AtomicBool::new(false);
static SNAPSHOT: AtomicBool = AtomicBool::new(false);

extern "C" fn on_stop(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

extern "C" fn on_usr1(_: libc::c_int) {
    SNAPSHOT.store(true, Ordering::Relaxed);
}

fn counters_json(m: &Monitor, label: &str) -> Value {
    let c = match m.counters() {
        Ok(c) => c,
        Err(e) => return json!({"type": "error", "error": e.to_string()}),
    };
    let d = m.diagnostics().unwrap_or_default();
    let by_name = |it: &mut dyn Iterator<Item = (String, Value)>| -> Value {
        Value::Object(it.collect::<Map<String, Value>>())
    };
    let mut cgroups = Map::new();
    for (id, cg) in &c.per_cgroup {
        let root = std::path::Path::new(rdma_quota::cgroup::CGROUP_ROOT);
        let path = rdma_quota::cgroup::path_of_id(root, *id).unwrap_or_default();
        cgroups.insert(
            id.to_string(),
            json!({
                "path": path,
                "ops": by_name(&mut cg.ops.iter().map(|(v, n)| (v.to_string(), json!(n)))),
                "live": by_name(&mut cg.live.iter().map(|(r, n)| (r.to_string(), json!(n)))),
            }),
        );
    }
    json!({
        "type": "counters",
        "label": label,
        "live": by_name(&mut c.live.iter().map(|(r, n)| (r.to_string(), json!(n)))),
        "mr_bytes": c.mr_bytes,
        "totals": by_name(&mut c.totals.iter().filter(|(_, n)| **n > 0).map(|(v, n)| (v.to_string(), json!(n)))),
        "errors": by_name(&mut c.errors.iter().filter(|(_, n)| **n > 0).map(|(v, n)| (v.to_string(), json!(n)))),
        "per_cgroup": cgroups,
        "lost_events": c.lost_events,
        "diagnostics": {
            "untracked_destroys": d.untracked_destroys,
            "tracked_full": d.tracked_full,
            "stale_tracked": d.stale_tracked,
            "inflight_full": d.inflight_full,
            "bad_records": d.bad_records,
        },
    })
}

fn main() {
    let mut seconds: Option<f64> = None;
    let mut events = true;
    let mut quiet = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => seconds = args.next().and_then(|s| s.parse().ok()),
            "--no-events" => events = false,
            "--quiet" => quiet = true,
            _ => {
                eprintln!("usage: monitor-probe [--seconds N] [--no-events] [--quiet]");
                std::process::exit(2);
            }
        }
    }

    let t0 = Instant::now();
    let mut monitor = match Monitor::start(MonitorOptions {
        events,
        ..MonitorOptions::default()
    }) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("monitor-probe: {e}");
            std::process::exit(1);
        }
    };
    let started = t0.elapsed();
    for r in monitor.attach_report() {
        println!(
            "{}",
            json!({"type": "attach", "hook": r.hook, "kind": r.kind, "attached": r.attached, "reason": r.reason})
        );
    }
    println!(
        "{}",
        json!({"type": "start", "btf": monitor.btf_source(), "start_ms": started.as_secs_f64() * 1e3})
    );

    // SAFETY: async-signal-safe handlers that only store atomics.
    unsafe {
        let stop: extern "C" fn(libc::c_int) = on_stop;
        let usr1: extern "C" fn(libc::c_int) = on_usr1;
        libc::signal(libc::SIGINT, stop as libc::sighandler_t);
        libc::signal(libc::SIGTERM, stop as libc::sighandler_t);
        libc::signal(libc::SIGUSR1, usr1 as libc::sighandler_t);
    }
    eprintln!("monitor-probe: ready");

    let deadline = seconds.map(|s| Instant::now() + Duration::from_secs_f64(s));
    let mut n_events = 0u64;
    // One write per batch, not per line: stdout may be a slow 9p file in the VM.
    let mut out = BufWriter::new(std::io::stdout().lock());
    let print = |out: &mut BufWriter<_>, e: &rdma_monitor::monitor::Event| {
        let _ = writeln!(
            out,
            "{}",
            json!({
                "type": "event", "ktime_ns": e.ktime_ns, "pid": e.pid, "comm": e.comm,
                "cgroup_id": e.cgroup_id, "verb": e.verb.to_string(), "device": e.device,
                "result": e.result, "latency_ns": e.latency_ns,
            })
        );
    };
    let debug = std::env::var_os("MONITOR_PROBE_DEBUG").is_some();
    let mut last_beat = Instant::now();
    let mut iterations = 0u64;
    loop {
        iterations += 1;
        for e in monitor.poll_events(Duration::from_millis(100)) {
            n_events += 1;
            if !quiet {
                print(&mut out, &e);
            }
        }
        let _ = out.flush();
        if debug && last_beat.elapsed() >= Duration::from_secs(1) {
            eprintln!("monitor-probe: {iterations} iterations, {n_events} events");
            last_beat = Instant::now();
        }
        if SNAPSHOT.swap(false, Ordering::Relaxed) {
            let _ = writeln!(out, "{}", counters_json(&monitor, "snapshot"));
            let _ = out.flush();
        }
        if STOP.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }
    let mut late = 0u64;
    for e in monitor.drain_events() {
        n_events += 1;
        late += 1;
        if !quiet {
            print(&mut out, &e);
        }
    }
    if debug {
        eprintln!("monitor-probe: {late} events drained after the loop");
    }
    let mut last = counters_json(&monitor, "final");
    last["events_read"] = json!(n_events);
    let _ = writeln!(out, "{last}");
    let _ = out.flush();
}
