/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Split virtqueue, device side (virtio 1.2, 2.7): pop descriptor chains from
 * the available ring (direct and indirect), push used elements, publish them
 * with one index store per batch, and the notification suppression of both
 * directions (flags, or used_event/avail_event with VIRTIO_F_EVENT_IDX).
 *
 * Everything read from the ring is guest-controlled and may change under our
 * feet: each guest field is read exactly once into a local, checked there,
 * and every guest index is clamped with vhd_index_nospec() after its bounds
 * check. Nothing here asserts on guest data; a violation breaks the queue.
 *
 * Memory ordering, and who pairs with whom:
 *  (A) pop:    acquire load of avail->idx  <->  driver's wmb/release before
 *              its avail->idx store (2.7.13.3.1). Ring entries and
 *              descriptors are read only after it.
 *  (B) flush:  release store of used->idx  <->  driver's acquire/rmb after
 *              reading used->idx, before reading used entries (2.7.14).
 *  (C) need_notify: full barrier between our used->idx store and reading
 *              used_event / avail->flags  <->  driver's mb between writing
 *              used_event / clearing NO_INTERRUPT and re-reading used->idx.
 *  (D) enable_notify: full barrier between writing avail_event / clearing
 *              NO_NOTIFY and re-reading avail->idx  <->  driver's mb between
 *              its avail->idx store and reading avail_event / used->flags
 *              (2.7.13.4.1).
 */
#include <stddef.h>
#include <string.h>

#include "vq.h"

/*
 * Longest iovec a chain can fill: struct vhd_vq_chain counts segments in
 * 16 bits (nr + nw), so a caller's larger array is used only up to here.
 */
#define SPLIT_MAX_IOV UINT16_MAX

/*
 * Pop prefetches the descriptor of the chain this many avail entries ahead
 * (when the driver has published it): the driver wrote it on its own CPU,
 * so reading it is a cache-line transfer, and starting that early overlaps
 * it with the work on the chains in between instead of stalling on it.
 * Measured (perf, io loopback against DPDK's virtio-user on the other CPU):
 * receive-ring pops took 66% of the datapath samples with no prefetch and
 * with 4 ahead, 15% with 16 ahead (a receive pop sits between two frames of
 * work, so the transfer needs that many pops of lead).
 */
#define SPLIT_PREFETCH_AHEAD 16u

/* A descriptor copied out of guest memory, fields in host byte order. */
struct split_desc {
    uint64_t addr;  /* buffer (or indirect table) guest-physical address */
    uint32_t len;   /* buffer (or table) length in bytes */
    uint16_t flags; /* VRING_DESC_F_* as the guest wrote them */
    uint16_t next;  /* next index, meaningful only with VRING_DESC_F_NEXT */
};

/*
 * Copy one descriptor out of guest memory, reading the guest's bytes exactly
 * once. The guest can rewrite a descriptor at any time, so every check and
 * every use must see the same values (no double fetch): the compiler barrier
 * after the copy keeps the compiler from re-reading guest memory in place of
 * the local copy. memcpy needs no alignment; the spec sets none for indirect
 * tables (2.7.5.3), and a guest-placed table must not make us fault.
 */
static inline void split_desc_read(const struct vhd_vring_desc *src, struct split_desc *d)
{
    struct vhd_vring_desc raw;

    memcpy(&raw, src, sizeof(raw));
    __asm__ volatile("" : : : "memory");
    d->addr = vhd_le64(raw.addr);
    d->len = vhd_le32(raw.len);
    d->flags = vhd_le16(raw.flags);
    d->next = vhd_le16(raw.next);
}

/* used_event: the uint16 after avail->ring[size] (2.7.6), guest-written. */
static inline uint16_t *split_used_event(const struct vhd_vq *vq)
{
    return &vq->ring.split.avail->ring[vq->size];
}

/*
 * avail_event: the uint16 after used->ring[size] (2.7.8), at byte offset
 * 4 + 8 * size of the used ring; written by us. map_rings mapped the used
 * ring with it (vhd_vring_used_size()), and it is 4-byte aligned.
 */
static inline uint16_t *split_avail_event(const struct vhd_vq *vq)
{
    return (uint16_t *)(void *)((uint8_t *)vq->ring.split.used + 4 + 8u * vq->size);
}

/*
 * Read avail->idx with acquire semantics (pairing A) and refresh the shadow.
 * The driver can be at most a queue's worth ahead of what we consumed
 * (2.7.13: the ring has size entries and the driver never decrements idx,
 * 2.7.6.1); anything more is a corrupt index and breaks the queue.
 * Returns 0 or -VHD_VQ_E_AVAIL_IDX.
 */
static inline int split_read_avail_idx(struct vhd_vq *vq)
{
    uint16_t idx = vhd_le16(vhd_load_acquire(&vq->ring.split.avail->idx));

    if (vhd_unlikely((uint16_t)(idx - vq->last_avail_idx) > vq->size))
        return vhd_vq__fail(vq, VHD_VQ_E_AVAIL_IDX);
    vq->avail_shadow = idx;
    return 0;
}

/*
 * Switch the walk to the indirect table that d refers to (2.7.5.3).
 * On success *table / *table_size describe the table (its descriptor count).
 *
 * The table must translate into one contiguous host range: a table that
 * crosses a memory-region boundary (or leaves guest memory) is refused with
 * VHD_VQ_E_ADDR. QEMU refuses it too ("Cannot map indirect buffer"), and
 * Linux allocates tables with kmalloc, physically contiguous and far smaller
 * than a region, so a real driver does not hit this.
 * The WRITE flag of d is ignored (2.7.5.3.2).
 */
static int split_enter_indirect(struct vhd_vq *vq, const struct split_desc *d,
                                const struct vhd_vring_desc **table, uint32_t *table_size)
{
    /* 2.7.5.3.1: INDIRECT only when negotiated... */
    if (vhd_unlikely(!vq->indirect))
        return vhd_vq__fail(vq, VHD_VQ_E_INDIRECT_NOFEAT);
    /* ...and never together with NEXT: the table ends the chain. */
    if (vhd_unlikely(d->flags & VRING_DESC_F_NEXT))
        return vhd_vq__fail(vq, VHD_VQ_E_INDIRECT_FLAGS);
    if (vhd_unlikely(d->len == 0 || (d->len & 15) || d->len / 16 > VHD_VQ_MAX_INDIRECT))
        return vhd_vq__fail(vq, VHD_VQ_E_INDIRECT_LEN);
    const void *t =
        vhd_likely(!vq->iotlb) ? vhd_mem_gpa_to_hva(vq->mem, d->addr, d->len, &vq->mem_hint) : NULL;
    if (vhd_unlikely(t == NULL)) {
        int rc = vhd_vq__table_slow(vq, d->addr, d->len, &t);
        if (rc < 0)
            return rc;
    }
    *table = t;
    *table_size = d->len / 16;
    return 0;
}

