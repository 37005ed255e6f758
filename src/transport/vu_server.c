/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user server mode (see vu_server.h): socket path checks, listen with
 * the socket file's mode and group set before anyone can connect, accept one
 * session per device at a time from allowed peers only, back off when out of
 * fds, end sessions on disconnect or protocol error, and unlink our socket on
 * exit through the directory fd opened at start.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include "runtime/log.h"
#include "vu_server.h"
#include "vu_session.h"
#include "vu_sock.h"

/* Pending connections the kernel queues while we are busy; only one is served. */
#define SERVER_BACKLOG 8
/*
 * Out of fds (EMFILE/ENFILE) or kernel memory, accept() fails and leaves the
 * connection queued: the socket stays readable and a level-triggered loop
 * would spin on it. Accepting pauses instead, first for 50 ms, doubling up
 * to 1 s while it keeps failing (fds come back when sessions end).
 */
#define ACCEPT_PAUSE_MIN_MS 50u
#define ACCEPT_PAUSE_MAX_MS 1000u

struct vhd_vu_server {
    struct vhd_ctl *ctl;
    struct vhd_dev *dev;
    char *path;
    const char *base; /* the file name in path */
    int dir_fd;       /* O_PATH fd of the socket's directory: chown, chmod, unlink by name */
    int listen_fd;
    struct vhd_ctl_src *listen_src;
    dev_t sock_dev; /* identity of the socket file we bound, for a safe unlink */
    ino_t sock_ino;
    struct vhd_vu_sock_access acc;
    int timer_fd; /* accept back-off (one-shot) */
    struct vhd_ctl_src *timer_src;
    unsigned pause_ms; /* the next pause; 0: accepting normally */
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

/*
 * accept() failed for want of fds or memory: stop watching the socket and
 * look again after the current pause. The first failure of a run is a
 * warning; later ones are debug lines, so a full fd table costs a few
 * wake-ups per second and one log line, not a spinning control thread.
 */
static void pause_accepting(struct vhd_vu_server *srv, int err)
{
    unsigned ms = srv->pause_ms ? srv->pause_ms : ACCEPT_PAUSE_MIN_MS;
    struct itimerspec its = {0};

    vhd_log(srv->pause_ms ? VHD_LOG_DEBUG : VHD_LOG_WARN,
            "%s: accept on %s: %s: new connections wait %u ms (raise the fd limit?)",
            srv->dev->name, srv->path, strerror(err), ms);
    srv->pause_ms = ms > ACCEPT_PAUSE_MAX_MS / 2 ? ACCEPT_PAUSE_MAX_MS : ms * 2;
    its.it_value.tv_sec = ms / 1000;
    its.it_value.tv_nsec = (long)(ms % 1000) * 1000000L;
    if (vhd_ctl_mod(srv->listen_src, 0) < 0 || timerfd_settime(srv->timer_fd, 0, &its, NULL) < 0) {
        /* Cannot happen with valid fds; keep watching rather than never accept again. */
        (void)vhd_ctl_mod(srv->listen_src, EPOLLIN);
    }
}

static void on_accept_timer(void *opaque, uint32_t events)
{
    struct vhd_vu_server *srv = opaque;
    uint64_t expirations;

    (void)events;
    if (read(srv->timer_fd, &expirations, sizeof(expirations)) < 0)
        return; /* EAGAIN: spurious; the timer is still armed */
    /* Watch again: a connection still queued calls on_accept at once. */
    if (vhd_ctl_mod(srv->listen_src, EPOLLIN) < 0)
        vhd_log(VHD_LOG_ERROR, "%s: cannot watch %s again", srv->dev->name, srv->path);
}

/*
 * Connections taken per wake-up of the listening socket. It is watched
 * level-triggered, so what is left is taken at the control loop's next turn,
 * after the other devices' messages: local users that connect and get
 * refused (allow-lists, an active session) in a tight loop cannot keep the
 * control thread here. 16: more than a front-end's reconnects ever queue.
 */
#define VU_ACCEPT_PER_WAKE 16

static void on_accept(void *opaque, uint32_t events)
{
    struct vhd_vu_server *srv = opaque;

    (void)events;
    for (unsigned n = 0; n < VU_ACCEPT_PER_WAKE; n++) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED)
                continue;
            if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM)
                pause_accepting(srv, err);
            else if (err != EAGAIN && err != EWOULDBLOCK)
                VHD_LOG_RL(VHD_LOG_WARN, "%s: accept on %s: %s", srv->dev->name, srv->path,
                           strerror(err));
            return;
        }
        if (srv->pause_ms) {
            vhd_log(VHD_LOG_INFO, "%s: accepting connections on %s again", srv->dev->name,
                    srv->path);
            srv->pause_ms = 0;
        }
        struct ucred cred;
        int prc = vhd_vu_peer_check(fd, &srv->acc, &cred);
        if (prc < 0) {
            VHD_LOG_RL(VHD_LOG_WARN, "%s: connection on %s refused: peer pid %d uid %u gid %u %s",
                       srv->dev->name, srv->path, (int)cred.pid, (unsigned)cred.uid,
                       (unsigned)cred.gid,
                       prc == -EACCES ? "not in allow-uid/allow-gid" : strerror(-prc));
            close(fd);
            continue;
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
        vhd_log(VHD_LOG_INFO, "%s: front-end connected on %s (pid %d uid %u gid %u)",
                srv->dev->name, srv->path, (int)cred.pid, (unsigned)cred.uid, (unsigned)cred.gid);
    }
}

