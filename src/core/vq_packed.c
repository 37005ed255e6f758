/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Device side of the packed virtqueue layout (virtio 1.2, 2.8): popping
 * available descriptor chains (direct and indirect), writing used
 * descriptors in batches published by one release store, and both
 * directions of event suppression. Dispatched from the vq.h inline verbs,
 * which have already checked that the rings are mapped and the queue is not
 * broken.
 *
 * Section numbers are those of virtio 1.2, section 2.8 ("Packed Virtqueues"):
 * 2.8.1 wrap counters, 2.8.3 write flag, 2.8.6 chaining, 2.8.7 indirect,
 * 2.8.10/2.8.14 event suppression, 2.8.15-2.8.19 normative requirements,
 * 2.8.21 supplying buffers, 2.8.22 receiving used buffers.
 *
 * Ring positions. A position is a slot (0..size-1) plus the wrap counter of
 * the lap it belongs to. Where a position must fit one uint16_t (the event
 * suppression off_wrap field, and vq->signalled_used) it is encoded as
 * slot | wrap << 15, which is exact because size <= 32768.
 *
 * Ownership of slots. Going round the ring in order, the slots from
 * published_used up to (not including) last_avail_idx belong to the device:
 * it has read them and has not yet handed a used descriptor for them back.
 * All the others belong to the driver. A driver may only make available
 * slots it owns (2.8.16: it must not change a descriptor until it has seen
 * it used), so pop never reads past published_used + size; that one bound
 * also guarantees that inflight cannot overflow and that used descriptors
 * are only ever written into slots the device has already consumed.
 */
#include <stddef.h>
#include <string.h>

#include "vq.h"

#define PACKED_POS_WRAP (1u << VRING_PACKED_EVENT_WRAP_SHIFT)
#define PACKED_POS_SLOT (PACKED_POS_WRAP - 1)

/* vhd_vq_chain counts iovec entries in uint16_t fields. */
#define PACKED_MAX_IOV 65535u

/*
 * Pop prefetches the descriptor this many slots ahead (2 cache lines of
 * 16-byte descriptors), the packed counterpart of SPLIT_PREFETCH_AHEAD: the
 * driver wrote the descriptors on its own CPU, and a pop that waits for each
 * line in turn stalls once every four slots. A single pop: once per line
 * (slots that are a multiple of 4: a chain of several slots may step over
 * one, which only loses that hint), and only slots the driver owns (within
 * `room`). Whether the driver has made that slot available yet cannot be
 * known without reading its flags (the load we want to hide), so when the
 * device runs ahead of the driver the prefetch may pull a line the driver
 * is about to write: that costs the driver one ownership transfer, and
 * happens only when the device is waiting anyway. That cost is the driver's
 * CPU time, though, and a driver that produces as fast as it can pays it
 * on every line: 4 lines ahead, testpmd txonly against a packed ring ran
 * 12-15 % slower than with 2 (PERFORMANCE.md §2); 2 lines still hide the
 * load for a run (io and rxonly unchanged). A run: at each chain (or
 * group of four) it takes, with no test (one instruction; testing the line
 * and the bound cost six per chain): near the end of the driver's slots or
 * of the ring the hint may name a line of the device's own slots or just
 * past the ring, which a prefetch never faults on and which only costs a
 * useless line fill.
 */
#define PACKED_PREFETCH_AHEAD 8u

/* Encode a position as slot | wrap << 15. */
static inline uint16_t pos_encode(uint16_t slot, bool wrap)
{
    return (uint16_t)(slot | (wrap ? PACKED_POS_WRAP : 0));
}

/*
 * Slots from position (from, from_wrap) forward to (to, to_wrap), for slots
 * below size. Positions are only known modulo two laps, so the answer is in
 * [0, 2 * size); callers treat anything above size as "not a sane distance".
 */
static inline uint32_t pos_dist(uint32_t size, uint16_t from, bool from_wrap, uint16_t to,
                                bool to_wrap)
{
    int32_t d = (int32_t)to - (int32_t)from + (from_wrap != to_wrap ? (int32_t)size : 0);
    if (d < 0)
        d += 2 * (int32_t)size;
    return (uint32_t)d;
}

/*
 * The packed-ring event rule (2.8.14; the packed counterpart of the split
 * ring's vring_need_event): with positions encoded as slot | wrap << 15,
 * must the other side be notified when the positions [old, new) have just
 * been made available/used and it asked for an event at `event`?
 * True when event lies in [old, new). old and new come from our own state;
 * event comes from the other side, so an offset beyond the ring (which
 * could never be reached) answers true: a spurious notification costs a
 * wake-up, a missing one hangs the queue. Likewise when more than a lap was
 * published between two decisions (the positions can no longer tell how
 * far we went): notify.
 */
static bool packed_need_event(uint32_t size, uint16_t event, uint16_t new_pos, uint16_t old_pos)
{
    uint16_t ev_slot = event & PACKED_POS_SLOT;
    if (ev_slot >= size)
        return true;
    uint32_t n = pos_dist(size, old_pos & PACKED_POS_SLOT, old_pos >> 15, new_pos & PACKED_POS_SLOT,
                          new_pos >> 15);
    if (n > size)
        return true;
    /* How far behind new the event position is: 1..n means it was just crossed. */
    uint32_t behind =
        pos_dist(size, ev_slot, event >> 15, new_pos & PACKED_POS_SLOT, new_pos >> 15);
    return behind - 1 < n; /* behind == 0 wraps to UINT32_MAX: not crossed */
}

/* 2.8.1: available when AVAIL matches the wrap counter and USED does not. */
static inline bool desc_is_avail(uint16_t flags, bool wrap)
{
    return ((flags & VRING_PACKED_DESC_F_AVAIL) != 0) == wrap &&
           ((flags & VRING_PACKED_DESC_F_USED) != 0) != wrap;
}

/*
 * Flags of a ring slot, with acquire: pairs with the driver's release (its
 * write barrier, then the flags store) after it wrote addr/len/id
 * (2.8.21.1.1), so the descriptor's other fields read afterwards are the
 * ones it published.
 */
static inline uint16_t slot_flags(const struct vhd_vring_packed_desc *d)
{
    return vhd_le16(vhd_load_acquire(&d->flags));
}

/* Slots the device owns: published_used up to last_avail_idx (see top). */
static inline uint32_t device_owned(const struct vhd_vq *vq)
{
    return pos_dist(vq->size, vq->published_used, vq->published_used_wrap, vq->last_avail_idx,
                    vq->avail_wrap);
}

/* Is a chain available at last_avail_idx (in a slot the driver owns)? */
static inline bool avail_ready(const struct vhd_vq *vq)
{
    if (vhd_unlikely(device_owned(vq) >= vq->size))
        return false; /* the whole ring is ours: nothing can be available */
    return desc_is_avail(slot_flags(&vq->ring.packed.desc[vq->last_avail_idx]), vq->avail_wrap);
}

/*
 * One indirect table (2.8.7): addr/len describe an array of len / 16
 * struct pvirtq_desc read sequentially (there is no next field in packed
 * descriptors). Only WRITE is meaningful inside a table; the spec reserves
 * the other flags and says the device ignores them, so NEXT (and AVAIL /
 * USED, which some drivers copy in) are ignored. INDIRECT inside a table is
 * the exception we refuse: 2.8.19 forbids it (only WRITE may be set) and a
 * driver that sets it means a second table we would otherwise read as data,
 * so it is a protocol violation (NESTED_INDIRECT), as in the split layout.
 * The buffer id inside the table is reserved and ignored.
 */
