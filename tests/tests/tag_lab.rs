//! Issue 21, test 1: forgeries that reach the AEAD tag check, on real Soft-RoCE.
//!
//! The forgeries of `attack_lab.rs` are shorter than the sealing overhead, and its replay
//! carries an old sequence: the receiver refuses them before it looks at the tag, so a broken
//! tag check, key or nonce would pass them. Here `rdma-inject` learns the flow's sealed header
//! and injects, at the next PSN, messages that pass the version, operation, sequence and
//! length checks, so that only the tag can refuse them:
//!
//! * `--sealed-forge` against the server (attacker on `veth-b`): the observed header with the
//!   next sequence and a random ciphertext and tag. Refused as "authentication tag mismatch",
//!   counted once, nothing delivered; the same forgery against `--no-payload-protection` is
//!   delivered, bytes and all.
//! * `--reflect` against the client (attacker on `veth-a`, whose frames reach `rxe-b`): the
//!   client's own sealed SEND pushed back into its QP when its sequence is the one the client
//!   expects next from the server (on the streaming data path the server acknowledges over
//!   RDMA, one sealed SEND per operation, so after n operations both directions are at n + 1).
//!   The attacker withholds the server's real acknowledgement (an nftables drop of the
//!   server's SEND Only packets to the client) so that the reflection is the next message.
//!   Only the per-direction keys tell the two apart: refused at the tag.
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitStatus;
use std::time::Duration;

use secure_rdma_tests::faults::NftDrop;
use secure_rdma_tests::injector::{Injector, Report};
use secure_rdma_tests::piped::Piped;
use secure_rdma_tests::secure::{Pki, ServerProc};
use secure_rdma_tests::{require_lab, wait_until, ADDR_A, ADDR_B};
use serde_json::Value;

/// How long one lab step may take under TCG before the test fails.
const STEP: Duration = Duration::from_secs(90);
/// The client's identity.
const VICTIM: &str = "victim";
/// The text the baseline forgery carries as its "ciphertext".
const FORGED_TEXT: &str = "FORGED-SEALED-TEXT";
/// Every check the receiver applies, in order (`AuthError::check`).
const CHECKS: [&str; 7] = [
    "truncated",
    "version",
    "header",
    "operation",
    "sequence",
    "length",
    "tag",
];

// ------------------------------------------------------------------ processes

/// A server and its connected `secure-client`.
struct Session {
    _pki: Pki,
    server: ServerProc,
    victim: Piped,
    metrics: Option<String>,
}

impl Session {
    fn start(port: u16, server: &[&str], client: &[&str], metrics: Option<String>) -> Session {
        require_lab();
        let pki = Pki::new();
        pki.clients(&[VICTIM.to_owned()]);
        let mut flags: Vec<&str> = server.to_vec();
        if let Some(m) = &metrics {
            flags.extend(["--metrics", m.as_str()]);
        }
        let server = ServerProc::start(&pki, port, &flags);
        let victim = Piped::secure_client(pki.dir(), server.port, VICTIM, 10, client);
        server.log.wait_for("client connected", 1, STEP, |l| {
            l.contains("client connected")
        });
        Session {
            _pki: pki,
            server,
            victim,
            metrics,
        }
    }

    /// The server's QPN and the client's, from the server's debug "RDMA wiring" event.
    fn qpns(&self) -> (u64, u64) {
        let wiring = self
            .server
            .events("RDMA wiring")
            .pop()
            .expect("RDMA wiring event (debug)");
        (hex(&wiring["qpn"]), hex(&wiring["peer_qpn"]))
    }

    fn context(&self) -> String {
        format!(
            "server log:\n{}\n{}",
            self.server.log.snapshot().join("\n"),
            self.victim.context()
        )
    }

    /// What the server delivered as SENDs: (seq, content) in order.
    fn sends(&self) -> Vec<(u64, String)> {
        self.server
            .delivered("SEND received")
            .into_iter()
            .map(|(client, seq, content)| {
                assert_eq!(client, VICTIM);
                (seq, content)
            })
            .collect()
    }

