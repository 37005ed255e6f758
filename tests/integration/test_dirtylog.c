/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Dirty-page logging for live migration (core/dirtylog.h, VHOST_F_LOG_ALL +
 * LOG_SHMFD).
 *
 * In process: the bitmap arithmetic, the checks on a log a front-end sends,
 * and the engine logging its ring writes and a device's data writes (both
 * layouts), nothing when off.
 *
 * Against the real daemon, through our front-end (src/driver/vu_frontend.c)
 * as QEMU drives it while migrating: with logging on, blk reads mark exactly
 * the pages of the data and status buffers plus the used ring's page; writes
 * (the device only reads guest memory) mark the status and used ring pages
 * and no data page; logging off marks nothing; the log replaced under
 * traffic is never touched after the reply and is unmapped; malformed
 * SET_LOG_BASE messages are refused with an error and the device keeps
 * serving; a log file truncated under the daemon is absorbed (SIGBUS guard),
 * reported, and a second device keeps serving verified I/O. virtio-net
 * (loopback): a frame received marks its receive buffer and the used rings,
 * not the transmitted buffer nor the receive buffer left unused.
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
#include <sys/wait.h>
#include <unistd.h>

#include "core/dirtylog.h"
#include "core/memguard.h"
#include "spec/virtio_blk.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "driver/vu_frontend.h"
#include "harness.h"
#include "spec/vhost_user.h"
#include "vhostd/blk_driver.h"
#include "vq_fixture.h"

#define WAIT_MS     5000
#define MAX_DAEMONS 1
#define PAGE        4096ull
#define REGION      (1ull << 20)
#define QSIZE       16u
#define MAX_PAGES   4096

#include "daemon_fixture.h"

static uint64_t page_of(uint64_t gpa)
{
    return gpa / PAGE;
}

/* A set of page numbers (sorted, unique). */
struct pageset {
    size_t n;
    uint64_t p[MAX_PAGES];
};

static void ps_add_range(struct pageset *s, uint64_t gpa, uint64_t len)
{
    for (uint64_t pg = page_of(gpa); pg <= page_of(gpa + len - 1); pg++) {
        size_t i = 0;
        while (i < s->n && s->p[i] < pg)
            i++;
        if (i < s->n && s->p[i] == pg)
            continue;
        VHD_CHECK(s->n < MAX_PAGES);
        memmove(&s->p[i + 1], &s->p[i], (s->n - i) * sizeof(s->p[0]));
        s->p[i] = pg;
        s->n++;
    }
}

static bool ps_has(const struct pageset *s, uint64_t pg)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->p[i] == pg)
            return true;
    return false;
}

/* Take the front-end log's dirty pages (and clear them). */
static void ps_collect(struct pageset *s, struct vhd_vuf_log *log)
{
    s->n = vhd_vuf_log_collect(log, s->p, MAX_PAGES);
    VHD_CHECK(s->n <= MAX_PAGES);
}

static void ps_expect(const struct pageset *got, const struct pageset *want)
{
    bool same = got->n == want->n;
    for (size_t i = 0; same && i < got->n; i++)
        same = got->p[i] == want->p[i];
    if (!same) {
        fprintf(stderr, "  dirty pages:");
        for (size_t i = 0; i < got->n; i++)
            fprintf(stderr, " %#llx", (unsigned long long)got->p[i]);
        fprintf(stderr, "\n  expected:   ");
        for (size_t i = 0; i < want->n; i++)
            fprintf(stderr, " %#llx", (unsigned long long)want->p[i]);
        fprintf(stderr, "\n");
    }
    VHD_CHECK(same);
}

static int memfd_of(const char *name, size_t len)
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(ftruncate(fd, (off_t)len), 0);
    return fd;
}

/* ======================= in process ======================= */

