/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Driver-side rings: the mirror image of the device-side engine, for split
 * (vring_split.c) and packed (vring_packed.c) layouts. The driver adds
 * requests (readable + writable buffers, direct or through an indirect
 * table), publishes them, decides whether to kick, and collects used
 * elements. It is the mock driver of the unit tests and fuzzers, and the
 * base of the userspace virtio driver.
 *
 * Memory: the caller gives one contiguous area of "guest" memory (host
 * pointer + its guest-physical address) large enough for
 * vhd_drv_vq_area_size(); the rings and one indirect table per buffer id are
 * laid out inside it. Buffers are given as guest-physical addresses.
 *
 * Threading: one thread owns a struct vhd_drv_vq. No locks, no atomic RMW.
 */
#ifndef VHD_DRV_VRING_H
#define VHD_DRV_VRING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/compiler.h"
#include "spec/virtio.h"

/* One guest buffer of a request. */
struct vhd_drv_buf {
    uint64_t gpa;
    uint32_t len;
};

struct vhd_drv_vq_params {
    uint32_t size;  /* split: power of two 1..32768; packed: 1..32768 */
    bool packed;    /* packed layout */
    bool event_idx; /* VIRTIO_F_EVENT_IDX negotiated */
    /*
     * VIRTIO_F_IN_ORDER negotiated: the device uses buffers in the order they
     * were made available and may use a batch of them with one used entry,
     * written at the batch's first position and naming its last buffer
     * (2.7.9, 2.8.8); get_used then returns the batch's earlier buffers
     * first, as used completely (their writable length).
     */
    bool in_order;
    uint32_t max_indirect; /* entries per indirect table; 0: no indirect support */
    void *area;            /* host pointer of the area (16-byte aligned, zeroed by init) */
    uint64_t area_gpa;     /* its guest-physical address (16-byte aligned) */
    size_t area_len;       /* >= vhd_drv_vq_area_size(size, packed, max_indirect) */
};

/* Per-buffer-id bookkeeping. */
struct vhd_drv_vq_slot {
    void *cookie;    /* caller's token, returned by get_used */
    uint16_t ndescs; /* descriptors the request took in the ring (split: in the table) */
    uint16_t last;   /* split: last descriptor of the chain (to link into free list) */
    bool busy;       /* in flight */
    uint32_t wlen;   /* bytes of its device-writable buffers ("used completely", in order) */
};

struct vhd_drv_vq {
    uint16_t size;
    bool packed;
    bool event_idx;
    bool in_order;
    uint32_t max_indirect;
    uint16_t num_free; /* descriptors (split) / ring slots (packed) free */

    /* Rings inside the area. Tests may poke at them to forge malformed input. */
    union {
        struct {
            struct vhd_vring_desc *desc;
            struct vhd_vring_avail *avail;
            struct vhd_vring_used *used;
        } split;
        struct {
            struct vhd_vring_packed_desc *desc;
            struct vhd_vring_packed_event *driver; /* written by us */
            struct vhd_vring_packed_event *device; /* written by the device */
        } packed;
    } ring;
    uint64_t desc_gpa, avail_gpa, used_gpa; /* what to give SET_VRING_ADDR (GPA form) */

    uint8_t *indirect; /* max_indirect * 16 bytes per id */
    uint64_t indirect_gpa;

    /* split state */
    uint16_t free_head;       /* head of the free descriptor list */
    uint16_t avail_idx;       /* next avail->idx value (incl. unpublished adds) */
    uint16_t published_avail; /* avail->idx as last stored */
    uint16_t kicked_avail;    /* avail index at the last kick decision
                                 (packed: slot | wrap << 15) */
    uint16_t last_used_idx;   /* next used ring entry to read */

    /* packed state */
    uint16_t next_avail; /* next ring slot to fill */
    bool avail_wrap;
    uint16_t last_used; /* next ring slot to read a used element from */
    bool used_wrap;
    bool kicked_valid;    /* packed: kicked_avail exact (<= a lap published since) */
    uint16_t batch_first; /* first slot of the unpublished batch */
    uint16_t batch_first_flags;
    uint16_t batch_count;  /* unpublished requests */
    uint16_t free_id_head; /* packed buffer-id free list */
    uint16_t *id_next;     /* free-list links: split: of descriptors (private copy of the
                              chain links); packed: of buffer ids */

    struct vhd_drv_vq_slot *slots; /* size entries, by id */

