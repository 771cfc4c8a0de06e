//! `decode_ethernet` on one host core over a realistic mix of RoCEv2 frames: the traffic of
//! an RC session moving data (SENDs of small protected messages, multi-packet WRITEs at a
//! 1024-byte path MTU, a WRITE WITH IMMEDIATE, READ request and response, and ACKs), every
//! frame with a valid ICRC so the decoder does the full check it does on a capture.
//!
//! Run with `cargo bench -p roce --bench decode`; criterion reports elements (packets) per
//! second. The goal is 2 M packets/s on one core.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use roce::{decode_ethernet, Aeth, AethSyndrome, ImmDt, MacAddr, Opcode, PacketBuilder, Reth};

/// The RDMA path MTU rxe and most RoCE NICs use by default: a WRITE is split into packets of
/// this many payload bytes.
const MTU: usize = 1024;

/// The frames, in the proportions one data-moving RC session shows: for every request packet
/// an ACK is likely (here one ACK per message, coalesced as NICs do).
fn mix() -> Vec<Vec<u8>> {
    let base = |op: Opcode, psn: u32| {
        PacketBuilder::new(op)
            .src_mac(MacAddr([0x02, 0, 0, 0, 0, 0x01]))
            .dst_mac(MacAddr([0x02, 0, 0, 0, 0, 0x02]))
            .ipv4(Ipv4Addr::new(10, 77, 0, 1), Ipv4Addr::new(10, 77, 0, 2))
            .src_port(49153)
            .dest_qp(0x11)
            .psn(psn)
    };
    let ack = |psn: u32, msn: u32| {
        base(Opcode::RC_ACKNOWLEDGE, psn).aeth(Aeth {
            syndrome: AethSyndrome::Ack { credits: 31 },
            msn,
        })
    };
    let reth = |len: usize| Reth {
        va: 0x1000,
        rkey: 0x1234,
        dma_len: u32::try_from(len).unwrap_or(u32::MAX),
    };
    let op = |code: u8| Opcode::new(code).expect("a defined RC opcode");
    let mut b = Vec::new();
    let mut psn = 0x10_0000;
    let mut msn = 0;
    // Small SENDs: a 64-byte message plus the 32 bytes of payload protection.
    for _ in 0..4 {
        b.push(base(Opcode::RC_SEND_ONLY, psn).payload(vec![0xa5; 96]));
        psn += 1;
        msn += 1;
        b.push(ack(psn - 1, msn));
    }
    // A 4 KiB WRITE: FIRST (with RETH), two MIDDLE, LAST.
    b.push(
        base(op(0x06), psn)
            .reth(reth(4 * MTU))
            .payload(vec![1; MTU]),
    );
    b.push(base(op(0x07), psn + 1).payload(vec![2; MTU]));
    b.push(base(op(0x07), psn + 2).payload(vec![3; MTU]));
    b.push(base(op(0x08), psn + 3).ack_req(true).payload(vec![4; MTU]));
    psn += 4;
    msn += 1;
    b.push(ack(psn - 1, msn));
    // A WRITE WITH IMMEDIATE carrying a 512-byte protected message.
    b.push(
        base(Opcode::RC_RDMA_WRITE_ONLY_IMM, psn)
            .reth(reth(512))
            .immdt(ImmDt(7))
            .payload(vec![5; 512]),
    );
    psn += 1;
    msn += 1;
    b.push(ack(psn - 1, msn));
    // A READ of 64 bytes: request and its single response (AETH + payload).
    b.push(base(Opcode::RC_RDMA_READ_REQUEST, psn).reth(reth(64)));
    b.push(
        base(op(0x10), psn)
            .aeth(Aeth {
                syndrome: AethSyndrome::Ack { credits: 31 },
                msn: msn + 1,
            })
            .payload(vec![6; 64]),
    );
    b.into_iter()
        .map(|p| p.frame().expect("every field of the mix fits"))
        .collect()
}

fn decode(c: &mut Criterion) {
    let frames = mix();
    for f in &frames {
        let p = decode_ethernet(f).expect("the mix decodes");
        assert!(p.icrc_ok, "the mix carries valid ICRCs");
    }
    let bytes: usize = frames.iter().map(Vec::len).sum();
    let mut g = c.benchmark_group("decode_ethernet");
    g.throughput(Throughput::Elements(frames.len() as u64));
    g.bench_function(
        format!("rc_mix_{}_frames_{bytes}_bytes", frames.len()),
        |b| {
            b.iter(|| {
                for f in &frames {
                    // Ok or Err, the result is what a capture consumes.
                    let _ = black_box(decode_ethernet(black_box(f)));
                }
            })
        },
    );
    // The same mix as bytes per second, for comparison with a link rate.
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("rc_mix_bytes", |b| {
        b.iter(|| {
            for f in &frames {
                let _ = black_box(decode_ethernet(black_box(f)));
            }
        })
    });
    // Headers only: an ACK has no payload, so this is the decoder without the ICRC's bulk.
    let ack = &frames[1];
    g.throughput(Throughput::Elements(1));
    g.bench_function("rc_ack", |b| {
        b.iter(|| black_box(decode_ethernet(black_box(ack))))
    });
    g.finish();
}

criterion_group!(benches, decode);
criterion_main!(benches);
