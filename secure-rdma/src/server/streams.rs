//! Operation streams: what the server remembers of each client stream so that
//! a lost session neither loses nor duplicates an operation.
//!
//! A client numbers its operations in a stream it keeps across reconnects
//! ([`StreamId`]). The server keeps, per (identity, stream), the highest
//! sequence its application answered and the last answers themselves, while a
//! session serves the stream and for the resume window after. A reconnecting
//! client names its stream in its hello; [`Streams::claim`] first ends the
//! stream's previous session if it is still alive (and waits until that
//! session has drained its QP, so nothing of it can be delivered any more),
//! then answers with what the stream's state says ([`Resume`]).
//!
//! Memory is bounded: at most [`MAX_STREAMS_PER_IDENTITY`] per identity and
//! [`MAX_STREAMS`] in all (the oldest ended stream gives way), each holding
//! at most [`ACK_MEMORY`] answers: about 1.2 KiB per stream with its key.
//! State is keyed by the identity TLS authenticated, so no client can name,
//! resume or end another identity's stream.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};

use crate::datapath::{Ack, StreamId};
use crate::handshake::{AckRecord, Resume, StreamHello};

/// Answers kept per stream: more than a client can have unacknowledged at
/// once ([`RDMA_WINDOW`](super::admission::RDMA_WINDOW)), so a resume can
/// always give every answer the client missed.
pub const ACK_MEMORY: usize = 64;
/// Streams kept per identity; beyond it the identity's oldest ended stream is
/// forgotten (its client, if it ever comes back, hears "expired").
pub const MAX_STREAMS_PER_IDENTITY: usize = 64;
/// Streams kept in all.
pub const MAX_STREAMS: usize = 65_536;

type Key = (String, StreamId);

/// Every stream the server remembers.
pub(super) struct Streams {
    window: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    map: HashMap<Key, Entry>,
    per_identity: HashMap<String, usize>,
    /// Whose each remembered stream id is: another identity naming it is refused.
    owner: HashMap<StreamId, String>,
}

struct Entry {
    state: Arc<Mutex<StreamState>>,
    /// The session serving the stream now, if any.
    live: Option<Live>,
    /// When its last session ended (the resume window counts from here).
    ended: Option<Instant>,
    generation: u64,
}

/// What one stream has been answered.
#[derive(Debug, Default)]
struct StreamState {
    answered: u64,
    acks: VecDeque<Ack>,
}

/// The live session of a stream: how to end it, and how to know it ended.
struct Live {
    evict: Option<oneshot::Sender<()>>,
    done: watch::Receiver<bool>,
}

/// Why a claim could not be answered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimError {
    /// The stream's previous session did not end in time.
    #[error("the stream's previous session did not end within {0:?}")]
    PreviousSessionStuck(Duration),
    /// Another identity's stream: a client can only name streams it made.
    #[error("stream {0} belongs to another identity")]
    NotYours(String),
    /// A stream named as fresh that is served now or has something answered: the client
    /// must draw a new one (or resume this one).
    #[error("stream {0} is already in use: draw a new one")]
    InUse(String),
}

/// What a claim answers, before it is recorded.
struct Answer {
    state: Arc<Mutex<StreamState>>,
    resume: Resume,
    first: u64,
    flagged_through: u64,
    sent: u64,
}

/// A session's hold on its stream: where its operations start, how to record
/// what the application answered, and the signal that a newer session took
/// the stream over. Dropping it (after the session drained) lets that newer
/// session's claim go on.
pub(super) struct StreamLease {
    streams: Arc<Streams>,
    key: Key,
    generation: u64,
    state: Arc<Mutex<StreamState>>,
    evicted: oneshot::Receiver<()>,
    done: watch::Sender<bool>,
    /// The answer the client gets in its accept.
    pub(super) resume: Resume,
    /// The stream sequence of this session's first operation.
    pub(super) first: u64,
    /// Operations up to this sequence may have been delivered before (the
    /// server had lost the stream's state): their deliveries are flagged.
    pub(super) flagged_through: u64,
    /// What the client said it had sent: operations up to here that arrive in
    /// this session are replays.
    pub(super) sent: u64,
    /// Streams the claim made the server forget (window passed, or room).
    pub(super) forgotten: usize,
}

