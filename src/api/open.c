/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * blk devices created without blocking the control thread
 * (vhd_blk_device_open): the backend's slow open (an image's lock wait, an
 * NBD probe, an RBD connect) runs on a thread of its own, which hands the
 * result back to the control loop through an eventfd; the device is then
 * linked into its context there, as vhd_blk_device_new does.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "api.h"
#include "dev/blk.h"
#include "runtime/log.h"
#include "transport/ctl.h"
#include "util/clock.h"

/* How long a context's destruction waits for opens in progress (all of them together). */
#define API_OPEN_CANCEL_MS 2000

/*
 * One open in progress. Everything but the result fields belongs to the
 * control thread; the open thread reads cfg/bo and writes dev, rc and err,
 * then writes efd: the eventfd write/read pair orders those stores before
 * the control thread's loads (and pthread_join orders them again).
 */
struct api_open {
    struct vhd_ctx *ctx;
    struct api_open *next; /* ctx->opens */
    pthread_t thread;
    int efd;
    struct vhd_ctl_src *src;
    vhd_device_open_fn done;
    void *opaque;
    struct vhd_blk_config cfg; /* a copy: its strings point into strs */
    struct vhd_blk_opts bo;    /* what the open thread hands vhd_blk_new */
    char *strs;
    int *workers;
    /* result (open thread, then read once on the control thread) */
    struct vhd_dev *dev;
    int rc;
    char err[512];
    /*
     * OPEN_RUNNING, then (atomic exchange, whoever is first) OPEN_DONE by the
     * thread once it has a result, or OPEN_ABANDONED by api_ctx_cancel_opens
     * past its deadline: the thread then frees its device and o itself.
     */
    int state;
};

enum { OPEN_RUNNING, OPEN_DONE, OPEN_ABANDONED };

/* Copy s into the arena at *pos (NULL stays NULL). */
static const char *arena_put(char *arena, size_t *pos, const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *p = memcpy(arena + *pos, s, n);
    *pos += n;
    return p;
}

/* Deep copy of c into o (strings into one arena). 0 or -ENOMEM. */
static int copy_config(struct api_open *o, const struct vhd_blk_config *c)
{
    const char *const strs[] = {c->dev.name, c->dev.endpoint.path,
                                c->backend,  c->image,
                                c->serial,   c->locking,
                                c->werror,   c->rerror,
                                c->uri,      c->pool,
                                c->conf,     c->user,
                                c->snap};
    size_t total = 0, pos = 0;
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
        total += strs[i] ? strlen(strs[i]) + 1 : 0;
    o->strs = malloc(total ? total : 1);
    if (!o->strs)
        return -ENOMEM;
    if (c->dev.nworkers) {
        o->workers = calloc(c->dev.nworkers, sizeof(*o->workers));
        if (!o->workers)
            return -ENOMEM;
        memcpy(o->workers, c->dev.workers, c->dev.nworkers * sizeof(*o->workers));
    }
    o->cfg = *c;
    o->cfg.dev.workers = o->workers;
    o->cfg.dev.name = arena_put(o->strs, &pos, c->dev.name);
    o->cfg.dev.endpoint.path = arena_put(o->strs, &pos, c->dev.endpoint.path);
    o->cfg.backend = arena_put(o->strs, &pos, c->backend);
    o->cfg.image = arena_put(o->strs, &pos, c->image);
    o->cfg.serial = arena_put(o->strs, &pos, c->serial);
    o->cfg.locking = arena_put(o->strs, &pos, c->locking);
    o->cfg.werror = arena_put(o->strs, &pos, c->werror);
    o->cfg.rerror = arena_put(o->strs, &pos, c->rerror);
    o->cfg.uri = arena_put(o->strs, &pos, c->uri);
    o->cfg.pool = arena_put(o->strs, &pos, c->pool);
    o->cfg.conf = arena_put(o->strs, &pos, c->conf);
    o->cfg.user = arena_put(o->strs, &pos, c->user);
    o->cfg.snap = arena_put(o->strs, &pos, c->snap);
    return 0;
}

static void open_free(struct api_open *o)
{
    if (o->efd >= 0)
        close(o->efd);
    free(o->strs);
    free(o->workers);
    free(o);
}

