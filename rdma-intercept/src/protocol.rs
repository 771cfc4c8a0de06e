//! The client half of the collector protocol: formatting requests and parsing
//! replies. Pure, so that it is tested without sockets.
//!
//! The protocol is line-based UTF-8 text; every line ends with `\n` and is at
//! most [`MAX_LINE`] bytes long, the newline included. The client sends one
//! request and reads one reply before it sends the next.
//!
//! | request               | reply                                             |
//! |-----------------------|---------------------------------------------------|
//! | `HELLO <comm>`        | `OK` (optional; the collector reads `comm` itself) |
//! | `ADMIT <VERB>`        | `OK <ticket>` or `DENY <reason>`                  |
//! | `ADMIT MR_REG <bytes>`| `OK <ticket>` or `DENY <reason>`                  |
//! | `RELEASE <ticket>`    | `OK`                                              |
//! | `STATS`               | `OK global QP=n PD=n CQ=n MR=n MR_BYTES=n ...`    |
//!
//! Any request can also be answered with `ERR <message>`. A ticket is a
//! decimal `u64`, valid only on the connection that received it; the
//! collector releases every ticket of a connection when it closes.

use std::fmt;

/// The longest line either side sends or accepts, `\n` included.
pub const MAX_LINE: usize = 512;

/// A creating verb the interceptor asks admission for.
///
/// # Examples
///
/// ```
/// use rdma_intercept::protocol::Verb;
///
/// assert_eq!(Verb::QpCreate.name(), "QP_CREATE");
/// assert_eq!(Verb::MrReg.to_string(), "MR_REG");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verb {
    /// `ibv_create_qp`.
    QpCreate,
    /// `ibv_alloc_pd`.
    PdAlloc,
    /// `ibv_create_cq`.
    CqCreate,
    /// `ibv_reg_mr` and its variants; carries the region's length.
    MrReg,
}

impl Verb {
    /// The name on the wire and in quota files.
    pub const fn name(self) -> &'static str {
        match self {
            Verb::QpCreate => "QP_CREATE",
            Verb::PdAlloc => "PD_ALLOC",
            Verb::CqCreate => "CQ_CREATE",
            Verb::MrReg => "MR_REG",
        }
    }
}

impl fmt::Display for Verb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A request line, before its `\n`.
///
/// # Examples
///
/// ```
/// use rdma_intercept::protocol::{Request, Verb};
///
/// assert_eq!(Request::Admit { verb: Verb::QpCreate, bytes: None }.to_line(), "ADMIT QP_CREATE\n");
/// assert_eq!(Request::Admit { verb: Verb::MrReg, bytes: Some(4096) }.to_line(), "ADMIT MR_REG 4096\n");
/// assert_eq!(Request::Release { ticket: 7 }.to_line(), "RELEASE 7\n");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Names the program; informational only.
    Hello {
        /// The program name, as the client sees it.
        comm: String,
    },
    /// Asks whether one resource may be created.
    Admit {
        /// The creating verb.
        verb: Verb,
        /// The memory region's length, for `MR_REG` only.
        bytes: Option<u64>,
    },
    /// The resource of `ticket` was destroyed.
    Release {
        /// A ticket from an `OK <ticket>` reply on this connection.
        ticket: u64,
    },
    /// Asks for the live counts.
    Stats,
}

impl Request {
    /// The request as one protocol line, `\n` included.
    ///
    /// A `HELLO` name is cut to what fits in a line and stripped of control
    /// characters, so the line is always valid.
    pub fn to_line(&self) -> String {
        match self {
            Request::Hello { comm } => {
                let clean: String = comm
                    .chars()
                    .map(|c| if c.is_control() { '?' } else { c })
                    .collect();
                let mut line = format!("HELLO {}", clean.trim());
                truncate_to(&mut line, MAX_LINE - 1);
                line.push('\n');
                line
            }
            Request::Admit { verb, bytes: None } => format!("ADMIT {verb}\n"),
            Request::Admit {
                verb,
                bytes: Some(n),
            } => format!("ADMIT {verb} {n}\n"),
            Request::Release { ticket } => format!("RELEASE {ticket}\n"),
            Request::Stats => "STATS\n".to_owned(),
        }
    }
}

