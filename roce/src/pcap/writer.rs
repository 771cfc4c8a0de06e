//! Writing: classic pcap files ([`PcapWriter`]), and a synthetic Ethernet header for datagrams
//! that start at their IP header ([`ethernet_for_ip`]).

use std::io::{self, Write};
use std::time::Duration;

use pcap_file::pcap::{PcapHeader, PcapPacket};
use pcap_file::Endianness;

use super::{LinkType, Resolution, Timestamp};
use crate::eth::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};

/// Writes a classic pcap file, little-endian, version 2.4.
///
/// ```
/// use roce::pcap::{LinkType, PcapWriter, Resolution, Timestamp};
///
/// let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 96, Resolution::Nanos)?;
/// w.write_packet(Timestamp::new(1_700_000_000, 5), &[0u8; 60], 60)?;
/// let file = w.into_inner()?;
/// assert_eq!(file.len(), 24 + 16 + 60);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct PcapWriter<W: Write> {
    inner: pcap_file::pcap::PcapWriter<W>,
}

impl<W: Write> PcapWriter<W> {
    /// Writes the global header. Records longer than `snaplen` are cut to it.
    pub fn new(out: W, link: LinkType, snaplen: u32, resolution: Resolution) -> io::Result<Self> {
        let header = PcapHeader {
            version_major: 2,
            version_minor: 4,
            // Timestamps are UTC and as accurate as the clock: both fields stay 0.
            ts_correction: 0,
            ts_accuracy: 0,
            snaplen,
            datalink: link.into(),
            ts_resolution: resolution.into(),
            // Fixed rather than native, so a file is the same bytes on every host.
            endianness: Endianness::Little,
        };
        let inner = pcap_file::pcap::PcapWriter::with_header(out, header).map_err(io_error)?;
        Ok(PcapWriter { inner })
    }

    /// Appends a record. `data` is what was captured; `orig_len` is the packet's length on the
    /// wire (raised to `data.len()` if smaller). Data beyond the snap length is not written.
    pub fn write_packet(&mut self, ts: Timestamp, data: &[u8], orig_len: usize) -> io::Result<()> {
        let too_long = |what| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} does not fit the 32 bits a pcap record has for it"),
            )
        };
        // Checked before building the Duration, which could otherwise overflow on carry.
        let secs = u32::try_from(ts.secs).map_err(|_| too_long("timestamp"))?;
        let orig32 =
            u32::try_from(orig_len.max(data.len())).map_err(|_| too_long("original length"))?;
        let snap = usize::try_from(self.inner.snaplen()).unwrap_or(usize::MAX);
        let captured = data.get(..snap).unwrap_or(data);
        let packet = PcapPacket::new(Duration::new(u64::from(secs), ts.nanos), orig32, captured);
        self.inner.write_packet(&packet).map_err(io_error)?;
        Ok(())
    }

    /// Flushes and returns the underlying writer.
    pub fn into_inner(self) -> io::Result<W> {
        let mut out = self.inner.into_writer();
        out.flush()?;
        Ok(out)
    }
}

/// pcap-file reports its writer's I/O failures inside its own error; hand them back as they
/// were, and anything else (a field the format cannot hold) as invalid input.
fn io_error(e: pcap_file::PcapError) -> io::Error {
    match e {
        pcap_file::PcapError::IoError(e) => e,
        other => io::Error::new(io::ErrorKind::InvalidInput, other),
    }
}

/// Prepends a synthetic Ethernet header to a datagram that starts at its IP header, so rxe
/// kprobe captures can share a `LINKTYPE_ETHERNET` file. Both MACs are zero; the ethertype
/// follows the IP version nibble. Returns `None` if the datagram is neither IPv4 nor IPv6.
///
/// ```
/// let frame = roce::pcap::ethernet_for_ip(&[0x45, 0, 0, 20]).unwrap();
/// assert_eq!(&frame[12..], &[0x08, 0x00, 0x45, 0, 0, 20]);
/// ```
pub fn ethernet_for_ip(ip_packet: &[u8]) -> Option<Vec<u8>> {
    let ethertype = match ip_packet.first()? >> 4 {
        4 => ETHERTYPE_IPV4,
        6 => ETHERTYPE_IPV6,
        _ => return None,
    };
    let mut frame = Vec::with_capacity(14 + ip_packet.len());
    frame.extend_from_slice(&[0u8; 12]);
    frame.extend_from_slice(&ethertype.to_be_bytes());
    frame.extend_from_slice(ip_packet);
    Some(frame)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_headers_byte_for_byte() {
        let mut w =
            PcapWriter::new(Vec::new(), LinkType::Ethernet, 64, Resolution::Micros).unwrap();
        let data: Vec<u8> = (0..100).collect();
        w.write_packet(Timestamp::new(0x01020304, 5_006_007), &data, 100)
            .unwrap();
        w.write_packet(Timestamp::new(7, 999), &data[..10], 0)
            .unwrap();
        let file = w.into_inner().unwrap();
        #[rustfmt::skip]
        let expected_header = [
            0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0, 0, 1, 0, 0, 0,
        ];
        assert_eq!(&file[..24], &expected_header);
        #[rustfmt::skip]
        let rec1 = [4, 3, 2, 1, 0x8e, 0x13, 0, 0, 64, 0, 0, 0, 100, 0, 0, 0]; // 5006 µs
        assert_eq!(&file[24..40], &rec1);
        assert_eq!(&file[40..104], &data[..64]);
        let rec2 = [7, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 10, 0, 0, 0];
        assert_eq!(&file[104..120], &rec2);
        assert_eq!(&file[120..], &data[..10]);
    }

    #[test]
    fn synthetic_ethernet() {
        let f = ethernet_for_ip(&[0x60, 1, 2]).unwrap();
        assert_eq!(&f[12..], &[0x86, 0xdd, 0x60, 1, 2]);
        assert_eq!(ethernet_for_ip(&[0x45]).map(|f| f[13]), Some(0x00));
        assert_eq!(ethernet_for_ip(&[0x15]), None);
        assert_eq!(ethernet_for_ip(&[]), None);
    }
}
