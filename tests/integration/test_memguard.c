/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The SIGBUS guard (core/memguard.h): a front-end that shrinks its
 * guest-memory file under us must not kill the daemon.
 *
 * In-process: a mapped region whose memfd is truncated reads zeros after the
 * guard absorbs the fault, the table reports it, the notify eventfd fires,
 * and the pages that still exist stay shared. A SIGBUS outside guest memory
 * still kills. Against the real daemon (sandbox on): a front-end truncates
 * the region holding a request's data buffer, then the one holding its
 * rings; the daemon survives, says the device needs a reset, a second
 * device keeps serving verified I/O throughout, and the first device serves
 * a fresh session afterwards.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/mem.h"
#include "core/memguard.h"
#include "spec/virtio_blk.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "driver/vu_frontend.h"
#include "harness.h"
#include "spec/vhost_user.h"
#include "vhostd/blk_driver.h"

#define WAIT_MS     5000
#define MAX_DAEMONS 1
#define PAGE        4096u
#define REGION      (1u << 20)

#include "daemon_fixture.h"

static int memfd_of(size_t len)
{
    int fd = memfd_create("vhd-test-guard", MFD_CLOEXEC);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(ftruncate(fd, (off_t)len), 0);
    return fd;
}

/* ======================= in process ======================= */

VHD_TEST(truncated_region_reads_zeros_and_is_reported)
{
    int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    VHD_CHECK(efd >= 0);
    VHD_CHECK_EQ(vhd_memguard_install(efd), 0);

    int fd = memfd_of(4 * PAGE);
    struct vhd_mem_region_desc d = {.gpa = 0x10000, .size = 4 * PAGE, .uva = 0x7000000, .fd = fd};
    struct vhd_mem *mem;
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), 0);
    uint8_t *p = vhd_mem_gpa_to_hva(mem, 0x10000, 4 * PAGE, &(uint32_t){0});
    VHD_CHECK(p != NULL);
    memset(p, 0xab, 4 * PAGE);
    VHD_CHECK(!vhd_mem_faulted(mem));

    /* The front-end takes the last two pages away. */
    VHD_CHECK_EQ(ftruncate(fd, 2 * PAGE), 0);
    volatile uint8_t *v = p;
    VHD_CHECK_EQ(v[2 * PAGE + 17], 0); /* absorbed: a private zero page */
    v[2 * PAGE + 17] = 5;              /* and writable, going nowhere */
    VHD_CHECK_EQ(v[2 * PAGE + 17], 5);
    VHD_CHECK(vhd_mem_faulted(mem));
    VHD_CHECK_EQ(vhd_memguard_faults(), 1);
    uint64_t n = 0;
    VHD_CHECK_EQ(read(efd, &n, sizeof(n)), (ssize_t)sizeof(n));
    VHD_CHECK_EQ(n, 1);

    /*
     * The first fault replaced the whole mapping (memguard.h): the other
     * lost page reads zeros without a fault of its own, the pages that
     * still exist in the file read zeros too, and writes no longer reach
     * the file, which the front-end keeps as it was.
     */
    VHD_CHECK_EQ(v[3 * PAGE], 0);
    VHD_CHECK_EQ(v[PAGE + 1], 0);
    v[0] = 0x42;
    VHD_CHECK_EQ(vhd_memguard_faults(), 1);
    uint8_t b = 0;
    VHD_CHECK_EQ(pread(fd, &b, 1, 0), 1);
    VHD_CHECK_EQ(b, 0xab);

    vhd_mem_free(mem);
    close(fd);
    vhd_memguard_uninstall();
    close(efd);
}

/* Lines of /proc/self/maps: one per mapping. */
static int maps_count(void)
{
    FILE *f = fopen("/proc/self/maps", "r");
    VHD_CHECK(f != NULL);
    int n = 0, c;
    while ((c = fgetc(f)) != EOF)
        n += c == '\n';
    fclose(f);
    return n;
}

