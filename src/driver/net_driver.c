/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The userspace virtio-net driver (public API in include/vhostd/net_driver.h):
 * shared-memory layout per queue pair (two ring areas, the receive buffer
 * pool, the TX slots), session set-up over the vhost-user front-end
 * (vu_frontend.c), transmit with one copy behind a zeroed header, receive
 * with num_buffers handling (virtio 1.2, 5.1.6.3 and 5.1.6.4), and
 * completion by polling or by the call eventfds.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/bits.h"
#include "util/clock.h"
#include "util/compiler.h"
#include "spec/virtio.h"
#include "spec/virtio_net.h"
#include "driver/drv_iommu.h"
#include "driver/drv_session.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "driver/vu_frontend.h"
#include "spec/vhost_user.h"
#include "transport/vu_sock.h"
#include "vhostd/net_driver.h"

#define DEFAULT_QUEUE_SIZE 256u
#define DEFAULT_BUF_SIZE   2048u /* a standard frame plus header in one buffer, like Linux */
#define MIN_RX_BUF_SIZE    64u   /* header plus a useful piece of frame */
#define MAX_TX_FRAME       (65536u + 14u + 4u) /* the device's VHD_NET_MAX_FRAME */
#define PAGE               4096u
#define PAGE_ALIGN(v)      (((v) + PAGE - 1) & ~(uint64_t)(PAGE - 1))
#define LINE_ALIGN(v)      (((v) + VHD_CACHELINE - 1) & ~(uint64_t)(VHD_CACHELINE - 1))
/* Guest-physical address of the region: above 0, like a VM's RAM, so GPA 0 is never valid. */
#define GPA_BASE 0x100000ull

_Static_assert(VHD_NETDRV_HDR_LEN == sizeof(struct virtio_net_hdr_v1), "header length");

/* Offload features opts.offloads may ask for (5.1.3). */
#define OFFLOAD_BITS                                                                             \
    (BIT(VIRTIO_NET_F_CSUM) | BIT(VIRTIO_NET_F_GUEST_CSUM) | BIT(VIRTIO_NET_F_HOST_TSO4) |       \
     BIT(VIRTIO_NET_F_HOST_TSO6) | BIT(VIRTIO_NET_F_HOST_ECN) | BIT(VIRTIO_NET_F_HOST_UFO) |     \
     BIT(VIRTIO_NET_F_GUEST_TSO4) | BIT(VIRTIO_NET_F_GUEST_TSO6) | BIT(VIRTIO_NET_F_GUEST_ECN) | \
     BIT(VIRTIO_NET_F_GUEST_UFO))

/* One ring of a pair: the driver-side ring and its two eventfds. */
struct netdrv_ring {
    struct vhd_drv_vq dq;
    int kick_fd;
    int call_fd;
    uint32_t index; /* vhost-user ring index (2 * pair for RX, + 1 for TX) */
    void *area;     /* ring area in shared memory */
    uint64_t area_gpa;
    size_t area_len;
};

/*
 * One queue pair. Written only by its owner thread (and by control calls
 * while the owner is quiescent, API contract); on its own cache lines.
 */
struct vhd_netdrv_pair {
    struct netdrv_ring rx, tx;
    uint32_t index;
    uint32_t qsize;
    bool mrg;
    bool broken; /* the device broke the ring protocol: every call fails with -EIO */

    /* Receive buffers: qsize of rx_buf_size bytes each, rx_stride apart. */
    uint8_t *rxbuf;
    uint64_t rxbuf_gpa;
    uint32_t rx_buf_size;
    uint32_t rx_stride;
    uint32_t *repost; /* buffer indices to give back to the device */
    uint32_t nrepost;
    uint32_t *pend; /* buffers of the frame being assembled (MRG_RXBUF) */
    uint32_t *pend_len;
    uint32_t npend;
    uint32_t pend_want; /* its num_buffers */
    struct iovec *iov;  /* qsize entries: the segments handed to the callback */

    /* The driver as the IOMMU (NULL: off): IOVAs of the mapped buffers, by index. */
    struct vhd_drv_iommu *io;
    uint64_t *rx_iova, *tx_iova;
    uint8_t rx_perm, tx_perm;

    /* TX slots: header + max_tx_frame bytes each, tx_stride apart. */
    uint8_t *txbuf;
    uint64_t txbuf_gpa;
    uint32_t tx_stride;
    uint32_t max_tx_frame;
    uint32_t *tx_free; /* stack of free slot indices */
    uint32_t tx_nfree;

    struct vhd_netdrv_pair_stats stats;
} vhd_cacheline_aligned;

/* Control queue command buffer: class, command, data; the ack byte at CTRL_ACK_OFF. */
#define CTRL_BUF_BYTES PAGE
#define CTRL_ACK_OFF   (CTRL_BUF_BYTES - 1)
_Static_assert(2 + VHD_NETDRV_CTRL_MAX < CTRL_ACK_OFF, "control data fits before the ack");

struct vhd_netdrv {
    struct vhd_netdrv_opts o;
    char *path;
    struct vhd_guestmem gm;
    struct vhd_vuf vuf;
    bool connected;
    struct vhd_netdrv_info info;
    struct vhd_netdrv_pair *p[VHD_NETDRV_MAX_PAIRS];
    /* control queue (opts.ctrl_vq): its ring, one command buffer, and the back-end channel */
    struct netdrv_ring ctrl;
    uint8_t *cbuf;
    uint64_t cbuf_gpa;
    bool ctrl_broken; /* a command went unanswered: the queue is out of step */
    int backend_fd;   /* our end of the SET_BACKEND_REQ_FD socket pair, or -1 */
    bool iommu;       /* opts.iommu_page_size: io is set up */
    struct vhd_drv_iommu io;
    int config_efd; /* with the IOMMU: its miss thread signals config changes here, or -1 */
    char err[256];
};

static int dfail(struct vhd_netdrv *d, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int dfail(struct vhd_netdrv *d, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, sizeof(d->err), fmt, ap);
    va_end(ap);
    return rc;
}

/* ======================= notifications ======================= */

static inline void kick(struct vhd_netdrv_pair *p, struct netdrv_ring *r)
{
    uint64_t one = 1;
    /* An eventfd write fails only when the counter would overflow: the device is signalled anyway.
     */
    ssize_t n = write(r->kick_fd, &one, sizeof(one));
    (void)n;
    p->stats.kicks++;
}

static inline void publish_and_kick(struct vhd_netdrv_pair *p, struct netdrv_ring *r)
{
    vhd_drv_vq_publish(&r->dq);
    if (vhd_drv_vq_kick_needed(&r->dq))
        kick(p, r);
}

/* ======================= IOMMU ======================= */

/*
 * With the IOMMU on, map len bytes at b for the device and store the IOVA in
 * *addr; without, *addr (the GPA) stays. A failure breaks the pair: the
 * session is gone or the back-end refuses its IOTLB.
 */
