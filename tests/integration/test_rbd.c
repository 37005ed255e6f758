/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The Ceph RBD backend end to end: a throwaway single-node cluster
 * (tests/ceph/cluster.sh, one for the whole program, started before the
 * first test and stopped at exit), the real daemon with backend=rbd, and
 * the userspace blk driver. Size from the image, reads and writes checked
 * through the driver and on the host with `rbd export`, flush, discard,
 * write zeroes, snapshots served read-only, several queues on several
 * workers (the completion hand-over under load), and open errors. A cluster
 * that cannot start fails every test: nothing passes without Ceph.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "vhostd/blk_driver.h"

#define MAX_DAEMONS 1
#include "daemon_fixture.h"
#include "blkdrv_fixture.h"

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define POOL         "rbd"
#define IMG_SIZE     (64ull << 20)
#define OBJ_SIZE     (4ull << 20) /* rbd's default object size: ranges crossing it span two objects */

/* ======================= the cluster (test program's process) ======================= */

static char g_cluster_dir[160];
static char g_conf[256];
static char g_cluster_err[16384];
static pid_t g_cluster_owner;
static char g_script[PATH_MAX];

/* tests/ceph/cluster.sh: $VHD_CEPH_CLUSTER, beside the build dir of this program, or from cwd. */
static bool find_script(void)
{
    const char *env = getenv("VHD_CEPH_CLUSTER");
    char exe[PATH_MAX - 64];

    if (env && *env) {
        snprintf(g_script, sizeof(g_script), "%s", env);
        return access(g_script, X_OK) == 0;
    }
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(g_script, sizeof(g_script), "%s/../tests/ceph/cluster.sh", exe);
            if (access(g_script, X_OK) == 0)
                return true;
        }
    }
    snprintf(g_script, sizeof(g_script), "tests/ceph/cluster.sh");
    return access(g_script, X_OK) == 0;
}

static void cluster_stop(void)
{
    char cmd[PATH_MAX + 256];

    if (getpid() != g_cluster_owner || !g_cluster_dir[0])
        return; /* a test's child exiting: the cluster belongs to the parent */
    snprintf(cmd, sizeof(cmd), "'%s' stop '%s'", g_script, g_cluster_dir);
    if (system(cmd) != 0)
        fprintf(stderr, "test_rbd: stopping the cluster in %s failed\n", g_cluster_dir);
    rmdir(g_cluster_dir); /* left empty when the cluster never started */
    g_cluster_dir[0] = 0;
}

/* One start of the cluster in g_cluster_dir (created here). true: g_conf is set. */
static bool cluster_try_start(void)
{
    const char *t = getenv("TMPDIR");
    char cmd[PATH_MAX + 512], line[512];
    FILE *p;

    g_conf[0] = 0;
    g_cluster_err[0] = 0;
    snprintf(g_cluster_dir, sizeof(g_cluster_dir), "%s/vhd-ceph-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(g_cluster_dir)) {
        snprintf(g_cluster_err, sizeof(g_cluster_err), "mkdtemp: %s", strerror(errno));
        g_cluster_dir[0] = 0;
        return false;
    }
    /* The watchdog stops it if this program dies without running atexit. */
    snprintf(cmd, sizeof(cmd), "CEPH_CLUSTER_OWNER=%d '%s' start '%s' " POOL " 2>&1", (int)getpid(),
             g_script, g_cluster_dir);
    p = popen(cmd, "r");
    if (!p) {
        snprintf(g_cluster_err, sizeof(g_cluster_err), "popen: %s", strerror(errno));
        return false;
    }
    while (fgets(line, sizeof(line), p)) {
        if (!strncmp(line, "ready ", 6)) {
            char *c = strstr(line, "conf="), *sp;
            if (c && (sp = strchr(c, ' ')) != NULL) {
                *sp = 0;
                snprintf(g_conf, sizeof(g_conf), "%s", c + 5);
            }
            printf("test_rbd: cluster %s\n", line + 6);
        } else if (strlen(g_cluster_err) + strlen(line) < sizeof(g_cluster_err)) {
            strcat(g_cluster_err, line);
        }
    }
    int st = pclose(p);
    if (st != 0 || !g_conf[0]) {
        g_conf[0] = 0;
        if (!g_cluster_err[0])
            snprintf(g_cluster_err, sizeof(g_cluster_err), "cluster.sh exited with 0x%x", st);
        return false;
    }
    return true;
}

/*
 * Runs once in the harness's parent before any test: every test uses this
 * cluster. A start that fails is reported and tried once more (a fresh
 * directory and port): the cluster is the tests' infrastructure, not what
 * they check; a second failure fails every test.
 */
__attribute__((constructor)) static void cluster_start(void)
{
    g_cluster_owner = getpid();
    if (!find_script()) {
        snprintf(g_cluster_err, sizeof(g_cluster_err), "tests/ceph/cluster.sh not found");
        return;
    }
    atexit(cluster_stop);
    for (int attempt = 1; attempt <= 2; attempt++) {
        if (cluster_try_start())
            return;
        char *nl = strchr(g_cluster_err, '\n');
        fprintf(stderr, "test_rbd: cluster start %d failed: %.*s\n", attempt,
                nl ? (int)(nl - g_cluster_err) : (int)strlen(g_cluster_err), g_cluster_err);
        if (attempt == 1)
            cluster_stop(); /* removes the directory; the next try makes a new one */
    }
}

