/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the virtio-net device's request parsers (src/dev/net.c)
 * over the loopback backend: the input is a guest driver gone wrong. It picks
 * the features the driver accepts, the rings' layout and enabled state, then
 * interleaves transmit chains (fuzzed virtio_net_hdr: flags, gso_type,
 * checksum offsets; frames of any length; buffer layouts with writable or
 * out-of-memory descriptors), receive buffer chains (too small, readable,
 * split in pieces, outside memory), control-queue commands (any class,
 * command and data; missing or long ack buffers), config reads, MTU changes,
 * SEND_RARP and announce requests, and queue processing with small budgets.
 * Checked: every chain comes back at most once, used lengths fit the writable
 * part, a control command's used length is 0 or 1 and its ack is OK or ERR,
 * a receive header's num_buffers matches the buffers used (MRG_RXBUF),
 * config reads succeed exactly in range, and the loopback conservation law
 * of net.h (transmitted = received + receive drops + transmit drops).
 *
 * Single-threaded and deterministic: the queues are "attached" to a fake
 * worker that this file drives inline (vhd_queue_mark_used is ours).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/dirtylog.h"
#include "core/vq.h"
#include "dev/net.h"
#include "spec/virtio_net.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "fuzz_common.h"

#define BIT(n) (1ull << (n))

/*
 * Guest memory: two 256 KiB regions adjacent in GPA but mapped separately,
 * so a buffer crossing 0x140000 becomes two iovecs. The three ring areas sit
 * at the start of the first; buffers are bump-allocated from ARENA.
 */
#define RSZ        0x40000ull
#define MEM_GPA    0x100000ull
#define ARENA_GPA  0x110000ull
#define ARENA_END  (MEM_GPA + 2 * RSZ)
#define BAD_GPA    0x7000000000ull
#define QSIZE      32
#define MAX_BUFS   8
#define MAX_BUFLEN 0x2000u
#define PAIRS      2
#define HDR        12u

/* ---- the fuzzer's own worker: nothing runs in the background ---- */

struct vhd_worker {
    int unused;
};

static struct vhd_worker fw;

void vhd_queue_mark_used(struct vhd_queue *q)
{
    q->notify_pending = true; /* published by the loop with one flush */
}

/* The blk device's io_uring backend is linked in too; the net device never submits I/O. */
struct io_uring_sqe *vhd_worker_get_sqe(struct vhd_worker *w)
{
    (void)w;
    return NULL;
}

unsigned vhd_worker_index(const struct vhd_worker *w)
{
    (void)w;
    return 0;
}

struct io_uring *vhd_worker_uring(struct vhd_worker *w)
{
    (void)w;
    return NULL;
}

void vhd_worker_submit_pending(struct vhd_worker *w)
{
    (void)w;
}

/* ---- fixtures ---- */

enum { R_RX, R_TX, R_CTRL, NRINGS };

static struct vhd_guestmem gm;
static struct vhd_mem *mem;
static void *area[NRINGS];
static uint64_t area_gpa[NRINGS];
static size_t area_len;
static struct vhd_dev *dev;

/* Dirty log (b1 bit 6; bit 5: ring writes too): 64 bytes cover GPAs below 2 MiB. */
#define LOG_SIZE 64u
static struct vhd_dirtylog *dlog;

static bool log_empty(void)
{
    for (unsigned i = 0; i < LOG_SIZE; i++)
        if (dlog->bits[i])
            return false;
    return true;
}

static void setup_once(void)
{
    const char *why;
    int lfd = memfd_create("fuzz-log", MFD_CLOEXEC);
    if (lfd < 0 || ftruncate(lfd, 4096) < 0 || vhd_dirtylog_map(lfd, LOG_SIZE, 0, &dlog, &why) < 0)
        abort();
    close(lfd);
    struct vhd_net_opts o = {.name = "fuzz", .pairs = PAIRS, .allow_packed = true};
    char err[256];

    vhd_log_set_level(VHD_LOG_ERROR);
    fuzz_guestmem(&gm, 2, RSZ, MEM_GPA, &mem);
    area_len = fuzz_area_len(QSIZE, MAX_BUFS);
    for (int i = 0; i < NRINGS; i++) {
        area_gpa[i] = vhd_guestmem_alloc(&gm, area_len, 4096, &area[i]);
        if (area_gpa[i] == UINT64_MAX || area_gpa[i] + area_len > ARENA_GPA)
            abort();
    }
    if (vhd_net_new(&o, &dev, err, sizeof(err)) < 0) {
        fprintf(stderr, "vhd_net_new: %s\n", err);
        abort();
    }
    dev->mem = mem;
}

