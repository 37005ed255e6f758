/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the guest memory table (src/core/mem.c): validation of region
 * lists, mmap_offset handling, GPA/UVA lookups at every boundary, hints,
 * cross-region iovecs, and the sharing of mappings between tables.
 */
#ifndef _GNU_SOURCE
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#endif
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/mem.h"
#include "driver/guestmem.h"
#include "harness.h"

/* ---- helpers ---- */

static uint64_t page_size(void)
{
    return (uint64_t)sysconf(_SC_PAGESIZE);
}

/* A memfd of size bytes, or the test fails. */
static int memfd_sized(uint64_t size)
{
    int fd = memfd_create("test-mem", MFD_CLOEXEC);
    VHD_CHECK(fd >= 0);
    VHD_CHECK(ftruncate(fd, (off_t)size) == 0);
    return fd;
}

/* Our own ("driver") mapping of a whole memfd. */
static uint8_t *map_all(int fd, uint64_t size)
{
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    VHD_CHECK(p != MAP_FAILED);
    return p;
}

static struct vhd_mem_region_desc desc(uint64_t gpa, uint64_t size, uint64_t uva, uint64_t off,
                                       int fd)
{
    struct vhd_mem_region_desc d = {
        .gpa = gpa, .size = size, .uva = uva, .mmap_offset = off, .fd = fd};
    return d;
}

/*
 * Number of this process's mappings of memfds named "test-mem" (lines of
 * /proc/self/maps; sanitizer runtimes add mappings of their own, so only
 * ours are counted).
 */
static int count_maps(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    int n = 0;

    VHD_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, "memfd:test-mem ") != NULL;
    fclose(f);
    return n;
}

/* Is the host address p inside some mapping of this process? */
static int is_mapped(const void *p)
{
    unsigned char vec;
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page_size() - 1);

    return mincore((void *)a, 1, &vec) == 0;
}

/*
 * Three 16 KiB guestmem regions at GPA 0x100000 with gap bytes between them,
 * and a table over them.
 */
#define R_SIZE 0x4000ull
#define R_BASE 0x100000ull

static void setup3(struct vhd_guestmem *gm, uint64_t gap, struct vhd_mem **mem)
{
    struct vhd_mem_region_desc d[3];

    VHD_CHECK_EQ(vhd_guestmem_init(gm, 3, R_SIZE, R_BASE, gap), 0);
    vhd_guestmem_descs(gm, d);
    VHD_CHECK_EQ(vhd_mem_new(d, 3, mem), 0);
    VHD_CHECK_EQ((*mem)->nregions, 3);
}

/* ---- empty and trivial tables ---- */

VHD_TEST(empty_table_lookups_fail)
{
    struct vhd_mem *mem = NULL;
    struct iovec iov[2];
    uint32_t hint = 0;

    VHD_CHECK_EQ(vhd_mem_new(NULL, 0, &mem), 0);
    VHD_CHECK(mem != NULL);
    VHD_CHECK_EQ(mem->nregions, 0);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, 0, 0, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, 0x1000, 1, &hint) == NULL);
    hint = UINT32_MAX;
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, 0x1000, 1, &hint) == NULL);
    VHD_CHECK_EQ(hint, UINT32_MAX);
    VHD_CHECK_EQ(vhd_mem__find_gpa(mem, 0, &hint), -1);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, 0, 1, iov, 2, &hint), -EFAULT);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, 0, 0, iov, 2, &hint), 0);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, 0, 0) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, 0x1000, 1) == NULL);
    VHD_CHECK(vhd_mem_region_of(mem, 0) == NULL);
    vhd_mem_free(mem);
    vhd_mem_free(NULL);
}

VHD_TEST(null_descs_with_count_fails)
{
    struct vhd_mem *mem = NULL;

    VHD_CHECK_EQ(vhd_mem_new(NULL, 1, &mem), -EINVAL);
    VHD_CHECK_EQ(vhd_mem_new(NULL, VHD_MEM_MAX_REGIONS + 1, &mem), -EINVAL);
    VHD_CHECK(mem == NULL);
}

/* ---- GPA lookups ---- */

VHD_TEST(gpa_boundaries_one_region)
{
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    uint32_t hint = 0;

    setup3(&gm, 0x10000, &mem);
    const struct vhd_mem_region *r = &mem->regions[0];
    VHD_CHECK_EQ(r->gpa, R_BASE);
    VHD_CHECK_EQ(r->size, R_SIZE);

    /* first byte, last byte, whole region, len 0 at start */
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE, 1, &hint) == r->hva);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE + R_SIZE - 1, 1, &hint) == r->hva + R_SIZE - 1);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE, R_SIZE, &hint) == r->hva);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE + 8, R_SIZE - 8, &hint) == r->hva + 8);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE, 0, &hint) == r->hva);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE + R_SIZE - 1, 0, &hint) == r->hva + R_SIZE - 1);
    /* one past the end, one before the start, len one too long */
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE + R_SIZE, 1, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE + R_SIZE, 0, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE - 1, 1, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE - 1, 2, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE, R_SIZE + 1, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE + R_SIZE - 1, 2, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, 0, 1, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, UINT64_MAX, 1, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE, UINT64_MAX, &hint) == NULL);
    /* the same through the slow path directly */
    VHD_CHECK_EQ(vhd_mem__find_gpa(mem, R_BASE, &hint), 0);
    VHD_CHECK_EQ(vhd_mem__find_gpa(mem, R_BASE + R_SIZE - 1, &hint), 0);
    VHD_CHECK_EQ(vhd_mem__find_gpa(mem, R_BASE + R_SIZE, &hint), -1);
    VHD_CHECK_EQ(vhd_mem__find_gpa(mem, R_BASE - 1, &hint), -1);
    VHD_CHECK(vhd_mem_region_of(mem, R_BASE + 5) == r);
    VHD_CHECK(vhd_mem_region_of(mem, R_BASE - 1) == NULL);

    vhd_mem_free(mem);
    vhd_guestmem_fini(&gm);
}

