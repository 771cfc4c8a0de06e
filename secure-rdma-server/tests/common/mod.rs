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

/// The message of a JSON log line (`--log-format json`), `None` for a line that is not one.
pub fn log_message(line: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    log_fields(&v)["message"].as_str().map(str::to_owned)
}

/// The value of `field` in a JSON log line whose message is `message`.
pub fn logged(line: &str, message: &str, field: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(line).ok()?;
    let fields = log_fields(&v);
    if fields["message"] != message {
        return None;
    }
    fields[field].as_str().map(str::to_owned)
}

/// Where a JSON log line keeps its message and fields: nested under `fields` in tracing's
/// default JSON layout, at the top level when flattened (`rdma-cli`'s logging, which
/// `secure-server` uses).
fn log_fields(v: &serde_json::Value) -> &serde_json::Value {
    if v["fields"].is_object() {
        &v["fields"]
    } else {
        v
    }
}

/// The port of [`ready_listen`]'s address.
pub fn ready_port(line: &str) -> Option<u16> {
    ready_listen(line)?.rsplit(':').next()?.parse().ok()
}

/// `secure-server --listen 127.0.0.1:0 --log-format json --certs DIR` with `args` besides, a
/// CA and server certificate made in a fresh directory, and its stderr as lines on a channel
/// (read on a thread, so the server never blocks on a full pipe). The directory lives as long
/// as the returned guard.
pub fn spawn_logging_server(
    args: &[&str],
) -> (
    std::process::Child,
    std::sync::mpsc::Receiver<String>,
    tempfile::TempDir,
) {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let dir = tempfile::tempdir().unwrap();
    secure_rdma::certs::init(&dir.path().join("certs"), &["localhost".to_owned()]).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_secure-server"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .args(["--log-format", "json", "--certs"])
        .arg(dir.path().join("certs"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn secure-server");
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, rx, dir)
}
