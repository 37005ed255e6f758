/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Tests of inflight I/O tracking (vhost-user INFLIGHT_SHMFD): the engine side
 * (src/core/inflight.c and the records written by vq_split.c / vq_packed.c)
 * over both ring layouts, and the transport side (GET/SET_INFLIGHT_FD in
 * src/transport/vu_conn.c). A crash is simulated by dropping the device
 * queue without completing anything and starting a new one on the same rings
 * and the same area: exactly the chains that were not completed must come
 * back, in their original pop order, once each. Corrupt areas must fail the
 * queue, never crash.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/inflight.h"
#include "dev/blk.h"
#include "spec/virtio_blk.h"
#include "runtime/rt.h"
#include "transport/vu_conn.h"
#include "spec/vhost_user.h"
#include "transport/vu_sock.h"
#include "vq_fixture.h"

#define BIT(n) (1ull << (n))

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

/* =====================================================================
 * Engine fixture: a vqfx queue tracked in a region we allocate.
 * ===================================================================== */

#define MAXREQ 64

struct ifx {
    struct vqfx f;
    void *region;
    size_t region_len;
    uint32_t desc_num;
    uint64_t buf_gpa; /* per tag: 8 readable bytes (the tag), 8 writable */
    uint8_t *buf;
    struct vhd_vq_chain chain[MAXREQ]; /* by tag: the chain popped for it */
    bool done[MAXREQ];                 /* the driver collected it */
};

static void ifx_start(struct ifx *t, uint32_t base)
{
    VHD_CHECK_EQ(vhd_vq_init(&t->f.vq, &t->f.params, t->f.mem), 0);
    VHD_CHECK_EQ(vhd_vq_set_base(&t->f.vq, base), 0);
    VHD_CHECK_EQ(vhd_vq_set_inflight(&t->f.vq, t->region, t->desc_num), 0);
}

static void ifx_setup(struct ifx *t, bool packed, uint32_t size, uint32_t desc_num)
{
    struct vqfx_opts o = {.size = size, .packed = packed, .no_start = true};

    memset(t, 0, sizeof(*t));
    vqfx_setup(&t->f, &o);
    t->desc_num = desc_num;
    t->region_len = vhd_inflight_queue_size(packed, desc_num);
    t->region = aligned_alloc(64, t->region_len);
    VHD_CHECK(t->region != NULL);
    memset(t->region, 0, t->region_len);
    t->buf_gpa = vqfx_alloc(&t->f, 16 * MAXREQ, (void **)&t->buf);
    /* Packed: both wrap counters 1 (2.8.1). */
    ifx_start(t, packed ? (1u << 15) | (1u << 31) : 0);
    VHD_CHECK_EQ(vhd_vq_start(&t->f.vq), 0);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t->f.vq), 0);
}

static void ifx_teardown(struct ifx *t)
{
    vhd_vq_fini(&t->f.vq);
    free(t->region);
    vqfx_teardown(&t->f);
}

/* Driver: add request `tag` (not yet published). */
static void ifx_add(struct ifx *t, uint32_t tag)
{
    uint64_t tag64 = tag;
    memcpy(t->buf + 16 * tag, &tag64, 8);
    struct vhd_drv_buf b[2] = {{t->buf_gpa + 16 * tag, 8}, {t->buf_gpa + 16 * tag + 8, 8}};
    VHD_CHECK_EQ(vhd_drv_vq_add(&t->f.dq, b, 1, 1, false, (void *)(uintptr_t)(tag + 1)), 0);
}

static void ifx_add_n(struct ifx *t, uint32_t from, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        ifx_add(t, from + i);
    vhd_drv_vq_publish(&t->f.dq);
}

/* Device: pop one chain; returns its tag, or -1 when nothing is available. */
static int ifx_pop(struct ifx *t)
{
    struct iovec iov[4];
    struct vhd_vq_chain c;
    int rc = vhd_vq_pop(&t->f.vq, iov, 4, &c);
    if (rc == 0)
        return -1;
    VHD_CHECK_EQ(rc, 1);
    VHD_CHECK_EQ(c.nr, 1);
    VHD_CHECK_EQ(c.rlen, 8);
    uint64_t tag;
    memcpy(&tag, iov[0].iov_base, 8);
    VHD_CHECK(tag < MAXREQ);
    t->chain[tag] = c;
    return (int)tag;
}

/* Device: complete tag (push only; flush separately). */
static void ifx_push(struct ifx *t, uint32_t tag)
{
    VHD_CHECK_EQ(vhd_vq_push(&t->f.vq, &t->chain[tag], 8), 0);
}

/* Driver: collect everything used; each tag at most once. Returns the count. */
static uint32_t ifx_collect(struct ifx *t)
{
    void *ck;
    uint32_t len, n = 0;
    int rc;
    while ((rc = vhd_drv_vq_get_used(&t->f.dq, &ck, &len)) == 1) {
        uint32_t tag = (uint32_t)(uintptr_t)ck - 1;
        VHD_CHECK(tag < MAXREQ);
        VHD_CHECK(!t->done[tag]);
        t->done[tag] = true;
        n++;
    }
    VHD_CHECK_EQ(rc, 0);
    return n;
}

/* Device: pop n chains, which must be tags first..first+n-1 in that order. */
static void ifx_pop_range(struct ifx *t, uint32_t first, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        VHD_CHECK_EQ(ifx_pop(t), (int)(first + i));
}

/* Driver: make tags first..first+n-1 available; device: take them all, in order. */
static void ifx_take(struct ifx *t, uint32_t first, uint32_t n)
{
    ifx_add_n(t, first, n);
    ifx_pop_range(t, first, n);
}

/* Device: complete tags first..first+n-1 as one batch; the driver must collect all n. */
static void ifx_complete_range(struct ifx *t, uint32_t first, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        ifx_push(t, first + i);
    vhd_vq_flush(&t->f.vq);
    VHD_CHECK_EQ(ifx_collect(t), n);
}

/*
 * Crash: forget the device queue without completing anything (only our
 * private allocations are freed; the area and the rings stay as they are),
 * then start a new queue on the same rings and area, with the base a
 * front-end restores after a crash: split, used->idx (QEMU); packed, a stale
 * value (0): the area has the truth.
 */
static void ifx_crash_restart(struct ifx *t)
{
    vhd_vq_fini(&t->f.vq);
    uint32_t base = t->f.o.packed ? 0 : vhd_le16(t->f.dq.ring.split.used->idx);
    ifx_start(t, base);
    VHD_CHECK_EQ(vhd_vq_start(&t->f.vq), 0);
}

/* Every record of the region says "not in flight" (and split: used_idx is current). */
static void ifx_check_area_clean(struct ifx *t)
{
    if (t->f.o.packed) {
        struct vhd_inflight_packed *p = t->region;
        VHD_CHECK_EQ(p->version, VHD_INFLIGHT_VERSION);
        for (uint32_t i = 0; i < t->desc_num; i++)
            VHD_CHECK_EQ(p->desc[i].inflight, 0);
        VHD_CHECK_EQ(p->used_idx, p->old_used_idx);
        VHD_CHECK_EQ(p->free_head, p->old_free_head);
    } else {
        struct vhd_inflight_split *s = t->region;
        VHD_CHECK_EQ(s->version, VHD_INFLIGHT_VERSION);
        for (uint32_t i = 0; i < t->desc_num; i++)
            VHD_CHECK_EQ(s->desc[i].inflight, 0);
        VHD_CHECK_EQ(s->used_idx, vhd_le16(t->f.dq.ring.split.used->idx));
    }
}

/* =====================================================================
 * Engine tests
 * ===================================================================== */

/* A new area is initialised at start: version 1, desc_num, nothing in flight. */
BOTH(new_area_initialised)
{
    struct ifx t;
    ifx_setup(&t, packed, 16, 16);
    ifx_check_area_clean(&t);
    VHD_CHECK_EQ(((struct vhd_inflight_split *)t.region)->desc_num, 16);
    VHD_CHECK_EQ(t.f.vq.inf_retaken, 0);
    ifx_teardown(&t);
}

/*
 * A new area, but a base that puts chains in flight (a front-end that
 * replaced the area, or rewrote it as the ring started): no record lists
 * those chains, so they are popped from the ring again and complete, rather
 * than never. Each chain here takes two slots of a packed ring.
 */
BOTH(new_area_retakes_chains_in_flight)
{
    struct ifx t;
    ifx_setup(&t, packed, 8, 8);
    ifx_add_n(&t, 0, 3);
    VHD_CHECK_EQ(ifx_pop(&t), 0);
    VHD_CHECK_EQ(ifx_pop(&t), 1);

    vhd_vq_fini(&t.f.vq);
    memset(t.region, 0, t.region_len);
    ifx_start(&t, packed ? 4u | 1u << 15 | 1u << 31 : 2u);
    VHD_CHECK_EQ(vhd_vq_start(&t.f.vq), 0);
    VHD_CHECK_EQ(t.f.vq.inf_retaken, packed ? 4 : 2); /* packed: ring slots */
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 0);
    ifx_check_area_clean(&t);
    ifx_pop_range(&t, 0, 3);
    VHD_CHECK_EQ(ifx_pop(&t), -1);
    ifx_complete_range(&t, 0, 3);

    /* A base past the used position by more than the ring is no position: nothing retaken. */
    vhd_vq_fini(&t.f.vq);
    memset(t.region, 0, t.region_len);
    /* Split: used->idx is 3; packed: used at slot 6 of lap 1, avail at slot 7 of lap 0. */
    ifx_start(&t, packed ? 7u | 6u << 16 | 1u << 31 : 3u + 9u);
    VHD_CHECK_EQ(vhd_vq_start(&t.f.vq), 0);
    VHD_CHECK_EQ(t.f.vq.inf_retaken, 0);
    ifx_teardown(&t);
}

/*
 * Pop 8, complete 3 out of order, crash. The 5 others come back in pop
 * order before anything new, exactly once; the 3 completed never again.
 */
static void crash_resubmit(bool packed, uint32_t size, uint32_t rounds)
{
    struct ifx t;
    ifx_setup(&t, packed, size, size);
    uint32_t tag = 0;

    for (uint32_t round = 0; round < rounds; round++) {
        uint32_t first = tag;
        memset(t.done, 0, sizeof(t.done));
        ifx_add_n(&t, first, 8);
        for (uint32_t i = 0; i < 8; i++)
            VHD_CHECK_EQ(ifx_pop(&t), (int)(first + i));
        VHD_CHECK_EQ(ifx_pop(&t), -1);
        ifx_push(&t, first + 1);
        ifx_push(&t, first + 4);
        vhd_vq_flush(&t.f.vq);
        ifx_push(&t, first + 6);
        vhd_vq_flush(&t.f.vq);
        VHD_CHECK_EQ(ifx_collect(&t), 3);

        ifx_crash_restart(&t);
        VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 5);
        VHD_CHECK(vhd_vq_has_work(&t.f.vq));
        const uint32_t want[5] = {0, 2, 3, 5, 7};
        for (uint32_t i = 0; i < 5; i++)
            VHD_CHECK_EQ(ifx_pop(&t), (int)(first + want[i]));
        VHD_CHECK_EQ(ifx_pop(&t), -1); /* nothing is popped twice */
        VHD_CHECK(!vhd_vq_has_work(&t.f.vq));

        /* New requests after the resubmitted ones. */
        ifx_add_n(&t, first + 8, 2);
        VHD_CHECK_EQ(ifx_pop(&t), (int)(first + 8));
        VHD_CHECK_EQ(ifx_pop(&t), (int)(first + 9));
        VHD_CHECK_EQ(ifx_pop(&t), -1);
        ifx_push(&t, first + 9);
        for (uint32_t i = 5; i-- > 0;)
            ifx_push(&t, first + want[i]);
        ifx_push(&t, first + 8);
        vhd_vq_flush(&t.f.vq);
        VHD_CHECK_EQ(ifx_collect(&t), 7);
        for (uint32_t i = 0; i < 10; i++)
            VHD_CHECK(t.done[first + i]);
        ifx_check_area_clean(&t);

        /* A clean restart resubmits nothing. */
        ifx_crash_restart(&t);
        VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 0);
        VHD_CHECK_EQ(ifx_pop(&t), -1);
        tag = (tag + 10) % (MAXREQ - 10);
    }
    ifx_teardown(&t);
}

