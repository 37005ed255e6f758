/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Chaos cases in the rings (vu_chaos.h): malformed descriptor chains and
 * device requests written straight into a started ring — split and packed,
 * direct and indirect, virtio-blk and virtio-net — plus well-formed controls
 * that must be served, so that the detection itself is tested.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/compiler.h"
#include "core/inflight.h"
#include "spec/virtio_blk.h"
#include "spec/virtio_net.h"
#include "vhostd/blk_driver.h"
#include "vu_chaos_int.h"

/* ======================= cases: descriptor chains (blk) ======================= */

/* An IN request [hdr][4 KiB data][status] as descriptors 0..2; the control case. */
static void std_in(struct vhd_chaos_sess *s)
{
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    vhd_chaos__allow(s, OFF_STAT, 1);
    vhd_chaos__allow(s, OFF_DATA, 4096);
}

static int chain_case(struct vhd_chaos_ctx *ctx, bool packed, bool indirect,
                      void (*build)(struct vhd_chaos_sess *s))
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, packed, indirect);
    if (!rc) {
        build(&s);
        rc = vhd_chaos__blk_go(&s);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A struct vhd_chaos_pd (split_chain, packed_publish): a buffer at window-0 offset off. */
#define GDESC(off, len, flags)                      \
    {                                               \
        vhd_chaos__gpa(s, (off)), (len), 0, (flags) \
    }

/*
 * d[0..n) as descriptors 0..n-1 of ring 0, each linked to the one after it
 * (the last to 0; the flags say whether the link counts), published as
 * head 0 at avail index 1. The ids are not used.
 */
static void split_chain(struct vhd_chaos_sess *s, const struct vhd_chaos_pd *d, uint16_t n)
{
    for (uint16_t i = 0; i < n; i++)
        vhd_chaos__sdesc(s, OFF_R0, i, d[i].addr, d[i].len, d[i].flags,
                         (uint16_t)(i + 1 < n ? i + 1 : 0));
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
}

static void b_control(struct vhd_chaos_sess *s)
{
    std_in(s);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     GDESC(OFF_DATA, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE),
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

static void b_loop(struct vhd_chaos_sess *s)
{
    std_in(s);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     GDESC(OFF_DATA, 512, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE)};
    split_chain(s, d, 2);
}

static void b_longer_than_queue(struct vhd_chaos_sess *s)
{
    std_in(s);
    vhd_chaos__sdesc(s, OFF_R0, 0, vhd_chaos__gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    for (uint16_t i = 1; i < QSZ; i++) /* the last links back to 1: QSZ + more */
        vhd_chaos__sdesc(s, OFF_R0, i, vhd_chaos__gpa(s, OFF_DATA) + 512u * i, 512,
                         VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, (unsigned)i + 1 < QSZ ? i + 1 : 1);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
}

static void b_head_oob(struct vhd_chaos_sess *s)
{
    std_in(s);
    vhd_chaos__split_publish(s, OFF_R0, 100, 1);
}

static void b_next_oob(struct vhd_chaos_sess *s)
{
    std_in(s);
    vhd_chaos__sdesc(s, OFF_R0, 0, vhd_chaos__gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 50);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
}

static void b_avail_jump(struct vhd_chaos_sess *s)
{
    b_control(s);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1 + 3 * QSZ); /* avail->idx more than a ring ahead */
}

static void b_addr_outside(struct vhd_chaos_sess *s)
{
    std_in(s);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     {0x1000, 4096, 0, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE},
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

/* A data buffer running past the end of guest memory (window 1's end). */
static void b_addr_past_end(struct vhd_chaos_sess *s)
{
    std_in(s);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     {s->m->win[1].gpa + VHD_CHAOS_WIN_SIZE - 512, 4096, 0,
                                      VRING_DESC_F_NEXT | VRING_DESC_F_WRITE},
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

static void b_len_wraps(struct vhd_chaos_sess *s)
{
    std_in(s);
    const struct vhd_chaos_pd d[] = {
        GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
        {UINT64_MAX - 255, 4096, 0, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE},
        GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

/* Readable after writable. */
static void b_write_before_read(struct vhd_chaos_sess *s)
{
    std_in(s);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_DATA, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE),
                                     GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

/* The status byte in a device-readable buffer: nothing may write it. */
static void b_status_readonly(struct vhd_chaos_sess *s)
{
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     GDESC(OFF_DATA, 4096, VRING_DESC_F_NEXT),
                                     GDESC(OFF_STAT, 1, 0)};
    split_chain(s, d, 3);
}

/* An 8-byte request header. */
static void b_hdr_short(struct vhd_chaos_sess *s)
{
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    vhd_chaos__allow(s, OFF_STAT, 1);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 8, VRING_DESC_F_NEXT),
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 2);
}

/* A zero-length header descriptor (and a zero-length data one). */
static void b_zero_len(struct vhd_chaos_sess *s)
{
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    vhd_chaos__allow(s, OFF_STAT, 1);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 0, VRING_DESC_F_NEXT),
                                     GDESC(OFF_DATA, 0, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE),
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

/* A read beyond the device's capacity (sector 2^60). */
static void b_sector_oob(struct vhd_chaos_sess *s)
{
    b_control(s);
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 1ull << 60);
}

/* A read of 100 bytes: not a multiple of the sector size. */
static void b_len_unaligned(struct vhd_chaos_sess *s)
{
    b_control(s);
    vhd_chaos__sdesc(s, OFF_R0, 1, vhd_chaos__gpa(s, OFF_DATA), 100,
                     VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
}

static void b_bad_type(struct vhd_chaos_sess *s)
{
    b_control(s);
    vhd_chaos__blk_hdr(s, 0, 0x7777, 0);
}

/* Indirect table entry i at table t (OFF_IND + 0x400 t). */
static void idesc(struct vhd_chaos_sess *s, unsigned t, uint16_t i, uint64_t addr, uint32_t len,
                  uint16_t flags, uint16_t next)
{
    vhd_chaos__sdesc(s, OFF_IND + 0x400u * t, i, addr, len, flags, next);
}

static void ind_std(struct vhd_chaos_sess *s)
{
    std_in(s);
    idesc(s, 0, 0, vhd_chaos__gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    idesc(s, 0, 1, vhd_chaos__gpa(s, OFF_DATA), 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
    idesc(s, 0, 2, vhd_chaos__gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
}

static void b_ind_control(struct vhd_chaos_sess *s)
{
    ind_std(s);
    vhd_chaos__sdesc(s, OFF_R0, 0, vhd_chaos__gpa(s, OFF_IND), 48, VRING_DESC_F_INDIRECT, 0);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
}

static void b_ind_nested(struct vhd_chaos_sess *s)
{
    ind_std(s);
    idesc(s, 0, 1, vhd_chaos__gpa(s, OFF_IND + 0x400), 48,
          VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT, 2);
    idesc(s, 1, 0, vhd_chaos__gpa(s, OFF_DATA), 4096, VRING_DESC_F_WRITE, 0);
    vhd_chaos__sdesc(s, OFF_R0, 0, vhd_chaos__gpa(s, OFF_IND), 48, VRING_DESC_F_INDIRECT, 0);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
}

static void b_ind_with_next(struct vhd_chaos_sess *s)
{
    ind_std(s);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_IND, 48, VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT),
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 2);
}

static void b_ind_loop(struct vhd_chaos_sess *s)
{
    ind_std(s);
    idesc(s, 0, 2, vhd_chaos__gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 1);
    vhd_chaos__sdesc(s, OFF_R0, 0, vhd_chaos__gpa(s, OFF_IND), 48, VRING_DESC_F_INDIRECT, 0);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
}

static void b_ind_len_bad(struct vhd_chaos_sess *s)
{
    ind_std(s);
    vhd_chaos__sdesc(s, OFF_R0, 0, vhd_chaos__gpa(s, OFF_IND), 47, VRING_DESC_F_INDIRECT, 0);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
}

static void b_ind_outside(struct vhd_chaos_sess *s)
{
    ind_std(s);
    vhd_chaos__sdesc(s, OFF_R0, 0, 0x2000, 48, VRING_DESC_F_INDIRECT, 0);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
}

VHD_CHAOS_VARIANT(c_control, chain_case, false, false, b_control)
VHD_CHAOS_VARIANT(c_loop, chain_case, false, false, b_loop)
VHD_CHAOS_VARIANT(c_longer_than_queue, chain_case, false, false, b_longer_than_queue)
VHD_CHAOS_VARIANT(c_head_oob, chain_case, false, false, b_head_oob)
VHD_CHAOS_VARIANT(c_next_oob, chain_case, false, false, b_next_oob)
VHD_CHAOS_VARIANT(c_avail_jump, chain_case, false, false, b_avail_jump)
VHD_CHAOS_VARIANT(c_addr_outside, chain_case, false, false, b_addr_outside)
VHD_CHAOS_VARIANT(c_addr_past_end, chain_case, false, false, b_addr_past_end)
VHD_CHAOS_VARIANT(c_len_wraps, chain_case, false, false, b_len_wraps)
VHD_CHAOS_VARIANT(c_write_before_read, chain_case, false, false, b_write_before_read)
VHD_CHAOS_VARIANT(c_status_readonly, chain_case, false, false, b_status_readonly)
VHD_CHAOS_VARIANT(c_hdr_short, chain_case, false, false, b_hdr_short)
VHD_CHAOS_VARIANT(c_zero_len, chain_case, false, false, b_zero_len)
VHD_CHAOS_VARIANT(c_sector_oob, chain_case, false, false, b_sector_oob)
VHD_CHAOS_VARIANT(c_len_unaligned, chain_case, false, false, b_len_unaligned)
VHD_CHAOS_VARIANT(c_bad_type, chain_case, false, false, b_bad_type)
VHD_CHAOS_VARIANT(c_ind_control, chain_case, false, true, b_ind_control)
VHD_CHAOS_VARIANT(c_ind_nested, chain_case, false, true, b_ind_nested)
VHD_CHAOS_VARIANT(c_ind_with_next, chain_case, false, true, b_ind_with_next)
VHD_CHAOS_VARIANT(c_ind_loop, chain_case, false, true, b_ind_loop)
VHD_CHAOS_VARIANT(c_ind_len_bad, chain_case, false, true, b_ind_len_bad)
VHD_CHAOS_VARIANT(c_ind_outside, chain_case, false, true, b_ind_outside)
VHD_CHAOS_VARIANT(c_ind_not_negotiated, chain_case, false, false, b_ind_control)

/* ---- more blk requests ---- */

/* An IN request whose data buffer is device-readable: nothing may be written into it. */
static void b_in_readonly_data(struct vhd_chaos_sess *s)
{
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    vhd_chaos__allow(s, OFF_STAT, 1);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     GDESC(OFF_DATA, 4096, VRING_DESC_F_NEXT),
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

/* An OUT request whose data buffer is device-writable (no data to write at all). */
static void b_out_writable_data(struct vhd_chaos_sess *s)
{
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_OUT, 8);
    vhd_chaos__allow(s, OFF_STAT, 1);
    vhd_chaos__allow(s, OFF_DATA, 4096);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     GDESC(OFF_DATA, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE),
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

/* GET_ID into a 4-byte buffer: at most those 4 bytes (and the status) are written. */
static void b_get_id_short(struct vhd_chaos_sess *s)
{
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_GET_ID, 0);
    vhd_chaos__allow(s, OFF_STAT, 1);
    vhd_chaos__allow(s, OFF_DATA, 4);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     GDESC(OFF_DATA, 4, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE),
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

/* A read of 250 segments of 512 bytes through an indirect table (more than seg_max). */
static void b_many_segments(struct vhd_chaos_sess *s)
{
    enum { NSEG = 250 };
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 0);
    vhd_chaos__allow(s, OFF_STAT, 1);
    vhd_chaos__allow(s, OFF_DATA, NSEG * 512u);
    vhd_chaos__sdesc(s, OFF_IND, 0, vhd_chaos__gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    for (uint16_t i = 1; i <= NSEG; i++)
        vhd_chaos__sdesc(s, OFF_IND, i, vhd_chaos__gpa(s, OFF_DATA) + 512u * (i - 1u), 512,
                         VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, (uint16_t)(i + 1));
    vhd_chaos__sdesc(s, OFF_IND, NSEG + 1, vhd_chaos__gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    vhd_chaos__sdesc(s, OFF_R0, 0, vhd_chaos__gpa(s, OFF_IND), 16u * (NSEG + 2),
                     VRING_DESC_F_INDIRECT, 0);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
}

VHD_CHAOS_VARIANT(c_in_readonly_data, chain_case, false, false, b_in_readonly_data)
VHD_CHAOS_VARIANT(c_out_writable_data, chain_case, false, false, b_out_writable_data)
VHD_CHAOS_VARIANT(c_get_id_short, chain_case, false, false, b_get_id_short)
VHD_CHAOS_VARIANT(c_many_segments, chain_case, false, true, b_many_segments)

/* The ring starts at avail index 1000 while the driver's avail->idx says 1. */
static int c_base_ahead(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(KICK));
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_BASE, 0, 1000),
                             "SET_VRING_BASE");
    if (!rc)
        rc = vhd_chaos__must(&s,
                             vhd_chaos__set_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, s.kick[0]),
                             "SET_VRING_KICK");
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 1),
                             "SET_VRING_ENABLE");
    if (!rc) {
        b_control(&s);
        rc = vhd_chaos__blk_go(&s);
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * One 8 KiB buffer across the boundary of the two regions (adjacent in
 * guest-physical space, apart in ours): written from it, read back into
 * one ordinary buffer, compared.
 */
static int c_crosses_regions(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (rc) {
        vhd_chaos__close(&s);
        return rc;
    }
    const size_t lo = VHD_CHAOS_WIN_SIZE - 4096, hi = VHD_CHAOS_WIN_SIZE; /* the two halves */
    uint8_t *a = vhd_chaos__hva(&s, lo), *b = vhd_chaos__hva(&s, hi),
            *r = vhd_chaos__hva(&s, OFF_DATA);
    for (unsigned i = 0; i < 4096; i++) {
        a[i] = (uint8_t)(i * 5 + 1);
        b[i] = (uint8_t)(i * 11 + 7);
    }
    vhd_chaos__mirror(&s, lo, 4096);
    vhd_chaos__mirror(&s, hi, 4096);
    vhd_chaos__blk_hdr(&s, 0, VIRTIO_BLK_T_OUT, 128);
    vhd_chaos__blk_hdr(&s, 1, VIRTIO_BLK_T_IN, 128);
    vhd_chaos__allow(&s, OFF_STAT, 65);
    vhd_chaos__allow(&s, OFF_DATA, 8192);
    vhd_chaos__sdesc(&s, OFF_R0, 0, vhd_chaos__gpa(&s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    vhd_chaos__sdesc(&s, OFF_R0, 1, vhd_chaos__gpa(&s, lo), 8192, VRING_DESC_F_NEXT, 2);
    vhd_chaos__sdesc(&s, OFF_R0, 2, vhd_chaos__gpa(&s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    vhd_chaos__sdesc(&s, OFF_R0, 3, vhd_chaos__gpa(&s, OFF_HDR + 64), 16, VRING_DESC_F_NEXT, 4);
    vhd_chaos__sdesc(&s, OFF_R0, 4, vhd_chaos__gpa(&s, OFF_DATA), 8192,
                     VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 5);
    vhd_chaos__sdesc(&s, OFF_R0, 5, vhd_chaos__gpa(&s, OFF_STAT + 64), 1, VRING_DESC_F_WRITE, 0);
    struct vhd_chaos_used u0, u1;
    vhd_chaos__split_publish(&s, OFF_R0, 0, 1);
    vhd_chaos__kick(&s, 0);
    rc = vhd_chaos__await_used(&s, OFF_R0, 0, &u0, s.tmo);
    if (!rc && u0.got) {
        vhd_chaos__split_publish(&s, OFF_R0, 3, 2);
        vhd_chaos__kick(&s, 0);
        rc = vhd_chaos__await_used(&s, OFF_R0, 1, &u1, s.tmo);
        bool same = memcmp(r, a, 4096) == 0 && memcmp(r + 4096, b, 4096) == 0;
        if (!rc && u1.got && vhd_chaos__blk_status(&s, 0) == 0 &&
            vhd_chaos__blk_status(&s, 1) == 0 && same)
            ctx->observed |= VHD_CHAOS_SERVED;
        else if (!rc)
            vhd_chaos__note(&s, 0, "status %u/%u, data %s", vhd_chaos__blk_status(&s, 0),
                            vhd_chaos__blk_status(&s, 1), same ? "same" : "differs");
    } else if (!rc) {
        vhd_chaos__note(&s, 0, "write not completed");
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * Region 1 at the top of the guest-physical space (it ends 4 KiB below
 * 2^64): a read into its last 4 KiB must be served; a buffer that runs past
 * its end (where the next byte is 2^64 - 4096, in no region) must break the
 * queue, never wrap to guest address 0.
 */
static int gpa_top(struct vhd_chaos_ctx *ctx, uint64_t back, uint32_t len)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(MEM));
    if (!rc) {
        struct vu_mem_region r[2] = {vhd_chaos__win_region(&s, 0), vhd_chaos__win_region(&s, 1)};
        r[1].gpa = 0ull - 4096 - VHD_CHAOS_WIN_SIZE;
        s.r1_gpa = r[1].gpa;
        int fds[2] = {s.m->fd, s.m->fd};
        rc = vhd_chaos__must(&s, vhd_chaos__mem_table(&s, r, 2, fds, 2), "SET_MEM_TABLE (top)");
    }
    if (!rc)
        rc = vhd_chaos__ring_start(&s, 0, OFF_R0);
    if (!rc) {
        const size_t end = 2u * VHD_CHAOS_WIN_SIZE; /* offset just past window 1 */
        vhd_chaos__blk_hdr(&s, 0, VIRTIO_BLK_T_IN, 8);
        vhd_chaos__allow(&s, OFF_STAT, 1);
        vhd_chaos__allow(&s, end - back, back < len ? back : len);
        vhd_chaos__sdesc(&s, OFF_R0, 0, vhd_chaos__gpa(&s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
        vhd_chaos__sdesc(&s, OFF_R0, 1, s.r1_gpa + VHD_CHAOS_WIN_SIZE - back, len,
                         VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
        vhd_chaos__sdesc(&s, OFF_R0, 2, vhd_chaos__gpa(&s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
        vhd_chaos__split_publish(&s, OFF_R0, 0, 1);
        rc = vhd_chaos__blk_go(&s);
    }
    vhd_chaos__close(&s);
    return rc;
}

VHD_CHAOS_VARIANT(c_gpa_top, gpa_top, 4096, 4096)
VHD_CHAOS_VARIANT(c_gpa_top_past_end, gpa_top, 2048, 8192)

/* ---- inflight I/O tracking (INFLIGHT_SHMFD) ---- */

/* Our mapping of the inflight area, kept while the back-end runs (the rewriting cases). */
struct inflight_map {
    void *p;
    size_t len;
};

/*
 * A blk session with an inflight area for ring 0: negotiated, asked for
 * (GET_INFLIGHT_FD), handed to scribble() when given, and given back
 * (SET_INFLIGHT_FD); then ring 0 is prepared (not started: the case starts
 * it, as the start is where the area is read). With keep, the mapping
 * scribble() wrote through stays, and the caller unmaps it.
 */
static int inflight_session(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, bool packed,
                            void (*scribble)(void *area, size_t len, bool packed),
                            struct inflight_map *keep)
{
    int rc = vhd_chaos__steps(
        ctx, s, UPTO(FEATURES, .proto = WANT_PROTO | BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)));
    if (!rc && !(s->proto & BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)))
        rc = vhd_chaos__note(s, -ENOTSUP, "INFLIGHT_SHMFD not offered");
    if (!rc)
        rc = vhd_chaos__must(
            s,
            vhd_chaos__set_features(s, BIT(VIRTIO_F_VERSION_1) |
                                           (packed ? BIT(VIRTIO_F_RING_PACKED) : 0)),
            "SET_FEATURES");
    if (!rc)
        rc = vhd_chaos__must(s, vhd_chaos__mem_default(s), "SET_MEM_TABLE");
    struct vu_inflight in = {.num_queues = 1, .queue_size = QSZ}, out;
    int fd = -1;
    if (!rc) {
        struct vu_hdr h;
        union vu_payload p;
        rc = vhd_chaos__must(
            s, vhd_chaos__call_fd(s, VHOST_USER_GET_INFLIGHT_FD, &in, sizeof(in), &h, &p, &fd),
            "GET_INFLIGHT_FD");
        out = p.inflight;
        if (!rc && (h.size != sizeof(out) || out.mmap_size == 0 || fd < 0))
            rc = vhd_chaos__note(s, -EPROTO, "GET_INFLIGHT_FD: %u bytes, area %llu, fd %d", h.size,
                                 (unsigned long long)out.mmap_size, fd);
    }
    if (!rc && scribble) {
        void *a = mmap(NULL, out.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                       (off_t)out.mmap_offset);
        if (a == MAP_FAILED) {
            rc = vhd_chaos__note(s, -errno, "mmap of the inflight area: %s", strerror(errno));
        } else {
            scribble(a, out.mmap_size, packed);
            if (keep) {
                keep->p = a;
                keep->len = out.mmap_size;
            } else {
                munmap(a, out.mmap_size);
            }
        }
    }
    if (!rc)
        rc = vhd_chaos__must(
            s, vhd_chaos__ack(s, VHOST_USER_SET_INFLIGHT_FD, &out, sizeof(out), &fd, 1),
            "SET_INFLIGHT_FD");
    if (fd >= 0)
        close(fd);
    if (!rc)
        rc = vhd_chaos__ring_prepare(s, 0, OFF_R0);
    return rc;
}

/* Start ring 0 (prepared) and enable it; the start's answer is an outcome. */
static int inflight_start(struct vhd_chaos_sess *s)
{
    int rc = vhd_chaos__observe(
        s, vhd_chaos__set_vring_fd(s, VHOST_USER_SET_VRING_KICK, 0, s->kick[0]), "ring start");
    if (!rc && !(s->ctx->observed & VHD_CHAOS_NACK))
        rc = vhd_chaos__observe(s, vhd_chaos__set_state(s, VHOST_USER_SET_VRING_ENABLE, 0, 1),
                                "enable");
    return rc;
}

/* An untouched area, then an ordinary request: served. */
static int c_inflight_control(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = inflight_session(ctx, &s, false, NULL, NULL);
    if (!rc)
        rc = inflight_start(&s);
    if (!rc) {
        ctx->observed = 0; /* the start being accepted is not the outcome here */
        b_control(&s);
        rc = vhd_chaos__blk_go(&s);
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * Every record of the area claims a chain in flight, with out-of-range
 * links, counters, heads, ids, lengths and addresses; the header keeps a
 * valid version and size so that the records themselves are read. The
 * descriptor table behind them is all zeroes.
 */
static void scribble_records(void *area, size_t len, bool packed)
{
    if (packed) {
        struct vhd_inflight_packed *r = area;
        r->version = VHD_INFLIGHT_VERSION;
        r->desc_num = QSZ;
        r->free_head = r->old_free_head = 0xfffe;
        r->used_idx = r->old_used_idx = 0x9999;
        r->used_wrap_counter = r->old_used_wrap_counter = 7;
        for (unsigned i = 0; i < QSZ; i++) {
            struct vhd_inflight_packed_desc *d = &r->desc[i];
            d->inflight = 1;
            d->next = (uint16_t)(0xfff0 + i);
            d->last = 0xffff;
            d->num = 0x7fff;
            d->counter = ~0ull - i;
            d->id = 0xffff;
            d->flags = 0xffff;
            d->len = 0xffffffffu;
            d->addr = ~0ull - 3;
        }
    } else {
        struct vhd_inflight_split *r = area;
        r->version = VHD_INFLIGHT_VERSION;
        r->desc_num = QSZ;
        r->last_batch_head = 0xfff0;
        r->used_idx = 0x7777;
        for (unsigned i = 0; i < QSZ; i++) {
            r->desc[i].inflight = (uint8_t)(i + 1);
            r->desc[i].next = 0xffff;
            r->desc[i].counter = i & 1 ? ~0ull : 0;
        }
    }
    (void)len;
}

/* All bytes 0xff: version, sizes, everything. */
static void scribble_all(void *area, size_t len, bool packed)
{
    (void)packed;
    memset(area, 0xff, len);
}

static int inflight_garbage(struct vhd_chaos_ctx *ctx, bool packed,
                            void (*scribble)(void *area, size_t len, bool packed))
{
    struct vhd_chaos_sess s;
    int rc = inflight_session(ctx, &s, packed, scribble, NULL);
    if (!rc)
        rc = inflight_start(&s);
    if (!rc) {
        /* The back-end may take the claimed chains at once: give it a kick and a moment. */
        vhd_chaos__kick(&s, 0);
        struct vhd_chaos_used u;
        rc = vhd_chaos__await_used(&s, OFF_R0, 0, &u, 300);
        if (!rc && u.got)
            vhd_chaos__note(&s, 0, "a used element for head %u (len %u)", u.id, u.len);
    }
    vhd_chaos__close(&s);
    return rc;
}

VHD_CHAOS_VARIANT(c_inflight_records, inflight_garbage, false, scribble_records)
VHD_CHAOS_VARIANT(c_inflight_all_ff, inflight_garbage, false, scribble_all)
VHD_CHAOS_VARIANT(c_p_inflight_records, inflight_garbage, true, scribble_records)
VHD_CHAOS_VARIANT(c_p_inflight_all_ff, inflight_garbage, true, scribble_all)

/*
 * A consistent area with one chain in flight (head 0, popped before a
 * "restart": the ring base is 1); the back-end must submit it again when
 * the ring starts. What the chain is, is the case's.
 */
static void scribble_one(void *area, size_t len, bool packed)
{
    struct vhd_inflight_split *r = area;
    (void)len;
    (void)packed;
    r->version = VHD_INFLIGHT_VERSION;
    r->desc_num = QSZ;
    r->desc[0].inflight = 1;
    r->desc[0].counter = 1;
}

static int inflight_resubmit(struct vhd_chaos_ctx *ctx, void (*build)(struct vhd_chaos_sess *s))
{
    struct vhd_chaos_sess s;
    int rc = inflight_session(ctx, &s, false, scribble_one, NULL);
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_BASE, 0, 1),
                             "SET_VRING_BASE 1");
    if (!rc) {
        build(&s); /* head 0, published at avail index 0: already taken per the base */
        rc = inflight_start(&s);
    }
    if (!rc && !(ctx->observed & VHD_CHAOS_NACK)) {
        ctx->observed &= ~(unsigned)VHD_CHAOS_NACK;
        struct vhd_chaos_used u;
        rc = vhd_chaos__await_used(&s, OFF_R0, 0, &u, s.tmo);
        if (!rc)
            vhd_chaos__blk_classify(&s, &u, 0);
    }
    vhd_chaos__close(&s);
    return rc;
}

VHD_CHAOS_VARIANT(c_inflight_resubmit, inflight_resubmit, b_control)
VHD_CHAOS_VARIANT(c_inflight_resubmit_loop, inflight_resubmit, b_loop)
VHD_CHAOS_VARIANT(c_inflight_resubmit_outside, inflight_resubmit, b_addr_outside)

/* An IN request whose data buffer is the descriptor table itself (4 KiB over it). */
static void b_data_over_desc(struct vhd_chaos_sess *s)
{
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    vhd_chaos__allow(s, OFF_STAT, 1);
    vhd_chaos__allow(s, OFF_R0, 4096);
    const struct vhd_chaos_pd d[] = {GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT),
                                     GDESC(OFF_R0, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE),
                                     GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE)};
    split_chain(s, d, 3);
}

VHD_CHAOS_VARIANT(c_data_over_desc, chain_case, false, false, b_data_over_desc)

/* The available and used rings at the same address: the device's used writes land in avail. */
static int c_rings_alias(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(ADDR));
    if (!rc) {
        vhd_chaos__allow(&s, OFF_R0 + RING_AVAIL, 64);
        int a = vhd_chaos__set_addr(&s, 0, vhd_chaos__uva(&s, OFF_R0),
                                    vhd_chaos__uva(&s, OFF_R0 + RING_AVAIL),
                                    vhd_chaos__uva(&s, OFF_R0 + RING_AVAIL));
        if (a) {
            rc = vhd_chaos__observe(&s, a, "avail and used at one address");
        } else {
            rc = vhd_chaos__kick_observe(&s, "start with avail and used at one address");
            if (!rc && !(ctx->observed & VHD_CHAOS_NACK))
                rc = vhd_chaos__must(
                    &s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 1), "enable");
            if (!rc && !(ctx->observed & VHD_CHAOS_NACK)) {
                /* Two requests; the first one's used element overwrites the avail ring. */
                b_control(&s);
                vhd_chaos__sdesc(&s, OFF_R0, 3, vhd_chaos__gpa(&s, OFF_HDR), 16, 0, 0);
                vhd_chaos__split_publish(&s, OFF_R0, 3, 2);
                vhd_chaos__kick(&s, 0);
                /* Used entries land in the avail ring: watch the status byte and GET_STATUS. */
                for (int i = 0; i < 2000 && vhd_chaos__blk_status(&s, 0) == 0xff; i++) {
                    int b = vhd_chaos__needs_reset(&s);
                    if (b == 1)
                        ctx->observed |= VHD_CHAOS_BROKEN;
                    if (b != 0)
                        break;
                    struct timespec ts = {0, 1000000L};
                    nanosleep(&ts, NULL);
                }
                struct timespec ts = {0, 50 * 1000000L};
                nanosleep(&ts, NULL);
                if (vhd_chaos__needs_reset(&s) == 1)
                    ctx->observed |= VHD_CHAOS_BROKEN;
                if (vhd_chaos__blk_status(&s, 0) == VIRTIO_BLK_S_OK)
                    ctx->observed |= VHD_CHAOS_SERVED;
            }
        }
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ---- random chains ---- */

/*
 * Scratch area of the random chains: every buffer they name lies here, in
 * the last 64 bytes of window 1 (and then runs off its end), or outside
 * guest memory.
 */
#define OFF_SCRATCH  OFF_DATA
#define SCRATCH_LEN  0x10000u
#define RANDOM_ITERS 80

/*
 * The end of one random session: count its outcomes (seen[0] all bits,
 * seen[1 + b] the sessions with bit b), add back the outcomes of the
 * sessions before (before), close it; returns rc.
 */
static int random_tally(struct vhd_chaos_sess *s, unsigned *seen, unsigned before, int rc)
{
    struct vhd_chaos_ctx *ctx = s->ctx;
    *seen |= ctx->observed;
    for (unsigned b = 0; b < 5; b++)
        if (ctx->observed & (1u << b))
            seen[1 + b]++;
    ctx->observed |= before;
    vhd_chaos__close(s);
    return rc;
}

/* RANDOM_ITERS sessions of one() seeded by VHD_CHAOS_SEED (its value in *seed), until one fails. */
static int random_runs(struct vhd_chaos_ctx *ctx,
                       int (*one)(struct vhd_chaos_ctx *, uint64_t *, unsigned *), unsigned seen[6],
                       uint64_t *seed)
{
    const char *env = getenv("VHD_CHAOS_SEED");
    *seed = env && *env ? strtoull(env, NULL, 0) : 0x5eed5eedull;
    uint64_t st = *seed * 2 + 1;
    int rc = 0;
    for (unsigned i = 0; i < RANDOM_ITERS && !rc; i++)
        rc = one(ctx, &st, seen);
    return rc;
}

static uint64_t rnd(uint64_t *st)
{
    /* xorshift64*: reproducible from the seed in the note. */
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return *st * 0x2545f4914f6cdd1dull;
}

/* An address and length: in the scratch area (mostly), or somewhere no region is. */
static void rnd_buf(struct vhd_chaos_sess *s, uint64_t *st, uint64_t *addr, uint32_t *len)
{
    static const uint32_t lens[] = {0, 1, 8, 16, 17, 512, 4096, 8192, 65536};
    uint32_t l = (rnd(st) & 3) ? lens[rnd(st) % VHD_ARRAY_SIZE(lens)] : (uint32_t)rnd(st);
    switch (rnd(st) % 8) {
    case 0:
        *addr = rnd(st); /* anywhere: practically never a region */
        *len = l;
        return;
    case 1:
        *addr = s->r1_gpa + VHD_CHAOS_WIN_SIZE - (rnd(st) % 64); /* running off the end */
        *len = l;
        return;
    default: {
        uint32_t off = (uint32_t)(rnd(st) % SCRATCH_LEN);
        if (l > SCRATCH_LEN - off)
            l = SCRATCH_LEN - off;
        *addr = vhd_chaos__gpa(s, OFF_SCRATCH + off);
        *len = l;
        return;
    }
    }
}

static uint16_t rnd_flags(uint64_t *st, bool packed)
{
    static const uint16_t f[] = {0,
                                 VRING_DESC_F_NEXT,
                                 VRING_DESC_F_WRITE,
                                 VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
                                 VRING_DESC_F_INDIRECT,
                                 VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT};
    uint16_t v = (rnd(st) % 16) ? f[rnd(st) % VHD_ARRAY_SIZE(f)] : (uint16_t)rnd(st);
    if (packed) /* AVAIL/USED are the publisher's business */
        v &= (uint16_t) ~(VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED);
    return v;
}

/* One random session: a random blk request (or a few descriptors of nonsense), kicked. */
static int random_one(struct vhd_chaos_ctx *ctx, uint64_t *st, unsigned *seen)
{
    struct vhd_chaos_sess s;
    bool packed = rnd(st) & 1, indirect = rnd(st) & 1;
    int rc = vhd_chaos__blk(ctx, &s, packed, indirect);
    if (rc) {
        vhd_chaos__close(&s);
        return rc;
    }
    /* Scratch: random bytes, a plausible request header at its start most of the time. */
    uint8_t junk[256];
    for (unsigned o = 0; o < SCRATCH_LEN; o += sizeof(junk)) {
        for (unsigned i = 0; i < sizeof(junk); i += 8) {
            uint64_t v = rnd(st);
            memcpy(junk + i, &v, 8);
        }
        vhd_chaos__put(&s, OFF_SCRATCH + o, junk, sizeof(junk));
    }
    if (rnd(st) % 4) {
        static const uint32_t types[] = {VIRTIO_BLK_T_IN,      VIRTIO_BLK_T_OUT,
                                         VIRTIO_BLK_T_FLUSH,   VIRTIO_BLK_T_GET_ID,
                                         VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES};
        struct virtio_blk_outhdr h = {.type = vhd_le32(types[rnd(st) % VHD_ARRAY_SIZE(types)]),
                                      .sector = vhd_le64(rnd(st) % 64)};
        vhd_chaos__put(&s, OFF_SCRATCH, &h, sizeof(h));
    }
    vhd_chaos__allow(&s, OFF_SCRATCH, SCRATCH_LEN);
    vhd_chaos__allow(&s, 2u * VHD_CHAOS_WIN_SIZE - 64, 64); /* the part of "off the end" inside */
    /* Indirect tables: random descriptors into the scratch area (or nowhere). */
    for (uint16_t i = 0; i < 32; i++) {
        uint64_t a;
        uint32_t l;
        rnd_buf(&s, st, &a, &l);
        vhd_chaos__sdesc(&s, OFF_IND, i, a, l, rnd_flags(st, false), (uint16_t)(rnd(st) % 40));
    }
    /*
     * Half the time a request shaped like a real one (header, data, status,
     * with one thing in eight bent), else descriptors of nonsense.
     */
    struct vhd_chaos_pd d[6];
    unsigned n;
    if (rnd(st) & 1) {
        bool in = rnd(st) & 1;
        n = 2 + (unsigned)(rnd(st) % 4);
        for (unsigned i = 0; i < n; i++) {
            static const uint32_t dl[] = {512, 4096, 1024, 1, 0, 3000};
            uint32_t off = (uint32_t)(rnd(st) % (SCRATCH_LEN - 8192)) & ~511u;
            d[i].addr = vhd_chaos__gpa(&s, OFF_SCRATCH + off);
            d[i].len = dl[rnd(st) % VHD_ARRAY_SIZE(dl)];
            d[i].flags = VRING_DESC_F_NEXT | (in ? VRING_DESC_F_WRITE : 0);
            d[i].id = 0;
        }
        d[0] = (struct vhd_chaos_pd){vhd_chaos__gpa(&s, OFF_SCRATCH), 16, 0, VRING_DESC_F_NEXT};
        d[n - 1].len = 1;
        d[n - 1].flags = VRING_DESC_F_WRITE;
        if (rnd(st) % 8 == 0) { /* bend one thing */
            unsigned k = (unsigned)(rnd(st) % n);
            switch (rnd(st) % 4) {
            case 0:
                d[k].flags ^= VRING_DESC_F_WRITE;
                break;
            case 1:
                rnd_buf(&s, st, &d[k].addr, &d[k].len);
                break;
            case 2:
                d[k].len = (uint32_t)rnd(st) % 100;
                break;
            default:
                d[k].flags ^= VRING_DESC_F_NEXT;
                break;
            }
        }
    } else {
        n = 1 + (unsigned)(rnd(st) % 4);
        for (unsigned i = 0; i < n; i++) {
            rnd_buf(&s, st, &d[i].addr, &d[i].len);
            d[i].flags = rnd_flags(st, packed);
            if (rnd(st) % 6 == 0) {
                /* An indirect table: never device-writable (2.7.5.3.2: WRITE is ignored). */
                d[i].addr = vhd_chaos__gpa(&s, OFF_IND);
                d[i].len = 16u * (uint32_t)(1 + rnd(st) % 32);
                d[i].flags |= VRING_DESC_F_INDIRECT;
            }
            d[i].id = (rnd(st) % 8) ? 0 : (uint16_t)rnd(st);
        }
        if (rnd(st) % 4)
            d[n - 1].flags &= (uint16_t)~VRING_DESC_F_NEXT;
    }
    if (packed) {
        vhd_chaos__packed_publish(&s, OFF_R0, d, n);
    } else {
        for (uint16_t i = 0; i < n; i++) {
            uint16_t next = (rnd(st) % 16) ? (uint16_t)(i + 1) : (uint16_t)(rnd(st) % 16);
            vhd_chaos__sdesc(&s, OFF_R0, i, d[i].addr, d[i].len, d[i].flags, next);
        }
        uint16_t idx = (rnd(st) % 10) ? 1 : (uint16_t)rnd(st);
        vhd_chaos__split_publish(&s, OFF_R0, (rnd(st) % 10) ? 0 : (uint16_t)rnd(st), idx);
    }
    vhd_chaos__kick(&s, 0);
    unsigned before = ctx->observed;
    ctx->observed = 0;
    struct vhd_chaos_used u;
    rc = vhd_chaos__await_used(&s, OFF_R0, 0, &u, 30);
    if (!rc && u.got && u.len > 0) {
        /* The status byte is the last writable byte: somewhere in the scratch area. */
        ctx->observed |= VHD_CHAOS_SERVED | VHD_CHAOS_REQ_ERROR;
    }
    return random_tally(&s, seen, before, rc);
}

/*
 * RANDOM_ITERS sessions, each with one random chain (split or packed,
 * direct or indirect tables, buffers in a scratch area or outside memory,
 * random flags, links, ids and avail index). Outcomes are whatever they
 * are; what is checked is that the back-end survives, keeps every fd and
 * writes nowhere but the scratch area and the rings' own parts.
 */
static int c_random_chains(struct vhd_chaos_ctx *ctx)
{
    uint64_t seed;
    unsigned seen[6] = {0};
    int rc = random_runs(ctx, random_one, seen, &seed);
    struct vhd_chaos_sess s = {.ctx = ctx};
    vhd_chaos__note(&s, 0, "seed 0x%llx: %u used, %u broken of %u", (unsigned long long)seed,
                    seen[1 + 2], seen[1 + 3], RANDOM_ITERS);
    return rc;
}

/*
 * The call eventfd is blocking and its counter already at the maximum
 * (0xfffffffffffffffe): a write of 1 would block until someone reads it,
 * and the front-end never will. Signalling must not hang the worker (it
 * also serves other devices' queues): the request completes, the used
 * element is published, the signal is dropped or the queue breaks.
 */
static int c_call_eventfd_full(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    if (!rc) {
        s.call[0] = eventfd(0, EFD_CLOEXEC); /* blocking */
        uint64_t v = 0xfffffffffffffffeull;
        if (s.call[0] < 0 || write(s.call[0], &v, sizeof(v)) != sizeof(v))
            rc = vhd_chaos__note(&s, -errno, "eventfd: %s", strerror(errno));
    }
    if (!rc)
        rc = vhd_chaos__ring_start(&s, 0, OFF_R0);
    if (!rc) {
        b_control(&s);
        rc = vhd_chaos__blk_go(&s);
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * A read on another device served by the same worker, through
 * the blk driver, within the timeout: 0, or -errno with a note.
 */
static int probe_read(struct vhd_chaos_sess *s, const char *sock)
{
    struct vhd_blkdrv_opts o = {.socket_path = sock, .queue_size = 16, .pool_size = 1 << 16};
    struct vhd_blkdrv *d;
    char err[128];
    int rc = vhd_blkdrv_connect(&o, &d, err, sizeof(err));
    if (rc < 0)
        return vhd_chaos__note(s, rc, "probe device: %s", err);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    void *buf = vhd_blkdrv_buf_alloc(q, 4096);
    struct vhd_blkdrv_completion c;
    rc = buf ? vhd_blkdrv_submit_read(q, 0, buf, 4096, buf) : -ENOMEM;
    if (rc == 0) {
        rc = vhd_blkdrv_wait(q, &c, 1, s->tmo);
        rc = rc == 1 ? c.ret : rc == 0 ? -ETIMEDOUT : rc;
    }
    if (rc != 0)
        vhd_chaos__note(s, rc, "probe read: %s", strerror(rc < 0 ? -rc : EIO));
    vhd_blkdrv_disconnect(d);
    return rc < 0 ? rc : rc ? -EIO : 0;
}

/*
 * The front-end clears O_NONBLOCK on the call and kick eventfds it shares
 * with us (fcntl on its copy changes the one open file description), after
 * the back-end set it, and fills the call counter to its maximum: a plain
 * write of 1 then sleeps until someone reads the counter, and nobody will.
 * The worker must not: the requests complete, and another device on the
 * same worker (ctx->probe_path) is served while this session stays as it
 * is.
 */
static int c_call_nonblock_cleared(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    for (int i = 0; !rc && i < 2; i++) {
        int fd = i ? s.kick[0] : s.call[0];
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || !(fl & O_NONBLOCK) || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0)
            rc = vhd_chaos__note(&s, -EINVAL, "%s fd: O_NONBLOCK %s", i ? "kick" : "call",
                                 fl < 0 ? strerror(errno) : "was not set by the back-end");
    }
    uint64_t v = 0xfffffffffffffffeull;
    if (!rc && write(s.call[0], &v, sizeof(v)) != sizeof(v))
        rc = vhd_chaos__note(&s, -errno, "filling the call eventfd: %s", strerror(errno));
    if (!rc) {
        b_control(&s);
        rc = vhd_chaos__blk_go(&s);
    }
    if (!rc && ctx->probe_path)
        rc = probe_read(&s, ctx->probe_path);
    vhd_chaos__close(&s);
    return rc;
}

/* The same with the error eventfd, which is written when a queue breaks (a loop here). */
static int c_err_eventfd_full(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    int efd = -1;
    if (!rc) {
        efd = eventfd(0, EFD_CLOEXEC); /* blocking */
        uint64_t v = 0xfffffffffffffffeull;
        if (efd < 0 || write(efd, &v, sizeof(v)) != sizeof(v))
            rc = vhd_chaos__note(&s, -errno, "eventfd: %s", strerror(errno));
    }
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__set_vring_fd(&s, VHOST_USER_SET_VRING_ERR, 0, efd),
                             "SET_VRING_ERR");
    if (!rc)
        rc = vhd_chaos__ring_start(&s, 0, OFF_R0);
    if (!rc) {
        b_loop(&s);
        rc = vhd_chaos__blk_go(&s);
    }
    if (efd >= 0)
        close(efd);
    vhd_chaos__close(&s);
    return rc;
}

/* ---- guest memory the front-end truncates under running rings ---- */

#define TRUNC_PAGE    4096u
#define TRUNC_SEGS    126u /* data segments per request (the device's seg_max) */
#define TRUNC_FAULTS  40000u
#define TRUNC_PAGES   (2u * (TRUNC_FAULTS + 2u * TRUNC_SEGS)) /* every other page is touched */
#define TRUNC_GPA     (1ull << 32)
#define TRUNC_UVA     (1ull << 44)
#define TRUNC_WAIT_MS 400

/*
 * Wait (bounded) for the n-th used element of ring 0: true when it came.
 * Unlike vhd_chaos__await_used this keeps waiting on a device that already
 * reports NEEDS_RESET (whether it still serves is the question here).
 */
static bool trunc_served(struct vhd_chaos_sess *s, uint16_t n, int *rc)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct vhd_chaos_used u;
        *rc = vhd_chaos__await_used(s, OFF_R0, n, &u, 0);
        if (*rc || u.got)
            return u.got;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 > TRUNC_WAIT_MS)
            return false;
        struct timespec nap = {0, 2000000L};
        nanosleep(&nap, NULL);
    }
}

/*
 * Issue 12: a front-end adds a large region (ADD_MEM_REG) and truncates its
 * file to nothing, then makes requests whose header and 126 data buffers
 * each lie on a distinct lost page, every other page (replaced pages must
 * not merge back into one mapping): 40,000 pages in all if the device
 * keeps going. A SIGBUS guard that replaced page after page would split the
 * mapping each time until vm.max_map_count ran out, and the next fault
 * killed the daemon. The device must break at the first fault and stop:
 * once GET_STATUS says NEEDS_RESET, no request made available after that
 * is served (then: BROKEN; served anyway: SERVED, which the case does not
 * accept). The test checks that the daemon's mappings did not grow.
 */
static int c_truncated_pages(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, true);
    int fd = -1;
    if (!rc) {
        fd = memfd_create("chaos-truncated", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)TRUNC_PAGES * TRUNC_PAGE) < 0)
            rc = vhd_chaos__note(&s, -errno, "memfd: %s", strerror(errno));
    }
    if (!rc) {
        struct vu_mem_single m = {.region = {.gpa = TRUNC_GPA,
                                             .size = (uint64_t)TRUNC_PAGES * TRUNC_PAGE,
                                             .uva = TRUNC_UVA}};
        rc = vhd_chaos__must(&s, vhd_chaos__ack(&s, VHOST_USER_ADD_MEM_REG, &m, sizeof(m), &fd, 1),
                             "ADD_MEM_REG of the region to truncate");
    }
    if (!rc && ftruncate(fd, 0) < 0)
        rc = vhd_chaos__note(&s, -errno, "truncate: %s", strerror(errno));
    vhd_chaos__allow(&s, OFF_STAT, 1);
    bool broken = false;
    unsigned served_after = 0, faults = 0, k;
    for (k = 0; !rc && faults < TRUNC_FAULTS; k++) {
        uint64_t page = 2ull * faults;
        idesc(&s, 0, 0, TRUNC_GPA + page * TRUNC_PAGE, 16, VRING_DESC_F_NEXT, 1);
        for (uint16_t j = 1; j <= TRUNC_SEGS; j++)
            idesc(&s, 0, j, TRUNC_GPA + (page + 2u * j) * TRUNC_PAGE, TRUNC_PAGE,
                  VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, (uint16_t)(j + 1));
        idesc(&s, 0, TRUNC_SEGS + 1, vhd_chaos__gpa(&s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
        faults += 1 + TRUNC_SEGS;
        vhd_chaos__sdesc(&s, OFF_R0, 0, vhd_chaos__gpa(&s, OFF_IND), 16u * (TRUNC_SEGS + 2),
                         VRING_DESC_F_INDIRECT, 0);
        vhd_chaos__split_publish(&s, OFF_R0, 0, (uint16_t)(k + 1));
        vhd_chaos__kick(&s, 0);
        bool served = trunc_served(&s, (uint16_t)k, &rc);
        if (rc)
            break;
        if (served && broken)
            served_after++;
        if (!served)
            break; /* the device stopped */
        int b = vhd_chaos__needs_reset(&s);
        if (b < 0)
            rc = vhd_chaos__note(&s, b, "GET_STATUS: %s", strerror(-b));
        broken |= b == 1;
    }
    if (!rc) {
        int b = broken ? 1 : vhd_chaos__needs_reset(&s);
        if (b == 1)
            ctx->observed |= VHD_CHAOS_BROKEN;
        if (served_after)
            ctx->observed |= VHD_CHAOS_SERVED;
        rc = vhd_chaos__note(&s, b < 0 ? b : 0,
                             "%u requests (%u pages) made available, %u served after NEEDS_RESET",
                             k, k * (1 + TRUNC_SEGS), served_after);
    }
    if (fd >= 0)
        close(fd);
    vhd_chaos__close(&s);
    return rc;
}

/* ---- packed ---- */

static void p_std(struct vhd_chaos_sess *s, struct vhd_chaos_pd *d)
{
    std_in(s);
    d[0] = (struct vhd_chaos_pd)GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT);
    d[1] = (struct vhd_chaos_pd)GDESC(OFF_DATA, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE);
    d[2] = (struct vhd_chaos_pd)GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE);
}

