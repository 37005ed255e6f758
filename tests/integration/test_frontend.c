/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The userspace driver against the real daemon: each test starts build/vhostd
 * (VHD_VHOSTD, or next to this binary, or build/vhostd from the repo root;
 * skipped when absent) on a temporary image in a child process, drives it
 * through the vhost-user front-end and the virtio-blk driver over a real
 * socket, stops it with SIGTERM (exit status 0 expected) and checks the
 * image file. qemu-storage-daemon is driven the same way when installed.
 * Daemons die with the test (PR_SET_PDEATHSIG, atexit); every wait is bounded.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "driver/vu_frontend.h"
#include "harness.h"
#include "spec/vhost_user.h"
#include "transport/vu_sock.h"
#include "vhostd/blk_driver.h"

#define IMG_SIZE    (16ull << 20)
#define BS          4096u
#define WAIT_MS     5000
#define MAX_DAEMONS 2

#include "daemon_fixture.h"

/* ======================= daemons ======================= */

/* An executable from PATH, or NULL. */
static const char *find_in_path(const char *name, char *buf, size_t len)
{
    const char *p = getenv("PATH");
    if (!p)
        p = "/usr/bin:/bin";
    while (*p) {
        const char *e = strchr(p, ':');
        size_t l = e ? (size_t)(e - p) : strlen(p);
        snprintf(buf, len, "%.*s/%s", (int)l, p, name);
        if (executable(buf))
            return buf;
        p += l + (e ? 1 : 0);
    }
    return NULL;
}

/* Temp dir and image (zeroed, sparse) for a daemon. */
static void daemon_prepare(struct daemon *dm, uint64_t img_size)
{
    daemon_prepare_dir(dm, "vhd-test-fe-XXXXXX", "blk.sock");
    daemon_make_image(dm, img_size);
    track(dm);
}

/* Start vhostd with "--blk socket=...,image=...,<keys>" (keys may be ""). */
static void vhostd_start(struct daemon *dm, const char *keys)
{
    const char *bin = vhostd_path();
    char spec[PATH_MAX * 3];
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    snprintf(spec, sizeof(spec), "socket=%s,image=%s%s%s", dm->sock, dm->img, *keys ? "," : "",
             keys);
    char *argv[] = {(char *)bin, "--log-level", "warn", "--blk", spec, NULL};
    daemon_spawn(dm, argv);
}

/* ======================= data patterns ======================= */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Word at byte offset off (8-aligned) of the device under seed. */
static uint64_t pat(uint64_t off, uint64_t seed)
{
    return mix64(off ^ (seed * 0x9e3779b97f4a7c15ull)) | 1; /* never zero */
}

static void fill(void *buf, size_t len, uint64_t off, uint64_t seed)
{
    uint64_t *w = buf;
    for (size_t i = 0; i < len / 8; i++)
        w[i] = pat(off + i * 8, seed);
}

/* Returns -1 when buf holds the pattern, else the first bad byte offset in buf. */
static long mismatch(const void *buf, size_t len, uint64_t off, uint64_t seed)
{
    const uint64_t *w = buf;
    for (size_t i = 0; i < len / 8; i++)
        if (w[i] != pat(off + i * 8, seed))
            return (long)(i * 8);
    return -1;
}

static bool all_zero(const void *buf, size_t len)
{
    const uint8_t *b = buf;
    for (size_t i = 0; i < len; i++)
        if (b[i])
            return false;
    return true;
}

