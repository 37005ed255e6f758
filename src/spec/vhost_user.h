/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user wire format (qemu docs/interop/vhost-user.rst, "Message
 * Specification"): the 12-byte header, every payload layout we parse or
 * build, request ids, protocol feature bits. All numbers are in the machine's
 * native byte order (spec: "All numbers are in the machine native byte order").
 * Bottom layer (src/spec/): both ends use it, the device side (src/transport/)
 * and our front-end (src/driver/vu_frontend.c); no code, no includes of ours.
 */
#ifndef VHD_SPEC_VHOST_USER_H
#define VHD_SPEC_VHOST_USER_H

#include <stdint.h>

/* ---- header (spec "Header") ---- */

#define VHOST_USER_VERSION         0x1u
#define VHOST_USER_VERSION_MASK    0x3u      /* lower 2 bits: the version */
#define VHOST_USER_REPLY_MASK      (1u << 2) /* set on every reply from the back-end */
#define VHOST_USER_NEED_REPLY_MASK (1u << 3) /* REPLY_ACK: the sender wants an ack */

struct vu_hdr {
    uint32_t request; /* enum vu_request (or enum vu_backend_request on the back-end channel) */
    uint32_t flags;   /* version | REPLY | NEED_REPLY */
    uint32_t size;    /* payload bytes following the header */
};
_Static_assert(sizeof(struct vu_hdr) == 12, "vhost-user header is 12 bytes");

/* ---- virtio feature bits that belong to vhost(-user) ---- */

/* Spec "Communication": the reused UNUSED (30) virtio bit. */
#define VHOST_USER_F_PROTOCOL_FEATURES 30
/* Spec "Migration": dirty logging (not offered until the log is built). */
#define VHOST_F_LOG_ALL 26

/* ---- protocol features (spec "Protocol features") ---- */

#define VHOST_USER_PROTOCOL_F_MQ                   0
#define VHOST_USER_PROTOCOL_F_LOG_SHMFD            1
#define VHOST_USER_PROTOCOL_F_RARP                 2
#define VHOST_USER_PROTOCOL_F_REPLY_ACK            3
#define VHOST_USER_PROTOCOL_F_MTU                  4
#define VHOST_USER_PROTOCOL_F_BACKEND_REQ          5
#define VHOST_USER_PROTOCOL_F_CROSS_ENDIAN         6
#define VHOST_USER_PROTOCOL_F_CRYPTO_SESSION       7
#define VHOST_USER_PROTOCOL_F_PAGEFAULT            8
#define VHOST_USER_PROTOCOL_F_CONFIG               9
#define VHOST_USER_PROTOCOL_F_BACKEND_SEND_FD      10
#define VHOST_USER_PROTOCOL_F_HOST_NOTIFIER        11
#define VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD       12
#define VHOST_USER_PROTOCOL_F_RESET_DEVICE         13
#define VHOST_USER_PROTOCOL_F_INBAND_NOTIFICATIONS 14
#define VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS  15
#define VHOST_USER_PROTOCOL_F_STATUS               16
#define VHOST_USER_PROTOCOL_F_XEN_MMAP             17
#define VHOST_USER_PROTOCOL_F_SHARED_OBJECT        18
#define VHOST_USER_PROTOCOL_F_DEVICE_STATE         19

/* ---- front-end requests (spec "Front-end message types") ---- */

enum vu_request {
    VHOST_USER_NONE = 0,
    VHOST_USER_GET_FEATURES = 1,
    VHOST_USER_SET_FEATURES = 2,
    VHOST_USER_SET_OWNER = 3,
    VHOST_USER_RESET_OWNER = 4,
    VHOST_USER_SET_MEM_TABLE = 5,
    VHOST_USER_SET_LOG_BASE = 6,
    VHOST_USER_SET_LOG_FD = 7,
    VHOST_USER_SET_VRING_NUM = 8,
    VHOST_USER_SET_VRING_ADDR = 9,
    VHOST_USER_SET_VRING_BASE = 10,
    VHOST_USER_GET_VRING_BASE = 11,
    VHOST_USER_SET_VRING_KICK = 12,
    VHOST_USER_SET_VRING_CALL = 13,
    VHOST_USER_SET_VRING_ERR = 14,
    VHOST_USER_GET_PROTOCOL_FEATURES = 15,
    VHOST_USER_SET_PROTOCOL_FEATURES = 16,
    VHOST_USER_GET_QUEUE_NUM = 17,
    VHOST_USER_SET_VRING_ENABLE = 18,
    VHOST_USER_SEND_RARP = 19,
    VHOST_USER_NET_SET_MTU = 20,
    VHOST_USER_SET_BACKEND_REQ_FD = 21, /* formerly SET_SLAVE_REQ_FD */
    VHOST_USER_IOTLB_MSG = 22,
    VHOST_USER_SET_VRING_ENDIAN = 23,
    VHOST_USER_GET_CONFIG = 24,
    VHOST_USER_SET_CONFIG = 25,
    VHOST_USER_CREATE_CRYPTO_SESSION = 26,
    VHOST_USER_CLOSE_CRYPTO_SESSION = 27,
    VHOST_USER_POSTCOPY_ADVISE = 28,
    VHOST_USER_POSTCOPY_LISTEN = 29,
    VHOST_USER_POSTCOPY_END = 30,
    VHOST_USER_GET_INFLIGHT_FD = 31,
    VHOST_USER_SET_INFLIGHT_FD = 32,
    VHOST_USER_GPU_SET_SOCKET = 33,
    VHOST_USER_RESET_DEVICE = 34,
    VHOST_USER_VRING_KICK = 35,
    VHOST_USER_GET_MAX_MEM_SLOTS = 36,
    VHOST_USER_ADD_MEM_REG = 37,
    VHOST_USER_REM_MEM_REG = 38,
    VHOST_USER_SET_STATUS = 39,
    VHOST_USER_GET_STATUS = 40,
    VHOST_USER_GET_SHARED_OBJECT = 41,
    VHOST_USER_SET_DEVICE_STATE_FD = 42,
    VHOST_USER_CHECK_DEVICE_STATE = 43,
    VHOST_USER_REQUEST_MAX /* one past the last id we know */
};

/* ---- back-end requests, on the SET_BACKEND_REQ_FD channel ("Back-end message types") ---- */

enum vu_backend_request {
    VHOST_USER_BACKEND_NONE = 0,
    VHOST_USER_BACKEND_IOTLB_MSG = 1,
    VHOST_USER_BACKEND_CONFIG_CHANGE_MSG = 2,
    VHOST_USER_BACKEND_VRING_HOST_NOTIFIER_MSG = 3,
    VHOST_USER_BACKEND_VRING_CALL = 4,
    VHOST_USER_BACKEND_VRING_ERR = 5,
    VHOST_USER_BACKEND_SHARED_OBJECT_ADD = 6,
    VHOST_USER_BACKEND_SHARED_OBJECT_REMOVE = 7,
    VHOST_USER_BACKEND_SHARED_OBJECT_LOOKUP = 8,
};

/* ---- limits ---- */

/*
 * At most 8 fds per message: the spec's memory table has region0..region7
 * with one fd each, and "at most 8 descriptors in each message" on the
 * back-end channel. QEMU's VHOST_MEMORY_BASELINE_NREGIONS is the same 8.
 */
#define VHOST_USER_MAX_FDS               8
#define VHOST_USER_MEM_TABLE_MAX_REGIONS 8

/* Largest config space access (QEMU's VHOST_USER_MAX_CONFIG_SIZE). */
#define VHOST_USER_MAX_CONFIG_SIZE 256

/* SET_VRING_KICK/CALL/ERR u64: bits 0-7 the ring index, bit 8 "no fd" (poll). */
#define VHOST_USER_VRING_IDX_MASK  0xffu
#define VHOST_USER_VRING_NOFD_MASK (1u << 8)

/* vring address flags (vhost_vring_addr.flags): log used-ring writes. */
#define VHOST_VRING_F_LOG 0

/* SET_CONFIG flags. */
#define VHOST_USER_CONFIG_FLAG_FRONTEND  0u /* a writable field, written by the driver */
#define VHOST_USER_CONFIG_FLAG_MIGRATION 1u /* live migration: read-only fields too */

/* ---- payloads (spec "Payload") ---- */

/* "A vring state description" (also the split/packed descriptor index forms). */
struct vu_vring_state {
    uint32_t index;
    uint32_t num;
};
_Static_assert(sizeof(struct vu_vring_state) == 8, "vring state is 8 bytes");

/*
 * "A vring address description" (struct vhost_vring_addr). The spec's table
 * shows a "size" column but no such field exists on the wire: index, flags,
 * then four u64 (descriptor, used, available, log) = 40 bytes.
 */
struct vu_vring_addr {
    uint32_t index;
    uint32_t flags; /* 1 << VHOST_VRING_F_LOG */
    uint64_t desc;  /* front-end VA (IOVA with IOMMU_PLATFORM) */
    uint64_t used;
    uint64_t avail;
    uint64_t log; /* guest-physical address for logging */
};
_Static_assert(sizeof(struct vu_vring_addr) == 40, "vring address is 40 bytes");

/* "Memory region description". */
struct vu_mem_region {
    uint64_t gpa;
    uint64_t size;
    uint64_t uva;
    uint64_t mmap_offset;
};
_Static_assert(sizeof(struct vu_mem_region) == 32, "memory region is 32 bytes");

/*
 * "Multiple Memory regions description" (SET_MEM_TABLE). The wire size is
 * 8 + nregions * 32: front-ends send only the regions in use.
 */
struct vu_mem_table {
    uint32_t nregions;
    uint32_t padding;
    struct vu_mem_region regions[VHOST_USER_MEM_TABLE_MAX_REGIONS];
};
_Static_assert(sizeof(struct vu_mem_table) == 8 + 8 * 32, "memory table is 264 bytes");
#define VU_MEM_TABLE_HDR_SIZE 8u

/* "Single memory region description" (ADD_MEM_REG / REM_MEM_REG). */
struct vu_mem_single {
    uint64_t padding;
    struct vu_mem_region region;
};
_Static_assert(sizeof(struct vu_mem_single) == 40, "single memory region is 40 bytes");

/* "Log description" (SET_LOG_BASE, later). */
struct vu_log {
    uint64_t size;
    uint64_t offset;
};
_Static_assert(sizeof(struct vu_log) == 16, "log description is 16 bytes");

/* "An IOTLB message" (struct vhost_iotlb_msg, padded to 8 bytes; later). */
struct vu_iotlb {
    uint64_t iova;
    uint64_t size;
    uint64_t uva;
    uint8_t perm;
    uint8_t type;
    uint8_t padding[6];
};
_Static_assert(sizeof(struct vu_iotlb) == 32, "iotlb message is 32 bytes");
/* vu_iotlb.type and .perm (Linux vhost_types.h: struct vhost_iotlb_msg). */
#define VHOST_IOTLB_MISS        1
#define VHOST_IOTLB_UPDATE      2
#define VHOST_IOTLB_INVALIDATE  3
#define VHOST_IOTLB_ACCESS_FAIL 4
#define VHOST_ACCESS_RO         1
#define VHOST_ACCESS_WO         2
#define VHOST_ACCESS_RW         3

/* "Virtio device config space" (GET_CONFIG / SET_CONFIG): 12 + size bytes on the wire. */
struct vu_config {
    uint32_t offset;
    uint32_t size;
    uint32_t flags; /* VHOST_USER_CONFIG_FLAG_* */
    uint8_t region[VHOST_USER_MAX_CONFIG_SIZE];
};
_Static_assert(sizeof(struct vu_config) == 12 + 256, "config payload is 268 bytes");
#define VU_CONFIG_HDR_SIZE 12u

/* "Vring area description" (back-end HOST_NOTIFIER, later). */
struct vu_vring_area {
    uint64_t u64; /* ring index and flags */
    uint64_t size;
    uint64_t offset;
};
_Static_assert(sizeof(struct vu_vring_area) == 24, "vring area is 24 bytes");

/* "Inflight description" (GET/SET_INFLIGHT_FD, later); QEMU pads it to 24. */
struct vu_inflight {
    uint64_t mmap_size;
    uint64_t mmap_offset;
    uint16_t num_queues;
    uint16_t queue_size;
    uint32_t padding;
};
_Static_assert(sizeof(struct vu_inflight) == 24, "inflight description is 24 bytes");

/* "Device state transfer parameters" (SET_DEVICE_STATE_FD, later). */
struct vu_device_state {
    uint32_t direction;
    uint32_t phase;
};
_Static_assert(sizeof(struct vu_device_state) == 8, "device state parameters are 8 bytes");

/* Every payload we know; its size is the largest payload we accept. */
union vu_payload {
    uint64_t u64;
    struct vu_vring_state state;
    struct vu_vring_addr addr;
    struct vu_mem_table mem;
    struct vu_mem_single mreg;
    struct vu_log log;
    struct vu_iotlb iotlb;
    struct vu_config config;
    struct vu_vring_area area;
    struct vu_inflight inflight;
    struct vu_device_state dstate;
    uint8_t raw[sizeof(struct vu_config)];
};
_Static_assert(sizeof(union vu_payload) == 272, "largest payload (config), 8-aligned");

/*
 * A larger size field is a protocol error (the connection is closed): no
 * message of the spec carries more than the config payload (268 bytes).
 */
#define VU_MAX_PAYLOAD ((uint32_t)sizeof(struct vu_config))

#endif /* VHD_SPEC_VHOST_USER_H */