static int pop_indirect(struct vhd_vq *vq, uint64_t addr, uint32_t len, struct iovec *iov,
                        uint32_t max_iov, struct vhd_vq_chain *c, uint64_t *total)
{
    if (len == 0 || (len % sizeof(struct vhd_vring_packed_desc)) ||
        len / sizeof(struct vhd_vring_packed_desc) > VHD_VQ_MAX_INDIRECT)
        return vhd_vq__fail(vq, VHD_VQ_E_INDIRECT_LEN);
    const void *t =
        vhd_likely(!vq->iotlb) ? vhd_mem_gpa_to_hva(vq->mem, addr, len, &vq->mem_hint) : NULL;
    if (vhd_unlikely(t == NULL)) {
        int rc = vhd_vq__table_slow(vq, addr, len, &t);
        if (rc < 0)
            return rc;
    }
    const uint8_t *tbl = t;

    uint32_t n = len / (uint32_t)sizeof(struct vhd_vring_packed_desc);
    for (uint32_t i = 0; i < n; i++) {
        struct vhd_vring_packed_desc d;
        /*
         * The table need not be 16-byte aligned (the spec sets no alignment),
         * so copy the entry with memcpy rather than typed loads. The empty asm
         * with a memory clobber stops the compiler from re-reading guest
         * memory in place of the local copy: each field is fetched once, and
         * a driver rewriting the table concurrently cannot make a checked
         * value differ from the used one.
         */
        memcpy(&d, tbl + (size_t)i * sizeof(d), sizeof(d));
        __asm__ volatile("" ::: "memory");
        uint16_t flags = vhd_le16(d.flags);
        if (flags & VRING_DESC_F_INDIRECT)
            return vhd_vq__fail(vq, VHD_VQ_E_NESTED_INDIRECT);
        int rc = vhd_vq__map_desc(vq, vhd_le64(d.addr), vhd_le32(d.len),
                                  (flags & VRING_DESC_F_WRITE) != 0, iov, max_iov, c, total);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/*
 * One descriptor of a chain: an indirect table (only as a chain of its own:
 * 2.8.19, and only when negotiated) or a buffer. first: it is the chain's
 * first descriptor.
 */
static inline __attribute__((always_inline)) int
packed_map_one(struct vhd_vq *vq, uint64_t addr, uint32_t len, uint16_t flags, bool first,
               struct iovec *iov, uint32_t max_iov, struct vhd_vq_chain *c, uint64_t *total,
               struct vhd_vq__rcache *rcache)
{
    if (flags & VRING_DESC_F_INDIRECT) {
        if (vhd_unlikely(!vq->indirect))
            return vhd_vq__fail(vq, VHD_VQ_E_INDIRECT_NOFEAT);
        if (vhd_unlikely(!first || (flags & VRING_DESC_F_NEXT)))
            return vhd_vq__fail(vq, VHD_VQ_E_INDIRECT_FLAGS);
        int rc = pop_indirect(vq, addr, len, iov, max_iov, c, total);
        if (rcache)
            vhd_vq__rcache_load(vq, rcache); /* the table walk may have moved the hint */
        return rc;
    }
    /* rcache: a batch pop (constant per call site: the other one is compiled out). */
    if (rcache)
        return vhd_vq__map_desc_run(vq, rcache, addr, len, (flags & VRING_DESC_F_WRITE) != 0, iov,
                                    max_iov, c, total);
    return vhd_vq__map_desc(vq, addr, len, (flags & VRING_DESC_F_WRITE) != 0, iov, max_iov, c,
                            total);
}

/*
 * Inflight: pop the next recorded chain again (after a restart) from the
 * copies of its descriptors in its records: its ring slots may have been
 * overwritten by used descriptors of chains completed out of order. The
 * records are re-checked as they are read (the front-end can write the
 * area at any time): record indices against desc_num, the length and the
 * buffer id against what start checked and recorded, and the chain shape as
 * in pop (NEXT is not needed: the head record's num says how long the
 * chain is).
 * The ring position is not touched: start placed last_avail_idx after the
 * slots of every chain in flight.
 */
static int packed_pop_resubmit(struct vhd_vq *vq, struct iovec *iov, uint32_t max_iov,
                               struct vhd_vq_chain *c)
{
    struct vhd_inflight_packed *inf = vq->inf.packed;
    uint32_t dn = vq->inf_desc_num;
    uint16_t head = vq->inf_resubmit[vq->inf_resubmit_pos];
    uint64_t total = 0;
    uint16_t id = 0;

    if (vhd_unlikely(vq->inflight >= vq->size))
        return vhd_vq__fail(vq, VHD_VQ_E_AVAIL_IDX);
    if (max_iov > PACKED_MAX_IOV)
        max_iov = PACKED_MAX_IOV;
    c->nr = c->nw = 0;
    c->rlen = c->wlen = 0;

    /*
     * The chain's length as start checked it (its slots are what start
     * placed last_avail_idx after); the head record must still say so.
     */
    uint16_t num = vq->inf_resubmit_num[vq->inf_resubmit_pos];
    if (vhd_unlikely(vhd_load_relaxed(&inf->desc[vhd_index_nospec(head, dn)].num) != num))
        return vhd_vq__fail(vq, VHD_VQ_E_INFLIGHT);
    uint16_t rec = head;
    for (uint32_t k = 0; k < num; k++) {
        if (vhd_unlikely(rec >= dn))
            return vhd_vq__fail(vq, VHD_VQ_E_INFLIGHT);
        struct vhd_inflight_packed_desc r;
        memcpy(&r, &inf->desc[vhd_index_nospec(rec, dn)], sizeof(r));
        __asm__ volatile("" ::: "memory"); /* each field read once */
        uint16_t flags = r.flags;
        if (k + 1 < num && (flags & VRING_DESC_F_INDIRECT))
            return vhd_vq__fail(vq, VHD_VQ_E_INDIRECT_FLAGS);
        if (k + 1 == num)
            flags &= (uint16_t)~VRING_DESC_F_NEXT;
        int rc = packed_map_one(vq, r.addr, r.len, flags, k == 0, iov, max_iov, c, &total, NULL);
        if (vhd_unlikely(rc < 0))
            return vhd_vq__pop_rc(rc);
        id = r.id;
        rec = r.next;
    }
    if (vhd_unlikely(id >= vq->size))
        return vhd_vq__fail(vq, VHD_VQ_E_BUFFER_ID);
    c->id = (uint16_t)vhd_index_nospec(id, vq->size);
    /*
     * Start checked the ids of all chains in flight (each below the size,
     * none twice) and recorded the head record of each. The area may have
     * been rewritten since: a chain whose id is no longer the one start
     * recorded for it would share an id with another chain in flight.
     */
    if (vhd_unlikely(vq->inf_head_of_id[c->id] != head))
        return vhd_vq__fail(vq, VHD_VQ_E_INFLIGHT);
    c->ndescs = num;
    vq->inf_resubmit_pos++;
    vq->inflight++;
    return 1;
}

/*
 * Pop one chain (2.8.6, 2.8.7, 2.8.15, 2.8.18). Contract in vq.h
 * (vhd_vq_pop): 1 with *c and iov filled, 0 when nothing is available,
 * -enum vhd_vq_err with the queue broken.
 *
 * Chain rules enforced:
 *  - every slot of a chain (consecutive slots, wrapping at size and then
 *    toggling the wrap counter) must itself be available (2.8.6: all flags
 *    are set in every descriptor, the first one made available last),
 *    otherwise PACKED_CHAIN; a chain may not run into the slots the device
 *    owns (PACKED_CHAIN) nor be longer than the ring (CHAIN_LOOP);
 *  - the buffer id is the LAST descriptor's (2.8.6), < size (BUFFER_ID);
 *  - INDIRECT needs VIRTIO_F_INDIRECT_DESC (INDIRECT_NOFEAT, 2.8.19) and
 *    must be a chain of its own: INDIRECT with NEXT, or inside a
 *    NEXT-linked list, is forbidden by 2.8.19 (INDIRECT_FLAGS). WRITE on
 *    the descriptor that points at a table is reserved and ignored by the
 *    device (2.8.7), so it is accepted;
 *  - readable before writable, length and iovec limits: vhd_vq__map_desc.
 */
static inline __attribute__((always_inline)) int packed_pop(struct vhd_vq *vq, struct iovec *iov,
                                                            uint32_t max_iov,
                                                            struct vhd_vq_chain *c, bool tracked)
{
    struct vhd_vring_packed_desc *ring = vq->ring.packed.desc;
    uint32_t size = vq->size;
    struct vhd_inflight_packed *inf = tracked ? vq->inf.packed : NULL;

    uint16_t slot = vq->last_avail_idx;
    bool wrap = vq->avail_wrap;

    uint32_t owned = device_owned(vq);
    if (vhd_unlikely(owned > size))
        return vhd_vq__fail(vq, VHD_VQ_E_AVAIL_IDX); /* inconsistent SET_VRING_BASE */
    /* Slots the driver may have made available. */
    uint32_t room = size - owned;
    if (room == 0)
        return 0;

    uint16_t flags = slot_flags(&ring[slot]);
    if (!desc_is_avail(flags, wrap))
        return 0;
    if ((slot & 3) == 0 && room > PACKED_PREFETCH_AHEAD) {
        uint32_t ahead = slot + PACKED_PREFETCH_AHEAD;
        __builtin_prefetch(&ring[ahead < size ? ahead : ahead - size]);
    }

    if (max_iov > PACKED_MAX_IOV)
        max_iov = PACKED_MAX_IOV;
    c->nr = c->nw = 0;
    c->rlen = c->wlen = 0;

    /*
     * Inflight (spec, packed, "When receiving available buffers"): the chain
     * takes records from the free list, the head record (first) gets the
     * counter and inflight = 1, each record a copy of its descriptor, and
     * the head record the chain's last record and length. free_head and
     * old_free_head move past the chain only at the end, so a crash in
     * between is rolled back at the next start (the head record, still on
     * the free list, is cleared there).
     */
    uint16_t head_rec = 0, rec = 0, last_rec = 0;
    if (tracked) {
        head_rec = rec = vhd_load_relaxed(&inf->free_head); /* read once: checked, clamped */
        if (vhd_unlikely(rec >= vq->inf_desc_num))
            return vhd_vq__fail(vq, VHD_VQ_E_INFLIGHT);
        struct vhd_inflight_packed_desc *h = &inf->desc[vhd_index_nospec(rec, vq->inf_desc_num)];
        h->counter = vq->inf_counter++;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        h->inflight = 1;
        vq->inf_pop_rec = head_rec; /* a run ending at this pop's error unmarks it */
    }

    uint64_t total = 0;
    uint32_t n = 0;
    uint16_t id;
    for (;;) {
        const struct vhd_vring_packed_desc *d = &ring[slot];
        /* Each guest field read once, after the acquire on this slot's flags. */
        uint64_t addr = vhd_le64(vhd_load_relaxed(&d->addr));
        uint32_t len = vhd_le32(vhd_load_relaxed(&d->len));
        id = vhd_le16(vhd_load_relaxed(&d->id));

        n++;
        int rc = packed_map_one(vq, addr, len, flags, n == 1, iov, max_iov, c, &total, NULL);
        if (vhd_unlikely(rc < 0))
            return vhd_vq__pop_rc(rc);
        if (tracked) {
            if (vhd_unlikely(rec >= vq->inf_desc_num))
                return vhd_vq__fail(vq, VHD_VQ_E_INFLIGHT); /* free list too short */
            struct vhd_inflight_packed_desc *r =
                &inf->desc[vhd_index_nospec(rec, vq->inf_desc_num)];
            r->addr = addr;
            r->len = len;
            r->id = id;
            r->flags = flags;
            last_rec = rec;
            rec = vhd_load_relaxed(&r->next); /* read once: checked, clamped above */
        }

        if (++slot == size) {
            slot = 0;
            wrap = !wrap;
        }
        if (!(flags & VRING_DESC_F_NEXT))
            break;
        if (vhd_unlikely(n == room))
            return vhd_vq__fail(vq, n == size ? VHD_VQ_E_CHAIN_LOOP : VHD_VQ_E_PACKED_CHAIN);
        /*
         * The acquire on the head already orders this slot (the driver wrote
         * it before releasing the head, 2.8.6); acquiring again costs nothing
         * on x86 and keeps drivers that publish slot by slot correct.
         */
        flags = slot_flags(&ring[slot]);
        if (vhd_unlikely(!desc_is_avail(flags, wrap)))
            return vhd_vq__fail(vq, VHD_VQ_E_PACKED_CHAIN);
    }

    if (vhd_unlikely(id >= size))
        return vhd_vq__fail(vq, VHD_VQ_E_BUFFER_ID);
    /* The caller indexes its per-request state with the id: clamp it. */
    c->id = (uint16_t)vhd_index_nospec(id, size);
    c->ndescs = (uint16_t)n; /* n <= room <= size <= 32768 */
    if (tracked) {
        /* A buffer id in flight twice would share (and corrupt) the free list of records. */
        if (vhd_unlikely(vq->inf_head_of_id[c->id] != UINT16_MAX))
            return vhd_vq__fail(vq, VHD_VQ_E_ID_IN_FLIGHT);
        struct vhd_inflight_packed_desc *h =
            &inf->desc[vhd_index_nospec(head_rec, vq->inf_desc_num)];
        h->last = last_rec;
        h->num = (uint16_t)n;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        inf->free_head = rec;
        inf->old_free_head = rec;
        vq->inf_head_of_id[c->id] = head_rec;
    }
    vq->last_avail_idx = slot;
    vq->avail_wrap = wrap;
    vq->inflight++; /* at most one per owned slot, so <= 32768 */
    return 1;
}

/* Pop with inflight tracking: chains to pop again first, then new ones, recorded. */
static __attribute__((noinline)) int packed_pop_tracked(struct vhd_vq *vq, struct iovec *iov,
                                                        uint32_t max_iov, struct vhd_vq_chain *c)
{
    if (vq->inf_resubmit_pos < vq->inf_resubmit_n)
        return packed_pop_resubmit(vq, iov, max_iov, c);
    if (vhd_unlikely(vq->inf_resubmit_only))
        return 0;
    /*
     * The spec's record keeping assumes a pop never falls between the
     * pushes of a batch and its publication (free_head == old_free_head
     * when a pop starts): publish what is pending first. Publishing early
     * is always allowed; need_notify still sees it.
     */
    if (vq->batch_npending)
        vhd_vq__packed_flush(vq);
    int rc = packed_pop(vq, iov, max_iov, c, true);
    /* A new chain after the list: unpop must give it back before any listed one. */
    if (rc == 1 && vq->inf_resubmit_n != 0 && vq->inf_new != UINT16_MAX)
        vq->inf_new++;
    return rc;
}

/* Pop without inflight tracking: the common case. */
static __attribute__((noinline)) int packed_pop_plain(struct vhd_vq *vq, struct iovec *iov,
                                                      uint32_t max_iov, struct vhd_vq_chain *c)
{
    return packed_pop(vq, iov, max_iov, c, false);
}

/* The AVAIL/USED bits of a slot's flags (2.8.1). */
#define PACKED_AM (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED)

/* The run walks read a descriptor as two words: addr, then len | id << 32 | flags << 48. */
_Static_assert(offsetof(struct vhd_vring_packed_desc, len) == 8 &&
                   offsetof(struct vhd_vring_packed_desc, id) == 12 &&
                   offsetof(struct vhd_vring_packed_desc, flags) == 14 &&
                   sizeof(struct vhd_vring_packed_desc) == 16,
               "packed descriptor layout");

/*
 * The buffers of an indirect table (2.8.7) for the fast walk: entries
 * without INDIRECT, each non-empty, in the cached region, in order, with
 * room in iov and within the length limit (pop_indirect's rules; NEXT and
 * the other reserved flags ignored as there). Returns false at the first
 * entry it does not take.
 */
static inline __attribute__((always_inline)) bool
packed_table_fast(const uint8_t *tbl, uint32_t n, struct iovec *iov, uint32_t max_iov,
                  struct iovec **vrp, struct iovec **vp, uint64_t *totalp, uint64_t *rlenp,
                  const struct vhd_vq__rcache *rc)
{
    const uint64_t gpa = rc->gpa, rsize = rc->size;
    struct iovec *v = iov, *vr = NULL;
    uint64_t total = 0, rlen = 0;
    /* Room checked once: one buffer per entry. Readable entries first, as in packed_chain_fast. */
    if (vhd_unlikely(n > max_iov))
        return false;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t addr, hi;
        memcpy(&addr, tbl + 16 * (size_t)i, sizeof(addr));
        memcpy(&hi, tbl + 16 * (size_t)i + 8, sizeof(hi));
        __asm__ volatile("" : "+r"(addr), "+r"(hi)); /* each entry read once */
        addr = vhd_le64(addr);
        hi = vhd_le64(hi);
        uint32_t len = (uint32_t)hi;
        uint32_t flags = (uint32_t)(hi >> 48);
        uint64_t off = addr - gpa;
        if (vhd_unlikely(flags & (VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE))) {
            if (flags & VRING_DESC_F_INDIRECT)
                return false;
            if (vr == NULL) {
                vr = v;
                rlen = total;
            }
        } else if (vhd_unlikely(vr != NULL)) {
            return false; /* a readable entry after a writable one */
        }
        if (vhd_unlikely(!vhd_vq__in_region(off, len, rsize)))
            return false;
        v->iov_base = rc->hva + vhd_vq__clamp(off, rsize);
        v->iov_len = len;
        v++;
        total += len;
    }
    if (vr == NULL) {
        vr = v;
        rlen = total;
    }
    *vrp = vr;
    *vp = v;
    *totalp = total;
    *rlenp = rlen;
    return true;
}

/*
 * A fast walk's *c from id (clamped), nsh (ndescs << 16), vrb and vb (the
 * byte offsets in its iovec array of its first writable buffer and of its
 * end: nr = vrb / 16, nw = (vb - vrb) / 16), rlen and total (the chain's
 * bytes, <= UINT32_MAX), stored as two 8-byte words: stored field by field,
 * the compiler merges the six stores with a dozen shifts.
 */
_Static_assert(offsetof(struct vhd_vq_chain, ndescs) == 2 &&
                   offsetof(struct vhd_vq_chain, nr) == 4 &&
                   offsetof(struct vhd_vq_chain, nw) == 6 &&
                   offsetof(struct vhd_vq_chain, rlen) == 8 &&
                   offsetof(struct vhd_vq_chain, wlen) == 12 && sizeof(struct vhd_vq_chain) == 16,
               "vhd_vq_chain layout");
_Static_assert(sizeof(struct iovec) == 16, "iovec size");

static inline void packed_chain_put(struct vhd_vq_chain *c, uint64_t id, uint64_t nsh, uint64_t vrb,
                                    uint64_t vb, uint64_t rlen, uint64_t total)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /* ndescs = nsh >> 16, nr = vrb / 16 at bit 32, nw = (vb - vrb) / 16 at bit 48 */
    uint64_t w[2] = {id | nsh | vrb << 28 | (vb - vrb) << 44, rlen | (total - rlen) << 32};
    memcpy(c, w, sizeof(w));
#else
    c->id = (uint16_t)id;
    c->ndescs = (uint16_t)(nsh >> 16);
    c->nr = (uint16_t)(vrb / 16);
    c->nw = (uint16_t)((vb - vrb) / 16);
    c->rlen = (uint32_t)rlen;
    c->wlen = (uint32_t)(total - rlen);
#endif
}

