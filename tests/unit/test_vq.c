/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit tests of the virtqueue engine (src/core/vq*.c), split and packed, driven
 * through the driver-side rings over memfd guest memory that the device maps
 * separately, as a real backend does; malformed input is forged into the rings.
 * Expected values come from the virtio 1.2 spec (2.7, 2.8) and vq.h.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "vq_fixture.h"

/* Register one test per layout: name_split and name_packed. */
#define BOTH(name)                 \
    static void name(bool packed); \
    VHD_TEST(name##_split)         \
    {                              \
        name(false);               \
    }                              \
    VHD_TEST(name##_packed)        \
    {                              \
        name(true);                \
    }                              \
    static void name(bool packed)

/* ---- deterministic PRNG (xorshift64) ---- */

static uint64_t rng_s = 0x9E3779B97F4A7C15ull;

static void rng_seed(uint64_t s)
{
    rng_s = s ? s : 1;
}

static uint32_t rnd(void)
{
    rng_s ^= rng_s << 13;
    rng_s ^= rng_s >> 7;
    rng_s ^= rng_s << 17;
    return (uint32_t)(rng_s >> 16);
}

static uint32_t rnd_below(uint32_t n)
{
    return n ? rnd() % n : 0;
}

static void *xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    VHD_CHECK(p != NULL);
    return p;
}

/* =====================================================================
 * Traffic engine: random well-formed requests through the driver, the
 * device pops/pushes them (out of order, in batches), the driver collects.
 * Every value is checked against what the driver put in.
 * ===================================================================== */

#define TR_BUFS   3  /* at most this many readable and writable buffers per request */
#define TR_BUFLEN 16 /* bytes reserved per buffer */

struct req {
    uint64_t rgpa, wgpa; /* readable / writable buffer space */
    uint8_t *rp, *wp;    /* our pointers to them */
    uint32_t seq;
    uint32_t nr, nw;
    uint32_t rl[TR_BUFS], wl[TR_BUFS];
    uint32_t rlen, wlen, written;
    uint16_t slots; /* descriptors (split) / ring slots (packed) it takes */
    bool indirect;
};

struct traffic {
    struct vqfx *f;
    struct vhd_vq *vq; /* the device queue (may be swapped, see resume) */
    uint32_t size;
    struct req *reqs;
    uint32_t *freestk, nfree;
    uint32_t free_slots;          /* our count of free descriptors / ring slots */
    uint32_t *addq, add_h, add_t; /* added, not popped (FIFO) */
    struct vhd_vq_chain *hc;      /* popped, held by the device */
    uint32_t *hreq, nheld;
    uint32_t *doneq, done_h, done_t; /* pushed, not collected (FIFO, push order) */
    uint8_t *id_busy;                /* device chain ids in flight */
    uint32_t *scratch;               /* tr_push: push order */
    uint8_t *taken;                  /* tr_push: pushed this time */
    struct iovec *iov;
    uint32_t max_iov;
    uint32_t seq;
    uint64_t added, completed;
    uint64_t pop_pos; /* linear avail position (slots / avail index) */
    bool use_indirect;
    uint32_t max_bufs; /* per direction, <= TR_BUFS */
    bool single;       /* one buffer per request */
};

static void tr_init(struct traffic *t, struct vqfx *f, bool use_indirect)
{
    memset(t, 0, sizeof(*t));
    t->f = f;
    t->vq = &f->vq;
    t->size = f->o.size;
    t->reqs = xcalloc(t->size, sizeof(*t->reqs));
    t->freestk = xcalloc(t->size, sizeof(uint32_t));
    t->addq = xcalloc(t->size, sizeof(uint32_t));
    t->doneq = xcalloc(t->size, sizeof(uint32_t));
    t->hc = xcalloc(t->size, sizeof(*t->hc));
    t->hreq = xcalloc(t->size, sizeof(uint32_t));
    t->id_busy = xcalloc(t->size, 1);
    t->scratch = xcalloc(t->size, sizeof(uint32_t));
    t->taken = xcalloc(t->size, 1);
    t->max_iov = 2 * TR_BUFS;
    t->iov = xcalloc(t->max_iov, sizeof(struct iovec));
    t->use_indirect = use_indirect;
    t->max_bufs = TR_BUFS;
    t->free_slots = t->size;
    for (uint32_t i = 0; i < t->size; i++) {
        struct req *r = &t->reqs[i];
        void *p;
        r->rgpa = vqfx_alloc(f, TR_BUFS * TR_BUFLEN, &p);
        r->rp = p;
        r->wgpa = vqfx_alloc(f, TR_BUFS * TR_BUFLEN, &p);
        r->wp = p;
        t->freestk[t->nfree++] = t->size - 1 - i;
    }
}

static void tr_fini(struct traffic *t)
{
    free(t->reqs);
    free(t->freestk);
    free(t->addq);
    free(t->doneq);
    free(t->hc);
    free(t->hreq);
    free(t->id_busy);
    free(t->scratch);
    free(t->taken);
    free(t->iov);
}

static uint8_t rpat(uint32_t seq, uint32_t j, uint32_t k)
{
    return (uint8_t)(seq * 7 + j * 31 + k * 3 + 1);
}

static uint8_t wpat(uint32_t seq, uint32_t k)
{
    return (uint8_t)(seq * 13 + k + 0x40);
}

/* Add up to n random requests (stops when out of space); returns how many. */
static uint32_t tr_add(struct traffic *t, uint32_t n)
{
    uint32_t added = 0;
    for (uint32_t i = 0; i < n && t->nfree; i++) {
        uint32_t nr = rnd_below(t->max_bufs + 1), nw = rnd_below(t->max_bufs + 1);
        if (t->single) {
            nr = rnd() & 1;
            nw = !nr;
        }
        if (nr + nw == 0) {
            if (rnd() & 1)
                nr = 1;
            else
                nw = 1;
        }
        bool ind = t->use_indirect && (rnd() & 1);
        if (!ind && nr + nw > t->size) {
            if (t->use_indirect) {
                ind = true;
            } else {
                while (nr + nw > t->size) {
                    if (nw)
                        nw--;
                    else
                        nr--;
                }
            }
        }
        uint16_t slots = (uint16_t)(ind ? 1 : nr + nw);
        if (slots > t->free_slots)
            break;
        uint32_t ri = t->freestk[--t->nfree];
        struct req *r = &t->reqs[ri];
        struct vhd_drv_buf bufs[2 * TR_BUFS];
        r->seq = t->seq++;
        r->nr = nr;
        r->nw = nw;
        r->rlen = r->wlen = 0;
        r->indirect = ind;
        r->slots = slots;
        for (uint32_t j = 0; j < nr; j++) {
            r->rl[j] = 1 + rnd_below(TR_BUFLEN);
            r->rlen += r->rl[j];
            for (uint32_t k = 0; k < TR_BUFLEN; k++)
                r->rp[j * TR_BUFLEN + k] = rpat(r->seq, j, k);
            bufs[j].gpa = r->rgpa + j * TR_BUFLEN;
            bufs[j].len = r->rl[j];
        }
        for (uint32_t j = 0; j < nw; j++) {
            r->wl[j] = 1 + rnd_below(TR_BUFLEN);
            r->wlen += r->wl[j];
            memset(r->wp + j * TR_BUFLEN, 0xEE, TR_BUFLEN);
            bufs[nr + j].gpa = r->wgpa + j * TR_BUFLEN;
            bufs[nr + j].len = r->wl[j];
        }
        int rc = vhd_drv_vq_add(&t->f->dq, bufs, nr, nw, ind, r);
        if (rc != 0)
            fprintf(stderr, "  drv add nr=%u nw=%u ind=%d free=%u: %d\n", nr, nw, ind,
                    t->free_slots, rc);
        VHD_CHECK_EQ(rc, 0);
        t->free_slots -= slots;
        t->addq[t->add_t++ % t->size] = ri;
        t->added++;
        added++;
    }
    return added;
}

/* Check one popped chain against the request it must be, and hold it. */
static void tr_check_popped(struct traffic *t, const struct vhd_vq_chain *c)
{
    VHD_CHECK(t->add_h != t->add_t); /* the device popped something we did not add */
    uint32_t ri = t->addq[t->add_h++ % t->size];
    struct req *r = &t->reqs[ri];

    VHD_CHECK_EQ(c->nr, r->nr);
    VHD_CHECK_EQ(c->nw, r->nw);
    VHD_CHECK_EQ(c->rlen, r->rlen);
    VHD_CHECK_EQ(c->wlen, r->wlen);
    VHD_CHECK_EQ(c->ndescs, t->f->o.packed ? r->slots : 1);
    VHD_CHECK(c->id < t->size);
    VHD_CHECK(!t->id_busy[c->id]);
    t->id_busy[c->id] = 1;
    t->pop_pos += t->f->o.packed ? c->ndescs : 1;
    for (uint32_t j = 0; j < r->nr; j++) {
        const struct iovec *v = &t->iov[j];
        VHD_CHECK_EQ(v->iov_len, r->rl[j]);
        VHD_CHECK(vqfx_in_mem(t->vq->mem, v->iov_base, v->iov_len));
        VHD_CHECK(memcmp(v->iov_base, r->rp + j * TR_BUFLEN, r->rl[j]) == 0);
    }
    r->written = rnd_below(r->wlen + 1);
    uint32_t k = 0;
    for (uint32_t j = 0; j < r->nw; j++) {
        const struct iovec *v = &t->iov[r->nr + j];
        VHD_CHECK_EQ(v->iov_len, r->wl[j]);
        VHD_CHECK(vqfx_in_mem(t->vq->mem, v->iov_base, v->iov_len));
        for (uint32_t b = 0; b < v->iov_len; b++, k++)
            if (k < r->written)
                ((uint8_t *)v->iov_base)[b] = wpat(r->seq, k);
    }
    t->hc[t->nheld] = *c;
    t->hreq[t->nheld] = ri;
    t->nheld++;
}

/* Pop up to max chains; returns how many. */
static uint32_t tr_pop(struct traffic *t, uint32_t max)
{
    uint32_t n = 0;
    while (n < max) {
        struct vhd_vq_chain c;
        memset(&c, 0xA5, sizeof(c));
        int rc = vhd_vq_pop(t->vq, t->iov, t->max_iov, &c);
        if (rc == 0)
            break;
        if (rc != 1)
            fprintf(stderr, "  pop: %d (%s)\n", rc, vhd_vq_strerror(rc));
        VHD_CHECK_EQ(rc, 1);
        tr_check_popped(t, &c);
        n++;
    }
    return n;
}

/* Pop everything available; every added request must come out, in order. */
static void tr_pop_all(struct traffic *t)
{
    tr_pop(t, UINT32_MAX);
    VHD_CHECK_EQ(t->add_h, t->add_t);
    VHD_CHECK(!vhd_vq_has_work(t->vq));
}

/* Push n held chains: mode 0 oldest first, 1 newest first, 2 random. No flush. */
static void tr_push(struct traffic *t, uint32_t n, int mode)
{
    uint32_t *pick = t->scratch;
    uint8_t *taken = t->taken;

    if (n > t->nheld)
        n = t->nheld;
    for (uint32_t i = 0; i < t->nheld; i++)
        pick[i] = mode == 1 ? t->nheld - 1 - i : i;
    if (mode == 2) { /* partial Fisher-Yates: a random n-subset in random order */
        for (uint32_t i = 0; i < n; i++) {
            uint32_t j = i + rnd_below(t->nheld - i);
            uint32_t tmp = pick[i];
            pick[i] = pick[j];
            pick[j] = tmp;
        }
    }
    memset(taken, 0, t->nheld);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t k = pick[i];
        uint32_t ri = t->hreq[k];
        VHD_CHECK_EQ(vhd_vq_push(t->vq, &t->hc[k], t->reqs[ri].written), 0);
        t->id_busy[t->hc[k].id] = 0;
        t->doneq[t->done_t++ % t->size] = ri;
        taken[k] = 1;
    }
    /* keep the rest in pop order */
    uint32_t w = 0;
    for (uint32_t k = 0; k < t->nheld; k++) {
        if (taken[k])
            continue;
        t->hc[w] = t->hc[k];
        t->hreq[w] = t->hreq[k];
        w++;
    }
    t->nheld = w;
}

/* Collect every used element; they must come back in push order with their lengths. */
static uint32_t tr_collect(struct traffic *t)
{
    uint32_t n = 0;
    for (;;) {
        void *ck = NULL;
        uint32_t len = 0xdeadbeef;
        int rc = vhd_drv_vq_get_used(&t->f->dq, &ck, &len);
        if (rc == 0)
            break;
        VHD_CHECK_EQ(rc, 1);
        VHD_CHECK(t->done_h != t->done_t); /* a used element we never pushed */
        uint32_t ri = t->doneq[t->done_h++ % t->size];
        struct req *r = &t->reqs[ri];
        VHD_CHECK(ck == (void *)r);
        VHD_CHECK_EQ(len, r->written);
        uint32_t k = 0;
        for (uint32_t j = 0; j < r->nw; j++)
            for (uint32_t b = 0; b < r->wl[j]; b++, k++)
                if (k < r->written)
                    VHD_CHECK_EQ(r->wp[j * TR_BUFLEN + b], wpat(r->seq, k));
        t->free_slots += r->slots;
        t->freestk[t->nfree++] = ri;
        t->completed++;
        n++;
    }
    return n;
}

/*
 * One round: add a batch, publish, pop it all, push a random part of what
 * the device holds in a random order (maybe in two flushes), collect.
 */
static void tr_round(struct traffic *t, uint32_t max_batch)
{
    tr_add(t, 1 + rnd_below(max_batch));
    vhd_drv_vq_publish(&t->f->dq);
    (void)vhd_drv_vq_kick_needed(&t->f->dq);
    tr_pop_all(t);
    uint32_t n = t->nheld;
    if (rnd_below(4) == 0)
        n = rnd_below(t->nheld + 1); /* keep some in flight across rounds */
    /* never hold the whole ring, or the driver could not add anything */
    if (t->nheld - n >= t->size / 2)
        n = t->nheld;
    int mode = (int)rnd_below(3);
    if (rnd() & 1) {
        uint32_t h = n / 2;
        tr_push(t, h, mode);
        vhd_vq_flush(t->vq);
        tr_push(t, n - h, mode);
    } else {
        tr_push(t, n, mode);
    }
    vhd_vq_flush(t->vq);
    (void)vhd_vq_need_notify(t->vq);
    tr_collect(t);
    VHD_CHECK_EQ(t->done_h, t->done_t);
}

/* Complete everything in flight and check both sides agree nothing is left. */
static void tr_drain(struct traffic *t)
{
    tr_pop_all(t);
    tr_push(t, t->nheld, 2);
    vhd_vq_flush(t->vq);
    tr_collect(t);
    VHD_CHECK_EQ(t->done_h, t->done_t);
    VHD_CHECK_EQ(t->nheld, 0);
    VHD_CHECK_EQ(t->completed, t->added);
    VHD_CHECK_EQ(vhd_drv_vq_inflight(&t->f->dq), 0);
    VHD_CHECK_EQ(t->vq->inflight, 0);
    VHD_CHECK_EQ(t->free_slots, t->size);
    VHD_CHECK_EQ(t->vq->error, 0);
}

/* =====================================================================
 * Simple single-shape helpers for notification tests.
 * ===================================================================== */

/* Add k requests of ndesc writable 8-byte buffers (direct); returns slots used. */
static uint32_t drv_add_k(struct vqfx *f, uint64_t buf, uint32_t k, uint32_t ndesc)
{
    struct vhd_drv_buf b[8];
    for (uint32_t i = 0; i < ndesc; i++) {
        b[i].gpa = buf + 8 * i;
        b[i].len = 8;
    }
    for (uint32_t i = 0; i < k; i++)
        VHD_CHECK_EQ(vhd_drv_vq_add(&f->dq, b, 0, ndesc, false, (void *)(uintptr_t)(i + 1)), 0);
    return k * ndesc;
}

/* Device: pop everything, push it in order (written 0), flush. Returns chains. */
static uint32_t dev_serve(struct vqfx *f)
{
    struct iovec iov[16];
    struct vhd_vq_chain c;
    uint32_t n = 0;
    int rc;
    while ((rc = vhd_vq_pop(&f->vq, iov, 16, &c)) == 1) {
        VHD_CHECK_EQ(vhd_vq_push(&f->vq, &c, 0), 0);
        n++;
    }
    VHD_CHECK_EQ(rc, 0);
    vhd_vq_flush(&f->vq);
    return n;
}

static uint32_t drv_collect(struct vqfx *f)
{
    void *ck;
    uint32_t len, n = 0;
    int rc;
    while ((rc = vhd_drv_vq_get_used(&f->dq, &ck, &len)) == 1)
        n++;
    VHD_CHECK_EQ(rc, 0);
    return n;
}

/* Full cycles of k requests, to move the indices along. */
static void advance(struct vqfx *f, uint64_t buf, uint32_t total, uint32_t batch)
{
    while (total) {
        uint32_t k = total < batch ? total : batch;
        drv_add_k(f, buf, k, 1);
        vhd_drv_vq_publish(&f->dq);
        VHD_CHECK_EQ(dev_serve(f), k);
        VHD_CHECK_EQ(drv_collect(f), k);
        total -= k;
    }
}

/* Is ev among the 16-bit indices old, old+1, ..., new-1 (the spec's window)? */
static bool in_window16(uint16_t ev, uint16_t old, uint16_t new_idx)
{
    for (uint16_t p = old; p != new_idx; p++)
        if (p == ev)
            return true;
    return false;
}

/* Packed linear position p (slots since start, wrap counters starting at 1). */
static uint16_t pos_slot(uint64_t p, uint32_t size)
{
    return (uint16_t)(p % size);
}
static bool pos_wrap(uint64_t p, uint32_t size)
{
    return ((p / size) & 1) == 0;
}

/* Does (off, wrap) name one of the positions old .. new-1? */
static bool in_window_packed(uint16_t off, bool wrap, uint64_t old, uint64_t new_pos, uint32_t size)
{
    for (uint64_t p = old; p < new_pos; p++)
        if (pos_slot(p, size) == off && pos_wrap(p, size) == wrap)
            return true;
    return false;
}

/* =====================================================================
 * Basic round trip
 * ===================================================================== */

static void roundtrip(bool packed, bool uva, bool indirect)
{
    struct vqfx f;
    struct vqfx_opts o = {
        .size = 8, .packed = packed, .uva = uva, .indirect = true, .max_indirect = 8};
    vqfx_setup(&f, &o);

    uint8_t *r0, *r1, *w0, *w1;
    uint64_t g_r0 = vqfx_alloc(&f, 100, (void **)&r0);
    uint64_t g_r1 = vqfx_alloc(&f, 200, (void **)&r1);
    uint64_t g_w0 = vqfx_alloc(&f, 300, (void **)&w0);
    uint64_t g_w1 = vqfx_alloc(&f, 50, (void **)&w1);
    for (int i = 0; i < 100; i++)
        r0[i] = (uint8_t)i;
    for (int i = 0; i < 200; i++)
        r1[i] = (uint8_t)(0x80 + i);
    struct vhd_drv_buf bufs[4] = {{g_r0, 100}, {g_r1, 200}, {g_w0, 300}, {g_w1, 50}};
    struct iovec iov[8];
    struct vhd_vq_chain c;
    void *ck;
    uint32_t len;

    VHD_CHECK(!vhd_vq_has_work(&f.vq));
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 8, &c), 0);
    VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, bufs, 2, 2, indirect, &f), 0);
    /* added but not published: invisible */
    VHD_CHECK(!vhd_vq_has_work(&f.vq));
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 8, &c), 0);
    vhd_drv_vq_publish(&f.dq);
    VHD_CHECK(vhd_vq_has_work(&f.vq));

    memset(&c, 0xA5, sizeof(c));
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 8, &c), 1);
    VHD_CHECK_EQ(c.nr, 2);
    VHD_CHECK_EQ(c.nw, 2);
    VHD_CHECK_EQ(c.rlen, 300);
    VHD_CHECK_EQ(c.wlen, 350);
    VHD_CHECK_EQ(c.ndescs, packed ? (indirect ? 1 : 4) : 1);
    VHD_CHECK(c.id < 8);
    VHD_CHECK_EQ(f.vq.inflight, 1);
    VHD_CHECK_EQ(iov[0].iov_len, 100);
    VHD_CHECK_EQ(iov[1].iov_len, 200);
    VHD_CHECK_EQ(iov[2].iov_len, 300);
    VHD_CHECK_EQ(iov[3].iov_len, 50);
    for (int i = 0; i < 4; i++) {
        VHD_CHECK(vqfx_in_mem(f.mem, iov[i].iov_base, iov[i].iov_len));
        /* the device's own mapping, not our pointers */
        VHD_CHECK(iov[i].iov_base != vqfx_ptr(&f, bufs[i].gpa, 1));
    }
    VHD_CHECK(memcmp(iov[0].iov_base, r0, 100) == 0);
    VHD_CHECK(memcmp(iov[1].iov_base, r1, 200) == 0);
    /* write through the device iov, read through the driver's pointer */
    memset(iov[2].iov_base, 0xA5, 300);
    memset(iov[3].iov_base, 0x5A, 50);
    for (int i = 0; i < 300; i++)
        VHD_CHECK_EQ(w0[i], 0xA5);
    for (int i = 0; i < 50; i++)
        VHD_CHECK_EQ(w1[i], 0x5A);
    /* and the other way round */
    r0[7] = 0x77;
    VHD_CHECK_EQ(((uint8_t *)iov[0].iov_base)[7], 0x77);

    VHD_CHECK(!vhd_vq_has_work(&f.vq));
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 8, &c), 0);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 123), 0);
    VHD_CHECK_EQ(f.vq.inflight, 0);
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 0); /* not flushed yet */
    vhd_vq_flush(&f.vq);

    /* the used element as the spec lays it out */
    if (packed) {
        struct vhd_vring_packed_desc *d = &f.dq.ring.packed.desc[0];
        uint16_t fl = vhd_le16(d->flags);
        VHD_CHECK_EQ(vhd_le16(d->id), c.id);
        VHD_CHECK_EQ(vhd_le32(d->len), 123);
        /* 2.8.1: used = AVAIL and USED both equal to the device wrap counter (1) */
        VHD_CHECK((fl & VRING_PACKED_DESC_F_AVAIL) && (fl & VRING_PACKED_DESC_F_USED));
        /* 2.8.4: WRITE in a used descriptor says data was written (len is valid) */
        VHD_CHECK(fl & VRING_DESC_F_WRITE);
    } else {
        VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->idx), 1);
        VHD_CHECK_EQ(vhd_le32(f.dq.ring.split.used->ring[0].id), c.id);
        VHD_CHECK_EQ(vhd_le32(f.dq.ring.split.used->ring[0].len), 123);
    }
    ck = NULL;
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
    VHD_CHECK(ck == &f);
    VHD_CHECK_EQ(len, 123);
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 0);
    VHD_CHECK_EQ(vhd_drv_vq_inflight(&f.dq), 0);

    /* read-only and write-only requests */
    VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, bufs, 1, 0, indirect, &r0), 0);
    VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, bufs + 2, 0, 2, indirect, &w0), 0);
    vhd_drv_vq_publish(&f.dq);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 8, &c), 1);
    VHD_CHECK_EQ(c.nr, 1);
    VHD_CHECK_EQ(c.nw, 0);
    VHD_CHECK_EQ(c.rlen, 100);
    VHD_CHECK_EQ(c.wlen, 0);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), 0);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 8, &c), 1);
    VHD_CHECK_EQ(c.nr, 0);
    VHD_CHECK_EQ(c.nw, 2);
    VHD_CHECK_EQ(c.wlen, 350);
    VHD_CHECK_EQ(iov[0].iov_len, 300);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 350), 0);
    vhd_vq_flush(&f.vq);
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
    VHD_CHECK(ck == &r0);
    VHD_CHECK_EQ(len, 0);
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
    VHD_CHECK(ck == &w0);
    VHD_CHECK_EQ(len, 350);
    VHD_CHECK_EQ(f.vq.error, 0);
    vqfx_teardown(&f);
}

