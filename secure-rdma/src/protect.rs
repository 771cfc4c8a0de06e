//! Payload protection: authenticated encryption of every RDMA SEND and WRITE.
//!
//! TLS protects the connection setup, and CSPRNG PSNs stop a blind attacker, but an RC
//! responder accepts any packet that carries the right QPN and the next PSN: an on-path
//! observer can forge or replay messages (`rdma-inject` does it in the lab). So every message
//! the two ends exchange over RDMA is sealed with an AEAD whose keys only they hold:
//!
//! - **Keys**: one per direction, from the TLS session's exporter (RFC 8446 §7.5) with their own
//!   label, so they are unrelated to the confirmation tokens and new for every session: the key
//!   of epoch 0. Each direction also exports, under another label, the secret its later keys
//!   ratchet from, as TLS 1.3's KeyUpdate does (RFC 8446 §7.2): `key_n = HKDF-Expand-Label(
//!   secret_n, "key")`, `secret_n+1 = HKDF-Expand-Label(secret_n, "traffic upd")` (SHA-256, our
//!   own label prefix). The sender moves to the next epoch when its [`RekeyPolicy`] says so
//!   (messages, bytes or seconds under one key); the epoch travels in the header, and the
//!   receiver follows it (see [Key rotation](#key-rotation)). Epoch 0's key is what it was before
//!   keys rotated, so a peer of an earlier release interoperates as long as nothing rotates
//!   (the server rotates nothing for a client that does not list [`crate::handshake::KEY_ROTATION`]).
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
//!   | 2 | key epoch, its low 8 bits ([key rotation](#key-rotation)) |
//!   | 3 | lane (0 until a session has several QPs) |
//!   | 4..12 | sequence, u64 big endian (also the nonce) |
//!   | 12..16 | plaintext length, u32 big endian |
//! - **Receiving**: [`Opener::open`] checks the header, the key epoch (the current one or the
//!   next), that the sequence is exactly the next one (RC delivers in order, so anything else is
//!   a replay or a forgery), and the tag, before a byte of plaintext is released. A failure is an [`AuthError`]; the session that sees one
//!   must be torn down, since its QP has accepted a packet the peer never sent.
//!
//! # Key rotation
//!
//! A [`Sealer`] rotates before sealing a message when any threshold of its [`RekeyPolicy`] is
//! reached (the seconds are the age of the current key, looked at when the next message is
//! sealed: an idle key seals nothing). The message is sealed under the new epoch, and an
//! [`Opener`] that sees the next epoch in a header ratchets its own copy of the secret, and
//! commits to it only once that message's tag verifies: RC delivers in order and a key never
//! goes back, so the message before a switch is of the old epoch and every message after it of
//! the new one, and no message is lost at a switch. A message of any earlier epoch is refused
//! as [`AuthError::EpochEnded`], before its tag is looked at.
//!
//! The header's epoch is the low 8 bits of the epoch counter, and the receiver compares it
//! modulo 256: the only epochs it accepts are the current one and the next, and which key a
//! byte means is never in doubt, because a sender moves at most one epoch per message. After
//! 256 rotations the byte repeats but the key does not (every epoch's key comes from a secret
//! the ratchet never returns to), so a message sealed 256 epochs ago opens under no key this
//! side holds: its tag fails. The byte only chooses between two keys and names a refusal.
//!
//! When an epoch ends, its secret is overwritten with zeros ([`zeroize`]), and so is every
//! intermediate derived from it that this module holds: who reads this process's memory later
//! learns nothing of the traffic of ended epochs from our copies. What ring keeps is not ours to
//! wipe: the expanded AEAD key (AES round keys, or the ChaCha20 key) inside its `LessSafeKey`
//! and the HMAC state inside an HKDF `Prk` are dropped without being zeroized, so their bytes
//! stay in freed memory until it is reused.
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

use std::time::Duration;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf;
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

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

