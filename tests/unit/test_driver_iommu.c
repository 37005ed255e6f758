/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The drivers' IOMMU bookkeeping (src/driver/drv_iommu.c) without a
 * back-end: IOVA allocation, page rounding, the messages strict and lazy
 * unmapping send (recorded by a fake send callback), misses, failures.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "harness.h"
#include "driver/drv_iommu.h"
#include "driver/guestmem.h"
#include "transport/vu_sock.h"

#define REG  0x40000000ull /* a fake region of our address space: only numbers are used */
#define RLEN (64ull << 20)
#define P4K  4096ull
#define P2M  (2ull << 20)

struct rec {
    pthread_mutex_t lock;
    struct vu_iotlb m[256];
    int n;
    int fail_next; /* refuse this many messages (-EIO) */
    int fail_at;   /* refuse the message with this 1-based number since n was 0 (0: none) */
};

static int rec_send(void *ctx, const struct vu_iotlb *m)
{
    struct rec *r = ctx;
    int rc = 0;
    pthread_mutex_lock(&r->lock);
    if (r->fail_next > 0 || (r->fail_at && r->n + 1 == r->fail_at)) {
        if (r->fail_next > 0)
            r->fail_next--;
        r->fail_at = 0;
        rc = -EIO;
    } else if (r->n < 256) {
        r->m[r->n++] = *m;
    }
    pthread_mutex_unlock(&r->lock);
    return rc;
}

static void setup(struct vhd_drv_iommu *io, struct rec *r, uint64_t page, bool strict,
                  uint32_t batch, uint64_t window)
{
    memset(r, 0, sizeof(*r));
    pthread_mutex_init(&r->lock, NULL);
    struct vhd_drv_iommu_params p = {.page_size = page,
                                     .strict = strict,
                                     .batch = batch,
                                     .iova_size = window,
                                     .send = rec_send,
                                     .send_ctx = r};
    VHD_CHECK_EQ(vhd_drv_iommu_init(io, &p), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_add_region(io, REG, RLEN), 0);
}

static const void *at(uint64_t a)
{
    return (const void *)(uintptr_t)a;
}

VHD_TEST(init_rejects_bad_params)
{
    struct rec r = {0};
    struct vhd_drv_iommu io;
    struct vhd_drv_iommu_params p = {.page_size = 4096, .send = rec_send, .send_ctx = &r};
    p.page_size = 2048;
    VHD_CHECK_EQ(vhd_drv_iommu_init(&io, &p), -EINVAL);
    p.page_size = 3 * 4096;
    VHD_CHECK_EQ(vhd_drv_iommu_init(&io, &p), -EINVAL);
    p.page_size = 4096;
    p.iova_size = 4096 + 1;
    VHD_CHECK_EQ(vhd_drv_iommu_init(&io, &p), -EINVAL);
    p.iova_size = 0;
    p.send = NULL;
    VHD_CHECK_EQ(vhd_drv_iommu_init(&io, &p), -EINVAL);
}

