//! The device context, its GID table and protection domains.

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceCapabilityFlags, DeviceContext, Mtu};
use sideway::ibverbs::protection_domain::ProtectionDomain as SwPd;

use super::gid::{select_gid, Gid, GidEntry, GidKind, GidSelector};
use super::VerbsError;

/// The port every queue pair here uses. Soft-RoCE and most RoCE NICs expose
/// one port per device; multi-port HCAs show up as several devices on RoCE.
pub const PORT: u8 = 1;

/// Where the kernel publishes RDMA devices and loaded modules.
pub const SYSFS: &str = "/sys";

/// Whether this host can do RDMA at all, as sysfs tells: the first thing a user whose
/// connections fail needs to know, and what to do about it.
///
/// ```
/// use secure_rdma::verbs::{Availability, Device};
///
/// match Device::availability() {
///     Availability::Devices(names) => println!("RDMA devices: {}", names.join(", ")),
///     missing => eprintln!("{missing}"), // the problem and its fix
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    /// RDMA devices are registered; their names, sorted.
    Devices(Vec<String>),
    /// The kernel has RDMA support (its RDMA core is loaded) but no device is registered:
    /// create one (Soft-RoCE on any Ethernet interface).
    NoDevice,
    /// The kernel has no RDMA support loaded: no `/sys/class/infiniband`, no `ib_core` module.
    NoKernelSupport,
}

impl Availability {
    /// Whether there is at least one device.
    pub fn is_available(&self) -> bool {
        matches!(self, Availability::Devices(_))
    }
}

impl std::fmt::Display for Availability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Availability::Devices(names) => write!(f, "RDMA devices: {}", names.join(", ")),
            Availability::NoDevice => f.write_str(
                "the kernel supports RDMA but there is no RDMA device: create a Soft-RoCE device \
                 with `sudo scripts/setup-softroce.sh --netdev IFACE` or \
                 `sudo rdma link add rxe0 type rxe netdev IFACE` (IFACE: the interface that \
                 carries the address clients connect to)",
            ),
            Availability::NoKernelSupport => f.write_str(
                "the kernel has no RDMA support loaded (no /sys/class/infiniband): load Soft-RoCE \
                 with `sudo modprobe rdma_rxe` (Ubuntu: package linux-modules-extra-$(uname -r)), \
                 then create a device with `sudo scripts/setup-softroce.sh --netdev IFACE`; if \
                 modprobe finds no rdma_rxe, this kernel was built without RDMA, and a container \
                 needs its host to do this",
            ),
        }
    }
}

/// An open RDMA device context, shared by every connection of a process.
///
/// ```no_run
/// use secure_rdma::verbs::{Device, GidSelector};
/// let dev = Device::open(Some("rxe-a"))?;
/// let gid = dev.select_gid(&GidSelector::Netdev("veth-a".into()))?;
/// println!("{} sends from {}", dev.name(), gid);
/// # Ok::<(), secure_rdma::verbs::VerbsError>(())
/// ```
pub struct Device {
    name: String,
    ctx: Arc<DeviceContext>,
    /// Whether the device binds type 2 memory windows, asked once (`ibv_query_device_ex`).
    type2_windows: std::sync::OnceLock<bool>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("name", &self.name).finish()
    }
}

fn device_names(list: &DeviceList) -> Vec<String> {
    list.iter().map(|d| d.name()).collect()
}

fn list_devices() -> Result<DeviceList, VerbsError> {
    DeviceList::new().map_err(|e| VerbsError::DeviceList(e.into()))
}

impl Device {
    /// Whether this host has RDMA devices, and if not, whether its kernel has RDMA support;
    /// reads [`SYSFS`]. Needs no privileges and no libibverbs.
    ///
    /// ```
    /// use secure_rdma::verbs::Device;
    ///
    /// let here = Device::availability();
    /// if !here.is_available() {
    ///     eprintln!("{here}");
    /// }
    /// ```
    pub fn availability() -> Availability {
        Self::availability_at(Path::new(SYSFS))
    }