static void p_control(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[3];
    p_std(s, d);
    vhd_chaos__packed_publish(s, OFF_R0, d, 3);
}

static void p_id_oob(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[3];
    p_std(s, d);
    d[2].id = 500;
    vhd_chaos__packed_publish(s, OFF_R0, d, 3);
}

static void p_write_before_read(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[3];
    p_std(s, d);
    struct vhd_chaos_pd t = d[0];
    d[0] = d[1];
    d[1] = t;
    vhd_chaos__packed_publish(s, OFF_R0, d, 3);
}

static void p_addr_outside(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[3];
    p_std(s, d);
    d[1].addr = 0x3000;
    vhd_chaos__packed_publish(s, OFF_R0, d, 3);
}

static void p_hdr_short(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[2];
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    vhd_chaos__allow(s, OFF_STAT, 1);
    d[0] = (struct vhd_chaos_pd)GDESC(OFF_HDR, 4, VRING_DESC_F_NEXT);
    d[1] = (struct vhd_chaos_pd)GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE);
    vhd_chaos__packed_publish(s, OFF_R0, d, 2);
}

/* Every slot says NEXT: the chain runs into slots not made available. */
static void p_endless(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[QSZ];
    std_in(s);
    for (unsigned i = 0; i < QSZ; i++)
        d[i] = (struct vhd_chaos_pd){vhd_chaos__gpa(s, OFF_DATA) + 512u * i, 512, 0,
                                     VRING_DESC_F_NEXT | (i ? VRING_DESC_F_WRITE : 0)};
    d[0].addr = vhd_chaos__gpa(s, OFF_HDR);
    d[0].len = 16;
    vhd_chaos__packed_publish(s, OFF_R0, d, QSZ);
}

