/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Chaos cases of the device IOTLB (VIRTIO_F_ACCESS_PLATFORM): a front-end
 * that gives ring and buffer addresses as IOVAs and sends the translations
 * with VHOST_USER_IOTLB_MSG — well (misses answered, invalidations) and
 * badly (updates outside memory, zero and huge sizes, bad access flags,
 * read-only buffers the device must write, misses never answered,
 * invalidations while requests are in flight). The memory check of every
 * case proves the back-end wrote nothing the IOTLB did not allow.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* struct ucred */
#endif
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/compiler.h"
#include "spec/virtio_blk.h"
#include "vu_chaos_int.h"

/* Window-0 offset off is at IOVA IOVA_BASE + off (far from every GPA and UVA). */
#define IOVA_BASE  0x40000000000ull
#define RING_BYTES 0x3000u /* descriptors, avail and used of ring 0 at OFF_R0 */
#define BUF_BYTES  (0x10000 - OFF_HDR + 0x10000) /* headers, status bytes, data */

static uint64_t iova(size_t off)
{
    return IOVA_BASE + off;
}

static uint64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void ms_nap(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* An IOTLB message with NEED_REPLY: 0 (acked), VHD_CHAOS_NACK, VHD_CHAOS_CLOSED or -errno. */
static int iotlb_msg(struct vhd_chaos_sess *s, uint8_t type, uint64_t iv, uint64_t size,
                     uint64_t uva, uint8_t perm)
{
    struct vu_iotlb m = {.iova = iv, .size = size, .uva = uva, .perm = perm, .type = type};
    return vhd_chaos__ack(s, VHOST_USER_IOTLB_MSG, &m, sizeof(m), NULL, 0);
}

/* Map window-0 bytes [off, off + len) at their IOVA. */
static int map(struct vhd_chaos_sess *s, size_t off, size_t len, uint8_t perm)
{
    return iotlb_msg(s, VHOST_IOTLB_UPDATE, iova(off), len, vhd_chaos__uva(s, off), perm);
}

/* Ring q laid out at window offset off: SET_VRING_ADDR with its IOVAs, then call, kick, enable. */
static int start_at_iova(struct vhd_chaos_sess *s, uint32_t q, size_t off)
{
    int rc = vhd_chaos__must(
        s, vhd_chaos__set_addr(s, q, iova(off), iova(off + RING_AVAIL), iova(off + RING_USED)),
        "SET_VRING_ADDR (IOVAs)");
    return rc ? rc : vhd_chaos__ring_steps(s, q, off, VHD_STEP_CALL, VHD_STEP_END);
}

/* UPDATE of the headers, status bytes and data of window 0, read-write (what: the step). */
static int map_bufs(struct vhd_chaos_sess *s, const char *what)
{
    return vhd_chaos__must(s, map(s, OFF_HDR, BUF_BYTES, VHOST_ACCESS_RW), what);
}

/*
 * A blk session with ACCESS_PLATFORM and the virtio features in extra, ring
 * 0 at the IOVAs of OFF_R0 and started; before its SET_VRING_ADDR, the ring
 * is mapped when map_ring and the buffers when bufs.
 */
static int blk_at_iova(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, uint64_t extra,
                       bool map_ring, bool bufs)
{
    int rc = vhd_chaos__steps(ctx, s, UPTO(ADDR, .virtio = BIT(VIRTIO_F_ACCESS_PLATFORM) | extra));
    if (!rc && map_ring)
        rc = vhd_chaos__must(s, map(s, OFF_R0, RING_BYTES, VHOST_ACCESS_RW), "IOTLB ring UPDATE");
    if (!rc && bufs)
        rc = map_bufs(s, "IOTLB buffer UPDATE");
    return rc ? rc : start_at_iova(s, 0, OFF_R0);
}

/* A split blk session at IOVAs (ring 0 mapped first when map_ring). */
static int iotlb_blk(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, bool map_ring)
{
    return blk_at_iova(ctx, s, 0, map_ring, false);
}

/* The same with the ring mapped, then the buffers (what: that UPDATE's step). */
static int iotlb_blk_mapped(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, const char *what)
{
    int rc = iotlb_blk(ctx, s, true);
    return rc ? rc : map_bufs(s, what);
}

/*
 * blk IN request k ([hdr][4 KiB data][status]) as descriptors 3k..3k+2 at
 * IOVAs, made available at avail index k + 1.
 */
static void post_in(struct vhd_chaos_sess *s, unsigned k)
{
    uint16_t d = (uint16_t)(3 * k);
    vhd_chaos__blk_hdr(s, k, VIRTIO_BLK_T_IN, 8);
    vhd_chaos__allow(s, OFF_STAT + 64u * k, 1);
    vhd_chaos__allow(s, OFF_DATA + 4096u * k, 4096);
    vhd_chaos__sdesc(s, OFF_R0, d, iova(OFF_HDR + 64u * k), sizeof(struct virtio_blk_outhdr),
                     VRING_DESC_F_NEXT, (uint16_t)(d + 1));
    vhd_chaos__sdesc(s, OFF_R0, (uint16_t)(d + 1), iova(OFF_DATA + 4096u * k), 4096,
                     VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, (uint16_t)(d + 2));
    vhd_chaos__sdesc(s, OFF_R0, (uint16_t)(d + 2), iova(OFF_STAT + 64u * k), 1, VRING_DESC_F_WRITE,
                     0);
    vhd_chaos__split_publish(s, OFF_R0, d, (uint16_t)(k + 1));
}

/* Kick and wait for request k's fate (used element k). */
static int go(struct vhd_chaos_sess *s, unsigned k, int ms)
{
    struct vhd_chaos_used u;
    vhd_chaos__kick(s, 0);
    int rc = vhd_chaos__await_used(s, OFF_R0, (uint16_t)k, &u, ms);
    if (!rc)
        vhd_chaos__blk_classify(s, &u, k);
    return rc;
}

/*
 * Wait up to ms for a BACKEND_IOTLB_MSG MISS on the back-end channel
 * (other back-end messages are skipped). 0 and *iv, *perm; -ETIMEDOUT;
 * -EPROTO for a MISS that asks for a reply (it must not).
 */
static int await_miss(struct vhd_chaos_sess *s, uint64_t *iv, uint8_t *perm, int ms)
{
    uint64_t t0 = ms_now();

    while (s->be_fd >= 0) {
        long left = ms - (long)(ms_now() - t0);
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {.fd = s->be_fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        struct vu_hdr h;
        union vu_payload pl;
        if (read(s->be_fd, &h, sizeof(h)) != (ssize_t)sizeof(h) || h.size > sizeof(pl) ||
            (h.size && read(s->be_fd, &pl, h.size) != (ssize_t)h.size))
            return -EIO;
        if (h.request != VHOST_USER_BACKEND_IOTLB_MSG)
            continue;
        if (h.size != sizeof(struct vu_iotlb) || pl.iotlb.type != VHOST_IOTLB_MISS)
            return -EPROTO;
        if (h.flags & VHOST_USER_NEED_REPLY_MASK)
            return -EPROTO;
        *iv = pl.iotlb.iova;
        *perm = pl.iotlb.perm;
        return 0;
    }
    return -ENOTCONN;
}

/* Post request k and kick: served (its fate classified, as go). */
static int serve_in(struct vhd_chaos_sess *s, unsigned k)
{
    post_in(s, k);
    return go(s, k, s->tmo);
}

/* Post request k and kick: 0 and the MISS it causes in *iv, *perm, or -EIO ("no <what>"). */
static int in_misses(struct vhd_chaos_sess *s, unsigned k, uint64_t *iv, uint8_t *perm,
                     const char *what)
{
    post_in(s, k);
    vhd_chaos__kick(s, 0);
    int rc = await_miss(s, iv, perm, s->tmo);
    return rc ? vhd_chaos__note(s, -EIO, "no %s (%s)", what, strerror(-rc)) : 0;
}

/* Everything mapped read-write: the request is served (the control case). */
static int c_iotlb_control(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk_mapped(ctx, &s, "IOTLB buffer UPDATE");
    if (!rc)
        rc = serve_in(&s, 0);
    vhd_chaos__close(&s);
    return rc;
}

/*
 * Buffers not mapped: the device asks (one MISS, no reply wanted, for the
 * header page, read access), the request waits in the ring, and is served
 * once the UPDATE came.
 */
static int c_iotlb_miss_answered(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    uint64_t iv = 0;
    uint8_t perm = 0;
    int rc = iotlb_blk(ctx, &s, true);
    if (!rc)
        rc = in_misses(&s, 0, &iv, &perm, "IOTLB miss for the buffers");
    if (!rc && (iv != (iova(OFF_HDR) & ~0xfffull) || perm != VHOST_ACCESS_RO))
        rc = vhd_chaos__note(&s, -EIO, "miss for 0x%llx perm %u, not the header page",
                             (unsigned long long)iv, perm);
    if (!rc && *vhd_chaos__hva(&s, OFF_R0 + RING_USED + 2) != 0)
        rc = vhd_chaos__note(&s, -EIO, "request completed before its translation");
    if (!rc)
        rc = map_bufs(&s, "IOTLB UPDATE answering the miss");
    if (!rc)
        rc = go(&s, 0, s.tmo);
    vhd_chaos__close(&s);
    return rc;
}

/*
 * CPU time (ms) the daemon's main thread, its control thread, used so far:
 * the session's peer, found through SO_PEERCRED. 0 when unknown.
 */
static uint64_t ctl_cpu_ms(const struct vhd_chaos_sess *s)
{
    struct ucred uc;
    socklen_t ul = sizeof(uc);
    char path[64], buf[1024];
    unsigned long ut = 0, st = 0;

    if (getsockopt(s->fd, SOL_SOCKET, SO_PEERCRED, &uc, &ul) < 0 || uc.pid <= 0)
        return 0;
    snprintf(path, sizeof(path), "/proc/%d/task/%d/stat", (int)uc.pid, (int)uc.pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *p = strrchr(buf, ')'); /* the name may hold spaces */
    if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return 0;
    return (uint64_t)(ut + st) * 1000u / (uint64_t)sysconf(_SC_CLK_TCK);
}

/*
 * The data buffer is mapped only in part: [OFF_DATA, +0x800) while the
 * descriptor is [OFF_DATA + 0x400, +0x800). The translation misses at
 * OFF_DATA + 0x800, inside a page whose first byte is mapped: the MISS must
 * be for that byte (not the page, which is already translated: the device
 * would clear and retry it forever), the device must sit idle while it
 * waits, and the request is served once the rest comes.
 */
static int c_iotlb_miss_mid_page(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    uint64_t iv = 0;
    uint8_t perm = 0;
    int rc = iotlb_blk(ctx, &s, true);
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_HDR, OFF_DATA - OFF_HDR, VHOST_ACCESS_RW),
                             "IOTLB header/status UPDATE");
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_DATA, 0x800, VHOST_ACCESS_RW),
                             "IOTLB UPDATE of half a page");
    if (!rc) {
        vhd_chaos__blk_hdr(&s, 0, VIRTIO_BLK_T_IN, 8);
        vhd_chaos__allow(&s, OFF_STAT, 1);
        vhd_chaos__allow(&s, OFF_DATA + 0x400, 0x800);
        vhd_chaos__sdesc(&s, OFF_R0, 0, iova(OFF_HDR), sizeof(struct virtio_blk_outhdr),
                         VRING_DESC_F_NEXT, 1);
        vhd_chaos__sdesc(&s, OFF_R0, 1, iova(OFF_DATA + 0x400), 0x800,
                         VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
        vhd_chaos__sdesc(&s, OFF_R0, 2, iova(OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
        vhd_chaos__split_publish(&s, OFF_R0, 0, 1);
        vhd_chaos__kick(&s, 0);
        rc = await_miss(&s, &iv, &perm, s.tmo);
        if (rc)
            rc = vhd_chaos__note(&s, -EIO, "no IOTLB miss for the unmapped half (%s)",
                                 strerror(-rc));
    }
    if (!rc && (iv != iova(OFF_DATA + 0x800) || perm != VHOST_ACCESS_WO))
        rc = vhd_chaos__note(&s, -EIO, "miss for 0x%llx perm %u, not the first unmapped byte",
                             (unsigned long long)iv, perm);
    if (!rc) {
        uint64_t c0 = ctl_cpu_ms(&s);
        ms_nap(1000);
        uint64_t used = ctl_cpu_ms(&s) - c0;
        if (used > 150)
            rc = vhd_chaos__note(&s, -EIO, "%llu ms of CPU in 1 s waiting for a miss's answer",
                                 (unsigned long long)used);
    }
    if (!rc && *vhd_chaos__hva(&s, OFF_R0 + RING_USED + 2) != 0)
        rc = vhd_chaos__note(&s, -EIO, "request completed before its translation");
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_DATA + 0x800, 0x800, VHOST_ACCESS_RW),
                             "IOTLB UPDATE answering the miss");
    if (!rc)
        rc = go(&s, 0, s.tmo);
    vhd_chaos__close(&s);
    return rc;
}

