//! The connecting process, pinned: a pidfd for the peer, so that what
//! `/proc/<pid>` showed can be checked to belong to it.
//!
//! `SO_PEERCRED` gives the pid at `connect`; by the time the collector reads
//! `/proc/<pid>/cgroup` that process may have exited and its pid been reused
//! by another, whose cgroup would be taken for the peer's. A pidfd refers to
//! one process for good: after reading `/proc/<pid>`, a pidfd that still
//! names a live process proves the pid was not recycled meanwhile (a pid is
//! only reused once its process has been reaped).
//!
//! `SO_PEERPIDFD` (Linux 6.5) gives the pidfd of the process that connected,
//! taken by the kernel at `connect`, so nothing races. On older kernels the
//! collector falls back to `pidfd_open(pid)` right after `accept`, which
//! closes the window from then on but not between `connect` and `accept`.
//! Without either (before Linux 5.3) only `SO_PEERCRED` is left.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `SO_PEERPIDFD` from `<asm-generic/socket.h>` (x86, arm, riscv...); the
/// libc crate does not have it yet.
const SO_PEERPIDFD: libc::c_int = 77;

/// How the peer's pidfd was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PidfdSource {
    /// `SO_PEERPIDFD`: the process that connected, race-free.
    PeerPidfd,
    /// `pidfd_open` after `accept` (no `SO_PEERPIDFD` in this kernel).
    PidfdOpen,
    /// No pidfd support: identity rests on `SO_PEERCRED` alone.
    None,
}

impl PidfdSource {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            PidfdSource::PeerPidfd => {
                "SO_PEERPIDFD: the connecting process is pinned by a pidfd; a recycled pid is detected"
            }
            PidfdSource::PidfdOpen => {
                "no SO_PEERPIDFD (Linux < 6.5): pidfd_open after accept; a pid recycled before accept \
                 goes unnoticed"
            }
            PidfdSource::None => {
                "no pidfds (Linux < 5.3): identity from SO_PEERCRED and /proc only; pid reuse goes \
                 unnoticed"
            }
        }
    }
}

/// The peer's pidfd, or why there is none. `Err` if the peer has already
/// exited (`ESRCH`): it cannot be identified.
pub(crate) fn pidfd(
    socket: BorrowedFd<'_>,
    pid: u32,
) -> io::Result<(Option<OwnedFd>, PidfdSource)> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `fd`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc == 0 && fd >= 0 {
        // SAFETY: the kernel gave us this new descriptor; we own it.
        return Ok((
            Some(unsafe { OwnedFd::from_raw_fd(fd) }),
            PidfdSource::PeerPidfd,
        ));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ESRCH) {
        return Err(err);
    }
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return Ok((None, PidfdSource::None));
    };
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd >= 0 {
        let fd =
            libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
        // SAFETY: as above.
        return Ok((
            Some(unsafe { OwnedFd::from_raw_fd(fd) }),
            PidfdSource::PidfdOpen,
        ));
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::ESRCH) => Err(err),
        // EMFILE and the like are failures, not a lack of support.
        Some(libc::ENOSYS) => Ok((None, PidfdSource::None)),
        _ => Err(err),
    }
}

/// Whether the process behind `pidfd` has not been reaped yet (a zombie
/// still holds its pid, so it counts as alive).
pub(crate) fn alive(pidfd: BorrowedFd<'_>) -> bool {
    // SAFETY: signal 0 only checks; a null info and zero flags are valid.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    // EPERM: alive but not ours to signal.
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_socketpair_peer_is_this_process_and_alive() {
        let (a, _b) = UnixStream::pair().expect("socketpair");
        let (fd, source) = pidfd(a.as_fd(), std::process::id()).expect("pidfd");
        // This kernel decides which; both must give a live pidfd for ourselves.
        assert_ne!(source, PidfdSource::None, "{}", source.describe());
        let fd = fd.expect("pidfd");
        assert!(alive(fd.as_fd()));
    }

    #[test]
    fn a_reaped_process_is_not_alive() {
        // Held until spawn returns, which is after the child's exec (see FORK_LOCK).
        let fork = crate::FORK_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        drop(fork);
        let pid = child.id();
        // SAFETY: pidfd_open on our own child, before reaping it.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        assert!(fd >= 0, "pidfd_open: {}", io::Error::last_os_error());
        // SAFETY: the new descriptor is ours.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        child.wait().expect("wait");
        assert!(!alive(fd.as_fd()));
    }
}