    /// The server's "failed authentication" warnings.
    fn auth_warnings(&self) -> Vec<Value> {
        self.server.auth_failures()
    }

    /// The server's metrics page.
    fn scrape(&self) -> String {
        let addr = self.metrics.as_deref().expect("started with --metrics");
        let mut stream = TcpStream::connect(addr).expect("connect to the metrics endpoint");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("GET");
        let mut response = String::new();
        stream.read_to_string(&mut response).expect("read");
        response
    }

    /// A sample's value on the metrics page (`name{labels}` exactly), 0 if absent.
    fn sample(&self, series: &str) -> f64 {
        self.scrape()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(0.0)
    }

    /// Checks the server's whole reaction to one message refused by the tag, and only by the
    /// tag: one warning naming the client with detail "authentication tag mismatch" and check
    /// "tag", the session torn down, the client told and reconnected, the metrics at 1 for the
    /// tenant and for the tag, 0 for every other check. Returns the warning.
    fn refused_by_the_tag(&self) -> Value {
        // Refused by the tag, and only by the tag.
        self.server
            .log
            .wait_for("the authentication warning", 1, STEP, |l| {
                l.contains("failed authentication")
            });
        let warnings = self.auth_warnings();
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert_eq!(warnings[0]["client"], VICTIM);
        assert_eq!(
            warnings[0]["detail"], "authentication tag mismatch",
            "{warnings:#?}"
        );
        assert_eq!(warnings[0]["check"], "tag", "{warnings:#?}");
        assert_eq!(warnings[0]["failures"].as_u64(), Some(1));
        // The session ends as on any authentication failure: torn down, the client told why.
        self.server
            .log
            .wait_for("the session torn down", 1, STEP, |l| {
                l.contains("client gone") && l.contains("RDMA message failed authentication")
            });
        self.victim.err.wait_for("session lost", 1, STEP, |l| {
            l.contains("session lost") && l.contains("failed authentication")
        });
        self.victim
            .wait_out("reconnected", |l| l.starts_with("reconnected to "), 1);
        // Counted once, as the tag.
        let tenant = format!("secure_rdma_auth_failures_total{{tenant=\"{VICTIM}\"}}");
        wait_until(
            "the auth failure in the metrics",
            STEP,
            || self.sample(&tenant) == 1.0,
            || self.scrape(),
        );
        let page = self.scrape();
        for check in CHECKS {
            let want = if check == "tag" { 1.0 } else { 0.0 };
            let series = format!("secure_rdma_auth_failures_by_check_total{{check=\"{check}\"}}");
            assert_eq!(self.sample(&series), want, "{series}\n{page}");
        }
        warnings[0].clone()
    }
}

