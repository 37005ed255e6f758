/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared fixture of the virtqueue engine tests: memfd guest memory, the
 * device's own mapping of it (a vhd_mem table, as a real backend would have),
 * a driver-side ring laid out in it and a started device vq on the same rings,
 * plus raw "forging" helpers that write descriptors and ring entries directly
 * so tests can feed the engine input no well-behaved driver would produce.
 */
#ifndef VHD_TEST_VQ_FIXTURE_H
#define VHD_TEST_VQ_FIXTURE_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/vq.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "harness.h"

/* GPA of the first region: non-zero, so a GPA mistaken for a pointer faults. */
#define VQFX_BASE_GPA 0x100000ull
/* Default region size: big enough for a 32768-entry ring with indirect tables. */
#define VQFX_REGION_SIZE (32ull << 20)

struct vqfx_opts {
    uint32_t size;         /* queue size */
    bool packed;           /* packed layout */
    bool event_idx;        /* VIRTIO_F_EVENT_IDX on both sides */
    bool indirect;         /* the device negotiated VIRTIO_F_INDIRECT_DESC */
    uint32_t max_indirect; /* driver indirect table entries per id (0: none) */
    bool uva;              /* give the device front-end VAs instead of GPAs */
    uint32_t nregions;     /* guest regions (default 1) */
    uint64_t region_size;  /* bytes per region (default VQFX_REGION_SIZE) */
    uint64_t gap;          /* GPA gap between regions */
    bool no_start;         /* leave the device vq initialised but not started */
    bool in_order;         /* VIRTIO_F_IN_ORDER on both sides */
};

struct vqfx {
    struct vqfx_opts o;
    struct vhd_guestmem gm;      /* our ("guest") mapping */
    struct vhd_mem *mem;         /* the device's mapping of the same memfds */
    struct vhd_drv_vq dq;        /* driver side */
    struct vhd_vq_params params; /* what the device vq was initialised with */
    void *area;                  /* driver ring area (our pointer) */
    uint64_t area_gpa;
    size_t area_len;
    struct vhd_vq vq; /* device side */
};

/* Front-end VA (our mapping) of a gpa; the address the device gets in UVA mode. */
static inline uint64_t vqfx_addr(const struct vqfx *f, uint64_t gpa)
{
    return f->o.uva ? vhd_guestmem_uva(&f->gm, gpa) : gpa;
}

static inline void vqfx_params(const struct vqfx *f, struct vhd_vq_params *p)
{
    memset(p, 0, sizeof(*p));
    p->size = f->o.size;
    p->packed = f->o.packed;
    p->event_idx = f->o.event_idx;
    p->indirect = f->o.indirect;
    p->in_order = f->o.in_order;
    p->addr_is_gpa = !f->o.uva;
    p->desc = vqfx_addr(f, f->dq.desc_gpa);
    p->avail = vqfx_addr(f, f->dq.avail_gpa);
    p->used = vqfx_addr(f, f->dq.used_gpa);
}

/* Build the device's table over the guest memfds. */
static inline struct vhd_mem *vqfx_new_mem(const struct vqfx *f)
{
    struct vhd_mem_region_desc d[VHD_GUESTMEM_MAX_REGIONS];
    struct vhd_mem *m = NULL;

    vhd_guestmem_descs(&f->gm, d);
    VHD_CHECK_EQ(vhd_mem_new(d, f->gm.nregions, &m), 0);
    VHD_CHECK(m != NULL);
    return m;
}

static inline void vqfx_setup(struct vqfx *f, const struct vqfx_opts *o)
{
    memset(f, 0, sizeof(*f));
    f->o = *o;
    if (!f->o.nregions)
        f->o.nregions = 1;
    if (!f->o.region_size)
        f->o.region_size = VQFX_REGION_SIZE;
    VHD_CHECK_EQ(
        vhd_guestmem_init(&f->gm, f->o.nregions, f->o.region_size, VQFX_BASE_GPA, f->o.gap), 0);
    f->mem = vqfx_new_mem(f);
    f->area_len = vhd_drv_vq_area_size(f->o.size, f->o.packed, f->o.max_indirect);
    f->area_gpa = vhd_guestmem_alloc(&f->gm, f->area_len, 4096, &f->area);
    VHD_CHECK(f->area_gpa != UINT64_MAX);

    struct vhd_drv_vq_params dp = {
        .size = f->o.size,
        .packed = f->o.packed,
        .event_idx = f->o.event_idx,
        .in_order = f->o.in_order,
        .max_indirect = f->o.max_indirect,
        .area = f->area,
        .area_gpa = f->area_gpa,
        .area_len = f->area_len,
    };
    VHD_CHECK_EQ(vhd_drv_vq_init(&f->dq, &dp), 0);
    vqfx_params(f, &f->params);
    VHD_CHECK_EQ(vhd_vq_init(&f->vq, &f->params, f->mem), 0);
    if (!f->o.no_start)
        VHD_CHECK_EQ(vhd_vq_start(&f->vq), 0);
}

