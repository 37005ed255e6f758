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
#include <unistd.h>

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
        .desc = vhd_guestmem_uva(gm, dq->desc_gpa),
        .avail = vhd_guestmem_uva(gm, dq->avail_gpa),
        .used = vhd_guestmem_uva(gm, dq->used_gpa),
        .base = base,
        .kick_fd = kick_fd,
        .call_fd = call_fd,
    };
    return vhd_vuf_ring_start(f, &r);
}

void vhd_drv_drain_eventfd(int fd)
{
    uint64_t v;
    while (read(fd, &v, sizeof(v)) == (ssize_t)sizeof(v)) {
    }
}