static void p_ind_nested(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[1];
    ind_std(s);
    idesc(s, 0, 1, vhd_chaos__gpa(s, OFF_IND + 0x400), 16,
          VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT, 2);
    d[0] = (struct vhd_chaos_pd)GDESC(OFF_IND, 48, VRING_DESC_F_INDIRECT);
    vhd_chaos__packed_publish(s, OFF_R0, d, 1);
}

static void p_ind_in_chain(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[2];
    ind_std(s);
    d[0] = (struct vhd_chaos_pd)GDESC(OFF_IND, 48, VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT);
    d[1] = (struct vhd_chaos_pd)GDESC(OFF_STAT, 1, VRING_DESC_F_WRITE);
    vhd_chaos__packed_publish(s, OFF_R0, d, 2);
}

/* Nothing device-writable at all: neither data nor status may be written. */
static void p_status_readonly(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[3];
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    d[0] = (struct vhd_chaos_pd)GDESC(OFF_HDR, 16, VRING_DESC_F_NEXT);
    d[1] = (struct vhd_chaos_pd)GDESC(OFF_DATA, 4096, VRING_DESC_F_NEXT);
    d[2] = (struct vhd_chaos_pd)GDESC(OFF_STAT, 1, 0);
    vhd_chaos__packed_publish(s, OFF_R0, d, 3);
}

