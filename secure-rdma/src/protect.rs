//! Payload protection: authenticated encryption of every RDMA SEND and WRITE.
//!
//! TLS protects the connection setup, and CSPRNG PSNs stop a blind attacker, but an RC
//! responder accepts any packet that carries the right QPN and the next PSN: an on-path
//! observer can forge or replay messages (`rdma-inject` does it in the lab). So every message
//! the two ends exchange over RDMA is sealed with an AEAD whose keys only they hold:
//!
//! - **Keys**: one per direction, from the TLS session's exporter (RFC 8446 §7.5) with their own
//!   label, so they are unrelated to the confirmation tokens and new for every session.
//! - **Nonce**: the direction's 64-bit message sequence number, never reused under a key: a
//!   [`Sealer`] refuses to seal once the sequence would wrap. Client to server it is the
//!   operation's sequence in the client's [stream](crate::datapath::StreamId), which goes on
//!   across sessions (the keys are new for every session, so a resumed stream reuses no nonce);
//!   server to client it counts from 1 in each session.
//! - **Wire format** (version 2): a 16-byte [`Header`] in clear, then the ciphertext, then the
//!   16-byte tag. The associated data is the header followed by the 16-byte stream id, which both
//!   ends know from the handshake and which is never sent: operation, key epoch, lane, sequence,
//!   length and stream are all authenticated with the payload.
//!
//!   | bytes | field |
//!   |---|---|
//!   | 0 | version, 2 (a version 1 header is refused as [`AuthError::Version`]) |
//!   | 1 | operation: 1 SEND, 2 WRITE |
//!   | 2 | key epoch (0 until keys rotate) |
//!   | 3 | lane (0 until a session has several QPs) |
//!   | 4..12 | sequence, u64 big endian (also the nonce) |
//!   | 12..16 | plaintext length, u32 big endian |
//! - **Receiving**: [`Opener::open`] checks the header, that the sequence is exactly the next
//!   one (RC delivers in order, so anything else is a replay or a forgery), and the tag, before
//!   a byte of plaintext is released. A failure is an [`AuthError`]; the session that sees one
//!   must be torn down, since its QP has accepted a packet the peer never sent.
//!
//! AES-256-GCM is chosen where the CPU has AES and carry-less multiply instructions,
//! ChaCha20-Poly1305 otherwise ([`Cipher::preferred`]); both are ring's.
//!
//! ```
//! use secure_rdma::protect::{Cipher, Opener, Sealer, OVERHEAD};
//! use secure_rdma::datapath::Op;
//!
//! let key = [7u8; 32];
//! let mut sealer = Sealer::new(Cipher::ChaCha20Poly1305, &key);
//! let mut opener = Opener::new(Cipher::ChaCha20Poly1305, &key);
//!
//! let mut wire = vec![0u8; 5 + OVERHEAD];
//! let n = sealer.seal(Op::Send, b"hello", &mut wire)?;
//! assert_eq!(opener.open(Op::Send, &mut wire[..n])?, b"hello");
//! // The same bytes again are a replay.
//! let mut again = wire.clone();
//! sealer.seal(Op::Send, b"hello", &mut again)?;
//! assert!(opener.open(Op::Send, &mut wire[..n]).is_err());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use serde::{Deserialize, Serialize};

use crate::datapath::{Op, StreamId};

/// Bytes of the clear header in front of every sealed message.
pub const HEADER_LEN: usize = 16;
/// Bytes of the authentication tag after the ciphertext.
pub const TAG_LEN: usize = 16;
/// What sealing adds to a message: header and tag.
pub const OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// Bytes of each direction's key.
pub const KEY_LEN: usize = 32;

/// The format version in every header.
pub const WIRE_VERSION: u8 = 2;

/// The AEAD that protects a session's payloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Cipher {
    /// AES-256 in Galois/Counter Mode: fastest where the CPU has AES-NI and PCLMULQDQ.
    #[serde(rename = "aes-256-gcm")]
    Aes256Gcm,
    /// ChaCha20-Poly1305: constant-time and fast in software.
    #[serde(rename = "chacha20-poly1305")]
    ChaCha20Poly1305,
}

