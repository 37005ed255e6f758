/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration tests of the NBD block backend: nbdkit on a Unix socket in a
 * temp dir (memory and file plugins; error, delay and multi-conn filters),
 * the real build/vhostd with --blk backend=nbd, driven by the userspace blk
 * driver. Every nbdkit is stopped by pid; every wait is bounded.
 */
#define MAX_DAEMONS 1
#include "daemon_fixture.h"
#include "blkdrv_fixture.h"

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>

#include "vhostd/blk_driver.h"

#define WAIT_MS   20000         /* one request, under load, on a busy machine */
#define MEM_SIZE  (64ull << 20) /* memory plugin export */
#define FILE_SIZE (32ull << 20) /* file plugin export */
#define NBDKIT    "/usr/bin/nbdkit"

/* ======================= nbdkit ======================= */

struct server {
    pid_t pid;
    char sock[192]; /* Unix socket ("" with a TCP port) */
    uint16_t port;  /* TCP on 127.0.0.1 (0: Unix socket) */
    char portstr[8];
    char log[192];      /* nbdkit's stderr */
    char files[2][256]; /* more files in the temp dir to remove at the end ("" when none) */
    char *argv[24];
    int argc;
};

static struct server *g_server; /* stopped at exit too (atexit after the daemons) */

static void server_kill(struct server *s)
{
    if (s->pid > 0) {
        kill(s->pid, SIGKILL);
        waitpid(s->pid, NULL, 0);
        s->pid = 0;
    }
}

/* Stop the server and remove its files, so the daemon fixture can remove the temp dir. */
static void server_cleanup(void)
{
    struct server *s = g_server;
    if (!s)
        return;
    server_kill(s);
    if (!s->port)
        unlink(s->sock);
    unlink(s->log);
    for (int i = 0; i < 2; i++)
        if (s->files[i][0])
            unlink(s->files[i]);
    g_server = NULL;
}

/* A passing test ends here: server first (its files live in the daemon's dir). */
static void test_end(void)
{
    server_cleanup();
    test_done();
}

/* nbdkit [args...] -f -U <dir>/nbd.sock: built once, started (and restarted) by server_start. */
static void server_init_port(struct server *s, const struct daemon *dm, uint16_t port,
                             const char *const *args)
{
    static bool registered;
    if (access(NBDKIT, X_OK) != 0)
        vhd_test_skip("nbdkit not installed (scripts/deps.sh test)");
    memset(s, 0, sizeof(*s));
    s->port = port;
    snprintf(s->sock, sizeof(s->sock), "%s/nbd.sock", dm->dir);
    snprintf(s->log, sizeof(s->log), "%s/nbdkit.log", dm->dir);
    s->argv[s->argc++] = NBDKIT;
    s->argv[s->argc++] = "-f";
    s->argv[s->argc++] = "--exit-with-parent";
    if (s->port) {
        snprintf(s->portstr, sizeof(s->portstr), "%u", s->port);
        s->sock[0] = '\0';
        s->argv[s->argc++] = "-i";
        s->argv[s->argc++] = "127.0.0.1";
        s->argv[s->argc++] = "-p";
        s->argv[s->argc++] = s->portstr;
    } else {
        s->argv[s->argc++] = "-U";
        s->argv[s->argc++] = s->sock;
    }
    for (int i = 0; args[i]; i++) {
        VHD_CHECK(s->argc < 22);
        s->argv[s->argc++] = (char *)args[i];
    }
    s->argv[s->argc] = NULL;
    g_server = s;
    if (!registered) {
        atexit(server_cleanup); /* runs before the fixture's kill_daemons (registered first) */
        registered = true;
    }
}

static void server_init(struct server *s, const struct daemon *dm, const char *const *args)
{
    server_init_port(s, dm, 0, args);
}

