/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The virtio-blk device (virtio 1.2, section 5.2): features, config space,
 * and the request path — pop a chain, validate it against the spec, hand the
 * work to the block backend, write the status byte and push the used element
 * when the backend completes. Every request slot of a queue lives in a pool
 * owned by that queue's worker, so the path takes no lock. A failed backend
 * operation is reported (IOERR) or, under a stop policy (werror= / rerror=),
 * held with the queue paused until a resume retries it.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "blk.h"
#include "backend/blk_backend.h"
#include "core/race.h"
#include "util/bits.h"
#include "util/clock.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "runtime/log.h"
#include "runtime/numa.h"
#include "runtime/rt.h"
#include "spec/virtio_blk.h"
#include "util/errmsg.h"

/*
 * Feature bits that belong to the vhost-user transport rather than to the
 * device (VHOST_F_LOG_ALL 26, VHOST_USER_F_PROTOCOL_FEATURES 30): the
 * transport may pass them through SET_FEATURES; set_features tolerates them.
 */
#define BLK_TRANSPORT_BITS (BIT(26) | BIT(30))

#define HDR_SIZE ((uint32_t)sizeof(struct virtio_blk_outhdr))
#define SEG_SIZE ((uint32_t)sizeof(struct virtio_blk_discard_write_zeroes))

/* What a failed backend operation does (werror= / rerror=, blk.h). */
enum blk_err_policy {
    BLK_ERR_REPORT, /* complete with IOERR */
    BLK_ERR_STOP,   /* hold it, pause the queue until resumed */
    BLK_ERR_ENOSPC, /* stop on ENOSPC, report anything else */
};

/*
 * Pause/resume state of one queue shared between its worker and the control
 * thread. It lives with the device (not with the per-ring blk_queue), so the
 * control thread may touch it whatever the ring does. Own cache line.
 */
struct blk_qctl {
    int resume_fd;       /* eventfd, the queue's wake fd: written by vhd_blk_resume */
    uint32_t resume_req; /* bumped (release store) by the control thread for each resume */
    bool paused;         /* stored (release) by the worker when it pauses / resumes */
} vhd_cacheline_aligned;

/* The device: generic part first (container_of from struct vhd_dev). */
struct vhd_blk {
    struct vhd_dev dev;
    struct vhd_blk_backend *be;
    /*
     * 512-byte sectors, a multiple of block_sectors. vhd_blk_resize (control
     * thread) changes it with an atomic store; workers load it atomically.
     */
    uint64_t capacity;
    /*
     * Bumped (release store) by vhd_blk_resize after it lowered capacity;
     * requests are counted per epoch parity (blk_queue.in_epoch), so the
     * resize can wait for every request admitted under the old capacity
     * before the storage is cut (blk_pin).
     */
    uint32_t size_epoch;
    /*
     * A shrink waiting for requests admitted under the old capacity
     * (vhd_blk_resize_begin .. vhd_blk_resize_step). Control thread only.
     */
    struct {
        bool active;
        bool force;
        bool bumped; /* the epoch moved (the other parity drained first) */
        uint32_t e;  /* the epoch when the wait began */
        uint64_t bytes, old_cap, deadline_ns;
    } shrink;
    uint32_t block_size;      /* logical block size, bytes */
    uint32_t block_sectors;   /* block_size / 512, a power of two */
    uint32_t max_dwz_sectors; /* per discard / write-zeroes segment, a multiple of block_sectors */
    uint64_t offered;         /* feature bits offered */
    /*
     * Written by the control thread only while the queues are detached or
     * quiesced (set_features, set_config, reset), read by the workers.
     */
    uint64_t features;         /* negotiated (device and transport-independent bits) */
    uint8_t writeback;         /* config space writeback field (5.2.4) */
    uint8_t writeback_default; /* its value after reset */
    bool writethrough;         /* effective mode: writes carry RWF_DSYNC (5.2.6.2) */
    bool ro;
    bool no_split;
    uint8_t serial_len;
    char serial[VIRTIO_BLK_ID_BYTES];
    uint8_t werror, rerror; /* enum blk_err_policy; fixed at creation */
    struct blk_qctl *qctl;  /* dev.num_queues entries */
};

struct blk_queue;

/* One request slot: a popped chain and the backend operation carrying it out. */
struct blk_req {
    struct vhd_blk_io io; /* the backend operation in flight (container_of from io) */
    struct blk_queue *bq;
    struct blk_req *next_free;
    struct vhd_vq_chain chain;
    uint8_t *status;   /* the status byte: last byte of the device-writable part */
    uint32_t type;     /* VIRTIO_BLK_T_* */
    uint64_t data_len; /* IN / OUT: data bytes */
    uint16_t nseg;     /* DISCARD / WRITE_ZEROES: validated segments */
    uint16_t seg;      /* next segment to run */
    bool synced;       /* WRITE_ZEROES in writethrough mode: closing flush issued */
    uint64_t seq;      /* pop order in its queue: held requests are retried in this order */
    uint8_t ep;        /* the in_epoch slot counting it; BLK_EP_NONE: not counted (held) */
    /* Segments copied out of guest memory, then validated; fields in host order. */
    struct virtio_blk_discard_write_zeroes segs[VHD_BLK_MAX_DWZ_SEG];
    struct iovec iov[VHD_BLK_REQ_IOV];
} vhd_cacheline_aligned;

/* Per-queue state (q->priv), owned by the queue's worker while attached. */
struct blk_queue {
    struct vhd_queue *q;
    struct vhd_blk *blk;
    struct blk_req *free_list;
    struct blk_req *reqs; /* nreqs slots: one per ring entry, so a pop never lacks one */
    uint32_t nreqs;
    uint32_t nfresh; /* slots [0, nfresh) were handed out once (the rest never touched) */
    uint64_t next_seq;
    /*
     * Paused (a stop policy held a failed request): nothing is popped, the
     * ring is passive (its chains do not keep the worker awake), and failed
     * requests wait on `held` (linked through next_free, ascending seq)
     * until qc->resume_req moves past resume_seen.
     */
    bool paused;
    /*
     * The worker is letting go of the queue (queue_stop ran, queue_process
     * has not run since): a failure now is reported, not held, since
     * nothing could resume it and the detach waits for it.
     */
    bool stopping;
    uint32_t resume_seen;
    uint32_t nheld;
    struct blk_req *held;
    struct blk_qctl *qc;
    /*
     * Requests admitted (range-checked) and not yet pushed, per size epoch
     * parity, held ones excepted: written by the worker only (relaxed
     * stores), read by vhd_blk_resize (relaxed loads). pinned: the worker
     * holds one count in in_epoch[pin] while it admits requests (blk_pin).
     */
    uint32_t in_epoch[2];
    uint8_t pin;
    bool pinned;
    struct vhd_blk_queue_stats st;
} vhd_cacheline_aligned;

#define BLK_EP_NONE 2

static struct vhd_blk *to_blk(struct vhd_dev *dev)
{
    return vhd_container_of(dev, struct vhd_blk, dev);
}

static const struct vhd_blk *to_cblk(const struct vhd_dev *dev)
{
    return vhd_container_of(dev, struct vhd_blk, dev);
}

/* ---- backends ---- */

const struct vhd_blk_backend_ops *vhd_blk_backend_find(const char *name)
{
    static const struct vhd_blk_backend_ops *const all[] = {
        &vhd_blk_backend_uring, &vhd_blk_backend_null, &vhd_blk_backend_nbd, &vhd_blk_backend_rbd};
    for (size_t i = 0; i < VHD_ARRAY_SIZE(all); i++)
        if (!strcmp(all[i]->name, name))
            return all[i];
    return NULL;
}

/* ---- iovec helpers ---- */

/* Write src[0..srclen) and then zeroes over every byte of iov[0..cnt). */
static void iov_fill(const struct iovec *iov, uint32_t cnt, const void *src, size_t srclen)
{
    const uint8_t *s = src;

    for (uint32_t i = 0; i < cnt; i++) {
        size_t n = iov[i].iov_len < srclen ? iov[i].iov_len : srclen;
        memcpy(iov[i].iov_base, s, n);
        memset((uint8_t *)iov[i].iov_base + n, 0, iov[i].iov_len - n);
        s += n;
        srclen -= n;
    }
}

/*
 * The device-readable data after the header (OUT, DISCARD, WRITE_ZEROES):
 * trims the header off the front of the readable iovecs, in place, and
 * returns the first data iovec and their count. The caller checked
 * rlen >= HDR_SIZE.
 */
static uint32_t readable_data(struct blk_req *r, struct iovec **out)
{
    uint32_t nr = r->chain.nr, i = 0;
    size_t skip = HDR_SIZE;

    while (i < nr && skip >= r->iov[i].iov_len) {
        skip -= r->iov[i].iov_len;
        i++;
    }
    if (i < nr && skip) {
        r->iov[i].iov_base = (uint8_t *)r->iov[i].iov_base + skip;
        r->iov[i].iov_len -= skip;
    }
    *out = &r->iov[i];
    return nr - i;
}

