/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * virtio-blk device tests (src/dev/blk.c, src/backend/): a real device from
 * vhd_blk_new over a temporary image file (or the null backend), its queues
 * run by the real runtime (worker threads, io_uring, kick and call eventfds),
 * driven by the mock driver over memfd guest memory. Every request type,
 * every error status, malformed chains, config space and creation errors.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/vq.h"
#include "dev/blk.h"
#include "spec/virtio_blk.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "harness.h"
#include "runtime/log.h"
#include "runtime/rt.h"

#define QSIZE     128
#define MAX_TQ    2
#define WAIT_MS   5000
#define IMG_SIZE  (8ull << 20) /* 16384 sectors */
#define MEM_SIZE  (64ull << 20)
#define MEM_BASE  0x100000ull
#define BIT(n)    (1ull << (n))
#define NO_STATUS 0xeeu /* what the status byte holds until the device writes it */

/* ======================= test bed ======================= */

struct tb_opts {
    const char *backend; /* NULL: uring over a fresh temp image */
    bool ro;
    bool direct;
    bool packed;
    bool indirect;     /* driver puts each request in an indirect table */
    bool writethrough; /* vhd_blk_opts.writethrough */
    uint32_t block_size;
    uint32_t nqueues;  /* default 1 */
    unsigned nworkers; /* default 1 */
    const char *serial;
    uint64_t features_off; /* offered bits the driver does not accept */
    bool no_pattern;       /* leave the image sparse (default: each sector stamped) */
    const char *dir;       /* where the image goes (default $TMPDIR or /var/tmp) */
};

struct tq {
    struct vhd_queue *q;
    struct vhd_drv_vq dq;
    int kick_fd, call_fd;
};

struct tb {
    struct tb_opts o;
    char image[256];
    int img_fd; /* our own descriptor of the image, for checking */
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    struct vhd_rt *rt;
    struct vhd_dev *dev;
    struct tq tq[MAX_TQ];
    unsigned ntq;
    uint64_t features;
};

/* A byte of the initial image content: sector number and offset, never zero. */
static uint8_t pattern(uint64_t off)
{
    return (uint8_t)((off >> 9) * 31 + (off & 511) + 1) | 1;
}

static const char *tmpdir(void)
{
    const char *d = getenv("TMPDIR");
    return d && *d ? d : "/var/tmp";
}

static void make_image(struct tb *t, uint64_t size, bool fill)
{
    snprintf(t->image, sizeof(t->image), "%s/vhd-test-blk-XXXXXX", t->o.dir ? t->o.dir : tmpdir());
    int fd = mkstemp(t->image);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(ftruncate(fd, (off_t)size), 0);
    if (fill) {
        static uint8_t buf[1 << 16];
        for (uint64_t off = 0; off < size; off += sizeof(buf)) {
            for (size_t i = 0; i < sizeof(buf); i++)
                buf[i] = pattern(off + i);
            VHD_CHECK_EQ(pwrite(fd, buf, sizeof(buf), (off_t)off), (ssize_t)sizeof(buf));
        }
        VHD_CHECK_EQ(fsync(fd), 0);
    }
    t->img_fd = fd;
}

static void tq_setup(struct tb *t, unsigned i)
{
    struct tq *tq = &t->tq[i];
    struct vhd_queue *q = &t->dev->queues[i];
    uint32_t max_ind = t->o.indirect ? VHD_BLK_REQ_IOV : 0;
    size_t area_len = vhd_drv_vq_area_size(QSIZE, t->o.packed, max_ind);
    void *area;
    uint64_t area_gpa = vhd_guestmem_alloc(&t->gm, area_len, 4096, &area);

    VHD_CHECK(area_gpa != UINT64_MAX);
    struct vhd_drv_vq_params dp = {.size = QSIZE,
                                   .packed = t->o.packed,
                                   .event_idx = true,
                                   .max_indirect = max_ind,
                                   .area = area,
                                   .area_gpa = area_gpa,
                                   .area_len = area_len};
    VHD_CHECK_EQ(vhd_drv_vq_init(&tq->dq, &dp), 0);
    struct vhd_vq_params vp = {.size = QSIZE,
                               .packed = t->o.packed,
                               .event_idx = true,
                               .indirect = true,
                               .addr_is_gpa = true,
                               .desc = tq->dq.desc_gpa,
                               .avail = tq->dq.avail_gpa,
                               .used = tq->dq.used_gpa};
    q->size = QSIZE;
    VHD_CHECK_EQ(vhd_vq_init(&q->vq, &vp, t->mem), 0);
    VHD_CHECK_EQ(vhd_vq_start(&q->vq), 0);
    tq->kick_fd = eventfd(0, EFD_CLOEXEC);
    tq->call_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    VHD_CHECK(tq->kick_fd >= 0 && tq->call_fd >= 0);
    q->kick_fd = tq->kick_fd;
    q->call_fd = tq->call_fd;
    VHD_CHECK_EQ(t->dev->ops->queue_init(t->dev, q), 0);
    tq->q = q;
}

static void tb_attach(struct tb *t)
{
    for (unsigned i = 0; i < t->ntq; i++)
        VHD_CHECK_EQ(vhd_rt_attach(t->rt, t->tq[i].q, i % vhd_rt_nworkers(t->rt)), 0);
}

/* Create the device (not attached); features negotiated. */
static void tb_init_detached(struct tb *t, const struct tb_opts *o)
{
    char err[256];
    struct vhd_blk_opts bo = {0};

    memset(t, 0, sizeof(*t));
    t->o = *o;
    t->img_fd = -1;
    vhd_log_set_level(VHD_LOG_ERROR);
    bo.name = "tblk";
    bo.backend = o->backend;
    bo.ro = o->ro;
    bo.direct = o->direct;
    bo.writethrough = o->writethrough;
    bo.block_size = o->block_size;
    bo.num_queues = o->nqueues ? o->nqueues : 1;
    bo.serial = o->serial;
    bo.allow_packed = true;
    if (o->backend && !strcmp(o->backend, "null")) {
        bo.size = IMG_SIZE;
    } else {
        make_image(t, IMG_SIZE, !o->no_pattern);
        bo.image = t->image;
    }
    int rc = vhd_blk_new(&bo, &t->dev, err, sizeof(err));
    if (rc == -EINVAL && o->direct) {
        unlink(t->image);
        vhd_test_skip("O_DIRECT unsupported on the test directory");
    }
    if (rc < 0)
        fprintf(stderr, "  vhd_blk_new: %s\n", err);
    if (t->img_fd >= 0)
        unlink(t->image); /* the device and img_fd keep it: nothing left behind on failure */
    VHD_CHECK_EQ(rc, 0);

    uint64_t f = t->dev->ops->features(t->dev) & ~o->features_off;
    if (!o->packed)
        f &= ~BIT(VIRTIO_F_RING_PACKED);
    t->features = f;
    VHD_CHECK_EQ(t->dev->ops->set_features(t->dev, f), 0);

    struct vhd_mem_region_desc d[1];
    VHD_CHECK_EQ(vhd_guestmem_init(&t->gm, 1, MEM_SIZE, MEM_BASE, 0), 0);
    vhd_guestmem_descs(&t->gm, d);
    VHD_CHECK_EQ(vhd_mem_new(d, 1, &t->mem), 0);
    t->dev->mem = t->mem;

    struct vhd_rt_opts ro;
    vhd_rt_opts_default(&ro);
    ro.nworkers = o->nworkers ? o->nworkers : 1;
    VHD_CHECK_EQ(vhd_rt_new(&ro, &t->rt), 0);
    t->dev->rt = t->rt;
    t->ntq = t->dev->num_queues < MAX_TQ ? t->dev->num_queues : MAX_TQ;
    for (unsigned i = 0; i < t->ntq; i++)
        tq_setup(t, i);
}

static void tb_init(struct tb *t, const struct tb_opts *o)
{
    tb_init_detached(t, o);
    tb_attach(t);
}

static void tb_fini(struct tb *t)
{
    for (unsigned i = 0; i < t->ntq; i++) {
        struct tq *tq = &t->tq[i];
        if (tq->q->attached)
            VHD_CHECK_EQ(vhd_rt_detach(t->rt, tq->q, WAIT_MS), 0);
        t->dev->ops->queue_fini(t->dev, tq->q);
        close(tq->kick_fd);
        close(tq->call_fd);
        vhd_drv_vq_fini(&tq->dq);
    }
    vhd_rt_free(t->rt);
    vhd_blk_free(t->dev);
    vhd_mem_free(t->mem);
    vhd_guestmem_fini(&t->gm);
    if (t->img_fd >= 0)
        close(t->img_fd);
}

static struct vhd_blk_queue_stats tb_stats(struct tb *t, unsigned i)
{
    struct vhd_blk_queue_stats st;
    bool was = t->tq[i].q->attached;
    if (was)
        VHD_CHECK_EQ(vhd_rt_detach(t->rt, t->tq[i].q, WAIT_MS), 0);
    VHD_CHECK_EQ(vhd_blk_queue_stats(t->tq[i].q, &st), 0);
    if (was)
        VHD_CHECK_EQ(vhd_rt_attach(t->rt, t->tq[i].q, i % vhd_rt_nworkers(t->rt)), 0);
    return st;
}

