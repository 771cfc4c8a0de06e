//! Receives of many queue pairs through one shared receive queue and one completion queue,
//! routed to each queue pair by its number: the scalable server's receive side.
//!
//! A session with its own receive queue keeps its slots posted and its two CQs for its whole
//! life: rxe's rings alone are 44 KiB per session, and 16 slots of 4 KiB sit idle in each. On a
//! [`SharedQueue`], every queue pair made with [`SharedQueue::attach`] takes its receives from
//! one [`SharedReceiveQueue`] of `slots` receives and reports them to one CQ. One task, the
//! pump, polls that CQ: for each receive it copies the bytes out of the slot, posts the slot
//! again, and hands the message to the queue pair's [`Inbox`], in the order the CQ reported
//! them (an RC queue pair's receives complete in order, and a session counts on it).
//!
//! **Sends.** A queue pair attached with [`SharedQueue::attach_sending`] also reports its sends'
//! completions to a CQ it shares: one send CQ per group of queue pairs, each with its own pump
//! that hands every completion to its queue pair's [`Inbox`] ([`Inbox::next_sent`]), so that a
//! session on the shared queue makes no CQ at all (rxe allows about 32,000 CQs per device: with
//! a send CQ each, that many sessions and no more). A group's CQ is never promised more entries
//! than it has: each queue pair reserves its send queue's depth there (every send it can have
//! in flight), so the CQ cannot overflow however late its pump runs, and a queue pair that does
//! not fit opens the next group.
//!
//! **Isolation.** Every queue pair on one shared queue is on its protection domain: a memory
//! region's rkey granting remote access would then be usable from any of them. A queue pair
//! attached here may therefore only grant remote access through a type 2 memory window bound
//! to itself (`tests/tests/srq_lab.rs` shows another session's window rkey refused on a shared
//! PD where a region's rkey lands); [`SharedQueue::new`] refuses a device without them.
//!
//! **Credit.** A queue pair may have at most its credit of messages waiting in its inbox, the
//! receive slots its peer was told it has. A peer that sends beyond that is not waiting for its
//! acknowledgements: its inbox is closed with [`InboxError::OverCredit`] and its message dropped,
//! so that one tenant's flood cannot pile up in the server's memory. Receives it takes from the
//! shared queue while it is over its credit are posted again at once. A flood can still take
//! every posted receive for a moment; the others' messages then wait in their senders' RNR
//! retries (the queue pairs retry without limit), never lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, oneshot};

use crate::psn::Qpn;
use crate::verbs::{
    Completion, CompletionQueue, Device, GidEntry, Init, MemoryRegion, MrAccess, ProtectionDomain,
    QpCaps, QueuePair, SharedReceiveQueue, VerbsError, WcOpcode, WcStatus,
};

/// Why an [`Inbox`] has no next message.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InboxError {
    /// A receive of this queue pair completed with an error status.
    #[error("receive {wr_id} on the shared queue completed with error: {status}")]
    Completion {
        /// The shared queue's slot of the receive.
        wr_id: u64,
        /// The receive's status.
        status: WcStatus,
    },
    /// The peer sent more messages than the receive slots it was given, without waiting for
    /// their acknowledgements.
    #[error("the peer sent beyond its credit of {credit} receives (it does not wait for acknowledgements); its queue pair is cut off")]
    OverCredit {
        /// The receives the peer may have in flight.
        credit: usize,
    },
    /// The shared queue's pump stopped (its CQ failed, or the queue was dropped).
    #[error("the shared receive queue stopped: {0}")]
    Stopped(String),
    /// Nothing arrived in time.
    #[error("nothing arrived within {0:?}")]
    Timeout(Duration),
    /// [`Inbox::next_sent`] on a queue pair whose sends complete on a CQ of its own
    /// ([`SharedQueue::attach`]): poll that CQ instead.
    #[error("this queue pair's sends complete on its own CQ (attached with attach, not attach_sending); poll that CQ")]
    SendsNotRouted,
}

/// One message routed to a queue pair: a SEND's bytes, or a WRITE WITH IMMEDIATE's immediate
/// (its bytes are in the writer's target region, not in a receive slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    /// [`WcOpcode::Recv`] or [`WcOpcode::RecvRdmaWithImm`].
    pub opcode: WcOpcode,
    /// The bytes of a SEND, copied out of its slot (empty for a WRITE).
    pub data: Vec<u8>,
    /// The immediate of a WRITE WITH IMMEDIATE.
    pub imm: Option<u32>,
}

type Delivery = Result<Incoming, InboxError>;

/// Where the pump puts one queue pair's messages until its session takes them. Credit bounds
/// them, so a queue of a few entries, where an unbounded channel allocated a block of 32 and a
/// watch of the cut its eight notifiers for every queue pair (heaptrack on 1,000 sessions held
/// on a shared queue: 1.9 KiB per session for the two).
#[derive(Default)]
struct Mailbox {
    state: Mutex<MailboxState>,
    /// One consumer: a push stores a permit when nobody waits, so none is missed.
    ready: tokio::sync::Notify,
    /// Wakes whoever waits for the cut ([`Inbox::cut_off`]).
    cut: tokio::sync::Notify,
}

#[derive(Default)]
struct MailboxState {
    queue: std::collections::VecDeque<Delivery>,
    /// Messages (not errors) in `queue`: what the credit bounds.
    waiting: usize,
    /// Nothing more comes: the route is gone (cut off, the pump stopped).
    closed: bool,
    /// Cut off for sending beyond its credit, so that its session learns it while busy
    /// elsewhere.
    cut: bool,
}