/// When a direction's key rotates: after this many messages, plaintext bytes or seconds under
/// one key, whichever comes first. A threshold of 0 is off; all three off never rotates.
///
/// The server sets it ([`ServerConfig::with_rekey`](crate::server::ServerConfig::with_rekey)) and
/// announces it in its accept; both ends apply it to what they send. The defaults keep each key
/// far inside the usage limits of AES-256-GCM (draft-irtf-cfrg-aead-limits): at most 2^24
/// messages and 2^32 bytes per key bound the confidentiality advantage of one key by 2^-72 (see
/// the README's "Key rotation" for the arithmetic), and no key lives more than an hour.
///
/// ```
/// use secure_rdma::protect::RekeyPolicy;
///
/// let policy = RekeyPolicy::default().with_messages(100);
/// assert_eq!((policy.messages, policy.bytes, policy.seconds), (100, 1 << 32, 3600));
/// assert!(RekeyPolicy::off().is_off());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RekeyPolicy {
    /// Messages sealed under one key before the next; 0: no message threshold.
    #[serde(default)]
    pub messages: u64,
    /// Plaintext bytes sealed under one key before the next (a key never exceeds it, except by a
    /// single message larger than the threshold, sealed alone under its key); 0: no byte
    /// threshold.
    #[serde(default)]
    pub bytes: u64,
    /// Seconds a key is used before the next (checked when a message is sealed); 0: no time
    /// threshold.
    #[serde(default)]
    pub seconds: u64,
}

impl Default for RekeyPolicy {
    /// [`RekeyPolicy::DEFAULT_MESSAGES`], [`RekeyPolicy::DEFAULT_BYTES`] and
    /// [`RekeyPolicy::DEFAULT_SECONDS`].
    fn default() -> RekeyPolicy {
        RekeyPolicy {
            messages: RekeyPolicy::DEFAULT_MESSAGES,
            bytes: RekeyPolicy::DEFAULT_BYTES,
            seconds: RekeyPolicy::DEFAULT_SECONDS,
        }
    }
}

/// Which threshold of a [`RekeyPolicy`] made a key rotate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RekeyTrigger {
    /// [`RekeyPolicy::messages`].
    Messages,
    /// [`RekeyPolicy::bytes`].
    Bytes,
    /// [`RekeyPolicy::seconds`].
    Seconds,
    /// [`Sealer::rotate`], called by the application.
    Requested,
}

impl RekeyTrigger {
    /// The threshold's name in logs.
    pub const fn name(self) -> &'static str {
        match self {
            RekeyTrigger::Messages => "messages",
            RekeyTrigger::Bytes => "bytes",
            RekeyTrigger::Seconds => "seconds",
            RekeyTrigger::Requested => "requested",
        }
    }
}

impl RekeyPolicy {
    /// Default message threshold: 2^24 messages per key.
    pub const DEFAULT_MESSAGES: u64 = 1 << 24;
    /// Default byte threshold: 2^32 bytes (4 GiB) per key.
    pub const DEFAULT_BYTES: u64 = 1 << 32;
    /// Default time threshold: one hour per key.
    pub const DEFAULT_SECONDS: u64 = 3600;

    /// No rotation: one key per direction for the whole session (what a peer that announces no
    /// policy does).
    pub const fn off() -> RekeyPolicy {
        RekeyPolicy {
            messages: 0,
            bytes: 0,
            seconds: 0,
        }
    }

    /// Sets [`messages`](Self::messages) (0: off).
    pub fn with_messages(mut self, messages: u64) -> RekeyPolicy {
        self.messages = messages;
        self
    }

    /// Sets [`bytes`](Self::bytes) (0: off).
    pub fn with_bytes(mut self, bytes: u64) -> RekeyPolicy {
        self.bytes = bytes;
        self
    }

    /// Sets [`seconds`](Self::seconds) (0: off).
    pub fn with_seconds(mut self, seconds: u64) -> RekeyPolicy {
        self.seconds = seconds;
        self
    }

    /// Whether every threshold is off.
    pub fn is_off(&self) -> bool {
        self.messages == 0 && self.bytes == 0 && self.seconds == 0
    }

    /// Whether a key that sealed `messages` messages of `bytes` bytes and is `age` old must
    /// rotate before sealing `next_len` more bytes, and which threshold says so.
    fn due(&self, messages: u64, bytes: u64, next_len: u64, age: Duration) -> Option<RekeyTrigger> {
        if self.messages > 0 && messages >= self.messages {
            return Some(RekeyTrigger::Messages);
        }
        // A fresh key takes any one message: a message larger than the threshold must still
        // go, and rotating before it would not make it smaller.
        if self.bytes > 0 && messages > 0 && bytes.saturating_add(next_len) > self.bytes {
            return Some(RekeyTrigger::Bytes);
        }
        if self.seconds > 0 && age >= Duration::from_secs(self.seconds) {
            return Some(RekeyTrigger::Seconds);
        }
        None
    }
}

impl std::fmt::Display for RekeyPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_off() {
            return f.write_str("never");
        }
        let mut parts = Vec::new();
        if self.messages > 0 {
            parts.push(format!("{} messages", self.messages));
        }
        if self.bytes > 0 {
            parts.push(format!("{} bytes", self.bytes));
        }
        if self.seconds > 0 {
            parts.push(format!("{} s", self.seconds));
        }
        write!(f, "every {}", parts.join(" or "))
    }
}

