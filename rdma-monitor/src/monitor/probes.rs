//! The loaded `monitor.bpf.o`: attaching its probes, reading its maps and its ring buffer.

use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::time::Duration;

use aya::maps::{HashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::{KProbe, TracePoint};
use aya::EbpfLoader;
use rdma_quota::{Resource, Verb};
use telemetry_ebpf::abi::{
    LIVE_MR_BYTES, S_INFLIGHT_FULL as STAT_INFLIGHT_FULL, S_LOST_EVENTS as STAT_LOST_EVENTS,
    S_STALE_TRACKED as STAT_STALE_TRACKED, S_TRACKED_FULL as STAT_TRACKED_FULL,
    S_UNTRACKED_DESTROY as STAT_UNTRACKED_DESTROY,
};
use telemetry_ebpf::host::{
    bpf_syscall_exists, kprobes_supported, loaded_modules, privileged, raise_memlock, tracefs_has,
};
use telemetry_ebpf::loader::{error_chain, LoadOnce};
use telemetry_ebpf::objects::MONITOR as BPF_OBJECT;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::event::{parse_event, Event};
use super::hooks::{self, Probe, HOOKS};
use super::{AttachReport, KernelCounters, MonitorDiagnostics};

/// The most events [`Monitor::drain_events`] (and so [`Monitor::next_events`] and
/// [`Monitor::poll_events`]) returns at once.
pub const MAX_EVENT_BATCH: usize = 4096;

/// What [`Monitor::start`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MonitorOptions {
    /// Send one [`Event`] per call through the ring buffer. With `false` only the counters are
    /// kept (cheapest: no ring-buffer traffic).
    pub events: bool,
    /// Ring-buffer size in bytes: a power of two and a multiple of the page size (each event
    /// takes 128 bytes of it). Default 1 MiB.
    pub ring_buffer_bytes: u32,
    /// Where the kernel BTF lives (default `/sys/kernel/btf`).
    pub btf_dir: PathBuf,
}

impl Default for MonitorOptions {
    fn default() -> Self {
        Self {
            events: true,
            ring_buffer_bytes: 1 << 20,
            btf_dir: PathBuf::from("/sys/kernel/btf"),
        }
    }
}

/// Why the monitor could not start or read its maps.
#[derive(Debug, thiserror::Error)]
pub enum MonitorError {
    /// The crate was compiled without clang, so `monitor.bpf.o` is empty.
    #[error("built without its BPF object (clang missing at build time): rebuild telemetry-ebpf with clang and bpftool installed")]
    NoBpfObject,
    /// Not enough privileges to load and attach kprobe programs.
    #[error("needs root or CAP_BPF+CAP_PERFMON (or CAP_SYS_ADMIN) to load kprobe programs")]
    NotPrivileged,
    /// The `bpf()` system call does not exist.
    #[error("the kernel has no BPF support (bpf() returned ENOSYS: CONFIG_BPF_SYSCALL=n)")]
    NoBpf,
    /// No kprobe PMU.
    #[error("kprobes are not supported by this kernel (CONFIG_KPROBES=n: no /sys/bus/event_source/devices/kprobe)")]
    NoKprobes,
    /// No kernel BTF, so CO-RE relocation is impossible.
    #[error("kernel BTF is missing ({0}: CONFIG_DEBUG_INFO_BTF=n)")]
    NoKernelBtf(String),
    /// aya failed to load the object (maps, relocation).
    #[error("loading monitor.bpf.o failed: {0}")]
    Load(#[from] aya::EbpfError),
    /// A map expected in the object is missing or has the wrong type.
    #[error("BPF map {name}: {source}")]
    Map {
        /// Map name.
        name: &'static str,
        /// aya's error.
        #[source]
        source: aya::maps::MapError,
    },
    /// No hook attached; `summary` names the reasons.
    #[error("no RDMA hook could be attached: {summary}")]
    NothingAttached {
        /// One line per reason.
        summary: String,
        /// Every hook's outcome.
        report: Vec<AttachReport>,
    },
}

/// Key of the per-cgroup hash maps (`struct cg_key`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct CgKey {
    cgroup_id: u64,
    id: u32,
    pad: u32,
}

