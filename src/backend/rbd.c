/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Ceph RBD block backend: an RBD image (or one of its snapshots,
 * read-only) driven through librbd's asynchronous API, and the hand-over of
 * librbd's completions, which arrive on librbd's own threads, to the worker
 * that submitted each operation.
 *
 * Hand-over (DESIGN.md, "Foreign threads"): each worker that submits to an
 * image gets a completion channel of its own: a bounded ring of {io, result}
 * slots, a producer-side mutex and an eventfd. librbd's callback (any of its
 * threads) takes the mutex, fills the next slot, publishes the tail with a
 * release store, drops the mutex and writes the eventfd unless a wake-up is
 * already pending. The worker keeps one read of that eventfd queued on its
 * own io_uring while it has operations in flight; when the read completes
 * (the worker's normal CQE reaping) it drains the ring with acquire loads
 * and plain stores of its own head index: no lock and no atomic
 * read-modify-write on the worker's side. Cost per completion: a mutex on
 * the librbd thread, and per wake-up (not per completion: the pending flag
 * coalesces them) one eventfd write there and one io_uring read CQE plus a
 * re-armed SQE on the worker.
 *
 * A worker never has more operations in flight on its channel than the ring
 * holds (RBD_CHAN_SLOTS): beyond that, operations wait in a worker-local
 * FIFO (the backlog) and are handed to librbd as completions free slots.
 */
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "blk_backend.h"
#include "util/compiler.h"
#include "runtime/log.h"
#include "util/errmsg.h"

/* Slots per channel: the most operations one worker has at librbd per image at once. */
#define RBD_CHAN_SLOTS 1024u
/* Completions taken out of the ring before their callbacks run. */
#define RBD_DRAIN_BATCH 64u

_Static_assert((RBD_CHAN_SLOTS & (RBD_CHAN_SLOTS - 1)) == 0, "slots: a power of two");

struct rbd_slot {
    struct vhd_blk_io *io;
    int res;
};

struct rbd_be;

/* One worker's completion channel for one image. */
struct rbd_chan {
    /* ---- set once, read by everyone ---- */
    struct vhd_worker *owner;
    struct rbd_be *rb;
    struct rbd_slot *slots;
    int efd; /* blocking eventfd: io_uring reads it without EAGAIN */

    /* ---- worker only ---- */
    struct vhd_io_cb cb; /* the eventfd read's CQE */
    uint64_t efd_val;    /* the eventfd read's buffer */
    uint32_t head;       /* next slot to consume */
    uint32_t inflight;   /* handed to librbd, completion not yet consumed */
    bool armed;          /* an eventfd read is queued on the worker's ring */
    struct vhd_blk_io *backlog_head, *backlog_tail;

    /* ---- producers (librbd's threads), own cache line ---- */
    pthread_mutex_t lock vhd_cacheline_aligned; /* serialises producers only */
    uint32_t tail;                              /* release-stored under lock */
    /* Shared: set by a producer (exchange) when it writes the eventfd, cleared by the worker. */
    uint8_t wake vhd_cacheline_aligned;
};

struct rbd_be {
    struct vhd_blk_backend be; /* first: the common head */
    rados_t cluster;
    rados_ioctx_t ioctx;
    rbd_image_t image;
    bool cache; /* librbd's cache on (direct=off): writes need a flush to be durable */
    /*
     * Channels, claimed in index order by a compare-and-swap of NULL (once
     * per worker and image, at its first submit) and freed at close.
     */
    struct rbd_chan *chans[VHD_RT_MAX_WORKERS];
};

enum {
    RBD_STAGE_OP,    /* the operation itself */
    RBD_STAGE_FLUSH, /* DSYNC write with the cache on: the flush after it */
};

static struct rbd_be *to_rb(struct vhd_blk_backend *be)
{
    return vhd_container_of(be, struct rbd_be, be);
}

/* ---- open (the thread that opens the device) / close (control thread) ---- */

static int rbd_be_open(const struct vhd_blk_backend_opts *o, struct vhd_blk_backend **out,
                       char *err, size_t errlen)
{
    struct rbd_be *rb;
    rbd_image_info_t info;
    bool ro = o->ro || o->snap;
    int rc;

    if (!o->pool || !o->pool[0])
        return vhd_errf(err, errlen, -EINVAL, "the rbd backend needs pool=");
    if (!o->image || !o->image[0])
        return vhd_errf(err, errlen, -EINVAL,
                        "the rbd backend needs image= (the RBD image's name)");
    rb = calloc(1, sizeof(*rb));
    if (!rb)
        return vhd_errf(err, errlen, -ENOMEM, "out of memory");

    rc = rados_create(&rb->cluster, o->user && o->user[0] ? o->user : NULL);
    if (rc < 0) {
        rc = vhd_errf(err, errlen, rc, "rados_create(%s): %s", o->user ? o->user : "default",
                      strerror(-rc));
        goto err_free;
    }
    rc = rados_conf_read_file(rb->cluster, o->conf && o->conf[0] ? o->conf : NULL);
    if (rc < 0) {
        rc = vhd_errf(err, errlen, rc, "cannot read Ceph configuration %s: %s",
                      o->conf ? o->conf : "(default search path)", strerror(-rc));
        goto err_shutdown;
    }
    /*
     * direct=on: librbd's cache off, so a completed write is on the OSDs
     * (durable); direct=off: the cache on, and FLUSH (or a DSYNC write's
     * flush) makes writes durable. A monitor that does not answer fails the
     * open after 30 s instead of librados' default five minutes.
     */
    rb->cache = !o->direct;
    if ((rc = rados_conf_set(rb->cluster, "rbd_cache", rb->cache ? "true" : "false")) < 0 ||
        (rc = rados_conf_set(rb->cluster, "client_mount_timeout", "30")) < 0) {
        rc = vhd_errf(err, errlen, rc, "cannot set librados options: %s", strerror(-rc));
        goto err_shutdown;
    }
    rc = rados_connect(rb->cluster);
    if (rc < 0) {
        rc = vhd_errf(err, errlen, rc, "cannot connect to the Ceph cluster (%s): %s",
                      o->conf ? o->conf : "default configuration", strerror(-rc));
        goto err_shutdown;
    }
    rc = rados_ioctx_create(rb->cluster, o->pool, &rb->ioctx);
    if (rc < 0) {
        rc = vhd_errf(err, errlen, rc, "cannot open pool %s: %s", o->pool, strerror(-rc));
        goto err_shutdown;
    }
    if (ro)
        rc = rbd_open_read_only(rb->ioctx, o->image, &rb->image, o->snap);
    else
        rc = rbd_open(rb->ioctx, o->image, &rb->image, NULL);
    if (rc < 0) {
        rc = vhd_errf(err, errlen, rc, "cannot open RBD image %s/%s%s%s: %s", o->pool, o->image,
                      o->snap ? "@" : "", o->snap ? o->snap : "", strerror(-rc));
        goto err_ioctx;
    }
    rc = rbd_stat(rb->image, &info, sizeof(info));
    if (rc < 0) {
        rc = vhd_errf(err, errlen, rc, "cannot stat RBD image %s/%s: %s", o->pool, o->image,
                      strerror(-rc));
        goto err_image;
    }
    if (o->size && info.size != o->size) {
        rc = vhd_errf(
            err, errlen, -EINVAL,
            "RBD image %s/%s has %llu bytes, not the %llu requested (the rbd backend takes "
            "its size from the image)",
            o->pool, o->image, (unsigned long long)info.size, (unsigned long long)o->size);
        goto err_image;
    }
    rb->be.ops = &vhd_blk_backend_rbd;
    rb->be.size = info.size;
    rb->be.phys_block_size = 0; /* objects are megabytes: nothing useful to advertise */
    rb->be.ro = ro;
    rb->be.zeroes_may_unmap = !ro; /* write zeroes without THICK_PROVISION deallocates */
    snprintf(rb->be.desc, sizeof(rb->be.desc), "rbd %s/%s%s%s%s", o->pool, o->image,
             o->snap ? "@" : "", o->snap ? o->snap : "", rb->cache ? "" : " (cache off)");
    *out = &rb->be;
    return 0;

err_image:
    rbd_close(rb->image);
err_ioctx:
    rados_ioctx_destroy(rb->ioctx);
err_shutdown:
    rados_shutdown(rb->cluster);
err_free:
    free(rb);
    return rc;
}

static void chan_free(struct rbd_chan *c)
{
    if (c->inflight || c->armed)
        vhd_log(VHD_LOG_ERROR, "%s: closed with %u operations in flight%s (cannot happen)",
                c->rb->be.desc, c->inflight, c->armed ? " and an eventfd read queued" : "");
    pthread_mutex_destroy(&c->lock);
    close(c->efd);
    free(c->slots);
    free(c);
}

static void rbd_be_close(struct vhd_blk_backend *be)
{
    struct rbd_be *rb = to_rb(be);
    int rc;

    /* Shutdown: what librbd's cache still holds reaches the OSDs (rbd_close flushes too). */
    if (!be->ro && (rc = rbd_flush(rb->image)) < 0)
        vhd_log(VHD_LOG_ERROR, "%s: flush on close: %s", be->desc, strerror(-rc));
    rc = rbd_close(rb->image);
    if (rc < 0)
        vhd_log(VHD_LOG_ERROR, "%s: close: %s", be->desc, strerror(-rc));
    rados_ioctx_destroy(rb->ioctx);
    rados_shutdown(rb->cluster);
    /* librbd's threads are gone: no producer can touch a channel any more. */
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(rb->chans); i++)
        if (rb->chans[i])
            chan_free(rb->chans[i]);
    free(rb);
}