    /// [`Device::availability`] with sysfs mounted at `sys` (a test's fake tree, a container's
    /// view of the host).
    ///
    /// ```
    /// use secure_rdma::verbs::{Availability, Device};
    ///
    /// let empty = std::env::temp_dir().join("no-such-sysfs");
    /// assert_eq!(Device::availability_at(&empty), Availability::NoKernelSupport);
    /// ```
    pub fn availability_at(sys: &Path) -> Availability {
        // The RDMA core (ib_core) creates the class directory when it loads, and each device
        // appears in it; a module directory alone (built in, or loaded with the class
        // directory hidden from a container) still means the kernel has RDMA.
        let mut names: Vec<String> = match std::fs::read_dir(sys.join("class/infiniband")) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) if sys.join("module/ib_core").exists() => Vec::new(),
            Err(_) => return Availability::NoKernelSupport,
        };
        if names.is_empty() {
            return Availability::NoDevice;
        }
        names.sort();
        Availability::Devices(names)
    }

    /// Names of the RDMA devices present.
    pub fn names() -> Result<Vec<String>, VerbsError> {
        Ok(device_names(&list_devices()?))
    }

    /// Opens the named device, or the first one when `name` is `None`.
    pub fn open(name: Option<&str>) -> Result<Arc<Device>, VerbsError> {
        let list = list_devices()?;
        let dev = match name {
            Some(wanted) => list.iter().find(|d| d.name() == wanted).ok_or_else(|| {
                let names = device_names(&list);
                VerbsError::DeviceNotFound {
                    name: wanted.to_owned(),
                    available: if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    },
                }
            })?,
            None => list.iter().next().ok_or(VerbsError::NoDevice)?,
        };
        let name = dev.name();
        let ctx = dev
            .open()
            .map_err(|e| VerbsError::verb("ibv_open_device", &name, e))?;
        Ok(Arc::new(Device {
            name,
            ctx,
            type2_windows: std::sync::OnceLock::new(),
        }))
    }

    /// Finds the device carrying a RoCEv2 GID for `addr` (the local address
    /// of the control connection) and returns it with that GID entry.
    pub fn open_for_address(addr: IpAddr) -> Result<(Arc<Device>, GidEntry), VerbsError> {
        let names = Self::names()?;
        if names.is_empty() {
            return Err(VerbsError::NoDevice);
        }
        let mut details = Vec::new();
        for name in names {
            let dev = Self::open(Some(&name))?;
            match dev.select_gid(&GidSelector::Address(addr)) {
                Ok(gid) => return Ok((dev, gid)),
                Err(VerbsError::Gid(e)) => details.push(e.to_string()),
                Err(other) => details.push(format!("{name}: {other}")),
            }
        }
        Err(VerbsError::NoDeviceForAddress {
            addr,
            details: details.join(" | "),
        })
    }

    /// The device name, e.g. `rxe-a` or `mlx5_0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn context(&self) -> &Arc<DeviceContext> {
        &self.ctx
    }

    /// The device's GID table (empty slots included, as the device lists them).
    pub fn gid_table(&self) -> Result<Vec<GidEntry>, VerbsError> {
        let entries = self
            .ctx
            .query_gid_table()
            .map_err(|e| VerbsError::verb("ibv_query_gid_table", &self.name, e))?;
        let ethernet = self
            .ctx
            .query_port(PORT)
            .map(|p| p.link_layer() == sideway::ibverbs::device_context::LinkLayer::Ethernet)
            .unwrap_or(true);
        let mut table = Vec::with_capacity(entries.len());
        for e in entries {
            let port = u8::try_from(e.port_num()).unwrap_or(PORT);
            // sideway's GidType conversion panics on types it does not know;
            // ask for the raw (sysfs) value instead.
            let kind = match self.ctx.query_gid_type(port, e.gid_index()) {
                Ok(t) => kind_from_sysfs(t, ethernet),
                Err(_) => GidKind::Other(u32::MAX),
            };
            table.push(GidEntry {
                index: e.gid_index(),
                port,
                gid: Gid(e.gid().raw),
                kind,
                netdev: e.netdev_name().ok(),
            });
        }
        Ok(table)
    }

    /// Picks a GID with `selector`; the error lists the available GIDs.
    pub fn select_gid(&self, selector: &GidSelector) -> Result<GidEntry, VerbsError> {
        let table = self.gid_table()?;
        Ok(select_gid(&self.name, &table, selector)?)
    }

    /// Whether `entry` is still in the GID table at its index: one `ibv_query_gid_ex`, where
    /// [`Device::gid_table`] also reads each entry's type and netdev from sysfs (under
    /// emulation, most of a millisecond). An address removed or moved changes the entry.
    pub fn gid_still_at(&self, entry: &GidEntry) -> bool {
        self.ctx
            .query_gid_ex(entry.port, entry.index)
            .is_ok_and(|now| Gid(now.gid().raw) == entry.gid)
    }

    /// The active MTU of the port, the largest path MTU worth using.
    pub fn active_mtu(&self) -> Result<PathMtu, VerbsError> {
        let port = self
            .ctx
            .query_port(PORT)
            .map_err(|e| VerbsError::verb("ibv_query_port", &self.name, e))?;
        Ok(PathMtu::from_sideway(port.active_mtu()))
    }

    /// Whether the device has type 2 memory windows (`IBV_DEVICE_MEM_WINDOW_TYPE_2B`), which
    /// [`MemoryWindow`](super::MemoryWindow) needs. Asked once per device; a device that cannot
    /// be queried counts as without them.
    pub fn has_type2_windows(&self) -> bool {
        *self.type2_windows.get_or_init(|| match self.ctx.query_device() {
            Ok(attr) => attr
                .device_cap_flags()
                .contains(DeviceCapabilityFlags::MemoryWindowType2B),
            Err(e) => {
                tracing::debug!(device = %self.name, error = %e, "ibv_query_device_ex failed: no memory windows");
                false
            }
        })
    }

    /// Allocates a protection domain on this device.
    pub fn alloc_pd(self: &Arc<Self>) -> Result<Arc<ProtectionDomain>, VerbsError> {
        let pd = self
            .ctx
            .alloc_pd()
            .map_err(|e| VerbsError::verb("ibv_alloc_pd", &self.name, e))?;
        Ok(Arc::new(ProtectionDomain {
            pd,
            device: Arc::clone(self),
        }))
    }
}

