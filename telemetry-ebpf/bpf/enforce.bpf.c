// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// rdma-monitor's kernel rate limit (--kernel-limit): a BPF LSM program on file_ioctl that refuses
// a cgroup's RDMA object creations beyond a rate, with EDQUOT, before the kernel does any work for
// them. Loaded and configured by rdma-monitor's src/enforce.rs, which owns the map layout.
//
// Why here: the interceptor (LD_PRELOAD) is skipped by a program that resolves libibverbs
// privately, and the rdma cgroup bounds how many objects a tenant holds, not how fast it creates
// and destroys them. Every verbs call of libibverbs on this kernel reaches the kernel as an
// RDMA_VERBS_IOCTL on the uverbs file (the legacy write() commands travel inside the ioctl
// method DEVICE/INVOKE_WRITE; measured with strace in the lab: no write() to the uverbs file),
// and file_ioctl is an LSM hook that can refuse. What it does not see: a program that writes the
// legacy commands to the uverbs file itself with write(), whose hook (file_permission) is not
// given the command.
//
// The hook is sleepable (lsm.s) because the command is in user memory: bpf_copy_from_user
// faults it in. The rate is a GCRA (the generic cell rate algorithm): `tat` is the theoretical
// arrival time of the next call; a call is allowed when that is no more than `burst_ns` ahead of
// now, and moves it on by `interval_ns`. Calls on several CPUs race for `tat` with a
// compare-and-swap; a call that loses four times in a row is allowed (an overshoot of a few
// calls under contention, never a refusal of a call within the rate).
//
// Map `limits`: key {u64 cgroup id (the cgroup v2 directory's inode), u32 verb id (V_*), u32 0},
// value struct limit below (user space writes interval_ns and burst_ns; tat, admitted and refused
// start at 0 and are the program's). The limit applies to processes directly in that cgroup.
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "abi.h"
#include "uverbs.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define EDQUOT 122
#define MAX_ATTRS 8
#define CAS_TRIES 4

struct limit_key {
	__u64 cgroup_id;
	__u32 verb;
	__u32 pad;
};

struct limit {
	__u64 interval_ns;
	__u64 burst_ns;
	__u64 tat;
	__u64 admitted;
	__u64 refused;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct limit_key);
	__type(value, struct limit);
} limits SEC(".maps");

/* The verb an ioctl creates, or -1 for any other (destroy, query, modify, the data path). */
static __always_inline int create_verb(const struct uverbs_ioctl_hdr *h, void *arg)
{
	switch (h->object_id) {
	case UVERBS_OBJECT_QP:
		return h->method_id == UVERBS_METHOD_QP_CREATE ? V_QP_CREATE : -1;
	case UVERBS_OBJECT_CQ:
		return h->method_id == UVERBS_METHOD_CQ_CREATE ? V_CQ_CREATE : -1;
	case UVERBS_OBJECT_MR:
		return h->method_id == UVERBS_METHOD_DM_MR_REG ||
				       h->method_id == UVERBS_METHOD_REG_DMABUF_MR ||
				       h->method_id == UVERBS_METHOD_REG_MR ?
			       V_MR_REG :
			       -1;
	case UVERBS_OBJECT_DEVICE:
		break;
	default:
		return -1;
	}
	if (h->method_id == UVERBS_METHOD_GET_CONTEXT)
		return V_CTX_OPEN;
	if (h->method_id != UVERBS_METHOD_INVOKE_WRITE)
		return -1;
	/* A legacy command: its number is the const attribute WRITE_CMD, among the first few. */
	for (int i = 0; i < MAX_ATTRS; i++) {
		struct uverbs_attr a;
		if (i >= h->num_attrs)
			break;
		if (bpf_copy_from_user(&a, sizeof(a),
				       arg + sizeof(struct uverbs_ioctl_hdr) + i * sizeof(a)) != 0)
			return -1;
		if (a.attr_id != UVERBS_ATTR_WRITE_CMD)
			continue;
		switch (a.data & IB_USER_VERBS_CMD_COMMAND_MASK) {
		case IB_USER_VERBS_CMD_GET_CONTEXT:
			return V_CTX_OPEN;
		case IB_USER_VERBS_CMD_ALLOC_PD:
			return V_PD_ALLOC;
		case IB_USER_VERBS_CMD_REG_MR:
			return V_MR_REG;
		case IB_USER_VERBS_CMD_CREATE_CQ:
			return V_CQ_CREATE;
		case IB_USER_VERBS_CMD_CREATE_QP:
			return V_QP_CREATE;
		}
		return -1;
	}
	return -1;
}

/* 0 to allow the call, -EDQUOT to refuse it. */
static __always_inline int admit(struct limit *l)
{
	__u64 now = bpf_ktime_get_ns();
	for (int i = 0; i < CAS_TRIES; i++) {
		__u64 tat = l->tat;
		__u64 from = tat > now ? tat : now;
		if (from - now > l->burst_ns) {
			__sync_fetch_and_add(&l->refused, 1);
			return -EDQUOT;
		}
		if (__sync_val_compare_and_swap(&l->tat, tat, from + l->interval_ns) == tat)
			break;
	}
	__sync_fetch_and_add(&l->admitted, 1);
	return 0;
}

SEC("lsm.s/file_ioctl")
int BPF_PROG(enforce_ioctl, struct file *file, unsigned int cmd, unsigned long arg, int ret)
{
	/* An earlier LSM's refusal stands. */
	if (ret != 0 || cmd != RDMA_VERBS_IOCTL)
		return ret;
	struct limit_key key = { .cgroup_id = bpf_get_current_cgroup_id() };
	struct uverbs_ioctl_hdr h;
	if (bpf_copy_from_user(&h, sizeof(h), (void *)arg) != 0)
		return 0; /* the kernel reports the bad pointer itself */
	int verb = create_verb(&h, (void *)arg);
	if (verb < 0)
		return 0;
	key.verb = verb;
	struct limit *l = bpf_map_lookup_elem(&limits, &key);
	if (!l || l->interval_ns == 0)
		return 0;
	return admit(l);
}
