//! `verbs-flood`: opens an RDMA device and creates N PDs, CQs, QPs and MRs
//! through plain libibverbs calls, reporting which succeeded and which
//! failed with which errno. The "attacker" of the interceptor's lab test
//! (tests/tests/intercept_lab.rs): one process asking for more than its
//! quota.
//!
//! libibverbs is resolved at run time, the way the dynamic linker binds the
//! imports of a normally linked program (`--resolve global`: `dlopen` with
//! `RTLD_GLOBAL`, then `dlsym(RTLD_DEFAULT, ...)`, so an `LD_PRELOAD` object
//! comes first), or the way the `sideway` crate does it (`--resolve
//! private`: `RTLD_LOCAL` and `dlsym(handle, ...)`, which `LD_PRELOAD`
//! cannot see). No link-time dependency on libibverbs, no C.
//!
//! Prints one JSON line after creating (`{"pid":..,"qp":{"ok":N,"errno":[..]},..}`),
//! one more after `--destroy`, then exits, or with `--hold` waits to be
//! killed while holding whatever it still has.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::io::Write;
use std::ptr;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Resolve {
    /// Through the global scope, like a linked program's imports.
    Global,
    /// Through a private RTLD_LOCAL handle, like sideway.
    Private,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum MrCall {
    /// `ibv_reg_mr` (what ibv_rc_pingpong imports).
    RegMr,
    /// `ibv_reg_mr_iova2` (what perftest imports).
    RegMrIova2,
}

/// Creates many RDMA resources and reports what the library allowed.
#[derive(Debug, Parser)]
struct Args {
    /// RDMA device.
    #[arg(long, default_value = "rxe-a")]
    device: String,
    /// How to find libibverbs' functions.
    #[arg(long, value_enum, default_value = "global")]
    resolve: Resolve,
    /// Protection domains to allocate (the first one hosts the QPs and MRs).
    #[arg(long, default_value_t = 1)]
    pds: usize,
    /// Completion queues to create (the first one serves the QPs).
    #[arg(long, default_value_t = 1)]
    cqs: usize,
    /// RC queue pairs to create.
    #[arg(long, default_value_t = 0)]
    qps: usize,
    /// Memory regions to register.
    #[arg(long, default_value_t = 0)]
    mrs: usize,
    /// Bytes per memory region.
    #[arg(long, default_value_t = 4096)]
    mr_size: usize,
    /// Which registration call to use.
    #[arg(long, value_enum, default_value = "reg-mr")]
    mr_call: MrCall,
    /// Destroy everything after the report (and print a second report).
    #[arg(long)]
    destroy: bool,
    /// Then wait until killed instead of exiting.
    #[arg(long)]
    hold: bool,
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
type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CreateCq =
    unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
type CreateQp = unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut c_void;
type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void;
type RegMrIova2 = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64, c_uint) -> *mut c_void;
type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;

struct Verbs {
    get_device_list: GetDeviceList,
    free_device_list: FreeDeviceList,
    get_device_name: GetDeviceName,
    open_device: OpenDevice,
    close_device: CloseDevice,
    alloc_pd: AllocPd,
    dealloc_pd: Destroy,
    create_cq: CreateCq,
    destroy_cq: Destroy,
    create_qp: CreateQp,
    destroy_qp: Destroy,
    reg_mr: RegMr,
    reg_mr_iova2: RegMrIova2,
    dereg_mr: Destroy,
}

impl Verbs {
    fn load(resolve: Resolve) -> Result<Verbs> {
        let mode = match resolve {
            Resolve::Global => libc::RTLD_NOW | libc::RTLD_GLOBAL,
            Resolve::Private => libc::RTLD_NOW | libc::RTLD_LOCAL,
        };
        // SAFETY: loading a system library by soname.
        let handle = unsafe { libc::dlopen(c"libibverbs.so.1".as_ptr(), mode) };
        if handle.is_null() {
            bail!("cannot load libibverbs.so.1 (is rdma-core installed?)");
        }
        let scope = match resolve {
            Resolve::Global => libc::RTLD_DEFAULT,
            Resolve::Private => handle,
        };
        let find = |name: &str| -> Result<*mut c_void> {
            let c = CString::new(name).context("symbol name")?;
            // SAFETY: a lookup in a valid handle or the global scope.
            let f = unsafe { libc::dlsym(scope, c.as_ptr()) };
            if f.is_null() {
                bail!("libibverbs has no {name}");
            }
            Ok(f)
        };
        // SAFETY: each symbol is the libibverbs function whose C prototype
        // the target type mirrors.
        unsafe {
            use std::mem::transmute as t;
            Ok(Verbs {
                get_device_list: t::<*mut c_void, GetDeviceList>(find("ibv_get_device_list")?),
                free_device_list: t::<*mut c_void, FreeDeviceList>(find("ibv_free_device_list")?),
                get_device_name: t::<*mut c_void, GetDeviceName>(find("ibv_get_device_name")?),
                open_device: t::<*mut c_void, OpenDevice>(find("ibv_open_device")?),
                close_device: t::<*mut c_void, CloseDevice>(find("ibv_close_device")?),
                alloc_pd: t::<*mut c_void, AllocPd>(find("ibv_alloc_pd")?),
                dealloc_pd: t::<*mut c_void, Destroy>(find("ibv_dealloc_pd")?),
                create_cq: t::<*mut c_void, CreateCq>(find("ibv_create_cq")?),
                destroy_cq: t::<*mut c_void, Destroy>(find("ibv_destroy_cq")?),
                create_qp: t::<*mut c_void, CreateQp>(find("ibv_create_qp")?),
                destroy_qp: t::<*mut c_void, Destroy>(find("ibv_destroy_qp")?),
                reg_mr: t::<*mut c_void, RegMr>(find("ibv_reg_mr")?),
                reg_mr_iova2: t::<*mut c_void, RegMrIova2>(find("ibv_reg_mr_iova2")?),
                dereg_mr: t::<*mut c_void, Destroy>(find("ibv_dereg_mr")?),
            })
        }
    }

    fn open(&self, name: &str) -> Result<*mut c_void> {
        let mut n: c_int = 0;
        // SAFETY: libibverbs calls with valid arguments; the list is freed below.
        unsafe {
            let list = (self.get_device_list)(&mut n);
            if list.is_null() {
                bail!(
                    "ibv_get_device_list failed: {}",
                    std::io::Error::last_os_error()
                );
            }
            let mut found = ptr::null_mut();
            for i in 0..usize::try_from(n).unwrap_or(0) {
                let dev = *list.add(i);
                let dev_name = CStr::from_ptr((self.get_device_name)(dev));
                if dev_name.to_bytes() == name.as_bytes() {
                    found = (self.open_device)(dev);
                    break;
                }
            }
            (self.free_device_list)(list);
            if found.is_null() {
                bail!("cannot open RDMA device {name}");
            }
            Ok(found)
        }
    }
}

/// What one kind of creation gave: objects made and the errno of each failure.
#[derive(Default)]
struct Tally {
    made: Vec<*mut c_void>,
    errnos: Vec<i32>,
    skipped: usize,
}

impl Tally {
    fn record(&mut self, what: &str, i: usize, object: *mut c_void) {
        if object.is_null() {
            let err = std::io::Error::last_os_error();
            eprintln!("verbs-flood: {what} #{i} failed: {err}");
            self.errnos.push(err.raw_os_error().unwrap_or(0));
        } else {
            self.made.push(object);
        }
    }

    fn json(&self) -> Value {
        json!({"ok": self.made.len(), "errno": self.errnos, "skipped": self.skipped})
    }

    /// Destroys everything made, returning how many destroys failed.
    fn destroy(&mut self, f: Destroy) -> usize {
        let mut failed = 0;
        for object in self.made.drain(..).rev() {
            // SAFETY: an object this program created and still owns.
            if unsafe { f(object) } != 0 {
                failed += 1;
            }
        }
        failed
    }
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("verbs-flood: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<()> {
    let verbs = Verbs::load(args.resolve)?;
    let ctx = verbs.open(&args.device)?;
    let (mut pds, mut cqs, mut qps, mut mrs) = (
        Tally::default(),
        Tally::default(),
        Tally::default(),
        Tally::default(),
    );
    // SAFETY (whole block): libibverbs calls on objects this program owns,
    // with arguments valid for their C prototypes.
    let mut buffers: Vec<Vec<u8>> = Vec::new();
    unsafe {
        for i in 0..args.pds {
            pds.record("ibv_alloc_pd", i, (verbs.alloc_pd)(ctx));
        }
        for i in 0..args.cqs {
            let cq = (verbs.create_cq)(ctx, 16, ptr::null_mut(), ptr::null_mut(), 0);
            cqs.record("ibv_create_cq", i, cq);
        }
        match (pds.made.first(), cqs.made.first()) {
            (Some(&pd), Some(&cq)) => {
                for i in 0..args.qps {
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
                    qps.record("ibv_create_qp", i, (verbs.create_qp)(pd, &mut attr));
                }
            }
            _ => qps.skipped = args.qps,
        }
        match pds.made.first() {
            Some(&pd) => {
                for i in 0..args.mrs {
                    let mut buf = vec![0u8; args.mr_size];
                    let addr = buf.as_mut_ptr().cast::<c_void>();
                    let mr = match args.mr_call {
                        MrCall::RegMr => {
                            (verbs.reg_mr)(pd, addr, args.mr_size, IBV_ACCESS_LOCAL_WRITE)
                        }
                        MrCall::RegMrIova2 => (verbs.reg_mr_iova2)(
                            pd,
                            addr,
                            args.mr_size,
                            addr as u64,
                            IBV_ACCESS_LOCAL_WRITE as c_uint,
                        ),
                    };
                    mrs.record("MR registration", i, mr);
                    buffers.push(buf);
                }
            }
            None => mrs.skipped = args.mrs,
        }
    }
    let report = json!({
        "pid": std::process::id(),
        "resolve": format!("{:?}", args.resolve).to_lowercase(),
        "pd": pds.json(),
        "cq": cqs.json(),
        "qp": qps.json(),
        "mr": mrs.json(),
    });
    print_line(&report)?;
    if args.destroy {
        let failed = json!({
            "qp": qps.destroy(verbs.destroy_qp),
            "mr": mrs.destroy(verbs.dereg_mr),
            "cq": cqs.destroy(verbs.destroy_cq),
            "pd": pds.destroy(verbs.dealloc_pd),
        });
        print_line(&json!({"destroyed": true, "failed": failed}))?;
    }
    if args.hold {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    // SAFETY: every object on the context was destroyed, or the process
    // exits now and the kernel cleans up.
    unsafe { (verbs.close_device)(ctx) };
    drop(buffers);
    Ok(())
}

/// Prints one report line on stdout, after a marker on stderr: a reader that has the marker
/// has every line written to stderr before the report.
fn print_line(value: &Value) -> Result<()> {
    eprintln!("verbs-flood: report");
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}").context("writing the report")?;
    out.flush().context("writing the report")
}
