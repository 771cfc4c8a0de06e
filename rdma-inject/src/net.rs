//! The network side: one interface, an AF_PACKET socket that sends whole Ethernet frames out
//! of it, and one that sees every frame on it in both directions.
//!
//! The sending socket is bound to the interface with protocol 0, so it receives nothing, and
//! every frame names that interface again in `sendto`: nothing can leave through another
//! one. The observing socket is bound to the same interface with `ETH_P_ALL`; it is handed
//! incoming frames and, as `PACKET_OUTGOING`, the frames the host itself sends — the
//! requester's own packets when the attacker sits on the requester's link (the lab's
//! `veth-b`).
//!
//! Both need `CAP_NET_RAW`; without it opening them fails with
//! [`NetError::NotPermitted`], before anything is learned or sent.

use std::ffi::CString;
use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use roce::MacAddr;

use crate::mac::{parse_mac, MacError};

/// Interface names are at most `IFNAMSIZ - 1` bytes.
const MAX_IFNAME: usize = libc::IFNAMSIZ - 1;
/// Room for the largest frame an interface with a jumbo MTU passes, plus headers.
const RECV_BUF: usize = 65_536 + 64;
/// The observer's socket buffer: a burst while the learner is busy must not be dropped.
const RCVBUF_BYTES: libc::c_int = 4 << 20;

/// Why the network side failed. Each variant says how to fix it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetError {
    /// No permission to open a packet socket: the program needs `CAP_NET_RAW` (root has it).
    #[error("opening an AF_PACKET socket needs CAP_NET_RAW")]
    NotPermitted,
    /// No interface of that name.
    #[error("no network interface named {0:?}: `ip link` lists them")]
    NoSuchInterface(String),
    /// A name no interface can have.
    #[error("{name:?} cannot be an interface name: {reason}")]
    BadInterfaceName {
        /// The name given.
        name: String,
        /// Why not.
        reason: &'static str,
    },
    /// A socket call failed.
    #[error("{what} on {iface}: {source}")]
    Io {
        /// The call, e.g. "sending a frame".
        what: &'static str,
        /// The interface.
        iface: String,
        /// The error the kernel returned.
        #[source]
        source: io::Error,
    },
    /// The interface's MAC could not be read.
    #[error("reading the MAC address of {iface} from {path}: {source}")]
    ReadMac {
        /// The interface.
        iface: String,
        /// The sysfs file.
        path: String,
        /// Why not.
        #[source]
        source: io::Error,
    },
    /// The interface's MAC in sysfs did not parse.
    #[error("the MAC address sysfs shows for {iface}: {source}")]
    BadMac {
        /// The interface.
        iface: String,
        /// Why it did not parse.
        #[source]
        source: MacError,
    },
}

/// A network interface, by name and index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Interface {
    name: String,
    index: u32,
}

impl Interface {
    /// Looks an interface up by name.
    ///
    /// ```
    /// use rdma_inject::net::Interface;
    ///
    /// let err = Interface::by_name("no-such-if0").unwrap_err();
    /// assert!(err.to_string().contains("no network interface named \"no-such-if0\""));
    /// ```
    pub fn by_name(name: &str) -> Result<Interface, NetError> {
        let bad = |reason| NetError::BadInterfaceName {
            name: name.to_owned(),
            reason,
        };
        if name.is_empty() {
            return Err(bad("it is empty"));
        }
        if name.len() > MAX_IFNAME {
            return Err(bad("longer than the 15 bytes Linux allows"));
        }
        if name.contains(['/', ':']) || name.contains(char::is_whitespace) {
            return Err(bad("it contains '/', ':' or white space"));
        }
        let c = CString::new(name).map_err(|_| bad("it contains a NUL byte"))?;
        // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
        let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
        if index == 0 {
            return Err(NetError::NoSuchInterface(name.to_owned()));
        }
        Ok(Interface {
            name: name.to_owned(),
            index,
        })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kernel's index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The interface's own MAC address, from sysfs.
    pub fn mac(&self) -> Result<MacAddr, NetError> {
        let path = format!("/sys/class/net/{}/address", self.name);
        let text = std::fs::read_to_string(&path).map_err(|source| NetError::ReadMac {
            iface: self.name.clone(),
            path: path.clone(),
            source,
        })?;
        parse_mac(&text).map_err(|source| NetError::BadMac {
            iface: self.name.clone(),
            source,
        })
    }

    fn io(&self, what: &'static str) -> impl FnOnce(io::Error) -> NetError + '_ {
        move |source| NetError::Io {
            what,
            iface: self.name.clone(),
            source,
        }
    }

    /// An AF_PACKET raw socket bound to this interface for `protocol` (host order; 0: none).
    fn packet_socket(&self, protocol: u16) -> Result<OwnedFd, NetError> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::c_int::from(protocol.to_be()),
            )
        };
        if fd < 0 {
            return Err(socket_error(io::Error::last_os_error(), self));
        }
        // SAFETY: `fd` is a socket we just opened and own alone.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let addr = self.sockaddr(protocol, None);
        // SAFETY: `addr` is a valid sockaddr_ll and the length is its size.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                sockaddr_ll_len(),
            )
        };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENODEV) {
                return Err(NetError::NoSuchInterface(self.name.clone()));
            }
            return Err(self.io("binding an AF_PACKET socket")(e));
        }
        Ok(fd)
    }

    fn sockaddr(&self, protocol: u16, dst: Option<[u8; 6]>) -> libc::sockaddr_ll {
        // SAFETY: sockaddr_ll is plain old data; all-zero is a valid value.
        let mut a: libc::sockaddr_ll = unsafe { mem::zeroed() };
        a.sll_family = libc::AF_PACKET as libc::c_ushort;
        a.sll_protocol = protocol.to_be();
        a.sll_ifindex = libc::c_int::try_from(self.index).unwrap_or(0);
        if let Some(mac) = dst {
            a.sll_halen = 6;
            a.sll_addr[..6].copy_from_slice(&mac);
        }
        a
    }
}

