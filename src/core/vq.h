/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Device-side virtqueue engine: the verbs a device uses on one virtqueue
 * (pop a chain, push used elements, publish, decide on notifications) over
 * the split (vq_split.c) and packed (vq_packed.c) layouts. It knows nothing
 * of sockets, devices or backends: guest memory is a parameter.
 *
 * Threading: a struct vhd_vq is owned by exactly one thread at a time (its
 * worker). No function here takes a lock or does an atomic read-modify-write;
 * ordering with the driver is by acquire/release accesses and fences, each
 * documented where it is used.
 */
#ifndef VHD_VQ_H
#define VHD_VQ_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "util/compiler.h"
#include "dirtylog.h"
#include "inflight.h"
#include "iotlb.h"
#include "mem.h"
#include "spec/virtio.h"

/*
 * Why a queue stopped (sticky in vq->error) or why pop failed. Values are
 * positive; functions return them negated. 0 means no error.
 */
enum vhd_vq_err {
    VHD_VQ_OK = 0,
    VHD_VQ_E_RING_ADDR,       /* ring address outside guest memory or misaligned */
    VHD_VQ_E_AVAIL_IDX,       /* split: avail->idx ran more than a queue size ahead;
                                 packed: avail position more than a ring ahead of used */
    VHD_VQ_E_DESC_INDEX,      /* descriptor index (head or next) >= table size */
    VHD_VQ_E_CHAIN_LOOP,      /* chain longer than its table: a loop */
    VHD_VQ_E_NESTED_INDIRECT, /* INDIRECT flag inside an indirect table */
    VHD_VQ_E_INDIRECT_LEN,    /* indirect table length 0, not a multiple of 16, or too big */
    VHD_VQ_E_INDIRECT_FLAGS,  /* INDIRECT with NEXT (packed: or inside a NEXT list) */
    VHD_VQ_E_INDIRECT_NOFEAT, /* INDIRECT used but VIRTIO_F_INDIRECT_DESC not negotiated */
    VHD_VQ_E_WRITE_ORDER,     /* a device-readable descriptor after a device-writable one */
    VHD_VQ_E_ADDR,            /* a buffer does not translate to guest memory */
    VHD_VQ_E_LEN_OVERFLOW,    /* chain's total length exceeds 2^32 - 1 */
    VHD_VQ_E_IOV_FULL,        /* more segments than the caller's iovec array holds */
    VHD_VQ_E_BUFFER_ID,       /* packed: buffer id >= queue size */
    VHD_VQ_E_PACKED_CHAIN,    /* packed: chain runs into a descriptor not made available */
    VHD_VQ_E_USED_OVERFLOW,   /* device pushed more used elements than were popped */
    VHD_VQ_E_INFLIGHT,        /* inflight area: bad version/size, or records out of range */
    VHD_VQ_E_UNPOP,           /* device gave back a chain that is not the last one popped */
    VHD_VQ_E_ID_IN_FLIGHT,    /* inflight tracking: head / buffer id made available again
                                 while still in flight */
    VHD_VQ_E_IOTLB_PERM,      /* IOTLB: a buffer mapped without the access it needs
                                 (a device-writable one read-only, or the reverse) */
    VHD_VQ_E_IOTLB_RING,      /* IOTLB: a ring mapped but not contiguous in host memory
                                 within one region, or without the access it needs */
    VHD_VQ_E_IOTLB_MISS,      /* IOTLB: an address is not mapped (yet). Never sticky: pop
                                 returns 0 and the chain stays in the ring (vq.c) */
    VHD_VQ_E__COUNT
};

/* Short static description of an enum vhd_vq_err value (positive or negated). */
const char *vhd_vq_strerror(int err);

/*
 * Largest indirect table accepted, in descriptors. The spec bounds a chain by
 * the queue size (2.7.5.3.1); an indirect table may hold up to that many
 * entries. We allow the maximum queue size for any queue, since Linux sizes
 * indirect tables by the request's segment count, not by the queue size.
 */
#define VHD_VQ_MAX_INDIRECT VHD_VQ_MAX_SIZE

/* What vhd_vq_init() needs: SET_VRING_NUM + SET_VRING_ADDR + features. */
struct vhd_vq_params {
    uint32_t size;    /* split: power of two 1..32768; packed: 1..32768 */
    bool packed;      /* VIRTIO_F_RING_PACKED negotiated */
    bool event_idx;   /* VIRTIO_F_EVENT_IDX negotiated */
    bool indirect;    /* VIRTIO_F_INDIRECT_DESC negotiated */
    bool in_order;    /* VIRTIO_F_IN_ORDER negotiated: the device uses buffers in the
                         order they were made available (vhd_vq_push_burst) */
    bool addr_is_gpa; /* ring addresses below are GPAs, not front-end VAs */
    uint64_t desc;    /* split: descriptor table;  packed: descriptor ring */
    uint64_t avail;   /* split: available ring;    packed: driver event suppression area */
    uint64_t used;    /* split: used ring;         packed: device event suppression area */
};

/*
 * One popped chain. The iovec array passed to vhd_vq_pop() holds nr
 * device-readable segments followed by nw device-writable ones.
 */
