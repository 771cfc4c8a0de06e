//! `verbs-churn`: an unmodified verbs program that floods the control path,
//! the noisy neighbour of the isolation lab tests
//! (tests/tests/isolation_lab.rs) and of scripts/bench-isolation.sh.
//!
//! For a fixed time (or until SIGTERM/SIGINT) it runs one kind of cycle in
//! a loop (`--kind`); a refused call is simply retried, as a careless
//! program would:
//! - `cq`: create a completion queue, destroy it;
//! - `qp`: create a CQ and an RC queue pair on it, destroy both;
//! - `mr`: register `--mr-size` bytes, deregister them;
//! - `pd`: open the device, allocate a protection domain, free it, close
//!   the device (context churn);
//! - `hoard`: create completion queues until it holds `--count` of them or
//!   one is refused, and hold them until the end (with the PD every kind
//!   allocates first: an rdma cgroup counts 1 + held objects).
//!
//! libibverbs is resolved through the global scope (`dlopen` with
//! `RTLD_GLOBAL`, then `dlsym(RTLD_DEFAULT, ...)`), the way the dynamic
//! linker binds a linked program's imports, so an `LD_PRELOAD` object
//! comes first. With `--bypass` it is opened privately instead (`RTLD_LOCAL
//! | RTLD_DEEPBIND`, then `dlsym(handle, ...)`): the lookup searches only
//! libibverbs and its dependencies, so a preloaded interceptor is never
//! called, which is what a program that wants to get around it does. No
//! link-time dependency on libibverbs, no C.
//!
//! Prints one JSON line at the end:
//! `{"kind":"cq","ok":N,"refused":N,"errno":{"122":N},"held":N,"elapsed_ms":N,"ok_at_ms":[...]}`,
//! where `ok` counts completed cycles (for `hoard`, objects created),
//! `held` what a hoarder holds at the end, and `ok_at_ms` the times (since
//! the start) of the successful cycles, for measuring a rate over a window
//! (left out with `--no-times`).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::{Parser, ValueEnum};
use serde_json::json;

/// What one cycle of the flood does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Kind {
    /// Create a completion queue, destroy it.
    Cq,
    /// Create a CQ and an RC QP on it, destroy both.
    Qp,
    /// Register --mr-size bytes, deregister them.
    Mr,
    /// Open the device, allocate a PD, free it, close the device.
    Pd,
    /// Create CQs up to --count (or the first refusal) and hold them.
    Hoard,
}