/*
 * The device-writable data before the status byte (IN, GET_ID). blk_handle
 * already shortened the last writable iovec by the status byte; drop it when
 * that left it empty.
 */
static uint32_t writable_data(struct blk_req *r, struct iovec **out)
{
    uint32_t nw = r->chain.nw;
    if (nw && r->iov[r->chain.nr + nw - 1].iov_len == 0)
        nw--;
    *out = &r->iov[r->chain.nr];
    return nw;
}

/*
 * Is [sector, sector + bytes/512) a valid range (5.2.6.1)? bytes a multiple
 * of 512, inside the capacity (no overflow: compare counts, not ends), and
 * both ends aligned to the logical block size.
 */
static bool range_ok(const struct vhd_blk *blk, uint64_t sector, uint64_t bytes)
{
    uint64_t nsect = bytes >> VIRTIO_BLK_SECTOR_SHIFT;
    uint64_t mask = blk->block_sectors - 1;
    uint64_t cap = __atomic_load_n(&blk->capacity, __ATOMIC_ACQUIRE);

    if (bytes & (VIRTIO_BLK_SECTOR_SIZE - 1))
        return false;
    if (sector > cap || nsect > cap - sector)
        return false;
    return !((sector | nsect) & mask);
}

/* ---- completion ---- */

/* Give the chain back to the driver with `used` bytes written, and free the slot. */
static void blk_push(struct blk_queue *bq, struct blk_req *r, uint32_t used)
{
    struct vhd_queue *q = bq->q;
    int rc = vhd_vq_push(&q->vq, &r->chain, used);

    if (vhd_unlikely(rc < 0))
        VHD_LOG_RL(VHD_LOG_WARN, "%s: queue %u: cannot push request %u: %s", q->dev->name, q->index,
                   r->chain.id, vhd_vq_strerror(rc));
    if (vhd_likely(q->inflight_io))
        vhd_store_relaxed(&q->inflight_io, q->inflight_io - 1);
    if (vhd_likely(r->ep != BLK_EP_NONE))
        vhd_store_relaxed(&bq->in_epoch[r->ep], bq->in_epoch[r->ep] - 1);
    q->stat_requests++;
    vhd_queue_mark_used(q);
    r->next_free = bq->free_list;
    bq->free_list = r;
}

/*
 * Dirty logging (live migration): every byte this request may have written
 * into guest memory. IN and GET_ID write the data part (a failed read may
 * have written some of it: logging a page too many only re-sends it), and
 * every request writes its status byte. The rings are the engine's.
 */
static __attribute__((noinline)) void blk_log_written(struct blk_queue *bq, struct blk_req *r)
{
    struct vhd_vq *vq = &bq->q->vq;

    if (r->type == VIRTIO_BLK_T_IN || r->type == VIRTIO_BLK_T_GET_ID) {
        struct iovec *iov;
        uint32_t cnt = writable_data(r, &iov);
        vhd_vq_log_write(vq, iov, cnt, r->chain.wlen - 1u);
    }
    struct iovec st = {.iov_base = r->status, .iov_len = 1};
    vhd_vq_log_write(vq, &st, 1, 1);
}

/*
 * Complete r with a status. `used` counts the bytes written into the
 * device-writable buffers including the status byte (2.7.8: used length).
 */
/*
 * The counters vhd_blk_queue_counters reads while the queue runs: the worker
 * is their only writer (a plain load, a relaxed atomic store: a mov on x86);
 * the control thread loads them atomically.
 */
#define STAT_ADD(bq, field, n) \
    __atomic_store_n(&(bq)->st.field, (bq)->st.field + (n), __ATOMIC_RELAXED)

static void blk_complete(struct blk_queue *bq, struct blk_req *r, uint8_t status, uint32_t used)
{
    *r->status = status;
    if (vhd_unlikely(bq->q->vq.log != NULL))
        blk_log_written(bq, r);
    STAT_ADD(bq, completed, 1);
    if (status == VIRTIO_BLK_S_OK)
        bq->st.status_ok++;
    else if (status == VIRTIO_BLK_S_UNSUPP)
        bq->st.status_unsupp++;
    else
        STAT_ADD(bq, status_ioerr, 1);
    blk_push(bq, r, used);
}

/* A request the driver got wrong: one rate-limited line, then its status. */
#define BLK_REJECT(bq, r, status, ...)         \
    do {                                       \
        VHD_LOG_RL(VHD_LOG_WARN, __VA_ARGS__); \
        blk_complete((bq), (r), (status), 1);  \
    } while (0)

static const char *blk_type_name(uint32_t type)
{
    switch (type) {
    case VIRTIO_BLK_T_IN:
        return "read";
    case VIRTIO_BLK_T_OUT:
        return "write";
    case VIRTIO_BLK_T_FLUSH:
        return "flush";
    case VIRTIO_BLK_T_DISCARD:
        return "discard";
    case VIRTIO_BLK_T_WRITE_ZEROES:
        return "write-zeroes";
    default:
        return "request";
    }
}

static void blk_dwz_next(struct blk_queue *bq, struct blk_req *r);

static const char *const blk_policy_names[] = {"report", "stop", "enospc"};

/* Does failure res stop r's queue? werror: writes, flushes, discards; rerror: reads. */
static bool blk_error_stops(const struct vhd_blk *blk, const struct blk_req *r, int res)
{
    uint8_t p = r->type == VIRTIO_BLK_T_IN ? blk->rerror : blk->werror;
    return p == BLK_ERR_STOP || (p == BLK_ERR_ENOSPC && res == -ENOSPC);
}

/* Put r on the held list in pop order (the list is short: at most the ring's requests). */
static void blk_held_insert(struct blk_queue *bq, struct blk_req *r)
{
    struct blk_req **pp = &bq->held;

    while (*pp && (*pp)->seq < r->seq)
        pp = &(*pp)->next_free;
    r->next_free = *pp;
    *pp = r;
    bq->nheld++;
}

/*
 * Hold r, whose backend operation failed with res under a stop policy: it
 * keeps its slot and its io as submitted (the backend gives the iovecs back
 * unchanged), nothing is written to the guest. The first hold pauses the
 * queue: no more pops, and the ring turns passive so a ring full of chains
 * does not keep the worker spinning; one line says so (once per pause, not
 * per request). Worker.
 */
static void blk_hold(struct blk_queue *bq, struct blk_req *r, int res)
{
    const struct vhd_blk *blk = bq->blk;
    struct vhd_queue *q = bq->q;

    blk_held_insert(bq, r);
    bq->st.held++;
    /* Not counted while held: a resize need not wait for a resume (blk_retry_held re-checks). */
    vhd_store_relaxed(&bq->in_epoch[r->ep], bq->in_epoch[r->ep] - 1);
    r->ep = BLK_EP_NONE;
    if (bq->paused)
        return;
    bq->paused = true;
    bq->resume_seen = vhd_load_acquire(&bq->qc->resume_req);
    q->passive = true;
    vhd_store_release(&bq->qc->paused, true);
    /* Rate-limited as well: a front-end that restarts the ring over and over re-pauses it. */
    VHD_LOG_RL(
        VHD_LOG_ERROR,
        "%s: queue %u paused: %s at sector %llu failed: %s (%s=%s); it and the queue's later "
        "requests are held until a resume (SIGUSR2 to vhostd)",
        q->dev->name, q->index, blk_type_name(r->type),
        (unsigned long long)(r->io.offset >> VIRTIO_BLK_SECTOR_SHIFT), strerror(-res),
        r->type == VIRTIO_BLK_T_IN ? "rerror" : "werror",
        blk_policy_names[r->type == VIRTIO_BLK_T_IN ? blk->rerror : blk->werror]);
}

/* Leave the paused state (the held list is the caller's business). Worker. */
static void blk_unpause(struct blk_queue *bq)
{
    bq->paused = false;
    bq->q->passive = false;
    vhd_store_release(&bq->qc->paused, false);
}

/*
 * Pin the size epoch before admitting requests (range checks against
 * blk->capacity): one count in in_epoch[parity] while this worker admits,
 * taken before (full fence) it checks the epoch did not move, so that
 * vhd_blk_resize, which lowers capacity, bumps the epoch, fences and then
 * waits for the old parity's counts to drain, either sees this count or has
 * its new capacity seen by every range check after the pin (the two sides
 * each write, fence, then read what the other wrote). No lock and no atomic
 * read-modify-write: one fence per run of popped chains, none on idle turns.
 * Worker.
 */
