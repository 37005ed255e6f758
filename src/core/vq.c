/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Layout-independent part of the virtqueue engine: parameter checks, ring
 * state in the vhost-user encoding, translation of ring addresses into the
 * cached direct pointers (and its slow path), per-buffer translation, and the
 * generic verbs that also undo inflight records (vhd_vq_unpop, vhd_vq_fini).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "vq.h"

static const char *const vq_err_names[VHD_VQ_E__COUNT] = {
    [VHD_VQ_OK] = "no error",
    [VHD_VQ_E_RING_ADDR] = "ring address outside guest memory",
    [VHD_VQ_E_AVAIL_IDX] = "available index ahead by more than the queue size",
    [VHD_VQ_E_DESC_INDEX] = "descriptor index out of range",
    [VHD_VQ_E_CHAIN_LOOP] = "descriptor chain loops or is longer than its table",
    [VHD_VQ_E_NESTED_INDIRECT] = "nested indirect descriptor",
    [VHD_VQ_E_INDIRECT_LEN] = "bad indirect table length",
    [VHD_VQ_E_INDIRECT_FLAGS] = "indirect descriptor with NEXT or inside a chain",
    [VHD_VQ_E_INDIRECT_NOFEAT] = "indirect descriptor without INDIRECT_DESC",
    [VHD_VQ_E_WRITE_ORDER] = "device-readable descriptor after a device-writable one",
    [VHD_VQ_E_ADDR] = "buffer outside guest memory",
    [VHD_VQ_E_LEN_OVERFLOW] = "chain length overflows 32 bits",
    [VHD_VQ_E_IOV_FULL] = "chain has more segments than the device accepts",
    [VHD_VQ_E_BUFFER_ID] = "buffer id out of range",
    [VHD_VQ_E_PACKED_CHAIN] = "chain continues into a descriptor not made available",
    [VHD_VQ_E_USED_OVERFLOW] = "more used elements than chains popped",
    [VHD_VQ_E_INFLIGHT] = "inflight area does not fit the queue or is corrupt",
    [VHD_VQ_E_UNPOP] = "chain given back is not the last one popped",
    [VHD_VQ_E_ID_IN_FLIGHT] = "chain head or buffer id made available again while in flight",
};

const char *vhd_vq_strerror(int err)
{
    if (err < 0)
        err = -err;
    if (err >= VHD_VQ_E__COUNT)
        return "unknown virtqueue error";
    return vq_err_names[err];
}

static bool is_pow2(uint32_t v)
{
    return v && !(v & (v - 1));
}

int vhd_vq_init(struct vhd_vq *vq, const struct vhd_vq_params *p, const struct vhd_mem *mem)
{
    if (p->size == 0 || p->size > VHD_VQ_MAX_SIZE)
        return -EINVAL;
    /* 2.7: split queue size is a power of two; 2.8: packed need not be. */
    if (!p->packed && !is_pow2(p->size))
        return -EINVAL;
    /* Alignment requirements, 2.7 (table 2.x) and 2.8.10. */
    if (p->desc & 15)
        return -EINVAL;
    if (p->packed ? ((p->avail & 3) || (p->used & 3)) : ((p->avail & 1) || (p->used & 3)))
        return -EINVAL;

    memset(vq, 0, sizeof(*vq));
    vq->mem = mem;
    vq->size = (uint16_t)p->size; /* 32768 fits in 16 bits */
    vq->mask = (uint16_t)(p->size - 1);
    vq->packed = p->packed;
    vq->event_idx = p->event_idx;
    vq->indirect = p->indirect;
    vq->addr_is_gpa = p->addr_is_gpa;
    vq->desc_addr = p->desc;
    vq->avail_addr = p->avail;
    vq->used_addr = p->used;
    /* 2.8.1: both wrap counters start at 1. */
    vq->avail_wrap = true;
    vq->used_wrap = true;
    vq->published_used_wrap = true;
    return 0;
}

int vhd_vq_set_base(struct vhd_vq *vq, uint32_t num)
{
    if (!vq->packed) {
        if (num > 0xffff)
            return -EINVAL;
        vq->last_avail_idx = (uint16_t)num;
        vq->avail_shadow = (uint16_t)num;
        return 0;
    }
    uint16_t avail = num & 0x7fff, used = (num >> 16) & 0x7fff;
    bool avail_wrap = (num >> 15) & 1, used_wrap = (num >> 31) & 1;
    if ((num >> 16) == 0) {
        used = avail;
        used_wrap = avail_wrap;
    }
    if (avail >= vq->size || used >= vq->size)
        return -EINVAL;
    vq->last_avail_idx = avail;
    vq->avail_wrap = avail_wrap;
    vq->used_idx = used;
    vq->used_wrap = used_wrap;
    vq->published_used = used;
    vq->published_used_wrap = used_wrap;
    vq->batch_npending = 0;
    vq->signalled_used_valid = false;
    return 0;
}

