/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Differential libFuzzer target for the engine's batch verbs: one script (a
 * driver adding chains, bytes of the ring area and indirect tables
 * corrupted, the device popping runs, pushing, flushing; either layout,
 * optional inflight tracking) is played twice on fresh copies of the same
 * rings, once with vhd_vq_pop / vhd_vq_push and once with
 * vhd_vq_pop_burst or vhd_vq_pop_burstv (an input bit chooses) and
 * vhd_vq_push_burst. The chains (ids, sizes, segments),
 * the errors, the ring state, the ring area and the inflight area must be
 * identical. With VIRTIO_F_IN_ORDER (an input bit), the single play turns
 * what vhd_vq_push wrote for a run into the one used entry the batch push
 * writes for a transmit run (model_in_order), so that path is compared too.
 * With tracking, a crash and restart on the same area (an input bit) makes
 * the plays pop the chains it lists again, then new ones with the list
 * present.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/vq.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "fuzz_common.h"

/* Two adjacent regions (buffers may cross between them), rings at the start of the first. */
#define RSZ      0x40000ull
#define BASE_GPA 0x100000ull
#define QMAX     256u
#define MAX_IND  8u
#define STRIDE   8u /* iovec entries per chain at most */
#define MAX_OPS  256

static struct vhd_guestmem gm;
static struct vhd_mem *mem;
static void *area;
static uint64_t area_gpa;
static size_t area_len;
static uint8_t *inf_area[2];
static size_t inf_len;
static uint8_t *area_copy;

/* What one play of the script saw. */
struct trace {
    uint64_t hash; /* FNV-1a over every outcome, in order */
    uint32_t events;
};

static bool verbose; /* FUZZ_VQ_BATCH_TRACE set: print every outcome (to compare two plays) */

static void th(struct trace *t, uint64_t v)
{
    if (verbose)
        fprintf(stderr, "  %u: %#llx\n", t->events, (unsigned long long)v);
    for (int i = 0; i < 8; i++) {
        t->hash ^= (uint8_t)(v >> (8 * i));
        t->hash *= 0x100000001b3ull;
    }
    t->events++;
}

static void setup_once(void)
{
    fuzz_guestmem(&gm, 2, RSZ, BASE_GPA, &mem);
    area_len = fuzz_area_len(QMAX, MAX_IND);
    area_gpa = vhd_guestmem_alloc(&gm, area_len, 4096, &area);
    if (area_gpa == UINT64_MAX)
        abort();
    inf_len = vhd_inflight_queue_size(true, QMAX) > vhd_inflight_queue_size(false, QMAX)
                  ? vhd_inflight_queue_size(true, QMAX)
                  : vhd_inflight_queue_size(false, QMAX);
    inf_area[0] = aligned_alloc(64, (inf_len + 63) & ~(size_t)63);
    inf_area[1] = aligned_alloc(64, (inf_len + 63) & ~(size_t)63);
    area_copy = malloc(area_len);
    if (!inf_area[0] || !inf_area[1] || !area_copy)
        abort();
}

/* A buffer's address and length, biased towards edges: regions' ends, outside memory, empty. */
static struct vhd_drv_buf pick_buf(struct in *in)
{
    uint8_t m = get8(in);
    uint16_t off = get16(in);
    struct vhd_drv_buf b;
    b.len = (m & 0x30) == 0 ? 0 : (m & 0x30) == 0x10 ? 1u + off % 64 : 1u + off % 4096;
    switch (m & 3) {
    case 0: /* the second half of region 0, clear of the rings */
        b.gpa = BASE_GPA + RSZ / 2 + off % (RSZ / 4);
        break;
    case 1: /* across the region boundary */
        b.gpa = BASE_GPA + RSZ - 32 + off % 64;
        break;
    case 2: /* region 1 */
        b.gpa = BASE_GPA + RSZ + off % (RSZ / 2);
        break;
    default: /* the end of memory, or far outside */
        b.gpa = (m & 4) ? BASE_GPA + 2 * RSZ - 16 + off % 32 : (uint64_t)off << 36;
        break;
    }
    return b;
}

struct held {
    struct vhd_vq_chain c[QMAX + VHD_VQ_BURST_MAX];
    uint32_t n;
};

