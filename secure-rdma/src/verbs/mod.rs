//! The verbs layer: plain, explicit libibverbs sequences, on `sideway` for the device, PDs and
//! CQs, and on the plain verbs (`rdma-mummy-sys`) where sideway has no way to say what is
//! needed: queue pairs on a shared receive queue, zero-based memory regions, memory windows,
//! and completions that name their queue pair.
//!
//! One [`Device`] context is opened per process and shared (`Arc`) by every
//! connection; each connection then owns its [`ProtectionDomain`],
//! [`CompletionQueue`]s, [`QueuePair`] and [`MemoryRegion`]s, so dropping a
//! connection frees exactly its resources.
//!
//! The RC queue pair is a typestate: [`QueuePair<Reset>`] →
//! [`QueuePair<Init>`] → [`QueuePair<Rtr>`] → [`QueuePair<Rts>`], each
//! transition taking exactly the parameters it needs, and sends compile only
//! on `QueuePair<Rts>`:
//!
//! ```compile_fail
//! # use secure_rdma::verbs::{QueuePair, Init, MemoryRegion};
//! # fn f(qp: &mut QueuePair<Init>, mr: &std::sync::Arc<MemoryRegion>) {
//! qp.post_send(1, mr, 0..8); // no post_send before RTS
//! # }
//! ```

mod cq;
mod device;
mod gid;
mod mr;
mod mw;
mod qp;
mod srq;

pub use cq::{Completion, CompletionQueue, Poll, WcOpcode, WcStatus};
pub use device::{Availability, Device, PathMtu, ProtectionDomain, SYSFS};
pub use gid::{select_gid, Gid, GidEntry, GidKind, GidSelector, NoMatchingGid, ParseGidError};
pub use mr::{MemoryRegion, MrAccess, RemoteBuffer};
pub use mw::MemoryWindow;
pub use qp::{
    Init, QpAttributes, QpCaps, QpState, QueuePair, Reset, Rtr, RtrParams, Rts, RtsParams,
};
pub use srq::SharedReceiveQueue;

use std::time::Duration;

