/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The userspace virtio-net driver against the real daemon: each test starts
 * build/vhostd (VHD_VHOSTD, or next to this binary, or build/vhostd from the
 * repo root; skipped when absent) with a loopback net device in a child
 * process, sends frames through the driver and checks that each comes back
 * byte-identical on the same queue pair: split and packed rings, with and
 * without MRG_RXBUF, one and two pairs, frames spanning several receive
 * buffers, polled and interrupt-driven completion; GET_QUEUE_NUM, idle CPU,
 * control-queue commands and announce end to end, two ports with two pairs
 * on a switch, a two-queue TAP in a namespace of its own. Daemons die with the test
 * (PR_SET_PDEATHSIG, atexit); every wait is bounded.
 */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util/compiler.h"
#include "spec/virtio_net.h"
#include "harness.h"
#include "vhostd/net_driver.h"

#define WAIT_MS     5000 /* a frame has this long to come back */
#define MAX_DAEMONS 2

#include "daemon_fixture.h"
#include "netdrv_fixture.h"

/* ======================= daemons ======================= */

/* Temp dir for a daemon. */
static void daemon_prepare(struct daemon *dm)
{
    daemon_prepare_dir(dm, "vhd-test-nd-XXXXXX", "net.sock");
    track(dm);
}

/* Start vhostd with "--net socket=...,backend=loopback,queues=<pairs><keys>". */
static void vhostd_start(struct daemon *dm, unsigned pairs, const char *keys)
{
    const char *bin = vhostd_path();
    char spec[PATH_MAX];
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    snprintf(spec, sizeof(spec), "socket=%s,backend=loopback,queues=%u%s", dm->sock, pairs, keys);
    char *argv[] = {(char *)bin, "--log-level", "warn", "--net", spec, NULL};
    daemon_spawn(dm, argv);
}

/* Start vhostd with extra daemon options (argv-style, NULL-terminated) before --net. */
static void vhostd_start_opts(struct daemon *dm, unsigned pairs, const char *keys,
                              const char *const *extra)
{
    const char *bin = vhostd_path();
    char spec[PATH_MAX];
    char *argv[16];
    unsigned n = 0;
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    snprintf(spec, sizeof(spec), "socket=%s,queues=%u%s", dm->sock, pairs, keys);
    argv[n++] = (char *)bin;
    argv[n++] = "--log-level";
    argv[n++] = "warn";
    for (; extra && *extra && n < 12; extra++)
        argv[n++] = (char *)*extra;
    argv[n++] = "--net";
    argv[n++] = spec;
    argv[n] = NULL;
    daemon_spawn(dm, argv);
}

/* ======================= loopback checks ======================= */

/* Frame k of a run: a recognisable Ethernet-ish frame of len bytes (pair in byte 12). */
static void make_frame(uint8_t *f, uint32_t len, uint32_t pair, uint32_t k)
{
    static const uint8_t dst[6] = {0x52, 0x54, 0x00, 0x12, 0x34, 0x56};
    static const uint8_t src[6] = {0x52, 0x54, 0x00, 0xab, 0xcd, 0xef};
    memcpy(f, dst, 6);
    memcpy(f + 6, src, 6);
    f[12] = (uint8_t)pair;
    f[13] = (uint8_t)k;
    uint32_t x = (k + 1) * 2654435761u ^ (pair << 24);
    for (uint32_t i = 14; i < len; i++) {
        x = x * 1103515245u + 12345u;
        f[i] = (uint8_t)(x >> 16);
    }
}

/*
 * Send count frames of the given lengths (cycled) on every pair in turn,
 * at most `window` in flight, and check each comes back whole, in order,
 * on its own pair. interrupt: wait on the call eventfds instead of polling.
 * Returns 2 when some frame took several receive buffers (MRG_RXBUF), else 0.
 */
static uint32_t loop_frames(struct vhd_netdrv *d, const uint32_t *lens, unsigned nlens,
                            unsigned count, unsigned window, bool interrupt)
{
    const struct vhd_netdrv_info *in = vhd_netdrv_get_info(d);
    uint32_t maxlen = 0;
    for (unsigned i = 0; i < nlens; i++)
        maxlen = lens[i] > maxlen ? lens[i] : maxlen;
    uint8_t *want = malloc(maxlen), *got = malloc(maxlen + 1);
    VHD_CHECK(want && got);
    uint32_t max_bufs = 0;

    for (uint32_t pi = 0; pi < in->num_pairs; pi++) {
        struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, pi);
        VHD_CHECK(p != NULL);
        unsigned sent = 0, recv = 0;
        struct vhd_netdrv_pair_stats st0, st;
        vhd_netdrv_pair_stats(p, &st0);
        while (recv < count) {
            while (sent < count && sent - recv < window) {
                uint32_t len = lens[sent % nlens];
                make_frame(want, len, pi, sent);
                struct iovec f = {want, len};
                int rc = vhd_netdrv_tx_burst(p, &f, 1);
                VHD_CHECK(rc >= 0);
                if (rc == 0)
                    break;
                sent++;
            }
            uint64_t t0 = ms_now();
            int n;
            for (;;) {
                n = vhd_netdrv_rx_copy(p, got, maxlen + 1);
                VHD_CHECK(n >= 0);
                if (n > 0)
                    break;
                VHD_CHECK(vhd_netdrv_tx_reap(p) >= 0);
                if (ms_now() - t0 > WAIT_MS) {
                    fprintf(stderr, "  pair %u: frame %u did not come back\n", pi, recv);
                    VHD_CHECK(!"frame lost");
                }
                if (interrupt)
                    VHD_CHECK(vhd_netdrv_wait(p, 100) >= 0);
            }
            uint32_t len = lens[recv % nlens];
            make_frame(want, len, pi, recv);
            if ((uint32_t)n != len || memcmp(want, got, len) != 0) {
                fprintf(stderr, "  pair %u frame %u: %d bytes back, %u sent%s\n", pi, recv, n, len,
                        (uint32_t)n == len ? " (contents differ)" : "");
                VHD_CHECK(!"frame differs");
            }
            recv++;
        }
        /* Nothing extra on this pair, nothing on the others. */
        VHD_CHECK_EQ(vhd_netdrv_rx_copy(p, got, maxlen), 0);
        vhd_netdrv_pair_stats(p, &st);
        VHD_CHECK_EQ(st.rx_packets - st0.rx_packets, count);
        VHD_CHECK_EQ(st.tx_packets - st0.tx_packets, count);
        VHD_CHECK_EQ(st.rx_errors, 0);
        /* More buffers than frames: some frame was merged from several (MRG_RXBUF). */
        if (st.rx_buffers - st0.rx_buffers > st.rx_packets - st0.rx_packets && max_bufs < 2)
            max_bufs = 2;
        for (uint32_t pj = 0; pj < in->num_pairs; pj++)
            if (pj != pi)
                VHD_CHECK_EQ(vhd_netdrv_rx_copy(vhd_netdrv_get_pair(d, pj), got, maxlen), 0);
    }
    free(want);
    free(got);
    return max_bufs;
}

struct variant {
    bool packed;
    bool mrg;
    unsigned pairs;
    bool no_in_order; /* the driver does not negotiate IN_ORDER (vhostd offers it) */
};

static const uint32_t small_lens[] = {60, 64, 128, 1514, 61, 200};