    /*
     * In order: the ids in the order they were made available (private, never
     * read from shared memory): split by avail position (the k-th buffer made
     * available is the k-th used), packed a FIFO from order_head. While a
     * batch is open (one used entry for several buffers), batch_last names its
     * last buffer and batch_len the length that entry reported for it.
     */
    uint16_t *order;
    uint16_t order_head, order_tail; /* packed: FIFO positions, < size */
    bool batch_open;
    uint16_t batch_last;
    uint32_t batch_len;
};

/* Bytes of guest memory the rings and indirect tables need. */
size_t vhd_drv_vq_area_size(uint32_t size, bool packed, uint32_t max_indirect);

/*
 * vhd_drv_vq_init - lay out and zero the rings in p->area. Allocates the
 * per-id bookkeeping (free with vhd_drv_vq_fini). 0, -EINVAL or -ENOMEM.
 */
int vhd_drv_vq_init(struct vhd_drv_vq *dq, const struct vhd_drv_vq_params *p);
void vhd_drv_vq_fini(struct vhd_drv_vq *dq);

/*
 * vhd_drv_vq_add - queue one request of nr device-readable then nw
 * device-writable buffers, not yet visible to the device. With indirect,
 * the buffers go into the id's indirect table (nr + nw <= max_indirect) and
 * take one ring descriptor. Returns 0, -ENOSPC (not enough free
 * descriptors/slots), or -EINVAL (no buffers, too many for the table).
 */
int vhd_drv_vq_add(struct vhd_drv_vq *dq, const struct vhd_drv_buf *bufs, uint32_t nr, uint32_t nw,
                   bool indirect, void *cookie);

/* vhd_drv_vq_publish - make all added requests visible with one release store. */
void vhd_drv_vq_publish(struct vhd_drv_vq *dq);

/*
 * vhd_drv_vq_kick_needed - after publish: does the device want a kick for
 * what was published since the last call? (split: avail_event with EVENT_IDX,
 * else !(used->flags & NO_NOTIFY); packed: device event suppression.)
 */
bool vhd_drv_vq_kick_needed(struct vhd_drv_vq *dq);

/*
 * vhd_drv_vq_get_used - take one used element: 1 with *cookie and *len, 0
 * when none, -EIO when the device returned an id that is not in flight.
 */
int vhd_drv_vq_get_used(struct vhd_drv_vq *dq, void **cookie, uint32_t *len);

/*
 * vhd_drv_vq_enable_cb - ask for interrupts (EVENT_IDX: used_event = next
 * entry; else clear NO_INTERRUPT / set ENABLE), then re-check: returns true
 * when used elements are already pending (caller must poll again).
 * vhd_drv_vq_disable_cb - no interrupts please.
 */
bool vhd_drv_vq_enable_cb(struct vhd_drv_vq *dq);
void vhd_drv_vq_disable_cb(struct vhd_drv_vq *dq);

/* Requests in flight (added and not yet collected). */
uint32_t vhd_drv_vq_inflight(const struct vhd_drv_vq *dq);

/* Layout back-ends, dispatched by vring.c. Same contracts as above. */
int vhd_drv__split_init(struct vhd_drv_vq *dq, const struct vhd_drv_vq_params *p);
int vhd_drv__packed_init(struct vhd_drv_vq *dq, const struct vhd_drv_vq_params *p);
int vhd_drv__split_add(struct vhd_drv_vq *dq, const struct vhd_drv_buf *bufs, uint32_t nr,
                       uint32_t nw, bool indirect, void *cookie);
int vhd_drv__packed_add(struct vhd_drv_vq *dq, const struct vhd_drv_buf *bufs, uint32_t nr,
                        uint32_t nw, bool indirect, void *cookie);
void vhd_drv__split_publish(struct vhd_drv_vq *dq);
void vhd_drv__packed_publish(struct vhd_drv_vq *dq);
bool vhd_drv__split_kick_needed(struct vhd_drv_vq *dq);
bool vhd_drv__packed_kick_needed(struct vhd_drv_vq *dq);
int vhd_drv__split_get_used(struct vhd_drv_vq *dq, void **cookie, uint32_t *len);
int vhd_drv__packed_get_used(struct vhd_drv_vq *dq, void **cookie, uint32_t *len);
bool vhd_drv__split_enable_cb(struct vhd_drv_vq *dq);
bool vhd_drv__packed_enable_cb(struct vhd_drv_vq *dq);
void vhd_drv__split_disable_cb(struct vhd_drv_vq *dq);
void vhd_drv__packed_disable_cb(struct vhd_drv_vq *dq);

#endif /* VHD_DRV_VRING_H */
