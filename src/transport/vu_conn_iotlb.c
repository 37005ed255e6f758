/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user "IOMMU support", device side: VHOST_USER_IOTLB_MSG (UPDATE,
 * INVALIDATE), the misses workers record (sent as BACKEND_IOTLB_MSG MISS on
 * the back-end channel, retried once answered, bounded by a timeout), and
 * the IOTLB's life with the session (created with VIRTIO_F_ACCESS_PLATFORM,
 * flushed by every memory table change). Control thread only.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "core/iotlb.h"
#include "runtime/efd.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "spec/virtio.h"
#include "ctl.h"
#include "util/clock.h"
#include "vu_conn_int.h"
#include "vu_sock.h"

/* Bounded send on the back-end channel (as CONFIG_CHANGE: the front-end reads it at once). */
#define IOTLB_SEND_TIMEOUT_MS 10

/* How often pending misses are looked at while some are pending (the timeout's grain). */
#define IOTLB_MISS_TICK_MS 100

bool vhd_vu__iotlb_on(const struct vhd_vu_conn *c)
{
    return c->iotlb != NULL && vhd_vu__feature_has(c, VIRTIO_F_ACCESS_PLATFORM);
}

int vhd_vu__iotlb_setup(struct vhd_vu_conn *c)
{
    uint32_t n = c->dev->num_queues ? c->dev->num_queues : 1;

    if (c->iotlb)
        return 0;
    c->miss_sent = calloc(n, sizeof(*c->miss_sent));
    c->miss_since = calloc(n, sizeof(*c->miss_since));
    c->miss_cleared = calloc(n, sizeof(*c->miss_cleared));
    int rc =
        c->miss_sent && c->miss_since && c->miss_cleared ? vhd_iotlb_new(n, &c->iotlb) : -ENOMEM;
    if (rc < 0) {
        free(c->miss_sent);
        free(c->miss_since);
        free(c->miss_cleared);
        c->miss_sent = NULL;
        c->miss_since = NULL;
        c->miss_cleared = NULL;
    }
    return rc;
}

/* Arm (ms > 0) or disarm the miss timer. */
static void miss_timer_arm(struct vhd_vu_conn *c, int ms)
{
    struct itimerspec its = {0};

    if (c->miss_timer_fd < 0)
        return;
    if (ms > 0) {
        its.it_value.tv_sec = ms / 1000;
        its.it_value.tv_nsec = (long)(ms % 1000) * 1000000L;
        its.it_interval = its.it_value;
    }
    (void)timerfd_settime(c->miss_timer_fd, 0, &its, NULL);
}