VHD_TEST(map_rounds_to_pages_and_keeps_offset)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t iova;
    setup(&io, &r, P4K, true, 0, 0);

    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + 0x1234), 100, VHOST_ACCESS_RO, &iova), 0);
    VHD_CHECK_EQ(iova, VHD_DRV_IOVA_BASE + 0x234);
    VHD_CHECK(iova != REG + 0x1234);
    VHD_CHECK_EQ(r.n, 1);
    VHD_CHECK_EQ(r.m[0].type, VHOST_IOTLB_UPDATE);
    VHD_CHECK_EQ(r.m[0].iova, VHD_DRV_IOVA_BASE);
    VHD_CHECK_EQ(r.m[0].size, P4K);
    VHD_CHECK_EQ(r.m[0].uva, REG + 0x1000);
    VHD_CHECK_EQ(r.m[0].perm, VHOST_ACCESS_RO);

    /* 32 bytes across a page boundary: two pages, after the first mapping's guard page */
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + 0x2ff0), 0x20, VHOST_ACCESS_WO, &iova), 0);
    VHD_CHECK_EQ(iova, VHD_DRV_IOVA_BASE + 2 * P4K + 0xff0);
    /* an INVALIDATE's end read as inclusive (DPDK) must not reach the next mapping */
    VHD_CHECK(r.m[1].iova > r.m[0].iova + r.m[0].size);
    VHD_CHECK_EQ(r.m[1].size, 2 * P4K);
    VHD_CHECK_EQ(r.m[1].uva, REG + 0x2000);
    VHD_CHECK_EQ(r.m[1].perm, VHOST_ACCESS_WO);

    /* the same page again gets its own IOVA */
    uint64_t again;
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + 0x1234), 100, VHOST_ACCESS_RW, &again), 0);
    VHD_CHECK_EQ(again, VHD_DRV_IOVA_BASE + 5 * P4K + 0x234);

    struct vhd_drv_iommu_map m;
    VHD_CHECK_EQ(vhd_drv_iommu_lookup(&io, VHD_DRV_IOVA_BASE + 2 * P4K + 5000, &m), 0);
    VHD_CHECK_EQ(m.uaddr, REG + 0x2000);
    VHD_CHECK_EQ(vhd_drv_iommu_lookup(&io, VHD_DRV_IOVA_BASE + P4K, &m), -ENOENT); /* guard */
    VHD_CHECK_EQ(vhd_drv_iommu_lookup(&io, VHD_DRV_IOVA_BASE + 4 * P4K, &m), -ENOENT);
    vhd_drv_iommu_fini(&io);
}

VHD_TEST(map_rejects_outside_regions_and_bad_perm)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t iova;
    setup(&io, &r, P4K, true, 0, 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG - 16), 32, VHOST_ACCESS_RW, &iova), -EINVAL);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + RLEN - 16), 32, VHOST_ACCESS_RW, &iova), -EINVAL);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 0, VHOST_ACCESS_RW, &iova), -EINVAL);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 8, 0, &iova), -EINVAL);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 8, 4, &iova), -EINVAL);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(UINT64_MAX - 8), 16, VHOST_ACCESS_RW, &iova), -EINVAL);
    VHD_CHECK_EQ(r.n, 0);
    vhd_drv_iommu_fini(&io);
}

VHD_TEST(huge_pages_cover_2m)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t iova;
    setup(&io, &r, P2M, true, 0, 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + P2M + 4096), 8192, VHOST_ACCESS_RW, &iova), 0);
    VHD_CHECK_EQ(iova, VHD_DRV_IOVA_BASE + 4096);
    VHD_CHECK_EQ(r.m[0].size, P2M);
    VHD_CHECK_EQ(r.m[0].uva, REG + P2M);
    /* the last 2 MiB page of the region is fine, past it is not */
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + RLEN - 10), 10, VHOST_ACCESS_RW, &iova), 0);
    VHD_CHECK_EQ(iova, VHD_DRV_IOVA_BASE + 2 * P2M + P2M - 10);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + RLEN - 10), 11, VHOST_ACCESS_RW, &iova), -EINVAL);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, VHD_DRV_IOVA_BASE + 4096), 0);
    VHD_CHECK_EQ(r.m[2].type, VHOST_IOTLB_INVALIDATE);
    VHD_CHECK_EQ(r.m[2].iova, VHD_DRV_IOVA_BASE);
    VHD_CHECK_EQ(r.m[2].size, P2M);
    vhd_drv_iommu_fini(&io);
}

VHD_TEST(strict_invalidates_each_unmap_and_reuses_iova)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t a, b;
    setup(&io, &r, P4K, true, 0, 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 4096, VHOST_ACCESS_RW, &a), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, a + 100), 0); /* any IOVA inside the mapping */
    VHD_CHECK_EQ(r.n, 2);
    VHD_CHECK_EQ(r.m[1].type, VHOST_IOTLB_INVALIDATE);
    VHD_CHECK_EQ(r.m[1].iova, a);
    VHD_CHECK_EQ(r.m[1].size, P4K);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, a), -ENOENT);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + 8192), 4096, VHOST_ACCESS_RW, &b), 0);
    VHD_CHECK_EQ(b, a); /* acked: free again */
    struct vhd_drv_iommu_stats st;
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.updates, 2);
    VHD_CHECK_EQ(st.invalidates, 1);
    VHD_CHECK_EQ(st.mapped, 1);
    VHD_CHECK_EQ(st.pending, 0);
    vhd_drv_iommu_fini(&io);
}