/* Rings not mapped at start: misses for them first, every one answered, then served. */
static int c_iotlb_ring_miss(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk(ctx, &s, false);
    if (!rc)
        post_in(&s, 0);
    for (int i = 0; !rc && i < 8; i++) {
        uint64_t iv;
        uint8_t perm;
        vhd_chaos__kick(&s, 0);
        if (await_miss(&s, &iv, &perm, 300) < 0)
            break; /* nothing more to ask */
        uint64_t off = iv - IOVA_BASE;
        if (iv < IOVA_BASE || off >= VHD_CHAOS_WIN_SIZE) {
            rc = vhd_chaos__note(&s, -EIO, "miss outside what was given: 0x%llx",
                                 (unsigned long long)iv);
            break;
        }
        rc = vhd_chaos__must(&s, map(&s, off, 4096, VHOST_ACCESS_RW), "UPDATE for a miss");
    }
    if (!rc)
        rc = go(&s, 0, s.tmo);
    vhd_chaos__close(&s);
    return rc;
}

/* The buffer the device must write is mapped read-only: nothing written, the request fails. */
static int c_iotlb_ro_write(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk_mapped(ctx, &s, "IOTLB UPDATE");
    /* an overlapping UPDATE: the data page read-only */
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_DATA, 4096, VHOST_ACCESS_RO), "IOTLB RO UPDATE");
    if (!rc) {
        post_in(&s, 0);
        s.ctx->nallow = 0; /* the data page may not change; the status byte may */
        vhd_chaos__allow(&s, OFF_STAT, 1);
        rc = go(&s, 0, s.tmo);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* UPDATEs of front-end addresses outside every region, or running past one: refused. */
static int c_iotlb_update_outside(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk(ctx, &s, true);
    if (!rc) {
        vhd_chaos__observe(&s, iotlb_msg(&s, VHOST_IOTLB_UPDATE, iova(0), 4096, 0x1000, 3),
                           "UPDATE of unmapped front-end memory");
        vhd_chaos__observe(&s,
                           iotlb_msg(&s, VHOST_IOTLB_UPDATE, iova(0), 2 * VHD_CHAOS_WIN_SIZE,
                                     vhd_chaos__uva(&s, 0), 3),
                           "UPDATE running past the window");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* Zero and huge sizes, bad access flags, unknown types, a MISS sent to us: refused. */
static int c_iotlb_bad_msgs(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk(ctx, &s, true);
    uint64_t u = 0;
    if (!rc) {
        u = vhd_chaos__uva(&s, OFF_DATA);
        vhd_chaos__observe(&s, iotlb_msg(&s, VHOST_IOTLB_UPDATE, iova(OFF_DATA), 0, u, 3),
                           "UPDATE of size 0");
        vhd_chaos__observe(&s, iotlb_msg(&s, VHOST_IOTLB_UPDATE, iova(OFF_DATA), UINT64_MAX, u, 3),
                           "UPDATE of size 2^64 - 1");
        vhd_chaos__observe(&s, iotlb_msg(&s, VHOST_IOTLB_UPDATE, UINT64_MAX, 2, u, 3),
                           "UPDATE wrapping the IOVA space");
        vhd_chaos__observe(&s, iotlb_msg(&s, VHOST_IOTLB_UPDATE, iova(OFF_DATA), 4096, u, 0),
                           "UPDATE without access");
        vhd_chaos__observe(&s, iotlb_msg(&s, VHOST_IOTLB_UPDATE, iova(OFF_DATA), 4096, u, 0x83),
                           "UPDATE with unknown access bits");
        vhd_chaos__observe(&s, iotlb_msg(&s, VHOST_IOTLB_MISS, iova(OFF_DATA), 4096, u, 3),
                           "MISS sent to the back-end");
        vhd_chaos__observe(&s, iotlb_msg(&s, 77, iova(OFF_DATA), 4096, u, 3), "unknown type");
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * Duplicate and overlapping UPDATEs (the last one wins where they overlap)
 * and invalidations of what was never mapped (acked at once): the request
 * is still served.
 */
static int c_iotlb_overlap_dup(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk(ctx, &s, true);
    for (int i = 0; !rc && i < 2; i++)
        rc = map_bufs(&s, "duplicate UPDATE");
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_DATA + 2048, 4096, VHOST_ACCESS_RW),
                             "overlapping UPDATE");
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_R0, RING_BYTES, VHOST_ACCESS_RW), "ring UPDATE again");
    if (!rc)
        rc = vhd_chaos__must(
            &s, iotlb_msg(&s, VHOST_IOTLB_INVALIDATE, 0x7000000000ull, 1ull << 30, 0, 0),
            "INVALIDATE of what was never mapped");
    if (!rc)
        rc = serve_in(&s, 0);
    vhd_chaos__close(&s);
    return rc;
}

/*
 * INVALIDATE is acked; the next request touching the range misses (and is
 * not served before the UPDATE), then completes.
 */
static int c_iotlb_invalidate(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    uint64_t iv = 0;
    uint8_t perm = 0;
    int rc = iotlb_blk_mapped(ctx, &s, "IOTLB UPDATE");
    if (!rc)
        rc = serve_in(&s, 0);
    if (!rc)
        rc = vhd_chaos__must(
            &s, iotlb_msg(&s, VHOST_IOTLB_INVALIDATE, iova(OFF_DATA + 4096), 4096, 0, 0),
            "INVALIDATE");
    if (!rc)
        rc = in_misses(&s, 1, &iv, &perm, "miss after the invalidation");
    if (!rc && (iv != iova(OFF_DATA + 4096) || perm != VHOST_ACCESS_WO))
        rc = vhd_chaos__note(&s, -EIO, "miss for 0x%llx perm %u, not the invalidated page",
                             (unsigned long long)iv, perm);
    if (!rc && *vhd_chaos__hva(&s, OFF_STAT + 64) != 0xff)
        rc = vhd_chaos__note(&s, -EIO, "request served through an invalidated translation");
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_DATA + 4096, 4096, VHOST_ACCESS_RW), "UPDATE again");
    if (!rc)
        rc = go(&s, 1, s.tmo);
    vhd_chaos__close(&s);
    return rc;
}

