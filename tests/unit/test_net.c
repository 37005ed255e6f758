/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * virtio-net device tests (src/dev/net.c, src/backend/net_loopback.c): a
 * real device from vhd_net_new, its rings run by the real runtime (worker
 * threads, kick and call eventfds), driven by the mock driver over memfd
 * guest memory, without sockets. Loopback on several pairs, mergeable
 * buffers, drops, disabled rings, checksums, the control queue (good and
 * malformed commands), config space, the worker map and creation errors.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "backend/net_backend.h"
#include "core/vq.h"
#include "dev/net.h"
#include "spec/virtio_net.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "harness.h"
#include "runtime/log.h"
#include "runtime/rt.h"

#define QSIZE     256
#define MAX_PAIRS 4
#define MAX_Q     (2 * MAX_PAIRS + 1)
#define WAIT_MS   5000
#define MEM_SIZE  (64ull << 20)
#define MEM_BASE  0x100000ull
#define BIT(n)    (1ull << (n))
#define HDR       12u

/* ======================= test bed ======================= */

struct tb_opts {
    uint32_t pairs;        /* default 1 */
    unsigned nworkers;     /* default 1 */
    bool packed;           /* RING_PACKED */
    bool ctrl;             /* start the control queue */
    uint64_t features_off; /* offered bits the driver does not accept */
    bool indirect;         /* driver puts chains in indirect tables */
};

struct tq {
    struct vhd_queue *q;
    struct vhd_drv_vq dq;
    int kick_fd, call_fd;
    bool set_up;
};

struct tb {
    struct tb_opts o;
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    struct vhd_rt *rt;
    struct vhd_dev *dev;
    struct tq tq[MAX_Q];
    uint32_t nq;   /* queues of the device */
    uint32_t ctrl; /* index of the control queue */
    uint64_t features;
};

static const uint8_t test_mac[6] = {0x52, 0x54, 0x00, 0xaa, 0xbb, 0x01};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Guest memory: gpa, and our pointer in *p (filled with `fill`). */
static uint64_t galloc(struct tb *t, uint64_t len, uint8_t fill, uint8_t **p)
{
    void *hva;
    uint64_t gpa = vhd_guestmem_alloc(&t->gm, len ? len : 1, 16, &hva);
    VHD_CHECK(gpa != UINT64_MAX);
    memset(hva, fill, len ? len : 1);
    if (p)
        *p = hva;
    return gpa;
}

static void tq_setup(struct tb *t, unsigned i)
{
    struct tq *tq = &t->tq[i];
    struct vhd_queue *q = &t->dev->queues[i];
    uint32_t max_ind = 8;
    size_t area_len = vhd_drv_vq_area_size(QSIZE, t->o.packed, max_ind);
    void *area;
    uint64_t area_gpa = vhd_guestmem_alloc(&t->gm, area_len, 4096, &area);

    VHD_CHECK(area_gpa != UINT64_MAX);
    struct vhd_drv_vq_params dp = {.size = QSIZE,
                                   .packed = t->o.packed,
                                   .event_idx = true,
                                   .max_indirect = max_ind,
                                   .area = area,
                                   .area_gpa = area_gpa,
                                   .area_len = area_len};
    VHD_CHECK_EQ(vhd_drv_vq_init(&tq->dq, &dp), 0);
    struct vhd_vq_params vp = {.size = QSIZE,
                               .packed = t->o.packed,
                               .event_idx = true,
                               .indirect = true,
                               .addr_is_gpa = true,
                               .desc = tq->dq.desc_gpa,
                               .avail = tq->dq.avail_gpa,
                               .used = tq->dq.used_gpa};
    q->size = QSIZE;
    VHD_CHECK_EQ(vhd_vq_init(&q->vq, &vp, t->mem), 0);
    VHD_CHECK_EQ(vhd_vq_start(&q->vq), 0);
    tq->kick_fd = eventfd(0, EFD_CLOEXEC);
    tq->call_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    VHD_CHECK(tq->kick_fd >= 0 && tq->call_fd >= 0);
    q->kick_fd = tq->kick_fd;
    q->call_fd = tq->call_fd;
    q->started = true;
    q->enabled = true;
    VHD_CHECK_EQ(t->dev->ops->queue_init(t->dev, q), 0);
    tq->q = q;
    tq->set_up = true;
}

/* The transport's mapping: dev->queue_worker[i] modulo the worker count. */
static unsigned worker_of(struct tb *t, unsigned i)
{
    return (unsigned)t->dev->queue_worker[i] % vhd_rt_nworkers(t->rt);
}

static void tq_attach(struct tb *t, unsigned i)
{
    VHD_CHECK_EQ(vhd_rt_attach(t->rt, t->tq[i].q, worker_of(t, i)), 0);
}

static void tq_detach(struct tb *t, unsigned i)
{
    VHD_CHECK_EQ(vhd_rt_detach(t->rt, t->tq[i].q, WAIT_MS), 0);
}

static void tb_init(struct tb *t, const struct tb_opts *o)
{
    char err[256];

    memset(t, 0, sizeof(*t));
    t->o = *o;
    if (!t->o.pairs)
        t->o.pairs = 1;
    vhd_log_set_level(VHD_LOG_ERROR);
    struct vhd_net_opts no = {
        .name = "tnet", .pairs = t->o.pairs, .mac = test_mac, .mtu = 1500, .allow_packed = true};
    int rc = vhd_net_new(&no, &t->dev, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  vhd_net_new: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    t->nq = t->dev->num_queues;
    VHD_CHECK_EQ(t->nq, 2 * t->o.pairs + 1);

    uint64_t f = t->dev->ops->features(t->dev) & ~o->features_off;
    if (!o->packed)
        f &= ~BIT(VIRTIO_F_RING_PACKED);
    t->features = f;
    VHD_CHECK_EQ(t->dev->ops->set_features(t->dev, f), 0);
    t->ctrl = (f & BIT(VIRTIO_NET_F_MQ)) ? 2 * t->o.pairs : 2;

    struct vhd_mem_region_desc d[1];
    VHD_CHECK_EQ(vhd_guestmem_init(&t->gm, 1, MEM_SIZE, MEM_BASE, 0), 0);
    vhd_guestmem_descs(&t->gm, d);
    VHD_CHECK_EQ(vhd_mem_new(d, 1, &t->mem), 0);
    t->dev->mem = t->mem;

    struct vhd_rt_opts ro;
    vhd_rt_opts_default(&ro);
    ro.nworkers = o->nworkers ? o->nworkers : 1;
    VHD_CHECK_EQ(vhd_rt_new(&ro, &t->rt), 0);
    t->dev->rt = t->rt;
    uint32_t ndata = (f & BIT(VIRTIO_NET_F_MQ)) ? 2 * t->o.pairs : 2;
    for (unsigned i = 0; i < ndata; i++)
        tq_setup(t, i);
    if (o->ctrl)
        tq_setup(t, t->ctrl);
    for (unsigned i = 0; i < t->nq; i++)
        if (t->tq[i].set_up)
            tq_attach(t, i);
}

static void tb_fini(struct tb *t)
{
    for (unsigned i = 0; i < t->nq; i++) {
        struct tq *tq = &t->tq[i];
        if (!tq->set_up)
            continue;
        if (tq->q->attached || tq->q->worker)
            tq_detach(t, i);
        t->dev->ops->queue_fini(t->dev, tq->q);
        close(tq->kick_fd);
        close(tq->call_fd);
        vhd_drv_vq_fini(&tq->dq);
    }
    vhd_rt_free(t->rt);
    t->dev->mem = NULL;
    vhd_net_free(t->dev);
    vhd_mem_free(t->mem);
    vhd_guestmem_fini(&t->gm);
}

/* Add one chain to queue i, publish and kick. */
static void tq_add(struct tb *t, unsigned i, const struct vhd_drv_buf *bufs, uint32_t nr,
                   uint32_t nw, void *cookie)
{
    struct tq *tq = &t->tq[i];
    VHD_CHECK_EQ(vhd_drv_vq_add(&tq->dq, bufs, nr, nw, t->o.indirect, cookie), 0);
    vhd_drv_vq_publish(&tq->dq);
    if (vhd_drv_vq_kick_needed(&tq->dq))
        VHD_CHECK_EQ(eventfd_write(tq->kick_fd, 1), 0);
}

/* Wait (bounded by ms) for one used element of queue i. 1 with cookie and len, 0 on timeout. */
static int tq_wait_ms(struct tb *t, unsigned i, void **cookie, uint32_t *len, int ms)
{
    struct tq *tq = &t->tq[i];
    uint64_t t0 = mono_ms();

    for (;;) {
        int rc = vhd_drv_vq_get_used(&tq->dq, cookie, len);
        VHD_CHECK(rc >= 0);
        if (rc == 1)
            return 1;
        if (vhd_drv_vq_enable_cb(&tq->dq))
            continue;
        if (mono_ms() - t0 > (uint64_t)ms)
            return 0;
        struct pollfd pfd = {.fd = tq->call_fd, .events = POLLIN};
        VHD_CHECK(poll(&pfd, 1, 10) >= 0);
        eventfd_t v;
        (void)eventfd_read(tq->call_fd, &v);
    }
}

static void *tq_wait(struct tb *t, unsigned i, uint32_t *len)
{
    void *cookie = NULL;
    if (!tq_wait_ms(t, i, &cookie, len, WAIT_MS)) {
        fprintf(stderr, "  queue %u: no used element within %d ms\n", i, WAIT_MS);
        VHD_CHECK(0);
    }
    return cookie;
}

/* Nothing used on queue i within ms. */
static bool tq_quiet(struct tb *t, unsigned i, int ms)
{
    void *cookie;
    uint32_t len;
    return tq_wait_ms(t, i, &cookie, &len, ms) == 0;
}

/* One receive buffer: its memory, for checking. */
struct rxbuf {
    uint8_t *p;
    uint32_t len;
};

/* Post n receive buffers of len bytes on pair p; cookies are &bufs[k]. */
static void rx_post(struct tb *t, unsigned pair, struct rxbuf *bufs, unsigned n, uint32_t len)
{
    for (unsigned k = 0; k < n; k++) {
        struct vhd_drv_buf b = {galloc(t, len, 0xee, &bufs[k].p), len};
        bufs[k].len = len;
        tq_add(t, 2 * pair, &b, 0, 1, &bufs[k]);
    }
}

/* A test frame: Ethernet header + payload, bytes from seed. */
static void make_frame(uint8_t *f, uint32_t len, uint32_t seed)
{
    static const uint8_t dst[6] = {0x02, 0, 0, 0, 0, 0x99};
    memcpy(f, dst, 6);
    memcpy(f + 6, test_mac, 6);
    f[12] = 0x88;
    f[13] = 0xb5; /* local experimental ethertype */
    for (uint32_t i = 14; i < len; i++)
        f[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 8));
}