/* Record a popped chain: its shape and segments. */
static void th_chain(struct trace *t, const struct vhd_vq_chain *c, const struct iovec *iov)
{
    th(t,
       (uint64_t)c->id | (uint64_t)c->ndescs << 16 | (uint64_t)c->nr << 32 | (uint64_t)c->nw << 48);
    th(t, (uint64_t)c->rlen | (uint64_t)c->wlen << 32);
    for (uint32_t i = 0; i < (uint32_t)c->nr + c->nw; i++) {
        th(t, (uint64_t)(uintptr_t)iov[i].iov_base);
        th(t, iov[i].iov_len);
    }
}

/*
 * The single play's model of vhd_vq_push_burst with VIRTIO_F_IN_ORDER and
 * no inflight tracking: vhd_vq_push used c[0..kk) one by one from used
 * position u0 with np0 descriptors pending (snap: the used-entry ring
 * before). When none of them has device-writable bytes or bytes written,
 * the batch push writes one entry instead, at u0, naming c[kk - 1] with
 * length 0 (split: used element; packed: descriptor, the one pending
 * descriptor more), and leaves the other entries as they were; every
 * position, count and error is push's.
 */
static void model_in_order(struct vhd_vq *vq, struct vhd_drv_vq *dq, bool packed, uint32_t qsize,
                           const struct vhd_vq_chain *c, const uint32_t *written, uint32_t kk,
                           uint16_t u0, uint16_t np0, const uint8_t *snap)
{
    uint32_t acc = 0;
    for (uint32_t i = 0; i < kk; i++)
        acc |= c[i].wlen | written[i];
    if (kk == 0 || acc != 0)
        return;
    if (packed) {
        struct vhd_vring_packed_desc *r = dq->ring.packed.desc, first = r[u0];
        memcpy(r, snap, 16ull * qsize);
        r[u0] = first; /* chain 0's: flags as push stored them (or kept back), len 0 */
        r[u0].id = vhd_le16(c[kk - 1].id);
        vq->batch_npending = (uint16_t)(np0 + 1);
    } else {
        struct vhd_vring_used_elem *r = dq->ring.split.used->ring;
        memcpy(r, snap, 8ull * qsize);
        r[u0 & (qsize - 1)].id = vhd_le32(c[kk - 1].id);
        r[u0 & (qsize - 1)].len = 0;
    }
}

/*
 * Play the script in `in` (a copy) with the single verbs (batch false) or
 * the batch verbs. inf: the inflight region to use, or NULL.
 */
