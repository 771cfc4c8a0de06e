//! Which cgroup (v2) a process is in, to attribute its RDMA resources, and
//! back from a cgroup id to its path.
//!
//! In cgroup v2 the id that `bpf_get_current_cgroup_id()` reports is the inode
//! number of the cgroup's directory, so in-process counts and eBPF counts can
//! be joined on it: [`id_of`] goes from a process to that id, [`path_of_id`]
//! from an id the kernel reported to a path people can read.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

mod walk;

pub use walk::path_of_id;

/// Where cgroup v2 is mounted on systemd and Debian systems.
pub const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The cgroup v2 path of `pid` relative to the hierarchy's root (`/` for the
/// root cgroup), from `/proc/PID/cgroup`; `None` without cgroup v2.
///
/// ```
/// use rdma_quota::cgroup;
///
/// if let Some(path) = cgroup::path_of(std::process::id()) {
///     assert!(path.starts_with('/'));
/// }
/// ```
pub fn path_of(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    parse_v2_path(&text)
}

/// The cgroup v2 id (directory inode) of `pid`, or `None` without cgroup v2.
pub fn id_of(pid: u32) -> Option<u64> {
    let path = path_of(pid)?;
    id_of_path(Path::new(CGROUP_ROOT), &path)
}

/// The id of the cgroup at `path` (as [`path_of`] returns it) under `root`.
pub fn id_of_path(root: &Path, path: &str) -> Option<u64> {
    let dir: PathBuf = root.join(path.trim_start_matches('/'));
    std::fs::metadata(dir).ok().map(|m| m.ino())
}

/// The path in the `0::PATH` line of a `/proc/PID/cgroup` file's text.
///
/// ```
/// use rdma_quota::cgroup::parse_v2_path;
///
/// assert_eq!(parse_v2_path("0::/system.slice/x.service\n").as_deref(), Some("/system.slice/x.service"));
/// ```
pub fn parse_v2_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_owned())
        .filter(|p| p.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_unified_hierarchy_line() {
        let hybrid =
            "12:cpu,cpuacct:/x\n1:name=systemd:/user.slice\n0::/user.slice/session-1.scope\n";
        assert_eq!(
            parse_v2_path(hybrid).as_deref(),
            Some("/user.slice/session-1.scope")
        );
        assert_eq!(parse_v2_path("0::/\n").as_deref(), Some("/"));
        assert_eq!(parse_v2_path("3:memory:/a\n"), None, "v1 only");
        assert_eq!(parse_v2_path(""), None);
    }

    #[test]
    fn the_id_is_the_directory_inode() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        let ino = std::fs::metadata(root.path().join("a/b")).unwrap().ino();
        assert_eq!(id_of_path(root.path(), "/a/b"), Some(ino));
        // And back: the two are inverses.
        assert_eq!(path_of_id(root.path(), ino).as_deref(), Some("/a/b"));
        assert_eq!(id_of_path(root.path(), "/missing"), None);
    }
}