/*
 * Transmit one frame on pair p: a 12-byte header (hdr, or zeroes) then the
 * frame, as two descriptors (split_hdr) or one. Returns after the device
 * used the chain (length checked: 0).
 */
static void tx_send(struct tb *t, unsigned pair, const uint8_t *frame, uint32_t len,
                    const struct virtio_net_hdr_v1 *hdr, bool split_hdr)
{
    uint8_t *p;
    struct vhd_drv_buf b[2];
    uint32_t n = 0, ulen = 99;
    struct virtio_net_hdr_v1 h = {0};

    if (hdr)
        h = *hdr;
    if (split_hdr) {
        b[n].gpa = galloc(t, HDR, 0, &p);
        memcpy(p, &h, HDR);
        b[n++].len = HDR;
        b[n].gpa = galloc(t, len, 0, &p);
        memcpy(p, frame, len);
        b[n++].len = len;
    } else {
        b[n].gpa = galloc(t, HDR + len, 0, &p);
        memcpy(p, &h, HDR);
        memcpy(p + HDR, frame, len);
        b[n++].len = HDR + len;
    }
    tq_add(t, 2 * pair + 1, b, n, 0, (void *)(uintptr_t)0x7e);
    VHD_CHECK(tq_wait(t, 2 * pair + 1, &ulen) == (void *)(uintptr_t)0x7e);
    VHD_CHECK_EQ(ulen, 0);
}

/* Wait for one received packet on pair p that fits one buffer; check it is frame. */
static struct virtio_net_hdr_v1 rx_expect(struct tb *t, unsigned pair, const uint8_t *frame,
                                          uint32_t len)
{
    uint32_t ulen;
    struct rxbuf *rb = tq_wait(t, 2 * pair, &ulen);
    struct virtio_net_hdr_v1 h;
    VHD_CHECK(rb != NULL);
    VHD_CHECK_EQ(ulen, HDR + len);
    memcpy(&h, rb->p, HDR);
    VHD_CHECK_EQ(vhd_le16(h.num_buffers), 1);
    VHD_CHECK(memcmp(rb->p + HDR, frame, len) == 0);
    return h;
}

static struct vhd_net_queue_stats qstats(struct tb *t, unsigned i)
{
    struct vhd_net_queue_stats st;
    VHD_CHECK_EQ(vhd_net_queue_stats(t->dev, i, &st), 0);
    return st;
}

/* Counters are stored at the end of each burst: wait until q's packets reach n. */
static struct vhd_net_queue_stats qstats_wait(struct tb *t, unsigned i, uint64_t packets)
{
    uint64_t t0 = mono_ms();
    struct vhd_net_queue_stats st = qstats(t, i);
    while (st.packets < packets && mono_ms() - t0 < WAIT_MS) {
        usleep(1000);
        st = qstats(t, i);
    }
    return st;
}

/* ======================= loopback ======================= */

static void loopback_pairs(const struct tb_opts *o)
{
    struct tb t;
    static struct rxbuf rb[MAX_PAIRS][8];
    uint8_t frame[256];

    tb_init(&t, o);
    for (unsigned p = 0; p < t.o.pairs; p++) {
        /* both rings of a pair on one worker; pairs spread over the workers */
        VHD_CHECK_EQ(worker_of(&t, 2 * p), worker_of(&t, 2 * p + 1));
        rx_post(&t, p, rb[p], 8, 2048);
    }
    if (t.o.pairs > 1 && o->nworkers > 1)
        VHD_CHECK(worker_of(&t, 0) != worker_of(&t, 2));
    for (unsigned round = 0; round < 3; round++) {
        for (unsigned p = 0; p < t.o.pairs; p++) {
            uint32_t len = 60 + 17 * p + round;
            make_frame(frame, len, p * 10 + round);
            tx_send(&t, p, frame, len, NULL, round & 1);
            struct virtio_net_hdr_v1 h = rx_expect(&t, p, frame, len);
            VHD_CHECK_EQ(h.flags, 0);
            VHD_CHECK_EQ(h.gso_type, 0);
        }
    }
    /* nothing crossed to another pair */
    for (unsigned p = 0; p < t.o.pairs; p++)
        VHD_CHECK(tq_quiet(&t, 2 * p, 20));
    for (unsigned p = 0; p < t.o.pairs; p++) {
        struct vhd_net_queue_stats tx = qstats_wait(&t, 2 * p + 1, 3);
        struct vhd_net_queue_stats rx = qstats_wait(&t, 2 * p, 3);
        VHD_CHECK_EQ(tx.packets, 3);
        VHD_CHECK_EQ(rx.packets, 3);
        VHD_CHECK_EQ(rx.buffers, 3);
        VHD_CHECK_EQ(tx.bytes, rx.bytes);
        VHD_CHECK_EQ(tx.bytes, 3 * (60 + 17 * p) + 0 + 1 + 2);
        VHD_CHECK_EQ(tx.largest, 60 + 17 * p + 2); /* the last round's frame is the longest */
        VHD_CHECK_EQ(rx.largest, 60 + 17 * p + 2);
        VHD_CHECK_EQ(tx.drops + tx.errors + rx.drops + rx.errors, 0);
    }
    tb_fini(&t);
}

VHD_TEST(loopback_split_one_pair)
{
    struct tb_opts o = {.pairs = 1};
    loopback_pairs(&o);
}

VHD_TEST(loopback_split_four_pairs_two_workers)
{
    struct tb_opts o = {.pairs = 4, .nworkers = 2};
    loopback_pairs(&o);
}

VHD_TEST(loopback_packed_four_pairs_indirect)
{
    struct tb_opts o = {.pairs = 4, .nworkers = 2, .packed = true, .indirect = true};
    loopback_pairs(&o);
}

VHD_TEST(loopback_no_mrg_rxbuf)
{
    struct tb_opts o = {.pairs = 2, .features_off = BIT(VIRTIO_NET_F_MRG_RXBUF)};
    loopback_pairs(&o);
}

/* Many frames in one burst: every one comes back in order. */
VHD_TEST(loopback_burst)
{
    struct tb t;
    struct tb_opts o = {.pairs = 1};
    static struct rxbuf rb[200];
    static uint8_t frames[200][128];
    uint32_t ulen;

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 200, 1024);
    for (unsigned k = 0; k < 200; k++) {
        struct vhd_drv_buf b;
        uint8_t *p;
        make_frame(frames[k], 128, k);
        b.gpa = galloc(&t, HDR + 128, 0, &p);
        memcpy(p + HDR, frames[k], 128);
        b.len = HDR + 128;
        VHD_CHECK_EQ(vhd_drv_vq_add(&t.tq[1].dq, &b, 1, 0, false, (void *)(uintptr_t)(k + 1)), 0);
    }
    vhd_drv_vq_publish(&t.tq[1].dq);
    VHD_CHECK_EQ(eventfd_write(t.tq[1].kick_fd, 1), 0);
    for (unsigned k = 0; k < 200; k++) {
        struct rxbuf *r = tq_wait(&t, 0, &ulen);
        VHD_CHECK(r == &rb[k]);
        VHD_CHECK_EQ(ulen, HDR + 128);
        VHD_CHECK(memcmp(r->p + HDR, frames[k], 128) == 0);
    }
    /* IN_ORDER (negotiated here: the bed takes every offered bit): TX used in avail order too. */
    VHD_CHECK(t.features & BIT(VIRTIO_F_IN_ORDER));
    for (unsigned k = 0; k < 200; k++)
        VHD_CHECK(tq_wait(&t, 1, &ulen) == (void *)(uintptr_t)(k + 1));
    tb_fini(&t);
}

/* ======================= mergeable receive buffers ======================= */

static void mrg_large_frame(bool packed)
{
    struct tb t;
    struct tb_opts o = {.pairs = 1, .packed = packed};
    struct rxbuf rb[8];
    uint8_t frame[1000], got[1100];
    uint32_t ulen, want_len[4] = {256, 256, 256, HDR + 1000 - 3 * 256};

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 8, 256);
    make_frame(frame, sizeof(frame), 42);
    tx_send(&t, 0, frame, sizeof(frame), NULL, false);
    /* 12 + 1000 bytes in 256-byte buffers: 4 buffers, num_buffers 4 in the first header. */
    uint32_t off = 0;
    for (unsigned k = 0; k < 4; k++) {
        struct rxbuf *r = tq_wait(&t, 0, &ulen);
        VHD_CHECK(r == &rb[k]);
        VHD_CHECK_EQ(ulen, want_len[k]);
        memcpy(got + off, r->p, ulen);
        off += ulen;
    }
    struct virtio_net_hdr_v1 h;
    memcpy(&h, got, HDR);
    VHD_CHECK_EQ(vhd_le16(h.num_buffers), 4);
    VHD_CHECK_EQ(off, HDR + sizeof(frame));
    VHD_CHECK(memcmp(got + HDR, frame, sizeof(frame)) == 0);
    struct vhd_net_queue_stats rx = qstats_wait(&t, 0, 1);
    VHD_CHECK_EQ(rx.packets, 1);
    VHD_CHECK_EQ(rx.buffers, 4);
    VHD_CHECK_EQ(rx.bytes, sizeof(frame));

    /* Not enough buffers left for another (4 left, 5 needed): dropped, buffers kept. */
    uint8_t big[1100];
    make_frame(big, sizeof(big), 43);
    tx_send(&t, 0, big, sizeof(big), NULL, false);
    VHD_CHECK(tq_quiet(&t, 0, 50));
    rx = qstats(&t, 0);
    VHD_CHECK_EQ(rx.drops, 1);
    /* ...and the next small frame lands in the first buffer still posted. */
    make_frame(frame, 100, 44);
    tx_send(&t, 0, frame, 100, NULL, false);
    struct rxbuf *r = tq_wait(&t, 0, &ulen);
    VHD_CHECK(r == &rb[4]);
    VHD_CHECK_EQ(ulen, HDR + 100);
    VHD_CHECK(memcmp(r->p + HDR, frame, 100) == 0);
    tb_fini(&t);
}

