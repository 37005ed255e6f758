/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the device IOTLB (src/core/iotlb.c): updates, overlaps,
 * invalidations, permissions, region clipping, host adjacency, versions
 * that stay readable while replaced, 262,144 entries, and a randomized
 * comparison against a trivial per-unit reference model.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/dirtylog.h"
#include "core/iotlb.h"
#include "core/mem.h"
#include "core/vq.h"
#include "harness.h"
#include "vq_fixture.h"

/* Two regions, adjacent in UVA and GPA: [R0_UVA, +RSZ) and [R0_UVA + RSZ, +RSZ). */
#define RSZ    (1ull << 20)
#define R0_UVA 0x10000000ull
#define R1_UVA (R0_UVA + RSZ)

static int memfd_sized(uint64_t size)
{
    int fd = memfd_create("test-iotlb", MFD_CLOEXEC);
    VHD_CHECK(fd >= 0);
    VHD_CHECK(ftruncate(fd, (off_t)size) == 0);
    return fd;
}

static struct vhd_mem *two_regions(uint64_t size)
{
    int fd = memfd_sized(2 * size);
    struct vhd_mem_region_desc d[2] = {
        {.gpa = 0, .size = size, .uva = R0_UVA, .mmap_offset = 0, .fd = fd},
        {.gpa = size, .size = size, .uva = R0_UVA + size, .mmap_offset = size, .fd = fd},
    };
    struct vhd_mem *mem;
    VHD_CHECK(vhd_mem_new(d, 2, &mem) == 0);
    close(fd);
    return mem;
}

/* Host address of front-end address uva (the test's own reference). */
static uint8_t *hva_of(const struct vhd_mem *mem, uint64_t uva)
{
    return vhd_mem_uva_to_hva(mem, uva, 1);
}

static struct vhd_iotlb *new_tlb(void)
{
    struct vhd_iotlb *t;
    VHD_CHECK(vhd_iotlb_new(4, &t) == 0);
    return t;
}

VHD_TEST(update_lookup_perm)
{
    struct vhd_mem *mem = two_regions(RSZ);
    struct vhd_iotlb *t = new_tlb();
    struct vhd_iotlb_ent e;
    const struct vhd_iotlb_ver *v;
    struct iovec iov[4];
    uint64_t miss = 0;

    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x1000, 0x2000, R0_UVA + 0x5000, VHD_IOTLB_R), 0);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 1);
    v = vhd_iotlb_enter(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0xfff, &e), -ENOENT);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x1000, &e), 0);
    VHD_CHECK(e.hva == hva_of(mem, R0_UVA + 0x5000));
    VHD_CHECK_EQ(e.gpa, 0x5000);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x2fff, &e), 0);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x3000, &e), -ENOENT);
    /* a read is allowed, a write through the read-only mapping is not */
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x1800, 0x100, VHD_IOTLB_R, iov, 4, &miss), 1);
    VHD_CHECK(iov[0].iov_base == hva_of(mem, R0_UVA + 0x5800));
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x1800, 0x100, VHD_IOTLB_W, iov, 4, &miss), -EACCES);
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x1800, 0x100, VHD_IOTLB_RW, iov, 4, &miss), -EACCES);
    /* a range running off the end misses at the first unmapped byte */
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x2f00, 0x200, VHD_IOTLB_R, iov, 4, &miss), -EFAULT);
    VHD_CHECK_EQ(miss, 0x3000);
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x10, UINT64_MAX, VHD_IOTLB_R, iov, 4, &miss), -EOVERFLOW);
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x1000, 0, VHD_IOTLB_R, iov, 4, &miss), 0);
    vhd_iotlb_leave(t, 0);

    /* write-only */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x8000, 0x1000, R0_UVA, VHD_IOTLB_W), 0);
    v = vhd_iotlb_enter(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x8000, 8, VHD_IOTLB_W, iov, 4, &miss), 1);
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x8000, 8, VHD_IOTLB_R, iov, 4, &miss), -EACCES);
    vhd_iotlb_leave(t, 0);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

VHD_TEST(bad_updates_change_nothing)
{
    struct vhd_mem *mem = two_regions(RSZ);
    struct vhd_iotlb *t = new_tlb();

    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0, 0x1000, R0_UVA, VHD_IOTLB_RW), 0);
    uint64_t changes = t->changes;
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x1000, 0, R0_UVA, VHD_IOTLB_RW), -EINVAL);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, UINT64_MAX, 2, R0_UVA, VHD_IOTLB_RW), -EINVAL);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0, 2, UINT64_MAX, VHD_IOTLB_RW), -EINVAL);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0, 0x1000, R0_UVA, 0), -EINVAL);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0, 0x1000, R0_UVA, 4), -EINVAL);
    /* outside every region, or running past the last one: refused whole */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0, 0x1000, 0x1000, VHD_IOTLB_RW), -EFAULT);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0, 0x2000, R1_UVA + RSZ - 0x1000, VHD_IOTLB_RW), -EFAULT);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0, 1ull << 40, R0_UVA, VHD_IOTLB_RW), -EFAULT);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0, UINT64_MAX, R0_UVA, VHD_IOTLB_RW), -EINVAL);
    VHD_CHECK_EQ(vhd_iotlb_update(t, NULL, 0, 0x1000, R0_UVA, VHD_IOTLB_RW), -EFAULT);
    VHD_CHECK_EQ(t->changes, changes);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 1);
    /* the largest update inside memory: both regions whole, at the top of the IOVA space */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, UINT64_MAX - 2 * RSZ + 1, 2 * RSZ, R0_UVA, VHD_IOTLB_R),
                 0);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 3);
    const struct vhd_iotlb_ver *v = vhd_iotlb_enter(t, 1);
    struct vhd_iotlb_ent e;
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, UINT64_MAX, &e), 0);
    VHD_CHECK(e.hva == hva_of(mem, R1_UVA + RSZ - 1) - (RSZ - 1));
    vhd_iotlb_leave(t, 1);
    /* invalidating never-mapped ranges, size 0, and to the end of the space */
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0x100000, 0x1000), 0);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0, 0), 0);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 1ull << 40, UINT64_MAX), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 1);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0, UINT64_MAX), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 0);
    VHD_CHECK_EQ(vhd_iotlb_flush(t), 0);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

