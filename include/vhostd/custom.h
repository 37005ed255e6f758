/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libvhostd custom devices: a virtio device type supplied by the embedder.
 * The embedder gives its config space, its device feature bits, the number
 * of queues and a queue callback; the library does everything else: the
 * vhost-user protocol, guest memory, the rings (split and packed, indirect
 * descriptors, event suppression, inflight-free restarts), notifications,
 * dirty logging of what the device writes, reconnects. examples/rng/rng.c
 * is a whole virtio-rng device on this API and the starting point for a
 * new device type.
 *
 * The datapath: a worker pops each available chain of a queue, translates
 * its descriptors into host iovecs -- the device-readable segments first,
 * then the device-writable ones -- and calls ops->process() with them. The
 * callback reads the request from the readable segments, writes its answer
 * into the writable ones, and completes the chain with vhd_chain_complete()
 * and the number of bytes it wrote; the library then publishes it and
 * interrupts the guest once per burst (as event suppression allows).
 *
 *     static int process(struct vhd_device *dev, uint32_t q, struct vhd_chain *c,
 *                        const struct iovec *iov, unsigned nr, unsigned nw, void *opaque)
 *     {
 *         uint32_t written = ...fill iov[nr .. nr + nw)...;
 *         return vhd_chain_complete(c, written);
 *     }
 *
 * Threading: ops->process runs on the worker that owns queue q, and only
 * there: two calls for one queue never overlap, calls for queues on
 * different workers may run at once. It must not block for long (it holds
 * up every queue of its worker) and must not call control-thread
 * functions. Every other callback runs on the control thread, with the
 * device's queues stopped (ops->set_features, ops->reset) or not
 * (ops->set_config: the queues keep running; the device synchronises the
 * config it shares with its workers itself).
 */
#ifndef VHOSTD_CUSTOM_H
#define VHOSTD_CUSTOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "vhostd/ctx.h"
#include "vhostd/device.h"

#ifdef __cplusplus
extern "C" {
#endif

struct vhd_chain; /* one request of the guest, valid until completed */

/* Limits of a custom device. */
#define VHD_CUSTOM_MAX_QUEUES       256u  /* virtqueues */
#define VHD_CUSTOM_MAX_CONFIG       4096u /* bytes of config space */
#define VHD_CUSTOM_MAX_SEGMENTS     1024u /* iovec entries of one chain */
#define VHD_CUSTOM_DEFAULT_SEGMENTS 64u

struct vhd_custom_ops {
    /*
     * process - handle one chain of queue q (required). iov[0 .. nr) are the
     * device-readable segments, iov[nr .. nr + nw) the device-writable ones,
     * each pointing into guest memory (which the guest may change at any
     * time: copy what you validate before you use it). The callback must
     * complete the chain with vhd_chain_complete() before it returns.
     * Returns 0, or a negative errno when the request shows the guest broke
     * the device's protocol: the queue then stops and the device reports
     * NEEDS_RESET (VHD_EVENT_BROKEN). A chain not completed by then is
     * completed with 0 bytes written. Worker thread.
     */
    int (*process)(struct vhd_device *dev, uint32_t q, struct vhd_chain *chain,
                   const struct iovec *iov, unsigned nr, unsigned nw, void *opaque);
    /*
     * set_features - optional: the front-end accepted these feature bits
     * (the device's and the transport's), before any queue starts. Return
     * 0, or -errno to refuse them (e.g. a feature the device needs is
     * missing). Control thread.
     */
    int (*set_features)(struct vhd_device *dev, uint64_t features, void *opaque);
    /*
     * set_config - optional: the front-end writes len bytes at off of config
     * space (off + len <= config_size, checked). Return 0 to accept (the
     * library then stores the bytes and raises VHD_EVENT_CONFIG_CHANGED) or
     * -errno (-EPERM for read-only fields). NULL: config space is read-only.
     * Control thread.
     */
    int (*set_config)(struct vhd_device *dev, const void *buf, uint32_t off, uint32_t len,
                      void *opaque);
    /* reset - optional: the session ended or the front-end reset the device. Control thread. */
    void (*reset)(struct vhd_device *dev, void *opaque);
};

struct vhd_custom_config {
    struct vhd_device_config dev;
    const struct vhd_custom_ops *ops;
    /*
     * Device feature bits offered (virtio 1.2 section 6 reserves bits 24..40
     * for the transport: set only those you implement). The library always
     * adds VIRTIO_F_VERSION_1 (32), VIRTIO_F_INDIRECT_DESC (28),
     * VIRTIO_F_EVENT_IDX (29) and, with dev.allow_packed, VIRTIO_F_RING_PACKED (34).
     */
    uint64_t features;
    const void *config;   /* initial config space, copied (NULL: zeroes) */
    uint32_t config_size; /* bytes, 0..VHD_CUSTOM_MAX_CONFIG */
    uint32_t num_queues;  /* 1..VHD_CUSTOM_MAX_QUEUES */
    /*
     * Most iovec entries one chain may need (one per descriptor, plus one
     * per guest-memory region boundary a buffer crosses), 1..VHD_CUSTOM_MAX_SEGMENTS;
     * 0: VHD_CUSTOM_DEFAULT_SEGMENTS. A chain with more stops its queue
     * (NEEDS_RESET).
     */
    uint32_t max_segments;
};

/*
 * vhd_custom_device_new - create a custom device in ctx. The device is
 * stopped: call vhd_device_start(). Returns 0 and *out, or -EINVAL (no
 * ops->process, a field out of range, a worker index out of range) or
 * -ENOMEM, with a one-line reason in err (errlen bytes, may be 0).
 */
int vhd_custom_device_new(struct vhd_ctx *ctx, const struct vhd_custom_config *cfg,
                          struct vhd_device **out, char *err, size_t errlen);

/*
 * vhd_chain_complete - give chain back to the guest with `written` bytes
 * written into its device-writable segments (at most their total length:
 * more is -EINVAL and nothing happens). Exactly once per chain, from the
 * process callback that received it; the chain is invalid afterwards.
 * Returns 0, -EALREADY (completed before), -EINVAL, or -EIO when the ring
 * broke (the queue stops; nothing to do). Worker thread.
 */
int vhd_chain_complete(struct vhd_chain *chain, uint32_t written);

/* The writable bytes of chain (sum of the writable segments' lengths). Worker thread. */
uint32_t vhd_chain_writable(const struct vhd_chain *chain);

/*
 * vhd_custom_update_config - change len bytes of a custom device's config
 * space at off (off + len <= config_size) and, during a session, tell the
 * front-end (a configuration change notification, when it negotiated the
 * channel for it). 0, -EINVAL, -ENOTSUP (not a custom device). Control thread.
 */
int vhd_custom_update_config(struct vhd_device *dev, const void *buf, uint32_t off, uint32_t len);

#ifdef __cplusplus
}
#endif

#endif /* VHOSTD_CUSTOM_H */