VHD_TEST(gpa_gaps_between_regions)
{
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    const uint64_t gap = 0x10000;
    uint32_t hint = 0;

    setup3(&gm, gap, &mem);
    for (uint32_t i = 0; i < 3; i++) {
        const struct vhd_mem_region *r = &mem->regions[i];
        uint64_t start = R_BASE + i * (R_SIZE + gap);
        VHD_CHECK_EQ(r->gpa, start);
        VHD_CHECK(vhd_mem_gpa_to_hva(mem, start, 1, &hint) == r->hva);
        VHD_CHECK_EQ(hint, i);
        VHD_CHECK(vhd_mem_gpa_to_hva(mem, start + R_SIZE - 1, 1, &hint) == r->hva + R_SIZE - 1);
        VHD_CHECK(vhd_mem_region_of(mem, start + R_SIZE / 2) == r);
        /* every edge of the following gap */
        VHD_CHECK(vhd_mem_gpa_to_hva(mem, start + R_SIZE, 1, &hint) == NULL);
        VHD_CHECK(vhd_mem_gpa_to_hva(mem, start + R_SIZE + gap / 2, 1, &hint) == NULL);
        VHD_CHECK(vhd_mem_gpa_to_hva(mem, start + R_SIZE + gap - 1, 1, &hint) == NULL);
        VHD_CHECK(vhd_mem_region_of(mem, start + R_SIZE) == NULL);
        VHD_CHECK(vhd_mem_region_of(mem, start - 1) == NULL);
    }
    vhd_mem_free(mem);
    vhd_guestmem_fini(&gm);
}

VHD_TEST(gpa_hint_garbage_and_update)
{
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    const uint64_t gap = 0x10000;
    const uint32_t bad[] = {UINT32_MAX, 3, 4, 0x80000000u, 12345};

    setup3(&gm, gap, &mem);
    uint64_t g2 = R_BASE + 2 * (R_SIZE + gap) + 17;
    for (size_t k = 0; k < VHD_ARRAY_SIZE(bad); k++) {
        uint32_t hint = bad[k];
        VHD_CHECK(vhd_mem_gpa_to_hva(mem, g2, 1, &hint) == mem->regions[2].hva + 17);
        VHD_CHECK_EQ(hint, 2);
    }
    /* stale: hint names another valid region */
    uint32_t hint = 0;
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, g2, 4, &hint) == mem->regions[2].hva + 17);
    VHD_CHECK_EQ(hint, 2);
    /* hit in the hinted region keeps it */
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, g2 + 1, 4, &hint) == mem->regions[2].hva + 18);
    VHD_CHECK_EQ(hint, 2);
    /* hinted region contains gpa but not the whole length: slow path, NULL */
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, g2, R_SIZE, &hint) == NULL);
    /* a miss leaves the hint alone */
    hint = 1;
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE - 1, 1, &hint) == NULL);
    VHD_CHECK_EQ(hint, 1);
    hint = UINT32_MAX;
    VHD_CHECK_EQ(vhd_mem__find_gpa(mem, R_BASE + R_SIZE + gap, &hint), 1);
    VHD_CHECK_EQ(hint, 1);
    /* gpa_to_iov honours and updates the hint too, whatever its value */
    struct iovec iov[1];
    for (size_t k = 0; k < VHD_ARRAY_SIZE(bad); k++) {
        hint = bad[k];
        VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, g2, 8, iov, 1, &hint), 1);
        VHD_CHECK(iov[0].iov_base == mem->regions[2].hva + 17);
        VHD_CHECK_EQ(iov[0].iov_len, 8);
        VHD_CHECK_EQ(hint, 2);
    }
    vhd_mem_free(mem);
    vhd_guestmem_fini(&gm);
}

VHD_TEST(data_is_shared_with_driver_mapping)
{
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    uint32_t hint = 0;

    setup3(&gm, 0, &mem);
    for (uint32_t i = 0; i < 3; i++) {
        uint64_t gpa = R_BASE + i * R_SIZE + 100;
        uint8_t *ours = vhd_mem_gpa_to_hva(mem, gpa, 64, &hint);
        uint8_t *drv = vhd_guestmem_ptr(&gm, gpa, 64);
        VHD_CHECK(ours != NULL && drv != NULL);
        VHD_CHECK(ours != drv); /* separate mappings of the same memory */
        memset(drv, 0xa0 + (int)i, 64);
        VHD_CHECK_EQ(ours[0], 0xa0 + i);
        VHD_CHECK_EQ(ours[63], 0xa0 + i);
        ours[10] = 0x5a;
        VHD_CHECK_EQ(drv[10], 0x5a);
    }
    vhd_mem_free(mem);
    vhd_guestmem_fini(&gm);
}

VHD_TEST(fds_may_be_closed_after_new)
{
    uint64_t pg = page_size();
    int fd = memfd_sized(pg);
    uint8_t *drv = map_all(fd, pg);
    struct vhd_mem_region_desc d = desc(0, pg, 0x7000000, 0, fd);
    struct vhd_mem *mem;
    uint32_t hint = 0;

    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), 0);
    close(fd);
    drv[pg - 1] = 0x42;
    uint8_t *p = vhd_mem_gpa_to_hva(mem, pg - 1, 1, &hint);
    VHD_CHECK(p != NULL);
    VHD_CHECK_EQ(*p, 0x42);
    vhd_mem_free(mem);
    munmap(drv, pg);
}

