//! `tcp-reset`: an on-path attacker that resets the client's TLS connection right after the
//! client sends a command over RDMA (issue 20, test 3; tests/tests/resume_lab.rs).
//!
//! It watches the client's link (`--watch`, the lab's `veth-b`) in both directions and
//! follows every TCP connection between `--server` and `--client`: the next sequence number
//! the client expects from the server is all a reset needs (RFC 5961: an exact match is
//! accepted, anything else only draws a challenge ACK). Once the client has ended its
//! `--after-messages`-th RDMA message (a SEND or WRITE, Last or Only), it sends a reset "from"
//! the server out of `--inject` (`veth-a`: a frame leaving it arrives at `veth-b` as the
//! server's own). With `--after-messages 0` it resets right after the first data segment from
//! the server instead.
//!
//! The race it can lose: the server's acknowledgement of that message may reach the client
//! first and move the sequence number on. So for `--settle` milliseconds it sends another
//! reset after each data segment the server sends on that connection (a reset to a connection
//! the client already closed matches no socket and changes nothing).
//!
//! Start it before the client connects: it must have seen the connection's segments.
//! Prints one JSON line per reset, `{"reset":{...}}`, and a `{"summary":{...}}`; exits 0 after
//! a reset, 1 if none was sent before `--timeout`, 2 on bad arguments. Needs CAP_NET_RAW.

use std::collections::HashMap;
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use rdma_inject::net::{Interface, Observer, Sender};
use secure_rdma_tests::tcp::{ends_rdma_message, flags, rst_frame, Flow, Segment};
use serde_json::json;

/// Resets the client's TCP connection to the server right after the client's RDMA message.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The server's TCP address (its TLS port).
    #[arg(long)]
    server: SocketAddrV4,
    /// The client's address.
    #[arg(long, default_value = "10.77.0.2")]
    client: Ipv4Addr,
    /// The interface to watch: the client's link.
    #[arg(long, default_value = "veth-b")]
    watch: String,
    /// The interface to send the reset out of: a frame leaving it reaches the client.
    #[arg(long, default_value = "veth-a")]
    inject: String,
    /// Reset right after the client's Nth RDMA message (0: after the server's first data
    /// segment seen).
    #[arg(long, default_value_t = 1)]
    after_messages: u32,
    /// Count only RDMA messages whose last packet carries at least this many payload bytes,
    /// so that a test can mark the one to cut by its size.
    #[arg(long, default_value_t = 0)]
    min_payload: usize,
    /// After the first reset, keep resetting after each data segment of the server on that
    /// connection for this long (milliseconds).
    #[arg(long, default_value_t = 1000)]
    settle: u64,
    /// Give up (exit 1) when nothing triggered within this many seconds.
    #[arg(long, default_value_t = 120)]
    timeout: u64,
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("tcp-reset: {e:#}");
            std::process::exit(1);
        }
    }
}

/// What the watcher knows of the client's connections.
struct Watch {
    /// Server → client flows, by the client's port.
    to_client: HashMap<u16, Flow>,
    /// Client → server flows, by the client's port.
    to_server: HashMap<u16, Flow>,
    /// The client's port of the connection a segment was last seen on.
    latest: Option<u16>,
}

impl Watch {
    /// Takes in a segment of the connection; true if it is a data segment of the server's.
    fn segment(&mut self, s: &Segment, server: SocketAddrV4, client: Ipv4Addr) -> bool {
        if s.src == server && *s.dst.ip() == client {
            let port = s.dst.port();
            self.to_client
                .entry(port)
                .and_modify(|f| f.update(s))
                .or_insert_with(|| Flow::from_segment(s));
            if !s.has(flags::RST) {
                self.latest = Some(port);
            }
            s.payload_len > 0 && !s.has(flags::RST)
        } else if s.dst == server && *s.src.ip() == client {
            let port = s.src.port();
            self.to_server
                .entry(port)
                .and_modify(|f| f.update(s))
                .or_insert_with(|| Flow::from_segment(s));
            if !s.has(flags::RST) {
                self.latest = Some(port);
            }
            false
        } else {
            false
        }
    }
}

fn run(args: &Args) -> Result<bool> {
    let watch_if = Interface::by_name(&args.watch)?;
    let inject_if = Interface::by_name(&args.inject)?;
    let src_mac = inject_if.mac()?;
    let dst_mac = watch_if.mac()?;
    let mut observer = Observer::open(&watch_if)?;
    let sender = Sender::open(&inject_if)?;
    eprintln!(
        "tcp-reset: watching {} for {} <-> {}",
        args.watch, args.server, args.client
    );

    let mut w = Watch {
        to_client: HashMap::new(),
        to_server: HashMap::new(),
        latest: None,
    };
    let mut messages = 0u32;
    let mut triggered = args.after_messages == 0;
    // The connection reset, and until when to follow it up.
    let mut reset: Option<(u16, Instant)> = None;
    let mut resets = 0u32;
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let mut stdout = std::io::stdout();

    loop {
        let now = Instant::now();
        match reset {
            Some((_, until)) if now >= until => break,
            None if now >= deadline => break,
            _ => {}
        }
        let Some(seen) = observer.next(Duration::from_millis(50))? else {
            continue;
        };
        let mut fire = None;
        if let Some(s) = Segment::parse(seen.frame) {
            let server_data = w.segment(&s, args.server, args.client);
            match reset {
                // A follow-up: the server sent more on the connection we reset.
                Some((port, _)) if server_data && s.dst.port() == port => fire = Some(port),
                // `--after-messages 0`, or triggered before any segment of the server was
                // seen: right after this one.
                None if triggered && server_data => fire = Some(s.dst.port()),
                _ => {}
            }
        } else if reset.is_none()
            && !triggered
            && ends_rdma_message(seen.frame, args.client, *args.server.ip(), args.min_payload)
        {
            messages += 1;
            if messages >= args.after_messages {
                triggered = true;
                fire = w.latest;
            }
        }
        let Some(port) = fire else { continue };
        let Some(flow) = w.to_client.get(&port).copied() else {
            continue;
        };
        // What the server has received of the client: the client's next sequence number.
        let ack = w.to_server.get(&port).map_or(flow.ack, |f| f.next);
        let client = SocketAddrV4::new(args.client, port);
        let frame = rst_frame(src_mac, dst_mac, args.server, client, flow.next, ack);
        sender.send(&frame).context("sending the reset")?;
        resets += 1;
        if reset.is_none() {
            reset = Some((port, Instant::now() + Duration::from_millis(args.settle)));
        }
        let line = json!({"reset": {
            "server": args.server.to_string(),
            "client": client.to_string(),
            "seq": flow.next,
            "ack": ack,
            "after_messages": messages,
            "follow_up": resets > 1,
        }});
        writeln!(stdout, "{line}")?;
        stdout.flush()?;
    }
    let line = json!({"summary": {
        "resets": resets,
        "messages_seen": messages,
        "connections_seen": w.to_client.len(),
    }});
    writeln!(stdout, "{line}")?;
    if resets == 0 {
        eprintln!(
            "tcp-reset: nothing to reset within {} s ({messages} RDMA messages, {} connections seen)",
            args.timeout,
            w.to_client.len()
        );
    }
    Ok(resets > 0)
}
