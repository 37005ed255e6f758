/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Public devices (include/vhostd/device.h, blk.h, net.h): creation of blk and
 * net devices from their public configuration, the queue -> worker map, the
 * endpoint (a vhost-user server or client), start/stop/destroy, state,
 * counters, and the events reported to the embedder after each loop turn.
 */
#include <errno.h>
#include <limits.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "dev/blk.h"
#include "dev/net.h"
#include "runtime/log.h"
#include "transport/ctl.h"
#include "util/compiler.h"
#include "transport/vu_client.h"
#include "transport/vu_conn.h"
#include "transport/vu_server.h"
#include "transport/vu_sock.h"

_Static_assert(VHD_BLK_DEVICE_MAX_QUEUES == VHD_BLK_MAX_QUEUES, "public and blk queue limits");
_Static_assert(VHD_NET_DEVICE_MAX_PAIRS == VHD_NET_MAX_PAIRS, "public and net pair limits");
_Static_assert(VHD_ENDPOINT_MAX_IDS == VHD_VU_ACCESS_MAX_IDS, "public and transport allow-lists");

int api_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

struct vhd_vu_conn *api_device_conn(const struct vhd_device *d)
{
    if (d->cli)
        return vhd_vu_client_conn(d->cli);
    return d->srv ? vhd_vu_server_conn(d->srv) : NULL;
}

static unsigned endpoint_sessions(const struct vhd_device *d)
{
    if (d->cli)
        return vhd_vu_client_sessions(d->cli);
    return d->srv ? vhd_vu_server_sessions(d->srv) : 0;
}

/* Spread the queues over cfg's worker list, or round robin over all workers. */
static int assign_workers(struct vhd_ctx *ctx, struct vhd_dev *dev, enum api_dev_type type,
                          const struct vhd_device_config *cfg)
{
    if (type == API_DEV_NET)
        return vhd_net_assign_workers(dev, cfg->workers, cfg->nworkers, ctx->nworkers,
                                      &ctx->next_rr);
    int *map = calloc(dev->num_queues, sizeof(*map));
    if (!map)
        return -ENOMEM;
    for (uint32_t q = 0; q < dev->num_queues; q++) {
        if (cfg->nworkers)
            map[q] = cfg->workers[q % cfg->nworkers];
        else
            map[q] = (int)(ctx->next_rr++ % ctx->nworkers);
    }
    free(dev->queue_worker);
    dev->queue_worker = map;
    return 0;
}

int api_device_check(const struct vhd_ctx *ctx, const struct vhd_device_config *cfg, char *err,
                     size_t errlen)
{
    const struct vhd_endpoint *ep = &cfg->endpoint;

    if (!ep->path || !ep->path[0])
        return api_fail(err, errlen, -EINVAL, "no socket path");
    if (ep->access.nuids > VHD_ENDPOINT_MAX_IDS || ep->access.ngids > VHD_ENDPOINT_MAX_IDS)
        return api_fail(err, errlen, -EINVAL, "more than %d ids in an allow-list",
                        VHD_ENDPOINT_MAX_IDS);
    if (ep->listen_fd_set &&
        (ep->client || ep->listen_fd < 0 || ep->access.mode || ep->access.gid_set))
        return api_fail(err, errlen, -EINVAL,
                        "an inherited listening socket goes without client mode, socket mode "
                        "and socket group");
    if (cfg->nworkers && !cfg->workers)
        return api_fail(err, errlen, -EINVAL, "nworkers without a worker list");
    for (unsigned i = 0; i < cfg->nworkers; i++)
        if (cfg->workers[i] < 0 || (unsigned)cfg->workers[i] >= ctx->nworkers)
            return api_fail(err, errlen, -EINVAL, "worker %d does not exist (%u workers)",
                            cfg->workers[i], ctx->nworkers);
    return 0;
}