/* Guest memory for a buffer: gpa, and our pointer in *p (filled with `fill`). */
static uint64_t galloc(struct tb *t, uint64_t len, uint64_t align, uint8_t fill, uint8_t **p)
{
    void *hva;
    uint64_t gpa = vhd_guestmem_alloc(&t->gm, len ? len : 1, align, &hva);
    VHD_CHECK(gpa != UINT64_MAX);
    memset(hva, fill, len ? len : 1);
    if (p)
        *p = hva;
    return gpa;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Add one request (nr readable then nw writable buffers) to queue i, publish and kick. */
static void tq_add(struct tb *t, unsigned i, const struct vhd_drv_buf *bufs, uint32_t nr,
                   uint32_t nw, void *cookie)
{
    struct tq *tq = &t->tq[i];
    VHD_CHECK_EQ(vhd_drv_vq_add(&tq->dq, bufs, nr, nw, t->o.indirect, cookie), 0);
    vhd_drv_vq_publish(&tq->dq);
    if (vhd_drv_vq_kick_needed(&tq->dq))
        VHD_CHECK_EQ(eventfd_write(tq->kick_fd, 1), 0);
}

/* Wait (bounded) for one used element of queue i; returns its cookie and length. */
static void *tq_wait(struct tb *t, unsigned i, uint32_t *len)
{
    struct tq *tq = &t->tq[i];
    uint64_t t0 = mono_ms();
    void *cookie;

    for (;;) {
        int rc = vhd_drv_vq_get_used(&tq->dq, &cookie, len);
        VHD_CHECK(rc >= 0);
        if (rc == 1)
            return cookie;
        if (vhd_drv_vq_enable_cb(&tq->dq))
            continue;
        struct pollfd pfd = {.fd = tq->call_fd, .events = POLLIN};
        VHD_CHECK(poll(&pfd, 1, 50) >= 0);
        eventfd_t v;
        (void)eventfd_read(tq->call_fd, &v);
        if (mono_ms() - t0 > WAIT_MS) {
            fprintf(stderr, "  no completion within %d ms\n", WAIT_MS);
            VHD_CHECK(0);
        }
    }
}

/* Run one request on queue 0 and wait for it: returns the used length. */
static uint32_t tb_run(struct tb *t, const struct vhd_drv_buf *bufs, uint32_t nr, uint32_t nw)
{
    uint32_t len = 0;
    tq_add(t, 0, bufs, nr, nw, (void *)1);
    VHD_CHECK(tq_wait(t, 0, &len) == (void *)1);
    return len;
}

/* Is nothing used on queue 0 within ms? (a stopped queue) */
static bool tb_quiet(struct tb *t, int ms)
{
    void *cookie;
    uint32_t len;
    uint64_t t0 = mono_ms();
    while (mono_ms() - t0 < (uint64_t)ms) {
        if (vhd_drv_vq_get_used(&t->tq[0].dq, &cookie, &len) == 1)
            return false;
        usleep(1000);
    }
    return true;
}

static uint64_t hdr_gpa(struct tb *t, uint32_t type, uint64_t sector)
{
    uint8_t *p;
    uint64_t gpa = galloc(t, 16, 16, 0, &p);
    struct virtio_blk_outhdr h = {
        .type = vhd_le32(type), .reserved = 0, .sector = vhd_le64(sector)};
    memcpy(p, &h, sizeof(h));
    return gpa;
}

/*
 * The standard layout: header | data | status. Data is device-readable for
 * writing requests (copied from data) and device-writable for reading ones
 * (copied back into data). Returns the status byte; *used the used length.
 */
static uint8_t tb_req(struct tb *t, uint32_t type, uint64_t sector, void *data, uint32_t len,
                      bool data_writable, uint32_t *used)
{
    struct vhd_drv_buf b[3];
    uint8_t *dp = NULL, *sp;
    uint32_t n = 0, nr, nw;

    b[n++] = (struct vhd_drv_buf){hdr_gpa(t, type, sector), 16};
    if (len) {
        b[n].gpa = galloc(t, len, 512, 0xa5, &dp);
        b[n++].len = len;
        if (!data_writable)
            memcpy(dp, data, len);
    }
    b[n].gpa = galloc(t, 1, 1, NO_STATUS, &sp);
    b[n++].len = 1;
    nr = (len && !data_writable) ? 2 : 1;
    nw = n - nr;
    uint32_t u = tb_run(t, b, nr, nw);
    if (used)
        *used = u;
    if (len && data_writable && data)
        memcpy(data, dp, len);
    return *sp;
}

static uint8_t tb_write(struct tb *t, uint64_t sector, const void *data, uint32_t len)
{
    uint32_t used;
    uint8_t st = tb_req(t, VIRTIO_BLK_T_OUT, sector, (void *)data, len, false, &used);
    VHD_CHECK_EQ(used, 1);
    return st;
}

static uint8_t tb_read(struct tb *t, uint64_t sector, void *data, uint32_t len, uint32_t *used)
{
    return tb_req(t, VIRTIO_BLK_T_IN, sector, data, len, true, used);
}

/* One DISCARD / WRITE_ZEROES segment in wire format. */
static struct virtio_blk_discard_write_zeroes seg(uint64_t sector, uint32_t n, uint32_t flags)
{
    struct virtio_blk_discard_write_zeroes s = {
        .sector = vhd_le64(sector), .num_sectors = vhd_le32(n), .flags = vhd_le32(flags)};
    return s;
}

static uint8_t tb_dwz(struct tb *t, uint32_t type, const struct virtio_blk_discard_write_zeroes *s,
                      uint32_t nseg)
{
    uint32_t used;
    uint8_t st = tb_req(t, type, 0, (void *)s, nseg * 16, false, &used);
    VHD_CHECK_EQ(used, 1);
    return st;
}

/* The image must read back as the initial pattern over [off, off+len). */
static void check_pattern(struct tb *t, uint64_t off, uint64_t len)
{
    uint8_t *buf = malloc(len);
    VHD_CHECK(buf != NULL);
    VHD_CHECK_EQ(pread(t->img_fd, buf, len, (off_t)off), (ssize_t)len);
    for (uint64_t i = 0; i < len; i++)
        if (buf[i] != pattern(off + i)) {
            fprintf(stderr, "  image byte %llu changed\n", (unsigned long long)(off + i));
            VHD_CHECK(0);
        }
    free(buf);
}

static void check_image(struct tb *t, uint64_t off, const void *want, uint64_t len)
{
    uint8_t *buf = malloc(len);
    VHD_CHECK(buf != NULL);
    VHD_CHECK_EQ(pread(t->img_fd, buf, len, (off_t)off), (ssize_t)len);
    VHD_CHECK(memcmp(buf, want, len) == 0);
    free(buf);
}

static bool all_zero(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i])
            return false;
    return true;
}

static void fill_random(uint8_t *p, size_t len, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)x;
    }
}

/* ======================= requests ======================= */

static void rw_roundtrip(const struct tb_opts *o)
{
    struct tb t;
    uint8_t w[8192], r[8192];
    uint32_t used;

    tb_init(&t, o);
    fill_random(w, sizeof(w), 1);
    VHD_CHECK_EQ(tb_write(&t, 16, w, sizeof(w)), VIRTIO_BLK_S_OK);
    check_image(&t, 16 * 512, w, sizeof(w));
    check_pattern(&t, 0, 16 * 512);
    check_pattern(&t, 32 * 512, 512);
    memset(r, 0, sizeof(r));
    VHD_CHECK_EQ(tb_read(&t, 16, r, sizeof(r), &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(used, sizeof(r) + 1);
    VHD_CHECK(memcmp(r, w, sizeof(w)) == 0);
    /* reading the initial content */
    VHD_CHECK_EQ(tb_read(&t, 104, r, 4096, &used), VIRTIO_BLK_S_OK);
    for (int i = 0; i < 4096; i++)
        VHD_CHECK_EQ(r[i], pattern(104 * 512 + (uint64_t)i));
    /* the last block */
    VHD_CHECK_EQ(tb_read(&t, IMG_SIZE / 512 - 8, r, 4096, &used), VIRTIO_BLK_S_OK);
    for (int i = 0; i < 4096; i++)
        VHD_CHECK_EQ(r[i], pattern(IMG_SIZE - 4096 + (uint64_t)i));

    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.writes, 1);
    VHD_CHECK_EQ(st.reads, 3);
    VHD_CHECK_EQ(st.status_ok, 4);
    VHD_CHECK_EQ(st.bytes_written, sizeof(w));
    VHD_CHECK_EQ(st.bytes_read, sizeof(r) + 4096 + 4096);
    VHD_CHECK_EQ(t.tq[0].q->stat_requests, 4);
    tb_fini(&t);
}

VHD_TEST(rw_roundtrip_split)
{
    struct tb_opts o = {0};
    rw_roundtrip(&o);
}

VHD_TEST(rw_roundtrip_packed_indirect)
{
    struct tb_opts o = {.packed = true, .indirect = true};
    rw_roundtrip(&o);
}

VHD_TEST(rw_roundtrip_block_4096)
{
    struct tb_opts o = {.block_size = 4096};
    rw_roundtrip(&o);
}

VHD_TEST(rw_roundtrip_direct)
{
    struct tb_opts o = {.direct = true};
    rw_roundtrip(&o);
}

/* Many data segments, some of odd (512-multiple) sizes, and a full seg_max request. */
VHD_TEST(rw_multi_segment)
{
    struct tb t;
    struct tb_opts o = {.indirect = true};
    struct vhd_drv_buf b[VHD_BLK_SEG_MAX + 2];
    uint8_t *p[VHD_BLK_SEG_MAX], *sp;
    static uint8_t want[VHD_BLK_SEG_MAX * 4096];
    uint32_t n = 0, total = 0;

    tb_init(&t, &o);
    b[n++] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_OUT, 64), 16};
    for (uint32_t i = 0; i < VHD_BLK_SEG_MAX; i++) {
        uint32_t len = (i % 3 == 0) ? 4096 : 512 * (1 + i % 4);
        b[n].gpa = galloc(&t, len, 512, 0, &p[i]);
        b[n++].len = len;
        fill_random(p[i], len, i + 7);
        memcpy(want + total, p[i], len);
        total += len;
    }
    b[n].gpa = galloc(&t, 1, 1, NO_STATUS, &sp);
    b[n++].len = 1;
    VHD_CHECK_EQ(tb_run(&t, b, n - 1, 1), 1);
    VHD_CHECK_EQ(*sp, VIRTIO_BLK_S_OK);
    check_image(&t, 64 * 512, want, total);

    /* Read it back scattered the same way into writable buffers. */
    b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_IN, 64), 16};
    for (uint32_t i = 0; i < VHD_BLK_SEG_MAX; i++) {
        b[1 + i].gpa = galloc(&t, b[1 + i].len, 512, 0, &p[i]);
    }
    b[n - 1].gpa = galloc(&t, 1, 1, NO_STATUS, &sp);
    VHD_CHECK_EQ(tb_run(&t, b, 1, n - 1), total + 1);
    VHD_CHECK_EQ(*sp, VIRTIO_BLK_S_OK);
    uint32_t off = 0;
    for (uint32_t i = 0; i < VHD_BLK_SEG_MAX; i++) {
        VHD_CHECK(memcmp(p[i], want + off, b[1 + i].len) == 0);
        off += b[1 + i].len;
    }
    tb_fini(&t);
}

