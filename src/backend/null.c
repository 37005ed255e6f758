/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The null block backend: no storage. Every operation completes inline,
 * before submit returns; reads return zeroes, writes are discarded. It
 * measures the pure virtio path (rings, parsing, notifications).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blk_backend.h"

static int null_open(const struct vhd_blk_backend_opts *o, struct vhd_blk_backend **out, char *err,
                     size_t errlen)
{
    if (o->image) {
        if (err)
            snprintf(err, errlen, "the null backend takes no image (got %s)", o->image);
        return -EINVAL;
    }
    if (o->size == 0) {
        if (err)
            snprintf(err, errlen, "the null backend needs a size");
        return -EINVAL;
    }
    struct vhd_blk_backend *be = calloc(1, sizeof(*be));
    if (!be) {
        if (err)
            snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    be->ops = &vhd_blk_backend_null;
    be->size = o->size;
    be->phys_block_size = 0;
    be->ro = o->ro;
    be->zeroes_may_unmap = false; /* nothing to deallocate */
    snprintf(be->desc, sizeof(be->desc), "null (%llu bytes)", (unsigned long long)o->size);
    *out = be;
    return 0;
}

static void null_close(struct vhd_blk_backend *be)
{
    free(be);
}

static void null_submit(struct vhd_blk_backend *be, struct vhd_worker *w, struct vhd_blk_io *io)
{
    int res = 0;

    (void)w;
    io->be = be;
    switch (io->op) {
    case VHD_BLK_IO_READ:
        /* The issue asks for zeroes: no stale guest data ever shows through. */
        for (uint32_t i = 0; i < io->iovcnt; i++)
            memset(io->iov[i].iov_base, 0, io->iov[i].iov_len);
        break;
    case VHD_BLK_IO_WRITE:
    case VHD_BLK_IO_DISCARD:
    case VHD_BLK_IO_WRITE_ZEROES:
        if (be->ro)
            res = -EROFS; /* blk.c never sends these to a read-only device */
        break;
    case VHD_BLK_IO_FLUSH:
        break;
    default:
        res = -EOPNOTSUPP;
        break;
    }
    io->complete(io, res);
}

/* resize: no storage, only the size changes. */
static int null_resize(struct vhd_blk_backend *be, uint64_t size, bool force, char *err,
                       size_t errlen)
{
    (void)force;
    (void)err;
    (void)errlen;
    be->size = size;
    snprintf(be->desc, sizeof(be->desc), "null (%llu bytes)", (unsigned long long)size);
    return 0;
}

const struct vhd_blk_backend_ops vhd_blk_backend_null = {
    .name = "null",
    .open = null_open,
    .close = null_close,
    .submit = null_submit,
    .resize = null_resize,
};