static inline int buf_map(struct vhd_netdrv_pair *p, const void *b, uint32_t len, uint8_t perm,
                          uint64_t *addr)
{
    if (!p->io)
        return 0;
    if (vhd_unlikely(vhd_drv_iommu_map(p->io, b, len, perm, addr) < 0)) {
        p->broken = true;
        return -EIO;
    }
    return 0;
}

static inline int buf_unmap(struct vhd_netdrv_pair *p, uint64_t iova)
{
    if (p->io && vhd_unlikely(vhd_drv_iommu_unmap(p->io, iova) < 0)) {
        p->broken = true;
        return -EIO;
    }
    return 0;
}

/* ======================= transmit ======================= */

int vhd_netdrv_tx_reap(struct vhd_netdrv_pair *p)
{
    int n = 0;

    if (vhd_unlikely(p->broken))
        return -EIO;
    for (;;) {
        void *ck;
        uint32_t len;
        int rc = vhd_drv_vq_get_used(&p->tx.dq, &ck, &len);
        if (rc == 0)
            break;
        if (vhd_unlikely(rc < 0)) {
            p->broken = true;
            return -EIO;
        }
        /* ck is slot + 1 of a request in flight (vring returns only those). */
        uint32_t slot = (uint32_t)((uintptr_t)ck - 1);
        p->tx_free[p->tx_nfree++] = slot;
        n++;
        if (buf_unmap(p, p->tx_iova ? p->tx_iova[slot] : 0) < 0)
            return -EIO;
    }
    p->stats.tx_done += (uint64_t)n;
    return n;
}

int vhd_netdrv_tx_burst(struct vhd_netdrv_pair *p, const struct iovec *frames, unsigned n)
{
    unsigned sent = 0;
    int rc = 0;

    if (vhd_unlikely(p->broken))
        return -EIO;
    if (p->tx_nfree < n && vhd_netdrv_tx_reap(p) < 0)
        return -EIO;
    for (; sent < n; sent++) {
        size_t len = frames[sent].iov_len;
        if (vhd_unlikely(len == 0 || len > p->max_tx_frame)) {
            rc = -EINVAL;
            break;
        }
        if (p->tx_nfree == 0)
            break;
        uint32_t slot = p->tx_free[p->tx_nfree - 1];
        uint8_t *b = p->txbuf + (size_t)slot * p->tx_stride;
        /*
         * 5.1.6.2: no offload asked for: flags, gso_type NONE, and the rest
         * zero (num_buffers is 0 on transmit). The device only reads the slot.
         */
        memset(b, 0, VHD_NETDRV_HDR_LEN);
        memcpy(b + VHD_NETDRV_HDR_LEN, frames[sent].iov_base, len);
        struct vhd_drv_buf buf = {.gpa = p->txbuf_gpa + (uint64_t)slot * p->tx_stride,
                                  .len = (uint32_t)(VHD_NETDRV_HDR_LEN + len)};
        if (buf_map(p, b, buf.len, p->tx_perm, &buf.gpa) < 0) {
            rc = -EIO;
            break;
        }
        if (p->io)
            p->tx_iova[slot] = buf.gpa;
        if (vhd_drv_vq_add(&p->tx.dq, &buf, 1, 0, false, (void *)(uintptr_t)(slot + 1)) < 0)
            break; /* ring full: cannot happen with one descriptor per slot, but survive it */
        p->tx_nfree--;
        p->stats.tx_bytes += len;
    }
    if (sent) {
        p->stats.tx_packets += sent;
        publish_and_kick(p, &p->tx);
    }
    return sent ? (int)sent : rc;
}

int vhd_netdrv_tx_hdr(struct vhd_netdrv_pair *p, const struct iovec *frame, const void *hdr)
{
    size_t len = frame->iov_len;

    if (vhd_unlikely(p->broken))
        return -EIO;
    if (len == 0 || len > p->max_tx_frame)
        return -EINVAL;
    if (p->tx_nfree == 0 && vhd_netdrv_tx_reap(p) < 0)
        return -EIO;
    if (p->tx_nfree == 0)
        return 0;
    uint32_t slot = p->tx_free[p->tx_nfree - 1];
    uint8_t *b = p->txbuf + (size_t)slot * p->tx_stride;
    memcpy(b, hdr, VHD_NETDRV_HDR_LEN);
    b[10] = b[11] = 0; /* num_buffers: 0 on transmit */
    memcpy(b + VHD_NETDRV_HDR_LEN, frame->iov_base, len);
    struct vhd_drv_buf buf = {.gpa = p->txbuf_gpa + (uint64_t)slot * p->tx_stride,
                              .len = (uint32_t)(VHD_NETDRV_HDR_LEN + len)};
    if (buf_map(p, b, buf.len, p->tx_perm, &buf.gpa) < 0)
        return -EIO;
    if (p->io)
        p->tx_iova[slot] = buf.gpa;
    if (vhd_drv_vq_add(&p->tx.dq, &buf, 1, 0, false, (void *)(uintptr_t)(slot + 1)) < 0)
        return 0;
    p->tx_nfree--;
    p->stats.tx_bytes += len;
    p->stats.tx_packets++;
    publish_and_kick(p, &p->tx);
    return 1;
}

unsigned vhd_netdrv_tx_inflight(const struct vhd_netdrv_pair *p)
{
    return p->qsize - p->tx_nfree;
}

/* ======================= receive ======================= */

static inline int rx_post(struct vhd_netdrv_pair *p, uint32_t idx)
{
    struct vhd_drv_buf buf = {.gpa = p->rxbuf_gpa + (uint64_t)idx * p->rx_stride,
                              .len = p->rx_buf_size};
    if (buf_map(p, p->rxbuf + (size_t)idx * p->rx_stride, buf.len, p->rx_perm, &buf.gpa) < 0)
        return -EIO;
    if (p->io)
        p->rx_iova[idx] = buf.gpa;
    return vhd_drv_vq_add(&p->rx.dq, &buf, 0, 1, false, (void *)(uintptr_t)(idx + 1));
}

/* Give the consumed buffers back with one index update and at most one kick. */
static void rx_repost(struct vhd_netdrv_pair *p)
{
    if (!p->nrepost)
        return;
    for (uint32_t k = 0; k < p->nrepost; k++)
        (void)rx_post(p, p->repost[k]); /* they came out of this ring: room is certain; a failed
                                           mapping broke the pair */
    p->nrepost = 0;
    publish_and_kick(p, &p->rx);
}

/* Drop the frame being assembled: its buffers go back to the device. */
static void rx_drop_pending(struct vhd_netdrv_pair *p)
{
    for (uint32_t k = 0; k < p->npend; k++)
        p->repost[p->nrepost++] = p->pend[k];
    p->npend = 0;
    p->pend_want = 0;
    p->stats.rx_errors++;
}

