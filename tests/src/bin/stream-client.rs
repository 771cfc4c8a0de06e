//! A stream of numbered operations through the library's `Client` alone, for the resume lab
//! tests (issue 20): `--ops` RDMA SENDs carrying `op-000001`, `op-000002`, … paced at `--rate`
//! per second with at most `--window` in flight, acknowledgements over RDMA. Lost sessions are
//! the library's to recover from (its transparent resume); this program only checks that every
//! acknowledgement it is handed is the next operation's, each once, and measures how long each
//! loss stalled the stream.
//!
//! Stderr: one JSON line per recovery step as the library reports it (`lost`, `retrying`,
//! `recovered`), and the library's warnings (`RUST_LOG`). Stdout: one JSON summary line at the
//! end ([`secure_rdma_tests::stream::StreamSummary`]). Exit status 0 only when every operation
//! was acknowledged exactly once, in order. With `--lanes N` the operations spread over N
//! lanes, each acknowledging its own in order and the lanes in no set order: the
//! acknowledgements are then counted, each a delivered SEND, not matched to an operation.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use secure_rdma::client::{
    Ack, Client, ClientError, Recovering, Recovery, ResumeEvent, ResumeOutcome,
};
use secure_rdma::datapath::{AckStatus, Op};
use secure_rdma_tests::stream::{op_content, Stats, StreamSummary};
use serde_json::json;

/// Stream client: numbered operations across lost sessions, checked and timed.
#[derive(Debug, Parser)]
struct Args {
    #[command(flatten)]
    client: secure_rdma_tests::LabClientArgs,
    /// Operations in all.
    #[arg(long, default_value_t = 1000)]
    ops: u64,
    /// Operations per second (0: as fast as the window allows).
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Operations in flight at most.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    window: u64,
    /// Operations posted together: the pace is kept per group (`--burst 16 --rate 200`: 16
    /// operations every 80 ms), leaving the link quiet between groups.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    burst: u64,
    /// Seconds each step may take (an acknowledgement, a connection) before the session is
    /// given up.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    /// Reconnect with a new stream and send every unacknowledged operation again (the
    /// at-least-once baseline) instead of resuming.
    #[arg(long)]
    no_resume: bool,
    /// Lanes of the session (`Client::add_lane`): the operations spread over them, each lane
    /// acknowledging its own in order, the lanes in no set order; the window counts them all.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=8))]
    lanes: u32,
    /// Ready QPs kept by the client (`ClientConfig::with_warm_pool`): its reconnects then send
    /// their endpoint with the hello (the early endpoint).
    #[arg(long, default_value_t = 0)]
    warm_pool: usize,
}

/// What the library told the recovery observer, with when.
#[derive(Default)]
struct Recoveries {
    /// When each loss was reported.
    lost: Vec<Instant>,
    /// Each recovery, in order.
    recovered: Vec<ResumeEvent>,
}

/// Starts recording (and printing) the library's recovery steps.
fn observe(client: &mut Client, start: Instant) -> Arc<Mutex<Recoveries>> {
    let shared = Arc::new(Mutex::new(Recoveries::default()));
    let sink = Arc::clone(&shared);
    client.on_recovery(move |step| {
        let at_ms = ms(start.elapsed());
        let line = match step {
            Recovering::Lost { cause } => {
                if let Ok(mut r) = sink.lock() {
                    r.lost.push(Instant::now());
                }
                json!({"lost": {"at_ms": at_ms, "cause": cause}})
            }
            Recovering::Retrying {
                attempt,
                error,
                delay,
            } => json!({"retrying": {
                "at_ms": at_ms, "attempt": attempt, "error": error.to_string(), "delay_ms": ms(delay)
            }}),
            Recovering::Recovered(ev) => {
                if let Ok(mut r) = sink.lock() {
                    r.recovered.push(ev.clone());
                }
                json!({"recovered": {
                    "at_ms": at_ms,
                    "outcome": format!("{:?}", ev.outcome),
                    "resent": ev.resent,
                    "attempts": ev.attempts,
                    "took_ms": ms(ev.took),
                }})
            }
            other => json!({"recovery_step": format!("{other:?}")}),
        };
        eprintln!("{line}");
    });
    shared
}

