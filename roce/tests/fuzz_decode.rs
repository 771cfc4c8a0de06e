//! Bounded-time fuzzing on stable Rust, run by `cargo test` (this target has `harness = false`).
//!
//! cargo-fuzz needs a nightly toolchain (`-Z sanitizer`), so CI runs this instead: for
//! `DECODE_FUZZ_SECS` seconds (default 5) it feeds every decoder entry point with random bytes
//! and with mutated, truncated and spliced valid packets of every opcode, renders whatever
//! decodes, and runs the follower and the statistics over it. Every eighth input it also reads
//! a mutated capture file (classic pcap in both byte orders and resolutions, pcapng) to its
//! end. A panic prints the input as hex and fails the run. `DECODE_FUZZ_SEED` picks another
//! deterministic sequence.
//!
//! The libFuzzer target in `fuzz/` exercises the same entry points under coverage guidance
//! where a nightly toolchain is available.

// `u64::is_multiple_of` needs Rust 1.87; the workspace's rust-version is older.
#![allow(clippy::manual_is_multiple_of)]

mod common;

use std::panic::{self, AssertUnwindSafe};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::*;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::simple_packet::SimplePacketBlock;
use pcap_file::pcapng::{PcapNgBlock, PcapNgWriter};
use pcap_file::{DataLink, Endianness};
use roce::follow::{FollowConfig, Follower};
use roce::pcap::{self, LinkType, PcapWriter, Resolution, Timestamp};
use roce::stats::Stats;
use roce::{
    decode_ethernet, decode_ethernet_snapped, decode_ip, decode_ip_snapped, decode_udp_payload,
    render, Opcode, Packet,
};

/// Offsets (in an untagged IPv4 frame) of fields whose values steer the decoder.
const HOT_OFFSETS: &[usize] = &[12, 13, 14, 16, 17, 20, 21, 23, 36, 37, 38, 39, 42, 43, 46];
const INTERESTING: &[u8] = &[
    0x00, 0x01, 0x04, 0x05, 0x06, 0x0f, 0x11, 0x12, 0x3f, 0x40, 0x45, 0x60, 0x7f, 0x80, 0x81, 0xb7,
    0xff,
];

fn corpus() -> Vec<Vec<u8>> {
    let mut c = Vec::new();
    for op in Opcode::all() {
        let pkt = packet_for(op);
        c.push(pkt.frame());
        let mut v6 = pkt.clone().v6();
        v6.vlan = Some(42);
        c.push(v6.frame());
    }
    c
}

/// Capture files holding a few packets each: classic pcap (both resolutions, both byte
/// orders, Ethernet and raw IP) and pcapng (both byte orders, two interfaces, enhanced and
/// simple packet blocks).
fn file_corpus() -> Vec<Vec<u8>> {
    let frames: Vec<Vec<u8>> = [0x04, 0x0b, 0x11, 0x81]
        .into_iter()
        .filter_map(Opcode::new)
        .map(|op| packet_for(op).frame())
        .collect();
    let mut c = Vec::new();
    for (link, resolution, skip) in [
        (LinkType::Ethernet, Resolution::Nanos, 0),
        (LinkType::Ethernet, Resolution::Micros, 0),
        (LinkType::Raw, Resolution::Micros, 14),
    ] {
        let mut w = PcapWriter::new(Vec::new(), link, 96, resolution).unwrap();
        for (i, f) in frames.iter().enumerate() {
            w.write_packet(Timestamp::new(1_700_000_000, i as u32), &f[skip..], f.len())
                .unwrap();
        }
        let file = w.into_inner().unwrap();
        c.push(big_endian_pcap(&file));
        c.push(file);
    }
    for endianness in [Endianness::Little, Endianness::Big] {
        let mut w = PcapNgWriter::with_endianness(Vec::new(), endianness).unwrap();
        let mut idb = InterfaceDescriptionBlock::new(DataLink::ETHERNET, 0);
        idb.options = vec![InterfaceDescriptionOption::IfTsResol(9)];
        w.write_block(&idb.into_block()).unwrap();
        w.write_block(&InterfaceDescriptionBlock::new(DataLink::RAW, 128).into_block())
            .unwrap();
        for (i, f) in frames.iter().enumerate() {
            let epb = EnhancedPacketBlock {
                interface_id: (i % 2) as u32,
                timestamp: Duration::from_nanos(1_700_000_000_000_000_000 + i as u64),
                original_len: f.len() as u32,
                data: f[(i % 2) * 14..].into(),
                options: vec![],
            };
            w.write_block(&epb.into_block()).unwrap();
        }
        let spb = SimplePacketBlock {
            original_len: frames[0].len() as u32,
            data: frames[0][..].into(),
        };
        w.write_block(&spb.into_block()).unwrap();
        c.push(w.into_inner());
    }
    c
}

/// The same classic pcap file written big-endian: every header field byte-swapped.
fn big_endian_pcap(file: &[u8]) -> Vec<u8> {
    let swap4 = |b: &mut [u8]| b.reverse();
    let mut f = file.to_vec();
    swap4(&mut f[0..4]);
    f[4..6].reverse();
    f[6..8].reverse();
    for at in [8, 12, 16, 20] {
        swap4(&mut f[at..at + 4]);
    }
    let mut pos = 24;
    while pos + 16 <= f.len() {
        let caplen = u32::from_le_bytes(f[pos + 8..pos + 12].try_into().unwrap()) as usize;
        for at in [0, 4, 8, 12] {
            swap4(&mut f[pos + at..pos + at + 4]);
        }
        pos += 16 + caplen;
    }
    f
}

