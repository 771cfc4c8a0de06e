//! The collector wire protocol, both halves in one place: the interceptor
//! (`rdma-intercept`) formats [`Request`]s and parses [`Reply`]s, the
//! collector (`rdma-collector`) parses requests and formats replies. One type
//! per direction, so the two sides cannot drift. Pure: no sockets and no
//! runtime, so it can live in a preloaded object.
//!
//! # Protocol
//!
//! Line-based UTF-8 text; every line ends with `\n` and is at most
//! [`MAX_LINE`] (512) bytes long, newline included. Replies come in the
//! order of the requests, one line each; a client may send several requests
//! before reading their replies (the interceptor sends the `RELEASE`s that
//! waited with its next `ADMIT`, in one write), and the collector then
//! answers them together. The collector listens on [`DEFAULT_SOCKET`] unless
//! told otherwise.
//!
//! | request                | reply                                            |
//! |------------------------|--------------------------------------------------|
//! | `HELLO <comm>`         | `OK` (optional, informational)                   |
//! | `HELLO <comm>; protocol=3` | `OK protocol=3` from a version 3 collector (then admissions may say how long their limit is full), `OK` from an older one |
//! | `ADMIT <VERB>`         | `OK <ticket>` for a creating verb (`QP_CREATE`, `PD_ALLOC`, `CQ_CREATE`; `OK <ticket>; next_ms=<N>` after a version 3 `HELLO` when it fills a rate limit), `OK` for a rate-limited one (`QP_MODIFY`, ...), or `DENY <reason>` |
//! | `ADMIT MR_REG <bytes>` | `OK <ticket>` or `DENY <reason>`                 |
//! | `RELEASE <ticket>`     | `OK`, or `ERR unknown ticket N` (connection stays) |
//! | `STATS`                | `OK global QP=n PD=n CQ=n MR=n MR_BYTES=n [tenant NAME QP=n ...]` |
//!
//! Verbs are named as in quota files ([`Verb::name`]). A ticket is a decimal
//! `u64`, valid only on the connection that received it: the resource it
//! admitted stays counted until `RELEASE` or until the connection closes,
//! whichever comes first. A closed connection (the program exited or
//! crashed) releases all its tickets, so the live counts return to what
//! exists. `DENY` reasons are the quota's [`Refusal`](crate::Refusal)
//! messages, e.g. `QP_COUNT limit 1 reached globally (1 live)`.
//!
//! # Version 2: retry times
//!
//! Protocol version 2 added one thing to version 1:
//! a `DENY` of a *rate* limit may end with `; retry_after_ms=<N>`, the
//! milliseconds until the limit that refused would admit a call again
//! ([`Reply::deny`], [`retry_after`]). An interceptor answers repeated calls
//! of that verb itself until then, without asking ([`RETRY_AFTER_MAX`]
//! bounds how long it believes the collector). Count and byte refusals carry
//! no retry time: they end when something is destroyed, which no clock
//! predicts, so they are asked about every time.
//!
//! Both directions stay compatible without a handshake. A version 1
//! interceptor reads the suffix as part of the reason and prints it (the
//! refusal is still a `DENY`, the errno the same). A version 2 interceptor
//! talking to a version 1 collector sees no retry time and asks every time,
//! as before; it says so once when told to wait (`RDMA_INTERCEPT_ON_LIMIT=wait`).
//!
//! # Version 3: how long an admission leaves the limit full
//!
//! This is protocol version 3 ([`VERSION`]). Under a rate-limited flood,
//! version 2 still costs the collector two requests per admitted call: the
//! admission, and the refusal of the very next call, which only that refusal
//! tells the interceptor to repeat locally. Version 3 puts the second answer
//! into the first: a client that says `HELLO <comm>; protocol=3` is answered
//! `OK protocol=3`, and from then on an admission that leaves a rate limit
//! full reads `OK <ticket>; next_ms=<N>` ([`Reply::Held`]): every call of
//! that verb in the next N ms would be refused, so the interceptor refuses
//! (or waits) itself until then and asks once after. The limits are sliding
//! windows that other callers can only fill further, so a refusal in that
//! span is exactly what the collector would have said.
//!
//! Only a client that asked gets the suffix: a version 2 interceptor, which
//! never says `HELLO`, would read `OK 7; next_ms=50` as an admission without
//! a ticket. A version 2 collector answers the `HELLO` with a plain `OK` (the
//! suffix is part of the informational name to it), and the interceptor then
//! speaks version 2.
//!
//! A line that does not parse (unknown command, bad number, not UTF-8, over
//! 512 bytes) is answered with `ERR <message>` and the connection is closed,
//! releasing its tickets. Destroying verbs cannot be admitted: destruction
//! is never limited, the client only releases.
//!
//! # Examples
//!
//! ```
//! use rdma_quota::wire::{Reply, Request};
//! use rdma_quota::Verb;
//!
//! // The interceptor asks...
//! let line = Request::Admit { verb: Verb::MrReg, bytes: 4096 }.to_line();
//! assert_eq!(line, "ADMIT MR_REG 4096\n");
//! // ...the collector reads it and answers...
//! let request = Request::parse(line.trim_end().as_bytes())?;
//! assert_eq!(request, Request::Admit { verb: Verb::MrReg, bytes: 4096 });
//! let answer = Reply::Ticket(7).to_line();
//! // ...and the interceptor reads the answer.
//! assert_eq!(Reply::parse(&answer)?, Reply::Ticket(7));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::fmt;

