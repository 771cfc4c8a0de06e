//! pcap files: written, read back byte for byte, and decoded again.

mod common;

use common::*;
use roce::pcap::{self, LinkType, PcapWriter, Resolution, Timestamp};
use roce::{decode_ethernet, decode_ethernet_snapped, decode_ip, Opcode};

#[test]
fn ethernet_file_round_trip() {
    let frames: Vec<Vec<u8>> = Opcode::all().map(|op| packet_for(op).frame()).collect();
    let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 96, Resolution::Nanos).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(
            Timestamp::new(1_700_000_000 + i as u64, i as u32 * 1000),
            f,
            f.len(),
        )
        .unwrap();
    }
    let file = w.into_inner().unwrap();

    // Global header, byte for byte: magic (ns), 2.4, zone 0, sigfigs 0, snaplen 96, Ethernet.
    assert_eq!(
        &file[..24],
        &[0x4d, 0x3c, 0xb2, 0xa1, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 96, 0, 0, 0, 1, 0, 0, 0]
    );
    let expected_len: usize = 24 + frames.iter().map(|f| 16 + f.len().min(96)).sum::<usize>();
    assert_eq!(file.len(), expected_len);

    let (header, records) = pcap::read(&file).unwrap();
    assert_eq!(
        (header.link, header.snaplen, header.resolution),
        (LinkType::Ethernet, 96, Resolution::Nanos)
    );
    let mut n = 0;
    let mut off = 24;
    for (i, rec) in records.enumerate() {
        let rec = rec.unwrap();
        let f = &frames[i];
        let caplen = f.len().min(96);
        // Record header, byte for byte.
        let mut h = Vec::new();
        h.extend((1_700_000_000u32 + i as u32).to_le_bytes());
        h.extend((i as u32 * 1000).to_le_bytes());
        h.extend((caplen as u32).to_le_bytes());
        h.extend((f.len() as u32).to_le_bytes());
        assert_eq!(&file[off..off + 16], &h[..]);
        assert_eq!(rec.data, &f[..caplen]);
        off += 16 + caplen;

        let p = decode_ethernet_snapped(rec.data, rec.orig_len as usize).unwrap();
        let whole = decode_ethernet(f).unwrap();
        assert_eq!((p.bth, p.ext), (whole.bth, whole.ext));
        assert_eq!(p.truncated, f.len() > 96);
        assert_eq!(p.icrc_ok, f.len() <= 96);
        n += 1;
    }
    assert_eq!(n, frames.len());
}

#[test]
fn raw_ip_file_for_kprobe_captures() {
    let datagrams = [
        Pkt::new(0x04).payload(b"raw v4").datagram(),
        Pkt::new(0x11).v6().datagram(),
    ];
    let mut w = PcapWriter::new(
        Vec::new(),
        LinkType::Raw,
        pcap::DEFAULT_SNAPLEN,
        Resolution::Micros,
    )
    .unwrap();
    for d in &datagrams {
        w.write_packet(Timestamp::new(42, 123_456_789), d, d.len())
            .unwrap();
    }
    let file = w.into_inner().unwrap();
    assert_eq!(&file[..4], &[0xd4, 0xc3, 0xb2, 0xa1]);
    assert_eq!(&file[20..24], &[101, 0, 0, 0]);
    let (header, records) = pcap::read(&file).unwrap();
    assert_eq!(header.link, LinkType::Raw);
    for (rec, d) in records.zip(&datagrams) {
        let rec = rec.unwrap();
        assert_eq!(
            rec.ts,
            Timestamp::new(42, 123_456_000),
            "microsecond files keep µs"
        );
        assert_eq!(rec.data, &d[..]);
        assert!(decode_ip(rec.data).unwrap().icrc_ok);
        // The alternative: synthesize an Ethernet header and share an Ethernet file.
        let frame = pcap::ethernet_for_ip(rec.data).unwrap();
        assert!(decode_ethernet(&frame).unwrap().icrc_ok);
    }
}

/// Writes a sample capture for manual inspection with Wireshark when `DECODE_PCAP_OUT` is set:
/// `DECODE_PCAP_OUT=/tmp/roce.pcap cargo test -p roce --test pcap_files`.
#[test]
fn sample_capture_for_wireshark() {
    let Some(path) = std::env::var_os("DECODE_PCAP_OUT") else {
        return;
    };
    let file = std::fs::File::create(path).unwrap();
    let mut w = PcapWriter::new(
        std::io::BufWriter::new(file),
        LinkType::Ethernet,
        65535,
        Resolution::Micros,
    )
    .unwrap();
    for (i, op) in Opcode::all().enumerate() {
        let f = packet_for(op).frame();
        w.write_packet(Timestamp::new(1_700_000_000, i as u32 * 1000), &f, f.len())
            .unwrap();
    }
    w.into_inner().unwrap();
}

/// A pcapng file written by Wireshark's editcap (`editcap -F pcapng`, from three packets of
/// the sample capture above): a section header with options, an interface description
/// without `if_tsresol` (so microseconds), enhanced packet blocks.
#[test]
fn reads_pcapng_written_by_editcap() {
    let file = include_bytes!("data/editcap.pcapng");
    let (header, records) = pcap::read(file).unwrap();
    assert_eq!(
        (
            header.format,
            header.link,
            header.resolution,
            header.version
        ),
        (
            pcap::Format::PcapNg,
            LinkType::Ethernet,
            Resolution::Micros,
            (1, 0)
        )
    );
    let records: Vec<_> = records.collect::<Result<_, _>>().unwrap();
    assert_eq!(records.len(), 3);
    for (i, (rec, code)) in records.iter().zip([0x09, 0x0a, 0x0b]).enumerate() {
        assert_eq!(rec.link, LinkType::Ethernet);
        assert_eq!(rec.ts, Timestamp::new(1_700_000_000, (9 + i as u32) * 1000));
        assert_eq!(rec.orig_len as usize, rec.data.len());
        let p = decode_ethernet(rec.data).unwrap();
        assert_eq!(p.opcode().code(), code);
        assert!(p.icrc_ok);
    }
}