/*
 * Pop one chain (see vhd_vq_pop in vq.h for the contract).
 *
 * Chain shapes accepted (2.7.5, 2.7.5.3):
 *  - direct descriptors linked by NEXT in the queue's table;
 *  - one descriptor with INDIRECT, alone or at the end of zero or more
 *    direct ones (2.7.5.3.2: "The device MUST handle the case of zero or
 *    more normal chained descriptors followed by a single descriptor with
 *    flags & VIRTQ_DESC_F_INDIRECT"). Readable-before-writable ordering is
 *    checked across the whole chain, direct part and table alike.
 * Zero-length buffers contribute no segment (a chain of only those pops with
 * nr = nw = 0).
 * Loop protection: the walk in the queue's table stops after `size`
 * descriptors and the walk in an indirect table after its length
 * (VHD_VQ_E_CHAIN_LOOP); a chain is therefore bounded by size + table length
 * descriptors even when the guest rewrites it while we read it.
 */
/*
 * Walk the chain starting at head (< size) into iov and *c; the shared part
 * of a new pop and of popping a recorded chain again after a restart.
 * Returns 0 or -enum vhd_vq_err (queue broken). Always inlined: as a call
 * (GCC kept it out of line, it has three callers) its register saves cost
 * 17 of a pop's instructions (callgrind, vq-bench split).
 */
static inline __attribute__((always_inline)) int split_walk(struct vhd_vq *vq, uint16_t head,
                                                            struct iovec *iov, uint32_t max_iov,
                                                            struct vhd_vq_chain *c,
                                                            struct vhd_vq__rcache *rcache)
{
    if (max_iov > SPLIT_MAX_IOV)
        max_iov = SPLIT_MAX_IOV;
    c->id = head;
    c->ndescs = 1;
    c->nr = 0;
    c->nw = 0;
    c->rlen = 0;
    c->wlen = 0;

    const struct vhd_vring_desc *table = vq->ring.split.desc;
    uint32_t table_size = vq->size;
    uint32_t idx = head;   /* position in the current table, < table_size */
    uint32_t count = 0;    /* descriptors visited in the current table */
    bool indirect = false; /* walking an indirect table */
    uint64_t total = 0;    /* bytes in the chain, for the 2^32 limit */

    for (;;) {
        struct split_desc d;

        if (vhd_unlikely(++count > table_size))
            return vhd_vq__fail(vq, VHD_VQ_E_CHAIN_LOOP);
        split_desc_read(&table[vhd_index_nospec(idx, table_size)], &d);

        if (d.flags & VRING_DESC_F_INDIRECT) {
            /* 2.7.5.3.1: one table per descriptor, no tables in tables. */
            if (vhd_unlikely(indirect))
                return vhd_vq__fail(vq, VHD_VQ_E_NESTED_INDIRECT);
            int rc = split_enter_indirect(vq, &d, &table, &table_size);
            if (vhd_unlikely(rc < 0))
                return rc;
            indirect = true;
            idx = 0; /* the table's first descriptor is at index 0 */
            count = 0;
            continue;
        }

        /* rcache: a batch pop (constant per call site: the other one is compiled out). */
        int rc = rcache
                     ? vhd_vq__map_desc_run(vq, rcache, d.addr, d.len, d.flags & VRING_DESC_F_WRITE,
                                            iov, max_iov, c, &total)
                     : vhd_vq__map_desc(vq, d.addr, d.len, d.flags & VRING_DESC_F_WRITE, iov,
                                        max_iov, c, &total);
        if (vhd_unlikely(rc < 0))
            return rc;

        if (!(d.flags & VRING_DESC_F_NEXT))
            break;
        if (vhd_unlikely(d.next >= table_size))
            return vhd_vq__fail(vq, VHD_VQ_E_DESC_INDEX);
        idx = d.next;
    }
    return 0;
}

/*
 * Inflight: pop the next recorded chain again (after a restart). Its record
 * stays as it is (in flight, original counter); the avail ring is not
 * touched: start already placed last_avail_idx after every chain in flight.
 */
static int split_pop_resubmit(struct vhd_vq *vq, struct iovec *iov, uint32_t max_iov,
                              struct vhd_vq_chain *c)
{
    if (vhd_unlikely(vq->inflight >= vq->size))
        return vhd_vq__fail(vq, VHD_VQ_E_AVAIL_IDX);
    /* Start checked every listed head against the queue size. */
    uint16_t head = (uint16_t)vhd_index_nospec(vq->inf_resubmit[vq->inf_resubmit_pos], vq->size);
    int rc = split_walk(vq, head, iov, max_iov, c, NULL);
    if (vhd_unlikely(rc < 0))
        return vhd_vq__pop_rc(rc);
    vq->inf_resubmit_pos++;
    vq->inflight++;
    return 1;
}

/*
 * Pop one chain (see vhd_vq_pop in vq.h for the contract).
 *
 * Chain shapes accepted (2.7.5, 2.7.5.3):
 *  - direct descriptors linked by NEXT in the queue's table;
 *  - one descriptor with INDIRECT, alone or at the end of zero or more
 *    direct ones (2.7.5.3.2: "The device MUST handle the case of zero or
 *    more normal chained descriptors followed by a single descriptor with
 *    flags & VIRTQ_DESC_F_INDIRECT"). Readable-before-writable ordering is
 *    checked across the whole chain, direct part and table alike.
 * Zero-length buffers contribute no segment (a chain of only those pops with
 * nr = nw = 0).
 * Loop protection: the walk in the queue's table stops after `size`
 * descriptors and the walk in an indirect table after its length
 * (VHD_VQ_E_CHAIN_LOOP); a chain is therefore bounded by size + table length
 * descriptors even when the guest rewrites it while we read it.
 *
 * Inflight tracking (vhost-user "Inflight I/O tracking", split): chains
 * recorded in flight before a restart come first; a new chain's record gets
 * the next counter, then inflight = 1 (in that order, so a record marked in
 * flight always has its counter). A crash before the mark leaves the avail
 * entry unconsumed as far as the next start is concerned (it counts the
 * marked records), so the chain is popped again from the ring.
 */