/* Every test starts here: no cluster, no pass. */
static void need_cluster(void)
{
    if (!g_conf[0]) {
        fprintf(stderr, "  the Ceph cluster did not start: %s\n", g_cluster_err);
        VHD_CHECK(!"Ceph cluster");
    }
}

/* Run `rbd -c CONF <args>`; its exit status (0: success). */
static int rbd_cmd(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int rbd_cmd(const char *fmt, ...)
{
    char args[512], cmd[1024];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof(cmd), "timeout 60 rbd -c '%s' --no-progress %s >/dev/null 2>&1", g_conf,
             args);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 255;
}

/* A fresh image of IMG_SIZE bytes with a name unique to this test. */
static void make_image(char *name, size_t len, const char *tag)
{
    snprintf(name, len, "%s-%d", tag, (int)getpid());
    VHD_CHECK_EQ(rbd_cmd("create --size %lluM " POOL "/%s", IMG_SIZE >> 20, name), 0);
}

/* ======================= daemon and driver ======================= */

/* The last daemon's command line, for restarts on the same socket. */
static char g_spec[1024], g_nworkers[16];

/* (Re)start vhostd with g_spec on dm's socket; returns when it listens. */
static void spawn_daemon(struct daemon *dm)
{
    char *argv[] = {(char *)vhostd_path(), "--log-level", "info",  "--sandbox", "off",
                    "--workers",           g_nworkers,    "--blk", g_spec,      NULL};
    VHD_CHECK(argv[0] != NULL);
    daemon_spawn(dm, argv);
}

/* Start vhostd serving POOL/image; extra: more --blk keys (",snap=s1"). */
static void start_daemon(struct daemon *dm, const char *image, unsigned queues, unsigned workers,
                         const char *extra)
{
    daemon_prepare_dir(dm, "vhd-rbd-XXXXXX", "blk.sock");
    snprintf(g_spec, sizeof(g_spec),
             "socket=%s,backend=rbd,pool=" POOL ",image=%s,conf=%s,queues=%u%s", dm->sock, image,
             g_conf, queues, extra ? extra : "");
    snprintf(g_nworkers, sizeof(g_nworkers), "%u", workers);
    bool tracked = false;
    for (int i = 0; i < MAX_DAEMONS; i++)
        tracked |= g_daemons[i] == dm;
    if (!tracked)
        track(dm);
    spawn_daemon(dm);
}

static struct vhd_blkdrv *connect_drv(struct daemon *dm, unsigned queues)
{
    struct vhd_blkdrv_opts o = {
        .socket_path = dm->sock,
        .num_queues = queues,
        .queue_size = 128,
        .pool_size = 8u << 20,
        .timeout_ms = 20000,
    };
    return blkdrv_connect_opts(&o);
}

/* Wait for the one request in flight on q; its ret. */
static int wait_one(struct vhd_blkdrv_queue *q)
{
    struct vhd_blkdrv_completion c;
    int n = vhd_blkdrv_wait(q, &c, 1, 30000);
    VHD_CHECK_EQ(n, 1);
    return c.ret;
}

static int do_write(struct vhd_blkdrv_queue *q, uint64_t off, const void *data, size_t len)
{
    void *b = vhd_blkdrv_buf_alloc(q, len);
    VHD_CHECK(b != NULL);
    memcpy(b, data, len);
    VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, off, b, len, NULL), 0);
    int rc = wait_one(q);
    vhd_blkdrv_buf_free(q, b, len);
    return rc;
}

static int do_read(struct vhd_blkdrv_queue *q, uint64_t off, void *data, size_t len)
{
    void *b = vhd_blkdrv_buf_alloc(q, len);
    VHD_CHECK(b != NULL);
    memset(b, 0xa5, len);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, off, b, len, NULL), 0);
    int rc = wait_one(q);
    memcpy(data, b, len);
    vhd_blkdrv_buf_free(q, b, len);
    return rc;
}

/* Bytes of (seed, offset): every byte of the image says where it was written and by whom. */
static uint8_t pat(uint32_t seed, uint64_t off)
{
    uint64_t x = (off >> 3) * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;
    return (uint8_t)((x >> 56) ^ (off & 7) ^ seed);
}

static void fill(uint8_t *p, uint64_t off, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = pat(seed, off + i);
}

static bool is_pat(const uint8_t *p, uint64_t off, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        if (p[i] != pat(seed, off + i))
            return false;
    return true;
}

static bool all_zero(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i])
            return false;
    return true;
}

static void write_pat(struct vhd_blkdrv_queue *q, uint64_t off, size_t len, uint32_t seed)
{
    uint8_t *buf = malloc(len);
    VHD_CHECK(buf != NULL);
    fill(buf, off, len, seed);
    VHD_CHECK_EQ(do_write(q, off, buf, len), 0);
    free(buf);
}

static void check_pat(struct vhd_blkdrv_queue *q, uint64_t off, size_t len, uint32_t seed)
{
    uint8_t *buf = malloc(len);
    VHD_CHECK(buf != NULL);
    VHD_CHECK_EQ(do_read(q, off, buf, len), 0);
    VHD_CHECK(is_pat(buf, off, len, seed));
    free(buf);
}