VHD_TEST(overlap_replaces)
{
    struct vhd_mem *mem = two_regions(RSZ);
    struct vhd_iotlb *t = new_tlb();
    struct vhd_iotlb_ent e;

    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x10000, 0x10000, R0_UVA, VHD_IOTLB_RW), 0);
    /* duplicate: replaces itself, but no translation changed (0: no quiescence) */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x10000, 0x10000, R0_UVA, VHD_IOTLB_RW), 0);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 1);
    /* in the middle: the old entry is cut in two around it */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x14000, 0x1000, R0_UVA + 0x80000, VHD_IOTLB_R), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 3);
    const struct vhd_iotlb_ver *v = vhd_iotlb_enter(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x13fff, &e), 0);
    VHD_CHECK(e.hva + (0x13fff - e.iova) == hva_of(mem, R0_UVA + 0x3fff));
    VHD_CHECK_EQ(e.perm, VHD_IOTLB_RW);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x14000, &e), 0);
    VHD_CHECK(e.hva == hva_of(mem, R0_UVA + 0x80000));
    VHD_CHECK_EQ(e.perm, VHD_IOTLB_R);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x15000, &e), 0);
    VHD_CHECK(e.hva == hva_of(mem, R0_UVA + 0x5000));
    VHD_CHECK_EQ(e.size, 0xb000);
    vhd_iotlb_leave(t, 0);
    /* across both ends of two entries */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x13000, 0x3000, R1_UVA, VHD_IOTLB_W), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 3);
    v = vhd_iotlb_enter(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x12fff, &e), 0);
    VHD_CHECK_EQ(e.iova, 0x10000);
    VHD_CHECK_EQ(e.size, 0x3000);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x15fff, &e), 0);
    VHD_CHECK(e.hva + (0x15fff - e.iova) == hva_of(mem, R1_UVA + 0x2fff));
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x16000, &e), 0);
    VHD_CHECK_EQ(e.size, 0xa000);
    vhd_iotlb_leave(t, 0);
    /* covering everything */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0, 0x100000, R0_UVA, VHD_IOTLB_R), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 1);
    /* partial invalidation keeps both sides */
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0x1000, 0x1000), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 2);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0x1000, 0x1000), 0);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

/*
 * An overlapping UPDATE that only adds coverage or permission changes no
 * translation a reader may hold (0); one that moves a host address, changes
 * the region or takes a permission away does (1).
 */
VHD_TEST(overlap_keeps_or_changes)
{
    struct vhd_mem *mem = two_regions(RSZ);
    struct vhd_iotlb *t = new_tlb();
    struct vhd_iotlb_ent e;

    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x10000, 0x2000, R0_UVA + 0x2000, VHD_IOTLB_R), 0);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x14000, 0x1000, R0_UVA + 0x6000, VHD_IOTLB_R), 0);
    /* R -> RW over both, filling the gap between them at the same offsets */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0xf000, 0x8000, R0_UVA + 0x1000, VHD_IOTLB_RW), 0);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 1);
    const struct vhd_iotlb_ver *v = vhd_iotlb_enter(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x14800, &e), 0);
    VHD_CHECK(e.hva + (0x14800 - e.iova) == hva_of(mem, R0_UVA + 0x6800));
    VHD_CHECK_EQ(e.perm, VHD_IOTLB_RW);
    vhd_iotlb_leave(t, 0);
    /* a sub-range re-sent identically */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x11000, 0x1000, R0_UVA + 0x3000, VHD_IOTLB_RW), 0);
    /* RW -> R: a permission taken away */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x11000, 0x1000, R0_UVA + 0x3000, VHD_IOTLB_R), 1);
    /* R -> W: read taken away though write added */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x11000, 0x1000, R0_UVA + 0x3000, VHD_IOTLB_W), 1);
    /* another host address one page on */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x12000, 0x1000, R0_UVA + 0x5000, VHD_IOTLB_RW), 1);
    /* another region */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x13000, 0x1000, R1_UVA, VHD_IOTLB_RW), 1);
    /* a range whose tail only overlaps a changed entry still counts */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x20000, 0x1000, R0_UVA, VHD_IOTLB_RW), 0);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x1f000, 0x2000, R0_UVA + 0x1000, VHD_IOTLB_RW), 1);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

/*
 * A table at its cap refuses what would add entries (-ENOSPC, nothing
 * changes, no version published) and still takes what replaces entries.
 */
VHD_TEST(max_entries_refused)
{
    struct vhd_mem *mem = two_regions(RSZ);
    struct vhd_iotlb *t = new_tlb();
    struct vhd_iotlb_ent e;

    VHD_CHECK(VHD_IOTLB_MAX_ENTRIES >= 262144); /* 1 GiB in 4 KiB pages works warm */
    VHD_CHECK_EQ(t->max_entries, VHD_IOTLB_MAX_ENTRIES);
    t->max_entries = 4;
    for (uint64_t i = 0; i < 4; i++)
        VHD_CHECK_EQ(
            vhd_iotlb_update(t, mem, 0x10000 * (i + 1), 0x4000, R0_UVA + 0x10000 * i, VHD_IOTLB_RW),
            0);
    uint64_t changes = t->changes;
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x50000, 0x1000, R0_UVA, VHD_IOTLB_RW), -ENOSPC);
    /* in the middle of an entry: it would be cut in two around the new one */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x11000, 0x1000, R0_UVA, VHD_IOTLB_R), -ENOSPC);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 4);
    VHD_CHECK_EQ(t->changes, changes);
    const struct vhd_iotlb_ver *v = vhd_iotlb_enter(t, 0);
    VHD_CHECK(vhd_iotlb_lookup(v, 0x50000, &e) < 0);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x11000, &e), 0);
    VHD_CHECK_EQ(e.perm, VHD_IOTLB_RW);
    vhd_iotlb_leave(t, 0);
    /* replacing entries fits: one over two of them leaves three */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x10000, 0x14000, R1_UVA, VHD_IOTLB_R), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 3);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x50000, 0x1000, R0_UVA, VHD_IOTLB_RW), 0);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 4);
    /* room again once invalidated */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x60000, 0x1000, R0_UVA, VHD_IOTLB_RW), -ENOSPC);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0x50000, 0x1000), 1);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x60000, 0x1000, R0_UVA, VHD_IOTLB_RW), 0);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

