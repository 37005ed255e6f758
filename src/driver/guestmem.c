/* SPDX-License-Identifier: BSD-3-Clause */
/* memfd-backed guest memory of the userspace driver, tests and fuzzers. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "guestmem.h"

/*
 * Map size bytes of fd at an address that is a multiple of align: reserve
 * size + align of address space, put the mapping at the first aligned
 * address inside, give the rest back.
 */
static void *map_aligned(int fd, uint64_t size, uint64_t align)
{
    if (align <= (uint64_t)sysconf(_SC_PAGESIZE))
        return mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    uint8_t *res =
        mmap(NULL, size + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED)
        return MAP_FAILED;
    uint8_t *a = (uint8_t *)(((uintptr_t)res + align - 1) & ~(uintptr_t)(align - 1));
    void *p = mmap(a, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        munmap(res, size + align);
        errno = e;
        return MAP_FAILED;
    }
    if (a > res)
        munmap(res, (size_t)(a - res));
    if (res + size + align > a + size)
        munmap(a + size, (size_t)(res + size + align - (a + size)));
    return p;
}

int vhd_guestmem_init(struct vhd_guestmem *gm, uint32_t nregions, uint64_t size, uint64_t base,
                      uint64_t gap)
{
    return vhd_guestmem_init_aligned(gm, nregions, size, base, gap, 0);
}

int vhd_guestmem_init_aligned(struct vhd_guestmem *gm, uint32_t nregions, uint64_t size,
                              uint64_t base, uint64_t gap, uint64_t align)
{
    long page = sysconf(_SC_PAGESIZE);

    memset(gm, 0, sizeof(*gm));
    if (nregions == 0 || nregions > VHD_GUESTMEM_MAX_REGIONS || size == 0 || size % (uint64_t)page)
        return -EINVAL;
    if (align & (align - 1) || (align && size % align))
        return -EINVAL;
    uint64_t gpa = base;
    for (uint32_t i = 0; i < nregions; i++) {
        struct vhd_guestmem_region *r = &gm->r[i];
        int fd = memfd_create("vhostd-guest", MFD_CLOEXEC);
        if (fd < 0)
            goto fail;
        if (ftruncate(fd, (off_t)size) < 0) {
            close(fd);
            goto fail;
        }
        void *p = map_aligned(fd, size, align);
        if (p == MAP_FAILED) {
            close(fd);
            goto fail;
        }
        r->gpa = gpa;
        r->size = size;
        r->hva = p;
        r->fd = fd;
        gm->nregions++;
        gpa += size + gap;
    }
    return 0;
fail : {
    int err = -errno;
    vhd_guestmem_fini(gm);
    return err;
}
}

void vhd_guestmem_fini(struct vhd_guestmem *gm)
{
    for (uint32_t i = 0; i < gm->nregions; i++) {
        munmap(gm->r[i].hva, gm->r[i].size);
        close(gm->r[i].fd);
    }
    gm->nregions = 0;
}

void vhd_guestmem_descs(const struct vhd_guestmem *gm, struct vhd_mem_region_desc *out)
{
    for (uint32_t i = 0; i < gm->nregions; i++) {
        out[i].gpa = gm->r[i].gpa;
        out[i].size = gm->r[i].size;
        out[i].uva = (uint64_t)(uintptr_t)gm->r[i].hva;
        out[i].mmap_offset = 0;
        out[i].fd = gm->r[i].fd;
    }
}

void *vhd_guestmem_ptr(const struct vhd_guestmem *gm, uint64_t gpa, uint64_t len)
{
    for (uint32_t i = 0; i < gm->nregions; i++) {
        const struct vhd_guestmem_region *r = &gm->r[i];
        if (gpa >= r->gpa && gpa - r->gpa < r->size && len <= r->size - (gpa - r->gpa))
            return r->hva + (gpa - r->gpa);
    }
    return NULL;
}

uint64_t vhd_guestmem_uva(const struct vhd_guestmem *gm, uint64_t gpa)
{
    void *p = vhd_guestmem_ptr(gm, gpa, 0);
    return p ? (uint64_t)(uintptr_t)p : 0;
}

uint64_t vhd_guestmem_alloc(struct vhd_guestmem *gm, uint64_t len, uint64_t align, void **hva)
{
    if (align == 0 || (align & (align - 1)))
        return UINT64_MAX;
    while (gm->alloc_region < gm->nregions) {
        struct vhd_guestmem_region *r = &gm->r[gm->alloc_region];
        uint64_t off = (gm->alloc_off + align - 1) & ~(align - 1);
        if (off <= r->size && len <= r->size - off) {
            gm->alloc_off = off + len;
            if (hva)
                *hva = r->hva + off;
            return r->gpa + off;
        }
        gm->alloc_region++;
        gm->alloc_off = 0;
    }
    return UINT64_MAX;
}
