/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd-bench net, the packet-rate run: one thread per queue pair of libvhostd's virtio-net
 * driver. tx: send frames as fast as the ring takes them, count TX
 * completions (the back-end's dequeue rate). rx: keep receive buffers
 * posted and count what arrives (a back-end that generates traffic). echo:
 * send and receive, count frames that came back (a loopback back-end's
 * round trips); at most queue-size frames in flight, so the back-end never
 * runs out of receive buffers because of us.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "bench.h"
#include "bench_report.h"
#include "util/clock.h"
#include "vhostd/net_driver.h"

/*
 * One pair's thread. live.done is the mode's count, read by the progress loop
 * (relaxed atomics): TX completions (tx) or frames received (rx, echo).
 */
struct net_job {
    struct bench_live live;
    const struct net_opts *o;
    struct vhd_netdrv_pair *p;
    unsigned index;
    uint64_t sent; /* frames queued on TX */
    int error;
    struct vhd_netdrv_pair_stats st;
} __attribute__((aligned(64)));

static void net_count(void *arg, const struct vhd_netdrv_rxframe *f)
{
    (void)f;
    (*(uint64_t *)arg)++;
}

static void *net_job_main(void *arg)
{
    struct net_job *j = arg;
    const struct net_opts *o = j->o;
    uint8_t *frame = calloc(1, o->size);
    struct iovec iov[NET_MAX_BURST];

    if (!frame) {
        j->error = -ENOMEM;
        __atomic_store_n(&j->live.finished, 1, __ATOMIC_RELEASE);
        return NULL;
    }
    /* Broadcast destination, locally administered source, IPv4 ethertype; zero payload. */
    memset(frame, 0xff, 6);
    if (o->size >= 14) {
        static const uint8_t src[6] = {0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
        memcpy(frame + 6, src, 6);
        frame[11] = (uint8_t)j->index;
        frame[12] = 0x08;
    }
    for (unsigned k = 0; k < o->burst; k++)
        iov[k] = (struct iovec){frame, o->size};

    uint64_t received = 0, sent = 0, window = o->queue_size;
    uint64_t t0 = vhd_now_ns(), deadline = t0 + (uint64_t)(o->runtime * 1e9);
    j->live.t_start = t0;
    for (uint64_t it = 0;; it++) {
        if ((it & 63) == 0 && (vhd_now_ns() >= deadline || bench_stopping()))
            break;
        bool progress = false;
        if (o->mode != NET_RX) {
            unsigned n = o->burst;
            if (o->mode == NET_ECHO) {
                uint64_t room = window - (sent - received);
                n = room < n ? (unsigned)room : n;
            }
            int rc = n ? vhd_netdrv_tx_burst(j->p, iov, n) : 0;
            if (rc < 0) {
                j->error = rc;
                break;
            }
            sent += (unsigned)rc;
            progress |= rc > 0;
        }
        if (o->mode == NET_TX) {
            int rc = vhd_netdrv_tx_reap(j->p);
            if (rc < 0) {
                j->error = rc;
                break;
            }
            progress |= rc > 0;
            struct vhd_netdrv_pair_stats s;
            vhd_netdrv_pair_stats(j->p, &s);
            __atomic_store_n(&j->live.done, s.tx_done, __ATOMIC_RELAXED);
        } else {
            int rc = vhd_netdrv_rx_burst(j->p, net_count, &received, o->burst);
            if (rc < 0) {
                j->error = rc;
                break;
            }
            progress |= rc > 0;
            __atomic_store_n(&j->live.done, received, __ATOMIC_RELAXED);
        }
        __atomic_store_n(&j->sent, sent, __ATOMIC_RELAXED);
        if (!progress && o->interrupt && vhd_netdrv_wait(j->p, 100) < 0) {
            j->error = -EIO;
            break;
        }
    }
    j->live.t_end = vhd_now_ns();
    vhd_netdrv_pair_stats(j->p, &j->st);
    free(frame);
    __atomic_store_n(&j->live.finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

int bench_net_main(int argc, char **argv)
{
    struct net_opts o;
    char err[256];
    int status = 0;

    if (bench_net_parse_opts(argc, argv, &o) < 0)
        return 2;
    struct vhd_netdrv_opts d_o = {
        .socket_path = o.socket,
        .num_pairs = o.pairs,
        .queue_size = o.queue_size,
        .packed = o.packed,
        .mrg_rxbuf = o.mrg,
        .no_in_order = o.no_in_order,
        .max_tx_frame = o.size,
        .iommu_page_size = o.iommu_page,
        .iommu_strict = o.iommu_strict,
        .iommu_batch = o.iommu_batch,
        .iommu_exact_perms = o.iommu_exact,
        .iommu_static = o.iommu_static,
        /* Without merging, each receive buffer must hold a whole frame. */
        .rx_buf_size =
            o.mrg ? 2048
                  : (o.size + VHD_NETDRV_HDR_LEN > 2048 ? o.size + VHD_NETDRV_HDR_LEN : 2048),
    };
    struct vhd_netdrv *d;
    int rc = vhd_netdrv_connect(&d_o, &d, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "vhostd-bench net: %s: %s\n", o.socket, err);
        return 1;
    }
    const struct vhd_netdrv_info *in = vhd_netdrv_get_info(d);
    struct net_job *jobs = aligned_alloc(64, sizeof(struct net_job) * o.pairs);
    if (!jobs) {
        fprintf(stderr, "vhostd-bench net: out of memory\n");
        vhd_netdrv_disconnect(d);
        return 1;
    }
    memset(jobs, 0, sizeof(struct net_job) * o.pairs);
    for (unsigned i = 0; i < o.pairs; i++) {
        jobs[i].o = &o;
        jobs[i].index = i;
        jobs[i].p = vhd_netdrv_get_pair(d, i);
    }
    if (!o.json)
        printf("vhostd-bench net: %s mode=%s size=%u pairs=%u ring=%s mrg_rxbuf=%s queue-size=%u "
               "burst=%u completion=%s event_idx=%s in_order=%s\n",
               o.socket, net_mode_names[o.mode], o.size, o.pairs, in->packed ? "packed" : "split",
               in->mrg_rxbuf ? "on" : "off", in->queue_size, o.burst,
               o.interrupt ? "interrupt" : "poll", in->event_idx ? "on" : "off",
               in->in_order ? "on" : "off");

    struct bench_reporter r = {
        .prog = "vhostd-bench net",
        .jobs = jobs,
        .stride = sizeof(*jobs),
        .n = o.pairs,
        .job_main = net_job_main,
        .rate_unit = {"Mpps", "Gbit/s"},
        .rate_width = {8, 8},
        .rate_prec = {3, 3},
        .rate_scale = {1e-6, o.size * 8 / 1e9},
    };
    status = bench_run(&r);
    unsigned started = r.started;

    uint64_t tot_pk = 0, tot_sent = 0;
    for (unsigned i = 0; i < started; i++) {
        tot_pk += jobs[i].live.done;
        tot_sent += jobs[i].sent;
    }
    double secs = bench_span(&r);
    double mpps = secs > 0 ? (double)tot_pk / secs / 1e6 : 0;
    double gbps = mpps * o.size * 8 / 1e3;
    if (o.json) {
        bench_json_open(o.socket);
        printf(", \"mode\": \"%s\", \"size\": %u, \"pairs\": %u, \"ring\": \"%s\", "
               "\"mrg_rxbuf\": %s, \"event_idx\": %s, \"in_order\": %s, \"queue_size\": %u, "
               "\"burst\": %u, \"completion\": \"%s\",\n \"pairs_detail\": [",
               net_mode_names[o.mode], o.size, o.pairs, in->packed ? "packed" : "split",
               in->mrg_rxbuf ? "true" : "false", in->event_idx ? "true" : "false",
               in->in_order ? "true" : "false", in->queue_size, o.burst,
               o.interrupt ? "interrupt" : "poll");
        for (unsigned i = 0; i < started; i++) {
            const struct net_job *j = &jobs[i];
            double s = (double)(j->live.t_end - j->live.t_start) / 1e9;
            printf("%s\n  {\"pair\": %u, \"packets\": %" PRIu64 ", \"sent\": %" PRIu64
                   ", \"runtime_s\": %.6f, \"mpps\": %.4f, \"tx_done\": %" PRIu64
                   ", \"rx_packets\": %" PRIu64 ", \"rx_errors\": %" PRIu64 ", \"kicks\": %" PRIu64
                   ", \"sleeps\": %" PRIu64 ", \"error\": %d}",
                   i ? "," : "", i, j->live.done, j->sent, s,
                   s > 0 ? (double)j->live.done / s / 1e6 : 0.0, j->st.tx_done, j->st.rx_packets,
                   j->st.rx_errors, j->st.kicks, j->st.sleeps, j->error);
        }
        printf("],\n \"total\": {\"packets\": %" PRIu64 ", \"sent\": %" PRIu64
               ", \"runtime_s\": %.6f, \"mpps\": %.4f, \"gbps\": %.4f}}\n",
               tot_pk, tot_sent, secs, mpps, gbps);
    } else {
        printf("%-6s %12s %12s %9s %9s %12s\n", "pair", "packets", "sent", "Mpps", "Gbit/s",
               "kicks/frame");
        for (unsigned i = 0; i < started; i++) {
            const struct net_job *j = &jobs[i];
            double s = (double)(j->live.t_end - j->live.t_start) / 1e9;
            double m = s > 0 ? (double)j->live.done / s / 1e6 : 0;
            printf("%-6u %12" PRIu64 " %12" PRIu64 " %9.3f %9.3f %12.4f\n", i, j->live.done,
                   j->sent, m, m * o.size * 8 / 1e3,
                   (double)j->st.kicks /
                       (double)(j->sent + j->st.rx_packets ? j->sent + j->st.rx_packets : 1));
        }
        printf("total  %12" PRIu64 " %12" PRIu64 " %9.3f %9.3f   (%s, %.2f s)\n", tot_pk, tot_sent,
               mpps, gbps, o.mode == NET_TX ? "TX completions" : "frames received", secs);
        if (o.mode == NET_RX && tot_pk == 0)
            printf("note: nothing arrived; a loopback back-end only returns what is sent "
                   "(use --mode=echo)\n");
    }
    for (unsigned i = 0; i < started; i++) {
        if (jobs[i].error) {
            fprintf(stderr, "vhostd-bench net: pair %u: %s\n", i, strerror(-jobs[i].error));
            status = 1;
        }
    }
    struct vhd_netdrv_iommu_stats is;
    if (!o.json && vhd_netdrv_iommu_stats(d, &is) == 0)
        printf("iommu  updates %" PRIu64 " invalidates %" PRIu64 " misses %" PRIu64
               " (unmapped %" PRIu64 ") mapped %" PRIu64 "\n",
               is.updates, is.invalidates, is.misses, is.misses_bad, is.mapped);
    free(jobs);
    vhd_netdrv_disconnect(d);
    return status;
}
