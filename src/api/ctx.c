/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The library context (include/vhostd/ctx.h): the runtime's workers, the
 * control loop, the runtime event fd that reports broken queues and guest
 * memory faults, the process-wide SIGBUS guard, and the library version.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "api.h"
#include "backend/blk_backend.h"
#include "core/mem.h"
#include "core/memguard.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "transport/ctl.h"
#include "transport/vu_conn.h"

_Static_assert(VHD_CTX_MAX_WORKERS == VHD_RT_MAX_WORKERS, "public and runtime worker limits");

/* The context whose runtime event fd the SIGBUS guard writes to; control threads only. */
static struct vhd_ctx *guard_owner;

const char *vhd_version(void)
{
    return VHD_VERSION_STRING;
}

unsigned vhd_version_number(void)
{
    return VHD_VERSION;
}

void vhd_set_guest_mem_limit(uint64_t bytes)
{
    vhd_mem_set_total_max(bytes);
}

void vhd_ctx_config_init(struct vhd_ctx_config *cfg)
{
    struct vhd_rt_opts ro;

    vhd_rt_opts_default(&ro);
    memset(cfg, 0, sizeof(*cfg));
    cfg->workers = ro.nworkers;
    cfg->poll = VHD_CTX_POLL_ADAPTIVE;
    cfg->poll_us = ro.poll_us;
    cfg->spin_us = ro.spin_us;
    cfg->budget = ro.budget;
    cfg->sigbus_guard = false;
}

/* One CPU number of a list at *p (digits), moved past. 0, -EINVAL or -ERANGE. */
static int cpu_number(const char **p, unsigned *out)
{
    unsigned v = 0;

    if (**p < '0' || **p > '9')
        return -EINVAL;
    while (**p >= '0' && **p <= '9') {
        v = v * 10 + (unsigned)(**p - '0');
        if (v >= CPU_SETSIZE)
            return -ERANGE;
        (*p)++;
    }
    *out = v;
    return 0;
}

int vhd_parse_cpu_list(const char *s, unsigned *cpus, unsigned max)
{
    cpu_set_t seen;
    unsigned n = 0;
    int rc;

    if (!s || !cpus || !*s)
        return -EINVAL;
    CPU_ZERO(&seen);
    for (const char *p = s;;) {
        unsigned lo, hi, stride = 1;
        rc = cpu_number(&p, &lo);
        if (rc < 0)
            return rc;
        hi = lo;
        if (*p == '-') {
            p++;
            rc = cpu_number(&p, &hi);
            if (rc < 0)
                return rc;
            if (*p == ':') {
                p++;
                rc = cpu_number(&p, &stride);
                if (rc == -ERANGE || (rc == 0 && stride == 0))
                    return -EINVAL;
                if (rc < 0)
                    return rc;
            }
            if (hi < lo)
                return -EINVAL;
        }
        for (unsigned c = lo; c <= hi; c += stride) {
            if (CPU_ISSET(c, &seen))
                return -EEXIST;
            if (n >= max)
                return -E2BIG;
            CPU_SET(c, &seen);
            cpus[n++] = c;
        }
        if (*p == '\0')
            return (int)n;
        if (*p != ',')
            return -EINVAL;
        p++;
    }
}

/*
 * Check cfg's CPU list against the CPUs this process may use and fill the
 * runtime's one-per-worker list (worker i: cpus[i % ncpus]). 0 or -EINVAL,
 * logged: the caller only sees the errno.
 */