BOTH(roundtrip_direct)
{
    roundtrip(packed, false, false);
}

BOTH(roundtrip_indirect)
{
    roundtrip(packed, false, true);
}

BOTH(roundtrip_uva)
{
    roundtrip(packed, true, false);
    roundtrip(packed, true, true);
}

/* =====================================================================
 * Index wrap-around, sizes, batches, out-of-order completion
 * ===================================================================== */

static void run_traffic(bool packed, uint32_t size, uint64_t nreq, bool indirect, bool uva,
                        bool event_idx)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = size,
                          .packed = packed,
                          .indirect = indirect,
                          .max_indirect = indirect ? 2 * TR_BUFS : 0,
                          .uva = uva,
                          .event_idx = event_idx};
    struct traffic t;
    uint32_t max_batch = size < 64 ? size : 64;

    rng_seed(size * 2654435761u + packed + 2 * indirect + 4 * uva);
    vqfx_setup(&f, &o);
    tr_init(&t, &f, indirect);
    uint32_t round = 0;
    while (t.completed < nreq) {
        /* now and then fill the whole ring in one batch */
        tr_round(&t, (round++ % 97) == 96 ? size : max_batch);
        if (rnd_below(50) == 0) {
            if (rnd() & 1)
                (void)vhd_vq_enable_notify(t.vq);
            else
                vhd_vq_disable_notify(t.vq);
        }
    }
    tr_drain(&t);
    if (!packed) {
        /* the used index followed every completion, modulo 2^16 */
        VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->idx), (uint16_t)t.completed);
        VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), (uint16_t)t.added);
    } else {
        uint32_t b = vhd_vq_get_base(&f.vq);
        uint64_t p = t.pop_pos;
        uint32_t enc = pos_slot(p, size) | (uint32_t)pos_wrap(p, size) << 15;
        VHD_CHECK_EQ(b & 0xffff, enc);
        VHD_CHECK_EQ(b >> 16, enc); /* nothing in flight: used position == avail position */
    }
    tr_fini(&t);
    vqfx_teardown(&f);
}

VHD_TEST(wrap_split)
{
    static const uint32_t sizes[] = {1, 2, 256, 32768};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(sizes); i++)
        run_traffic(false, sizes[i], 200000, false, false, i & 1);
}

VHD_TEST(wrap_packed)
{
    static const uint32_t sizes[] = {1, 2, 3, 100, 256, 32768};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(sizes); i++)
        run_traffic(true, sizes[i], 200000, false, false, i & 1);
}

BOTH(wrap_indirect_mixed)
{
    static const uint32_t sizes[] = {1, 2, 3, 16, 256};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(sizes); i++) {
        if (!packed && sizes[i] == 3)
            continue;
        run_traffic(packed, sizes[i], 70000, true, false, true);
    }
}

BOTH(wrap_uva)
{
    run_traffic(packed, packed ? 100 : 128, 70000, true, true, false);
}

/* =====================================================================
 * Batching: pushes are invisible until the flush
 * ===================================================================== */

BOTH(batch_flush)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 16, .packed = packed};
    struct traffic t;
    void *ck;
    uint32_t len;

    rng_seed(42);
    vqfx_setup(&f, &o);
    tr_init(&t, &f, false);
    for (int round = 0; round < 50; round++) {
        uint32_t n = tr_add(&t, 2 + rnd_below(6));
        vhd_drv_vq_publish(&f.dq);
        tr_pop_all(&t);
        VHD_CHECK_EQ(t.nheld, n);
        uint16_t used_before = packed ? 0 : vhd_le16(f.dq.ring.split.used->idx);
        tr_push(&t, n, round % 3);
        /* nothing visible before the flush */
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 0);
        if (!packed)
            VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->idx), used_before);
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 0);
        vhd_vq_flush(&f.vq);
        if (!packed)
            VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->idx), (uint16_t)(used_before + n));
        VHD_CHECK_EQ(tr_collect(&t), n);
        /* a flush with nothing pushed changes nothing */
        vhd_vq_flush(&f.vq);
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 0);
    }
    tr_drain(&t);
    tr_fini(&t);
    vqfx_teardown(&f);
}

/* =====================================================================
 * Indirect tables and region boundaries
 * ===================================================================== */

/* One chain through an indirect table of n one-byte readable entries. */
static void big_indirect(bool packed, uint32_t n, int expect_err)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 4, .packed = packed, .indirect = true};
    void *table;
    uint8_t *buf;
    struct vhd_vq_chain c;

    vqfx_setup(&f, &o);
    uint64_t tg = vqfx_alloc(&f, (uint64_t)n * 16, &table);
    uint64_t bg = vqfx_alloc(&f, 4096, (void **)&buf);
    for (uint32_t i = 0; i < 4096; i++)
        buf[i] = (uint8_t)(i * 7 + 3);
    for (uint32_t i = 0; i < n; i++) {
        if (packed)
            vqfx_ptable_desc(table, i, bg + i % 4096, 1, 0, 0);
        else
            vqfx_table_desc(table, i, bg + i % 4096, 1, i + 1 < n ? VRING_DESC_F_NEXT : 0,
                            (uint16_t)(i + 1));
    }
    if (packed) {
        uint16_t slot = 0;
        bool wrap = true;
        struct vqfx_pd d = {tg, n * 16, 2, VRING_DESC_F_INDIRECT};
        vqfx_packed_chain(&f, &slot, &wrap, &d, 1);
    } else {
        vqfx_split_desc(&f, 2, tg, n * 16, VRING_DESC_F_INDIRECT, 0);
        vqfx_split_post(&f, 2);
    }
    struct iovec *iov = xcalloc(n + 1, sizeof(*iov));
    int rc = vhd_vq_pop(&f.vq, iov, n + 1, &c);
    if (expect_err) {
        VHD_CHECK_EQ(rc, -expect_err);
        vqfx_expect_broken(&f, expect_err);
    } else {
        VHD_CHECK_EQ(rc, 1);
        VHD_CHECK_EQ(c.id, 2);
        VHD_CHECK_EQ(c.nr, n);
        VHD_CHECK_EQ(c.nw, 0);
        VHD_CHECK_EQ(c.rlen, n);
        VHD_CHECK_EQ(c.ndescs, 1);
        for (uint32_t i = 0; i < n; i++) {
            VHD_CHECK_EQ(iov[i].iov_len, 1);
            VHD_CHECK_EQ(*(uint8_t *)iov[i].iov_base, buf[i % 4096]);
        }
        VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), 0);
        vhd_vq_flush(&f.vq);
    }
    free(iov);
    vqfx_teardown(&f);
}

BOTH(indirect_large)
{
    big_indirect(packed, 1, 0);
    big_indirect(packed, 100, 0);
    /* larger than the queue (4): allowed up to VHD_VQ_MAX_INDIRECT */
    big_indirect(packed, VHD_VQ_MAX_INDIRECT, 0);
    big_indirect(packed, VHD_VQ_MAX_INDIRECT + 1, VHD_VQ_E_INDIRECT_LEN);
}

/* Buffers across two GPA-adjacent, separately mapped regions give two segments each. */
static void region_cross_one(bool packed, bool indirect)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8,
                          .packed = packed,
                          .indirect = true,
                          .max_indirect = 4,
                          .nregions = 2,
                          .region_size = 1 << 20};
    struct iovec iov[8];
    struct vhd_vq_chain c;
    void *ck;
    uint32_t len;

    vqfx_setup(&f, &o);
    uint64_t bnd = f.gm.r[1].gpa;
    VHD_CHECK_EQ(bnd, f.gm.r[0].gpa + f.gm.r[0].size);
    uint8_t *lo = vqfx_ptr(&f, bnd - 64, 64), *hi = vqfx_ptr(&f, bnd, 64);
    for (int i = 0; i < 64; i++) {
        lo[i] = (uint8_t)i;
        hi[i] = (uint8_t)(64 + i);
    }
    /*
     * readable [bnd-40, bnd+60), writable [bnd-10, bnd+22): both cross the boundary.
     * They overlap; the readable bytes are checked before the writable ones are written.
     */
    struct vhd_drv_buf bufs[2] = {{bnd - 40, 100}, {bnd - 10, 32}};
    VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, bufs, 1, 1, indirect, &f), 0);
    vhd_drv_vq_publish(&f.dq);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 8, &c), 1);
    VHD_CHECK_EQ(c.nr, 2);
    VHD_CHECK_EQ(c.nw, 2);
    VHD_CHECK_EQ(c.rlen, 100);
    VHD_CHECK_EQ(c.wlen, 32);
    VHD_CHECK_EQ(iov[0].iov_len, 40);
    VHD_CHECK_EQ(iov[1].iov_len, 60);
    VHD_CHECK_EQ(iov[2].iov_len, 10);
    VHD_CHECK_EQ(iov[3].iov_len, 22);
    VHD_CHECK(memcmp(iov[0].iov_base, lo + 24, 40) == 0);
    VHD_CHECK(memcmp(iov[1].iov_base, hi, 60) == 0);
    memset(iov[2].iov_base, 0xC1, 10);
    memset(iov[3].iov_base, 0xC2, 22);
    for (int i = 54; i < 64; i++)
        VHD_CHECK_EQ(lo[i], 0xC1);
    for (int i = 0; i < 22; i++)
        VHD_CHECK_EQ(hi[i], 0xC2);
    VHD_CHECK_EQ(hi[22], 64 + 22);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 32), 0);
    vhd_vq_flush(&f.vq);
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
    VHD_CHECK_EQ(len, 32);

    /* exactly enough iov entries: fine; one short: IOV_FULL */
    VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, bufs, 1, 1, indirect, &f), 0);
    vhd_drv_vq_publish(&f.dq);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), 0);
    vhd_vq_flush(&f.vq);
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
    VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, bufs, 1, 1, indirect, &f), 0);
    vhd_drv_vq_publish(&f.dq);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 3, &c), -VHD_VQ_E_IOV_FULL);
    vqfx_expect_broken(&f, VHD_VQ_E_IOV_FULL);
    vqfx_teardown(&f);
}

BOTH(region_cross)
{
    region_cross_one(packed, false);
    region_cross_one(packed, true);
}

/* =====================================================================
 * Notifications
 * ===================================================================== */

/* EVENT_IDX: need_notify == vring_need_event(used_event, new, old) (2.7.10). */
VHD_TEST(notify_event_idx_split)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 16, .event_idx = true};

    rng_seed(7);
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    advance(&f, buf, 65536 - 700, 16); /* cross 65535 during the loop */
    (void)vhd_vq_need_notify(&f.vq);   /* the first decision may be unconditional */
    uint16_t old = (uint16_t)(65536 - 700);
    for (int it = 0; it < 4000; it++) {
        uint32_t k = rnd_below(17);
        drv_add_k(&f, buf, k, 1);
        vhd_drv_vq_publish(&f.dq);
        VHD_CHECK_EQ(dev_serve(&f), k);
        uint16_t new_idx = (uint16_t)(old + k);
        VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->idx), new_idx);
        uint16_t cand[] = {(uint16_t)(old - 1),
                           old,
                           (uint16_t)(old + 1),
                           (uint16_t)(new_idx - 1),
                           new_idx,
                           (uint16_t)(new_idx + 1),
                           (uint16_t)(old + 0x8000),
                           (uint16_t)rnd()};
        uint16_t ev = cand[rnd_below(VHD_ARRAY_SIZE(cand))];
        *vqfx_split_used_event(&f) = vhd_le16(ev);
        /* 2.7.10: with EVENT_IDX the device MUST ignore the NO_INTERRUPT bit */
        f.dq.ring.split.avail->flags = vhd_le16(rnd() & 1 ? VRING_AVAIL_F_NO_INTERRUPT : 0);
        bool exp = in_window16(ev, old, new_idx);
        bool got = vhd_vq_need_notify(&f.vq);
        if (got != exp)
            fprintf(stderr, "  old=%u new=%u used_event=%u: need_notify %d, expected %d\n", old,
                    new_idx, ev, got, exp);
        VHD_CHECK_EQ(got, exp);
        VHD_CHECK_EQ(drv_collect(&f), k);
        old = new_idx;
    }
    vqfx_teardown(&f);
}

/* Without EVENT_IDX: notify unless NO_INTERRUPT; used_event is ignored. */
VHD_TEST(notify_flags_split)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8};

    rng_seed(8);
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    for (int it = 0; it < 2000; it++) {
        uint32_t k = 1 + rnd_below(8);
        drv_add_k(&f, buf, k, 1);
        vhd_drv_vq_publish(&f.dq);
        VHD_CHECK_EQ(dev_serve(&f), k);
        uint16_t fl = rnd() & 1 ? VRING_AVAIL_F_NO_INTERRUPT : 0;
        f.dq.ring.split.avail->flags = vhd_le16(fl);
        *vqfx_split_used_event(&f) = (uint16_t)rnd();
        VHD_CHECK_EQ(vhd_vq_need_notify(&f.vq), !fl);
        VHD_CHECK_EQ(drv_collect(&f), k);
    }
    vqfx_teardown(&f);
}

/* Packed DESC mode: notify iff (off, wrap) names a slot used since the last decision. */
static void notify_desc_packed(uint32_t size)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = size, .packed = true, .event_idx = true};

    rng_seed(size);
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    struct vhd_vring_packed_event *drv = f.dq.ring.packed.driver;
    drv->flags = vhd_le16(VRING_PACKED_EVENT_FLAG_DESC);
    drv->off_wrap = vhd_le16(0);
    (void)vhd_vq_need_notify(&f.vq); /* the first decision may be unconditional */
    uint64_t old = 0;
    for (int it = 0; it < 4000; it++) {
        uint32_t ndesc = 1 + rnd_below(size >= 2 ? 2 : 1);
        uint32_t k = rnd_below(size / ndesc + 1);
        drv_add_k(&f, buf, k, ndesc);
        vhd_drv_vq_publish(&f.dq);
        VHD_CHECK_EQ(dev_serve(&f), k);
        uint64_t new_pos = old + (uint64_t)k * ndesc;
        uint64_t e;
        switch (rnd_below(8)) {
        case 0:
            e = old;
            break;
        case 1:
            e = old + 1;
            break;
        case 2:
            e = new_pos ? new_pos - 1 : 0;
            break;
        case 3:
            e = new_pos;
            break;
        case 4:
            e = new_pos + 1;
            break;
        case 5:
            e = old >= size ? old - size : 0;
            break; /* one lap back: same slot */
        case 6:
            e = new_pos + size - 1;
            break; /* next lap */
        default:
            e = old + rnd_below(3 * size);
            break;
        }
        uint16_t off = pos_slot(e, size);
        bool w = pos_wrap(e, size);
        if (rnd_below(6) == 0) {
            off = (uint16_t)rnd_below(size);
            w = rnd() & 1;
        }
        drv->off_wrap = vhd_le16((uint16_t)(off | (uint16_t)w << VRING_PACKED_EVENT_WRAP_SHIFT));
        bool exp = in_window_packed(off, w, old, new_pos, size);
        bool got = vhd_vq_need_notify(&f.vq);
        if (got != exp)
            fprintf(stderr,
                    "  size=%u used positions [%llu,%llu) event off=%u wrap=%d: "
                    "need_notify %d, expected %d\n",
                    size, (unsigned long long)old, (unsigned long long)new_pos, off, w, got, exp);
        VHD_CHECK_EQ(got, exp);
        VHD_CHECK_EQ(drv_collect(&f), k);
        old = new_pos;
    }
    vqfx_teardown(&f);
}

VHD_TEST(notify_event_idx_packed)
{
    notify_desc_packed(5);
    notify_desc_packed(8);
    notify_desc_packed(1);
}

/* Packed ENABLE / DISABLE modes, with and without EVENT_IDX. */
VHD_TEST(notify_flags_packed)
{
    for (int ei = 0; ei < 2; ei++) {
        struct vqfx f;
        struct vqfx_opts o = {.size = 7, .packed = true, .event_idx = ei};
        rng_seed(9 + ei);
        vqfx_setup(&f, &o);
        uint64_t buf = vqfx_alloc(&f, 4096, NULL);
        struct vhd_vring_packed_event *drv = f.dq.ring.packed.driver;
        for (int it = 0; it < 2000; it++) {
            uint32_t k = 1 + rnd_below(7);
            drv_add_k(&f, buf, k, 1);
            vhd_drv_vq_publish(&f.dq);
            VHD_CHECK_EQ(dev_serve(&f), k);
            bool dis = rnd() & 1;
            drv->flags =
                vhd_le16(dis ? VRING_PACKED_EVENT_FLAG_DISABLE : VRING_PACKED_EVENT_FLAG_ENABLE);
            drv->off_wrap = (uint16_t)rnd();
            VHD_CHECK_EQ(vhd_vq_need_notify(&f.vq), !dis);
            VHD_CHECK_EQ(drv_collect(&f), k);
        }
        vqfx_teardown(&f);
    }
}

/* Driver kick decisions against avail_event (split, EVENT_IDX). */
VHD_TEST(kick_event_idx_split)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 16, .event_idx = true};

    rng_seed(10);
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    advance(&f, buf, 65536 - 500, 16);
    (void)vhd_drv_vq_kick_needed(&f.dq); /* sync the driver's "last kick" point */
    uint16_t old = (uint16_t)(65536 - 500);
    for (int it = 0; it < 4000; it++) {
        uint32_t k = rnd_below(17);
        drv_add_k(&f, buf, k, 1);
        vhd_drv_vq_publish(&f.dq);
        uint16_t new_idx = (uint16_t)(old + k);
        VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.avail->idx), new_idx);
        uint16_t cand[] = {(uint16_t)(old - 1),
                           old,
                           (uint16_t)(old + 1),
                           (uint16_t)(new_idx - 1),
                           new_idx,
                           (uint16_t)(new_idx + 1),
                           (uint16_t)(old + 0x8000),
                           (uint16_t)rnd()};
        uint16_t ev = cand[rnd_below(VHD_ARRAY_SIZE(cand))];
        *vqfx_split_avail_event(&f) = vhd_le16(ev);
        /* with EVENT_IDX the driver MUST ignore NO_NOTIFY (2.7.10) */
        f.dq.ring.split.used->flags = vhd_le16(rnd() & 1 ? VRING_USED_F_NO_NOTIFY : 0);
        bool exp = in_window16(ev, old, new_idx);
        bool got = vhd_drv_vq_kick_needed(&f.dq);
        if (got != exp)
            fprintf(stderr, "  old=%u new=%u avail_event=%u: kick %d, expected %d\n", old, new_idx,
                    ev, got, exp);
        VHD_CHECK_EQ(got, exp);
        f.dq.ring.split.used->flags = 0;
        VHD_CHECK_EQ(dev_serve(&f), k);
        VHD_CHECK_EQ(drv_collect(&f), k);
        old = new_idx;
    }
    vqfx_teardown(&f);
}

VHD_TEST(kick_flags_split)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8};

    rng_seed(11);
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    for (int it = 0; it < 2000; it++) {
        uint32_t k = 1 + rnd_below(8);
        drv_add_k(&f, buf, k, 1);
        vhd_drv_vq_publish(&f.dq);
        uint16_t fl = rnd() & 1 ? VRING_USED_F_NO_NOTIFY : 0;
        f.dq.ring.split.used->flags = vhd_le16(fl);
        *vqfx_split_avail_event(&f) = (uint16_t)rnd(); /* ignored without EVENT_IDX */
        VHD_CHECK_EQ(vhd_drv_vq_kick_needed(&f.dq), !fl);
        f.dq.ring.split.used->flags = 0;
        VHD_CHECK_EQ(dev_serve(&f), k);
        VHD_CHECK_EQ(drv_collect(&f), k);
    }
    vqfx_teardown(&f);
}

/* Driver kick decisions against the packed device event area. */
static void kick_packed(uint32_t size, bool event_idx)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = size, .packed = true, .event_idx = event_idx};

    rng_seed(12 + size);
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    struct vhd_vring_packed_event *dev = f.dq.ring.packed.device;
    uint64_t old = 0;
    for (int it = 0; it < 4000; it++) {
        uint32_t ndesc = 1 + rnd_below(size >= 2 ? 2 : 1);
        uint32_t k = rnd_below(size / ndesc + 1);
        int mode = event_idx ? (int)rnd_below(4) : (int)rnd_below(2);
        uint64_t new_pos = old + (uint64_t)k * ndesc;
        drv_add_k(&f, buf, k, ndesc);
        vhd_drv_vq_publish(&f.dq);
        bool exp;
        if (mode >= 2) {
            uint64_t e;
            switch (rnd_below(6)) {
            case 0:
                e = old;
                break;
            case 1:
                e = new_pos ? new_pos - 1 : 0;
                break;
            case 2:
                e = new_pos;
                break;
            case 3:
                e = old >= size ? old - size : 0;
                break;
            default:
                e = old + rnd_below(3 * size);
                break;
            }
            uint16_t off = pos_slot(e, size);
            bool w = pos_wrap(e, size);
            dev->flags = vhd_le16(VRING_PACKED_EVENT_FLAG_DESC);
            dev->off_wrap =
                vhd_le16((uint16_t)(off | (uint16_t)w << VRING_PACKED_EVENT_WRAP_SHIFT));
            exp = in_window_packed(off, w, old, new_pos, size);
        } else {
            dev->flags =
                vhd_le16(mode ? VRING_PACKED_EVENT_FLAG_DISABLE : VRING_PACKED_EVENT_FLAG_ENABLE);
            dev->off_wrap = (uint16_t)rnd();
            exp = !mode && k > 0;
            if (!mode && k == 0) {
                /* nothing published: either answer is acceptable */
                (void)vhd_drv_vq_kick_needed(&f.dq);
                old = new_pos;
                continue;
            }
        }
        bool got = vhd_drv_vq_kick_needed(&f.dq);
        if (got != exp)
            fprintf(stderr,
                    "  size=%u avail positions [%llu,%llu) flags=%u off_wrap=0x%x: kick %d, "
                    "expected %d\n",
                    size, (unsigned long long)old, (unsigned long long)new_pos,
                    vhd_le16(dev->flags), vhd_le16(dev->off_wrap), got, exp);
        VHD_CHECK_EQ(got, exp);
        dev->flags = vhd_le16(VRING_PACKED_EVENT_FLAG_DISABLE);
        VHD_CHECK_EQ(dev_serve(&f), k);
        VHD_CHECK_EQ(drv_collect(&f), k);
        old = new_pos;
    }
    vqfx_teardown(&f);
}