static uint8_t *gptr(uint64_t gpa, uint64_t len)
{
    return vhd_guestmem_ptr(&gm, gpa, len);
}

/* What we remember of a queued chain. */
struct sent {
    bool queued, done;
    uint32_t wlen;       /* writable bytes */
    uint64_t first_w;    /* gpa of the first writable byte (ack, receive header) */
    bool first_w_ok;     /* ... and it is in guest memory, in a buffer of >= 12 bytes */
    uint32_t first_wlen; /* length of the first writable buffer */
};

struct ring {
    struct vhd_queue *q;
    struct vhd_drv_vq dq;
    struct sent sent[QSIZE];
    unsigned nsent;
    bool up, broken;
};

/*
 * One chain: a control byte (buffer count, readable count, small pieces),
 * per buffer a length and a flag byte (gap, bad address), then the
 * readable bytes: `head` (a prepared header) and then input bytes.
 */
static bool add_chain(struct in *in, struct ring *r, bool indirect, uint64_t *cursor,
                      uint32_t def_nr, uint32_t def_nw, const uint8_t *head, uint32_t headlen)
{
    struct vhd_drv_buf bufs[MAX_BUFS];
    struct sent *s = &r->sent[r->nsent];
    uint8_t ctl = get8(in);
    uint32_t nbufs, nr;

    if (r->nsent == QSIZE)
        return false;
    if (ctl & 0x80) { /* free-form layout */
        nbufs = 1 + (ctl & 7);
        nr = ((ctl >> 3) & 7) % (nbufs + 1);
    } else {
        nbufs = def_nr + def_nw;
        nr = def_nr;
    }
    memset(s, 0, sizeof(*s));
    for (uint32_t i = 0; i < nbufs; i++) {
        uint32_t len = get16(in) % MAX_BUFLEN;
        uint8_t fl = get8(in);
        if (fl & 0x20)
            len = 1 + (len & 0x1f); /* small pieces */
        if (i < nr && i == 0 && headlen && !(fl & 0x40) && len < headlen)
            len = headlen; /* mostly a whole header first */
        uint64_t gap = fl & 0x0f;
        if (*cursor + gap + len > ARENA_END)
            return false;
        bufs[i].gpa = *cursor + gap;
        bufs[i].len = len;
        *cursor += gap + len;
        if ((fl & 0xc0) == 0xc0 && (get8(in) & 7) == 0)
            bufs[i].gpa = BAD_GPA;
        if (i >= nr) {
            if (s->wlen == 0 && bufs[i].gpa != BAD_GPA) {
                s->first_w = bufs[i].gpa;
                s->first_wlen = len;
                s->first_w_ok = len >= HDR && gptr(bufs[i].gpa, len) != NULL;
            }
            s->wlen += len;
        }
    }
    /* Readable bytes: the prepared head, then input. */
    uint64_t off = 0;
    for (uint32_t i = 0; i < nr; i++) {
        for (uint32_t k = 0; k < bufs[i].len; k++, off++) {
            uint8_t b = off < headlen ? head[off] : get8(in);
            if (bufs[i].gpa != BAD_GPA)
                fuzz_gwrite(&gm, bufs[i].gpa + k, &b, 1);
        }
    }
    /* Writable bytes: a marker, so unwritten bytes are recognisable. */
    for (uint32_t i = nr; i < nbufs; i++)
        if (bufs[i].gpa != BAD_GPA)
            for (uint32_t k = 0; k < bufs[i].len; k++) {
                uint8_t *p = gptr(bufs[i].gpa + k, 1);
                if (p)
                    *p = 0xee;
            }
    if (vhd_drv_vq_add(&r->dq, bufs, nr, nbufs - nr, indirect, (void *)(uintptr_t)(r->nsent + 1)) <
        0)
        return false;
    s->queued = true;
    r->nsent++;
    vhd_drv_vq_publish(&r->dq);
    return true;
}

