/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user framing over a Unix stream socket (see vu_sock.h): incremental
 * receive of header + payload with SCM_RIGHTS fds, and send with fds.
 * The spec ("Introduction", "Communication") carries fds in the ancillary
 * data of the message; QEMU sends header, payload and fds in one sendmsg().
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "runtime/log.h"
#include "util/clock.h"
#include "vu_sock.h"

#define HDR_SIZE ((uint32_t)sizeof(struct vu_hdr))

void vu_rx_init(struct vu_rx *rx)
{
    memset(rx, 0, sizeof(*rx));
    for (unsigned i = 0; i < VHOST_USER_MAX_FDS; i++)
        rx->fds[i] = -1;
}

void vu_rx_next(struct vu_rx *rx)
{
    /* Zero the payload so no handler can ever see bytes of an earlier message. */
    vu_rx_init(rx);
}

void vu_rx_reset(struct vu_rx *rx)
{
    for (unsigned i = 0; i < rx->nfds; i++)
        if (rx->fds[i] >= 0)
            close(rx->fds[i]);
    vu_rx_init(rx);
}

/*
 * Take the fds out of the control messages of one recvmsg(). Every fd the
 * kernel installed is either stored in rx or closed here. Returns 0 or
 * -EPROTO (too many fds, or a control message that is not SCM_RIGHTS).
 */
static int rx_take_fds(struct vu_rx *rx, struct msghdr *mh)
{
    int rc = 0;

    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_len < CMSG_LEN(0))
            continue;
        size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
            rc = -EPROTO;
            continue;
        }
        const unsigned char *data = CMSG_DATA(cm);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, data + i * sizeof(int), sizeof(int)); /* CMSG_DATA may be unaligned */
            if (rx->nfds < VHOST_USER_MAX_FDS) {
                rx->fds[rx->nfds++] = fd;
            } else {
                close(fd);
                rc = -EPROTO;
            }
        }
    }
    return rc;
}

int vu_rx_read(struct vu_rx *rx, int sock)
{
    /* Room for one more fd than allowed, so that 9 fds show up as too many, not as CTRUNC. */
    union {
        char buf[CMSG_SPACE((VHOST_USER_MAX_FDS + 1) * sizeof(int))];
        struct cmsghdr align;
    } ctl;

    for (;;) {
        struct iovec iov;
        if (rx->got < HDR_SIZE) {
            iov.iov_base = (char *)&rx->hdr + rx->got;
            iov.iov_len = HDR_SIZE - rx->got;
        } else {
            uint32_t off = rx->got - HDR_SIZE;
            if (off == rx->hdr.size)
                return 1;
            iov.iov_base = rx->payload.raw + off;
            iov.iov_len = rx->hdr.size - off;
        }

        struct msghdr mh = {
            .msg_iov = &iov,
            .msg_iovlen = 1,
            .msg_control = ctl.buf,
            .msg_controllen = sizeof(ctl.buf),
        };
        ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return 0;
            int err = -errno;
            vu_rx_reset(rx);
            return err;
        }
        int rc = rx_take_fds(rx, &mh);
        if (rc == 0 && (mh.msg_flags & MSG_CTRUNC))
            rc = -EPROTO; /* the kernel dropped fds we had no room for */
        if (rc < 0) {
            vu_rx_reset(rx);
            return rc;
        }
        if (n == 0) {
            vu_rx_reset(rx); /* end of stream, possibly in the middle of a message */
            return -ECONNRESET;
        }
        rx->got += (uint32_t)n;
        if (rx->got == HDR_SIZE && rx->hdr.size > VU_MAX_PAYLOAD) {
            vu_rx_reset(rx);
            return -EMSGSIZE;
        }
    }
}

/* Milliseconds since t0 (a vhd_now_ms() value). */
static long elapsed_ms(uint64_t t0)
{
    return (long)(vhd_now_ms() - t0);
}

int vu_send(int sock, const struct vu_hdr *hdr, const void *payload, const int *fds, unsigned nfds,
            int timeout_ms)
{
    union {
        char buf[CMSG_SPACE(VHOST_USER_MAX_FDS * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov[2] = {
        {.iov_base = (void *)hdr, .iov_len = sizeof(*hdr)},
        {.iov_base = (void *)payload, .iov_len = payload ? hdr->size : 0},
    };
    size_t total = sizeof(*hdr) + iov[1].iov_len, sent = 0;
    bool fds_sent = (nfds == 0);
    uint64_t t0;

    if (nfds > VHOST_USER_MAX_FDS || (hdr->size && !payload))
        return -EINVAL;
    t0 = vhd_now_ms();
    while (sent < total) {
        /* Skip what was already sent. */
        struct iovec v[2];
        int nv = 0;
        size_t skip = sent;
        for (int i = 0; i < 2; i++) {
            if (skip >= iov[i].iov_len) {
                skip -= iov[i].iov_len;
                continue;
            }
            v[nv].iov_base = (char *)iov[i].iov_base + skip;
            v[nv].iov_len = iov[i].iov_len - skip;
            skip = 0;
            nv++;
        }
        struct msghdr mh = {.msg_iov = v, .msg_iovlen = (size_t)nv};
        if (!fds_sent) {
            memset(&ctl, 0, sizeof(ctl));
            mh.msg_control = ctl.buf;
            mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
            struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
            cm->cmsg_level = SOL_SOCKET;
            cm->cmsg_type = SCM_RIGHTS;
            cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
            memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
        }
        ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return -errno;
            long left = timeout_ms - elapsed_ms(t0);
            if (left <= 0)
                return -ETIMEDOUT;
            struct pollfd pfd = {.fd = sock, .events = POLLOUT};
            if (poll(&pfd, 1, (int)left) < 0 && errno != EINTR)
                return -errno;
            continue;
        }
        fds_sent = true; /* the fds travel with the first byte sent */
        sent += (size_t)n;
    }
    return 0;
}

int vhd_vu_peer_check(int fd, const struct vhd_vu_sock_access *a, struct ucred *cred)
{
    socklen_t len = sizeof(*cred);

    memset(cred, 0, sizeof(*cred));
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, &len) < 0) {
        int err = -errno;
        memset(cred, 0, sizeof(*cred));
        return err;
    }
    if (!a || (a->nuids == 0 && a->ngids == 0))
        return 0;
    for (unsigned i = 0; i < a->nuids && i < VHD_VU_ACCESS_MAX_IDS; i++)
        if (a->uids[i] == cred->uid)
            return 0;
    for (unsigned i = 0; i < a->ngids && i < VHD_VU_ACCESS_MAX_IDS; i++)
        if (a->gids[i] == cred->gid)
            return 0;
    return -EACCES;
}

void vhd_vu_dir_warn_if_open(const char *who, const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    struct stat st;

    if (!slash) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        size_t len = (size_t)(slash - path);
        if (len >= sizeof(dir))
            return;
        memcpy(dir, path, len);
        dir[len] = '\0';
    }
    if (stat(dir, &st) == 0 && (st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX))
        vhd_log(VHD_LOG_WARN,
                "%s: %s: directory %s is writable by every user and not sticky: anyone can "
                "replace the socket",
                who, path, dir);
}
