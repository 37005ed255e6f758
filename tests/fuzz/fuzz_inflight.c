/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for inflight I/O tracking (src/core/inflight.c and the
 * records written by vq_split.c / vq_packed.c): an arbitrary inflight region
 * (the untrusted area a front-end hands back with SET_INFLIGHT_FD), arbitrary
 * rings and ring base, either layout, then a start (check, repair, resubmit
 * list) followed by pops, pushes, flushes, unpops, scribbles on the area and
 * restarts driven by the input. Nothing may read or write outside the region
 * (a heap block of exactly its size: ASan) or the memory table; a start
 * either fails with VHD_VQ_E_INFLIGHT or leaves at most a ring's worth of
 * chains to resubmit (packed: its positions inside the ring); errors are
 * sticky.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/vq.h"
#include "driver/guestmem.h"
#include "fuzz_common.h"

#define GPA      0x10000ull
#define RSZ      0x10000ull
#define RING_OFF 0x0000u /* descriptors (64 * 16), avail, used: split; packed: ring + events */
#define AVAIL    0x0400u
#define USED     0x0600u
#define BUF_OFF  0x1000u /* buffers live above */
#define MAX_Q    64
#define MAX_IOV  64

static struct vhd_guestmem gm;
static struct vhd_mem *mem;
static struct iovec iov[MAX_IOV];

/* Every segment of a popped chain lies in the device's mapping of the region. */
static void check_iov(const struct vhd_vq_chain *c)
{
    uint8_t *base = mem->regions[0].hva;
    for (uint32_t i = 0; i < (uint32_t)c->nr + c->nw; i++) {
        uint8_t *p = iov[i].iov_base;
        FUZZ_CHECK(p >= base && iov[i].iov_len <= RSZ && p - base <= (long)(RSZ - iov[i].iov_len));
    }
}

static void start(struct vhd_vq *vq, const struct vhd_vq_params *p, uint32_t base, void *region,
                  uint32_t desc_num)
{
    FUZZ_CHECK(vhd_vq_init(vq, p, mem) == 0);
    (void)vhd_vq_set_base(vq, base);
    FUZZ_CHECK(vhd_vq_set_inflight(vq, region, desc_num) == 0);
    int rc = vhd_vq_start(vq);
    if (rc < 0) {
        FUZZ_CHECK(vq->error == VHD_VQ_E_INFLIGHT || vq->error == VHD_VQ_E_RING_ADDR);
        FUZZ_CHECK(vhd_vq_resubmit_pending(vq) == 0);
    } else {
        FUZZ_CHECK(vhd_vq_resubmit_pending(vq) <= vq->size);
        /* Packed positions are slots: whatever the area said, they stay inside the ring. */
        if (vq->packed)
            FUZZ_CHECK(vq->used_idx < vq->size && vq->last_avail_idx < vq->size &&
                       vq->published_used < vq->size);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool once;
    struct in in = {data, size};
    struct vhd_vq vq;

    if (!once) {
        fuzz_guestmem(&gm, 1, RSZ, GPA, &mem);
        once = true;
    }

    uint8_t cfg = get8(&in);
    bool packed = cfg & 1;
    uint32_t qsize = packed ? 1 + get8(&in) % MAX_Q : 1u << (get8(&in) % 7); /* 1..64 */
    uint32_t desc_num = 1 + get8(&in) % (MAX_Q + 8); /* sometimes below the queue size */
    uint32_t base = (uint32_t)get16(&in) | (uint32_t)get16(&in) << 16;
    struct vhd_vq_params p = {
        .size = qsize,
        .packed = packed,
        .event_idx = (cfg & 2) != 0,
        .indirect = (cfg & 4) != 0,
        .addr_is_gpa = true,
        .desc = GPA + RING_OFF,
        .avail = GPA + AVAIL,
        .used = GPA + USED,
    };

    /* Guest memory: the rings and the first buffers from the input, the rest zero. */
    uint8_t *g = vhd_guestmem_ptr(&gm, GPA, RSZ);
    memset(g, 0, RSZ);
    fill(&in, g, BUF_OFF);
    /* Keep buffer addresses mostly inside the region: addr = GPA + low bits. */
    if (!packed)
        for (uint32_t i = 0; i < qsize; i++) {
            struct vhd_vring_desc *d = (struct vhd_vring_desc *)(g + RING_OFF) + i;
            if (!(cfg & 8))
                d->addr = GPA + BUF_OFF + (d->addr & 0x7fff);
            d->len &= 0xfff;
        }

    /* The region: exactly its size on the heap, so ASan sees any overrun. */
    size_t rlen = vhd_inflight_queue_size(packed, desc_num);
    uint8_t *region = malloc(rlen);
    if (!region)
        return 0;
    fill(&in, region, rlen);
    if (cfg & 16) {
        /* Make the header plausible more often than chance would. */
        ((struct vhd_inflight_split *)region)->version = VHD_INFLIGHT_VERSION;
        ((struct vhd_inflight_split *)region)->desc_num = (uint16_t)desc_num;
    }

    start(&vq, &p, base, region, desc_num);

    struct vhd_vq_chain held[MAX_Q];
    uint32_t nheld = 0;
    for (int step = 0; step < 256 && in.n; step++) {
        uint8_t op = get8(&in);
        switch (op % 7) {
        case 0:
        case 1: { /* pop */
            struct vhd_vq_chain c;
            int rc = vhd_vq_pop(&vq, iov, MAX_IOV, &c);
            if (rc == 1) {
                check_iov(&c);
                if (nheld < MAX_Q)
                    held[nheld++] = c;
                else
                    (void)vhd_vq_push(&vq, &c, 0);
            } else if (rc < 0) {
                FUZZ_CHECK(vq.error != 0 && rc == -(int)vq.error);
            }
            break;
        }
        case 2: /* push one held chain (any order) */
            if (nheld) {
                uint32_t k = get8(&in) % nheld;
                (void)vhd_vq_push(&vq, &held[k], get8(&in));
                held[k] = held[--nheld];
            }
            break;
        case 3:
            vhd_vq_flush(&vq);
            break;
        case 4: /* unpop the last held chain */
            if (nheld)
                (void)vhd_vq_unpop(&vq, &held[--nheld]);
            break;
        case 5: { /* the front-end scribbles on the area */
            uint16_t off = get16(&in);
            region[off % rlen] = get8(&in);
            break;
        }
        default: /* crash and restart on the same rings and area */
            vhd_vq_fini(&vq);
            nheld = 0;
            start(&vq, &p, base, region, desc_num);
            break;
        }
        if (vq.error)
            FUZZ_CHECK(vq.error < VHD_VQ_E__COUNT);
    }
    vhd_vq_fini(&vq);
    free(region);
    return 0;
}
