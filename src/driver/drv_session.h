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

#include "drv_iommu.h"
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
 * ours). gm NULL: dq's addresses are IOVAs (the driver is the IOMMU) and go
 * as they are. 0, or -errno with the reason in vhd_vuf_strerror(f).
 */
int vhd_drv_ring_announce(struct vhd_vuf *f, const struct vhd_guestmem *gm,
                          const struct vhd_drv_vq *dq, uint32_t index, uint32_t base, int kick_fd,
                          int call_fd);

/* ---- the driver as the IOMMU (drv_iommu.h) ---- */

/* The smallest IOMMU page; larger ones are powers of two up to 1 GiB. */
#define VHD_DRV_IOMMU_MIN_PAGE 4096ull
#define VHD_DRV_IOMMU_MAX_PAGE (1ull << 30)

/* vhd_drv_iommu_check_opts - page_size 0 (off) or a power of two 4 KiB..1 GiB: 0 or -EINVAL. */
int vhd_drv_iommu_check_opts(uint64_t page_size, char *err, size_t errlen);

/*
 * vhd_drv_iommu_check_peer - after the handshake, before SET_FEATURES: the
 * back-end must offer VIRTIO_F_ACCESS_PLATFORM and have negotiated
 * BACKEND_REQ and REPLY_ACK (every IOTLB message is acknowledged; misses come
 * on the back-end channel). 0 or -ENOTSUP with the reason.
 */
int vhd_drv_iommu_check_peer(const struct vhd_vuf *f, char *err, size_t errlen);

/*
 * vhd_drv_iommu_start - after SET_MEM_TABLE, before any ring is announced
 * (a back-end may ask for a ring as soon as it has its address): an IOMMU in
 * io of page_size pages (strict, or lazy with batch: drv_iommu.h) whose
 * messages go through f (vhd_vuf_iotlb_msg), allowed to map every region of
 * gm; then the back-end channel, opened when *backend_fd is -1
 * (SET_BACKEND_REQ_FD; *backend_fd gets our non-blocking end, the caller's
 * to close after vhd_drv_iommu_fini), and the thread answering misses on it;
 * config change messages are passed on by a write to config_efd (-1: none).
 * From then on every exchange on f must hold vhd_drv_iommu_lock. 0 or -errno
 * with the reason in err; either way the caller finishes io with
 * vhd_drv_iommu_fini (which may run twice).
 */
int vhd_drv_iommu_start(struct vhd_drv_iommu *io, struct vhd_vuf *f, const struct vhd_guestmem *gm,
                        uint64_t page_size, bool strict, uint32_t batch, int *backend_fd,
                        int config_efd, char *err, size_t errlen);

/* Read a non-blocking eventfd until it is empty (a stale call signal goes). */
void vhd_drv_drain_eventfd(int fd);

#endif /* VHD_DRV_SESSION_H */
