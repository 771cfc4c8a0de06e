//! Following queue pairs: the PSN sequence of each direction, with gaps, duplicates and
//! retransmissions flagged.
//!
//! A *flow* is one PSN sequence: (source ip:port, destination ip:port, destination QPN,
//! [`Stream`]). Packets a QP receives all carry its QPN, whether they are requests from the
//! peer or responses to its own requests, but those are two independent sequences: requests
//! number from the peer's send PSN, responses echo the QP's own. Both ends of an RC connection
//! usually send requests, so each direction holds both and is split in two. Packets a QP sends
//! carry the peer's QPN. PSNs are 24-bit and wrap; "behind" and "ahead" use the half-window
//! rule (a PSN less than 2^23 ahead of the highest seen is ahead, anything else is behind).
//!
//! How a PSN is judged depends on the opcode:
//!
//! * **Requests** advance the requester's PSN by one per packet, except an RDMA READ Request,
//!   which reserves one PSN per response packet (`ceil(len / path MTU)`; with no MTU given any
//!   jump up to `ceil(len / 256)` is accepted). A larger jump is a **gap**: packets were lost
//!   (or not captured).
//! * **Responses** carry the PSN of the request they answer. ACKs are coalesced, so a jump
//!   before an ACK, ATOMIC ACK or READ Response First/Only is **coalesced**, not a gap; a jump
//!   inside a READ response (Middle/Last) is a gap.
//! * The same PSN as the previous packet is a **duplicate**; a PSN behind the highest seen (or
//!   equal to it after others) is a **retransmission** (go-back-N after a NAK or timeout).
//!
//! With [`FollowConfig::qpn`] set, the follower reports flows to that QP and learns the flows
//! of the reverse direction (packets to the peer QP, whose number no RC header carries) by
//! matching a response PSN in one direction with a request PSN in the other: the peer's
//! requests once the QP acknowledges one of them, the peer's responses once one answers the
//! QP's request. PSNs start at random 24-bit values, so an accidental match with another QP
//! pair between the same hosts is unlikely but possible.
//!
//! Anyone who can put packets on the wire can make flows, so the follower's memory is bounded:
//! it keeps at most [`FollowConfig::max_flows`] flows (least recently seen go first, unfollowed
//! before followed; [`Follower::evicted`] counts them), and pairing looks a response's PSN up
//! in an index of the last 4,096 requests instead of scanning the reverse flows.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, SocketAddr};

use lru::LruCache;
use serde::Serialize;

use crate::ext::AethSyndrome;
use crate::opcode::Operation;
use crate::packet::Packet;
use crate::psn::{self, HALF_WINDOW};

/// How far behind a flow's highest request PSN a response may be and still pair with it.
const RECENT: u32 = 64;
/// How many recent requests (of all flows together) the pairing index remembers. Pairing
/// happens within a round trip, so this only has to outlast the packets of one; a flood
/// longer than this between a request and its response delays pairing to a later exchange.
const RECENT_REQUESTS: usize = 4096;
/// The smallest path MTU, bounding how many PSNs an RDMA READ can reserve.
const MIN_PATH_MTU: u32 = 256;
/// Flows a [`Follower`] keeps by default ([`FollowConfig::max_flows`]): about 14 MB.
pub const DEFAULT_MAX_FLOWS: usize = 65_536;

/// The PSN mask, at the path it had before the arithmetic moved to [`crate::psn`].
pub use crate::psn::PSN_MASK;

/// `(a - b) mod 2^24`: [`crate::psn::distance`], at its former path.
pub use crate::psn::distance as psn_distance;

/// True if `a` is ahead of `b` by less than half the PSN space: [`crate::psn::ahead`], at its
/// former path.
pub use crate::psn::ahead as psn_ahead;

/// Which of the two PSN sequences of one direction a packet is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Requests (and anything that is not a response), numbered from the sender's send PSN.
    Requests,
    /// READ responses, ACK/NAK and ATOMIC ACK, which carry the PSNs of the requests they answer.
    Responses,
}

impl Stream {
    /// `"requests"` or `"responses"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stream::Requests => "requests",
            Stream::Responses => "responses",
        }
    }
}

