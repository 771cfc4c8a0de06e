//! # secure-rdma
//!
//! Secure RDMA connections: RC queue pairs whose connection parameters (GID,
//! QPN, PSN, rkey, address) travel over mutually authenticated TLS 1.3, whose
//! PSNs are full 24-bit CSPRNG values, and whose state machine is driven by
//! hand, RESET → INIT → RTR → RTS, with plain verbs.
//!
//! Modules, one concept each, in reading order; each uses only the modules
//! above it (no import cycles):
//! - [`psn`]: 24-bit PSNs and QPNs, drawn from the OS CSPRNG.
//! - [`verbs`]: device, GIDs, protection domains, completion queues,
//!   memory regions and the typestate RC queue pair.
//! - [`slots`]: the send slots of many sessions on one protection domain,
//!   carved from a registration per 64 of them.
//! - [`shared_queue`]: receives of many queue pairs through one shared
//!   receive queue and one completion queue, routed to each by its number
//!   (the scalable server's receive side).
//! - [`datapath`]: the steady-state protocol's records: the operations
//!   ([`datapath::Op`]), their acknowledgements, the bye and the abort.
//! - [`protect`]: payload protection, AEAD over every RDMA SEND and WRITE
//!   with per-direction keys from the TLS session ([`protect::Side`]).
//! - [`certs`]: the deployment's private CA and its server and client
//!   certificates.
//! - [`tls`]: TLS 1.3 with mutual authentication; identities and the
//!   confirmation tokens derived from the session.
//! - [`handshake`]: the wire format of the connection setup, one typed
//!   receiver per step.
//! - [`session`]: one connection's RDMA resources, connected and confirmed,
//!   and the control channel's receivers of the steady state.
//! - [`lanes`]: several RC queue pairs in one session over its one TLS
//!   connection: the lane messages, their keys' context, the lanes a server
//!   closed.
//! - [`warm`]: the warm path, session resources made ahead of time by a
//!   pool's own thread, each serving one session.
//! - [`events`]: data-path failures by cause, so an attack that is not an
//!   AEAD failure is still seen and counted.
//! - [`setup_watch`]: whether the server's own connection setup has slowed
//!   (a noisy neighbour), from the median of its last sessions.
//! - [`ratelimit`]: rate-limited logging, so no peer can flood the log.
//! - [`clock`]: the data path's time: timeouts that read no clock when the
//!   wait is already over, and a coarse clock for what counts seconds.
//! - [`quota`]: the thresholds the server enforces (the `rdma-quota` crate).
//! - [`metrics`]: the server's counters and histograms (sessions, handshakes,
//!   refusals, traffic per tenant), for an exporter to register.
//! - [`client`]: the client: connect, `send`, `write`, `quit`.
//! - [`server`]: the multi-client server: admission, then one session per
//!   client.
//!   - [`server::handler`]: what the application receives, each SEND and
//!     WRITE handed to its handler (a bounded channel, a closure).
//!
//! The layers, lowest first:
//!
//! ```text
//! psn → verbs → slots → shared_queue → datapath → protect → certs → tls → handshake → session → lanes → warm → client, server
//! ```
//!
//! (`clock`, `ratelimit`, `quota` and `metrics` stand beside them: `clock` needs
//! none of them and `verbs` uses it; `metrics` names operations and rejections, so it sits
//! above `handshake`; `events` sits above `session`, whose errors it sorts; `setup_watch`
//! needs none of them.)
//!
//! The library emits `tracing` events and never installs a subscriber: the
//! binaries decide where logs go.

#![warn(missing_docs)]

pub mod certs;
pub mod client;
pub mod clock;
pub mod datapath;
pub mod events;
pub mod handshake;
pub mod lanes;
pub mod metrics;
pub mod protect;
pub mod psn;
pub use rdma_quota as quota;
pub mod ratelimit;
pub mod server;
pub mod session;
pub mod setup_watch;
pub mod shared_queue;
pub mod slots;
#[cfg(test)]
mod test_alloc;
pub mod tls;
pub mod verbs;
pub mod warm;

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