VHD_TEST(mrg_rxbuf_large_frame_split)
{
    mrg_large_frame(false);
}

VHD_TEST(mrg_rxbuf_large_frame_packed)
{
    mrg_large_frame(true);
}

/* Without MRG_RXBUF a frame must fit one buffer: a larger one is dropped, the buffer kept. */
VHD_TEST(no_mrg_frame_too_big_for_buffer)
{
    struct tb t;
    struct tb_opts o = {.features_off = BIT(VIRTIO_NET_F_MRG_RXBUF)};
    struct rxbuf rb[2];
    uint8_t frame[600];
    uint32_t ulen;

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 2, 512);
    make_frame(frame, sizeof(frame), 1);
    tx_send(&t, 0, frame, sizeof(frame), NULL, false);
    VHD_CHECK(tq_quiet(&t, 0, 50));
    VHD_CHECK_EQ(qstats(&t, 0).drops, 1);
    tx_send(&t, 0, frame, 500 - HDR, NULL, true);
    struct rxbuf *r = tq_wait(&t, 0, &ulen);
    VHD_CHECK(r == &rb[0]);
    VHD_CHECK_EQ(ulen, 500);
    struct virtio_net_hdr_v1 h;
    memcpy(&h, r->p, HDR);
    VHD_CHECK_EQ(vhd_le16(h.num_buffers), 1); /* 5.1.6.4.1: 1 without MRG_RXBUF */
    tb_fini(&t);
}

/* No receive buffer: the frame is dropped and counted; later frames flow again. */
VHD_TEST(no_rx_buffer_drops)
{
    struct tb t;
    struct tb_opts o = {0};
    struct rxbuf rb[1];
    uint8_t frame[64];

    tb_init(&t, &o);
    make_frame(frame, sizeof(frame), 3);
    for (int k = 0; k < 3; k++)
        tx_send(&t, 0, frame, sizeof(frame), NULL, false);
    struct vhd_net_queue_stats tx = qstats_wait(&t, 1, 3), rx = qstats(&t, 0);
    VHD_CHECK_EQ(tx.packets, 3);
    VHD_CHECK_EQ(tx.drops, 0);
    VHD_CHECK_EQ(rx.drops, 3);
    VHD_CHECK_EQ(rx.packets, 0);
    rx_post(&t, 0, rb, 1, 2048);
    tx_send(&t, 0, frame, sizeof(frame), NULL, false);
    rx_expect(&t, 0, frame, sizeof(frame));
    tb_fini(&t);
}

/* ======================= disabled rings, malformed input ======================= */

/* "Started but disabled" (vhost-user Ring states): TX is discarded, nothing lands on RX. */
VHD_TEST(disabled_rings)
{
    struct tb t;
    struct tb_opts o = {0};
    struct rxbuf rb[4];
    uint8_t frame[64];

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 4, 2048);
    make_frame(frame, sizeof(frame), 5);

    /* RX disabled: the transmitted frame has no receiver; TX drops it. */
    tq_detach(&t, 0);
    t.tq[0].q->enabled = false;
    tq_attach(&t, 0);
    tx_send(&t, 0, frame, sizeof(frame), NULL, false);
    VHD_CHECK(tq_quiet(&t, 0, 50));
    struct vhd_net_queue_stats tx = qstats_wait(&t, 1, 1);
    VHD_CHECK_EQ(tx.drops, 1);
    VHD_CHECK_EQ(qstats(&t, 0).packets, 0);

    /* TX disabled (RX enabled again): consumed and discarded, nothing delivered. */
    tq_detach(&t, 0);
    t.tq[0].q->enabled = true;
    tq_attach(&t, 0);
    tq_detach(&t, 1);
    t.tq[1].q->enabled = false;
    tq_attach(&t, 1);
    tx_send(&t, 0, frame, sizeof(frame), NULL, false);
    VHD_CHECK(tq_quiet(&t, 0, 50));
    tx = qstats_wait(&t, 1, 2);
    VHD_CHECK_EQ(tx.drops, 2);

    /* Both enabled: flows, into the first buffer (none was taken). */
    tq_detach(&t, 1);
    t.tq[1].q->enabled = true;
    tq_attach(&t, 1);
    tx_send(&t, 0, frame, sizeof(frame), NULL, false);
    uint32_t ulen;
    VHD_CHECK(tq_wait(&t, 0, &ulen) == &rb[0]);

    /* RX stopped altogether (detached): same as disabled. */
    tq_detach(&t, 0);
    tx_send(&t, 0, frame, sizeof(frame), NULL, false);
    tx = qstats_wait(&t, 1, 4);
    VHD_CHECK_EQ(tx.drops, 3);
    tq_attach(&t, 0);
    tb_fini(&t);
}

VHD_TEST(malformed_tx_chains)
{
    struct tb t;
    struct tb_opts o = {0};
    struct rxbuf rb[4];
    uint8_t frame[64];
    struct virtio_net_hdr_v1 h = {0};

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 4, 2048);
    /* shorter than header + Ethernet header */
    make_frame(frame, sizeof(frame), 6);
    tx_send(&t, 0, frame, 13, NULL, false);
    tx_send(&t, 0, frame, 0, NULL, true);
    /* a GSO frame without HOST_TSO negotiated */
    h.gso_type = VIRTIO_NET_HDR_GSO_TCPV4;
    tx_send(&t, 0, frame, sizeof(frame), &h, false);
    /* NEEDS_CSUM with the checksum field outside the frame */
    h.gso_type = 0;
    h.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    h.csum_start = vhd_le16(60);
    h.csum_offset = vhd_le16(4);
    tx_send(&t, 0, frame, sizeof(frame), &h, false);
    VHD_CHECK(tq_quiet(&t, 0, 50));
    uint64_t t0 = mono_ms();
    while (qstats(&t, 1).errors < 4 && mono_ms() - t0 < WAIT_MS)
        usleep(1000);
    struct vhd_net_queue_stats tx = qstats(&t, 1);
    VHD_CHECK_EQ(tx.errors, 4);
    VHD_CHECK_EQ(tx.packets, 0);
    /* A writable descriptor in a transmit chain is ignored; the frame goes through. */
    uint8_t *p, *w;
    struct vhd_drv_buf b[2] = {{galloc(&t, HDR + 64, 0, &p), HDR + 64}, {galloc(&t, 8, 0, &w), 8}};
    memcpy(p + HDR, frame, 64);
    tq_add(&t, 1, b, 1, 1, (void *)(uintptr_t)1);
    rx_expect(&t, 0, frame, 64);
    tb_fini(&t);
}

/* A receive buffer with a device-readable part breaks the receive ring (NEEDS_RESET). */
VHD_TEST(malformed_rx_buffer_breaks_ring)
{
    struct tb t;
    struct tb_opts o = {0};
    uint8_t frame[64], *p;

    tb_init(&t, &o);
    struct vhd_drv_buf b[2] = {{galloc(&t, 64, 0, &p), 64}, {galloc(&t, 2048, 0, &p), 2048}};
    tq_add(&t, 0, b, 1, 1, (void *)(uintptr_t)1);
    make_frame(frame, sizeof(frame), 7);
    tx_send(&t, 0, frame, sizeof(frame), NULL, false);
    VHD_CHECK(tq_quiet(&t, 0, 50));
    struct vhd_net_queue_stats rx = qstats(&t, 0);
    VHD_CHECK_EQ(rx.errors, 1);
    VHD_CHECK_EQ(rx.drops, 1);
    /* The worker reports the queue broken at its next turn on it (a kick). */
    VHD_CHECK_EQ(eventfd_write(t.tq[0].kick_fd, 1), 0);
    uint64_t t0 = mono_ms();
    while (!vhd_load_acquire(&t.tq[0].q->broken) && mono_ms() - t0 < WAIT_MS)
        usleep(1000);
    VHD_CHECK(vhd_load_acquire(&t.tq[0].q->broken));
    tb_fini(&t);
}

/* ======================= receive bursts ======================= */

/*
 * Add n transmit frames on pair p (frame k: lens[k] bytes from make_frame
 * with seed base + k, header zero, one descriptor) and publish them with
 * one store and one kick: the worker takes them as one transmit burst and
 * the loopback delivers them as one receive burst (vhd_net_deliver_burst).
 */
static void tx_burst(struct tb *t, unsigned pair, const uint32_t *lens, unsigned n, uint32_t base)
{
    struct tq *tq = &t->tq[2 * pair + 1];
    for (unsigned k = 0; k < n; k++) {
        uint8_t *p;
        struct vhd_drv_buf b = {galloc(t, HDR + lens[k], 0, &p), HDR + lens[k]};
        make_frame(p + HDR, lens[k], base + k);
        VHD_CHECK_EQ(vhd_drv_vq_add(&tq->dq, &b, 1, 0, t->o.indirect, (void *)(uintptr_t)(k + 1)),
                     0);
    }
    vhd_drv_vq_publish(&tq->dq);
    VHD_CHECK_EQ(eventfd_write(tq->kick_fd, 1), 0);
}

/* Take the n transmit chains of a tx_burst back (all used, length 0). */
static void tx_burst_reap(struct tb *t, unsigned pair, unsigned n)
{
    for (unsigned k = 0; k < n; k++) {
        uint32_t ulen = 99;
        VHD_CHECK(tq_wait(t, 2 * pair + 1, &ulen) == (void *)(uintptr_t)(k + 1));
        VHD_CHECK_EQ(ulen, 0);
    }
}

/*
 * Receive one packet on pair p from buffers of a rx_post array (in order,
 * starting at rb[*next]), reassembled into got; checks num_buffers against
 * the buffers it took and returns the frame length (without the header).
 */
static uint32_t rx_take(struct tb *t, unsigned pair, struct rxbuf *rb, unsigned *next, uint8_t *got,
                        uint32_t cap)
{
    uint32_t off = 0, ulen, nbufs = 1;
    for (uint32_t b = 0; b < nbufs; b++) {
        struct rxbuf *r = tq_wait(t, 2 * pair, &ulen);
        VHD_CHECK(r == &rb[*next]);
        (*next)++;
        VHD_CHECK(ulen <= r->len && off + ulen <= cap);
        memcpy(got + off, r->p, ulen);
        off += ulen;
        if (b == 0) {
            struct virtio_net_hdr_v1 h;
            VHD_CHECK(ulen >= HDR);
            memcpy(&h, got, HDR);
            nbufs = vhd_le16(h.num_buffers);
            VHD_CHECK(nbufs >= 1);
        }
        /* Every buffer but the last is filled (5.1.6.4). */
        VHD_CHECK(b + 1 == nbufs || ulen == r->len);
    }
    return off - HDR;
}