/* ---- the hand-over: librbd's threads (producers) ---- */

/*
 * librbd's completion callback, on one of librbd's threads (several may run
 * at once): pass the result to the submitting worker's channel. Never
 * touches io beyond reading its channel pointer: the worker owns it.
 */
static void rbd_aio_cb(rbd_completion_t comp, void *arg)
{
    struct vhd_blk_io *io = arg;
    struct rbd_chan *c = io->be_priv;
    int res = (int)rbd_aio_get_return_value(comp);

    rbd_aio_release(comp);
    pthread_mutex_lock(&c->lock);
    uint32_t t = c->tail;
    /* No overflow: the worker keeps inflight <= RBD_CHAN_SLOTS (backlog). */
    c->slots[t & (RBD_CHAN_SLOTS - 1)] = (struct rbd_slot){io, res};
    vhd_store_release(&c->tail, t + 1);
    pthread_mutex_unlock(&c->lock);
    /*
     * Wake the worker unless a wake-up is pending (it clears the flag and
     * then reads the tail: with the fences, either it sees our slot or we
     * see its clear and write).
     */
    vhd_smp_mb();
    if (__atomic_exchange_n(&c->wake, 1, __ATOMIC_SEQ_CST) == 0) {
        uint64_t one = 1;
        if (write(c->efd, &one, sizeof(one)) != sizeof(one))
            VHD_LOG_RL(VHD_LOG_ERROR, "%s: eventfd write: %s", c->rb->be.desc, strerror(errno));
    }
}

