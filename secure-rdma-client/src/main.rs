//! `secure-client`: argument parsing and the command prompt; the protocol
//! lives in `secure_rdma::client`.

mod bench;
mod errors;
mod prompt;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use rdma_cli::choices::CipherChoice;
use rdma_cli::logging::{self, LogFormat};
use secure_rdma::client::{
    connect_with_retry, Backoff, Client, ClientConfig, ClientError, Connector, Recovering, Recovery,
};
use secure_rdma::datapath::AckStatus;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines, Stdin};

use errors::{exit_code, Shown};
use prompt::{InputError, Prompt};

/// Secure RDMA client.
///
/// Connects to secure-server over TLS 1.3 with a client certificate, sets up
/// an RC queue pair (parameters exchanged only inside TLS, CSPRNG PSNs) and
/// confirms it with a token derived from the TLS session. Then runs commands:
///
///   send <message>   RDMA SEND the message
///   write <data>     RDMA WRITE the data into the server's buffer
///   lane             open one more lane (QP) on this session, over its TLS
///                    connection (no new TCP or TLS handshake); see --lanes
///   lanes            print each lane's operations
///   help             list the commands
///   quit             close the connection
///
/// Commands come from --exec (repeatable), else from stdin. On a terminal the
/// prompt edits lines (Emacs keys), recalls history (Up/Down, Ctrl-R; kept in
/// $XDG_STATE_HOME/secure-rdma/client_history, else
/// ~/.local/state/secure-rdma/client_history) and completes commands (Tab);
/// Ctrl-C clears the line, Ctrl-D quits. Each acknowledgement from the server
/// is printed.
///
/// `secure-client HOST bench connect|send|write|hold ...` measures instead
/// (see `secure-client HOST bench --help`).
///
/// Every payload is sealed with an AEAD (AES-256-GCM or ChaCha20-Poly1305,
/// keys from the TLS session): an on-path attacker can neither read nor forge
/// nor replay messages. If the session is lost (the server detected a forged
/// message and tore it down, a reset connection, an acknowledgement that never
/// came, a server restart), the client reconnects with exponential backoff and
/// jitter and resumes its operation stream: the server says what it already
/// delivered, and only the rest is sent again, so every command is delivered
/// exactly once (a restarted server, which remembers nothing, gets the
/// unacknowledged commands again flagged as possibly delivered). Each resume
/// is reported on stderr.
///
/// Exit codes: 0 ok, 1 bad command or other error, 2 usage, 3 rejected by the
/// server (e.g. server full, a lane beyond the identity's cap, a write region its quota
/// refuses; or the server has no RDMA device, with the fix it names), 4 TLS refused (certificate or server name; also a session the server
/// ended because this client's certificate was revoked or expired: not retried),
/// 5 server unreachable, 6 no usable RDMA device or GID, 7 RDMA connection
/// not confirmed (PSN/GID mismatch), 8 protocol or RDMA error (or the session
/// was lost and could not be re-established), 9 the server's offer is below
/// this client's policy (no payload protection, buffers too large).
/// `bench`: 0 report printed, 1 the benchmark failed, 2 usage.
#[derive(Debug, Parser)]
#[command(version, name = "secure-client", verbatim_doc_comment)]
struct Cli {
    /// Server host name or address
    host: String,
    /// Name the server certificate must carry [default: HOST]
    server_name: Option<String>,
    /// Server port
    #[arg(short, long, default_value_t = 4433)]
    port: u16,
    /// Certificate directory made by `secure-server certs` (ca.pem, NAME.pem, NAME.key)
    #[arg(long, value_name = "DIR", default_value = "certs")]
    certs: PathBuf,
    /// Client identity: uses DIR/NAME.pem and DIR/NAME.key
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// CA certificate (overrides DIR/ca.pem)
    #[arg(long, value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Client certificate (overrides DIR/NAME.pem)
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// Client key (overrides DIR/NAME.key)
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
    /// RDMA device [default: the one whose RoCEv2 GID carries our local address]
    #[arg(short, long, value_name = "NAME")]
    device: Option<String>,
    /// Source GID index [default: the RoCEv2 GID of our local address]
    #[arg(short, long, value_name = "INDEX")]
    gid_index: Option<u32>,
    /// Run this command instead of reading stdin; repeatable, in order
    #[arg(long = "exec", short = 'e', value_name = "COMMAND")]
    exec: Vec<String>,
    /// Seconds to wait for each step (connect, completions, acknowledgements)
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    timeout: u64,
    /// Log format on stderr (RUST_LOG sets the level, default warn)
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t)]
    log_format: LogFormat,
    /// Payload cipher to accept
    #[arg(long, value_name = "CIPHER", value_enum, default_value_t)]
    cipher: CipherChoice,
    /// Payloads in clear, no AEAD (the server must allow it): to measure what protection costs
    /// and to show the forgery it stops. An on-path attacker can then forge, replay and read
    #[arg(long, conflicts_with = "cipher")]
    no_payload_protection: bool,
    /// Largest per-message buffer to agree to; a server asking for more is refused
    #[arg(long, value_name = "BYTES", default_value_t = secure_rdma::client::DEFAULT_MAX_BUFFER)]
    max_buffer_size: usize,
    /// Accept a server whose RDMA GID is not the address reached over TLS (NAT, multi-homed)
    #[arg(long)]
    allow_gid_mismatch: bool,
    /// Have the server acknowledge each operation over RDMA (a sealed record SENT back: the
    /// streaming data path) instead of over TLS
    #[arg(long)]
    rdma_acks: bool,
    /// Do not reconnect when the session is lost; exit with code 8 instead
    #[arg(long, conflicts_with = "no_resume")]
    no_reconnect: bool,
    /// After a lost session, reconnect with a new operation stream and send every
    /// unacknowledged command again (at least once: a command whose acknowledgement was lost is
    /// delivered twice), instead of resuming the stream (exactly once). For comparison
    #[arg(long)]
    no_resume: bool,
    /// Reconnection attempts after a lost session (exponential backoff from 200 ms to 5 s,
    /// with jitter)
    #[arg(long, value_name = "N", default_value_t = 6)]
    reconnect_attempts: u32,
    /// Lanes (RC QPs) of the session, its first included: the extra ones are opened over the
    /// session's one TLS connection (no new TCP or TLS handshake), each with its own keys and
    /// operation stream, and commands spread over them (least outstanding first). More than 1
    /// implies --rdma-acks. The server caps lanes per identity (--max-lanes-per-identity). A
    /// lost lane's stream resumes on a new lane; a lost session's lanes resume on the new
    /// session
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65))]
    lanes: u32,
    /// Keep this many sessions' RDMA resources (PD, CQs, memory regions, a QP in INIT with its
    /// receives posted) ready, made by a background thread, so the next connection or lane
    /// (a reconnect, the `lane` command, bench) only connects a ready QP. Each serves one
    /// session. 0 makes each on its connection's path [default: 0; `bench connect --warm`: 8]
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1024))]
    warm_pool: u32,
    /// Take every session's and lane's receives from one shared receive queue of this many
    /// slots per device, their sends completing on shared CQs too, instead of a receive queue,
    /// 16 receive slots and two CQs per session: for one process holding many sessions
    /// (`bench hold`). The warm pool then serves no session [default: 0, a receive queue per
    /// session]
    #[arg(long, value_name = "SLOTS", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_048_576))]
    shared_receive_queue: u32,
    /// Bind each control connection to the next port of LOW-HIGH in turn (one in use is passed
    /// over) instead of letting the kernel choose: for one process holding tens of thousands
    /// of sessions to one server (`bench hold`), where past about 32,000 Linux's connect()
    /// walks every port it gave out on each new connection [default: the kernel chooses]
    #[arg(long, value_name = "LOW-HIGH", value_parser = parse_port_range)]
    source_ports: Option<std::ops::RangeInclusive<u16>>,
    /// How the session's first QP is set up: early sends a warm QP's endpoint with the hello
    /// (with --warm-pool, from the second connection on, for the session the server gave the
    /// last one), so that the server answers with its own in the accept and nothing more goes
    /// over TLS before the session is confirmed; symmetric exchanges both endpoints, both
    /// ready and both confirmed after the accept, as earlier releases do, to compare them. A
    /// server of an earlier release takes the symmetric steps whatever this says
    #[arg(long, value_enum, default_value_t = Setup::Early)]
    setup: Setup,
    #[command(subcommand)]
    command: Option<Command>,
}

