// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
//
// rdma-monitor kernel side: counts RDMA control-path verbs made by user space (libibverbs ->
// ib_uverbs), their results and latencies, and the live PD/CQ/QP/MR objects they create, per
// cgroup. Loaded and attached by src/monitor/mod.rs (aya), which also owns the record layout.
//
// Hooks (driver-agnostic: ib_core / ib_uverbs, so rxe and mlx5 alike). User space reaches a
// verb either through write() (legacy commands; also ioctl INVOKE_WRITE, which calls the same
// handler) or through an ioctl method. ioctl methods that create an object allocate (and charge
// to the rdma cgroup) its uobject *before* their handler runs, so a create refused by rdma.max
// never reaches the handler: creates made by ioctl are therefore counted at the ioctl dispatch
// (ib_uverbs_ioctl, object/method read from the user header), creates made by write() in their
// write handler (which allocates the uobject itself):
//   QP_CREATE   write: ib_uverbs_create_qp | ib_uverbs_ex_create_qp;  ioctl QP/QP_CREATE
//   CQ_CREATE   write: ib_uverbs_create_cq | ib_uverbs_ex_create_cq;  ioctl CQ/CQ_CREATE
//   MR_REG      write: ib_uverbs_reg_mr;  ioctl MR/DM_MR_REG, MR/REG_DMABUF_MR, MR/REG_MR
//   PD_ALLOC    write: ib_uverbs_alloc_pd (there is no ioctl PD allocation)
//   GID_QUERY   ioctl DEVICE/QUERY_GID_ENTRY, DEVICE/QUERY_GID_TABLE (rdma-core's
//               ibv_query_gid*; its sysfs fallback for old kernels is not seen)
//   QP_MODIFY   ib_modify_qp_with_udata, udata != NULL (kernel ib_modify_qp does not call it)
//   QP_DESTROY  ib_destroy_qp_user,  udata != NULL (kernel ib_destroy_qp() passes NULL)
//   PD_DEALLOC  ib_dealloc_pd_user,  udata != NULL
//   CQ_DESTROY  ib_destroy_cq_user,  udata != NULL
//   MR_DEREG    ib_dereg_mr_user,    udata != NULL
//               (the destroy functions also see the cleanup of objects a process leaves behind
//               at exit, which is needed for the live counts; ib_create_qp_user is NOT used for
//               QP_CREATE because an ioctl create refused before its handler would be missed)
//   CM_SEND_REQ tracepoint rdma_cma:cm_send_req
// No listed function calls another listed function of the same verb (INVOKE_WRITE maps to no
// verb at the ioctl level), so each user call is counted exactly once, at the return probe
// (result + latency), matched to its entry by pid_tgid + slot in the `inflight` map.
//
// Live objects: rdma_restrack_add() runs once per created PD/CQ/QP/MR of any driver, after the
// driver succeeded; entries with res->user (created through uverbs) are recorded in `tracked`
// (object pointer -> creator cgroup, kind, MR bytes). A successful destroy verb (return value 0)
// looks the object up there and decrements the creator's counts, so the counts only cover objects
// created while the monitor ran, and an object destroyed from another cgroup is still charged
// to its creator. Destructions are taken from the destroy verbs rather than rdma_restrack_del,
// whose name and position (before/after the driver call) change between kernels.
//
// Event record (little endian, 120 bytes, parsed by monitor::parse_event):
//   u64 ktime_ns; u64 cgroup_id; u64 latency_ns; u32 pid (tgid); u32 tid; s32 result;
//   u8 verb; u8 pad[3]; char comm[16]; char device[64]
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Verb ids: secure-rdma/src/quota/verb.rs (Verb). Never renumber. */
#define V_QP_CREATE 0
#define V_QP_MODIFY 1
#define V_QP_DESTROY 2
#define V_PD_ALLOC 3
#define V_PD_DEALLOC 4
#define V_CQ_CREATE 5
#define V_CQ_DESTROY 6
#define V_MR_REG 7
#define V_MR_DEREG 8
#define V_GID_QUERY 9
#define V_CM_SEND_REQ 10
#define N_VERBS 16
/* `inflight` slot of an ib_uverbs_ioctl call (its verb is in the value) */
#define SLOT_IOCTL 0x100

