/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The loopback packet backend: every frame the guest sends on queue pair i
 * comes straight back on the receive queue of pair i, copied once from the
 * transmit buffers into the receive buffers on the pair's worker. It is the
 * vhost-side equivalent of an io-forwarding loop, and the benchmark mode.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "net_backend.h"

/*
 * Offloads: CSUM and GUEST_CSUM. The virtio_net_hdr travels with the frame
 * unchanged (only num_buffers is rewritten), so a partial checksum the
 * driver leaves on transmit (CSUM) reaches the same driver on receive with
 * NEEDS_CSUM still set, which is valid when it negotiated GUEST_CSUM
 * (5.1.6.4.1: "the device MAY set NEEDS_CSUM" with GUEST_CSUM); when it did
 * not, vhd_net_deliver completes the checksum in software before passing
 * the frame on (5.1.6.4.1: without GUEST_CSUM flags is 0 and the packet
 * fully checksummed). Nothing leaves the host, so no checksum is ever
 * needed on a wire. Segmentation offloads (HOST_TSO*, GUEST_TSO*, UFO, USO)
 * are not offered: a driver with HOST_TSO but not GUEST_TSO would need
 * software segmentation, and a 64 KiB frame would not fit receive buffers
 * posted without MRG_RXBUF.
 */
#define LOOPBACK_OFFLOADS ((1ull << VIRTIO_NET_F_CSUM) | (1ull << VIRTIO_NET_F_GUEST_CSUM))

static int loopback_open(const struct vhd_net_backend_opts *o, struct vhd_dev *dev,
                         struct vhd_net_backend **out, char *err, size_t errlen)
{
    (void)o;
    struct vhd_net_backend *be = calloc(1, sizeof(*be));
    if (!be) {
        if (err && errlen)
            snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    be->ops = &vhd_net_backend_loopback;
    be->dev = dev;
    be->offloads = LOOPBACK_OFFLOADS;
    snprintf(be->desc, sizeof(be->desc), "loopback");
    *out = be;
    return 0;
}

static void loopback_close(struct vhd_net_backend *be)
{
    free(be);
}

/*
 * The frame goes back on the same pair, on this worker (the device keeps
 * both rings of a pair on one worker). A full or broken receive ring drops
 * it and counts it there; only "no receive ring" (-ENODEV) is reported
 * back, for the transmit side to count.
 */
static int loopback_tx(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                       const struct vhd_net_frame *f)
{
    int rc = vhd_net_deliver(be->dev, pair, self, f);
    return rc == -ENODEV ? rc : 0;
}

/*
 * A transmit burst comes back as one receive burst (vhd_net_deliver_burst):
 * the receiving ring counts what it drops; only a burst with no receive ring
 * to go to is the sender's to count, all of it.
 */
static unsigned loopback_tx_burst(struct vhd_net_backend *be, uint16_t pair,
                                  struct vhd_worker *self, const struct vhd_net_frame *f,
                                  unsigned n)
{
    int rc = 0;
    (void)vhd_net_deliver_burst(be->dev, pair, self, f, n, VHD_NET_DELIVER_ONE_RC, &rc);
    return rc == -ENODEV ? n : 0;
}

const struct vhd_net_backend_ops vhd_net_backend_loopback = {
    .name = "loopback",
    .open = loopback_open,
    .close = loopback_close,
    .tx = loopback_tx,
    .tx_burst = loopback_tx_burst,
    .rx_poll = NULL,
};
