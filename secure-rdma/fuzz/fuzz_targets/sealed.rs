//! libFuzzer target for the sealed-message format: any bytes go through `Header::parse` and
//! `Opener::open` without a panic, and none opens (the fuzzer cannot know the key).

#![no_main]

use libfuzzer_sys::fuzz_target;
use secure_rdma::datapath::{Op, StreamId};
use secure_rdma::protect::{Cipher, Header, Opener, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() >= HEADER_LEN {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&data[..HEADER_LEN]);
        let _ = Header::parse(&h);
    }
    let mut opener = Opener::new(Cipher::ChaCha20Poly1305, &[1u8; 32]);
    opener.bind(StreamId([2; 16]), 1);
    let mut msg = data.to_vec();
    assert!(opener.open(Op::Send, &mut msg).is_err());
});
