/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared by the tests that reach a blk device with the userspace blk driver
 * (include/vhostd/blk_driver.h): a connect that fails the test, with the
 * driver's reason, when the device cannot be reached.
 */
#ifndef VHD_TEST_BLKDRV_FIXTURE_H
#define VHD_TEST_BLKDRV_FIXTURE_H

#include <stdio.h>

#include "harness.h"
#include "vhostd/blk_driver.h"

/* A driver connected with o (the caller disconnects it); the test fails when it cannot connect. */
static inline struct vhd_blkdrv *blkdrv_connect_opts(const struct vhd_blkdrv_opts *o)
{
    struct vhd_blkdrv *d = NULL;
    char err[256] = "";
    int rc = vhd_blkdrv_connect(o, &d, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  blkdrv connect %s: %s\n", o->socket_path, err);
    VHD_CHECK_EQ(rc, 0);
    return d;
}

/* The same with the driver's defaults at sock, each exchange bounded by timeout_ms. */
static inline struct vhd_blkdrv *blkdrv_connect_at(const char *sock, int timeout_ms)
{
    struct vhd_blkdrv_opts o = {.socket_path = sock, .timeout_ms = timeout_ms};
    return blkdrv_connect_opts(&o);
}

#endif