BOTH(crash_resubmit_in_order)
{
    crash_resubmit(packed, 16, 1);
}

/* Many rounds on a small ring: indices and wrap counters go round several times. */
BOTH(crash_resubmit_wrapping)
{
    crash_resubmit(packed, packed ? 19 : 16, 40);
}

/* Crash after pushing but before flush: the driver saw nothing, so all come back. */
BOTH(crash_before_publish)
{
    struct ifx t;
    ifx_setup(&t, packed, 16, 16);
    ifx_take(&t, 0, 4);
    ifx_push(&t, 2);
    ifx_push(&t, 0);
    ifx_crash_restart(&t);
    VHD_CHECK_EQ(ifx_collect(&t), 0);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 4);
    ifx_pop_range(&t, 0, 4);
    VHD_CHECK_EQ(ifx_pop(&t), -1);
    ifx_complete_range(&t, 0, 4);
    ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

/*
 * Crash between the used ring update and the inflight update: the batch was
 * published (the driver may have seen it) but its records still say in
 * flight. The start repairs that batch: it is not resubmitted. The crash
 * state is rebuilt from snapshots of the area: before the flush (after the
 * pushes) plus, for packed, the used position the flush records before it
 * publishes (spec order: used_idx, then the descriptor flags, then the
 * records).
 */
BOTH(crash_mid_flush_repaired)
{
    struct ifx t;
    ifx_setup(&t, packed, 16, 16);
    ifx_take(&t, 0, 6);
    ifx_push(&t, 3);
    vhd_vq_flush(&t.f.vq);
    VHD_CHECK_EQ(ifx_collect(&t), 1);

    ifx_push(&t, 1);
    ifx_push(&t, 5);
    void *before = malloc(t.region_len);
    VHD_CHECK(before != NULL);
    memcpy(before, t.region, t.region_len);
    vhd_vq_flush(&t.f.vq);
    if (packed) {
        struct vhd_inflight_packed *now = t.region, *b = before;
        b->used_idx = now->used_idx;
        b->used_wrap_counter = now->used_wrap_counter;
    }
    memcpy(t.region, before, t.region_len);
    free(before);

    ifx_crash_restart(&t);
    VHD_CHECK_EQ(ifx_collect(&t), 2); /* tags 1 and 5 were published */
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 3);
    VHD_CHECK_EQ(ifx_pop(&t), 0);
    VHD_CHECK_EQ(ifx_pop(&t), 2);
    VHD_CHECK_EQ(ifx_pop(&t), 4);
    VHD_CHECK_EQ(ifx_pop(&t), -1);
    ifx_push(&t, 4);
    ifx_push(&t, 0);
    ifx_push(&t, 2);
    vhd_vq_flush(&t.f.vq);
    VHD_CHECK_EQ(ifx_collect(&t), 3);
    for (uint32_t i = 0; i < 6; i++)
        VHD_CHECK(t.done[i]);
    ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

/* A second crash while the first one's chains are being resubmitted. */
BOTH(crash_during_resubmit)
{
    struct ifx t;
    ifx_setup(&t, packed, 16, 16);
    ifx_take(&t, 0, 5);
    ifx_push(&t, 1);
    vhd_vq_flush(&t.f.vq);
    ifx_crash_restart(&t);
    VHD_CHECK_EQ(ifx_pop(&t), 0);
    VHD_CHECK_EQ(ifx_pop(&t), 2);
    ifx_push(&t, 2);
    vhd_vq_flush(&t.f.vq);
    ifx_add_n(&t, 5, 1);
    ifx_crash_restart(&t);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 3);
    VHD_CHECK_EQ(ifx_pop(&t), 0);
    VHD_CHECK_EQ(ifx_pop(&t), 3);
    VHD_CHECK_EQ(ifx_pop(&t), 4);
    VHD_CHECK_EQ(ifx_pop(&t), 5); /* the new one, never popped before */
    VHD_CHECK_EQ(ifx_pop(&t), -1);
    for (uint32_t i = 0; i < 6; i++)
        if (i != 1 && i != 2)
            ifx_push(&t, i);
    vhd_vq_flush(&t.f.vq);
    VHD_CHECK_EQ(ifx_collect(&t), 6);
    ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

/* Unpop gives the last chain back, clears its record, and the next pop returns it. */
static void unpop(bool packed, bool tracked)
{
    struct ifx t;
    ifx_setup(&t, packed, 8, 8);
    if (!tracked) {
        vhd_vq_fini(&t.f.vq); /* stop tracking */
    }
    ifx_add_n(&t, 0, 3);
    VHD_CHECK_EQ(ifx_pop(&t), 0);
    VHD_CHECK_EQ(ifx_pop(&t), 1);
    VHD_CHECK_EQ(ifx_pop(&t), 2);
    VHD_CHECK_EQ(vhd_vq_unpop(&t.f.vq, &t.chain[2]), 0);
    VHD_CHECK_EQ(vhd_vq_unpop(&t.f.vq, &t.chain[1]), 0);
    VHD_CHECK_EQ(t.f.vq.inflight, 1);
    if (tracked && !packed) {
        struct vhd_inflight_split *s = t.region;
        VHD_CHECK_EQ(s->desc[t.chain[1].id].inflight, 0);
        VHD_CHECK_EQ(s->desc[t.chain[2].id].inflight, 0);
        VHD_CHECK_EQ(s->desc[t.chain[0].id].inflight, 1);
    }
    if (tracked) {
        /* A crash now resubmits only the chain still held. */
        ifx_crash_restart(&t);
        VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 1);
        VHD_CHECK_EQ(ifx_pop(&t), 0);
    }
    VHD_CHECK_EQ(ifx_pop(&t), 1);
    VHD_CHECK_EQ(ifx_pop(&t), 2);
    VHD_CHECK_EQ(ifx_pop(&t), -1);
    ifx_complete_range(&t, 0, 3);
    if (tracked)
        ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

BOTH(unpop_tracked)
{
    unpop(packed, true);
}

BOTH(unpop_untracked)
{
    unpop(packed, false);
}

/* Giving back a chain popped again after a crash puts it back in the resubmit order. */
BOTH(unpop_resubmitted)
{
    struct ifx t;
    ifx_setup(&t, packed, 8, 8);
    ifx_add_n(&t, 0, 2);
    VHD_CHECK_EQ(ifx_pop(&t), 0);
    VHD_CHECK_EQ(ifx_pop(&t), 1);
    ifx_crash_restart(&t);
    VHD_CHECK_EQ(ifx_pop(&t), 0);
    VHD_CHECK_EQ(ifx_pop(&t), 1);
    VHD_CHECK_EQ(vhd_vq_unpop(&t.f.vq, &t.chain[1]), 0);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 1);
    VHD_CHECK_EQ(ifx_pop(&t), 1);
    ifx_push(&t, 0);
    ifx_push(&t, 1);
    vhd_vq_flush(&t.f.vq);
    VHD_CHECK_EQ(ifx_collect(&t), 2);
    ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

/*
 * After the resubmission list ran out, a new chain is popped: giving back
 * that one and then the last chain popped again must put each where it came
 * from (the new one back in the ring, the listed one back in the list).
 */
BOTH(unpop_across_end_of_resubmission)
{
    struct ifx t;
    ifx_setup(&t, packed, 8, 8);
    ifx_take(&t, 0, 3);
    ifx_crash_restart(&t);
    ifx_pop_range(&t, 0, 3);
    ifx_add_n(&t, 3, 1);
    VHD_CHECK_EQ(ifx_pop(&t), 3);
    VHD_CHECK_EQ(vhd_vq_unpop(&t.f.vq, &t.chain[3]), 0);
    VHD_CHECK_EQ(vhd_vq_unpop(&t.f.vq, &t.chain[2]), 0);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 1);
    VHD_CHECK_EQ(ifx_pop(&t), 2);
    VHD_CHECK_EQ(ifx_pop(&t), 3);
    VHD_CHECK_EQ(ifx_pop(&t), -1);
    ifx_complete_range(&t, 0, 4);
    ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

/*
 * A driver that makes a head (split) or buffer id (packed) available again
 * while the device still holds it would make two chains share one record:
 * the first completion would clear what the second needs after a restart.
 * The tracked pop refuses it and breaks the queue.
 */
BOTH(id_reposted_while_in_flight)
{
    struct ifx t;
    ifx_setup(&t, packed, 8, 8);
    ifx_add_n(&t, 0, 2);
    VHD_CHECK_EQ(ifx_pop(&t), 0);
    if (!packed) {
        struct vhd_vring_avail *a = t.f.dq.ring.split.avail;
        uint16_t idx = vhd_le16(a->idx);
        a->ring[idx & 7] = vhd_le16(t.chain[0].id);
        vhd_store_release(&a->idx, vhd_le16((uint16_t)(idx + 1)));
    } else {
        struct vhd_vring_packed_desc *d = &t.f.dq.ring.packed.desc[t.f.dq.next_avail];
        bool w = t.f.dq.avail_wrap;
        d->addr = vhd_le64(t.buf_gpa);
        d->len = vhd_le32(8);
        d->id = vhd_le16(t.chain[0].id);
        vhd_store_release(&d->flags, vhd_le16((uint16_t)((w ? VRING_PACKED_DESC_F_AVAIL : 0) |
                                                         (w ? 0 : VRING_PACKED_DESC_F_USED))));
    }
    VHD_CHECK_EQ(ifx_pop(&t), 1); /* the honest second request first */
    struct iovec iov[4];
    struct vhd_vq_chain c;
    VHD_CHECK_EQ(vhd_vq_pop(&t.f.vq, iov, 4, &c), -VHD_VQ_E_ID_IN_FLIGHT);
    VHD_CHECK_EQ(t.f.vq.error, VHD_VQ_E_ID_IN_FLIGHT);
    ifx_teardown(&t);
}

/* Unpop of a chain that cannot be the last one popped breaks the queue. */
BOTH(unpop_bad)
{
    struct ifx t;
    ifx_setup(&t, packed, 8, 8);
    struct vhd_vq_chain c = {.id = 0, .ndescs = 1};
    VHD_CHECK_EQ(vhd_vq_unpop(&t.f.vq, &c), -VHD_VQ_E_UNPOP);
    VHD_CHECK_EQ(t.f.vq.error, VHD_VQ_E_UNPOP);
    ifx_teardown(&t);
}

/* ---- corrupt or unfitting areas: the start fails, the queue is broken ---- */

/* Start a new queue on t's area after `mutate` changed it; expect failure. */
static void expect_start_fails(struct ifx *t)
{
    vhd_vq_fini(&t->f.vq);
    ifx_start(t, 0);
    VHD_CHECK_EQ(vhd_vq_start(&t->f.vq), -EBADMSG);
    VHD_CHECK_EQ(t->f.vq.error, VHD_VQ_E_INFLIGHT);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t->f.vq), 0);
    VHD_CHECK(t->f.vq.inf.any == NULL);
    struct iovec iov[4];
    struct vhd_vq_chain c;
    VHD_CHECK_EQ(vhd_vq_pop(&t->f.vq, iov, 4, &c), -VHD_VQ_E_INFLIGHT);
}

/* A fresh area with one popped chain (tag 0) in flight, as a crash leaves it. */
static void corrupt_setup(struct ifx *t, bool packed, uint32_t desc_num)
{
    ifx_setup(t, packed, 8, desc_num);
    ifx_add_n(t, 0, 2);
    VHD_CHECK_EQ(ifx_pop(t), 0);
    VHD_CHECK_EQ(ifx_pop(t), 1);
}