impl Mailbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, MailboxState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Puts `delivery` in whatever waits (the pump's stop: no credit bounds an error).
    fn push(&self, delivery: Delivery) {
        self.offer(delivery, usize::MAX);
    }

    /// Puts `delivery` in, unless it is a message beyond `credit` waiting: then the queue pair
    /// is cut off instead (its session hears [`InboxError::OverCredit`], and
    /// [`Inbox::cut_off`] resolves) and `false` comes back. One lock for the check and the
    /// push, as each message passes here.
    fn offer(&self, delivery: Delivery, credit: usize) -> bool {
        let mut state = self.lock();
        let over = delivery.is_ok() && state.waiting >= credit;
        if over {
            state
                .queue
                .push_back(Err(InboxError::OverCredit { credit }));
            state.cut = true;
        } else {
            state.waiting += usize::from(delivery.is_ok());
            state.queue.push_back(delivery);
        }
        drop(state);
        self.ready.notify_one();
        if over {
            self.cut.notify_waiters();
        }
        !over
    }

    /// The next delivery, if one is there; `Err(())` once none is and none will come.
    fn try_take(&self) -> Result<Option<Delivery>, ()> {
        let mut state = self.lock();
        match state.queue.pop_front() {
            Some(delivery) => {
                state.waiting -= usize::from(delivery.is_ok());
                Ok(Some(delivery))
            }
            None if state.closed => Err(()),
            None => Ok(None),
        }
    }
}

struct Route {
    mailbox: Arc<Mailbox>,
    credit: usize,
}

impl Drop for Route {
    /// The route removed (cut off, the pump stopped, the inbox dropped): its session, waiting
    /// or not, hears that nothing more comes once it has taken what did.
    fn drop(&mut self) {
        self.mailbox.lock().closed = true;
        self.mailbox.ready.notify_one();
    }
}

#[derive(Default)]
struct Routes {
    by_qpn: Mutex<HashMap<u32, Route>>,
    counters: SharedQueueCounters,
}

/// Where a [`SharedQueue`] counts what it drops, so that an exporter shows it (secure-server's
/// `secure_rdma_shared_queue_over_credit_total` and `secure_rdma_shared_queue_unrouted_total`,
/// [`crate::metrics::ServerMetrics::shared_queue_counters`]). Clones share their counts.
#[derive(Debug, Clone, Default)]
pub struct SharedQueueCounters {
    /// Queue pairs cut off for sending beyond their credit.
    pub over_credit: Counter,
    /// Receives that arrived for a queue pair no longer attached (it ended, or was cut off,
    /// while they were on the wire or in the CQ), dropped.
    pub unrouted: Counter,
}

impl Routes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Route>> {
        self.by_qpn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, qpn: u32, delivery: Delivery) {
        let mut routes = self.lock();
        let Some(route) = routes.get(&qpn) else {
            self.counters.unrouted.inc();
            tracing::debug!(
                qpn,
                "a receive for a queue pair no longer attached; dropped"
            );
            return;
        };
        if !route.mailbox.offer(delivery, route.credit) {
            self.counters.over_credit.inc();
            tracing::warn!(
                qpn,
                credit = route.credit,
                "a peer sent beyond its credit; its queue pair is cut off"
            );
            routes.remove(&qpn);
        }
    }
}

type Sent = Result<Completion, InboxError>;

/// One queue pair's send completions, routed and not yet taken: at most its send queue's depth
/// of them (what it reserved), so a few entries where a channel would allocate a block of 32
/// per queue pair (measured: a server session on the shared queue cost 1 KiB more with one).
#[derive(Default)]
struct SentQueue {
    queue: Mutex<std::collections::VecDeque<Sent>>,
    /// One consumer: a push stores a permit when nobody waits, so none is missed.
    ready: tokio::sync::Notify,
}

impl SentQueue {
    fn push(&self, sent: Sent) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(sent);
        self.ready.notify_one();
    }

    fn try_pop(&self) -> Option<Sent> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// The next completion (cancel-safe: one is taken only when returned).
    async fn pop(&self) -> Sent {
        loop {
            if let Some(sent) = self.try_pop() {
                return sent;
            }
            self.ready.notified().await;
        }
    }
}

/// Where the pump of one CQ, that the sends of several queue pairs complete on, routes them.
struct SendGroup {
    /// Entries the CQ was made with.
    depth: usize,
    /// Entries promised to the queue pairs attached (each its send queue's depth); never above
    /// `depth`, changed only under [`SharedQueue`]'s lock of its groups.
    reserved: AtomicUsize,
    by_qpn: Mutex<HashMap<u32, Arc<SentQueue>>>,
    /// Completions for a queue pair no longer attached (the flushes of one dropped undrained).
    unrouted: AtomicUsize,
}

impl SendGroup {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<SentQueue>>> {
        self.by_qpn.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, wc: Completion) {
        let routes = self.lock();
        match routes.get(&wc.qp_num) {
            Some(queue) => queue.push(Ok(wc)),
            None => {
                self.unrouted.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    qpn = wc.qp_num,
                    wr_id = wc.wr_id,
                    "a send completion for a queue pair no longer attached; dropped"
                );
            }
        }
    }
}

/// A queue pair's place in a [`SendGroup`]: its route, and the CQ entries it reserved, both
/// given back when it is dropped (after the queue pair, which [`crate::session`] keeps first).
struct SendRoute {
    group: Arc<SendGroup>,
    /// Set once the queue pair is made and routed.
    qpn: Option<u32>,
    reserved: usize,
    sent: Arc<SentQueue>,
}

