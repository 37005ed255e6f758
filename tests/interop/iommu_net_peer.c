/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * iommu-net-peer: libvhostd's virtio-net driver acting as the IOMMU against a
 * back-end that loops frames back (DPDK testpmd's vhost PMD with
 * iommu-support=1 in io forwarding, tests/interop/testpmd-iommu.sh). Sends
 * numbered frames with a per-frame pattern, receives them back, checks every
 * byte and that each came back once, then checks the IOTLB traffic the style
 * implies (strict: one INVALIDATE per unmapped buffer; lazy: batched).
 *
 * usage: iommu-net-peer SOCKET [--page BYTES] [--strict] [--batch N]
 *                              [--frames N] [--packed] [--expect-unsupported]
 *                              [--announce] [--static]
 * --announce (a back-end with a control queue, such as vhostd): SEND_RARP,
 * then the config change notification, which the driver's miss thread
 * passes on, must arrive with VIRTIO_NET_S_ANNOUNCE, and the ack clear it.
 * Exit 0 on success; the reason of a failure on stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vhostd/net_driver.h"

#define FRAME_LEN 200u
#define WINDOW    64u /* frames in flight: well under the 256 receive buffers */
#define PROBE_SEQ 0xffffffffu

static void make_frame(uint8_t *f, uint32_t seq)
{
    static const uint8_t dst[6] = {0x02, 0, 0, 0, 0, 0x01}, src[6] = {0x02, 0, 0, 0, 0, 0x02};
    memcpy(f, dst, 6);
    memcpy(f + 6, src, 6);
    f[12] = 0x88; /* local experimental ethertype */
    f[13] = 0xb5;
    memcpy(f + 14, &seq, sizeof(seq));
    for (uint32_t i = 18; i < FRAME_LEN; i++)
        f[i] = (uint8_t)(seq * 7 + i);
}