BOTH(corrupt_version)
{
    struct ifx t;
    corrupt_setup(&t, packed, 8);
    ((struct vhd_inflight_split *)t.region)->version = 2;
    expect_start_fails(&t);
    ifx_teardown(&t);
}

BOTH(corrupt_desc_num_mismatch)
{
    struct ifx t;
    corrupt_setup(&t, packed, 8);
    ((struct vhd_inflight_split *)t.region)->desc_num = 16;
    expect_start_fails(&t);
    ifx_teardown(&t);
}

/* An area with fewer records than the ring has entries does not fit. */
BOTH(area_smaller_than_ring)
{
    struct ifx t;
    ifx_setup(&t, packed, 8, 8);
    vhd_vq_fini(&t.f.vq);
    VHD_CHECK_EQ(vhd_vq_init(&t.f.vq, &t.f.params, t.f.mem), 0);
    VHD_CHECK_EQ(vhd_vq_set_inflight(&t.f.vq, t.region, 4), 0);
    VHD_CHECK_EQ(vhd_vq_start(&t.f.vq), -EBADMSG);
    VHD_CHECK_EQ(t.f.vq.error, VHD_VQ_E_INFLIGHT);
    VHD_CHECK_EQ(vhd_vq_set_inflight(&t.f.vq, t.region, 0), -EINVAL);
    VHD_CHECK_EQ(vhd_vq_set_inflight(&t.f.vq, t.region, 40000), -EINVAL);
    VHD_CHECK_EQ(vhd_vq_set_inflight(&t.f.vq, NULL, 8), -EINVAL);
    ifx_teardown(&t);
}

/* A record in flight beyond the ring (desc_num > size) or with a bogus flag. */
BOTH(corrupt_record_out_of_range)
{
    struct ifx t;
    corrupt_setup(&t, packed, 32);
    if (packed) {
        /* The first chain's head record (record 0) says its last record is beyond desc_num. */
        struct vhd_inflight_packed *p = t.region;
        VHD_CHECK_EQ(p->desc[0].inflight, 1);
        p->desc[0].last = 40;
    } else {
        struct vhd_inflight_split *s = t.region;
        s->desc[20].inflight = 1;
        s->desc[20].counter = 99;
    }
    expect_start_fails(&t);
    ifx_teardown(&t);
}

BOTH(corrupt_inflight_flag)
{
    struct ifx t;
    corrupt_setup(&t, packed, 8);
    if (packed) {
        struct vhd_inflight_packed *p = t.region;
        for (uint32_t i = 0; i < 8; i++)
            if (p->desc[i].inflight)
                p->desc[i].inflight = 7;
    } else {
        ((struct vhd_inflight_split *)t.region)->desc[t.chain[0].id].inflight = 7;
    }
    expect_start_fails(&t);
    ifx_teardown(&t);
}

BOTH(corrupt_duplicate_counter)
{
    struct ifx t;
    corrupt_setup(&t, packed, 8);
    if (packed) {
        struct vhd_inflight_packed *p = t.region;
        uint64_t ctr = 0;
        bool first = true;
        for (uint32_t i = 0; i < 8; i++)
            if (p->desc[i].inflight) {
                if (first)
                    ctr = p->desc[i].counter;
                else
                    p->desc[i].counter = ctr;
                first = false;
            }
    } else {
        struct vhd_inflight_split *s = t.region;
        s->desc[t.chain[1].id].counter = s->desc[t.chain[0].id].counter;
    }
    expect_start_fails(&t);
    ifx_teardown(&t);
}

/* A batch to repair larger than the ring, or listing a head out of range. */
BOTH(corrupt_last_batch)
{
    struct ifx t;
    corrupt_setup(&t, packed, 8);
    if (packed) {
        struct vhd_inflight_packed *p = t.region;
        p->used_idx = 3;     /* differs from old_used_idx: a batch to check */
        p->old_used_idx = 9; /* beyond the ring */
    } else {
        struct vhd_inflight_split *s = t.region;
        s->used_idx = (uint16_t)(s->used_idx - 1); /* one head to clear */
        s->last_batch_head = 9;                    /* beyond the ring */
    }
    expect_start_fails(&t);
    ifx_teardown(&t);
}

/*
 * A split ring the driver re-initialised (used->idx back to 0) with an
 * area whose used_idx is far away and nothing in flight: a fresh start,
 * not corruption.
 */
VHD_TEST(stale_used_idx_nothing_in_flight_split)
{
    struct ifx t;
    ifx_setup(&t, false, 8, 8);
    ((struct vhd_inflight_split *)t.region)->used_idx = 1000;
    ifx_crash_restart(&t);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 0);
    ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

/*
 * Packed, nothing in flight: the area's used position (slot 6 of lap 1,
 * three two-slot chains completed) against a driver that re-initialised
 * its ring (zeroed, two new chains from slot 0 of lap 1) while the
 * front-end kept the old area. Slot 6 is zero, which is "not used in lap
 * 1" as the old ring could also show; the slot behind it (zero, "used in
 * lap 0") is what no ring the area describes can show. The front-end's
 * base stands and the new chains run. The same restart without the reset
 * (the slot behind is the second descriptor of a used chain, still
 * "available in lap 1") keeps the area's position.
 */
static void reset_nothing_in_flight(bool reset)
{
    struct ifx t;
    ifx_setup(&t, true, 8, 8);
    ifx_take(&t, 0, 3);
    ifx_complete_range(&t, 0, 3);
    vhd_vq_fini(&t.f.vq);
    if (reset) {
        struct vhd_drv_vq_params dp = {.size = 8,
                                       .packed = true,
                                       .area = t.f.area,
                                       .area_gpa = t.f.area_gpa,
                                       .area_len = t.f.area_len};
        vhd_drv_vq_fini(&t.f.dq);
        VHD_CHECK_EQ(vhd_drv_vq_init(&t.f.dq, &dp), 0);
    }
    ifx_add_n(&t, 10, 2);
    ifx_start(&t, reset ? (1u << 15) | (1u << 31) : 0); /* 0: a stale base (QEMU's after a crash) */
    VHD_CHECK_EQ(vhd_vq_start(&t.f.vq), 0);
    VHD_CHECK_EQ(t.f.vq.inf_stale, reset);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 0);
    ifx_pop_range(&t, 10, 2);
    VHD_CHECK_EQ(ifx_pop(&t), -1);
    ifx_complete_range(&t, 10, 2);
    ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

VHD_TEST(guest_reset_nothing_in_flight_packed)
{
    reset_nothing_in_flight(true);
}

VHD_TEST(restart_nothing_in_flight_packed)
{
    reset_nothing_in_flight(false);
}

/* Random garbage never crashes a start, and a successful start pops sanely. */
BOTH(random_garbage)
{
    struct ifx t;
    ifx_setup(&t, packed, 8, 8);
    uint64_t s = 0x1234567;
    for (int round = 0; round < 300; round++) {
        uint8_t *p = t.region;
        for (size_t i = 0; i < t.region_len; i++) {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if ((s & 7) == 0 || i < 32)
                p[i] = (uint8_t)(s >> 24) & (round & 1 ? 0x0f : 0xff);
        }
        ((struct vhd_inflight_split *)t.region)->version = 1;
        ((struct vhd_inflight_split *)t.region)->desc_num = 8;
        vhd_vq_fini(&t.f.vq);
        ifx_start(&t, 0);
        int rc = vhd_vq_start(&t.f.vq);
        VHD_CHECK(rc == 0 || rc == -EBADMSG);
        for (int k = 0; rc == 0 && k < 10; k++) {
            struct iovec iov[4];
            struct vhd_vq_chain c;
            if (vhd_vq_pop(&t.f.vq, iov, 4, &c) != 1)
                break;
        }
    }
    ifx_teardown(&t);
}

/* =====================================================================
 * Transport: GET/SET_INFLIGHT_FD on a virtio-blk device (null backend)
 * through a vhost-user session over a socketpair, driven in this thread.
 * ===================================================================== */

struct tvu {
    struct vhd_rt *rt;
    struct vhd_dev *dev;
    struct vhd_vu_conn *c;
    int cli;
    struct vu_rx rx;
};

/* A blk device: null backend, or uring on image when given. */
static void tvu_setup_image(struct tvu *t, uint32_t nqueues, bool allow_packed, uint64_t proto,
                            const char *image)
{
    char err[256];
    struct vhd_blk_opts bo = {0};
    struct vhd_rt_opts ro;
    int sv[2];

    memset(t, 0, sizeof(*t));
    vhd_log_set_level(VHD_LOG_ERROR);
    bo.name = "tinf";
    bo.backend = image ? "uring" : "null";
    bo.image = image;
    bo.size = image ? 0 : 1 << 20;
    bo.num_queues = nqueues;
    bo.allow_packed = allow_packed;
    VHD_CHECK_EQ(vhd_blk_new(&bo, &t->dev, err, sizeof(err)), 0);
    vhd_rt_opts_default(&ro);
    VHD_CHECK_EQ(vhd_rt_new(&ro, &t->rt), 0);
    t->dev->rt = t->rt;
    VHD_CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    VHD_CHECK_EQ(vhd_vu_conn_new(t->dev, sv[0], &t->c), 0);
    t->cli = sv[1];
    vu_rx_init(&t->rx);
    VHD_CHECK(vhd_vu_offered_protocol_features(t->dev) & BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD));
    struct vu_hdr h = {
        .request = VHOST_USER_SET_PROTOCOL_FEATURES, .flags = VHOST_USER_VERSION, .size = 8};
    VHD_CHECK_EQ(vu_send(t->cli, &h, &proto, NULL, 0, 1000), 0);
    VHD_CHECK_EQ(vhd_vu_conn_process(t->c), 0);
}

static void tvu_setup(struct tvu *t, uint32_t nqueues, bool allow_packed, uint64_t proto)
{
    tvu_setup_image(t, nqueues, allow_packed, proto, NULL);
}

static void tvu_teardown(struct tvu *t)
{
    vu_rx_reset(&t->rx);
    close(t->cli);
    VHD_CHECK_EQ(vhd_vu_conn_free(t->c), 0);
    vhd_rt_free(t->rt);
    vhd_blk_free(t->dev);
}

/* Send a request and let the session handle it. Returns vhd_vu_conn_process's result. */
static int tvu_send(struct tvu *t, uint32_t req, bool need_reply, const struct vu_inflight *in,
                    int fd)
{
    struct vu_hdr h = {.request = req,
                       .flags = VHOST_USER_VERSION | (need_reply ? VHOST_USER_NEED_REPLY_MASK : 0),
                       .size = sizeof(*in)};
    VHD_CHECK_EQ(vu_send(t->cli, &h, in, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, 1000), 0);
    return vhd_vu_conn_process(t->c);
}

/* Receive the reply to req: payload into *p (size returned), its fd (or -1) into *fd. */
static uint32_t tvu_reply(struct tvu *t, uint32_t req, union vu_payload *p, int *fd)
{
    VHD_CHECK_EQ(vu_rx_read(&t->rx, t->cli), 1);
    VHD_CHECK_EQ(t->rx.hdr.request, req);
    VHD_CHECK_EQ(t->rx.hdr.flags, VHOST_USER_VERSION | VHOST_USER_REPLY_MASK);
    uint32_t size = t->rx.hdr.size;
    memcpy(p, &t->rx.payload, size);
    *fd = t->rx.nfds ? t->rx.fds[0] : -1;
    for (unsigned i = 1; i < t->rx.nfds; i++)
        close(t->rx.fds[i]);
    VHD_CHECK(t->rx.nfds <= 1);
    vu_rx_next(&t->rx);
    return size;
}

