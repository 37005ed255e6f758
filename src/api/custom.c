/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Custom devices (include/vhostd/custom.h): a struct vhd_dev_ops that hands
 * each chain the vq engine pops to the embedder's process callback as
 * iovecs, and pushes it back with the length the embedder completes it
 * with; config space kept here; per-queue counters stored by the workers
 * with relaxed atomics so the control thread may read them at any time.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "runtime/log.h"
#include "transport/vu_conn.h"
#include "util/bits.h"
#include "util/compiler.h"

/*
 * Bits of SET_FEATURES that belong to the vhost-user transport
 * (VHOST_F_LOG_ALL 26, VHOST_USER_F_PROTOCOL_FEATURES 30), as in blk.c.
 */
#define CUSTOM_TRANSPORT_BITS (BIT(26) | BIT(30))

/* Counters of one queue: written by its worker only, read by anyone (relaxed atomics). */
struct custom_counters {
    uint64_t requests;
    uint64_t bytes;
    uint64_t errors;
} vhd_cacheline_aligned;

struct custom_dev {
    struct vhd_dev dev;
    struct vhd_device *pub; /* the public device (ops' first argument) */
    struct vhd_custom_ops ops;
    void *opaque;
    uint64_t offered;
    uint32_t max_segments;
    bool no_split;
    uint32_t config_size;
    uint8_t *config;
    struct custom_counters *ctr; /* [num_queues], the device's whole life */
};

/* Per-queue state while a ring runs (queue_init .. queue_fini). */
struct custom_queue {
    struct iovec *iov; /* [max_segments] */
};

/* One chain being handled: lives on the worker's stack during the process callback. */
struct vhd_chain {
    struct vhd_queue *q;
    struct custom_counters *ctr;
    const struct iovec *iov;
    struct vhd_vq_chain c;
    bool done;
};

static struct custom_dev *to_custom(struct vhd_dev *dev)
{
    return vhd_container_of(dev, struct custom_dev, dev);
}

static void ctr_add(uint64_t *p, uint64_t v)
{
    vhd_store_relaxed(p, vhd_load_relaxed(p) + v); /* the worker is the only writer */
}

uint32_t vhd_chain_writable(const struct vhd_chain *ch)
{
    return ch->c.wlen;
}

int vhd_chain_complete(struct vhd_chain *ch, uint32_t written)
{
    struct vhd_queue *q = ch->q;

    if (ch->done)
        return -EALREADY;
    if (written > ch->c.wlen)
        return -EINVAL;
    ch->done = true;
    /* Dirty logging (live migration): what the device wrote; the engine logs the rings. */
    vhd_vq_log_write(&q->vq, ch->iov + ch->c.nr, ch->c.nw, written);
    int rc = vhd_vq_push(&q->vq, &ch->c, written);
    if (vhd_likely(q->inflight_io))
        vhd_store_relaxed(&q->inflight_io, q->inflight_io - 1);
    q->stat_requests++;
    vhd_queue_mark_used(q);
    if (vhd_unlikely(rc < 0)) {
        VHD_LOG_RL(VHD_LOG_WARN, "%s: queue %u: cannot push chain %u: %s", q->dev->name, q->index,
                   ch->c.id, vhd_vq_strerror(rc));
        ctr_add(&ch->ctr->errors, 1);
        return -EIO;
    }
    ctr_add(&ch->ctr->requests, 1);
    ctr_add(&ch->ctr->bytes, written);
    return 0;
}

static int custom_queue_process(struct vhd_queue *q, unsigned budget)
{
    struct custom_dev *cd = to_custom(q->dev);
    struct custom_queue *cq = q->priv;
    unsigned n = 0;

    if (vhd_unlikely(!cq))
        return -ENODEV;
    while (n < budget) {
        struct vhd_chain ch = {.q = q, .ctr = &cd->ctr[q->index], .iov = cq->iov};
        int rc = vhd_vq_pop(&q->vq, cq->iov, cd->max_segments, &ch.c);
        if (rc == 0)
            break;
        if (vhd_unlikely(rc < 0))
            return rc; /* the engine refused the ring (sticky vq->error); the runtime logs it */
        vhd_store_relaxed(&q->inflight_io, q->inflight_io + 1);
        n++;
        rc = cd->ops.process(cd->pub, q->index, &ch, cq->iov, ch.c.nr, ch.c.nw, cd->opaque);
        if (vhd_unlikely(!ch.done)) {
            VHD_LOG_RL(VHD_LOG_WARN, "%s: queue %u: chain %u not completed by the device",
                       q->dev->name, q->index, ch.c.id);
            (void)vhd_chain_complete(&ch, 0);
            ctr_add(&ch.ctr->errors, 1);
        }
        if (vhd_unlikely(rc < 0)) {
            VHD_LOG_RL(VHD_LOG_WARN, "%s: queue %u: the device stopped the queue: %s", q->dev->name,
                       q->index, strerror(-rc));
            ctr_add(&ch.ctr->errors, 1);
            return rc;
        }
    }
    return (int)n;
}