VHD_TEST(mark_sets_exactly_the_pages_of_a_range)
{
    int fd = memfd_of("vhd-test-log", 2 * PAGE);
    struct vhd_dirtylog *log = NULL;
    const char *why = NULL;
    VHD_CHECK_EQ(vhd_dirtylog_map(fd, 64, 0, &log, &why), 0); /* 512 pages */
    uint8_t *b = log->bits;

    vhd_dirtylog_mark(log, 0x3fff, 1); /* page 3 */
    VHD_CHECK_EQ(b[0], 0x08);
    vhd_dirtylog_mark(log, 5 * PAGE + 100, 0); /* empty: nothing */
    VHD_CHECK_EQ(b[0], 0x08);
    /* Pages 6..17: across three bytes. */
    vhd_dirtylog_mark(log, 6 * PAGE + 7, 11 * PAGE + 1);
    VHD_CHECK_EQ(b[0], 0xc8);
    VHD_CHECK_EQ(b[1], 0xff);
    VHD_CHECK_EQ(b[2], 0x03);
    VHD_CHECK_EQ(b[3], 0);
    /* Clipped at the end of the log (page 511), and beyond it nothing at all. */
    vhd_dirtylog_mark(log, 510 * PAGE, 10 * PAGE);
    VHD_CHECK_EQ(b[63], 0xc0);
    vhd_dirtylog_mark(log, 512 * PAGE, PAGE);
    vhd_dirtylog_mark(log, UINT64_MAX - 10, 100); /* would wrap: saturates, beyond the log */
    for (int i = 4; i < 63; i++)
        VHD_CHECK_EQ(b[i], 0);
    VHD_CHECK_EQ(b[63], 0xc0);
    /* The bits are the file's: the front-end sees them. */
    uint8_t first;
    VHD_CHECK_EQ(pread(fd, &first, 1, 0), 1);
    VHD_CHECK_EQ(first, 0xc8);
    vhd_dirtylog_free(log);
    close(fd);
}

VHD_TEST(map_refuses_bad_logs)
{
    int fd = memfd_of("vhd-test-log", 4 * PAGE);
    struct vhd_dirtylog *log = NULL;
    const char *why = NULL;
    int pfd[2];
    VHD_CHECK_EQ(pipe(pfd), 0);

    VHD_CHECK_EQ(vhd_dirtylog_map(fd, 0, 0, &log, &why), -EINVAL);
    VHD_CHECK_EQ(vhd_dirtylog_map(fd, VHD_DIRTYLOG_MAX_SIZE + 1, 0, &log, &why), -EINVAL);
    VHD_CHECK_EQ(vhd_dirtylog_map(fd, PAGE, 100, &log, &why), -EINVAL);
    VHD_CHECK_EQ(vhd_dirtylog_map(fd, 8, UINT64_MAX & ~(PAGE - 1), &log, &why), -EINVAL);
    VHD_CHECK_EQ(vhd_dirtylog_map(fd, PAGE, 4 * PAGE, &log, &why), -ENXIO);
    VHD_CHECK_EQ(vhd_dirtylog_map(fd, 4 * PAGE + 8, 0, &log, &why), -ENXIO);
    VHD_CHECK_EQ(vhd_dirtylog_map(pfd[0], 8, 0, &log, &why), -ENODEV);
    VHD_CHECK_EQ(vhd_dirtylog_map(-1, 8, 0, &log, &why), -EBADF);
    VHD_CHECK(log == NULL);
    /* At an offset: the bitmap starts there. */
    VHD_CHECK_EQ(vhd_dirtylog_map(fd, 2 * PAGE, 2 * PAGE, &log, &why), 0);
    vhd_dirtylog_mark(log, 0, 1);
    uint8_t v = 0;
    VHD_CHECK_EQ(pread(fd, &v, 1, 2 * PAGE), 1);
    VHD_CHECK_EQ(v, 1);
    VHD_CHECK_EQ(pread(fd, &v, 1, 0), 1);
    VHD_CHECK_EQ(v, 0);
    vhd_dirtylog_free(log);
    close(pfd[0]);
    close(pfd[1]);
    close(fd);
}

/*
 * The engine with the mock driver: a request with a readable and a
 * writable buffer; the "device" writes the writable one and logs it.
 */