/* Resource ids: secure-rdma/src/quota/verb.rs (Resource). Slot LIVE_MR_BYTES of `live` holds
 * the registered MR bytes. */
#define R_QP 0
#define R_PD 1
#define R_CQ 2
#define R_MR 3
#define LIVE_MR_BYTES 4
#define N_LIVE 5

/* `stats` slots */
#define S_LOST_EVENTS 0     /* ring buffer full: event dropped (counters still updated) */
#define S_UNTRACKED_DESTROY 1 /* destroyed an object created before the monitor started */
#define S_TRACKED_FULL 2    /* `tracked` map full: a new object was not counted */
#define S_STALE_TRACKED 3   /* an object address was reused without a destroy we saw */
#define S_INFLIGHT_FULL 4   /* `inflight` map full: a call was not counted */
#define N_STATS 8

#define IB_DEVICE_NAME_MAX 64
#define MAX_ERRNO 4095

/* enum rdma_restrack_type values, stable since the enum was introduced (SRQ appended in 5.x). */
#define RT_PD 0
#define RT_CQ 1
#define RT_QP 2
#define RT_MR 4

/* Minimal CO-RE views of ib_core / ib_uverbs structures. The build's vmlinux.h may come from a
 * kernel without InfiniBand, so they are declared here; field offsets are relocated against
 * the running kernel's BTF (vmlinux, or vmlinux + ib_uverbs module BTF merged by the loader). */
struct ib_device___mon {
	char name[IB_DEVICE_NAME_MAX];
} __attribute__((preserve_access_index));

enum rdma_restrack_type___mon { RT_PD___mon = 0 };

struct rdma_restrack_entry___mon {
	enum rdma_restrack_type___mon type;
	bool user;
} __attribute__((preserve_access_index));

struct ib_pd___mon {
	struct ib_device___mon *device;
	struct rdma_restrack_entry___mon res;
} __attribute__((preserve_access_index));

struct ib_cq___mon {
	struct ib_device___mon *device;
	struct rdma_restrack_entry___mon res;
} __attribute__((preserve_access_index));

struct ib_qp___mon {
	struct ib_device___mon *device;
	struct rdma_restrack_entry___mon res;
} __attribute__((preserve_access_index));

struct ib_mr___mon {
	struct ib_device___mon *device;
	__u64 length;
	struct rdma_restrack_entry___mon res;
} __attribute__((preserve_access_index));

/* ib_uverbs private structures (drivers/infiniband/core/uverbs.h): only in module BTF. */
struct ib_uverbs_device___mon {
	struct ib_device___mon *ib_dev;
} __attribute__((preserve_access_index));

struct ib_uverbs_file___mon {
	struct ib_uverbs_device___mon *device;
} __attribute__((preserve_access_index));

struct uverbs_attr_bundle___mon {
	struct ib_uverbs_file___mon *ufile;
} __attribute__((preserve_access_index));

/* include/uapi/rdma/rdma_user_ioctl_cmds.h, ib_user_ioctl_cmds.h (uapi: stable) */
#define RDMA_VERBS_IOCTL 0xc0181b01u /* _IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr) */
#define UVERBS_OBJECT_DEVICE 0
#define UVERBS_OBJECT_CQ 3
#define UVERBS_OBJECT_QP 4
#define UVERBS_OBJECT_MR 7
#define UVERBS_METHOD_QUERY_GID_TABLE 5
#define UVERBS_METHOD_QUERY_GID_ENTRY 6
#define UVERBS_METHOD_CQ_CREATE 0
#define UVERBS_METHOD_QP_CREATE 0
#define UVERBS_METHOD_DM_MR_REG 0
#define UVERBS_METHOD_REG_DMABUF_MR 4
#define UVERBS_METHOD_REG_MR 5

struct uverbs_ioctl_hdr_prefix {
	__u16 length;
	__u16 object_id;
	__u16 method_id;
	__u16 num_attrs;
};

struct event {
	__u64 ktime_ns;
	__u64 cgroup_id;
	__u64 latency_ns;
	__u32 pid;
	__u32 tid;
	__s32 result;
	__u8 verb;
	__u8 pad[3];
	char comm[16];
	char device[IB_DEVICE_NAME_MAX];
};

struct inflight_key {
	__u64 pid_tgid;
	__u32 verb;
	__u32 pad;
};