/// Checks and times what the library hands back.
struct Tracker {
    recoveries: Arc<Mutex<Recoveries>>,
    /// The next operation whose acknowledgement is due.
    expect: u64,
    /// When the last acknowledgement was handed back (the stream's start before the first).
    last_ack: Instant,
    /// Losses seen so far.
    lost_seen: usize,
    /// Set when a loss was reported: when, until the next acknowledgement.
    pending: Option<Instant>,
    recovery_ms: Vec<f64>,
    longest_other_gap_ms: f64,
    in_flight_at_resume_max: u64,
    violations: Vec<String>,
    /// More than one lane: acknowledgements come in no set order, so they are counted (each
    /// must be a delivered SEND), not matched to the next operation.
    any_order: bool,
    ops: u64,
}

impl Tracker {
    /// After each call into the library: notes a loss it reported, checks the
    /// acknowledgements it returned and times the stall before them.
    fn after(&mut self, acks: &[Ack], in_flight_before: u64) {
        let now = Instant::now();
        let first_new_loss = match self.recoveries.lock() {
            Ok(r) if r.lost.len() > self.lost_seen => {
                let first = r.lost[self.lost_seen];
                self.lost_seen = r.lost.len();
                Some(first)
            }
            _ => None,
        };
        if let Some(lost) = first_new_loss {
            self.pending.get_or_insert(lost);
            self.in_flight_at_resume_max = self.in_flight_at_resume_max.max(in_flight_before);
        }
        for ack in acks {
            if self.any_order {
                if ack.op != Op::Send
                    || ack.status != AckStatus::Delivered
                    || self.expect > self.ops
                {
                    self.violations.push(format!(
                        "acknowledgement {} of {} operations: {ack:?}",
                        self.expect, self.ops
                    ));
                }
                self.expect += 1;
                continue;
            }
            let want = op_content(self.expect);
            if ack.seq != self.expect
                || ack.op != Op::Send
                || ack.bytes as usize != want.len()
                || ack.status != AckStatus::Delivered
            {
                self.violations.push(format!(
                    "expected the acknowledgement of #{} ({} bytes), got {ack:?}",
                    self.expect,
                    want.len()
                ));
            }
            self.expect += 1;
        }
        if acks.is_empty() {
            return;
        }
        match self.pending.take() {
            Some(lost) => self.recovery_ms.push(ms(now - lost)),
            None => {
                self.longest_other_gap_ms = self.longest_other_gap_ms.max(ms(now - self.last_ack))
            }
        }
        self.last_ack = now;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs the stream; `Err` is a library error that ended it early.
async fn stream(
    client: &mut Client,
    args: &Args,
    t: &mut Tracker,
    sent: &mut u64,
    start: Instant,
) -> Result<(), ClientError> {
    let period = match args.rate {
        r if r > 0.0 => Duration::from_secs_f64(1.0 / r),
        _ => Duration::ZERO,
    };
    if args.lanes > 1 {
        return stream_lanes(client, args, t, sent, start, period).await;
    }
    while t.expect <= args.ops {
        let in_flight = *sent - (t.expect - 1);
        // Every operation of a group falls due with the group's first.
        let due = start + period.mul_f64((*sent / args.burst * args.burst) as f64);
        if *sent < args.ops && in_flight < args.window && Instant::now() >= due {
            let acks = client
                .post(Op::Send, op_content(*sent + 1).as_bytes())
                .await?;
            *sent += 1;
            t.after(&acks, in_flight);
        } else if in_flight > 0 {
            // The schedule is absolute: an acknowledgement that comes after the next post was
            // due is followed by the posts that fell due meanwhile.
            let ack = client.ack().await?;
            t.after(std::slice::from_ref(&ack), in_flight);
        } else {
            tokio::time::sleep_until(due.into()).await;
        }
    }
    // Nothing is in flight; a flush confirms the library agrees.
    let acks = client.flush().await?;
    t.after(&acks, 0);
    Ok(())
}

/// [`stream`] over several lanes: `post` waits inside the library when the lane it picks has
/// its window full; a full window over all lanes is emptied with a flush.
async fn stream_lanes(
    client: &mut Client,
    args: &Args,
    t: &mut Tracker,
    sent: &mut u64,
    start: Instant,
    period: Duration,
) -> Result<(), ClientError> {
    while *sent < args.ops {
        let in_flight = *sent - (t.expect - 1);
        if in_flight >= args.window {
            let acks = client.flush().await?;
            t.after(&acks, in_flight);
            continue;
        }
        let due = start + period.mul_f64((*sent / args.burst * args.burst) as f64);
        if Instant::now() < due {
            tokio::time::sleep_until(due.into()).await;
        }
        let acks = client
            .post(Op::Send, op_content(*sent + 1).as_bytes())
            .await?;
        *sent += 1;
        t.after(&acks, in_flight);
    }
    let acks = client.flush().await?;
    t.after(&acks, *sent - (t.expect - 1));
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let cfg = args
        .client
        .config(Duration::from_secs(args.timeout))
        .with_rdma_acks(true)
        .with_warm_pool(args.warm_pool)
        .with_recovery(match args.no_resume {
            true => Recovery::Resend,
            false => Recovery::Resume,
        });
    let mut client = match Client::connect(&cfg).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("stream-client: connecting: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    for lane in 1..args.lanes {
        if let Err(e) = client.add_lane().await {
            eprintln!("stream-client: opening lane {lane}: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    let lanes = client.lanes();
    let start = Instant::now();
    let recoveries = observe(&mut client, start);
    let mut t = Tracker {
        recoveries: Arc::clone(&recoveries),
        expect: 1,
        last_ack: start,
        lost_seen: 0,
        pending: None,
        recovery_ms: Vec::new(),
        longest_other_gap_ms: 0.0,
        in_flight_at_resume_max: 0,
        violations: Vec::new(),
        any_order: args.lanes > 1,
        ops: args.ops,
    };
    let mut sent = 0;
    let outcome = stream(&mut client, &args, &mut t, &mut sent, start).await;
    let lanes_at_end = client.lanes();
    client.quit().await;
    let elapsed = t.last_ack.duration_since(start).as_secs_f64();
    let acknowledged = t.expect - 1;
    let (losses, events) = match recoveries.lock() {
        Ok(r) => (r.lost.len() as u64, r.recovered.clone()),
        Err(_) => (0, Vec::new()),
    };
    let summary = StreamSummary {
        ops: args.ops,
        lanes,
        lanes_at_end,
        sent,
        acknowledged,
        losses,
        resumes: events.len() as u64,
        acknowledged_while_away: events
            .iter()
            .map(|e| match e.outcome {
                ResumeOutcome::Resumed { acknowledged } => acknowledged as u64,
                _ => 0,
            })
            .sum(),
        resent: events.iter().map(|e| e.resent as u64).sum(),
        lanes_resumed: events.iter().map(|e| e.lanes_resumed as u64).sum(),
        lanes_acknowledged_while_away: events.iter().map(|e| e.lanes_acknowledged as u64).sum(),
        lanes_resent: events.iter().map(|e| e.lanes_resent as u64).sum(),
        resume_took_ms: Stats::of(events.iter().map(|e| ms(e.took)).collect()),
        resume_events: events.iter().map(|e| format!("{e:?}")).collect(),
        in_flight_at_resume_max: t.in_flight_at_resume_max,
        recovery_ms: Stats::of(t.recovery_ms),
        longest_other_gap_ms: t.longest_other_gap_ms,
        elapsed_s: elapsed,
        throughput_per_s: match elapsed {
            e if e > 0.0 => acknowledged as f64 / e,
            _ => 0.0,
        },
        rate: args.rate,
        window: args.window,
        burst: args.burst,
        ok: outcome.is_ok() && t.violations.is_empty() && acknowledged == args.ops,
        violations: t.violations,
        error: outcome.err().map(|e| e.to_string()),
    };
    let ok = summary.ok;
    match serde_json::to_string(&summary) {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("stream-client: the summary: {e}");
            return std::process::ExitCode::FAILURE;
        }
    }
    match ok {
        true => std::process::ExitCode::SUCCESS,
        false => std::process::ExitCode::FAILURE,
    }
}