/* The image file holds the pattern of seed over [off, off + len). */
static void check_image(const char *img, uint64_t off, uint64_t len, uint64_t seed)
{
    int fd = open(img, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    uint8_t *buf = malloc(len);
    VHD_CHECK(buf);
    VHD_CHECK_EQ(pread(fd, buf, len, (off_t)off), (ssize_t)len);
    long bad = mismatch(buf, len, off, seed);
    if (bad >= 0)
        fprintf(stderr, "  image %s: mismatch at byte %llu\n", img,
                (unsigned long long)(off + (uint64_t)bad));
    VHD_CHECK_EQ(bad, -1);
    free(buf);
    close(fd);
}

static void check_image_zero(const char *img, uint64_t off, uint64_t len)
{
    int fd = open(img, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    uint8_t *buf = malloc(len);
    VHD_CHECK(buf);
    VHD_CHECK_EQ(pread(fd, buf, len, (off_t)off), (ssize_t)len);
    VHD_CHECK(all_zero(buf, len));
    free(buf);
    close(fd);
}

/* ======================= driver helpers ======================= */

static struct vhd_blkdrv *drv_connect_opts(struct vhd_blkdrv_opts *o)
{
    struct vhd_blkdrv *d = NULL;
    char err[256];
    if (!o->timeout_ms)
        o->timeout_ms = WAIT_MS;
    int rc = vhd_blkdrv_connect(o, &d, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  connect %s: %s\n", o->socket_path, err);
    VHD_CHECK_EQ(rc, 0);
    return d;
}

static struct vhd_blkdrv *drv_connect(const char *sock, uint32_t nq, bool packed)
{
    struct vhd_blkdrv_opts o = {.socket_path = sock, .num_queues = nq, .packed = packed};
    return drv_connect_opts(&o);
}

/* Wait for exactly one completion (bounded). */
static struct vhd_blkdrv_completion wait_one(struct vhd_blkdrv_queue *q)
{
    struct vhd_blkdrv_completion c;
    int n = vhd_blkdrv_wait(q, &c, 1, WAIT_MS);
    VHD_CHECK_EQ(n, 1);
    return c;
}

static int sync_read(struct vhd_blkdrv_queue *q, uint64_t off, void *buf, size_t len)
{
    int rc = vhd_blkdrv_submit_read(q, off, buf, len, buf);
    if (rc < 0)
        return rc;
    struct vhd_blkdrv_completion c = wait_one(q);
    VHD_CHECK(c.cookie == buf);
    return c.ret;
}

static int sync_write(struct vhd_blkdrv_queue *q, uint64_t off, const void *buf, size_t len)
{
    int rc = vhd_blkdrv_submit_write(q, off, buf, len, (void *)buf);
    if (rc < 0)
        return rc;
    struct vhd_blkdrv_completion c = wait_one(q);
    VHD_CHECK(c.cookie == buf);
    return c.ret;
}

static int sync_flush(struct vhd_blkdrv_queue *q)
{
    int rc = vhd_blkdrv_submit_flush(q, NULL);
    if (rc < 0)
        return rc;
    return wait_one(q).ret;
}

/*
 * A pipelined stream of BS-sized I/Os over [start, start + nblocks * BS) of
 * one queue, depth in flight, in a scrambled block order: writes stamp the
 * pattern of seed, reads check it. Completions alternate between polling
 * and waiting on the call eventfd when mixed is set.
 */
struct stream {
    struct vhd_blkdrv_queue *q;
    uint64_t start;
    uint32_t nblocks;
    uint32_t depth;
    uint64_t seed;
    bool write;
    bool mixed;
    int result; /* 0, or the first failure */
    char why[160];
};

static int run_stream(struct stream *s)
{
    struct vhd_blkdrv_completion c[16];
    uint8_t *bufs[16];
    uint32_t depth = s->depth > 16 ? 16 : s->depth, next = 0, done = 0, inflight = 0;
    uint64_t blk_of[16];
    int free_stack[16], nfree = 0;
    uint64_t t0 = ms_now();

    for (uint32_t i = 0; i < depth; i++) {
        bufs[i] = vhd_blkdrv_buf_alloc(s->q, BS);
        if (!bufs[i]) {
            snprintf(s->why, sizeof(s->why), "buffer pool exhausted");
            return s->result = -ENOMEM;
        }
        free_stack[nfree++] = (int)i;
    }
    while (done < s->nblocks) {
        while (nfree && next < s->nblocks) {
            int b = free_stack[nfree - 1];
            /* Visit blocks in a scrambled order (an odd stride is a bijection mod 2^k, and
             * nblocks is a power of two in these tests). */
            uint64_t blk = ((uint64_t)next * 40503u) % s->nblocks;
            uint64_t off = s->start + blk * BS;
            int rc;
            if (s->write) {
                fill(bufs[b], BS, off, s->seed);
                rc = vhd_blkdrv_submit_write(s->q, off, bufs[b], BS, (void *)(intptr_t)b);
            } else {
                memset(bufs[b], 0, BS);
                rc = vhd_blkdrv_submit_read(s->q, off, bufs[b], BS, (void *)(intptr_t)b);
            }
            if (rc == -EAGAIN)
                break;
            if (rc < 0) {
                snprintf(s->why, sizeof(s->why), "submit: %s", strerror(-rc));
                return s->result = rc;
            }
            blk_of[b] = off;
            nfree--;
            next++;
            inflight++;
        }
        int n = (s->mixed && (done & 1)) ? vhd_blkdrv_wait(s->q, c, 16, WAIT_MS)
                                         : vhd_blkdrv_poll(s->q, c, 16);
        if (n < 0) {
            snprintf(s->why, sizeof(s->why), "completion: %s", strerror(-n));
            return s->result = n;
        }
        if (n == 0 && ms_now() - t0 > 20000) {
            snprintf(s->why, sizeof(s->why), "stuck with %u in flight", inflight);
            return s->result = -ETIMEDOUT;
        }
        for (int i = 0; i < n; i++) {
            int b = (int)(intptr_t)c[i].cookie;
            if (c[i].ret != 0) {
                snprintf(s->why, sizeof(s->why), "%s at %llu: ret %d status %u",
                         s->write ? "write" : "read", (unsigned long long)blk_of[b], c[i].ret,
                         c[i].status);
                return s->result = c[i].ret;
            }
            if (!s->write) {
                long bad = mismatch(bufs[b], BS, blk_of[b], s->seed);
                if (bad >= 0) {
                    snprintf(s->why, sizeof(s->why), "read at %llu: mismatch at byte %ld",
                             (unsigned long long)blk_of[b], bad);
                    return s->result = -EILSEQ;
                }
            }
            free_stack[nfree++] = b;
            inflight--;
            done++;
        }
    }
    for (uint32_t i = 0; i < depth; i++)
        vhd_blkdrv_buf_free(s->q, bufs[i], BS);
    return s->result = 0;
}

static void *stream_thread(void *arg)
{
    run_stream(arg);
    return NULL;
}

/* Run one stream per queue, each in its own thread (the queue's owner). */
static void run_streams(struct vhd_blkdrv *d, uint32_t nq, uint64_t per_queue, uint64_t seed,
                        bool write)
{
    struct stream s[8];
    pthread_t th[8];
    VHD_CHECK(nq <= 8);
    for (uint32_t i = 0; i < nq; i++) {
        s[i] = (struct stream){.q = vhd_blkdrv_get_queue(d, i),
                               .start = i * per_queue,
                               .nblocks = (uint32_t)(per_queue / BS),
                               .depth = 8,
                               .seed = seed,
                               .write = write,
                               .mixed = (i & 1) == 0};
        VHD_CHECK(s[i].q != NULL);
        VHD_CHECK_EQ(pthread_create(&th[i], NULL, stream_thread, &s[i]), 0);
    }
    for (uint32_t i = 0; i < nq; i++) {
        pthread_join(th[i], NULL);
        if (s[i].result)
            fprintf(stderr, "  queue %u: %s\n", i, s[i].why);
        VHD_CHECK_EQ(s[i].result, 0);
    }
}

/* ======================= tests ======================= */

/* The raw front-end: handshake, queue count, config, local argument checks, stop of an idle ring.
 */
VHD_TEST(fe_vuf_session)
{
    struct daemon dm;
    struct vhd_vuf f;
    uint64_t cap = 0;

    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "queues=3");
    vhd_vuf_init(&f, WAIT_MS);
    VHD_CHECK_EQ(vhd_vuf_connect(&f, dm.sock), 0);
    VHD_CHECK_EQ(vhd_vuf_handshake(&f, (1ull << VHOST_USER_PROTOCOL_F_MQ) |
                                           (1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK) |
                                           (1ull << VHOST_USER_PROTOCOL_F_CONFIG)),
                 0);
    VHD_CHECK(f.has_proto);
    VHD_CHECK(vhd_vuf_has_proto(&f, VHOST_USER_PROTOCOL_F_REPLY_ACK));
    VHD_CHECK(!vhd_vuf_has_proto(&f, VHOST_USER_PROTOCOL_F_STATUS)); /* offered, not asked */
    VHD_CHECK_EQ(f.queue_num, 3);
    VHD_CHECK_EQ(vhd_vuf_get_config(&f, 0, &cap, sizeof(cap)), 0);
    VHD_CHECK_EQ(cap, IMG_SIZE / 512);
    VHD_CHECK_EQ(vhd_vuf_get_config(&f, 0, &cap, 300), -EINVAL);
    VHD_CHECK_EQ(vhd_vuf_set_features(&f, 1ull << 63), -EINVAL); /* never offered */
    VHD_CHECK_EQ(vhd_vuf_set_features(&f, 1ull << 32), 0);       /* VERSION_1 */
    uint32_t base = 77;
    VHD_CHECK_EQ(vhd_vuf_ring_stop(&f, 1, &base), 0); /* never started: its initial base */
    VHD_CHECK_EQ(base, 0);
    VHD_CHECK_EQ(vhd_vuf_sync(&f), 0);
    VHD_CHECK(vhd_vuf_alive(&f));
    vhd_vuf_close(&f);
    VHD_CHECK(!vhd_vuf_alive(&f));
    VHD_CHECK_EQ(vhd_vuf_sync(&f), -ENOTCONN);
    VHD_CHECK(vhd_vuf_strerror(&f)[0] != 0);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* Capacity and config, the negotiated features, GET_ID with the configured serial. */
VHD_TEST(fe_connect_config_get_id)
{
    struct daemon dm;
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "queues=2,serial=vhd-fe-serial-0001");
    struct vhd_blkdrv *d = drv_connect(dm.sock, 1, false);
    const struct vhd_blkdrv_info *in = vhd_blkdrv_get_info(d);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(d), IMG_SIZE);
    VHD_CHECK_EQ(in->blk_size, 512);
    VHD_CHECK(in->seg_max >= 1 && in->seg_max <= VHD_BLKDRV_MAX_SEGS);
    VHD_CHECK_EQ(in->device_queues, 2);
    VHD_CHECK_EQ(in->num_queues, 1);
    VHD_CHECK(in->flush && in->discard && in->write_zeroes && !in->read_only);
    VHD_CHECK(in->event_idx && in->indirect && in->reply_ack && !in->packed);
    VHD_CHECK(in->pool_size >= (1u << 20));
    VHD_CHECK(vhd_blkdrv_get_queue(d, 1) == NULL);

    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    char id[VHD_BLKDRV_ID_BYTES + 1];
    memset(id, 0, sizeof(id));
    VHD_CHECK_EQ(vhd_blkdrv_submit_get_id(q, id, id), 0);
    struct vhd_blkdrv_completion c = wait_one(q);
    VHD_CHECK(c.cookie == id);
    VHD_CHECK_EQ(c.ret, 0);
    VHD_CHECK_EQ(c.status, 0);
    VHD_CHECK(!strcmp(id, "vhd-fe-serial-0001"));
    VHD_CHECK_EQ(vhd_blkdrv_inflight(q), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, 10), 0); /* nothing in flight: no wait */
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * Write through nq queues (a thread each), flush, read back, and check the
 * image file. plain: no indirect descriptors and no EVENT_IDX (direct chains,
 * flag-based notification suppression).
 */
static void rw_roundtrip(uint32_t nq, bool packed, bool plain)
{
    struct daemon dm;
    uint64_t per_queue = IMG_SIZE / 4, seed = 0x5eed0000u + nq * 4 + packed * 2 + plain;
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "queues=4");
    struct vhd_blkdrv_opts o = {.socket_path = dm.sock,
                                .num_queues = nq,
                                .packed = packed,
                                .queue_size = plain ? 64 : 0,
                                .no_indirect = plain,
                                .no_event_idx = plain};
    struct vhd_blkdrv *d = drv_connect_opts(&o);
    const struct vhd_blkdrv_info *in = vhd_blkdrv_get_info(d);
    VHD_CHECK_EQ(in->packed, packed);
    VHD_CHECK_EQ(in->indirect, !plain);
    VHD_CHECK_EQ(in->event_idx, !plain);
    run_streams(d, nq, per_queue, seed, true);
    for (uint32_t i = 0; i < nq; i++)
        VHD_CHECK_EQ(sync_flush(vhd_blkdrv_get_queue(d, i)), 0);
    run_streams(d, nq, per_queue, seed, false);
    struct vhd_blkdrv_queue_stats st;
    vhd_blkdrv_queue_stats(vhd_blkdrv_get_queue(d, 0), &st);
    VHD_CHECK_EQ(st.submitted, st.completed);
    VHD_CHECK(st.submitted >= 2 * per_queue / BS);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    check_image(dm.img, 0, nq * per_queue, seed);
    if (nq < 4)
        check_image_zero(dm.img, nq * per_queue, IMG_SIZE - nq * per_queue);
    test_done();
}