/// Everything that can go wrong in the verbs layer. Each variant names the
/// device or queue pair and the verb involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// libibverbs could not list devices (library or provider missing).
    #[error("cannot list RDMA devices: {0} (are libibverbs1 and ibverbs-providers installed?)")]
    DeviceList(#[source] BoxError),
    /// There is no RDMA device at all (a binary names the fix: creating a
    /// Soft-RoCE device).
    #[error("no RDMA device found")]
    NoDevice,
    /// The named device does not exist.
    #[error("RDMA device {name:?} not found; available: {available}")]
    DeviceNotFound {
        /// The requested name.
        name: String,
        /// Comma-separated names of the devices that exist.
        available: String,
    },
    /// No device carries a RoCEv2 GID for the given address.
    #[error("no RDMA device has a RoCEv2 GID for address {addr}; {details}")]
    NoDeviceForAddress {
        /// The local address a GID was looked for.
        addr: std::net::IpAddr,
        /// What each device has.
        details: String,
    },
    /// A GID selector matched nothing.
    #[error(transparent)]
    Gid(#[from] NoMatchingGid),
    /// A verb returned an error.
    #[error("{verb} failed on {device}: {source}")]
    Verb {
        /// The libibverbs call, e.g. `ibv_create_qp`.
        verb: &'static str,
        /// Device name.
        device: String,
        /// What the library said.
        #[source]
        source: BoxError,
    },
    /// A queue pair state transition was refused by the device.
    #[error("QP {qpn} on {device}: transition {from} -> {to} failed: {source}")]
    Transition {
        /// Device name.
        device: String,
        /// The queue pair number.
        qpn: crate::psn::Qpn,
        /// State before.
        from: &'static str,
        /// State asked for.
        to: &'static str,
        /// What the device said.
        #[source]
        source: BoxError,
    },
    /// A PSN or QPN outside 24 bits.
    #[error("invalid parameter: {0}")]
    OutOfRange(#[from] crate::psn::OutOfRange),
    /// QP0 and QP1 are the management QPs, never an RC peer.
    #[error("invalid parameter: remote QPN {0} is a special QP (0 and 1 are reserved)")]
    ReservedQpn(crate::psn::Qpn),
    /// The remote GID is all zeros.
    #[error("invalid parameter: remote GID is all zeros")]
    ZeroGid,
    /// A GID index too large for the address vector (8 bits).
    #[error("invalid parameter: GID index {0} does not fit in 8 bits")]
    GidIndexTooLarge(u32),
    /// A memory region used with a QP (or shared receive queue) of another protection domain.
    #[error("invalid parameter: memory region belongs to another protection domain")]
    ForeignRegion,
    /// A queue pair asked to take its receives from a shared receive queue of another
    /// protection domain: the verbs require one PD for both.
    #[error(
        "invalid parameter: the shared receive queue belongs to another protection domain; \
         create the queue pair on the queue's own (SharedReceiveQueue::pd)"
    )]
    ForeignSharedQueue,
    /// A receive posted on a queue pair that takes its receives from a shared receive queue.
    #[error(
        "QP {0} takes its receives from a shared receive queue: post them there \
         (SharedReceiveQueue::post_recv)"
    )]
    ReceiveOnSharedQueue(crate::psn::Qpn),
    /// More bytes than one work request can carry (32 bits).
    #[error("invalid parameter: {0} bytes exceed one work request")]
    WorkRequestTooLarge(usize),
    /// A memory region of zero bytes.
    #[error("invalid parameter: a memory region cannot be empty")]
    EmptyRegion,
    /// The region's buffer could not be laid out or allocated.
    #[error("cannot allocate {0} bytes for a memory region")]
    RegionAlloc(usize),
    /// A completion queue made outside a tokio runtime (its events are
    /// driven by the runtime's reactor).
    #[error("completion queues must be created inside a tokio runtime")]
    NoRuntime,
    /// A receive completion for a work request this side never posted.
    #[error("completion for unknown receive {0}")]
    UnknownReceive(u64),
    /// A completion of a kind the receive queue never expects.
    #[error("unexpected receive completion {0}")]
    UnexpectedCompletion(WcOpcode),
    /// A completion did not arrive in time. On RC a PSN or GID mismatch
    /// produces exactly this: the peer silently drops every packet.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The timeout that expired.
        after: Duration,
    },
    /// A work request completed with an error status.
    #[error("work request {wr_id} ({opcode}) completed with error: {status}")]
    WorkCompletion {
        /// The work request id given when posting.
        wr_id: u64,
        /// Operation of the completion.
        opcode: WcOpcode,
        /// The error status.
        status: WcStatus,
    },
    /// Filling a region in place that the peer may write: its bytes could change under the
    /// writer, so only a region of local access is filled in place.
    #[error("a memory region the peer may write cannot be filled in place; copy into it instead")]
    RemotelyWritable,
    /// An access outside a memory region.
    #[error("range {start}..{end} is outside the {len}-byte memory region")]
    OutOfBounds {
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
        /// Size of the region.
        len: u64,
    },
    /// The completion channel file descriptor failed.
    #[error("completion channel of {device}: {source}")]
    Channel {
        /// Device name.
        device: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// The error a verbs library call returned, kept as the typed cause.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

impl VerbsError {
    fn verb(verb: &'static str, device: &str, source: impl Into<BoxError>) -> Self {
        VerbsError::Verb {
            verb,
            device: device.to_owned(),
            source: source.into(),
        }
    }

    /// The object a creating verb returned, or the error it left in `errno` when it returned
    /// NULL, naming the verb and the device (`ibv_create_qp`, `ibv_create_srq`, `ibv_alloc_mw`).
    fn created<T>(
        raw: *mut T,
        verb: &'static str,
        device: &str,
    ) -> Result<std::ptr::NonNull<T>, Self> {
        std::ptr::NonNull::new(raw)
            .ok_or_else(|| Self::verb(verb, device, std::io::Error::last_os_error()))
    }

    /// A verb's return code (0, or an errno value as the verbs that return one do) as a result.
    fn check(rc: std::os::raw::c_int, verb: &'static str, device: &str) -> Result<(), Self> {
        match rc {
            0 => Ok(()),
            rc => Err(Self::verb(
                verb,
                device,
                std::io::Error::from_raw_os_error(rc),
            )),
        }
    }
}

/// Logs a destroy verb that failed in a `Drop`: nothing is left to return the error to, and
/// rdma-monitor or `rdma resource` show what stayed behind.
fn warn_if_not_destroyed(rc: std::os::raw::c_int, verb: &'static str) {
    if rc != 0 {
        tracing::warn!(
            error = %std::io::Error::from_raw_os_error(rc),
            verb,
            "a verbs object could not be destroyed; it stays until the process exits"
        );
    }
}
