/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guest memory region table (see mem.h): validation and mmap() of the
 * front-end's regions, immutable GPA-sorted tables with a UVA index,
 * refcounted mappings shared by successive tables (ADD/REM_MEM_REG), and the
 * slow paths of the GPA and front-end-VA lookups.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* qsort_r, MAP_NORESERVE, MADV_DONTDUMP */
#endif
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <unistd.h>

#include <linux/magic.h> /* HUGETLBFS_MAGIC */

#include "mem.h"
#include "memguard.h"

/*
 * Threading: tables are built and freed by the control thread only, which is
 * also the only writer of vhd_mem_map.refs (plain ints, no atomics). Lookups
 * only read an immutable table and may run on any thread that holds it.
 *
 * Bounds every table satisfies (checked by desc_check and table_index), which
 * the lookups rely on:
 *  - size > 0, and gpa + size, uva + size never wrap: a region's end is
 *    representable, so a region cannot contain the byte at 2^64 - 1;
 *  - mmap_offset + size fits in an off_t, hence size < 2^63 (required by
 *    vhd_index_nospec, which clamps offsets and indices below) and size fits
 *    the size_t of mmap() and iov_len on 64-bit hosts;
 *  - regions are sorted by gpa and pairwise disjoint in GPA and in UVA.
 */

/* Largest off_t: mmap() offsets and file sizes are off_t. */
#define MEM_OFF_MAX ((uint64_t)INT64_MAX >> (64 - 8 * sizeof(off_t)))

/* ---- building ---- */

/*
 * Check one front-end description on its own (overlaps are checked once the
 * whole table is sorted). Returns 0 or -EINVAL.
 */
static int desc_check(const struct vhd_mem_region_desc *d)
{
    if (d->size == 0)
        return -EINVAL;
    if (d->size > UINT64_MAX - d->gpa || d->size > UINT64_MAX - d->uva)
        return -EINVAL;
    if (d->mmap_offset > MEM_OFF_MAX || d->size > MEM_OFF_MAX - d->mmap_offset)
        return -EINVAL;
    if ((uint64_t)(size_t)d->size != d->size) /* 32-bit hosts */
        return -EINVAL;
    return 0;
}

/*
 * A zeroed table for n regions in one allocation: the struct, then the
 * regions, then by_uva. n == 0 leaves both arrays NULL. NULL on ENOMEM.
 */
static struct vhd_mem *table_alloc(uint32_t n)
{
    size_t sz =
        sizeof(struct vhd_mem) + (size_t)n * (sizeof(struct vhd_mem_region) + sizeof(uint32_t));
    struct vhd_mem *mem = calloc(1, sz);

    if (!mem)
        return NULL;
    mem->nregions = n;
    if (n) {
        mem->regions = (struct vhd_mem_region *)(void *)(mem + 1);
        mem->by_uva = (uint32_t *)(void *)(mem->regions + n);
    }
    return mem;
}

static int cmp_gpa(const void *a, const void *b)
{
    const struct vhd_mem_region *ra = a, *rb = b;

    return (ra->gpa > rb->gpa) - (ra->gpa < rb->gpa);
}

static int cmp_uva(const void *a, const void *b, void *arg)
{
    const struct vhd_mem_region *regions = arg;
    uint64_t ua = regions[*(const uint32_t *)a].uva;
    uint64_t ub = regions[*(const uint32_t *)b].uva;

    return (ua > ub) - (ua < ub);
}

/*
 * Sort mem->regions by gpa, build mem->by_uva, and reject overlaps in either
 * space. For start-sorted intervals it is enough to compare neighbours: if
 * A overlaps a later C, it overlaps every B that starts between them.
 * Returns 0 or -EINVAL.
 */
