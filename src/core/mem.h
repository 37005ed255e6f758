/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest memory: an immutable table of mmap()ed regions shared by the
 * front-end, with guest-physical (GPA) and front-end-virtual (UVA) lookups.
 * A table never changes once built; a new memory layout is a new table that
 * replaces the old one at a quiescent point (see docs/ARCHITECTURE.md).
 */
#ifndef VHD_MEM_H
#define VHD_MEM_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "util/compiler.h"

/* VHOST_USER_GET_MAX_MEM_SLOTS answer, and the table's hard cap. */
#define VHD_MEM_MAX_REGIONS 509

/* One region as the front-end describes it (vhost-user memory region). */
struct vhd_mem_region_desc {
    uint64_t gpa;         /* guest physical address of the first byte */
    uint64_t size;        /* length in bytes, > 0 */
    uint64_t uva;         /* the front-end's own virtual address of the first byte */
    uint64_t mmap_offset; /* offset of the first byte within fd */
    int fd;               /* shared-memory fd; not consumed by vhd_mem_new */
};

/* A mapping, possibly shared by several tables (ADD_MEM_REG builds on old ones). */
struct vhd_mem_map {
    void *base;    /* mmap() result */
    size_t len;    /* mmap() length */
    unsigned refs; /* tables holding it; changed only by the control thread */
    int guard;     /* its vhd_memguard slot */
};

/* One mapped region. Fields are read-only after vhd_mem_new(). */
struct vhd_mem_region {
    uint64_t gpa;
    uint64_t size;
    uint64_t uva;
    uint64_t mmap_offset;
    uint8_t *hva; /* host address of gpa (inside map) */
    struct vhd_mem_map *map;
};

/* An immutable region table, sorted by GPA. */
struct vhd_mem {
    uint32_t nregions;
    struct vhd_mem_region *regions; /* sorted by gpa, non-overlapping in gpa */
    uint32_t *by_uva;               /* region indices sorted by uva */
};

/*
 * vhd_mem_new - map n regions and build a table.
 * Each fd is mmap()ed MAP_SHARED, read-write, honouring mmap_offset (the
 * offset is rounded down to a page for mmap and the remainder added back).
 * The fds stay owned by the caller and may be closed after the call.
 * Returns 0 and *out, or -EINVAL (n > VHD_MEM_MAX_REGIONS, zero size,
 * overflowing ranges, overlapping GPA or UVA ranges), -ENOMEM, or the mmap
 * errno (-ENXIO for mmap_offset + size beyond a regular file's size, -EBADF,
 * -EACCES for a read-only fd, -ENODEV for a socket).
 * n == 0 builds an empty table.
 */
int vhd_mem_new(const struct vhd_mem_region_desc *descs, uint32_t n, struct vhd_mem **out);

/*
 * vhd_mem_add - new table = old + one region (VHOST_USER_ADD_MEM_REG).
 * Mappings of old regions are shared (refcounted), not remapped. old is left
 * intact; free it with vhd_mem_free() once no worker uses it.
 */
int vhd_mem_add(const struct vhd_mem *old, const struct vhd_mem_region_desc *desc,
                struct vhd_mem **out);

/*
 * vhd_mem_remove - new table = old minus the region matching gpa, size and
 * uva exactly (VHOST_USER_REM_MEM_REG). -ENOENT if no region matches.
 */
int vhd_mem_remove(const struct vhd_mem *old, uint64_t gpa, uint64_t size, uint64_t uva,
                   struct vhd_mem **out);

/* Drop the table; a mapping is unmapped when its last table goes. NULL is fine. */
void vhd_mem_free(struct vhd_mem *mem);

/*
 * Slow path of the lookups: binary search for the region containing gpa.
 * Returns its index or -1. Updates *hint on success.
 */
int vhd_mem__find_gpa(const struct vhd_mem *mem, uint64_t gpa, uint32_t *hint);

/*
 * vhd_mem_gpa_to_hva - host pointer for [gpa, gpa+len) when the whole range
 * lies inside one region, NULL otherwise (outside memory, crosses a region
 * boundary, or gpa+len overflows). len may be 0 (then gpa must still be
 * inside a region). *hint is a caller-held cache of the last region hit
 * (any value is safe; it is bounds-checked), so a queue's hot path usually
 * does a single compare.
 */
