/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A session's rings (vu_conn_int.h): the ring messages (SET_VRING_NUM, ADDR,
 * BASE, KICK, CALL, ERR, ENABLE, GET_VRING_BASE), the start and stop of a
 * ring in the spec's "Ring states", and the kick, call and error fds.
 */
#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include "runtime/efd.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "vu_conn_int.h"

/*
 * Finish what a restarted ring owes before it stops: the chains the inflight
 * area listed for resubmission that were not popped yet (a ring stopped
 * right after its start, or started but never enabled, which no worker
 * runs).
 *
 * Why complete them rather than answer around them. The engine placed
 * last_avail_idx after every chain in flight when the ring started
 * (inflight.c), so the base GET_VRING_BASE returns already counts these
 * chains as consumed. Only a front-end that hands the same area back would
 * find them again; one that gets only the base (a migration destination,
 * a front-end that resets the area) would lose them. A base that leaves
 * them out cannot be given either: the chains in flight need not be the
 * last ones made available (split: any heads among avail[0 .. base)), so a
 * lower base would make a back-end pop completed chains again. The spec
 * gives GET_VRING_BASE the next index to process with every request before
 * it done (QEMU's vhost-user-blk stops the device this way before a
 * migration and takes used->idx from memory; libvhost-user returns its
 * last_avail_idx as set at restart, and has this gap). So: run the ring on its worker, popping
 * only the listed chains (inf_resubmit_only), until they have completed
 * and been published like any request in flight at a stop. Then base ==
 * used position and the area holds nothing, whoever starts the ring next.
 * A disabled ring runs too: these requests were accepted before the
 * restart; no new chain is taken. Bounded by the detach timeout; on
 * failure the device is broken (NEEDS_RESET) and the area still lists them.
 */
static int queue_finish_resubmit(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    uint32_t n = vhd_vq_resubmit_pending(&q->vq);

    if (n == 0 || q->broken || q->vq.error)
        return 0;
    vhd_log(VHD_LOG_INFO, "%s: queue %u: stopping: completing %u resubmitted requests first",
            c->dev->name, q->index, n);
    q->vq.inf_resubmit_only = true;
    /* Each pass runs until a turn takes less than a budget; a device may stop short. */
    for (int pass = 0; pass < 8 && vhd_vq_resubmit_pending(&q->vq) && !q->broken && !q->vq.error;
         pass++) {
        q->worker_idx = (int)vhd_vu__queue_worker_of(c->dev, q->index);
        int rc = vhd_rt_drain(c->dev->rt, q, (unsigned)q->worker_idx, c->detach_timeout_ms);
        if (rc < 0) {
            if (!q->attached)
                q->vq.inf_resubmit_only = false;
            vhd_vu__conn_mark_broken(
                c, "a stopped ring could not complete its resubmitted requests", false);
            return rc;
        }
    }
    q->vq.inf_resubmit_only = false;
    if (vhd_vq_resubmit_pending(&q->vq) && !q->broken && !q->vq.error) {
        vhd_vu__conn_mark_broken(c, "a stopped ring could not complete its resubmitted requests",
                                 true);
        return -EIO;
    }
    return 0;
}

/*
 * Stop a started ring (GET_VRING_BASE, reset, disconnect): detach (drains
 * in-flight I/O), complete what a restart left to resubmit, save its base,
 * queue_fini, close the kick fd (the spec restarts a ring only on a new
 * kick fd).
 */
int vhd_vu__queue_stop(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    if (!q->started)
        return 0;
    int rc = vhd_vu__queue_detach(c, q);
    if (rc < 0)
        return rc;
    rc = queue_finish_resubmit(c, q);
    if (rc < 0)
        return rc;
    q->base = vhd_vq_get_base(&q->vq);
    if (c->dev->ops->queue_fini)
        c->dev->ops->queue_fini(c->dev, q);
    vhd_vq_fini(&q->vq); /* stops using the inflight area */
    q->priv = NULL;
    q->started = false;
    vhd_vu__close_fd(&q->kick_fd);
    return 0;
}

/* ---- handlers: rings ---- */

/*
 * SET_VRING_NUM: 1..32768 (virtio 1.2, 2.7 and 2.8); a power of two for split
 * rings, checked here when the layout is already negotiated and again when
 * the ring starts. Refused while the ring is started (like the kernel's
 * -EBUSY): the size of a running ring cannot change.
 */
int vhd_vu__set_vring_num(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = vhd_vu__req_queue(c, r->p->state.index);
    uint32_t num = r->p->state.num;

    if (q->started) {
        r->why = "ring is started";
        return -EBUSY;
    }
    if (num == 0 || num > VHD_VQ_MAX_SIZE) {
        r->why = "ring size out of range";
        return -EINVAL;
    }
    if (c->features_set && !vhd_vu__feature_has(c, VIRTIO_F_RING_PACKED) && (num & (num - 1))) {
        r->why = "split ring size is not a power of two";
        return -EINVAL;
    }
    q->size = num;
    return 0;
}