/* SET_INFLIGHT_FD with NEED_REPLY: the REPLY_ACK value (0 = accepted). */
static uint64_t tvu_set(struct tvu *t, const struct vu_inflight *in, int fd)
{
    union vu_payload p;
    int rfd;
    VHD_CHECK_EQ(tvu_send(t, VHOST_USER_SET_INFLIGHT_FD, true, in, fd), 0);
    VHD_CHECK_EQ(tvu_reply(t, VHOST_USER_SET_INFLIGHT_FD, &p, &rfd), 8);
    VHD_CHECK_EQ(rfd, -1);
    return p.u64;
}

/* GET_INFLIGHT_FD: the reply, and its fd (-1 when refused). */
static int tvu_get(struct tvu *t, uint16_t nq, uint16_t qs, struct vu_inflight *out)
{
    struct vu_inflight in = {.num_queues = nq, .queue_size = qs};
    union vu_payload p;
    int fd;
    VHD_CHECK_EQ(tvu_send(t, VHOST_USER_GET_INFLIGHT_FD, false, &in, -1), 0);
    VHD_CHECK_EQ(tvu_reply(t, VHOST_USER_GET_INFLIGHT_FD, &p, &fd), sizeof(struct vu_inflight));
    *out = p.inflight;
    return fd;
}

#define PROTO_INFLIGHT \
    (BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD) | BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK))

/* GET gives a zeroed, sealed area of the layout's size; SET takes it back. */
static void get_set_roundtrip(bool allow_packed)
{
    struct tvu t;
    struct vu_inflight a;
    tvu_setup(&t, 4, allow_packed, PROTO_INFLIGHT);

    int fd = tvu_get(&t, 3, 128, &a);
    VHD_CHECK(fd >= 0);
    uint64_t want = 3 * vhd_inflight_queue_size(allow_packed, 128);
    VHD_CHECK_EQ(a.mmap_size, want);
    VHD_CHECK_EQ(a.mmap_offset, 0);
    VHD_CHECK_EQ(a.num_queues, 3);
    VHD_CHECK_EQ(a.queue_size, 128);
    VHD_CHECK_EQ(lseek(fd, 0, SEEK_END), (off_t)want);
    int seals = fcntl(fd, F_GET_SEALS);
    VHD_CHECK(seals >= 0 && (seals & F_SEAL_SHRINK));
    VHD_CHECK(ftruncate(fd, 100) < 0); /* nobody can shrink it under a back-end */
    uint8_t *m = mmap(NULL, want, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    VHD_CHECK(m != MAP_FAILED);
    for (uint64_t i = 0; i < want; i++)
        VHD_CHECK_EQ(m[i], 0);
    munmap(m, want);

    VHD_CHECK_EQ(tvu_set(&t, &a, fd), 0);
    /* A second SET replaces the first area. */
    VHD_CHECK_EQ(tvu_set(&t, &a, fd), 0);
    close(fd);
    tvu_teardown(&t);
}

VHD_TEST(get_set_roundtrip_split)
{
    get_set_roundtrip(false);
}

/* Packed may still be negotiated: the area is sized for it (the larger layout). */
VHD_TEST(get_set_roundtrip_packed_offered)
{
    get_set_roundtrip(true);
}

/* A refused GET answers mmap_size 0 and no fd (QEMU reads that as "no area"). */
VHD_TEST(get_refused)
{
    struct tvu t;
    struct vu_inflight a;
    tvu_setup(&t, 2, false, PROTO_INFLIGHT);
    const uint16_t bad[][2] = {{0, 128}, {3, 128}, {1, 0}, {1, 40000}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int fd = tvu_get(&t, bad[i][0], bad[i][1], &a);
        VHD_CHECK_EQ(fd, -1);
        VHD_CHECK_EQ(a.mmap_size, 0);
    }
    /* The session goes on. */
    int fd = tvu_get(&t, 2, 256, &a);
    VHD_CHECK(fd >= 0);
    close(fd);
    tvu_teardown(&t);
}

/* Every malformed SET is refused with a non-zero ack; the session goes on. */
VHD_TEST(set_validation)
{
    struct tvu t;
    struct vu_inflight a;
    tvu_setup(&t, 2, false, PROTO_INFLIGHT);
    int fd = tvu_get(&t, 2, 64, &a);
    VHD_CHECK(fd >= 0);
    struct vu_inflight b;

    b = a, b.num_queues = 0;
    VHD_CHECK(tvu_set(&t, &b, fd) != 0);
    b = a, b.num_queues = 3; /* more than the device has */
    VHD_CHECK(tvu_set(&t, &b, fd) != 0);
    b = a, b.queue_size = 0;
    VHD_CHECK(tvu_set(&t, &b, fd) != 0);
    b = a, b.mmap_size = a.mmap_size - 64; /* too small for 2 x 64 records */
    VHD_CHECK(tvu_set(&t, &b, fd) != 0);
    b = a, b.mmap_size = 2 * vhd_inflight_queue_size(true, 64) + 4096; /* too big */
    VHD_CHECK(tvu_set(&t, &b, fd) != 0);
    b = a, b.mmap_offset = 1;
    VHD_CHECK(tvu_set(&t, &b, fd) != 0);
    b = a, b.mmap_offset = UINT64_MAX - 4095;
    VHD_CHECK(tvu_set(&t, &b, fd) != 0);
    b = a, b.queue_size = 256, b.mmap_size = 2 * vhd_inflight_queue_size(false, 256);
    VHD_CHECK(tvu_set(&t, &b, fd) != 0);                /* the file is shorter than that */
    VHD_CHECK_EQ(tvu_set(&t, &a, -1), (uint64_t)EBADF); /* no fd */
    VHD_CHECK_EQ(tvu_set(&t, &a, fd), 0);
    close(fd);
    tvu_teardown(&t);
}

/* Not negotiated: GET has no error reply, so the session ends; SET is nacked. */
VHD_TEST(not_negotiated)
{
    struct tvu t;
    struct vu_inflight a = {.num_queues = 1, .queue_size = 8, .mmap_size = 4096};
    tvu_setup(&t, 1, false, BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK));
    int fd = memfd_create("t", MFD_CLOEXEC);
    VHD_CHECK(fd >= 0 && ftruncate(fd, 4096) == 0);
    VHD_CHECK(tvu_set(&t, &a, fd) != 0);
    VHD_CHECK(tvu_send(&t, VHOST_USER_GET_INFLIGHT_FD, false, &a, -1) < 0);
    close(fd);
    tvu_teardown(&t);
}

/* Net devices do not offer it (they may drop requests; nothing to resubmit). */
VHD_TEST(offered_for_blk_only)
{
    struct vhd_dev_ops ops = {.type = "other"};
    struct vhd_dev d = {.ops = &ops};
    VHD_CHECK(!(vhd_vu_offered_protocol_features(&d) & BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)));
    ops.inflight_shmfd = true;
    VHD_CHECK(vhd_vu_offered_protocol_features(&d) & BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD));
}

/*
 * Packed head records that do not describe a chain: too long, a link out of
 * the area, a buffer id beyond the ring, two chains with one id, more slots
 * in flight than the ring has.
 */
VHD_TEST(corrupt_packed_chains)
{
    for (int v = 0; v < 5; v++) {
        struct ifx t;
        corrupt_setup(&t, true, 16);
        struct vhd_inflight_packed *p = t.region;
        /* Records 0,1 hold tag 0 (2 descriptors), 2,3 tag 1; 4.. are free. */
        VHD_CHECK_EQ(p->desc[0].inflight, 1);
        VHD_CHECK_EQ(p->desc[0].num, 2);
        VHD_CHECK_EQ(p->desc[2].inflight, 1);
        switch (v) {
        case 0:
            p->desc[0].num = 9;
            break;
        case 1:
            p->desc[0].next = 8;
            break;
        case 2:
            p->desc[p->desc[0].last].id = 8;
            break;
        case 3:
            p->desc[p->desc[0].last].id = p->desc[p->desc[2].last].id;
            break;
        case 4:
            /* Records 4..8 made into a third chain of 5 slots: 2 + 2 + 5 > 8. */
            VHD_CHECK_EQ(p->free_head, 4);
            p->desc[4].inflight = 1;
            p->desc[4].num = 5;
            p->desc[4].counter = 77;
            p->desc[4].last = 8;
            p->desc[8].id = 5; /* an id no other chain has */
            p->free_head = p->old_free_head = 9;
            break;
        }
        expect_start_fails(&t);
        ifx_teardown(&t);
    }
}

/* =====================================================================
 * A virtio-blk device restarted after a crash: the first back-end is the
 * bare engine on the rings and the area (it pops, completes some, and
 * dies); the second is the real blk device (uring backend on an image)
 * started through a vhost-user session with the same area. The requests
 * not completed must be executed (their data lands in the image), the
 * completed ones must not be executed again (their sectors stay zero).
 * ===================================================================== */

#define BQS   16
#define NREQ  6
#define SECT  512
#define GBASE 0x100000ull

struct breq {
    struct virtio_blk_outhdr hdr;
    uint8_t data[SECT];
    uint8_t status;
};