/// Identifies one PSN sequence: one direction of traffic to one QP, requests or responses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct FlowKey {
    /// Source ip:port, if the IP/UDP headers were decoded.
    pub src: Option<SocketAddr>,
    /// Destination ip:port, if the IP/UDP headers were decoded.
    pub dst: Option<SocketAddr>,
    /// Destination QP.
    pub dest_qp: u32,
    /// Requests or responses.
    pub stream: Stream,
}

impl FlowKey {
    /// The flow a packet belongs to.
    pub fn of(p: &Packet<'_>) -> FlowKey {
        FlowKey {
            src: p.src(),
            dst: p.dst(),
            dest_qp: p.bth.dest_qp,
            stream: if p.opcode().operation().is_response() {
                Stream::Responses
            } else {
                Stream::Requests
            },
        }
    }

    fn ips(&self) -> Option<(IpAddr, IpAddr)> {
        Some((self.src?.ip(), self.dst?.ip()))
    }
}

/// How a packet's PSN relates to its flow's history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum PsnEvent {
    /// The flow's first packet.
    First,
    /// The next PSN (or within an RDMA READ's reservation).
    InOrder,
    /// PSNs were skipped: packets lost or not captured.
    Gap {
        /// The furthest PSN that would still have been in order.
        expected: u32,
        /// How many PSNs are missing at least.
        missing: u32,
    },
    /// A response skipped PSNs, as coalesced ACKs do.
    Coalesced {
        /// PSNs acknowledged implicitly.
        skipped: u32,
    },
    /// The same PSN as the previous packet.
    Duplicate,
    /// A PSN at or behind the highest seen, after others: a resend.
    Retransmission {
        /// The highest PSN seen so far.
        highest: u32,
    },
}

/// The PSN history of one flow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct DirectionSummary {
    /// PSN of the first packet.
    pub first_psn: u32,
    /// PSN of the latest packet.
    pub last_psn: u32,
    /// Highest PSN seen (modulo 2^24).
    pub highest_psn: u32,
    /// Packets seen.
    pub packets: u64,
    /// Gaps flagged.
    pub gaps: u64,
    /// PSNs missing in those gaps.
    pub missing: u64,
    /// Duplicates flagged.
    pub duplicates: u64,
    /// Retransmissions flagged.
    pub retransmissions: u64,
    /// Coalesced-ACK jumps (normal).
    pub coalesced: u64,
    /// NAKs seen (AETH syndrome NAK).
    pub naks: u64,
    /// RNR NAKs seen.
    pub rnr_naks: u64,
}

/// What the follower makes of one packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Observation {
    /// The packet's flow.
    pub flow: FlowKey,
    /// The packet's PSN.
    pub psn: u32,
    /// How the PSN fits the flow.
    pub event: PsnEvent,
    /// True if the flow is followed: always without a QPN filter; with one, for flows to the QP
    /// and the reverse flows paired with them.
    pub followed: bool,
}

/// Settings for a [`Follower`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FollowConfig {
    /// Follow only this QP (and its peer's direction); `None` follows every flow.
    pub qpn: Option<u32>,
    /// The path MTU in bytes, for the PSNs an RDMA READ reserves; `None` if unknown.
    pub path_mtu: Option<u32>,
    /// The most flows kept at once (at least 1). Every packet with a new address, port, QPN
    /// or stream is a new flow, so anyone who can send to the wire can make them; beyond
    /// this the least recently seen flow is forgotten (unfollowed flows before followed ones)
    /// and counted in [`Follower::evicted`]. A forgotten flow that comes back starts afresh.
    pub max_flows: usize,
}

impl Default for FollowConfig {
    fn default() -> Self {
        FollowConfig {
            qpn: None,
            path_mtu: None,
            max_flows: DEFAULT_MAX_FLOWS,
        }
    }
}

#[derive(Clone, Debug)]
struct FlowState {
    summary: DirectionSummary,
    /// Forward PSN distances from `highest_psn` that count as in order.
    window: (u32, u32),
    /// Set once the flow's reverse direction has been found; stops further pairing work.
    paired: bool,
}

/// Where a request was seen: its addresses and PSN, the key of the pairing index.
type RequestAt = (IpAddr, IpAddr, u32);

