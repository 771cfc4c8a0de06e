/* SPDX-License-Identifier: GPL-2.0 OR Apache-2.0 */
/* The uverbs ioctl ABI the programs read from user memory: include/uapi/rdma/
 * rdma_user_ioctl_cmds.h, ib_user_ioctl_cmds.h and ib_user_verbs.h (uapi, so stable). Written
 * here once for monitor.bpf.c (which counts) and enforce.bpf.c (which refuses). */
#pragma once

#define RDMA_VERBS_IOCTL 0xc0181b01u /* _IOWR(0x1b, 1, struct ib_uverbs_ioctl_hdr) */
#define UVERBS_OBJECT_DEVICE 0
#define UVERBS_OBJECT_CQ 3
#define UVERBS_OBJECT_QP 4
#define UVERBS_OBJECT_MR 7
/* enum uverbs_methods_device */
#define UVERBS_METHOD_INVOKE_WRITE 0
#define UVERBS_METHOD_GET_CONTEXT 3
#define UVERBS_METHOD_QUERY_GID_TABLE 5
#define UVERBS_METHOD_QUERY_GID_ENTRY 6
#define UVERBS_METHOD_CQ_CREATE 0
#define UVERBS_METHOD_QP_CREATE 0
#define UVERBS_METHOD_DM_MR_REG 0
#define UVERBS_METHOD_REG_DMABUF_MR 4
#define UVERBS_METHOD_REG_MR 5
/* DEVICE/INVOKE_WRITE's attribute holding the legacy command (a const: the value is inline) */
#define UVERBS_ATTR_WRITE_CMD 2
/* enum ib_uverbs_write_cmds (the extended CREATE_CQ/CREATE_QP share these numbers) */
#define IB_USER_VERBS_CMD_GET_CONTEXT 0
#define IB_USER_VERBS_CMD_ALLOC_PD 3
#define IB_USER_VERBS_CMD_REG_MR 9
#define IB_USER_VERBS_CMD_CREATE_CQ 18
#define IB_USER_VERBS_CMD_CREATE_QP 24
#define IB_USER_VERBS_CMD_COMMAND_MASK 0xff

struct uverbs_ioctl_hdr_prefix {
	__u16 length;
	__u16 object_id;
	__u16 method_id;
	__u16 num_attrs;
};

/* struct ib_uverbs_ioctl_hdr (24 bytes), followed by num_attrs struct ib_uverbs_attr */
struct uverbs_ioctl_hdr {
	__u16 length;
	__u16 object_id;
	__u16 method_id;
	__u16 num_attrs;
	__u64 reserved1;
	__u32 driver_id;
	__u32 reserved2;
};

/* struct ib_uverbs_attr (16 bytes) */
struct uverbs_attr {
	__u16 attr_id;
	__u16 len;
	__u16 flags;
	__u16 attr_data;
	__u64 data;
};
