//! What the interceptor remembers of a rate refusal, and how long a caller
//! waits for its next token. Pure: the clock is passed in, so the timing is
//! tested without sleeping.
//!
//! Why it exists: without it, every call a rate limit refuses costs a round
//! trip to the collector and comes straight back, so a program that retries
//! a refused call spins, and the collector does the work of its spinning
//! (measured in issue 23: about 172,000 refusals in 100 s, each one served
//! by the collector). The collector's refusal of a rate now says when the
//! limit admits again ([`rdma_quota::wire::retry_after`]); until then the
//! interceptor answers that verb itself ([`RefusalCache`]), and with
//! `RDMA_INTERCEPT_ON_LIMIT=wait` the caller sleeps until then instead of
//! failing ([`next_step`]).

use std::ffi::OsStr;
use std::fmt;
use std::time::{Duration, Instant};

use rdma_quota::wire::RETRY_AFTER_MAX;
use rdma_quota::Verb;

/// What a call refused by a rate limit does: `RDMA_INTERCEPT_ON_LIMIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLimit {
    /// Fail at once with `errno = EDQUOT` (the default): what the
    /// interceptor always did, so programs that handle the refusal keep
    /// working, and no call blocks where it never blocked before.
    Fail,
    /// Sleep until the limit admits again (at most the maximum wait), then
    /// ask; a program that retries in a loop then runs at the limit's rate
    /// instead of spinning on refusals.
    Wait,
}

impl fmt::Display for OnLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OnLimit::Fail => "fail",
            OnLimit::Wait => "wait",
        })
    }
}

/// The longest a call waits in `wait` mode unless
/// `RDMA_INTERCEPT_MAX_WAIT_MS` says otherwise: two windows of a rate limit,
/// so a caller that loses one token to another process of its tenant gets
/// the next, while a stuck collector cannot stall a program for long.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(2);

/// The largest `RDMA_INTERCEPT_MAX_WAIT_MS` accepted; beyond a minute a
/// "wait" is a hang.
pub const MAX_WAIT_CEILING: Duration = Duration::from_secs(60);

/// Reads `RDMA_INTERCEPT_ON_LIMIT` (`fail` or `wait`; empty or unset is
/// `fail`). Anything else is `fail` with a problem to warn about.
///
/// ```
/// use rdma_intercept::limit::{on_limit, OnLimit};
///
/// assert_eq!(on_limit(None), (OnLimit::Fail, None));
/// assert_eq!(on_limit(Some("wait".as_ref())), (OnLimit::Wait, None));
/// let (mode, problem) = on_limit(Some("block".as_ref()));
/// assert_eq!(mode, OnLimit::Fail);
/// assert!(problem.unwrap().contains("neither \"fail\" nor \"wait\""));
/// ```
pub fn on_limit(value: Option<&OsStr>) -> (OnLimit, Option<String>) {
    match value.map(|v| v.to_string_lossy()) {
        None => (OnLimit::Fail, None),
        Some(v) if v.is_empty() || v == "fail" => (OnLimit::Fail, None),
        Some(v) if v == "wait" => (OnLimit::Wait, None),
        // Unknown means fail: the behaviour a program had before the setting.
        Some(v) => (
            OnLimit::Fail,
            Some(format!(
                "RDMA_INTERCEPT_ON_LIMIT={v:?} is neither \"fail\" nor \"wait\"; using fail"
            )),
        ),
    }
}

