//! Cgroup ids back to paths, by walking the hierarchy.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Cgroup hierarchies are shallow; the bound only stops pathological trees.
const MAX_DEPTH: usize = 32;

/// Enough for any real host, small enough that a lookup stays cheap.
const MAX_DIRECTORIES: usize = 100_000;

/// The path of cgroup `id` below `root` (usually [`CGROUP_ROOT`](super::CGROUP_ROOT)), such as
/// `/system.slice/sshd.service`; `/` for the root cgroup itself.
///
/// In cgroup v2 a cgroup's id (what `bpf_get_current_cgroup_id()` returns)
/// is the inode number of its directory, so this walks the tree looking for
/// that inode, without following symlinks, at most 32 levels deep and
/// through at most 100 000 directories. `None` if it is not found, for
/// example because the cgroup is gone already. Names that are not UTF-8 are
/// converted lossily.
///
/// # Examples
///
/// ```no_run
/// use std::path::Path;
/// use rdma_quota::cgroup::{self, CGROUP_ROOT};
///
/// let path = cgroup::path_of_id(Path::new(CGROUP_ROOT), 1234);
/// println!("{}", path.as_deref().unwrap_or("(gone)"));
/// ```
pub fn path_of_id(root: &Path, id: u64) -> Option<String> {
    if fs::symlink_metadata(root).ok()?.ino() == id {
        return Some("/".to_owned());
    }
    let mut pending: Vec<(PathBuf, String, usize)> = vec![(root.to_owned(), String::new(), 0)];
    let mut seen = 0usize;
    while let Some((dir, relative, depth)) = pending.pop() {
        if depth >= MAX_DEPTH {
            continue;
        }
        // Cgroups vanish while we walk; an unreadable directory is skipped.
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if !metadata.is_dir() {
                continue;
            }
            seen += 1;
            if seen > MAX_DIRECTORIES {
                return None;
            }
            let path = format!("{relative}/{}", entry.file_name().to_string_lossy());
            if metadata.ino() == id {
                return Some(path);
            }
            pending.push((entry.path(), path, depth + 1));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ino(path: &Path) -> u64 {
        fs::symlink_metadata(path).expect("test path exists").ino()
    }

    #[test]
    fn finds_nested_cgroups_by_inode() {
        let root = tempfile::tempdir().expect("temp dir");
        let leaf = root.path().join("system.slice").join("x.service");
        fs::create_dir_all(&leaf).expect("create tree");
        fs::create_dir_all(root.path().join("user.slice/user-1000.slice")).expect("create tree");
        fs::write(root.path().join("cgroup.procs"), "").expect("a file");

        assert_eq!(
            path_of_id(root.path(), ino(&leaf)).as_deref(),
            Some("/system.slice/x.service")
        );
        assert_eq!(
            path_of_id(root.path(), ino(&root.path().join("system.slice"))).as_deref(),
            Some("/system.slice")
        );
        assert_eq!(
            path_of_id(root.path(), ino(root.path())).as_deref(),
            Some("/")
        );
    }

    #[test]
    fn files_and_unknown_ids_are_not_cgroups() {
        let root = tempfile::tempdir().expect("temp dir");
        let file = root.path().join("cgroup.procs");
        fs::write(&file, "").expect("a file");
        fs::create_dir(root.path().join("a")).expect("a dir");
        assert_eq!(path_of_id(root.path(), ino(&file)), None);
        assert_eq!(path_of_id(root.path(), u64::MAX), None);
        assert_eq!(path_of_id(&root.path().join("missing"), 1), None);
    }

    #[test]
    fn symlinks_are_not_followed() {
        let root = tempfile::tempdir().expect("temp dir");
        let outside = tempfile::tempdir().expect("temp dir");
        let target = outside.path().join("elsewhere");
        fs::create_dir(&target).expect("a dir");
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).expect("symlink");
        assert_eq!(path_of_id(root.path(), ino(&target)), None);
    }

    #[test]
    fn depth_is_bounded() {
        let root = tempfile::tempdir().expect("temp dir");
        let mut deep = root.path().to_owned();
        for _ in 0..(MAX_DEPTH + 2) {
            deep.push("d");
        }
        fs::create_dir_all(&deep).expect("deep tree");
        assert_eq!(path_of_id(root.path(), ino(&deep)), None);
        let mut shallow = root.path().to_owned();
        for _ in 0..MAX_DEPTH {
            shallow.push("d");
        }
        let found = path_of_id(root.path(), ino(&shallow)).expect("within bound");
        assert_eq!(found, "/d".repeat(MAX_DEPTH));
    }
}
