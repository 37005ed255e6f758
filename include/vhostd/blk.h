/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libvhostd virtio-blk devices (virtio 1.2 section 5.2, virtio 1.x only):
 * a disk backed by a file or block device through the workers' io_urings,
 * an NBD server (libnbd, driven by the same io_urings), a Ceph RBD image
 * through librbd, or a null disk that reads zeroes and discards writes
 * (benchmarks).
 * Multi-queue, discard, write-zeroes, flush with a guest-switchable cache
 * mode, read-only disks, inflight tracking (a restarted back-end resumes the
 * requests a crash interrupted) and dirty logging (live migration).
 *
 *     struct vhd_blk_config c = {
 *         .dev = { .name = "disk0", .endpoint = { .path = "/run/disk0.sock" } },
 *         .image = "/var/lib/vm/disk0.img",
 *         .num_queues = 4,
 *     };
 *     struct vhd_device *dev;
 *     char err[256];
 *     if (vhd_blk_device_new(ctx, &c, &dev, err, sizeof(err)) < 0) ... report err ...
 *
 * Threading: control thread (vhostd/ctx.h).
 */
#ifndef VHOSTD_BLK_H
#define VHOSTD_BLK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vhostd/ctx.h"
#include "vhostd/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most queues a blk device may have. */
#define VHD_BLK_DEVICE_MAX_QUEUES 256u

struct vhd_blk_config {
    struct vhd_device_config dev;
    /* "uring" (default): image through io_uring; "null": no storage; "nbd": an NBD server (uri);
       "rbd": a Ceph RBD image (librbd: pool, image, conf, user, snap) */
    const char *backend;
    const char *image; /* uring: the file or block device; rbd: the RBD image's name */
    /*
     * Bytes. null: the device size (required). uring: the size of a sparse
     * image to create when image does not exist; an existing image must
     * have exactly this size. 0: the file's size.
     */
    uint64_t size;
    bool read_only;      /* VIRTIO_BLK_F_RO; writes complete with IOERR */
    bool direct;         /* uring: O_DIRECT (bypass the host page cache); rbd: librbd's cache off */
    bool writethrough;   /* start in writethrough mode (default: writeback until the guest says) */
    const char *serial;  /* GET_ID answer, at most 20 bytes; NULL: empty */
    uint32_t block_size; /* logical block size, a power of two in 512..4096; 0: 512 */
    uint32_t num_queues; /* 1..VHD_BLK_DEVICE_MAX_QUEUES; 0: 1 */
    /*
     * uring: lock the image as QEMU does (byte-range OFD locks at QEMU's
     * offsets, held on the device's fd for its life), so QEMU, qemu-img,
     * qemu-storage-daemon or another vhostd cannot write it meanwhile, and
     * refuse (-EBUSY, naming the lock) an image one of them writes. "auto"
     * (NULL): lock, or warn and go on where the file system has no OFD
     * locks; "on": refuse such a file system; "off": no locks.
     */
    const char *locking;
    /*
     * What a failed backend operation does, as QEMU's werror= / rerror=:
     * "report" (IOERR to the guest), "stop" (the request is held and its
     * queue paused, nothing reported, until vhd_blk_device_resume retries
     * it), "enospc" (stop on ENOSPC, report other errors). werror covers
     * writes, flushes, discards and write zeroes (NULL: "enospc", QEMU's
     * default); rerror reads ("report" or "stop"; NULL: "report").
     */
    const char *werror;
    const char *rerror;
    /*
     * nbd: the server, nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH
     * (libnbd URIs). vhd_blk_device_new connects to it once to learn the size
     * and features, blocking the caller up to 10 s meanwhile (create nbd
     * devices before the control thread serves others, or with
     * vhd_blk_device_open). Without multi-conn
     * from the server, num_queues must be 1.
     */
    const char *uri;
    /*
     * rbd: the image is opened (cluster connected) by vhd_blk_device_new, on
     * the caller's thread: up to 30 s when the cluster does not answer
     * (vhd_blk_device_open does it on a thread of its own).
     * librados' threads open sockets at any time: no seccomp filter that
     * forbids them may be in force.
     */
    const char *pool; /* rbd: the RADOS pool (required) */
    const char *conf; /* rbd: ceph.conf path; NULL: librados' default search */
    const char *user; /* rbd: the client id, e.g. "admin"; NULL: librados' default */
    const char *snap; /* rbd: serve this snapshot, read-only; NULL: the image itself */
    /*
     * nbd: when a connection drops while the server holds writes it had
     * acknowledged and no flush covered, the server may have lost them (a
     * restart without them, a crash). true: the next FLUSH fails once with
     * IOERR; false (QEMU's NBD client does the same): logged only, since a
     * server that keeps its data across a restart (most do) lost nothing.
     */
    bool report_lost_writes;
};

