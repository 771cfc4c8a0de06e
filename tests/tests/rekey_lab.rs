//! Key rotation on real Soft-RoCE (issue 21, test 2): the `message_server` example (the
//! library's handler API, `--rekey-after*` setting the policy it announces) on 10.77.0.1,
//! `stream-client` or `message_client` on 10.77.0.2, and `rdma-inject` on the client's link for
//! the replay of a message of an ended key epoch.
//!
//! Every operation is counted at the receiver (`message_server --ids` prints each delivery):
//! each exactly once, in order. Rotations are counted by the server
//! (`secure_rdma_key_rotations_total`, which `message_server` prints when it stops).
//!
//! Run inside the lab VM: `scripts/softroce-vm.sh` (scripts/test.sh does).

use std::path::Path;
use std::time::Duration;

use secure_rdma::datapath::Ack;
use secure_rdma_tests::injector::Injector;
use secure_rdma_tests::piped::Piped;
use secure_rdma_tests::secure::Pki;
use secure_rdma_tests::stream::{
    assert_exactly_once_any_order, assert_exactly_once_in_order, MessageServer, StreamOutcome,
    StreamRun, StreamSpec,
};
use secure_rdma_tests::{require_lab, ADDR_A};
use serde_json::Value;

/// How long one lab step may take under TCG before the test fails.
const STEP: Duration = Duration::from_secs(90);
/// The client's identity.
const NAME: &str = "rotor";
/// Every threshold off, to be replaced by the one a test sets.
const OFF: [&str; 6] = [
    "--rekey-after",
    "0",
    "--rekey-after-bytes",
    "0",
    "--rekey-after-seconds",
    "0",
];

/// `message_server --ids` with only the rekey flags in `rekey` set (the others off).
fn server(pki: &Pki, port: u16, rekey: &[&str]) -> MessageServer {
    let mut args: Vec<&str> = vec!["--ids"];
    for pair in OFF.chunks(2) {
        let value = rekey
            .iter()
            .position(|a| *a == pair[0])
            .map_or(pair[1], |i| rekey[i + 1]);
        args.extend([pair[0], value]);
    }
    MessageServer::start(pki.dir(), port, &args)
}

/// Stops the server (SIGTERM) and reads its rotation counts: `(send, receive)`.
fn stop_and_count_rotations(mut server: MessageServer) -> (u64, u64, MessageServer) {
    let line = server
        .stop()
        .into_iter()
        .find(|l| l.starts_with("key rotations"))
        .unwrap_or_else(|| panic!("no rotation count\n{}", server.context()));
    // key rotations (POLICY): send S, receive R
    let count = |key: &str| -> u64 {
        let (_, rest) = line
            .rsplit_once(key)
            .unwrap_or_else(|| panic!("{key} in {line:?}"));
        rest.trim_start()
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|d| d.parse().ok())
            .unwrap_or_else(|| panic!("a count after {key} in {line:?}"))
    };
    (count("send "), count("receive "), server)
}

/// Streams `spec` as [`NAME`] and checks the run: exit 0, every operation acknowledged, no
/// session lost (a lost session would restart the keys at epoch 0 and change the counts), and
/// the server delivered each exactly once, in order (on one lane; in any order across lanes).
fn stream(
    pki: &Pki,
    server: &MessageServer,
    spec: &StreamSpec,
    deadline: Duration,
) -> StreamOutcome {
    let run = StreamRun::start(pki, server.port, NAME, spec);
    let outcome = run.finish(deadline);
    let s = &outcome.summary;
    assert!(
        outcome.status.success() && s.ok && s.acknowledged == spec.ops && s.losses == 0,
        "stream-client: {}\n{}\n{}",
        outcome.status,
        outcome.summary_line,
        outcome.stderr
    );
    server.wait_until(&format!("{} deliveries", spec.ops), STEP, |m| {
        m.deliveries().len() as u64 >= spec.ops
    });
    match spec.lanes {
        // One QP: one ordered stream.
        1 => assert_exactly_once_in_order(&server.deliveries(), NAME, spec.ops),
        // Each lane keeps its own order; across lanes there is none to keep.
        _ => assert_exactly_once_any_order(&server.deliveries(), NAME, spec.ops),
    }
    outcome
}