static void run_variant(const struct variant *v, bool interrupt)
{
    struct daemon dm;
    daemon_prepare(&dm);
    vhostd_start(&dm, v->pairs, "");
    struct vhd_netdrv_opts o = {.socket_path = dm.sock,
                                .num_pairs = v->pairs,
                                .queue_size = 64,
                                .packed = v->packed,
                                .mrg_rxbuf = v->mrg,
                                .no_in_order = v->no_in_order};
    struct vhd_netdrv *d;
    d = netdrv_connect_ok(&o, NULL);
    const struct vhd_netdrv_info *in = vhd_netdrv_get_info(d);
    VHD_CHECK_EQ(in->num_pairs, v->pairs);
    VHD_CHECK_EQ(in->packed, v->packed);
    VHD_CHECK_EQ(in->mrg_rxbuf, v->mrg);
    /* IN_ORDER by default: transmit runs come back as one used entry each. */
    VHD_CHECK_EQ(in->in_order, !v->no_in_order);
    VHD_CHECK_EQ((in->features >> 35) & 1, !v->no_in_order); /* VIRTIO_F_IN_ORDER */
    /* window 1 checks ordering frame by frame; 48 keeps the rings busy. */
    loop_frames(d, small_lens, 6, 200, 1, interrupt);
    loop_frames(d, small_lens, 6, 2000, 48, interrupt);
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

VHD_TEST(loop_split_1pair)
{
    run_variant(&(struct variant){.packed = false, .mrg = false, .pairs = 1}, false);
}

VHD_TEST(loop_packed_1pair)
{
    run_variant(&(struct variant){.packed = true, .mrg = false, .pairs = 1}, false);
}

VHD_TEST(loop_split_1pair_no_in_order)
{
    run_variant(&(struct variant){.packed = false, .pairs = 1, .no_in_order = true}, false);
}

VHD_TEST(loop_packed_1pair_no_in_order)
{
    run_variant(&(struct variant){.packed = true, .pairs = 1, .no_in_order = true}, false);
}

VHD_TEST(loop_split_mrg_2pairs)
{
    run_variant(&(struct variant){.packed = false, .mrg = true, .pairs = 2}, false);
}

VHD_TEST(loop_packed_mrg_2pairs)
{
    run_variant(&(struct variant){.packed = true, .mrg = true, .pairs = 2}, false);
}

VHD_TEST(loop_split_2pairs_interrupt)
{
    run_variant(&(struct variant){.packed = false, .mrg = false, .pairs = 2}, true);
}

VHD_TEST(loop_packed_mrg_1pair_interrupt)
{
    run_variant(&(struct variant){.packed = true, .mrg = true, .pairs = 1}, true);
}

/* Frames larger than one receive buffer: MRG_RXBUF merges them (num_buffers > 1). */
static void run_merge(bool packed)
{
    static const uint32_t lens[] = {1514, 9000, 60, 500, 4000, 9014};
    struct daemon dm;
    daemon_prepare(&dm);
    vhostd_start(&dm, 1, "");
    struct vhd_netdrv_opts o = {.socket_path = dm.sock,
                                .queue_size = 256,
                                .packed = packed,
                                .mrg_rxbuf = true,
                                .rx_buf_size = 512,
                                .max_tx_frame = 9014};
    struct vhd_netdrv *d;
    d = netdrv_connect_ok(&o, NULL);
    struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, 0);
    VHD_CHECK(loop_frames(d, lens, 6, 300, 1, false) >= 2);
    /* Several in flight too: up to 256 / 18 buffers of the largest frame fit the ring. */
    loop_frames(d, lens, 6, 600, 8, false);
    struct vhd_netdrv_pair_stats st;
    vhd_netdrv_pair_stats(p, &st);
    VHD_CHECK(st.rx_buffers > st.rx_packets);
    /* Without MRG_RXBUF such frames do not fit: they are dropped, nothing comes back. */
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

VHD_TEST(merge_split)
{
    run_merge(false);
}

VHD_TEST(merge_packed)
{
    run_merge(true);
}

/* Without MRG_RXBUF a frame larger than one buffer is dropped by the device, and the next fits. */
VHD_TEST(no_merge_oversize_dropped)
{
    struct daemon dm;
    daemon_prepare(&dm);
    vhostd_start(&dm, 1, "");
    struct vhd_netdrv_opts o = {
        .socket_path = dm.sock, .queue_size = 64, .rx_buf_size = 512, .max_tx_frame = 2000};
    struct vhd_netdrv *d;
    char err[256];
    VHD_CHECK_EQ(vhd_netdrv_connect(&o, &d, err, sizeof(err)), 0);
    struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, 0);
    uint8_t big[2000], small[100], got[2048];
    make_frame(big, sizeof(big), 0, 1);
    make_frame(small, sizeof(small), 0, 2);
    struct iovec f[2] = {{big, sizeof(big)}, {small, sizeof(small)}};
    VHD_CHECK_EQ(vhd_netdrv_tx_burst(p, f, 2), 2);
    uint64_t t0 = ms_now();
    int n;
    while ((n = vhd_netdrv_rx_copy(p, got, sizeof(got))) == 0 && ms_now() - t0 < WAIT_MS)
        sleep_ms(1);
    VHD_CHECK_EQ(n, sizeof(small));
    VHD_CHECK(memcmp(got, small, sizeof(small)) == 0);
    /* Both TX buffers were used (the device drops, as a NIC does, and completes the TX). */
    t0 = ms_now();
    while (vhd_netdrv_tx_inflight(p) && ms_now() - t0 < WAIT_MS) {
        VHD_CHECK(vhd_netdrv_tx_reap(p) >= 0);
        sleep_ms(1);
    }
    VHD_CHECK_EQ(vhd_netdrv_tx_inflight(p), 0);
    /* A frame too long for the TX slots is refused before it reaches the ring. */
    struct iovec toolong = {got, sizeof(got)};
    VHD_CHECK_EQ(vhd_netdrv_tx_burst(p, &toolong, 1), -EINVAL);
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* Options the driver refuses before touching the socket, and a device that lacks pairs. */
VHD_TEST(bad_options)
{
    struct vhd_netdrv *d;
    char err[256];
    struct vhd_netdrv_opts o = {.socket_path = "/nonexistent/x.sock", .queue_size = 100};
    VHD_CHECK_EQ(vhd_netdrv_connect(&o, &d, err, sizeof(err)), -EINVAL);
    VHD_CHECK(!strcmp(err, "queue_size 100: 1..32768, a power of two for split rings"));
    o.queue_size = 0;
    o.socket_path = "";
    VHD_CHECK_EQ(vhd_netdrv_connect(&o, &d, err, sizeof(err)), -EINVAL);
    VHD_CHECK(!strcmp(err, "no socket path"));
    o.socket_path = "/nonexistent/x.sock";
    o.num_pairs = VHD_NETDRV_MAX_PAIRS + 1;
    VHD_CHECK_EQ(vhd_netdrv_connect(&o, &d, err, sizeof(err)), -EINVAL);
    char want[64];
    snprintf(want, sizeof(want), "num_pairs %u: at most %u", VHD_NETDRV_MAX_PAIRS + 1,
             VHD_NETDRV_MAX_PAIRS);
    VHD_CHECK(!strcmp(err, want));
    o.num_pairs = 1;
    o.rx_buf_size = 16;
    VHD_CHECK_EQ(vhd_netdrv_connect(&o, &d, err, sizeof(err)), -EINVAL);

    struct daemon dm;
    daemon_prepare(&dm);
    vhostd_start(&dm, 2, "");
    struct vhd_netdrv_opts o2 = {.socket_path = dm.sock, .num_pairs = 3};
    VHD_CHECK_EQ(vhd_netdrv_connect(&o2, &d, err, sizeof(err)), -ENOTSUP);
    VHD_CHECK(strstr(err, "pairs") != NULL);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    /* A back-end offering split rings only refuses a driver that wants packed. */
    daemon_prepare(&dm);
    vhostd_start(&dm, 1, ",rings=split");
    struct vhd_netdrv_opts o3 = {.socket_path = dm.sock, .packed = true};
    VHD_CHECK_EQ(vhd_netdrv_connect(&o3, &d, err, sizeof(err)), -ENOTSUP);
    VHD_CHECK(!strcmp(err, "the back-end does not offer packed rings (VIRTIO_F_RING_PACKED)"));
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * GET_QUEUE_NUM counts queue pairs for net devices (what QEMU's vhost-user
 * netdev compares queues=N with, and what DPDK's vhost library answers):
 * a 3-pair device says 3, every pair up to the last works, a fourth is
 * refused; a 1-pair device says 1 and its two rings still start.
 */
VHD_TEST(get_queue_num_counts_pairs)
{
    static const uint32_t lens[] = {60, 1514};
    struct daemon dm;
    struct vhd_netdrv *d;
    char err[256];

    daemon_prepare(&dm);
    vhostd_start(&dm, 3, "");
    struct vhd_netdrv_opts o = {.socket_path = dm.sock, .num_pairs = 3, .queue_size = 64};
    d = netdrv_connect_ok(&o, NULL);
    VHD_CHECK_EQ(vhd_netdrv_get_info(d)->queue_num, 3);
    VHD_CHECK_EQ(vhd_netdrv_get_info(d)->device_pairs, 3);
    loop_frames(d, lens, 2, 20, 4, false); /* every pair, the last one (rings 4, 5) included */
    vhd_netdrv_disconnect(d);
    o.num_pairs = 4;
    VHD_CHECK_EQ(vhd_netdrv_connect(&o, &d, err, sizeof(err)), -ENOTSUP);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    struct daemon dm1;
    daemon_prepare(&dm1);
    vhostd_start(&dm1, 1, "");
    o.socket_path = dm1.sock;
    o.num_pairs = 1;
    VHD_CHECK_EQ(vhd_netdrv_connect(&o, &d, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_netdrv_get_info(d)->queue_num, 1);
    loop_frames(d, lens, 2, 20, 4, false);
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm1), 0);
    test_done();
}

/*
 * An idle daemon costs no CPU although the driver keeps receive buffers
 * posted: buffers on a receive queue are not work by themselves (the queue
 * runs when the backend has frames, or its pair transmits). Event mode and
 * adaptive polling, loopback (no receive fd) and switch (a doorbell per
 * pair); a few frames first so the rings have run, then one idle second
 * measured from /proc/PID/stat. A spinning worker costs ~100 ticks a second.
 */
static void idle_cpu(const char *poll, const char *backend)
{
    static const uint32_t lens[] = {60, 1514};
    const char *extra[] = {"--poll", poll, NULL};
    char keys[64];
    struct daemon dm;
    struct vhd_netdrv *d;

    snprintf(keys, sizeof(keys), ",backend=%s", backend);
    daemon_prepare(&dm);
    vhostd_start_opts(&dm, 2, keys, extra);
    struct vhd_netdrv_opts o = {.socket_path = dm.sock, .num_pairs = 2, .queue_size = 256};
    d = netdrv_connect_ok(&o, NULL);
    if (!strcmp(backend, "loopback"))
        loop_frames(d, lens, 2, 50, 8, false);
    sleep_ms(200); /* let the adaptive poll window close */
    long long t0 = proc_cpu_ticks(dm.pid);
    sleep_ms(1000);
    long long t1 = proc_cpu_ticks(dm.pid);
    VHD_CHECK(t0 >= 0 && t1 >= 0);
    long hz = sysconf(_SC_CLK_TCK);
    fprintf(stderr, "  idle CPU (%s, %s): %lld ticks of %ld in 1 s\n", poll, backend, t1 - t0, hz);
    VHD_CHECK(t1 - t0 <= hz / 20); /* at most 5% of one CPU */
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

VHD_TEST(idle_cpu_never_loopback)
{
    idle_cpu("never", "loopback");
}

VHD_TEST(idle_cpu_adaptive_loopback)
{
    idle_cpu("adaptive", "loopback");
}

VHD_TEST(idle_cpu_never_switch)
{
    idle_cpu("never", "switch,switch=idle");
}

VHD_TEST(idle_cpu_adaptive_switch)
{
    idle_cpu("adaptive", "switch,switch=idle");
}

/* Send one frame on pair pi; true when it came back on that pair within ms. */
static bool echo_one(struct vhd_netdrv *d, uint32_t pi, uint32_t k, unsigned ms)
{
    struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, pi);
    uint8_t f[100], got[128];
    make_frame(f, sizeof(f), pi, k);
    struct iovec io = {f, sizeof(f)};
    VHD_CHECK_EQ(vhd_netdrv_tx_burst(p, &io, 1), 1);
    uint64_t t0 = ms_now();
    for (;;) {
        int n = vhd_netdrv_rx_copy(p, got, sizeof(got));
        VHD_CHECK(n >= 0);
        if (n > 0)
            return n == (int)sizeof(f) && memcmp(f, got, sizeof(f)) == 0;
        VHD_CHECK(vhd_netdrv_tx_reap(p) >= 0);
        if (ms_now() - t0 > ms)
            return false;
        sleep_ms(1);
    }
}

static struct vhd_netdrv *connect_ctrl(struct daemon *dm, unsigned pairs)
{
    struct vhd_netdrv_opts o = {
        .socket_path = dm->sock, .num_pairs = pairs, .queue_size = 64, .ctrl_vq = true};
    struct vhd_netdrv *d;
    d = netdrv_connect_ok(&o, NULL);
    const struct vhd_netdrv_info *in = vhd_netdrv_get_info(d);
    VHD_CHECK(in->ctrl_vq);
    VHD_CHECK(in->config_notify);
    VHD_CHECK(in->features & (1ull << VIRTIO_NET_F_CTRL_VQ));
    VHD_CHECK(in->features & (1ull << VIRTIO_NET_F_GUEST_ANNOUNCE));
    return d;
}

/*
 * Control-queue commands end to end: the driver's control queue against the
 * daemon. Pairs in use follow VQ_PAIRS_SET (out-of-range values refused,
 * frames on a pair not in use go nowhere); RX mode, MAC table and MAC
 * address commands, malformed ones refused; the new MAC shows in config.
 */
VHD_TEST(ctrl_commands_end_to_end)
{
    struct daemon dm;
    daemon_prepare(&dm);
    vhostd_start(&dm, 2, "");
    struct vhd_netdrv *d = connect_ctrl(&dm, 2);
    unsigned k = 0;

    /* connect said VQ_PAIRS_SET 2: both pairs carry traffic */
    VHD_CHECK(echo_one(d, 0, k++, WAIT_MS));
    VHD_CHECK(echo_one(d, 1, k++, WAIT_MS));
    uint16_t bad[] = {0, 3, 0x8000, 0xffff};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint16_t n = vhd_le16(bad[i]);
        VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &n, 2),
                     -EINVAL);
    }
    VHD_CHECK(echo_one(d, 1, k++, WAIT_MS)); /* refusals changed nothing */
    uint16_t one = vhd_le16(1), two = vhd_le16(2);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &one, 2),
                 0);
    VHD_CHECK(!echo_one(d, 1, k++, 200)); /* pair 1 not in use: dropped */
    VHD_CHECK(echo_one(d, 0, k++, WAIT_MS));
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &two, 2),
                 0);
    VHD_CHECK(echo_one(d, 1, k++, WAIT_MS));
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MQ, VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET, &two, 1),
                 -EINVAL); /* short */

    /* RX mode: promisc and allmulti on and off; a wrong length or an unoffered mode refused */
    uint8_t on = 1, off = 0;
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, &on, 1), 0);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_ALLMULTI, &on, 1), 0);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, &off, 1), 0);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_ALLMULTI, &off, 1), 0);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, &two, 2),
                 -EINVAL);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_NOBCAST, &on, 1),
                 -EINVAL);

    /* MAC table: 1 unicast + 2 multicast entries; counts that do not match the data refused */
    uint8_t tbl[4 + 6 + 4 + 12] = {1, 0,    0, 0,    0x52, 0x54, 0, 1,    2,    3, 2, 0, 0,
                                   0, 0x01, 0, 0x5e, 0,    0,    1, 0x33, 0x33, 0, 0, 0, 1};
    VHD_CHECK_EQ(
        vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, tbl, sizeof(tbl)),
        0);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, tbl,
                                 sizeof(tbl) - 6),
                 -EINVAL);
    tbl[0] = 200;
    VHD_CHECK_EQ(
        vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, tbl, sizeof(tbl)),
        -EINVAL);

    /* MAC address: the new one in config space; multicast and short refused */
    uint8_t mac[6] = {0x02, 0x00, 0x00, 0x0a, 0x0b, 0x0c}, mc[6] = {0x01, 0, 0x5e, 0, 0, 9};
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_ADDR_SET, mac, 6), 0);
    VHD_CHECK_EQ(vhd_netdrv_read_config(d), 0);
    VHD_CHECK(memcmp(vhd_netdrv_get_info(d)->mac, mac, 6) == 0);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_ADDR_SET, mc, 6),
                 -EINVAL);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_ADDR_SET, mac, 5),
                 -EINVAL);
    VHD_CHECK_EQ(vhd_netdrv_read_config(d), 0);
    VHD_CHECK(memcmp(vhd_netdrv_get_info(d)->mac, mac, 6) == 0);

    /* unknown class, VLAN (not offered), oversized: refused, the queue keeps working */
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, 77, 0, NULL, 0), -EINVAL);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_VLAN, VIRTIO_NET_CTRL_VLAN_ADD, &two, 2),
                 -EINVAL);
    static uint8_t big[VHD_NETDRV_CTRL_MAX + 1];
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_MAC, 0, big, sizeof(big)), -E2BIG);
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, &off, 1), 0);
    VHD_CHECK(echo_one(d, 0, k++, WAIT_MS));
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * GUEST_ANNOUNCE end to end: a fresh session is not asked to announce; a
 * SEND_RARP from the front-end makes the daemon set VIRTIO_NET_S_ANNOUNCE
 * and send a config change notification on the back-end channel; the
 * driver's ANNOUNCE_ACK clears the bit.
 */
