//! The collector's own bounds ([`ConnectionBounds`]): connections and live
//! tickets, in all, per uid and per tenant, so that local users can neither
//! grow the daemon without limit nor crowd each other out; what the embedding
//! program calls each of them ([`BoundNames`]), so that a refusal can say how
//! to raise it; and the descriptor limit that lowers `max_connections`.

use std::time::Duration;

/// Bounds that keep local users from growing the daemon without limit or
/// crowding each other out.
///
/// Every intercepted process (and each forked child that creates resources)
/// holds one connection, and one ticket per live resource. A connection that
/// holds no ticket can be closed without loss (the interceptor reconnects
/// when it next asks), so when a cap on connections is reached the collector
/// closes such a connection to make room: first of the uid with the most
/// connections, the one idle the longest. Connections holding tickets are
/// never closed.
///
/// # Examples
///
/// ```
/// use rdma_collector::ConnectionBounds;
///
/// let bounds = ConnectionBounds { per_uid: 16, ..ConnectionBounds::default() };
/// assert_eq!(bounds.tickets, 8192);
/// assert_eq!(bounds.max_connections, 4096);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionBounds {
    /// Open connections in all. At run time it is lowered to the descriptor
    /// limit (`ulimit -n`) less 64 kept for everything else, so the collector
    /// can always accept a new program.
    pub max_connections: usize,
    /// Open connections per uid; one more closes an idle ticketless one of
    /// the same uid, or gets `ERR` and is closed if all hold tickets.
    pub per_uid: usize,
    /// Live tickets per connection; creations beyond are denied.
    pub tickets: usize,
    /// Live tickets per uid, all its connections together.
    pub tickets_per_uid: usize,
    /// Live tickets per tenant, all its connections together.
    pub tickets_per_tenant: usize,
    /// A connection without tickets that sends nothing this long is closed.
    pub idle_timeout: Duration,
}

impl Default for ConnectionBounds {
    fn default() -> Self {
        // A ticket costs about 120 bytes: 16,384 per uid or tenant is 2 MB.
        ConnectionBounds {
            max_connections: 4096,
            per_uid: 256,
            tickets: 8192,
            tickets_per_uid: 16_384,
            tickets_per_tenant: 16_384,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

/// What the program that runs the collector calls each bound, so that a
/// refusal can say how to raise it: a command-line flag, a configuration key.
/// A bound without a name is refused without such a hint.
///
/// # Examples
///
/// ```
/// use rdma_collector::BoundNames;
///
/// let mut names = BoundNames::default();
/// names.max_connections = Some("max_connections in collector.toml".into());
/// assert_eq!(names.tickets, None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BoundNames {
    /// The setting behind [`ConnectionBounds::max_connections`].
    pub max_connections: Option<String>,
    /// The setting behind [`ConnectionBounds::tickets`].
    pub tickets: Option<String>,
    /// The setting behind [`ConnectionBounds::tickets_per_uid`].
    pub tickets_per_uid: Option<String>,
    /// The setting behind [`ConnectionBounds::tickets_per_tenant`].
    pub tickets_per_tenant: Option<String>,
}

/// ` (NAME)` after a refusal, or nothing for a bound without a name.
pub(crate) fn hint(name: Option<&String>) -> String {
    name.map(|n| format!(" ({n})")).unwrap_or_default()
}

/// Descriptors kept out of `max_connections`: stdio, the listener, the
/// runtime's, the spare, and those identifications hold.
const RESERVED_FDS: usize = 64;

/// Lowers `max_connections` to what the descriptor limit allows, keeping
/// [`RESERVED_FDS`] for everything else, so that the table never fills with
/// connections and a new program can always be accepted.
pub(crate) fn fit_to_fd_limit(
    mut bounds: ConnectionBounds,
    names: &BoundNames,
) -> ConnectionBounds {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into a valid rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return bounds;
    }
    let fds = usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX);
    let fit = fds.saturating_sub(RESERVED_FDS).max(1);
    if fit < bounds.max_connections {
        tracing::warn!(
            fd_limit = fds,
            max_connections = fit,
            asked = bounds.max_connections,
            "the descriptor limit (ulimit -n) lowers {}",
            names
                .max_connections
                .as_deref()
                .unwrap_or("max_connections")
        );
        bounds.max_connections = fit;
    }
    bounds
}
