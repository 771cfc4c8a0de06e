//! What the hooks decide, without the hooks: admission, the object → ticket
//! table, fork and connection loss. Plain data, so it is tested against fake
//! collectors without RDMA.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rdma_quota::wire::{Reply, Request, DEFAULT_SOCKET};
use rdma_quota::{Resource, Verb};

use crate::client::{ClientError, Connection};
use crate::limit::{self, OnLimit, RefusalCache};

/// How long one connect, send or receive may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// How long a destroyed object's `RELEASE` may wait to be sent with the
/// process's next request ([`Interceptor::release`]). Long enough for a
/// program that is held to a rate limit (its next admission comes within one
/// token's interval, 50 ms at 20/s, 100 ms each when two share it), short
/// enough that a count limit is not held by a destroyed object for long.
pub const RELEASE_DELAY: Duration = Duration::from_millis(250);

/// The most `RELEASE`s that wait; the one after them sends them all.
pub const RELEASE_BATCH: usize = 64;

/// errno of a call refused by a quota: `EDQUOT` ("quota exceeded"), whether
/// the collector refused it or the interceptor did on its behalf (a rate
/// refusal it remembers, or a wait in `RDMA_INTERCEPT_ON_LIMIT=wait` mode
/// that would exceed `RDMA_INTERCEPT_MAX_WAIT_MS`).
pub const ERRNO_DENIED: i32 = libc::EDQUOT;

/// errno of a call refused because the collector could not decide
/// (`RDMA_INTERCEPT_FAIL=closed`): not a quota, so not `EDQUOT`.
pub const ERRNO_NO_COLLECTOR: i32 = libc::EACCES;

/// What to do when the collector cannot be asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// Refuse every creation (the default): quotas are a security control.
    Closed,
    /// Allow creations uncounted, with a one-time warning.
    Open,
}

impl fmt::Display for FailMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FailMode::Closed => "closed",
            FailMode::Open => "open",
        })
    }
}

/// The interceptor's configuration, from the environment of the program.
///
/// # Examples
///
/// ```
/// use rdma_intercept::intercept::{FailMode, Settings};
///
/// let s = Settings::from_vars(None, Some("open".as_ref()));
/// assert_eq!(s.collector.to_str(), Some("/run/rdma-monitor/collector.sock"));
/// assert_eq!(s.fail, FailMode::Open);
/// assert!(s.problem.is_none());
///
/// let s = Settings::from_vars(Some("/tmp/c.sock".as_ref()), Some("maybe".as_ref()));
/// assert_eq!(s.fail, FailMode::Closed);
/// assert!(s.problem.is_some());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `RDMA_COLLECTOR`: the collector's socket.
    pub collector: PathBuf,
    /// `RDMA_INTERCEPT_FAIL`: `closed` (default) or `open`.
    pub fail: FailMode,
    /// A setting that was not understood, to warn about once.
    pub problem: Option<String>,
    /// `RDMA_INTERCEPT_ON_LIMIT`: `fail` (default) or `wait`.
    pub on_limit: OnLimit,
    /// `RDMA_INTERCEPT_MAX_WAIT_MS`: the longest one call waits in `wait`
    /// mode ([`limit::DEFAULT_MAX_WAIT`] by default).
    pub max_wait: Duration,
    /// A rate-limit setting that was not understood, to warn about once.
    pub limit_problem: Option<String>,
}

impl Settings {
    /// Reads `RDMA_COLLECTOR`, `RDMA_INTERCEPT_FAIL`,
    /// `RDMA_INTERCEPT_ON_LIMIT` and `RDMA_INTERCEPT_MAX_WAIT_MS`.
    pub fn from_env() -> Settings {
        Settings::from_vars(
            std::env::var_os("RDMA_COLLECTOR").as_deref(),
            std::env::var_os("RDMA_INTERCEPT_FAIL").as_deref(),
        )
        .with_limit_vars(
            std::env::var_os("RDMA_INTERCEPT_ON_LIMIT").as_deref(),
            std::env::var_os("RDMA_INTERCEPT_MAX_WAIT_MS").as_deref(),
        )
    }

    /// These settings with the rate-limit behaviour from the values of
    /// `RDMA_INTERCEPT_ON_LIMIT` and `RDMA_INTERCEPT_MAX_WAIT_MS`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use rdma_intercept::intercept::Settings;
    /// use rdma_intercept::limit::OnLimit;
    ///
    /// let s = Settings::from_vars(None, None).with_limit_vars(Some("wait".as_ref()), Some("500".as_ref()));
    /// assert_eq!((s.on_limit, s.max_wait), (OnLimit::Wait, Duration::from_millis(500)));
    /// ```
    pub fn with_limit_vars(
        mut self,
        on_limit: Option<&OsStr>,
        max_wait: Option<&OsStr>,
    ) -> Settings {
        let (mode, mode_problem) = limit::on_limit(on_limit);
        let (wait, wait_problem) = limit::max_wait(max_wait);
        self.on_limit = mode;
        self.max_wait = wait;
        self.limit_problem = match (mode_problem, wait_problem) {
            (Some(a), Some(b)) => Some(format!("{a}; {b}")),
            (a, b) => a.or(b),
        };
        self
    }

    /// Settings from the two variables' values; empty means unset.
    pub fn from_vars(collector: Option<&OsStr>, fail: Option<&OsStr>) -> Settings {
        let collector = match collector {
            Some(path) if !path.is_empty() => PathBuf::from(path),
            _ => PathBuf::from(DEFAULT_SOCKET),
        };
        let (fail, problem) = match fail.map(|v| v.to_string_lossy()) {
            None => (FailMode::Closed, None),
            Some(v) if v.is_empty() || v == "closed" => (FailMode::Closed, None),
            Some(v) if v == "open" => (FailMode::Open, None),
            // Unknown means closed: a typo must not switch enforcement off.
            Some(v) => (
                FailMode::Closed,
                Some(format!(
                    "RDMA_INTERCEPT_FAIL={v:?} is neither \"closed\" nor \"open\"; using closed"
                )),
            ),
        };
        Settings {
            collector,
            fail,
            problem,
            on_limit: OnLimit::Fail,
            max_wait: limit::DEFAULT_MAX_WAIT,
            limit_problem: None,
        }
    }
}