VHD_TEST(announce_end_to_end)
{
    struct daemon dm;
    daemon_prepare(&dm);
    vhostd_start(&dm, 1, "");
    struct vhd_netdrv *d = connect_ctrl(&dm, 1);
    const struct vhd_netdrv_info *in = vhd_netdrv_get_info(d);

    VHD_CHECK_EQ(vhd_netdrv_config_wait(d, 100), 0);
    VHD_CHECK(!(in->status & VIRTIO_NET_S_ANNOUNCE));
    VHD_CHECK_EQ(vhd_netdrv_send_rarp(d, in->mac), 0);
    VHD_CHECK_EQ(vhd_netdrv_config_wait(d, WAIT_MS), 1);
    VHD_CHECK(in->status & VIRTIO_NET_S_ANNOUNCE);
    VHD_CHECK(in->status & VIRTIO_NET_S_LINK_UP);
    /* the guest's part: gratuitous frames (here one frame) then the ack */
    VHD_CHECK(echo_one(d, 0, 1, WAIT_MS));
    VHD_CHECK_EQ(
        vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_ANNOUNCE, VIRTIO_NET_CTRL_ANNOUNCE_ACK, NULL, 0), 0);
    VHD_CHECK_EQ(vhd_netdrv_read_config(d), 0);
    VHD_CHECK(!(in->status & VIRTIO_NET_S_ANNOUNCE));
    /* an ack with data is malformed */
    VHD_CHECK_EQ(vhd_netdrv_ctrl(d, VIRTIO_NET_CTRL_ANNOUNCE, VIRTIO_NET_CTRL_ANNOUNCE_ACK, "x", 1),
                 -EINVAL);
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* ======================= switch and TAP with several pairs ======================= */