static void engine_case(bool packed, bool log_on, bool log_used)
{
    struct vqfx f;
    struct vqfx_opts o = {.size = QSIZE, .packed = packed, .uva = true};
    vqfx_setup(&f, &o);
    int lfd = memfd_of("vhd-test-log", PAGE);
    struct vhd_dirtylog *log = NULL;
    const char *why;
    VHD_CHECK_EQ(vhd_dirtylog_map(lfd, PAGE, 0, &log, &why), 0); /* 32768 pages: 128 MiB */
    /* log_guest_addr: the used ring (split) or the device event area (packed). */
    vhd_vq_set_log(&f.vq, log_on ? log : NULL, log_used, f.dq.used_gpa);

    /* Buffers on pages of their own, the writable one across two pages. */
    void *rp, *wp;
    uint64_t rgpa = vhd_guestmem_alloc(&f.gm, PAGE, PAGE, &rp);
    uint64_t wgpa = vhd_guestmem_alloc(&f.gm, 3 * PAGE, PAGE, &wp) + PAGE + 100;
    struct vhd_drv_buf bufs[2] = {{rgpa, 64}, {wgpa, (uint32_t)PAGE}};
    for (int round = 0; round < 3; round++) {
        VHD_CHECK_EQ(vhd_drv_vq_add(&f.dq, bufs, 1, 1, false, NULL), 0);
        vhd_drv_vq_publish(&f.dq);
        struct iovec iov[4];
        struct vhd_vq_chain c;
        VHD_CHECK_EQ(vhd_vq_pop(&f.vq, iov, 4, &c), 1);
        VHD_CHECK_EQ(c.nw, 1);
        memset(iov[1].iov_base, 0x5a, iov[1].iov_len);
        vhd_vq_log_write(&f.vq, &iov[1], 1, iov[1].iov_len);
        VHD_CHECK_EQ(vhd_vq_push(&f.vq, &c, (uint32_t)iov[1].iov_len), 0);
        vhd_vq_flush(&f.vq);
        void *cookie;
        uint32_t len;
        VHD_CHECK_EQ(vhd_drv_vq_get_used(&f.dq, &cookie, &len), 1);
    }

    struct pageset want = {0}, got = {0};
    if (log_on) {
        ps_add_range(&want, wgpa, PAGE);
        if (log_used) /* the used elements / used descriptors: inside the ring area's page */
            ps_add_range(&want, packed ? f.dq.desc_gpa : f.dq.used_gpa, 1);
    }
    struct vhd_vuf_log view = {.fd = -1, .chunks = (uint64_t *)(void *)log->bits, .size = PAGE};
    ps_collect(&got, &view);
    ps_expect(&got, &want);
    VHD_CHECK(!ps_has(&got, page_of(rgpa)));

    /* Turning notifications on/off writes the used part too (used->flags / device area). */
    vhd_vq_disable_notify(&f.vq);
    (void)vhd_vq_enable_notify(&f.vq);
    ps_collect(&got, &view);
    VHD_CHECK_EQ(got.n, log_on && log_used ? 1 : 0);
    vhd_dirtylog_free(log);
    close(lfd);
    vqfx_teardown(&f);
}

VHD_TEST(engine_logs_split_ring_and_data)
{
    engine_case(false, true, true);
}

VHD_TEST(engine_logs_packed_ring_and_data)
{
    engine_case(true, true, true);
}

VHD_TEST(engine_without_ring_flag_logs_data_only)
{
    engine_case(false, true, false);
    engine_case(true, true, false);
}

VHD_TEST(engine_logs_nothing_when_off)
{
    engine_case(false, false, true);
    engine_case(true, false, true);
}

/* ======================= against the daemon ======================= */

struct fe {
    struct vhd_vuf f;
    struct vhd_guestmem gm; /* region 0: rings, headers, status bytes; region 1: data */
    struct vhd_drv_vq vq;
    struct vhd_vuf_ring ring;
    bool packed;
    int kick, call;
    struct virtio_blk_outhdr *hdr; /* QSIZE headers, on a page of their own */
    uint64_t hdr_gpa;
    uint8_t *status; /* QSIZE status bytes, on a page of their own */
    uint64_t status_gpa;
    uint8_t *data; /* region 1 */
    uint64_t data_gpa;
    unsigned next; /* next header/status slot */
};

static void fe_open(struct fe *e, const char *sock, bool packed)
{
    memset(e, 0, sizeof(*e));
    e->packed = packed;
    VHD_CHECK_EQ(vhd_guestmem_init(&e->gm, 2, REGION, 0x100000, 0x100000), 0);
    vhd_vuf_init(&e->f, WAIT_MS);
    VHD_CHECK_EQ(vhd_vuf_connect(&e->f, sock), 0);
    VHD_CHECK_EQ(vhd_vuf_handshake(&e->f, (1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK) |
                                              (1ull << VHOST_USER_PROTOCOL_F_LOG_SHMFD)),
                 0);
    VHD_CHECK(vhd_vuf_has_proto(&e->f, VHOST_USER_PROTOCOL_F_LOG_SHMFD));
    VHD_CHECK(e->f.offered & (1ull << VHOST_F_LOG_ALL));
    VHD_CHECK_EQ(vhd_vuf_set_features(&e->f, (1ull << VIRTIO_F_VERSION_1) |
                                                 (packed ? 1ull << VIRTIO_F_RING_PACKED : 0)),
                 0);
    VHD_CHECK_EQ(vhd_vuf_set_mem_table(&e->f, &e->gm), 0);

    size_t area_len = vhd_drv_vq_area_size(QSIZE, packed, 0);
    void *area, *h;
    uint64_t area_gpa = vhd_guestmem_alloc(&e->gm, area_len, PAGE, &area);
    VHD_CHECK(area_len <= PAGE && area_gpa < 0x100000 + REGION);
    struct vhd_drv_vq_params p = {
        .size = QSIZE, .packed = packed, .area = area, .area_gpa = area_gpa, .area_len = area_len};
    VHD_CHECK_EQ(vhd_drv_vq_init(&e->vq, &p), 0);
    e->hdr_gpa = vhd_guestmem_alloc(&e->gm, PAGE, PAGE, &h);
    e->hdr = h;
    e->status_gpa = vhd_guestmem_alloc(&e->gm, PAGE, PAGE, &h);
    e->status = h;
    VHD_CHECK(e->status_gpa < 0x100000 + REGION);
    e->data_gpa = e->gm.r[1].gpa;
    e->data = e->gm.r[1].hva;

    e->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->call = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    VHD_CHECK(e->kick >= 0 && e->call >= 0);
    e->ring = (struct vhd_vuf_ring){.index = 0,
                                    .num = QSIZE,
                                    .desc = vhd_guestmem_uva(&e->gm, e->vq.desc_gpa),
                                    .avail = vhd_guestmem_uva(&e->gm, e->vq.avail_gpa),
                                    .used = vhd_guestmem_uva(&e->gm, e->vq.used_gpa),
                                    .base = packed ? 0x80008000u : 0,
                                    .kick_fd = e->kick,
                                    .call_fd = e->call};
    VHD_CHECK_EQ(vhd_vuf_ring_start(&e->f, &e->ring), 0);
}