static inline __attribute__((always_inline)) int split_pop(struct vhd_vq *vq, struct iovec *iov,
                                                           uint32_t max_iov, struct vhd_vq_chain *c,
                                                           bool tracked)
{
    uint16_t last = vq->last_avail_idx;

    /*
     * Only touch the shared avail->idx cache line when everything seen so far
     * has been consumed; the acquire of the earlier read still orders the
     * reads of the entries it covered.
     */
    if (last == vq->avail_shadow) {
        int rc = split_read_avail_idx(vq);
        if (vhd_unlikely(rc < 0))
            return rc;
        if (vq->avail_shadow == last)
            return 0;
        /*
         * A fresh batch: the prefetch below runs SPLIT_PREFETCH_AHEAD entries
         * ahead only of entries already seen, so the first ones of each
         * batch would each stall; start their transfers now (hints only,
         * clamped as below).
         */
        uint16_t fresh = (uint16_t)(vq->avail_shadow - last);
        if (fresh > SPLIT_PREFETCH_AHEAD)
            fresh = SPLIT_PREFETCH_AHEAD;
        for (uint16_t i = 1; i < fresh; i++) {
            uint16_t h = vhd_le16(
                vhd_load_relaxed(&vq->ring.split.avail->ring[(uint16_t)(last + i) & vq->mask]));
            __builtin_prefetch(&vq->ring.split.desc[vhd_index_nospec(h, vq->size)]);
        }
    }

    /*
     * Every chain holds at least one of the size descriptors until it is
     * used, so a driver never has more than size chains with the device.
     * One more means a head was posted again while still in flight (each
     * avail->idx step looked legal, 2.7.13 bounds only the ring); refusing
     * it also keeps vq->inflight from wrapping and the used ring from being
     * overrun.
     */
    if (vhd_unlikely(vq->inflight >= vq->size))
        return vhd_vq__fail(vq, VHD_VQ_E_AVAIL_IDX);

    /* The ring entry is read after the acquire above (pairing A). */
    uint16_t head = vhd_le16(vhd_load_relaxed(&vq->ring.split.avail->ring[last & vq->mask]));
    if (vhd_unlikely(head >= vq->size))
        return vhd_vq__fail(vq, VHD_VQ_E_DESC_INDEX);
    if ((uint16_t)(vq->avail_shadow - last) > SPLIT_PREFETCH_AHEAD) {
        /*
         * A published entry (covered by the acquire of avail->idx); its head
         * is only a hint here, clamped into the table, and is read and
         * checked again when that chain is popped.
         */
        uint16_t ahead = vhd_le16(vhd_load_relaxed(
            &vq->ring.split.avail->ring[(uint16_t)(last + SPLIT_PREFETCH_AHEAD) & vq->mask]));
        __builtin_prefetch(&vq->ring.split.desc[vhd_index_nospec(ahead, vq->size)]);
    }

    int rc = split_walk(vq, head, iov, max_iov, c, NULL);
    if (vhd_unlikely(rc < 0))
        return vhd_vq__pop_rc(rc);

    if (tracked) {
        struct vhd_inflight_split_desc *r = &vq->inf.split->desc[vhd_index_nospec(head, vq->size)];
        /*
         * A head made available again while in flight would share one record
         * between two chains: the first completion would clear the record the
         * second still needs, and a restart would lose it.
         */
        if (vhd_unlikely(r->inflight))
            return vhd_vq__fail(vq, VHD_VQ_E_ID_IN_FLIGHT);
        r->counter = vq->inf_counter++;
        /* Compiler barrier: the counter is in memory before the mark (crash order). */
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        r->inflight = 1;
    }
    vq->last_avail_idx = (uint16_t)(last + 1);
    vq->inflight++;
    return 1;
}

/* Pop with inflight tracking: chains to pop again first, then new ones, recorded. */
static __attribute__((noinline)) int split_pop_tracked(struct vhd_vq *vq, struct iovec *iov,
                                                       uint32_t max_iov, struct vhd_vq_chain *c)
{
    if (vq->inf_resubmit_pos < vq->inf_resubmit_n)
        return split_pop_resubmit(vq, iov, max_iov, c);
    if (vhd_unlikely(vq->inf_resubmit_only))
        return 0;
    int rc = split_pop(vq, iov, max_iov, c, true);
    /* A new chain after the list: unpop must give it back before any listed one. */
    if (rc == 1 && vq->inf_resubmit_n != 0 && vq->inf_new != UINT16_MAX)
        vq->inf_new++;
    return rc;
}

/* The body is instantiated twice so the untracked path pays one pointer test. */
int vhd_vq__split_pop(struct vhd_vq *vq, struct iovec *iov, uint32_t max_iov,
                      struct vhd_vq_chain *c)
{
    if (vhd_unlikely(vq->inf.any != NULL))
        return split_pop_tracked(vq, iov, max_iov, c);
    return split_pop(vq, iov, max_iov, c, false);
}

/* The run walks read a descriptor as two words: addr, then len | flags << 32 | next << 48. */
_Static_assert(offsetof(struct vhd_vring_desc, len) == 8 &&
                   offsetof(struct vhd_vring_desc, flags) == 12 &&
                   offsetof(struct vhd_vring_desc, next) == 14 &&
                   sizeof(struct vhd_vring_desc) == 16,
               "split descriptor layout");

/*
 * split_walk for a run: the same walk, checks and errors, with the chain's
 * counters in locals (written to *c once, or around a slow-path call) and
 * the common buffer (non-empty, in the cached region, in order, with room
 * and within the length limit) decided by one test; anything else goes to
 * vhd_vq__map_desc_slow, which decides it exactly as for a single pop.
 */
static inline __attribute__((always_inline)) int split_walk_run(struct vhd_vq *vq, uint16_t head,
                                                                struct iovec *iov, uint32_t max_iov,
                                                                struct vhd_vq_chain *c,
                                                                struct vhd_vq__rcache *rc)
{
    c->id = head;
    c->ndescs = 1;

    const struct vhd_vring_desc *table = vq->ring.split.desc;
    uint32_t table_size = vq->size;
    uint32_t idx = head, count = 0;
    bool indirect = false;
    /* Segments, writable ones, bytes, writable bytes (total <= UINT32_MAX). */
    uint32_t used = 0, nw = 0, total = 0, wlen = 0;

    for (;;) {
        if (vhd_unlikely(++count > table_size))
            return vhd_vq__fail(vq, VHD_VQ_E_CHAIN_LOOP);
        /*
         * The descriptor read once, as split_desc_read, as two 8-byte words
         * (addr; len | flags << 32 | next << 48); the empty asm takes them
         * as register operands, so the compiler cannot read guest memory
         * again in place of these copies.
         */
        const struct vhd_vring_desc *src = &table[vhd_index_nospec(idx, table_size)];
        uint64_t addr, hi;
        memcpy(&addr, (const uint8_t *)src, sizeof(addr));
        memcpy(&hi, (const uint8_t *)src + 8, sizeof(hi));
        __asm__ volatile("" : "+r"(addr), "+r"(hi));
        addr = vhd_le64(addr);
        hi = vhd_le64(hi);
        uint32_t len = (uint32_t)hi;
        uint16_t flags = (uint16_t)(hi >> 32);

        if (vhd_unlikely(flags & VRING_DESC_F_INDIRECT)) {
            if (vhd_unlikely(indirect))
                return vhd_vq__fail(vq, VHD_VQ_E_NESTED_INDIRECT);
            struct split_desc d = {.addr = addr, .len = len, .flags = flags};
            const struct vhd_vring_desc *t;
            uint32_t tsize;
            int rc2 = split_enter_indirect(vq, &d, &t, &tsize);
            if (vhd_unlikely(rc2 < 0))
                return rc2;
            table = t;
            table_size = tsize;
            vhd_vq__rcache_load(vq, rc); /* the table lookup may have moved the hint */
            indirect = true;
            idx = 0;
            count = 0;
            continue;
        }

        bool w = flags & VRING_DESC_F_WRITE;
        uint64_t off = addr - rc->gpa;
        /*
         * As vhd_vq__map_desc_run: (len - 1) < size - off says len != 0 and
         * the buffer ends inside the region, given off < size.
         */
        if (vhd_likely(vhd_vq__in_region(off, len, rc->size) && (w || nw == 0) && used < max_iov &&
                       len <= UINT32_MAX - total)) {
            iov[used].iov_base = rc->hva + vhd_index_nospec(off, rc->size);
            iov[used].iov_len = len;
            used++;
            total += len;
            if (w) {
                nw++;
                wlen += len;
            }
        } else {
            c->nr = (uint16_t)(used - nw);
            c->nw = (uint16_t)nw;
            c->rlen = total - wlen;
            c->wlen = wlen;
            uint64_t t64 = total;
            int rc2 = vhd_vq__map_desc_slow(vq, addr, len, w, iov, max_iov, c, &t64);
            if (vhd_unlikely(rc2 < 0))
                return rc2;
            used = (uint32_t)c->nr + c->nw;
            nw = c->nw;
            total = (uint32_t)t64;
            wlen = c->wlen;
            vhd_vq__rcache_load(vq, rc);
        }

        if (!(flags & VRING_DESC_F_NEXT))
            break;
        uint16_t next = (uint16_t)(hi >> 48);
        if (vhd_unlikely(next >= table_size))
            return vhd_vq__fail(vq, VHD_VQ_E_DESC_INDEX);
        idx = next;
    }
    c->nr = (uint16_t)(used - nw);
    c->nw = (uint16_t)nw;
    c->rlen = total - wlen;
    c->wlen = wlen;
    return 0;
}

