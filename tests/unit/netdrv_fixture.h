/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared by the tests that drive a net device through the userspace
 * virtio-net driver (test_net_driver.c, test_net_gen.c): connecting with the
 * reason of a failure in the test's output. Include after harness.h.
 */
#ifndef VHD_TEST_NETDRV_FIXTURE_H
#define VHD_TEST_NETDRV_FIXTURE_H

#include <stdio.h>

#include "harness.h"
#include "vhostd/net_driver.h"

/* Connect with o; the test fails, printing the driver's reason (what: which one), when it cannot.
 */
static inline struct vhd_netdrv *netdrv_connect_ok(const struct vhd_netdrv_opts *o,
                                                   const char *what)
{
    struct vhd_netdrv *d = NULL;
    char err[256];
    int rc = vhd_netdrv_connect(o, &d, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  connect%s%s: %s\n", what ? " " : "", what ? what : "", err);
    VHD_CHECK_EQ(rc, 0);
    return d;
}

#endif /* VHD_TEST_NETDRV_FIXTURE_H */