VHD_TEST(lazy_batches_coalesce_and_do_not_reuse_early)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t iv[6], x;
    setup(&io, &r, P4K, false, 4, 0);
    for (int i = 0; i < 6; i++)
        VHD_CHECK_EQ(
            vhd_drv_iommu_map(&io, at(REG + (uint64_t)i * 4096), 4096, VHOST_ACCESS_RW, &iv[i]), 0);
    VHD_CHECK_EQ(r.n, 6);
    /* unmap 0, 1, 3: pending, nothing sent, their IOVAs not handed out again */
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, iv[3]), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, iv[0]), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, iv[1]), 0);
    VHD_CHECK_EQ(r.n, 6);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 4096, VHOST_ACCESS_RW, &x), 0);
    VHD_CHECK_EQ(x, VHD_DRV_IOVA_BASE + 12 * P4K); /* each mapping: a page and its guard */
    VHD_CHECK_EQ(r.n, 7);
    /*
     * The fourth unmap fills the batch: 0+1 in one message, 3+4 in another,
     * each from the first range's start to the last one's end (the guard
     * between them inside, the last guard outside).
     */
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, iv[4]), 0);
    VHD_CHECK_EQ(r.n, 9);
    VHD_CHECK_EQ(r.m[7].type, VHOST_IOTLB_INVALIDATE);
    VHD_CHECK_EQ(r.m[7].iova, iv[0]);
    VHD_CHECK_EQ(r.m[7].size, 3 * P4K);
    VHD_CHECK_EQ(r.m[8].iova, iv[3]);
    VHD_CHECK_EQ(r.m[8].size, 3 * P4K);
    struct vhd_drv_iommu_stats st;
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.flushes, 1);
    VHD_CHECK_EQ(st.pending, 0);
    VHD_CHECK_EQ(st.free_extents, 3); /* [0,4) [6,10) [14,...) in pages */
    /* an explicit flush sends the rest; IOVAs all coalesce back */
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, iv[2]), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, iv[5]), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, x), 0);
    VHD_CHECK_EQ(r.n, 9);
    VHD_CHECK_EQ(vhd_drv_iommu_flush(&io), 0);
    VHD_CHECK_EQ(r.n, 11); /* 2 alone; 5 and x adjacent */
    VHD_CHECK_EQ(r.m[9].iova, iv[2]);
    VHD_CHECK_EQ(r.m[9].size, P4K);
    VHD_CHECK_EQ(r.m[10].iova, iv[5]);
    VHD_CHECK_EQ(r.m[10].size, 3 * P4K);
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.free_extents, 1);
    VHD_CHECK_EQ(st.mapped, 0);
    VHD_CHECK_EQ(vhd_drv_iommu_flush(&io), 0); /* nothing pending: nothing sent */
    VHD_CHECK_EQ(r.n, 11);
    vhd_drv_iommu_fini(&io);
}

VHD_TEST(window_exhaustion_and_coalescing)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t a, b, c, d;
    /* 8 pages: a [0,2) b [2,4) c [4,7), each with its guard page */
    setup(&io, &r, P4K, true, 0, 8 * P4K);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 4096, VHOST_ACCESS_RW, &a), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 4096, VHOST_ACCESS_RW, &b), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 8192, VHOST_ACCESS_RW, &c), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 1, VHOST_ACCESS_RW, &d), -ENOSPC);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, b), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 8192, VHOST_ACCESS_RW, &d), -ENOSPC);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, a), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 8192, VHOST_ACCESS_RW, &d), 0);
    VHD_CHECK_EQ(d, a);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, c), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, d), 0);
    struct vhd_drv_iommu_stats st;
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.free_extents, 1);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 7 * 4096, VHOST_ACCESS_RW, &d), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, d), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 8 * 4096, VHOST_ACCESS_RW, &d), -ENOSPC);
    vhd_drv_iommu_fini(&io);
}

