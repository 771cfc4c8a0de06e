//! `secure-server --rekey-after`, `--rekey-after-bytes`, `--rekey-after-seconds` and their
//! config-file keys: the policy the server starts with, as its startup log states it. The
//! rotation itself is tested in the lab (`tests/tests/rekey_lab.rs`); this checks that the
//! flags and the keys reach it. Runs on a host without RDMA too: the server still starts (it
//! warns that it cannot serve RDMA) and logs the policy before it is ready.

use std::time::{Duration, Instant};

mod common;

/// The info line that states the policy; its `rekey` field is the policy.
const ROTATE: &str = "payload keys rotate";
/// How the warning that keys never rotate begins.
const NEVER: &str = "payload keys never rotate";

/// What `secure-server` with `args` said about rotation before it was ready.
#[derive(Debug, Default)]
struct Startup {
    /// The `rekey` field of each "payload keys rotate" line.
    rotate: Vec<String>,
    /// The "payload keys never rotate" lines, whole.
    never: Vec<String>,
    /// It logged "secure-server ready".
    ready: bool,
}

/// Starts `secure-server` with `args`, reads its log until it is ready (60 s at most), and
/// ends it.
fn startup(args: &[&str]) -> Startup {
    let (mut child, rx, _certs) = common::spawn_logging_server(args);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Startup::default();
    while !seen.ready && Instant::now() < deadline {
        let Ok(line) = rx.recv_timeout(Duration::from_secs(1)) else {
            // A server that exited closes the channel: nothing more will come.
            if matches!(child.try_wait(), Ok(Some(_))) {
                break;
            }
            continue;
        };
        if let Some(rekey) = common::logged(&line, ROTATE, "rekey") {
            seen.rotate.push(rekey);
        }
        seen.ready |= common::ready_listen(&line).is_some();
        if common::log_message(&line).is_some_and(|m| m.starts_with(NEVER)) {
            seen.never.push(line);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    seen
}

/// The server logged `rekey` as its policy, once, and no warning that keys never rotate.
fn assert_rotates(args: &[&str], rekey: &str) {
    let seen = startup(args);
    assert!(seen.ready, "{args:?}: not ready within 60 s: {seen:?}");
    assert_eq!(seen.rotate, [rekey], "{args:?}");
    assert!(seen.never.is_empty(), "{args:?}: {seen:?}");
}

/// A TOML config file with `body` in a fresh directory (kept as long as the guard).
fn config(body: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("server.toml");
    std::fs::write(&path, body).expect("write config");
    let path = path.to_str().expect("utf-8 path").to_owned();
    (dir, path)
}

#[test]
fn without_flags_keys_rotate_at_the_defaults() {
    assert_rotates(&[], "every 16777216 messages or 4294967296 bytes or 3600 s");
}

#[test]
fn the_flags_set_each_threshold_and_0_turns_one_off() {
    assert_rotates(
        &[
            "--rekey-after",
            "100",
            "--rekey-after-bytes",
            "65536",
            "--rekey-after-seconds",
            "0",
        ],
        "every 100 messages or 65536 bytes",
    );
}

#[test]
fn the_config_file_keys_set_the_policy_and_a_flag_overrides_them() {
    let (_dir, file) = config("rekey-after = 7\n");
    assert_rotates(
        &["--config", &file],
        "every 7 messages or 4294967296 bytes or 3600 s",
    );

    let (_dir, file) =
        config("rekey-after = 7\nrekey-after-bytes = 1024\nrekey-after-seconds = 60\n");
    assert_rotates(
        &["--config", &file],
        "every 7 messages or 1024 bytes or 60 s",
    );
    assert_rotates(
        &[
            "--config",
            &file,
            "--rekey-after",
            "9",
            "--rekey-after-seconds",
            "0",
        ],
        "every 9 messages or 1024 bytes",
    );
}

#[test]
fn all_three_at_0_warns_that_keys_never_rotate() {
    let seen = startup(&[
        "--rekey-after",
        "0",
        "--rekey-after-bytes",
        "0",
        "--rekey-after-seconds",
        "0",
    ]);
    assert!(seen.ready, "not ready within 60 s: {seen:?}");
    assert!(seen.rotate.is_empty(), "{seen:?}");
    assert_eq!(seen.never.len(), 1, "{seen:?}");
    let warning: serde_json::Value = serde_json::from_str(&seen.never[0]).unwrap();
    assert_eq!(warning["level"], "WARN", "{warning}");
    // It names the flags that turn rotation back on.
    let message = warning["message"].as_str().unwrap_or_default();
    for flag in [
        "--rekey-after,",
        "--rekey-after-bytes",
        "--rekey-after-seconds",
    ] {
        assert!(message.contains(flag), "{message}");
    }
}