static void blk_pin(struct blk_queue *bq)
{
    for (;;) {
        uint32_t e = vhd_load_acquire(&bq->blk->size_epoch);
        uint8_t i = e & 1;
        vhd_store_relaxed(&bq->in_epoch[i], bq->in_epoch[i] + 1);
        vhd_smp_mb();
        if (vhd_load_relaxed(&bq->blk->size_epoch) == e) {
            bq->pin = i;
            bq->pinned = true;
            return;
        }
        vhd_store_relaxed(&bq->in_epoch[i], bq->in_epoch[i] - 1); /* a resize ran: again */
    }
}

static void blk_unpin(struct blk_queue *bq)
{
    if (!bq->pinned)
        return;
    bq->pinned = false;
    vhd_store_relaxed(&bq->in_epoch[bq->pin], bq->in_epoch[bq->pin] - 1);
}

/* Count r as admitted under the pinned epoch (until blk_push). Worker, pinned. */
static inline void blk_admit(struct blk_queue *bq, struct blk_req *r)
{
    r->ep = bq->pin;
    vhd_store_relaxed(&bq->in_epoch[r->ep], bq->in_epoch[r->ep] + 1);
}

/* Is what held request r still has to do inside the capacity (a resize may have cut it)? */
static bool blk_held_in_range(const struct vhd_blk *blk, const struct blk_req *r)
{
    if (r->type == VIRTIO_BLK_T_DISCARD || r->type == VIRTIO_BLK_T_WRITE_ZEROES) {
        for (uint16_t i = r->seg; i < r->nseg; i++)
            if (!range_ok(blk, r->segs[i].sector,
                          (uint64_t)r->segs[i].num_sectors << VIRTIO_BLK_SECTOR_SHIFT))
                return false;
        return true;
    }
    if (r->type != VIRTIO_BLK_T_IN && r->type != VIRTIO_BLK_T_OUT)
        return true; /* FLUSH: no range */
    return range_ok(blk, r->io.offset >> VIRTIO_BLK_SECTOR_SHIFT, r->io.len);
}

/*
 * A resume arrived: submit the held requests again, in pop order, then take
 * new ones. Should one fail again under the policy the queue pauses again
 * and the ones not yet resubmitted stay held behind it. Worker.
 */
static void blk_retry_held(struct blk_queue *bq)
{
    struct blk_req *list = bq->held;
    uint32_t n = bq->nheld;

    bq->held = NULL;
    bq->nheld = 0;
    blk_unpause(bq);
    vhd_log(VHD_LOG_INFO, "%s: queue %u resumed: retrying %u held request%s", bq->q->dev->name,
            bq->q->index, n, n == 1 ? "" : "s");
    while (list && !bq->paused) {
        struct blk_req *r = list;
        list = r->next_free;
        r->next_free = NULL;
        bq->st.retried++;
        blk_admit(bq, r);
        if (vhd_unlikely(!blk_held_in_range(bq->blk, r))) {
            /* the device shrank while it was held: as if it came now (5.2.6.1) */
            VHD_LOG_RL(VHD_LOG_WARN,
                       "%s: queue %u: held %s at sector %llu is past the new capacity (%llu): "
                       "IOERR",
                       bq->q->dev->name, bq->q->index, blk_type_name(r->type),
                       (unsigned long long)(r->io.offset >> VIRTIO_BLK_SECTOR_SHIFT),
                       (unsigned long long)vhd_load_relaxed(&bq->blk->capacity));
            blk_complete(bq, r, VIRTIO_BLK_S_IOERR, 1);
            continue;
        }
        /* As first submitted (blk_submit); may complete, or be held again, before it returns. */
        vhd_blk_be_submit(bq->blk->be, bq->q->worker, &r->io);
    }
    while (list) { /* paused again: the rest stay held, in order */
        struct blk_req *r = list;
        list = r->next_free;
        blk_held_insert(bq, r);
    }
}

/* Backend completion (on the worker, possibly inline from submit). */
static void blk_io_done(struct vhd_blk_io *io, int res)
{
    struct blk_req *r = vhd_container_of(io, struct blk_req, io);
    struct blk_queue *bq = r->bq;

    if (vhd_unlikely(res < 0)) {
        bq->st.backend_errors++;
        if (blk_error_stops(bq->blk, r, res) && !bq->stopping) {
            blk_hold(bq, r, res);
            return;
        }
        /* One line per failed request would flood the log when a disk fails: rate-limited. */
        VHD_LOG_RL(VHD_LOG_ERROR, "%s: queue %u: %s at sector %llu failed: %s", bq->q->dev->name,
                   bq->q->index, blk_type_name(r->type),
                   (unsigned long long)(io->offset >> VIRTIO_BLK_SECTOR_SHIFT), strerror(-res));
        blk_complete(bq, r, VIRTIO_BLK_S_IOERR, 1);
        return;
    }
    switch (r->type) {
    case VIRTIO_BLK_T_IN:
        STAT_ADD(bq, bytes_read, r->data_len);
        /* data + status: all of the writable part (5.2.6: data then status) */
        blk_complete(bq, r, VIRTIO_BLK_S_OK, (uint32_t)r->data_len + 1);
        return;
    case VIRTIO_BLK_T_OUT:
        STAT_ADD(bq, bytes_written, r->data_len);
        blk_complete(bq, r, VIRTIO_BLK_S_OK, 1);
        return;
    case VIRTIO_BLK_T_FLUSH:
        blk_complete(bq, r, VIRTIO_BLK_S_OK, 1);
        return;
    case VIRTIO_BLK_T_DISCARD:
    case VIRTIO_BLK_T_WRITE_ZEROES:
        blk_dwz_next(bq, r);
        return;
    default:
        blk_complete(bq, r, VIRTIO_BLK_S_IOERR, 1); /* cannot happen; survive it */
        return;
    }
}

static void blk_submit(struct blk_queue *bq, struct blk_req *r, uint8_t op, uint32_t flags,
                       uint64_t offset, uint64_t len, struct iovec *iov, uint32_t iovcnt)
{
    r->io.op = op;
    r->io.flags = flags;
    r->io.offset = offset;
    r->io.len = len;
    r->io.iov = iov;
    r->io.iovcnt = iovcnt;
    r->io.complete = blk_io_done;
    r->io.owner = bq;             /* what blk_queue_stop cancels */
    VHD_RACE_POINT("blk_submit"); /* a test holds an admitted request here (test_storage) */
    /* May complete (and recycle r) before it returns: r is not touched afterwards. */
    vhd_blk_be_submit(bq->blk->be, bq->q->worker, &r->io);
}

/* ---- request types ---- */

/* VIRTIO_BLK_T_IN / VIRTIO_BLK_T_OUT (5.2.6). */
static void blk_rw(struct blk_queue *bq, struct blk_req *r, uint64_t sector, bool write)
{
    const struct vhd_blk *blk = bq->blk;
    const struct vhd_queue *q = bq->q;
    struct iovec *iov;
    uint32_t cnt;
    uint64_t len;

    if (write) {
        bq->st.writes++;
        cnt = readable_data(r, &iov);
        len = r->chain.rlen - HDR_SIZE;
    } else {
        bq->st.reads++;
        cnt = writable_data(r, &iov);
        len = r->chain.wlen - 1u;
    }
    /* 5.2.6.2: a write to a read-only device fails with IOERR and writes nothing. */
    if (write && blk->ro) {
        BLK_REJECT(bq, r, VIRTIO_BLK_S_IOERR, "%s: queue %u: write to a read-only device",
                   q->dev->name, q->index);
        return;
    }
    /* 5.2.6.1: 512-byte multiples, within capacity; and our blk_size alignment. */
    if (!range_ok(blk, sector, len)) {
        BLK_REJECT(bq, r, VIRTIO_BLK_S_IOERR,
                   "%s: queue %u: %s of %llu bytes at sector %llu: outside the capacity (%llu) "
                   "or not aligned to the %u-byte block",
                   q->dev->name, q->index, write ? "write" : "read", (unsigned long long)len,
                   (unsigned long long)sector,
                   (unsigned long long)__atomic_load_n(&blk->capacity, __ATOMIC_RELAXED),
                   blk->block_size);
        return;
    }
    /* size_max (5.2.3), when the driver accepted it. seg_max is bounded by the iovec array. */
    if (blk->features & BIT(VIRTIO_BLK_F_SIZE_MAX)) {
        for (uint32_t i = 0; i < cnt; i++) {
            if (vhd_unlikely(iov[i].iov_len > VHD_BLK_SIZE_MAX)) {
                BLK_REJECT(bq, r, VIRTIO_BLK_S_IOERR,
                           "%s: queue %u: segment of %zu bytes exceeds size_max %u", q->dev->name,
                           q->index, iov[i].iov_len, VHD_BLK_SIZE_MAX);
                return;
            }
        }
    }
    r->data_len = len;
    if (len == 0) {
        blk_complete(bq, r, VIRTIO_BLK_S_OK, 1);
        return;
    }
    uint32_t flags = 0;
    if (write && blk->writethrough) {
        flags = VHD_BLK_IO_F_DSYNC; /* 5.2.6.2 case 1/2: stable before completion */
        bq->st.dsync_writes++;
    }
    blk_submit(bq, r, write ? VHD_BLK_IO_WRITE : VHD_BLK_IO_READ, flags,
               sector << VIRTIO_BLK_SECTOR_SHIFT, len, iov, cnt);
}