/// Tracks the PSN sequence of every flow it is fed, up to [`FollowConfig::max_flows`] flows.
///
/// ```
/// use roce::follow::{FollowConfig, Follower, PsnEvent};
/// # let frame = roce::doc_example_frame();
/// let pkt = roce::decode_ethernet(&frame)?;
///
/// let config = FollowConfig { qpn: Some(pkt.bth.dest_qp), path_mtu: Some(1024), ..FollowConfig::default() };
/// let mut f = Follower::new(config);
/// assert_eq!(f.observe(&pkt).event, PsnEvent::First);
/// assert_eq!(f.observe(&pkt).event, PsnEvent::Duplicate);
/// let (_, summary) = f.summaries().next().unwrap();
/// assert_eq!((summary.packets, summary.duplicates), (2, 1));
/// assert_eq!(f.evicted(), 0);
/// # Ok::<(), roce::DecodeError>(())
/// ```
#[derive(Debug)]
pub struct Follower {
    config: FollowConfig,
    /// Followed flows, least recently seen first out.
    followed: LruCache<FlowKey, FlowState>,
    /// Flows seen but not followed (only with a QPN filter), evicted before followed ones.
    unfollowed: LruCache<FlowKey, FlowState>,
    /// Flows forgotten to stay within `max_flows`.
    evicted: u64,
    /// With a QPN filter: the flows that recently sent a request, by its addresses and PSN,
    /// so that a response finds the request it answers without scanning every flow.
    requests: HashMap<RequestAt, Vec<FlowKey>>,
    /// The entries of `requests` in the order they were made, oldest first, to age them out.
    request_order: VecDeque<(RequestAt, FlowKey)>,
    /// Flows to follow from their first packet whatever their QPN (see [`Follower::follow`]).
    preset: HashSet<FlowKey>,
    /// Flows that pairing turned from unfollowed to followed since the last
    /// [`Follower::take_newly_followed`].
    newly_followed: Vec<FlowKey>,
}

impl Default for Follower {
    fn default() -> Self {
        Follower::new(FollowConfig::default())
    }
}

impl Follower {
    /// A follower with the given settings.
    pub fn new(config: FollowConfig) -> Follower {
        let config = FollowConfig {
            max_flows: config.max_flows.max(1),
            ..config
        };
        Follower {
            config,
            followed: LruCache::unbounded(),
            unfollowed: LruCache::unbounded(),
            evicted: 0,
            requests: HashMap::new(),
            request_order: VecDeque::new(),
            preset: HashSet::new(),
            newly_followed: Vec::new(),
        }
    }

    /// Feeds one packet and classifies its PSN.
    pub fn observe(&mut self, p: &Packet<'_>) -> Observation {
        let key = FlowKey::of(p);
        let psn = p.bth.psn & PSN_MASK;
        let op = p.opcode().operation();
        let mtu = self.config.path_mtu;

        let followed = self.touch(key);
        let table = if followed {
            &mut self.followed
        } else {
            &mut self.unfollowed
        };
        let Some(state) = table.get_mut(&key) else {
            // `touch` has just put it there.
            return Observation {
                flow: key,
                psn,
                event: PsnEvent::First,
                followed,
            };
        };
        let event = step(state, psn, op, p.ext.reth.map(|r| r.dma_len), mtu);
        let s = &mut state.summary;
        match p.ext.aeth.map(|a| a.syndrome) {
            Some(AethSyndrome::Nak(_)) => s.naks += 1,
            Some(AethSyndrome::RnrNak { .. }) => s.rnr_naks += 1,
            _ => {}
        }

        if self.config.qpn.is_some() {
            if op.is_request() {
                self.remember_request(key, psn);
            } else if op.is_response() {
                self.pair(key, psn);
            }
        }
        Observation {
            flow: key,
            psn,
            event,
            followed: self.followed.contains(&key),
        }
    }