struct vhd_vq_chain {
    uint16_t id;     /* split: head index; packed: buffer id. Give it back to push. */
    uint16_t ndescs; /* packed: ring slots the chain used (push needs it); split: 1 */
    uint16_t nr;     /* device-readable iovec entries (first) */
    uint16_t nw;     /* device-writable iovec entries (after the readable ones) */
    uint32_t rlen;   /* total device-readable bytes */
    uint32_t wlen;   /* total device-writable bytes */
};

struct vhd_vq {
    /* ---- read on every pop/push ---- */
    /*
     * The table descriptor buffers are translated through on the fast path:
     * mem, or with an IOTLB &iotlb_one (the last read-write entry hit, as a
     * one-region table keyed by IOVA), so the IOMMU-off fast path is the
     * same instructions as before.
     */
    const struct vhd_mem *xlat;
    uint32_t mem_hint;         /* last region of xlat hit for descriptor buffers */
    const struct vhd_mem *mem; /* current guest memory table */
    uint16_t size;             /* queue size, 1..32768 */
    uint16_t mask;             /* split: size - 1 */
    bool packed;
    bool event_idx;
    bool indirect;
    bool in_order; /* VIRTIO_F_IN_ORDER: push_burst may use one element for a run */
    bool rings_ok; /* cached ring pointers below are valid */
    uint8_t error; /* sticky enum vhd_vq_err; non-zero: queue is broken */

    /* Cached host pointers to the rings, valid while rings_ok. */
    union {
        struct {
            struct vhd_vring_desc *desc;
            struct vhd_vring_avail *avail;
            struct vhd_vring_used *used;
        } split;
        struct {
            struct vhd_vring_packed_desc *desc;
            struct vhd_vring_packed_event *driver; /* driver -> device suppression */
            struct vhd_vring_packed_event *device; /* device -> driver suppression */
        } packed;
    } ring;

    /*
     * Inflight tracking (vhost-user INFLIGHT_SHMFD, inflight.c): this queue's
     * region of the shared area, NULL when not negotiated. The only cost when
     * off is this pointer's test once per pop / push / flush.
     */
    union {
        struct vhd_inflight_split *split;
        struct vhd_inflight_packed *packed;
        void *any;
    } inf;

    /* ---- ring state (both layouts use the same fields) ---- */
    uint16_t last_avail_idx; /* split: next avail ring index; packed: next descriptor slot */
    uint16_t avail_shadow;   /* split: last value read from avail->idx */
    uint16_t used_idx;       /* split: next used ring index; packed: next used slot */
    uint16_t published_used; /* split: used->idx as last stored; packed: used_idx at last flush */
    uint16_t signalled_used; /* used index at the last notification decision
                                (packed: slot | wrap << 15) */
    bool signalled_used_valid;
    bool avail_wrap;          /* packed: driver ring wrap counter for last_avail_idx */
    bool used_wrap;           /* packed: wrap counter for used_idx */
    bool published_used_wrap; /* packed: used_wrap at last flush */
    uint16_t inflight;        /* chains popped and not yet pushed */

    /* packed batching: the first used descriptor of the unpublished batch */
    uint16_t batch_npending;
    uint16_t batch_head;       /* its slot */
    uint16_t batch_head_flags; /* its flags, stored last by flush */

    /* ---- inflight tracking state, used only when inf is set ---- */
    uint64_t inf_counter;       /* counter of the next pop (pop order across restarts) */
    uint16_t *inf_resubmit;     /* chains to pop again before new ones, in counter order:
                                   split: heads; packed: head records (allocated by start) */
    uint16_t *inf_head_of_id;   /* packed: head record of each buffer id in flight */
    uint16_t *inf_resubmit_num; /* packed: ring slots of each chain of inf_resubmit, as
                                   start checked them (the area may change since) */
    uint16_t inf_resubmit_n;    /* entries in inf_resubmit (kept until the next start) */
    uint16_t inf_resubmit_pos;  /* next one to pop (== inf_resubmit_n: all popped again) */
    uint16_t inf_new;           /* new chains popped after the list and not given back
                                   (saturating): unpop gives those back first */
    uint16_t inf_desc_num;      /* records in the region (checked at start) */
    bool inf_stale;             /* packed start: the area did not describe the ring: the
                                   base set_base gave was kept, the area reset */
    uint16_t inf_dropped;       /* ... and this many chains it listed were dropped */
    uint16_t inf_retaken;       /* a new area, but set_base put this many chains (packed:
                                   ring slots) in flight: the avail position was moved back
                                   to pop them again */
    uint16_t inf_pop_rec;       /* packed: head record the last tracked pop marked */
    bool inf_resubmit_only;     /* pop only the chains to pop again, nothing new (a ring
                                   being stopped finishes what a restart owes; set by
                                   the owner, cleared by vhd_vq_fini) */

    /*
     * ---- dirty logging (VHOST_F_LOG_ALL, dirtylog.h), used only when log is set ----
     * Set by vhd_vq_set_log at a quiescent point. When off, the cost is one
     * test of log per flush, per notification change and per request the
     * device completes (vhd_vq_log_write); nothing in pop.
     */
    const struct vhd_dirtylog *log; /* NULL: not logging */
    uint64_t log_used_gpa;          /* log_guest_addr: split used ring; packed device area */
    uint64_t log_desc_gpa;          /* packed: the descriptor ring's GPA (set by map_rings) */
    bool log_used;                  /* VHOST_VRING_F_LOG: log our ring writes too */