/*
 * Remove our socket file, and only ours: someone may have replaced the path
 * since. By name in the directory we bound in (the sandbox allows unlinkat on
 * that directory fd only, see daemon/sandbox.c).
 */
static void unlink_own(const struct vhd_vu_server *srv)
{
    struct stat st;

    if (srv->sock_ino && fstatat(srv->dir_fd, srv->base, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        st.st_dev == srv->sock_dev && st.st_ino == srv->sock_ino)
        unlinkat(srv->dir_fd, srv->base, 0);
}

/* Open path's directory (O_PATH) into *dir_fd; *base gets the file name within path. 0 or -errno.
 */
static int open_dir_of(const char *path, int *dir_fd, const char **base)
{
    const char *slash = strrchr(path, '/');
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];

    if (!slash) {
        strcpy(dir, ".");
        *base = path;
    } else {
        size_t len = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, len); /* path fits sun_path (checked first) */
        dir[len] = '\0';
        *base = slash + 1;
    }
    if (!**base)
        return -EINVAL;
    *dir_fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    return *dir_fd < 0 ? -errno : 0;
}

/*
 * The socket file's group and mode, set between bind() and listen(). The
 * file is born with at most srv->acc.mode: fchmod() on the socket before
 * bind() set its inode's mode, and Linux creates the file with that mode
 * minus the umask (a new socket's inode would otherwise be 0777: under umask
 * 0 or 002 any local user could connect). The umask may have taken bits
 * away: chmod puts them back, only ever widening up to the requested mode.
 * Nobody can connect before listen(), so there is no window either way.
 * The file is checked to be the one we bound. 0 or -errno, reason in err.
 */
