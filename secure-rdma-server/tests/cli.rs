//! `secure-server` as a user first meets it: its name and version, documented exit codes,
//! choices listed in `--help`, and clap's error for a bad one.

use std::process::{Command, Output};

fn secure_server(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_secure-server"))
        .args(args)
        .output()
        .expect("run secure-server")
}

#[test]
fn version_help_and_bad_choices_follow_the_family_conventions() {
    let out = secure_server(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("secure-server {}", env!("CARGO_PKG_VERSION"))
    );
    let help = String::from_utf8_lossy(&secure_server(&["--help"]).stdout).into_owned();
    for documented in [
        "Multi-client secure RDMA server",
        "Exit codes:",
        "  2  usage",
        "aes-256-gcm",
        "chacha20-poly1305",
        "busy",
        "event",
        "json",
    ] {
        assert!(
            help.contains(documented),
            "{documented} missing from:\n{help}"
        );
    }
    for (flag, listed) in [
        ("--poll", "[possible values: busy, event]"),
        (
            "--cipher",
            "[possible values: auto, aes-256-gcm, chacha20-poly1305]",
        ),
        ("--log-format", "[possible values: text, json]"),
    ] {
        let out = secure_server(&[flag, "nonsense"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains(listed), "{flag}: {err}");
    }
}

#[test]
fn the_config_file_takes_the_flags_spellings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("server.toml");
    std::fs::write(&config, "cipher = \"rot13\"\n").expect("write config");
    let out = secure_server(&["--config", config.to_str().expect("utf-8 path")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("unknown cipher \"rot13\": auto, aes-256-gcm or chacha20-poly1305"),
        "{err}"
    );
}