impl Streams {
    /// Streams remembered for `window` after their last session ends (0 keeps nothing).
    pub(super) fn new(window: Duration) -> Streams {
        Streams {
            window,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Streams currently remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().map.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes `identity`'s stream `id` as a fresh one, in one step: refused if it is in use
    /// (served now, or something of it answered), so two lanes naming one new stream cannot
    /// both start it. A stream claimed and let go with nothing answered (a lane refused after
    /// its claim) is not in use: its client may still open it fresh.
    pub(super) fn claim_fresh(
        self: &Arc<Self>,
        identity: &str,
        id: StreamId,
    ) -> Result<StreamLease, ClaimError> {
        let mut inner = self.lock();
        let now = Instant::now();
        let forgotten = inner.expire(self.window, now);
        if inner.owner.get(&id).is_some_and(|owner| owner != identity) {
            return Err(ClaimError::NotYours(id.short()));
        }
        let key: Key = (identity.to_owned(), id);
        if inner.map.get(&key).is_some_and(Entry::in_use) {
            return Err(ClaimError::InUse(id.short()));
        }
        let answer = Answer {
            state: Arc::new(Mutex::new(StreamState::default())),
            resume: Resume::New,
            first: 1,
            flagged_through: 0,
            sent: 0,
        };
        self.record(&mut inner, key, answer, forgotten, now)
    }

    /// Takes `hello`'s stream for a new session of `identity`: ends the stream's previous session
    /// (waiting at most `wait` for it to drain), then answers from what is known.
    pub(super) async fn claim(
        self: &Arc<Self>,
        identity: &str,
        hello: StreamHello,
        wait: Duration,
    ) -> Result<StreamLease, ClaimError> {
        let key: Key = (identity.to_owned(), hello.id);
        if self
            .lock()
            .owner
            .get(&hello.id)
            .is_some_and(|owner| owner != identity)
        {
            return Err(ClaimError::NotYours(hello.id.short()));
        }
        // End the previous session first, outside the lock: it records its last answers and
        // drains its QP before it lets go.
        let previous = {
            let mut inner = self.lock();
            inner.map.get_mut(&key).and_then(|e| e.live.take())
        };
        if let Some(mut live) = previous {
            if let Some(evict) = live.evict.take() {
                let _ = evict.send(());
            }
            let ended = async {
                while !*live.done.borrow_and_update() {
                    if live.done.changed().await.is_err() {
                        break;
                    }
                }
            };
            tokio::time::timeout(wait, ended)
                .await
                .map_err(|_| ClaimError::PreviousSessionStuck(wait))?;
        }
        let mut inner = self.lock();
        let now = Instant::now();
        let forgotten = inner.expire(self.window, now);
        let known = inner.map.get(&key).map(|e| Arc::clone(&e.state));
        let (resume, first, flagged_through, state) = match known {
            Some(state) => {
                let s = state.lock().unwrap_or_else(|p| p.into_inner());
                let missed: Vec<AckRecord> = s
                    .acks
                    .iter()
                    .filter(|a| a.seq >= hello.next && a.seq <= s.answered)
                    .map(|a| AckRecord::from(*a))
                    .collect();
                let want = s.answered.saturating_sub(hello.next.saturating_sub(1)) as usize;
                let answered = s.answered;
                drop(s);
                if missed.len() == want {
                    (
                        Resume::Resumed {
                            delivered: answered,
                            acks: missed,
                        },
                        answered + 1,
                        0,
                        state,
                    )
                } else {
                    // Answers the client missed are no longer kept (it cannot happen within the
                    // client's window, but the server never makes one up).
                    let state = Arc::new(Mutex::new(StreamState {
                        answered: hello.next - 1,
                        acks: VecDeque::new(),
                    }));
                    (Resume::Expired, hello.next, hello.sent, state)
                }
            }
            None if hello.next == 1 && hello.sent == 0 => (
                Resume::New,
                1,
                0,
                Arc::new(Mutex::new(StreamState::default())),
            ),
            None => {
                let state = Arc::new(Mutex::new(StreamState {
                    answered: hello.next - 1,
                    acks: VecDeque::new(),
                }));
                (Resume::Expired, hello.next, hello.sent, state)
            }
        };
        let answer = Answer {
            state,
            resume,
            first,
            flagged_through,
            sent: hello.sent,
        };
        self.record(&mut inner, key, answer, forgotten, now)
    }

    /// Records `answer`'s claim of `key` and makes its lease: the stream's new live session.
    fn record(
        self: &Arc<Self>,
        inner: &mut Inner,
        key: Key,
        answer: Answer,
        mut forgotten: usize,
        now: Instant,
    ) -> Result<StreamLease, ClaimError> {
        let (identity, id) = (key.0.as_str(), key.1);
        let (evict_tx, evicted) = oneshot::channel();
        let (done, done_rx) = watch::channel(false);
        if !inner.map.contains_key(&key) {
            forgotten += inner.make_room(identity, now);
            if let Some(owner) = inner.owner.get(&id) {
                // `claim` checked the owner before it let go of the lock to wait for the
                // stream's previous session, so another identity may have taken it since;
                // for `claim_fresh`, which never let go, this check finds nothing new.
                if owner != identity {
                    return Err(ClaimError::NotYours(id.short()));
                }
            }
            *inner.per_identity.entry(identity.to_owned()).or_insert(0) += 1;
            inner.owner.insert(id, identity.to_owned());
        }
        let entry = inner.map.entry(key.clone()).or_insert_with(|| Entry {
            state: Arc::clone(&answer.state),
            live: None,
            ended: None,
            generation: 0,
        });
        entry.state = Arc::clone(&answer.state);
        entry.generation += 1;
        entry.ended = None;
        entry.live = Some(Live {
            evict: Some(evict_tx),
            done: done_rx,
        });
        let generation = entry.generation;
        Ok(StreamLease {
            streams: Arc::clone(self),
            key,
            generation,
            state: answer.state,
            evicted,
            done,
            resume: answer.resume,
            first: answer.first,
            flagged_through: answer.flagged_through,
            sent: answer.sent,
            forgotten,
        })
    }
}

impl Entry {
    /// Served now, or something of it answered.
    fn in_use(&self) -> bool {
        self.live.is_some()
            || self
                .state
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .answered
                > 0
    }
}

impl Inner {
    /// Forgets the ended streams whose window has passed.
    fn expire(&mut self, window: Duration, now: Instant) -> usize {
        let gone: Vec<Key> = self
            .map
            .iter()
            .filter(|(_, e)| e.live.is_none() && e.ended.is_some_and(|t| now - t >= window))
            .map(|(k, _)| k.clone())
            .collect();
        let n = gone.len();
        for key in gone {
            self.forget(&key);
        }
        n
    }

    /// Makes room for one more stream of `identity`: forgets its oldest ended stream when it
    /// has the most it may keep, and the oldest ended stream of anyone when the server does.
    fn make_room(&mut self, identity: &str, now: Instant) -> usize {
        let oldest = |inner: &Inner, of: Option<&str>| -> Option<Key> {
            inner
                .map
                .iter()
                .filter(|(k, e)| e.live.is_none() && of.is_none_or(|id| k.0 == id))
                .max_by_key(|(_, e)| e.ended.map(|t| now - t))
                .map(|(k, _)| k.clone())
        };
        let mut n = 0;
        if self.per_identity.get(identity).copied().unwrap_or(0) >= MAX_STREAMS_PER_IDENTITY {
            if let Some(k) = oldest(self, Some(identity)) {
                self.forget(&k);
                n += 1;
            }
        }
        if self.map.len() >= MAX_STREAMS {
            if let Some(k) = oldest(self, None) {
                self.forget(&k);
                n += 1;
            }
        }
        n
    }

    fn forget(&mut self, key: &Key) {
        if self.map.remove(key).is_some() {
            self.owner.remove(&key.1);
            if let Some(n) = self.per_identity.get_mut(&key.0) {
                *n -= 1;
                if *n == 0 {
                    self.per_identity.remove(&key.0);
                }
            }
        }
    }
}

impl StreamLease {
    /// The stream.
    pub(super) fn id(&self) -> StreamId {
        self.key.1
    }

    /// Records what the application answered for an operation, before the
    /// client hears it: a resume from now on includes it.
    pub(super) fn answered(&self, ack: Ack) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.answered = s.answered.max(ack.seq);
        s.acks.push_back(ack);
        while s.acks.len() > ACK_MEMORY {
            s.acks.pop_front();
        }
    }

    /// Resolves when a newer session of the same identity claims this stream:
    /// this session must end (and drain) now. Cancel-safe.
    pub(super) async fn evicted(&mut self) {
        if (&mut self.evicted).await.is_err() {
            // The claim that would evict us can no longer come (the registry dropped the
            // sender because it forgot the stream): never resolve.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for StreamLease {
    fn drop(&mut self) {
        {
            let mut inner = self.streams.lock();
            let window = self.streams.window;
            if let Some(e) = inner.map.get_mut(&self.key) {
                if e.generation == self.generation {
                    e.live = None;
                    e.ended = Some(Instant::now());
                    if window.is_zero() {
                        inner.forget(&self.key);
                    }
                }
            }
        }
        // After the registry knows: the waiting claim reads the final state.
        let _ = self.done.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datapath::{AckStatus, Op};

    fn hello(id: StreamId, next: u64, sent: u64) -> StreamHello {
        StreamHello { id, next, sent }
    }

    fn answer(lease: &StreamLease, seq: u64) {
        lease.answered(Ack::delivered(Op::Send, seq, 1));
    }

    #[tokio::test]
    async fn a_fresh_stream_then_a_resume_answers_what_was_delivered() {
        let streams = Arc::new(Streams::new(Duration::from_secs(120)));
        let id = StreamId([1; 16]);
        let wait = Duration::from_secs(1);
        let lease = streams.claim("alice", hello(id, 1, 0), wait).await.unwrap();
        assert_eq!((lease.resume.clone(), lease.first), (Resume::New, 1));
        for seq in 1..=5 {
            answer(&lease, seq);
        }
        drop(lease);
        // The client saw acknowledgements up to 3 and had sent up to 6.
        let lease = streams.claim("alice", hello(id, 4, 6), wait).await.unwrap();
        let Resume::Resumed { delivered, acks } = &lease.resume else {
            panic!("{:?}", lease.resume)
        };
        assert_eq!(*delivered, 5);
        assert_eq!(acks.iter().map(|a| a.seq).collect::<Vec<_>>(), [4, 5]);
        assert!(acks.iter().all(|a| a.status == AckStatus::Delivered));
        assert_eq!((lease.first, lease.flagged_through), (6, 0));
    }

    #[tokio::test]
    async fn a_fresh_claim_is_refused_while_served_or_once_answered() {
        let streams = Arc::new(Streams::new(Duration::from_secs(120)));
        let (idle, used) = (StreamId([8; 16]), StreamId([9; 16]));
        let lease = streams.claim_fresh("alice", idle).unwrap();
        assert_eq!((lease.resume.clone(), lease.first), (Resume::New, 1));
        let again = streams.claim_fresh("alice", idle).map(|_| ()).unwrap_err();
        assert!(matches!(again, ClaimError::InUse(_)), "served now: {again}");
        drop(lease);
        let lease = streams
            .claim_fresh("alice", idle)
            .expect("let go with nothing answered: fresh again");
        drop(lease);
        let lease = streams.claim_fresh("alice", used).unwrap();
        answer(&lease, 1);
        drop(lease);
        let again = streams.claim_fresh("alice", used).map(|_| ()).unwrap_err();
        assert!(matches!(again, ClaimError::InUse(_)), "answered: {again}");
        let theirs = streams.claim_fresh("bob", used).map(|_| ()).unwrap_err();
        assert!(matches!(theirs, ClaimError::NotYours(_)), "{theirs}");
        // The refused claims changed nothing: the stream still resumes.
        let lease = streams
            .claim("alice", hello(used, 2, 1), Duration::from_secs(1))
            .await
            .unwrap();
        assert!(matches!(lease.resume, Resume::Resumed { delivered: 1, .. }));
    }

    #[tokio::test]
    async fn a_live_session_is_ended_before_the_answer() {
        let streams = Arc::new(Streams::new(Duration::from_secs(120)));
        let id = StreamId([2; 16]);
        let mut old = streams
            .claim("alice", hello(id, 1, 0), Duration::from_secs(1))
            .await
            .unwrap();
        answer(&old, 1);
        // The old session: on eviction it records one more answer, then lets go.
        let serving = tokio::spawn(async move {
            old.evicted().await;
            answer(&old, 2);
            drop(old);
        });
        let lease = streams
            .claim("alice", hello(id, 1, 2), Duration::from_secs(5))
            .await
            .unwrap();
        serving.await.unwrap();
        assert!(
            matches!(&lease.resume, Resume::Resumed { delivered: 2, acks } if acks.len() == 2),
            "{:?}",
            lease.resume
        );
    }

    #[tokio::test]
    async fn a_session_that_does_not_end_fails_the_claim() {
        let streams = Arc::new(Streams::new(Duration::from_secs(120)));
        let id = StreamId([3; 16]);
        let _stuck = streams
            .claim("alice", hello(id, 1, 0), Duration::from_secs(1))
            .await
            .unwrap();
        let e = streams
            .claim("alice", hello(id, 1, 1), Duration::from_millis(50))
            .await
            .err()
            .unwrap();
        assert!(e.to_string().contains("did not end"), "{e}");
    }

    #[tokio::test]
    async fn unknown_or_expired_state_is_answered_plainly_and_flags_the_replays() {
        let streams = Arc::new(Streams::new(Duration::ZERO));
        let id = StreamId([4; 16]);
        let wait = Duration::from_secs(1);
        // Unknown (a restarted server): the client had acks up to 9 and sent up to 12.
        let lease = streams
            .claim("alice", hello(id, 10, 12), wait)
            .await
            .unwrap();
        assert_eq!(lease.resume, Resume::Expired);
        assert_eq!(
            (lease.first, lease.flagged_through, lease.sent),
            (10, 12, 12)
        );
        answer(&lease, 10);
        drop(lease);
        // A window of 0 keeps nothing once the session ends.
        assert_eq!(streams.len(), 0);
        let lease = streams
            .claim("alice", hello(id, 11, 12), wait)
            .await
            .unwrap();
        assert_eq!(lease.resume, Resume::Expired);
    }

    #[tokio::test]
    async fn another_identity_naming_my_stream_is_refused() {
        let streams = Arc::new(Streams::new(Duration::from_secs(120)));
        let id = StreamId([5; 16]);
        let wait = Duration::from_secs(1);
        let mut mine = streams.claim("alice", hello(id, 1, 0), wait).await.unwrap();
        answer(&mine, 1);
        // Mallory names alice's stream: refused, alice's session goes on, nothing learned.
        let e = streams
            .claim("mallory", hello(id, 1, 1), wait)
            .await
            .err()
            .unwrap();
        assert_eq!(e.to_string(), "stream 05050505 belongs to another identity");
        assert_eq!(streams.len(), 1);
        let evicted = tokio::time::timeout(Duration::from_millis(50), mine.evicted()).await;
        assert!(
            evicted.is_err(),
            "alice's session was ended by another identity"
        );
        // Once alice's stream is forgotten (a window of 0), the id is nobody's.
        drop(mine);
        let forgetful = Arc::new(Streams::new(Duration::ZERO));
        drop(
            forgetful
                .claim("alice", hello(id, 1, 0), wait)
                .await
                .unwrap(),
        );
        assert!(forgetful
            .claim("mallory", hello(id, 1, 0), wait)
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn memory_is_bounded_per_identity_and_per_stream() {
        let streams = Arc::new(Streams::new(Duration::from_secs(120)));
        let wait = Duration::from_secs(1);
        for i in 0..(MAX_STREAMS_PER_IDENTITY + 10) {
            let mut b = [0u8; 16];
            b[..8].copy_from_slice(&(i as u64).to_be_bytes());
            let lease = streams
                .claim("alice", hello(StreamId(b), 1, 0), wait)
                .await
                .unwrap();
            for seq in 1..=(ACK_MEMORY as u64 + 20) {
                answer(&lease, seq);
            }
            assert!(lease.state.lock().unwrap().acks.len() <= ACK_MEMORY);
        }
        assert_eq!(streams.len(), MAX_STREAMS_PER_IDENTITY);
    }
}
