//! libFuzzer target for the RoCEv2 decoder: every entry point must return `Ok` or `Err`,
//! never panic, and whatever decodes must render.
//!
//! The first input byte picks the original length for the snap-length variants, so the fuzzer
//! also explores truncated captures.

#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::{
    decode_ethernet, decode_ethernet_snapped, decode_ip, decode_ip_snapped, decode_udp_payload,
    render,
};

fuzz_target!(|data: &[u8]| {
    let (extra, frame) = match data.split_first() {
        Some((first, rest)) => (usize::from(*first) * 8, rest),
        None => (0, data),
    };
    let orig_len = frame.len() + extra;
    for result in [
        decode_ethernet(frame),
        decode_ethernet_snapped(frame, orig_len),
        decode_ip(frame),
        decode_ip_snapped(frame, orig_len),
        decode_udp_payload(frame),
    ] {
        match result {
            Ok(p) => {
                let _ = render::text(&p, None);
                let _ = render::json(&p, None);
            }
            Err(e) => {
                let _ = render::json_error(&e, frame.len(), None);
            }
        }
    }
});