static int ctx_cpus(const struct vhd_ctx_config *cfg, int *out)
{
    cpu_set_t allowed, seen;

    if (cfg->ncpus > VHD_CTX_MAX_WORKERS || !cfg->cpus) {
        vhd_log(VHD_LOG_ERROR, "CPU list: %u CPUs (at most %u)", cfg->ncpus, VHD_CTX_MAX_WORKERS);
        return -EINVAL;
    }
    if (sched_getaffinity(0, sizeof(allowed), &allowed) < 0)
        return -errno;
    CPU_ZERO(&seen);
    for (unsigned i = 0; i < cfg->ncpus; i++) {
        unsigned c = cfg->cpus[i];
        if (c >= CPU_SETSIZE || !CPU_ISSET(c, &allowed)) {
            vhd_log(VHD_LOG_ERROR,
                    "CPU list: CPU %u does not exist or this process may not run on it "
                    "(sched_getaffinity allows %d CPUs)",
                    c, CPU_COUNT(&allowed));
            return -EINVAL;
        }
        if (CPU_ISSET(c, &seen)) {
            vhd_log(VHD_LOG_ERROR, "CPU list: CPU %u listed twice", c);
            return -EINVAL;
        }
        CPU_SET(c, &seen);
    }
    for (unsigned i = 0; i < cfg->workers; i++)
        out[i] = (int)cfg->cpus[i % cfg->ncpus];
    return 0;
}

/* A worker marked a queue broken, or the guard absorbed a fault: let each session look. */
static void on_rt_event(void *opaque, uint32_t events)
{
    struct vhd_ctx *ctx = opaque;
    uint64_t v;

    (void)events;
    if (read(vhd_rt_event_fd(ctx->rt), &v, sizeof(v)) < 0 && errno != EAGAIN)
        vhd_log(VHD_LOG_WARN, "runtime event fd: %s", strerror(errno));
    for (struct vhd_device *d = ctx->devices; d; d = d->next) {
        struct vhd_vu_conn *c = api_device_conn(d);
        if (c)
            vhd_vu_conn_check_queues(c);
    }
}

int vhd_ctx_new(const struct vhd_ctx_config *cfg, struct vhd_ctx **out)
{
    struct vhd_ctx_config def;
    struct vhd_rt_opts ro;
    int cpus[VHD_CTX_MAX_WORKERS];
    struct vhd_ctx *ctx;
    int rc;

    if (!out)
        return -EINVAL;
    if (!cfg) {
        vhd_ctx_config_init(&def);
        cfg = &def;
    }
    if (cfg->workers < 1 || cfg->workers > VHD_CTX_MAX_WORKERS || cfg->budget < 1 ||
        (cfg->poll != VHD_CTX_POLL_ADAPTIVE && cfg->poll != VHD_CTX_POLL_ALWAYS &&
         cfg->poll != VHD_CTX_POLL_NEVER) ||
        (cfg->spin_us > 1000000 && cfg->spin_us != VHD_CTX_SPIN_AUTO))
        return -EINVAL;
    if (cfg->ncpus) {
        rc = ctx_cpus(cfg, cpus);
        if (rc < 0)
            return rc;
    }
    if (cfg->sigbus_guard && guard_owner)
        return -EBUSY;
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return -ENOMEM;
    rc = vhd_ctl_new(&ctx->ctl);
    if (rc < 0)
        goto free_ctx;

    vhd_rt_opts_default(&ro);
    ro.nworkers = cfg->workers;
    ro.poll_us = cfg->poll_us;
    _Static_assert(VHD_CTX_SPIN_AUTO == VHD_RT_SPIN_AUTO, "the automatic spin passes through");
    ro.spin_us = cfg->spin_us;
    ro.budget = cfg->budget;
    ro.cpus = cfg->ncpus ? cpus : NULL;
    ro.poll_mode = cfg->poll == VHD_CTX_POLL_ALWAYS  ? VHD_POLL_ALWAYS
                   : cfg->poll == VHD_CTX_POLL_NEVER ? VHD_POLL_NEVER
                                                     : VHD_POLL_ADAPTIVE;
    /* Only what the block backends submit: the kernel refuses other opcodes (rt.h). */
    ro.uring_ops = vhd_blk_backend_uring.uring_ops | vhd_blk_backend_null.uring_ops |
                   vhd_blk_backend_nbd.uring_ops | vhd_blk_backend_rbd.uring_ops;
    rc = vhd_rt_new(&ro, &ctx->rt);
    if (rc < 0)
        goto free_ctl;
    ctx->nworkers = cfg->workers;
    for (unsigned i = 0; cfg->ncpus && i < cfg->workers; i++)
        vhd_log(VHD_LOG_INFO, "worker %u: pinned to CPU %d (NUMA node %d)", i,
                vhd_rt_worker_cpu(ctx->rt, i), vhd_rt_worker_node(ctx->rt, i));
    rc = vhd_ctl_add(ctx->ctl, vhd_rt_event_fd(ctx->rt), EPOLLIN, on_rt_event, ctx, NULL);
    if (rc < 0)
        goto free_rt;
    if (cfg->sigbus_guard) {
        rc = vhd_memguard_install(vhd_rt_event_fd(ctx->rt));
        if (rc < 0)
            goto free_rt;
        ctx->sigbus_guard = true;
        guard_owner = ctx;
    }
    *out = ctx;
    return 0;

free_rt:
    vhd_rt_free(ctx->rt);
free_ctl:
    vhd_ctl_free(ctx->ctl);
free_ctx:
    free(ctx);
    return rc;
}