VHD_TEST(fe_rw_split_1q)
{
    rw_roundtrip(1, false, false);
}

VHD_TEST(fe_rw_split_4q)
{
    rw_roundtrip(4, false, false);
}

VHD_TEST(fe_rw_packed_1q)
{
    rw_roundtrip(1, true, false);
}

VHD_TEST(fe_rw_packed_4q)
{
    rw_roundtrip(4, true, false);
}

VHD_TEST(fe_rw_split_direct_no_event_idx)
{
    rw_roundtrip(2, false, true);
}

VHD_TEST(fe_rw_packed_direct_no_event_idx)
{
    rw_roundtrip(2, true, true);
}

/* Vectored I/O over several memory regions, buffers from other queues' pools, odd segments. */
VHD_TEST(fe_vectored_multi_region)
{
    struct daemon dm;
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "queues=3");
    struct vhd_blkdrv_opts o = {.socket_path = dm.sock,
                                .num_queues = 3,
                                .mem_regions = 3,
                                .mem_size = 24u << 20,
                                .timeout_ms = WAIT_MS};
    struct vhd_blkdrv *d;
    char err[256];
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), 0);
    struct vhd_blkdrv_queue *q0 = vhd_blkdrv_get_queue(d, 0);
    struct vhd_blkdrv_queue *q1 = vhd_blkdrv_get_queue(d, 1);
    struct vhd_blkdrv_queue *q2 = vhd_blkdrv_get_queue(d, 2);
    /* One request gathering from the three pools (three regions): 512 + 4096 + 3584 bytes. */
    uint8_t *a = vhd_blkdrv_buf_alloc(q0, 8192), *b = vhd_blkdrv_buf_alloc(q1, 4096);
    uint8_t *c = vhd_blkdrv_buf_alloc(q2, 4096);
    VHD_CHECK(a && b && c);
    uint8_t *all = malloc(8192);
    VHD_CHECK(all);
    fill(all, 8192, 1 << 20, 9);
    memcpy(a, all, 512);
    memcpy(b, all + 512, 4096);
    memcpy(c, all + 4608, 3584);
    struct iovec wv[3] = {{a, 512}, {b, 4096}, {c, 3584}};
    VHD_CHECK_EQ(vhd_blkdrv_submit_writev(q1, 1 << 20, wv, 3, wv), 0);
    struct vhd_blkdrv_completion cc = wait_one(q1);
    VHD_CHECK(cc.cookie == wv);
    VHD_CHECK_EQ(cc.ret, 0);
    /* Read it back scattered differently: 4096 + 4096 in two pools. */
    memset(a, 0, 8192);
    struct iovec rv[2] = {{a + 4096, 4096}, {c, 4096}};
    VHD_CHECK_EQ(vhd_blkdrv_submit_readv(q2, 1 << 20, rv, 2, NULL), 0);
    cc = wait_one(q2);
    VHD_CHECK_EQ(cc.ret, 0);
    VHD_CHECK_EQ(cc.len, 8192 + 1); /* data plus the status byte */
    VHD_CHECK(!memcmp(a + 4096, all, 4096));
    VHD_CHECK(!memcmp(c, all + 4096, 4096));
    free(all);
    vhd_blkdrv_buf_free(q0, a, 8192);
    vhd_blkdrv_buf_free(q1, b, 4096);
    vhd_blkdrv_buf_free(q2, c, 4096);
    /* The freed run is found again. */
    VHD_CHECK(vhd_blkdrv_buf_alloc(q0, 8192) == a);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    check_image(dm.img, 1 << 20, 8192, 9);
    test_done();
}

