/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The packet backend interface: what the virtio-net device (src/dev/net.c)
 * hands a frame to when the guest transmits, and the device's delivery verb
 * a backend calls to put a frame into a guest receive queue. Backends:
 * "loopback" (net_loopback.c: every frame comes back on the same pair),
 * "switch" (net_switch.c: an in-process L2 learning switch between
 * devices), "tap" (net_tap.c: a Linux TAP interface) and "gen" (net_gen.c:
 * a generator filling receive queues and a sink for transmitted frames).
 * This header is all a backend sees of the device: backends include it, never
 * src/dev/ (scripts/check-layers.sh checks this).
 */
#ifndef VHD_NET_BACKEND_H
#define VHD_NET_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "spec/virtio_net.h"
#include "runtime/dev.h"

struct vhd_net_backend;
struct vhd_worker;

/*
 * Limits of a single frame, kept by the device, and why.
 *
 * VHD_NET_MAX_FRAME: largest frame (without the virtio header) taken from a
 * transmit queue: 64 KiB plus an Ethernet header and a VLAN tag: a
 * 65535-byte MTU plus headers, or a segmentation-offload frame (its IP
 * packet is at most 64 KiB too); larger chains are counted as errors.
 *
 * VHD_NET_CHAIN_IOV: most segments of one chain (transmit, receive or
 * control), so a frame's iovcnt never exceeds it. Linux sends at most
 * MAX_SKB_FRAGS (17, configurable up to 45) + 2 descriptors per packet and
 * each may cross a memory region boundary; DPDK sends one or two. A chain
 * with more segments stops the queue (VHD_VQ_E_IOV_FULL, NEEDS_RESET).
 */
#define VHD_NET_MAX_FRAME (65536u + 14u + 4u)
#define VHD_NET_CHAIN_IOV 128u

/*
 * One frame in guest memory, as the device parsed it from a transmit chain.
 * The header was copied out of guest memory once and validated (no double
 * fetch); the frame bytes are still in the guest's buffers: iov[0..iovcnt)
 * hold the header and then the frame, which starts `off` bytes in.
 * Everything here is valid only during the call it is passed to.
 */
struct vhd_net_frame {
    struct virtio_net_hdr_v1 hdr; /* the sender's header (wire order, num_buffers 0) */
    const struct iovec *iov;      /* header + frame */
    uint32_t iovcnt;
    uint32_t off; /* where the frame starts (12: after the header) */
    uint32_t len; /* frame bytes from the Ethernet header on */
};

/* What open() is given. */
struct vhd_net_backend_opts {
    const char *name;        /* the device's name, for logs */
    uint32_t pairs;          /* queue pairs of the device */
    const char *switch_name; /* switch: the switch to join (switch=NAME) */
    const char *tap_name;    /* tap: the interface to attach to or create (tap=IFNAME) */
};

struct vhd_net_backend_ops {
    const char *name; /* "loopback" */

    /*
     * open - create a backend instance serving dev. Returns 0 and *out, or
     * -errno with a one-line message in err (if err != NULL). Control thread.
     */
    int (*open)(const struct vhd_net_backend_opts *o, struct vhd_dev *dev,
                struct vhd_net_backend **out, char *err, size_t errlen);

    /* close - release everything; no queue of the device may be attached. Control thread. */
    void (*close)(struct vhd_net_backend *be);

    /*
     * tx - the guest sent f on queue pair `pair`. Called on the worker that
     * owns the pair (self), in the middle of a burst; must not block. f and
     * the guest memory it points to are valid only during the call: a
     * backend that keeps a frame copies it.
     * Returns 0 when the frame was taken (delivered, queued, or dropped and
     * counted by the receiving ring), or -errno when nobody could take it
     * (the device counts a transmit drop): -ENODEV no receiver (ring
     * stopped or disabled), -ENOBUFS backend queue full.
     */
    int (*tx)(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
              const struct vhd_net_frame *f);