/*
 * Request 0 served, then flush drops every translation: request 1 misses on
 * the rings first (noted "no <after>" when nothing misses); rings and
 * buffers mapped again, it is served.
 */
static int rings_miss_after(struct vhd_chaos_ctx *ctx, int (*flush)(struct vhd_chaos_sess *),
                            const char *after)
{
    struct vhd_chaos_sess s;
    uint64_t iv = 0;
    uint8_t perm;
    int rc = iotlb_blk_mapped(ctx, &s, "IOTLB UPDATE");
    if (!rc)
        rc = serve_in(&s, 0);
    if (!rc)
        rc = flush(&s);
    if (!rc)
        rc = in_misses(&s, 1, &iv, &perm, after);
    if (!rc && (iv < iova(OFF_R0) || iv >= iova(OFF_R0 + RING_BYTES)))
        rc = vhd_chaos__note(&s, -EIO, "first miss at 0x%llx, not on the rings",
                             (unsigned long long)iv);
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_R0, RING_BYTES, VHOST_ACCESS_RW), "ring UPDATE");
    if (!rc)
        rc = map_bufs(&s, "buffer UPDATE");
    if (!rc)
        rc = go(&s, 1, s.tmo);
    vhd_chaos__close(&s);
    return rc;
}

static int invalidate_all(struct vhd_chaos_sess *s)
{
    return vhd_chaos__must(s, iotlb_msg(s, VHOST_IOTLB_INVALIDATE, 0, 0, 0, 0),
                           "INVALIDATE of size 0");
}