static void fe_close(struct fe *e)
{
    vhd_vuf_close(&e->f);
    vhd_drv_vq_fini(&e->vq);
    vhd_guestmem_fini(&e->gm);
    close(e->kick);
    close(e->call);
}

/* Logging on or off the way QEMU does it: LOG_ALL, then the ring's log flag at its used part. */
static void fe_log(struct fe *e, bool on, bool ring_flag)
{
    VHD_CHECK_EQ(vhd_vuf_set_log_all(&e->f, on), 0);
    VHD_CHECK_EQ(vhd_vuf_ring_set_log(&e->f, &e->ring, on && ring_flag, e->vq.used_gpa), 0);
}

/* A log for all of guest memory (QEMU sizes it to the top of the memory table). */
static void fe_log_alloc(struct fe *e, struct vhd_vuf_log *log, const char *name)
{
    const struct vhd_guestmem_region *last = &e->gm.r[e->gm.nregions - 1];
    VHD_CHECK_EQ(vhd_vuf_log_alloc(log, last->gpa + last->size, name), 0);
}

/* Queue one request (not kicked): type, sector, len bytes of data at data offset off. */
static void fe_add(struct fe *e, uint32_t type, uint64_t sector, uint64_t off, uint32_t len)
{
    unsigned s = e->next++ % QSIZE;
    e->hdr[s].type = type;
    e->hdr[s].sector = sector;
    e->status[s] = 0xff;
    struct vhd_drv_buf b[3] = {{e->hdr_gpa + s * sizeof(e->hdr[0]), sizeof(e->hdr[0])},
                               {e->data_gpa + off, len},
                               {e->status_gpa + s, 1}};
    bool out = type == VIRTIO_BLK_T_OUT;
    VHD_CHECK_EQ(vhd_drv_vq_add(&e->vq, b, out ? 2 : 1, out ? 1 : 2, false, &e->status[s]), 0);
}

static void fe_kick(struct fe *e)
{
    vhd_drv_vq_publish(&e->vq);
    uint64_t one = 1;
    VHD_CHECK_EQ(write(e->kick, &one, sizeof(one)), (ssize_t)sizeof(one));
}

/* Wait (bounded) for n requests, each with status OK. */
static void fe_wait(struct fe *e, unsigned n)
{
    uint64_t t0 = ms_now();
    unsigned got = 0;
    while (got < n) {
        void *cookie;
        uint32_t len;
        int rc = vhd_drv_vq_get_used(&e->vq, &cookie, &len);
        VHD_CHECK(rc >= 0);
        if (rc == 1) {
            VHD_CHECK_EQ(*(uint8_t *)cookie, VIRTIO_BLK_S_OK);
            got++;
            continue;
        }
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(1);
    }
}

/* The page(s) of the ring part the device writes: split used ring; packed descriptors. */
static void want_ring(struct pageset *w, const struct fe *e)
{
    if (e->packed) {
        ps_add_range(w, e->vq.desc_gpa, 16 * QSIZE);
        ps_add_range(w, e->vq.used_gpa, 4);
    } else {
        ps_add_range(w, e->vq.used_gpa, 4 + 8 * QSIZE + 2);
    }
}

static void start_daemon(struct daemon *dm, const char *tmpl, char *second_sock, size_t len)
{
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    daemon_prepare_dir(dm, tmpl, "a.sock");
    track(dm);
    static char spec_a[600], spec_b[600];
    snprintf(second_sock, len, "%s/b.sock", dm->dir);
    snprintf(dm->img, sizeof(dm->img), "%s/a.img", dm->dir);
    snprintf(spec_a, sizeof(spec_a), "socket=%s,image=%s,size=16M", dm->sock, dm->img);
    snprintf(spec_b, sizeof(spec_b), "socket=%s,backend=null,size=16M", second_sock);
    char *argv[] = {(char *)bin, "--log-level", "info",  "--workers", "2",
                    "--blk",     spec_a,        "--blk", spec_b,      NULL};
    daemon_spawn(dm, argv);
}