    /* ---- configuration, cold ---- */
    bool addr_is_gpa;
    uint64_t desc_addr, avail_addr, used_addr;
    uint32_t log_hint; /* region hint of the dirty log's reverse lookups */

    /*
     * ---- IOTLB (VIRTIO_F_ACCESS_PLATFORM, iotlb.h), used only when iotlb is set ----
     * Ring and descriptor addresses are IOVAs. Set by vhd_vq_set_iotlb at a
     * quiescent point. The entries cached here are copies (no pointer into
     * a table version); the control thread drops them at a quiescent point
     * whenever a translation is removed (vhd_vq_iotlb_invalidated).
     */
    struct vhd_iotlb *iotlb;         /* the device's IOTLB; NULL: addresses are GPAs */
    uint32_t iotlb_slot;             /* this queue's reader slot in it */
    int iotlb_event_fd;              /* eventfd written when a miss is recorded, or -1 */
    struct vhd_mem iotlb_one;        /* xlat's table: nregions 1 (iotlb_reg) or 0 */
    struct vhd_mem_region iotlb_reg; /* gpa = iova of the last read-write entry hit */
    /*
     * Entries hit lately, any permission, direct-mapped by the 4 KiB page
     * of the address that found them (size 0: empty): a queue whose buffers
     * come from a pool of pages (each its own IOMMU mapping) translates them
     * without a table walk. Dropped with the rest at invalidations.
     */
#define VHD_VQ_IOTLB_CACHE                 32u
#define VHD_VQ_IOTLB_MISS_WORD(iova, perm) (((iova) & ~(uint64_t)3) | (perm))
    struct vhd_iotlb_ent iotlb_cache[VHD_VQ_IOTLB_CACHE];
    /*
     * Pending miss: the missed IOVA rounded down to 4 bytes | the access
     * wanted (VHD_IOTLB_R/W), 0 when none (VHD_VQ_IOTLB_MISS_WORD); it is
     * answered once all of those 4 bytes translate with that access. Written by the worker with a
     * release store when it misses; the control thread reads it (acquire),
     * sends VHOST_USER_BACKEND_IOTLB_MSG MISS and, once an UPDATE covers it,
     * clears it with a compare-and-swap (control path only) and kicks the
     * queue. While it is set the queue does not report work (it would spin).
     */
    uint64_t iotlb_miss;
    uint64_t iotlb_used_gpa; /* GPA of the used ring (packed: device area), for the log */
    bool start_pending;      /* started, rings not read yet (vhd_vq_start, map_rings) */
} vhd_cacheline_aligned;

/* ---- lifecycle (control path; the queue must not be in use by a worker) ---- */

/*
 * vhd_vq_init - set up a stopped queue from params; mem may be NULL until a
 * table exists. Ring state starts at 0 (packed: both wrap counters 1).
 * A queue that was started with inflight tracking must be vhd_vq_fini()ed
 * first (init forgets, it does not free).
 * Returns 0 or -EINVAL (bad size, misaligned ring address: desc 16, split
 * avail 2, split used 4, packed event areas 4).
 */
int vhd_vq_init(struct vhd_vq *vq, const struct vhd_vq_params *p, const struct vhd_mem *mem);

/*
 * vhd_vq_set_base / vhd_vq_get_base - ring state in the vhost-user encoding
 * (SET/GET_VRING_BASE). Split: bits 0..15 the next avail index. Packed:
 * bits 0..14 next avail slot, bit 15 its wrap counter, bits 16..30 used slot,
 * bit 31 used wrap counter; when bits 16..31 are all zero the used position
 * is taken to equal the avail position (what front-ends that only send the
 * low half mean). set_base returns -EINVAL for an out-of-range slot.
 */
int vhd_vq_set_base(struct vhd_vq *vq, uint32_t num);
uint32_t vhd_vq_get_base(const struct vhd_vq *vq);

/*
 * vhd_vq_start - translate the ring addresses now and, for split rings, load
 * the used index from used->idx. Returns 0, or -EFAULT and sets
 * vq->error = VHD_VQ_E_RING_ADDR when a ring is outside guest memory.
 * With an IOTLB (vhd_vq_set_iotlb) a ring not mapped yet is not an error:
 * -EAGAIN, the queue is started, a miss is recorded, and the first verb
 * after the UPDATE maps the rings and finishes the start (used index,
 * inflight area).
 */
int vhd_vq_start(struct vhd_vq *vq);