/// The rotations a direction makes sealing `n` messages of `len` bytes under a byte threshold
/// of `bytes`: a key takes as many whole messages as fit.
fn rotations_by_bytes(n: u64, len: u64, bytes: u64) -> u64 {
    let per_key = (bytes / len).max(1);
    n.div_ceil(per_key) - 1
}

/// Issue 21, test 2 (a): a long stream with the keys rotating every 100 messages: every
/// operation delivered exactly once, in order, across a switch every 100 messages each way.
/// `REKEY_LAB_OPS` operations (the 100,000: 999 switches each way, 15 to 17 minutes of
/// the debug build under TCG on a loaded host, measured twice); 20,000 by default (199 switches
/// each way; 47 s on an idle host), so the whole VM suite keeps a margin to CI's time.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_long_stream_rekeyed_every_100_messages_arrives_exactly_once_in_order() {
    require_lab();
    let ops: u64 = match std::env::var("REKEY_LAB_OPS") {
        Ok(v) => v
            .parse()
            .ok()
            .filter(|n| *n >= 200 && n % 100 == 0)
            .unwrap_or_else(|| panic!("REKEY_LAB_OPS={v}: a multiple of 100, at least 200")),
        Err(_) => 20_000,
    };
    let pki = Pki::new();
    pki.clients(&[NAME.to_owned()]);
    let server = server(&pki, 4781, &["--rekey-after", "100"]);
    let spec = StreamSpec {
        ops,
        rate: 0.0,
        window: 16,
        burst: 1,
        timeout_secs: 20,
        lanes: 1,
    };
    let outcome = stream(&pki, &server, &spec, Duration::from_secs(1800));
    let (send, receive, server) = stop_and_count_rotations(server);
    eprintln!(
        "rekey every 100 messages: {ops} operations in {:.1} s ({:.0}/s), rotations: server send {send}, receive {receive}",
        outcome.summary.elapsed_s, outcome.summary.throughput_per_s
    );
    // The client sealed `ops` operations, 100 per key: epochs 0 ..= ops/100 - 1. The server sealed
    // one acknowledgement per operation (stream-client asks for them over RDMA): the same.
    assert_eq!(receive, ops / 100 - 1, "{}", server.context());
    assert_eq!(send, ops / 100 - 1, "{}", server.context());
    assert_eq!(server.auth_failures(), 0);
}

/// Issue 22's lanes and issue 21's rotation together: every lane's keys rotate by the session's
/// policy, and the server counts the rotations of every lane, not lane 0's alone. With a key per
/// message (`--rekey-after 1`) a lane that carried n operations rotated n - 1 times each way,
/// so the session's count is the operations less one per lane, however they spread.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn the_server_counts_the_rotations_of_every_lane() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&[NAME.to_owned()]);
    let s = server(&pki, 4787, &["--rekey-after", "1"]);
    let spec = StreamSpec {
        ops: 400,
        rate: 0.0,
        window: 16,
        burst: 1,
        timeout_secs: 20,
        lanes: 4,
    };
    let outcome = stream(&pki, &s, &spec, Duration::from_secs(300));
    assert_eq!(outcome.summary.lanes_at_end, 4, "{}", outcome.summary_line);
    let (send, receive, s) = stop_and_count_rotations(s);
    eprintln!("--rekey-after 1, 400 operations on 4 lanes: send {send}, receive {receive}");
    assert_eq!((send, receive), (400 - 4, 400 - 4), "{}", s.context());
    assert_eq!(s.auth_failures(), 0);
}