/* Take one used RX buffer into the pending frame: 1, 0 when none, -EIO. */
static int rx_take(struct vhd_netdrv_pair *p)
{
    void *ck;
    uint32_t len;
    int rc = vhd_drv_vq_get_used(&p->rx.dq, &ck, &len);
    if (rc <= 0) {
        if (rc < 0)
            p->broken = true;
        return rc;
    }
    p->pend[p->npend] = (uint32_t)((uintptr_t)ck - 1);
    p->pend_len[p->npend] = len;
    p->npend++;
    p->stats.rx_buffers++;
    /* Used: the device is done with it (unmapped before we read it, as a DMA unmap would). */
    if (buf_unmap(p, p->rx_iova ? p->rx_iova[p->pend[p->npend - 1]] : 0) < 0)
        return -EIO;
    return 1;
}

int vhd_netdrv_rx_burst(struct vhd_netdrv_pair *p, vhd_netdrv_rx_cb cb, void *arg, unsigned max)
{
    unsigned got = 0;
    int rc = 0;

    if (vhd_unlikely(p->broken))
        return -EIO;
    while (got < max) {
        if (p->npend == 0) {
            rc = rx_take(p);
            if (rc <= 0)
                break;
            uint32_t len = p->pend_len[0];
            uint8_t *b = p->rxbuf + (size_t)p->pend[0] * p->rx_stride;
            if (vhd_unlikely(len < VHD_NETDRV_HDR_LEN || len > p->rx_buf_size)) {
                rx_drop_pending(p);
                continue;
            }
            /* 5.1.6.4: num_buffers is 1 without MRG_RXBUF; it cannot exceed the ring. */
            const struct virtio_net_hdr_v1 *h = (const void *)b;
            uint32_t want = vhd_le16(h->num_buffers);
            if (vhd_unlikely(want == 0 || want > p->qsize || (!p->mrg && want != 1))) {
                rx_drop_pending(p);
                continue;
            }
            p->pend_want = want;
        }
        while (p->npend < p->pend_want) {
            rc = rx_take(p);
            if (rc <= 0)
                goto out; /* the rest of the frame comes later (or the ring broke) */
            if (vhd_unlikely(p->pend_len[p->npend - 1] > p->rx_buf_size)) {
                rx_drop_pending(p);
                break;
            }
        }
        if (p->npend == 0)
            continue; /* dropped */

        /* The frame: after the header in the first buffer, then whole used lengths. */
        const struct virtio_net_hdr_v1 *h =
            (const void *)(p->rxbuf + (size_t)p->pend[0] * p->rx_stride);
        uint32_t total = 0;
        unsigned niov = 0;
        for (uint32_t k = 0; k < p->npend; k++) {
            uint8_t *b = p->rxbuf + (size_t)p->pend[k] * p->rx_stride;
            uint32_t off = k == 0 ? VHD_NETDRV_HDR_LEN : 0;
            uint32_t l = p->pend_len[k] - off;
            if (l == 0)
                continue;
            p->iov[niov].iov_base = b + off;
            p->iov[niov].iov_len = l;
            niov++;
            total += l;
        }
        struct vhd_netdrv_rxframe f = {.iov = p->iov,
                                       .iovcnt = niov,
                                       .len = total,
                                       .num_buffers = (uint16_t)p->npend,
                                       .hdr_flags = h->flags,
                                       .gso_type = h->gso_type};
        cb(arg, &f);
        p->stats.rx_packets++;
        p->stats.rx_bytes += total;
        for (uint32_t k = 0; k < p->npend; k++)
            p->repost[p->nrepost++] = p->pend[k];
        p->npend = 0;
        p->pend_want = 0;
        got++;
    }
out:
    rx_repost(p);
    if (vhd_unlikely(rc < 0))
        return got ? (int)got : -EIO;
    return (int)got;
}

struct rx_copy_ctx {
    uint8_t *buf;
    size_t len;
    uint32_t frame_len;
};

static void rx_copy_cb(void *arg, const struct vhd_netdrv_rxframe *f)
{
    struct rx_copy_ctx *c = arg;
    size_t off = 0;
    for (unsigned k = 0; k < f->iovcnt && off < c->len; k++) {
        size_t l = f->iov[k].iov_len;
        if (l > c->len - off)
            l = c->len - off;
        memcpy(c->buf + off, f->iov[k].iov_base, l);
        off += l;
    }
    c->frame_len = f->len;
}

int vhd_netdrv_rx_copy(struct vhd_netdrv_pair *p, void *buf, size_t len)
{
    struct rx_copy_ctx c = {.buf = buf, .len = len, .frame_len = 0};
    int rc = vhd_netdrv_rx_burst(p, rx_copy_cb, &c, 1);
    if (rc <= 0)
        return rc;
    return (int)c.frame_len;
}

/* ======================= waiting ======================= */

/*
 * The classic race: the device may use a buffer between our last look and
 * our request for a notification, and skip the notification because we
 * had asked for none. enable_cb's barrier plus its re-check closes it:
 * either the device sees the request and signals the call eventfd, or
 * enable_cb sees the used element. TX notifications are asked for only
 * while TX buffers are in flight.
 */
int vhd_netdrv_wait(struct vhd_netdrv_pair *p, int timeout_ms)
{
    if (vhd_unlikely(p->broken))
        return -EIO;
    bool want_tx = vhd_drv_vq_inflight(&p->tx.dq) != 0;
    bool ready = vhd_drv_vq_enable_cb(&p->rx.dq);
    if (want_tx && !ready)
        ready = vhd_drv_vq_enable_cb(&p->tx.dq);
    int rc = 1;
    if (!ready) {
        struct pollfd pf[2] = {{.fd = p->rx.call_fd, .events = POLLIN},
                               {.fd = p->tx.call_fd, .events = POLLIN}};
        int64_t deadline = timeout_ms >= 0 ? (int64_t)vhd_now_ms() + timeout_ms : 0;
        p->stats.sleeps++;
        for (;;) {
            int left = -1;
            if (timeout_ms >= 0) {
                int64_t l = deadline - (int64_t)vhd_now_ms();
                left = l > 0 ? (int)l : 0;
            }
            int n = poll(pf, want_tx ? 2 : 1, left);
            if (n < 0 && errno == EINTR)
                continue;
            rc = n < 0 ? -errno : n > 0 ? 1 : 0;
            break;
        }
        vhd_drv_drain_eventfd(p->rx.call_fd);
        vhd_drv_drain_eventfd(p->tx.call_fd);
    }
    vhd_drv_vq_disable_cb(&p->rx.dq);
    vhd_drv_vq_disable_cb(&p->tx.dq);
    return rc;
}

void vhd_netdrv_pair_stats(const struct vhd_netdrv_pair *p, struct vhd_netdrv_pair_stats *s)
{
    *s = p->stats;
}

