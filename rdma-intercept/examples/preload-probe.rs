//! Calls one creating libibverbs function with null objects and reports the
//! result, for the host tests of the preloaded interceptor (tests/preload.rs).
//!
//! Only meaningful when the interceptor refuses the call: the real function
//! would dereference the null objects. libibverbs is resolved the way a
//! linked program's imports are, through the global scope, so an `LD_PRELOAD`
//! object comes first.
//!
//! Usage: `preload-probe create_qp|alloc_pd|create_cq|reg_mr|reg_mr_iova2 [--fork | --repeat N]`.
//! Prints `null errno=N` or `object`; exits 2 if libibverbs cannot be loaded.
//! With `--fork` it calls once, forks, and calls again in the child, which
//! prints `child null errno=N` and its pid. With `--repeat N` it calls N
//! times in a row, as a program retrying a refused call would, printing one
//! line per call and then `elapsed_ms=T`, the time all the calls took.

use std::ffi::{c_int, c_void, CString};
use std::process::ExitCode;

fn main() -> ExitCode {
    let Some(call) = std::env::args().nth(1) else {
        eprintln!("usage: preload-probe create_qp|alloc_pd|create_cq|reg_mr|reg_mr_iova2");
        return ExitCode::from(2);
    };
    // SAFETY: loading a system library by soname.
    let lib = unsafe {
        libc::dlopen(
            c"libibverbs.so.1".as_ptr(),
            libc::RTLD_NOW | libc::RTLD_GLOBAL,
        )
    };
    if lib.is_null() {
        eprintln!("preload-probe: libibverbs.so.1 is not installed");
        return ExitCode::from(2);
    }
    let Ok(name) = CString::new(format!("ibv_{call}")) else {
        eprintln!("preload-probe: bad call name");
        return ExitCode::from(2);
    };
    // SAFETY: RTLD_DEFAULT searches the global scope, as the loader does.
    let f = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if f.is_null() {
        eprintln!("preload-probe: no symbol {call}");
        return ExitCode::from(2);
    }
    let fork = std::env::args().nth(2).as_deref() == Some("--fork");
    if std::env::args().nth(2).as_deref() == Some("--repeat") {
        let Some(n) = std::env::args().nth(3).and_then(|n| n.parse::<u32>().ok()) else {
            eprintln!("preload-probe: --repeat needs a count");
            return ExitCode::from(2);
        };
        let started = std::time::Instant::now();
        let mut lines = Vec::new();
        for _ in 0..n {
            let Some(result) = call_once(&call, f) else {
                eprintln!("preload-probe: unknown call {call}");
                return ExitCode::from(2);
            };
            lines.push(result);
        }
        let elapsed = started.elapsed();
        for line in lines {
            println!("{line}");
        }
        println!("elapsed_ms={}", elapsed.as_millis());
        return ExitCode::SUCCESS;
    }
    let Some(first) = call_once(&call, f) else {
        eprintln!("preload-probe: unknown call {call}");
        return ExitCode::from(2);
    };
    println!("{first}");
    if fork {
        // SAFETY: the child only calls the hook, prints and exits.
        match unsafe { libc::fork() } {
            0 => {
                let again = call_once(&call, f).unwrap_or_default();
                println!("child {again} pid={}", std::process::id());
                // SAFETY: leave without running the parent's atexit handlers.
                unsafe { libc::_exit(0) };
            }
            child if child > 0 => {
                let mut status = 0;
                // SAFETY: waiting for our own child.
                unsafe { libc::waitpid(child, &mut status, 0) };
            }
            _ => {
                eprintln!("preload-probe: fork: {}", std::io::Error::last_os_error());
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}

/// Calls `f` as the function `call` names; `None` for an unknown name.
fn call_once(call: &str, f: *mut c_void) -> Option<String> {
    type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
    type CreateQp = unsafe extern "C" fn(*mut c_void, *mut c_void) -> *mut c_void;
    type CreateCq =
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
    type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void;
    type RegMrIova2 =
        unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64, u32) -> *mut c_void;
    let mut buf = vec![0u8; 4096];
    let (addr, len) = (buf.as_mut_ptr().cast::<c_void>(), buf.len());
    let null = std::ptr::null_mut::<c_void>();
    // SAFETY: each transmute matches the C prototype of that function; the
    // null objects are never dereferenced when the interceptor refuses.
    let object = unsafe {
        use std::mem::transmute;
        match call {
            "alloc_pd" => transmute::<*mut c_void, AllocPd>(f)(null),
            "create_qp" => transmute::<*mut c_void, CreateQp>(f)(null, null),
            "create_cq" => transmute::<*mut c_void, CreateCq>(f)(null, 16, null, null, 0),
            "reg_mr" => transmute::<*mut c_void, RegMr>(f)(null, addr, len, 0),
            "reg_mr_iova2" => transmute::<*mut c_void, RegMrIova2>(f)(null, addr, len, 0, 0),
            _ => return None,
        }
    };
    let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
    Some(if object.is_null() {
        format!("null errno={errno}")
    } else {
        "object".to_owned()
    })
}