// SAFETY: plain-old-data with no padding (8 + 4 + 4 bytes), matching `struct cg_key`.
unsafe impl aya::Pod for CgKey {}

/// A running monitor. Dropping it detaches every probe.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use rdma_monitor::monitor::{Monitor, MonitorOptions};
///
/// let mut monitor = Monitor::start(MonitorOptions::default())?;
/// for hook in monitor.attach_report() {
///     println!("{} {} attached={} {:?}", hook.hook, hook.kind, hook.attached, hook.reason);
/// }
/// for event in monitor.poll_events(Duration::from_secs(1)) {
///     println!("{} {} {} {}", event.pid, event.verb, event.device, event.result);
/// }
/// println!("{:?}", monitor.counters()?.live);
/// # Ok::<(), rdma_monitor::monitor::MonitorError>(())
/// ```
pub struct Monitor {
    // Declared before `ring` so it is deregistered before the ring's fd is closed.
    async_fd: Option<AsyncFd<RawFd>>,
    ring: RingBuf<MapData>,
    live: PerCpuArray<MapData, i64>,
    totals: PerCpuArray<MapData, u64>,
    errors: PerCpuArray<MapData, u64>,
    stats: PerCpuArray<MapData, u64>,
    cg_ops: HashMap<MapData, CgKey, u64>,
    cg_live: HashMap<MapData, CgKey, i64>,
    report: Vec<AttachReport>,
    btf_source: String,
    bad_records: u64,
    // Owns the programs and their links; last so maps are taken out of it first.
    _bpf: aya::Ebpf,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("report", &self.report)
            .field("btf_source", &self.btf_source)
            .finish_non_exhaustive()
    }
}

fn map<T>(
    bpf: &mut aya::Ebpf,
    name: &'static str,
    conv: impl FnOnce(aya::maps::Map) -> Result<T, aya::maps::MapError>,
) -> Result<T, MonitorError> {
    let m = bpf.take_map(name).ok_or(MonitorError::Map {
        name,
        source: aya::maps::MapError::InvalidName {
            name: name.to_owned(),
        },
    })?;
    conv(m).map_err(|source| MonitorError::Map { name, source })
}

/// Loads programs once; remembers load failures.
struct Loader(LoadOnce);

impl Loader {
    fn kprobe<'a>(
        &mut self,
        bpf: &'a mut aya::Ebpf,
        name: &'static str,
    ) -> Result<&'a mut KProbe, String> {
        self.0.program(bpf, name, KProbe::load)
    }

    fn tracepoint<'a>(
        &mut self,
        bpf: &'a mut aya::Ebpf,
        name: &'static str,
    ) -> Result<&'a mut TracePoint, String> {
        self.0.program(bpf, name, TracePoint::load)
    }
}

/// Attaches a kretprobe + kprobe pair to `symbol` (return first, so a call already in progress
/// is never half-seen); on failure nothing stays attached.
fn attach_pair(
    bpf: &mut aya::Ebpf,
    loader: &mut Loader,
    enter: &'static str,
    exit: &'static str,
    symbol: &str,
) -> Result<(), String> {
    let exit_link = {
        let p = loader.kprobe(bpf, exit)?;
        p.attach(symbol, 0)
            .map_err(|e| format!("kretprobe: {}", error_chain(&e)))?
    };
    let entered = loader.kprobe(bpf, enter).and_then(|p| {
        p.attach(symbol, 0)
            .map(|_| ())
            .map_err(|e| format!("kprobe: {}", error_chain(&e)))
    });
    if let Err(e) = entered {
        if let Ok(p) = loader.kprobe(bpf, exit) {
            let _ = p.detach(exit_link);
        }
        return Err(e);
    }
    Ok(())
}

