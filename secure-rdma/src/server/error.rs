//! Why a server does not start: [`ServerError`], and the settings it names.
//!
//! The errors name [`ServerConfig`](super::ServerConfig) fields, never the
//! flags or files of a program that filled them in: a binary matches on
//! [`ConfigError`] and [`RdmaSetting`] to word the fix in its own terms.

use std::net::SocketAddr;

use crate::tls;
use crate::verbs::{Availability, VerbsError};

/// Errors that stop the server from starting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// TLS configuration failed.
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// The listening socket failed.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The configured device cannot be used.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The configuration names a device or a GID index and this host has no
    /// RDMA device at all.
    #[error("{setting} needs an RDMA device, and {availability}")]
    NoRdma {
        /// The setting that needs a device.
        setting: RdmaSetting,
        /// What the host lacks, with the fix.
        availability: Availability,
    },
    /// Invalid settings.
    #[error("invalid configuration: {0}")]
    Config(ConfigError),
}

/// A setting that needs an RDMA device ([`ServerError::NoRdma`]).
///
/// ```
/// use secure_rdma::server::RdmaSetting;
///
/// assert_eq!(RdmaSetting::Device("rxe0".into()).to_string(), "device rxe0");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RdmaSetting {
    /// [`ServerConfig::device`](super::ServerConfig::device), naming this device.
    Device(String),
    /// [`ServerConfig::gid_index`](super::ServerConfig::gid_index).
    GidIndex,
}

impl std::fmt::Display for RdmaSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RdmaSetting::Device(name) => write!(f, "device {name}"),
            RdmaSetting::GidIndex => f.write_str("gid_index"),
        }
    }
}

/// A setting out of range ([`ServerError::Config`]).
///
/// ```
/// use secure_rdma::server::ConfigError;
///
/// assert_eq!(
///     ConfigError::BufferSize { size: 8 }.to_string(),
///     "buffer_size 8 must be between 64 bytes and 1 GiB"
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// [`max_clients`](super::ServerConfig::max_clients) is 0.
    #[error("max_clients must be at least 1")]
    MaxClients,
    /// [`buffer_size`](super::ServerConfig::buffer_size) is outside 64 bytes to 1 GiB.
    #[error("buffer_size {size} must be between 64 bytes and 1 GiB")]
    BufferSize {
        /// The size asked for.
        size: usize,
    },
    /// [`Limits::max_pending`](super::Limits::max_pending) or
    /// [`Limits::max_pending_per_address`](super::Limits::max_pending_per_address) is 0.
    #[error("max_pending and max_pending_per_address must be at least 1")]
    MaxPending,
    /// [`Limits::max_sessions_per_identity`](super::Limits::max_sessions_per_identity) is
    /// `Some(0)`.
    #[error("max_sessions_per_identity must be at least 1")]
    MaxSessionsPerIdentity,
    /// A [`PrefixLengths`](super::PrefixLengths) length is longer than its addresses.
    #[error("{family} prefix length {length} is longer than the address: use 0 to {max}")]
    PrefixLength {
        /// `IPv4` or `IPv6`.
        family: &'static str,
        /// The length asked for.
        length: u8,
        /// The longest there is (32 or 128).
        max: u8,
    },
    /// [`Limits::max_pending_per_prefix`](super::Limits::max_pending_per_prefix) is 0.
    #[error("max_pending_per_prefix must be at least 1")]
    MaxPendingPerPrefix,
}
