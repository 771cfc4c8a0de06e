//! The user database, for `--tenant-by user`: the one libc call of the
//! tenant lookup ([`rdma_quota::tenant::identify`] takes it as a function,
//! so that `rdma-quota` stays free of libc).

use std::ffi::CStr;

/// The user name of `uid`, if the user database has one. Blocking: may ask
/// NSS (LDAP, sssd, ...), so call it off the async workers.
///
/// # Examples
///
/// ```
/// use rdma_collector::user_name;
///
/// // uid 0 is "root" in every user database this runs with.
/// assert_eq!(user_name(0).as_deref(), Some("root"));
/// ```
pub fn user_name(uid: u32) -> Option<String> {
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
        if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
            return None;
        }
        // SAFETY: pw_name points to a NUL-terminated string inside `buf`.
        let name = unsafe { CStr::from_ptr(pwd.pw_name) };
        return Some(name.to_string_lossy().into_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_and_unknown_uids() {
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(user_name(3_999_999_999), None);
    }
}
