/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Driver-side rings: layout-independent entry points (area sizing, set-up,
 * bookkeeping) dispatching to vring_split.c and vring_packed.c.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vring.h"

/* Round up to a 64-byte boundary so each ring part starts on its own line. */
static size_t align64(size_t v)
{
    return (v + 63) & ~(size_t)63;
}

size_t vhd_drv_vq_area_size(uint32_t size, bool packed, uint32_t max_indirect)
{
    size_t rings;
    if (packed)
        rings = align64(16ull * size) + 64 + 64; /* ring + two event areas */
    else
        rings = align64(vhd_vring_desc_size(size)) + align64(vhd_vring_avail_size(size)) +
                align64(vhd_vring_used_size(size));
    return rings + (size_t)size * max_indirect * 16;
}

int vhd_drv_vq_init(struct vhd_drv_vq *dq, const struct vhd_drv_vq_params *p)
{
    if (p->size == 0 || p->size > VHD_VQ_MAX_SIZE)
        return -EINVAL;
    if (!p->packed && (p->size & (p->size - 1)))
        return -EINVAL;
    if (((uintptr_t)p->area & 15) || (p->area_gpa & 15))
        return -EINVAL;
    if (p->area_len < vhd_drv_vq_area_size(p->size, p->packed, p->max_indirect))
        return -EINVAL;
    memset(dq, 0, sizeof(*dq));
    memset(p->area, 0, vhd_drv_vq_area_size(p->size, p->packed, p->max_indirect));
    dq->slots = calloc(p->size, sizeof(*dq->slots));
    if (!dq->slots)
        return -ENOMEM;
    dq->size = (uint16_t)p->size;
    dq->packed = p->packed;
    dq->event_idx = p->event_idx;
    dq->in_order = p->in_order;
    dq->max_indirect = p->max_indirect;
    if (p->in_order) {
        dq->order = calloc(p->size, sizeof(*dq->order));
        if (!dq->order) {
            vhd_drv_vq_fini(dq);
            return -ENOMEM;
        }
    }
    int rc = p->packed ? vhd_drv__packed_init(dq, p) : vhd_drv__split_init(dq, p);
    if (rc < 0) {
        vhd_drv_vq_fini(dq);
        return rc;
    }
    return 0;
}

void vhd_drv_vq_fini(struct vhd_drv_vq *dq)
{
    free(dq->slots);
    free(dq->id_next);
    free(dq->order);
    dq->slots = NULL;
    dq->id_next = NULL;
    dq->order = NULL;
}

int vhd_drv_vq_add(struct vhd_drv_vq *dq, const struct vhd_drv_buf *bufs, uint32_t nr, uint32_t nw,
                   bool indirect, void *cookie)
{
    if (nr + nw == 0 || nr + nw > VHD_VQ_MAX_SIZE)
        return -EINVAL;
    if (indirect && (dq->max_indirect == 0 || nr + nw > dq->max_indirect))
        return -EINVAL;
    return dq->packed ? vhd_drv__packed_add(dq, bufs, nr, nw, indirect, cookie)
                      : vhd_drv__split_add(dq, bufs, nr, nw, indirect, cookie);
}

void vhd_drv_vq_publish(struct vhd_drv_vq *dq)
{
    if (dq->packed)
        vhd_drv__packed_publish(dq);
    else
        vhd_drv__split_publish(dq);
}

bool vhd_drv_vq_kick_needed(struct vhd_drv_vq *dq)
{
    return dq->packed ? vhd_drv__packed_kick_needed(dq) : vhd_drv__split_kick_needed(dq);
}

int vhd_drv_vq_get_used(struct vhd_drv_vq *dq, void **cookie, uint32_t *len)
{
    return dq->packed ? vhd_drv__packed_get_used(dq, cookie, len)
                      : vhd_drv__split_get_used(dq, cookie, len);
}

bool vhd_drv_vq_enable_cb(struct vhd_drv_vq *dq)
{
    return dq->packed ? vhd_drv__packed_enable_cb(dq) : vhd_drv__split_enable_cb(dq);
}

void vhd_drv_vq_disable_cb(struct vhd_drv_vq *dq)
{
    if (dq->packed)
        vhd_drv__packed_disable_cb(dq);
    else
        vhd_drv__split_disable_cb(dq);
}

uint32_t vhd_drv_vq_inflight(const struct vhd_drv_vq *dq)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < dq->size; i++)
        n += dq->slots[i].busy;
    return n;
}
