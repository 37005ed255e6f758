/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user client mode (see vu_client.h): connect to the front-end's
 * socket from the control loop, run one session at a time, and retry with
 * exponential back-off on a timerfd when a connect fails or a session ends.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "runtime/log.h"
#include "util/clock.h"
#include "vu_client.h"
#include "vu_session.h"

struct vhd_vu_client {
    struct vhd_ctl *ctl;
    struct vhd_dev *dev;
    char *path;
    struct sockaddr_un sa;
    int timer_fd; /* the back-off timer (CLOCK_MONOTONIC, one-shot) */
    struct vhd_ctl_src *timer_src;
    struct vhd_vu_session sess;
    unsigned min_ms, max_ms;
    unsigned delay_ms;      /* the wait before the attempt after the next failure */
    unsigned next_delay_ms; /* the wait armed now (0 while connected) */
    uint64_t session_start_ms;
    unsigned attempts;
    int last_logged_err; /* errno of the last failure logged at info level; 0: none yet */
    struct vhd_vu_sock_access acc;
};

/* Arm the one-shot timer to fire in ms milliseconds (0: at once). */
static int arm_timer(struct vhd_vu_client *cl, unsigned ms)
{
    struct itimerspec its = {0};

    its.it_value.tv_sec = ms / 1000;
    its.it_value.tv_nsec = (long)(ms % 1000) * 1000000L;
    if (ms == 0)
        its.it_value.tv_nsec = 1; /* all zero would disarm it */
    if (timerfd_settime(cl->timer_fd, 0, &its, NULL) < 0)
        return -errno;
    return 0;
}

/* Wait the current delay, then try again; the delay after that doubles up to max. */
static void schedule_retry(struct vhd_vu_client *cl)
{
    unsigned ms = cl->delay_ms;

    cl->next_delay_ms = ms;
    cl->delay_ms = ms > cl->max_ms / 2 ? cl->max_ms : ms * 2;
    int rc = arm_timer(cl, ms);
    if (rc < 0) {
        /* Cannot happen with a valid timerfd; without it the device would never reconnect. */
        vhd_log(VHD_LOG_ERROR, "%s: cannot arm the reconnect timer: %s; device disabled",
                cl->dev->name, strerror(-rc));
        cl->sess.disabled = true;
    }
}

static void client_end_session(struct vhd_vu_client *cl)
{
    if (vhd_vu_session_end(&cl->sess, cl->dev) != 1)
        return;
    /* A session that held for a while was a success: start over from the shortest delay. */
    if (vhd_now_ms() - cl->session_start_ms >= VHD_VU_CLIENT_STABLE_MS)
        cl->delay_ms = cl->min_ms;
}

static void on_conn(void *opaque, uint32_t events)
{
    struct vhd_vu_client *cl = opaque;

    (void)events; /* EPOLLHUP/EPOLLERR show up as EOF or an error when reading */
    if (!vhd_vu_session_serve(&cl->sess)) {
        client_end_session(cl);
        if (cl->sess.disabled)
            return;
        vhd_log(VHD_LOG_INFO, "%s: session ended; device reset, reconnecting to %s in %u ms",
                cl->dev->name, cl->path, cl->delay_ms);
        schedule_retry(cl);
    }
}

/* A failed attempt: log it (info when the reason is new, else debug) and retry later. */
static void attempt_failed(struct vhd_vu_client *cl, const char *what, int err)
{
    enum vhd_log_level lvl = err == cl->last_logged_err ? VHD_LOG_DEBUG : VHD_LOG_INFO;

    cl->last_logged_err = err;
    vhd_log(lvl, "%s: %s %s: %s (attempt %u); retrying in %u ms", cl->dev->name, what, cl->path,
            strerror(err), cl->attempts, cl->delay_ms);
    schedule_retry(cl);
}

/*
 * One connect attempt. A Unix stream connect on a non-blocking socket
 * completes at once or fails at once (EAGAIN when the front-end's backlog is
 * full; never EINPROGRESS), so the control thread never waits here.
 */
static void try_connect(struct vhd_vu_client *cl)
{
    cl->attempts++;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        attempt_failed(cl, "socket for", errno);
        return;
    }
    if (connect(fd, (const struct sockaddr *)&cl->sa, sizeof(cl->sa)) < 0) {
        int err = errno;
        close(fd);
        attempt_failed(cl, "connect", err);
        return;
    }
    /* Whoever listens there must be a front-end we accept (a socket can be replaced). */
    struct ucred cred;
    int prc = vhd_vu_peer_check(fd, &cl->acc, &cred);
    if (prc < 0) {
        close(fd);
        enum vhd_log_level lvl = prc == cl->last_logged_err ? VHD_LOG_DEBUG : VHD_LOG_WARN;
        cl->last_logged_err = prc;
        vhd_log(lvl,
                "%s: front-end on %s refused: pid %d uid %u gid %u %s (attempt %u); "
                "retrying in %u ms",
                cl->dev->name, cl->path, (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid,
                prc == -EACCES ? "not in allow-uid/allow-gid" : strerror(-prc), cl->attempts,
                cl->delay_ms);
        schedule_retry(cl);
        return;
    }
    enum vhd_vu_session_step failed;
    int rc = vhd_vu_session_start(&cl->sess, cl->ctl, cl->dev, fd, on_conn, cl, &failed);
    if (rc < 0) {
        attempt_failed(cl, failed == VHD_VU_SESSION_CONN ? "session on" : "watching the session on",
                       -rc);
        return;
    }
    cl->next_delay_ms = 0;
    cl->last_logged_err = 0;
    cl->session_start_ms = vhd_now_ms();
    vhd_log(VHD_LOG_INFO, "%s: connected to the front-end on %s (attempt %u; pid %d uid %u gid %u)",
            cl->dev->name, cl->path, cl->attempts, (int)cred.pid, (unsigned)cred.uid,
            (unsigned)cred.gid);
}