VHD_TEST(null_backend)
{
    struct tb t;
    struct tb_opts o = {.backend = "null", .serial = "nullserial"};
    uint8_t w[4096], r[4096];
    uint32_t used;
    char id[20];

    tb_init(&t, &o);
    VHD_CHECK_EQ(vhd_blk_capacity(t.dev), IMG_SIZE / 512);
    fill_random(w, sizeof(w), 3);
    VHD_CHECK_EQ(tb_write(&t, 8, w, sizeof(w)), VIRTIO_BLK_S_OK);
    memset(r, 0x5a, sizeof(r));
    VHD_CHECK_EQ(tb_read(&t, 8, r, sizeof(r), &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(used, sizeof(r) + 1);
    VHD_CHECK(all_zero(r, sizeof(r))); /* reads return zeroes, writes are discarded */
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_FLUSH, 0, NULL, 0, false, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_GET_ID, 0, id, 20, true, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK(!memcmp(id, "nullserial\0\0\0\0\0\0\0\0\0\0", 20));
    struct virtio_blk_discard_write_zeroes s = seg(0, 8, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, &s, 1), VIRTIO_BLK_S_OK);
    s = seg(0, 8, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, &s, 1), VIRTIO_BLK_S_OK);
    /* bounds still apply */
    VHD_CHECK_EQ(tb_read(&t, IMG_SIZE / 512, r, 512, &used), VIRTIO_BLK_S_IOERR);
    uint8_t cfg;
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &cfg, 56, 1), 0);
    VHD_CHECK_EQ(cfg, 0); /* nothing to deallocate: write_zeroes_may_unmap = 0 */
    tb_fini(&t);
}

VHD_TEST(flush)
{
    struct tb t;
    struct tb_opts o = {0};
    uint32_t used;
    uint8_t w[512];

    tb_init(&t, &o);
    memset(w, 0x11, sizeof(w));
    VHD_CHECK_EQ(tb_write(&t, 0, w, sizeof(w)), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_FLUSH, 0, NULL, 0, false, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(used, 1);
    /* a non-zero sector and stray data are ignored (5.2.6.1 binds the driver, not us) */
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_FLUSH, 77, w, 512, false, &used), VIRTIO_BLK_S_OK);
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.flushes, 2);
    VHD_CHECK_EQ(st.backend_errors, 0);
    tb_fini(&t);
}

VHD_TEST(get_id)
{
    struct tb t;
    struct tb_opts o = {.serial = "vhostd-serial-01"}; /* 16 bytes */
    uint32_t used;
    uint8_t id[64];

    tb_init(&t, &o);
    memset(id, 0x77, sizeof(id));
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_GET_ID, 0, id, 20, true, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(used, 21);
    VHD_CHECK(!memcmp(id, "vhostd-serial-01\0\0\0\0", 20)); /* NUL padded */
    /* truncated to a shorter buffer */
    memset(id, 0x77, sizeof(id));
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_GET_ID, 0, id, 8, true, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(used, 9);
    VHD_CHECK(!memcmp(id, "vhostd-s", 8));
    /* a longer buffer: 20 bytes of id, zeroes after */
    memset(id, 0x77, sizeof(id));
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_GET_ID, 0, id, 64, true, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(used, 65);
    VHD_CHECK(!memcmp(id, "vhostd-serial-01", 16));
    VHD_CHECK(all_zero(id + 16, 48));
    /* no data at all: nothing to write, still OK */
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_GET_ID, 0, NULL, 0, true, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(used, 1);
    /* id split across buffers, status sharing the last one */
    {
        struct vhd_drv_buf b[3];
        uint8_t *p1, *p2;
        b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_GET_ID, 0), 16};
        b[1] = (struct vhd_drv_buf){galloc(&t, 7, 1, 0x77, &p1), 7};
        b[2] = (struct vhd_drv_buf){galloc(&t, 14, 1, 0x77, &p2), 14}; /* 13 id bytes + status */
        VHD_CHECK_EQ(tb_run(&t, b, 1, 2), 21);
        VHD_CHECK(!memcmp(p1, "vhostd-", 7));
        VHD_CHECK(!memcmp(p2, "serial-01\0\0\0\0", 13));
        VHD_CHECK_EQ(p2[13], VIRTIO_BLK_S_OK);
    }
    tb_fini(&t);

    /* a 20-byte serial has no terminator */
    o.serial = "ABCDEFGHIJKLMNOPQRST";
    tb_init(&t, &o);
    memset(id, 0x77, sizeof(id));
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_GET_ID, 0, id, 20, true, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK(!memcmp(id, "ABCDEFGHIJKLMNOPQRST", 20));
    tb_fini(&t);

    /* no serial: all NULs */
    o.serial = NULL;
    tb_init(&t, &o);
    memset(id, 0x77, sizeof(id));
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_GET_ID, 0, id, 20, true, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK(all_zero(id, 20));
    tb_fini(&t);
}

/* Is [off, off+len) entirely a hole in the image? */
static bool is_hole(struct tb *t, uint64_t off, uint64_t len)
{
    off_t h = lseek(t->img_fd, (off_t)off, SEEK_HOLE);
    if (h != (off_t)off)
        return false;
    off_t d = lseek(t->img_fd, (off_t)off, SEEK_DATA);
    return d < 0 || (uint64_t)d >= off + len;
}

VHD_TEST(discard)
{
    struct tb t;
    struct tb_opts o = {0};
    struct virtio_blk_discard_write_zeroes s[VHD_BLK_MAX_DWZ_SEG + 1];
    struct stat st0, st1;
    uint8_t r[4096];
    uint32_t used;

    tb_init(&t, &o);
    VHD_CHECK_EQ(fstat(t.img_fd, &st0), 0);
    /* one 64 KiB range at 1 MiB */
    s[0] = seg(2048, 128, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 1), VIRTIO_BLK_S_OK);
    VHD_CHECK(is_hole(&t, 1 << 20, 64 << 10));
    VHD_CHECK_EQ(fstat(t.img_fd, &st1), 0);
    VHD_CHECK(st1.st_blocks < st0.st_blocks);
    check_pattern(&t, (1 << 20) - 4096, 4096); /* neighbours untouched */
    check_pattern(&t, (1 << 20) + (64 << 10), 4096);
    VHD_CHECK_EQ(tb_read(&t, 2048, r, sizeof(r), &used), VIRTIO_BLK_S_OK);
    VHD_CHECK(all_zero(r, sizeof(r)));
    /* several segments, an empty one among them */
    s[0] = seg(4096, 8, 0);
    s[1] = seg(4200, 0, 0);
    s[2] = seg(4400, 16, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 3), VIRTIO_BLK_S_OK);
    VHD_CHECK(is_hole(&t, 4096 * 512, 4096));
    VHD_CHECK(is_hole(&t, 4400 * 512, 8192));
    /* the unmap flag is not for discard (5.2.6.2), nor is any other flag: UNSUPP */
    s[0] = seg(8192, 8, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 1), VIRTIO_BLK_S_UNSUPP);
    s[0] = seg(8192, 8, 4);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 1), VIRTIO_BLK_S_UNSUPP);
    /* a bad flag in a later segment: nothing done at all */
    s[0] = seg(8192, 8, 0);
    s[1] = seg(8300, 8, 2);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 2), VIRTIO_BLK_S_UNSUPP);
    check_pattern(&t, 8192 * 512, 4096);
    /* too many segments: UNSUPP; all-in-range max count: OK */
    for (uint32_t i = 0; i <= VHD_BLK_MAX_DWZ_SEG; i++)
        s[i] = seg(10000 + 16 * i, 8, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, VHD_BLK_MAX_DWZ_SEG + 1), VIRTIO_BLK_S_UNSUPP);
    check_pattern(&t, 10000 * 512, 4096);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, VHD_BLK_MAX_DWZ_SEG), VIRTIO_BLK_S_OK);
    /* out of range, overflowing, or a later segment out of range: IOERR, nothing done */
    s[0] = seg(IMG_SIZE / 512 - 4, 8, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 1), VIRTIO_BLK_S_IOERR);
    s[0] = seg(UINT64_MAX - 2, 8, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 1), VIRTIO_BLK_S_IOERR);
    s[0] = seg(12000, 8, 0);
    s[1] = seg(IMG_SIZE / 512, 1, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 2), VIRTIO_BLK_S_IOERR);
    check_pattern(&t, 12000 * 512, 4096);
    /* more sectors than max_discard_sectors */
    s[0] = seg(0, VHD_BLK_MAX_DWZ_SECTORS + 1, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 1), VIRTIO_BLK_S_IOERR);
    /* payload not a whole number of segments, or empty: IOERR */
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_DISCARD, 0, s, 24, false, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_DISCARD, 0, NULL, 0, false, &used), VIRTIO_BLK_S_IOERR);
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.discards, 13);
    tb_fini(&t);

    /* not negotiated: UNSUPP */
    o.features_off = BIT(VIRTIO_BLK_F_DISCARD) | BIT(VIRTIO_BLK_F_WRITE_ZEROES);
    tb_init(&t, &o);
    s[0] = seg(0, 8, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, s, 1), VIRTIO_BLK_S_UNSUPP);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, s, 1), VIRTIO_BLK_S_UNSUPP);
    check_pattern(&t, 0, 4096);
    tb_fini(&t);
}