static inline void vqfx_teardown(struct vqfx *f)
{
    vhd_drv_vq_fini(&f->dq);
    vhd_mem_free(f->mem);
    f->mem = NULL;
    vhd_guestmem_fini(&f->gm);
}

/* Guest memory for buffers/tables: returns the gpa, *p our pointer (zeroed). */
static inline uint64_t vqfx_alloc(struct vqfx *f, uint64_t len, void **p)
{
    void *hva = NULL;
    uint64_t gpa = vhd_guestmem_alloc(&f->gm, len, 64, &hva);
    VHD_CHECK(gpa != UINT64_MAX);
    memset(hva, 0, len);
    if (p)
        *p = hva;
    return gpa;
}

static inline void *vqfx_ptr(const struct vqfx *f, uint64_t gpa, uint64_t len)
{
    void *p = vhd_guestmem_ptr(&f->gm, gpa, len);
    VHD_CHECK(p != NULL);
    return p;
}

/* End of guest memory (one past the last byte of the last region). */
static inline uint64_t vqfx_mem_end(const struct vqfx *f)
{
    const struct vhd_guestmem_region *r = &f->gm.r[f->gm.nregions - 1];
    return r->gpa + r->size;
}

/* Is [p, p+len) inside one region of the device's current table mapping? */
static inline bool vqfx_in_mem(const struct vhd_mem *m, const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;
    for (uint32_t i = 0; i < m->nregions; i++) {
        uintptr_t b = (uintptr_t)m->regions[i].hva;
        if (a >= b && a - b <= m->regions[i].size && len <= m->regions[i].size - (a - b))
            return true;
    }
    return false;
}

/* ---- split forging ---- */

static inline void vqfx_split_desc(struct vqfx *f, uint16_t i, uint64_t addr, uint32_t len,
                                   uint16_t flags, uint16_t next)
{
    struct vhd_vring_desc *d = &f->dq.ring.split.desc[i];
    d->addr = vhd_le64(addr);
    d->len = vhd_le32(len);
    d->flags = vhd_le16(flags);
    d->next = vhd_le16(next);
}

/* Descriptor in a table we own (indirect). */
static inline void vqfx_table_desc(void *table, uint32_t i, uint64_t addr, uint32_t len,
                                   uint16_t flags, uint16_t next)
{
    struct vhd_vring_desc *d = (struct vhd_vring_desc *)table + i;
    d->addr = vhd_le64(addr);
    d->len = vhd_le32(len);
    d->flags = vhd_le16(flags);
    d->next = vhd_le16(next);
}

/* Put head at the next avail slot and publish it (release store of idx). */
static inline void vqfx_split_post(struct vqfx *f, uint16_t head)
{
    struct vhd_vring_avail *a = f->dq.ring.split.avail;
    uint16_t idx = vhd_le16(a->idx);
    a->ring[idx & (f->o.size - 1)] = vhd_le16(head);
    vhd_store_release(&a->idx, vhd_le16((uint16_t)(idx + 1)));
}

static inline uint16_t *vqfx_split_used_event(struct vqfx *f)
{
    return &f->dq.ring.split.avail->ring[f->o.size];
}

static inline uint16_t *vqfx_split_avail_event(struct vqfx *f)
{
    return (uint16_t *)(void *)&f->dq.ring.split.used->ring[f->o.size];
}

/* ---- packed forging ---- */

/* AVAIL/USED bits that make a descriptor available for driver wrap counter w. */
static inline uint16_t vqfx_pavail(bool w)
{
    return w ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED;
}

