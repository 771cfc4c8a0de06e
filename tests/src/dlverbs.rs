//! libibverbs resolved at run time, without a link-time dependency or C: the functions the
//! lab's unmodified verbs programs (`verbs-flood`, `verbs-churn`) call, looked up the way the
//! dynamic linker binds a linked program's imports (so an `LD_PRELOAD` object comes first) or
//! the way the `sideway` crate does (which `LD_PRELOAD` cannot see).

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::ptr;

use anyhow::{bail, Context, Result};

/// How the functions are looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Resolve {
    /// `dlopen` with `RTLD_GLOBAL`, then `dlsym(RTLD_DEFAULT, ...)`: through the global scope,
    /// like a linked program's imports; an `LD_PRELOAD` object comes first.
    Global,
    /// `RTLD_LOCAL` and `dlsym(handle, ...)`, like sideway: `LD_PRELOAD` cannot see it.
    Private,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
pub struct QpCap {
    /// Send work requests.
    pub max_send_wr: u32,
    /// Receive work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather elements per send.
    pub max_send_sge: u32,
    /// Scatter/gather elements per receive.
    pub max_recv_sge: u32,
    /// Inline data bytes.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct QpInitAttr {
    /// User context.
    pub qp_context: *mut c_void,
    /// Send completion queue.
    pub send_cq: *mut c_void,
    /// Receive completion queue.
    pub recv_cq: *mut c_void,
    /// Shared receive queue (null: none).
    pub srq: *mut c_void,
    /// Capacities.
    pub cap: QpCap,
    /// `IBV_QPT_*`.
    pub qp_type: c_uint,
    /// Signal every send.
    pub sq_sig_all: c_int,
}

/// `IBV_QPT_RC`.
pub const IBV_QPT_RC: c_uint = 2;
/// `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;

/// `ibv_get_device_list`.
pub type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
/// `ibv_free_device_list`.
pub type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
/// `ibv_get_device_name`.
pub type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
/// `ibv_open_device`.
pub type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
/// `ibv_close_device`.
pub type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `ibv_alloc_pd`.
pub type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
/// `ibv_create_cq`.
pub type CreateCq =
    unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void;
/// `ibv_create_qp`.
pub type CreateQp = unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut c_void;
/// `ibv_reg_mr`.
pub type RegMr = unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void;
/// `ibv_reg_mr_iova2`.
pub type RegMrIova2 =
    unsafe extern "C" fn(*mut c_void, *mut c_void, usize, u64, c_uint) -> *mut c_void;
/// the ibv_destroy_*, ibv_dealloc_pd and ibv_dereg_mr functions.
pub type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;

/// The libibverbs functions the lab programs call, resolved at run time.
pub struct Verbs {
    /// `ibv_get_device_list`.
    pub get_device_list: GetDeviceList,
    /// `ibv_free_device_list`.
    pub free_device_list: FreeDeviceList,
    /// `ibv_get_device_name`.
    pub get_device_name: GetDeviceName,
    /// `ibv_open_device`.
    pub open_device: OpenDevice,
    /// `ibv_close_device`.
    pub close_device: CloseDevice,
    /// `ibv_alloc_pd`.
    pub alloc_pd: AllocPd,
    /// `ibv_dealloc_pd`.
    pub dealloc_pd: Destroy,
    /// `ibv_create_cq`.
    pub create_cq: CreateCq,
    /// `ibv_destroy_cq`.
    pub destroy_cq: Destroy,
    /// `ibv_create_qp`.
    pub create_qp: CreateQp,
    /// `ibv_destroy_qp`.
    pub destroy_qp: Destroy,
    /// `ibv_reg_mr`.
    pub reg_mr: RegMr,
    /// `ibv_reg_mr_iova2`.
    pub reg_mr_iova2: RegMrIova2,
    /// `ibv_dereg_mr`.
    pub dereg_mr: Destroy,
}

impl Verbs {
    /// Loads libibverbs.so.1 and resolves its functions as `resolve` says.
    pub fn load(resolve: Resolve) -> Result<Verbs> {
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

    /// Opens the RDMA device `name`: its context.
    pub fn open(&self, name: &str) -> Result<*mut c_void> {
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