/* Take every used element of r and check it. */
static void collect(struct ring *r, int which, bool mrg)
{
    void *cookie;
    uint32_t len;
    int rc;

    if (!r->up)
        return;
    while ((rc = vhd_drv_vq_get_used(&r->dq, &cookie, &len)) == 1) {
        uintptr_t id = (uintptr_t)cookie - 1;
        FUZZ_CHECK(id < r->nsent);
        struct sent *s = &r->sent[id];
        FUZZ_CHECK(s->queued && !s->done);
        s->done = true;
        FUZZ_CHECK(len <= s->wlen);
        if (which == R_TX)
            FUZZ_CHECK(len == 0); /* nothing is written into transmit buffers */
        if (which == R_CTRL) {
            FUZZ_CHECK(len <= 1);
            if (len == 1 && s->first_w_ok) {
                uint8_t ack = fuzz_gread8(&gm, s->first_w);
                FUZZ_CHECK(ack == VIRTIO_NET_OK || ack == VIRTIO_NET_ERR);
            }
        }
        if (which == R_RX && len >= HDR && s->first_w_ok) {
            /* The first buffer of a packet starts with the header; later ones are data. */
            uint16_t nb = (uint16_t)(fuzz_gread8(&gm, s->first_w + 10) |
                                     fuzz_gread8(&gm, s->first_w + 11) << 8);
            if (!mrg)
                FUZZ_CHECK(nb == 1);
        }
    }
    FUZZ_CHECK(rc == 0); /* the device never returns a malformed used element */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    struct in in = {data, size};
    static struct ring rings[NRINGS];

    if (!ready) {
        setup_once();
        ready = true;
    }
    const struct vhd_dev_ops *ops = dev->ops;

    /* ---- features ---- */
    uint8_t b0 = get8(&in), b1 = get8(&in);
    bool packed = b0 & 1, indirect = b0 & 2;
    uint64_t f = ops->features(dev);
    static const int droppable[] = {VIRTIO_NET_F_MRG_RXBUF,  VIRTIO_NET_F_CSUM,
                                    VIRTIO_NET_F_GUEST_CSUM, VIRTIO_NET_F_MQ,
                                    VIRTIO_NET_F_CTRL_VQ,    VIRTIO_F_EVENT_IDX};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(droppable); i++)
        if (b0 & (4u << i))
            f &= ~BIT(droppable[i]);
    if (!packed)
        f &= ~BIT(VIRTIO_F_RING_PACKED);
    if (!indirect)
        f &= ~BIT(VIRTIO_F_INDIRECT_DESC);
    if (b1 & 0x80)
        f ^= BIT(get8(&in) & 63); /* sometimes a bit not offered, or no VERSION_1 */
    if (ops->set_features(dev, f) < 0) {
        f = ops->features(dev) & ~BIT(VIRTIO_F_RING_PACKED);
        FUZZ_CHECK(ops->set_features(dev, f) == 0);
    }
    packed = (f & BIT(VIRTIO_F_RING_PACKED)) != 0;
    indirect = (f & BIT(VIRTIO_F_INDIRECT_DESC)) != 0;
    bool mrg = (f & BIT(VIRTIO_NET_F_MRG_RXBUF)) != 0;
    bool ctrl = (f & BIT(VIRTIO_NET_F_CTRL_VQ)) != 0;
    uint32_t ctrl_idx = (f & BIT(VIRTIO_NET_F_MQ)) ? 2 * PAIRS : 2;
    bool logging = b1 & 0x40;
    memset(dlog->bits, 0, LOG_SIZE);

    /* ---- rings: rx0, tx0, and the control queue when negotiated ---- */
    static const uint32_t idx_of[NRINGS] = {0, 1, 0};
    for (int i = 0; i < NRINGS; i++) {
        struct ring *r = &rings[i];
        memset(r->sent, 0, sizeof(r->sent));
        r->nsent = 0;
        r->broken = false;
        r->up = i != R_CTRL || ctrl;
        if (!r->up)
            continue;
        struct vhd_drv_vq_params dp = {.size = QSIZE,
                                       .packed = packed,
                                       .event_idx = (f & BIT(VIRTIO_F_EVENT_IDX)) != 0,
                                       .max_indirect = indirect ? MAX_BUFS : 0,
                                       .area = area[i],
                                       .area_gpa = area_gpa[i],
                                       .area_len = area_len};
        FUZZ_CHECK(vhd_drv_vq_init(&r->dq, &dp) == 0);
        r->q = &dev->queues[i == R_CTRL ? ctrl_idx : idx_of[i]];
        struct vhd_vq_params vp = {.size = QSIZE,
                                   .packed = packed,
                                   .event_idx = dp.event_idx,
                                   .indirect = indirect,
                                   .addr_is_gpa = true,
                                   .desc = r->dq.desc_gpa,
                                   .avail = r->dq.avail_gpa,
                                   .used = r->dq.used_gpa};
        r->q->size = QSIZE;
        FUZZ_CHECK(vhd_vq_init(&r->q->vq, &vp, mem) == 0);
        vhd_vq_set_log(&r->q->vq, logging ? dlog : NULL, b1 & 0x20, r->dq.used_gpa);
        FUZZ_CHECK(vhd_vq_start(&r->q->vq) == 0);
        r->q->started = true;
        r->q->enabled = !(b1 & (1u << i)); /* sometimes a disabled ring */
        FUZZ_CHECK(ops->queue_init(dev, r->q) == 0);
        r->q->worker = &fw;
        r->q->inflight_io = 0;
    }

    /* ---- operations ---- */
    uint64_t cursor = ARENA_GPA;
    unsigned nops = 0;
    while (in.n && nops++ < 256) {
        uint8_t op = get8(&in);
        switch (op % 8) {
        case 0:
        case 1: { /* receive buffers */
            if (!add_chain(&in, &rings[R_RX], indirect, &cursor, 0, 1, NULL, 0))
                goto out;
            break;
        }
        case 2:
        case 3: { /* a transmit chain: a header, then frame bytes */
            uint8_t h[HDR];
            for (unsigned k = 0; k < HDR; k++)
                h[k] = get8(&in);
            if (!(op & 0x10)) {     /* mostly a sane header */
                h[1] = 0;           /* gso_type NONE */
                h[0] &= 1;          /* NEEDS_CSUM or nothing */
                h[7] = 0, h[9] = 0; /* small csum_start/offset */
                h[8] &= 0x1f;
            }
            if (!add_chain(&in, &rings[R_TX], indirect, &cursor, 1, 0, h, HDR))
                goto out;
            break;
        }
        case 4: { /* a control command: class, command, data length, then data; an ack buffer */
            if (!ctrl)
                break;
            uint8_t h[2] = {(uint8_t)(get8(&in) % 6), get8(&in)};
            if (op & 0x10)
                h[0] = get8(&in);
            if (!add_chain(&in, &rings[R_CTRL], indirect, &cursor, 1, 1, h, 2))
                goto out;
            break;
        }
        case 5: { /* process a ring */
            struct ring *r = &rings[get8(&in) % NRINGS];
            if (!r->up || r->broken)
                break;
            int rc = ops->queue_process(r->q, 1 + (get8(&in) & 15));
            if (rc < 0)
                r->broken = true;
            vhd_vq_flush(&r->q->vq);
            vhd_vq_flush(&rings[R_RX].q->vq); /* loopback delivers into rx0 */
            break;
        }
        case 6: { /* config and front-end requests */
            uint8_t sel = get8(&in);
            uint32_t off = get8(&in), len = get8(&in);
            uint8_t cfg[64];
            if (sel & 1) {
                int rc = ops->get_config(dev, cfg, off % 40, len % 40);
                bool in_range = off % 40 + len % 40 <= sizeof(struct virtio_net_config);
                FUZZ_CHECK(in_range ? rc == 0 : rc == -EINVAL);
            }
            if (sel & 2) {
                uint32_t mtu = get16(&in);
                int rc = ops->set_mtu(dev, mtu);
                FUZZ_CHECK(rc == 0 || rc == -EINVAL);
            }
            if (sel & 4) {
                uint8_t mac[6];
                for (int k = 0; k < 6; k++)
                    mac[k] = get8(&in);
                FUZZ_CHECK(ops->send_rarp(dev, mac) == 0);
            }
            if (sel & 8) {
                int rc = vhd_net_announce(dev);
                FUZZ_CHECK(rc == 0 || rc == -EOPNOTSUPP);
                dev->config_changed = false;
            }
            break;
        }
        default: /* collect */
            for (int i = 0; i < NRINGS; i++)
                collect(&rings[i], i, mrg);
            break;
        }
    }
