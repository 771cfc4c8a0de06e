//! A rate limit on a cgroup's RDMA object creations, enforced in the kernel (telemetry-ebpf's
//! `bpf/enforce.bpf.c`, a BPF LSM program on `file_ioctl`).
//!
//! The interceptor (`LD_PRELOAD=librdma_intercept.so`) is skipped by a program that resolves
//! libibverbs privately, and the rdma cgroup bounds how many objects a tenant holds, not how
//! fast it creates and destroys them. This layer sees every verbs call libibverbs makes, because
//! on current kernels they all reach the uverbs file as one ioctl (the legacy commands inside
//! `DEVICE/INVOKE_WRITE`), and refuses a creation beyond the cgroup's rate with `EDQUOT` before
//! the kernel does any work for it.
//!
//! Limits: [`LIMITED_VERBS`] (QP, CQ, MR, PD and device context creation), per cgroup v2
//! directory (the processes directly in it), as a rate with a burst of one second's worth.
//! Not covered: a program that writes the legacy commands to the uverbs file with `write()`
//! itself (libibverbs does not on this kernel), whose LSM hook is not given the command.
//!
//! Needs a kernel with `bpf` among its active LSMs (`CONFIG_BPF_LSM=y` and `lsm=...,bpf`; the
//! list is in `/sys/kernel/security/lsm`) and root (or CAP_BPF with CAP_PERFMON).
//!
//! ```no_run
//! use std::path::Path;
//! use rdma_monitor::enforce::{KernelLimit, KernelLimits};
//!
//! let mut limits = KernelLimits::start(Path::new("/sys/kernel/btf"))?;
//! let limit: KernelLimit = "/tenants/b:QP_CREATE=20".parse()?;
//! let set = limits.set(&limit)?;
//! // ... later:
//! let counts = limits.counts(set)?;
//! println!("{} admitted, {} refused", counts.admitted, counts.refused);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use aya::maps::HashMap as BpfHashMap;
use aya::programs::Lsm;
use aya::{Btf, Ebpf, EbpfLoader};
use rdma_quota::cgroup::CGROUP_ROOT;
use rdma_quota::Verb;
use telemetry_ebpf::host::{bpf_syscall_exists, privileged, raise_memlock};
use telemetry_ebpf::loader::error_chain;
use telemetry_ebpf::objects::ENFORCE as BPF_OBJECT;

/// The verbs the kernel program can refuse: every creation of an object or a device context.
pub const LIMITED_VERBS: [Verb; 5] = [
    Verb::QpCreate,
    Verb::CqCreate,
    Verb::MrReg,
    Verb::PdAlloc,
    Verb::CtxOpen,
];

/// The LSM hook the program attaches to.
const HOOK: &str = "file_ioctl";