/// Floods the verbs control path with one kind of cycle, retrying refusals.
#[derive(Debug, Parser)]
struct Args {
    /// RDMA device.
    #[arg(long, default_value = "rxe-a")]
    device: String,
    /// How long to churn, in milliseconds (SIGTERM or SIGINT ends it
    /// earlier, with the report).
    #[arg(long, default_value_t = 5000)]
    millis: u64,
    /// What each cycle does.
    #[arg(long, value_enum, default_value = "cq")]
    kind: Kind,
    /// Bytes per memory region for `--kind mr`.
    #[arg(long, default_value_t = 4096)]
    mr_size: usize,
    /// How many CQs a hoarder creates and holds at most.
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// Resolve libibverbs privately (RTLD_LOCAL | RTLD_DEEPBIND), so an
    /// LD_PRELOAD interceptor is not called.
    #[arg(long)]
    bypass: bool,
    /// Leave the times of the successful cycles out of the report.
    #[arg(long)]
    no_times: bool,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
struct QpCap {
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
struct QpInitAttr {
    qp_context: *mut c_void,
    send_cq: *mut c_void,
    recv_cq: *mut c_void,
    srq: *mut c_void,
    cap: QpCap,
    qp_type: c_uint,
    sq_sig_all: c_int,
}

const IBV_QPT_RC: c_uint = 2;
const IBV_ACCESS_LOCAL_WRITE: c_int = 1;

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CreateCq =
    unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut c_void;
type Create = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void;
type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The libibverbs functions the floods call.
struct Verbs {
    get_list: GetDeviceList,
    free_list: FreeDeviceList,
    get_name: GetDeviceName,
    open: OpenDevice,
    close: Destroy,
    alloc_pd: Create,
    dealloc_pd: Destroy,
    create_cq: CreateCq,
    destroy_cq: Destroy,
    create_qp: CreateQp,
    destroy_qp: Destroy,
    reg_mr: RegMr,
    dereg_mr: Destroy,
}

impl Verbs {
    fn load(bypass: bool) -> Result<Verbs> {
        let mode = if bypass {
            libc::RTLD_NOW | libc::RTLD_LOCAL | libc::RTLD_DEEPBIND
        } else {
            libc::RTLD_NOW | libc::RTLD_GLOBAL
        };
        // SAFETY: loading a system library by soname.
        let handle = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), mode) };
        if handle.is_null() {
            bail!("cannot load libibverbs.so.1 (is rdma-core installed?)");
        }
        // A lookup through the handle searches libibverbs and its
        // dependencies only; the global scope puts LD_PRELOAD objects first.
        let scope = if bypass { handle } else { libc::RTLD_DEFAULT };
        let find = |name: &CStr| -> Result<*mut c_void> {
            // SAFETY: a lookup by a NUL-terminated name in a valid scope.
            let f = unsafe { libc::dlsym(scope, name.as_ptr()) };
            if f.is_null() {
                bail!("libibverbs has no {}", name.to_string_lossy());
            }
            Ok(f)
        };
        // SAFETY: each symbol is the libibverbs function whose C prototype
        // the target type mirrors.
        unsafe {
            use std::mem::transmute as t;
            Ok(Verbs {
                get_list: t::<*mut c_void, GetDeviceList>(find(c"ibv_get_device_list")?),
                free_list: t::<*mut c_void, FreeDeviceList>(find(c"ibv_free_device_list")?),
                get_name: t::<*mut c_void, GetDeviceName>(find(c"ibv_get_device_name")?),
                open: t::<*mut c_void, OpenDevice>(find(c"ibv_open_device")?),
                close: t::<*mut c_void, Destroy>(find(c"ibv_close_device")?),
                alloc_pd: t::<*mut c_void, Create>(find(c"ibv_alloc_pd")?),
                dealloc_pd: t::<*mut c_void, Destroy>(find(c"ibv_dealloc_pd")?),
                create_cq: t::<*mut c_void, CreateCq>(find(c"ibv_create_cq")?),
                destroy_cq: t::<*mut c_void, Destroy>(find(c"ibv_destroy_cq")?),
                create_qp: t::<*mut c_void, CreateQp>(find(c"ibv_create_qp")?),
                destroy_qp: t::<*mut c_void, Destroy>(find(c"ibv_destroy_qp")?),
                reg_mr: t::<*mut c_void, RegMr>(find(c"ibv_reg_mr")?),
                dereg_mr: t::<*mut c_void, Destroy>(find(c"ibv_dereg_mr")?),
            })
        }
    }

    /// Opens `name`; null if there is no such device or it cannot be opened.
    fn open_device(&self, name: &str) -> Result<*mut c_void> {
        let mut n: c_int = 0;
        // SAFETY: libibverbs calls with valid arguments; the list is freed below.
        unsafe {
            let list = (self.get_list)(&mut n);
            if list.is_null() {
                bail!(
                    "ibv_get_device_list failed: {}",
                    std::io::Error::last_os_error()
                );
            }
            let mut found = ptr::null_mut();
            for i in 0..usize::try_from(n).unwrap_or(0) {
                let dev = *list.add(i);
                if CStr::from_ptr((self.get_name)(dev)).to_bytes() == name.as_bytes() {
                    found = (self.open)(dev);
                    break;
                }
            }
            (self.free_list)(list);
            Ok(found)
        }
    }

    /// An RC QP on `pd` whose queues complete on `cq`; null if refused.
    fn qp(&self, pd: *mut c_void, cq: *mut c_void) -> *mut c_void {
        let mut attr = QpInitAttr {
            qp_context: ptr::null_mut(),
            send_cq: cq,
            recv_cq: cq,
            srq: ptr::null_mut(),
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: a valid PD and CQ, an initialised attribute struct.
        unsafe { (self.create_qp)(pd, &mut attr) }
    }
}