/*
 * SET_VRING_ADDR: front-end virtual addresses, or IOVAs when
 * VIRTIO_F_ACCESS_PLATFORM is negotiated (spec "IOMMU support"; translated
 * through the IOTLB at start). The only flag is VHOST_VRING_F_LOG (log used-ring writes at the
 * guest-physical log address), for devices that offer dirty logging.
 * Alignments that hold for both layouts are checked now (descriptors 16,
 * avail 2, used 4), the rest at ring start. While the ring is started the
 * same addresses may be sent again (QEMU does when toggling logging): the
 * log flag and address change with the ring detached; new ring addresses
 * are refused.
 */
int vhd_vu__set_vring_addr(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_vring_addr *a = &r->p->addr;
    struct vhd_queue *q = vhd_vu__req_queue(c, a->index);
    uint32_t flags_ok = c->dev->ops->dirty_log ? 1u << VHOST_VRING_F_LOG : 0;

    if (a->flags & ~flags_ok) {
        r->why = "unknown ring address flags (or VHOST_VRING_F_LOG without dirty logging)";
        return -EINVAL;
    }
    if ((a->desc & 15) || (a->avail & 1) || (a->used & 3)) {
        r->why = "misaligned ring address";
        return -EINVAL;
    }
    if (q->started) {
        if (a->desc != q->addr_desc || a->avail != q->addr_avail || a->used != q->addr_used) {
            r->why = "ring is started";
            return -EBUSY;
        }
        bool log_on = (a->flags & flags_ok) != 0;
        if (log_on == q->addr_log_on && a->log == q->addr_log)
            return 0;
        int rc = vhd_vu__queue_detach(c, q);
        if (rc < 0) {
            r->why = "the ring did not stop";
            return rc;
        }
        q->addr_log_on = log_on;
        q->addr_log = a->log;
        vhd_vu__queue_apply_log(c, q);
        (void)vhd_vu__queue_sync(c, q);
        return 0;
    }
    q->addr_desc = a->desc;
    q->addr_avail = a->avail;
    q->addr_used = a->used;
    q->addr_log = a->log;
    q->addr_log_on = (a->flags & flags_ok) != 0;
    q->have_addr = true;
    return 0;
}

/*
 * SET_VRING_BASE: split: bits 0-15 the next avail index, bits 16-31
 * reserved; packed: both indices and wrap counters (checked against the ring
 * size at start). Refused while started.
 */
int vhd_vu__set_vring_base(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = vhd_vu__req_queue(c, r->p->state.index);
    uint32_t num = r->p->state.num;

    if (q->started) {
        r->why = "ring is started";
        return -EBUSY;
    }
    if (c->features_set && !vhd_vu__feature_has(c, VIRTIO_F_RING_PACKED) && num > 0xffff) {
        r->why = "split ring base above 16 bits";
        return -EINVAL;
    }
    q->base = num;
    return 0;
}

/*
 * GET_VRING_BASE stops the ring: it is detached (its in-flight requests
 * complete and are pushed first), its state read, queue_fini called. A ring
 * that is not started answers the base it would start from. The request's
 * num field is reserved (must be 0) and ignored.
 */
int vhd_vu__get_vring_base(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = vhd_vu__req_queue(c, r->p->state.index);

    int rc = vhd_vu__queue_stop(c, q);
    if (rc < 0) {
        r->why = "the ring did not stop";
        return rc;
    }
    r->reply.state.index = r->p->state.index;
    r->reply.state.num = q->base;
    r->reply_size = sizeof(struct vu_vring_state);
    return 0;
}

/*
 * Point q's engine at its region of the inflight area: region i of the
 * layout the features chose, at i * vhd_inflight_queue_size(). A ring
 * without a region (index beyond the area's num_queues, or an area too small
 * for the packed layout) is refused: it would run with no crash protection.
 */
static int queue_set_inflight(struct vhd_vu_conn *c, struct vu_req *r, struct vhd_queue *q)
{
    uint64_t stride = vhd_inflight_queue_size(q->vq.packed, c->inflight_queue_size);

    if (q->index >= c->inflight_num_queues ||
        (uint64_t)(q->index + 1) * stride > c->inflight_size) {
        r->why = "the inflight area has no region for this ring";
        return -EINVAL;
    }
    int rc = vhd_vq_set_inflight(&q->vq, (uint8_t *)c->inflight + (uint64_t)q->index * stride,
                                 c->inflight_queue_size);
    if (rc < 0)
        r->why = "bad inflight queue size";
    return rc;
}