/* Reads mark data + status + ring pages; writes mark status + ring pages; off marks nothing. */
static void reads_and_writes(bool packed)
{
    struct daemon dm;
    char sock_b[256];
    start_daemon(&dm, "vhd-test-dlog-XXXXXX", sock_b, sizeof(sock_b));
    struct fe e;
    fe_open(&e, dm.sock, packed);
    struct vhd_vuf_log log;
    fe_log_alloc(&e, &log, "vhd-test-log");
    VHD_CHECK_EQ(vhd_vuf_set_log_base(&e.f, log.fd, log.size, 0), 0);

    /* A pattern written to the disk with logging on: data pages stay clean. */
    for (uint64_t i = 0; i < 6 * PAGE; i++)
        e.data[i] = (uint8_t)(i * 13 + 7);
    fe_log(&e, true, true);
    struct pageset got, want = {0};
    ps_collect(&got, &log); /* whatever logging on itself wrote (ring flags) */
    fe_add(&e, VIRTIO_BLK_T_OUT, 0, 0, (uint32_t)(6 * PAGE));
    fe_kick(&e);
    fe_wait(&e, 1);
    ps_collect(&got, &log);
    ps_add_range(&want, e.status_gpa, 1);
    want_ring(&want, &e);
    ps_expect(&got, &want);

    /* Reads back into buffers that straddle pages: exactly those pages, plus status and ring. */
    memset(e.data, 0, 64 * PAGE);
    fe_add(&e, VIRTIO_BLK_T_IN, 0, 16 * PAGE + 512, 2 * 4096); /* pages 16..18 of region 1 */
    fe_add(&e, VIRTIO_BLK_T_IN, 8, 40 * PAGE, 512);            /* page 40 */
    fe_kick(&e);
    fe_wait(&e, 2);
    for (uint64_t i = 0; i < 2 * 4096; i++)
        VHD_CHECK_EQ(e.data[16 * PAGE + 512 + i], (uint8_t)(i * 13 + 7));
    for (uint64_t i = 0; i < 512; i++)
        VHD_CHECK_EQ(e.data[40 * PAGE + i], (uint8_t)((i + 4096) * 13 + 7));
    ps_collect(&got, &log);
    want.n = 0;
    ps_add_range(&want, e.data_gpa + 16 * PAGE + 512, 2 * 4096);
    ps_add_range(&want, e.data_gpa + 40 * PAGE, 512);
    ps_add_range(&want, e.status_gpa, 1);
    want_ring(&want, &e);
    ps_expect(&got, &want);
    VHD_CHECK(!ps_has(&got, page_of(e.hdr_gpa)));

    /* GET_ID writes its 20 bytes of serial: that page too. */
    fe_add(&e, VIRTIO_BLK_T_GET_ID, 0, 45 * PAGE + 4090, 20); /* across pages 45 and 46 */
    fe_kick(&e);
    fe_wait(&e, 1);
    ps_collect(&got, &log);
    want.n = 0;
    ps_add_range(&want, e.data_gpa + 45 * PAGE + 4090, 20);
    ps_add_range(&want, e.status_gpa, 1);
    want_ring(&want, &e);
    ps_expect(&got, &want);

    /* LOG_ALL on, ring flag off: the data and status, not the ring. */
    fe_log(&e, true, false);
    ps_collect(&got, &log);
    fe_add(&e, VIRTIO_BLK_T_IN, 0, 50 * PAGE, 4096);
    fe_kick(&e);
    fe_wait(&e, 1);
    ps_collect(&got, &log);
    want.n = 0;
    ps_add_range(&want, e.data_gpa + 50 * PAGE, 4096);
    ps_add_range(&want, e.status_gpa, 1);
    ps_expect(&got, &want);

    /* Logging off (the log stays set): nothing at all. */
    fe_log(&e, false, false);
    ps_collect(&got, &log);
    for (unsigned i = 0; i < 4; i++)
        fe_add(&e, VIRTIO_BLK_T_IN, 0, (60 + i) * PAGE, 4096);
    fe_kick(&e);
    fe_wait(&e, 4);
    ps_collect(&got, &log);
    VHD_CHECK_EQ(got.n, 0);

    fe_close(&e);
    vhd_vuf_log_release(&log);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

VHD_TEST(daemon_split_reads_mark_data_status_and_used_ring)
{
    reads_and_writes(false);
}

VHD_TEST(daemon_packed_reads_mark_data_status_and_descriptors)
{
    reads_and_writes(true);
}

/* Does the daemon still map a file whose name contains `name`? */
static bool daemon_maps(const struct daemon *dm, const char *name)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)dm->pid);
    FILE *f = fopen(path, "r");
    VHD_CHECK(f != NULL);
    bool found = false;
    while (fgets(line, sizeof(line), f))
        if (strstr(line, name))
            found = true;
    fclose(f);
    return found;
}