/// The output length of [`expand_label`]: 32 bytes (both our secrets and our keys).
struct Len32;

impl hkdf::KeyType for Len32 {
    fn len(&self) -> usize {
        KEY_LEN
    }
}

/// HKDF-Expand-Label (RFC 8446 §7.1) with SHA-256, an empty context and our own prefix in place
/// of "tls13 " (these are not TLS keys), giving 32 bytes.
fn expand_label(secret: &[u8; KEY_LEN], label: &[u8]) -> Zeroizing<[u8; KEY_LEN]> {
    const PREFIX: &[u8] = b"srdma ";
    // struct { uint16 length; opaque label<7..255>; opaque context<0..255>; } HkdfLabel
    let length = (KEY_LEN as u16).to_be_bytes();
    let label_len = [(PREFIX.len() + label.len()) as u8];
    let info: [&[u8]; 5] = [&length, &label_len, PREFIX, label, &[0u8]];
    let prk = hkdf::Prk::new_less_safe(hkdf::HKDF_SHA256, secret);
    let mut out = Zeroizing::new([0u8; KEY_LEN]);
    // 32 bytes is far below HKDF-SHA256's 255 * 32-byte maximum: neither call can fail.
    prk.expand(&info, Len32)
        .and_then(|okm| okm.fill(&mut out[..]))
        .unwrap_or_else(|_| unreachable!("HKDF-SHA256 expands to 32 bytes"));
    out
}

/// One direction's key schedule at one epoch: the epoch's AEAD key, and the secret the next
/// epoch's key and secret come from. Epoch 0's key is the direction's key as exported; epoch
/// `n + 1`'s key is `HKDF-Expand-Label(secret, "key")` and the secret after it
/// `HKDF-Expand-Label(secret, "traffic upd")`, so whoever holds epoch `n`'s state can derive the
/// keys that follow but none before. Dropping it zeroizes the secret (ring's copy of the key is
/// ring's: see the [module documentation](self#key-rotation)).
struct Ratchet {
    cipher: Cipher,
    /// The number of rotations so far; the header carries its low 8 bits.
    epoch: u64,
    key: LessSafeKey,
    /// The secret of the next epoch.
    next_secret: Zeroizing<[u8; KEY_LEN]>,
}

impl Ratchet {
    /// Epoch 0 of a direction: its AEAD key, and the secret its first rotation derives from.
    fn new(
        cipher: Cipher,
        key_bytes: &[u8; KEY_LEN],
        next_secret: Zeroizing<[u8; KEY_LEN]>,
    ) -> Ratchet {
        Ratchet {
            cipher,
            epoch: 0,
            key: key(cipher, key_bytes),
            next_secret,
        }
    }

    /// The next epoch's schedule. `self` still holds the secret it came from: the caller drops
    /// it (zeroizing it) once the next epoch is in use.
    fn next(&self) -> Ratchet {
        // The key bytes are zeroized when they drop, once ring has its own copy.
        let key_bytes = expand_label(&self.next_secret, b"key");
        Ratchet {
            cipher: self.cipher,
            epoch: self.epoch.wrapping_add(1),
            key: key(self.cipher, &key_bytes),
            next_secret: expand_label(&self.next_secret, b"traffic upd"),
        }
    }

    /// The epoch's byte in a header.
    fn byte(&self) -> u8 {
        (self.epoch & 0xff) as u8
    }
}

/// The ratchet secret of a direction whose epoch-0 key is `key`, outside a TLS session (tests,
/// benchmarks): [`Protection::from_tls`] exports it from the session instead.
fn ratchet_from_key(key: &[u8; KEY_LEN]) -> Zeroizing<[u8; KEY_LEN]> {
    expand_label(key, b"ratchet")
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

/// Seals the messages of one direction. Owns the direction's key schedule, its rotation policy
/// and its next sequence number.
pub struct Sealer {
    ratchet: Ratchet,
    cipher: Cipher,
    next_seq: u64,
    stream: StreamId,
    policy: RekeyPolicy,
    /// The lane whose keys these are, written in each header ([`crate::lanes`]; 0 for a
    /// session's first QP, as before lanes).
    lane: u8,
    /// Messages and plaintext bytes sealed under the current key, and when it took over.
    epoch_messages: u64,
    epoch_bytes: u64,
    /// When the key began: the coarse clock, read on each seal while a time threshold is set.
    epoch_started: crate::clock::Coarse,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Sealer")
            .field("cipher", &self.cipher)
            .field("next_seq", &self.next_seq)
            .field("epoch", &self.ratchet.epoch)
            .field("policy", &self.policy)
            .finish()
    }
}

