//! The user database, for `--tenant-by user`: the one libc call of the
//! tenant lookup ([`rdma_quota::tenant::identify`] takes it as a function,
//! so that `rdma-quota` stays free of libc).

use std::ffi::CStr;
use std::io;

/// The user name of `uid`: `Ok(None)` if the user database has no entry, an
/// error if it could not be asked (no file descriptor left, NSS down), so
/// that a lookup failure is never taken for "no such user". Blocking: may
/// ask NSS (LDAP, sssd, ...), so call it off the async workers.
///
/// # Examples
///
/// ```
/// use rdma_collector::user_name;
///
/// // uid 0 is "root" in every user database this runs with.
/// assert_eq!(user_name(0)?.as_deref(), Some("root"));
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn user_name(uid: u32) -> io::Result<Option<String>> {
    let mut buf = vec![0u8; 1024];
    loop {
        // SAFETY: all-zero is a valid passwd; getpwuid_r fills it with
        // pointers into `buf`, which outlives their use below.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = unsafe {
            libc::getpwuid_r(
                uid,
                &mut pwd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        if rc == libc::ERANGE && buf.len() < 1 << 20 {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        // getpwuid_r(3): 0, ENOENT, ESRCH, EBADF or EPERM with no result all
        // mean "not found"; anything else (EMFILE, EIO, ...) is a failure.
        if result.is_null() || pwd.pw_name.is_null() {
            return match rc {
                0 | libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => Ok(None),
                e => Err(io::Error::from_raw_os_error(e)),
            };
        }
        // SAFETY: pw_name points to a NUL-terminated string inside `buf`.
        let name = unsafe { CStr::from_ptr(pwd.pw_name) };
        return Ok(Some(name.to_string_lossy().into_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown_uids() {
        assert_eq!(user_name(0).expect("lookup").as_deref(), Some("root"));
        assert_eq!(user_name(3_999_999_999).expect("lookup"), None);
    }
}