VHD_TEST(daemon_log_replaced_mid_traffic)
{
    struct daemon dm;
    char sock_b[256];
    start_daemon(&dm, "vhd-test-dlog-XXXXXX", sock_b, sizeof(sock_b));
    struct fe e;
    fe_open(&e, dm.sock, false);
    struct vhd_vuf_log a, b;
    fe_log_alloc(&e, &a, "vhd-test-log-a");
    fe_log_alloc(&e, &b, "vhd-test-log-b");
    VHD_CHECK_EQ(vhd_vuf_set_log_base(&e.f, a.fd, a.size, 0), 0);
    fe_log(&e, true, true);
    VHD_CHECK(daemon_maps(&dm, "vhd-test-log-a"));

    for (unsigned round = 0; round < 6; round++) {
        /* Reads in flight while the log is replaced: each lands in one log or the other. */
        unsigned base = round * 32, n = QSIZE / 3; /* three descriptors each */
        for (unsigned i = 0; i < n; i++)
            fe_add(&e, VIRTIO_BLK_T_IN, 0, (base + i) * PAGE, 4096);
        fe_kick(&e);
        struct vhd_vuf_log *from = round % 2 ? &b : &a, *to = round % 2 ? &a : &b;
        VHD_CHECK_EQ(vhd_vuf_set_log_base(&e.f, to->fd, to->size, 0), 0);
        /* After the reply the old log is never written again... */
        struct pageset old = {0}, cur = {0};
        ps_collect(&old, from);
        fe_wait(&e, n);
        /* ...so everything after it is in the new one. */
        struct pageset late;
        ps_collect(&late, from);
        VHD_CHECK_EQ(late.n, 0);
        ps_collect(&cur, to);
        for (unsigned i = 0; i < n; i++) {
            uint64_t pg = page_of(e.data_gpa + (base + i) * PAGE);
            VHD_CHECK(ps_has(&old, pg) || ps_has(&cur, pg));
        }
        VHD_CHECK(ps_has(&old, page_of(e.status_gpa)) || ps_has(&cur, page_of(e.status_gpa)));
        /* The old log is unmapped once replaced. */
        VHD_CHECK(!daemon_maps(&dm, round % 2 ? "vhd-test-log-b" : "vhd-test-log-a"));
        VHD_CHECK(daemon_maps(&dm, round % 2 ? "vhd-test-log-a" : "vhd-test-log-b"));
    }
    fe_close(&e);
    vhd_vuf_log_release(&a);
    vhd_vuf_log_release(&b);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* Write then read back a pattern through the blk driver on the second device. */
static void other_device_io(const char *sock, unsigned seed)
{
    char err[256];
    struct vhd_blkdrv *d;
    struct vhd_blkdrv_opts o = {.socket_path = sock, .timeout_ms = WAIT_MS};
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &d, err, sizeof(err)), 0);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    void *buf = vhd_blkdrv_buf_alloc(q, 64 * 1024);
    VHD_CHECK(buf != NULL);
    struct vhd_blkdrv_completion c;
    VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, 0, buf, 64 * 1024, NULL), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, buf, 64 * 1024, NULL), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    (void)seed;
    vhd_blkdrv_buf_free(q, buf, 64 * 1024);
    vhd_blkdrv_disconnect(d);
}