/* WRITE_ZEROES (with and without unmap) and DISCARD, checked on the device and in the image. */
VHD_TEST(fe_discard_write_zeroes_flush)
{
    struct daemon dm;
    const uint64_t base = 2 << 20, len = 128 << 10;
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "");
    struct vhd_blkdrv *d = drv_connect(dm.sock, 1, false);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, len);
    VHD_CHECK(buf);
    fill(buf, len, base, 3);
    VHD_CHECK_EQ(sync_write(q, base, buf, len), 0);
    VHD_CHECK_EQ(sync_flush(q), 0);

    VHD_CHECK_EQ(vhd_blkdrv_submit_write_zeroes(q, base + 8192, 16384, false, NULL), 0);
    VHD_CHECK_EQ(wait_one(q).ret, 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_write_zeroes(q, base + 65536, 8192, true, NULL), 0);
    VHD_CHECK_EQ(wait_one(q).ret, 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_discard(q, base + 98304, 4096, NULL), 0);
    VHD_CHECK_EQ(wait_one(q).ret, 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_write_zeroes(q, base + 1, 512, false, NULL), -EINVAL);
    VHD_CHECK_EQ(vhd_blkdrv_submit_discard(q, base, 0, NULL), -EINVAL);

    memset(buf, 0xee, len);
    VHD_CHECK_EQ(sync_read(q, base, buf, len), 0);
    VHD_CHECK_EQ(mismatch(buf, 8192, base, 3), -1);
    VHD_CHECK(all_zero(buf + 8192, 16384));
    VHD_CHECK_EQ(mismatch(buf + 24576, 40960, base + 24576, 3), -1);
    VHD_CHECK(all_zero(buf + 65536, 8192));
    VHD_CHECK_EQ(mismatch(buf + 73728, 24576, base + 73728, 3), -1);
    VHD_CHECK_EQ(mismatch(buf + 102400, len - 102400, base + 102400, 3), -1);
    VHD_CHECK_EQ(sync_flush(q), 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    check_image(dm.img, base, 8192, 3);
    check_image_zero(dm.img, base + 8192, 16384);
    check_image(dm.img, base + 24576, 40960, 3);
    check_image_zero(dm.img, base + 65536, 8192);
    test_done();
}

/* A read-only device: writes, write-zeroes and discards complete with IOERR; reads work. */
VHD_TEST(fe_readonly_rejects_writes)
{
    struct daemon dm;
    daemon_prepare(&dm, IMG_SIZE);
    /* Stamp the image first so the read has something to find. */
    {
        int fd = open(dm.img, O_WRONLY | O_CLOEXEC);
        uint8_t blk[BS];
        VHD_CHECK(fd >= 0);
        fill(blk, BS, 4 * BS, 11);
        VHD_CHECK_EQ(pwrite(fd, blk, BS, 4 * BS), (ssize_t)BS);
        close(fd);
    }
    vhostd_start(&dm, "ro=on");
    struct vhd_blkdrv *d = drv_connect(dm.sock, 1, false);
    VHD_CHECK(vhd_blkdrv_get_info(d)->read_only);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, BS);
    VHD_CHECK(buf);
    VHD_CHECK_EQ(sync_read(q, 4 * BS, buf, BS), 0);
    VHD_CHECK_EQ(mismatch(buf, BS, 4 * BS, 11), -1);

    fill(buf, BS, 0, 12);
    VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, 0, buf, BS, buf), 0);
    struct vhd_blkdrv_completion c = wait_one(q);
    VHD_CHECK_EQ(c.ret, -EIO);
    VHD_CHECK_EQ(c.status, 1); /* VIRTIO_BLK_S_IOERR */
    if (vhd_blkdrv_get_info(d)->write_zeroes) {
        VHD_CHECK_EQ(vhd_blkdrv_submit_write_zeroes(q, 0, BS, false, NULL), 0);
        VHD_CHECK_EQ(wait_one(q).ret, -EIO);
    }
    if (vhd_blkdrv_get_info(d)->discard) {
        VHD_CHECK_EQ(vhd_blkdrv_submit_discard(q, 0, BS, NULL), 0);
        VHD_CHECK_EQ(wait_one(q).ret, -EIO);
    }
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    check_image_zero(dm.img, 0, BS);
    test_done();
}