int api_device_init(struct vhd_ctx *ctx, struct vhd_device *d, enum api_dev_type type,
                    struct vhd_dev *dev, const struct vhd_device_config *cfg, char *err,
                    size_t errlen)
{
    const struct vhd_endpoint *ep = &cfg->endpoint;
    int rc = api_device_check(ctx, cfg, err, errlen);
    if (rc < 0)
        return rc;
    d->path = strdup(ep->path);
    if (!d->path)
        return api_fail(err, errlen, -ENOMEM, "out of memory");
    rc = assign_workers(ctx, dev, type, cfg);
    if (rc < 0) {
        free(d->path);
        d->path = NULL;
        return api_fail(err, errlen, rc, "out of memory");
    }
    d->ctx = ctx;
    d->type = type;
    d->dev = dev;
    d->client = ep->client;
    d->listen_fd = ep->listen_fd_set ? ep->listen_fd : -1;
    d->reconnect_min_ms = ep->reconnect_min_ms;
    d->reconnect_max_ms = ep->reconnect_max_ms;
    d->access = ep->access;
    d->stop_timeout_ms = cfg->stop_timeout_ms > INT_MAX ? INT_MAX : (int)cfg->stop_timeout_ms;
    d->on_event = cfg->on_event;
    d->opaque = cfg->opaque;
    dev->rt = ctx->rt;
    dev->max_mem = cfg->max_guest_mem;
    d->next = ctx->devices;
    ctx->devices = d;
    return 0;
}

void api_device_fini(struct vhd_device *d)
{
    free(d->path);
    d->path = NULL;
}

/* ---- blk ---- */

/* The blk device's options from its public configuration (pointers into cfg). */
void api_blk_opts(const struct vhd_blk_config *cfg, struct vhd_blk_opts *bo)
{
    *bo = (struct vhd_blk_opts){
        .name = cfg->dev.name,
        .image = cfg->image,
        .uri = cfg->uri,
        .backend = cfg->backend,
        .size = cfg->size,
        .ro = cfg->read_only,
        .direct = cfg->direct,
        .writethrough = cfg->writethrough,
        .serial = cfg->serial,
        .block_size = cfg->block_size,
        .num_queues = cfg->num_queues,
        .allow_packed = cfg->dev.allow_packed,
        .no_split = cfg->dev.no_split,
        .locking = cfg->locking,
        .werror = cfg->werror,
        .rerror = cfg->rerror,
        .pool = cfg->pool,
        .conf = cfg->conf,
        .user = cfg->user,
        .snap = cfg->snap,
        .report_lost_writes = cfg->report_lost_writes,
    };
}

int vhd_blk_device_new(struct vhd_ctx *ctx, const struct vhd_blk_config *cfg,
                       struct vhd_device **out, char *err, size_t errlen)
{
    struct vhd_device *d;
    struct vhd_dev *dev = NULL;

    if (!ctx || !cfg || !out)
        return api_fail(err, errlen, -EINVAL, "missing argument");
    d = calloc(1, sizeof(*d));
    if (!d)
        return api_fail(err, errlen, -ENOMEM, "out of memory");
    struct vhd_blk_opts bo;
    api_blk_opts(cfg, &bo);
    int rc = vhd_blk_new(&bo, &dev, err, errlen);
    if (rc < 0)
        goto free_d;
    rc = api_device_init(ctx, d, API_DEV_BLK, dev, &cfg->dev, err, errlen);
    if (rc < 0)
        goto free_dev;
    *out = d;
    return 0;

free_dev:
    vhd_blk_free(dev);
free_d:
    free(d);
    return rc;
}

int vhd_blk_device_resume(struct vhd_device *dev)
{
    if (!dev || dev->type != API_DEV_BLK)
        return -EINVAL;
    return vhd_blk_resume(dev->dev);
}

/* A resize done: tell the front-end (config change). */
static void resized(struct vhd_device *dev)
{
    struct vhd_vu_conn *c = api_device_conn(dev);
    if (c) {
        int rc = vhd_vu_conn_config_changed(c);
        if (rc < 0 && rc != -ENOTCONN)
            vhd_log(VHD_LOG_WARN, "%s: config change notification: %s", dev->dev->name,
                    strerror(-rc));
    }
}

int vhd_blk_device_resize(struct vhd_device *dev, uint64_t bytes, bool force, char *err,
                          size_t errlen)
{
    char sub[256] = "";
    if (!dev || dev->type != API_DEV_BLK)
        return api_fail(err, errlen, -EINVAL, "not a blk device");
    int rc = vhd_blk_resize(dev->dev, bytes, force, sub, sizeof(sub));
    if (rc < 0)
        return api_fail(err, errlen, rc, "%s", sub);
    resized(dev);
    return 0;
}

