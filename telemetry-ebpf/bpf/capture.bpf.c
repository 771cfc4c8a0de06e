// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// rdma-capture kernel side.
//
// * XDP (ingress) and TC classifier (egress) programs on a netdev keep only RoCEv2 frames
//   (IPv4/IPv6 UDP with source or destination port 4791, optionally behind one 802.1Q tag).
//   Both always let the packet through (XDP_PASS / TC_ACT_OK).
// * kprobes on Soft-RoCE itself, for traffic between two QPs of one rxe device, which rxe
//   loops back internally and never hands to a netdev: rxe_rcv (every packet an rxe device
//   receives, from the wire or looped back) and the return of rxe_icrc_generate (every packet
//   an rxe device sends, at the first point where its ICRC is in place). Only sk_buff and
//   net_device are read, both vmlinux types, so CO-RE needs no rdma_rxe module BTF.
//
// Each program pushes up to SNAP bytes plus metadata to one ring buffer. Record layout
// (little endian, shared with src/capture/record.rs):
//   u32 ifindex; u8 source (0 XDP ingress, 1 TC egress, 2 rxe send, 3 rxe receive); u8 pad[3];
//   u32 orig_len; u32 cap_len; u64 ktime_ns (CLOCK_MONOTONIC); u8 data[SNAP]
// XDP/TC records start at the Ethernet header, rxe records at the IP header.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

#define SNAP 2048 /* must be a power of two (verifier bound below) */
#define ROCE_PORT 4791
#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD
#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8
#define IPPROTO_UDP_ 17
#define TC_ACT_OK_ 0

char LICENSE[] SEC("license") = "Dual BSD/GPL";

struct event {
	__u32 ifindex;
	__u8 dir;
	__u8 pad[3];
	__u32 orig_len;
	__u32 cap_len;
	__u64 ktime_ns;
	__u8 data[SNAP];
};

/* Userspace may resize with EbpfLoader::set_max_entries("events", bytes). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20);
} events SEC(".maps");

/* Per-CPU scratch record: frames are copied here, then bpf_ringbuf_output() copies only
 * header + cap_len bytes, so small frames (ACKs) do not take SNAP bytes of ring space. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct event);
} scratch SEC(".maps");

/* index 0: ring-buffer reserve failures (drops); 1: frames matched; 2: frames seen */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 4);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Snap length set by userspace (rodata, aya set_global("SNAPLEN", ..)); clamped to SNAP. */
volatile const __u32 SNAPLEN = SNAP;
/* rxe probes: keep only packets whose skb->dev has this ifindex; 0 keeps every rxe device. */
volatile const __u32 IFINDEX = 0;

/* rxe_icrc_generate(skb, pkt): the skb seen at entry, read again at return. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, __u64);
} tx_skb SEC(".maps");

static __always_inline void count(__u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&counters, &idx);
	if (v)
		*v += 1;
}

/* Fixed-size header loads only: the verifier accepts constant lengths without bounding. */
#define PARSE(LOAD, ctx, len)                                                                     \
	({                                                                                        \
		int __ok = 0;                                                                     \
		__u8 eth[18];                                                                     \
		__u32 off = 14;                                                                   \
		__u16 proto = 0;                                                                  \
		if (LOAD(ctx, 0, eth, 14) == 0) {                                                 \
			proto = ((__u16)eth[12] << 8) | eth[13];                                  \
			if (proto == ETH_P_8021Q_ || proto == ETH_P_8021AD_) {                     \
				if (LOAD(ctx, 14, eth + 14, 4) == 0) {                            \
					proto = ((__u16)eth[16] << 8) | eth[17];                  \
					off = 18;                                                 \
				} else {                                                          \
					proto = 0;                                                \
				}                                                                 \
			}                                                                         \
		}                                                                                 \
		__u8 l4 = 0;                                                                      \
		if (proto == ETH_P_IP_) {                                                         \
			__u8 ip[20];                                                              \
			if (LOAD(ctx, off, ip, 20) == 0 && (ip[0] >> 4) == 4) {                   \
				/* skip non-first fragments: no UDP header there */               \
				__u16 frag = ((__u16)ip[6] << 8) | ip[7];                         \
				if ((frag & 0x1fff) == 0) {                                       \
					l4 = ip[9];                                               \
					off += (ip[0] & 0xf) * 4;                                 \
				}                                                                 \
			}                                                                         \
		} else if (proto == ETH_P_IPV6_) {                                                \
			__u8 ip6[40];                                                             \
			if (LOAD(ctx, off, ip6, 40) == 0 && (ip6[0] >> 4) == 6) {                 \
				l4 = ip6[6]; /* no extension-header walk: RoCEv2 uses none */     \
				off += 40;                                                        \
			}                                                                         \
		}                                                                                 \
		if (l4 == IPPROTO_UDP_) {                                                         \
			__u8 udp[4];                                                              \
			if (LOAD(ctx, off, udp, 4) == 0) {                                        \
				__u16 sport = ((__u16)udp[0] << 8) | udp[1];                      \
				__u16 dport = ((__u16)udp[2] << 8) | udp[3];                      \
				__ok = sport == ROCE_PORT || dport == ROCE_PORT;                  \
			}                                                                         \
		}                                                                                 \
		__ok;                                                                             \
	})