/* Start vhostd with the argument list given (after the binary), optionally inside netns ns. */
static void vhostd_start_args(struct daemon *dm, const char *ns, const char *const *args)
{
    const char *bin = vhostd_path();
    char *argv[24];
    unsigned n = 0;
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    if (ns) {
        argv[n++] = "/bin/ip";
        argv[n++] = "netns";
        argv[n++] = "exec";
        argv[n++] = (char *)ns;
    }
    argv[n++] = (char *)bin;
    for (; *args && n < 23; args++)
        argv[n++] = (char *)*args;
    argv[n] = NULL;
    daemon_spawn(dm, argv);
}

/* An Ethernet frame from src to dst, ethertype 0x88b5 (local experimental), payload tagged. */
static void eth_frame(uint8_t *f, uint32_t len, const uint8_t *dst, const uint8_t *src,
                      uint8_t pair, uint32_t k)
{
    memset(f, 0, len);
    memcpy(f, dst, 6);
    memcpy(f + 6, src, 6);
    f[12] = 0x88;
    f[13] = 0xb5;
    f[14] = pair;
    memcpy(f + 15, &k, sizeof(k));
}

/* Wait for one frame on p (bounded); its length, 0 on timeout. */
static int rx_wait(struct vhd_netdrv_pair *p, uint8_t *buf, size_t len, unsigned ms)
{
    uint64_t t0 = ms_now();
    for (;;) {
        int n = vhd_netdrv_rx_copy(p, buf, len);
        VHD_CHECK(n >= 0);
        if (n > 0)
            return n;
        VHD_CHECK(vhd_netdrv_tx_reap(p) >= 0);
        if (ms_now() - t0 > ms)
            return 0;
        sleep_ms(1);
    }
}

/*
 * Two devices with two queue pairs each on one switch (two workers): frames
 * from pair i of one port arrive on pair i of the other, both ways, on
 * every pair, nothing strays to another pair; the per-pair counters add up.
 */