/*
 * A shrink in progress (vhd_blk_device_resize_async): a periodic timer on
 * the control loop takes its next step (vhd_blk_resize_step) until it ends.
 * Control thread.
 */
struct api_resize {
    struct vhd_device *dev;
    vhd_device_resize_fn done;
    void *opaque;
    int tfd;
    struct vhd_ctl_src *src;
};

#define API_RESIZE_TICK_NS 1000000 /* how often a waiting shrink looks at the queues again */

/* End r: unhook it, then report rc (its device may go in done). */
static void resize_end(struct api_resize *r, int rc, const char *err)
{
    r->dev->resize = NULL;
    vhd_ctl_del(r->src);
    close(r->tfd);
    if (rc == 0)
        resized(r->dev);
    vhd_device_resize_fn done = r->done;
    void *opaque = r->opaque;
    free(r);
    done(opaque, rc, err);
}

static void on_resize_tick(void *opaque, uint32_t events)
{
    struct api_resize *r = opaque;
    char sub[256] = "";
    uint64_t n;
    (void)events;

    if (read(r->tfd, &n, sizeof(n)) < 0 && errno == EAGAIN)
        return;
    int rc = vhd_blk_resize_step(r->dev->dev, sub, sizeof(sub));
    if (rc != -EINPROGRESS)
        resize_end(r, rc, sub);
}

int vhd_blk_device_resize_async(struct vhd_device *dev, uint64_t bytes, bool force,
                                vhd_device_resize_fn done, void *opaque, char *err, size_t errlen)
{
    char sub[256] = "";
    if (!dev || dev->type != API_DEV_BLK || !done)
        return api_fail(err, errlen, -EINVAL, "not a blk device");
    struct api_resize *r = calloc(1, sizeof(*r));
    if (!r)
        return api_fail(err, errlen, -ENOMEM, "out of memory");
    r->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    struct itimerspec its = {.it_value = {0, API_RESIZE_TICK_NS},
                             .it_interval = {0, API_RESIZE_TICK_NS}};
    int rc = r->tfd < 0 ? -errno : 0;
    if (rc == 0 && timerfd_settime(r->tfd, 0, &its, NULL) < 0)
        rc = -errno;
    if (rc == 0)
        rc = vhd_ctl_add(dev->ctx->ctl, r->tfd, EPOLLIN, on_resize_tick, r, &r->src);
    if (rc < 0) {
        if (r->tfd >= 0)
            close(r->tfd);
        free(r);
        return api_fail(err, errlen, rc, "resize timer: %s", strerror(-rc));
    }
    rc = vhd_blk_resize_begin(dev->dev, bytes, force, sub, sizeof(sub));
    if (rc == -EINPROGRESS) {
        r->dev = dev;
        r->done = done;
        r->opaque = opaque;
        dev->resize = r;
        return rc;
    }
    vhd_ctl_del(r->src);
    close(r->tfd);
    free(r);
    if (rc < 0)
        return api_fail(err, errlen, rc, "%s", sub);
    resized(dev);
    return 0;
}

uint64_t vhd_blk_device_size(const struct vhd_device *dev)
{
    if (!dev || dev->type != API_DEV_BLK)
        return 0;
    return vhd_blk_capacity(dev->dev) << 9;
}

unsigned vhd_blk_device_paused_queues(const struct vhd_device *dev)
{
    if (!dev || dev->type != API_DEV_BLK)
        return 0;
    return vhd_blk_paused_queues(dev->dev);
}

/* ---- net ---- */

int vhd_net_device_new(struct vhd_ctx *ctx, const struct vhd_net_config *cfg,
                       struct vhd_device **out, char *err, size_t errlen)
{
    struct vhd_device *d;
    struct vhd_dev *dev = NULL;
    uint8_t mac[6];