void vhd_ctx_destroy(struct vhd_ctx *ctx)
{
    if (!ctx)
        return;
    /* Ending each session detaches its queues: in-flight I/O completes first. */
    for (struct vhd_device *d = ctx->devices; d; d = d->next)
        (void)vhd_device_stop(d);
    /* Then the backends close (a writable image is flushed). */
    while (ctx->devices)
        vhd_device_destroy(ctx->devices);
    /*
     * Opens in progress last, with a deadline (a stuck one must not keep the
     * devices above from being flushed), before the loop their eventfds are
     * watched in goes.
     */
    api_ctx_cancel_opens(ctx);
    if (ctx->sigbus_guard) {
        /* The guard must not write to the event fd once it is closed. */
        vhd_memguard_install(-1);
        vhd_memguard_uninstall();
        guard_owner = NULL;
    }
    vhd_rt_free(ctx->rt);
    vhd_ctl_free(ctx->ctl);
    free(ctx);
}

unsigned vhd_ctx_workers(const struct vhd_ctx *ctx)
{
    return ctx->nworkers;
}

int vhd_ctx_worker_stats(const struct vhd_ctx *ctx, unsigned worker, struct vhd_worker_stats *out)
{
    struct vhd_rt_worker_stats st;
    int rc = vhd_rt_worker_stats(ctx->rt, worker, &st);
    if (rc < 0)
        return rc;
    out->sleeps = st.sleeps;
    out->sleep_ns = st.sleep_ns;
    out->poll_ns = st.poll_ns;
    out->event_ns = st.event_ns;
    out->wake_cost_ns = st.wake_cost_ns;
    return 0;
}

int vhd_ctx_dispatch(struct vhd_ctx *ctx, int timeout_ms)
{
    int rc = vhd_ctl_run_once(ctx->ctl, timeout_ms);

    if (rc >= 0)
        api_ctx_scan(ctx);
    return rc;
}

int vhd_ctx_run(struct vhd_ctx *ctx)
{
    /* As vhd_ctl_run, with the event scan after each turn. */
    api_ctx_scan(ctx); /* what happened before the loop ran (a start that failed at once) */
    while (!vhd_ctl_stop_requested(ctx->ctl)) {
        int rc = vhd_ctx_dispatch(ctx, -1);
        if (rc < 0)
            return rc;
    }
    /* Consume the stop request: vhd_ctl_run returns at once with it pending, then clears it. */
    return vhd_ctl_run(ctx->ctl);
}

int vhd_ctx_fd(const struct vhd_ctx *ctx)
{
    return vhd_ctl_fd(ctx->ctl);
}

void vhd_ctx_stop(struct vhd_ctx *ctx)
{
    vhd_ctl_stop(ctx->ctl);
}

int vhd_ctx_watch_fd(struct vhd_ctx *ctx, int fd, uint32_t events, vhd_ctx_watch_fn fn,
                     void *opaque, struct vhd_ctx_watch **out)
{
    struct vhd_ctl_src *src = NULL;

    if (fd < 0 || !fn)
        return -EINVAL;
    int rc = vhd_ctl_add(ctx->ctl, fd, events, fn, opaque, &src);
    if (rc < 0)
        return rc;
    if (out)
        *out = (struct vhd_ctx_watch *)src;
    return 0;
}

void vhd_ctx_unwatch(struct vhd_ctx_watch *w)
{
    vhd_ctl_del((struct vhd_ctl_src *)w);
}