static void write_zeroes(const struct tb_opts *o)
{
    struct tb t;
    struct virtio_blk_discard_write_zeroes s[2];
    uint8_t r[8192];
    uint32_t used;

    tb_init(&t, o);
    /* without unmap: zeroes, neighbours intact */
    s[0] = seg(256, 16, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, s, 1), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(tb_read(&t, 256, r, 8192, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK(all_zero(r, 8192));
    check_pattern(&t, 255 * 512, 512);
    check_pattern(&t, 272 * 512, 512);
    memset(r, 0xff, sizeof(r));
    VHD_CHECK_EQ(pread(t.img_fd, r, 8192, 256 * 512), 8192);
    VHD_CHECK(all_zero(r, 8192));
    /* with unmap: zeroes, and a hole where the file system can punch one */
    s[0] = seg(1024, 128, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
    s[1] = seg(2048, 8, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, s, 2), VIRTIO_BLK_S_OK);
    VHD_CHECK(is_hole(&t, 1024 * 512, 128 * 512));
    VHD_CHECK_EQ(tb_read(&t, 1024, r, 8192, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK(all_zero(r, 8192));
    VHD_CHECK_EQ(tb_read(&t, 2048, r, 4096, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK(all_zero(r, 4096));
    check_pattern(&t, 2056 * 512, 512);
    /* unknown flag: UNSUPP, nothing written */
    s[0] = seg(3000, 8, 2);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, s, 1), VIRTIO_BLK_S_UNSUPP);
    check_pattern(&t, 3000 * 512, 4096);
    /* out of range */
    s[0] = seg(IMG_SIZE / 512 - 1, 2, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, s, 1), VIRTIO_BLK_S_IOERR);
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.write_zeroes, 4);
    VHD_CHECK_EQ(st.backend_errors, 0);
    tb_fini(&t);
}

VHD_TEST(write_zeroes_writeback)
{
    struct tb_opts o = {0};
    write_zeroes(&o);
}

VHD_TEST(write_zeroes_writethrough_direct)
{
    struct tb_opts o = {.writethrough = true, .direct = true};
    write_zeroes(&o);
}

/* tmpfs has no FALLOC_FL_ZERO_RANGE: zeroes are written by hand (and holes punched). */
VHD_TEST(write_zeroes_fallback_tmpfs)
{
    struct tb_opts o = {.dir = "/dev/shm"};
    if (access("/dev/shm", W_OK) < 0)
        vhd_test_skip("no writable /dev/shm");
    write_zeroes(&o);
    o.writethrough = true;
    write_zeroes(&o);
}

/* The image shrinks under the device: reads past its end fail with IOERR, no hang. */
VHD_TEST(image_shrinks)
{
    struct tb t;
    struct tb_opts o = {0};
    uint8_t r[4096];
    uint32_t used;

    tb_init(&t, &o);
    VHD_CHECK_EQ(ftruncate(t.img_fd, IMG_SIZE / 2), 0);
    VHD_CHECK_EQ(tb_read(&t, IMG_SIZE / 512 - 8, r, 4096, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(used, 1);
    /* straddling the new end: a short read, then nothing more: IOERR */
    VHD_CHECK_EQ(tb_read(&t, IMG_SIZE / 1024 - 4, r, 4096, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_read(&t, 0, r, 4096, &used), VIRTIO_BLK_S_OK);
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.backend_errors, 2);
    tb_fini(&t);
}

VHD_TEST(unsupported_types)
{
    struct tb t;
    struct tb_opts o = {0};
    const uint32_t types[] = {2,
                              3,
                              5,
                              VIRTIO_BLK_T_GET_LIFETIME,
                              VIRTIO_BLK_T_SECURE_ERASE,
                              15,
                              16,
                              0x80000000u,
                              0x80000001u,
                              UINT32_MAX};
    uint8_t buf[512];
    uint32_t used;

    tb_init(&t, &o);
    for (size_t i = 0; i < VHD_ARRAY_SIZE(types); i++) {
        VHD_CHECK_EQ(tb_req(&t, types[i], 0, buf, sizeof(buf), true, &used), VIRTIO_BLK_S_UNSUPP);
        VHD_CHECK_EQ(used, 1);
        VHD_CHECK_EQ(tb_req(&t, types[i], 0, buf, sizeof(buf), false, &used), VIRTIO_BLK_S_UNSUPP);
    }
    check_pattern(&t, 0, 512);
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.status_unsupp, 2 * VHD_ARRAY_SIZE(types));
    tb_fini(&t);
}

VHD_TEST(out_of_range)
{
    struct tb t;
    struct tb_opts o = {0};
    uint8_t buf[1024];
    uint32_t used;
    const uint64_t cap = IMG_SIZE / 512;

    tb_init(&t, &o);
    memset(buf, 0x42, sizeof(buf));
    VHD_CHECK_EQ(tb_read(&t, cap - 1, buf, 1024, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(used, 1);
    VHD_CHECK_EQ(tb_read(&t, cap, buf, 512, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_read(&t, UINT64_MAX, buf, 512, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_read(&t, 1ull << 55, buf, 512, &used), VIRTIO_BLK_S_IOERR); /* *512 wraps */
    VHD_CHECK_EQ(tb_write(&t, cap - 1, buf, 1024), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_write(&t, UINT64_MAX - 1, buf, 1024), VIRTIO_BLK_S_IOERR);
    struct stat st;
    VHD_CHECK_EQ(fstat(t.img_fd, &st), 0);
    VHD_CHECK_EQ(st.st_size, IMG_SIZE); /* nothing written past the end */
    check_pattern(&t, IMG_SIZE - 512, 512);
    /* a zero-length request at the capacity is in range */
    VHD_CHECK_EQ(tb_read(&t, cap, NULL, 0, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(used, 1);
    VHD_CHECK_EQ(tb_read(&t, cap + 1, NULL, 0, &used), VIRTIO_BLK_S_IOERR);
    tb_fini(&t);
}

VHD_TEST(unaligned_length)
{
    struct tb t;
    struct tb_opts o = {0};
    uint8_t buf[1024];
    uint32_t used;

    tb_init(&t, &o);
    memset(buf, 0x42, sizeof(buf));
    VHD_CHECK_EQ(tb_read(&t, 0, buf, 100, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_read(&t, 0, buf, 513, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_write(&t, 0, buf, 1000), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_write(&t, 0, buf, 1), VIRTIO_BLK_S_IOERR);
    check_pattern(&t, 0, 4096);
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.status_ioerr, 4);
    VHD_CHECK_EQ(st.bytes_written, 0);
    tb_fini(&t);
}

VHD_TEST(block_size_4096_alignment)
{
    struct tb t;
    struct tb_opts o = {.block_size = 4096};
    uint8_t buf[8192];
    uint32_t used;
    struct virtio_blk_discard_write_zeroes s;

    tb_init(&t, &o);
    memset(buf, 0x42, sizeof(buf));
    VHD_CHECK_EQ(tb_read(&t, 4, buf, 4096, &used), VIRTIO_BLK_S_IOERR); /* sector not aligned */
    VHD_CHECK_EQ(tb_read(&t, 0, buf, 512, &used), VIRTIO_BLK_S_IOERR);  /* length not aligned */
    VHD_CHECK_EQ(tb_read(&t, 8, buf, 6144, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_write(&t, 1, buf, 4096), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_write(&t, 8, buf, 4096), VIRTIO_BLK_S_OK);
    check_image(&t, 4096, buf, 4096);
    check_pattern(&t, 0, 4096);
    check_pattern(&t, 8192, 8192);
    VHD_CHECK_EQ(tb_read(&t, 16, buf, 8192, &used), VIRTIO_BLK_S_OK);
    s = seg(16, 4, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, &s, 1), VIRTIO_BLK_S_IOERR);
    s = seg(20, 8, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, &s, 1), VIRTIO_BLK_S_IOERR);
    check_pattern(&t, 8192, 8192);
    s = seg(16, 8, 0);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, &s, 1), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(tb_read(&t, 16, buf, 4096, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK(all_zero(buf, 4096));
    check_pattern(&t, 12288, 4096);
    /* config: blk_size, discard alignment, max sectors a multiple of 8 */
    struct virtio_blk_config c;
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, &c, 0, sizeof(c)), 0);
    VHD_CHECK_EQ(vhd_le32(c.blk_size), 4096);
    VHD_CHECK_EQ(vhd_le32(c.discard_sector_alignment), 8);
    VHD_CHECK_EQ(vhd_le32(c.max_discard_sectors) % 8, 0);
    VHD_CHECK_EQ(vhd_le32(c.max_write_zeroes_sectors) % 8, 0);
    VHD_CHECK_EQ(vhd_le64(c.capacity) % 8, 0);
    tb_fini(&t);
}

VHD_TEST(read_only_device)
{
    struct tb t;
    struct tb_opts o = {.ro = true};
    uint8_t buf[4096];
    uint32_t used;
    struct virtio_blk_discard_write_zeroes s = seg(0, 8, 0);

    tb_init(&t, &o);
    VHD_CHECK(t.features & BIT(VIRTIO_BLK_F_RO));
    memset(buf, 0x42, sizeof(buf));
    VHD_CHECK_EQ(tb_write(&t, 0, buf, sizeof(buf)), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_DISCARD, &s, 1), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, &s, 1), VIRTIO_BLK_S_IOERR);
    s = seg(0, 8, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP);
    VHD_CHECK_EQ(tb_dwz(&t, VIRTIO_BLK_T_WRITE_ZEROES, &s, 1), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_read(&t, 0, buf, sizeof(buf), &used), VIRTIO_BLK_S_OK);
    for (size_t i = 0; i < sizeof(buf); i++)
        VHD_CHECK_EQ(buf[i], pattern(i));
    VHD_CHECK_EQ(tb_req(&t, VIRTIO_BLK_T_FLUSH, 0, NULL, 0, false, &used), VIRTIO_BLK_S_OK);
    check_pattern(&t, 0, 8192);
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.backend_errors, 0);
    VHD_CHECK_EQ(st.status_ioerr, 4);
    tb_fini(&t);

    /* ... and the null backend too */
    o.backend = "null";
    tb_init(&t, &o);
    VHD_CHECK_EQ(tb_write(&t, 0, buf, sizeof(buf)), VIRTIO_BLK_S_IOERR);
    tb_fini(&t);
}

/* ======================= malformed chains ======================= */

/* A chain with no device-writable byte: given back with length 0, queue stopped. */
static void missing_status(bool status_readonly)
{
    struct tb t;
    struct tb_opts o = {0};
    struct vhd_drv_buf b[3];
    uint8_t *sp, *dp;

    tb_init(&t, &o);
    b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_OUT, 0), 16};
    b[1] = (struct vhd_drv_buf){galloc(&t, 512, 512, 0x42, &dp), 512};
    b[2] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sp), 1};
    VHD_CHECK_EQ(tb_run(&t, b, status_readonly ? 3 : 2, 0), 0);
    VHD_CHECK_EQ(*sp, NO_STATUS);
    check_pattern(&t, 0, 512); /* not executed */
    /* the runtime marked the queue broken; it takes no more requests */
    uint64_t t0 = mono_ms();
    while (!vhd_load_acquire(&t.tq[0].q->broken))
        VHD_CHECK(mono_ms() - t0 < WAIT_MS);
    b[2].gpa = galloc(&t, 1, 1, NO_STATUS, &sp);
    tq_add(&t, 0, b, 2, 1, (void *)2);
    VHD_CHECK(tb_quiet(&t, 100));
    VHD_CHECK_EQ(*sp, NO_STATUS);
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.bad_chains, 1);
    VHD_CHECK(st.broken);
    VHD_CHECK_EQ(st.completed, 0);
    VHD_CHECK_EQ(t.tq[0].q->inflight_io, 0);
    tb_fini(&t);
}

