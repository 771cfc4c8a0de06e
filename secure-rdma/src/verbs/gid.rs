//! GIDs and the choice of the RoCEv2 GID a queue pair sends from.
//!
//! On RoCE a GID is an IP address (IPv4 ones are IPv4-mapped IPv6). A device
//! lists several per port: link-local IPv6 ones, RoCEv1 and RoCEv2 variants of
//! each address. Hard-coding index 0 (as much RDMA sample code does) picks a
//! RoCEv1 link-local GID on most hosts, which then fails to route. Selection
//! here is explicit and pure, so it is unit-tested over tables of GIDs.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A 128-bit global identifier, shown and parsed as an IPv6 address.
///
/// ```
/// use secure_rdma::verbs::Gid;
/// use std::net::Ipv4Addr;
/// let gid = Gid::from(Ipv4Addr::new(10, 77, 0, 1));
/// assert_eq!(gid.to_string(), "::ffff:10.77.0.1");
/// assert_eq!("::ffff:10.77.0.1".parse::<Gid>().unwrap(), gid);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID marks an empty table slot; it is never a valid peer.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// The IP address this GID stands for (IPv4 when IPv4-mapped).
    pub fn ip(&self) -> IpAddr {
        let v6 = Ipv6Addr::from(self.0);
        match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        }
    }

    /// True when this RoCEv2 GID is `addr` (IPv4 addresses compare with
    /// their IPv4-mapped form, in either spelling).
    ///
    /// ```
    /// use secure_rdma::verbs::Gid;
    ///
    /// let gid: Gid = "::ffff:10.77.0.2".parse().unwrap();
    /// assert!(gid.carries("10.77.0.2".parse().unwrap()));
    /// assert!(gid.carries("::ffff:10.77.0.2".parse().unwrap()));
    /// assert!(!gid.carries("10.77.0.1".parse().unwrap()));
    /// ```
    pub fn carries(&self, addr: IpAddr) -> bool {
        let canonical = |ip: IpAddr| match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        canonical(self.ip()) == canonical(addr)
    }
}

impl From<Ipv4Addr> for Gid {
    fn from(ip: Ipv4Addr) -> Self {
        Gid(ip.to_ipv6_mapped().octets())
    }
}

impl From<IpAddr> for Gid {
    fn from(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => v4.into(),
            IpAddr::V6(v6) => Gid(v6.octets()),
        }
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Ipv6Addr::from(self.0), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// A string was not a GID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a GID (expected an IPv6 address such as ::ffff:10.77.0.1)")]
pub struct ParseGidError(pub String);

impl FromStr for Gid {
    type Err = ParseGidError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ipv6Addr::from_str(s)
            .map(|ip| Gid(ip.octets()))
            .map_err(|_| ParseGidError(s.to_owned()))
    }
}

impl From<Gid> for String {
    fn from(gid: Gid) -> String {
        gid.to_string()
    }
}

impl TryFrom<String> for Gid {
    type Error = ParseGidError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// The wire format a GID entry selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GidKind {
    /// Native InfiniBand.
    InfiniBand,
    /// RoCE v1: raw Ethernet, not routable.
    RoceV1,
    /// RoCE v2: UDP/IP on port 4791, what Soft-RoCE and routed fabrics use.
    RoceV2,
    /// A type this library does not know (the raw value).
    Other(u32),
}

impl fmt::Display for GidKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidKind::InfiniBand => f.write_str("IB"),
            GidKind::RoceV1 => f.write_str("RoCEv1"),
            GidKind::RoceV2 => f.write_str("RoCEv2"),
            GidKind::Other(v) => write!(f, "type {v}"),
        }
    }
}

/// One row of a device's GID table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GidEntry {
    /// Index to pass as the source GID index.
    pub index: u32,
    /// Port the entry belongs to (1-based).
    pub port: u8,
    /// The GID itself.
    pub gid: Gid,
    /// RoCEv1, RoCEv2, …
    pub kind: GidKind,
    /// Name of the network device the GID belongs to, when it has one.
    pub netdev: Option<String>,
}

impl fmt::Display for GidEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "index {} port {} {} {} on {}",
            self.index,
            self.port,
            self.kind,
            self.gid,
            self.netdev.as_deref().unwrap_or("-")
        )
    }
}