int main(int argc, char **argv)
{
    /*
     * Mergeable receive buffers: DPDK's vhost writes num_buffers only with
     * them (without, it leaves the field as it was, which the driver drops as
     * malformed: virtio 1.2 5.1.6.4 wants 1 there).
     */
    struct vhd_netdrv_opts o = {.iommu_page_size = 4096, .timeout_ms = 10000, .mrg_rxbuf = true};
    uint32_t frames = 2000;
    int expect_unsupported = 0, announce = 0;
    char err[256];

    if (argc < 2) {
        fprintf(stderr,
                "usage: %s SOCKET [--page BYTES] [--strict] [--batch N] [--frames N] "
                "[--packed] [--expect-unsupported]\n",
                argv[0]);
        return 2;
    }
    o.socket_path = argv[1];
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--page") && i + 1 < argc)
            o.iommu_page_size = strtoull(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--strict"))
            o.iommu_strict = true;
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            o.iommu_batch = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--frames") && i + 1 < argc)
            frames = (uint32_t)strtoul(argv[++i], NULL, 0);
        else if (!strcmp(argv[i], "--packed"))
            o.packed = true;
        else if (!strcmp(argv[i], "--expect-unsupported"))
            expect_unsupported = 1;
        else if (!strcmp(argv[i], "--static"))
            o.iommu_static = true;
        else if (!strcmp(argv[i], "--announce"))
            announce = 1, o.ctrl_vq = true;
        else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }

    struct vhd_netdrv *d;
    int rc = vhd_netdrv_connect(&o, &d, err, sizeof(err));
    if (expect_unsupported) {
        if (rc == 0) {
            fprintf(stderr, "FAIL: connected with the IOMMU to a back-end without it\n");
            vhd_netdrv_disconnect(d);
            return 1;
        }
        if (rc != -ENOTSUP || !strstr(err, "ACCESS_PLATFORM")) {
            fprintf(stderr, "FAIL: connect: %s (%d), expected -ENOTSUP naming ACCESS_PLATFORM\n",
                    err, rc);
            return 1;
        }
        printf("refused as expected: %s\n", err);
        return 0;
    }
    if (rc < 0) {
        fprintf(stderr, "FAIL: connect: %s\n", err);
        return 1;
    }
    const struct vhd_netdrv_info *in = vhd_netdrv_get_info(d);
    if (!(in->features & (1ull << 33)) || in->iommu_page_size != o.iommu_page_size) {
        fprintf(stderr, "FAIL: ACCESS_PLATFORM not negotiated\n");
        vhd_netdrv_disconnect(d);
        return 1;
    }
    struct vhd_netdrv_pair *p = vhd_netdrv_get_pair(d, 0);
    uint8_t *seen = calloc(frames, 1);
    uint8_t f[FRAME_LEN], got[2048];

    /*
     * Warm-up: testpmd drops what it cannot forward until its vhost port is
     * up (its new_device callback runs after the last ring is translated,
     * asynchronously to our connect). Probe frames until one comes back;
     * from then on no frame may be lost.
     */
    int warm = 0;
    for (int t = 0; t < 500 && !warm; t++) {
        make_frame(f, PROBE_SEQ);
        struct iovec v = {f, FRAME_LEN};
        if (vhd_netdrv_tx_burst(p, &v, 1) < 0)
            break;
        (void)vhd_netdrv_wait(p, 10);
        while ((rc = vhd_netdrv_rx_copy(p, got, sizeof(got))) > 0) {
            uint32_t seq;
            memcpy(&seq, got + 14, sizeof(seq));
            warm |= seq == PROBE_SEQ;
        }
        (void)vhd_netdrv_tx_reap(p);
    }
    if (!warm) {
        fprintf(stderr, "FAIL: no probe frame came back within 5 s\n");
        vhd_netdrv_disconnect(d);
        free(seen);
        return 1;
    }
    uint32_t sent = 0, recvd = 0, bad = 0;
    int idle = 0;
    while (recvd < frames && idle < 20000) {
        int progress = 0;
        while (sent < frames && sent - recvd < WINDOW) {
            make_frame(f, sent);
            struct iovec v = {f, FRAME_LEN};
            rc = vhd_netdrv_tx_burst(p, &v, 1);
            if (rc < 0) {
                fprintf(stderr, "FAIL: tx_burst: %d\n", rc);
                goto out;
            }
            if (rc == 0)
                break;
            sent++;
            progress = 1;
        }
        for (;;) {
            rc = vhd_netdrv_rx_copy(p, got, sizeof(got));
            if (rc < 0) {
                fprintf(stderr, "FAIL: rx_copy: %d\n", rc);
                goto out;
            }
            if (rc == 0)
                break;
            progress = 1;
            uint32_t seq;
            memcpy(&seq, got + 14, sizeof(seq));
            if (seq == PROBE_SEQ)
                continue; /* a late warm-up probe */
            if (rc != (int)FRAME_LEN || seq >= frames || seen[seq]) {
                bad++;
                continue;
            }
            make_frame(f, seq);
            if (memcmp(f, got, FRAME_LEN)) {
                bad++;
                continue;
            }
            seen[seq] = 1;
            recvd++;
        }
        (void)vhd_netdrv_tx_reap(p);
        if (progress)
            idle = 0;
        else if (vhd_netdrv_wait(p, 1) >= 0)
            idle++;
    }
    rc = 0;
    if (announce) {
        /* VIRTIO_NET_S_ANNOUNCE (2), VIRTIO_NET_CTRL_ANNOUNCE (3) / _ACK (0), virtio 1.2 5.1.6.5.4
         */
        int w = in->config_notify ? vhd_netdrv_send_rarp(d, in->mac) : -ENOTSUP;
        if (w == 0)
            w = vhd_netdrv_config_wait(d, 5000);
        if (w != 1 || !(in->status & 2)) {
            fprintf(stderr, "FAIL: announce: no config change with ANNOUNCE (%d, status 0x%x)\n", w,
                    in->status);
            rc = -1;
        } else if (vhd_netdrv_ctrl(d, 3, 0, NULL, 0) < 0 || vhd_netdrv_read_config(d) < 0 ||
                   (in->status & 2)) {
            fprintf(stderr, "FAIL: announce: the ack did not clear ANNOUNCE\n");
            rc = -1;
        } else {
            printf("announce: notified through the miss thread, acked\n");
        }
    }
out:;
    struct vhd_netdrv_iommu_stats st;
    int src = vhd_netdrv_iommu_stats(d, &st);
    struct vhd_netdrv_pair_stats ps;
    vhd_netdrv_pair_stats(p, &ps);
    printf("frames sent %u received %u bad %u rx_errors %llu; IOTLB updates %llu invalidates %llu "
           "misses %llu "
           "(unmapped %llu) mapped %llu\n",
           sent, recvd, bad, (unsigned long long)ps.rx_errors, (unsigned long long)st.updates,
           (unsigned long long)st.invalidates, (unsigned long long)st.misses,
           (unsigned long long)st.misses_bad, (unsigned long long)st.mapped);
    int ok = rc == 0 && src == 0 && recvd == frames && bad == 0;
    if (!ok)
        fprintf(stderr, "FAIL: %u of %u frames came back intact (%u bad)\n", recvd, frames, bad);
    /*
     * Every buffer the device used was unmapped: its TX slot and its receive
     * buffer. Strict: one INVALIDATE each. Lazy: batches, IOVA-adjacent
     * ranges in one message, so clearly fewer.
     */
    uint64_t unmaps = ps.tx_done + ps.rx_buffers;
    if (o.iommu_static) {
        /* Static pools: a fixed set of per-page UPDATEs at connect, nothing per frame. */
        if (ok && (st.invalidates != 0 || st.updates == 0 || st.updates >= unmaps)) {
            fprintf(stderr, "FAIL: static: %llu UPDATEs, %llu INVALIDATEs for %llu buffers\n",
                    (unsigned long long)st.updates, (unsigned long long)st.invalidates,
                    (unsigned long long)unmaps);
            ok = 0;
        }
        unmaps = 0; /* the checks below are for per-buffer mappings */
    }
    if (ok && o.iommu_strict && st.invalidates < unmaps) {
        fprintf(stderr, "FAIL: strict: %llu INVALIDATEs for %llu unmaps\n",
                (unsigned long long)st.invalidates, (unsigned long long)unmaps);
        ok = 0;
    }
    if (ok && unmaps && !o.iommu_strict && (st.invalidates == 0 || st.invalidates >= unmaps)) {
        fprintf(stderr, "FAIL: lazy: %llu INVALIDATEs for %llu unmaps\n",
                (unsigned long long)st.invalidates, (unsigned long long)unmaps);
        ok = 0;
    }
    if (ok && st.updates < unmaps) {
        fprintf(stderr, "FAIL: %llu UPDATEs for %llu buffers used\n",
                (unsigned long long)st.updates, (unsigned long long)unmaps);
        ok = 0;
    }
    free(seen);
    vhd_netdrv_disconnect(d);
    if (ok)
        printf("OK\n");
    return ok ? 0 : 1;
}