VHD_TEST(kick_event_idx_packed)
{
    kick_packed(5, true);
    kick_packed(8, true);
    kick_packed(1, true);
}

VHD_TEST(kick_flags_packed)
{
    kick_packed(6, false);
}

/* The device's enable/disable as the driver sees them (avail_event / device area). */
static void enable_disable(bool packed, bool event_idx)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .packed = packed, .event_idx = event_idx};
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    uint32_t kicks = 0;

    /* Polling: the device disabled notifications; at most one stale kick (EVENT_IDX). */
    advance(&f, buf, 5, 5);
    (void)vhd_drv_vq_kick_needed(&f.dq);
    vhd_vq_disable_notify(&f.vq);
    if (packed) {
        VHD_CHECK_EQ(vhd_le16(f.dq.ring.packed.device->flags), VRING_PACKED_EVENT_FLAG_DISABLE);
    } else if (event_idx) {
        VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->flags), 0); /* 2.7.10: MUST be 0 */
    } else {
        VHD_CHECK(vhd_le16(f.dq.ring.split.used->flags) & VRING_USED_F_NO_NOTIFY);
    }
    for (int i = 0; i < 20; i++) {
        drv_add_k(&f, buf, 1 + (uint32_t)i % 3, 1);
        vhd_drv_vq_publish(&f.dq);
        kicks += vhd_drv_vq_kick_needed(&f.dq);
        dev_serve(&f);
        drv_collect(&f);
    }
    VHD_CHECK(kicks <= (packed || !event_idx ? 0u : 1u));

    /* Sleeping: enable (ring empty: nothing slipped in), then every publish kicks. */
    for (int i = 0; i < 20; i++) {
        VHD_CHECK(!vhd_vq_enable_notify(&f.vq));
        if (packed) {
            uint16_t fl = vhd_le16(f.dq.ring.packed.device->flags);
            if (fl == VRING_PACKED_EVENT_FLAG_DESC) {
                VHD_CHECK(event_idx);
                /* must name the next slot the driver will fill */
                uint16_t ow = vhd_le16(f.dq.ring.packed.device->off_wrap);
                uint16_t want =
                    (uint16_t)(f.vq.last_avail_idx | (uint16_t)f.vq.avail_wrap
                                                         << VRING_PACKED_EVENT_WRAP_SHIFT);
                VHD_CHECK_EQ(ow, want);
            } else {
                VHD_CHECK_EQ(fl, VRING_PACKED_EVENT_FLAG_ENABLE);
            }
        } else if (event_idx) {
            VHD_CHECK_EQ(vhd_le16(*vqfx_split_avail_event(&f)),
                         vhd_le16(f.dq.ring.split.avail->idx));
            VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->flags), 0);
        } else {
            VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->flags) & VRING_USED_F_NO_NOTIFY, 0);
        }
        drv_add_k(&f, buf, 1, 1);
        vhd_drv_vq_publish(&f.dq);
        VHD_CHECK(vhd_drv_vq_kick_needed(&f.dq));
        if (i & 1) {
            /* a second publish before the device ran: EVENT_IDX says no kick (split) */
            drv_add_k(&f, buf, 1, 1);
            vhd_drv_vq_publish(&f.dq);
            bool k2 = vhd_drv_vq_kick_needed(&f.dq);
            if (!packed)
                VHD_CHECK_EQ(k2, !event_idx);
        }
        dev_serve(&f);
        drv_collect(&f);
    }
    vqfx_teardown(&f);
}

BOTH(notify_enable_disable)
{
    enable_disable(packed, false);
    enable_disable(packed, true);
}

/* "Enable, then check again": work published before the enable must be reported. */
static void enable_recheck(bool packed, bool event_idx)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .packed = packed, .event_idx = event_idx};
    struct iovec iov[4];
    struct vhd_vq_chain c;

    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    for (int round = 0; round < 12; round++) { /* several rounds: cross the ring end */
        /* empty ring */
        VHD_CHECK(!vhd_vq_enable_notify(&f.vq));
        VHD_CHECK(!vhd_vq_enable_notify(&f.vq));
        /* published but not yet popped */
        vhd_vq_disable_notify(&f.vq);
        drv_add_k(&f, buf, 1, 1);
        vhd_drv_vq_publish(&f.dq);
        VHD_CHECK(vhd_vq_enable_notify(&f.vq));
        VHD_CHECK(vhd_vq_has_work(&f.vq)); /* enable must not consume it */
        VHD_CHECK_EQ(dev_serve(&f), 1);
        VHD_CHECK(!vhd_vq_enable_notify(&f.vq));
        /* pop saw nothing, then the driver published, then enable */
        vhd_vq_disable_notify(&f.vq);
        VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 0);
        drv_add_k(&f, buf, 1, 1);
        vhd_drv_vq_publish(&f.dq);
        VHD_CHECK(vhd_vq_enable_notify(&f.vq));
        /* two published, one popped: still work */
        vhd_vq_disable_notify(&f.vq);
        drv_add_k(&f, buf, 1, 1);
        vhd_drv_vq_publish(&f.dq);
        VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
        VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), 0);
        VHD_CHECK(vhd_vq_enable_notify(&f.vq));
        VHD_CHECK_EQ(dev_serve(&f), 1);
        VHD_CHECK(!vhd_vq_enable_notify(&f.vq));
        VHD_CHECK_EQ(drv_collect(&f), 3);
    }
    vqfx_teardown(&f);
}

BOTH(notify_enable_recheck)
{
    enable_recheck(packed, false);
    enable_recheck(packed, true);
}

/* The driver's enable_cb re-check: true when used elements are already pending. */
BOTH(driver_enable_cb)
{
    for (int ei = 0; ei < 2; ei++) {
        struct vqfx f;
        struct vqfx_opts o = {.size = 4, .packed = packed, .event_idx = ei};
        vqfx_setup(&f, &o);
        uint64_t buf = vqfx_alloc(&f, 4096, NULL);
        for (int i = 0; i < 10; i++) {
            vhd_drv_vq_disable_cb(&f.dq);
            drv_add_k(&f, buf, 1, 1);
            vhd_drv_vq_publish(&f.dq);
            VHD_CHECK(!vhd_drv_vq_enable_cb(&f.dq));
            vhd_drv_vq_disable_cb(&f.dq);
            dev_serve(&f);
            VHD_CHECK(vhd_drv_vq_enable_cb(&f.dq));
            VHD_CHECK_EQ(drv_collect(&f), 1);
            VHD_CHECK(!vhd_drv_vq_enable_cb(&f.dq));
            /* with interrupts enabled, the device must notify for the next completion */
            drv_add_k(&f, buf, 1, 1);
            vhd_drv_vq_publish(&f.dq);
            dev_serve(&f);
            VHD_CHECK(vhd_vq_need_notify(&f.vq));
            VHD_CHECK_EQ(drv_collect(&f), 1);
        }
        vqfx_teardown(&f);
    }
}

/* =====================================================================
 * Ring state: GET/SET_VRING_BASE
 * ===================================================================== */

VHD_TEST(base_encoding_split)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .no_start = true};
    vqfx_setup(&f, &o);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), 0);
    rng_seed(13);
    for (int i = 0; i < 1000; i++) {
        uint32_t v = i < 3 ? (uint32_t)(i ? 0xffff : 0) : (uint16_t)rnd();
        VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, v), 0);
        VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), v);
    }
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 0x10000), -EINVAL);
    vqfx_teardown(&f);
}

VHD_TEST(base_encoding_packed)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 100, .packed = true, .no_start = true};
    vqfx_setup(&f, &o);
    /* initial state: both positions 0, both wrap counters 1 (2.8.1) */
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), 0x80008000u);
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 5u | 1u << 15 | (3u | 1u << 15) << 16), 0);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), 5u | 1u << 15 | (3u | 1u << 15) << 16);
    /* upper half zero: used position = avail position */
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 5), 0);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), 5u | 5u << 16);
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 99u | 1u << 15), 0);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), (99u | 1u << 15) * 0x10001u);
    rng_seed(14);
    for (int i = 0; i < 2000; i++) {
        uint32_t a = rnd_below(100), u = rnd_below(100);
        uint32_t v = a | (rnd() & 1) << 15 | (u | (rnd() & 1) << 15) << 16;
        if ((v >> 16) == 0)
            continue;
        VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, v), 0);
        VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), v);
    }
    /* out-of-range slots */
    uint32_t good = vhd_vq_get_base(&f.vq);
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 100), -EINVAL);
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 0x7fff | 1u << 15), -EINVAL);
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 5u | 100u << 16), -EINVAL);
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 5u | 0xffffu << 16), -EINVAL);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), good); /* a rejected base changes nothing */
    vqfx_teardown(&f);
}

/* get_base with chains in flight: packed keeps the used position separately. */
BOTH(base_inflight)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .packed = packed};
    struct iovec iov[4];
    struct vhd_vq_chain c[3];

    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    advance(&f, buf, 10, 4); /* position 10: slot 2, wrap 0 */
    drv_add_k(&f, buf, 3, 1);
    vhd_drv_vq_publish(&f.dq);
    for (int i = 0; i < 3; i++)
        VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c[i]), 1);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c[0], 0), 0);
    vhd_vq_flush(&f.vq);
    if (packed)
        VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), 5u | 3u << 16);
    else
        VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), 13);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c[2], 0), 0);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c[1], 0), 0);
    vhd_vq_flush(&f.vq);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), packed ? (5u | 5u << 16) : 13u);
    /* go around once more: wrap counters back to 1 */
    VHD_CHECK_EQ(drv_collect(&f), 3);
    advance(&f, buf, 8, 3);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), packed ? (5u | 1u << 15) * 0x10001u : 21u);
    vqfx_teardown(&f);
}

/* set_base positions the device: it pops at that slot/wrap and uses from there. */
VHD_TEST(base_set_position_packed)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .packed = true, .no_start = true};
    struct iovec iov[4];
    struct vhd_vq_chain c;

    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 5), 0); /* slot 5, wrap 0, used the same */
    VHD_CHECK_EQ(vhd_vq_start(&f.vq), 0);
    /* slot 0 "available" for wrap 1 must not be taken: the device is at slot 5 */
    vqfx_packed_desc(&f, 0, buf, 16, 1, vqfx_pavail(true));
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 0);
    /* slot 5 available with wrap 0 */
    vqfx_packed_desc(&f, 5, buf, 16, 6, vqfx_pavail(false) | VRING_DESC_F_WRITE);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
    VHD_CHECK_EQ(c.id, 6);
    VHD_CHECK_EQ(c.nw, 1);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 9), 0);
    vhd_vq_flush(&f.vq);
    struct vhd_vring_packed_desc *d = &f.dq.ring.packed.desc[5];
    VHD_CHECK_EQ(vhd_le16(d->id), 6);
    VHD_CHECK_EQ(vhd_le32(d->len), 9);
    /* used with device wrap counter 0: AVAIL and USED both clear */
    VHD_CHECK_EQ(vhd_le16(d->flags) & (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED), 0);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), 6u | 6u << 16);
    vqfx_teardown(&f);
}

VHD_TEST(base_set_position_split)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .no_start = true};
    struct iovec iov[4];
    struct vhd_vq_chain c;

    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    f.dq.ring.split.used->idx = vhd_le16(1000); /* the used index lives in the ring */
    f.dq.ring.split.avail->idx = vhd_le16(1000);
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 1000), 0);
    VHD_CHECK_EQ(vhd_vq_start(&f.vq), 0);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 0);
    vqfx_split_desc(&f, 3, buf, 16, 0, 0);
    vqfx_split_post(&f, 3);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
    VHD_CHECK_EQ(c.id, 3);
    VHD_CHECK_EQ(c.rlen, 16);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), 0);
    vhd_vq_flush(&f.vq);
    VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->idx), 1001);
    VHD_CHECK_EQ(vhd_le32(f.dq.ring.split.used->ring[1000 & 7].id), 3);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), 1001);
    vqfx_teardown(&f);
}

/* Stop mid-stream, hand the ring to a fresh vq through get/set_base, continue. */
BOTH(base_resume)
{
    struct vqfx f;
    uint32_t size = packed ? 5 : 8;
    struct vqfx_opts o = {.size = size, .packed = packed, .event_idx = true};
    struct traffic t;

    rng_seed(15 + packed);
    vqfx_setup(&f, &o);
    tr_init(&t, &f, false);
    t.single = true; /* single-descriptor requests: 3 fit in any state below */
    while (t.completed < 23)
        tr_round(&t, 3);
    tr_drain(&t);
    /* 3 published; the old device takes 2 of them and completes them */
    VHD_CHECK_EQ(tr_add(&t, 3), 3);
    vhd_drv_vq_publish(&f.dq);
    VHD_CHECK_EQ(tr_pop(&t, 2), 2);
    tr_push(&t, 2, 1);
    vhd_vq_flush(&f.vq);
    tr_collect(&t);
    uint32_t b = vhd_vq_get_base(&f.vq);
    if (packed) {
        uint32_t enc = pos_slot(t.pop_pos, size) | (uint32_t)pos_wrap(t.pop_pos, size) << 15;
        VHD_CHECK_EQ(b, enc | enc << 16);
    } else {
        VHD_CHECK_EQ(b, (uint16_t)t.pop_pos);
    }

    struct vhd_vq *nv = aligned_alloc(64, sizeof(*nv));
    VHD_CHECK(nv != NULL);
    memset(nv, 0x5A, sizeof(*nv));
    VHD_CHECK_EQ(vhd_vq_init(nv, &f.params, f.mem), 0);
    VHD_CHECK_EQ(vhd_vq_set_base(nv, b), 0);
    VHD_CHECK_EQ(vhd_vq_start(nv), 0);
    memset(&f.vq, 0xA5, sizeof(f.vq)); /* the old queue is gone */
    t.vq = nv;
    VHD_CHECK_EQ(vhd_vq_get_base(nv), b);
    /* the one left over comes out first, exactly once */
    tr_pop_all(&t);
    VHD_CHECK_EQ(t.nheld, 1);
    while (t.completed < 70000)
        tr_round(&t, 4);
    tr_drain(&t);
    tr_fini(&t);
    free(nv);
    vqfx_teardown(&f);
}

/* =====================================================================
 * Ring address translation ("metadata acceleration")
 * ===================================================================== */

BOTH(meta_invalidate)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 16, .packed = packed};
    struct traffic t;

    rng_seed(16);
    vqfx_setup(&f, &o);
    tr_init(&t, &f, false);
    VHD_CHECK(f.vq.rings_ok);
    for (int i = 0; i < 200; i++) {
        tr_add(&t, 1 + rnd_below(4));
        vhd_drv_vq_publish(&f.dq);
        if (i & 1)
            vhd_vq_invalidate(&f.vq);
        tr_pop_all(&t);
        VHD_CHECK(f.vq.rings_ok);
        /* invalidate between pop and push */
        vhd_vq_invalidate(&f.vq);
        VHD_CHECK(!f.vq.rings_ok);
        tr_push(&t, t.nheld, 2);
        vhd_vq_invalidate(&f.vq);
        vhd_vq_flush(&f.vq);
        VHD_CHECK(f.vq.rings_ok);
        if (i % 3 == 0)
            vhd_vq_invalidate(&f.vq);
        (void)vhd_vq_need_notify(&f.vq);
        tr_collect(&t);
    }
    tr_drain(&t);
    tr_fini(&t);
    vqfx_teardown(&f);
}

/* A new table over the same memfds (new mappings); the old one is unmapped. */
static void set_mem(bool packed, bool uva)
{
    struct vqfx f;
    struct vqfx_opts o = {
        .size = 16, .packed = packed, .uva = uva, .nregions = 2, .region_size = 8 << 20};
    struct traffic t;

    rng_seed(17);
    vqfx_setup(&f, &o);
    tr_init(&t, &f, false);
    for (int gen = 0; gen < 6; gen++) {
        for (int i = 0; i < 50; i++)
            tr_round(&t, 6);
        /* switch with chains in flight */
        tr_add(&t, 3);
        vhd_drv_vq_publish(&f.dq);
        tr_pop_all(&t);
        struct vhd_mem *m2 = vqfx_new_mem(&f);
        vhd_vq_set_mem(&f.vq, m2);
        VHD_CHECK(!f.vq.rings_ok);
        vhd_mem_free(f.mem); /* unmaps the old mapping: stale pointers would fault */
        f.mem = m2;
        tr_push(&t, t.nheld, 2);
        vhd_vq_flush(&f.vq);
        tr_collect(&t);
        VHD_CHECK(f.vq.mem == m2);
        VHD_CHECK(f.vq.rings_ok);
    }
    tr_drain(&t);
    tr_fini(&t);
    vqfx_teardown(&f);
}

BOTH(meta_set_mem)
{
    set_mem(packed, false);
    set_mem(packed, true);
}

/* A table without the region that holds the rings: the next verb breaks the queue. */
BOTH(meta_set_mem_rings_gone)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 16, .packed = packed, .nregions = 2, .region_size = 1 << 20};
    struct iovec iov[4];
    struct vhd_vq_chain c;

    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    advance(&f, buf, 3, 3);
    struct vhd_mem *m2 = NULL;
    VHD_CHECK_EQ(vhd_mem_remove(f.mem, f.gm.r[0].gpa, f.gm.r[0].size,
                                (uint64_t)(uintptr_t)f.gm.r[0].hva, &m2),
                 0);
    vhd_vq_set_mem(&f.vq, m2);
    drv_add_k(&f, buf, 1, 1);
    vhd_drv_vq_publish(&f.dq);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), -VHD_VQ_E_RING_ADDR);
    vqfx_expect_broken(&f, VHD_VQ_E_RING_ADDR);
    vhd_mem_free(m2);
    vqfx_teardown(&f);
}

/* Rings (partly) outside guest memory: start fails, queue broken, no crash. */
static void ring_outside(bool packed, bool uva, int part, uint64_t where)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8,
                          .packed = packed,
                          .uva = uva,
                          .no_start = true,
                          .nregions = 2,
                          .region_size = 1 << 20,
                          .gap = 1 << 20};
    struct iovec iov[4];
    struct vhd_vq_chain c;

    vqfx_setup(&f, &o);
    struct vhd_vq_params p = f.params;
    uint64_t *a = part == 0 ? &p.desc : part == 1 ? &p.avail : &p.used;
    *a = where;
    VHD_CHECK_EQ(vhd_vq_init(&f.vq, &p, f.mem), 0);
    VHD_CHECK_EQ(vhd_vq_start(&f.vq), -EFAULT);
    VHD_CHECK_EQ(f.vq.error, VHD_VQ_E_RING_ADDR);
    VHD_CHECK(!f.vq.rings_ok);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), -VHD_VQ_E_RING_ADDR);
    VHD_CHECK(!vhd_vq_has_work(&f.vq));
    VHD_CHECK(!vhd_vq_need_notify(&f.vq));
    VHD_CHECK(!vhd_vq_enable_notify(&f.vq));
    vhd_vq_disable_notify(&f.vq);
    vhd_vq_flush(&f.vq);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), -VHD_VQ_E_RING_ADDR);
    vqfx_teardown(&f);
}

BOTH(meta_rings_outside)
{
    uint64_t r0end = VQFX_BASE_GPA + (1 << 20), r1end = r0end + (2 << 20);
    for (int part = 0; part < 3; part++) {
        uint64_t where[] = {
            r1end + 4096,    /* beyond the end */
            r1end - 16,      /* straddles the end (every split part is > 16 bytes) */
            r0end + 4096,    /* in the gap between the regions */
            r0end - 16,      /* starts in region 0, ends in the gap */
            0x1000,          /* below the first region */
            UINT64_MAX - 15, /* wraps around */
        };
        for (unsigned i = 0; i < VHD_ARRAY_SIZE(where); i++) {
            /* a 4-byte packed event area cannot straddle a page end at a 4-aligned address */
            if (packed && part && (i == 1 || i == 3))
                continue;
            ring_outside(packed, false, part, where[i]);
        }
        /* front-end VA mode: an address in no region's UVA range */
        ring_outside(packed, true, part, 0x1000);
        ring_outside(packed, true, part, UINT64_MAX - 15);
    }
}

BOTH(meta_no_mem)
{
    /* a queue started before any memory table exists cannot map its rings */
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .packed = packed, .no_start = true};
    vqfx_setup(&f, &o);
    VHD_CHECK_EQ(vhd_vq_init(&f.vq, &f.params, NULL), 0);
    VHD_CHECK_EQ(vhd_vq_start(&f.vq), -EFAULT);
    VHD_CHECK_EQ(f.vq.error, VHD_VQ_E_RING_ADDR);
    vqfx_teardown(&f);
}

VHD_TEST(init_rejects)
{
    struct vhd_vq *vq = aligned_alloc(64, sizeof(*vq));
    VHD_CHECK(vq != NULL);
    struct vhd_vq_params p = {
        .size = 8, .addr_is_gpa = true, .desc = 0x1000, .avail = 0x2000, .used = 0x3000};
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), 0);
    static const uint32_t bad_split[] = {0, 3, 6, 100, 32767, 32769, 65536, 0xffffffffu};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(bad_split); i++) {
        p.size = bad_split[i];
        VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), -EINVAL);
    }
    static const uint32_t good_split[] = {1, 2, 4, 256, 32768};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(good_split); i++) {
        p.size = good_split[i];
        VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), 0);
        VHD_CHECK_EQ(vq->size, good_split[i] & 0xffff);
    }
    p.packed = true;
    static const uint32_t bad_packed[] = {0, 32769, 65536};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(bad_packed); i++) {
        p.size = bad_packed[i];
        VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), -EINVAL);
    }
    static const uint32_t good_packed[] = {1, 3, 100, 32767, 32768};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(good_packed); i++) {
        p.size = good_packed[i];
        VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), 0);
    }
    /* alignment: desc 16; split avail 2, used 4; packed event areas 4 */
    p.size = 8;
    p.packed = false;
    p.desc = 0x1008;
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), -EINVAL);
    p.desc = 0x1000;
    p.avail = 0x2001;
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), -EINVAL);
    p.avail = 0x2002;
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), 0);
    p.used = 0x3002;
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), -EINVAL);
    p.used = 0x3004;
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), 0);
    p.packed = true;
    p.avail = 0x2002;
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), -EINVAL);
    p.avail = 0x2004;
    p.used = 0x3002;
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), -EINVAL);
    p.used = 0x3004;
    p.desc = 0x1004;
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), -EINVAL);
    p.desc = 0x1000;
    VHD_CHECK_EQ(vhd_vq_init(vq, &p, NULL), 0);
    VHD_CHECK_EQ(vq->size, 8);
    VHD_CHECK(vq->packed);
    VHD_CHECK_EQ(vq->error, 0);
    free(vq);
}

VHD_TEST(strerror_distinct)
{
    for (int i = 0; i < VHD_VQ_E__COUNT; i++) {
        const char *s = vhd_vq_strerror(i);
        VHD_CHECK(s != NULL);
        VHD_CHECK(s[0] != 0);
        VHD_CHECK(vhd_vq_strerror(-i) == s);
        for (int j = 0; j < i; j++)
            VHD_CHECK(strcmp(s, vhd_vq_strerror(j)) != 0);
    }
    VHD_CHECK(vhd_vq_strerror(VHD_VQ_E__COUNT) != NULL);
    VHD_CHECK(vhd_vq_strerror(1000) != NULL);
    VHD_CHECK(vhd_vq_strerror(-1000) != NULL);
}