/* ---- the worker's side ---- */

static void chan_cqe(struct vhd_io_cb *cb, int res);
static void start_op(struct rbd_be *rb, struct rbd_chan *c, struct vhd_blk_io *io);

/* Queue the eventfd read on the worker's ring (worker thread). */
static void chan_arm(struct rbd_chan *c)
{
    struct io_uring_sqe *sqe = vhd_worker_get_sqe(c->owner);

    if (vhd_unlikely(!sqe)) {
        /*
         * The kernel takes no more right now (cannot happen with a sane
         * SQ): try again at the next submit or completion on this channel.
         */
        VHD_LOG_RL(VHD_LOG_WARN, "%s: no SQE for the completion eventfd; retrying", c->rb->be.desc);
        return;
    }
    io_uring_prep_read(sqe, c->efd, &c->efd_val, sizeof(c->efd_val), 0);
    io_uring_sqe_set_data(sqe, &c->cb);
    c->armed = true;
}

/* The channel of worker w for rb, created at w's first submit. NULL: out of memory. */
static struct rbd_chan *chan_get(struct rbd_be *rb, struct vhd_worker *w)
{
    struct rbd_chan *c = NULL;
    unsigned i;

    for (i = 0; i < VHD_ARRAY_SIZE(rb->chans); i++) {
        struct rbd_chan *x = vhd_load_acquire(&rb->chans[i]);
        if (!x)
            break;
        if (x->owner == w)
            return x;
    }
    c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->slots = calloc(RBD_CHAN_SLOTS, sizeof(*c->slots));
    c->efd = eventfd(0, EFD_CLOEXEC);
    if (!c->slots || c->efd < 0 || pthread_mutex_init(&c->lock, NULL) != 0) {
        VHD_LOG_RL(VHD_LOG_ERROR, "%s: cannot create a completion channel: %s", rb->be.desc,
                   c->efd < 0 ? strerror(errno) : "out of memory");
        if (c->efd >= 0)
            close(c->efd);
        free(c->slots);
        free(c);
        return NULL;
    }
    c->owner = w;
    c->rb = rb;
    c->cb.done = chan_cqe;
    /* Claim the first free index; another worker may take one meanwhile. */
    for (; i < VHD_ARRAY_SIZE(rb->chans); i++) {
        struct rbd_chan *expected = NULL;
        if (__atomic_compare_exchange_n(&rb->chans[i], &expected, c, false, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE))
            return c;
    }
    /* More workers than VHD_RT_MAX_WORKERS: cannot happen. */
    chan_free(c);
    return NULL;
}