use crate::Verb;

/// The protocol version these types speak; see the module docs.
pub const VERSION: u32 = 3;

/// What precedes the version a client speaks, at the end of its `HELLO`
/// (version 3).
pub const PROTOCOL_TAG: &str = "; protocol=";

/// What precedes the version in a version 3 collector's answer to `HELLO`.
const HELLO_VERSION_TAG: &str = "protocol=";

/// What precedes the milliseconds of an admission's hold (version 3): how
/// long the rate limit that admitted it refuses every further call.
pub const NEXT_TAG: &str = "; next_ms=";

/// What precedes the milliseconds of a `DENY`'s retry time.
pub const RETRY_AFTER_TAG: &str = "; retry_after_ms=";

/// The longest retry time a client should believe. A rate limit counts over
/// one second, so its next token is never further away; a larger value is a
/// bug or a lie, and believing it would refuse (or stall) a program for
/// longer than any limit asks.
pub const RETRY_AFTER_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// The retry time at the end of a `DENY` reason, if it has one (version 2),
/// and the reason without it. Values above [`RETRY_AFTER_MAX`] are cut to it.
///
/// ```
/// use std::time::Duration;
/// use rdma_quota::wire::{retry_after, Reply};
///
/// let reply = Reply::deny("CQ_CREATE limit 20/s exceeded globally", Some(Duration::from_micros(36_200)));
/// assert_eq!(reply.to_line(), "DENY CQ_CREATE limit 20/s exceeded globally; retry_after_ms=37\n");
/// let Reply::Deny(reason) = Reply::parse(&reply.to_line())? else { unreachable!() };
/// assert_eq!(
///     retry_after(&reason),
///     ("CQ_CREATE limit 20/s exceeded globally", Some(Duration::from_millis(37)))
/// );
/// // A version 1 reason has none.
/// assert_eq!(retry_after("QP_COUNT limit 1 reached globally (1 live)").1, None);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn retry_after(reason: &str) -> (&str, Option<std::time::Duration>) {
    let Some((text, ms)) = reason.rsplit_once(RETRY_AFTER_TAG) else {
        return (reason, None);
    };
    if ms.is_empty() || !ms.bytes().all(|b| b.is_ascii_digit()) {
        return (reason, None);
    }
    let wait = ms
        .parse::<u64>()
        .map(std::time::Duration::from_millis)
        .unwrap_or(RETRY_AFTER_MAX);
    (text, Some(wait.min(RETRY_AFTER_MAX)))
}

/// The longest line either side sends or accepts, `\n` included.
pub const MAX_LINE: usize = 512;

/// Where the collector listens by default (`rdma-collector --socket`,
/// `rdma-monitor --collector`), and where the interceptor looks unless
/// `RDMA_COLLECTOR` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/rdma-monitor/collector.sock";

