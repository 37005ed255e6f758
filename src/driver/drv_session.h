/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the userspace blk and net drivers share around their vhost-user
 * sessions (blk_driver.c, net_driver.c): the checks of the options both
 * take, opening a session (connect or accept, handshake, the features every
 * driver needs), and announcing a laid-out ring to the back-end. Built on
 * vu_frontend.h. Functions return 0 or -errno and leave a one-line reason in
 * the caller's err buffer; nothing here is on the datapath.
 */
#ifndef VHD_DRV_SESSION_H
#define VHD_DRV_SESSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guestmem.h"
#include "vring.h"
#include "vu_frontend.h"

/*
 * vhd_drv_check_opts - the options every driver takes: a socket path, count
 * queues (or pairs; count_name says which, as in "num_pairs 70: at most 64")
 * of at most max_count, and a queue size the ring layout allows. 0 with
 * *path_copy a malloc'ed copy of path (the caller's to free), or -EINVAL /
 * -ENOMEM with the reason in err.
 */
int vhd_drv_check_opts(const char *path, const char *count_name, uint32_t count, uint32_t max_count,
                       uint32_t queue_size, bool packed, char **path_copy, char *err,
                       size_t errlen);

/* How a driver's session opens. */
struct vhd_drv_session_params {
    const char *path;    /* the back-end's socket */
    bool listen;         /* listen at path for a back-end in client mode instead of connecting */
    int timeout_ms;      /* bound on each exchange */
    uint64_t want_proto; /* VHOST_USER_PROTOCOL_F_* bits the driver implements */
    bool packed;         /* the driver wants packed rings: the back-end must offer them */
};

/*
 * vhd_drv_session_open - start a session on f: connect to (or accept) the
 * back-end, the handshake (vhd_vuf_handshake with want_proto), and check
 * that the back-end offers VIRTIO_F_VERSION_1 (and VIRTIO_F_RING_PACKED when
 * p->packed). 0; or -errno with the reason in err, f closed.
 */
int vhd_drv_session_open(struct vhd_vuf *f, const struct vhd_drv_session_params *p, char *err,
                         size_t errlen);

/*
 * vhd_drv_ring_fresh_base - the SET_VRING_BASE value of a ring laid out
 * afresh: split, next avail 0; packed, avail and used at slot 0 with wrap
 * counters 1.
 */
static inline uint32_t vhd_drv_ring_fresh_base(bool packed)
{
    return packed ? 0x80008000u : 0;
}

/*
 * vhd_drv_ring_announce - start ring index of dq (laid out in gm) on the
 * back-end from base, with its two eventfds (vhd_vuf_ring_start: the fds stay
 * ours). 0, or -errno with the reason in vhd_vuf_strerror(f).
 */
int vhd_drv_ring_announce(struct vhd_vuf *f, const struct vhd_guestmem *gm,
                          const struct vhd_drv_vq *dq, uint32_t index, uint32_t base, int kick_fd,
                          int call_fd);

/* Read a non-blocking eventfd until it is empty (a stale call signal goes). */
void vhd_drv_drain_eventfd(int fd);

#endif /* VHD_DRV_SESSION_H */