/* Write a packed descriptor; flags (with AVAIL/USED bits) stored last. */
static inline void vqfx_packed_desc(struct vqfx *f, uint16_t slot, uint64_t addr, uint32_t len,
                                    uint16_t id, uint16_t flags)
{
    struct vhd_vring_packed_desc *d = &f->dq.ring.packed.desc[slot];
    d->addr = vhd_le64(addr);
    d->len = vhd_le32(len);
    d->id = vhd_le16(id);
    vhd_store_release(&d->flags, vhd_le16(flags));
}

/* One element of a packed chain to forge. */
struct vqfx_pd {
    uint64_t addr;
    uint32_t len;
    uint16_t id;
    uint16_t flags; /* NEXT/WRITE/INDIRECT only; AVAIL/USED are added */
};

/*
 * Forge a packed chain of n descriptors from *slot with driver wrap *wrap
 * (advanced past the chain). The first descriptor's flags are stored last,
 * as the spec requires of a driver (2.8.6).
 */
static inline void vqfx_packed_chain(struct vqfx *f, uint16_t *slot, bool *wrap,
                                     const struct vqfx_pd *d, uint32_t n)
{
    uint16_t first = *slot, first_flags = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint16_t fl = (uint16_t)(d[i].flags | vqfx_pavail(*wrap));
        if (i == 0) {
            first_flags = fl;
            struct vhd_vring_packed_desc *pd = &f->dq.ring.packed.desc[*slot];
            pd->addr = vhd_le64(d[i].addr);
            pd->len = vhd_le32(d[i].len);
            pd->id = vhd_le16(d[i].id);
        } else {
            vqfx_packed_desc(f, *slot, d[i].addr, d[i].len, d[i].id, fl);
        }
        if (++*slot == f->o.size) {
            *slot = 0;
            *wrap = !*wrap;
        }
    }
    vhd_store_release(&f->dq.ring.packed.desc[first].flags, vhd_le16(first_flags));
}

/* Descriptor in a packed indirect table. */
static inline void vqfx_ptable_desc(void *table, uint32_t i, uint64_t addr, uint32_t len,
                                    uint16_t id, uint16_t flags)
{
    struct vhd_vring_packed_desc *d = (struct vhd_vring_packed_desc *)table + i;
    d->addr = vhd_le64(addr);
    d->len = vhd_le32(len);
    d->id = vhd_le16(id);
    d->flags = vhd_le16(flags);
}

/* ---- checks ---- */

/*
 * The queue must be broken with err, stay broken, and answer every verb
 * accordingly without touching the used ring.
 */
static inline void vqfx_expect_broken(struct vqfx *f, int err)
{
    struct iovec iov[16];
    struct vhd_vq_chain c;
    uint16_t used_before = 0;
    struct vhd_vring_packed_desc ring_before[8];

    VHD_CHECK_EQ(f->vq.error, err);
    if (f->o.packed)
        memcpy(ring_before, f->dq.ring.packed.desc,
               sizeof(ring_before[0]) * (f->o.size < 8 ? f->o.size : 8));
    else
        used_before = vhd_le16(f->dq.ring.split.used->idx);
    for (int i = 0; i < 3; i++) {
        memset(&c, 0, sizeof(c));
        VHD_CHECK_EQ(vhd_vq_pop(&f->vq, iov, 16, &c), -err);
    }
    memset(&c, 0, sizeof(c));
    c.ndescs = 1;
    VHD_CHECK_EQ(vhd_vq_push(&f->vq, &c, 0), -err);
    vhd_vq_flush(&f->vq);
    VHD_CHECK(!vhd_vq_need_notify(&f->vq));
    VHD_CHECK(!vhd_vq_enable_notify(&f->vq));
    VHD_CHECK(!vhd_vq_has_work(&f->vq));
    vhd_vq_disable_notify(&f->vq);
    VHD_CHECK_EQ(f->vq.error, err);
    if (f->o.packed)
        VHD_CHECK(memcmp(ring_before, f->dq.ring.packed.desc,
                         sizeof(ring_before[0]) * (f->o.size < 8 ? f->o.size : 8)) == 0);
    else
        VHD_CHECK_EQ(vhd_le16(f->dq.ring.split.used->idx), used_before);
}

#endif /* VHD_TEST_VQ_FIXTURE_H */