impl SendRoute {
    /// Routes `qpn`'s completions here: before anything is posted on it, so that none of them
    /// can come earlier.
    fn open(&mut self, qpn: u32) {
        self.group.lock().insert(qpn, Arc::clone(&self.sent));
        self.qpn = Some(qpn);
    }
}

impl Drop for SendRoute {
    fn drop(&mut self) {
        if let Some(qpn) = self.qpn {
            self.group.lock().remove(&qpn);
        }
        self.group
            .reserved
            .fetch_sub(self.reserved, Ordering::AcqRel);
    }
}

impl SendGroup {
    fn new(depth: usize) -> SendGroup {
        SendGroup {
            depth,
            reserved: AtomicUsize::new(0),
            by_qpn: Mutex::default(),
            unrouted: AtomicUsize::new(0),
        }
    }

    /// Whether `need` more entries fit in the CQ.
    fn fits(&self, need: usize) -> bool {
        self.depth - self.reserved.load(Ordering::Acquire) >= need
    }

    /// Reserves `need` entries for a queue pair about to be made, given back when the route
    /// returned is dropped; [`SendRoute::open`] then routes its completions there. The caller
    /// has checked [`SendGroup::fits`] under the lock of the groups.
    fn reserve(self: &Arc<Self>, need: usize) -> SendRoute {
        self.reserved.fetch_add(need, Ordering::AcqRel);
        SendRoute {
            group: Arc::clone(self),
            qpn: None,
            reserved: need,
            sent: Arc::default(),
        }
    }
}

/// The one consumer of a send group's CQ.
async fn send_pump(cq: Arc<CompletionQueue>, group: Arc<SendGroup>) {
    loop {
        match cq.next_unbounded().await {
            Ok(wc) => group.deliver(wc),
            Err(e) => {
                let why = e.to_string();
                tracing::error!(error = %why, "a shared send CQ's pump stopped");
                for (_, queue) in group.lock().drain() {
                    queue.push(Err(InboxError::Stopped(why.clone())));
                }
                return;
            }
        }
    }
}

/// Routes `qpn`'s messages to a new inbox, at most `credit` of them waiting.
fn attach(
    routes: &Arc<Routes>,
    qpn: Qpn,
    credit: usize,
    requests: mpsc::UnboundedSender<Request>,
) -> Inbox {
    let mailbox = Arc::new(Mailbox::default());
    routes.lock().insert(
        qpn.get(),
        Route {
            mailbox: Arc::clone(&mailbox),
            credit: credit.max(1),
        },
    );
    Inbox {
        qpn,
        mailbox,
        credit: credit.max(1),
        routes: Arc::downgrade(routes),
        requests,
        sends: None,
    }
}

/// What the pump is asked besides its CQ's events.
enum Request {
    /// Route everything the CQ holds now, then answer.
    Sync(oneshot::Sender<()>),
}

/// Counts of a [`SharedQueue`], for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedQueueStats {
    /// Queue pairs attached now.
    pub attached: usize,
    /// Receives that arrived for a queue pair no longer attached.
    pub unrouted: u64,
    /// Queue pairs cut off for sending beyond their credit.
    pub over_credit: u64,
    /// CQs the attached queue pairs' sends complete on ([`SharedQueue::attach_sending`]).
    pub send_cqs: usize,
    /// Send CQ entries reserved by the queue pairs attached now.
    pub send_reserved: usize,
    /// Send completions for a queue pair no longer attached, dropped.
    pub sends_unrouted: usize,
}

/// One shared receive queue of `slots` receives and the CQ they complete on, with the pump
/// that routes each message to its queue pair's [`Inbox`].
///
/// ```no_run
/// # async fn f(device: std::sync::Arc<secure_rdma::verbs::Device>,
/// #            gid: secure_rdma::verbs::GidEntry) -> Result<(), Box<dyn std::error::Error>> {
/// use secure_rdma::shared_queue::SharedQueue;
/// use secure_rdma::verbs::{CompletionQueue, QpCaps};
/// // 1,024 receives of 4 KiB for every queue pair attached below.
/// let shared = SharedQueue::new(&device, 1024, 4096)?;
/// // Its sends complete on one of the queue's send CQs too: no CQ of its own.
/// let caps = QpCaps { max_send_wr: 4, max_recv_wr: 0 };
/// let (qp, mut inbox) = shared.attach_sending(gid.clone(), caps, 16, false)?;
/// // ... connect `qp` to its peer; then each message it receives:
/// let message = inbox.next().await?;
/// // And, after posting a send, its completion:
/// let sent = inbox.next_sent(std::time::Duration::from_secs(1)).await?;
/// // A queue pair may also send through a CQ of its own:
/// let send_cq = CompletionQueue::new(&device, 32)?;
/// let (other, mut its_inbox) = shared.attach(&send_cq, gid, QpCaps::default(), 16)?;
/// # Ok(()) }
/// ```
pub struct SharedQueue {
    pd: Arc<ProtectionDomain>,
    srq: Arc<SharedReceiveQueue>,
    cq: Arc<CompletionQueue>,
    slot_len: usize,
    slots: usize,
    routes: Arc<Routes>,
    requests: mpsc::UnboundedSender<Request>,
    pump: tokio::task::JoinHandle<()>,
    /// The send CQs of queue pairs attached with [`SharedQueue::attach_sending`], each with
    /// its pump, made as they are needed.
    sends: Mutex<Vec<SendCq>>,
    send_depth: usize,
    /// The send slots of the sessions on this queue, a registration per 64 of them.
    send_slots: crate::slots::Arena,
}

/// A shared send CQ, where its pump routes, and the pump.
struct SendCq {
    cq: Arc<CompletionQueue>,
    group: Arc<SendGroup>,
    pump: tokio::task::JoinHandle<()>,
}