/// What a hook does with a creating call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Call the real function. With a ticket, hand the result to
    /// [`Interceptor::created`] (or [`Interceptor::failed`] if it failed).
    Proceed(Option<Ticket>),
    /// Fail the call with this errno, without calling the real function.
    Refuse(i32),
    /// `RDMA_INTERCEPT_ON_LIMIT=wait`: a rate limit admits again at this
    /// time; see [`limit::next_step`] whether to sleep until then (with the
    /// state unlocked) and ask again, or to fail with [`ERRNO_DENIED`].
    Wait(Instant),
}

/// An admission: the collector's ticket, on the connection it belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// Which connection issued it (tickets die with their connection).
    generation: u64,
    /// The collector's ticket number.
    id: u64,
}

/// The state of the interceptor in one process.
///
/// Every method takes the caller's pid: after `fork` the child inherits this
/// state, including the parent's connection, and must neither talk on it
/// nor release the parent's tickets.
///
/// # Examples
///
/// ```no_run
/// use rdma_intercept::intercept::{Decision, Interceptor, Settings};
/// use rdma_quota::Resource;
///
/// let mut state = Interceptor::new();
/// let settings = Settings::from_env();
/// let pid = std::process::id();
/// let mut log = Vec::new();
/// match state.admit(pid, &settings, Resource::Qp, 0, &mut log) {
///     Decision::Proceed(Some(ticket)) => {
///         let qp = 0x1000; // what the real ibv_create_qp returned
///         state.created(pid, qp, ticket);
///         // ... later, around the real ibv_destroy_qp:
///         let taken = state.take(pid, qp);
///         state.release(pid, taken);
///     }
///     Decision::Proceed(None) => { /* fail-open: uncounted */ }
///     Decision::Refuse(errno) => eprintln!("{} (errno {errno})", log.join("\n")),
///     // RDMA_INTERCEPT_ON_LIMIT=wait: sleep until then, unlocked, and ask again.
///     Decision::Wait(_until) => {}
/// }
/// ```
#[derive(Debug)]
pub struct Interceptor {
    /// The process this state belongs to; 0 before first use.
    pid: u32,
    conn: Option<Connection>,
    /// The collector on `conn` answered our `HELLO` with protocol version 3:
    /// its admissions say how long their rate limit stays full.
    holds: bool,
    /// Bumped whenever `conn` is opened or dropped.
    generation: u64,
    /// Live objects (their addresses) and their tickets.
    objects: BTreeMap<usize, Ticket>,
    warned_open: bool,
    warned_setting: bool,
    warned_no_retry: bool,
    /// Rate refusals, answered here until they run out.
    refusals: RefusalCache,
    /// Tickets of destroyed objects whose `RELEASE` waits for the next
    /// request (or [`RELEASE_DELAY`]); all of the current connection.
    deferred: Vec<u64>,
    /// When the oldest of `deferred` was destroyed.
    deferred_since: Option<Instant>,
    /// Writes that carried only `RELEASE`s (the delay ran out, or the batch
    /// was full).
    release_writes: u64,
    /// `ADMIT` requests sent to the collector.
    asked: u64,
    /// Calls refused (or sent to wait) from [`refusals`](Self::refusals)
    /// without asking.
    answered_locally: u64,
}

impl Default for Interceptor {
    fn default() -> Self {
        Interceptor::new()
    }
}

impl Interceptor {
    /// No connection and nothing tracked; usable in a `static`.
    pub const fn new() -> Interceptor {
        Interceptor {
            pid: 0,
            conn: None,
            holds: false,
            generation: 0,
            objects: BTreeMap::new(),
            warned_open: false,
            warned_setting: false,
            warned_no_retry: false,
            refusals: RefusalCache::new(),
            deferred: Vec::new(),
            deferred_since: None,
            release_writes: 0,
            asked: 0,
            answered_locally: 0,
        }
    }

    /// `ADMIT` requests sent to the collector so far.
    pub fn asked(&self) -> u64 {
        self.asked
    }

    /// Calls refused, or sent to wait, by a remembered rate refusal without
    /// asking the collector.
    pub fn answered_locally(&self) -> u64 {
        self.answered_locally
    }

    /// Writes to the collector that carried only `RELEASE`s: the others
    /// rode along with an `ADMIT`.
    pub fn release_writes(&self) -> u64 {
        self.release_writes
    }

    /// `RELEASE`s waiting to be sent.
    pub fn releases_waiting(&self) -> usize {
        self.deferred.len()
    }

    /// When the waiting `RELEASE`s are due to be sent by
    /// [`flush_releases`](Self::flush_releases), if any wait.
    pub fn releases_due(&self) -> Option<Instant> {
        self.deferred_since.map(|since| since + RELEASE_DELAY)
    }

    /// Sends the waiting `RELEASE`s if they have waited [`RELEASE_DELAY`] at
    /// `now` (the hooks' flusher thread calls this); returns when the next
    /// ones are due, if any still wait.
    pub fn flush_releases(&mut self, pid: u32, now: Instant) -> Option<Instant> {
        self.adopt(pid);
        if self.releases_due().is_some_and(|due| due <= now) {
            self.send_releases();
        }
        self.releases_due()
    }

    /// Objects created with a ticket and not destroyed yet.
    pub fn tracked(&self) -> usize {
        self.objects.len()
    }

    /// Whether a collector connection is open.
    pub fn connected(&self) -> bool {
        self.conn.is_some()
    }

    /// Asks the collector whether one `resource` (of `bytes`, for a memory
    /// region; otherwise 0) may be created. Lines for stderr are pushed to
    /// `log`.
    ///
    /// Only creations are asked about: a resource's creating verb is the
    /// one `ADMIT` the collector answers with a ticket.
    pub fn admit(
        &mut self,
        pid: u32,
        settings: &Settings,
        resource: Resource,
        bytes: u64,
        log: &mut Vec<String>,
    ) -> Decision {
        self.admit_at(pid, settings, resource, bytes, Instant::now(), log)
    }

