/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user message framing on a Unix stream socket: an incremental
 * receiver (header, then payload, with SCM_RIGHTS fds) that works on a
 * non-blocking socket and never blocks the control thread on a slow peer,
 * and a sender for replies and back-end requests.
 */
#ifndef VHD_VU_SOCK_H
#define VHD_VU_SOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h> /* struct ucred (_GNU_SOURCE) */
#include <sys/types.h>

#include "spec/vhost_user.h"

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

/* ---- who may connect: socket file access and the peer allow-list ---- */

/* Ids per allow-list (allow-uid=, allow-gid=). */
#define VHD_VU_ACCESS_MAX_IDS 16
/* Mode of a listening socket when none is given: its owner only. */
#define VHD_VU_SOCK_MODE_DEFAULT 0600

/*
 * Who may connect to a device's socket, shared by server and client mode.
 * A plain struct (copyable, no pointers) that an embedder fills; all zero is
 * the default: socket mode 0600, the creator's group, any peer.
 */
struct vhd_vu_sock_access {
    /* Server mode: permission bits of the socket file (0: VHD_VU_SOCK_MODE_DEFAULT). */
    mode_t mode;
    /* Server mode: the socket file's group (when gid_set); needs the right to chown. */
    bool gid_set;
    gid_t gid;
    /*
     * The peer allow-list, checked with SO_PEERCRED on every accepted
     * connection (server mode) and on the front-end we connected to (client
     * mode: its credentials when it called listen()). A peer is allowed when
     * both lists are empty, or its uid is in uids, or its (effective,
     * primary) gid is in gids. Supplementary groups are not looked at.
     */
    unsigned nuids, ngids;
    uid_t uids[VHD_VU_ACCESS_MAX_IDS];
    gid_t gids[VHD_VU_ACCESS_MAX_IDS];
};

/*
 * vhd_vu_peer_check - read the peer credentials of the connected Unix socket
 * fd into *cred (pid, uid, gid) and check them against a (NULL: anyone).
 * Returns 0 when the peer is allowed, -EACCES when it is not, or the
 * getsockopt errno (cred then zeroed). Any thread.
 */
int vhd_vu_peer_check(int fd, const struct vhd_vu_sock_access *a, struct ucred *cred);

/*
 * vhd_vu_dir_warn_if_open - log a warning when the directory holding the
 * socket path is writable by every user without the sticky bit: anyone could
 * then remove or replace the socket (server mode: front-ends would reach an
 * impostor; client mode: vhostd would serve one). who names the device.
 */
void vhd_vu_dir_warn_if_open(const char *who, const char *path);

#endif /* VHD_VU_SOCK_H */
