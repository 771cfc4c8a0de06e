//! Tenants: the names that `tenant NAME ...` limits are looked up by, and how
//! a connected program's tenant is derived from the kernel's word only
//! (`SO_PEERCRED`, the user database and `/proc`), never from what the
//! program says about itself.
//!
//! The user database is reached through libc (`getpwuid_r`), which this
//! crate does not link; [`identify`] takes the lookup as a function, and the
//! collector passes its own.
//!
//! With `--tenant-by cgroup` a tenant is the *whole* cgroup v2 path
//! ([`cgroup_tenant`]), such as `/lab.slice/alice.scope`, and a quota file
//! names it so (`tenant /lab.slice/alice.scope QP_COUNT 4`). Only the full
//! path is unique: whoever was delegated a subtree can create
//! `/their.slice/alice.scope`, which must not count as `/lab.slice/alice.scope`.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::cgroup;

/// Names that cannot be a client's identity: they would overwrite the CA or
/// server files of a certificate directory.
const RESERVED: [&str; 2] = ["ca", "server"];

/// Whether `name` can be a tenant of a quota file: a client certificate name
/// (1-64 characters from `a-z`, `A-Z`, `0-9`, `-`, `_`, `.`, not starting
/// with `.`, and neither `ca` nor `server`), or a cgroup path as
/// [`cgroup_tenant`] writes it (starting with `/`), or a SPIFFE ID
/// ([`crate::spiffe`], `spiffe://trust-domain/path`), the identity of an X509-SVID.
///
/// Tenants of the TLS server are the identities of client certificates,
/// whose names become file names, so this is the certificate naming rule: a
/// name it refuses could never match a connection. The collector's cgroup
/// tenants always start with `/`, which no certificate name can, so the two
/// kinds never meet; nor do SPIFFE IDs, which start with `spiffe://`.
///
/// # Examples
///
/// ```
/// use rdma_quota::tenant::is_valid_name;
///
/// assert!(is_valid_name("alice"));
/// assert!(is_valid_name("session-3.scope"));
/// assert!(is_valid_name("/lab.slice/alice.scope"));
/// assert!(!is_valid_name("../etc"));
/// assert!(!is_valid_name("/lab.slice/../etc"));
/// assert!(!is_valid_name("server"));
/// assert!(is_valid_name("spiffe://example.org/ns/prod/sa/alice"));
/// assert!(!is_valid_name("spiffe://Example.org/alice"));
/// ```
pub fn is_valid_name(name: &str) -> bool {
    is_certificate_name(name)
        || is_cgroup_tenant(name)
        || crate::spiffe::SpiffeId::parse(name).is_ok()
}

/// A client certificate name: 1-64 characters from `a-z`, `A-Z`, `0-9`,
/// `-`, `_`, `.`, not starting with `.`, and neither `ca` nor `server`.
fn is_certificate_name(name: &str) -> bool {
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
    /// The peer's whole cgroup v2 path ([`cgroup_tenant`]), e.g.
    /// `/system.slice/myjob.service` (`/` for the root cgroup).
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
    /// The user database could not be asked (as opposed to having no entry):
    /// naming the tenant `uid-N` instead would escape the user's limits.
    #[error("cannot look up uid {uid} in the user database: {reason}; try again later")]
    UserDatabase {
        /// The peer's uid.
        uid: u32,
        /// Why.
        reason: String,
    },
    /// The collector lacks a resource to identify the peer now (no file
    /// descriptor left); the program may try again.
    #[error("cannot identify pid {pid} now: {reason}; try again later")]
    Busy {
        /// The peer's pid.
        pid: u32,
        /// Why.
        reason: String,
    },
    /// The process exited while it was being identified, so what `/proc`
    /// showed for its pid may belong to another process.
    #[error("process {pid} exited before it could be identified")]
    Exited {
        /// The peer's pid.
        pid: u32,
    },
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
/// (`Ok(None)` if it has no entry, which names the tenant `uid-N`; an error,
/// such as running out of file descriptors, refuses the peer). Blocking:
/// reads `/proc` and the lookup may query NSS, so call it off async workers.
///
/// `/proc/<pid>` is read after the fact: the caller must make sure the pid
/// still names the connecting process afterwards (the collector checks its
/// pidfd), or a recycled pid could lend another process's cgroup.
///
/// # Examples
///
/// ```
/// use std::path::Path;
/// use rdma_quota::tenant::{identify, TenantBy};
///
/// let me = std::process::id();
/// let no_users = |_uid: u32| Ok(None);
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
    user_name: impl FnOnce(u32) -> std::io::Result<Option<String>>,
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
        TenantBy::User => match user_name(uid) {
            Ok(Some(name)) => sanitize(&name),
            Ok(None) => format!("uid-{uid}"),
            Err(e) => {
                return Err(PeerError::UserDatabase {
                    uid,
                    reason: e.to_string(),
                })
            }
        },
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

/// The tenant of a cgroup path: the whole path, from the hierarchy's root.
///
/// Bytes other than `A-Z a-z 0-9 . _ - @` in a component are written
/// `\xNN`, so every path has its own tenant name (no two cgroups share one)
/// and the name is one printable word. A name ending in ` (deleted)` (a
/// cgroup removed while the process was in it) loses that mark.
///
/// # Examples
///
/// ```
/// use rdma_quota::tenant::cgroup_tenant;
///
/// assert_eq!(
///     cgroup_tenant("/user.slice/user-1000.slice/session-3.scope"),
///     "/user.slice/user-1000.slice/session-3.scope"
/// );
/// assert_eq!(cgroup_tenant("/a/b/alice"), "/a/b/alice"); // not "alice"
/// assert_eq!(cgroup_tenant("/job 1"), "/job\\x201");
/// assert_eq!(cgroup_tenant("/"), "/");
/// ```
pub fn cgroup_tenant(path: &str) -> String {
    let path = path.trim_end_matches(" (deleted)");
    let mut tenant = String::with_capacity(path.len() + 1);
    for component in path.split('/').filter(|c| !c.is_empty()) {
        tenant.push('/');
        for b in component.bytes() {
            if is_plain_cgroup_byte(b) {
                tenant.push(char::from(b));
            } else {
                tenant.push_str(&format!("\\x{b:02x}"));
            }
        }
    }
    if tenant.is_empty() {
        tenant.push('/');
    }
    tenant
}

fn is_plain_cgroup_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b'@')
}

