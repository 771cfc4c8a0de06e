//! `secure-server`: argument parsing and wiring only; the server lives in
//! `secure_rdma::server`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::builder::{EnumValueParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use rdma_cli::choices::{CipherChoice, PollMode};
use rdma_cli::logging::{self, LogFormat};
use secure_rdma::certs;
use secure_rdma::metrics::ServerMetrics;
use secure_rdma::protect::RekeyPolicy;
use secure_rdma::quota::spiffe::SpiffeId;
use secure_rdma::quota::{LimitSetting, QuotaConfig, Quotas};
use secure_rdma::server::{Limits, PrefixLengths, ProtectionPolicy, Server, ServerConfig};
use secure_rdma::setup_watch::SetupWatchConfig;
use secure_rdma::tls::IdentitySource;
use secure_rdma::verbs::Poll;
use serde::Deserialize;

mod hints;
mod telemetry;

/// Multi-client secure RDMA server.
///
/// Clients authenticate with TLS 1.3 certificates from the deployment's CA
/// (see `secure-server certs`); connection parameters (GID, QPN, PSN, rkey,
/// address) travel only inside that TLS session. Each client gets its own
/// protection domain, completion queues, queue pair and memory regions; the
/// connection counts as established only after both sides proved over RDMA a
/// token derived from the TLS session. SEND and WRITE from clients are logged
/// with the client's identity.
///
/// Settings come from flags, then the --config file, then defaults.
/// SIGINT/SIGTERM stop accepting, close every client, free everything and
/// exit 0.
///
/// At start the server checks for RDMA devices; with none it still serves
/// (clients are told why they cannot be served) and logs a warning naming
/// the fix: load the kernel's RDMA support, or create a Soft-RoCE device
/// (scripts/setup-softroce.sh).
#[derive(Debug, Parser)]
#[command(version, name = "secure-server", after_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    opts: Opts,
    #[command(subcommand)]
    command: Option<Command>,
}