/*
 * vhd_vq__in_region for the fast walks, the carry of its add taken by a
 * jump where it is made (asm goto): GCC 12 otherwise may keep it in a
 * register (setb) and test it after the compare, three more instructions
 * per buffer, in whichever loop its register allocation of the whole run
 * picks (measured: the split run walk 147 instead of 152 instructions per
 * request, vq-bench --batch 64).
 */
static inline __attribute__((always_inline)) bool split_in_region(uint64_t off, uint32_t len,
                                                                  uint64_t size)
{
#if defined(__x86_64__)
    uint64_t last = (uint64_t)len - 1;
    __asm__ goto("add %1, %0\n\tjc %l[out]" : "+r"(last) : "r"(off) : "cc" : out);
    return last < size;
out:
    return false;
#else
    return vhd_vq__in_region(off, len, size);
#endif
}

/*
 * A descriptor's two words, read once (see split_walk_run): addr, and
 * len | flags << 32 | next << 48, in host byte order.
 */
static inline __attribute__((always_inline)) void split_desc_words(const uint8_t *src,
                                                                   uint64_t *addr, uint64_t *hi)
{
    uint64_t a, h;
    memcpy(&a, src, sizeof(a));
    memcpy(&h, src + 8, sizeof(h));
    __asm__ volatile("" : "+r"(a), "+r"(h));
    *addr = vhd_le64(a);
    *hi = vhd_le64(h);
}

/*
 * One descriptor of the ring's fast walk, read once; false when idx is out
 * of the table. The ring's size is a power of two (2.7) and mask is size - 1:
 * idx < size is idx <= mask, and idx & mask is the speculation clamp.
 */
static inline __attribute__((always_inline)) bool split_fast_read(const struct vhd_vring_desc *desc,
                                                                  uint32_t mask, uint32_t idx,
                                                                  uint64_t *addr, uint64_t *hi)
{
    if (vhd_unlikely(idx > mask))
        return false;
    split_desc_words((const uint8_t *)&desc[idx & mask], addr, hi);
    return true;
}

/*
 * The common chain of a run, attempted first: direct descriptors only, each
 * buffer non-empty, in the cached region, in order, with room in iov and
 * within the length limit, at most size descriptors, every next in the
 * ring's table. Returns 1 with iov and *c filled; 2 when the head has
 * INDIRECT, with its two words in *haddr / *hhi (split_chain_table takes
 * them: the head is read once); 0 at the first other thing it does not
 * take (nothing else is changed: iov and *c are the caller's scratch until
 * the chain is popped), and split_walk_run then walks the chain from its
 * head with every check. Each descriptor is read once per walk and only the
 * walk that is kept is used, so a driver rewriting the chain meanwhile is
 * checked as it is then read.
 */
static inline __attribute__((always_inline)) int
split_chain_fast(const struct vhd_vring_desc *desc, uint32_t mask, uint16_t head, struct iovec *iov,
                 uint32_t lim, struct vhd_vq_chain *c, const struct vhd_vq__rcache *rc,
                 uint64_t *haddr, uint64_t *hhi)
{
    const uint64_t gpa = rc->gpa, rsize = rc->size;
    uint8_t *const hva = rc->hva;
    struct iovec *v = iov, *vr;
    /*
     * Descriptors the walk may still visit and store: lim, at most size (a
     * longer chain loops) and at most max_iov (room), one counter for both;
     * bytes summed in 64 bits and checked once at the end. Readable buffers
     * come first: the first loop takes them, the second the writable ones,
     * so the order needs no test of its own.
     */
    uint32_t idx = head, left = lim;
    uint64_t total = 0, rlen, addr, hi;
    uint32_t len, flags;

    if (vhd_unlikely(left == 0))
        return 0;
    for (;;) {
        if (vhd_unlikely(!split_fast_read(desc, mask, idx, &addr, &hi)))
            return 0;
        len = (uint32_t)hi;
        flags = (uint32_t)(hi >> 32);
        if (vhd_unlikely(flags & (VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE))) {
            if (flags & VRING_DESC_F_INDIRECT) {
                /* a table ends the chain: INDIRECT with NEXT is the full walk's to refuse */
                if (v != iov || (flags & VRING_DESC_F_NEXT))
                    return 0;
                *haddr = addr;
                *hhi = hi;
                return 2; /* the head names a table (split_chain_table) */
            }
            break;
        }
        uint64_t off = addr - gpa;
        if (vhd_unlikely(!split_in_region(off, len, rsize)))
            return 0;
        v->iov_base = hva + vhd_vq__clamp(off, rsize);
        v->iov_len = len;
        v++;
        total += len;
        if (!(flags & VRING_DESC_F_NEXT)) {
            vr = v;
            rlen = total;
            goto done;
        }
        idx = (uint32_t)(hi >> 48);
        if (vhd_unlikely(--left == 0))
            return 0;
    }
    vr = v;
    rlen = total;
    for (;;) {
        /* flags has WRITE and not INDIRECT here */
        uint64_t off = addr - gpa;
        if (vhd_unlikely(!split_in_region(off, len, rsize)))
            return 0;
        v->iov_base = hva + vhd_vq__clamp(off, rsize);
        v->iov_len = len;
        v++;
        total += len;
        if (!(flags & VRING_DESC_F_NEXT))
            break;
        idx = (uint32_t)(hi >> 48);
        if (vhd_unlikely(--left == 0))
            return 0;
        if (vhd_unlikely(!split_fast_read(desc, mask, idx, &addr, &hi)))
            return 0;
        len = (uint32_t)hi;
        flags = (uint32_t)(hi >> 32);
        if (vhd_unlikely((flags & (VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE)) !=
                         VRING_DESC_F_WRITE))
            return 0;
    }
done:
    if (vhd_unlikely(total > UINT32_MAX))
        return 0;
    c->id = head;
    c->ndescs = 1;
    c->nr = (uint16_t)(vr - iov);
    c->nw = (uint16_t)(v - vr);
    c->rlen = (uint32_t)rlen;
    c->wlen = (uint32_t)(total - rlen);
    return 1;
}