/*
 * The end of a fast walk at d (after the chain's last slot): the buffer id
 * (the last descriptor's, 2.8.6, in hi) below size and the chain's bytes
 * within 32 bits, then *c (nsh: its slot count << 16; readable buffers
 * from iov, writable from vr, up to v). Returns d, or NULL when the walk
 * does not take it.
 */
static inline __attribute__((always_inline)) const struct vhd_vring_packed_desc *
packed_chain_end(const struct vhd_vring_packed_desc *d, uint64_t hi, uint32_t size, uint64_t nsh,
                 const struct iovec *iov, const struct iovec *vr, const struct iovec *v,
                 uint64_t rlen, uint64_t total, struct vhd_vq_chain *c)
{
    uint64_t id = (hi >> 32) & 0xffff;
    if (vhd_unlikely(id >= size))
        return NULL;
    if (vhd_unlikely(total > UINT32_MAX))
        return NULL;
    packed_chain_put(c, vhd_vq__clamp(id, size), nsh, (uintptr_t)vr - (uintptr_t)iov,
                     (uintptr_t)v - (uintptr_t)iov, rlen, total);
    return d;
}

/*
 * Inflight records of a tracked run (packed_pop_run with tracked): the
 * area's records and where the run is on their free list. The fast walks
 * write a chain's records as packed_pop does, from the same reads of the
 * descriptors, and only what packed_pop would write for that chain too:
 * a record for each descriptor they take, once its checks passed (the
 * checks packed_pop makes before it writes the copy: the buffer mapped,
 * the chain's bytes within 32 bits, a record left on the free list). A
 * chain they do not take is then popped by packed_pop itself, which writes
 * those records again, with the same values, and more; so the area ends
 * as the per-chain pops leave it. The head record's counter, mark, last
 * and num, and free_head, are written when the chain is taken
 * (packed_rec_commit). rec and last are read from the area once each and
 * checked (rec < dn) before any use, and clamped when they index it.
 */
struct packed_trk {
    struct vhd_inflight_packed_desc *desc; /* the area's records (inf->desc) */
    uint32_t dn;                           /* how many (the queue's inf_desc_num) */
    uint32_t rec;                          /* the next record of the free list (unchecked) */
    uint32_t last;                         /* the chain's last record so far */
    uint16_t *head_of_id;                  /* vq->inf_head_of_id */
    uint64_t counter; /* vq->inf_counter; in packed_stretch, that of the run's chain 0 */
};

/* The area's header, from its records (one register fewer in the walks). */
static inline struct vhd_inflight_packed *packed_trk_inf(const struct packed_trk *t)
{
    return (struct vhd_inflight_packed *)((uint8_t *)t->desc -
                                          offsetof(struct vhd_inflight_packed, desc));
}

