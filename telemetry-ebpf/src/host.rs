//! What the running kernel and process allow, checked before loading programs so that a tool
//! can say precisely what is missing instead of relaying a bare `EPERM` or `ENOENT`.

use std::path::Path;

fn cap_bits() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line.trim_start_matches("CapEff:").trim(), 16).ok()
}

/// Whether this process may load and attach kprobe programs: CAP_SYS_ADMIN, or CAP_BPF and
/// CAP_PERFMON (root when the capabilities cannot be read).
pub fn privileged() -> bool {
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    const CAP_PERFMON: u64 = 1 << 38;
    const CAP_BPF: u64 = 1 << 39;
    match cap_bits() {
        Some(c) => c & CAP_SYS_ADMIN != 0 || (c & CAP_BPF != 0 && c & CAP_PERFMON != 0),
        None => {
            // SAFETY: geteuid has no preconditions.
            let euid = unsafe { libc::geteuid() };
            euid == 0
        }
    }
}

/// Whether the kernel has the `bpf()` system call (`CONFIG_BPF_SYSCALL`).
pub fn bpf_syscall_exists() -> bool {
    // An invalid command: EINVAL (or EPERM) when bpf() exists, ENOSYS when it does not.
    // SAFETY: the kernel rejects the command before looking at the (null) attribute pointer.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, 0xffff_i32, std::ptr::null::<u8>(), 0u32) };
    let errno = std::io::Error::last_os_error().raw_os_error();
    rc >= 0 || errno != Some(libc::ENOSYS)
}

/// Whether the kernel has a kprobe PMU (`CONFIG_KPROBES`).
pub fn kprobes_supported() -> bool {
    Path::new("/sys/bus/event_source/devices/kprobe/type").exists()
}

/// Lifts `RLIMIT_MEMLOCK`, which kernels before 5.11 charge BPF maps to. Best effort.
pub fn raise_memlock() {
    let lim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid rlimit pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) };
}

/// The names of the loaded kernel modules (`/proc/modules`; empty when it cannot be read).
pub fn loaded_modules() -> Vec<String> {
    std::fs::read_to_string("/proc/modules")
        .map(|s| {
            s.lines()
                .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether tracefs (at `/sys/kernel/tracing` or under debugfs) has the tracepoint
/// `category:name`.
pub fn tracefs_has(category: &str, name: &str) -> bool {
    ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .any(|root| {
            Path::new(root)
                .join("events")
                .join(category)
                .join(name)
                .exists()
        })
}