/// What `secure-server --help` says about how it exits.
const EXIT_CODES: &str = "\
Exit codes:
  0  stopped by SIGINT/SIGTERM after closing every client, or a `certs` command succeeded
  1  could not start or a `certs` command failed (missing certificates, bad --config or quota
     file, address in use, --device not found, ...); the reason is printed on stderr
  2  usage: an unknown flag or a bad value (clap's error)";

#[derive(Debug, Args, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct Opts {
    /// Address and port to listen on [default: 0.0.0.0:4433]
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Option<SocketAddr>,
    /// Port to listen on, on every address: short for --listen 0.0.0.0:PORT (-p as in
    /// rping and perftest)
    #[arg(short, long, value_name = "PORT", conflicts_with = "listen")]
    port: Option<u16>,
    /// Clients served at once; client N+1 is refused with "server full (N/N)" [default: 10]
    #[arg(long, value_name = "N")]
    max_clients: Option<usize>,
    /// RDMA device [default: the device whose RoCEv2 GID carries the address the client connected to]
    #[arg(short, long, value_name = "NAME")]
    device: Option<String>,
    /// Source GID index [default: the RoCEv2 GID of the connection's local address]
    #[arg(short, long, value_name = "INDEX")]
    gid_index: Option<u32>,
    /// Per-client buffer size in bytes: the largest send or write [default: 4096]
    #[arg(long, value_name = "BYTES")]
    buffer_size: Option<usize>,
    /// Certificate directory (ca.pem, server.pem, server.key, and crl.pem if clients were
    /// revoked), made by `secure-server certs init` [default: certs]
    #[arg(long, value_name = "DIR")]
    certs: Option<PathBuf>,
    /// Disconnect a client silent for this many seconds [default: 300]
    #[arg(long, value_name = "SECONDS")]
    idle_timeout: Option<u64>,
    /// Quota file: thresholds enforced on every client's RDMA resources before they are made
    /// ("QP_COUNT 8", "QP_CREATE 20", "MR_BYTES 1048576", "tenant alice QP_COUNT 2"; 0 disables;
    /// '#' comments). A client over a limit is refused with the reason
    #[arg(long, value_name = "FILE")]
    quota: Option<PathBuf>,
    /// One threshold, KEY=VALUE or tenant:NAME:KEY=VALUE; repeatable; wins over --quota
    #[arg(long, value_name = "KEY=VALUE")]
    #[serde(default)]
    limit: Vec<String>,
    /// Observe the RDMA control path: eBPF probes in-process when possible (root, kprobes),
    /// otherwise the server's own counts; logs a report every --telemetry-interval
    #[arg(long)]
    #[serde(default)]
    telemetry: bool,
    /// Seconds between telemetry reports [default: 10]
    #[arg(long, value_name = "SECONDS")]
    telemetry_interval: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics (implies --telemetry)
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
    /// Payload cipher; auto also serves a client that offers only the other one [default: auto]
    #[arg(long, value_name = "CIPHER", value_enum)]
    #[serde(default, deserialize_with = "cipher_from_toml")]
    cipher: Option<CipherChoice>,
    /// Payloads in clear, no AEAD: to measure what protection costs and to show the forgery it
    /// stops. An on-path attacker can then forge, replay and read messages
    #[arg(long, conflicts_with = "cipher")]
    #[serde(default)]
    no_payload_protection: bool,
    /// Also serve clients that ask for payloads in clear (refused by default)
    #[arg(long)]
    #[serde(default)]
    allow_unprotected: bool,
    /// Accept clients whose RDMA GID is not the address of their TLS connection (NAT,
    /// multi-homed hosts); by default such a client is refused before its QP is connected
    #[arg(long)]
    #[serde(default)]
    allow_gid_mismatch: bool,
    /// Give clients the write region's own rkey instead of the rkey of a type 2 memory window
    /// bound to their session's QP and invalidated when the session ends (windows are used by
    /// default wherever the device has them; this is for comparison or a device whose windows
    /// misbehave)
    #[arg(long)]
    #[serde(default)]
    no_memory_windows: bool,
    /// Register each session's write region, and bind its window, with the session, instead
    /// of when its client first asks for it before its first RDMA WRITE (the default, for
    /// clients that ask: an idle or SEND-only session then holds no memory its peer can
    /// write, and no registration). For comparison, and for clients of earlier releases,
    /// which get the region with the session either way
    #[arg(long)]
    #[serde(default)]
    writes_at_setup: bool,
    /// How sessions wait for RDMA completions; busy costs a core per active session (for
    /// dedicated hosts and benchmarks) [default: event]
    #[arg(long, value_name = "MODE", value_parser = EnumValueParser::<PollMode>::new().map(Poll::from))]
    #[serde(default)]
    poll: Option<Poll>,
    /// Connections in TLS handshake or admission at once; more are closed at accept [default: 64]
    #[arg(long, value_name = "N")]
    max_pending: Option<usize>,
    /// Of those, from one source address [default: 8]
    #[arg(long, value_name = "N")]
    max_pending_per_address: Option<usize>,
    /// Of those, from one source prefix (a /24 for IPv4, a /64 for IPv6: see
    /// --pending-prefix-v4/-v6), since whoever holds one address often holds its neighbours;
    /// IPv4-mapped IPv6 addresses count as IPv4 [default: 16]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_pending_per_prefix: Option<u32>,
    /// Leading bits of an IPv4 source address that make its prefix, for --max-pending-per-prefix
    /// and for the bound on warnings about failures before TLS (5 lines at once, then 1 a
    /// second per prefix, 20 then 5 a second in all; the rest counted and summarised every
    /// 10 s) [default: 24]
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=32))]
    pending_prefix_v4: Option<u8>,
    /// The same for IPv6 source addresses [default: 64]
    #[arg(long, value_name = "BITS", value_parser = clap::value_parser!(u8).range(0..=128))]
    pending_prefix_v6: Option<u8>,
    /// Seconds a client has for TLS, hello and RDMA setup [default: 10]
    #[arg(long, value_name = "SECONDS")]
    handshake_timeout: Option<u64>,
    /// Seconds one write to a client may block (a client that stops reading is disconnected)
    /// [default: 10]
    #[arg(long, value_name = "SECONDS")]
    write_timeout: Option<u64>,
    /// Sessions one identity may hold at once; the next is refused with the reason [default: no
    /// limit]
    #[arg(long, value_name = "N")]
    max_sessions_per_identity: Option<usize>,
    /// Lanes (RC QPs) one identity may hold at once across its sessions, each session's first
    /// included: a client opening more lanes on a live session (secure-client --lanes) is
    /// refused beyond it, the session and its other lanes going on, so lanes do not buy a
    /// tenant more than its share; each lane's resources also count against the quotas. 1
    /// offers no lanes [default: 8]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65))]
    max_lanes_per_identity: Option<u32>,
    /// Keep this many sessions' RDMA resources (PD, CQs, memory regions, memory window, a QP in
    /// INIT with its receives posted) ready per device and buffer size, made by a background
    /// thread of the server's own, so a new session or lane only connects a ready QP. Each
    /// serves one session and is then freed, never reused. They are the server's while they
    /// wait: no tenant's quota counts them until a session takes one [default: 0, none]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=1024))]
    warm_pool: Option<u32>,
    /// Take every session's receives from one shared receive queue of this many slots per
    /// device, reported on one CQ, instead of 16 receive slots, a receive queue and a receive
    /// CQ per session, and complete their sends on shared send CQs (1,024 entries each): less
    /// memory per session, and no CQ of its own. Sessions then share one protection domain, so
    /// memory windows are required (not with --no-memory-windows); a client that sends beyond
    /// its 16 receives of credit is cut off; the warm pool does not serve these sessions
    /// [default: 0, a receive queue per session]
    #[arg(long, value_name = "SLOTS", value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    shared_receive_queue: Option<u32>,
    /// End sessions older than this many seconds (clients reconnect) [default: no limit]
    #[arg(long, value_name = "SECONDS")]
    max_session_lifetime: Option<u64>,
    /// Remember each client's operation stream this long after its session ends, so a client
    /// that reconnects within it resumes exactly where its commands were delivered (nothing lost,
    /// nothing twice); 0 remembers nothing [default: 120]
    #[arg(long, value_name = "SECONDS")]
    resume_window: Option<u64>,
    /// Which name of a client certificate is its identity (in logs, metrics, quotas): auto = the
    /// SPIFFE ID of an X509-SVID (its one spiffe:// URI SAN) if it has one, else the subject CN;
    /// spiffe = the SPIFFE ID only (others refused); dns = its one DNS SAN; cn = the subject CN.
    /// A certificate without that name is refused with the reason [default: auto]
    #[arg(long, value_name = "SOURCE", value_enum)]
    identity: Option<IdentityChoice>,
    /// Accept SPIFFE IDs only from this trust domain (e.g. example.org); repeatable. Every CA
    /// in --ca can sign any SPIFFE ID, so this keeps the server to its own trust domains
    /// [default: any]
    #[arg(long = "trust-domain", value_name = "DOMAIN", value_parser = parse_trust_domain)]
    #[serde(default)]
    trust_domain: Vec<String>,
    /// CA bundle that client certificates must chain to, from any PKI (openssl, cert-manager,
    /// Vault, SPIRE) [default: DIR/ca.pem of --certs]
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Server certificate (PEM, with its chain) [default: DIR/server.pem of --certs]
    #[arg(long, value_name = "FILE")]
    cert: Option<PathBuf>,
    /// Server private key (PEM: PKCS#8, SEC1 or PKCS#1) [default: DIR/server.key of --certs]
    #[arg(long, value_name = "FILE")]
    key: Option<PathBuf>,
    /// Certificate revocation list (PEM), re-read when it changes [default: DIR/crl.pem of
    /// --certs; none when --ca, --cert and --key are all given without --certs]
    #[arg(long, value_name = "FILE")]
    crl: Option<PathBuf>,
    /// Rotate each direction's payload key after this many messages under one key (a fresh key
    /// derived from the previous one; the client follows, nothing is lost); 0 turns this
    /// threshold off [default: 16777216 (2^24), inside the AES-GCM usage limits]
    #[arg(long, value_name = "MESSAGES")]
    rekey_after: Option<u64>,
    /// Rotate each direction's payload key after this many payload bytes under one key; 0 turns
    /// this threshold off [default: 4294967296 (4 GiB, 2^32)]
    #[arg(long, value_name = "BYTES")]
    rekey_after_bytes: Option<u64>,
    /// Rotate each direction's payload key once it is this many seconds old (at its next
    /// message); 0 turns this threshold off. All three at 0: keys never rotate [default: 3600]
    #[arg(long, value_name = "SECS")]
    rekey_after_seconds: Option<u64>,
    /// Warn (and set the secure_rdma_setup_slow metric) when the median RDMA setup of the last
    /// --setup-slow-window sessions reaches this multiple of the calmest median seen, as when
    /// another tenant floods the RDMA control path; 0 turns the warning off [default: 2]
    #[arg(long, value_name = "FACTOR", value_parser = parse_slow_factor)]
    setup_slow_factor: Option<f64>,
    /// Sessions the median setup of --setup-slow-factor is taken over [default: 20]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10_000))]
    setup_slow_window: Option<u32>,
    /// TOML file with the same keys as the flags (listen, port, max-clients, device, gid-index, buffer-size, certs, idle-timeout, quota, limit, telemetry, telemetry-interval, metrics, cipher, no-payload-protection, allow-unprotected, allow-gid-mismatch, no-memory-windows, writes-at-setup, poll, max-pending, max-pending-per-address, max-pending-per-prefix, pending-prefix-v4, pending-prefix-v6, handshake-timeout, write-timeout, max-sessions-per-identity, max-lanes-per-identity, warm-pool, shared-receive-queue, max-session-lifetime, resume-window, rekey-after, rekey-after-bytes, rekey-after-seconds, setup-slow-factor, setup-slow-window, identity, trust-domain, ca, cert, key, crl)
    #[arg(long, value_name = "FILE")]
    #[serde(skip)]
    config: Option<PathBuf>,
    /// Log format on stderr (RUST_LOG sets the level, default info)
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t)]
    #[serde(skip)]
    log_format: LogFormat,
}