/// Entries of each send CQ a [`SharedQueue`] makes: 256 sessions of 4 sends each. rxe maps
/// about 55 bytes of ring per entry (measured: 4,096 entries cost 220 KiB), all of it from the
/// start, so a CQ much larger than the sessions it serves costs more than the CQs it saves;
/// 50,000 such sessions take 196 of these CQs, where rxe allows about 32,000 per device.
pub const SEND_CQ_DEPTH: usize = 1024;

impl std::fmt::Debug for SharedQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedQueue")
            .field("slots", &self.slots)
            .field("slot_len", &self.slot_len)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Drop for SharedQueue {
    fn drop(&mut self) {
        self.pump.abort();
        for send in self.sends.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            send.pump.abort();
        }
    }
}

impl SharedQueue {
    /// Makes a protection domain, a shared receive queue of `slots` receives of `slot_len`
    /// bytes each (all posted), and the CQ they complete on, on `device`, and starts the pump
    /// on the current tokio runtime.
    ///
    /// Refused on a device without type 2 memory windows: queue pairs sharing a protection
    /// domain may only grant remote access through windows bound to themselves.
    pub fn new(
        device: &Arc<Device>,
        slots: usize,
        slot_len: usize,
    ) -> Result<Arc<SharedQueue>, SharedQueueError> {
        SharedQueue::counted(device, slots, slot_len, SharedQueueCounters::default())
    }

    /// [`SharedQueue::new`], counting what it drops in `counters`.
    pub fn counted(
        device: &Arc<Device>,
        slots: usize,
        slot_len: usize,
        counters: SharedQueueCounters,
    ) -> Result<Arc<SharedQueue>, SharedQueueError> {
        SharedQueue::build(device, slots, slot_len, counters, SEND_CQ_DEPTH)
    }

    /// [`SharedQueue::new`] whose send CQs ([`SharedQueue::attach_sending`]) have
    /// `send_cq_depth` entries each instead of [`SEND_CQ_DEPTH`]: smaller for a server of few
    /// sessions, larger for fewer CQs (rxe allows 32,767 entries a CQ).
    pub fn with_send_cq_depth(
        device: &Arc<Device>,
        slots: usize,
        slot_len: usize,
        send_cq_depth: usize,
    ) -> Result<Arc<SharedQueue>, SharedQueueError> {
        let counters = SharedQueueCounters::default();
        SharedQueue::build(device, slots, slot_len, counters, send_cq_depth.max(1))
    }

    fn build(
        device: &Arc<Device>,
        slots: usize,
        slot_len: usize,
        counters: SharedQueueCounters,
        send_depth: usize,
    ) -> Result<Arc<SharedQueue>, SharedQueueError> {
        if !device.has_type2_windows() {
            return Err(SharedQueueError::NoWindows(device.name().to_owned()));
        }
        let slots = slots.max(1);
        let depth = u32::try_from(slots).map_err(|_| SharedQueueError::TooLarge(slots))?;
        let pd = device.alloc_pd()?;
        let cq = CompletionQueue::new(device, depth)?;
        let srq = SharedReceiveQueue::new(&pd, depth)?;
        let len = slots
            .checked_mul(slot_len.max(1))
            .ok_or(SharedQueueError::TooLarge(slots))?;
        let mr = MemoryRegion::new(&pd, len, MrAccess::Local)?;
        for slot in 0..slots {
            srq.post_recv(slot as u64, &mr, slot * slot_len..(slot + 1) * slot_len)?;
        }
        let routes = Arc::new(Routes {
            by_qpn: Mutex::default(),
            counters,
        });
        let (requests, rx) = mpsc::unbounded_channel();
        let pump = tokio::spawn(pump(
            Arc::clone(&cq),
            Arc::clone(&srq),
            mr,
            slot_len,
            Arc::clone(&routes),
            rx,
        ));
        Ok(Arc::new(SharedQueue {
            srq,
            cq,
            slot_len,
            slots,
            routes,
            requests,
            pump,
            send_slots: crate::slots::Arena::new(&pd),
            pd,
            sends: Mutex::default(),
            send_depth,
        }))
    }

    /// Where the sessions on this queue take their send slots (on its protection domain):
    /// a registration per 64 sessions instead of one each.
    pub fn send_slots(&self) -> &crate::slots::Arena {
        &self.send_slots
    }

    /// The protection domain every queue pair attached here, and every memory region it uses,
    /// must belong to.
    pub fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// Bytes of one receive slot: the largest message a queue pair attached here may receive.
    pub fn slot_len(&self) -> usize {
        self.slot_len
    }

    /// Receives the queue keeps posted.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Makes a queue pair in INIT on this queue's protection domain that sends through
    /// `send_cq` and takes its receives from this queue, and the [`Inbox`] its messages are
    /// routed to; `credit` bounds the messages waiting there (the receive slots its peer is
    /// told it has). Detached when the inbox is dropped.
    pub fn attach(
        &self,
        send_cq: &Arc<CompletionQueue>,
        sgid: GidEntry,
        caps: QpCaps,
        credit: usize,
    ) -> Result<(QueuePair<Init>, Inbox), SharedQueueError> {
        self.attach_with(send_cq, sgid, caps, credit, false)
    }

    /// [`SharedQueue::attach`] with remote write access on the queue pair (granted only
    /// through memory windows bound to it).
    pub fn attach_with(
        &self,
        send_cq: &Arc<CompletionQueue>,
        sgid: GidEntry,
        caps: QpCaps,
        credit: usize,
        remote_write: bool,
    ) -> Result<(QueuePair<Init>, Inbox), SharedQueueError> {
        let qp = QueuePair::create_on_srq(&self.pd, send_cq, &self.cq, &self.srq, sgid, caps)?
            .into_init(remote_write)?;
        let inbox = attach(&self.routes, qp.qpn(), credit, self.requests.clone());
        Ok((qp, inbox))
    }