/* VIRTIO_BLK_T_FLUSH: sector (which the driver sets to 0) and any data are ignored. */
static void blk_flush(struct blk_queue *bq, struct blk_req *r)
{
    bq->st.flushes++;
    blk_submit(bq, r, VHD_BLK_IO_FLUSH, 0, 0, 0, NULL, 0);
}

/*
 * VIRTIO_BLK_T_GET_ID: the serial, NUL-padded to 20 bytes, truncated to the
 * buffer when it is shorter (5.2.6.1 asks the driver for exactly 20); bytes
 * past 20 are zeroed too, so the whole data part is written.
 */
static void blk_get_id(struct blk_queue *bq, struct blk_req *r)
{
    const struct vhd_blk *blk = bq->blk;
    struct iovec *iov;
    uint32_t cnt = writable_data(r, &iov);
    uint32_t len = r->chain.wlen - 1u;

    bq->st.get_ids++;
    iov_fill(iov, cnt, blk->serial, blk->serial_len);
    blk_complete(bq, r, VIRTIO_BLK_S_OK, len + 1);
}

/* Run the next non-empty segment; after the last, the closing flush or the status. */
static void blk_dwz_next(struct blk_queue *bq, struct blk_req *r)
{
    const struct vhd_blk *blk = bq->blk;
    bool wz = r->type == VIRTIO_BLK_T_WRITE_ZEROES;

    while (r->seg < r->nseg && r->segs[r->seg].num_sectors == 0)
        r->seg++;
    if (r->seg < r->nseg) {
        const struct virtio_blk_discard_write_zeroes *s = &r->segs[r->seg++];
        uint32_t flags =
            (wz && (s->flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP)) ? VHD_BLK_IO_F_UNMAP : 0;
        blk_submit(bq, r, wz ? VHD_BLK_IO_WRITE_ZEROES : VHD_BLK_IO_DISCARD, flags,
                   s->sector << VIRTIO_BLK_SECTOR_SHIFT,
                   (uint64_t)s->num_sectors << VIRTIO_BLK_SECTOR_SHIFT, NULL, 0);
        return;
    }
    /*
     * Write zeroes is a write: in writethrough mode it is stable when it
     * completes (5.2.6.2), and fallocate / buffered zero-writing is not
     * until fdatasync. Discard needs nothing: its data is undefined anyway.
     */
    if (wz && blk->writethrough && !r->synced) {
        r->synced = true;
        blk_submit(bq, r, VHD_BLK_IO_FLUSH, 0, 0, 0, NULL, 0);
        return;
    }
    blk_complete(bq, r, VIRTIO_BLK_S_OK, 1);
}

/*
 * VIRTIO_BLK_T_DISCARD / VIRTIO_BLK_T_WRITE_ZEROES (5.2.6): one or more
 * 16-byte segments. All segments are copied out and validated before any is
 * run, so a rejected request changes nothing.
 *   - feature not negotiated, more than VHD_BLK_MAX_DWZ_SEG segments, an
 *     unknown flag, or unmap on a discard: UNSUPP (5.2.6.2 MUST for flags;
 *     QEMU answers UNSUPP for too many segments too);
 *   - no segment, a length not a multiple of 16 (5.2.6.1), a read-only
 *     device, a range outside the capacity or misaligned, or more sectors
 *     than max_*_sectors: IOERR.
 */
static void blk_dwz(struct blk_queue *bq, struct blk_req *r)
{
    const struct vhd_blk *blk = bq->blk;
    const struct vhd_queue *q = bq->q;
    bool wz = r->type == VIRTIO_BLK_T_WRITE_ZEROES;
    const char *what = wz ? "write-zeroes" : "discard";
    uint32_t len = r->chain.rlen - HDR_SIZE;
    struct iovec *iov;
    uint32_t cnt;

    if (wz)
        bq->st.write_zeroes++;
    else
        bq->st.discards++;
    if (!(blk->features & BIT(wz ? VIRTIO_BLK_F_WRITE_ZEROES : VIRTIO_BLK_F_DISCARD))) {
        BLK_REJECT(bq, r, VIRTIO_BLK_S_UNSUPP, "%s: queue %u: %s without the feature", q->dev->name,
                   q->index, what);
        return;
    }
    if (len == 0 || len % SEG_SIZE) {
        BLK_REJECT(bq, r, VIRTIO_BLK_S_IOERR,
                   "%s: queue %u: %s data of %u bytes is not a whole number of segments",
                   q->dev->name, q->index, what, len);
        return;
    }
    if (len / SEG_SIZE > VHD_BLK_MAX_DWZ_SEG) {
        BLK_REJECT(bq, r, VIRTIO_BLK_S_UNSUPP, "%s: queue %u: %s with %u segments (max %u)",
                   q->dev->name, q->index, what, len / SEG_SIZE, VHD_BLK_MAX_DWZ_SEG);
        return;
    }
    r->nseg = (uint16_t)(len / SEG_SIZE);
    r->seg = 0;
    r->synced = false;
    cnt = readable_data(r, &iov);
    (void)vhd_iov_to_buf(iov, cnt, 0, r->segs, len); /* len bytes are there: rlen says so */

    uint32_t allowed = wz ? VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP : 0;
    for (uint16_t i = 0; i < r->nseg; i++) {
        struct virtio_blk_discard_write_zeroes *s = &r->segs[i];
        s->sector = vhd_le64(s->sector);
        s->num_sectors = vhd_le32(s->num_sectors);
        s->flags = vhd_le32(s->flags);
        if (s->flags & ~allowed) {
            BLK_REJECT(bq, r, VIRTIO_BLK_S_UNSUPP, "%s: queue %u: %s with flags 0x%x", q->dev->name,
                       q->index, what, s->flags);
            return;
        }
    }
    if (blk->ro) {
        BLK_REJECT(bq, r, VIRTIO_BLK_S_IOERR, "%s: queue %u: %s on a read-only device",
                   q->dev->name, q->index, what);
        return;
    }
    for (uint16_t i = 0; i < r->nseg; i++) {
        const struct virtio_blk_discard_write_zeroes *s = &r->segs[i];
        if (s->num_sectors > blk->max_dwz_sectors ||
            !range_ok(blk, s->sector, (uint64_t)s->num_sectors << VIRTIO_BLK_SECTOR_SHIFT)) {
            BLK_REJECT(bq, r, VIRTIO_BLK_S_IOERR,
                       "%s: queue %u: %s of %u sectors at sector %llu: too long, outside the "
                       "capacity or not aligned to the %u-byte block",
                       q->dev->name, q->index, what, s->num_sectors, (unsigned long long)s->sector,
                       blk->block_size);
            return;
        }
    }
    blk_dwz_next(bq, r);
}

/*
 * A chain without a device-writable byte has nowhere to put a status
 * (5.2.6: the status byte is the last byte, device-writable). It cannot be
 * completed with an error, so it is given back with used length 0 (no
 * descriptor leaks) and the queue stops: the device needs a reset (2.1.2:
 * DEVICE_NEEDS_RESET for an error state that needs a reset), as QEMU's
 * virtio-blk does with "missing headers". queue_process returns -EPROTO from
 * then on; requests already in flight still complete normally.
 */
static void blk_bad_chain(struct blk_queue *bq, struct blk_req *r)
{
    STAT_ADD(bq, bad_chains, 1);
    bq->st.broken = true;
    VHD_LOG_RL(VHD_LOG_WARN,
               "%s: queue %u: request %u has no device-writable status byte; returned "
               "unanswered, queue stopped until the device is reset",
               bq->q->dev->name, bq->q->index, r->chain.id);
    blk_push(bq, r, 0);
}

/*
 * A chain with no status byte: the last byte of the device-writable part.
 * The engine never yields empty segments, so a writable part, if any, has
 * one. Such a chain stops the queue (blk_bad_chain).
 */
static inline bool blk_chain_bad(const struct blk_req *r)
{
    uint32_t nr = r->chain.nr, nw = r->chain.nw;
    return nw == 0 || r->iov[nr + nw - 1].iov_len == 0;
}