/// Issue 21, test 2 (b): each threshold on its own makes the keys rotate on rxe, by the count
/// it should.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn each_threshold_rotates_the_keys_by_its_own_count() {
    require_lab();
    let pki = Pki::new();
    pki.clients(&[NAME.to_owned()]);

    // Messages: every 50, over 1,000 operations.
    let s = server(&pki, 4782, &["--rekey-after", "50"]);
    let spec = StreamSpec {
        ops: 1000,
        rate: 0.0,
        window: 16,
        burst: 1,
        timeout_secs: 20,
        lanes: 1,
    };
    stream(&pki, &s, &spec, Duration::from_secs(300));
    let (send, receive, _) = stop_and_count_rotations(s);
    eprintln!("--rekey-after 50, 1000 operations: send {send}, receive {receive}");
    assert_eq!((send, receive), (19, 19));

    // Bytes: every 1,000 payload bytes. An operation is `op-NNNNNN` (9 bytes), an
    // acknowledgement record 14: 111 operations or 71 acknowledgements per key.
    let s = server(&pki, 4783, &["--rekey-after-bytes", "1000"]);
    let spec = StreamSpec { ops: 2000, ..spec };
    stream(&pki, &s, &spec, Duration::from_secs(300));
    let (send, receive, _) = stop_and_count_rotations(s);
    eprintln!("--rekey-after-bytes 1000, 2000 operations: send {send}, receive {receive}");
    assert_eq!(receive, rotations_by_bytes(2000, 9, 1000));
    assert_eq!(
        send,
        rotations_by_bytes(2000, Ack::WIRE_LEN as u64, 1000),
        "acknowledgement records of {} bytes",
        Ack::WIRE_LEN
    );

    // Seconds: a key is used at most a second, over 400 operations paced at 100 a second.
    let s = server(&pki, 4784, &["--rekey-after-seconds", "1"]);
    let spec = StreamSpec {
        ops: 400,
        rate: 100.0,
        ..spec
    };
    let outcome = stream(&pki, &s, &spec, Duration::from_secs(300));
    let (send, receive, _) = stop_and_count_rotations(s);
    let elapsed = outcome.summary.elapsed_s;
    eprintln!(
        "--rekey-after-seconds 1, 400 operations in {elapsed:.1} s: send {send}, receive {receive}"
    );
    // A key rotates at its first message once it is a second old: one rotation per second of
    // the stream, give or take the first and the last.
    for n in [send, receive] {
        assert!(
            n >= 2 && n as f64 <= elapsed + 1.0,
            "{n} rotations in {elapsed:.1} s"
        );
    }
}

// ------------------------------------------------------------------ the replay of an ended epoch

/// What the replay of a captured message did to a server.
struct Replayed {
    /// The server's stderr lines about the refusal.
    refusals: Vec<String>,
    /// The injected header as rdma-inject reports it.
    injected: Value,
    /// The captured message's header before renumbering.
    source: Value,
}

