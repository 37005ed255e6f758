/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the packed virtqueue engine: any queue size, features,
 * an arbitrary SET_VRING_BASE, ring slots with arbitrary flags/ids/wrap bits,
 * indirect tables and driver event area. Segments must lie in the device's
 * memory table, errors must be sticky, used descriptors must match the pushes.
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

/* Same layout as fuzz_vq_split.c: A and B adjacent, a hole, C with the rings. */
#define RSZ      0x10000ull
#define A_GPA    0x10000ull
#define B_GPA    0x20000ull
#define C_GPA    0x40000ull
#define SPAN     (C_GPA + RSZ - A_GPA)
#define IND_GPA  A_GPA
#define IND_MAX  256
#define DESC_OFF 0x0000u /* up to 1000 * 16 */
#define DRV_OFF  0x4000u /* driver event suppression */
#define DEV_OFF  0x4040u /* device event suppression */
#define MAX_IOV  1024
#define MAX_HELD 64

#define F_AVAIL VRING_PACKED_DESC_F_AVAIL
#define F_USED  VRING_PACKED_DESC_F_USED

static struct vhd_guestmem gm_ab, gm_c;
static struct vhd_mem *mem1, *mem2, *mem_norings;
/* Dirty log (feat bit 4; bit 5: ring writes too): 64 bytes cover GPAs below 2 MiB. */
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

/* Address and length from the biased encoding shared with fuzz_vq_split.c. */
static void expand_buf(uint8_t mode, const uint8_t *b, uint64_t *addr, uint32_t *len)
{
    uint32_t l16 = (uint32_t)(b[0] | b[1] << 8);
    uint32_t off = (uint32_t)(b[2] | b[3] << 8 | b[4] << 16);
    switch (mode & 3) {
    case 0:
        *len = l16;
        break;
    case 1:
        *len = l16 & 0xff;
        break;
    case 2:
        *len = 0xffff0000u | l16;
        break;
    default:
        *len = l16 * 16;
        break;
    }
    switch ((mode >> 2) & 3) {
    case 0:
        *addr = A_GPA + off % SPAN;
        break;
    case 1:
        *addr = IND_GPA + (off % IND_MAX) * 16;
        break;
    case 2:
        *addr = (mode & 0x10 ? C_GPA + RSZ : B_GPA) - 128 + off % 256;
        break;
    default:
        *addr = mode & 0x20 ? UINT64_MAX - off : (uint64_t)off << 40 | off;
        break;
    }
}

/*
 * A ring slot from 9 input bytes: b0 bits 0-2 NEXT/WRITE/INDIRECT, bits 3-4
 * availability (0, 1: available for the slot's lap; 2: available for the
 * other lap; 3: looks used or zero), bits 5-7 reserved flag bits; b1 the
 * address/length mode; b2-b6 length and address; b7-b8 the buffer id
 * (mostly below the size).
 */
static void expand_slot(struct in *in, struct vhd_vring_packed_desc *d, bool wrap, uint32_t qsize)
{
    uint8_t b[9];
    for (int i = 0; i < 9; i++)
        b[i] = get8(in);
    uint16_t flags = b[0] & 7;
    flags |= (uint16_t)((b[0] & 0xe0) << 3); /* bits 8..10: reserved */
    switch ((b[0] >> 3) & 3) {
    case 0:
    case 1:
        flags |= wrap ? F_AVAIL : F_USED;
        break;
    case 2:
        flags |= wrap ? F_USED : F_AVAIL;
        break;
    default:
        flags |= b[1] & 0x40 ? (wrap ? F_AVAIL | F_USED : 0) : 0;
        break;
    }
    uint64_t addr;
    uint32_t len;
    expand_buf(b[1], b + 2, &addr, &len);
    uint16_t id = (uint16_t)(b[7] | b[8] << 8);
    if (!(id & 0x8000))
        id = (uint16_t)(id % qsize);
    d->addr = vhd_le64(addr);
    d->len = vhd_le32(len);
    d->id = vhd_le16(id);
    vhd_store_release(&d->flags, vhd_le16(flags));
}

/* An indirect-table entry from 8 input bytes (flags raw: only WRITE should matter). */
static void expand_table_entry(struct in *in, struct vhd_vring_packed_desc *d)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = get8(in);
    uint64_t addr;
    uint32_t len;
    expand_buf(b[1], b + 2, &addr, &len);
    uint16_t flags = b[0] & 7;
    if (b[0] & 8)
        flags |= (uint16_t)(b[7] << 8);
    d->addr = vhd_le64(addr);
    d->len = vhd_le32(len);
    d->id = vhd_le16((uint16_t)(b[7] * 257));
    d->flags = vhd_le16(flags);
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