/* Parse the chain just popped into r and start it (5.2.6). */
static void blk_handle(struct blk_queue *bq, struct blk_req *r)
{
    const struct vhd_queue *q = bq->q;
    uint32_t nr = r->chain.nr, nw = r->chain.nw;
    struct virtio_blk_outhdr hdr;

    if (vhd_unlikely(blk_chain_bad(r))) {
        blk_bad_chain(bq, r);
        return;
    }
    struct iovec *last = &r->iov[nr + nw - 1];
    r->status = (uint8_t *)last->iov_base + last->iov_len - 1;
    last->iov_len--; /* the data part (IN, GET_ID) ends before the status byte */
    r->type = UINT32_MAX;
    r->seq = bq->next_seq++;

    /* The 16-byte header, from the readable part, however it is split: copied once. */
    if (vhd_unlikely(r->chain.rlen < HDR_SIZE)) {
        BLK_REJECT(bq, r, VIRTIO_BLK_S_IOERR,
                   "%s: queue %u: request %u has a %u-byte header (16 expected)", q->dev->name,
                   q->index, r->chain.id, r->chain.rlen);
        return;
    }
    /* Straight from the first segment when it holds the header (the common layout). */
    if (vhd_likely(r->iov[0].iov_len >= HDR_SIZE))
        memcpy(&hdr, r->iov[0].iov_base, HDR_SIZE);
    else
        (void)vhd_iov_to_buf(r->iov, nr, 0, &hdr, HDR_SIZE);
    /*
     * Read once: the checks and uses below read hdr only; the empty asm says
     * it may have changed, so the compiler cannot read the guest's bytes in
     * its place (as vhd_iov_to_buf's barrier).
     */
    __asm__ volatile("" : "+m"(hdr));
    r->type = vhd_le32(hdr.type);
    uint64_t sector = vhd_le64(hdr.sector);

    switch (r->type) {
    case VIRTIO_BLK_T_IN:
        blk_rw(bq, r, sector, false);
        return;
    case VIRTIO_BLK_T_OUT:
        blk_rw(bq, r, sector, true);
        return;
    case VIRTIO_BLK_T_FLUSH:
        blk_flush(bq, r);
        return;
    case VIRTIO_BLK_T_GET_ID:
        blk_get_id(bq, r);
        return;
    case VIRTIO_BLK_T_DISCARD:
    case VIRTIO_BLK_T_WRITE_ZEROES:
        blk_dwz(bq, r);
        return;
    default:
        /* GET_LIFETIME, SECURE_ERASE, zoned, legacy SCSI / FLUSH_OUT / BARRIER bit, ... */
        BLK_REJECT(bq, r, VIRTIO_BLK_S_UNSUPP, "%s: queue %u: unsupported request type %u",
                   q->dev->name, q->index, r->type);
        return;
    }
}

/*
 * A free request slot: a recycled one, else the next never-used one. Slots
 * are set up on first use, not at queue start, so a big ring (32768 entries
 * of ~2.7 KiB) costs memory only up to the depth the driver really reaches,
 * and starting it does not fault in tens of MiB on the control thread.
 * NULL when every slot is in flight. The slot stays at the head of the free
 * list until the caller takes it.
 */
static inline struct blk_req *blk_req_get(struct blk_queue *bq)
{
    struct blk_req *r = bq->free_list;

    if (vhd_likely(r != NULL))
        return r;
    if (bq->nfresh == bq->nreqs)
        return NULL;
    r = &bq->reqs[bq->nfresh++];
    memset(r, 0, offsetof(struct blk_req, segs)); /* segs and iov are filled per request */
    r->bq = bq;
    r->next_free = NULL;
    bq->free_list = r;
    return r;
}

/* ---- vhd_dev_ops ---- */

/* Chains popped in one run (vhd_vq_pop_burstv). */
#define BLK_RUN 32u

/*
 * Pop runs of chains into free request slots and start each. Slots taken
 * for a run and not filled go back to the free list in their order. A
 * chain with no status byte stops the queue (blk_bad_chain) as when it was
 * popped alone: the chains of its run after it are given back to the ring
 * (vhd_vq_unpop, latest first, before anything of the run is pushed), so
 * the ring, the inflight area and what the driver sees are as if the queue
 * had stopped at it.
 */
static int blk_queue_process_pinned(struct blk_queue *bq, unsigned budget)
{
    struct vhd_queue *q = bq->q;
    unsigned n = 0;

    if (vhd_unlikely(bq->st.broken))
        return -EPROTO;
    if (vhd_unlikely(bq->stopping))
        bq->stopping = false; /* attached and running again */
    if (vhd_unlikely(bq->paused)) {
        /* Acquire: pairs with vhd_blk_resume's release store. */
        if (vhd_load_acquire(&bq->qc->resume_req) == bq->resume_seen)
            return 0; /* chains wait in the ring */
        blk_pin(bq);
        blk_retry_held(bq);
        if (bq->paused)
            return 0;
    }
    while (n < budget) {
        struct blk_req *rs[BLK_RUN];
        struct iovec *iovs[BLK_RUN];
        struct vhd_vq_chain *cs[BLK_RUN];
        uint32_t want = budget - n < BLK_RUN ? budget - n : BLK_RUN, got = 0;

        while (got < want) {
            struct blk_req *r = blk_req_get(bq);
            if (vhd_unlikely(!r))
                break; /* every slot in flight: the ring cannot hold another chain */
            bq->free_list = r->next_free;
            rs[got] = r;
            iovs[got] = r->iov;
            cs[got] = &r->chain;
            got++;
        }
        if (vhd_unlikely(got == 0))
            break;
        /*
         * Publish what the previous run completed inline before popping
         * again: should this pop meet a bad chain, the ring breaks and a
         * broken ring publishes nothing (vq.h: the chains before a bad one
         * complete normally). One release store per run.
         */
        if (n)
            vhd_vq_flush(&q->vq);
        int rc = vhd_vq_pop_burstv(&q->vq, iovs, VHD_BLK_REQ_IOV, cs, got);
        uint32_t popped = rc > 0 ? (uint32_t)rc : 0, last = popped;
        for (uint32_t i = 0; i < popped; i++) {
            if (vhd_unlikely(blk_chain_bad(rs[i]))) {
                last = i + 1;
                break;
            }
        }
        for (uint32_t i = popped; i-- > last;) {
            if (vhd_unlikely(vhd_vq_unpop(&q->vq, cs[i]) < 0)) {
                rc = -(int)q->vq.error; /* a device bug; the runtime logs the engine error */
                break;
            }
        }
        for (uint32_t i = got; i-- > last;) {
            rs[i]->next_free = bq->free_list;
            bq->free_list = rs[i];
        }
        if (vhd_unlikely(rc < 0)) {
            /* The engine refused the ring (sticky vq->error); the runtime logs it. */
            bq->st.broken = true;
            return rc;
        }
        if (rc == 0)
            break;
        if (!bq->pinned)
            blk_pin(bq);
        for (uint32_t i = 0; i < last; i++) {
            vhd_store_relaxed(&q->inflight_io, q->inflight_io + 1);
            blk_admit(bq, rs[i]);
            n++;
            blk_handle(bq, rs[i]);
        }
        if (vhd_unlikely(bq->st.broken))
            return -EPROTO;
        if (vhd_unlikely(bq->paused))
            break; /* a request failed inline under a stop policy: pop nothing more */
    }
    return (int)n;
}

static int blk_queue_process(struct vhd_queue *q, unsigned budget)
{
    struct blk_queue *bq = q->priv;

    if (vhd_unlikely(!bq))
        return -ENODEV;
    int rc = blk_queue_process_pinned(bq, budget);
    blk_unpin(bq);
    return rc;
}

static uint64_t blk_features(struct vhd_dev *dev)
{
    return to_blk(dev)->offered;
}

/* Writes are stable at completion unless FLUSH was negotiated and the cache is writeback. */
static void blk_update_cache_mode(struct vhd_blk *blk)
{
    blk->writethrough = !(blk->features & BIT(VIRTIO_BLK_F_FLUSH)) || !blk->writeback;
}

static int blk_set_features(struct vhd_dev *dev, uint64_t features)
{
    struct vhd_blk *blk = to_blk(dev);

    int rc = vhd_dev_check_features(dev, features, blk->offered, BLK_TRANSPORT_BITS, blk->no_split);

    if (rc)
        return rc;
    blk->features = features & blk->offered;
    dev->features = features;
    /* 5.2.5.2: CONFIG_WCE without FLUSH: writeback MUST start at 0. */
    if ((features & BIT(VIRTIO_BLK_F_CONFIG_WCE)) && !(features & BIT(VIRTIO_BLK_F_FLUSH)))
        blk->writeback = 0;
    blk_update_cache_mode(blk);
    return 0;
}

