//! Attacks on the secure-rdma data path with `rdma-inject`, on real Soft-RoCE: the server on
//! 10.77.0.1 (`rxe-a`), its client on 10.77.0.2 (`rxe-b`), the attacker on `veth-b`, where a
//! frame it sends reaches `rxe-a` exactly like `rxe-b`'s own.
//!
//! Each attack is a function that takes the server's and the client's extra flags and returns
//! what it observed, so the same attack runs against an unprotected session (the baselines
//! here, which prove the tool: every attack works) and, with other flags, against a protected
//! one. The baselines assert what rxe does today; the numbers they measure are printed.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use secure_rdma_tests::injector::{Injector, Report as InjectReport};
use secure_rdma_tests::piped::Piped as Victim;
use secure_rdma_tests::secure::{unquote, Pki, ServerProc};
use secure_rdma_tests::{require_lab, wait_until, ADDR_A, ADDR_B};
use serde_json::Value;

/// How long one lab step may take under TCG before the test fails.
const STEP: Duration = Duration::from_secs(90);
/// The attacker's interface: the client's link.
const ATTACKER_IFACE: &str = "veth-b";
/// The forged SEND's content.
const FORGED_SEND: &str = "FORGED-BY-ATTACKER";
/// The forged WRITE's content.
const FORGED_WRITE: &str = "FORGED-WRITE-BY-ATTACKER";
/// The client's identity in every test.
const VICTIM: &str = "victim";

/// Extra flags for the server and the client: none for today's baseline; the protected
/// variants pass their own.
#[derive(Clone, Copy, Debug)]
struct Flags<'a> {
    server: &'a [&'a str],
    client: &'a [&'a str],
}

/// Payload protection off on both ends: the attacks must work (this proves the tool).
const BASELINE: Flags<'static> = Flags {
    server: &["--no-payload-protection"],
    client: &["--no-payload-protection"],
};

/// The defaults: every payload sealed. The server also reports its counters every second.
const PROTECTED: Flags<'static> = Flags {
    server: &["--telemetry", "--telemetry-interval", "1"],
    client: &["--reconnect-attempts", "20"],
};

// ------------------------------------------------------------------ rxe counters

/// `/sys/class/infiniband/DEV/ports/1/hw_counters/*`.
fn hw_counters(dev: &str) -> BTreeMap<String, u64> {
    let dir = format!("/sys/class/infiniband/{dev}/ports/1/hw_counters");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("reading {dir}: {e}")) {
        let entry = entry.expect("dir entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(v) = std::fs::read_to_string(entry.path())
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            out.insert(name, v);
        }
    }
    out
}

