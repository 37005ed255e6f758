/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The "gen" packet backend: a traffic generator and sink for measuring the
 * device alone. Every receive queue is filled with generated 64-byte frames
 * as fast as the guest posts buffers (the device's enqueue rate, with no
 * dequeue behind it); every transmitted frame is discarded and counted as a
 * transmit drop (the dequeue rate, with no enqueue behind it). It is the
 * vhost-side equivalent of DPDK testpmd's txonly mode on a vhost port.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/compiler.h"
#include "dev/net.h"
#include "net_backend.h"

/*
 * Generated frame length without the virtio header: 64 bytes, the size
 * DPDK testpmd's txonly mode sends by default (its --txpkts, no FCS), so a
 * comparison with a DPDK generator moves the same bytes.
 */
#define GEN_FRAME_LEN 64u

#define GEN_HDR_LEN ((uint32_t)sizeof(struct virtio_net_hdr_v1))

/* IEEE 802 "local experimental" ethertype: no stack takes the frames for anything else. */
#define GEN_ETHERTYPE 0x88b5u

/*
 * One queue pair's generator, touched only by the worker that owns the
 * pair's receive queue (one cache line aligned slot each, so two workers
 * never share a line). The frame is kept ready in the layout the device
 * copies from: header (all zero: no offloads) then the frame.
 */
struct gen_pair {
    uint8_t buf[GEN_HDR_LEN + GEN_FRAME_LEN];
    /* Frames generated on this pair: delivered or dropped for want of a buffer. */
    uint32_t seq;
} vhd_cacheline_aligned;

struct gen_be {
    struct vhd_net_backend be; /* first: the common head */
    uint32_t pairs;
    struct gen_pair *p; /* [pairs] */
};

/*
 * Frame layout (all multi-byte fields big-endian, as on a wire):
 *   0  destination: the device's MAC (the guest's own address)
 *   6  source: 02:00:00:00:<pair high>:<pair low> (locally administered)
 *  12  ethertype GEN_ETHERTYPE
 *  14  sequence number of the frame on its pair (gen_pair.seq at generation)
 *  18  zero padding to GEN_FRAME_LEN
 * A receiver sees consecutive numbers except where frames were dropped
 * (counted as drops of the receive queue).
 */
static void gen_frame_init(struct gen_pair *gp, uint16_t pair)
{
    uint8_t *f = gp->buf + GEN_HDR_LEN;

    memset(gp->buf, 0, sizeof(gp->buf));
    f[6] = 0x02;
    f[10] = (uint8_t)(pair >> 8);
    f[11] = (uint8_t)pair;
    f[12] = (uint8_t)(GEN_ETHERTYPE >> 8);
    f[13] = (uint8_t)GEN_ETHERTYPE;
}

static int gen_open(const struct vhd_net_backend_opts *o, struct vhd_dev *dev,
                    struct vhd_net_backend **out, char *err, size_t errlen)
{
    uint32_t pairs = o->pairs ? o->pairs : 1;
    struct gen_be *g = calloc(1, sizeof(*g));
    struct gen_pair *p = aligned_alloc(VHD_CACHELINE, pairs * sizeof(*p));

    if (!g || !p) {
        free(g);
        free(p);
        if (err && errlen)
            snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    for (uint32_t i = 0; i < pairs; i++) {
        gen_frame_init(&p[i], (uint16_t)i);
        p[i].seq = 0;
    }
    g->be.ops = &vhd_net_backend_gen;
    g->be.dev = dev;
    g->be.offloads = 0;
    snprintf(g->be.desc, sizeof(g->be.desc), "gen (%u-byte frames)", GEN_FRAME_LEN);
    g->pairs = pairs;
    g->p = p;
    *out = &g->be;
    return 0;
}

static void gen_close(struct vhd_net_backend *be)
{
    struct gen_be *g = (struct gen_be *)be;

    free(g->p);
    free(g);
}

/* The sink: nobody receives transmitted frames; the device counts each as a transmit drop. */
static int gen_tx(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                  const struct vhd_net_frame *f)
{
    (void)be;
    (void)pair;
    (void)self;
    (void)f;
    return -ENODEV;
}

/*
 * The generator: deliver up to budget frames into the receive queue of
 * pair, stopping at the first frame the device cannot take (no buffer
 * posted: that frame is dropped and counted by the receive queue, as a NIC
 * counts a frame that arrived with no buffer; or the ring is not ours or is
 * broken). The destination follows the device's current MAC
 * (VIRTIO_NET_CTRL_MAC_ADDR_SET may change it), read once per call.
 * Returns the frames delivered.
 */
static int gen_rx_poll(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                       unsigned budget)
{
    struct gen_be *g = (struct gen_be *)be;

    if (vhd_unlikely(pair >= g->pairs))
        return 0;
    struct gen_pair *gp = &g->p[pair];
    uint8_t *frame = gp->buf + GEN_HDR_LEN;
    vhd_net_get_mac(be->dev, frame);
    struct iovec iov = {.iov_base = gp->buf, .iov_len = sizeof(gp->buf)};
    struct vhd_net_frame f = {.iov = &iov, .iovcnt = 1, .off = GEN_HDR_LEN, .len = GEN_FRAME_LEN};
    memcpy(&f.hdr, gp->buf, GEN_HDR_LEN);

    unsigned n = 0;
    while (n < budget) {
        uint32_t seq = gp->seq;
        frame[14] = (uint8_t)(seq >> 24);
        frame[15] = (uint8_t)(seq >> 16);
        frame[16] = (uint8_t)(seq >> 8);
        frame[17] = (uint8_t)seq;
        int rc = vhd_net_deliver(be->dev, pair, self, &f);
        if (rc == -ENODEV)
            break; /* not our ring (stopped, disabled, pair not in use): nothing generated */
        gp->seq = seq + 1;
        if (rc < 0)
            break; /* dropped and counted by the receive queue */
        n++;
    }
    return (int)n;
}

const struct vhd_net_backend_ops vhd_net_backend_gen = {
    .name = "gen",
    .open = gen_open,
    .close = gen_close,
    .tx = gen_tx,
    .rx_poll = gen_rx_poll,
    .rx_wake_fd = NULL,
    .rx_buffers_are_work = true,
};