    /// [`admit`](Self::admit) at `now`.
    ///
    /// A verb a rate limit refused is answered here, without asking, until
    /// the time the collector said it admits again: refused with
    /// [`ERRNO_DENIED`] (`fail` mode) or [`Decision::Wait`] (`wait` mode).
    /// Only the collector's refusal prints a line; the local repeats are
    /// silent, or a flooding program would flood its stderr instead.
    pub fn admit_at(
        &mut self,
        pid: u32,
        settings: &Settings,
        resource: Resource,
        bytes: u64,
        now: Instant,
        log: &mut Vec<String>,
    ) -> Decision {
        let verb = resource.create_verb();
        self.adopt(pid);
        let problems = [&settings.problem, &settings.limit_problem];
        if problems.iter().any(|p| p.is_some())
            && !std::mem::replace(&mut self.warned_setting, true)
        {
            for problem in problems.into_iter().flatten() {
                log.push(format!("rdma-intercept: {problem}"));
            }
        }
        if let Some(until) = self.refusals.held(verb, now) {
            self.answered_locally += 1;
            // A hold an admission announced (version 3) has printed
            // nothing yet: its first refusal says why, as a DENY would have.
            if settings.on_limit == OnLimit::Fail && self.refusals.first_refusal(verb) {
                log.push(format!(
                    "rdma-intercept: {verb} refused: its rate limit is full (the collector said \
                     so when it admitted the last one); refusing {verb} here for the next {} ms \
                     without asking the collector",
                    until.saturating_duration_since(now).as_millis().max(1)
                ));
            }
            return match settings.on_limit {
                OnLimit::Fail => Decision::Refuse(ERRNO_DENIED),
                OnLimit::Wait => Decision::Wait(until),
            };
        }
        self.asked += 1;
        let request = Request::Admit { verb, bytes };
        let reused = self.conn.is_some();
        // The releases waiting ride along (they are all of this connection:
        // losing it clears them, the collector having released them itself).
        let releases = self.take_deferred();
        let mut reply = match self.connection(settings) {
            Ok(conn) => conn.request_after(&releases, &request),
            Err(e) => return self.cannot_ask(settings, verb, &Problem::Unreachable(e), log),
        };
        // The collector closes a connection that holds no tickets when it is
        // idle or when room is needed for another program; with no tickets
        // nothing was lost, so ask once more on a new connection.
        if reused && self.objects.is_empty() && reply.as_ref().is_err_and(ClientError::hung_up) {
            self.lose_connection(log);
            reply = match self.connection(settings) {
                Ok(conn) => conn.request(&request),
                Err(e) => return self.cannot_ask(settings, verb, &Problem::Unreachable(e), log),
            };
        }
        match reply {
            Ok(Reply::Ticket(id)) => Decision::Proceed(Some(Ticket {
                generation: self.generation,
                id,
            })),
            // Version 3: admitted, and the next calls until then would be
            // refused; answer them here instead of asking to hear it.
            Ok(Reply::Held { ticket, held }) => {
                // Counted from the reply's arrival, not from `now` (before the
                // request): the collector measured `held` in between, and a hold
                // that ended early would ask only to be refused.
                self.refusals.hold(verb, now.max(Instant::now()), held);
                Decision::Proceed(Some(Ticket {
                    generation: self.generation,
                    id: ticket,
                }))
            }
            Ok(Reply::Deny(reason)) => self.denied(settings, verb, &reason, now, log),
            Ok(Reply::Err(message)) => {
                self.lose_connection(log);
                self.cannot_ask(settings, verb, &Problem::Answered(message), log)
            }
            // A creation always gets a ticket; a plain OK means the two
            // sides disagree about what was asked.
            Ok(Reply::Ok) => self.no_ticket(settings, verb, "", log),
            Ok(Reply::OkWith(payload)) => self.no_ticket(settings, verb, &payload, log),
            Err(e) => {
                self.lose_connection(log);
                self.cannot_ask(settings, verb, &Problem::Failed(e), log)
            }
        }
    }

    /// The collector refused: remember a rate refusal's retry time, then
    /// fail or wait.
    fn denied(
        &mut self,
        settings: &Settings,
        verb: Verb,
        reason: &str,
        now: Instant,
        log: &mut Vec<String>,
    ) -> Decision {
        let (text, retry_after) = rdma_quota::wire::retry_after(reason);
        match (retry_after, settings.on_limit) {
            (Some(wait), OnLimit::Fail) => {
                self.refusals.remember(verb, now, wait);
                log.push(format!(
                    "rdma-intercept: {verb} refused: {text}; refusing {verb} here for the next \
                     {} ms without asking the collector",
                    wait.as_millis()
                ));
                Decision::Refuse(ERRNO_DENIED)
            }
            // Waiting is quiet: the caller gets its object, only later.
            (Some(wait), OnLimit::Wait) => {
                self.refusals.remember(verb, now, wait);
                Decision::Wait(now + wait.min(rdma_quota::wire::RETRY_AFTER_MAX))
            }
            (None, mode) => {
                if mode == OnLimit::Wait && !std::mem::replace(&mut self.warned_no_retry, true) {
                    log.push(
                        "rdma-intercept: the collector's refusal says no time to retry at \
                         (a count or byte limit, which waits on a destruction, or a collector \
                         older than protocol version 2); refusing instead of waiting \
                         (RDMA_INTERCEPT_ON_LIMIT=wait); this note is printed once"
                            .to_owned(),
                    );
                }
                log.push(format!("rdma-intercept: {verb} refused: {text}"));
                Decision::Refuse(ERRNO_DENIED)
            }
        }
    }

    /// The open connection, or a new one.
    ///
    /// A new one starts with `HELLO <comm>; protocol=3`: a collector that
    /// speaks version 3 answers `OK protocol=3` and then says, with each
    /// admission that fills a rate limit, how long it stays full; an older
    /// one answers `OK` and the connection speaks version 2.
    fn connection(&mut self, settings: &Settings) -> Result<&mut Connection, ClientError> {
        if self.conn.is_none() {
            let mut conn = Connection::connect(&settings.collector, TIMEOUT)?;
            let hello = Request::Hello {
                comm: own_comm(),
                protocol: Some(rdma_quota::wire::VERSION),
            };
            self.holds = conn
                .request(&hello)?
                .hello_version()
                .is_some_and(|n| n >= 3);
            self.generation += 1;
            self.conn = Some(conn);
        }
        self.conn.as_mut().ok_or(ClientError::Closed)
    }

    /// Whether the open connection's collector says how long an admission
    /// leaves its rate limit full (protocol version 3).
    pub fn collector_holds(&self) -> bool {
        self.conn.is_some() && self.holds
    }

    fn no_ticket(
        &mut self,
        settings: &Settings,
        verb: Verb,
        payload: &str,
        log: &mut Vec<String>,
    ) -> Decision {
        self.lose_connection(log);
        let problem = Problem::Answered(format!("OK without a ticket ({payload:?})"));
        self.cannot_ask(settings, verb, &problem, log)
    }