/// Why a kernel limit could not be started, set or read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnforceError {
    /// The crate was compiled without clang, so `enforce.bpf.o` is empty.
    #[error("built without its BPF object (clang missing at build time): rebuild telemetry-ebpf with clang and bpftool installed")]
    NoBpfObject,
    /// Not enough privileges to load an LSM program.
    #[error("needs root (or CAP_BPF and CAP_PERFMON) to load a BPF LSM program")]
    NotPrivileged,
    /// The `bpf()` system call does not exist.
    #[error("the kernel has no BPF support (bpf() returned ENOSYS: CONFIG_BPF_SYSCALL=n)")]
    NoBpf,
    /// `bpf` is not among the kernel's active LSMs, so the program would never run.
    #[error("the kernel's active LSMs ({active}) do not include bpf: boot with lsm={active},bpf (needs CONFIG_BPF_LSM=y)")]
    NoBpfLsm {
        /// The contents of `/sys/kernel/security/lsm`.
        active: String,
    },
    /// No kernel BTF, which an LSM program needs to attach.
    #[error("kernel BTF is missing ({0}: CONFIG_DEBUG_INFO_BTF=n)")]
    NoKernelBtf(String),
    /// aya failed to load the object.
    #[error("loading enforce.bpf.o failed: {0}")]
    Load(#[from] aya::EbpfError),
    /// The program was rejected or could not attach.
    #[error("the file_ioctl LSM program: {0}")]
    Attach(String),
    /// The `limits` map is missing or has the wrong type, or an update failed.
    #[error("BPF map limits: {0}")]
    Map(#[from] aya::maps::MapError),
    /// The cgroup of a limit does not exist or is not a cgroup v2 directory.
    #[error("{path}: not a cgroup v2 directory ({reason}); give its path as in /proc/PID/cgroup (/tenants/b) or under {CGROUP_ROOT}")]
    NotACgroup {
        /// The path as resolved.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// One limit: at most `per_second` calls of `verb` per second from the processes in `cgroup`
/// (a burst of one second's worth is allowed).
///
/// Written `CGROUP:VERB=RATE`, the cgroup as in `/proc/PID/cgroup` or under `/sys/fs/cgroup`:
///
/// ```
/// use rdma_monitor::enforce::KernelLimit;
/// use rdma_quota::Verb;
///
/// let l: KernelLimit = "/tenants/b:QP_CREATE=20".parse().unwrap();
/// assert_eq!((l.verb, l.per_second), (Verb::QpCreate, 20));
/// assert_eq!(l.cgroup_dir().to_str(), Some("/sys/fs/cgroup/tenants/b"));
/// assert!("/tenants/b:QP_MODIFY=20".parse::<KernelLimit>().unwrap_err().contains("QP_CREATE"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLimit {
    /// The cgroup, as given.
    pub cgroup: String,
    /// The verb limited (one of [`LIMITED_VERBS`]).
    pub verb: Verb,
    /// Calls per second.
    pub per_second: u32,
}

impl KernelLimit {
    /// The cgroup's directory: `cgroup` itself when it is under `/sys/fs/cgroup`, else
    /// `cgroup` below it.
    pub fn cgroup_dir(&self) -> PathBuf {
        let root = Path::new(CGROUP_ROOT);
        let given = Path::new(&self.cgroup);
        if given.starts_with(root) {
            given.to_path_buf()
        } else {
            root.join(self.cgroup.trim_start_matches('/'))
        }
    }
}

impl FromStr for KernelLimit {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let usage = || format!("{s:?} is not CGROUP:VERB=RATE (e.g. /tenants/b:QP_CREATE=20)");
        let (cgroup, setting) = s.rsplit_once(':').ok_or_else(usage)?;
        let (verb, rate) = setting.split_once('=').ok_or_else(usage)?;
        if !cgroup.starts_with('/') {
            return Err(format!("{s:?}: the cgroup must be a path starting with /"));
        }
        let names = || {
            LIMITED_VERBS
                .iter()
                .map(|v| v.name())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let verb: Verb = verb
            .parse()
            .ok()
            .filter(|v| LIMITED_VERBS.contains(v))
            .ok_or_else(|| format!("{s:?}: the kernel limits {} only", names()))?;
        let per_second: u32 = rate.parse().ok().filter(|&r| r > 0).ok_or_else(|| {
            format!("{s:?}: the rate must be a whole number of calls per second above 0")
        })?;
        Ok(Self {
            cgroup: cgroup.to_owned(),
            verb,
            per_second,
        })
    }
}

/// What the kernel did with a limit's calls since it was set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitCounts {
    /// Calls let through.
    pub admitted: u64,
    /// Calls refused with `EDQUOT`.
    pub refused: u64,
}

/// A limit that is set: which cgroup (resolved when it was set) and verb, for [`KernelLimits::counts`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetLimit(LimitKey);

/// `struct limit_key` of enforce.bpf.c.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LimitKey {
    cgroup_id: u64,
    verb: u32,
    pad: u32,
}