/* A burst larger than the receive buffers posted: those fill in order, the rest are dropped. */
static void burst_more_than_buffers(bool packed)
{
    struct tb t;
    struct tb_opts o = {.packed = packed};
    static struct rxbuf rb[12];
    uint32_t lens[32];
    uint8_t want[128], got[2048];

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 10, 1024);
    for (unsigned k = 0; k < 32; k++)
        lens[k] = 64 + k;
    tx_burst(&t, 0, lens, 32, 100);
    tx_burst_reap(&t, 0, 32);
    unsigned next = 0;
    for (unsigned k = 0; k < 10; k++) {
        VHD_CHECK_EQ(rx_take(&t, 0, rb, &next, got, sizeof(got)), lens[k]);
        make_frame(want, lens[k], 100 + k);
        VHD_CHECK(memcmp(got + HDR, want, lens[k]) == 0);
    }
    VHD_CHECK(tq_quiet(&t, 0, 50));
    struct vhd_net_queue_stats tx = qstats_wait(&t, 1, 32), rx = qstats(&t, 0);
    VHD_CHECK_EQ(tx.packets, 32);
    VHD_CHECK_EQ(tx.drops, 0);
    VHD_CHECK_EQ(rx.packets, 10);
    VHD_CHECK_EQ(rx.buffers, 10);
    VHD_CHECK_EQ(rx.drops, 22);
    VHD_CHECK_EQ(rx.largest, 64 + 9);
    /* The ring is as the driver left it: new buffers fill from the next one. */
    rx_post(&t, 0, rb + 10, 2, 1024);
    tx_burst(&t, 0, lens, 2, 200);
    tx_burst_reap(&t, 0, 2);
    for (unsigned k = 0; k < 2; k++) {
        VHD_CHECK_EQ(rx_take(&t, 0, rb, &next, got, sizeof(got)), lens[k]);
        make_frame(want, lens[k], 200 + k);
        VHD_CHECK(memcmp(got + HDR, want, lens[k]) == 0);
    }
    tb_fini(&t);
}

VHD_TEST(burst_more_frames_than_rx_buffers_split)
{
    burst_more_than_buffers(false);
}

VHD_TEST(burst_more_frames_than_rx_buffers_packed)
{
    burst_more_than_buffers(true);
}

/*
 * MRG_RXBUF in a burst: frames of 1 to 4 buffers one after another, a frame
 * above the MTU in the middle (dropped, its neighbours not), and a frame
 * that finds too few buffers (dropped, those buffers kept: the next frame
 * of the burst fits one of them).
 */
static void burst_mrg(bool packed)
{
    struct tb t;
    struct tb_opts o = {.packed = packed};
    static struct rxbuf rb[16];
    /* buffers of 256: 1, 4, 2, 1, (too big), 2, 1, 2, 3 with 2 left (dropped), then 1 fits */
    static const uint32_t lens[10] = {60, 1000, 300, 64, 2000, 500, 244, 245, 700, 80};
    static const uint32_t nbufs[10] = {1, 4, 2, 1, 0, 2, 1, 2, 0, 1};
    uint8_t want[2000], got[2048];

    tb_init(&t, &o);
    VHD_CHECK(t.features & BIT(VIRTIO_NET_F_MRG_RXBUF));
    rx_post(&t, 0, rb, 15, 256);
    tx_burst(&t, 0, lens, 10, 300);
    tx_burst_reap(&t, 0, 10);
    unsigned next = 0;
    uint64_t bufs = 0;
    for (unsigned k = 0; k < 10; k++) {
        if (nbufs[k] == 0)
            continue;
        unsigned first = next;
        VHD_CHECK_EQ(rx_take(&t, 0, rb, &next, got, sizeof(got)), lens[k]);
        VHD_CHECK_EQ(next - first, nbufs[k]);
        bufs += nbufs[k];
        make_frame(want, lens[k], 300 + k);
        VHD_CHECK(memcmp(got + HDR, want, lens[k]) == 0);
    }
    VHD_CHECK_EQ(next, 14);
    VHD_CHECK(tq_quiet(&t, 0, 50));
    struct vhd_net_queue_stats rx = qstats_wait(&t, 0, 8);
    VHD_CHECK_EQ(rx.packets, 8);
    VHD_CHECK_EQ(rx.buffers, bufs);
    VHD_CHECK_EQ(rx.drops, 2);
    VHD_CHECK_EQ(rx.largest, 1000);
    /* The buffer the 3-buffer frame left is still posted. */
    static const uint32_t small = 100;
    tx_burst(&t, 0, &small, 1, 400);
    tx_burst_reap(&t, 0, 1);
    VHD_CHECK_EQ(rx_take(&t, 0, rb, &next, got, sizeof(got)), small);
    VHD_CHECK_EQ(next, 15);
    make_frame(want, small, 400);
    VHD_CHECK(memcmp(got + HDR, want, small) == 0);
    tb_fini(&t);
}

VHD_TEST(burst_mrg_frames_span_buffers_split)
{
    burst_mrg(false);
}

VHD_TEST(burst_mrg_frames_span_buffers_packed)
{
    burst_mrg(true);
}

/*
 * A bad receive chain in the middle of a burst. An unusable buffer (here
 * device-readable) stops the ring after the frames before it: those are
 * delivered, published once, and the bad one and every later frame are
 * dropped. A chain the engine refuses (a buffer outside guest memory) ends
 * the run's pop before it (vhd_vq_pop_burstv): the frames before it are
 * delivered and published too, then the next run's pop breaks the ring
 * and the frames from the bad chain on are dropped.
 */
static void burst_bad_chain(bool packed, bool engine)
{
    struct tb t;
    struct tb_opts o = {.packed = packed};
    static struct rxbuf rb[6];
    uint32_t lens[6] = {64, 65, 66, 67, 68, 69};
    uint8_t want[128], got[2048], *p;

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 3, 1024);
    if (engine) {
        struct vhd_drv_buf b = {MEM_BASE + MEM_SIZE + 4096, 1024};
        tq_add(&t, 0, &b, 0, 1, (void *)(uintptr_t)1);
    } else {
        struct vhd_drv_buf b[2] = {{galloc(&t, 64, 0, &p), 64}, {galloc(&t, 1024, 0, &p), 1024}};
        tq_add(&t, 0, b, 1, 1, (void *)(uintptr_t)1);
    }
    rx_post(&t, 0, rb + 3, 2, 1024);
    tx_burst(&t, 0, lens, 6, 500);
    tx_burst_reap(&t, 0, 6);
    unsigned next = 0;
    for (unsigned k = 0; k < 3; k++) {
        VHD_CHECK_EQ(rx_take(&t, 0, rb, &next, got, sizeof(got)), lens[k]);
        make_frame(want, lens[k], 500 + k);
        VHD_CHECK(memcmp(got + HDR, want, lens[k]) == 0);
    }
    /* Nothing more is published (in particular nothing twice). */
    VHD_CHECK(tq_quiet(&t, 0, 50));
    uint64_t t0 = mono_ms();
    while (qstats(&t, 0).drops < 3u && mono_ms() - t0 < WAIT_MS)
        usleep(1000);
    struct vhd_net_queue_stats rx = qstats(&t, 0), tx = qstats(&t, 1);
    VHD_CHECK_EQ(rx.packets, 3);
    VHD_CHECK_EQ(rx.drops, 3);
    VHD_CHECK_EQ(rx.errors, engine ? 0 : 1);
    VHD_CHECK_EQ(tx.packets, 6);
    VHD_CHECK_EQ(tx.drops, 0);
    /* The worker reports the receive queue broken at its next turn on it (a kick). */
    VHD_CHECK_EQ(eventfd_write(t.tq[0].kick_fd, 1), 0);
    t0 = mono_ms();
    while (!vhd_load_acquire(&t.tq[0].q->broken) && mono_ms() - t0 < WAIT_MS)
        usleep(1000);
    VHD_CHECK(vhd_load_acquire(&t.tq[0].q->broken));
    /* The engine's reason, stored before the worker published broken (release). */
    VHD_CHECK_EQ(t.tq[0].q->vq.error, engine ? VHD_VQ_E_ADDR : 0);
    tb_fini(&t);
}

VHD_TEST(burst_bad_rx_chain_mid_burst_split)
{
    burst_bad_chain(false, false);
}

VHD_TEST(burst_bad_rx_chain_mid_burst_packed)
{
    burst_bad_chain(true, false);
}

VHD_TEST(burst_engine_breaks_mid_burst_split)
{
    burst_bad_chain(false, true);
}

VHD_TEST(burst_engine_breaks_mid_burst_packed)
{
    burst_bad_chain(true, true);
}

/*
 * Runs across the end of the rings: rounds of 24 frames go out as one
 * transmit run and come back as one receive run, 12 rounds on 256-entry
 * rings, so both runs of round 11 cross the end (split: the index wraps;
 * packed: the wrap counter flips mid-run). Every frame comes back whole, in
 * order, one buffer each.
 */
static void burst_ring_wrap(bool packed)
{
    struct tb t;
    struct tb_opts o = {.packed = packed};
    static struct rxbuf rb[24];
    uint32_t lens[24];
    uint8_t want[256], got[2048];

    tb_init(&t, &o);
    for (unsigned round = 0; round < 12; round++) {
        rx_post(&t, 0, rb, 24, 512);
        for (unsigned k = 0; k < 24; k++)
            lens[k] = 60 + (round * 7 + k) % 100;
        tx_burst(&t, 0, lens, 24, 1000 * round);
        tx_burst_reap(&t, 0, 24);
        unsigned next = 0;
        for (unsigned k = 0; k < 24; k++) {
            VHD_CHECK_EQ(rx_take(&t, 0, rb, &next, got, sizeof(got)), lens[k]);
            make_frame(want, lens[k], 1000 * round + k);
            VHD_CHECK(memcmp(got + HDR, want, lens[k]) == 0);
        }
    }
    struct vhd_net_queue_stats rx = qstats_wait(&t, 0, 288), tx = qstats(&t, 1);
    VHD_CHECK_EQ(tx.packets, 288);
    VHD_CHECK_EQ(rx.packets, 288);
    VHD_CHECK_EQ(rx.buffers, 288);
    VHD_CHECK_EQ(rx.drops, 0);
    tb_fini(&t);
}

