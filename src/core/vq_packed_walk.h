/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The fast walks of packed runs (packed_chain_fast, packed_group_fast,
 * packed_stretch), included twice by vq_packed.c (which says why): with
 * PACKED_WALK_TRACKED 0, as they are, and with PACKED_WALK_TRACKED 1,
 * named with _tr, taking a struct packed_trk *tr and writing each chain's
 * inflight records. No include guard: each inclusion is one instantiation.
 */
#ifndef PACKED_WALK_TRACKED
#error "vq_packed_walk.h is included by vq_packed.c only"
#endif

#if PACKED_WALK_TRACKED
#define PW(name) name##_tr
#define PW_TRP   , struct packed_trk *tr
#define PW_TRA   , tr
#else
#define PW(name) name
#define PW_TRP
#define PW_TRA
#endif

/*
 * The common chain of a run, attempted first, wholly inside the stretch
 * [d, dend) of the ring: dend is at most the ring's end and within the
 * slots the driver owns, so no slot of the walk wraps and every one carries
 * want (the AVAIL/USED bits of an available slot in this lap) when
 * available. From d (flags: the head's, already read with acquire and found
 * available): descriptors without INDIRECT (or one alone naming a table in
 * the cached region, walked by packed_table_fast), each buffer non-empty,
 * in the cached region, in order, with room in iov and within the length
 * limit, every slot of the chain available, the buffer id below size.
 * Returns the slot after the chain with iov and *c filled, or NULL at the
 * first thing it does not take (a chain running past dend included;
 * nothing else changed: iov and *c are scratch until the chain is popped),
 * and the run then walks the chain with every check (packed_chain_full).
 * Each field is read once per walk and only the walk that is kept is used.
 * Tracked (_tr): each descriptor taken gets its record (packed_rec_put)
 * once packed_pop's checks for it have passed (the chain's bytes within 32
 * bits among them); the chain is not taken when the free list runs out.
 */
static inline __attribute__((always_inline)) const struct vhd_vring_packed_desc *
PW(packed_chain_fast)(const struct vhd_vring_packed_desc *d,
                      const struct vhd_vring_packed_desc *dend, uint32_t size, uint16_t want,
                      uint16_t flags, bool indirect_ok, struct iovec *iov, uint32_t max_iov,
                      struct vhd_vq_chain *c, const struct vhd_vq__rcache *rc PW_TRP)
{
    const uint64_t gpa = rc->gpa, rsize = rc->size;
    uint8_t *const hva = rc->hva;
    struct iovec *v = iov, *vr;
    uint64_t total = 0, rlen, addr, hi, off;
    uint32_t len;

    /* d < dend: the run's own position, never the guest's. */
#define PACKED_FAST_READ()                                                                    \
    do {                                                                                      \
        memcpy(&addr, (const uint8_t *)d, sizeof(addr));                                      \
        memcpy(&hi, (const uint8_t *)d + 8, sizeof(hi)); /* flags: those read with acquire */ \
        __asm__ volatile("" : "+r"(addr), "+r"(hi));     /* read once, after the acquire */   \
        d++;                                                                                  \
        addr = vhd_le64(addr);                                                                \
        hi = vhd_le64(hi);                                                                    \
        len = (uint32_t)hi;                                                                   \
        off = addr - gpa;                                                                     \
    } while (0)
#if PACKED_WALK_TRACKED
    /* The descriptor just taken gets its record, after packed_pop's checks. */
#define PACKED_FAST_REC()                                                             \
    do {                                                                              \
        if (vhd_unlikely(total > UINT32_MAX) || !packed_rec_put(tr, addr, hi, flags)) \
            return NULL;                                                              \
    } while (0)
#else
#define PACKED_FAST_REC() \
    do {                  \
    } while (0)
#endif