fn hex(v: &Value) -> u64 {
    let s = v.as_str().unwrap_or_else(|| panic!("{v} is not a string"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|e| panic!("{s}: {e}"))
}

fn hex_of(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The 16 header bytes rdma-inject reports for a sealed header.
fn header_bytes(h: &Value) -> Vec<u8> {
    let n = |k: &str| h[k].as_u64().unwrap_or_else(|| panic!("{k} in {h}"));
    let mut b = vec![
        n("version") as u8,
        n("op") as u8,
        n("epoch") as u8,
        n("lane") as u8,
    ];
    b.extend_from_slice(&n("seq").to_be_bytes());
    b.extend_from_slice(&(n("len") as u32).to_be_bytes());
    b
}

/// Checks what rdma-inject learned and sent for a forgery at the server.
fn check_forgery(report: &Report, server_qpn: u64, opcode: &str) -> Value {
    assert_eq!(report.injected.len(), 1, "{report:?}");
    let inj = &report.injected[0];
    let flow = &report.summary["flow"];
    assert_eq!(inj["opcode"], opcode, "{report:?}");
    assert_eq!(inj["dst_qpn"].as_u64(), Some(server_qpn));
    assert_eq!(inj["psn"], flow["next_psn"], "{report:?}");
    assert_eq!(flow["src_ip"], ADDR_B);
    assert_eq!(flow["dst_ip"], ADDR_A);
    assert_eq!(report.summary["mode"], "sealed");
    report.summary["sealed"].clone()
}

// ------------------------------------------------------------------ the forgery at the tag

/// The forgery after one genuine `verb` ("send" or "write"), with payload protection on:
/// refused by the tag alone, counted once as the tag, nothing delivered, the session ended and
/// resumed as on any authentication failure.
fn forged_at_the_tag(port: u16, metrics_port: u16, verb: &str, opcode: &str) {
    let metrics = format!("127.0.0.1:{metrics_port}");
    let mut s = Session::start(port, &[], &["--reconnect-attempts", "20"], Some(metrics));
    let (server_qpn, _) = s.qpns();
    let injector = Injector::observe("veth-b", ADDR_A, &["--sealed-forge"]);
    let genuine = format!("genuine {verb} of the client");
    let first = s.victim.op(&format!("{verb} {genuine}"));
    assert_eq!(
        first,
        format!("server acknowledged {verb} #1: {} bytes", genuine.len())
    );
    let report = injector.finish();
    let sealed = check_forgery(&report, server_qpn, opcode);
    // The forgery is the observed header with the next sequence and a length matching its
    // random ciphertext: longer than the 32-byte overhead, the right version and operation.
    let (observed, injected) = (&sealed["observed"], &sealed["injected"]);
    assert_eq!(observed["seq"].as_u64(), Some(1), "{sealed}");
    assert_eq!(observed["len"].as_u64(), Some(genuine.len() as u64));
    assert_eq!(
        observed["op"].as_u64(),
        Some(if verb == "send" { 1 } else { 2 })
    );
    assert_eq!(injected["seq"].as_u64(), Some(2), "{sealed}");
    assert_eq!(injected["len"], observed["len"]);
    for k in ["version", "op", "epoch", "lane"] {
        assert_eq!(injected[k], observed[k], "{k}: {sealed}");
    }
    assert_eq!(
        report.injected[0]["payload_len"].as_u64(),
        Some(genuine.len() as u64 + 32)
    );

    let warning = s.refused_by_the_tag();
    // Nothing of it delivered: the next genuine operation is the stream's second.
    let after = s.victim.op(&format!("{verb} after the forgery"));
    assert_eq!(after, format!("server acknowledged {verb} #2: 17 bytes"));
    let kind = if verb == "send" {
        "SEND received"
    } else {
        "WRITE landed"
    };
    let delivered: Vec<(u64, String)> = s
        .server
        .delivered(kind)
        .into_iter()
        .map(|(_, seq, content)| (seq, content))
        .collect();
    eprintln!(
        "sealed {verb} forgery: injected {}, header {injected}; server warned {:?} (check {:?}); \
         delivered {delivered:?}",
        report.injected[0], warning["detail"], warning["check"]
    );
    assert_eq!(
        delivered,
        [(1, genuine.clone()), (2, "after the forgery".to_owned())],
        "{}",
        s.context()
    );
    assert!(s.victim.quit_ok());
}

#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn sealed_forgery_with_the_next_sequence_and_a_matching_length_is_refused_by_the_tag() {
    forged_at_the_tag(4580, 19521, "send", "RC SEND Only");
}

/// The same with a WRITE WITH IMMEDIATE at the observed rkey and address (the sealed message
/// at the start of the server's write slot, the immediate its sealed length).
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn sealed_write_forgery_is_refused_by_the_tag() {
    forged_at_the_tag(4583, 19522, "write", "RC RDMA WRITE Only with Immediate");
}

/// A captured sealed message replayed with its header renumbered to the next sequence (the
/// replay of `attack_lab.rs` is refused by the sequence check; this one gets past it): the
/// tag covers the header, so the renumbered message fails there.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn captured_message_renumbered_to_the_next_sequence_is_refused_by_the_tag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pcap = dir.path().join("sealed.pcap");
    let pcap_s = pcap.to_str().expect("utf-8 path");
    let metrics = "127.0.0.1:19523".to_owned();
    let mut s = Session::start(4584, &[], &["--reconnect-attempts", "20"], Some(metrics));
    let (server_qpn, _) = s.qpns();
    // Capture the client's first sealed SEND.
    let learner = Injector::observe("veth-b", ADDR_A, &["--save", pcap_s]);
    let captured = "LEGIT-TRANSFER: pay 100 to bob";
    s.victim.op(&format!("send {captured}"));
    let learned = learner.finish();
    assert_eq!(learned.summary["saved"].as_u64(), Some(1), "{learned:?}");
    // Replay it after the second send, renumbered to sequence 3, at the next PSN.
    let injector = Injector::observe("veth-b", ADDR_A, &["--sealed-renumber", pcap_s]);
    assert_eq!(
        s.victim.op("send second genuine send"),
        "server acknowledged send #2: 19 bytes"
    );
    let report = injector.finish();
    let sealed = check_forgery(&report, server_qpn, "RC SEND Only");
    assert_eq!(sealed["attack"], "renumber");
    assert_eq!(sealed["source"]["seq"].as_u64(), Some(1), "{sealed}");
    assert_eq!(sealed["observed"]["seq"].as_u64(), Some(2), "{sealed}");
    assert_eq!(sealed["injected"]["seq"].as_u64(), Some(3), "{sealed}");
    assert_eq!(
        sealed["injected"]["len"].as_u64(),
        Some(captured.len() as u64)
    );
    let warning = s.refused_by_the_tag();
    let third = s.victim.op("send third genuine send");
    assert_eq!(third, "server acknowledged send #3: 18 bytes");
    let sends = s.sends();
    eprintln!(
        "renumbered replay: injected {}, header {}; server warned {:?} (check {:?}); delivered \
         {sends:?}",
        report.injected[0], sealed["injected"], warning["detail"], warning["check"]
    );
    assert_eq!(
        sends,
        [
            (1, captured.to_owned()),
            (2, "second genuine send".to_owned()),
            (3, "third genuine send".to_owned()),
        ],
        "{}",
        s.context()
    );
    assert!(s.victim.quit_ok());
}

