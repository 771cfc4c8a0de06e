//! Completion queues whose completion channel is driven by tokio.
//!
//! Waiting is event-driven by default, not a busy poll: the CQ is armed with
//! `ibv_req_notify_cq`, the channel's file descriptor is registered with
//! tokio, and each wakeup is consumed with `ibv_get_cq_event` and acknowledged
//! at once (an unacknowledged event would make `ibv_destroy_cq` block, and
//! teardown must never hang or panic). Every wait carries a timeout.
//!
//! [`Poll::Busy`] trades a core for latency: the wait polls the CQ in a loop
//! (yielding to tokio between rounds so timers and other tasks still run)
//! instead of sleeping until the channel's interrupt, as perftest's default
//! does.

use std::collections::VecDeque;
use std::fmt;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sideway::ibverbs::completion::{BasicCompletionQueue, CompletionChannel, CompletionQueue as _};
use tokio::io::unix::AsyncFd;

use super::device::Device;
use super::VerbsError;

/// Status of a work completion (`enum ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WcStatus(pub u32);

impl WcStatus {
    /// `IBV_WC_SUCCESS`.
    pub const SUCCESS: WcStatus = WcStatus(0);

    /// Whether the work request succeeded.
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }

    /// The libibverbs name of the status.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 24] = [
            "success",
            "local length error",
            "local QP operation error",
            "local EE context operation error",
            "local protection error",
            "work request flushed error",
            "memory window bind error",
            "bad response error",
            "local access error",
            "remote invalid request error",
            "remote access error",
            "remote operation error",
            "transport retry counter exceeded",
            "RNR retry counter exceeded",
            "local RDD violation error",
            "remote invalid RD request",
            "remote aborted error",
            "invalid EE context number",
            "invalid EE context state",
            "fatal error",
            "response timeout error",
            "general error",
            "tag matching error",
            "tag matching rendezvous incomplete",
        ];
        NAMES
            .get(self.0 as usize)
            .copied()
            .unwrap_or("unknown status")
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Operation a completion reports (`enum ibv_wc_opcode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// A SEND this side posted.
    Send,
    /// An RDMA WRITE (with or without immediate) this side posted.
    RdmaWrite,
    /// An RDMA READ this side posted.
    RdmaRead,
    /// A receive consumed by an incoming SEND.
    Recv,
    /// A receive consumed by an incoming RDMA WRITE WITH IMMEDIATE.
    RecvRdmaWithImm,
    /// Anything else (raw value).
    Other(u32),
}

impl WcOpcode {
    fn from_raw(raw: u32) -> Self {
        match raw {
            0 => WcOpcode::Send,
            1 => WcOpcode::RdmaWrite,
            2 => WcOpcode::RdmaRead,
            128 => WcOpcode::Recv,
            129 => WcOpcode::RecvRdmaWithImm,
            other => WcOpcode::Other(other),
        }
    }
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WcOpcode::Send => f.write_str("SEND"),
            WcOpcode::RdmaWrite => f.write_str("RDMA WRITE"),
            WcOpcode::RdmaRead => f.write_str("RDMA READ"),
            WcOpcode::Recv => f.write_str("RECV"),
            WcOpcode::RecvRdmaWithImm => f.write_str("RECV RDMA WITH IMM"),
            WcOpcode::Other(v) => write!(f, "opcode {v}"),
        }
    }
}

/// One work completion, copied out of the CQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The id given when the work request was posted.
    pub wr_id: u64,
    /// Success or the error.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receives only).
    pub byte_len: u32,
    /// Immediate value of an incoming RDMA WRITE WITH IMMEDIATE, in host
    /// order.
    pub imm_data: Option<u32>,
    /// The local queue pair the work request was posted on or arrived at: on a CQ (or a
    /// shared receive queue) that serves many queue pairs, whose completion this is.
    pub qp_num: u32,
}

/// How a wait for a completion waits (`"event"` or `"busy"` in text and
/// configuration files).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Poll {
    /// Sleep until the completion channel signals (no CPU while idle).
    #[default]
    Event,
    /// Poll the CQ in a loop: the lowest latency, one core busy while waiting.
    Busy,
}

impl Poll {
    /// Its name: `event` or `busy`.
    pub fn name(self) -> &'static str {
        match self {
            Poll::Event => "event",
            Poll::Busy => "busy",
        }
    }
}

/// Completions taken from the device per poll.
const POLL_BATCH: usize = 16;

/// Polls of an empty CQ in a busy wait before yielding to tokio once. (2,048 was measured
/// beside it: each yield is a turn of the runtime's driver, an `epoll_wait` and a clock read,
/// about 16 per round trip of `bench send` at 256, but the latency moved within the noise:
/// 1.34x against 1.37x `ib_send_lat`, 1.44x against 1.54x in another boot.)
const BUSY_SPINS: u32 = 256;

struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// A completion queue with its own completion channel.
///
/// ```no_run
/// # async fn f(dev: std::sync::Arc<secure_rdma::verbs::Device>) -> Result<(), secure_rdma::verbs::VerbsError> {
/// use secure_rdma::verbs::CompletionQueue;
/// use std::time::Duration;
/// let cq = CompletionQueue::new(&dev, 64)?;
/// let wc = cq.next(Duration::from_secs(5)).await?; // a timeout is an error
/// println!("wr {} done: {}", wc.wr_id, wc.status);
/// # Ok(()) }
/// ```
pub struct CompletionQueue {
    // Field order is drop order: deregister the fd from tokio before the
    // channel that owns it can be closed.
    fd: AsyncFd<ChannelFd>,
    pending: Mutex<VecDeque<Completion>>,
    pub(crate) cq: Arc<BasicCompletionQueue>,
    channel: Arc<CompletionChannel>,
    device: String,
    busy: AtomicBool,
}

impl fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.device)
            .finish()
    }
}