/// How to pick the GID a queue pair sends from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GidSelector {
    /// Exactly this index (must exist and not be empty).
    Index(u32),
    /// The RoCEv2 GID carrying this IP address: the address the control
    /// connection uses, so RDMA traffic follows the same route as TLS.
    Address(IpAddr),
    /// The RoCEv2 GID of an IPv4 address on this network device (IPv4 first,
    /// because IPv4-mapped GIDs route like the IPv4 address).
    Netdev(String),
    /// The first RoCEv2 GID that is not link-local.
    FirstRoceV2,
}

impl fmt::Display for GidSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GidSelector::Index(i) => write!(f, "GID index {i}"),
            GidSelector::Address(ip) => write!(f, "RoCEv2 GID for address {ip}"),
            GidSelector::Netdev(dev) => write!(f, "RoCEv2 GID on netdev {dev}"),
            GidSelector::FirstRoceV2 => f.write_str("routable RoCEv2 GID"),
        }
    }
}

/// No GID matched a [`GidSelector`]; the message lists what the device has.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("device {device} has no {wanted}; available GIDs: {}", list(.available))]
pub struct NoMatchingGid {
    /// The RDMA device searched.
    pub device: String,
    /// What was asked for.
    pub wanted: GidSelector,
    /// The device's non-empty GID entries.
    pub available: Vec<GidEntry>,
}

