//! # secure-rdma
//!
//! Secure RDMA connections: RC queue pairs whose connection parameters (GID,
//! QPN, PSN, rkey, address) travel over mutually authenticated TLS 1.3, whose
//! PSNs are full 24-bit CSPRNG values, and whose state machine is driven by
//! hand, RESET → INIT → RTR → RTS, with plain verbs.
//!
//! Modules, one concept each:
//! - [`psn`]: 24-bit PSNs and QPNs, drawn from the OS CSPRNG.
//! - [`verbs`]: device, GIDs, protection domains, completion queues,
//!   memory regions and the typestate RC queue pair.
//! - [`handshake`]: the wire format of the connection setup.

#![warn(missing_docs)]

pub mod certs;
pub mod client;
pub mod handshake;
pub mod logging;
pub mod psn;
pub mod quota;
pub mod server;
pub mod session;
pub mod tls;
pub mod verbs;