/*
 * vhd_vq_set_inflight - track this queue in an inflight area region (before
 * vhd_vq_start, after init and set_base). region points at the queue's
 * region of the shared area, vhd_inflight_queue_size(vq->packed, desc_num)
 * bytes, mapped for as long as the queue runs; desc_num is the queue_size of
 * the area (SET_INFLIGHT_FD). vhd_vq_start then checks the region and:
 *  - version 0 (a new area): initialises it (version 1, desc_num, empty);
 *    chains set_base put in flight (avail past used) are popped again from
 *    the ring (vq->inf_retaken says how many), since no record lists them;
 *  - version 1: repairs a batch whose completion a crash interrupted, and
 *    queues every chain still recorded in flight to be popped again, in
 *    their original pop order, before any new chain. The ring position is
 *    taken from the area and the used ring, not from set_base: split,
 *    last_avail_idx = used->idx + chains in flight (a front-end restores its
 *    base to used->idx after a crash); packed, the used position recorded
 *    in the area, and the avail position after the slots still in flight
 *    (a front-end has no packed position after a crash) -- unless set_base
 *    disagrees and the ring does not look as the area says (inflight.c,
 *    packed_start): then set_base's position stands, the region is reset
 *    and vq->inf_stale / inf_dropped say so.
 * A region that does not fit (version, desc_num other than desc_num,
 * desc_num < queue size, records out of range) fails the start with
 * -EBADMSG and vq->error = VHD_VQ_E_INFLIGHT. Returns 0 or -EINVAL
 * (desc_num out of range, or region NULL).
 */
int vhd_vq_set_inflight(struct vhd_vq *vq, void *region, uint32_t desc_num);

/* Inflight: chains still to be popped again (0 when none or not tracking). */
static inline uint32_t vhd_vq_resubmit_pending(const struct vhd_vq *vq)
{
    return (uint32_t)vq->inf_resubmit_n - vq->inf_resubmit_pos;
}

/*
 * vhd_vq_fini - free what vhd_vq_start allocated for inflight tracking and
 * stop tracking (the area itself belongs to the caller). Safe on any
 * initialised queue, and twice. Control path, queue not in use by a worker.
 */
void vhd_vq_fini(struct vhd_vq *vq);

/* Inflight start, called by vhd_vq_start with the rings mapped (inflight.c). */
int vhd_vq__inflight_start(struct vhd_vq *vq);

/*
 * vhd_vq_set_mem - switch to a new memory table (at a quiescent point, by the
 * owner). Drops the cached ring pointers; the next verb re-translates them.
 */
void vhd_vq_set_mem(struct vhd_vq *vq, const struct vhd_mem *mem);

/* Drop the cached ring pointers (memory or IOTLB change); next use re-translates. */
void vhd_vq_invalidate(struct vhd_vq *vq);

/*
 * vhd_vq_set_iotlb - translate ring and buffer addresses through iotlb (NULL:
 * they are GPAs / front-end VAs again), reading it through reader slot
 * `slot`; event_fd (or -1) is written when the queue records a miss. After
 * vhd_vq_init, before vhd_vq_start; control path, queue not in use.
 */
void vhd_vq_set_iotlb(struct vhd_vq *vq, struct vhd_iotlb *iotlb, uint32_t slot, int event_fd);

/*
 * vhd_vq_iotlb_invalidated - [iova, iova + size) lost its translation (or
 * the whole IOTLB: size 0): drop the queue's cached entries, and its ring
 * pointers when a ring lies in the range. Control path, at a quiescent
 * point (queue detached).
 */
void vhd_vq_iotlb_invalidated(struct vhd_vq *vq, uint64_t iova, uint64_t size);

/* Indirect table lookup's slow path (vq.c): 0 and *t, or -VHD_VQ_E_*. */
int vhd_vq__table_slow(struct vhd_vq *vq, uint64_t addr, uint32_t len, const void **t);

/* IOTLB slow path of buffer translation (vq.c): segments, or -VHD_VQ_E_*. */
int vhd_vq__iotlb_map(struct vhd_vq *vq, uint64_t addr, uint64_t len, uint8_t perm,
                      struct iovec *iov, uint32_t max_iov);

/*
 * Errors of a pop: an IOTLB miss is not one (the chain stays in the ring,
 * the queue is not broken): 0, as for an empty ring. Only on error paths.
 */
static inline int vhd_vq__pop_rc(int rc)
{
    return rc == -VHD_VQ_E_IOTLB_MISS ? 0 : rc;
}

/* Slow path: (re)translate the ring addresses. 0, or -VHD_VQ_E_RING_ADDR (queue broken). */
int vhd_vq__map_rings(struct vhd_vq *vq);

/*
 * vhd_vq_set_log - log this queue's writes to guest memory in log (NULL:
 * stop logging). log_used (VHOST_VRING_F_LOG) adds the device's ring writes
 * (split: used elements, used->idx, used->flags, avail_event; packed: used
 * descriptors and the device event area), logged at used_gpa, the ring's
 * log_guest_addr (spec "Migration": the used ring's first byte is logged
 * there; packed: the device area; packed descriptors at the descriptor
 * ring's own GPA). Data the device writes is logged by the device through
 * vhd_vq_log_write(). Control path, queue not in use by a worker; after
 * vhd_vq_init (which clears it).
 */
void vhd_vq_set_log(struct vhd_vq *vq, const struct vhd_dirtylog *log, bool log_used,
                    uint64_t used_gpa);

/* Logging slow paths (vq.c); callers test vq->log first. */
void vhd_vq__log_iov(struct vhd_vq *vq, const struct iovec *iov, uint32_t n, uint64_t len);
void vhd_vq__log_used(const struct vhd_vq *vq, uint64_t off, uint64_t len);
void vhd_vq__log_desc(const struct vhd_vq *vq, uint64_t off, uint64_t len);

/* ---- datapath (owning worker only) ---- */