static void on_timer(void *opaque, uint32_t events)
{
    struct vhd_vu_client *cl = opaque;
    uint64_t expirations;

    (void)events;
    if (read(cl->timer_fd, &expirations, sizeof(expirations)) < 0) {
        /* EAGAIN: a spurious wake-up; the timer is still armed. */
        return;
    }
    if (cl->sess.conn || cl->sess.disabled)
        return;
    try_connect(cl);
}

struct vhd_vu_client *vhd_vu_client_new(struct vhd_ctl *ctl, struct vhd_dev *dev, const char *path,
                                        const struct vhd_vu_client_opts *o, char *err,
                                        size_t errlen)
{
    struct vhd_vu_client *cl;
    int rc;

    if (!ctl || !dev || !path) {
        vhd_vu_set_err(err, errlen, "invalid arguments");
        errno = EINVAL;
        return NULL;
    }
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof(cl->sa.sun_path)) {
        vhd_vu_set_err(err, errlen, "%s: socket path empty or longer than %zu bytes", path,
                       sizeof(cl->sa.sun_path) - 1);
        errno = ENAMETOOLONG;
        return NULL;
    }
    cl = calloc(1, sizeof(*cl));
    if (!cl || !(cl->path = strdup(path))) {
        free(cl);
        vhd_vu_set_err(err, errlen, "out of memory");
        errno = ENOMEM;
        return NULL;
    }
    cl->ctl = ctl;
    cl->dev = dev;
    cl->sa.sun_family = AF_UNIX;
    memcpy(cl->sa.sun_path, path, len + 1);
    cl->max_ms = o && o->reconnect_max_ms ? o->reconnect_max_ms : VHD_VU_CLIENT_RECONNECT_MAX_MS;
    cl->min_ms = o && o->reconnect_min_ms ? o->reconnect_min_ms : VHD_VU_CLIENT_RECONNECT_MIN_MS;
    if (cl->min_ms > cl->max_ms)
        cl->min_ms = cl->max_ms;
    if (o)
        cl->acc = o->access;
    cl->delay_ms = cl->min_ms;
    cl->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (cl->timer_fd < 0) {
        rc = errno;
        vhd_vu_set_err(err, errlen, "timerfd: %s", strerror(rc));
        goto free_cl;
    }
    rc = vhd_ctl_add(ctl, cl->timer_fd, EPOLLIN, on_timer, cl, &cl->timer_src);
    if (rc < 0) {
        rc = -rc;
        vhd_vu_set_err(err, errlen, "cannot watch the reconnect timer: %s", strerror(rc));
        goto close_timer;
    }
    /* The first attempt runs from the loop, like every later one. */
    rc = arm_timer(cl, 0);
    if (rc < 0) {
        rc = -rc;
        vhd_vu_set_err(err, errlen, "cannot arm the reconnect timer: %s", strerror(rc));
        goto del_timer;
    }
    vhd_vu_dir_warn_if_open(dev->name, path);
    vhd_log(VHD_LOG_INFO, "%s: client mode: connecting to %s (back-off %u..%u ms%s)", dev->name,
            path, cl->min_ms, cl->max_ms,
            cl->acc.nuids || cl->acc.ngids ? "; front-end checked against allow-uid/allow-gid"
                                           : "");
    return cl;

del_timer:
    vhd_ctl_del(cl->timer_src);
close_timer:
    close(cl->timer_fd);
free_cl:
    free(cl->path);
    free(cl);
    errno = rc;
    return NULL;
}

void vhd_vu_client_free(struct vhd_vu_client *cl)
{
    if (!cl)
        return;
    client_end_session(cl);
    vhd_ctl_del(cl->timer_src);
    close(cl->timer_fd);
    free(cl->path);
    free(cl);
}

struct vhd_vu_conn *vhd_vu_client_conn(const struct vhd_vu_client *cl)
{
    return cl->sess.conn;
}

bool vhd_vu_client_check_queues(struct vhd_vu_client *cl)
{
    return vhd_vu_session_check_queues(&cl->sess);
}

const char *vhd_vu_client_path(const struct vhd_vu_client *cl)
{
    return cl->path;
}

unsigned vhd_vu_client_attempts(const struct vhd_vu_client *cl)
{
    return cl->attempts;
}

unsigned vhd_vu_client_sessions(const struct vhd_vu_client *cl)
{
    return cl->sess.count;
}

unsigned vhd_vu_client_next_delay_ms(const struct vhd_vu_client *cl)
{
    return cl->sess.conn ? 0 : cl->next_delay_ms;
}

bool vhd_vu_client_disabled(const struct vhd_vu_client *cl)
{
    return cl->sess.disabled;
}