VHD_TEST(burst_across_ring_wrap_split)
{
    burst_ring_wrap(false);
}

VHD_TEST(burst_across_ring_wrap_packed)
{
    burst_ring_wrap(true);
}

/*
 * A bad transmit chain in the middle of a run (a buffer outside guest
 * memory, which the engine refuses): the frames before it are sent (here
 * looped back) and their chains used and published; then the ring breaks
 * at the bad chain and nothing after it is sent.
 */
static void tx_bad_chain_mid_run(bool packed)
{
    struct tb t;
    struct tb_opts o = {.packed = packed};
    static struct rxbuf rb[6];
    uint8_t want[128], got[2048];

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 6, 1024);
    struct tq *tq = &t.tq[1];
    for (unsigned k = 0; k < 6; k++) {
        uint8_t *p;
        struct vhd_drv_buf b = {galloc(&t, HDR + 64 + k, 0, &p), HDR + 64 + k};
        make_frame(p + HDR, 64 + k, 600 + k);
        if (k == 3)
            b.gpa = MEM_BASE + MEM_SIZE + 4096;
        VHD_CHECK_EQ(vhd_drv_vq_add(&tq->dq, &b, 1, 0, false, (void *)(uintptr_t)(k + 1)), 0);
    }
    vhd_drv_vq_publish(&tq->dq);
    VHD_CHECK_EQ(eventfd_write(tq->kick_fd, 1), 0);
    tx_burst_reap(&t, 0, 3);
    unsigned next = 0;
    for (unsigned k = 0; k < 3; k++) {
        VHD_CHECK_EQ(rx_take(&t, 0, rb, &next, got, sizeof(got)), 64 + k);
        make_frame(want, 64 + k, 600 + k);
        VHD_CHECK(memcmp(got + HDR, want, 64 + k) == 0);
    }
    uint64_t t0 = mono_ms();
    while (!vhd_load_acquire(&t.tq[1].q->broken) && mono_ms() - t0 < WAIT_MS)
        usleep(1000);
    VHD_CHECK(vhd_load_acquire(&t.tq[1].q->broken));
    VHD_CHECK_EQ(t.tq[1].q->vq.error, VHD_VQ_E_ADDR);
    VHD_CHECK(tq_quiet(&t, 1, 50));
    VHD_CHECK(tq_quiet(&t, 0, 50));
    struct vhd_net_queue_stats tx = qstats(&t, 1), rx = qstats(&t, 0);
    VHD_CHECK_EQ(tx.packets, 3);
    VHD_CHECK_EQ(tx.drops, 0);
    VHD_CHECK_EQ(rx.packets, 3);
    VHD_CHECK_EQ(rx.drops, 0);
    tb_fini(&t);
}

VHD_TEST(burst_bad_tx_chain_mid_run_split)
{
    tx_bad_chain_mid_run(false);
}

VHD_TEST(burst_bad_tx_chain_mid_run_packed)
{
    tx_bad_chain_mid_run(true);
}

/*
 * MRG_RXBUF across runs: 40 frames in one delivery (two transmit runs, 32
 * and 8), one buffer each except frame 20 (3 buffers of 256) and frame 31,
 * the last of the first run (2): each merged frame is a run of its own
 * between runs of one-buffer frames; all arrive in order with num_buffers
 * right.
 */
static void burst_mrg_across_runs(bool packed)
{
    struct tb t;
    struct tb_opts o = {.packed = packed};
    static struct rxbuf rb[44];
    uint32_t lens[40];
    uint8_t want[700], got[2048];

    tb_init(&t, &o);
    VHD_CHECK(t.features & BIT(VIRTIO_NET_F_MRG_RXBUF));
    rx_post(&t, 0, rb, 43, 256);
    for (unsigned k = 0; k < 40; k++)
        lens[k] = k == 20 ? 600 : k == 31 ? 400 : 60 + k;
    tx_burst(&t, 0, lens, 40, 700);
    tx_burst_reap(&t, 0, 40);
    unsigned next = 0;
    for (unsigned k = 0; k < 40; k++) {
        unsigned first = next;
        VHD_CHECK_EQ(rx_take(&t, 0, rb, &next, got, sizeof(got)), lens[k]);
        VHD_CHECK_EQ(next - first, k == 20 ? 3u : k == 31 ? 2u : 1u);
        make_frame(want, lens[k], 700 + k);
        VHD_CHECK(memcmp(got + HDR, want, lens[k]) == 0);
    }
    VHD_CHECK_EQ(next, 43);
    struct vhd_net_queue_stats rx = qstats_wait(&t, 0, 40);
    VHD_CHECK_EQ(rx.packets, 40);
    VHD_CHECK_EQ(rx.buffers, 43);
    VHD_CHECK_EQ(rx.drops, 0);
    tb_fini(&t);
}

VHD_TEST(burst_mrg_across_runs_split)
{
    burst_mrg_across_runs(false);
}

VHD_TEST(burst_mrg_across_runs_packed)
{
    burst_mrg_across_runs(true);
}

/* Wait (bounded) until the call eventfd of queue i fires; its count (0: none within ms). */
static uint64_t call_count(struct tb *t, unsigned i, int ms)
{
    struct pollfd pfd = {.fd = t->tq[i].call_fd, .events = POLLIN};
    eventfd_t v = 0;
    if (poll(&pfd, 1, ms) > 0 && eventfd_read(t->tq[i].call_fd, &v) < 0)
        v = 0;
    return v;
}

/*
 * EVENT_IDX with bursts: a burst is published and decided on once, so the
 * driver is interrupted once per burst when its used_event lies in it and
 * not at all when it does not (used_event left behind, callbacks off).
 */
static void burst_event_idx(bool packed)
{
    struct tb t;
    struct tb_opts o = {.packed = packed};
    static struct rxbuf rb[24];
    uint32_t lens[8] = {64, 64, 64, 64, 64, 64, 64, 64};
    void *cookie;
    uint32_t ulen;

    tb_init(&t, &o);
    VHD_CHECK(t.features & BIT(VIRTIO_F_EVENT_IDX));
    struct vhd_drv_vq *dq = &t.tq[0].dq;
    rx_post(&t, 0, rb, 24, 1024);
    /* Burst 1: the first decision after start interrupts: once for 8 frames. */
    VHD_CHECK(!vhd_drv_vq_enable_cb(dq));
    tx_burst(&t, 0, lens, 8, 600);
    tx_burst_reap(&t, 0, 8);
    VHD_CHECK_EQ(call_count(&t, 0, WAIT_MS), 1);
    for (unsigned k = 0; k < 8; k++)
        VHD_CHECK_EQ(vhd_drv_vq_get_used(dq, &cookie, &ulen), 1);
    /* Burst 2, callbacks off: no interrupt. */
    vhd_drv_vq_disable_cb(dq);
    tx_burst(&t, 0, lens, 8, 700);
    tx_burst_reap(&t, 0, 8);
    uint64_t t0 = mono_ms();
    unsigned got = 0;
    while (got < 8 && mono_ms() - t0 < WAIT_MS) {
        if (vhd_drv_vq_get_used(dq, &cookie, &ulen) == 1)
            got++;
        else
            usleep(1000);
    }
    VHD_CHECK_EQ(got, 8);
    /*
     * Burst 3 with callbacks on (used_event = the next used index): one
     * interrupt, and the count shows burst 2 raised none (the eventfd adds up).
     */
    VHD_CHECK(!vhd_drv_vq_enable_cb(dq));
    tx_burst(&t, 0, lens, 8, 800);
    tx_burst_reap(&t, 0, 8);
    VHD_CHECK_EQ(call_count(&t, 0, WAIT_MS), 1);
    for (unsigned k = 0; k < 8; k++)
        VHD_CHECK_EQ(vhd_drv_vq_get_used(dq, &cookie, &ulen), 1);
    VHD_CHECK_EQ(qstats_wait(&t, 0, 24).packets, 24);
    tb_fini(&t);
}

VHD_TEST(burst_event_idx_split)
{
    burst_event_idx(false);
}

VHD_TEST(burst_event_idx_packed)
{
    burst_event_idx(true);
}

/* ======================= checksum offload ======================= */

/* An Ethernet/IPv4/UDP frame with a partial checksum: pseudo-header sum in the UDP field. */
static uint32_t udp_frame(uint8_t *f, uint32_t payload)
{
    uint32_t ulen = 8 + payload, len = 14 + 20 + ulen;
    make_frame(f, len, 9);
    f[12] = 0x08;
    f[13] = 0x00;
    uint8_t *ip = f + 14, *udp = ip + 20;
    memset(ip, 0, 20);
    ip[0] = 0x45;
    ip[2] = (uint8_t)((20 + ulen) >> 8);
    ip[3] = (uint8_t)(20 + ulen);
    ip[8] = 64;
    ip[9] = 17;
    uint8_t src[4] = {10, 0, 0, 1}, dst[4] = {10, 0, 0, 2};
    memcpy(ip + 12, src, 4);
    memcpy(ip + 16, dst, 4);
    udp[0] = 0x30;
    udp[1] = 0x39;
    udp[2] = 0x00;
    udp[3] = 0x35;
    udp[4] = (uint8_t)(ulen >> 8);
    udp[5] = (uint8_t)ulen;
    /* pseudo-header: src, dst, proto, length (not complemented: what drivers put there) */
    uint32_t s = 0x0a00 + 0x0001 + 0x0a00 + 0x0002 + 17 + ulen;
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    udp[6] = (uint8_t)(s >> 8);
    udp[7] = (uint8_t)s;
    return len;
}

/* Verify a UDP checksum over the pseudo-header and the datagram: the sum folds to 0xffff. */
static bool udp_csum_ok(const uint8_t *f, uint32_t len)
{
    const uint8_t *udp = f + 34;
    uint32_t ulen = len - 34, s = 0x0a00 + 0x0001 + 0x0a00 + 0x0002 + 17 + ulen;
    for (uint32_t i = 0; i < ulen; i += 2)
        s += (uint32_t)udp[i] << 8 | (i + 1 < ulen ? udp[i + 1] : 0);
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    return s == 0xffff;
}