    /// Makes `key` the most recently seen flow, creating it (and evicting the least recently
    /// seen one if the table is full) if it is new; true if it is followed.
    fn touch(&mut self, key: FlowKey) -> bool {
        if self.followed.promote(&key) {
            return true;
        }
        if self.unfollowed.promote(&key) {
            return false;
        }
        if self.followed.len() + self.unfollowed.len() >= self.config.max_flows {
            // Unfollowed flows are what a flood makes; the followed QP's go last.
            if self.unfollowed.pop_lru().is_none() {
                self.followed.pop_lru();
            }
            self.evicted += 1;
        }
        let followed =
            self.config.qpn.is_none_or(|q| q == key.dest_qp) || self.preset.contains(&key);
        let state = FlowState {
            summary: DirectionSummary::default(),
            window: (1, 1),
            paired: false,
        };
        if followed {
            self.followed.push(key, state);
        } else {
            self.unfollowed.push(key, state);
        }
        followed
    }

    /// Indexes a request of flow `key`, forgetting the oldest indexed request if the index is
    /// full.
    fn remember_request(&mut self, key: FlowKey, psn: u32) {
        let Some((src, dst)) = key.ips() else { return };
        if self.request_order.len() == RECENT_REQUESTS {
            if let Some((at, old)) = self.request_order.pop_front() {
                if let Some(flows) = self.requests.get_mut(&at) {
                    if let Some(i) = flows.iter().position(|k| *k == old) {
                        flows.swap_remove(i);
                    }
                    if flows.is_empty() {
                        self.requests.remove(&at);
                    }
                }
            }
        }
        let at = (src, dst, psn);
        // Nearly always one flow per (addresses, PSN): no room for more until needed.
        self.requests
            .entry(at)
            .or_insert_with(|| Vec::with_capacity(1))
            .push(key);
        self.request_order.push_back((at, key));
    }

    /// A response with `psn` in flow `key` answers a request with the same PSN in the reverse
    /// direction; if one side is followed, the other becomes followed too.
    fn pair(&mut self, key: FlowKey, psn: u32) {
        let Some((src, dst)) = key.ips() else { return };
        let this_followed = self.followed.contains(&key);
        let this = if this_followed {
            self.followed.peek(&key)
        } else {
            self.unfollowed.peek(&key)
        };
        // A followed flow stops looking once it has found its peer.
        if this.is_none_or(|s| this_followed && s.paired) {
            return;
        }
        // Only the reverse flows that sent a request with this PSN lately, found through the
        // index: an unfollowed response looks for a followed request and the other way round.
        let Some(candidates) = self.requests.get(&(dst, src, psn)) else {
            return;
        };
        let other_table = if this_followed {
            &self.unfollowed
        } else {
            &self.followed
        };
        let answered = candidates.iter().copied().find(|k| {
            *k != key
                && other_table
                    .peek(k)
                    .is_some_and(|o| psn::distance(o.summary.highest_psn, psn) < RECENT)
        });
        let Some(other) = answered else { return };
        for k in [key, other] {
            if self.start_following(k) {
                self.newly_followed.push(k);
            }
            if let Some(s) = self.followed.peek_mut(&k) {
                s.paired = true;
            }
        }
    }

    /// Marks a known flow followed; true if it was not before.
    fn start_following(&mut self, key: FlowKey) -> bool {
        match self.unfollowed.pop(&key) {
            Some(state) => {
                self.followed.push(key, state);
                true
            }
            None => false,
        }
    }

    /// Follows these flows from their first packet, as if already paired: used when the whole
    /// capture is known in advance (a file), so a peer's packets that come before the first
    /// response pairing them are not missed. Flows seen already are followed from now on.
    ///
    /// ```
    /// use roce::follow::{FlowKey, FollowConfig, Follower};
    /// # let frame = roce::doc_example_frame();
    /// let pkt = roce::decode_ethernet(&frame)?;
    ///
    /// let mut f = Follower::new(FollowConfig { qpn: Some(pkt.bth.dest_qp ^ 1), ..FollowConfig::default() });
    /// f.follow([FlowKey::of(&pkt)]);
    /// assert!(f.observe(&pkt).followed);
    /// # Ok::<(), roce::DecodeError>(())
    /// ```
    pub fn follow(&mut self, flows: impl IntoIterator<Item = FlowKey>) {
        for key in flows {
            self.start_following(key);
            self.preset.insert(key);
        }
    }

    /// The flows that pairing started following since the last call, in the order it found
    /// them. Their packets before that were reported with `followed: false`; a live capture
    /// that held them back can show them now.
    pub fn take_newly_followed(&mut self) -> Vec<FlowKey> {
        std::mem::take(&mut self.newly_followed)
    }

