//! `secure-server` as a user first meets it: its name and version, documented exit codes,
//! choices listed in `--help`, and clap's error for a bad one.

use std::process::{Command, Output};

mod common;

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

/// `-p PORT` is rdma-core's port letter: the server listens on every address at that port, and
/// naming an address too is a usage error rather than a silent choice between the two.
#[test]
fn dash_p_listens_on_that_port_and_conflicts_with_listen() {
    let out = secure_server(&["-p", "4999", "--listen", "127.0.0.1:4433"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot be used with"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    secure_rdma::certs::init(&certs, &["localhost".into()]).expect("certs");
    // A port free a moment ago; the server binds it on 0.0.0.0.
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_secure-server"))
        .args(["-p", &port.to_string(), "--log-format", "json", "--certs"])
        .arg(&certs)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn secure-server");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let listen = loop {
        let Ok(line) = lines.recv_timeout(std::time::Duration::from_secs(60)) else {
            let _ = child.kill();
            panic!("secure-server -p {port} not ready within 60 s");
        };
        if let Some(listen) = common::ready_listen(&line) {
            break listen;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(listen, format!("0.0.0.0:{port}"));
}

/// Sessions on one shared receive queue share its protection domain, so a region's own rkey
/// (`--no-memory-windows`) would reach every session's memory: the combination is refused with
/// why, from the flags and from the config file alike, and a size that is not a number is a
/// usage error.
#[test]
fn a_shared_receive_queue_without_memory_windows_is_refused_saying_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let certs = dir.path().join("certs");
    secure_rdma::certs::init(&certs, &["localhost".into()]).expect("certs");
    let certs = certs.to_str().expect("utf-8 path");
    let config = dir.path().join("server.toml");
    std::fs::write(
        &config,
        "shared-receive-queue = 1024\nno-memory-windows = true\n",
    )
    .expect("write config");
    for args in [
        vec![
            "--shared-receive-queue",
            "1024",
            "--no-memory-windows",
            "--certs",
            certs,
        ],
        vec![
            "--config",
            config.to_str().expect("utf-8 path"),
            "--certs",
            certs,
        ],
    ] {
        let out = secure_server(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("--shared-receive-queue needs memory windows")
                && err.contains("one protection domain"),
            "{args:?}: {err}"
        );
    }
    let out = secure_server(&["--shared-receive-queue", "many"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--shared-receive-queue"));
    let help = String::from_utf8_lossy(&secure_server(&["--help"]).stdout).to_string();
    assert!(help.contains("--shared-receive-queue <SLOTS>"), "{help}");
}