/* A request with NEED_REPLY: returns the ack (0 = done). */
static uint64_t tvu_msg(struct tvu *t, uint32_t req, const void *payload, uint32_t size, int fd)
{
    struct vu_hdr h = {
        .request = req, .flags = VHOST_USER_VERSION | VHOST_USER_NEED_REPLY_MASK, .size = size};
    union vu_payload p;
    int rfd;
    VHD_CHECK_EQ(vu_send(t->cli, &h, payload, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, 1000), 0);
    VHD_CHECK_EQ(vhd_vu_conn_process(t->c), 0);
    VHD_CHECK_EQ(tvu_reply(t, req, &p, &rfd), 8);
    VHD_CHECK_EQ(rfd, -1);
    return p.u64;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* GET_VRING_BASE on ring 0: the base in the reply. */
static uint32_t tvu_get_base(struct tvu *t)
{
    struct vu_vring_state gs = {.index = 0};
    struct vu_hdr gh = {
        .request = VHOST_USER_GET_VRING_BASE, .flags = VHOST_USER_VERSION, .size = sizeof(gs)};
    union vu_payload rp;
    int rfd;
    VHD_CHECK_EQ(vu_send(t->cli, &gh, &gs, NULL, 0, 1000), 0);
    VHD_CHECK_EQ(vhd_vu_conn_process(t->c), 0);
    VHD_CHECK_EQ(tvu_reply(t, VHOST_USER_GET_VRING_BASE, &rp, &rfd), sizeof(gs));
    VHD_CHECK_EQ(rfd, -1);
    return rp.state.num;
}

/*
 * How back-end #2's ring ends: BLK_RUN runs it (resubmissions, then new
 * requests, then a stop); BLK_STOP_DISABLED stops it started but never
 * enabled (nothing ran it); BLK_STOP_AT_ONCE enables it and stops it at once.
 * BLK_RUN gives the base a front-end has after a crash (split: used->idx;
 * packed: a stale one, QEMU's last); BLK_BASE_AGREES gives the used
 * position the driver reaped up to (our driver: the area's position).
 * BLK_GUEST_RESET (packed): the driver re-initialises its ring (zeroed, as
 * after a device reset) and queues two new requests, and the front-end
 * restarts from the fresh base with the old area: only the new requests
 * may run, none of the four the area lists.
 */
enum { BLK_RUN, BLK_STOP_DISABLED, BLK_STOP_AT_ONCE, BLK_BASE_AGREES, BLK_GUEST_RESET };

static void blk_crash_mode(bool packed, int mode)
{
    char image[256];
    const char *dir = getenv("TMPDIR");
    snprintf(image, sizeof(image), "%s/vhd-test-inflight-XXXXXX", dir && *dir ? dir : "/var/tmp");
    int img = mkstemp(image);
    VHD_CHECK(img >= 0);
    VHD_CHECK_EQ(ftruncate(img, 1 << 20), 0);

    struct tvu t;
    tvu_setup_image(&t, 1, packed, PROTO_INFLIGHT, image);
    unlink(image);
    /* no vIOMMU here: addresses are not IOVAs (QEMU strips bit 33 without one) */
    uint64_t f = vhd_vu_offered_features(t.dev) & ~BIT(VIRTIO_F_ACCESS_PLATFORM);
    if (!packed)
        f &= ~BIT(VIRTIO_F_RING_PACKED);
    VHD_CHECK(!packed || (f & BIT(VIRTIO_F_RING_PACKED)));
    bool event_idx = (f & BIT(VIRTIO_F_EVENT_IDX)) != 0;
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_FEATURES, &f, 8, -1), 0);

    /* Guest memory, given to the device. */
    struct vhd_guestmem gm;
    struct vhd_mem_region_desc md;
    VHD_CHECK_EQ(vhd_guestmem_init(&gm, 1, 4 << 20, GBASE, 0), 0);
    vhd_guestmem_descs(&gm, &md);
    struct vu_mem_table mt = {.nregions = 1};
    mt.regions[0] = (struct vu_mem_region){
        .gpa = md.gpa, .size = md.size, .uva = md.uva, .mmap_offset = md.mmap_offset};
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_MEM_TABLE, &mt, 8 + 32, md.fd), 0);

    /* The driver's ring and requests. */
    struct vhd_drv_vq dq;
    void *ring;
    size_t ring_len = vhd_drv_vq_area_size(BQS, packed, 0);
    uint64_t ring_gpa = vhd_guestmem_alloc(&gm, ring_len, 4096, &ring);
    struct vhd_drv_vq_params dp = {.size = BQS,
                                   .packed = packed,
                                   .event_idx = event_idx,
                                   .area = ring,
                                   .area_gpa = ring_gpa,
                                   .area_len = ring_len};
    VHD_CHECK_EQ(vhd_drv_vq_init(&dq, &dp), 0);
    struct breq *rq;
    uint64_t rq_gpa = vhd_guestmem_alloc(&gm, sizeof(struct breq) * (NREQ + 2), 64, (void **)&rq);

    /* The inflight area, as a front-end gets and keeps it. */
    struct vu_inflight a;
    int afd = tvu_get(&t, 1, BQS, &a);
    VHD_CHECK(afd >= 0);
    void *area = mmap(NULL, a.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0);
    VHD_CHECK(area != MAP_FAILED);
    VHD_CHECK_EQ(tvu_set(&t, &a, afd), 0);

    /* ---- back-end #1: pops all, completes 1 and 4, dies ---- */
    struct vhd_mem *mem1;
    VHD_CHECK_EQ(vhd_mem_new(&md, 1, &mem1), 0);
    struct vhd_vq vq1;
    struct vhd_vq_params vp = {.size = BQS,
                               .packed = packed,
                               .event_idx = event_idx,
                               .addr_is_gpa = true,
                               .desc = dq.desc_gpa,
                               .avail = dq.avail_gpa,
                               .used = dq.used_gpa};
    VHD_CHECK_EQ(vhd_vq_init(&vq1, &vp, mem1), 0);
    VHD_CHECK_EQ(vhd_vq_set_base(&vq1, packed ? (1u << 15 | 1u << 31) : 0), 0);
    VHD_CHECK_EQ(vhd_vq_set_inflight(&vq1, area, BQS), 0);
    VHD_CHECK_EQ(vhd_vq_start(&vq1), 0);

    for (uint32_t i = 0; i < NREQ + 2; i++) {
        rq[i].hdr.type = VIRTIO_BLK_T_OUT;
        rq[i].hdr.sector = i;
        memset(rq[i].data, 0x40 + (int)i, SECT);
        rq[i].status = 0xff;
    }
    for (uint32_t i = 0; i < NREQ; i++) {
        uint64_t g = rq_gpa + i * sizeof(struct breq);
        struct vhd_drv_buf b[2] = {{g, 16 + SECT}, {g + 16 + SECT, 1}};
        VHD_CHECK_EQ(vhd_drv_vq_add(&dq, b, 1, 1, false, (void *)(uintptr_t)(i + 1)), 0);
    }
    vhd_drv_vq_publish(&dq);
    struct vhd_vq_chain ch[NREQ];
    struct iovec iov[4];
    for (uint32_t i = 0; i < NREQ; i++) {
        VHD_CHECK_EQ(vhd_vq_pop(&vq1, iov, 4, &ch[i]), 1);
        if (i == 1 || i == 4) {
            *(uint8_t *)iov[ch[i].nr].iov_base = VIRTIO_BLK_S_OK; /* "completed" */
            VHD_CHECK_EQ(vhd_vq_push(&vq1, &ch[i], 1), 0);
        }
    }
    vhd_vq_flush(&vq1);
    vhd_vq_fini(&vq1); /* the crash: nothing else completes */
    vhd_mem_free(mem1);

    bool seen[NREQ + 2] = {false};
    void *ck;
    uint32_t len;
    for (int k = 0; k < 2; k++) {
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&dq, &ck, &len), 1);
        seen[(uintptr_t)ck - 1] = true;
    }
    VHD_CHECK(seen[1] && seen[4]);

    /* ---- back-end #2: the blk device, started like QEMU restarts a ring ---- */
    struct vu_vring_state st = {.index = 0, .num = BQS};
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), -1), 0);
    struct vu_vring_addr va = {.index = 0,
                               .desc = vhd_guestmem_uva(&gm, dq.desc_gpa),
                               .avail = vhd_guestmem_uva(&gm, dq.avail_gpa),
                               .used = vhd_guestmem_uva(&gm, dq.used_gpa)};
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_VRING_ADDR, &va, sizeof(va), -1), 0);
    /* Split: QEMU's base after a crash is used->idx; packed: stale (the area knows). */
    st.num = packed ? 0 : vhd_le16(dq.ring.split.used->idx);
    if (mode == BLK_BASE_AGREES && packed) {
        uint32_t pos = dq.last_used | (dq.used_wrap ? 1u << 15 : 0);
        st.num = pos | pos << 16;
    }
    if (mode == BLK_GUEST_RESET) {
        vhd_drv_vq_fini(&dq);
        VHD_CHECK_EQ(vhd_drv_vq_init(&dq, &dp), 0);
        for (uint32_t i = NREQ; i < NREQ + 2; i++) {
            uint64_t g = rq_gpa + i * sizeof(struct breq);
            struct vhd_drv_buf b[2] = {{g, 16 + SECT}, {g + 16 + SECT, 1}};
            VHD_CHECK_EQ(vhd_drv_vq_add(&dq, b, 1, 1, false, (void *)(uintptr_t)(i + 1)), 0);
        }
        vhd_drv_vq_publish(&dq);
        st.num = packed ? 1u << 15 | 1u << 31 : 0;
    }
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_VRING_BASE, &st, sizeof(st), -1), 0);
    int callfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), kickfd = eventfd(0, EFD_CLOEXEC);
    VHD_CHECK(callfd >= 0 && kickfd >= 0);
    uint64_t idx = 0;
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_VRING_CALL, &idx, 8, callfd), 0);
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_VRING_KICK, &idx, 8, kickfd), 0);
    st.num = 1;
    if (mode != BLK_STOP_DISABLED)
        VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_VRING_ENABLE, &st, sizeof(st), -1), 0);
    uint32_t got = 0, nreq = NREQ + 2;
    if (mode == BLK_GUEST_RESET) {
        /* The two new requests, and nothing else. */
        for (uint64_t t0 = mono_ms(); got < 2 && mono_ms() - t0 < 5000;) {
            int rc = vhd_drv_vq_get_used(&dq, &ck, &len);
            VHD_CHECK(rc >= 0);
            if (rc == 0) {
                usleep(1000);
                continue;
            }
            uint32_t tag = (uint32_t)(uintptr_t)ck - 1;
            VHD_CHECK(tag >= NREQ && tag < NREQ + 2 && !seen[tag]);
            seen[tag] = true;
            VHD_CHECK_EQ(rq[tag].status, VIRTIO_BLK_S_OK);
            got++;
        }
        VHD_CHECK_EQ(got, 2);
        usleep(50000);
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&dq, &ck, &len), 0);
        VHD_CHECK_EQ(tvu_get_base(&t), 4u | 1u << 15 | 4u << 16 | 1u << 31);
        for (uint32_t i = 0; i < NREQ + 2; i++) {
            uint8_t buf[SECT];
            VHD_CHECK_EQ(pread(img, buf, SECT, (off_t)i * SECT), SECT);
            uint8_t want = i >= NREQ ? (uint8_t)(0x40 + i) : 0;
            for (uint32_t k = 0; k < SECT; k++)
                VHD_CHECK_EQ(buf[k], want);
        }
        nreq = 0; /* checked above */
        goto check_image;
    }
    if (mode != BLK_RUN && mode != BLK_BASE_AGREES) {
        /*
         * Stopped before the resubmissions ran (or while they run): the
         * reply comes after all four completed, the base is the used
         * position and the area lists nothing, so a front-end that gets
         * only the base (a migration destination) loses nothing.
         */
        uint32_t base = tvu_get_base(&t);
        while (got < 4 && vhd_drv_vq_get_used(&dq, &ck, &len) == 1) {
            uint32_t tag = (uint32_t)(uintptr_t)ck - 1;
            VHD_CHECK(tag < NREQ && !seen[tag]);
            seen[tag] = true;
            VHD_CHECK_EQ(rq[tag].status, VIRTIO_BLK_S_OK);
            got++;
        }
        VHD_CHECK_EQ(got, 4);
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&dq, &ck, &len), 0);
        /* Every chain made available is used: 2 slots each in a packed ring. */
        uint32_t pos = packed ? 2 * NREQ | 1u << 15 : NREQ;
        VHD_CHECK_EQ(base, packed ? pos | pos << 16 : pos);
        if (!packed)
            VHD_CHECK_EQ(vhd_le16(dq.ring.split.used->idx), NREQ);
        nreq = NREQ;
        goto check_image;
    }

    /* The four left are executed once each, without a kick. */
    for (uint64_t t0 = mono_ms(); got < 4 && mono_ms() - t0 < 5000;) {
        int rc = vhd_drv_vq_get_used(&dq, &ck, &len);
        VHD_CHECK(rc >= 0);
        if (rc == 0) {
            usleep(1000);
            continue;
        }
        uint32_t tag = (uint32_t)(uintptr_t)ck - 1;
        VHD_CHECK(tag < NREQ && !seen[tag]);
        seen[tag] = true;
        VHD_CHECK_EQ(rq[tag].status, VIRTIO_BLK_S_OK);
        got++;
    }
    VHD_CHECK_EQ(got, 4);

    /* New requests run as usual after them. */
    for (uint32_t i = NREQ; i < NREQ + 2; i++) {
        uint64_t g = rq_gpa + i * sizeof(struct breq);
        struct vhd_drv_buf b[2] = {{g, 16 + SECT}, {g + 16 + SECT, 1}};
        VHD_CHECK_EQ(vhd_drv_vq_add(&dq, b, 1, 1, false, (void *)(uintptr_t)(i + 1)), 0);
    }
    vhd_drv_vq_publish(&dq);
    eventfd_write(kickfd, 1);
    for (uint64_t t0 = mono_ms(); got < 6 && mono_ms() - t0 < 5000;) {
        int rc = vhd_drv_vq_get_used(&dq, &ck, &len);
        VHD_CHECK(rc >= 0);
        if (rc == 0) {
            usleep(1000);
            continue;
        }
        uint32_t tag = (uint32_t)(uintptr_t)ck - 1;
        VHD_CHECK(tag < NREQ + 2 && !seen[tag]);
        seen[tag] = true;
        got++;
    }
    VHD_CHECK_EQ(got, 6);

    /* GET_VRING_BASE stops the ring with nothing left in flight in the area. */
    uint32_t base = tvu_get_base(&t);
    if (!packed)
        VHD_CHECK_EQ(base, vhd_le16(dq.ring.split.used->idx));