    if (vhd_unlikely(flags & VRING_DESC_F_INDIRECT)) {
        /* A chain of its own naming a table, as packed_map_one and pop_indirect take it. */
        PACKED_FAST_READ();
        if (!indirect_ok || (flags & VRING_DESC_F_NEXT) || len == 0 || (len % 16) ||
            len / 16 > VHD_VQ_MAX_INDIRECT || !vhd_vq__in_region(off, len, rsize) ||
            !packed_table_fast(hva + vhd_vq__clamp(off, rsize), len / 16, iov, max_iov, &vr, &v,
                               &total, &rlen, rc))
            return NULL;
        PACKED_FAST_REC();
        return packed_chain_end(d, hi, size, 1u << 16, iov, vr, v, rlen, total, c);
    }
    /*
     * The chain's slots end by lim: at dend and after at most max_iov
     * slots (a direct chain stores one buffer per slot, so that is also the
     * room in iov); bytes summed in 64 bits and checked once at the end.
     * Readable buffers come first: the first loop takes them, the second
     * the writable ones, so the order needs no test of its own. A later
     * slot's availability, INDIRECT (and WRITE in the second loop) are
     * tested by one mask compare.
     */
    uintptr_t lim = (uintptr_t)d + (uintptr_t)max_iov * sizeof(*d);
    if (lim > (uintptr_t)dend)
        lim = (uintptr_t)dend;
    if (vhd_unlikely((uintptr_t)d == lim))
        return NULL;
    for (;;) {
        PACKED_FAST_READ();
        if (vhd_unlikely(flags & VRING_DESC_F_WRITE))
            break;
        if (vhd_unlikely(!vhd_vq__in_region(off, len, rsize)))
            return NULL;
        v->iov_base = hva + vhd_vq__clamp(off, rsize);
        v->iov_len = len;
        v++;
        total += len;
        PACKED_FAST_REC();
        if (!(flags & VRING_DESC_F_NEXT)) /* readable buffers only */
            return packed_chain_end(d, hi, size, ((uintptr_t)v - (uintptr_t)iov) << 12, iov, v, v,
                                    total, total, c);
        if (vhd_unlikely((uintptr_t)d == lim))
            return NULL;
        flags = slot_flags(d);
        if (vhd_unlikely((flags & (PACKED_AM | VRING_DESC_F_INDIRECT)) != want))
            return NULL;
    }
    vr = v;
    rlen = total;
    for (;;) {
        /* flags has WRITE and not INDIRECT here, the slot was read */
        if (vhd_unlikely(!vhd_vq__in_region(off, len, rsize)))
            return NULL;
        v->iov_base = hva + vhd_vq__clamp(off, rsize);
        v->iov_len = len;
        v++;
        total += len;
        PACKED_FAST_REC();
        if (!(flags & VRING_DESC_F_NEXT))
            break;
        if (vhd_unlikely((uintptr_t)d == lim))
            return NULL;
        flags = slot_flags(d);
        if (vhd_unlikely((flags & (PACKED_AM | VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE)) !=
                         (want | VRING_DESC_F_WRITE)))
            return NULL;
        PACKED_FAST_READ();
    }
#undef PACKED_FAST_READ
#undef PACKED_FAST_REC
    return packed_chain_end(d, hi, size, ((uintptr_t)v - (uintptr_t)iov) << 12, iov, vr, v, rlen,
                            total, c);
}

/*
 * Four single-slot chains at once (the DPDK way): at a line of four slots
 * inside the stretch of the run (no wrap, within the room), f0 the first
 * one's flags (read with acquire: available, neither NEXT nor INDIRECT),
 * the other three's flags are read (acquire each) and tested together: all
 * available for want (the AVAIL/USED bits available descriptors carry in
 * this lap), none with NEXT or INDIRECT. Then each buffer is taken as
 * packed_chain_fast takes a one-slot chain (max_iov >= 1: the caller's
 * test), and, tracked (tr), recorded as packed_chain_fast records a chain.
 * Returns the chains popped (0..4): it stops at the first it does not
 * take, which the run then pops alone with every check.
 */
static inline __attribute__((always_inline)) uint32_t
PW(packed_group_fast)(const struct vhd_vring_packed_desc *d, uint32_t size, uint16_t want,
                      uint16_t f0, const struct vhd_vq__out *o, uint32_t k0,
                      const struct vhd_vq__rcache *rc PW_TRP)
{
    const uint16_t one = VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT;
    uint16_t f[4];

    f[0] = f0;
    f[1] = slot_flags(&d[1]);
    f[2] = slot_flags(&d[2]);
    f[3] = slot_flags(&d[3]);
    uint16_t all = f[1] & f[2] & f[3], any = f[1] | f[2] | f[3];
    if ((any & one) || ((all ^ any) & PACKED_AM) || (all & PACKED_AM) != want)
        return 0;

    const uint64_t gpa = rc->gpa, rsize = rc->size;
    uint32_t i;
    for (i = 0; i < 4; i++) {
        const uint8_t *src = (const uint8_t *)&d[i];
        uint64_t addr, hi;
        memcpy(&addr, src, sizeof(addr));
        memcpy(&hi, src + 8, sizeof(hi));
        __asm__ volatile("" : "+r"(addr), "+r"(hi)); /* read once, after the acquire */
        addr = vhd_le64(addr);
        hi = vhd_le64(hi);
        uint32_t len = (uint32_t)hi, id = (uint32_t)(hi >> 32) & 0xffff;
        uint64_t off = addr - gpa;
        if (vhd_unlikely(!vhd_vq__in_region(off, len, rsize) || id >= size))
            break;
#if PACKED_WALK_TRACKED
        {
            /* A one-slot chain: its head record is its last. */
            uint32_t head = tr->rec;
            if (vhd_unlikely(
                    !packed_rec_put(tr, addr, hi, f[i]) ||
                    !packed_rec_commit(tr, k0 + i, head, (uint32_t)vhd_vq__clamp(id, size), 1))) {
                tr->rec = head;
                break;
            }
        }
#endif
        struct iovec *iov = vhd_vq__out_iov(o, k0 + i);
        iov->iov_base = rc->hva + vhd_vq__clamp(off, rsize);
        iov->iov_len = len;
        struct vhd_vq_chain *ck = vhd_vq__out_chain(o, k0 + i);
        ck->id = (uint16_t)vhd_vq__clamp(id, size);
        ck->ndescs = 1;
        if (f[i] & VRING_DESC_F_WRITE) {
            ck->nr = 0;
            ck->nw = 1;
            ck->rlen = 0;
            ck->wlen = len;
        } else {
            ck->nr = 1;
            ck->nw = 0;
            ck->rlen = len;
            ck->wlen = 0;
        }
    }
    return i;
}