impl Sealer {
    /// A sealer whose first key is `key_bytes`, whose first message gets sequence 1, bound to
    /// the all-zero stream until [`Sealer::bind`], that never rotates until
    /// [`Sealer::set_policy`]. Its later keys come from a secret derived from `key_bytes`
    /// (tests, benchmarks); [`Protection::from_tls`] exports that secret from the TLS session.
    pub fn new(cipher: Cipher, key_bytes: &[u8; KEY_LEN]) -> Sealer {
        Sealer::with_ratchet(cipher, key_bytes, ratchet_from_key(key_bytes))
    }

    fn with_ratchet(
        cipher: Cipher,
        key_bytes: &[u8; KEY_LEN],
        ratchet: Zeroizing<[u8; KEY_LEN]>,
    ) -> Sealer {
        Sealer {
            ratchet: Ratchet::new(cipher, key_bytes, ratchet),
            cipher,
            next_seq: 1,
            stream: StreamId([0; 16]),
            policy: RekeyPolicy::off(),
            lane: 0,
            epoch_messages: 0,
            epoch_bytes: 0,
            epoch_started: crate::clock::Coarse::now(),
        }
    }

    /// Binds the sealer to `stream`, its first message getting sequence `first` (a resumed
    /// stream goes on where the server's delivery stopped). Sequence 0 is never used, so a
    /// `first` of 0 means 1.
    pub fn bind(&mut self, stream: StreamId, first: u64) {
        self.stream = stream;
        self.next_seq = first.max(1);
    }

    /// Rotates the key by `policy` from now on (the current key's use so far counts).
    pub fn set_policy(&mut self, policy: RekeyPolicy) {
        self.policy = policy;
    }

    /// The rotation policy.
    pub fn policy(&self) -> RekeyPolicy {
        self.policy
    }

    /// The cipher this sealer uses.
    pub fn cipher(&self) -> Cipher {
        self.cipher
    }

    /// The sequence number the next message will carry.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The current key epoch: how many times the key rotated.
    pub fn epoch(&self) -> u64 {
        self.ratchet.epoch
    }

    /// Moves to the next key now, whatever the policy; the previous epoch's secret is zeroized.
    /// The peer's [`Opener`] follows with the next message.
    pub fn rotate(&mut self) {
        self.rotate_for(RekeyTrigger::Requested);
    }

    fn rotate_for(&mut self, trigger: RekeyTrigger) {
        // The old schedule drops here: its secret is zeroized.
        self.ratchet = self.ratchet.next();
        tracing::debug!(
            direction = "send",
            epoch = self.ratchet.epoch,
            trigger = trigger.name(),
            messages = self.epoch_messages,
            bytes = self.epoch_bytes,
            "payload key rotated"
        );
        self.epoch_messages = 0;
        self.epoch_bytes = 0;
        self.epoch_started = crate::clock::Coarse::now();
    }

    /// Writes `plaintext`, sealed for `op`, to the front of `out`; returns the bytes written
    /// (`plaintext.len() + OVERHEAD`). The key rotates first when the policy says so. The
    /// sequence advances only on success.
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
        // The key's age, to the kernel's tick: no precise clock read per message.
        let age = match self.policy.seconds {
            0 => Duration::ZERO,
            _ => self.epoch_started.elapsed(),
        };
        if let Some(trigger) =
            self.policy
                .due(self.epoch_messages, self.epoch_bytes, u64::from(len), age)
        {
            self.rotate_for(trigger);
        }
        let seq = self.next_seq;
        let header = Header {
            op,
            epoch: self.ratchet.byte(),
            lane: self.lane,
            seq,
            len,
        }
        .to_bytes();
        let (head, rest) = out.split_at_mut(HEADER_LEN);
        head.copy_from_slice(&header);
        let (body, tag_out) = rest.split_at_mut(plaintext.len());
        body.copy_from_slice(plaintext);
        let tag = self
            .ratchet
            .key
            .seal_in_place_separate_tag(nonce(seq), Aad::from(aad(&header, &self.stream)), body)
            .map_err(|_| SealError::TooLong(plaintext.len()))?;
        tag_out[..TAG_LEN].copy_from_slice(tag.as_ref());
        self.next_seq += 1;
        self.epoch_messages += 1;
        self.epoch_bytes = self.epoch_bytes.saturating_add(u64::from(len));
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
    /// Sealed under a key whose epoch has ended: a captured message replayed after the keys
    /// rotated (its secret is gone, so it could not be opened anyway).
    #[error("sealed under key epoch {epoch}, which has ended (current epoch {current})")]
    EpochEnded {
        /// The message's epoch.
        epoch: u64,
        /// The epoch this side is in.
        current: u64,
    },
    /// An epoch byte that is neither the current epoch's nor the next one's, nor one that
    /// ended: the sender moves one epoch at a time, so no peer sends it.
    #[error("sealed under key epoch byte {got}, neither the current epoch {current} nor the next")]
    EpochUnknown {
        /// The header's epoch byte.
        got: u8,
        /// The epoch this side is in.
        current: u64,
    },
}