/// The counters that moved between two readings, `name: +delta`.
fn deltas(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(before.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

fn delta(d: &BTreeMap<String, u64>, name: &str) -> u64 {
    d.get(name).copied().unwrap_or(0)
}

/// Both devices' counters.
#[derive(Clone, Debug)]
struct Counters {
    a: BTreeMap<String, u64>,
    b: BTreeMap<String, u64>,
}

impl Counters {
    fn read() -> Counters {
        Counters {
            a: hw_counters("rxe-a"),
            b: hw_counters("rxe-b"),
        }
    }

    /// What moved since `self`, per device.
    fn since(&self) -> (BTreeMap<String, u64>, BTreeMap<String, u64>) {
        let now = Counters::read();
        (deltas(&self.a, &now.a), deltas(&self.b, &now.b))
    }
}

// ------------------------------------------------------------------ the victim session

/// Waits until the client reported an acknowledgement it never asked for (a forged message,
/// with payload protection off) and reconnected.
fn noticed_the_forgery_and_reconnected(victim: &Victim) {
    victim.err.wait_for("the client noticing", 1, STEP, |l| {
        l.contains("session lost") && l.contains("forged")
    });
    victim.wait_out("reconnected", |l| l.starts_with("reconnected to "), 1);
}

/// A server and its connected client.
struct Session {
    _pki: Pki,
    server: ServerProc,
    victim: Victim,
    /// The server's QPN for this client (from its "client connected" event).
    server_qpn: u64,
}

impl Session {
    fn start(port: u16, flags: Flags<'_>) -> Session {
        require_lab();
        let pki = Pki::new();
        pki.clients(&[VICTIM.to_owned()]);
        let server = ServerProc::start(&pki, port, flags.server);
        let victim = Victim::secure_client(pki.dir(), server.port, VICTIM, 10, flags.client);
        server.log.wait_for("client connected", 1, STEP, |l| {
            l.contains("client connected")
        });
        // QPNs are logged at debug only (the lab runs the server with secure_rdma=debug).
        let wiring = server
            .events("RDMA wiring")
            .pop()
            .expect("RDMA wiring event (debug)");
        let server_qpn = hex(&wiring["qpn"]);
        Session {
            _pki: pki,
            server,
            victim,
            server_qpn,
        }
    }

    fn context(&self) -> String {
        format!(
            "server log:\n{}\n{}",
            self.server.log.snapshot().join("\n"),
            self.victim.context()
        )
    }

    /// The server's received messages of `kind` ("SEND received", "WRITE landed"), as
    /// (client, seq, content) in log order.
    fn delivered(&self, kind: &str) -> Vec<(String, u64, String)> {
        self.server.delivered(kind)
    }

    /// Waits until the server delivered `content` (as `kind`), or reported the attack, or
    /// dropped the client: whichever comes first. True if delivered.
    fn wait_delivery_or_reaction(&self, kind: &str, content: &str) -> bool {
        let delivered = |l: &str| {
            serde_json::from_str::<Value>(l)
                .is_ok_and(|e| e["message"] == kind && unquote(&e["content"]) == content)
        };
        let reacted = |l: &str| l.contains("failed authentication") || l.contains("client gone");
        self.server.log.wait_for(
            &format!("{kind} {content} or the server's reaction"),
            1,
            STEP,
            |l| delivered(l) || reacted(l),
        );
        self.server.log.snapshot().iter().any(|l| delivered(l))
    }
}

fn hex(v: &Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("{v} is not a string"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("{s}: {e}"))
}

// ------------------------------------------------------------------ the attacker

/// rdma-inject observing the client's link for the flow to the server, with `extra` flags.
fn observe(extra: &[&str]) -> Injector {
    Injector::observe(ATTACKER_IFACE, ADDR_A, extra)
}

// ------------------------------------------------------------------ the attacks

/// What an on-path injection did.
struct OnPath {
    session: Session,
    report: InjectReport,
    /// True if the server delivered the forged content (false: it reacted otherwise).
    delivered: bool,
    counters: Counters,
    /// The genuine operation the injector learned from, and its acknowledgement.
    first_ack: String,
}

/// The on-path attacks (issue 11, tests 1, 2 and 4): a live session; the client does `genuine` (a send or write); the
/// attacker, observing `veth-b`, injects `inject` (`--send TEXT` or `--write-imm TEXT`) at
/// the next PSN. Returns once the server delivered the forgery or reacted to it.
fn on_path(port: u16, flags: Flags<'_>, genuine: &str, inject: [&str; 2]) -> OnPath {
    let mut session = Session::start(port, flags);
    let counters = Counters::read();
    let injector = observe(&inject);
    let first_ack = session.victim.op(genuine);
    let report = injector.finish();
    let (kind, content) = match inject[0] {
        "--send" => ("SEND received", inject[1]),
        _ => ("WRITE landed", inject[1]),
    };
    let delivered = session.wait_delivery_or_reaction(kind, content);
    OnPath {
        session,
        report,
        delivered,
        counters,
        first_ack,
    }
}

/// Checks what rdma-inject said it learned and sent against the session.
fn check_injection(run: &OnPath, opcode: &str) {
    let flow = &run.report.summary["flow"];
    assert_eq!(run.report.injected.len(), 1, "{:?}", run.report);
    let inj = &run.report.injected[0];
    assert_eq!(inj["opcode"], opcode);
    assert_eq!(inj["dst_qpn"].as_u64(), Some(run.session.server_qpn));
    assert_eq!(flow["dst_qpn"].as_u64(), Some(run.session.server_qpn));
    assert_eq!(inj["psn"], flow["next_psn"]);
    assert_eq!(
        flow["next_psn"].as_u64(),
        flow["last_psn"].as_u64().map(|p| (p + 1) & 0xff_ffff)
    );
    assert_eq!(flow["src_ip"], ADDR_B);
    assert_eq!(flow["dst_ip"], ADDR_A);
}

/// After a forgery consumed the client's next PSN: two more genuine operations. Returns the
/// client's acknowledgements of both.
fn follow_up(run: &mut OnPath, verb: &str) -> (String, String) {
    let second = run
        .session
        .victim
        .op(&format!("{verb} second genuine {verb}"));
    let third = run
        .session
        .victim
        .op(&format!("{verb} third genuine {verb}"));
    (second, third)
}

// ------------------------------------------------------------------ baselines

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn baseline_on_path_forged_send_is_delivered_as_the_client() {
    let mut run = on_path(
        4560,
        BASELINE,
        "send hello from the real client",
        ["--send", FORGED_SEND],
    );
    check_injection(&run, "RC SEND Only");
    assert!(
        run.delivered,
        "forged SEND not delivered\n{}",
        run.session.context()
    );
    // Attributed to the authenticated client, as its second message.
    let sends = run.session.delivered("SEND received");
    assert_eq!(
        sends[1],
        (VICTIM.to_owned(), 2, FORGED_SEND.to_owned()),
        "{sends:?}"
    );
    assert_eq!(
        run.first_ack,
        format!(
            "server acknowledged send #1: {} bytes",
            "hello from the real client".len()
        )
    );

    // The forgery took the PSN the client would use next. Had the client kept the session,
    // rxe-a would drop its next SEND as a duplicate and the client would read the server's
    // acknowledgement of the *forged* message as its own. But the idle client reads its TLS
    // channel: an acknowledgement of an operation it never made means a forged message, so it
    // drops the session and reconnects, and its next messages arrive on the new session.
    noticed_the_forgery_and_reconnected(&run.session.victim);
    let (second, third) = follow_up(&mut run, "send");
    let sends = run.session.delivered("SEND received");
    let (d_a, d_b) = run.counters.since();
    eprintln!(
        "forged SEND: delivered as {:?}; client's next acks {second:?}, {third:?}; server got \
         {sends:?}; rxe-a counters {d_a:?}; rxe-b counters {d_b:?}",
        sends[1]
    );
    assert_eq!(
        second,
        format!(
            "server acknowledged send #1: {} bytes",
            "second genuine send".len()
        )
    );
    assert_eq!(
        third,
        format!(
            "server acknowledged send #2: {} bytes",
            "third genuine send".len()
        )
    );
    let contents: Vec<&str> = sends.iter().map(|s| s.2.as_str()).collect();
    assert_eq!(
        contents,
        [
            "hello from the real client",
            FORGED_SEND,
            "second genuine send",
            "third genuine send"
        ],
    );
    assert!(run.session.victim.quit_ok());
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn baseline_forged_write_with_immediate_lands_at_the_observed_rkey_and_address() {
    let mut run = on_path(
        4561,
        BASELINE,
        "write genuine bytes of the client",
        ["--write-imm", FORGED_WRITE],
    );
    check_injection(&run, "RC RDMA WRITE Only with Immediate");
    let write = run.report.summary["flow"]["write"].clone();
    assert!(write["rkey"].is_u64() && write["va"].is_u64(), "{write}");
    assert_eq!(
        write["dma_len"].as_u64(),
        Some("genuine bytes of the client".len() as u64)
    );
    assert!(
        run.delivered,
        "forged WRITE not delivered\n{}",
        run.session.context()
    );
    let writes = run.session.delivered("WRITE landed");
    assert_eq!(
        writes[1],
        (VICTIM.to_owned(), 2, FORGED_WRITE.to_owned()),
        "{writes:?}"
    );
    noticed_the_forgery_and_reconnected(&run.session.victim);
    let (second, third) = follow_up(&mut run, "write");
    let writes = run.session.delivered("WRITE landed");
    let (d_a, d_b) = run.counters.since();
    eprintln!(
        "forged WRITE: rkey {} va {:#x}; client's next acks {second:?}, {third:?}; server got \
         {writes:?}; rxe-a counters {d_a:?}; rxe-b counters {d_b:?}",
        write["rkey"],
        write["va"].as_u64().unwrap_or(0)
    );
    assert_eq!(
        second,
        format!(
            "server acknowledged write #1: {} bytes",
            "second genuine write".len()
        )
    );
    assert_eq!(
        third,
        format!(
            "server acknowledged write #2: {} bytes",
            "third genuine write".len()
        )
    );
    let contents: Vec<&str> = writes.iter().map(|s| s.2.as_str()).collect();
    assert_eq!(
        contents,
        [
            "genuine bytes of the client",
            FORGED_WRITE,
            "second genuine write",
            "third genuine write"
        ]
    );
    assert!(run.session.victim.quit_ok());
}

/// What the replay attack observed.
struct Replayed {
    session: Session,
    /// The captured message.
    captured: String,
    /// Delivered again after a verbatim replay (the captured PSN)?
    verbatim_delivered: bool,
    /// rxe-a's counters that moved during the verbatim replay.
    verbatim_deltas: BTreeMap<String, u64>,
    /// What the renumbered replay sent.
    report: InjectReport,
    /// Delivered again after the renumbered replay?
    renumbered_delivered: bool,
}

/// The replay attack (issue 11, test 3): capture one genuine SEND (rdma-inject --observe --save), replay it verbatim
/// (its old PSN), then renumbered to the live flow's next PSN.
fn replay_attack(port: u16, flags: Flags<'_>, dir: &Path) -> Replayed {
    let mut session = Session::start(port, flags);
    let pcap = dir.join("legit.pcap");
    let pcap_s = pcap.to_str().expect("utf-8 path");
    let captured = "LEGIT-TRANSFER: pay 100 to bob".to_owned();

    // Capture: learn only, saving the flow's requests.
    let learner = observe(&["--save", pcap_s]);
    session.victim.op(&format!("send {captured}"));
    let learned = learner.finish();
    assert_eq!(learned.injected.len(), 0);
    assert_eq!(
        learned.summary["saved"].as_u64(),
        Some(1),
        "{:?}",
        learned.summary
    );

    // Verbatim: its PSN is behind the responder's, so rxe-a must count it as a duplicate.
    let before = hw_counters("rxe-a");
    let verbatim = Injector::start(&["--replay", pcap_s, "--iface", ATTACKER_IFACE]).finish();
    assert_eq!(verbatim.injected.len(), 1);
    let moved = |name: &str| delta(&deltas(&before, &hw_counters("rxe-a")), name) > 0;
    wait_until(
        "rxe-a to count the verbatim replay (duplicate_request or out_of_seq_request)",
        STEP,
        || moved("duplicate_request") || moved("out_of_seq_request") || moved("rcvd_pkts"),
        || session.context(),
    );
    let verbatim_deltas = deltas(&before, &hw_counters("rxe-a"));

    // Renumbered: observe the live flow, wait for the client's next message, then replay the
    // captured SEND at the next PSN.
    let renumber = observe(&["--replay", pcap_s]);
    session.victim.op("send second genuine send");
    let report = renumber.finish();
    // RC delivers in order: had the verbatim replay been delivered, the captured message
    // would show twice before the second genuine send.
    let verbatim_delivered = session
        .delivered("SEND received")
        .iter()
        .take_while(|s| s.2 != "second genuine send")
        .filter(|s| s.2 == captured)
        .count()
        > 1;
    let renumbered_delivered = session.wait_delivery_or_reaction("SEND received", &captured)
        && session
            .delivered("SEND received")
            .iter()
            .filter(|s| s.2 == captured)
            .count()
            == 2;
    Replayed {
        session,
        captured,
        verbatim_delivered,
        verbatim_deltas,
        report,
        renumbered_delivered,
    }
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn baseline_replay_of_a_captured_send_renumbered_to_the_next_psn_is_delivered_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = replay_attack(4562, BASELINE, dir.path());
    let sends = r.session.delivered("SEND received");
    eprintln!(
        "replay: verbatim delivered {}, rxe-a counters {:?}; renumbered delivered {}; \
         injected {:?}; server got {sends:?}",
        r.verbatim_delivered, r.verbatim_deltas, r.renumbered_delivered, r.report.injected
    );
    // Verbatim, RC's PSN check stops it: a duplicate, acknowledged and dropped.
    assert!(!r.verbatim_delivered, "{sends:?}");
    assert!(
        delta(&r.verbatim_deltas, "duplicate_request") >= 1,
        "{:?}",
        r.verbatim_deltas
    );
    // Renumbered, it is the client's message again.
    assert!(r.renumbered_delivered, "{}", r.session.context());
    assert_eq!(r.report.summary["renumbered"], true);
    assert_eq!(r.report.injected.len(), 1);
    assert_eq!(
        r.report.injected[0]["psn"],
        r.report.summary["flow"]["next_psn"]
    );
    assert_eq!(
        sends,
        [
            (VICTIM.to_owned(), 1, r.captured.clone()),
            (VICTIM.to_owned(), 2, "second genuine send".to_owned()),
            (VICTIM.to_owned(), 3, r.captured.clone()),
        ]
    );
    assert!(r.session.victim.quit_ok());
}

/// What the blind attack observed.
struct Blind {
    session: Session,
    report: InjectReport,
    /// Guesses the server delivered.
    delivered: usize,
    /// The client's acknowledgement of its next message.
    next_ack: String,
    /// Whether that next message reached the server.
    next_delivered: bool,
    /// Counter deltas on rxe-a and rxe-b over the attack and the next message.
    deltas_a: BTreeMap<String, u64>,
    deltas_b: BTreeMap<String, u64>,
    /// veth-a's receive drops over the attack.
    veth_a_rx_dropped: u64,
}

const BLIND_PAYLOAD: &str = "BLIND-GUESS";

/// The off-path attack (issue 11, tests 5 and 6): `guesses` random PSNs at the session's QPN from an off-path attacker who knows
/// the addresses and QPN (rxe allocates QPNs in order) but sees no traffic; then the client
/// sends its next message.
fn blind_attack(port: u16, flags: Flags<'_>, guesses: u32) -> Blind {
    let mut session = Session::start(port, flags);
    session.victim.op("send before the blind attack");
    let veth_a_mac = std::fs::read_to_string("/sys/class/net/veth-a/address")
        .expect("veth-a MAC")
        .trim()
        .to_owned();
    let counters = Counters::read();
    let dropped_before = secure_rdma_tests::netdev_counter("veth-a", "rx_dropped");
    let qpn = session.server_qpn.to_string();
    let guesses_s = guesses.to_string();
    let report = Injector::start(&[
        "--blind",
        "--iface",
        ATTACKER_IFACE,
        "--src",
        ADDR_B,
        "--dst",
        ADDR_A,
        "--dst-mac",
        &veth_a_mac,
        "--qpn",
        &qpn,
        "--guesses",
        &guesses_s,
        "--send",
        BLIND_PAYLOAD,
        "--timeout",
        "600",
    ])
    .finish();
    // In order on the QP: once the next genuine message is delivered (or the client gave up),
    // every guess before it was processed.
    session.victim.command("send after the blind attack");
    wait_until(
        "the client's next send to be acknowledged or fail",
        STEP,
        || {
            session.victim.acks().len() >= 2
                || session
                    .victim
                    .err
                    .snapshot()
                    .iter()
                    .any(|l| l.contains("secure-client:"))
        },
        || session.context(),
    );
    let next_ack = session.victim.acks().get(1).cloned().unwrap_or_default();
    let sends = session.delivered("SEND received");
    let delivered = sends.iter().filter(|s| s.2 == BLIND_PAYLOAD).count();
    let next_delivered = sends.iter().any(|s| s.2 == "after the blind attack");
    let (deltas_a, deltas_b) = counters.since();
    let veth_a_rx_dropped =
        secure_rdma_tests::netdev_counter("veth-a", "rx_dropped") - dropped_before;
    Blind {
        session,
        report,
        delivered,
        next_ack,
        next_delivered,
        deltas_a,
        deltas_b,
        veth_a_rx_dropped,
    }
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn baseline_blind_ten_thousand_psn_guesses_deliver_nothing_and_show_in_rxe_counters() {
    const GUESSES: u32 = 10_000;
    let b = blind_attack(4563, BASELINE, GUESSES);
    let s = &b.report.summary;
    eprintln!(
        "blind: {} guesses at QPN {:#x} in {} ms ({:.0} packets/s, seed {}); delivered {}; \
         client's next send: {:?} (delivered {}); rxe-a counters {:?}; rxe-b counters {:?}; \
         veth-a rx_dropped +{}",
        s["sent"],
        b.session.server_qpn,
        s["elapsed_ms"],
        s["packets_per_sec"].as_f64().unwrap_or(0.0),
        s["seed"],
        b.delivered,
        b.next_ack,
        b.next_delivered,
        b.deltas_a,
        b.deltas_b,
        b.veth_a_rx_dropped
    );
    assert_eq!(s["sent"].as_u64(), Some(u64::from(GUESSES)));
    assert_eq!(b.report.injected.len(), GUESSES as usize);
    assert!(b
        .report
        .injected
        .iter()
        .all(|i| i["dst_qpn"].as_u64() == Some(b.session.server_qpn)));
    // One exact PSN out of 2^24: a hit has probability 10^4 / 2^24 = 0.06 %.
    assert_eq!(b.delivered, 0);
    // The session survives: the client's next message is delivered as its second.
    assert!(b.next_delivered, "{}", b.session.context());
    assert_eq!(
        b.next_ack,
        format!(
            "server acknowledged send #2: {} bytes",
            "after the blind attack".len()
        )
    );
    // Detection: every guess reaches rxe-a (bar the veth's own drops). Half the PSN space is
    // "behind" the expected PSN: each such guess is a duplicate request (about 5,000); a guess
    // ahead is out of sequence, counted once until an in-order packet clears the NAK state.
    let received = GUESSES as u64 - b.veth_a_rx_dropped;
    assert!(
        delta(&b.deltas_a, "rcvd_pkts") >= received,
        "rcvd_pkts +{} < {received}: {:?}",
        delta(&b.deltas_a, "rcvd_pkts"),
        b.deltas_a
    );
    assert!(
        delta(&b.deltas_a, "duplicate_request") >= received * 2 / 5,
        "{:?}",
        b.deltas_a
    );
    assert!(
        delta(&b.deltas_a, "out_of_seq_request") >= 1,
        "{:?}",
        b.deltas_a
    );
    assert!(b.session.victim.quit_ok());
}

// ------------------------------------------------------------------ with payload protection

impl Session {
    /// The server's "failed authentication" warnings.
    fn auth_failures(&self) -> Vec<Value> {
        self.server.auth_failures()
    }

    /// Checks the server's whole reaction to one forged or replayed message: the warning naming
    /// the client, the session torn down, the counter at `count` in its telemetry report, the
    /// client told why and reconnected.
    fn rejected_and_recovered(&self, count: u64) {
        let warned = |l: &str| l.contains("failed authentication");
        self.server
            .log
            .wait_for("the authentication warning", 1, STEP, warned);
        let warnings = self.auth_failures();
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert_eq!(warnings[0]["client"], VICTIM);
        assert_eq!(warnings[0]["failures"].as_u64(), Some(count));
        assert_eq!(warnings[0]["level"], "WARN");
        assert!(
            warnings[0]["message"].as_str().is_some_and(|m| m
                .contains("RDMA message failed authentication (forged, replayed or corrupted)")),
            "{warnings:#?}"
        );
        // Torn down.
        let gone =
            |l: &str| l.contains("client gone") && l.contains("RDMA message failed authentication");
        self.server
            .log
            .wait_for("the session torn down", 1, STEP, gone);
        // Counted: the telemetry report carries it per identity.
        let counted = |l: &str| {
            serde_json::from_str::<Value>(l).is_ok_and(|e| {
                e["message"] == "telemetry"
                    && e["report"]
                        .as_str()
                        .and_then(|r| serde_json::from_str::<Value>(r).ok())
                        .is_some_and(|r| r["auth_failures"][VICTIM].as_u64() == Some(count))
            })
        };
        self.server
            .log
            .wait_for("auth_failures in the telemetry report", 1, STEP, counted);
        // The client is told why over TLS, and reconnects by itself.
        self.victim.err.wait_for("session lost", 1, STEP, |l| {
            l.contains("session lost") && l.contains("failed authentication")
        });
        self.victim
            .wait_out("reconnected", |l| l.starts_with("reconnected to "), 1);
        // It resumed its stream: every operation before the forgery was acknowledged, so
        // nothing was learned while away and nothing is sent again (issue 20).
        self.victim.err.wait_for("the resume line", 1, STEP, |l| {
            l.starts_with("secure-client: resumed stream ")
                && l.ends_with(": 0 acknowledged while away, 0 sent again")
        });
    }
}

/// Issue 11, tests 2 and 4: an on-path forgery (`inject`) after one genuine `verb` ("send" or
/// "write"), with payload protection on. Nothing forged is delivered, the server reacts in full
/// ([`Session::rejected_and_recovered`]), and the client's next `verb` is delivered on its new
/// session as the stream's second operation (issue 20: acknowledgements are numbered by the
/// client's stream, which the new session resumes).
fn forged_and_rejected(port: u16, verb: &str, inject: [&str; 2], opcode: &str) -> OnPath {
    let genuine = format!("genuine {verb} of the client");
    let mut run = on_path(port, PROTECTED, &format!("{verb} {genuine}"), inject);
    check_injection(&run, opcode);
    assert!(
        !run.delivered,
        "forged {verb} delivered\n{}",
        run.session.context()
    );
    run.session.rejected_and_recovered(1);
    let next = format!("{verb} after the forgery");
    let ack = run.session.victim.op(&next);
    assert_eq!(
        ack,
        format!(
            "server acknowledged {verb} #2: {} bytes",
            "after the forgery".len()
        )
    );
    let kind = if verb == "send" {
        "SEND received"
    } else {
        "WRITE landed"
    };
    let contents: Vec<String> = run
        .session
        .delivered(kind)
        .into_iter()
        .map(|s| s.2)
        .collect();
    assert_eq!(contents, [genuine.as_str(), "after the forgery"]);
    let (d_a, _) = run.counters.since();
    eprintln!("protected, forged {verb}: 0 delivered, session torn down and re-established; rxe-a {d_a:?}");
    run
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn protected_on_path_forged_send_is_rejected_torn_down_and_the_client_reconnects() {
    let run = forged_and_rejected(4564, "send", ["--send", FORGED_SEND], "RC SEND Only");
    assert!(run.session.victim.quit_ok());
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn protected_forged_write_with_immediate_is_rejected_and_addresses_are_zero_based() {
    let run = forged_and_rejected(
        4566,
        "write",
        ["--write-imm", FORGED_WRITE],
        "RC RDMA WRITE Only with Immediate",
    );
    // The observed address is the region's offset, not a heap address (ReDMArk).
    let write = &run.report.summary["flow"]["write"];
    assert_eq!(write["va"].as_u64(), Some(0), "{write}");
    assert!(run.session.victim.quit_ok());
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn protected_replay_renumbered_to_the_next_psn_is_rejected() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = replay_attack(4565, PROTECTED, dir.path());
    let sends = r.session.delivered("SEND received");
    eprintln!(
        "protected replay: verbatim delivered {}, renumbered delivered {}; server got {sends:?}",
        r.verbatim_delivered, r.renumbered_delivered
    );
    assert!(!r.verbatim_delivered, "{sends:?}");
    assert!(!r.renumbered_delivered, "{}", r.session.context());
    assert_eq!(r.report.injected.len(), 1);
    r.session.rejected_and_recovered(1);
    assert_eq!(
        sends,
        [
            (VICTIM.to_owned(), 1, r.captured.clone()),
            (VICTIM.to_owned(), 2, "second genuine send".to_owned()),
        ]
    );
    assert!(r.session.victim.quit_ok());
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn protected_blind_ten_thousand_psn_guesses_deliver_nothing() {
    const GUESSES: u32 = 10_000;
    let b = blind_attack(4567, PROTECTED, GUESSES);
    let failures = b.session.auth_failures().len();
    eprintln!(
        "protected blind: {} guesses, delivered {}, authentication failures {failures},          client's next send {:?} (delivered {}); rxe-a {:?}",
        b.report.summary["sent"], b.delivered, b.next_ack, b.next_delivered, b.deltas_a
    );
    assert_eq!(b.report.injected.len(), GUESSES as usize);
    assert_eq!(b.delivered, 0);
    // No guess hit the next PSN (probability 0.06 %): the session goes on untouched, and the
    // guesses show as duplicates in rxe-a's counters (rdma-monitor reports them; see
    // hwcounters_lab.rs).
    assert_eq!(failures, 0);
    assert!(b.next_delivered, "{}", b.session.context());
    assert!(delta(&b.deltas_a, "duplicate_request") >= 2 * u64::from(GUESSES) / 5);
    assert!(b.session.victim.quit_ok());
}

// ------------------------------------------------------------------ the acknowledgement direction

/// The attacker on the server's link: a frame sent out of `veth-a` reaches `rxe-b` (the
/// client) exactly like `rxe-a`'s own, as `veth-b` does for the other direction.
const SERVER_LINK: &str = "veth-a";
/// What the forged acknowledgement claims the server received for the client's second send.
const FORGED_ACK_BYTES: u32 = 1_000_000;

/// The server's acknowledgement of the client's second send, as a forger writes it: the
/// streaming data path's 13-byte record (`Ack::encode`), claiming a megabyte.
fn forged_ack_hex() -> String {
    let ack =
        secure_rdma::datapath::Ack::delivered(secure_rdma::datapath::Op::Send, 2, FORGED_ACK_BYTES);
    ack.encode().iter().map(|b| format!("{b:02x}")).collect()
}

/// A session on the streaming data path (acknowledgements are RDMA SENDs from the server); the
/// attacker observes the server → client flow on `veth-a` while the client makes one genuine
/// send, then injects a forged acknowledgement at that flow's next PSN. Returns the session,
/// what rdma-inject did and the client's first (genuine) acknowledgement.
fn forged_ack_attack(port: u16, flags: Flags<'_>) -> (Session, InjectReport, String) {
    forged_send_to_client(port, flags, &forged_ack_hex())
}

/// [`forged_ack_attack`] with `record` (hex) as the forged SEND's payload.
fn forged_send_to_client(
    port: u16,
    flags: Flags<'_>,
    record: &str,
) -> (Session, InjectReport, String) {
    let mut session = Session::start(port, flags);
    let injector = Injector::observe(SERVER_LINK, ADDR_B, &["--send-hex", record]);
    let first = session.victim.op("send first genuine send");
    let report = injector.finish();
    // rdma-inject aimed at the client's QP, in the server → client direction.
    let wiring = session
        .server
        .events("RDMA wiring")
        .pop()
        .expect("RDMA wiring event (debug)");
    let client_qpn = hex(&wiring["peer_qpn"]);
    assert_eq!(report.injected.len(), 1, "{report:?}");
    assert_eq!(report.injected[0]["opcode"], "RC SEND Only");
    assert_eq!(report.injected[0]["dst_qpn"].as_u64(), Some(client_qpn));
    assert_eq!(report.summary["flow"]["src_ip"], ADDR_A);
    assert_eq!(report.summary["flow"]["dst_ip"], ADDR_B);
    (session, report, first)
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn baseline_forged_acknowledgement_is_believed_by_the_client() {
    let flags = Flags {
        server: BASELINE.server,
        client: &["--no-payload-protection", "--rdma-acks"],
    };
    let (mut s, _report, first) = forged_ack_attack(4568, flags);
    assert_eq!(first, "server acknowledged send #1: 18 bytes");
    // The forgery took the PSN of the server's real acknowledgement of send #2: the client
    // reads the forged record as the server's word, and rxe-b drops the real one as a
    // duplicate. The third acknowledgement is genuine again.
    let second = s.victim.op("send second genuine send");
    let third = s.victim.op("send third genuine send");
    let delivered = s.delivered("SEND received");
    eprintln!(
        "baseline forged ack: client printed {second:?} then {third:?}; server got {delivered:?}"
    );
    assert_eq!(
        second,
        format!("server acknowledged send #2: {FORGED_ACK_BYTES} bytes"),
        "{}",
        s.context()
    );
    assert_eq!(third, "server acknowledged send #3: 18 bytes");
    // What the server really received for #2: 19 bytes, not a megabyte.
    assert_eq!(
        delivered,
        [
            (VICTIM.to_owned(), 1, "first genuine send".to_owned()),
            (VICTIM.to_owned(), 2, "second genuine send".to_owned()),
            (VICTIM.to_owned(), 3, "third genuine send".to_owned()),
        ]
    );
    assert!(s.victim.quit_ok());
}

/// Issue 20, test 4 (issue 11's forged acknowledgement, once exit 8 "may have reached the
/// server: not sent again"): the client resumes its stream and learns the command's fate from
/// the server, so the application sees every acknowledgement once and exits 0.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn protected_forged_acknowledgement_fails_authentication_and_the_client_resumes_exactly_once() {
    let flags = Flags {
        server: PROTECTED.server,
        client: &["--reconnect-attempts", "20", "--rdma-acks"],
    };
    let (s, _report, first) = forged_ack_attack(4569, flags);
    assert_eq!(first, "server acknowledged send #1: 18 bytes");
    // The forged record does not open under the server's payload key: the client drops the
    // session and resumes its stream on a new one. The server already has the second send (the
    // forgery took the PSN of its real acknowledgement): it answers the resume with that
    // acknowledgement instead of delivering it again.
    resumes_once_after_a_forgery(
        s,
        "failed authentication",
        // The second send's fate came from the server (acknowledged while away) or, had the
        // client noticed the forgery before sending it, it went out on the new session.
        &[
            ": 1 acknowledged while away, 0 sent again",
            ": 0 acknowledged while away, 0 sent again",
        ],
    );
}

/// The rest of an attack on the client's acknowledgements that ends its session: the client's
/// second send, the client saying `session lost` for `cause`, its one resume (its line ending
/// in one of `fates`), and a third send; each genuine send acknowledged once with what the
/// server really received, delivered once, and the client's exit 0.
fn resumes_once_after_a_forgery(mut s: Session, cause: &str, fates: &[&str]) {
    s.victim.command("send second genuine send");
    s.victim.err.wait_for("the client noticing", 1, STEP, |l| {
        l.contains("session lost") && l.contains(cause)
    });
    s.victim
        .wait_out("reconnected", |l| l.starts_with("reconnected to "), 1);
    s.victim.err.wait_for("the resume line", 1, STEP, |l| {
        l.starts_with("secure-client: resumed stream ")
    });
    s.victim.wait_out(
        "the second acknowledgement",
        |l| l.starts_with("server acknowledged"),
        2,
    );
    let third = s.victim.op("send third genuine send");
    // Numbered by the stream: the new session goes on from the old one.
    assert_eq!(third, "server acknowledged send #3: 18 bytes");
    let delivered: Vec<String> = s
        .delivered("SEND received")
        .into_iter()
        .map(|d| d.2)
        .collect();
    let acks = s.victim.acks();
    let resumed: Vec<String> = s
        .victim
        .said()
        .into_iter()
        .filter(|l| l.starts_with("resumed stream "))
        .collect();
    eprintln!("{cause}: client acks {acks:?}, said {resumed:?}; server got {delivered:?}");
    // Each genuine send acknowledged once, with what the server really received (not what a
    // forged record claimed).
    assert_eq!(
        acks,
        [
            "server acknowledged send #1: 18 bytes",
            "server acknowledged send #2: 19 bytes",
            "server acknowledged send #3: 18 bytes",
        ]
    );
    assert_eq!(resumed.len(), 1, "{}", s.context());
    assert!(fates.iter().any(|f| resumed[0].ends_with(f)), "{resumed:?}");
    assert!(
        !s.victim.said().iter().any(|l| l.contains("not sent again")),
        "{}",
        s.context()
    );
    // Every genuine send arrived exactly once.
    assert_eq!(
        delivered,
        [
            "first genuine send",
            "second genuine send",
            "third genuine send"
        ]
    );
    // Every command's fate is known: exit 0.
    let status = s.victim.quit_status();
    assert_eq!(status.code(), Some(0), "{status}");
}

/// A client's receive slots hold what a server SENDs (its token and its sealed 46-byte
/// acknowledgements), not its buffer size. A SEND larger than that, forged at the PSN of the
/// server's next acknowledgement, does not fit the client's receive: rxe refuses it and moves
/// the client's QP to ERROR, so the client's next SEND fails (flushed, or a local QP operation
/// error), the client resumes its stream on a new session, and every send arrives exactly once
/// and is acknowledged once, with what the server really received. (With slots of the buffer's
/// size, the same forgery landed whole and failed its tag.)
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_send_larger_than_an_acknowledgement_ends_the_client_s_session_and_its_stream_resumes_once() {
    let flags = Flags {
        server: PROTECTED.server,
        client: &["--reconnect-attempts", "20", "--rdma-acks"],
    };
    // 200 bytes: past a sealed acknowledgement (46), well within the client's 4 KiB buffer.
    let oversized = "a5".repeat(200);
    let (s, _report, first) = forged_send_to_client(4578, flags, &oversized);
    assert_eq!(first, "server acknowledged send #1: 18 bytes");
    resumes_once_after_a_forgery(
        s,
        "(SEND) completed with error",
        // The second send failed with the QP: sent again on the new session (or, had the client
        // noticed before sending it, sent there in the first place).
        &[
            ": 0 acknowledged while away, 1 sent again",
            ": 0 acknowledged while away, 0 sent again",
        ],
    );
}
