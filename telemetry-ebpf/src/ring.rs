//! Waiting on a BPF ring buffer from a blocking loop.

use std::os::fd::RawFd;
use std::time::Duration;

/// Blocks until `fd` (a ring buffer map) is readable, `timeout` passes, or a
/// signal arrives; which one does not matter, since callers drain the ring
/// afterwards either way.
pub fn wait_readable(fd: RawFd, timeout: Duration) {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: one valid pollfd for the duration of the call; EINTR simply returns early.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}
