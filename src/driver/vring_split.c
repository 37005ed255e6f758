/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Split virtqueue, driver side (virtio 1.2, 2.7): ring layout inside the
 * caller's area, the free descriptor list, adding direct and indirect
 * requests, publishing, kick and interrupt suppression, and collecting used
 * elements. The mirror image of src/core/vq_split.c.
 *
 * Memory ordering, and who pairs with whom (device side in vq_split.c):
 *  publish:      release store of avail->idx  <->  device's acquire load.
 *  get_used:     acquire load of used->idx    <->  device's release store.
 *  kick_needed:  full barrier between the avail->idx store and reading
 *                avail_event / used->flags (2.7.13.4.1)  <->  the device's
 *                barrier in enable_notify.
 *  enable_cb:    full barrier between writing used_event / flags and
 *                re-reading used->idx  <->  the device's barrier in
 *                need_notify.
 *
 * The free list links live in driver-private memory (dq->id_next), not in
 * the shared descriptors' next fields, so a device that scribbles on the
 * descriptor table cannot corrupt our bookkeeping (Linux moved to private
 * links, desc_extra, for the same reason).
 */
#include <errno.h>
#include <stdlib.h>

#include "vring.h"

/* Round up to a 64-byte boundary; must match vhd_drv_vq_area_size() in vring.c. */
static size_t align64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

/* used_event: the uint16 after avail->ring[size] (2.7.6); written by us. */
static inline uint16_t *split_used_event(const struct vhd_drv_vq *dq)
{
    return &dq->ring.split.avail->ring[dq->size];
}

/* avail_event: the uint16 at byte 4 + 8 * size of the used ring (2.7.8); device-written. */
static inline uint16_t *split_avail_event(const struct vhd_drv_vq *dq)
{
    return (uint16_t *)(void *)((uint8_t *)dq->ring.split.used + 4 + 8u * dq->size);
}

/* Bytes of one id's indirect table. */
static inline size_t indirect_table_bytes(const struct vhd_drv_vq *dq)
{
    return (size_t)dq->max_indirect * sizeof(struct vhd_vring_desc);
}

/* Fill one descriptor (little-endian on the wire). */
static inline void desc_fill(struct vhd_vring_desc *d, uint64_t addr, uint32_t len, uint16_t flags,
                             uint16_t next)
{
    d->addr = vhd_le64(addr);
    d->len = vhd_le32(len);
    d->flags = vhd_le16(flags);
    d->next = vhd_le16(next);
}

/*
 * Layout of the area, each part starting on a 64-byte boundary:
 *   descriptor table   16 * size
 *   available ring     6 + 2 * size (incl. used_event)
 *   used ring          6 + 8 * size (incl. avail_event)
 *   indirect tables    size * max_indirect * 16, the table of head id h at
 *                      h * max_indirect * 16
 * The parts' alignments (16, 2, 4; 2.7) follow from the area's 16-byte
 * alignment, which vring.c checked. vring.c also zeroed the area, so flags,
 * indices and event fields start at 0 (2.7.10: used->flags starts at 0).
 */
int vhd_drv__split_init(struct vhd_drv_vq *dq, const struct vhd_drv_vq_params *p)
{
    size_t desc_off = 0;
    size_t avail_off = desc_off + align64(vhd_vring_desc_size(p->size));
    size_t used_off = avail_off + align64(vhd_vring_avail_size(p->size));
    size_t ind_off = used_off + align64(vhd_vring_used_size(p->size));
    uint8_t *area = p->area;

    dq->id_next = calloc(p->size, sizeof(*dq->id_next));
    if (!dq->id_next)
        return -ENOMEM;

    dq->ring.split.desc = (struct vhd_vring_desc *)(void *)(area + desc_off);
    dq->ring.split.avail = (struct vhd_vring_avail *)(void *)(area + avail_off);
    dq->ring.split.used = (struct vhd_vring_used *)(void *)(area + used_off);
    dq->desc_gpa = p->area_gpa + desc_off;
    dq->avail_gpa = p->area_gpa + avail_off;
    dq->used_gpa = p->area_gpa + used_off;
    if (p->max_indirect) {
        dq->indirect = area + ind_off;
        dq->indirect_gpa = p->area_gpa + ind_off;
    } else {
        dq->indirect = NULL;
        dq->indirect_gpa = 0;
    }

    /* Every descriptor free, linked in order; the last link is never followed. */
    for (uint32_t i = 0; i < p->size; i++)
        dq->id_next[i] = (uint16_t)(i + 1 < p->size ? i + 1 : 0);
    dq->free_head = 0;
    dq->num_free = (uint16_t)p->size;
    dq->avail_idx = 0;
    dq->published_avail = 0;
    dq->kicked_avail = 0;
    dq->last_used_idx = 0;
    return 0;
}

/*
 * Queue one request (contract in vring.h). The descriptors and the avail
 * ring entry are plain stores: the device cannot look at them before
 * publish's release store of avail->idx.
 * Direct: nr + nw descriptors from the free list, NEXT on all but the last,
 * WRITE on the last nw (2.7.13.1). Indirect: the head id's table holds the
 * buffers (indices 0..n-1, chained by next = i + 1), and one ring descriptor
 * with only INDIRECT set points at it with len = 16 * n (2.7.5.3).
 */