impl CompletionQueue {
    /// Creates a CQ of `depth` entries with a non-blocking completion channel
    /// registered with the current tokio runtime.
    pub fn new(device: &Arc<Device>, depth: u32) -> Result<Arc<Self>, VerbsError> {
        let name = device.name();
        let ctx = device.context();
        let channel = ctx
            .create_comp_channel()
            .map_err(|e| VerbsError::verb("ibv_create_comp_channel", name, e))?;
        channel
            .set_nonblocking(true)
            .map_err(|source| VerbsError::Channel {
                device: name.to_owned(),
                source,
            })?;
        let cq = ctx
            .create_cq_builder()
            .setup_cqe(depth.max(1))
            .setup_comp_channel(&channel, 0)
            .build()
            .map_err(|e| VerbsError::verb("ibv_create_cq", name, e))?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(VerbsError::NoRuntime);
        }
        // SAFETY: the fd belongs to `channel`, which this struct keeps open
        // until after `fd` is dropped (field order).
        let fd = unsafe {
            AsyncFd::register_with_interest(
                ChannelFd(channel.as_raw_fd()),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| VerbsError::Channel {
            device: name.to_owned(),
            source: e.into_parts().1,
        })?;
        Ok(Arc::new(CompletionQueue {
            fd,
            pending: Mutex::new(VecDeque::new()),
            cq,
            channel,
            device: name.to_owned(),
            busy: AtomicBool::new(false),
        }))
    }

    /// The CQ for verbs that name it (valid while `self` lives).
    pub(crate) fn raw(&self) -> *mut rdma_mummy_sys::ibv_cq {
        // SAFETY: only the pointer is taken; `self.cq` owns the CQ.
        unsafe { self.cq.cq().as_ptr() }
    }

    /// Chooses how later waits wait (event-driven unless set).
    pub fn set_poll(&self, poll: Poll) {
        self.busy.store(poll == Poll::Busy, Ordering::Relaxed);
    }

    /// How waits wait.
    pub fn poll(&self) -> Poll {
        match self.busy.load(Ordering::Relaxed) {
            true => Poll::Busy,
            false => Poll::Event,
        }
    }

    /// Returns a completion if one is ready, without waiting.
    pub fn try_next(&self) -> Result<Option<Completion>, VerbsError> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        if pending.is_empty() {
            // A batch per call: keep every completion, never drop one on the floor. Polled
            // with the plain verb because sideway's completions do not say which queue pair
            // they belong to, which a CQ shared by many needs.
            // SAFETY: ibv_wc is plain old data; all-zero is a valid value.
            let mut wcs: [rdma_mummy_sys::ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
            // SAFETY: the CQ is valid while `self.cq` lives; `wcs` has room for POLL_BATCH.
            let n = unsafe {
                rdma_mummy_sys::ibv_poll_cq(self.raw(), POLL_BATCH as i32, wcs.as_mut_ptr())
            };
            let Ok(n) = usize::try_from(n) else {
                return Err(VerbsError::verb(
                    "ibv_poll_cq",
                    &self.device,
                    std::io::Error::from_raw_os_error(-n),
                ));
            };
            for wc in &wcs[..n.min(POLL_BATCH)] {
                let opcode = WcOpcode::from_raw(wc.opcode);
                pending.push_back(Completion {
                    wr_id: wc.wr_id,
                    status: WcStatus(wc.status),
                    opcode,
                    byte_len: wc.byte_len,
                    // SAFETY: both union members are a u32; for this opcode it is the
                    // immediate, in network order.
                    imm_data: (opcode == WcOpcode::RecvRdmaWithImm).then(|| {
                        u32::from_be(unsafe { wc.imm_data_invalidated_rkey_union.imm_data })
                    }),
                    qp_num: wc.qp_num,
                });
            }
        }
        Ok(pending.pop_front())
    }