uint32_t vhd_netdrv_pair_index(const struct vhd_netdrv_pair *p)
{
    return p->index;
}

/* ======================= session ======================= */

static size_t ring_area_bytes(const struct vhd_netdrv_opts *o)
{
    return (size_t)PAGE_ALIGN(vhd_drv_vq_area_size(o->queue_size, o->packed, 0));
}

static uint32_t rx_stride(const struct vhd_netdrv_opts *o)
{
    return (uint32_t)LINE_ALIGN(o->rx_buf_size);
}

static uint32_t tx_stride(const struct vhd_netdrv_opts *o)
{
    return (uint32_t)LINE_ALIGN(VHD_NETDRV_HDR_LEN + o->max_tx_frame);
}

/* Shared bytes of one pair: two ring areas, the receive pool, the TX slots. */
static uint64_t pair_bytes(const struct vhd_netdrv_opts *o)
{
    return 2 * (uint64_t)ring_area_bytes(o) + PAGE_ALIGN((uint64_t)o->queue_size * rx_stride(o)) +
           PAGE_ALIGN((uint64_t)o->queue_size * tx_stride(o));
}

static int ring_start(struct vhd_netdrv *d, struct netdrv_ring *r)
{
    const struct vhd_netdrv_info *in = &d->info;
    struct vhd_drv_vq_params prm = {.size = in->queue_size,
                                    .packed = in->packed,
                                    .event_idx = in->event_idx,
                                    .in_order = in->in_order,
                                    .max_indirect = 0,
                                    .area = r->area,
                                    .area_gpa = r->area_gpa,
                                    .area_len = r->area_len};
    int rc = vhd_drv_vq_init(&r->dq, &prm);
    if (rc < 0)
        return dfail(d, rc, "ring %u: set-up: %s", r->index, strerror(-rc));
    /* No notifications until someone waits (vhd_netdrv_wait). */
    vhd_drv_vq_disable_cb(&r->dq);
    vhd_drv_drain_eventfd(r->call_fd);
    return 0;
}

static int ring_announce(struct vhd_netdrv *d, struct netdrv_ring *r)
{
    if (d->iommu) /* the miss thread answers on the same session */
        vhd_drv_iommu_lock(&d->io);
    int rc = vhd_drv_ring_announce(&d->vuf, d->iommu ? NULL : &d->gm, &r->dq, r->index,
                                   vhd_drv_ring_fresh_base(d->info.packed), r->kick_fd, r->call_fd);
    if (d->iommu)
        vhd_drv_iommu_unlock(&d->io);
    if (rc < 0)
        return dfail(d, rc, "%s", vhd_vuf_strerror(&d->vuf));
    return 0;
}

/* Reset a pair's driver state and post every receive buffer (not yet published to the device). */
static int pair_start(struct vhd_netdrv *d, struct vhd_netdrv_pair *p)
{
    int rc = ring_start(d, &p->rx);
    if (rc == 0)
        rc = ring_start(d, &p->tx);
    if (rc < 0)
        return rc;
    p->mrg = d->info.mrg_rxbuf;
    p->broken = false;
    p->npend = p->pend_want = p->nrepost = 0;
    p->tx_nfree = p->qsize;
    for (uint32_t k = 0; k < p->qsize; k++)
        p->tx_free[k] = p->qsize - 1 - k; /* slot 0 on top */
    for (uint32_t k = 0; k < p->qsize; k++) {
        rc = rx_post(p, k);
        if (rc < 0)
            return dfail(d, rc, "pair %u: posting receive buffers: %s", p->index, strerror(-rc));
    }
    vhd_drv_vq_publish(&p->rx.dq);
    return 0;
}

/* Features we implement (virtio 1.2, 5.1.3 and 6). */
static uint64_t wanted_features(const struct vhd_netdrv_opts *o)
{
    uint64_t f = BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_NET_F_MAC) | BIT(VIRTIO_NET_F_STATUS);
    if (o->num_pairs > 1)
        f |= BIT(VIRTIO_NET_F_MQ);
    if (o->mrg_rxbuf)
        f |= BIT(VIRTIO_NET_F_MRG_RXBUF);
    if (!o->no_event_idx)
        f |= BIT(VIRTIO_F_EVENT_IDX);
    if (!o->no_in_order)
        f |= BIT(VIRTIO_F_IN_ORDER);
    if (o->packed)
        f |= BIT(VIRTIO_F_RING_PACKED);
    f |= o->offloads & OFFLOAD_BITS;
    if (o->ctrl_vq)
        f |= BIT(VIRTIO_NET_F_CTRL_VQ) | BIT(VIRTIO_NET_F_CTRL_RX) |
             BIT(VIRTIO_NET_F_CTRL_MAC_ADDR) | BIT(VIRTIO_NET_F_GUEST_ANNOUNCE);
    return f;
}

/* The control queue's ring index (5.1.2): after every pair the device has with MQ, else 2. */
static uint32_t ctrl_index(const struct vhd_netdrv_info *in)
{
    return (in->features & BIT(VIRTIO_NET_F_MQ)) ? 2 * in->device_pairs : 2;
}

/* Start the control queue's ring (not yet announced to the device). */
static int ctrl_setup(struct vhd_netdrv *d)
{
    d->ctrl.index = ctrl_index(&d->info);
    d->ctrl_broken = false;
    return ring_start(d, &d->ctrl);
}

/*
 * Open the back-end channel: one end of a socket pair goes to the back-end
 * (SET_BACKEND_REQ_FD), ours stays non-blocking for vhd_netdrv_config_wait.
 */
static int backend_channel_open(struct vhd_netdrv *d)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sv) < 0)
        return dfail(d, -errno, "back-end channel: socketpair: %s", strerror(errno));
    int rc = vhd_vuf_set_backend_req_fd(&d->vuf, sv[1]);
    close(sv[1]);
    if (rc < 0) {
        close(sv[0]);
        return dfail(d, rc, "%s", vhd_vuf_strerror(&d->vuf));
    }
    d->backend_fd = sv[0];
    d->info.config_notify = true;
    return 0;
}

/*
 * The driver as the IOMMU, after SET_MEM_TABLE: the table, every ring area
 * and the control buffer mapped read-write for good (a coherent mapping, as
 * Linux's dma_alloc_coherent), at IOVAs that replace their GPAs; buffers are
 * mapped one by one as they go to the device.
 */