/// One request line.
///
/// # Examples
///
/// ```
/// use rdma_quota::wire::Request;
/// use rdma_quota::Verb;
///
/// assert_eq!(Request::Admit { verb: Verb::QpCreate, bytes: 0 }.to_line(), "ADMIT QP_CREATE\n");
/// assert_eq!(
///     Request::parse(b"ADMIT MR_REG 4096"),
///     Ok(Request::Admit { verb: Verb::MrReg, bytes: 4096 })
/// );
/// assert_eq!(Request::Release { ticket: 3 }.to_line(), "RELEASE 3\n");
/// assert_eq!(Request::parse(b"RELEASE 3"), Ok(Request::Release { ticket: 3 }));
/// let err = Request::parse(b"ADMIT QP_DESTROY").unwrap_err();
/// assert_eq!(err.to_string(), "QP_DESTROY destroys a resource: send RELEASE <ticket> instead");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `HELLO <comm>` or `HELLO <comm>; protocol=<N>`: the program's own name
    /// for itself (informational) and, from version 3, the protocol version
    /// it speaks.
    Hello {
        /// What the client claims; never trusted.
        comm: String,
        /// The version after [`PROTOCOL_TAG`], if the client named one.
        protocol: Option<u32>,
    },
    /// `ADMIT <VERB>` or `ADMIT MR_REG <bytes>`: may one more be made?
    Admit {
        /// A verb that is not a destruction.
        verb: Verb,
        /// The memory region's length for `MR_REG`, otherwise 0.
        bytes: u64,
    },
    /// `RELEASE <ticket>`: the resource of this ticket was destroyed.
    Release {
        /// A ticket from an `OK <ticket>` reply on this connection.
        ticket: u64,
    },
    /// `STATS`: the live counts, globally and of the caller's tenant.
    Stats,
}

/// A request line that does not follow the protocol. The collector answers
/// it with `ERR <this message>` and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRequest {
    /// More than [`MAX_LINE`] bytes without a newline.
    #[error("line longer than {MAX_LINE} bytes")]
    TooLong,
    /// Not UTF-8.
    #[error("line is not valid UTF-8")]
    NotUtf8,
    /// Nothing but whitespace.
    #[error("empty request")]
    Empty,
    /// Not one of the commands.
    #[error("unknown command {0:?} (expected HELLO, ADMIT, RELEASE or STATS)")]
    UnknownCommand(String),
    /// A command without its argument.
    #[error("{0} needs an argument")]
    MissingArgument(&'static str),
    /// More words than the command takes.
    #[error("unexpected {extra:?} after {command}")]
    Extra {
        /// The command.
        command: &'static str,
        /// What followed.
        extra: String,
    },
    /// A verb name that does not exist.
    #[error("unknown verb {0:?}")]
    UnknownVerb(String),
    /// `ADMIT` of a destroying verb.
    #[error("{0} destroys a resource: send RELEASE <ticket> instead")]
    Destroying(Verb),
    /// `ADMIT MR_REG` without the length.
    #[error("ADMIT MR_REG needs the region's length in bytes")]
    MissingBytes,
    /// A number that is not a decimal `u64`.
    #[error("{what} {value:?} is not a non-negative integer")]
    BadNumber {
        /// What the number is.
        what: &'static str,
        /// As written.
        value: String,
    },
}

