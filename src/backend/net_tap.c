/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The "tap" packet backend: the device's frames go to and come from a Linux
 * TAP interface (IFF_TAP | IFF_NO_PI | IFF_VNET_HDR), one TAP queue per
 * queue pair (IFF_MULTI_QUEUE when there are several). Transmit writes on
 * the pair's worker; receive reads on the same worker, which the runtime
 * wakes when the TAP fd becomes readable (rx_wake_fd).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include "util/compiler.h"
#include "net_backend.h"
#include "runtime/log.h"

#define HDR_LEN ((uint32_t)sizeof(struct virtio_net_hdr_v1))

/* Per pair: the TAP queue fd and a receive buffer for one frame (header + largest frame). */
struct tap_pair {
    int fd;
    uint8_t *buf;
};

struct tap_be {
    struct vhd_net_backend be; /* first */
    uint32_t pairs;
    struct tap_pair *p;
};

/*
 * Offloads. CSUM and GUEST_CSUM, with TUNSETOFFLOAD(TUN_F_CSUM) always: a
 * frame the guest leaves with a partial checksum goes to the kernel with
 * NEEDS_CSUM in the vnet header, which the kernel always honours on write;
 * the kernel may hand us frames with a partial checksum, which
 * vhd_net_deliver passes on to a guest that negotiated GUEST_CSUM or
 * completes in software for one that did not.
 *
 * Segmentation. HOST_TSO4/TSO6/ECN/UFO: the kernel takes frames with those
 * gso_types on write (IFF_VNET_HDR) and segments them itself where they
 * leave the host. GUEST_TSO4/TSO6/ECN/UFO are offered as far as
 * TUNSETOFFLOAD accepts the matching TUN_F_* bits (probed at open); the
 * kernel sends such frames only once set_features has turned them on for a
 * guest that negotiated them (with GUEST_CSUM), and turns them off again at
 * reset, so a guest that cannot take them never sees one.
 */
#define TAP_OFFLOADS                                                       \
    ((1ull << VIRTIO_NET_F_CSUM) | (1ull << VIRTIO_NET_F_GUEST_CSUM) |     \
     (1ull << VIRTIO_NET_F_HOST_TSO4) | (1ull << VIRTIO_NET_F_HOST_TSO6) | \
     (1ull << VIRTIO_NET_F_HOST_ECN) | (1ull << VIRTIO_NET_F_HOST_UFO))

/* GUEST_* feature and the TUN_F_* bit that lets the kernel send such frames. */
static const struct {
    unsigned feature;
    unsigned tun;
} tap_guest_gso[] = {
    {VIRTIO_NET_F_GUEST_TSO4, TUN_F_TSO4},
    {VIRTIO_NET_F_GUEST_TSO6, TUN_F_TSO6},
    {VIRTIO_NET_F_GUEST_ECN, TUN_F_TSO_ECN},
    {VIRTIO_NET_F_GUEST_UFO, TUN_F_UFO},
};

static int tap_err(char *err, size_t errlen, int rc, const char *what, const char *ifname)
{
    if (err && errlen)
        snprintf(err, errlen, "tap %s: %s: %s", ifname, what, strerror(-rc));
    return rc;
}

static void tap_close(struct vhd_net_backend *be)
{
    struct tap_be *t = (struct tap_be *)be;
    for (uint32_t i = 0; i < t->pairs; i++) {
        if (t->p[i].fd >= 0)
            close(t->p[i].fd);
        free(t->p[i].buf);
    }
    free(t->p);
    free(t);
}

/* Open one TAP queue of ifname (the first creates the interface if it does not exist). */
static int tap_open_queue(const char *ifname, bool multi, char *err, size_t errlen)
{
    struct ifreq ifr;
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return tap_err(err, errlen, -errno, "open /dev/net/tun", ifname);
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", ifname);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | (multi ? IFF_MULTI_QUEUE : 0);
    if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
        int rc = tap_err(err, errlen, -errno, "TUNSETIFF", ifname);
        close(fd);
        return rc;
    }
    /* The virtio 1.x header: 12 bytes (num_buffers included), little-endian. */
    int sz = (int)HDR_LEN;
    if (ioctl(fd, TUNSETVNETHDRSZ, &sz) < 0) {
        int rc = tap_err(err, errlen, -errno, "TUNSETVNETHDRSZ", ifname);
        close(fd);
        return rc;
    }
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    int le = 1;
    if (ioctl(fd, TUNSETVNETLE, &le) < 0) {
        int rc = tap_err(err, errlen, -errno, "TUNSETVNETLE", ifname);
        close(fd);
        return rc;
    }
