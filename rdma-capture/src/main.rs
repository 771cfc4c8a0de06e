//! `rdma-capture`: capture RoCEv2 traffic of Soft-RoCE with eBPF, decode every header, check
//! every ICRC, print text or JSON lines, write pcap. Argument parsing and wiring only; the work
//! is in the `rdma_capture` library.

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{ArgGroup, Parser};
use rdma_capture::filter::ClassFilter;
use rdma_capture::loader::{Capture, CapturePoint};
use rdma_capture::netdev;
use rdma_capture::offline;
use rdma_capture::output::OutputFile;
use rdma_capture::processor::{KernelCounters, Output, Processor, ProcessorConfig};
use rdma_capture::{wall_time, MAX_SNAPLEN};
use rdma_cli::logging::{self, LogFormat};
use roce::follow::DEFAULT_MAX_FLOWS;

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Ctrl-C while reading a pipe (`tcpdump -U -w - | rdma-capture -r -`) reaches both programs:
/// the writer flushes and exits, and the packets it flushed are still decoded before the
/// summary. A second Ctrl-C, for a writer that does not stop, exits at once.
extern "C" fn on_signal_reading_pipe(_: libc::c_int) {
    if STOP.swap(true, Ordering::Relaxed) {
        // SAFETY: _exit is async-signal-safe; nothing is left to clean up when reading a pipe.
        unsafe { libc::_exit(130) };
    }
}

/// Capture RoCEv2 (UDP 4791) traffic of Soft-RoCE with eBPF and decode it.
///
/// By default XDP (received frames) and TC (sent frames) programs are attached to the netdev:
/// what crosses the wire. With --rxe, kprobes inside rxe see every packet an rxe device sends
/// and receives, including traffic between two QPs of the same device, which never reaches a
/// netdev. Needs root (or CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON). Stops on Ctrl-C, after
/// --count packets or --duration seconds, and prints a summary: packets per opcode, bad ICRCs,
/// kernel-side drops, and the PSN history of every followed sequence (each direction's
/// requests, and its responses).
///
/// One line per packet by default; -v shows every header, -x adds a hex dump. -r reads pcap
/// and pcapng files (Ethernet, raw IP, and tcpdump -i any's Linux cooked SLL/SLL2), from a
/// pipe with -r -:  tcpdump -i any -U -w - udp port 4791 | rdma-capture -r -
#[derive(Parser, Debug)]
#[command(
    version,
    name = "rdma-capture",
    after_help = EXIT_CODES,
    group(ArgGroup::new("where").required(true).args(["interface", "device", "read"]))
)]
struct Args {
    /// Netdev to capture on (e.g. veth-a).
    #[arg(short = 'i', long, value_name = "NETDEV")]
    interface: Option<String>,
    /// RDMA device (e.g. rxe-a): capture on the netdev under it, or with --rxe, its packets only.
    #[arg(short = 'd', long, value_name = "RXE_DEVICE")]
    device: Option<String>,
    /// Capture inside rxe with kprobes instead of on the netdev (same-device traffic too).
    #[arg(long)]
    rxe: bool,
    /// Decode this capture file instead of capturing; needs no privileges. pcap or pcapng
    /// (told by their contents, not the name), with Ethernet, raw IP or Linux cooked (SLL,
    /// SLL2: tcpdump -i any) records. "-" reads standard input as the packets arrive.
    #[arg(short = 'r', long, value_name = "FILE.pcap", conflicts_with_all = ["interface", "device", "rxe", "duration"])]
    read: Option<PathBuf>,
    /// Write the packets shown to this pcap file (Ethernet, nanosecond timestamps). Created
    /// mode 0600 (it holds payloads); a symlink at the path is refused, an existing file
    /// replaced, and the file is removed again if the capture fails. "-" writes the pcap to
    /// standard output; the packet lines then go to standard error (-q: none).
    #[arg(short = 'w', long, value_name = "FILE.pcap")]
    write: Option<PathBuf>,
    /// Print one JSON object per packet, and the summary as a final {"summary": …} line.
    #[arg(long, conflicts_with = "quiet")]
    json: bool,
    /// Print no packets, only the summary.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Print every header of each packet on a line of its own (link layer, IP, UDP, BTH,
    /// extension headers, payload preview, ICRC check) instead of one line per packet.
    #[arg(short = 'v', long, conflicts_with_all = ["json", "quiet"])]
    verbose: bool,
    /// Follow each packet with a hex and ASCII dump of its captured bytes.
    #[arg(short = 'x', long, conflicts_with_all = ["json", "quiet"])]
    hex: bool,
    /// Show only this QP: packets to it and its peer's packets back (recognised when a response
    /// answers a request, and printed from their first one); flags PSN gaps, duplicates and
    /// retransmissions per direction. Decimal or 0x-hex.
    #[arg(long, value_name = "QPN", value_parser = parse_qpn)]
    qpn: Option<u32>,
    /// Show only these opcode classes, comma-separated: send, write, read, atomic, ack, cnp,
    /// or a transport: rc, uc, rd, ud, xrc.
    #[arg(long, value_name = "CLASSES", value_parser = parse_classes)]
    class: Option<ClassFilter>,
    /// The most PSN flows (address, port, QP, stream) followed at once; beyond it the least
    /// recently seen are forgotten (unfollowed first) and counted in the summary. Bounds
    /// memory against spoofed traffic: about 220 bytes a flow.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_FLOWS, value_parser = parse_max_flows)]
    max_flows: usize,
    /// Path MTU in bytes, so the PSN follower knows how many PSNs an RDMA READ reserves.
    #[arg(long, value_name = "BYTES")]
    mtu: Option<u32>,
    /// Stop after this many packets have been shown.
    #[arg(short = 'c', long)]
    count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    duration: Option<Duration>,
    /// Bytes captured per packet (1..=2048; the default keeps whole packets at MTU 1500).
    #[arg(short = 's', long, value_name = "BYTES", default_value_t = MAX_SNAPLEN,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_SNAPLEN)))]
    snaplen: u32,
    /// Use generic (SKB) XDP only, never driver mode.
    #[arg(long)]
    xdp_skb: bool,
    /// Received frames only (XDP).
    #[arg(long, conflicts_with_all = ["egress_only", "rxe"])]
    ingress_only: bool,
    /// Sent frames only (TC egress).
    #[arg(long, conflicts_with = "rxe")]
    egress_only: bool,
    /// Log format on stderr (RUST_LOG sets the level, default warn); packets and the summary
    /// are output, not logs.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t)]
    log_format: LogFormat,
}

