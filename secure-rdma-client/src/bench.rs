//! `secure-client HOST bench …`: connection setup, latency, bandwidth and many sessions held,
//! measured from one process with one RDMA device opened once ([`Connector`]).
//!
//! What a latency is: perftest's `ib_send_lat`/`ib_write_lat` report half the round trip of a
//! ping-pong between the two ends. Ours is the same ping-pong on the streaming data path
//! (`--acks rdma`, the default): the client's SEND (or WRITE WITH IMMEDIATE), sealed when
//! payloads are protected, and the server's acknowledgement SENT back over RDMA once it has
//! verified and consumed the message (sealed too). `latency_us` is half of that round trip, per
//! iteration, so it compares directly with perftest's figure; what is left between them is the
//! cost of the secure protocol (sealing, verifying, the server's bookkeeping). `--acks tls` has
//! the acknowledgement come over TLS instead, as the interactive client does.
//!
//! Bandwidth: `iters` operations with up to `window` unacknowledged (on the streaming data path:
//! at most the server's window, 16), each in its own send slot here and its own receive or
//! write slot at the server; the server's acknowledgements are the credits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::builder::{EnumValueParser, TypedValueParser};
use clap::{Args, Subcommand};
use futures_util::stream::{self, StreamExt};
use rdma_cli::choices::PollMode;
use secure_rdma::client::{Client, Connector, LaneOpened, Phases};
use secure_rdma::datapath::{Ack, AckStatus, Op};
use secure_rdma::protect::{Cipher, Opener, Sealer, KEY_LEN, OVERHEAD};
use secure_rdma::verbs::Poll;

use crate::errors::{Hinted, Shown};
use serde::Serialize;

/// Operations a server lets a streaming client have unacknowledged
/// ([`secure_rdma::server::RDMA_WINDOW`]).
pub const MAX_WINDOW: usize = secure_rdma::server::RDMA_WINDOW;

/// How the server acknowledges operations in `bench send|write`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Acks {
    /// Over RDMA, sealed: the streaming data path, a window of operations in flight
    Rdma,
    /// Over TLS, one operation at a time (the interactive client's path)
    Tls,
}

/// `bench` and its measurements.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// What to measure
    #[command(subcommand)]
    pub kind: Bench,
    /// Print one JSON object instead of text
    #[arg(long, global = true)]
    pub json: bool,
}

/// One benchmark.
#[derive(Debug, Clone, Subcommand)]
pub enum Bench {
    /// N whole secure connections (TCP + TLS, admission, RDMA setup, confirmation), each quit
    /// after it is confirmed; timing per connection and per phase
    Connect {
        /// Connections in all
        #[arg(
            short = 'n',
            long = "connections",
            value_name = "N",
            default_value_t = 100
        )]
        n: usize,
        /// Connections in flight at once (the server allows 8 pending per address by default)
        // No -c: across the project's tools -c is rdma-capture's packet count.
        #[arg(long, value_name = "N", default_value_t = 1)]
        concurrency: usize,
        /// Lanes per connection: each connection also opens N-1 more lanes on its live session
        /// (over its TLS connection, no new TCP or TLS handshake), timed apart from a new
        /// connection (lanes_us in the report). The server's --max-lanes-per-identity must
        /// allow concurrency x N
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65))]
        lanes: u32,
        /// The warm path: this client keeps RDMA resources ready for its next connections and
        /// lanes (--warm-pool of them, 8 if that is not given), full before the clock starts,
        /// so each only connects a ready QP; start the server with --warm-pool for its half.
        /// The report says how many connections found a ready resource (warm in the report)
        #[arg(long)]
        warm: bool,
    },
    /// RDMA SEND ping-pongs (latency) and a stream of SENDs (bandwidth) over one session
    Send(DataArgs),
    /// RDMA WRITE WITH IMMEDIATE ping-pongs and a stream of them over one session
    Write(DataArgs),
    /// Open N sessions, hold them all at once, then SEND one 64-byte message on each: report
    /// how many were established and delivered their message, the time it took and this
    /// process's memory
    Hold {
        /// Sessions to hold
        #[arg(
            short = 'n',
            long = "sessions",
            value_name = "N",
            default_value_t = 100
        )]
        n: usize,
        /// Connections in flight at once while opening them
        #[arg(long, value_name = "N", default_value_t = 8)]
        concurrency: usize,
        /// Seconds to hold them once all are open
        #[arg(long, value_name = "SECONDS", default_value_t = 0)]
        hold: u64,
    },
}