/* =====================================================================
 * Malformed descriptors: each its own error, the queue stays broken
 * ===================================================================== */

/* Fixture for forging: size 8 (or size), indirect negotiated unless told. */
static uint64_t mal_setup(struct vqfx *f, bool packed, bool indirect, uint32_t size)
{
    struct vqfx_opts o = {.size = size, .packed = packed, .indirect = indirect};
    vqfx_setup(f, &o);
    return vqfx_alloc(f, 4096, NULL);
}

/* Publish a forged chain (packed: at slot 0 with wrap 1; split: head 0). */
static void mal_chain(struct vqfx *f, const struct vqfx_pd *d, uint32_t n)
{
    if (f->o.packed) {
        uint16_t slot = 0;
        bool wrap = true;
        vqfx_packed_chain(f, &slot, &wrap, d, n);
    } else {
        for (uint32_t i = 0; i < n; i++)
            vqfx_split_desc(f, (uint16_t)i, d[i].addr, d[i].len, d[i].flags, (uint16_t)(i + 1));
        vqfx_split_post(f, 0);
    }
}

/* Pop must fail with err; then everything stays broken. */
static void mal_expect(struct vqfx *f, uint32_t max_iov, int err)
{
    struct iovec *iov = xcalloc(max_iov + 1, sizeof(*iov));
    struct vhd_vq_chain c;
    int rc = vhd_vq_pop(&f->vq, iov, max_iov, &c);
    if (rc != -err)
        fprintf(stderr, "  pop returned %d (%s), expected %d (%s)\n", rc,
                rc > 0 ? "a chain" : vhd_vq_strerror(rc), -err, vhd_vq_strerror(err));
    VHD_CHECK_EQ(rc, -err);
    free(iov);
    vqfx_expect_broken(f, err);
}

/* Pop must succeed with the given shape. */
static void mal_expect_ok(struct vqfx *f, uint32_t max_iov, uint32_t nr, uint32_t nw, uint32_t rlen,
                          uint32_t wlen, struct vhd_vq_chain *out)
{
    struct iovec *iov = xcalloc(max_iov + 1, sizeof(*iov));
    struct vhd_vq_chain c;
    int rc = vhd_vq_pop(&f->vq, iov, max_iov, &c);
    if (rc != 1)
        fprintf(stderr, "  pop returned %d (%s), expected a chain\n", rc, vhd_vq_strerror(rc));
    VHD_CHECK_EQ(rc, 1);
    VHD_CHECK_EQ(c.nr, nr);
    VHD_CHECK_EQ(c.nw, nw);
    VHD_CHECK_EQ(c.rlen, rlen);
    VHD_CHECK_EQ(c.wlen, wlen);
    VHD_CHECK_EQ(f->vq.error, 0);
    if (out)
        *out = c;
    free(iov);
}

#define NEXT  VRING_DESC_F_NEXT
#define WRITE VRING_DESC_F_WRITE
#define IND   VRING_DESC_F_INDIRECT

VHD_TEST(bad_head_index_split)
{
    uint16_t heads[] = {8, 9, 0x8000, 0xffff};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(heads); i++) {
        struct vqfx f;
        uint64_t buf = mal_setup(&f, false, true, 8);
        vqfx_split_desc(&f, 0, buf, 16, 0, 0);
        vqfx_split_post(&f, heads[i]);
        mal_expect(&f, 16, VHD_VQ_E_DESC_INDEX);
        vqfx_teardown(&f);
    }
}

VHD_TEST(bad_next_index_split)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, false, true, 8);
    vqfx_split_desc(&f, 0, buf, 16, NEXT, 1);
    vqfx_split_desc(&f, 1, buf, 16, NEXT, 8);
    vqfx_split_post(&f, 0);
    mal_expect(&f, 16, VHD_VQ_E_DESC_INDEX);
    vqfx_teardown(&f);
}

VHD_TEST(bad_loop_self_split)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, false, true, 8);
    vqfx_split_desc(&f, 0, buf, 16, NEXT, 0);
    vqfx_split_post(&f, 0);
    mal_expect(&f, 1024, VHD_VQ_E_CHAIN_LOOP); /* iov room for far more than the loop */
    vqfx_teardown(&f);

    /* the (size+1)-th descriptor is the loop, before it needs an iov entry */
    buf = mal_setup(&f, false, true, 8);
    vqfx_split_desc(&f, 0, buf, 16, NEXT, 0);
    vqfx_split_post(&f, 0);
    mal_expect(&f, 8, VHD_VQ_E_CHAIN_LOOP);
    vqfx_teardown(&f);
}

VHD_TEST(bad_loop_cycle_split)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, false, true, 8);
    vqfx_split_desc(&f, 5, buf, 16, NEXT, 2);
    vqfx_split_desc(&f, 2, buf, 16, NEXT, 7);
    vqfx_split_desc(&f, 7, buf, 16, NEXT, 2);
    vqfx_split_post(&f, 5);
    mal_expect(&f, 1024, VHD_VQ_E_CHAIN_LOOP);
    vqfx_teardown(&f);
}

/* A loop through the whole table of zero-length buffers: no iov fills up to stop it. */
VHD_TEST(bad_loop_empty_bufs_split)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, false, true, 8);
    for (uint16_t i = 0; i < 8; i++)
        vqfx_split_desc(&f, i, buf, 0, NEXT, (uint16_t)((i + 1) % 8));
    vqfx_split_post(&f, 3);
    mal_expect(&f, 4, VHD_VQ_E_CHAIN_LOOP);
    vqfx_teardown(&f);
}

/* Boundary: a chain through every descriptor of the table is not a loop. */
VHD_TEST(ok_chain_full_table_split)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, false, true, 8);
    for (uint16_t i = 0; i < 8; i++)
        vqfx_split_desc(&f, i, buf + i, 16, i < 7 ? NEXT : 0, (uint16_t)(i + 1));
    vqfx_split_post(&f, 0);
    mal_expect_ok(&f, 8, 8, 0, 128, 0, NULL);
    vqfx_teardown(&f);
}

VHD_TEST(bad_loop_indirect_split)
{
    struct vqfx f;
    void *t;
    uint64_t buf = mal_setup(&f, false, true, 8);
    uint64_t tg = vqfx_alloc(&f, 4 * 16, &t);
    vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
    vqfx_table_desc(t, 1, buf, 16, NEXT, 2);
    vqfx_table_desc(t, 2, buf, 16, NEXT, 1);
    vqfx_split_desc(&f, 0, tg, 4 * 16, IND, 0);
    vqfx_split_post(&f, 0);
    mal_expect(&f, 1024, VHD_VQ_E_CHAIN_LOOP);
    vqfx_teardown(&f);
}

VHD_TEST(bad_next_index_indirect_split)
{
    struct vqfx f;
    void *t;
    uint64_t buf = mal_setup(&f, false, true, 8);
    uint64_t tg = vqfx_alloc(&f, 4 * 16, &t);
    vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
    vqfx_table_desc(t, 1, buf, 16, NEXT, 4); /* table has 4 entries */
    vqfx_split_desc(&f, 0, tg, 4 * 16, IND, 0);
    vqfx_split_post(&f, 0);
    mal_expect(&f, 16, VHD_VQ_E_DESC_INDEX);
    vqfx_teardown(&f);
}

/* 2.7.5.3.2: the device MUST ignore WRITE on a descriptor that refers to a table. */
VHD_TEST(ok_indirect_write_flag_split)
{
    struct vqfx f;
    void *t;
    uint64_t buf = mal_setup(&f, false, true, 8);
    uint64_t tg = vqfx_alloc(&f, 2 * 16, &t);
    vqfx_table_desc(t, 0, buf, 10, NEXT, 1);
    vqfx_table_desc(t, 1, buf + 100, 20, WRITE, 0);
    vqfx_split_desc(&f, 0, tg, 2 * 16, IND | WRITE, 0);
    vqfx_split_post(&f, 0);
    mal_expect_ok(&f, 4, 1, 1, 10, 20, NULL);
    vqfx_teardown(&f);
}

/* 2.7.5.3.2: the device MUST handle direct descriptors followed by one indirect one. */
VHD_TEST(ok_direct_then_indirect_split)
{
    struct vqfx f;
    void *t;
    uint64_t buf = mal_setup(&f, false, true, 8);
    uint64_t tg = vqfx_alloc(&f, 2 * 16, &t);
    vqfx_table_desc(t, 0, buf + 16, 8, NEXT, 1);
    vqfx_table_desc(t, 1, buf + 100, 32, WRITE, 0);
    vqfx_split_desc(&f, 4, buf, 16, NEXT, 6);
    vqfx_split_desc(&f, 6, tg, 2 * 16, IND, 0);
    vqfx_split_post(&f, 4);
    struct vhd_vq_chain c;
    mal_expect_ok(&f, 4, 2, 1, 24, 32, &c);
    VHD_CHECK_EQ(c.id, 4);
    vqfx_teardown(&f);
}

VHD_TEST(bad_avail_idx_split)
{
    /* more than a queue size ahead */
    struct vqfx f;
    uint64_t buf = mal_setup(&f, false, true, 8);
    for (uint16_t i = 0; i < 8; i++)
        vqfx_split_desc(&f, i, buf, 16, 0, 0);
    f.dq.ring.split.avail->idx = vhd_le16(9);
    mal_expect(&f, 16, VHD_VQ_E_AVAIL_IDX);
    vqfx_teardown(&f);

    /* moved backwards (= 65535 ahead) after some progress */
    buf = mal_setup(&f, false, true, 8);
    advance(&f, buf, 5, 5);
    f.dq.ring.split.avail->idx = vhd_le16(4);
    mal_expect(&f, 16, VHD_VQ_E_AVAIL_IDX);
    vqfx_teardown(&f);

    /* boundary: exactly a queue size ahead is fine */
    buf = mal_setup(&f, false, true, 8);
    advance(&f, buf, 5, 5);
    for (uint16_t i = 0; i < 8; i++) {
        vqfx_split_desc(&f, i, buf, 16, 0, 0);
        f.dq.ring.split.avail->ring[(5 + i) & 7] = vhd_le16(i);
    }
    f.dq.ring.split.avail->idx = vhd_le16(13);
    for (int i = 0; i < 8; i++) {
        struct vhd_vq_chain c;
        mal_expect_ok(&f, 4, 1, 0, 16, 0, &c);
        VHD_CHECK_EQ(c.id, i); /* heads come out in ring order */
    }
    vqfx_teardown(&f);
}

BOTH(bad_nested_indirect)
{
    struct vqfx f;
    void *t, *t2;
    uint64_t buf = mal_setup(&f, packed, true, 8);
    uint64_t tg = vqfx_alloc(&f, 2 * 16, &t);
    uint64_t tg2 = vqfx_alloc(&f, 1 * 16, &t2);
    if (packed) {
        vqfx_ptable_desc(t2, 0, buf, 16, 0, 0);
        vqfx_ptable_desc(t, 0, buf, 16, 0, 0);
        vqfx_ptable_desc(t, 1, tg2, 16, 0, IND);
    } else {
        vqfx_table_desc(t2, 0, buf, 16, 0, 0);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, tg2, 16, IND, 0);
    }
    struct vqfx_pd d = {tg, 2 * 16, 0, IND};
    mal_chain(&f, &d, 1);
    mal_expect(&f, 16, VHD_VQ_E_NESTED_INDIRECT);
    vqfx_teardown(&f);
}

BOTH(bad_indirect_len)
{
    static const uint32_t lens[] = {0, 8, 24, 17, (VHD_VQ_MAX_INDIRECT + 1) * 16};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(lens); i++) {
        struct vqfx f;
        void *t;
        uint64_t buf = mal_setup(&f, packed, true, 8);
        /* a real table behind it, large enough that only the length is wrong */
        uint64_t tg = vqfx_alloc(&f, (VHD_VQ_MAX_INDIRECT + 2) * 16, &t);
        for (uint32_t j = 0; j < VHD_VQ_MAX_INDIRECT + 2; j++) {
            if (packed)
                vqfx_ptable_desc(t, j, buf, 1, 0, 0);
            else
                vqfx_table_desc(t, j, buf, 1, 0, 0);
        }
        struct vqfx_pd d = {tg, lens[i], 0, IND};
        mal_chain(&f, &d, 1);
        mal_expect(&f, 64, VHD_VQ_E_INDIRECT_LEN);
        vqfx_teardown(&f);
    }
}

BOTH(bad_indirect_with_next)
{
    struct vqfx f;
    void *t;
    uint64_t buf = mal_setup(&f, packed, true, 8);
    uint64_t tg = vqfx_alloc(&f, 16, &t);
    if (packed)
        vqfx_ptable_desc(t, 0, buf, 16, 0, 0);
    else
        vqfx_table_desc(t, 0, buf, 16, 0, 0);
    struct vqfx_pd d[2] = {{tg, 16, 0, IND | NEXT}, {buf, 16, 0, 0}};
    mal_chain(&f, d, 2);
    mal_expect(&f, 16, VHD_VQ_E_INDIRECT_FLAGS);
    vqfx_teardown(&f);
}

/*
 * 2.8.7: "In descriptors with VIRTQ_DESC_F_INDIRECT set VIRTQ_DESC_F_WRITE is
 * reserved and is ignored by the device" (vq.h's enum comment says otherwise).
 */
VHD_TEST(ok_indirect_write_flag_packed)
{
    struct vqfx f;
    void *t;
    uint64_t buf = mal_setup(&f, true, true, 8);
    uint64_t tg = vqfx_alloc(&f, 2 * 16, &t);
    vqfx_ptable_desc(t, 0, buf, 10, 0, 0);
    vqfx_ptable_desc(t, 1, buf + 100, 20, 0, WRITE);
    struct vqfx_pd d = {tg, 2 * 16, 1, IND | WRITE};
    mal_chain(&f, &d, 1);
    struct vhd_vq_chain c;
    mal_expect_ok(&f, 4, 1, 1, 10, 20, &c);
    VHD_CHECK_EQ(c.id, 1);
    vqfx_teardown(&f);
}

BOTH(bad_indirect_nofeat)
{
    struct vqfx f;
    void *t;
    uint64_t buf = mal_setup(&f, packed, false, 8);
    uint64_t tg = vqfx_alloc(&f, 16, &t);
    if (packed)
        vqfx_ptable_desc(t, 0, buf, 16, 0, 0);
    else
        vqfx_table_desc(t, 0, buf, 16, 0, 0);
    struct vqfx_pd d = {tg, 16, 0, IND};
    mal_chain(&f, &d, 1);
    mal_expect(&f, 16, VHD_VQ_E_INDIRECT_NOFEAT);
    vqfx_teardown(&f);
}

BOTH(bad_write_order)
{
    /* direct */
    struct vqfx f;
    uint64_t buf = mal_setup(&f, packed, true, 8);
    struct vqfx_pd d[3] = {
        {buf, 16, 0, NEXT}, {buf + 16, 16, 0, WRITE | NEXT}, {buf + 32, 16, 0, 0}};
    mal_chain(&f, d, 3);
    mal_expect(&f, 16, VHD_VQ_E_WRITE_ORDER);
    vqfx_teardown(&f);

    /* inside an indirect table */
    void *t;
    buf = mal_setup(&f, packed, true, 8);
    uint64_t tg = vqfx_alloc(&f, 3 * 16, &t);
    if (packed) {
        vqfx_ptable_desc(t, 0, buf, 16, 0, WRITE);
        vqfx_ptable_desc(t, 1, buf, 16, 0, WRITE);
        vqfx_ptable_desc(t, 2, buf, 16, 0, 0);
    } else {
        vqfx_table_desc(t, 0, buf, 16, WRITE | NEXT, 1);
        vqfx_table_desc(t, 1, buf, 16, WRITE | NEXT, 2);
        vqfx_table_desc(t, 2, buf, 16, 0, 0);
    }
    struct vqfx_pd di = {tg, 3 * 16, 0, IND};
    mal_chain(&f, &di, 1);
    mal_expect(&f, 16, VHD_VQ_E_WRITE_ORDER);
    vqfx_teardown(&f);
}

BOTH(bad_addr)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, packed, true, 8);
    uint64_t end = vqfx_mem_end(&f);
    vqfx_teardown(&f);
    struct {
        uint64_t addr;
        uint32_t len;
    } cases[] = {
        {end, 1},               /* just past the end */
        {end + 0x100000, 16},   /* far outside */
        {end - 8, 16},          /* straddles the end */
        {0x1000, 16},           /* below the first region */
        {VQFX_BASE_GPA - 1, 2}, /* straddles the start */
        {UINT64_MAX - 7, 16},   /* addr + len overflows */
        {UINT64_MAX, 1},        /* last byte of the address space */
        {1ull << 63, 0x10000},
        {(1ull << 63) - 0x1000, 0xfffff000u}, /* alone: total is 2^32 - 4096, no overflow */
    };
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(cases); i++) {
        for (int where = 0; where < 2; where++) { /* second descriptor of a chain, or first */
            buf = mal_setup(&f, packed, true, 8);
            struct vqfx_pd d[2] = {{buf, 16, 0, NEXT}, {cases[i].addr, cases[i].len, 0, WRITE}};
            if (where)
                mal_chain(&f, d, 2);
            else
                mal_chain(&f, &d[1], 1);
            mal_expect(&f, 16, VHD_VQ_E_ADDR);
            vqfx_teardown(&f);
        }
    }
    /* the same inside an indirect table */
    void *t;
    buf = mal_setup(&f, packed, true, 8);
    uint64_t tg = vqfx_alloc(&f, 2 * 16, &t);
    if (packed) {
        vqfx_ptable_desc(t, 0, buf, 16, 0, 0);
        vqfx_ptable_desc(t, 1, UINT64_MAX - 7, 16, 0, 0);
    } else {
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, UINT64_MAX - 7, 16, 0, 0);
    }
    struct vqfx_pd di = {tg, 2 * 16, 0, IND};
    mal_chain(&f, &di, 1);
    mal_expect(&f, 16, VHD_VQ_E_ADDR);
    vqfx_teardown(&f);
}

/* An indirect table that is itself outside guest memory. */
BOTH(bad_indirect_table_addr)
{
    struct vqfx f;
    mal_setup(&f, packed, true, 8);
    struct vqfx_pd d = {vqfx_mem_end(&f) + 4096, 64, 0, IND};
    mal_chain(&f, &d, 1);
    mal_expect(&f, 16, VHD_VQ_E_ADDR);
    vqfx_teardown(&f);

    mal_setup(&f, packed, true, 8);
    struct vqfx_pd d2 = {UINT64_MAX - 31, 64, 0, IND};
    mal_chain(&f, &d2, 1);
    mal_expect(&f, 16, VHD_VQ_E_ADDR);
    vqfx_teardown(&f);
}

/* Total length over 2^32 - 1 with buffers that all translate (a sparse 2 GiB region). */
BOTH(bad_len_overflow)
{
    struct vqfx f;
    struct vqfx_opts o = {
        .size = 8, .packed = packed, .indirect = true, .region_size = (2ull << 30) + (16ull << 20)};
    vqfx_setup(&f, &o);
    uint64_t b = VQFX_BASE_GPA;

    /* 2^31 + (2^31 - 1) = 2^32 - 1: the largest legal chain */
    struct vqfx_pd ok[2] = {{b, 0x80000000u, 0, NEXT}, {b, 0x7fffffffu, 0, WRITE}};
    mal_chain(&f, ok, 2);
    struct vhd_vq_chain c;
    mal_expect_ok(&f, 16, 1, 1, 0x80000000u, 0x7fffffffu, &c);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), 0);
    vhd_vq_flush(&f.vq);
    vqfx_teardown(&f);

    /* readable + writable adding up to 2^32 */
    vqfx_setup(&f, &o);
    struct vqfx_pd bad[2] = {{b, 0x80000000u, 0, NEXT}, {b, 0x80000000u, 0, WRITE}};
    mal_chain(&f, bad, 2);
    mal_expect(&f, 16, VHD_VQ_E_LEN_OVERFLOW);
    vqfx_teardown(&f);

    /* three readable ones */
    vqfx_setup(&f, &o);
    struct vqfx_pd bad3[3] = {
        {b, 0x60000000u, 0, NEXT}, {b, 0x60000000u, 0, NEXT}, {b, 0x60000000u, 0, 0}};
    mal_chain(&f, bad3, 3);
    mal_expect(&f, 16, VHD_VQ_E_LEN_OVERFLOW);
    vqfx_teardown(&f);

    /* inside an indirect table */
    vqfx_setup(&f, &o);
    void *t;
    uint64_t tg = vqfx_alloc(&f, 2 * 16, &t);
    if (packed) {
        vqfx_ptable_desc(t, 0, b, 0x80000000u, 0, 0);
        vqfx_ptable_desc(t, 1, b, 0x80000000u, 0, WRITE);
    } else {
        vqfx_table_desc(t, 0, b, 0x80000000u, NEXT, 1);
        vqfx_table_desc(t, 1, b, 0x80000000u, WRITE, 0);
    }
    struct vqfx_pd di = {tg, 2 * 16, 0, IND};
    mal_chain(&f, &di, 1);
    mal_expect(&f, 16, VHD_VQ_E_LEN_OVERFLOW);
    vqfx_teardown(&f);
}

BOTH(bad_iov_full)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, packed, true, 8);
    struct vqfx_pd d[3] = {{buf, 16, 0, NEXT}, {buf, 16, 0, NEXT | WRITE}, {buf, 16, 0, WRITE}};
    mal_chain(&f, d, 3);
    mal_expect(&f, 2, VHD_VQ_E_IOV_FULL);
    vqfx_teardown(&f);

    buf = mal_setup(&f, packed, true, 8);
    struct vqfx_pd d1 = {buf, 16, 0, 0};
    mal_chain(&f, &d1, 1);
    mal_expect(&f, 0, VHD_VQ_E_IOV_FULL);
    vqfx_teardown(&f);

    /* boundary: exactly enough */
    buf = mal_setup(&f, packed, true, 8);
    mal_chain(&f, d, 3);
    mal_expect_ok(&f, 3, 1, 2, 16, 32, NULL);
    vqfx_teardown(&f);

    /* zero-length buffers take no iov entry */
    buf = mal_setup(&f, packed, true, 8);
    struct vqfx_pd dz[3] = {{buf, 16, 0, NEXT}, {buf, 0, 0, NEXT | WRITE}, {buf, 16, 0, WRITE}};
    mal_chain(&f, dz, 3);
    mal_expect_ok(&f, 2, 1, 1, 16, 16, NULL);
    vqfx_teardown(&f);
}

BOTH(bad_used_overflow)
{
    struct vqfx f;
    struct iovec iov[4];
    struct vhd_vq_chain c;

    uint64_t buf = mal_setup(&f, packed, true, 8);
    memset(&c, 0, sizeof(c));
    c.ndescs = 1;
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), -VHD_VQ_E_USED_OVERFLOW);
    vqfx_expect_broken(&f, VHD_VQ_E_USED_OVERFLOW);
    vqfx_teardown(&f);

    buf = mal_setup(&f, packed, true, 8);
    drv_add_k(&f, buf, 1, 1);
    vhd_drv_vq_publish(&f.dq);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), 0);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), -VHD_VQ_E_USED_OVERFLOW);
    vqfx_expect_broken(&f, VHD_VQ_E_USED_OVERFLOW);
    vqfx_teardown(&f);
}