    /// The real call admitted by `ticket` made `object`.
    pub fn created(&mut self, pid: u32, object: usize, ticket: Ticket) {
        self.adopt(pid);
        if !self.valid(ticket) {
            // The connection was lost meanwhile: the collector already
            // released the ticket.
            return;
        }
        if let Some(stale) = self.objects.insert(object, ticket) {
            // The address was never seen destroyed (a destroy outside the
            // hooks); its old count is gone with the object.
            self.defer_release(stale, Instant::now());
        }
    }

    /// The real call admitted by `ticket` failed: nothing was created.
    pub fn failed(&mut self, pid: u32, ticket: Ticket) {
        self.adopt(pid);
        self.defer_release(ticket, Instant::now());
    }

    /// Removes `object` from the table before the real destroy runs, so
    /// that its address cannot be reused by another thread's creation while
    /// it is still registered. Hand the result to [`release`](Self::release)
    /// if the destroy succeeded, to [`restore`](Self::restore) if not.
    pub fn take(&mut self, pid: u32, object: usize) -> Option<(usize, Ticket)> {
        self.adopt(pid);
        self.objects.remove(&object).map(|t| (object, t))
    }

    /// The object was destroyed: its ticket goes back to the collector,
    /// with the process's next request or after [`RELEASE_DELAY`], whichever
    /// comes first.
    ///
    /// Why not at once: a request costs the collector about what waking it
    /// costs (measured: most of its time is the scheduler's), and a program
    /// that creates and destroys in a loop would otherwise wake it twice per
    /// object. Sent with the next `ADMIT`, in the same write, the `RELEASE`
    /// costs it nothing more. Until then the object still counts against a
    /// count limit, for at most [`RELEASE_DELAY`] (the hooks run a thread that
    /// sends what waited that long).
    pub fn release(&mut self, pid: u32, taken: Option<(usize, Ticket)>) {
        self.release_at(pid, taken, Instant::now());
    }

    /// [`release`](Self::release) at `now`.
    pub fn release_at(&mut self, pid: u32, taken: Option<(usize, Ticket)>, now: Instant) {
        self.adopt(pid);
        if let Some((_, ticket)) = taken {
            self.defer_release(ticket, now);
        }
    }

    /// The destroy failed: the object lives on, and so does its ticket.
    pub fn restore(&mut self, pid: u32, taken: Option<(usize, Ticket)>) {
        self.adopt(pid);
        if let Some((object, ticket)) = taken {
            if self.valid(ticket) {
                self.objects.insert(object, ticket);
            }
        }
    }

    fn valid(&self, ticket: Ticket) -> bool {
        self.conn.is_some() && ticket.generation == self.generation
    }

    fn defer_release(&mut self, ticket: Ticket, now: Instant) {
        if !self.valid(ticket) {
            return;
        }
        self.deferred.push(ticket.id);
        self.deferred_since.get_or_insert(now);
        if self.deferred.len() >= RELEASE_BATCH {
            self.send_releases();
        }
    }

    fn take_deferred(&mut self) -> Vec<u64> {
        self.deferred_since = None;
        std::mem::take(&mut self.deferred)
    }

    /// Sends the waiting `RELEASE`s on their own.
    fn send_releases(&mut self) {
        let releases = self.take_deferred();
        let (Some((last, before)), Some(conn)) = (releases.split_last(), &mut self.conn) else {
            return;
        };
        self.release_writes += 1;
        match conn.request_after(before, &Request::Release { ticket: *last }) {
            // ERR here only says the collector did not know the ticket.
            Ok(Reply::Ok | Reply::OkWith(_) | Reply::Err(_)) => {}
            // Destroys are never refused, and a broken connection makes the
            // collector release everything anyway: nothing to report.
            _ => self.lose_connection(&mut Vec::new()),
        }
    }

    /// Drops the connection: the collector releases all its tickets when it
    /// sees the close, so the objects created so far are no longer counted.
    fn lose_connection(&mut self, log: &mut Vec<String>) {
        if self.conn.take().is_some() {
            self.generation += 1;
            // The collector releases every ticket of a closed connection.
            self.take_deferred();
            let n = self.objects.len();
            self.objects.clear();
            if n > 0 {
                log.push(format!(
                    "rdma-intercept: lost the collector connection; the {n} RDMA resources \
                     created so far are no longer counted"
                ));
            }
        }
    }

    /// After `fork`, the child starts over: the inherited connection and
    /// tickets are the parent's.
    fn adopt(&mut self, pid: u32) {
        if self.pid == pid {
            return;
        }
        if self.pid != 0 {
            // Closing our copy of the descriptor leaves the parent's open;
            // the releases waiting are the parent's to send.
            self.conn = None;
            self.objects.clear();
            self.take_deferred();
            self.generation += 1;
        }
        self.pid = pid;
    }

    fn cannot_ask(
        &mut self,
        settings: &Settings,
        verb: Verb,
        problem: &Problem,
        log: &mut Vec<String>,
    ) -> Decision {
        let path = settings.collector.display();
        match settings.fail {
            FailMode::Closed => {
                log.push(format!(
                    "rdma-intercept: collector at {path} {problem}; refusing {verb} \
                     (RDMA_INTERCEPT_FAIL=closed)"
                ));
                Decision::Refuse(ERRNO_NO_COLLECTOR)
            }
            FailMode::Open => {
                if !std::mem::replace(&mut self.warned_open, true) {
                    log.push(format!(
                        "rdma-intercept: collector at {path} {problem}; allowing RDMA resources \
                         without quota checks (RDMA_INTERCEPT_FAIL=open); this warning is \
                         printed once"
                    ));
                }
                Decision::Proceed(None)
            }
        }
    }
}

/// Why the collector could not decide.
enum Problem {
    Unreachable(ClientError),
    Failed(ClientError),
    Answered(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Unreachable(e) => write!(f, "unreachable: {e}"),
            Problem::Failed(e) => write!(f, "failed: {e}"),
            Problem::Answered(m) => write!(f, "answered an error: {m}"),
        }
    }
}

