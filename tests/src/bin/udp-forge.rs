//! `udp-forge`: what any local user can do without privileges: send a forged RoCEv2 SEND
//! Only (valid ICRC, built with the `roce` encoder) to a queue pair with an ordinary UDP
//! socket. The local-user lab test (tests/tests/restrict_local_lab.rs) runs it as `nobody`,
//! with and without `setup-softroce.sh --restrict-local`.
//!
//! Prints one JSON line, `{"uid":65534,"sent":62}` or
//! `{"uid":65534,"error":"Operation not permitted (os error 1)","errno":1}`, and exits 0 if
//! the datagram was sent, 1 if not.

use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;

use anyhow::{Context, Result};
use clap::Parser;
use secure_rdma_tests::inject::{send_only, FORGED_SRC_PORT};
use serde_json::json;

/// Sends one forged RC SEND Only from 10.77.0.2 to 10.77.0.1:4791 over a UDP socket.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The destination QP number.
    #[arg(long)]
    qpn: u32,
    /// The packet sequence number.
    #[arg(long)]
    psn: u32,
    /// The UDP source port (the ICRC covers it).
    #[arg(long, default_value_t = FORGED_SRC_PORT)]
    src_port: u16,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let from = SocketAddrV4::new([10, 77, 0, 2].into(), args.src_port);
    let to = SocketAddr::from(([10, 77, 0, 1], roce::ROCE_V2_PORT));
    let payload = send_only(args.qpn, args.psn, args.src_port)
        .udp_payload()
        .context("building the packet")?;
    let socket = UdpSocket::bind(from).with_context(|| format!("binding {from}"))?;
    // Don't Fragment on an unconnected socket makes the kernel send IP identification 0,
    // which the ICRC was computed with.
    let pmtudisc_do: libc::c_int = libc::IP_PMTUDISC_DO;
    // SAFETY: a valid socket and an int option of the right size.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            (&pmtudisc_do as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("setting IP_MTU_DISCOVER");
    }
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    match socket.send_to(&payload, to) {
        Ok(n) => {
            println!("{}", json!({"uid": uid, "sent": n}));
            Ok(())
        }
        Err(e) => {
            println!(
                "{}",
                json!({"uid": uid, "error": e.to_string(), "errno": e.raw_os_error()})
            );
            std::process::exit(1);
        }
    }
}