impl Request {
    /// Parses one line, without its `\n`. Words are separated by single
    /// spaces or tabs; a trailing `\r` is tolerated (telnet/netcat users).
    pub fn parse(line: &[u8]) -> Result<Request, BadRequest> {
        if line.len() >= MAX_LINE {
            return Err(BadRequest::TooLong);
        }
        let text = std::str::from_utf8(line).map_err(|_| BadRequest::NotUtf8)?;
        let text = text.strip_suffix('\r').unwrap_or(text);
        let mut words = text.split_ascii_whitespace();
        let Some(command) = words.next() else {
            return Err(BadRequest::Empty);
        };
        match command {
            "HELLO" => {
                // The name may contain spaces: everything after the command.
                let rest = text.trim().strip_prefix("HELLO").unwrap_or("").trim();
                // A version that does not parse stays part of the name, as a
                // version 2 collector would read it.
                let (comm, protocol) = match rest.rsplit_once(PROTOCOL_TAG) {
                    Some((comm, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                        (comm.trim(), Some(n.parse().unwrap_or(u32::MAX)))
                    }
                    _ => (rest, None),
                };
                if comm.is_empty() {
                    return Err(BadRequest::MissingArgument("HELLO"));
                }
                Ok(Request::Hello {
                    comm: comm.to_owned(),
                    protocol,
                })
            }
            "ADMIT" => {
                let name = words.next().ok_or(BadRequest::MissingArgument("ADMIT"))?;
                let verb: Verb = name
                    .parse()
                    .map_err(|_| BadRequest::UnknownVerb(name.to_owned()))?;
                if verb.destroys().is_some() {
                    return Err(BadRequest::Destroying(verb));
                }
                let bytes = match (verb, words.next()) {
                    (Verb::MrReg, None) => return Err(BadRequest::MissingBytes),
                    (Verb::MrReg, Some(n)) => number("MR_REG length", n)?,
                    (_, None) => 0,
                    (_, Some(extra)) => return Err(extra_after("ADMIT", extra, words)),
                };
                if let Some(extra) = words.next() {
                    return Err(extra_after("ADMIT", extra, words));
                }
                Ok(Request::Admit { verb, bytes })
            }
            "RELEASE" => {
                let n = words.next().ok_or(BadRequest::MissingArgument("RELEASE"))?;
                let ticket = number("ticket", n)?;
                if let Some(extra) = words.next() {
                    return Err(extra_after("RELEASE", extra, words));
                }
                Ok(Request::Release { ticket })
            }
            "STATS" => match words.next() {
                None => Ok(Request::Stats),
                Some(extra) => Err(extra_after("STATS", extra, words)),
            },
            other => Err(BadRequest::UnknownCommand(cut(other, 40))),
        }
    }

    /// The request as one protocol line, `\n` included.
    ///
    /// A `HELLO` name is cut to what fits in a line and stripped of control
    /// characters, so the line is always one valid line. `ADMIT` carries the
    /// length for `MR_REG`, where it is required, and for any other verb only
    /// if it is not 0: a length where none belongs is then refused by the
    /// collector rather than dropped here.
    pub fn to_line(&self) -> String {
        match self {
            Request::Hello { comm, protocol } => {
                let clean: String = comm
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect();
                let tag = protocol.map(|n| format!("{PROTOCOL_TAG}{n}"));
                let tag = tag.as_deref().unwrap_or("");
                // The name is cut, never the version after it.
                let mut line = format!("HELLO {}", clean.trim());
                truncate_to(&mut line, MAX_LINE - 1 - tag.len());
                line.push_str(tag);
                line.push('\n');
                line
            }
            Request::Admit { verb, bytes } if *verb == Verb::MrReg || *bytes != 0 => {
                format!("ADMIT {verb} {bytes}\n")
            }
            Request::Admit { verb, .. } => format!("ADMIT {verb}\n"),
            Request::Release { ticket } => format!("RELEASE {ticket}\n"),
            Request::Stats => "STATS\n".to_owned(),
        }
    }
}

fn number(what: &'static str, value: &str) -> Result<u64, BadRequest> {
    // `u64::from_str` accepts a leading '+'; the protocol does not.
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = value.parse() {
            return Ok(n);
        }
    }
    Err(BadRequest::BadNumber {
        what,
        value: cut(value, 40),
    })
}

fn extra_after<'a>(
    command: &'static str,
    first: &str,
    rest: impl Iterator<Item = &'a str>,
) -> BadRequest {
    let mut extra = first.to_owned();
    for word in rest {
        extra.push(' ');
        extra.push_str(word);
    }
    BadRequest::Extra {
        command,
        extra: cut(&extra, 40),
    }
}