VHD_TEST(missing_status_byte)
{
    missing_status(false);
}

VHD_TEST(status_in_readonly_buffer)
{
    missing_status(true);
}

/*
 * A chain with no status byte between two good ones, published together so
 * one run pops all three: the one before it completes, the queue stops at
 * it, and the one after it stays in the ring, neither popped nor executed
 * (as when chains were popped one at a time).
 */
VHD_TEST(missing_status_mid_run)
{
    struct tb t;
    struct tb_opts o = {0};
    struct vhd_drv_buf a[3], b[2], c[3];
    uint8_t *sa, *sc, *da, *dc, *db;

    tb_init(&t, &o);
    struct tq *tq = &t.tq[0];
    a[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_OUT, 0), 16};
    a[1] = (struct vhd_drv_buf){galloc(&t, 512, 512, 0x42, &da), 512};
    a[2] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sa), 1};
    b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_OUT, 1), 16};
    b[1] = (struct vhd_drv_buf){galloc(&t, 512, 512, 0x43, &db), 512};
    c[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_OUT, 2), 16};
    c[1] = (struct vhd_drv_buf){galloc(&t, 512, 512, 0x44, &dc), 512};
    c[2] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sc), 1};
    VHD_CHECK_EQ(vhd_drv_vq_add(&tq->dq, a, 2, 1, t.o.indirect, (void *)1), 0);
    VHD_CHECK_EQ(vhd_drv_vq_add(&tq->dq, b, 2, 0, t.o.indirect, (void *)2), 0);
    VHD_CHECK_EQ(vhd_drv_vq_add(&tq->dq, c, 2, 1, t.o.indirect, (void *)3), 0);
    vhd_drv_vq_publish(&tq->dq);
    VHD_CHECK_EQ(eventfd_write(tq->kick_fd, 1), 0);

    uint64_t t0 = mono_ms();
    while (!vhd_load_acquire(&tq->q->broken))
        VHD_CHECK(mono_ms() - t0 < WAIT_MS);
    uint32_t len = 0;
    void *first = tq_wait(&t, 0, &len);
    void *second = tq_wait(&t, 0, &len);
    /* a completed (status OK), b given back unanswered, in either order */
    VHD_CHECK((first == (void *)1 && second == (void *)2) ||
              (first == (void *)2 && second == (void *)1));
    VHD_CHECK(tb_quiet(&t, 100));
    VHD_CHECK_EQ(*sa, VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(*sc, NO_STATUS);
    check_pattern(&t, 512, 1024); /* b and c not executed */
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK_EQ(st.bad_chains, 1);
    VHD_CHECK_EQ(st.completed, 1);
    VHD_CHECK_EQ(tq->q->inflight_io, 0);
    /* c is still the driver's: the engine stopped after b */
    VHD_CHECK_EQ(vhd_vq_get_base(&tq->q->vq) & 0xffff, 2);
    VHD_CHECK_EQ(tq->q->vq.inflight, 0);
    tb_fini(&t);
}

/* A buffer outside guest memory: the engine refuses the chain, the queue stops. */
VHD_TEST(engine_error_stops_queue)
{
    struct tb t;
    struct tb_opts o = {0};
    struct vhd_drv_buf b[3];
    uint8_t *sp;
    uint8_t r[512];
    uint32_t used;

    tb_init(&t, &o);
    VHD_CHECK_EQ(tb_read(&t, 0, r, 512, &used), VIRTIO_BLK_S_OK);
    b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_IN, 0), 16};
    b[1] = (struct vhd_drv_buf){0x7000000000ull, 512};
    b[2] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sp), 1};
    tq_add(&t, 0, b, 1, 2, (void *)3);
    uint64_t t0 = mono_ms();
    while (!vhd_load_acquire(&t.tq[0].q->broken))
        VHD_CHECK(mono_ms() - t0 < WAIT_MS);
    VHD_CHECK(tb_quiet(&t, 50));
    VHD_CHECK_EQ(*sp, NO_STATUS);
    struct vhd_blk_queue_stats st = tb_stats(&t, 0);
    VHD_CHECK(st.broken);
    VHD_CHECK_EQ(st.completed, 1);
    VHD_CHECK_EQ(t.tq[0].q->vq.error, VHD_VQ_E_ADDR);
    tb_fini(&t);
}

VHD_TEST(short_header)
{
    struct tb t;
    struct tb_opts o = {0};
    struct vhd_drv_buf b[2];
    uint8_t *hp, *sp;

    tb_init(&t, &o);
    /* 15 header bytes, then the status: IOERR */
    b[0] = (struct vhd_drv_buf){galloc(&t, 15, 1, 0, &hp), 15};
    b[1] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sp), 1};
    VHD_CHECK_EQ(tb_run(&t, b, 1, 1), 1);
    VHD_CHECK_EQ(*sp, VIRTIO_BLK_S_IOERR);
    /* no readable part at all: a lone writable status byte */
    b[0] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sp), 1};
    VHD_CHECK_EQ(tb_run(&t, b, 0, 1), 1);
    VHD_CHECK_EQ(*sp, VIRTIO_BLK_S_IOERR);
    /* a header in the writable part does not count: IOERR too */
    b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_IN, 0), 16};
    b[1] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sp), 1};
    VHD_CHECK_EQ(tb_run(&t, b, 0, 2), 1);
    VHD_CHECK_EQ(*sp, VIRTIO_BLK_S_IOERR);
    /* the queue still works */
    uint8_t r[512];
    uint32_t used;
    VHD_CHECK_EQ(tb_read(&t, 0, r, 512, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK(!vhd_load_acquire(&t.tq[0].q->broken));
    tb_fini(&t);
}

VHD_TEST(header_split_and_merged)
{
    struct tb t;
    struct tb_opts o = {0};
    struct vhd_drv_buf b[6];
    uint8_t *p[5], *sp;
    uint8_t w[1024];

    tb_init(&t, &o);
    fill_random(w, sizeof(w), 9);
    struct virtio_blk_outhdr h = {.type = vhd_le32(VIRTIO_BLK_T_OUT), .sector = vhd_le64(40)};
    const uint8_t *hb = (const uint8_t *)&h;
    /* header in three pieces (5 + 7 + 4), the last also holding the first data bytes */
    b[0] = (struct vhd_drv_buf){galloc(&t, 5, 1, 0, &p[0]), 5};
    b[1] = (struct vhd_drv_buf){galloc(&t, 7, 1, 0, &p[1]), 7};
    b[2] = (struct vhd_drv_buf){galloc(&t, 4 + 100, 1, 0, &p[2]), 4 + 100};
    b[3] = (struct vhd_drv_buf){galloc(&t, 924, 4, 0, &p[3]), 924};
    b[4] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sp), 1};
    memcpy(p[0], hb, 5);
    memcpy(p[1], hb + 5, 7);
    memcpy(p[2], hb + 12, 4);
    memcpy(p[2] + 4, w, 100);
    memcpy(p[3], w + 100, 924);
    VHD_CHECK_EQ(tb_run(&t, b, 4, 1), 1);
    VHD_CHECK_EQ(*sp, VIRTIO_BLK_S_OK);
    check_image(&t, 40 * 512, w, sizeof(w));

    /* header and all data in one buffer; read back into data+status in one buffer */
    uint8_t *one;
    b[0] = (struct vhd_drv_buf){galloc(&t, 16 + 1024, 8, 0, &one), 16 + 1024};
    h.sector = vhd_le64(80);
    memcpy(one, &h, 16);
    memcpy(one + 16, w, 1024);
    b[1] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sp), 1};
    VHD_CHECK_EQ(tb_run(&t, b, 1, 1), 1);
    VHD_CHECK_EQ(*sp, VIRTIO_BLK_S_OK);
    check_image(&t, 80 * 512, w, sizeof(w));

    uint8_t *rd;
    b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_IN, 80), 16};
    b[1] = (struct vhd_drv_buf){galloc(&t, 1025, 8, NO_STATUS, &rd), 1025};
    VHD_CHECK_EQ(tb_run(&t, b, 1, 1), 1025);
    VHD_CHECK(!memcmp(rd, w, 1024));
    VHD_CHECK_EQ(rd[1024], VIRTIO_BLK_S_OK);

    /* extra writable bytes before the status of a write are ignored */
    b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_OUT, 120), 16};
    b[1] = (struct vhd_drv_buf){galloc(&t, 512, 512, 0, &p[0]), 512};
    memcpy(p[0], w, 512);
    b[2] = (struct vhd_drv_buf){galloc(&t, 9, 1, NO_STATUS, &sp), 9};
    VHD_CHECK_EQ(tb_run(&t, b, 2, 1), 1);
    VHD_CHECK_EQ(sp[8], VIRTIO_BLK_S_OK);
    check_image(&t, 120 * 512, w, 512);
    tb_fini(&t);
}