VHD_CHAOS_VARIANT(c_p_control, chain_case, true, false, p_control)
VHD_CHAOS_VARIANT(c_p_id_oob, chain_case, true, false, p_id_oob)
VHD_CHAOS_VARIANT(c_p_write_before_read, chain_case, true, false, p_write_before_read)
VHD_CHAOS_VARIANT(c_p_addr_outside, chain_case, true, false, p_addr_outside)
VHD_CHAOS_VARIANT(c_p_hdr_short, chain_case, true, false, p_hdr_short)
VHD_CHAOS_VARIANT(c_p_endless, chain_case, true, false, p_endless)
VHD_CHAOS_VARIANT(c_p_ind_nested, chain_case, true, true, p_ind_nested)
VHD_CHAOS_VARIANT(c_p_ind_in_chain, chain_case, true, true, p_ind_in_chain)
VHD_CHAOS_VARIANT(c_p_status_readonly, chain_case, true, false, p_status_readonly)

/* ======================= cases: descriptor chains (net) ======================= */

/* A frame (header + 60 bytes, broadcast) at OFF_TXBUF; an rx buffer of 2 KiB posted. */
static void net_frame(struct vhd_chaos_sess *s, bool post_rx)
{
    vhd_chaos__net_frame(s);
    if (post_rx) {
        vhd_chaos__allow(s, OFF_RXBUF, 2048);
        vhd_chaos__sdesc(s, OFF_R0, 0, vhd_chaos__gpa(s, OFF_RXBUF), 2048, VRING_DESC_F_WRITE, 0);
        vhd_chaos__split_publish(s, OFF_R0, 0, 1);
        vhd_chaos__kick(s, 0);
    }
}