    /*
     * tx_burst - optional: tx for the frames f[0..n) of one transmit burst,
     * in order, with the same contract per frame, reported as a count:
     * returns how many frames tx would have failed (the device counts that
     * many transmit drops). The device calls it instead of tx when it is
     * set, so a backend that delivers into a receive queue (loopback) does
     * so with one vhd_net_deliver_burst for the whole burst.
     */
    unsigned (*tx_burst)(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                         const struct vhd_net_frame *f, unsigned n);

    /*
     * rx_poll - optional (NULL for loopback, which delivers from tx): the
     * receive queue of `pair` is being processed on self; deliver up to
     * budget waiting frames with vhd_net_deliver() or, better, in bursts with
     * vhd_net_deliver_burst(). Returns frames handled.
     */
    int (*rx_poll)(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                   unsigned budget);

    /*
     * rx_wake_fd - optional: an fd whose readiness means rx_poll of `pair`
     * has work (switch: a doorbell eventfd; tap: the pair's TAP fd). The
     * device passes it to the runtime (vhd_dev_ops.queue_wake_fd), which
     * watches it edge-triggered on the receive queue's worker and then
     * processes that queue. Must stay open until close(). -1: none.
     */
    int (*rx_wake_fd)(struct vhd_net_backend *be, uint16_t pair);

    /*
     * rx_buffers_are_work - the backend always has frames to deliver (gen),
     * so receive buffers the driver posts are work: the receive queues are
     * not passive (runtime/dev.h) and run whenever buffers are posted. false
     * for backends whose frames arrive from elsewhere (wake fd, transmit).
     */
    bool rx_buffers_are_work;

    /*
     * set_features - optional: the driver's negotiated feature bits
     * (SET_FEATURES; 0 at reset), for a backend that tunes itself to what
     * the guest accepts (tap: TUNSETOFFLOAD from the GUEST_* offloads, so
     * the kernel hands over segmentation-offload frames only to a guest
     * that takes them). Control thread, every queue detached. 0 or -errno
     * (the features are then refused).
     */
    int (*set_features)(struct vhd_net_backend *be, uint64_t features);
};

/*
 * The common head of every backend instance (each backend embeds it first).
 * Set by open() and read-only afterwards, so any thread may read it.
 */
struct vhd_net_backend {
    const struct vhd_net_backend_ops *ops;
    struct vhd_dev *dev; /* the device served */
    /*
     * Offload feature bits (VIRTIO_NET_F_CSUM, GUEST_CSUM, HOST_TSO4,
     * GUEST_TSO4, ...) the backend can honour; the device offers them in
     * addition to its own. A HOST_* segmentation bit means the backend
     * takes frames with that gso_type (tx); a GUEST_* bit means it may hand
     * such frames to vhd_net_deliver, which passes them only to a receive
     * queue whose driver negotiated the bit. Backends that connect guests
     * to each other or to themselves (loopback, switch) offer none: a
     * receiver without GUEST_TSO would need software segmentation.
     */
    uint64_t offloads;
    char desc[128]; /* for logs: e.g. "loopback" */
};

extern const struct vhd_net_backend_ops vhd_net_backend_loopback;
extern const struct vhd_net_backend_ops vhd_net_backend_switch;
extern const struct vhd_net_backend_ops vhd_net_backend_tap;
extern const struct vhd_net_backend_ops vhd_net_backend_gen;

/* ---- what the device offers its backends (implemented in src/dev/net.c) ---- */

/* Is dev a net device (created by vhd_net_new)? Any thread. */
bool vhd_dev_is_net(const struct vhd_dev *dev);

/* The MAC currently in config space (after any VIRTIO_NET_CTRL_MAC_ADDR_SET). */
void vhd_net_get_mac(const struct vhd_dev *dev, uint8_t mac[6]);