/*
 * The common indirect chain of a run (2.7.5.3), from the head's words that
 * split_chain_fast read: the head alone (INDIRECT without NEXT; its WRITE
 * ignored, 2.7.5.3.2) names a table that split_enter_indirect would take
 * (a non-zero multiple of 16 bytes, at most VHD_VQ_MAX_INDIRECT entries)
 * inside the cached region (the region its lookup finds first: the same
 * translation), of at most tlim entries; the table's chain runs in table
 * order, as drivers lay tables out (entry i's next is i + 1: no loop is
 * possible and every next is in the table once i + 1 < n), readable entries
 * then writable ones, none INDIRECT, each buffer non-empty and in the
 * cached region. Returns 1 with iov and *c filled, 0 for anything else:
 * split_walk_run then walks the chain from its head with every check (and
 * its errors), as for split_chain_fast.
 * tlim: 0 without VIRTIO_F_INDIRECT_DESC, else split_chain_fast's bound
 * (room in iov, at most the ring's size <= VHD_VQ_MAX_INDIRECT), so room,
 * the table's length rules and the feature are one compare per table, and
 * the 32-bit length one more: n * (2^32 - 1) bytes fit 64 bits.
 */
static inline __attribute__((always_inline)) int
split_chain_table(uint64_t taddr, uint64_t thi, uint16_t head, struct iovec *iov, uint32_t tlim,
                  struct vhd_vq_chain *c, const struct vhd_vq__rcache *rc)
{
    const uint64_t gpa = rc->gpa, rsize = rc->size;
    uint8_t *const hva = rc->hva;
    uint32_t tlen = (uint32_t)thi;
    uint64_t toff = taddr - gpa;
    /*
     * tlen - 16 rotated right by 4: n - 1 when tlen is a non-zero multiple
     * of 16, else at least 2^28 (its low bits, or tlen 0's wrap, on top),
     * above any tlim.
     */
    uint32_t nm1 = ((tlen - 16) >> 4) | ((tlen - 16) << 28);

    if (vhd_unlikely(nm1 >= tlim))
        return 0;
    uint32_t n = nm1 + 1;
    if (vhd_unlikely(!split_in_region(toff, tlen, rsize)))
        return 0;
    const uint8_t *table = hva + vhd_vq__clamp(toff, rsize);
    struct iovec *v = iov, *vr;
    uint64_t total = 0, rlen, addr, hi;
    uint32_t i = 0, len, fn; /* fn: flags | next << 16 of entry i - 1 */

    /*
     * Entry i is read at the walk's own position, not at a guest index: the
     * guest's next is only compared with it, and i < n (checked against the
     * region above) by the test before each read, as packed_table_fast reads
     * its entries. Not clamped (a cmov per entry cost 17 instructions per
     * request, --indirect 189 -> 206): a loop run on under misprediction
     * may read past the table (and past the region when the table ends it),
     * but those words go only into compares and into pointer stores in iov,
     * never into the address of a load, so nothing of them can reach the
     * cache before the branch resolves.
     */
    for (;;) {
        split_desc_words(table + 16 * (uint64_t)i, &addr, &hi);
        i++;
        len = (uint32_t)hi;
        fn = (uint32_t)(hi >> 32);
        if (vhd_unlikely(fn & (VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE)))
            break;
        uint64_t off = addr - gpa;
        if (vhd_unlikely(!split_in_region(off, len, rsize)))
            return 0;
        v->iov_base = hva + vhd_vq__clamp(off, rsize);
        v->iov_len = len;
        v++;
        total += len;
        if (!(fn & VRING_DESC_F_NEXT)) {
            vr = v;
            rlen = total;
            goto done;
        }
        if (vhd_unlikely((fn >> 16) != i || i == n))
            return 0;
    }
    if (vhd_unlikely(fn & VRING_DESC_F_INDIRECT))
        return 0;
    vr = v;
    rlen = total;
    for (;;) {
        /* fn has WRITE and not INDIRECT here */
        uint64_t off = addr - gpa;
        if (vhd_unlikely(!split_in_region(off, len, rsize)))
            return 0;
        v->iov_base = hva + vhd_vq__clamp(off, rsize);
        v->iov_len = len;
        v++;
        total += len;
        if (!(fn & VRING_DESC_F_NEXT))
            break;
        if (vhd_unlikely((fn >> 16) != i || i == n))
            return 0;
        split_desc_words(table + 16 * (uint64_t)i, &addr, &hi);
        i++;
        len = (uint32_t)hi;
        fn = (uint32_t)(hi >> 32);
        if (vhd_unlikely((fn & (VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE)) != VRING_DESC_F_WRITE))
            return 0;
    }
done:
    if (vhd_unlikely(total > UINT32_MAX))
        return 0;
    c->id = head;
    c->ndescs = 1;
    c->nr = (uint16_t)(vr - iov);
    c->nw = (uint16_t)(v - vr);
    c->rlen = (uint32_t)rlen;
    c->wlen = (uint32_t)(total - rlen);
    return 1;
}

/*
 * A run of up to max new chains (vhd_vq_pop_burst in vq.h), untracked:
 * avail->idx is read only when everything seen was consumed (as pop does),
 * the run's heads are read in one pass that prefetches their descriptors,
 * then each chain is checked and walked exactly as pop walks it, with the
 * region of the last buffer kept in locals. A chain that fails after the
 * first ends the run before it with the queue not broken (the failing
 * walk changed nothing but vq->error and the caller's iov/c of that
 * chain); the next pop walks it again.
 */
