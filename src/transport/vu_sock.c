/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user framing over a Unix stream socket (see vu_sock.h): incremental
 * receive of header + payload with SCM_RIGHTS fds, and send with fds.
 * The spec ("Introduction", "Communication") carries fds in the ancillary
 * data of the message; QEMU sends header, payload and fds in one sendmsg().
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

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

static long elapsed_ms(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (t.tv_sec - t0->tv_sec) * 1000 + (t.tv_nsec - t0->tv_nsec) / 1000000;
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
    struct timespec t0;

    if (nfds > VHOST_USER_MAX_FDS || (hdr->size && !payload))
        return -EINVAL;
    clock_gettime(CLOCK_MONOTONIC, &t0);
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
            long left = timeout_ms - elapsed_ms(&t0);
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