/*
 * INVALIDATE of size 0 (how QEMU's full device-IOTLB flush arrives: its
 * 2^64-byte range wraps) drops everything: the next request misses on the
 * rings first.
 */
VHD_CHAOS_VARIANT(c_iotlb_invalidate_all, rings_miss_after, invalidate_all,
                  "miss after a full invalidation")

/*
 * Invalidations while requests are in flight: once INVALIDATE is acked,
 * nothing completes and no buffer byte changes until the range is mapped
 * again.
 */
static int c_iotlb_invalidate_inflight(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk_mapped(ctx, &s, "IOTLB UPDATE");
    if (!rc) {
        for (unsigned k = 0; k < 2; k++)
            post_in(&s, k);
        vhd_chaos__kick(&s, 0);
        rc = vhd_chaos__must(&s,
                             iotlb_msg(&s, VHOST_IOTLB_INVALIDATE, iova(OFF_DATA), 0x10000, 0, 0),
                             "INVALIDATE under load");
    }
    if (!rc) {
        uint16_t used0 = *(volatile uint16_t *)(void *)vhd_chaos__hva(&s, OFF_R0 + RING_USED + 2);
        uint8_t snap[2 * 4096];
        memcpy(snap, vhd_chaos__hva(&s, OFF_DATA), sizeof(snap));
        ms_nap(50);
        uint16_t used1 = *(volatile uint16_t *)(void *)vhd_chaos__hva(&s, OFF_R0 + RING_USED + 2);
        if (used1 != used0 || memcmp(snap, vhd_chaos__hva(&s, OFF_DATA), sizeof(snap)) != 0)
            rc = vhd_chaos__note(&s, -EIO, "a buffer was touched after its invalidation was acked");
    }
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_DATA, 0x10000, VHOST_ACCESS_RW), "UPDATE again");
    if (!rc)
        rc = go(&s, 1, s.tmo);
    vhd_chaos__close(&s);
    return rc;
}