static void blk_fill_config(const struct vhd_blk *blk, struct virtio_blk_config *cfg)
{
    uint32_t pbs = blk->be->phys_block_size;
    uint8_t pexp = 0;

    while (pbs > blk->block_size && (blk->block_size << (pexp + 1)) <= pbs && pexp < 4)
        pexp++; /* physical block up to 16 logical blocks */

    memset(cfg, 0, sizeof(*cfg));
    cfg->capacity = vhd_le64(blk->capacity);
    cfg->size_max = vhd_le32(VHD_BLK_SIZE_MAX);
    cfg->seg_max = vhd_le32(VHD_BLK_SEG_MAX);
    cfg->blk_size = vhd_le32(blk->block_size);
    cfg->topology.physical_block_exp = pexp;
    cfg->topology.alignment_offset = 0;
    cfg->topology.min_io_size = vhd_le16((uint16_t)(1u << pexp)); /* one physical block */
    cfg->topology.opt_io_size = vhd_le32(0);                      /* no preference */
    cfg->writeback = blk->writeback;
    cfg->num_queues = vhd_le16((uint16_t)blk->dev.num_queues);
    cfg->max_discard_sectors = vhd_le32(blk->max_dwz_sectors);
    cfg->max_discard_seg = vhd_le32(VHD_BLK_MAX_DWZ_SEG);
    cfg->discard_sector_alignment = vhd_le32(blk->block_sectors);
    cfg->max_write_zeroes_sectors = vhd_le32(blk->max_dwz_sectors);
    cfg->max_write_zeroes_seg = vhd_le32(VHD_BLK_MAX_DWZ_SEG);
    cfg->write_zeroes_may_unmap = blk->be->zeroes_may_unmap ? 1 : 0;
}

static int blk_get_config(struct vhd_dev *dev, void *buf, uint32_t off, uint32_t len)
{
    struct virtio_blk_config cfg;

    if (off > sizeof(cfg) || len > sizeof(cfg) - off)
        return -EINVAL;
    blk_fill_config(to_blk(dev), &cfg);
    memcpy(buf, (const uint8_t *)&cfg + off, len);
    return 0;
}

/*
 * Only writeback is writable, and only with CONFIG_WCE negotiated (5.2.5);
 * any other byte is read-only: -EPERM. A non-zero value means writeback.
 * Called with the queues quiesced, so the workers see the new mode on resume.
 */
static int blk_set_config(struct vhd_dev *dev, const void *buf, uint32_t off, uint32_t len)
{
    struct vhd_blk *blk = to_blk(dev);
    const uint32_t wb = offsetof(struct virtio_blk_config, writeback);

    if (len == 0)
        return 0;
    if (off > sizeof(struct virtio_blk_config) || len > sizeof(struct virtio_blk_config) - off)
        return -EINVAL;
    if (off != wb || len != 1 || !(blk->features & BIT(VIRTIO_BLK_F_CONFIG_WCE)))
        return -EPERM;
    uint8_t v = *(const uint8_t *)buf ? 1 : 0;
    if (v != blk->writeback) /* a guest may toggle it in a loop: rate-limited */
        VHD_LOG_RL(VHD_LOG_INFO, "%s: write cache switched to %s", dev->name,
                   v ? "writeback" : "writethrough");
    blk->writeback = v;
    blk_update_cache_mode(blk);
    return 0;
}

/*
 * The worker lets go of q (dev.h queue_stop): the detach cannot wait for a
 * resume, and held requests point into guest memory that may go away with
 * it (a new memory table, a stopped ring), so they complete with IOERR, as
 * under werror=report, and so do requests still in flight that fail from
 * here on, and those the backend parked (blk_backend.h cancel). Worker.
 */
static void blk_queue_stop(struct vhd_queue *q)
{
    struct blk_queue *bq = q->priv;

    if (!bq)
        return;
    bq->stopping = true; /* requests still in flight that fail are reported */
    /*
     * Requests the backend holds back (nbd: waiting for its server to come
     * back) would keep the detach waiting until it times out: they complete
     * now with IOERR, like held ones below.
     */
    vhd_blk_be_cancel(bq->blk->be, q->worker, bq);
    if (!bq->paused)
        return;
    if (bq->nheld) /* a front-end can stop the ring at will: rate-limited */
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: queue %u stopped while paused: its %u held request%s complete with IOERR",
                   q->dev->name, q->index, bq->nheld, bq->nheld == 1 ? "" : "s");
    while (bq->held) {
        struct blk_req *r = bq->held;
        bq->held = r->next_free;
        blk_complete(bq, r, VIRTIO_BLK_S_IOERR, 1);
    }
    bq->nheld = 0;
    blk_unpause(bq);
}

/* The queue's resume doorbell (dev.h queue_wake_fd): vhd_blk_resume writes it. */
static int blk_queue_wake_fd(struct vhd_queue *q)
{
    return to_blk(q->dev)->qctl[q->index].resume_fd;
}

static void blk_queue_fini(struct vhd_dev *dev, struct vhd_queue *q)
{
    struct blk_queue *bq = q->priv;

    if (!bq)
        return;
    if (q->inflight_io) {
        /* Backend I/O may still point into the slots: leak them rather than free under it. */
        vhd_log(VHD_LOG_ERROR, "%s: queue %u finalised with %u requests in flight; leaking them",
                dev->name, q->index, q->inflight_io);
        q->priv = NULL;
        return;
    }
    free(bq->reqs);
    free(bq);
    q->priv = NULL;
}

static int blk_queue_init(struct vhd_dev *dev, struct vhd_queue *q)
{
    uint32_t n = q->vq.size ? q->vq.size : q->size;
    struct blk_queue *bq;

    if (n == 0 || n > VHD_VQ_MAX_SIZE)
        return -EINVAL;
    if (q->priv)
        blk_queue_fini(dev, q);
    bq = aligned_alloc(VHD_CACHELINE, sizeof(*bq));
    if (!bq)
        return -ENOMEM;
    memset(bq, 0, sizeof(*bq));
    /* sizeof(struct blk_req) is a multiple of the cache line: slots never share one. */
    bq->reqs = aligned_alloc(VHD_CACHELINE, (size_t)n * sizeof(struct blk_req));
    if (!bq->reqs) {
        free(bq);
        return -ENOMEM;
    }
    bq->q = q;
    bq->blk = to_blk(dev);
    bq->qc = &bq->blk->qctl[q->index];
    vhd_store_release(&bq->qc->paused, false);
    q->passive = false; /* set only while paused */
    bq->nreqs = n;      /* slots are set up on first use (blk_req_get) */
    q->priv = bq;
    return 0;
}

/* A pinned worker took q: its request slots go to the worker's node (dev.h). */
static int blk_queue_place(struct vhd_queue *q)
{
    struct blk_queue *bq = q->priv;

    if (!bq)
        return 0;
    int rc = vhd_numa_move_here(bq, sizeof(*bq));
    if (rc == 0)
        rc = vhd_numa_move_here(bq->reqs, (size_t)bq->nreqs * sizeof(struct blk_req));
    return rc;
}

static void blk_reset(struct vhd_dev *dev)
{
    struct vhd_blk *blk = to_blk(dev);
    blk->features = 0;
    blk->writeback = blk->writeback_default;
    blk_update_cache_mode(blk);
}

const struct vhd_dev_ops vhd_blk_ops = {
    .type = "blk",
    .features = blk_features,
    .set_features = blk_set_features,
    .config_size = sizeof(struct virtio_blk_config),
    .get_config = blk_get_config,
    .set_config = blk_set_config,
    .queue_init = blk_queue_init,
    .queue_place = blk_queue_place,
    .queue_fini = blk_queue_fini,
    .queue_process = blk_queue_process,
    .reset = blk_reset,
    /* Chains recorded in flight before a crash come back from vhd_vq_pop like new ones. */
    .inflight_shmfd = true,
    .dirty_log = true,
    .queue_wake_fd = blk_queue_wake_fd,
    .queue_stop = blk_queue_stop,
};

/* ---- creation ---- */

/* "report" | "stop" | "enospc" (allow_enospc) -> enum blk_err_policy; NULL: def. -1 when unknown.
 */
static int blk_parse_policy(const char *s, int def, bool allow_enospc)
{
    if (!s)
        return def;
    for (int i = 0; i < (int)VHD_ARRAY_SIZE(blk_policy_names); i++)
        if (!strcmp(s, blk_policy_names[i]) && (allow_enospc || i != BLK_ERR_ENOSPC))
            return i;
    return -1;
}

/* "auto" | "on" | "off" (NULL: auto) -> enum vhd_blk_locking; -1 when unknown. */
static int blk_parse_locking(const char *s)
{
    if (!s || !strcmp(s, "auto"))
        return VHD_BLK_LOCK_AUTO;
    if (!strcmp(s, "on"))
        return VHD_BLK_LOCK_ON;
    if (!strcmp(s, "off"))
        return VHD_BLK_LOCK_OFF;
    return -1;
}