static void csum_case(bool guest_csum)
{
    struct tb t;
    struct tb_opts o = {.features_off = guest_csum ? 0 : BIT(VIRTIO_NET_F_GUEST_CSUM)};
    struct rxbuf rb[4];
    uint8_t frame[200], sent[200], got_buf[4 * 61];
    struct virtio_net_hdr_v1 h = {.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM,
                                  .csum_start = vhd_le16(34),
                                  .csum_offset = vhd_le16(6)};
    uint32_t ulen;

    tb_init(&t, &o);
    VHD_CHECK(t.features & BIT(VIRTIO_NET_F_CSUM));
    /*
     * A 12 + 151-byte packet of odd length in 61-byte mergeable buffers: the
     * checksummed range crosses buffers at odd offsets (49, 110 in the frame).
     */
    rx_post(&t, 0, rb, 4, 61);
    uint32_t len = udp_frame(frame, 109), off = 0;
    memcpy(sent, frame, len);
    VHD_CHECK(!udp_csum_ok(frame, len));
    tx_send(&t, 0, frame, len, &h, true);
    for (unsigned k = 0; k < 3; k++) {
        struct rxbuf *rk = tq_wait(&t, 0, &ulen);
        VHD_CHECK(rk == &rb[k]);
        memcpy(got_buf + off, rk->p, ulen);
        off += ulen;
    }
    VHD_CHECK_EQ(off, HDR + len);
    struct rxbuf whole = {got_buf, off}, *r = &whole;
    struct virtio_net_hdr_v1 got;
    memcpy(&got, r->p, HDR);
    VHD_CHECK_EQ(vhd_le16(got.num_buffers), 3);
    if (guest_csum) {
        /* carried through: still partial, for the driver to complete (5.1.6.4) */
        VHD_CHECK_EQ(got.flags, VIRTIO_NET_HDR_F_NEEDS_CSUM);
        VHD_CHECK_EQ(vhd_le16(got.csum_start), 34);
        VHD_CHECK_EQ(vhd_le16(got.csum_offset), 6);
        VHD_CHECK(memcmp(r->p + HDR, sent, len) == 0);
    } else {
        /* completed by the device: flags 0, a valid checksum, nothing else changed */
        VHD_CHECK_EQ(got.flags, 0);
        VHD_CHECK(udp_csum_ok(r->p + HDR, len));
        VHD_CHECK(memcmp(r->p + HDR, sent, 40) == 0);
        VHD_CHECK(memcmp(r->p + HDR + 42, sent + 42, len - 42) == 0);
    }
    /* NEEDS_CSUM without CSUM negotiated is ignored (5.1.6.2.2): flags 0 on receive */
    tb_fini(&t);
}

VHD_TEST(csum_carried_with_guest_csum)
{
    csum_case(true);
}

VHD_TEST(csum_completed_without_guest_csum)
{
    csum_case(false);
}

VHD_TEST(needs_csum_ignored_without_csum)
{
    struct tb t;
    struct tb_opts o = {.features_off = BIT(VIRTIO_NET_F_CSUM)};
    struct rxbuf rb[1];
    uint8_t frame[200];
    struct virtio_net_hdr_v1 h = {.flags =
                                      VIRTIO_NET_HDR_F_NEEDS_CSUM | VIRTIO_NET_HDR_F_DATA_VALID,
                                  .csum_start = vhd_le16(34),
                                  .csum_offset = vhd_le16(6)};

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 1, 2048);
    uint32_t len = udp_frame(frame, 50);
    tx_send(&t, 0, frame, len, &h, false);
    struct virtio_net_hdr_v1 got = rx_expect(&t, 0, frame, len); /* unchanged */
    VHD_CHECK_EQ(got.flags, 0);
    tb_fini(&t);
}

/* ======================= control queue ======================= */

/* Send a control command (class, cmd, data) and return the ack; ack_len 0: no ack byte. */
static int ctrl_cmd(struct tb *t, uint8_t cls, uint8_t cmd, const void *data, uint32_t dlen,
                    uint32_t ack_len, uint32_t hdr_len)
{
    uint8_t *h, *d, *a;
    struct vhd_drv_buf b[3];
    uint32_t n = 0, nw = 0, ulen = 77;

    b[n].gpa = galloc(t, 2, 0, &h);
    h[0] = cls;
    h[1] = cmd;
    b[n++].len = hdr_len;
    if (dlen) {
        b[n].gpa = galloc(t, dlen, 0, &d);
        memcpy(d, data, dlen);
        b[n++].len = dlen;
    }
    if (ack_len) {
        b[n].gpa = galloc(t, ack_len, 0xcc, &a);
        b[n++].len = ack_len;
        nw = 1;
    }
    tq_add(t, t->ctrl, b, n - nw, nw, (void *)(uintptr_t)0xc7);
    VHD_CHECK(tq_wait(t, t->ctrl, &ulen) == (void *)(uintptr_t)0xc7);
    if (!ack_len) {
        VHD_CHECK_EQ(ulen, 0);
        return -1;
    }
    VHD_CHECK_EQ(ulen, 1);
    return a[0];
}

#define CTRL(t, cls, cmd, data, dlen) ctrl_cmd((t), (cls), (cmd), (data), (dlen), 1, 2)

VHD_TEST(ctrl_commands)
{
    struct tb t;
    struct tb_opts o = {.pairs = 4, .nworkers = 2, .ctrl = true};
    struct rxbuf rb[4][2];
    uint8_t frame[64];

    tb_init(&t, &o);
    VHD_CHECK_EQ(t.ctrl, 8);
    /* the driver's control queue started: one pair until VQ_PAIRS_SET (5.1.6.5.5) */
    VHD_CHECK_EQ(vhd_net_curr_pairs(t.dev), 1);
    for (unsigned p = 0; p < 4; p++)
        rx_post(&t, p, rb[p], 2, 2048);
    make_frame(frame, sizeof(frame), 11);
    tx_send(&t, 2, frame, sizeof(frame), NULL, false);
    VHD_CHECK(tq_quiet(&t, 4, 50)); /* pair 2 not in use: nothing delivered */

    uint16_t n = vhd_le16(3);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &n, 2),
                 VIRTIO_NET_OK);
    VHD_CHECK_EQ(vhd_net_curr_pairs(t.dev), 3);
    tx_send(&t, 2, frame, sizeof(frame), NULL, false);
    rx_expect(&t, 2, frame, sizeof(frame));
    tx_send(&t, 3, frame, sizeof(frame), NULL, false); /* pair 3 >= 3 pairs in use */
    VHD_CHECK(tq_quiet(&t, 6, 50));
    uint16_t bad[] = {0, 5, 0x8000, 0xffff};
    for (size_t i = 0; i < VHD_ARRAY_SIZE(bad); i++) {
        n = vhd_le16(bad[i]);
        VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &n, 2),
                     VIRTIO_NET_ERR);
    }
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &n, 1),
                 VIRTIO_NET_ERR); /* short */
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_RSS_CONFIG, &n, 2),
                 VIRTIO_NET_ERR); /* RSS not offered */
    VHD_CHECK_EQ(vhd_net_curr_pairs(t.dev), 3);
    n = vhd_le16(4);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &n, 2),
                 VIRTIO_NET_OK);

    /* MAC_ADDR_SET: reflected in config space; multicast and short refused */
    uint8_t mac[6] = {0x02, 0x11, 0x22, 0x33, 0x44, 0x55}, cur[6];
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_ADDR_SET, mac, 6),
                 VIRTIO_NET_OK);
    vhd_net_get_mac(t.dev, cur);
    VHD_CHECK(memcmp(cur, mac, 6) == 0);
    struct virtio_net_config cfg;
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 0, sizeof(cfg)), 0);
    VHD_CHECK(memcmp(cfg.mac, mac, 6) == 0);
    uint8_t mcast[6] = {0x01, 0, 0x5e, 0, 0, 1};
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_ADDR_SET, mcast, 6),
                 VIRTIO_NET_ERR);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_ADDR_SET, mac, 5),
                 VIRTIO_NET_ERR);

    /* MAC_TABLE_SET: two tables; the data must match the counts exactly */
    uint8_t tbl[4 + 12 + 4 + 6] = {2, 0, 0, 0};
    tbl[16] = 1;
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, tbl, sizeof(tbl)),
                 VIRTIO_NET_OK);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, tbl, 20),
                 VIRTIO_NET_ERR);
    tbl[0] = 0xff; /* 255 entries announced, 2 present */
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, tbl, sizeof(tbl)),
                 VIRTIO_NET_ERR);
    uint8_t huge[8] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}; /* 4G entries: no overflow */
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, huge, 8),
                 VIRTIO_NET_ERR);
    uint8_t empty[8] = {0};
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, empty, 8),
                 VIRTIO_NET_OK);

    /* RX mode: promisc and allmulti accepted; the CTRL_RX_EXTRA ones are not offered */
    uint8_t on = 1;
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, &on, 1), VIRTIO_NET_OK);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_ALLMULTI, &on, 1), VIRTIO_NET_OK);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_NOMULTI, &on, 1), VIRTIO_NET_ERR);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, NULL, 0), VIRTIO_NET_ERR);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, mac, 2), VIRTIO_NET_ERR);

    /* announce: set by the device, cleared by the driver's ack */
    VHD_CHECK_EQ(vhd_net_announce(t.dev), 0);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 0, sizeof(cfg)), 0);
    VHD_CHECK_EQ(vhd_le16(cfg.status), VIRTIO_NET_S_LINK_UP | VIRTIO_NET_S_ANNOUNCE);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_ANNOUNCE, VIRTIO_NET_CTRL_ANNOUNCE_ACK, NULL, 0),
                 VIRTIO_NET_OK);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 0, sizeof(cfg)), 0);
    VHD_CHECK_EQ(vhd_le16(cfg.status), VIRTIO_NET_S_LINK_UP);

    /* malformed and unknown: ERR, never a crash */
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_VLAN, VIRTIO_NET_CTRL_VLAN_ADD, &n, 2), VIRTIO_NET_ERR);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_GUEST_OFFLOADS, 0, tbl, 8), VIRTIO_NET_ERR);
    VHD_CHECK_EQ(CTRL(&t, 200, 7, NULL, 0), VIRTIO_NET_ERR);
    VHD_CHECK_EQ(ctrl_cmd(&t, VIRTIO_NET_CTRL_MQ, 0, NULL, 0, 1, 1), VIRTIO_NET_ERR); /* 1 byte */
    VHD_CHECK_EQ(ctrl_cmd(&t, VIRTIO_NET_CTRL_MQ, 0, &n, 2, 0, 2), -1); /* no ack byte */
    VHD_CHECK_EQ(ctrl_cmd(&t, VIRTIO_NET_CTRL_RX, 0, &on, 1, 4, 2), VIRTIO_NET_OK); /* long ack */
    /* a command whose data is a 4 KiB run of garbage */
    static uint8_t junk[4096];
    memset(junk, 0xa5, sizeof(junk));
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, junk, sizeof(junk)),
                 VIRTIO_NET_ERR);
    struct vhd_net_queue_stats cs = qstats(&t, t.ctrl);
    VHD_CHECK(cs.packets >= 25);
    VHD_CHECK(cs.errors >= 15);
    tb_fini(&t);
}