fn sockaddr_ll_len() -> libc::socklen_t {
    libc::socklen_t::try_from(mem::size_of::<libc::sockaddr_ll>()).unwrap_or(0)
}

/// `EPERM`/`EACCES` from socket(2) mean a missing capability; say so.
fn socket_error(e: io::Error, iface: &Interface) -> NetError {
    match e.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => NetError::NotPermitted,
        _ => iface.io("opening an AF_PACKET socket")(e),
    }
}

/// Sends whole Ethernet frames out of one interface.
#[derive(Debug)]
pub struct Sender {
    fd: OwnedFd,
    iface: Interface,
}

impl Sender {
    /// Opens the socket (needs `CAP_NET_RAW`).
    ///
    /// ```no_run
    /// use rdma_inject::net::{Interface, Sender};
    ///
    /// let sender = Sender::open(&Interface::by_name("veth-b")?)?;
    /// # let frame = vec![0u8; 60];
    /// sender.send(&frame)?;
    /// # Ok::<(), rdma_inject::net::NetError>(())
    /// ```
    pub fn open(iface: &Interface) -> Result<Sender, NetError> {
        Ok(Sender {
            fd: iface.packet_socket(0)?,
            iface: iface.clone(),
        })
    }

    /// The interface frames leave through.
    pub fn interface(&self) -> &Interface {
        &self.iface
    }

    /// Sends one frame (destination MAC, source MAC, ethertype, …; no FCS).
    pub fn send(&self, frame: &[u8]) -> Result<(), NetError> {
        let (Some(dst), Some(ethertype)) = (frame.get(..6), frame.get(12..14)) else {
            return Err(self.iface.io("sending a frame")(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shorter than an Ethernet header",
            )));
        };
        let mut mac = [0u8; 6];
        mac.copy_from_slice(dst);
        let addr = self
            .iface
            .sockaddr(u16::from_be_bytes([ethertype[0], ethertype[1]]), Some(mac));
        // SAFETY: `frame` is valid for `frame.len()` bytes and `addr` is a valid sockaddr_ll.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&addr as *const libc::sockaddr_ll).cast(),
                sockaddr_ll_len(),
            )
        };
        if n < 0 {
            return Err(self.iface.io("sending a frame")(io::Error::last_os_error()));
        }
        if usize::try_from(n).ok() != Some(frame.len()) {
            return Err(self.iface.io("sending a frame")(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("sent {n} of {} bytes", frame.len()),
            )));
        }
        Ok(())
    }
}

/// Which way a frame crossed the interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Received by this host (or seen on the link: broadcast, other hosts).
    Incoming,
    /// Sent by this host.
    Outgoing,
}

/// One frame seen by the [`Observer`].
#[derive(Debug)]
pub struct Seen<'a> {
    /// The frame (no FCS).
    pub frame: &'a [u8],
    /// Its length on the wire (more than `frame.len()` only if it did not fit the buffer).
    pub orig_len: usize,
    /// Which way it went.
    pub direction: Direction,
}

