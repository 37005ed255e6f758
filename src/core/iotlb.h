/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Device IOTLB (vhost-user "IOMMU support"): the IOVA -> host translations a
 * front-end with a virtual IOMMU sends (VHOST_USER_IOTLB_MSG UPDATE and
 * INVALIDATE), as immutable versions of a persistent interval tree that
 * workers read without a lock while the control thread builds the next one.
 */
#ifndef VHD_IOTLB_H
#define VHD_IOTLB_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "util/compiler.h"
#include "mem.h"

/* Access permissions (the vhost IOTLB encoding: VHOST_ACCESS_RO / WO / RW). */
#define VHD_IOTLB_R  1u /* the device may read */
#define VHD_IOTLB_W  2u /* the device may write */
#define VHD_IOTLB_RW 3u

/*
 * One translation: [iova, iova + size) -> [hva, hva + size), inside region
 * `region` of the memory table the IOTLB was built against, so contiguous in
 * host memory and in GPA (gpa: for dirty logging). size > 0, iova + size
 * does not wrap.
 */
struct vhd_iotlb_ent {
    uint64_t iova;
    uint64_t size;
    uint8_t *hva;
    uint64_t gpa;
    uint32_t region;
    uint8_t perm; /* VHD_IOTLB_R / _W / _RW */
};

struct vhd_iotlb_node;

/*
 * One immutable version of the table: a treap sorted by iova whose entries
 * never overlap. Nodes are shared between versions (path copying); a
 * version is never changed once published.
 */
struct vhd_iotlb_ver {
    const struct vhd_iotlb_node *root;
    uint32_t n;                 /* entries */
    struct vhd_iotlb_ver *next; /* retired list (control thread) */
};

/* A reader's hazard slot: the version it is reading, or NULL. One per queue. */
struct vhd_iotlb_slot {
    const struct vhd_iotlb_ver *hz;
} vhd_cacheline_aligned;

/*
 * Per device. Threading: the control thread alone calls the functions that
 * change it (update, invalidate, flush, reclaim, free); workers only read
 * through vhd_iotlb_enter / vhd_iotlb_leave on their queue's slot.
 */
struct vhd_iotlb {
    const struct vhd_iotlb_ver *cur; /* published version: release store, acquire load */
    struct vhd_iotlb_ver *retired;   /* replaced versions not freed yet */
    struct vhd_iotlb_slot *slots;    /* nslots hazard slots */
    uint32_t nslots;
    uint64_t seed;               /* treap priorities: a front-end cannot predict the shape */
    uint64_t changes;            /* versions published (diagnostics, tests) */
    struct vhd_iotlb_node *pool; /* spare nodes for the next change, linked through l */
    uint32_t npool;
    uint32_t max_entries; /* UPDATEs that would hold more are refused (VHD_IOTLB_MAX_ENTRIES) */
};

/*
 * Entries one device's table may hold (a node is 80 bytes: 1 Mi entries
 * are ~80 MiB, more while a change shares the old version): 4 GiB of
 * guest memory mapped in 4 KiB pages. A front-end that maps more gets
 * -ENOSPC until it invalidates.
 */
#define VHD_IOTLB_MAX_ENTRIES (1u << 20)

/* vhd_iotlb_new - an empty IOTLB with nslots reader slots. 0 or -ENOMEM/-EINVAL. */
int vhd_iotlb_new(uint32_t nslots, struct vhd_iotlb **out);

/* Free everything. No reader may be inside (queues stopped). NULL is fine. */
void vhd_iotlb_free(struct vhd_iotlb *t);

/*
 * vhd_iotlb_update - map [iova, iova + size) to the front-end addresses
 * [uva, uva + size) with permission perm. The range is cut at memory region
 * boundaries (mem: the device's table), one entry per region crossed.
 * Overlap: an UPDATE replaces whatever it overlaps (the overlapped parts of
 * older entries are removed, their other parts kept), so the table never
 * holds two translations of one IOVA. Returns 1 when some existing
 * translation changed (another host address or region, or a permission
 * taken away: readers may have cached it, the caller must drop the queues'
 * caches at a quiescent point), 0 when the range was free or the UPDATE
 * only adds coverage or permission (an identical re-send, R -> RW),
 * or -EINVAL (size 0, iova + size or uva + size wraps, perm not R/W/RW),
 * -EFAULT (some byte of the UVA range is in no region: nothing changes),
 * -ENOSPC (the table would hold more than t->max_entries: nothing
 * changes), -ENOMEM (nothing changes). Control thread; O(k log n) for k
 * regions.
 */