/* O_DIRECT with guest buffers that are not aligned: bounced, still correct. */
VHD_TEST(direct_misaligned_buffers)
{
    struct tb t;
    struct tb_opts o = {.direct = true};
    struct vhd_drv_buf b[4];
    uint8_t *one, *rd, *sp;
    uint8_t w[2048];

    tb_init(&t, &o);
    fill_random(w, sizeof(w), 11);
    struct virtio_blk_outhdr h = {.type = vhd_le32(VIRTIO_BLK_T_OUT), .sector = vhd_le64(200)};
    b[0] = (struct vhd_drv_buf){galloc(&t, 16 + 2048, 512, 0, &one), 16 + 2048};
    memcpy(one, &h, 16);
    memcpy(one + 16, w, 2048);
    b[1] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sp), 1};
    VHD_CHECK_EQ(tb_run(&t, b, 1, 1), 1);
    VHD_CHECK_EQ(*sp, VIRTIO_BLK_S_OK);
    check_image(&t, 200 * 512, w, sizeof(w));
    b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_IN, 200), 16};
    b[1] = (struct vhd_drv_buf){galloc(&t, 2052, 512, NO_STATUS, &rd) + 3, 2049};
    rd += 3;
    VHD_CHECK_EQ(tb_run(&t, b, 1, 1), 2049);
    VHD_CHECK(!memcmp(rd, w, 2048));
    VHD_CHECK_EQ(rd[2048], VIRTIO_BLK_S_OK);

    /* bigger than one bounce chunk (256 KiB), split over two misaligned buffers */
    enum { BIG = 600 << 10 };
    static uint8_t wb[BIG];
    uint8_t *p2;
    fill_random(wb, BIG, 12);
    h.sector = vhd_le64(4096);
    b[0] = (struct vhd_drv_buf){galloc(&t, 16 + 4096 + 8, 512, 0, &one), 16 + 4096 + 8};
    memcpy(one, &h, 16);
    memcpy(one + 16, wb, 4096 + 8);
    b[1] = (struct vhd_drv_buf){galloc(&t, BIG, 512, 0, &p2) + 8, BIG - 4096 - 8};
    memcpy(p2 + 8, wb + 4096 + 8, BIG - 4096 - 8);
    b[2] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &sp), 1};
    VHD_CHECK_EQ(tb_run(&t, b, 2, 1), 1);
    VHD_CHECK_EQ(*sp, VIRTIO_BLK_S_OK);
    check_image(&t, 4096 * 512, wb, BIG);
    b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_IN, 4096), 16};
    b[1] = (struct vhd_drv_buf){galloc(&t, BIG + 8, 512, NO_STATUS, &rd) + 5, 1000};
    b[2] = (struct vhd_drv_buf){galloc(&t, BIG + 8, 512, NO_STATUS, &p2) + 7, BIG - 1000 + 1};
    VHD_CHECK_EQ(tb_run(&t, b, 1, 2), BIG + 1);
    VHD_CHECK(!memcmp(rd + 5, wb, 1000));
    VHD_CHECK(!memcmp(p2 + 7, wb + 1000, BIG - 1000));
    VHD_CHECK_EQ(p2[7 + BIG - 1000], VIRTIO_BLK_S_OK);
    tb_fini(&t);
}