/// Whether `name` is a cgroup tenant as [`cgroup_tenant`] writes it: `/`, or
/// `/`-separated components of `A-Z a-z 0-9 . _ - @` and `\xNN` escapes,
/// none empty, `.` or `..`, at most 4096 bytes.
fn is_cgroup_tenant(name: &str) -> bool {
    if name == "/" {
        return true;
    }
    let Some(rest) = name.strip_prefix('/') else {
        return false;
    };
    name.len() <= 4096
        && rest.split('/').all(|c| {
            if c.is_empty() || c == "." || c == ".." {
                return false;
            }
            let b = c.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'\\' {
                    let escape = b.get(i + 1..i + 4);
                    match escape {
                        Some([b'x', h, l]) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit() => {
                            i += 4
                        }
                        _ => return false,
                    }
                } else if is_plain_cgroup_byte(b[i]) {
                    i += 1;
                } else {
                    return false;
                }
            }
            true
        })
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
    fn users(uid: u32) -> std::io::Result<Option<String>> {
        Ok(match uid {
            0 => Some("root".to_owned()),
            1000 => Some("odd user\n".to_owned()),
            _ => None,
        })
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
    fn cgroup_tenant_is_the_whole_path() {
        assert_eq!(
            cgroup_tenant("/system.slice/job.service"),
            "/system.slice/job.service"
        );
        assert_eq!(cgroup_tenant("/a/b/"), "/a/b");
        assert_eq!(cgroup_tenant("/a/gone (deleted)"), "/a/gone");
        assert_eq!(cgroup_tenant(""), "/");
        assert_eq!(
            cgroup_tenant("/user.slice/user@1000.service"),
            "/user.slice/user@1000.service"
        );
        // Escapes keep names distinct: no two paths share a tenant.
        assert_eq!(cgroup_tenant("/with space"), "/with\\x20space");
        assert_eq!(cgroup_tenant("/with_space"), "/with_space");
        assert_eq!(cgroup_tenant("/a\\x20b"), "/a\\x5cx20b");
        assert_eq!(cgroup_tenant("/é:"), "/\\xc3\\xa9\\x3a");
        for path in ["/a/b/alice", "/with space", "/é:", "/a\\x20b", "/", "/x/.y"] {
            let tenant = cgroup_tenant(path);
            assert!(is_valid_name(&tenant), "{path:?} -> {tenant:?}");
        }
        for bad in [
            "/a//b", "/a/", "/a/../b", "/./a", "/a b", "/a:b", "/a\\x2", "/a\\y20", "//",
        ] {
            assert!(!is_valid_name(bad), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_delegated_subtree_cannot_pose_as_another_tenant() {
        // alice's job runs in /lab.slice/alice; mallory, delegated /users/mallory, makes a
        // cgroup named alice inside it.
        let alice = fake_proc(100, "job", "0::/lab.slice/alice\n");
        let mallory = fake_proc(200, "job", "0::/users/mallory/alice\n");
        let none = tempfile::tempdir().expect("temp dir");
        let a = identify(
            100,
            1000,
            TenantBy::Cgroup,
            alice.path(),
            none.path(),
            users,
        )
        .expect("alice");
        let m = identify(
            200,
            1001,
            TenantBy::Cgroup,
            mallory.path(),
            none.path(),
            users,
        )
        .expect("mallory");
        assert_eq!(a.tenant, "/lab.slice/alice");
        assert_eq!(m.tenant, "/users/mallory/alice");
        assert_ne!(a.tenant, m.tenant);
    }

    #[test]
    fn a_failing_user_database_refuses_instead_of_renaming() {
        let proc = fake_proc(42, "x", "0::/\n");
        let broken = |_uid: u32| -> std::io::Result<Option<String>> {
            Err(std::io::Error::from_raw_os_error(24))
        };
        let err = identify(42, 1000, TenantBy::User, proc.path(), proc.path(), broken)
            .expect_err("no tenant");
        assert!(
            matches!(err, PeerError::UserDatabase { uid: 1000, .. }),
            "{err}"
        );
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
        assert_eq!(by_cgroup.tenant, "/lab.slice/tenant-a.scope");
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