/// How the session's first QP is set up ([`ClientConfig::early_endpoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Setup {
    /// A warm QP's endpoint in the hello, the server's in its accept, the tokens over RDMA
    Early,
    /// Both endpoints, both ready, both tokens at once, both confirmed (earlier releases)
    Symmetric,
}

/// `LOW-HIGH`, two ports with LOW <= HIGH, for --source-ports.
fn parse_port_range(s: &str) -> Result<std::ops::RangeInclusive<u16>, String> {
    let (low, high) = s
        .split_once('-')
        .ok_or_else(|| format!("'{s}' is not LOW-HIGH (for example 10000-65000)"))?;
    let port = |p: &str| {
        p.trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| format!("'{p}' is not a port (1-65535)"))
    };
    let (low, high) = (port(low)?, port(high)?);
    if low > high {
        return Err(format!(
            "the range {low}-{high} is empty: LOW must not exceed HIGH"
        ));
    }
    Ok(low..=high)
}

/// What to do instead of running commands.
#[derive(Debug, Clone, clap::Subcommand)]
enum Command {
    /// Measure connection setup, latency, bandwidth or many sessions held (one report per run;
    /// JSON with --json). Latency is half the round trip of an RDMA operation and the server's
    /// acknowledgement over RDMA, as perftest reports half a ping-pong
    Bench(bench::BenchArgs),
}