check_image:
    /* The image: written exactly for the requests executed by back-end #2. */
    for (uint32_t i = 0; i < nreq; i++) {
        uint8_t buf[SECT];
        VHD_CHECK_EQ(pread(img, buf, SECT, (off_t)i * SECT), SECT);
        uint8_t want = (i == 1 || i == 4) ? 0 : (uint8_t)(0x40 + i);
        for (uint32_t k = 0; k < SECT; k++)
            VHD_CHECK_EQ(buf[k], want);
    }
    if (packed) {
        struct vhd_inflight_packed *p = area;
        for (uint32_t i = 0; i < BQS; i++)
            VHD_CHECK_EQ(p->desc[i].inflight, 0);
    } else {
        struct vhd_inflight_split *sp = area;
        for (uint32_t i = 0; i < BQS; i++)
            VHD_CHECK_EQ(sp->desc[i].inflight, 0);
        VHD_CHECK_EQ(sp->used_idx, vhd_le16(dq.ring.split.used->idx));
    }

    munmap(area, a.mmap_size);
    close(afd);
    tvu_teardown(&t);
    close(callfd);
    close(kickfd);
    close(img);
    vhd_drv_vq_fini(&dq);
    vhd_guestmem_fini(&gm);
}

VHD_TEST(blk_crash_resubmit_split)
{
    blk_crash_mode(false, BLK_RUN);
}

VHD_TEST(blk_crash_resubmit_packed)
{
    blk_crash_mode(true, BLK_RUN);
}

/* A restarted ring stopped before its resubmissions ran completes them first. */
VHD_TEST(blk_crash_stop_disabled_split)
{
    blk_crash_mode(false, BLK_STOP_DISABLED);
}

VHD_TEST(blk_crash_stop_disabled_packed)
{
    blk_crash_mode(true, BLK_STOP_DISABLED);
}

VHD_TEST(blk_crash_stop_at_once_split)
{
    blk_crash_mode(false, BLK_STOP_AT_ONCE);
}

VHD_TEST(blk_crash_stop_at_once_packed)
{
    blk_crash_mode(true, BLK_STOP_AT_ONCE);
}

/* Packed: the front-end's base agrees with the area (the used position it reaped up to). */
VHD_TEST(blk_crash_base_agrees_packed)
{
    blk_crash_mode(true, BLK_BASE_AGREES);
}

/* Packed: a driver reset with the old area kept: the front-end's base stands, the records go. */
VHD_TEST(blk_guest_reset_old_area_packed)
{
    blk_crash_mode(true, BLK_GUEST_RESET);
}

/*
 * A corrupt area fails the ring's start (nack) and marks the device broken
 * (NEEDS_RESET); a new area from GET_INFLIGHT_FD lets the ring start. A
 * ring beyond the area's num_queues is refused as well.
 */
VHD_TEST(transport_corrupt_area_fails_ring)
{
    struct tvu t;
    tvu_setup(&t, 2, false, PROTO_INFLIGHT);
    uint64_t f = vhd_vu_offered_features(t.dev) &
                 ~(BIT(VIRTIO_F_RING_PACKED) | BIT(VIRTIO_F_ACCESS_PLATFORM));
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_FEATURES, &f, 8, -1), 0);
    struct vhd_guestmem gm;
    struct vhd_mem_region_desc md;
    VHD_CHECK_EQ(vhd_guestmem_init(&gm, 1, 1 << 20, GBASE, 0), 0);
    vhd_guestmem_descs(&gm, &md);
    struct vu_mem_table mt = {.nregions = 1};
    mt.regions[0] = (struct vu_mem_region){
        .gpa = md.gpa, .size = md.size, .uva = md.uva, .mmap_offset = md.mmap_offset};
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_MEM_TABLE, &mt, 8 + 32, md.fd), 0);
    void *ring;
    size_t ring_len = vhd_drv_vq_area_size(BQS, false, 0);
    uint64_t ring_gpa = vhd_guestmem_alloc(&gm, ring_len, 4096, &ring);
    memset(ring, 0, ring_len);

    for (uint32_t q = 0; q < 2; q++) {
        struct vu_vring_state st = {.index = q, .num = BQS};
        VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), -1), 0);
        struct vu_vring_addr va = {.index = q,
                                   .desc = vhd_guestmem_uva(&gm, ring_gpa),
                                   .avail = vhd_guestmem_uva(&gm, ring_gpa + 16 * BQS),
                                   .used = vhd_guestmem_uva(&gm, ring_gpa + 2048)};
        VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_VRING_ADDR, &va, sizeof(va), -1), 0);
    }

    struct vu_inflight a;
    int afd = tvu_get(&t, 1, BQS, &a); /* one queue only */
    VHD_CHECK(afd >= 0);
    struct vhd_inflight_split *area =
        mmap(NULL, a.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0);
    VHD_CHECK(area != MAP_FAILED);
    area->version = 5;
    VHD_CHECK_EQ(tvu_set(&t, &a, afd), 0);

    uint64_t kick0 = 0 | VHOST_USER_VRING_NOFD_MASK, kick1 = 1 | VHOST_USER_VRING_NOFD_MASK;
    VHD_CHECK(!t.dev->broken);
    VHD_CHECK(tvu_msg(&t, VHOST_USER_SET_VRING_KICK, &kick0, 8, -1) != 0);
    VHD_CHECK(t.dev->broken);
    VHD_CHECK(!t.dev->queues[0].started);
    /* Ring 1 has no region in a one-queue area. */
    VHD_CHECK(tvu_msg(&t, VHOST_USER_SET_VRING_KICK, &kick1, 8, -1) != 0);
    VHD_CHECK(!t.dev->queues[1].started);

    /* A new area: the ring starts and the area is initialised. */
    munmap(area, a.mmap_size);
    close(afd);
    afd = tvu_get(&t, 2, BQS, &a);
    VHD_CHECK(afd >= 0);
    VHD_CHECK_EQ(tvu_set(&t, &a, afd), 0);
    VHD_CHECK_EQ(tvu_msg(&t, VHOST_USER_SET_VRING_KICK, &kick0, 8, -1), 0);
    VHD_CHECK(t.dev->queues[0].started);
    /* ...and SET_INFLIGHT_FD is refused while a ring runs on the area. */
    VHD_CHECK_EQ(tvu_set(&t, &a, afd), (uint64_t)EBUSY);
    area = mmap(NULL, a.mmap_size, PROT_READ, MAP_SHARED, afd, 0);
    VHD_CHECK(area != MAP_FAILED);
    VHD_CHECK_EQ(area->version, VHD_INFLIGHT_VERSION);
    VHD_CHECK_EQ(area->desc_num, BQS);
    munmap(area, a.mmap_size);
    close(afd);
    tvu_teardown(&t);
    vhd_guestmem_fini(&gm);
}

/* =====================================================================
 * Random traffic with crashes at random points (also in the middle of a
 * flush): every request is completed exactly once in the end, and each
 * restart pops back exactly the chains in flight, in their pop order.
 * ===================================================================== */

static uint64_t rs;

static uint32_t rnd32(void)
{
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (uint32_t)(rs >> 11);
}

enum { T_FREE, T_POSTED };

struct rstate {
    uint8_t st[MAXREQ];      /* T_FREE / T_POSTED (posted until collected) */
    bool held[MAXREQ];       /* popped by the current back-end, not pushed */
    bool pushed[MAXREQ];     /* pushed, not yet flushed */
    uint64_t popseq[MAXREQ]; /* order of the first pop (survives restarts) */
    bool popped[MAXREQ];     /* popped at least once since posted */
    uint64_t seq;
    uint32_t posted, collected;
};

static void r_collect(struct ifx *t, struct rstate *r)
{
    void *ck;
    uint32_t len;
    int rc;
    while ((rc = vhd_drv_vq_get_used(&t->f.dq, &ck, &len)) == 1) {
        uint32_t tag = (uint32_t)(uintptr_t)ck - 1;
        VHD_CHECK(tag < MAXREQ);
        VHD_CHECK_EQ(r->st[tag], T_POSTED); /* completed once, never twice */
        VHD_CHECK(!r->held[tag] && !r->pushed[tag]);
        r->st[tag] = T_FREE;
        r->popped[tag] = false;
        r->collected++;
    }
    VHD_CHECK_EQ(rc, 0); /* the driver saw no id twice either */
}

/* After a restart: the chains to pop again are exactly `want`, in first-pop order. */
static void r_check_resubmit(struct ifx *t, struct rstate *r, const bool *want)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < MAXREQ; i++)
        n += want[i];
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t->f.vq), n);
    uint64_t prev = 0;
    for (uint32_t k = 0; k < n; k++) {
        int tag = ifx_pop(t);
        VHD_CHECK(tag >= 0 && want[tag]);
        VHD_CHECK(k == 0 || r->popseq[tag] > prev);
        prev = r->popseq[tag];
        r->held[tag] = true;
    }
}