    /// The keys of every followed flow still kept, in key order.
    pub fn followed(&self) -> impl Iterator<Item = FlowKey> + '_ {
        self.summaries().map(|(k, _)| *k)
    }

    /// The summary of every followed flow still kept, in key order.
    pub fn summaries(&self) -> impl Iterator<Item = (&FlowKey, &DirectionSummary)> {
        let mut flows: Vec<(&FlowKey, &DirectionSummary)> =
            self.followed.iter().map(|(k, s)| (k, &s.summary)).collect();
        flows.sort_unstable_by_key(|(k, _)| **k);
        flows.into_iter()
    }

    /// The summary of one flow, followed or not, if it is still kept.
    pub fn summary(&self, key: &FlowKey) -> Option<&DirectionSummary> {
        self.followed
            .peek(key)
            .or_else(|| self.unfollowed.peek(key))
            .map(|s| &s.summary)
    }

    /// Flows kept now, followed or not; at most [`FollowConfig::max_flows`].
    pub fn flows(&self) -> usize {
        self.followed.len() + self.unfollowed.len()
    }

    /// How many flows were forgotten to stay within [`FollowConfig::max_flows`].
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The settings in force (`max_flows` at least 1).
    pub fn config(&self) -> &FollowConfig {
        &self.config
    }
}

/// Classifies `psn` and updates the flow's PSN counters and window.
fn step(
    state: &mut FlowState,
    psn: u32,
    op: Operation,
    dma_len: Option<u32>,
    mtu: Option<u32>,
) -> PsnEvent {
    let event = classify(state, psn, op);
    let s = &mut state.summary;
    s.packets += 1;
    s.last_psn = psn;
    match event {
        PsnEvent::First => {
            s.first_psn = psn;
            s.highest_psn = psn;
        }
        PsnEvent::InOrder => s.highest_psn = psn,
        PsnEvent::Gap { missing, .. } => {
            s.highest_psn = psn;
            s.gaps += 1;
            s.missing += u64::from(missing);
        }
        PsnEvent::Coalesced { .. } => {
            s.highest_psn = psn;
            s.coalesced += 1;
        }
        PsnEvent::Duplicate => s.duplicates += 1,
        PsnEvent::Retransmission { .. } => s.retransmissions += 1,
    }
    // Only a packet that advances the sequence sets the next window: a resend of a READ
    // Request does not reserve its PSNs again.
    if !matches!(event, PsnEvent::Duplicate | PsnEvent::Retransmission { .. }) {
        state.window = next_window(op, dma_len, mtu);
    }
    event
}

fn classify(state: &FlowState, psn: u32, op: Operation) -> PsnEvent {
    let s = &state.summary;
    if s.packets == 0 {
        return PsnEvent::First;
    }
    if psn == s.last_psn {
        return PsnEvent::Duplicate;
    }
    let d = psn::distance(psn, s.highest_psn);
    if d == 0 || d >= HALF_WINDOW {
        return PsnEvent::Retransmission {
            highest: s.highest_psn,
        };
    }
    let (_, max) = state.window;
    if d <= max {
        return PsnEvent::InOrder;
    }
    let implicit_ack = op.is_response()
        && !matches!(
            op,
            Operation::ReadResponseMiddle | Operation::ReadResponseLast
        );
    if implicit_ack {
        PsnEvent::Coalesced { skipped: d - 1 }
    } else {
        PsnEvent::Gap {
            expected: psn::advance(s.highest_psn, max),
            missing: d - max,
        }
    }
}

