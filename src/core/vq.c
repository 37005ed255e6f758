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
#include <unistd.h>

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
    [VHD_VQ_E_IOTLB_PERM] = "buffer mapped by the IOTLB without the access it needs",
    [VHD_VQ_E_IOTLB_RING] = "ring not host-contiguous in one region, or without its access",
    [VHD_VQ_E_IOTLB_MISS] = "address not mapped by the IOTLB (yet)",
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
    vq->xlat = mem;
    vq->iotlb_event_fd = -1;
    vq->iotlb_one.regions = &vq->iotlb_reg;
    vq->size = (uint16_t)p->size; /* 32768 fits in 16 bits */
    vq->mask = (uint16_t)(p->size - 1);
    vq->packed = p->packed;
    vq->event_idx = p->event_idx;
    vq->indirect = p->indirect;
    vq->in_order = p->in_order;
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

/*
 * A miss at iova (the first byte not translated): publish it for the
 * control thread (release: a reader of the word sees the queue's state
 * before it) and wake it through the event fd, once per distinct miss. The
 * word keeps the missed byte to 4 bytes (vq.h), not its page: the page's
 * first byte may be mapped when the missed one is not. The worker never
 * waits for the answer.
 */
static void iotlb_record_miss(struct vhd_vq *vq, uint64_t iova, uint8_t perm)
{
    uint64_t w = VHD_VQ_IOTLB_MISS_WORD(iova, perm);

    if (vhd_load_relaxed(&vq->iotlb_miss) == w)
        return;
    vhd_store_release(&vq->iotlb_miss, w);
    if (vq->iotlb_event_fd >= 0) {
        uint64_t one = 1;
        /* Non-blocking (the runtime's own eventfd); a full counter already wakes it. */
        ssize_t n = write(vq->iotlb_event_fd, &one, sizeof(one));
        (void)n;
    }
}

/*
 * Remember e (found for an address of page e_key) in the queue's cache; a
 * read-write one also becomes the fast path's region.
 */
static void iotlb_cache(struct vhd_vq *vq, const struct vhd_iotlb_ent *e, uint64_t e_key)
{
    vq->iotlb_cache[(e_key) % VHD_VQ_IOTLB_CACHE] = *e;
    if (e->perm == VHD_IOTLB_RW) {
        vq->iotlb_reg.gpa = e->iova;
        vq->iotlb_reg.size = e->size;
        vq->iotlb_reg.hva = e->hva;
        vq->iotlb_one.nregions = 1;
        vq->mem_hint = 0;
    }
}

/*
 * IOTLB translation of a buffer or table: the queue's cache of entries
 * hit (one slot, by page), else the published table through the queue's
 * reader slot (one walk when one entry holds the whole buffer).
 * Returns the segment count, -VHD_VQ_E_IOTLB_MISS (miss recorded),
 * -VHD_VQ_E_IOTLB_PERM, -VHD_VQ_E_IOV_FULL or -VHD_VQ_E_ADDR; breaks
 * nothing itself.
 */
int vhd_vq__iotlb_map(struct vhd_vq *vq, uint64_t addr, uint64_t len, uint8_t perm,
                      struct iovec *iov, uint32_t max_iov)
{
    uint64_t key = addr >> 12, miss = addr;
    const struct vhd_iotlb_ent *c = &vq->iotlb_cache[key % VHD_VQ_IOTLB_CACHE];
    uint64_t off = addr - c->iova;
    struct vhd_iotlb_ent e;
    int n;

    if (max_iov == 0)
        return -VHD_VQ_E_IOV_FULL;
    /*
     * A cached entry without the access asked for is not an answer: an
     * UPDATE may have added the access since (no quiescence for that:
     * iotlb.h), so the table decides.
     */
    if (off < c->size && len <= c->size - off && (c->perm & perm) == perm) {
        iov[0].iov_base = c->hva + off;
        iov[0].iov_len = len;
        return 1;
    }
    const struct vhd_iotlb_ver *v = vhd_iotlb_enter(vq->iotlb, vq->iotlb_slot);
    if (vhd_iotlb_lookup(v, addr, &e) == 0 && len <= e.size - (addr - e.iova)) {
        /* the common case: one entry holds the whole buffer, one walk */
        vhd_iotlb_leave(vq->iotlb, vq->iotlb_slot);
        iotlb_cache(vq, &e, key);
        if ((e.perm & perm) != perm)
            return -VHD_VQ_E_IOTLB_PERM;
        iov[0].iov_base = e.hva + (addr - e.iova);
        iov[0].iov_len = len;
        return 1;
    }
    n = vhd_iotlb_to_iov(v, addr, len, perm, iov, max_iov, &miss);
    if (n > 0 && vhd_iotlb_lookup(v, addr + len - 1, &e) == 0)
        iotlb_cache(vq, &e, (addr + len - 1) >> 12); /* where the next buffer likely is */
    vhd_iotlb_leave(vq->iotlb, vq->iotlb_slot);
    switch (n) {
    case -EFAULT:
        iotlb_record_miss(vq, miss, perm);
        return -VHD_VQ_E_IOTLB_MISS;
    case -EACCES:
        return -VHD_VQ_E_IOTLB_PERM;
    case -ENOBUFS:
        return -VHD_VQ_E_IOV_FULL;
    default:
        return n < 0 ? -VHD_VQ_E_ADDR : n;
    }
}