static inline __attribute__((always_inline)) int
split_pop_run(struct vhd_vq *vq, const struct vhd_vq__out oo, uint32_t max, bool tracked)
{
    const struct vhd_vq__out *o = &oo; /* by value: its fields are constants of each caller */
    uint16_t last = vq->last_avail_idx;

    if (last == vq->avail_shadow) {
        int rc = split_read_avail_idx(vq);
        if (vhd_unlikely(rc < 0))
            return rc;
        if (vq->avail_shadow == last)
            return 0;
    }
    uint32_t n = (uint16_t)(vq->avail_shadow - last);
    if (n > max)
        n = max;

    /*
     * The heads (read once, checked below), after the acquire of avail->idx
     * that covered them (pairing A); the prefetch uses each only as a hint,
     * clamped into the table.
     */
    const struct vhd_vring_desc *desc = vq->ring.split.desc;
    const uint16_t *ring = vq->ring.split.avail->ring;
    uint32_t size = vq->size, mask = vq->mask, pos = last & mask;
    uint16_t heads[VHD_VQ_BURST_MAX];
    for (uint32_t k = 0; k < n; k++) {
        heads[k] = vhd_le16(vhd_load_relaxed(&ring[pos]));
        __builtin_prefetch(&desc[heads[k] & mask]); /* a hint: any slot of the table */
        pos = (pos + 1) & mask;
    }

    /* A driver never has more than size chains with the device (see split_pop). */
    uint32_t room = size - vq->inflight;
    uint32_t max_iov = o->max_iov > SPLIT_MAX_IOV ? SPLIT_MAX_IOV : o->max_iov;
    /* The fast walks' bounds: room and loop (split_chain_fast), a table's entries
     * (split_chain_table). */
    uint32_t lim = max_iov < size ? max_iov : size;
    uint32_t tlim = vq->indirect ? lim : 0;
    _Static_assert(VHD_VQ_MAX_SIZE <= VHD_VQ_MAX_INDIRECT, "a table of lim entries is legal");
    struct vhd_vq__rcache rc;
    vhd_vq__rcache_load(vq, &rc);
    int err = 0;
    uint32_t k;
    /* Chains the in-flight bound lets through; the one after them fails (as split_pop). */
    uint32_t m = n <= room ? n : room;
    for (k = 0; k < m; k++) {
        struct iovec *iv = vhd_vq__out_iov(o, k);
        struct vhd_vq_chain *ck = vhd_vq__out_chain(o, k);
        /* The fast walk refuses a head out of the table too; the full walk's caller reports it. */
        uint64_t ta, th; /* f == 2: the head's words */
        int f = split_chain_fast(desc, mask, heads[k], iv, lim, ck, &rc, &ta, &th);
        if (vhd_unlikely(f != 1) &&
            !(f == 2 && split_chain_table(ta, th, heads[k], iv, tlim, ck, &rc))) {
            if (vhd_unlikely(heads[k] >= size)) {
                err = vhd_vq__fail(vq, VHD_VQ_E_DESC_INDEX);
                break;
            }
            err = split_walk_run(vq, heads[k], iv, max_iov, ck, &rc);
            if (vhd_unlikely(err < 0))
                break;
        }
        if (tracked) {
            /* As split_pop records a new chain: checked, counter, then the mark. */
            struct vhd_inflight_split_desc *r = &vq->inf.split->desc[vhd_vq__clamp(heads[k], size)];
            if (vhd_unlikely(r->inflight)) {
                err = vhd_vq__fail(vq, VHD_VQ_E_ID_IN_FLIGHT);
                break;
            }
            r->counter = vq->inf_counter++;
            __atomic_signal_fence(__ATOMIC_SEQ_CST);
            r->inflight = 1;
            if (vq->inf_resubmit_n != 0 && vq->inf_new != UINT16_MAX)
                vq->inf_new++; /* a new chain after the list (split_pop_tracked) */
        }
    }
    if (vhd_unlikely(k == m && m < n))
        err = vhd_vq__fail(vq, VHD_VQ_E_AVAIL_IDX);
    vq->last_avail_idx = (uint16_t)(last + k);
    vq->inflight = (uint16_t)(vq->inflight + k);
    if (vhd_unlikely(err < 0)) {
        if (k == 0)
            return vhd_vq__pop_rc(err);
        vq->error = VHD_VQ_OK; /* broken by the next pop, after this run is completed */
    }
    return (int)k;
}

/*
 * A run with inflight tracking: one tracked pop per chain (records as
 * vhd_vq_pop writes them); a chain failing after the first ends the run,
 * the queue not broken: a failing split pop has written no record.
 */
static __attribute__((noinline)) int
split_pop_run_tracked(struct vhd_vq *vq, const struct vhd_vq__out *o, uint32_t max)
{
    uint32_t k;
    for (k = 0; k < max; k++) {
        int rc = split_pop_tracked(vq, vhd_vq__out_iov(o, k), o->max_iov, vhd_vq__out_chain(o, k));
        if (rc == 0)
            break;
        if (vhd_unlikely(rc < 0)) {
            if (k == 0)
                return rc;
            vq->error = VHD_VQ_OK;
            break;
        }
    }
    return (int)k;
}

/*
 * With inflight tracking: chains to pop again go one by one (their own
 * path); new ones as a run, each recorded as split_pop records it.
 */
static inline __attribute__((always_inline)) int
split_pop_burst_any(struct vhd_vq *vq, const struct vhd_vq__out o, uint32_t max)
{
    if (vhd_likely(vq->inf.any == NULL))
        return split_pop_run(vq, o, max, false);
    if (vq->inf_resubmit_pos < vq->inf_resubmit_n || vq->inf_resubmit_only)
        return split_pop_run_tracked(vq, &o, max);
    return split_pop_run(vq, o, max, true);
}

int vhd_vq__split_pop_burst(struct vhd_vq *vq, struct iovec *iov, uint32_t stride,
                            struct vhd_vq_chain *c, uint32_t max)
{
    const struct vhd_vq__out o = {.iov = iov, .c = c, .stride = stride, .max_iov = stride};
    return split_pop_burst_any(vq, o, max);
}

int vhd_vq__split_pop_burstv(struct vhd_vq *vq, struct iovec *const *iovs, uint32_t max_iov,
                             struct vhd_vq_chain *const *cs, uint32_t max)
{
    const struct vhd_vq__out o = {.iovs = iovs, .cs = cs, .max_iov = max_iov};
    return split_pop_burst_any(vq, o, max);
}

/*
 * Record c as used (2.7.8). The element is written now but the driver sees
 * it only after flush's release store of used->idx (pairing B), so the two
 * stores need no ordering of their own (relaxed: single-copy atomic only).
 * c->id and the in-flight count come from the device, not the guest; a
 * mismatch is a device bug, which breaks the queue rather than hand the
 * driver a bogus id.
 * `written` is passed through: the caller promises it wrote at least that
 * many bytes into the chain's writable buffers (2.7.8.2).
 */
int vhd_vq__split_push(struct vhd_vq *vq, const struct vhd_vq_chain *c, uint32_t written)
{
    if (vhd_unlikely(c->id >= vq->size))
        return vhd_vq__fail(vq, VHD_VQ_E_DESC_INDEX);
    if (vhd_unlikely(vq->inflight == 0))
        return vhd_vq__fail(vq, VHD_VQ_E_USED_OVERFLOW);

    struct vhd_vring_used_elem *e = &vq->ring.split.used->ring[vq->used_idx & vq->mask];
    vhd_store_relaxed(&e->id, vhd_le32(c->id));
    vhd_store_relaxed(&e->len, vhd_le32(written));
    if (vhd_unlikely(vq->inf.any != NULL)) {
        /* Inflight: link the head into the list of the batch flush will publish. */
        struct vhd_inflight_split *inf = vq->inf.split;
        inf->desc[vhd_index_nospec(c->id, vq->size)].next = inf->last_batch_head;
        inf->last_batch_head = c->id;
    }
    vq->used_idx++;
    vq->inflight--;
    return 0;
}

/*
 * VIRTIO_F_IN_ORDER (2.7.9): the device may tell the driver that a batch of
 * buffers is used with a single used element, written at the ring index of
 * the batch's first buffer, holding the head id of its last one, and
 * used->idx moved by the batch's size; the driver takes the buffers it
 * skips as used completely. A run is used that way when it is a transmit
 * run: no chain has device-writable bytes (so "used completely" is exact)
 * and none reports bytes written (written NULL or 0). Any other run keeps
 * one element per chain: a receive or blk driver needs each length (DPDK's
 * in-order receive path reads every element, skipping or not).
 * The checks of push stay per chain and in its order (the id, then one more
 * than in flight); on a bad chain the chains before it are the batch and the
 * error is push_burst's. Flush publishes and logs as for any run (the
 * log marks the run's whole range of elements, the one written among them;
 * need_notify works on indices). Returns 1 when the run is not a transmit
 * run (nothing done: the per-chain path takes it), else 0 or -enum vhd_vq_err.
 */