#[derive(Debug)]
enum Cmd<'a> {
    Send(&'a str),
    Write(&'a str),
    Lane,
    Lanes,
    Help,
    Quit,
}

const HELP: &str = "commands: send <message> | write <data> | lane | lanes | help | quit";

fn parse(line: &str) -> Result<Option<Cmd<'_>>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim_start();
    match word {
        "send" if !rest.is_empty() => Ok(Some(Cmd::Send(rest))),
        "write" if !rest.is_empty() => Ok(Some(Cmd::Write(rest))),
        "send" | "write" => Err(format!("{word} needs an argument ({HELP})")),
        "lane" => Ok(Some(Cmd::Lane)),
        "lanes" => Ok(Some(Cmd::Lanes)),
        "help" | "?" => Ok(Some(Cmd::Help)),
        "quit" | "exit" => Ok(Some(Cmd::Quit)),
        other => Err(format!("unknown command {other:?} ({HELP})")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    // The hidden `--generate-docs DIR`: man pages and completions for the package.
    rdma_cli::docs::generate_if_asked(<Cli as clap::CommandFactory>::command);
    let cli = Cli::parse();
    logging::init(cli.log_format, "warn");
    std::process::exit(run(cli).await);
}

async fn run(cli: Cli) -> i32 {
    let ca = cli.ca.clone().unwrap_or_else(|| cli.certs.join("ca.pem"));
    let identity = match (&cli.cert, &cli.key, &cli.name) {
        (Some(c), Some(k), _) => Some((c.clone(), k.clone())),
        (_, _, Some(n)) => Some((
            cli.certs.join(format!("{n}.pem")),
            cli.certs.join(format!("{n}.key")),
        )),
        _ => None,
    };
    if identity.is_none() {
        eprintln!("secure-client: warning: no client certificate (--name or --cert/--key); the server will refuse the connection");
    }
    let cfg = ClientConfig::new(&cli.host)
        .with_server_name(cli.server_name.clone().unwrap_or_else(|| cli.host.clone()))
        .with_port(cli.port)
        .with_ca(ca)
        .with_device(cli.device.clone())
        .with_gid_index(cli.gid_index)
        .with_timeout(Duration::from_secs(cli.timeout.max(1)))
        .with_ciphers(if cli.no_payload_protection {
            Vec::new()
        } else {
            cli.cipher.ciphers()
        })
        .with_max_buffer_size(cli.max_buffer_size)
        .with_allow_gid_mismatch(cli.allow_gid_mismatch)
        .with_rdma_acks(cli.rdma_acks)
        .with_lanes(cli.lanes as usize)
        .with_warm_pool(cli.warm_pool as usize)
        .with_shared_receive_queue(cli.shared_receive_queue as usize)
        .with_source_ports(cli.source_ports.clone())
        .with_early_endpoint(cli.setup == Setup::Early);
    let cfg = match identity {
        Some((cert, key)) => cfg.with_identity(cert, key),
        None => cfg,
    };
    if let Some(Command::Bench(b)) = &cli.command {
        return run_bench(cfg, b).await;
    }
    let backoff = Backoff {
        attempts: cli.reconnect_attempts,
        ..Backoff::default()
    };
    let recovery = if cli.no_reconnect {
        Recovery::Fail
    } else if cli.no_resume {
        Recovery::Resend
    } else {
        Recovery::Resume
    };
    let cfg = cfg.with_recovery(recovery).with_backoff(backoff);
    let first = Backoff {
        attempts: if cli.no_reconnect {
            0
        } else {
            backoff.attempts
        },
        ..backoff
    };
    let mut client = match connect(&cfg, first).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("secure-client: {}", Shown(&e));
            return exit_code(&e);
        }
    };
    report_recoveries(&mut client, &cfg);

    let interactive = cli.exec.is_empty() && std::io::stdin().is_terminal();
    let mut input = Input::new(interactive);
    let mut execs = cli.exec.iter();
    let mut stdout = tokio::io::stdout();
    let mut status = 0;
    loop {
        if let Input::Lines { prompt: true, .. } = input {
            let _ = stdout.write_all(b"secure-client> ").await;
            let _ = stdout.flush().await;
        }
        // Between commands, watch the session too: a server that tears it down (a forged
        // message, shutdown, idle timeout) is noticed now, not at the next command.
        let next = if cli.exec.is_empty() {
            tokio::select! {
                line = input.next_line() => Next::Line(line),
                closed = client.closed() => Next::Closed(closed),
            }
        } else {
            tokio::select! {
                biased;
                closed = client.closed() => Next::Closed(closed),
                _ = std::future::ready(()) => Next::Line(Ok(execs.next().cloned())),
            }
        };
        let line = match next {
            Next::Line(Ok(Some(l))) => l,
            Next::Line(Ok(None)) => break,
            Next::Line(Err(e)) => {
                eprintln!("secure-client: {e}");
                status = 1;
                break;
            }
            Next::Closed(closed) => {
                let why = match closed {
                    Ok(None) => "the server closed the session".to_owned(),
                    // Revoked or expired: the same certificate would only be refused again.
                    Ok(Some(reason)) if !reason.retry_may_help() => {
                        eprintln!("secure-client: the server ended the session: {reason}");
                        return 4;
                    }
                    Ok(Some(reason)) => reason.to_string(),
                    Err(e) => Shown(&e).to_string(),
                };
                if cli.no_reconnect {
                    eprintln!("secure-client: session lost: {why}");
                    return 8;
                }
                // The library resumes the stream (reporting it through the observer).
                if let Err(e) = client.reconnect(&why).await {
                    eprintln!("secure-client: {}", Shown(&e));
                    return exit_code(&e);
                }
                continue;
            }
        };
        let cmd = match parse(&line) {
            Ok(Some(c)) => c,
            Ok(None) => continue,
            Err(msg) => {
                eprintln!("secure-client: {msg}");
                if !interactive {
                    status = 1;
                    break;
                }
                continue;
            }
        };
        // A lost session is recovered inside the library (its stream resumed, the command sent
        // again only if the server does not have it): what comes back is this command's one
        // acknowledgement, or an error no reconnection can fix.
        let result = match cmd {
            Cmd::Help => {
                println!("{HELP}");
                continue;
            }
            Cmd::Quit => break,
            Cmd::Lane => {
                match client.add_lane().await {
                    Ok(opened) => println!(
                        "lane {} open in {:.2} ms over the session's TLS connection (setup {:.2} ms, confirmation {:.2} ms)",
                        opened.lane,
                        opened.took.as_secs_f64() * 1e3,
                        opened.setup.as_secs_f64() * 1e3,
                        opened.confirmation.as_secs_f64() * 1e3,
                    ),
                    // The session and its other lanes go on; the exit status says a lane was
                    // refused.
                    Err(
                        e @ (ClientError::LaneRejected { .. }
                        | ClientError::LaneNotConfirmed { .. }
                        | ClientError::NoLanes),
                    ) => {
                        eprintln!("secure-client: {}", Shown(&e));
                        status = exit_code(&e);
                    }
                    Err(e) => {
                        eprintln!("secure-client: {}", Shown(&e));
                        return exit_code(&e);
                    }
                }
                let _ = stdout.flush().await;
                continue;
            }
            Cmd::Lanes => {
                for l in client.lane_stats() {
                    println!(
                        "lane {}: {} operations posted, {} in flight",
                        l.lane, l.posted, l.in_flight
                    );
                }
                let _ = stdout.flush().await;
                continue;
            }
            Cmd::Send(msg) => client.send(msg.as_bytes()).await,
            Cmd::Write(data) => match client.write(data.as_bytes()).await {
                // Nothing was written, and the session goes on: its SENDs still work. The exit
                // status says a write was refused.
                Err(e @ ClientError::WriteRejected(_)) => {
                    eprintln!("secure-client: {}", Shown(&e));
                    status = exit_code(&e);
                    let _ = stdout.flush().await;
                    continue;
                }
                other => other,
            },
        };
        match result {
            Ok(ack) if ack.status == AckStatus::Refused => {
                println!("server refused {} #{}", ack.op, ack.seq);
                status = 1;
            }
            Ok(ack) => println!(
                "server acknowledged {} #{}: {} bytes",
                ack.op, ack.seq, ack.bytes
            ),
            Err(e) => {
                eprintln!("secure-client: {}", Shown(&e));
                return exit_code(&e);
            }
        }
        let _ = stdout.flush().await;
    }
    client.quit().await;
    println!("disconnected");
    status
}