VHD_TEST(bad_buffer_id_packed)
{
    uint16_t ids[] = {8, 9, 0x7fff, 0xffff};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(ids); i++) {
        struct vqfx f;
        uint64_t buf = mal_setup(&f, true, true, 8);
        struct vqfx_pd d[2] = {{buf, 16, 0, NEXT}, {buf, 16, ids[i], 0}};
        if (i & 1)
            mal_chain(&f, d, 2); /* the id of the last descriptor counts */
        else
            mal_chain(&f, &d[1], 1);
        mal_expect(&f, 16, VHD_VQ_E_BUFFER_ID);
        vqfx_teardown(&f);
    }
    /* non-power-of-two size: id == size is out of range */
    struct vqfx f;
    uint64_t buf = mal_setup(&f, true, true, 3);
    struct vqfx_pd d = {buf, 16, 3, 0};
    mal_chain(&f, &d, 1);
    mal_expect(&f, 16, VHD_VQ_E_BUFFER_ID);
    vqfx_teardown(&f);
}

/* 2.8.6: the buffer id is in the last descriptor; others' ids mean nothing. */
VHD_TEST(ok_buffer_id_last_packed)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, true, true, 8);
    struct vqfx_pd d[3] = {{buf, 16, 0xffff, NEXT}, {buf, 16, 999, NEXT}, {buf, 8, 5, WRITE}};
    mal_chain(&f, d, 3);
    struct vhd_vq_chain c;
    mal_expect_ok(&f, 4, 2, 1, 32, 8, &c);
    VHD_CHECK_EQ(c.id, 5);
    VHD_CHECK_EQ(c.ndescs, 3);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 8), 0);
    vhd_vq_flush(&f.vq);
    VHD_CHECK_EQ(vhd_le16(f.dq.ring.packed.desc[0].id), 5);
    VHD_CHECK_EQ(vhd_le32(f.dq.ring.packed.desc[0].len), 8);
    vqfx_teardown(&f);
}

VHD_TEST(bad_chain_unavailable_packed)
{
    for (int variant = 0; variant < 3; variant++) {
        struct vqfx f;
        uint64_t buf = mal_setup(&f, true, true, 8);
        /* slot 1: never written / looks used / available for the other wrap */
        uint16_t fl1 = variant == 0   ? 0
                       : variant == 1 ? (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED)
                                      : vqfx_pavail(false);
        vqfx_packed_desc(&f, 1, buf, 16, 1, fl1);
        vqfx_packed_desc(&f, 0, buf, 16, 0, (uint16_t)(NEXT | vqfx_pavail(true)));
        mal_expect(&f, 16, VHD_VQ_E_PACKED_CHAIN);
        vqfx_teardown(&f);
    }
}

/* A chain of NEXT through every slot comes back to its own start. */
VHD_TEST(bad_chain_whole_ring_packed)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, true, true, 8);
    struct vqfx_pd d[8];
    for (int i = 0; i < 8; i++)
        d[i] = (struct vqfx_pd){buf, 0, 0, NEXT};
    mal_chain(&f, d, 8);
    struct iovec iov[64];
    struct vhd_vq_chain c;
    int rc = vhd_vq_pop(&f.vq, iov, 64, &c);
    VHD_CHECK(rc == -VHD_VQ_E_PACKED_CHAIN || rc == -VHD_VQ_E_CHAIN_LOOP);
    vqfx_expect_broken(&f, -rc);
    vqfx_teardown(&f);
}

/* Boundary: a chain of exactly the ring size, and a chain across the ring end. */
VHD_TEST(ok_chain_full_ring_packed)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, true, true, 8);
    struct vqfx_pd d[8];
    for (int i = 0; i < 8; i++)
        d[i] = (struct vqfx_pd){buf + i, 4, 0, i < 7 ? NEXT : 0};
    d[7].id = 7;
    mal_chain(&f, d, 8);
    struct vhd_vq_chain c;
    mal_expect_ok(&f, 8, 8, 0, 32, 0, &c);
    VHD_CHECK_EQ(c.ndescs, 8);
    VHD_CHECK_EQ(c.id, 7);
    vqfx_teardown(&f);
}

VHD_TEST(ok_chain_across_ring_end_packed)
{
    struct vqfx f;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    uint64_t buf = mal_setup(&f, true, true, 4);
    uint16_t slot = 0;
    bool wrap = true;
    for (uint16_t i = 0; i < 3; i++) {
        struct vqfx_pd d = {buf, 16, i, 0};
        vqfx_packed_chain(&f, &slot, &wrap, &d, 1);
        VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
        VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), 0);
    }
    vhd_vq_flush(&f.vq);
    /* slots 3 (wrap 1) and 0 (wrap 0) */
    struct vqfx_pd d2[2] = {{buf, 16, 0, NEXT}, {buf + 16, 8, 3, WRITE}};
    vqfx_packed_chain(&f, &slot, &wrap, d2, 2);
    VHD_CHECK_EQ(slot, 1);
    VHD_CHECK(!wrap);
    mal_expect_ok(&f, 4, 1, 1, 16, 8, &c);
    VHD_CHECK_EQ(c.id, 3);
    VHD_CHECK_EQ(c.ndescs, 2);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 8), 0);
    vhd_vq_flush(&f.vq);
    /* used at slot 3 with device wrap 1 */
    struct vhd_vring_packed_desc *u = &f.dq.ring.packed.desc[3];
    VHD_CHECK_EQ(vhd_le16(u->id), 3);
    VHD_CHECK_EQ(vhd_le16(u->flags) & (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED),
                 VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED);
    /* next used goes to slot 1 with device wrap 0 */
    struct vqfx_pd d3 = {buf, 16, 2, 0};
    vqfx_packed_chain(&f, &slot, &wrap, &d3, 1);
    mal_expect_ok(&f, 4, 1, 0, 16, 0, &c);
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), 0);
    vhd_vq_flush(&f.vq);
    u = &f.dq.ring.packed.desc[1];
    VHD_CHECK_EQ(vhd_le16(u->id), 2);
    VHD_CHECK_EQ(vhd_le16(u->flags) & (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED), 0);
    VHD_CHECK_EQ(vhd_vq_get_base(&f.vq), 2u | 2u << 16);
    vqfx_teardown(&f);
}

/* 2.8.7: in a packed indirect table only WRITE counts; NEXT and ids are ignored. */
VHD_TEST(ok_indirect_ignores_next_packed)
{
    struct vqfx f;
    void *t;
    uint64_t buf = mal_setup(&f, true, true, 8);
    uint64_t tg = vqfx_alloc(&f, 3 * 16, &t);
    vqfx_ptable_desc(t, 0, buf, 8, 777, NEXT);
    vqfx_ptable_desc(t, 1, buf + 8, 8, 555, WRITE | NEXT);
    vqfx_ptable_desc(t, 2, buf + 16, 8, 0xffff, WRITE);
    struct vqfx_pd d = {tg, 3 * 16, 4, IND};
    mal_chain(&f, &d, 1);
    struct vhd_vq_chain c;
    mal_expect_ok(&f, 4, 1, 2, 8, 16, &c);
    VHD_CHECK_EQ(c.id, 4);
    VHD_CHECK_EQ(c.ndescs, 1);
    vqfx_teardown(&f);
}

/* A broken queue stays broken even when the guest repairs its ring. */
BOTH(broken_is_sticky)
{
    struct vqfx f;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    uint64_t buf = mal_setup(&f, packed, true, 8);
    struct vqfx_pd d = {vqfx_mem_end(&f) + 4096, 16, 0, 0};
    mal_chain(&f, &d, 1);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), -VHD_VQ_E_ADDR);
    /* repair the descriptor */
    if (packed)
        vqfx_packed_desc(&f, 0, buf, 16, 0, vqfx_pavail(true));
    else
        vqfx_split_desc(&f, 0, buf, 16, 0, 0);
    vhd_vq_invalidate(&f.vq);
    vqfx_expect_broken(&f, VHD_VQ_E_ADDR);
    vqfx_teardown(&f);
}

/*
 * A driver can never have more than `size` chains in flight (each holds at least
 * one of the size descriptors / ring slots). Split: a driver re-posting a head
 * still in flight must not get more than size chains out of the device (the
 * in-flight count is 16 bits; past 65536 a legitimate push would fail).
 */
VHD_TEST(bad_inflight_bound_split)
{
    struct vqfx f;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    uint64_t buf = mal_setup(&f, false, true, 8);
    vqfx_split_desc(&f, 0, buf, 16, 0, 0);
    for (int i = 0; i < 8; i++) {
        vqfx_split_post(&f, 0);
        VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
        VHD_CHECK_EQ(c.id, 0);
    }
    VHD_CHECK_EQ(f.vq.inflight, 8);
    vqfx_split_post(&f, 0);
    int rc = vhd_vq_pop(&f.vq, iov, 4, &c);
    if (rc == 1)
        fprintf(stderr, "  pop handed out chain %u with %u chains already in flight (size 8)\n",
                (unsigned)c.id, (unsigned)f.vq.inflight - 1);
    VHD_CHECK(rc <= 0);
    if (rc < 0)
        vqfx_expect_broken(&f, -rc);
    vqfx_teardown(&f);
}

/* The same on the packed ring: ring ownership bounds it (slots not yet used back). */
VHD_TEST(bad_inflight_bound_packed)
{
    struct vqfx f;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    uint64_t buf = mal_setup(&f, true, true, 4);
    uint16_t slot = 0;
    bool wrap = true;
    for (int i = 0; i < 4; i++) {
        struct vqfx_pd d = {buf, 16, 0, 0};
        vqfx_packed_chain(&f, &slot, &wrap, &d, 1);
        VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
    }
    /* the driver "re-posts" slot 0 for the next lap although nothing was used */
    struct vqfx_pd d = {buf, 16, 0, 0};
    vqfx_packed_chain(&f, &slot, &wrap, &d, 1);
    VHD_CHECK(vhd_vq_pop(&f.vq, iov, 4, &c) <= 0);
    VHD_CHECK(f.vq.inflight <= 4);
    vqfx_teardown(&f);
}

/* A second decision with nothing published in between: no new interrupt. */
BOTH(notify_nothing_new)
{
    for (int ei = 0; ei < 2; ei++) {
        struct vqfx f;
        struct vqfx_opts o = {.size = 8, .packed = packed, .event_idx = ei};
        vqfx_setup(&f, &o);
        uint64_t buf = vqfx_alloc(&f, 4096, NULL);
        /* interrupts wanted: flags 0 / ENABLE, used_event = next entry */
        VHD_CHECK(!vhd_drv_vq_enable_cb(&f.dq));
        for (int i = 0; i < 10; i++) {
            drv_add_k(&f, buf, 1, 1);
            vhd_drv_vq_publish(&f.dq);
            dev_serve(&f);
            VHD_CHECK(vhd_vq_need_notify(&f.vq));
            VHD_CHECK_EQ(drv_collect(&f), 1);
            VHD_CHECK(!vhd_drv_vq_enable_cb(&f.dq));
            /* an idle poll: flush with nothing pushed, decide again */
            vhd_vq_flush(&f.vq);
            bool again = vhd_vq_need_notify(&f.vq);
            if (again)
                fprintf(stderr, "  event_idx=%d: notify again with nothing new used\n", ei);
            VHD_CHECK(!again);
        }
        vqfx_teardown(&f);
    }
}

/*
 * nr/nw are 16-bit: a chain of more than 65535 segments must be refused even
 * when the caller's array is bigger (32768 table entries, each crossing a
 * region boundary = 65536 segments); 65535 segments is still fine.
 */
static void iov_clamp(bool packed, uint32_t ncross, uint32_t nplain, int expect_err)
{
    struct vqfx f;
    struct vqfx_opts o = {
        .size = 4, .packed = packed, .indirect = true, .nregions = 2, .region_size = 2 << 20};
    void *t;
    vqfx_setup(&f, &o);
    uint32_t n = ncross + nplain;
    uint64_t tg = vqfx_alloc(&f, (uint64_t)n * 16, &t);
    uint64_t bnd = f.gm.r[1].gpa;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t a = i < ncross ? bnd - 1 : bnd + 64;
        uint32_t l = i < ncross ? 2 : 1;
        if (packed)
            vqfx_ptable_desc(t, i, a, l, 0, 0);
        else
            vqfx_table_desc(t, i, a, l, i + 1 < n ? NEXT : 0, (uint16_t)(i + 1));
    }
    struct vqfx_pd d = {tg, n * 16, 1, IND};
    mal_chain(&f, &d, 1);
    if (expect_err) {
        mal_expect(&f, 70000, expect_err);
    } else {
        struct vhd_vq_chain c;
        mal_expect_ok(&f, 70000, 2 * ncross + nplain, 0, 2 * ncross + nplain, 0, &c);
    }
    vqfx_teardown(&f);
}

BOTH(bad_iov_over_65535)
{
    iov_clamp(packed, 32767, 1, 0);
    iov_clamp(packed, 32768, 0, VHD_VQ_E_IOV_FULL);
}

/*
 * An indirect table must translate into one host range; one that crosses a
 * region boundary is refused (as QEMU does) rather than read out of bounds.
 */
BOTH(bad_indirect_table_cross)
{
    struct vqfx f;
    struct vqfx_opts o = {
        .size = 8, .packed = packed, .indirect = true, .nregions = 2, .region_size = 1 << 20};
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    uint64_t bnd = f.gm.r[1].gpa;
    for (int i = 0; i < 4; i++) {
        void *e = vqfx_ptr(&f, bnd - 32 + 16 * (uint64_t)i, 16);
        if (packed)
            vqfx_ptable_desc(e, 0, buf, 8, 0, 0);
        else
            vqfx_table_desc(e, 0, buf, 8, i < 3 ? NEXT : 0, (uint16_t)(i + 1));
    }
    struct vqfx_pd d = {bnd - 32, 64, 0, IND};
    mal_chain(&f, &d, 1);
    mal_expect(&f, 16, VHD_VQ_E_ADDR);
    vqfx_teardown(&f);
}

/* has_work / enable_notify can be the first to see a corrupt avail->idx. */
VHD_TEST(bad_avail_idx_seen_by_has_work_split)
{
    for (int via = 0; via < 2; via++) {
        struct vqfx f;
        struct iovec iov[4];
        struct vhd_vq_chain c;
        mal_setup(&f, false, true, 8);
        f.dq.ring.split.avail->idx = vhd_le16(100);
        if (via)
            (void)vhd_vq_enable_notify(&f.vq);
        else
            (void)vhd_vq_has_work(&f.vq);
        VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), -VHD_VQ_E_AVAIL_IDX);
        vqfx_expect_broken(&f, VHD_VQ_E_AVAIL_IDX);
        vqfx_teardown(&f);
    }
}

/* A device bug (an id no pop returned) must break the queue, not index past the ring. */
BOTH(bad_push_id)
{
    struct vqfx f;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    uint64_t buf = mal_setup(&f, packed, true, 8);
    drv_add_k(&f, buf, 1, 1);
    vhd_drv_vq_publish(&f.dq);
    VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
    c.id = 8;
    int err = packed ? VHD_VQ_E_BUFFER_ID : VHD_VQ_E_DESC_INDEX;
    VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, 0), -err);
    vqfx_expect_broken(&f, err);
    vqfx_teardown(&f);
}

/* A packed base whose used position is ahead of its avail position: broken, no crash. */
VHD_TEST(base_inconsistent_packed)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .packed = true, .no_start = true};
    struct iovec iov[4];
    struct vhd_vq_chain c;
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    VHD_CHECK_EQ(vhd_vq_set_base(&f.vq, 3u | 1u << 15 | (5u | 1u << 15) << 16), 0);
    VHD_CHECK_EQ(vhd_vq_start(&f.vq), 0);
    vqfx_packed_desc(&f, 3, buf, 16, 0, vqfx_pavail(true));
    int rc = vhd_vq_pop(&f.vq, iov, 4, &c);
    VHD_CHECK(rc < 0);
    vqfx_expect_broken(&f, -rc);
    vqfx_teardown(&f);
}

/*
 * Front-end VAs that are not congruent with the host mapping: the ring's VA is
 * 16-byte aligned (init accepts it) but its host address is not. The rings
 * must not be used through a misaligned pointer.
 */
BOTH(meta_ring_misaligned_host)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .packed = packed, .no_start = true};
    vqfx_setup(&f, &o);
    struct vhd_mem_region_desc d[VHD_GUESTMEM_MAX_REGIONS];
    vhd_guestmem_descs(&f.gm, d);
    d[0].uva += 8; /* the front-end claims region 0 lives 8 bytes further on */
    struct vhd_mem *m = NULL;
    VHD_CHECK_EQ(vhd_mem_new(d, f.gm.nregions, &m), 0);
    struct vhd_vq_params p = f.params;
    p.addr_is_gpa = false;
    p.desc = d[0].uva + (f.dq.desc_gpa - f.gm.r[0].gpa) + 8; /* 16-aligned VA, host +8 */
    p.avail = d[0].uva + (f.dq.avail_gpa - f.gm.r[0].gpa);
    p.used = d[0].uva + (f.dq.used_gpa - f.gm.r[0].gpa);
    VHD_CHECK_EQ(p.desc & 15, 0);
    VHD_CHECK_EQ(vhd_vq_init(&f.vq, &p, m), 0);
    VHD_CHECK_EQ(vhd_vq_start(&f.vq), -EFAULT);
    VHD_CHECK_EQ(f.vq.error, VHD_VQ_E_RING_ADDR);
    vhd_mem_free(m);
    vqfx_teardown(&f);
}

/*
 * Several flushes between two decisions. Packed positions (slot | wrap << 15)
 * repeat every two laps, so "where the used position was at the last decision"
 * alone cannot tell "nothing new" from "two laps done". With size 1 that is two
 * completions: a driver waiting for an interrupt must still get one.
 */
static bool multi_lap(uint32_t size, bool event_idx, uint32_t k, uint32_t ev_ahead)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = size, .packed = true, .event_idx = event_idx};
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    struct vhd_vring_packed_event *drv = f.dq.ring.packed.driver;
    advance(&f, buf, 1, 1);
    (void)vhd_vq_need_notify(&f.vq); /* decision at position 1 */
    uint64_t old = 1;
    if (event_idx) {
        uint64_t e = old + ev_ahead; /* a position the coming completions pass */
        drv->off_wrap =
            vhd_le16((uint16_t)(pos_slot(e, size) | (uint16_t)pos_wrap(e, size)
                                                        << VRING_PACKED_EVENT_WRAP_SHIFT));
        drv->flags = vhd_le16(VRING_PACKED_EVENT_FLAG_DESC);
    } else {
        drv->flags = vhd_le16(VRING_PACKED_EVENT_FLAG_ENABLE);
    }
    for (uint32_t i = 0; i < k; i++) { /* k completions, each flushed, no decision */
        drv_add_k(&f, buf, 1, 1);
        vhd_drv_vq_publish(&f.dq);
        VHD_CHECK_EQ(dev_serve(&f), 1);
        VHD_CHECK_EQ(drv_collect(&f), 1);
    }
    bool got = vhd_vq_need_notify(&f.vq);
    if (!got)
        fprintf(stderr,
                "  size %u, %s, %u used descriptors since the last decision (event %u ahead): "
                "no notification\n",
                size, event_idx ? "DESC" : "ENABLE", k, ev_ahead);
    vqfx_teardown(&f);
    return got;
}

VHD_TEST(notify_multi_lap_packed)
{
    int bad = 0;
    for (uint32_t size = 1; size <= 4; size++) {
        bad += !multi_lap(size, false, 2 * size, 0);    /* exactly two laps */
        bad += !multi_lap(size, true, 2 * size, 1);     /* ... with the event inside */
        bad += !multi_lap(size, true, 2 * size + 1, 1); /* more than two laps */
        bad += !multi_lap(size, true, size + 1, size);  /* more than one lap */
    }
    VHD_CHECK_EQ(bad, 0);
}

/* ---- batch verbs: vhd_vq_pop_burst / vhd_vq_push_burst ---- */

#define BURST_STRIDE 8

/*
 * Rounds of random requests (1-4 buffers, some indirect) through a small
 * ring, popped in runs of random budget and pushed in one call: runs cross
 * the ring's end many times; every chain must come back with the shape it
 * was added with, and the driver must collect every one with its length.
 */
BOTH(burst_wrap_mixed)
{
    static const uint32_t sizes[] = {16, 13, 4};
    for (unsigned si = 0; si < VHD_ARRAY_SIZE(sizes); si++) {
        uint32_t size = sizes[si];
        if (!packed && size == 13)
            continue;
        struct vqfx f;
        struct vqfx_opts o = {.size = size, .packed = packed, .indirect = true, .max_indirect = 4};
        vqfx_setup(&f, &o);
        uint64_t pool = vqfx_alloc(&f, 64 * 1024, NULL);
        struct iovec iov[VHD_VQ_BURST_MAX * BURST_STRIDE];
        struct vhd_vq_chain c[VHD_VQ_BURST_MAX];
        uint32_t written[VHD_VQ_BURST_MAX], want_r[32768], want_w[32768];
        uint64_t cookie = 0, collected = 0;
        rng_seed(size + 31 * packed);
        for (int round = 0; round < 400; round++) {
            uint32_t n = 1 + rnd_below(f.dq.num_free < 8 ? 1 : 8), added = 0;
            for (uint32_t i = 0; i < n; i++) {
                struct vhd_drv_buf b[4];
                uint32_t nr = rnd_below(3), nw = 1 + rnd_below(2), rl = 0, wl = 0;
                if (nr + nw > 4)
                    nw = 4 - nr;
                for (uint32_t k = 0; k < nr + nw; k++) {
                    b[k].gpa = pool + rnd_below(60 * 1024);
                    b[k].len = 1 + rnd_below(512);
                    if (k < nr)
                        rl += b[k].len;
                    else
                        wl += b[k].len;
                }
                bool ind = rnd_below(3) == 0;
                if (vhd_drv_vq_add(&f.dq, b, nr, nw, ind, (void *)(uintptr_t)(cookie + 1)) < 0)
                    break;
                want_r[cookie % 32768] = rl;
                want_w[cookie % 32768] = wl;
                cookie++;
                added++;
            }
            vhd_drv_vq_publish(&f.dq);
            uint32_t got = 0;
            while (got < added) {
                uint32_t budget = 1 + rnd_below(added - got + 2);
                int rc = vhd_vq_pop_burst(&f.vq, iov, BURST_STRIDE, c, budget);
                VHD_CHECK(rc > 0);
                VHD_CHECK((uint32_t)rc <= budget);
                for (int k = 0; k < rc; k++) {
                    uint32_t segs = (uint32_t)c[k].nr + c[k].nw, sum = 0;
                    VHD_CHECK(segs <= BURST_STRIDE);
                    for (uint32_t s = 0; s < segs; s++)
                        sum += (uint32_t)iov[k * BURST_STRIDE + s].iov_len;
                    VHD_CHECK_EQ(sum, c[k].rlen + c[k].wlen);
                    written[k] = c[k].wlen;
                }
                VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, written, (uint32_t)rc), 0);
                got += (uint32_t)rc;
            }
            VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, BURST_STRIDE, c, 8), 0);
            vhd_vq_flush(&f.vq);
            void *ck;
            uint32_t len;
            while (vhd_drv_vq_get_used(&f.dq, &ck, &len) == 1) {
                uint64_t id = (uint64_t)(uintptr_t)ck - 1;
                VHD_CHECK_EQ(id, collected);
                VHD_CHECK_EQ(len, want_w[id % 32768]);
                (void)want_r;
                collected++;
            }
        }
        VHD_CHECK_EQ(collected, cookie);
        VHD_CHECK(cookie > 4 * size);
        VHD_CHECK_EQ(f.vq.error, 0);
        vqfx_teardown(&f);
    }
}