/*
 * Transmit head 0 of ring 1, then see what came back on both rings. A
 * loopback answers within the same burst; a frame that should come is given
 * time anyway.
 */
static int net_go(struct vhd_chaos_sess *s, bool expect_frame_dropped)
{
    return vhd_chaos__net_go(s, true, expect_frame_dropped ? 150 : s->tmo);
}

static int c_net_control(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__net(ctx, &s);
    if (!rc) {
        net_frame(&s, true);
        vhd_chaos__sdesc(&s, OFF_R1, 0, vhd_chaos__gpa(&s, OFF_TXBUF), NET_HDR + PKT_LEN, 0, 0);
        rc = net_go(&s, false);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A transmit chain of 6 bytes: shorter than the virtio-net header. */
static int c_net_hdr_short(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__net(ctx, &s);
    if (!rc) {
        net_frame(&s, true);
        vhd_chaos__sdesc(&s, OFF_R1, 0, vhd_chaos__gpa(&s, OFF_TXBUF), 6, 0, 0);
        rc = net_go(&s, true);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A transmit loop. */
static int c_net_tx_loop(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__net(ctx, &s);
    if (!rc) {
        net_frame(&s, true);
        vhd_chaos__sdesc(&s, OFF_R1, 0, vhd_chaos__gpa(&s, OFF_TXBUF), 40, VRING_DESC_F_NEXT, 1);
        vhd_chaos__sdesc(&s, OFF_R1, 1, vhd_chaos__gpa(&s, OFF_TXBUF) + 40, 32, VRING_DESC_F_NEXT,
                         0);
        rc = net_go(&s, true);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A receive buffer the device may only read. */
static int c_net_rx_readonly(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__net(ctx, &s);
    if (!rc) {
        net_frame(&s, false);
        vhd_chaos__sdesc(&s, OFF_R0, 0, vhd_chaos__gpa(&s, OFF_RXBUF), 2048, 0, 0);
        vhd_chaos__split_publish(&s, OFF_R0, 0, 1);
        vhd_chaos__kick(&s, 0);
        vhd_chaos__sdesc(&s, OFF_R1, 0, vhd_chaos__gpa(&s, OFF_TXBUF), NET_HDR + PKT_LEN, 0, 0);
        vhd_chaos__split_publish(&s, OFF_R1, 0, 1);
        vhd_chaos__kick(&s, 1);
        struct vhd_chaos_used tx, rx;
        rc = vhd_chaos__await_used(&s, OFF_R1, 0, &tx, s.tmo);
        if (!rc && !(ctx->observed & VHD_CHAOS_BROKEN)) {
            vhd_chaos__kick(&s, 0); /* the receive queue learns of its broken state when it runs */
            rc = vhd_chaos__await_used(&s, OFF_R0, 0, &rx, s.tmo);
            if (!rc && rx.got)
                vhd_chaos__note(&s, 0, "read-only receive buffer used (%u bytes)", rx.len);
        }
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A receive buffer of 4 bytes: the frame cannot fit; it is dropped, nothing written. */
static int c_net_rx_tiny(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__net(ctx, &s);
    if (!rc) {
        net_frame(&s, false);
        vhd_chaos__sdesc(&s, OFF_R0, 0, vhd_chaos__gpa(&s, OFF_RXBUF), 4, VRING_DESC_F_WRITE, 0);
        vhd_chaos__split_publish(&s, OFF_R0, 0, 1);
        vhd_chaos__kick(&s, 0);
        vhd_chaos__sdesc(&s, OFF_R1, 0, vhd_chaos__gpa(&s, OFF_TXBUF), NET_HDR + PKT_LEN, 0, 0);
        rc = net_go(&s, true);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A transmit frame of 70000 bytes (more than any frame) from window 1. */
static int c_net_tx_oversize(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__net(ctx, &s);
    if (!rc) {
        net_frame(&s, true);
        vhd_chaos__sdesc(&s, OFF_R1, 0, vhd_chaos__gpa(&s, VHD_CHAOS_WIN_SIZE), 70000, 0, 0);
        rc = net_go(&s, true);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ---- net control queue (ring 2, CTRL_VQ and CTRL_RX negotiated) ---- */

#define OFF_CMD (OFF_DATA + 0x3000u) /* command bytes (readable) */
#define OFF_ACK (OFF_DATA + 0x3800u) /* ack byte (writable) */

/*
 * Post one control command of cmd_len bytes (class, command, data) with an
 * ack byte (or none) and classify: ack OK is served, ack ERR or a command
 * given back unanswered is a failed request.
 */
static int net_ctrl(struct vhd_chaos_ctx *ctx, const uint8_t *cmd, uint32_t cmd_len, bool ack)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, BIT(VIRTIO_NET_F_CTRL_VQ) | BIT(VIRTIO_NET_F_CTRL_RX));
    if (!rc)
        rc = vhd_chaos__ring_start(&s, 0, OFF_R0);
    if (!rc)
        rc = vhd_chaos__ring_start(&s, 1, OFF_R1);
    if (!rc)
        rc = vhd_chaos__ring_start(&s, 2, OFF_R2);
    if (!rc) {
        uint8_t ff = 0xff;
        vhd_chaos__put(&s, OFF_CMD, cmd, cmd_len);
        vhd_chaos__put(&s, OFF_ACK, &ff, 1);
        if (ack)
            vhd_chaos__allow(&s, OFF_ACK, 1);
        vhd_chaos__sdesc(&s, OFF_R2, 0, vhd_chaos__gpa(&s, OFF_CMD), cmd_len,
                         ack ? VRING_DESC_F_NEXT : 0, 1);
        vhd_chaos__sdesc(&s, OFF_R2, 1, vhd_chaos__gpa(&s, OFF_ACK), 1, VRING_DESC_F_WRITE, 0);
        vhd_chaos__split_publish(&s, OFF_R2, 0, 1);
        vhd_chaos__kick(&s, 2);
        struct vhd_chaos_used u;
        rc = vhd_chaos__await_used(&s, OFF_R2, 0, &u, s.tmo);
        uint8_t a = *vhd_chaos__hva(&s, OFF_ACK);
        if (!rc && u.got) {
            if (u.len >= 1 && a == VIRTIO_NET_OK)
                ctx->observed |= VHD_CHAOS_SERVED;
            else if ((u.len >= 1 && a == VIRTIO_NET_ERR) || (u.len == 0 && a == 0xff))
                ctx->observed |= VHD_CHAOS_REQ_ERROR;
            else
                vhd_chaos__note(&s, 0, "used length %u, ack byte 0x%02x", u.len, a);
        }
    }
    vhd_chaos__close(&s);
    return rc;
}

static int c_net_ctrl_control(struct vhd_chaos_ctx *ctx)
{
    static const uint8_t cmd[] = {VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, 1};
    return net_ctrl(ctx, cmd, sizeof(cmd), true);
}

/* One byte: no class and command. */
static int c_net_ctrl_short(struct vhd_chaos_ctx *ctx)
{
    static const uint8_t cmd[] = {VIRTIO_NET_CTRL_RX};
    return net_ctrl(ctx, cmd, sizeof(cmd), true);
}

/* MAC_TABLE_SET whose first table claims 2^28 entries. */
static int c_net_ctrl_mac_table(struct vhd_chaos_ctx *ctx)
{
    static const uint8_t cmd[] = {
        VIRTIO_NET_CTRL_MAC, VIRTIO_NET_CTRL_MAC_TABLE_SET, 0, 0, 0, 0x10, 1, 2, 3, 4, 5, 6};
    return net_ctrl(ctx, cmd, sizeof(cmd), true);
}

/* A command without an ack byte: it cannot be answered. */
static int c_net_ctrl_no_ack(struct vhd_chaos_ctx *ctx)
{
    static const uint8_t cmd[] = {VIRTIO_NET_CTRL_RX, VIRTIO_NET_CTRL_RX_PROMISC, 1};
    return net_ctrl(ctx, cmd, sizeof(cmd), false);
}

/* ---- random net traffic ---- */

#define OFF_NTX 0x20000u /* transmit scratch: never device-writable */
#define OFF_NRX 0x30000u /* receive scratch */
#define NSCR    0x8000u

/* A buffer in [base, base + NSCR) (mostly), or outside guest memory. */
static void rnd_net_buf(struct vhd_chaos_sess *s, uint64_t *st, size_t base, uint64_t *addr,
                        uint32_t *len)
{
    static const uint32_t lens[] = {0, 1, 6, 12, 13, 60, 74, 1514, 2048, 9000, 70000};
    uint32_t l = lens[rnd(st) % VHD_ARRAY_SIZE(lens)];
    if (rnd(st) % 10 == 0) {
        *addr = rnd(st);
        *len = l;
        return;
    }
    uint32_t off = (uint32_t)(rnd(st) % NSCR);
    if (l > NSCR - off)
        l = NSCR - off;
    *addr = vhd_chaos__gpa(s, base + off);
    *len = l;
}

/* One random net session: a few receive buffers, one transmit chain with a random header. */
static int random_net_one(struct vhd_chaos_ctx *ctx, uint64_t *st, unsigned *seen)
{
    struct vhd_chaos_sess s;
    uint64_t f = 0;
    if (rnd(st) & 1)
        f |= BIT(VIRTIO_NET_F_MRG_RXBUF);
    if (rnd(st) & 1)
        f |= BIT(VIRTIO_NET_F_CSUM) | BIT(VIRTIO_NET_F_GUEST_CSUM);
    if (rnd(st) % 4 == 0)
        f |= BIT(VIRTIO_F_RING_PACKED);
    int rc = vhd_chaos__setup(ctx, &s, f);
    if (!rc)
        rc = vhd_chaos__ring_start(&s, 0, OFF_R0);
    if (!rc)
        rc = vhd_chaos__ring_start(&s, 1, OFF_R1);
    if (rc) {
        vhd_chaos__close(&s);
        return rc;
    }
    /* Transmit scratch: a header with random flags and checksum offsets, then a frame. */
    uint8_t junk[256];
    for (unsigned o = 0; o < NSCR; o += sizeof(junk)) {
        for (unsigned i = 0; i < sizeof(junk); i += 8) {
            uint64_t v = rnd(st);
            memcpy(junk + i, &v, 8);
        }
        vhd_chaos__put(&s, OFF_NTX + o, junk, sizeof(junk));
        vhd_chaos__put(&s, OFF_NRX + o, junk, sizeof(junk));
    }
    uint8_t hdr[NET_HDR] = {0};
    hdr[0] = (rnd(st) % 3) ? VIRTIO_NET_HDR_F_NEEDS_CSUM : (uint8_t)rnd(st); /* flags */
    hdr[1] = (rnd(st) % 4) ? 0 : (uint8_t)rnd(st);                           /* gso_type */
    uint16_t cs = (uint16_t)(rnd(st) % 80), co = (uint16_t)((rnd(st) % 4) ? 16 : rnd(st));
    memcpy(hdr + 6, &cs, 2);
    memcpy(hdr + 8, &co, 2);
    vhd_chaos__put(&s, OFF_NTX, hdr, sizeof(hdr));
    vhd_chaos__allow(&s, OFF_NRX, NSCR);
    /* Receive buffers: writable (mostly), in the receive scratch area (mostly). */
    unsigned nrx = 1 + (unsigned)(rnd(st) % 3);
    struct vhd_chaos_pd d[4];
    for (unsigned i = 0; i < nrx; i++) {
        rnd_net_buf(&s, st, OFF_NRX, &d[i].addr, &d[i].len);
        d[i].flags = (rnd(st) % 8) ? VRING_DESC_F_WRITE : rnd_flags(st, s.packed);
        d[i].id = (uint16_t)i;
    }
    if (s.packed) {
        vhd_chaos__packed_publish(&s, OFF_R0, d, 1); /* one buffer: slots 0.. of one lap */
    } else {
        for (uint16_t i = 0; i < nrx; i++) {
            vhd_chaos__sdesc(&s, OFF_R0, i, d[i].addr, d[i].len,
                             d[i].flags & (uint16_t)~VRING_DESC_F_NEXT, 0);
            vhd_chaos__split_publish(&s, OFF_R0, i, (uint16_t)(i + 1));
        }
    }
    vhd_chaos__kick(&s, 0);
    /* The transmit chain: header + frame, split in 1..3 pieces, sometimes bent. */
    unsigned ntx = 1 + (unsigned)(rnd(st) % 3);
    uint32_t total = (uint32_t)(NET_HDR + 14 + rnd(st) % 1600), off = 0;
    for (unsigned i = 0; i < ntx; i++) {
        uint32_t piece = i + 1 == ntx ? total - off : (total - off) / (ntx - i);
        d[i] = (struct vhd_chaos_pd){vhd_chaos__gpa(&s, OFF_NTX + off), piece, 0,
                                     i + 1 < ntx ? VRING_DESC_F_NEXT : 0};
        off += piece;
    }
    if (rnd(st) % 4 == 0) {
        unsigned k = (unsigned)(rnd(st) % ntx);
        rnd_net_buf(&s, st, OFF_NTX, &d[k].addr, &d[k].len);
        if (rnd(st) & 1)
            d[k].flags ^= VRING_DESC_F_WRITE;
    }
    if (s.packed) {
        vhd_chaos__packed_publish(&s, OFF_R1, d, ntx);
    } else {
        for (uint16_t i = 0; i < ntx; i++)
            vhd_chaos__sdesc(&s, OFF_R1, i, d[i].addr, d[i].len, d[i].flags, (uint16_t)(i + 1));
        vhd_chaos__split_publish(&s, OFF_R1, 0, 1);
    }
    vhd_chaos__kick(&s, 1);
    unsigned before = ctx->observed;
    ctx->observed = 0;
    struct vhd_chaos_used tx, rx;
    rc = vhd_chaos__await_used(&s, OFF_R1, 0, &tx, 30);
    if (!rc)
        rc = vhd_chaos__await_used(&s, OFF_R0, 0, &rx, 10);
    if (!rc && tx.got)
        ctx->observed |= rx.got ? VHD_CHAOS_SERVED : VHD_CHAOS_REQ_ERROR;
    return random_tally(&s, seen, before, rc);
}

/*
 * RANDOM_ITERS net sessions with random features (MRG_RXBUF, checksum
 * offload, packed), random receive buffers and a random transmit chain and
 * header. Checked: survival, fds, and that nothing but the receive scratch
 * area and the rings' own parts was written (transmit buffers never are).
 */
static int c_net_random(struct vhd_chaos_ctx *ctx)
{
    uint64_t seed;
    unsigned seen[6] = {0};
    int rc = random_runs(ctx, random_net_one, seen, &seed);
    struct vhd_chaos_sess s = {.ctx = ctx};
    vhd_chaos__note(&s, 0, "seed 0x%llx: %u delivered, %u dropped, %u broken of %u",
                    (unsigned long long)seed, seen[1 + 4], seen[1 + 2], seen[1 + 3], RANDOM_ITERS);
    return rc;
}

/* ======================= table ======================= */

/*
 * A front-end that rewrites the inflight area while the back-end reads it:
 * a consistent area with one IN request in flight (split: head 0; packed:
 * records 0..2, the chain still in ring slots 0..2), and a thread that
 * flips every field the start checks between its value and one far out of
 * range, from before the ring starts until the request is answered. The
 * back-end may see any mixture; it must fail the start, break the device or
 * answer the request, and never write outside what it owns (a descriptor
 * flag stored past the ring shows in the memory check). A race across two
 * processes, so several rounds, each a new session and area; whether a
 * check and a later read see different values depends on the scheduler.
 * The deterministic races, with a rewrite exactly between check and use,
 * are in test_inflight (race_*).
 */
#define REWRITE_ROUNDS 4

struct rewriter {
    uint8_t *area;
    bool packed;
    int stop;        /* set by the case, read by the thread (atomic) */
    uint64_t passes; /* set by the thread (atomic): it is running */
};

/* Store v into the area field at off, width bytes (atomic: the thread and the back-end race). */
static void rw_store(uint8_t *area, size_t off, unsigned width, uint64_t v)
{
    if (width == 1)
        __atomic_store_n(area + off, (uint8_t)v, __ATOMIC_RELAXED);
    else if (width == 2)
        __atomic_store_n((uint16_t *)(void *)(area + off), (uint16_t)v, __ATOMIC_RELAXED);
    else
        __atomic_store_n((uint64_t *)(void *)(area + off), v, __ATOMIC_RELAXED);
}

/* One field the thread flips: where, how wide, its good value and a bad one. */
struct rw_field {
    size_t off;
    unsigned width;
    uint64_t good, bad;
};

#define RWF(type, field, good, bad)                                      \
    {                                                                    \
        offsetof(type, field), sizeof(((type *)0)->field), (good), (bad) \
    }
#define RWP(field, good, bad) RWF(struct vhd_inflight_packed, field, good, bad)
#define RWS(field, good, bad) RWF(struct vhd_inflight_split, field, good, bad)

static const struct rw_field rw_packed[] = {
    RWP(old_used_idx, 0, 0x7ff0),
    RWP(used_idx, 0, 0x7ff0),
    RWP(free_head, 3, 0xfff0),
    RWP(old_free_head, 3, 0xfff0),
    RWP(desc[0].num, 3, 0x7fff),
    RWP(desc[0].last, 2, 0xffff),
    RWP(desc[2].id, 0, 0x7fff),
    RWP(desc[1].next, 2, 0xfff0),
    RWP(desc[0].inflight, 1, 7),
    RWP(old_used_wrap_counter, 1, 9),
    RWP(version, VHD_INFLIGHT_VERSION, 0),
};
static const struct rw_field rw_split[] = {
    RWS(version, VHD_INFLIGHT_VERSION, 2), RWS(used_idx, 0, 0x7777),
    RWS(last_batch_head, 0, 0xfff0),       RWS(desc[0].inflight, 1, 5),
    RWS(desc[0].counter, 1, ~0ull),        RWS(desc[0].next, 0, 0xffff),
};

static void *rewriter_run(void *arg)
{
    struct rewriter *w = arg;
    const struct rw_field *f = w->packed ? rw_packed : rw_split;
    size_t n = w->packed ? VHD_ARRAY_SIZE(rw_packed) : VHD_ARRAY_SIZE(rw_split);
    uint64_t k = 0;

    while (!__atomic_load_n(&w->stop, __ATOMIC_RELAXED)) {
        /*
         * Bad in turn, one field at a time and then all together, then all
         * good again; the first field of the table (packed: old_used_idx,
         * which a start once read again after checking it) on every other
         * pass too, so that a check and a later read often disagree.
         */
        for (size_t i = 0; i < n; i++) {
            bool bad = k % (n + 2) == i || k % (n + 2) == n || (i == 0 && (k & 1));
            rw_store(w->area, f[i].off, f[i].width, bad ? f[i].bad : f[i].good);
        }
        __atomic_store_n(&w->passes, ++k, __ATOMIC_RELAXED);
    }
    for (size_t i = 0; i < n; i++)
        rw_store(w->area, f[i].off, f[i].width, f[i].good);
    return NULL;
}

/* The session being set up (scribble callbacks get no session). */
static struct vhd_chaos_sess *rw_sess;

/* The consistent area: one chain in flight (packed: its records, the chain of p_std). */
static void scribble_rewrite(void *area, size_t len, bool packed)
{
    struct vhd_chaos_pd chain[3];

    if (!packed) {
        scribble_one(area, len, packed);
        return;
    }
    p_std(rw_sess, chain);
    struct vhd_inflight_packed *r = area;
    r->version = VHD_INFLIGHT_VERSION;
    r->desc_num = QSZ;
    r->free_head = r->old_free_head = 3;
    r->used_idx = r->old_used_idx = 0;
    r->used_wrap_counter = r->old_used_wrap_counter = 1;
    for (unsigned i = 0; i < QSZ; i++)
        r->desc[i].next = (uint16_t)(i + 1);
    for (unsigned i = 0; i < 3; i++) {
        struct vhd_inflight_packed_desc *d = &r->desc[i];
        d->addr = chain[i].addr;
        d->len = chain[i].len;
        d->flags = (uint16_t)(chain[i].flags | VRING_PACKED_DESC_F_AVAIL);
        d->id = 0;
    }
    r->desc[0].inflight = 1;
    r->desc[0].num = 3;
    r->desc[0].last = 2;
    r->desc[0].counter = 1;
}

static int inflight_rewrite_round(struct vhd_chaos_ctx *ctx, bool packed)
{
    struct vhd_chaos_sess s;
    struct inflight_map map = {0};
    struct rewriter w = {.packed = packed};
    pthread_t th;
    bool running = false;

    rw_sess = &s;
    int rc = inflight_session(ctx, &s, packed, scribble_rewrite, &map);
    rw_sess = NULL;
    /* Split: base 1, head 0 at avail index 0 already taken. Packed: used 0, avail 3 (lap 1). */
    if (!rc)
        rc = vhd_chaos__must(&s,
                             vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_BASE, 0,
                                                  packed ? 3u | 1u << 15 | 1u << 31 : 1u),
                             "SET_VRING_BASE");
    if (!rc) {
        if (packed) {
            struct vhd_chaos_pd d[3];
            p_std(&s, d);
            vhd_chaos__packed_publish(&s, OFF_R0, d, 3);
        } else {
            b_control(&s);
        }
        w.area = map.p;
        running = pthread_create(&th, NULL, rewriter_run, &w) == 0;
        if (!running)
            rc = vhd_chaos__note(&s, -EAGAIN, "cannot start the rewriting thread");
        /* The ring must start while the thread rewrites, not before it got a CPU. */
        for (int ms = 0; running && __atomic_load_n(&w.passes, __ATOMIC_RELAXED) < 1000; ms++) {
            if (ms == s.tmo) {
                rc = vhd_chaos__note(&s, -ETIMEDOUT, "the rewriting thread did not run");
                break;
            }
            struct timespec ts = {0, 1000000};
            nanosleep(&ts, NULL);
        }
    }
    if (!rc)
        rc = inflight_start(&s);
    if (!rc && !(ctx->observed & VHD_CHAOS_NACK)) {
        struct vhd_chaos_used u;
        vhd_chaos__kick(&s, 0);
        rc = vhd_chaos__await_used(&s, OFF_R0, 0, &u, s.tmo);
        if (!rc)
            vhd_chaos__blk_classify(&s, &u, 0);
    }
    if (running) {
        __atomic_store_n(&w.stop, 1, __ATOMIC_RELAXED);
        pthread_join(th, NULL);
    }
    vhd_chaos__close(&s);
    if (map.p)
        munmap(map.p, map.len);
    return rc;
}

static int inflight_rewrite(struct vhd_chaos_ctx *ctx, bool packed)
{
    unsigned seen = 0;
    int rc = 0;
    for (unsigned i = 0; i < REWRITE_ROUNDS && !rc; i++) {
        ctx->observed = 0; /* each round starts its ring whatever the last one saw */
        rc = inflight_rewrite_round(ctx, packed);
        seen |= ctx->observed;
    }
    ctx->observed = seen;
    return rc;
}

VHD_CHAOS_VARIANT(c_inflight_rewritten, inflight_rewrite, false)
VHD_CHAOS_VARIANT(c_p_inflight_rewritten, inflight_rewrite, true)

const struct vhd_chaos_case vhd_chaos__chain_cases[] = {
    BLK(control, CHAINS, S),
    BLK(loop, CHAINS, B),
    BLK(longer_than_queue, CHAINS, B),
    BLK(head_oob, CHAINS, B),
    BLK(next_oob, CHAINS, B),
    BLK(avail_jump, CHAINS, B),
    BLK(addr_outside, CHAINS, B | E),
    BLK(addr_past_end, CHAINS, B | E),
    BLK(len_wraps, CHAINS, B | E),
    BLK(write_before_read, CHAINS, B),
    BLK(status_readonly, CHAINS, B),
    BLK(hdr_short, CHAINS, E),
    BLK(zero_len, CHAINS, E | B),
    BLK(sector_oob, CHAINS, E),
    BLK(len_unaligned, CHAINS, E),
    BLK(bad_type, CHAINS, E),
    BLK(in_readonly_data, CHAINS, E | B | S),
    BLK(out_writable_data, CHAINS, E | B | S),
    BLK(get_id_short, CHAINS, S | E),
    BLK(many_segments, CHAINS, E | B | S),
    BLK(base_ahead, CHAINS, B),
    BLKD(crosses_regions, CHAINS, S),
    BLK(data_over_desc, CHAINS, S | B),
    BLK(rings_alias, CHAINS, N | B | S),
    BLK(call_eventfd_full, CHAINS, S | B),
    BLK(err_eventfd_full, CHAINS, B),
    BLK(call_nonblock_cleared, CHAINS, S),
    BLK(truncated_pages, CHAINS, B),
    BLK(random_chains, CHAINS, E | B | S),
    BLK(gpa_top, CHAINS, S),
    BLK(gpa_top_past_end, CHAINS, B | E),
    BLK(inflight_control, CHAINS, S),
    BLK(inflight_records, CHAINS, N | B),
    BLK(inflight_all_ff, CHAINS, N | B),
    BLK(inflight_resubmit, CHAINS, S),
    BLK(inflight_resubmit_loop, CHAINS, B),
    BLK(inflight_resubmit_outside, CHAINS, B),
    BLK(p_inflight_records, CHAINS, N | B),
    BLK(p_inflight_all_ff, CHAINS, N | B),
    BLK(inflight_rewritten, CHAINS, N | B | E | S),
    BLK(p_inflight_rewritten, CHAINS, N | B | E | S),
    BLK(ind_control, CHAINS, S),
    BLK(ind_nested, CHAINS, B),
    BLK(ind_with_next, CHAINS, B),
    BLK(ind_loop, CHAINS, B),
    BLK(ind_len_bad, CHAINS, B),
    BLK(ind_outside, CHAINS, B),
    BLK(ind_not_negotiated, CHAINS, B),
    BLK(p_control, CHAINS, S),
    BLK(p_id_oob, CHAINS, B),
    BLK(p_write_before_read, CHAINS, B),
    BLK(p_addr_outside, CHAINS, B | E),
    BLK(p_hdr_short, CHAINS, E),
    BLK(p_endless, CHAINS, B),
    BLK(p_ind_nested, CHAINS, B),
    BLK(p_ind_in_chain, CHAINS, B),
    BLK(p_status_readonly, CHAINS, B),
    NET(net_control, CHAINS, S),
    NET(net_hdr_short, CHAINS, E),
    NET(net_tx_loop, CHAINS, B),
    NET(net_rx_readonly, CHAINS, B),
    NET(net_rx_tiny, CHAINS, E),
    NET(net_tx_oversize, CHAINS, E),
    NET(net_ctrl_control, CHAINS, S),
    NET(net_ctrl_short, CHAINS, E),
    NET(net_ctrl_mac_table, CHAINS, E),
    NET(net_ctrl_no_ack, CHAINS, E),
    NET(net_random, CHAINS, E | B | S),
};
const unsigned vhd_chaos__chain_ncases = VHD_ARRAY_SIZE(vhd_chaos__chain_cases);