/*
 * A session that resumes a ring an earlier one used (a front-end or vhostd
 * reconnect) asks the guest to announce itself once its control queue runs:
 * VIRTIO_NET_S_ANNOUNCE plus dev->config_changed (the transport's cue for a
 * config change notification); the driver's ack clears it. SEND_RARP with
 * the control queue running asks for an announcement instead of a RARP.
 */
VHD_TEST(resumed_session_announces)
{
    struct tb t;
    struct tb_opts o = {.pairs = 1};
    struct virtio_net_config cfg;

    tb_init(&t, &o);
    VHD_CHECK(!t.dev->config_changed);
    /* the transmit ring restarts at avail index 7: it carried traffic before */
    tq_detach(&t, 1);
    struct vhd_queue *q = t.tq[1].q;
    t.dev->ops->queue_fini(t.dev, q);
    VHD_CHECK_EQ(vhd_vq_set_base(&q->vq, 7), 0);
    VHD_CHECK_EQ(t.dev->ops->queue_init(t.dev, q), 0);
    VHD_CHECK(!t.dev->config_changed); /* no control queue yet: nobody could ack */
    tq_setup(&t, t.ctrl);
    VHD_CHECK(t.dev->config_changed);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 0, sizeof(cfg)), 0);
    VHD_CHECK_EQ(vhd_le16(cfg.status), VIRTIO_NET_S_LINK_UP | VIRTIO_NET_S_ANNOUNCE);
    t.dev->config_changed = false; /* what the transport does after notifying */
    tq_attach(&t, t.ctrl);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_ANNOUNCE, VIRTIO_NET_CTRL_ANNOUNCE_ACK, NULL, 0),
                 VIRTIO_NET_OK);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 0, sizeof(cfg)), 0);
    VHD_CHECK_EQ(vhd_le16(cfg.status), VIRTIO_NET_S_LINK_UP);

    /* SEND_RARP: the guest is asked to announce itself */
    static const uint8_t mac[6] = {0x52, 0x54, 0x00, 0x01, 0x02, 0x03};
    VHD_CHECK_EQ(t.dev->ops->send_rarp(t.dev, mac), 0);
    VHD_CHECK(t.dev->config_changed);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 0, sizeof(cfg)), 0);
    VHD_CHECK_EQ(vhd_le16(cfg.status), VIRTIO_NET_S_LINK_UP | VIRTIO_NET_S_ANNOUNCE);
    tb_fini(&t);
}

/* Without MQ the control queue is queue 2 and only pair 0 exists (5.1.2). */
VHD_TEST(ctrl_queue_without_mq)
{
    struct tb t;
    struct tb_opts o = {.pairs = 2, .ctrl = true, .features_off = BIT(VIRTIO_NET_F_MQ)};

    tb_init(&t, &o);
    VHD_CHECK_EQ(t.ctrl, 2);
    uint16_t n = vhd_le16(2);
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &n, 2),
                 VIRTIO_NET_ERR); /* MQ not negotiated */
    uint8_t on = 0;
    VHD_CHECK_EQ(CTRL(&t, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, &on, 1), VIRTIO_NET_OK);
    /* queue 3 is not part of the device without MQ */
    struct vhd_queue *q3 = &t.dev->queues[3];
    q3->size = QSIZE;
    VHD_CHECK_EQ(t.dev->ops->queue_init(t.dev, q3), -EINVAL);
    tb_fini(&t);
}

/* ======================= config, features, transport hooks ======================= */

VHD_TEST(config_space_and_features)
{
    struct tb t;
    struct tb_opts o = {.pairs = 3};
    struct virtio_net_config cfg;
    uint8_t b[32];

    tb_init(&t, &o);
    uint64_t f = t.dev->ops->features(t.dev);
    uint64_t want = BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_F_RING_PACKED) |
                    BIT(VIRTIO_F_INDIRECT_DESC) | BIT(VIRTIO_F_EVENT_IDX) |
                    BIT(VIRTIO_NET_F_MRG_RXBUF) | BIT(VIRTIO_NET_F_MQ) | BIT(VIRTIO_NET_F_CTRL_VQ) |
                    BIT(VIRTIO_NET_F_CTRL_RX) | BIT(VIRTIO_NET_F_CTRL_MAC_ADDR) |
                    BIT(VIRTIO_NET_F_STATUS) | BIT(VIRTIO_NET_F_MAC) | BIT(VIRTIO_NET_F_MTU) |
                    BIT(VIRTIO_NET_F_GUEST_ANNOUNCE) | BIT(VIRTIO_NET_F_CSUM) |
                    BIT(VIRTIO_NET_F_GUEST_CSUM) | BIT(VIRTIO_F_IN_ORDER);
    VHD_CHECK_EQ(f, want);
    VHD_CHECK_EQ(t.dev->ops->config_size, 24);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 0, sizeof(cfg)), 0);
    VHD_CHECK(memcmp(cfg.mac, test_mac, 6) == 0);
    VHD_CHECK_EQ(vhd_le16(cfg.status), VIRTIO_NET_S_LINK_UP);
    VHD_CHECK_EQ(vhd_le16(cfg.max_virtqueue_pairs), 3);
    VHD_CHECK_EQ(vhd_le16(cfg.mtu), 1500);
    VHD_CHECK_EQ(vhd_le32(cfg.speed), VIRTIO_NET_SPEED_UNKNOWN);
    VHD_CHECK_EQ(cfg.duplex, VIRTIO_NET_DUPLEX_UNKNOWN);
    /* partial reads at any offset; beyond the end refused */
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, b, 8, 2), 0);
    VHD_CHECK_EQ(b[0] | b[1] << 8, 3);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, b, 24, 0), 0);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, b, 20, 5), -EINVAL);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, b, 25, 0), -EINVAL);
    VHD_CHECK(t.dev->ops->set_config == NULL); /* read-only */
    /* negotiation: VERSION_1 required, nothing beyond the offer */
    VHD_CHECK_EQ(t.dev->ops->set_features(t.dev, f & ~BIT(VIRTIO_F_VERSION_1)), -EINVAL);
    VHD_CHECK_EQ(t.dev->ops->set_features(t.dev, f | BIT(VIRTIO_NET_F_HOST_TSO4)), -EINVAL);
    /* DPDK's virtio-user drops CTRL_VQ, MAC and STATUS but keeps MQ: accepted */
    VHD_CHECK_EQ(
        t.dev->ops->set_features(t.dev, f & ~(BIT(VIRTIO_NET_F_CTRL_VQ) | BIT(VIRTIO_NET_F_MAC) |
                                              BIT(VIRTIO_NET_F_STATUS))),
        0);
    /* NET_SET_MTU: 68..65535, reflected in config space */
    VHD_CHECK_EQ(t.dev->ops->set_mtu(t.dev, 9000), 0);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 0, sizeof(cfg)), 0);
    VHD_CHECK_EQ(vhd_le16(cfg.mtu), 9000);
    VHD_CHECK_EQ(t.dev->ops->set_mtu(t.dev, 67), -EINVAL);
    VHD_CHECK_EQ(t.dev->ops->set_mtu(t.dev, 65536), -EINVAL);
    VHD_CHECK(t.dev->ops->run_disabled);
    VHD_CHECK(vhd_dev_is_net(t.dev));
    struct vhd_net_queue_stats st;
    VHD_CHECK_EQ(vhd_net_queue_stats(t.dev, 7, &st), -EINVAL);
    vhd_net_log_stats(t.dev, "test");
    /* reset: defaults back */
    t.dev->ops->reset(t.dev);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 0, sizeof(cfg)), 0);
    VHD_CHECK_EQ(vhd_le16(cfg.mtu), 1500);
    VHD_CHECK_EQ(vhd_net_announce(t.dev), -EOPNOTSUPP); /* features cleared */
    tb_fini(&t);
}

/* MTU negotiated: a frame above mtu + Ethernet header (+ VLAN tag) is not passed (5.1.6.4.1). */
VHD_TEST(mtu_limits_receive)
{
    struct tb t;
    struct tb_opts o = {0};
    struct rxbuf rb[2];
    static uint8_t frame[1600];

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 2, 4096);
    make_frame(frame, 1519, 12);
    tx_send(&t, 0, frame, 1519, NULL, false);
    VHD_CHECK(tq_quiet(&t, 0, 50));
    VHD_CHECK_EQ(qstats(&t, 0).drops, 1);
    tx_send(&t, 0, frame, 1518, NULL, false);
    rx_expect(&t, 0, frame, 1518);
    tb_fini(&t);
}