int vhd_iotlb_update(struct vhd_iotlb *t, const struct vhd_mem *mem, uint64_t iova, uint64_t size,
                     uint64_t uva, uint8_t perm);

/*
 * vhd_iotlb_invalidate - remove every translation of [iova, iova + size)
 * (a range that runs past 2^64 - 1 is taken up to the end; size 0 removes
 * nothing). Parts of entries outside the range stay. Returns 1 when
 * something was removed, 0 when nothing was mapped there, -ENOMEM (nothing
 * changes). Control thread; O(log n) plus the entries cut.
 */
int vhd_iotlb_invalidate(struct vhd_iotlb *t, uint64_t iova, uint64_t size);

/* vhd_iotlb_flush - drop every entry (a new memory table). Returns 1 if any. */
int vhd_iotlb_flush(struct vhd_iotlb *t);

/*
 * vhd_iotlb_reclaim - free the replaced versions no reader holds any more.
 * Called after each change; a version a reader is inside stays until a later
 * call. Returns the number of versions still waiting.
 */
uint32_t vhd_iotlb_reclaim(struct vhd_iotlb *t);

/* Entries of the published version (control thread; diagnostics). */
uint32_t vhd_iotlb_count(const struct vhd_iotlb *t);

/* Height of the published version's tree (diagnostics: O(log n) expected). */
uint32_t vhd_iotlb_height(const struct vhd_iotlb *t);

/*
 * vhd_iotlb_enter - start reading through slot (a queue's; one thread per
 * slot): returns the published version, which stays valid until
 * vhd_iotlb_leave. A hazard pointer: announce, full fence, check that it is
 * still the published one (the control thread publishes, fences, then looks
 * at the slots), so one of the two always sees the other. Slow path only.
 */
static inline const struct vhd_iotlb_ver *vhd_iotlb_enter(struct vhd_iotlb *t, uint32_t slot)
{
    struct vhd_iotlb_slot *s = &t->slots[vhd_index_nospec(slot, t->nslots)];
    const struct vhd_iotlb_ver *v = vhd_load_acquire(&t->cur);

    for (;;) {
        vhd_store_relaxed(&s->hz, v);
        vhd_smp_mb(); /* pairs with the fence after the publishing store */
        const struct vhd_iotlb_ver *now = vhd_load_acquire(&t->cur);
        if (now == v)
            return v;
        v = now;
    }
}

static inline void vhd_iotlb_leave(struct vhd_iotlb *t, uint32_t slot)
{
    vhd_store_release(&t->slots[vhd_index_nospec(slot, t->nslots)].hz,
                      (const struct vhd_iotlb_ver *)NULL);
}

/* vhd_iotlb_lookup - the entry containing iova: 0 and *e, or -ENOENT. O(log n). */
int vhd_iotlb_lookup(const struct vhd_iotlb_ver *v, uint64_t iova, struct vhd_iotlb_ent *e);

/*
 * vhd_iotlb_next - the entry containing iova, else the first one above it:
 * 0 and *e, or -ENOENT. O(log n). For walks over the table (diagnostics,
 * tests).
 */
int vhd_iotlb_next(const struct vhd_iotlb_ver *v, uint64_t iova, struct vhd_iotlb_ent *e);

/*
 * vhd_iotlb_to_iov - translate [iova, iova + len) for an access needing
 * perm into host segments appended at iov (at most max_iov). Consecutive
 * entries are joined into one segment only when they are in one region and
 * adjacent in host memory too. Returns the number of segments (0 for len
 * 0), or -EFAULT with *miss set to the first IOVA not mapped (ask the
 * front-end), -EACCES (mapped without perm), -EOVERFLOW (iova + len wraps),
 * -ENOBUFS (more than max_iov segments).
 */
int vhd_iotlb_to_iov(const struct vhd_iotlb_ver *v, uint64_t iova, uint64_t len, uint8_t perm,
                     struct iovec *iov, uint32_t max_iov, uint64_t *miss);

/*
 * vhd_iotlb_to_hva - a host pointer for the whole of [iova, iova + len)
 * (rings): 0 and *hva, or the errors of vhd_iotlb_to_iov, and -ENXIO when
 * the range is mapped but not contiguous in host memory within one region.
 */
int vhd_iotlb_to_hva(const struct vhd_iotlb_ver *v, uint64_t iova, uint64_t len, uint8_t perm,
                     void **hva, uint64_t *miss);

#endif /* VHD_IOTLB_H */