/// `bench`: exit 0 with the report on stdout, 1 (bench failed) or 2 (bad arguments).
async fn run_bench(cfg: ClientConfig, b: &bench::BenchArgs) -> i32 {
    if let Err(e) = bench::validate(&b.kind) {
        eprintln!("secure-client: bench: {e}");
        return 2;
    }
    // The benchmark opens its own lanes (bench connect --lanes), timed apart.
    let cfg = match b.kind {
        bench::Bench::Connect { warm: true, .. } if cfg.warm_pool == 0 => cfg.with_warm_pool(8),
        _ => cfg,
    };
    let connector = Connector::new(cfg.with_rdma_acks(b.kind.rdma_acks()).with_lanes(1));
    match bench::run(&connector, &b.kind).await {
        Ok(report) => {
            if b.json {
                println!("{report}");
            } else {
                print!("{}", bench::text(&report));
            }
            0
        }
        Err(e) => {
            eprintln!("secure-client: bench: {e:#}");
            1
        }
    }
}

/// Where commands come from when there is no --exec.
enum Input {
    /// Standard input line by line: a pipe or file, or a terminal without the line editor.
    Lines {
        lines: Lines<BufReader<Stdin>>,
        /// Write a plain prompt first (a terminal whose editor could not start).
        prompt: bool,
    },
    /// The line editor on a terminal.
    Terminal(Prompt),
}