/* SEND_RARP: a RARP broadcast for the MAC goes out on pair 0 (loopback: back to the guest). */
VHD_TEST(send_rarp)
{
    struct tb t;
    struct tb_opts o = {0};
    struct rxbuf rb[2];
    uint8_t mac[6] = {0x52, 0x54, 0, 1, 2, 3};
    uint32_t ulen;

    tb_init(&t, &o);
    rx_post(&t, 0, rb, 2, 2048);
    VHD_CHECK_EQ(t.dev->ops->send_rarp(t.dev, mac), 0);
    struct rxbuf *r = tq_wait(&t, 0, &ulen);
    VHD_CHECK_EQ(ulen, HDR + 60);
    const uint8_t *f = r->p + HDR;
    static const uint8_t bcast[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    VHD_CHECK(memcmp(f, bcast, 6) == 0);
    VHD_CHECK(memcmp(f + 6, mac, 6) == 0);
    VHD_CHECK(f[12] == 0x80 && f[13] == 0x35);
    VHD_CHECK(f[20] == 0 && f[21] == 3); /* reverse request */
    VHD_CHECK(memcmp(f + 22, mac, 6) == 0 && memcmp(f + 32, mac, 6) == 0);
    VHD_CHECK(tq_quiet(&t, 0, 30)); /* once */
    tb_fini(&t);
}

/* ======================= worker map, creation ======================= */

VHD_TEST(worker_map)
{
    char err[256];
    struct vhd_dev *dev;
    struct vhd_net_opts no = {.pairs = 5};
    unsigned rr = 3;
    int list[] = {4, 1};

    vhd_log_set_level(VHD_LOG_ERROR);
    VHD_CHECK_EQ(vhd_net_new(&no, &dev, err, sizeof(err)), 0);
    /* default: queue q on worker q / 2 */
    for (uint32_t q = 0; q < dev->num_queues; q++)
        VHD_CHECK_EQ(dev->queue_worker[q], (int)(q / 2));
    VHD_CHECK_EQ(vhd_net_assign_workers(dev, NULL, 0, 4, &rr), 0);
    VHD_CHECK_EQ(rr, 8);
    for (uint32_t p = 0; p < 5; p++) {
        VHD_CHECK_EQ(dev->queue_worker[2 * p], (int)((3 + p) % 4));
        VHD_CHECK_EQ(dev->queue_worker[2 * p + 1], (int)((3 + p) % 4));
    }
    VHD_CHECK_EQ(dev->queue_worker[10], dev->queue_worker[0]);
    VHD_CHECK_EQ(vhd_net_assign_workers(dev, list, 2, 8, NULL), 0);
    for (uint32_t p = 0; p < 5; p++) {
        VHD_CHECK_EQ(dev->queue_worker[2 * p], list[p % 2]);
        VHD_CHECK_EQ(dev->queue_worker[2 * p + 1], list[p % 2]);
    }
    VHD_CHECK_EQ(vhd_net_assign_workers(dev, NULL, 0, 0, NULL), -EINVAL);
    vhd_net_free(dev);
}

static int try_new(struct vhd_net_opts *no, char *err, size_t errlen)
{
    struct vhd_dev *dev = (struct vhd_dev *)(uintptr_t)1;
    err[0] = '\0';
    int rc = vhd_net_new(no, &dev, err, errlen);
    if (rc == 0) {
        vhd_net_free(dev);
    } else {
        VHD_CHECK(dev == NULL);
        VHD_CHECK(err[0] != '\0');
    }
    return rc;
}

VHD_TEST(new_errors)
{
    char err[256];
    struct vhd_net_opts no = {0};
    uint8_t mac[6] = {0};

    vhd_log_set_level(VHD_LOG_ERROR);
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), 0); /* all defaults */
    no.pairs = VHD_NET_MAX_PAIRS + 1;
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), -EINVAL);
    no.pairs = VHD_NET_MAX_PAIRS;
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), 0);
    no.pairs = 1;
    no.mtu = 67;
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), -EINVAL);
    no.mtu = 65535;
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), 0);
    no.mac = mac; /* all zeroes */
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), -EINVAL);
    mac[0] = 1; /* multicast */
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), -EINVAL);
    no.mac = NULL;
    no.backend = "tap";
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), -EINVAL);
    VHD_CHECK(strstr(err, "tap") != NULL);
    no.backend = "loopback";
    no.no_split = true;
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), -EINVAL);
    no.allow_packed = true;
    VHD_CHECK_EQ(try_new(&no, err, sizeof(err)), 0);
    struct vhd_dev *dev;
    VHD_CHECK_EQ(vhd_net_new(NULL, &dev, err, sizeof(err)), -EINVAL);
    vhd_net_free(NULL);
    /* the default MAC: 52:54:00 + a hash, stable and unicast */
    uint8_t a[6], b[6];
    vhd_net_default_mac("/run/a.sock", a);
    vhd_net_default_mac("/run/a.sock", b);
    VHD_CHECK(memcmp(a, b, 6) == 0);
    VHD_CHECK(a[0] == 0x52 && a[1] == 0x54 && a[2] == 0);
    vhd_net_default_mac("/run/b.sock", b);
    VHD_CHECK(memcmp(a, b, 6) != 0);
    VHD_CHECK(vhd_net_backend_find("loopback") == &vhd_net_backend_loopback);
    VHD_CHECK(vhd_net_backend_find("switch") == &vhd_net_backend_switch);
    VHD_CHECK(vhd_net_backend_find("tap") == &vhd_net_backend_tap);
    VHD_CHECK(vhd_net_backend_find("pcap") == NULL);
}

/* ======================= plain frames and the general path in one run ======================= */

/*
 * Delivery takes plain frames (no GSO, no partial checksum, within the MTU,
 * into a writable-only buffer whose first segment takes header and frame)
 * a stretch at a time and every other frame by the general path
 * (vhd_net_deliver_burst): frames of both kinds mixed in one burst are
 * delivered as each would be alone. Of 32 frames, all with the sender's
 * hdr_len, gso_size and csum fields set (passed on as they are): frame 9
 * has a partial checksum (carried through: GUEST_CSUM), frame 13 finds a
 * buffer of two descriptors (header, then frame), frame 17 was sent in two
 * descriptors (header, then frame: the copy's general walk), frame 25 finds
 * a buffer of exactly header plus frame, and frame 26 one a byte short
 * (MRG_RXBUF: it takes the next buffer too, a run of its own).
 */
static void plain_and_general(bool packed)
{
    struct tb t;
    struct tb_opts o = {.packed = packed};
    static struct rxbuf rb[33];
    struct tq *tq = &t.tq[1];
    uint32_t lens[32];
    uint8_t want[128], got[2048];

    tb_init(&t, &o);
    VHD_CHECK(t.features & BIT(VIRTIO_NET_F_MRG_RXBUF));
    VHD_CHECK(t.features & BIT(VIRTIO_NET_F_GUEST_CSUM));
    for (unsigned k = 0; k < 32; k++)
        lens[k] = 60 + k;
    /* Receive buffers: rb[b] takes frame b (b <= 26), rb[27] the rest of frame 26, rb[b] frame b
     * - 1. */
    for (unsigned b = 0; b < 33; b++) {
        uint32_t len = b == 25 ? HDR + lens[25] : b == 26 ? HDR + lens[26] - 1 : 1024;
        struct vhd_drv_buf d[2] = {{galloc(&t, len, 0xee, &rb[b].p), len}};
        rb[b].len = len;
        if (b == 13) {
            d[1].gpa = d[0].gpa + HDR;
            d[1].len = len - HDR;
            d[0].len = HDR;
        }
        VHD_CHECK_EQ(vhd_drv_vq_add(&t.tq[0].dq, d, 0, b == 13 ? 2 : 1, false, &rb[b]), 0);
    }
    vhd_drv_vq_publish(&t.tq[0].dq);
    /* The burst: one store, one kick. */
    for (unsigned k = 0; k < 32; k++) {
        uint8_t *p;
        struct virtio_net_hdr_v1 h = {.hdr_len = vhd_le16(20 + k),
                                      .gso_size = vhd_le16(1400 + k),
                                      .csum_start = vhd_le16(14 + k),
                                      .csum_offset = vhd_le16(k)};
        if (k == 9) {
            h.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
            h.csum_start = vhd_le16(34);
            h.csum_offset = vhd_le16(6);
        }
        struct vhd_drv_buf b[2] = {{galloc(&t, HDR + lens[k], 0, &p), HDR + lens[k]}};
        memcpy(p, &h, HDR);
        make_frame(p + HDR, lens[k], 500 + k);
        if (k == 17) {
            b[1].gpa = b[0].gpa + HDR;
            b[1].len = lens[k];
            b[0].len = HDR;
        }
        VHD_CHECK_EQ(
            vhd_drv_vq_add(&tq->dq, b, k == 17 ? 2 : 1, 0, false, (void *)(uintptr_t)(k + 1)), 0);
    }
    vhd_drv_vq_publish(&tq->dq);
    VHD_CHECK_EQ(eventfd_write(tq->kick_fd, 1), 0);
    tx_burst_reap(&t, 0, 32);

    unsigned next = 0;
    uint64_t bytes = 0;
    for (unsigned k = 0; k < 32; k++) {
        unsigned first = next;
        VHD_CHECK_EQ(rx_take(&t, 0, rb, &next, got, sizeof(got)), lens[k]);
        VHD_CHECK_EQ(next - first, k == 26 ? 2u : 1u);
        make_frame(want, lens[k], 500 + k);
        VHD_CHECK(memcmp(got + HDR, want, lens[k]) == 0);
        struct virtio_net_hdr_v1 h;
        memcpy(&h, got, HDR);
        VHD_CHECK_EQ(h.flags, k == 9 ? VIRTIO_NET_HDR_F_NEEDS_CSUM : 0);
        VHD_CHECK_EQ(h.gso_type, VIRTIO_NET_HDR_GSO_NONE);
        VHD_CHECK_EQ(vhd_le16(h.hdr_len), 20 + k);
        VHD_CHECK_EQ(vhd_le16(h.gso_size), 1400 + k);
        VHD_CHECK_EQ(vhd_le16(h.csum_start), k == 9 ? 34 : 14 + k);
        VHD_CHECK_EQ(vhd_le16(h.csum_offset), k == 9 ? 6 : k);
        VHD_CHECK_EQ(vhd_le16(h.num_buffers), k == 26 ? 2 : 1);
        /* Past the frame the buffer is as posted. */
        struct rxbuf *last = &rb[next - 1];
        if (k != 26 && k != 25)
            VHD_CHECK(last->p[HDR + lens[k]] == 0xee);
        bytes += lens[k];
    }
    VHD_CHECK(tq_quiet(&t, 0, 50));
    struct vhd_net_queue_stats rx = qstats_wait(&t, 0, 32);
    VHD_CHECK_EQ(rx.packets, 32);
    VHD_CHECK_EQ(rx.buffers, 33);
    VHD_CHECK_EQ(rx.drops, 0);
    VHD_CHECK_EQ(rx.bytes, bytes);
    VHD_CHECK_EQ(rx.largest, lens[31]);
    tb_fini(&t);
}

VHD_TEST(burst_plain_and_general_frames_split)
{
    plain_and_general(false);
}

VHD_TEST(burst_plain_and_general_frames_packed)
{
    plain_and_general(true);
}