static uint64_t custom_features(struct vhd_dev *dev)
{
    return to_custom(dev)->offered;
}

static int custom_set_features(struct vhd_dev *dev, uint64_t features)
{
    struct custom_dev *cd = to_custom(dev);
    int rc =
        vhd_dev_check_features(dev, features, cd->offered, CUSTOM_TRANSPORT_BITS, cd->no_split);

    if (rc)
        return rc;
    if (cd->ops.set_features) {
        rc = cd->ops.set_features(cd->pub, features, cd->opaque);
        if (rc)
            return rc < 0 ? rc : -EINVAL;
    }
    dev->features = features;
    return 0;
}

static int custom_get_config(struct vhd_dev *dev, void *buf, uint32_t off, uint32_t len)
{
    struct custom_dev *cd = to_custom(dev);

    if (off > cd->config_size || len > cd->config_size - off)
        return -EINVAL;
    memcpy(buf, cd->config + off, len);
    return 0;
}

static int custom_set_config(struct vhd_dev *dev, const void *buf, uint32_t off, uint32_t len)
{
    struct custom_dev *cd = to_custom(dev);

    if (off > cd->config_size || len > cd->config_size - off)
        return -EINVAL;
    if (!cd->ops.set_config)
        return -EPERM;
    int rc = cd->ops.set_config(cd->pub, buf, off, len, cd->opaque);
    if (rc)
        return rc < 0 ? rc : -EINVAL;
    memcpy(cd->config + off, buf, len);
    cd->pub->config_event = true; /* reported after this loop turn (api_ctx_scan) */
    return 0;
}

static void custom_queue_fini(struct vhd_dev *dev, struct vhd_queue *q)
{
    struct custom_queue *cq = q->priv;

    (void)dev;
    if (!cq)
        return;
    free(cq->iov);
    free(cq);
    q->priv = NULL;
}

static int custom_queue_init(struct vhd_dev *dev, struct vhd_queue *q)
{
    struct custom_dev *cd = to_custom(dev);
    struct custom_queue *cq;

    if (q->priv)
        custom_queue_fini(dev, q);
    cq = calloc(1, sizeof(*cq));
    if (!cq)
        return -ENOMEM;
    cq->iov = calloc(cd->max_segments, sizeof(*cq->iov));
    if (!cq->iov) {
        free(cq);
        return -ENOMEM;
    }
    q->priv = cq;
    return 0;
}

static void custom_reset(struct vhd_dev *dev)
{
    struct custom_dev *cd = to_custom(dev);

    dev->features = 0;
    if (cd->ops.reset)
        cd->ops.reset(cd->pub, cd->opaque);
}

/* config_size is per device, so the ops are too: the transport reads dev->ops->config_size. */
static const struct vhd_dev_ops custom_ops_template = {
    .type = "custom",
    .features = custom_features,
    .set_features = custom_set_features,
    .get_config = custom_get_config,
    .set_config = custom_set_config,
    .queue_init = custom_queue_init,
    .queue_fini = custom_queue_fini,
    .queue_process = custom_queue_process,
    .reset = custom_reset,
    /* Every byte the device writes is logged by vhd_chain_complete. */
    .dirty_log = true,
};

struct custom_alloc {
    struct custom_dev cd;
    struct vhd_dev_ops ops;
};

void api_custom_free(struct vhd_dev *dev)
{
    if (!dev)
        return;
    struct custom_dev *cd = to_custom(dev);
    for (uint32_t i = 0; i < dev->num_queues; i++)
        custom_queue_fini(dev, &dev->queues[i]);
    free(dev->queue_worker);
    free(dev->queues);
    free(cd->ctr);
    free(cd->config);
    free(vhd_container_of(cd, struct custom_alloc, cd));
}

int api_custom_queue_counters(const struct vhd_dev *dev, uint32_t q, struct vhd_queue_counters *out)
{
    const struct custom_dev *cd = vhd_container_of(dev, struct custom_dev, dev);

    if (q >= dev->num_queues)
        return -EINVAL;
    out->requests = vhd_load_relaxed(&cd->ctr[q].requests);
    out->bytes = vhd_load_relaxed(&cd->ctr[q].bytes);
    out->errors = vhd_load_relaxed(&cd->ctr[q].errors);
    out->drops = 0;
    return 0;
}

int vhd_custom_device_new(struct vhd_ctx *ctx, const struct vhd_custom_config *cfg,
                          struct vhd_device **out, char *err, size_t errlen)
{
    struct custom_alloc *a;
    struct vhd_device *d;
    int rc;

