//! On the host: rdma-inject's renumbering (`--sealed-renumber`, what `rekey_lab.rs` injects on
//! rxe) against secure-rdma's real [`Opener`] with rotating keys: a captured message of an ended
//! epoch, renumbered to the next sequence, is refused by its epoch, before its tag, and the
//! same replay under one key that never rotated reaches the tag.

use rdma_inject::sealed::{renumbered, SealedHeader};
use secure_rdma::datapath::{Op, StreamId};
use secure_rdma::protect::{AuthError, Cipher, Opener, RekeyPolicy, Sealer, OVERHEAD};

const KEY: [u8; 32] = [7; 32];

fn seal(sealer: &mut Sealer, msg: &[u8]) -> Vec<u8> {
    let mut wire = vec![0u8; msg.len() + OVERHEAD];
    let n = sealer.seal(Op::Send, msg, &mut wire).expect("seal");
    wire.truncate(n);
    wire
}

/// Seals and opens 27 messages under `policy`, capturing the first; then replays it renumbered
/// to the opener's next sequence. What the opener says, and its epoch.
fn replay_the_first_of_27(policy: RekeyPolicy) -> (Result<(), AuthError>, u64) {
    let stream = StreamId::random();
    let mut sealer = Sealer::new(Cipher::preferred(), &KEY);
    sealer.bind(stream, 1);
    sealer.set_policy(policy);
    let mut opener = Opener::new(Cipher::preferred(), &KEY);
    opener.bind(stream, 1);
    let captured = seal(&mut sealer, b"CAPTURED-IN-EPOCH-0");
    opener
        .open(Op::Send, &mut captured.clone())
        .expect("genuine");
    for i in 2..=27 {
        let mut m = seal(&mut sealer, format!("MSG-{i}").as_bytes());
        opener.open(Op::Send, &mut m).expect("genuine");
    }
    let mut replay = renumbered(&captured, opener.next_seq()).expect("renumbered");
    let header = SealedHeader::parse_message(&replay).expect("header");
    assert_eq!((header.epoch, header.seq, header.len), (0, 28, 19));
    let verdict = opener.open(Op::Send, &mut replay).map(|_| ());
    (verdict, opener.epoch())
}

#[test]
fn a_renumbered_message_of_an_ended_epoch_is_refused_by_its_epoch() {
    let (verdict, epoch) = replay_the_first_of_27(RekeyPolicy::off().with_messages(10));
    assert_eq!(epoch, 2);
    let e = verdict.unwrap_err();
    assert_eq!(
        e.to_string(),
        "sealed under key epoch 0, which has ended (current epoch 2)"
    );
    assert_eq!(e.check(), "epoch");
}

#[test]
fn the_same_replay_under_a_key_that_never_rotated_reaches_the_tag() {
    let (verdict, epoch) = replay_the_first_of_27(RekeyPolicy::off());
    assert_eq!(epoch, 0);
    assert_eq!(verdict, Err(AuthError::Tag));
}