impl Monitor {
    /// Loads `monitor.bpf.o` and attaches every hook whose target exists on the running kernel.
    ///
    /// Fails when the binary was built without the object, without privileges, on a kernel
    /// without BPF, kprobes or BTF, or when no hook at all could be attached. Otherwise the
    /// outcome of each hook is in [`Monitor::attach_report`].
    pub fn start(options: MonitorOptions) -> Result<Monitor, MonitorError> {
        if BPF_OBJECT.is_empty() {
            return Err(MonitorError::NoBpfObject);
        }
        if !privileged() {
            return Err(MonitorError::NotPrivileged);
        }
        if !bpf_syscall_exists() {
            return Err(MonitorError::NoBpf);
        }
        if !kprobes_supported() {
            return Err(MonitorError::NoKprobes);
        }
        let vmlinux = options.btf_dir.join("vmlinux");
        if !vmlinux.exists() {
            return Err(MonitorError::NoKernelBtf(vmlinux.display().to_string()));
        }
        raise_memlock();

        let (btf, btf_source) = telemetry_ebpf::btf::target_btf(&options.btf_dir, "ib_uverbs")
            .map_err(MonitorError::NoKernelBtf)?;
        let emit: u8 = options.events.into();
        let mut bpf = EbpfLoader::new()
            .btf(Some(&btf))
            .map_max_entries("events", options.ring_buffer_bytes)
            .override_global("EMIT_EVENTS", &emit, true)
            .load(BPF_OBJECT)?;

        let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
        let wanted: Vec<&str> = HOOKS
            .iter()
            .filter(|h| !matches!(h.probe, Probe::Tracepoint { .. }))
            .map(|h| h.target)
            .collect();
        let symbols = hooks::resolve_symbols(&kallsyms, &wanted);
        let modules = loaded_modules();

        let mut loader = Loader(LoadOnce::new("monitor.bpf.o"));
        let mut report = Vec::with_capacity(HOOKS.len());
        for h in HOOKS {
            let missing_module = || {
                if modules.iter().any(|m| m == h.module) {
                    format!(
                        "not in /proc/kallsyms although {} is loaded (renamed or inlined on this kernel)",
                        h.module
                    )
                } else {
                    format!("module {} is not loaded (modprobe {})", h.module, h.module)
                }
            };
            let outcome: Result<Option<String>, String> = match h.probe {
                Probe::Tracepoint {
                    program,
                    category,
                    name,
                } => {
                    if !tracefs_has(category, name) {
                        Err(format!(
                            "tracepoint {category}:{name} not found in tracefs ({})",
                            if modules.iter().any(|m| m == h.module) {
                                "is tracefs mounted at /sys/kernel/tracing?".to_owned()
                            } else {
                                format!("module {} is not loaded", h.module)
                            }
                        ))
                    } else {
                        loader.tracepoint(&mut bpf, program).and_then(|p| {
                            p.attach(category, name)
                                .map(|_| None)
                                .map_err(|e| error_chain(&e))
                        })
                    }
                }
                Probe::Entry(program) => match symbols.get(h.target) {
                    None => Err(missing_module()),
                    Some(sym) => loader.kprobe(&mut bpf, program).and_then(|p| {
                        p.attach(sym, 0)
                            .map(|_| (sym != h.target).then(|| format!("attached to {sym}")))
                            .map_err(|e| error_chain(&e))
                    }),
                },
                Probe::Pair { enter, exit } => match symbols.get(h.target) {
                    None => Err(missing_module()),
                    Some(sym) => attach_pair(&mut bpf, &mut loader, enter, exit, sym)
                        .map(|()| (sym != h.target).then(|| format!("attached to {sym}"))),
                },
            };
            report.push(match outcome {
                Ok(note) => AttachReport {
                    hook: h.target.to_owned(),
                    kind: h.probe.kind().to_owned(),
                    attached: true,
                    reason: note,
                },
                Err(why) => AttachReport {
                    hook: h.target.to_owned(),
                    kind: h.probe.kind().to_owned(),
                    attached: false,
                    reason: Some(why),
                },
            });
        }

        if !report.iter().any(|r| r.attached) {
            let mut reasons: Vec<String> = report.iter().filter_map(|r| r.reason.clone()).collect();
            reasons.sort();
            reasons.dedup();
            return Err(MonitorError::NothingAttached {
                summary: reasons.join("; "),
                report,
            });
        }

        Ok(Monitor {
            async_fd: None,
            ring: map(&mut bpf, "events", RingBuf::try_from)?,
            live: map(&mut bpf, "live", PerCpuArray::try_from)?,
            totals: map(&mut bpf, "totals", PerCpuArray::try_from)?,
            errors: map(&mut bpf, "errors", PerCpuArray::try_from)?,
            stats: map(&mut bpf, "stats", PerCpuArray::try_from)?,
            cg_ops: map(&mut bpf, "cg_ops", HashMap::try_from)?,
            cg_live: map(&mut bpf, "cg_live", HashMap::try_from)?,
            report,
            btf_source,
            bad_records: 0,
            _bpf: bpf,
        })
    }