    if (!ctx || !cfg || !out)
        return api_fail(err, errlen, -EINVAL, "missing argument");
    if (!cfg->ops || !cfg->ops->process)
        return api_fail(err, errlen, -EINVAL, "no process callback");
    if (cfg->num_queues < 1 || cfg->num_queues > VHD_CUSTOM_MAX_QUEUES)
        return api_fail(err, errlen, -EINVAL, "num_queues %u is not in 1..%u", cfg->num_queues,
                        VHD_CUSTOM_MAX_QUEUES);
    if (cfg->config_size > VHD_CUSTOM_MAX_CONFIG)
        return api_fail(err, errlen, -EINVAL, "config_size %u is above %u", cfg->config_size,
                        VHD_CUSTOM_MAX_CONFIG);
    if (cfg->max_segments > VHD_CUSTOM_MAX_SEGMENTS)
        return api_fail(err, errlen, -EINVAL, "max_segments %u is above %u", cfg->max_segments,
                        VHD_CUSTOM_MAX_SEGMENTS);
    if (cfg->dev.no_split && !cfg->dev.allow_packed)
        return api_fail(err, errlen, -EINVAL,
                        "no_split without allow_packed leaves no ring layout");

    rc = -ENOMEM;
    d = calloc(1, sizeof(*d));
    a = calloc(1, sizeof(*a));
    if (!d || !a)
        goto free_a;
    struct custom_dev *cd = &a->cd;
    struct vhd_dev *dev = &cd->dev;
    uint32_t nq = cfg->num_queues;

    cd->config = calloc(1, cfg->config_size ? cfg->config_size : 1);
    cd->ctr = aligned_alloc(VHD_CACHELINE, nq * sizeof(*cd->ctr));
    dev->queues = aligned_alloc(VHD_CACHELINE, nq * sizeof(*dev->queues));
    if (!cd->config || !cd->ctr || !dev->queues)
        goto free_parts;
    memset(cd->ctr, 0, nq * sizeof(*cd->ctr));
    memset(dev->queues, 0, nq * sizeof(*dev->queues));
    if (cfg->config)
        memcpy(cd->config, cfg->config, cfg->config_size);
    cd->config_size = cfg->config_size;
    cd->pub = d;
    cd->ops = *cfg->ops;
    cd->opaque = cfg->dev.opaque;
    cd->max_segments = cfg->max_segments ? cfg->max_segments : VHD_CUSTOM_DEFAULT_SEGMENTS;
    cd->no_split = cfg->dev.no_split;
    cd->offered = cfg->features | BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_F_INDIRECT_DESC) |
                  BIT(VIRTIO_F_EVENT_IDX);
    if (cfg->dev.allow_packed)
        cd->offered |= BIT(VIRTIO_F_RING_PACKED);
    else
        cd->offered &= ~BIT(VIRTIO_F_RING_PACKED);

    a->ops = custom_ops_template;
    a->ops.config_size = cfg->config_size;
    dev->ops = &a->ops;
    snprintf(dev->name, sizeof(dev->name), "%s", cfg->dev.name ? cfg->dev.name : "custom");
    dev->num_queues = nq;
    dev->allow_split = !cfg->dev.no_split;
    dev->allow_packed = cfg->dev.allow_packed;
    dev->priv = cd;
    for (uint32_t i = 0; i < nq; i++) {
        struct vhd_queue *q = &dev->queues[i];
        q->index = (uint16_t)i;
        q->dev = dev;
        q->call_fd = -1;
        q->kick_fd = -1;
        q->err_fd = -1;
        q->worker_idx = -1;
    }
    rc = api_device_init(ctx, d, API_DEV_CUSTOM, dev, &cfg->dev, err, errlen);
    if (rc < 0) {
        api_custom_free(dev);
        free(d);
        return rc;
    }
    vhd_log(VHD_LOG_INFO, "%s: custom virtio device: %u queue(s), %u config bytes, features 0x%llx",
            dev->name, nq, cd->config_size, (unsigned long long)cd->offered);
    *out = d;
    return 0;

free_parts:
    free(dev->queues);
    free(cd->ctr);
    free(cd->config);
free_a:
    free(a);
    free(d);
    return api_fail(err, errlen, rc, "out of memory");
}

int vhd_custom_update_config(struct vhd_device *d, const void *buf, uint32_t off, uint32_t len)
{
    if (d->type != API_DEV_CUSTOM)
        return -ENOTSUP;
    struct custom_dev *cd = to_custom(d->dev);
    if (off > cd->config_size || len > cd->config_size - off || (len && !buf))
        return -EINVAL;
    if (len)
        memcpy(cd->config + off, buf, len);
    struct vhd_vu_conn *c = api_device_conn(d);
    if (c) {
        int rc = vhd_vu_conn_config_changed(c);
        if (rc < 0 && rc != -ENOTCONN)
            vhd_log(VHD_LOG_WARN, "%s: config change notification: %s", d->dev->name,
                    strerror(-rc));
    }
    return 0;
}