/// Reads `RDMA_INTERCEPT_MAX_WAIT_MS` (milliseconds, at most
/// [`MAX_WAIT_CEILING`]; empty or unset is [`DEFAULT_MAX_WAIT`]).
///
/// ```
/// use std::time::Duration;
/// use rdma_intercept::limit::{max_wait, DEFAULT_MAX_WAIT};
///
/// assert_eq!(max_wait(None), (DEFAULT_MAX_WAIT, None));
/// assert_eq!(max_wait(Some("250".as_ref())), (Duration::from_millis(250), None));
/// assert_eq!(max_wait(Some("0".as_ref())), (Duration::ZERO, None));
/// let (wait, problem) = max_wait(Some("2s".as_ref()));
/// assert_eq!(wait, DEFAULT_MAX_WAIT);
/// assert!(problem.is_some());
/// ```
pub fn max_wait(value: Option<&OsStr>) -> (Duration, Option<String>) {
    let Some(v) = value.map(|v| v.to_string_lossy()) else {
        return (DEFAULT_MAX_WAIT, None);
    };
    if v.is_empty() {
        return (DEFAULT_MAX_WAIT, None);
    }
    let parsed = v
        .bytes()
        .all(|b| b.is_ascii_digit())
        .then(|| v.parse::<u64>().ok())
        .flatten()
        .map(Duration::from_millis)
        .filter(|d| *d <= MAX_WAIT_CEILING);
    match parsed {
        Some(d) => (d, None),
        None => (
            DEFAULT_MAX_WAIT,
            Some(format!(
                "RDMA_INTERCEPT_MAX_WAIT_MS={v:?} is not a number of milliseconds up to {}; \
                 using {}",
                MAX_WAIT_CEILING.as_millis(),
                DEFAULT_MAX_WAIT.as_millis()
            )),
        ),
    }
}

/// The rate refusals the collector gave, per verb, until the time it said
/// the limit admits again. A call of a held verb is refused (or waits)
/// without asking.
///
/// Only rate refusals are held: a count or byte limit ends when something
/// is destroyed (possibly by another process), which no clock predicts, so
/// those are asked about every time.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, Instant};
/// use rdma_intercept::limit::RefusalCache;
/// use rdma_quota::Verb;
///
/// let mut cache = RefusalCache::new();
/// let t0 = Instant::now();
/// cache.remember(Verb::CqCreate, t0, Duration::from_millis(40));
/// assert_eq!(cache.held(Verb::CqCreate, t0 + Duration::from_millis(39)),
///            Some(t0 + Duration::from_millis(40)));
/// assert_eq!(cache.held(Verb::QpCreate, t0), None);
/// assert_eq!(cache.held(Verb::CqCreate, t0 + Duration::from_millis(40)), None);
/// ```
#[derive(Debug, Clone, Default)]
pub struct RefusalCache {
    /// At most one entry per verb (a handful of creating verbs).
    held: Vec<Held>,
}

/// One verb refused until a time.
#[derive(Debug, Clone)]
struct Held {
    verb: Verb,
    until: Instant,
    /// Announced by an admission ([`RefusalCache::hold`]) and not yet
    /// explained to the program by a refusal.
    unsaid: bool,
}

impl RefusalCache {
    /// Nothing held; usable in a `static`.
    pub const fn new() -> RefusalCache {
        RefusalCache { held: Vec::new() }
    }

    /// The collector refused `verb` at `now`, admitting again after
    /// `retry_after` (cut to [`RETRY_AFTER_MAX`], so a wrong answer cannot
    /// refuse a verb for longer than a rate window).
    pub fn remember(&mut self, verb: Verb, now: Instant, retry_after: Duration) {
        self.set(verb, now, retry_after, false);
    }

    /// The collector admitted `verb` at `now` and said its rate limit is
    /// full for `held` (protocol version 3): refused from here as after
    /// [`remember`](Self::remember), but the first such refusal has not been
    /// explained yet ([`first_refusal`](Self::first_refusal)).
    ///
    /// ```
    /// use std::time::{Duration, Instant};
    /// use rdma_intercept::limit::RefusalCache;
    /// use rdma_quota::Verb;
    ///
    /// let mut cache = RefusalCache::new();
    /// let t0 = Instant::now();
    /// cache.hold(Verb::QpCreate, t0, Duration::from_millis(50));
    /// assert!(cache.held(Verb::QpCreate, t0 + Duration::from_millis(1)).is_some());
    /// assert!(cache.first_refusal(Verb::QpCreate));
    /// assert!(!cache.first_refusal(Verb::QpCreate));
    /// ```
    pub fn hold(&mut self, verb: Verb, now: Instant, held: Duration) {
        self.set(verb, now, held, true);
    }

