/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Dirty-page log for live migration (vhost-user spec "Migration":
 * VHOST_F_LOG_ALL with VHOST_USER_PROTOCOL_F_LOG_SHMFD). The front-end
 * shares a bitmap with one bit per 4 KiB guest-physical page; while it
 * migrates, every device write to guest memory sets the bits of the pages
 * written, and the front-end reads and clears them concurrently to re-send
 * those pages.
 *
 * Threading: the control thread maps and frees a log (vhd_dirtylog_map /
 * _free), and swaps it only at quiescent points (no worker runs a queue
 * that uses it). Workers mark with vhd_dirtylog_mark(): an atomic OR per
 * bitmap byte. This is the one atomic read-modify-write on the datapath,
 * and the protocol requires it ("Use atomic operations, as the log may be
 * concurrently manipulated"): the front-end clears bits while we set them.
 * Nothing here runs when logging is off.
 */
#ifndef VHD_DIRTYLOG_H
#define VHD_DIRTYLOG_H

#include <stdbool.h>
#include <stdint.h>

/* VHOST_LOG_PAGE: one bit covers this many bytes of guest-physical memory. */
#define VHD_DIRTYLOG_PAGE_SHIFT 12
#define VHD_DIRTYLOG_PAGE       (1ull << VHD_DIRTYLOG_PAGE_SHIFT)

/*
 * Largest log accepted: 2^37 bytes of bitmap cover 2^52 bytes of
 * guest-physical space, the widest physical address any x86-64 or arm64
 * guest has. QEMU sizes its log to the highest guest address it needs
 * (vhost_get_log_size), far below this.
 */
#define VHD_DIRTYLOG_MAX_SIZE (1ull << 37)

struct vhd_dirtylog {
    uint8_t *bits; /* page p is bit p % 8 of byte p / 8 (the spec's pseudo-code) */
    uint64_t size; /* bytes of bitmap: pages below size * 8 are covered */
    void *map;     /* mmap() result (bits is at the offset's remainder in it) */
    uint64_t len;  /* mmap() length */
    int guard;     /* its vhd_memguard slot */
};

/*
 * vhd_dirtylog_map - map the log the front-end sends with SET_LOG_BASE: size
 * bytes at offset of fd (the fd stays the caller's). Checked: 0 < size <=
 * VHD_DIRTYLOG_MAX_SIZE; offset page-aligned and offset + size without
 * overflow; fd a regular file (memfd, tmpfs; not hugetlbfs, whose pages the
 * SIGBUS guard cannot replace) holding the whole range. The mapping is
 * registered with the SIGBUS guard (memguard.h): a front-end that shrinks
 * the file later makes marks go to a zero page, and vhd_dirtylog_faulted()
 * says so. Returns 0 and *out, or -EINVAL (size, offset), -ENXIO (file too
 * short), -ENODEV (not a regular file, or hugetlbfs), -ENOMEM, or the
 * fstat/mmap errno; *why gets a one-line reason on failure.
 */
int vhd_dirtylog_map(int fd, uint64_t size, uint64_t offset, struct vhd_dirtylog **out,
                     const char **why);

/* Unmap and free (NULL is fine). No worker may be marking it any more. */
void vhd_dirtylog_free(struct vhd_dirtylog *log);

/* Did the front-end shrink the log's file under us (SIGBUS absorbed)? NULL: false. */
bool vhd_dirtylog_faulted(const struct vhd_dirtylog *log);

/*
 * vhd_dirtylog_mark - mark every page of [gpa, gpa + len) dirty (len 0:
 * nothing). Pages beyond the log are not marked (the front-end sizes the
 * log to cover guest memory and the rings; a log smaller than that is its
 * own loss, as in libvhost-user and DPDK). Each byte of the bitmap is
 * updated with one atomic OR, release: the data written before the call is
 * visible to a front-end that sees the bit (it clears bits with an atomic
 * exchange, then copies the page).
 */
void vhd_dirtylog_mark(const struct vhd_dirtylog *log, uint64_t gpa, uint64_t len);

#endif /* VHD_DIRTYLOG_H */