/// Captures [`NAME`]'s first message (epoch 0), sends 25 more and one live message, then
/// injects the captured one renumbered to the server's next sequence, at the next PSN; checks
/// that nothing of it was delivered, that the session ended on it and that the client resumed
/// and delivered its next message once. `rekey`: the server's rekey flags.
fn replay_a_message_of_epoch_0(port: u16, rekey: &[&str], dir: &Path) -> Replayed {
    require_lab();
    let pki = Pki::new();
    pki.clients(&[NAME.to_owned()]);
    let server = server(&pki, port, rekey);
    let mut client = Piped::message_client(pki.dir(), port, NAME, &["--timeout", "10"]);
    let pcap = dir.join("epoch0.pcap");
    let pcap_s = pcap.to_str().expect("utf-8 path");

    // The capture: the session's first message, sealed under epoch 0.
    let learner = Injector::observe("veth-b", ADDR_A, &["--save", pcap_s]);
    client.send_acked("CAPTURED-IN-EPOCH-0");
    let learned = learner.summary();
    assert_eq!(learned["saved"].as_u64(), Some(1), "{learned}");
    // 25 more: with a rotation every 10 messages, the client's key is in epoch 2 by the 21st.
    for i in 2..=26 {
        client.send_acked(&format!("MSG-{i}"));
    }
    // The replay: learn the live flow from one more message, then inject when it is quiet.
    let renumber = Injector::observe("veth-b", ADDR_A, &["--sealed-renumber", pcap_s]);
    client.send_acked("LIVE-27");
    let summary = renumber.summary();
    let sealed = &summary["sealed"];
    assert_eq!(summary["injected"].as_u64(), Some(1), "{summary}");
    // Renumbered to the server's next sequence, with its own (matching) length.
    assert_eq!(sealed["injected"]["seq"].as_u64(), Some(28), "{summary}");
    assert_eq!(
        sealed["injected"]["len"], sealed["source"]["len"],
        "{summary}"
    );
    server.wait_until("the refusal", STEP, |m| m.auth_failures() >= 1);
    // The client lost its session to the refusal and resumed: its next message arrives once.
    client.send_acked("AFTER-THE-REPLAY");
    let contents: Vec<String> = server
        .deliveries()
        .into_iter()
        .filter(|d| d.identity == NAME)
        .map(|d| d.content)
        .collect();
    let mut want = vec!["CAPTURED-IN-EPOCH-0".to_owned()];
    want.extend((2..=26).map(|i| format!("MSG-{i}")));
    want.extend(["LIVE-27".to_owned(), "AFTER-THE-REPLAY".to_owned()]);
    assert_eq!(contents, want, "{}", server.context());
    assert_eq!(server.auth_failures(), 1, "{}", server.context());
    let refusals = server
        .err
        .snapshot()
        .into_iter()
        .filter(|l| l.contains("failed authentication (forged, replayed or corrupted)"))
        .collect();
    assert!(client.quit_ok(), "message_client did not exit 0");
    Replayed {
        refusals,
        injected: sealed["injected"].clone(),
        source: sealed["source"].clone(),
    }
}

/// Issue 21, test 2 (c): a captured message of an ended epoch, renumbered to the server's
/// next sequence with a matching length and injected at the next PSN, is refused by its
/// epoch, and the refusal names it. The same replay against a server that never rotates
/// reaches the tag check instead ("authentication tag mismatch"): the named refusal is the
/// epoch check's.
#[test]
#[ignore = "needs the Soft-RoCE lab: run by scripts/test.sh inside scripts/softroce-vm.sh"]
fn a_replayed_message_of_an_ended_epoch_is_refused_naming_its_epoch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rotating = replay_a_message_of_epoch_0(4785, &["--rekey-after", "10"], dir.path());
    eprintln!(
        "rekey every 10: injected {} (source {}); server: {:?}",
        rotating.injected, rotating.source, rotating.refusals
    );
    assert_eq!(rotating.source["epoch"].as_u64(), Some(0));
    assert_eq!(rotating.injected["epoch"].as_u64(), Some(0));
    assert_eq!(rotating.refusals.len(), 1, "{:?}", rotating.refusals);
    assert!(
        rotating.refusals[0]
            .contains("sealed under key epoch 0, which has ended (current epoch 2)")
            && rotating.refusals[0].contains("check=\"epoch\""),
        "{:?}",
        rotating.refusals
    );

    let fixed = replay_a_message_of_epoch_0(4786, &[], dir.path());
    eprintln!(
        "never rekeyed: injected {} (source {}); server: {:?}",
        fixed.injected, fixed.source, fixed.refusals
    );
    assert_eq!(fixed.refusals.len(), 1, "{:?}", fixed.refusals);
    assert!(
        fixed.refusals[0].contains("authentication tag mismatch")
            && fixed.refusals[0].contains("check=\"tag\"")
            && !fixed.refusals[0].contains("which has ended"),
        "{:?}",
        fixed.refusals
    );
}
