/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the split virtqueue engine: the input is a driver gone
 * wrong (queue size, features, raw descriptors, avail entries and index,
 * indirect tables in memfd guest memory). Segments must lie in the device's
 * memory table, errors must be sticky, the used ring must match the pushes.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/dirtylog.h"
#include "core/vq.h"
#include "driver/guestmem.h"
#include "fuzz_common.h"

/*
 * Guest memory: A [0x10000, 0x20000) and B [0x20000, 0x30000) adjacent in
 * GPA but separately mapped, a hole [0x30000, 0x40000), C [0x40000, 0x50000)
 * holding the rings. Indirect tables go at the start of A.
 */
#define RSZ       0x10000ull
#define A_GPA     0x10000ull
#define B_GPA     0x20000ull
#define C_GPA     0x40000ull
#define SPAN      (C_GPA + RSZ - A_GPA)
#define IND_GPA   A_GPA
#define IND_MAX   256
#define DESC_OFF  0x0000u /* up to 1024 * 16 = 0x4000 */
#define AVAIL_OFF 0x4000u /* up to 4 + 2048 + 2 */
#define USED_OFF  0x6000u /* up to 4 + 8192 + 2 */
#define MAX_IOV   1024
#define MAX_HELD  64

static struct vhd_guestmem gm_ab, gm_c;
static struct vhd_mem *mem1, *mem2, *mem_norings;
/* Dirty log (feat bit 3; bit 4: ring writes too): 64 bytes cover GPAs below 2 MiB. */
#define LOG_SIZE 64u
static struct vhd_dirtylog *dlog;

static struct iovec iov[MAX_IOV];

static void setup_once(void)
{
    struct vhd_mem_region_desc d[3];

    if (vhd_guestmem_init(&gm_ab, 2, RSZ, A_GPA, 0) < 0 ||
        vhd_guestmem_init(&gm_c, 1, RSZ, C_GPA, 0) < 0)
        abort();
    vhd_guestmem_descs(&gm_ab, d);
    vhd_guestmem_descs(&gm_c, d + 2);
    if (vhd_mem_new(d, 3, &mem1) < 0 || vhd_mem_new(d, 3, &mem2) < 0 ||
        vhd_mem_new(d, 2, &mem_norings) < 0)
        abort();
    const char *why;
    int lfd = memfd_create("fuzz-log", MFD_CLOEXEC);
    if (lfd < 0 || ftruncate(lfd, 4096) < 0 || vhd_dirtylog_map(lfd, LOG_SIZE, 0, &dlog, &why) < 0)
        abort();
    close(lfd);
}

static uint8_t *c_ptr(uint32_t off)
{
    return gm_c.r[0].hva + off;
}

/*
 * Expand 8 input bytes into a descriptor, biased towards interesting values:
 * b0 bits 0-2 flags (NEXT, WRITE, INDIRECT), bit 3 adds reserved flag bits,
 * bits 4-5 length mode, bits 6-7 address mode; b1 next (low 8 bits);
 * b2-b3 length; b4-b6 address offset; b7 next (high 2 bits), reserved bits.
 */
static void expand_desc(struct in *in, struct vhd_vring_desc *d)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = get8(in);
    uint16_t flags = b[0] & 7;
    if (b[0] & 8)
        flags |= (uint16_t)((b[7] & 0xf0) << 4);
    uint16_t next = (uint16_t)(b[1] | (b[7] & 3) << 8);
    uint32_t l16 = (uint32_t)(b[2] | b[3] << 8);
    uint32_t off = (uint32_t)(b[4] | b[5] << 8 | b[6] << 16);
    uint32_t len;
    switch ((b[0] >> 4) & 3) {
    case 0:
        len = l16;
        break;
    case 1:
        len = l16 & 0xff;
        break;
    case 2:
        len = 0xffff0000u | l16;
        break;
    default:
        len = l16 * 16;
        break;
    }
    uint64_t addr;
    switch (b[0] >> 6) {
    case 0:
        addr = A_GPA + off % SPAN;
        break;
    case 1:
        addr = IND_GPA + (off % IND_MAX) * 16;
        break;
    case 2:
        addr = (b[7] & 4 ? C_GPA + RSZ : B_GPA) - 128 + off % 256;
        break;
    default:
        addr = b[7] & 8 ? UINT64_MAX - off : (uint64_t)off << 40 | off;
        break;
    }
    d->addr = vhd_le64(addr);
    d->len = vhd_le32(len);
    d->flags = vhd_le16(flags);
    d->next = vhd_le16(next);
}