/* A run stops at the caller's budget; the rest comes in the next runs. */
BOTH(burst_budget)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 32, .packed = packed};
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    for (uint32_t i = 0; i < 10; i++) {
        struct vhd_drv_buf b[2] = {{buf + 64 * i, 16}, {buf + 64 * i + 32, 1}};
        VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b, 1, 1, false, (void *)(uintptr_t)(i + 1)), 0);
    }
    vhd_drv_vq_publish(&f.dq);
    struct iovec iov[4 * 4];
    struct vhd_vq_chain c[4];
    static const int want[] = {4, 4, 2, 0};
    for (unsigned r = 0; r < VHD_ARRAY_SIZE(want); r++) {
        VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 4, c, 4), want[r]);
        for (int k = 0; k < want[r]; k++) {
            VHD_CHECK_EQ(c[k].nr, 1);
            VHD_CHECK_EQ(c[k].nw, 1);
            VHD_CHECK_EQ(c[k].rlen, 16);
            VHD_CHECK_EQ(c[k].wlen, 1);
        }
    }
    VHD_CHECK_EQ(f.vq.inflight, 10);
    vqfx_teardown(&f);
}

/*
 * Packed runs across the ring's end: chains of 1 to 3 slots, taken in one
 * run that starts at each of several slots before the end, so that a chain
 * straddles the end at its first, middle or last slot, or none does, and
 * single-slot chains meet the end inside a group of four. Each chain comes
 * back with its id (the driver collects them in order), its shape and its
 * buffers (their bytes read through the iovecs), and the ring position and
 * wrap counter after the run are the driver's.
 */
VHD_TEST(burst_packed_across_ring_end)
{
    static const uint8_t shapes[][2] = {{1, 1}, {2, 1}, {1, 1}, {0, 1}, {1, 1}};
    static const uint32_t starts[] = {12, 11, 10, 9, 8};
    for (unsigned si = 0; si < VHD_ARRAY_SIZE(starts) * 2; si++) {
        uint32_t start = starts[si % VHD_ARRAY_SIZE(starts)];
        bool ones = si >= VHD_ARRAY_SIZE(starts); /* nine single-slot chains */
        struct vqfx f;
        struct vqfx_opts o = {.size = 13, .packed = true};
        vqfx_setup(&f, &o);
        uint64_t buf = vqfx_alloc(&f, 4096, NULL);
        uint8_t *p;
        uint64_t data = vqfx_alloc(&f, 64 * 32, (void **)&p);
        advance(&f, buf, start, 4); /* both sides at slot start, wrap counter 1 */

        uint32_t nchains = ones ? 9 : VHD_ARRAY_SIZE(shapes), slots = 0, j = 0;
        uint32_t nr[9], nw[9], first[9];
        for (uint32_t i = 0; i < nchains; i++) {
            nr[i] = ones ? 0 : shapes[i][0];
            nw[i] = ones ? 1 : shapes[i][1];
            first[i] = j;
            struct vhd_drv_buf b[3];
            for (uint32_t s = 0; s < nr[i] + nw[i]; s++, j++) {
                b[s].gpa = data + 64ull * j;
                b[s].len = 1 + j;
                p[64 * j] = (uint8_t)(0x40 + j);
            }
            VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b, nr[i], nw[i], false, (void *)(uintptr_t)(i + 1)),
                         0);
            slots += nr[i] + nw[i];
        }
        vhd_drv_vq_publish(&f.dq);
        VHD_CHECK(start + slots > 13); /* the run crosses the end */

        struct iovec iov[16 * 4];
        struct vhd_vq_chain c[16];
        uint32_t written[16];
        VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 4, c, 16), (int)nchains);
        VHD_CHECK_EQ(f.vq.error, 0);
        for (uint32_t k = 0; k < nchains; k++) {
            VHD_CHECK_EQ(c[k].nr, nr[k]);
            VHD_CHECK_EQ(c[k].nw, nw[k]);
            VHD_CHECK_EQ(c[k].ndescs, nr[k] + nw[k]);
            uint32_t rl = 0, wl = 0;
            for (uint32_t s = 0; s < nr[k] + nw[k]; s++) {
                uint32_t jb = first[k] + s;
                VHD_CHECK_EQ(iov[4 * k + s].iov_len, 1 + jb);
                VHD_CHECK_EQ(*(const uint8_t *)iov[4 * k + s].iov_base, 0x40 + jb);
                if (s < nr[k])
                    rl += 1 + jb;
                else
                    wl += 1 + jb;
            }
            VHD_CHECK_EQ(c[k].rlen, rl);
            VHD_CHECK_EQ(c[k].wlen, wl);
            written[k] = wl;
        }
        VHD_CHECK_EQ(f.vq.last_avail_idx, (start + slots) % 13);
        VHD_CHECK_EQ(f.vq.avail_wrap, false);
        VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 4, c, 16), 0);
        VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, written, nchains), 0);
        vhd_vq_flush(&f.vq);
        void *ck;
        uint32_t len;
        for (uint32_t k = 0; k < nchains; k++) {
            VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
            VHD_CHECK_EQ((uintptr_t)ck, k + 1);
            VHD_CHECK_EQ(len, written[k]);
        }
        vqfx_teardown(&f);
    }
}

/*
 * Packed, a bad chain after the ring's end: the run delivers the chains
 * before it (the one straddling the end among them) with the queue
 * working; the next pop breaks the queue with the single pop's error.
 */
VHD_TEST(burst_packed_bad_chain_after_ring_end)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 13, .packed = true};
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    advance(&f, buf, 12, 4); /* slot 12, wrap counter 1 */
    for (uint32_t i = 0; i < 3; i++) {
        struct vhd_drv_buf b[2] = {{buf + 64 * i, 16}, {buf + 64 * i + 32, 1}};
        VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b, 1, 1, false, (void *)(uintptr_t)(i + 1)), 0);
    }
    vhd_drv_vq_publish(&f.dq);
    /* chains at 12-0, 1-2, 3-4: the third's head becomes a one-slot chain with a bad id */
    vqfx_packed_desc(&f, 3, buf, 16, 0x7fff, vqfx_pavail(false));
    struct iovec iov[8 * 4];
    struct vhd_vq_chain c[8];
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 4, c, 8), 2);
    VHD_CHECK_EQ(f.vq.error, 0);
    VHD_CHECK_EQ(c[0].ndescs, 2);
    VHD_CHECK_EQ(c[1].ndescs, 2);
    VHD_CHECK_EQ(f.vq.last_avail_idx, 3);
    uint32_t written[2] = {1, 1};
    VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, written, 2), 0);
    vhd_vq_flush(&f.vq);
    void *ck;
    uint32_t len;
    for (uintptr_t i = 1; i <= 2; i++) {
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
        VHD_CHECK_EQ((uintptr_t)ck, i);
    }
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 4, c, 8), -VHD_VQ_E_BUFFER_ID);
    VHD_CHECK_EQ(f.vq.error, VHD_VQ_E_BUFFER_ID);
    vqfx_teardown(&f);
}

/*
 * Packed, the end of the driver's slots after the ring's end: the device
 * holds two chains (slots 3 and 4, popped, not used), so the driver owns
 * slots 5..12 and 0..2. A run takes 5-6 and the chain straddling the end
 * (7..0 with the room ending at 2), then meets a chain whose last slot (2)
 * says NEXT: it would run into slot 3, the device's. The run ends before
 * it (even with slot 3 forged to look available); the next pop breaks the
 * queue with PACKED_CHAIN, as a single pop.
 */
VHD_TEST(burst_packed_chain_into_device_slots_after_ring_end)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 13, .packed = true};
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    advance(&f, buf, 3, 4); /* slot 3, wrap counter 1 */
    drv_add_k(&f, buf, 2, 1);
    vhd_drv_vq_publish(&f.dq);
    struct iovec held_iov[2 * 4];
    struct vhd_vq_chain held[2];
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, held_iov, 4, held, 2), 2);

    struct vhd_drv_buf b2[2] = {{buf, 16}, {buf + 32, 1}};
    struct vhd_drv_buf b7[7] = {{buf, 8},      {buf + 8, 8},  {buf + 16, 8}, {buf + 24, 8},
                                {buf + 32, 8}, {buf + 40, 8}, {buf + 48, 1}};
    VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b2, 1, 1, false, (void *)(uintptr_t)1), 0); /* 5-6 */
    VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b7, 6, 1, false, (void *)(uintptr_t)2), 0); /* 7..12, 0 */
    VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b2, 1, 1, false, (void *)(uintptr_t)3), 0); /* 1-2 */
    vhd_drv_vq_publish(&f.dq);
    /* slot 2, the last the driver owns, now says NEXT (still available, writable) */
    struct vhd_vring_packed_desc *d2 = &f.dq.ring.packed.desc[2];
    vqfx_packed_desc(&f, 2, vhd_le64(d2->addr), vhd_le32(d2->len), vhd_le16(d2->id),
                     (uint16_t)(vhd_le16(d2->flags) | VRING_DESC_F_NEXT));
    /* and slot 3, the device's, is rewritten to look available in this lap: still not the driver's
     */
    vqfx_packed_desc(&f, 3, buf + 64, 1, 0, vqfx_pavail(false) | VRING_DESC_F_WRITE);
    struct iovec iov[8 * 8];
    struct vhd_vq_chain c[8];
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 8, c, 8), 2);
    VHD_CHECK_EQ(f.vq.error, 0);
    VHD_CHECK_EQ(c[0].ndescs, 2);
    VHD_CHECK_EQ(c[1].ndescs, 7);
    VHD_CHECK_EQ(c[1].nr, 6);
    VHD_CHECK_EQ(c[1].rlen, 48);
    VHD_CHECK_EQ(f.vq.last_avail_idx, 1);
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 8, c, 8), -VHD_VQ_E_PACKED_CHAIN);
    VHD_CHECK_EQ(f.vq.error, VHD_VQ_E_PACKED_CHAIN);
    vqfx_teardown(&f);
}

/*
 * A bad chain after three good ones: the run returns the three with the
 * queue still working, they are pushed and published normally (with
 * inflight tracking: recorded, then cleared), and the next pop breaks the
 * queue with the error a single pop gives.
 */
BOTH(burst_bad_chain_mid_run)
{
    for (int tracked = 0; tracked < 2; tracked++) {
        struct vqfx f;
        struct vqfx_opts o = {.size = 16, .packed = packed, .no_start = true};
        vqfx_setup(&f, &o);
        void *inf = NULL;
        if (tracked) {
            size_t len = vhd_inflight_queue_size(packed, 16);
            inf = aligned_alloc(64, (len + 63) & ~(size_t)63);
            VHD_CHECK(inf != NULL);
            memset(inf, 0, len);
            VHD_CHECK_EQ(vhd_vq_set_inflight(&f.vq, inf, 16), 0);
        }
        VHD_CHECK_EQ(vhd_vq_start(&f.vq), 0);
        uint64_t buf = vqfx_alloc(&f, 4096, NULL);
        for (uint32_t i = 0; i < 3; i++) {
            struct vhd_drv_buf b[2] = {{buf + 64 * i, 16}, {buf + 64 * i + 32, 1}};
            VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b, 1, 1, false, (void *)(uintptr_t)(i + 1)), 0);
        }
        vhd_drv_vq_publish(&f.dq);
        int err;
        if (packed) {
            /* slot 6 (after three 2-slot chains): a buffer id beyond the ring */
            vqfx_packed_desc(&f, 6, buf, 16, 0x7fff, vqfx_pavail(true));
            err = VHD_VQ_E_BUFFER_ID;
        } else {
            vqfx_split_post(&f, 0xffff);
            err = VHD_VQ_E_DESC_INDEX;
        }
        struct iovec iov[8 * 4];
        struct vhd_vq_chain c[8];
        VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 4, c, 8), 3);
        VHD_CHECK_EQ(f.vq.error, 0);
        if (tracked) {
            uint32_t marked = 0;
            for (uint32_t i = 0; i < 16; i++)
                marked += packed ? ((struct vhd_inflight_packed *)inf)->desc[i].inflight
                                 : ((struct vhd_inflight_split *)inf)->desc[i].inflight;
            VHD_CHECK_EQ(marked, 3);
        }
        uint32_t written[3] = {1, 1, 1};
        VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, written, 3), 0);
        vhd_vq_flush(&f.vq);
        void *ck;
        uint32_t len;
        for (uintptr_t i = 1; i <= 3; i++) {
            VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
            VHD_CHECK_EQ((uintptr_t)ck, i);
            VHD_CHECK_EQ(len, 1);
        }
        VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 4, c, 8), -err);
        VHD_CHECK_EQ(f.vq.error, err);
        VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 4, c, 8), -err); /* sticky */
        vhd_vq_fini(&f.vq);
        free(inf);
        vqfx_teardown(&f);
    }
}

/* A bad first chain breaks the queue at once, as vhd_vq_pop does. */
BOTH(burst_bad_first_chain)
{
    struct vqfx f;
    uint64_t buf = mal_setup(&f, packed, false, 8);
    struct vqfx_pd d[1] = {{buf, 16, 0, IND}};
    mal_chain(&f, d, 1);
    struct iovec iov[4 * 4];
    struct vhd_vq_chain c[4];
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 4, c, 4), -VHD_VQ_E_INDIRECT_NOFEAT);
    VHD_CHECK_EQ(f.vq.error, VHD_VQ_E_INDIRECT_NOFEAT);
    vqfx_teardown(&f);
}

/* Pushing more than was popped: the chains before the bad one are pushed, then the queue breaks. */
BOTH(burst_push_overflow)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .packed = packed};
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    for (uint32_t i = 0; i < 2; i++) {
        struct vhd_drv_buf b[1] = {{buf + 64 * i, 16}};
        VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b, 0, 1, false, (void *)(uintptr_t)(i + 1)), 0);
    }
    vhd_drv_vq_publish(&f.dq);
    struct iovec iov[4 * 2];
    struct vhd_vq_chain c[3];
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 2, c, 4), 2);
    c[2] = c[1];
    VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, NULL, 3), -VHD_VQ_E_USED_OVERFLOW);
    VHD_CHECK_EQ(f.vq.inflight, 0);
    VHD_CHECK_EQ(f.vq.error, VHD_VQ_E_USED_OVERFLOW);
    vqfx_teardown(&f);
}

/* vhd_vq_pop_burstv: each chain into its own arrays, in the order given; the same chains as a run.
 */
BOTH(burstv_own_arrays)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 32, .packed = packed, .indirect = true, .max_indirect = 4};
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    for (uint32_t i = 0; i < 6; i++) {
        struct vhd_drv_buf b[3] = {
            {buf + 64 * i, 16}, {buf + 64 * i + 16, 8 + i}, {buf + 64 * i + 40, 1}};
        VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b, 2, 1, i & 1, (void *)(uintptr_t)(i + 1)), 0);
        *(uint8_t *)vqfx_ptr(&f, buf + 64 * i + 40, 1) = (uint8_t)(0xa0 + i);
    }
    vhd_drv_vq_publish(&f.dq);
    struct iovec own[8][3];
    struct vhd_vq_chain ch[8];
    struct iovec *iovs[8];
    struct vhd_vq_chain *cs[8];
    for (uint32_t k = 0; k < 8; k++) {
        iovs[k] = own[7 - k];
        cs[k] = &ch[7 - k];
    }
    VHD_CHECK_EQ(vhd_vq_pop_burstv(&f.vq, iovs, 3, cs, 8), 6);
    for (uint32_t k = 0; k < 6; k++) {
        VHD_CHECK_EQ(cs[k]->nr, 2);
        VHD_CHECK_EQ(cs[k]->nw, 1);
        VHD_CHECK_EQ(cs[k]->rlen, 16 + 8 + k);
        VHD_CHECK_EQ(cs[k]->wlen, 1);
        VHD_CHECK_EQ(iovs[k][1].iov_len, 8 + k);
        /* the device's mapping of the status byte of request k (marked through ours) */
        VHD_CHECK_EQ(*(uint8_t *)iovs[k][2].iov_base, 0xa0 + k);
    }
    uint32_t written[6] = {1, 1, 1, 1, 1, 1};
    struct vhd_vq_chain in_order[6];
    for (uint32_t k = 0; k < 6; k++)
        in_order[k] = *cs[k];
    VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, in_order, written, 6), 0);
    vhd_vq_flush(&f.vq);
    void *ck;
    uint32_t len;
    for (uintptr_t i = 1; i <= 6; i++) {
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
        VHD_CHECK_EQ((uintptr_t)ck, i);
    }
    vqfx_teardown(&f);
}

/*
 * Dirty logging on the batch verbs: a run popped, its writable buffers
 * written and logged, pushed in one call and published: the data pages and
 * the ring page the used entries went to are marked, and no other page.
 */
BOTH(burst_dirty_log)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 16, .packed = packed};
    vqfx_setup(&f, &o);
    int lfd = memfd_create("vhd-test-log", MFD_CLOEXEC);
    VHD_CHECK(lfd >= 0);
    VHD_CHECK_EQ(ftruncate(lfd, 4096), 0);
    struct vhd_dirtylog *log = NULL;
    const char *why;
    VHD_CHECK_EQ(vhd_dirtylog_map(lfd, 4096, 0, &log, &why), 0); /* 32768 pages */
    vhd_vq_set_log(&f.vq, log, true, f.dq.used_gpa);

    void *p;
    uint64_t data = vhd_guestmem_alloc(&f.gm, 8 * 4096, 4096, &p);
    VHD_CHECK(data != UINT64_MAX);
    for (uint32_t i = 0; i < 4; i++) {
        struct vhd_drv_buf b[2] = {{data + 4096ull * 2 * i, 16},
                                   {data + 4096ull * (2 * i + 1), 64}};
        VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, b, 1, 1, false, (void *)(uintptr_t)(i + 1)), 0);
    }
    vhd_drv_vq_publish(&f.dq);
    struct iovec iov[4 * 2];
    struct vhd_vq_chain c[4];
    uint32_t written[4];
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 2, c, 4), 4);
    for (uint32_t k = 0; k < 4; k++) {
        memset(iov[2 * k + 1].iov_base, 0x5a, iov[2 * k + 1].iov_len);
        vhd_vq_log_write(&f.vq, &iov[2 * k + 1], 1, iov[2 * k + 1].iov_len);
        written[k] = (uint32_t)iov[2 * k + 1].iov_len;
    }
    VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, written, 4), 0);
    vhd_vq_flush(&f.vq);

    uint64_t ring_page = (packed ? f.dq.desc_gpa : f.dq.used_gpa) >> VHD_DIRTYLOG_PAGE_SHIFT;
    for (uint64_t pg = 0; pg < 32768; pg++) {
        bool want = pg == ring_page;
        for (uint32_t i = 0; i < 4; i++)
            want = want || pg == ((data >> VHD_DIRTYLOG_PAGE_SHIFT) + 2 * i + 1);
        bool got = (log->bits[pg / 8] >> (pg % 8)) & 1;
        if (got != want)
            fprintf(stderr, "  page %llu: marked %d, expected %d\n", (unsigned long long)pg, got,
                    want);
        VHD_CHECK_EQ(got, want);
    }
    void *ck;
    uint32_t len;
    for (uintptr_t i = 1; i <= 4; i++) {
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
        VHD_CHECK_EQ(len, 64);
    }
    vhd_vq_set_log(&f.vq, NULL, false, 0);
    vhd_dirtylog_free(log);
    close(lfd);
    vqfx_teardown(&f);
}

/* ---- split runs: indirect tables the fast table walk hands to the full walk ---- */

/*
 * Each case is one chain (head 4) published between good ones (head 0: an
 * indirect chain, head 2: a direct one, head 8: another indirect one; all
 * direct without VIRTIO_F_INDIRECT_DESC), on two fixtures laid out alike:
 * popped chain by chain with vhd_vq_pop on one and as runs with
 * vhd_vq_pop_burst on the other, with and without inflight tracking. The
 * outcomes (chains, their segments as guest addresses, the error, the ring
 * state, the inflight records) must be identical, and the case's chain must
 * pop as expected (err, or the shape nr / nw / rlen / wlen).
 */
enum tw_case {
    TW_IN_ORDER,     /* R, R, W in table order (the fast walk's own case) */
    TW_OUT_OF_ORDER, /* 0 -> 2 -> 1: a valid chain, not in table order */
    TW_LOOP,         /* 0 -> 1 -> 0 */
    TW_NEXT_AT_END,  /* the last entry names next == n */
    TW_NEXT_BEYOND,  /* 0 -> 7 in a 2-entry table */
    TW_NESTED,       /* the second entry has INDIRECT */
    TW_NESTED_FIRST, /* the first entry has INDIRECT */
    TW_READ_AFTER_WRITE,
    TW_ENTRY_OTHER,    /* an entry's buffer in region 1 (valid) */
    TW_ENTRY_OUTSIDE,  /* an entry's buffer outside guest memory */
    TW_ENTRY_CROSSING, /* an entry's buffer across the two regions (two segments) */
    TW_TABLE_OTHER,    /* the table in region 1 (valid) */
    TW_TABLE_CROSSING, /* the table across the two regions */
    TW_TABLE_LEN_ODD,  /* 24 bytes */
    TW_TABLE_LEN_ZERO,
    TW_HEAD_NEXT,  /* INDIRECT | NEXT on the head */
    TW_HEAD_WRITE, /* INDIRECT | WRITE on the head: WRITE ignored (2.7.5.3.2) */
    TW_DIRECT_THEN_TABLE,
    TW_TABLE_LONGER, /* 4 entries, the chain uses 2 */
    TW_TABLE_ROOMY,  /* 6 entries (more than max_iov), the chain uses 2 */
    TW_IOV_FULL,     /* 5 entries in order, max_iov 4 */
    TW_EMPTY_ENTRY,  /* a zero-length entry: no segment */
    TW_OTHER_FLAG,   /* an entry with an unknown flag bit */
    TW_NOFEAT,       /* a table without VIRTIO_F_INDIRECT_DESC */
    TW__COUNT
};

struct tw_expect {
    int err; /* VHD_VQ_E_*, or 0: a chain of this shape */
    uint16_t nr, nw;
    uint32_t rlen, wlen;
};