VHD_TEST(region_clip_and_host_adjacency)
{
    struct vhd_mem *mem = two_regions(RSZ);
    struct vhd_iotlb *t = new_tlb();
    struct iovec iov[4];
    uint64_t miss;

    /* one update across the UVA boundary of the regions: two entries, two segments */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x40000, 0x2000, R1_UVA - 0x1000, VHD_IOTLB_RW), 0);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 2);
    const struct vhd_iotlb_ver *v = vhd_iotlb_enter(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x40000, 0x2000, VHD_IOTLB_RW, iov, 4, &miss), 2);
    VHD_CHECK(iov[0].iov_base == hva_of(mem, R1_UVA - 0x1000));
    VHD_CHECK_EQ(iov[0].iov_len, 0x1000);
    VHD_CHECK(iov[1].iov_base == hva_of(mem, R1_UVA));
    VHD_CHECK_EQ(iov[1].iov_len, 0x1000);
    struct vhd_iotlb_ent e;
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x41000, &e), 0);
    VHD_CHECK_EQ(e.gpa, RSZ);
    VHD_CHECK_EQ(e.region, 1);
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x40000, 0x2000, VHD_IOTLB_RW, iov, 1, &miss), -ENOBUFS);
    void *p;
    VHD_CHECK_EQ(vhd_iotlb_to_hva(v, 0x40000, 0x2000, VHD_IOTLB_RW, &p, &miss), -ENXIO);
    vhd_iotlb_leave(t, 0);

    /* IOVA-adjacent entries adjacent in host memory: joined */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x50000, 0x1000, R0_UVA + 0x7000, VHD_IOTLB_RW), 0);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x51000, 0x1000, R0_UVA + 0x8000, VHD_IOTLB_R), 0);
    /* IOVA-adjacent, not host-adjacent: two segments */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x52000, 0x1000, R0_UVA + 0x2000, VHD_IOTLB_R), 0);
    v = vhd_iotlb_enter(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_to_iov(v, 0x50800, 0x2000, VHD_IOTLB_R, iov, 4, &miss), 2);
    VHD_CHECK(iov[0].iov_base == hva_of(mem, R0_UVA + 0x7800));
    VHD_CHECK_EQ(iov[0].iov_len, 0x1800);
    VHD_CHECK(iov[1].iov_base == hva_of(mem, R0_UVA + 0x2000));
    VHD_CHECK_EQ(iov[1].iov_len, 0x800);
    VHD_CHECK_EQ(vhd_iotlb_to_hva(v, 0x50000, 0x2000, VHD_IOTLB_R, &p, &miss), 0);
    VHD_CHECK(p == hva_of(mem, R0_UVA + 0x7000));
    VHD_CHECK_EQ(vhd_iotlb_to_hva(v, 0x50000, 0x2000, VHD_IOTLB_RW, &p, &miss), -EACCES);
    VHD_CHECK_EQ(vhd_iotlb_to_hva(v, 0x50000, 0x3000, VHD_IOTLB_R, &p, &miss), -ENXIO);
    vhd_iotlb_leave(t, 0);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

/* A version a reader holds stays intact (and allocated) while others replace it. */
VHD_TEST(held_version_survives)
{
    struct vhd_mem *mem = two_regions(RSZ);
    struct vhd_iotlb *t = new_tlb();
    struct vhd_iotlb_ent e;

    for (uint64_t i = 0; i < 64; i++)
        VHD_CHECK_EQ(vhd_iotlb_update(t, mem, i << 12, 0x1000, R0_UVA + (i << 12), VHD_IOTLB_RW),
                     0);
    const struct vhd_iotlb_ver *old = vhd_iotlb_enter(t, 2);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0, 32 << 12), 1);
    for (uint64_t i = 0; i < 64; i++)
        VHD_CHECK(vhd_iotlb_update(t, mem, i << 12, 0x1000, R1_UVA + (i << 12), VHD_IOTLB_R) >= 0);
    VHD_CHECK_EQ(vhd_iotlb_reclaim(t), 1); /* the held one waits */
    for (uint64_t i = 0; i < 64; i++) {
        VHD_CHECK_EQ(vhd_iotlb_lookup(old, i << 12, &e), 0);
        VHD_CHECK(e.hva == hva_of(mem, R0_UVA + (i << 12)));
        VHD_CHECK_EQ(e.perm, VHD_IOTLB_RW);
    }
    vhd_iotlb_leave(t, 2);
    VHD_CHECK_EQ(vhd_iotlb_reclaim(t), 0);
    const struct vhd_iotlb_ver *now = vhd_iotlb_enter(t, 2);
    VHD_CHECK_EQ(vhd_iotlb_lookup(now, 5 << 12, &e), 0);
    VHD_CHECK(e.hva == hva_of(mem, R1_UVA + (5 << 12)));
    vhd_iotlb_leave(t, 2);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