/// Reads every record of a (possibly broken) capture file and decodes what it can; returns
/// the number of records read.
fn read_file(file: &[u8], stats: &mut Stats) -> u64 {
    let Ok((_, records)) = pcap::read(file) else {
        return 0;
    };
    let mut n = 0;
    for record in records {
        let Ok(record) = record else { break };
        n += 1;
        let decoded = match record.link {
            LinkType::Raw => decode_ip_snapped(record.data, record.orig_len as usize),
            _ => decode_ethernet_snapped(record.data, record.orig_len as usize),
        };
        stats.record(&decoded, record.data.len());
    }
    n
}

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> (Vec<u8>, usize) {
    let base = &corpus[rng.below(corpus.len())];
    let mut f = base.clone();
    let strategy = rng.below(6);
    match strategy {
        0 => {
            let len = rng.below(128);
            f = rng.bytes(len);
        }
        1 => {
            for _ in 0..=rng.below(8) {
                let at = rng.below(f.len());
                f[at] ^= 1 << rng.below(8);
            }
        }
        2 => {
            for _ in 0..=rng.below(4) {
                let at = rng.below(f.len());
                f[at] = rng.byte();
            }
        }
        3 => {
            let at = HOT_OFFSETS[rng.below(HOT_OFFSETS.len())];
            if at < f.len() {
                f[at] = INTERESTING[rng.below(INTERESTING.len())];
            }
        }
        4 => {
            let other = &corpus[rng.below(corpus.len())];
            let cut = rng.below(f.len());
            f.truncate(cut);
            f.extend_from_slice(&other[rng.below(other.len())..]);
        }
        _ => {
            if rng.below(2) == 0 {
                f.truncate(rng.below(f.len() + 1));
            } else {
                let extra = rng.below(64);
                f.extend(rng.bytes(extra));
            }
        }
    }
    (f, strategy)
}

/// Exercises everything downstream of a successful decode. Rendering costs far more than
/// decoding, so only every `RENDER_EVERY`th packet is rendered.
fn consume(
    p: &Packet<'_>,
    follower: &mut Follower,
    stats: &mut Stats,
    len: usize,
    nth: u64,
) -> usize {
    let _ = follower.observe(p);
    stats.record_packet(p, len);
    if nth % RENDER_EVERY == 0 {
        render::text(p, None).len() + render::json(p, None).len()
    } else {
        0
    }
}

const RENDER_EVERY: u64 = 61;

fn main() -> ExitCode {
    let secs: f64 = std::env::var("DECODE_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5.0);
    let seed: u64 = std::env::var("DECODE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xf022_dec0);
    let budget = Duration::from_secs_f64(secs.max(0.0));
    let corpus = corpus();
    let files = file_corpus();
    let mut file_stats = Stats::default();
    let (mut files_read, mut records_read) = (0u64, 0u64);
    let mut rng = Rng(seed);
    let mut follower = Follower::new(FollowConfig {
        qpn: None,
        path_mtu: None,
        ..FollowConfig::default()
    });
    let mut stats = Stats::default();
    let (mut inputs, mut decoded, mut rendered) = (0u64, 0u64, 0usize);

    let start = Instant::now();
    while start.elapsed() < budget {
        for _ in 0..256 {
            let (input, strategy) = mutate(&mut rng, &corpus);
            let orig_len = input.len() + rng.below(2000);
            let result = panic::catch_unwind(AssertUnwindSafe(|| {
                let mut ok = 0u64;
                for r in [
                    decode_ethernet(&input),
                    decode_ethernet_snapped(&input, orig_len),
                ] {
                    match r {
                        Ok(p) => {
                            ok += 1;
                            rendered +=
                                consume(&p, &mut follower, &mut stats, input.len(), inputs + ok);
                        }
                        Err(e) => {
                            stats.record_error(&e, input.len());
                            if inputs % RENDER_EVERY == 0 {
                                rendered += render::json_error(&e, input.len(), None).len();
                            }
                        }
                    }
                }
                let ip = input.get(14..).unwrap_or(&[]);
                let udp = input.get(42..).unwrap_or(&[]);
                for r in [
                    decode_ip(ip),
                    decode_ip_snapped(ip, orig_len),
                    decode_udp_payload(udp),
                    decode_udp_payload(&input),
                ]
                .into_iter()
                .flatten()
                {
                    ok += 1;
                    rendered += consume(&r, &mut follower, &mut stats, input.len(), inputs + ok);
                }
                ok
            }));
            match result {
                Ok(ok) => decoded += ok,
                Err(_) => {
                    let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
                    eprintln!("fuzz_decode: PANIC on input #{inputs} (strategy {strategy}, orig_len {orig_len}, seed {seed}): {hex}");
                    return ExitCode::FAILURE;
                }
            }
            inputs += 1;
            if inputs % 8 == 0 {
                let (file, strategy) = mutate(&mut rng, &files);
                match panic::catch_unwind(AssertUnwindSafe(|| read_file(&file, &mut file_stats))) {
                    Ok(n) => records_read += n,
                    Err(_) => {
                        let hex: String = file.iter().map(|b| format!("{b:02x}")).collect();
                        eprintln!("fuzz_decode: PANIC reading capture file #{files_read} (strategy {strategy}, seed {seed}): {hex}");
                        return ExitCode::FAILURE;
                    }
                }
                files_read += 1;
            }
        }
        // Random flows accumulate; start over now and then to keep memory flat.
        if inputs % 65_536 == 0 {
            follower = Follower::new(FollowConfig::default());
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    println!(
        "fuzz_decode: ok. {inputs} inputs ({} decoder calls) in {elapsed:.2} s, {:.0} inputs/s; {decoded} decoded, {} decode errors, {rendered} bytes rendered; {files_read} capture files, {records_read} records; seed {seed}",
        inputs * 6,
        inputs as f64 / elapsed.max(1e-9),
        stats.decode_errors,
    );
    ExitCode::SUCCESS
}