/* Hand io to librbd (worker thread); the callback or a synchronous error completes it. */
static void issue(struct rbd_be *rb, struct rbd_chan *c, struct vhd_blk_io *io)
{
    rbd_completion_t comp;
    int rc = rbd_aio_create_completion(io, rbd_aio_cb, &comp);

    if (rc < 0) {
        io->complete(io, rc);
        return;
    }
    if (io->stage == RBD_STAGE_FLUSH) {
        rc = rbd_aio_flush(rb->image, comp);
    } else {
        switch (io->op) {
        case VHD_BLK_IO_READ:
            rc = rbd_aio_readv(rb->image, io->iov, (int)io->iovcnt, io->offset, comp);
            break;
        case VHD_BLK_IO_WRITE:
            rc = rbd_aio_writev(rb->image, io->iov, (int)io->iovcnt, io->offset, comp);
            break;
        case VHD_BLK_IO_FLUSH:
            rc = rbd_aio_flush(rb->image, comp);
            break;
        case VHD_BLK_IO_DISCARD:
            rc = rbd_aio_discard(rb->image, io->offset, io->len, comp);
            break;
        case VHD_BLK_IO_WRITE_ZEROES:
            /* Without UNMAP the range stays allocated: librbd writes real zeroes. */
            rc = rbd_aio_write_zeroes(
                rb->image, io->offset, io->len, comp,
                (io->flags & VHD_BLK_IO_F_UNMAP) ? 0 : RBD_WRITE_ZEROES_FLAG_THICK_PROVISION, 0);
            break;
        default:
            rc = -EOPNOTSUPP;
            break;
        }
    }
    if (rc < 0) {
        /* Not queued: librbd will not call back. */
        rbd_aio_release(comp);
        io->complete(io, rc);
        return;
    }
    c->inflight++;
    if (!c->armed)
        chan_arm(c);
}

/* Start io, or queue it in the backlog while the channel is full. */
static void start_op(struct rbd_be *rb, struct rbd_chan *c, struct vhd_blk_io *io)
{
    if (c->inflight >= RBD_CHAN_SLOTS || c->backlog_head) {
        io->be_next = NULL;
        if (c->backlog_tail)
            c->backlog_tail->be_next = io;
        else
            c->backlog_head = io;
        c->backlog_tail = io;
        return;
    }
    issue(rb, c, io);
}