/*
 * Issue 12: tens of thousands of faults on distinct truncated pages, each
 * replaced on its own, split the mapping until vm.max_map_count ran out and
 * the next fault killed the process. 40,000 faults, every other page (so
 * that replaced pages cannot merge): the process lives, its mapping count
 * does not grow, and one fault was absorbed.
 */
VHD_TEST(forty_thousand_truncated_pages_keep_one_mapping)
{
    const size_t npages = 80000;
    VHD_CHECK_EQ(vhd_memguard_install(-1), 0);
    int fd = memfd_of(npages * PAGE); /* sparse: nothing is allocated */
    struct vhd_mem_region_desc d = {.gpa = 0, .size = npages * PAGE, .uva = 0x1000, .fd = fd};
    struct vhd_mem *mem;
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), 0);
    volatile uint8_t *v = mem->regions[0].hva;
    unsigned long faults = vhd_memguard_faults();
    VHD_CHECK_EQ(ftruncate(fd, 0), 0);
    int before = maps_count();
    unsigned sum = 0;
    for (size_t i = 0; i < npages; i += 2)
        sum += v[i * PAGE];
    VHD_CHECK_EQ(sum, 0);
    VHD_CHECK(maps_count() <= before + 1);
    VHD_CHECK_EQ(vhd_memguard_faults(), faults + 1);
    VHD_CHECK(vhd_mem_faulted(mem));
    vhd_mem_free(mem);
    close(fd);
    vhd_memguard_uninstall();
}

/*
 * A region on hugetlbfs (2 MiB pages) truncated under us: the whole mapping
 * is replaced (it is huge-page aligned, so anonymous memory can take its
 * place) and reads zeros. Needs two free huge pages: as root the test
 * reserves them for its run (vm.nr_hugepages, restored at exit).
 */
static long g_huge_saved = -1;

/* At the end of the test, and at exit after a failed check (the harness _exits on success). */
static void huge_restore(void)
{
    FILE *f;
    if (g_huge_saved >= 0 && (f = fopen("/proc/sys/vm/nr_hugepages", "w"))) {
        fprintf(f, "%ld\n", g_huge_saved);
        fclose(f);
    }
    g_huge_saved = -1;
}

VHD_TEST(truncated_hugetlbfs_region_is_replaced_whole)
{
    const size_t huge = 2u << 20;
    FILE *f = fopen("/proc/sys/vm/nr_hugepages", "r");
    long n = -1;
    if (f) {
        if (fscanf(f, "%ld", &n) != 1)
            n = -1;
        fclose(f);
    }
    if (n >= 0 && geteuid() == 0 && (f = fopen("/proc/sys/vm/nr_hugepages", "w"))) {
        g_huge_saved = n;
        atexit(huge_restore);
        fprintf(f, "%ld\n", n + 2);
        fclose(f);
    }
    int fd = memfd_create("vhd-test-guard-huge", MFD_CLOEXEC | MFD_HUGETLB);
    if (fd < 0) {
        huge_restore();
        vhd_test_skip("no hugetlbfs memfd");
    }
    if (ftruncate(fd, (off_t)(2 * huge)) != 0) {
        close(fd);
        huge_restore();
        vhd_test_skip("cannot size a hugetlbfs memfd (huge pages not 2 MiB?)");
    }
    VHD_CHECK_EQ(vhd_memguard_install(-1), 0);
    struct vhd_mem_region_desc d = {.gpa = 0, .size = 2 * huge, .uva = 0x1000, .fd = fd};
    struct vhd_mem *mem;
    int rc = vhd_mem_new(&d, 1, &mem);
    if (rc == -ENOMEM) {
        close(fd);
        huge_restore();
        vhd_test_skip("no free huge pages");
    }
    VHD_CHECK_EQ(rc, 0);
    volatile uint8_t *v = mem->regions[0].hva;
    v[0] = 1;
    v[huge] = 2;
    unsigned long faults = vhd_memguard_faults();
    VHD_CHECK_EQ(ftruncate(fd, 0), 0);
    VHD_CHECK_EQ(v[huge + 5], 0);
    VHD_CHECK_EQ(v[0], 0);
    VHD_CHECK_EQ(vhd_memguard_faults(), faults + 1);
    VHD_CHECK(vhd_mem_faulted(mem));
    vhd_mem_free(mem);
    close(fd);
    vhd_memguard_uninstall();
    huge_restore();
}