/*
 * Start q (spec "Ring states": started by SET_VRING_KICK): needs a memory
 * table, SET_VRING_NUM, SET_VRING_ADDR and SET_FEATURES first. A ring outside
 * guest memory (or misaligned, or a bad base) is an error and breaks the
 * device (NEEDS_RESET).
 */
static int queue_start(struct vhd_vu_conn *c, struct vu_req *r, struct vhd_queue *q)
{
    struct vhd_dev *dev = c->dev;

    if (!dev->mem) {
        r->why = "ring started before SET_MEM_TABLE";
        return -EPROTO;
    }
    if (!c->features_set) {
        r->why = "ring started before SET_FEATURES";
        return -EPROTO;
    }
    if (q->size == 0 || !q->have_addr) {
        r->why = "ring started before SET_VRING_NUM/SET_VRING_ADDR";
        return -EPROTO;
    }
    struct vhd_vq_params p = {
        .size = q->size,
        .packed = vhd_vu__feature_has(c, VIRTIO_F_RING_PACKED),
        .event_idx = vhd_vu__feature_has(c, VIRTIO_F_EVENT_IDX),
        .indirect = vhd_vu__feature_has(c, VIRTIO_F_INDIRECT_DESC),
        .in_order = vhd_vu__feature_has(c, VIRTIO_F_IN_ORDER),
        .addr_is_gpa = false,
        .desc = q->addr_desc,
        .avail = q->addr_avail,
        .used = q->addr_used,
    };
    int rc = vhd_vq_init(&q->vq, &p, dev->mem);
    if (rc < 0) {
        r->why = "bad ring size or misaligned ring";
        return rc;
    }
    vhd_vu__iotlb_queue_init(c, q);
    rc = vhd_vq_set_base(&q->vq, q->base);
    if (rc < 0) {
        r->why = "ring base out of range";
        return rc;
    }
    vhd_vu__queue_apply_log(c, q);
    if (c->inflight) {
        rc = queue_set_inflight(c, r, q);
        if (rc < 0)
            return rc;
    }
    rc = vhd_vq_start(&q->vq);
    if (rc == -EAGAIN)
        rc = 0; /* IOTLB: a ring not mapped yet; the worker maps it after the UPDATE */
    if (rc == -EBADMSG) {
        r->why = "the inflight area does not fit the ring or is corrupt";
        vhd_vu__conn_mark_broken(c, "the inflight area of a ring is corrupt", true);
        return rc;
    }
    if (rc < 0) {
        r->why = "ring outside guest memory";
        vhd_vu__conn_mark_broken(c, "a ring is outside guest memory", false);
        return rc;
    }
    q->inflight_io = 0;
    q->notify_pending = false;
    q->broken = false; /* detached: a plain store (dev.h) */
    c->err_signalled[q->index] = false;
    if (dev->ops->queue_init) {
        rc = dev->ops->queue_init(dev, q);
        if (rc < 0) {
            vhd_vq_fini(&q->vq);
            r->why = "the device could not set the queue up";
            return rc;
        }
    }
    q->started = true;
    if (c->numa_pending)
        vhd_vu__report_numa(c, true); /* the rings are resident now */
    return 0;
}

/*
 * The fd of SET_VRING_KICK/CALL/ERR (or -1: none) must be an eventfd
 * (efd.h, vhd_efd_check): a worker polls and reads kick fds, and workers and
 * the control thread write call and error fds. 0, or -EINVAL with r->why.
 */
static int ring_fd_check(struct vu_req *r, int fd, const char *why)
{
    if (fd < 0)
        return 0;
    int rc = vhd_efd_check(fd);
    if (rc < 0)
        r->why = why;
    return rc == -EBADF ? rc : rc < 0 ? -EINVAL : 0;
}

/*
 * SET_VRING_KICK: bits 0-7 index, bit 8 no fd (then the ring is polled).
 * On a stopped ring it starts the ring; on a started one it replaces the kick
 * fd (detach, swap, re-attach). A started ring runs only while enabled.
 */