static uint64_t rnd_state = 88172645463325252ull;
static uint64_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* 1 GiB of buffers in 4 KiB mappings, in random order, scattered in host memory. */
VHD_TEST(entries_262144)
{
    const uint64_t n = 262144, gib = n << 12;
    struct vhd_mem *mem = two_regions(gib);
    struct vhd_iotlb *t = new_tlb();
    uint32_t *order = malloc(n * sizeof(*order)), *page = malloc(n * sizeof(*page));

    VHD_CHECK(order && page);
    for (uint32_t i = 0; i < n; i++)
        order[i] = page[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(rnd() % (i + 1)), k = (uint32_t)(rnd() % (i + 1)), x;
        x = order[i], order[i] = order[j], order[j] = x;
        x = page[i], page[i] = page[k], page[k] = x;
    }
    double t0 = now_s();
    for (uint32_t i = 0; i < n; i++) {
        uint64_t p = order[i];
        VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x100000000ull + (p << 12), 0x1000,
                                      R0_UVA + ((uint64_t)page[p] << 12), VHD_IOTLB_RW),
                     0);
    }
    double t1 = now_s();
    VHD_CHECK_EQ(vhd_iotlb_count(t), n);
    /* a treap's expected height is about 2.99 log2(n) = 54; never near n */
    uint32_t h = vhd_iotlb_height(t);
    VHD_CHECK(h >= 18 && h <= 90);
    const struct vhd_iotlb_ver *v = vhd_iotlb_enter(t, 0);
    struct vhd_iotlb_ent e;
    for (uint32_t i = 0; i < 4 * n; i++) {
        uint64_t p = rnd() % n, off = rnd() & 0xfff;
        VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0x100000000ull + (p << 12) + off, &e), 0);
        VHD_CHECK(e.hva + off == hva_of(mem, R0_UVA + ((uint64_t)page[p] << 12) + off));
    }
    double t2 = now_s();
    vhd_iotlb_leave(t, 0);
    /* invalidating every other page one by one, then the rest in one go */
    for (uint64_t p = 0; p < n; p += 2)
        VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0x100000000ull + (p << 12), 0x1000), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), n / 2);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0, UINT64_MAX), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 0);
    printf("  262144 updates %.0f ns each, lookups %.0f ns each, height %u\n",
           (t1 - t0) / (double)n * 1e9, (t2 - t1) / (4.0 * (double)n) * 1e9, h);
    free(order);
    free(page);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

/*
 * Reference model: per 16-byte unit of a 64 KiB IOVA window, the host
 * address of its first byte, its region and permission (0: unmapped).
 */
#define UNIT   16u
#define NUNITS 4096u
struct ref_unit {
    uint8_t *hva;
    uint32_t region;
    uint8_t perm;
};

static void ref_check(struct vhd_iotlb *t, const struct ref_unit *ref)
{
    const struct vhd_iotlb_ver *v = vhd_iotlb_enter(t, 3);
    struct vhd_iotlb_ent e;

    for (uint32_t u = 0; u < NUNITS; u++) {
        uint64_t iova = (uint64_t)u * UNIT + (rnd() % UNIT);
        int rc = vhd_iotlb_lookup(v, iova, &e);
        if (!ref[u].perm) {
            VHD_CHECK_EQ(rc, -ENOENT);
            continue;
        }
        VHD_CHECK_EQ(rc, 0);
        VHD_CHECK_EQ(e.perm, ref[u].perm);
        VHD_CHECK(e.hva + (iova - e.iova) == ref[u].hva + iova % UNIT);
    }
    /* random ranges: the same bytes, and segments joined exactly when the model says */
    for (int k = 0; k < 64; k++) {
        uint32_t a = (uint32_t)(rnd() % NUNITS), b = a + 1 + (uint32_t)(rnd() % 64);
        if (b > NUNITS)
            b = NUNITS;
        struct iovec iov[80];
        uint64_t miss = 0;
        int rc = vhd_iotlb_to_iov(v, (uint64_t)a * UNIT, (uint64_t)(b - a) * UNIT, VHD_IOTLB_R, iov,
                                  80, &miss);
        int want = 0;
        bool fault = false, acc = false;
        for (uint32_t u = a; u < b; u++) {
            if (!ref[u].perm) {
                fault = true;
                VHD_CHECK(rc == -EFAULT || rc == -EACCES);
                if (rc == -EFAULT)
                    VHD_CHECK_EQ(miss, (uint64_t)u * UNIT);
                break;
            }
            if (!(ref[u].perm & VHD_IOTLB_R)) {
                acc = true;
                VHD_CHECK_EQ(rc, -EACCES);
                break;
            }
            if (u == a || ref[u].region != ref[u - 1].region || ref[u].hva != ref[u - 1].hva + UNIT)
                want++;
        }
        if (fault || acc)
            continue;
        VHD_CHECK_EQ(rc, want);
        uint32_t u = a;
        for (int s = 0; s < rc; s++) {
            VHD_CHECK(iov[s].iov_base == ref[u].hva);
            u += (uint32_t)(iov[s].iov_len / UNIT);
        }
        VHD_CHECK_EQ(u, b);
    }
    vhd_iotlb_leave(t, 3);
}