    if (!ctx || !cfg || !out)
        return api_fail(err, errlen, -EINVAL, "missing argument");
    if (!cfg->dev.endpoint.path)
        return api_fail(err, errlen, -EINVAL, "no socket path");
    if (cfg->mac)
        memcpy(mac, cfg->mac, sizeof(mac));
    else
        vhd_net_default_mac(cfg->dev.endpoint.path, mac); /* stable, distinct per socket */
    d = calloc(1, sizeof(*d));
    if (!d)
        return api_fail(err, errlen, -ENOMEM, "out of memory");
    struct vhd_net_opts no = {
        .name = cfg->dev.name,
        .backend = cfg->backend,
        .switch_name = cfg->switch_name,
        .tap_name = cfg->tap_name,
        .pairs = cfg->pairs,
        .mac = mac,
        .mtu = cfg->mtu,
        .allow_packed = cfg->dev.allow_packed,
        .no_split = cfg->dev.no_split,
    };
    int rc = vhd_net_new(&no, &dev, err, errlen);
    if (rc < 0)
        goto free_d;
    rc = api_device_init(ctx, d, API_DEV_NET, dev, &cfg->dev, err, errlen);
    if (rc < 0)
        goto free_dev;
    *out = d;
    return 0;

free_dev:
    vhd_net_free(dev);
free_d:
    free(d);
    return rc;
}

/* ---- life cycle ---- */

/* One info line: which workers run the queues (net: per pair). */
static void log_placement(const struct vhd_device *d)
{
    const struct vhd_dev *dev = d->dev;
    uint32_t n = dev->num_queues, step = 1;
    char wl[256] = "";

    if (d->type == API_DEV_NET) {
        n = vhd_net_pairs(dev);
        step = 2;
    }
    for (uint32_t i = 0; i < n && strlen(wl) < sizeof(wl) - 8; i++)
        snprintf(wl + strlen(wl), sizeof(wl) - strlen(wl), "%s%d", i ? "," : "",
                 dev->queue_worker[i * step]);
    vhd_log(VHD_LOG_INFO, "%s: %u %s on worker(s) %s", dev->name, n,
            d->type == API_DEV_NET ? "queue pair(s)" : "queue(s)", wl);
}

int vhd_device_start(struct vhd_device *d, char *err, size_t errlen)
{
    if (d->srv || d->cli)
        return api_fail(err, errlen, -EALREADY, "already started");
    if (d->disabled)
        return api_fail(err, errlen, -EBUSY, "device disabled: a queue could not be stopped");
    errno = 0;
    struct vhd_vu_sock_access acc = {
        .mode = d->access.mode,
        .gid_set = d->access.gid_set,
        .gid = d->access.gid,
        .nuids = d->access.nuids,
        .ngids = d->access.ngids,
    };
    memcpy(acc.uids, d->access.uids, sizeof(acc.uids));
    memcpy(acc.gids, d->access.gids, sizeof(acc.gids));
    if (d->client) {
        struct vhd_vu_client_opts co = {.reconnect_min_ms = d->reconnect_min_ms,
                                        .reconnect_max_ms = d->reconnect_max_ms,
                                        .access = acc};
        d->cli = vhd_vu_client_new(d->ctx->ctl, d->dev, d->path, &co, err, errlen);
    } else if (d->listen_fd >= 0) {
        d->srv =
            vhd_vu_server_new_fd(d->ctx->ctl, d->dev, d->path, d->listen_fd, &acc, err, errlen);
    } else {
        d->srv = vhd_vu_server_new_access(d->ctx->ctl, d->dev, d->path, &acc, err, errlen);
    }
    if (!d->srv && !d->cli)
        return errno ? -errno : -EIO;
    d->seen_sessions = 0;
    d->had_conn = false;
    d->was_broken = false;
    log_placement(d);
    return 0;
}

int vhd_device_stop(struct vhd_device *d)
{
    int rc = 0;

    if (!d->srv && !d->cli)
        return 0;
    /* The final scan reports the session that ends here. */
    api_ctx_scan(d->ctx);
    d->sessions_before += endpoint_sessions(d);
    if (d->cli) {
        d->attempts_before += vhd_vu_client_attempts(d->cli);
        if (vhd_vu_client_disabled(d->cli))
            d->disabled = true;
    } else if (vhd_vu_server_disabled(d->srv)) {
        d->disabled = true;
    }
    bool had = d->had_conn;
    vhd_vu_server_free(d->srv);
    vhd_vu_client_free(d->cli);
    d->srv = NULL;
    d->cli = NULL;
    d->had_conn = false;
    d->was_broken = false;
    /*
     * Freeing the endpoint ended the session; a queue still attached is one
     * its worker did not give back (vhd_vu_conn_free's -EBUSY): the device
     * must never serve again nor be freed while the workers run.
     */
    for (uint32_t q = 0; q < d->dev->num_queues; q++)
        if (d->dev->queues[q].attached)
            d->disabled = true;
    if (d->disabled)
        rc = -EBUSY;
    if (had && d->on_event)
        d->on_event(d, VHD_EVENT_DISCONNECTED, d->opaque);
    return rc;
}