/// Every value of [`AuthError::check`], in the order [`Opener::open`] applies the checks.
pub const AUTH_CHECKS: [&str; 8] = [
    "truncated",
    "version",
    "header",
    "operation",
    "epoch",
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
            AuthError::EpochEnded { .. } | AuthError::EpochUnknown { .. } => "epoch",
            AuthError::Sequence { .. } => "sequence",
            AuthError::Length { .. } => "length",
            AuthError::Tag => "tag",
        }
    }
}

/// Opens the messages of one direction, in order. Owns the direction's key schedule, which
/// follows the epoch in the headers, and the next sequence number it accepts.
pub struct Opener {
    ratchet: Ratchet,
    cipher: Cipher,
    next_seq: u64,
    stream: StreamId,
}

impl std::fmt::Debug for Opener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opener")
            .field("cipher", &self.cipher)
            .field("next_seq", &self.next_seq)
            .field("epoch", &self.ratchet.epoch)
            .finish()
    }
}

impl Opener {
    /// An opener whose first key is `key_bytes` (later keys as [`Sealer::new`]'s), that
    /// accepts sequence 1 first, of the all-zero stream until [`Opener::bind`].
    pub fn new(cipher: Cipher, key_bytes: &[u8; KEY_LEN]) -> Opener {
        Opener::with_ratchet(cipher, key_bytes, ratchet_from_key(key_bytes))
    }

    fn with_ratchet(
        cipher: Cipher,
        key_bytes: &[u8; KEY_LEN],
        ratchet: Zeroizing<[u8; KEY_LEN]>,
    ) -> Opener {
        Opener {
            ratchet: Ratchet::new(cipher, key_bytes, ratchet),
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

    /// The current key epoch: how many times the peer's key rotated.
    pub fn epoch(&self) -> u64 {
        self.ratchet.epoch
    }

    /// Verifies and decrypts a message that arrived as `op`, in place; returns the plaintext,
    /// a sub-slice of `msg`. Nothing is returned unless every check passed; on success the
    /// expected sequence advances, so the same message is refused if it comes again, and a
    /// message of the next epoch moves this side to it.
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
        // The epoch before the sequence and the tag, so that a message of an ended epoch is
        // refused by name, whatever else was done to it.
        let current = self.ratchet.epoch;
        let next = match header.epoch.wrapping_sub(self.ratchet.byte()) {
            0 => None,
            1 => Some(self.ratchet.next()),
            // Modulo 256, behind by 1..=127: an epoch that ended (if this session had it).
            behind @ 129..=255 if u64::from(256 - u16::from(behind)) <= current => {
                return Err(AuthError::EpochEnded {
                    epoch: current - u64::from(256 - u16::from(behind)),
                    current,
                })
            }
            _ => {
                return Err(AuthError::EpochUnknown {
                    got: header.epoch,
                    current,
                })
            }
        };
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
        let key = &next.as_ref().unwrap_or(&self.ratchet).key;
        let plain = key
            .open_in_place(nonce(header.seq), Aad::from(aad(&raw, &self.stream)), body)
            .map_err(|_| AuthError::Tag)?;
        if let Some(next) = next {
            // Only a message that verified under the next key moves this side on (a forged
            // epoch byte costs the forger its session, not our keys); the ended epoch's secret
            // is zeroized as the old schedule drops.
            self.ratchet = next;
            tracing::debug!(
                direction = "receive",
                epoch = self.ratchet.epoch,
                seq = header.seq,
                "payload key rotated (the peer moved to the next epoch)"
            );
        }
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
    /// same keys from the session's exporter secret (RFC 8446 §7.5); nobody else can. Each
    /// direction also exports the secret its key rotations ratchet from (its own label, so it
    /// is unrelated to the keys); neither rotates until [`Protection::set_rekey`]. The exported
    /// bytes are zeroized once the schedules have their copies.
    pub fn from_tls<D>(
        conn: &rustls::ConnectionCommon<D>,
        side: Side,
        cipher: Cipher,
    ) -> Result<Protection, rustls::Error> {
        Protection::from_tls_lane(conn, side, cipher, 0)
    }

    /// The payload keys of `lane` of this TLS session ([`crate::lanes`]): the exporter context
    /// names the lane, so every lane has keys of its own that no other lane can open. Lane 0
    /// derives exactly what [`Protection::from_tls`] does (the context of a session without
    /// lanes), so a session that never opens a second lane is unchanged on the wire.
    pub fn from_tls_lane<D>(
        conn: &rustls::ConnectionCommon<D>,
        side: Side,
        cipher: Cipher,
        lane: u32,
    ) -> Result<Protection, rustls::Error> {
        Ok(ProtectionSecrets::from_tls_lane(conn, side, lane)?.protection(cipher))
    }
}

/// The four secrets a [`Protection`] is made of (each direction's key and the secret its
/// rotations ratchet from), exported before the cipher is chosen: both ciphers take a 256-bit
/// key, so a client derives them while its hello travels and the server admits it, instead of
/// after the accept that names the cipher (four exporter calls, a few hundred microseconds of
/// a handshake under emulation). Zeroized when dropped unused, as once used.
pub struct ProtectionSecrets {
    mine: Zeroizing<[u8; KEY_LEN]>,
    theirs: Zeroizing<[u8; KEY_LEN]>,
    mine_next: Zeroizing<[u8; KEY_LEN]>,
    theirs_next: Zeroizing<[u8; KEY_LEN]>,
    lane: u32,
}

impl std::fmt::Debug for ProtectionSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secrets.
        f.debug_struct("ProtectionSecrets")
            .field("lane", &self.lane)
            .finish_non_exhaustive()
    }
}