/// `--identity`: which name of a client certificate is its identity (the library's
/// [`IdentitySource`], spelled for the command line and the config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
enum IdentityChoice {
    /// The SPIFFE ID of an X509-SVID if the certificate has one, else the subject CN
    Auto,
    /// The SPIFFE ID of an X509-SVID only (exactly one URI SAN, a valid spiffe:// ID)
    Spiffe,
    /// The certificate's one DNS SAN, lowercased
    Dns,
    /// The subject common name
    Cn,
}

impl From<IdentityChoice> for IdentitySource {
    fn from(choice: IdentityChoice) -> IdentitySource {
        match choice {
            IdentityChoice::Auto => IdentitySource::Auto,
            IdentityChoice::Spiffe => IdentitySource::Spiffe,
            IdentityChoice::Dns => IdentitySource::Dns,
            IdentityChoice::Cn => IdentitySource::Cn,
        }
    }
}

/// `--setup-slow-factor`: 0 (off), or above 1 (a multiple of the calm median).
fn parse_slow_factor(s: &str) -> std::result::Result<f64, String> {
    let f: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if f == 0.0 || (f > 1.0 && f <= 1000.0) {
        Ok(f)
    } else {
        Err(format!("{s}: use 0 (off) or a factor above 1, such as 2"))
    }
}

