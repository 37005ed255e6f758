/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared by the tests that drive a net device through the userspace
 * virtio-net driver (test_net_driver.c, test_net_gen.c): connecting with the
 * reason of a failure in the test's output, a process's CPU time. Include
 * after harness.h.
 */
#ifndef VHD_TEST_NETDRV_FIXTURE_H
#define VHD_TEST_NETDRV_FIXTURE_H

#include <stdio.h>
#include <sys/types.h>

#include "harness.h"
#include "vhostd/net_driver.h"

/* Connect with o; when it cannot, the test fails with the driver's reason (what: which one). */
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

/* CPU time (user + system, clock ticks) of a process so far, from /proc/PID/stat; -1 on error. */
static inline long long proc_cpu_ticks(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    /* Fields after the command name, which is in parentheses and may hold spaces. */
    const char *p = strrchr(buf, ')');
    unsigned long long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
        return -1;
    return (long long)(ut + st);
}

#endif /* VHD_TEST_NETDRV_FIXTURE_H */