/* The record layout the copy below stores in two words (host byte order). */
_Static_assert(offsetof(struct vhd_inflight_packed_desc, id) == 16 &&
                   offsetof(struct vhd_inflight_packed_desc, flags) == 18 &&
                   offsetof(struct vhd_inflight_packed_desc, len) == 20 &&
                   offsetof(struct vhd_inflight_packed_desc, addr) == 24,
               "DescStatePacked layout");

/*
 * Take the next record of the free list for a descriptor a fast walk has
 * taken (addr; hi: len | id << 32 from its second word; flags: those it
 * checked): false when the list has run out (packed_pop fails there), else
 * the copy written as packed_pop writes it and the list followed.
 */
static inline __attribute__((always_inline)) bool
packed_rec_put(struct packed_trk *t, uint64_t addr, uint64_t hi, uint16_t flags)
{
    if (vhd_unlikely(t->rec >= t->dn))
        return false;
    struct vhd_inflight_packed_desc *r = &t->desc[vhd_vq__clamp(t->rec, t->dn)];
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    /*
     * id | flags << 16 | len << 32 in one store: hi rotated by 32 bits
     * (with the flags as this read saw them), then the flags checked
     * stored over those.
     */
    uint64_t w = hi >> 32 | hi << 32;
    memcpy((uint8_t *)r + offsetof(struct vhd_inflight_packed_desc, id), &w, sizeof(w));
    r->flags = flags;
#else
    r->id = (uint16_t)(hi >> 32);
    r->flags = flags;
    r->len = (uint32_t)hi;
#endif
    r->addr = addr;
    t->last = t->rec;
    t->rec = vhd_load_relaxed(&r->next); /* read once: checked at its use, as above */
    return true;
}

/*
 * The end of chain k of the run, which a fast walk took, recorded from
 * record head (its first, checked by packed_rec_put) to t->last, nd slots,
 * buffer id id (clamped): false when the id is in flight already (packed_pop's
 * ID_IN_FLIGHT: the chain is then not taken). Otherwise as packed_pop ends
 * a tracked chain: the head record's counter, then its mark, its last
 * record and length, then free_head and old_free_head past the chain (a
 * crash before them leaves the head record on the free list: start clears
 * it), and the id's head record.
 */
static inline __attribute__((always_inline)) bool
packed_rec_commit(struct packed_trk *t, uint32_t k, uint32_t head, uint32_t id, uint32_t nd)
{
    if (vhd_unlikely(t->head_of_id[id] != UINT16_MAX))
        return false;
    struct vhd_inflight_packed_desc *h = &t->desc[vhd_vq__clamp(head, t->dn)];
    h->counter = t->counter + k;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    h->inflight = 1;
    h->last = (uint16_t)t->last;
    h->num = (uint16_t)nd;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    struct vhd_inflight_packed *inf = packed_trk_inf(t);
    inf->free_head = (uint16_t)t->rec;
    inf->old_free_head = (uint16_t)t->rec;
    t->head_of_id[id] = (uint16_t)head;
    return true;
}

/*
 * The chain at slot (room: the slots the driver owns from slot on) walked
 * with every check, as packed_pop walks it: what the run does with a chain
 * packed_chain_fast did not take. Its head's flags are read again (with
 * acquire): this walk uses only its own reads. Out of line so that the
 * run's loop keeps its state in registers. Returns the chain's slot count
 * with iov and *c filled, 0 when the head is not available (any more), or
 * -enum vhd_vq_err with the queue marked broken. *rc follows the
 * translation hint.
 */
static __attribute__((noinline)) int packed_chain_full(struct vhd_vq *vq, uint32_t slot, bool wrap,
                                                       uint32_t room, struct iovec *iov,
                                                       uint32_t max_iov, struct vhd_vq_chain *c,
                                                       struct vhd_vq__rcache *rc)
{
    const struct vhd_vring_packed_desc *ring = vq->ring.packed.desc;
    uint32_t size = vq->size;
    uint64_t total = 0;
    uint32_t n = 0;
    uint16_t id;

    uint16_t flags = slot_flags(&ring[slot]);
    if (!desc_is_avail(flags, wrap))
        return 0;
    c->nr = c->nw = 0;
    c->rlen = c->wlen = 0;
    for (;;) {
        const struct vhd_vring_packed_desc *d = &ring[slot];
        /* Each guest field read once, after the acquire on this slot's flags. */
        uint64_t addr = vhd_le64(vhd_load_relaxed(&d->addr));
        uint32_t len = vhd_le32(vhd_load_relaxed(&d->len));
        id = vhd_le16(vhd_load_relaxed(&d->id));
        n++;
        int err = packed_map_one(vq, addr, len, flags, n == 1, iov, max_iov, c, &total, rc);
        if (vhd_unlikely(err < 0))
            return err;
        if (++slot == size) {
            slot = 0;
            wrap = !wrap;
        }
        if (!(flags & VRING_DESC_F_NEXT))
            break;
        if (vhd_unlikely(n == room))
            return vhd_vq__fail(vq, n == size ? VHD_VQ_E_CHAIN_LOOP : VHD_VQ_E_PACKED_CHAIN);
        flags = slot_flags(&ring[slot]);
        if (vhd_unlikely(!desc_is_avail(flags, wrap)))
            return vhd_vq__fail(vq, VHD_VQ_E_PACKED_CHAIN);
    }
    if (vhd_unlikely(id >= size))
        return vhd_vq__fail(vq, VHD_VQ_E_BUFFER_ID);
    c->id = (uint16_t)vhd_index_nospec(id, size);
    c->ndescs = (uint16_t)n;
    return (int)n; /* n <= room <= size <= 32768 */
}

/*
 * The fast walks of a run (packed_chain_fast, packed_group_fast,
 * packed_stretch) are compiled twice from vq_packed_walk.h: without
 * inflight tracking, and with it (PACKED_WALK_TRACKED 1: names with _tr,
 * a struct packed_trk *tr more, the records written). The tracked lines
 * are #if blocks, so the untracked walk is compiled from exactly the code
 * it had before tracked runs took it: gcc allocates a walk's registers
 * from its whole body, dead branches included, and a shared body with a
 * tracking pointer cost the untracked run 2 to 3 instructions per request
 * (vq-bench packed 146 -> 148, --indirect 178 -> 181).
 */
#define PACKED_WALK_TRACKED 0
#include "vq_packed_walk.h"
#undef PACKED_WALK_TRACKED
#define PACKED_WALK_TRACKED 1
#include "vq_packed_walk.h"
#undef PACKED_WALK_TRACKED

static __attribute__((noinline)) uint32_t
packed_stretch_burst(const struct vhd_vring_packed_desc **dp,
                     const struct vhd_vring_packed_desc *dend, uint32_t size, uint16_t want,
                     bool ind_ok, const struct vhd_vq__out *o, uint32_t k, uint32_t max,
                     const struct vhd_vq__rcache *rc, bool *gap)
{
    const struct vhd_vq__out ob = {
        .iov = o->iov, .c = o->c, .stride = o->stride, .max_iov = o->max_iov};
    return packed_stretch(dp, dend, size, want, ind_ok, ob, k, max, rc, gap);
}

static __attribute__((noinline)) uint32_t
packed_stretch_burstv(const struct vhd_vring_packed_desc **dp,
                      const struct vhd_vring_packed_desc *dend, uint32_t size, uint16_t want,
                      bool ind_ok, const struct vhd_vq__out *o, uint32_t k, uint32_t max,
                      const struct vhd_vq__rcache *rc, bool *gap)
{
    const struct vhd_vq__out ov = {.iovs = o->iovs, .cs = o->cs, .max_iov = o->max_iov};
    return packed_stretch(dp, dend, size, want, ind_ok, ov, k, max, rc, gap);
}

/* The same with inflight tracking (packed_pop_run with tracked). */
static __attribute__((noinline)) uint32_t
packed_stretch_burst_tr(const struct vhd_vring_packed_desc **dp,
                        const struct vhd_vring_packed_desc *dend, uint32_t size, uint16_t want,
                        bool ind_ok, const struct vhd_vq__out *o, uint32_t k, uint32_t max,
                        const struct vhd_vq__rcache *rc, bool *gap, struct packed_trk *tp)
{
    const struct vhd_vq__out ob = {
        .iov = o->iov, .c = o->c, .stride = o->stride, .max_iov = o->max_iov};
    struct packed_trk t = *tp; /* a local copy: kept in registers */
    t.counter -= k;            /* chain k's counter is t.counter + k */
    k = packed_stretch_tr(dp, dend, size, want, ind_ok, ob, k, max, rc, gap, &t);
    t.counter += k;
    *tp = t;
    return k;
}

static __attribute__((noinline)) uint32_t
packed_stretch_burstv_tr(const struct vhd_vring_packed_desc **dp,
                         const struct vhd_vring_packed_desc *dend, uint32_t size, uint16_t want,
                         bool ind_ok, const struct vhd_vq__out *o, uint32_t k, uint32_t max,
                         const struct vhd_vq__rcache *rc, bool *gap, struct packed_trk *tp)
{
    const struct vhd_vq__out ov = {.iovs = o->iovs, .cs = o->cs, .max_iov = o->max_iov};
    struct packed_trk t = *tp; /* a local copy: kept in registers */
    t.counter -= k;            /* chain k's counter is t.counter + k */
    k = packed_stretch_tr(dp, dend, size, want, ind_ok, ov, k, max, rc, gap, &t);
    t.counter += k;
    *tp = t;
    return k;
}