    fn set(&mut self, verb: Verb, now: Instant, wait: Duration, unsaid: bool) {
        let until = now + wait.min(RETRY_AFTER_MAX);
        match self.held.iter_mut().find(|h| h.verb == verb) {
            Some(entry) => {
                entry.until = until;
                entry.unsaid = unsaid;
            }
            None => self.held.push(Held {
                verb,
                until,
                unsaid,
            }),
        }
    }

    /// Whether this is the first refusal of `verb`'s hold from an admission
    /// (then the caller prints why, once); false for a collector's refusal,
    /// which printed its reason itself.
    pub fn first_refusal(&mut self, verb: Verb) -> bool {
        self.held
            .iter_mut()
            .find(|h| h.verb == verb)
            .is_some_and(|h| std::mem::replace(&mut h.unsaid, false))
    }

    /// Until when `verb` is refused, if it still is at `now`; an entry that
    /// has run out is forgotten.
    pub fn held(&mut self, verb: Verb, now: Instant) -> Option<Instant> {
        let index = self.held.iter().position(|h| h.verb == verb)?;
        let until = self.held[index].until;
        if now < until {
            Some(until)
        } else {
            self.held.swap_remove(index);
            None
        }
    }

    /// Verbs held at `now`.
    pub fn len(&self, now: Instant) -> usize {
        self.held.iter().filter(|h| now < h.until).count()
    }

    /// Whether nothing is held at `now`.
    pub fn is_empty(&self, now: Instant) -> bool {
        self.len(now) == 0
    }
}

/// What a call refused by a rate limit until `until` does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Sleep this long, then ask again.
    Sleep(Duration),
    /// Fail with `EDQUOT`: `fail` mode, or the token comes later than the
    /// maximum wait allows.
    GiveUp,
}