// SAFETY: plain-old-data with no padding (8 + 4 + 4 bytes), matching `struct limit_key`.
unsafe impl aya::Pod for LimitKey {}

/// `struct limit` of enforce.bpf.c.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct LimitValue {
    interval_ns: u64,
    burst_ns: u64,
    tat: u64,
    admitted: u64,
    refused: u64,
}

// SAFETY: plain-old-data, five u64 and no padding, matching `struct limit`.
unsafe impl aya::Pod for LimitValue {}

/// The loaded and attached program. Dropping it detaches the program: every limit ends.
pub struct KernelLimits {
    bpf: Ebpf,
}

impl std::fmt::Debug for KernelLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelLimits").finish_non_exhaustive()
    }
}

impl KernelLimits {
    /// Loads `enforce.bpf.o` and attaches its program to the `file_ioctl` LSM hook, with no
    /// limit set yet (every call passes).
    pub fn start(btf_dir: &Path) -> Result<Self, EnforceError> {
        if BPF_OBJECT.is_empty() {
            return Err(EnforceError::NoBpfObject);
        }
        if !privileged() {
            return Err(EnforceError::NotPrivileged);
        }
        if !bpf_syscall_exists() {
            return Err(EnforceError::NoBpf);
        }
        // Without securityfs mounted the list cannot be read; attaching then says what it can.
        if let Ok(active) = std::fs::read_to_string("/sys/kernel/security/lsm") {
            let active = active.trim().to_owned();
            if !active.split(',').any(|l| l == "bpf") {
                return Err(EnforceError::NoBpfLsm { active });
            }
        }
        let vmlinux = btf_dir.join("vmlinux");
        let btf = Btf::parse_file(&vmlinux, aya::Endianness::default())
            .map_err(|e| EnforceError::NoKernelBtf(format!("{}: {e}", vmlinux.display())))?;
        raise_memlock();
        let mut bpf = EbpfLoader::new().btf(Some(&btf)).load(BPF_OBJECT)?;
        let program: &mut Lsm = bpf
            .program_mut("enforce_ioctl")
            .ok_or_else(|| EnforceError::Attach("program enforce_ioctl missing".into()))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| EnforceError::Attach(error_chain(&e)))?;
        program
            .load(HOOK, &btf)
            .map_err(|e| EnforceError::Attach(format!("verifier: {}", error_chain(&e))))?;
        program
            .attach()
            .map_err(|e| EnforceError::Attach(error_chain(&e)))?;
        tracing::info!(hook = HOOK, "kernel rate limit attached");
        Ok(Self { bpf })
    }

    fn map(
        &mut self,
    ) -> Result<BpfHashMap<&mut aya::maps::MapData, LimitKey, LimitValue>, EnforceError> {
        let map = self
            .bpf
            .map_mut("limits")
            .ok_or(aya::maps::MapError::InvalidName {
                name: "limits".into(),
            })?;
        Ok(BpfHashMap::try_from(map)?)
    }

    fn key(limit: &KernelLimit) -> Result<LimitKey, EnforceError> {
        let dir = limit.cgroup_dir();
        let not = |reason: String| EnforceError::NotACgroup {
            path: dir.clone(),
            reason,
        };
        let meta = std::fs::metadata(&dir).map_err(|e| not(e.to_string()))?;
        if !meta.is_dir() || !dir.join("cgroup.procs").exists() {
            return Err(not("no cgroup.procs in it".into()));
        }
        Ok(LimitKey {
            cgroup_id: meta.ino(),
            verb: u32::from(limit.verb.id()),
            pad: 0,
        })
    }

    /// Sets (or replaces, with fresh counts) `limit`.
    ///
    /// The cgroup is resolved now, to the id the kernel knows it by: the limit follows that
    /// cgroup, and its counts stay readable after the cgroup is removed; a cgroup made again
    /// under the same path is a new one, not limited.
    pub fn set(&mut self, limit: &KernelLimit) -> Result<SetLimit, EnforceError> {
        let key = Self::key(limit)?;
        let interval_ns = 1_000_000_000 / u64::from(limit.per_second);
        let value = LimitValue {
            interval_ns: interval_ns.max(1),
            // One second's worth of calls may come at once.
            burst_ns: interval_ns.saturating_mul(u64::from(limit.per_second).saturating_sub(1)),
            ..LimitValue::default()
        };
        // A full map (4,096 limits) refuses the insert, and the error says so (E2BIG).
        self.map()?.insert(key, value, 0)?;
        tracing::info!(cgroup = %limit.cgroup, verb = limit.verb.name(), per_second = limit.per_second, "kernel limit set");
        Ok(SetLimit(key))
    }

    /// What the kernel admitted and refused under `limit` since it was set.
    pub fn counts(&mut self, limit: SetLimit) -> Result<LimitCounts, EnforceError> {
        let value = self.map()?.get(&limit.0, 0)?;
        Ok(LimitCounts {
            admitted: value.admitted,
            refused: value.refused,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_names_what_is_wrong_with_it() {
        for (given, says) in [
            ("QP_CREATE=20", "is not CGROUP:VERB=RATE"),
            ("/tenants/b:QP_CREATE", "is not CGROUP:VERB=RATE"),
            ("tenants/b:QP_CREATE=20", "must be a path starting with /"),
            (
                "/tenants/b:QP_DESTROY=20",
                "QP_CREATE, CQ_CREATE, MR_REG, PD_ALLOC, CTX_OPEN only",
            ),
            ("/tenants/b:NOPE=20", "the kernel limits"),
            ("/tenants/b:QP_CREATE=0", "above 0"),
            ("/tenants/b:QP_CREATE=2.5", "whole number"),
            ("/tenants/b:QP_CREATE=-1", "whole number"),
        ] {
            let e = given.parse::<KernelLimit>().unwrap_err();
            assert!(e.contains(says), "{given}: {e}");
        }
        // A path under the hierarchy's mount point is kept as it is.
        let l: KernelLimit = "/sys/fs/cgroup/a:b:CTX_OPEN=1".parse().unwrap();
        assert_eq!(l.cgroup_dir(), Path::new("/sys/fs/cgroup/a:b"));
        assert_eq!(l.verb, Verb::CtxOpen);
    }

    #[test]
    fn a_missing_cgroup_is_named_with_where_to_look() {
        let l: KernelLimit = "/no-such-cgroup-here:QP_CREATE=5".parse().unwrap();
        let e = KernelLimits::key(&l).unwrap_err().to_string();
        assert!(e.contains("/sys/fs/cgroup/no-such-cgroup-here"), "{e}");
        assert!(e.contains("/proc/PID/cgroup"), "{e}");
    }

    /// The map and the program as this file reads and writes them: `struct limit_key` is
    /// 16 bytes and `struct limit` 40, the program a sleepable LSM one.
    #[test]
    fn the_object_matches_this_layout() {
        if BPF_OBJECT.is_empty() {
            eprintln!("enforce.bpf.o not built (no clang): skipped");
            return;
        }
        let obj = aya_obj::Object::parse(BPF_OBJECT).expect("parse enforce.bpf.o");
        let map = obj.maps.get("limits").expect("map limits");
        assert_eq!(map.key_size() as usize, std::mem::size_of::<LimitKey>());
        assert_eq!(map.value_size() as usize, std::mem::size_of::<LimitValue>());
        assert_eq!(map.max_entries(), 4096);
        let prog = obj
            .programs
            .get("enforce_ioctl")
            .expect("program enforce_ioctl");
        assert!(
            matches!(
                prog.section,
                aya_obj::ProgramSection::Lsm { sleepable: true }
            ),
            "{:?}",
            prog.section
        );
    }
}
