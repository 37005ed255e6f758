/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user server mode (see vu_server.h): socket path checks, listen,
 * accept one session per device at a time, end sessions on disconnect or
 * protocol error, and unlink our socket on exit.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "runtime/log.h"
#include "vu_server.h"
#include "vu_session.h"

/* Pending connections the kernel queues while we are busy; only one is served. */
#define SERVER_BACKLOG 8

struct vhd_vu_server {
    struct vhd_ctl *ctl;
    struct vhd_dev *dev;
    char *path;
    int listen_fd;
    struct vhd_ctl_src *listen_src;
    dev_t sock_dev; /* identity of the socket file we bound, for a safe unlink */
    ino_t sock_ino;
    struct vhd_vu_session sess;
};

static int sockaddr_of(const char *path, struct sockaddr_un *sa)
{
    size_t len = strlen(path);

    if (len == 0 || len >= sizeof(sa->sun_path))
        return -ENAMETOOLONG;
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    memcpy(sa->sun_path, path, len + 1);
    return 0;
}

/*
 * Is somebody listening on the socket file at path? 1: yes (in use), 0: no
 * (stale: connection refused), or -errno when it cannot be told.
 */
static int socket_is_live(const struct sockaddr_un *sa)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc;

    if (fd < 0)
        return -errno;
    if (connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
        rc = 1;
    else if (errno == ECONNREFUSED || errno == ENOENT)
        rc = 0;
    else if (errno == EAGAIN || errno == EINPROGRESS)
        rc = 1; /* a listener with a full backlog is alive */
    else
        rc = -errno;
    close(fd);
    return rc;
}

static void server_end_session(struct vhd_vu_server *srv)
{
    if (vhd_vu_session_end(&srv->sess, srv->dev) == 1)
        vhd_log(VHD_LOG_INFO, "%s: session ended; device reset, waiting for a front-end",
                srv->dev->name);
}

static void on_conn(void *opaque, uint32_t events)
{
    struct vhd_vu_server *srv = opaque;

    (void)events; /* EPOLLHUP/EPOLLERR show up as EOF or an error when reading */
    if (!vhd_vu_session_serve(&srv->sess))
        server_end_session(srv);
}

static void on_accept(void *opaque, uint32_t events)
{
    struct vhd_vu_server *srv = opaque;

    (void)events;
    for (;;) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                VHD_LOG_RL(VHD_LOG_WARN, "%s: accept on %s: %s", srv->dev->name, srv->path,
                           strerror(errno));
            return;
        }
        if (srv->sess.conn || srv->sess.disabled) {
            VHD_LOG_RL(VHD_LOG_WARN, "%s: connection on %s refused: %s", srv->dev->name, srv->path,
                       srv->sess.disabled ? "device disabled" : "a front-end session is active");
            close(fd);
            continue;
        }
        enum vhd_vu_session_step failed;
        int rc = vhd_vu_session_start(&srv->sess, srv->ctl, srv->dev, fd, on_conn, srv, &failed);
        if (rc < 0) {
            vhd_log(VHD_LOG_ERROR, "%s: cannot %s: %s", srv->dev->name,
                    failed == VHD_VU_SESSION_CONN ? "start a session" : "watch the session",
                    strerror(-rc));
            continue;
        }
        vhd_log(VHD_LOG_INFO, "%s: front-end connected on %s", srv->dev->name, srv->path);
    }
}