/* ---- gpa_to_iov ---- */

VHD_TEST(iov_single_region_and_len0)
{
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    struct iovec iov[4];
    uint32_t hint = 0;

    setup3(&gm, 0x10000, &mem);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE, R_SIZE, iov, 4, &hint), 1);
    VHD_CHECK(iov[0].iov_base == mem->regions[0].hva);
    VHD_CHECK_EQ(iov[0].iov_len, R_SIZE);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE + R_SIZE - 1, 1, iov, 4, &hint), 1);
    VHD_CHECK(iov[0].iov_base == mem->regions[0].hva + R_SIZE - 1);
    VHD_CHECK_EQ(iov[0].iov_len, 1);
    /* len 0 writes nothing, whatever the address */
    iov[0].iov_len = 777;
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, 0, 0, iov, 4, &hint), 0);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, UINT64_MAX, 0, iov, 0, &hint), 0);
    VHD_CHECK_EQ(iov[0].iov_len, 777);
    /* one past the end, one before the start, one byte too long */
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE + R_SIZE, 1, iov, 4, &hint), -EFAULT);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE - 1, 1, iov, 4, &hint), -EFAULT);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE - 1, 2, iov, 4, &hint), -EFAULT);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE, R_SIZE + 1, iov, 4, &hint), -EFAULT);
    vhd_mem_free(mem);
    vhd_guestmem_fini(&gm);
}

VHD_TEST(iov_crosses_adjacent_regions)
{
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    struct iovec iov[4];
    uint32_t hint = UINT32_MAX;

    setup3(&gm, 0, &mem); /* adjacent in GPA, separately mapped */
    /* fill the whole guest memory through the driver's mappings */
    for (uint64_t g = R_BASE; g < R_BASE + 3 * R_SIZE; g++)
        *(uint8_t *)vhd_guestmem_ptr(&gm, g, 1) = (uint8_t)(g * 7 + 3);

    uint64_t gpa = R_BASE + R_SIZE - 100, len = 100 + R_SIZE + 50;
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, gpa, len, iov, 4, &hint), 3);
    VHD_CHECK(iov[0].iov_base == mem->regions[0].hva + R_SIZE - 100);
    VHD_CHECK_EQ(iov[0].iov_len, 100);
    VHD_CHECK(iov[1].iov_base == mem->regions[1].hva);
    VHD_CHECK_EQ(iov[1].iov_len, R_SIZE);
    VHD_CHECK(iov[2].iov_base == mem->regions[2].hva);
    VHD_CHECK_EQ(iov[2].iov_len, 50);
    VHD_CHECK_EQ(hint, 2); /* region of the last byte */
    /* the bytes read through the iovecs are the guest's bytes, in order */
    uint64_t g = gpa;
    for (int s = 0; s < 3; s++)
        for (size_t k = 0; k < iov[s].iov_len; k++, g++)
            VHD_CHECK_EQ(((uint8_t *)iov[s].iov_base)[k], (uint8_t)(g * 7 + 3));
    VHD_CHECK_EQ(g, gpa + len);

    /* exactly the boundary: two segments, the second of one byte */
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE + R_SIZE - 1, 2, iov, 2, &hint), 2);
    VHD_CHECK_EQ(iov[0].iov_len, 1);
    VHD_CHECK_EQ(iov[1].iov_len, 1);
    VHD_CHECK(iov[1].iov_base == mem->regions[1].hva);
    /* all of memory, ending exactly at the end of the last region */
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE, 3 * R_SIZE, iov, 3, &hint), 3);
    VHD_CHECK_EQ(iov[0].iov_len + iov[1].iov_len + iov[2].iov_len, 3 * R_SIZE);
    /* ...and one byte more */
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE, 3 * R_SIZE + 1, iov, 4, &hint), -EFAULT);
    /* the single-region fast path refuses a crossing range */
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, R_BASE + R_SIZE - 1, 2, &hint) == NULL);
    vhd_mem_free(mem);
    vhd_guestmem_fini(&gm);
}

VHD_TEST(iov_errors)
{
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    struct iovec iov[4];
    uint32_t hint = 1;

    setup3(&gm, 0, &mem);
    uint64_t gpa = R_BASE + R_SIZE - 100, len = 100 + R_SIZE + 50;
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, gpa, len, iov, 2, &hint), -ENOBUFS);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, gpa, len, iov, 1, &hint), -ENOBUFS);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, gpa, len, NULL, 0, &hint), -ENOBUFS);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE, 1, NULL, 0, &hint), -ENOBUFS);
    VHD_CHECK_EQ(hint, 1); /* unchanged by failures */
    /* gap at the end beats a too-small array: the range is bad regardless */
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, gpa, 3 * R_SIZE, iov, 1, &hint), -EFAULT);
    /* gpa + len beyond UINT64_MAX (including a range ending exactly at 2^64) */
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, UINT64_MAX, 1, iov, 4, &hint), -EOVERFLOW);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, UINT64_MAX, 2, iov, 4, &hint), -EOVERFLOW);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, UINT64_MAX - 10, 20, iov, 4, &hint), -EOVERFLOW);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE, UINT64_MAX, iov, 4, &hint), -EOVERFLOW);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, 1, UINT64_MAX, iov, 4, &hint), -EOVERFLOW);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, gpa, UINT64_MAX - gpa + 1, iov, 4, &hint), -EOVERFLOW);
    /* ...while a range ending at UINT64_MAX does not wrap: it is just uncovered */
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, UINT64_MAX - 1, 1, iov, 4, &hint), -EFAULT);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, gpa, UINT64_MAX - gpa, iov, 4, &hint), -EFAULT);
    VHD_CHECK_EQ(hint, 1);
    vhd_mem_free(mem);
    vhd_guestmem_fini(&gm);

    /* with a gap between regions: starting in the gap, crossing into it */
    setup3(&gm, 0x1000, &mem);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE + R_SIZE, 1, iov, 4, &hint), -EFAULT);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE + R_SIZE - 1, 2, iov, 4, &hint), -EFAULT);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE + R_SIZE - 1, 0x1000 + 2, iov, 4, &hint), -EFAULT);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE + R_SIZE + 0x1000 - 1, 2, iov, 4, &hint), -EFAULT);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, R_BASE + R_SIZE + 0x1000, 2, iov, 4, &hint), 1);
    VHD_CHECK(iov[0].iov_base == mem->regions[1].hva);
    vhd_mem_free(mem);
    vhd_guestmem_fini(&gm);
}