static int table_index(struct vhd_mem *mem)
{
    struct vhd_mem_region *r = mem->regions;
    uint32_t n = mem->nregions;

    if (n == 0)
        return 0; /* qsort(NULL, 0, ...) is undefined */
    qsort(r, n, sizeof(*r), cmp_gpa);
    for (uint32_t i = 1; i < n; i++) {
        /* Sorted, so r[i].gpa >= r[i-1].gpa: the subtraction cannot wrap. */
        if (r[i].gpa - r[i - 1].gpa < r[i - 1].size)
            return -EINVAL;
    }
    for (uint32_t i = 0; i < n; i++)
        mem->by_uva[i] = i;
    qsort_r(mem->by_uva, n, sizeof(uint32_t), cmp_uva, r);
    for (uint32_t i = 1; i < n; i++) {
        const struct vhd_mem_region *prev = &r[mem->by_uva[i - 1]];
        if (r[mem->by_uva[i]].uva - prev->uva < prev->size)
            return -EINVAL;
    }
    return 0;
}

/*
 * Bytes mapped by every table (region_map adds, map_destroy subtracts) and
 * the process-wide cap (0: the default). Control path only; atomic so that
 * any thread may read them.
 */
static uint64_t g_mapped, g_total_max;

void vhd_mem_set_total_max(uint64_t bytes)
{
    __atomic_store_n(&g_total_max, bytes, __ATOMIC_RELAXED);
}

uint64_t vhd_mem_total_max(void)
{
    uint64_t m = __atomic_load_n(&g_total_max, __ATOMIC_RELAXED);
    return m ? m : VHD_MEM_TOTAL_MAX_DEFAULT;
}

uint64_t vhd_mem_mapped(void)
{
    return __atomic_load_n(&g_mapped, __ATOMIC_RELAXED);
}

uint64_t vhd_mem_bytes(const struct vhd_mem *mem)
{
    uint64_t n = 0;
    for (uint32_t i = 0; mem && i < mem->nregions; i++)
        n += mem->regions[i].map->len; /* at most 509 mappings, each < 2^63: no wrap */
    return n;
}

/* Unmap and free a mapping no table holds (refs == 0). */
static void map_destroy(struct vhd_mem_map *map)
{
    vhd_memguard_remove(map->guard);
    munmap(map->base, map->len);
    __atomic_sub_fetch(&g_mapped, map->len, __ATOMIC_RELAXED);
    free(map);
}

/*
 * mmap() the region r (gpa, size, mmap_offset already validated) from fd and
 * set r->map (refs 0: not yet committed to a table) and r->hva.
 *
 * Offset beyond the file: mmap() of a regular file (memfd, tmpfs, hugetlbfs)
 * succeeds past EOF and the first touch raises SIGBUS, so for regular files
 * we require mmap_offset + size <= st_size and return -ENXIO otherwise (the
 * POSIX mmap() errno for "range invalid for the object"). Non-regular fds
 * (character devices such as /dev/dax report st_size 0) have no size we can
 * check, so they go to mmap() unchecked and its errno is returned; the device
 * driver decides what lies beyond the end. Refusing them would break
 * device-backed guest RAM. Sockets, pipes and the like fail in mmap()
 * (-ENODEV, -EACCES). A front-end that shrinks a regular file after this
 * check can still make an access SIGBUS; every mapping is registered with
 * the SIGBUS guard (memguard.h) so the daemon survives that.
 *
 * hugetlbfs needs a huge-page-aligned file offset and length, so there the
 * offset is rounded down and the length rounded up to the huge page size
 * (like libvhost-user); elsewhere to the base page size.
 *
 * Returns 0, -ENXIO, -ENOMEM, or the fstat()/mmap() errno (-EBADF, -EACCES,
 * -ENODEV, ...).
 */