VHD_TEST(random_vs_reference)
{
    struct vhd_mem *mem = two_regions(64 * 1024);
    struct vhd_iotlb *t = new_tlb();
    static struct ref_unit ref[NUNITS];
    const uint64_t rsz = 64 * 1024;

    memset(ref, 0, sizeof(ref));
    for (int op = 0; op < 4000; op++) {
        uint32_t a = (uint32_t)(rnd() % NUNITS);
        uint32_t len = 1 + (uint32_t)(rnd() % (rnd() % 4 ? 16 : 512));
        if (a + len > NUNITS)
            len = NUNITS - a;
        if (rnd() % 3) {
            /* uva units inside the two regions (or partly beyond them: refused) */
            uint64_t uvu = rnd() % (2 * rsz / UNIT + 8);
            uint64_t uva = R0_UVA + uvu * UNIT;
            uint8_t perm = (uint8_t)(1 + rnd() % 3);
            int rc = vhd_iotlb_update(t, mem, (uint64_t)a * UNIT, (uint64_t)len * UNIT, uva, perm);
            if ((uvu + len) * UNIT > 2 * rsz) {
                VHD_CHECK_EQ(rc, -EFAULT);
            } else {
                VHD_CHECK(rc == 0 || rc == 1);
                bool any = false;
                for (uint32_t u = a; u < a + len; u++) {
                    any |= ref[u].perm != 0;
                    uint64_t x = uva + (uint64_t)(u - a) * UNIT;
                    ref[u].hva = hva_of(mem, x);
                    ref[u].region = x - R0_UVA >= rsz ? 1 : 0;
                    ref[u].perm = perm;
                }
                VHD_CHECK_EQ(rc, any ? 1 : 0);
            }
        } else {
            int rc = vhd_iotlb_invalidate(t, (uint64_t)a * UNIT, (uint64_t)len * UNIT);
            bool any = false;
            for (uint32_t u = a; u < a + len; u++) {
                any |= ref[u].perm != 0;
                ref[u].perm = 0;
            }
            VHD_CHECK_EQ(rc, any ? 1 : 0);
        }
        if (op % 16 == 0)
            ref_check(t, ref);
    }
    ref_check(t, ref);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

/*
 * Ranges that end exactly at 2^64 (iova + size wraps to 0). QEMU turns a
 * guest's lazy-mode flush (a device-IOTLB invalidation of the whole space)
 * into one INVALIDATE per section of the IOMMU region, the last one
 * [0xfef00000, 2^64) (the interrupt window 0xfee00000-0xfeefffff is a
 * section of its own): it must drop the guest's IOVAs (Linux allocates them
 * just below 4 GiB), which are then reused for other pages. Many 4 KiB
 * entries at consecutive IOVAs with shuffled host pages, as a lazy guest
 * leaves them, and an UPDATE of the last page of the space replacing
 * another one.
 */
VHD_TEST(ranges_ending_at_2_64)
{
    struct vhd_mem *mem = two_regions(RSZ);
    struct vhd_iotlb *t = new_tlb();
    const struct vhd_iotlb_ver *v;
    struct vhd_iotlb_ent e;
    const uint64_t top = 0x100000000ull, n = 64, last = UINT64_MAX - 0xfff;

    for (uint64_t k = 0; k < n; k++)
        VHD_CHECK_EQ(vhd_iotlb_update(t, mem, top - (k + 1) * 0x1000, 0x1000,
                                      R0_UVA + ((k * 37) % n) * 0x1000, VHD_IOTLB_RW),
                     0);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0x1000, 0x1000, R0_UVA, VHD_IOTLB_RW), 0);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, 0xfee00000ull, 0x1000, R0_UVA, VHD_IOTLB_RW), 0);
    VHD_CHECK_EQ(vhd_iotlb_count(t), n + 2);

    /* QEMU's pair for a full flush: [0, 0xfee00000) and [0xfef00000, 2^64) */
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0, 0xfee00000ull), 1);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, 0xfef00000ull, 0 - 0xfef00000ull), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 1);
    v = vhd_iotlb_enter(t, 0);
    for (uint64_t k = 0; k < n; k++)
        VHD_CHECK_EQ(vhd_iotlb_lookup(v, top - (k + 1) * 0x1000 + 0x2c0, &e), -ENOENT);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, 0xfee00000ull, &e), 0); /* between the two: kept */
    vhd_iotlb_leave(t, 0);

    /* the last page of the space, mapped, replaced, cut and invalidated to the end */
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, last, 0x1000, R0_UVA + 0x3000, VHD_IOTLB_R), 0);
    VHD_CHECK_EQ(vhd_iotlb_update(t, mem, last, 0x1000, R0_UVA + 0x7000, VHD_IOTLB_RW), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 2);
    v = vhd_iotlb_enter(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, UINT64_MAX, &e), 0);
    VHD_CHECK(e.hva + (UINT64_MAX - e.iova) == hva_of(mem, R0_UVA + 0x7fff));
    VHD_CHECK_EQ(e.perm, VHD_IOTLB_RW);
    vhd_iotlb_leave(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, last + 0x800, 0x800), 1);
    v = vhd_iotlb_enter(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, last + 0x7ff, &e), 0);
    VHD_CHECK_EQ(vhd_iotlb_lookup(v, last + 0x800, &e), -ENOENT);
    vhd_iotlb_leave(t, 0);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(t, last, 0x1000), 1);
    VHD_CHECK_EQ(vhd_iotlb_count(t), 1);
    vhd_iotlb_free(t);
    vhd_mem_free(mem);
}

/* ---- the virtqueue engine translating through an IOTLB ---- */

/* IOVAs the rings and buffers are given at: far from every GPA. */
#define RING_IOVA 0x7f0000000000ull
#define BUF_IOVA  0x7e0000000000ull

struct ivq {
    struct vqfx f;
    struct vhd_iotlb *t;
    int efd;
};

/* A queue whose ring addresses are IOVAs (RING_IOVA + offset in the ring area), not started. */
static void ivq_setup(struct ivq *q, bool packed)
{
    struct vqfx_opts o = {.size = 64, .packed = packed, .no_start = true};

    vqfx_setup(&q->f, &o);
    VHD_CHECK_EQ(vhd_iotlb_new(1, &q->t), 0);
    q->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    VHD_CHECK(q->efd >= 0);
    vhd_vq_set_iotlb(&q->f.vq, q->t, 0, q->efd);
    q->f.vq.desc_addr = RING_IOVA + (q->f.dq.desc_gpa - q->f.area_gpa);
    q->f.vq.avail_addr = RING_IOVA + (q->f.dq.avail_gpa - q->f.area_gpa);
    q->f.vq.used_addr = RING_IOVA + (q->f.dq.used_gpa - q->f.area_gpa);
}

static void ivq_teardown(struct ivq *q)
{
    vhd_iotlb_free(q->t);
    close(q->efd);
    vqfx_teardown(&q->f);
}

