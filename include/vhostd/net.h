/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libvhostd virtio-net devices (virtio 1.2 section 5.1, virtio 1.x only):
 * multi-queue, mergeable receive buffers, offloads, a control queue with
 * MAC/MQ/announce commands, and a packet backend: "loopback" (what the guest
 * sends comes back), "switch" (an in-process learning switch joining the
 * devices that name the same switch) or "tap" (a host TAP interface).
 *
 * Threading: control thread (vhostd/ctx.h).
 */
#ifndef VHOSTD_NET_H
#define VHOSTD_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vhostd/ctx.h"
#include "vhostd/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most queue pairs a net device may have. */
#define VHD_NET_DEVICE_MAX_PAIRS 64u

struct vhd_net_config {
    struct vhd_device_config dev;
    const char *backend;     /* "loopback" (default), "switch", "tap" */
    const char *switch_name; /* switch: the switch to join (created by its first device) */
    const char *tap_name;    /* tap: the TAP interface (created if missing, needs CAP_NET_ADMIN) */
    uint32_t pairs;          /* queue pairs, 1..VHD_NET_DEVICE_MAX_PAIRS; 0: 1 */
    /*
     * MAC address (6 bytes, unicast), copied. NULL: 52:54:00 followed by 3
     * bytes hashed from the endpoint path: stable across restarts and
     * distinct per socket.
     */
    const uint8_t *mac;
    uint32_t mtu; /* 68..65535; 0: 1500 */
};

/*
 * vhd_net_device_new - create a net device in ctx and open its backend. The
 * device is stopped: call vhd_device_start(). Returns 0 and *out, or -errno
 * (-EINVAL a bad field or worker index; what opening a TAP returned) with a
 * one-line reason in err (errlen bytes, may be 0).
 */
int vhd_net_device_new(struct vhd_ctx *ctx, const struct vhd_net_config *cfg,
                       struct vhd_device **out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* VHOSTD_NET_H */