/// At most `max` characters of `s`, for echoing client input in messages.
fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn truncate_to(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// One reply line.
///
/// # Examples
///
/// ```
/// use rdma_quota::wire::Reply;
///
/// assert_eq!(Reply::Ticket(7).to_line(), "OK 7\n");
/// assert_eq!(Reply::Deny("QP_COUNT limit 1 reached\nglobally".into()).to_line(),
///            "DENY QP_COUNT limit 1 reached globally\n");
/// assert_eq!(Reply::parse("OK 42\n"), Ok(Reply::Ticket(42)));
/// assert_eq!(Reply::parse("OK"), Ok(Reply::Ok));
/// assert!(Reply::parse("MAYBE").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `OK <ticket>`: admitted; release this ticket when the resource is
    /// destroyed.
    Ticket(u64),
    /// `OK <ticket>; next_ms=<N>` (version 3, only to a client that said so
    /// in its `HELLO`): admitted, and the rate limit that admitted it is now
    /// full: it refuses every call of the verb for `held` (rounded up to
    /// whole milliseconds on the wire, cut to [`RETRY_AFTER_MAX`] when read).
    Held {
        /// As in [`Reply::Ticket`].
        ticket: u64,
        /// How long the limit refuses after this admission.
        held: std::time::Duration,
    },
    /// `OK`: done.
    Ok,
    /// `OK <payload>`: done, with a payload (`STATS`). A payload that is
    /// empty or a number reads back as [`Reply::Ok`] or [`Reply::Ticket`].
    OkWith(String),
    /// `DENY <reason>`: refused by a quota.
    Deny(String),
    /// `ERR <message>`: the request was not understood or cannot be served.
    Err(String),
}

/// A reply line that does not follow the protocol.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad reply {line:?} from the collector: {problem}")]
pub struct BadReply {
    /// The line, cut for messages.
    pub line: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl Reply {
    /// A `DENY` with `reason` and, for a rate refusal, the time until the
    /// limit admits again, rounded up to whole milliseconds (at least 1, so
    /// that "now" is never mistaken for "no retry time").
    pub fn deny(reason: impl fmt::Display, retry_after: Option<std::time::Duration>) -> Reply {
        match retry_after {
            None => Reply::Deny(reason.to_string()),
            Some(wait) => {
                let ms = wait.as_nanos().div_ceil(1_000_000).max(1);
                Reply::Deny(format!("{reason}{RETRY_AFTER_TAG}{ms}"))
            }
        }
    }

    /// A version 3 (or later) collector's answer to a `HELLO` that names a
    /// version: `OK protocol=<VERSION>`.
    ///
    /// ```
    /// use rdma_quota::wire::{Reply, VERSION};
    ///
    /// let line = Reply::hello(VERSION).to_line();
    /// assert_eq!(line, "OK protocol=3\n");
    /// assert_eq!(Reply::parse(&line)?.hello_version(), Some(3));
    /// // A version 2 collector answers every HELLO with a plain OK.
    /// assert_eq!(Reply::parse("OK\n")?.hello_version(), Some(2));
    /// assert_eq!(Reply::parse("ERR unknown request\n")?.hello_version(), None);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn hello(version: u32) -> Reply {
        Reply::OkWith(format!("{HELLO_VERSION_TAG}{version}"))
    }