impl Input {
    /// The line editor when stdin is a terminal, else stdin exactly as it is read without one.
    fn new(terminal: bool) -> Input {
        let lines = || BufReader::new(tokio::io::stdin()).lines();
        if !terminal {
            return Input::Lines {
                lines: lines(),
                prompt: false,
            };
        }
        match Prompt::start(prompt::history_path()) {
            Ok(p) => Input::Terminal(p),
            Err(e) => {
                // Still usable without editing: the plain prompt of a pipe.
                eprintln!("secure-client: warning: no line editing: {e}");
                Input::Lines {
                    lines: lines(),
                    prompt: true,
                }
            }
        }
    }

    /// The next line; `None` at the end. Cancel-safe, so it can race the session's end.
    async fn next_line(&mut self) -> Result<Option<String>, InputError> {
        match self {
            Input::Lines { lines, .. } => lines.next_line().await.map_err(InputError::Stdin),
            Input::Terminal(p) => p.next_line().await,
        }
    }
}

/// What the prompt loop waits for.
enum Next {
    Line(Result<Option<String>, InputError>),
    Closed(Result<Option<secure_rdma::datapath::AbortReason>, ClientError>),
}

/// Connects, logging each failed attempt and the backoff; prints the connection line.
async fn connect(cfg: &ClientConfig, backoff: Backoff) -> Result<Client, ClientError> {
    let client = connect_with_retry(cfg, backoff, |attempt, err, delay| {
        eprintln!(
            "secure-client: connection attempt {attempt} of {} failed: {}; retrying in {} ms",
            backoff.attempts + 1,
            Shown(err),
            delay.as_millis()
        );
    })
    .await?;
    let w = *client.session().wiring();
    tracing::debug!(qpn = %w.local.qpn, server_qpn = %w.remote.qpn, "RDMA wiring");
    println!(
        "connected to {}:{} as {} (device {}, GID {}; max {} bytes; payload protection {})",
        cfg.host,
        cfg.port,
        client.identity(),
        client.device(),
        w.local.gid,
        client.session().max_len(),
        protection(&client)
    );
    Ok(client)
}

