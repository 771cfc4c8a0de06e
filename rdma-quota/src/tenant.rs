//! Tenants: the names that `tenant NAME ...` limits are looked up by, and how
//! a connected program's tenant is derived from the kernel's word only
//! (`SO_PEERCRED`, the user database and `/proc`), never from what the
//! program says about itself.
//!
//! The user database is reached through libc (`getpwuid_r`), which this
//! crate does not link; [`identify`] takes the lookup as a function, and the
//! collector passes its own.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::cgroup;

/// Names that cannot be a client's identity: they would overwrite the CA or
/// server files of a certificate directory.
const RESERVED: [&str; 2] = ["ca", "server"];

/// Whether `name` can be a tenant of a quota file: 1-64 characters from
/// `a-z`, `A-Z`, `0-9`, `-`, `_`, `.`, not starting with `.`, and neither
/// `ca` nor `server`.
///
/// Tenants of the TLS server are the identities of client certificates,
/// whose names become file names, so this is the certificate naming rule: a
/// name it refuses could never match a connection.
///
/// # Examples
///
/// ```
/// use rdma_quota::tenant::is_valid_name;
///
/// assert!(is_valid_name("alice"));
/// assert!(is_valid_name("session-3.scope"));
/// assert!(!is_valid_name("../etc"));
/// assert!(!is_valid_name("server"));
/// ```
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && !RESERVED.contains(&name)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// How a connection's tenant (the name its `tenant NAME ...` limits are
/// looked up by) is derived.
///
/// # Examples
///
/// ```
/// use rdma_quota::tenant::TenantBy;
///
/// assert_eq!("cgroup".parse::<TenantBy>(), Ok(TenantBy::Cgroup));
/// assert_eq!(TenantBy::User.to_string(), "user");
/// assert!("pid".parse::<TenantBy>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TenantBy {
    /// The user name of the peer's uid (`uid-N` if it has none).
    #[default]
    User,
    /// The last component of the peer's cgroup v2 path, e.g.
    /// `session-3.scope` or `myjob.service` (`root` for `/`).
    Cgroup,
}

impl fmt::Display for TenantBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TenantBy::User => "user",
            TenantBy::Cgroup => "cgroup",
        })
    }
}

/// A `--tenant-by` value that is neither `user` nor `cgroup`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tenant source {0:?} (expected user or cgroup)")]
pub struct UnknownTenantBy(pub String);

impl FromStr for TenantBy {
    type Err = UnknownTenantBy;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "user" => Ok(TenantBy::User),
            "cgroup" => Ok(TenantBy::Cgroup),
            other => Err(UnknownTenantBy(other.to_owned())),
        }
    }
}

/// A connected program, as the kernel describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Process id at `connect` time (`SO_PEERCRED`).
    pub pid: u32,
    /// Effective uid at `connect` time (`SO_PEERCRED`).
    pub uid: u32,
    /// `/proc/<pid>/comm`, for logs (`?` if the process is already gone).
    pub comm: String,
    /// The tenant whose limits apply.
    pub tenant: String,
    /// cgroup v2 id (the cgroup directory's inode), 0 if unknown.
    pub cgroup_id: u64,
}

/// Why a peer could not be identified; the connection is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// `SO_PEERCRED` gave no pid (not on Linux).
    #[error("the kernel did not report the peer's pid")]
    NoPid,
    /// `--tenant-by cgroup` and the cgroup cannot be read.
    #[error("cannot determine the cgroup of pid {pid}: {reason}")]
    Cgroup {
        /// The peer.
        pid: u32,
        /// Why.
        reason: String,
    },
}

/// Identifies a peer from its credentials (`SO_PEERCRED`'s pid and uid).
///
/// `proc_root` and `cgroup_root` are normally `/proc` and
/// [`cgroup::CGROUP_ROOT`]; `user_name` looks a uid up in the user database
/// (`None` if it has no entry, which names the tenant `uid-N`). Blocking:
/// reads `/proc` and the lookup may query NSS, so call it off async workers.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use rdma_quota::tenant::{identify, TenantBy};
///
/// let me = std::process::id();
/// let no_users = |_uid: u32| None;
/// let peer = identify(me, 4242, TenantBy::User, Path::new("/proc"), Path::new("/sys/fs/cgroup"), no_users)?;
/// assert_eq!(peer.tenant, "uid-4242");
/// assert_eq!(peer.pid, me);
/// # Ok::<(), rdma_quota::tenant::PeerError>(())
/// ```
pub fn identify(
    pid: u32,
    uid: u32,
    tenant_by: TenantBy,
    proc_root: &Path,
    cgroup_root: &Path,
    user_name: impl FnOnce(u32) -> Option<String>,
) -> Result<Peer, PeerError> {
    let comm = std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
        .map(|s| sanitize(s.trim_end_matches('\n')))
        .unwrap_or_else(|_| "?".to_owned());
    let cgroup = cgroup_path(pid, proc_root);
    let cgroup_id = cgroup
        .as_ref()
        .ok()
        .and_then(|p| cgroup::id_of_path(cgroup_root, p))
        .unwrap_or(0);
    let tenant = match tenant_by {
        TenantBy::User => user_name(uid).map_or_else(|| format!("uid-{uid}"), |n| sanitize(&n)),
        TenantBy::Cgroup => {
            let path = cgroup.map_err(|reason| PeerError::Cgroup { pid, reason })?;
            cgroup_tenant(&path)
        }
    };
    Ok(Peer {
        pid,
        uid,
        comm,
        tenant,
        cgroup_id,
    })
}

