/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The virtio-blk device (virtio 1.2, section 5.2; virtio 1.x only): creation
 * from options, the struct vhd_dev_ops the transport and runtime drive, and
 * per-queue statistics. Requests are parsed and validated here and carried
 * out by a block backend (src/backend/blk_backend.h).
 */
#ifndef VHD_DEV_BLK_H
#define VHD_DEV_BLK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/dev.h"

/*
 * Limits advertised in config space, and why.
 *
 * VHD_BLK_SEG_MAX: data segments per request (seg_max). With the header and
 * the status descriptor a request is 128 descriptors, the most a 128-entry
 * ring (QEMU's default vhost-user-blk queue-size) holds without indirect
 * descriptors. Each in-flight request carries an iovec array of
 * VHD_BLK_REQ_IOV entries: seg_max + header + status, plus
 * VHD_BLK_IOV_SLACK for buffers that cross a guest memory region boundary
 * (each crossing costs one more iovec). A chain needing more is refused by
 * the engine (VHD_VQ_E_IOV_FULL) and the queue needs a reset; a driver that
 * honours seg_max never gets there.
 *
 * VHD_BLK_SIZE_MAX: largest single segment (size_max), 1 MiB: guests with
 * physically contiguous memory merge pages into big segments; 1 MiB bounds a
 * request at 126 MiB (VHD_BLK_MAX_REQ_BYTES), far below the 2 GiB a single
 * readv/writev transfers.
 *
 * VHD_BLK_MAX_DWZ_SEG: segments per DISCARD / WRITE_ZEROES request
 * (max_discard_seg, max_write_zeroes_seg). Segments are copied out of guest
 * memory into the request before they are validated (no double fetch), so
 * they cost 16 bytes each in every request slot; 16 lets Linux merge
 * discards without bloating the pool.
 *
 * VHD_BLK_MAX_DWZ_SECTORS: sectors per discard / write-zeroes segment
 * (max_discard_sectors, max_write_zeroes_sectors), rounded down to the block
 * size: 2 GiB - 512, QEMU's limit, which bounds the time a write-zeroes
 * fallback (writing real zeroes) keeps one request busy.
 */
#define VHD_BLK_SEG_MAX         126u
#define VHD_BLK_IOV_SLACK       16u
#define VHD_BLK_REQ_IOV         (VHD_BLK_SEG_MAX + 2u + VHD_BLK_IOV_SLACK)
#define VHD_BLK_SIZE_MAX        (1u << 20)
#define VHD_BLK_MAX_REQ_BYTES   ((uint64_t)VHD_BLK_SEG_MAX * VHD_BLK_SIZE_MAX)
#define VHD_BLK_MAX_DWZ_SEG     16u
#define VHD_BLK_MAX_DWZ_SECTORS 0x3fffffu

/* Most queues a device may have (num_queues is 16 bits; this bounds memory). */
#define VHD_BLK_MAX_QUEUES 256u

/* Options of vhd_blk_new(). Zero-initialise, then set what you need. */
struct vhd_blk_opts {
    const char *name;    /* for logs (dev->name); default "blk" */
    const char *image;   /* uring: the file or block device; rbd: the RBD image's name */
    const char *uri;     /* nbd: the server (nbd://..., nbd+unix://...) */
    const char *backend; /* "uring" (default) | "null" | "nbd" | "rbd" */
    /*
     * Bytes. null: the device size (required). uring: the size of a sparse
     * image to create when image does not exist; an existing image must have
     * exactly this size. 0: use the file's size.
     */
    uint64_t size;
    bool ro;             /* read-only device: VIRTIO_BLK_F_RO, writes fail with IOERR */
    bool direct;         /* uring: O_DIRECT */
    bool writethrough;   /* initial cache mode: writeback = 0 (default: writeback = 1) */
    const char *serial;  /* GET_ID answer, at most 20 bytes; NULL: empty */
    uint32_t block_size; /* logical block size: power of two in 512..4096; 0: 512 */
    uint32_t num_queues; /* 1..VHD_BLK_MAX_QUEUES; 0: 1 */
    bool allow_packed;   /* offer VIRTIO_F_RING_PACKED */
    bool no_split;       /* refuse split rings (set_features requires RING_PACKED) */
    /*
     * What a failed backend operation does, as QEMU's werror= / rerror=:
     * "report" (the request completes with IOERR), "stop" (the request and
     * every later one of its queue are held, nothing is reported to the
     * guest, the queue is paused until vhd_blk_resume retries them in
     * order), "enospc" (stop on ENOSPC, report anything else). werror
     * covers writes, flushes, discards and write zeroes (NULL: "enospc",
     * QEMU's default); rerror covers reads ("report" or "stop"; NULL:
     * "report").
     */
    const char *werror;
    const char *rerror;
    const char *locking;     /* uring: "auto" (NULL), "on" or "off": enum vhd_blk_locking */
    const char *pool;        /* rbd: RADOS pool */
    const char *conf;        /* rbd: ceph.conf (NULL: librados' default search) */
    const char *user;        /* rbd: client id (NULL: librados' default) */
    const char *snap;        /* rbd: snapshot to open read-only (NULL: the image) */
    bool report_lost_writes; /* nbd: lost writes fail the next flush (vhd_blk_config) */
};

