//! The collector's half of the protocol: parsing requests, formatting
//! replies. Pure; the wire format is described in the [module
//! docs](super#protocol).

use std::fmt;

use secure_rdma::quota::Verb;

/// The longest line either side sends or accepts, `\n` included.
pub const MAX_LINE: usize = 512;

/// One parsed request line.
///
/// # Examples
///
/// ```
/// use secure_rdma::quota::Verb;
/// use telemetry_ebpf::collector::protocol::Request;
///
/// assert_eq!(
///     Request::parse(b"ADMIT MR_REG 4096"),
///     Ok(Request::Admit { verb: Verb::MrReg, bytes: 4096 })
/// );
/// assert_eq!(Request::parse(b"RELEASE 3"), Ok(Request::Release { ticket: 3 }));
/// let err = Request::parse(b"ADMIT QP_DESTROY").unwrap_err();
/// assert_eq!(err.to_string(), "QP_DESTROY destroys a resource: send RELEASE <ticket> instead");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `HELLO <comm>`: the program's own name for itself (informational).
    Hello {
        /// What the client claims; never trusted.
        comm: String,
    },
    /// `ADMIT <VERB>` or `ADMIT MR_REG <bytes>`.
    Admit {
        /// A verb that is not a destruction.
        verb: Verb,
        /// The memory region's length for `MR_REG`, otherwise 0.
        bytes: u64,
    },
    /// `RELEASE <ticket>`.
    Release {
        /// A ticket this connection was given.
        ticket: u64,
    },
    /// `STATS`: the live counts, globally and of the caller's tenant.
    Stats,
}

/// A request line that does not follow the protocol. The collector answers
/// it with `ERR <this message>` and closes the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
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
    pub fn parse(line: &[u8]) -> Result<Request, ProtocolError> {
        if line.len() >= MAX_LINE {
            return Err(ProtocolError::TooLong);
        }
        let text = std::str::from_utf8(line).map_err(|_| ProtocolError::NotUtf8)?;
        let text = text.strip_suffix('\r').unwrap_or(text);
        let mut words = text.split_ascii_whitespace();
        let Some(command) = words.next() else {
            return Err(ProtocolError::Empty);
        };
        match command {
            "HELLO" => {
                // The name may contain spaces: everything after the command.
                let comm = text.trim().strip_prefix("HELLO").unwrap_or("").trim();
                if comm.is_empty() {
                    return Err(ProtocolError::MissingArgument("HELLO"));
                }
                Ok(Request::Hello {
                    comm: comm.to_owned(),
                })
            }
            "ADMIT" => {
                let name = words
                    .next()
                    .ok_or(ProtocolError::MissingArgument("ADMIT"))?;
                let verb: Verb = name
                    .parse()
                    .map_err(|_| ProtocolError::UnknownVerb(name.to_owned()))?;
                if verb.destroys().is_some() {
                    return Err(ProtocolError::Destroying(verb));
                }
                let bytes = match (verb, words.next()) {
                    (Verb::MrReg, None) => return Err(ProtocolError::MissingBytes),
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
                let n = words
                    .next()
                    .ok_or(ProtocolError::MissingArgument("RELEASE"))?;
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
            other => Err(ProtocolError::UnknownCommand(cut(other, 40))),
        }
    }
}

fn number(what: &'static str, value: &str) -> Result<u64, ProtocolError> {
    // `u64::from_str` accepts a leading '+'; the protocol does not.
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = value.parse() {
            return Ok(n);
        }
    }
    Err(ProtocolError::BadNumber {
        what,
        value: cut(value, 40),
    })
}

fn extra_after<'a>(
    command: &'static str,
    first: &str,
    rest: impl Iterator<Item = &'a str>,
) -> ProtocolError {
    let mut extra = first.to_owned();
    for word in rest {
        extra.push(' ');
        extra.push_str(word);
    }
    ProtocolError::Extra {
        command,
        extra: cut(&extra, 40),
    }
}

/// At most `max` characters of `s`, for echoing client input in messages.
fn cut(s: &str, max: usize) -> String {
    s.chars().take(max).collect()
}

/// One reply line.
///
/// # Examples
///
/// ```
/// use telemetry_ebpf::collector::protocol::Reply;
///
/// assert_eq!(Reply::Ticket(7).to_line(), "OK 7\n");
/// assert_eq!(Reply::Deny("QP_COUNT limit 1 reached\nglobally".into()).to_line(),
///            "DENY QP_COUNT limit 1 reached globally\n");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Admitted; release this ticket when the resource is destroyed.
    Ticket(u64),
    /// Done.
    Ok,
    /// Done, with a payload (`STATS`).
    OkWith(String),
    /// Refused by a quota, with the reason.
    Deny(String),
    /// The request was not understood or cannot be served.
    Err(String),
}

impl Reply {
    /// The reply as one protocol line: control characters become spaces and
    /// the line is cut to [`MAX_LINE`], so a message can never break framing.
    pub fn to_line(&self) -> String {
        let mut line = match self {
            Reply::Ticket(n) => format!("OK {n}"),
            Reply::Ok => "OK".to_owned(),
            Reply::OkWith(payload) => format!("OK {payload}"),
            Reply::Deny(reason) => format!("DENY {reason}"),
            Reply::Err(message) => format!("ERR {message}"),
        };
        line = line
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        if line.len() > MAX_LINE - 1 {
            let mut end = MAX_LINE - 1;
            while !line.is_char_boundary(end) {
                end -= 1;
            }
            line.truncate(end);
        }
        line.push('\n');
        line
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
        assert_eq!(Request::parse(b"ADMIT \xff"), Err(ProtocolError::NotUtf8));
        assert_eq!(
            Request::parse(&[b'A'; MAX_LINE]),
            Err(ProtocolError::TooLong)
        );
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
}