/// The cgroup v2 path of `pid` under `proc_root` (normally `/proc`).
fn cgroup_path(pid: u32, proc_root: &Path) -> Result<String, String> {
    let file = proc_root.join(pid.to_string()).join("cgroup");
    let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
    cgroup::parse_v2_path(&text)
        .ok_or_else(|| format!("{} has no cgroup v2 (0::) line", file.display()))
}

/// The tenant of a cgroup path: its last component.
///
/// # Examples
///
/// ```
/// use rdma_quota::tenant::cgroup_tenant;
///
/// assert_eq!(cgroup_tenant("/user.slice/user-1000.slice/session-3.scope"), "session-3.scope");
/// assert_eq!(cgroup_tenant("/"), "root");
/// ```
pub fn cgroup_tenant(path: &str) -> String {
    // " (deleted)" marks a cgroup removed while the process was in it.
    let path = path.trim_end_matches(" (deleted)");
    match path.rsplit('/').find(|c| !c.is_empty()) {
        Some(last) => sanitize(last),
        None => "root".to_owned(),
    }
}

/// Keeps names printable and one word, so that they fit in log fields and
/// `STATS` replies.
fn sanitize(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_control() || c.is_whitespace() {
                '_'
            } else {
                c
            }
        })
        .take(128)
        .collect();
    if clean.is_empty() {
        "?".to_owned()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn fake_proc(pid: u32, comm: &str, cgroup: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("temp dir");
        let p = dir.path().join(pid.to_string());
        std::fs::create_dir_all(&p).expect("mkdir");
        std::fs::write(p.join("comm"), comm).expect("comm");
        std::fs::write(p.join("cgroup"), cgroup).expect("cgroup");
        dir
    }

    /// A user database with only root and a user whose name needs cleaning.
    fn users(uid: u32) -> Option<String> {
        match uid {
            0 => Some("root".to_owned()),
            1000 => Some("odd user\n".to_owned()),
            _ => None,
        }
    }

    #[test]
    fn names_follow_the_certificate_rule() {
        for good in ["alice", "a", "tenant-a.scope", "A_1", &"x".repeat(64)] {
            assert!(is_valid_name(good), "{good:?} refused");
        }
        for bad in [
            "",
            ".hidden",
            "ca",
            "server",
            "a b",
            "a/b",
            "é",
            &"x".repeat(65),
        ] {
            assert!(!is_valid_name(bad), "{bad:?} accepted");
        }
    }

    #[test]
    fn cgroup_tenant_is_the_last_component() {
        assert_eq!(cgroup_tenant("/system.slice/job.service"), "job.service");
        assert_eq!(cgroup_tenant("/a/b/"), "b");
        assert_eq!(cgroup_tenant("/a/gone (deleted)"), "gone");
        assert_eq!(cgroup_tenant(""), "root");
        assert_eq!(cgroup_tenant("/with space"), "with_space");
    }

    #[test]
    fn identifies_from_proc_and_the_user_database() {
        let proc = fake_proc(42, "ibv_rc_pingpong\n", "0::/lab.slice/tenant-a.scope\n");
        let cgroups = tempfile::tempdir().expect("temp dir");
        let dir = cgroups.path().join("lab.slice/tenant-a.scope");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let ino = std::fs::metadata(&dir).expect("stat").ino();

        let by_cgroup = identify(42, 0, TenantBy::Cgroup, proc.path(), cgroups.path(), users)
            .expect("identified");
        assert_eq!(by_cgroup.tenant, "tenant-a.scope");
        assert_eq!(by_cgroup.comm, "ibv_rc_pingpong");
        assert_eq!(by_cgroup.cgroup_id, ino);
        assert_eq!((by_cgroup.pid, by_cgroup.uid), (42, 0));

        let by_user = identify(42, 0, TenantBy::User, proc.path(), cgroups.path(), users)
            .expect("identified");
        assert_eq!(by_user.tenant, "root");
        let odd = identify(42, 1000, TenantBy::User, proc.path(), cgroups.path(), users)
            .expect("identified");
        assert_eq!(odd.tenant, "odd_user_");
        // A uid without an entry still gets a stable, configurable name.
        let nobody = identify(
            42,
            3_999_999_999,
            TenantBy::User,
            proc.path(),
            cgroups.path(),
            users,
        )
        .expect("identified");
        assert_eq!(nobody.tenant, "uid-3999999999");
    }

    #[test]
    fn a_vanished_process_has_no_cgroup_tenant() {
        let proc = tempfile::tempdir().expect("temp dir");
        let err =
            identify(7, 0, TenantBy::Cgroup, proc.path(), proc.path(), users).expect_err("gone");
        assert!(
            err.to_string()
                .starts_with("cannot determine the cgroup of pid 7: "),
            "{err}"
        );
        // By user it still works: only comm is unknown.
        let peer = identify(7, 0, TenantBy::User, proc.path(), proc.path(), users).expect("user");
        assert_eq!(peer.comm, "?");
        assert_eq!(peer.cgroup_id, 0);
    }
}