VHD_TEST(switch_two_ports_two_pairs)
{
    enum { PAIRS = 2, PER_PAIR = 40 };
    struct daemon dm;
    char spec_a[PATH_MAX], spec_b[PATH_MAX], sock_b[256];
    daemon_prepare(&dm);
    snprintf(sock_b, sizeof(sock_b), "%s/b.sock", dm.dir);
    snprintf(spec_a, sizeof(spec_a), "socket=%s,backend=switch,switch=mp,queues=%d", dm.sock,
             PAIRS);
    snprintf(spec_b, sizeof(spec_b), "socket=%s,backend=switch,switch=mp,queues=%d", sock_b, PAIRS);
    const char *args[] = {"--log-level", "warn",  "--workers", "2", "--net",
                          spec_a,        "--net", spec_b,      NULL};
    vhostd_start_args(&dm, NULL, args);

    struct vhd_netdrv *d[2];
    const char *socks[2] = {dm.sock, sock_b};
    for (int i = 0; i < 2; i++) {
        struct vhd_netdrv_opts o = {.socket_path = socks[i], .num_pairs = PAIRS, .queue_size = 128};
        d[i] = netdrv_connect_ok(&o, i ? "1" : "0");
    }
    const uint8_t *mac[2] = {vhd_netdrv_get_info(d[0])->mac, vhd_netdrv_get_info(d[1])->mac};
    VHD_CHECK(memcmp(mac[0], mac[1], 6) != 0);

    uint8_t f[128], got[256];
    for (int from = 0; from < 2; from++) {
        int to = 1 - from;
        for (uint32_t pi = 0; pi < PAIRS; pi++) {
            struct vhd_netdrv_pair *tx = vhd_netdrv_get_pair(d[from], pi);
            struct vhd_netdrv_pair *rx = vhd_netdrv_get_pair(d[to], pi);
            for (uint32_t k = 0; k < PER_PAIR; k++) {
                eth_frame(f, 60 + k, mac[to], mac[from], (uint8_t)pi, k);
                struct iovec io = {f, 60 + k};
                VHD_CHECK_EQ(vhd_netdrv_tx_burst(tx, &io, 1), 1);
                int n = rx_wait(rx, got, sizeof(got), WAIT_MS);
                if (n != (int)(60 + k) || memcmp(got, f, 60 + k) != 0) {
                    fprintf(stderr, "  port %d pair %u frame %u: %d bytes at port %d\n", from, pi,
                            k, n, to);
                    VHD_CHECK(!"frame not delivered whole on the same pair");
                }
            }
            /* nothing on the other pairs of either port */
            for (uint32_t pj = 0; pj < PAIRS; pj++) {
                VHD_CHECK_EQ(vhd_netdrv_rx_copy(vhd_netdrv_get_pair(d[from], pj), got, 256), 0);
                if (pj != pi)
                    VHD_CHECK_EQ(vhd_netdrv_rx_copy(vhd_netdrv_get_pair(d[to], pj), got, 256), 0);
            }
        }
    }
    for (int i = 0; i < 2; i++) {
        for (uint32_t pi = 0; pi < PAIRS; pi++) {
            struct vhd_netdrv_pair_stats st;
            vhd_netdrv_pair_stats(vhd_netdrv_get_pair(d[i], pi), &st);
            VHD_CHECK_EQ(st.tx_packets, PER_PAIR);
            VHD_CHECK_EQ(st.rx_packets, PER_PAIR);
            VHD_CHECK_EQ(st.rx_errors, 0);
        }
        vhd_netdrv_disconnect(d[i]);
    }
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    unlink(sock_b);
    test_done();
}

/* ---- TAP in a network namespace the test creates ---- */

static char g_ns[32];

static void ns_cleanup(void)
{
    if (g_ns[0]) {
        char cmd[96];
        snprintf(cmd, sizeof(cmd), "ip netns del %s 2>/dev/null", g_ns);
        if (system(cmd) != 0) {
            /* already gone */
        }
        g_ns[0] = 0;
    }
}

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    if (rc != 0)
        fprintf(stderr, "  '%s': status %d\n", cmd, rc);
    return rc;
}

/* A fresh netns (vhd-nd-PID); skipped without root or ip(8). Deleted at exit. */
static void ns_create(void)
{
    if (geteuid() != 0)
        vhd_test_skip("needs root (network namespace, TAP)");
    if (system("ip netns list >/dev/null 2>&1") != 0)
        vhd_test_skip("ip netns not available");
    snprintf(g_ns, sizeof(g_ns), "vhd-nd-%d", (int)getpid());
    atexit(ns_cleanup);
    VHD_CHECK_EQ(sh("ip netns add %s && ip -n %s link set lo up", g_ns, g_ns), 0);
}

static uint16_t csum16(const uint8_t *p, size_t len)
{
    uint32_t s = 0;
    for (size_t i = 0; i + 1 < len; i += 2)
        s += (uint32_t)p[i] << 8 | p[i + 1];
    if (len & 1)
        s += (uint32_t)p[len - 1] << 8;
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    return (uint16_t)~s;
}

/*
 * A TCP SYN from 192.0.2.<src_ip>:sport to 192.0.2.<dst_ip>:dport (IPv4, checksums
 * filled). 54 bytes; padded to 60.
 */
static uint32_t tcp_syn(uint8_t *f, const uint8_t *dmac, const uint8_t *smac, uint8_t src_ip,
                        uint8_t dst_ip, uint16_t sport, uint16_t dport, uint32_t seq)
{
    memset(f, 0, 60);
    memcpy(f, dmac, 6);
    memcpy(f + 6, smac, 6);
    f[12] = 0x08;
    uint8_t *ip = f + 14;
    ip[0] = 0x45;
    ip[3] = 40;   /* total length */
    ip[6] = 0x40; /* DF */
    ip[8] = 64;   /* TTL */
    ip[9] = 6;    /* TCP */
    const uint8_t net[3] = {192, 0, 2};
    memcpy(ip + 12, net, 3);
    ip[15] = src_ip;
    memcpy(ip + 16, net, 3);
    ip[19] = dst_ip;
    uint16_t c = csum16(ip, 20);
    ip[10] = (uint8_t)(c >> 8);
    ip[11] = (uint8_t)c;
    uint8_t *t = ip + 20;
    t[0] = (uint8_t)(sport >> 8);
    t[1] = (uint8_t)sport;
    t[2] = (uint8_t)(dport >> 8);
    t[3] = (uint8_t)dport;
    t[4] = (uint8_t)(seq >> 24);
    t[5] = (uint8_t)(seq >> 16);
    t[6] = (uint8_t)(seq >> 8);
    t[7] = (uint8_t)seq;
    t[12] = 5 << 4; /* data offset: 20 bytes */
    t[13] = 0x02;   /* SYN */
    t[14] = 0xff;   /* window */
    /* checksum over the pseudo header (addresses, protocol, length) and the segment */
    uint8_t ph[12 + 20];
    memcpy(ph, ip + 12, 8);
    ph[8] = 0;
    ph[9] = 6;
    ph[10] = 0;
    ph[11] = 20;
    memcpy(ph + 12, t, 20);
    c = csum16(ph, sizeof(ph));
    t[16] = (uint8_t)(c >> 8);
    t[17] = (uint8_t)c;
    return 60;
}