static void random_crashes(bool packed, uint32_t size, uint64_t seed)
{
    struct ifx t;
    struct rstate r;
    ifx_setup(&t, packed, size, size);
    memset(&r, 0, sizeof(r));
    rs = seed;
    bool want[MAXREQ];

    for (int step = 0; step < 4000; step++) {
        uint32_t op = rnd32() % 100;
        if (op < 25) {
            for (uint32_t k = 1 + rnd32() % 3; k > 0; k--) {
                uint32_t tag = rnd32() % MAXREQ;
                if (r.st[tag] != T_FREE || t.f.dq.num_free < 2)
                    continue;
                ifx_add(&t, tag);
                r.st[tag] = T_POSTED;
                r.posted++;
            }
            vhd_drv_vq_publish(&t.f.dq);
        } else if (op < 55) {
            int tag = ifx_pop(&t);
            /* Packed: a tracked pop publishes the pending batch first (vq_packed.c). */
            if (packed)
                memset(r.pushed, 0, sizeof(r.pushed));
            if (tag >= 0) {
                VHD_CHECK_EQ(r.st[tag], T_POSTED);
                VHD_CHECK(!r.held[tag] && !r.pushed[tag]);
                VHD_CHECK(!r.popped[tag]); /* a new chain: never popped before */
                r.held[tag] = true;
                r.popped[tag] = true;
                r.popseq[tag] = ++r.seq;
            }
        } else if (op < 75) {
            uint32_t start = rnd32() % MAXREQ;
            for (uint32_t k = 0; k < MAXREQ; k++) {
                uint32_t tag = (start + k) % MAXREQ;
                if (r.held[tag]) {
                    ifx_push(&t, tag);
                    r.held[tag] = false;
                    r.pushed[tag] = true;
                    break;
                }
            }
        } else if (op < 85) {
            vhd_vq_flush(&t.f.vq);
            memset(r.pushed, 0, sizeof(r.pushed));
        } else if (op < 92) {
            r_collect(&t, &r);
        } else if (op < 97) {
            /* Crash: held and pushed-but-unpublished chains come back. */
            for (uint32_t i = 0; i < MAXREQ; i++) {
                want[i] = r.held[i] || r.pushed[i];
                r.held[i] = r.pushed[i] = false;
            }
            ifx_crash_restart(&t);
            r_check_resubmit(&t, &r, want);
        } else {
            /* Crash in the middle of a flush: published, records not yet cleared. */
            void *before = malloc(t.region_len);
            VHD_CHECK(before != NULL);
            memcpy(before, t.region, t.region_len);
            vhd_vq_flush(&t.f.vq);
            if (packed) {
                struct vhd_inflight_packed *now = t.region, *b = before;
                b->used_idx = now->used_idx;
                b->used_wrap_counter = now->used_wrap_counter;
            }
            memcpy(t.region, before, t.region_len);
            free(before);
            for (uint32_t i = 0; i < MAXREQ; i++) {
                want[i] = r.held[i];
                r.held[i] = r.pushed[i] = false;
            }
            ifx_crash_restart(&t);
            r_check_resubmit(&t, &r, want);
        }
    }
    /* Drain: everything posted is completed, once. */
    for (int round = 0; round < 100 && r.collected < r.posted; round++) {
        int tag;
        while ((tag = ifx_pop(&t)) >= 0) {
            VHD_CHECK(!r.held[tag]);
            r.held[tag] = true;
        }
        for (uint32_t i = 0; i < MAXREQ; i++)
            if (r.held[i]) {
                ifx_push(&t, i);
                r.held[i] = false;
            }
        vhd_vq_flush(&t.f.vq);
        memset(r.pushed, 0, sizeof(r.pushed));
        r_collect(&t, &r);
    }
    VHD_CHECK_EQ(r.collected, r.posted);
    VHD_CHECK(r.posted > 100);
    ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

BOTH(random_crashes_small_ring)
{
    for (uint64_t seed = 1; seed <= 4; seed++)
        random_crashes(packed, packed ? 11 : 8, seed * 0x9E3779B97F4A7C15ull);
}

BOTH(random_crashes_large_ring)
{
    random_crashes(packed, 64, 0x1234567887654321ull);
}

/*
 * Regression (packed): a batch pushed but not published when the back-end
 * died left used descriptors in the ring behind the batch's first slot.
 * After the restart the first completion lands in that first slot; the
 * driver then looks at the next one, which must not show the dead
 * back-end's stale completion of a chain being resubmitted.
 */
VHD_TEST(stale_used_after_rollback_packed)
{
    struct ifx t;
    ifx_setup(&t, true, 8, 8);
    ifx_take(&t, 0, 3);
    ifx_push(&t, 0);
    ifx_push(&t, 1); /* its used descriptor is written in slot 2, not yet published */
    ifx_crash_restart(&t);
    VHD_CHECK_EQ(ifx_collect(&t), 0);
    ifx_pop_range(&t, 0, 3);
    ifx_push(&t, 2);
    vhd_vq_flush(&t.f.vq);
    VHD_CHECK_EQ(ifx_collect(&t), 1);
    VHD_CHECK(t.done[2] && !t.done[1] && !t.done[0]);
    ifx_push(&t, 1);
    ifx_push(&t, 0);
    vhd_vq_flush(&t.f.vq);
    VHD_CHECK_EQ(ifx_collect(&t), 2);
    ifx_check_area_clean(&t);
    ifx_teardown(&t);
}

/* =====================================================================
 * Races: the front-end rewrites the area between a check and its use.
 * This program is built with its own copy of src/core/inflight.c compiled
 * with VHD_TEST_RACE_HOOKS (meson.build), so the race points of race.h call
 * the hook below; the library linked into the daemon has none.
 * ===================================================================== */

#ifndef VHD_TEST_RACE_HOOKS
#error "test_inflight needs its own inflight.c built with VHD_TEST_RACE_HOOKS (meson.build)"
#endif

void (*vhd_race_hook)(const char *point);

/* One rewrite, at the first time the code passes `point`. */
static struct {
    const char *point;
    void *field;  /* in the area */
    size_t width; /* bytes: 1, 2 or 8 */
    uint64_t value;
    unsigned hits; /* times the point was passed */
} g_race;

static void race_rewrite(const char *point)
{
    if (!g_race.point || strcmp(point, g_race.point) != 0 || g_race.hits++ > 0)
        return;
    memcpy(g_race.field, &g_race.value, g_race.width); /* host (little-endian) order */
}

static void race_arm(const char *point, void *field, size_t width, uint64_t value)
{
    memset(&g_race, 0, sizeof(g_race));
    g_race.point = point;
    g_race.field = field;
    g_race.width = width;
    g_race.value = value;
    vhd_race_hook = race_rewrite;
}

/* Far past the ring: where the old packed start stored descriptor flags. */
#define RACE_FAR_SLOT 0x7ff0u
/* Guest memory watched for stray writes: the descriptor ring's end up to past RACE_FAR_SLOT. */
#define RACE_WATCH_LEN (16u * (RACE_FAR_SLOT + 64u))

struct race_watch {
    uint8_t *p, *copy;
    size_t len;
};

/* Remember the guest memory after the ring (event areas, buffers: the start writes none). */
static void race_watch_begin(struct ifx *t, struct race_watch *w)
{
    w->len = RACE_WATCH_LEN;
    w->p = vqfx_ptr(&t->f, t->f.dq.desc_gpa + 16ull * t->f.o.size, w->len);
    w->copy = malloc(w->len);
    VHD_CHECK(w->copy != NULL);
    memcpy(w->copy, w->p, w->len);
}

static void race_watch_end(struct race_watch *w)
{
    for (size_t i = 0; i < w->len; i++)
        if (w->p[i] != w->copy[i]) {
            fprintf(stderr, "  byte %zu past the descriptor ring changed by the start\n", i);
            VHD_CHECK(0);
        }
    free(w->copy);
}

/* Restart the device queue after a crash with set_base `base`; the start's rc. */
static int race_restart(struct ifx *t, uint32_t base)
{
    vhd_vq_fini(&t->f.vq);
    ifx_start(t, base);
    int rc = vhd_vq_start(&t->f.vq);
    vhd_race_hook = NULL;
    return rc;
}

/*
 * The contract for any rewrite: the start fails (VHD_VQ_E_INFLIGHT), or the
 * queue's positions are inside the ring and the chains in flight come back
 * with their own ids (tags want[0..n)) until a pop that sees the rewritten
 * area fails; never a chain under another id, never a write past the ring.
 */
static void race_expect(struct ifx *t, int rc, const uint32_t *want, uint32_t n)
{
    struct vhd_vq *vq = &t->f.vq;
    if (rc != 0) {
        VHD_CHECK_EQ(rc, -EBADMSG);
        VHD_CHECK_EQ(vq->error, VHD_VQ_E_INFLIGHT);
        return;
    }
    VHD_CHECK(vq->used_idx < vq->size);
    VHD_CHECK(vq->last_avail_idx < vq->size);
    VHD_CHECK(vq->published_used < vq->size);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(vq), n);
    for (uint32_t i = 0; i < n; i++) {
        struct iovec iov[4];
        struct vhd_vq_chain c;
        int prc = vhd_vq_pop(vq, iov, 4, &c);
        if (prc < 0) {
            VHD_CHECK(vq->error != 0); /* an error ends it: the queue is broken */
            return;
        }
        VHD_CHECK_EQ(prc, 1);
        VHD_CHECK(c.id < vq->size);
        uint64_t tag;
        VHD_CHECK_EQ(c.rlen, 8);
        memcpy(&tag, iov[0].iov_base, 8);
        VHD_CHECK_EQ(tag, want[i]);
        if (vq->packed) /* the id is the one the driver gave the chain */
            VHD_CHECK_EQ(c.id, t->chain[want[i]].id);
    }
}

/*
 * Packed: 4 chains popped, the first completed (the area's used position
 * is slot 2 of lap 1), crash; the new start is given the same used position
 * (agreeing base). At `point`, the front-end rewrites the area's used
 * positions far beyond the ring. Before the fix the start read
 * old_used_idx again after resubmit_list() and stored descriptor flags up
 * to 512 KiB past the ring, leaving used_idx outside it.
 */
static void race_packed_positions(const char *point)
{
    struct ifx t;
    struct race_watch w;
    ifx_setup(&t, true, 16, 16);
    ifx_take(&t, 0, 4);
    ifx_complete_range(&t, 0, 1);
    struct vhd_inflight_packed *p = t.region;
    VHD_CHECK_EQ(p->old_used_idx, 2); /* a chain is 2 descriptors */
    race_watch_begin(&t, &w);
    race_arm(point, &p->old_used_idx, 2, RACE_FAR_SLOT);
    int rc = race_restart(&t, 2u | 1u << 15 | 2u << 16 | 1u << 31);
    VHD_CHECK(g_race.hits >= 1); /* the point was passed */
    race_watch_end(&w);
    const uint32_t want[3] = {1, 2, 3};
    race_expect(&t, rc, want, 3);
    ifx_teardown(&t);
}

VHD_TEST(race_packed_used_idx_after_header)
{
    race_packed_positions("packed_start:header");
}

VHD_TEST(race_packed_used_idx_after_chain_check)
{
    race_packed_positions("packed_start:chain");
}

VHD_TEST(race_packed_used_idx_after_resubmit_list)
{
    race_packed_positions("packed_start:resubmit");
}

/*
 * Packed: a chain's buffer id (in its last record) is rewritten to an id
 * far beyond the ring right after it was checked. Before the fix the start
 * read it again to index (and write) inf_head_of_id: 64 KiB past a 32-byte
 * array.
 */
VHD_TEST(race_packed_id_after_check)
{
    struct ifx t;
    ifx_setup(&t, true, 16, 16);
    ifx_take(&t, 0, 3);
    struct vhd_inflight_packed *p = t.region;
    /* Records are checked in index order: the first chain in flight is the first hit. */
    uint32_t head = 0;
    while (head < t.desc_num && !p->desc[head].inflight)
        head++;
    VHD_CHECK(head < t.desc_num);
    uint16_t last = p->desc[head].last, id = p->desc[last].id;
    race_arm("packed_start:id", &p->desc[last].id, 2, 0x7fff);
    int rc = race_restart(&t, 0);
    VHD_CHECK(g_race.hits >= 1); /* the point was passed */
    if (rc == 0)                 /* what start recorded is the id it checked */
        VHD_CHECK_EQ(t.f.vq.inf_head_of_id[id], head);
    const uint32_t want[3] = {0, 1, 2};
    race_expect(&t, rc, want, 3);
    ifx_teardown(&t);
}

/*
 * Split and packed: a region with a bad version (2) is rewritten to version
 * 1 after the header was read. Before the fix the split start read version
 * a second time and took the region.
 */
BOTH(race_version_after_header)
{
    struct ifx t;
    corrupt_setup(&t, packed, 8);
    struct vhd_inflight_split *s = t.region; /* version: same place in both layouts */
    s->version = 2;
    race_arm(packed ? "packed_start:header" : "split_start:header", &s->version, 2,
             VHD_INFLIGHT_VERSION);
    int rc = race_restart(&t, 0);
    VHD_CHECK(g_race.hits >= 1); /* the point was passed */
    VHD_CHECK_EQ(rc, -EBADMSG);
    VHD_CHECK_EQ(t.f.vq.error, VHD_VQ_E_INFLIGHT);
    ifx_teardown(&t);
}

/*
 * Packed, no race point needed: between the start and the pop that submits
 * a chain again, the front-end gives that chain the buffer id of another
 * chain in flight. Before the fix both were popped under one id (the
 * device indexes its requests by id); now the pop fails the queue.
 */
VHD_TEST(resubmit_id_rewritten_packed)
{
    struct ifx t;
    ifx_setup(&t, true, 16, 16);
    ifx_take(&t, 0, 3);
    ifx_crash_restart(&t);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 3);
    struct vhd_inflight_packed *p = t.region;
    uint16_t first = t.f.vq.inf_resubmit[0], second = t.f.vq.inf_resubmit[1];
    p->desc[p->desc[first].last].id = p->desc[p->desc[second].last].id;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    VHD_CHECK_EQ(vhd_vq_pop(&t.f.vq, iov, 4, &c), -VHD_VQ_E_INFLIGHT);
    VHD_CHECK_EQ(t.f.vq.error, VHD_VQ_E_INFLIGHT);
    ifx_teardown(&t);
}

/*
 * Packed: the same with the chain's length (its head record's num): start
 * placed the ring position after the slots it counted; a chain popped
 * again with another length would be pushed over other chains' slots.
 * Before the fix the pop read num again and popped a 1-slot chain.
 */
