/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The "gen" packet backend (src/backend/net_gen.c) against the real daemon:
 * build/vhostd started with --net ...,backend=gen, driven by the userspace
 * virtio-net driver. Checks that receive queues fill with well-formed
 * generated frames (size, addresses, ethertype, increasing sequence numbers
 * per pair, on every pair), that transmitted frames are used and discarded
 * (never looped back) and counted as transmit drops, and that the daemon's
 * counters match what the driver saw: split and packed rings, with and
 * without MRG_RXBUF, polling and event-driven workers, and a receiver too
 * slow to ever empty its ring while it transmits.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h"
#include "util/compiler.h"
#include "spec/virtio_net.h"
#include "harness.h"
#include "vhostd/net_driver.h"

#define WAIT_MS     5000 /* each expected frame or completion has this long */
#define MAX_DAEMONS 1

#include "daemon_fixture.h"
#include "netdrv_fixture.h"

#define GEN_LEN       64u     /* the backend's frame length */
#define GEN_ETHERTYPE 0x88b5u /* the backend's ethertype */
#define TX_ETHERTYPE  0x0800u /* what we send: anything but GEN_ETHERTYPE */

static void daemon_prepare(struct daemon *dm)
{
    daemon_prepare_dir(dm, "vhd-test-gen-XXXXXX", "net.sock");
    track(dm);
}

/* vhostd --poll POLL [--workers 1] --net socket=...,backend=gen,queues=PAIRS */
static void vhostd_start_workers(struct daemon *dm, unsigned pairs, const char *poll, bool one)
{
    const char *bin = vhostd_path();
    char spec[PATH_MAX], ppoll[16];
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    snprintf(spec, sizeof(spec), "socket=%s,backend=gen,queues=%u", dm->sock, pairs);
    snprintf(ppoll, sizeof(ppoll), "%s", poll);
    char *argv[] = {(char *)bin, "--poll", ppoll, "--net", spec, NULL, NULL, NULL};
    if (one) {
        argv[3] = "--workers";
        argv[4] = "1";
        argv[5] = "--net";
        argv[6] = spec;
    }
    daemon_spawn(dm, argv);
}

static void vhostd_start(struct daemon *dm, unsigned pairs, const char *poll)
{
    vhostd_start_workers(dm, pairs, poll, false);
}

/* A value "key=N" from the daemon's last log line containing `line`; -1 when absent. */
static long long log_value(const struct daemon *dm, const char *line, const char *key)
{
    FILE *f = fopen(dm->log, "r");
    char buf[1024];
    long long v = -1;
    size_t klen = strlen(key);
    if (!f)
        return -1;
    while (fgets(buf, sizeof(buf), f)) {
        if (!strstr(buf, line))
            continue;
        for (char *p = strstr(buf, key); p; p = strstr(p + 1, key)) {
            if ((p == buf || p[-1] == ' ') && p[klen] == '=') {
                v = strtoll(p + klen + 1, NULL, 10);
                break;
            }
        }
    }
    fclose(f);
    return v;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/*
 * Receive `count` frames on pair pi and check each: GEN_LEN bytes, addressed
 * to the device's MAC, from 02:00:00:00:<pair>, GEN_ETHERTYPE, a sequence
 * number above the previous one (gaps are frames the device dropped for want
 * of a buffer), zero padding. Returns the last sequence number seen.
 */
static uint32_t receive_generated(struct vhd_netdrv *d, uint32_t pi, unsigned count)
{
    const struct vhd_netdrv_info *in = vhd_netdrv_get_info(d);
    struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, pi);
    static const uint8_t zero[GEN_LEN];
    uint8_t got[2048];
    bool have_mac = (in->mac[0] | in->mac[1] | in->mac[2] | in->mac[3] | in->mac[4] | in->mac[5]);
    uint32_t last = 0;

    VHD_CHECK(p != NULL);
    for (unsigned k = 0; k < count; k++) {
        uint64_t t0 = ms_now();
        int n;
        while ((n = vhd_netdrv_rx_copy(p, got, sizeof(got))) == 0) {
            if (ms_now() - t0 > WAIT_MS) {
                fprintf(stderr, "  pair %u: frame %u did not arrive\n", pi, k);
                VHD_CHECK(!"no generated frame");
            }
        }
        VHD_CHECK_EQ(n, (int)GEN_LEN);
        if (have_mac)
            VHD_CHECK(memcmp(got, in->mac, 6) == 0);
        const uint8_t src[6] = {0x02, 0, 0, 0, (uint8_t)(pi >> 8), (uint8_t)pi};
        VHD_CHECK(memcmp(got + 6, src, 6) == 0);
        VHD_CHECK_EQ((uint32_t)got[12] << 8 | got[13], GEN_ETHERTYPE);
        uint32_t seq = be32(got + 14);
        VHD_CHECK(k == 0 || seq > last);
        last = seq;
        VHD_CHECK(memcmp(got + 18, zero, GEN_LEN - 18) == 0);
    }
    struct vhd_netdrv_pair_stats st;
    vhd_netdrv_pair_stats(p, &st);
    VHD_CHECK_EQ(st.rx_errors, 0);
    return last;
}

