/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The virtio-net device (virtio 1.2, section 5.1; virtio 1.x only):
 * creation from options, the struct vhd_dev_ops the transport and runtime
 * drive, the queue -> worker map that keeps both rings of a queue pair on
 * one worker, and per-queue counters. Frames go to a packet backend
 * (src/backend/net_backend.h).
 */
#ifndef VHD_DEV_NET_H
#define VHD_DEV_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/net_backend.h"
#include "runtime/dev.h"

/*
 * Most queue pairs a device may have. The vhost-user ring index of
 * SET_VRING_KICK/CALL/ERR is 8 bits, so 2 * pairs + 1 (control queue) must
 * stay below 256; 64 pairs is well above the 16 the issue asks for and
 * bounds the per-device memory.
 */
#define VHD_NET_MAX_PAIRS 64u

/* Default MTU reported in config space (VIRTIO_NET_F_MTU). */
#define VHD_NET_DEFAULT_MTU 1500u

/*
 * Most receive buffers one packet may be merged into (MRG_RXBUF). 64 KiB
 * into Linux's smallest mergeable buffers (about 1.5 KiB) takes 44; a
 * packet needing more is dropped. (The limits a backend sees too,
 * VHD_NET_MAX_FRAME and VHD_NET_CHAIN_IOV, are in backend/net_backend.h.)
 */
#define VHD_NET_RX_MAX_BUFS 128u

/* Options of vhd_net_new(). Zero-initialise, then set what you need. */
struct vhd_net_opts {
    const char *name;        /* for logs (dev->name); default "net" */
    const char *backend;     /* "loopback" (default), "switch", "tap" */
    const char *switch_name; /* backend switch: the switch to join */
    const char *tap_name;    /* backend tap: the TAP interface */
    uint32_t pairs;          /* queue pairs, 1..VHD_NET_MAX_PAIRS; 0: 1 */
    const uint8_t *mac;      /* 6 bytes, unicast; NULL: 52:54:00 + 3 bytes hashed from name */
    uint32_t mtu;            /* VHD_NET_MIN_MTU..65535; 0: VHD_NET_DEFAULT_MTU */
    bool allow_packed;       /* offer VIRTIO_F_RING_PACKED */
    bool no_split;           /* refuse split rings (set_features requires RING_PACKED) */
};

/*
 * vhd_net_new - create a virtio-net device: allocates the struct vhd_dev
 * (ops = &vhd_net_ops, name, num_queues = 2 * pairs + 1 in the order rx0,
 * tx0, rx1, tx1, ..., control queue last; each queue's index set, fds at
 * -1) and a default queue_worker map in which queue q runs on worker q / 2
 * (modulo the worker count: both rings of a pair together), and opens the
 * backend. Control thread.
 * Returns 0 and *out, or -errno (-EINVAL for bad options) with a one-line
 * message in err (when err != NULL).
 */
int vhd_net_new(const struct vhd_net_opts *o, struct vhd_dev **out, char *err, size_t errlen);

/*
 * vhd_net_free - free a device from vhd_net_new: every queue must be
 * detached; remaining per-queue state is finalised, the backend closed,
 * dev->queue_worker freed. NULL is fine. Control thread.
 */
void vhd_net_free(struct vhd_dev *dev);

extern const struct vhd_dev_ops vhd_net_ops;

/*
 * vhd_net_assign_workers - replace dev->queue_worker: both rings of pair i
 * go to one worker, list[i % nlist] when nlist > 0, otherwise
 * (*next_rr)++ % nworkers, so the pairs of several devices spread over
 * all workers; the control queue goes with pair 0. 0 or -ENOMEM/-EINVAL.
 * Control thread, with every queue detached.
 */
int vhd_net_assign_workers(struct vhd_dev *dev, const int *list, unsigned nlist, unsigned nworkers,
                           unsigned *next_rr);

/* Queue pairs configured (max_virtqueue_pairs). */
uint32_t vhd_net_pairs(const struct vhd_dev *dev);

/*
 * Per-queue counters. Receive queue: frames delivered (packets, bytes
 * without the virtio header, buffers used), drops for lack of buffers or
 * size, errors (unusable receive buffers). Transmit queue: frames taken
 * from the guest (packets, bytes), of which drops were discarded (the ring
 * is disabled, or the receiving ring is disabled or stopped); errors are
 * malformed chains (not in packets, never sent). Control queue: packets
 * = commands, errors = commands answered VIRTIO_NET_ERR. With loopback,
 * over a device:
 *   sum(tx packets) = sum(rx packets) + sum(rx drops) + sum(tx drops).
 */
struct vhd_net_queue_stats {
    uint64_t packets;
    uint64_t bytes;
    uint64_t drops;
    uint64_t errors;
    uint64_t buffers; /* receive: buffers used (> packets with merged buffers) */
    uint64_t largest; /* longest frame seen, bytes (without the virtio-net header): above the
                         MTU only when segmentation offloads are in use */
};

/*
 * vhd_net_queue_stats - q's counters since the session started: those of
 * the ring's earlier starts plus the live ones. Any thread may call it at
 * any time (the worker stores its counters with relaxed atomic stores; a
 * snapshot may be a burst old). Control thread for the totals part.
 * -EINVAL for a bad index.
 */
int vhd_net_queue_stats(const struct vhd_dev *dev, uint32_t q, struct vhd_net_queue_stats *out);

/*
 * vhd_net_log_stats - one info line per queue that saw traffic, of the form
 * "NAME: stats (WHY): queue Q (rx|tx|ctrl P): packets=.. bytes=.. drops=..
 * errors=.. buffers=.. largest=..", then a device total line. Control thread.
 */
void vhd_net_log_stats(const struct vhd_dev *dev, const char *why);

/*
 * vhd_net_announce - set VIRTIO_NET_S_ANNOUNCE in the status (5.1.6.5.4)
 * and dev->config_changed, so the transport sends a configuration change
 * notification; the driver announces itself and answers with
 * VIRTIO_NET_CTRL_ANNOUNCE_ACK, which clears the bit. -EOPNOTSUPP unless
 * GUEST_ANNOUNCE and CTRL_VQ were negotiated. The device does this itself
 * when a session resumes rings an earlier one used (a reconnect: the
 * switch or the bridge behind a TAP may have forgotten the guest's MAC)
 * and on SEND_RARP when the control queue runs. Control thread.
 */
int vhd_net_announce(struct vhd_dev *dev);

/*
 * Queue pairs in use: max_virtqueue_pairs until the driver's control queue
 * starts, then 1 until VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET (5.1.6.5.5).
 */
uint32_t vhd_net_curr_pairs(const struct vhd_dev *dev);

/* Default MAC for a device: 52:54:00 followed by 3 bytes of an FNV-1a hash of key. */
void vhd_net_default_mac(const char *key, uint8_t mac[6]);

#endif /* VHD_DEV_NET_H */
