// The numbers shared with the kernel programs, written once. This file is read twice:
// `build.rs` turns every entry into a `#define NAME value` of `$OUT_DIR/abi.h`, which
// `bpf/*.bpf.c` include, and `src/abi.rs` turns it into `pub const NAME: u32`. Verb and resource
// ids are not here: they are `rdma_quota::Verb::id()` and `rdma_quota::Resource::id()`, which
// build.rs writes into the same header as `V_*` and `R_*`.
abi_consts! {
    /// Slots of the per-verb arrays (`totals`, `errors`, `cg_ops`): every verb id is below it.
    N_VERBS = 16;
    /// `inflight` key of an `ib_uverbs_ioctl` call, whose verb is only known from its header.
    SLOT_IOCTL = 0x100;
    /// Slot of the `live` map holding the registered MR bytes, after one slot per resource.
    LIVE_MR_BYTES = 4;
    /// Slots of the `live` map.
    N_LIVE = 5;
    /// `stats` slot: ring buffer full, an event was dropped (the counters were still updated).
    S_LOST_EVENTS = 0;
    /// `stats` slot: an object created before the monitor started was destroyed.
    S_UNTRACKED_DESTROY = 1;
    /// `stats` slot: the `tracked` map was full, a new object was not counted.
    S_TRACKED_FULL = 2;
    /// `stats` slot: an object address was reused without a destroy the monitor saw.
    S_STALE_TRACKED = 3;
    /// `stats` slot: the `inflight` map was full, a call was not counted.
    S_INFLIGHT_FULL = 4;
    /// Slots of the `stats` map.
    N_STATS = 8;
    /// Bytes of a monitor event's device name (the kernel's `IB_DEVICE_NAME_MAX`).
    IB_DEVICE_NAME_MAX = 64;
    /// Bytes of a monitor event's command name (the kernel's `TASK_COMM_LEN`).
    COMM_LEN = 16;
    /// Largest packet prefix a capture record holds; a power of two, which the verifier needs
    /// to bound the copy.
    SNAP = 2048;
    /// Capture record source: XDP on a netdev (received; bytes start at Ethernet).
    SOURCE_INGRESS = 0;
    /// Capture record source: TC egress on a netdev (sent; bytes start at Ethernet).
    SOURCE_EGRESS = 1;
    /// Capture record source: the rxe transmit probe (bytes start at the IP header).
    SOURCE_RXE_SEND = 2;
    /// Capture record source: the rxe receive probe (bytes start at the IP header).
    SOURCE_RXE_RECV = 3;
}