/// Sizes and counts of `bench send` and `bench write`.
#[derive(Debug, Clone, Args)]
pub struct DataArgs {
    /// Payload bytes per operation (at most the server's buffer size)
    #[arg(short = 's', long, value_name = "BYTES", default_value_t = 64)]
    pub size: usize,
    /// Operations per measurement (latency, then bandwidth)
    #[arg(short = 'n', long, value_name = "N", default_value_t = 1000)]
    pub iters: usize,
    /// Operations unacknowledged at once in the bandwidth run (at most 16; 1 with --acks tls)
    #[arg(long, value_name = "W", default_value_t = MAX_WINDOW)]
    pub window: usize,
    /// How RDMA completions are awaited
    #[arg(long, value_name = "MODE", default_value = "event",
          value_parser = EnumValueParser::<PollMode>::new().map(Poll::from))]
    pub poll: Poll,
    /// How the server acknowledges each operation
    #[arg(long, value_enum, default_value_t = Acks::Rdma)]
    pub acks: Acks,
}

impl Bench {
    /// Whether this benchmark asks for the streaming data path.
    pub fn rdma_acks(&self) -> bool {
        matches!(self, Bench::Send(a) | Bench::Write(a) if a.acks == Acks::Rdma)
            || matches!(self, Bench::Connect { lanes, .. } if *lanes > 1)
    }
}

/// p50, p99 and mean of a set of samples, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Summary {
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Summary {
    /// The summary of `samples` (microseconds); zeros when there are none.
    pub fn of(samples: &[f64]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let i = ((q * s.len() as f64).ceil() as usize).clamp(1, s.len());
            round(s[i - 1])
        };
        Summary {
            p50: rank(0.50),
            p99: rank(0.99),
            mean: round(s.iter().sum::<f64>() / s.len() as f64),
        }
    }
}

/// Two decimals: more is noise.
fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// `bench connect`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConnectReport {
    /// Connections made.
    pub connections: usize,
    /// Connections in flight at once.
    pub concurrency: usize,
    /// The connection made before the N: device opened, TLS configuration built, a full TLS
    /// handshake (the N resume its session).
    pub first_connection_us: f64,
    /// How many of the N resumed a TLS session.
    pub tls_resumed: usize,
    /// How many of the N sent a warm QP's endpoint with their hello and had the server take
    /// it (`--setup early`, the default, with a warm pool): no TLS message after the accept.
    pub early_setups: usize,
    /// Whole connection, TCP connect to confirmed.
    pub per_connection_us: Summary,
    /// Each phase of it.
    pub phases_us: PhaseSummaries,
    /// Wall time of the whole run.
    pub total_ms: f64,
    /// Connections per second over the whole run (N over its wall time): with `--concurrency
    /// C`, what C clients in flight at once achieve together.
    pub connections_per_s: f64,
    /// Everything after TCP + TLS (admission, RDMA setup, confirmation), per connection: what
    /// compares with an rdma_cm connection.
    pub after_tls_us: Summary,
    /// With `--lanes N` above 1: the extra lanes opened on each live session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lanes: Option<LanesReport>,
    /// With `--warm`: how the warm pool served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmReport>,
}

/// The warm path of `bench connect --warm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct WarmReport {
    /// Resources kept ready.
    pub pool: usize,
    /// Connections (of the N) whose resources were ready.
    pub warm_connections: usize,
    /// Extra lanes whose resources were ready.
    pub warm_lanes: usize,
    /// Takes that found none ready (that connection or lane made its own).
    pub missed: u64,
    /// Ready resources found unusable and freed.
    pub discarded: u64,
    /// Resources the pool made in all (before and during the run).
    pub made: u64,
}