uint32_t vhd_vq_get_base(const struct vhd_vq *vq)
{
    if (!vq->packed)
        return vq->last_avail_idx;
    return (uint32_t)vq->last_avail_idx | (uint32_t)vq->avail_wrap << 15 |
           (uint32_t)vq->used_idx << 16 | (uint32_t)vq->used_wrap << 31;
}

/* Host pointer for a ring part: GPA or front-end VA, whole range in one region. */
static void *ring_hva(struct vhd_vq *vq, uint64_t addr, uint64_t len)
{
    if (!vq->mem)
        return NULL;
    if (vq->addr_is_gpa) {
        uint32_t hint = 0;
        return vhd_mem_gpa_to_hva(vq->mem, addr, len, &hint);
    }
    return vhd_mem_uva_to_hva(vq->mem, addr, len);
}

int vhd_vq__map_rings(struct vhd_vq *vq)
{
    void *d, *a, *u;

    if (vq->error)
        return -(int)vq->error;
    if (vq->packed) {
        d = ring_hva(vq, vq->desc_addr, 16ull * vq->size);
        a = ring_hva(vq, vq->avail_addr, sizeof(struct vhd_vring_packed_event));
        u = ring_hva(vq, vq->used_addr, sizeof(struct vhd_vring_packed_event));
    } else {
        d = ring_hva(vq, vq->desc_addr, vhd_vring_desc_size(vq->size));
        a = ring_hva(vq, vq->avail_addr, vhd_vring_avail_size(vq->size));
        u = ring_hva(vq, vq->used_addr, vhd_vring_used_size(vq->size));
    }
    if (!d || !a || !u)
        return vhd_vq__fail(vq, VHD_VQ_E_RING_ADDR);
    /*
     * vhd_vq_init checked the alignment of the addresses; the host pointers
     * must keep it too, or the ring's atomic index/flag accesses would be
     * misaligned (undefined behaviour; an alignment fault on some CPUs). They
     * differ when a region's host mapping is not congruent with its guest
     * (or front-end) address, which only a broken front-end produces.
     */
    if (((uintptr_t)d & 15) || ((uintptr_t)a & (vq->packed ? 3 : 1)) || ((uintptr_t)u & 3))
        return vhd_vq__fail(vq, VHD_VQ_E_RING_ADDR);
    /* Dirty logging: where the used descriptors go, as a GPA (rings are given as UVAs). */
    uint32_t hint = 0;
    vq->log_desc_gpa = vq->desc_addr;
    if (!vq->addr_is_gpa && vhd_mem_hva_to_gpa(vq->mem, d, 16, &hint, &vq->log_desc_gpa) < 0)
        vq->log_desc_gpa = 0; /* cannot happen: d was just translated from this table */
    if (vq->packed) {
        vq->ring.packed.desc = d;
        vq->ring.packed.driver = a;
        vq->ring.packed.device = u;
    } else {
        vq->ring.split.desc = d;
        vq->ring.split.avail = a;
        vq->ring.split.used = u;
    }
    vq->rings_ok = true;
    return 0;
}

int vhd_vq_start(struct vhd_vq *vq)
{
    vq->rings_ok = false;
    if (vhd_vq__map_rings(vq) < 0)
        return -EFAULT;
    if (!vq->packed) {
        /* The used index lives in the ring; a restarted device continues from it. */
        vq->used_idx = vhd_le16(vhd_load_relaxed(&vq->ring.split.used->idx));
        vq->published_used = vq->used_idx;
    }
    vq->signalled_used_valid = false;
    vq->inflight = 0;
    if (vq->inf.any && vhd_vq__inflight_start(vq) < 0)
        return -EBADMSG;
    return 0;
}

void vhd_vq_fini(struct vhd_vq *vq)
{
    free(vq->inf_resubmit);
    free(vq->inf_resubmit_num);
    free(vq->inf_head_of_id);
    vq->inf_resubmit = NULL;
    vq->inf_resubmit_num = NULL;
    vq->inf_head_of_id = NULL;
    vq->inf_resubmit_n = 0;
    vq->inf_resubmit_pos = 0;
    vq->inf_new = 0;
    vq->inf_resubmit_only = false;
    vq->inf_stale = false;
    vq->inf_dropped = 0;
    vq->inf.any = NULL;
}