/* ---- UVA lookups ---- */

VHD_TEST(uva_lookups)
{
    uint64_t pg = page_size();
    const uint64_t u0 = 0x7f0000000000;
    int fd = memfd_sized(3 * pg);
    struct vhd_mem *mem;
    /* UVA order is the reverse of GPA order: 2 and 1 adjacent, a gap before 0 */
    struct vhd_mem_region_desc d[3] = {
        desc(0, pg, u0 + 5 * pg, 0, fd),
        desc(16 * pg, pg, u0 + 3 * pg, pg, fd),
        desc(32 * pg, pg, u0 + 2 * pg, 2 * pg, fd),
    };
    uint32_t hint = 0;

    VHD_CHECK_EQ(vhd_mem_new(d, 3, &mem), 0);
    for (int i = 0; i < 3; i++) {
        const struct vhd_mem_region *r = vhd_mem_region_of(mem, d[i].gpa);
        VHD_CHECK(r != NULL);
        VHD_CHECK_EQ(r->uva, d[i].uva);
        uint64_t u = d[i].uva;
        VHD_CHECK(vhd_mem_uva_to_hva(mem, u, 1) == r->hva);
        VHD_CHECK(vhd_mem_uva_to_hva(mem, u, 0) == r->hva);
        VHD_CHECK(vhd_mem_uva_to_hva(mem, u, pg) == r->hva);
        VHD_CHECK(vhd_mem_uva_to_hva(mem, u + pg - 1, 1) == r->hva + pg - 1);
        VHD_CHECK(vhd_mem_uva_to_hva(mem, u + pg - 1, 0) == r->hva + pg - 1);
        VHD_CHECK(vhd_mem_uva_to_hva(mem, u + 8, 16) ==
                  vhd_mem_gpa_to_hva(mem, d[i].gpa + 8, 16, &hint));
        VHD_CHECK(vhd_mem_uva_to_hva(mem, u, pg + 1) == NULL);
        VHD_CHECK(vhd_mem_uva_to_hva(mem, u + pg - 1, 2) == NULL);
        VHD_CHECK(vhd_mem_uva_to_hva(mem, u, UINT64_MAX) == NULL);
    }
    /* regions 2 and 1 are adjacent in UVA but a lookup never spans them */
    VHD_CHECK(vhd_mem_uva_to_hva(mem, u0 + 3 * pg - 1, 2) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, u0 + 3 * pg, 0) != NULL);
    /* before, between, after */
    VHD_CHECK(vhd_mem_uva_to_hva(mem, u0 + 2 * pg - 1, 1) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, u0 + 2 * pg - 1, 0) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, u0 + 4 * pg, 1) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, u0 + 4 * pg, 0) == NULL); /* one past, len 0 */
    VHD_CHECK(vhd_mem_uva_to_hva(mem, u0 + 6 * pg, 0) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, u0 + 5 * pg - 1, 1) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, u0 + 6 * pg, 1) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, 0, 1) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(mem, UINT64_MAX, 1) == NULL);
    /* by_uva really is sorted by uva */
    for (uint32_t i = 1; i < mem->nregions; i++)
        VHD_CHECK(mem->regions[mem->by_uva[i - 1]].uva < mem->regions[mem->by_uva[i]].uva);
    vhd_mem_free(mem);
    close(fd);
}

/* ---- mmap_offset ---- */