/* One completion from librbd, on the worker: finish io or take its next stage. */
static void op_done(struct rbd_be *rb, struct rbd_chan *c, struct vhd_blk_io *io, int res)
{
    if (res < 0) {
        io->complete(io, res);
        return;
    }
    if (io->stage == RBD_STAGE_OP && io->op == VHD_BLK_IO_READ && (uint64_t)res < io->len) {
        /* Short read (past the end of an image that shrank): the rest reads as zeroes. */
        uint64_t off = (uint64_t)res;
        for (uint32_t i = 0; i < io->iovcnt; i++) {
            if (off >= io->iov[i].iov_len) {
                off -= io->iov[i].iov_len;
                continue;
            }
            memset((uint8_t *)io->iov[i].iov_base + off, 0, io->iov[i].iov_len - off);
            off = 0;
        }
    }
    if (io->stage == RBD_STAGE_OP && io->op == VHD_BLK_IO_WRITE &&
        (io->flags & VHD_BLK_IO_F_DSYNC) && rb->cache) {
        io->stage = RBD_STAGE_FLUSH;
        start_op(rb, c, io);
        return;
    }
    io->complete(io, 0);
}

/*
 * The eventfd read completed on the worker's ring: clear the wake flag,
 * take every published completion (acquire load of the tail, plain store
 * of the head), run them, hand the backlog to librbd as far as slots
 * allow, and keep a read queued while operations are in flight.
 */
static void chan_cqe(struct vhd_io_cb *cb, int res)
{
    struct rbd_chan *c = vhd_container_of(cb, struct rbd_chan, cb);
    struct rbd_be *rb = c->rb;
    struct rbd_slot batch[RBD_DRAIN_BATCH];

    c->armed = false;
    if (vhd_unlikely(res < 0 && res != -EINTR && res != -EAGAIN))
        VHD_LOG_RL(VHD_LOG_ERROR, "%s: completion eventfd read: %s", rb->be.desc, strerror(-res));
    __atomic_store_n(&c->wake, 0, __ATOMIC_SEQ_CST);
    vhd_smp_mb();
    for (;;) {
        uint32_t tail = vhd_load_acquire(&c->tail);
        uint32_t n = tail - c->head;
        if (n == 0)
            break;
        if (n > RBD_DRAIN_BATCH)
            n = RBD_DRAIN_BATCH;
        for (uint32_t i = 0; i < n; i++)
            batch[i] = c->slots[(c->head + i) & (RBD_CHAN_SLOTS - 1)];
        /* The slots are free for producers once the head moves (they only write under tail). */
        c->head += n;
        c->inflight -= n;
        for (uint32_t i = 0; i < n; i++)
            op_done(rb, c, batch[i].io, batch[i].res);
    }
    while (c->backlog_head && c->inflight < RBD_CHAN_SLOTS) {
        struct vhd_blk_io *io = c->backlog_head;
        c->backlog_head = io->be_next;
        if (!c->backlog_head)
            c->backlog_tail = NULL;
        issue(rb, c, io);
    }
    if (c->inflight && !c->armed)
        chan_arm(c);
}

static void rbd_be_submit(struct vhd_blk_backend *be, struct vhd_worker *w, struct vhd_blk_io *io)
{
    struct rbd_be *rb = to_rb(be);
    struct rbd_chan *c;

    io->be = be;
    io->worker = w;
    io->stage = RBD_STAGE_OP;
    io->be_priv = NULL;
    if (vhd_unlikely(!w)) {
        io->complete(io, -EINVAL); /* not on a worker: cannot happen; survive it */
        return;
    }
    if (io->op != VHD_BLK_IO_READ && io->op != VHD_BLK_IO_FLUSH && be->ro) {
        io->complete(io, -EROFS);
        return;
    }
    if ((io->op == VHD_BLK_IO_READ || io->op == VHD_BLK_IO_WRITE || io->op == VHD_BLK_IO_DISCARD ||
         io->op == VHD_BLK_IO_WRITE_ZEROES) &&
        io->len == 0) {
        io->complete(io, 0);
        return;
    }
    if (io->op == VHD_BLK_IO_FLUSH && be->ro) {
        io->complete(io, 0); /* nothing was written */
        return;
    }
    c = chan_get(rb, w);
    if (vhd_unlikely(!c)) {
        io->complete(io, -ENOMEM);
        return;
    }
    io->be_priv = c;
    start_op(rb, c, io);
}

const struct vhd_blk_backend_ops vhd_blk_backend_rbd = {
    .name = "rbd",
    .open = rbd_be_open,
    .close = rbd_be_close,
    .submit = rbd_be_submit,
    /* The completion channel's eventfd read. */
    .uring_ops = 1ull << IORING_OP_READ,
};
