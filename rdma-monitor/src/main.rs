//! `rdma-monitor`: eBPF telemetry of the RDMA control path, with enforced
//! thresholds. Argument parsing and wiring only; the work is in the
//! `rdma_monitor` library (`monitor`, `report`, `hw_counters`), `rdma_collector`
//! and `rdma_quota`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Parser;
use rdma_cli::logging::{self, LogFormat};
use rdma_collector::Collector;
use rdma_monitor::detect::{Detector, DetectorConfig, Tenant, TenantKind, Transition};
use rdma_monitor::enforce::{KernelLimit, KernelLimits, SetLimit};
use rdma_monitor::hw_counters::{self, PortCounterReader};
use rdma_monitor::monitor::{Monitor, MonitorOptions};
use rdma_monitor::report::{self, AttachReport, Sampler, Snapshot, TextOptions};
use rdma_quota::tenant::TenantBy;
use rdma_quota::wire::DEFAULT_SOCKET;
use rdma_quota::{LimitSetting, QuotaConfig, Quotas};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Watch every process's RDMA control path (QP/PD/CQ/MR create, modify and
/// destroy, GID queries, RDMA CM connection requests) with eBPF: system-wide
/// live resources, calls per verb and per cgroup, calls per second.
///
/// Prints a timestamped report every interval (text, or one JSON object per
/// line with --json) and serves Prometheus metrics with --metrics. Reports also
/// carry every RDMA port's hardware counters from sysfs (totals and growth per
/// interval; out-of-sequence and duplicate requests are how packet injection
/// and PSN guessing show), with or without eBPF. Thresholds
/// come from --quota FILE ("QP_COUNT 1000", "MR_REG 200", "tenant alice QP_COUNT 4";
/// 0 disables; '#' comments) and --limit. They are enforced on programs run
/// with LD_PRELOAD=librdma_intercept.so through the collector socket
/// (--collector); refusals are marked INTERCEPTED. Use the kernel's rdma
/// cgroup (rdma.max) for limits no program can get around, and
/// --kernel-limit for a creation rate no program can get around.
///
/// Needs root (or CAP_BPF and CAP_PERFMON), a kernel with BPF, BTF and
/// kprobes. Ctrl-C stops it with a final summary.
#[derive(Parser, Debug)]
#[command(version, name = "rdma-monitor", after_help = EXIT_CODES)]
struct Args {
    /// Seconds between reports.
    // No short letter: -i is rdma-capture's interface, and one letter means one thing across
    // the project's tools.
    #[arg(long, value_name = "SECONDS", default_value = "1", value_parser = parse_interval)]
    interval: Duration,
    /// Quota file (the same format and flag name as rdma-collector's and secure-server's).
    #[arg(long, value_name = "FILE")]
    quota: Option<PathBuf>,
    /// One threshold, KEY=VALUE or tenant:NAME:KEY=VALUE; repeatable; wins over --quota.
    #[arg(long = "limit", value_name = "KEY=VALUE")]
    limits: Vec<LimitSetting>,
    /// One JSON object per interval instead of text.
    #[arg(long)]
    json: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
    /// Run the admission collector for LD_PRELOAD=librdma_intercept.so on this socket.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = DEFAULT_SOCKET)]
    collector: Option<PathBuf>,
    /// What a collector tenant is: the program's user name or its whole cgroup v2 path.
    #[arg(long, value_name = "KIND", default_value_t = TenantBy::User,
          value_parser = PossibleValuesParser::new(["user", "cgroup"]).map(tenant_by))]
    tenant_by: TenantBy,
    /// Also print every call as it happens (pid, comm, cgroup, verb, device, result, latency).
    #[arg(long)]
    events: bool,
    /// Stop after this many reports.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Run without eBPF (collector, thresholds and port hardware counters only), e.g. without root.
    #[arg(long, conflicts_with = "events")]
    no_ebpf: bool,
    /// List every port hardware counter in text reports, not only those that changed.
    #[arg(long)]
    all_hw_counters: bool,
    /// Read port hardware counters below DIR (laid out like /sys/class/infiniband).
    #[arg(long, value_name = "DIR", default_value = hw_counters::SYSFS_ROOT)]
    hw_counters_root: PathBuf,
    /// Flag noisy tenants: any process, cgroup or user (see --flag-by) whose control-verb calls
    /// (create, modify, destroy, register, query) stay at or above this many per second for
    /// --flag-window. A flood is reported once when it starts and once when it ends, as a
    /// `noisy tenant started|ended: ...` line (JSON: a `{"noisy_tenant": ...}` object), in
    /// every report while it lasts, and as `rdma_noisy_tenant` metrics. Off unless given: what
    /// is noisy depends on the workload (a secure-server connection makes a few dozen calls;
    /// the floods that slowed its setup 2.5x made thousands per second). Needs eBPF.
    #[arg(long, value_name = "CALLS_PER_S", value_parser = parse_flag_rate, conflicts_with = "no_ebpf")]
    flag_rate: Option<f64>,
    /// How long a tenant's rate must stay above --flag-rate to be flagged, and below it for the
    /// flag to be lifted (seconds). The decision comes within about 0.1 s of the window's end.
    #[arg(long, value_name = "SECONDS", default_value = "2", value_parser = parse_flag_window)]
    flag_window: Duration,
    /// What --flag-rate judges, comma-separated: `cgroup` (the kernel's per-cgroup counts,
    /// no extra cost), `process` and `user` (these turn on the per-call event stream, which
    /// costs the flooder more per call).
    #[arg(long, value_name = "KINDS", value_delimiter = ',', default_value = "cgroup",
          value_parser = PossibleValuesParser::new(["process", "cgroup", "user"]).map(tenant_kind))]
    flag_by: Vec<TenantKind>,
    /// Refuse a cgroup's RDMA object creations beyond a rate, in the kernel: CGROUP:VERB=RATE
    /// (e.g. /tenants/b:QP_CREATE=20; the cgroup as in /proc/PID/cgroup or under
    /// /sys/fs/cgroup; verbs QP_CREATE, CQ_CREATE, MR_REG, PD_ALLOC, CTX_OPEN; a burst of one
    /// second's worth). A BPF LSM program on file_ioctl answers a call over the rate with EDQUOT
    /// before the kernel does any work, whether or not the program runs under the interceptor
    /// (a private libibverbs does not get around it). It applies to the processes directly in
    /// that cgroup, while rdma-monitor runs; every report says how many calls it admitted and
    /// refused. Needs `bpf` among the kernel's LSMs (/sys/kernel/security/lsm). Repeatable.
    #[arg(
        long = "kernel-limit",
        value_name = "CGROUP:VERB=RATE",
        conflicts_with = "no_ebpf"
    )]
    kernel_limits: Vec<KernelLimit>,
    /// Log format on stderr (RUST_LOG sets the level, default info).
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t)]
    log_format: LogFormat,
}