static int region_map(struct vhd_mem_region *r, int fd, uint64_t page)
{
    struct stat st;
    struct statfs sfs;
    uint64_t align = page;
    bool huge = false;
    int rc;

    if (fstat(fd, &st) < 0)
        return -errno;
    if (S_ISREG(st.st_mode)) {
        uint64_t fsize = st.st_size < 0 ? 0 : (uint64_t)st.st_size;
        if (r->mmap_offset > fsize || r->size > fsize - r->mmap_offset)
            return -ENXIO;
    }
    if (fstatfs(fd, &sfs) == 0 && (uint64_t)sfs.f_type == HUGETLBFS_MAGIC &&
        (uint64_t)sfs.f_bsize > page && !((uint64_t)sfs.f_bsize & ((uint64_t)sfs.f_bsize - 1))) {
        align = (uint64_t)sfs.f_bsize;
        huge = true;
    }

    /* mmap_offset + size <= MEM_OFF_MAX < 2^63, so none of this wraps. */
    uint64_t off = r->mmap_offset & ~(align - 1);
    uint64_t delta = r->mmap_offset - off;
    uint64_t len = r->size + delta;
    if (huge)
        len = (len + align - 1) & ~(align - 1);
    if ((uint64_t)(size_t)len != len)
        return -ENOMEM;

    struct vhd_mem_map *map = malloc(sizeof(*map));
    if (!map)
        return -ENOMEM;
    void *p =
        mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, (off_t)off);
    if (p == MAP_FAILED) {
        rc = -errno;
        goto free_map;
    }
    /*
     * Guest RAM has no place in our core dumps (size, and other tenants'
     * data). Best effort: failure changes nothing else.
     */
    (void)madvise(p, (size_t)len, MADV_DONTDUMP);

    rc = vhd_memguard_add(p, (size_t)len, (size_t)align);
    if (rc < 0) {
        munmap(p, (size_t)len);
        goto free_map;
    }
    map->guard = rc;

    map->base = p;
    map->len = (size_t)len;
    map->refs = 0;
    __atomic_add_fetch(&g_mapped, map->len, __ATOMIC_RELAXED);
    r->map = map;
    r->hva = (uint8_t *)p + delta;
    return 0;

free_map:
    free(map);
    return rc;
}

/*
 * table_build - the common body of new/add/remove: a table made of old's
 * regions (all but index skip; skip >= old->nregions keeps them all; old may
 * be NULL) sharing their mappings, plus n new regions from descs, mapped now.
 * Everything is validated before anything is mapped. On failure nothing is
 * left behind and old is untouched. Returns 0 and *out, or -errno.
 */
static int table_build(const struct vhd_mem *old, uint32_t skip,
                       const struct vhd_mem_region_desc *descs, uint32_t n, struct vhd_mem **out)
{
    uint32_t nold = old ? old->nregions : 0;
    uint32_t nkeep = nold - (skip < nold ? 1 : 0);
    uint32_t mapped = 0;
    struct vhd_mem *mem;
    int rc;

    if (n > VHD_MEM_MAX_REGIONS || nkeep > VHD_MEM_MAX_REGIONS - n)
        return -EINVAL;
    if (n > 0 && !descs)
        return -EINVAL;
    for (uint32_t i = 0; i < n; i++) {
        rc = desc_check(&descs[i]);
        if (rc < 0)
            return rc;
    }

    mem = table_alloc(nkeep + n);
    if (!mem)
        return -ENOMEM;
    uint32_t k = 0;
    for (uint32_t i = 0; i < nold; i++) {
        if (i != skip)
            mem->regions[k++] = old->regions[i]; /* map shared; refs taken at commit */
    }
    for (uint32_t i = 0; i < n; i++) {
        struct vhd_mem_region *r = &mem->regions[k++];
        r->gpa = descs[i].gpa;
        r->size = descs[i].size;
        r->uva = descs[i].uva;
        r->mmap_offset = descs[i].mmap_offset;
        r->hva = NULL;
        r->map = NULL; /* mapped below, once the whole table is known valid */
    }
    rc = table_index(mem);
    if (rc < 0)
        goto free_table;

    /*
     * Map the new regions. The table is sorted now; a new region is found
     * again by its gpa, which is unique since no two regions overlap.
     */
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    for (mapped = 0; mapped < n; mapped++) {
        uint32_t hint = 0;
        int i = vhd_mem__find_gpa(mem, descs[mapped].gpa, &hint);
        if (i < 0 || mem->regions[i].map) { /* cannot happen: survive it */
            rc = -EINVAL;
            goto unmap_new;
        }
        rc = region_map(&mem->regions[i], descs[mapped].fd, page);
        if (rc < 0)
            goto unmap_new;
    }

    /* Commit: no failure past this point. New maps go 0 -> 1, shared ones +1. */
    for (uint32_t i = 0; i < mem->nregions; i++)
        mem->regions[i].map->refs++;
    *out = mem;
    return 0;

unmap_new:
    for (uint32_t j = 0; j < mapped; j++) {
        uint32_t hint = 0;
        int i = vhd_mem__find_gpa(mem, descs[j].gpa, &hint);
        if (i >= 0 && mem->regions[i].map)
            map_destroy(mem->regions[i].map);
    }
free_table:
    free(mem);
    return rc;
}

