//! The file `rdma-capture -w` writes: created private (0600), never through a symlink, and
//! removed again unless the capture completes.
//!
//! A capture holds every tenant's payloads, so the file must not be world-readable, and
//! `rdma-capture` usually runs as root, so a symlink planted at the path must not make it
//! overwrite another file.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Why the output file cannot be created.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The path is a symbolic link; writing would go to wherever it points.
    #[error(
        "{} is a symbolic link; refusing to follow it (remove it or write elsewhere)",
        path.display()
    )]
    Symlink {
        /// The path given.
        path: PathBuf,
    },
    /// Something other than a regular file is at the path.
    #[error("{} exists and is not a regular file; refusing to replace it", path.display())]
    NotAFile {
        /// The path given.
        path: PathBuf,
    },
    /// Creating the file (or replacing the old one) failed.
    #[error("cannot create {}: {source}", path.display())]
    Create {
        /// The path given.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// A capture file being written. Dropping it without [`keep`](Self::keep) removes the file,
/// so a capture that fails (a write error, bad arguments found after opening) leaves nothing
/// half-written behind.
///
/// # Examples
///
/// ```
/// use std::io::Write;
/// use std::os::unix::fs::PermissionsExt;
/// use rdma_capture::output::OutputFile;
///
/// let dir = tempfile::tempdir()?;
/// let path = dir.path().join("out.pcap");
/// let (guard, mut file) = OutputFile::create(&path)?;
/// file.write_all(b"packets")?;
/// assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o777, 0o600);
/// guard.keep();
/// assert!(path.exists());
///
/// let failed = dir.path().join("failed.pcap");
/// let (guard, _file) = OutputFile::create(&failed)?;
/// drop(guard); // an error before keep()
/// assert!(!failed.exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct OutputFile {
    path: PathBuf,
    /// (device, inode) of the file we created: only that is removed.
    identity: (u64, u64),
    keep: bool,
}

impl OutputFile {
    /// Creates `path` with mode 0600, returning the guard and the open file.
    ///
    /// A symlink at `path` is refused (even one to a file we could write); an existing
    /// regular file is replaced by a new one (not reused, so its old mode does not carry
    /// over); anything else is refused. The file is opened with `O_CREAT | O_EXCL |
    /// O_NOFOLLOW`, so a symlink planted between the check and the open is refused too.
    pub fn create(path: &Path) -> Result<(OutputFile, File), OutputError> {
        let create_error = |source| OutputError::Create {
            path: path.to_owned(),
            source,
        };
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(OutputError::Symlink {
                    path: path.to_owned(),
                })
            }
            Ok(meta) if meta.file_type().is_file() => {
                std::fs::remove_file(path).map_err(create_error)?;
            }
            Ok(_) => {
                return Err(OutputError::NotAFile {
                    path: path.to_owned(),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(create_error(e)),
        }
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.file_type().is_symlink() => OutputError::Symlink {
                    path: path.to_owned(),
                },
                _ => create_error(e),
            })?;
        let meta = file.metadata().map_err(create_error)?;
        let guard = OutputFile {
            path: path.to_owned(),
            identity: (meta.dev(), meta.ino()),
            keep: false,
        };
        Ok((guard, file))
    }

    /// The capture completed: keep the file.
    pub fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        // Only the file we made: if something else was put at the path meanwhile, it stays.
        if let Ok(meta) = std::fs::symlink_metadata(&self.path) {
            if (meta.dev(), meta.ino()) == self.identity {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn refuses_symlinks_and_other_files() {
        let dir = tempfile::tempdir().expect("temp dir");
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").expect("target");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        let err = OutputFile::create(&link).expect_err("symlink");
        assert!(matches!(err, OutputError::Symlink { .. }), "{err}");
        assert!(err.to_string().contains("symbolic link"), "{err}");
        // A dangling symlink too: O_CREAT would create its target.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).expect("symlink");
        assert!(matches!(
            OutputFile::create(&dangling),
            Err(OutputError::Symlink { .. })
        ));
        assert!(!dir.path().join("nowhere").exists());
        assert!(matches!(
            OutputFile::create(dir.path()),
            Err(OutputError::NotAFile { .. })
        ));
        assert_eq!(std::fs::read(&target).expect("target"), b"keep");
    }

    #[test]
    fn replaces_a_regular_file_with_a_private_one() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("old.pcap");
        std::fs::write(&path, b"old contents").expect("old");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let (guard, file) = OutputFile::create(&path).expect("create");
        assert_eq!(file.metadata().expect("stat").len(), 0);
        assert_eq!(
            std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777,
            0o600
        );
        guard.keep();
        assert!(path.exists());
    }
}