/// The extra lanes of `bench connect --lanes N`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LanesReport {
    /// Lanes per connection, its first included.
    pub per_connection: u32,
    /// Extra lanes opened in all.
    pub opened: usize,
    /// One extra lane, request to confirmed.
    pub lane_us: Summary,
    /// Its setup: our QP made, request and answer over TLS, our QP in RTS.
    pub setup_us: Summary,
    /// Of the setup: our PD, CQs, MRs and QP made.
    pub prepare_us: Summary,
    /// Of the setup: request to answer (a TLS round trip and the server's QP made, in RTS).
    pub answer_us: Summary,
    /// Its confirmation: the tokens over the lane's QP.
    pub confirmation_us: Summary,
    /// Mean extra lane over mean new connection.
    pub lane_per_connection: f64,
}

/// [`Phases`] summarized over the connections.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PhaseSummaries {
    /// TCP connect and TLS 1.3 handshake.
    pub tcp_tls: Summary,
    /// Hello to the server's verdict.
    pub admission: Summary,
    /// Device, PD, CQs, MRs, QP, endpoints exchanged, RTS.
    pub rdma_setup: Summary,
    /// Tokens over RDMA (and, without the early endpoint, the confirmations over TLS).
    pub confirmation: Summary,
}

/// `bench send` and `bench write`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DataReport {
    /// "send" or "write".
    pub op: &'static str,
    /// Payload bytes per operation.
    pub size: usize,
    /// Operations per measurement.
    pub iters: usize,
    /// Outstanding operations in the bandwidth run.
    pub window: usize,
    /// "busy" or "event".
    pub poll: &'static str,
    /// "rdma" (the streaming data path) or "tls".
    pub acks: &'static str,
    /// The payload cipher, or "none".
    pub protection: String,
    /// Half the round trip of one ping-pong (see the module docs).
    pub latency_us: Summary,
    /// Payload megabytes (10^6 bytes) per second with `window` outstanding.
    pub bandwidth_mb_s: f64,
    /// The cipher's own cost in this process, when payloads were protected: what protection
    /// would cost if it cost nothing but its cryptography.
    pub aead: Option<AeadCost>,
}

/// Seal + open of one message with the session's cipher, timed in this process after the
/// session ended: the CPU cost of protection alone, measured on the same (virtual) CPU as the
/// end-to-end numbers beside it, so what protection adds end to end can be set against it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AeadCost {
    /// The cipher, as the session negotiated it.
    pub cipher: String,
    /// Messages timed per size.
    pub iters: usize,
    /// Seal + open of one message of the benchmark's size, µs.
    pub seal_open_us: Summary,
    /// Seal + open of one acknowledgement (the server's 14-byte record), µs: a ping-pong pays
    /// one of these beside each message.
    pub ack_seal_open_us: Summary,
    /// The median seal + open of the benchmark's size per payload byte, ns.
    pub ns_per_byte: f64,
}

/// Times `iters` seals and opens of `size` bytes (and of an acknowledgement) with `cipher`, as
/// the session's two ends do them: the sender seals into a buffer of the slot's size, the
/// receiver opens in place, both keeping their sequence in step.
pub fn aead_cost(cipher: Cipher, op: Op, size: usize, iters: usize) -> AeadCost {
    fn time(cipher: Cipher, op: Op, size: usize, iters: usize) -> Summary {
        // A fixed key: the cost does not depend on the key, and no message leaves the process.
        let key = [0x42u8; KEY_LEN];
        let mut sealer = Sealer::new(cipher, &key);
        let mut opener = Opener::new(cipher, &key);
        let plain = vec![0x5au8; size];
        let mut wire = vec![0u8; size + OVERHEAD];
        let mut samples = Vec::with_capacity(iters);
        for i in 0..WARMUP + iters {
            let t = Instant::now();
            let opened = sealer
                .seal(op, std::hint::black_box(&plain), &mut wire)
                .ok()
                .and_then(|n| opener.open(op, &mut wire[..n]).ok().map(<[u8]>::len));
            let took = us(t.elapsed());
            // Sealing into a buffer sized for it, then opening with the same key and sequence,
            // cannot fail; if it ever did, the timing would not be of a seal and an open.
            debug_assert_eq!(opened, Some(size));
            if i >= WARMUP {
                samples.push(took);
            }
        }
        Summary::of(&samples)
    }
    let seal_open_us = time(cipher, op, size, iters);
    AeadCost {
        cipher: cipher.to_string(),
        iters,
        ack_seal_open_us: time(cipher, Op::Send, Ack::WIRE_LEN, iters),
        ns_per_byte: round(seal_open_us.p50 * 1000.0 / size.max(1) as f64),
        seal_open_us,
    }
}