/* A segment above size_max (negotiated): IOERR. */
VHD_TEST(size_max_exceeded)
{
    struct tb t;
    struct tb_opts o = {0};
    uint32_t used;
    static uint8_t big[VHD_BLK_SIZE_MAX + 512];

    tb_init(&t, &o);
    VHD_CHECK_EQ(tb_read(&t, 0, big, VHD_BLK_SIZE_MAX + 512, &used), VIRTIO_BLK_S_IOERR);
    VHD_CHECK_EQ(tb_read(&t, 0, big, VHD_BLK_SIZE_MAX, &used), VIRTIO_BLK_S_OK);
    tb_fini(&t);

    /* without SIZE_MAX negotiated, the same request is fine */
    o.features_off = BIT(VIRTIO_BLK_F_SIZE_MAX);
    tb_init(&t, &o);
    VHD_CHECK_EQ(tb_read(&t, 0, big, VHD_BLK_SIZE_MAX + 512, &used), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(used, VHD_BLK_SIZE_MAX + 513);
    tb_fini(&t);
}

/* Many requests in flight at once, on two queues served by two workers. */
VHD_TEST(many_inflight_two_queues)
{
    struct tb t;
    struct tb_opts o = {.nqueues = 2, .nworkers = 2, .indirect = true};
    enum { N = 100, LEN = 4096 };
    uint8_t *data[MAX_TQ][N], *st[MAX_TQ][N];

    tb_init(&t, &o);
    VHD_CHECK_EQ(t.ntq, 2);
    for (unsigned qi = 0; qi < 2; qi++) {
        for (unsigned i = 0; i < N; i++) {
            uint64_t sector = (qi * N + i) * (LEN / 512);
            struct vhd_drv_buf b[3];
            b[0] = (struct vhd_drv_buf){hdr_gpa(&t, VIRTIO_BLK_T_OUT, sector), 16};
            b[1] = (struct vhd_drv_buf){galloc(&t, LEN, 4096, 0, &data[qi][i]), LEN};
            fill_random(data[qi][i], LEN, qi * 1000 + i);
            b[2] = (struct vhd_drv_buf){galloc(&t, 1, 1, NO_STATUS, &st[qi][i]), 1};
            VHD_CHECK_EQ(vhd_drv_vq_add(&t.tq[qi].dq, b, 2, 1, true, (void *)(uintptr_t)(i + 1)),
                         0);
        }
        vhd_drv_vq_publish(&t.tq[qi].dq);
        VHD_CHECK_EQ(eventfd_write(t.tq[qi].kick_fd, 1), 0);
    }
    for (unsigned qi = 0; qi < 2; qi++) {
        bool seen[N] = {false};
        for (unsigned k = 0; k < N; k++) {
            uint32_t len;
            uintptr_t c = (uintptr_t)tq_wait(&t, qi, &len);
            VHD_CHECK(c >= 1 && c <= N && !seen[c - 1]);
            seen[c - 1] = true;
            VHD_CHECK_EQ(len, 1);
            VHD_CHECK_EQ(*st[qi][c - 1], VIRTIO_BLK_S_OK);
        }
    }
    for (unsigned qi = 0; qi < 2; qi++)
        for (unsigned i = 0; i < N; i++)
            check_image(&t, (uint64_t)(qi * N + i) * LEN, data[qi][i], LEN);
    tb_fini(&t);
}

/* ======================= features and config ======================= */

VHD_TEST(features_offered_and_negotiation)
{
    struct tb t;
    struct tb_opts o = {0};

    tb_init_detached(&t, &o);
    struct vhd_dev *d = t.dev;
    uint64_t f = d->ops->features(d);
    const int want[] = {VIRTIO_F_VERSION_1,       VIRTIO_F_INDIRECT_DESC, VIRTIO_F_EVENT_IDX,
                        VIRTIO_F_RING_PACKED,     VIRTIO_BLK_F_SIZE_MAX,  VIRTIO_BLK_F_SEG_MAX,
                        VIRTIO_BLK_F_BLK_SIZE,    VIRTIO_BLK_F_TOPOLOGY,  VIRTIO_BLK_F_FLUSH,
                        VIRTIO_BLK_F_CONFIG_WCE,  VIRTIO_BLK_F_MQ,        VIRTIO_BLK_F_DISCARD,
                        VIRTIO_BLK_F_WRITE_ZEROES};
    for (size_t i = 0; i < VHD_ARRAY_SIZE(want); i++)
        VHD_CHECK(f & BIT(want[i]));
    VHD_CHECK(!(f & BIT(VIRTIO_BLK_F_RO)));
    VHD_CHECK(!(f & BIT(VIRTIO_F_ACCESS_PLATFORM)));
    VHD_CHECK(!(f & BIT(VIRTIO_BLK_F_GEOMETRY)));
    VHD_CHECK_EQ(strcmp(d->ops->type, "blk"), 0);
    VHD_CHECK_EQ(d->ops->config_size, sizeof(struct virtio_blk_config));
    /* legacy drivers (no VERSION_1) are refused */
    VHD_CHECK_EQ(d->ops->set_features(d, f & ~BIT(VIRTIO_F_VERSION_1)), -EINVAL);
    VHD_CHECK_EQ(d->ops->set_features(d, 0), -EINVAL);
    /* bits not offered are refused; the transport's own bits pass through */
    VHD_CHECK_EQ(d->ops->set_features(d, f | BIT(VIRTIO_F_ACCESS_PLATFORM)), -EINVAL);
    VHD_CHECK_EQ(d->ops->set_features(d, f | BIT(VIRTIO_BLK_F_GEOMETRY)), -EINVAL);
    VHD_CHECK_EQ(d->ops->set_features(d, f | BIT(30)), 0);
    VHD_CHECK_EQ(d->ops->set_features(d, BIT(VIRTIO_F_VERSION_1)), 0);
    tb_fini(&t);

    /* packed not allowed: not offered */
    char err[256];
    struct vhd_blk_opts bo = {.backend = "null", .size = 1 << 20};
    struct vhd_dev *dev;
    VHD_CHECK_EQ(vhd_blk_new(&bo, &dev, err, sizeof(err)), 0);
    VHD_CHECK(!(dev->ops->features(dev) & BIT(VIRTIO_F_RING_PACKED)));
    VHD_CHECK(dev->allow_split && !dev->allow_packed);
    VHD_CHECK_EQ(dev->num_queues, 1);
    VHD_CHECK_EQ(dev->queues[0].index, 0);
    VHD_CHECK_EQ(dev->queues[0].kick_fd, -1);
    VHD_CHECK_EQ(dev->queues[0].call_fd, -1);
    VHD_CHECK_EQ(dev->queues[0].err_fd, -1);
    VHD_CHECK(((uintptr_t)dev->queues & (VHD_CACHELINE - 1)) == 0);
    vhd_blk_free(dev);
    /* split refused: the driver must take RING_PACKED */
    bo.allow_packed = true;
    bo.no_split = true;
    bo.num_queues = 3;
    VHD_CHECK_EQ(vhd_blk_new(&bo, &dev, err, sizeof(err)), 0);
    VHD_CHECK_EQ(dev->num_queues, 3);
    VHD_CHECK_EQ(dev->queues[2].index, 2);
    uint64_t df = dev->ops->features(dev);
    VHD_CHECK_EQ(dev->ops->set_features(dev, df & ~BIT(VIRTIO_F_RING_PACKED)), -EINVAL);
    VHD_CHECK_EQ(dev->ops->set_features(dev, df), 0);
    vhd_blk_free(dev);
}

VHD_TEST(config_space)
{
    struct tb t;
    struct tb_opts o = {.nqueues = 2};
    struct virtio_blk_config c;

    tb_init_detached(&t, &o);
    struct vhd_dev *d = t.dev;
    memset(&c, 0xff, sizeof(c));
    VHD_CHECK_EQ(d->ops->get_config(d, &c, 0, sizeof(c)), 0);
    VHD_CHECK_EQ(vhd_le64(c.capacity), IMG_SIZE / 512);
    VHD_CHECK_EQ(vhd_le32(c.size_max), VHD_BLK_SIZE_MAX);
    VHD_CHECK_EQ(vhd_le32(c.seg_max), VHD_BLK_SEG_MAX);
    VHD_CHECK_EQ(vhd_le16(c.geometry.cylinders), 0);
    VHD_CHECK_EQ(c.geometry.heads, 0);
    VHD_CHECK_EQ(c.geometry.sectors, 0);
    VHD_CHECK_EQ(vhd_le32(c.blk_size), 512);
    VHD_CHECK(c.topology.physical_block_exp <= 3); /* ext4's 4 KiB block over 512 */
    VHD_CHECK_EQ(c.topology.alignment_offset, 0);
    VHD_CHECK_EQ(vhd_le16(c.topology.min_io_size), 1u << c.topology.physical_block_exp);
    VHD_CHECK_EQ(vhd_le32(c.topology.opt_io_size), 0);
    VHD_CHECK_EQ(c.writeback, 1); /* default: writeback */
    VHD_CHECK_EQ(c.unused0, 0);
    VHD_CHECK_EQ(vhd_le16(c.num_queues), 2);
    VHD_CHECK_EQ(vhd_le32(c.max_discard_sectors), VHD_BLK_MAX_DWZ_SECTORS);
    VHD_CHECK_EQ(vhd_le32(c.max_discard_seg), VHD_BLK_MAX_DWZ_SEG);
    VHD_CHECK_EQ(vhd_le32(c.discard_sector_alignment), 1);
    VHD_CHECK_EQ(vhd_le32(c.max_write_zeroes_sectors), VHD_BLK_MAX_DWZ_SECTORS);
    VHD_CHECK_EQ(vhd_le32(c.max_write_zeroes_seg), VHD_BLK_MAX_DWZ_SEG);
    VHD_CHECK_EQ(c.write_zeroes_may_unmap, 1);
    VHD_CHECK(c.unused1[0] == 0 && c.unused1[1] == 0 && c.unused1[2] == 0);
    VHD_CHECK_EQ(vhd_le32(c.max_secure_erase_sectors), 0);
    VHD_CHECK_EQ(vhd_le32(c.max_secure_erase_seg), 0);
    VHD_CHECK_EQ(vhd_le32(c.secure_erase_sector_alignment), 0);

    /* windows of it, byte by byte */
    uint8_t whole[sizeof(c)], b[8];
    memcpy(whole, &c, sizeof(c));
    for (uint32_t off = 0; off < sizeof(c); off++) {
        VHD_CHECK_EQ(d->ops->get_config(d, b, off, 1), 0);
        VHD_CHECK_EQ(b[0], whole[off]);
    }
    VHD_CHECK_EQ(d->ops->get_config(d, b, 34, 2), 0);
    VHD_CHECK_EQ(b[0] | b[1] << 8, 2);
    VHD_CHECK_EQ(d->ops->get_config(d, b, 0, 0), 0);
    VHD_CHECK_EQ(d->ops->get_config(d, b, sizeof(c) - 1, 2), -EINVAL);
    VHD_CHECK_EQ(d->ops->get_config(d, b, UINT32_MAX, 2), -EINVAL);

    /* set_config: read-only fields */
    uint8_t one = 1, zero = 0;
    uint64_t cap = 1;
    VHD_CHECK_EQ(d->ops->set_config(d, &cap, 0, 8), -EPERM);
    VHD_CHECK_EQ(d->ops->set_config(d, &zero, 33, 1), -EPERM);
    VHD_CHECK_EQ(d->ops->set_config(d, &cap, 32, 2), -EPERM); /* writeback + unused0 */
    VHD_CHECK_EQ(d->ops->set_config(d, &cap, 20, 4), -EPERM);
    VHD_CHECK_EQ(d->ops->set_config(d, &one, sizeof(c), 1), -EINVAL);
    VHD_CHECK_EQ(d->ops->get_config(d, &c, 0, sizeof(c)), 0);
    VHD_CHECK_EQ(vhd_le64(c.capacity), IMG_SIZE / 512);
    /* writeback toggles */
    VHD_CHECK_EQ(d->ops->set_config(d, &zero, 32, 1), 0);
    VHD_CHECK_EQ(d->ops->get_config(d, b, 32, 1), 0);
    VHD_CHECK_EQ(b[0], 0);
    uint8_t two = 2;
    VHD_CHECK_EQ(d->ops->set_config(d, &two, 32, 1), 0);
    VHD_CHECK_EQ(d->ops->get_config(d, b, 32, 1), 0);
    VHD_CHECK_EQ(b[0], 1);
    /* reset restores the default */
    VHD_CHECK_EQ(d->ops->set_config(d, &zero, 32, 1), 0);
    d->ops->reset(d);
    VHD_CHECK_EQ(d->ops->get_config(d, b, 32, 1), 0);
    VHD_CHECK_EQ(b[0], 1);
    /* after reset nothing is negotiated: writeback is read-only */
    VHD_CHECK_EQ(d->ops->set_config(d, &zero, 32, 1), -EPERM);
    tb_fini(&t);

    /* without CONFIG_WCE negotiated, writeback is read-only too */
    o.features_off = BIT(VIRTIO_BLK_F_CONFIG_WCE);
    tb_init_detached(&t, &o);
    VHD_CHECK_EQ(t.dev->ops->set_config(t.dev, &zero, 32, 1), -EPERM);
    tb_fini(&t);

    /* CONFIG_WCE without FLUSH: writeback starts at 0 (5.2.5.2) */
    o.features_off = BIT(VIRTIO_BLK_F_FLUSH);
    tb_init_detached(&t, &o);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, b, 32, 1), 0);
    VHD_CHECK_EQ(b[0], 0);
    tb_fini(&t);

    /* the writethrough option */
    o.features_off = 0;
    o.writethrough = true;
    tb_init_detached(&t, &o);
    VHD_CHECK_EQ(t.dev->ops->get_config(t.dev, b, 32, 1), 0);
    VHD_CHECK_EQ(b[0], 0);
    tb_fini(&t);
}

/*
 * The rw_flags of the write the test bed's worker submitted to its io_uring
 * for byte offset off, or -1 if it submitted none: read from the ring's SQE
 * array, where consumed SQEs stay until the slot is reused (a test bed's ring
 * has far more slots than a test submits). Each offset must be written once
 * per test bed, so the match is that write. The array is mapped again, read
 * only, from the one io_uring fd the process has (the test bed's single
 * worker): the worker's ring is its own, and these reads touch the kernel's
 * pages through our mapping. Call after the write completed: the kernel has
 * consumed the SQE, and its used element orders the worker's stores before.
 */