/*
 * Internal devices vhd_device_destroy left allocated (disabled: a worker may
 * still hold one of their requests), kept on a process-wide list so that
 * they stay reachable: not a leak to a leak checker, and findable from a
 * debugger. Pushed lock-free: contexts may live on different threads.
 */
struct abandoned_dev {
    struct vhd_dev *dev;
    struct abandoned_dev *next;
};
static struct abandoned_dev *abandoned;

static void abandon(struct vhd_dev *dev)
{
    struct abandoned_dev *a = malloc(sizeof(*a));

    if (!a)
        return; /* only bookkeeping: the device stays allocated either way */
    a->dev = dev;
    a->next = __atomic_load_n(&abandoned, __ATOMIC_RELAXED);
    while (!__atomic_compare_exchange_n(&abandoned, &a->next, a, true, __ATOMIC_RELEASE,
                                        __ATOMIC_RELAXED))
        ;
}

void vhd_device_destroy(struct vhd_device *d)
{
    if (!d)
        return;
    if (d->resize) { /* a shrink in progress is given up: the old capacity back */
        vhd_blk_resize_cancel(d->dev);
        resize_end(d->resize, -ECANCELED, "the device was destroyed during the resize");
    }
    (void)vhd_device_stop(d);
    for (struct vhd_device **p = &d->ctx->devices; *p; p = &(*p)->next)
        if (*p == d) {
            *p = d->next;
            break;
        }
    if (d->disabled) {
        /* A worker may still touch it (vhd_device_stop): left allocated on purpose. */
        vhd_log(VHD_LOG_ERROR, "%s: destroyed while disabled: its memory is not freed",
                d->dev->name);
        abandon(d->dev);
        api_device_fini(d);
        free(d);
        return;
    }
    switch (d->type) {
    case API_DEV_BLK:
        vhd_blk_free(d->dev);
        break;
    case API_DEV_NET:
        vhd_net_free(d->dev);
        break;
    case API_DEV_CUSTOM:
        api_custom_free(d->dev);
        break;
    }
    api_device_fini(d);
    free(d);
}

static void emit(struct vhd_device *d, enum vhd_event ev)
{
    if (ev == VHD_EVENT_BROKEN)
        d->broken_count++;
    if (d->on_event)
        d->on_event(d, ev, d->opaque);
}

/*
 * Compare each device with what the last scan saw. The transport does not
 * call back into this layer: a session that started and ended within one
 * loop turn shows as a session count that moved with no session now.
 */
void api_ctx_scan(struct vhd_ctx *ctx)
{
    for (struct vhd_device *d = ctx->devices; d; d = d->next) {
        if (!d->srv && !d->cli)
            continue;
        unsigned sessions = endpoint_sessions(d);
        bool now = api_device_conn(d) != NULL;
        if (sessions != d->seen_sessions) {
            if (d->had_conn)
                emit(d, VHD_EVENT_DISCONNECTED);
            d->seen_sessions = sessions;
            d->was_broken = false;
            struct vhd_vu_conn *c = api_device_conn(d);
            if (c && d->stop_timeout_ms)
                vhd_vu_conn_set_detach_timeout(c, d->stop_timeout_ms);
            emit(d, VHD_EVENT_CONNECTED);
            d->had_conn = true;
        }
        if (d->had_conn && d->dev->broken && !d->was_broken) {
            d->was_broken = true;
            emit(d, VHD_EVENT_BROKEN);
        }
        if (d->config_event) {
            d->config_event = false;
            emit(d, VHD_EVENT_CONFIG_CHANGED);
        }
        if (d->had_conn && !now) {
            d->had_conn = false;
            d->was_broken = false;
            emit(d, VHD_EVENT_DISCONNECTED);
        }
    }
}

enum vhd_device_state vhd_device_state(const struct vhd_device *d)
{
    if (d->disabled || (d->srv && vhd_vu_server_disabled(d->srv)) ||
        (d->cli && vhd_vu_client_disabled(d->cli)))
        return VHD_DEVICE_DISABLED;
    if (!d->srv && !d->cli)
        return VHD_DEVICE_STOPPED;
    if (!api_device_conn(d))
        return VHD_DEVICE_WAITING;
    return d->dev->broken ? VHD_DEVICE_BROKEN : VHD_DEVICE_CONNECTED;
}