/// `ibv_query_gid_type` reports the sysfs encoding, where 0 means "IB or
/// RoCEv1" (told apart by the port's link layer) and 1 means RoCEv2.
fn kind_from_sysfs(raw: u32, ethernet: bool) -> GidKind {
    use rdma_mummy_sys::{IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2};
    match raw {
        IBV_GID_TYPE_SYSFS_IB_ROCE_V1 if ethernet => GidKind::RoceV1,
        IBV_GID_TYPE_SYSFS_IB_ROCE_V1 => GidKind::InfiniBand,
        IBV_GID_TYPE_SYSFS_ROCE_V2 => GidKind::RoceV2,
        other => GidKind::Other(other),
    }
}

/// A protection domain: the scope in which queue pairs may use memory
/// regions. Every connection gets its own, so one tenant's rkeys are
/// meaningless on another tenant's queue pair.
pub struct ProtectionDomain {
    pub(crate) pd: Arc<SwPd>,
    pub(crate) device: Arc<Device>,
}

impl ProtectionDomain {
    /// The device this domain belongs to.
    pub fn device(&self) -> &Arc<Device> {
        &self.device
    }
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.device.name)
            .finish()
    }
}

/// Path MTU of an RC connection (payload bytes per packet).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "u32", into = "u32")]
pub enum PathMtu {
    /// 256 bytes.
    Mtu256,
    /// 512 bytes.
    Mtu512,
    /// 1024 bytes: what Soft-RoCE on a 1500-byte netdev supports.
    Mtu1024,
    /// 2048 bytes.
    Mtu2048,
    /// 4096 bytes.
    Mtu4096,
}

impl PathMtu {
    /// Size in bytes.
    pub fn bytes(self) -> u32 {
        match self {
            PathMtu::Mtu256 => 256,
            PathMtu::Mtu512 => 512,
            PathMtu::Mtu1024 => 1024,
            PathMtu::Mtu2048 => 2048,
            PathMtu::Mtu4096 => 4096,
        }
    }

