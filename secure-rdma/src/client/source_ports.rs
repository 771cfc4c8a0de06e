//! Control connections bound to source ports the client chooses in turn
//! ([`ClientConfig::source_ports`](super::ClientConfig::source_ports)).
//!
//! Why: a process holding tens of thousands of sessions to one server from one address (a
//! load generator, `secure-client bench hold`) leaves the ephemeral port to the kernel's
//! `connect()`, which on Linux tries the ports of one parity first and, once they are all
//! taken, walks every one of them again on each new connection. In the lab that took
//! `connect()` from about 1,100 to 24 connections a second past 32,000. Binding a chosen port
//! is one lookup.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU32, Ordering};

use tokio::net::{TcpSocket, TcpStream};

/// Hands out the ports of a range in turn, from any number of tasks.
#[derive(Debug)]
pub(crate) struct SourcePorts {
    ports: RangeInclusive<u16>,
    next: AtomicU32,
}

impl SourcePorts {
    pub(crate) fn new(ports: RangeInclusive<u16>) -> SourcePorts {
        SourcePorts {
            ports,
            next: AtomicU32::new(0),
        }
    }

    fn len(&self) -> u32 {
        match self.ports.is_empty() {
            true => 0,
            false => u32::from(*self.ports.end() - *self.ports.start()) + 1,
        }
    }

    /// The next port of the range, after the last one handed out (wrapping).
    fn next_port(&self) -> u16 {
        let offset = self.next.fetch_add(1, Ordering::Relaxed) % self.len().max(1);
        // The offset is below the range's length, so the sum stays within the range.
        self.ports.start().saturating_add(offset as u16)
    }

    /// Connects to `target` from the next free port of the range: a port taken by another
    /// socket (or still in TIME_WAIT) is passed over, and after every port of the range has
    /// been tried the error says so.
    pub(crate) async fn connect(&self, target: SocketAddr) -> io::Result<TcpStream> {
        let unspecified = match target.ip() {
            IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        for _ in 0..self.len() {
            let port = self.next_port();
            let socket = match target {
                SocketAddr::V4(_) => TcpSocket::new_v4()?,
                SocketAddr::V6(_) => TcpSocket::new_v6()?,
            };
            match socket.bind(SocketAddr::new(unspecified, port)) {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => continue,
                other => other?,
            }
            match socket.connect(target).await {
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::AddrInUse | io::ErrorKind::AddrNotAvailable
                    ) =>
                {
                    continue
                }
                other => return other,
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrInUse,
            format!(
                "every source port of {}-{} is in use; choose a wider range",
                self.ports.start(),
                self.ports.end()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// `n` ports in a row that are free now on every address, found by binding them.
    fn free_ports(n: u16) -> RangeInclusive<u16> {
        'search: for start in (20_000..60_000).step_by(97) {
            let mut held = Vec::new();
            for p in start..start + n {
                match std::net::TcpListener::bind(("0.0.0.0", p)) {
                    Ok(l) => held.push(l),
                    Err(_) => continue 'search,
                }
            }
            return start..=start + n - 1;
        }
        panic!("no {n} free ports in a row");
    }

    #[tokio::test]
    async fn connections_take_the_ranges_ports_in_turn_and_pass_over_one_in_use() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = listener.local_addr().unwrap();
        let accept = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let range = free_ports(4);
        let (first, last) = (*range.start(), *range.end());
        // Another socket holds the range's second port.
        let _taken = std::net::TcpListener::bind(("0.0.0.0", first + 1)).unwrap();
        let ports = SourcePorts::new(range);
        let mut conns = Vec::new();
        for _ in 0..3 {
            conns.push(ports.connect(target).await.unwrap());
        }
        let used: Vec<u16> = conns
            .iter()
            .map(|c| c.local_addr().unwrap().port())
            .collect();
        assert_eq!(used, vec![first, first + 2, last]);
        // Every port is in use now: the fourth connection fails, and says why.
        let err = ports.connect(target).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        assert!(
            err.to_string()
                .contains(&format!("every source port of {first}-{last} is in use")),
            "{err}"
        );
        accept.abort();
    }

    #[test]
    fn the_turn_wraps_within_the_range() {
        let ports = SourcePorts::new(65_534..=65_535);
        let turns: Vec<u16> = (0..5).map(|_| ports.next_port()).collect();
        assert_eq!(turns, vec![65_534, 65_535, 65_534, 65_535, 65_534]);
    }
}
