/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The driver's "guest" memory: memfd-backed shared memory laid out as one or
 * more regions at chosen guest-physical addresses, mapped into this process,
 * with a bump allocator. It is what the userspace driver hands to a backend
 * with SET_MEM_TABLE, and what the unit tests and fuzzers use as guest RAM.
 */
#ifndef VHD_DRV_GUESTMEM_H
#define VHD_DRV_GUESTMEM_H

#include <stddef.h>
#include <stdint.h>

#include "core/mem.h"

#define VHD_GUESTMEM_MAX_REGIONS 8

struct vhd_guestmem_region {
    uint64_t gpa;
    uint64_t size;
    uint8_t *hva; /* this process's mapping (also the front-end VA we advertise) */
    int fd;       /* memfd; owned by the guestmem */
};

struct vhd_guestmem {
    uint32_t nregions;
    struct vhd_guestmem_region r[VHD_GUESTMEM_MAX_REGIONS];
    uint32_t alloc_region; /* bump allocator position */
    uint64_t alloc_off;
};

/*
 * vhd_guestmem_init - create nregions memfd regions of `size` bytes each
 * (a multiple of the page size), the first at gpa `base`, each next one at
 * the previous end plus `gap` bytes (gap 0: adjacent in GPA, yet separately
 * mapped, so buffers crossing the boundary need two segments).
 * Returns 0 or -errno.
 */
int vhd_guestmem_init(struct vhd_guestmem *gm, uint32_t nregions, uint64_t size, uint64_t base,
                      uint64_t gap);
/*
 * vhd_guestmem_init_aligned - the same, each region mapped at an address that
 * is a multiple of align (0 or a power of two; size a multiple of it): what
 * IOMMU mappings of align-sized pages need (drv_iommu.h).
 */
int vhd_guestmem_init_aligned(struct vhd_guestmem *gm, uint32_t nregions, uint64_t size,
                              uint64_t base, uint64_t gap, uint64_t align);
void vhd_guestmem_fini(struct vhd_guestmem *gm);

/* Region descriptions (fd, gpa, size, uva = our hva) for vhd_mem_new or SET_MEM_TABLE. */
void vhd_guestmem_descs(const struct vhd_guestmem *gm, struct vhd_mem_region_desc *out);

/* Our pointer for a gpa range inside one region, or NULL. */
void *vhd_guestmem_ptr(const struct vhd_guestmem *gm, uint64_t gpa, uint64_t len);

/* Front-end VA (our hva) of a gpa, or 0 when outside. */
uint64_t vhd_guestmem_uva(const struct vhd_guestmem *gm, uint64_t gpa);

/*
 * vhd_guestmem_alloc - take len bytes aligned to align (power of two) from
 * the regions in order, never straddling a region. Returns the gpa (and
 * *hva), or UINT64_MAX when full.
 */
uint64_t vhd_guestmem_alloc(struct vhd_guestmem *gm, uint64_t len, uint64_t align, void **hva);

#endif /* VHD_DRV_GUESTMEM_H */