fn truncate_to(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// A reply of the collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Admitted; the ticket to release when the resource is destroyed.
    Ticket(u64),
    /// Done, with an optional payload (`STATS`).
    Ok(String),
    /// Refused by a quota.
    Deny(String),
    /// The collector could not handle the request.
    Err(String),
}

/// A reply line that does not follow the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadReply {
    /// The line, cut for messages.
    pub line: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl fmt::Display for BadReply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad reply {:?} from the collector: {}",
            self.line, self.problem
        )
    }
}

impl std::error::Error for BadReply {}

impl Reply {
    /// Parses one reply line, with or without its `\n`.
    ///
    /// `OK` followed by a number is a [`Reply::Ticket`]; any other `OK`
    /// payload is kept as text.
    ///
    /// # Examples
    ///
    /// ```
    /// use rdma_intercept::protocol::Reply;
    ///
    /// assert_eq!(Reply::parse("OK 42\n"), Ok(Reply::Ticket(42)));
    /// assert_eq!(Reply::parse("OK"), Ok(Reply::Ok(String::new())));
    /// assert_eq!(Reply::parse("DENY QP_COUNT limit 1 reached"),
    ///            Ok(Reply::Deny("QP_COUNT limit 1 reached".into())));
    /// assert!(Reply::parse("MAYBE").is_err());
    /// ```
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
            "OK" if rest.is_empty() => Ok(Reply::Ok(String::new())),
            "OK" => match rest.parse::<u64>() {
                // Only plain digits are tickets: "+5" or " 5" are payloads.
                Ok(n) if rest.bytes().all(|b| b.is_ascii_digit()) => Ok(Reply::Ticket(n)),
                _ => Ok(Reply::Ok(rest.to_owned())),
            },
            "DENY" if rest.is_empty() => Err(bad("DENY without a reason")),
            "DENY" => Ok(Reply::Deny(rest.to_owned())),
            "ERR" if rest.is_empty() => Err(bad("ERR without a message")),
            "ERR" => Ok(Reply::Err(rest.to_owned())),
            _ => Err(bad("expected OK, DENY or ERR")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_format_as_documented() {
        let cases = [
            (
                Request::Admit {
                    verb: Verb::QpCreate,
                    bytes: None,
                },
                "ADMIT QP_CREATE\n",
            ),
            (
                Request::Admit {
                    verb: Verb::PdAlloc,
                    bytes: None,
                },
                "ADMIT PD_ALLOC\n",
            ),
            (
                Request::Admit {
                    verb: Verb::CqCreate,
                    bytes: None,
                },
                "ADMIT CQ_CREATE\n",
            ),
            (
                Request::Admit {
                    verb: Verb::MrReg,
                    bytes: Some(u64::MAX),
                },
                "ADMIT MR_REG 18446744073709551615\n",
            ),
            (Request::Release { ticket: 0 }, "RELEASE 0\n"),
            (Request::Stats, "STATS\n"),
            (
                Request::Hello {
                    comm: " ibv_rc_pingpong\n".into(),
                },
                "HELLO ibv_rc_pingpong?\n",
            ),
        ];
        for (request, line) in cases {
            assert_eq!(request.to_line(), line);
        }
    }

    #[test]
    fn hello_never_exceeds_a_line() {
        let comm = "é".repeat(400);
        let line = Request::Hello { comm }.to_line();
        assert!(line.len() <= MAX_LINE, "{}", line.len());
        assert!(line.ends_with('\n'));
        assert_eq!(line.matches('\n').count(), 1);
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
            Ok(Reply::Ok("18446744073709551616".into()))
        );
        assert_eq!(Reply::parse("OK +5"), Ok(Reply::Ok("+5".into())));
        assert_eq!(
            Reply::parse("OK global QP=1"),
            Ok(Reply::Ok("global QP=1".into()))
        );
        assert_eq!(Reply::parse("OK\n"), Ok(Reply::Ok(String::new())));
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
