/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the device IOTLB with the virtqueue engine: the input
 * interleaves IOTLB UPDATEs and INVALIDATEs (any IOVA, size, front-end
 * address, access flags), memory table changes, chains of buffers at IOVAs
 * made available by the driver, and device pops/pushes, on split or packed
 * rings whose own addresses are IOVAs. After every step: each segment pop
 * handed out lies in guest memory and every byte of it is mapped by the
 * IOTLB with the access the buffer needs (readable: R, writable: W), the
 * cached ring pointers too, errors are sticky and misses never are.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/iotlb.h"
#include "core/vq.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "fuzz_common.h"

/* Two regions of 64 KiB (adjacent in GPA, apart in host memory); rings in the first. */
#define RSZ       0x10000ull
#define BASE_GPA  0x100000ull
#define QSIZE     16u
#define IOVA_WIN  0x100000000ull /* IOVAs the input picks lie in [IOVA_WIN, IOVA_WIN + 1 MiB) */
#define RING_IOVA 0x200000000ull
#define MAX_IOV   16
#define MAX_HELD  QSIZE

static struct vhd_guestmem gm;
static struct vhd_mem *mem_a, *mem_b;
/* Access the IOTLB grants to each byte of guest memory (union over entries). */
static uint8_t shadow[2 * RSZ];

static void setup_once(void)
{
    fuzz_guestmem(&gm, 2, RSZ, BASE_GPA, &mem_a);
    struct vhd_mem_region_desc d[2];
    vhd_guestmem_descs(&gm, d);
    if (vhd_mem_new(d, 2, &mem_b) < 0)
        abort();
}

/* Byte index into shadow of a host address of guest memory, or -1. */
static long host_index(const struct vhd_mem *m, const uint8_t *p)
{
    for (uint32_t i = 0; i < m->nregions; i++) {
        const struct vhd_mem_region *r = &m->regions[i];
        if (p >= r->hva && (uint64_t)(p - r->hva) < r->size)
            return (long)(r->gpa - BASE_GPA + (uint64_t)(p - r->hva));
    }
    return -1;
}

/* Recompute the shadow from every entry of the published table. */
static void shadow_build(const struct vhd_iotlb *t, const struct vhd_mem *m)
{
    struct vhd_iotlb_ent e;
    uint64_t x = 0;

    memset(shadow, 0, sizeof(shadow));
    while (vhd_iotlb_next(t->cur, x, &e) == 0) {
        long h = host_index(m, e.hva);
        FUZZ_CHECK(h >= 0 && (uint64_t)h + e.size <= sizeof(shadow));
        FUZZ_CHECK(host_index(m, e.hva + e.size - 1) == h + (long)e.size - 1); /* one region */
        for (uint64_t i = 0; i < e.size; i++)
            shadow[h + (long)i] |= e.perm;
        if (e.size > UINT64_MAX - e.iova)
            break;
        x = e.iova + e.size;
    }
}

/* Every byte of [p, p + len) is guest memory the IOTLB grants perm on. */
static void check_allowed(const struct vhd_mem *m, const void *p, uint64_t len, uint8_t perm)
{
    long h = host_index(m, p);
    FUZZ_CHECK(h >= 0);
    FUZZ_CHECK(host_index(m, (const uint8_t *)p + len - 1) == h + (long)len - 1);
    for (uint64_t i = 0; i < len; i++)
        FUZZ_CHECK((shadow[h + (long)i] & perm) == perm);
}

static void check_rings(const struct vhd_vq *vq, const struct vhd_mem *m)
{
    if (!vq->rings_ok)
        return;
    if (vq->packed) {
        check_allowed(m, vq->ring.packed.desc, 16u * vq->size, VHD_IOTLB_RW);
        check_allowed(m, vq->ring.packed.driver, 4, VHD_IOTLB_R);
        check_allowed(m, vq->ring.packed.device, 4, VHD_IOTLB_RW);
    } else {
        check_allowed(m, vq->ring.split.desc, vhd_vring_desc_size(vq->size), VHD_IOTLB_R);
        check_allowed(m, vq->ring.split.avail, vhd_vring_avail_size(vq->size), VHD_IOTLB_R);
        check_allowed(m, vq->ring.split.used, vhd_vring_used_size(vq->size), VHD_IOTLB_RW);
    }
}

