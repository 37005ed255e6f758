/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libvhostd virtio-net driver: a userspace virtio-net driver that talks
 * vhost-user to any back-end (vhostd, DPDK's vhost PMD, ...) over a Unix
 * socket, without a VM. Its "guest memory" is memfd-backed shared memory of
 * this process. The device has N queue pairs (receiveqN = 2N, transmitqN =
 * 2N + 1, virtio 1.2 section 5.1.2); each pair is owned by one thread.
 *
 * Typical use:
 *
 *     struct vhd_netdrv_opts o = { .socket_path = "/run/vm-net.sock", .num_pairs = 2 };
 *     struct vhd_netdrv *d;
 *     char err[256];
 *     if (vhd_netdrv_connect(&o, &d, err, sizeof(err)) < 0) ... report err ...
 *     // in thread i:
 *     struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, i);
 *     struct iovec f = { frame, 60 };
 *     int sent = vhd_netdrv_tx_burst(p, &f, 1);   // 0 when the TX ring is full
 *     int got = vhd_netdrv_rx_burst(p, on_frame, arg, 32);
 *     // when every thread is done:
 *     vhd_netdrv_disconnect(d);
 *
 * Receive buffers are pre-posted at connect from a per-pair pool in the
 * shared memory and re-posted as soon as a frame was handed to the caller.
 * Transmit copies each frame once, behind a zeroed 12-byte virtio_net_hdr,
 * into a per-pair TX slot in shared memory; a slot is free again when the
 * device has used it. The control queue is optional (opts.ctrl_vq):
 * without it every pair the device offers is active, like DPDK's
 * virtio-user.
 *
 * Conventions: functions return 0 (or a count) or a negative errno and never
 * set errno.
 *
 * Threading: connect and disconnect are control calls: no pair call may run
 * concurrently with them. Every vhd_netdrv_pair call must come from the one
 * thread that owns that pair at the time. Different pairs are fully
 * independent: no locks, no shared writable state.
 */