const char *vhd_device_name(const struct vhd_device *d)
{
    return d->dev->name;
}

const char *vhd_device_socket_path(const struct vhd_device *d)
{
    return d->path;
}

int vhd_device_socket_dir_fd(const struct vhd_device *d)
{
    return d->srv ? vhd_vu_server_dir_fd(d->srv) : -1;
}

bool vhd_device_is_client(const struct vhd_device *d)
{
    return d->client;
}

uint32_t vhd_device_num_queues(const struct vhd_device *d)
{
    return d->dev->num_queues;
}

int vhd_device_queue_worker(const struct vhd_device *d, uint32_t q)
{
    if (q >= d->dev->num_queues)
        return -EINVAL;
    return d->dev->queue_worker ? d->dev->queue_worker[q] : (int)(q % d->ctx->nworkers);
}

uint64_t vhd_device_features(const struct vhd_device *d)
{
    return api_device_conn(d) ? d->dev->features : 0;
}

int vhd_device_counters(const struct vhd_device *d, struct vhd_device_counters *out)
{
    memset(out, 0, sizeof(*out));
    out->sessions = d->sessions_before + endpoint_sessions(d);
    out->connect_attempts = d->attempts_before + (d->cli ? vhd_vu_client_attempts(d->cli) : 0);
    out->broken = d->broken_count;
    return 0;
}

int vhd_device_queue_counters(const struct vhd_device *d, uint32_t q,
                              struct vhd_queue_counters *out)
{
    if (q >= d->dev->num_queues)
        return -EINVAL;
    memset(out, 0, sizeof(*out));
    switch (d->type) {
    case API_DEV_NET: {
        struct vhd_net_queue_stats st;
        int rc = vhd_net_queue_stats(d->dev, q, &st);
        if (rc < 0)
            return rc;
        out->requests = st.packets;
        out->bytes = st.bytes;
        out->drops = st.drops;
        out->errors = st.errors;
        return 0;
    }
    case API_DEV_BLK: {
        /* any time: the worker stores these with relaxed atomics */
        if (vhd_blk_queue_counters(&d->dev->queues[q], &out->requests, &out->bytes, &out->errors) <
            0)
            return -ENODATA;
        return 0;
    }
    case API_DEV_CUSTOM:
        return api_custom_queue_counters(d->dev, q, out);
    }
    return -EINVAL;
}

int vhd_device_queue_activity(const struct vhd_device *d, uint32_t q,
                              struct vhd_queue_activity *out)
{
    if (q >= d->dev->num_queues)
        return -EINVAL;
    const struct vhd_queue *vq = &d->dev->queues[q];
    memset(out, 0, sizeof(*out));
    /* the worker's relaxed stores (runtime/dev.h) */
    out->kicks = vhd_load_relaxed(&vq->stat_kicks);
    out->calls = vhd_load_relaxed(&vq->stat_notifies);
    out->in_flight = vhd_load_relaxed(&vq->inflight_io);
    return 0;
}

void vhd_device_log_counters(const struct vhd_device *d, const char *why)
{
    struct vhd_queue_counters tot = {0};

    if (d->type == API_DEV_NET) {
        vhd_net_log_stats(d->dev, why);
        return;
    }
    /* running queues too: the worker stores their counters with relaxed atomics */
    for (uint32_t q = 0; q < d->dev->num_queues; q++) {
        struct vhd_queue_counters c;
        if (vhd_device_queue_counters(d, q, &c) < 0 || !c.requests)
            continue;
        vhd_log(VHD_LOG_INFO, "%s: stats (%s): queue %u: requests=%llu bytes=%llu errors=%llu",
                d->dev->name, why, q, (unsigned long long)c.requests, (unsigned long long)c.bytes,
                (unsigned long long)c.errors);
        tot.requests += c.requests;
        tot.bytes += c.bytes;
        tot.errors += c.errors;
    }
    vhd_log(VHD_LOG_INFO, "%s: stats (%s): total: requests=%llu bytes=%llu errors=%llu",
            d->dev->name, why, (unsigned long long)tot.requests, (unsigned long long)tot.bytes,
            (unsigned long long)tot.errors);
}