VHD_TEST(refused_messages_leave_nothing_behind)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t a, b;
    setup(&io, &r, P4K, true, 0, 0);
    r.fail_next = 1;
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 4096, VHOST_ACCESS_RW, &a), -EIO);
    struct vhd_drv_iommu_stats st;
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.mapped, 0);
    VHD_CHECK_EQ(st.free_extents, 1);
    VHD_CHECK(vhd_drv_iommu_strerror(&io)[0] != 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 4096, VHOST_ACCESS_RW, &a), 0);
    VHD_CHECK_EQ(a, VHD_DRV_IOVA_BASE);
    /* a refused INVALIDATE: the range stays pending, its IOVA is not reused, a flush retries */
    r.fail_next = 1;
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, a), -EIO);
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.pending, 1);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 4096, VHOST_ACCESS_RW, &b), 0);
    VHD_CHECK(b != a);
    VHD_CHECK_EQ(vhd_drv_iommu_flush(&io), 0);
    VHD_CHECK_EQ(r.m[r.n - 1].type, VHOST_IOTLB_INVALIDATE);
    VHD_CHECK_EQ(r.m[r.n - 1].iova, a);
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.pending, 0);
    vhd_drv_iommu_fini(&io);
}

VHD_TEST(miss_answers_only_live_mappings_with_their_access)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t a, w;
    setup(&io, &r, P4K, false, 8, 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + 0x3000), 8192, VHOST_ACCESS_RO, &a), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 10, VHOST_ACCESS_WO, &w), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_miss(&io, a + 4096 + 7, VHOST_ACCESS_RO), 1);
    VHD_CHECK_EQ(r.m[2].type, VHOST_IOTLB_UPDATE);
    VHD_CHECK_EQ(r.m[2].iova, a);
    VHD_CHECK_EQ(r.m[2].size, 2 * P4K);
    VHD_CHECK_EQ(r.m[2].uva, REG + 0x3000);
    VHD_CHECK_EQ(r.m[2].perm, VHOST_ACCESS_RO);
    VHD_CHECK_EQ(vhd_drv_iommu_miss(&io, a, VHOST_ACCESS_RW), 0); /* write to a RO mapping */
    VHD_CHECK_EQ(vhd_drv_iommu_miss(&io, w, VHOST_ACCESS_RO), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_miss(&io, w, VHOST_ACCESS_WO), 1);
    VHD_CHECK_EQ(vhd_drv_iommu_miss(&io, REG, VHOST_ACCESS_RO), 0); /* a GPA/VA is no IOVA */
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, a), 0);                   /* lazily: still pending */
    VHD_CHECK_EQ(vhd_drv_iommu_miss(&io, a, VHOST_ACCESS_RO), 0);   /* unmapped is unmapped */
    struct vhd_drv_iommu_stats st;
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.misses, 6);
    VHD_CHECK_EQ(st.misses_bad, 4);
    VHD_CHECK_EQ(r.n, 4);
    vhd_drv_iommu_fini(&io);
}