static void check_zero(struct vhd_blkdrv_queue *q, uint64_t off, size_t len)
{
    uint8_t *buf = malloc(len);
    VHD_CHECK(buf != NULL);
    VHD_CHECK_EQ(do_read(q, off, buf, len), 0);
    VHD_CHECK(all_zero(buf, len));
    free(buf);
}

/* `rbd export` of POOL/spec into dm's directory; the mapped file's bytes (IMG_SIZE of them). */
static uint8_t *export_image(struct daemon *dm, const char *spec)
{
    char path[256];
    snprintf(path, sizeof(path), "%s/export.img", dm->dir);
    VHD_CHECK_EQ(rbd_cmd("export " POOL "/%s %s", spec, path), 0);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    struct stat st;
    VHD_CHECK(fstat(fd, &st) == 0);
    VHD_CHECK_EQ(st.st_size, (long long)IMG_SIZE);
    uint8_t *buf = malloc(IMG_SIZE);
    VHD_CHECK(buf != NULL);
    size_t got = 0;
    while (got < IMG_SIZE) {
        ssize_t n = read(fd, buf + got, IMG_SIZE - got);
        VHD_CHECK(n > 0);
        got += (size_t)n;
    }
    close(fd);
    unlink(path);
    return buf;
}

/* ======================= tests ======================= */

/* The regions rbd_rw writes: one block, a large write, one across an object boundary. */
static const struct {
    uint64_t off;
    size_t len;
} g_regions[] = {
    {0, 4096},
    {1u << 20, 192u << 10},
    {OBJ_SIZE - (32u << 10), 64u << 10},
    {IMG_SIZE - 4096, 4096},
};

VHD_TEST(rbd_rw_flush_export)
{
    struct daemon dm;
    char img[64];
    need_cluster();
    make_image(img, sizeof(img), "rw");
    start_daemon(&dm, img, 1, 1, NULL);
    struct vhd_blkdrv *d = connect_drv(&dm, 1);
    const struct vhd_blkdrv_info *info = vhd_blkdrv_get_info(d);
    VHD_CHECK_EQ(info->capacity, (long long)IMG_SIZE); /* the size comes from the image */
    VHD_CHECK(!info->read_only);
    VHD_CHECK(info->flush && info->discard && info->write_zeroes);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);

    /* A fresh image reads as zeroes. */
    check_zero(q, 0, 64u << 10);
    for (size_t i = 0; i < ARRAY_LEN(g_regions); i++)
        write_pat(q, g_regions[i].off, g_regions[i].len, 7);
    /* Several segments in one request (readv/writev on librbd's side). */
    {
        size_t seg = 4096;
        struct iovec iov[4];
        uint8_t *b = vhd_blkdrv_buf_alloc(q, 4 * seg);
        VHD_CHECK(b != NULL);
        /* Out of order in memory; segment i carries bytes [i*seg, (i+1)*seg) of the range. */
        for (int i = 0; i < 4; i++) {
            iov[i] = (struct iovec){b + (size_t)(3 - i) * seg, seg};
            fill(iov[i].iov_base, (8u << 20) + (uint64_t)i * seg, seg, 9);
        }
        VHD_CHECK_EQ(vhd_blkdrv_submit_writev(q, 8u << 20, iov, 4, NULL), 0);
        VHD_CHECK_EQ(wait_one(q), 0);
        memset(b, 0, 4 * seg);
        VHD_CHECK_EQ(vhd_blkdrv_submit_readv(q, 8u << 20, iov, 4, NULL), 0);
        VHD_CHECK_EQ(wait_one(q), 0);
        for (int i = 0; i < 4; i++)
            VHD_CHECK(is_pat(iov[i].iov_base, (8u << 20) + (uint64_t)i * seg, seg, 9));
        vhd_blkdrv_buf_free(q, b, 4 * seg);
    }
    for (size_t i = 0; i < ARRAY_LEN(g_regions); i++)
        check_pat(q, g_regions[i].off, g_regions[i].len, 7);
    VHD_CHECK_EQ(vhd_blkdrv_submit_flush(q, NULL), 0);
    VHD_CHECK_EQ(wait_one(q), 0);
    /* Beyond the end: refused by the device, never sent to librbd. */
    {
        uint8_t blk[512];
        VHD_CHECK(do_read(q, IMG_SIZE, blk, sizeof(blk)) != 0);
    }
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    /* On the host: what was acknowledged is in the image, and nothing else was written. */
    uint8_t *img_bytes = export_image(&dm, img);
    for (size_t i = 0; i < ARRAY_LEN(g_regions); i++)
        VHD_CHECK(is_pat(img_bytes + g_regions[i].off, g_regions[i].off, g_regions[i].len, 7));
    VHD_CHECK(is_pat(img_bytes + (8u << 20), 8u << 20, 16u << 10, 9));
    VHD_CHECK(all_zero(img_bytes + 4096, (1u << 20) - 4096));
    VHD_CHECK(all_zero(img_bytes + (16u << 20), 16u << 20));
    free(img_bytes);
    VHD_CHECK_EQ(rbd_cmd("rm " POOL "/%s", img), 0);
    test_done();
}