/*
 * A front-end that never answers a miss: the request is not served, and
 * the device ends broken (NEEDS_RESET) after the miss timeout, not hung.
 */
static int c_iotlb_miss_unanswered(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    uint64_t iv;
    uint8_t perm;
    int rc = iotlb_blk(ctx, &s, true);
    if (!rc)
        rc = in_misses(&s, 0, &iv, &perm, "IOTLB miss");
    if (!rc) {
        uint64_t t0 = ms_now();
        rc = go(&s, 0, 8000); /* VHD_VU_IOTLB_MISS_TIMEOUT_MS is 5 s */
        if (!rc && !(s.ctx->observed & VHD_CHAOS_BROKEN))
            rc = vhd_chaos__note(&s, -EIO, "not broken %llu ms after an unanswered miss",
                                 (unsigned long long)(ms_now() - t0));
    }
    vhd_chaos__close(&s);
    return rc;
}

static int mem_table_again(struct vhd_chaos_sess *s)
{
    return vhd_chaos__must(s, vhd_chaos__mem_default(s), "SET_MEM_TABLE again");
}

/*
 * A new memory table (the same regions sent again) flushes the IOTLB: the
 * next request misses on the rings, then on its buffers; answered, served.
 */
VHD_CHAOS_VARIANT(c_iotlb_mem_table_flush, rings_miss_after, mem_table_again,
                  "miss after the new memory table")

