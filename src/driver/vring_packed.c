/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Driver side of the packed virtqueue layout (virtio 1.2, 2.8): ring layout
 * in the caller's area, buffer-id allocation, making requests available in
 * batches published by one release store, the kick decision, collecting
 * used descriptors and interrupt (used buffer notification) suppression.
 * Entry points are dispatched from vring.c; contracts are in vring.h.
 *
 * Positions (slot plus wrap counter) are encoded as slot | wrap << 15 where
 * they must fit one uint16_t, as in the event suppression off_wrap field;
 * dq->kicked_avail holds the position at the last kick decision in that
 * encoding, and dq->kicked_valid says whether it still tells what was
 * published since (false once that is more than a lap: positions repeat
 * every two laps).
 */
#include <errno.h>
#include <stdlib.h>

#include "vring.h"

#define PACKED_POS_WRAP (1u << VRING_PACKED_EVENT_WRAP_SHIFT)
#define PACKED_POS_SLOT (PACKED_POS_WRAP - 1)

/* Byte offsets inside the area; must agree with vhd_drv_vq_area_size() in vring.c. */
static size_t packed_driver_off(uint32_t size)
{
    return ((size_t)16 * size + 63) & ~(size_t)63;
}

static inline uint16_t pos_encode(uint16_t slot, bool wrap)
{
    return (uint16_t)(slot | (wrap ? PACKED_POS_WRAP : 0));
}

/* Slots from one position forward to another, modulo two laps: [0, 2 * size). */
static inline uint32_t pos_dist(uint32_t size, uint16_t from, bool from_wrap, uint16_t to,
                                bool to_wrap)
{
    int32_t d = (int32_t)to - (int32_t)from + (from_wrap != to_wrap ? (int32_t)size : 0);
    if (d < 0)
        d += 2 * (int32_t)size;
    return (uint32_t)d;
}

/*
 * The packed event rule (2.8.14), same as the device's in vq_packed.c:
 * with positions encoded slot | wrap << 15, true when `event` lies in the
 * positions [old, new) just made available. An event offset outside the
 * ring, or more than a lap published between decisions, answers true (a
 * spurious kick is harmless, a missing one stalls the device).
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
    uint32_t behind =
        pos_dist(size, ev_slot, event >> 15, new_pos & PACKED_POS_SLOT, new_pos >> 15);
    return behind - 1 < n; /* behind == 0 wraps: not crossed */
}

/* AVAIL/USED bits marking a descriptor available under wrap counter w (2.8.1). */
static inline uint16_t avail_bits(bool w)
{
    return w ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED;
}

/* 2.8.1: used when AVAIL and USED both equal the wrap counter. */
static inline bool desc_is_used(uint16_t flags, bool wrap)
{
    return ((flags & VRING_PACKED_DESC_F_USED) != 0) == wrap &&
           ((flags & VRING_PACKED_DESC_F_AVAIL) != 0) == wrap;
}

/*
 * Is a used descriptor waiting at last_used? Acquire: pairs with the
 * device's release store of that slot's flags (its batch head, written
 * last), so the id and len read afterwards are the device's.
 */
static inline bool used_pending(const struct vhd_drv_vq *dq, uint16_t *flags)
{
    uint16_t f = vhd_le16(vhd_load_acquire(&dq->ring.packed.desc[dq->last_used].flags));
    *flags = f;
    return desc_is_used(f, dq->used_wrap);
}

int vhd_drv__packed_init(struct vhd_drv_vq *dq, const struct vhd_drv_vq_params *p)
{
    uint8_t *area = p->area;
    size_t drv_off = packed_driver_off(p->size);

    /* Descriptor ring at 0, then the two 4-byte event areas each on its own line. */
    dq->ring.packed.desc = (struct vhd_vring_packed_desc *)(void *)area;
    dq->ring.packed.driver = (struct vhd_vring_packed_event *)(void *)(area + drv_off);
    dq->ring.packed.device = (struct vhd_vring_packed_event *)(void *)(area + drv_off + 64);
    dq->desc_gpa = p->area_gpa;
    dq->avail_gpa = p->area_gpa + drv_off;
    dq->used_gpa = p->area_gpa + drv_off + 64;
    dq->indirect = area + drv_off + 128;
    dq->indirect_gpa = p->area_gpa + drv_off + 128;

    dq->id_next = calloc(p->size, sizeof(*dq->id_next));
    if (!dq->id_next)
        return -ENOMEM;
    for (uint32_t i = 0; i < p->size; i++)
        dq->id_next[i] = (uint16_t)(i + 1); /* the last link is size: end of list */
    dq->free_id_head = 0;

    /* 2.8.1: both wrap counters start at 1; the ring is zeroed (2.8.13). */
    dq->next_avail = 0;
    dq->avail_wrap = true;
    dq->last_used = 0;
    dq->used_wrap = true;
    dq->kicked_avail = pos_encode(0, true);
    dq->kicked_valid = true; /* nothing published yet: exact */
    dq->num_free = dq->size;
    /* Event areas are zero: ENABLE in both directions until someone says otherwise. */
    return 0;
}