#endif
    if (ioctl(fd, TUNSETOFFLOAD, (unsigned long)TUN_F_CSUM) < 0) {
        int rc = tap_err(err, errlen, -errno, "TUNSETOFFLOAD", ifname);
        close(fd);
        return rc;
    }
    return fd;
}

static int tap_open(const struct vhd_net_backend_opts *o, struct vhd_dev *dev,
                    struct vhd_net_backend **out, char *err, size_t errlen)
{
    const char *ifname = o->tap_name;
    int rc;

    if (!ifname || !*ifname || strlen(ifname) >= IFNAMSIZ) {
        if (err && errlen)
            snprintf(err, errlen, "tap: interface name (tap=IFNAME) missing or too long");
        return -EINVAL;
    }
    struct tap_be *t = calloc(1, sizeof(*t));
    if (!t)
        return tap_err(err, errlen, -ENOMEM, "allocation", ifname);
    t->pairs = o->pairs ? o->pairs : 1;
    t->p = calloc(t->pairs, sizeof(*t->p));
    if (!t->p) {
        free(t);
        return tap_err(err, errlen, -ENOMEM, "allocation", ifname);
    }
    for (uint32_t i = 0; i < t->pairs; i++)
        t->p[i].fd = -1;
    for (uint32_t i = 0; i < t->pairs; i++) {
        t->p[i].buf = malloc(HDR_LEN + VHD_NET_MAX_FRAME);
        if (!t->p[i].buf) {
            rc = tap_err(err, errlen, -ENOMEM, "allocation", ifname);
            goto err_close;
        }
        rc = tap_open_queue(ifname, t->pairs > 1, err, errlen);
        if (rc < 0)
            goto err_close;
        t->p[i].fd = rc;
    }
    t->be.ops = &vhd_net_backend_tap;
    t->be.dev = dev;
    t->be.offloads = TAP_OFFLOADS;
    /*
     * Which GUEST_* segmentation offloads does this kernel take? Each
     * TUN_F_* bit alone with TUN_F_CSUM (ECN with TSO4, as it means TSO
     * with ECN), then back to TUN_F_CSUM until a guest negotiates them.
     */
    for (size_t i = 0; i < VHD_ARRAY_SIZE(tap_guest_gso); i++) {
        unsigned long fl = TUN_F_CSUM | tap_guest_gso[i].tun;
        if (tap_guest_gso[i].tun == TUN_F_TSO_ECN)
            fl |= TUN_F_TSO4;
        if (ioctl(t->p[0].fd, TUNSETOFFLOAD, fl) == 0)
            t->be.offloads |= 1ull << tap_guest_gso[i].feature;
    }
    if (ioctl(t->p[0].fd, TUNSETOFFLOAD, (unsigned long)TUN_F_CSUM) < 0) {
        rc = tap_err(err, errlen, -errno, "TUNSETOFFLOAD", ifname);
        goto err_close;
    }
    snprintf(t->be.desc, sizeof(t->be.desc), "tap %s (%u queue%s)", ifname, t->pairs,
             t->pairs == 1 ? "" : "s");
    *out = &t->be;
    return 0;

err_close:
    tap_close(&t->be);
    return rc;
}

/*
 * Write the frame (header first) to the pair's TAP queue. Non-blocking: a
 * full queue (EAGAIN) drops the frame (-ENOBUFS, counted by the device).
 */