int vhd_blk_new(const struct vhd_blk_opts *o, struct vhd_dev **out, char *err, size_t errlen)
{
    const struct vhd_blk_backend_ops *bops;
    struct vhd_blk *blk;
    uint32_t bs, nq;
    size_t serial_len;
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (!o || !out)
        return vhd_errf(err, errlen, -EINVAL, "no options");
    *out = NULL;
    bs = o->block_size ? o->block_size : VIRTIO_BLK_SECTOR_SIZE;
    if (bs < 512 || bs > 4096 || (bs & (bs - 1)))
        return vhd_errf(err, errlen, -EINVAL, "block size %u: expected a power of two in 512..4096",
                        o->block_size);
    nq = o->num_queues ? o->num_queues : 1;
    if (nq > VHD_BLK_MAX_QUEUES)
        return vhd_errf(err, errlen, -EINVAL, "%u queues: expected 1..%u", nq, VHD_BLK_MAX_QUEUES);
    serial_len = o->serial ? strlen(o->serial) : 0;
    if (serial_len > VIRTIO_BLK_ID_BYTES)
        return vhd_errf(err, errlen, -EINVAL, "serial '%s' is longer than %u bytes", o->serial,
                        VIRTIO_BLK_ID_BYTES);
    bops = vhd_blk_backend_find(o->backend ? o->backend : "uring");
    if (!bops)
        return vhd_errf(err, errlen, -EINVAL,
                        "unknown backend '%s' (expected uring, null, nbd or rbd)", o->backend);
    if (o->no_split && !o->allow_packed)
        return vhd_errf(err, errlen, -EINVAL, "split rings refused and packed rings not allowed");
    /* QEMU's defaults: a full disk pauses writes, a read error is reported. */
    int werror = blk_parse_policy(o->werror, BLK_ERR_ENOSPC, true);
    int rerror = blk_parse_policy(o->rerror, BLK_ERR_REPORT, false);
    int locking = blk_parse_locking(o->locking);
    if (werror < 0)
        return vhd_errf(err, errlen, -EINVAL, "werror=%s: expected report, stop or enospc",
                        o->werror);
    if (rerror < 0)
        return vhd_errf(err, errlen, -EINVAL, "rerror=%s: expected report or stop", o->rerror);
    if (locking < 0)
        return vhd_errf(err, errlen, -EINVAL, "locking=%s: expected auto, on or off", o->locking);

    blk = calloc(1, sizeof(*blk));
    if (!blk)
        return vhd_errf(err, errlen, -ENOMEM, "out of memory");
    blk->dev.queues = aligned_alloc(VHD_CACHELINE, (size_t)nq * sizeof(struct vhd_queue));
    if (!blk->dev.queues) {
        rc = vhd_errf(err, errlen, -ENOMEM, "out of memory");
        goto err_free;
    }
    memset(blk->dev.queues, 0, (size_t)nq * sizeof(struct vhd_queue));
    blk->dev.num_queues = nq; /* vhd_blk_free's bound for qctl (set again below) */
    blk->qctl = aligned_alloc(VHD_CACHELINE, (size_t)nq * sizeof(struct blk_qctl));
    if (!blk->qctl) {
        rc = vhd_errf(err, errlen, -ENOMEM, "out of memory");
        goto err_queues;
    }
    memset(blk->qctl, 0, (size_t)nq * sizeof(struct blk_qctl));
    for (uint32_t i = 0; i < nq; i++)
        blk->qctl[i].resume_fd = -1;
    /* Created here, with the image, before any sandbox: a ring start needs no new fd. */
    for (uint32_t i = 0; i < nq; i++) {
        blk->qctl[i].resume_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (blk->qctl[i].resume_fd < 0) {
            rc = vhd_errf(err, errlen, -errno, "eventfd: %s", strerror(errno));
            goto err_qctl;
        }
    }
    blk->werror = (uint8_t)werror;
    blk->rerror = (uint8_t)rerror;

    struct vhd_blk_backend_opts bo = {
        .image = o->image,
        .uri = o->uri,
        .size = o->size,
        .block_size = bs,
        .ro = o->ro,
        .direct = o->direct,
        .locking = (enum vhd_blk_locking)locking,
        .pool = o->pool,
        .conf = o->conf,
        .user = o->user,
        .snap = o->snap,
        .report_lost_writes = o->report_lost_writes,
    };
    rc = bops->open(&bo, &blk->be, err, errlen);
    if (rc < 0)
        goto err_qctl;
    if (blk->be->single_conn && nq > 1) {
        rc = vhd_errf(err, errlen, -EINVAL,
                      "%s serves one connection only (the NBD server does not offer multi-conn): "
                      "use queues=1",
                      blk->be->desc);
        goto err_backend;
    }
    uint64_t blocks = blk->be->size / bs;
    if (blocks == 0) {
        rc = vhd_errf(err, errlen, -EINVAL, "size %llu bytes is smaller than the block size %u",
                      (unsigned long long)blk->be->size, bs);
        goto err_backend;
    }

    snprintf(blk->dev.name, sizeof(blk->dev.name), "%s", o->name && *o->name ? o->name : "blk");
    if (blk->be->size % bs)
        vhd_log(VHD_LOG_WARN,
                "%s: the last %llu bytes of %s are not a whole %u-byte block and "
                "are not visible to the guest",
                blk->dev.name, (unsigned long long)(blk->be->size % bs), blk->be->desc, bs);
    blk->block_size = bs;
    blk->block_sectors = bs / VIRTIO_BLK_SECTOR_SIZE;
    blk->capacity = blocks * blk->block_sectors;
    blk->max_dwz_sectors = VHD_BLK_MAX_DWZ_SECTORS & ~(blk->block_sectors - 1);
    /* The backend may open read-only on its own: an NBD server's export, an RBD snapshot. */
    blk->ro = o->ro || blk->be->ro;
    blk->no_split = o->no_split;
    blk->serial_len = (uint8_t)serial_len;
    if (serial_len)
        memcpy(blk->serial, o->serial, serial_len);
    blk->writeback_default = o->writethrough ? 0 : 1;
    blk->writeback = blk->writeback_default;
    blk->offered = BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_F_INDIRECT_DESC) | BIT(VIRTIO_F_EVENT_IDX) |
                   BIT(VIRTIO_BLK_F_SIZE_MAX) | BIT(VIRTIO_BLK_F_SEG_MAX) |
                   BIT(VIRTIO_BLK_F_BLK_SIZE) | BIT(VIRTIO_BLK_F_TOPOLOGY) |
                   BIT(VIRTIO_BLK_F_FLUSH) | BIT(VIRTIO_BLK_F_CONFIG_WCE) | BIT(VIRTIO_BLK_F_MQ) |
                   BIT(VIRTIO_BLK_F_DISCARD) | BIT(VIRTIO_BLK_F_WRITE_ZEROES);
    if (blk->ro)
        blk->offered |= BIT(VIRTIO_BLK_F_RO);
    /* What the storage cannot do is not offered (nbd: what the server advertises). */
    if (blk->be->no_flush)
        blk->offered &= ~(BIT(VIRTIO_BLK_F_FLUSH) | BIT(VIRTIO_BLK_F_CONFIG_WCE));
    if (blk->be->no_discard)
        blk->offered &= ~BIT(VIRTIO_BLK_F_DISCARD);
    if (blk->be->no_write_zeroes)
        blk->offered &= ~BIT(VIRTIO_BLK_F_WRITE_ZEROES);
    if (o->allow_packed)
        blk->offered |= BIT(VIRTIO_F_RING_PACKED);
    blk_update_cache_mode(blk);

    blk->dev.ops = &vhd_blk_ops;
    blk->dev.num_queues = nq;
    blk->dev.allow_split = !o->no_split;
    blk->dev.allow_packed = o->allow_packed;
    blk->dev.priv = blk;
    for (uint32_t i = 0; i < nq; i++) {
        struct vhd_queue *q = &blk->dev.queues[i];
        q->index = (uint16_t)i;
        q->dev = &blk->dev;
        q->call_fd = -1;
        q->kick_fd = -1;
        q->err_fd = -1;
        q->worker_idx = -1;
    }
    vhd_log(VHD_LOG_INFO, "%s: virtio-blk on %s: %llu sectors, %u-byte blocks, %u queue%s%s",
            blk->dev.name, blk->be->desc, (unsigned long long)blk->capacity, bs, nq,
            nq == 1 ? "" : "s", blk->ro ? ", read-only" : "");
    *out = &blk->dev;
    return 0;

err_backend:
    blk->be->ops->close(blk->be);
err_qctl:
    for (uint32_t i = 0; i < nq; i++)
        if (blk->qctl[i].resume_fd >= 0)
            close(blk->qctl[i].resume_fd);
    free(blk->qctl);
err_queues:
    free(blk->dev.queues);
err_free:
    free(blk);
    return rc;
}