/// `cipher = "..."` in the --config file: the same spellings as `--cipher`.
fn cipher_from_toml<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<CipherChoice>, D::Error> {
    let s = String::deserialize(d)?;
    CipherChoice::from_str(&s, false).map(Some).map_err(|_| {
        serde::de::Error::custom(format!(
            "unknown cipher {s:?}: auto, aes-256-gcm or chacha20-poly1305"
        ))
    })
}

/// The payload-protection policy the flags (then the file) ask for.
/// `0.0.0.0:port`: what `--port` alone listens on.
fn any_address(port: u16) -> SocketAddr {
    SocketAddr::from(([0, 0, 0, 0], port))
}

fn protection_policy(flags: &Opts, file: &Opts) -> ProtectionPolicy {
    if flags.no_payload_protection || file.no_payload_protection {
        return ProtectionPolicy::off();
    }
    let ciphers = flags.cipher.or(file.cipher).unwrap_or_default().ciphers();
    ProtectionPolicy::new(ciphers, flags.allow_unprotected || file.allow_unprotected)
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create or extend the deployment's certificates
    #[command(subcommand)]
    Certs(CertsCommand),
}

#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Create a private CA and a server certificate
    Init {
        /// The server's directory: server certificate and key, the CA certificate (keys are
        /// written mode 0600)
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// Where the CA key goes (mode 0700), away from the server's files: whoever reads it
        /// can mint any identity [default: the sibling DIR-ca]
        #[arg(long, value_name = "DIR")]
        ca_dir: Option<PathBuf>,
        /// Server name or IP address the certificate is valid for; repeatable
        /// [default: localhost, 127.0.0.1, ::1 and every address of this host]
        #[arg(long = "san", value_name = "NAME")]
        sans: Vec<String>,
    },
    /// Issue a client certificate; NAME is the client's identity (tenant), or with --spiffe-id
    /// the certificate is an X509-SVID known by that SPIFFE ID
    Client {
        /// Identity: letters, digits, '-', '_', '.' (also the file names NAME.pem, NAME.key)
        name: String,
        /// Also put this SPIFFE ID (spiffe://trust-domain/path) in the certificate as its one
        /// URI SAN: a server taking identities from SPIFFE IDs (the default) knows the client by
        /// it, in logs, metrics and quotas
        #[arg(long, value_name = "ID", value_parser = parse_spiffe_id)]
        spiffe_id: Option<SpiffeId>,
        /// The server's directory; NAME.pem and NAME.key are written there
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// The CA directory (ca.pem, ca.key) [default: DIR-ca, else DIR]
        #[arg(long, value_name = "DIR")]
        ca_dir: Option<PathBuf>,
    },
    /// Revoke client NAME's certificate: it is added to DIR/crl.pem, which a running server
    /// reloads within a second: NAME's live sessions end (the client is told "certificate
    /// revoked" and exits 4) and NAME is refused at TLS from then on
    Revoke {
        /// The identity to revoke
        name: String,
        /// The server's directory (holds NAME.pem; crl.pem is written there)
        #[arg(long, default_value = "certs")]
        dir: PathBuf,
        /// The CA directory (ca.pem, ca.key) [default: DIR-ca, else DIR]
        #[arg(long, value_name = "DIR")]
        ca_dir: Option<PathBuf>,
    },
}