/*
 * A multi-queue TAP (two queue pairs) in a namespace of our own, the host
 * side at 192.0.2.1: pair 0 sends TCP SYNs from 192.0.2.2, pair 1 from
 * 192.0.2.3, to a closed port. Every SYN reaches the kernel through its
 * pair's TAP queue and every RST comes back, on the queue the TAP picks
 * by flow hash: frames cross both ways on both pairs.
 */
VHD_TEST(tap_two_pairs_in_netns)
{
    enum { PAIRS = 2, PINGS = 20 };
    ns_create();
    struct daemon dm;
    char spec[PATH_MAX];
    daemon_prepare(&dm);
    snprintf(spec, sizeof(spec), "socket=%s,backend=tap,tap=vhdmq0,queues=%d", dm.sock, PAIRS);
    const char *args[] = {"--log-level", "warn",  "--workers", "2", "--sandbox",
                          "off",         "--net", spec,        NULL};
    vhostd_start_args(&dm, g_ns, args);

    struct vhd_netdrv *d;
    struct vhd_netdrv_opts o = {.socket_path = dm.sock, .num_pairs = PAIRS, .queue_size = 128};
    d = netdrv_connect_ok(&o, NULL);
    const uint8_t *mac = vhd_netdrv_get_info(d)->mac;
    char macs[32];
    snprintf(macs, sizeof(macs), "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2], mac[3],
             mac[4], mac[5]);
    /* Static neighbours: no ARP, whose replies the TAP could send on either queue. */
    VHD_CHECK_EQ(sh("ip -n %s addr add 192.0.2.1/24 dev vhdmq0 && ip -n %s link set vhdmq0 up && "
                    "ip -n %s neigh replace 192.0.2.2 lladdr %s dev vhdmq0 nud permanent && "
                    "ip -n %s neigh replace 192.0.2.3 lladdr %s dev vhdmq0 nud permanent",
                    g_ns, g_ns, g_ns, macs, g_ns, macs),
                 0);
    uint8_t tapmac[6];
    char path[128], line[64];
    snprintf(path, sizeof(path), "ip netns exec %s cat /sys/class/net/vhdmq0/address", g_ns);
    FILE *pf = popen(path, "r");
    VHD_CHECK(pf != NULL);
    VHD_CHECK(fgets(line, sizeof(line), pf) != NULL);
    pclose(pf);
    VHD_CHECK_EQ(sscanf(line, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &tapmac[0], &tapmac[1], &tapmac[2],
                        &tapmac[3], &tapmac[4], &tapmac[5]),
                 6);

    /*
     * Every SYN (its own source port: its own flow) must be answered; the
     * TAP picks the queue of each RST by the flow's hash, so with 2 * PINGS
     * flows both pairs receive some (all on one: 2^-39).
     */
    uint8_t f[128], got[2048];
    bool answered[PAIRS][PINGS + 1];
    unsigned rst_on[PAIRS] = {0}, nanswered = 0;
    memset(answered, 0, sizeof(answered));
    for (uint16_t k = 1; k <= PINGS; k++) {
        for (uint32_t pi = 0; pi < PAIRS; pi++) {
            uint32_t len = tcp_syn(f, tapmac, mac, (uint8_t)(2 + pi), 1,
                                   (uint16_t)(40000 + 100 * pi + k), 9, 1000u * k);
            struct iovec io = {f, len};
            VHD_CHECK_EQ(vhd_netdrv_tx_burst(vhd_netdrv_get_pair(d, pi), &io, 1), 1);
        }
    }
    uint64_t t0 = ms_now();
    while (nanswered < PAIRS * PINGS && ms_now() - t0 < WAIT_MS) {
        bool any = false;
        for (uint32_t pj = 0; pj < PAIRS; pj++) {
            struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, pj);
            VHD_CHECK(vhd_netdrv_tx_reap(p) >= 0);
            int n = vhd_netdrv_rx_copy(p, got, sizeof(got));
            VHD_CHECK(n >= 0);
            if (n == 0)
                continue;
            any = true;
            const uint8_t *ip = got + 14, *t = got + 34;
            /* RSTs from 192.0.2.1 to .2 / .3; anything else (IPv6 noise) is skipped */
            if (n < 54 || got[12] != 0x08 || got[13] != 0 || ip[9] != 6 || !(t[13] & 0x04) ||
                ip[19] < 2 || ip[19] >= 2 + PAIRS)
                continue;
            uint32_t from = ip[19] - 2u;
            unsigned k = (unsigned)((t[2] << 8 | t[3]) - 40000 - 100 * from);
            if (k < 1 || k > PINGS || answered[from][k])
                continue;
            answered[from][k] = true;
            nanswered++;
            rst_on[pj]++;
        }
        if (!any)
            sleep_ms(1);
    }
    if (nanswered != PAIRS * PINGS)
        fprintf(stderr, "  %u of %u SYNs answered\n", nanswered, PAIRS * PINGS);
    VHD_CHECK_EQ(nanswered, PAIRS * PINGS);
    for (uint32_t pi = 0; pi < PAIRS; pi++) {
        struct vhd_netdrv_pair_stats st;
        vhd_netdrv_pair_stats(vhd_netdrv_get_pair(d, pi), &st);
        if (rst_on[pi] == 0)
            fprintf(stderr, "  no RST arrived on pair %u\n", pi);
        VHD_CHECK(rst_on[pi] > 0);
        VHD_CHECK_EQ(st.tx_packets, PINGS);
        VHD_CHECK(st.rx_packets >= rst_on[pi]);
    }
    /* the kernel's view: PAIRS * PINGS requests in, as many replies out */
    snprintf(path, sizeof(path), "ip netns exec %s cat /sys/class/net/vhdmq0/statistics/rx_packets",
             g_ns);
    pf = popen(path, "r");
    VHD_CHECK(pf != NULL && fgets(line, sizeof(line), pf) != NULL);
    pclose(pf);
    VHD_CHECK(strtoull(line, NULL, 10) >= PAIRS * PINGS);
    vhd_netdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    ns_cleanup();
    test_done();
}

/* ---- segmentation offload through the TAP ---- */

/* A TCP/IPv4 segment 192.0.2.<src>:sport -> 192.0.2.<dst>:dport; returns the frame length. */
struct tcp_seg {
    uint8_t src, dst;
    uint16_t sport, dport;
    uint32_t seq, ack;
    uint8_t flags;   /* TCP flags */
    uint16_t mss;    /* MSS option when non-zero (SYN) */
    uint32_t paylen; /* payload bytes: pattern byte (offset & 0xff) ^ 0x5a */
    bool partial;    /* leave the checksum partial (pseudo header only), for NEEDS_CSUM */
};

static uint32_t sum16(const uint8_t *p, size_t len, uint32_t s)
{
    for (size_t i = 0; i + 1 < len; i += 2)
        s += (uint32_t)p[i] << 8 | p[i + 1];
    if (len & 1)
        s += (uint32_t)p[len - 1] << 8;
    return s;
}

static uint16_t fold16(uint32_t s)
{
    while (s >> 16)
        s = (s & 0xffff) + (s >> 16);
    return (uint16_t)s;
}