VHD_TEST(rbd_discard_write_zeroes)
{
    struct daemon dm;
    char img[64];
    const uint64_t base = 12u << 20;
    need_cluster();
    make_image(img, sizeof(img), "dwz");
    start_daemon(&dm, img, 1, 1, NULL);
    struct vhd_blkdrv *d = connect_drv(&dm, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    VHD_CHECK(vhd_blkdrv_get_info(d)->write_zeroes_may_unmap);

    write_pat(q, base, 1u << 20, 3);
    /* Write zeroes, allocated (THICK_PROVISION): zeroes between intact data. */
    VHD_CHECK_EQ(vhd_blkdrv_submit_write_zeroes(q, base + 4096, 64u << 10, false, NULL), 0);
    VHD_CHECK_EQ(wait_one(q), 0);
    /* Write zeroes with unmap, partly unaligned to anything librbd allocates. */
    VHD_CHECK_EQ(
        vhd_blkdrv_submit_write_zeroes(q, base + (512u << 10) + 512, 128u << 10, true, NULL), 0);
    VHD_CHECK_EQ(wait_one(q), 0);
    check_pat(q, base, 4096, 3);
    check_zero(q, base + 4096, 64u << 10);
    check_pat(q, base + 4096 + (64u << 10), (512u << 10) + 512 - 4096 - (64u << 10), 3);
    check_zero(q, base + (512u << 10) + 512, 128u << 10);
    check_pat(q, base + (640u << 10) + 512, (384u << 10) - 512, 3);
    /* Discard a whole object: succeeds (the contents afterwards are the device's choice). */
    write_pat(q, 2 * OBJ_SIZE, 1u << 20, 5);
    VHD_CHECK_EQ(vhd_blkdrv_submit_discard(q, 2 * OBJ_SIZE, OBJ_SIZE, NULL), 0);
    VHD_CHECK_EQ(wait_one(q), 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    uint8_t *b = export_image(&dm, img);
    VHD_CHECK(all_zero(b + base + 4096, 64u << 10));
    VHD_CHECK(all_zero(b + base + (512u << 10) + 512, 128u << 10));
    VHD_CHECK(
        is_pat(b + base + (640u << 10) + 512, base + (640u << 10) + 512, (384u << 10) - 512, 3));
    /* librbd deletes a whole discarded object: it reads as zeroes. */
    VHD_CHECK(all_zero(b + 2 * OBJ_SIZE, 1u << 20));
    free(b);
    VHD_CHECK_EQ(rbd_cmd("rm " POOL "/%s", img), 0);
    test_done();
}

VHD_TEST(rbd_snapshot_read_only)
{
    struct daemon dm;
    char img[64];
    need_cluster();
    make_image(img, sizeof(img), "snap");
    start_daemon(&dm, img, 1, 1, NULL);
    struct vhd_blkdrv *d = connect_drv(&dm, 1);
    write_pat(vhd_blkdrv_get_queue(d, 0), 0, 256u << 10, 1);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    daemon_cleanup_files(&dm);
    VHD_CHECK_EQ(rbd_cmd("snap create " POOL "/%s@s1", img), 0);

    /* The image moves on after the snapshot. */
    start_daemon(&dm, img, 1, 1, NULL);
    d = connect_drv(&dm, 1);
    write_pat(vhd_blkdrv_get_queue(d, 0), 0, 256u << 10, 2);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    daemon_cleanup_files(&dm);

    /* snap=s1: read-only, the snapshot's data, writes refused; the image keeps its new data. */
    start_daemon(&dm, img, 1, 1, ",snap=s1");
    d = connect_drv(&dm, 1);
    const struct vhd_blkdrv_info *info = vhd_blkdrv_get_info(d);
    VHD_CHECK(info->read_only);
    VHD_CHECK_EQ(info->capacity, (long long)IMG_SIZE);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    check_pat(q, 0, 256u << 10, 1);
    {
        uint8_t blk[4096];
        fill(blk, 0, sizeof(blk), 9);
        VHD_CHECK_EQ(do_write(q, 0, blk, sizeof(blk)), -EIO);
    }
    check_pat(q, 0, 4096, 1);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    VHD_CHECK(daemon_log_has(&dm, "@s1"));
    daemon_cleanup_files(&dm);

    /* ro=on without a snapshot: the image's current data, read-only. */
    start_daemon(&dm, img, 1, 1, ",ro=on");
    d = connect_drv(&dm, 1);
    VHD_CHECK(vhd_blkdrv_get_info(d)->read_only);
    check_pat(vhd_blkdrv_get_queue(d, 0), 0, 256u << 10, 2);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    uint8_t *b = export_image(&dm, img);
    VHD_CHECK(is_pat(b, 0, 256u << 10, 2));
    free(b);
    VHD_CHECK_EQ(rbd_cmd("snap purge " POOL "/%s", img), 0);
    VHD_CHECK_EQ(rbd_cmd("rm " POOL "/%s", img), 0);
    test_done();
}

/*
 * Two queues on two workers, 32 requests in flight on each: completions
 * from librbd's threads reach two workers' channels at once. Each queue
 * owns half of the blocks; a block has at most one request in flight, and
 * the last acknowledged generation of every block must read back, through
 * the driver and in `rbd export`.
 */
#define MQ_QUEUES 2u
#define MQ_DEPTH  32u
#define MQ_BS     4096u
#define MQ_BLOCKS 512u /* per queue */
#define MQ_OPS    3000u

struct mq_req {
    uint32_t block; /* global block number */
    uint32_t gen;
    bool write;
    uint8_t *buf;
};

VHD_TEST(rbd_multiqueue_workers)
{
    struct daemon dm;
    char img[64];
    static uint32_t gen[MQ_QUEUES * MQ_BLOCKS];
    static bool busy[MQ_QUEUES * MQ_BLOCKS];
    static struct mq_req reqs[MQ_QUEUES][MQ_DEPTH];
    unsigned done = 0, issued = 0, reads_checked = 0;
    uint32_t seed = 12345;

    need_cluster();
    make_image(img, sizeof(img), "mq");
    start_daemon(&dm, img, MQ_QUEUES, 2, NULL);
    struct vhd_blkdrv *d = connect_drv(&dm, MQ_QUEUES);
    struct vhd_blkdrv_queue *qs[MQ_QUEUES];
    for (unsigned i = 0; i < MQ_QUEUES; i++) {
        qs[i] = vhd_blkdrv_get_queue(d, i);
        for (unsigned j = 0; j < MQ_DEPTH; j++) {
            reqs[i][j].buf = vhd_blkdrv_buf_alloc(qs[i], MQ_BS);
            VHD_CHECK(reqs[i][j].buf != NULL);
            reqs[i][j].block = UINT32_MAX; /* free slot */
        }
    }
    uint64_t t0 = ms_now();
    while (done < MQ_OPS) {
        for (unsigned i = 0; i < MQ_QUEUES; i++) {
            /* Fill every free slot of queue i. */
            vhd_blkdrv_plug(qs[i]);
            for (unsigned j = 0; j < MQ_DEPTH && issued < MQ_OPS; j++) {
                struct mq_req *r = &reqs[i][j];
                if (r->block != UINT32_MAX)
                    continue;
                seed = seed * 1103515245u + 12345u;
                uint32_t b = i * MQ_BLOCKS + (seed >> 8) % MQ_BLOCKS;
                if (busy[b])
                    continue;
                busy[b] = true;
                r->block = b;
                r->write = gen[b] == 0 || (seed >> 4) % 3 != 0;
                if (r->write) {
                    r->gen = gen[b] + 1;
                    fill(r->buf, (uint64_t)b * MQ_BS, MQ_BS, r->gen);
                    VHD_CHECK_EQ(
                        vhd_blkdrv_submit_write(qs[i], (uint64_t)b * MQ_BS, r->buf, MQ_BS, r), 0);
                } else {
                    r->gen = gen[b];
                    VHD_CHECK_EQ(
                        vhd_blkdrv_submit_read(qs[i], (uint64_t)b * MQ_BS, r->buf, MQ_BS, r), 0);
                }
                issued++;
            }
            vhd_blkdrv_unplug(qs[i]);
        }
        for (unsigned i = 0; i < MQ_QUEUES; i++) {
            struct vhd_blkdrv_completion c[MQ_DEPTH];
            int n = vhd_blkdrv_inflight(qs[i]) ? vhd_blkdrv_wait(qs[i], c, MQ_DEPTH, 30000) : 0;
            VHD_CHECK(n >= 0);
            for (int k = 0; k < n; k++) {
                struct mq_req *r = c[k].cookie;
                VHD_CHECK_EQ(c[k].ret, 0);
                if (r->write) {
                    gen[r->block] = r->gen;
                } else {
                    VHD_CHECK(is_pat(r->buf, (uint64_t)r->block * MQ_BS, MQ_BS, r->gen));
                    reads_checked++;
                }
                busy[r->block] = false;
                r->block = UINT32_MAX;
                done++;
            }
        }
        VHD_CHECK(ms_now() - t0 < 45000);
    }
    uint64_t ms = ms_now() - t0;
    printf("  %u requests (%u reads checked) on %u queues at depth %u: %llu ms, %llu IOPS\n", done,
           reads_checked, MQ_QUEUES, MQ_DEPTH, (unsigned long long)ms,
           (unsigned long long)(ms ? done * 1000ull / ms : 0));
    VHD_CHECK(reads_checked > 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    uint8_t *b = export_image(&dm, img);
    for (uint32_t k = 0; k < MQ_QUEUES * MQ_BLOCKS; k++) {
        if (gen[k])
            VHD_CHECK(is_pat(b + (uint64_t)k * MQ_BS, (uint64_t)k * MQ_BS, MQ_BS, gen[k]));
        else
            VHD_CHECK(all_zero(b + (uint64_t)k * MQ_BS, MQ_BS));
    }
    free(b);
    VHD_CHECK_EQ(rbd_cmd("rm " POOL "/%s", img), 0);
    test_done();
}

/* The daemon refuses what cannot work, at once and saying why. */
static void expect_refusal(const char *spec_tail, const char *sandbox, const char *why)
{
    struct daemon dm;
    char spec[1024];
    daemon_prepare_dir(&dm, "vhd-rbd-XXXXXX", "blk.sock");
    snprintf(spec, sizeof(spec), "socket=%s,backend=rbd,conf=%s%s", dm.sock, g_conf, spec_tail);
    char *argv[] = {(char *)vhostd_path(), "--sandbox", (char *)sandbox, "--blk", spec, NULL};
    track(&dm);
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(dm.log, O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    dm.pid = pid;
    int st = 0;
    uint64_t t0 = ms_now();
    while (waitpid(pid, &st, WNOHANG) != pid) {
        VHD_CHECK(ms_now() - t0 < 40000);
        sleep_ms(10);
    }
    dm.pid = 0;
    VHD_CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0);
    if (!daemon_log_has(&dm, why)) {
        dump_log(&dm);
        VHD_CHECK(!"the refusal does not say why");
    }
    struct stat sb;
    VHD_CHECK(stat(dm.sock, &sb) < 0); /* never served */
    g_test_ok = true;
    kill_daemons();
    g_test_ok = false;
}

VHD_TEST(rbd_open_errors)
{
    char img[64];
    need_cluster();
    make_image(img, sizeof(img), "err");
    char tail[128];
    expect_refusal(",pool=nosuchpool,image=x", "off", "cannot open pool nosuchpool");
    expect_refusal(",pool=" POOL ",image=nosuchimage", "off", "cannot open RBD image");
    snprintf(tail, sizeof(tail), ",pool=" POOL ",image=%s,snap=nosuchsnap", img);
    expect_refusal(tail, "off", "cannot open RBD image");
    snprintf(tail, sizeof(tail), ",pool=" POOL ",image=%s,size=1G", img);
    expect_refusal(tail, "off", "not the 1073741824 requested");
    snprintf(tail, sizeof(tail), ",pool=" POOL ",image=%s", img);
    expect_refusal(tail, "on", "backend=rbd needs --sandbox off");
    expect_refusal(",image=x", "off", "backend=rbd needs pool=NAME and image=NAME");
    VHD_CHECK_EQ(rbd_cmd("rm " POOL "/%s", img), 0);
    test_done();
}

/*
 * Restart without loss on RBD: the daemon is killed with SIGKILL while
 * requests are in flight, again and again, and restarted on the same socket
 * and image; the driver reconnects and the new daemon resubmits what the
 * dead one had taken (inflight area). Every request completes exactly once
 * and successfully, and every acknowledged write reads back through the
 * driver and in `rbd export`. The new daemon takes RBD's exclusive lock
 * over from the dead one: its writes wait until the OSD drops the dead
 * client's watch (osd_client_watch_timeout; cluster.sh sets 5 s), reads
 * go on meanwhile: the longest time without a write completing is printed.
 */
#define K_NQ      2u
#define K_DEPTH   16u
#define K_QBLOCKS 256u
#define K_BLOCKS  (K_NQ * K_QBLOCKS)
#define K_BS      4096u
#define K_KILLS   4u
#define K_TAIL    500u /* requests after the last restart */
#define K_MAX_IDS (1u << 20)
#define K_STALL   60000u /* no completion for this long with requests in flight: stuck */

struct kreq {
    uint32_t id, blk, gen;
    bool write, busy;
    uint8_t *buf;
};

struct kwl {
    struct vhd_blkdrv *d;
    struct vhd_blkdrv_queue *q[K_NQ];
    struct kreq r[K_NQ][K_DEPTH];
    uint32_t inflight[K_NQ];
    uint32_t acked[K_BLOCKS], gen[K_BLOCKS];
    bool blk_busy[K_BLOCKS];
    uint8_t done[K_MAX_IDS];
    uint32_t next_id;
    unsigned seed;
    uint64_t writes, reads, errors, reconnects;
    uint64_t last_write_ms, max_write_gap_ms; /* longest time without a write completing */
};

static void k_submit(struct kwl *w, uint32_t qi)
{
    while (w->inflight[qi] < K_DEPTH && w->next_id < K_MAX_IDS) {
        uint32_t k = 0;
        while (w->r[qi][k].busy)
            k++;
        uint32_t blk = qi * K_QBLOCKS + (uint32_t)rand_r(&w->seed) % K_QBLOCKS;
        for (unsigned tries = 0; w->blk_busy[blk] && tries < K_QBLOCKS; tries++)
            blk = qi * K_QBLOCKS + (blk + 1) % K_QBLOCKS;
        if (w->blk_busy[blk])
            return;
        struct kreq *r = &w->r[qi][k];
        r->write = rand_r(&w->seed) % 4 != 0;
        r->blk = blk;
        r->id = w->next_id;
        int rc;
        if (r->write) {
            r->gen = w->gen[blk] + 1;
            fill(r->buf, (uint64_t)blk * K_BS, K_BS, r->gen);
            rc = vhd_blkdrv_submit_write(w->q[qi], (uint64_t)blk * K_BS, r->buf, K_BS, r);
        } else {
            r->gen = w->acked[blk];
            memset(r->buf, 0xa5, K_BS);
            rc = vhd_blkdrv_submit_read(w->q[qi], (uint64_t)blk * K_BS, r->buf, K_BS, r);
        }
        if (rc == -EAGAIN)
            return;
        VHD_CHECK_EQ(rc, 0);
        if (r->write)
            w->gen[blk] = r->gen;
        r->busy = true;
        w->blk_busy[blk] = true;
        w->inflight[qi]++;
        w->next_id++;
    }
}

/* Block content of generation gen (0: never written, zeroes). */
static bool k_holds(const uint8_t *p, uint32_t blk, uint32_t gen)
{
    return gen ? is_pat(p, (uint64_t)blk * K_BS, K_BS, gen) : all_zero(p, K_BS);
}

static int k_reap(struct kwl *w, uint32_t qi)
{
    struct vhd_blkdrv_completion c[K_DEPTH];
    int n = vhd_blkdrv_poll(w->q[qi], c, K_DEPTH);
    VHD_CHECK(n >= 0);
    for (int i = 0; i < n; i++) {
        struct kreq *r = c[i].cookie;
        VHD_CHECK(r >= &w->r[qi][0] && r < &w->r[qi][K_DEPTH] && r->busy);
        VHD_CHECK_EQ(++w->done[r->id], 1); /* exactly once */
        if (c[i].ret != 0) {
            if (w->errors++ < 5)
                fprintf(stderr, "  %s of block %u: ret %d\n", r->write ? "write" : "read", r->blk,
                        c[i].ret);
        } else if (r->write) {
            uint64_t now = ms_now();
            w->acked[r->blk] = r->gen;
            w->writes++;
            if (w->last_write_ms && now - w->last_write_ms > w->max_write_gap_ms)
                w->max_write_gap_ms = now - w->last_write_ms;
            w->last_write_ms = now;
        } else {
            if (!k_holds(r->buf, r->blk, r->gen))
                fprintf(stderr, "  read of block %u: generation %u expected\n", r->blk, r->gen);
            VHD_CHECK(k_holds(r->buf, r->blk, r->gen));
            w->reads++;
        }
        r->busy = false;
        w->blk_busy[r->blk] = false;
        w->inflight[qi]--;
    }
    return n;
}

VHD_TEST(rbd_kill9_restart)
{
    struct daemon dm;
    char img[64];
    need_cluster();
    alarm(400); /* this test's own bound: each takeover of the lock waits for the OSD */
    make_image(img, sizeof(img), "kill");
    start_daemon(&dm, img, K_NQ, 1, NULL);
    struct kwl *w = calloc(1, sizeof(*w));
    VHD_CHECK(w != NULL);
    const char *s = getenv("VHD_CRASH_SEED");
    w->seed = s && *s ? (unsigned)strtoul(s, NULL, 0) : (unsigned)time(NULL) ^ (unsigned)getpid();
    unsigned seed = w->seed;
    struct vhd_blkdrv_opts o = {
        .socket_path = dm.sock, .num_queues = K_NQ, .queue_size = 64, .timeout_ms = 20000};
    char err[256] = "";
    int rc = vhd_blkdrv_connect(&o, &w->d, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  connect: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK(vhd_blkdrv_get_info(w->d)->inflight);
    for (uint32_t qi = 0; qi < K_NQ; qi++) {
        w->q[qi] = vhd_blkdrv_get_queue(w->d, qi);
        for (uint32_t k = 0; k < K_DEPTH; k++) {
            w->r[qi][k].buf = vhd_blkdrv_buf_alloc(w->q[qi], K_BS);
            VHD_CHECK(w->r[qi][k].buf != NULL);
        }
    }

    unsigned kills = 0, since = 0, kill_at = 100 + (unsigned)rand_r(&w->seed) % 300;
    uint32_t tail_start = 0;
    uint64_t last = ms_now(), killed_at = 0, max_stall = 0;
    w->last_write_ms = last;
    for (;;) {
        bool more = kills < K_KILLS || w->next_id - tail_start < K_TAIL;
        uint32_t busy = 0;
        int got = 0;
        for (uint32_t qi = 0; qi < K_NQ; qi++) {
            if (more)
                k_submit(w, qi);
            got += k_reap(w, qi);
            busy += w->inflight[qi];
        }
        uint64_t now = ms_now();
        if (got) {
            if (killed_at) {
                /* First completion after a restart: the takeover's cost. */
                if (now - killed_at > max_stall)
                    max_stall = now - killed_at;
                killed_at = 0;
            }
            last = now;
            since += (unsigned)got;
        }
        if (!more && busy == 0)
            break;
        if (busy && now - last > K_STALL) {
            fprintf(stderr, "  stuck: %u in flight, %u kills, seed %u\n", busy, kills, seed);
            VHD_CHECK(!"progress");
        }
        /* Kill with requests in flight (just submitted: some are surely at librbd). */
        if (kills < K_KILLS && since >= kill_at && busy) {
            kill(dm.pid, SIGKILL);
            waitpid(dm.pid, NULL, 0);
            dm.pid = 0;
            unlink(dm.sock);
            spawn_daemon(&dm);
            kills++;
            since = 0;
            kill_at = 100 + (unsigned)rand_r(&w->seed) % 300;
            killed_at = ms_now();
            last = killed_at;
            if (kills == K_KILLS)
                tail_start = w->next_id;
            continue;
        }
        if (got == 0) {
            if (!vhd_blkdrv_session_alive(w->d)) {
                uint64_t t0 = ms_now();
                while (vhd_blkdrv_reconnect(w->d) != 0) {
                    VHD_CHECK(ms_now() - t0 < 60000);
                    sleep_ms(5);
                }
                VHD_CHECK(vhd_blkdrv_get_info(w->d)->inflight);
                w->reconnects++;
            } else {
                usleep(200);
            }
        }
    }
    if (w->errors)
        fprintf(stderr, "  %llu requests failed (seed %u)\n", (unsigned long long)w->errors, seed);
    VHD_CHECK_EQ(w->errors, 0);
    for (uint32_t id = 0; id < w->next_id; id++)
        VHD_CHECK_EQ(w->done[id], 1);
    VHD_CHECK(w->reconnects >= K_KILLS);
    uint64_t carried = 0;
    for (uint32_t qi = 0; qi < K_NQ; qi++) {
        struct vhd_blkdrv_queue_stats st;
        vhd_blkdrv_queue_stats(w->q[qi], &st);
        carried += st.carried;
    }
    VHD_CHECK(carried > 0); /* some kill caught requests in flight */

    /* Every acknowledged write is on the device ... */
    uint8_t *buf = w->r[0][0].buf;
    for (uint32_t blk = 0; blk < K_BLOCKS; blk++) {
        struct vhd_blkdrv_queue *q = w->q[blk / K_QBLOCKS];
        VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, (uint64_t)blk * K_BS, buf, K_BS, NULL), 0);
        VHD_CHECK_EQ(wait_one(q), 0);
        if (!k_holds(buf, blk, w->acked[blk]))
            fprintf(stderr, "  device block %u: generation %u expected\n", blk, w->acked[blk]);
        VHD_CHECK(k_holds(buf, blk, w->acked[blk]));
    }
    vhd_blkdrv_disconnect(w->d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    /* ... and in the image. */
    uint8_t *b = export_image(&dm, img);
    for (uint32_t blk = 0; blk < K_BLOCKS; blk++)
        VHD_CHECK(k_holds(b + (uint64_t)blk * K_BS, blk, w->acked[blk]));
    free(b);
    printf("  %u kills survived, %llu reconnects, %u requests (%llu writes, %llu reads verified), "
           "%llu carried over a crash, first completion after a kill within %llu ms, longest "
           "time without a write completing %llu ms, seed %u\n",
           kills, (unsigned long long)w->reconnects, w->next_id, (unsigned long long)w->writes,
           (unsigned long long)w->reads, (unsigned long long)carried, (unsigned long long)max_stall,
           (unsigned long long)w->max_write_gap_ms, seed);
    free(w);
    VHD_CHECK_EQ(rbd_cmd("rm " POOL "/%s", img), 0);
    test_done();
}

/* ---- the management API: an RBD disk added at run time ---- */

/* One JSON-RPC request line on fd; its answer line (static buffer). */
static const char *rpc_call(int fd, const char *req)
{
    static char resp[8192];
    size_t have = 0, len = strlen(req);
    VHD_CHECK(send(fd, req, len, MSG_NOSIGNAL) == (ssize_t)len);
    VHD_CHECK(send(fd, "\n", 1, MSG_NOSIGNAL) == 1);
    uint64_t t0 = ms_now();
    while (have + 1 < sizeof(resp)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        VHD_CHECK(ms_now() - t0 < 60000); /* the add connects to the cluster: seconds */
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fd, resp + have, 1, 0);
        VHD_CHECK(n == 1);
        if (resp[have] == '\n') {
            resp[have] = 0;
            return resp;
        }
        have++;
    }
    VHD_CHECK(!"answer too long");
    return NULL;
}

static int rpc_open(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(fd >= 0);
    VHD_CHECK(strlen(path) < sizeof(a.sun_path));
    memcpy(a.sun_path, path, strlen(path) + 1);
    VHD_CHECK(connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
    return fd;
}

/*
 * device.add of backend=rbd: refused while the syscall filter is on (the
 * command line's rule, for a device that comes alone), served with it off.
 */
VHD_TEST(rbd_rpc_add)
{
    struct daemon dm;
    char img[64], blk_sock[192], req[1024];
    need_cluster();
    make_image(img, sizeof(img), "rpc");
    for (int sandbox_off = 0; sandbox_off <= 1; sandbox_off++) {
        daemon_prepare_dir(&dm, "vhd-rbd-XXXXXX", "rpc.sock");
        snprintf(blk_sock, sizeof(blk_sock), "%s/blk.sock", dm.dir);
        char *argv[] = {
            (char *)vhostd_path(),      "--log-level", "info", "--rpc", dm.sock, "--sandbox",
            sandbox_off ? "off" : "on", NULL};
        if (!sandbox_off)
            track(&dm);
        daemon_spawn(&dm, argv);
        int fd = rpc_open(dm.sock);
        snprintf(req, sizeof(req),
                 "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"device.add\",\"params\":{\"kind\":"
                 "\"blk\",\"spec\":\"socket=%s,backend=rbd,pool=" POOL ",image=%s,conf=%s\"}}",
                 blk_sock, img, g_conf);
        const char *r = rpc_call(fd, req);
        if (!sandbox_off) {
            if (!strstr(r, "needs --sandbox off"))
                fprintf(stderr, "  answer: %s\n", r);
            VHD_CHECK(strstr(r, "needs --sandbox off") != NULL);
        } else {
            if (!strstr(r, "\"result\""))
                fprintf(stderr, "  answer: %s\n", r);
            VHD_CHECK(strstr(r, "\"result\"") != NULL);
            struct daemon blk = dm; /* the driver connects to the added device's socket */
            memcpy(blk.sock, blk_sock, sizeof(blk_sock));
            struct vhd_blkdrv *d = connect_drv(&blk, 1);
            VHD_CHECK_EQ(vhd_blkdrv_capacity(d), (long long)IMG_SIZE);
            write_pat(vhd_blkdrv_get_queue(d, 0), 1u << 20, 64u << 10, 11);
            check_pat(vhd_blkdrv_get_queue(d, 0), 1u << 20, 64u << 10, 11);
            vhd_blkdrv_disconnect(d);
        }
        close(fd);
        VHD_CHECK_EQ(daemon_stop(&dm), 0);
        unlink(blk_sock);
        daemon_cleanup_files(&dm);
    }
    VHD_CHECK_EQ(rbd_cmd("rm " POOL "/%s", img), 0);
    test_done();
}