/// The forward distances that will count as in order after a packet with operation `op`.
fn next_window(op: Operation, dma_len: Option<u32>, path_mtu: Option<u32>) -> (u32, u32) {
    if op != Operation::ReadRequest {
        return (1, 1);
    }
    let len = dma_len.unwrap_or(0);
    let packets = |mtu: u32| len.div_ceil(mtu.max(1)).max(1);
    match path_mtu {
        Some(mtu) => (packets(mtu), packets(mtu)),
        None => (1, packets(MIN_PATH_MTU)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> FlowState {
        FlowState {
            summary: DirectionSummary::default(),
            window: (1, 1),
            paired: false,
        }
    }

    /// Runs `psns` (all with operation `op`) through the classifier.
    fn run(psns: &[u32], op: Operation) -> (Vec<PsnEvent>, DirectionSummary) {
        let mut st = state();
        let events = psns
            .iter()
            .map(|&psn| step(&mut st, psn, op, None, None))
            .collect();
        (events, st.summary)
    }

    use PsnEvent::*;

    #[test]
    fn in_order_across_the_wrap() {
        let (events, s) = run(
            &[0xfffffd, 0xfffffe, 0xffffff, 0, 1, 2],
            Operation::SendOnly,
        );
        assert_eq!(events, [First, InOrder, InOrder, InOrder, InOrder, InOrder]);
        assert_eq!(
            (s.first_psn, s.last_psn, s.highest_psn, s.packets),
            (0xfffffd, 2, 2, 6)
        );
    }

    #[test]
    fn gap_across_the_wrap() {
        let (events, s) = run(&[0xfffffe, 0xffffff, 2, 3], Operation::WriteMiddle);
        assert_eq!(
            events,
            [
                First,
                InOrder,
                Gap {
                    expected: 0,
                    missing: 2
                },
                InOrder
            ]
        );
        assert_eq!((s.gaps, s.missing), (1, 2));
    }

    #[test]
    fn duplicates_and_go_back_n() {
        // 10..13, 13 again, then the requester goes back to 11 after a NAK.
        let (events, s) = run(&[10, 11, 12, 13, 13, 11, 12, 13, 14], Operation::SendMiddle);
        assert_eq!(
            events,
            [
                First,
                InOrder,
                InOrder,
                InOrder,
                Duplicate,
                Retransmission { highest: 13 },
                Retransmission { highest: 13 },
                Retransmission { highest: 13 },
                InOrder
            ]
        );
        assert_eq!((s.duplicates, s.retransmissions, s.highest_psn), (1, 3, 14));
    }

    #[test]
    fn retransmission_across_the_wrap() {
        let (events, _) = run(
            &[0xfffffe, 0xffffff, 0, 1, 0xffffff, 0],
            Operation::WriteMiddle,
        );
        assert_eq!(events[4], Retransmission { highest: 1 });
        assert_eq!(events[5], Retransmission { highest: 1 });
    }

    #[test]
    fn far_behind_is_a_retransmission_far_ahead_a_gap() {
        let (events, _) = run(&[100, 100 + 0x7fffff], Operation::SendOnly);
        assert_eq!(
            events[1],
            Gap {
                expected: 101,
                missing: 0x7ffffe
            }
        );
        let (events, _) = run(&[100, 100 + 0x800000], Operation::SendOnly);
        assert_eq!(events[1], Retransmission { highest: 100 });
    }

    #[test]
    fn coalesced_acks_are_not_gaps() {
        let (events, s) = run(&[5, 9, 9, 12], Operation::Acknowledge);
        assert_eq!(
            events,
            [
                First,
                Coalesced { skipped: 3 },
                Duplicate,
                Coalesced { skipped: 2 }
            ]
        );
        assert_eq!(s.gaps, 0);
        let (events, _) = run(&[5, 7], Operation::ReadResponseMiddle);
        assert_eq!(
            events[1],
            Gap {
                expected: 6,
                missing: 1
            }
        );
    }

    #[test]
    fn read_requests_reserve_psns() {
        assert_eq!(
            next_window(Operation::ReadRequest, Some(4096), Some(1024)),
            (4, 4)
        );
        assert_eq!(
            next_window(Operation::ReadRequest, Some(0), Some(1024)),
            (1, 1)
        );
        assert_eq!(
            next_window(Operation::ReadRequest, Some(4097), None),
            (1, 17)
        );
        assert_eq!(
            next_window(Operation::SendOnly, Some(4096), Some(1024)),
            (1, 1)
        );
        let mut st = state();
        st.summary = DirectionSummary {
            packets: 1,
            last_psn: 0xfffffe,
            highest_psn: 0xfffffe,
            ..Default::default()
        };
        st.window = (4, 4);
        assert_eq!(classify(&st, 2, Operation::SendOnly), InOrder);
        assert_eq!(
            classify(&st, 3, Operation::SendOnly),
            Gap {
                expected: 2,
                missing: 1
            }
        );
    }
}

#[cfg(test)]
mod bounds {
    use super::*;
    use crate::{Aeth, AethSyndrome, Opcode, PacketBuilder};
    use std::net::Ipv4Addr;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    fn packet(op: Opcode, src: Ipv4Addr, dst: Ipv4Addr, port: u16, qpn: u32, psn: u32) -> Vec<u8> {
        let b = PacketBuilder::new(op)
            .ipv4(src, dst)
            .src_port(port)
            .dest_qp(qpn)
            .psn(psn);
        let b = if op == Opcode::RC_ACKNOWLEDGE {
            b.aeth(Aeth {
                syndrome: AethSyndrome::Ack { credits: 31 },
                msn: 1,
            })
        } else {
            b.payload(*b"x")
        };
        b.frame().expect("frame")
    }

    fn observe(f: &mut Follower, frame: &[u8]) -> Observation {
        f.observe(&crate::decode_ethernet(frame).expect("decode"))
    }

    #[test]
    fn a_flood_evicts_unfollowed_flows_first() {
        let mut f = Follower::new(FollowConfig {
            qpn: Some(0x200),
            max_flows: 8,
            ..FollowConfig::default()
        });
        let send = Opcode::RC_SEND_ONLY;
        assert!(observe(&mut f, &packet(send, A, B, 0xc100, 0x200, 1)).followed);
        for i in 0..1000u32 {
            let o = observe(&mut f, &packet(send, B, A, 0xc000, 0x1000 + i, i));
            assert!(!o.followed);
        }
        assert_eq!(f.flows(), 8);
        assert_eq!(f.evicted(), 1001 - 8);
        // The followed flow kept its history through the flood.
        let o = observe(&mut f, &packet(send, A, B, 0xc100, 0x200, 2));
        assert_eq!((o.followed, o.event), (true, PsnEvent::InOrder));
        // Without a filter every flow is followed; the table still holds 8.
        let mut all = Follower::new(FollowConfig {
            max_flows: 8,
            ..FollowConfig::default()
        });
        for i in 0..100u32 {
            observe(&mut all, &packet(send, B, A, 0xc000, 0x1000 + i, i));
        }
        assert_eq!(
            (all.flows(), all.evicted(), all.summaries().count()),
            (8, 92, 8)
        );
    }

    #[test]
    fn pairing_finds_the_request_through_the_index_despite_a_flood() {
        let mut f = Follower::new(FollowConfig {
            qpn: Some(0x200),
            ..FollowConfig::default()
        });
        let (send, ack) = (Opcode::RC_SEND_ONLY, Opcode::RC_ACKNOWLEDGE);
        // A's QP 0x100 sends to B's followed QP 0x200.
        observe(&mut f, &packet(send, A, B, 0xc100, 0x200, 0x900));
        // B's QP 0x200 sends a request to A's QP 0x100: unfollowed until paired.
        assert!(!observe(&mut f, &packet(send, B, A, 0xc200, 0x100, 0x500)).followed);
        // A flood of requests between the same hosts, to other QPs, PSNs all around 0x500.
        for i in 0..3000u32 {
            let psn = 0x400 + (i % 0x200);
            if psn == 0x500 {
                continue;
            }
            observe(
                &mut f,
                &packet(send, B, A, 0xc000 | (i as u16 & 0xfff), 0x10000 + i, psn),
            );
        }
        // A's ACK of PSN 0x500 to B's QP (followed): it pairs B's request direction.
        let o = observe(&mut f, &packet(ack, A, B, 0xc100, 0x200, 0x500));
        assert!(o.followed);
        let paired = f.take_newly_followed();
        assert_eq!(paired.len(), 1, "{paired:?}");
        assert_eq!(
            (paired[0].dest_qp, paired[0].stream),
            (0x100, Stream::Requests)
        );
        // B's ACK of A's 0x900 (to QP 0x100): the unfollowed response pairs with the followed
        // request.
        let o = observe(&mut f, &packet(ack, B, A, 0xc200, 0x100, 0x900));
        assert!(o.followed);
        assert_eq!(f.followed().count(), 4);
        assert_eq!(f.followed().filter(|k| k.dest_qp >= 0x10000).count(), 0);
    }
}
