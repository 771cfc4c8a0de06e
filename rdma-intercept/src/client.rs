//! A blocking connection to the collector: requests sent together, their
//! replies read in order.
//!
//! Written on raw `libc` calls rather than `std::os::unix::net` because the
//! interceptor lives inside someone else's program: `send` must use
//! `MSG_NOSIGNAL` (a C program usually keeps `SIGPIPE` fatal), and the
//! timeouts must be set *before* `connect`, which blocks on a full backlog.

use std::ffi::c_void;
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rdma_quota::wire::{BadReply, Reply, Request, MAX_LINE};

/// Why talking to the collector failed.
#[derive(Debug)]
pub enum ClientError {
    /// The socket path does not fit in `sockaddr_un`.
    PathTooLong {
        /// The path.
        path: PathBuf,
    },
    /// `socket()` or `setsockopt()` failed.
    Socket(io::Error),
    /// `connect()` failed: no collector, or it is not accepting.
    Connect(io::Error),
    /// Sending the request failed.
    Send(io::Error),
    /// Receiving the reply failed or timed out.
    Receive(io::Error),
    /// The collector closed the connection before replying.
    Closed,
    /// The reply is longer than a protocol line.
    ReplyTooLong,
    /// The reply is not valid UTF-8.
    ReplyNotUtf8,
    /// The reply does not follow the protocol.
    BadReply(BadReply),
    /// A `RELEASE` sent ahead of a request was answered with something other
    /// than `OK` or `ERR` (the two sides disagree about what was asked).
    UnexpectedReply(String),
}