/// `bench hold`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HoldReport {
    /// Sessions asked for.
    pub requested: usize,
    /// Sessions confirmed and held at once.
    pub established: usize,
    /// Sessions that failed to connect.
    pub failed: usize,
    /// The first failure, if any.
    pub first_error: Option<String>,
    /// Wall time to open them all.
    pub setup_ms: f64,
    /// This process's resident memory with all of them held.
    pub rss_kib: u64,
    /// Resident memory before the first connection.
    pub rss_before_kib: u64,
    /// (rss_kib - rss_before_kib) / established.
    pub rss_per_session_kib: f64,
    /// What this process's memory growth with all sessions held is made of, KiB per held
    /// session (each kind's growth since before the first connection, so the kinds add up to
    /// `rss_per_session_kib`): `rdma_queues` (rxe's CQ and QP rings, mapped from the uverbs
    /// device), `anonymous` (the heap: registered slots, TLS and session state), `other` (the
    /// binary, libraries, stacks).
    pub per_session_kib_by_kind: BTreeMap<&'static str, f64>,
    /// Held sessions whose one message at the end the server acknowledged as delivered: each
    /// was in RTS and confirmed all along, not just opened.
    pub delivered: usize,
    /// The lowest-numbered held session that did not deliver, and why.
    pub first_undelivered: Option<String>,
    /// Held sessions set up with the early endpoint (a warm QP's endpoint in the hello, taken
    /// by the server: `--warm-pool`, `--setup early`).
    pub early_setups: usize,
}

/// This process's resident set size (`VmRSS` in /proc/self/status), 0 if unknown.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// This process's resident memory by kind of mapping (`/proc/self/smaps`), KiB: rxe's queues
/// mapped from the uverbs device, anonymous memory, and the rest. Empty if unreadable.
pub fn rss_by_kind() -> BTreeMap<&'static str, u64> {
    let mut by_kind = BTreeMap::new();
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return by_kind;
    };
    let mut kind = "other";
    for line in smaps.lines() {
        if let Some(kib) = line.strip_prefix("Rss:") {
            let kib: u64 = kib
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            *by_kind.entry(kind).or_insert(0) += kib;
        } else if line
            .split_whitespace()
            .next()
            .is_some_and(|f| f.contains('-') && !f.ends_with(':'))
        {
            // A mapping's header: "start-end perms offset dev inode [path]".
            let path = line.split_whitespace().nth(5).unwrap_or("");
            kind = match path {
                p if p.starts_with("/dev/infiniband/") => "rdma_queues",
                "" | "[heap]" => "anonymous",
                _ => "other",
            };
        }
    }
    by_kind
}

/// Raises the soft open-file limit to the hard one: every session holds a TCP socket and two
/// completion channels, so 1000 sessions need about 3000 descriptors (the soft default is
/// often 1024).
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                tracing::warn!("could not raise the open-file limit");
            }
        }
    }
}

/// Runs one benchmark; the report is printed by the caller.
pub async fn run(connector: &Connector, bench: &Bench) -> Result<serde_json::Value> {
    Ok(match bench {
        Bench::Connect {
            n,
            concurrency,
            lanes,
            warm,
        } => serde_json::to_value(connect(connector, *n, *concurrency, *lanes, *warm).await?)?,
        Bench::Send(a) => serde_json::to_value(data(connector, Op::Send, a).await?)?,
        Bench::Write(a) => serde_json::to_value(data(connector, Op::Write, a).await?)?,
        Bench::Hold {
            n,
            concurrency,
            hold: secs,
        } => serde_json::to_value(hold(connector, *n, *concurrency, *secs).await?)?,
    })
}

/// Checks what clap cannot: ranges that depend on each other.
pub fn validate(bench: &Bench) -> Result<(), String> {
    match bench {
        Bench::Connect { n, concurrency, .. } | Bench::Hold { n, concurrency, .. } => {
            if *n == 0 || *concurrency == 0 {
                return Err("-n and -c must be at least 1".into());
            }
        }
        Bench::Send(a) | Bench::Write(a) => {
            if a.iters == 0 || a.window == 0 {
                return Err("-n and --window must be at least 1".into());
            }
            if a.acks == Acks::Rdma && a.window > MAX_WINDOW {
                return Err(format!(
                    "--window {} exceeds the {MAX_WINDOW} operations a server lets a client have unacknowledged",
                    a.window
                ));
            }
            if a.acks == Acks::Tls && a.window > 1 {
                return Err("--acks tls acknowledges one operation at a time: --window 1 (or --acks rdma for a window)".into());
            }
        }
    }
    Ok(())
}

