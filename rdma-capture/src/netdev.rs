//! Which netdev carries an rxe device's traffic.

use std::path::Path;

/// The netdev under an RDMA device (`/sys/class/infiniband/DEV/parent`, else the port-1 GID
/// table's first netdev).
pub fn netdev_of_rdma_device(dev: &str) -> Option<String> {
    let base = Path::new("/sys/class/infiniband").join(dev);
    if let Ok(s) = std::fs::read_to_string(base.join("parent")) {
        let s = s.trim();
        if !s.is_empty() {
            return Some(s.to_string());
        }
    }
    let ndevs = base.join("ports/1/gid_attrs/ndevs");
    for i in 0..16 {
        if let Ok(s) = std::fs::read_to_string(ndevs.join(i.to_string())) {
            let s = s.trim();
            if !s.is_empty() {
                return Some(s.to_string());
            }
        }
    }
    None
}

/// The interface index of a netdev, from `/sys/class/net/NAME/ifindex`.
pub fn ifindex_of(netdev: &str) -> Option<u32> {
    if netdev.is_empty() || netdev.contains('/') {
        return None;
    }
    std::fs::read_to_string(Path::new("/sys/class/net").join(netdev).join("ifindex"))
        .ok()?
        .trim()
        .parse()
        .ok()
}