/// The wait logic of one call: it started at `started`, it is `now`, and
/// the limit admits again at `until`.
///
/// A call waits only if the whole wait (from its start, across several
/// refusals) stays within `max_wait`: one that would have to wait longer
/// fails at once rather than sleep only to fail.
///
/// ```
/// use std::time::{Duration, Instant};
/// use rdma_intercept::limit::{next_step, Next, OnLimit};
///
/// let t0 = Instant::now();
/// let ms = Duration::from_millis;
/// let max = ms(100);
/// assert_eq!(next_step(OnLimit::Wait, t0, t0 + ms(10), t0 + ms(50), max), Next::Sleep(ms(40)));
/// assert_eq!(next_step(OnLimit::Wait, t0, t0 + ms(10), t0 + ms(101), max), Next::GiveUp);
/// assert_eq!(next_step(OnLimit::Fail, t0, t0, t0 + ms(1), max), Next::GiveUp);
/// ```
pub fn next_step(
    mode: OnLimit,
    started: Instant,
    now: Instant,
    until: Instant,
    max_wait: Duration,
) -> Next {
    match mode {
        OnLimit::Fail => Next::GiveUp,
        OnLimit::Wait if until > started + max_wait => Next::GiveUp,
        OnLimit::Wait => Next::Sleep(until.saturating_duration_since(now)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_held_verb_runs_out_exactly_at_its_time_and_others_are_not_held() {
        let t0 = Instant::now();
        let mut cache = RefusalCache::new();
        assert!(cache.is_empty(t0));
        cache.remember(Verb::CqCreate, t0, ms(50));
        cache.remember(Verb::MrReg, t0, ms(10));
        assert_eq!(cache.len(t0), 2);
        assert_eq!(cache.held(Verb::QpCreate, t0), None);
        assert_eq!(cache.held(Verb::MrReg, t0 + ms(9)), Some(t0 + ms(10)));
        assert_eq!(cache.held(Verb::MrReg, t0 + ms(10)), None);
        assert_eq!(cache.held(Verb::CqCreate, t0 + ms(49)), Some(t0 + ms(50)));
        assert_eq!(cache.len(t0 + ms(49)), 1);
        // A newer refusal replaces the older time, it does not add a second entry.
        cache.remember(Verb::CqCreate, t0 + ms(60), ms(5));
        assert_eq!(cache.held(Verb::CqCreate, t0 + ms(61)), Some(t0 + ms(65)));
        assert_eq!(cache.held.len(), 1);
        assert_eq!(cache.held(Verb::CqCreate, t0 + ms(65)), None);
        assert!(cache.held.is_empty());
    }

    #[test]
    fn a_retry_time_beyond_a_rate_window_is_not_believed() {
        let t0 = Instant::now();
        let mut cache = RefusalCache::new();
        cache.remember(Verb::QpCreate, t0, Duration::from_secs(3600));
        assert_eq!(cache.held(Verb::QpCreate, t0), Some(t0 + RETRY_AFTER_MAX));
        assert_eq!(cache.held(Verb::QpCreate, t0 + RETRY_AFTER_MAX), None);
    }

    #[test]
    fn waits_are_bounded_from_the_call_start_not_per_refusal() {
        let t0 = Instant::now();
        let max = ms(1000);
        // First refusal: next token in 400 ms.
        assert_eq!(
            next_step(OnLimit::Wait, t0, t0, t0 + ms(400), max),
            Next::Sleep(ms(400))
        );
        // Woke at 405 ms and lost the token to another process: the next
        // one is at 900 ms, still within a second of the start.
        assert_eq!(
            next_step(OnLimit::Wait, t0, t0 + ms(405), t0 + ms(900), max),
            Next::Sleep(ms(495))
        );
        // Lost again: the next token (1.3 s) is past the bound.
        assert_eq!(
            next_step(OnLimit::Wait, t0, t0 + ms(905), t0 + ms(1300), max),
            Next::GiveUp
        );
        // Exactly at the bound still waits.
        assert_eq!(
            next_step(OnLimit::Wait, t0, t0 + ms(905), t0 + ms(1000), max),
            Next::Sleep(ms(95))
        );
        // A time already past means: ask now.
        assert_eq!(
            next_step(OnLimit::Wait, t0, t0 + ms(20), t0 + ms(10), max),
            Next::Sleep(Duration::ZERO)
        );
        // No wait allowed at all: wait mode behaves like fail.
        assert_eq!(
            next_step(OnLimit::Wait, t0, t0, t0 + ms(1), Duration::ZERO),
            Next::GiveUp
        );
        assert_eq!(next_step(OnLimit::Fail, t0, t0, t0, max), Next::GiveUp);
    }

    #[test]
    fn settings_parse_and_name_their_problems() {
        assert_eq!(on_limit(Some("".as_ref())), (OnLimit::Fail, None));
        assert_eq!(on_limit(Some("fail".as_ref())), (OnLimit::Fail, None));
        assert_eq!(
            on_limit(Some("Wait".as_ref())).1.as_deref(),
            Some("RDMA_INTERCEPT_ON_LIMIT=\"Wait\" is neither \"fail\" nor \"wait\"; using fail")
        );
        assert_eq!(max_wait(Some("60000".as_ref())), (MAX_WAIT_CEILING, None));
        for bad in ["60001", "-1", "+5", "1.5", "99999999999999999999999"] {
            let (wait, problem) = max_wait(Some(bad.as_ref()));
            assert_eq!(wait, DEFAULT_MAX_WAIT, "{bad}");
            assert_eq!(
                problem.as_deref(),
                Some(
                    format!(
                        "RDMA_INTERCEPT_MAX_WAIT_MS={bad:?} is not a number of milliseconds \
                         up to 60000; using 2000"
                    )
                    .as_str()
                ),
                "{bad}"
            );
        }
    }
}