int vhd_drv__split_add(struct vhd_drv_vq *dq, const struct vhd_drv_buf *bufs, uint32_t nr,
                       uint32_t nw, bool indirect, void *cookie)
{
    uint32_t n = nr + nw; /* 1..32768, checked by vring.c */
    uint16_t head = dq->free_head, last;
    struct vhd_vring_desc *desc = dq->ring.split.desc;

    if (indirect) {
        if (dq->num_free < 1)
            return -ENOSPC;
        struct vhd_vring_desc *table =
            (struct vhd_vring_desc *)(void *)(dq->indirect + head * indirect_table_bytes(dq));
        for (uint32_t i = 0; i < n; i++) {
            uint16_t flags = (uint16_t)((i >= nr ? VRING_DESC_F_WRITE : 0) |
                                        (i + 1 < n ? VRING_DESC_F_NEXT : 0));
            desc_fill(&table[i], bufs[i].gpa, bufs[i].len, flags,
                      (uint16_t)(i + 1 < n ? i + 1 : 0));
        }
        desc_fill(&desc[head], dq->indirect_gpa + head * indirect_table_bytes(dq), n * 16,
                  VRING_DESC_F_INDIRECT, 0);
        last = head;
        dq->free_head = dq->id_next[head];
        dq->num_free--;
        dq->slots[head].ndescs = 1;
    } else {
        if (n > dq->num_free)
            return -ENOSPC;
        uint16_t i = head;
        for (uint32_t k = 0;; k++) {
            uint16_t flags = (uint16_t)(k >= nr ? VRING_DESC_F_WRITE : 0);
            if (k + 1 == n) {
                desc_fill(&desc[i], bufs[k].gpa, bufs[k].len, flags, 0);
                break;
            }
            desc_fill(&desc[i], bufs[k].gpa, bufs[k].len, flags | VRING_DESC_F_NEXT,
                      dq->id_next[i]);
            i = dq->id_next[i];
        }
        last = i;
        dq->free_head = dq->id_next[last];
        dq->num_free = (uint16_t)(dq->num_free - n);
        dq->slots[head].ndescs = (uint16_t)n;
    }

    uint32_t wlen = 0;
    for (uint32_t k = nr; k < n; k++)
        wlen += bufs[k].len;
    dq->slots[head].cookie = cookie;
    dq->slots[head].last = last;
    dq->slots[head].busy = true;
    dq->slots[head].wlen = wlen;
    if (dq->in_order)
        dq->order[dq->avail_idx & (dq->size - 1)] = head;
    dq->ring.split.avail->ring[dq->avail_idx & (dq->size - 1)] = vhd_le16(head);
    dq->avail_idx++;
    return 0;
}

/*
 * Expose everything added with one release store of avail->idx: the
 * descriptors, tables and ring entries written before it are visible to the
 * device no later than the index (2.7.13.3.1).
 */
void vhd_drv__split_publish(struct vhd_drv_vq *dq)
{
    if (dq->avail_idx == dq->published_avail)
        return;
    vhd_store_release(&dq->ring.split.avail->idx, vhd_le16(dq->avail_idx));
    dq->published_avail = dq->avail_idx;
}

/*
 * Kick for what was published since the last call? (2.7.10)
 * Nothing new: no. EVENT_IDX: yes when avail_event lies in the window
 * (kicked_avail, published_avail] moved through (vring_need_event);
 * otherwise yes unless the device set NO_NOTIFY in used->flags.
 */
bool vhd_drv__split_kick_needed(struct vhd_drv_vq *dq)
{
    uint16_t old = dq->kicked_avail, new_idx = dq->published_avail;

    /*
     * 2.7.13.4.1: the avail->idx store must be visible before we read the
     * device's avail_event / flags, or the device may re-enable kicks,
     * re-read a stale avail->idx and sleep while we read its old "no kicks"
     * state. Store->load ordering: full barrier. Pairs with the barrier in
     * the device's enable_notify.
     */
    vhd_smp_mb();
    dq->kicked_avail = new_idx;
    if (new_idx == old)
        return false;
    if (dq->event_idx) {
        uint16_t avail_event = vhd_le16(vhd_load_relaxed(split_avail_event(dq)));
        return vhd_vring_need_event(avail_event, new_idx, old);
    }
    return !(vhd_le16(vhd_load_relaxed(&dq->ring.split.used->flags)) & VRING_USED_F_NO_NOTIFY);
}

/*
 * Take one used element (contract in vring.h). The acquire load of used->idx
 * pairs with the device's release store: the element and the data the device
 * wrote are read after it. A device that returns an id not in flight, or
 * moves used->idx more than a queue's worth ahead, gets -EIO; the element is
 * not consumed, so the queue stays failed (every later call says -EIO).
 */