struct inflight {
	__u64 start_ns;
	__u64 dev; /* struct ib_device * or 0 */
	__u64 obj; /* destroy verbs: the object being destroyed */
	__u32 verb;
	__u32 pad;
};

struct tracked {
	__u64 cgroup_id;
	__u64 bytes;
	__u32 resource;
	__u32 pad;
};

struct cg_key {
	__u64 cgroup_id;
	__u32 id; /* verb id (cg_ops) or resource id (cg_live) */
	__u32 pad;
};

/* Userspace may resize with EbpfLoader::map_max_entries("events", bytes). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_LIVE);
	__type(key, __u32);
	__type(value, __s64);
} live SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_VERBS);
	__type(key, __u32);
	__type(value, __u64);
} totals SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_VERBS);
	__type(key, __u32);
	__type(value, __u64);
} errors SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, N_STATS);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cg_key);
	__type(value, __u64);
} cg_ops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct cg_key);
	__type(value, __s64);
} cg_live SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct tracked);
} tracked SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, struct inflight_key);
	__type(value, struct inflight);
} inflight SEC(".maps");

/* Set by userspace (aya override_global): 0 = counters only, no ring-buffer events. */
volatile const __u8 EMIT_EVENTS = 1;

static __always_inline void pcpu_add(void *map, __u32 idx, __s64 delta)
{
	__s64 *v = bpf_map_lookup_elem(map, &idx);
	if (v)
		*v += delta;
}

static __always_inline void hash_add(void *map, struct cg_key *key, __s64 delta)
{
	__s64 *v = bpf_map_lookup_elem(map, key);
	if (!v) {
		__s64 zero = 0;
		bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
		v = bpf_map_lookup_elem(map, key);
		if (!v)
			return;
	}
	__sync_fetch_and_add(v, delta);
}

/* The ib_device of a uverbs handler's attribute bundle (attrs->ufile->device->ib_dev), or 0
 * when the running kernel's BTF does not describe these ib_uverbs structures. */
static __always_inline __u64 attrs_device(struct uverbs_attr_bundle___mon *attrs)
{
	if (!bpf_core_field_exists(attrs->ufile) ||
	    !bpf_core_field_exists(((struct ib_uverbs_file___mon *)0)->device) ||
	    !bpf_core_field_exists(((struct ib_uverbs_device___mon *)0)->ib_dev))
		return 0;
	return (__u64)BPF_CORE_READ(attrs, ufile, device, ib_dev);
}

/* The ib_device behind an open uverbs file (filp->private_data->device->ib_dev), or 0. */
static __always_inline __u64 file_device(struct file *filp)
{
	if (!bpf_core_field_exists(((struct ib_uverbs_file___mon *)0)->device) ||
	    !bpf_core_field_exists(((struct ib_uverbs_device___mon *)0)->ib_dev))
		return 0;
	struct ib_uverbs_file___mon *uf = BPF_CORE_READ(filp, private_data);
	return (__u64)BPF_CORE_READ(uf, device, ib_dev);
}

/* Records a call's entry in `slot` (the verb id, or SLOT_IOCTL). */
static __always_inline void enter_slot(__u32 slot, __u32 verb, __u64 dev, __u64 obj)
{
	struct inflight_key key = { .pid_tgid = bpf_get_current_pid_tgid(), .verb = slot };
	struct inflight val = {
		.start_ns = bpf_ktime_get_ns(), .dev = dev, .obj = obj, .verb = verb
	};
	if (bpf_map_update_elem(&inflight, &key, &val, BPF_ANY) != 0)
		pcpu_add(&stats, S_INFLIGHT_FULL, 1);
}

static __always_inline void enter(__u32 verb, __u64 dev, __u64 obj)
{
	enter_slot(verb, verb, dev, obj);
}

static __always_inline void emit(__u32 verb, __s32 result, __u64 now, __u64 latency, __u64 cg,
				 __u64 pid_tgid, __u64 dev)
{
	if (!EMIT_EVENTS)
		return;
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		pcpu_add(&stats, S_LOST_EVENTS, 1);
		return;
	}
	e->ktime_ns = now;
	e->cgroup_id = cg;
	e->latency_ns = latency;
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->result = result;
	e->verb = verb;
	e->pad[0] = e->pad[1] = e->pad[2] = 0;
	bpf_get_current_comm(e->comm, sizeof(e->comm));
	e->device[0] = 0;
	if (dev) {
		struct ib_device___mon *d = (void *)dev;
		if (BPF_CORE_READ_STR_INTO(&e->device, d, name) < 0)
			e->device[0] = 0;
	}
	bpf_ringbuf_submit(e, 0);
}