static int submitted_write_flags(uint64_t off)
{
    char path[64], link[64], line[128];
    int ufd = -1, found = 0;
    unsigned mask = 0;

    DIR *d = opendir("/proc/self/fd");
    VHD_CHECK(d != NULL);
    for (struct dirent *de; (de = readdir(d)) != NULL;) {
        ssize_t n = readlinkat(dirfd(d), de->d_name, link, sizeof(link) - 1);
        if (n > 0 && (link[n] = '\0', strcmp(link, "anon_inode:[io_uring]") == 0)) {
            ufd = atoi(de->d_name);
            found++;
        }
    }
    closedir(d);
    VHD_CHECK_EQ(found, 1);
    snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", ufd);
    FILE *f = fopen(path, "r");
    VHD_CHECK(f != NULL);
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "SqMask: %x", &mask) == 1)
            break;
    fclose(f);
    VHD_CHECK(mask != 0);
    size_t len = (size_t)(mask + 1) * sizeof(struct io_uring_sqe);
    const struct io_uring_sqe *sqes = mmap(NULL, len, PROT_READ, MAP_SHARED, ufd, IORING_OFF_SQES);
    VHD_CHECK(sqes != MAP_FAILED);

    int flags = -1, matches = 0;
    for (unsigned i = 0; i <= mask; i++) {
        if ((sqes[i].opcode == IORING_OP_WRITEV || sqes[i].opcode == IORING_OP_WRITE) &&
            sqes[i].off == off) {
            flags = (int)sqes[i].rw_flags;
            matches++;
        }
    }
    munmap((void *)sqes, len);
    VHD_CHECK(matches <= 1);
    return flags;
}

/*
 * Writes carry RWF_DSYNC exactly when the cache is writethrough (5.2.6.2): the
 * flag is checked on the write the worker submitted to io_uring (and the
 * device's dsync_writes counter agrees). Every write goes to its own sector.
 */
VHD_TEST(write_cache_modes)
{
    struct tb t;
    struct tb_opts o = {0};
    uint8_t w[512] = {1};
    uint8_t zero = 0, one = 1;

    /* FLUSH + writeback: volatile writes */
    tb_init(&t, &o);
    VHD_CHECK_EQ(tb_write(&t, 0, w, 512), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(submitted_write_flags(0), 0);
    VHD_CHECK_EQ(tb_stats(&t, 0).dsync_writes, 0);
    /* switch to writethrough (queues quiesced, as the transport does) */
    VHD_CHECK_EQ(vhd_rt_detach(t.rt, t.tq[0].q, WAIT_MS), 0);
    VHD_CHECK_EQ(t.dev->ops->set_config(t.dev, &zero, 32, 1), 0);
    VHD_CHECK_EQ(vhd_rt_attach(t.rt, t.tq[0].q, 0), 0);
    VHD_CHECK_EQ(tb_write(&t, 1, w, 512), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(submitted_write_flags(1 * 512), RWF_DSYNC);
    VHD_CHECK_EQ(tb_write(&t, 2, w, 512), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(submitted_write_flags(2 * 512), RWF_DSYNC);
    VHD_CHECK_EQ(tb_stats(&t, 0).dsync_writes, 2);
    /* back to writeback */
    VHD_CHECK_EQ(vhd_rt_detach(t.rt, t.tq[0].q, WAIT_MS), 0);
    VHD_CHECK_EQ(t.dev->ops->set_config(t.dev, &one, 32, 1), 0);
    VHD_CHECK_EQ(vhd_rt_attach(t.rt, t.tq[0].q, 0), 0);
    VHD_CHECK_EQ(tb_write(&t, 3, w, 512), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(submitted_write_flags(3 * 512), 0);
    VHD_CHECK_EQ(tb_stats(&t, 0).dsync_writes, 2);
    tb_fini(&t);

    /* FLUSH not negotiated: every write is stable at completion */
    o.features_off = BIT(VIRTIO_BLK_F_FLUSH) | BIT(VIRTIO_BLK_F_CONFIG_WCE);
    tb_init(&t, &o);
    VHD_CHECK_EQ(tb_write(&t, 0, w, 512), VIRTIO_BLK_S_OK);
    VHD_CHECK_EQ(submitted_write_flags(0), RWF_DSYNC);
    VHD_CHECK_EQ(tb_stats(&t, 0).dsync_writes, 1);
    tb_fini(&t);
}

/* ======================= creation errors ======================= */

static int try_new(struct vhd_blk_opts *bo, char *err, size_t errlen)
{
    struct vhd_dev *dev = (struct vhd_dev *)(uintptr_t)1;
    err[0] = '\0';
    int rc = vhd_blk_new(bo, &dev, err, errlen);
    if (rc == 0) {
        vhd_blk_free(dev);
    } else {
        VHD_CHECK(dev == NULL);
        VHD_CHECK(err[0] != '\0'); /* a message, every time */
        VHD_CHECK(strchr(err, '\n') == NULL);
    }
    return rc;
}

VHD_TEST(new_errors)
{
    char err[256], path[320], dir[256];
    struct vhd_blk_opts bo;

    vhd_log_set_level(VHD_LOG_ERROR);
    snprintf(dir, sizeof(dir), "%s/vhd-test-blkdir-XXXXXX", tmpdir());
    VHD_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/disk.img", dir);

    /* missing image, no size: -ENOENT */
    memset(&bo, 0, sizeof(bo));
    bo.image = path;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -ENOENT);
    VHD_CHECK(strstr(err, path) != NULL);
    /* missing image, read-only: not created */
    bo.size = 1 << 20;
    bo.ro = true;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -ENOENT);
    VHD_CHECK(access(path, F_OK) < 0);
    /* missing image with a size: created sparse */
    bo.ro = false;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), 0);
    struct stat st;
    VHD_CHECK_EQ(stat(path, &st), 0);
    VHD_CHECK_EQ(st.st_size, 1 << 20);
    VHD_CHECK_EQ(st.st_blocks, 0);
    /* existing image: size must match when given */
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), 0);
    bo.size = 2 << 20;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    bo.size = 0;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), 0);
    /* unreadable image (skipped as root, who reads anything) */
    if (geteuid() != 0) {
        VHD_CHECK_EQ(chmod(path, 0), 0);
        VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EACCES);
        VHD_CHECK_EQ(chmod(path, 0644), 0);
    }
    /* bad block sizes */
    const uint32_t bad_bs[] = {1, 256, 511, 1000, 1536, 8192, UINT32_MAX};
    for (size_t i = 0; i < VHD_ARRAY_SIZE(bad_bs); i++) {
        bo.block_size = bad_bs[i];
        VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
        VHD_CHECK(strstr(err, "block size") != NULL);
    }
    bo.block_size = 4096;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), 0);
    bo.block_size = 0;
    /* bad backend name */
    bo.backend = "nbd";
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    VHD_CHECK(strstr(err, "nbd") != NULL);
    bo.backend = "uring";
    /* serial too long, too many queues, no ring layout */
    bo.serial = "123456789012345678901";
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    bo.serial = "12345678901234567890";
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), 0);
    bo.serial = NULL;
    bo.num_queues = VHD_BLK_MAX_QUEUES + 1;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    bo.num_queues = VHD_BLK_MAX_QUEUES;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), 0);
    bo.num_queues = 0;
    bo.no_split = true;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    bo.no_split = false;
    /* a directory is not an image */
    bo.image = dir;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EISDIR);
    /* an image smaller than one block */
    VHD_CHECK_EQ(truncate(path, 1000), 0);
    bo.image = path;
    bo.block_size = 4096;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    bo.block_size = 512;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), 0); /* 1 sector, the tail ignored */
    VHD_CHECK_EQ(truncate(path, 0), 0);
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    /* null backend: needs a size, takes no image */
    memset(&bo, 0, sizeof(bo));
    bo.backend = "null";
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    bo.size = 1 << 20;
    bo.image = path;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    bo.image = NULL;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), 0);
    /* uring without an image */
    bo.backend = NULL;
    VHD_CHECK_EQ(try_new(&bo, err, sizeof(err)), -EINVAL);
    /* no options at all */
    struct vhd_dev *dev;
    VHD_CHECK_EQ(vhd_blk_new(NULL, &dev, err, sizeof(err)), -EINVAL);
    VHD_CHECK_EQ(vhd_blk_new(NULL, &dev, NULL, 0), -EINVAL);
    vhd_blk_free(NULL);

    unlink(path);
    rmdir(dir);
}

/* queue_init / queue_fini lifecycle, stats before init. */
VHD_TEST(queue_lifecycle)
{
    char err[256];
    struct vhd_blk_opts bo = {.backend = "null", .size = 1 << 20, .num_queues = 2};
    struct vhd_dev *dev;
    struct vhd_blk_queue_stats st;

    vhd_log_set_level(VHD_LOG_ERROR);
    VHD_CHECK_EQ(vhd_blk_new(&bo, &dev, err, sizeof(err)), 0);
    struct vhd_queue *q = &dev->queues[1];
    VHD_CHECK_EQ(vhd_blk_queue_stats(q, &st), -ENODEV);
    VHD_CHECK_EQ(dev->ops->queue_init(dev, q), -EINVAL); /* no size yet */
    q->size = 256;
    VHD_CHECK_EQ(dev->ops->queue_init(dev, q), 0);
    VHD_CHECK(q->priv != NULL);
    VHD_CHECK(((uintptr_t)q->priv & (VHD_CACHELINE - 1)) == 0);
    VHD_CHECK_EQ(dev->ops->queue_init(dev, q), 0); /* again: the old state is replaced */
    VHD_CHECK_EQ(vhd_blk_queue_stats(q, &st), 0);
    VHD_CHECK_EQ(st.completed, 0);
    dev->ops->queue_fini(dev, q);
    VHD_CHECK(q->priv == NULL);
    dev->ops->queue_fini(dev, q); /* twice is harmless */
    VHD_CHECK_EQ(dev->ops->queue_process(q, 64), -ENODEV);
    q->size = 256;
    VHD_CHECK_EQ(dev->ops->queue_init(dev, q), 0);
    vhd_blk_free(dev); /* finalises remaining queues */
}
