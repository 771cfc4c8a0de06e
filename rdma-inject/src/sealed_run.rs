//! Running a sealed-message attack ([`Plan::Sealed`](crate::plan::Plan::Sealed)): learn the
//! live flow and its sealed sequence, wait for it to go quiet (and, for reflection, for the
//! responder's own message with the right sequence), then inject one message at the next PSN.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use roce::PacketBuilder;

use crate::forge::{forge, renumber, ForgeError, Forged, Injection};
use crate::net::Observer;
use crate::plan::LearnOptions;
use crate::report::{flow_text, Reporter, SealedSummary, Summary};
use crate::run::{
    elapsed_ms, out, read_requests, replay_decode, sockets, watch_until_quiet, NotLearned,
    RunError, Shortfall,
};
use crate::sealed::{
    forgery, renumbered, sealed_in, SealedAttack, SealedHeader, SealedLearner, SealedReport,
    OP_SEND, OP_WRITE, OVERHEAD, TAG_LEN, WIRE_VERSION,
};

/// The longest random ciphertext of a forgery: one packet of the smallest path MTU RoCE
/// commonly runs (1024 bytes), less the sealing overhead, so the forgery is a SEND Only.
pub const MAX_RANDOM_CIPHERTEXT: usize = 1024 - OVERHEAD;

/// What learning saw.
#[derive(Debug, Default)]
struct Counts {
    frames: u64,
    roce: u64,
}

/// Runs `attack` on the flow `opts` describes; `seq`: the header sequence to use instead of
/// the one after the last observed.
pub(crate) fn run_sealed<W: Write>(
    opts: &LearnOptions,
    attack: &SealedAttack,
    seq: Option<u64>,
    rep: &mut Reporter<W>,
) -> Result<(), RunError> {
    let start = Instant::now();
    let (iface, sender, mut obs) = sockets(&opts.iface)?;
    // A capture that cannot serve is refused before waiting on the live flow.
    let source = match attack {
        SealedAttack::Renumber { file } => Some(first_sealed(file)?),
        _ => None,
    };
    let mut counts = Counts::default();
    let learner = learn(&mut obs, opts, attack, seq, &mut counts)?;
    let Some(flow) = learner.flow().cloned() else {
        // learn() returns only once the flow is known.
        return Err(RunError::NothingLearned(Box::new(not_learned(
            &learner, opts, attack, seq, &counts,
        ))));
    };
    rep.learned(&flow).map_err(out)?;
    let target = target_seq(&learner, seq).unwrap_or(1);
    let (forged, injected, source_header): (Forged, SealedHeader, Option<SealedHeader>) =
        match attack {
            SealedAttack::Forge { text } => {
                let template = learner.last().unwrap_or(SealedHeader {
                    version: WIRE_VERSION,
                    op: OP_SEND,
                    epoch: 0,
                    lane: 0,
                    seq: 0,
                    len: 0,
                });
                let ciphertext = match text {
                    Some(t) => t.clone(),
                    None => {
                        let n = usize::try_from(template.len)
                            .unwrap_or(MAX_RANDOM_CIPHERTEXT)
                            .min(MAX_RANDOM_CIPHERTEXT);
                        std::iter::repeat_with(|| fastrand::u8(..))
                            .take(n)
                            .collect()
                    }
                };
                let mut tag = [0u8; TAG_LEN];
                fastrand::fill(&mut tag);
                let msg = forgery(template, target, &ciphertext, tag)
                    .ok_or(ForgeError::PayloadTooLong(ciphertext.len()))?;
                let header = SealedHeader::parse_message(&msg)
                    .ok_or(ForgeError::PayloadTooLong(ciphertext.len()))?;
                let injection = if template.op == OP_WRITE {
                    Injection::WriteImm {
                        data: msg,
                        imm: None,
                    }
                } else {
                    Injection::Send(msg)
                };
                (forge(&flow, &injection)?, header, None)
            }
            SealedAttack::Renumber { file } => {
                let Some((frame, header)) = source else {
                    return Err(RunError::NoSealedInCapture {
                        path: file.clone(),
                        requests: 0,
                    });
                };
                let p = decode(&frame, file)?;
                let msg = renumbered(p.payload, target).ok_or(RunError::NoSealedInCapture {
                    path: file.clone(),
                    requests: 1,
                })?;
                let rebuilt = PacketBuilder::from_packet(&p)
                    .payload(msg)
                    .frame()
                    .map_err(ForgeError::from)?;
                let q = decode(&rebuilt, file)?;
                let forged = renumber(&q, &flow, flow.next_psn)?;
                (
                    forged,
                    SealedHeader {
                        seq: target,
                        ..header
                    },
                    Some(header),
                )
            }
            SealedAttack::Reflect => {
                let Some(m) = learner.reverse_with_seq(target) else {
                    return Err(RunError::NothingLearned(Box::new(not_learned(
                        &learner, opts, attack, seq, &counts,
                    ))));
                };
                // Unreachable in practice: the frame decoded when it was kept.
                let p = roce::decode_ethernet(&m.frame).map_err(|e| RunError::File {
                    what: "decoding the reflected frame",
                    path: opts.iface.clone().into(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
                })?;
                (
                    renumber(&p, &flow, flow.next_psn)?,
                    m.header,
                    Some(m.header),
                )
            }
        };
    sender.send(&forged.frame)?;
    tracing::info!(
        attack = attack.name(),
        seq = injected.seq,
        len = injected.len,
        epoch = injected.epoch,
        psn = forged.psn,
        "injected a sealed message"
    );
    rep.injected(&forged).map_err(out)?;
    rep.summary(&Summary::Sealed(SealedSummary {
        iface: iface.name().to_owned(),
        dst: opts.dst,
        frames_seen: counts.frames,
        roce_packets: counts.roce,
        flow: Some(flow),
        injected: 1,
        sealed: SealedReport {
            attack: attack.name(),
            observed: learner.last(),
            sealed_seen: learner.sealed_seen(),
            injected,
            source: source_header,
        },
        elapsed_ms: elapsed_ms(start),
    }))
    .map_err(out)
}

fn target_seq(l: &SealedLearner, seq: Option<u64>) -> Option<u64> {
    seq.or(l.next_seq())
}

fn decode<'a>(frame: &'a [u8], file: &Path) -> Result<roce::Packet<'a>, RunError> {
    roce::decode_ethernet(frame).map_err(|e| replay_decode(file, e))
}