/*
 * A run of up to max new chains (vhd_vq_pop_burst in vq.h): the ring's
 * state (owned slots, position, region) is loaded once and kept in
 * locals. The slots the driver owns are taken in stretches that do not
 * cross the ring's end (at most two per run, plus one after each chain the
 * full walk takes): inside one the wrap counter, and so the AVAIL/USED bits
 * of an available slot, are constants and no position wraps, and
 * packed_stretch takes the common chains (out of line: its loop has the
 * registers to itself). A chain it does not take (a chain across the
 * ring's end among them) is walked with pop's checks and errors by
 * packed_chain_full. A chain that fails after the first ends the run
 * before it with the queue not broken (the failing walk changed only
 * vq->error and its own iov/c); the next pop walks it again.
 *
 * Tracked (inflight, no chain left to pop again: packed_pop_run_any): a
 * batch pending is published first, as packed_pop_tracked does; the
 * stretches record each chain they take as packed_pop does (packed_trk),
 * and a chain they do not take is popped by packed_pop_tracked itself
 * (the run's state stored before, loaded again after), so every record,
 * error and position is the per-chain pops'. That pop failing after the
 * first chain: the head record it marked is unmarked and its counter taken
 * back (packed_pop_run_tracked), the queue not broken.
 */
static inline __attribute__((always_inline)) int
packed_pop_run(struct vhd_vq *vq, const struct vhd_vq__out oo, uint32_t max, bool tracked)
{
    const struct vhd_vq__out *o = &oo; /* by value: its fields are constants of each caller */
    const struct vhd_vring_packed_desc *ring = vq->ring.packed.desc;
    const uint32_t size = vq->size;
    const uint32_t max_iov = o->max_iov > PACKED_MAX_IOV ? PACKED_MAX_IOV : o->max_iov;
    struct packed_trk trk = {0};
    uint32_t nrec = 0; /* chains the stretches recorded */

    if (tracked) {
        if (vq->batch_npending)
            vhd_vq__packed_flush(vq);
        trk.desc = vq->inf.packed->desc;
        trk.dn = vq->inf_desc_num;
        trk.rec = vhd_load_relaxed(&vq->inf.packed->free_head); /* read once: checked at its use */
        trk.counter = vq->inf_counter;
        trk.head_of_id = vq->inf_head_of_id;
    }
    uint32_t owned = device_owned(vq);
    if (vhd_unlikely(owned > size))
        return vhd_vq__fail(vq, VHD_VQ_E_AVAIL_IDX); /* inconsistent SET_VRING_BASE */
    uint32_t slot = vq->last_avail_idx;
    /* The slots the driver owns: [slot, lim) counted on past the ring's end (lim < 2 * size). */
    uint32_t lim = slot + (size - owned);
    uint16_t want = vq->avail_wrap ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED;
    const bool ind_ok = vq->indirect;
    struct vhd_vq__rcache rc;
    vhd_vq__rcache_load(vq, &rc);
    int err = 0;
    uint32_t k = 0, kin = 0; /* kin: chains already counted in vq->inflight (tracked) */

    while (k < max && slot < lim) {
        /* A stretch: up to the ring's end or the end of the driver's slots. */
        const uint32_t end = lim < size ? lim : size;
        const struct vhd_vring_packed_desc *d = ring + slot, *const dend = ring + end;
        bool gap = false;
        uint32_t k0 = k;
        if (tracked)
            k = o->iovs ? packed_stretch_burstv_tr(&d, dend, size, want, ind_ok, o, k, max, &rc,
                                                   &gap, &trk)
                        : packed_stretch_burst_tr(&d, dend, size, want, ind_ok, o, k, max, &rc,
                                                  &gap, &trk);
        else
            k = o->iovs ? packed_stretch_burstv(&d, dend, size, want, ind_ok, o, k, max, &rc, &gap)
                        : packed_stretch_burst(&d, dend, size, want, ind_ok, o, k, max, &rc, &gap);
        nrec += k - k0;
        slot = (uint32_t)(d - ring);
        if (d == dend) {
            if (slot == size) {
                slot = 0;
                lim -= size;
                want ^= PACKED_AM;
            }
            continue;
        }
        if (k == max || gap)
            break;
        if (tracked) {
            /* A chain the fast walks do not take: the tracked pop, from the run's state. */
            vq->last_avail_idx = (uint16_t)slot;
            vq->avail_wrap = want == VRING_PACKED_DESC_F_AVAIL;
            vq->inflight = (uint16_t)(vq->inflight + (k - kin));
            vq->inf_counter = trk.counter;
            uint64_t counter = trk.counter;
            int n =
                packed_pop_tracked(vq, vhd_vq__out_iov(o, k), o->max_iov, vhd_vq__out_chain(o, k));
            kin = k;
            if (vhd_unlikely(n <= 0)) {
                if (n < 0 && k != 0 && vq->inf_counter != counter) {
                    struct vhd_inflight_packed_desc *h =
                        &trk.desc[vhd_index_nospec(vq->inf_pop_rec, trk.dn)];
                    h->inflight = 0;
                    vq->inf_counter = counter;
                }
                trk.counter = vq->inf_counter;
                err = n;
                break;
            }
            kin = ++k;
            slot = vq->last_avail_idx;
            want = vq->avail_wrap ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED;
            lim = slot + (size - device_owned(vq)); /* owned <= size: the pop kept it so */
            trk.rec = vhd_load_relaxed(&vq->inf.packed->free_head);
            trk.counter = vq->inf_counter;
            vhd_vq__rcache_load(vq, &rc); /* the pop may have moved the hint */
            continue;
        }
        /* A chain the fast walks do not take: walked with every check. */
        int n = packed_chain_full(vq, slot, want == VRING_PACKED_DESC_F_AVAIL, lim - slot,
                                  vhd_vq__out_iov(o, k), max_iov, vhd_vq__out_chain(o, k), &rc);
        if (vhd_unlikely(n <= 0)) {
            err = n;
            break;
        }
        k++;
        slot += (uint32_t)n;
        if (slot >= size) {
            slot -= size;
            lim -= size;
            want ^= PACKED_AM;
        }
    }
    vq->last_avail_idx = (uint16_t)slot;
    vq->avail_wrap = want == VRING_PACKED_DESC_F_AVAIL;
    vq->inflight = (uint16_t)(vq->inflight + (k - kin));
    if (tracked) {
        vq->inf_counter = trk.counter;
        /* New chains after the list (packed_pop_tracked counts its own). */
        if (vq->inf_resubmit_n != 0 && nrec != 0) {
            uint32_t nn = vq->inf_new + nrec;
            vq->inf_new = (uint16_t)(nn < UINT16_MAX ? nn : UINT16_MAX);
        }
        if (vhd_unlikely(err < 0)) {
            if (k == 0)
                return err;        /* packed_pop_tracked's */
            vq->error = VHD_VQ_OK; /* broken by the next pop, after this run is completed */
        }
        return (int)k;
    }
    if (vhd_unlikely(err < 0)) {
        if (k == 0)
            return vhd_vq__pop_rc(err);
        vq->error = VHD_VQ_OK; /* broken by the next pop, after this run is completed */
    }
    return (int)k;
}

/*
 * A run with inflight tracking while chains are left to pop again (or only
 * those may be popped): one tracked pop per chain (records as vhd_vq_pop
 * writes them). A chain failing after the first ends the run with the
 * queue not broken; the head record its pop had marked in flight (still on
 * the free list: free_head did not move) is unmarked and its counter taken
 * back, as unpop does, so the area says what it said before.
 */
static __attribute__((noinline)) int
packed_pop_run_tracked(struct vhd_vq *vq, const struct vhd_vq__out *o, uint32_t max)
{
    uint32_t k;
    for (k = 0; k < max; k++) {
        uint64_t counter = vq->inf_counter;
        int rc = packed_pop_tracked(vq, vhd_vq__out_iov(o, k), o->max_iov, vhd_vq__out_chain(o, k));
        if (rc == 0)
            break;
        if (vhd_unlikely(rc < 0)) {
            if (k == 0)
                return rc;
            if (vq->inf_counter != counter) {
                vq->inf.packed->desc[vhd_index_nospec(vq->inf_pop_rec, vq->inf_desc_num)].inflight =
                    0;
                vq->inf_counter = counter;
            }
            vq->error = VHD_VQ_OK;
            break;
        }
    }
    return (int)k;
}

/*
 * With inflight tracking: chains to pop again go one by one (their own
 * path); new ones as a tracked run. Out of line, once per output kind: the
 * untracked run pays one pointer test.
 */
static __attribute__((noinline)) int packed_pop_run_inf(struct vhd_vq *vq,
                                                        const struct vhd_vq__out *o, uint32_t max)
{
    if (vq->inf_resubmit_pos < vq->inf_resubmit_n || vq->inf_resubmit_only)
        return packed_pop_run_tracked(vq, o, max);
    return o->iovs ? packed_pop_run(vq,
                                    (const struct vhd_vq__out){
                                        .iovs = o->iovs, .cs = o->cs, .max_iov = o->max_iov},
                                    max, true)
                   : packed_pop_run(
                         vq,
                         (const struct vhd_vq__out){
                             .iov = o->iov, .c = o->c, .stride = o->stride, .max_iov = o->max_iov},
                         max, true);
}

int vhd_vq__packed_pop_burst(struct vhd_vq *vq, struct iovec *iov, uint32_t stride,
                             struct vhd_vq_chain *c, uint32_t max)
{
    const struct vhd_vq__out o = {.iov = iov, .c = c, .stride = stride, .max_iov = stride};
    if (vhd_unlikely(vq->inf.any != NULL))
        return packed_pop_run_inf(vq, &o, max);
    return packed_pop_run(vq, o, max, false);
}

int vhd_vq__packed_pop_burstv(struct vhd_vq *vq, struct iovec *const *iovs, uint32_t max_iov,
                              struct vhd_vq_chain *const *cs, uint32_t max)
{
    const struct vhd_vq__out o = {.iovs = iovs, .cs = cs, .max_iov = max_iov};
    if (vhd_unlikely(vq->inf.any != NULL))
        return packed_pop_run_inf(vq, &o, max);
    return packed_pop_run(vq, o, max, false);
}