static bool in_table(const struct vhd_mem *m, const void *p, size_t len)
{
    uintptr_t a = (uintptr_t)p;
    for (uint32_t i = 0; i < m->nregions; i++) {
        uintptr_t b = (uintptr_t)m->regions[i].hva;
        if (a >= b && a - b < m->regions[i].size && len <= m->regions[i].size - (a - b))
            return true;
    }
    return false;
}

/* A broken queue answers every verb with its error, and keeps it. */
static void check_broken(struct vhd_vq *vq, int err)
{
    struct vhd_vq_chain c;
    FUZZ_CHECK(vq->error == err);
    FUZZ_CHECK(vhd_vq_pop(vq, iov, MAX_IOV, &c) == -err);
    memset(&c, 0, sizeof(c));
    FUZZ_CHECK(vhd_vq_push(vq, &c, 0) == -err);
    FUZZ_CHECK(!vhd_vq_need_notify(vq));
    FUZZ_CHECK(!vhd_vq_enable_notify(vq));
    FUZZ_CHECK(!vhd_vq_has_work(vq));
    FUZZ_CHECK(vq->error == err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint32_t sizes[] = {1, 2, 4, 8, 16, 32, 64, 256, 1024};
    static const uint32_t iovs[] = {1, 2, 3, 4, 8, 16, 64, MAX_IOV, 0};
    static bool ready;
    static struct vhd_vq vq;
    struct in in = {data, size};

    if (!ready) {
        setup_once();
        ready = true;
    }
    memset(gm_ab.r[0].hva, 0, RSZ);
    memset(gm_ab.r[1].hva, 0, RSZ);
    memset(gm_c.r[0].hva, 0, RSZ);

    uint32_t qsize = sizes[get8(&in) % VHD_ARRAY_SIZE(sizes)];
    uint8_t feat = get8(&in);
    uint32_t max_iov = iovs[get8(&in) % VHD_ARRAY_SIZE(iovs)];
    uint32_t rounds = 1 + get8(&in) % 3;
    uint16_t base = get16(&in), used0 = get16(&in);
    uint16_t avail_flags = get16(&in), used_event = get16(&in);
    bool uva = feat & 4;
    bool logging = feat & 8;
    memset(dlog->bits, 0, LOG_SIZE);

    struct vhd_vring_desc *desc = (void *)c_ptr(DESC_OFF);
    struct vhd_vring_avail *avail = (void *)c_ptr(AVAIL_OFF);
    struct vhd_vring_used *used = (void *)c_ptr(USED_OFF);
    uint64_t rbase = uva ? (uint64_t)(uintptr_t)gm_c.r[0].hva : C_GPA;
    struct vhd_vq_params p = {
        .size = qsize,
        .packed = false,
        .indirect = feat & 1,
        .event_idx = feat & 2,
        .addr_is_gpa = !uva,
        .desc = rbase + DESC_OFF,
        .avail = rbase + AVAIL_OFF,
        .used = rbase + USED_OFF,
    };
    const struct vhd_mem *cur = mem1;
    FUZZ_CHECK(vhd_vq_init(&vq, &p, cur) == 0);
    vhd_vq_set_log(&vq, logging ? dlog : NULL, feat & 16, C_GPA + USED_OFF);
    FUZZ_CHECK(vhd_vq_set_base(&vq, base) == 0);
    FUZZ_CHECK(vhd_vq_get_base(&vq) == base);
    used->idx = vhd_le16(used0);
    avail->idx = vhd_le16(base);
    avail->flags = vhd_le16(avail_flags);
    avail->ring[qsize] = vhd_le16(used_event);
    FUZZ_CHECK(vhd_vq_start(&vq) == 0);

    uint16_t avail_idx = base;          /* what the "driver" has published */
    uint16_t used_expect = used0;       /* what used->idx must become */
    struct vhd_vq_chain held[MAX_HELD]; /* popped, not pushed (carried across rounds) */
    uint32_t nheld = 0;

    for (uint32_t r = 0; r < rounds && !vq.error; r++) {
        uint32_t npop = 1 + get8(&in) % 32;
        uint8_t mode = get8(&in);
        uint32_t nd = get8(&in) % (qsize + 1), start = get8(&in);
        for (uint32_t k = 0; k < nd; k++)
            expand_desc(&in, &desc[(start + k) & (qsize - 1)]);
        uint32_t na = get8(&in) % (qsize + 1);
        for (uint32_t k = 0; k < na; k++) {
            uint16_t h = get16(&in);
            /* mostly valid heads, sometimes raw */
            avail->ring[(uint16_t)(avail_idx + k) & (qsize - 1)] =
                vhd_le16(h & 0x8000 ? h : h % qsize);
        }
        uint8_t dmode = get8(&in);
        avail_idx = (uint16_t)(avail_idx + (dmode & 0x80 ? (dmode & 0x7f) * 0x111u : na));
        uint32_t ni = get8(&in);
        for (uint32_t k = 0; k < ni && k < IND_MAX; k++)
            expand_desc(&in, (struct vhd_vring_desc *)(void *)(gm_ab.r[0].hva + 16 * k));
        vhd_store_release(&avail->idx, vhd_le16(avail_idx));

        if (mode & 0x40)
            (void)vhd_vq_enable_notify(&vq);
        if (mode & 0x80)
            vhd_vq_disable_notify(&vq);

        int err = 0;
        for (uint32_t i = 0; i < npop && nheld < MAX_HELD; i++) {
            struct vhd_vq_chain c;
            if (i == npop / 2) {
                if (mode & 0x08)
                    vhd_vq_invalidate(&vq);
                if (mode & 0x10) {
                    cur = cur == mem1 ? mem2 : mem1;
                    vhd_vq_set_mem(&vq, cur);
                }
            }
            int rc = vhd_vq_pop(&vq, iov, max_iov, &c);
            FUZZ_CHECK(rc <= 1 && rc > -VHD_VQ_E__COUNT);
#ifdef FUZZ_VQ_TRACE /* -DFUZZ_VQ_TRACE: what each pop saw, for writing seeds */
            fprintf(stderr, "round %u pop %u: rc %d nr %u nw %u rlen %u wlen %u id %u ndescs %u\n",
                    r, i, rc, rc == 1 ? c.nr : 0, rc == 1 ? c.nw : 0, rc == 1 ? c.rlen : 0,
                    rc == 1 ? c.wlen : 0, rc == 1 ? c.id : 0, rc == 1 ? c.ndescs : 0);
#endif
            if (rc < 0) {
                err = -rc;
                break;
            }
            if (rc == 0)
                break;
            FUZZ_CHECK(vq.error == 0);
            FUZZ_CHECK(c.id < qsize);
            FUZZ_CHECK(c.ndescs == 1);
            FUZZ_CHECK((uint32_t)c.nr + c.nw <= max_iov);
            FUZZ_CHECK((uint64_t)c.rlen + c.wlen <= UINT32_MAX);
            uint64_t rl = 0, wl = 0;
            for (uint32_t k = 0; k < (uint32_t)c.nr + c.nw; k++) {
                FUZZ_CHECK(iov[k].iov_len > 0);
                FUZZ_CHECK(in_table(cur, iov[k].iov_base, iov[k].iov_len));
                volatile const uint8_t *b = iov[k].iov_base;
                (void)b[0];
                (void)b[iov[k].iov_len - 1];
                if (k < c.nr)
                    rl += iov[k].iov_len;
                else
                    wl += iov[k].iov_len;
            }
            FUZZ_CHECK(rl == c.rlen && wl == c.wlen);
            /* The "device" wrote the writable part: logged at the GPAs it came from. */
            vhd_vq_log_write(&vq, iov + c.nr, c.nw, c.wlen);
            for (uint32_t k = c.nr; k < (uint32_t)c.nr + c.nw; k++) {
                uint32_t hint = 0;
                uint64_t g;
                FUZZ_CHECK(vhd_mem_hva_to_gpa(cur, iov[k].iov_base, iov[k].iov_len, &hint, &g) ==
                           0);
                FUZZ_CHECK(fuzz_log_bit(dlog, g) == logging &&
                           fuzz_log_bit(dlog, g + iov[k].iov_len - 1) == logging);
            }
            held[nheld++] = c;
        }
        if (err) {
            check_broken(&vq, err);
            break;
        }
        FUZZ_CHECK(vq.inflight == nheld);

        /* push: 0 in order, 1 reverse, 2 odd ones first, 3 none (stay in flight) */
        uint32_t order[MAX_HELD], no = 0;
        switch (mode & 3) {
        case 0:
            for (uint32_t i = 0; i < nheld; i++)
                order[no++] = i;
            break;
        case 1:
            for (uint32_t i = nheld; i-- > 0;)
                order[no++] = i;
            break;
        case 2:
            for (uint32_t i = 1; i < nheld; i += 2)
                order[no++] = i;
            for (uint32_t i = 0; i < nheld; i += 2)
                order[no++] = i;
            break;
        default:
            break;
        }
        uint16_t first = used_expect;
        struct vhd_vq_chain pushed[MAX_HELD];
        for (uint32_t i = 0; i < no; i++) {
            pushed[i] = held[order[i]];
            uint32_t written = pushed[i].wlen >> (i & 3);
            FUZZ_CHECK(vhd_vq_push(&vq, &pushed[i], written) == 0);
            used_expect++;
        }
        if (no) {
            nheld = 0;
        }
        FUZZ_CHECK(vq.inflight == nheld);
        /* nothing visible before the flush */
        FUZZ_CHECK(vhd_le16(used->idx) == first);
        vhd_vq_flush(&vq);
        FUZZ_CHECK(vq.error == 0);
        if (no && logging && (feat & 16))
            FUZZ_CHECK(fuzz_log_bit(dlog, C_GPA + USED_OFF + 2)); /* used->idx */
        FUZZ_CHECK(vhd_le16(used->idx) == used_expect);
        for (uint32_t i = 0; i < no && i < qsize; i++) {
            const struct vhd_vq_chain *c = &pushed[no - 1 - i];
            const struct vhd_vring_used_elem *e =
                &used->ring[(uint16_t)(used_expect - 1 - i) & (qsize - 1)];
            FUZZ_CHECK(vhd_le32(e->id) == c->id);
            FUZZ_CHECK(vhd_le32(e->len) == c->wlen >> ((no - 1 - i) & 3));
        }
        if ((mode & 0x20) && no && !nheld) {
            FUZZ_CHECK(vhd_vq_push(&vq, &pushed[0], 0) == -VHD_VQ_E_USED_OVERFLOW);
            check_broken(&vq, VHD_VQ_E_USED_OVERFLOW);
            break;
        }
        (void)vhd_vq_need_notify(&vq);
        (void)vhd_vq_has_work(&vq); /* may see a corrupt avail->idx and break the queue */
        if (vq.error) {
            check_broken(&vq, vq.error);
            break;
        }
        if (mode & 0x04) {
            /* rings vanish from the memory table: the next verb breaks the queue */
            vhd_vq_set_mem(&vq, mem_norings);
            struct vhd_vq_chain c;
            FUZZ_CHECK(vhd_vq_pop(&vq, iov, max_iov, &c) == -VHD_VQ_E_RING_ADDR);
            check_broken(&vq, VHD_VQ_E_RING_ADDR);
        }
    }
    return 0;
}
