//! `rdma-inject`: the lab's attack tool against RDMA data paths that trust any packet with the
//! right QPN and PSN, such as a data path without payload protection: an attacker who sees or
//! guesses those two numbers gets its own packet delivered as the peer's. It forges RoCEv2 RC
//! packets with the `roce` encoder (valid ICRC) and sends them as raw Ethernet frames out of
//! one interface:
//!
//! * **on-path** ([`plan::Plan::Observe`]): learn a live flow's QPN, next PSN, addresses, UDP
//!   port and any WRITE's rkey/address, then inject the next-PSN SEND or WRITE WITH IMMEDIATE;
//! * **off-path** ([`plan::Plan::Blind`]): random-PSN guesses at a known QPN;
//! * **replay** ([`plan::Plan::Replay`]): captured requests again, verbatim or renumbered into a
//!   live flow;
//! * **sealed** ([`plan::Plan::Sealed`], module [`sealed`]): secure-rdma's sealed messages, their
//!   clear header learned from the flow: forgeries, renumbered and reflected messages that only
//!   the receiver's AEAD tag refuses.
//!
//! Everything that decides what goes on the wire is pure and tested on the host; only [`net`]
//! touches sockets, and [`run`] ties the two together. The PSN arithmetic (next, wrap at 2^24,
//! "ahead") is `roce::psn`'s, so the tool and the capture agree on it. The command line is the
//! binary's (`src/bin/rdma-inject/`, behind the default `cli` feature): the library has no
//! argument parser, and its errors ([`run::RunError`]) say what went wrong and carry what a
//! program needs to say which of its settings to change; the flags those hints name, and the
//! exit codes, are the binary's.
//!
//! Modules, in reading order:
//!
//! 1. [`mac`] — MAC addresses from text and sysfs;
//! 2. [`learn`] — [`learn::FlowLearner`]: a victim's request flow from decoded packets (only
//!    SEND and RDMA WRITE advance the PSN);
//! 3. [`forge`] — the frames: next-PSN SEND / WRITE WITH IMMEDIATE, blind guesses, renumbered
//!    replays;
//! 4. [`replay`] — the request packets of a capture file;
//! 5. [`report`] — what is printed: one line or JSON object per injected packet, a summary;
//! 6. [`plan`] — what a run does, checked: a [`plan::Plan`];
//! 7. [`net`] — the interface and its two AF_PACKET sockets (the only `unsafe` code);
//! 8. [`run`] — runs a plan: sockets first, then learn, forge, send;
//! 9. [`memory`] — memory-access attacks: an RDMA READ or WRITE with a chosen rkey and address,
//!    and the responder's answers (READ responses, ACK, NAK).
//!
//! ```
//! use rdma_inject::forge::{forge, Injection};
//! use rdma_inject::learn::FlowLearner;
//! use roce::{Opcode, PacketBuilder};
//!
//! // A captured SEND from 10.77.0.2 to QP 17 on 10.77.0.1 ...
//! let seen = PacketBuilder::new(Opcode::RC_SEND_ONLY)
//!     .ipv4([10, 77, 0, 2].into(), [10, 77, 0, 1].into())
//!     .dest_qp(17)
//!     .psn(0x83_f247)
//!     .payload(*b"genuine")
//!     .frame()?;
//! let mut learner = FlowLearner::new(Some([10, 77, 0, 1].into()));
//! learner.observe(&roce::decode_ethernet(&seen)?);
//! // ... is all it takes to forge the next message.
//! let forged = forge(learner.flow().unwrap(), &Injection::Send(b"FORGED".to_vec()))?;
//! let p = roce::decode_ethernet(&forged.frame)?;
//! assert_eq!((p.bth.psn, p.payload, p.icrc_ok), (0x83_f248, &b"FORGED"[..], true));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod forge;
pub mod learn;
pub mod mac;
pub mod memory;
pub mod net;
pub mod plan;
pub mod replay;
pub mod report;
pub mod run;
pub mod sealed;
mod sealed_run;

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