static int iommu_setup(struct vhd_netdrv *d)
{
    const struct vhd_netdrv_opts *o = &d->o;
    /*
     * Misses may come as soon as the rings are announced (DPDK translates
     * them at SET_VRING_KICK, and drops updates sent before a ring exists):
     * the channel and its thread first. They pass config changes on.
     */
    if (o->ctrl_vq && vhd_vuf_has_proto(&d->vuf, VHOST_USER_PROTOCOL_F_CONFIG)) {
        d->config_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (d->config_efd < 0)
            return dfail(d, -errno, "config eventfd: %s", strerror(errno));
    }
    int rc =
        vhd_drv_iommu_start(&d->io, &d->vuf, &d->gm, o->iommu_page_size, o->iommu_strict,
                            o->iommu_batch, &d->backend_fd, d->config_efd, d->err, sizeof(d->err));
    if (rc < 0)
        return rc;
    d->iommu = true;
    for (uint32_t i = 0; i < o->num_pairs; i++) {
        struct vhd_netdrv_pair *p = d->p[i];
        struct netdrv_ring *rings[2] = {&p->rx, &p->tx};
        for (int k = 0; k < 2 && rc == 0; k++)
            rc = vhd_drv_iommu_map(&d->io, rings[k]->area, rings[k]->area_len, VHOST_ACCESS_RW,
                                   &rings[k]->area_gpa);
        p->io = &d->io;
        p->rx_perm = o->iommu_exact_perms ? VHOST_ACCESS_WO : VHOST_ACCESS_RW;
        p->tx_perm = o->iommu_exact_perms ? VHOST_ACCESS_RO : VHOST_ACCESS_RW;
        if (rc == 0 && o->iommu_static) {
            /*
             * The pools mapped for good: their IOVAs replace their GPAs and
             * the pair sends no message (p->io stays NULL).
             */
            rc = vhd_drv_iommu_map_paged(&d->io, p->rxbuf, (uint64_t)p->qsize * p->rx_stride,
                                         p->rx_perm, &p->rxbuf_gpa);
            if (rc == 0)
                rc = vhd_drv_iommu_map_paged(&d->io, p->txbuf, (uint64_t)p->qsize * p->tx_stride,
                                             p->tx_perm, &p->txbuf_gpa);
            p->io = NULL;
        }
    }
    if (rc == 0 && o->ctrl_vq)
        rc = vhd_drv_iommu_map(&d->io, d->ctrl.area, d->ctrl.area_len, VHOST_ACCESS_RW,
                               &d->ctrl.area_gpa);
    if (rc == 0 && o->ctrl_vq)
        rc = vhd_drv_iommu_map(&d->io, d->cbuf, CTRL_BUF_BYTES, VHOST_ACCESS_RW, &d->cbuf_gpa);
    if (rc < 0)
        return dfail(d, rc, "IOMMU mapping of the rings: %s", vhd_drv_iommu_reason(&d->io, rc));
    return 0;
}

static int session_open(struct vhd_netdrv *d)
{
    struct vhd_vuf *f = &d->vuf;
    const struct vhd_netdrv_opts *o = &d->o;
    struct vhd_netdrv_info *in = &d->info;

    const struct vhd_drv_session_params sp = {
        .path = d->path,
        .timeout_ms = o->timeout_ms,
        .want_proto =
            BIT(VHOST_USER_PROTOCOL_F_MQ) | BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK) |
            BIT(VHOST_USER_PROTOCOL_F_CONFIG) | BIT(VHOST_USER_PROTOCOL_F_RARP) |
            (o->ctrl_vq || o->iommu_page_size ? BIT(VHOST_USER_PROTOCOL_F_BACKEND_REQ) : 0),
        .packed = o->packed};
    int rc = vhd_drv_session_open(f, &sp, d->err, sizeof(d->err));
    if (rc < 0)
        return rc;
    if (o->iommu_page_size) {
        rc = vhd_drv_iommu_check_peer(f, d->err, sizeof(d->err));
        if (rc < 0)
            goto fail;
    }
    uint64_t offered = f->offered;
    if (o->mrg_rxbuf && !(offered & BIT(VIRTIO_NET_F_MRG_RXBUF))) {
        rc = dfail(d, -ENOTSUP, "the back-end does not offer VIRTIO_NET_F_MRG_RXBUF");
        goto fail;
    }
    uint64_t feat = offered & wanted_features(o);
    if (o->iommu_page_size)
        feat |= BIT(VIRTIO_F_ACCESS_PLATFORM); /* offered: checked above */
    if (o->ctrl_vq && !(feat & BIT(VIRTIO_NET_F_CTRL_VQ))) {
        rc = dfail(d, -ENOTSUP, "the back-end does not offer VIRTIO_NET_F_CTRL_VQ");
        goto fail;
    }
    if (o->num_pairs > 1 && !(feat & BIT(VIRTIO_NET_F_MQ))) {
        rc = dfail(d, -ENOTSUP, "%u pairs asked for, but the device has one (no VIRTIO_NET_F_MQ)",
                   o->num_pairs);
        goto fail;
    }
    /*
     * GET_QUEUE_NUM counts queue pairs for net devices (QEMU's and DPDK's
     * reading); max_virtqueue_pairs in config space, when readable, wins.
     */
    in->device_pairs = (feat & BIT(VIRTIO_NET_F_MQ)) ? f->queue_num : 1;
    in->queue_num = f->queue_num;
    memset(in->mac, 0, sizeof(in->mac));
    in->status = VIRTIO_NET_S_LINK_UP;
    if (vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_CONFIG)) {
        struct virtio_net_config cfg;
        /* mac, status, max_virtqueue_pairs: the first 10 bytes exist in every version. */
        if (vhd_vuf_get_config(f, 0, &cfg, offsetof(struct virtio_net_config, mtu)) == 0) {
            if (feat & BIT(VIRTIO_NET_F_MAC))
                memcpy(in->mac, cfg.mac, sizeof(in->mac));
            if (feat & BIT(VIRTIO_NET_F_STATUS))
                in->status = vhd_le16(cfg.status);
            if ((feat & BIT(VIRTIO_NET_F_MQ)) && vhd_le16(cfg.max_virtqueue_pairs))
                in->device_pairs = vhd_le16(cfg.max_virtqueue_pairs);
        } else if (!vhd_vuf_alive(f)) {
            rc = -ECONNRESET;
            goto fail_vuf;
        }
    }
    if (o->num_pairs > in->device_pairs) {
        rc = dfail(d, -ENOTSUP, "%u pairs asked for, the device has %u", o->num_pairs,
                   in->device_pairs);
        goto fail;
    }
    /* Ring indices: every pair's two rings and the control queue after them (5.1.2). */
    f->max_rings = 2 * in->device_pairs + 1;
    in->features = feat;
    in->num_pairs = o->num_pairs;
    in->queue_size = o->queue_size;
    in->rx_buf_size = o->rx_buf_size;
    in->max_tx_frame = o->max_tx_frame;
    in->packed = (feat & BIT(VIRTIO_F_RING_PACKED)) != 0;
    in->event_idx = (feat & BIT(VIRTIO_F_EVENT_IDX)) != 0;
    in->in_order = (feat & BIT(VIRTIO_F_IN_ORDER)) != 0;
    in->mrg_rxbuf = (feat & BIT(VIRTIO_NET_F_MRG_RXBUF)) != 0;
    in->reply_ack = vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_REPLY_ACK);
    in->iommu_page_size = o->iommu_page_size;

    rc = vhd_vuf_set_features(f, feat);
    if (rc == 0)
        rc = vhd_vuf_set_mem_table(f, &d->gm);
    if (rc < 0)
        goto fail_vuf;
    if (o->iommu_page_size) {
        rc = iommu_setup(d);
        if (rc < 0)
            goto fail;
    }
    for (uint32_t i = 0; i < o->num_pairs; i++) {
        struct vhd_netdrv_pair *p = d->p[i];
        rc = pair_start(d, p);
        if (rc == 0)
            rc = ring_announce(d, &p->rx);
        if (rc == 0)
            rc = ring_announce(d, &p->tx);
        if (rc < 0)
            goto fail;
    }
    in->ctrl_vq = o->ctrl_vq;
    in->config_notify = false;
    if (o->ctrl_vq) {
        rc = ctrl_setup(d);
        if (rc == 0)
            rc = ring_announce(d, &d->ctrl);
        if (rc == 0 && !d->iommu && vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_BACKEND_REQ) &&
            vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_CONFIG))
            rc = backend_channel_open(d); /* with the IOMMU, its miss thread owns the channel */
        in->config_notify = d->iommu ? d->config_efd >= 0 : in->config_notify;
        if (rc < 0)
            goto fail;
    }
    rc = vhd_vuf_sync(f);
    if (rc < 0)
        goto fail_vuf;
    if (d->iommu && vhd_drv_iommu_replay(&d->io) < 0) {
        rc = dfail(d, -EIO, "%s", vhd_drv_iommu_strerror(&d->io));
        goto fail;
    }
    /* The receive buffers were posted before the rings started: tell the device once. */
    for (uint32_t i = 0; i < o->num_pairs; i++)
        kick(d->p[i], &d->p[i]->rx);
    d->connected = true;
    d->err[0] = 0;
    if (o->ctrl_vq && (feat & BIT(VIRTIO_NET_F_MQ))) {
        /* 5.1.6.5.5: with the control queue running the device uses one pair until this. */
        uint16_t n = vhd_le16((uint16_t)o->num_pairs);
        rc = vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &n, sizeof(n));
        if (rc < 0) {
            dfail(d, rc, "VQ_PAIRS_SET %u refused by the device", o->num_pairs);
            d->connected = false;
            goto fail;
        }
    }
    return 0;