#ifndef VHOSTD_NET_DRIVER_H
#define VHOSTD_NET_DRIVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#ifdef __cplusplus
extern "C" {
#endif

struct vhd_netdrv;      /* one device: a vhost-user session and its queue pairs */
struct vhd_netdrv_pair; /* one RX + TX ring pair, owned by one thread */

/* Length of the virtio-net header in front of every frame (virtio 1.x, 5.1.6). */
#define VHD_NETDRV_HDR_LEN 12u
/* Most queue pairs one driver uses. */
#define VHD_NETDRV_MAX_PAIRS 64u

struct vhd_netdrv_opts {
    const char *socket_path; /* the back-end's listening socket (required) */
    uint32_t num_pairs;      /* queue pairs to use, 1..64 (0: 1); > 1 needs VIRTIO_NET_F_MQ */
    uint32_t queue_size;     /* ring entries (0: 256); a power of two for split rings */
    bool packed;             /* packed ring layout (-ENOTSUP when not offered) */
    bool mrg_rxbuf;          /* negotiate VIRTIO_NET_F_MRG_RXBUF (-ENOTSUP when not offered) */
    bool no_event_idx;       /* do not negotiate VIRTIO_F_EVENT_IDX */
    /*
     * Bytes of each receive buffer, header included (0: 2048). Without
     * MRG_RXBUF a frame must fit one buffer; with it, a frame may span
     * several (num_buffers). At least 64.
     */
    uint32_t rx_buf_size;
    /* Largest frame transmitted, without the header (0: 2048 - 12). */
    uint32_t max_tx_frame;
    int timeout_ms; /* bound on connecting and on each control exchange (0: 5000) */
    /*
     * Run the control queue (VIRTIO_NET_F_CTRL_VQ, with CTRL_RX,
     * CTRL_MAC_ADDR and GUEST_ANNOUNCE when offered; -ENOTSUP when the
     * device has no control queue): vhd_netdrv_ctrl. With MQ the device
     * then uses one pair until told otherwise; connect sends
     * VQ_PAIRS_SET(num_pairs). When the back-end offers BACKEND_REQ and
     * CONFIG, a back-end channel carries its config change notifications
     * (vhd_netdrv_config_wait).
     */
    bool ctrl_vq;
    /*
     * Offload features to negotiate when the device offers them: a mask of
     * virtio-net feature bits (1 << n) among CSUM (0), GUEST_CSUM (1),
     * GUEST_TSO4/TSO6/ECN/UFO (7..10) and HOST_TSO4/TSO6/ECN/UFO (11..14);
     * others are ignored. info.features says what was negotiated. Frames
     * that use them go out with vhd_netdrv_tx_hdr; received frames report
     * their header's flags and gso_type.
     */
    uint64_t offloads;
    /*
     * Act as the device's IOMMU (VIRTIO_F_ACCESS_PLATFORM, vhost-user "IOMMU
     * support"): 0 off; else the IOMMU page size, a power of two from 4096 to
     * 1 GiB (2 MiB: huge-page mappings). The rings are mapped once at
     * connect; each receive buffer is mapped while it is posted and each TX
     * slot while its frame is in flight (IOTLB UPDATE, acknowledged, then
     * INVALIDATE), at IOVAs unrelated to the memory's guest-physical
     * addresses, so a back-end that ignores the IOTLB fails. Needs a back-end
     * that offers ACCESS_PLATFORM, BACKEND_REQ and REPLY_ACK (-ENOTSUP with
     * the reason otherwise). A thread of the driver answers the back-end's
     * IOTLB misses on the back-end channel and passes config change
     * notifications on to vhd_netdrv_config_wait.
     */
    uint64_t iommu_page_size;
    /* Strict: INVALIDATE at each unmap and wait for the ack (Linux intel_iommu=strict); else lazy.
     */
    bool iommu_strict;
    uint32_t iommu_batch; /* lazy: INVALIDATEs go out every this many unmaps (0: 32) */
    /*
     * Map TX slots read-only and receive buffers write-only, as the device
     * uses them (else read-write: DPDK's vhost asks read-write access to
     * receive buffers and fails with write-only ones).
     */
    bool iommu_exact_perms;
    /*
     * Map each pair's receive buffers and TX slots once at connect, one
     * IOTLB entry per page, and leave them mapped (a guest that maps its
     * packet pools for good, as DPDK on vfio-pci does): no IOTLB message
     * per frame.
     */
    bool iommu_static;
    /*
     * Do not negotiate VIRTIO_F_IN_ORDER. By default the driver negotiates
     * it when offered (as DPDK's virtio-user does): the device may then use
     * a batch of transmitted frames with one used entry.
     */
    bool no_in_order;
};

/* What was negotiated and read from the device. */
struct vhd_netdrv_info {
    uint64_t features;        /* negotiated virtio feature bits */
    uint8_t mac[6];           /* config mac (zero when VIRTIO_NET_F_MAC or CONFIG is missing) */
    uint16_t status;          /* config status (VIRTIO_NET_S_LINK_UP assumed without STATUS) */
    uint32_t device_pairs;    /* pairs the device has (max_virtqueue_pairs / GET_QUEUE_NUM) */
    uint32_t queue_num;       /* the GET_QUEUE_NUM reply (queue pairs for net; 1 without MQ) */
    uint32_t num_pairs;       /* pairs in use */
    uint32_t queue_size;      /* ring entries per queue */
    uint32_t rx_buf_size;     /* bytes of each receive buffer, header included */
    uint32_t max_tx_frame;    /* largest frame tx_burst takes */
    bool packed;              /* packed rings in use */
    bool event_idx;           /* VIRTIO_F_EVENT_IDX in use */
    bool mrg_rxbuf;           /* VIRTIO_NET_F_MRG_RXBUF in use */
    bool reply_ack;           /* the session uses REPLY_ACK */
    bool ctrl_vq;             /* the control queue runs */
    bool config_notify;       /* config change notifications arrive (back-end channel) */
    uint64_t iommu_page_size; /* the driver is the IOMMU with pages of this size (0: off) */
    bool in_order;            /* VIRTIO_F_IN_ORDER in use */
};

/* IOTLB traffic of a driver acting as the IOMMU, since connect. */
struct vhd_netdrv_iommu_stats {
    uint64_t updates;     /* UPDATE messages acknowledged (misses answered included) */
    uint64_t invalidates; /* INVALIDATE messages acknowledged */
    uint64_t misses;      /* MISS messages from the back-end */
    uint64_t misses_bad;  /* ... for IOVAs not mapped (left unanswered, as the spec says) */
    uint64_t mapped;      /* buffers and rings mapped now */
};

/*
 * One received frame as rx_burst hands it over, zero-copy: iovcnt segments
 * in the receive buffers (more than one only with MRG_RXBUF), valid until
 * the callback returns. The header is not part of the segments.
 */
struct vhd_netdrv_rxframe {
    const struct iovec *iov;
    unsigned iovcnt;
    uint32_t len;         /* frame bytes, header excluded */
    uint16_t num_buffers; /* receive buffers the device used (header's num_buffers) */
    uint8_t hdr_flags;    /* the header's flags (VIRTIO_NET_HDR_F_*) */
    uint8_t gso_type;     /* the header's gso_type */
};

typedef void (*vhd_netdrv_rx_cb)(void *arg, const struct vhd_netdrv_rxframe *f);

/* Per-pair counters (owner thread's view). */
struct vhd_netdrv_pair_stats {
    uint64_t tx_packets; /* frames made available on TX */
    uint64_t tx_bytes;   /* their bytes, header excluded */
    uint64_t tx_done;    /* TX buffers the device used */
    uint64_t rx_packets; /* frames received */
    uint64_t rx_bytes;   /* their bytes, header excluded */
    uint64_t rx_buffers; /* receive buffers consumed (> rx_packets with merging) */
    uint64_t rx_errors;  /* frames dropped for a malformed used element or header */
    uint64_t kicks;      /* kick eventfd writes (both rings) */
    uint64_t sleeps;     /* waits that blocked on a call eventfd */
};

/*
 * vhd_netdrv_connect - create the shared memory, connect to the back-end,
 * negotiate (VERSION_1, MQ for more than one pair, MRG_RXBUF and packed
 * when asked for, EVENT_IDX when offered, MAC/STATUS for the config),
 * start every ring of the pairs asked for and post the receive buffers. On
 * failure a one-line reason goes to err (when not NULL) and nothing is left
 * behind. Returns 0 with *out, or -EINVAL (bad options), -ENOTSUP (the
 * device lacks what was asked), -ETIMEDOUT, -ECONNRESET, -EPROTO, -EIO or a
 * socket errno.
 */
int vhd_netdrv_connect(const struct vhd_netdrv_opts *opts, struct vhd_netdrv **out, char *err,
                       size_t errlen);

/*
 * vhd_netdrv_disconnect - stop every ring (GET_VRING_BASE), close the
 * session and free everything. Frames in flight are dropped. NULL is a no-op.
 */
void vhd_netdrv_disconnect(struct vhd_netdrv *d);

/* Negotiated parameters. */
const struct vhd_netdrv_info *vhd_netdrv_get_info(const struct vhd_netdrv *d);

/* One line describing the last control failure ("" when none). */
const char *vhd_netdrv_errmsg(const struct vhd_netdrv *d);

/* Pair i (0 .. num_pairs - 1), or NULL. */
struct vhd_netdrv_pair *vhd_netdrv_get_pair(struct vhd_netdrv *d, uint32_t i);

/* Index of a pair. */
uint32_t vhd_netdrv_pair_index(const struct vhd_netdrv_pair *p);

/*
 * vhd_netdrv_tx_burst - transmit up to n frames (frames[k] is one frame,
 * 1..max_tx_frame bytes; the header is added here). Used TX buffers are
 * reaped first. The frames are published with one index update and at most
 * one kick. Returns how many were queued (fewer than n when the ring is
 * full; 0 then), -EINVAL for a bad length (nothing after it is sent), or
 * -EIO when the device broke the ring protocol.
 */
int vhd_netdrv_tx_burst(struct vhd_netdrv_pair *p, const struct iovec *frames, unsigned n);

/*
 * vhd_netdrv_tx_hdr - transmit one frame behind the given 12-byte
 * virtio_net_hdr (flags, gso_type, hdr_len, gso_size, csum_start,
 * csum_offset, little-endian, as in virtio 1.2 5.1.6; num_buffers is
 * zeroed): checksum and segmentation offloads the session negotiated.
 * Returns 1 when queued, 0 when the ring is full, -EINVAL for a bad
 * length, -EIO.
 */
int vhd_netdrv_tx_hdr(struct vhd_netdrv_pair *p, const struct iovec *frame, const void *hdr);

/*
 * vhd_netdrv_tx_reap - collect used TX buffers. Returns how many (their
 * slots are free again), or -EIO.
 */
int vhd_netdrv_tx_reap(struct vhd_netdrv_pair *p);

/* TX frames queued and not yet used by the device. */
unsigned vhd_netdrv_tx_inflight(const struct vhd_netdrv_pair *p);

/*
 * vhd_netdrv_rx_burst - hand up to max received frames to cb, in order,
 * then re-post their buffers (one index update, at most one kick). A frame
 * whose buffers have not all been used yet (MRG_RXBUF) waits for the next
 * call. Malformed frames (a used length beyond the buffer, num_buffers 0 or
 * too large) are counted in rx_errors and dropped. Returns the number of
 * frames given to cb, or -EIO when the device broke the ring protocol.
 */
int vhd_netdrv_rx_burst(struct vhd_netdrv_pair *p, vhd_netdrv_rx_cb cb, void *arg, unsigned max);

/*
 * vhd_netdrv_rx_copy - receive one frame into buf (linearised; a frame
 * longer than len is truncated to len). Returns the frame's full length, 0
 * when none is ready, or -EIO.
 */
int vhd_netdrv_rx_copy(struct vhd_netdrv_pair *p, void *buf, size_t len);

/*
 * vhd_netdrv_wait - interrupt-driven completion: when neither ring has a
 * used element, ask the device for notifications on both, check again (one
 * may have slipped in), and block on the call eventfds. Returns 1 when
 * something is ready (call rx_burst / tx_reap), 0 after timeout_ms (< 0: no
 * limit), or -errno. Notifications are off again when it returns.
 */
int vhd_netdrv_wait(struct vhd_netdrv_pair *p, int timeout_ms);

/*
 * vhd_netdrv_ctrl - one control-queue command (virtio 1.2, 5.1.6.5): class,
 * command and len bytes of data (the spec's values, VIRTIO_NET_CTRL_*),
 * then wait, bounded by the session timeout, for the device's ack. Returns
 * 0 when the device answered VIRTIO_NET_OK, -EINVAL when it answered
 * VIRTIO_NET_ERR, -ENOTSUP without a control queue, -E2BIG for more than
 * VHD_NETDRV_CTRL_MAX bytes of data, -ETIMEDOUT (the control queue is then
 * unusable: -EIO from then on). Control call; commands run one at a time.
 */
#define VHD_NETDRV_CTRL_MAX 1024u
int vhd_netdrv_ctrl(struct vhd_netdrv *d, uint8_t cls, uint8_t cmd, const void *data, size_t len);

/*
 * vhd_netdrv_config_wait - wait up to timeout_ms (< 0: no limit) for a
 * configuration change notification from the device, then re-read mac and
 * status into the info (vhd_netdrv_get_info). When status has
 * VIRTIO_NET_S_ANNOUNCE (2) the device asks for an announcement: send
 * gratuitous packets, then VIRTIO_NET_CTRL_ANNOUNCE_ACK (class 3, command
 * 0) through vhd_netdrv_ctrl. Returns 1 after a notification, 0 on timeout,
 * -ENOTSUP without a back-end channel (info.config_notify), -ECONNRESET when
 * the back-end closed it. Control call.
 */
int vhd_netdrv_config_wait(struct vhd_netdrv *d, int timeout_ms);

/* vhd_netdrv_read_config - re-read mac and status from config space into the info. 0 or -errno. */
int vhd_netdrv_read_config(struct vhd_netdrv *d);

/*
 * vhd_netdrv_send_rarp - ask the back-end to announce mac (SEND_RARP, what
 * a front-end does after a migration); -ENOTSUP when the back-end lacks
 * the RARP protocol feature. Control call.
 */
int vhd_netdrv_send_rarp(struct vhd_netdrv *d, const uint8_t mac[6]);

/*
 * vhd_netdrv_iommu_stats - IOTLB counters (opts.iommu_page_size): 0, or
 * -ENOTSUP when the driver is not the IOMMU. Any thread.
 */
int vhd_netdrv_iommu_stats(struct vhd_netdrv *d, struct vhd_netdrv_iommu_stats *s);

/* Counters of the pair since connect. */
void vhd_netdrv_pair_stats(const struct vhd_netdrv_pair *p, struct vhd_netdrv_pair_stats *s);

#ifdef __cplusplus
}
#endif

#endif /* VHOSTD_NET_DRIVER_H */