/*
 * Frames taken from the receive queue per pass of send_and_reap, at most.
 * The generator refills every buffer as soon as it is given back, so a
 * drain "until the ring is empty" ends only when the driver outruns it: a
 * driver no faster than the generator (both built with TSan, or a loaded
 * CPU) stayed in that loop for seconds, neither sending nor reaping, and
 * the transmit check failed with every chain it counted in flight already
 * used by the device ("209 sent, 31 still in flight"). A bounded pass
 * keeps sending and reaping whatever the generator does. 16: an eighth of
 * the 128-entry ring; what is left there waits for the next pass.
 */
#define RX_PASS 16u

/*
 * Send count frames on pair pi, up to burst per call, and wait until the
 * device has used all of them (failing after WAIT_MS with no frame sent or
 * used); between bursts take up to RX_PASS received frames (none may be
 * ours). rx_us > 0: a slow receiver, rx_us of work per frame taken (the
 * generator then always keeps up with it).
 */
static void send_and_reap(struct vhd_netdrv *d, uint32_t pi, unsigned count, unsigned burst,
                          unsigned rx_us)
{
    struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, pi);
    uint8_t frame[100];
    memset(frame, 0xab, sizeof(frame));
    frame[12] = (uint8_t)(TX_ETHERTYPE >> 8);
    frame[13] = (uint8_t)TX_ETHERTYPE;
    struct iovec f[128];
    unsigned sent = 0;
    uint64_t t0 = ms_now();

    VHD_CHECK(burst >= 1 && burst <= 128);
    for (unsigned i = 0; i < burst; i++)
        f[i] = (struct iovec){frame, sizeof(frame)};
    for (;;) {
        int rc = 0;
        if (sent < count) {
            rc = vhd_netdrv_tx_burst(p, f, count - sent < burst ? count - sent : burst);
            VHD_CHECK(rc >= 0);
            sent += (unsigned)rc;
        }
        int reaped = vhd_netdrv_tx_reap(p);
        VHD_CHECK(reaped >= 0);
        if (sent == count && vhd_netdrv_tx_inflight(p) == 0)
            break;
        if (rc > 0 || reaped > 0)
            t0 = ms_now(); /* WAIT_MS is per completion, not for the whole count */
        uint8_t got[2048];
        for (unsigned k = 0; k < RX_PASS; k++) {
            int n = vhd_netdrv_rx_copy(p, got, sizeof(got));
            VHD_CHECK(n >= 0);
            if (n == 0)
                break;
            VHD_CHECK_EQ((uint32_t)got[12] << 8 | got[13], GEN_ETHERTYPE);
            /* The slow receiver's work on the frame: busy, so no wake-up latency adds to it. */
            for (uint64_t end = vhd_now_ns() + rx_us * 1000ull; rx_us && vhd_now_ns() < end;)
                ;
        }
        if (ms_now() - t0 > WAIT_MS) {
            fprintf(stderr, "  pair %u: %u sent, %u still in flight, no progress for %d ms\n", pi,
                    sent, vhd_netdrv_tx_inflight(p), WAIT_MS);
            VHD_CHECK(!"transmit not completed");
        }
    }
}

