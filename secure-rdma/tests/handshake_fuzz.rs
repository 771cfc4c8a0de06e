//! A bounded fuzz loop over the handshake frame decoder: whatever a peer sends (garbage, cut or
//! mutated frames, lying length prefixes), every typed receiver answers with a value or an
//! error, never a panic or a hang. The corpus has every message kind, the resume exchange's
//! (the stream in the hello, each resume answer in the accept) and the early endpoint's (in the
//! hello, the server's in the accept) included. Runs `HANDSHAKE_FUZZ_SECS` seconds (default 3).

use std::time::{Duration, Instant};

use rand_core::{OsRng, RngCore};
use secure_rdma::handshake::{Channel, Message};
use tokio::io::AsyncWriteExt;

/// Valid frames to mutate: every message kind the handshake has.
fn corpus() -> Vec<Vec<u8>> {
    [
        r#"{"type":"hello","version":2,"capabilities":["send"],"ciphers":["aes-256-gcm","chacha20-poly1305"]}"#,
        r#"{"type":"hello","version":3,"capabilities":["send"],"ciphers":["aes-256-gcm"],"stream":{"id":"0123456789abcdef0123456789abcdef","next":17,"sent":20}}"#,
        r#"{"type":"accept","buffer_size":4096,"identity":"alice","cipher":"chacha20-poly1305"}"#,
        r#"{"type":"accept","buffer_size":4096,"identity":"alice","cipher":null,"resume":{"kind":"new"}}"#,
        r#"{"type":"accept","buffer_size":4096,"identity":"alice","cipher":null,"resume":{"kind":"expired"}}"#,
        r#"{"type":"accept","buffer_size":4096,"identity":"alice","cipher":"aes-256-gcm","resume":{"kind":"new"},"rekey":{"messages":100,"bytes":4294967296,"seconds":3600}}"#,
        r#"{"type":"accept","buffer_size":4096,"identity":"a","cipher":null,"resume":{"kind":"resumed","delivered":19,"acks":[{"op":"send","seq":17,"bytes":3,"status":"delivered"},{"op":"write","seq":18,"bytes":1,"status":"refused"}]}}"#,
        r#"{"type":"ack","op":"write","seq":18446744073709551615,"bytes":5,"status":"refused"}"#,
        r#"{"type":"reject","reason":{"kind":"server_full","active":10,"max":10}}"#,
        r#"{"type":"endpoint","endpoint":{"gid":"::ffff:10.77.0.1","qpn":17,"psn":11259375,"mtu":1024,"buffer":{"addr":0,"rkey":4660,"len":4096}}}"#,
        r#"{"type":"ready"}"#,
        r#"{"type":"confirmed"}"#,
        r#"{"type":"ack","op":"send","seq":1,"bytes":5}"#,
        r#"{"type":"abort","reason":{"kind":"authentication_failed"}}"#,
        r#"{"type":"bye"}"#,
        r#"{"type":"accept","buffer_size":4096,"identity":"alice","cipher":null,"resume":{"kind":"new"},"writes_on_demand":true}"#,
        r#"{"type":"hello","version":3,"capabilities":["send"],"ciphers":["chacha20-poly1305"],"stream":{"id":"0123456789abcdef0123456789abcdef","next":1,"sent":0},"early":{"endpoint":{"gid":"::ffff:10.77.0.2","qpn":18,"psn":123456,"mtu":1024},"buffer_size":4096,"rdma_window":16,"cipher":"chacha20-poly1305"}}"#,
        r#"{"type":"accept","buffer_size":4096,"identity":"alice","cipher":"chacha20-poly1305","resume":{"kind":"new"},"rdma_window":16,"endpoint":{"gid":"::ffff:10.77.0.1","qpn":17,"psn":654321,"mtu":1024}}"#,
        r#"{"type":"write_open"}"#,
        r#"{"type":"write_grant","buffer":{"addr":0,"rkey":4660,"len":4128}}"#,
        r#"{"type":"write_reject","reason":{"kind":"quota","detail":"MR_COUNT limit 2 reached globally (2 live)"}}"#,
    ]
    .iter()
    .map(|j| frame(j.as_bytes()))
    .collect()
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = u32::try_from(body.len())
        .unwrap_or(u32::MAX)
        .to_be_bytes()
        .to_vec();
    f.extend_from_slice(body);
    f
}