impl ProtectionSecrets {
    /// The secrets of `lane` of this TLS session seen from `side`
    /// ([`Protection::from_tls_lane`] without the cipher).
    pub fn from_tls_lane<D>(
        conn: &rustls::ConnectionCommon<D>,
        side: Side,
        lane: u32,
    ) -> Result<ProtectionSecrets, rustls::Error> {
        let export =
            |label: &[u8], sender: Side| -> Result<Zeroizing<[u8; KEY_LEN]>, rustls::Error> {
                let mut out = Zeroizing::new([0u8; KEY_LEN]);
                let context = crate::lanes::lane_context(key_context(sender), lane);
                conn.export_keying_material(&mut out[..], label, Some(&context))?;
                Ok(out)
            };
        Ok(ProtectionSecrets {
            mine: export(KEY_LABEL, side)?,
            theirs: export(KEY_LABEL, side.peer())?,
            mine_next: export(RATCHET_LABEL, side)?,
            theirs_next: export(RATCHET_LABEL, side.peer())?,
            lane,
        })
    }

    /// Both directions' schedules for `cipher`; the exported bytes are zeroized once they have
    /// their copies.
    pub fn protection(self, cipher: Cipher) -> Protection {
        let ProtectionSecrets {
            mine,
            theirs,
            mine_next,
            theirs_next,
            lane,
        } = self;
        let mut sealer = Sealer::with_ratchet(cipher, &mine, mine_next);
        // Lane numbers stay below [`crate::lanes::MAX_LANE`]; the byte is for observers (it is
        // authenticated with the rest of the header, and another lane's keys open nothing).
        sealer.lane = u8::try_from(lane).unwrap_or(u8::MAX);
        Protection {
            sealer,
            opener: Opener::with_ratchet(cipher, &theirs, theirs_next),
        }
    }
}

impl Protection {
    /// Rotates what this side sends by `policy` (the server's, announced in its accept; what
    /// the peer sends rotates by the peer's copy of it, and this side follows).
    pub fn set_rekey(&mut self, policy: RekeyPolicy) {
        self.sealer.set_policy(policy);
    }

    /// The key epochs so far: what this side sends, and what it received.
    pub fn epochs(&self) -> (u64, u64) {
        (self.sealer.epoch(), self.opener.epoch())
    }

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

/// The exporter label of the secrets the payload keys ratchet from when they rotate.
pub(crate) const RATCHET_LABEL: &[u8] = b"EXPORTER-secure-rdma-key-update";

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
    /// Seals `n` messages of `len` bytes, opens each, and returns the epochs they carried.
    fn stream_through(s: &mut Sealer, o: &mut Opener, n: usize, len: usize) -> Vec<u8> {
        let mut epochs = Vec::new();
        for i in 0..n {
            let msg = vec![i as u8; len];
            let mut wire = sealed(s, Op::Send, &msg);
            epochs.push(wire[2]);
            assert_eq!(
                o.open(Op::Send, &mut wire).unwrap(),
                &msg[..],
                "message {i}"
            );
        }
        epochs
    }