VHD_TEST(resubmit_num_rewritten_packed)
{
    struct ifx t;
    ifx_setup(&t, true, 16, 16);
    ifx_take(&t, 0, 3);
    ifx_crash_restart(&t);
    VHD_CHECK_EQ(vhd_vq_resubmit_pending(&t.f.vq), 3);
    struct vhd_inflight_packed *p = t.region;
    uint16_t first = t.f.vq.inf_resubmit[0];
    VHD_CHECK_EQ(p->desc[first].num, 2);
    p->desc[first].num = 1;
    struct iovec iov[4];
    struct vhd_vq_chain c;
    VHD_CHECK_EQ(vhd_vq_pop(&t.f.vq, iov, 4, &c), -VHD_VQ_E_INFLIGHT);
    VHD_CHECK_EQ(t.f.vq.error, VHD_VQ_E_INFLIGHT);
    ifx_teardown(&t);
}

/* =====================================================================
 * Tracked packed runs against the per-chain verbs
 * ===================================================================== */

/*
 * Two plays of one random script in lock step on two fixtures laid out
 * alike, packed and tracked: one pops and pushes with vhd_vq_pop /
 * vhd_vq_push, the other with vhd_vq_pop_burst / vhd_vq_push_burst (the
 * run walk records each chain it takes; the push of a run gives records
 * back in one pass). Chains of 1..4 descriptors (some indirect) in a small
 * ring, so runs cross the ring's end and chains straddle it; now and then a
 * descriptor's id or flags go wrong (a bad chain mid-run), the queue breaks,
 * and the back-end crashes and restarts on the same area, so runs are also
 * taken with chains to pop again listed. After every step: the same chains
 * (ids, shapes, segments), the same errors, and byte for byte the same ring
 * area and inflight area, and the same queue state.
 */
#define RD_BUF 4096u

struct rd_play {
    struct vqfx f;
    void *region;
    size_t region_len;
    uint64_t buf;                     /* RD_BUF bytes of buffers */
    struct vhd_vq_chain held[MAXREQ]; /* popped, not pushed */
    uint32_t n;
};

static void rd_setup(struct rd_play *p, uint32_t size)
{
    struct vqfx_opts o = {
        .size = size, .packed = true, .indirect = true, .max_indirect = 4, .no_start = true};
    memset(p, 0, sizeof(*p));
    vqfx_setup(&p->f, &o);
    p->region_len = vhd_inflight_queue_size(true, size);
    p->region = aligned_alloc(64, (p->region_len + 63) & ~(size_t)63);
    VHD_CHECK(p->region != NULL);
    memset(p->region, 0, p->region_len);
    p->buf = vqfx_alloc(&p->f, RD_BUF, NULL);
    VHD_CHECK_EQ(vhd_vq_set_base(&p->f.vq, 1u << 15 | 1u << 31), 0);
    VHD_CHECK_EQ(vhd_vq_set_inflight(&p->f.vq, p->region, size), 0);
    VHD_CHECK_EQ(vhd_vq_start(&p->f.vq), 0);
}

/* Crash and restart with the base of the first start (what QEMU sends): 0 or -err. */
static int rd_restart(struct rd_play *p)
{
    vhd_vq_fini(&p->f.vq);
    p->n = 0;
    VHD_CHECK_EQ(vhd_vq_init(&p->f.vq, &p->f.params, p->f.mem), 0);
    VHD_CHECK_EQ(vhd_vq_set_base(&p->f.vq, 1u << 15 | 1u << 31), 0);
    VHD_CHECK_EQ(vhd_vq_set_inflight(&p->f.vq, p->region, p->f.o.size), 0);
    return vhd_vq_start(&p->f.vq);
}

/* Pop up to m chains (one run after another for the batch play): got, and rc of the last call. */
static uint32_t rd_pop(struct rd_play *p, bool batch, uint32_t m, struct iovec *iov, int *rc)
{
    uint32_t got = 0;
    *rc = 0;
    while (got < m && p->n < MAXREQ) {
        uint32_t want = m - got < MAXREQ - p->n ? m - got : MAXREQ - p->n;
        *rc = batch ? vhd_vq_pop_burst(&p->f.vq, iov + (size_t)got * 4, 4, &p->held[p->n], want)
                    : vhd_vq_pop(&p->f.vq, iov + (size_t)got * 4, 4, &p->held[p->n]);
        if (*rc <= 0)
            break;
        p->n += (uint32_t)*rc;
        got += (uint32_t)*rc;
    }
    return got;
}

static void rd_same(struct rd_play *a, struct rd_play *b)
{
    VHD_CHECK(memcmp(a->region, b->region, a->region_len) == 0);
    VHD_CHECK(memcmp(a->f.area, b->f.area, a->f.area_len) == 0);
    const struct vhd_vq *x = &a->f.vq, *y = &b->f.vq;
    VHD_CHECK_EQ(x->error, y->error);
    VHD_CHECK_EQ(x->last_avail_idx, y->last_avail_idx);
    VHD_CHECK_EQ(x->avail_wrap, y->avail_wrap);
    VHD_CHECK_EQ(x->used_idx, y->used_idx);
    VHD_CHECK_EQ(x->used_wrap, y->used_wrap);
    VHD_CHECK_EQ(x->inflight, y->inflight);
    VHD_CHECK_EQ(x->batch_npending, y->batch_npending);
    VHD_CHECK_EQ(x->inf_counter, y->inf_counter);
    VHD_CHECK_EQ(x->inf_new, y->inf_new);
    VHD_CHECK_EQ(x->inf_resubmit_pos, y->inf_resubmit_pos);
    VHD_CHECK_EQ(a->n, b->n);
}

static void run_vs_single(uint32_t size, uint64_t seed, uint32_t *nruns, uint32_t *nresub)
{
    static struct rd_play a, b;
    static struct iovec iova[MAXREQ * 4], iovb[MAXREQ * 4];
    rd_setup(&a, size);
    rd_setup(&b, size);
    rs = seed;

    for (int step = 0; step < 3000; step++) {
        uint32_t op = rnd32() % 100;
        if (op < 30) {
            /* The driver adds chains (the same on both), then publishes. */
            for (uint32_t k = 1 + rnd32() % 4; k > 0; k--) {
                uint32_t nr = rnd32() % 3, nw = rnd32() % 3, ind = rnd32() % 4 == 0;
                if (nr + nw == 0)
                    nr = 1;
                struct vhd_drv_buf bufs[4];
                for (uint32_t i = 0; i < nr + nw; i++) {
                    bufs[i].len = 1 + rnd32() % 64;
                    bufs[i].gpa = a.buf + rnd32() % (RD_BUF - 64);
                }
                int ra = vhd_drv_vq_add(&a.f.dq, bufs, nr, nw, ind, (void *)1);
                int rb = vhd_drv_vq_add(&b.f.dq, bufs, nr, nw, ind, (void *)1);
                VHD_CHECK_EQ(ra, rb);
            }
            vhd_drv_vq_publish(&a.f.dq);
            vhd_drv_vq_publish(&b.f.dq);
        } else if (op < 31) {
            /* A descriptor's id or flags goes wrong (a bad chain, maybe mid-run). */
            uint32_t slot = rnd32() % size, v = rnd32();
            struct vhd_vring_packed_desc *da = &a.f.dq.ring.packed.desc[slot];
            struct vhd_vring_packed_desc *db = &b.f.dq.ring.packed.desc[slot];
            if (v & 1) {
                da->id = db->id = vhd_le16((uint16_t)(size + (v >> 8) % 4));
            } else {
                uint16_t fl = (uint16_t)((vhd_le16(da->flags) & ~7u) | ((v >> 8) & 7));
                da->flags = db->flags = vhd_le16(fl);
            }
        } else if (op < 58) {
            uint32_t m = 1 + rnd32() % 24;
            bool listed = b.f.vq.inf_resubmit_n != 0;
            int rca, rcb;
            uint32_t ga = rd_pop(&a, false, m, iova, &rca);
            uint32_t gb = rd_pop(&b, true, m, iovb, &rcb);
            VHD_CHECK_EQ(ga, gb);
            VHD_CHECK_EQ(rca > 0 ? 1 : rca, rcb > 0 ? 1 : rcb); /* the error, or none */
            *nruns += gb > 1;
            const uint8_t *ha = a.f.mem->regions[0].hva, *hb = b.f.mem->regions[0].hva;
            for (uint32_t i = 0; i < ga; i++) {
                const struct vhd_vq_chain *ca = &a.held[a.n - ga + i], *cb = &b.held[b.n - gb + i];
                VHD_CHECK(memcmp(ca, cb, sizeof(*ca)) == 0);
                for (uint32_t s = 0; s < (uint32_t)ca->nr + ca->nw; s++) {
                    VHD_CHECK_EQ((const uint8_t *)iova[4 * i + s].iov_base - ha,
                                 (const uint8_t *)iovb[4 * i + s].iov_base - hb);
                    VHD_CHECK_EQ(iova[4 * i + s].iov_len, iovb[4 * i + s].iov_len);
                }
            }
            *nresub += listed && gb > 1;
        } else if (op < 80) {
            /* Push p held chains from a random one on (wrapping), as one run or one by one. */
            uint32_t p = a.n ? 1 + rnd32() % a.n : 0, from = a.n ? rnd32() % a.n : 0;
            struct vhd_vq_chain sel[MAXREQ];
            uint32_t written[MAXREQ];
            for (uint32_t i = 0; i < p; i++) {
                sel[i] = a.held[(from + i) % a.n];
                written[i] = rnd32() % 3;
            }
            int ra = 0, rb = p ? vhd_vq_push_burst(&b.f.vq, sel, written, p) : 0;
            for (uint32_t i = 0; i < p && ra == 0; i++)
                ra = vhd_vq_push(&a.f.vq, &sel[i], written[i]);
            VHD_CHECK_EQ(ra, rb);
            /* Both forget the chains pushed (from `from` on, wrapping). */
            struct rd_play *pl[2] = {&a, &b};
            for (int w = 0; w < 2; w++) {
                struct vhd_vq_chain keep[MAXREQ];
                uint32_t nk = 0;
                for (uint32_t i = 0; i < pl[w]->n; i++)
                    if ((i + pl[w]->n - from) % pl[w]->n >= p)
                        keep[nk++] = pl[w]->held[i];
                memcpy(pl[w]->held, keep, nk * sizeof(keep[0]));
                pl[w]->n = nk;
            }
        } else if (op < 90) {
            vhd_vq_flush(&a.f.vq);
            vhd_vq_flush(&b.f.vq);
            VHD_CHECK_EQ(vhd_vq_need_notify(&a.f.vq), vhd_vq_need_notify(&b.f.vq));
        } else if (op < 97) {
            void *ck;
            uint32_t la, lb;
            int ra, rb;
            do {
                ra = vhd_drv_vq_get_used(&a.f.dq, &ck, &la);
                rb = vhd_drv_vq_get_used(&b.f.dq, &ck, &lb);
                VHD_CHECK_EQ(ra, rb);
                if (ra == 1)
                    VHD_CHECK_EQ(la, lb);
            } while (ra == 1);
        } else {
            VHD_CHECK_EQ(rd_restart(&a), rd_restart(&b));
            VHD_CHECK_EQ(vhd_vq_resubmit_pending(&a.f.vq), vhd_vq_resubmit_pending(&b.f.vq));
        }
        rd_same(&a, &b);
    }
    struct rd_play *pl[2] = {&a, &b};
    for (int w = 0; w < 2; w++) {
        vhd_vq_fini(&pl[w]->f.vq);
        free(pl[w]->region);
        vqfx_teardown(&pl[w]->f);
    }
}

VHD_TEST(run_vs_single_tracked_packed)
{
    uint32_t nruns = 0, nresub = 0;
    static const uint32_t sizes[] = {5, 8, 13, 32};
    for (uint64_t seed = 1; seed <= 8; seed++)
        run_vs_single(sizes[seed % 4], seed * 0x9E3779B97F4A7C15ull, &nruns, &nresub);

    /* The script must have exercised what it is about. */
    VHD_CHECK(nruns > 100);
    VHD_CHECK(nresub > 10);
}
