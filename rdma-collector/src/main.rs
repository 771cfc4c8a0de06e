//! `rdma-collector`: the admission daemon of the `LD_PRELOAD` interceptor
//! (`librdma_intercept.so`). Argument parsing, log setup and wiring only; the
//! work is in the `rdma_collector` library.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::Parser;
use rdma_cli::logging::{self, LogFormat};
use rdma_collector::{BoundNames, Collector, ConnectionBounds};
use rdma_quota::tenant::TenantBy;
use rdma_quota::wire::DEFAULT_SOCKET;
use rdma_quota::{LimitSetting, QuotaConfig, Quotas, Verb};

/// Decide RDMA resource quotas for programs run with
/// LD_PRELOAD=librdma_intercept.so.
///
/// Each intercepted program connects to --socket and asks before it creates
/// a QP, PD, CQ or MR; this daemon admits or denies by the quota file and
/// --limit flags, per tenant (--tenant-by) and globally. A program's
/// resources are released when it destroys them or when it exits. A denial
/// by a rate limit tells the program when to retry; its interceptor answers
/// the repeats itself until then. Logs a summary of its decisions and of the
/// requests it served every 10 s and rate-limited denials on stderr
/// (RUST_LOG=debug for one line per decision). Stops on SIGINT or SIGTERM.
///
/// Against hostile local users: connections are capped in all and per uid,
/// tickets (live resources) per connection, uid and tenant; a connection
/// holding no ticket is closed when idle or when a new program needs room.
#[derive(Parser, Debug)]
#[command(version, name = "rdma-collector", after_help = EXIT_CODES)]
struct Args {
    /// Unix socket to listen on (mode 0666; its directory is created 0755).
    /// Not used when systemd passes the listening socket (socket activation,
    /// rdma-collector.socket): that one is served and its path kept.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Quota file: `KEY VALUE` and `tenant NAME KEY VALUE` lines, as for rdma-monitor.
    #[arg(long, value_name = "FILE")]
    quota: Option<PathBuf>,
    /// A limit, overriding the file: KEY=VALUE or tenant:NAME:KEY=VALUE (repeatable).
    #[arg(long = "limit", value_name = "KEY=VALUE")]
    limits: Vec<LimitSetting>,
    /// What a tenant is: the user name of the program's uid, or its whole
    /// cgroup v2 path, which the quota file names as such
    /// (`tenant /lab.slice/job.scope QP_COUNT 4`).
    #[arg(long, value_name = "KIND", default_value_t = TenantBy::User,
          value_parser = PossibleValuesParser::new(["user", "cgroup"]).map(tenant_by))]
    tenant_by: TenantBy,
    /// Open connections in all (lowered to the descriptor limit less 64).
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().max_connections,
          value_parser = parse_at_least_one)]
    max_connections: usize,
    /// Open connections allowed per uid.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().per_uid)]
    max_connections_per_uid: usize,
    /// Live tickets (admitted resources) per connection.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().tickets)]
    max_tickets_per_connection: usize,
    /// Live tickets per uid, all its connections together.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().tickets_per_uid)]
    max_tickets_per_uid: usize,
    /// Live tickets per tenant, all its connections together.
    #[arg(long, value_name = "N", default_value_t = ConnectionBounds::default().tickets_per_tenant)]
    max_tickets_per_tenant: usize,
    /// Close a connection that holds no tickets after this many idle seconds
    /// (the interceptor reconnects when it next asks).
    #[arg(long, value_name = "SECONDS", default_value = "60", value_parser = parse_seconds)]
    idle_timeout: Duration,
    /// Log format on stderr (RUST_LOG sets the level, default info).
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t)]
    log_format: LogFormat,
}

/// What `rdma-collector --help` says about how it exits.
const EXIT_CODES: &str = "\
Exit codes:
  0  stopped by SIGINT/SIGTERM, with the final counts logged
  1  any failure, the reason on stderr as `rdma-collector: error: ...` (a quota file that does
     not parse, the socket cannot be created or is held by a running collector, ...)
  2  usage: an unknown flag or a bad value (clap's error)";

fn parse_at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number")),
    }
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if secs <= 0.0 {
        return Err("must be more than 0".to_owned());
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s} is not a duration in seconds"))
}