/*
 * vhd_vq_log_write - the device wrote the first len bytes of iov[0..n)
 * (segments that pop handed out from this queue, in guest memory): mark
 * their pages dirty when logging is on. Call it after the bytes are
 * written and before the chain is pushed. When logging is off this is one
 * predictable test.
 */
static inline void vhd_vq_log_write(struct vhd_vq *vq, const struct iovec *iov, uint32_t n,
                                    uint64_t len)
{
    if (vhd_unlikely(vq->log != NULL))
        vhd_vq__log_iov(vq, iov, n, len);
}

int vhd_vq__split_pop(struct vhd_vq *vq, struct iovec *iov, uint32_t max_iov,
                      struct vhd_vq_chain *c);
int vhd_vq__packed_pop(struct vhd_vq *vq, struct iovec *iov, uint32_t max_iov,
                       struct vhd_vq_chain *c);
int vhd_vq__split_push(struct vhd_vq *vq, const struct vhd_vq_chain *c, uint32_t written);
int vhd_vq__packed_push(struct vhd_vq *vq, const struct vhd_vq_chain *c, uint32_t written);
void vhd_vq__split_flush(struct vhd_vq *vq);
void vhd_vq__packed_flush(struct vhd_vq *vq);
bool vhd_vq__split_need_notify(struct vhd_vq *vq);
bool vhd_vq__packed_need_notify(struct vhd_vq *vq);
bool vhd_vq__split_enable_notify(struct vhd_vq *vq);
bool vhd_vq__packed_enable_notify(struct vhd_vq *vq);
void vhd_vq__split_disable_notify(struct vhd_vq *vq);
void vhd_vq__packed_disable_notify(struct vhd_vq *vq);
bool vhd_vq__split_has_work(struct vhd_vq *vq);
bool vhd_vq__packed_has_work(struct vhd_vq *vq);
int vhd_vq__packed_unpop(struct vhd_vq *vq, const struct vhd_vq_chain *c);

/* Make sure the ring pointers are usable; the inlined check of every verb. */
static inline int vhd_vq__ready(struct vhd_vq *vq)
{
    if (vhd_unlikely(vq->error))
        return -(int)vq->error;
    if (vhd_unlikely(!vq->rings_ok))
        return vhd_vq__map_rings(vq);
    return 0;
}

/*
 * vhd_vq_pop - take the next available chain.
 * Fills iov with its readable then writable segments (one per region a
 * buffer crosses) and *c with its id and sizes.
 * Returns 1 (a chain), 0 (nothing available), or -enum vhd_vq_err. Any error
 * leaves the queue broken (vq->error set, sticky): the device should report
 * NEEDS_RESET. Nothing in the guest's ring can make this crash or touch
 * memory outside the table.
 */
static inline int vhd_vq_pop(struct vhd_vq *vq, struct iovec *iov, uint32_t max_iov,
                             struct vhd_vq_chain *c)
{
    int rc = vhd_vq__ready(vq);
    if (vhd_unlikely(rc < 0))
        return vhd_vq__pop_rc(rc);
    return vq->packed ? vhd_vq__packed_pop(vq, iov, max_iov, c)
                      : vhd_vq__split_pop(vq, iov, max_iov, c);
}

/* Most chains one vhd_vq_pop_burst call takes. */
#define VHD_VQ_BURST_MAX 64u

/*
 * Where a run puts chain k: iov + k * stride and c + k (vhd_vq_pop_burst),
 * or iovs[k] and cs[k] (vhd_vq_pop_burstv: iovs NULL otherwise); max_iov
 * segments each.
 */
struct vhd_vq__out {
    struct iovec *iov;
    struct vhd_vq_chain *c;
    struct iovec *const *iovs;
    struct vhd_vq_chain *const *cs;
    uint32_t stride;
    uint32_t max_iov;
};

static inline struct iovec *vhd_vq__out_iov(const struct vhd_vq__out *o, uint32_t k)
{
    return o->iovs ? o->iovs[k] : o->iov + (size_t)k * o->stride;
}

static inline struct vhd_vq_chain *vhd_vq__out_chain(const struct vhd_vq__out *o, uint32_t k)
{
    return o->cs ? o->cs[k] : o->c + k;
}

int vhd_vq__split_pop_burst(struct vhd_vq *vq, struct iovec *iov, uint32_t stride,
                            struct vhd_vq_chain *c, uint32_t max);
int vhd_vq__packed_pop_burst(struct vhd_vq *vq, struct iovec *iov, uint32_t stride,
                             struct vhd_vq_chain *c, uint32_t max);
int vhd_vq__split_pop_burstv(struct vhd_vq *vq, struct iovec *const *iovs, uint32_t max_iov,
                             struct vhd_vq_chain *const *cs, uint32_t max);
int vhd_vq__packed_pop_burstv(struct vhd_vq *vq, struct iovec *const *iovs, uint32_t max_iov,
                              struct vhd_vq_chain *const *cs, uint32_t max);
int vhd_vq__split_push_burst(struct vhd_vq *vq, const struct vhd_vq_chain *c,
                             const uint32_t *written, uint32_t n);
int vhd_vq__packed_push_burst(struct vhd_vq *vq, const struct vhd_vq_chain *c,
                              const uint32_t *written, uint32_t n);