int vhd_vu__set_vring_kick(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = vhd_vu__req_queue(c, r->p->u64 & VHOST_USER_VRING_IDX_MASK);
    int fd = (r->p->u64 & VHOST_USER_VRING_NOFD_MASK) ? -1 : r->fds[0];
    int rc = ring_fd_check(r, fd, "the kick fd is not an eventfd");

    if (rc < 0)
        return rc;
    if (q->started) {
        rc = vhd_vu__queue_detach(c, q);
        if (rc < 0) {
            r->why = "the ring did not stop";
            return rc;
        }
        vhd_vu__close_fd(&q->kick_fd);
        q->kick_fd = fd;
        if (fd >= 0)
            r->fds[0] = -1;
        (void)vhd_vu__queue_sync(c, q);
        return 0;
    }
    q->kick_fd = fd; /* queue_init may want to see it */
    rc = queue_start(c, r, q);
    if (rc < 0) {
        q->kick_fd = -1; /* still in r->fds: closed by the generic code */
        return rc;
    }
    if (fd >= 0)
        r->fds[0] = -1;
    vhd_log(VHD_LOG_DEBUG, "%s: queue %u started (size %u, %s)%s", c->dev->name, q->index, q->size,
            q->vq.packed ? "packed" : "split", q->enabled ? "" : ", disabled");
    if (q->vq.inf_stale)
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: queue %u: the inflight area does not describe the ring (a reset driver "
                   "with an old area?): starting from the front-end's base 0x%x, %u requests it "
                   "listed dropped",
                   c->dev->name, q->index, q->base, q->vq.inf_dropped);
    if (q->vq.inf_retaken)
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: queue %u: the inflight area is new but the front-end's base 0x%x has %u "
                   "%s in flight: taken from the ring again",
                   c->dev->name, q->index, q->base, q->vq.inf_retaken,
                   q->vq.packed ? "ring slots" : "requests");
    if (vhd_vq_resubmit_pending(&q->vq))
        vhd_log(VHD_LOG_INFO, "%s: queue %u: resubmitting %u requests in flight before a restart",
                c->dev->name, q->index, vhd_vq_resubmit_pending(&q->vq));
    (void)vhd_vu__queue_sync(c, q);
    return 0;
}

/*
 * Make a signalling fd (call, error) non-blocking. We write 1 to these
 * eventfds; a write blocks when the counter would overflow, so a front-end
 * that never reads one, or hands over one already at the maximum, would
 * stall the thread that signals (a worker serving other devices too, or the
 * control thread). Non-blocking, a full counter just drops the signal: the
 * front-end has one pending anyway. The flag belongs to the file the
 * front-end shares and it can clear it again: every write goes through
 * vhd_efd_signal, which a blocking file cannot stall either (efd.h).
 */
static void fd_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && !(fl & O_NONBLOCK))
        (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* SET_VRING_CALL: the call fd is worker-owned while attached: swap it detached. */
int vhd_vu__set_vring_call(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = vhd_vu__req_queue(c, r->p->u64 & VHOST_USER_VRING_IDX_MASK);
    int fd = (r->p->u64 & VHOST_USER_VRING_NOFD_MASK) ? -1 : r->fds[0];
    bool was_attached = q->attached;

    int rc = ring_fd_check(r, fd, "the call fd is not an eventfd");
    if (rc < 0)
        return rc;
    rc = vhd_vu__queue_detach(c, q);
    if (rc < 0) {
        r->why = "the ring did not stop";
        return rc;
    }
    vhd_vu__close_fd(&q->call_fd);
    q->call_fd = fd;
    q->call_stuck = false;
    if (fd >= 0) {
        r->fds[0] = -1;
        fd_set_nonblock(fd);
    }
    if (was_attached)
        (void)vhd_vu__queue_sync(c, q);
    return 0;
}

/* SET_VRING_ERR: kept for error signalling; control-thread state only. */
int vhd_vu__set_vring_err(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = vhd_vu__req_queue(c, r->p->u64 & VHOST_USER_VRING_IDX_MASK);
    int fd = (r->p->u64 & VHOST_USER_VRING_NOFD_MASK) ? -1 : r->fds[0];
    int rc = ring_fd_check(r, fd, "the error fd is not an eventfd");

    if (rc < 0)
        return rc;
    vhd_vu__close_fd(&q->err_fd);
    q->err_fd = fd;
    if (fd >= 0) {
        r->fds[0] = -1;
        fd_set_nonblock(fd);
    }
    return 0;
}

/*
 * SET_VRING_ENABLE: num 1 enables, 0 disables; anything else is invalid.
 * The enabled state is tracked whether or not the ring is started (spec
 * "Ring states": it comes into effect once the ring is started). A started
 * but disabled ring is not processed at all: for a block device there is
 * no "processing without side effects" (any request touches guest memory
 * or the image), so disabled rings are left untouched until enabled.
 */
int vhd_vu__set_vring_enable(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = vhd_vu__req_queue(c, r->p->state.index);
    uint32_t num = r->p->state.num;

    if (num > 1) {
        r->why = "enable value is neither 0 nor 1";
        return -EINVAL;
    }
    int rc = vhd_vu__queue_set_enabled(c, q, num == 1);
    if (rc < 0)
        r->why = num == 1 ? "the ring could not start" : "the ring did not stop";
    return rc;
}