/*
 * Returns -EINVAL for any descriptor problem (n > VHD_MEM_MAX_REGIONS, zero
 * size, gpa/uva + size wrapping, mmap_offset + size beyond the largest off_t,
 * GPA or UVA overlap), -ENXIO when a regular file is shorter than
 * mmap_offset + size, -ENOMEM, or the fstat()/mmap() errno (-EBADF, ...).
 */
int vhd_mem_new(const struct vhd_mem_region_desc *descs, uint32_t n, struct vhd_mem **out)
{
    return table_build(NULL, UINT32_MAX, descs, n, out);
}

/* old may be NULL (no table yet: a front-end using only ADD_MEM_REG). */
int vhd_mem_add(const struct vhd_mem *old, const struct vhd_mem_region_desc *desc,
                struct vhd_mem **out)
{
    if (!desc)
        return -EINVAL;
    return table_build(old, UINT32_MAX, desc, 1, out);
}

/* old may be NULL (then -ENOENT). */
int vhd_mem_remove(const struct vhd_mem *old, uint64_t gpa, uint64_t size, uint64_t uva,
                   struct vhd_mem **out)
{
    uint32_t hint = 0;
    int i;

    if (!old)
        return -ENOENT;
    i = vhd_mem__find_gpa(old, gpa, &hint);
    if (i < 0)
        return -ENOENT;
    const struct vhd_mem_region *r = &old->regions[i];
    if (r->gpa != gpa || r->size != size || r->uva != uva)
        return -ENOENT;
    return table_build(old, (uint32_t)i, NULL, 0, out);
}

void vhd_mem_free(struct vhd_mem *mem)
{
    if (!mem)
        return;
    for (uint32_t i = 0; i < mem->nregions; i++) {
        struct vhd_mem_map *map = mem->regions[i].map;
        if (--map->refs == 0)
            map_destroy(map);
    }
    free(mem);
}

/* ---- lookups ---- */

/*
 * Binary search for the last region starting at or below gpa. The index
 * comes from comparisons against a guest value, so it is clamped before use
 * in case the "nothing below" branch is mispredicted.
 */
int vhd_mem__find_gpa(const struct vhd_mem *mem, uint64_t gpa, uint32_t *hint)
{
    uint32_t lo = 0, hi = mem->nregions;

    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (mem->regions[mid].gpa <= gpa)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    uint32_t i = (uint32_t)vhd_index_nospec(lo - 1, mem->nregions);
    const struct vhd_mem_region *r = &mem->regions[i];
    if (gpa - r->gpa >= r->size) /* gpa >= r->gpa here: no wrap */
        return -1;
    *hint = i;
    return (int)i;
}

/*
 * -EOVERFLOW means gpa + len > UINT64_MAX (a range ending exactly at 2^64
 * included: no region can hold the byte at UINT64_MAX anyway).
 * Error precedence: -EOVERFLOW, then -EFAULT (the range is bad whatever the
 * array size), then -ENOBUFS. The walk after the first region is O(1) per
 * segment: regions are sorted and disjoint, so the byte after region i is
 * covered only if region i + 1 starts exactly there. On success *hint is the
 * region holding the last byte (where the next buffer most likely starts);
 * on failure *hint is unchanged and iov[0..max_iov) may have been written.
 */