static void ivq_map(struct ivq *q, uint64_t iova, uint64_t gpa, uint64_t len, uint8_t perm)
{
    VHD_CHECK(vhd_iotlb_update(q->t, q->f.mem, iova, len, vhd_guestmem_uva(&q->f.gm, gpa), perm) >=
              0);
}

/* What the control thread does once an UPDATE arrived: clear the miss (and kick). */
static uint64_t ivq_take_miss(struct ivq *q)
{
    uint64_t w = q->f.vq.iotlb_miss, v;
    q->f.vq.iotlb_miss = 0;
    if (read(q->efd, &v, sizeof(v)) != sizeof(v))
        v = 0;
    return v ? w : 0;
}

static void ivq_post(struct ivq *q, uint64_t iova, uint32_t len, bool writable)
{
    struct vhd_drv_buf b = {.gpa = iova, .len = len};
    VHD_CHECK_EQ(vhd_drv_vq_add(&q->f.dq, &b, writable ? 0 : 1, writable ? 1 : 0, false, q), 0);
    vhd_drv_vq_publish(&q->f.dq);
}

#define IOTLB_VQ_TEST(name)        \
    static void name(bool packed); \
    VHD_TEST(name##_split)         \
    {                              \
        name(false);               \
    }                              \
    VHD_TEST(name##_packed)        \
    {                              \
        name(true);                \
    }                              \
    static void name(bool packed)

/* Rings and buffers miss, are asked for once, and work after the UPDATE; nothing is consumed. */
IOTLB_VQ_TEST(vq_miss_then_update)
{
    struct ivq q;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    void *buf;

    ivq_setup(&q, packed);
    VHD_CHECK_EQ(vhd_vq_start(&q.f.vq), -EAGAIN);
    VHD_CHECK_EQ(q.f.vq.error, 0);
    uint64_t m = ivq_take_miss(&q);
    VHD_CHECK_EQ(m & ~0xfffull, RING_IOVA + ((q.f.dq.desc_gpa - q.f.area_gpa) & ~0xfffull));
    VHD_CHECK_EQ(m & 3, packed ? VHD_IOTLB_RW : VHD_IOTLB_R);
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), 0);
    VHD_CHECK(!vhd_vq_has_work(&q.f.vq));

    ivq_map(&q, RING_IOVA, q.f.area_gpa, q.f.area_len, VHD_IOTLB_RW);
    (void)ivq_take_miss(&q);
    ivq_post(&q, BUF_IOVA + 0x100, 100, false);
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), 0); /* rings now, buffer missing */
    VHD_CHECK(q.f.vq.rings_ok);
    uint64_t ev;
    VHD_CHECK_EQ(q.f.vq.iotlb_miss, (BUF_IOVA + 0x100) | VHD_IOTLB_R); /* the byte, not its page */
    VHD_CHECK_EQ(read(q.efd, &ev, sizeof(ev)), sizeof(ev));
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), 0); /* same miss: not signalled twice */
    VHD_CHECK(!vhd_vq_has_work(&q.f.vq));
    VHD_CHECK_EQ(read(q.efd, &ev, sizeof(ev)), -1);

    /* the buffer page maps somewhere else than its IOVA suggests */
    uint64_t bgpa = vqfx_alloc(&q.f, 4096, &buf);
    ivq_map(&q, BUF_IOVA, bgpa, 4096, VHD_IOTLB_R);
    q.f.vq.iotlb_miss = 0;
    VHD_CHECK(vhd_vq_has_work(&q.f.vq));
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), 1);
    VHD_CHECK_EQ(c.nr, 1);
    VHD_CHECK(iov[0].iov_base == vhd_mem_gpa_to_hva(q.f.mem, bgpa + 0x100, 100, &(uint32_t){0}));
    VHD_CHECK_EQ(q.f.vq.iotlb_one.nregions, 0); /* read-only: not the fast path's */
    VHD_CHECK_EQ(vhd_vq_push(&q.f.vq, &c, 0), 0);
    vhd_vq_flush(&q.f.vq);
    void *cookie;
    uint32_t len;
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&q.f.dq, &cookie, &len), 1);
    /* dirty logging finds the rings' GPAs through the translation */
    VHD_CHECK_EQ(q.f.vq.log_desc_gpa, q.f.dq.desc_gpa);
    VHD_CHECK_EQ(q.f.vq.iotlb_used_gpa, q.f.dq.used_gpa);
    ivq_teardown(&q);
}

/* A device-writable buffer mapped read-only is never handed out: the queue breaks. */
IOTLB_VQ_TEST(vq_write_through_ro_fails)
{
    struct ivq q;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    void *buf;

    ivq_setup(&q, packed);
    uint64_t bgpa = vqfx_alloc(&q.f, 4096, &buf);
    ivq_map(&q, RING_IOVA, q.f.area_gpa, q.f.area_len, VHD_IOTLB_RW);
    ivq_map(&q, BUF_IOVA, bgpa, 4096, VHD_IOTLB_R);
    VHD_CHECK_EQ(vhd_vq_start(&q.f.vq), 0);
    ivq_post(&q, BUF_IOVA, 64, true);
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), -VHD_VQ_E_IOTLB_PERM);
    VHD_CHECK_EQ(q.f.vq.error, VHD_VQ_E_IOTLB_PERM);
    ivq_teardown(&q);

    /* and a device-readable one mapped write-only */
    ivq_setup(&q, packed);
    bgpa = vqfx_alloc(&q.f, 4096, &buf);
    ivq_map(&q, RING_IOVA, q.f.area_gpa, q.f.area_len, VHD_IOTLB_RW);
    ivq_map(&q, BUF_IOVA, bgpa, 4096, VHD_IOTLB_W);
    VHD_CHECK_EQ(vhd_vq_start(&q.f.vq), 0);
    ivq_post(&q, BUF_IOVA, 64, false);
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), -VHD_VQ_E_IOTLB_PERM);
    ivq_teardown(&q);
}

