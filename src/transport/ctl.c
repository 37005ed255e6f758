/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The control thread's epoll loop (see ctl.h). Sources removed while a batch
 * of events is being dispatched are marked dead and freed after the batch,
 * so a callback may remove any source, itself included.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "util/compiler.h"
#include "ctl.h"

/* Events fetched per epoll_wait(); more simply wait for the next round. */
#define CTL_MAX_EVENTS 32

struct vhd_ctl_src {
    struct vhd_ctl *ctl;
    int fd;
    vhd_ctl_fn fn;
    void *opaque;
    bool dead;                /* removed; freed after the current batch */
    struct vhd_ctl_src *next; /* all sources (live or dead-pending) */
};

struct vhd_ctl {
    int epfd;
    int stop_fd;      /* eventfd written by vhd_ctl_stop() */
    int stop;         /* set by vhd_ctl_stop() (any thread or a signal handler); atomic */
    bool dispatching; /* inside a batch: removals are deferred */
    struct vhd_ctl_src *srcs;
    struct vhd_ctl_src stop_src; /* marker for the stop eventfd in epoll data */
};

int vhd_ctl_new(struct vhd_ctl **out)
{
    struct vhd_ctl *ctl = calloc(1, sizeof(*ctl));
    int rc;

    if (!ctl)
        return -ENOMEM;
    ctl->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ctl->epfd < 0) {
        rc = -errno;
        goto free_ctl;
    }
    ctl->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ctl->stop_fd < 0) {
        rc = -errno;
        goto close_ep;
    }
    ctl->stop_src.ctl = ctl;
    ctl->stop_src.fd = ctl->stop_fd;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &ctl->stop_src};
    if (epoll_ctl(ctl->epfd, EPOLL_CTL_ADD, ctl->stop_fd, &ev) < 0) {
        rc = -errno;
        goto close_stop;
    }
    *out = ctl;
    return 0;

close_stop:
    close(ctl->stop_fd);
close_ep:
    close(ctl->epfd);
free_ctl:
    free(ctl);
    return rc;
}

void vhd_ctl_free(struct vhd_ctl *ctl)
{
    if (!ctl)
        return;
    while (ctl->srcs) {
        struct vhd_ctl_src *s = ctl->srcs;
        ctl->srcs = s->next;
        free(s);
    }
    close(ctl->stop_fd);
    close(ctl->epfd);
    free(ctl);
}

int vhd_ctl_add(struct vhd_ctl *ctl, int fd, uint32_t events, vhd_ctl_fn fn, void *opaque,
                struct vhd_ctl_src **out)
{
    struct vhd_ctl_src *s = calloc(1, sizeof(*s));

    if (!s)
        return -ENOMEM;
    s->ctl = ctl;
    s->fd = fd;
    s->fn = fn;
    s->opaque = opaque;
    struct epoll_event ev = {.events = events, .data.ptr = s};
    if (epoll_ctl(ctl->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
        int err = -errno;
        free(s);
        return err;
    }
    s->next = ctl->srcs;
    ctl->srcs = s;
    if (out)
        *out = s;
    return 0;
}

int vhd_ctl_mod(struct vhd_ctl_src *src, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = src};

    if (src->dead)
        return -ENOENT;
    if (epoll_ctl(src->ctl->epfd, EPOLL_CTL_MOD, src->fd, &ev) < 0)
        return -errno;
    return 0;
}

static void src_unlink_free(struct vhd_ctl *ctl, struct vhd_ctl_src *src)
{
    for (struct vhd_ctl_src **p = &ctl->srcs; *p; p = &(*p)->next) {
        if (*p == src) {
            *p = src->next;
            break;
        }
    }
    free(src);
}

void vhd_ctl_del(struct vhd_ctl_src *src)
{
    if (!src || src->dead)
        return;
    struct vhd_ctl *ctl = src->ctl;
    /* The fd may already be closed by a careless caller: ignore EBADF/ENOENT. */
    epoll_ctl(ctl->epfd, EPOLL_CTL_DEL, src->fd, NULL);
    src->dead = true;
    if (!ctl->dispatching)
        src_unlink_free(ctl, src);
}

/* Free the sources removed during the batch just dispatched. */
static void reap_dead(struct vhd_ctl *ctl)
{
    struct vhd_ctl_src **p = &ctl->srcs;

    while (*p) {
        struct vhd_ctl_src *s = *p;
        if (s->dead) {
            *p = s->next;
            free(s);
        } else {
            p = &s->next;
        }
    }
}

int vhd_ctl_run_once(struct vhd_ctl *ctl, int timeout_ms)
{
    struct epoll_event evs[CTL_MAX_EVENTS];
    int ran = 0;

    int n = epoll_wait(ctl->epfd, evs, CTL_MAX_EVENTS, timeout_ms);
    if (n < 0)
        return errno == EINTR ? 0 : -errno;
    ctl->dispatching = true;
    for (int i = 0; i < n; i++) {
        struct vhd_ctl_src *s = evs[i].data.ptr;
        if (s == &ctl->stop_src) {
            uint64_t v;
            if (read(ctl->stop_fd, &v, sizeof(v)) < 0) {
                /* EAGAIN: already drained; nothing else can fail on an eventfd read. */
            }
            continue;
        }
        if (s->dead)
            continue;
        s->fn(s->opaque, evs[i].events);
        ran++;
    }
    ctl->dispatching = false;
    reap_dead(ctl);
    return ran;
}

int vhd_ctl_run(struct vhd_ctl *ctl)
{
    while (!vhd_load_acquire(&ctl->stop)) {
        int rc = vhd_ctl_run_once(ctl, -1);
        if (rc < 0)
            return rc;
    }
    vhd_store_relaxed(&ctl->stop, 0);
    return 0;
}

int vhd_ctl_fd(const struct vhd_ctl *ctl)
{
    return ctl->epfd;
}

void vhd_ctl_stop(struct vhd_ctl *ctl)
{
    uint64_t one = 1;
    int saved = errno; /* async-signal-safe: keep the interrupted code's errno */

    vhd_store_release(&ctl->stop, 1); /* a lock-free atomic store is async-signal-safe */
    if (write(ctl->stop_fd, &one, sizeof(one)) < 0) {
        /* EAGAIN: the counter is already non-zero, the loop will wake up anyway. */
    }
    errno = saved;
}

bool vhd_ctl_stop_requested(const struct vhd_ctl *ctl)
{
    return vhd_load_relaxed(&ctl->stop) != 0;
}