    #[test]
    fn the_message_threshold_rotates_and_no_message_is_lost_at_a_switch() {
        for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
            let (mut s, mut o) = pair(cipher);
            s.set_policy(RekeyPolicy::off().with_messages(100));
            let epochs = stream_through(&mut s, &mut o, 1000, 8);
            // 100 messages under each key, in order: epochs 0..=9, every message delivered.
            for (i, e) in epochs.iter().enumerate() {
                assert_eq!(usize::from(*e), i / 100, "message {i}");
            }
            assert_eq!((s.epoch(), o.epoch()), (9, 9));
            assert_eq!(o.next_seq(), 1001);
        }
    }

    #[test]
    fn the_byte_threshold_rotates_before_a_key_would_exceed_it() {
        let (mut s, mut o) = pair(Cipher::Aes256Gcm);
        s.set_policy(RekeyPolicy::off().with_bytes(1000));
        // 300-byte messages: three fit under 1000 bytes, the fourth goes under the next key.
        let epochs = stream_through(&mut s, &mut o, 12, 300);
        assert_eq!(epochs, [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]);
        // A message larger than the threshold goes alone under a fresh key.
        let big = stream_through(&mut s, &mut o, 2, 5000);
        assert_eq!(big, [4, 5]);
        assert_eq!(o.epoch(), 5);
    }

    #[test]
    fn the_time_threshold_rotates_at_the_next_message() {
        let (mut s, mut o) = pair(Cipher::ChaCha20Poly1305);
        s.set_policy(RekeyPolicy::off().with_seconds(1));
        assert_eq!(stream_through(&mut s, &mut o, 3, 4), [0, 0, 0]);
        // The key is made older than a second (rather than waiting for one).
        s.epoch_started = s.epoch_started.earlier_by(Duration::from_millis(1001));
        assert_eq!(stream_through(&mut s, &mut o, 3, 4), [1, 1, 1]);
        assert_eq!(o.epoch(), 1);
    }

    #[test]
    fn the_defaults_and_an_off_policy() {
        let d = RekeyPolicy::default();
        assert_eq!((d.messages, d.bytes, d.seconds), (1 << 24, 1 << 32, 3600));
        assert_eq!(
            d.to_string(),
            "every 16777216 messages or 4294967296 bytes or 3600 s"
        );
        assert_eq!(RekeyPolicy::off().to_string(), "never");
        // A sealer rotates nothing unless told, however much it seals.
        let (mut s, mut o) = pair(Cipher::Aes256Gcm);
        stream_through(&mut s, &mut o, 500, 1);
        assert_eq!((s.epoch(), o.epoch()), (0, 0));
    }

    #[test]
    fn a_message_of_an_ended_epoch_is_refused_naming_the_epoch_before_its_tag() {
        let (mut s, mut o) = pair(Cipher::Aes256Gcm);
        s.set_policy(RekeyPolicy::off().with_messages(10));
        // Captured: the 35th message, of epoch 3.
        stream_through(&mut s, &mut o, 34, 16);
        let captured = sealed(&mut s, Op::Send, b"sixteen byte msg");
        assert_eq!(captured[2], 3);
        let mut ok = captured.clone();
        o.open(Op::Send, &mut ok).unwrap();
        stream_through(&mut s, &mut o, 20, 16);
        assert_eq!(o.epoch(), 5);
        // Renumbered to the next sequence, with a matching length: refused by its epoch.
        let mut replay = captured.clone();
        replay[4..12].copy_from_slice(&o.next_seq().to_be_bytes());
        let e = o.open(Op::Send, &mut replay).unwrap_err();
        assert_eq!(
            e,
            AuthError::EpochEnded {
                epoch: 3,
                current: 5
            }
        );
        assert_eq!(
            e.to_string(),
            "sealed under key epoch 3, which has ended (current epoch 5)"
        );
        // Its epoch byte rewritten to the current one, it reaches the tag, which refuses it.
        replay[2] = 5;
        assert_eq!(o.open(Op::Send, &mut replay), Err(AuthError::Tag));
        // An epoch two ahead is no epoch a peer sends.
        replay[2] = 7;
        assert_eq!(
            o.open(Op::Send, &mut replay),
            Err(AuthError::EpochUnknown { got: 7, current: 5 })
        );
        // Nothing of that moved the opener: the next real message opens.
        assert_eq!(o.next_seq(), 56);
        stream_through(&mut s, &mut o, 1, 16);
    }

    #[test]
    fn a_forged_next_epoch_does_not_move_the_receiver() {
        let (mut s, mut o) = pair(Cipher::ChaCha20Poly1305);
        let mut wire = sealed(&mut s, Op::Send, b"epoch 0");
        // The header claims the next epoch: the next key opens nothing sealed under this one.
        wire[2] = 1;
        assert_eq!(o.open(Op::Send, &mut wire.clone()), Err(AuthError::Tag));
        assert_eq!(o.epoch(), 0);
        wire[2] = 0;
        assert_eq!(o.open(Op::Send, &mut wire).unwrap(), b"epoch 0");
    }

    #[test]
    fn the_epoch_byte_wraps_and_a_message_256_epochs_old_opens_under_no_key() {
        let (mut s, mut o) = pair(Cipher::Aes256Gcm);
        s.set_policy(RekeyPolicy::off().with_messages(1));
        let first = sealed(&mut s, Op::Send, b"m");
        o.open(Op::Send, &mut first.clone()).unwrap();
        let epochs = stream_through(&mut s, &mut o, 300, 1);
        // One epoch per message: 1, 2, ..., 255, 0, 1, ... and every message opened.
        for (i, e) in epochs.iter().enumerate() {
            assert_eq!(*e, ((i + 1) % 256) as u8);
        }
        assert_eq!(o.epoch(), 300);
        // Epoch 0's message again, renumbered: its byte is 300 - 256 = 44 behind the current
        // byte (300 % 256), an ended epoch, named by its full number.
        let mut old = first.clone();
        old[4..12].copy_from_slice(&o.next_seq().to_be_bytes());
        assert_eq!(
            o.open(Op::Send, &mut old.clone()),
            Err(AuthError::EpochEnded {
                epoch: 256,
                current: 300
            })
        );
        // A message of epoch 44 (byte 44, like the current one) from 256 epochs ago: the byte
        // says "current", but the key is not the one it was sealed under.
        let (mut s2, _) = pair(Cipher::Aes256Gcm);
        s2.set_policy(RekeyPolicy::off().with_messages(1));
        for _ in 0..44 {
            sealed(&mut s2, Op::Send, b"m");
        }
        let mut stale = sealed(&mut s2, Op::Send, b"m");
        assert_eq!(stale[2], (300 % 256) as u8);
        stale[4..12].copy_from_slice(&o.next_seq().to_be_bytes());
        assert_eq!(o.open(Op::Send, &mut stale), Err(AuthError::Tag));
        // And the keys never cycle: the sender goes on.
        stream_through(&mut s, &mut o, 1, 1);
    }

    #[test]
    fn every_epoch_has_its_own_key_and_secret() {
        let key0 = [0x42; KEY_LEN];
        let mut r = Ratchet::new(Cipher::Aes256Gcm, &key0, ratchet_from_key(&key0));
        let mut seen = std::collections::HashSet::new();
        assert!(seen.insert(key0));
        assert!(seen.insert(*r.next_secret));
        for _ in 0..1000 {
            // The key each secret gives, and the secret after it: never one seen before.
            let key_bytes = expand_label(&r.next_secret, b"key");
            assert!(
                seen.insert(*key_bytes),
                "a key came back at epoch {}",
                r.epoch + 1
            );
            r = r.next();
            assert!(
                seen.insert(*r.next_secret),
                "a secret came back at epoch {}",
                r.epoch
            );
        }
    }

    #[test]
    fn an_ended_epochs_secret_is_zeroized() {
        let key0 = [0x42u8; KEY_LEN];
        let secret = ratchet_from_key(&key0);
        let mut slot =
            std::mem::ManuallyDrop::new(Ratchet::new(Cipher::Aes256Gcm, &key0, secret.clone()));
        let at: *const [u8; KEY_LEN] = &*slot.next_secret;
        // SAFETY: `at` points into `slot`, which stays allocated (ManuallyDrop keeps its storage
        // after its contents are dropped in place); a [u8; 32] has no invalid values.
        let before = unsafe { std::ptr::read_volatile(at) };
        assert_eq!(before, *secret);
        unsafe { std::ptr::drop_in_place(&mut *slot) };
        let after = unsafe { std::ptr::read_volatile(at) };
        assert_eq!(after, [0u8; KEY_LEN], "the secret survived its epoch");
    }
}
