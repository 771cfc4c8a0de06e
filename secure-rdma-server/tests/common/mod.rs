//! What the tests that start `secure-server` share.

// Compiled into each test binary, and each uses a part of it.
#![allow(dead_code)]

/// The address of a `secure-server ready` line of the JSON log (`--log-format json`), `None`
/// for any other line.
pub fn ready_listen(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    if v["message"] != "secure-server ready" {
        return None;
    }
    v["listen"].as_str().map(str::to_owned)
}

/// The port of [`ready_listen`]'s address.
pub fn ready_port(line: &str) -> Option<u16> {
    ready_listen(line)?.rsplit(':').next()?.parse().ok()
}