/* ---- packed rings ---- */

/* A packed blk session at IOVAs, rings and buffers mapped (buffers: only when bufs). */
static int iotlb_blk_packed(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, bool bufs)
{
    return blk_at_iova(ctx, s, BIT(VIRTIO_F_RING_PACKED), true, bufs);
}

static void packed_in(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_pd d[3] = {
        {iova(OFF_HDR), 16, 0, VRING_DESC_F_NEXT},
        {iova(OFF_DATA), 4096, 0, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE},
        {iova(OFF_STAT), 1, 0, VRING_DESC_F_WRITE},
    };
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    vhd_chaos__allow(s, OFF_STAT, 1);
    vhd_chaos__allow(s, OFF_DATA, 4096);
    vhd_chaos__packed_publish(s, OFF_R0, d, 3);
}

/* Packed ring at IOVAs, everything mapped: served. */
static int c_iotlb_packed_control(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk_packed(ctx, &s, true);
    if (!rc) {
        packed_in(&s);
        rc = go(&s, 0, s.tmo);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* Packed ring, buffers not mapped: a miss, the descriptors left in place, served after it. */
static int c_iotlb_packed_miss(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    uint64_t iv;
    uint8_t perm;
    int rc = iotlb_blk_packed(ctx, &s, false);
    if (!rc) {
        packed_in(&s);
        vhd_chaos__kick(&s, 0);
        rc = await_miss(&s, &iv, &perm, s.tmo);
        if (rc)
            rc = vhd_chaos__note(&s, -EIO, "no IOTLB miss (%s)", strerror(-rc));
    }
    if (!rc)
        rc = map_bufs(&s, "UPDATE answering the miss");
    if (!rc)
        rc = go(&s, 0, s.tmo);
    vhd_chaos__close(&s);
    return rc;
}

/* ---- net (loopback): receive ring 0 at OFF_R0, transmit ring 1 at OFF_R1 ---- */

/* Ring q at window offset off, started at its IOVAs. */
static int ring_at_iova(struct vhd_chaos_sess *s, uint32_t q, size_t off)
{
    int rc = vhd_chaos__ring_steps(s, q, off, VHD_STEP_LAYOUT, VHD_STEP_ADDR);
    return rc ? rc : start_at_iova(s, q, off);
}

/*
 * A net session with ACCESS_PLATFORM: both rings mapped and started at
 * IOVAs; the transmit buffer mapped read-only and the receive buffer with
 * rx_perm (0: neither buffer mapped). A broadcast frame is ready in the
 * transmit buffer, a 2 KiB receive buffer posted.
 */
static int iotlb_net(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, uint8_t rx_perm)
{
    int rc = vhd_chaos__steps(ctx, s, UPTO(LAYOUT, .virtio = BIT(VIRTIO_F_ACCESS_PLATFORM)));
    if (!rc)
        rc = vhd_chaos__must(s, map(s, OFF_R0, 0x6000, VHOST_ACCESS_RW), "IOTLB ring UPDATE");
    if (!rc && rx_perm)
        rc = vhd_chaos__must(s, map(s, OFF_TXBUF, 0x1000, VHOST_ACCESS_RO), "IOTLB tx UPDATE");
    if (!rc && rx_perm)
        rc = vhd_chaos__must(s, map(s, OFF_RXBUF, 0x1000, rx_perm), "IOTLB rx UPDATE");
    if (!rc)
        rc = ring_at_iova(s, 0, OFF_R0);
    if (!rc)
        rc = ring_at_iova(s, 1, OFF_R1);
    if (rc)
        return rc;
    vhd_chaos__net_frame(s);
    vhd_chaos__sdesc(s, OFF_R0, 0, iova(OFF_RXBUF), 2048, VRING_DESC_F_WRITE, 0);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
    vhd_chaos__kick(s, 0);
    vhd_chaos__sdesc(s, OFF_R1, 0, iova(OFF_TXBUF), NET_HDR + PKT_LEN, 0, 0);
    return 0;
}

/* Frames through IOVAs both ways: delivered. */
static int c_iotlb_net_control(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_net(ctx, &s, VHOST_ACCESS_WO);
    vhd_chaos__allow(&s, OFF_RXBUF, 2048);
    if (!rc)
        rc = vhd_chaos__net_go(&s, true, s.tmo);
    vhd_chaos__close(&s);
    return rc;
}

/* The receive buffer mapped read-only: never written; the frame is not delivered. */
static int c_iotlb_net_rx_ro(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_net(ctx, &s, VHOST_ACCESS_RO);
    if (!rc)
        rc = vhd_chaos__net_go(&s, true, 300);
    vhd_chaos__close(&s);
    return rc;
}

/*
 * Buffers not mapped: the transmit descriptor stays in its ring (nothing
 * used) while the miss is out; after the UPDATEs the frame goes through.
 */
static int c_iotlb_net_tx_miss(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    uint64_t iv;
    uint8_t perm;
    int rc = iotlb_net(ctx, &s, 0);
    vhd_chaos__allow(&s, OFF_RXBUF, 2048);
    if (!rc) {
        vhd_chaos__split_publish(&s, OFF_R1, 0, 1);
        vhd_chaos__kick(&s, 1);
        rc = await_miss(&s, &iv, &perm, s.tmo);
        if (rc)
            rc = vhd_chaos__note(&s, -EIO, "no IOTLB miss (%s)", strerror(-rc));
    }
    if (!rc && *vhd_chaos__hva(&s, OFF_R1 + RING_USED + 2) != 0)
        rc = vhd_chaos__note(&s, -EIO, "transmit used before its buffer was mapped");
    /*
     * The receive buffer first: a frame that meets an unmapped receive
     * buffer is dropped as if none were posted (its miss is asked so the
     * next frame gets through), and the transmit goes on as soon as its
     * own UPDATE comes.
     */
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_RXBUF, 0x1000, VHOST_ACCESS_WO), "rx UPDATE");
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_TXBUF, 0x1000, VHOST_ACCESS_RO), "tx UPDATE");
    if (!rc)
        rc = vhd_chaos__net_go(&s, false, s.tmo);
    vhd_chaos__close(&s);
    return rc;
}

