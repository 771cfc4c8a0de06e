//! The local-user case (NeVerMore) on real Soft-RoCE: any local user can send a forged
//! RoCEv2 packet into a queue pair with an ordinary UDP socket, and
//! `setup-softroce.sh --restrict-local` stops that while root's sockets and rxe's own traffic
//! (kernel sockets, which have no owner) still pass.
//!
//! The forged packet (the `udp-forge` helper, run as `nobody`) is a SEND Only for the live QP
//! on rxe-a with the PSN just behind the expected one: when it arrives, rxe-a counts a
//! `duplicate_request`, so the counter shows whether it got through.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Instant;

use secure_rdma_tests::inject::{hw_counter, hw_counter_settled, wait_hw_counter, LivePair};
use secure_rdma_tests::{require_lab, text};
use serde_json::Value;

const SETUP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/setup-softroce.sh");
const FORGE: &str = env!("CARGO_BIN_EXE_udp-forge");
const RULE_LINE: &str = "restrict-local on table=inet/secure_rdma_local \
                         rule=\"udp dport 4791 meta skuid != 0 counter drop\"";

/// Runs setup-softroce.sh with `args`; its stdout.
fn setup_softroce(args: &[&str]) -> String {
    let out = Command::new("bash")
        .arg(SETUP)
        .args(args)
        .output()
        .expect("run setup-softroce.sh");
    assert!(
        out.status.success(),
        "setup-softroce.sh {args:?}: {}",
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Removes the rule when the test ends, passed or not, so later tests in the VM run without it.
struct Unrestrict;

impl Drop for Unrestrict {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(SETUP)
            .arg("--unrestrict-local")
            .output();
    }
}

/// `nobody`'s uid and gid.
fn nobody() -> (u32, u32) {
    // SAFETY: a NUL-terminated name; the result is read before any other getpw* call.
    let pw = unsafe { libc::getpwnam(c"nobody".as_ptr()) };
    assert!(!pw.is_null(), "no user nobody");
    // SAFETY: non-null, from getpwnam.
    unsafe { ((*pw).pw_uid, (*pw).pw_gid) }
}

/// The helper where an unprivileged user can run it: target/ may sit under a directory only
/// root can enter (a clone in `mktemp -d`, mode 0700), so it is copied into a fresh directory
/// anyone can traverse, once per test run.
fn forge_binary() -> &'static std::path::Path {
    use std::os::unix::fs::PermissionsExt;
    static COPY: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("udp-forge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create a directory for udp-forge");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .expect("make it traversable");
        let exe = dir.join("udp-forge");
        std::fs::copy(FORGE, &exe).expect("copy udp-forge");
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))
            .expect("make udp-forge executable by anyone");
        exe
    })
}

/// Sends the forged datagram as `user` (or root); the helper's JSON line.
fn forge(user: Option<(u32, u32)>, qpn: u32, psn: u32) -> Value {
    let mut cmd = Command::new(forge_binary());
    cmd.args(["--qpn", &qpn.to_string(), "--psn", &psn.to_string()]);
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
    let out = cmd.output().expect("run udp-forge");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "udp-forge printed no JSON ({e}): {} {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

/// Packets the rule dropped, from `nft list table`.
fn dropped() -> u64 {
    let out = Command::new("nft")
        .args(["list", "table", "inet", "secure_rdma_local"])
        .output()
        .expect("run nft");
    assert!(out.status.success(), "nft: {}", text(&out.stderr));
    let listing = text(&out.stdout);
    let rules: Vec<&str> = listing.lines().filter(|l| l.contains(" drop")).collect();
    assert_eq!(
        rules.len(),
        1,
        "one rule, however often it was added:\n{listing}"
    );
    let words: Vec<&str> = rules[0].split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "packets")
        .and_then(|i| words.get(i + 1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no packet count in {:?}", rules[0]))
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn restrict_local_stops_unprivileged_roce_packets_but_not_root_or_rxe() {
    require_lab();
    let _cleanup = Unrestrict;
    assert_eq!(
        setup_softroce(&["--unrestrict-local", "--quiet"]).trim(),
        "restrict-local off table=inet/secure_rdma_local"
    );
    let mut pair = LivePair::connect();
    pair.exchange(2).expect("the pair works");
    let user = nobody();
    let qpn = pair.a_qpn();
    // A PSN the QP already consumed: a duplicate when it arrives, never delivered.
    let psn = pair.a_expected_psn().wrapping_sub(1) & 0x00ff_ffff;

    // Without the rule, nobody's ordinary UDP datagram reaches rxe-a's QP.
    let dup0 = hw_counter("rxe-a", "duplicate_request");
    let sent = forge(Some(user), qpn, psn);
    assert_eq!(sent["uid"], user.0);
    assert!(sent["sent"].as_u64().is_some(), "{sent}");
    let dup1 = wait_hw_counter("rxe-a", "duplicate_request", dup0 + 1);

    // With the rule (added twice: the same one rule), nobody's send is refused.
    assert_eq!(
        setup_softroce(&["--restrict-local", "--quiet"]).trim(),
        RULE_LINE
    );
    assert_eq!(
        setup_softroce(&["--restrict-local", "--quiet"]).trim(),
        RULE_LINE
    );
    assert_eq!(dropped(), 0);
    let refused = forge(Some(user), qpn, psn);
    assert_eq!(refused["errno"], libc::EPERM, "{refused}");
    assert_eq!(dropped(), 1);
    // Root's identical datagram goes through, after nobody's: if nobody's had left, the
    // counter would now be 2 ahead, not 1.
    let sent = forge(None, qpn, psn);
    assert!(sent["sent"].as_u64().is_some(), "{sent}");
    wait_hw_counter("rxe-a", "duplicate_request", dup1 + 1);
    let dup2 = hw_counter_settled("rxe-a", "duplicate_request");
    assert_eq!(dup2, dup1 + 1, "only root's datagram arrived");

    // rxe's own traffic (kernel sockets, no owner) is untouched by the rule.
    const MESSAGES: u32 = 50;
    let rcvd0 = hw_counter("rxe-a", "rcvd_pkts");
    let start = Instant::now();
    pair.exchange(MESSAGES)
        .expect("rxe traffic with the rule in place");
    let took = start.elapsed();
    // ib_core caches what the driver reports for a few milliseconds: wait, do not read once.
    let rcvd = wait_hw_counter("rxe-a", "rcvd_pkts", rcvd0 + u64::from(MESSAGES)) - rcvd0;
    assert_eq!(dropped(), 1, "the rule dropped none of rxe's packets");

    // Removed, nobody can send again.
    assert_eq!(
        setup_softroce(&["--unrestrict-local", "--quiet"]).trim(),
        "restrict-local off table=inet/secure_rdma_local"
    );
    let sent = forge(Some(user), qpn, psn);
    assert!(sent["sent"].as_u64().is_some(), "{sent}");
    let dup3 = wait_hw_counter("rxe-a", "duplicate_request", dup2 + 1);
    println!(
        "restrict-local: without the rule nobody's forged datagram arrived (duplicate_request \
         {dup0} -> {dup1}); with it nobody got EPERM (errno {}), the rule dropped 1 packet, \
         root's arrived ({dup1} -> {dup2}), {MESSAGES} SENDs between rxe-a and rxe-b passed \
         ({rcvd} packets received by rxe-a in {took:?}); removed, nobody's arrived again \
         ({dup2} -> {dup3})",
        refused["errno"]
    );
}
