//! A bounded fuzz loop over the sealed-message format (`protect`): whatever arrives over RDMA
//! (random bytes, real sealed messages mutated, cut, extended or renumbered, headers of another
//! version), `Header::parse` and `Opener::open` answer with a value or an error, never a panic,
//! and no changed message is ever accepted: everything but the exact bytes the sealer made is
//! refused, and a refusal does not move the expected sequence. Runs `SEALED_FUZZ_SECS` seconds
//! (default 3).

use std::time::{Duration, Instant};

use rand_core::{OsRng, RngCore};
use secure_rdma::datapath::{Op, StreamId};
use secure_rdma::protect::{AuthError, Cipher, Header, Opener, Sealer, HEADER_LEN, OVERHEAD};

fn below(rng: &mut OsRng, n: usize) -> usize {
    rng.next_u32() as usize % n.max(1)
}

#[test]
fn sealed_messages_never_panic_and_no_changed_message_opens() {
    let secs = std::env::var("SEALED_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let mut rng = OsRng;
    let key = [0x5au8; 32];
    let stream = StreamId([7; 16]);
    let started = Instant::now();
    let (mut inputs, mut refused, mut versions) = (0u64, 0u64, 0u64);
    while started.elapsed() < Duration::from_secs(secs) {
        let cipher = if inputs.is_multiple_of(2) {
            Cipher::ChaCha20Poly1305
        } else {
            Cipher::Aes256Gcm
        };
        let first = 1 + u64::from(rng.next_u32() % 1000);
        let mut sealer = Sealer::new(cipher, &key);
        sealer.bind(stream, first);
        let mut plain = vec![0u8; below(&mut rng, 300)];
        rng.fill_bytes(&mut plain);
        let op = if rng.next_u32().is_multiple_of(2) {
            Op::Send
        } else {
            Op::Write
        };
        let mut wire = vec![0u8; plain.len() + OVERHEAD];
        let n = sealer.seal(op, &plain, &mut wire).expect("seal");
        wire.truncate(n);
        let original = wire.clone();
        match rng.next_u32() % 6 {
            0 => {
                for _ in 0..1 + below(&mut rng, 4) {
                    let i = below(&mut rng, wire.len());
                    wire[i] ^= 1 << (rng.next_u32() % 8);
                }
            }
            1 => wire.truncate(below(&mut rng, wire.len())),
            2 => {
                let mut more = vec![0u8; 1 + below(&mut rng, 32)];
                rng.fill_bytes(&mut more);
                wire.extend_from_slice(&more);
            }
            3 => {
                // Renumbered to what the opener expects next, or to anything.
                let seq = if rng.next_u32().is_multiple_of(2) {
                    first + 1
                } else {
                    rng.next_u64()
                };
                wire[4..12].copy_from_slice(&seq.to_be_bytes());
            }
            4 => wire[0] = (rng.next_u32() % 256) as u8,
            _ => {
                wire = vec![0u8; below(&mut rng, 96)];
                rng.fill_bytes(&mut wire);
            }
        }
        if wire.len() >= HEADER_LEN {
            let mut h = [0u8; HEADER_LEN];
            h.copy_from_slice(&wire[..HEADER_LEN]);
            if let Err(AuthError::Version { got }) = Header::parse(&h) {
                assert_ne!(got, 2);
                versions += 1;
            }
        }
        let mut opener = Opener::new(cipher, &key);
        opener.bind(stream, first);
        let changed = wire != original;
        match opener.open(op, &mut wire) {
            Ok(p) => {
                assert!(!changed, "a changed message opened: {}", hex(&original));
                assert_eq!(p, &plain[..]);
                assert_eq!(opener.next_seq(), first + 1);
            }
            Err(_) => {
                assert!(changed, "the sealer's own message was refused");
                assert_eq!(opener.next_seq(), first, "a refusal moved the sequence");
                refused += 1;
            }
        }
        inputs += 1;
    }
    println!(
        "sealed fuzz: {inputs} inputs in {secs} s: {refused} refused ({versions} as another version), 0 panics, 0 forgeries accepted"
    );
    assert!(inputs > 1000, "only {inputs} inputs ran");
    assert!(refused > 0 && versions > 0);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