/// Set by SIGTERM/SIGINT: finish the cycle, report, exit.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: c_int) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("verbs-churn: error: {e:#}");
        std::process::exit(1);
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn check(what: &str, rc: c_int) -> Result<()> {
    if rc != 0 {
        bail!("{what} failed: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn run(args: &Args) -> Result<()> {
    // SAFETY: the handler only stores to an atomic, which is signal-safe.
    unsafe {
        let handler = on_signal as extern "C" fn(c_int) as libc::sighandler_t;
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
    let v = Verbs::load(args.bypass)?;
    let ctx = v.open_device(&args.device)?;
    if ctx.is_null() {
        bail!("cannot open RDMA device {}", args.device);
    }
    // SAFETY: a valid context.
    let pd = unsafe { (v.alloc_pd)(ctx) };
    if pd.is_null() {
        bail!("ibv_alloc_pd failed: {}", std::io::Error::last_os_error());
    }
    // The memory an MR cycle registers, allocated once: the flood is the
    // registration, not the allocation.
    let mut buffer = vec![
        0u8;
        if args.kind == Kind::Mr {
            args.mr_size
        } else {
            0
        }
    ];
    // Tells a test the flood is on (the device is open, the loop starts), and when, for
    // whoever measures how long a monitor takes to notice it (bench-isolation.sh).
    let unix_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    eprintln!(
        "verbs-churn: churning on {} ({:?}{}) at {unix_now:.3}",
        args.device,
        args.kind,
        if args.bypass { ", bypass" } else { "" }
    );
    let window = Duration::from_millis(args.millis);
    let started = Instant::now();
    let (mut ok, mut refused) = (0u64, 0u64);
    let mut errnos: BTreeMap<i32, u64> = BTreeMap::new();
    let mut ok_at_ms = Vec::new();
    let mut held: Vec<*mut c_void> = Vec::new();
    let mut hoarding = args.kind == Kind::Hoard;
    while started.elapsed() < window && !STOP.load(Ordering::Relaxed) {
        // Each arm: Ok(true) a cycle done, Ok(false) refused (errno kept).
        // SAFETY (all arms): libibverbs calls on the objects this loop made.
        let done = unsafe {
            match args.kind {
                Kind::Cq => {
                    let cq = (v.create_cq)(ctx, 16, ptr::null_mut(), ptr::null_mut(), 0);
                    !cq.is_null() && {
                        check("ibv_destroy_cq", (v.destroy_cq)(cq))?;
                        true
                    }
                }
                Kind::Qp => {
                    let cq = (v.create_cq)(ctx, 16, ptr::null_mut(), ptr::null_mut(), 0);
                    if cq.is_null() {
                        false
                    } else {
                        let qp = v.qp(pd, cq);
                        let errno = last_errno();
                        if !qp.is_null() {
                            check("ibv_destroy_qp", (v.destroy_qp)(qp))?;
                        }
                        check("ibv_destroy_cq", (v.destroy_cq)(cq))?;
                        if qp.is_null() {
                            // The QP's errno, not the CQ destruction's.
                            *errnos.entry(errno).or_default() += 1;
                            refused += 1;
                            continue;
                        }
                        true
                    }
                }
                Kind::Mr => {
                    let mr = (v.reg_mr)(
                        pd,
                        buffer.as_mut_ptr().cast(),
                        buffer.len(),
                        IBV_ACCESS_LOCAL_WRITE,
                    );
                    !mr.is_null() && {
                        check("ibv_dereg_mr", (v.dereg_mr)(mr))?;
                        true
                    }
                }
                Kind::Pd => {
                    let c = v.open_device(&args.device)?;
                    if c.is_null() {
                        false
                    } else {
                        let p = (v.alloc_pd)(c);
                        let errno = last_errno();
                        if !p.is_null() {
                            check("ibv_dealloc_pd", (v.dealloc_pd)(p))?;
                        }
                        check("ibv_close_device", (v.close)(c))?;
                        if p.is_null() {
                            *errnos.entry(errno).or_default() += 1;
                            refused += 1;
                            continue;
                        }
                        true
                    }
                }
                Kind::Hoard => {
                    if !hoarding {
                        // Holding: nothing to do but wait for the end.
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    let cq = (v.create_cq)(ctx, 16, ptr::null_mut(), ptr::null_mut(), 0);
                    if cq.is_null() {
                        // A hoarder takes what it can get and keeps it.
                        let errno = last_errno();
                        *errnos.entry(errno).or_default() += 1;
                        refused += 1;
                        hoarding = false;
                        // A test waits for this line.
                        eprintln!(
                            "verbs-churn: holding {} CQs (the next was refused: errno {errno})",
                            held.len()
                        );
                        continue;
                    }
                    held.push(cq);
                    if held.len() as u64 >= args.count {
                        hoarding = false;
                        eprintln!("verbs-churn: holding {} CQs", held.len());
                    }
                    true
                }
            }
        };
        if done {
            ok += 1;
            if !args.no_times {
                ok_at_ms.push(started.elapsed().as_secs_f64() * 1000.0);
            }
        } else {
            refused += 1;
            *errnos.entry(last_errno()).or_default() += 1;
        }
    }
    let held_count = held.len();
    // SAFETY: the objects this program made, destroyed once each.
    unsafe {
        for cq in held {
            check("ibv_destroy_cq", (v.destroy_cq)(cq))?;
        }
        check("ibv_dealloc_pd", (v.dealloc_pd)(pd))?;
        check("ibv_close_device", (v.close)(ctx))?;
    }
    drop(buffer);
    let errno: BTreeMap<String, u64> = errnos
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    let kind = format!("{:?}", args.kind).to_lowercase();
    let mut report = json!({
        "kind": kind,
        "ok": ok,
        "refused": refused,
        "errno": errno,
        "held": held_count,
        "elapsed_ms": started.elapsed().as_millis() as u64,
    });
    if !args.no_times {
        report["ok_at_ms"] = json!(ok_at_ms);
    }
    println!("{report}");
    Ok(())
}
