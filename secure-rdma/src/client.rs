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

use crate::handshake::{Channel, HandshakeError, Message, Op, RejectReason, CAPABILITIES, VERSION};
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
    /// The TCP connection failed.
    #[error("server {addr} unreachable: {reason}")]
    Unreachable {
        /// What was dialled.
        addr: String,
        /// Why it failed.
        reason: String,
    },
    /// TLS failed: a certificate was refused on either side.
    #[error("TLS refused: {0}")]
    Tls(String),
    /// Local TLS material is unusable.
    #[error(transparent)]
    TlsConfig(#[from] tls::TlsError),
    /// The server refused us after authenticating.
    #[error("rejected by server: {0}")]
    Rejected(RejectReason),
    /// No RDMA device or GID for our address.
    #[error("{0}")]
    Device(VerbsError),
    /// The RDMA connection could not be confirmed.
    #[error("{0}")]
    Confirm(SessionError),
    /// Anything else in the protocol or on the RDMA path.
    #[error("{0}")]
    Session(SessionError),
}

impl ClientError {
    /// Process exit code for this error (documented in `secure-client --help`).
    pub fn exit_code(&self) -> i32 {
        match self {
            ClientError::Rejected(_) => 3,
            ClientError::Tls(_) | ClientError::TlsConfig(_) => 4,
            ClientError::Unreachable { .. } => 5,
            ClientError::Device(_) => 6,
            ClientError::Confirm(_) => 7,
            ClientError::Session(_) => 8,
        }
    }
}

fn tls_or(e: HandshakeError) -> ClientError {
    if let HandshakeError::Io(io) = &e {
        if let Some(inner) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            return ClientError::Tls(inner.to_string());
        }
    }
    ClientError::Session(e.into())
}

/// What the server acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// The operation.
    pub op: Op,
    /// Its sequence number on this connection.
    pub seq: u64,
    /// Bytes the server saw arrive.
    pub bytes: u32,
}

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
    pub async fn connect(cfg: &ClientConfig) -> Result<Client, ClientError> {
        let tls_config = match &cfg.identity {
            Some((cert, key)) => tls::client_config(&cfg.ca, cert, key)?,
            None => tls::client_config_without_cert(&cfg.ca)?,
        };
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let unreachable = |reason: String| ClientError::Unreachable {
            addr: addr.clone(),
            reason,
        };
        let tcp = tokio::time::timeout(cfg.timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| unreachable(format!("no answer within {:?}", cfg.timeout)))?
            .map_err(|e| unreachable(e.to_string()))?;
        let _ = tcp.set_nodelay(true);
        let local: SocketAddr = tcp.local_addr().map_err(|e| unreachable(e.to_string()))?;
        let name = ServerName::try_from(cfg.server_name.clone()).map_err(|e| {
            ClientError::Tls(format!("invalid server name {:?}: {e}", cfg.server_name))
        })?;
        let tls = tokio::time::timeout(
            cfg.timeout,
            TlsConnector::from(tls_config).connect(name, tcp),
        )
        .await
        .map_err(|_| ClientError::Tls(format!("handshake timed out after {:?}", cfg.timeout)))?
        .map_err(|e| {
            match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                Some(inner) => ClientError::Tls(inner.to_string()),
                None => ClientError::Tls(e.to_string()),
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
        // In TLS 1.3 the server judges our certificate after our handshake
        // completes: a refusal shows up here, as an alert.
        let reply = tokio::time::timeout(cfg.timeout, chan.recv::<Message>())
            .await
            .map_err(|_| ClientError::Session(SessionError::Timeout(cfg.timeout, "admission")))?
            .map_err(tls_or)?;
        let (buffer_size, identity) = match reply {
            Message::Accept {
                buffer_size,
                identity,
            } => (buffer_size as usize, identity),
            Message::Reject { reason } => return Err(ClientError::Rejected(reason)),
            other => {
                return Err(ClientError::Session(SessionError::Unexpected {
                    expected: "accept",
                    got: other.kind(),
                }))
            }
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
        let msg = tokio::time::timeout(self.timeout, self.chan.recv::<Message>())
            .await
            .map_err(|_| {
                ClientError::Session(SessionError::Timeout(
                    self.timeout,
                    "the server's acknowledgement",
                ))
            })?
            .map_err(tls_or)?;
        match msg {
            Message::Ack {
                op: got,
                seq,
                bytes,
            } if got == op => Ok(Ack { op, seq, bytes }),
            Message::Bye => Err(ClientError::Session(SessionError::Unexpected {
                expected: "ack",
                got: "bye (server closed the connection)",
            })),
            other => Err(ClientError::Session(SessionError::Unexpected {
                expected: "ack",
                got: other.kind(),
            })),
        }
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