/*
 * Store the flags of a slot we fill: the first slot of an unpublished
 * batch is held back for publish (2.8.21.1: the first descriptor is made
 * available after the rest); any other with release, after its
 * addr/len/id (2.8.21.1.1).
 */
static inline void put_flags(struct vhd_drv_vq *dq, uint16_t slot, uint16_t flags, bool first)
{
    if (first) {
        dq->batch_first = slot;
        dq->batch_first_flags = flags;
    } else {
        vhd_store_release(&dq->ring.packed.desc[slot].flags, vhd_le16(flags));
    }
}

static inline void advance_avail(struct vhd_drv_vq *dq)
{
    if (++dq->next_avail == dq->size) {
        dq->next_avail = 0;
        dq->avail_wrap = !dq->avail_wrap;
    }
}

/*
 * Add one request (2.8.21.1). Direct: nr + nw consecutive slots, NEXT on all
 * but the last, WRITE on the writable ones, the buffer id in the last
 * (2.8.6; the others' id fields are left as they are: the device must take
 * the id from the last descriptor). Indirect (2.8.7): the id's table holds
 * the buffers (only WRITE set, 2.8.19), one ring slot points at it with
 * INDIRECT and len = n * 16.
 * Returns 0, -ENOSPC (not enough free slots or ids) or -EINVAL (a direct
 * request longer than the ring: it could never fit).
 */
int vhd_drv__packed_add(struct vhd_drv_vq *dq, const struct vhd_drv_buf *bufs, uint32_t nr,
                        uint32_t nw, bool indirect, void *cookie)
{
    struct vhd_vring_packed_desc *ring = dq->ring.packed.desc;
    uint32_t n = nr + nw;
    uint32_t need = indirect ? 1 : n;

    if (!indirect && n > dq->size)
        return -EINVAL;
    if (dq->num_free < need || dq->free_id_head >= dq->size)
        return -ENOSPC;

    uint16_t id = dq->free_id_head;
    dq->free_id_head = dq->id_next[id];
    bool first = dq->batch_count == 0;

    if (indirect) {
        uint64_t tbl_off = (uint64_t)id * dq->max_indirect * sizeof(struct vhd_vring_packed_desc);
        struct vhd_vring_packed_desc *tbl =
            (struct vhd_vring_packed_desc *)(void *)(dq->indirect + tbl_off);
        /* The device does not read this table until the ring slot below is published. */
        for (uint32_t i = 0; i < n; i++) {
            tbl[i].addr = vhd_le64(bufs[i].gpa);
            tbl[i].len = vhd_le32(bufs[i].len);
            tbl[i].id = 0;
            tbl[i].flags = vhd_le16(i < nr ? 0 : VRING_DESC_F_WRITE);
        }
        uint16_t slot = dq->next_avail;
        vhd_store_relaxed(&ring[slot].addr, vhd_le64(dq->indirect_gpa + tbl_off));
        vhd_store_relaxed(&ring[slot].len, vhd_le32(n * (uint32_t)sizeof(*tbl)));
        vhd_store_relaxed(&ring[slot].id, vhd_le16(id));
        put_flags(dq, slot, VRING_DESC_F_INDIRECT | avail_bits(dq->avail_wrap), first);
        advance_avail(dq);
    } else {
        for (uint32_t i = 0; i < n; i++) {
            uint16_t slot = dq->next_avail;
            uint16_t flags = avail_bits(dq->avail_wrap);
            if (i + 1 < n)
                flags |= VRING_DESC_F_NEXT;
            else
                vhd_store_relaxed(&ring[slot].id, vhd_le16(id));
            if (i >= nr)
                flags |= VRING_DESC_F_WRITE;
            vhd_store_relaxed(&ring[slot].addr, vhd_le64(bufs[i].gpa));
            vhd_store_relaxed(&ring[slot].len, vhd_le32(bufs[i].len));
            put_flags(dq, slot, flags, first && i == 0);
            advance_avail(dq);
        }
    }

    uint32_t wlen = 0;
    for (uint32_t k = nr; k < n; k++)
        wlen += bufs[k].len;
    dq->num_free = (uint16_t)(dq->num_free - need);
    dq->slots[id].cookie = cookie;
    dq->slots[id].ndescs = (uint16_t)need;
    dq->slots[id].busy = true;
    dq->slots[id].wlen = wlen;
    if (dq->in_order) {
        /* At most size in flight (one id each): the FIFO cannot overrun its head. */
        dq->order[dq->order_tail] = id;
        dq->order_tail = (uint16_t)(dq->order_tail + 1 == dq->size ? 0 : dq->order_tail + 1);
    }
    dq->batch_count++; /* <= size: each request takes a slot */
    return 0;
}

