/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Inflight I/O tracking, the control-path half (vhost-user "Inflight I/O
 * tracking", qemu docs/interop/vhost-user.rst): attaching a queue to its
 * region of the shared area, checking and repairing the region when the ring
 * starts, and building the list of chains to pop again. The per-request
 * records are written by the datapath in vq_split.c and vq_packed.c; the
 * generic verbs that also touch them (vhd_vq_fini, vhd_vq_unpop) are in vq.c.
 *
 * Everything in the area is untrusted: the front-end may have written
 * anything there (or a previous back-end may have crashed mid-update, which
 * the spec's repair steps handle). A region that does not fit fails the
 * start of that queue (VHD_VQ_E_INFLIGHT); no index read from it is used
 * before it is checked. The front-end can also rewrite the area *while* we
 * read it, so every field that is checked is read once into a local (the
 * header as a whole, a record as a whole, single fields with one atomic
 * load), and only the local is checked and used afterwards; every index
 * derived from one is clamped (vhd_index_nospec) before it indexes
 * anything. VHD_RACE_POINT marks where a test rewrites the area between a
 * read and its use (race.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "race.h"
#include "vq.h"

int vhd_vq_set_inflight(struct vhd_vq *vq, void *region, uint32_t desc_num)
{
    if (!region || desc_num == 0 || desc_num > VHD_VQ_MAX_SIZE)
        return -EINVAL;
    vhd_vq_fini(vq);
    vq->inf.any = region;
    vq->inf_desc_num = (uint16_t)desc_num; /* <= 32768 */
    return 0;
}

/*
 * Copy a region header, or one record, out of the area once. The compiler
 * barrier after the copy keeps the compiler from reading the area again in
 * place of the copy (as split_desc_read does for guest descriptors): what is
 * checked is what is used, whatever the front-end writes meanwhile.
 */
static void split_hdr_read(const struct vhd_inflight_split *inf, struct vhd_inflight_split *h)
{
    memcpy(h, inf, sizeof(*h));
    __asm__ volatile("" ::: "memory");
}

static void packed_hdr_read(const struct vhd_inflight_packed *inf, struct vhd_inflight_packed *h)
{
    memcpy(h, inf, sizeof(*h));
    __asm__ volatile("" ::: "memory");
}

static void packed_rec_read(const struct vhd_inflight_packed_desc *src,
                            struct vhd_inflight_packed_desc *r)
{
    memcpy(r, src, sizeof(*r));
    __asm__ volatile("" ::: "memory");
}

/* A chain found in flight: where its record is, its pop order and (packed) its ring slots. */
struct resubmit_ent {
    uint64_t counter;
    uint16_t rec;
    uint16_t num;
};

static int cmp_counter(const void *a, const void *b)
{
    const struct resubmit_ent *x = a, *y = b;
    return x->counter < y->counter ? -1 : x->counter > y->counter;
}

/*
 * Sort the n entries by counter into vq->inf_resubmit and set the next
 * counter after the largest. Two records with the same counter cannot come
 * from one back-end: the region is corrupt. 0 or -1 (ENOMEM is reported as
 * corruption too: the queue cannot run without its list either way).
 */
static int resubmit_list(struct vhd_vq *vq, struct resubmit_ent *ents, uint32_t n)
{
    vq->inf_counter = 1;
    if (n == 0)
        return 0;
    qsort(ents, n, sizeof(*ents), cmp_counter);
    vq->inf_resubmit = malloc(n * sizeof(uint16_t));
    if (!vq->inf_resubmit)
        return -1;
    if (vq->packed) {
        vq->inf_resubmit_num = malloc(n * sizeof(uint16_t));
        if (!vq->inf_resubmit_num)
            return -1;
    }
    for (uint32_t i = 0; i < n; i++) {
        if (i > 0 && ents[i].counter == ents[i - 1].counter)
            return -1;
        vq->inf_resubmit[i] = ents[i].rec;
        if (vq->packed)
            vq->inf_resubmit_num[i] = ents[i].num;
    }
    vq->inf_counter = ents[n - 1].counter + 1;
    vq->inf_resubmit_n = (uint16_t)n; /* n <= size <= 32768 */
    vq->inf_resubmit_pos = 0;
    vq->inf_new = 0;
    return 0;
}

/*
 * A new area (version 0) records no chain: none was popped with it. A base
 * that puts chains in flight all the same (the avail position past the used
 * one) names chains this area cannot give back, and they would never
 * complete: they are taken from the ring again, the avail position moved
 * back to the used one, as a front-end does with its own base when a
 * back-end that kept no area dies. vq->inf_retaken says how many. A
 * distance above the ring's size is no position at all: left for the pop
 * to refuse. Positions were checked by set_base (each below the size).
 */
static void new_area_retake(struct vhd_vq *vq)
{
    uint32_t n;

    if (vq->packed)
        n = vq->avail_wrap == vq->used_wrap
                ? (uint32_t)vq->last_avail_idx - vq->used_idx /* wraps past size when behind */
                : (uint32_t)vq->last_avail_idx + vq->size - vq->used_idx;
    else
        n = (uint16_t)(vq->last_avail_idx - vq->used_idx);
    if (n == 0 || n > vq->size)
        return;
    vq->inf_retaken = (uint16_t)n; /* n <= size <= 32768 */
    vq->last_avail_idx = vq->used_idx;
    if (vq->packed)
        vq->avail_wrap = vq->used_wrap;
    else
        vq->avail_shadow = vq->used_idx;
}

/*
 * Split start. Spec steps "When reconnecting": if used_idx differs from
 * used->idx, the last batch was published but its records not cleared:
 * clear the (used->idx - used_idx) heads listed from last_batch_head, set
 * used_idx; then resubmit the records in flight in counter order.
 * last_avail_idx becomes used->idx + chains in flight: every chain popped
 * before the crash is either used (counted in used->idx) or still recorded.
 */
static int split_start(struct vhd_vq *vq, struct resubmit_ent *ents)
{
    struct vhd_inflight_split *inf = vq->inf.split;
    uint32_t size = vq->size;
    struct vhd_inflight_split h; /* the header, read once: checked and used below */

    split_hdr_read(inf, &h);
    VHD_RACE_POINT("split_start:header");
    if (h.version == 0) {
        /* A new area: no chain was ever popped with it. */
        memset(inf->desc, 0, (size_t)vq->inf_desc_num * sizeof(inf->desc[0]));
        inf->features = 0;
        inf->desc_num = vq->inf_desc_num;
        inf->last_batch_head = 0;
        inf->used_idx = vq->used_idx;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        inf->version = VHD_INFLIGHT_VERSION;
        vq->inf_counter = 1;
        new_area_retake(vq);
        return 0;
    }
    if (h.version != VHD_INFLIGHT_VERSION || h.desc_num != vq->inf_desc_num)
        return -1;

    uint16_t used = vq->used_idx; /* vhd_vq_start read it from used->idx */
    uint16_t batch = (uint16_t)(used - h.used_idx);
    /*
     * No batch holds more than the ring. A larger gap is no interrupted
     * batch: either the driver re-initialised the ring (used->idx back to
     * 0) after everything had completed, which is fine when no record is
     * in flight (checked below), or the area is corrupt.
     */
    bool stale = batch > size;
    uint16_t head = h.last_batch_head;
    for (uint16_t k = 0; !stale && k < batch; k++) {
        if (head >= size)
            return -1;
        struct vhd_inflight_split_desc *r = &inf->desc[vhd_index_nospec(head, size)];
        r->inflight = 0;
        head = vhd_load_relaxed(&r->next); /* one read: checked, then clamped, above */
    }
    inf->used_idx = used;

    uint32_t n = 0;
    for (uint32_t i = 0; i < vq->inf_desc_num; i++) {
        uint8_t f = vhd_load_relaxed(&inf->desc[i].inflight);
        if (f == 0)
            continue;
        if (f != 1 || i >= size)
            return -1; /* not a flag, or a head the queue cannot have */
        ents[n].counter = vhd_load_relaxed(&inf->desc[i].counter);
        ents[n].rec = (uint16_t)i;
        ents[n].num = 1;
        n++;
    }
    if (stale && n > 0)
        return -1;
    if (resubmit_list(vq, ents, n) < 0)
        return -1;
    vq->last_avail_idx = (uint16_t)(used + n);
    vq->avail_shadow = vq->last_avail_idx;
    return 0;
}

/* 2.8.1: is a descriptor with these flags available in the lap of wrap counter w? */
static bool packed_flags_avail(uint16_t flags, bool w)
{
    return ((flags & VRING_PACKED_DESC_F_AVAIL) != 0) == w &&
           ((flags & VRING_PACKED_DESC_F_USED) != 0) != w;
}

/* 2.8.1: ... or used in that lap (both flags equal to w)? */
static bool packed_flags_used(uint16_t flags, bool w)
{
    return ((flags & VRING_PACKED_DESC_F_AVAIL) != 0) == w &&
           ((flags & VRING_PACKED_DESC_F_USED) != 0) == w;
}

/* A new packed region: empty, its positions those of the queue (set_base). */
static void packed_init_region(struct vhd_vq *vq, struct vhd_inflight_packed *inf)
{
    uint32_t dn = vq->inf_desc_num;

    /* Not valid while it is rewritten: a crash in between leaves a new area. */
    inf->version = 0;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    memset(inf->desc, 0, (size_t)dn * sizeof(inf->desc[0]));
    for (uint32_t i = 0; i < dn; i++)
        inf->desc[i].next = (uint16_t)(i + 1); /* dn (end of list) after the last */
    inf->features = 0;
    inf->desc_num = (uint16_t)dn;
    inf->free_head = inf->old_free_head = 0;
    inf->used_idx = inf->old_used_idx = vq->used_idx;
    inf->used_wrap_counter = inf->old_used_wrap_counter = vq->used_wrap;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    inf->version = VHD_INFLIGHT_VERSION;
    vq->inf_counter = 1;
}

/*
 * Does the area's used position (slot u of lap w, `slots` ring slots in
 * flight from there) describe this ring? Only what a back-end that stopped
 * there leaves can be seen at slot u: with chains in flight, the first of
 * them, still as the driver made it available in lap w (no used element
 * was published there, and a rolled-back batch never wrote that slot's
 * flags). With none, slot u holds anything but a descriptor used in lap w
 * (the device writes used elements only behind its used position, and the
 * driver makes the slot available again only in the next lap); and the
 * slot just behind u (in lap w, or the last slot of lap !w when u is 0)
 * was made available by the driver in its lap before the device passed it,
 * so it cannot look used in the lap before that one: it shows the device's
 * used descriptor, a descriptor of a used chain that was not its first
 * (still as the driver wrote it), or one the driver made available again
 * since. A zeroed slot looks used in lap 0, so a driver that re-initialised
 * its ring (zeroed, restarted from slot 0 of lap 1) is told apart unless it
 * has already refilled up to slot u. A ring at slot 0 of lap 1 has no slot
 * behind it to check: any ring explains that position.
 */
static bool packed_area_explains_ring(const struct vhd_vq *vq, uint16_t u, bool w, uint32_t slots)
{
    const struct vhd_vring_packed_desc *desc = vq->ring.packed.desc;
    uint16_t fu = vhd_le16(vhd_load_acquire(&desc[vhd_index_nospec(u, vq->size)].flags));

    if (slots > 0)
        return packed_flags_avail(fu, w);
    if (packed_flags_used(fu, w))
        return false;
    if (u == 0 && w)
        return true;
    uint32_t behind = u ? u - 1u : vq->size - 1u;
    bool lap = u ? w : !w;
    uint16_t fb = vhd_le16(vhd_load_acquire(&desc[vhd_index_nospec(behind, vq->size)].flags));
    return !packed_flags_used(fb, !lap);
}

/*
 * Packed start. Spec steps "When reconnecting": if used_idx (and its wrap
 * counter) differ from the old ones, a batch was being completed: look at
 * the ring slot of old_used_idx; if it no longer shows the descriptor the
 * driver made available in lap old_used_wrap_counter, the batch was
 * published: commit it (old_* = current). Then roll back to old_* (undoes an
 * unpublished batch or a pop cut short), clear the inflight mark of every
 * record on the free list, and resubmit the records in flight in counter
 * order. Each such head record must describe a chain: 1..size records
 * linked by next inside the area, its last record where `last` says, a
 * buffer id below the queue size used by no other chain, and all chains
 * together no more slots than the ring. The ring position: used = the old
 * used position; avail = used + the slots of the chains in flight.
 *
 * The front-end's base and the area. A split ring's used position is in
 * guest memory; a packed ring's is not, and a front-end has none to give
 * after a back-end crash: QEMU sends what it sent at the last start (it
 * never learns a packed position from a back-end that died), as SPDK's and
 * DPDK's reconnect code note before they take the area's position. So the
 * area's position stands when the base disagrees, provided the area still
 * describes the ring (packed_area_explains_ring). When it does not, the
 * area is not this ring's (a front-end that reset its guest, whose driver
 * re-initialised the ring, but kept the old area; the spec has a front-end
 * take a new area at reset): the base given stands, and the records are
 * dropped, since the requests they list belong to the driver before its
 * reset and must not run again. A base that agrees (our driver sends the
 * used position it has reaped up to) needs no such check.
 */
static int packed_start(struct vhd_vq *vq, struct resubmit_ent *ents)
{
    struct vhd_inflight_packed *inf = vq->inf.packed;
    uint32_t size = vq->size, dn = vq->inf_desc_num;
    struct vhd_inflight_packed h; /* the header, read once: checked and used below */

    vq->inf_head_of_id = malloc(size * sizeof(uint16_t));
    if (!vq->inf_head_of_id)
        return -1;
    /* No id in flight: UINT16_MAX (a push of an id never popped is clamped, never trusted). */
    memset(vq->inf_head_of_id, 0xff, size * sizeof(uint16_t));
    packed_hdr_read(inf, &h);
    VHD_RACE_POINT("packed_start:header");
    if (h.version == 0) {
        packed_init_region(vq, inf);
        new_area_retake(vq);
        return 0;
    }
    if (h.version != VHD_INFLIGHT_VERSION || h.desc_num != dn)
        return -1;
    if (h.used_wrap_counter > 1 || h.old_used_wrap_counter > 1 || h.old_used_idx >= size)
        return -1;

    bool commit = false;
    if (h.used_idx != h.old_used_idx || h.used_wrap_counter != h.old_used_wrap_counter) {
        const struct vhd_vring_packed_desc *d =
            &vq->ring.packed.desc[vhd_index_nospec(h.old_used_idx, size)];
        uint16_t flags = vhd_le16(vhd_load_acquire(&d->flags));
        if (!packed_flags_avail(flags, h.old_used_wrap_counter)) {
            /* The batch was published: commit it. */
            h.old_free_head = h.free_head;
            h.old_used_idx = h.used_idx;
            h.old_used_wrap_counter = h.used_wrap_counter;
            commit = true;
        }
    }
    if (h.old_used_idx >= size)
        return -1;
    if (commit) {
        inf->old_free_head = h.old_free_head;
        inf->old_used_idx = h.old_used_idx;
        inf->old_used_wrap_counter = h.old_used_wrap_counter;
    }
    /* The committed position, the only one used from here on. */
    const uint16_t used = (uint16_t)vhd_index_nospec(h.old_used_idx, size);
    const bool used_wrap = h.old_used_wrap_counter != 0;
    inf->free_head = h.old_free_head;
    inf->used_idx = used;
    inf->used_wrap_counter = used_wrap;

    /* The free list ends at an index >= desc_num; bounded in case it loops. */
    uint16_t f = h.old_free_head;
    for (uint32_t k = 0; k < dn && f < dn; k++) {
        struct vhd_inflight_packed_desc *r = &inf->desc[vhd_index_nospec(f, dn)];
        r->inflight = 0;
        f = vhd_load_relaxed(&r->next);
    }

    uint32_t n = 0, slots = 0;
    for (uint32_t i = 0; i < dn; i++) {
        struct vhd_inflight_packed_desc r; /* the head record, read once */
        packed_rec_read(&inf->desc[i], &r);
        if (r.inflight == 0)
            continue;
        if (r.inflight != 1 || r.num == 0 || r.num > size || n >= size)
            return -1;
        VHD_RACE_POINT("packed_start:chain");
        uint32_t x = i;
        for (uint32_t k = 1; k < r.num; k++) {
            x = vhd_load_relaxed(&inf->desc[vhd_index_nospec(x, dn)].next);
            if (x >= dn)
                return -1;
        }
        if (x != r.last)
            return -1;
        /* The chain's buffer id, in its last record: one read, checked, clamped. */
        uint16_t id = vhd_load_relaxed(&inf->desc[vhd_index_nospec(x, dn)].id);
        if (id >= size)
            return -1;
        VHD_RACE_POINT("packed_start:id");
        id = (uint16_t)vhd_index_nospec(id, size);
        if (vq->inf_head_of_id[id] != UINT16_MAX)
            return -1;
        vq->inf_head_of_id[id] = (uint16_t)i;
        slots += r.num;
        if (slots > size)
            return -1;
        ents[n].counter = r.counter;
        ents[n].rec = (uint16_t)i;
        ents[n].num = r.num;
        n++;
    }

    bool agree = vq->used_idx == used && vq->used_wrap == used_wrap;
    if (!agree && !packed_area_explains_ring(vq, used, used_wrap, slots)) {
        vq->inf_stale = true;
        vq->inf_dropped = (uint16_t)n; /* n <= size */
        memset(vq->inf_head_of_id, 0xff, size * sizeof(uint16_t));
        packed_init_region(vq, inf); /* the positions set_base gave */
        return 0;
    }
    if (resubmit_list(vq, ents, n) < 0)
        return -1;
    VHD_RACE_POINT("packed_start:resubmit");

    /*
     * The slots of the chains in flight belong to the device. A batch that
     * was rolled back may have left used descriptors in them: push stores
     * the flags of every descriptor of a batch but its first before flush
     * publishes the first. The driver cannot see them yet (it polls the
     * first), but once the new back-end completes chains of other sizes,
     * one of those stale descriptors can land where the driver looks next
     * and complete a chain that is being resubmitted. So every device-owned
     * slot gets back the flags of a descriptor the driver made available in
     * that slot's lap (2.8.1), as they were before the dead back-end used
     * them; their other fields are never read again (the records have them).
     * Positions come from the checked copy (used < size, slots <= size).
     */
    uint32_t pos = used;
    bool lap = used_wrap;
    for (uint32_t k = 0; k < slots; k++) {
        uint16_t fl = lap ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED;
        vhd_store_relaxed(&vq->ring.packed.desc[vhd_index_nospec(pos, size)].flags, vhd_le16(fl));
        if (++pos == size) {
            pos = 0;
            lap = !lap;
        }
    }

    /* Those flag stores are device writes to guest memory: logged when logging is on. */
    if (vhd_unlikely(vq->log != NULL) && slots) {
        uint32_t first = used, run = slots < size - first ? slots : size - first;
        vhd_vq__log_desc(vq, 16ull * first, 16ull * run);
        if (slots > run)
            vhd_vq__log_desc(vq, 0, 16ull * (slots - run));
    }

    uint32_t avail = used + slots;
    bool wrap = used_wrap;
    vq->used_idx = vq->published_used = used;
    vq->used_wrap = vq->published_used_wrap = used_wrap;
    vq->batch_npending = 0;
    if (avail >= size) {
        avail -= size;
        wrap = !wrap;
    }
    vq->last_avail_idx = (uint16_t)avail;
    vq->avail_wrap = wrap;
    return 0;
}

int vhd_vq__inflight_start(struct vhd_vq *vq)
{
    void *region = vq->inf.any;
    uint16_t desc_num = vq->inf_desc_num;

    /* A second start forgets the first one's lists. */
    vhd_vq_fini(vq);
    vq->inf.any = region;
    vq->inf_desc_num = desc_num;
    if (desc_num < vq->size)
        goto corrupt; /* a head (or a chain's records) could fall outside */

    struct resubmit_ent *ents = malloc((size_t)vq->size * sizeof(*ents));
    if (!ents)
        goto corrupt;
    int rc = vq->packed ? packed_start(vq, ents) : split_start(vq, ents);
    free(ents);
    if (rc < 0)
        goto corrupt;
    return 0;

corrupt:
    vhd_vq_fini(vq);
    return vhd_vq__fail(vq, VHD_VQ_E_INFLIGHT);
}
