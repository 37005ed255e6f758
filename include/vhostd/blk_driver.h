/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libvhostd virtio-blk driver: a userspace virtio-blk driver that talks
 * vhost-user to any back-end (vhostd, qemu-storage-daemon, SPDK, ...) over a
 * Unix socket, without a VM. Its "guest memory" is memfd-backed shared memory
 * of this process. Shaped like Linux blk-mq: the device has N queues and each
 * submitting thread owns one of them.
 *
 * Typical use:
 *
 *     struct vhd_blkdrv_opts o = { .socket_path = "/run/vm.sock", .num_queues = 2 };
 *     struct vhd_blkdrv *d;
 *     char err[256];
 *     if (vhd_blkdrv_connect(&o, &d, err, sizeof(err)) < 0) ... report err ...
 *     // in thread i:
 *     struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, i);
 *     void *buf = vhd_blkdrv_buf_alloc(q, 4096);    // zero-copy buffer in shared memory
 *     vhd_blkdrv_submit_read(q, 0, buf, 4096, my_cookie);
 *     struct vhd_blkdrv_completion c[16];
 *     int n = vhd_blkdrv_wait(q, c, 16, 1000);    // or vhd_blkdrv_poll(q, c, 16) in a loop
 *     ... c[k].cookie, c[k].ret ...
 *     // when every thread is done:
 *     vhd_blkdrv_disconnect(d);
 *
 * Conventions: functions return 0 (or a count) or a negative errno and never
 * set errno. Offsets and lengths are in bytes and must be multiples of 512
 * (virtio-blk sectors, virtio 1.2 section 5.2.6).
 *
 * Threading: connect, disconnect and reconnect are control calls: no queue
 * call may run concurrently with them. Every vhd_blkdrv_queue call (submit,
 * poll, wait, buffers, plug) must come from the one thread that owns that
 * queue at the time (ownership may move between threads with the caller's
 * own synchronisation). Different queues are fully independent: no locks,
 * no shared writable state.
 */
#ifndef VHOSTD_BLK_DRIVER_H
#define VHOSTD_BLK_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct vhd_blkdrv;       /* one device: a vhost-user session and its queues */
struct vhd_blkdrv_queue; /* one virtqueue, owned by one thread */

/* Most data segments one request may carry (the driver also honours the device's seg_max). */
#define VHD_BLKDRV_MAX_SEGS 64u
/* Length of a GET_ID answer: NUL-padded, not NUL-terminated when 20 bytes long. */
#define VHD_BLKDRV_ID_BYTES 20u

struct vhd_blkdrv_opts {
    const char *socket_path; /* the back-end's listening socket (required) */
    uint32_t num_queues;     /* queues to use, 1..64 (0: 1); the device must offer them */
    uint32_t queue_size;     /* ring entries (0: 256); a power of two for split rings */
    bool packed;             /* use the packed ring layout (-ENOTSUP when not offered) */
    bool no_indirect;        /* do not use indirect descriptors even when offered */
    bool no_event_idx;       /* do not negotiate VIRTIO_F_EVENT_IDX */
    uint32_t mem_regions;    /* memfd regions of the shared memory, 1..8 (0: 1) */
    /*
     * Total shared memory in bytes (0: computed from pool_size). Rings and
     * request headers come first; what is left is split evenly between the
     * queues' buffer pools.
     */
    uint64_t mem_size;
    uint64_t pool_size; /* buffer pool per queue when mem_size is 0 (0: 4 MiB) */
    int timeout_ms;     /* bound on connecting and on each control exchange (0: 5000) */
    /*
     * Listen on socket_path instead of connecting, and take the back-end's
     * connection (a back-end in client mode, e.g. vhostd client=on). Each
     * connect and reconnect listens anew, waiting up to timeout_ms; the
     * socket file exists only while waiting.
     */
    bool listen;
    bool no_inflight; /* do not negotiate INFLIGHT_SHMFD even when offered (see reconnect) */
    /*
     * Act as the device's IOMMU (VIRTIO_F_ACCESS_PLATFORM, vhost-user "IOMMU
     * support"): 0 off; else the IOMMU page size, a power of two from 4096 to
     * 1 GiB (2 MiB: huge-page mappings; the shared memory is then aligned to
     * and sized in pages). The rings and the request headers are mapped once
     * at connect; each data buffer is mapped for the time its request is in
     * flight (IOTLB UPDATE, acknowledged, then INVALIDATE), at IOVAs
     * unrelated to the memory's guest-physical addresses, so a back-end that
     * ignores the IOTLB fails. Needs a back-end that offers ACCESS_PLATFORM,
     * BACKEND_REQ and REPLY_ACK (-ENOTSUP with the reason otherwise); a
     * thread of the driver answers its IOTLB misses on the back-end channel.
     * vhd_blkdrv_reconnect is -ENOTSUP with the IOMMU on.
     */
    uint64_t iommu_page_size;
    /* Strict: INVALIDATE at each completion and wait for the ack (Linux intel_iommu=strict); else
     * lazy. */
    bool iommu_strict;
    uint32_t iommu_batch; /* lazy: INVALIDATEs go out every this many unmaps (0: 32) */
    /* Map data read-only for writes and write-only for reads (else read-write). */
    bool iommu_exact_perms;
    /*
     * Map each queue's buffer pool once at connect, one IOTLB entry per
     * page, and leave it mapped (a guest that maps its DMA pool for good,
     * as DPDK on vfio-pci does): requests on pool buffers send no IOTLB
     * message. Buffers outside the pools are still mapped per request.
     */
    bool iommu_static;
};