fail_vuf:
    dfail(d, rc, "%s", vhd_vuf_strerror(f));
fail:
    vhd_drv_iommu_fini(&d->io); /* its thread may use the session: it goes first */
    vhd_vuf_close(f);
    return rc;
}

/* Stop every ring (the back-end stops touching our memory before it answers), close. */
static void session_end(struct vhd_netdrv *d)
{
    /* The miss thread goes first: the ring stops below use the session alone. */
    vhd_drv_iommu_fini(&d->io);
    if (vhd_vuf_alive(&d->vuf)) {
        bool ok = true;
        for (uint32_t i = 0; i < 2 * d->o.num_pairs && ok; i++)
            ok = vhd_vuf_ring_stop(&d->vuf, i, NULL) == 0; /* else gone or refusing: stop */
        if (ok && d->info.ctrl_vq)
            (void)vhd_vuf_ring_stop(&d->vuf, d->ctrl.index, NULL);
    }
    vhd_vuf_close(&d->vuf);
    d->connected = false;
}

/* ======================= connect / disconnect ======================= */

static void pair_free(struct vhd_netdrv_pair *p)
{
    if (!p)
        return;
    struct netdrv_ring *rings[2] = {&p->rx, &p->tx};
    for (int k = 0; k < 2; k++) {
        vhd_drv_vq_fini(&rings[k]->dq);
        if (rings[k]->kick_fd >= 0)
            close(rings[k]->kick_fd);
        if (rings[k]->call_fd >= 0)
            close(rings[k]->call_fd);
    }
    free(p->repost);
    free(p->pend);
    free(p->pend_len);
    free(p->iov);
    free(p->tx_free);
    free(p->rx_iova);
    free(p->tx_iova);
    free(p);
}

static void drv_free(struct vhd_netdrv *d)
{
    for (uint32_t i = 0; i < VHD_NETDRV_MAX_PAIRS; i++)
        pair_free(d->p[i]);
    vhd_drv_vq_fini(&d->ctrl.dq);
    if (d->ctrl.kick_fd >= 0)
        close(d->ctrl.kick_fd);
    if (d->ctrl.call_fd >= 0)
        close(d->ctrl.call_fd);
    vhd_drv_iommu_fini(&d->io); /* before its channel closes */
    if (d->backend_fd >= 0)
        close(d->backend_fd);
    if (d->config_efd >= 0)
        close(d->config_efd);
    vhd_vuf_close(&d->vuf);
    vhd_guestmem_fini(&d->gm);
    free(d->path);
    free(d);
}

/* Carve pair i's part of the region at *off: RX ring, TX ring, receive pool, TX slots. */
static int pair_new(struct vhd_netdrv *d, uint32_t i, uint64_t *off)
{
    const struct vhd_netdrv_opts *o = &d->o;
    struct vhd_netdrv_pair *p;
    size_t pbytes = LINE_ALIGN(sizeof(*p));

    if (posix_memalign((void **)&p, VHD_CACHELINE, pbytes))
        return -ENOMEM;
    memset(p, 0, pbytes);
    d->p[i] = p;
    p->rx.kick_fd = p->rx.call_fd = p->tx.kick_fd = p->tx.call_fd = -1;
    p->index = i;
    p->qsize = o->queue_size;
    p->rx.index = 2 * i;
    p->tx.index = 2 * i + 1;
    p->rx_buf_size = o->rx_buf_size;
    p->rx_stride = rx_stride(o);
    p->max_tx_frame = o->max_tx_frame;
    p->tx_stride = tx_stride(o);

    struct vhd_guestmem_region *r = &d->gm.r[0];
    struct netdrv_ring *rings[2] = {&p->rx, &p->tx};
    for (int k = 0; k < 2; k++) {
        rings[k]->area = r->hva + *off;
        rings[k]->area_gpa = r->gpa + *off;
        rings[k]->area_len = ring_area_bytes(o);
        *off += rings[k]->area_len;
    }
    p->rxbuf = r->hva + *off;
    p->rxbuf_gpa = r->gpa + *off;
    *off += PAGE_ALIGN((uint64_t)p->qsize * p->rx_stride);
    p->txbuf = r->hva + *off;
    p->txbuf_gpa = r->gpa + *off;
    *off += PAGE_ALIGN((uint64_t)p->qsize * p->tx_stride);
    if (*off > r->size)
        return -ENOMEM; /* the plan in connect says this cannot happen */

    p->repost = calloc(p->qsize, sizeof(*p->repost));
    p->pend = calloc(p->qsize, sizeof(*p->pend));
    p->pend_len = calloc(p->qsize, sizeof(*p->pend_len));
    p->iov = calloc(p->qsize, sizeof(*p->iov));
    p->tx_free = calloc(p->qsize, sizeof(*p->tx_free));
    if (!p->repost || !p->pend || !p->pend_len || !p->iov || !p->tx_free)
        return -ENOMEM;
    if (o->iommu_page_size) {
        p->rx_iova = calloc(p->qsize, sizeof(*p->rx_iova));
        p->tx_iova = calloc(p->qsize, sizeof(*p->tx_iova));
        if (!p->rx_iova || !p->tx_iova)
            return -ENOMEM;
    }
    for (int k = 0; k < 2; k++) {
        rings[k]->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        rings[k]->call_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (rings[k]->kick_fd < 0 || rings[k]->call_fd < 0)
            return -errno;
    }
    return 0;
}