/* The open thread: only the backend's open, nothing of the context. */
static void *open_thread(void *arg)
{
    struct api_open *o = arg;
    uint64_t one = 1;

    o->rc = vhd_blk_new(&o->bo, &o->dev, o->err, sizeof(o->err));
    if (__atomic_exchange_n(&o->state, OPEN_DONE, __ATOMIC_ACQ_REL) == OPEN_ABANDONED) {
        /* The context went on without us (detached): nobody else holds o now. */
        if (o->rc == 0)
            vhd_blk_free(o->dev);
        open_free(o);
        return NULL;
    }
    /* An eventfd write of 1 cannot fail short of a counter at its limit. */
    while (write(o->efd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
    return NULL;
}

/* Unlink o from its context's list of opens. */
static void open_unlink(struct api_open *o)
{
    for (struct api_open **p = &o->ctx->opens; *p; p = &(*p)->next)
        if (*p == o) {
            *p = o->next;
            return;
        }
}

/* Control thread: the open finished; link the device into the context and report. */
static void on_opened(void *opaque, uint32_t events)
{
    struct api_open *o = opaque;
    struct vhd_device *d = NULL;
    uint64_t v;
    (void)events;

    if (read(o->efd, &v, sizeof(v)) < 0 && errno == EAGAIN)
        return; /* not yet (spurious) */
    pthread_join(o->thread, NULL);
    vhd_ctl_del(o->src);
    open_unlink(o);
    int rc = o->rc;
    if (rc == 0) {
        d = calloc(1, sizeof(*d));
        rc =
            d ? api_device_init(o->ctx, d, API_DEV_BLK, o->dev, &o->cfg.dev, o->err, sizeof(o->err))
              : api_fail(o->err, sizeof(o->err), -ENOMEM, "out of memory");
        if (rc < 0) {
            vhd_blk_free(o->dev);
            free(d);
            d = NULL;
        }
    }
    o->done(o->opaque, d, rc, rc < 0 ? o->err : "");
    open_free(o);
}

int vhd_blk_device_open(struct vhd_ctx *ctx, const struct vhd_blk_config *cfg,
                        vhd_device_open_fn done, void *opaque, char *err, size_t errlen)
{
    if (!ctx || !cfg || !done)
        return api_fail(err, errlen, -EINVAL, "missing argument");
    int rc = api_device_check(ctx, &cfg->dev, err, errlen);
    if (rc < 0)
        return rc;
    struct api_open *o = calloc(1, sizeof(*o));
    if (!o)
        return api_fail(err, errlen, -ENOMEM, "out of memory");
    o->efd = -1;
    if (copy_config(o, cfg) < 0) {
        rc = api_fail(err, errlen, -ENOMEM, "out of memory");
        goto free_o;
    }
    api_blk_opts(&o->cfg, &o->bo);
    o->ctx = ctx;
    o->done = done;
    o->opaque = opaque;
    o->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (o->efd < 0) {
        rc = api_fail(err, errlen, -errno, "eventfd: %s", strerror(errno));
        goto free_o;
    }
    rc = vhd_ctl_add(ctx->ctl, o->efd, EPOLLIN, on_opened, o, &o->src);
    if (rc < 0) {
        api_fail(err, errlen, rc, "control loop: %s", strerror(-rc));
        goto free_o;
    }
    /* The open thread takes no signal: those are the control thread's business. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = -pthread_create(&o->thread, NULL, open_thread, o);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc < 0) {
        api_fail(err, errlen, rc, "cannot start the open thread: %s", strerror(-rc));
        goto del_src;
    }
    o->next = ctx->opens;
    ctx->opens = o;
    return 0;

del_src:
    vhd_ctl_del(o->src);
free_o:
    open_free(o);
    return rc;
}

void api_ctx_cancel_opens(struct vhd_ctx *ctx)
{
    uint64_t deadline = vhd_now_ms() + API_OPEN_CANCEL_MS;

    while (ctx->opens) {
        struct api_open *o = ctx->opens;
        ctx->opens = o->next;
        vhd_ctl_del(o->src);
        /* The open thread writes efd once it has a result: wait for that, until the deadline. */
        struct pollfd p = {.fd = o->efd, .events = POLLIN};
        uint64_t now = vhd_now_ms();
        while (poll(&p, 1, now < deadline ? (int)(deadline - now) : 0) < 0 && errno == EINTR)
            now = vhd_now_ms();
        /*
         * Once o is marked abandoned, the open thread may finish and free it
         * at any moment: take what the rest needs out of it first.
         */
        pthread_t thread = o->thread;
        vhd_device_open_fn done = o->done;
        void *opaque = o->opaque;
        char name[128];
        snprintf(name, sizeof(name), "%s", o->cfg.dev.name ? o->cfg.dev.name : "a blk device");
        bool abandoned =
            __atomic_exchange_n(&o->state, OPEN_ABANDONED, __ATOMIC_ACQ_REL) == OPEN_RUNNING;
        if (abandoned) {
            /* Stuck (a backend past its own bound): detached; it frees o and its device. */
            pthread_detach(thread);
            vhd_log(VHD_LOG_WARN,
                    "%s: its backend's open did not finish within %d ms of the shutdown: left "
                    "behind",
                    name, API_OPEN_CANCEL_MS);
        } else {
            pthread_join(thread, NULL);
            if (o->rc == 0)
                vhd_blk_free(o->dev);
            open_free(o);
        }
        done(opaque, NULL, -ECANCELED, "the context was destroyed before the open finished");
    }
}