/* What was negotiated and read from the device's configuration space. */
struct vhd_blkdrv_info {
    uint64_t capacity;      /* bytes (config capacity * 512) */
    uint64_t features;      /* negotiated virtio feature bits */
    uint32_t blk_size;      /* logical block size (512 unless BLK_SIZE says otherwise) */
    uint32_t size_max;      /* largest segment the device takes (0: no limit) */
    uint32_t seg_max;       /* data segments per request this driver sends at most */
    uint32_t device_queues; /* queues the device has (MQ num_queues, else 1) */
    uint32_t num_queues;    /* queues in use */
    uint32_t queue_size;    /* ring entries per queue */
    uint32_t max_inflight;  /* requests per queue in flight at once (fewer without indirect) */
    uint32_t max_discard_sectors;      /* DISCARD: per request (0: not reported) */
    uint32_t max_discard_seg;          /* DISCARD: segments per request */
    uint32_t discard_sector_alignment; /* DISCARD: in sectors */
    uint32_t max_write_zeroes_sectors; /* WRITE_ZEROES: per request (0: not reported) */
    uint32_t max_write_zeroes_seg;     /* WRITE_ZEROES: segments per request */
    uint64_t pool_size;                /* bytes of each queue's buffer pool */
    bool read_only;                    /* VIRTIO_BLK_F_RO: writes complete with -EIO */
    bool flush;                        /* VIRTIO_BLK_F_FLUSH (else submit_flush is -ENOTSUP) */
    bool discard;                      /* VIRTIO_BLK_F_DISCARD */
    bool write_zeroes;                 /* VIRTIO_BLK_F_WRITE_ZEROES */
    bool write_zeroes_may_unmap;
    bool packed;              /* packed rings in use */
    bool event_idx;           /* VIRTIO_F_EVENT_IDX in use */
    bool indirect;            /* indirect descriptors in use */
    bool reply_ack;           /* the session uses REPLY_ACK */
    bool inflight;            /* the session uses INFLIGHT_SHMFD: a reconnect resumes the rings */
    uint64_t iommu_page_size; /* the driver is the IOMMU with pages of this size (0: off) */
};

/* IOTLB traffic of a driver acting as the IOMMU, since connect. */
struct vhd_blkdrv_iommu_stats {
    uint64_t updates;     /* UPDATE messages acknowledged (misses answered included) */
    uint64_t invalidates; /* INVALIDATE messages acknowledged */
    uint64_t misses;      /* MISS messages from the back-end */
    uint64_t misses_bad;  /* ... for IOVAs not mapped (left unanswered, as the spec says) */
    uint64_t mapped;      /* buffers and rings mapped now */
};

/* One finished request. */
struct vhd_blkdrv_completion {
    void *cookie;   /* what the caller passed to submit */
    int ret;        /* 0; -EIO: device said IOERR; -ENOTSUP: device said UNSUPP;
                       -EPROTO: invalid status byte; -ECONNRESET: lost when the session
                       ended (see vhd_blkdrv_reconnect) */
    uint8_t status; /* the raw virtio-blk status byte (0xff when none) */
    uint32_t len;   /* bytes the device says it wrote into the request's writable buffers */
};

