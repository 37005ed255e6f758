/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libvhostd: a userspace vhost-user virtio dataplane. This umbrella header
 * pulls in the whole public API and defines the version macros:
 *
 *   device side (serve virtio devices to vhost-user front-ends such as QEMU):
 *     vhostd/ctx.h     the library context: workers, polling, the control loop
 *     vhostd/device.h  what every device has: endpoint, start/stop, state, events, counters
 *     vhostd/blk.h     virtio-blk devices with a file/block-device or null backend
 *     vhostd/net.h     virtio-net devices with a loopback, switch or TAP backend
 *     vhostd/custom.h  devices of the embedder's own type (examples/rng is one)
 *   driver side (talk to a vhost-user back-end without a VM):
 *     vhostd/blk_driver.h, vhostd/net_driver.h
 *   vhostd/log.h       the log sink and level
 *
 * Conventions for every call: 0 (or a count) on success, a negative errno on
 * failure; errno is never the way an error is reported. Which thread may
 * call what is said in each header. docs/ABI.md says what may change.
 */
#ifndef VHOSTD_VHOSTD_H
#define VHOSTD_VHOSTD_H

#include <stdint.h>

/* The version of the headers in use; vhd_version() is that of the library that is linked. */
#define VHD_VERSION_MAJOR  0
#define VHD_VERSION_MINOR  1
#define VHD_VERSION_PATCH  0
#define VHD_VERSION_STRING "0.1.0"
/* One number for compile-time comparisons: VHD_VERSION >= VHD_VERSION_NUM(0, 1, 0). */
#define VHD_VERSION_NUM(major, minor, patch) (((major) << 16) | ((minor) << 8) | (patch))
#define VHD_VERSION                          VHD_VERSION_NUM(VHD_VERSION_MAJOR, VHD_VERSION_MINOR, VHD_VERSION_PATCH)

#include "vhostd/blk.h"
#include "vhostd/blk_driver.h"
#include "vhostd/ctx.h"
#include "vhostd/custom.h"
#include "vhostd/device.h"
#include "vhostd/log.h"
#include "vhostd/net.h"
#include "vhostd/net_driver.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The linked library's version as "MAJOR.MINOR.PATCH" (static storage). Any thread. */
const char *vhd_version(void);

/* The linked library's version as VHD_VERSION_NUM(major, minor, patch). Any thread. */
unsigned vhd_version_number(void);

/*
 * vhd_parse_size - parse a size the way vhostd's options take them: "512",
 * "4K", "10M", "8G", "1T" (binary units, case-insensitive, "KiB" and "kb"
 * too) or "0x1000". Stores it in *out and returns 0, or returns -1 (not a
 * size, or above UINT64_MAX). For embedders whose own command lines should
 * read sizes as vhostd does. Any thread.
 */
int vhd_parse_size(const char *s, uint64_t *out);

#ifdef __cplusplus
}
#endif

#endif /* VHOSTD_VHOSTD_H */
