//! `secure-client`: argument parsing and the command prompt; the protocol
//! lives in `secure_rdma::client`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use rdma_cli::logging::{self, LogFormat};
use secure_rdma::client::{connect_with_retry, Backoff, Client, ClientConfig, ClientError};
use secure_rdma::protect::Cipher;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// Secure RDMA client.
///
/// Connects to secure-server over TLS 1.3 with a client certificate, sets up
/// an RC queue pair (parameters exchanged only inside TLS, CSPRNG PSNs) and
/// confirms it with a token derived from the TLS session. Then runs commands:
///
///   send <message>   RDMA SEND the message
///   write <data>     RDMA WRITE the data into the server's buffer
///   help             list the commands
///   quit             close the connection
///
/// Commands come from --exec (repeatable), else from stdin (a prompt when it
/// is a terminal). Each acknowledgement from the server is printed.
///
/// Every payload is sealed with an AEAD (AES-256-GCM or ChaCha20-Poly1305,
/// keys from the TLS session): an on-path attacker can neither read nor forge
/// nor replay messages. If the session is lost (the server detected a forged
/// message and tore it down, or restarted), the client reconnects with
/// exponential backoff and jitter and resends the command that was cut off.
///
/// Exit codes: 0 ok, 1 bad command or other error, 2 usage, 3 rejected by the
/// server (e.g. server full), 4 TLS refused (certificate or server name),
/// 5 server unreachable, 6 no usable RDMA device or GID, 7 RDMA connection
/// not confirmed (PSN/GID mismatch), 8 protocol or RDMA error (or the session
/// was lost and could not be re-established), 9 the server's offer is below
/// this client's policy (no payload protection, buffers too large).
#[derive(Debug, Parser)]
#[command(version, name = "secure-client", verbatim_doc_comment)]
struct Cli {
    /// Server host name or address
    host: String,
    /// Name the server certificate must carry [default: HOST]
    server_name: Option<String>,
    /// Server port
    #[arg(long, default_value_t = 4433)]
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
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// Source GID index [default: the RoCEv2 GID of our local address]
    #[arg(long, value_name = "INDEX")]
    gid_index: Option<u32>,
    /// Run this command instead of reading stdin; repeatable, in order
    #[arg(long = "exec", short = 'e', value_name = "COMMAND")]
    exec: Vec<String>,
    /// Seconds to wait for each step (connect, completions, acknowledgements)
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    timeout: u64,
    /// Log format on stderr: text or json (RUST_LOG sets the level, default warn)
    #[arg(long, value_name = "FORMAT", default_value = "text")]
    log_format: String,
    /// Payload cipher to accept: auto (either, fastest on this CPU first), aes-256-gcm or
    /// chacha20-poly1305
    #[arg(long, value_name = "CIPHER", default_value = "auto", value_parser = parse_ciphers)]
    cipher: Ciphers,
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
    /// Do not reconnect when the session is lost; exit with code 8 instead
    #[arg(long)]
    no_reconnect: bool,
    /// Reconnection attempts after a lost session (exponential backoff from 200 ms to 5 s,
    /// with jitter)
    #[arg(long, value_name = "N", default_value_t = 6)]
    reconnect_attempts: u32,
}

/// The ciphers `--cipher` accepts, preferred first.
#[derive(Debug, Clone)]
struct Ciphers(Vec<Cipher>);

/// `--cipher`: `auto` accepts both, fastest first; a name accepts only that one.
fn parse_ciphers(s: &str) -> Result<Ciphers, String> {
    match s {
        "auto" => Ok(Ciphers(Cipher::preference().to_vec())),
        other => other
            .parse::<Cipher>()
            .map(|c| Ciphers(vec![c]))
            .map_err(|e| format!("{e}, or auto")),
    }
}

