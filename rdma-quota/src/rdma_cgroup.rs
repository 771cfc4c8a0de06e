//! The kernel's rdma cgroup controller: hard limits no process can get around.
//!
//! In-process admission only binds programs that ask, and an LD_PRELOAD
//! interceptor only binds programs that keep it loaded; the rdma controller of
//! cgroup v2 is enforced by the kernel on every verb that creates an object.
//! Its limits are coarse: per device, `hca_handle` caps open device contexts
//! and `hca_object` caps all objects together (PDs, CQs, QPs, MRs, AHs, …).
//! A creation beyond `hca_object` fails in the kernel (`ibv_create_qp`
//! returns NULL), whatever the program does.
//!
//! ```no_run
//! use std::path::Path;
//! use rdma_quota::rdma_cgroup::{self, DeviceLimit};
//!
//! let tenant = Path::new("/sys/fs/cgroup/tenant-alice");
//! rdma_cgroup::create(tenant)?;
//! rdma_cgroup::set_max(tenant, &DeviceLimit { device: "rxe-a".into(), handles: None, objects: Some(8) })?;
//! // ... move the tenant's processes into it (cgroup.procs) ...
//! for used in rdma_cgroup::current(tenant)? {
//!     println!("{used}");
//! }
//! # Ok::<(), rdma_quota::rdma_cgroup::CgroupError>(())
//! ```

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// One device's line of `rdma.max` or `rdma.current`; `None` means `max`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimit {
    /// RDMA device name.
    pub device: String,
    /// Device contexts (`hca_handle`).
    pub handles: Option<u64>,
    /// Objects of every kind together (`hca_object`).
    pub objects: Option<u64>,
}

impl fmt::Display for DeviceLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = |x: Option<u64>| x.map_or_else(|| "max".to_owned(), |n| n.to_string());
        write!(
            f,
            "{} hca_handle={} hca_object={}",
            self.device,
            v(self.handles),
            v(self.objects)
        )
    }
}

/// Why an rdma cgroup operation failed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// Reading or writing a cgroup file failed.
    #[error("{path}: {source}{hint}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
        /// What probably went wrong, or empty.
        hint: &'static str,
    },
    /// A line of `rdma.max`/`rdma.current` did not parse.
    #[error("{path}: cannot parse {line:?}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The line.
        line: String,
    },
    /// A device name that cannot be written into `rdma.max`.
    #[error("invalid RDMA device name {0:?}")]
    Device(String),
}

fn io_err<'a>(path: &'a Path, hint: &'static str) -> impl FnOnce(io::Error) -> CgroupError + 'a {
    move |source| CgroupError::Io {
        path: path.to_owned(),
        source,
        hint,
    }
}

/// Parses `rdma.max` or `rdma.current` text (`rxe-a hca_handle=2 hca_object=max`).
pub fn parse(text: &str, path: &Path) -> Result<Vec<DeviceLimit>, CgroupError> {
    let bad = |line: &str| CgroupError::Parse {
        path: path.to_owned(),
        line: line.to_owned(),
    };
    let mut out = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let mut words = line.split_whitespace();
        let device = words.next().ok_or_else(|| bad(line))?.to_owned();
        let mut limit = DeviceLimit {
            device,
            handles: None,
            objects: None,
        };
        for word in words {
            let (key, value) = word.split_once('=').ok_or_else(|| bad(line))?;
            let value = match value {
                "max" => None,
                n => Some(n.parse().map_err(|_| bad(line))?),
            };
            match key {
                "hca_handle" => limit.handles = value,
                "hca_object" => limit.objects = value,
                _ => return Err(bad(line)),
            }
        }
        out.push(limit);
    }
    Ok(out)
}

/// Creates the cgroup directory `dir` and enables the rdma controller for its
/// parent's children (`+rdma` in the parent's `cgroup.subtree_control`).
pub fn create(dir: &Path) -> Result<(), CgroupError> {
    if let Some(parent) = dir.parent() {
        let control = parent.join("cgroup.subtree_control");
        std::fs::write(&control, "+rdma").map_err(io_err(
            &control,
            " (is cgroup v2 mounted there, with the rdma controller, and are you root?)",
        ))?;
    }
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
            Err(io_err(dir, " (is this under a cgroup v2 mount?)")(e))
        }
        _ => Ok(()),
    }
}

/// Writes one device's limits into `dir/rdma.max`.
pub fn set_max(dir: &Path, limit: &DeviceLimit) -> Result<(), CgroupError> {
    let ok = !limit.device.is_empty()
        && limit
            .device
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if !ok {
        return Err(CgroupError::Device(limit.device.clone()));
    }
    let path = dir.join("rdma.max");
    std::fs::write(&path, limit.to_string()).map_err(io_err(
        &path,
        " (does the device exist, and is the rdma controller enabled for this cgroup?)",
    ))
}

/// The limits in `dir/rdma.max`.
pub fn max(dir: &Path) -> Result<Vec<DeviceLimit>, CgroupError> {
    read(&dir.join("rdma.max"))
}

/// What the cgroup's processes hold now, from `dir/rdma.current`.
pub fn current(dir: &Path) -> Result<Vec<DeviceLimit>, CgroupError> {
    read(&dir.join("rdma.current"))
}

fn read(path: &Path) -> Result<Vec<DeviceLimit>, CgroupError> {
    let text = std::fs::read_to_string(path).map_err(io_err(path, ""))?;
    parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats_the_kernel_syntax() {
        let p = Path::new("rdma.max");
        let got = parse(
            "rxe-a hca_handle=max hca_object=3 \nmlx5_0 hca_handle=2 hca_object=max\n",
            p,
        )
        .unwrap();
        assert_eq!(
            got,
            vec![
                DeviceLimit {
                    device: "rxe-a".into(),
                    handles: None,
                    objects: Some(3)
                },
                DeviceLimit {
                    device: "mlx5_0".into(),
                    handles: Some(2),
                    objects: None
                },
            ]
        );
        assert_eq!(got[0].to_string(), "rxe-a hca_handle=max hca_object=3");
        for bad in ["rxe-a hca_object", "rxe-a hca_object=lots", "rxe-a qp=3"] {
            let err = parse(bad, p).unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
        assert!(parse("", p).unwrap().is_empty());
    }

    #[test]
    fn refuses_device_names_that_would_inject_keys() {
        let dir = tempfile::tempdir().unwrap();
        let limit = DeviceLimit {
            device: "rxe-a hca_object=max\nrxe-b".into(),
            handles: None,
            objects: Some(1),
        };
        assert!(matches!(
            set_max(dir.path(), &limit),
            Err(CgroupError::Device(_))
        ));
        let ok = DeviceLimit {
            device: "rxe-a".into(),
            ..limit
        };
        set_max(dir.path(), &ok).unwrap();
        assert_eq!(max(dir.path()).unwrap(), vec![ok]);
    }
}