VHD_TEST(mmap_offset_honoured)
{
    uint64_t pg = page_size();
    int fd = memfd_sized(4 * pg);
    uint8_t *drv = map_all(fd, 4 * pg);
    struct vhd_mem *mem;
    uint32_t hint = 0;

    for (uint64_t k = 0; k < 4 * pg; k++)
        drv[k] = (uint8_t)(k ^ (k >> 8));
    /* page-aligned and non-page-aligned offsets, both in one table */
    const uint64_t off_a = pg, off_b = 2 * pg + 100;
    struct vhd_mem_region_desc d[2] = {
        desc(0x10000, pg, 0x200000, off_a, fd),
        desc(0x20000, 1000, 0x300000, off_b, fd),
    };
    VHD_CHECK_EQ(vhd_mem_new(d, 2, &mem), 0);
    for (int i = 0; i < 2; i++) {
        const uint8_t *p = vhd_mem_gpa_to_hva(mem, d[i].gpa, d[i].size, &hint);
        VHD_CHECK(p != NULL);
        for (uint64_t k = 0; k < d[i].size; k++) {
            uint64_t f = d[i].mmap_offset + k;
            VHD_CHECK_EQ(p[k], (uint8_t)(f ^ (f >> 8)));
        }
        const struct vhd_mem_region *r = vhd_mem_region_of(mem, d[i].gpa);
        VHD_CHECK_EQ(r->mmap_offset, d[i].mmap_offset);
        VHD_CHECK((uint8_t *)r->map->base <= r->hva);
        VHD_CHECK(r->hva + r->size <= (uint8_t *)r->map->base + r->map->len);
    }
    /* the unaligned one: mapped from the page below, remainder added */
    const struct vhd_mem_region *rb = vhd_mem_region_of(mem, 0x20000);
    VHD_CHECK(rb->hva == (uint8_t *)rb->map->base + 100);
    /* writes land at the right file offset */
    uint8_t *p = vhd_mem_gpa_to_hva(mem, 0x20000 + 999, 1, &hint);
    VHD_CHECK(p != NULL);
    *p = 0xee;
    uint8_t b = 0;
    VHD_CHECK_EQ(pread(fd, &b, 1, (off_t)(off_b + 999)), 1);
    VHD_CHECK_EQ(b, 0xee);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, 0x20000 + 1000, 1, &hint) == NULL);
    vhd_mem_free(mem);
    munmap(drv, 4 * pg);
    close(fd);
}

VHD_TEST(offset_beyond_file_fails)
{
    uint64_t pg = page_size();
    int fd = memfd_sized(4 * pg);
    struct vhd_mem *mem = NULL;
    struct vhd_mem_region_desc d;

    d = desc(0, 4 * pg, 0x100000, 0, fd); /* exactly the file: fine */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), 0);
    vhd_mem_free(mem);
    mem = NULL;
    d = desc(0, 1, 0x100000, 4 * pg - 1, fd); /* last byte: fine */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), 0);
    vhd_mem_free(mem);
    mem = NULL;

    d = desc(0, 1, 0x100000, 4 * pg, fd); /* first byte past EOF */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -ENXIO);
    d = desc(0, 2 * pg, 0x100000, 3 * pg, fd); /* runs past EOF */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -ENXIO);
    d = desc(0, 4 * pg + 1, 0x100000, 0, fd); /* one byte too long */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -ENXIO);
    d = desc(0, pg, 0x100000, 1ull << 40, fd); /* far beyond */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -ENXIO);
    d = desc(0, pg, 0x100000, 1ull << 63, fd); /* not an off_t */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EINVAL);
    d = desc(0, 2, 0x100000, UINT64_MAX, fd); /* offset + size wraps */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EINVAL);
    VHD_CHECK(mem == NULL);
    close(fd);
}

/* ---- validation ---- */

VHD_TEST(zero_size_fails)
{
    int fd = memfd_sized(page_size());
    struct vhd_mem_region_desc d[2] = {
        desc(0, page_size(), 0x100000, 0, fd),
        desc(0x100000, 0, 0x200000, 0, fd),
    };
    struct vhd_mem *mem = NULL;

    VHD_CHECK_EQ(vhd_mem_new(d, 2, &mem), -EINVAL);
    VHD_CHECK_EQ(vhd_mem_new(&d[1], 1, &mem), -EINVAL);
    d[1].fd = -1; /* rejected before any fd is looked at */
    VHD_CHECK_EQ(vhd_mem_new(&d[1], 1, &mem), -EINVAL);
    VHD_CHECK(mem == NULL);
    close(fd);
}

VHD_TEST(overlapping_gpa_fails)
{
    uint64_t pg = page_size();
    int fd = memfd_sized(4 * pg);
    struct vhd_mem *mem = NULL;
    /* {base gpa, other gpa, other size, expected} against a region [0x10000, +2pg) */
    const struct {
        uint64_t gpa, size;
        int rc;
    } cases[] = {
        {0x10000, pg, -EINVAL},              /* same start */
        {0x10000 + pg, pg, -EINVAL},         /* inside, ends together */
        {0x10000 + 2 * pg - 1, pg, -EINVAL}, /* shares the last byte */
        {0x10000 - pg + 1, pg, -EINVAL},     /* shares the first byte */
        {0x10000 - pg, 4 * pg, -EINVAL},     /* contains it */
        {0x10000 + 2 * pg, pg, 0},           /* adjacent after */
        {0x10000 - pg, pg, 0},               /* adjacent before */
    };
    for (size_t k = 0; k < VHD_ARRAY_SIZE(cases); k++) {
        for (int order = 0; order < 2; order++) {
            struct vhd_mem_region_desc a = desc(0x10000, 2 * pg, 0x100000, 0, fd);
            struct vhd_mem_region_desc b = desc(cases[k].gpa, cases[k].size, 0x900000, 0, fd);
            struct vhd_mem_region_desc d[2] = {order ? b : a, order ? a : b};
            mem = NULL;
            VHD_CHECK_EQ(vhd_mem_new(d, 2, &mem), cases[k].rc);
            if (cases[k].rc == 0) {
                VHD_CHECK(mem->regions[0].gpa < mem->regions[1].gpa); /* sorted */
                vhd_mem_free(mem);
            } else {
                VHD_CHECK(mem == NULL);
            }
        }
    }
    close(fd);
}