impl Cipher {
    /// Both ciphers, fastest first on this CPU.
    pub fn preference() -> [Cipher; 2] {
        match Cipher::preferred() {
            Cipher::Aes256Gcm => [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305],
            Cipher::ChaCha20Poly1305 => [Cipher::ChaCha20Poly1305, Cipher::Aes256Gcm],
        }
    }

    /// AES-256-GCM when this CPU has AES and carry-less multiplication instructions (without
    /// them AES is slow and harder to make constant-time), ChaCha20-Poly1305 otherwise.
    pub fn preferred() -> Cipher {
        if hardware_aes() {
            Cipher::Aes256Gcm
        } else {
            Cipher::ChaCha20Poly1305
        }
    }

    /// The name used on the command line and on the wire.
    pub const fn name(self) -> &'static str {
        match self {
            Cipher::Aes256Gcm => "aes-256-gcm",
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
        }
    }

    fn algorithm(self) -> &'static aead::Algorithm {
        match self {
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }
}

impl std::fmt::Display for Cipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A cipher name that is neither `aes-256-gcm` nor `chacha20-poly1305`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown cipher {0:?} (aes-256-gcm or chacha20-poly1305)")]
pub struct UnknownCipher(pub String);

impl std::str::FromStr for Cipher {
    type Err = UnknownCipher;
    fn from_str(s: &str) -> Result<Self, UnknownCipher> {
        match s {
            "aes-256-gcm" => Ok(Cipher::Aes256Gcm),
            "chacha20-poly1305" => Ok(Cipher::ChaCha20Poly1305),
            other => Err(UnknownCipher(other.to_owned())),
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn hardware_aes() -> bool {
    std::arch::is_x86_feature_detected!("aes") && std::arch::is_x86_feature_detected!("pclmulqdq")
}

#[cfg(target_arch = "aarch64")]
fn hardware_aes() -> bool {
    std::arch::is_aarch64_feature_detected!("aes")
        && std::arch::is_aarch64_feature_detected!("pmull")
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn hardware_aes() -> bool {
    false
}

/// The clear, authenticated header of a sealed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// The operation the message was sealed for: a SEND cannot be replayed as a WRITE.
    pub op: Op,
    /// The key epoch the message was sealed under (0 until keys rotate).
    pub epoch: u8,
    /// The session's lane (0 until a session has several QPs).
    pub lane: u8,
    /// The direction's message sequence number; also the nonce.
    pub seq: u64,
    /// Plaintext bytes.
    pub len: u32,
}

impl Header {
    fn op_byte(op: Op) -> u8 {
        match op {
            Op::Send => 1,
            Op::Write => 2,
        }
    }

    /// The 16 header bytes: version, operation, epoch, lane, then sequence and length big
    /// endian.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = WIRE_VERSION;
        b[1] = Header::op_byte(self.op);
        b[2] = self.epoch;
        b[3] = self.lane;
        b[4..12].copy_from_slice(&self.seq.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    /// Parses a header: [`AuthError::Version`] for another version (a peer that speaks the
    /// format of an older release), [`AuthError::BadHeader`] for an unknown operation. Never
    /// panics, whatever the bytes.
    ///
    /// ```
    /// use secure_rdma::datapath::Op;
    /// use secure_rdma::protect::{AuthError, Header};
    ///
    /// let h = Header { op: Op::Send, epoch: 0, lane: 0, seq: 7, len: 5 };
    /// assert_eq!(Header::parse(&h.to_bytes()), Ok(h));
    /// let mut v1 = h.to_bytes();
    /// v1[0] = 1;
    /// assert_eq!(Header::parse(&v1), Err(AuthError::Version { got: 1 }));
    /// ```
    pub fn parse(b: &[u8; HEADER_LEN]) -> Result<Header, AuthError> {
        if b[0] != WIRE_VERSION {
            return Err(AuthError::Version { got: b[0] });
        }
        let op = match b[1] {
            1 => Op::Send,
            2 => Op::Write,
            _ => return Err(AuthError::BadHeader),
        };
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[4..12]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&b[12..16]);
        Ok(Header {
            op,
            epoch: b[2],
            lane: b[3],
            seq: u64::from_be_bytes(seq),
            len: u32::from_be_bytes(len),
        })
    }
}

/// The associated data of a message: its header, then the stream id it belongs to (bound
/// without being sent, so a message sealed for one stream opens in no other).
fn aad(header: &[u8; HEADER_LEN], stream: &StreamId) -> [u8; HEADER_LEN + 16] {
    let mut a = [0u8; HEADER_LEN + 16];
    a[..HEADER_LEN].copy_from_slice(header);
    a[HEADER_LEN..].copy_from_slice(&stream.0);
    a
}

/// The nonce of message `seq`: 4 zero bytes, then the sequence big endian. Unique per key
/// because each direction has its own key and its own strictly increasing sequence.
fn nonce(seq: u64) -> Nonce {
    let mut n = [0u8; aead::NONCE_LEN];
    n[4..].copy_from_slice(&seq.to_be_bytes());
    Nonce::assume_unique_for_key(n)
}

fn key(cipher: Cipher, bytes: &[u8; KEY_LEN]) -> LessSafeKey {
    // Both algorithms take 32-byte keys, so this cannot fail.
    let unbound = UnboundKey::new(cipher.algorithm(), bytes)
        .unwrap_or_else(|_| unreachable!("AES-256-GCM and ChaCha20-Poly1305 keys are 32 bytes"));
    LessSafeKey::new(unbound)
}

/// Why sealing failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The output buffer cannot hold header, ciphertext and tag.
    #[error("{need} bytes needed to seal a {len}-byte message, the buffer has {have}")]
    BufferTooSmall {
        /// Plaintext length.
        len: usize,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        have: usize,
    },
    /// A message longer than the header's 32-bit length.
    #[error("a {0}-byte message is too long to seal")]
    TooLong(usize),
    /// 2^64 - 1 messages were sealed with this key: another would reuse a nonce.
    #[error("the session's message sequence is exhausted; reconnect for new keys")]
    Exhausted,
}

/// Seals the messages of one direction. Owns the direction's key and next sequence number.
pub struct Sealer {
    key: LessSafeKey,
    cipher: Cipher,
    next_seq: u64,
    stream: StreamId,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Sealer")
            .field("cipher", &self.cipher)
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl Sealer {
    /// A sealer whose first message gets sequence 1, bound to the all-zero stream until
    /// [`Sealer::bind`].
    pub fn new(cipher: Cipher, key_bytes: &[u8; KEY_LEN]) -> Sealer {
        Sealer {
            key: key(cipher, key_bytes),
            cipher,
            next_seq: 1,
            stream: StreamId([0; 16]),
        }
    }

    /// Binds the sealer to `stream`, its first message getting sequence `first` (a resumed
    /// stream goes on where the server's delivery stopped). Sequence 0 is never used, so a
    /// `first` of 0 means 1.
    pub fn bind(&mut self, stream: StreamId, first: u64) {
        self.stream = stream;
        self.next_seq = first.max(1);
    }

    /// The cipher this sealer uses.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// The sequence number the next message will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Writes `plaintext`, sealed for `op`, to the front of `out`; returns the bytes written
    /// (`plaintext.len() + OVERHEAD`). The sequence advances only on success.
    pub fn seal(&mut self, op: Op, plaintext: &[u8], out: &mut [u8]) -> Result<usize, SealError> {
        let len =
            u32::try_from(plaintext.len()).map_err(|_| SealError::TooLong(plaintext.len()))?;
        let need = plaintext.len() + OVERHEAD;
        if out.len() < need {
            return Err(SealError::BufferTooSmall {
                len: plaintext.len(),
                need,
                have: out.len(),
            });
        }
        if self.next_seq == u64::MAX {
            return Err(SealError::Exhausted);
        }
        let seq = self.next_seq;
        let header = Header {
            op,
            epoch: 0,
            lane: 0,
            seq,
            len,
        }
        .to_bytes();
        let (head, rest) = out.split_at_mut(HEADER_LEN);
        head.copy_from_slice(&header);
        let (body, tag_out) = rest.split_at_mut(plaintext.len());
        body.copy_from_slice(plaintext);
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(seq), Aad::from(aad(&header, &self.stream)), body)
            .map_err(|_| SealError::TooLong(plaintext.len()))?;
        tag_out[..TAG_LEN].copy_from_slice(tag.as_ref());
        self.next_seq += 1;
        Ok(need)
    }
}

/// Why a received message was refused. Every case means the same to the session: the message
/// is not from the peer (forged), not new (replayed) or not intact (corrupted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// Shorter than header and tag.
    #[error("{0} bytes is shorter than a sealed message")]
    Truncated(usize),
    /// A header of another format version: a peer of another release, or a forgery.
    #[error("sealed-message version {got} is not accepted (this end speaks {WIRE_VERSION}); upgrade the peer")]
    Version {
        /// The header's version byte.
        got: u8,
    },
    /// An unknown operation.
    #[error("malformed header")]
    BadHeader,
    /// Sealed for another operation (a SEND presented as a WRITE or the reverse).
    #[error("sealed for {sealed}, arrived as {arrived}")]
    WrongOp {
        /// The header's operation.
        sealed: Op,
        /// How it arrived.
        arrived: Op,
    },
    /// Not the next sequence number: a replay, a reordering or a forged header.
    #[error("sequence {got}, expected {expected}")]
    Sequence {
        /// The next sequence number this side accepts.
        expected: u64,
        /// The header's.
        got: u64,
    },
    /// The header's length does not match the bytes that arrived.
    #[error("header says {header} bytes, {arrived} arrived")]
    Length {
        /// Plaintext length from the header.
        header: u32,
        /// Ciphertext bytes that arrived.
        arrived: usize,
    },
    /// The tag does not verify: wrong key, or header or payload changed.
    #[error("authentication tag mismatch")]
    Tag,
}

/// Every value of [`AuthError::check`], in the order [`Opener::open`] applies the checks.
pub const AUTH_CHECKS: [&str; 7] = [
    "truncated",
    "version",
    "header",
    "operation",
    "sequence",
    "length",
    "tag",
];

impl AuthError {
    /// Which of the receiver's checks refused the message, as a short label for logs and
    /// metrics: one of [`AUTH_CHECKS`]. A forgery built from an observed header (the next
    /// sequence, a matching length) gets past every check but the tag, so `"tag"` is the
    /// check that shows the keys and nonces at work; the others refuse what the clear header
    /// alone gives away.
    ///
    /// ```
    /// use secure_rdma::protect::AuthError;
    ///
    /// assert_eq!(AuthError::Tag.check(), "tag");
    /// assert_eq!(AuthError::Tag.to_string(), "authentication tag mismatch");
    /// assert_eq!(AuthError::Truncated(18).check(), "truncated");
    /// ```
    pub fn check(&self) -> &'static str {
        match self {
            AuthError::Truncated(_) => "truncated",
            AuthError::Version { .. } => "version",
            AuthError::BadHeader => "header",
            AuthError::WrongOp { .. } => "operation",
            AuthError::Sequence { .. } => "sequence",
            AuthError::Length { .. } => "length",
            AuthError::Tag => "tag",
        }
    }
}