int vhd_vq_unpop(struct vhd_vq *vq, const struct vhd_vq_chain *c)
{
    int rc = vhd_vq__ready(vq);
    if (rc < 0)
        return rc;
    if (vq->inflight == 0 || c->id >= vq->size)
        return vhd_vq__fail(vq, VHD_VQ_E_UNPOP);
    uint16_t id = (uint16_t)vhd_index_nospec(c->id, vq->size);

    /* Chains popped again come before any new one: one of those is the last. */
    if (vq->inf.any && vq->inf_resubmit_pos > 0 && vq->inf_new == 0) {
        if (vq->inf_resubmit[vq->inf_resubmit_pos - 1] !=
            (vq->packed ? vq->inf_head_of_id[id] : id))
            return vhd_vq__fail(vq, VHD_VQ_E_UNPOP);
        vq->inf_resubmit_pos--;
        vq->inflight--;
        return 0;
    }

    if (vq->inf.any && vq->inf_new != 0)
        vq->inf_new--; /* a new chain popped after the list */
    if (!vq->packed) {
        vq->last_avail_idx--;
        vq->inflight--;
        if (vq->inf.any) {
            vq->inf.split->desc[id].inflight = 0;
            vq->inf_counter--;
        }
        return 0;
    }
    return vhd_vq__packed_unpop(vq, c);
}

void vhd_vq_invalidate(struct vhd_vq *vq)
{
    vq->rings_ok = false;
    memset(&vq->ring, 0, sizeof(vq->ring));
}

void vhd_vq_set_mem(struct vhd_vq *vq, const struct vhd_mem *mem)
{
    vq->mem = mem;
    vq->mem_hint = 0;
    vhd_vq_invalidate(vq);
}

int vhd_vq__map_desc_slow(struct vhd_vq *vq, uint64_t addr, uint32_t len, bool writable,
                          struct iovec *iov, uint32_t max_iov, struct vhd_vq_chain *c,
                          uint64_t *total)
{
    uint32_t used = (uint32_t)c->nr + c->nw;

    if (len == 0)
        return 0; /* an empty buffer contributes nothing */
    if (!writable && c->nw)
        return vhd_vq__fail(vq, VHD_VQ_E_WRITE_ORDER);
    *total += len;
    if (*total > UINT32_MAX)
        return vhd_vq__fail(vq, VHD_VQ_E_LEN_OVERFLOW);
    if (used >= max_iov)
        return vhd_vq__fail(vq, VHD_VQ_E_IOV_FULL);

    /* Fast path: the whole buffer in the hinted region. */
    void *p = vhd_mem_gpa_to_hva(vq->mem, addr, len, &vq->mem_hint);
    int n = 1;
    if (vhd_likely(p != NULL)) {
        iov[used].iov_base = p;
        iov[used].iov_len = len;
    } else {
        n = vhd_mem_gpa_to_iov(vq->mem, addr, len, iov + used, max_iov - used, &vq->mem_hint);
        if (n == -ENOBUFS)
            return vhd_vq__fail(vq, VHD_VQ_E_IOV_FULL);
        if (n < 0)
            return vhd_vq__fail(vq, VHD_VQ_E_ADDR);
    }
    if (writable) {
        c->nw += (uint16_t)n;
        c->wlen += len;
    } else {
        c->nr += (uint16_t)n;
        c->rlen += len;
    }
    return 0;
}

/* ---- dirty logging ---- */

void vhd_vq_set_log(struct vhd_vq *vq, const struct vhd_dirtylog *log, bool log_used,
                    uint64_t used_gpa)
{
    vq->log = log;
    vq->log_used = log != NULL && log_used;
    vq->log_used_gpa = used_gpa;
}

/*
 * Each segment came from pop on this queue's table, so it lies inside one
 * region's mapping: its GPA is found by the reverse lookup (hinted by the
 * queue's region hint). Logging by host address keeps pop untouched: pop
 * does not record GPAs for a feature that is off nearly all the time. A
 * segment that does not translate (cannot happen) is skipped.
 */
void vhd_vq__log_iov(struct vhd_vq *vq, const struct iovec *iov, uint32_t n, uint64_t len)
{
    for (uint32_t i = 0; i < n && len > 0; i++) {
        uint64_t l = iov[i].iov_len < len ? iov[i].iov_len : len;
        uint64_t gpa;
        if (l && vhd_mem_hva_to_gpa(vq->mem, iov[i].iov_base, l, &vq->mem_hint, &gpa) == 0)
            vhd_dirtylog_mark(vq->log, gpa, l);
        len -= l;
    }
}

void vhd_vq__log_used(const struct vhd_vq *vq, uint64_t off, uint64_t len)
{
    if (vq->log_used)
        vhd_dirtylog_mark(vq->log, vq->log_used_gpa + off, len);
}

void vhd_vq__log_desc(const struct vhd_vq *vq, uint64_t off, uint64_t len)
{
    if (vq->log_used)
        vhd_dirtylog_mark(vq->log, vq->log_desc_gpa + off, len);
}