static void check_broken(struct vhd_vq *vq, int err)
{
    struct vhd_vq_chain c;
    FUZZ_CHECK(vq->error == err);
    FUZZ_CHECK(vhd_vq_pop(vq, iov, MAX_IOV, &c) == -err);
    memset(&c, 0, sizeof(c));
    c.ndescs = 1;
    FUZZ_CHECK(vhd_vq_push(vq, &c, 0) == -err);
    FUZZ_CHECK(!vhd_vq_need_notify(vq));
    FUZZ_CHECK(!vhd_vq_enable_notify(vq));
    FUZZ_CHECK(!vhd_vq_has_work(vq));
    FUZZ_CHECK(vq->error == err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint32_t sizes[] = {1, 2, 3, 4, 5, 8, 16, 100, 256, 1000};
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
    uint32_t rounds = 1 + get8(&in) % 4;
    uint32_t base = get32(&in);
    uint16_t drv_off_wrap = get16(&in), drv_flags = get16(&in);
    bool uva = feat & 4;
    bool logging = feat & 16;
    memset(dlog->bits, 0, LOG_SIZE);

    struct vhd_vring_packed_desc *ring = (void *)(gm_c.r[0].hva + DESC_OFF);
    struct vhd_vring_packed_event *drv = (void *)(gm_c.r[0].hva + DRV_OFF);
    struct vhd_vring_packed_event *dev = (void *)(gm_c.r[0].hva + DEV_OFF);
    uint64_t rbase = uva ? (uint64_t)(uintptr_t)gm_c.r[0].hva : C_GPA;
    struct vhd_vq_params p = {
        .size = qsize,
        .packed = true,
        .indirect = feat & 1,
        .event_idx = feat & 2,
        .addr_is_gpa = !uva,
        .desc = rbase + DESC_OFF,
        .avail = rbase + DRV_OFF,
        .used = rbase + DEV_OFF,
    };
    const struct vhd_mem *cur = mem1;
    FUZZ_CHECK(vhd_vq_init(&vq, &p, cur) == 0);
    vhd_vq_set_log(&vq, logging ? dlog : NULL, feat & 32, C_GPA + DEV_OFF);
    FUZZ_CHECK(vhd_vq_get_base(&vq) == 0x80008000u);
    if (!(feat & 8)) /* a valid base: avail slot/wrap, used the same */
        base = (base & 0x7fff) % qsize | (base & 0x8000);
    uint32_t b_avail = base & 0x7fff, b_used = (base >> 16) & 0x7fff;
    bool base_ok = b_avail < qsize && ((base >> 16) == 0 || b_used < qsize);
    int rc = vhd_vq_set_base(&vq, base);
    FUZZ_CHECK(base_ok ? rc == 0 : rc < 0);
    if (rc == 0)
        FUZZ_CHECK(vhd_vq_get_base(&vq) == ((base >> 16) ? base : (base | base << 16)));
    drv->off_wrap = vhd_le16(drv_off_wrap);
    drv->flags = vhd_le16(drv_flags);
    FUZZ_CHECK(vhd_vq_start(&vq) == 0);

    /* where the "driver" writes next, and where used descriptors must appear */
    uint32_t gb = vhd_vq_get_base(&vq);
    uint16_t dslot = gb & 0x7fff;
    bool dwrap = (gb >> 15) & 1;
    uint16_t uslot = (gb >> 16) & 0x7fff;
    bool uwrap = gb >> 31;
    struct vhd_vq_chain held[MAX_HELD];
    uint32_t nheld = 0;

    for (uint32_t r = 0; r < rounds && !vq.error; r++) {
        uint32_t npop = 1 + get8(&in) % 32;
        uint8_t mode = get8(&in);
        uint32_t nd = get8(&in) % (qsize + 1);
        for (uint32_t k = 0; k < nd; k++) {
            expand_slot(&in, &ring[dslot], dwrap, qsize);
            if (++dslot == qsize) {
                dslot = 0;
                dwrap = !dwrap;
            }
        }
        uint32_t ni = get8(&in);
        for (uint32_t k = 0; k < ni && k < IND_MAX; k++)
            expand_table_entry(&in,
                               (struct vhd_vring_packed_desc *)(void *)(gm_ab.r[0].hva + 16 * k));
        if (mode & 0x04) {
            drv->off_wrap = vhd_le16(get16(&in));
            drv->flags = vhd_le16(get16(&in));
        }

        if (mode & 0x40) {
            (void)vhd_vq_enable_notify(&vq);
            if (!vq.error) {
                uint32_t g = vhd_vq_get_base(&vq);
                /* ENABLE, or (EVENT_IDX only) DESC naming the next slot to be made available */
                uint16_t fl = vhd_le16(dev->flags);
                FUZZ_CHECK(fl == VRING_PACKED_EVENT_FLAG_ENABLE ||
                           (p.event_idx && fl == VRING_PACKED_EVENT_FLAG_DESC &&
                            vhd_le16(dev->off_wrap) == (g & 0xffff)));
            }
        }
        if (mode & 0x80) {
            vhd_vq_disable_notify(&vq);
            if (!vq.error)
                FUZZ_CHECK(vhd_le16(dev->flags) == VRING_PACKED_EVENT_FLAG_DISABLE);
        }

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
            rc = vhd_vq_pop(&vq, iov, max_iov, &c);
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
            FUZZ_CHECK(c.ndescs >= 1 && c.ndescs <= qsize);
            FUZZ_CHECK((uint32_t)c.nr + c.nw <= max_iov);
            FUZZ_CHECK((uint64_t)c.rlen + c.wlen <= UINT32_MAX);
            uint64_t rl = 0, wl = 0;
            for (uint32_t k = 0; k < (uint32_t)c.nr + c.nw; k++) {
                FUZZ_CHECK(iov[k].iov_len > 0);
                FUZZ_CHECK(in_table(cur, iov[k].iov_base, iov[k].iov_len));
                volatile const uint8_t *bp = iov[k].iov_base;
                (void)bp[0];
                (void)bp[iov[k].iov_len - 1];
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
        {
            /* the device never owns more slots than the ring has */
            uint32_t slots = 0;
            for (uint32_t i = 0; i < nheld; i++)
                slots += held[i].ndescs;
            FUZZ_CHECK(slots <= qsize);
        }

        /* push: 0 in order, 1 reverse, 2 odd ones first, 3 none (keep in flight) */
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
        struct {
            uint16_t slot, id, flags;
            uint32_t len;
        } expect[MAX_HELD];
        uint16_t first_slot = uslot;
        uint16_t first_flags_before = vhd_le16(ring[first_slot].flags);
        for (uint32_t i = 0; i < no; i++) {
            const struct vhd_vq_chain *c = &held[order[i]];
            uint32_t written = c->wlen >> (i & 3);
            FUZZ_CHECK(vhd_vq_push(&vq, c, written) == 0);
            expect[i].slot = uslot;
            expect[i].id = c->id;
            expect[i].len = written;
            expect[i].flags =
                (uint16_t)((uwrap ? F_AVAIL | F_USED : 0) | (written ? VRING_DESC_F_WRITE : 0));
            uint32_t nx = uslot + c->ndescs;
            if (nx >= qsize) {
                nx -= qsize;
                uwrap = !uwrap;
            }
            uslot = (uint16_t)nx;
        }
        if (no) {
            /* the batch head keeps its old flags until the flush: the driver sees nothing */
            FUZZ_CHECK(vhd_le16(ring[first_slot].flags) == first_flags_before);
            nheld = 0;
        }
        FUZZ_CHECK(vq.inflight == nheld);
        vhd_vq_flush(&vq);
        FUZZ_CHECK(vq.error == 0);
        for (uint32_t i = 0; i < no; i++) {
            const struct vhd_vring_packed_desc *d = &ring[expect[i].slot];
            if (logging && (feat & 32)) /* the used descriptor, at the ring's GPA */
                FUZZ_CHECK(fuzz_log_bit(dlog, C_GPA + DESC_OFF + 16ull * expect[i].slot));
            FUZZ_CHECK(vhd_le16(d->id) == expect[i].id);
            FUZZ_CHECK(vhd_le32(d->len) == expect[i].len);
            FUZZ_CHECK(vhd_le16(d->flags) == expect[i].flags);
        }
        FUZZ_CHECK((vhd_vq_get_base(&vq) >> 16) == (uint32_t)(uslot | (uwrap ? 0x8000 : 0)));
        if ((mode & 0x20) && no && !nheld) {
            struct vhd_vq_chain c = held[order[0]];
            FUZZ_CHECK(vhd_vq_push(&vq, &c, 0) == -VHD_VQ_E_USED_OVERFLOW);
            check_broken(&vq, VHD_VQ_E_USED_OVERFLOW);
            break;
        }
        (void)vhd_vq_need_notify(&vq);
        (void)vhd_vq_has_work(&vq);
        FUZZ_CHECK(vq.error == 0);

        uint8_t extra = get8(&in);
        uint32_t gbase = vhd_vq_get_base(&vq);
        /*
         * Hand the ring to a fresh queue through GET/SET_VRING_BASE. A used
         * position of slot 0, wrap 0 encodes as an all-zero upper half, which
         * set_base reads as "used = avail" (vq.h): lossless only when the two
         * are equal, which a consistent queue with nothing in flight ensures
         * (an arbitrary starting base above need not).
         */
        if ((extra & 1) && !nheld && ((gbase >> 16) || !(gbase & 0xffff))) {
            uint32_t b = gbase;
            FUZZ_CHECK(vhd_vq_init(&vq, &p, cur) == 0);
            vhd_vq_set_log(&vq, logging ? dlog : NULL, feat & 32, C_GPA + DEV_OFF);
            FUZZ_CHECK(vhd_vq_set_base(&vq, b) == 0);
            FUZZ_CHECK(vhd_vq_start(&vq) == 0);
            FUZZ_CHECK(vhd_vq_get_base(&vq) == b);
        }
        if (extra & 2) {
            vhd_vq_set_mem(&vq, mem_norings);
            struct vhd_vq_chain c;
            FUZZ_CHECK(vhd_vq_pop(&vq, iov, max_iov, &c) == -VHD_VQ_E_RING_ADDR);
            check_broken(&vq, VHD_VQ_E_RING_ADDR);
        }
    }
    return 0;
}