/// What `rdma-capture --help` says about how it exits.
const EXIT_CODES: &str = "\
Exit codes:
  0  the capture or the file was read to its end (Ctrl-C, --count, --duration), summary printed
  1  any failure, the reason on stderr as `rdma-capture: error: ...` (eBPF cannot attach: run as
     root or with CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON; no such netdev or RDMA device; a file
     that is not a capture; -w - to a terminal; a write that failed, its file removed)
  2  usage: an unknown flag, a bad value, or none of -i, -d, -r (clap's error)
  130  a second Ctrl-C while reading standard input (-r -) whose writer did not stop";

fn parse_qpn(s: &str) -> Result<u32, String> {
    let n = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|_| format!("{s:?} is not a number"))?;
    if n > 0xff_ffff {
        return Err(format!(
            "{s} is not a QPN (QPNs are 24 bits, at most 0xffffff)"
        ));
    }
    Ok(n)
}

fn parse_max_flows(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_owned()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a number")),
    }
}

fn parse_classes(s: &str) -> Result<ClassFilter, String> {
    ClassFilter::parse(s).map_err(|e| e.to_string())
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s} is not a duration in seconds"))
}

fn capture_point(args: &Args) -> Result<(CapturePoint, String)> {
    let netdev = match (&args.interface, &args.device) {
        (Some(iface), _) => iface.clone(),
        (None, Some(dev)) => netdev::netdev_of_rdma_device(dev).with_context(|| {
            format!("RDMA device {dev:?} not found, or no netdev under it (see `rdma link show`)")
        })?,
        (None, None) => bail!("give -i NETDEV, -d RXE_DEVICE or -r FILE"),
    };
    let ifindex = netdev::ifindex_of(&netdev)
        .with_context(|| format!("network interface {netdev:?} not found (see `ip link`)"))?;
    if args.rxe {
        return Ok((
            CapturePoint::Rxe {
                ifindex: Some(ifindex),
            },
            format!("rxe on {netdev}"),
        ));
    }
    Ok((
        CapturePoint::Netdev {
            iface: netdev.clone(),
            ingress: !args.egress_only,
            egress: !args.ingress_only,
            xdp_skb: args.xdp_skb,
        },
        netdev,
    ))
}

/// `realtime - monotonic`, to turn `bpf_ktime_get_ns` stamps into wall-clock time.
fn monotonic_offset_ns() -> i128 {
    let ts = |clock| {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes into a valid timespec.
        unsafe { libc::clock_gettime(clock, &mut t) };
        i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec)
    };
    ts(libc::CLOCK_REALTIME) - ts(libc::CLOCK_MONOTONIC)
}

/// Where `-w` writes the pcap: a private file, or standard output (`-w -`).
enum PcapSink {
    File(BufWriter<File>),
    Stdout(BufWriter<io::StdoutLock<'static>>),
}

impl Write for PcapSink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            PcapSink::File(w) => w.write(buf),
            PcapSink::Stdout(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            PcapSink::File(w) => w.flush(),
            PcapSink::Stdout(w) => w.flush(),
        }
    }
}

impl PcapSink {
    /// Flushes everything written, and for a file, makes it durable.
    fn close(self) -> io::Result<()> {
        match self {
            PcapSink::File(w) => w.into_inner().map_err(|e| e.into_error())?.sync_all(),
            PcapSink::Stdout(mut w) => w.flush(),
        }
    }
}

/// `-` as a file name: standard input or output.
fn is_dash(path: &Path) -> bool {
    path.as_os_str() == "-"
}