/* Local argument errors, device-side range errors, a full queue, failed connects. */
VHD_TEST(fe_errors)
{
    struct daemon dm;
    char err[256];
    struct vhd_blkdrv *d;
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "queues=2,rings=split");

    /* Options and negotiation failures, each with a message. */
    struct vhd_blkdrv_opts o = {.socket_path = dm.sock, .timeout_ms = WAIT_MS};
    o.queue_size = 100;
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), -EINVAL);
    VHD_CHECK(!strcmp(err, "queue_size 100: 1..32768, a power of two for split rings"));
    o.queue_size = 0;
    o.socket_path = NULL;
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), -EINVAL);
    VHD_CHECK(!strcmp(err, "no socket path"));
    o.socket_path = dm.sock;
    o.num_queues = 65;
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), -EINVAL);
    VHD_CHECK(!strcmp(err, "num_queues 65: at most 64"));
    o.num_queues = 3;
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), -ENOTSUP);
    VHD_CHECK(strstr(err, "queues"));
    o.num_queues = 1;
    o.packed = true;
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), -ENOTSUP);
    VHD_CHECK(!strcmp(err, "the back-end does not offer packed rings (VIRTIO_F_RING_PACKED)"));
    o.packed = false;
    o.mem_size = 4096;
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), -ENOMEM);
    o.mem_size = 0;
    char nosock[PATH_MAX + 16];
    snprintf(nosock, sizeof(nosock), "%s/missing.sock", dm.dir);
    struct vhd_blkdrv_opts o2 = {.socket_path = nosock, .timeout_ms = 200};
    uint64_t t0 = ms_now();
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o2, &d, err, sizeof(err)), -ETIMEDOUT);
    VHD_CHECK(ms_now() - t0 < 2000);
    VHD_CHECK(strstr(err, "missing.sock"));

    /* A small queue without indirect descriptors: 8 entries, 3 per request. */
    o.queue_size = 8;
    o.no_indirect = true;
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), 0);
    const struct vhd_blkdrv_info *in = vhd_blkdrv_get_info(d);
    VHD_CHECK(!in->indirect);
    VHD_CHECK_EQ(in->max_inflight, 2);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, 4 * BS);
    VHD_CHECK(buf);
    uint8_t stackbuf[512];

    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 100, buf, BS, NULL), -EINVAL);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, buf, 100, NULL), -EINVAL);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, buf, 0, NULL), -EINVAL);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, stackbuf, sizeof(stackbuf), NULL), -EFAULT);
    VHD_CHECK_EQ(vhd_blkdrv_submit_get_id(q, NULL, NULL), -EINVAL);
    VHD_CHECK_EQ(vhd_blkdrv_inflight(q), 0);

    /* Beyond the end of the device: the device says IOERR. */
    VHD_CHECK_EQ(sync_read(q, IMG_SIZE, buf, BS), -EIO);
    VHD_CHECK_EQ(sync_read(q, IMG_SIZE - 512, buf, 1024), -EIO);
    VHD_CHECK_EQ(sync_read(q, IMG_SIZE - 512, buf, 512), 0);

    /* Queue full: the third request has no descriptors left. */
    vhd_blkdrv_plug(q);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, buf, BS, (void *)1), 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, BS, buf + BS, BS, (void *)2), 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 2 * BS, buf + 2 * BS, BS, (void *)3), -EAGAIN);
    VHD_CHECK_EQ(vhd_blkdrv_inflight(q), 2);
    vhd_blkdrv_unplug(q);
    struct vhd_blkdrv_completion c[4];
    unsigned got = 0;
    uint64_t t1 = ms_now();
    while (got < 2 && ms_now() - t1 < WAIT_MS) {
        int n = vhd_blkdrv_wait(q, c + got, 4 - got, WAIT_MS);
        VHD_CHECK(n > 0);
        got += (unsigned)n;
    }
    VHD_CHECK_EQ(got, 2);
    VHD_CHECK_EQ(c[0].ret, 0);
    VHD_CHECK_EQ(c[1].ret, 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 2 * BS, buf + 2 * BS, BS, (void *)3), 0);
    VHD_CHECK_EQ(wait_one(q).ret, 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * Reconnect with requests in flight, several times, on 2 queues; then a
 * daemon restart under the driver (the socket reappears) and a reconnect to
 * the new daemon. Every request completes exactly once (0, or -ECONNRESET
 * and resubmitted), and the data is all there, on the device and in the image.
 */
static void reconnect_workload(bool packed)
{
    struct daemon dm;
    const uint32_t nq = 2, depth = 12, nblk = 256; /* per queue */
    const uint64_t seed = 0xabcdef + packed;
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "queues=2");
    struct vhd_blkdrv *d = drv_connect(dm.sock, nq, packed);
    uint8_t *bufs[2][12];
    uint32_t next[2] = {0, 0}, done[2] = {0, 0};
    uint8_t completions[2][256];
    memset(completions, 0, sizeof(completions));
    for (uint32_t qi = 0; qi < nq; qi++)
        for (uint32_t k = 0; k < depth; k++) {
            bufs[qi][k] = vhd_blkdrv_buf_alloc(vhd_blkdrv_get_queue(d, qi), BS);
            VHD_CHECK(bufs[qi][k]);
        }
    /* cookie: block number + 1 in the low bits, buffer index above */
    int reconnects = 0;
    uint64_t t0 = ms_now();
    int32_t slot_blk[2][12];
    bool busy[2][12];
    memset(busy, 0, sizeof(busy));
    while ((done[0] < nblk || done[1] < nblk) && ms_now() - t0 < 30000) {
        for (uint32_t qi = 0; qi < nq; qi++) {
            struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, qi);
            for (uint32_t k = 0; k < depth && next[qi] < nblk; k++) {
                if (busy[qi][k])
                    continue;
                uint64_t off = (qi * nblk + next[qi]) * (uint64_t)BS;
                fill(bufs[qi][k], BS, off, seed);
                int rc =
                    vhd_blkdrv_submit_write(q, off, bufs[qi][k], BS, (void *)(uintptr_t)(k + 1));
                if (rc == -EAGAIN)
                    break;
                VHD_CHECK_EQ(rc, 0);
                busy[qi][k] = true;
                slot_blk[qi][k] = (int32_t)next[qi];
                next[qi]++;
            }
        }
        /* Every ~60 blocks, pull the rug while requests are in flight. */
        if (reconnects < 3 && next[0] > 60 * (uint32_t)(reconnects + 1)) {
            VHD_CHECK(vhd_blkdrv_inflight(vhd_blkdrv_get_queue(d, 0)) > 0);
            int rc = vhd_blkdrv_reconnect(d);
            if (rc < 0)
                fprintf(stderr, "  reconnect: %s\n", vhd_blkdrv_errmsg(d));
            VHD_CHECK_EQ(rc, 0);
            reconnects++;
        }
        for (uint32_t qi = 0; qi < nq; qi++) {
            struct vhd_blkdrv_completion c[16];
            int n = vhd_blkdrv_poll(vhd_blkdrv_get_queue(d, qi), c, 16);
            VHD_CHECK(n >= 0);
            for (int i = 0; i < n; i++) {
                uint32_t k = (uint32_t)(uintptr_t)c[i].cookie - 1;
                VHD_CHECK(k < depth && busy[qi][k]);
                busy[qi][k] = false;
                if (c[i].ret == -ECONNRESET) {
                    /* lost with the session: write it again */
                    uint64_t off = (qi * nblk + (uint32_t)slot_blk[qi][k]) * (uint64_t)BS;
                    VHD_CHECK_EQ(vhd_blkdrv_submit_write(vhd_blkdrv_get_queue(d, qi), off,
                                                         bufs[qi][k], BS, c[i].cookie),
                                 0);
                    busy[qi][k] = true;
                    continue;
                }
                VHD_CHECK_EQ(c[i].ret, 0);
                VHD_CHECK_EQ(completions[qi][slot_blk[qi][k]], 0); /* exactly once */
                completions[qi][slot_blk[qi][k]] = 1;
                done[qi]++;
            }
        }
    }
    VHD_CHECK_EQ(reconnects, 3);
    VHD_CHECK_EQ(done[0], nblk);
    VHD_CHECK_EQ(done[1], nblk);

    /* The daemon goes away under us and a new one takes over the same socket and image. */
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    vhostd_start(&dm, "queues=2");
    int rc = vhd_blkdrv_reconnect(d);
    if (rc < 0)
        fprintf(stderr, "  reconnect after restart: %s\n", vhd_blkdrv_errmsg(d));
    VHD_CHECK_EQ(rc, 0);
    run_streams(d, nq, (uint64_t)nblk * BS, seed, false);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    check_image(dm.img, 0, (uint64_t)nq * nblk * BS, seed);
    test_done();
}

VHD_TEST(fe_reconnect_split)
{
    reconnect_workload(false);
}

VHD_TEST(fe_reconnect_packed)
{
    reconnect_workload(true);
}