/// Sees every frame on one interface, both directions.
#[derive(Debug)]
pub struct Observer {
    fd: OwnedFd,
    iface: Interface,
    buf: Vec<u8>,
}

impl Observer {
    /// Opens the socket (needs `CAP_NET_RAW`). Frames are queued from here on.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use rdma_inject::net::{Interface, Observer};
    ///
    /// let mut obs = Observer::open(&Interface::by_name("veth-b")?)?;
    /// if let Some(seen) = obs.next(Duration::from_millis(300))? {
    ///     println!("{:?} {} bytes", seen.direction, seen.frame.len());
    /// }
    /// # Ok::<(), rdma_inject::net::NetError>(())
    /// ```
    pub fn open(iface: &Interface) -> Result<Observer, NetError> {
        let fd = iface.packet_socket(libc::ETH_P_ALL as u16)?;
        let size = RCVBUF_BYTES;
        // SAFETY: setsockopt with a pointer to a c_int and its size. Best effort: a smaller
        // buffer only makes drops under bursts more likely.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                (&size as *const libc::c_int).cast(),
                libc::socklen_t::try_from(mem::size_of::<libc::c_int>()).unwrap_or(0),
            );
        }
        Ok(Observer {
            fd,
            iface: iface.clone(),
            buf: vec![0; RECV_BUF],
        })
    }

    /// The next frame, or `None` if none came within `timeout` (or a signal interrupted).
    pub fn next(&mut self, timeout: Duration) -> Result<Option<Seen<'_>>, NetError> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Round up: a sub-millisecond wait must not become a busy loop of zero timeouts.
        let ms = timeout.as_micros().div_ceil(1000);
        let ms = libc::c_int::try_from(ms).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(None);
            }
            return Err(self.iface.io("waiting for frames")(e));
        }
        if rc == 0 {
            return Ok(None);
        }
        // SAFETY: sockaddr_ll is plain old data.
        let mut from: libc::sockaddr_ll = unsafe { mem::zeroed() };
        let mut from_len = sockaddr_ll_len();
        // SAFETY: the buffer is valid for its length; `from` for `from_len` bytes. MSG_TRUNC
        // makes the call return the frame's real length even when it did not fit.
        let n = unsafe {
            libc::recvfrom(
                self.fd.as_raw_fd(),
                self.buf.as_mut_ptr().cast(),
                self.buf.len(),
                libc::MSG_TRUNC | libc::MSG_DONTWAIT,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut from_len,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) {
                return Ok(None);
            }
            return Err(self.iface.io("receiving a frame")(e));
        }
        let orig_len = usize::try_from(n).unwrap_or(0);
        let direction = if from.sll_pkttype == libc::PACKET_OUTGOING {
            Direction::Outgoing
        } else {
            Direction::Incoming
        };
        Ok(Some(Seen {
            frame: &self.buf[..orig_len.min(self.buf.len())],
            orig_len,
            direction,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_impossible_interfaces_are_named() {
        let e = Interface::by_name("rdma-inject-x9").unwrap_err();
        assert!(matches!(e, NetError::NoSuchInterface(ref n) if n == "rdma-inject-x9"));
        assert_eq!(
            e.to_string(),
            "no network interface named \"rdma-inject-x9\": `ip link` lists them"
        );
        for (name, reason) in [
            ("", "it is empty"),
            ("a-very-long-interface-name", "longer than the 15 bytes"),
            ("eth0\0", "NUL byte"),
            ("../eth0", "'/'"),
            ("eth 0", "white space"),
        ] {
            let e = Interface::by_name(name).unwrap_err().to_string();
            assert!(e.contains(reason), "{name:?}: {e}");
        }
    }

    #[test]
    fn loopback_exists_and_has_a_mac() {
        let lo = Interface::by_name("lo").expect("every Linux host has lo");
        assert!(lo.index() > 0);
        assert_eq!(lo.mac().expect("lo's address").0, [0; 6]);
    }

    #[test]
    fn permission_errors_name_the_capability() {
        let lo = Interface::by_name("lo").expect("lo");
        let e = socket_error(io::Error::from_raw_os_error(libc::EPERM), &lo);
        assert!(matches!(e, NetError::NotPermitted));
        assert!(e.to_string().contains("CAP_NET_RAW"), "{e}");
        let e = socket_error(io::Error::from_raw_os_error(libc::EMFILE), &lo);
        assert!(
            e.to_string()
                .starts_with("opening an AF_PACKET socket on lo: "),
            "{e}"
        );
    }
}