/*
 * vhd_vq_pop_burst - pop a run of up to max chains (at most
 * VHD_VQ_BURST_MAX) in one call: the chains, checks and errors of as many
 * vhd_vq_pop calls, for less work per chain (split: avail->idx is read at
 * most once, the run's heads in one pass with their descriptors
 * prefetched; both layouts: per-run state is loaded once, and a buffer in
 * the region of the previous one is translated with one check).
 * Chain k gets iov[k * stride ...] (up to stride segments) and c[k]: iov
 * holds max * stride entries and c max (what lies past the chains returned
 * is scratch: a chain the run did not keep may have written there).
 * Returns the number of chains popped (0: nothing available), or
 * -enum vhd_vq_err when the run's first chain is bad (queue broken, as
 * vhd_vq_pop). A bad chain after the first ends the run before it: the
 * chains before it are returned and the queue is not broken yet, so they
 * are pushed and published normally; the next pop meets the bad chain
 * again and breaks the queue (unless the driver rewrote it meanwhile).
 * With inflight tracking each chain is recorded as vhd_vq_pop records it.
 */
static inline int vhd_vq_pop_burst(struct vhd_vq *vq, struct iovec *iov, uint32_t stride,
                                   struct vhd_vq_chain *c, uint32_t max)
{
    int rc = vhd_vq__ready(vq);
    if (vhd_unlikely(rc < 0))
        return vhd_vq__pop_rc(rc);
    if (max > VHD_VQ_BURST_MAX)
        max = VHD_VQ_BURST_MAX;
    if (vhd_unlikely(max == 0))
        return 0;
    return vq->packed ? vhd_vq__packed_pop_burst(vq, iov, stride, c, max)
                      : vhd_vq__split_pop_burst(vq, iov, stride, c, max);
}

/*
 * vhd_vq_pop_burstv - vhd_vq_pop_burst for a device whose requests keep
 * their own iovec arrays: chain k gets iovs[k] (up to max_iov segments) and
 * *cs[k]; iovs and cs hold max entries. Same chains, checks, errors and
 * return value.
 */
static inline int vhd_vq_pop_burstv(struct vhd_vq *vq, struct iovec *const *iovs, uint32_t max_iov,
                                    struct vhd_vq_chain *const *cs, uint32_t max)
{
    int rc = vhd_vq__ready(vq);
    if (vhd_unlikely(rc < 0))
        return vhd_vq__pop_rc(rc);
    if (max > VHD_VQ_BURST_MAX)
        max = VHD_VQ_BURST_MAX;
    if (vhd_unlikely(max == 0))
        return 0;
    return vq->packed ? vhd_vq__packed_pop_burstv(vq, iovs, max_iov, cs, max)
                      : vhd_vq__split_pop_burstv(vq, iovs, max_iov, cs, max);
}

/*
 * vhd_vq_push_burst - vhd_vq_push(c[k], written[k]) for k in 0..n (written
 * NULL: 0 bytes for each), with one pass over the used ring. Chains are
 * checked as vhd_vq_push checks them; on an error the chains before the
 * bad one are pushed, the queue is broken and -enum vhd_vq_err returned.
 * Returns 0. Nothing is visible to the driver until vhd_vq_flush().
 * With VIRTIO_F_IN_ORDER (vq->in_order), no inflight tracking, and a run in
 * which no chain has device-writable bytes or reports any written (a
 * transmit run), the run is used as one batch (2.7.9 / 2.8.8): one used
 * element (split) or descriptor (packed) with the last chain's id and
 * length 0, at the used position of the first chain; the position then
 * moves past the whole run. The caller must then push the chains in the
 * order they were popped (which IN_ORDER promises anyway). Other runs get
 * one used entry per chain.
 */
static inline int vhd_vq_push_burst(struct vhd_vq *vq, const struct vhd_vq_chain *c,
                                    const uint32_t *written, uint32_t n)
{
    int rc = vhd_vq__ready(vq);
    if (vhd_unlikely(rc < 0))
        return rc;
    return vq->packed ? vhd_vq__packed_push_burst(vq, c, written, n)
                      : vhd_vq__split_push_burst(vq, c, written, n);
}

/*
 * vhd_vq_push - record chain c as used with `written` bytes written into its
 * device-writable buffers. Chains may be pushed in any order. Nothing is
 * visible to the driver until vhd_vq_flush(). Returns 0 or -enum vhd_vq_err.
 */
static inline int vhd_vq_push(struct vhd_vq *vq, const struct vhd_vq_chain *c, uint32_t written)
{
    int rc = vhd_vq__ready(vq);
    if (vhd_unlikely(rc < 0))
        return rc;
    return vq->packed ? vhd_vq__packed_push(vq, c, written) : vhd_vq__split_push(vq, c, written);
}

/*
 * vhd_vq_flush - publish every pushed element with one release store (split:
 * used->idx; packed: the flags of the batch's first descriptor, written last).
 */
static inline void vhd_vq_flush(struct vhd_vq *vq)
{
    if (vhd_vq__ready(vq) < 0)
        return;
    if (vq->packed)
        vhd_vq__packed_flush(vq);
    else
        vhd_vq__split_flush(vq);
}

/*
 * vhd_vq_need_notify - after a flush: must the driver be interrupted?
 * Honours VIRTIO_F_EVENT_IDX (split used_event / packed driver event
 * suppression) or the NO_INTERRUPT / DISABLE flags, and remembers what was
 * signalled. A broken queue answers false.
 */
