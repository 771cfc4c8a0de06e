//! `verbs-exchange`: two processes connect RC queue pairs across the lab and
//! exercise SEND, RECV, RDMA WRITE and WRITE WITH IMMEDIATE, then print a
//! JSON report of what arrived. Endpoints travel over a plain TCP socket:
//! this is the verbs layer's test and demo, not the secure product (which is
//! `secure-server` / `secure-client`).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Parser, ValueEnum};
use secure_rdma::handshake::{Channel, Endpoint};
use secure_rdma::psn::Psn;
use secure_rdma::verbs::{
    CompletionQueue, Device, GidSelector, MemoryRegion, MrAccess, QpCaps, QueuePair, RtrParams,
    RtsParams, WcOpcode,
};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    /// Accepts one peer; receives the RDMA WRITE and checks it.
    Server,
    /// Connects to the server; performs the RDMA WRITE.
    Client,
}

/// Connects two RC queue pairs over RoCEv2 and checks SEND, RDMA WRITE and
/// WRITE WITH IMMEDIATE byte for byte. Prints a JSON report on stdout.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Which side this process plays.
    #[arg(long, value_enum)]
    role: Role,
    /// RDMA device (default: the one whose RoCEv2 GID carries the socket's local address).
    #[arg(long)]
    device: Option<String>,
    /// Source GID index (default: the RoCEv2 GID of the socket's local address).
    #[arg(long)]
    gid_index: Option<u32>,
    /// Server: address to listen on.
    #[arg(long, default_value = "0.0.0.0:18515")]
    listen: SocketAddr,
    /// Client: server address to connect to.
    #[arg(long)]
    connect: Option<SocketAddr>,
    /// Client: keep retrying the TCP connect this long (the server may still be starting).
    #[arg(long, default_value = "20", value_name = "SECONDS")]
    connect_timeout: u64,
    /// Bytes the client RDMA WRITEs into the server's buffer.
    #[arg(long, default_value_t = 1 << 20)]
    write_size: usize,
    /// Timeout of every completion wait.
    #[arg(long, default_value = "30", value_name = "SECONDS")]
    timeout: u64,
    /// Announce a PSN different from the one the QP really uses (tests that
    /// a mismatch fails with a timeout instead of hanging).
    #[arg(long)]
    wrong_psn: bool,
}

const IMM: u32 = 0xC0FF_EE01;
const MSG_LEN: usize = 4096;

fn pattern(i: usize) -> u8 {
    ((i * 7 + 13) % 251) as u8
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("verbs-exchange: error: {e:#}");
        std::process::exit(1);
    }
}

