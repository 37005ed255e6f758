/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vq-bench: in-process driver <-> device ring loop over memfd guest memory.
 * Each round the driver adds `batch` requests (one readable 16-byte header
 * and one writable 1-byte status, like a small virtio-blk request), publishes
 * them, the device pops and pushes each one, flushes once and asks whether to
 * notify, and the driver collects them. Reports ns per request; run it under
 * `valgrind --tool=callgrind` with a small --requests for instructions per
 * request (repeatable on a noisy machine).
 *
 * --inflight tracks the queue in an inflight area (vhost-user
 * INFLIGHT_SHMFD: a record per pop, cleared after each flush), to measure
 * what crash-safe resubmission costs per request.
 *
 * Usage: vq-bench [--requests N] [--layout split|packed|both] [--batch B]...
 *                 [--indirect] [--size QSIZE] [--inflight] [--single]
 *
 * The device pops each round's requests as one run (vhd_vq_pop_burst) and
 * pushes them with vhd_vq_push_burst; --single pops and pushes them one by
 * one (vhd_vq_pop / vhd_vq_push), the per-chain verbs.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/mem.h"
#include "core/vq.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "util/clock.h"

struct bench {
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    struct vhd_drv_vq dq;
    struct vhd_vq vq;
    uint64_t hdr_gpa; /* per-id 16-byte headers */
    uint64_t st_gpa;  /* per-id status bytes */
    void *inflight;   /* --inflight: the queue's region, or NULL */
};

static int setup(struct bench *b, uint32_t qsize, bool packed, bool indirect, bool inflight)
{
    struct vhd_mem_region_desc d[1];
    int rc = vhd_guestmem_init(&b->gm, 1, 64ull << 20, 0x100000, 0);
    if (rc < 0)
        return rc;
    vhd_guestmem_descs(&b->gm, d);
    rc = vhd_mem_new(d, 1, &b->mem);
    if (rc < 0)
        return rc;
    uint32_t max_ind = indirect ? 4 : 0;
    size_t area = vhd_drv_vq_area_size(qsize, packed, max_ind);
    void *hva;
    uint64_t gpa = vhd_guestmem_alloc(&b->gm, area, 4096, &hva);
    if (gpa == UINT64_MAX)
        return -ENOMEM;
    struct vhd_drv_vq_params dp = {.size = qsize,
                                   .packed = packed,
                                   .event_idx = true,
                                   .max_indirect = max_ind,
                                   .area = hva,
                                   .area_gpa = gpa,
                                   .area_len = area};
    rc = vhd_drv_vq_init(&b->dq, &dp);
    if (rc < 0)
        return rc;
    struct vhd_vq_params vp = {.size = qsize,
                               .packed = packed,
                               .event_idx = true,
                               .indirect = indirect,
                               .addr_is_gpa = true,
                               .desc = b->dq.desc_gpa,
                               .avail = b->dq.avail_gpa,
                               .used = b->dq.used_gpa};
    rc = vhd_vq_init(&b->vq, &vp, b->mem);
    if (rc < 0)
        return rc;
    if (inflight) {
        size_t len = vhd_inflight_queue_size(packed, qsize);
        b->inflight = aligned_alloc(64, len);
        if (!b->inflight)
            return -ENOMEM;
        memset(b->inflight, 0, len);
        /* Packed: a ring position as a front-end sends it (both wrap counters 1). */
        if (packed)
            (void)vhd_vq_set_base(&b->vq, 1u << 15 | 1u << 31);
        rc = vhd_vq_set_inflight(&b->vq, b->inflight, qsize);
        if (rc < 0)
            return rc;
    }
    rc = vhd_vq_start(&b->vq);
    if (rc < 0)
        return rc;
    b->hdr_gpa = vhd_guestmem_alloc(&b->gm, 16ull * qsize, 64, NULL);
    b->st_gpa = vhd_guestmem_alloc(&b->gm, qsize, 64, NULL);
    return (b->hdr_gpa == UINT64_MAX || b->st_gpa == UINT64_MAX) ? -ENOMEM : 0;
}

static void teardown(struct bench *b)
{
    vhd_vq_fini(&b->vq);
    free(b->inflight);
    vhd_drv_vq_fini(&b->dq);
    vhd_mem_free(b->mem);
    vhd_guestmem_fini(&b->gm);
}

