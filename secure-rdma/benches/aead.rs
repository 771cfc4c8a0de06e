//! Payload protection per core: seal then open one message, for both ciphers, at 64 B, 4 KiB
//! and 64 KiB. This is the CPU cost each side adds per SEND or WRITE (the sender seals, the
//! receiver opens), measured on one core with the same `Sealer`/`Opener` the session uses.
//!
//! Run with `cargo bench -p secure-rdma --bench aead`; criterion reports bytes per second of
//! plaintext, and the time per iteration is the seal + open of one message.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use secure_rdma::datapath::Op;
use secure_rdma::protect::{Cipher, Opener, Sealer, KEY_LEN, OVERHEAD};

const SIZES: [usize; 3] = [64, 4 << 10, 64 << 10];

fn seal_open(c: &mut Criterion) {
    let key = [0x42u8; KEY_LEN];
    let mut g = c.benchmark_group("seal_open");
    for cipher in Cipher::preference() {
        for size in SIZES {
            let plain = vec![0xa5u8; size];
            let mut wire = vec![0u8; size + OVERHEAD];
            g.throughput(Throughput::Bytes(size as u64));
            g.bench_with_input(BenchmarkId::new(cipher.name(), size), &size, |b, _| {
                // Both ends advance their sequence together, as in a session: every open
                // sees the next expected sequence.
                let mut sealer = Sealer::new(cipher, &key);
                let mut opener = Opener::new(cipher, &key);
                b.iter(|| {
                    let n = sealer
                        .seal(Op::Send, black_box(&plain), &mut wire)
                        .expect("the buffer holds the sealed message");
                    let opened = opener
                        .open(Op::Send, &mut wire[..n])
                        .expect("a message sealed with the same key opens");
                    black_box(opened.len());
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, seal_open);
criterion_main!(benches);
