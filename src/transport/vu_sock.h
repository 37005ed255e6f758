/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user message framing on a Unix stream socket: an incremental
 * receiver (header, then payload, with SCM_RIGHTS fds) that works on a
 * non-blocking socket and never blocks the control thread on a slow peer,
 * and a sender for replies and back-end requests.
 */
#ifndef VHD_VU_SOCK_H
#define VHD_VU_SOCK_H

#include <stdint.h>

#include "vu_msg.h"

/*
 * Receive state of one connection. Fields are valid to read once
 * vu_rx_read() returned 1: hdr, payload (hdr.size bytes), fds[0..nfds).
 */
struct vu_rx {
    struct vu_hdr hdr;
    union vu_payload payload;
    uint32_t got;                /* bytes of header + payload received so far */
    unsigned nfds;               /* fds received with this message */
    int fds[VHOST_USER_MAX_FDS]; /* owned by the vu_rx until handed over */
};

/* Start empty. */
void vu_rx_init(struct vu_rx *rx);

/*
 * vu_rx_read - advance the message being received on sock.
 * Returns 1 when a whole message is in rx: the caller now owns rx->fds (it
 * must close or keep each one) and calls vu_rx_next() before reading again.
 * Returns 0 when the socket has no more data for now (EAGAIN), or a negative
 * errno: -ECONNRESET (peer closed, possibly mid-message), -EMSGSIZE (size
 * field above VU_MAX_PAYLOAD), -EPROTO (more than VHOST_USER_MAX_FDS fds,
 * truncated or unknown ancillary data), or a recvmsg() errno. On error every
 * fd received for the partial message has been closed; the connection must be
 * dropped. EINTR and short reads are handled inside.
 * Fds are received with MSG_CMSG_CLOEXEC.
 */
int vu_rx_read(struct vu_rx *rx, int sock);

/* Forget the delivered message (its fds belong to the caller now). */
void vu_rx_next(struct vu_rx *rx);

/* Close every fd held for a partial message and start empty. */
void vu_rx_reset(struct vu_rx *rx);

/*
 * vu_send - send header + payload (hdr->size bytes) and up to
 * VHOST_USER_MAX_FDS fds (the fds stay owned by the caller). Works on
 * blocking and non-blocking sockets: EAGAIN waits for writability up to
 * timeout_ms in total (then -ETIMEDOUT); EINTR and short writes are retried.
 * MSG_NOSIGNAL: a closed peer is -EPIPE, not SIGPIPE. 0 or -errno.
 */
int vu_send(int sock, const struct vu_hdr *hdr, const void *payload, const int *fds, unsigned nfds,
            int timeout_ms);

#endif /* VHD_VU_SOCK_H */
