//! The secure client: TLS connect, admission, RDMA setup and the `send` /
//! `write` operations, each acknowledged by the server over TLS.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::handshake::{
    Channel, HandshakeError, Message, Op, RejectReason, Verdict, CAPABILITIES, VERSION,
};
use crate::session::{Session, SessionConfig, SessionError, Tokens};
use crate::tls::{self, Side};
use crate::verbs::{Device, GidSelector, VerbsError};

/// Client settings (the `secure-client` flags).
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Server host (name or address).
    pub host: String,
    /// Server port.
    pub port: u16,
    /// Name the server certificate must carry (default: `host`).
    pub server_name: String,
    /// CA certificate the server must chain to.
    pub ca: PathBuf,
    /// Our certificate and key; `None` connects without one (the server
    /// refuses that; it exists to show the refusal).
    pub identity: Option<(PathBuf, PathBuf)>,
    /// RDMA device; default: the one carrying our local address.
    pub device: Option<String>,
    /// Source GID index; default: the RoCEv2 GID of our local address.
    pub gid_index: Option<u32>,
    /// Timeout of each step.
    pub timeout: Duration,
}

/// Why the client stopped. Each variant has its own exit code.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The TCP connection failed (refused, no route, or no answer in time).
    #[error("server {addr} unreachable: {source}")]
    Unreachable {
        /// What was dialled.
        addr: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// TLS failed: a certificate was refused on either side, or the peer
    /// sent an alert.
    #[error("TLS refused: {0}")]
    Tls(#[from] rustls::Error),
    /// The TLS connection broke before it was established (not a refusal
    /// rustls could name, e.g. the server reset the connection).
    #[error("TLS refused: {0}")]
    TlsIo(#[source] std::io::Error),
    /// The TLS handshake did not finish in time.
    #[error("TLS refused: handshake timed out after {0:?}")]
    TlsTimeout(Duration),
    /// The name the server certificate must carry is not a valid DNS name or
    /// address.
    #[error("TLS refused: invalid server name {name:?}: {source}")]
    ServerName {
        /// The name given.
        name: String,
        /// Why it is invalid.
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    /// Local TLS material is unusable.
    #[error(transparent)]
    TlsConfig(#[from] tls::TlsError),
    /// The server refused us after authenticating.
    #[error("rejected by server: {0}")]
    Rejected(RejectReason),
    /// No RDMA device or GID for our address.
    #[error(transparent)]
    Device(VerbsError),
    /// The RDMA connection could not be confirmed.
    #[error(transparent)]
    Confirm(SessionError),
    /// Anything else in the protocol or on the RDMA path.
    #[error(transparent)]
    Session(SessionError),
}

impl ClientError {
    /// Process exit code for this error (documented in `secure-client --help`).
    pub fn exit_code(&self) -> i32 {
        match self {
            ClientError::Rejected(_) => 3,
            ClientError::Tls(_)
            | ClientError::TlsIo(_)
            | ClientError::TlsTimeout(_)
            | ClientError::ServerName { .. }
            | ClientError::TlsConfig(_) => 4,
            ClientError::Unreachable { .. } => 5,
            ClientError::Device(_) => 6,
            ClientError::Confirm(_) => 7,
            ClientError::Session(_) => 8,
        }
    }
}

/// In TLS 1.3 the server judges the client's certificate after the client's
/// handshake has completed, so its refusal (an alert) surfaces on the first
/// read or write of the control channel: report that as a TLS refusal, not a
/// protocol error.
fn tls_or(e: HandshakeError) -> ClientError {
    if let HandshakeError::Io(io) = &e {
        if let Some(inner) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return ClientError::Tls(inner.clone());
        }
    }
    ClientError::Session(e.into())
}

/// What the server acknowledged.
pub use crate::handshake::Ack;

/// A connected, confirmed client.
pub struct Client {
    // Drop order: the RDMA session before the TLS channel.
    session: Session,
    chan: Channel<TlsStream<TcpStream>>,
    identity: String,
    device: Arc<Device>,
    timeout: Duration,
}

impl Client {
    /// Connects, authenticates, is admitted, sets up and confirms RDMA.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use secure_rdma::client::{Client, ClientConfig};
    ///
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let mut client = Client::connect(&ClientConfig {
    ///     host: "10.77.0.1".into(),
    ///     port: 4433,
    ///     server_name: "10.77.0.1".into(),
    ///     ca: "certs/ca.pem".into(),
    ///     identity: Some(("certs/alice.pem".into(), "certs/alice.key".into())),
    ///     device: None,
    ///     gid_index: None,
    ///     timeout: Duration::from_secs(5),
    /// })
    /// .await?;
    /// let ack = client.send(b"hello over RDMA").await?;
    /// assert_eq!(ack.bytes, 15);
    /// client.quit().await;
    /// # Ok(()) }
    /// ```
    pub async fn connect(cfg: &ClientConfig) -> Result<Client, ClientError> {
        let tls_config = match &cfg.identity {
            Some((cert, key)) => tls::client_config(&cfg.ca, cert, key)?,
            None => tls::client_config_without_cert(&cfg.ca)?,
        };
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let unreachable = |source: std::io::Error| ClientError::Unreachable {
            addr: addr.clone(),
            source,
        };
        let tcp = tokio::time::timeout(cfg.timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| {
                unreachable(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {:?}", cfg.timeout),
                ))
            })?
            .map_err(unreachable)?;
        let _ = tcp.set_nodelay(true);
        let local: SocketAddr = tcp.local_addr().map_err(unreachable)?;
        let name = ServerName::try_from(cfg.server_name.clone()).map_err(|source| {
            ClientError::ServerName {
                name: cfg.server_name.clone(),
                source,
            }
        })?;
        let tls = tokio::time::timeout(
            cfg.timeout,
            TlsConnector::from(tls_config).connect(name, tcp),
        )
        .await
        .map_err(|_| ClientError::TlsTimeout(cfg.timeout))?
        .map_err(|e| {
            match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                Some(inner) => ClientError::Tls(inner.clone()),
                None => ClientError::TlsIo(e),
            }
        })?;
        let conn = &tls.get_ref().1;
        let tokens = Tokens {
            mine: tls::confirmation_token(conn, Side::Client)?,
            peer: tls::confirmation_token(conn, Side::Server)?,
        };
        let mut chan = Channel::new(tls);
        chan.send(&Message::Hello {
            version: VERSION,
            capabilities: CAPABILITIES.iter().map(|c| c.to_string()).collect(),
        })
        .await
        .map_err(tls_or)?;
        let verdict = tokio::time::timeout(cfg.timeout, chan.expect_verdict())
            .await
            .map_err(|_| ClientError::Session(SessionError::Timeout(cfg.timeout, "admission")))?
            .map_err(tls_or)?;
        let (buffer_size, identity) = match verdict {
            Verdict::Accepted {
                buffer_size,
                identity,
            } => (buffer_size as usize, identity),
            Verdict::Rejected(reason) => return Err(ClientError::Rejected(reason)),
        };
        let (device, sgid) = pick_device(cfg, local).map_err(ClientError::Device)?;
        let session_cfg = SessionConfig {
            buffer_size,
            timeout: cfg.timeout,
            ..SessionConfig::default()
        };
        let session = Session::establish(&mut chan, &device, sgid, tokens, session_cfg)
            .await
            .map_err(|e| match e {
                SessionError::ConfirmTimeout(_) | SessionError::BadToken => ClientError::Confirm(e),
                SessionError::Verbs(v) => ClientError::Device(v),
                other => ClientError::Session(other),
            })?;
        Ok(Client {
            session,
            chan,
            identity,
            device,
            timeout: cfg.timeout,
        })
    }

    /// The identity the server authenticated.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// The local RDMA device.
    pub fn device(&self) -> &str {
        self.device.name()
    }

    /// The session (wiring, limits).
    pub fn session(&self) -> &Session {
        &self.session
    }

    async fn ack(&mut self, op: Op) -> Result<Ack, ClientError> {
        let ack = tokio::time::timeout(self.timeout, self.chan.expect_ack())
            .await
            .map_err(|_| {
                ClientError::Session(SessionError::Timeout(
                    self.timeout,
                    "the server's acknowledgement",
                ))
            })?
            .map_err(tls_or)?;
        if ack.op != op {
            return Err(ClientError::Session(SessionError::WrongAck {
                sent: op,
                acked: ack.op,
            }));
        }
        Ok(ack)
    }

    /// RDMA SENDs `msg` and waits for the server's acknowledgement.
    pub async fn send(&mut self, msg: &[u8]) -> Result<Ack, ClientError> {
        self.session.send(msg).await.map_err(ClientError::Session)?;
        self.ack(Op::Send).await
    }

    /// RDMA WRITEs `data` into the server's buffer (with immediate) and waits
    /// for the acknowledgement.
    pub async fn write(&mut self, data: &[u8]) -> Result<Ack, ClientError> {
        self.session
            .write(data)
            .await
            .map_err(ClientError::Session)?;
        self.ack(Op::Write).await
    }

    /// Says bye, waits briefly for the server's bye, and frees everything.
    pub async fn quit(mut self) {
        if self.chan.send(&Message::Bye).await.is_ok() {
            let _ = tokio::time::timeout(self.timeout, self.chan.recv::<Message>()).await;
        }
        self.chan.close().await;
    }
}

fn pick_device(
    cfg: &ClientConfig,
    local: SocketAddr,
) -> Result<(Arc<Device>, crate::verbs::GidEntry), VerbsError> {
    let selector = match cfg.gid_index {
        Some(i) => GidSelector::Index(i),
        None => GidSelector::Address(local.ip()),
    };
    match (&cfg.device, cfg.gid_index) {
        (None, None) => Device::open_for_address(local.ip()),
        (name, _) => {
            let dev = Device::open(name.as_deref())?;
            let gid = dev.select_gid(&selector)?;
            Ok((dev, gid))
        }
    }
}