/*
 * vhd_blk_device_new - create a blk device in ctx and open its backend (the
 * image is opened, or created sparse, now). The device is stopped: call
 * vhd_device_start(). Returns 0 and *out, or -errno (-EINVAL a bad field,
 * a worker index out of range; -ENOENT, -EACCES, ... opening the image)
 * with a one-line reason in err (errlen bytes, may be 0).
 */
int vhd_blk_device_new(struct vhd_ctx *ctx, const struct vhd_blk_config *cfg,
                       struct vhd_device **out, char *err, size_t errlen);

/*
 * What a vhd_blk_device_open reports, once, on the control thread: the new
 * (stopped) device and rc 0, or dev NULL, rc -errno and a one-line reason
 * in err (valid during the call only); -ECANCELED when vhd_ctx_destroy came
 * first.
 */
typedef void (*vhd_device_open_fn)(void *opaque, struct vhd_device *dev, int rc, const char *err);

/*
 * vhd_blk_device_open - vhd_blk_device_new without blocking the control
 * thread: the backend is opened (image opened or created and locked, with
 * its wait for a previous user's locks; NBD server probed, up to 10 s; RBD
 * image opened, up to 30 s) on a thread started for it, which does only
 * that; the device is then created in ctx from the control loop
 * (vhd_ctx_run, vhd_ctx_dispatch), which meanwhile serves every other
 * device, and done(opaque, ...) is called there. cfg is copied: it need not
 * outlive the call. vhd_ctx_destroy waits for opens still running and
 * reports them -ECANCELED. Returns 0 (done will be called), or -errno with
 * err set and done never called (-EINVAL a bad field, -ENOMEM, -EAGAIN no
 * thread). Control thread.
 */
int vhd_blk_device_open(struct vhd_ctx *ctx, const struct vhd_blk_config *cfg,
                        vhd_device_open_fn done, void *opaque, char *err, size_t errlen);

/*
 * vhd_blk_device_resume - retry what a paused blk device holds (werror /
 * rerror "stop"): each paused queue resubmits its held requests in the
 * order the guest queued them, then takes new ones; one that fails again
 * pauses again. Returns how many queues were paused (0: nothing to do), or
 * -EINVAL when dev is not a blk device. vhostd calls it on SIGUSR2.
 */
int vhd_blk_device_resume(struct vhd_device *dev);

/*
 * vhd_blk_device_resize - change a blk device's size to bytes (a positive
 * multiple of its block size): a null device's size changes; an image file
 * grows (sparse) or is cut; a block device is -ENOTSUP. Shrinking a file
 * over data it holds past the new end is -EBUSY unless force. The config
 * space's capacity changes at once and a connected front-end is told with
 * VHOST_USER_BACKEND_CONFIG_CHANGE_MSG on the back-end channel (when it
 * negotiated BACKEND_REQ and CONFIG; QEMU then re-reads the config and
 * notifies the guest); while the device is suspended (every ring stopped)
 * the message waits until a ring starts. Shrinking while queues run:
 * requests past the new end fail with IOERR from now on, and the call waits
 * (at most 5 s, -ETIMEDOUT then, nothing changed) until every request taken
 * under the old size has completed before it cuts the storage; requests
 * held by a stop policy are not waited for (their retry checks the range
 * again). Returns 0, or -errno (-EINVAL: not a blk device or a bad size)
 * with a one-line reason in err (errlen bytes, may be 0).
 */
int vhd_blk_device_resize(struct vhd_device *dev, uint64_t bytes, bool force, char *err,
                          size_t errlen);

/* What a vhd_blk_device_resize_async reports, once, on the control thread. */
typedef void (*vhd_device_resize_fn)(void *opaque, int rc, const char *err);

/*
 * vhd_blk_device_resize_async - vhd_blk_device_resize without blocking the
 * control thread while a shrink waits for the requests taken under the old
 * size: returns -EINPROGRESS, and done(opaque, rc, err) is called later,
 * once, from the control loop with what vhd_blk_device_resize would have
 * returned (-ECANCELED: the device was destroyed first); or returns that
 * outcome at once (growing, a refusal, nothing to wait for) and done is
 * never called. One shrink at a time per device (-EBUSY). Control thread.
 */
int vhd_blk_device_resize_async(struct vhd_device *dev, uint64_t bytes, bool force,
                                vhd_device_resize_fn done, void *opaque, char *err, size_t errlen);

/* vhd_blk_device_size - a blk device's size in bytes (its capacity); 0 for other devices. */
uint64_t vhd_blk_device_size(const struct vhd_device *dev);

/*
 * vhd_blk_device_paused_queues - how many queues of a blk device are paused
 * now (holding requests under a stop policy); 0 for other devices.
 */
unsigned vhd_blk_device_paused_queues(const struct vhd_device *dev);

#ifdef __cplusplus
}
#endif

#endif /* VHOSTD_BLK_H */