/* Forget a tracked object and take it off its creator's live counts. */
static __always_inline void untrack(__u64 obj, __u32 stat_if_missing)
{
	struct tracked *t = bpf_map_lookup_elem(&tracked, &obj);
	if (!t) {
		if (stat_if_missing < N_STATS)
			pcpu_add(&stats, stat_if_missing, 1);
		return;
	}
	__u32 r = t->resource;
	__u64 cg = t->cgroup_id;
	__s64 bytes = t->bytes;
	bpf_map_delete_elem(&tracked, &obj);
	if (r > R_MR)
		return;
	pcpu_add(&live, r, -1);
	if (r == R_MR)
		pcpu_add(&live, LIVE_MR_BYTES, -bytes);
	struct cg_key k = { .cgroup_id = cg, .id = r };
	hash_add(&cg_live, &k, -1);
}

static __always_inline void leave_slot(__u32 slot, __s32 result)
{
	struct inflight_key key = { .pid_tgid = bpf_get_current_pid_tgid(), .verb = slot };
	struct inflight *in = bpf_map_lookup_elem(&inflight, &key);
	if (!in)
		return; /* entry not seen (filtered, or probe attached mid-call) */
	__u64 now = bpf_ktime_get_ns();
	__u64 start = in->start_ns, dev = in->dev, obj = in->obj;
	__u32 verb = in->verb;
	bpf_map_delete_elem(&inflight, &key);
	if (verb >= N_VERBS)
		return;

	__u64 cg = bpf_get_current_cgroup_id();
	pcpu_add(&totals, verb, 1);
	if (result < 0)
		pcpu_add(&errors, verb, 1);
	struct cg_key k = { .cgroup_id = cg, .id = verb };
	hash_add(&cg_ops, &k, 1);
	if (result == 0 && obj)
		untrack(obj, S_UNTRACKED_DESTROY);
	emit(verb, result, now, now - start, cg, key.pid_tgid, dev);
}

static __always_inline void leave(__u32 verb, __s32 result)
{
	leave_slot(verb, result);
}

/* ---- QP ---------------------------------------------------------------------------------- */

/* write handlers ib_uverbs_create_qp / ib_uverbs_ex_create_qp (struct uverbs_attr_bundle *) */
SEC("kprobe")
int BPF_KPROBE(mon_qp_create_enter, struct uverbs_attr_bundle___mon *attrs)
{
	enter(V_QP_CREATE, attrs_device(attrs), 0);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_qp_create_exit, int ret)
{
	leave(V_QP_CREATE, ret);
	return 0;
}

/* int ib_modify_qp_with_udata(struct ib_qp *qp, struct ib_qp_attr *attr, int mask,
 *	struct ib_udata *udata) */
SEC("kprobe")
int BPF_KPROBE(mon_qp_modify_enter, struct ib_qp___mon *qp, void *attr, int mask, void *udata)
{
	if (!udata)
		return 0;
	enter(V_QP_MODIFY, (__u64)BPF_CORE_READ(qp, device), 0);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_qp_modify_exit, int ret)
{
	leave(V_QP_MODIFY, ret);
	return 0;
}

/* int ib_destroy_qp_user(struct ib_qp *qp, struct ib_udata *udata) */
SEC("kprobe")
int BPF_KPROBE(mon_qp_destroy_enter, struct ib_qp___mon *qp, void *udata)
{
	if (!udata)
		return 0;
	enter(V_QP_DESTROY, (__u64)BPF_CORE_READ(qp, device), (__u64)qp);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_qp_destroy_exit, int ret)
{
	leave(V_QP_DESTROY, ret);
	return 0;
}

/* ---- PD ---------------------------------------------------------------------------------- */

/* static int ib_uverbs_alloc_pd(struct uverbs_attr_bundle *attrs) */
SEC("kprobe")
int BPF_KPROBE(mon_pd_alloc_enter, struct uverbs_attr_bundle___mon *attrs)
{
	enter(V_PD_ALLOC, attrs_device(attrs), 0);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_pd_alloc_exit, int ret)
{
	leave(V_PD_ALLOC, ret);
	return 0;
}