VHD_TEST(a_freed_table_is_forgotten)
{
    VHD_CHECK_EQ(vhd_memguard_install(-1), 0);
    int fd = memfd_of(2 * PAGE);
    struct vhd_mem_region_desc d = {.gpa = 0, .size = 2 * PAGE, .uva = 0x1000, .fd = fd};
    struct vhd_mem *mem;
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &mem), 0);
    int slot = mem->regions[0].map->guard;
    VHD_CHECK(slot >= 0);
    vhd_mem_free(mem);
    VHD_CHECK(!vhd_memguard_faulted(slot));

    /* The registry hands slots out again and is bounded. */
    int slots[64];
    for (int i = 0; i < 64; i++) {
        slots[i] = vhd_memguard_add((void *)(uintptr_t)((i + 1) * 0x100000ul), PAGE, PAGE);
        VHD_CHECK(slots[i] >= 0);
    }
    for (int i = 0; i < 64; i++)
        vhd_memguard_remove(slots[i]);
    VHD_CHECK_EQ(vhd_memguard_add(NULL, PAGE, PAGE), -EINVAL);
    VHD_CHECK_EQ(vhd_memguard_add((void *)0x100000, PAGE, 3000), -EINVAL);
    close(fd);
    vhd_memguard_uninstall();
}

VHD_TEST(sigbus_outside_guest_memory_still_kills)
{
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        if (vhd_memguard_install(-1) < 0)
            _exit(3);
        int fd = memfd_create("vhd-test-plain", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, 2 * PAGE) < 0)
            _exit(3);
        volatile uint8_t *p = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED || ftruncate(fd, 0) < 0)
            _exit(3);
        (void)p[PAGE]; /* not registered: must not be absorbed */
        _exit(0);
    }
    int status = 0;
    VHD_CHECK_EQ(waitpid(pid, &status, 0), pid);
    /* Plain builds die by SIGBUS; a sanitizer runtime reports it and exits non-zero. */
    VHD_CHECK(WIFSIGNALED(status)
                  ? WTERMSIG(status) == SIGBUS
                  : WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3);
}

VHD_TEST(sigbus_sent_by_another_process_still_kills)
{
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        if (vhd_memguard_install(-1) < 0)
            _exit(3);
        kill(getpid(), SIGBUS); /* no fault to repeat: the guard must raise it again */
        sleep_ms(1000);
        _exit(0);
    }
    int status = 0;
    VHD_CHECK_EQ(waitpid(pid, &status, 0), pid);
    VHD_CHECK(WIFSIGNALED(status)
                  ? WTERMSIG(status) == SIGBUS
                  : WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3);
}

/* ======================= against the daemon ======================= */

struct fe {
    struct vhd_vuf f;
    struct vhd_guestmem gm; /* region 0: rings and headers; region 1: data */
    struct vhd_drv_vq vq;
    int kick, call;
    struct virtio_blk_outhdr *hdr;
    uint64_t hdr_gpa;
    uint8_t *status;
    uint64_t status_gpa;
    uint8_t *data;
    uint64_t data_gpa;
};