/* After a failed reconnect (no daemon), submits say -ENOTCONN; a later reconnect recovers. */
VHD_TEST(fe_reconnect_after_failure)
{
    struct daemon dm;
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "");
    /*
     * Short enough that the failing reconnect gives up soon, long enough for a
     * sanitizer-built daemon on a loaded machine to answer (it listens before
     * its event loop runs).
     */
    struct vhd_blkdrv_opts o = {.socket_path = dm.sock, .timeout_ms = 3000};
    struct vhd_blkdrv *d;
    char err[256];
    int rc = vhd_blkdrv_connect(&o, &d, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  connect: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, BS);
    fill(buf, BS, 0, 21);
    VHD_CHECK_EQ(sync_write(q, 0, buf, BS), 0);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    VHD_CHECK(vhd_blkdrv_reconnect(d) < 0);
    VHD_CHECK(vhd_blkdrv_errmsg(d)[0] != 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, buf, BS, NULL), -ENOTCONN);
    vhostd_start(&dm, "");
    rc = vhd_blkdrv_reconnect(d);
    if (rc < 0)
        fprintf(stderr, "  reconnect: %s\n", vhd_blkdrv_errmsg(d));
    VHD_CHECK_EQ(rc, 0);
    memset(buf, 0, BS);
    VHD_CHECK_EQ(sync_read(q, 0, buf, BS), 0);
    VHD_CHECK_EQ(mismatch(buf, BS, 0, 21), -1);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * The daemon is killed (SIGKILL) with requests queued, and INFLIGHT_SHMFD is
 * not used: after a reconnect to a new daemon they come back once each with
 * -ECONNRESET, and the queue carries on.
 */
VHD_TEST(fe_daemon_killed_inflight)
{
    struct daemon dm;
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "");
    struct vhd_blkdrv_opts o = {.socket_path = dm.sock, .no_inflight = true};
    struct vhd_blkdrv *d = drv_connect_opts(&o);
    VHD_CHECK(!vhd_blkdrv_get_info(d)->inflight);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, 4 * BS);
    VHD_CHECK(buf);
    /* Plugged: queued in the ring, never published, so surely not completed. */
    vhd_blkdrv_plug(q);
    for (uintptr_t i = 0; i < 4; i++)
        VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, i * BS, buf + i * BS, BS, (void *)(i + 1)), 0);
    kill(dm.pid, SIGKILL);
    waitpid(dm.pid, NULL, 0);
    dm.pid = 0;
    unlink(dm.sock); /* SIGKILL left it behind */
    vhostd_start(&dm, "");
    VHD_CHECK_EQ(vhd_blkdrv_reconnect(d), 0);
    VHD_CHECK_EQ(vhd_blkdrv_inflight(q), 4);
    struct vhd_blkdrv_completion c[8];
    VHD_CHECK_EQ(vhd_blkdrv_poll(q, c, 8), 4);
    for (uintptr_t i = 0; i < 4; i++) {
        VHD_CHECK(c[i].cookie == (void *)(i + 1)); /* in submission order */
        VHD_CHECK_EQ(c[i].ret, -ECONNRESET);
    }
    VHD_CHECK_EQ(vhd_blkdrv_inflight(q), 0);
    VHD_CHECK_EQ(vhd_blkdrv_poll(q, c, 8), 0);
    VHD_CHECK_EQ(sync_read(q, 0, buf, BS), 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * The daemon is killed (SIGKILL) with requests outstanding, and the session
 * uses INFLIGHT_SHMFD: after a reconnect to a new daemon the rings resume as
 * they were and every request completes normally, once: two published while
 * the daemon was stopped (SIGSTOP: it never saw them), one still plugged
 * (never published) when it died. The data is right on the device and in
 * the image. (Requests the dead daemon had taken and not finished, which it
 * resubmits from the inflight area, are test_crash's business.)
 */
static void killed_resume(bool packed)
{
    struct daemon dm;
    const uint64_t seed = 31 + packed;
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "");
    struct vhd_blkdrv *d = drv_connect(dm.sock, 1, packed);
    VHD_CHECK(vhd_blkdrv_get_info(d)->inflight);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, 8 * BS);
    VHD_CHECK(buf);
    for (uint64_t i = 0; i < 2; i++) {
        fill(buf + i * BS, BS, i * BS, seed);
        VHD_CHECK_EQ(sync_write(q, i * BS, buf + i * BS, BS), 0);
    }

    int st;
    kill(dm.pid, SIGSTOP);
    VHD_CHECK_EQ(waitpid(dm.pid, &st, WUNTRACED), dm.pid); /* stopped for sure */
    VHD_CHECK(WIFSTOPPED(st));
    memset(buf + 4 * BS, 0, 2 * BS);
    fill(buf + 2 * BS, BS, 2 * BS, seed);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, buf + 4 * BS, BS, (void *)1), 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, 2 * BS, buf + 2 * BS, BS, (void *)2), 0);
    vhd_blkdrv_plug(q);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, BS, buf + 5 * BS, BS, (void *)3), 0);
    kill(dm.pid, SIGKILL);
    waitpid(dm.pid, NULL, 0);
    dm.pid = 0;
    VHD_CHECK(!vhd_blkdrv_session_alive(d));
    unlink(dm.sock);
    vhostd_start(&dm, "");
    VHD_CHECK_EQ(vhd_blkdrv_reconnect(d), 0);
    VHD_CHECK(vhd_blkdrv_session_alive(d));
    VHD_CHECK_EQ(vhd_blkdrv_inflight(q), 3);
    vhd_blkdrv_unplug(q);

    bool seen[4] = {false};
    for (unsigned got = 0; got < 3;) {
        struct vhd_blkdrv_completion c[4];
        int n = vhd_blkdrv_wait(q, c, 4, WAIT_MS);
        VHD_CHECK(n > 0);
        for (int i = 0; i < n; i++) {
            uintptr_t ck = (uintptr_t)c[i].cookie;
            VHD_CHECK(ck >= 1 && ck <= 3 && !seen[ck]);
            seen[ck] = true;
            VHD_CHECK_EQ(c[i].ret, 0);
        }
        got += (unsigned)n;
    }
    VHD_CHECK_EQ(vhd_blkdrv_inflight(q), 0);
    VHD_CHECK_EQ(mismatch(buf + 4 * BS, BS, 0, seed), -1);
    VHD_CHECK_EQ(mismatch(buf + 5 * BS, BS, BS, seed), -1);
    struct vhd_blkdrv_queue_stats qs;
    vhd_blkdrv_queue_stats(q, &qs);
    VHD_CHECK_EQ(qs.carried, 3);
    memset(buf + 6 * BS, 0, BS);
    VHD_CHECK_EQ(sync_read(q, 2 * BS, buf + 6 * BS, BS), 0);
    VHD_CHECK_EQ(mismatch(buf + 6 * BS, BS, 2 * BS, seed), -1);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    check_image(dm.img, 0, 3 * BS, seed);
    test_done();
}

VHD_TEST(fe_daemon_killed_resume_split)
{
    killed_resume(false);
}