/// The `rdma_monitor_build_info` metric.
const BUILD: report::BuildInfo = report::BuildInfo {
    exporter: "rdma_monitor",
    version: env!("CARGO_PKG_VERSION"),
};

/// What `rdma-monitor --help` says about how it exits.
const EXIT_CODES: &str = "\
Exit codes:
  0  stopped by Ctrl-C/SIGTERM or after --count reports, with the final summary printed
  1  any failure, the reason on stderr as `rdma-monitor: error: ...` (eBPF cannot load or attach:
     run as root or with CAP_BPF and CAP_PERFMON, or use --no-ebpf; a threshold file that does
     not parse; --metrics or --collector address in use; stopped before the first --count report)
  2  usage: an unknown flag or a bad value (clap's error)";

fn parse_interval(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.05..=86_400.0).contains(&secs) {
        return Err(format!("{s} is out of range (0.05 to 86400 seconds)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

fn parse_flag_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(rate.is_finite() && rate > 0.0) {
        return Err(format!("{s} must be a positive number of calls per second"));
    }
    Ok(rate)
}

fn parse_flag_window(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if !(0.1..=3600.0).contains(&secs) {
        return Err(format!("{s} is out of range (0.1 to 3600 seconds)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// `--flag-by`: the parser lets only the listed values through.
fn tenant_kind(kind: String) -> TenantKind {
    kind.parse().unwrap_or(TenantKind::Cgroup)
}

/// `--tenant-by`: the parser lets only the listed values through (and lists them in --help,
/// which a fallible conversion would hide).
fn tenant_by(kind: String) -> TenantBy {
    match kind.as_str() {
        "cgroup" => TenantBy::Cgroup,
        _ => TenantBy::User,
    }
}

fn main() {
    // The hidden `--generate-docs DIR`: man pages and completions for the package.
    rdma_cli::docs::generate_if_asked(<Args as clap::CommandFactory>::command);
    let args = Args::parse();
    logging::init(args.log_format, "info");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let result = runtime
        .context("starting the async runtime")
        .and_then(|rt| rt.block_on(run(args)));
    if let Err(e) = result {
        eprintln!("rdma-monitor: error: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<()> {
    let mut config = match &args.quota {
        Some(path) => QuotaConfig::load(path)?,
        None => QuotaConfig::default(),
    };
    for setting in &args.limits {
        config.apply(setting);
    }
    let quotas = Quotas::new(config.clone());

    let mut monitor = if args.no_ebpf {
        None
    } else {
        // Per-process and per-user counts come from the per-call events; the kernel counts per
        // cgroup only.
        let need_events = args.flag_rate.is_some()
            && args
                .flag_by
                .iter()
                .any(|k| matches!(k, TenantKind::Process | TenantKind::User));
        let options = MonitorOptions {
            events: args.events || need_events,
            ..MonitorOptions::default()
        };
        Some(Monitor::start(options)?)
    };
    let attach: Vec<AttachReport> = monitor
        .as_ref()
        .map(|m| m.attach_report().to_vec())
        .unwrap_or_default();
    if let Some(m) = &monitor {
        let attached = attach.iter().filter(|a| a.attached).count();
        eprintln!(
            "rdma-monitor: {attached} of {} hooks attached",
            attach.len()
        );
        for a in attach.iter().filter(|a| !a.attached) {
            let why = a.reason.as_deref().unwrap_or("unknown reason");
            eprintln!("rdma-monitor: not attached: {} ({}): {why}", a.hook, a.kind);
        }
        for verb in m.uncovered_verbs() {
            eprintln!("rdma-monitor: warning: no hook observes {verb} on this kernel");
        }
    }

    let mut kernel = if args.kernel_limits.is_empty() {
        None
    } else {
        let mut k =
            KernelLimits::start(Path::new("/sys/kernel/btf")).context("starting --kernel-limit")?;
        let mut set = Vec::with_capacity(args.kernel_limits.len());
        for limit in &args.kernel_limits {
            set.push((
                limit.clone(),
                k.set(limit)
                    .with_context(|| format!("--kernel-limit {}", limit.cgroup))?,
            ));
            eprintln!(
                "rdma-monitor: kernel limit: {} {}/s for {}",
                limit.verb,
                limit.per_second,
                limit.cgroup_dir().display()
            );
        }
        Some((k, set))
    };

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    if let Some(path) = &args.collector {
        let collector = Collector::bind(path, quotas.clone(), args.tenant_by)?;
        eprintln!("rdma-monitor: collector listening on {}", path.display());
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = collector
                .run(async move { while stop.changed().await.is_ok() && !*stop.borrow() {} })
                .await
            {
                tracing::error!(error = %e, "collector stopped");
            }
        }));
    }
    let mut detection = args.flag_rate.map(|rate| {
        Detection::new(
            DetectorConfig::new(rate, args.flag_window),
            args.flag_by.clone(),
        )
    });
    let metrics = match args.metrics {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} for --metrics"))?;
            // Until the first interval ends, a scrape finds the build info alone.
            let (tx, rx) = watch::channel(report::render_exposition(None, &BUILD, |r| {
                if let Some(d) = &detection {
                    r.register_collector(Box::new(d.detector.metrics()));
                }
            }));
            eprintln!(
                "rdma-monitor: metrics at http://{}/metrics",
                listener.local_addr()?
            );
            tasks.push(tokio::spawn(report::serve_metrics(listener, rx)));
            Some(tx)
        }
        None => None,
    };

    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sampler = Sampler::new(Some(config))
        .with_hw_counters(Some(PortCounterReader::at(&args.hw_counters_root)));
    let text = TextOptions {
        all_hw_counters: args.all_hw_counters,
    };
    let started = Instant::now();
    // The first sample is the baseline of the first interval's rates.
    let mut take = |monitor: &Option<Monitor>| -> Result<Snapshot> {
        let kernel = monitor.as_ref().map(Monitor::counters).transpose()?;
        Ok(sampler.sample(
            Instant::now(),
            SystemTime::now(),
            kernel.as_ref(),
            Some(&quotas.snapshot()),
            &attach,
        ))
    };
    take(&monitor)?;
    let mut ticker =
        tokio::time::interval_at(tokio::time::Instant::now() + args.interval, args.interval);
    let mut reports = 0u64;
    // Decisions are made at these observations: the window's end is reported within one.
    let mut detect_ticker = tokio::time::interval(DETECT_PERIOD);
    detect_ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let snapshot = take(&monitor)?;
                emit(&snapshot, args.json, &text, false, detection.as_ref(), started.elapsed());
                emit_kernel_limits(&mut kernel, args.json)?;
                if let Some(tx) = &metrics {
                    tx.send_replace(report::render_exposition(Some(&snapshot), &BUILD, |r| {
                        if let Some(d) = &detection {
                            r.register_collector(Box::new(d.detector.metrics()));
                        }
                    }));
                }
                reports += 1;
                if args.count.is_some_and(|n| reports >= n) {
                    break;
                }
            }
            _ = detect_ticker.tick(), if detection.is_some() => {
                if let (Some(d), Some(m)) = (detection.as_mut(), monitor.as_ref()) {
                    let kernel = m.counters()?;
                    let now = started.elapsed();
                    for t in d.observe(now, &kernel) {
                        print_transition(&t, d.detector.config(), args.json);
                    }
                }
            }
            events = next_events(&mut monitor) => {
                for e in events? {
                    if let Some(d) = detection.as_mut() {
                        d.count_event(&e);
                    }
                    if !args.events {
                        continue;
                    }
                    if args.json {
                        println!("{}", serde_json::json!({
                            "event": {
                                "pid": e.pid, "comm": e.comm, "cgroup_id": e.cgroup_id,
                                "verb": e.verb.name(), "device": e.device,
                                "result": e.result, "latency_ns": e.latency_ns,
                            }
                        }));
                    } else {
                        println!(
                            "event pid={} comm={} cgroup={} {} device={} result={} latency={}us",
                            e.pid, e.comm, e.cgroup_id, e.verb, e.device, e.result, e.latency_ns / 1000
                        );
                    }
                }
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    let _ = stop_tx.send(true);
    let mut last = take(&monitor)?;
    // The final report covers the whole run.
    last.interval = started.elapsed();
    emit(
        &last,
        args.json,
        &text,
        true,
        detection.as_ref(),
        started.elapsed(),
    );
    emit_kernel_limits(&mut kernel, args.json)?;
    for task in tasks {
        task.abort();
    }
    drop(monitor);
    if reports == 0 && args.count.is_some() {
        bail!("stopped before the first report");
    }
    Ok(())
}

/// Events from the monitor, or never when there is no monitor or events are off.
async fn next_events(monitor: &mut Option<Monitor>) -> Result<Vec<rdma_monitor::monitor::Event>> {
    match monitor {
        Some(m) => Ok(m.next_events().await?),
        None => std::future::pending().await,
    }
}

fn emit(
    snapshot: &Snapshot,
    json: bool,
    text: &TextOptions,
    last: bool,
    detection: Option<&Detection>,
    now: Duration,
) {
    if json {
        let mut v = report::render_json(snapshot);
        if let Some(d) = detection {
            v["noisy_tenants"] = d.detector.flagged_json(now);
        }
        if last {
            v["final"] = serde_json::Value::Bool(true);
        }
        println!("{v}");
    } else {
        if last {
            println!("=== rdma-monitor final summary ===");
        }
        print!("{}", report::render_text_with(snapshot, text));
        if let Some(d) = detection {
            print!("{}", d.detector.flagged_text(now));
        }
        println!();
    }
}

/// One line per --kernel-limit (text), or one `{"kernel_limits": [...]}` object (JSON): what
/// the kernel admitted and refused under it so far.
fn emit_kernel_limits(
    kernel: &mut Option<(KernelLimits, Vec<(KernelLimit, SetLimit)>)>,
    json: bool,
) -> Result<()> {
    let Some((k, limits)) = kernel else {
        return Ok(());
    };
    let mut rows = Vec::with_capacity(limits.len());
    for (l, set) in limits.iter() {
        let c = k.counts(*set)?;
        if json {
            rows.push(serde_json::json!({
                "cgroup": l.cgroup, "verb": l.verb.name(), "per_second": l.per_second,
                "admitted": c.admitted, "refused": c.refused,
            }));
        } else {
            println!(
                "kernel limit {} {} {}/s: admitted={} refused={}",
                l.cgroup, l.verb, l.per_second, c.admitted, c.refused
            );
        }
    }
    if json {
        println!("{}", serde_json::json!({ "kernel_limits": rows }));
    }
    Ok(())
}

/// How often the detector looks at the counts (it decides only then).
const DETECT_PERIOD: Duration = Duration::from_millis(100);

/// Per-process and per-user counts idle this long are dropped (the detector has forgotten
/// them long before), so a host with many short-lived processes does not grow the maps.
const IDLE_FORGET: Duration = Duration::from_secs(60);

fn print_transition(t: &Transition, config: &DetectorConfig, json: bool) {
    tracing::warn!(
        kind = t.tenant.kind.name(),
        tenant = %t.tenant.label(),
        id = t.tenant.id,
        change = t.change.name(),
        rate = t.rate,
        "noisy tenant"
    );
    if json {
        let mut v = t.to_json(config);
        // When the decision was made, for whoever measures how late it came.
        v["noisy_tenant"]["time_unix_s"] = serde_json::json!(SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()));
        println!("{v}");
    } else {
        println!("{}", t.render_text(config));
    }
}

/// The detector and the per-process/per-user tallies that feed it.
struct Detection {
    detector: Detector,
    kinds: Vec<TenantKind>,
    /// pid -> (comm, calls, last call).
    processes: HashMap<u32, (String, u64, Instant)>,
    /// uid -> (calls, last call).
    users: HashMap<u32, (u64, Instant)>,
    /// pid -> (uid, last call); no uid when the process was gone before it could be looked up.
    uid_of: HashMap<u32, (Option<u32>, Instant)>,
    /// cgroup id -> path.
    cgroup_paths: HashMap<u64, String>,
    passwd: Option<String>,
}

impl Detection {
    fn new(config: DetectorConfig, kinds: Vec<TenantKind>) -> Detection {
        Detection {
            detector: Detector::new(config),
            kinds,
            processes: HashMap::new(),
            users: HashMap::new(),
            uid_of: HashMap::new(),
            cgroup_paths: HashMap::new(),
            passwd: std::fs::read_to_string("/etc/passwd").ok(),
        }
    }

    fn count_event(&mut self, e: &rdma_monitor::monitor::Event) {
        let now = Instant::now();
        if self.kinds.contains(&TenantKind::Process) {
            let entry = self
                .processes
                .entry(e.pid)
                .or_insert_with(|| (e.comm.clone(), 0, now));
            entry.1 += 1;
            entry.2 = now;
        }
        if self.kinds.contains(&TenantKind::User) {
            // The owner of /proc/PID is the process's effective uid; looked up once per pid.
            let seen = self.uid_of.entry(e.pid).or_insert_with(|| {
                let uid = std::fs::metadata(format!("/proc/{}", e.pid))
                    .ok()
                    .map(|m| std::os::unix::fs::MetadataExt::uid(&m));
                (uid, now)
            });
            seen.1 = now;
            if let Some(uid) = seen.0 {
                let entry = self.users.entry(uid).or_insert((0, now));
                entry.0 += 1;
                entry.1 = now;
            }
        }
    }

    fn user_name(&self, uid: u32) -> String {
        let uid = uid.to_string();
        self.passwd
            .as_deref()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let mut f = l.split(':');
                    let name = f.next()?;
                    (f.nth(1)? == uid).then(|| name.to_owned())
                })
            })
            .unwrap_or_default()
    }

    fn observe(
        &mut self,
        now: Duration,
        kernel: &rdma_monitor::monitor::KernelCounters,
    ) -> Vec<Transition> {
        let mut counts = Vec::new();
        if self.kinds.contains(&TenantKind::Cgroup) {
            for (id, c) in &kernel.per_cgroup {
                let path = self.cgroup_paths.entry(*id).or_insert_with(|| {
                    rdma_quota::cgroup::path_of_id(
                        std::path::Path::new(rdma_quota::cgroup::CGROUP_ROOT),
                        *id,
                    )
                    .unwrap_or_default()
                });
                counts.push((Tenant::cgroup(*id, path.clone()), c.ops.values().sum()));
            }
        }
        let cutoff = Instant::now().checked_sub(IDLE_FORGET);
        if let Some(cutoff) = cutoff {
            self.processes.retain(|_, p| p.2 >= cutoff);
            self.users.retain(|_, u| u.1 >= cutoff);
            self.uid_of.retain(|_, u| u.1 >= cutoff);
        }
        for (pid, (comm, n, _)) in &self.processes {
            counts.push((Tenant::process(*pid, comm.clone()), *n));
        }
        let users: Vec<(u32, u64)> = self.users.iter().map(|(u, (n, _))| (*u, *n)).collect();
        for (uid, n) in users {
            counts.push((Tenant::user(uid, self.user_name(uid)), n));
        }
        self.detector.observe(now, counts)
    }
}
