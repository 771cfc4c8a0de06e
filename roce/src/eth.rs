//! Ethernet II with an optional 802.1Q tag.

use std::fmt;

use serde::{Serialize, Serializer};

use crate::error::{DecodeError, NotRoce};
use crate::reader::{be16, sub, Reader};

/// Ethertype of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// Ethertype of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Ethertype (TPID) of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// Ethertype of RoCE v1 (IB GRH directly over Ethernet).
pub const ETHERTYPE_ROCE_V1: u16 = 0x8915;

/// A 48-bit MAC address, displayed and serialized as `aa:bb:cc:dd:ee:ff`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl fmt::Debug for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MacAddr({self})")
    }
}

impl Serialize for MacAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// An 802.1Q tag control field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct VlanTag {
    /// Priority code point (3 bits); RoCE deployments map traffic classes onto it for PFC.
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (12 bits).
    pub vid: u16,
}

/// An Ethernet II header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Ethernet {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC.
    pub src: MacAddr,
    /// The ethertype of the payload (after the VLAN tag, if any).
    #[serde(serialize_with = "crate::hex::u16")]
    pub ethertype: u16,
    /// The 802.1Q tag, if the frame carried one.
    pub vlan: Option<VlanTag>,
}

impl Ethernet {
    /// Length of the header on the wire: 14 bytes, 18 with a VLAN tag.
    pub fn header_len(&self) -> usize {
        if self.vlan.is_some() {
            18
        } else {
            14
        }
    }

    /// Reads the header and checks the payload is IPv4 or IPv6.
    pub(crate) fn parse(r: &mut Reader<'_>) -> Result<Ethernet, DecodeError> {
        let h: &[u8; 14] = r.array("Ethernet header")?;
        let (dst, src) = (MacAddr(sub(h, 0)), MacAddr(sub(h, 6)));
        let mut ethertype = be16([h[12], h[13]]);
        let mut vlan = None;
        if ethertype == ETHERTYPE_VLAN {
            let t: &[u8; 4] = r.array("802.1Q tag")?;
            let tci = be16([t[0], t[1]]);
            vlan = Some(VlanTag {
                pcp: (tci >> 13) as u8,
                dei: tci & 0x1000 != 0,
                vid: tci & 0x0fff,
            });
            ethertype = be16([t[2], t[3]]);
        }
        match ethertype {
            ETHERTYPE_IPV4 | ETHERTYPE_IPV6 => Ok(Ethernet {
                dst,
                src,
                ethertype,
                vlan,
            }),
            ETHERTYPE_ROCE_V1 => Err(DecodeError::NotRoce(NotRoce::RoceV1)),
            other => Err(DecodeError::UnsupportedEthertype(other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_tagged() {
        let mut f = vec![0xff; 6];
        f.extend([2, 0, 0, 0, 0, 1, 0x08, 0x00]);
        let e = Ethernet::parse(&mut Reader::new(&f, 0)).unwrap();
        assert_eq!(e.src.to_string(), "02:00:00:00:00:01");
        assert_eq!(e.ethertype, ETHERTYPE_IPV4);
        assert_eq!((e.vlan, e.header_len()), (None, 14));

        let mut t = f[..12].to_vec();
        t.extend([0x81, 0x00, 0x70, 0x64, 0x86, 0xdd]);
        let e = Ethernet::parse(&mut Reader::new(&t, 0)).unwrap();
        assert_eq!(
            e.vlan,
            Some(VlanTag {
                pcp: 3,
                dei: true,
                vid: 100
            })
        );
        assert_eq!((e.ethertype, e.header_len()), (ETHERTYPE_IPV6, 18));
    }

    #[test]
    fn other_ethertypes() {
        let mut f = vec![0; 12];
        f.extend([0x08, 0x06]);
        assert_eq!(
            Ethernet::parse(&mut Reader::new(&f, 0)),
            Err(DecodeError::UnsupportedEthertype(0x0806))
        );
        f[12..].copy_from_slice(&[0x89, 0x15]);
        assert_eq!(
            Ethernet::parse(&mut Reader::new(&f, 0)),
            Err(DecodeError::NotRoce(NotRoce::RoceV1))
        );
        f[12..].copy_from_slice(&[0x81, 0x00]);
        assert!(matches!(
            Ethernet::parse(&mut Reader::new(&f, 0)),
            Err(DecodeError::Truncated {
                layer: "802.1Q tag",
                offset: 14,
                ..
            })
        ));
    }
}