async fn connect(args: &Args) -> Result<TcpStream> {
    match args.role {
        Role::Server => {
            let listener = TcpListener::bind(args.listen)
                .await
                .with_context(|| format!("listening on {}", args.listen))?;
            tracing::info!(addr = %args.listen, "waiting for the peer");
            let (stream, peer) = listener.accept().await.context("accepting the peer")?;
            tracing::info!(%peer, "peer connected");
            Ok(stream)
        }
        Role::Client => {
            let addr = args
                .connect
                .context("--connect ADDR is required for the client")?;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(args.connect_timeout);
            loop {
                match TcpStream::connect(addr).await {
                    Ok(s) => return Ok(s),
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        tracing::debug!(%addr, error = %e, "server not up yet, retrying");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(e) => return Err(e).with_context(|| format!("connecting to {addr}")),
                }
            }
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let timeout = Duration::from_secs(args.timeout);
    if args.write_size < MSG_LEN {
        bail!("--write-size must be at least {MSG_LEN} bytes");
    }
    let tcp = connect(&args).await?;
    let local_ip = tcp.local_addr()?.ip();
    let mut sock = Channel::new(tcp);

    let selector = match args.gid_index {
        Some(i) => GidSelector::Index(i),
        None => GidSelector::Address(local_ip),
    };
    let (device, sgid) = match &args.device {
        Some(name) => {
            let d = Device::open(Some(name))?;
            let g = d.select_gid(&selector)?;
            (d, g)
        }
        None if args.gid_index.is_none() => Device::open_for_address(local_ip)?,
        None => {
            let d = Device::open(None)?;
            let g = d.select_gid(&selector)?;
            (d, g)
        }
    };
    tracing::info!(device = device.name(), gid = %sgid.gid, index = sgid.index, "using");

    let pd = device.alloc_pd()?;
    let send_cq = CompletionQueue::new(&device, 64)?;
    let recv_cq = CompletionQueue::new(&device, 64)?;
    let msg_mr = MemoryRegion::new(&pd, MSG_LEN, MrAccess::Local)?;
    let recv_mr = MemoryRegion::new(&pd, MSG_LEN, MrAccess::Local)?;
    let data_mr = MemoryRegion::new(&pd, args.write_size, MrAccess::RemoteWrite)?;

    let qp = QueuePair::create(&pd, &send_cq, &recv_cq, sgid.clone(), QpCaps::default())?;
    let mut qp = qp.into_init(true)?;
    // Receives go up before the peer learns our QPN, so nothing can arrive
    // to an empty receive queue: one for the SEND, one for the immediate.
    qp.post_recv(1, &recv_mr, 0..MSG_LEN)?;
    qp.post_recv(2, &recv_mr, 0..MSG_LEN)?;

    let psn = Psn::random();
    let announced = if args.wrong_psn {
        Psn::new(psn.get() ^ 0x5a_5a5a)?
    } else {
        psn
    };
    let local = Endpoint {
        gid: sgid.gid,
        qpn: qp.qpn(),
        psn: announced,
        mtu: device.active_mtu()?,
        buffer: Some(data_mr.remote()),
    };
    sock.send(&local).await?;
    let remote: Endpoint = sock.recv().await?;
    remote.validate()?;
    let mtu = local.mtu.min(remote.mtu);

    let qp = qp.into_rtr(RtrParams {
        remote_qpn: remote.qpn,
        remote_psn: remote.psn,
        remote_gid: remote.gid,
        path_mtu: mtu,
    })?;
    let mut qp = qp.into_rts(RtsParams { local_psn: psn })?;
    let queried = qp.query()?;
    tracing::info!(qpn = %qp.qpn(), peer_qpn = %remote.qpn, %mtu, "QP in RTS");

    // Both sides in RTS before anyone sends.
    sock.send(&"ready").await?;
    let _: String = sock.recv().await?;

    let role = match args.role {
        Role::Server => "server",
        Role::Client => "client",
    };
    let message = format!("hello from the {role} on {}", device.name());
    msg_mr.write(0, message.as_bytes())?;
    qp.post_send(10, &msg_mr, 0..message.len())?;
    send_cq.next_ok("our SEND to complete", timeout).await?;
    let wc = recv_cq
        .next_ok("the peer's SEND to arrive", timeout)
        .await?;
    if wc.opcode != WcOpcode::Recv {
        bail!("expected a SEND from the peer, got {}", wc.opcode);
    }
    let received = String::from_utf8_lossy(&recv_mr.read(0, wc.byte_len as usize)?).into_owned();
    tracing::info!(%received, "SEND arrived");

    let mut report = json!({
        "role": role,
        "pid": std::process::id(),
        "device": device.name(),
        "local": { "qpn": qp.qpn().get(), "psn": psn.get(), "announced_psn": announced.get(), "gid": sgid.gid.to_string() },
        "remote": { "qpn": remote.qpn.get(), "psn": remote.psn.get(), "gid": remote.gid.to_string() },
        "queried": queried,
        "mtu": mtu.bytes(),
        "received": received,
    });

    match args.role {
        Role::Client => {
            let Some(peer_buffer) = remote.buffer else {
                bail!("the server announced no buffer to RDMA WRITE into");
            };
            let data: Vec<u8> = (0..args.write_size).map(pattern).collect();
            data_mr.write(0, &data)?;
            let tail = args.write_size - MSG_LEN;
            qp.post_write(20, &data_mr, 0..tail, &peer_buffer, 0)?;
            send_cq
                .next_ok("the RDMA WRITE to complete", timeout)
                .await?;
            qp.post_write_imm(
                21,
                &data_mr,
                tail..args.write_size,
                &peer_buffer,
                tail as u64,
                IMM,
            )?;
            send_cq
                .next_ok("the RDMA WRITE WITH IMMEDIATE to complete", timeout)
                .await?;
            let verdict: serde_json::Value = sock
                .recv()
                .await
                .context("waiting for the server's verdict")?;
            report["server_verdict"] = verdict.clone();
            if verdict["write_verified"] != true {
                bail!("server did not verify the write: {verdict}");
            }
        }
        Role::Server => {
            let wc = recv_cq
                .next_ok("the WRITE WITH IMMEDIATE to land", timeout)
                .await?;
            if wc.opcode != WcOpcode::RecvRdmaWithImm {
                bail!("expected a WRITE WITH IMMEDIATE, got {}", wc.opcode);
            }
            let data = data_mr.read(0, args.write_size)?;
            let bad = data
                .iter()
                .enumerate()
                .filter(|(i, b)| **b != pattern(*i))
                .count();
            let verdict = json!({
                "imm": wc.imm_data,
                "write_bytes": data.len(),
                "bad_bytes": bad,
                "write_verified": bad == 0 && wc.imm_data == Some(IMM),
            });
            sock.send(&verdict).await?;
            report["verdict"] = verdict.clone();
            if verdict["write_verified"] != true {
                bail!("RDMA WRITE check failed: {verdict}");
            }
            tracing::info!(
                bytes = data.len(),
                imm = format!("{IMM:#x}"),
                "RDMA WRITE verified"
            );
        }
    }
    println!("{report}");
    Ok(())
}