VHD_TEST(overlapping_uva_fails)
{
    uint64_t pg = page_size();
    int fd = memfd_sized(4 * pg);
    struct vhd_mem *mem = NULL;
    struct vhd_mem_region_desc d[3] = {
        desc(0x10000, 2 * pg, 0x100000, 0, fd),
        desc(0x90000, pg, 0x100000 + 2 * pg - 1, 0, fd), /* shares a byte in UVA */
        desc(0x50000, pg, 0x800000, 0, fd),
    };
    VHD_CHECK_EQ(vhd_mem_new(d, 3, &mem), -EINVAL);
    d[1].uva = 0x100000; /* same UVA */
    VHD_CHECK_EQ(vhd_mem_new(d, 3, &mem), -EINVAL);
    d[1].uva = 0x100000 - pg + 1;
    VHD_CHECK_EQ(vhd_mem_new(d, 3, &mem), -EINVAL);
    VHD_CHECK(mem == NULL);
    d[1].uva = 0x100000 + 2 * pg; /* adjacent: fine */
    VHD_CHECK_EQ(vhd_mem_new(d, 3, &mem), 0);
    vhd_mem_free(mem);
    close(fd);
}

VHD_TEST(overflowing_ranges_fail)
{
    int fd = memfd_sized(page_size());
    struct vhd_mem *mem = NULL;
    struct vhd_mem_region_desc d;

    d = desc(UINT64_MAX - 10, 20, 0x100000, 0, fd);
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EINVAL);
    d = desc(UINT64_MAX - 0xfff, 0x1000, 0x100000, 0, fd); /* ends exactly at 2^64 */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EINVAL);
    d = desc(0, UINT64_MAX, 0x100000, 0, fd);
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EINVAL);
    d = desc(0, 0x1000, UINT64_MAX - 10, 0, fd);
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EINVAL);
    d = desc(0, 0x1000, UINT64_MAX - 0xfff, 0, fd);
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EINVAL);
    VHD_CHECK(mem == NULL);
    /* the last page below 2^64 is fine in GPA (the fd offset is what matters for mmap) */
    d = desc(UINT64_MAX - 0x1fff, 0x1000, 0x100000, 0, fd);
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), 0);
    uint32_t hint = 0;
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, UINT64_MAX - 0x1000, 1, &hint) != NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, UINT64_MAX - 0xfff, 1, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(mem, UINT64_MAX - 0x1000, UINT64_MAX, &hint) == NULL);
    struct iovec iov[2];
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, UINT64_MAX - 0x1fff, 0x1000, iov, 2, &hint), 1);
    VHD_CHECK_EQ(vhd_mem_gpa_to_iov(mem, UINT64_MAX - 0x1fff, 0x1001, iov, 2, &hint), -EFAULT);
    vhd_mem_free(mem);
    close(fd);
}

VHD_TEST(max_regions_509_ok_510_fails)
{
    uint64_t pg = page_size();
    const uint32_t n = VHD_MEM_MAX_REGIONS + 1;
    int fd = memfd_sized(n * pg);
    uint8_t *drv = map_all(fd, n * pg);
    static struct vhd_mem_region_desc d[VHD_MEM_MAX_REGIONS + 1];
    struct vhd_mem *mem = NULL, *more = NULL;

    /* region i: file page (i * 7) % n, gpa i * 2 pages (gaps), uva descending */
    for (uint32_t i = 0; i < n; i++) {
        uint64_t fpage = (i * 7ull) % n;
        d[i] = desc(i * 2 * pg, pg, 0x10000000 + (n - i) * 4 * pg, fpage * pg, fd);
        memcpy(drv + fpage * pg, &i, sizeof(i));
    }
    VHD_CHECK_EQ(vhd_mem_new(d, n, &mem), -EINVAL);
    VHD_CHECK(mem == NULL);
    VHD_CHECK_EQ(vhd_mem_new(d, VHD_MEM_MAX_REGIONS, &mem), 0);
    VHD_CHECK_EQ(mem->nregions, VHD_MEM_MAX_REGIONS);
    uint32_t hint = UINT32_MAX;
    for (uint32_t i = 0; i < VHD_MEM_MAX_REGIONS; i++) {
        uint32_t tag;
        const uint8_t *p = vhd_mem_gpa_to_hva(mem, d[i].gpa, pg, &hint);
        VHD_CHECK(p != NULL);
        VHD_CHECK_EQ(hint, i);
        memcpy(&tag, p, sizeof(tag));
        VHD_CHECK_EQ(tag, i);
        VHD_CHECK(vhd_mem_gpa_to_hva(mem, d[i].gpa + pg, 1, &hint) == NULL); /* gap */
        VHD_CHECK(vhd_mem_uva_to_hva(mem, d[i].uva + pg - 1, 1) == p + pg - 1);
        VHD_CHECK(vhd_mem_uva_to_hva(mem, d[i].uva + pg, 1) == NULL);
    }
    /* a full table takes no more */
    VHD_CHECK_EQ(vhd_mem_add(mem, &d[VHD_MEM_MAX_REGIONS], &more), -EINVAL);
    VHD_CHECK(more == NULL);
    vhd_mem_free(mem);
    munmap(drv, n * pg);
    close(fd);
}

/* ---- fd problems ---- */

VHD_TEST(bad_fd_fails)
{
    uint64_t pg = page_size();
    struct vhd_mem *mem = NULL;
    struct vhd_mem_region_desc d = desc(0, pg, 0x100000, 0, -1);

    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EBADF);
    int fd = memfd_sized(pg);
    close(fd);
    d.fd = fd; /* closed */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EBADF);
    int sv[2];
    VHD_CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    d.fd = sv[0]; /* read-write but not mappable */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -ENODEV);
    close(sv[0]);
    close(sv[1]);
    VHD_CHECK(mem == NULL);
}