/* int ib_dealloc_pd_user(struct ib_pd *pd, struct ib_udata *udata) */
SEC("kprobe")
int BPF_KPROBE(mon_pd_dealloc_enter, struct ib_pd___mon *pd, void *udata)
{
	if (!udata)
		return 0;
	enter(V_PD_DEALLOC, (__u64)BPF_CORE_READ(pd, device), (__u64)pd);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_pd_dealloc_exit, int ret)
{
	leave(V_PD_DEALLOC, ret);
	return 0;
}

/* ---- CQ ---------------------------------------------------------------------------------- */

/* write handlers ib_uverbs_create_cq / ib_uverbs_ex_create_cq (struct uverbs_attr_bundle *) */
SEC("kprobe")
int BPF_KPROBE(mon_cq_create_enter, struct uverbs_attr_bundle___mon *attrs)
{
	enter(V_CQ_CREATE, attrs_device(attrs), 0);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_cq_create_exit, int ret)
{
	leave(V_CQ_CREATE, ret);
	return 0;
}

/* int ib_destroy_cq_user(struct ib_cq *cq, struct ib_udata *udata) */
SEC("kprobe")
int BPF_KPROBE(mon_cq_destroy_enter, struct ib_cq___mon *cq, void *udata)
{
	if (!udata)
		return 0;
	enter(V_CQ_DESTROY, (__u64)BPF_CORE_READ(cq, device), (__u64)cq);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_cq_destroy_exit, int ret)
{
	leave(V_CQ_DESTROY, ret);
	return 0;
}

/* ---- MR ---------------------------------------------------------------------------------- */

/* write handler ib_uverbs_reg_mr (struct uverbs_attr_bundle *) */
SEC("kprobe")
int BPF_KPROBE(mon_mr_reg_enter, struct uverbs_attr_bundle___mon *attrs)
{
	enter(V_MR_REG, attrs_device(attrs), 0);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_mr_reg_exit, int ret)
{
	leave(V_MR_REG, ret);
	return 0;
}

/* int ib_dereg_mr_user(struct ib_mr *mr, struct ib_udata *udata) */
SEC("kprobe")
int BPF_KPROBE(mon_mr_dereg_enter, struct ib_mr___mon *mr, void *udata)
{
	if (!udata)
		return 0;
	enter(V_MR_DEREG, (__u64)BPF_CORE_READ(mr, device), (__u64)mr);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_mr_dereg_exit, int ret)
{
	leave(V_MR_DEREG, ret);
	return 0;
}

/* ---- ioctl dispatch: QP_CREATE, CQ_CREATE, MR_REG, GID_QUERY ---------------------------- */

static __always_inline int ioctl_verb(__u16 object, __u16 method)
{
	switch (object) {
	case UVERBS_OBJECT_QP:
		return method == UVERBS_METHOD_QP_CREATE ? V_QP_CREATE : -1;
	case UVERBS_OBJECT_CQ:
		return method == UVERBS_METHOD_CQ_CREATE ? V_CQ_CREATE : -1;
	case UVERBS_OBJECT_MR:
		return method == UVERBS_METHOD_DM_MR_REG || method == UVERBS_METHOD_REG_DMABUF_MR ||
				       method == UVERBS_METHOD_REG_MR ?
			       V_MR_REG :
			       -1;
	case UVERBS_OBJECT_DEVICE:
		return method == UVERBS_METHOD_QUERY_GID_ENTRY ||
				       method == UVERBS_METHOD_QUERY_GID_TABLE ?
			       V_GID_QUERY :
			       -1;
	}
	return -1;
}

/* static long ib_uverbs_ioctl(struct file *filp, unsigned int cmd, unsigned long arg) */
SEC("kprobe")
int BPF_KPROBE(mon_ioctl_enter, struct file *filp, unsigned int cmd, unsigned long arg)
{
	if (cmd != RDMA_VERBS_IOCTL)
		return 0;
	struct uverbs_ioctl_hdr_prefix h;
	if (bpf_probe_read_user(&h, sizeof(h), (void *)arg) != 0)
		return 0;
	int verb = ioctl_verb(h.object_id, h.method_id);
	if (verb < 0)
		return 0;
	enter_slot(SLOT_IOCTL, verb, file_device(filp), 0);
	return 0;
}

