//! What the workspace's binaries share, so the five tools behave as one family.
//!
//! Library crates (`secure-rdma`, `roce`, `rdma-quota`, …) only emit `tracing` events; choosing
//! where they go is the program's decision, so the subscriber is installed here, by binaries.
//! This crate is never a dependency of a library.
//!
//! Modules:
//! - [`logging`]: `--log-format text|json` and the one place a subscriber is installed.
//! - [`docs`]: the hidden `--generate-docs DIR` of every binary: man pages (clap_mangen) and
//!   bash, zsh and fish completions (clap_complete) from the binary's own clap definition.
//! - `choices` (feature `secure-rdma`): `--poll busy|event` and `--cipher
//!   auto|aes-256-gcm|chacha20-poly1305`, as enums whose values `--help` lists.

#![warn(missing_docs)]

#[cfg(feature = "secure-rdma")]
pub mod choices;
pub mod docs;
pub mod logging;

/// The crate's README, whose examples run as doctests so they cannot go stale.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