/*
 * Make the batch visible: store the first slot's flags with release, last.
 * It orders every descriptor (and indirect table) write of the batch before
 * it; pairs with the device's acquire load of those flags.
 */
void vhd_drv__packed_publish(struct vhd_drv_vq *dq)
{
    if (dq->batch_count == 0)
        return;
    if (dq->kicked_valid) {
        /* Slots published since the last kick decision: keep them exact up to a lap. */
        uint16_t k = dq->kicked_avail;
        bool first_wrap = (dq->batch_first_flags & VRING_PACKED_DESC_F_AVAIL) != 0;
        uint32_t before =
            pos_dist(dq->size, k & PACKED_POS_SLOT, k >> 15, dq->batch_first, first_wrap);
        /* A batch is 1..size slots; a full lap reads as size. */
        uint32_t batch =
            pos_dist(dq->size, dq->batch_first, first_wrap, dq->next_avail, dq->avail_wrap);
        if (before + batch > dq->size)
            dq->kicked_valid = false;
    }
    vhd_store_release(&dq->ring.packed.desc[dq->batch_first].flags,
                      vhd_le16(dq->batch_first_flags));
    dq->batch_count = 0;
}

/*
 * Position up to which requests are published: the held-back first slot of
 * an unpublished batch (its wrap is the AVAIL bit of its flags), else the
 * next slot to fill.
 */
static inline uint16_t published_pos(const struct vhd_drv_vq *dq)
{
    if (dq->batch_count)
        return pos_encode(dq->batch_first,
                          (dq->batch_first_flags & VRING_PACKED_DESC_F_AVAIL) != 0);
    return pos_encode(dq->next_avail, dq->avail_wrap);
}

/*
 * Kick decision (2.8.21.2) for what was published since the last decision:
 * nothing new -> no (as the split layout); otherwise by the Device Event
 * Suppression flags: DISABLE -> no; DESC with EVENT_IDX -> yes when the
 * device's position was made available since the last decision, or when
 * more than a lap was published since (kicked_valid false); anything else
 * -> yes. Records the published position as decided.
 */
bool vhd_drv__packed_kick_needed(struct vhd_drv_vq *dq)
{
    const struct vhd_vring_packed_event *dev = dq->ring.packed.device;
    uint16_t new_pos = published_pos(dq);
    uint16_t old_pos = dq->kicked_avail;
    bool old_valid = dq->kicked_valid;

    if (old_valid && new_pos == old_pos)
        return false; /* no store of ours to order: no barrier needed */
    dq->kicked_avail = new_pos;
    dq->kicked_valid = true;
    /*
     * Store->load (2.8.21.2.1 "a suitable memory barrier before reading the
     * Event Suppression structure"): our flags store in publish must be
     * visible before we read the device's suppression. Pairs with the
     * device's full barrier between writing this area and re-checking the
     * ring (vhd_vq__packed_enable_notify).
     */
    vhd_smp_mb();
    /* Acquire: the device writes off_wrap before flags. */
    uint16_t flags = vhd_le16(vhd_load_acquire(&dev->flags)) & 3;
    if (flags == VRING_PACKED_EVENT_FLAG_DISABLE)
        return false;
    if (flags != VRING_PACKED_EVENT_FLAG_DESC || !dq->event_idx || !old_valid)
        return true;
    uint16_t off_wrap = vhd_le16(vhd_load_relaxed(&dev->off_wrap));
    return packed_need_event(dq->size, off_wrap, new_pos, old_pos);
}