/* The backend instance of a net device (set at creation, read-only). Any thread. */
const struct vhd_net_backend *vhd_net_backend_of(const struct vhd_dev *dev);

/* The backend called name ("loopback"), or NULL. Implemented in net.c. */
const struct vhd_net_backend_ops *vhd_net_backend_find(const char *name);

/*
 * vhd_net_deliver - copy frame f into the receive queue of `pair` of the
 * net device dev: one copy from wherever f lives into the guest's receive
 * buffers, with the header rewritten for the receiving driver (num_buffers,
 * and the checksum completed in software when the sender left it partial
 * and the receiver did not negotiate VIRTIO_NET_F_GUEST_CSUM). The frame is
 * published at once (one flush); the notification decision is made once per
 * worker turn (vhd_queue_mark_used). Several frames: vhd_net_deliver_burst.
 *
 * Must be called on worker self, and delivers only when that worker owns
 * the receive ring (it is attached there, started and enabled) and pair is
 * among the pairs in use; spreading a device's pairs so that both rings of
 * a pair share a worker is what makes loopback delivery possible.
 * Returns 0 (delivered), or:
 *  -ENODEV  receive ring not available to self (stopped, disabled, pair
 *           not in use, another worker): not counted, the caller drops;
 *  -ENOBUFS not enough receive buffers (5.1.6.4: the device drops it);
 *  -EMSGSIZE larger than mtu allows, or than one buffer without MRG_RXBUF;
 *  -EIO     the receive ring is broken (bad buffers; NEEDS_RESET).
 * All but -ENODEV are counted as drops of the receive queue.
 */
int vhd_net_deliver(struct vhd_dev *dev, uint16_t pair, struct vhd_worker *self,
                    const struct vhd_net_frame *f);

/*
 * vhd_net_deliver_burst - vhd_net_deliver for the frames f[0..n), in order,
 * as a burst: the receive queue is checked once; then, for runs of up to 32
 * frames, the receive buffers of every frame of the run are popped (and the
 * first line of each prefetched), then each frame is copied and its
 * buffers pushed as used, and the run is published with one flush; the
 * runtime makes one notification decision per turn (vhd_queue_mark_used,
 * EVENT_IDX honoured). Each frame meets the
 * same checks, limits and header rewriting as with vhd_net_deliver, and
 * rc[i] (when rc != NULL) gets the value vhd_net_deliver would return for
 * it. Frames that fail do not disturb the others: a frame too large, or
 * one that finds too few buffers, leaves the ring as it found it (the next
 * frame may fit). When a frame finds no buffer at all or the ring breaks
 * (-ENOBUFS, -EIO), every later frame gets the same result untried; a ring the engine breaks in
 * the middle of a run fails the run's frames not yet copied with -EIO
 * (nothing can be published any more), while an unusable buffer
 * (NEEDS_RESET) fails only its frame and the later ones: the frames before
 * it are delivered.
 * flags: VHD_NET_DELIVER_STOP: stop after the first frame that is not
 * delivered (a generator that makes frames only as fast as they are taken).
 * VHD_NET_DELIVER_ONE_RC: rc points at one int, set to -ENODEV when the
 * ring is not available to self (no frame was counted anywhere) and left
 * alone otherwise (every frame was delivered or counted as a drop).
 * Returns the frames handled from the front: n, or with
 * VHD_NET_DELIVER_STOP up to and including the first failure (1 when the
 * ring is not available to self: -ENODEV). Same calling rules as
 * vhd_net_deliver; all but -ENODEV are counted as drops.
 */
#define VHD_NET_DELIVER_STOP   1u
#define VHD_NET_DELIVER_ONE_RC 2u
unsigned vhd_net_deliver_burst(struct vhd_dev *dev, uint16_t pair, struct vhd_worker *self,
                               const struct vhd_net_frame *f, unsigned n, unsigned flags, int *rc);

#endif /* VHD_NET_BACKEND_H */
