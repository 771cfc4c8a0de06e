//! `secure-client`: argument parsing and the command prompt; the protocol
//! lives in `secure_rdma::client`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use rdma_cli::logging::{self, LogFormat};
use secure_rdma::client::{Client, ClientConfig};
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
/// Exit codes: 0 ok, 1 bad command or other error, 2 usage, 3 rejected by the
/// server (e.g. server full), 4 TLS refused (certificate or server name),
/// 5 server unreachable, 6 no usable RDMA device or GID, 7 RDMA connection
/// not confirmed (PSN/GID mismatch), 8 protocol or RDMA error.
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
    };
    let mut client = match Client::connect(&cfg).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("secure-client: {e}");
            return e.exit_code();
        }
    };
    let w = *client.session().wiring();
    println!(
        "connected to {}:{} as {} (device {}, GID {}, QPN {}; server QPN {}; max {} bytes)",
        cli.host,
        cli.port,
        client.identity(),
        client.device(),
        w.local.gid,
        w.local.qpn,
        w.remote.qpn,
        client.session().max_len()
    );

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
        let line = if cli.exec.is_empty() {
            match lines.next_line().await {
                Ok(Some(l)) => l,
                Ok(None) => break,
                Err(e) => {
                    eprintln!("secure-client: reading stdin: {e}");
                    status = 1;
                    break;
                }
            }
        } else {
            match execs.next() {
                Some(l) => l.clone(),
                None => break,
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
        let result = match cmd {
            Cmd::Help => {
                println!("{HELP}");
                continue;
            }
            Cmd::Quit => break,
            Cmd::Send(msg) => client.send(msg.as_bytes()).await,
            Cmd::Write(data) => client.write(data.as_bytes()).await,
        };
        match result {
            Ok(ack) => println!(
                "server acknowledged {} #{}: {} bytes",
                ack.op, ack.seq, ack.bytes
            ),
            Err(e) => {
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