VHD_TEST(daemon_refuses_malformed_set_log_base_and_keeps_serving)
{
    struct daemon dm;
    char sock_b[256];
    start_daemon(&dm, "vhd-test-dlog-XXXXXX", sock_b, sizeof(sock_b));
    struct fe e;
    fe_open(&e, dm.sock, false);
    struct vhd_vuf_log good;
    fe_log_alloc(&e, &good, "vhd-test-log-good");
    VHD_CHECK_EQ(vhd_vuf_set_log_base(&e.f, good.fd, good.size, 0), 0);
    fe_log(&e, true, true);

    int small = memfd_of("vhd-test-log-small", PAGE);
    int pfd[2];
    VHD_CHECK_EQ(pipe(pfd), 0);
    struct {
        int fd;
        uint64_t size, offset;
        const char *what;
    } bad[] = {
        {small, 0, 0, "size 0"},
        {small, VHD_DIRTYLOG_MAX_SIZE + 8, 0, "size above the maximum"},
        {small, 8, 100, "unaligned offset"},
        {small, 8, 1ull << 20, "offset beyond the file"},
        {small, 2 * PAGE, 0, "file shorter than the log"},
        {small, 8, UINT64_MAX & ~(PAGE - 1), "offset overflows"},
        {-1, 8, 0, "no fd"},
        {pfd[0], 8, 0, "a pipe"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = vhd_vuf_set_log_base(&e.f, bad[i].fd, bad[i].size, bad[i].offset);
        if (rc != -EIO)
            fprintf(stderr, "  %s: %d (%s)\n", bad[i].what, rc, vhd_vuf_strerror(&e.f));
        VHD_CHECK_EQ(rc, -EIO);
        VHD_CHECK(vhd_vuf_alive(&e.f));
    }
    /* The session serves, and logs into the log it had. */
    struct pageset got, want = {0};
    ps_collect(&got, &good);
    fe_add(&e, VIRTIO_BLK_T_IN, 0, 3 * PAGE, 4096);
    fe_kick(&e);
    fe_wait(&e, 1);
    ps_collect(&got, &good);
    ps_add_range(&want, e.data_gpa + 3 * PAGE, 4096);
    ps_add_range(&want, e.status_gpa, 1);
    want_ring(&want, &e);
    ps_expect(&got, &want);
    VHD_CHECK(!daemon_log_has(&dm, "needs reset"));

    close(small);
    close(pfd[0]);
    close(pfd[1]);
    fe_close(&e);
    vhd_vuf_log_release(&good);
    other_device_io(sock_b, 1);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

VHD_TEST(daemon_survives_a_log_truncated_under_it)
{
    struct daemon dm;
    char sock_b[256];
    start_daemon(&dm, "vhd-test-dlog-XXXXXX", sock_b, sizeof(sock_b));
    other_device_io(sock_b, 1);
    struct fe e;
    fe_open(&e, dm.sock, false);
    struct vhd_vuf_log log;
    fe_log_alloc(&e, &log, "vhd-test-log-trunc");
    VHD_CHECK_EQ(vhd_vuf_set_log_base(&e.f, log.fd, log.size, 0), 0);
    fe_log(&e, true, true);

    /* The front-end shrinks the log's file: the daemon's next mark faults. */
    VHD_CHECK_EQ(ftruncate(log.fd, 0), 0);
    fe_add(&e, VIRTIO_BLK_T_IN, 0, 0, 4096);
    fe_kick(&e);
    fe_wait(&e, 1); /* the request completes; its marks went to a zero page */
    uint64_t t0 = ms_now();
    while (!daemon_log_has(&dm, "dirty log was truncated") && ms_now() - t0 < WAIT_MS)
        sleep_ms(10);
    VHD_CHECK(daemon_log_has(&dm, "dirty log was truncated"));
    VHD_CHECK_EQ(waitpid(dm.pid, NULL, WNOHANG), 0);
    other_device_io(sock_b, 2);
    fe_close(&e);
    munmap(log.chunks, log.size); /* the file is empty now */
    log.chunks = NULL;
    vhd_vuf_log_release(&log);

    /* The device serves a fresh session. */
    fe_open(&e, dm.sock, false);
    fe_add(&e, VIRTIO_BLK_T_IN, 0, 0, 4096);
    fe_kick(&e);
    fe_wait(&e, 1);
    fe_close(&e);
    other_device_io(sock_b, 3);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* ======================= virtio-net receive ======================= */

VHD_TEST(daemon_net_rx_marks_receive_buffers)
{
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-dlog-XXXXXX", "n.sock");
    track(&dm);
    char spec[300];
    snprintf(spec, sizeof(spec), "socket=%s,backend=loopback", dm.sock);
    char *argv[] = {(char *)bin, "--log-level", "info", "--net", spec, NULL};
    daemon_spawn(&dm, argv);

    struct vhd_guestmem gm;
    VHD_CHECK_EQ(vhd_guestmem_init(&gm, 2, REGION, 0x100000, 0x100000), 0);
    struct vhd_vuf f;
    vhd_vuf_init(&f, WAIT_MS);
    VHD_CHECK_EQ(vhd_vuf_connect(&f, dm.sock), 0);
    VHD_CHECK_EQ(vhd_vuf_handshake(&f, (1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK) |
                                           (1ull << VHOST_USER_PROTOCOL_F_LOG_SHMFD)),
                 0);
    VHD_CHECK(f.offered & (1ull << VHOST_F_LOG_ALL));
    f.max_rings = 2; /* receive 0, transmit 1 */
    VHD_CHECK_EQ(vhd_vuf_set_features(&f, 1ull << VIRTIO_F_VERSION_1), 0);
    VHD_CHECK_EQ(vhd_vuf_set_mem_table(&f, &gm), 0);

    struct vhd_drv_vq dq[2];
    struct vhd_vuf_ring ring[2];
    int efd[4];
    for (unsigned i = 0; i < 2; i++) {
        size_t len = vhd_drv_vq_area_size(QSIZE, false, 0);
        void *area;
        uint64_t gpa = vhd_guestmem_alloc(&gm, len, PAGE, &area);
        struct vhd_drv_vq_params p = {
            .size = QSIZE, .area = area, .area_gpa = gpa, .area_len = len};
        VHD_CHECK_EQ(vhd_drv_vq_init(&dq[i], &p), 0);
        efd[2 * i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        efd[2 * i + 1] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        ring[i] = (struct vhd_vuf_ring){.index = i,
                                        .num = QSIZE,
                                        .desc = vhd_guestmem_uva(&gm, dq[i].desc_gpa),
                                        .avail = vhd_guestmem_uva(&gm, dq[i].avail_gpa),
                                        .used = vhd_guestmem_uva(&gm, dq[i].used_gpa),
                                        .kick_fd = efd[2 * i],
                                        .call_fd = efd[2 * i + 1]};
        VHD_CHECK_EQ(vhd_vuf_ring_start(&f, &ring[i]), 0);
    }
    struct vhd_vuf_log log;
    VHD_CHECK_EQ(vhd_vuf_log_alloc(&log, gm.r[1].gpa + gm.r[1].size, "vhd-test-log-net"), 0);
    VHD_CHECK_EQ(vhd_vuf_set_log_base(&f, log.fd, log.size, 0), 0);
    VHD_CHECK_EQ(vhd_vuf_set_log_all(&f, true), 0);
    for (unsigned i = 0; i < 2; i++)
        VHD_CHECK_EQ(vhd_vuf_ring_set_log(&f, &ring[i], true, dq[i].used_gpa), 0);
    struct pageset got, want = {0};
    ps_collect(&got, &log);

    /* Two receive buffers, a page each (data region), and one frame to send. */
    uint64_t rx = gm.r[1].gpa, tx = gm.r[1].gpa + 8 * PAGE;
    uint8_t *txp = vhd_guestmem_ptr(&gm, tx, PAGE);
    memset(txp, 0, 12);
    for (unsigned i = 0; i < 64; i++)
        txp[12 + i] = (uint8_t)(i < 12 ? 0xff : i);
    uint64_t one = 1;
    for (unsigned i = 0; i < 2; i++) {
        struct vhd_drv_buf b = {rx + i * PAGE, 2048};
        VHD_CHECK_EQ(vhd_drv_vq_add(&dq[0], &b, 0, 1, false, NULL), 0);
    }
    vhd_drv_vq_publish(&dq[0]);
    VHD_CHECK_EQ(write(efd[0], &one, sizeof(one)), (ssize_t)sizeof(one));
    struct vhd_drv_buf t = {tx, 12 + 64};
    VHD_CHECK_EQ(vhd_drv_vq_add(&dq[1], &t, 1, 0, false, NULL), 0);
    vhd_drv_vq_publish(&dq[1]);
    VHD_CHECK_EQ(write(efd[2], &one, sizeof(one)), (ssize_t)sizeof(one));

    /* The frame comes back on the receive ring (loopback). */
    uint64_t t0 = ms_now();
    void *cookie;
    uint32_t len = 0;
    int rc;
    while ((rc = vhd_drv_vq_get_used(&dq[0], &cookie, &len)) == 0) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(1);
    }
    VHD_CHECK_EQ(rc, 1);
    VHD_CHECK_EQ(len, 12 + 64);
    while ((rc = vhd_drv_vq_get_used(&dq[1], &cookie, &len)) == 0) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(1);
    }
    VHD_CHECK_EQ(memcmp(vhd_guestmem_ptr(&gm, rx, 76) + 12, txp + 12, 64), 0);
    sleep_ms(20); /* the worker settles (notification state written and logged) */
    ps_collect(&got, &log);
    ps_add_range(&want, rx, 12 + 64); /* the first receive buffer; the second is untouched */
    ps_add_range(&want, dq[0].used_gpa, 4 + 8 * QSIZE + 2);
    ps_add_range(&want, dq[1].used_gpa, 4 + 8 * QSIZE + 2);
    ps_expect(&got, &want);

    vhd_vuf_close(&f);
    vhd_vuf_log_release(&log);
    for (unsigned i = 0; i < 2; i++)
        vhd_drv_vq_fini(&dq[i]);
    for (unsigned i = 0; i < 4; i++)
        close(efd[i]);
    vhd_guestmem_fini(&gm);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}