#define EMIT(LOAD, ctx, len, ifidx, direction)                                                    \
	do {                                                                                      \
		__u32 zero = 0;                                                                   \
		struct event *e = bpf_map_lookup_elem(&scratch, &zero);                           \
		if (!e)                                                                           \
			break;                                                                    \
		__u32 n = len;                                                                    \
		__u32 snap = SNAPLEN;                                                             \
		if (snap == 0 || snap > SNAP)                                                     \
			snap = SNAP;                                                              \
		if (n > snap)                                                                     \
			n = snap;                                                                 \
		e->ifindex = ifidx;                                                               \
		e->dir = direction;                                                               \
		e->pad[0] = e->pad[1] = e->pad[2] = 0;                                            \
		e->orig_len = len;                                                                \
		e->ktime_ns = bpf_ktime_get_ns();                                                 \
		if (n == 0)                                                                       \
			break;                                                                    \
		barrier_var(n);                                                                   \
		n = ((n - 1) & (SNAP - 1)) + 1;                                                   \
		if (LOAD(ctx, 0, e->data, n) != 0)                                                \
			break;                                                                    \
		e->cap_len = n;                                                                   \
		if (bpf_ringbuf_output(&events, e, offsetof(struct event, data) + n, 0) != 0)     \
			count(0);                                                                 \
	} while (0)

SEC("xdp")
int rdma_capture_xdp(struct xdp_md *ctx)
{
	__u32 len = bpf_xdp_get_buff_len(ctx);
	count(2);
	if (!PARSE(bpf_xdp_load_bytes, ctx, len))
		return XDP_PASS;
	count(1);
	EMIT(bpf_xdp_load_bytes, ctx, len, ctx->ingress_ifindex, 0);
	return XDP_PASS;
}

SEC("classifier")
int rdma_capture_tc(struct __sk_buff *skb)
{
	__u32 len = skb->len;
	count(2);
	if (!PARSE(bpf_skb_load_bytes, skb, len))
		return TC_ACT_OK_;
	count(1);
	EMIT(bpf_skb_load_bytes, skb, len, skb->ifindex, 1);
	return TC_ACT_OK_;
}

#define SOURCE_RXE_SEND 2
#define SOURCE_RXE_RECV 3

/* Copies the datagram of an rxe skb, from its IP header, into the ring buffer. Only the linear
 * part is readable with bpf_probe_read_kernel; rxe builds linear skbs, and a paged receive is
 * recorded as snapped (orig_len keeps the full length) rather than read past the head. */
static __always_inline void emit_skb(struct sk_buff *skb, __u8 source)
{
	struct net_device *dev = BPF_CORE_READ(skb, dev);
	__u32 ifindex = dev ? BPF_CORE_READ(dev, ifindex) : 0;
	if (IFINDEX != 0 && ifindex != IFINDEX)
		return;
	count(2);
	unsigned char *head = BPF_CORE_READ(skb, head);
	unsigned char *data = BPF_CORE_READ(skb, data);
	__u16 nh = BPF_CORE_READ(skb, network_header);
	__u32 len = BPF_CORE_READ(skb, len);
	__u32 data_len = BPF_CORE_READ(skb, data_len);
	unsigned char *ip = head + nh;
	/* At rxe_rcv, data points at the BTH, past the IP and UDP headers. */
	__u64 before = data > ip ? (__u64)(data - ip) : 0;
	if (before > 128)
		return;
	__u32 total = len + (__u32)before;
	__u32 linear = total - data_len;
	count(1);

	__u32 zero = 0;
	struct event *e = bpf_map_lookup_elem(&scratch, &zero);
	if (!e)
		return;
	__u32 n = linear;
	__u32 snap = SNAPLEN;
	if (snap == 0 || snap > SNAP)
		snap = SNAP;
	if (n > snap)
		n = snap;
	e->ifindex = ifindex;
	e->dir = source;
	e->pad[0] = e->pad[1] = e->pad[2] = 0;
	e->orig_len = total;
	e->ktime_ns = bpf_ktime_get_ns();
	if (n == 0)
		return;
	barrier_var(n);
	n = ((n - 1) & (SNAP - 1)) + 1;
	if (bpf_probe_read_kernel(e->data, n, ip) != 0)
		return;
	e->cap_len = n;
	if (bpf_ringbuf_output(&events, e, offsetof(struct event, data) + n, 0) != 0)
		count(0);
}

SEC("kprobe/rxe_rcv")
int BPF_KPROBE(rdma_capture_rxe_rcv, struct sk_buff *skb)
{
	emit_skb(skb, SOURCE_RXE_RECV);
	return 0;
}

SEC("kprobe/rxe_icrc_generate")
int BPF_KPROBE(rdma_capture_rxe_tx_entry, struct sk_buff *skb)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 ptr = (__u64)skb;
	bpf_map_update_elem(&tx_skb, &id, &ptr, BPF_ANY);
	return 0;
}

SEC("kretprobe/rxe_icrc_generate")
int BPF_KRETPROBE(rdma_capture_rxe_tx_return)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u64 *ptr = bpf_map_lookup_elem(&tx_skb, &id);
	if (!ptr)
		return 0;
	struct sk_buff *skb = (struct sk_buff *)*ptr;
	bpf_map_delete_elem(&tx_skb, &id);
	emit_skb(skb, SOURCE_RXE_SEND);
	return 0;
}