/* Per-queue counters (owner thread's view; cheap to read). */
struct vhd_blkdrv_queue_stats {
    uint64_t submitted; /* requests made available */
    uint64_t completed; /* completions returned */
    uint64_t kicks;     /* kick eventfd writes */
    uint64_t sleeps;    /* waits that blocked on the call eventfd */
    uint64_t carried; /* requests outstanding when a session ended, kept for the next (inflight) */
};

/*
 * vhd_blkdrv_connect - create the shared memory, connect to the back-end,
 * negotiate (features, protocol features REPLY_ACK/MQ/CONFIG/INFLIGHT_SHMFD when offered,
 * EVENT_IDX and INDIRECT_DESC when offered, packed when asked for), read the
 * config space and start every queue. On failure a one-line reason goes to
 * err (when not NULL) and nothing is left behind.
 * Returns 0 with *out, or -EINVAL (bad options), -ENOTSUP (the device lacks
 * what was asked: packed rings, enough queues, VERSION_1, CONFIG), -ENOMEM
 * (shared memory too small), -ETIMEDOUT, -ECONNRESET, -EPROTO (malformed
 * reply), -EIO (a request refused by the back-end) or a socket errno.
 */
int vhd_blkdrv_connect(const struct vhd_blkdrv_opts *opts, struct vhd_blkdrv **out, char *err,
                       size_t errlen);

/*
 * vhd_blkdrv_disconnect - orderly end: waits (bounded by the timeout) for
 * in-flight requests, whose completions are dropped, stops every ring
 * (GET_VRING_BASE), closes the session and frees everything, including the
 * buffers of the pools. NULL is a no-op.
 */
void vhd_blkdrv_disconnect(struct vhd_blkdrv *d);

/*
 * vhd_blkdrv_reconnect - end the current session and start a new one on a
 * fresh connection to the same socket, reusing the shared memory (buffers
 * from the pools stay valid) and the queues. Requests in flight are first
 * waited for (bounded) and, when the old session is still up, the rings are
 * stopped with GET_VRING_BASE; their completions are kept and returned by
 * the next poll/wait of their queue. Works after the back-end went away too
 * (a daemon restart, a crash). The device's capacity and limits are re-read.
 *
 * Requests the old back-end never completed: when both sessions use
 * INFLIGHT_SHMFD (vhost-user "Inflight I/O tracking"; info.inflight) with
 * the same ring layout, the rings are resumed as they are and those
 * requests stay in flight: the new back-end resubmits the ones its
 * predecessor had taken (from the inflight area the driver keeps for its
 * lifetime) and takes the others from the ring; each completes normally,
 * once. Otherwise they come back with ret -ECONNRESET and the rings restart
 * empty.
 *
 * 0 or -errno (message in vhd_blkdrv_errmsg); after a failure the driver
 * stays disconnected (submits say -ENOTCONN) and reconnect may be tried
 * again; held requests stay held until a session resumes or gives them up.
 */
int vhd_blkdrv_reconnect(struct vhd_blkdrv *d);

/*
 * vhd_blkdrv_session_alive - is the session up (connected, and its socket
 * not closed by the back-end)? A non-blocking check that any thread may
 * make while the queues run; false means a reconnect is due.
 */
bool vhd_blkdrv_session_alive(const struct vhd_blkdrv *d);

/* One line describing the last control failure ("" when none). */
const char *vhd_blkdrv_errmsg(const struct vhd_blkdrv *d);

/* Negotiated parameters and device limits; valid until the next reconnect. */
const struct vhd_blkdrv_info *vhd_blkdrv_get_info(const struct vhd_blkdrv *d);

/* Device size in bytes. */
uint64_t vhd_blkdrv_capacity(const struct vhd_blkdrv *d);

/* Queue i (0 .. num_queues - 1), or NULL. */
struct vhd_blkdrv_queue *vhd_blkdrv_get_queue(struct vhd_blkdrv *d, uint32_t i);

/* Index of a queue. */
uint32_t vhd_blkdrv_queue_index(const struct vhd_blkdrv_queue *q);

/* ---- zero-copy buffers ---- */

/*
 * vhd_blkdrv_buf_alloc - len bytes (rounded up to 4 KiB, 4 KiB aligned) from
 * the queue's pool in shared memory, or NULL when the pool has no such run
 * free. Not zeroed. Only buffers inside the shared memory can be submitted
 * (any queue's pool works; the allocator itself is the owner's).
 * vhd_blkdrv_buf_free - give it back (same len).
 */
