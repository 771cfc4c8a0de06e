//! `secure-client` as a user first meets it: its name and version, documented exit codes,
//! choices listed in `--help`, and clap's error for a bad one.

use std::process::{Command, Output};

fn secure_client(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_secure-client"))
        .args(args)
        .output()
        .expect("run secure-client")
}

#[test]
fn version_help_and_bad_choices_follow_the_family_conventions() {
    let out = secure_client(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("secure-client {}", env!("CARGO_PKG_VERSION"))
    );
    let help = String::from_utf8_lossy(&secure_client(&["--help"]).stdout).into_owned();
    for documented in [
        "Exit codes: 0 ok",
        "9 the server's offer",
        "chacha20-poly1305",
    ] {
        assert!(
            help.contains(documented),
            "{documented} missing from:\n{help}"
        );
    }
    for args in [
        &["h", "--cipher", "nonsense"][..],
        &["h", "--log-format", "nonsense"],
        &["h", "bench", "send", "--poll", "nonsense"],
    ] {
        let out = secure_client(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("[possible values: "), "{args:?}: {err}");
    }
}