/* An IOVA: mostly in the window, sometimes the ring's, sometimes anything. */
static uint64_t pick_iova(struct in *in)
{
    uint8_t mode = get8(in);
    uint64_t off = get32(in);
    switch (mode & 3) {
    case 0:
        return get64(in);
    case 1:
        return RING_IOVA + (off & 0xffff);
    default:
        return IOVA_WIN + (off & 0xfffff);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    static struct vhd_vq vq;
    static struct vhd_drv_vq dq;
    static struct iovec iov[MAX_HELD][MAX_IOV];
    struct in in = {data, size};
    struct vhd_iotlb *t;

    if (!ready) {
        setup_once();
        ready = true;
    }
    memset(gm.r[0].hva, 0, RSZ);
    memset(gm.r[1].hva, 0, RSZ);
    bool packed = get8(&in) & 1;

    /* The driver's rings at the start of region 0; the device gets them as IOVAs. */
    size_t alen = fuzz_area_len(QSIZE, 0);
    struct vhd_drv_vq_params dp = {.size = QSIZE,
                                   .packed = packed,
                                   .area = gm.r[0].hva,
                                   .area_gpa = BASE_GPA,
                                   .area_len = alen};
    FUZZ_CHECK(vhd_drv_vq_init(&dq, &dp) == 0);
    struct vhd_vq_params p = {
        .size = QSIZE,
        .packed = packed,
        .addr_is_gpa = true,
        .desc = RING_IOVA + (dq.desc_gpa - BASE_GPA),
        .avail = RING_IOVA + (dq.avail_gpa - BASE_GPA),
        .used = RING_IOVA + (dq.used_gpa - BASE_GPA),
    };
    const struct vhd_mem *cur = mem_a;
    FUZZ_CHECK(vhd_iotlb_new(1, &t) == 0);
    FUZZ_CHECK(vhd_vq_init(&vq, &p, cur) == 0);
    vhd_vq_set_iotlb(&vq, t, 0, -1);
    /* The rings mapped read-write, unless the input says otherwise. */
    if (!(get8(&in) & 0x80))
        FUZZ_CHECK(vhd_iotlb_update(t, cur, RING_IOVA, alen, vhd_guestmem_uva(&gm, BASE_GPA),
                                    VHD_IOTLB_RW) == 0);
    shadow_build(t, cur);
    int rc = vhd_vq_start(&vq);
    FUZZ_CHECK(rc == 0 || rc == -EAGAIN || rc == -EFAULT);
    check_rings(&vq, cur);

    struct vhd_vq_chain held[MAX_HELD];
    uint32_t nheld = 0;
    for (int step = 0; step < 64 && in.n; step++) {
        uint8_t op = get8(&in);
        switch (op % 6) {
        case 0: { /* UPDATE */
            uint64_t iova = pick_iova(&in), sz = get8(&in) & 1 ? get32(&in) & 0x1ffff : get64(&in);
            uint64_t uva = vhd_guestmem_uva(&gm, BASE_GPA + (get8(&in) & 1) * RSZ) +
                           (get32(&in) & 0x1ffff) - 0x100;
            uint8_t perm = get8(&in) & 7;
            int u = vhd_iotlb_update(t, cur, iova, sz, uva, perm);
            FUZZ_CHECK(u == 0 || u == 1 || u == -EINVAL || u == -EFAULT);
            if (u == 1) /* replaced: at a quiescent point, as the transport does */
                vhd_vq_iotlb_invalidated(&vq, iova, sz);
            vq.iotlb_miss = 0; /* the control thread clears it and kicks */
            break;
        }
        case 1: { /* INVALIDATE */
            uint64_t iova = pick_iova(&in), sz = get8(&in) & 1 ? get32(&in) & 0x1ffff : get64(&in);
            int u = vhd_iotlb_invalidate(t, iova, sz);
            FUZZ_CHECK(u == 0 || u == 1);
            if (u == 1)
                vhd_vq_iotlb_invalidated(&vq, iova, sz - 1 > UINT64_MAX - iova ? 0 : sz);
            break;
        }
        case 2: { /* a new memory table: the IOTLB is flushed with it */
            FUZZ_CHECK(vhd_iotlb_flush(t) >= 0);
            cur = cur == mem_a ? mem_b : mem_a;
            vhd_vq_set_mem(&vq, cur);
            break;
        }
        case 3: { /* the driver makes a chain of IOVA buffers available */
            struct vhd_drv_buf b[4];
            uint32_t nr = get8(&in) % 3, nw = get8(&in) % 3;
            if (nr + nw == 0)
                nw = 1;
            for (uint32_t i = 0; i < nr + nw; i++) {
                b[i].gpa = pick_iova(&in);
                b[i].len = get16(&in) & 0x1fff;
            }
            if (vhd_drv_vq_add(&dq, b, nr, nw, false, NULL) == 0)
                vhd_drv_vq_publish(&dq);
            break;
        }
        case 4: { /* the device pops (one or a burst) and checks every segment */
            if (nheld == MAX_HELD)
                break;
            uint32_t want = 1 + get8(&in) % (MAX_HELD - nheld);
            int n;
            if (want == 1) {
                n = vhd_vq_pop(&vq, iov[nheld], MAX_IOV, &held[nheld]);
            } else {
                n = vhd_vq_pop_burst(&vq, iov[nheld], MAX_IOV, &held[nheld], want);
                if (n > 0)
                    FUZZ_CHECK((uint32_t)n <= want);
            }
            if (n < 0) {
                FUZZ_CHECK(vq.error == -n); /* errors are sticky */
                FUZZ_CHECK(n != -VHD_VQ_E_IOTLB_MISS);
                break;
            }
            for (int k = 0; k < n; k++) {
                const struct vhd_vq_chain *c = &held[nheld + (uint32_t)k];
                for (uint32_t i = 0; i < (uint32_t)c->nr + c->nw; i++)
                    if (iov[nheld + (uint32_t)k][i].iov_len)
                        check_allowed(cur, iov[nheld + (uint32_t)k][i].iov_base,
                                      iov[nheld + (uint32_t)k][i].iov_len,
                                      i < c->nr ? VHD_IOTLB_R : VHD_IOTLB_W);
            }
            nheld += (uint32_t)n;
            check_rings(&vq, cur);
            break;
        }
        default: { /* the device pushes what it holds, the driver reaps it */
            for (uint32_t k = 0; k < nheld; k++)
                if (vhd_vq_push(&vq, &held[k], 0) < 0)
                    break;
            nheld = 0;
            vhd_vq_flush(&vq);
            void *cookie;
            uint32_t len;
            while (vhd_drv_vq_get_used(&dq, &cookie, &len) == 1)
                ;
            break;
        }
        }
        shadow_build(t, cur);
        if (vq.error)
            FUZZ_CHECK(vq.error != VHD_VQ_E_IOTLB_MISS);
    }
    vhd_vq_fini(&vq);
    vhd_drv_vq_fini(&dq);
    vhd_iotlb_free(t);
    return 0;
}
