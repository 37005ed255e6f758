/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The block backend interface: what the virtio-blk device (src/dev/blk.c)
 * needs from storage — open/close, and asynchronous read, write, flush,
 * discard and write-zeroes operations that complete on the worker that
 * submitted them. Backends: "uring" (uring.c, io_uring on a file or block
 * device), "null" (null.c, completes inline, no storage), "nbd" (nbd.c,
 * an NBD server through libnbd, driven by the worker's io_uring) and "rbd"
 * (rbd.c, a Ceph RBD image through librbd's asynchronous API).
 */
#ifndef VHD_BLK_BACKEND_H
#define VHD_BLK_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "runtime/rt.h"

struct vhd_blk_backend;
struct vhd_worker;

enum vhd_blk_io_op {
    VHD_BLK_IO_READ,  /* iov <- [offset, offset + len) */
    VHD_BLK_IO_WRITE, /* iov -> [offset, offset + len) */
    /*
     * Every write completed before submission is on stable storage when it
     * completes with 0 (uring: fdatasync through io_uring, buffered or
     * O_DIRECT; null: no storage, nothing to do). A backend never reports a
     * flush done when it may not be (uring: after one failed, every later
     * one fails; nbd: after a connection died while the server held
     * acknowledged writes no flush had covered, the next flush fails once).
     */
    VHD_BLK_IO_FLUSH,
    VHD_BLK_IO_DISCARD,      /* the range may be deallocated; contents afterwards unspecified */
    VHD_BLK_IO_WRITE_ZEROES, /* the range reads back as zeroes afterwards */
};

/* io->flags */
#define VHD_BLK_IO_F_DSYNC 1u /* write: durable when it completes (RWF_DSYNC) */
#define VHD_BLK_IO_F_UNMAP 2u /* write zeroes: the range may be deallocated (punched) */

/*
 * One backend operation. The caller owns the struct (embedded in its
 * request), fills the first block and calls vhd_blk_be_submit(); the
 * backend calls complete() exactly once, on the submitting worker's thread,
 * either later (from the worker's completion loop) or before submit returns
 * (the null backend, or an immediate failure). After complete() the backend
 * no longer touches io, so the callback may reuse or free it.
 */
struct vhd_blk_io {
    /* ---- set by the caller ---- */
    uint8_t op;      /* enum vhd_blk_io_op */
    uint32_t flags;  /* VHD_BLK_IO_F_* */
    uint64_t offset; /* bytes, a multiple of 512 (of the block size, from blk.c) */
    uint64_t len;    /* bytes; read/write: the sum of the iovec lengths */
    /*
     * read/write data. A backend may change the array while the operation
     * is in flight (short I/O) but leaves it as it was before complete()
     * runs, so the caller may submit the same io again (werror=stop retries).
     */
    struct iovec *iov;
    uint32_t iovcnt;
    /* res: 0 on success or -errno. Called exactly once. */
    void (*complete)(struct vhd_blk_io *io, int res);
    /* The caller's tag for ops->cancel (blk: its queue); the backend only compares it. */
    const void *owner;

    /* ---- backend-private ---- */
    struct vhd_io_cb cb;        /* io_uring user_data target */
    struct vhd_blk_backend *be; /* the backend it was submitted to */
    struct vhd_worker *worker;  /* the submitting worker */
    uint64_t done;              /* bytes transferred so far (short I/O resubmission) */
    void *bounce;               /* O_DIRECT bounce buffer for misaligned guest buffers */
    struct iovec biov;          /* single-segment iovec (bounce / zero-writing fallback), or
                                   the caller's iov[cur] saved while it is changed (short I/O) */
    uint32_t cur;               /* short I/O: first caller iovec of the current submission */
    bool cur_saved;             /* short I/O: iov[cur] is cut, its original is in biov */
    uint16_t retries;           /* -EAGAIN/-EINTR resubmissions */
    uint8_t stage;              /* write zeroes: which method is being tried */
    bool lost;                  /* nbd: a part was lost with its connection: issue again */
    uint32_t parts;             /* nbd: commands of this operation not yet retired */
    int res;                    /* nbd: first error of this attempt (-errno), 0 */
    uint64_t issued_ns;         /* nbd: a flush: when it was sent (what it covers) */
    struct vhd_blk_io *next;    /* nbd: link in a connection's waiting or retired list */
    void *conn;                 /* nbd: the connection it runs on */
    void *be_priv;              /* rbd: the completion channel of the submitting worker */
    struct vhd_blk_io *be_next; /* rbd: link in the worker's backlog */
};

/* Image locking (vhd_blk_backend_opts.locking). */
enum vhd_blk_locking {
    VHD_BLK_LOCK_AUTO, /* lock; a file system without OFD locks: warn, go on (default) */
    VHD_BLK_LOCK_ON,   /* lock; a file system without OFD locks: refuse to open */
    VHD_BLK_LOCK_OFF,  /* no locks */
};

/* What open() is given. */
struct vhd_blk_backend_opts {
    const char *image;   /* uring: file or block device path */
    const char *uri;     /* nbd: the server (nbd://..., nbd+unix://...) */
    uint64_t size;       /* bytes: null: device size (required); uring: size of an image to
                            create when absent, or the size the existing one must have; 0: any */
    uint32_t block_size; /* the device's logical block size (512..4096) */
    bool ro;             /* open read-only; writes fail with -EROFS */
    bool direct;         /* uring: O_DIRECT; rbd: librbd's cache off */
    /*
     * uring: take QEMU's image locks (byte-range OFD locks, see uring.c) on
     * the fd for the device's lifetime, and refuse an image another process
     * (QEMU, qemu-storage-daemon, another vhostd) uses in a conflicting way.
     */
    enum vhd_blk_locking locking;
    /* rbd: image is the RBD image's name */
    const char *pool;        /* rbd: the RADOS pool (required) */
    const char *conf;        /* rbd: ceph.conf path (NULL: librados' default search) */
    const char *user;        /* rbd: the client id, e.g. "admin" (NULL: librados' default) */
    const char *snap;        /* rbd: open this snapshot, read-only (NULL: the image itself) */
    bool report_lost_writes; /* nbd: lost writes fail the next flush (else logged only) */
};

struct vhd_blk_backend_ops {
    const char *name; /* "uring", "null", "nbd", "rbd" */

    /*
     * open - create a backend instance. Returns 0 and *out, or -errno with a
     * one-line human message in err (if err != NULL). Any one thread (the
     * control thread, or vhd_blk_device_open's open thread): it may block
     * for its bounded timeouts and touches no worker or context state.
     */
    int (*open)(const struct vhd_blk_backend_opts *o, struct vhd_blk_backend **out, char *err,
                size_t errlen);

    /*
     * close - make written data durable (uring: fdatasync of a writable
     * image) and release everything; no operation may be in flight.
     * Control thread.
     */
    void (*close)(struct vhd_blk_backend *be);

    /*
     * submit - start io on worker w (the caller's thread; uring uses
     * vhd_worker_uring(w)). Never fails synchronously: errors arrive
     * through io->complete.
     */
    void (*submit)(struct vhd_blk_backend *be, struct vhd_worker *w, struct vhd_blk_io *io);

    /*
     * resize - change the storage's size to size bytes (null: the device's
     * size; uring: an image file grows sparse or is truncated) and set
     * be->size. Shrinking a file over data is -EBUSY unless force. NULL
     * (or -ENOTSUP): the backend cannot (a block device). Returns 0 or
     * -errno with a one-line reason in err. Control thread; workers may
     * be submitting meanwhile (the device publishes the new capacity).
     */
    int (*resize)(struct vhd_blk_backend *be, uint64_t size, bool force, char *err, size_t errlen);

    /*
     * cancel - optional: the caller stops using worker w for the operations
     * tagged owner (blk: a ring stop, a detach, a drain). Those the backend
     * holds back without a request on the storage (nbd: waiting for a
     * reconnection) complete now with -ECANCELED, and so do the ones that
     * come back to it later for the same reason (their connection dies
     * meanwhile), until an operation of owner is submitted again. Operations
     * in progress on the storage complete as usual. Called on w's thread,
     * never from inside a complete() callback; complete() may run before it
     * returns. NULL: nothing is ever held back (uring, null, rbd).
     */
    void (*cancel)(struct vhd_blk_backend *be, struct vhd_worker *w, const void *owner);

    /*
     * resize_check - optional: would resize(size, force) refuse now (a
     * read-only image, a block device, data past size unless force)? 0, or
     * what resize would return, with its reason in err; changes nothing.
     * The device asks before a shrink lowers its capacity. Control thread.
     */
    int (*resize_check)(struct vhd_blk_backend *be, uint64_t size, bool force, char *err,
                        size_t errlen);

    /*
     * The io_uring opcodes submit() may use, as bits (1ull << IORING_OP_*):
     * the daemon restricts the workers' rings to these (vhd_rt_opts.uring_ops).
     */
    uint64_t uring_ops;
};

/*
 * The common head of every backend instance (each backend embeds it first).
 * Fields are set by open() and read-only afterwards, so any worker may read
 * them; except size, which resize() changes (workers do not use it: the
 * device checks ranges against its own capacity).
 */
struct vhd_blk_backend {
    const struct vhd_blk_backend_ops *ops;
    uint64_t size;            /* bytes */
    uint32_t phys_block_size; /* physical block size of the storage, bytes (0: unknown) */
    bool ro;                  /* opened read-only */
    bool zeroes_may_unmap;    /* write zeroes with UNMAP may deallocate (config space) */
    char desc[128];           /* for logs: e.g. "uring /var/lib/disk.img (direct)" */
    /*
     * What the storage cannot do (false for uring and null): the device does
     * not offer the matching virtio-blk feature (nbd: what the server
     * advertises). no_flush: nothing to make durable either (the server
     * keeps no volatile cache, NBD spec "NBD_FLAG_SEND_FLUSH").
     */
    bool no_flush, no_discard, no_write_zeroes;
    /*
     * All I/O must go through one connection (nbd without multi-conn: the
     * server does not promise that a flush on one connection covers writes
     * acknowledged on another). The device then refuses more than one queue.
     */
    bool single_conn;
};

extern const struct vhd_blk_backend_ops vhd_blk_backend_uring;
extern const struct vhd_blk_backend_ops vhd_blk_backend_null;
extern const struct vhd_blk_backend_ops vhd_blk_backend_nbd;
extern const struct vhd_blk_backend_ops vhd_blk_backend_rbd;

/* The backend called name ("uring", "null", "nbd", "rbd"), or NULL. */
const struct vhd_blk_backend_ops *vhd_blk_backend_find(const char *name);

static inline void vhd_blk_be_submit(struct vhd_blk_backend *be, struct vhd_worker *w,
                                     struct vhd_blk_io *io)
{
    be->ops->submit(be, w, io);
}

/* ops->cancel when the backend has one (see there). Worker w's thread. */
static inline void vhd_blk_be_cancel(struct vhd_blk_backend *be, struct vhd_worker *w,
                                     const void *owner)
{
    if (be->ops->cancel)
        be->ops->cancel(be, w, owner);
}

#endif /* VHD_BLK_BACKEND_H */