VHD_TEST(miss_thread_answers_on_the_channel)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t a;
    int sv[2];
    setup(&io, &r, P4K, true, 0, 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + 0x5000), 64, VHOST_ACCESS_RW, &a), 0);
    VHD_CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
    int efd = eventfd(0, EFD_NONBLOCK);
    VHD_CHECK(efd >= 0);
    VHD_CHECK_EQ(vhd_drv_iommu_serve(&io, sv[0], 1000, efd), 0);

    /* a MISS with NEED_REPLY, then one for an unmapped IOVA, then one more valid */
    uint64_t ask[3] = {a + 8, VHD_DRV_IOVA_BASE + (1ull << 30), a};
    for (int k = 0; k < 3; k++) {
        struct vu_iotlb m = {.iova = ask[k], .perm = VHOST_ACCESS_RW, .type = VHOST_IOTLB_MISS};
        struct vu_hdr h = {.request = VHOST_USER_BACKEND_IOTLB_MSG,
                           .flags = VHOST_USER_VERSION | VHOST_USER_NEED_REPLY_MASK,
                           .size = sizeof(m)};
        VHD_CHECK_EQ(vu_send(sv[1], &h, &m, NULL, 0, 1000), 0);
        struct vu_rx rx;
        vu_rx_init(&rx);
        int rc;
        while ((rc = vu_rx_read(&rx, sv[1])) == 0) {
            struct pollfd pf = {.fd = sv[1], .events = POLLIN};
            VHD_CHECK(poll(&pf, 1, 2000) == 1);
        }
        VHD_CHECK_EQ(rc, 1);
        VHD_CHECK_EQ(rx.hdr.request, VHOST_USER_BACKEND_IOTLB_MSG);
        VHD_CHECK_EQ(rx.hdr.flags, VHOST_USER_VERSION | VHOST_USER_REPLY_MASK);
        VHD_CHECK_EQ(rx.payload.u64, 0);
    }
    /* the replies come after the misses were handled */
    VHD_CHECK_EQ(r.n, 3);
    VHD_CHECK_EQ(r.m[1].type, VHOST_IOTLB_UPDATE);
    VHD_CHECK_EQ(r.m[1].iova, a & ~(P4K - 1));
    VHD_CHECK_EQ(r.m[2].iova, a & ~(P4K - 1));
    struct vhd_drv_iommu_stats st;
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.misses_bad, 1);

    /* a config change is passed on through the eventfd and acked with 0 */
    struct vu_hdr h = {.request = VHOST_USER_BACKEND_CONFIG_CHANGE_MSG,
                       .flags = VHOST_USER_VERSION | VHOST_USER_NEED_REPLY_MASK};
    VHD_CHECK_EQ(vu_send(sv[1], &h, NULL, NULL, 0, 1000), 0);
    struct pollfd pe = {.fd = efd, .events = POLLIN};
    VHD_CHECK(poll(&pe, 1, 2000) == 1);
    struct vu_rx rx;
    vu_rx_init(&rx);
    int rc;
    while ((rc = vu_rx_read(&rx, sv[1])) == 0) {
        struct pollfd pf = {.fd = sv[1], .events = POLLIN};
        VHD_CHECK(poll(&pf, 1, 2000) == 1);
    }
    VHD_CHECK_EQ(rc, 1);
    VHD_CHECK_EQ(rx.hdr.request, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG);
    VHD_CHECK_EQ(rx.payload.u64, 0);
    vhd_drv_iommu_fini(&io); /* joins the thread */
    close(sv[0]);
    close(sv[1]);
    close(efd);
}

VHD_TEST(replay_resends_every_live_mapping_in_order)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t a, b, c;
    setup(&io, &r, P4K, true, 0, 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG), 100, VHOST_ACCESS_RO, &a), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + 0x10000), 8192, VHOST_ACCESS_WO, &b), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map(&io, at(REG + 0x20000), 100, VHOST_ACCESS_RW, &c), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, b), 0);
    r.n = 0;
    VHD_CHECK_EQ(vhd_drv_iommu_replay(&io), 0);
    VHD_CHECK_EQ(r.n, 2);
    VHD_CHECK_EQ(r.m[0].type, VHOST_IOTLB_UPDATE);
    VHD_CHECK_EQ(r.m[0].iova, a);
    VHD_CHECK_EQ(r.m[0].uva, REG);
    VHD_CHECK_EQ(r.m[0].perm, VHOST_ACCESS_RO);
    VHD_CHECK_EQ(r.m[1].iova, c);
    VHD_CHECK_EQ(r.m[1].uva, REG + 0x20000);
    VHD_CHECK_EQ(r.m[1].perm, VHOST_ACCESS_RW);
    r.fail_next = 1;
    VHD_CHECK_EQ(vhd_drv_iommu_replay(&io), -EIO);
    vhd_drv_iommu_fini(&io);
    vhd_drv_iommu_fini(&io); /* idempotent */
}