static void on_miss_timer(void *opaque, uint32_t events)
{
    struct vhd_vu_conn *c = opaque;
    uint64_t v;

    (void)events;
    if (read(c->miss_timer_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
        return;
    vhd_vu__iotlb_service(c);
}

void vhd_vu_conn_set_ctl(struct vhd_vu_conn *c, struct vhd_ctl *ctl)
{
    c->ctl = ctl;
}

/* The timer that bounds unanswered misses, created with the first miss sent. */
static void miss_timer_ensure(struct vhd_vu_conn *c)
{
    if (c->miss_timer_fd >= 0 || !c->ctl)
        return;
    int fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (fd < 0)
        return;
    if (vhd_ctl_add(c->ctl, fd, EPOLLIN, on_miss_timer, c, &c->miss_timer_src) < 0) {
        close(fd);
        return;
    }
    c->miss_timer_fd = fd;
}

void vhd_vu__iotlb_free(struct vhd_vu_conn *c, bool table)
{
    if (c->miss_timer_src)
        vhd_ctl_del(c->miss_timer_src);
    c->miss_timer_src = NULL;
    vhd_vu__close_fd(&c->miss_timer_fd);
    if (!table)
        return;
    vhd_iotlb_free(c->iotlb);
    c->iotlb = NULL;
    free(c->miss_sent);
    free(c->miss_since);
    free(c->miss_cleared);
    c->miss_sent = NULL;
    c->miss_since = NULL;
    c->miss_cleared = NULL;
}

/*
 * BACKEND_IOTLB_MSG MISS (no NEED_REPLY: QEMU sends nothing for an invalid
 * IOVA). A send that fails or times out may have left part of the message
 * in the channel: the channel is closed (as for CONFIG_CHANGE), so nothing
 * ever follows half a message; the misses then wait out their timeout.
 */
static int send_miss(struct vhd_vu_conn *c, uint64_t iova, uint8_t perm)
{
    struct vu_iotlb m = {.iova = iova, .perm = perm, .type = VHOST_IOTLB_MISS};
    struct vu_hdr h = {
        .request = VHOST_USER_BACKEND_IOTLB_MSG,
        .flags = VHOST_USER_VERSION,
        .size = sizeof(m),
    };

    if (c->backend_fd < 0)
        return -ENOTCONN;
    int rc = vu_send(c->backend_fd, &h, &m, NULL, 0, IOTLB_SEND_TIMEOUT_MS);
    if (rc < 0) {
        VHD_LOG_RL(
            VHD_LOG_WARN,
            "%s: cannot send an IOTLB miss to the front-end: %s; closing the back-end channel",
            c->dev->name, strerror(-rc));
        vhd_vu__close_fd(&c->backend_fd);
        return rc;
    }
    c->stat_misses_sent++;
    return 0;
}

/*
 * Does the published table translate the miss word w (vq.h: the missed
 * byte rounded down to 4 | the access) now? All 4 bytes must: the missed
 * one is among them, and answering a miss the worker would hit again would
 * have it loop.
 */
static bool miss_answered(const struct vhd_vu_conn *c, uint64_t w)
{
    struct vhd_iotlb_ent e;
    uint8_t perm = (uint8_t)(w & VHD_IOTLB_RW);
    uint64_t iova = w & ~(uint64_t)3;

    for (uint64_t a = iova; a - iova < 4; a++) {
        if (vhd_iotlb_lookup(c->iotlb->cur, a, &e) < 0 || (e.perm & perm) != perm)
            return false;
        if (a == UINT64_MAX)
            break;
    }
    return true;
}

/*
 * Look at every started queue's miss: answered ones are cleared (a
 * compare-and-swap, control path: the worker may have recorded a newer one
 * meanwhile) and the queue kicked so its worker tries again; new ones are
 * sent once (one MISS per distinct IOVA page and access while pending,
 * whichever queue asks); one pending longer than the device's timeout
 * breaks the device (NEEDS_RESET): its queues stop and every request still
 * in its rings fails with it. Never blocks beyond the bounded send.
 */
void vhd_vu__iotlb_service(struct vhd_vu_conn *c)
{
    struct vhd_dev *dev = c->dev;
    uint64_t now = vhd_now_ms();
    bool pending = false, expired = false;

    if (!vhd_vu__iotlb_on(c))
        return;
    for (uint32_t i = 0; i < dev->num_queues; i++) {
        struct vhd_queue *q = &dev->queues[i];
        uint64_t w = q->started ? vhd_load_acquire(&q->vq.iotlb_miss) : 0;
        if (!w) {
            if (!c->miss_cleared[i] || !q->started)
                c->miss_sent[i] = c->miss_cleared[i] = 0;
            continue;
        }
        /*
         * The miss cleared as answered comes back with no table change
         * since: the worker and miss_answered disagree. Clearing it again
         * would loop; it stays pending, its timeout running since it was sent.
         */
        bool again = w == c->miss_sent[i] && c->miss_cleared[i] == c->iotlb_gen + 1;
        if (!again && miss_answered(c, w)) {
            uint64_t want = w;
            if (__atomic_compare_exchange_n(&q->vq.iotlb_miss, &want, 0, false, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE)) {
                if (c->miss_sent[i] == w) /* it keeps miss_since should it come back */
                    c->miss_cleared[i] = c->iotlb_gen + 1;
                else
                    c->miss_sent[i] = c->miss_cleared[i] = 0;
                if (q->kick_fd >= 0)
                    (void)vhd_efd_signal(q->kick_fd); /* its worker pops again */
                continue;
            }
            w = want; /* a newer miss */
        }
        pending = true;
        if (w == c->miss_sent[i] && (again || !c->miss_cleared[i])) {
            if (now - c->miss_since[i] > c->iotlb_miss_timeout_ms)
                expired = true;
            continue;
        }
        bool dup = false;
        for (uint32_t j = 0; j < dev->num_queues && !dup; j++)
            dup = j != i && c->miss_sent[j] == w && !c->miss_cleared[j];
        vhd_log(VHD_LOG_DEBUG, "%s: queue %u: IOTLB miss at 0x%llx perm %u%s", dev->name, i,
                (unsigned long long)(w & ~(uint64_t)3), (unsigned)(w & VHD_IOTLB_RW),
                dup ? " (already asked)" : "");
        if (!dup)
            (void)send_miss(c, w & ~(uint64_t)3, (uint8_t)(w & VHD_IOTLB_RW));
        c->miss_sent[i] = w;
        c->miss_since[i] = now;
        c->miss_cleared[i] = 0;
    }
    if (expired) {
        vhd_vu__conn_mark_broken(c, "the front-end did not answer an IOTLB miss", true);
        (void)vhd_vu__dev_quiesce(c); /* queues stay stopped until a reset (queue_attach) */
        pending = false;
        for (uint32_t i = 0; i < dev->num_queues; i++)
            c->miss_sent[i] = c->miss_cleared[i] = 0;
    }
    if (pending)
        miss_timer_ensure(c);
    if (pending != c->miss_timer_armed) {
        miss_timer_arm(c, pending ? IOTLB_MISS_TICK_MS : 0);
        c->miss_timer_armed = pending;
    }
}

/*
 * Translations were removed (INVALIDATE, an UPDATE over mapped IOVAs) or
 * the whole table dropped (size 0): stop this device's queues (their
 * in-flight requests complete first: nothing touches the old translation
 * once this returns), drop what each queue cached of the range, free the
 * table versions no worker reads any more, resume. Other devices never
 * pause. 0 or -errno (the device is then broken: the detach timed out).
 */
static int iotlb_quiesce_drop(struct vhd_vu_conn *c, uint64_t iova, uint64_t size)
{
    struct vhd_dev *dev = c->dev;
    int rc = vhd_vu__dev_quiesce(c);

    vhd_log(VHD_LOG_DEBUG, "%s: IOTLB change: queues quiesced (rc %d)", dev->name, rc);
    if (rc == 0) {
        for (uint32_t i = 0; i < dev->num_queues; i++)
            if (dev->queues[i].started)
                vhd_vq_iotlb_invalidated(&dev->queues[i].vq, iova, size);
        (void)vhd_iotlb_reclaim(c->iotlb);
    }
    vhd_vu__dev_resume(c);
    return rc;
}

void vhd_vu__iotlb_flush(struct vhd_vu_conn *c)
{
    c->iotlb_gen++;
    if (c->iotlb)
        (void)vhd_iotlb_flush(c->iotlb);
}

/*
 * VHOST_USER_IOTLB_MSG. UPDATE: [iova, iova + size) -> front-end addresses
 * [uva, uva + size), cut at region boundaries; an UPDATE over mapped IOVAs
 * replaces them (iotlb.h). Refused (nothing changes, the ack says which
 * errno): size 0 or wrapping ranges, unknown access flags, a range outside
 * guest memory, a table that would hold more than VHD_IOTLB_MAX_ENTRIES
 * (-ENOSPC). INVALIDATE: the reply goes out once no worker and no
 * in-flight request can touch the range (iotlb_quiesce_drop); invalidating
 * what was never mapped is acked at once; size 0 invalidates everything. Always answered through
 * REPLY_ACK.
 */
int vhd_vu__iotlb_msg(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_iotlb *m = &r->p->iotlb;
    int rc;

    if (!vhd_vu__iotlb_on(c)) {
        r->why = "IOTLB message without VIRTIO_F_ACCESS_PLATFORM";
        return -EPROTO;
    }
    vhd_log(VHD_LOG_DEBUG, "%s: IOTLB %s iova 0x%llx size 0x%llx uva 0x%llx perm %u", c->dev->name,
            m->type == VHOST_IOTLB_UPDATE       ? "update"
            : m->type == VHOST_IOTLB_INVALIDATE ? "invalidate"
                                                : "?",
            (unsigned long long)m->iova, (unsigned long long)m->size, (unsigned long long)m->uva,
            m->perm);
    switch (m->type) {
    case VHOST_IOTLB_UPDATE:
        if (m->perm == 0 || (m->perm & ~VHOST_ACCESS_RW)) {
            r->why = "IOTLB update with bad access flags";
            return -EINVAL;
        }
        rc = vhd_iotlb_update(c->iotlb, c->dev->mem, m->iova, m->size, m->uva, m->perm);
        if (rc < 0) {
            r->why = rc == -EFAULT   ? "IOTLB update outside guest memory"
                     : rc == -EINVAL ? "IOTLB update with a zero or wrapping range"
                     : rc == -ENOSPC ? "IOTLB table full (VHD_IOTLB_MAX_ENTRIES entries)"
                                     : "IOTLB update failed";
            return rc;
        }
        c->stat_updates++;
        c->iotlb_gen++;
        if (rc == 1 && iotlb_quiesce_drop(c, m->iova, m->size) < 0) {
            r->why = "queues did not stop";
            return -EIO;
        }
        vhd_vu__iotlb_service(c); /* queues waiting for this one go on */
        return 0;
    case VHOST_IOTLB_INVALIDATE:
        /*
         * Size 0 is everything: QEMU's full device-IOTLB flush arrives so
         * (its 2^64-byte range wraps to 0), and Linux vhost's arithmetic
         * (last = iova + size - 1) reads it so too. Dropping more than
         * asked only costs misses.
         */
        rc = m->size == 0 ? vhd_iotlb_flush(c->iotlb)
                          : vhd_iotlb_invalidate(c->iotlb, m->iova, m->size);
        if (rc < 0) {
            r->why = "IOTLB invalidation failed";
            return rc;
        }
        c->stat_invalidates++;
        c->iotlb_gen++;
        if (rc == 1) {
            /* size 0 for vhd_vq_iotlb_invalidated means everything: a wrapping range */
            uint64_t sz = m->size == 0 || m->size - 1 > UINT64_MAX - m->iova ? 0 : m->size;
            if (iotlb_quiesce_drop(c, m->size == 0 ? 0 : m->iova, sz) < 0) {
                r->why = "queues did not stop";
                return -EIO;
            }
        }
        return 0;
    default:
        r->why = "IOTLB message of an unknown type (or MISS/ACCESS_FAIL from the front-end)";
        return -EINVAL;
    }
}

/* Queue q is about to start: translate through the IOTLB when negotiated. */
void vhd_vu__iotlb_queue_init(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    if (vhd_vu__iotlb_on(c)) {
        c->miss_sent[q->index] = 0;
        vhd_vq_set_iotlb(&q->vq, c->iotlb, q->index, vhd_rt_event_fd(c->dev->rt));
    }
}
