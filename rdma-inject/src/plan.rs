//! What a run does, checked: a [`Plan`] (on-path observe and inject, off-path blind guesses,
//! replay of a capture) with the [`LearnOptions`] of the live flow it follows. The binary's
//! command line builds one; [`run`](crate::run::run) carries it out.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use roce::MacAddr;

use crate::forge::Injection;
use crate::sealed::SealedAttack;

/// The longest forged payload: one packet, so at most the largest RoCE path MTU.
pub const MAX_PAYLOAD: usize = 4096;

/// How to learn a live flow (`--observe`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LearnOptions {
    /// The interface to observe (and send on).
    pub iface: String,
    /// The responder; `None`: the first request flow seen.
    pub dst: Option<IpAddr>,
    /// How long the flow must be quiet before injecting.
    pub quiet: Duration,
    /// Requests to see first.
    pub min_packets: u64,
    /// When to give up.
    pub timeout: Duration,
}

/// What to do, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// `--observe`: learn a flow, then inject (or only learn).
    Observe {
        /// How to learn.
        learn: LearnOptions,
        /// What to inject; `None`: learn only.
        injection: Option<Injection>,
        /// Where to save the flow's requests.
        save: Option<PathBuf>,
    },
    /// `--blind`: random PSN guesses.
    Blind {
        /// The interface.
        iface: String,
        /// Frame source; `None`: the interface's own.
        src_mac: Option<MacAddr>,
        /// Frame destination.
        dst_mac: MacAddr,
        /// Spoofed source.
        src: IpAddr,
        /// Target.
        dst: IpAddr,
        /// UDP source port.
        src_port: u16,
        /// Target QP.
        qpn: u32,
        /// How many.
        guesses: u32,
        /// PRNG seed; `None`: random.
        seed: Option<u64>,
        /// Payload of every guess.
        payload: Vec<u8>,
        /// When to stop even if guesses remain.
        timeout: Duration,
    },
    /// `--sealed-forge`, `--sealed-renumber`, `--reflect`: a sealed-message attack on a live
    /// flow of a payload-protected peer (see [`crate::sealed`]).
    Sealed {
        /// How to learn.
        learn: LearnOptions,
        /// Which attack.
        attack: SealedAttack,
        /// The header sequence to inject; `None`: the flow's next (last observed + 1).
        seq: Option<u64>,
    },
    /// `--replay`: captured requests again.
    Replay {
        /// The capture.
        file: PathBuf,
        /// The interface.
        iface: String,
        /// Renumber into this live flow; `None`: verbatim.
        live: Option<LearnOptions>,
    },
    /// `--observe` with `--read`, `--write`, or `--rkey`/`--addr`: a memory access
    /// ([`crate::memory`]) at the live flow's next PSN, then its answers watched.
    Memory {
        /// How to learn.
        learn: LearnOptions,
        /// What to send.
        access: crate::memory::MemoryAccess,
        /// How long to watch for the responder's answers.
        watch: Duration,
    },
}