static void fe_open(struct fe *e, const char *sock)
{
    memset(e, 0, sizeof(*e));
    VHD_CHECK_EQ(vhd_guestmem_init(&e->gm, 2, REGION, 0x100000, 0x100000), 0);
    vhd_vuf_init(&e->f, WAIT_MS);
    VHD_CHECK_EQ(vhd_vuf_connect(&e->f, sock), 0);
    VHD_CHECK_EQ(vhd_vuf_handshake(&e->f, 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK), 0);
    VHD_CHECK_EQ(vhd_vuf_set_features(&e->f, 1ull << VIRTIO_F_VERSION_1), 0);
    VHD_CHECK_EQ(vhd_vuf_set_mem_table(&e->f, &e->gm), 0);

    /* Rings and request headers in region 0 (the allocator fills it first). */
    size_t area_len = vhd_drv_vq_area_size(16, false, 0);
    void *area;
    uint64_t area_gpa = vhd_guestmem_alloc(&e->gm, area_len, 4096, &area);
    VHD_CHECK(area_gpa < 0x100000 + REGION);
    struct vhd_drv_vq_params p = {
        .size = 16, .area = area, .area_gpa = area_gpa, .area_len = area_len};
    VHD_CHECK_EQ(vhd_drv_vq_init(&e->vq, &p), 0);
    void *h;
    e->hdr_gpa = vhd_guestmem_alloc(&e->gm, sizeof(*e->hdr), 16, &h);
    e->hdr = h;
    e->status_gpa = vhd_guestmem_alloc(&e->gm, 1, 1, &h);
    e->status = h;
    VHD_CHECK(e->status_gpa < 0x100000 + REGION);
    /* The data buffer at the start of region 1. */
    e->data_gpa = e->gm.r[1].gpa;
    e->data = e->gm.r[1].hva;

    e->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->call = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    VHD_CHECK(e->kick >= 0 && e->call >= 0);
    struct vhd_vuf_ring r = {.index = 0,
                             .num = 16,
                             .desc = vhd_guestmem_uva(&e->gm, e->vq.desc_gpa),
                             .avail = vhd_guestmem_uva(&e->gm, e->vq.avail_gpa),
                             .used = vhd_guestmem_uva(&e->gm, e->vq.used_gpa),
                             .base = 0,
                             .kick_fd = e->kick,
                             .call_fd = e->call};
    VHD_CHECK_EQ(vhd_vuf_ring_start(&e->f, &r), 0);
}

static void fe_close(struct fe *e)
{
    vhd_vuf_close(&e->f);
    vhd_drv_vq_fini(&e->vq);
    vhd_guestmem_fini(&e->gm);
    close(e->kick);
    close(e->call);
}

/* Queue a 4 KiB read of sector 0 into the data buffer and kick. */
static void fe_read(struct fe *e)
{
    e->hdr->type = VIRTIO_BLK_T_IN;
    e->hdr->sector = 0;
    *e->status = 0xff;
    struct vhd_drv_buf b[3] = {
        {e->hdr_gpa, sizeof(*e->hdr)}, {e->data_gpa, PAGE}, {e->status_gpa, 1}};
    VHD_CHECK_EQ(vhd_drv_vq_add(&e->vq, b, 1, 2, false, e), 0);
    vhd_drv_vq_publish(&e->vq);
    uint64_t one = 1;
    VHD_CHECK_EQ(write(e->kick, &one, sizeof(one)), (ssize_t)sizeof(one));
}

/* Wait (bounded) for the one request to come back; 1 when it did. */
static int fe_wait(struct fe *e, int ms)
{
    uint64_t t0 = ms_now();
    void *cookie;
    uint32_t len;
    while (ms_now() - t0 < (uint64_t)ms) {
        int rc = vhd_drv_vq_get_used(&e->vq, &cookie, &len);
        if (rc != 0)
            return rc;
        sleep_ms(1);
    }
    return 0;
}

