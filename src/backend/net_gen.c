/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The "gen" packet backend: a traffic generator and sink for measuring the
 * device alone. Every receive queue is filled with generated 64-byte frames
 * as fast as the guest posts buffers (the device's enqueue rate, with no
 * dequeue behind it); every transmitted frame is discarded and counted as a
 * transmit drop (the dequeue rate, with no enqueue behind it). It is the
 * vhost-side equivalent of DPDK testpmd's txonly mode on a vhost port.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/compiler.h"
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
 * Frames kept ready per pair, each in the layout the device copies from:
 * header (all zero: no offloads) then the frame. Frame seq lives in slot
 * seq % GEN_SLOTS, and its sequence number is written GEN_SLOTS frames
 * before it is sent, right after the slot's previous frame went out. Writing
 * it just before the copy cost a store-forwarding stall per frame: the copy's
 * wide load across those narrow stores cannot take them from the store
 * buffer and waits until every older store, including the stores into the
 * driver's buffers (lines owned by its CPU), has reached the cache (perf:
 * 29% of the worker's samples on that one load). 32 slots is far more
 * stores than the store buffer holds.
 */
#define GEN_SLOTS     32u
#define GEN_SLOT_SIZE 128u /* GEN_HDR_LEN + GEN_FRAME_LEN rounded to cache lines */
_Static_assert(GEN_HDR_LEN + GEN_FRAME_LEN <= GEN_SLOT_SIZE, "a frame fits its slot");

/*
 * One queue pair's generator, touched only by the worker that owns the
 * pair's receive queue (cache line aligned, so two workers never share a
 * line).
 */
struct gen_pair {
    uint8_t slot[GEN_SLOTS][GEN_SLOT_SIZE];
    /* Frames generated on this pair: delivered or dropped for want of a buffer. */
    uint32_t seq;
    uint8_t mac[6]; /* the destination in every slot */
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
static void gen_put_seq(struct gen_pair *gp, uint32_t seq)
{
    uint32_t be = htonl(seq); /* big-endian, one store */

    memcpy(gp->slot[seq % GEN_SLOTS] + GEN_HDR_LEN + 14, &be, 4);
}

static void gen_frame_init(struct gen_pair *gp, uint16_t pair)
{
    memset(gp, 0, sizeof(*gp));
    for (uint32_t i = 0; i < GEN_SLOTS; i++) {
        uint8_t *f = gp->slot[i] + GEN_HDR_LEN;
        f[6] = 0x02;
        f[10] = (uint8_t)(pair >> 8);
        f[11] = (uint8_t)pair;
        f[12] = (uint8_t)(GEN_ETHERTYPE >> 8);
        f[13] = (uint8_t)GEN_ETHERTYPE;
        gen_put_seq(gp, i);
    }
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
    for (uint32_t i = 0; i < pairs; i++)
        gen_frame_init(&p[i], (uint16_t)i);
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
 * (VIRTIO_NET_CTRL_MAC_ADDR_SET may change it), read once per call and
 * written into the slots when it changed. Returns the frames delivered.
 */
static int gen_rx_poll(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                       unsigned budget)
{
    struct gen_be *g = (struct gen_be *)be;

    if (vhd_unlikely(pair >= g->pairs))
        return 0;
    struct gen_pair *gp = &g->p[pair];
    uint8_t mac[6];
    vhd_net_get_mac(be->dev, mac);
    if (vhd_unlikely(memcmp(mac, gp->mac, 6) != 0)) {
        memcpy(gp->mac, mac, 6);
        for (uint32_t i = 0; i < GEN_SLOTS; i++)
            memcpy(gp->slot[i] + GEN_HDR_LEN, mac, 6);
    }
    /*
     * Bursts of up to GEN_SLOTS frames, each from its own slot, delivered
     * with VHD_NET_DELIVER_STOP: the burst ends at the first frame not
     * delivered, which was generated and dropped (counted by the receive
     * queue), or not generated at all when the ring is not ours (-ENODEV).
     */
    struct iovec iov[GEN_SLOTS];
    struct vhd_net_frame f[GEN_SLOTS];
    int rc[GEN_SLOTS];
    unsigned n = 0;
    bool more = true;
    memset(f, 0, sizeof(f)); /* headers all zero: no offloads */
    for (unsigned i = 0; i < GEN_SLOTS; i++) {
        iov[i].iov_len = GEN_HDR_LEN + GEN_FRAME_LEN;
        f[i].iov = &iov[i];
        f[i].iovcnt = 1;
        f[i].off = GEN_HDR_LEN;
        f[i].len = GEN_FRAME_LEN;
    }
    while (n < budget && more) {
        unsigned k = budget - n < GEN_SLOTS ? budget - n : GEN_SLOTS;
        uint32_t seq = gp->seq;
        for (unsigned i = 0; i < k; i++)
            iov[i].iov_base = gp->slot[(seq + i) % GEN_SLOTS];
        unsigned h = vhd_net_deliver_burst(be->dev, pair, self, f, k, VHD_NET_DELIVER_STOP, rc);
        for (unsigned i = 0; i < h; i++) {
            if (rc[i] == -ENODEV) {
                more = false; /* not our ring (stopped, disabled, pair not in use) */
                break;
            }
            gen_put_seq(gp, seq + GEN_SLOTS); /* the slot's next frame */
            gp->seq = ++seq;
            if (rc[i] < 0)
                more = false; /* dropped and counted by the receive queue */
            else
                n++;
        }
        if (h < k)
            more = false;
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