    /// The version a collector speaks, read from its answer to `HELLO`:
    /// the `N` of `OK protocol=N`, 2 for a plain `OK` (the HELLO predates
    /// versions), `None` for any other reply.
    pub fn hello_version(&self) -> Option<u32> {
        match self {
            Reply::Ok => Some(2),
            Reply::OkWith(payload) => payload
                .strip_prefix(HELLO_VERSION_TAG)
                .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|n| n.parse().ok()),
            _ => None,
        }
    }

    /// The reply as one protocol line: control characters become spaces and
    /// the line is cut to [`MAX_LINE`], so a message can never break framing.
    pub fn to_line(&self) -> String {
        let line = match self {
            Reply::Ticket(n) => format!("OK {n}"),
            Reply::Held { ticket, held } => {
                let ms = held.as_nanos().div_ceil(1_000_000).max(1);
                format!("OK {ticket}{NEXT_TAG}{ms}")
            }
            Reply::Ok => "OK".to_owned(),
            Reply::OkWith(payload) => format!("OK {payload}"),
            Reply::Deny(reason) => format!("DENY {reason}"),
            Reply::Err(message) => format!("ERR {message}"),
        };
        let mut line: String = line
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        truncate_to(&mut line, MAX_LINE - 1);
        line.push('\n');
        line
    }

    /// Parses one reply line, with or without its `\n`.
    ///
    /// `OK` followed by plain digits is a [`Reply::Ticket`], and by plain
    /// digits, [`NEXT_TAG`] and plain digits a [`Reply::Held`]; any other `OK`
    /// payload is kept as text.
    pub fn parse(line: &str) -> Result<Reply, BadReply> {
        let bad = |problem| BadReply {
            line: line.chars().take(80).collect(),
            problem,
        };
        let line = line.strip_suffix('\n').unwrap_or(line);
        if line.len() >= MAX_LINE {
            return Err(bad("longer than the protocol allows"));
        }
        if line.contains(['\n', '\r', '\0']) {
            return Err(bad("control characters inside the line"));
        }
        let (word, rest) = match line.split_once(' ') {
            Some((w, r)) => (w, r),
            None => (line, ""),
        };
        match word {
            "OK" if rest.is_empty() => Ok(Reply::Ok),
            "OK" => {
                // Only plain digits are numbers: "+5" or " 5" are payloads.
                let number = |s: &str| {
                    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                        .then(|| s.parse::<u64>().ok())
                        .flatten()
                };
                if let Some(n) = number(rest) {
                    return Ok(Reply::Ticket(n));
                }
                if let Some((ticket, ms)) = rest.split_once(NEXT_TAG) {
                    if let (Some(ticket), Some(ms)) = (number(ticket), number(ms)) {
                        let held = std::time::Duration::from_millis(ms).min(RETRY_AFTER_MAX);
                        return Ok(Reply::Held { ticket, held });
                    }
                }
                Ok(Reply::OkWith(rest.to_owned()))
            }
            "DENY" if rest.is_empty() => Err(bad("DENY without a reason")),
            "DENY" => Ok(Reply::Deny(rest.to_owned())),
            "ERR" if rest.is_empty() => Err(bad("ERR without a message")),
            "ERR" => Ok(Reply::Err(rest.to_owned())),
            _ => Err(bad("expected OK, DENY or ERR")),
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.to_line().trim_end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(line: &str) -> String {
        match Request::parse(line.as_bytes()) {
            Ok(r) => panic!("{line:?} parsed as {r:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn requests_parse() {
        let cases = [
            (
                "ADMIT QP_CREATE",
                Request::Admit {
                    verb: Verb::QpCreate,
                    bytes: 0,
                },
            ),
            (
                "ADMIT PD_ALLOC",
                Request::Admit {
                    verb: Verb::PdAlloc,
                    bytes: 0,
                },
            ),
            (
                "ADMIT CQ_CREATE\r",
                Request::Admit {
                    verb: Verb::CqCreate,
                    bytes: 0,
                },
            ),
            (
                "ADMIT MR_REG 18446744073709551615",
                Request::Admit {
                    verb: Verb::MrReg,
                    bytes: u64::MAX,
                },
            ),
            (
                "ADMIT QP_MODIFY",
                Request::Admit {
                    verb: Verb::QpModify,
                    bytes: 0,
                },
            ),
            ("RELEASE 0", Request::Release { ticket: 0 }),
            ("STATS", Request::Stats),
            (
                "HELLO my program",
                Request::Hello {
                    comm: "my program".into(),
                    protocol: None,
                },
            ),
            (
                "HELLO verbs-churn; protocol=3",
                Request::Hello {
                    comm: "verbs-churn".into(),
                    protocol: Some(3),
                },
            ),
            // A version that is not a number is part of the name, as a
            // version 2 collector reads every HELLO.
            (
                "HELLO x; protocol=3a",
                Request::Hello {
                    comm: "x; protocol=3a".into(),
                    protocol: None,
                },
            ),
            (
                "HELLO x; protocol=99999999999",
                Request::Hello {
                    comm: "x".into(),
                    protocol: Some(u32::MAX),
                },
            ),
        ];
        for (line, request) in cases {
            assert_eq!(Request::parse(line.as_bytes()), Ok(request), "{line:?}");
        }
    }

    #[test]
    fn malformed_requests_name_the_problem() {
        let cases = [
            ("", "empty request"),
            ("   ", "empty request"),
            (
                "admit QP_CREATE",
                "unknown command \"admit\" (expected HELLO, ADMIT, RELEASE or STATS)",
            ),
            ("ADMIT", "ADMIT needs an argument"),
            ("ADMIT QP_EXPLODE", "unknown verb \"QP_EXPLODE\""),
            (
                "ADMIT MR_DEREG",
                "MR_DEREG destroys a resource: send RELEASE <ticket> instead",
            ),
            (
                "ADMIT MR_REG",
                "ADMIT MR_REG needs the region's length in bytes",
            ),
            (
                "ADMIT MR_REG -1",
                "MR_REG length \"-1\" is not a non-negative integer",
            ),
            (
                "ADMIT MR_REG +1",
                "MR_REG length \"+1\" is not a non-negative integer",
            ),
            (
                "ADMIT MR_REG 18446744073709551616",
                "MR_REG length \"18446744073709551616\" is not a non-negative integer",
            ),
            ("ADMIT MR_REG 1 2", "unexpected \"2\" after ADMIT"),
            (
                "ADMIT QP_CREATE 4096 x",
                "unexpected \"4096 x\" after ADMIT",
            ),
            ("RELEASE", "RELEASE needs an argument"),
            ("RELEASE x", "ticket \"x\" is not a non-negative integer"),
            ("RELEASE 1 1", "unexpected \"1\" after RELEASE"),
            ("STATS now", "unexpected \"now\" after STATS"),
            ("HELLO", "HELLO needs an argument"),
        ];
        for (line, message) in cases {
            assert_eq!(err(line), message, "{line:?}");
        }
        assert_eq!(Request::parse(b"ADMIT \xff"), Err(BadRequest::NotUtf8));
        assert_eq!(Request::parse(&[b'A'; MAX_LINE]), Err(BadRequest::TooLong));
        // Echoed input is cut, so an ERR line stays short.
        let long = format!("X{}", "y".repeat(300));
        assert!(err(&long).len() < 120);
    }

    #[test]
    fn replies_cannot_break_framing() {
        assert_eq!(Reply::Ok.to_line(), "OK\n");
        assert_eq!(
            Reply::OkWith("global QP=1".into()).to_line(),
            "OK global QP=1\n"
        );
        assert_eq!(Reply::Err("a\r\nb".into()).to_line(), "ERR a  b\n");
        let long = Reply::Deny("é".repeat(600)).to_line();
        assert!(long.len() <= MAX_LINE);
        assert!(long.ends_with('\n'));
        assert_eq!(long.matches('\n').count(), 1);
        assert_eq!(Reply::Ticket(3).to_string(), "OK 3");
    }

    #[test]
    fn requests_format_as_documented() {
        let admit = |verb, bytes| Request::Admit { verb, bytes };
        let cases = [
            (admit(Verb::QpCreate, 0), "ADMIT QP_CREATE\n"),
            (admit(Verb::PdAlloc, 0), "ADMIT PD_ALLOC\n"),
            (admit(Verb::CqCreate, 0), "ADMIT CQ_CREATE\n"),
            (
                admit(Verb::MrReg, u64::MAX),
                "ADMIT MR_REG 18446744073709551615\n",
            ),
            // MR_REG always carries its length, even an empty one.
            (admit(Verb::MrReg, 0), "ADMIT MR_REG 0\n"),
            // A length on another verb is sent, for the collector to refuse.
            (admit(Verb::QpCreate, 5), "ADMIT QP_CREATE 5\n"),
            (Request::Release { ticket: 0 }, "RELEASE 0\n"),
            (Request::Stats, "STATS\n"),
            (
                Request::Hello {
                    comm: " ibv_rc_pingpong\n".into(),
                    protocol: None,
                },
                "HELLO ibv_rc_pingpong?\n",
            ),
            (
                Request::Hello {
                    comm: "ib_send_bw".into(),
                    protocol: Some(VERSION),
                },
                "HELLO ib_send_bw; protocol=3\n",
            ),
        ];
        for (request, line) in cases {
            assert_eq!(request.to_line(), line);
        }
    }

    #[test]
    fn hello_never_exceeds_a_line() {
        let comm = "é".repeat(400);
        for protocol in [None, Some(VERSION)] {
            let line = Request::Hello {
                comm: comm.clone(),
                protocol,
            }
            .to_line();
            assert!(line.len() <= MAX_LINE, "{}", line.len());
            assert!(line.ends_with('\n'));
            assert_eq!(line.matches('\n').count(), 1);
            // The name is cut, not the version.
            let parsed = Request::parse(line.trim_end().as_bytes()).expect("parses");
            let Request::Hello { protocol: read, .. } = parsed else {
                panic!("{parsed:?}")
            };
            assert_eq!(read, protocol);
        }
    }

    #[test]
    fn an_admission_says_how_long_its_limit_is_full() {
        use std::time::Duration;
        let held = Reply::Held {
            ticket: 7,
            held: Duration::from_micros(36_200),
        };
        // Rounded up: the interceptor must not ask a millisecond early.
        assert_eq!(held.to_line(), "OK 7; next_ms=37\n");
        assert_eq!(
            Reply::parse("OK 7; next_ms=37\n"),
            Ok(Reply::Held {
                ticket: 7,
                held: Duration::from_millis(37)
            })
        );
        // Never "0": that would read as no hold at all.
        let now = Reply::Held {
            ticket: 1,
            held: Duration::from_nanos(1),
        };
        assert_eq!(now.to_line(), "OK 1; next_ms=1\n");
        // A hold longer than a rate window is cut when read.
        assert_eq!(
            Reply::parse("OK 2; next_ms=86400000"),
            Ok(Reply::Held {
                ticket: 2,
                held: RETRY_AFTER_MAX
            })
        );
        // Anything else after a ticket stays a payload.
        for payload in ["7; next_ms=", "7; next_ms=+5", "x; next_ms=5", "7; later=5"] {
            assert_eq!(
                Reply::parse(&format!("OK {payload}")),
                Ok(Reply::OkWith(payload.into())),
                "{payload:?}"
            );
        }
    }

    #[test]
    fn a_hello_answer_names_a_version_or_none() {
        assert_eq!(Reply::hello(VERSION).hello_version(), Some(VERSION));
        assert_eq!(Reply::hello(7).to_line(), "OK protocol=7\n");
        // Anything but digits after the tag is no version: the interceptor speaks version 2.
        for payload in [
            "protocol=",
            "protocol=+3",
            "protocol=3a",
            "protocol=99999999999",
            "3",
        ] {
            assert_eq!(
                Reply::parse(&format!("OK {payload}")).map(|r| r.hello_version()),
                Ok(None),
                "{payload:?}"
            );
        }
        assert_eq!(Reply::Ticket(3).hello_version(), None);
        assert_eq!(Reply::Deny("no".into()).hello_version(), None);
    }

    #[test]
    fn replies_parse() {
        assert_eq!(Reply::parse("OK 0\n"), Ok(Reply::Ticket(0)));
        assert_eq!(
            Reply::parse("OK 18446744073709551615"),
            Ok(Reply::Ticket(u64::MAX))
        );
        assert_eq!(
            Reply::parse("OK 18446744073709551616"),
            Ok(Reply::OkWith("18446744073709551616".into()))
        );
        assert_eq!(Reply::parse("OK +5"), Ok(Reply::OkWith("+5".into())));
        assert_eq!(
            Reply::parse("OK global QP=1"),
            Ok(Reply::OkWith("global QP=1".into()))
        );
        assert_eq!(Reply::parse("OK\n"), Ok(Reply::Ok));
        assert_eq!(
            Reply::parse("DENY MR_BYTES limit 4096 would be exceeded globally\n"),
            Ok(Reply::Deny(
                "MR_BYTES limit 4096 would be exceeded globally".into()
            ))
        );
        assert_eq!(
            Reply::parse("ERR unknown command \"X\""),
            Ok(Reply::Err("unknown command \"X\"".into()))
        );
    }

    #[test]
    fn bad_replies_name_the_problem() {
        for (line, problem) in [
            ("", "expected OK, DENY or ERR"),
            ("ok 1", "expected OK, DENY or ERR"),
            ("DENY", "DENY without a reason"),
            ("ERR", "ERR without a message"),
            ("OK 1\r", "control characters inside the line"),
            ("OK 1\n2", "control characters inside the line"),
        ] {
            let err = Reply::parse(line).expect_err(line);
            assert_eq!(err.problem, problem, "{line:?}");
        }
        let long = format!("DENY {}", "x".repeat(MAX_LINE));
        let err = Reply::parse(&long).expect_err("overlong");
        assert_eq!(err.problem, "longer than the protocol allows");
        assert!(err.to_string().starts_with("bad reply \"DENY xxx"));
        assert!(err.line.len() <= 80);
    }
}