struct variant {
    bool packed;
    bool mrg;
    unsigned pairs;
    const char *poll;
    unsigned tx_burst; /* frames per vhd_netdrv_tx_burst call (0: 1) */
    unsigned rx_us;    /* a slow receiver while transmitting (send_and_reap) */
};

static void run_variant(const struct variant *v)
{
    enum { RX_FRAMES = 3000, TX_FRAMES = 500 };
    struct daemon dm;
    daemon_prepare(&dm);
    vhostd_start(&dm, v->pairs, v->poll);
    struct vhd_netdrv_opts o = {.socket_path = dm.sock,
                                .num_pairs = v->pairs,
                                .queue_size = 128,
                                .packed = v->packed,
                                .mrg_rxbuf = v->mrg};
    struct vhd_netdrv *d;
    d = netdrv_connect_ok(&o, NULL);
    VHD_CHECK_EQ(vhd_netdrv_get_info(d)->num_pairs, v->pairs);

    uint64_t rx_seen = 0, tx_sent = 0;
    for (uint32_t pi = 0; pi < v->pairs; pi++) {
        receive_generated(d, pi, RX_FRAMES);
        send_and_reap(d, pi, TX_FRAMES, v->tx_burst ? v->tx_burst : 1, v->rx_us);
        /* Generation goes on after our transmits. */
        receive_generated(d, pi, 100);
        rx_seen += RX_FRAMES + 100;
        tx_sent += TX_FRAMES;
    }
    uint64_t rx_driver = 0;
    for (uint32_t pi = 0; pi < v->pairs; pi++) {
        struct vhd_netdrv_pair_stats st;
        vhd_netdrv_pair_stats(vhd_netdrv_get_pair(d, pi), &st);
        rx_driver += st.rx_packets;
        VHD_CHECK_EQ(st.tx_done, TX_FRAMES);
    }
    VHD_CHECK(rx_driver >= rx_seen);
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    /*
     * The daemon's counters at session end: every transmitted frame counted
     * as sent and dropped; at least the frames we took were delivered (the
     * rest of the last refill may have been filled and never read).
     */
    const char *tot = "stats (session end): total:";
    VHD_CHECK_EQ(log_value(&dm, tot, "tx_packets"), (long long)tx_sent);
    VHD_CHECK_EQ(log_value(&dm, tot, "tx_drops"), (long long)tx_sent);
    VHD_CHECK_EQ(log_value(&dm, tot, "tx_errors"), 0);
    VHD_CHECK_EQ(log_value(&dm, tot, "rx_errors"), 0);
    VHD_CHECK(log_value(&dm, tot, "rx_packets") >= (long long)rx_driver);
    VHD_CHECK_EQ(log_value(&dm, tot, "rx_bytes"), log_value(&dm, tot, "rx_packets") * GEN_LEN);
    test_done();
}

VHD_TEST(gen_split_poll)
{
    run_variant(&(struct variant){.packed = false, .mrg = false, .pairs = 1, .poll = "always"});
}

/*
 * Transmit completes while the receiver takes its frames slowly (500 us
 * each) and the generator refills every buffer it gives back: the driver
 * must not wait for a receive ring that never stays empty (send_and_reap).
 * A ring's worth per transmit burst, so the test takes a few passes of
 * RX_PASS slow frames, not one per frame sent.
 */
VHD_TEST(gen_split_poll_slow_receiver)
{
    run_variant(&(struct variant){.packed = false,
                                  .mrg = false,
                                  .pairs = 1,
                                  .poll = "always",
                                  .tx_burst = 128,
                                  .rx_us = 500});
}

VHD_TEST(gen_packed_mrg_poll)
{
    run_variant(&(struct variant){.packed = true, .mrg = true, .pairs = 1, .poll = "always"});
}

VHD_TEST(gen_split_mrg_2pairs_event)
{
    run_variant(&(struct variant){.packed = false, .mrg = true, .pairs = 2, .poll = "never"});
}