/* The server takes connections: its Unix socket exists, or its TCP port accepts one. */
static bool server_up(const struct server *s)
{
    struct stat st;
    if (!s->port)
        return stat(s->sock, &st) == 0 && S_ISSOCK(st.st_mode);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(s->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(fd >= 0);
    bool up = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    close(fd);
    return up;
}

/* A TCP port on 127.0.0.1 nobody listens on right now (the kernel's pick). */
static uint16_t free_port(void)
{
    struct sockaddr_in a = {.sin_family = AF_INET};
    socklen_t len = sizeof(a);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    VHD_CHECK_EQ(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void server_start(struct server *s)
{
    if (!s->port)
        unlink(s->sock); /* a killed server leaves its socket behind */
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(s->log, O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(s->argv[0], s->argv);
        _exit(127);
    }
    s->pid = pid;
    uint64_t t0 = ms_now();
    while (!server_up(s)) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            s->pid = 0;
            fprintf(stderr, "  nbdkit exited early (status 0x%x)\n", status);
            VHD_CHECK(!"nbdkit start");
        }
        VHD_CHECK(ms_now() - t0 < START_MS);
        sleep_ms(5);
    }
}

/* ======================= vhostd ======================= */

static void dir_prepare(struct daemon *dm)
{
    daemon_prepare_dir(dm, "vhd-nbd-XXXXXX", "blk.sock");
    track(dm);
}

/* vhostd with the default sandbox, its device on s (nbd+unix://, or nbd://localhost:PORT). */
static void vhostd_start(struct daemon *dm, const struct server *s, const char *keys)
{
    const char *bin = vhostd_path();
    char spec[PATH_MAX * 2], uri[PATH_MAX];
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    if (s->port)
        snprintf(uri, sizeof(uri), "nbd://localhost:%u/", s->port);
    else
        snprintf(uri, sizeof(uri), "nbd+unix:///?socket=%s", s->sock);
    snprintf(spec, sizeof(spec), "socket=%s,backend=nbd,uri=%s%s%s", dm->sock, uri,
             *keys ? "," : "", keys);
    char *argv[] = {(char *)bin, "--log-level", "info", "--workers", "2", "--blk", spec, NULL};
    daemon_spawn(dm, argv);
}

/* dm's directory, an nbdkit memory export of 64 MiB (s) and vhostd serving it with keys. */
static void memory_export_start(struct daemon *dm, struct server *s, const char *keys)
{
    dir_prepare(dm);
    server_init(s, dm, (const char *const[]){"memory", "size=64M", NULL});
    server_start(s);
    vhostd_start(dm, s, keys);
}

/* ======================= driver helpers ======================= */

static struct vhd_blkdrv *drv_connect(const char *sock, uint32_t nq)
{
    struct vhd_blkdrv_opts o = {
        .socket_path = sock, .num_queues = nq, .pool_size = 8u << 20, .timeout_ms = WAIT_MS};
    return blkdrv_connect_opts(&o);
}

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
    return rc < 0 ? rc : wait_one(q).ret;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Each 8 bytes of [off, off + len) get a value of (seed, byte offset): any misplacement shows. */
static void fill(void *buf, uint64_t off, size_t len, uint64_t seed)
{
    uint64_t *p = buf;
    for (size_t i = 0; i < len / 8; i++)
        p[i] = mix64(seed ^ (off + i * 8));
}

static bool check(const void *buf, uint64_t off, size_t len, uint64_t seed)
{
    const uint64_t *p = buf;
    for (size_t i = 0; i < len / 8; i++)
        if (p[i] != mix64(seed ^ (off + i * 8))) {
            fprintf(stderr, "  data mismatch at byte %llu (seed %llu)\n",
                    (unsigned long long)(off + i * 8), (unsigned long long)seed);
            return false;
        }
    return true;
}

static bool all_zero(const void *buf, size_t len)
{
    const uint8_t *p = buf;
    for (size_t i = 0; i < len; i++)
        if (p[i])
            return false;
    return true;
}

/* A temp file of size bytes in dm's dir (the file plugin's export). */
static void make_file(const struct daemon *dm, char *path, size_t pathlen, uint64_t size)
{
    snprintf(path, pathlen, "%s/export.img", dm->dir);
    int fd = open(path, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(ftruncate(fd, (off_t)size), 0);
    close(fd);
}

/* ======================= tests ======================= */

/*
 * Memory plugin, two queues on two workers (one connection each, multi-conn):
 * features and size come from the server; patterns of many sizes and
 * offsets (single and multi-segment) written on one queue read back on the
 * other; flush succeeds.
 */
VHD_TEST(nbd_memory_rw)
{
    struct daemon dm;
    struct server s;
    memory_export_start(&dm, &s, "queues=2");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 2);
    const struct vhd_blkdrv_info *in = vhd_blkdrv_get_info(d);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(d), MEM_SIZE);
    VHD_CHECK(in->flush && in->discard && in->write_zeroes && !in->read_only);
    VHD_CHECK_EQ(in->device_queues, 2);
    VHD_CHECK(daemon_log_has(&dm, "(multi-conn)"));

    struct vhd_blkdrv_queue *q0 = vhd_blkdrv_get_queue(d, 0), *q1 = vhd_blkdrv_get_queue(d, 1);
    size_t max = 1u << 20;
    uint8_t *w = vhd_blkdrv_buf_alloc(q0, max), *r = vhd_blkdrv_buf_alloc(q1, max);
    VHD_CHECK(w && r);
    static const size_t lens[] = {512, 4096, 65536, 1u << 20, 3584};
    for (unsigned i = 0; i < 40; i++) {
        size_t len = lens[i % 5];
        uint64_t off = (mix64(i) % ((MEM_SIZE - len) / 512)) * 512;
        fill(w, off, len, i + 1);
        VHD_CHECK_EQ(sync_write(q0, off, w, len), 0);
        memset(r, 0xa5, len);
        VHD_CHECK_EQ(sync_read(q1, off, r, len), 0);
        VHD_CHECK(check(r, off, len, i + 1));
    }
    /* Several segments: one request, one NBD command per segment. */
    struct iovec wv[3] = {{w, 4096}, {w + 8192, 512}, {w + 65536, 65536}};
    fill(w, 0, max, 77);
    VHD_CHECK_EQ(vhd_blkdrv_submit_writev(q0, 1 << 20, wv, 3, w), 0);
    VHD_CHECK_EQ(wait_one(q0).ret, 0);
    VHD_CHECK_EQ(sync_read(q1, 1 << 20, r, 4096 + 512 + 65536), 0);
    VHD_CHECK(memcmp(r, w, 4096) == 0 && memcmp(r + 4096, w + 8192, 512) == 0 &&
              memcmp(r + 4608, w + 65536, 65536) == 0);
    VHD_CHECK_EQ(sync_flush(q0), 0);
    VHD_CHECK_EQ(sync_flush(q1), 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/* Write zeroes (with and without unmap) reads back zeroes; discard succeeds. */
VHD_TEST(nbd_zeroes_discard)
{
    struct daemon dm;
    struct server s;
    memory_export_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    size_t len = 256u << 10;
    uint8_t *b = vhd_blkdrv_buf_alloc(q, len);
    VHD_CHECK(b != NULL);
    for (int unmap = 0; unmap < 2; unmap++) {
        uint64_t off = (uint64_t)(unmap + 1) << 22;
        fill(b, off, len, 5);
        VHD_CHECK_EQ(sync_write(q, off, b, len), 0);
        VHD_CHECK_EQ(vhd_blkdrv_submit_write_zeroes(q, off + 4096, len - 8192, unmap, b), 0);
        VHD_CHECK_EQ(wait_one(q).ret, 0);
        VHD_CHECK_EQ(sync_read(q, off, b, len), 0);
        VHD_CHECK(check(b, off, 4096, 5));
        VHD_CHECK(all_zero(b + 4096, len - 8192));
        VHD_CHECK(check(b + len - 4096, off + len - 4096, 4096, 5));
    }
    VHD_CHECK_EQ(vhd_blkdrv_submit_discard(q, 8u << 20, 1u << 20, b), 0);
    VHD_CHECK_EQ(wait_one(q).ret, 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/*
 * File plugin: what the guest wrote and flushed is in the file (read here
 * directly, past the server), and what the file holds reads back.
 */
VHD_TEST(nbd_file_flush)
{
    struct daemon dm;
    struct server s;
    char img[256], arg[300];
    dir_prepare(&dm);
    make_file(&dm, img, sizeof(img), FILE_SIZE);
    snprintf(arg, sizeof(arg), "file=%s", img);
    server_init(&s, &dm, (const char *const[]){"file", arg, NULL});
    snprintf(s.files[0], sizeof(s.files[0]), "%s", img);
    server_start(&s);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(d), FILE_SIZE);
    VHD_CHECK(vhd_blkdrv_get_info(d)->flush);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    size_t len = 128u << 10;
    uint8_t *b = vhd_blkdrv_buf_alloc(q, len);
    VHD_CHECK(b != NULL);
    fill(b, 3u << 20, len, 9);
    VHD_CHECK_EQ(sync_write(q, 3u << 20, b, len), 0);
    VHD_CHECK_EQ(sync_flush(q), 0);

    static uint8_t f[128u << 10];
    int fd = open(img, O_RDWR | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(pread(fd, f, len, 3u << 20), (ssize_t)len);
    VHD_CHECK(check(f, 3u << 20, len, 9));
    /* And the other way: written to the file, read through the device. */
    fill(f, 5u << 20, len, 10);
    VHD_CHECK_EQ(pwrite(fd, f, len, 5u << 20), (ssize_t)len);
    close(fd);
    VHD_CHECK_EQ(sync_read(q, 5u << 20, b, len), 0);
    VHD_CHECK(check(b, 5u << 20, len, 10));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/* A read-only export makes a read-only device (VIRTIO_BLK_F_RO): reads work, writes fail. */
VHD_TEST(nbd_readonly_export)
{
    struct daemon dm;
    struct server s;
    dir_prepare(&dm);
    server_init(&s, &dm, (const char *const[]){"-r", "memory", "size=64M", NULL});
    server_start(&s);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    const struct vhd_blkdrv_info *in = vhd_blkdrv_get_info(d);
    VHD_CHECK(in->read_only);
    VHD_CHECK(!in->discard && !in->write_zeroes);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *b = vhd_blkdrv_buf_alloc(q, 4096);
    VHD_CHECK(b != NULL);
    memset(b, 0xee, 4096);
    VHD_CHECK_EQ(sync_read(q, 0, b, 4096), 0);
    VHD_CHECK(all_zero(b, 4096));
    VHD_CHECK_EQ(sync_write(q, 0, b, 4096), -EIO);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/*
 * The error filter fails every request while its trigger file exists: that
 * request (and only it) gets IOERR; the ones before and after succeed, on
 * the same connection, and the data is intact.
 */
VHD_TEST(nbd_server_error)
{
    struct daemon dm;
    struct server s;
    char trig[256], arg[300];
    dir_prepare(&dm);
    snprintf(trig, sizeof(trig), "%s/fail-now", dm.dir);
    snprintf(arg, sizeof(arg), "error-file=%s", trig);
    server_init(&s, &dm,
                (const char *const[]){"--filter=error", "memory", "size=64M", "error=EIO",
                                      "error-rate=100%", arg, NULL});
    snprintf(s.files[0], sizeof(s.files[0]), "%s", trig);
    server_start(&s);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *b = vhd_blkdrv_buf_alloc(q, 65536);
    VHD_CHECK(b != NULL);
    fill(b, 0, 65536, 3);
    VHD_CHECK_EQ(sync_write(q, 0, b, 65536), 0);

    int fd = open(trig, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    VHD_CHECK(fd >= 0);
    close(fd);
    VHD_CHECK_EQ(sync_read(q, 0, b, 65536), -EIO);
    VHD_CHECK_EQ(sync_write(q, 4096, b, 4096), -EIO);
    VHD_CHECK_EQ(unlink(trig), 0);

    for (int i = 0; i < 4; i++) {
        memset(b, 0, 65536);
        VHD_CHECK_EQ(sync_read(q, 0, b, 65536), 0);
        VHD_CHECK(check(b, 0, 65536, 3));
    }
    VHD_CHECK_EQ(sync_flush(q), 0);
    VHD_CHECK(!daemon_log_has(&dm, "reconnect"));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/*
 * A server that answers ENOSPC (nbdkit's error filter while the trigger file
 * exists): under the default werror=enospc the write is held, not failed,
 * and the queue pauses; with the space back (trigger removed) SIGUSR2
 * retries it and it succeeds, and the data reads back. An NBD error used to
 * reach the device as a flat EIO, so the guest saw the error instead.
 */
VHD_TEST(nbd_server_enospc_pauses)
{
    struct daemon dm;
    struct server s;
    char trig[256], arg[300];
    dir_prepare(&dm);
    snprintf(trig, sizeof(trig), "%s/full-now", dm.dir);
    snprintf(arg, sizeof(arg), "error-pwrite-file=%s", trig);
    server_init(&s, &dm,
                (const char *const[]){"--filter=error", "memory", "size=64M", "error=ENOSPC",
                                      "error-pwrite-rate=100%", arg, NULL});
    snprintf(s.files[0], sizeof(s.files[0]), "%s", trig);
    server_start(&s);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *b = vhd_blkdrv_buf_alloc(q, 8192);
    VHD_CHECK(b != NULL);
    fill(b, 0, 8192, 5);
    VHD_CHECK_EQ(sync_write(q, 0, b, 4096), 0);

    int fd = open(trig, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    VHD_CHECK(fd >= 0);
    close(fd);
    VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, 4096, b + 4096, 4096, b), 0);
    /* Held: no completion while the server is full. */
    struct vhd_blkdrv_completion c;
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, 1000), -ETIMEDOUT);
    for (int i = 0; i < 100 && !daemon_log_has(&dm, "paused"); i++)
        usleep(20000);
    VHD_CHECK(daemon_log_has(&dm, "paused"));
    VHD_CHECK_EQ(unlink(trig), 0);
    VHD_CHECK_EQ(kill(dm.pid, SIGUSR2), 0);
    c = wait_one(q);
    VHD_CHECK(c.cookie == b);
    VHD_CHECK_EQ(c.ret, 0);
    memset(b, 0, 8192);
    VHD_CHECK_EQ(sync_read(q, 0, b, 8192), 0);
    VHD_CHECK(check(b, 0, 8192, 5));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/*
 * A request libnbd refuses to send (a server with a 4 KiB minimum block
 * size, a 512-byte read) fails alone with IOERR, while another request is
 * in flight on the same connection (the delay filter keeps it there); the
 * connection is not treated as lost and the other request succeeds.
 */
VHD_TEST(nbd_refused_request)
{
    struct daemon dm;
    struct server s;
    dir_prepare(&dm);
    server_init(&s, &dm,
                (const char *const[]){"--filter=blocksize-policy", "--filter=delay", "memory",
                                      "size=64M", "blocksize-minimum=4096", "rdelay=300ms", NULL});
    server_start(&s);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *a = vhd_blkdrv_buf_alloc(q, 4096), *b = vhd_blkdrv_buf_alloc(q, 4096);
    VHD_CHECK(a && b);
    for (int round = 0; round < 2; round++) {
        VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, a, 4096, a), 0);
        VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 8192, b, 512, b), 0);
        for (int i = 0; i < 2; i++) {
            struct vhd_blkdrv_completion c = wait_one(q);
            VHD_CHECK_EQ(c.ret, c.cookie == a ? 0 : -EIO);
        }
    }
    VHD_CHECK(daemon_log_has(&dm, "refused by libnbd")); /* not sent: libnbd said no */
    VHD_CHECK(!daemon_log_has(&dm, "reconnect"));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

static uint64_t elapsed_since(uint64_t t0)
{
    return ms_now() - t0;
}

/*
 * A slow server (delay filter, 300 ms per read and write): requests take
 * that long, complete successfully, and 16 of them in flight overlap (the
 * connection carries them concurrently, not one after the other).
 */
VHD_TEST(nbd_slow_server)
{
    struct daemon dm;
    struct server s;
    dir_prepare(&dm);
    server_init(&s, &dm,
                (const char *const[]){"--filter=delay", "memory", "size=64M", "rdelay=300ms",
                                      "wdelay=300ms", NULL});
    server_start(&s);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    enum { N = 16 };
    uint8_t *b[N];
    for (int i = 0; i < N; i++) {
        b[i] = vhd_blkdrv_buf_alloc(q, 4096);
        VHD_CHECK(b[i] != NULL);
    }
    fill(b[0], 0, 4096, 1);
    uint64_t t0 = ms_now();
    VHD_CHECK_EQ(sync_write(q, 0, b[0], 4096), 0);
    VHD_CHECK(elapsed_since(t0) >= 300);

    t0 = ms_now();
    for (int i = 0; i < N; i++)
        VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 0, b[i], 4096, b[i]), 0);
    for (int done = 0; done < N;) {
        struct vhd_blkdrv_completion c[N];
        int n = vhd_blkdrv_wait(q, c, N, WAIT_MS);
        VHD_CHECK(n > 0);
        for (int k = 0; k < n; k++) {
            VHD_CHECK_EQ(c[k].ret, 0);
            VHD_CHECK(check(c[k].cookie, 0, 4096, 1));
        }
        done += n;
    }
    uint64_t dt = elapsed_since(t0);
    VHD_CHECK(dt >= 300);
    /* One after the other would be 16 * 300 ms: the reads overlapped. */
    VHD_CHECK(dt < (uint64_t)N * 300);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/*
 * Server restart under load: a writer keeps 8 requests in flight (writes of
 * per-block patterns, reads that check what was written before) while the
 * server is killed (SIGKILL: requests in flight are lost with it), stays
 * down a while, and comes back on the same socket with the same file, twice.
 * Every request completes successfully; afterwards every block verifies.
 */
VHD_TEST(nbd_server_restart)
{
    struct daemon dm;
    struct server s;
    char img[256], arg[300];
    dir_prepare(&dm);
    make_file(&dm, img, sizeof(img), FILE_SIZE);
    snprintf(arg, sizeof(arg), "file=%s", img);
    server_init(&s, &dm, (const char *const[]){"file", arg, NULL});
    snprintf(s.files[0], sizeof(s.files[0]), "%s", img);
    server_start(&s);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    enum { DEPTH = 8, BS = 16384, NBLK = 512 };
    uint8_t *b[DEPTH];
    static uint32_t gen[NBLK]; /* generation each block was last written with (0: never) */
    static uint64_t pending_blk[DEPTH];
    static uint32_t pending_gen[DEPTH];
    static bool busy[DEPTH], is_write[DEPTH];
    for (int i = 0; i < DEPTH; i++) {
        b[i] = vhd_blkdrv_buf_alloc(q, BS);
        VHD_CHECK(b[i] != NULL);
    }
    uint32_t issued = 0, completed = 0, seq = 0;
    int restarts = 0;
    uint64_t t_start = ms_now(), t_kill = t_start + 400, t_back = 0;
    bool down = false;

    /* Bounded: 20 s of load at most, the two restarts happen in the first few seconds. */
    while (ms_now() - t_start < 20000) {
        if (restarts == 2 && !down && completed > issued / 2 && ms_now() > t_back + 500)
            break;
        if (!down && restarts < 2 && ms_now() >= t_kill) {
            server_kill(&s);
            down = true;
            t_back = ms_now() + 700; /* > several back-off rounds */
        } else if (down && ms_now() >= t_back) {
            server_start(&s);
            down = false;
            restarts++;
            t_kill = ms_now() + 600;
        }
        for (int i = 0; i < DEPTH; i++) {
            if (busy[i])
                continue;
            uint64_t blk = mix64(seq) % NBLK;
            /* Never two requests on one block at once: the order between them is not defined. */
            bool clash = false;
            for (int k = 0; k < DEPTH; k++)
                clash |= busy[k] && pending_blk[k] == blk;
            if (clash) {
                seq++;
                continue;
            }
            is_write[i] = (seq % 3) != 2 || gen[blk] == 0;
            pending_blk[i] = blk;
            int rc;
            if (is_write[i]) {
                pending_gen[i] = ++seq;
                fill(b[i], blk * BS, BS, pending_gen[i]);
                rc = vhd_blkdrv_submit_write(q, blk * BS, b[i], BS, (void *)(intptr_t)i);
            } else {
                pending_gen[i] = gen[blk];
                seq++;
                memset(b[i], 0, BS);
                rc = vhd_blkdrv_submit_read(q, blk * BS, b[i], BS, (void *)(intptr_t)i);
            }
            VHD_CHECK_EQ(rc, 0);
            busy[i] = true;
            issued++;
        }
        struct vhd_blkdrv_completion c[DEPTH];
        int n = vhd_blkdrv_wait(q, c, DEPTH, 50); /* short: the restarts are timed here */
        if (n == -ETIMEDOUT)
            n = 0;
        VHD_CHECK(n >= 0);
        for (int k = 0; k < n; k++) {
            int i = (int)(intptr_t)c[k].cookie;
            VHD_CHECK(i >= 0 && i < DEPTH && busy[i]);
            if (c[k].ret != 0)
                fprintf(stderr, "  request %s block %llu failed: %d\n",
                        is_write[i] ? "write" : "read", (unsigned long long)pending_blk[i],
                        c[k].ret);
            VHD_CHECK_EQ(c[k].ret, 0);
            if (is_write[i])
                gen[pending_blk[i]] = pending_gen[i];
            else
                VHD_CHECK(check(b[i], pending_blk[i] * BS, BS, pending_gen[i]));
            busy[i] = false;
            completed++;
        }
    }
    VHD_CHECK_EQ(restarts, 2);
    VHD_CHECK(!down);
    /* Drain (bounded by WAIT_MS per completion). */
    for (int i = 0; i < DEPTH; i++) {
        if (!busy[i])
            continue;
        struct vhd_blkdrv_completion c = wait_one(q);
        int k = (int)(intptr_t)c.cookie;
        VHD_CHECK_EQ(c.ret, 0);
        if (is_write[k])
            gen[pending_blk[k]] = pending_gen[k];
        busy[k] = false;
        completed++;
        i = -1; /* rescan */
    }
    VHD_CHECK_EQ(completed, issued);
    VHD_CHECK(issued > 100);
    /*
     * Writes were acknowledged and unflushed when the server died; with the
     * default lost-writes=ignore the flush succeeds (the file server kept
     * them: every read above checked its data); nbd_flush_after_lost_writes
     * covers lost-writes=report.
     */
    VHD_CHECK_EQ(sync_flush(q), 0);
    /* Every block holds its last write, read through the device and in the file. */
    static uint8_t f[BS];
    int fd = open(img, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    for (uint64_t blk = 0; blk < NBLK; blk++) {
        if (!gen[blk])
            continue;
        VHD_CHECK_EQ(sync_read(q, blk * BS, b[0], BS), 0);
        VHD_CHECK(check(b[0], blk * BS, BS, gen[blk]));
        VHD_CHECK_EQ(pread(fd, f, BS, (off_t)(blk * BS)), BS);
        VHD_CHECK(check(f, blk * BS, BS, gen[blk]));
    }
    close(fd);
    VHD_CHECK(daemon_log_has(&dm, "reconnected"));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/* The first line of path containing needle, or false (the file may not exist yet). */
static bool file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char line[1024];
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f))
        found = strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return found;
}

/*
 * Writes acknowledged, then the server restarts while the device is idle:
 * at exit vhostd still flushes (on a new connection, its own being dead),
 * and the restarted server sees that flush (nbdkit's log filter).
 */
VHD_TEST(nbd_flush_at_exit)
{
    struct daemon dm;
    struct server s;
    char img[256], arg[300], logarg[300], cmdlog[256];
    dir_prepare(&dm);
    make_file(&dm, img, sizeof(img), FILE_SIZE);
    snprintf(arg, sizeof(arg), "file=%s", img);
    snprintf(cmdlog, sizeof(cmdlog), "%s/commands.log", dm.dir);
    snprintf(logarg, sizeof(logarg), "logfile=%s", cmdlog);
    server_init(&s, &dm, (const char *const[]){"--filter=log", "file", arg, logarg, NULL});
    snprintf(s.files[0], sizeof(s.files[0]), "%s", img);
    snprintf(s.files[1], sizeof(s.files[1]), "%s", cmdlog);
    server_start(&s);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *b = vhd_blkdrv_buf_alloc(q, 4096);
    VHD_CHECK(b != NULL);
    fill(b, 0, 4096, 4);
    VHD_CHECK_EQ(sync_write(q, 0, b, 4096), 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK(!file_has(cmdlog, "Flush"));

    server_kill(&s);
    unlink(cmdlog);
    server_start(&s);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    VHD_CHECK(file_has(cmdlog, "Flush"));
    VHD_CHECK(!daemon_log_has(&dm, "final flush failed"));
    test_end();
}

/*
 * The server's socket belongs to another user, mode 0600: vhostd as root
 * connects at start-up, then drops its capabilities (no --user); its
 * workers, which connect after that, still reach the socket (the sandbox
 * keeps CAP_DAC_OVERRIDE with an nbd device, as in client mode).
 */
VHD_TEST(nbd_socket_of_another_user)
{
    struct daemon dm;
    struct server s;
    if (geteuid() != 0)
        vhd_test_skip("needs root (a socket owned by another user)");
    dir_prepare(&dm);
    server_init(&s, &dm, (const char *const[]){"memory", "size=64M", NULL});
    server_start(&s);
    VHD_CHECK_EQ(chown(s.sock, 65534, 65534), 0);
    VHD_CHECK_EQ(chmod(s.sock, 0600), 0);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *b = vhd_blkdrv_buf_alloc(q, 4096);
    VHD_CHECK(b != NULL);
    VHD_CHECK_EQ(sync_read(q, 0, b, 4096), 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/*
 * TCP with a host name (nbd://localhost:PORT/), under the sandbox: the name
 * is resolved at start-up, the workers' connections and a reconnection
 * after a server restart go to the address (socket, connect, TCP_NODELAY
 * are allowed; nothing opens /etc/hosts on a worker).
 */
VHD_TEST(nbd_tcp)
{
    struct daemon dm;
    struct server s;
    dir_prepare(&dm);
    server_init_port(&s, &dm, free_port(), (const char *const[]){"memory", "size=64M", NULL});
    server_start(&s);
    vhostd_start(&dm, &s, "queues=2");
    VHD_CHECK(daemon_log_has(&dm, "localhost is 127.0.0.1"));

    struct vhd_blkdrv *d = drv_connect(dm.sock, 2);
    for (uint32_t i = 0; i < 2; i++) {
        struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, i);
        uint8_t *b = vhd_blkdrv_buf_alloc(q, 65536);
        VHD_CHECK(b != NULL);
        fill(b, i << 20, 65536, 20 + i);
        VHD_CHECK_EQ(sync_write(q, i << 20, b, 65536), 0);
        memset(b, 0, 65536);
        VHD_CHECK_EQ(sync_read(q, i << 20, b, 65536), 0);
        VHD_CHECK(check(b, i << 20, 65536, 20 + i));
        vhd_blkdrv_buf_free(q, b, 65536);
    }
    /* The memory plugin forgets everything: after the restart the data reads back as zeroes. */
    server_kill(&s);
    server_start(&s);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *b = vhd_blkdrv_buf_alloc(q, 65536);
    VHD_CHECK(b != NULL);
    memset(b, 0xa5, 65536);
    VHD_CHECK_EQ(sync_read(q, 0, b, 65536), 0);
    VHD_CHECK(all_zero(b, 65536));
    VHD_CHECK(daemon_log_has(&dm, "reconnected"));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/* Run vhostd expecting it to refuse the device: it exits non-zero (bounded). */
static int vhostd_run_to_exit(struct daemon *dm, const struct server *s, const char *keys)
{
    const char *bin = vhostd_path();
    char spec[PATH_MAX * 2];
    if (!bin)
        vhd_test_skip("vhostd binary not found");
    snprintf(spec, sizeof(spec), "socket=%s,backend=nbd,uri=nbd+unix:///?socket=%s%s%s", dm->sock,
             s->sock, *keys ? "," : "", keys);
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(dm->log, O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execl(bin, bin, "--blk", spec, (char *)NULL);
        _exit(127);
    }
    dm->pid = pid;
    uint64_t t0 = ms_now();
    int status = 0;
    while (waitpid(pid, &status, WNOHANG) != pid) {
        VHD_CHECK(ms_now() - t0 < START_MS + 12000); /* the probe connect is bounded at 10 s */
        sleep_ms(5);
    }
    dm->pid = 0;
    VHD_CHECK(WIFEXITED(status));
    return WEXITSTATUS(status);
}

/*
 * Without multi-conn (the multi-conn filter hides it) the server does not
 * promise that a flush on one connection covers another's writes: two
 * queues are refused with a message that says why; one queue works.
 */
VHD_TEST(nbd_no_multi_conn)
{
    struct daemon dm;
    struct server s;
    dir_prepare(&dm);
    server_init(&s, &dm,
                (const char *const[]){"--filter=multi-conn", "memory", "size=64M",
                                      "multi-conn-mode=disable", NULL});
    server_start(&s);
    VHD_CHECK(vhostd_run_to_exit(&dm, &s, "queues=2") != 0);
    VHD_CHECK(daemon_log_has(&dm, "multi-conn"));
    VHD_CHECK(daemon_log_has(&dm, "queues=1"));

    vhostd_start(&dm, &s, "");
    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *b = vhd_blkdrv_buf_alloc(q, 4096);
    VHD_CHECK(b != NULL);
    fill(b, 4096, 4096, 8);
    VHD_CHECK_EQ(sync_write(q, 4096, b, 4096), 0);
    memset(b, 0, 4096);
    VHD_CHECK_EQ(sync_read(q, 4096, b, 4096), 0);
    VHD_CHECK(check(b, 4096, 4096, 8));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/* No server at start-up: vhostd says so and exits (the device cannot be sized). */
VHD_TEST(nbd_no_server)
{
    struct daemon dm;
    struct server s;
    dir_prepare(&dm);
    server_init(&s, &dm, (const char *const[]){"memory", "size=1M", NULL});
    VHD_CHECK(vhostd_run_to_exit(&dm, &s, "") != 0);
    VHD_CHECK(daemon_log_has(&dm, "cannot connect"));
    test_end();
}

/*
 * Durability across a server restart (the memory plugin forgets everything):
 * writes acknowledged, then the server dies before a flush covered them: the
 * next FLUSH fails with IOERR, once; later ones succeed. Writes a flush
 * covered before the restart make no error. The next flush used to succeed
 * although the writes were gone.
 */
VHD_TEST(nbd_flush_after_lost_writes)
{
    struct daemon dm;
    struct server s;
    memory_export_start(&dm, &s, "lost-writes=report");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    VHD_CHECK(vhd_blkdrv_get_info(d)->flush);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *b = vhd_blkdrv_buf_alloc(q, 65536);
    VHD_CHECK(b != NULL);

    /* Flushed before the restart: nothing to report. */
    fill(b, 0, 65536, 31);
    VHD_CHECK_EQ(sync_write(q, 0, b, 65536), 0);
    VHD_CHECK_EQ(sync_flush(q), 0);
    server_kill(&s);
    server_start(&s);
    VHD_CHECK_EQ(sync_read(q, 0, b, 65536), 0); /* reconnects */
    VHD_CHECK_EQ(sync_flush(q), 0);

    /* Acknowledged, not flushed, server restarted: the next flush fails, once. */
    fill(b, 1u << 20, 65536, 32);
    VHD_CHECK_EQ(sync_write(q, 1u << 20, b, 65536), 0);
    server_kill(&s);
    server_start(&s);
    VHD_CHECK_EQ(sync_flush(q), -EIO);
    VHD_CHECK_EQ(sync_flush(q), 0);
    VHD_CHECK_EQ(sync_write(q, 1u << 20, b, 65536), 0);
    VHD_CHECK_EQ(sync_flush(q), 0);
    VHD_CHECK(daemon_log_has(&dm, "no flush covered"));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/*
 * A server that keeps no write cache (no NBD_FLAG_SEND_FLUSH: the eval
 * plugin says can_flush false): writes are durable when acknowledged, so a
 * restart loses nothing and nothing fails or is reported.
 */
VHD_TEST(nbd_no_flush_server_restart)
{
    struct daemon dm;
    struct server s;
    dir_prepare(&dm);
    server_init(&s, &dm,
                (const char *const[]){"eval", "get_size=echo 67108864",
                                      "pread=dd if=/dev/zero count=$3 iflag=count_bytes "
                                      "status=none",
                                      "pwrite=cat >/dev/null", "can_write=exit 0",
                                      "can_flush=exit 3", NULL});
    server_start(&s);
    vhostd_start(&dm, &s, "");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 1);
    VHD_CHECK(!vhd_blkdrv_get_info(d)->flush);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *b = vhd_blkdrv_buf_alloc(q, 4096);
    VHD_CHECK(b != NULL);
    fill(b, 0, 4096, 33);
    VHD_CHECK_EQ(sync_write(q, 0, b, 4096), 0);
    server_kill(&s);
    server_start(&s);
    VHD_CHECK_EQ(sync_write(q, 4096, b, 4096), 0); /* reconnects */
    VHD_CHECK_EQ(sync_read(q, 0, b, 4096), 0);
    VHD_CHECK(daemon_log_has(&dm, "reconnected"));
    VHD_CHECK(!daemon_log_has(&dm, "no flush covered"));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/*
 * A ring stop during an outage: the server is down, requests wait for it,
 * and the driver reconnects (GET_VRING_BASE on the old session). The stop
 * returns at once (the waiting requests complete with IOERR) instead of
 * waiting for the 10 s detach timeout and marking the queue broken; once the
 * server is back, I/O works on the new session.
 */
VHD_TEST(nbd_ring_stop_during_outage)
{
    struct daemon dm;
    struct server s;
    memory_export_start(&dm, &s, "");

    /* A short bound: the driver's own drain before GET_VRING_BASE waits this long. */
    struct vhd_blkdrv_opts o = {
        .socket_path = dm.sock, .num_queues = 1, .pool_size = 8u << 20, .timeout_ms = 1500};
    struct vhd_blkdrv *d = blkdrv_connect_opts(&o);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    enum { N = 4 };
    uint8_t *b = vhd_blkdrv_buf_alloc(q, N * 4096);
    VHD_CHECK(b != NULL);
    fill(b, 0, N * 4096, 34);
    VHD_CHECK_EQ(sync_write(q, 0, b, N * 4096), 0);

    server_kill(&s);
    for (int i = 0; i < N; i++)
        VHD_CHECK_EQ(
            vhd_blkdrv_submit_read(q, (uint64_t)i * 4096, b + i * 4096, 4096, b + i * 4096), 0);
    struct vhd_blkdrv_completion c[N];
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, c, N, 300), -ETIMEDOUT); /* they wait for the server */

    uint64_t t0 = ms_now();
    int rc = vhd_blkdrv_reconnect(d);
    uint64_t dt = elapsed_since(t0);
    if (rc != 0)
        fprintf(stderr, "  reconnect: %s (after %llu ms)\n", vhd_blkdrv_errmsg(d),
                (unsigned long long)dt);
    VHD_CHECK_EQ(rc, 0);
    printf("  ring stop and reconnect during the outage: %llu ms\n", (unsigned long long)dt);
    VHD_CHECK(dt < 5000); /* the driver's 1.5 s drain, then prompt: not the 10 s detach */
    for (int done = 0; done < N;) {
        int n = vhd_blkdrv_wait(q, c, N, WAIT_MS);
        VHD_CHECK(n > 0);
        for (int k = 0; k < n; k++)
            VHD_CHECK_EQ(c[k].ret, -EIO);
        done += n;
    }
    VHD_CHECK(!daemon_log_has(&dm, "did not drain"));
    VHD_CHECK(!daemon_log_has(&dm, "broken"));

    server_start(&s);
    fill(b, 0, 4096, 35);
    VHD_CHECK_EQ(sync_write(q, 0, b, 4096), 0);
    memset(b, 0, 4096);
    VHD_CHECK_EQ(sync_read(q, 0, b, 4096), 0);
    VHD_CHECK(check(b, 0, 4096, 35));
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}

/*
 * Multi-conn (two queues, two workers, a connection each): queue 0 writes,
 * the server restarts, queue 1's worker connects for the first time and
 * flushes: that flush reached the new server, which never saw the write, so
 * it does not cover it. When queue 0's connection finds itself lost, the
 * next flush fails once. (A flush on any connection used to count as
 * covering every earlier write, and the loss went unreported.)
 */
VHD_TEST(nbd_multi_conn_lost_writes)
{
    struct daemon dm;
    struct server s;
    memory_export_start(&dm, &s, "queues=2,lost-writes=report");

    struct vhd_blkdrv *d = drv_connect(dm.sock, 2);
    struct vhd_blkdrv_queue *q0 = vhd_blkdrv_get_queue(d, 0), *q1 = vhd_blkdrv_get_queue(d, 1);
    uint8_t *b0 = vhd_blkdrv_buf_alloc(q0, 65536), *b1 = vhd_blkdrv_buf_alloc(q1, 4096);
    VHD_CHECK(b0 && b1);
    fill(b0, 0, 65536, 36);
    VHD_CHECK_EQ(sync_write(q0, 0, b0, 65536), 0);
    server_kill(&s);
    server_start(&s);
    int first = sync_flush(q1); /* a new connection: it cannot vouch for queue 0's write */
    VHD_CHECK_EQ(sync_read(q0, 0, b0, 65536), 0); /* queue 0's connection finds itself lost */
    if (first == 0)
        VHD_CHECK_EQ(sync_flush(q1), -EIO);
    else
        VHD_CHECK_EQ(first, -EIO);
    VHD_CHECK_EQ(sync_flush(q1), 0);
    VHD_CHECK_EQ(sync_flush(q0), 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_end();
}