/* Read-write buffers go through the fast path's cached entry; invalidation drops it. */
IOTLB_VQ_TEST(vq_cache_and_invalidate)
{
    struct ivq q;
    struct iovec iov[64 * 4];
    struct vhd_vq_chain c[64];
    void *buf;

    ivq_setup(&q, packed);
    uint64_t bgpa = vqfx_alloc(&q.f, 8192, &buf);
    ivq_map(&q, RING_IOVA, q.f.area_gpa, q.f.area_len, VHD_IOTLB_RW);
    ivq_map(&q, BUF_IOVA, bgpa, 8192, VHD_IOTLB_RW);
    VHD_CHECK_EQ(vhd_vq_start(&q.f.vq), 0);
    for (int i = 0; i < 4; i++)
        ivq_post(&q, BUF_IOVA + 512 * (uint64_t)i, 256, true);
    ivq_post(&q, BUF_IOVA + 0x10000, 256, true); /* not mapped */
    ivq_post(&q, BUF_IOVA + 4096, 256, true);
    /* the run stops before the miss, the queue not broken */
    VHD_CHECK_EQ(vhd_vq_pop_burst(&q.f.vq, iov, 4, c, 64), 4);
    VHD_CHECK_EQ(q.f.vq.error, 0);
    VHD_CHECK_EQ(q.f.vq.iotlb_one.nregions, 1);
    for (int i = 0; i < 4; i++)
        VHD_CHECK(iov[4 * i].iov_base ==
                  (uint8_t *)vhd_mem_gpa_to_hva(q.f.mem, bgpa, 1, &(uint32_t){0}) + 512 * i);
    VHD_CHECK_EQ(vhd_vq_pop_burst(&q.f.vq, iov, 4, c + 4, 60), 0);
    VHD_CHECK_EQ(ivq_take_miss(&q), (BUF_IOVA + 0x10000) | VHD_IOTLB_W);
    /* the front-end maps it, then takes the first page away again */
    ivq_map(&q, BUF_IOVA + 0x10000, bgpa, 4096, VHD_IOTLB_RW);
    VHD_CHECK_EQ(vhd_iotlb_invalidate(q.t, BUF_IOVA, 4096), 1);
    vhd_vq_iotlb_invalidated(&q.f.vq, BUF_IOVA, 4096);
    VHD_CHECK_EQ(q.f.vq.iotlb_one.nregions, 0);
    VHD_CHECK(q.f.vq.rings_ok); /* the rings are elsewhere */
    VHD_CHECK_EQ(vhd_vq_pop_burst(&q.f.vq, iov, 4, c + 4, 60), 2);
    ivq_post(&q, BUF_IOVA + 8, 8, true);
    VHD_CHECK_EQ(vhd_vq_pop_burst(&q.f.vq, iov, 4, c + 6, 58), 0);
    VHD_CHECK_EQ(ivq_take_miss(&q), (BUF_IOVA + 8) | VHD_IOTLB_W);
    /* invalidating the rings drops them; the next verb misses on them */
    VHD_CHECK_EQ(vhd_iotlb_invalidate(q.t, RING_IOVA, 1), 1);
    vhd_vq_iotlb_invalidated(&q.f.vq, RING_IOVA, 1);
    VHD_CHECK(!q.f.vq.rings_ok);
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, c + 6), 0);
    VHD_CHECK_EQ(ivq_take_miss(&q) & ~0xfffull, RING_IOVA);
    VHD_CHECK_EQ(q.f.vq.error, 0);
    ivq_teardown(&q);
}

/*
 * An UPDATE that adds write access to a page mapped read-only changes no
 * translation (returns 0: the transport does not drop the queue's cache);
 * the entry the queue cached read-only must not refuse the write then.
 */
IOTLB_VQ_TEST(vq_cached_ro_then_rw)
{
    struct ivq q;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    void *buf;

    ivq_setup(&q, packed);
    uint64_t bgpa = vqfx_alloc(&q.f, 4096, &buf);
    ivq_map(&q, RING_IOVA, q.f.area_gpa, q.f.area_len, VHD_IOTLB_RW);
    ivq_map(&q, BUF_IOVA, bgpa, 4096, VHD_IOTLB_R);
    VHD_CHECK_EQ(vhd_vq_start(&q.f.vq), 0);
    ivq_post(&q, BUF_IOVA, 64, false);
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), 1); /* caches the read-only entry */
    VHD_CHECK_EQ(vhd_vq_push(&q.f.vq, &c, 0), 0);
    VHD_CHECK_EQ(vhd_iotlb_update(q.t, q.f.mem, BUF_IOVA, 4096, vhd_guestmem_uva(&q.f.gm, bgpa),
                                  VHD_IOTLB_RW),
                 0);
    ivq_post(&q, BUF_IOVA + 128, 64, true);
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), 1);
    VHD_CHECK_EQ(c.nw, 1);
    VHD_CHECK(iov[0].iov_base ==
              (uint8_t *)vhd_mem_gpa_to_hva(q.f.mem, bgpa, 1, &(uint32_t){0}) + 128);
    VHD_CHECK_EQ(q.f.vq.error, 0);
    ivq_teardown(&q);
}

/*
 * Receive buffers posted without a mapping: prefault records the miss of
 * the first one not translated before anything is popped, consumes
 * nothing, stops at a pending miss, and after the UPDATE moves on to the
 * next unmapped one; with every buffer mapped it records nothing.
 */