/*
 * The body is instantiated twice so the untracked path pays one pointer
 * test; both are separate functions so this one is a test and a tail call
 * (neither pays for the other's register saves).
 */
int vhd_vq__packed_pop(struct vhd_vq *vq, struct iovec *iov, uint32_t max_iov,
                       struct vhd_vq_chain *c)
{
    if (vhd_unlikely(vq->inf.any != NULL))
        return packed_pop_tracked(vq, iov, max_iov, c);
    return packed_pop_plain(vq, iov, max_iov, c);
}

/*
 * Write one used descriptor (2.8.3, 2.8.4, 2.8.6, 2.8.22) at used_idx:
 * id, len = written, flags AVAIL and USED both equal to the device wrap
 * counter (2.8.1), plus WRITE when anything was written (2.8.3: WRITE in a
 * used descriptor says data was written; 2.8.4: len is reserved without it,
 * so written == 0 leaves WRITE clear). Then skip c->ndescs slots: the driver
 * skips by the slot count it recorded for the id (2.8.6).
 *
 * The first descriptor of an unpublished batch keeps its flags back; flush
 * stores them last (the multi-buffer rule of 2.8.9 applied to a batch). The
 * driver polls only the slot after the last one it consumed (2.8.2), which
 * is that head, so it sees nothing of the batch before flush. Later
 * descriptors of the batch store their flags now, with release after id/len;
 * the head's release store at flush orders them all anyway.
 *
 * c must come from pop on this queue and be pushed once. Checks: c->id <
 * size (BUFFER_ID); a chain is in flight and c->ndescs fits in the slots
 * consumed but not yet used (USED_OVERFLOW), so a caller bug can never make
 * us overwrite a descriptor the device has not read.
 */
static inline __attribute__((always_inline)) int
packed_push_one(struct vhd_vq *vq, const struct vhd_vq_chain *c, uint32_t written)
{
    uint32_t size = vq->size;

    if (vhd_unlikely(c->id >= size))
        return vhd_vq__fail(vq, VHD_VQ_E_BUFFER_ID);
    uint32_t outstanding =
        pos_dist(size, vq->used_idx, vq->used_wrap, vq->last_avail_idx, vq->avail_wrap);
    if (vhd_unlikely(vq->inflight == 0 || c->ndescs == 0 || c->ndescs > outstanding))
        return vhd_vq__fail(vq, VHD_VQ_E_USED_OVERFLOW);

    struct vhd_vring_packed_desc *d = &vq->ring.packed.desc[vq->used_idx];
    uint16_t flags = vq->used_wrap ? (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED) : 0;
    if (written)
        flags |= VRING_DESC_F_WRITE;

    vhd_store_relaxed(&d->id, vhd_le16(c->id));
    vhd_store_relaxed(&d->len, vhd_le32(written));
    if (vq->batch_npending == 0) {
        vq->batch_head = vq->used_idx;
        vq->batch_head_flags = flags;
    } else {
        /* Release: id/len before flags; pairs with the driver's acquire of flags. */
        vhd_store_release(&d->flags, vhd_le16(flags));
    }
    vq->batch_npending++; /* <= inflight <= 32768 */
    if (vhd_unlikely(vq->inf.any != NULL)) {
        /*
         * Inflight: give the chain's records back to the free list (its last
         * record's next -> free_head, free_head -> its head record). The
         * records stay marked in flight until flush has published the batch.
         */
        struct vhd_inflight_packed *inf = vq->inf.packed;
        uint32_t dn = vq->inf_desc_num;
        uint16_t id = (uint16_t)vhd_index_nospec(c->id, size);
        uint16_t head = vq->inf_head_of_id[id];
        vq->inf_head_of_id[id] = UINT16_MAX;
        uint16_t last = vhd_load_relaxed(&inf->desc[vhd_index_nospec(head, dn)].last);
        inf->desc[vhd_index_nospec(last, dn)].next = vhd_load_relaxed(&inf->free_head);
        inf->free_head = head;
    }

    uint32_t next = (uint32_t)vq->used_idx + c->ndescs;
    if (next >= size) {
        next -= size;
        vq->used_wrap = !vq->used_wrap;
    }
    vq->used_idx = (uint16_t)next;
    vq->inflight--;
    return 0;
}

int vhd_vq__packed_push(struct vhd_vq *vq, const struct vhd_vq_chain *c, uint32_t written)
{
    return packed_push_one(vq, c, written);
}

/*
 * vhd_vq_push_burst: push's checks and stores for each chain, in its order
 * (BUFFER_ID, then USED_OVERFLOW), with the position, wrap counter, the
 * slots outstanding (used position up to the avail position: push's
 * bound, less each chain's slots as it is used) and the batch state kept
 * in locals and stored once. With inflight tracking, packed_push_run_tr.
 */
/*
 * One chain of packed_push_run: its checks (BUFFER_ID, then USED_OVERFLOW:
 * nd is 0 or above the slots outstanding), then the used descriptor at *u
 * (id, len, and the flags now, or kept back as the batch head's when head),
 * and the position past its slots. false (and *err) when a check fails.
 */
static inline __attribute__((always_inline)) bool
packed_push_slot(struct vhd_vq *vq, struct vhd_vring_packed_desc *ring, uint32_t size,
                 const struct vhd_vq_chain *c, uint32_t wr, bool head, uint32_t *u, bool *uw,
                 uint16_t *base, uint32_t *outstanding, int *err)
{
    uint32_t nd = c->ndescs, id = c->id;
    if (vhd_unlikely(id >= size)) {
        *err = vhd_vq__fail(vq, VHD_VQ_E_BUFFER_ID);
        return false;
    }
    if (vhd_unlikely(nd - 1 >= *outstanding)) {
        *err = vhd_vq__fail(vq, VHD_VQ_E_USED_OVERFLOW);
        return false;
    }
    uint16_t flags = (uint16_t)(*base | (wr ? VRING_DESC_F_WRITE : 0));
    struct vhd_vring_packed_desc *d = &ring[*u];
    vhd_store_relaxed(&d->id, vhd_le16((uint16_t)id));
    vhd_store_relaxed(&d->len, vhd_le32(wr));
    if (head) {
        vq->batch_head = (uint16_t)*u;
        vq->batch_head_flags = flags;
    } else {
        /* Release: id/len before flags (packed_push_one). */
        vhd_store_release(&d->flags, vhd_le16(flags));
    }
    *outstanding -= nd;
    *u += nd;
    if (*u >= size) {
        *u -= size;
        *uw = !*uw;
        *base = *uw ? (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED) : 0;
    }
    return true;
}

/*
 * The untracked push of a run (vhd_vq__packed_push_burst), with the
 * written test resolved by the caller (hw: written is not NULL). The
 * checks of packed_push_one, in its order, per chain: the buffer id, then
 * one more than in flight or more slots than the driver made available
 * (nd - 1 >= outstanding: nd is 0 or above outstanding); in flight bounds
 * the loop.
 */
static inline __attribute__((always_inline)) int packed_push_run(struct vhd_vq *vq,
                                                                 const struct vhd_vq_chain *c,
                                                                 const uint32_t *written,
                                                                 uint32_t n, bool hw)
{
    struct vhd_vring_packed_desc *ring = vq->ring.packed.desc;
    uint32_t size = vq->size;
    uint32_t u = vq->used_idx, left = vq->inflight, npend = vq->batch_npending;
    bool uw = vq->used_wrap;
    uint32_t outstanding = pos_dist(size, vq->used_idx, uw, vq->last_avail_idx, vq->avail_wrap);
    uint16_t base = uw ? (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED) : 0;
    int err = 0;
    uint32_t m = n <= left ? n : left, k;

    /*
     * The chain that opens a batch keeps its flags back for flush (the
     * batch-head rule of packed_push_one); every later one stores its flags
     * at once. Which chain opens it is known before the loop (the first,
     * when nothing is pending): it is pushed on its own, so the loop's
     * body has no test for it.
     */
    k = 0;
    if (npend == 0 && m != 0) {
        if (!packed_push_slot(vq, ring, size, &c[0], hw ? written[0] : 0, true, &u, &uw, &base,
                              &outstanding, &err))
            goto out;
        k = 1;
    }
    for (; k < m; k++)
        if (!packed_push_slot(vq, ring, size, &c[k], hw ? written[k] : 0, false, &u, &uw, &base,
                              &outstanding, &err))
            break;
out:
    if (vhd_unlikely(k == m && m < n)) /* nothing in flight for chain k */
        err = vhd_vq__fail(vq, c[k].id >= size ? VHD_VQ_E_BUFFER_ID : VHD_VQ_E_USED_OVERFLOW);
    vq->used_idx = (uint16_t)u;
    vq->used_wrap = uw;
    vq->inflight = (uint16_t)(left - k);
    vq->batch_npending = (uint16_t)(npend + k); /* <= inflight <= 32768 */
    return err;
}

/*
 * The push of a run with inflight tracking: packed_push_run's checks and
 * stores per chain (packed_push_slot, the batch head's flags kept back as
 * there), each chain's records then given back to the free list as
 * packed_push_one gives them (its last record's next -> the free head, the
 * free head -> its head record), with the free head kept in a local and
 * stored once: the same records, in the same order, and the same free_head
 * at the end. Nothing here is seen by a restart before flush publishes the
 * batch (start rolls back to old_free_head until then), so storing
 * free_head once changes no recovery. The head record of each id comes from
 * our own table (UINT16_MAX for an id never popped: clamped, never
 * trusted); indices read from the area are clamped.
 */