/// Opens the messages of one direction, in order. Owns the direction's key and the next
/// sequence number it accepts.
pub struct Opener {
    key: LessSafeKey,
    cipher: Cipher,
    next_seq: u64,
    stream: StreamId,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener")
            .field("cipher", &self.cipher)
            .field("next_seq", &self.next_seq)
            .finish()
    }
}

impl Opener {
    /// An opener that accepts sequence 1 first, of the all-zero stream until
    /// [`Opener::bind`].
    pub fn new(cipher: Cipher, key_bytes: &[u8; KEY_LEN]) -> Opener {
        Opener {
            key: key(cipher, key_bytes),
            cipher,
            next_seq: 1,
            stream: StreamId([0; 16]),
        }
    }

    /// Binds the opener to `stream`, accepting sequence `first` first (0 means 1).
    pub fn bind(&mut self, stream: StreamId, first: u64) {
        self.stream = stream;
        self.next_seq = first.max(1);
    }

    /// The sequence number the next message must carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Verifies and decrypts a message that arrived as `op`, in place; returns the plaintext,
    /// a sub-slice of `msg`. Nothing is returned unless every check passed; on success the
    /// expected sequence advances, so the same message is refused if it comes again.
    pub fn open<'a>(&mut self, op: Op, msg: &'a mut [u8]) -> Result<&'a [u8], AuthError> {
        if msg.len() < OVERHEAD {
            return Err(AuthError::Truncated(msg.len()));
        }
        let mut raw = [0u8; HEADER_LEN];
        raw.copy_from_slice(&msg[..HEADER_LEN]);
        let header = Header::parse(&raw)?;
        if header.op != op {
            return Err(AuthError::WrongOp {
                sealed: header.op,
                arrived: op,
            });
        }
        if header.seq != self.next_seq {
            return Err(AuthError::Sequence {
                expected: self.next_seq,
                got: header.seq,
            });
        }
        let body = &mut msg[HEADER_LEN..];
        let arrived = body.len() - TAG_LEN;
        if usize::try_from(header.len).ok() != Some(arrived) {
            return Err(AuthError::Length {
                header: header.len,
                arrived,
            });
        }
        let plain = self
            .key
            .open_in_place(nonce(header.seq), Aad::from(aad(&raw, &self.stream)), body)
            .map_err(|_| AuthError::Tag)?;
        self.next_seq += 1;
        Ok(plain)
    }
}

