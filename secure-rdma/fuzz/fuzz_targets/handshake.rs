//! libFuzzer target for the control channel's messages, the resume exchange included: any
//! bytes parse to a `Message` or an error, never a panic, and a stream in a hello is validated
//! without panicking whatever its numbers.

#![no_main]

use libfuzzer_sys::fuzz_target;
use secure_rdma::handshake::Message;

fuzz_target!(|data: &[u8]| {
    if let Ok(Message::Hello {
        stream: Some(stream),
        ..
    }) = serde_json::from_slice::<Message>(data)
    {
        let _ = stream.validate();
    }
});