/* Write then read back a pattern through the blk driver on the second device. */
static void other_device_io(struct vhd_blkdrv *d, unsigned seed)
{
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    void *buf = vhd_blkdrv_buf_alloc(q, 64 * 1024);
    VHD_CHECK(buf != NULL);
    for (unsigned i = 0; i < 64 * 1024; i++)
        ((uint8_t *)buf)[i] = (uint8_t)(i * 7 + seed);
    struct vhd_blkdrv_completion c;
    VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, 0, buf, 64 * 1024, NULL), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    memset(buf, 0, 64 * 1024);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, buf, 64 * 1024, NULL), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    for (unsigned i = 0; i < 64 * 1024; i++)
        if (((uint8_t *)buf)[i] != (uint8_t)(i * 7 + seed))
            VHD_CHECK(!"second device data mismatch");
    vhd_blkdrv_buf_free(q, buf, 64 * 1024);
}

VHD_TEST(daemon_survives_a_front_end_that_truncates_guest_memory)
{
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-guard-XXXXXX", "a.sock");
    track(&dm);
    char sock_b[256], spec_a[300], spec_b[600];
    snprintf(sock_b, sizeof(sock_b), "%s/b.sock", dm.dir);
    snprintf(spec_a, sizeof(spec_a), "socket=%s,backend=null,size=16M", dm.sock);
    snprintf(spec_b, sizeof(spec_b), "socket=%s,image=%s/b.img,size=16M", sock_b, dm.dir);
    char *argv[] = {(char *)bin, "--log-level", "info",  "--workers", "2",
                    "--blk",     spec_a,        "--blk", spec_b,      NULL};
    daemon_spawn(&dm, argv);

    char err[256];
    struct vhd_blkdrv *b;
    struct vhd_blkdrv_opts o = {.socket_path = sock_b, .timeout_ms = WAIT_MS};
    VHD_CHECK_EQ(vhd_blkdrv_connect(&o, &b, err, sizeof(err)), 0);
    other_device_io(b, 1);

    /* A good request first: the path works. */
    struct fe e;
    fe_open(&e, dm.sock);
    fe_read(&e);
    VHD_CHECK_EQ(fe_wait(&e, WAIT_MS), 1);
    VHD_CHECK_EQ(*e.status, VIRTIO_BLK_S_OK);

    /* The data region shrinks to nothing; the null backend then fills a lost page. */
    VHD_CHECK_EQ(ftruncate(e.gm.r[1].fd, 0), 0);
    fe_read(&e);
    (void)fe_wait(&e, 2000); /* completes (into a zero page) or not: either is fine */
    uint64_t t0 = ms_now();
    while (!daemon_log_has(&dm, "guest memory was truncated") && ms_now() - t0 < WAIT_MS)
        sleep_ms(10);
    VHD_CHECK(daemon_log_has(&dm, "guest memory was truncated"));
    VHD_CHECK_EQ(waitpid(dm.pid, NULL, WNOHANG), 0);
    other_device_io(b, 2);

    /* Now the rings' region goes too, then a kick: the worker reads lost ring pages. */
    VHD_CHECK_EQ(ftruncate(e.gm.r[0].fd, 0), 0);
    uint64_t one = 1;
    VHD_CHECK_EQ(write(e.kick, &one, sizeof(one)), (ssize_t)sizeof(one));
    sleep_ms(200);
    VHD_CHECK_EQ(waitpid(dm.pid, NULL, WNOHANG), 0);
    other_device_io(b, 3);
    fe_close(&e);

    /* The device serves a fresh session. */
    fe_open(&e, dm.sock);
    fe_read(&e);
    VHD_CHECK_EQ(fe_wait(&e, WAIT_MS), 1);
    VHD_CHECK_EQ(*e.status, VIRTIO_BLK_S_OK);
    fe_close(&e);

    other_device_io(b, 4);
    vhd_blkdrv_disconnect(b);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    char img[300];
    snprintf(img, sizeof(img), "%s/b.img", dm.dir);
    unlink(img);
    test_done();
}
