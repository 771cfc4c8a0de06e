//! The listening socket: binding it at a path (its directory, a stale
//! socket from a collector that is gone, its mode), adopting one that is
//! already bound (systemd's socket activation), removing our own at exit, and
//! [`CollectorError`], why the collector cannot start or keep listening.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener as StdUnixListener, UnixStream as StdUnixStream};
use std::path::{Path, PathBuf};

/// Why the collector cannot start or keep listening.
#[derive(Debug, thiserror::Error)]
pub enum CollectorError {
    /// The socket's directory cannot be created.
    #[error("cannot create the socket directory {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The socket path cannot be examined.
    #[error("cannot inspect {}: {source}", path.display())]
    Inspect {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// Something other than a socket is at the path; it is left alone.
    #[error("{} exists and is not a socket; refusing to replace it", path.display())]
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// Another collector answers on the path.
    #[error("another collector is already listening on {}", path.display())]
    AlreadyRunning {
        /// The path.
        path: PathBuf,
    },
    /// A stale socket from a previous run cannot be removed.
    #[error("cannot remove the stale socket {}: {source}", path.display())]
    RemoveStale {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// `bind` failed.
    #[error("cannot listen on {}: {source}", path.display())]
    Bind {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The socket's mode cannot be set to 0666.
    #[error("cannot make {} connectable for all users (chmod 0666): {source}", path.display())]
    Permissions {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The listener cannot be registered with the tokio runtime.
    #[error("cannot register the listener on {} with the runtime: {source}", path.display())]
    Register {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// Binds the socket at `path`: creates its directory (mode 0755) if missing,
/// replaces a stale socket (not a live one, nor a file that is not a socket)
/// and makes the socket mode 0666 and non-blocking. Returns the listener, its
/// path and the socket's (dev, inode), which tells our own socket from a
/// newer one at exit.
pub(crate) fn bind(path: &Path) -> Result<(StdUnixListener, PathBuf, (u64, u64)), CollectorError> {
    let path = path.to_owned();
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(dir)
                .map_err(|source| CollectorError::CreateDir {
                    path: dir.to_owned(),
                    source,
                })?;
            // The umask may have narrowed it; clients must reach the socket.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).map_err(
                |source| CollectorError::CreateDir {
                    path: dir.to_owned(),
                    source,
                },
            )?;
        }
    }
    remove_stale(&path)?;
    let listener = StdUnixListener::bind(&path).map_err(|source| CollectorError::Bind {
        path: path.clone(),
        source,
    })?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).map_err(|source| {
        CollectorError::Permissions {
            path: path.clone(),
            source,
        }
    })?;
    listener
        .set_nonblocking(true)
        .map_err(|source| CollectorError::Bind {
            path: path.clone(),
            source,
        })?;
    let meta = std::fs::symlink_metadata(&path).map_err(|source| CollectorError::Inspect {
        path: path.clone(),
        source,
    })?;
    Ok((listener, path, (meta.dev(), meta.ino())))
}

/// Makes a listener that is already bound ready to serve (non-blocking) and
/// returns the path that names it in logs.
pub(crate) fn adopt(listener: &StdUnixListener) -> Result<PathBuf, CollectorError> {
    // The path only names the socket in logs; an unnamed or abstract
    // socket has none, which is not a reason to refuse it.
    let path = listener
        .local_addr()
        .ok()
        .and_then(|addr| addr.as_pathname().map(Path::to_owned))
        .unwrap_or_else(|| PathBuf::from("(inherited socket)"));
    listener
        .set_nonblocking(true)
        .map_err(|source| CollectorError::Register {
            path: path.clone(),
            source,
        })?;
    Ok(path)
}

/// Removes the socket at `path` if it is still the one we bound (`identity`
/// is its (dev, inode)): a newer collector may have replaced it.
pub(crate) fn remove_own(path: &Path, identity: (u64, u64)) {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if (meta.dev(), meta.ino()) == identity {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Removes a socket nobody listens on; refuses anything else.
fn remove_stale(path: &Path) -> Result<(), CollectorError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(source) => {
            return Err(CollectorError::Inspect {
                path: path.to_owned(),
                source,
            })
        }
    };
    if !meta.file_type().is_socket() {
        return Err(CollectorError::NotASocket {
            path: path.to_owned(),
        });
    }
    match StdUnixStream::connect(path) {
        Ok(_) => Err(CollectorError::AlreadyRunning {
            path: path.to_owned(),
        }),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => std::fs::remove_file(path)
            .map_err(|source| CollectorError::RemoveStale {
                path: path.to_owned(),
                source,
            }),
        Err(source) => Err(CollectorError::Inspect {
            path: path.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use rdma_quota::tenant::TenantBy;
    use rdma_quota::Quotas;

    use crate::{Collector, CollectorError};

    #[test]
    fn bind_refuses_files_and_live_collectors_and_replaces_stale_sockets() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("file");
        std::fs::write(&file, "keep me").expect("write");
        let err = Collector::bind(&file, Quotas::default(), TenantBy::User).expect_err("file");
        assert!(matches!(err, CollectorError::NotASocket { .. }), "{err}");
        assert_eq!(
            std::fs::read_to_string(&file).expect("still there"),
            "keep me"
        );

        let nested = dir.path().join("a/b/collector.sock");
        let live = Collector::bind(&nested, Quotas::default(), TenantBy::User).expect("bind");
        let mode = |p: &Path| std::fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&nested), 0o666);
        assert_eq!(mode(&dir.path().join("a/b")), 0o755);
        let err = Collector::bind(&nested, Quotas::default(), TenantBy::User).expect_err("live");
        assert_eq!(
            err.to_string(),
            format!(
                "another collector is already listening on {}",
                nested.display()
            )
        );
        // A dead collector's socket is replaced. No other test may fork while it dies: a child
        // between fork and exec would keep it listening (see FORK_LOCK).
        let _fork = crate::FORK_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        drop(live);
        assert!(nested.exists());
        Collector::bind(&nested, Quotas::default(), TenantBy::User).expect("rebind over stale");
    }
}