/// The same forgery without payload protection: delivered, bytes and all (the attack works
/// without the defence). There is no sealed header to learn, so the sequence is given.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn baseline_sealed_forgery_is_delivered_without_payload_protection() {
    let mut s = Session::start(
        4581,
        &["--no-payload-protection"],
        &["--no-payload-protection"],
        None,
    );
    let (server_qpn, _) = s.qpns();
    let injector = Injector::observe(
        "veth-b",
        ADDR_A,
        &[
            "--sealed-forge",
            "--sealed-text",
            FORGED_TEXT,
            "--sealed-seq",
            "2",
        ],
    );
    s.victim.op("send genuine send of the client");
    let report = injector.finish();
    let sealed = check_forgery(&report, server_qpn, "RC SEND Only");
    assert!(sealed["observed"].is_null(), "{sealed}");
    let header = header_bytes(&sealed["injected"]);
    assert_eq!(header[..2], [2, 1]);
    // Delivered as the client's second message: the header, the text, the random tag.
    s.server.log.wait_for("the forged delivery", 2, STEP, |l| {
        l.contains("\"SEND received\"")
    });
    let sends = s.sends();
    eprintln!("baseline sealed forgery: delivered {sends:?}");
    assert_eq!(sends[0].1, "genuine send of the client");
    assert_eq!(sends[1].0, 2);
    let want = format!("hex:{}{}", hex_of(&header), hex_of(FORGED_TEXT.as_bytes()));
    assert!(
        sends[1].1.starts_with(&want) && sends[1].1.len() == want.len() + 32,
        "{sends:?}\n{}",
        s.context()
    );
    assert!(s.auth_warnings().is_empty());
    // The client notices an acknowledgement it never asked for and reconnects.
    s.victim.err.wait_for("the client noticing", 1, STEP, |l| {
        l.contains("session lost") && l.contains("forged")
    });
}

