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

use std::ffi::{c_uint, c_void};
use std::io::Write;
use std::ptr;

use anyhow::{Context, Result};
use clap::{Parser, ValueEnum};
use secure_rdma_tests::dlverbs::{
    Destroy, QpCap, QpInitAttr, Resolve, Verbs, IBV_ACCESS_LOCAL_WRITE, IBV_QPT_RC,
};
use serde_json::{json, Value};

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