static inline __attribute__((always_inline)) int packed_push_run_tr(struct vhd_vq *vq,
                                                                    const struct vhd_vq_chain *c,
                                                                    const uint32_t *written,
                                                                    uint32_t n, bool hw)
{
    struct vhd_vring_packed_desc *ring = vq->ring.packed.desc;
    uint32_t size = vq->size;
    uint32_t u = vq->used_idx, left = vq->inflight, npend = vq->batch_npending;
    bool uw = vq->used_wrap;
    uint32_t outstanding = pos_dist(size, vq->used_idx, uw, vq->last_avail_idx, vq->avail_wrap);
    uint16_t base = uw ? (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED) : 0;
    struct vhd_inflight_packed *inf = vq->inf.packed;
    struct vhd_inflight_packed_desc *rec = inf->desc;
    uint16_t *head_of_id = vq->inf_head_of_id;
    const uint32_t dn = vq->inf_desc_num;
    uint16_t free_head = vhd_load_relaxed(&inf->free_head);
    int err = 0;
    uint32_t m = n <= left ? n : left, k;

    /* The chain that opens a batch first, as in packed_push_run; k == 0 only there. */
    for (k = 0; k < m; k++) {
        if (!packed_push_slot(vq, ring, size, &c[k], hw ? written[k] : 0, k == 0 && npend == 0, &u,
                              &uw, &base, &outstanding, &err))
            break;
        uint32_t id = (uint32_t)vhd_vq__clamp(c[k].id, size); /* < size: packed_push_slot */
        uint16_t head = head_of_id[id];
        head_of_id[id] = UINT16_MAX;
        uint16_t last = vhd_load_relaxed(&rec[vhd_vq__clamp(head, dn)].last);
        rec[vhd_vq__clamp(last, dn)].next = free_head;
        free_head = head;
    }
    if (k != 0)
        inf->free_head = free_head;
    if (vhd_unlikely(k == m && m < n)) /* nothing in flight for chain k */
        err = vhd_vq__fail(vq, c[k].id >= size ? VHD_VQ_E_BUFFER_ID : VHD_VQ_E_USED_OVERFLOW);
    vq->used_idx = (uint16_t)u;
    vq->used_wrap = uw;
    vq->inflight = (uint16_t)(left - k);
    vq->batch_npending = (uint16_t)(npend + k); /* <= inflight <= 32768 */
    return err;
}

static __attribute__((noinline)) int packed_push_burst_tr(struct vhd_vq *vq,
                                                          const struct vhd_vq_chain *c,
                                                          const uint32_t *written, uint32_t n)
{
    return written != NULL ? packed_push_run_tr(vq, c, written, n, true)
                           : packed_push_run_tr(vq, c, NULL, n, false);
}

/*
 * VIRTIO_F_IN_ORDER (2.8.8, "In-order use of descriptors"): the device may
 * tell the driver that a batch of buffers is used with a single used
 * descriptor, written over the batch's first available descriptor, holding
 * the buffer id of its last buffer; both sides then skip the slots of the
 * whole batch, and the driver takes the buffers skipped as used completely.
 * A run is used that way when it is a transmit run: no chain has
 * device-writable bytes and none reports bytes written (split_push_in_order
 * says why). The checks of packed_push_run stay per chain and in its order;
 * on a bad chain the chains before it are the batch. The one descriptor
 * follows the batch-head rule of packed_push_one (flags kept back for
 * flush when it opens the batch); flush logs the run's whole range of
 * slots and need_notify works on positions, so both hold as they are.
 * hw: written is not NULL (resolved by the caller, as for
 * packed_push_run). Returns 1 when the run is not a transmit run (nothing
 * done), else 0 or -enum vhd_vq_err.
 */
static inline __attribute__((always_inline)) int packed_push_in_order(struct vhd_vq *vq,
                                                                      const struct vhd_vq_chain *c,
                                                                      const uint32_t *written,
                                                                      uint32_t n, bool hw)
{
    uint32_t size = vq->size, left = vq->inflight;
    uint32_t outstanding =
        pos_dist(size, vq->used_idx, vq->used_wrap, vq->last_avail_idx, vq->avail_wrap);
    uint32_t m = n <= left ? n : left, k = 0, acc = 0, rem = outstanding;
    int err = 0;

    /* A receive run shows it at its first chain: leave before the walk. */
    if (m != 0 && (c[0].wlen | (hw ? written[0] : 0)) != 0)
        return 1;
    for (; k < m; k++) {
        uint32_t nd = c[k].ndescs;
        if (vhd_unlikely(c[k].id >= size)) {
            err = VHD_VQ_E_BUFFER_ID;
            break;
        }
        if (vhd_unlikely(nd - 1 >= rem)) {
            err = VHD_VQ_E_USED_OVERFLOW;
            break;
        }
        rem -= nd;
        /* Or-ed and tested once, after the walk: a run is rarely mixed. */
        acc |= c[k].wlen | (hw ? written[k] : 0);
    }
    if (acc != 0)
        return 1;
    if (vhd_unlikely(k == m && m < n)) /* nothing in flight for chain k */
        err = c[k].id >= size ? VHD_VQ_E_BUFFER_ID : VHD_VQ_E_USED_OVERFLOW;
    if (vhd_likely(k > 0)) {
        struct vhd_vring_packed_desc *d = &vq->ring.packed.desc[vq->used_idx];
        uint16_t flags = vq->used_wrap ? (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED) : 0;
        vhd_store_relaxed(&d->id, vhd_le16(c[k - 1].id));
        vhd_store_relaxed(&d->len, 0);
        if (vq->batch_npending == 0) {
            vq->batch_head = vq->used_idx;
            vq->batch_head_flags = flags;
        } else {
            /* Release: id/len before flags (packed_push_one). */
            vhd_store_release(&d->flags, vhd_le16(flags));
        }
        vq->batch_npending++; /* <= inflight <= 32768 */
        /*
         * The run's slots are at most outstanding, a lap at most (pop's
         * bound): one wrap. A position pair set_base put more than a lap
         * apart (pos_dist < 2 laps) is taken to two, so used_idx stays a
         * slot whatever the state.
         */
        uint32_t u = vq->used_idx + (outstanding - rem);
        if (u >= size) {
            u -= size;
            vq->used_wrap = !vq->used_wrap;
        }
        if (vhd_unlikely(u >= size)) {
            u -= size;
            vq->used_wrap = !vq->used_wrap;
        }
        vq->used_idx = (uint16_t)u;
        vq->inflight = (uint16_t)(left - k);
    }
    return vhd_unlikely(err) ? vhd_vq__fail(vq, err) : 0;
}

int vhd_vq__packed_push_burst(struct vhd_vq *vq, const struct vhd_vq_chain *c,
                              const uint32_t *written, uint32_t n)
{
    if (vq->in_order && vhd_likely(vq->inf.any == NULL)) {
        int rc = written != NULL ? packed_push_in_order(vq, c, written, n, true)
                                 : packed_push_in_order(vq, c, NULL, n, false);
        if (rc <= 0)
            return rc;
    }
    if (vhd_unlikely(vq->inf.any != NULL))
        return packed_push_burst_tr(vq, c, written, n);
    return written != NULL ? packed_push_run(vq, c, written, n, true)
                           : packed_push_run(vq, c, NULL, n, false);
}

/*
 * Inflight, after the batch head's flags were stored (published): clear the
 * records of the batch, whose heads push chained from free_head (each head's
 * last record links to the previous head), then make the new state the
 * committed one (old_free_head, old_used_idx, old_used_wrap_counter). A
 * crash before that commit is settled at the next start by looking at the
 * ring slot of old_used_idx: published or not. Indices read back from the
 * area are clamped (a scribbling front-end only spoils its own recovery);
 * compiler barriers keep the stores in the spec's order.
 */
static void packed_inflight_flushed(struct vhd_vq *vq, struct vhd_inflight_packed *inf)
{
    uint32_t dn = vq->inf_desc_num;
    uint16_t free_head = vhd_load_relaxed(&inf->free_head), h = free_head;

    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    for (uint32_t k = 0; k < vq->batch_npending; k++) {
        struct vhd_inflight_packed_desc *r = &inf->desc[vhd_index_nospec(h, dn)];
        r->inflight = 0;
        uint16_t last = vhd_load_relaxed(&r->last);
        h = vhd_load_relaxed(&inf->desc[vhd_index_nospec(last, dn)].next);
    }
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    inf->old_free_head = free_head;
    inf->old_used_idx = vq->used_idx;
    inf->old_used_wrap_counter = vq->used_wrap;
}

/*
 * Dirty logging, after the batch is published: the used descriptors written
 * from slot `from` up to used_idx (wrapping), `slots` of them (1..size).
 */
static __attribute__((noinline)) void packed_log_flush(struct vhd_vq *vq, uint16_t from,
                                                       uint32_t slots)
{
    uint32_t run = slots < vq->size - (uint32_t)from ? slots : vq->size - (uint32_t)from;

    vhd_vq__log_desc(vq, 16ull * from, 16ull * run);
    if (slots > run)
        vhd_vq__log_desc(vq, 0, 16ull * (slots - run));
}

/*
 * Publish the batch: store the head's flags with release, last. It orders
 * every id/len/flags store of the batch before it, and pairs with the
 * driver's acquire load of that slot's flags (2.8.22): one store publishes
 * the whole batch.
 *
 * Positions repeat every two laps, so need_notify cannot tell "nothing new"
 * from "two laps" by positions alone when the caller flushes several times
 * between two decisions. So flush keeps count: while signalled_used is
 * valid, the slots published since it are at most a lap (exact); once a
 * flush takes them past a lap, signalled_used is dropped and the next
 * decision notifies unless interrupts are disabled.
 */