    /// [`SharedQueue::attach_with`] for a queue pair whose sends complete on one of this
    /// queue's send CQs too, routed to its inbox ([`Inbox::next_sent`]): it makes no CQ of its
    /// own. It reserves `caps.max_send_wr` entries of that CQ (all it can have in flight)
    /// until the inbox is dropped; a CQ without room for them is not used, the next is made.
    pub fn attach_sending(
        &self,
        sgid: GidEntry,
        caps: QpCaps,
        credit: usize,
        remote_write: bool,
    ) -> Result<(QueuePair<Init>, Inbox), SharedQueueError> {
        let need = caps.max_send_wr.max(1) as usize;
        if need > self.send_depth {
            return Err(SharedQueueError::SendQueueTooDeep {
                wr: need,
                depth: self.send_depth,
            });
        }
        // Room is reserved under the lock of the groups, so no other queue pair can take it;
        // the QP is made outside it (a verb call, slow under emulation), and the reservation
        // is given back if that fails.
        let (cq, mut route) = {
            let mut groups = self.sends.lock().unwrap_or_else(|p| p.into_inner());
            // The first group with room: groups are refilled as queue pairs leave them, so a
            // server that shrinks does not keep a CQ per burst it once had.
            let at = match groups.iter().position(|g| g.group.fits(need)) {
                Some(at) => at,
                None => {
                    let depth = u32::try_from(self.send_depth)
                        .map_err(|_| SharedQueueError::TooLarge(self.send_depth))?;
                    let cq = CompletionQueue::new(self.pd.device(), depth)?;
                    let group = Arc::new(SendGroup::new(self.send_depth));
                    let pump = tokio::spawn(send_pump(Arc::clone(&cq), Arc::clone(&group)));
                    groups.push(SendCq { cq, group, pump });
                    groups.len() - 1
                }
            };
            (Arc::clone(&groups[at].cq), groups[at].group.reserve(need))
        };
        let qp = QueuePair::create_on_srq(&self.pd, &cq, &self.cq, &self.srq, sgid, caps)?
            .into_init(remote_write)?;
        route.open(qp.qpn().get());
        let mut inbox = attach(&self.routes, qp.qpn(), credit, self.requests.clone());
        inbox.sends = Some(route);
        Ok((qp, inbox))
    }

    /// What the queue counted so far.
    pub fn stats(&self) -> SharedQueueStats {
        SharedQueueStats {
            attached: self.routes.lock().len(),
            unrouted: self.routes.counters.unrouted.get(),
            over_credit: self.routes.counters.over_credit.get(),
            ..self.send_stats()
        }
    }

    fn send_stats(&self) -> SharedQueueStats {
        let groups = self.sends.lock().unwrap_or_else(|p| p.into_inner());
        SharedQueueStats {
            send_cqs: groups.len(),
            send_reserved: groups
                .iter()
                .map(|g| g.group.reserved.load(Ordering::Acquire))
                .sum(),
            sends_unrouted: groups
                .iter()
                .map(|g| g.group.unrouted.load(Ordering::Relaxed))
                .sum(),
            ..SharedQueueStats::default()
        }
    }
}

/// Errors of making a [`SharedQueue`] or attaching to one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SharedQueueError {
    /// A verbs call failed.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The device cannot bind memory windows to a queue pair.
    #[error("{0} has no type 2 memory windows: queue pairs sharing a protection domain could reach each other's memory through a region's rkey; use a receive queue per session")]
    NoWindows(String),
    /// More slots than a verb can count.
    #[error("{0} receive slots are more than the device can be asked for")]
    TooLarge(usize),
    /// A queue pair whose send queue is deeper than a shared send CQ.
    #[error("a send queue of {wr} work requests does not fit a shared send CQ of {depth} entries; use fewer send slots")]
    SendQueueTooDeep {
        /// The queue pair's send queue depth.
        wr: usize,
        /// Entries of each shared send CQ.
        depth: usize,
    },
}

/// The messages routed to one queue pair on a [`SharedQueue`], in the order they arrived.
/// Dropping it detaches the queue pair (what still arrives for it is dropped and counted).
pub struct Inbox {
    qpn: Qpn,
    mailbox: Arc<Mailbox>,
    credit: usize,
    routes: Weak<Routes>,
    requests: mpsc::UnboundedSender<Request>,
    /// Where its sends' completions come, when they complete on a shared send CQ.
    sends: Option<SendRoute>,
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox")
            .field("qpn", &self.qpn)
            .field("waiting", &self.waiting())
            .finish()
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if let Some(routes) = self.routes.upgrade() {
            routes.lock().remove(&self.qpn.get());
        }
    }
}

impl Inbox {
    /// The next message for this queue pair (cancel-safe).
    pub async fn next(&mut self) -> Result<Incoming, InboxError> {
        loop {
            match self.mailbox.try_take() {
                Ok(Some(delivery)) => return delivery,
                Ok(None) => self.mailbox.ready.notified().await,
                Err(()) => {
                    return Err(InboxError::Stopped(
                        "the pump ended or the queue pair was cut off".into(),
                    ))
                }
            }
        }
    }