void vhd_blk_free(struct vhd_dev *dev)
{
    if (!dev)
        return;
    struct vhd_blk *blk = to_blk(dev);
    for (uint32_t i = 0; i < dev->num_queues; i++)
        blk_queue_fini(dev, &dev->queues[i]);
    if (blk->be)
        blk->be->ops->close(blk->be);
    for (uint32_t i = 0; i < dev->num_queues; i++)
        if (blk->qctl[i].resume_fd >= 0)
            close(blk->qctl[i].resume_fd);
    free(blk->qctl);
    free(dev->queue_worker);
    free(dev->queues);
    free(blk);
}

uint64_t vhd_blk_capacity(const struct vhd_dev *dev)
{
    return to_cblk(dev)->capacity;
}

/* A test's own copy (race hooks on): its held request times a shrink out sooner. */
#ifdef VHD_TEST_RACE_HOOKS
#define BLK_RESIZE_WAIT_MS 1000
#else
#define BLK_RESIZE_WAIT_MS 5000
#endif

/* Does no running queue count a request in parity p? */
static bool blk_parity_drained(const struct vhd_blk *blk, unsigned p)
{
    for (uint32_t q = 0; q < blk->dev.num_queues; q++) {
        const struct blk_queue *bq = blk->dev.queues[q].priv;
        if (bq && vhd_load_relaxed(&bq->in_epoch[p]) != 0)
            return false;
    }
    return true;
}

/* The backend's resize, then the capacity published (growing) and logged. 0 or -errno. */
static int blk_resize_apply(struct vhd_blk *blk, uint64_t bytes, bool force, uint64_t old_cap,
                            char *err, size_t errlen)
{
    uint64_t old = blk->be->size, cap = bytes >> VIRTIO_BLK_SECTOR_SHIFT;
    int rc = blk->be->ops->resize(blk->be, bytes, force, err, errlen);
    if (rc < 0) {
        __atomic_store_n(&blk->capacity, old_cap, __ATOMIC_RELEASE);
        return rc;
    }
    /* Growing: the storage is there before any request may reach it. */
    __atomic_store_n(&blk->capacity, cap, __ATOMIC_RELEASE);
    vhd_log(VHD_LOG_INFO, "%s: resized from %llu to %llu bytes (%llu sectors)", blk->dev.name,
            (unsigned long long)old, (unsigned long long)bytes, (unsigned long long)cap);
    return 0;
}

int vhd_blk_resize_begin(struct vhd_dev *dev, uint64_t bytes, bool force, char *err, size_t errlen)
{
    struct vhd_blk *blk = to_blk(dev);
    uint64_t old = blk->be->size, old_cap = blk->capacity;

    if (blk->shrink.active) {
        snprintf(err, errlen, "a shrink of this device is in progress");
        return -EBUSY;
    }
    if (bytes == 0 || bytes % blk->block_size) {
        snprintf(err, errlen, "size %llu is not a positive multiple of the %u-byte block",
                 (unsigned long long)bytes, blk->block_size);
        return -EINVAL;
    }
    if (!blk->be->ops->resize) {
        snprintf(err, errlen, "the %s backend cannot be resized", blk->be->ops->name);
        return -ENOTSUP;
    }
    if (bytes >= old)
        return blk_resize_apply(blk, bytes, force, old_cap, err, errlen);
    /*
     * Shrinking: what the backend would refuse (data past the new end, a
     * read-only image) is refused before the capacity drops, so the guest's
     * I/O past the new end goes on meanwhile; the backend's resize checks
     * again after the wait.
     */
    if (blk->be->ops->resize_check) {
        int rc = blk->be->ops->resize_check(blk->be, bytes, force, err, errlen);
        if (rc < 0)
            return rc;
    }
    /*
     * Requests past the new end are refused from now on, and those admitted
     * under the old capacity finish before the storage goes (blk_pin says
     * why none can slip past). Both epoch parities are waited for: the other
     * one first (nothing is admitted into it now; it holds what an earlier
     * shrink that timed out left, its epoch still bumped), then the epoch
     * moves and the current one drains, under one deadline. Requests held
     * by a stop policy are not waited for: their retry checks the range.
     */
    __atomic_store_n(&blk->capacity, bytes >> VIRTIO_BLK_SECTOR_SHIFT, __ATOMIC_RELEASE);
    blk->shrink.e = blk->size_epoch;
    vhd_smp_mb();
    blk->shrink.active = true;
    blk->shrink.bumped = false;
    blk->shrink.force = force;
    blk->shrink.bytes = bytes;
    blk->shrink.old_cap = old_cap;
    blk->shrink.deadline_ns = vhd_now_ns() + (uint64_t)BLK_RESIZE_WAIT_MS * 1000000;
    return vhd_blk_resize_step(dev, err, errlen);
}

int vhd_blk_resize_step(struct vhd_dev *dev, char *err, size_t errlen)
{
    struct vhd_blk *blk = to_blk(dev);
    uint32_t e = blk->shrink.e;

    if (!blk->shrink.active)
        return 0;
    if (!blk->shrink.bumped) {
        if (!blk_parity_drained(blk, (e + 1) & 1))
            goto wait;
        vhd_store_release(&blk->size_epoch, e + 1);
        vhd_smp_mb();
        blk->shrink.bumped = true;
    }
    if (!blk_parity_drained(blk, e & 1))
        goto wait;
    blk->shrink.active = false;
    return blk_resize_apply(blk, blk->shrink.bytes, blk->shrink.force, blk->shrink.old_cap, err,
                            errlen);
wait:
    if (vhd_now_ns() <= blk->shrink.deadline_ns)
        return -EINPROGRESS;
    vhd_blk_resize_cancel(dev);
    snprintf(err, errlen,
             "requests admitted before the shrink did not complete within %d ms (a slow "
             "backend?): nothing changed",
             BLK_RESIZE_WAIT_MS);
    return -ETIMEDOUT;
}

void vhd_blk_resize_cancel(struct vhd_dev *dev)
{
    struct vhd_blk *blk = to_blk(dev);

    if (!blk->shrink.active)
        return;
    blk->shrink.active = false; /* the epoch may stay bumped: the next shrink waits for both */
    __atomic_store_n(&blk->capacity, blk->shrink.old_cap, __ATOMIC_RELEASE);
}

int vhd_blk_resize(struct vhd_dev *dev, uint64_t bytes, bool force, char *err, size_t errlen)
{
    int rc = vhd_blk_resize_begin(dev, bytes, force, err, errlen);
    while (rc == -EINPROGRESS) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
        rc = vhd_blk_resize_step(dev, err, errlen);
    }
    return rc;
}

int vhd_blk_queue_counters(const struct vhd_queue *q, uint64_t *completed, uint64_t *bytes,
                           uint64_t *errors)
{
    const struct blk_queue *bq = q->priv;
    if (!bq)
        return -ENODEV;
    *completed = __atomic_load_n(&bq->st.completed, __ATOMIC_RELAXED);
    *bytes = __atomic_load_n(&bq->st.bytes_read, __ATOMIC_RELAXED) +
             __atomic_load_n(&bq->st.bytes_written, __ATOMIC_RELAXED);
    *errors = __atomic_load_n(&bq->st.status_ioerr, __ATOMIC_RELAXED) +
              __atomic_load_n(&bq->st.bad_chains, __ATOMIC_RELAXED);
    return 0;
}

int vhd_blk_queue_stats(const struct vhd_queue *q, struct vhd_blk_queue_stats *out)
{
    const struct blk_queue *bq = q->priv;
    if (!bq)
        return -ENODEV;
    *out = bq->st;
    return 0;
}

unsigned vhd_blk_paused_queues(const struct vhd_dev *dev)
{
    const struct vhd_blk *blk = to_cblk(dev);
    unsigned n = 0;

    for (uint32_t i = 0; i < dev->num_queues; i++)
        n += vhd_load_acquire(&blk->qctl[i].paused) ? 1u : 0u;
    return n;
}

int vhd_blk_resume(struct vhd_dev *dev)
{
    struct vhd_blk *blk = to_blk(dev);
    int paused = (int)vhd_blk_paused_queues(dev);

    for (uint32_t i = 0; i < dev->num_queues; i++) {
        struct blk_qctl *qc = &blk->qctl[i];
        /*
         * Only this thread writes resume_req: a plain increment published
         * with release (pairs with the worker's acquire in queue_process),
         * then the doorbell, which makes the worker run the queue. A queue
         * not attached sees the new value when it next runs.
         */
        vhd_store_release(&qc->resume_req, qc->resume_req + 1);
        if (eventfd_write(qc->resume_fd, 1) < 0)
            vhd_log(VHD_LOG_WARN, "%s: queue %u: resume doorbell: %s", dev->name, i,
                    strerror(errno));
    }
    if (paused)
        vhd_log(VHD_LOG_INFO, "%s: resume: %d paused queue%s retry their held requests", dev->name,
                paused, paused == 1 ? "" : "s");
    return paused;
}