/* Returns ns per request, or a negative value on an engine error. */
static double run(struct bench *b, uint64_t requests, uint32_t batch, bool indirect, bool single)
{
    struct iovec iov[8], biov[64 * 4];
    struct vhd_vq_chain c[64];
    uint32_t written[64];
    uint64_t done = 0, notifies = 0;

    double t0 = (double)vhd_now_ns();
    while (done < requests) {
        for (uint32_t i = 0; i < batch; i++) {
            struct vhd_drv_buf bufs[2] = {{b->hdr_gpa + 16ull * i, 16}, {b->st_gpa + i, 1}};
            if (vhd_drv_vq_add(&b->dq, bufs, 1, 1, indirect, (void *)(uintptr_t)(i + 1)) < 0)
                return -1;
        }
        vhd_drv_vq_publish(&b->dq);
        (void)vhd_drv_vq_kick_needed(&b->dq);
        if (single) {
            for (uint32_t i = 0; i < batch; i++) {
                int rc = vhd_vq_pop(&b->vq, iov, 8, &c[i]);
                if (rc != 1)
                    return -2;
                /* "complete" the request: write the status byte */
                *(uint8_t *)iov[c[i].nr].iov_base = 0;
            }
            for (uint32_t i = 0; i < batch; i++)
                if (vhd_vq_push(&b->vq, &c[i], 1) < 0)
                    return -3;
        } else {
            /* One run (the whole batch is published). */
            int rc = vhd_vq_pop_burst(&b->vq, biov, 4, c, batch);
            if (rc != (int)batch)
                return -2;
            for (uint32_t i = 0; i < batch; i++) {
                *(uint8_t *)biov[4 * i + c[i].nr].iov_base = 0;
                written[i] = 1;
            }
            if (vhd_vq_push_burst(&b->vq, c, written, batch) < 0)
                return -3;
        }
        vhd_vq_flush(&b->vq);
        notifies += vhd_vq_need_notify(&b->vq);
        for (uint32_t i = 0; i < batch; i++) {
            void *cookie;
            uint32_t len;
            if (vhd_drv_vq_get_used(&b->dq, &cookie, &len) != 1)
                return -4;
        }
        done += batch;
    }
    double t1 = (double)vhd_now_ns();
    (void)notifies;
    return (t1 - t0) / (double)done;
}

int main(int argc, char **argv)
{
    uint64_t requests = 2000000;
    uint32_t batches[8] = {1, 16, 64};
    int nbatches = 3, user_batches = 0;
    int layouts = 3; /* bit 0 split, bit 1 packed */
    bool indirect = false, inflight = false, single = false;
    uint32_t qsize = 256;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--requests") && i + 1 < argc) {
            requests = strtoull(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--batch") && i + 1 < argc) {
            if (!user_batches)
                nbatches = 0;
            user_batches = 1;
            if (nbatches < 8)
                batches[nbatches++] = (uint32_t)strtoul(argv[++i], NULL, 0);
        } else if (!strcmp(argv[i], "--layout") && i + 1 < argc) {
            i++;
            layouts = !strcmp(argv[i], "split") ? 1 : !strcmp(argv[i], "packed") ? 2 : 3;
        } else if (!strcmp(argv[i], "--indirect")) {
            indirect = true;
        } else if (!strcmp(argv[i], "--inflight")) {
            inflight = true;
        } else if (!strcmp(argv[i], "--single")) {
            single = true;
        } else if (!strcmp(argv[i], "--size") && i + 1 < argc) {
            qsize = (uint32_t)strtoul(argv[++i], NULL, 0);
        } else {
            fprintf(stderr,
                    "usage: %s [--requests N] [--layout split|packed|both] [--batch B]... "
                    "[--indirect] [--size QSIZE] [--inflight] [--single]\n",
                    argv[0]);
            return 2;
        }
    }
    printf("%-8s %-6s %-9s %-9s %12s\n", "layout", "batch", "indirect", "inflight", "ns/request");
    for (int l = 0; l < 2; l++) {
        if (!(layouts & (1 << l)))
            continue;
        for (int bi = 0; bi < nbatches; bi++) {
            uint32_t batch = batches[bi];
            if (batch == 0 || batch > 64 || batch > qsize) {
                fprintf(stderr, "batch must be 1..64 and <= queue size\n");
                return 2;
            }
            struct bench b;
            memset(&b, 0, sizeof(b));
            int rc = setup(&b, qsize, l == 1, indirect, inflight);
            if (rc < 0) {
                fprintf(stderr, "setup failed: %s\n", strerror(-rc));
                return 1;
            }
            double ns = run(&b, requests, batch, indirect, single);
            if (ns < 0) {
                fprintf(stderr, "engine error %.0f (vq error: %s)\n", ns,
                        vhd_vq_strerror(b.vq.error));
                return 1;
            }
            printf("%-8s %-6u %-9s %-9s %12.1f\n", l ? "packed" : "split", batch,
                   indirect ? "yes" : "no", inflight ? "yes" : "no", ns);
            teardown(&b);
        }
    }
    return 0;
}