impl ClientError {
    /// Whether the collector hung up (as opposed to timing out or answering
    /// badly): it closes connections that hold no tickets when they idle or
    /// when it needs room, and asking again on a new connection is then safe.
    ///
    /// ```
    /// use rdma_intercept::client::ClientError;
    ///
    /// assert!(ClientError::Closed.hung_up());
    /// let timeout = std::io::Error::from(std::io::ErrorKind::WouldBlock);
    /// assert!(!ClientError::Receive(timeout).hung_up());
    /// ```
    pub fn hung_up(&self) -> bool {
        match self {
            ClientError::Closed => true,
            ClientError::Send(e) | ClientError::Receive(e) => matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
            ),
            _ => false,
        }
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::PathTooLong { path } => write!(
                f,
                "socket path {} is longer than a Unix socket address allows ({} bytes)",
                path.display(),
                SUN_PATH_LEN - 1
            ),
            ClientError::Socket(e) => write!(f, "cannot create a Unix socket: {e}"),
            ClientError::Connect(e) => write!(f, "connect: {e}"),
            ClientError::Send(e) => write!(f, "sending the request: {e}"),
            ClientError::Receive(e) if is_timeout(e) => {
                write!(f, "no reply within the timeout ({e})")
            }
            ClientError::Receive(e) => write!(f, "receiving the reply: {e}"),
            ClientError::Closed => f.write_str("the collector closed the connection"),
            ClientError::ReplyTooLong => {
                write!(f, "reply longer than {MAX_LINE} bytes")
            }
            ClientError::ReplyNotUtf8 => f.write_str("reply is not valid UTF-8"),
            ClientError::BadReply(e) => e.fmt(f),
            ClientError::UnexpectedReply(line) => {
                write!(f, "a RELEASE was answered {line:?} (expected OK or ERR)")
            }
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Socket(e)
            | ClientError::Connect(e)
            | ClientError::Send(e)
            | ClientError::Receive(e) => Some(e),
            ClientError::BadReply(e) => Some(e),
            _ => None,
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

const SUN_PATH_LEN: usize = 108;

/// One connection to the collector.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use rdma_intercept::client::Connection;
/// use rdma_quota::wire::{Reply, Request, DEFAULT_SOCKET};
/// use rdma_quota::Verb;
///
/// let mut conn = Connection::connect(DEFAULT_SOCKET.as_ref(), Duration::from_secs(2))?;
/// match conn.request(&Request::Admit { verb: Verb::QpCreate, bytes: 0 })? {
///     Reply::Ticket(t) => println!("admitted, ticket {t}"),
///     Reply::Deny(reason) => println!("refused: {reason}"),
///     other => println!("unexpected: {other:?}"),
/// }
/// # Ok::<(), rdma_intercept::client::ClientError>(())
/// ```
#[derive(Debug)]
pub struct Connection {
    fd: OwnedFd,
    /// Bytes received after the last reply's `\n`; a correct collector never
    /// sends any, but they must not be mistaken for the next reply's start.
    pending: Vec<u8>,
}

impl Connection {
    /// Connects to the collector at `path`; `timeout` bounds `connect`, each
    /// send and each receive.
    pub fn connect(path: &Path, timeout: Duration) -> Result<Connection, ClientError> {
        let bytes = path.as_os_str().as_bytes();
        if bytes.len() >= SUN_PATH_LEN || bytes.contains(&0) {
            return Err(ClientError::PathTooLong {
                path: path.to_owned(),
            });
        }
        // SAFETY: plain socket(2); the fd is owned at once.
        let raw = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(ClientError::Socket(io::Error::last_os_error()));
        }
        // SAFETY: `raw` is a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let tv = libc::timeval {
            tv_sec: libc::time_t::try_from(timeout.as_secs()).unwrap_or(libc::time_t::MAX),
            tv_usec: libc::suseconds_t::from(timeout.subsec_micros() as i32),
        };
        for option in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
            // SAFETY: `tv` outlives the call and its size is passed.
            let rc = unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    option,
                    (&tv as *const libc::timeval).cast::<c_void>(),
                    size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
            if rc != 0 {
                return Err(ClientError::Socket(io::Error::last_os_error()));
            }
        }
        // SAFETY: all-zero is a valid sockaddr_un.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
            *dst = *src as libc::c_char;
        }
        let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
        loop {
            // SAFETY: `addr` is initialised and `len` is within it.
            let rc = unsafe {
                libc::connect(
                    fd.as_raw_fd(),
                    (&addr as *const libc::sockaddr_un).cast::<libc::sockaddr>(),
                    len as libc::socklen_t,
                )
            };
            if rc == 0 {
                break;
            }
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(ClientError::Connect(err));
            }
        }
        Ok(Connection {
            fd,
            pending: Vec::new(),
        })
    }

    /// Sends `request` and waits for its reply.
    ///
    /// After any error the connection is in an unknown state (a late reply
    /// may still arrive) and must be dropped.
    pub fn request(&mut self, request: &Request) -> Result<Reply, ClientError> {
        self.request_after(&[], request)
    }

    /// Sends the `releases` (tickets whose objects were destroyed) and then
    /// `request`, in one write, and returns `request`'s reply once the
    /// releases' replies (`OK`, or `ERR` for a ticket the collector did not
    /// know) have been read.
    ///
    /// One write: the collector wakes once for all of them, which is most of
    /// what a request costs it (see `Interceptor::release`).
    ///
    /// After any error the connection is in an unknown state and must be
    /// dropped.
    pub fn request_after(
        &mut self,
        releases: &[u64],
        request: &Request,
    ) -> Result<Reply, ClientError> {
        let mut out = String::new();
        for &ticket in releases {
            out.push_str(&Request::Release { ticket }.to_line());
        }
        out.push_str(&request.to_line());
        self.send_all(out.as_bytes())?;
        for _ in releases {
            match self.read_reply()? {
                Reply::Ok | Reply::OkWith(_) | Reply::Err(_) => {}
                other => {
                    return Err(ClientError::UnexpectedReply(
                        other.to_line().trim_end().to_owned(),
                    ))
                }
            }
        }
        self.read_reply()
    }

    fn read_reply(&mut self) -> Result<Reply, ClientError> {
        let line = self.read_line()?;
        let text = std::str::from_utf8(&line).map_err(|_| ClientError::ReplyNotUtf8)?;
        Reply::parse(text).map_err(ClientError::BadReply)
    }

    fn send_all(&mut self, mut buf: &[u8]) -> Result<(), ClientError> {
        while !buf.is_empty() {
            // SAFETY: `buf` is valid for `buf.len()` bytes.
            let n = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    buf.as_ptr().cast::<c_void>(),
                    buf.len(),
                    libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(ClientError::Send(err));
            }
            buf = &buf[n as usize..];
        }
        Ok(())
    }

    fn read_line(&mut self) -> Result<Vec<u8>, ClientError> {
        loop {
            if let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
                let rest = self.pending.split_off(end + 1);
                return Ok(std::mem::replace(&mut self.pending, rest));
            }
            if self.pending.len() >= MAX_LINE {
                return Err(ClientError::ReplyTooLong);
            }
            let mut chunk = [0u8; MAX_LINE];
            // SAFETY: `chunk` is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    chunk.as_mut_ptr().cast::<c_void>(),
                    chunk.len(),
                    0,
                )
            };
            match n {
                0 => return Err(ClientError::Closed),
                n if n < 0 => {
                    let err = io::Error::last_os_error();
                    if err.kind() == io::ErrorKind::Interrupted {
                        continue;
                    }
                    return Err(ClientError::Receive(err));
                }
                n => self.pending.extend_from_slice(&chunk[..n as usize]),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdma_quota::Verb;
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;

    /// A collector stand-in: answers each request line with the next canned reply.
    fn fake(
        replies: Vec<&'static [u8]>,
    ) -> (
        tempfile::TempDir,
        PathBuf,
        std::thread::JoinHandle<Vec<String>>,
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let handle = std::thread::spawn(move || {
            let (stream, _) = listener.accept().expect("accept");
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut writer = stream;
            let mut seen = Vec::new();
            for reply in replies {
                let mut line = String::new();
                if reader.read_line(&mut line).expect("read") == 0 {
                    break;
                }
                seen.push(line);
                writer.write_all(reply).expect("write");
            }
            seen
        });
        (dir, path, handle)
    }

    #[test]
    fn request_reply_round_trip() {
        let (_dir, path, server) =
            fake(vec![b"OK 1\n", b"DENY QP_COUNT limit 1 reached\n", b"OK\n"]);
        let mut conn = Connection::connect(&path, Duration::from_secs(2)).expect("connect");
        let admit = Request::Admit {
            verb: Verb::QpCreate,
            bytes: 0,
        };
        assert_eq!(conn.request(&admit).expect("first"), Reply::Ticket(1));
        assert_eq!(
            conn.request(&admit).expect("second"),
            Reply::Deny("QP_COUNT limit 1 reached".into())
        );
        assert_eq!(
            conn.request(&Request::Release { ticket: 1 })
                .expect("release"),
            Reply::Ok
        );
        drop(conn);
        let seen = server.join().expect("server");
        assert_eq!(
            seen,
            ["ADMIT QP_CREATE\n", "ADMIT QP_CREATE\n", "RELEASE 1\n"]
        );
    }

    #[test]
    fn two_replies_in_one_segment_are_read_one_at_a_time() {
        let (_dir, path, _server) = fake(vec![b"OK 1\nOK 2\n", b""]);
        let mut conn = Connection::connect(&path, Duration::from_secs(2)).expect("connect");
        assert_eq!(conn.request(&Request::Stats).expect("1"), Reply::Ticket(1));
        assert_eq!(conn.request(&Request::Stats).expect("2"), Reply::Ticket(2));
    }

    #[test]
    fn silence_times_out() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("mute.sock");
        // Bound but never accepting: connect completes through the backlog.
        let _listener = UnixListener::bind(&path).expect("bind");
        let mut conn = Connection::connect(&path, Duration::from_millis(100)).expect("connect");
        let started = std::time::Instant::now();
        let err = conn.request(&Request::Stats).expect_err("no reply");
        assert!(matches!(err, ClientError::Receive(_)), "{err:?}");
        assert!(
            err.to_string().starts_with("no reply within the timeout"),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[test]
    fn closing_before_the_reply_is_an_error() {
        let (_dir, path, server) = fake(vec![]);
        let mut conn = Connection::connect(&path, Duration::from_secs(2)).expect("connect");
        server.join().expect("server");
        // The peer is gone: either the send or the receive notices.
        let err = conn.request(&Request::Stats).expect_err("closed");
        assert!(
            matches!(err, ClientError::Closed | ClientError::Send(_)),
            "{err:?}"
        );
    }

    #[test]
    fn garbage_and_overlong_replies_are_errors() {
        let long: &'static [u8] = Box::leak(vec![b'x'; MAX_LINE + 10].into_boxed_slice());
        let (_dir, path, _server) = fake(vec![b"\xff\xfe\n"]);
        let mut conn = Connection::connect(&path, Duration::from_secs(2)).expect("connect");
        assert!(matches!(
            conn.request(&Request::Stats),
            Err(ClientError::ReplyNotUtf8)
        ));
        let (_dir2, path2, _server2) = fake(vec![long]);
        let mut conn = Connection::connect(&path2, Duration::from_secs(2)).expect("connect");
        assert!(matches!(
            conn.request(&Request::Stats),
            Err(ClientError::ReplyTooLong)
        ));
        let (_dir3, path3, _server3) = fake(vec![b"YES\n"]);
        let mut conn = Connection::connect(&path3, Duration::from_secs(2)).expect("connect");
        let err = conn.request(&Request::Stats).expect_err("bad");
        assert_eq!(
            err.to_string(),
            "bad reply \"YES\\n\" from the collector: expected OK, DENY or ERR"
        );
    }

    #[test]
    fn missing_socket_and_long_path_name_the_problem() {
        let dir = tempfile::tempdir().expect("temp dir");
        let err = Connection::connect(&dir.path().join("none.sock"), Duration::from_secs(1))
            .expect_err("nothing listens");
        assert!(matches!(err, ClientError::Connect(_)), "{err:?}");
        assert!(
            err.to_string().starts_with("connect: No such file"),
            "{err}"
        );
        let long = PathBuf::from(format!("/{}", "a".repeat(200)));
        let err = Connection::connect(&long, Duration::from_secs(1)).expect_err("long");
        assert!(err
            .to_string()
            .contains("longer than a Unix socket address allows"));
    }
}