fn below(rng: &mut OsRng, n: usize) -> usize {
    rng.next_u32() as usize % n.max(1)
}

fn mutate(seed: &[u8], rng: &mut OsRng) -> Vec<u8> {
    let mut f = seed.to_vec();
    match rng.next_u32() % 6 {
        0 => {
            for _ in 0..1 + below(rng, 8) {
                let i = below(rng, f.len());
                f[i] ^= 1 << (rng.next_u32() % 8);
            }
        }
        1 => f.truncate(below(rng, f.len())),
        2 => {
            // A length prefix that lies.
            let len = match rng.next_u32() % 3 {
                0 => u32::MAX,
                1 => rng.next_u32() % 70_000,
                _ => (f.len() as u32).saturating_sub(4 + rng.next_u32() % 8),
            };
            f[..4].copy_from_slice(&len.to_be_bytes());
        }
        3 => {
            let at = 4 + below(rng, f.len() - 4);
            let mut junk = vec![0u8; 1 + below(rng, 16)];
            rng.fill_bytes(&mut junk);
            f.splice(at..at, junk);
            f = frame(&f[4..]);
        }
        4 => {
            let s = String::from_utf8_lossy(&f[4..])
                .replace("17", "99999999999999999999")
                .replace("4096", "-1")
                .replace("\"next\":17", "\"next\":0")
                .replace("0123456789abcdef", "zz")
                .replace("::ffff:10.77.0.1", "0.0.0.0");
            f = frame(s.as_bytes());
        }
        _ => {
            f = vec![0u8; below(rng, 64)];
            rng.fill_bytes(&mut f);
        }
    }
    f
}

#[tokio::test]
async fn handshake_frames_never_panic_or_hang() {
    let secs = std::env::var("HANDSHAKE_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let corpus = corpus();
    let mut rng = OsRng;
    let started = Instant::now();
    let (mut inputs, mut accepted, mut refused) = (0u64, 0u64, 0u64);
    while started.elapsed() < Duration::from_secs(secs) {
        let seed = &corpus[below(&mut rng, corpus.len())];
        let input = mutate(seed, &mut rng);
        let (mut raw, peer) = tokio::io::duplex(1 << 17);
        raw.write_all(&input).await.expect("write");
        // End of stream after the input: a short frame must end in an error, not a wait.
        drop(raw);
        let mut chan = Channel::new(peer);
        let which = inputs % 10;
        let outcome = tokio::time::timeout(Duration::from_secs(1), async {
            match which {
                0 => chan.expect_hello().await.map(|_| ()),
                1 => chan.expect_verdict().await.map(|_| ()),
                2 => chan.expect_endpoint().await.map(|_| ()),
                3 => chan.expect_ready().await,
                4 => chan.expect_confirmed().await,
                5 => chan.expect_ack().await.map(|_| ()),
                6 => chan.expect_control().await.map(|_| ()),
                7 => chan.expect_session_request().await.map(|_| ()),
                8 => chan
                    .expect_write_answer(&mut secure_rdma::lanes::ClosedLanes::default())
                    .await
                    .map(|_| ()),
                _ => chan.recv::<Message>().await.map(|_| ()),
            }
        })
        .await
        .expect("a receiver hung on a closed stream");
        match outcome {
            Ok(()) => accepted += 1,
            Err(_) => refused += 1,
        }
        inputs += 1;
    }
    println!(
        "handshake fuzz: {inputs} inputs in {secs} s: {accepted} accepted, {refused} refused, 0 panics"
    );
    assert!(inputs > 1000, "only {inputs} inputs ran");
    assert!(
        refused > 0 && accepted > 0,
        "the mutations did not exercise both outcomes"
    );
}