SEC("kretprobe")
int BPF_KRETPROBE(mon_ioctl_exit, long ret)
{
	leave_slot(SLOT_IOCTL, (__s32)ret);
	return 0;
}

/* ---- RDMA CM ----------------------------------------------------------------------------- */

/* rdma_cma:cm_send_req fires once per rdma_connect() on IB/RoCE (cma_connect_ib). It carries
 * no device and no result: both are reported empty / 0, latency 0. */
SEC("tracepoint/rdma_cma/cm_send_req")
int mon_cm_send_req(void *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u64 cg = bpf_get_current_cgroup_id();
	pcpu_add(&totals, V_CM_SEND_REQ, 1);
	struct cg_key k = { .cgroup_id = cg, .id = V_CM_SEND_REQ };
	hash_add(&cg_ops, &k, 1);
	emit(V_CM_SEND_REQ, 0, bpf_ktime_get_ns(), 0, cg, pid_tgid, 0);
	return 0;
}

/* ---- live objects ------------------------------------------------------------------------ */

/* void rdma_restrack_add(struct rdma_restrack_entry *res): every PD/CQ/QP/MR of every driver,
 * after the driver created it. Only user objects (res->user) are counted. */
SEC("kprobe")
int BPF_KPROBE(mon_restrack_add, struct rdma_restrack_entry___mon *res)
{
	if (!BPF_CORE_READ(res, user))
		return 0;
	int type = BPF_CORE_READ(res, type);
	__u64 obj, dev;
	__u32 r, verb;
	__u64 bytes = 0;
	if (type == RT_QP) {
		struct ib_qp___mon *o = (void *)res - bpf_core_field_offset(struct ib_qp___mon, res);
		obj = (__u64)o;
		dev = (__u64)BPF_CORE_READ(o, device);
		r = R_QP;
		verb = V_QP_CREATE;
	} else if (type == RT_PD) {
		struct ib_pd___mon *o = (void *)res - bpf_core_field_offset(struct ib_pd___mon, res);
		obj = (__u64)o;
		dev = (__u64)BPF_CORE_READ(o, device);
		r = R_PD;
		verb = V_PD_ALLOC;
	} else if (type == RT_CQ) {
		struct ib_cq___mon *o = (void *)res - bpf_core_field_offset(struct ib_cq___mon, res);
		obj = (__u64)o;
		dev = (__u64)BPF_CORE_READ(o, device);
		r = R_CQ;
		verb = V_CQ_CREATE;
	} else if (type == RT_MR) {
		struct ib_mr___mon *o = (void *)res - bpf_core_field_offset(struct ib_mr___mon, res);
		obj = (__u64)o;
		dev = (__u64)BPF_CORE_READ(o, device);
		bytes = BPF_CORE_READ(o, length);
		r = R_MR;
		verb = V_MR_REG;
	} else {
		return 0;
	}

	/* An address we still track was freed without a destroy we saw: drop the stale entry. */
	if (bpf_map_lookup_elem(&tracked, &obj)) {
		pcpu_add(&stats, S_STALE_TRACKED, 1);
		untrack(obj, N_STATS);
	}

	__u64 cg = bpf_get_current_cgroup_id();
	struct tracked t = { .cgroup_id = cg, .bytes = bytes, .resource = r };
	if (bpf_map_update_elem(&tracked, &obj, &t, BPF_NOEXIST) != 0) {
		pcpu_add(&stats, S_TRACKED_FULL, 1);
		return 0;
	}
	pcpu_add(&live, r, 1);
	if (r == R_MR)
		pcpu_add(&live, LIVE_MR_BYTES, bytes);
	struct cg_key k = { .cgroup_id = cg, .id = r };
	hash_add(&cg_live, &k, 1);

	/* Fill in the device of the create call in flight when its entry probe had none. */
	struct inflight_key key = { .pid_tgid = bpf_get_current_pid_tgid(), .verb = verb };
	struct inflight *in = bpf_map_lookup_elem(&inflight, &key);
	if (!in) {
		key.verb = SLOT_IOCTL;
		in = bpf_map_lookup_elem(&inflight, &key);
	}
	if (in && in->verb == verb && !in->dev)
		in->dev = dev;
	return 0;
}