#[derive(Debug)]
enum Cmd<'a> {
    Send(&'a str),
    Write(&'a str),
    Help,
    Quit,
}

const HELP: &str = "commands: send <message> | write <data> | help | quit";

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
        "help" | "?" => Ok(Some(Cmd::Help)),
        "quit" | "exit" => Ok(Some(Cmd::Quit)),
        other => Err(format!("unknown command {other:?} ({HELP})")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cli = Cli::parse();
    let format = match cli.log_format.parse::<LogFormat>() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("secure-client: error: {e}");
            std::process::exit(2);
        }
    };
    logging::init(format, "warn");
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
    let cfg = ClientConfig {
        server_name: cli.server_name.clone().unwrap_or_else(|| cli.host.clone()),
        host: cli.host.clone(),
        port: cli.port,
        ca,
        identity,
        device: cli.device.clone(),
        gid_index: cli.gid_index,
        timeout: Duration::from_secs(cli.timeout.max(1)),
        ciphers: if cli.no_payload_protection {
            Vec::new()
        } else {
            cli.cipher.0.clone()
        },
        max_buffer_size: cli.max_buffer_size,
        allow_gid_mismatch: cli.allow_gid_mismatch,
    };
    let backoff = Backoff {
        attempts: if cli.no_reconnect {
            0
        } else {
            cli.reconnect_attempts
        },
        ..Backoff::default()
    };
    let mut client = match connect(&cfg, backoff, false).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("secure-client: {e}");
            return e.exit_code();
        }
    };

    let interactive = cli.exec.is_empty() && std::io::stdin().is_terminal();
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut execs = cli.exec.iter();
    let mut stdout = tokio::io::stdout();
    let mut status = 0;
    loop {
        if interactive {
            let _ = stdout.write_all(b"secure-client> ").await;
            let _ = stdout.flush().await;
        }
        // Between commands, watch the session too: a server that tears it down (a forged
        // message, shutdown, idle timeout) is noticed now, not at the next command.
        let next = if cli.exec.is_empty() {
            tokio::select! {
                line = lines.next_line() => Next::Line(line),
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
                eprintln!("secure-client: reading stdin: {e}");
                status = 1;
                break;
            }
            Next::Closed(closed) => {
                let why = match closed {
                    Ok(None) => "the server closed the session".to_owned(),
                    Ok(Some(reason)) => reason.to_string(),
                    Err(e) => e.to_string(),
                };
                eprintln!("secure-client: session lost: {why}");
                if backoff.attempts == 0 {
                    return 8;
                }
                client = match connect(&cfg, backoff, true).await {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("secure-client: {e}");
                        return e.exit_code();
                    }
                };
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
        let mut resent = false;
        let result = loop {
            let result = match cmd {
                Cmd::Help => {
                    println!("{HELP}");
                    break None;
                }
                Cmd::Quit => break Some(Err(None)),
                Cmd::Send(msg) => client.send(msg.as_bytes()).await,
                Cmd::Write(data) => client.write(data.as_bytes()).await,
            };
            match result {
                // The server never acknowledged this command and the session is gone: it was not
                // delivered (a server that tears a session down delivers nothing after it), so
                // send it again on a new session, once.
                Err(e) if e.is_session_lost() && backoff.attempts > 0 && !resent => {
                    eprintln!("secure-client: session lost: {e}");
                    client = match connect(&cfg, backoff, true).await {
                        Ok(c) => c,
                        Err(e) => break Some(Err(Some(e))),
                    };
                    eprintln!("secure-client: sending the interrupted command again");
                    resent = true;
                }
                other => break Some(other.map_err(Some)),
            }
        };
        match result {
            None => {}
            Some(Err(None)) => break,
            Some(Ok(ack)) => println!(
                "server acknowledged {} #{}: {} bytes",
                ack.op, ack.seq, ack.bytes
            ),
            Some(Err(Some(e))) => {
                eprintln!("secure-client: {e}");
                return e.exit_code();
            }
        }
        let _ = stdout.flush().await;
    }
    client.quit().await;
    println!("disconnected");
    status
}

/// What the prompt loop waits for.
enum Next {
    Line(std::io::Result<Option<String>>),
    Closed(Result<Option<secure_rdma::handshake::AbortReason>, ClientError>),
}

/// Connects (or reconnects), logging each failed attempt and the backoff; prints the
/// connection line the first time and a shorter one on reconnection.
async fn connect(cfg: &ClientConfig, backoff: Backoff, again: bool) -> Result<Client, ClientError> {
    let client = connect_with_retry(cfg, backoff, |attempt, err, delay| {
        eprintln!(
            "secure-client: connection attempt {attempt} of {} failed: {err}; retrying in {} ms",
            backoff.attempts + 1,
            delay.as_millis()
        );
    })
    .await?;
    let protection = client
        .session()
        .cipher()
        .map_or("OFF (payloads in clear)".to_owned(), |c| c.to_string());
    let w = *client.session().wiring();
    tracing::debug!(qpn = %w.local.qpn, server_qpn = %w.remote.qpn, "RDMA wiring");
    if again {
        println!(
            "reconnected to {}:{} as {} (payload protection {protection})",
            cfg.host,
            cfg.port,
            client.identity()
        );
    } else {
        println!(
            "connected to {}:{} as {} (device {}, GID {}; max {} bytes; payload protection {protection})",
            cfg.host,
            cfg.port,
            client.identity(),
            client.device(),
            w.local.gid,
            client.session().max_len()
        );
    }
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

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