VHD_TEST(guestmem_regions_aligned_for_huge_pages)
{
    struct vhd_guestmem gm;
    VHD_CHECK_EQ(vhd_guestmem_init_aligned(&gm, 2, 2 * P2M, 0x100000, 0, P2M), 0);
    for (uint32_t i = 0; i < gm.nregions; i++) {
        VHD_CHECK_EQ((uintptr_t)gm.r[i].hva % P2M, 0);
        gm.r[i].hva[0] = 1; /* mapped and writable, both ends */
        gm.r[i].hva[gm.r[i].size - 1] = 2;
    }
    vhd_guestmem_fini(&gm);
    /* a size that is not a multiple of the alignment, an alignment that is no power of two */
    VHD_CHECK_EQ(vhd_guestmem_init_aligned(&gm, 1, P2M + 4096, 0, 0, P2M), -EINVAL);
    VHD_CHECK_EQ(vhd_guestmem_init_aligned(&gm, 1, 3 * 4096, 0, 0, 3 * 4096), -EINVAL);
}

VHD_TEST(paged_mapping_sends_one_update_per_page)
{
    struct rec r;
    struct vhd_drv_iommu io;
    uint64_t a, b;
    setup(&io, &r, P4K, false, 4, 0);
    VHD_CHECK_EQ(vhd_drv_iommu_map_paged(&io, at(REG + 0x10000), 4 * P4K, VHOST_ACCESS_RW, &a), 0);
    VHD_CHECK_EQ(a, VHD_DRV_IOVA_BASE);
    VHD_CHECK_EQ(r.n, 4);
    for (int k = 0; k < 4; k++) {
        VHD_CHECK_EQ(r.m[k].type, VHOST_IOTLB_UPDATE);
        VHD_CHECK_EQ(r.m[k].iova, a + (uint64_t)k * P4K);
        VHD_CHECK_EQ(r.m[k].size, P4K);
        VHD_CHECK_EQ(r.m[k].uva, REG + 0x10000 + (uint64_t)k * P4K);
    }
    /* a miss gets the page asked for */
    VHD_CHECK_EQ(vhd_drv_iommu_miss(&io, a + 2 * P4K + 100, VHOST_ACCESS_RO), 1);
    VHD_CHECK_EQ(r.m[4].iova, a + 2 * P4K);
    VHD_CHECK_EQ(r.m[4].size, P4K);
    VHD_CHECK_EQ(r.m[4].uva, REG + 0x12000);
    /* unmap: one INVALIDATE for the whole range */
    r.n = 0;
    VHD_CHECK_EQ(vhd_drv_iommu_unmap(&io, a), 0);
    VHD_CHECK_EQ(vhd_drv_iommu_flush(&io), 0);
    VHD_CHECK_EQ(r.n, 1);
    VHD_CHECK_EQ(r.m[0].type, VHOST_IOTLB_INVALIDATE);
    VHD_CHECK_EQ(r.m[0].iova, a);
    VHD_CHECK_EQ(r.m[0].size, 4 * P4K);
    /* the third UPDATE refused: the two sent are invalidated, nothing stays mapped */
    r.n = 0;
    r.fail_at = 3;
    VHD_CHECK_EQ(vhd_drv_iommu_map_paged(&io, at(REG), 4 * P4K, VHOST_ACCESS_RW, &b), -EIO);
    VHD_CHECK_EQ(r.n, 3);
    VHD_CHECK_EQ(r.m[2].type, VHOST_IOTLB_INVALIDATE);
    VHD_CHECK_EQ(r.m[2].iova, r.m[0].iova);
    VHD_CHECK_EQ(r.m[2].size, 2 * P4K);
    struct vhd_drv_iommu_stats st;
    vhd_drv_iommu_get_stats(&io, &st);
    VHD_CHECK_EQ(st.mapped, 0);
    VHD_CHECK_EQ(st.free_extents, 1);
    vhd_drv_iommu_fini(&io);
}