    /// Resolves once this queue pair has been cut off for sending beyond its credit (never
    /// otherwise), without taking a message: for a session busy with something else (writing
    /// an acknowledgement its flooding client does not read) that must stop at once rather
    /// than when it next asks for a message. Cancel-safe.
    pub async fn cut_off(&self) -> InboxError {
        loop {
            // Registered before the flag is read, so a cut between the two still wakes it.
            let notified = self.mailbox.cut.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.mailbox.lock().cut {
                return InboxError::OverCredit {
                    credit: self.credit,
                };
            }
            // Detached without a cut (the pump stopped) never resolves: `next` reports that.
            notified.await;
        }
    }

    /// Whether this queue pair's send completions are routed here ([`Inbox::next_sent`]), as
    /// for one attached with [`SharedQueue::attach_sending`].
    pub fn routes_sends(&self) -> bool {
        self.sends.is_some()
    }

    /// The next completion of this queue pair's sends, whatever its status, in the order they
    /// completed (an RC send queue completes in posting order), at most `timeout`.
    /// Cancel-safe. [`InboxError::SendsNotRouted`] unless [`Inbox::routes_sends`].
    pub async fn next_sent(&mut self, timeout: Duration) -> Result<Completion, InboxError> {
        let Some(route) = self.sends.as_mut() else {
            return Err(InboxError::SendsNotRouted);
        };
        tokio::time::timeout(timeout, route.sent.pop())
            .await
            .unwrap_or(Err(InboxError::Timeout(timeout)))
    }

    /// [`Inbox::next`], at most `timeout`.
    pub async fn next_within(&mut self, timeout: Duration) -> Result<Incoming, InboxError> {
        tokio::time::timeout(timeout, self.next())
            .await
            .unwrap_or(Err(InboxError::Timeout(timeout)))
    }

    /// Messages routed here and not taken yet.
    pub fn waiting(&self) -> usize {
        self.mailbox.lock().waiting
    }

    /// Waits (at most `timeout`) until the pump has routed every completion its CQ holds now,
    /// then takes and counts the messages waiting here: for a queue pair already in ERROR,
    /// nothing more can arrive, so these are all the messages that landed and were not taken.
    pub async fn discard_all(&mut self, timeout: Duration) -> Result<usize, InboxError> {
        let (tx, rx) = oneshot::channel();
        self.requests
            .send(Request::Sync(tx))
            .map_err(|_| InboxError::Stopped("the pump ended".into()))?;
        tokio::time::timeout(timeout, rx)
            .await
            .map_err(|_| InboxError::Timeout(timeout))?
            .map_err(|_| InboxError::Stopped("the pump ended".into()))?;
        let mut discarded = 0;
        while let Ok(Some(delivery)) = self.mailbox.try_take() {
            discarded += usize::from(delivery.is_ok());
        }
        Ok(discarded)
    }
}

/// Routes `wc` and posts its slot again.
fn route(
    wc: Completion,
    srq: &SharedReceiveQueue,
    mr: &Arc<MemoryRegion>,
    slot_len: usize,
    routes: &Routes,
) -> Result<(), VerbsError> {
    let slots = mr.len() / slot_len.max(1);
    let slot = usize::try_from(wc.wr_id).unwrap_or(usize::MAX);
    if slot >= slots {
        // Not a receive we posted: nothing to post again, and nobody to give it to.
        tracing::warn!(
            wr_id = wc.wr_id,
            "a completion for an unknown shared receive"
        );
        return Ok(());
    }
    let delivery = if !wc.status.is_success() {
        Err(InboxError::Completion {
            wr_id: wc.wr_id,
            status: wc.status,
        })
    } else {
        match wc.opcode {
            WcOpcode::Recv => {
                let len = (wc.byte_len as usize).min(slot_len);
                let data = mr.read(slot * slot_len, len)?;
                Ok(Incoming {
                    opcode: wc.opcode,
                    data,
                    imm: None,
                })
            }
            WcOpcode::RecvRdmaWithImm => Ok(Incoming {
                opcode: wc.opcode,
                data: Vec::new(),
                imm: wc.imm_data,
            }),
            other => Ok(Incoming {
                opcode: other,
                data: Vec::new(),
                imm: None,
            }),
        }
    };
    // The bytes are copied out: the slot serves the next message, whoever's.
    srq.post_recv(wc.wr_id, mr, slot * slot_len..(slot + 1) * slot_len)?;
    routes.deliver(wc.qp_num, delivery);
    Ok(())
}