    /// The outcome of every hook, in a fixed order (see `bpf/monitor.bpf.c`).
    pub fn attach_report(&self) -> &[AttachReport] {
        &self.report
    }

    /// Verbs none of whose hooks is attached: they stay at 0 in [`Monitor::counters`] whatever
    /// user space does (see [`Monitor::attach_report`] for why).
    pub fn uncovered_verbs(&self) -> Vec<Verb> {
        Verb::ALL
            .into_iter()
            .filter(|v| {
                !HOOKS
                    .iter()
                    .zip(&self.report)
                    .any(|(h, r)| h.verbs.contains(v) && r.attached)
            })
            .collect()
    }

    /// Which BTF the programs were relocated against (`vmlinux+ib_uverbs`, or `vmlinux (...)`
    /// when the module BTF was missing; then creates and GID queries report the device only
    /// when an object was created, i.e. failed ones and GID queries have an empty device).
    pub fn btf_source(&self) -> &str {
        &self.btf_source
    }

    fn percpu_i64(&self, idx: u32) -> Result<i64, MonitorError> {
        let v = self.live.get(&idx, 0).map_err(|source| MonitorError::Map {
            name: "live",
            source,
        })?;
        Ok(v.iter().sum())
    }

    fn percpu_u64(
        arr: &PerCpuArray<MapData, u64>,
        name: &'static str,
        idx: u32,
    ) -> Result<u64, MonitorError> {
        let v = arr
            .get(&idx, 0)
            .map_err(|source| MonitorError::Map { name, source })?;
        Ok(v.iter().fold(0u64, |a, b| a.wrapping_add(*b)))
    }

    /// A snapshot of the kernel counters.
    pub fn counters(&self) -> Result<KernelCounters, MonitorError> {
        let mut c = KernelCounters::default();
        for r in Resource::ALL {
            c.live.insert(r, self.percpu_i64(u32::from(r as u8))?);
        }
        c.mr_bytes = self.percpu_i64(LIVE_MR_BYTES)?;
        for v in Verb::ALL {
            let i = u32::from(v.id());
            c.totals
                .insert(v, Self::percpu_u64(&self.totals, "totals", i)?);
            c.errors
                .insert(v, Self::percpu_u64(&self.errors, "errors", i)?);
        }
        for kv in self.cg_ops.iter() {
            let (k, n) = kv.map_err(|source| MonitorError::Map {
                name: "cg_ops",
                source,
            })?;
            if let Some(v) = Verb::from_id(u8::try_from(k.id).unwrap_or(u8::MAX)) {
                c.per_cgroup
                    .entry(k.cgroup_id)
                    .or_default()
                    .ops
                    .insert(v, n);
            }
        }
        for kv in self.cg_live.iter() {
            let (k, n) = kv.map_err(|source| MonitorError::Map {
                name: "cg_live",
                source,
            })?;
            if let Some(r) = Resource::ALL.get(k.id as usize) {
                c.per_cgroup
                    .entry(k.cgroup_id)
                    .or_default()
                    .live
                    .insert(*r, n);
            }
        }
        c.lost_events = Self::percpu_u64(&self.stats, "stats", STAT_LOST_EVENTS)?;
        Ok(c)
    }