VHD_TEST(gen_packed_2pairs_adaptive)
{
    run_variant(&(struct variant){.packed = true, .mrg = false, .pairs = 2, .poll = "adaptive"});
}

/* Daemon CPU ticks over one second; a spinning worker costs ~100 ticks. */
static long long cpu_ticks_in_1s(const struct daemon *dm)
{
    long long t0 = proc_cpu_ticks(dm->pid);
    sleep_ms(1000);
    long long t1 = proc_cpu_ticks(dm->pid);
    VHD_CHECK(t0 >= 0 && t1 >= 0);
    return t1 - t0;
}

/*
 * A pair out of use costs no CPU although its receive ring holds buffers:
 * the generator has no frames for it, and the ring must not keep an
 * event-mode worker spinning (it is passive until the pair is in use
 * again). Two pairs on one worker, VQ_PAIRS_SET 1 with pair 1's buffers
 * posted, pair 0's ring left full; one idle second measured. Then
 * VQ_PAIRS_SET 2: pair 1 generates again once its worker looks at it
 * (adaptive: the control command starts a poll window that sees it; event
 * mode: at its next kick).
 */
static void idle_pair(const char *poll)
{
    struct daemon dm;
    daemon_prepare(&dm);
    vhostd_start_workers(&dm, 2, poll, true);
    struct vhd_netdrv_opts o = {
        .socket_path = dm.sock, .num_pairs = 2, .queue_size = 128, .ctrl_vq = true};
    struct vhd_netdrv *d;
    char err[256];
    int rc = vhd_netdrv_connect(&o, &d, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  connect: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    receive_generated(d, 0, 10);
    receive_generated(d, 1, 10);
    uint16_t one = vhd_le16(1), two = vhd_le16(2);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &one, 2),
                 0);
    /* Take what pair 1 got before the command; its ring then keeps its buffers. */
    uint8_t got[2048];
    uint64_t t0 = ms_now();
    while (ms_now() - t0 < 300)
        (void)vhd_netdrv_rx_copy(vhd_netdrv_get_pair(d, 1), got, sizeof(got));
    sleep_ms(200); /* let an adaptive poll window close */
    long long ticks = cpu_ticks_in_1s(&dm);
    long hz = sysconf(_SC_CLK_TCK);
    fprintf(stderr, "  idle CPU (%s, pair 1 out of use): %lld ticks of %ld in 1 s\n", poll, ticks,
            hz);
    VHD_CHECK(ticks <= hz / 20); /* at most 5% of one CPU */
    VHD_CHECK_EQ(vhd_netdrv_rx_copy(vhd_netdrv_get_pair(d, 1), got, sizeof(got)), 0);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &two, 2),
                 0);
    /*
     * Back in use: generating again at once, in every polling mode. The
     * pair's ring is passive and its worker asleep: VQ_PAIRS_SET rings its
     * doorbell (without, it waited for a kick that never comes: its ring is
     * full of buffers).
     */
    receive_generated(d, 1, 100);
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

VHD_TEST(gen_idle_pair_event)
{
    idle_pair("never");
}

VHD_TEST(gen_idle_pair_adaptive)
{
    idle_pair("adaptive");
}

/* An unknown backend name is refused with the list of known ones. */
VHD_TEST(gen_backend_name_checked)
{
    struct daemon dm;
    daemon_prepare(&dm);
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    char spec[PATH_MAX];
    snprintf(spec, sizeof(spec), "socket=%s,backend=generator", dm.sock);
    char *argv[] = {(char *)bin, "--net", spec, NULL};
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(dm.log, O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    int status = 0;
    VHD_CHECK_EQ(waitpid(pid, &status, 0), pid);
    VHD_CHECK(WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 127);
    FILE *f = fopen(dm.log, "r");
    char buf[512];
    bool named = false;
    while (f && fgets(buf, sizeof(buf), f))
        named |= strstr(buf, "loopback, switch, tap or gen") != NULL;
    if (f)
        fclose(f);
    VHD_CHECK(named);
    test_done();
}