static int set_file_access(struct vhd_vu_server *srv, mode_t mode, char *err, size_t errlen)
{
    struct stat st;

    if (fstatat(srv->dir_fd, srv->base, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISSOCK(st.st_mode)) {
        vhd_vu_set_err(err, errlen, "%s: the socket file vanished after bind", srv->path);
        return -ENOENT;
    }
    srv->sock_dev = st.st_dev;
    srv->sock_ino = st.st_ino;
    if (srv->acc.gid_set &&
        fchownat(srv->dir_fd, srv->base, (uid_t)-1, srv->acc.gid, AT_SYMLINK_NOFOLLOW) < 0) {
        int rc = errno;
        vhd_vu_set_err(err, errlen, "%s: socket-group=%u: chown: %s", srv->path,
                       (unsigned)srv->acc.gid, strerror(rc));
        return -rc;
    }
    if ((st.st_mode & 07777) != mode && fchmodat(srv->dir_fd, srv->base, mode, 0) < 0) {
        int rc = errno;
        vhd_vu_set_err(err, errlen, "%s: chmod %04o: %s", srv->path, (unsigned)mode, strerror(rc));
        return -rc;
    }
    if (fstatat(srv->dir_fd, srv->base, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
        st.st_dev != srv->sock_dev || st.st_ino != srv->sock_ino || (st.st_mode & 07777) != mode ||
        (srv->acc.gid_set && st.st_gid != srv->acc.gid)) {
        vhd_vu_set_err(err, errlen, "%s: the socket file changed under us", srv->path);
        return -EPERM;
    }
    return 0;
}

/*
 * A server of dev for path (copied) with the peers' access rules (NULL:
 * none), no fd open yet (all -1; sock_ino 0: unlink_own leaves the file
 * alone). NULL with errno ENOMEM and the reason in err when out of memory.
 */
static struct vhd_vu_server *server_alloc(struct vhd_ctl *ctl, struct vhd_dev *dev,
                                          const char *path, const struct vhd_vu_sock_access *acc,
                                          char *err, size_t errlen)
{
    struct vhd_vu_server *srv = calloc(1, sizeof(*srv));
    if (!srv || !(srv->path = strdup(path))) {
        free(srv);
        vhd_vu_set_err(err, errlen, "out of memory");
        errno = ENOMEM;
        return NULL;
    }
    srv->ctl = ctl;
    srv->dev = dev;
    srv->dir_fd = srv->listen_fd = srv->timer_fd = -1;
    if (acc)
        srv->acc = *acc;
    return srv;
}

/*
 * Watch the listening socket and the accept back-off timer on the control
 * loop (on_accept, on_accept_timer): 0, or -errno with neither watched.
 */
static int watch_listener(struct vhd_vu_server *srv)
{
    int rc = vhd_ctl_add(srv->ctl, srv->listen_fd, EPOLLIN, on_accept, srv, &srv->listen_src);
    if (rc == 0) {
        rc = vhd_ctl_add(srv->ctl, srv->timer_fd, EPOLLIN, on_accept_timer, srv, &srv->timer_src);
        if (rc < 0)
            vhd_ctl_del(srv->listen_src);
    }
    return rc;
}

/* A server that failed to start with errno rc: close the fds it has, free it. NULL. */
static struct vhd_vu_server *server_discard(struct vhd_vu_server *srv, int rc)
{
    if (srv->listen_fd >= 0)
        close(srv->listen_fd);
    if (srv->timer_fd >= 0)
        close(srv->timer_fd);
    if (srv->dir_fd >= 0)
        close(srv->dir_fd);
    free(srv->path);
    free(srv);
    errno = rc;
    return NULL;
}

struct vhd_vu_server *vhd_vu_server_new(struct vhd_ctl *ctl, struct vhd_dev *dev, const char *path,
                                        char *err, size_t errlen)
{
    return vhd_vu_server_new_access(ctl, dev, path, NULL, err, errlen);
}

struct vhd_vu_server *vhd_vu_server_new_access(struct vhd_ctl *ctl, struct vhd_dev *dev,
                                               const char *path,
                                               const struct vhd_vu_sock_access *acc, char *err,
                                               size_t errlen)
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

    struct vhd_vu_server *srv = server_alloc(ctl, dev, path, acc, err, errlen);
    if (!srv)
        return NULL;
    mode_t mode = srv->acc.mode ? srv->acc.mode & 0777 : VHD_VU_SOCK_MODE_DEFAULT;
    rc = -open_dir_of(srv->path, &srv->dir_fd, &srv->base);
    if (rc) {
        vhd_vu_set_err(err, errlen, "%s: cannot open its directory: %s", path, strerror(rc));
        goto fail;
    }
    srv->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    srv->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (srv->listen_fd < 0 || srv->timer_fd < 0) {
        rc = errno;
        vhd_vu_set_err(err, errlen, "socket: %s", strerror(rc));
        goto fail;
    }
    /* The socket file is created with at most this mode (set_file_access). */
    if (fchmod(srv->listen_fd, mode) < 0) {
        rc = errno;
        vhd_vu_set_err(err, errlen, "%s: fchmod on the socket: %s", path, strerror(rc));
        goto fail;
    }
    if (bind(srv->listen_fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        rc = errno;
        if (rc == EADDRINUSE)
            vhd_vu_set_err(err, errlen, "%s: socket path in use", path);
        else
            vhd_vu_set_err(err, errlen, "%s: bind: %s", path, strerror(rc));
        goto fail;
    }
    rc = -set_file_access(srv, mode, err, errlen);
    if (rc)
        goto unlink_path;
    if (listen(srv->listen_fd, SERVER_BACKLOG) < 0) {
        rc = errno;
        vhd_vu_set_err(err, errlen, "%s: listen: %s", path, strerror(rc));
        goto unlink_path;
    }
    rc = -watch_listener(srv);
    if (rc) {
        vhd_vu_set_err(err, errlen, "%s: cannot watch the socket: %s", path, strerror(rc));
        goto unlink_path;
    }
    vhd_vu_dir_warn_if_open(dev->name, path);
    vhd_log(VHD_LOG_INFO, "%s: listening on %s (mode %04o%s)", dev->name, path, (unsigned)mode,
            srv->acc.nuids || srv->acc.ngids ? ", peers checked against allow-uid/allow-gid" : "");
    return srv;

unlink_path:
    unlink_own(srv);
fail:
    return server_discard(srv, rc);
}

struct vhd_vu_server *vhd_vu_server_new_fd(struct vhd_ctl *ctl, struct vhd_dev *dev,
                                           const char *path, int listen_fd,
                                           const struct vhd_vu_sock_access *acc, char *err,
                                           size_t errlen)
{
    int domain = 0, type = 0, listening = 0, rc;
    socklen_t sl = sizeof(int);

    if (!ctl || !dev || !path || listen_fd < 0 || (acc && (acc->mode || acc->gid_set))) {
        vhd_vu_set_err(err, errlen, "invalid arguments");
        errno = EINVAL;
        return NULL;
    }
    if (getsockopt(listen_fd, SOL_SOCKET, SO_DOMAIN, &domain, &sl) < 0 || domain != AF_UNIX ||
        getsockopt(listen_fd, SOL_SOCKET, SO_TYPE, &type, &sl) < 0 || type != SOCK_STREAM) {
        rc = errno == EBADF ? EBADF : ENOTSOCK;
        vhd_vu_set_err(err, errlen, "fd %d: %s", listen_fd,
                       rc == EBADF ? "not an open file descriptor"
                                   : "not a Unix domain stream socket");
        errno = rc;
        return NULL;
    }
    if (getsockopt(listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &sl) < 0 || !listening) {
        vhd_vu_set_err(err, errlen, "fd %d: the socket is not listening", listen_fd);
        errno = EINVAL;
        return NULL;
    }
    struct vhd_vu_server *srv = server_alloc(ctl, dev, path, acc, err, errlen);
    if (!srv)
        return NULL;
    srv->listen_fd = fcntl(listen_fd, F_DUPFD_CLOEXEC, 3);
    srv->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (srv->listen_fd < 0 || srv->timer_fd < 0) {
        rc = errno;
        vhd_vu_set_err(err, errlen, "fd %d: %s", listen_fd, strerror(rc));
        return server_discard(srv, rc);
    }
    int fl = fcntl(srv->listen_fd, F_GETFL);
    if (fl < 0 || fcntl(srv->listen_fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        rc = errno;
        vhd_vu_set_err(err, errlen, "fd %d: O_NONBLOCK: %s", listen_fd, strerror(rc));
        return server_discard(srv, rc);
    }
    rc = -watch_listener(srv);
    if (rc) {
        vhd_vu_set_err(err, errlen, "fd %d: cannot watch the socket: %s", listen_fd, strerror(rc));
        return server_discard(srv, rc);
    }
    vhd_log(VHD_LOG_INFO, "%s: listening on inherited fd %d (%s)%s", dev->name, listen_fd, path,
            srv->acc.nuids || srv->acc.ngids ? ", peers checked against allow-uid/allow-gid" : "");
    return srv;
}

void vhd_vu_server_free(struct vhd_vu_server *srv)
{
    if (!srv)
        return;
    server_end_session(srv);
    vhd_ctl_del(srv->listen_src);
    vhd_ctl_del(srv->timer_src);
    close(srv->listen_fd);
    close(srv->timer_fd);
    unlink_own(srv);
    if (srv->dir_fd >= 0)
        close(srv->dir_fd);
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

int vhd_vu_server_dir_fd(const struct vhd_vu_server *srv)
{
    return srv->dir_fd;
}

unsigned vhd_vu_server_sessions(const struct vhd_vu_server *srv)
{
    return srv->sess.count;
}

bool vhd_vu_server_disabled(const struct vhd_vu_server *srv)
{
    return srv->sess.disabled;
}
