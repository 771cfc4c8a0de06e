//! # rdma-collector
//!
//! The collector daemon: admission decisions for the `LD_PRELOAD`
//! interceptor (`rdma-intercept`), enforcing a [`Quotas`] on programs that
//! were not written for it.
//!
//! Every program running with `librdma_intercept.so` keeps one connection to
//! the collector's Unix socket and asks it before each RDMA resource it
//! creates. The collector counts what it admitted per tenant and globally in
//! the same [`Quotas`] object `rdma-monitor` renders; [`Collector::quotas`]
//! gives access to it (`Quotas::snapshot()`).
//!
//! Modules, in reading order:
//!
//! 1. `daemon` — [`Collector`]: the socket and the quotas, and the accept
//!    loop that admits connections, backs off on errors and logs a summary;
//! 2. `listen` — the listening socket: binding it (its directory, a stale
//!    socket, its mode), adopting one systemd passes, removing our own at
//!    exit, and [`CollectorError`];
//! 3. `bounds` — [`ConnectionBounds`], the collector's own caps, what the
//!    embedding program calls them ([`BoundNames`]), and the descriptor limit;
//! 4. `connection` — one connection: admitted or refused, its peer
//!    identified, its requests served line by line;
//! 5. `registry` — who is connected, the caps on connections and tickets,
//!    which idle connection to close for room;
//! 6. `session` — one connection's tickets;
//! 7. `peer` — the peer's pidfd;
//! 8. `activity` — counters, the periodic summary, rate-limited warnings;
//! 9. `users` — [`user_name`], the user database lookup behind
//!    [`TenantBy::User`].
//!
//! The library has no command line: the binary `rdma-collector`
//! (`src/main.rs`, behind the default `cli` feature) parses arguments, sets
//! up logging, names the bounds after its flags and runs a [`Collector`], on
//! the socket systemd passes (`rdma-collector.socket`, via
//! [`Collector::from_listener`]) when started by socket activation, else on
//! the path it is given. Other programs run a [`Collector`] in-process the
//! same way.
//!
//! # Protocol
//!
//! Line-based UTF-8 text, one request and one reply at a time, described
//! with its table of requests and replies in [`rdma_quota::wire`], the
//! module the interceptor uses too. `DENY` reasons are the quota's
//! [`Refusal`] messages. A connection's tickets are released when it
//! closes, however it closes, so a crashed program's resources leave the
//! counts.
//!
//! # Identity and trust
//!
//! The collector believes nothing a client says about itself. Its pid and
//! uid come from `SO_PEERCRED` (taken by the kernel at `connect`), its
//! `comm` from `/proc/<pid>/comm`, and its tenant ([`TenantBy`]) from the
//! uid's user name or from its whole cgroup v2 path (`/lab.slice/job.scope`,
//! never its last component alone, which anyone with a delegated subtree
//! could copy); the tenant is the name matched against `tenant NAME ...`
//! lines of the quota file. `/proc/<pid>` is read after `accept`, so the
//! peer is pinned by a pidfd (`SO_PEERPIDFD`, Linux 6.5; `pidfd_open` after
//! `accept` before that) and refused if it exited meanwhile: a recycled pid
//! cannot lend its cgroup. A failing user database refuses the peer rather
//! than naming it `uid-N`. The socket is
//! created mode 0666 so that any local user's program can connect; that is
//! safe because fairness rests on `SO_PEERCRED`, which a client cannot
//! forge.
//!
//! What a client *can* do is under-report: skip the interceptor, or
//! `RELEASE` tickets of resources it keeps. The collector is a quota service
//! for cooperating programs; the kernel's rdma cgroup controller is the
//! enforcement against hostile ones. A client can also hold global quota
//! without creating anything, so give every tenant its own limits where the
//! global ones must be shared fairly.
//!
//! # Robustness
//!
//! One tokio task per connection; a panic in one is caught by tokio and
//! only closes that connection. [`ConnectionBounds`] caps connections (in
//! all and per uid) and live tickets (per connection, uid and tenant), so a
//! local user cannot grow the daemon without limit. Connections without
//! tickets are closed when idle, or when room is needed for a new program;
//! `max_connections` stays below the descriptor limit and a spare descriptor
//! answers even when the table is full, so a new program is always answered
//! (the fail-closed interceptor would otherwise refuse every creation).
//! Accept errors back off. Decisions are logged at `debug`, with a summary
//! of counts at `info` every 10 s; warnings a client can provoke (denials,
//! refusals, malformed requests) are rate-limited and say how many were
//! suppressed. The summary's `requests=` counts every request served: the
//! collector's work, which a refused program cannot drive up at will, since
//! a rate refusal carries its retry time (protocol version 2,
//! [`rdma_quota::wire`]) and the interceptor answers the repeats itself; to
//! a client that says it speaks version 3, an admission that fills a rate
//! limit says how long the limit stays full, so the refusal after it is not
//! asked for either.
//! `writes=` counts the writes of replies: requests that arrive together (the
//! interceptor sends the `RELEASE`s of destroyed objects with its next
//! `ADMIT`) are answered together, and most of a request's cost is the
//! wake-up, so the collector works per write more than per request.
//!
//! # Examples
//!
//! ```no_run
//! use rdma_collector::Collector;
//! use rdma_quota::tenant::TenantBy;
//! use rdma_quota::wire::DEFAULT_SOCKET;
//! use rdma_quota::{QuotaConfig, Quotas};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let quotas = Quotas::new(QuotaConfig::parse("QP_COUNT 64\ntenant alice QP_COUNT 4\n", "quota.conf")?);
//! let collector = Collector::bind(DEFAULT_SOCKET, quotas.clone(), TenantBy::User)?;
//! let shutdown = async { let _ = tokio::signal::ctrl_c().await; };
//! collector.run(shutdown).await?;
//! println!("{:?}", quotas.snapshot().global.live);
//! # Ok(()) }
//! ```
//!
//! [`Refusal`]: rdma_quota::Refusal
//! [`TenantBy`]: rdma_quota::tenant::TenantBy
//! [`TenantBy::User`]: rdma_quota::tenant::TenantBy::User
//! [`Quotas`]: rdma_quota::Quotas

#![warn(missing_docs)]

mod activity;
mod bounds;
mod connection;
mod daemon;
mod listen;
mod peer;
mod registry;
mod session;
mod users;

/// Serialises the unit tests that fork a child with those that need a descriptor closed when
/// they drop it: between fork and exec the child holds a copy of every descriptor (std's
/// close-on-exec acts only at the exec), so a listener dropped meanwhile still accepts, and a
/// stale socket looks live.
#[cfg(test)]
static FORK_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub use bounds::{BoundNames, ConnectionBounds};
pub use daemon::Collector;
pub use listen::CollectorError;
pub use users::user_name;

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