static uint32_t tcp_build(uint8_t *f, const uint8_t *dmac, const uint8_t *smac,
                          const struct tcp_seg *g)
{
    uint32_t thl = g->mss ? 24 : 20, iplen = 20 + thl + g->paylen;
    uint32_t flen = 14 + iplen < 60 ? 60 : 14 + iplen;
    memset(f, 0, flen);
    memcpy(f, dmac, 6);
    memcpy(f + 6, smac, 6);
    f[12] = 0x08;
    uint8_t *ip = f + 14, *t = ip + 20;
    ip[0] = 0x45;
    ip[2] = (uint8_t)(iplen >> 8);
    ip[3] = (uint8_t)iplen;
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 6;
    ip[12] = 192, ip[13] = 0, ip[14] = 2, ip[15] = g->src;
    ip[16] = 192, ip[17] = 0, ip[18] = 2, ip[19] = g->dst;
    uint16_t c = (uint16_t)~fold16(sum16(ip, 20, 0));
    ip[10] = (uint8_t)(c >> 8);
    ip[11] = (uint8_t)c;
    t[0] = (uint8_t)(g->sport >> 8), t[1] = (uint8_t)g->sport;
    t[2] = (uint8_t)(g->dport >> 8), t[3] = (uint8_t)g->dport;
    for (int i = 0; i < 4; i++) {
        t[4 + i] = (uint8_t)(g->seq >> (24 - 8 * i));
        t[8 + i] = (uint8_t)(g->ack >> (24 - 8 * i));
    }
    t[12] = (uint8_t)((thl / 4) << 4);
    t[13] = g->flags;
    t[14] = 0xff, t[15] = 0xff; /* window */
    if (g->mss) {
        t[20] = 2, t[21] = 4, t[22] = (uint8_t)(g->mss >> 8), t[23] = (uint8_t)g->mss;
    }
    for (uint32_t i = 0; i < g->paylen; i++)
        t[thl + i] = (uint8_t)((i & 0xff) ^ 0x5a);
    /* pseudo header: addresses, protocol, TCP length */
    uint8_t ph[4] = {0, 6, (uint8_t)((thl + g->paylen) >> 8), (uint8_t)(thl + g->paylen)};
    uint32_t ps = sum16(ip + 12, 8, sum16(ph, 4, 0));
    c = g->partial ? fold16(ps) : (uint16_t)~fold16(sum16(t, thl + g->paylen, ps));
    t[16] = (uint8_t)(c >> 8);
    t[17] = (uint8_t)c;
    return flen;
}

/*
 * The peer in the namespace (a child process): listen on 192.0.2.1:5001,
 * accept one connection, read `want` bytes and check their pattern, then
 * send `back` bytes; report {bytes read, pattern ok} on res_w.
 */