VHD_TEST(read_only_fd_fails)
{
    uint64_t pg = page_size();
    int fd = memfd_sized(pg);
    char path[64];
    struct vhd_mem *mem = NULL;

    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    int ro = open(path, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(ro >= 0);
    struct vhd_mem_region_desc d = desc(0, pg, 0x100000, 0, ro);
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -EACCES);
    VHD_CHECK(mem == NULL);
    close(ro);
    close(fd);
}

VHD_TEST(failure_leaves_no_mappings)
{
    uint64_t pg = page_size();
    int fd = memfd_sized(8 * pg);
    struct vhd_mem *mem = NULL;
    struct vhd_mem_region_desc d[4] = {
        desc(0x0000000, pg, 0x1000000, 0, fd), desc(0x1000000, pg, 0x2000000, pg, fd),
        desc(0x2000000, pg, 0x3000000, 2 * pg, fd),
        desc(0x3000000, pg, 0x4000000, 8 * pg, fd), /* beyond EOF */
    };
    int before = count_maps();

    VHD_CHECK_EQ(vhd_mem_new(d, 4, &mem), -ENXIO);
    VHD_CHECK_EQ(count_maps(), before);
    d[3].mmap_offset = 3 * pg;
    d[2].fd = -1; /* fails in the middle of mapping */
    VHD_CHECK_EQ(vhd_mem_new(d, 4, &mem), -EBADF);
    VHD_CHECK_EQ(count_maps(), before);
    VHD_CHECK(mem == NULL);
    d[2].fd = fd;
    VHD_CHECK_EQ(vhd_mem_new(d, 4, &mem), 0);
    VHD_CHECK_EQ(count_maps(), before + 4);
    const uint8_t *p = mem->regions[3].hva;
    VHD_CHECK(is_mapped(p));
    vhd_mem_free(mem);
    VHD_CHECK(!is_mapped(p)); /* before anything else can map there */
    VHD_CHECK_EQ(count_maps(), before);
    close(fd);
}

VHD_TEST(hugetlbfs_offset_rounded_to_huge_page)
{
    /*
     * A hugetlbfs memfd only accepts huge-page-aligned mmap offsets. Nothing
     * here touches the memory, so this runs without any huge page reserved.
     */
    int fd = memfd_create("test-mem-huge", MFD_CLOEXEC | MFD_HUGETLB);
    if (fd < 0)
        vhd_test_skip("no hugetlbfs memfd");
    const uint64_t huge = 2ull << 20;
    if (ftruncate(fd, (off_t)(2 * huge)) != 0) {
        close(fd);
        vhd_test_skip("cannot size hugetlbfs memfd (huge page size not 2 MiB?)");
    }
    uint64_t pg = page_size();
    struct vhd_mem_region_desc d = desc(0x40000000, pg, 0x7f0000000000, huge + pg, fd);
    struct vhd_mem *mem = NULL;
    int rc = vhd_mem_new(&d, 1, &mem);
    if (rc == -ENOMEM) {
        close(fd);
        vhd_test_skip("hugetlbfs mapping refused");
    }
    VHD_CHECK_EQ(rc, 0);
    const struct vhd_mem_region *r = &mem->regions[0];
    VHD_CHECK_EQ((uintptr_t)r->map->base % huge, 0);
    VHD_CHECK_EQ(r->map->len, huge);
    VHD_CHECK(r->hva == (uint8_t *)r->map->base + pg);
    d.size = huge; /* runs past the file's end */
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), -ENXIO);
    vhd_mem_free(mem);
    close(fd);
}

/* ---- add / remove ---- */

VHD_TEST(add_builds_new_table_sharing_maps)
{
    struct vhd_guestmem gm;
    struct vhd_mem_region_desc d[3];
    struct vhd_mem *t1 = NULL, *t2 = NULL, *t3 = NULL, *bad = NULL;
    uint32_t hint = 0;

    VHD_CHECK_EQ(vhd_guestmem_init(&gm, 3, R_SIZE, R_BASE, 0x10000), 0);
    vhd_guestmem_descs(&gm, d);
    /* add in reverse GPA order: the table stays sorted */
    VHD_CHECK_EQ(vhd_mem_add(NULL, &d[2], &t1), 0);
    VHD_CHECK_EQ(vhd_mem_add(t1, &d[0], &t2), 0);
    VHD_CHECK_EQ(t1->nregions, 1);
    VHD_CHECK_EQ(t2->nregions, 2);
    VHD_CHECK_EQ(t2->regions[0].gpa, d[0].gpa);
    VHD_CHECK_EQ(t2->regions[1].gpa, d[2].gpa);
    /* the old region is shared, not remapped */
    VHD_CHECK(t2->regions[1].map == t1->regions[0].map);
    VHD_CHECK(t2->regions[1].hva == t1->regions[0].hva);
    VHD_CHECK_EQ(t1->regions[0].map->refs, 2);
    VHD_CHECK_EQ(t2->regions[0].map->refs, 1);
    /* the old table still answers as before, without the new region */
    VHD_CHECK(vhd_mem_gpa_to_hva(t1, d[2].gpa, 1, &hint) == t1->regions[0].hva);
    VHD_CHECK(vhd_mem_gpa_to_hva(t1, d[0].gpa, 1, &hint) == NULL);
    VHD_CHECK(vhd_mem_gpa_to_hva(t2, d[0].gpa, 1, &hint) == t2->regions[0].hva);

    /* overlapping adds fail and change nothing */
    VHD_CHECK_EQ(vhd_mem_add(t2, &d[0], &bad), -EINVAL);
    struct vhd_mem_region_desc o = d[1];
    o.uva = d[2].uva + 1;
    VHD_CHECK_EQ(vhd_mem_add(t2, &o, &bad), -EINVAL);
    o = d[1];
    o.size = 0;
    VHD_CHECK_EQ(vhd_mem_add(t2, &o, &bad), -EINVAL);
    o = d[1];
    o.fd = -1;
    VHD_CHECK_EQ(vhd_mem_add(t2, &o, &bad), -EBADF);
    VHD_CHECK(bad == NULL);
    VHD_CHECK_EQ(t1->regions[0].map->refs, 2);
    VHD_CHECK_EQ(t2->regions[0].map->refs, 1);

    VHD_CHECK_EQ(vhd_mem_add(t2, &d[1], &t3), 0);
    VHD_CHECK_EQ(t3->nregions, 3);
    VHD_CHECK_EQ(t1->regions[0].map->refs, 3);
    /* freeing older tables leaves the shared mappings alive */
    uint8_t *shared = t1->regions[0].hva;
    vhd_mem_free(t1);
    vhd_mem_free(t2);
    VHD_CHECK_EQ(t3->regions[2].map->refs, 1);
    VHD_CHECK_EQ(t3->regions[0].map->refs, 1);
    uint8_t *p = vhd_mem_gpa_to_hva(t3, d[2].gpa + 5, 1, &hint);
    VHD_CHECK(p == shared + 5);
    *(uint8_t *)vhd_guestmem_ptr(&gm, d[2].gpa + 5, 1) = 0x77;
    VHD_CHECK_EQ(*p, 0x77);
    VHD_CHECK_EQ(vhd_mem_add(NULL, NULL, &bad), -EINVAL);
    vhd_mem_free(t3);
    VHD_CHECK(!is_mapped(shared));
    vhd_guestmem_fini(&gm);
}