int vhd_netdrv_connect(const struct vhd_netdrv_opts *opts, struct vhd_netdrv **out, char *err,
                       size_t errlen)
{
    struct vhd_netdrv *d = calloc(1, sizeof(*d));
    int rc;

    if (err && errlen)
        err[0] = 0;
    if (!d) {
        if (err && errlen)
            snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    vhd_vuf_init(&d->vuf, opts->timeout_ms);
    d->ctrl.kick_fd = d->ctrl.call_fd = d->backend_fd = d->config_efd = -1;
    d->o = *opts;
    struct vhd_netdrv_opts *o = &d->o;
    if (!o->num_pairs)
        o->num_pairs = 1;
    if (!o->queue_size)
        o->queue_size = DEFAULT_QUEUE_SIZE;
    if (!o->rx_buf_size)
        o->rx_buf_size = DEFAULT_BUF_SIZE;
    if (!o->max_tx_frame)
        o->max_tx_frame = DEFAULT_BUF_SIZE - VHD_NETDRV_HDR_LEN;
    if (o->timeout_ms <= 0)
        o->timeout_ms = VHD_VUF_DEFAULT_TIMEOUT_MS;

    rc = vhd_drv_check_opts(o->socket_path, "num_pairs", o->num_pairs, VHD_NETDRV_MAX_PAIRS,
                            o->queue_size, o->packed, &d->path, d->err, sizeof(d->err));
    if (rc < 0)
        goto fail;
    o->socket_path = d->path;
    if (o->rx_buf_size < MIN_RX_BUF_SIZE || o->rx_buf_size > MAX_TX_FRAME + VHD_NETDRV_HDR_LEN) {
        rc = dfail(d, -EINVAL, "rx_buf_size %u: %u..%u", o->rx_buf_size, MIN_RX_BUF_SIZE,
                   MAX_TX_FRAME + VHD_NETDRV_HDR_LEN);
        goto fail;
    }
    if (o->max_tx_frame > MAX_TX_FRAME) {
        rc = dfail(d, -EINVAL, "max_tx_frame %u: at most %u", o->max_tx_frame, MAX_TX_FRAME);
        goto fail;
    }
    rc = vhd_drv_iommu_check_opts(o->iommu_page_size, d->err, sizeof(d->err));
    if (rc < 0)
        goto fail;

    uint64_t region_size = PAGE_ALIGN(o->num_pairs * pair_bytes(o));
    if (o->ctrl_vq)
        region_size += ring_area_bytes(o) + CTRL_BUF_BYTES;
    /* With the IOMMU, whole pages of the region are mapped: it is aligned to and sized in them. */
    uint64_t align = o->iommu_page_size;
    if (align)
        region_size = (region_size + align - 1) & ~(align - 1);
    rc = vhd_guestmem_init_aligned(&d->gm, 1, region_size, GPA_BASE, 0, align);
    if (rc < 0) {
        dfail(d, rc, "shared memory (%llu bytes): %s", (unsigned long long)region_size,
              strerror(-rc));
        goto fail;
    }
    uint64_t off = 0;
    for (uint32_t i = 0; i < o->num_pairs; i++) {
        rc = pair_new(d, i, &off);
        if (rc < 0) {
            dfail(d, rc, "pair %u: %s", i, strerror(-rc));
            goto fail;
        }
    }
    if (o->ctrl_vq) {
        /* The control queue's ring and command buffer, after the pairs. */
        struct vhd_guestmem_region *r = &d->gm.r[0];
        d->ctrl.area = r->hva + off;
        d->ctrl.area_gpa = r->gpa + off;
        d->ctrl.area_len = ring_area_bytes(o);
        off += d->ctrl.area_len;
        d->cbuf = r->hva + off;
        d->cbuf_gpa = r->gpa + off;
        d->ctrl.kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        d->ctrl.call_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (d->ctrl.kick_fd < 0 || d->ctrl.call_fd < 0) {
            rc = dfail(d, -errno, "control queue eventfds: %s", strerror(errno));
            goto fail;
        }
    }
    rc = session_open(d);
    if (rc < 0)
        goto fail;
    *out = d;
    return 0;

fail:
    if (err && errlen)
        snprintf(err, errlen, "%s", d->err[0] ? d->err : strerror(-rc));
    drv_free(d);
    return rc;
}

void vhd_netdrv_disconnect(struct vhd_netdrv *d)
{
    if (!d)
        return;
    if (d->connected)
        session_end(d);
    drv_free(d);
}

const struct vhd_netdrv_info *vhd_netdrv_get_info(const struct vhd_netdrv *d)
{
    return &d->info;
}

const char *vhd_netdrv_errmsg(const struct vhd_netdrv *d)
{
    return d->err;
}

struct vhd_netdrv_pair *vhd_netdrv_get_pair(struct vhd_netdrv *d, uint32_t i)
{
    return i < d->o.num_pairs ? d->p[i] : NULL;
}

/* ======================= control queue and config ======================= */

int vhd_netdrv_ctrl(struct vhd_netdrv *d, uint8_t cls, uint8_t cmd, const void *data, size_t len)
{
    if (!d->info.ctrl_vq)
        return -ENOTSUP;
    if (d->ctrl_broken)
        return -EIO;
    if (len > VHD_NETDRV_CTRL_MAX)
        return -E2BIG;
    /* 5.1.6.5: class, command, data (device-readable), then the ack (device-writable). */
    d->cbuf[0] = cls;
    d->cbuf[1] = cmd;
    if (len)
        memcpy(d->cbuf + 2, data, len);
    d->cbuf[CTRL_ACK_OFF] = 0xff; /* neither OK nor ERR until the device writes it */
    struct vhd_drv_buf b[2] = {{.gpa = d->cbuf_gpa, .len = (uint32_t)(2 + len)},
                               {.gpa = d->cbuf_gpa + CTRL_ACK_OFF, .len = 1}};
    if (vhd_drv_vq_add(&d->ctrl.dq, b, 1, 1, false, d) < 0)
        return -EIO; /* one command at a time: the ring cannot be full */
    vhd_drv_vq_publish(&d->ctrl.dq);
    uint64_t one = 1;
    ssize_t wr = write(d->ctrl.kick_fd, &one, sizeof(one));
    (void)wr;

    /* Wait for the used element: the call eventfd, re-checked after enabling (the usual race). */
    int64_t deadline = (int64_t)vhd_now_ms() + d->o.timeout_ms;
    for (;;) {
        void *ck;
        uint32_t used_len;
        int rc = vhd_drv_vq_get_used(&d->ctrl.dq, &ck, &used_len);
        if (rc < 0) {
            d->ctrl_broken = true;
            return -EIO;
        }
        if (rc == 1) {
            vhd_drv_vq_disable_cb(&d->ctrl.dq);
            vhd_drv_drain_eventfd(d->ctrl.call_fd);
            if (used_len < 1)
                return -EIO; /* the device gave the command back unanswered */
            return d->cbuf[CTRL_ACK_OFF] == VIRTIO_NET_OK ? 0 : -EINVAL;
        }
        if (vhd_drv_vq_enable_cb(&d->ctrl.dq))
            continue;
        int64_t left = deadline - (int64_t)vhd_now_ms();
        if (left <= 0) {
            d->ctrl_broken = true;
            return -ETIMEDOUT;
        }
        struct pollfd pf = {.fd = d->ctrl.call_fd, .events = POLLIN};
        (void)poll(&pf, 1, left > 100 ? 100 : (int)left);
        vhd_drv_drain_eventfd(d->ctrl.call_fd);
    }
}

int vhd_netdrv_read_config(struct vhd_netdrv *d)
{
    struct vhd_netdrv_info *in = &d->info;
    struct virtio_net_config cfg;

    if (!vhd_vuf_has_proto(&d->vuf, VHOST_USER_PROTOCOL_F_CONFIG))
        return -ENOTSUP;
    if (d->iommu) /* the miss thread uses the session too */
        vhd_drv_iommu_lock(&d->io);
    int rc = vhd_vuf_get_config(&d->vuf, 0, &cfg, offsetof(struct virtio_net_config, mtu));
    if (d->iommu)
        vhd_drv_iommu_unlock(&d->io);
    if (rc < 0)
        return rc;
    if (in->features & BIT(VIRTIO_NET_F_MAC))
        memcpy(in->mac, cfg.mac, sizeof(in->mac));
    if (in->features & BIT(VIRTIO_NET_F_STATUS))
        in->status = vhd_le16(cfg.status);
    return 0;
}

/*
 * Back-end requests on our end of the channel: answer each that asks for a
 * reply (REPLY_ACK: u64 0 for a config change, 1 for anything we do not
 * handle), note config changes. Returns 1 when a config change came, 0
 * when none (yet), or -errno when the channel is gone.
 */
static int backend_drain(struct vhd_netdrv *d, struct vu_rx *rx)
{
    int seen = 0;
    for (;;) {
        int rc = vu_rx_read(rx, d->backend_fd);
        if (rc <= 0)
            return rc < 0 ? rc : seen;
        for (unsigned k = 0; k < rx->nfds; k++)
            close(rx->fds[k]); /* no back-end request we handle carries fds */
        bool change = rx->hdr.request == VHOST_USER_BACKEND_CONFIG_CHANGE_MSG;
        if (change)
            seen = 1;
        if (rx->hdr.flags & VHOST_USER_NEED_REPLY_MASK) {
            struct vu_hdr h = {.request = rx->hdr.request,
                               .flags = VHOST_USER_VERSION | VHOST_USER_REPLY_MASK,
                               .size = sizeof(uint64_t)};
            uint64_t v = change ? 0 : 1;
            rc = vu_send(d->backend_fd, &h, &v, NULL, 0, d->o.timeout_ms);
            if (rc < 0)
                return rc;
        }
        vu_rx_next(rx);
    }
}

/* With the IOMMU its miss thread reads the channel and passes config changes on: wait for those. */
static int config_wait_iommu(struct vhd_netdrv *d, int timeout_ms)
{
    if (d->config_efd < 0)
        return -ENOTSUP;
    struct pollfd pf = {.fd = d->config_efd, .events = POLLIN};
    int n;
    do
        n = poll(&pf, 1, timeout_ms);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    if (n == 0)
        return 0;
    vhd_drv_drain_eventfd(d->config_efd);
    int rc = vhd_netdrv_read_config(d);
    return rc < 0 ? rc : 1;
}

int vhd_netdrv_config_wait(struct vhd_netdrv *d, int timeout_ms)
{
    struct vu_rx rx;
    int64_t deadline = timeout_ms >= 0 ? (int64_t)vhd_now_ms() + timeout_ms : 0;

    if (d->iommu)
        return config_wait_iommu(d, timeout_ms);
    if (d->backend_fd < 0)
        return -ENOTSUP;
    vu_rx_init(&rx);
    for (;;) {
        int rc = backend_drain(d, &rx);
        if (rc != 0) {
            vu_rx_reset(&rx);
            if (rc < 0)
                return rc;
            rc = vhd_netdrv_read_config(d);
            return rc < 0 ? rc : 1;
        }
        int left = -1;
        if (timeout_ms >= 0) {
            int64_t l = deadline - (int64_t)vhd_now_ms();
            if (l <= 0) {
                vu_rx_reset(&rx);
                return 0;
            }
            left = (int)l;
        }
        struct pollfd pf = {.fd = d->backend_fd, .events = POLLIN};
        if (poll(&pf, 1, left) < 0 && errno != EINTR) {
            vu_rx_reset(&rx);
            return -errno;
        }
    }
}

int vhd_netdrv_send_rarp(struct vhd_netdrv *d, const uint8_t mac[6])
{
    if (d->iommu)
        vhd_drv_iommu_lock(&d->io);
    int rc = vhd_vuf_send_rarp(&d->vuf, mac);
    if (d->iommu)
        vhd_drv_iommu_unlock(&d->io);
    if (rc < 0)
        dfail(d, rc, "%s", vhd_vuf_strerror(&d->vuf));
    return rc;
}

int vhd_netdrv_iommu_stats(struct vhd_netdrv *d, struct vhd_netdrv_iommu_stats *s)
{
    struct vhd_drv_iommu_stats st;
    if (!d->iommu)
        return -ENOTSUP;
    vhd_drv_iommu_get_stats(&d->io, &st);
    s->updates = st.updates;
    s->invalidates = st.invalidates;
    s->misses = st.misses;
    s->misses_bad = st.misses_bad;
    s->mapped = st.mapped;
    return 0;
}