int vhd_drv__split_get_used(struct vhd_drv_vq *dq, void **cookie, uint32_t *len)
{
    uint16_t used_idx = vhd_le16(vhd_load_acquire(&dq->ring.split.used->idx));

    if (used_idx == dq->last_used_idx)
        return 0;
    if ((uint16_t)(used_idx - dq->last_used_idx) > dq->size)
        return -EIO;

    uint32_t id, l;
    if (dq->in_order) {
        /*
         * In order (2.7.9): the buffer at this used position is the one made
         * available at the same position. The used element there (if no batch
         * is open) names the last buffer of a batch starting with it: the
         * buffers before that one are used completely, no element of theirs
         * is read. A device naming a buffer not in flight, or using more than
         * was published, gets -EIO (nothing consumed, nothing changed).
         */
        if ((uint16_t)(used_idx - dq->last_used_idx) >
            (uint16_t)(dq->published_avail - dq->last_used_idx))
            return -EIO;
        id = dq->order[dq->last_used_idx & (dq->size - 1)];
        if (!dq->slots[id].busy)
            return -EIO;
        if (!dq->batch_open) {
            const struct vhd_vring_used_elem *e =
                &dq->ring.split.used->ring[dq->last_used_idx & (dq->size - 1)];
            uint32_t last = vhd_le32(vhd_load_relaxed(&e->id));
            l = vhd_le32(vhd_load_relaxed(&e->len));
            if (last >= dq->size || !dq->slots[vhd_index_nospec(last, dq->size)].busy)
                return -EIO;
            if (last != id) {
                dq->batch_open = true;
                dq->batch_last = (uint16_t)last;
                dq->batch_len = l;
                l = dq->slots[id].wlen;
            }
        } else if (id == dq->batch_last) {
            dq->batch_open = false;
            l = dq->batch_len;
        } else {
            l = dq->slots[id].wlen;
        }
    } else {
        const struct vhd_vring_used_elem *e =
            &dq->ring.split.used->ring[dq->last_used_idx & (dq->size - 1)];
        id = vhd_le32(vhd_load_relaxed(&e->id));
        l = vhd_le32(vhd_load_relaxed(&e->len));
        if (id >= dq->size || !dq->slots[id].busy)
            return -EIO;
    }

    struct vhd_drv_vq_slot *s = &dq->slots[id];
    /*
     * Give the chain back: its private links still run from id to s->last.
     * In order, the links are never changed (each is the next descriptor of
     * the table, 0 after the last: 2.7.5.2), chains are freed in the order
     * they were taken, and so the free descriptors are always the ones from
     * free_head on in table order: what add takes next (2.7.5.1).
     */
    if (!dq->in_order) {
        dq->id_next[s->last] = dq->free_head;
        dq->free_head = (uint16_t)id;
    }
    dq->num_free = (uint16_t)(dq->num_free + s->ndescs);
    s->busy = false;
    *cookie = s->cookie;
    *len = l;
    dq->last_used_idx++;
    return 1;
}

/*
 * Ask for used-buffer notifications, then re-check (the "enable, then check
 * again" race of 2.7.14). EVENT_IDX: used_event = last_used_idx, "interrupt
 * me when you write the entry I will read next" (2.7.7.1; flags stay 0).
 * Otherwise flags = 0 (2.7.7.1: the driver sets it to 0 or 1; written whole,
 * never read back from shared memory). Returns true when used elements are already
 * pending; the caller must poll again rather than wait.
 */
bool vhd_drv__split_enable_cb(struct vhd_drv_vq *dq)
{
    if (dq->event_idx) {
        vhd_store_relaxed(split_used_event(dq), vhd_le16(dq->last_used_idx));
    } else {
        vhd_store_relaxed(&dq->ring.split.avail->flags, vhd_le16(0));
    }
    /*
     * Store->load: our request must be visible before we re-read used->idx.
     * Pairs with the device's barrier in need_notify between its used->idx
     * store and reading used_event / avail->flags.
     */
    vhd_smp_mb();
    return vhd_le16(vhd_load_acquire(&dq->ring.split.used->idx)) != dq->last_used_idx;
}

/*
 * No used-buffer notifications please.
 * Without EVENT_IDX: set NO_INTERRUPT in avail->flags (2.7.7.1).
 * With EVENT_IDX flags must stay 0 (2.7.7.1), so we move used_event as far
 * away as it goes: last_used_idx - 1, i.e. 65535 entries ahead of what we
 * will read next. The device's window of newly published indices starts at
 * or after the entries we already consumed, so it reaches that value only
 * after ~65535 more completions (or once, if the device published several
 * batches without asking need_notify in between): at most one spurious
 * interrupt, which drivers must tolerate anyway (2.7.7.1). Linux writes 0
 * here, which can fire sooner.
 */
void vhd_drv__split_disable_cb(struct vhd_drv_vq *dq)
{
    if (dq->event_idx) {
        vhd_store_relaxed(split_used_event(dq), vhd_le16((uint16_t)(dq->last_used_idx - 1)));
    } else {
        vhd_store_relaxed(&dq->ring.split.avail->flags, vhd_le16(VRING_AVAIL_F_NO_INTERRUPT));
    }
}