/*
 * The fast part of a run in one stretch [*dp, dend) of the ring (no wrap,
 * within the slots the driver owns; want: the AVAIL/USED bits of an
 * available slot in this lap): chains k.. of the caller's output o, up to
 * max, each taken by packed_group_fast (four one-slot chains at a line of
 * four slots) or packed_chain_fast. Stops at dend, at max, at a slot not
 * available or at a chain the fast walks do not take. Returns the chains
 * taken so far (k and the new ones), with *dp after them. Tracked (tr not
 * NULL): each chain taken is recorded (packed_rec_put, packed_rec_commit)
 * and *tr follows. Instantiated out of line per output kind and tracking
 * (packed_stretch_burst/_burstv, _tr) so that the loop has the registers
 * to itself.
 */
static inline __attribute__((always_inline)) uint32_t
PW(packed_stretch)(const struct vhd_vring_packed_desc **dp,
                   const struct vhd_vring_packed_desc *dend, uint32_t size, uint16_t want,
                   bool ind_ok, const struct vhd_vq__out oo, uint32_t k, uint32_t max,
                   const struct vhd_vq__rcache *rcp, bool *gap PW_TRP)
{
    const struct vhd_vq__out *o = &oo; /* by value: its fields are constants of each caller */
    const uint32_t max_iov = o->max_iov > PACKED_MAX_IOV ? PACKED_MAX_IOV : o->max_iov;
    const struct vhd_vq__rcache rc = *rcp;
    const struct vhd_vring_packed_desc *d = *dp;
    /* vhd_vq_pop_burst: chain k's iovecs and chain, moved along with k (no multiply per chain). */
    struct iovec *ivk = o->iovs ? NULL : o->iov + (size_t)k * o->stride;
    struct vhd_vq_chain *ckk = o->cs ? NULL : o->c + k;

    while (d < dend && k < max) {
        uint16_t flags = slot_flags(d);
        if ((flags & PACKED_AM) != want) {
            *gap = true; /* nothing more available */
            break;
        }
        __builtin_prefetch(d + PACKED_PREFETCH_AHEAD);
        /* At a line of four slots (at 64-byte alignment of the ring, as a host maps it). */
        if (!(flags & (VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT)) && ((uintptr_t)d & 63) == 0 &&
            max_iov != 0 && dend - d >= 4 && max - k >= 4) {
            uint32_t g = PW(packed_group_fast)(d, size, want, flags, o, k, &rc PW_TRA);
            if (g != 0) {
                k += g;
                d += g;
                if (!o->iovs) {
                    ivk += (size_t)g * o->stride;
                    ckk += g;
                }
                continue;
            }
        }
#if PACKED_WALK_TRACKED
        uint32_t head = tr->rec;
#endif
        const struct vhd_vring_packed_desc *nd =
            PW(packed_chain_fast)(d, dend, size, want, flags, ind_ok, o->iovs ? o->iovs[k] : ivk,
                                  max_iov, o->cs ? o->cs[k] : ckk, &rc PW_TRA);
#if PACKED_WALK_TRACKED
        if (nd == NULL ||
            !packed_rec_commit(tr, k, head, (o->cs ? o->cs[k] : ckk)->id, (uint32_t)(nd - d))) {
            tr->rec = head; /* the chain's records were not taken */
            break;
        }
#endif
        if (vhd_unlikely(nd == NULL))
            break;
        k++;
        d = nd;
        if (!o->iovs) {
            ivk += o->stride;
            ckk++;
        }
    }
    *dp = d;
    return k;
}

#undef PW
#undef PW_TRP
#undef PW_TRA