/// This thread's name (`/proc/self/comm`, at most 15 bytes), for the
/// collector's `HELLO`; the collector trusts only what the kernel says about
/// the peer, so a name that cannot be read is just `?`.
fn own_comm() -> String {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes, NUL included, into `name`.
    let rc = unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr()) };
    if rc != 0 {
        return "?".to_owned();
    }
    let len = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    String::from_utf8_lossy(&name[..len]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;

    /// A scripted collector: answers each line with `respond(line)` and
    /// reports every line it saw, and every closed connection as "<close>".
    /// A `HELLO` is not reported, and answered `OK` (a version 2 collector)
    /// unless `respond` answers it with an `OK` of its own.
    fn collector(
        respond: fn(&str) -> String,
    ) -> (tempfile::TempDir, Settings, mpsc::Receiver<String>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("collector.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let tx = tx.clone();
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                    let mut writer = stream;
                    loop {
                        let mut line = String::new();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => break,
                            Ok(_) => {}
                        }
                        let line = line.trim_end();
                        let mut reply = respond(line);
                        if line.starts_with("HELLO ") {
                            if !reply.starts_with("OK") {
                                reply = "OK\n".into();
                            }
                        } else {
                            let _ = tx.send(line.to_owned());
                        }
                        if reply.is_empty() || writer.write_all(reply.as_bytes()).is_err() {
                            break;
                        }
                    }
                    let _ = tx.send("<close>".to_owned());
                });
            }
        });
        let settings = Settings::from_vars(Some(path.as_os_str()), None);
        (dir, settings, rx)
    }

    fn ticket_for_qp_deny_mr(line: &str) -> String {
        match line {
            "ADMIT QP_CREATE" => "OK 7\n".into(),
            l if l.starts_with("ADMIT MR_REG") => {
                "DENY MR_BYTES limit 1 would be exceeded\n".into()
            }
            l if l.starts_with("RELEASE") => "OK\n".into(),
            _ => "ERR unexpected\n".into(),
        }
    }

    fn recv(rx: &mpsc::Receiver<String>) -> String {
        rx.recv_timeout(Duration::from_secs(5))
            .expect("collector saw a line")
    }

    #[test]
    fn a_connection_the_collector_closed_while_idle_is_replaced() {
        // A collector that answers one request per connection, then hangs up,
        // as the real one does with idle connections holding no tickets.
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("collector.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let (tx, seen) = mpsc::channel();
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().enumerate() {
                let Ok(mut stream) = stream else { return };
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                // The HELLO that opens each connection, then one request.
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                assert!(line.starts_with("HELLO "), "{line:?}");
                let _ = stream.write_all(b"OK\n");
                line.clear();
                let _ = reader.read_line(&mut line);
                let _ = tx.send(line.trim_end().to_owned());
                let _ = stream.write_all(format!("OK {}\n", n + 1).as_bytes());
            }
        });
        let settings = Settings::from_vars(Some(path.as_os_str()), None);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        for n in 1..=3 {
            // The first asks on a new connection; the next ones find theirs
            // closed and ask again on a new one instead of refusing.
            let decision = state.admit(1, &settings, Resource::Pd, 0, &mut log);
            let Decision::Proceed(Some(ticket)) = decision else {
                panic!("admission {n} refused: {log:?}");
            };
            assert_eq!(ticket.id, n);
            assert_eq!(recv(&seen), "ADMIT PD_ALLOC");
            // A ticket in use is never retried for: the collector released
            // it when it closed, and says so only through the close.
            if n == 3 {
                state.created(1, 0x10, ticket);
                let decision = state.admit(1, &settings, Resource::Pd, 0, &mut log);
                assert!(matches!(decision, Decision::Refuse(ERRNO_NO_COLLECTOR)));
            }
        }
    }

    #[test]
    fn admitted_objects_are_released_on_destroy() {
        let (_dir, settings, seen) = collector(ticket_for_qp_deny_mr);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        let Decision::Proceed(Some(ticket)) = state.admit(1, &settings, Resource::Qp, 0, &mut log)
        else {
            panic!("not admitted: {log:?}");
        };
        assert_eq!(recv(&seen), "ADMIT QP_CREATE");
        state.created(1, 0x1000, ticket);
        assert_eq!(state.tracked(), 1);
        // A failed destroy keeps the ticket; a successful one releases it.
        let taken = state.take(1, 0x1000);
        state.restore(1, taken);
        assert_eq!(state.tracked(), 1);
        let taken = state.take(1, 0x1000);
        state.release(1, taken);
        assert_eq!(state.tracked(), 0);
        // The release waits for a request to ride on, until it is due.
        assert_eq!(state.releases_waiting(), 1);
        let due = state.releases_due().expect("a release waits");
        assert_eq!(state.flush_releases(1, due - ms(1)), Some(due));
        assert_eq!(state.releases_waiting(), 1, "not due yet");
        assert_eq!(state.flush_releases(1, due), None);
        assert_eq!(recv(&seen), "RELEASE 7");
        assert_eq!((state.releases_waiting(), state.release_writes()), (0, 1));
        // Unknown objects (created before the preload, or uncounted) are ignored.
        let taken = state.take(1, 0x2000);
        state.release(1, taken);
        assert_eq!(state.releases_waiting(), 0);
        assert!(log.is_empty(), "{log:?}");
    }

    /// A collector that records what each `recv` returned (one entry per
    /// write the client made, as the client writes and then waits) and
    /// answers every line of it.
    fn recording_collector() -> (tempfile::TempDir, Settings, mpsc::Receiver<String>) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("collector.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let Some(Ok(mut stream)) = listener.incoming().next() else {
                return;
            };
            let mut next = 0;
            let mut buf = [0u8; 4096];
            loop {
                let n = match std::io::Read::read(&mut stream, &mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let chunk = String::from_utf8_lossy(&buf[..n]).into_owned();
                let mut replies = String::new();
                for line in chunk.lines() {
                    replies.push_str(
                        if line.starts_with("RELEASE") || line.starts_with("HELLO ") {
                            "OK\n"
                        } else {
                            next += 1;
                            if next == 1 {
                                "OK 1\n"
                            } else {
                                "OK 2\n"
                            }
                        },
                    );
                }
                // The connection's HELLO is its own write; the tests count the others.
                if !chunk.starts_with("HELLO ") {
                    let _ = tx.send(chunk);
                }
                if stream.write_all(replies.as_bytes()).is_err() {
                    return;
                }
            }
        });
        (dir, Settings::from_vars(Some(path.as_os_str()), None), rx)
    }

    #[test]
    fn a_release_rides_with_the_next_admission_in_one_write() {
        let (_dir, settings, writes) = recording_collector();
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        let t0 = Instant::now();
        let Decision::Proceed(Some(ticket)) = state.admit(1, &settings, Resource::Cq, 0, &mut log)
        else {
            panic!("not admitted: {log:?}");
        };
        assert_eq!(recv(&writes), "ADMIT CQ_CREATE\n");
        state.created(1, 0x10, ticket);
        let taken = state.take(1, 0x10);
        state.release_at(1, taken, t0);
        assert_eq!(state.releases_due(), Some(t0 + RELEASE_DELAY));
        // The next creation carries it: one write, two lines, its own ticket back.
        let Decision::Proceed(Some(next)) = state.admit(1, &settings, Resource::Cq, 0, &mut log)
        else {
            panic!("not admitted: {log:?}");
        };
        assert_eq!(recv(&writes), "RELEASE 1\nADMIT CQ_CREATE\n");
        assert_eq!(next.id, 2);
        assert_eq!((state.releases_waiting(), state.release_writes()), (0, 0));
        assert_eq!(state.releases_due(), None);
        assert!(log.is_empty(), "{log:?}");
    }

    #[test]
    fn a_full_batch_of_releases_is_sent_at_once_and_a_lost_connection_drops_them() {
        let (_dir, settings, seen) = collector(|l| match l {
            l if l.starts_with("ADMIT") => "OK 5\n".into(),
            _ => "OK\n".into(),
        });
        let mut state = Interceptor::new();
        let Decision::Proceed(Some(ticket)) =
            state.admit(1, &settings, Resource::Pd, 0, &mut Vec::new())
        else {
            panic!("not admitted");
        };
        assert_eq!(recv(&seen), "ADMIT PD_ALLOC");
        // The same ticket stands in for RELEASE_BATCH objects: what counts is how many wait.
        for object in 0..RELEASE_BATCH - 1 {
            state.created(1, object, ticket);
            let taken = state.take(1, object);
            state.release(1, taken);
        }
        assert_eq!(state.releases_waiting(), RELEASE_BATCH - 1);
        state.created(1, 0x999, ticket);
        let taken = state.take(1, 0x999);
        state.release(1, taken);
        assert_eq!((state.releases_waiting(), state.release_writes()), (0, 1));
        for _ in 0..RELEASE_BATCH {
            assert_eq!(recv(&seen), "RELEASE 5");
        }
        // Releases of a connection that is lost are the collector's to drop (it releases a
        // closed connection's tickets): none is sent on the next one.
        state.created(1, 0x10, ticket);
        let taken = state.take(1, 0x10);
        state.release(1, taken);
        assert_eq!(state.releases_waiting(), 1);
        state.lose_connection(&mut Vec::new());
        assert_eq!((state.releases_waiting(), state.releases_due()), (0, None));
    }

    #[test]
    fn a_failed_creation_gives_its_ticket_back() {
        let (_dir, settings, seen) = collector(ticket_for_qp_deny_mr);
        let mut state = Interceptor::new();
        let Decision::Proceed(Some(ticket)) =
            state.admit(1, &settings, Resource::Qp, 0, &mut Vec::new())
        else {
            panic!("not admitted");
        };
        state.failed(1, ticket);
        assert_eq!(recv(&seen), "ADMIT QP_CREATE");
        let due = state.releases_due().expect("the release waits");
        assert_eq!(state.flush_releases(1, due), None);
        assert_eq!(recv(&seen), "RELEASE 7");
        assert_eq!(state.tracked(), 0);
    }

    #[test]
    fn deny_refuses_with_edquot_and_the_reason() {
        let (_dir, settings, seen) = collector(ticket_for_qp_deny_mr);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        let decision = state.admit(1, &settings, Resource::Mr, 4096, &mut log);
        assert_eq!(decision, Decision::Refuse(libc::EDQUOT));
        assert_eq!(recv(&seen), "ADMIT MR_REG 4096");
        assert_eq!(
            log,
            ["rdma-intercept: MR_REG refused: MR_BYTES limit 1 would be exceeded"]
        );
        assert!(state.connected(), "a refusal keeps the connection");
    }

    #[test]
    fn unreachable_collector_fails_closed_by_default_and_open_on_request() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nobody.sock");
        let closed = Settings::from_vars(Some(path.as_os_str()), None);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        for _ in 0..2 {
            let d = state.admit(1, &closed, Resource::Pd, 0, &mut log);
            assert_eq!(d, Decision::Refuse(libc::EACCES));
        }
        assert_eq!(log.len(), 2, "one line per refusal");
        assert_eq!(
            log[0],
            format!(
                "rdma-intercept: collector at {} unreachable: connect: No such file or \
                 directory (os error 2); refusing PD_ALLOC (RDMA_INTERCEPT_FAIL=closed)",
                path.display()
            )
        );

        let open = Settings::from_vars(Some(path.as_os_str()), Some("open".as_ref()));
        let mut log = Vec::new();
        for _ in 0..3 {
            let d = state.admit(1, &open, Resource::Cq, 0, &mut log);
            assert_eq!(d, Decision::Proceed(None));
        }
        assert_eq!(log.len(), 1, "the open warning is printed once: {log:?}");
        assert!(log[0].contains("allowing RDMA resources without quota checks"));
    }

    #[test]
    fn unknown_fail_mode_warns_once_and_stays_closed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nobody.sock");
        let s = Settings::from_vars(Some(path.as_os_str()), Some("opne".as_ref()));
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        state.admit(1, &s, Resource::Qp, 0, &mut log);
        state.admit(1, &s, Resource::Qp, 0, &mut log);
        let warnings = log.iter().filter(|l| l.contains("\"opne\"")).count();
        assert_eq!(warnings, 1, "{log:?}");
        assert_eq!(log.len(), 3);
    }

    #[test]
    fn err_and_bad_replies_drop_the_connection_and_apply_the_fail_mode() {
        let (_dir, settings, seen) = collector(|l| {
            if l == "ADMIT QP_CREATE" {
                "OK 1\n".into()
            } else {
                "ERR too many connections for uid 0\n".into()
            }
        });
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        let Decision::Proceed(Some(t)) = state.admit(1, &settings, Resource::Qp, 0, &mut log)
        else {
            panic!("not admitted");
        };
        state.created(1, 0x10, t);
        let d = state.admit(1, &settings, Resource::Cq, 0, &mut log);
        assert_eq!(d, Decision::Refuse(libc::EACCES));
        assert!(!state.connected());
        assert_eq!(state.tracked(), 0, "the lost connection's tickets are gone");
        assert!(log[0].contains("the 1 RDMA resources created so far are no longer counted"));
        assert!(log[1].contains("answered an error: too many connections for uid 0"));
        assert_eq!(recv(&seen), "ADMIT QP_CREATE");
        assert_eq!(recv(&seen), "ADMIT CQ_CREATE");
        assert_eq!(recv(&seen), "<close>");
        // Destroying the old object sends nothing on the next connection.
        let taken = state.take(1, 0x10);
        state.release(1, taken);
        assert!(seen.recv_timeout(Duration::from_millis(200)).is_err());
    }

    #[test]
    fn a_forked_child_starts_over_and_never_releases_parent_tickets() {
        let (_dir, settings, seen) = collector(ticket_for_qp_deny_mr);
        let mut state = Interceptor::new();
        let Decision::Proceed(Some(t)) =
            state.admit(100, &settings, Resource::Qp, 0, &mut Vec::new())
        else {
            panic!("not admitted");
        };
        state.created(100, 0x10, t);
        state.created(100, 0x20, t);
        assert_eq!(recv(&seen), "ADMIT QP_CREATE");
        // The parent destroyed one; its release waits when the process forks.
        let taken = state.take(100, 0x20);
        state.release(100, taken);
        assert_eq!(state.releases_waiting(), 1);
        // Same state seen from pid 101 (the child after fork).
        let taken = state.take(101, 0x10);
        assert_eq!(taken, None);
        assert_eq!(
            state.releases_waiting(),
            0,
            "the parent's release is not the child's"
        );
        assert!(
            !state.connected(),
            "the child must not use the parent's connection"
        );
        let Decision::Proceed(Some(t2)) =
            state.admit(101, &settings, Resource::Qp, 0, &mut Vec::new())
        else {
            panic!("child not admitted");
        };
        assert_ne!(t, t2, "the child's ticket belongs to its own connection");
        // Two server threads: the old connection's close and the new one's request.
        let mut lines = [recv(&seen), recv(&seen)];
        lines.sort();
        assert_eq!(lines, ["<close>", "ADMIT QP_CREATE"]);
    }

    #[test]
    fn a_ticket_from_a_lost_connection_is_not_recorded() {
        let (_dir, settings, _seen) = collector(|l| {
            if l == "ADMIT QP_CREATE" {
                "OK 3\n".into()
            } else {
                String::new() // hang up
            }
        });
        let mut state = Interceptor::new();
        let Decision::Proceed(Some(t)) =
            state.admit(1, &settings, Resource::Qp, 0, &mut Vec::new())
        else {
            panic!("not admitted");
        };
        // Another thread's call lost the connection while this one created.
        let d = state.admit(1, &settings, Resource::Pd, 0, &mut Vec::new());
        assert_eq!(d, Decision::Refuse(libc::EACCES));
        state.created(1, 0x20, t);
        assert_eq!(state.tracked(), 0);
    }

    fn cq_rate_limited(line: &str) -> String {
        match line {
            "ADMIT CQ_CREATE" => "DENY CQ_CREATE limit 20/s exceeded globally (20 calls in the \
                                  last second); retry_after_ms=50\n"
                .into(),
            "ADMIT QP_CREATE" => "OK 3\n".into(),
            _ => "ERR unexpected\n".into(),
        }
    }

    /// What a collector older than protocol version 2 says: no retry time.
    fn cq_rate_limited_v1(line: &str) -> String {
        match line {
            "ADMIT CQ_CREATE" => {
                "DENY CQ_CREATE limit 20/s exceeded globally (20 calls in the last second)\n".into()
            }
            _ => "ERR unexpected\n".into(),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A version 3 collector whose CQ limit is full after each admission
    /// for 50 ms.
    fn cq_held_v3(line: &str) -> String {
        match line {
            l if l.starts_with("HELLO ") && l.ends_with("; protocol=3") => "OK protocol=3\n".into(),
            "ADMIT CQ_CREATE" => "OK 5; next_ms=50\n".into(),
            l if l.starts_with("RELEASE") => "OK\n".into(),
            _ => "ERR unexpected\n".into(),
        }
    }

    #[test]
    fn an_admission_that_fills_the_limit_answers_the_next_calls_here() {
        let (_dir, settings, seen) = collector(cq_held_v3);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        let t0 = Instant::now();
        let first = state.admit_at(1, &settings, Resource::Cq, 0, t0, &mut log);
        let replied = Instant::now();
        assert!(
            matches!(first, Decision::Proceed(Some(Ticket { id: 5, .. }))),
            "{first:?}"
        );
        assert_eq!(recv(&seen), "ADMIT CQ_CREATE");
        assert!(
            state.collector_holds(),
            "the HELLO was answered with protocol 3"
        );
        assert!(log.is_empty(), "{log:?}");
        // The next calls within the 50 ms are refused here: the collector
        // would only have said so (version 2 asked once more to hear it).
        for i in 0..100u64 {
            let now = t0 + Duration::from_micros(1 + i * 490);
            let decision = state.admit_at(1, &settings, Resource::Cq, 0, now, &mut log);
            assert_eq!(decision, Decision::Refuse(libc::EDQUOT), "call {i}");
        }
        assert_eq!((state.asked(), state.answered_locally()), (1, 100));
        assert!(seen.try_recv().is_err(), "nothing else asked");
        // One line says why, on the first refusal only.
        assert_eq!(log.len(), 1, "{log:?}");
        assert!(
            log[0].starts_with(
                "rdma-intercept: CQ_CREATE refused: its rate limit is full (the collector said \
                 so when it admitted the last one); refusing CQ_CREATE here for the next "
            ),
            "{log:?}"
        );
        // At the end of the hold (counted from the reply, which came before
        // `replied`) the collector is asked, and admits.
        let t1 = replied + ms(50);
        let again = state.admit_at(1, &settings, Resource::Cq, 0, t1, &mut log);
        assert!(matches!(again, Decision::Proceed(Some(_))), "{again:?}");
        assert_eq!(recv(&seen), "ADMIT CQ_CREATE");
        assert_eq!(state.asked(), 2);
        // In wait mode a held call waits for the end of the hold instead
        // (`t1` is still ahead of the clock, so the hold counts from it).
        let wait = Settings {
            on_limit: OnLimit::Wait,
            ..settings.clone()
        };
        let held = state.admit_at(1, &wait, Resource::Cq, 0, t1 + ms(10), &mut log);
        assert_eq!(held, Decision::Wait(t1 + ms(50)));
    }

    #[test]
    fn a_version_2_collector_gets_no_hello_it_cannot_answer() {
        // cq_rate_limited answers HELLO with ERR; the helper turns that into
        // the plain OK of a version 2 collector: no holds, refusals as before.
        let (_dir, settings, seen) = collector(cq_rate_limited);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        let qp = state.admit(1, &settings, Resource::Qp, 0, &mut log);
        assert!(matches!(qp, Decision::Proceed(Some(_))), "{qp:?}");
        assert_eq!(recv(&seen), "ADMIT QP_CREATE");
        assert!(state.connected() && !state.collector_holds());
    }

    #[test]
    fn a_rate_refusal_is_repeated_locally_until_its_retry_time() {
        let (_dir, settings, seen) = collector(cq_rate_limited);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        let t0 = Instant::now();
        let first = state.admit_at(1, &settings, Resource::Cq, 0, t0, &mut log);
        assert_eq!(first, Decision::Refuse(libc::EDQUOT));
        assert_eq!(recv(&seen), "ADMIT CQ_CREATE");
        assert_eq!(
            log,
            [
                "rdma-intercept: CQ_CREATE refused: CQ_CREATE limit 20/s exceeded globally \
              (20 calls in the last second); refusing CQ_CREATE here for the next 50 ms \
              without asking the collector"
            ]
        );
        log.clear();
        // A thousand retries within the 50 ms: refused here, silently, unasked.
        for i in 0..1000u32 {
            let now = t0 + Duration::from_micros(u64::from(i) * 49);
            let decision = state.admit_at(1, &settings, Resource::Cq, 0, now, &mut log);
            assert_eq!(decision, Decision::Refuse(libc::EDQUOT), "retry {i}");
        }
        assert!(log.is_empty(), "{log:?}");
        assert_eq!((state.asked(), state.answered_locally()), (1, 1000));
        // Another verb is not held by this refusal.
        let qp = state.admit_at(1, &settings, Resource::Qp, 0, t0 + ms(10), &mut log);
        assert!(matches!(qp, Decision::Proceed(Some(_))), "{qp:?}");
        assert_eq!(recv(&seen), "ADMIT QP_CREATE");
        // Nothing else reached the collector meanwhile.
        assert!(seen.try_recv().is_err());
        // At the retry time the collector is asked again.
        let again = state.admit_at(1, &settings, Resource::Cq, 0, t0 + ms(50), &mut log);
        assert_eq!(again, Decision::Refuse(libc::EDQUOT));
        assert_eq!(recv(&seen), "ADMIT CQ_CREATE");
        assert_eq!((state.asked(), state.answered_locally()), (3, 1000));
    }

    #[test]
    fn without_a_retry_time_every_call_is_asked() {
        // The behaviour before protocol version 2, and still that of count
        // limits: each refused call costs the collector a request.
        let (_dir, settings, seen) = collector(cq_rate_limited_v1);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        let t0 = Instant::now();
        for i in 0..20 {
            let d = state.admit_at(1, &settings, Resource::Cq, 0, t0 + ms(i), &mut log);
            assert_eq!(d, Decision::Refuse(libc::EDQUOT));
            assert_eq!(recv(&seen), "ADMIT CQ_CREATE");
        }
        assert_eq!((state.asked(), state.answered_locally()), (20, 0));
        assert_eq!(log.len(), 20);
        assert_eq!(
            log[0],
            "rdma-intercept: CQ_CREATE refused: CQ_CREATE limit 20/s exceeded globally \
             (20 calls in the last second)"
        );
    }

    #[test]
    fn wait_mode_waits_until_the_retry_time_and_says_once_when_it_cannot() {
        let (_dir, settings, seen) = collector(cq_rate_limited);
        let settings = settings.with_limit_vars(Some("wait".as_ref()), None);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        let t0 = Instant::now();
        let d = state.admit_at(1, &settings, Resource::Cq, 0, t0, &mut log);
        assert_eq!(d, Decision::Wait(t0 + ms(50)));
        assert_eq!(recv(&seen), "ADMIT CQ_CREATE");
        // Another thread of the program asking meanwhile waits for the same time.
        let d = state.admit_at(1, &settings, Resource::Cq, 0, t0 + ms(20), &mut log);
        assert_eq!(d, Decision::Wait(t0 + ms(50)));
        assert!(seen.try_recv().is_err());
        assert!(log.is_empty(), "waiting is quiet: {log:?}");
        assert_eq!(
            limit::next_step(
                settings.on_limit,
                t0,
                t0 + ms(20),
                t0 + ms(50),
                settings.max_wait
            ),
            limit::Next::Sleep(ms(30))
        );

        // A collector that gives no retry time: wait mode cannot wait.
        let (_dir1, settings, seen) = collector(cq_rate_limited_v1);
        let settings = settings.with_limit_vars(Some("wait".as_ref()), None);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        for _ in 0..3 {
            let d = state.admit_at(1, &settings, Resource::Cq, 0, t0, &mut log);
            assert_eq!(d, Decision::Refuse(libc::EDQUOT));
            assert_eq!(recv(&seen), "ADMIT CQ_CREATE");
        }
        let notes = log
            .iter()
            .filter(|l| l.contains("refusing instead of waiting"))
            .count();
        assert_eq!(notes, 1, "{log:?}");
    }

    #[test]
    fn bad_limit_settings_are_named_once_with_the_other_problems() {
        let (_dir, settings, _seen) = collector(cq_rate_limited);
        let settings = Settings {
            problem: Some("RDMA_INTERCEPT_FAIL=\"x\" is neither".into()),
            ..settings
        }
        .with_limit_vars(Some("sleep".as_ref()), Some("soon".as_ref()));
        assert_eq!(settings.on_limit, OnLimit::Fail);
        let mut state = Interceptor::new();
        let mut log = Vec::new();
        state.admit(1, &settings, Resource::Qp, 0, &mut log);
        state.admit(1, &settings, Resource::Qp, 0, &mut log);
        assert_eq!(log.len(), 2, "{log:?}");
        assert!(log[0].contains("RDMA_INTERCEPT_FAIL"));
        assert!(log[1].contains("RDMA_INTERCEPT_ON_LIMIT=\"sleep\""));
        assert!(log[1].contains("RDMA_INTERCEPT_MAX_WAIT_MS=\"soon\""));
    }
}