/// `--spiffe-id`: a SPIFFE ID, or why not.
fn parse_spiffe_id(text: &str) -> Result<SpiffeId, String> {
    text.parse().map_err(|e| format!("not a SPIFFE ID: {e}"))
}

/// `--trust-domain`: a SPIFFE trust domain name, or why not.
fn parse_trust_domain(text: &str) -> Result<String, String> {
    match SpiffeId::parse(&format!("spiffe://{text}")) {
        Ok(id) if id.path().is_empty() => Ok(text.to_owned()),
        Ok(_) => Err("a trust domain, not a SPIFFE ID: no '/'".to_owned()),
        Err(e) => Err(format!("not a SPIFFE trust domain: {e}")),
    }
}

/// The CA directory: the one given, else DIR-ca, else DIR itself (the layout of `certs::init`).
fn ca_dir_of(dir: &Path, given: Option<PathBuf>) -> PathBuf {
    given.unwrap_or_else(|| {
        let sibling = certs::default_ca_dir(dir);
        if certs::ca_paths(&sibling).key.exists() {
            sibling
        } else {
            dir.to_owned()
        }
    })
}

fn load_config(path: &Path) -> Result<Opts> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

fn certs_command(cmd: CertsCommand) -> Result<()> {
    match cmd {
        CertsCommand::Init { dir, ca_dir, sans } => {
            let sans = if sans.is_empty() {
                certs::default_sans()
            } else {
                sans
            };
            let ca_dir = ca_dir.unwrap_or_else(|| certs::default_ca_dir(&dir));
            let made = certs::init_with_ca_dir(&dir, &ca_dir, &sans).map_err(hints::cert_error)?;
            println!(
                "CA:     {} (key {})",
                made.ca.cert.display(),
                made.ca.key.display()
            );
            println!(
                "server: {} (key {})",
                made.server.cert.display(),
                made.server.key.display()
            );
            println!("server names: {}", made.sans.join(", "));
            println!(
                "next: secure-server certs client NAME --dir {}",
                dir.display()
            );
        }
        CertsCommand::Revoke { name, dir, ca_dir } => {
            let ca_dir = ca_dir_of(&dir, ca_dir);
            let done = certs::revoke(&ca_dir, &dir, &name).map_err(hints::cert_error)?;
            println!(
                "revoked {name}: {} now lists {} certificate(s); a running server ends {name}'s sessions within a second and refuses {name} from then on",
                done.crl.display(),
                done.count
            );
        }
        CertsCommand::Client {
            name,
            dir,
            ca_dir,
            spiffe_id,
        } => {
            let ca_dir = ca_dir_of(&dir, ca_dir);
            let pair = certs::issue_client_with_spiffe_id(&ca_dir, &dir, &name, spiffe_id.as_ref())
                .map_err(hints::cert_error)?;
            println!(
                "client {name}: {} (key {})",
                pair.cert.display(),
                pair.key.display()
            );
            if let Some(id) = &spiffe_id {
                println!("identity: {id} (the SPIFFE ID of this X509-SVID)");
            }
            println!(
                "connect with: secure-client HOST --certs {} --name {name}",
                dir.display()
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    // The hidden `--generate-docs DIR`: man pages and completions for the package.
    rdma_cli::docs::generate_if_asked(<Cli as clap::CommandFactory>::command);
    let cli = Cli::parse();
    logging::init(cli.opts.log_format, "info");
    let result = match cli.command {
        Some(Command::Certs(cmd)) => certs_command(cmd),
        None => serve(cli.opts).await,
    };
    if let Err(e) = result {
        eprintln!("secure-server: error: {e:#}");
        std::process::exit(1);
    }
}

async fn serve(flags: Opts) -> Result<()> {
    let file = match &flags.config {
        Some(path) => load_config(path)?,
        None => Opts::default(),
    };
    let protection = protection_policy(&flags, &file);
    let mut limits = Limits::default();
    limits.max_pending = flags
        .max_pending
        .or(file.max_pending)
        .unwrap_or(limits.max_pending);
    limits.max_pending_per_address = flags
        .max_pending_per_address
        .or(file.max_pending_per_address)
        .unwrap_or(limits.max_pending_per_address);
    let max_per_prefix = flags
        .max_pending_per_prefix
        .or(file.max_pending_per_prefix)
        .map_or(limits.max_pending_per_prefix, |n| n as usize);
    // The file's values are not range-checked by clap: PrefixLengths::new says which is wrong.
    let prefix = PrefixLengths::new(
        flags
            .pending_prefix_v4
            .or(file.pending_prefix_v4)
            .unwrap_or(limits.pending_prefix.v4),
        flags
            .pending_prefix_v6
            .or(file.pending_prefix_v6)
            .unwrap_or(limits.pending_prefix.v6),
    )
    .context("pending-prefix-v4/-v6")?;
    limits.max_pending_per_prefix = max_per_prefix;
    limits.pending_prefix = prefix;
    limits.write_timeout = flags
        .write_timeout
        .or(file.write_timeout)
        .map_or(limits.write_timeout, |s| Duration::from_secs(s.max(1)));
    limits.max_sessions_per_identity = flags
        .max_sessions_per_identity
        .or(file.max_sessions_per_identity);
    limits.max_session_lifetime = flags
        .max_session_lifetime
        .or(file.max_session_lifetime)
        .map(|s| Duration::from_secs(s.max(1)));
    let allow_gid_mismatch = flags.allow_gid_mismatch || file.allow_gid_mismatch;
    let shared_receive_queue = flags
        .shared_receive_queue
        .or(file.shared_receive_queue)
        .unwrap_or(0);
    if shared_receive_queue > 0 && (flags.no_memory_windows || file.no_memory_windows) {
        // Sessions on one shared queue share its protection domain: a region's own rkey
        // would let any of them write into another's memory.
        bail!(
            "--shared-receive-queue needs memory windows: sessions on it share one protection domain, \
             where a write region's own rkey (--no-memory-windows) would reach every session's memory"
        );
    }
    let given_dir = flags.certs.or(file.certs);
    let dir = given_dir.clone().unwrap_or_else(|| PathBuf::from("certs"));
    let ca = certs::ca_paths(&dir);
    let server = certs::server_paths(&dir);
    // Files of any PKI override the directory's, one by one.
    let (ca_file, cert_file, key_file) = (
        flags.ca.or(file.ca),
        flags.cert.or(file.cert),
        flags.key.or(file.key),
    );
    let all_explicit = ca_file.is_some() && cert_file.is_some() && key_file.is_some();
    let ca_file = ca_file.unwrap_or_else(|| ca.cert.clone());
    let cert_file = cert_file.unwrap_or_else(|| server.cert.clone());
    let key_file = key_file.unwrap_or_else(|| server.key.clone());
    // A CRL beside the directory's files unless the files came from elsewhere entirely.
    let crl_file = flags
        .crl
        .or(file.crl)
        .or_else(|| (given_dir.is_some() || !all_explicit).then(|| certs::crl_path(&dir)));
    // Never invent a new CA: a typo in --certs would otherwise start a server that trusts
    // nobody's existing certificates, silently.
    let missing: Vec<String> = [&ca_file, &cert_file, &key_file]
        .into_iter()
        .filter(|p| !p.exists())
        .map(|p| p.display().to_string())
        .collect();
    if !missing.is_empty() && all_explicit {
        bail!(
            "missing {}: --ca, --cert and --key name the CA bundle, the server certificate and its key",
            missing.join(", ")
        );
    }
    if !missing.is_empty() {
        bail!(
            "no usable certificates in {dir}: missing {missing}. Create them with `secure-server certs init --dir {dir}`, \
             then a client certificate with `secure-server certs client NAME --dir {dir}`",
            dir = dir.display(),
            missing = missing.join(", ")
        );
    }
    if !all_explicit && ca.key.exists() {
        tracing::warn!(
            key = %ca.key.display(),
            "the CA key sits next to the server's files: whoever can read them can mint any client identity; keep it elsewhere (secure-server certs init --ca-dir)"
        );
    }
    // A flag wins over the file, and within each an explicit address wins over a bare port.
    let listen = flags
        .listen
        .or(flags.port.map(any_address))
        .or(file.listen)
        .or(file.port.map(any_address))
        .unwrap_or_else(|| any_address(4433));
    // The certificates of `dir`: ca.pem, server.pem, server.key and crl.pem, as checked above.
    // The file's trust domains are checked as the flag's are.
    let trust_domains = if flags.trust_domain.is_empty() {
        file.trust_domain
            .iter()
            .map(|td| {
                parse_trust_domain(td).map_err(|e| anyhow::anyhow!("trust-domain {td:?}: {e}"))
            })
            .collect::<Result<Vec<_>>>()?
    } else {
        flags.trust_domain
    };
    let mut config = ServerConfig::new(listen, &dir)
        .with_certificate_files(ca_file, cert_file, key_file)
        .with_crl(crl_file)
        .with_identity(
            flags
                .identity
                .or(file.identity)
                .map_or_else(IdentitySource::default, IdentitySource::from),
        )
        .with_spiffe_trust_domains(trust_domains)
        .with_max_clients(flags.max_clients.or(file.max_clients).unwrap_or(10))
        .with_device(flags.device.or(file.device))
        .with_gid_index(flags.gid_index.or(file.gid_index))
        .with_buffer_size(flags.buffer_size.or(file.buffer_size).unwrap_or(4096))
        .with_handshake_timeout(Duration::from_secs(
            flags
                .handshake_timeout
                .or(file.handshake_timeout)
                .unwrap_or(10)
                .max(1),
        ))
        .with_idle_timeout(Duration::from_secs(
            flags.idle_timeout.or(file.idle_timeout).unwrap_or(300),
        ))
        .with_quotas(quotas(
            flags.quota.or(file.quota),
            file.limit.iter().chain(&flags.limit),
        )?)
        .with_protection(protection)
        .with_allow_gid_mismatch(allow_gid_mismatch)
        .with_memory_windows(!(flags.no_memory_windows || file.no_memory_windows))
        .with_writes_on_demand(!(flags.writes_at_setup || file.writes_at_setup))
        .with_max_lanes_per_identity(
            flags
                .max_lanes_per_identity
                .or(file.max_lanes_per_identity)
                .map_or(secure_rdma::lanes::DEFAULT_MAX_LANES_PER_IDENTITY, |n| {
                    n as usize
                }),
        )
        .with_warm_pool(flags.warm_pool.or(file.warm_pool).unwrap_or(0) as usize)
        .with_shared_receive_queue(shared_receive_queue as usize)
        .with_setup_watch(SetupWatchConfig::new(
            flags
                .setup_slow_window
                .or(file.setup_slow_window)
                .unwrap_or(20)
                .max(1) as usize,
            // The config file's value gets the flag's check.
            match flags.setup_slow_factor.or(file.setup_slow_factor) {
                Some(f) => parse_slow_factor(&f.to_string())
                    .map_err(|e| anyhow::anyhow!("setup-slow-factor {e}"))?,
                None => 2.0,
            },
        ))
        .with_limits(limits)
        .with_poll(flags.poll.or(file.poll).unwrap_or_default())
        .with_resume_window(Duration::from_secs(
            flags.resume_window.or(file.resume_window).unwrap_or(120),
        ))
        .with_rekey(
            RekeyPolicy::default()
                .with_messages(
                    (flags.rekey_after.or(file.rekey_after))
                        .unwrap_or(RekeyPolicy::DEFAULT_MESSAGES),
                )
                .with_bytes(
                    (flags.rekey_after_bytes.or(file.rekey_after_bytes))
                        .unwrap_or(RekeyPolicy::DEFAULT_BYTES),
                )
                .with_seconds(
                    (flags.rekey_after_seconds.or(file.rekey_after_seconds))
                        .unwrap_or(RekeyPolicy::DEFAULT_SECONDS),
                ),
        );
    // The server's counts, shared with telemetry (started before the server binds).
    let server_metrics = ServerMetrics::default();
    // Without payload protection there are no keys to rotate.
    if !config.protection.ciphers.is_empty() {
        if config.rekey.is_off() {
            tracing::warn!("payload keys never rotate (--rekey-after, --rekey-after-bytes and --rekey-after-seconds all 0): a long session can pass the AEAD usage limits");
        } else {
            tracing::info!(rekey = %config.rekey, "payload keys rotate");
        }
    }
    if config.protection.ciphers.is_empty() {
        tracing::warn!("payload protection is OFF (--no-payload-protection): an on-path attacker can forge, replay and read RDMA messages");
    }
    let metrics = flags.metrics.or(file.metrics);
    if flags.telemetry || file.telemetry || metrics.is_some() {
        // Telemetry reports the server's own counts too, so it always has quotas (maybe empty).
        let quotas = config
            .quotas
            .get_or_insert_with(|| Quotas::new(QuotaConfig::default()))
            .clone();
        let every = Duration::from_secs(
            flags
                .telemetry_interval
                .or(file.telemetry_interval)
                .unwrap_or(10)
                .max(1),
        );
        telemetry::start(quotas, every, metrics, server_metrics.clone()).await?;
    }
    let max = config.max_clients;
    let srv = Server::bind(config)
        .await
        .map_err(hints::server_error)?
        .with_metrics(server_metrics);
    tracing::info!(listen = %srv.local_addr()?, max_clients = max, "secure-server ready");
    srv.run(shutdown_signal()).await;
    Ok(())
}

/// The thresholds of `--quota FILE` and `--limit` settings (later ones win);
/// `None` when neither is given.
fn quotas<'a>(
    file: Option<PathBuf>,
    limits: impl Iterator<Item = &'a String>,
) -> Result<Option<Quotas>> {
    let limits: Vec<LimitSetting> = limits
        .map(|l| l.parse().with_context(|| format!("--limit {l}")))
        .collect::<Result<_>>()?;
    if file.is_none() && limits.is_empty() {
        return Ok(None);
    }
    let mut config = match &file {
        Some(path) => QuotaConfig::load(path)?,
        None => QuotaConfig::default(),
    };
    for setting in &limits {
        config.apply(setting);
    }
    for setting in config.entries() {
        tracing::info!(%setting, "quota");
    }
    Ok(Some(Quotas::new(config)))
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::warn!("cannot install signal handlers; stop with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = int.recv() => tracing::info!("SIGINT received"),
    }
}