/*
 * Ring part through the IOTLB: one host-contiguous range in one region
 * (a ring spanning IOMMU pages that are not contiguous in host memory is
 * refused: VHD_VQ_E_IOTLB_RING, the queue breaks; Linux allocates rings
 * physically contiguous). 0 and *hva, or -VHD_VQ_E_*.
 */
static int ring_iotlb(struct vhd_vq *vq, uint64_t addr, uint64_t len, uint8_t perm, void **hva)
{
    uint64_t miss = addr;
    const struct vhd_iotlb_ver *v = vhd_iotlb_enter(vq->iotlb, vq->iotlb_slot);
    int rc = vhd_iotlb_to_hva(v, addr, len, perm, hva, &miss);
    vhd_iotlb_leave(vq->iotlb, vq->iotlb_slot);
    if (rc == -EFAULT) {
        iotlb_record_miss(vq, miss, perm);
        return -VHD_VQ_E_IOTLB_MISS;
    }
    return rc < 0 ? -VHD_VQ_E_IOTLB_RING : 0;
}

static int map_rings_iotlb(struct vhd_vq *vq, void **d, void **a, void **u)
{
    uint64_t dlen, alen, ulen;
    uint8_t dperm = VHD_IOTLB_R;

    if (vq->packed) {
        dlen = 16ull * vq->size;
        alen = ulen = sizeof(struct vhd_vring_packed_event);
        dperm = VHD_IOTLB_RW; /* the device writes used descriptors in place */
    } else {
        dlen = vhd_vring_desc_size(vq->size);
        alen = vhd_vring_avail_size(vq->size);
        ulen = vhd_vring_used_size(vq->size);
    }
    int rc = ring_iotlb(vq, vq->desc_addr, dlen, dperm, d);
    if (rc == 0)
        rc = ring_iotlb(vq, vq->avail_addr, alen, VHD_IOTLB_R, a);
    if (rc == 0)
        rc = ring_iotlb(vq, vq->used_addr, ulen, VHD_IOTLB_RW, u);
    if (rc == -VHD_VQ_E_IOTLB_MISS)
        return rc; /* not broken: tried again once the UPDATE came */
    if (rc < 0)
        return vhd_vq__fail(vq, -rc);
    /* Dirty logging of ring writes: the used ring's (device area's) GPA. */
    uint32_t hint = 0;
    if (vhd_mem_hva_to_gpa(vq->mem, *u, ulen, &hint, &vq->iotlb_used_gpa) < 0)
        return vhd_vq__fail(vq, VHD_VQ_E_IOTLB_RING);
    vq->log_used_gpa = vq->iotlb_used_gpa;
    return 0;
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

static int start_rings(struct vhd_vq *vq);

int vhd_vq__map_rings(struct vhd_vq *vq)
{
    void *d, *a, *u;

    if (vq->error)
        return -(int)vq->error;
    if (!vq->mem)
        return vhd_vq__fail(vq, VHD_VQ_E_RING_ADDR);
    if (vq->iotlb) {
        int rc = map_rings_iotlb(vq, &d, &a, &u);
        if (rc < 0)
            return rc;
    } else if (vq->packed) {
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
    if ((!vq->addr_is_gpa || vq->iotlb) &&
        vhd_mem_hva_to_gpa(vq->mem, d, 16, &hint, &vq->log_desc_gpa) < 0)
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
    if (vhd_unlikely(vq->start_pending))
        return start_rings(vq);
    return 0;
}

/*
 * The part of a start that reads the rings, run by the first successful
 * map_rings after vhd_vq_start (at once, or with an IOTLB once the rings'
 * translations arrived). 0 or -VHD_VQ_E_INFLIGHT (queue broken).
 */
static int start_rings(struct vhd_vq *vq)
{
    vq->start_pending = false;
    if (!vq->packed) {
        /* The used index lives in the ring; a restarted device continues from it. */
        vq->used_idx = vhd_le16(vhd_load_relaxed(&vq->ring.split.used->idx));
        vq->published_used = vq->used_idx;
    }
    if (vq->inf.any && vhd_vq__inflight_start(vq) < 0)
        return -VHD_VQ_E_INFLIGHT;
    return 0;
}

int vhd_vq_start(struct vhd_vq *vq)
{
    vq->rings_ok = false;
    vq->signalled_used_valid = false;
    vq->inflight = 0;
    vq->start_pending = true;
    int rc = vhd_vq__map_rings(vq);
    if (rc == -VHD_VQ_E_IOTLB_MISS)
        return -EAGAIN; /* started; the rings are mapped once the front-end answers */
    if (rc == -VHD_VQ_E_INFLIGHT)
        return -EBADMSG;
    if (rc < 0)
        return -EFAULT;
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
    vq->inf_retaken = 0;
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
    vq->xlat = vq->iotlb ? &vq->iotlb_one : mem;
    vq->mem_hint = 0;
    vq->log_hint = 0;
    vq->iotlb_one.nregions = 0;
    memset(vq->iotlb_cache, 0, sizeof(vq->iotlb_cache));
    vhd_vq_invalidate(vq);
}

void vhd_vq_set_iotlb(struct vhd_vq *vq, struct vhd_iotlb *iotlb, uint32_t slot, int event_fd)
{
    vq->iotlb = iotlb;
    vq->iotlb_slot = slot;
    vq->iotlb_event_fd = iotlb ? event_fd : -1;
    vq->iotlb_miss = 0;
    vhd_vq_set_mem(vq, vq->mem);
}

/* Does [a, a + alen) meet [b, b + blen)? (blen 0: to the end of the space) */
static bool ranges_meet(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
    if (a >= b)
        return blen == 0 || a - b < blen;
    return b - a < alen;
}

void vhd_vq_iotlb_invalidated(struct vhd_vq *vq, uint64_t iova, uint64_t size)
{
    uint64_t dlen, alen, ulen;

    vq->iotlb_one.nregions = 0;
    memset(vq->iotlb_cache, 0, sizeof(vq->iotlb_cache));
    if (!vq->rings_ok)
        return;
    if (vq->packed) {
        dlen = 16ull * vq->size;
        alen = ulen = sizeof(struct vhd_vring_packed_event);
    } else {
        dlen = vhd_vring_desc_size(vq->size);
        alen = vhd_vring_avail_size(vq->size);
        ulen = vhd_vring_used_size(vq->size);
    }
    if (ranges_meet(vq->desc_addr, dlen, iova, size) ||
        ranges_meet(vq->avail_addr, alen, iova, size) ||
        ranges_meet(vq->used_addr, ulen, iova, size))
        vhd_vq_invalidate(vq);
}

/*
 * A descriptor table (indirect) for reading: GPA lookup, or through the
 * IOTLB (one host-contiguous range). 0 and *t, or -VHD_VQ_E_* (the queue
 * broken, except for a miss).
 */
int vhd_vq__table_slow(struct vhd_vq *vq, uint64_t addr, uint32_t len, const void **t)
{
    if (!vq->iotlb) {
        *t = vhd_mem_gpa_to_hva(vq->mem, addr, len, &vq->mem_hint);
        return *t ? 0 : vhd_vq__fail(vq, VHD_VQ_E_ADDR);
    }
    struct iovec seg;
    int n = vhd_vq__iotlb_map(vq, addr, len, VHD_IOTLB_R, &seg, 1);
    if (n == -VHD_VQ_E_IOTLB_MISS)
        return n;
    if (n == -VHD_VQ_E_IOV_FULL)
        n = -VHD_VQ_E_ADDR; /* not host-contiguous: a table must be */
    if (n < 0)
        return vhd_vq__fail(vq, -n);
    *t = seg.iov_base;
    return 0;
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

    int n = 1;
    if (vq->iotlb) {
        n = vhd_vq__iotlb_map(vq, addr, len, writable ? VHD_IOTLB_W : VHD_IOTLB_R, iov + used,
                              max_iov - used);
        if (n == -VHD_VQ_E_IOTLB_MISS) {
            *total -= len;
            return n; /* not an error of the chain: it stays in the ring */
        }
        if (n < 0)
            return vhd_vq__fail(vq, -n);
        goto counted;
    }
    /* Fast path: the whole buffer in the hinted region. */
    void *p = vhd_mem_gpa_to_hva(vq->mem, addr, len, &vq->mem_hint);
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
counted:
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
    /* With an IOTLB the ring's GPA comes from its translation (map_rings). */
    vq->log_used_gpa = vq->iotlb ? vq->iotlb_used_gpa : used_gpa;
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
        if (l && vhd_mem_hva_to_gpa(vq->mem, iov[i].iov_base, l, &vq->log_hint, &gpa) == 0)
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

/*
 * Prefault (vhd_vq_prefault): translate [addr, addr + len) with perm as a
 * pop would, into a scratch vector; only a miss matters (recorded by
 * vhd_vq__iotlb_map). A buffer of more segments than the scratch holds is
 * taken as translated (its tail is checked by the pop).
 */
int vhd_vq__prefault_buf(struct vhd_vq *vq, uint64_t addr, uint32_t len, uint8_t perm)
{
    struct iovec scratch[8];

    if (len == 0)
        return 0;
    int n = vhd_vq__iotlb_map(vq, addr, len, perm, scratch, VHD_ARRAY_SIZE(scratch));
    if (n == -VHD_VQ_E_IOTLB_MISS)
        return 1;
    return n < 0 && n != -VHD_VQ_E_IOV_FULL ? -1 : 0;
}