IOTLB_VQ_TEST(vq_prefault_posted_buffers)
{
    struct ivq q;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    void *buf;

    ivq_setup(&q, packed);
    uint64_t bgpa = vqfx_alloc(&q.f, 3 * 4096, &buf);
    ivq_map(&q, RING_IOVA, q.f.area_gpa, q.f.area_len, VHD_IOTLB_RW);
    VHD_CHECK_EQ(vhd_vq_start(&q.f.vq), 0);
    VHD_CHECK_EQ(vhd_vq_prefault(&q.f.vq, 64), 0); /* nothing posted */
    ivq_map(&q, BUF_IOVA, bgpa, 4096, VHD_IOTLB_RW);
    ivq_post(&q, BUF_IOVA, 1500, true);          /* mapped */
    ivq_post(&q, BUF_IOVA + 0x1000, 1500, true); /* not yet */
    ivq_post(&q, BUF_IOVA + 0x2000, 1500, true); /* not yet */
    VHD_CHECK_EQ(vhd_vq_prefault(&q.f.vq, 64), 1);
    VHD_CHECK_EQ(q.f.vq.iotlb_miss, (BUF_IOVA + 0x1000) | VHD_IOTLB_W);
    VHD_CHECK_EQ(vhd_vq_prefault(&q.f.vq, 64), 1); /* pending: unchanged */
    VHD_CHECK_EQ(ivq_take_miss(&q), (BUF_IOVA + 0x1000) | VHD_IOTLB_W);
    VHD_CHECK_EQ(q.f.vq.last_avail_idx, 0);
    VHD_CHECK_EQ(q.f.vq.inflight, 0);
    VHD_CHECK_EQ(q.f.vq.error, 0);
    /* bounded: one chain per turn looks at the mapped first buffer only */
    VHD_CHECK_EQ(vhd_vq_prefault(&q.f.vq, 1), 0);
    VHD_CHECK_EQ(q.f.vq.iotlb_miss, 0);
    ivq_map(&q, BUF_IOVA + 0x1000, bgpa + 0x1000, 4096, VHD_IOTLB_RW);
    VHD_CHECK_EQ(vhd_vq_prefault(&q.f.vq, 64), 1);
    VHD_CHECK_EQ(ivq_take_miss(&q), (BUF_IOVA + 0x2000) | VHD_IOTLB_W);
    ivq_map(&q, BUF_IOVA + 0x2000, bgpa + 0x2000, 4096, VHD_IOTLB_RW);
    VHD_CHECK_EQ(vhd_vq_prefault(&q.f.vq, 64), 0);
    VHD_CHECK_EQ(q.f.vq.iotlb_miss, 0);
    for (int i = 0; i < 3; i++) {
        VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), 1);
        VHD_CHECK_EQ(c.nw, 1);
        VHD_CHECK_EQ(vhd_vq_push(&q.f.vq, &c, 0), 0);
    }
    VHD_CHECK_EQ(vhd_vq_prefault(&q.f.vq, 64), 0); /* all popped */
    ivq_teardown(&q);

    /* without an IOTLB it does nothing */
    struct vqfx f;
    struct vqfx_opts o = {.size = 64, .packed = packed};
    vqfx_setup(&f, &o);
    VHD_CHECK_EQ(vhd_vq_prefault(&f.vq, 64), 0);
    vqfx_teardown(&f);
}

/* A ring whose IOMMU pages are not contiguous in host memory fails its start cleanly. */
IOTLB_VQ_TEST(vq_ring_not_contiguous)
{
    struct ivq q;

    ivq_setup(&q, packed);
    /* the descriptor ring's two halves swapped in host memory */
    uint64_t dl = packed ? 16u * 64 : 16u * 64, half = dl / 2;
    uint64_t d = q.f.vq.desc_addr, dg = q.f.dq.desc_gpa;
    ivq_map(&q, RING_IOVA, q.f.area_gpa, q.f.area_len, VHD_IOTLB_RW);
    ivq_map(&q, d, dg + half, half, VHD_IOTLB_RW);
    ivq_map(&q, d + half, dg, half, VHD_IOTLB_RW);
    VHD_CHECK_EQ(vhd_vq_start(&q.f.vq), -EFAULT);
    VHD_CHECK_EQ(q.f.vq.error, VHD_VQ_E_IOTLB_RING);
    ivq_teardown(&q);
}

static bool log_bit(const struct vhd_dirtylog *log, uint64_t gpa)
{
    uint64_t pg = gpa >> VHD_DIRTYLOG_PAGE_SHIFT;
    return (log->bits[pg / 8] >> (pg % 8)) & 1;
}

/* Dirty logging marks guest-physical pages, not IOVAs: data and used-ring writes. */
IOTLB_VQ_TEST(vq_dirty_log_gpas)
{
    struct ivq q;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    struct vhd_dirtylog *log;
    const char *why;
    void *buf;
    int fd = memfd_create("iotlb-log", MFD_CLOEXEC);

    VHD_CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
    VHD_CHECK_EQ(vhd_dirtylog_map(fd, 4096, 0, &log, &why), 0);
    close(fd);
    ivq_setup(&q, packed);
    uint64_t bgpa = vqfx_alloc(&q.f, 8192, &buf);
    ivq_map(&q, RING_IOVA, q.f.area_gpa, q.f.area_len, VHD_IOTLB_RW);
    ivq_map(&q, BUF_IOVA, bgpa + 4096, 4096, VHD_IOTLB_RW);
    vhd_vq_set_log(&q.f.vq, log, true, 0x123000 /* the front-end's log address: not used */);
    VHD_CHECK_EQ(vhd_vq_start(&q.f.vq), 0);
    ivq_post(&q, BUF_IOVA + 16, 100, true);
    VHD_CHECK_EQ(vhd_vq_pop(&q.f.vq, iov, 4, &c), 1);
    memset(iov[0].iov_base, 0xab, 100);
    vhd_vq_log_write(&q.f.vq, iov, 1, 100);
    VHD_CHECK(log_bit(log, bgpa + 4096));
    VHD_CHECK(!log_bit(log, bgpa));
    VHD_CHECK_EQ(vhd_vq_push(&q.f.vq, &c, 100), 0);
    vhd_vq_flush(&q.f.vq);
    VHD_CHECK(log_bit(log, packed ? q.f.dq.desc_gpa : q.f.dq.used_gpa));
    VHD_CHECK(!log_bit(log, 0x123000));
    ivq_teardown(&q);
    vhd_dirtylog_free(log);
}