/// The bounds as this binary's flags name them: a program refused by one is
/// told which flag raises it.
fn bound_flags() -> BoundNames {
    let mut names = BoundNames::default();
    names.max_connections = Some("--max-connections".to_owned());
    names.tickets = Some("--max-tickets-per-connection".to_owned());
    names.tickets_per_uid = Some("--max-tickets-per-uid".to_owned());
    names.tickets_per_tenant = Some("--max-tickets-per-tenant".to_owned());
    names
}

/// Raises the soft descriptor limit to the hard one: each connection holds a
/// descriptor, and the default soft limit (1024) is below --max-connections.
fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write a valid rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// `--tenant-by`: the parser lets only the listed values through (and lists them in --help,
/// which a fallible conversion would hide).
fn tenant_by(kind: String) -> TenantBy {
    match kind.as_str() {
        "cgroup" => TenantBy::Cgroup,
        _ => TenantBy::User,
    }
}

/// The listening socket systemd passes a socket-activated service (LISTEN_FDS,
/// LISTEN_PID, the first one on descriptor 3), if any. Serving systemd's
/// socket rather than binding our own is what lets programs keep connecting
/// to the same path while the collector restarts.
fn inherited_listener() -> Result<Option<std::os::unix::net::UnixListener>> {
    let mut fds = listenfd::ListenFd::from_env();
    if fds.len() > 1 {
        tracing::warn!(
            passed = fds.len(),
            "systemd passed more than one socket; serving the first (ListenStream= once in rdma-collector.socket)"
        );
    }
    fds.take_unix_listener(0).context(
        "the socket systemd passed (LISTEN_FDS) is not a listening Unix stream socket; \
         check ListenStream= in rdma-collector.socket",
    )
}

fn main() {
    // The hidden `--generate-docs DIR`: man pages and completions for the package.
    rdma_cli::docs::generate_if_asked(<Args as clap::CommandFactory>::command);
    let args = Args::parse();
    logging::init(args.log_format, "info");
    if let Err(e) = run(args) {
        eprintln!("rdma-collector: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<()> {
    let mut config = match &args.quota {
        Some(path) => QuotaConfig::load(path)?,
        None => QuotaConfig::default(),
    };
    for setting in &args.limits {
        config.apply(setting);
    }
    tracing::info!(limits = %config.to_string().trim_end().replace('\n', "; "), "quotas");
    if args.tenant_by == TenantBy::Cgroup {
        for name in config.tenants.keys().filter(|n| !n.starts_with('/')) {
            tracing::warn!(
                tenant = %name,
                "with --tenant-by cgroup tenants are whole cgroup paths (tenant /a/b.scope ...); \
                 this one matches no program"
            );
        }
    }
    let quotas = Quotas::new(config);
    let bounds = ConnectionBounds {
        max_connections: args.max_connections,
        per_uid: args.max_connections_per_uid,
        tickets: args.max_tickets_per_connection,
        tickets_per_uid: args.max_tickets_per_uid,
        tickets_per_tenant: args.max_tickets_per_tenant,
        idle_timeout: args.idle_timeout,
    };
    raise_fd_limit();
    let collector = match inherited_listener()? {
        Some(listener) => Collector::from_listener(listener, quotas.clone(), args.tenant_by)?,
        None => Collector::bind(&args.socket, quotas.clone(), args.tenant_by)?,
    }
    .with_bounds(bounds)
    .with_bound_names(bound_flags());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("installing the SIGTERM handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        };
        collector.run(shutdown).await?;
        anyhow::Ok(())
    })?;
    let global = quotas.snapshot().global;
    let live: Vec<String> = global
        .live
        .iter()
        .map(|(r, n)| format!("{r}={n}"))
        .collect();
    let nonzero = |counts: &BTreeMap<Verb, u64>| {
        let v: Vec<String> = counts
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(verb, n)| format!("{verb}={n}"))
            .collect();
        v.join(" ")
    };
    tracing::info!(
        live = %live.join(" "),
        mr_bytes = global.mr_bytes,
        admitted = %nonzero(&global.admitted),
        denied = %nonzero(&global.intercepted),
        "final counts"
    );
    Ok(())
}
