/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The session steps the userspace blk and net drivers share (drv_session.h):
 * option checks, opening a session on the vhost-user front-end, announcing a
 * ring. Each driver keeps what is its own: its features, config space, the
 * layout of its shared memory, and how its rings resume.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spec/vhost_user.h"
#include "spec/virtio.h"
#include "util/bits.h"
#include "drv_session.h"

int vhd_drv_check_opts(const char *path, const char *count_name, uint32_t count, uint32_t max_count,
                       uint32_t queue_size, bool packed, char **path_copy, char *err, size_t errlen)
{
    if (!path || !*path) {
        snprintf(err, errlen, "no socket path");
        return -EINVAL;
    }
    if (count > max_count) {
        snprintf(err, errlen, "%s %u: at most %u", count_name, count, max_count);
        return -EINVAL;
    }
    if (queue_size > VHD_VQ_MAX_SIZE || (!packed && (queue_size & (queue_size - 1)))) {
        snprintf(err, errlen, "queue_size %u: 1..32768%s", queue_size,
                 packed ? "" : ", a power of two for split rings");
        return -EINVAL;
    }
    *path_copy = strdup(path);
    if (!*path_copy) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    return 0;
}

int vhd_drv_session_open(struct vhd_vuf *f, const struct vhd_drv_session_params *p, char *err,
                         size_t errlen)
{
    vhd_vuf_init(f, p->timeout_ms);
    int rc = p->listen ? vhd_vuf_accept(f, p->path) : vhd_vuf_connect(f, p->path);
    if (rc == 0)
        rc = vhd_vuf_handshake(f, p->want_proto);
    if (rc < 0) {
        snprintf(err, errlen, "%s", vhd_vuf_strerror(f));
    } else if (!(f->offered & BIT(VIRTIO_F_VERSION_1))) {
        snprintf(err, errlen, "the back-end does not offer VIRTIO_F_VERSION_1 (legacy only)");
        rc = -ENOTSUP;
    } else if (p->packed && !(f->offered & BIT(VIRTIO_F_RING_PACKED))) {
        snprintf(err, errlen, "the back-end does not offer packed rings (VIRTIO_F_RING_PACKED)");
        rc = -ENOTSUP;
    }
    if (rc < 0)
        vhd_vuf_close(f);
    return rc;
}

int vhd_drv_ring_announce(struct vhd_vuf *f, const struct vhd_guestmem *gm,
                          const struct vhd_drv_vq *dq, uint32_t index, uint32_t base, int kick_fd,
                          int call_fd)
{
    struct vhd_vuf_ring r = {
        .index = index,
        .num = dq->size,
        .desc = gm ? vhd_guestmem_uva(gm, dq->desc_gpa) : dq->desc_gpa,
        .avail = gm ? vhd_guestmem_uva(gm, dq->avail_gpa) : dq->avail_gpa,
        .used = gm ? vhd_guestmem_uva(gm, dq->used_gpa) : dq->used_gpa,
        .base = base,
        .kick_fd = kick_fd,
        .call_fd = call_fd,
    };
    return vhd_vuf_ring_start(f, &r);
}

int vhd_drv_iommu_check_opts(uint64_t page_size, char *err, size_t errlen)
{
    if (page_size && (page_size < VHD_DRV_IOMMU_MIN_PAGE || page_size > VHD_DRV_IOMMU_MAX_PAGE ||
                      (page_size & (page_size - 1)))) {
        snprintf(err, errlen, "iommu_page_size %llu: a power of two from 4096 to 1 GiB",
                 (unsigned long long)page_size);
        return -EINVAL;
    }
    return 0;
}

int vhd_drv_iommu_check_peer(const struct vhd_vuf *f, char *err, size_t errlen)
{
    if (!(f->offered & BIT(VIRTIO_F_ACCESS_PLATFORM))) {
        snprintf(err, errlen,
                 "the IOMMU was asked for, but the back-end does not offer "
                 "VIRTIO_F_ACCESS_PLATFORM (no IOTLB support)");
        return -ENOTSUP;
    }
    if (!vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_BACKEND_REQ) ||
        !vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_REPLY_ACK)) {
        snprintf(err, errlen,
                 "the IOMMU needs the BACKEND_REQ and REPLY_ACK protocol features; the "
                 "back-end offers 0x%llx",
                 (unsigned long long)f->proto_offered);
        return -ENOTSUP;
    }
    return 0;
}

/* The IOMMU's messages: IOTLB_MSG with NEED_REPLY on the session. */
static int iotlb_send(void *ctx, const struct vu_iotlb *m)
{
    return vhd_vuf_iotlb_msg(ctx, m);
}

/* The IOMMU in io, allowed to map every region of gm: 0 or -errno with the reason (io finished). */
static int iommu_setup(struct vhd_drv_iommu *io, struct vhd_vuf *f, const struct vhd_guestmem *gm,
                       uint64_t page_size, bool strict, uint32_t batch, char *err, size_t errlen)
{
    struct vhd_drv_iommu_params p = {.page_size = page_size,
                                     .strict = strict,
                                     .batch = batch,
                                     .send = iotlb_send,
                                     .send_ctx = f};
    int rc = vhd_drv_iommu_init(io, &p);
    for (uint32_t i = 0; rc == 0 && i < gm->nregions; i++)
        rc = vhd_drv_iommu_add_region(io, (uint64_t)(uintptr_t)gm->r[i].hva, gm->r[i].size);
    if (rc < 0) {
        snprintf(err, errlen, "IOMMU set-up: %s", strerror(-rc));
        vhd_drv_iommu_fini(io);
    }
    return rc;
}

/* The back-end channel (opened when *backend_fd is -1) and the miss thread on it. */
static int iommu_channel(struct vhd_drv_iommu *io, struct vhd_vuf *f, int *backend_fd,
                         int config_efd, char *err, size_t errlen)
{
    int rc;
    if (*backend_fd < 0) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0) {
            rc = -errno;
            snprintf(err, errlen, "back-end channel: socketpair: %s", strerror(-rc));
            return rc;
        }
        rc = vhd_vuf_set_backend_req_fd(f, sv[1]);
        close(sv[1]);
        if (rc < 0) {
            close(sv[0]);
            snprintf(err, errlen, "%s", vhd_vuf_strerror(f));
            return rc;
        }
        *backend_fd = sv[0];
    }
    rc = vhd_drv_iommu_serve(io, *backend_fd, f->timeout_ms, config_efd);
    if (rc < 0)
        snprintf(err, errlen, "IOMMU miss thread: %s", strerror(-rc));
    return rc;
}

int vhd_drv_iommu_start(struct vhd_drv_iommu *io, struct vhd_vuf *f, const struct vhd_guestmem *gm,
                        uint64_t page_size, bool strict, uint32_t batch, int *backend_fd,
                        int config_efd, char *err, size_t errlen)
{
    int rc = iommu_setup(io, f, gm, page_size, strict, batch, err, errlen);
    return rc < 0 ? rc : iommu_channel(io, f, backend_fd, config_efd, err, errlen);
}

void vhd_drv_drain_eventfd(int fd)
{
    uint64_t v;
    while (read(fd, &v, sizeof(v)) == (ssize_t)sizeof(v)) {
    }
}