static int split_push_in_order(struct vhd_vq *vq, const struct vhd_vq_chain *c,
                               const uint32_t *written, uint32_t n)
{
    uint32_t size = vq->size, left = vq->inflight;
    uint32_t m = n <= left ? n : left, k = 0, acc = 0;

    /* A receive or blk run shows it at its first chain: leave before the walk. */
    if (m != 0 && (c[0].wlen | (written != NULL ? written[0] : 0)) != 0)
        return 1;
    /* The lengths are or-ed and tested once, after the walk: a run is rarely mixed. */
    if (written == NULL) {
        for (; k < m && vhd_likely(c[k].id < size); k++)
            acc |= c[k].wlen;
    } else {
        for (; k < m && vhd_likely(c[k].id < size); k++)
            acc |= c[k].wlen | written[k];
    }
    if (acc != 0)
        return 1;
    if (vhd_likely(k > 0)) {
        struct vhd_vring_used_elem *e = &vq->ring.split.used->ring[vq->used_idx & vq->mask];
        vhd_store_relaxed(&e->id, vhd_le32(c[k - 1].id));
        vhd_store_relaxed(&e->len, 0);
        vq->used_idx = (uint16_t)(vq->used_idx + k);
        vq->inflight = (uint16_t)(left - k);
    }
    if (vhd_unlikely(k < n))
        return vhd_vq__fail(vq, c[k].id >= size ? VHD_VQ_E_DESC_INDEX : VHD_VQ_E_USED_OVERFLOW);
    return 0;
}

/*
 * vhd_vq_push_burst: push's checks and stores for each chain, with the
 * ring, index and mask loaded once and the counters stored once.
 */
int vhd_vq__split_push_burst(struct vhd_vq *vq, const struct vhd_vq_chain *c,
                             const uint32_t *written, uint32_t n)
{
    if (vq->in_order && vhd_likely(vq->inf.any == NULL)) {
        int rc = split_push_in_order(vq, c, written, n);
        if (rc <= 0)
            return rc;
    }
    struct vhd_vring_used_elem *ring = vq->ring.split.used->ring;
    uint32_t size = vq->size, mask = vq->mask, left = vq->inflight;
    uint32_t u = vq->used_idx;
    int err = 0;

    /* The checks of push, in its order: the id, then one more than in flight. */
    uint32_t m = n <= left ? n : left;
    uint32_t k;
    /*
     * written tested once: a loop for each case; the used ring is written in
     * at most two stretches (before and after its end), through a pointer.
     */
    uint32_t pos = u & mask, first = size - pos;
    struct vhd_vring_used_elem *e = &ring[pos];
    k = 0;
    if (written != NULL) {
        for (;;) {
            uint32_t end = m < first ? m : first;
            for (; k < end; k++, e++) {
                uint32_t id = c[k].id;
                if (vhd_unlikely(id >= size))
                    goto stop;
                vhd_store_relaxed(&e->id, vhd_le32(id));
                vhd_store_relaxed(&e->len, vhd_le32(written[k]));
            }
            if (k == m)
                break;
            e = ring;
            first = k + size; /* the next stretch: one whole ring at most */
        }
    } else {
        for (;;) {
            uint32_t end = m < first ? m : first;
            for (; k < end; k++, e++) {
                uint32_t id = c[k].id;
                if (vhd_unlikely(id >= size))
                    goto stop;
                vhd_store_relaxed(&e->id, vhd_le32(id));
                vhd_store_relaxed(&e->len, 0);
            }
            if (k == m)
                break;
            e = ring;
            first = k + size; /* the next stretch: one whole ring at most */
        }
    }
stop:
    if (vhd_unlikely(k < n))
        err = vhd_vq__fail(
            vq, k < m ? VHD_VQ_E_DESC_INDEX
                      : (c[k].id >= size ? VHD_VQ_E_DESC_INDEX : VHD_VQ_E_USED_OVERFLOW));
    if (vhd_unlikely(vq->inf.any != NULL)) {
        /* Inflight: link the heads into the list of the batch flush will publish. */
        struct vhd_inflight_split *inf = vq->inf.split;
        for (uint32_t i = 0; i < k; i++) {
            inf->desc[vhd_index_nospec(c[i].id, size)].next = inf->last_batch_head;
            inf->last_batch_head = c[i].id;
        }
    }
    vq->used_idx = (uint16_t)(u + k);
    vq->inflight = (uint16_t)(left - k);
    return err;
}

/*
 * Inflight, after used->idx was published: clear the records of the batch
 * (the n heads linked from last_batch_head by push), then record the new
 * used index. A crash before the last store is repaired at the next start
 * (used->idx differs from the recorded one: the batch is cleared then); a
 * crash before the publication leaves the records in flight, and the chains
 * are popped again. The list is read back from the shared area, so each
 * index is clamped: a front-end scribbling on it only spoils its own
 * recovery. Compiler barriers keep the stores in this order in memory,
 * which is all a crash of this process needs (the area outlives it).
 */
static void split_inflight_flushed(struct vhd_vq *vq, uint16_t n)
{
    struct vhd_inflight_split *inf = vq->inf.split;
    uint16_t h = vhd_load_relaxed(&inf->last_batch_head);

    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    for (uint16_t k = 0; k < n; k++) {
        struct vhd_inflight_split_desc *r = &inf->desc[vhd_index_nospec(h, vq->size)];
        r->inflight = 0;
        h = vhd_load_relaxed(&r->next);
    }
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    inf->used_idx = vq->used_idx;
}

/*
 * Dirty logging, after the release store of used->idx: the n used elements
 * from index `from` (wrapping round the ring) and used->idx itself. Marked
 * after the stores, so a front-end that sees a bit sees what we wrote.
 */
static __attribute__((noinline)) void split_log_flush(struct vhd_vq *vq, uint16_t from, uint16_t n)
{
    uint32_t first = from & vq->mask;
    uint32_t run = n < vq->size - first ? n : vq->size - first;

    vhd_vq__log_used(vq, 4 + 8ull * first, 8ull * run);
    if (n > run)
        vhd_vq__log_used(vq, 4, 8ull * (n - run));
    vhd_vq__log_used(vq, offsetof(struct vhd_vring_used, idx), sizeof(uint16_t));
}

/*
 * Publish every pushed element with one release store of used->idx
 * (pairing B): the elements and the data written into the buffers become
 * visible to the driver no later than the index. No store when nothing new.
 */
void vhd_vq__split_flush(struct vhd_vq *vq)
{
    if (vq->used_idx == vq->published_used)
        return;
    vhd_store_release(&vq->ring.split.used->idx, vhd_le16(vq->used_idx));
    if (vhd_unlikely(vq->log != NULL))
        split_log_flush(vq, vq->published_used, (uint16_t)(vq->used_idx - vq->published_used));
    if (vhd_unlikely(vq->inf.any != NULL))
        split_inflight_flushed(vq, (uint16_t)(vq->used_idx - vq->published_used));
    vq->published_used = vq->used_idx;
}

/*
 * Should the driver be interrupted for what was published since the last
 * call? (2.7.7.2)
 *  - Nothing published since the last decision: no (either the last
 *    decision already covered it, or the driver asked not to be told and
 *    re-checks used->idx itself when it re-enables interrupts).
 *  - Without EVENT_IDX: yes unless avail->flags has NO_INTERRUPT.
 *  - With EVENT_IDX (flags ignored): yes when used_event lies in the window
 *    of indices published since the last decision (vring_need_event,
 *    2.7.10); the first decision after start always says yes, as there is no
 *    window yet (a spurious interrupt is allowed: 2.7.7.1, the driver MUST
 *    handle it).
 */