VHD_TEST(remove_builds_new_table)
{
    struct vhd_guestmem gm;
    struct vhd_mem *t3, *t2 = NULL, *t1 = NULL, *t0 = NULL, *bad = NULL;
    uint32_t hint = 0;

    setup3(&gm, 0x10000, &t3);
    const struct vhd_mem_region r0 = t3->regions[0], r1 = t3->regions[1], r2 = t3->regions[2];

    /* not matching exactly: -ENOENT */
    VHD_CHECK_EQ(vhd_mem_remove(t3, r1.gpa + 1, r1.size, r1.uva, &bad), -ENOENT);
    VHD_CHECK_EQ(vhd_mem_remove(t3, r1.gpa, r1.size - 1, r1.uva, &bad), -ENOENT);
    VHD_CHECK_EQ(vhd_mem_remove(t3, r1.gpa, r1.size, r1.uva + 1, &bad), -ENOENT);
    VHD_CHECK_EQ(vhd_mem_remove(t3, r1.gpa + r1.size, r1.size, r1.uva, &bad), -ENOENT);
    VHD_CHECK_EQ(vhd_mem_remove(t3, 0, 1, 0, &bad), -ENOENT);
    VHD_CHECK_EQ(vhd_mem_remove(NULL, r1.gpa, r1.size, r1.uva, &bad), -ENOENT);
    VHD_CHECK(bad == NULL);

    VHD_CHECK_EQ(vhd_mem_remove(t3, r1.gpa, r1.size, r1.uva, &t2), 0);
    VHD_CHECK_EQ(t2->nregions, 2);
    VHD_CHECK_EQ(t3->nregions, 3);
    VHD_CHECK(t2->regions[0].map == r0.map && t2->regions[1].map == r2.map);
    VHD_CHECK_EQ(r0.map->refs, 2);
    VHD_CHECK_EQ(r1.map->refs, 1);
    VHD_CHECK(vhd_mem_gpa_to_hva(t2, r1.gpa, 1, &hint) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(t2, r1.uva, 1) == NULL);
    VHD_CHECK(vhd_mem_uva_to_hva(t2, r2.uva, 1) == r2.hva);
    VHD_CHECK(vhd_mem_gpa_to_hva(t3, r1.gpa, 1, &hint) == r1.hva); /* old intact */
    /* removing it again from the new table */
    VHD_CHECK_EQ(vhd_mem_remove(t2, r1.gpa, r1.size, r1.uva, &bad), -ENOENT);

    vhd_mem_free(t3); /* r1's last table: unmapped; r0, r2 live on */
    VHD_CHECK(!is_mapped(r1.hva));
    VHD_CHECK_EQ(r0.map->refs, 1);
    VHD_CHECK_EQ(r2.map->refs, 1);
    VHD_CHECK(vhd_mem_gpa_to_hva(t2, r2.gpa + 3, 1, &hint) == r2.hva + 3);
    *(uint8_t *)vhd_guestmem_ptr(&gm, r2.gpa + 3, 1) = 0x31;
    VHD_CHECK_EQ(*r2.hva, 0); /* fresh memfd */
    VHD_CHECK_EQ(r2.hva[3], 0x31);

    VHD_CHECK_EQ(vhd_mem_remove(t2, r0.gpa, r0.size, r0.uva, &t1), 0);
    VHD_CHECK_EQ(vhd_mem_remove(t1, r2.gpa, r2.size, r2.uva, &t0), 0);
    VHD_CHECK_EQ(t0->nregions, 0);
    VHD_CHECK(vhd_mem_gpa_to_hva(t0, r2.gpa, 1, &hint) == NULL);
    VHD_CHECK_EQ(vhd_mem_remove(t0, r2.gpa, r2.size, r2.uva, &bad), -ENOENT);
    vhd_mem_free(t2);
    vhd_mem_free(t1);
    VHD_CHECK(!is_mapped(r2.hva));
    vhd_mem_free(t0);
    vhd_guestmem_fini(&gm);
}