/// Both directions of one session: what this side seals and what it opens.
#[derive(Debug)]
pub struct Protection {
    /// Seals what this side sends.
    pub sealer: Sealer,
    /// Opens what the peer sends.
    pub opener: Opener,
}

impl Protection {
    /// The payload keys of this TLS session for `cipher`, seen from `side`: the sealer uses the
    /// key of what `side` sends, the opener the key of what the peer sends. Both ends derive the
    /// same two keys from the session's exporter secret (RFC 8446 §7.5); nobody else can.
    pub fn from_tls<D>(
        conn: &rustls::ConnectionCommon<D>,
        side: Side,
        cipher: Cipher,
    ) -> Result<Protection, rustls::Error> {
        let mine =
            conn.export_keying_material([0u8; KEY_LEN], KEY_LABEL, Some(key_context(side)))?;
        let theirs =
            conn.export_keying_material([0u8; KEY_LEN], KEY_LABEL, Some(key_context(side.peer())))?;
        Ok(Protection {
            sealer: Sealer::new(cipher, &mine),
            opener: Opener::new(cipher, &theirs),
        })
    }
}

impl Protection {
    /// Binds both directions to the client's operation `stream`: what the client sends is
    /// numbered by the stream, from `first_op` (the first operation this session carries: 1 for
    /// a new stream, the next undelivered one for a resumed stream); what the server sends counts
    /// from 1 in each session. `side` is this end.
    pub fn bind_stream(&mut self, side: Side, stream: StreamId, first_op: u64) {
        let (client_to_server, server_to_client) = match side {
            Side::Client => (&mut self.sealer.next_seq, &mut self.opener.next_seq),
            Side::Server => (&mut self.opener.next_seq, &mut self.sealer.next_seq),
        };
        *client_to_server = first_op.max(1);
        *server_to_client = 1;
        self.sealer.stream = stream;
        self.opener.stream = stream;
    }
}