static inline bool vhd_vq_need_notify(struct vhd_vq *vq)
{
    if (vhd_vq__ready(vq) < 0)
        return false;
    return vq->packed ? vhd_vq__packed_need_notify(vq) : vhd_vq__split_need_notify(vq);
}

/*
 * vhd_vq_enable_notify - ask the driver to kick again, then re-check the ring.
 * Returns true when work slipped in between the last pop and the enable (the
 * caller must process it rather than sleep). A broken queue answers false.
 */
static inline bool vhd_vq_enable_notify(struct vhd_vq *vq)
{
    if (vhd_vq__ready(vq) < 0)
        return false;
    if (vhd_unlikely(vq->inf.any != NULL)) {
        if (vhd_vq_resubmit_pending(vq))
            return true; /* chains to pop again need no kick */
        if (vq->inf_resubmit_only)
            return false;
    }
    bool slipped = vq->packed ? vhd_vq__packed_enable_notify(vq) : vhd_vq__split_enable_notify(vq);
    /* Waiting for an IOTLB UPDATE: the control thread kicks the queue when it comes. */
    return slipped && vhd_likely(vq->iotlb_miss == 0);
}

/* vhd_vq_disable_notify - tell the driver kicks are not needed (we are polling). */
static inline void vhd_vq_disable_notify(struct vhd_vq *vq)
{
    if (vhd_vq__ready(vq) < 0)
        return;
    if (vq->packed)
        vhd_vq__packed_disable_notify(vq);
    else
        vhd_vq__split_disable_notify(vq);
}

/*
 * vhd_vq_unpop - give back c, the chain popped last and not yet pushed, as if
 * it had never been popped: the next pop returns it again. Call it several
 * times to give back several chains, the latest first. Packed: nothing may
 * have been pushed since c was popped. With inflight tracking its record is
 * cleared (a chain given back before it was resubmitted stays queued for
 * resubmission). Returns 0, or -VHD_VQ_E_UNPOP when c cannot be the last
 * chain popped (the queue is then broken: a device bug).
 */
int vhd_vq_unpop(struct vhd_vq *vq, const struct vhd_vq_chain *c);

/* IOTLB prefault of each layout (vq_split.c, vq_packed.c; vhd_vq_prefault). */
int vhd_vq__split_prefault(struct vhd_vq *vq, uint32_t max);
int vhd_vq__packed_prefault(struct vhd_vq *vq, uint32_t max);
/* A buffer's translation for a prefault (vq.c): 0, 1 (miss recorded) or -1 (leave it to pop). */
int vhd_vq__prefault_buf(struct vhd_vq *vq, uint64_t addr, uint32_t len, uint8_t perm);

/*
 * vhd_vq_prefault - with an IOTLB: translate the buffers of up to max
 * chains made available and not popped yet, without popping them, so that
 * the first buffer not translated records its miss (the control thread
 * sends the MISS) before the device needs it: a receive queue's buffers
 * before a frame comes for them. Chains the pop would refuse are left to
 * it (nothing breaks here). Returns 1 when a miss is pending, else 0.
 * Without an IOTLB: 0, one predictable branch. Worker owning the queue.
 */
static inline int vhd_vq_prefault(struct vhd_vq *vq, uint32_t max)
{
    if (vhd_likely(!vq->iotlb))
        return 0;
    if (vhd_load_relaxed(&vq->iotlb_miss) != 0)
        return 1; /* one miss at a time: the pop's, or an earlier prefault's */
    if (vhd_vq__ready(vq) < 0)
        return 0;
    return vq->packed ? vhd_vq__packed_prefault(vq, max) : vhd_vq__split_prefault(vq, max);
}

/* vhd_vq_has_work - is a chain available to pop? (false when broken) */
static inline bool vhd_vq_has_work(struct vhd_vq *vq)
{
    if (vhd_vq__ready(vq) < 0)
        return false;
    if (vhd_unlikely(vq->inf.any != NULL)) {
        if (vhd_vq_resubmit_pending(vq))
            return true;
        if (vq->inf_resubmit_only)
            return false;
    }
    bool work = vq->packed ? vhd_vq__packed_has_work(vq) : vhd_vq__split_has_work(vq);
    return work && vhd_likely(vq->iotlb_miss == 0);
}

/*
 * Per-buffer translation shared by both layouts: appends the buffer's
 * segments to iov and counts it in c and *total (every chain length check
 * and error: vq.c, the slow path). The fast path, inlined into each pop,
 * takes the common case: a non-empty buffer inside the region of the last
 * hit, in order (no readable buffer after a writable one), with room in iov
 * and within the 32-bit chain length. It decides before it writes anything,
 * so every other case, errors included, is the slow path's, unchanged. A
 * call and its register saves per descriptor were a third of a pop's
 * instructions (callgrind, 64-byte frames).
 */
int vhd_vq__map_desc_slow(struct vhd_vq *vq, uint64_t addr, uint32_t len, bool writable,
                          struct iovec *iov, uint32_t max_iov, struct vhd_vq_chain *c,
                          uint64_t *total);