static pid_t tso_peer_start(uint32_t want, uint32_t back, int *res_r)
{
    int ready[2], res[2];
    VHD_CHECK_EQ(pipe(ready), 0);
    VHD_CHECK_EQ(pipe(res), 0);
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        alarm(30);
        char path[96];
        snprintf(path, sizeof(path), "/var/run/netns/%s", g_ns);
        int nsfd = open(path, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) < 0)
            _exit(2);
        int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(5001)};
        a.sin_addr.s_addr = htonl(0xc0000201u);
        if (ls < 0 || setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
            bind(ls, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(ls, 1) < 0)
            _exit(3);
        if (write(ready[1], "r", 1) != 1)
            _exit(4);
        int c = accept(ls, NULL, NULL);
        if (c < 0)
            _exit(5);
        static uint8_t buf[1 << 17];
        uint32_t got = 0, ok = 1;
        while (got < want) {
            ssize_t n = read(c, buf, sizeof(buf));
            if (n <= 0)
                break;
            for (ssize_t i = 0; i < n; i++)
                if (buf[i] != (uint8_t)(((got + (uint32_t)i) & 0xff) ^ 0x5a))
                    ok = 0;
            got += (uint32_t)n;
        }
        uint32_t r[2] = {got, ok};
        if (write(res[1], r, sizeof(r)) != (ssize_t)sizeof(r))
            _exit(6);
        memset(buf, 0xa5, back < sizeof(buf) ? back : sizeof(buf));
        if (back && write(c, buf, back < sizeof(buf) ? back : sizeof(buf)) < 0)
            _exit(7);
        sleep(20); /* keep the connection until the test is done (it kills us) */
        _exit(0);
    }
    close(ready[1]);
    close(res[1]);
    struct pollfd pf = {.fd = ready[0], .events = POLLIN};
    char ch;
    VHD_CHECK_EQ(poll(&pf, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(read(ready[0], &ch, 1), 1);
    close(ready[0]);
    *res_r = res[0];
    return pid;
}

struct gso_seen {
    uint8_t peer_ip;
    uint16_t sport;
    uint32_t gso_frames; /* frames with gso_type TCPV4 and more than one segment's worth */
    uint32_t max_len;
    uint32_t bytes; /* TCP payload bytes from the peer */
    bool synack;
    uint32_t peer_seq;
};

static void gso_cb(void *arg, const struct vhd_netdrv_rxframe *fr)
{
    struct gso_seen *g = arg;
    uint8_t b[128];
    uint32_t off = 0;
    for (unsigned k = 0; k < fr->iovcnt && off < sizeof(b); k++) {
        size_t l = fr->iov[k].iov_len < sizeof(b) - off ? fr->iov[k].iov_len : sizeof(b) - off;
        memcpy(b + off, fr->iov[k].iov_base, l);
        off += (uint32_t)l;
    }
    const uint8_t *ip = b + 14, *t = b + 34;
    if (off < 54 || b[12] != 0x08 || b[13] != 0 || ip[9] != 6 || ip[15] != 1 ||
        (t[2] << 8 | t[3]) != g->sport)
        return;
    if ((t[13] & 0x12) == 0x12) {
        g->synack = true;
        g->peer_seq = (uint32_t)t[4] << 24 | (uint32_t)t[5] << 16 | (uint32_t)t[6] << 8 | t[7];
    }
    uint32_t iplen = (uint32_t)ip[2] << 8 | ip[3], thl = (uint32_t)(t[12] >> 4) * 4;
    if (iplen > 20 + thl)
        g->bytes += iplen - 20 - thl;
    if (fr->gso_type == 1 /* TCPV4 */ && fr->len > 1514)
        g->gso_frames++;
    if (fr->len > g->max_len)
        g->max_len = fr->len;
}

/*
 * One session on the TAP device of dm (in g_ns): connect (with HOST_TSO4
 * and GUEST_TSO4 when tso, checksum offloads only otherwise), open a TCP
 * connection by hand from 192.0.2.2:sport to a socket in the namespace,
 * send the payload (tso: 65000 bytes in one TSO frame, gso_type TCPV4,
 * gso_size 1448, partial checksum; else 1400 bytes in one plain frame),
 * which the socket must read whole and in order, and receive its 30000
 * bytes back: as GSO frames larger than the MTU with tso, as frames of at
 * most 1514 bytes without (the kernel segments for a guest that did not
 * negotiate GUEST_TSO4).
 */
static void tso_session(struct daemon *dm, bool tso, uint16_t sport, bool first)
{
    enum { BACK = 30000 };
    const uint32_t payload = tso ? 65000 : 1400;
    const uint64_t csum = (1ull << VIRTIO_NET_F_CSUM) | (1ull << VIRTIO_NET_F_GUEST_CSUM);
    const uint64_t want =
        csum | (tso ? (1ull << VIRTIO_NET_F_HOST_TSO4) | (1ull << VIRTIO_NET_F_GUEST_TSO4) : 0);
    struct vhd_netdrv_opts o = {.socket_path = dm->sock,
                                .queue_size = 256,
                                .mrg_rxbuf = true,
                                .max_tx_frame = 65536 + 14 + 4,
                                .offloads = want};
    struct vhd_netdrv *d;
    d = netdrv_connect_ok(&o, NULL);
    VHD_CHECK_EQ(vhd_netdrv_get_info(d)->features & want, want);
    if (!tso)
        VHD_CHECK(!(vhd_netdrv_get_info(d)->features & (1ull << VIRTIO_NET_F_GUEST_TSO4)));
    struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, 0);
    const uint8_t *mac = vhd_netdrv_get_info(d)->mac;
    if (first) {
        char macs[32];
        snprintf(macs, sizeof(macs), "%02x:%02x:%02x:%02x:%02x:%02x", mac[0], mac[1], mac[2],
                 mac[3], mac[4], mac[5]);
        VHD_CHECK_EQ(sh("ip -n %s addr add 192.0.2.1/24 dev vhdtso0 && "
                        "ip -n %s link set vhdtso0 up && "
                        "ip -n %s neigh replace 192.0.2.2 lladdr %s dev vhdtso0 nud permanent",
                        g_ns, g_ns, g_ns, macs),
                     0);
    }
    uint8_t tapmac[6];
    char cmd[128], line[64];
    snprintf(cmd, sizeof(cmd), "ip netns exec %s cat /sys/class/net/vhdtso0/address", g_ns);
    FILE *pf = popen(cmd, "r");
    VHD_CHECK(pf != NULL && fgets(line, sizeof(line), pf) != NULL);
    pclose(pf);
    VHD_CHECK_EQ(sscanf(line, "%hhx:%hhx:%hhx:%hhx:%hhx:%hhx", &tapmac[0], &tapmac[1], &tapmac[2],
                        &tapmac[3], &tapmac[4], &tapmac[5]),
                 6);
    int res_fd;
    pid_t peer = tso_peer_start(payload, BACK, &res_fd);

    static uint8_t f[65536 + 18];
    static const uint8_t zero_hdr[12];
    struct gso_seen seen = {.peer_ip = 1, .sport = sport};
    struct tcp_seg g = {
        .src = 2, .dst = 1, .sport = sport, .dport = 5001, .seq = 1000, .flags = 0x02, .mss = 1460};
    struct iovec io = {f, tcp_build(f, tapmac, mac, &g)};
    VHD_CHECK_EQ(vhd_netdrv_tx_hdr(p, &io, zero_hdr), 1);
    uint64_t t0 = ms_now();
    while (!seen.synack && ms_now() - t0 < WAIT_MS) {
        VHD_CHECK(vhd_netdrv_rx_burst(p, gso_cb, &seen, 32) >= 0);
        VHD_CHECK(vhd_netdrv_tx_reap(p) >= 0);
        sleep_ms(1);
    }
    VHD_CHECK(seen.synack);
    /* ACK, then the payload: one TSO frame, or one plain frame */
    g = (struct tcp_seg){.src = 2,
                         .dst = 1,
                         .sport = sport,
                         .dport = 5001,
                         .seq = 1001,
                         .ack = seen.peer_seq + 1,
                         .flags = 0x10};
    io.iov_len = tcp_build(f, tapmac, mac, &g);
    VHD_CHECK_EQ(vhd_netdrv_tx_hdr(p, &io, zero_hdr), 1);
    g.flags = 0x18; /* ACK, PSH */
    g.paylen = payload;
    g.partial = tso;
    io.iov_len = tcp_build(f, tapmac, mac, &g);
    VHD_CHECK_EQ(io.iov_len, 14 + 40 + payload);
    uint8_t hdr[12] = {0};
    if (tso) {
        hdr[0] = 1;                               /* NEEDS_CSUM */
        hdr[1] = 1;                               /* GSO TCPV4 */
        hdr[2] = 54;                              /* hdr_len */
        hdr[4] = 1448 & 0xff, hdr[5] = 1448 >> 8; /* gso_size */
        hdr[6] = 34;                              /* csum_start: the TCP header */
        hdr[8] = 16;                              /* csum_offset: its checksum field */
    }
    int rc;
    while ((rc = vhd_netdrv_tx_hdr(p, &io, hdr)) == 0 && ms_now() - t0 < 2 * WAIT_MS)
        sleep_ms(1);
    VHD_CHECK_EQ(rc, 1);

    /* the peer read everything, in order; meanwhile its answer arrives */
    uint32_t r[2] = {0, 0};
    bool have_res = false;
    t0 = ms_now();
    while ((!have_res || (tso ? seen.gso_frames == 0 : seen.bytes < 4 * 1460)) &&
           ms_now() - t0 < 2 * WAIT_MS) {
        VHD_CHECK(vhd_netdrv_rx_burst(p, gso_cb, &seen, 32) >= 0);
        VHD_CHECK(vhd_netdrv_tx_reap(p) >= 0);
        struct pollfd rp = {.fd = res_fd, .events = POLLIN};
        if (!have_res && poll(&rp, 1, 1) == 1) {
            VHD_CHECK_EQ(read(res_fd, r, sizeof(r)), (ssize_t)sizeof(r));
            have_res = true;
        }
    }
    kill(peer, SIGKILL);
    waitpid(peer, NULL, 0);
    close(res_fd);
    fprintf(stderr,
            "  %s: peer read %u bytes (pattern %s); %u bytes back, %u GSO frames, largest %u\n",
            tso ? "TSO" : "no TSO", r[0], r[1] ? "ok" : "wrong", seen.bytes, seen.gso_frames,
            seen.max_len);
    VHD_CHECK(have_res);
    VHD_CHECK_EQ(r[0], payload);
    VHD_CHECK(r[1]);
    if (tso) {
        VHD_CHECK(seen.gso_frames > 0);
    } else {
        VHD_CHECK(seen.bytes >= 4 * 1460);
        VHD_CHECK_EQ(seen.gso_frames, 0);
        VHD_CHECK(seen.max_len <= 1514);
    }
    vhd_netdrv_disconnect(d);
}

/*
 * Segmentation offload through a TAP in a namespace of our own (the TAP
 * offers HOST_/GUEST_TSO4 when the kernel takes TUN_F_TSO4): a session
 * with TSO both ways, then one without on the same device, whose driver
 * must never see a GSO frame although the previous guest asked for them.
 */
VHD_TEST(tap_tso_both_ways)
{
    ns_create();
    struct daemon dm;
    char spec[PATH_MAX];
    daemon_prepare(&dm);
    snprintf(spec, sizeof(spec), "socket=%s,backend=tap,tap=vhdtso0", dm.sock);
    const char *args[] = {"--log-level", "warn", "--net", spec, NULL};
    vhostd_start_args(&dm, g_ns, args);
    tso_session(&dm, true, 45000, true);
    tso_session(&dm, false, 45001, false);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    ns_cleanup();
    test_done();
}