async fn connect(
    connector: &Connector,
    n: usize,
    concurrency: usize,
    lanes: u32,
    warm: bool,
) -> Result<ConnectReport> {
    raise_fd_limit();
    // The first connection opens the device, builds the TLS configuration and makes the full
    // TLS handshake (later ones resume its session): reported on its own, like cmtime, which
    // opens its devices before it starts the clock.
    let t = Instant::now();
    let (first, _) = connector
        .connect_timed()
        .await
        .map_err(Hinted)
        .context("the first connection")?;
    let first_connection_us = us(t.elapsed());
    first.quit().await;
    // The first connection started the warm pool: full before the clock starts, as cmtime's
    // devices are open before its clock starts.
    if warm {
        connector.warm_stats(Some(Duration::from_secs(60)));
    }
    let started = Instant::now();
    let results: Vec<Result<(Duration, Phases, Vec<LaneOpened>)>> = stream::iter(0..n)
        .map(|i| async move {
            let t = Instant::now();
            let (mut client, phases) = connector
                .connect_timed()
                .await
                .map_err(Hinted)
                .with_context(|| format!("connection {i}"))?;
            let whole = t.elapsed();
            let mut opened = Vec::new();
            for lane in 1..lanes {
                opened.push(
                    client
                        .add_lane()
                        .await
                        .map_err(Hinted)
                        .with_context(|| format!("lane {lane} of connection {i}"))?,
                );
            }
            client.quit().await;
            Ok((whole, phases, opened))
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let total = started.elapsed();
    let mut whole = Vec::with_capacity(n);
    let mut phases: [Vec<f64>; 4] = Default::default();
    let (mut tls_resumed, mut early_setups) = (0, 0);
    let mut lane_samples: [Vec<f64>; 5] = Default::default();
    let mut after_tls = Vec::with_capacity(n);
    let (mut warm_connections, mut warm_lanes) = (0, 0);
    for r in results {
        let (w, p, opened) = r?;
        warm_connections += usize::from(p.warm);
        for l in opened {
            warm_lanes += usize::from(l.warm);
            lane_samples[0].push(us(l.took));
            lane_samples[1].push(us(l.setup));
            lane_samples[2].push(us(l.confirmation));
            lane_samples[3].push(us(l.prepare));
            lane_samples[4].push(us(l.answer));
        }
        tls_resumed += usize::from(p.tls_resumed);
        early_setups += usize::from(p.early);
        whole.push(us(w));
        phases[0].push(us(p.tcp_tls));
        phases[1].push(us(p.admission));
        phases[2].push(us(p.rdma_setup));
        phases[3].push(us(p.confirmation));
        after_tls.push(us(p.admission + p.rdma_setup + p.confirmation));
    }
    Ok(ConnectReport {
        connections: n,
        concurrency,
        first_connection_us,
        tls_resumed,
        early_setups,
        per_connection_us: Summary::of(&whole),
        phases_us: PhaseSummaries {
            tcp_tls: Summary::of(&phases[0]),
            admission: Summary::of(&phases[1]),
            rdma_setup: Summary::of(&phases[2]),
            confirmation: Summary::of(&phases[3]),
        },
        total_ms: round(total.as_secs_f64() * 1e3),
        // n is at least 1 (validated) and the run took time: no division by zero.
        connections_per_s: round(n as f64 / total.as_secs_f64().max(f64::MIN_POSITIVE)),
        after_tls_us: Summary::of(&after_tls),
        warm: warm.then(|| {
            let s = connector.warm_stats(None);
            WarmReport {
                pool: connector.config().warm_pool,
                warm_connections,
                warm_lanes,
                missed: s.missed,
                discarded: s.discarded,
                made: s.made,
            }
        }),
        lanes: (lanes > 1).then(|| {
            let lane_us = Summary::of(&lane_samples[0]);
            let per_connection = Summary::of(&whole);
            LanesReport {
                per_connection: lanes,
                opened: lane_samples[0].len(),
                lane_us,
                setup_us: Summary::of(&lane_samples[1]),
                prepare_us: Summary::of(&lane_samples[3]),
                answer_us: Summary::of(&lane_samples[4]),
                confirmation_us: Summary::of(&lane_samples[2]),
                lane_per_connection: round(
                    lane_us.mean / per_connection.mean.max(f64::MIN_POSITIVE),
                ),
            }
        }),
    })
}

/// Ping-pongs not counted: the first operations fault pages in and warm caches.
const WARMUP: usize = 10;

async fn one(client: &mut Client, op: Op, payload: &[u8]) -> Result<()> {
    match op {
        Op::Send => client.send(payload).await.map_err(Hinted)?,
        Op::Write => client.write(payload).await.map_err(Hinted)?,
    };
    Ok(())
}

async fn data(connector: &Connector, op: Op, a: &DataArgs) -> Result<DataReport> {
    let mut client = connector
        .connect()
        .await
        .map_err(Hinted)
        .context("connecting")?;
    client.session_mut().set_poll(a.poll);
    if a.acks == Acks::Rdma && client.rdma_window().is_none() {
        bail!("the server acknowledges over TLS only (an older secure-server): use --acks tls");
    }
    let window = a.window.min(client.rdma_window().unwrap_or(1));
    let max = match op {
        Op::Send => client.session().max_len(),
        Op::Write => client.session().max_write_len(),
    };
    if a.size > max {
        bail!(
            "-s {} exceeds the {max}-byte buffer the server offers (secure-server --buffer-size)",
            a.size
        );
    }
    let payload = vec![0x5au8; a.size];
    for _ in 0..WARMUP {
        one(&mut client, op, &payload).await?;
    }
    let mut half_rtt = Vec::with_capacity(a.iters);
    for _ in 0..a.iters {
        let t = Instant::now();
        one(&mut client, op, &payload).await?;
        half_rtt.push(us(t.elapsed()) / 2.0);
    }
    // Bandwidth: keep `window` operations unacknowledged; the acknowledgements are the credits.
    let started = Instant::now();
    let mut acked = 0;
    for _ in 0..a.iters {
        while client.in_flight() >= window {
            client.ack().await.map_err(Hinted)?;
            acked += 1;
        }
        acked += client.post(op, &payload).await.map_err(Hinted)?.len();
    }
    acked += client.flush().await.map_err(Hinted)?.len();
    let secs = started.elapsed().as_secs_f64();
    if acked != a.iters {
        bail!("{acked} acknowledgements for {} operations", a.iters);
    }
    let cipher = client.session().cipher();
    let protection = cipher.map_or("none".to_owned(), |c| c.to_string());
    client.quit().await;
    // After the session, so the timing shares the CPU with nothing of the benchmark's own.
    let aead = cipher.map(|c| aead_cost(c, op, a.size, a.iters));
    Ok(DataReport {
        op: match op {
            Op::Send => "send",
            Op::Write => "write",
        },
        size: a.size,
        iters: a.iters,
        window,
        poll: a.poll.name(),
        acks: match a.acks {
            Acks::Rdma => "rdma",
            Acks::Tls => "tls",
        },
        protection,
        latency_us: Summary::of(&half_rtt),
        bandwidth_mb_s: round((a.size * a.iters) as f64 / secs / 1e6),
        aead,
    })
}

async fn hold(
    connector: &Connector,
    n: usize,
    concurrency: usize,
    secs: u64,
) -> Result<HoldReport> {
    raise_fd_limit();
    let rss_before = rss_kib();
    let kinds_before = rss_by_kind();
    let started = Instant::now();
    let results: Vec<Result<(Client, bool), String>> = stream::iter(0..n)
        .map(|i| async move {
            connector
                .connect_timed()
                .await
                .map(|(client, phases)| (client, phases.early))
                .map_err(|e| format!("session {i}: {}", Shown(&e)))
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let setup = started.elapsed();
    let mut clients = Vec::with_capacity(n);
    let mut first_error = None;
    let (mut failed, mut early_setups) = (0, 0);
    for r in results {
        match r {
            Ok((c, early)) => {
                early_setups += usize::from(early);
                clients.push(c);
            }
            Err(e) => {
                failed += 1;
                first_error.get_or_insert(e);
            }
        }
    }
    let rss = rss_kib();
    let established = clients.len();
    let per_session_kib_by_kind = per_session_growth(&kinds_before, &rss_by_kind(), established);
    tokio::time::sleep(Duration::from_secs(secs)).await;
    // One message per held session, after the hold: a session that died while idle (its QP
    // in error, its TLS connection closed) shows here, not as a success.
    // Completed in any order (buffer_unordered): each outcome keeps its session's number.
    let outcomes: Vec<(usize, Result<(), String>)> = stream::iter(clients.into_iter().enumerate())
        .map(|(i, mut c)| async move {
            let sent = c.send(&[b'h'; 64]).await;
            c.quit().await;
            let outcome = match sent {
                Ok(ack) if ack.status == AckStatus::Delivered && ack.bytes == 64 => Ok(()),
                Ok(ack) => Err(format!("held session {i}: acknowledged as {ack:?}")),
                Err(e) => Err(format!("held session {i}: {}", Shown(&e))),
            };
            (i, outcome)
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let delivered = outcomes.iter().filter(|(_, o)| o.is_ok()).count();
    let first_undelivered = lowest_failure(outcomes);
    Ok(HoldReport {
        requested: n,
        established,
        failed,
        first_error,
        setup_ms: round(setup.as_secs_f64() * 1e3),
        rss_kib: rss,
        rss_before_kib: rss_before,
        rss_per_session_kib: if established == 0 {
            0.0
        } else {
            round(rss.saturating_sub(rss_before) as f64 / established as f64)
        },
        per_session_kib_by_kind,
        delivered,
        first_undelivered,
        early_setups,
    })
}

/// Each kind's growth from `before` to `after`, KiB per session over `sessions` (a kind that
/// shrank counts 0: the pre-session baseline belongs to no session).
fn per_session_growth(
    before: &BTreeMap<&'static str, u64>,
    after: &BTreeMap<&'static str, u64>,
    sessions: usize,
) -> BTreeMap<&'static str, f64> {
    after
        .iter()
        .map(|(&kind, &kib)| {
            let grown = kib.saturating_sub(before.get(kind).copied().unwrap_or(0));
            (kind, round(grown as f64 / sessions.max(1) as f64))
        })
        .collect()
}

/// The failure of the lowest-numbered session, whatever order the outcomes completed in.
fn lowest_failure(outcomes: Vec<(usize, Result<(), String>)>) -> Option<String> {
    outcomes
        .into_iter()
        .filter_map(|(i, o)| o.err().map(|e| (i, e)))
        .min_by_key(|(i, _)| *i)
        .map(|(_, e)| e)
}

/// The text form of a report: one `key value` line per leaf, for people.
pub fn text(v: &serde_json::Value) -> String {
    fn walk(prefix: &str, v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let key = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            other => out.push_str(&format!("{prefix} {other}\n")),
        }
    }
    let mut out = String::new();
    walk("", v, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_breakdown_counts_growth_not_the_baseline() {
        let before = BTreeMap::from([("anonymous", 2_000), ("other", 9_000)]);
        let after = BTreeMap::from([
            ("anonymous", 12_000),
            ("other", 8_000),
            ("rdma_queues", 4_400),
        ]);
        let per = per_session_growth(&before, &after, 100);
        // 10,000 KiB of new heap over 100 sessions; the binary's pages shrank (counted 0);
        // the rings are all new.
        assert_eq!(per["anonymous"], 100.0);
        assert_eq!(per["other"], 0.0);
        assert_eq!(per["rdma_queues"], 44.0);
        // No sessions: no division by zero.
        assert_eq!(
            per_session_growth(&before, &after, 0)["rdma_queues"],
            4_400.0
        );
    }

    #[test]
    fn the_first_undelivered_is_the_lowest_numbered_whatever_the_completion_order() {
        let outcomes = vec![
            (7, Err("held session 7: closed".to_owned())),
            (0, Ok(())),
            (3, Err("held session 3: timed out".to_owned())),
            (5, Ok(())),
        ];
        assert_eq!(
            lowest_failure(outcomes).as_deref(),
            Some("held session 3: timed out")
        );
        assert_eq!(lowest_failure(vec![(1, Ok(()))]), None);
    }
}
