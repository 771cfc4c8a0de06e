//! What the workspace's binaries share, so the five tools behave as one family.
//!
//! Library crates (`secure-rdma`, `roce`, `rdma-quota`, …) only emit `tracing` events; choosing
//! where they go is the program's decision, so the subscriber is installed here, by binaries.
//! This crate is never a dependency of a library.
//!
//! Modules:
//! - [`logging`]: `--log-format text|json` and the one place a subscriber is installed.
//! - `choices` (feature `secure-rdma`): `--poll busy|event` and `--cipher
//!   auto|aes-256-gcm|chacha20-poly1305`, as enums whose values `--help` lists.

#![warn(missing_docs)]

#[cfg(feature = "secure-rdma")]
pub mod choices;
pub mod logging;