/* Request slot k (0 or 1) as descriptors 3k..3k+2, made available at avail index idx. */
static void post_in_at(struct vhd_chaos_sess *s, unsigned k, uint16_t idx)
{
    uint16_t d = (uint16_t)(3 * k);
    vhd_chaos__blk_hdr(s, k, VIRTIO_BLK_T_IN, 8 * k);
    vhd_chaos__sdesc(s, OFF_R0, d, iova(OFF_HDR + 64u * k), sizeof(struct virtio_blk_outhdr),
                     VRING_DESC_F_NEXT, (uint16_t)(d + 1));
    vhd_chaos__sdesc(s, OFF_R0, (uint16_t)(d + 1), iova(OFF_DATA + 4096u * k), 4096,
                     VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, (uint16_t)(d + 2));
    vhd_chaos__sdesc(s, OFF_R0, (uint16_t)(d + 2), iova(OFF_STAT + 64u * k), 1, VRING_DESC_F_WRITE,
                     0);
    vhd_chaos__split_publish(s, OFF_R0, d, idx);
}

int vhd_chaos_iotlb_latency(struct vhd_chaos_ctx *ctx, unsigned rounds, uint64_t *ns)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk_mapped(ctx, &s, "IOTLB UPDATE");
    vhd_chaos__allow(&s, OFF_STAT, 64 + 1);
    vhd_chaos__allow(&s, OFF_DATA, 2 * 4096);
    for (unsigned r = 0; !rc && r < rounds; r++) {
        struct vhd_chaos_used u;
        post_in_at(&s, 0, (uint16_t)(2 * r + 1));
        post_in_at(&s, 1, (uint16_t)(2 * r + 2));
        vhd_chaos__kick(&s, 0);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        rc = vhd_chaos__must(
            &s, iotlb_msg(&s, VHOST_IOTLB_INVALIDATE, iova(OFF_DATA), 0x10000, 0, 0), "INVALIDATE");
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ns[r] = (uint64_t)(t1.tv_sec - t0.tv_sec) * 1000000000u + (uint64_t)t1.tv_nsec -
                (uint64_t)t0.tv_nsec;
        if (!rc)
            rc = vhd_chaos__must(&s, map(&s, OFF_DATA, 0x10000, VHOST_ACCESS_RW), "UPDATE");
        if (!rc)
            vhd_chaos__kick(&s, 0); /* a request that missed is kicked by the UPDATE anyway */
        if (!rc)
            rc = vhd_chaos__await_used(&s, OFF_R0, (uint16_t)(2 * r + 1), &u, s.tmo);
        if (!rc && (!u.got || s.ctx->observed & VHD_CHAOS_BROKEN))
            rc = vhd_chaos__note(&s, -EIO, "round %u: requests not completed", r);
    }
    vhd_chaos__close(&s);
    return rc;
}