static inline int vhd_vq__map_desc(struct vhd_vq *vq, uint64_t addr, uint32_t len, bool writable,
                                   struct iovec *iov, uint32_t max_iov, struct vhd_vq_chain *c,
                                   uint64_t *total)
{
    const struct vhd_mem *mem = vq->xlat;
    uint32_t used = (uint32_t)c->nr + c->nw, h = vq->mem_hint;

    if (vhd_likely(len != 0 && (writable || c->nw == 0) && used < max_iov && h < mem->nregions &&
                   *total + len <= UINT32_MAX)) {
        const struct vhd_mem_region *r = &mem->regions[vhd_index_nospec(h, mem->nregions)];
        /* As vhd_mem_gpa_to_hva: addr - r->gpa cannot underflow once addr >= r->gpa. */
        if (vhd_likely(addr >= r->gpa && addr - r->gpa < r->size &&
                       len <= r->size - (addr - r->gpa))) {
            *total += len;
            iov[used].iov_base = r->hva + vhd_index_nospec(addr - r->gpa, r->size);
            iov[used].iov_len = len;
            if (writable) {
                c->nw++;
                c->wlen += len;
            } else {
                c->nr++;
                c->rlen += len;
            }
            return 0;
        }
    }
    return vhd_vq__map_desc_slow(vq, addr, len, writable, iov, max_iov, c, total);
}

/*
 * vhd_vq__clamp - vhd_index_nospec for the run walks: idx when idx < size,
 * else 0, without a branch. On x86-64 the mask comes from the carry of one
 * compare (cmp; sbb), which the CPU does not predict: three instructions
 * where the portable form takes up to seven (a 64-bit offset).
 */
static inline uint64_t vhd_vq__clamp(uint64_t idx, uint64_t size)
{
#if defined(__x86_64__)
    uint64_t mask;
    __asm__("cmp %2, %1\n\tsbb %0, %0" : "=r"(mask) : "r"(idx), "r"(size) : "cc");
    return idx & mask;
#else
    return vhd_index_nospec(idx, size);
#endif
}

/*
 * Batch pops (vhd_vq_pop_burst) keep the region of the last hit in locals
 * for the whole run: a buffer inside it is translated with one range check
 * and no table access. size 0 means no region (every check fails and the
 * slow path decides).
 */
struct vhd_vq__rcache {
    uint64_t gpa;
    uint64_t size;
    uint8_t *hva;
};

/*
 * The run walks' region test: a buffer of len bytes at offset off (addr -
 * gpa, wrapped above size when addr < gpa) is non-empty and inside a
 * region of size bytes. One add and two compares: off + (len - 1) carries
 * (ends below off) when len is 0 (off != 0) or off wrapped, and is >= size
 * when len is 0 and off is 0 or the buffer ends past the region. Written
 * as a compare, not __builtin_add_overflow, which gcc turns into setb and
 * a test (vq-bench --batch 64, packed: 243 -> 235 instructions per request).
 */
static inline bool vhd_vq__in_region(uint64_t off, uint32_t len, uint64_t size)
{
    uint64_t last = off + ((uint64_t)len - 1);
    return last >= off && last < size;
}

static inline void vhd_vq__rcache_load(const struct vhd_vq *vq, struct vhd_vq__rcache *rc)
{
    const struct vhd_mem *mem = vq->xlat;
    uint32_t h = vq->mem_hint;

    if (vhd_likely(h < mem->nregions)) {
        const struct vhd_mem_region *r = &mem->regions[vhd_index_nospec(h, mem->nregions)];
        rc->gpa = r->gpa;
        rc->size = r->size;
        rc->hva = r->hva;
    } else {
        rc->gpa = 0;
        rc->size = 0;
        rc->hva = NULL;
    }
}

/*
 * vhd_vq__map_desc with the run's cached region: the same decision (fast
 * case or the slow path, which keeps every check and error), one check
 * fewer (addr - gpa wraps above size when addr < gpa, as a region never
 * wraps the address space), and no load of the table. After the slow path
 * the cache follows the hint.
 */
static inline int vhd_vq__map_desc_run(struct vhd_vq *vq, struct vhd_vq__rcache *rc, uint64_t addr,
                                       uint32_t len, bool writable, struct iovec *iov,
                                       uint32_t max_iov, struct vhd_vq_chain *c, uint64_t *total)
{
    uint32_t used = (uint32_t)c->nr + c->nw;
    uint64_t off = addr - rc->gpa;

    if (vhd_likely(len != 0 && (writable || c->nw == 0) && used < max_iov &&
                   *total + len <= UINT32_MAX && off < rc->size && len <= rc->size - off)) {
        *total += len;
        iov[used].iov_base = rc->hva + vhd_index_nospec(off, rc->size);
        iov[used].iov_len = len;
        if (writable) {
            c->nw++;
            c->wlen += len;
        } else {
            c->nr++;
            c->rlen += len;
        }
        return 0;
    }
    int r = vhd_vq__map_desc_slow(vq, addr, len, writable, iov, max_iov, c, total);
    vhd_vq__rcache_load(vq, rc);
    return r;
}

/* Mark the queue broken with err (positive) and return -err. */
static inline int vhd_vq__fail(struct vhd_vq *vq, int err)
{
    if (!vq->error)
        vq->error = (uint8_t)err;
    return -err;
}

#endif /* VHD_VQ_H */