/*
 * vhd_blk_new - create a virtio-blk device: allocates the struct vhd_dev
 * (ops = &vhd_blk_ops, name, num_queues, a cache-line aligned queues array
 * with each queue's index set and its fds at -1) and the blk state, and
 * opens the backend. Any one thread: the control thread, or the open
 * thread of vhd_blk_device_open (it touches nothing shared with the
 * context; it may block on the backend's open).
 * Returns 0 and *out, or -errno (-EINVAL for bad options or sizes, -ENOENT
 * for a missing image, -EACCES, ...) with a one-line message in err (when
 * err != NULL) suitable for "vhostd: <name>: <err>".
 */
int vhd_blk_new(const struct vhd_blk_opts *o, struct vhd_dev **out, char *err, size_t errlen);

/*
 * vhd_blk_free - free a device from vhd_blk_new: every queue must be
 * detached; remaining per-queue state is finalised, the backend closed (a
 * writable image is fdatasync'ed first, so what the page cache holds
 * survives the daemon's exit), and dev->queue_worker freed if set
 * (malloc'ed by the caller). NULL is fine. Control thread.
 */
void vhd_blk_free(struct vhd_dev *dev);

extern const struct vhd_dev_ops vhd_blk_ops;

/* Capacity in 512-byte sectors (what config space reports). */
uint64_t vhd_blk_capacity(const struct vhd_dev *dev);

/*
 * vhd_blk_resize - change the device's size to bytes (a multiple of the
 * block size): the backend's storage first (growing) or the capacity first
 * (shrinking), so no request reaches storage that is not there. Shrinking
 * a file over data is -EBUSY unless force. The caller tells the front-end
 * (config change). 0, or -errno with a one-line reason in err. Control
 * thread; the queues may be running.
 */
int vhd_blk_resize(struct vhd_dev *dev, uint64_t bytes, bool force, char *err, size_t errlen);

/*
 * vhd_blk_resize in steps, for a caller that must not block (the control
 * loop): vhd_blk_resize_begin returns what vhd_blk_resize would, or
 * -EINPROGRESS when a shrink waits for requests admitted under the old
 * capacity; then vhd_blk_resize_step, called again (a timer) until it
 * returns something else, ends with the same outcome (-ETIMEDOUT after the
 * bounded wait: nothing changed). vhd_blk_resize_cancel gives a shrink in
 * progress up (the old capacity back). One shrink at a time (-EBUSY).
 * Control thread.
 */
int vhd_blk_resize_begin(struct vhd_dev *dev, uint64_t bytes, bool force, char *err, size_t errlen);
int vhd_blk_resize_step(struct vhd_dev *dev, char *err, size_t errlen);
void vhd_blk_resize_cancel(struct vhd_dev *dev);

/* Per-queue counters, kept by the owning worker without atomics. */
struct vhd_blk_queue_stats {
    uint64_t completed; /* requests completed with a status byte */
    uint64_t status_ok;
    uint64_t status_ioerr;
    uint64_t status_unsupp;
    uint64_t bad_chains; /* chains without a status byte: pushed with length 0 */
    uint64_t reads, writes, flushes, get_ids, discards, write_zeroes; /* by type, any status */
    uint64_t dsync_writes;              /* writes submitted with RWF_DSYNC (writethrough mode) */
    uint64_t bytes_read, bytes_written; /* successful IN / OUT data */
    uint64_t backend_errors;            /* backend operations that failed */
    uint64_t held;    /* failed operations held by a stop policy (werror/rerror) */
    uint64_t retried; /* held operations submitted again by a resume */
    bool broken;      /* the queue stopped (bad chain or engine error): NEEDS_RESET */
};

/*
 * vhd_blk_queue_stats - copy q's counters. Call it while q is detached (the
 * worker owns them while attached). -ENODEV when q has no blk state
 * (queue_init not done).
 */
int vhd_blk_queue_stats(const struct vhd_queue *q, struct vhd_blk_queue_stats *out);

/*
 * vhd_blk_queue_counters - requests completed, bytes read + written and
 * errors (IOERR + bad chains) of q, any time, also while its worker runs it
 * (relaxed atomic loads: a snapshot may be a burst old). -ENODEV when q has
 * no blk state. Control thread.
 */
int vhd_blk_queue_counters(const struct vhd_queue *q, uint64_t *completed, uint64_t *bytes,
                           uint64_t *errors);

/*
 * vhd_blk_resume - retry what the device's paused queues hold (werror /
 * rerror stop policies): each queue that paused resubmits its held requests
 * in the order they were popped and takes new ones again; one that fails
 * again pauses again. Returns how many queues were paused when it was
 * called (0: nothing to resume, a no-op). Control thread (the daemon calls
 * it on SIGUSR2; a management API's "resume"); the workers are reached
 * through a per-queue counter and the queue's wake fd, never a lock.
 */
int vhd_blk_resume(struct vhd_dev *dev);

/*
 * vhd_blk_paused_queues - how many queues of dev are paused now (holding
 * requests under a stop policy). Any time, control thread.
 */
unsigned vhd_blk_paused_queues(const struct vhd_dev *dev);

#endif /* VHD_DEV_BLK_H */
