/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The shared inflight area of vhost-user "Inflight I/O tracking"
 * (VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD; qemu docs/interop/vhost-user.rst):
 * its wire layout for split and packed rings and the per-queue region size.
 * The back-end records every chain it pops there and clears the record when
 * the chain is used, so a back-end restarted after a crash finds the chains
 * it must submit again. The area is handed out by GET_INFLIGHT_FD, kept by the
 * front-end across back-end restarts and given back by SET_INFLIGHT_FD.
 *
 * Only back-ends read the area, so fields are in host byte order. Its content
 * is untrusted (the front-end can write it at any time): every index read from
 * it is bounds-checked and clamped before use, here and in the engine.
 */
#ifndef VHD_INFLIGHT_H
#define VHD_INFLIGHT_H

#include <stdbool.h>
#include <stdint.h>

/* The only layout version defined by the spec; 0 means "never initialised". */
#define VHD_INFLIGHT_VERSION 1
/* Per-queue regions are padded to this many bytes (as QEMU and DPDK do). */
#define VHD_INFLIGHT_ALIGN 64

/* ---- split rings: one record per descriptor-table index (head) ---- */

struct vhd_inflight_split_desc {
    uint8_t inflight; /* 1: the chain starting at this head is in flight */
    uint8_t padding[5];
    uint16_t next;    /* list of the last batch of used heads */
    uint64_t counter; /* pop order */
};
_Static_assert(sizeof(struct vhd_inflight_split_desc) == 16, "DescStateSplit is 16 bytes");

struct vhd_inflight_split {
    uint64_t features;        /* 0 */
    uint16_t version;         /* VHD_INFLIGHT_VERSION; 0: uninitialised */
    uint16_t desc_num;        /* records that follow: the queue_size of the area */
    uint16_t last_batch_head; /* head of the list of the last used batch */
    uint16_t used_idx;        /* used->idx as of the last completed batch */
    struct vhd_inflight_split_desc desc[];
};
_Static_assert(sizeof(struct vhd_inflight_split) == 16, "QueueRegionSplit header is 16 bytes");

/* ---- packed rings: a free list of records, one per descriptor of a chain ---- */

struct vhd_inflight_packed_desc {
    uint8_t inflight; /* head record: the chain is in flight */
    uint8_t padding;
    uint16_t next;    /* next record (free list, or the chain's records) */
    uint16_t last;    /* head record: the chain's last record */
    uint16_t num;     /* head record: descriptors (ring slots) of the chain */
    uint64_t counter; /* head record: pop order */
    uint16_t id;      /* copy of the descriptor: buffer id */
    uint16_t flags;   /* flags */
    uint32_t len;     /* length */
    uint64_t addr;    /* address */
};
_Static_assert(sizeof(struct vhd_inflight_packed_desc) == 32, "DescStatePacked is 32 bytes");

struct vhd_inflight_packed {
    uint64_t features;
    uint16_t version;
    uint16_t desc_num;
    uint16_t free_head;     /* head of the free record list */
    uint16_t old_free_head; /* ... as of the last completed pop or batch */
    uint16_t used_idx;      /* next used ring slot */
    uint16_t old_used_idx;  /* ... as of the last completed batch */
    uint8_t used_wrap_counter;
    uint8_t old_used_wrap_counter;
    uint8_t padding[7];
    struct vhd_inflight_packed_desc desc[];
};
_Static_assert(sizeof(struct vhd_inflight_packed) == 32, "QueueRegionPacked header is 32 bytes");

/*
 * vhd_inflight_queue_size - bytes of one queue's region for queue_size
 * records (1..32768), padded to VHD_INFLIGHT_ALIGN. The area is num_queues
 * such regions back to back, queue i at i * this size.
 */
static inline uint64_t vhd_inflight_queue_size(bool packed, uint32_t queue_size)
{
    uint64_t n = packed ? sizeof(struct vhd_inflight_packed) +
                              (uint64_t)queue_size * sizeof(struct vhd_inflight_packed_desc)
                        : sizeof(struct vhd_inflight_split) +
                              (uint64_t)queue_size * sizeof(struct vhd_inflight_split_desc);
    return (n + VHD_INFLIGHT_ALIGN - 1) & ~(uint64_t)(VHD_INFLIGHT_ALIGN - 1);
}

#endif /* VHD_INFLIGHT_H */