int vhd_mem_gpa_to_iov(const struct vhd_mem *mem, uint64_t gpa, uint64_t len, struct iovec *iov,
                       uint32_t max_iov, uint32_t *hint)
{
    const struct vhd_mem_region *regions = mem->regions;
    uint32_t n = mem->nregions;
    uint32_t i = UINT32_MAX, cnt = 0;

    if (len == 0)
        return 0;
    if (len > UINT64_MAX - gpa)
        return -EOVERFLOW;

    /* First region: the caller's hint (untrusted: checked, then clamped), else search. */
    if (*hint < n) {
        uint32_t h = (uint32_t)vhd_index_nospec(*hint, n);
        if (gpa >= regions[h].gpa && gpa - regions[h].gpa < regions[h].size)
            i = h;
    }
    if (i == UINT32_MAX) {
        uint32_t unused;
        int f = vhd_mem__find_gpa(mem, gpa, &unused);
        if (f < 0)
            return -EFAULT;
        i = (uint32_t)f;
    }

    for (;;) {
        const struct vhd_mem_region *r = &regions[i];
        uint64_t off = gpa - r->gpa; /* < r->size */
        uint64_t seg = r->size - off < len ? r->size - off : len;

        if (cnt < max_iov) {
            iov[cnt].iov_base = r->hva + vhd_index_nospec(off, r->size);
            iov[cnt].iov_len = (size_t)seg;
        }
        cnt++;
        len -= seg;
        if (len == 0)
            break;
        gpa += seg; /* == r->gpa + r->size: representable, see the table bounds */
        if (i + 1 >= n || regions[i + 1].gpa != gpa)
            return -EFAULT;
        i++;
    }
    if (cnt > max_iov)
        return -ENOBUFS;
    *hint = i;
    return (int)cnt;
}

/* Binary search over by_uva; same shape as vhd_mem__find_gpa. */
int vhd_mem__find_uva(const struct vhd_mem *mem, uint64_t uva)
{
    uint32_t lo = 0, hi = mem->nregions;

    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (mem->regions[mem->by_uva[mid]].uva <= uva)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return -1;
    uint32_t i = mem->by_uva[vhd_index_nospec(lo - 1, mem->nregions)];
    const struct vhd_mem_region *r = &mem->regions[vhd_index_nospec(i, mem->nregions)];
    if (uva - r->uva >= r->size) /* uva >= r->uva here: no wrap */
        return -1;
    return (int)vhd_index_nospec(i, mem->nregions);
}

void *vhd_mem_uva_to_hva(const struct vhd_mem *mem, uint64_t uva, uint64_t len)
{
    int i = vhd_mem__find_uva(mem, uva);

    if (i < 0)
        return NULL;
    const struct vhd_mem_region *r = &mem->regions[i];
    uint64_t off = uva - r->uva;
    if (len > r->size - off)
        return NULL;
    return r->hva + vhd_index_nospec(off, r->size);
}

const struct vhd_mem_region *vhd_mem_region_of(const struct vhd_mem *mem, uint64_t gpa)
{
    uint32_t hint = 0;
    int i = vhd_mem__find_gpa(mem, gpa, &hint);

    return i < 0 ? NULL : &mem->regions[i];
}

bool vhd_mem_faulted(const struct vhd_mem *mem)
{
    if (!mem)
        return false;
    for (uint32_t i = 0; i < mem->nregions; i++)
        if (vhd_memguard_faulted(mem->regions[i].map->guard))
            return true;
    return false;
}

/* Does region r's host range hold [p, p+len)? Compares lengths, not ends. */
static bool region_holds_hva(const struct vhd_mem_region *r, uintptr_t p, uint64_t len)
{
    uintptr_t base = (uintptr_t)r->hva;

    return r->hva && p >= base && p - base < r->size && len <= r->size - (p - base);
}

int vhd_mem_hva_to_gpa(const struct vhd_mem *mem, const void *hva, uint64_t len, uint32_t *hint,
                       uint64_t *gpa)
{
    uintptr_t p = (uintptr_t)hva;
    uint32_t h = *hint;

    if (!mem)
        return -EFAULT;
    if (h < mem->nregions && region_holds_hva(&mem->regions[h], p, len)) {
        *gpa = mem->regions[h].gpa + (p - (uintptr_t)mem->regions[h].hva);
        return 0;
    }
    for (uint32_t i = 0; i < mem->nregions; i++) {
        const struct vhd_mem_region *r = &mem->regions[i];
        if (region_holds_hva(r, p, len)) {
            *hint = i;
            *gpa = r->gpa + (p - (uintptr_t)r->hva);
            return 0;
        }
    }
    return -EFAULT;
}