fn protection(client: &Client) -> String {
    protection_of(client.session().cipher())
}

/// How the connection lines name the payload protection.
fn protection_of(cipher: Option<secure_rdma::protect::Cipher>) -> String {
    cipher.map_or("OFF (payloads in clear)".to_owned(), |c| c.to_string())
}

/// Prints each step of the library's recoveries as it happens: the loss and the retries on
/// stderr, the new session on stdout (as the first connection's line) and what the server knew
/// of the stream on stderr.
fn report_recoveries(client: &mut Client, cfg: &ClientConfig) {
    let (host, port) = (cfg.host.clone(), cfg.port);
    let attempts = cfg.backoff.attempts + 1;
    client.on_recovery(move |step| match step {
        Recovering::Lost { cause } => eprintln!("secure-client: session lost: {cause}"),
        Recovering::Retrying {
            attempt,
            error,
            delay,
        } => eprintln!(
            "secure-client: connection attempt {attempt} of {attempts} failed: {}; retrying in {} ms",
            Shown(error),
            delay.as_millis()
        ),
        Recovering::Recovered(ev) => {
            let protection = protection_of(ev.cipher);
            println!(
                "reconnected to {host}:{port} as {} (payload protection {protection})",
                ev.identity
            );
            eprintln!("secure-client: {ev}");
        }
        _ => {}
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bench_of(args: &[&str]) -> bench::Bench {
        let cli = Cli::try_parse_from(args).expect("parses");
        match cli.command {
            Some(Command::Bench(b)) => b.kind,
            None => panic!("no bench in {args:?}"),
        }
    }

    #[test]
    fn source_ports_parse_as_a_range_and_bad_ones_say_what_is_wrong() {
        let cli = Cli::try_parse_from([
            "secure-client",
            "10.77.0.1",
            "--source-ports",
            "10000-65000",
        ])
        .expect("parses");
        assert_eq!(cli.source_ports, Some(10_000..=65_000));
        for (bad, says) in [
            ("10000", "is not LOW-HIGH"),
            ("0-100", "'0' is not a port"),
            ("1000-70000", "'70000' is not a port"),
            ("2000-1000", "the range 2000-1000 is empty"),
        ] {
            let err = Cli::try_parse_from(["secure-client", "10.77.0.1", "--source-ports", bad])
                .expect_err(bad)
                .to_string();
            assert!(err.contains(says), "--source-ports {bad}: {err}");
        }
    }

    #[test]
    fn bench_arguments_parse_after_the_host() {
        let b = bench_of(&[
            "secure-client",
            "10.77.0.1",
            "--name",
            "alice",
            "bench",
            "connect",
            "-n",
            "20",
            "--concurrency",
            "4",
        ]);
        assert!(matches!(
            b,
            bench::Bench::Connect {
                n: 20,
                concurrency: 4,
                lanes: 1,
                warm: false
            }
        ));
        // The optional server name still parses before the subcommand.
        let cli = Cli::try_parse_from([
            "secure-client",
            "10.77.0.1",
            "srv",
            "bench",
            "hold",
            "-n",
            "1000",
            "--json",
        ])
        .unwrap();
        assert_eq!(cli.server_name.as_deref(), Some("srv"));
        let Some(Command::Bench(b)) = cli.command else {
            panic!("no bench")
        };
        assert!(b.json);
        assert!(matches!(
            b.kind,
            bench::Bench::Hold {
                n: 1000,
                concurrency: 8,
                hold: 0
            }
        ));
        let b = bench_of(&[
            "secure-client",
            "h",
            "bench",
            "send",
            "-s",
            "4096",
            "-n",
            "100",
            "--window",
            "8",
            "--poll",
            "busy",
        ]);
        let bench::Bench::Send(a) = b else {
            panic!("not send")
        };
        assert_eq!(
            (a.size, a.iters, a.window, a.poll),
            (4096, 100, 8, secure_rdma::verbs::Poll::Busy)
        );
        let b = bench_of(&[
            "secure-client",
            "--no-payload-protection",
            "h",
            "bench",
            "write",
        ]);
        let bench::Bench::Write(a) = b else {
            panic!("not write")
        };
        assert_eq!(
            (a.size, a.iters, a.window, a.poll, a.acks),
            (
                64,
                1000,
                16,
                secure_rdma::verbs::Poll::Event,
                bench::Acks::Rdma
            )
        );
        assert!(
            Cli::try_parse_from(["secure-client", "h", "bench", "send", "--poll", "spin"]).is_err()
        );
        // Without a subcommand the client runs commands as before.
        assert!(Cli::try_parse_from(["secure-client", "h"])
            .unwrap()
            .command
            .is_none());
    }

    #[test]
    fn bench_ranges_are_checked() {
        let check = |args: &[&str]| bench::validate(&bench_of(args));
        assert!(check(&["c", "h", "bench", "send", "--window", "16"]).is_ok());
        assert!(check(&["c", "h", "bench", "write", "--window", "17"])
            .unwrap_err()
            .contains("unacknowledged"));
        assert!(
            check(&["c", "h", "bench", "write", "--acks", "tls", "--window", "2"])
                .unwrap_err()
                .contains("--window 1")
        );
        assert!(check(&["c", "h", "bench", "send", "--acks", "tls", "--window", "1"]).is_ok());
        assert!(check(&["c", "h", "bench", "connect", "-n", "0"]).is_err());
        assert!(check(&["c", "h", "bench", "hold", "--concurrency", "0"]).is_err());
    }

    #[test]
    fn bench_reports_have_the_issue_json_shape() {
        let s = bench::Summary::of(&[3.0, 1.0, 2.0, 4.0]);
        assert_eq!((s.p50, s.p99, s.mean), (2.0, 4.0, 2.5));
        assert_eq!(bench::Summary::of(&[]), bench::Summary::default());
        let connect = serde_json::to_value(bench::ConnectReport {
            connections: 2,
            concurrency: 1,
            first_connection_us: 9.0,
            tls_resumed: 2,
            early_setups: 2,
            per_connection_us: s,
            phases_us: bench::PhaseSummaries {
                tcp_tls: s,
                admission: s,
                rdma_setup: s,
                confirmation: s,
            },
            total_ms: 1.0,
            connections_per_s: 2000.0,
            after_tls_us: s,
            lanes: None,
            warm: None,
        })
        .unwrap();
        assert_eq!(connect["connections"], 2);
        assert_eq!(connect["connections_per_s"], 2000.0);
        assert!(connect["after_tls_us"]["p50"].is_number());
        // Without --lanes, no lanes key; with it, the extra lane beside the connection.
        assert!(connect.get("lanes").is_none());
        // Without --warm, no warm key; with it, how the pool served.
        assert!(connect.get("warm").is_none());
        let warm = serde_json::to_value(bench::WarmReport {
            pool: 8,
            warm_connections: 40,
            warm_lanes: 0,
            missed: 1,
            discarded: 0,
            made: 49,
        })
        .unwrap();
        assert_eq!(warm["warm_connections"], 40);
        assert_eq!(warm["made"], 49);
        let with_lanes = serde_json::to_value(bench::LanesReport {
            per_connection: 4,
            opened: 6,
            lane_us: s,
            setup_us: s,
            prepare_us: s,
            answer_us: s,
            confirmation_us: s,
            lane_per_connection: 0.4,
        })
        .unwrap();
        for k in [
            "lane_us",
            "setup_us",
            "prepare_us",
            "answer_us",
            "confirmation_us",
        ] {
            assert!(with_lanes[k]["p50"].is_number(), "{k}");
        }
        assert_eq!(with_lanes["lane_per_connection"], 0.4);
        assert_eq!(connect["first_connection_us"], 9.0);
        assert_eq!(connect["tls_resumed"], 2);
        assert_eq!(connect["early_setups"], 2);
        for k in ["p50", "p99", "mean"] {
            assert!(connect["per_connection_us"][k].is_number(), "{k}");
        }
        for phase in ["tcp_tls", "admission", "rdma_setup", "confirmation"] {
            assert!(connect["phases_us"][phase]["p50"].is_number(), "{phase}");
        }
        let data = serde_json::to_value(bench::DataReport {
            op: "send",
            size: 64,
            iters: 10,
            window: 1,
            poll: "busy",
            acks: "rdma",
            protection: "aes-256-gcm".into(),
            latency_us: s,
            bandwidth_mb_s: 1.5,
            aead: None,
        })
        .unwrap();
        for k in ["op", "size", "iters", "latency_us", "bandwidth_mb_s"] {
            assert!(data.get(k).is_some(), "{k}");
        }
        // Unprotected: the cipher's cost is null, not zero (zero would read as "free").
        assert!(data["aead"].is_null(), "{data}");
        assert_eq!(data["latency_us"]["p50"], 2.0);
        let text = bench::text(&data);
        assert!(text.contains("latency_us.p50 2.0\n"), "{text}");
    }

    #[test]
    fn the_aead_cost_is_timed_for_the_size_and_for_the_acknowledgement() {
        use secure_rdma::datapath::Op;
        use secure_rdma::protect::Cipher;
        for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
            let small = bench::aead_cost(cipher, Op::Send, 64, 200);
            let big = bench::aead_cost(cipher, Op::Write, 64 << 10, 50);
            assert_eq!(small.cipher, cipher.to_string());
            assert_eq!((small.iters, big.iters), (200, 50));
            for s in [small.seal_open_us, small.ack_seal_open_us, big.seal_open_us] {
                assert!(s.p50 > 0.0 && s.p50 <= s.p99, "{s:?}");
            }
            // 64 KiB costs more than 64 B: the timing is of the bytes, not of a fixed overhead.
            assert!(
                big.seal_open_us.p50 > 4.0 * small.seal_open_us.p50,
                "{cipher}: 64 KiB {:?} against 64 B {:?}",
                big.seal_open_us,
                small.seal_open_us
            );
            let per_byte = big.seal_open_us.p50 * 1000.0 / 65536.0;
            assert!((big.ns_per_byte - per_byte).abs() < 0.01, "{big:?}");
            let v = serde_json::to_value(&big).unwrap();
            assert!(v["ack_seal_open_us"]["p50"].is_number(), "{v}");
        }
    }

    #[test]
    fn commands_parse_with_clear_errors() {
        assert!(matches!(
            parse("send hello world"),
            Ok(Some(Cmd::Send("hello world")))
        ));
        assert!(matches!(
            parse("  write  abc "),
            Ok(Some(Cmd::Write("abc")))
        ));
        assert!(matches!(parse("quit"), Ok(Some(Cmd::Quit))));
        assert!(matches!(parse(""), Ok(None)));
        assert!(matches!(parse("# comment"), Ok(None)));
        assert!(parse("send").unwrap_err().contains("needs an argument"));
        assert!(parse("frobnicate x")
            .unwrap_err()
            .contains("unknown command \"frobnicate\""));
    }
}