static int tap_tx(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                  const struct vhd_net_frame *f)
{
    struct tap_be *t = (struct tap_be *)be;
    struct iovec iov[VHD_NET_CHAIN_IOV + 1];
    uint32_t n = 1;
    size_t off = f->off, left = f->len;
    (void)self;

    iov[0].iov_base = (void *)&f->hdr;
    iov[0].iov_len = HDR_LEN;
    for (uint32_t i = 0; i < f->iovcnt && left && n < VHD_ARRAY_SIZE(iov); i++) {
        if (off >= f->iov[i].iov_len) {
            off -= f->iov[i].iov_len;
            continue;
        }
        size_t len = f->iov[i].iov_len - off;
        if (len > left)
            len = left;
        iov[n].iov_base = (uint8_t *)f->iov[i].iov_base + off;
        iov[n].iov_len = len;
        n++;
        left -= len;
        off = 0;
    }
    if (writev(t->p[pair].fd, iov, (int)n) < 0) {
        VHD_LOG_RL(VHD_LOG_DEBUG, "%s: tap write failed: %s", be->dev->name, strerror(errno));
        return errno == EAGAIN ? -ENOBUFS : -EIO;
    }
    return 0;
}

/*
 * Read up to budget frames from the pair's TAP queue into the guest. The fd
 * is watched edge-triggered, so we read until EAGAIN (or the budget, after
 * which the runtime comes back because we return budget). A frame the
 * guest cannot take is dropped (counted by the device).
 */
static int tap_rx_poll(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                       unsigned budget)
{
    struct tap_be *t = (struct tap_be *)be;
    struct tap_pair *p = &t->p[pair];
    unsigned n = 0;

    while (n < budget) {
        ssize_t r = read(p->fd, p->buf, HDR_LEN + VHD_NET_MAX_FRAME);
        if (r < 0)
            break; /* EAGAIN: drained */
        n++;
        if ((size_t)r < HDR_LEN + 14u)
            continue;
        struct iovec iov = {.iov_base = p->buf + HDR_LEN, .iov_len = (size_t)r - HDR_LEN};
        struct vhd_net_frame f = {.iov = &iov, .iovcnt = 1, .off = 0, .len = (uint32_t)iov.iov_len};
        memcpy(&f.hdr, p->buf, HDR_LEN);
        f.hdr.num_buffers = 0;
        (void)vhd_net_deliver(be->dev, pair, self, &f);
    }
    return (int)n;
}

/*
 * The guest's features: let the kernel send the segmentation-offload
 * frames it negotiated (GUEST_TSO4/TSO6/ECN/UFO, which need GUEST_CSUM),
 * on every queue of the interface. TUN_F_CSUM stays on either way (see
 * TAP_OFFLOADS). 0 at reset turns them off.
 */
static int tap_set_features(struct vhd_net_backend *be, uint64_t features)
{
    struct tap_be *t = (struct tap_be *)be;
    unsigned long fl = TUN_F_CSUM;

    if (features & (1ull << VIRTIO_NET_F_GUEST_CSUM))
        for (size_t i = 0; i < VHD_ARRAY_SIZE(tap_guest_gso); i++)
            if (features & (1ull << tap_guest_gso[i].feature))
                fl |= tap_guest_gso[i].tun;
    if (!(fl & (TUN_F_TSO4 | TUN_F_TSO6)))
        fl &= ~(unsigned long)TUN_F_TSO_ECN; /* ECN qualifies TSO; the kernel refuses it alone */
    for (uint32_t i = 0; i < t->pairs; i++) {
        if (ioctl(t->p[i].fd, TUNSETOFFLOAD, fl) < 0) {
            int rc = -errno;
            vhd_log(VHD_LOG_WARN, "%s: TUNSETOFFLOAD 0x%lx: %s", be->dev->name, fl, strerror(-rc));
            return rc;
        }
    }
    return 0;
}

static int tap_rx_wake_fd(struct vhd_net_backend *be, uint16_t pair)
{
    struct tap_be *t = (struct tap_be *)be;
    return pair < t->pairs ? t->p[pair].fd : -1;
}

const struct vhd_net_backend_ops vhd_net_backend_tap = {
    .name = "tap",
    .open = tap_open,
    .close = tap_close,
    .tx = tap_tx,
    .rx_poll = tap_rx_poll,
    .rx_wake_fd = tap_rx_wake_fd,
    .set_features = tap_set_features,
};