fn list(entries: &[GidEntry]) -> String {
    if entries.is_empty() {
        return "none".to_owned();
    }
    entries
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

fn link_local(gid: &Gid) -> bool {
    gid.0[0] == 0xfe && gid.0[1] & 0xc0 == 0x80
}

/// Picks the entry matching `selector` from a device's GID table.
///
/// ```
/// use secure_rdma::verbs::{select_gid, Gid, GidEntry, GidKind, GidSelector};
/// use std::net::Ipv4Addr;
/// let table = vec![GidEntry {
///     index: 1,
///     port: 1,
///     gid: Gid::from(Ipv4Addr::new(10, 77, 0, 1)),
///     kind: GidKind::RoceV2,
///     netdev: Some("veth-a".into()),
/// }];
/// let sel = GidSelector::Address(Ipv4Addr::new(10, 77, 0, 1).into());
/// assert_eq!(select_gid("rxe-a", &table, &sel).unwrap().index, 1);
/// ```
pub fn select_gid(
    device: &str,
    table: &[GidEntry],
    selector: &GidSelector,
) -> Result<GidEntry, NoMatchingGid> {
    let usable = || table.iter().filter(|e| !e.gid.is_zero());
    let roce_v2 = || usable().filter(|e| e.kind == GidKind::RoceV2);
    let found = match selector {
        GidSelector::Index(i) => usable().find(|e| e.index == *i),
        GidSelector::Address(ip) => {
            let want = Gid::from(*ip);
            roce_v2().find(|e| e.gid == want)
        }
        GidSelector::Netdev(dev) => {
            let on_dev = || roce_v2().filter(|e| e.netdev.as_deref() == Some(dev.as_str()));
            on_dev()
                .find(|e| e.gid.ip().is_ipv4())
                .or_else(|| on_dev().find(|e| !link_local(&e.gid)))
        }
        GidSelector::FirstRoceV2 => roce_v2()
            .find(|e| e.gid.ip().is_ipv4())
            .or_else(|| roce_v2().find(|e| !link_local(&e.gid))),
    };
    found.cloned().ok_or_else(|| NoMatchingGid {
        device: device.to_owned(),
        wanted: selector.clone(),
        available: usable().cloned().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u32, gid: &str, kind: GidKind, netdev: &str) -> GidEntry {
        GidEntry {
            index,
            port: 1,
            gid: gid.parse().unwrap(),
            kind,
            netdev: Some(netdev.to_owned()),
        }
    }

    /// The table rxe-a shows in the lab, plus an unrelated IPv6 address and an
    /// empty slot.
    fn lab_table() -> Vec<GidEntry> {
        vec![
            entry(0, "fe80::d8dd:d9ff:feb1:c4a1", GidKind::RoceV2, "veth-a"),
            entry(1, "::ffff:10.77.0.1", GidKind::RoceV2, "veth-a"),
            entry(2, "fd00::1", GidKind::RoceV1, "veth-a"),
            entry(3, "fd00::1", GidKind::RoceV2, "veth-a"),
            entry(4, "::", GidKind::RoceV2, "veth-a"),
            entry(5, "::ffff:192.168.1.5", GidKind::RoceV1, "eth9"),
            entry(6, "::ffff:192.168.1.5", GidKind::RoceV2, "eth9"),
        ]
    }

    #[test]
    fn address_picks_the_roce_v2_entry_of_that_address() {
        let t = lab_table();
        let ip: IpAddr = "10.77.0.1".parse().unwrap();
        assert_eq!(
            select_gid("rxe-a", &t, &GidSelector::Address(ip))
                .unwrap()
                .index,
            1
        );
        let ip: IpAddr = "192.168.1.5".parse().unwrap();
        // index 5 is the RoCEv1 twin of the same address: must be skipped
        assert_eq!(
            select_gid("rxe-a", &t, &GidSelector::Address(ip))
                .unwrap()
                .index,
            6
        );
        let ip6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(
            select_gid("rxe-a", &t, &GidSelector::Address(ip6))
                .unwrap()
                .index,
            3
        );
    }

    #[test]
    fn netdev_prefers_ipv4_then_global_ipv6() {
        let t = lab_table();
        let sel = GidSelector::Netdev("veth-a".into());
        assert_eq!(select_gid("rxe-a", &t, &sel).unwrap().index, 1);
        let only_v6: Vec<_> = t.iter().filter(|e| e.index != 1).cloned().collect();
        assert_eq!(select_gid("rxe-a", &only_v6, &sel).unwrap().index, 3);
        assert_eq!(
            select_gid("rxe-a", &t, &GidSelector::Netdev("eth9".into()))
                .unwrap()
                .index,
            6
        );
    }

    #[test]
    fn explicit_index_must_exist_and_not_be_empty() {
        let t = lab_table();
        assert_eq!(
            select_gid("rxe-a", &t, &GidSelector::Index(2))
                .unwrap()
                .kind,
            GidKind::RoceV1
        );
        assert!(select_gid("rxe-a", &t, &GidSelector::Index(4)).is_err());
        assert!(select_gid("rxe-a", &t, &GidSelector::Index(99)).is_err());
    }

    #[test]
    fn first_roce_v2_skips_link_local() {
        let t = lab_table();
        assert_eq!(
            select_gid("rxe-a", &t, &GidSelector::FirstRoceV2)
                .unwrap()
                .index,
            1
        );
        let ll_only = vec![entry(0, "fe80::1", GidKind::RoceV2, "veth-a")];
        assert!(select_gid("rxe-a", &ll_only, &GidSelector::FirstRoceV2).is_err());
    }

    #[test]
    fn no_match_lists_available_gids_with_type_and_netdev() {
        let t = lab_table();
        let ip: IpAddr = "10.77.0.2".parse().unwrap();
        let err = select_gid("rxe-a", &t, &GidSelector::Address(ip)).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("device rxe-a has no RoCEv2 GID for address 10.77.0.2"),
            "{msg}"
        );
        assert!(
            msg.contains("index 1 port 1 RoCEv2 ::ffff:10.77.0.1 on veth-a"),
            "{msg}"
        );
        assert!(msg.contains("index 5 port 1 RoCEv1"), "{msg}");
        // the empty slot is not "available"
        assert!(!msg.contains("index 4"), "{msg}");
        assert_eq!(err.available.len(), 6);
    }

    #[test]
    fn empty_table_says_none() {
        let err = select_gid("rxe-a", &[], &GidSelector::FirstRoceV2).unwrap_err();
        assert!(err.to_string().ends_with("available GIDs: none"));
    }

    #[test]
    fn gid_parses_and_prints_as_ipv6() {
        let g: Gid = "::ffff:10.77.0.2".parse().unwrap();
        assert_eq!(g.ip(), "10.77.0.2".parse::<IpAddr>().unwrap());
        assert!("10.77.0.2.".parse::<Gid>().is_err());
        assert_eq!(serde_json::to_string(&g).unwrap(), "\"::ffff:10.77.0.2\"");
        assert!(serde_json::from_str::<Gid>("\"nonsense\"").is_err());
    }
}