/// The first request of a capture that carries a whole sealed message (SEND Only or WRITE
/// Only with Immediate), and its header.
fn first_sealed(file: &Path) -> Result<(Vec<u8>, SealedHeader), RunError> {
    let requests = read_requests(file)?;
    for r in &requests {
        let Ok(p) = r.packet() else { continue };
        // Only a message in one packet: a multi-packet one would need every packet renumbered.
        if let Some(h) = sealed_in(&p).filter(|_| SealedHeader::parse_message(p.payload).is_some())
        {
            return Ok((r.frame.clone(), h));
        }
    }
    Err(RunError::NoSealedInCapture {
        path: file.to_owned(),
        requests: requests.len(),
    })
}

/// True when the attack has what it needs.
fn has_what_it_needs(l: &SealedLearner, attack: &SealedAttack, seq: Option<u64>) -> bool {
    let Some(target) = target_seq(l, seq) else {
        return false;
    };
    !matches!(attack, SealedAttack::Reflect) || l.reverse_with_seq(target).is_some()
}

fn not_learned(
    l: &SealedLearner,
    opts: &LearnOptions,
    attack: &SealedAttack,
    seq: Option<u64>,
    counts: &Counts,
) -> NotLearned {
    let missing = match (l.flow(), target_seq(l, seq)) {
        (None, _) => Shortfall::NoRequest,
        (Some(f), _) if f.requests < opts.min_packets => Shortfall::TooFewRequests {
            seen: f.requests,
            wanted: opts.min_packets,
        },
        (Some(_), None) => Shortfall::NoSealed,
        (Some(_), Some(t)) if !has_what_it_needs(l, attack, seq) => {
            Shortfall::NoReflection { seq: t }
        }
        (Some(_), Some(_)) => Shortfall::NeverQuiet { quiet: opts.quiet },
    };
    NotLearned {
        missing,
        iface: opts.iface.clone(),
        secs: opts.timeout.as_secs(),
        frames: counts.frames,
        roce: counts.roce,
        dst: opts.dst,
    }
}

/// Watches the interface until the flow has `min_packets` requests, no open message, a
/// sealed sequence (or `seq`), what `attack` needs, and has been quiet for `quiet`.
fn learn(
    obs: &mut Observer,
    opts: &LearnOptions,
    attack: &SealedAttack,
    seq: Option<u64>,
    counts: &mut Counts,
) -> Result<SealedLearner, RunError> {
    let mut learner = SealedLearner::new(opts.dst);
    tracing::info!(
        iface = opts.iface,
        dst = ?opts.dst,
        attack = attack.name(),
        "observing {} for sealed RC requests{}",
        opts.iface,
        opts.dst.map(|d| format!(" to {d}")).unwrap_or_default()
    );
    let learned = watch_until_quiet(
        obs,
        opts,
        &mut learner,
        &mut counts.frames,
        &mut counts.roce,
        |l| {
            l.flow()
                .is_some_and(|f| f.requests >= opts.min_packets && !f.message_open)
                && has_what_it_needs(l, attack, seq)
        },
        |l, p, frame| {
            let verdict = l.observe_frame(p, frame.frame);
            tracing::trace!(?verdict, opcode = p.opcode().name(), psn = p.bth.psn, sealed = ?sealed_in(p), "packet");
            Ok(verdict)
        },
    )?;
    match (learned, learner.flow()) {
        (true, Some(f)) => {
            tracing::info!(
                next_seq = target_seq(&learner, seq),
                "learned {}",
                flow_text(f)
            );
            Ok(learner)
        }
        _ => Err(RunError::NothingLearned(Box::new(not_learned(
            &learner, opts, attack, seq, counts,
        )))),
    }
}