    fn from_sideway(m: Mtu) -> Self {
        match m {
            Mtu::Mtu256 => PathMtu::Mtu256,
            Mtu::Mtu512 => PathMtu::Mtu512,
            Mtu::Mtu1024 => PathMtu::Mtu1024,
            Mtu::Mtu2048 => PathMtu::Mtu2048,
            Mtu::Mtu4096 => PathMtu::Mtu4096,
        }
    }

    pub(crate) fn to_raw(self) -> rdma_mummy_sys::ibv_mtu::Type {
        use rdma_mummy_sys::ibv_mtu;
        match self {
            PathMtu::Mtu256 => ibv_mtu::IBV_MTU_256,
            PathMtu::Mtu512 => ibv_mtu::IBV_MTU_512,
            PathMtu::Mtu1024 => ibv_mtu::IBV_MTU_1024,
            PathMtu::Mtu2048 => ibv_mtu::IBV_MTU_2048,
            PathMtu::Mtu4096 => ibv_mtu::IBV_MTU_4096,
        }
    }
}

impl TryFrom<u32> for PathMtu {
    type Error = String;
    fn try_from(bytes: u32) -> Result<Self, String> {
        Ok(match bytes {
            256 => PathMtu::Mtu256,
            512 => PathMtu::Mtu512,
            1024 => PathMtu::Mtu1024,
            2048 => PathMtu::Mtu2048,
            4096 => PathMtu::Mtu4096,
            other => {
                return Err(format!(
                    "path MTU {other} is not one of 256, 512, 1024, 2048, 4096"
                ))
            }
        })
    }
}

impl From<PathMtu> for u32 {
    fn from(m: PathMtu) -> u32 {
        m.bytes()
    }
}

impl std::fmt::Display for PathMtu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_mtu_accepts_only_ib_sizes() {
        for ok in [256u32, 512, 1024, 2048, 4096] {
            assert_eq!(PathMtu::try_from(ok).unwrap().bytes(), ok);
        }
        for bad in [0u32, 1500, 9000, 8192] {
            let err = PathMtu::try_from(bad).unwrap_err();
            assert!(err.contains(&bad.to_string()), "{err}");
        }
    }

    #[test]
    fn availability_tells_no_kernel_support_from_no_device() {
        let sys = tempfile::tempdir().expect("tempdir");
        let at = || Device::availability_at(sys.path());
        // Nothing RDMA in sysfs: the kernel has no RDMA support loaded; the fix loads it.
        let none = at();
        assert_eq!(none, Availability::NoKernelSupport);
        assert!(!none.is_available());
        let text = none.to_string();
        assert!(text.contains("modprobe rdma_rxe"), "{text}");
        assert!(text.contains("scripts/setup-softroce.sh"), "{text}");
        // ib_core loaded (or built in) without the class directory: RDMA, no device.
        std::fs::create_dir_all(sys.path().join("module/ib_core")).unwrap();
        assert_eq!(at(), Availability::NoDevice);
        // The class directory, empty: RDMA, no device; the fix creates one.
        std::fs::create_dir_all(sys.path().join("class/infiniband")).unwrap();
        let no_device = at();
        assert_eq!(no_device, Availability::NoDevice);
        let text = no_device.to_string();
        assert!(text.contains("scripts/setup-softroce.sh"), "{text}");
        assert!(
            text.contains("rdma link add rxe0 type rxe netdev IFACE"),
            "{text}"
        );
        assert!(!text.contains("modprobe"), "{text}");
        // Devices, listed sorted.
        for name in ["rxe-b", "rxe-a"] {
            std::fs::create_dir(sys.path().join("class/infiniband").join(name)).unwrap();
        }
        let found = at();
        assert_eq!(
            found,
            Availability::Devices(vec!["rxe-a".into(), "rxe-b".into()])
        );
        assert!(found.is_available());
    }

    #[test]
    fn gid_kind_from_raw_never_panics() {
        assert_eq!(kind_from_sysfs(1, true), GidKind::RoceV2);
        assert_eq!(kind_from_sysfs(0, true), GidKind::RoceV1);
        assert_eq!(kind_from_sysfs(0, false), GidKind::InfiniBand);
        assert_eq!(kind_from_sysfs(77, true), GidKind::Other(77));
    }
}