/// Which end of the connection: the TLS server or the TLS client. Each end has its own
/// payload key and its own confirmation token ([`crate::tls::confirmation_tokens`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The TLS server.
    Server,
    /// The TLS client.
    Client,
}

impl Side {
    /// The other end of the connection.
    pub fn peer(self) -> Side {
        match self {
            Side::Server => Side::Client,
            Side::Client => Side::Server,
        }
    }
}

/// The exporter label of the payload keys (distinct from the confirmation tokens').
pub(crate) const KEY_LABEL: &[u8] = b"EXPORTER-secure-rdma-payload-key";

/// The exporter context of the key for messages sent by `sender`.
pub(crate) fn key_context(sender: Side) -> &'static [u8] {
    match sender {
        Side::Client => b"client to server",
        Side::Server => b"server to client",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cipher: Cipher) -> (Sealer, Opener) {
        let k = [0x42u8; KEY_LEN];
        (Sealer::new(cipher, &k), Opener::new(cipher, &k))
    }

    fn sealed(s: &mut Sealer, op: Op, msg: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; msg.len() + OVERHEAD];
        let n = s.seal(op, msg, &mut out).unwrap();
        out.truncate(n);
        out
    }

    #[test]
    fn round_trips_in_both_ciphers_and_every_size() {
        for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
            let (mut s, mut o) = pair(cipher);
            for len in [0usize, 1, 15, 16, 17, 4096, 65_536] {
                let msg: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
                let op = if len % 2 == 0 { Op::Send } else { Op::Write };
                let mut wire = sealed(&mut s, op, &msg);
                assert_eq!(wire.len(), len + OVERHEAD);
                if len > 0 {
                    assert_ne!(
                        &wire[HEADER_LEN..HEADER_LEN + len],
                        &msg[..],
                        "not encrypted"
                    );
                }
                assert_eq!(o.open(op, &mut wire).unwrap(), &msg[..], "{cipher} {len}");
            }
        }
    }

    #[test]
    fn nonces_never_repeat_and_the_sequence_cannot_wrap() {
        let (mut s, _) = pair(Cipher::ChaCha20Poly1305);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..10_000 {
            let wire = sealed(&mut s, Op::Send, b"x");
            let mut h = [0u8; HEADER_LEN];
            h.copy_from_slice(&wire[..HEADER_LEN]);
            assert!(seen.insert(Header::parse(&h).unwrap().seq), "nonce reused");
        }
        // The same plaintext never gives the same ciphertext twice.
        assert_ne!(
            sealed(&mut s, Op::Send, b"same"),
            sealed(&mut s, Op::Send, b"same")
        );
        s.next_seq = u64::MAX;
        let mut out = [0u8; OVERHEAD + 1];
        assert_eq!(s.seal(Op::Send, b"x", &mut out), Err(SealError::Exhausted));
        assert_eq!(s.next_seq, u64::MAX, "a refused seal must not advance");
    }

    #[test]
    fn every_tampered_byte_is_rejected() {
        let (mut s, _) = pair(Cipher::Aes256Gcm);
        let wire = sealed(&mut s, Op::Send, b"tamper with me");
        for i in 0..wire.len() {
            let mut bad = wire.clone();
            bad[i] ^= 0x01;
            let (_, mut o) = pair(Cipher::Aes256Gcm);
            assert!(
                o.open(Op::Send, &mut bad).is_err(),
                "byte {i} flipped and accepted"
            );
            assert_eq!(
                o.next_seq(),
                1,
                "a refused message must not advance the sequence"
            );
        }
    }

    #[test]
    fn replays_reorderings_and_wrong_operations_are_rejected() {
        let (mut s, mut o) = pair(Cipher::ChaCha20Poly1305);
        let first = sealed(&mut s, Op::Send, b"one");
        let second = sealed(&mut s, Op::Send, b"two");
        // Out of order: the second before the first.
        let mut early = second.clone();
        assert_eq!(
            o.open(Op::Send, &mut early),
            Err(AuthError::Sequence {
                expected: 1,
                got: 2
            })
        );
        // A SEND presented as a WRITE.
        let mut as_write = first.clone();
        assert!(matches!(
            o.open(Op::Write, &mut as_write),
            Err(AuthError::WrongOp { .. })
        ));
        let mut ok = first.clone();
        assert_eq!(o.open(Op::Send, &mut ok).unwrap(), b"one");
        // The first again: a replay.
        let mut replay = first.clone();
        assert_eq!(
            o.open(Op::Send, &mut replay),
            Err(AuthError::Sequence {
                expected: 2,
                got: 1
            })
        );
        // A header rewritten to the expected sequence no longer verifies.
        let mut forged_seq = first.clone();
        forged_seq[4..12].copy_from_slice(&2u64.to_be_bytes());
        assert_eq!(o.open(Op::Send, &mut forged_seq), Err(AuthError::Tag));
        // A header claiming another length.
        let mut forged_len = second.clone();
        forged_len[12..16].copy_from_slice(&2u32.to_be_bytes());
        assert!(matches!(
            o.open(Op::Send, &mut forged_len),
            Err(AuthError::Length { .. })
        ));
        let mut ok = second.clone();
        assert_eq!(o.open(Op::Send, &mut ok).unwrap(), b"two");
        // Too short to be a message at all; an attacker's plaintext.
        assert_eq!(
            o.open(Op::Send, &mut [0u8; 5]),
            Err(AuthError::Truncated(5))
        );
        let mut plain = b"FORGED-BY-ATTACKER-xxxxxxxxxxxxxxxxxxx".to_vec();
        assert!(o.open(Op::Send, &mut plain).is_err());
    }

    #[test]
    fn a_message_opens_only_in_its_own_stream_and_a_resumed_stream_goes_on_numbering() {
        let k = [0x42u8; KEY_LEN];
        let (a, b) = (StreamId([1; 16]), StreamId([2; 16]));
        let mut s = Sealer::new(Cipher::ChaCha20Poly1305, &k);
        s.bind(a, 41);
        let wire = sealed(&mut s, Op::Send, b"op 41");
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&wire[..HEADER_LEN]);
        assert_eq!(Header::parse(&h).unwrap().seq, 41);
        // Another stream with the same key and sequence: the bound stream id differs, the tag
        // does not verify.
        let mut other = Opener::new(Cipher::ChaCha20Poly1305, &k);
        other.bind(b, 41);
        assert_eq!(other.open(Op::Send, &mut wire.clone()), Err(AuthError::Tag));
        let mut right = Opener::new(Cipher::ChaCha20Poly1305, &k);
        right.bind(a, 41);
        assert_eq!(right.open(Op::Send, &mut wire.clone()).unwrap(), b"op 41");
        assert_eq!(right.next_seq(), 42);
    }

    #[test]
    fn a_version_1_message_is_refused_by_name() {
        let (mut s, mut o) = pair(Cipher::Aes256Gcm);
        let mut wire = sealed(&mut s, Op::Send, b"old format");
        wire[0] = 1;
        let e = o.open(Op::Send, &mut wire).unwrap_err();
        assert_eq!(e, AuthError::Version { got: 1 });
        assert_eq!(
            e.to_string(),
            "sealed-message version 1 is not accepted (this end speaks 2); upgrade the peer"
        );
    }

    #[test]
    fn bind_stream_numbers_the_client_direction_by_the_stream_on_both_ends() {
        let stream = StreamId([9; 16]);
        let k1 = [1u8; KEY_LEN];
        let k2 = [2u8; KEY_LEN];
        // The client seals with k1 and opens with k2; the server the reverse.
        let mut client = Protection {
            sealer: Sealer::new(Cipher::Aes256Gcm, &k1),
            opener: Opener::new(Cipher::Aes256Gcm, &k2),
        };
        let mut server = Protection {
            sealer: Sealer::new(Cipher::Aes256Gcm, &k2),
            opener: Opener::new(Cipher::Aes256Gcm, &k1),
        };
        client.bind_stream(Side::Client, stream, 7);
        server.bind_stream(Side::Server, stream, 7);
        let mut op = sealed(&mut client.sealer, Op::Write, b"seventh");
        assert_eq!(server.opener.open(Op::Write, &mut op).unwrap(), b"seventh");
        let mut ack = sealed(&mut server.sealer, Op::Send, b"ack");
        assert_eq!(client.opener.open(Op::Send, &mut ack).unwrap(), b"ack");
        assert_eq!((server.opener.next_seq(), client.opener.next_seq()), (8, 2));
    }

    #[test]
    fn another_key_or_cipher_cannot_open() {
        let mut s = Sealer::new(Cipher::Aes256Gcm, &[1u8; KEY_LEN]);
        let wire = sealed(&mut s, Op::Send, b"secret");
        let mut o = Opener::new(Cipher::Aes256Gcm, &[2u8; KEY_LEN]);
        assert_eq!(o.open(Op::Send, &mut wire.clone()), Err(AuthError::Tag));
        let mut o = Opener::new(Cipher::ChaCha20Poly1305, &[1u8; KEY_LEN]);
        assert_eq!(o.open(Op::Send, &mut wire.clone()), Err(AuthError::Tag));
    }

    #[test]
    fn cipher_names_parse_and_the_preference_is_both() {
        for c in Cipher::preference() {
            assert_eq!(c.name().parse::<Cipher>().unwrap(), c);
            assert_eq!(serde_json::to_string(&c).unwrap(), format!("\"{c}\""));
        }
        assert_ne!(Cipher::preference()[0], Cipher::preference()[1]);
        assert!("aes-128-gcm"
            .parse::<Cipher>()
            .unwrap_err()
            .to_string()
            .contains("chacha20-poly1305"));
    }
}