VHD_TEST(fe_daemon_killed_resume_packed)
{
    killed_resume(true);
}

/* qemu-storage-daemon's vhost-user-blk export on dm's socket and image (split rings only). */
static bool qsd_start(struct daemon *dm)
{
    char qsd[PATH_MAX];
    const char *env = getenv("VHD_QSD");
    const char *bin = env && *env ? env : find_in_path("qemu-storage-daemon", qsd, sizeof(qsd));
    if (!bin || !executable(bin))
        return false;
    char blockdev[PATH_MAX + 64], export[PATH_MAX + 160];
    snprintf(blockdev, sizeof(blockdev), "driver=file,node-name=disk,filename=%s", dm->img);
    snprintf(export, sizeof(export),
             "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path=%s,"
             "writable=on,num-queues=1",
             dm->sock);
    char *argv[] = {(char *)bin, "--blockdev", blockdev, "--export", export, NULL};
    daemon_spawn(dm, argv);
    return true;
}

/*
 * After a crash, a back-end without INFLIGHT_SHMFD (qemu-storage-daemon 7.2)
 * takes over: the held rings cannot be resumed, so their outstanding
 * requests come back with -ECONNRESET, once, in slot order, and the rings
 * start afresh. Then vhostd again: the kept (zeroed) area is handed to it
 * and everything works, the data all there.
 */
VHD_TEST(fe_killed_then_backend_without_inflight)
{
    struct daemon dm;
    const uint64_t seed = 41;
    char qsd[PATH_MAX];
    if (!getenv("VHD_QSD") && !find_in_path("qemu-storage-daemon", qsd, sizeof(qsd)))
        vhd_test_skip("qemu-storage-daemon not installed");
    daemon_prepare(&dm, IMG_SIZE);
    vhostd_start(&dm, "");
    struct vhd_blkdrv *d = drv_connect(dm.sock, 1, false);
    VHD_CHECK(vhd_blkdrv_get_info(d)->inflight);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, 4 * BS);
    VHD_CHECK(buf);
    fill(buf, BS, 0, seed);
    VHD_CHECK_EQ(sync_write(q, 0, buf, BS), 0);

    int st;
    kill(dm.pid, SIGSTOP);
    VHD_CHECK_EQ(waitpid(dm.pid, &st, WUNTRACED), dm.pid);
    VHD_CHECK(WIFSTOPPED(st));
    fill(buf + BS, BS, BS, seed);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, buf + 2 * BS, BS, (void *)1), 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, BS, buf + BS, BS, (void *)2), 0);
    kill(dm.pid, SIGKILL);
    waitpid(dm.pid, NULL, 0);
    dm.pid = 0;
    unlink(dm.sock);

    VHD_CHECK(qsd_start(&dm));
    VHD_CHECK_EQ(vhd_blkdrv_reconnect(d), 0);
    VHD_CHECK(!vhd_blkdrv_get_info(d)->inflight);
    struct vhd_blkdrv_completion c[4];
    VHD_CHECK_EQ(vhd_blkdrv_poll(q, c, 4), 2);
    VHD_CHECK(c[0].cookie == (void *)1 && c[1].cookie == (void *)2);
    VHD_CHECK_EQ(c[0].ret, -ECONNRESET);
    VHD_CHECK_EQ(c[1].ret, -ECONNRESET);
    VHD_CHECK_EQ(vhd_blkdrv_inflight(q), 0);
    VHD_CHECK_EQ(sync_write(q, BS, buf + BS, BS), 0); /* the caller's retry */
    memset(buf + 2 * BS, 0, BS);
    VHD_CHECK_EQ(sync_read(q, 0, buf + 2 * BS, BS), 0);
    VHD_CHECK_EQ(mismatch(buf + 2 * BS, BS, 0, seed), -1);

    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    vhostd_start(&dm, "");
    VHD_CHECK_EQ(vhd_blkdrv_reconnect(d), 0);
    VHD_CHECK(vhd_blkdrv_get_info(d)->inflight);
    memset(buf + 2 * BS, 0, 2 * BS);
    VHD_CHECK_EQ(sync_read(q, 0, buf + 2 * BS, 2 * BS), 0);
    VHD_CHECK_EQ(mismatch(buf + 2 * BS, BS, 0, seed), -1);
    VHD_CHECK_EQ(mismatch(buf + 3 * BS, BS, BS, seed), -1);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    check_image(dm.img, 0, 2 * BS, seed);
    test_done();
}

/* ======================= a scripted back-end ======================= */

/* How the fake back-end answers GET_INFLIGHT_FD. */
enum fake_inflight {
    FI_OK,        /* a 4 KiB memfd area */
    FI_NO_FD,     /* the description without its fd */
    FI_TWO_FDS,   /* one fd too many */
    FI_SHORT,     /* 8 bytes of payload */
    FI_SIZE_ZERO, /* mmap_size 0 */
    FI_SIZE_HUGE, /* mmap_size 1 TiB */
    FI_COUNT
};

struct fake_be {
    int lfd;
    enum fake_inflight mode;
    unsigned set_fds;  /* fds that came with SET_INFLIGHT_FD */
    uint64_t set_size; /* its mmap_size */
};

static void fake_reply(int fd, uint32_t req, const void *p, uint32_t size, const int *fds,
                       unsigned nfds)
{
    struct vu_hdr h = {
        .request = req, .flags = VHOST_USER_VERSION | VHOST_USER_REPLY_MASK, .size = size};
    vu_send(fd, &h, p, fds, nfds, WAIT_MS);
}

/* One session: the few messages the front-end's inflight calls need, until EOF. */
static void *fake_be_main(void *arg)
{
    struct fake_be *b = arg;
    int fd = accept4(b->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0)
        return NULL;
    for (int msgs = 0; msgs < 32; msgs++) {
        struct vu_rx rx;
        int rc;
        vu_rx_init(&rx);
        while ((rc = vu_rx_read(&rx, fd)) == 0) {
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, WAIT_MS) <= 0)
                break;
        }
        if (rc != 1)
            break;
        uint64_t v;
        switch (rx.hdr.request) {
        case VHOST_USER_GET_FEATURES:
            v = (1ull << 32) | (1ull << VHOST_USER_F_PROTOCOL_FEATURES);
            fake_reply(fd, rx.hdr.request, &v, sizeof(v), NULL, 0);
            break;
        case VHOST_USER_GET_PROTOCOL_FEATURES:
            v = 1ull << VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD;
            fake_reply(fd, rx.hdr.request, &v, sizeof(v), NULL, 0);
            break;
        case VHOST_USER_GET_INFLIGHT_FD: {
            struct vu_inflight in = rx.payload.inflight;
            int mfd = memfd_create("fake-inflight", MFD_CLOEXEC);
            int fds[2] = {mfd, mfd};
            if (mfd < 0 || ftruncate(mfd, 4096) < 0)
                break;
            in.mmap_size = b->mode == FI_SIZE_ZERO   ? 0
                           : b->mode == FI_SIZE_HUGE ? 1ull << 40
                                                     : 4096;
            in.mmap_offset = 0;
            fake_reply(fd, rx.hdr.request, &in, b->mode == FI_SHORT ? 8 : sizeof(in), fds,
                       b->mode == FI_NO_FD     ? 0
                       : b->mode == FI_TWO_FDS ? 2
                                               : 1);
            close(mfd);
            break;
        }
        case VHOST_USER_SET_INFLIGHT_FD:
            b->set_fds = rx.nfds;
            b->set_size = rx.payload.inflight.mmap_size;
            break;
        default: /* SET_PROTOCOL_FEATURES, SET_OWNER: no reply without REPLY_ACK */
            break;
        }
        for (unsigned i = 0; i < rx.nfds; i++)
            close(rx.fds[i]);
    }
    close(fd);
    return NULL;
}