static inline void *vhd_mem_gpa_to_hva(const struct vhd_mem *mem, uint64_t gpa, uint64_t len,
                                       uint32_t *hint)
{
    uint32_t h = *hint;
    const struct vhd_mem_region *r;

    if (vhd_likely(h < mem->nregions)) {
        r = &mem->regions[vhd_index_nospec(h, mem->nregions)];
        /* gpa - r->gpa cannot underflow once gpa >= r->gpa; compare lengths, not ends. */
        if (vhd_likely(gpa >= r->gpa && gpa - r->gpa < r->size && len <= r->size - (gpa - r->gpa)))
            return r->hva + vhd_index_nospec(gpa - r->gpa, r->size);
    }
    int i = vhd_mem__find_gpa(mem, gpa, hint);
    if (i < 0)
        return NULL;
    r = &mem->regions[i];
    if (len > r->size - (gpa - r->gpa))
        return NULL;
    return r->hva + vhd_index_nospec(gpa - r->gpa, r->size);
}

/*
 * vhd_mem_gpa_to_iov - translate [gpa, gpa+len) into host iovec segments,
 * one per region crossed (adjacent regions in GPA need not be adjacent in
 * host memory). Appends at most max_iov entries at iov.
 * Returns the number of entries written (0 when len == 0), or
 * -EFAULT (some byte is outside every region), -EOVERFLOW (gpa+len wraps),
 * -ENOBUFS (more than max_iov segments needed).
 */
int vhd_mem_gpa_to_iov(const struct vhd_mem *mem, uint64_t gpa, uint64_t len, struct iovec *iov,
                       uint32_t max_iov, uint32_t *hint);

/*
 * vhd_mem_uva_to_hva - host pointer for the front-end virtual range
 * [uva, uva+len) when it lies in one region, NULL otherwise. Used for ring
 * addresses (VHOST_USER_SET_VRING_ADDR carries front-end addresses).
 */
void *vhd_mem_uva_to_hva(const struct vhd_mem *mem, uint64_t uva, uint64_t len);

/* Slow path of the UVA lookup: index of the region containing uva, or -1. */
int vhd_mem__find_uva(const struct vhd_mem *mem, uint64_t uva);

/*
 * vhd_mem_hva_to_gpa - the guest-physical address of host pointer hva, when
 * [hva, hva+len) lies inside one region's mapping (what pop hands out: a
 * segment never crosses a region). 0 and *gpa, or -EFAULT. Regions' host
 * ranges are disjoint (each is its own mapping), so the answer is unique.
 * *hint as for the GPA lookups (a region index; any value is safe). Not on
 * the fast path: dirty logging uses it to log the buffers a device wrote
 * (a check of the hinted region, then a scan of the table).
 */
int vhd_mem_hva_to_gpa(const struct vhd_mem *mem, const void *hva, uint64_t len, uint32_t *hint,
                       uint64_t *gpa);

/*
 * vhd_mem_faulted - did the front-end take memory away under one of the
 * table's mappings (a SIGBUS absorbed by the guard, see memguard.h)? Such
 * a table reads zeros where the lost pages were; its device must be reset.
 * NULL is fine (false).
 */
bool vhd_mem_faulted(const struct vhd_mem *mem);

/*
 * Caps on the guest memory front-ends have us map. A front-end can pass
 * sparse files of any size, which cost it nothing and us address space:
 * without a cap one session could leave none for the other tenants. The
 * transport refuses a SET_MEM_TABLE or ADD_MEM_REG whose table would map
 * more than the device's cap (struct vhd_dev max_mem, 0: the default) or
 * take the whole process beyond its cap. Defaults, generous: 16 TiB per
 * device (beyond the largest guests), 64 TiB for the process (half of the
 * 128 TiB user address space of x86-64 and arm64 with 4-level tables).
 */
#define VHD_MEM_DEV_MAX_DEFAULT   (16ull << 40)
#define VHD_MEM_TOTAL_MAX_DEFAULT (64ull << 40)

/* vhd_mem_set_total_max - the process-wide cap in bytes (0: the default). Any thread. */
void vhd_mem_set_total_max(uint64_t bytes);

/* The process-wide cap in effect. Any thread. */
uint64_t vhd_mem_total_max(void);

/* Bytes of guest memory mapped now by every table of the process (each mapping once). */
uint64_t vhd_mem_mapped(void);

/* Bytes mapped by mem's regions (NULL: 0). */
uint64_t vhd_mem_bytes(const struct vhd_mem *mem);

/* Test/diagnostic helper: the region containing gpa, or NULL. */
const struct vhd_mem_region *vhd_mem_region_of(const struct vhd_mem *mem, uint64_t gpa);

#endif /* VHD_MEM_H */