static const struct tw_expect tw_expected[TW__COUNT] = {
    [TW_IN_ORDER] = {0, 2, 1, 24, 1},
    [TW_OUT_OF_ORDER] = {0, 2, 1, 24, 1},
    [TW_LOOP] = {VHD_VQ_E_CHAIN_LOOP, 0, 0, 0, 0},
    [TW_NEXT_AT_END] = {VHD_VQ_E_DESC_INDEX, 0, 0, 0, 0},
    [TW_NEXT_BEYOND] = {VHD_VQ_E_DESC_INDEX, 0, 0, 0, 0},
    [TW_NESTED] = {VHD_VQ_E_NESTED_INDIRECT, 0, 0, 0, 0},
    [TW_NESTED_FIRST] = {VHD_VQ_E_NESTED_INDIRECT, 0, 0, 0, 0},
    [TW_READ_AFTER_WRITE] = {VHD_VQ_E_WRITE_ORDER, 0, 0, 0, 0},
    [TW_ENTRY_OTHER] = {0, 1, 1, 16, 1},
    [TW_ENTRY_OUTSIDE] = {VHD_VQ_E_ADDR, 0, 0, 0, 0},
    [TW_ENTRY_CROSSING] = {0, 2, 1, 32, 1},
    [TW_TABLE_OTHER] = {0, 1, 1, 16, 1},
    [TW_TABLE_CROSSING] = {VHD_VQ_E_ADDR, 0, 0, 0, 0},
    [TW_TABLE_LEN_ODD] = {VHD_VQ_E_INDIRECT_LEN, 0, 0, 0, 0},
    [TW_TABLE_LEN_ZERO] = {VHD_VQ_E_INDIRECT_LEN, 0, 0, 0, 0},
    [TW_HEAD_NEXT] = {VHD_VQ_E_INDIRECT_FLAGS, 0, 0, 0, 0},
    [TW_HEAD_WRITE] = {0, 1, 1, 16, 1},
    [TW_DIRECT_THEN_TABLE] = {0, 2, 1, 24, 1},
    [TW_TABLE_LONGER] = {0, 1, 1, 16, 1},
    [TW_TABLE_ROOMY] = {0, 1, 1, 16, 1},
    [TW_IOV_FULL] = {VHD_VQ_E_IOV_FULL, 0, 0, 0, 0},
    [TW_EMPTY_ENTRY] = {0, 1, 1, 16, 1},
    [TW_OTHER_FLAG] = {0, 1, 1, 16, 1},
    [TW_NOFEAT] = {VHD_VQ_E_INDIRECT_NOFEAT, 0, 0, 0, 0},
};

#define TW_REGION  (1ull << 20)
#define TW_R1      (VQFX_BASE_GPA + TW_REGION) /* region 1's first byte */
#define TW_MAX_IOV 4u

/* A table of n entries in region 0; *t our pointer to it. */
static uint64_t tw_table(struct vqfx *f, uint32_t n, void **t)
{
    return vqfx_alloc(f, 16ull * n, t);
}

/* A good indirect chain at head h (R 16, W 1), or a direct one without the feature. */
static void tw_good(struct vqfx *f, uint16_t h, uint64_t buf, bool ind)
{
    if (ind) {
        void *t;
        uint64_t tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        vqfx_split_desc(f, h, tg, 32, IND, 0);
    } else {
        vqfx_split_desc(f, h, buf, 16, NEXT, (uint16_t)(h + 1));
        vqfx_split_desc(f, (uint16_t)(h + 1), buf + 32, 1, WRITE, 0);
    }
}

/* The case's chain at head 4 (descriptors 4..7), its tables and buffers from buf. */
static void tw_case_chain(struct vqfx *f, enum tw_case k, uint64_t buf)
{
    void *t;
    uint64_t tg;
    uint16_t ind_flags = IND;
    uint32_t tlen = 2 * 16; /* the head's len: the table's size unless a case says */

    switch (k) {
    case TW_IN_ORDER:
        tg = tw_table(f, 3, &t);
        tlen = 3 * 16;
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 16, 8, NEXT, 2);
        vqfx_table_desc(t, 2, buf + 32, 1, WRITE, 0);
        break;
    case TW_OUT_OF_ORDER:
        tg = tw_table(f, 3, &t);
        tlen = 3 * 16;
        vqfx_table_desc(t, 0, buf, 16, NEXT, 2);
        vqfx_table_desc(t, 2, buf + 16, 8, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        break;
    case TW_LOOP:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 16, 16, NEXT, 0);
        break;
    case TW_NEXT_AT_END:
        /* a good entry just past the table's 2: it must not be read as entry 2 */
        tg = tw_table(f, 3, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE | NEXT, 2);
        vqfx_table_desc(t, 2, buf + 48, 1, WRITE, 0);
        break;
    case TW_NEXT_BEYOND:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 7);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        break;
    case TW_NESTED:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, tg, 32, IND, 0);
        break;
    case TW_NESTED_FIRST:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, tg, 32, IND | NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        break;
    case TW_READ_AFTER_WRITE:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf + 32, 1, WRITE | NEXT, 1);
        vqfx_table_desc(t, 1, buf, 16, 0, 0);
        break;
    case TW_ENTRY_OTHER:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, TW_R1 + 4096, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        break;
    case TW_ENTRY_OUTSIDE:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, vqfx_mem_end(f) + 4096, 1, WRITE, 0);
        break;
    case TW_ENTRY_CROSSING:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, TW_R1 - 16, 32, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        break;
    case TW_TABLE_OTHER:
        tg = TW_R1 + 8192;
        t = vqfx_ptr(f, tg, 32);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        break;
    case TW_TABLE_CROSSING:
        /* entry 0 in region 0's last 16 bytes, entry 1 in region 1's first 16 */
        tg = TW_R1 - 16;
        vqfx_table_desc(vqfx_ptr(f, tg, 16), 0, buf, 16, NEXT, 1);
        vqfx_table_desc(vqfx_ptr(f, TW_R1, 16), 0, buf + 32, 1, WRITE, 0);
        break;
    case TW_TABLE_LEN_ODD:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, 0, 0);
        tlen = 24;
        break;
    case TW_TABLE_LEN_ZERO:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, 0, 0);
        tlen = 0;
        break;
    case TW_HEAD_NEXT:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        ind_flags = IND | NEXT;
        break;
    case TW_HEAD_WRITE:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        ind_flags = IND | WRITE;
        break;
    case TW_DIRECT_THEN_TABLE:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf + 16, 8, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        vqfx_split_desc(f, 4, buf, 16, NEXT, 6);
        vqfx_split_desc(f, 6, tg, 32, IND, 0);
        return;
    case TW_TABLE_LONGER:
    case TW_TABLE_ROOMY:
        tg = tw_table(f, k == TW_TABLE_LONGER ? 4 : 6, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        tlen = k == TW_TABLE_LONGER ? 4 * 16 : 6 * 16;
        break;
    case TW_IOV_FULL:
        tg = tw_table(f, 5, &t);
        tlen = 5 * 16;
        for (uint32_t i = 0; i < 5; i++)
            vqfx_table_desc(t, i, buf + 16 * i, 16, i < 4 ? NEXT : 0, (uint16_t)(i + 1));
        break;
    case TW_EMPTY_ENTRY:
        tg = tw_table(f, 3, &t);
        tlen = 3 * 16;
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 16, 0, NEXT, 2);
        vqfx_table_desc(t, 2, buf + 32, 1, WRITE, 0);
        break;
    case TW_OTHER_FLAG:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT | 0x8, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        break;
    case TW_NOFEAT:
    default:
        tg = tw_table(f, 2, &t);
        vqfx_table_desc(t, 0, buf, 16, NEXT, 1);
        vqfx_table_desc(t, 1, buf + 32, 1, WRITE, 0);
        break;
    }
    vqfx_split_desc(f, 4, tg, tlen, ind_flags, 0);
}

#define TW_MAX_OUT 16u

/* What one play saw: the chains popped, then what the next pop returned, and the state. */
struct tw_out {
    uint32_t n;
    struct vhd_vq_chain c[TW_MAX_OUT];
    uint64_t seg_gpa[TW_MAX_OUT][TW_MAX_IOV];
    uint64_t seg_len[TW_MAX_OUT][TW_MAX_IOV];
    int end; /* 0 (ring empty) or -VHD_VQ_E_* */
    uint8_t error;
    uint16_t last_avail_idx, inflight;
    uint8_t inf[4096]; /* the inflight area (tracked plays) */
};

/* A segment's guest address: the two fixtures map guest memory at different host addresses. */
static uint64_t tw_seg_gpa(const struct vhd_mem *m, const void *p)
{
    uintptr_t a = (uintptr_t)p;
    for (uint32_t i = 0; i < m->nregions; i++) {
        uintptr_t b = (uintptr_t)m->regions[i].hva;
        if (a >= b && a - b < m->regions[i].size)
            return m->regions[i].gpa + (a - b);
    }
    VHD_CHECK(false); /* a segment outside guest memory */
    return UINT64_MAX;
}

static void tw_record(struct tw_out *out, const struct vhd_mem *m, const struct vhd_vq_chain *c,
                      const struct iovec *iov)
{
    VHD_CHECK(out->n < TW_MAX_OUT);
    VHD_CHECK((uint32_t)c->nr + c->nw <= TW_MAX_IOV);
    out->c[out->n] = *c;
    for (uint32_t s = 0; s < (uint32_t)c->nr + c->nw; s++) {
        out->seg_gpa[out->n][s] = tw_seg_gpa(m, iov[s].iov_base);
        out->seg_len[out->n][s] = iov[s].iov_len;
    }
    out->n++;
}

/* Pop everything published: chain by chain, or as runs of up to 8; then the state. */
static void tw_pop_all(struct vqfx *f, bool batch, struct tw_out *out, const void *inf,
                       size_t inf_len)
{
    memset(out, 0, sizeof(*out));
    struct iovec iov[8 * TW_MAX_IOV];
    struct vhd_vq_chain c[8];
    int rc;
    do {
        if (batch)
            rc = vhd_vq_pop_burst(&f->vq, iov, TW_MAX_IOV, c, 8);
        else
            rc = vhd_vq_pop(&f->vq, iov, TW_MAX_IOV, c);
        for (int i = 0; i < rc; i++)
            tw_record(out, f->mem, &c[i], iov + (size_t)i * TW_MAX_IOV);
    } while (rc > 0);
    out->end = rc;
    out->error = f->vq.error;
    out->last_avail_idx = f->vq.last_avail_idx;
    out->inflight = f->vq.inflight;
    if (inf) {
        VHD_CHECK(inf_len <= sizeof(out->inf));
        memcpy(out->inf, inf, inf_len);
    }
}

/* The two plays saw the same chains, segments, error and state. */
static void tw_same(const struct tw_out *a, const struct tw_out *b)
{
    VHD_CHECK_EQ(a->n, b->n);
    for (uint32_t i = 0; i < a->n; i++) {
        VHD_CHECK_EQ(a->c[i].id, b->c[i].id);
        VHD_CHECK_EQ(a->c[i].ndescs, b->c[i].ndescs);
        VHD_CHECK_EQ(a->c[i].nr, b->c[i].nr);
        VHD_CHECK_EQ(a->c[i].nw, b->c[i].nw);
        VHD_CHECK_EQ(a->c[i].rlen, b->c[i].rlen);
        VHD_CHECK_EQ(a->c[i].wlen, b->c[i].wlen);
        for (uint32_t s = 0; s < (uint32_t)a->c[i].nr + a->c[i].nw; s++) {
            VHD_CHECK_EQ(a->seg_gpa[i][s], b->seg_gpa[i][s]);
            VHD_CHECK_EQ(a->seg_len[i][s], b->seg_len[i][s]);
        }
    }
    VHD_CHECK_EQ(a->end, b->end);
    VHD_CHECK_EQ(a->error, b->error);
    VHD_CHECK_EQ(a->last_avail_idx, b->last_avail_idx);
    VHD_CHECK_EQ(a->inflight, b->inflight);
    VHD_CHECK(memcmp(a->inf, b->inf, sizeof(a->inf)) == 0);
}

/* Publish case k between the good chains and pop everything: one chain at a time, or as runs. */
static void tw_play(enum tw_case k, bool batch, bool tracked, struct tw_out *out)
{
    struct vqfx f;
    bool ind = k != TW_NOFEAT;
    struct vqfx_opts o = {
        .size = 16, .indirect = ind, .nregions = 2, .region_size = TW_REGION, .no_start = true};
    vqfx_setup(&f, &o);
    size_t inf_len = vhd_inflight_queue_size(false, 16);
    VHD_CHECK(inf_len <= sizeof(out->inf));
    void *inf = NULL;
    if (tracked) {
        inf = aligned_alloc(64, (inf_len + 63) & ~(size_t)63);
        VHD_CHECK(inf != NULL);
        memset(inf, 0, inf_len);
        VHD_CHECK_EQ(vhd_vq_set_inflight(&f.vq, inf, 16), 0);
    }
    VHD_CHECK_EQ(vhd_vq_start(&f.vq), 0);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    tw_good(&f, 0, buf + 256, ind);
    tw_good(&f, 2, buf + 512, false);
    tw_case_chain(&f, k, buf);
    tw_good(&f, 8, buf + 768, ind);
    static const uint16_t heads[] = {0, 2, 4, 8};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(heads); i++)
        vqfx_split_post(&f, heads[i]);

    tw_pop_all(&f, batch, out, inf, inf_len);
    vhd_vq_fini(&f.vq);
    free(inf);
    vqfx_teardown(&f);
}

/*
 * Every case, tracked or not: the run gives what the single pops give, and
 * the case's chain pops as expected (the good ones before it are delivered
 * when it fails; the queue is broken by the pop after them).
 */
VHD_TEST(table_walk_refusals_split)
{
    static struct tw_out a, b;
    for (int k = 0; k < TW__COUNT; k++) {
        for (int tracked = 0; tracked < 2; tracked++) {
            const struct tw_expect *e = &tw_expected[k];
            tw_play((enum tw_case)k, false, tracked, &a);
            tw_play((enum tw_case)k, true, tracked, &b);
            if (a.n != b.n || a.end != b.end || a.end != -e->err || (e->err ? a.n != 2 : a.n != 4))
                fprintf(stderr, "  case %d tracked %d: single %u chains then %d, run %u then %d\n",
                        k, tracked, a.n, a.end, b.n, b.end);
            tw_same(&a, &b);

            /* the case's own outcome */
            VHD_CHECK_EQ(a.end, -e->err);
            VHD_CHECK_EQ(a.error, e->err);
            if (e->err) {
                VHD_CHECK_EQ(a.n, 2);
            } else {
                VHD_CHECK_EQ(a.n, 4);
                VHD_CHECK_EQ(a.c[2].id, 4);
                VHD_CHECK_EQ(a.c[2].nr, e->nr);
                VHD_CHECK_EQ(a.c[2].nw, e->nw);
                VHD_CHECK_EQ(a.c[2].rlen, e->rlen);
                VHD_CHECK_EQ(a.c[2].wlen, e->wlen);
            }
            VHD_CHECK_EQ(a.c[0].id, 0);
            VHD_CHECK_EQ(a.c[1].id, 2);
        }
    }
}

/*
 * Runs mixing direct and indirect chains of random shapes (0-2 readable and
 * 1-2 writable buffers, some in region 1 or across the two regions, which
 * moves the run's cached region), popped as runs and one by one: the same
 * chains, segments and state.
 */
VHD_TEST(table_walk_mixed_run_split)
{
    static struct tw_out a, b;
    uint32_t mixed = 0; /* runs with both direct and indirect chains */
    for (uint32_t seed = 1; seed <= 60; seed++) {
        uint32_t n = 0, indirect = 0;
        for (int batch = 0; batch < 2; batch++) {
            struct vqfx f;
            struct vqfx_opts o = {.size = 64, /* room for 16 chains of 3 descriptors */
                                  .indirect = true,
                                  .max_indirect = 4,
                                  .nregions = 2,
                                  .region_size = TW_REGION};
            vqfx_setup(&f, &o);
            uint64_t pool = vqfx_alloc(&f, 8192, NULL);
            rng_seed(seed);
            n = 1 + rnd_below(16);
            indirect = 0;
            for (uint32_t i = 0; i < n; i++) {
                struct vhd_drv_buf bufs[3];
                uint32_t nr = rnd_below(3), nw = 1 + rnd_below(2);
                bool crossed = false, ind = rnd_below(3) != 0;
                if (nr + nw > 3)
                    nr = 3 - nw;
                for (uint32_t k = 0; k < nr + nw; k++) {
                    uint32_t where = rnd_below(8);
                    bufs[k].len = 1 + rnd_below(64);
                    if (where == 0) {
                        bufs[k].gpa = TW_R1 + rnd_below(4096);
                    } else if (where == 1 && !crossed) {
                        bufs[k].gpa = TW_R1 - 1 - rnd_below(bufs[k].len > 1 ? bufs[k].len - 1 : 1);
                        crossed = bufs[k].gpa + bufs[k].len > TW_R1;
                    } else {
                        bufs[k].gpa = pool + rnd_below(8000);
                    }
                }
                VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, bufs, nr, nw, ind, (void *)(uintptr_t)(i + 1)),
                             0);
                indirect += ind;
            }
            vhd_drv_vq_publish(&f.dq);
            tw_pop_all(&f, batch, batch ? &b : &a, NULL, 0);
            vqfx_teardown(&f);
        }
        tw_same(&a, &b);
        VHD_CHECK_EQ(a.end, 0);
        VHD_CHECK_EQ(a.error, 0);
        VHD_CHECK_EQ(a.n, n);
        mixed += indirect > 0 && indirect < n;
    }
    VHD_CHECK(mixed >= 30);
}

/* ---- VIRTIO_F_IN_ORDER: a transmit run used with one entry (vhd_vq_push_burst) ---- */

#define IO_QMAX 64u /* rings of the in-order tests hold at most this many slots */

/*
 * An in-order driver (2.7.9, 2.8.8) written against the rings directly:
 * descriptors (split) and ring slots (packed) are filled in ring order, a
 * chain's descriptors are consecutive, a packed buffer id is the chain's
 * first slot, and a used entry names the last buffer of a batch that
 * starts at the first buffer not used yet. Every batch collected is
 * recorded (its size and used length).
 */
struct io_drv {
    struct vqfx *f;
    uint32_t size;
    uint64_t buf;                          /* 64 bytes of buffer per descriptor / slot */
    uint16_t q_id[IO_QMAX], q_nd[IO_QMAX]; /* chains in flight, in avail order */
    uint32_t qh, qt;                       /* FIFO head and tail (free-running) */
    uint32_t free;                         /* descriptors / slots free */
    uint32_t next;                         /* next descriptor / slot to fill */
    bool wrap;                             /* packed: driver ring wrap counter */
    uint32_t used;                         /* split: next used index (16-bit); packed: slot */
    bool used_wrap;                        /* packed: wrap counter of the next used slot */
    uint32_t batch[IO_QMAX], blen[IO_QMAX], nbatch;
};

static void io_init(struct io_drv *d, struct vqfx *f)
{
    memset(d, 0, sizeof(*d));
    VHD_CHECK(f->o.size <= IO_QMAX);
    d->f = f;
    d->size = f->o.size;
    d->buf = vqfx_alloc(f, 64ull * d->size, NULL);
    d->free = d->size;
    d->wrap = true;
    d->used_wrap = true;
}

/*
 * Queue and publish one chain of nd descriptors: 16-byte device-readable
 * buffers, the last one device-writable with wlen bytes when wlen != 0.
 * false when the ring has no room.
 */
static bool io_add(struct io_drv *d, uint32_t nd, uint32_t wlen)
{
    struct vqfx *f = d->f;
    uint16_t id = (uint16_t)d->next;

    if (nd > d->free)
        return false;
    if (f->o.packed) {
        struct vqfx_pd pd[4];
        VHD_CHECK(nd <= 4);
        for (uint32_t j = 0; j < nd; j++) {
            bool last = j + 1 == nd, w = last && wlen != 0;
            pd[j] = (struct vqfx_pd){
                d->buf + 64ull * ((d->next + j) % d->size), w ? wlen : 16, id,
                (uint16_t)((last ? 0 : VRING_DESC_F_NEXT) | (w ? VRING_DESC_F_WRITE : 0))};
        }
        uint16_t slot = (uint16_t)d->next;
        vqfx_packed_chain(f, &slot, &d->wrap, pd, nd);
        d->next = slot;
    } else {
        for (uint32_t j = 0; j < nd; j++) {
            uint32_t i = (d->next + j) % d->size;
            bool last = j + 1 == nd, w = last && wlen != 0;
            vqfx_split_desc(
                f, (uint16_t)i, d->buf + 64ull * i, w ? wlen : 16,
                (uint16_t)((last ? 0 : VRING_DESC_F_NEXT) | (w ? VRING_DESC_F_WRITE : 0)),
                (uint16_t)((i + 1) % d->size));
        }
        vqfx_split_post(f, id);
        d->next = (d->next + nd) % d->size;
    }
    d->q_id[d->qt % IO_QMAX] = id;
    d->q_nd[d->qt % IO_QMAX] = (uint16_t)nd;
    d->qt++;
    d->free -= nd;
    return true;
}

/* Take the chains of one batch, up to the one with id; returns the count (0: id not in flight). */
static uint32_t io_take(struct io_drv *d, uint32_t id)
{
    uint32_t cnt = 0;
    while (d->qh != d->qt) {
        uint32_t h = d->qh++ % IO_QMAX;
        cnt++;
        d->free += d->q_nd[h];
        if (d->f->o.packed) {
            d->used += d->q_nd[h];
            if (d->used >= d->size) {
                d->used -= d->size;
                d->used_wrap = !d->used_wrap;
            }
        }
        if (d->q_id[h] == id)
            return cnt;
    }
    return 0;
}

/* Collect every published used entry; returns the buffers they covered. */
static uint32_t io_collect(struct io_drv *d)
{
    struct vqfx *f = d->f;
    uint32_t total = 0;

    if (!f->o.packed) {
        struct vhd_vring_used *u = f->dq.ring.split.used;
        uint16_t idx = vhd_le16(vhd_load_acquire(&u->idx));
        while ((uint16_t)d->used != idx) {
            const struct vhd_vring_used_elem *e = &u->ring[d->used & (d->size - 1)];
            uint32_t cnt = io_take(d, vhd_le32(e->id));
            VHD_CHECK(cnt != 0);
            VHD_CHECK(cnt <= (uint16_t)(idx - d->used));
            VHD_CHECK(d->nbatch < IO_QMAX);
            d->batch[d->nbatch] = cnt;
            d->blen[d->nbatch++] = vhd_le32(e->len);
            d->used = (uint16_t)(d->used + cnt);
            total += cnt;
        }
        return total;
    }
    while (d->qh != d->qt) {
        const struct vhd_vring_packed_desc *pd = &f->dq.ring.packed.desc[d->used];
        uint16_t fl = vhd_le16(vhd_load_acquire(&pd->flags));
        if (((fl & VRING_PACKED_DESC_F_AVAIL) != 0) != d->used_wrap ||
            ((fl & VRING_PACKED_DESC_F_USED) != 0) != d->used_wrap)
            break;
        uint32_t len = vhd_le32(pd->len);
        VHD_CHECK((fl & VRING_DESC_F_WRITE) || len == 0);
        uint32_t cnt = io_take(d, vhd_le16(pd->id));
        VHD_CHECK(cnt != 0);
        VHD_CHECK(d->nbatch < IO_QMAX);
        d->batch[d->nbatch] = cnt;
        d->blen[d->nbatch++] = len;
        total += cnt;
    }
    return total;
}