fn main() {
    // The hidden `--generate-docs DIR`: man pages and completions for the package.
    rdma_cli::docs::generate_if_asked(<Args as clap::CommandFactory>::command);
    let args = Args::parse();
    logging::init(args.log_format, "warn");
    if let Err(e) = run(&args) {
        eprintln!("rdma-capture: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<()> {
    let pcap_to_stdout = args.write.as_deref().is_some_and(is_dash);
    if pcap_to_stdout && io::stdout().is_terminal() {
        bail!("-w - writes a binary pcap to standard output, which is a terminal: pipe it (`| wireshark -k -i -`, `| tcpdump -r -`) or redirect it to a file");
    }
    // Removed again (when `output` drops) unless the capture completes.
    let (output, pcap): (Option<OutputFile>, Option<PcapSink>) = match &args.write {
        Some(_) if pcap_to_stdout => (
            None,
            Some(PcapSink::Stdout(BufWriter::new(io::stdout().lock()))),
        ),
        Some(path) => {
            let (guard, file) = OutputFile::create(path)?;
            (Some(guard), Some(PcapSink::File(BufWriter::new(file))))
        }
        None => (None, None),
    };
    let format = match (args.json, args.quiet, args.verbose) {
        (true, _, _) => Output::Json,
        (_, true, _) => Output::Quiet,
        (_, _, true) => Output::Verbose,
        _ => Output::Text,
    };
    let config = ProcessorConfig {
        qpn: args.qpn,
        classes: args.class.clone().unwrap_or_default(),
        path_mtu: args.mtu,
        output: format,
        hex: args.hex,
        max_flows: args.max_flows,
    };
    let mut processor = Processor::new(config, pcap, args.snaplen)?;
    // Standard output carries the pcap with -w -, so the packet lines go to standard error.
    let mut out: Box<dyn Write> = if pcap_to_stdout {
        Box::new(BufWriter::new(io::stderr().lock()))
    } else {
        Box::new(BufWriter::new(io::stdout().lock()))
    };

    let (label, kernel) = match &args.read {
        Some(path) if is_dash(path) => {
            // SAFETY: installs an async-signal-safe handler that only stores an atomic (or
            // calls _exit).
            unsafe {
                let handler: extern "C" fn(libc::c_int) = on_signal_reading_pipe;
                libc::signal(libc::SIGINT, handler as libc::sighandler_t);
            }
            // Each packet's lines are flushed as it is decoded: the pipe may be a live capture.
            offline::replay_stream(
                io::stdin().lock(),
                &mut processor,
                |l| {
                    writeln!(out, "{l}")?;
                    out.flush()
                },
                args.count,
            )
            .context("standard input (-r -)")?;
            ("standard input".to_owned(), KernelCounters::default())
        }
        Some(path) => {
            let file =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            offline::replay(&file, &mut processor, |l| writeln!(out, "{l}"), args.count)
                .with_context(|| format!("{}", path.display()))?;
            (path.display().to_string(), KernelCounters::default())
        }
        None => live(args, &mut processor, &mut out)?,
    };

    let summary = processor.summary(kernel);
    if format == Output::Json {
        let line = serde_json::json!({ "summary": summary });
        writeln!(out, "{line}").context("writing output")?;
    }
    out.flush().context("writing output")?;
    drop(out);
    if let Some(sink) = processor.finish().context("writing the pcap file")? {
        sink.close().context("writing the pcap file")?;
    }
    if let Some(output) = output {
        output.keep();
    }
    eprintln!("--- rdma-capture summary ({label}) ---\n{summary}");
    Ok(())
}

/// Captures until Ctrl-C, --count or --duration; returns the label and the kernel's counters.
fn live<W: Write>(
    args: &Args,
    processor: &mut Processor<W>,
    out: &mut impl Write,
) -> Result<(String, KernelCounters)> {
    let (point, label) = capture_point(args)?;
    let mut capture = Capture::start(&point, args.snaplen)?;
    for what in capture.attached() {
        eprintln!("rdma-capture: attached {what}");
    }
    // SAFETY: installs an async-signal-safe handler that only stores an atomic.
    unsafe {
        let handler: extern "C" fn(libc::c_int) = on_signal;
        libc::signal(libc::SIGINT, handler as libc::sighandler_t);
        libc::signal(libc::SIGTERM, handler as libc::sighandler_t);
    }
    let offset = monotonic_offset_ns();
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut failure = None;
    loop {
        capture.drain(|record| {
            match processor.process(record, wall_time(record.ktime_ns, offset)) {
                Ok(lines) => {
                    if let Err(e) = lines.iter().try_for_each(|line| writeln!(out, "{line}")) {
                        failure = Some(anyhow::Error::from(e).context("writing output"));
                    }
                }
                Err(e) => failure = Some(anyhow::Error::from(e).context("writing the pcap file")),
            }
            failure.is_none() && args.count.is_none_or(|c| processor.shown() < c)
        });
        if let Some(e) = failure {
            return Err(e);
        }
        out.flush().context("writing output")?;
        if STOP.load(Ordering::Relaxed)
            || args.count.is_some_and(|c| processor.shown() >= c)
            || deadline.is_some_and(|d| Instant::now() >= d)
        {
            return Ok((label, capture.counters()));
        }
        capture.wait(Duration::from_millis(100));
    }
}