void *vhd_blkdrv_buf_alloc(struct vhd_blkdrv_queue *q, size_t len);
void vhd_blkdrv_buf_free(struct vhd_blkdrv_queue *q, void *buf, size_t len);

/* ---- submission ---- */

/*
 * Each submit makes one request available to the device; the buffers belong
 * to the device until its completion is returned. Unless the queue is
 * plugged, the request is published at once and the device kicked when it
 * asked for it (EVENT_IDX / notification suppression).
 * Returns 0, or -EAGAIN (queue full: reap completions first), -EINVAL
 * (offset/length not a multiple of 512, a range beyond what a request can
 * carry, too many segments), -EFAULT (a buffer outside the shared memory),
 * -ENOTSUP (the device did not offer FLUSH / DISCARD / WRITE_ZEROES),
 * -ENOTCONN (after a failed reconnect). Nothing is queued on failure.
 */
int vhd_blkdrv_submit_read(struct vhd_blkdrv_queue *q, uint64_t offset, void *buf, size_t len,
                           void *cookie);
int vhd_blkdrv_submit_write(struct vhd_blkdrv_queue *q, uint64_t offset, const void *buf,
                            size_t len, void *cookie);
int vhd_blkdrv_submit_readv(struct vhd_blkdrv_queue *q, uint64_t offset, const struct iovec *iov,
                            unsigned iovcnt, void *cookie);
int vhd_blkdrv_submit_writev(struct vhd_blkdrv_queue *q, uint64_t offset, const struct iovec *iov,
                             unsigned iovcnt, void *cookie);
int vhd_blkdrv_submit_flush(struct vhd_blkdrv_queue *q, void *cookie);
/* One range; len / 512 must fit 32 bits. */
int vhd_blkdrv_submit_discard(struct vhd_blkdrv_queue *q, uint64_t offset, uint64_t len,
                              void *cookie);
/* unmap: the device may deallocate the range (VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP). */
int vhd_blkdrv_submit_write_zeroes(struct vhd_blkdrv_queue *q, uint64_t offset, uint64_t len,
                                   bool unmap, void *cookie);
/*
 * The device's serial: VHD_BLKDRV_ID_BYTES are copied to id (any memory,
 * kept valid until the completion) when the request completes with ret 0.
 */
int vhd_blkdrv_submit_get_id(struct vhd_blkdrv_queue *q, char *id, void *cookie);

/*
 * vhd_blkdrv_plug / vhd_blkdrv_unplug - batch submissions: while plugged,
 * submits only queue requests; unplug publishes them with one index update
 * and at most one kick.
 */
void vhd_blkdrv_plug(struct vhd_blkdrv_queue *q);
void vhd_blkdrv_unplug(struct vhd_blkdrv_queue *q);

/* ---- completion ---- */

/*
 * vhd_blkdrv_poll - collect up to max finished requests without blocking.
 * Returns how many were stored in c (0: none yet), or -EIO when the device
 * broke the ring protocol (returned an id not in flight): the queue is
 * unusable until a reconnect.
 */
int vhd_blkdrv_poll(struct vhd_blkdrv_queue *q, struct vhd_blkdrv_completion *c, unsigned max);

/*
 * vhd_blkdrv_wait - like poll, but when nothing is finished, ask the device
 * for a used-buffer notification, check again (a completion may have
 * slipped in), and block on the call eventfd. Returns >= 1, 0 when nothing
 * is in flight, -ETIMEDOUT after timeout_ms (< 0: no limit), or -EIO.
 * Notifications are asked for only while waiting: a queue driven by poll
 * alone costs the device no eventfd writes.
 */
int vhd_blkdrv_wait(struct vhd_blkdrv_queue *q, struct vhd_blkdrv_completion *c, unsigned max,
                    int timeout_ms);

/* Requests submitted and not yet returned by poll/wait. */
unsigned vhd_blkdrv_inflight(const struct vhd_blkdrv_queue *q);

/* Counters of the queue since connect. */
void vhd_blkdrv_queue_stats(const struct vhd_blkdrv_queue *q, struct vhd_blkdrv_queue_stats *s);

/*
 * vhd_blkdrv_iommu_stats - IOTLB counters (opts.iommu_page_size): 0, or
 * -ENOTSUP when the driver is not the IOMMU. Any thread.
 */
int vhd_blkdrv_iommu_stats(struct vhd_blkdrv *d, struct vhd_blkdrv_iommu_stats *s);

#ifdef __cplusplus
}
#endif

#endif /* VHOSTD_BLK_DRIVER_H */
