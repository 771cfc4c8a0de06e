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

/// A reader that hands out at most `step` bytes a call, as a pipe from tcpdump does.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl std::io::Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Reading from a pipe gives the same records as reading the whole file, in pcap and pcapng,
/// however the bytes arrive; a stream cut inside a record is an error at the right offset.
#[test]
fn streams_give_the_records_of_the_whole_file() {
    // Enough records that the stream reader drops consumed bytes along the way.
    let frames: Vec<Vec<u8>> = (0..600)
        .map(|i| Pkt::new(0x04).payload(&vec![i as u8; 200 + i % 7]).frame())
        .collect();
    let mut w = PcapWriter::new(Vec::new(), LinkType::Ethernet, 65535, Resolution::Nanos).unwrap();
    for (i, f) in frames.iter().enumerate() {
        w.write_packet(Timestamp::new(1_700_000_000, i as u32), f, f.len())
            .unwrap();
    }
    let pcap_file = w.into_inner().unwrap();
    let pcapng_file = include_bytes!("data/editcap.pcapng").to_vec();
    for (file, steps) in [(&pcap_file, [13, 100_000]), (&pcapng_file, [1, 7])] {
        let (header, records) = pcap::read(file).unwrap();
        let whole: Vec<_> = records.collect::<Result<_, _>>().unwrap();
        for step in steps {
            let mut stream = pcap::StreamReader::new(Trickle { data: file, step }).unwrap();
            assert_eq!(stream.header(), header);
            let mut n = 0;
            while let Some(record) = stream.next_record() {
                assert_eq!(record.unwrap(), whole[n], "record {n}, step {step}");
                n += 1;
            }
            assert_eq!(n, whole.len());
        }
    }

    let cut = &pcap_file[..pcap_file.len() - 5];
    let mut stream = pcap::StreamReader::new(Trickle {
        data: cut,
        step: 4096,
    })
    .unwrap();
    let mut n = 0;
    let err = loop {
        match stream.next_record() {
            Some(Ok(_)) => n += 1,
            Some(Err(e)) => break e,
            None => panic!("a cut stream must end in an error"),
        }
    };
    assert_eq!(n, frames.len() - 1);
    let last = frames.last().unwrap().len();
    let offset = pcap_file.len() - 16 - last;
    assert_eq!(
        err.to_string(),
        format!(
            "pcap record at offset {offset} truncated: need {} bytes, {} left \
             (was the capture stopped while writing?)",
            16 + last,
            16 + last - 5
        )
    );
    assert!(
        stream.next_record().is_none(),
        "the stream ends after an error"
    );

    for bad in [&b""[..], b"GET / HTTP/1.1\r\n\r\n, not a capture"] {
        let err = pcap::StreamReader::new(bad).unwrap_err();
        assert!(
            matches!(
                err,
                pcap::StreamError::Pcap(
                    pcap::PcapError::ShortHeader(_) | pcap::PcapError::BadMagic(_)
                )
            ),
            "{err}"
        );
    }
}

/// `tcpdump -i any` records: a cooked header, then IP. Both layouts decode to the same
/// packet as the Ethernet frame, with the header kept; a protocol that is not IP is refused.
#[test]
fn linux_cooked_records_decode_like_ethernet() {
    use roce::sll::{LinuxSll, PacketType, SllVersion};

    for (pkt, proto) in [
        (
            Pkt::new(0x0a)
                .ext(reth(0x1000, 0x1234, 8))
                .payload(b"12345678"),
            0x0800,
        ),
        (Pkt::new(0x11).ext(aeth(0x1f, 5)).v6(), 0x86dd),
    ] {
        let whole = eth(&pkt);
        for version in [SllVersion::V1, SllVersion::V2] {
            let header = LinuxSll::ethernet(version, PacketType::Outgoing, 7, pkt.src_mac, proto);
            let mut record = header.to_bytes();
            record.extend(pkt.datagram());
            let p = roce::decode_sll_snapped(&record, record.len(), version).unwrap();
            assert_eq!(p.cooked, Some(header));
            assert_eq!(
                (p.ip, p.udp, p.bth, p.ext),
                (whole.ip, whole.udp, whole.bth, whole.ext)
            );
            assert!(p.icrc_ok);
            // Cut by a snap length: still decoded, marked truncated.
            let cut = &record[..record.len() - 2];
            let p = roce::decode_sll_snapped(cut, record.len(), version).unwrap();
            assert!(p.truncated);
            // The JSON names the header.
            let json = roce::render::json(&p, None);
            assert!(json.contains("\"cooked\":{\"version\":\""), "{json}");

            let mut arp = record.clone();
            let at = if version == SllVersion::V1 { 14 } else { 0 };
            arp[at..at + 2].copy_from_slice(&[0x08, 0x06]);
            assert_eq!(
                roce::decode_sll_snapped(&arp, arp.len(), version).unwrap_err(),
                roce::DecodeError::UnsupportedEthertype(0x0806)
            );
            assert!(roce::decode_sll_snapped(&record[..10], 10, version).is_err());
        }
    }
}