    /// Waits for the next completion, at most `timeout`.
    ///
    /// Errors with [`VerbsError::Timeout`] when nothing completes in time.
    /// A completion with an error status is returned as it is; use
    /// [`CompletionQueue::next_ok`] to turn it into an error.
    pub async fn next(&self, timeout: Duration) -> Result<Completion, VerbsError> {
        // A completion already there (or found by a busy poll's first spin) starts no timer.
        match crate::clock::within(timeout, self.wait()).await {
            Ok(result) => result,
            Err(_) => Err(VerbsError::Timeout {
                what: format!("a completion on {}", self.device),
                after: timeout,
            }),
        }
    }

    /// Like [`CompletionQueue::next`], but an error status is an error, and
    /// `what` names the awaited operation in a timeout.
    pub async fn next_ok(&self, what: &str, timeout: Duration) -> Result<Completion, VerbsError> {
        match crate::clock::within(timeout, self.next_ok_unbounded()).await {
            Ok(result) => result,
            Err(_) => Err(VerbsError::Timeout {
                what: what.to_owned(),
                after: timeout,
            }),
        }
    }

    /// [`CompletionQueue::next_ok`] without a timeout, for a caller that races
    /// the wait against its own deadline (an idle timer, a shutdown signal in a
    /// `select!`): the completion that did not come is then the caller's to name.
    pub async fn next_ok_unbounded(&self) -> Result<Completion, VerbsError> {
        let wc = self.wait().await?;
        if wc.status.is_success() {
            Ok(wc)
        } else {
            Err(VerbsError::WorkCompletion {
                wr_id: wc.wr_id,
                opcode: wc.opcode,
                status: wc.status,
            })
        }
    }

    /// The next completion, whatever its status, without a timeout: for a task whose whole
    /// job is this CQ (a shared queue's pump). Cancel-safe: a completion is taken from the
    /// device only when it is returned.
    pub async fn next_unbounded(&self) -> Result<Completion, VerbsError> {
        self.wait().await
    }

    async fn wait(&self) -> Result<Completion, VerbsError> {
        if self.busy.load(Ordering::Relaxed) {
            return self.busy_wait().await;
        }
        loop {
            if let Some(wc) = self.try_next()? {
                return Ok(wc);
            }
            self.arm()?;
            // A completion may have landed between the empty poll and arming:
            // it raises no event, so poll once more before sleeping.
            if let Some(wc) = self.try_next()? {
                return Ok(wc);
            }
            let mut ready = self
                .fd
                .readable()
                .await
                .map_err(|source| VerbsError::Channel {
                    device: self.device.clone(),
                    source,
                })?;
            self.drain_events();
            ready.clear_ready();
        }
    }

    /// The CQ is never armed here, so no channel event is raised to consume.
    async fn busy_wait(&self) -> Result<Completion, VerbsError> {
        loop {
            for _ in 0..BUSY_SPINS {
                if let Some(wc) = self.try_next()? {
                    return Ok(wc);
                }
                std::hint::spin_loop();
            }
            // Let the runtime run its timers (the caller's timeout) and other tasks.
            tokio::task::yield_now().await;
        }
    }

    fn arm(&self) -> Result<(), VerbsError> {
        // SAFETY: the CQ pointer is valid while `self.cq` is alive.
        let rc = unsafe { rdma_mummy_sys::ibv_req_notify_cq(self.raw(), 0) };
        if rc == 0 {
            Ok(())
        } else {
            Err(VerbsError::verb(
                "ibv_req_notify_cq",
                &self.device,
                std::io::Error::from_raw_os_error(rc),
            ))
        }
    }

    /// Consumes and acknowledges every pending channel event.
    fn drain_events(&self) {
        loop {
            let mut cq = std::ptr::null_mut();
            let mut ctx = std::ptr::null_mut();
            // SAFETY: the channel outlives this call; the fd is non-blocking so
            // this returns -1 (EAGAIN) once no event is left.
            let rc = unsafe {
                rdma_mummy_sys::ibv_get_cq_event(
                    self.channel.comp_channel().as_ptr(),
                    &mut cq,
                    &mut ctx,
                )
            };
            if rc != 0 || cq.is_null() {
                return;
            }
            // SAFETY: `cq` was returned by ibv_get_cq_event for our channel.
            unsafe { rdma_mummy_sys::ibv_ack_cq_events(cq, 1) };
        }
    }
}