// ------------------------------------------------------------------ reflection

/// Issue 21, test 1, the reflection variant: the client's own sealed SEND pushed back into its
/// QP when its sequence is the one it expects next from the server.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn reflected_client_message_with_the_expected_sequence_is_refused_by_the_tag() {
    let mut s = Session::start(4582, &[], &["--rdma-acks", "--no-reconnect"], None);
    let (_, client_qpn) = s.qpns();
    // The attacker on the server's link: it sees both directions and its frames reach rxe-b.
    let injector = Injector::observe("veth-a", ADDR_B, &["--reflect"]);
    let first = "first genuine send";
    assert_eq!(
        s.victim.op(&format!("send {first}")),
        format!("server acknowledged send #1: {} bytes", first.len())
    );
    // Both directions are at sequence 2 now. The attacker withholds the server's
    // acknowledgement of the next send (RC SEND Only, BTH opcode 0x04, from the server to
    // the client), so the reflection is the next message the client's QP takes.
    let drop = NftDrop::output(
        "tagforge_reflect",
        &format!("ip saddr {ADDR_A} ip daddr {ADDR_B} udp dport 4791 @th,64,8 4"),
    );
    // At most 14 bytes: sealed (46) it fits the client's receive slots, which hold a sealed
    // acknowledgement and no more. A longer reflection would be refused by rxe for its length
    // and never reach the tag this test is about.
    let second = "second send";
    assert!(second.len() <= secure_rdma::datapath::Ack::WIRE_LEN);
    s.victim.command(&format!("send {second}"));
    let report = injector.finish();
    let dropped = drop.dropped();
    drop_rule(drop);
    assert_eq!(report.injected.len(), 1, "{report:?}");
    let inj = &report.injected[0];
    assert_eq!(inj["opcode"], "RC SEND Only");
    assert_eq!(inj["dst_qpn"].as_u64(), Some(client_qpn));
    assert_eq!(inj["psn"], report.summary["flow"]["next_psn"]);
    assert_eq!(report.summary["flow"]["src_ip"], ADDR_A);
    let sealed = &report.summary["sealed"];
    assert_eq!(sealed["attack"], "reflect");
    // The server's last sealed SEND was its acknowledgement 1; the reflected one is the
    // client's second, unchanged.
    assert_eq!(sealed["observed"]["seq"].as_u64(), Some(1), "{sealed}");
    assert_eq!(sealed["injected"]["seq"].as_u64(), Some(2), "{sealed}");
    assert_eq!(sealed["source"], sealed["injected"]);
    assert_eq!(
        sealed["injected"]["len"].as_u64(),
        Some(second.len() as u64)
    );

    // The client refuses it at the tag and exits with the lost-session code.
    let status: ExitStatus = s.victim.wait_exit();
    let said = s.victim.said();
    eprintln!(
        "reflection: injected {inj}; server acks dropped {dropped}; client said {said:?}, exit \
         {status}; server delivered {:?}",
        s.sends()
    );
    assert_eq!(status.code(), Some(8), "{}", s.context());
    assert!(
        said.iter().any(|l| l
            == "RDMA message failed authentication (forged, replayed or corrupted): \
                authentication tag mismatch"),
        "{said:?}"
    );
    assert!(
        dropped >= 1,
        "the server's acknowledgement was not withheld"
    );
    // Every genuine message arrived once.
    wait_until(
        "the second send delivered",
        STEP,
        || s.sends().len() >= 2,
        || s.context(),
    );
    assert_eq!(
        s.sends(),
        [(1, first.to_owned()), (2, second.to_owned())],
        "{}",
        s.context()
    );
    assert_eq!(
        s.victim.acks(),
        [format!(
            "server acknowledged send #1: {} bytes",
            first.len()
        )]
    );
}

/// Removes the nft rule now (its Drop does).
fn drop_rule(rule: NftDrop) {
    drop(rule);
}