static unsigned count_fds(void)
{
    unsigned n = 0;
    DIR *d = opendir("/proc/self/fd");
    VHD_CHECK(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/*
 * GET_INFLIGHT_FD replies from a scripted back-end: a good one is mapped and
 * handed back by SET_INFLIGHT_FD with its fd; a reply without its fd, with
 * two, too short, or with an empty or absurd area is refused (-EPROTO) with
 * every received fd closed. Not negotiated: -ENOTSUP, nothing sent.
 */
VHD_TEST(fe_inflight_fd_replies)
{
    struct daemon dm; /* only its temp dir and socket path */
    unsigned fds0 = count_fds();

    daemon_prepare_dir(&dm, "vhd-test-fi-XXXXXX", "be.sock");
    for (int mode = 0; mode < FI_COUNT; mode++) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        VHD_CHECK(strlen(dm.sock) < sizeof(sa.sun_path));
        memcpy(sa.sun_path, dm.sock, strlen(dm.sock) + 1);
        struct fake_be b = {.mode = (enum fake_inflight)mode};
        b.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        VHD_CHECK(b.lfd >= 0);
        VHD_CHECK_EQ(bind(b.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
        VHD_CHECK_EQ(listen(b.lfd, 1), 0);
        pthread_t th;
        VHD_CHECK_EQ(pthread_create(&th, NULL, fake_be_main, &b), 0);

        struct vhd_vuf f;
        struct vhd_vuf_inflight in;
        vhd_vuf_init(&f, WAIT_MS);
        vhd_vuf_inflight_init(&in);
        VHD_CHECK_EQ(vhd_vuf_connect(&f, dm.sock), 0);
        if (mode == FI_OK) {
            /* Not negotiated first: refused locally. */
            VHD_CHECK_EQ(vhd_vuf_handshake(&f, 0), 0);
            VHD_CHECK_EQ(vhd_vuf_get_inflight_fd(&f, 1, 64, &in), -ENOTSUP);
            VHD_CHECK_EQ(vhd_vuf_set_inflight_fd(&f, &in), -ENOTSUP);
        }
        VHD_CHECK_EQ(vhd_vuf_handshake(&f, 1ull << VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD), 0);
        int rc = vhd_vuf_get_inflight_fd(&f, 1, 64, &in);
        if (mode == FI_OK) {
            VHD_CHECK_EQ(rc, 0);
            VHD_CHECK(in.fd >= 0 && in.addr != NULL);
            VHD_CHECK_EQ(in.mmap_size, 4096);
            memset(in.addr, 0x5a, 4096); /* writable, shared */
            VHD_CHECK_EQ(vhd_vuf_set_inflight_fd(&f, &in), 0);
        } else {
            if (rc != -EPROTO)
                fprintf(stderr, "  mode %d: rc %d (%s)\n", mode, rc, vhd_vuf_strerror(&f));
            VHD_CHECK_EQ(rc, -EPROTO);
            VHD_CHECK(vhd_vuf_strerror(&f)[0] != 0);
            VHD_CHECK_EQ(in.fd, -1);
        }
        vhd_vuf_close(&f);
        pthread_join(th, NULL);
        if (mode == FI_OK) {
            VHD_CHECK_EQ(b.set_fds, 1);
            VHD_CHECK_EQ(b.set_size, 4096);
        }
        vhd_vuf_inflight_release(&in);
        vhd_vuf_inflight_release(&in); /* idempotent */
        close(b.lfd);
        unlink(dm.sock);
    }
    rmdir(dm.dir);
    unlink(dm.log);
    VHD_CHECK_EQ(count_fds(), fds0); /* every fd of every reply closed */
}

/*
 * The same driver, unchanged, against qemu-storage-daemon's vhost-user-blk
 * export (libvhost-user: split rings only) when it is installed.
 */
VHD_TEST(fe_qsd_interop)
{
    char qsd[PATH_MAX];
    const char *env = getenv("VHD_QSD");
    const char *bin = env && *env ? env : find_in_path("qemu-storage-daemon", qsd, sizeof(qsd));
    if (!bin || !executable(bin))
        vhd_test_skip("qemu-storage-daemon not installed");
    struct daemon dm;
    daemon_prepare(&dm, IMG_SIZE);
    char blockdev[PATH_MAX + 64], export[PATH_MAX + 160];
    snprintf(blockdev, sizeof(blockdev), "driver=file,node-name=disk,filename=%s", dm.img);
    snprintf(export, sizeof(export),
             "type=vhost-user-blk,id=exp,node-name=disk,addr.type=unix,addr.path=%s,"
             "writable=on,num-queues=2",
             dm.sock);
    char *argv[] = {(char *)bin, "--blockdev", blockdev, "--export", export, NULL};
    daemon_spawn(&dm, argv);

    char err[256];
    struct vhd_blkdrv *d;
    struct vhd_blkdrv_opts o = {.socket_path = dm.sock, .packed = true, .timeout_ms = WAIT_MS};
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), -ENOTSUP);
    d = drv_connect(dm.sock, 2, false);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(d), IMG_SIZE);
    VHD_CHECK_EQ(vhd_blkdrv_get_info(d)->device_queues, 2);
    const uint64_t per_queue = 2 << 20;
    run_streams(d, 2, per_queue, 77, true);
    VHD_CHECK_EQ(sync_flush(vhd_blkdrv_get_queue(d, 0)), 0);
    VHD_CHECK_EQ(vhd_blkdrv_reconnect(d), 0);
    run_streams(d, 2, per_queue, 77, false);
    char id[VHD_BLKDRV_ID_BYTES + 1] = {0};
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 1);
    VHD_CHECK_EQ(vhd_blkdrv_submit_get_id(q, id, NULL), 0);
    VHD_CHECK_EQ(wait_one(q).ret, 0);
    VHD_CHECK(id[0] != 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    check_image(dm.img, 0, 2 * per_queue, 77);
    test_done();
}