struct vhd_vu_server *vhd_vu_server_new(struct vhd_ctl *ctl, struct vhd_dev *dev, const char *path,
                                        char *err, size_t errlen)
{
    struct sockaddr_un sa;
    struct stat st;
    int rc;

    if (!ctl || !dev || !path) {
        vhd_vu_set_err(err, errlen, "invalid arguments");
        errno = EINVAL;
        return NULL;
    }
    if (sockaddr_of(path, &sa) < 0) {
        vhd_vu_set_err(err, errlen, "%s: socket path empty or longer than %zu bytes", path,
                       sizeof(sa.sun_path) - 1);
        errno = ENAMETOOLONG;
        return NULL;
    }
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            vhd_vu_set_err(err, errlen, "%s: exists and is not a socket", path);
            errno = EEXIST;
            return NULL;
        }
        rc = socket_is_live(&sa);
        if (rc > 0) {
            vhd_vu_set_err(err, errlen, "%s: socket path in use (a server answers on it)", path);
            errno = EADDRINUSE;
            return NULL;
        }
        if (rc < 0) {
            vhd_vu_set_err(err, errlen, "%s: cannot check the existing socket: %s", path,
                           strerror(-rc));
            errno = -rc;
            return NULL;
        }
        if (unlink(path) < 0 && errno != ENOENT) {
            rc = errno;
            vhd_vu_set_err(err, errlen, "%s: cannot remove the stale socket: %s", path,
                           strerror(rc));
            errno = rc;
            return NULL;
        }
    } else if (errno != ENOENT) {
        rc = errno;
        vhd_vu_set_err(err, errlen, "%s: %s", path, strerror(rc));
        errno = rc;
        return NULL;
    }

    struct vhd_vu_server *srv = calloc(1, sizeof(*srv));
    if (!srv || !(srv->path = strdup(path))) {
        free(srv);
        vhd_vu_set_err(err, errlen, "out of memory");
        errno = ENOMEM;
        return NULL;
    }
    srv->ctl = ctl;
    srv->dev = dev;
    srv->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (srv->listen_fd < 0) {
        rc = errno;
        vhd_vu_set_err(err, errlen, "socket: %s", strerror(rc));
        goto free_srv;
    }
    if (bind(srv->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        rc = errno;
        if (rc == EADDRINUSE)
            vhd_vu_set_err(err, errlen, "%s: socket path in use", path);
        else
            vhd_vu_set_err(err, errlen, "%s: bind: %s", path, strerror(rc));
        goto close_listen;
    }
    if (stat(path, &st) == 0) {
        srv->sock_dev = st.st_dev;
        srv->sock_ino = st.st_ino;
    }
    if (listen(srv->listen_fd, SERVER_BACKLOG) < 0) {
        rc = errno;
        vhd_vu_set_err(err, errlen, "%s: listen: %s", path, strerror(rc));
        goto unlink_path;
    }
    rc = vhd_ctl_add(ctl, srv->listen_fd, EPOLLIN, on_accept, srv, &srv->listen_src);
    if (rc < 0) {
        rc = -rc;
        vhd_vu_set_err(err, errlen, "%s: cannot watch the socket: %s", path, strerror(rc));
        goto unlink_path;
    }
    vhd_log(VHD_LOG_INFO, "%s: listening on %s", dev->name, path);
    return srv;

unlink_path:
    unlink(path);
close_listen:
    close(srv->listen_fd);
free_srv:
    free(srv->path);
    free(srv);
    errno = rc;
    return NULL;
}

void vhd_vu_server_free(struct vhd_vu_server *srv)
{
    struct stat st;

    if (!srv)
        return;
    server_end_session(srv);
    vhd_ctl_del(srv->listen_src);
    close(srv->listen_fd);
    /* Unlink only our own socket: someone may have replaced the path since. */
    if (stat(srv->path, &st) == 0 && st.st_dev == srv->sock_dev && st.st_ino == srv->sock_ino)
        unlink(srv->path);
    free(srv->path);
    free(srv);
}

struct vhd_vu_conn *vhd_vu_server_conn(const struct vhd_vu_server *srv)
{
    return srv->sess.conn;
}

bool vhd_vu_server_check_queues(struct vhd_vu_server *srv)
{
    return vhd_vu_session_check_queues(&srv->sess);
}

const char *vhd_vu_server_path(const struct vhd_vu_server *srv)
{
    return srv->path;
}

unsigned vhd_vu_server_sessions(const struct vhd_vu_server *srv)
{
    return srv->sess.count;
}

bool vhd_vu_server_disabled(const struct vhd_vu_server *srv)
{
    return srv->sess.disabled;
}