/// The one consumer of the shared CQ, so each queue pair's messages are routed in the order
/// they completed.
async fn pump(
    cq: Arc<CompletionQueue>,
    srq: Arc<SharedReceiveQueue>,
    mr: Arc<MemoryRegion>,
    slot_len: usize,
    routes: Arc<Routes>,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    let stop = |why: String| {
        tracing::error!(error = %why, "the shared receive queue's pump stopped");
        let mut by_qpn = routes.lock();
        for (_, route) in by_qpn.drain() {
            route.mailbox.push(Err(InboxError::Stopped(why.clone())));
        }
    };
    loop {
        tokio::select! {
            // A wait on the CQ takes a completion only when it returns it, so a request
            // arriving first loses none.
            wc = cq.next_unbounded() => {
                let routed = wc.and_then(|wc| route(wc, &srq, &mr, slot_len, &routes));
                if let Err(e) = routed {
                    return stop(e.to_string());
                }
            }
            request = requests.recv() => {
                let Some(Request::Sync(answer)) = request else { return };
                loop {
                    match cq.try_next() {
                        Ok(Some(wc)) => {
                            if let Err(e) = route(wc, &srq, &mr, slot_len, &routes) {
                                return stop(e.to_string());
                            }
                        }
                        Ok(None) => break,
                        Err(e) => return stop(e.to_string()),
                    }
                }
                let _ = answer.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send(text: &str) -> Delivery {
        Ok(Incoming {
            opcode: WcOpcode::Recv,
            data: text.as_bytes().to_vec(),
            imm: None,
        })
    }

    fn inbox(routes: &Arc<Routes>, qpn: u32, credit: usize) -> Inbox {
        let (requests, _) = mpsc::unbounded_channel();
        attach(routes, Qpn::new(qpn).expect("a QPN"), credit, requests)
    }

    #[tokio::test]
    async fn each_queue_pair_gets_its_own_messages_in_the_order_they_completed() {
        let routes = Arc::new(Routes::default());
        let mut a = inbox(&routes, 0x11, 16);
        let mut b = inbox(&routes, 0x12, 16);
        for (qpn, text) in [
            (0x11, "a1"),
            (0x12, "b1"),
            (0x11, "a2"),
            (0x12, "b2"),
            (0x11, "a3"),
        ] {
            routes.deliver(qpn, send(text));
        }
        for (inbox, want) in [
            (&mut a, &["a1", "a2", "a3"][..]),
            (&mut b, &["b1", "b2"][..]),
        ] {
            assert_eq!(inbox.waiting(), want.len());
            for w in want {
                assert_eq!(inbox.next().await.expect("a message").data, w.as_bytes());
            }
            assert_eq!(inbox.waiting(), 0);
        }
    }

    #[tokio::test]
    async fn a_peer_beyond_its_credit_is_cut_off_and_others_go_on() {
        let routes = Arc::new(Routes::default());
        let mut flood = inbox(&routes, 0x11, 2);
        let mut calm = inbox(&routes, 0x12, 2);
        // Taken as they come: never more than the credit waiting, however many in all.
        for i in 0..10 {
            routes.deliver(0x12, send(&format!("calm {i}")));
            assert_eq!(
                calm.next().await.expect("within credit").data,
                format!("calm {i}").as_bytes()
            );
        }
        // Two waiting is the credit; a third is a sender that does not wait for its acks.
        for text in ["f1", "f2", "f3", "f4"] {
            routes.deliver(0x11, send(text));
        }
        assert_eq!(flood.next().await.expect("first").data, b"f1");
        assert_eq!(flood.next().await.expect("second").data, b"f2");
        assert_eq!(
            flood.next().await,
            Err(InboxError::OverCredit { credit: 2 })
        );
        // Cut off: what still comes for it is nobody's.
        assert!(flood.next().await.is_err());
        let stats = (
            routes.counters.over_credit.get(),
            routes.counters.unrouted.get(),
        );
        assert_eq!(stats, (1, 1), "one cut off, f4 unrouted");
        routes.deliver(0x12, send("calm after"));
        assert_eq!(
            calm.next().await.expect("the other goes on").data,
            b"calm after"
        );
    }

    /// A session blocked elsewhere (writing an acknowledgement its flooding client never reads)
    /// hears of the cut without taking a message; a calm inbox never does.
    #[tokio::test]
    async fn a_cut_is_heard_without_taking_a_message() {
        let routes = Arc::new(Routes::default());
        let flood = inbox(&routes, 0x11, 1);
        let calm = inbox(&routes, 0x12, 1);
        let waiting = tokio::spawn(async move { (flood.cut_off().await, flood) });
        routes.deliver(0x11, send("f1"));
        routes.deliver(0x12, send("c1"));
        assert!(!waiting.is_finished());
        routes.deliver(0x11, send("f2"));
        let (cut, mut flood) = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("heard within 5 s")
            .expect("the task");
        assert_eq!(cut, InboxError::OverCredit { credit: 1 });
        assert_eq!(flood.next().await.expect("kept").data, b"f1");
        assert!(
            tokio::time::timeout(Duration::from_millis(50), calm.cut_off())
                .await
                .is_err(),
            "a calm inbox is never cut"
        );
    }

    #[tokio::test]
    async fn a_dropped_inbox_detaches_and_its_late_messages_are_counted_not_kept() {
        let routes = Arc::new(Routes::default());
        let gone = inbox(&routes, 0x11, 4);
        assert_eq!(routes.lock().len(), 1);
        drop(gone);
        assert_eq!(routes.lock().len(), 0);
        routes.deliver(0x11, send("late"));
        assert_eq!(routes.counters.unrouted.get(), 1);
    }

    /// What a held session's queue pair costs on the heap for its routing, once it has
    /// received a message: every session on a shared queue holds one for its life.
    #[test]
    fn a_queue_pairs_route_and_inbox_cost_a_few_hundred_bytes() {
        const N: u32 = 200;
        let routes = Arc::new(Routes::default());
        // The routes' table grows as queue pairs attach: made big enough first, so that what
        // is weighed is the queue pairs' own.
        routes.lock().reserve(N as usize * 2);
        // One pump's request channel for all, as a shared queue's sessions share theirs.
        let (requests, _pump) = mpsc::unbounded_channel();
        let (bytes, inboxes) = crate::test_alloc::held_by(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a runtime");
            let inboxes: Vec<Inbox> = (0..N)
                .map(|i| {
                    let qpn = Qpn::new(0x11 + i).expect("a QPN");
                    let mut inbox = attach(&routes, qpn, 16, requests.clone());
                    routes.deliver(0x11 + i, send("m"));
                    let got = rt.block_on(inbox.next()).expect("routed");
                    assert_eq!(got.data, b"m");
                    inbox
                })
                .collect();
            drop(rt);
            inboxes
        });
        let per = bytes as f64 / f64::from(N) - std::mem::size_of::<Inbox>() as f64;
        // A channel's first block of 32 and a watch of the cut cost 1.9 KiB per queue pair
        // (heaptrack, 1,000 sessions held on a shared queue).
        eprintln!("{per:.0} bytes per queue pair beside its Inbox");
        assert!(
            per <= 512.0,
            "{per:.0} bytes per queue pair beside its Inbox"
        );
        assert_eq!(routes.lock().len(), N as usize);
        drop(inboxes);
        assert_eq!(routes.lock().len(), 0);
    }

    fn sent(qpn: u32, wr_id: u64) -> Completion {
        Completion {
            wr_id,
            status: WcStatus(0),
            opcode: WcOpcode::Send,
            byte_len: 0,
            imm_data: None,
            qp_num: qpn,
        }
    }

    /// A queue pair's send route, as `attach_sending` makes it.
    fn joined(group: &Arc<SendGroup>, qpn: u32, need: usize) -> Inbox {
        let routes = Arc::new(Routes::default());
        let mut inbox = inbox(&routes, qpn, 1);
        let mut route = group.reserve(need);
        route.open(qpn);
        inbox.sends = Some(route);
        inbox
    }

    #[tokio::test]
    async fn each_queue_pair_gets_its_own_send_completions_in_order() {
        let group = Arc::new(SendGroup::new(64));
        let mut a = joined(&group, 0x11, 4);
        let mut b = joined(&group, 0x12, 4);
        for (qpn, wr_id) in [(0x11, 1), (0x12, 7), (0x11, 2), (0x11, 3), (0x12, 8)] {
            group.deliver(sent(qpn, wr_id));
        }
        let got = |inbox: &mut Inbox| {
            let mut ids = Vec::new();
            while let Some(Some(Ok(wc))) = inbox.sends.as_ref().map(|r| r.sent.try_pop()) {
                assert_eq!(
                    wc.qp_num,
                    inbox.qpn.get(),
                    "another queue pair's completion"
                );
                ids.push(wc.wr_id);
            }
            ids
        };
        assert_eq!(got(&mut a), [1, 2, 3]);
        assert_eq!(got(&mut b), [7, 8]);
        assert_eq!(
            a.next_sent(Duration::from_millis(10)).await,
            Err(InboxError::Timeout(Duration::from_millis(10)))
        );
        group.deliver(sent(0x12, 9));
        assert_eq!(
            b.next_sent(Duration::from_secs(1)).await.map(|wc| wc.wr_id),
            Ok(9)
        );
    }

    /// A session waiting for its completion is woken by it, and one that gave up waiting
    /// (a timeout, a `select!` that took another branch) loses nothing.
    #[tokio::test]
    async fn a_waiting_queue_pair_is_woken_and_a_cancelled_wait_loses_nothing() {
        let group = Arc::new(SendGroup::new(8));
        let mut a = joined(&group, 0x11, 4);
        assert!(a.next_sent(Duration::from_millis(5)).await.is_err());
        let waiter = tokio::spawn(async move {
            let wc = a.next_sent(Duration::from_secs(5)).await;
            (wc, a)
        });
        tokio::task::yield_now().await;
        group.deliver(sent(0x11, 1));
        let (wc, mut a) = waiter.await.expect("task");
        assert_eq!(wc.map(|wc| wc.wr_id), Ok(1));
        group.deliver(sent(0x11, 2));
        group.deliver(sent(0x11, 3));
        assert_eq!(
            a.next_sent(Duration::from_secs(1)).await.map(|w| w.wr_id),
            Ok(2)
        );
        assert_eq!(
            a.next_sent(Duration::from_secs(1)).await.map(|w| w.wr_id),
            Ok(3)
        );
    }

    /// The CQ cannot overflow: what the attached queue pairs can have in flight never exceeds
    /// its entries, and a queue pair that leaves gives its room back.
    #[tokio::test]
    async fn a_send_group_is_never_promised_more_than_its_entries() {
        let group = Arc::new(SendGroup::new(10));
        let a = joined(&group, 0x11, 4);
        let _b = joined(&group, 0x12, 4);
        assert!(group.fits(2), "8 of 10 reserved");
        assert!(
            !group.fits(4),
            "a third queue pair of 4 needs the next group"
        );
        drop(a);
        assert!(group.fits(4), "room given back when a queue pair leaves");
        assert_eq!(group.lock().len(), 1, "and its route is gone");
        // Its late completions (the flushes of a queue pair dropped undrained) are counted.
        group.deliver(sent(0x11, 5));
        assert_eq!(group.unrouted.load(Ordering::Relaxed), 1);
        // A reservation whose queue pair could not be made is given back too.
        let failed = group.reserve(6);
        assert!(!group.fits(1));
        drop(failed);
        assert!(group.fits(6));
    }

    #[tokio::test]
    async fn a_queue_pair_with_its_own_send_cq_is_told_to_poll_it() {
        let routes = Arc::new(Routes::default());
        let mut own = inbox(&routes, 0x11, 1);
        assert!(!own.routes_sends());
        assert_eq!(
            own.next_sent(Duration::from_secs(1)).await,
            Err(InboxError::SendsNotRouted)
        );
    }

    #[tokio::test]
    async fn an_error_completion_reaches_its_queue_pair_without_using_credit() {
        let routes = Arc::new(Routes::default());
        let mut a = inbox(&routes, 0x11, 1);
        let failed = Err(InboxError::Completion {
            wr_id: 3,
            status: WcStatus(5),
        });
        routes.deliver(0x11, failed.clone());
        assert_eq!(a.waiting(), 0);
        assert_eq!(a.next().await, failed);
        routes.deliver(0x11, send("next"));
        assert_eq!(a.next().await.expect("still within credit").data, b"next");
    }
}
