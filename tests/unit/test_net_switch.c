/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Switch backend tests (src/backend/net_switch.c): two and three net
 * devices on one switch, each with its own guest memory and driver-side
 * rings, run by one real runtime with the ports on different workers.
 * Flooding of unknown unicast and broadcast, learning (unicast to the
 * learned port only), ageing through the clock test hook, counters, and
 * the doorbell that wakes an idle receiving worker.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "backend/net_backend.h"
#include "backend/net_switch.h"
#include "core/vq.h"
#include "dev/net.h"
#include "spec/virtio_net.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "harness.h"
#include "runtime/log.h"
#include "runtime/rt.h"

#define QSIZE     64
#define MAX_PORTS 3
#define WAIT_MS   5000
#define MEM_SIZE  (16ull << 20)
#define MEM_BASE  0x100000ull
#define HDR       12u
#define NRX       16

/* One port: a device with one queue pair (rx 0, tx 1), its memory and driver rings. */
struct port {
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    struct vhd_dev *dev;
    struct vhd_drv_vq dq[2];
    int kick[2], call[2];
    uint8_t mac[6];
    uint8_t *rx[NRX];
};

struct bed {
    struct vhd_rt *rt;
    struct port p[MAX_PORTS];
    unsigned n;
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t galloc(struct port *p, uint64_t len, uint8_t **hva)
{
    void *h;
    uint64_t gpa = vhd_guestmem_alloc(&p->gm, len, 16, &h);
    VHD_CHECK(gpa != UINT64_MAX);
    memset(h, 0, len);
    *hva = h;
    return gpa;
}

static void q_add(struct port *p, unsigned i, uint64_t gpa, uint32_t len, bool write, void *cookie)
{
    struct vhd_drv_buf b = {gpa, len};
    VHD_CHECK_EQ(vhd_drv_vq_add(&p->dq[i], &b, write ? 0 : 1, write ? 1 : 0, false, cookie), 0);
    vhd_drv_vq_publish(&p->dq[i]);
    if (vhd_drv_vq_kick_needed(&p->dq[i]))
        VHD_CHECK_EQ(eventfd_write(p->kick[i], 1), 0);
}

static void port_setup(struct bed *b, unsigned k, const char *sw)
{
    struct port *p = &b->p[k];
    char err[256], name[16];

    snprintf(name, sizeof(name), "port%u", k);
    p->mac[0] = 0x52;
    p->mac[1] = 0x54;
    p->mac[5] = (uint8_t)(0x10 + k);
    struct vhd_net_opts no = {
        .name = name, .backend = "switch", .switch_name = sw, .pairs = 1, .mac = p->mac};
    int rc = vhd_net_new(&no, &p->dev, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  vhd_net_new: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    uint64_t f = p->dev->ops->features(p->dev) & ~(1ull << VIRTIO_F_RING_PACKED) &
                 ~(1ull << VIRTIO_NET_F_CTRL_VQ);
    VHD_CHECK_EQ(p->dev->ops->set_features(p->dev, f), 0);
    int wk = (int)(k % 2);
    VHD_CHECK_EQ(vhd_net_assign_workers(p->dev, &wk, 1, 2, NULL), 0);

    struct vhd_mem_region_desc d[1];
    VHD_CHECK_EQ(vhd_guestmem_init(&p->gm, 1, MEM_SIZE, MEM_BASE, 0), 0);
    vhd_guestmem_descs(&p->gm, d);
    VHD_CHECK_EQ(vhd_mem_new(d, 1, &p->mem), 0);
    p->dev->mem = p->mem;
    p->dev->rt = b->rt;
    for (unsigned i = 0; i < 2; i++) {
        struct vhd_queue *q = &p->dev->queues[i];
        size_t alen = vhd_drv_vq_area_size(QSIZE, false, 0);
        void *area;
        uint64_t agpa = vhd_guestmem_alloc(&p->gm, alen, 4096, &area);
        struct vhd_drv_vq_params dp = {
            .size = QSIZE, .event_idx = true, .area = area, .area_gpa = agpa, .area_len = alen};
        VHD_CHECK_EQ(vhd_drv_vq_init(&p->dq[i], &dp), 0);
        struct vhd_vq_params vp = {.size = QSIZE,
                                   .event_idx = true,
                                   .addr_is_gpa = true,
                                   .desc = p->dq[i].desc_gpa,
                                   .avail = p->dq[i].avail_gpa,
                                   .used = p->dq[i].used_gpa};
        q->size = QSIZE;
        VHD_CHECK_EQ(vhd_vq_init(&q->vq, &vp, p->mem), 0);
        VHD_CHECK_EQ(vhd_vq_start(&q->vq), 0);
        p->kick[i] = eventfd(0, EFD_CLOEXEC);
        p->call[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        q->kick_fd = p->kick[i];
        q->call_fd = p->call[i];
        q->started = q->enabled = true;
        VHD_CHECK_EQ(p->dev->ops->queue_init(p->dev, q), 0);
        VHD_CHECK_EQ(vhd_rt_attach(b->rt, q, (unsigned)wk), 0);
    }
    /* Receive buffers, posted once: each test consumes fewer than NRX frames per port. */
    for (unsigned j = 0; j < NRX; j++) {
        uint64_t gpa = galloc(p, 2048, &p->rx[j]);
        q_add(p, 0, gpa, 2048, true, p->rx[j]);
    }
}

static void bed_init(struct bed *b, unsigned n, const char *sw)
{
    memset(b, 0, sizeof(*b));
    vhd_log_set_level(VHD_LOG_ERROR);
    struct vhd_rt_opts ro;
    vhd_rt_opts_default(&ro);
    ro.nworkers = 2;
    /*
     * Adaptive (the default): an idle receiving worker sleeps, so only the
     * doorbell wakes it. (Event mode, poll=never, would not test that: a
     * receive ring with posted buffers counts as work there and keeps its
     * worker spinning.)
     */
    ro.poll_mode = VHD_POLL_ADAPTIVE;
    VHD_CHECK_EQ(vhd_rt_new(&ro, &b->rt), 0);
    b->n = n;
    for (unsigned k = 0; k < n; k++)
        port_setup(b, k, sw);
}

static void bed_fini(struct bed *b)
{
    for (unsigned k = 0; k < b->n; k++) {
        struct port *p = &b->p[k];
        for (unsigned i = 0; i < 2; i++) {
            VHD_CHECK_EQ(vhd_rt_detach(b->rt, &p->dev->queues[i], WAIT_MS), 0);
            p->dev->ops->queue_fini(p->dev, &p->dev->queues[i]);
        }
    }
    for (unsigned k = 0; k < b->n; k++) {
        struct port *p = &b->p[k];
        p->dev->mem = NULL;
        vhd_net_free(p->dev);
        for (unsigned i = 0; i < 2; i++) {
            close(p->kick[i]);
            close(p->call[i]);
            vhd_drv_vq_fini(&p->dq[i]);
        }
        vhd_mem_free(p->mem);
        vhd_guestmem_fini(&p->gm);
    }
    vhd_rt_free(b->rt);
}

/* Wait up to ms for a used element on queue i of p. 1 (cookie, len) or 0. */
static int q_wait(struct port *p, unsigned i, void **cookie, uint32_t *len, int ms)
{
    uint64_t t0 = mono_ms();
    for (;;) {
        int rc = vhd_drv_vq_get_used(&p->dq[i], cookie, len);
        VHD_CHECK(rc >= 0);
        if (rc == 1)
            return 1;
        if (vhd_drv_vq_enable_cb(&p->dq[i]))
            continue;
        if (mono_ms() - t0 > (uint64_t)ms)
            return 0;
        struct pollfd pfd = {.fd = p->call[i], .events = POLLIN};
        VHD_CHECK(poll(&pfd, 1, 10) >= 0);
        eventfd_t v;
        (void)eventfd_read(p->call[i], &v);
    }
}

/* Port k sends a frame to dst (tag in byte 14) and waits until the device took it. */
static void send(struct bed *b, unsigned k, const uint8_t dst[6], uint8_t tag)
{
    struct port *p = &b->p[k];
    uint8_t *h;
    uint64_t gpa = galloc(p, HDR + 60, &h);
    memcpy(h + HDR, dst, 6);
    memcpy(h + HDR + 6, p->mac, 6);
    h[HDR + 12] = 0x88;
    h[HDR + 13] = 0xb5;
    h[HDR + 14] = tag;
    q_add(p, 1, gpa, HDR + 60, false, h);
    void *c;
    uint32_t len;
    VHD_CHECK_EQ(q_wait(p, 1, &c, &len, WAIT_MS), 1);
    VHD_CHECK(c == h);
}

/* Port k receives the frame tagged tag from src within the wait, or (expect false) nothing. */
static void expect(struct bed *b, unsigned k, unsigned src, uint8_t tag, bool want)
{
    struct port *p = &b->p[k];
    void *c = NULL;
    uint32_t len = 0;
    int got = q_wait(p, 0, &c, &len, want ? WAIT_MS : 100);
    if (!want) {
        if (got)
            fprintf(stderr, "  port %u: unexpected frame (tag %u)\n", k, ((uint8_t *)c)[HDR + 14]);
        VHD_CHECK_EQ(got, 0);
        return;
    }
    if (!got)
        fprintf(stderr, "  port %u: no frame with tag %u\n", k, tag);
    VHD_CHECK_EQ(got, 1);
    const uint8_t *f = c;
    VHD_CHECK_EQ(len, HDR + 60);
    VHD_CHECK(memcmp(f + HDR + 6, b->p[src].mac, 6) == 0);
    VHD_CHECK_EQ(f[HDR + 14], tag);
}

static struct vhd_net_switch_stats stats(struct bed *b, unsigned k)
{
    struct vhd_net_switch_stats s;
    VHD_CHECK_EQ(vhd_net_switch_port_stats(b->p[k].dev, &s), 0);
    return s;
}

static const uint8_t bcast[6] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

VHD_TEST(two_ports_exchange)
{
    struct bed b;
    bed_init(&b, 2, "sw-two");
    /* 1 is unknown: flooded to 0 (the only other port); 0 learns 1's MAC */
    send(&b, 1, b.p[0].mac, 1);
    expect(&b, 0, 1, 1, true);
    send(&b, 0, b.p[1].mac, 2);
    expect(&b, 1, 0, 2, true);
    for (uint8_t i = 0; i < 5; i++) {
        send(&b, 0, b.p[1].mac, (uint8_t)(10 + i));
        expect(&b, 1, 0, (uint8_t)(10 + i), true);
        send(&b, 1, b.p[0].mac, (uint8_t)(20 + i));
        expect(&b, 0, 1, (uint8_t)(20 + i), true);
    }
    expect(&b, 0, 1, 0, false);
    expect(&b, 1, 0, 0, false);
    struct vhd_net_switch_stats s0 = stats(&b, 0), s1 = stats(&b, 1);
    VHD_CHECK_EQ(s0.in_frames, 6);
    VHD_CHECK_EQ(s1.in_frames, 6);
    VHD_CHECK_EQ(s0.out_frames, 6);
    VHD_CHECK_EQ(s1.out_frames, 6);
    VHD_CHECK_EQ(s0.in_bytes, 6 * 60);
    VHD_CHECK_EQ(s1.out_bytes, 6 * 60);
    /* only the first frame from 1 went to an unknown address (0 was learned from it by then) */
    VHD_CHECK_EQ(s1.flooded, 1);
    VHD_CHECK_EQ(s0.flooded, 0);
    VHD_CHECK_EQ(s0.in_drops + s1.in_drops + s0.out_drops + s1.out_drops, 0);
    bed_fini(&b);
}

VHD_TEST(three_ports_learning_and_flooding)
{
    struct bed b;
    bed_init(&b, 3, "sw-three");
    /* broadcast from 0 reaches 1 and 2, not 0 */
    send(&b, 0, bcast, 1);
    expect(&b, 1, 0, 1, true);
    expect(&b, 2, 0, 1, true);
    expect(&b, 0, 0, 0, false);
    /* 2 answers 0 (learned): only 0 gets it */
    send(&b, 2, b.p[0].mac, 2);
    expect(&b, 0, 2, 2, true);
    expect(&b, 1, 0, 0, false);
    /* 0 to 1, unknown yet: flooded to 1 and 2 */
    send(&b, 0, b.p[1].mac, 3);
    expect(&b, 1, 0, 3, true);
    expect(&b, 2, 0, 3, true);
    /* 1 speaks, so it is learned; then 0 to 1 goes to 1 only */
    send(&b, 1, b.p[0].mac, 4);
    expect(&b, 0, 1, 4, true);
    send(&b, 0, b.p[1].mac, 5);
    expect(&b, 1, 0, 5, true);
    expect(&b, 2, 0, 0, false);
    struct vhd_net_switch_stats s0 = stats(&b, 0);
    VHD_CHECK_EQ(s0.in_frames, 3);
    VHD_CHECK_EQ(s0.flooded, 2);
    VHD_CHECK_EQ(s0.out_frames, 2);
    VHD_CHECK_EQ(stats(&b, 2).out_frames, 2);
    bed_fini(&b);
}

VHD_TEST(ageing)
{
    struct bed b;
    bed_init(&b, 3, "sw-age");
    send(&b, 1, bcast, 1); /* learn 1 */
    expect(&b, 0, 1, 1, true);
    expect(&b, 2, 1, 1, true);
    send(&b, 0, b.p[1].mac, 2);
    expect(&b, 1, 0, 2, true);
    expect(&b, 2, 0, 0, false);
    /* just inside the ageing time: still learned */
    vhd_net_switch_test_advance(VHD_NET_SWITCH_AGEING_S - 5);
    send(&b, 0, b.p[1].mac, 3);
    expect(&b, 1, 0, 3, true);
    expect(&b, 2, 0, 0, false);
    /* past it without a frame from 1: forgotten, flooded again */
    vhd_net_switch_test_advance(10);
    send(&b, 0, b.p[1].mac, 4);
    expect(&b, 1, 0, 4, true);
    expect(&b, 2, 0, 4, true);
    VHD_CHECK_EQ(stats(&b, 0).flooded, 1);
    bed_fini(&b);
}

VHD_TEST(open_errors)
{
    struct vhd_dev *dev = NULL;
    char err[256];
    struct vhd_net_opts no = {.name = "x", .backend = "switch"};
    VHD_CHECK(vhd_net_new(&no, &dev, err, sizeof(err)) < 0);
    VHD_CHECK(strstr(err, "switch=NAME") != NULL);
    no.backend = "tap";
    VHD_CHECK(vhd_net_new(&no, &dev, err, sizeof(err)) < 0);
    VHD_CHECK(strstr(err, "tap=IFNAME") != NULL);
    /* a loopback device is not a switch port */
    no.backend = "loopback";
    VHD_CHECK_EQ(vhd_net_new(&no, &dev, err, sizeof(err)), 0);
    struct vhd_net_switch_stats s;
    VHD_CHECK(vhd_net_switch_port_stats(dev, &s) < 0);
    vhd_net_free(dev);
}