/*
 * Collect one used descriptor (2.8.22). The id is the device's word: it
 * must be < size and in flight, else -EIO (nothing consumed). len counts
 * only with WRITE set (2.8.4: reserved otherwise), so it reads as 0 then.
 * Skips the slots the request took (2.8.6) and frees its id.
 */
int vhd_drv__packed_get_used(struct vhd_drv_vq *dq, void **cookie, uint32_t *len)
{
    uint16_t flags = 0, id;
    uint32_t l;
    if (dq->in_order && dq->batch_open) {
        /*
         * In order (2.8.8), inside a batch: the device wrote one used
         * descriptor for the batch (read below when it opened) and skipped
         * the slots of the rest; the next buffer is the next made available,
         * used completely, the batch's last one with the length it reported.
         */
        id = dq->order[dq->order_head];
        if (id == dq->batch_last) {
            dq->batch_open = false;
            l = dq->batch_len;
        } else {
            l = dq->slots[id].wlen;
        }
    } else {
        if (!used_pending(dq, &flags))
            return 0;
        const struct vhd_vring_packed_desc *d = &dq->ring.packed.desc[dq->last_used];
        id = vhd_le16(vhd_load_relaxed(&d->id));
        l = vhd_le32(vhd_load_relaxed(&d->len));
        if (id >= dq->size)
            return -EIO;
        id = (uint16_t)vhd_index_nospec(id, dq->size);
        if (!dq->slots[id].busy)
            return -EIO;
        if (!(flags & VRING_DESC_F_WRITE))
            l = 0;
        if (dq->in_order && id != dq->order[dq->order_head]) {
            /* A batch: it starts with the oldest buffer in flight and ends with id. */
            dq->batch_open = true;
            dq->batch_last = id;
            dq->batch_len = l;
            id = dq->order[dq->order_head];
            l = dq->slots[id].wlen;
        }
    }
    struct vhd_drv_vq_slot *s = &dq->slots[id];
    if (!s->busy)
        return -EIO;
    if (dq->in_order)
        dq->order_head = (uint16_t)(dq->order_head + 1 == dq->size ? 0 : dq->order_head + 1);

    uint32_t next = (uint32_t)dq->last_used + s->ndescs;
    if (next >= dq->size) {
        next -= dq->size;
        dq->used_wrap = !dq->used_wrap;
    }
    dq->last_used = (uint16_t)next;
    dq->num_free = (uint16_t)(dq->num_free + s->ndescs);
    s->busy = false;
    dq->id_next[id] = dq->free_id_head;
    dq->free_id_head = id;

    *cookie = s->cookie;
    *len = l;
    return 1;
}

/*
 * Ask for used buffer notifications (2.8.10, 2.8.14): with EVENT_IDX, DESC
 * at our next slot to read (off_wrap before flags, flags with release);
 * else ENABLE. Then re-check, as 2.8.22's note describes: the device may
 * have used a buffer and read our old DISABLE.
 */
bool vhd_drv__packed_enable_cb(struct vhd_drv_vq *dq)
{
    struct vhd_vring_packed_event *drv = dq->ring.packed.driver;

    /*
     * In order, inside a batch: its buffers are used already and their
     * slots were skipped (they still hold our own flags, which read as not
     * used; an event position there is one the device has passed): poll on.
     */
    if (dq->in_order && dq->batch_open)
        return true;

    if (dq->event_idx) {
        vhd_store_relaxed(&drv->off_wrap, vhd_le16(pos_encode(dq->last_used, dq->used_wrap)));
        vhd_store_release(&drv->flags, vhd_le16(VRING_PACKED_EVENT_FLAG_DESC));
    } else {
        vhd_store_relaxed(&drv->flags, vhd_le16(VRING_PACKED_EVENT_FLAG_ENABLE));
    }
    /*
     * Store->load: the enable must be visible before we re-read the ring.
     * Pairs with the device's full barrier between its used flags store and
     * its read of this area (vhd_vq__packed_need_notify): either it sees the
     * enable and interrupts, or we see its used descriptor here.
     */
    vhd_smp_mb();
    uint16_t flags;
    return used_pending(dq, &flags);
}

void vhd_drv__packed_disable_cb(struct vhd_drv_vq *dq)
{
    vhd_store_relaxed(&dq->ring.packed.driver->flags, vhd_le16(VRING_PACKED_EVENT_FLAG_DISABLE));
}