out:
    /* ---- run every ring until it is idle (bounded), collect, check ---- */
    for (int round = 0; round < 8; round++) {
        for (int i = NRINGS - 1; i >= 0; i--) {
            struct ring *r = &rings[i];
            if (!r->up || r->broken)
                continue;
            if (ops->queue_process(r->q, 64) < 0)
                r->broken = true;
        }
        for (int i = 0; i < NRINGS; i++)
            if (rings[i].up)
                vhd_vq_flush(&rings[i].q->vq);
    }
    for (int i = 0; i < NRINGS; i++)
        collect(&rings[i], i, mrg);
    /* a healthy transmit or control ring gave every chain back */
    for (int i = R_TX; i < NRINGS; i++) {
        struct ring *r = &rings[i];
        if (r->up && !r->broken && !r->q->vq.error && r->q->enabled)
            for (unsigned k = 0; k < r->nsent; k++)
                FUZZ_CHECK(r->sent[k].done);
    }

    /* loopback conservation (net.h): every frame taken was delivered or dropped once */
    uint64_t tx = 0, rx = 0, rxd = 0, txd = 0;
    for (uint32_t qi = 0; qi < 2 * PAIRS && qi != ctrl_idx; qi++) { /* data queues only */
        struct vhd_net_queue_stats st;
        FUZZ_CHECK(vhd_net_queue_stats(dev, qi, &st) == 0);
        if (qi & 1) {
            tx += st.packets;
            txd += st.drops;
        } else {
            rx += st.packets;
            rxd += st.drops;
        }
    }
    if (getenv("FUZZ_NET_VERBOSE") ||
        tx != rx + rxd + txd) { /* for checking what a seed exercises */
        struct vhd_net_queue_stats cs = {0};
        if (ctrl)
            FUZZ_CHECK(vhd_net_queue_stats(dev, ctrl_idx, &cs) == 0);
        fprintf(stderr,
                "features 0x%llx%s: tx %llu (drops %llu) rx %llu (drops %llu) ctrl %llu "
                "(refused %llu), broken %d/%d/%d\n",
                (unsigned long long)f, packed ? " packed" : "", (unsigned long long)tx,
                (unsigned long long)txd, (unsigned long long)rx, (unsigned long long)rxd,
                (unsigned long long)cs.packets, (unsigned long long)cs.errors, rings[0].broken,
                rings[1].broken, rings[2].broken);
    }
    FUZZ_CHECK(tx == rx + rxd + txd);
    /* Dirty logging: nothing marked when off; a delivered frame marked its buffer when on. */
    FUZZ_CHECK(logging ? (rx == 0 || !log_empty()) : log_empty());
    struct virtio_net_config c;
    FUZZ_CHECK(ops->get_config(dev, &c, 0, sizeof(c)) == 0);
    FUZZ_CHECK(vhd_le16(c.max_virtqueue_pairs) == PAIRS);

    for (int i = 0; i < NRINGS; i++) {
        struct ring *r = &rings[i];
        if (!r->up)
            continue;
        r->q->worker = NULL;
        ops->queue_fini(dev, r->q);
        r->q->started = false;
        r->q->enabled = false;
        vhd_drv_vq_fini(&r->dq);
    }
    ops->reset(dev);
    dev->config_changed = false;
    return 0;
}