    /// Kernel bookkeeping counters (see [`MonitorDiagnostics`]).
    pub fn diagnostics(&self) -> Result<MonitorDiagnostics, MonitorError> {
        let s = |i| Self::percpu_u64(&self.stats, "stats", i);
        Ok(MonitorDiagnostics {
            untracked_destroys: s(STAT_UNTRACKED_DESTROY)?,
            tracked_full: s(STAT_TRACKED_FULL)?,
            stale_tracked: s(STAT_STALE_TRACKED)?,
            inflight_full: s(STAT_INFLIGHT_FULL)?,
            bad_records: self.bad_records,
        })
    }

    /// Takes the events already in the ring buffer, without waiting: all of them, up to
    /// [`MAX_EVENT_BATCH`] per call.
    pub fn drain_events(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        // Bounded: under a flood the kernel writes events as fast as they are read, and an
        // unbounded drain never returned, stalling the caller's reports and noisy-tenant
        // decisions for seconds (measured in detect_lab).
        while out.len() < MAX_EVENT_BATCH {
            let Some(item) = self.ring.next() else { break };
            match parse_event(&item) {
                Ok(e) => out.push(e),
                Err(_) => self.bad_records += 1,
            }
        }
        out
    }

    /// Waits up to `timeout` for events, then returns all that are queued (possibly none).
    pub fn poll_events(&mut self, timeout: Duration) -> Vec<Event> {
        let out = self.drain_events();
        if !out.is_empty() {
            return out;
        }
        telemetry_ebpf::ring::wait_readable(self.ring.as_raw_fd(), timeout);
        self.drain_events()
    }

    /// Waits (asynchronously, on the ring buffer's fd with tokio) until events arrive and
    /// returns them; never returns an empty vector. Must run inside a tokio runtime with I/O
    /// enabled. Cancel-safe: events are only taken out of the ring buffer by the final drain.
    pub async fn next_events(&mut self) -> std::io::Result<Vec<Event>> {
        loop {
            let out = self.drain_events();
            if !out.is_empty() {
                return Ok(out);
            }
            if self.async_fd.is_none() {
                // SAFETY: the fd belongs to `self.ring`, which is never replaced and outlives
                // `async_fd` (declared first, so dropped first).
                let fd = unsafe {
                    AsyncFd::register_with_interest(self.ring.as_raw_fd(), Interest::READABLE)?
                };
                self.async_fd = Some(fd);
            }
            if let Some(fd) = &self.async_fd {
                let mut guard = fd.readable().await?;
                guard.clear_ready();
            }
        }
    }
}

impl AsRawFd for Monitor {
    /// The ring buffer's fd: readable when events are queued (for an external poll loop).
    fn as_raw_fd(&self) -> RawFd {
        self.ring.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_what_is_missing() {
        assert!(MonitorError::NoKprobes
            .to_string()
            .contains("CONFIG_KPROBES=n"));
        assert!(MonitorError::NotPrivileged
            .to_string()
            .contains("CAP_BPF+CAP_PERFMON"));
        assert!(MonitorError::NoBpfObject
            .to_string()
            .contains("clang missing at build time"));
    }

    #[test]
    fn object_has_every_program_and_map() {
        if BPF_OBJECT.is_empty() {
            eprintln!("monitor.bpf.o not built (no clang): skipped");
            return;
        }
        let obj = aya_obj::Object::parse(BPF_OBJECT).expect("parse monitor.bpf.o");
        for h in HOOKS {
            let names: Vec<&str> = match h.probe {
                Probe::Pair { enter, exit } => vec![enter, exit],
                Probe::Entry(p) => vec![p],
                Probe::Tracepoint { program, .. } => vec![program],
            };
            for n in names {
                assert!(obj.programs.contains_key(n), "program {n} missing");
            }
        }
        for m in [
            "events", "live", "totals", "errors", "stats", "cg_ops", "cg_live",
        ] {
            assert!(obj.maps.contains_key(m), "map {m} missing");
        }
    }
}