bool vhd_vq__split_need_notify(struct vhd_vq *vq)
{
    uint16_t old = vq->signalled_used;
    uint16_t new_idx = vq->published_used;
    bool valid = vq->signalled_used_valid;

    /*
     * Pairing C: our used->idx store (flush) must be visible before we read
     * the driver's used_event / flags. Otherwise the driver could re-enable
     * interrupts, re-read a stale used->idx and sleep, while we read its old
     * "no interrupt" state and do not signal: a lost wakeup. Store->load
     * ordering needs the full barrier.
     */
    vhd_smp_mb();
    vq->signalled_used = new_idx;
    vq->signalled_used_valid = true;
    if (valid && new_idx == old)
        return false;
    if (!vq->event_idx) {
        uint16_t flags = vhd_le16(vhd_load_relaxed(&vq->ring.split.avail->flags));
        return !(flags & VRING_AVAIL_F_NO_INTERRUPT);
    }
    if (!valid)
        return true;
    uint16_t used_event = vhd_le16(vhd_load_relaxed(split_used_event(vq)));
    return vhd_vring_need_event(used_event, new_idx, old);
}

/*
 * Ask for kicks again, then re-check the ring: the classic race. Between our
 * last look at avail->idx and this call, the driver may have published more
 * and decided not to kick (we had said "no kicks"). After our request is
 * visible, any later publish will kick; anything published before it is
 * caught by the re-read. Returns true when work is pending (the caller must
 * pop instead of sleeping).
 *
 * With EVENT_IDX, avail_event = avail_shadow: "kick me when you add the
 * entry at index avail_shadow", the first one we have not seen (Linux vhost
 * does the same). Entries between last_avail_idx and the shadow are already
 * known, and the return value tells the caller about them.
 * Without EVENT_IDX, used->flags is written whole as 0 (2.7.10: the device
 * sets it to 0 or 1; we never read back a field the guest can scribble on).
 *
 * A corrupt avail->idx breaks the queue and answers true, so the caller's
 * next pop reports the error instead of the worker sleeping on a dead queue.
 */
bool vhd_vq__split_enable_notify(struct vhd_vq *vq)
{
    if (vq->event_idx)
        vhd_store_relaxed(split_avail_event(vq), vhd_le16(vq->avail_shadow));
    else
        vhd_store_relaxed(&vq->ring.split.used->flags, vhd_le16(0));
    if (vhd_unlikely(vq->log != NULL))
        vhd_vq__log_used(vq, vq->event_idx ? 4 + 8ull * vq->size : 0, sizeof(uint16_t));

    /*
     * Pairing D: the enable above must be visible before we re-read
     * avail->idx, mirroring the driver's barrier between storing avail->idx
     * and reading avail_event / used->flags. Store->load: full barrier.
     */
    vhd_smp_mb();
    if (split_read_avail_idx(vq) < 0)
        return true;
    return vq->avail_shadow != vq->last_avail_idx;
}

/*
 * We are polling: tell the driver kicks are not needed.
 * Without EVENT_IDX: used->flags = NO_NOTIFY (2.7.10).
 * With EVENT_IDX nothing is written: flags must stay 0 (2.7.10, and the
 * driver ignores it), and avail_event keeps the value the last
 * enable_notify wrote. The driver kicks only when its index crosses that
 * value, so while we poll it kicks at most once more; moving avail_event
 * "far away" would cost a store per poll for nothing (Linux vhost does the
 * same).
 */
void vhd_vq__split_disable_notify(struct vhd_vq *vq)
{
    if (!vq->event_idx) {
        vhd_store_relaxed(&vq->ring.split.used->flags, vhd_le16(VRING_USED_F_NO_NOTIFY));
        if (vhd_unlikely(vq->log != NULL))
            vhd_vq__log_used(vq, 0, sizeof(uint16_t));
    }
}

/*
 * Is a chain available? Uses the shadow when it already shows unconsumed
 * entries; otherwise re-reads avail->idx (acquire, pairing A). A corrupt
 * index breaks the queue and answers true, as in enable_notify.
 */
bool vhd_vq__split_has_work(struct vhd_vq *vq)
{
    if (vq->avail_shadow != vq->last_avail_idx)
        return true;
    if (split_read_avail_idx(vq) < 0)
        return true;
    return vq->avail_shadow != vq->last_avail_idx;
}

/* ---- IOTLB prefault (vhd_vq_prefault) ---- */

/*
 * Translate the buffers of the chain at head, as split_walk would, without
 * popping it: 1 when a buffer missed (recorded), 0 when all translate, -1
 * for anything the pop must judge (bad index, loop, table, permission).
 */
static int split_prefault_chain(struct vhd_vq *vq, uint16_t head)
{
    const struct vhd_vring_desc *table = vq->ring.split.desc;
    uint32_t table_size = vq->size, idx = head, count = 0;
    bool indirect = false;

    if (head >= vq->size)
        return -1;
    for (;;) {
        struct split_desc d;

        if (++count > table_size)
            return -1;
        split_desc_read(&table[vhd_index_nospec(idx, table_size)], &d);
        if (d.flags & VRING_DESC_F_INDIRECT) {
            if (indirect || !vq->indirect || (d.flags & VRING_DESC_F_NEXT) || d.len == 0 ||
                (d.len & 15) || d.len / 16 > VHD_VQ_MAX_INDIRECT)
                return -1;
            struct iovec seg;
            int n = vhd_vq__iotlb_map(vq, d.addr, d.len, VHD_IOTLB_R, &seg, 1);
            if (n != 1)
                return n == -VHD_VQ_E_IOTLB_MISS ? 1 : -1;
            table = seg.iov_base;
            table_size = d.len / 16;
            idx = 0;
            count = 0;
            indirect = true;
            continue;
        }
        int rc = vhd_vq__prefault_buf(vq, d.addr, d.len,
                                      d.flags & VRING_DESC_F_WRITE ? VHD_IOTLB_W : VHD_IOTLB_R);
        if (rc)
            return rc;
        if (!(d.flags & VRING_DESC_F_NEXT))
            return 0;
        if (d.next >= table_size)
            return -1;
        idx = d.next;
    }
}

/*
 * The chains after last_avail_idx, up to max: stops at the first miss
 * (1) or at a chain the pop will have to judge (0). The avail entries are
 * read after the acquire of avail->idx (pairing A), as in the pop.
 */
int vhd_vq__split_prefault(struct vhd_vq *vq, uint32_t max)
{
    if (split_read_avail_idx(vq) < 0)
        return 0;
    uint16_t last = vq->last_avail_idx, avail = (uint16_t)(vq->avail_shadow - last);
    for (uint16_t k = 0; k < avail && k < max; k++) {
        uint16_t head = vhd_le16(
            vhd_load_relaxed(&vq->ring.split.avail->ring[(uint16_t)(last + k) & vq->mask]));
        int rc = split_prefault_chain(vq, head);
        if (rc)
            return rc > 0;
    }
    return 0;
}