void vhd_vq__packed_flush(struct vhd_vq *vq)
{
    if (vq->batch_npending == 0)
        return;
    if (vq->signalled_used_valid) {
        uint16_t sig = vq->signalled_used;
        uint32_t before = pos_dist(vq->size, sig & PACKED_POS_SLOT, sig >> 15, vq->published_used,
                                   vq->published_used_wrap);
        /* A batch is 1..size slots (push's outstanding check); a full lap reads as size. */
        uint32_t batch = pos_dist(vq->size, vq->published_used, vq->published_used_wrap,
                                  vq->used_idx, vq->used_wrap);
        if (before + batch > vq->size)
            vq->signalled_used_valid = false;
    }
    struct vhd_inflight_packed *inf = vq->inf.packed;
    if (vhd_unlikely(inf != NULL)) {
        /* Inflight, spec order: the new used position first... */
        inf->used_idx = vq->used_idx;
        inf->used_wrap_counter = vq->used_wrap;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
    }
    vhd_store_release(&vq->ring.packed.desc[vq->batch_head].flags, vhd_le16(vq->batch_head_flags));
    if (vhd_unlikely(inf != NULL))
        packed_inflight_flushed(vq, inf);
    if (vhd_unlikely(vq->log != NULL))
        packed_log_flush(vq, vq->published_used,
                         pos_dist(vq->size, vq->published_used, vq->published_used_wrap,
                                  vq->used_idx, vq->used_wrap));
    vq->published_used = vq->used_idx;
    vq->published_used_wrap = vq->used_wrap;
    vq->batch_npending = 0;
}

/*
 * Used buffer notification decision (2.8.10, 2.8.14), after a flush.
 * Nothing published since the last decision -> no (as the split layout: an
 * interrupt with nothing new to collect is pure cost). Otherwise, by the
 * Driver Event Suppression flags: DISABLE -> no; DESC (only meaningful with
 * VIRTIO_F_EVENT_IDX) -> yes when the position the driver named was used
 * since the last decision (signalled_used, encoded slot | wrap << 15, to
 * published_used), or when there is no valid last decision (first one, or
 * more than a lap published since: see flush); ENABLE, DESC without
 * EVENT_IDX, or the reserved value 3 -> yes. Every call records
 * published_used as the new signalled position.
 */
bool vhd_vq__packed_need_notify(struct vhd_vq *vq)
{
    const struct vhd_vring_packed_event *drv = vq->ring.packed.driver;
    uint16_t new_pos = pos_encode(vq->published_used, vq->published_used_wrap);
    uint16_t old_pos = vq->signalled_used;
    bool old_valid = vq->signalled_used_valid;

    /* No store of ours to order against the driver's state: no barrier needed. */
    if (old_valid && new_pos == old_pos)
        return false;
    vq->signalled_used = new_pos;
    vq->signalled_used_valid = true;

    /*
     * Store->load: the flags store that published the batch (flush) must be
     * visible before we read the driver's suppression, or we may read a
     * stale DISABLE while the driver, having just enabled, re-reads our old
     * ring and goes to sleep. Pairs with the driver's full barrier between
     * writing its event area and re-checking the ring (2.8.22's note).
     */
    vhd_smp_mb();
    /* Acquire: the driver writes off_wrap before flags; read them as a pair. */
    uint16_t flags = vhd_le16(vhd_load_acquire(&drv->flags)) & 3;
    if (flags == VRING_PACKED_EVENT_FLAG_DISABLE)
        return false;
    if (flags != VRING_PACKED_EVENT_FLAG_DESC || !vq->event_idx || !old_valid)
        return true;
    uint16_t off_wrap = vhd_le16(vhd_load_relaxed(&drv->off_wrap));
    return packed_need_event(vq->size, off_wrap, new_pos, old_pos);
}

/*
 * Ask for available buffer notifications, then re-check the ring.
 * Device Event Suppression (2.8.10, 2.8.14): with EVENT_IDX, DESC at our
 * next slot to read (off_wrap stored before flags, which is stored with
 * release so a driver that sees DESC sees the offset); otherwise ENABLE.
 */
bool vhd_vq__packed_enable_notify(struct vhd_vq *vq)
{
    struct vhd_vring_packed_event *dev = vq->ring.packed.device;

    if (vq->event_idx) {
        vhd_store_relaxed(&dev->off_wrap, vhd_le16(pos_encode(vq->last_avail_idx, vq->avail_wrap)));
        vhd_store_release(&dev->flags, vhd_le16(VRING_PACKED_EVENT_FLAG_DESC));
    } else {
        vhd_store_relaxed(&dev->flags, vhd_le16(VRING_PACKED_EVENT_FLAG_ENABLE));
    }
    if (vhd_unlikely(vq->log != NULL))
        vhd_vq__log_used(vq, 0, sizeof(*dev));
    /*
     * The classic race: the driver may have made a descriptor available
     * after our last look and, reading our old DISABLE, not kicked. A full
     * barrier (store->load) puts our enable before the re-read below; it
     * pairs with the driver's full barrier between storing descriptor flags
     * and reading this area (2.8.21.2). Either the driver sees the enable
     * and kicks, or we see its descriptor here and return true.
     */
    vhd_smp_mb();
    return avail_ready(vq);
}

/* No available buffer notifications wanted: we are polling. */
void vhd_vq__packed_disable_notify(struct vhd_vq *vq)
{
    vhd_store_relaxed(&vq->ring.packed.device->flags, vhd_le16(VRING_PACKED_EVENT_FLAG_DISABLE));
    if (vhd_unlikely(vq->log != NULL))
        vhd_vq__log_used(vq, 0, sizeof(struct vhd_vring_packed_event));
}

/* A chain is available at last_avail_idx. */
bool vhd_vq__packed_has_work(struct vhd_vq *vq)
{
    return avail_ready(vq);
}

/*
 * Give back the chain popped last (vhd_vq_unpop, after the inflight part in
 * inflight.c): its ndescs slots become available again. They must still be
 * outstanding (popped, nothing pushed over them), or c is not the last pop.
 */
int vhd_vq__packed_unpop(struct vhd_vq *vq, const struct vhd_vq_chain *c)
{
    uint32_t size = vq->size;
    uint32_t outstanding =
        pos_dist(size, vq->used_idx, vq->used_wrap, vq->last_avail_idx, vq->avail_wrap);

    if (c->ndescs == 0 || c->ndescs > outstanding)
        return vhd_vq__fail(vq, VHD_VQ_E_UNPOP);
    int32_t slot = (int32_t)vq->last_avail_idx - c->ndescs;
    if (slot < 0) {
        slot += (int32_t)size;
        vq->avail_wrap = !vq->avail_wrap;
    }
    vq->last_avail_idx = (uint16_t)slot;
    vq->inflight--;
    if (vq->inf.any) {
        /* Its records go back to the head of the free list, where pop took them. */
        struct vhd_inflight_packed *inf = vq->inf.packed;
        uint16_t id = (uint16_t)vhd_index_nospec(c->id, size); /* < size: vhd_vq_unpop */
        uint16_t head = vq->inf_head_of_id[id];
        vq->inf_head_of_id[id] = UINT16_MAX;
        inf->desc[vhd_index_nospec(head, vq->inf_desc_num)].inflight = 0;
        inf->free_head = head;
        inf->old_free_head = head;
        vq->inf_counter--;
    }
    return 0;
}

/* ---- IOTLB prefault (vhd_vq_prefault) ---- */

/* The buffers of an indirect table, as pop_indirect reads them: 0, 1 (miss) or -1. */
static int packed_prefault_table(struct vhd_vq *vq, uint64_t addr, uint32_t len)
{
    struct iovec seg;

    if (!vq->indirect || len == 0 || (len % sizeof(struct vhd_vring_packed_desc)) ||
        len / sizeof(struct vhd_vring_packed_desc) > VHD_VQ_MAX_INDIRECT)
        return -1;
    int n = vhd_vq__iotlb_map(vq, addr, len, VHD_IOTLB_R, &seg, 1);
    if (n != 1)
        return n == -VHD_VQ_E_IOTLB_MISS ? 1 : -1;
    const uint8_t *tbl = seg.iov_base;
    for (uint32_t i = 0; i < len / sizeof(struct vhd_vring_packed_desc); i++) {
        struct vhd_vring_packed_desc d;
        memcpy(&d, tbl + (size_t)i * sizeof(d), sizeof(d));
        __asm__ volatile("" ::: "memory"); /* each field fetched once (pop_indirect) */
        uint16_t flags = vhd_le16(d.flags);
        if (flags & VRING_DESC_F_INDIRECT)
            return -1;
        int rc = vhd_vq__prefault_buf(vq, vhd_le64(d.addr), vhd_le32(d.len),
                                      flags & VRING_DESC_F_WRITE ? VHD_IOTLB_W : VHD_IOTLB_R);
        if (rc)
            return rc;
    }
    return 0;
}

/*
 * The chains from last_avail_idx, up to max, in slots the driver made
 * available (flags read with acquire, as in the pop): stops at the first
 * miss (1), at a slot not available or a chain the pop will judge (0).
 */
int vhd_vq__packed_prefault(struct vhd_vq *vq, uint32_t max)
{
    const struct vhd_vring_packed_desc *ring = vq->ring.packed.desc;
    uint32_t size = vq->size, owned = device_owned(vq);
    uint16_t slot = vq->last_avail_idx;
    bool wrap = vq->avail_wrap, first = true;

    if (owned >= size)
        return 0;
    for (uint32_t room = size - owned; room && max; room--) {
        const struct vhd_vring_packed_desc *d = &ring[vhd_index_nospec(slot, size)];
        uint16_t flags = slot_flags(d);
        if (!desc_is_avail(flags, wrap))
            return 0;
        uint64_t addr = vhd_le64(vhd_load_relaxed(&d->addr));
        uint32_t len = vhd_le32(vhd_load_relaxed(&d->len));
        int rc;
        if (flags & VRING_DESC_F_INDIRECT)
            rc = first && !(flags & VRING_DESC_F_NEXT) ? packed_prefault_table(vq, addr, len) : -1;
        else
            rc = vhd_vq__prefault_buf(vq, addr, len,
                                      flags & VRING_DESC_F_WRITE ? VHD_IOTLB_W : VHD_IOTLB_R);
        if (rc)
            return rc > 0;
        first = !(flags & VRING_DESC_F_NEXT);
        if (first)
            max--;
        if (++slot == size) {
            slot = 0;
            wrap = !wrap;
        }
    }
    return 0;
}