int vhd_chaos_iotlb_resend(struct vhd_chaos_ctx *ctx, unsigned n, bool *reduced_failed)
{
    struct vhd_chaos_sess s;
    int rc = iotlb_blk_mapped(ctx, &s, "IOTLB UPDATE");

    *reduced_failed = false;
    vhd_chaos__allow(&s, OFF_STAT, 64 + 1);
    vhd_chaos__allow(&s, OFF_DATA, 2 * 4096);
    for (unsigned r = 0; !rc && r < n; r++) {
        struct vhd_chaos_used u;
        post_in_at(&s, 0, (uint16_t)(2 * r + 1));
        post_in_at(&s, 1, (uint16_t)(2 * r + 2));
        vhd_chaos__kick(&s, 0);
        /* the same translation again, and again for the ring: QEMU re-sends */
        rc = map_bufs(&s, "identical UPDATE");
        if (!rc)
            rc = vhd_chaos__must(&s, map(&s, OFF_R0, RING_BYTES, VHOST_ACCESS_RW), "ring UPDATE");
        if (!rc)
            rc = vhd_chaos__await_used(&s, OFF_R0, (uint16_t)(2 * r + 1), &u, s.tmo);
        if (!rc && (!u.got || s.ctx->observed & VHD_CHAOS_BROKEN ||
                    vhd_chaos__blk_status(&s, 0) != VIRTIO_BLK_S_OK ||
                    vhd_chaos__blk_status(&s, 1) != VIRTIO_BLK_S_OK))
            rc = vhd_chaos__note(&s, -EIO, "round %u: requests not served", r);
    }
    /* taking write away from request 0's data page: its next read must not land */
    if (!rc)
        rc = vhd_chaos__must(&s, map(&s, OFF_DATA, 4096, VHOST_ACCESS_RO), "RO UPDATE");
    if (!rc) {
        struct vhd_chaos_used u;
        uint8_t before[64];
        memset(before, 0xa5, sizeof(before)); /* what no block of the image holds */
        vhd_chaos__put(&s, OFF_DATA, before, sizeof(before));
        post_in_at(&s, 0, (uint16_t)(2 * n + 1));
        vhd_chaos__kick(&s, 0);
        rc = vhd_chaos__await_used(&s, OFF_R0, (uint16_t)(2 * n), &u, s.tmo);
        if (!rc)
            *reduced_failed = (s.ctx->observed & VHD_CHAOS_BROKEN) ||
                              (u.got && vhd_chaos__blk_status(&s, 0) != VIRTIO_BLK_S_OK &&
                               !memcmp(before, vhd_chaos__hva(&s, OFF_DATA), sizeof(before)));
    }
    vhd_chaos__close(&s);
    return rc;
}

const struct vhd_chaos_case vhd_chaos__iotlb_cases[] = {
    BLK(iotlb_control, IOTLB, S),         BLK(iotlb_miss_answered, IOTLB, S),
    BLK(iotlb_miss_mid_page, IOTLB, S),   BLK(iotlb_ring_miss, IOTLB, S),
    BLK(iotlb_ro_write, IOTLB, B),        BLK(iotlb_update_outside, IOTLB, N),
    BLK(iotlb_bad_msgs, IOTLB, N),        BLK(iotlb_overlap_dup, IOTLB, S),
    BLK(iotlb_invalidate, IOTLB, S),      BLK(iotlb_invalidate_inflight, IOTLB, S),
    BLK(iotlb_invalidate_all, IOTLB, S),  BLK(iotlb_miss_unanswered, IOTLB, B),
    BLK(iotlb_mem_table_flush, IOTLB, S), BLK(iotlb_packed_control, IOTLB, S),
    BLK(iotlb_packed_miss, IOTLB, S),     NET(iotlb_net_control, IOTLB, S),
    NET(iotlb_net_rx_ro, IOTLB, B | E),   NET(iotlb_net_tx_miss, IOTLB, S),
};
const unsigned vhd_chaos__iotlb_ncases = VHD_ARRAY_SIZE(vhd_chaos__iotlb_cases);
