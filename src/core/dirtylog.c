/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Dirty-page log (see dirtylog.h): validating and mapping the front-end's
 * bitmap, and marking guest-physical ranges in it.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <linux/magic.h> /* HUGETLBFS_MAGIC */

#include "util/compiler.h"
#include "dirtylog.h"
#include "memguard.h"

int vhd_dirtylog_map(int fd, uint64_t size, uint64_t offset, struct vhd_dirtylog **out,
                     const char **why)
{
    struct stat st;
    struct statfs sfs;
    long page = sysconf(_SC_PAGESIZE);
    int rc;

    if (size == 0 || size > VHD_DIRTYLOG_MAX_SIZE) {
        *why = size == 0 ? "log size 0" : "log larger than 2^37 bytes (52-bit guest addresses)";
        return -EINVAL;
    }
    if (page <= 0 || (offset & ((uint64_t)page - 1)) || offset > (uint64_t)INT64_MAX - size) {
        *why = "log offset not page-aligned or out of range";
        return -EINVAL;
    }
    if (fstat(fd, &st) < 0) {
        *why = "cannot fstat the log fd";
        return -errno;
    }
    if (!S_ISREG(st.st_mode)) {
        *why = "the log fd is not a regular file";
        return -ENODEV;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size < offset + size) {
        *why = "log beyond the end of its file";
        return -ENXIO;
    }
    if (fstatfs(fd, &sfs) == 0 && (uint64_t)sfs.f_type == HUGETLBFS_MAGIC) {
        *why = "log on hugetlbfs";
        return -ENODEV;
    }
    if ((uint64_t)(size_t)size != size) {
        *why = "log larger than the address space";
        return -ENOMEM;
    }

    struct vhd_dirtylog *log = calloc(1, sizeof(*log));
    if (!log) {
        *why = "out of memory";
        return -ENOMEM;
    }
    void *p = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd,
                   (off_t)offset);
    if (p == MAP_FAILED) {
        rc = -errno;
        *why = "cannot map the log";
        goto free_log;
    }
    /* The front-end's bitmap has no place in our core dumps (best effort). */
    (void)madvise(p, (size_t)size, MADV_DONTDUMP);
    rc = vhd_memguard_add(p, (size_t)size, (size_t)page);
    if (rc < 0) {
        *why = "cannot guard the log";
        goto unmap;
    }
    log->guard = rc;
    log->map = p;
    log->len = size;
    log->bits = p;
    log->size = size;
    *out = log;
    return 0;

unmap:
    munmap(p, (size_t)size);
free_log:
    free(log);
    return rc;
}

void vhd_dirtylog_free(struct vhd_dirtylog *log)
{
    if (!log)
        return;
    vhd_memguard_remove(log->guard);
    munmap(log->map, (size_t)log->len);
    free(log);
}

bool vhd_dirtylog_faulted(const struct vhd_dirtylog *log)
{
    return log && vhd_memguard_faulted(log->guard);
}

void vhd_dirtylog_mark(const struct vhd_dirtylog *log, uint64_t gpa, uint64_t len)
{
    uint64_t npages = log->size * 8; /* size <= 2^37: no overflow */

    if (len == 0)
        return;
    uint64_t first = gpa >> VHD_DIRTYLOG_PAGE_SHIFT;
    /* The last byte, gpa + len - 1, saturated: a range may not wrap past 2^64. */
    uint64_t end = len - 1 > UINT64_MAX - gpa ? UINT64_MAX : gpa + len - 1;
    uint64_t last = end >> VHD_DIRTYLOG_PAGE_SHIFT;
    if (first >= npages)
        return;
    if (last >= npages)
        last = npages - 1;

    /* One OR per bitmap byte: the bits of [first, last] that fall in it. */
    for (uint64_t byte = first >> 3; byte <= last >> 3; byte++) {
        unsigned lo = byte == first >> 3 ? (unsigned)(first & 7) : 0;
        unsigned hi = byte == last >> 3 ? (unsigned)(last & 7) : 7;
        uint8_t mask = (uint8_t)((0xffu << lo) & (0xffu >> (7 - hi)));
        __atomic_fetch_or(&log->bits[byte], mask, __ATOMIC_RELEASE);
    }
}