static void play(struct in in, bool batch, struct trace *t, struct vhd_vq *vq, uint8_t *inf)
{
    static struct iovec iov[VHD_VQ_BURST_MAX * STRIDE];
    static struct held h;
    struct vhd_drv_vq dq;

    uint8_t hdr = get8(&in);
    bool packed = hdr & 1, ind_feat = hdr & 2, tracked = hdr & 4, ind_drv = hdr & 8;
    bool in_order = hdr & 16;
    uint32_t qsize;
    if (packed)
        qsize = 1u + get8(&in) % QMAX;
    else
        qsize = 1u << (get8(&in) % 9); /* 1..256 */
    uint32_t stride = 1u + get8(&in) % STRIDE;

    memset(t, 0, sizeof(*t));
    memset(area, 0, area_len);
    memset(&h, 0, sizeof(h));
    struct vhd_drv_vq_params dp = {.size = qsize,
                                   .packed = packed,
                                   .event_idx = true,
                                   .max_indirect = ind_drv ? MAX_IND : 0,
                                   .area = area,
                                   .area_gpa = area_gpa,
                                   .area_len = area_len};
    if (vhd_drv_vq_init(&dq, &dp) < 0)
        abort();
    struct vhd_vq_params vp = {.size = qsize,
                               .packed = packed,
                               .event_idx = true,
                               .indirect = ind_feat,
                               .in_order = in_order,
                               .addr_is_gpa = true,
                               .desc = dq.desc_gpa,
                               .avail = dq.avail_gpa,
                               .used = dq.used_gpa};
    FUZZ_CHECK(vhd_vq_init(vq, &vp, mem) == 0);
    if (tracked) {
        memset(inf, 0, inf_len);
        if (packed)
            (void)vhd_vq_set_base(vq, 1u << 15 | 1u << 31);
        FUZZ_CHECK(vhd_vq_set_inflight(vq, inf, qsize) == 0);
    }
    th(t, (uint64_t)vhd_vq_start(vq));

    for (int op = 0; op < MAX_OPS && in.n; op++) {
        uint8_t o = get8(&in);
        switch (o % 9) {
        case 0: { /* the driver adds a chain */
            struct vhd_drv_buf bufs[6];
            uint32_t nr = (o >> 3) & 3, nw = (o >> 5) & 3;
            if (nr + nw == 0)
                nr = 1;
            for (uint32_t i = 0; i < nr + nw; i++)
                bufs[i] = pick_buf(&in);
            th(t, (uint64_t)(int64_t)vhd_drv_vq_add(&dq, bufs, nr, nw, ind_drv && (o & 0x80),
                                                    (void *)(uintptr_t)1));
            break;
        }
        case 1:
            vhd_drv_vq_publish(&dq);
            break;
        case 2: { /* a byte of the rings or the indirect tables goes wrong */
            uint32_t off = get16(&in);
            uint8_t v = get8(&in);
            ((uint8_t *)area)[off % area_len] = v;
            break;
        }
        case 3: { /* the device pops up to m chains */
            uint32_t m = 1u + get8(&in) % VHD_VQ_BURST_MAX;
            uint32_t got = 0;
            int rc = 0;
            while (got < m && h.n < QMAX) {
                uint32_t want = m - got;
                if (want > QMAX - h.n)
                    want = QMAX - h.n;
                if (batch && (o & 0x80)) {
                    /* vhd_vq_pop_burstv: each chain's own arrays, here laid out backwards */
                    struct iovec *iovs[VHD_VQ_BURST_MAX];
                    struct vhd_vq_chain *cs[VHD_VQ_BURST_MAX];
                    uint32_t w = want < VHD_VQ_BURST_MAX ? want : VHD_VQ_BURST_MAX;
                    for (uint32_t k = 0; k < w; k++) {
                        iovs[k] = iov + (size_t)(w - 1 - k) * stride;
                        cs[k] = &h.c[h.n + k];
                    }
                    rc = vhd_vq_pop_burstv(vq, iovs, stride, cs, w);
                    if (rc <= 0)
                        break;
                    for (int k = 0; k < rc; k++)
                        th_chain(t, cs[k], iovs[k]);
                } else if (batch) {
                    rc = vhd_vq_pop_burst(vq, iov, stride, &h.c[h.n], want);
                    if (rc <= 0)
                        break;
                    for (int k = 0; k < rc; k++)
                        th_chain(t, &h.c[h.n + k], iov + (size_t)k * stride);
                } else {
                    rc = vhd_vq_pop(vq, iov, stride, &h.c[h.n]);
                    if (rc <= 0)
                        break;
                    th_chain(t, &h.c[h.n], iov);
                }
                h.n += (uint32_t)rc;
                got += (uint32_t)rc;
            }
            th(t, (uint64_t)(int64_t)(rc < 0 ? rc : 0));
            break;
        }
        case 4: { /* the device pushes p held chains, oldest first (o bit 3: newest first) */
            static uint8_t snap[16 * QMAX];
            uint32_t p = get8(&in) % 70;
            if (p > h.n)
                p = h.n;
            struct vhd_vq_chain sel[70];
            uint32_t written[70];
            for (uint32_t i = 0; i < p; i++) {
                sel[i] = (o & 8) ? h.c[h.n - 1 - i] : h.c[i];
                uint8_t w = get8(&in);
                written[i] = (o & 0x40) ? 0 : w; /* bit 6: nothing written (transmit) */
            }
            if (o & 0x10 && p) /* a chain the device never popped (a device bug) */
                sel[p - 1].id = (uint16_t)(sel[p - 1].id + get8(&in) * 8u);
            int rc = 0;
            if (batch && p) {
                rc = vhd_vq_push_burst(vq, sel, written, p);
            } else {
                bool model = in_order && !tracked;
                uint16_t u0 = vq->used_idx, np0 = vq->batch_npending;
                uint32_t kk = 0;
                if (model)
                    memcpy(snap,
                           packed ? (void *)dq.ring.packed.desc : (void *)dq.ring.split.used->ring,
                           (packed ? 16ull : 8ull) * qsize);
                for (uint32_t i = 0; i < p && rc == 0; i++) {
                    rc = vhd_vq_push(vq, &sel[i], written[i]);
                    kk += rc == 0;
                }
                if (model)
                    model_in_order(vq, &dq, packed, qsize, sel, written, kk, u0, np0, snap);
            }
            th(t, (uint64_t)(int64_t)rc);
            if (o & 8) {
                h.n -= p;
            } else {
                memmove(h.c, h.c + p, (h.n - p) * sizeof(h.c[0]));
                h.n -= p;
            }
            if (o & 0x20)
                vhd_vq_flush(vq);
            break;
        }
        case 5: { /* the driver collects what was used */
            void *cookie;
            uint32_t len;
            int rc;
            while ((rc = vhd_drv_vq_get_used(&dq, &cookie, &len)) == 1)
                th(t, len);
            th(t, (uint64_t)(int64_t)rc);
            break;
        }
        case 6:
            if (tracked && (o & 0x80)) {
                /*
                 * The back-end crashes and a new one starts on the same
                 * rings and area, with the base a front-end gives then
                 * (split: used->idx; packed: the one of the first start):
                 * what it held is forgotten, the chains the area lists are
                 * popped again first (one by one in both plays), then new
                 * ones, the batch play's as tracked runs.
                 */
                vhd_vq_fini(vq);
                h.n = 0;
                FUZZ_CHECK(vhd_vq_init(vq, &vp, mem) == 0);
                (void)vhd_vq_set_base(vq, packed ? 1u << 15 | 1u << 31
                                                 : vhd_le16(dq.ring.split.used->idx));
                FUZZ_CHECK(vhd_vq_set_inflight(vq, inf, qsize) == 0);
                th(t, (uint64_t)vhd_vq_start(vq));
                th(t, vhd_vq_resubmit_pending(vq));
                break;
            }
            vhd_vq_flush(vq);
            th(t, vhd_vq_need_notify(vq));
            break;
        case 7: { /* the driver posts what it does not own: avail->idx / a slot's flags */
            uint8_t v = get8(&in);
            if (packed) {
                struct vhd_vring_packed_desc *d = &dq.ring.packed.desc[v % qsize];
                uint16_t f =
                    (uint16_t)((o & 0x10) ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED);
                d->flags = vhd_le16((uint16_t)((vhd_le16(d->flags) & 7) | f));
            } else {
                struct vhd_vring_avail *a = dq.ring.split.avail;
                a->ring[(uint16_t)(vhd_le16(a->idx)) & (qsize - 1)] = vhd_le16(v % (qsize + 1));
                a->idx = vhd_le16((uint16_t)(vhd_le16(a->idx) + 1 + (o >> 6)));
            }
            break;
        }
        default: { /* one field of one descriptor goes wrong */
            uint8_t i = get8(&in);
            uint16_t v = get16(&in);
            if (packed) {
                struct vhd_vring_packed_desc *d = &dq.ring.packed.desc[i % qsize];
                if (o & 0x10)
                    d->id = vhd_le16(v);
                else
                    d->flags = vhd_le16((uint16_t)((vhd_le16(d->flags) & 0x8080) | (v & 0x7)));
            } else {
                struct vhd_vring_desc *d = &dq.ring.split.desc[i % qsize];
                if (o & 0x10)
                    d->next = vhd_le16(v % (qsize + 2));
                else
                    d->flags = vhd_le16(v & 7);
            }
            break;
        }
        }
    }
    th(t, vq->error);
    th(t, (uint64_t)vq->last_avail_idx | (uint64_t)vq->avail_wrap << 16 |
              (uint64_t)vq->used_idx << 24 | (uint64_t)vq->used_wrap << 40 |
              (uint64_t)vq->inflight << 48);
    th(t, (uint64_t)vq->avail_shadow | (uint64_t)vq->published_used << 16 |
              (uint64_t)vq->batch_npending << 32 | (uint64_t)vq->inf_counter << 48);
    th(t, (uint64_t)vq->inf_new | (uint64_t)vq->inf_resubmit_pos << 16 |
              (uint64_t)vq->inf_resubmit_n << 32);
    vhd_vq_fini(vq);
    vhd_drv_vq_fini(&dq);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    static struct vhd_vq vq1, vq2;
    struct trace t1, t2;

    if (!ready) {
        setup_once();
        verbose = getenv("FUZZ_VQ_BATCH_TRACE") != NULL;
        ready = true;
    }
    struct in in = {data, size};
    if (verbose)
        fprintf(stderr, "single:\n");
    play(in, false, &t1, &vq1, inf_area[0]);
    memcpy(area_copy, area, area_len);
    if (verbose)
        fprintf(stderr, "batch:\n");
    play(in, true, &t2, &vq2, inf_area[1]);
    FUZZ_CHECK(t1.events == t2.events);
    FUZZ_CHECK(t1.hash == t2.hash);
    FUZZ_CHECK(memcmp(area_copy, area, area_len) == 0);
    FUZZ_CHECK(memcmp(inf_area[0], inf_area[1], inf_len) == 0);
    return 0;
}