/* A started queue with VIRTIO_F_IN_ORDER negotiated (and inflight tracking when inf). */
static void io_setup(struct vqfx *f, bool packed, uint32_t size, bool event_idx, void **inf)
{
    struct vqfx_opts o = {.size = size, .packed = packed, .event_idx = event_idx, .no_start = true};
    vqfx_setup(f, &o);
    f->params.in_order = true;
    VHD_CHECK_EQ(vhd_vq_init(&f->vq, &f->params, f->mem), 0);
    VHD_CHECK(f->vq.in_order);
    if (inf) {
        size_t len = vhd_inflight_queue_size(packed, size);
        *inf = aligned_alloc(64, (len + 63) & ~(size_t)63);
        VHD_CHECK(*inf != NULL);
        memset(*inf, 0, len);
        VHD_CHECK_EQ(vhd_vq_set_inflight(&f->vq, *inf, size), 0);
    }
    VHD_CHECK_EQ(vhd_vq_start(&f->vq), 0);
}

/* Pop n chains (in runs); every one must come. */
static void io_pop(struct vqfx *f, struct vhd_vq_chain *c, uint32_t n)
{
    struct iovec iov[IO_QMAX * 4];
    uint32_t got = 0;
    while (got < n) {
        int rc = vhd_vq_pop_burst(&f->vq, iov, 4, c + got, 1 + rnd_below(n - got));
        VHD_CHECK(rc > 0);
        got += (uint32_t)rc;
    }
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f->vq, iov, 4, c + got, 1), 0);
}

/* Where used entries go: split used->ring (8 bytes each), packed the descriptor ring (16). */
static uint8_t *io_ring(struct vqfx *f, size_t *esz)
{
    *esz = f->o.packed ? 16 : 8;
    return f->o.packed ? (uint8_t *)f->dq.ring.packed.desc : (uint8_t *)f->dq.ring.split.used->ring;
}

/* The device's next used position: split ring index, packed slot. */
static uint32_t io_upos(const struct vqfx *f)
{
    return f->o.packed ? f->vq.used_idx : (uint32_t)(f->vq.used_idx & (f->o.size - 1));
}

/*
 * Before pushes: fill the split used ring with a pattern (the driver has
 * collected everything) and snapshot the used-entry ring into snap.
 */
static void io_snap(struct vqfx *f, uint8_t *snap)
{
    size_t esz;
    uint8_t *r = io_ring(f, &esz);
    if (!f->o.packed)
        memset(r, 0xa5, esz * f->o.size);
    memcpy(snap, r, esz * f->o.size);
}

/* Since io_snap, no entry of the ring changed but those at pos[0..n). */
static void io_only_written(struct vqfx *f, const uint8_t *snap, const uint32_t *pos, uint32_t n)
{
    size_t esz;
    const uint8_t *r = io_ring(f, &esz);
    for (uint32_t e = 0; e < f->o.size; e++) {
        bool listed = false;
        for (uint32_t i = 0; i < n; i++)
            listed = listed || pos[i] == e;
        if (!listed && memcmp(r + e * esz, snap + e * esz, esz) != 0) {
            fprintf(stderr, "  used entry %u written, expected only the runs' first\n", e);
            VHD_CHECK(false);
        }
    }
}

/*
 * Transmit runs (device-readable chains of 1-3 descriptors, pushed with
 * written NULL or all 0) on rings whose end the runs cross many times: each
 * push_burst call is one batch for the driver (split: one element at the
 * run's first index with its last head, used->idx moved by the run;
 * packed: one descriptor over the run's first slot with its last buffer
 * id, the next one the run's slots later), nothing else of the ring is
 * written, and device and driver end at the same position.
 */
BOTH(inorder_tx_runs)
{
    static const uint32_t sizes[] = {8, 7, 16};
    for (unsigned si = 0; si < VHD_ARRAY_SIZE(sizes); si++) {
        uint32_t size = sizes[si];
        if (!packed && size == 7)
            continue;
        struct vqfx f;
        io_setup(&f, packed, size, false, NULL);
        struct io_drv *d = xcalloc(1, sizeof(*d));
        io_init(d, &f);
        rng_seed(77 + size + packed);
        uint32_t zeros[IO_QMAX] = {0}, total = 0, wraps = 0;
        uint8_t snap[16 * IO_QMAX];
        struct vhd_vq_chain c[IO_QMAX];
        for (int round = 0; round < 300; round++) {
            uint32_t want = 1 + rnd_below(6), added = 0;
            while (added < want && io_add(d, 1 + rnd_below(3), 0))
                added++;
            VHD_CHECK(added > 0);
            io_pop(&f, c, added);
            uint32_t first = rnd_below(2) ? 1 + rnd_below(added) : added;
            uint32_t pos[2], runs[2], nr = 0, before = f.vq.used_idx;
            io_snap(&f, snap);
            for (uint32_t s = 0; s < added; s += runs[nr - 1]) {
                pos[nr] = io_upos(&f);
                runs[nr] = s == 0 ? first : added - s;
                VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c + s, (rnd() & 1) ? zeros : NULL, runs[nr]),
                             0);
                nr++;
            }
            vhd_vq_flush(&f.vq);
            io_only_written(&f, snap, pos, nr);
            d->nbatch = 0;
            VHD_CHECK_EQ(io_collect(d), added);
            VHD_CHECK_EQ(d->nbatch, nr);
            for (uint32_t b = 0; b < nr; b++) {
                VHD_CHECK_EQ(d->batch[b], runs[b]);
                VHD_CHECK_EQ(d->blen[b], 0);
            }
            VHD_CHECK_EQ(d->free, size);
            if (packed) {
                VHD_CHECK_EQ(f.vq.used_idx, d->used);
                VHD_CHECK_EQ(f.vq.used_wrap, d->used_wrap);
                wraps += f.vq.used_idx < before;
            } else {
                VHD_CHECK_EQ(f.vq.used_idx, (uint16_t)d->used);
                VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->idx), f.vq.used_idx);
                wraps += (f.vq.used_idx & (size - 1)) < (before & (size - 1));
            }
            VHD_CHECK_EQ(f.vq.inflight, 0);
            total += added;
        }
        VHD_CHECK(wraps > 20);
        VHD_CHECK(total > 4 * size);
        VHD_CHECK_EQ(f.vq.error, 0);
        free(d);
        vqfx_teardown(&f);
    }
}

/*
 * Runs that are not transmit runs keep one used entry per chain: a chain
 * reporting bytes written in the run (written 0, 5, 0), chains with
 * device-writable bytes pushed with written NULL (the driver would take
 * skipped ones as written completely), and a transmit run ending with such
 * a chain. A transmit run after them is one batch again.
 */
BOTH(inorder_written_falls_back)
{
    struct vqfx f;
    io_setup(&f, packed, 16, false, NULL);
    struct io_drv d;
    io_init(&d, &f);
    struct vhd_vq_chain c[4];
    static const uint32_t wlens[4][3] = {{8, 8, 8}, {8, 8, 8}, {0, 0, 8}, {0, 0, 0}};
    static const uint32_t written[3] = {0, 5, 0};
    static const uint32_t want_len[4][3] = {{0, 5, 0}, {0, 0, 0}, {0, 0, 0}, {0}};
    for (uint32_t r = 0; r < 4; r++) {
        for (uint32_t k = 0; k < 3; k++)
            VHD_CHECK(io_add(&d, 2, wlens[r][k]));
        io_pop(&f, c, 3);
        for (uint32_t k = 0; k < 3; k++)
            VHD_CHECK_EQ(c[k].wlen, wlens[r][k]);
        VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, r == 0 ? written : NULL, 3), 0);
        vhd_vq_flush(&f.vq);
        d.nbatch = 0;
        VHD_CHECK_EQ(io_collect(&d), 3);
        if (r < 3) {
            VHD_CHECK_EQ(d.nbatch, 3);
            for (uint32_t k = 0; k < 3; k++) {
                VHD_CHECK_EQ(d.batch[k], 1);
                VHD_CHECK_EQ(d.blen[k], want_len[r][k]);
            }
        } else {
            VHD_CHECK_EQ(d.nbatch, 1);
            VHD_CHECK_EQ(d.batch[0], 3);
        }
    }
    VHD_CHECK_EQ(f.vq.error, 0);
    vqfx_teardown(&f);
}

/*
 * A bad chain in the middle of a transmit run, and more chains pushed than
 * popped: the same errors and counts as without IN_ORDER (BUFFER_ID /
 * DESC_INDEX, USED_OVERFLOW; the chains before the bad one used, the queue
 * broken), and with IN_ORDER the chains before it are one batch: one entry
 * at the run's first position naming the last good chain, nothing else.
 */
BOTH(inorder_bad_chain_mid_run)
{
    int bad_err = packed ? VHD_VQ_E_BUFFER_ID : VHD_VQ_E_DESC_INDEX;
    for (int io = 0; io < 2; io++) {
        for (int overflow = 0; overflow < 2; overflow++) {
            struct vqfx f;
            if (io) {
                io_setup(&f, packed, 16, false, NULL);
            } else {
                struct vqfx_opts o = {.size = 16, .packed = packed};
                vqfx_setup(&f, &o);
            }
            struct io_drv d;
            io_init(&d, &f);
            uint32_t n = overflow ? 2 : 4;
            for (uint32_t k = 0; k < n; k++)
                VHD_CHECK(io_add(&d, 2, 0));
            struct vhd_vq_chain c[4];
            io_pop(&f, c, n);
            uint8_t snap[16 * 16];
            io_snap(&f, snap);
            uint16_t last_good = c[1].id, flags0 = 0;
            if (packed)
                flags0 = f.dq.ring.packed.desc[0].flags;
            if (overflow)
                c[2] = c[1];
            else
                c[2].id = 16;
            int err = overflow ? VHD_VQ_E_USED_OVERFLOW : bad_err;
            VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, NULL, overflow ? 3 : 4), -err);
            VHD_CHECK_EQ(f.vq.error, err);
            VHD_CHECK_EQ(f.vq.inflight, n - 2);
            VHD_CHECK_EQ(f.vq.used_idx, packed ? 4 : 2);
            if (io) {
                uint32_t pos0 = 0;
                io_only_written(&f, snap, &pos0, 1);
                if (packed) {
                    const struct vhd_vring_packed_desc *pd = &f.dq.ring.packed.desc[0];
                    VHD_CHECK_EQ(vhd_le16(pd->id), last_good);
                    VHD_CHECK_EQ(vhd_le32(pd->len), 0);
                    /* The batch's head: its flags are kept for flush (which a broken queue skips).
                     */
                    VHD_CHECK_EQ(pd->flags, flags0);
                    VHD_CHECK_EQ(f.vq.batch_npending, 1);
                    VHD_CHECK_EQ(f.vq.batch_head, 0);
                    VHD_CHECK_EQ(f.vq.batch_head_flags,
                                 VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED);
                } else {
                    const struct vhd_vring_used_elem *e = &f.dq.ring.split.used->ring[0];
                    VHD_CHECK_EQ(vhd_le32(e->id), last_good);
                    VHD_CHECK_EQ(vhd_le32(e->len), 0);
                    VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.used->idx), 0);
                }
            }
            vqfx_expect_broken(&f, err);
            vqfx_teardown(&f);
        }
    }
}

/* With inflight tracking, a transmit run keeps one used entry per chain (the records need them). */
BOTH(inorder_inflight_per_chain)
{
    struct vqfx f;
    void *inf = NULL;
    io_setup(&f, packed, 16, false, &inf);
    struct io_drv d;
    io_init(&d, &f);
    struct vhd_vq_chain c[3];
    for (uint32_t k = 0; k < 3; k++)
        VHD_CHECK(io_add(&d, 1 + k, 0));
    io_pop(&f, c, 3);
    VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, NULL, 3), 0);
    vhd_vq_flush(&f.vq);
    VHD_CHECK_EQ(io_collect(&d), 3);
    VHD_CHECK_EQ(d.nbatch, 3);
    uint32_t marked = 0;
    for (uint32_t i = 0; i < 16; i++)
        marked += packed ? ((struct vhd_inflight_packed *)inf)->desc[i].inflight
                         : ((struct vhd_inflight_split *)inf)->desc[i].inflight;
    VHD_CHECK_EQ(marked, 0);
    VHD_CHECK_EQ(f.vq.error, 0);
    vhd_vq_fini(&f.vq);
    free(inf);
    vqfx_teardown(&f);
}

/*
 * Dirty logging of an in-order transmit run: the page of the used entry
 * written (and of used->idx) is marked, and nothing else (the buffers are
 * only read).
 */
BOTH(inorder_dirty_log)
{
    struct vqfx f;
    io_setup(&f, packed, 16, false, NULL);
    int lfd = memfd_create("vhd-test-log", MFD_CLOEXEC);
    VHD_CHECK(lfd >= 0);
    VHD_CHECK_EQ(ftruncate(lfd, 4096), 0);
    struct vhd_dirtylog *log = NULL;
    const char *why;
    VHD_CHECK_EQ(vhd_dirtylog_map(lfd, 4096, 0, &log, &why), 0); /* 32768 pages */
    vhd_vq_set_log(&f.vq, log, true, f.dq.used_gpa);
    struct io_drv d;
    io_init(&d, &f);
    struct vhd_vq_chain c[4];
    for (uint32_t k = 0; k < 3; k++)
        VHD_CHECK(io_add(&d, 1, 0));
    io_pop(&f, c, 3);
    VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, NULL, 3), 0); /* ring positions 0..2 */
    for (uint32_t k = 0; k < 4; k++)
        VHD_CHECK(io_add(&d, 3, 0));
    io_pop(&f, c, 4);
    uint64_t entry =
        packed ? f.dq.desc_gpa + 16ull * f.vq.used_idx : f.dq.used_gpa + 4 + 8ull * f.vq.used_idx;
    VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, NULL, 4), 0);
    vhd_vq_flush(&f.vq);
    uint64_t idx_page = (packed ? f.dq.desc_gpa : f.dq.used_gpa + 2) >> VHD_DIRTYLOG_PAGE_SHIFT;
    for (uint64_t pg = 0; pg < 32768; pg++) {
        bool want = pg == (entry >> VHD_DIRTYLOG_PAGE_SHIFT) || pg == idx_page;
        bool got = (log->bits[pg / 8] >> (pg % 8)) & 1;
        if (got != want)
            fprintf(stderr, "  page %llu: marked %d, expected %d\n", (unsigned long long)pg, got,
                    want);
        VHD_CHECK_EQ(got, want);
    }
    VHD_CHECK_EQ(io_collect(&d), 7);
    VHD_CHECK_EQ(d.nbatch, 2);
    VHD_CHECK_EQ(d.batch[0], 3);
    VHD_CHECK_EQ(d.batch[1], 4);
    vhd_vq_set_log(&f.vq, NULL, false, 0);
    vhd_dirtylog_free(log);
    close(lfd);
    vqfx_teardown(&f);
}

/*
 * EVENT_IDX with in-order runs: the driver's event position may fall on a
 * buffer whose entry was skipped; the decision works on positions, so
 * crossing it in a run notifies, and a position beyond the run does not.
 */
BOTH(inorder_event_idx)
{
    struct vqfx f;
    io_setup(&f, packed, 16, true, NULL);
    struct io_drv d;
    io_init(&d, &f);
    struct vhd_vq_chain c[4];
    static const uint32_t run[3] = {2, 4, 2};
    /* The event position for runs 1 and 2: a skipped buffer of run 1, then past run 2. */
    static const uint16_t event[3] = {0, 3, 9};
    static const bool want[3] = {true, true, false};
    for (uint32_t r = 0; r < 3; r++) {
        for (uint32_t k = 0; k < run[r]; k++)
            VHD_CHECK(io_add(&d, 1, 0));
        io_pop(&f, c, run[r]);
        if (packed) {
            struct vhd_vring_packed_event *drv = f.dq.ring.packed.driver;
            drv->off_wrap = vhd_le16((uint16_t)(event[r] | 1u << VRING_PACKED_EVENT_WRAP_SHIFT));
            drv->flags = vhd_le16(VRING_PACKED_EVENT_FLAG_DESC);
        } else {
            *vqfx_split_used_event(&f) = vhd_le16(event[r]);
        }
        VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, NULL, run[r]), 0);
        vhd_vq_flush(&f.vq);
        VHD_CHECK_EQ(vhd_vq_need_notify(&f.vq), want[r]);
        d.nbatch = 0;
        VHD_CHECK_EQ(io_collect(&d), run[r]);
        VHD_CHECK_EQ(d.nbatch, 1);
    }
    vqfx_teardown(&f);
}

/*
 * The driver side of IN_ORDER (src/driver/vring_split.c, vring_packed.c)
 * against the device's in-order push, both from the fixture: rounds of
 * transmit requests (1-2 readable buffers), pushed in one or two runs with
 * written NULL or all 0 (one used entry per run), and rounds mixing them
 * with receive-like requests (one writable 64-byte buffer) pushed with
 * bytes written (an entry per chain). vhd_drv_vq_get_used returns every
 * request once, in the order it was added, with length 0 for the transmit
 * ones and the bytes written for the others, and nothing more; the driver
 * ends where the device does, across many laps of the ring.
 */
BOTH(driver_in_order_collects_batches)
{
    static const uint32_t sizes[] = {8, 7, 16};
    for (unsigned si = 0; si < VHD_ARRAY_SIZE(sizes); si++) {
        uint32_t size = sizes[si];
        if (!packed && size == 7)
            continue;
        struct vqfx f;
        struct vqfx_opts o = {.size = size, .packed = packed, .in_order = true};
        vqfx_setup(&f, &o);
        VHD_CHECK(f.vq.in_order && f.dq.in_order);
        uint64_t buf = vqfx_alloc(&f, 4096, NULL);
        rng_seed(991 + size + packed);
        uintptr_t next_cookie = 1, want_cookie = 1;
        uint32_t total = 0, cursor = 0, batches_seen = 0;
        for (int round = 0; round < 300; round++) {
            bool mixed = (rnd() & 3) == 0;
            uint32_t n = 1 + rnd_below(size < 6 ? size : 6), added = 0;
            uint32_t wlen[6];
            for (; added < n; added++) {
                struct vhd_drv_buf b[2] = {{buf + 128 * added, 16}, {buf + 128 * added + 64, 8}};
                bool rx = mixed && (rnd() & 1);
                uint32_t nd = rx ? 1 : 1 + rnd_below(2);
                uint16_t head = f.dq.free_head;
                int rc = rx ? vhd_drv_vq_add(&f.dq, &b[1], 0, 1, false, (void *)next_cookie)
                            : vhd_drv_vq_add(&f.dq, b, nd, 0, false, (void *)next_cookie);
                if (rc == -ENOSPC)
                    break;
                VHD_CHECK_EQ(rc, 0);
                if (!packed) {
                    /* 2.7.5.1/2.7.5.2: descriptors in table order, next = x + 1 (0 at the end). */
                    VHD_CHECK_EQ(head, cursor);
                    for (uint32_t d = 0; d + 1 < nd; d++)
                        VHD_CHECK_EQ(vhd_le16(f.dq.ring.split.desc[(cursor + d) % size].next),
                                     (cursor + d + 1) % size);
                    cursor = (cursor + nd) % size;
                }
                wlen[added] = rx ? 1 + rnd_below(8) : 0;
                next_cookie++;
            }
            VHD_CHECK(added > 0);
            vhd_drv_vq_publish(&f.dq);
            struct iovec iov[6 * 2];
            struct vhd_vq_chain c[6];
            uint32_t got = 0;
            while (got < added) {
                int rc = vhd_vq_pop_burst(&f.vq, iov + 2 * got, 2, c + got, added - got);
                VHD_CHECK(rc > 0);
                got += (uint32_t)rc;
            }
            uint32_t first = 1 + rnd_below(added);
            for (uint32_t s = 0; s < added;) {
                uint32_t run = s == 0 ? first : added - s;
                VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c + s, mixed ? wlen + s : NULL, run), 0);
                s += run;
            }
            vhd_vq_flush(&f.vq);
            for (uint32_t k = 0; k < added; k++) {
                void *ck = NULL;
                uint32_t len = 99;
                VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
                VHD_CHECK_EQ((uintptr_t)ck, want_cookie);
                VHD_CHECK_EQ(len, wlen[k]);
                want_cookie++;
                if (f.dq.batch_open) {
                    /* Inside a batch the rest is used already: asking for a call says poll on. */
                    VHD_CHECK(vhd_drv_vq_enable_cb(&f.dq));
                    vhd_drv_vq_disable_cb(&f.dq);
                    batches_seen++;
                }
            }
            void *ck;
            uint32_t len;
            VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 0);
            VHD_CHECK_EQ(vhd_drv_vq_inflight(&f.dq), 0);
            VHD_CHECK(!f.dq.batch_open);
            total += added;
        }
        VHD_CHECK(total > 20 * size);
        VHD_CHECK(batches_seen > 20);
        VHD_CHECK_EQ(f.vq.error, 0);
        vqfx_teardown(&f);
    }
}

/*
 * A device that names, in its one used entry, a buffer the driver does not
 * have in flight fails the driver's ring (-EIO, and again on the next
 * call), in order as out of order.
 */
BOTH(driver_in_order_refuses_unknown_id)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = 8, .packed = packed, .in_order = true};
    vqfx_setup(&f, &o);
    uint64_t buf = vqfx_alloc(&f, 4096, NULL);
    struct vhd_drv_buf b = {buf, 16};
    for (uintptr_t k = 1; k <= 3; k++)
        VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, &b, 1, 0, false, (void *)k), 0);
    vhd_drv_vq_publish(&f.dq);
    struct iovec iov[3];
    struct vhd_vq_chain c[3];
    VHD_CHECK_EQ(vhd_vq_pop_burst(&f.vq, iov, 1, c, 3), 3);
    VHD_CHECK_EQ(vhd_vq_push_burst(&f.vq, c, NULL, 3), 0);
    vhd_vq_flush(&f.vq);
    /* The one entry (at the run's first position) names id 7: never made available. */
    if (packed)
        f.dq.ring.packed.desc[0].id = vhd_le16(7);
    else
        f.dq.ring.split.used->ring[0].id = vhd_le32(7);
    void *ck;
    uint32_t len;
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), -EIO);
    VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), -EIO);
    VHD_CHECK_EQ(vhd_drv_vq_inflight(&f.dq), 3);
    VHD_CHECK(!f.dq.batch_open);
    if (!packed) {
        /* A used index past what was published: -EIO, nothing taken. */
        f.dq.ring.split.used->ring[0].id = vhd_le32(2);
        f.dq.ring.split.used->idx = vhd_le16(4);
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), -EIO);
        VHD_CHECK_EQ(vhd_drv_vq_inflight(&f.dq), 3);
        f.dq.ring.split.used->idx = vhd_le16(3);
        for (uintptr_t k = 1; k <= 3; k++) {
            VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &ck, &len), 1);
            VHD_CHECK_EQ((uintptr_t)ck, k);
        }
    }
    vqfx_teardown(&f);
}
