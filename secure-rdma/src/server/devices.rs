//! Which RDMA device and GID serve a connection: [`Devices`] opens each
//! device once and remembers the GID chosen per local address.
//!
//! Opening a device and reading its GID table are the slow parts of finding
//! where a client's QP lives; a server does them once, not per handshake.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use crate::verbs::{Device, GidEntry, GidSelector, VerbsError};

/// Opens each RDMA device once and finds the GID for a local address.
pub(super) struct Devices {
    fixed: Option<Arc<Device>>,
    gid_index: Option<u32>,
    cache: Mutex<HashMap<String, Arc<Device>>>,
    /// The device and GID last chosen for each local address. Reading the whole GID table per
    /// connection cost most of a millisecond of every handshake; a cached choice is checked
    /// with one query instead, and chosen afresh when its entry changed.
    chosen: Mutex<HashMap<IpAddr, (Arc<Device>, GidEntry)>>,
}

impl Devices {
    /// `fixed` serves every connection when given (a configured device); otherwise the device
    /// carrying each connection's local address does. `gid_index` picks a GID by index instead
    /// of by address.
    pub(super) fn new(fixed: Option<Arc<Device>>, gid_index: Option<u32>) -> Devices {
        Devices {
            fixed,
            gid_index,
            cache: Mutex::new(HashMap::new()),
            chosen: Mutex::new(HashMap::new()),
        }
    }

    /// The device and GID for a connection to `local`, from the cache while its GID is still
    /// where it was.
    pub(super) fn resolve(&self, local: IpAddr) -> Result<(Arc<Device>, GidEntry), VerbsError> {
        let cached = self
            .chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&local)
            .cloned();
        if let Some((dev, gid)) = cached {
            if dev.gid_still_at(&gid) {
                return Ok((dev, gid));
            }
            tracing::info!(device = dev.name(), %local, index = gid.index, "GID table changed; choosing the GID again");
        }
        let (dev, gid) = self.choose(local)?;
        self.chosen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(local, (Arc::clone(&dev), gid.clone()));
        Ok((dev, gid))
    }

    /// The device and GID for connections to `local`, from the GID tables.
    fn choose(&self, local: IpAddr) -> Result<(Arc<Device>, GidEntry), VerbsError> {
        let selector = match self.gid_index {
            Some(i) => GidSelector::Index(i),
            None => GidSelector::Address(local),
        };
        if let Some(dev) = &self.fixed {
            let gid = dev.select_gid(&selector)?;
            return Ok((Arc::clone(dev), gid));
        }
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        for dev in cache.values() {
            if let Ok(gid) = dev.select_gid(&selector) {
                return Ok((Arc::clone(dev), gid));
            }
        }
        let (dev, gid) = Device::open_for_address(local)?;
        let dev = Arc::clone(
            cache
                .entry(dev.name().to_owned())
                .or_insert_with(|| Arc::clone(&dev)),
        );
        Ok((dev, gid))
    }
}
