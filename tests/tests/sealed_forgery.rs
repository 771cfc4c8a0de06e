//! On the host: rdma-inject's sealed forgeries against secure-rdma's real [`Opener`], so the
//! two implementations of the wire format (the attacker's and the project's) agree, and each
//! forgery the lab test injects is refused by the check it is meant to reach: the tag.

use rdma_inject::sealed::{forgery, renumbered, SealedHeader, TAG_LEN};
use secure_rdma::datapath::{Op, StreamId};
use secure_rdma::protect::{AuthError, Cipher, Header, Opener, Sealer, OVERHEAD};

const CLIENT_KEY: [u8; 32] = [1; 32];
const SERVER_KEY: [u8; 32] = [2; 32];

fn seal(sealer: &mut Sealer, op: Op, msg: &[u8]) -> Vec<u8> {
    let mut wire = vec![0u8; msg.len() + OVERHEAD];
    let n = sealer.seal(op, msg, &mut wire).expect("seal");
    wire.truncate(n);
    wire
}

#[test]
fn the_attackers_header_is_the_projects() {
    for cipher in Cipher::preference() {
        let mut sealer = Sealer::new(cipher, &CLIENT_KEY);
        let wire = seal(&mut sealer, Op::Write, b"twelve bytes");
        let mine = SealedHeader::parse_message(&wire).expect("rdma-inject parses it");
        let raw: [u8; 16] = wire[..16].try_into().unwrap();
        let theirs = Header::parse(&raw).expect("secure-rdma parses it");
        assert_eq!(
            (mine.seq, mine.len, mine.epoch, mine.lane, mine.op),
            (theirs.seq, theirs.len, theirs.epoch, theirs.lane, 2)
        );
        assert_eq!(mine.to_bytes(), raw);
    }
}

#[test]
fn a_forgery_from_the_observed_header_is_refused_by_the_tag_only() {
    for cipher in Cipher::preference() {
        let stream = StreamId::random();
        let mut sealer = Sealer::new(cipher, &CLIENT_KEY);
        sealer.bind(stream, 1);
        let mut opener = Opener::new(cipher, &CLIENT_KEY);
        opener.bind(stream, 1);
        // The client's first message, as the attacker sees it on the wire.
        let seen = seal(&mut sealer, Op::Send, b"genuine send of the client");
        assert!(opener.open(Op::Send, &mut seen.clone()).is_ok());
        let observed = SealedHeader::parse_message(&seen).unwrap();
        // The next sequence, a random ciphertext of the same length, a random tag.
        let mut ciphertext = vec![0u8; observed.len as usize];
        fastrand_fill(&mut ciphertext);
        let mut forged = forgery(observed, observed.seq + 1, &ciphertext, [0x5a; TAG_LEN]).unwrap();
        assert_eq!(opener.open(Op::Send, &mut forged), Err(AuthError::Tag));
        assert_eq!(AuthError::Tag.to_string(), "authentication tag mismatch");
        // The same message renumbered (a replay that gets past the sequence check): the tag.
        let mut replayed = renumbered(&seen, observed.seq + 1).unwrap();
        assert_eq!(opener.open(Op::Send, &mut replayed), Err(AuthError::Tag));
        // What the forgery would need to get right and what the earlier lab forgeries got
        // wrong: each of these is refused before the tag.
        let mut old = forgery(observed, observed.seq, &ciphertext, [0; TAG_LEN]).unwrap();
        assert_eq!(
            opener.open(Op::Send, &mut old).map_err(|e| e.check()),
            Err("sequence")
        );
        let mut short = forged[..18].to_vec();
        assert_eq!(
            opener.open(Op::Send, &mut short).map_err(|e| e.check()),
            Err("truncated")
        );
        // Nothing was accepted: the genuine next message still opens.
        let next = seal(&mut sealer, Op::Send, b"after");
        assert_eq!(opener.open(Op::Send, &mut next.clone()).unwrap(), b"after");
    }
}

#[test]
fn a_reflected_message_with_the_expected_sequence_is_refused_by_the_tag() {
    let cipher = Cipher::preferred();
    let stream = StreamId::random();
    // The client seals with its key; it opens what the server sends with the server's.
    let mut client_sealer = Sealer::new(cipher, &CLIENT_KEY);
    client_sealer.bind(stream, 1);
    let mut client_opener = Opener::new(cipher, &SERVER_KEY);
    client_opener.bind(stream, 1);
    let mine = seal(&mut client_sealer, Op::Send, b"first genuine send");
    let h = SealedHeader::parse_message(&mine).unwrap();
    assert_eq!((h.seq, client_opener.next_seq()), (1, 1));
    assert_eq!(
        client_opener.open(Op::Send, &mut mine.clone()),
        Err(AuthError::Tag)
    );
    // Without its defence (one key for both directions) the reflection would be accepted:
    // what the lab test would then see delivered.
    let mut one_key = Opener::new(cipher, &CLIENT_KEY);
    one_key.bind(stream, 1);
    assert_eq!(
        one_key.open(Op::Send, &mut mine.clone()).unwrap(),
        b"first genuine send"
    );
}

/// Random bytes without another dependency: the forgery's ciphertext only has to be unknown
/// to the receiver's key.
fn fastrand_fill(buf: &mut [u8]) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
    for b in buf {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}
