/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The storage layer's promises against the real daemon: images are locked as
 * QEMU locks them (a second vhostd, qemu-io and qemu-storage-daemon are
 * refused while vhostd writes an image, and the other way round; readers
 * coexist; locking=off), and a write that meets a full file system is held
 * (werror=enospc, the default), not failed, until the file system grows and
 * SIGUSR2 resumes the device: every block then verifies.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "vhostd/blk.h"
#include "vhostd/blk_driver.h"
#include "vhostd/ctx.h"
#include "vhostd/device.h"

#define MAX_DAEMONS 3
#include "daemon_fixture.h"

#define IMG_SIZE (32u << 20) /* the thin image: four times the small file system */
#define FS_SMALL "size=8M"
#define FS_LARGE "size=64M"
#define BS       (16u << 10) /* several pages: a write can stop half-way on a full tmpfs */
#define NBLK     (IMG_SIZE / BS)
#define DEPTH    16u
#define HOLD_MS  1500 /* no completion for this long, with requests out: they are held */
#define WAIT_MS  20000

/* ======================= helpers ======================= */

/*
 * Run argv with stdout and stderr into out (NUL-terminated), bounded by
 * timeout_ms (then killed). Returns the exit status, or -1 (killed, or not run).
 */
static int run_cmd(char *const argv[], char *out, size_t outlen, int timeout_ms)
{
    int pfd[2];
    VHD_CHECK(pipe2(pfd, O_CLOEXEC) == 0);
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        execvp(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    size_t n = 0;
    uint64_t t0 = ms_now();
    for (;;) {
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        int left = timeout_ms - (int)(ms_now() - t0);
        if (left <= 0 || poll(&p, 1, left) <= 0)
            break;
        ssize_t r = read(pfd[0], out + n, outlen - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        if (n == outlen - 1)
            break;
    }
    out[n] = 0;
    close(pfd[0]);
    int status;
    if (ms_now() - t0 >= (uint64_t)timeout_ms) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
    }
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* prog's path from $PATH (daemon_spawn execs a path), or NULL. */
static const char *which(const char *prog)
{
    static char out[2][PATH_MAX];
    static int k;
    char cmd[256];
    char *o = out[k++ & 1];
    snprintf(cmd, sizeof(cmd), "command -v %s", prog);
    char *argv[] = {"sh", "-c", cmd, NULL};
    if (run_cmd(argv, o, PATH_MAX, 5000) != 0 || o[0] != '/')
        return NULL;
    o[strcspn(o, "\n")] = 0;
    return o;
}

/* dm's directory with its socket sock_name and an image of size bytes; tracked. */
static void image_prepare(struct daemon *dm, const char *sock_name, uint64_t size)
{
    daemon_prepare_dir(dm, "vhd-stor-XXXXXX", sock_name);
    daemon_make_image(dm, size);
    track(dm);
}

/* Start vhostd on dm->sock serving img with extra keys (",k=v..." or ""). */
static void vhostd_start(struct daemon *dm, const char *img, const char *extra)
{
    char spec[PATH_MAX * 3];
    snprintf(spec, sizeof(spec), "socket=%s,image=%s%s", dm->sock, img, extra);
    char *argv[] = {(char *)vhostd_path(), "--log-level", "info", "--blk", spec, NULL};
    daemon_spawn(dm, argv);
}

/* vhostd on img that must refuse to start; returns its output. */
static const char *vhostd_refused(const char *dir, const char *img, const char *extra)
{
    static char out[4096];
    char spec[PATH_MAX * 3];
    snprintf(spec, sizeof(spec), "socket=%s/other.sock,image=%s%s", dir, img, extra);
    char *argv[] = {(char *)vhostd_path(), "--blk", spec, NULL};
    int rc = run_cmd(argv, out, sizeof(out), 10000);
    char sock[PATH_MAX];
    snprintf(sock, sizeof(sock), "%s/other.sock", dir);
    unlink(sock); /* left by a vhostd that did start (and was killed) */
    if (rc == 0 || rc == -1)
        fprintf(stderr, "  vhostd %s: status %d: %s\n", spec, rc, out);
    VHD_CHECK(rc > 0);
    return out;
}

static int qemu_io(const char *img, bool ro, const char *cmd, char *out, size_t outlen)
{
    char *rw[] = {"qemu-io", "-f", "raw", "-c", (char *)cmd, (char *)img, NULL};
    char *rd[] = {"qemu-io", "-r", "-f", "raw", "-c", (char *)cmd, (char *)img, NULL};
    return run_cmd(ro ? rd : rw, out, outlen, 20000);
}

/* qemu-storage-daemon exporting img writable over vhost-user on dm->sock (fixture daemon). */
static char *const *qsd_argv(const char *img, const char *sock)
{
    static char bd[PATH_MAX + 64], ex[PATH_MAX + 128];
    static char *argv[8];
    snprintf(bd, sizeof(bd), "driver=file,node-name=f,filename=%s", img);
    snprintf(ex, sizeof(ex),
             "type=vhost-user-blk,id=e,node-name=f,addr.type=unix,addr.path=%s,writable=on", sock);
    argv[0] = (char *)which("qemu-storage-daemon");
    argv[1] = "--blockdev";
    argv[2] = bd;
    argv[3] = "--export";
    argv[4] = ex;
    argv[5] = NULL;
    return argv;
}

static void need_tools(bool qemu)
{
    if (!vhostd_path())
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    if (qemu && (!which("qemu-io") || !which("qemu-storage-daemon")))
        vhd_test_skip("qemu-io / qemu-storage-daemon not installed (qemu-utils, "
                      "qemu-system-common)");
}

/* ======================= locking ======================= */

#define WRITE_LOCK  "Failed to get \"write\" lock"
#define SHARED_LOCK "Failed to get shared \"write\" lock"

/* A second vhostd on an image a vhostd writes is refused, naming the lock. */
VHD_TEST(lock_second_vhostd)
{
    struct daemon a;
    need_tools(false);
    image_prepare(&a, "a.sock", 64u << 20);
    vhostd_start(&a, a.img, "");

    const char *out = vhostd_refused(a.dir, a.img, "");
    VHD_CHECK(strstr(out, WRITE_LOCK) != NULL);
    /* A read-only one too: it does not share write, and a writer has it. */
    out = vhostd_refused(a.dir, a.img, ",ro=on");
    VHD_CHECK(strstr(out, SHARED_LOCK) != NULL);
    /* locking=on behaves the same here. */
    out = vhostd_refused(a.dir, a.img, ",locking=on");
    VHD_CHECK(strstr(out, WRITE_LOCK) != NULL);
    test_done();
}

/* qemu-io (writable) and a writable qemu-storage-daemon export are refused while vhostd serves. */
VHD_TEST(lock_qemu_refused)
{
    struct daemon a, q;
    char out[4096];
    need_tools(true);
    image_prepare(&a, "a.sock", 64u << 20);
    vhostd_start(&a, a.img, "");

    int rc = qemu_io(a.img, false, "write 0 4k", out, sizeof(out));
    VHD_CHECK(rc != 0);
    if (!strstr(out, WRITE_LOCK))
        fprintf(stderr, "  qemu-io said: %s\n", out);
    VHD_CHECK(strstr(out, WRITE_LOCK) != NULL);

    daemon_prepare_dir(&q, "vhd-stor-XXXXXX", "q.sock");
    track(&q);
    rc = run_cmd(qsd_argv(a.img, q.sock), out, sizeof(out), 20000);
    VHD_CHECK(rc > 0);
    if (!strstr(out, WRITE_LOCK))
        fprintf(stderr, "  qemu-storage-daemon said: %s\n", out);
    VHD_CHECK(strstr(out, WRITE_LOCK) != NULL);

    /* The locks were the reason: once vhostd has gone, both work. */
    VHD_CHECK_EQ(daemon_stop(&a), 0);
    rc = qemu_io(a.img, false, "write 0 4k", out, sizeof(out));
    if (rc != 0)
        fprintf(stderr, "  qemu-io said: %s\n", out);
    VHD_CHECK_EQ(rc, 0);
    test_done();
}

/* vhostd refuses an image qemu-storage-daemon exports writable, naming the lock. */
VHD_TEST(lock_qsd_holds_first)
{
    struct daemon q;
    need_tools(true);
    daemon_prepare_dir(&q, "vhd-stor-XXXXXX", "q.sock");
    daemon_make_image(&q, 64u << 20); /* removed with q's files on every exit path */
    const char *img = q.img;
    track(&q);
    daemon_spawn(&q, qsd_argv(img, q.sock)); /* returns once its export socket exists */

    const char *out = vhostd_refused(q.dir, img, "");
    VHD_CHECK(strstr(out, SHARED_LOCK) != NULL);
    out = vhostd_refused(q.dir, img, ",ro=on");
    VHD_CHECK(strstr(out, SHARED_LOCK) != NULL);
    /* locking=off: the operator takes the responsibility. */
    struct daemon b;
    daemon_prepare_dir(&b, "vhd-stor-XXXXXX", "b.sock");
    track(&b);
    vhostd_start(&b, img, ",locking=off");
    VHD_CHECK_EQ(daemon_stop(&b), 0);
    test_done();
}

/* Is byte off of path locked by some process (as QEMU's locks are tested)? */
static bool byte_locked(const char *path, off_t off)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = off, .l_len = 1};
    VHD_CHECK_EQ(fcntl(fd, F_OFD_GETLK, &fl), 0);
    close(fd);
    return fl.l_type != F_UNLCK;
}

/* A QEMU guest disk (virtio-blk on the image, VM not started) holds it: vhostd refuses it. */
VHD_TEST(lock_qemu_guest_holds_first)
{
    struct daemon q;
    need_tools(false);
    const char *qemu = which("qemu-system-x86_64");
    if (!qemu)
        vhd_test_skip("qemu-system-x86_64 not installed");
    image_prepare(&q, "q.sock", 64u << 20);
    char drive[PATH_MAX];
    snprintf(drive, sizeof(drive), "file=%s,format=raw,if=none,id=d0", q.img);
    char *argv[] = {(char *)qemu,
                    "-S",
                    "-display",
                    "none",
                    "-nodefaults",
                    "-monitor",
                    "none",
                    "-serial",
                    "none",
                    "-drive",
                    drive,
                    "-device",
                    "virtio-blk-pci,drive=d0",
                    NULL};
    /* daemon_spawn waits for a socket: QEMU makes none here, so start it by hand. */
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        int fd = open(q.log, O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    q.pid = pid; /* killed and reaped by the fixture */
    uint64_t t0 = ms_now();
    while (!byte_locked(q.img, 201)) { /* "write" not shared: the disk is set up */
        VHD_CHECK(waitpid(pid, NULL, WNOHANG) == 0);
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(20);
    }
    const char *out = vhostd_refused(q.dir, q.img, "");
    VHD_CHECK(strstr(out, WRITE_LOCK) != NULL);
    out = vhostd_refused(q.dir, q.img, ",ro=on");
    VHD_CHECK(strstr(out, SHARED_LOCK) != NULL);
    test_done();
}

/* Readers coexist: two read-only vhostd and qemu-io -r; a writer is still refused. */
VHD_TEST(lock_readers_coexist)
{
    struct daemon a, b;
    char out[4096];
    need_tools(true);
    image_prepare(&a, "a.sock", 64u << 20);
    vhostd_start(&a, a.img, ",ro=on");
    daemon_prepare_dir(&b, "vhd-stor-XXXXXX", "b.sock");
    track(&b);
    vhostd_start(&b, a.img, ",ro=on");

    int rc = qemu_io(a.img, true, "read 0 4k", out, sizeof(out));
    if (rc != 0)
        fprintf(stderr, "  qemu-io -r said: %s\n", out);
    VHD_CHECK_EQ(rc, 0);
    rc = qemu_io(a.img, false, "write 0 4k", out, sizeof(out));
    VHD_CHECK(rc != 0);
    VHD_CHECK(strstr(out, WRITE_LOCK) != NULL);
    const char *o = vhostd_refused(a.dir, a.img, "");
    VHD_CHECK(strstr(o, WRITE_LOCK) != NULL);
    VHD_CHECK_EQ(daemon_stop(&b), 0);
    VHD_CHECK_EQ(daemon_stop(&a), 0);
    test_done();
}

/* locking=off takes no lock: a second writer and qemu-io get in. */
VHD_TEST(lock_off)
{
    struct daemon a, b;
    char out[4096];
    need_tools(true);
    image_prepare(&a, "a.sock", 64u << 20);
    vhostd_start(&a, a.img, ",locking=off");
    int rc = qemu_io(a.img, false, "write 0 4k", out, sizeof(out));
    if (rc != 0)
        fprintf(stderr, "  qemu-io said: %s\n", out);
    VHD_CHECK_EQ(rc, 0);
    daemon_prepare_dir(&b, "vhd-stor-XXXXXX", "b.sock");
    track(&b);
    vhostd_start(&b, a.img, ""); /* a holds nothing */
    VHD_CHECK_EQ(daemon_stop(&b), 0);
    VHD_CHECK_EQ(daemon_stop(&a), 0);
    test_done();
}

/* ======================= a full file system ======================= */

/* Lines of dm's log containing needle. */
static unsigned log_count(const struct daemon *dm, const char *needle)
{
    FILE *f = fopen(dm->log, "r");
    char line[1024];
    unsigned n = 0;
    VHD_CHECK(f);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static char g_mnt[192]; /* the tmpfs, unmounted on every exit path */
static char
    g_loop[64]; /* the loop device of flush_failure_is_sticky, detached on every exit path */

static void mnt_cleanup(void)
{
    if (!g_mnt[0])
        return;
    char img[256];
    snprintf(img, sizeof(img), "%s/thin.img", g_mnt);
    unlink(img);
    umount2(g_mnt, MNT_DETACH); /* lazily: the daemon may still hold the image open */
    rmdir(g_mnt);
    *strrchr(g_mnt, '/') = 0; /* the fixture's dir, which could not go while g_mnt was in it */
    rmdir(g_mnt);
    g_mnt[0] = 0;
}

static void loop_cleanup(void);

/*
 * The end of a passing test that mounted: the harness leaves it with
 * _exit(), past the atexit handlers that clean up after a failure.
 */
static void mnt_done(void)
{
    test_done();
    loop_cleanup();
    mnt_cleanup();
}

static void mnt_alarm(int sig)
{
    loop_cleanup();
    if (g_mnt[0]) {
        umount2(g_mnt, MNT_DETACH); /* async-signal-safe */
        rmdir(g_mnt);
    }
    on_alarm(sig);
}

/* A tmpfs of FS_SMALL at g_mnt with a sparse IMG_SIZE image in it; skips when not root. */
static void mnt_setup(struct daemon *dm, char *img, size_t imglen)
{
    snprintf(g_mnt, sizeof(g_mnt), "%s/fs", dm->dir);
    VHD_CHECK_EQ(mkdir(g_mnt, 0700), 0);
    if (mount("vhd-test", g_mnt, "tmpfs", 0, FS_SMALL) < 0) {
        int e = errno;
        rmdir(g_mnt);
        g_mnt[0] = 0;
        fprintf(stderr, "  mount tmpfs: %s\n", strerror(e));
        vhd_test_skip("cannot mount a tmpfs (needs root)");
    }
    atexit(mnt_cleanup); /* runs before the fixture's kill_daemons: hence the lazy unmount */
    signal(SIGALRM, mnt_alarm);
    snprintf(img, imglen, "%s/thin.img", g_mnt);
    int fd = open(img, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(ftruncate(fd, IMG_SIZE), 0);
    close(fd);
}

/* Block b's content in generation gen: every 8 bytes say (b, gen, position). */
static void fill(void *buf, uint32_t b, uint32_t gen)
{
    uint64_t *w = buf;
    for (uint32_t i = 0; i < BS / 8; i++)
        w[i] = ((uint64_t)b << 40) ^ ((uint64_t)gen << 20) ^ i ^ 0x5a5a000000000000ull;
}

struct slot {
    void *buf;
    uint32_t blk; /* UINT32_MAX: free */
};

#define MAXQ 2

struct writer {
    struct vhd_blkdrv *d;
    struct vhd_blkdrv_queue *q; /* queue 0 */
    uint32_t nq;
    struct vhd_blkdrv_queue *qs[MAXQ];
    struct slot s[MAXQ][DEPTH];
    uint32_t next; /* next block to write (blocks go to the queues in turn) */
    uint32_t done; /* blocks completed */
    uint32_t errors;
    uint64_t last_done_ms;
};

static void writer_connect_nq(struct writer *w, const char *sock, int timeout_ms, uint32_t nq)
{
    struct vhd_blkdrv_opts o = {
        .socket_path = sock, .num_queues = nq, .queue_size = 64, .timeout_ms = timeout_ms};
    char err[256];
    int rc = vhd_blkdrv_connect(&o, &w->d, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  connect: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(w->d), IMG_SIZE);
    w->nq = nq;
    for (uint32_t qi = 0; qi < nq; qi++) {
        w->qs[qi] = vhd_blkdrv_get_queue(w->d, qi);
        for (uint32_t k = 0; k < DEPTH; k++) {
            w->s[qi][k].buf = vhd_blkdrv_buf_alloc(w->qs[qi], BS);
            VHD_CHECK(w->s[qi][k].buf);
            w->s[qi][k].blk = UINT32_MAX;
        }
    }
    w->q = w->qs[0];
    w->last_done_ms = ms_now();
}

static void writer_connect(struct writer *w, const char *sock, int timeout_ms)
{
    writer_connect_nq(w, sock, timeout_ms, 1);
}

static unsigned writer_inflight(const struct writer *w)
{
    unsigned n = 0;
    for (uint32_t qi = 0; qi < w->nq; qi++)
        n += vhd_blkdrv_inflight(w->qs[qi]);
    return n;
}

static void writer_reap(struct writer *w, const struct vhd_blkdrv_completion *c, int n)
{
    for (int i = 0; i < n; i++) {
        struct slot *s = c[i].cookie;
        if (c[i].ret != 0) {
            if (w->errors++ < 3)
                fprintf(stderr, "  write of block %u: %d (status %u)\n", s->blk, c[i].ret,
                        c[i].status);
        }
        s->blk = UINT32_MAX;
        w->done++;
    }
    if (n > 0)
        w->last_done_ms = ms_now();
}

/* Keep DEPTH writes out on each queue; reap for up to wait_ms. Returns completions reaped. */
static int writer_step(struct writer *w, int wait_ms)
{
    struct vhd_blkdrv_completion c[DEPTH];
    for (uint32_t qi = 0; qi < w->nq; qi++) {
        for (uint32_t k = 0; k < DEPTH && w->next < NBLK; k++) {
            struct slot *sl = &w->s[qi][k];
            if (sl->blk != UINT32_MAX)
                continue;
            fill(sl->buf, w->next, 1);
            VHD_CHECK_EQ(
                vhd_blkdrv_submit_write(w->qs[qi], (uint64_t)w->next * BS, sl->buf, BS, sl), 0);
            sl->blk = w->next++;
        }
    }
    if (w->nq == 1) {
        int n = vhd_blkdrv_wait(w->q, c, DEPTH, wait_ms);
        if (n == -ETIMEDOUT || n == 0)
            return 0;
        VHD_CHECK(n > 0);
        writer_reap(w, c, n);
        return n;
    }
    /* Several queues from one thread: poll them in turn. */
    uint64_t t0 = ms_now();
    int total = 0;
    do {
        for (uint32_t qi = 0; qi < w->nq; qi++) {
            int n = vhd_blkdrv_poll(w->qs[qi], c, DEPTH);
            VHD_CHECK(n >= 0);
            writer_reap(w, c, n);
            total += n;
        }
        if (total)
            break;
        sleep_ms(1);
    } while (ms_now() - t0 < (uint64_t)wait_ms);
    return total;
}

/* Read every block back through the device and from the image file; all must be generation 1. */
static void verify_all(struct writer *w, const char *img)
{
    static uint8_t want[BS], got[BS];
    void *buf = w->s[0][0].buf;
    int fd = open(img, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    for (uint32_t b = 0; b < NBLK; b++) {
        fill(want, b, 1);
        VHD_CHECK_EQ(vhd_blkdrv_submit_read(w->q, (uint64_t)b * BS, buf, BS, NULL), 0);
        struct vhd_blkdrv_completion c;
        VHD_CHECK_EQ(vhd_blkdrv_wait(w->q, &c, 1, WAIT_MS), 1);
        VHD_CHECK_EQ(c.ret, 0);
        if (memcmp(buf, want, BS) != 0) {
            fprintf(stderr, "  block %u reads back wrong through the device\n", b);
            VHD_CHECK(!"device read-back");
        }
        VHD_CHECK_EQ(pread(fd, got, BS, (off_t)b * BS), (ssize_t)BS);
        if (memcmp(got, want, BS) != 0) {
            fprintf(stderr, "  block %u is wrong in the image\n", b);
            VHD_CHECK(!"image read-back");
        }
    }
    close(fd);
}

/*
 * werror=enospc (the default): a verifying writer on a thin image larger
 * than its tmpfs is held when the tmpfs fills: no error reaches it, the
 * device logs "paused" once, and the writes wait. The tmpfs grows, SIGUSR2
 * resumes, every write completes without error and every block verifies.
 */
static void enospc_held(uint32_t nq)
{
    struct daemon dm;
    char img[256];
    need_tools(false);
    alarm(120);
    daemon_prepare_dir(&dm, "vhd-stor-XXXXXX", "blk.sock");
    track(&dm);
    mnt_setup(&dm, img, sizeof(img));
    vhostd_start(&dm, img, nq > 1 ? ",queues=2" : "");

    struct writer w = {0};
    writer_connect_nq(&w, dm.sock, 0, nq);
    /* Write until completions stop with requests out: the file system is full. */
    uint64_t t0 = ms_now();
    while (w.next < NBLK) {
        writer_step(&w, 100);
        if (writer_inflight(&w) > 0 && ms_now() - w.last_done_ms > HOLD_MS)
            break;
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
    }
    VHD_CHECK(w.next < NBLK); /* it did not all fit */
    VHD_CHECK_EQ(w.errors, 0);
    VHD_CHECK(writer_inflight(&w) > 0);
    /* Each queue that met the full disk says so once, not per request. */
    unsigned paused = log_count(&dm, "paused: write at sector");
    VHD_CHECK(paused >= 1 && paused <= nq);
    VHD_CHECK(log_count(&dm, "queue 0 paused: write at sector") <= 1);
    VHD_CHECK(log_count(&dm, "queue 1 paused: write at sector") <= 1);
    VHD_CHECK(daemon_log_has(&dm, "No space left on device (werror=enospc)"));
    fprintf(stderr, "  held after %u of %u blocks, %u in flight\n", w.done, NBLK,
            writer_inflight(&w));

    /* Still held: nothing moves without a resume. */
    uint32_t before = w.done;
    writer_step(&w, 300);
    VHD_CHECK_EQ(w.done, before);

    /* More space, then the resume. */
    VHD_CHECK_EQ(mount("vhd-test", g_mnt, "tmpfs", MS_REMOUNT, FS_LARGE), 0);
    VHD_CHECK_EQ(kill(dm.pid, SIGUSR2), 0);
    t0 = ms_now();
    while (w.done < NBLK) {
        writer_step(&w, 100);
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
    }
    VHD_CHECK_EQ(w.errors, 0);
    VHD_CHECK_EQ(log_count(&dm, "resumed: retrying"), paused);
    /* The control thread saw them paused (what vhd_blk_paused_queues reports too). */
    char msg[64];
    snprintf(msg, sizeof(msg), "resume: %u paused queue%s retry", paused, paused == 1 ? "" : "s");
    VHD_CHECK_EQ(log_count(&dm, msg), 1);

    /* A flush, then every block, through the device and in the file. */
    VHD_CHECK_EQ(vhd_blkdrv_submit_flush(w.q, NULL), 0);
    struct vhd_blkdrv_completion c;
    VHD_CHECK_EQ(vhd_blkdrv_wait(w.q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    verify_all(&w, img);
    vhd_blkdrv_disconnect(w.d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    mnt_done();
}

VHD_TEST(enospc_held_then_resumed)
{
    enospc_held(1);
}

/* Two queues on two workers: each pauses on its own, one SIGUSR2 resumes both. */
VHD_TEST(enospc_held_then_resumed_2q)
{
    enospc_held(2);
}

/*
 * werror=report: the same full file system fails the writes with IOERR, and
 * the per-request error lines are rate-limited (not one per failed write).
 */
VHD_TEST(enospc_report_ratelimited)
{
    struct daemon dm;
    char img[256];
    need_tools(false);
    alarm(120);
    daemon_prepare_dir(&dm, "vhd-stor-XXXXXX", "blk.sock");
    track(&dm);
    mnt_setup(&dm, img, sizeof(img));
    vhostd_start(&dm, img, ",werror=report");

    struct writer w = {0};
    writer_connect(&w, dm.sock, 0);
    uint64_t t0 = ms_now();
    while (w.done < NBLK) {
        writer_step(&w, 100);
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
    }
    fprintf(stderr, "  %u of %u writes failed\n", w.errors, NBLK);
    VHD_CHECK(w.errors > 100);
    VHD_CHECK(!daemon_log_has(&dm, "paused"));
    /* Count the per-request lines: one burst per rate-limit window at most. */
    unsigned lines = log_count(&dm, "failed: No space left on device");
    fprintf(stderr, "  %u error lines logged\n", lines);
    VHD_CHECK(lines >= 1);
    VHD_CHECK(lines <= 2 * 10 + 2); /* VHD_LOG_RL_BURST per 5 s window; the run takes < 10 s */
    vhd_blkdrv_disconnect(w.d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    mnt_done();
}

/*
 * The front-end goes away while requests are held: the daemon completes
 * them (IOERR: their guest memory goes with the session) instead of
 * hanging the ring stop, and serves a new session on the grown file system.
 */
VHD_TEST(enospc_disconnect_while_paused)
{
    struct daemon dm;
    char img[256];
    need_tools(false);
    alarm(120);
    daemon_prepare_dir(&dm, "vhd-stor-XXXXXX", "blk.sock");
    track(&dm);
    mnt_setup(&dm, img, sizeof(img));
    vhostd_start(&dm, img, ",werror=stop");

    struct writer w = {0};
    writer_connect(&w, dm.sock, 1000); /* disconnect waits this long for the held requests */
    uint64_t t0 = ms_now();
    while (w.next < NBLK) {
        writer_step(&w, 100);
        if (writer_inflight(&w) > 0 && ms_now() - w.last_done_ms > HOLD_MS)
            break;
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
    }
    VHD_CHECK(daemon_log_has(&dm, "paused"));
    vhd_blkdrv_disconnect(w.d); /* GET_VRING_BASE on a paused queue */
    t0 = ms_now();
    while (!daemon_log_has(&dm, "stopped while paused")) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(20);
    }
    VHD_CHECK(!daemon_log_has(&dm, "broken"));
    /* A new session works (reads do not need space). */
    struct writer w2 = {0};
    writer_connect(&w2, dm.sock, 0);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(w2.q, 0, w2.s[0][0].buf, BS, NULL), 0);
    struct vhd_blkdrv_completion c;
    VHD_CHECK_EQ(vhd_blkdrv_wait(w2.q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    vhd_blkdrv_disconnect(w2.d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    mnt_done();
}

/*
 * rerror=stop, and a short transfer: the image shrinks under a read, which
 * gets half its block and then end-of-file (EIO). The read is held, not
 * failed; once the image has its size (and data) back, a resume retries it
 * whole into the same buffer: the backend gave its iovecs back unchanged.
 */
VHD_TEST(rerror_stop_short_read)
{
    struct daemon dm;
    static uint8_t want[BS];
    const uint32_t b = 7;
    need_tools(false);
    image_prepare(&dm, "blk.sock", IMG_SIZE);
    int fd = open(dm.img, O_RDWR | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    fill(want, b, 1);
    VHD_CHECK_EQ(pwrite(fd, want, BS, (off_t)b * BS), (ssize_t)BS);
    vhostd_start(&dm, dm.img, ",rerror=stop");

    struct writer w = {0};
    writer_connect(&w, dm.sock, 0);
    /* The file now ends half-way through block b. */
    VHD_CHECK_EQ(ftruncate(fd, (off_t)b * BS + BS / 2), 0);
    memset(w.s[0][0].buf, 0xee, BS);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(w.q, (uint64_t)b * BS, w.s[0][0].buf, BS, NULL), 0);
    struct vhd_blkdrv_completion c;
    VHD_CHECK_EQ(vhd_blkdrv_wait(w.q, &c, 1, HOLD_MS), -ETIMEDOUT);
    VHD_CHECK_EQ(log_count(&dm, "queue 0 paused: read at sector 224 failed"), 1);
    VHD_CHECK(daemon_log_has(&dm, "(rerror=stop)"));

    VHD_CHECK_EQ(ftruncate(fd, IMG_SIZE), 0);
    VHD_CHECK_EQ(pwrite(fd, want, BS, (off_t)b * BS), (ssize_t)BS);
    close(fd);
    VHD_CHECK_EQ(kill(dm.pid, SIGUSR2), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(w.q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    VHD_CHECK(memcmp(w.s[0][0].buf, want, BS) == 0);
    vhd_blkdrv_disconnect(w.d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* ======================= a flush that fails ======================= */

/* Detach g_loop (async-signal-safe: the timeout handler calls it too). */
static void loop_cleanup(void)
{
    if (!g_loop[0])
        return;
    int fd = open(g_loop, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        (void)ioctl(fd, LOOP_CLR_FD, 0); /* autoclear: it goes once the daemon has closed it */
        close(fd);
    }
    g_loop[0] = 0;
}

/*
 * A block device whose writeback fails: a loop device over a thin file on a
 * full tmpfs. The guest's writes land in the page cache and succeed; the
 * FLUSH's fdatasync meets the failed writeback and fails (IOERR). Linux
 * then marks those pages clean, so a second fdatasync would succeed with the
 * data gone: vhostd must keep failing every later FLUSH, even once the
 * tmpfs has room again.
 */
VHD_TEST(flush_failure_is_sticky)
{
    struct daemon dm;
    char img[256], out[512];
    need_tools(false);
    if (!which("losetup"))
        vhd_test_skip("losetup not installed");
    alarm(120);
    daemon_prepare_dir(&dm, "vhd-stor-XXXXXX", "blk.sock");
    track(&dm);
    mnt_setup(&dm, img, sizeof(img));
    char *argv[] = {"losetup", "-f", "--show", img, NULL};
    if (run_cmd(argv, out, sizeof(out), 10000) != 0 || strncmp(out, "/dev/loop", 9) != 0) {
        fprintf(stderr, "  losetup: %s\n", out);
        vhd_test_skip("cannot set up a loop device");
    }
    out[strcspn(out, "\n")] = 0;
    snprintf(g_loop, sizeof(g_loop), "%.60s", out);
    atexit(loop_cleanup); /* runs before mnt_cleanup (registered earlier) */
    vhostd_start(&dm, g_loop, ",werror=report");

    struct writer w = {0};
    writer_connect(&w, dm.sock, 0);
    uint64_t t0 = ms_now();
    while (w.done < NBLK) { /* all of them fit in the page cache */
        writer_step(&w, 100);
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
    }
    VHD_CHECK_EQ(w.errors, 0);
    struct vhd_blkdrv_completion c;
    VHD_CHECK_EQ(vhd_blkdrv_submit_flush(w.q, NULL), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(w.q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, -EIO); /* the writeback failed: not durable */
    VHD_CHECK(daemon_log_has(&dm, "flush failed"));

    /* Room again; the lost pages are not coming back, so neither is "durable". */
    VHD_CHECK_EQ(mount("vhd-test", g_mnt, "tmpfs", MS_REMOUNT, FS_LARGE), 0);
    for (int i = 0; i < 2; i++) {
        VHD_CHECK_EQ(vhd_blkdrv_submit_flush(w.q, NULL), 0);
        VHD_CHECK_EQ(vhd_blkdrv_wait(w.q, &c, 1, WAIT_MS), 1);
        VHD_CHECK_EQ(c.ret, -EIO);
    }
    vhd_blkdrv_disconnect(w.d);
    daemon_stop(&dm); /* its closing fdatasync fails too: logged, whatever the status */
    mnt_done();
}

/* ======================= the public API ======================= */

struct api_reader {
    const char *sock;
    uint32_t blk;
    uint8_t *want;
    int ret;       /* the read's result; 1 until it completed */
    bool same;     /* it read want */
    bool finished; /* (atomic) the thread is done */
};

/* The driver side, on its own thread: the test's thread is the context's control thread. */
static void *api_reader_main(void *arg)
{
    struct api_reader *a = arg;
    struct writer w = {0};
    writer_connect(&w, a->sock, 0);
    memset(w.s[0][0].buf, 0xee, BS);
    a->ret = 1;
    if (vhd_blkdrv_submit_read(w.q, (uint64_t)a->blk * BS, w.s[0][0].buf, BS, NULL) == 0) {
        struct vhd_blkdrv_completion c;
        if (vhd_blkdrv_wait(w.q, &c, 1, 3 * WAIT_MS) == 1) {
            a->ret = c.ret;
            a->same = memcmp(w.s[0][0].buf, a->want, BS) == 0;
        }
    }
    vhd_blkdrv_disconnect(w.d);
    __atomic_store_n(&a->finished, true, __ATOMIC_RELEASE);
    return NULL;
}

/*
 * A context (*ctx, the caller's to destroy) serving a blk device named name
 * on dm's image at dm's socket, with rerror "stop", started; the test fails
 * with the library's reason when it cannot.
 */
static struct vhd_device *api_stop_device(const struct daemon *dm, const char *name,
                                          struct vhd_ctx **ctx)
{
    struct vhd_ctx_config cc;
    vhd_ctx_config_init(&cc);
    VHD_CHECK_EQ(vhd_ctx_new(&cc, ctx), 0);
    struct vhd_blk_config c = {
        .dev = {.name = name, .endpoint = {.path = dm->sock}},
        .image = dm->img,
        .rerror = "stop",
    };
    struct vhd_device *dev;
    char err[256];
    int rc = vhd_blk_device_new(*ctx, &c, &dev, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    return dev;
}

/*
 * The library's calls, without the daemon: a blk device made with rerror
 * "stop" through include/vhostd/blk.h shows its paused queue through
 * vhd_blk_device_paused_queues, and vhd_blk_device_resume retries the read.
 */
VHD_TEST(api_paused_and_resume)
{
    struct daemon dm; /* only its dir, image and socket path: no daemon runs */
    static uint8_t want[BS];
    const uint32_t b = 3;
    image_prepare(&dm, "blk.sock", IMG_SIZE);
    int fd = open(dm.img, O_RDWR | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    fill(want, b, 1);
    VHD_CHECK_EQ(pwrite(fd, want, BS, (off_t)b * BS), (ssize_t)BS);

    struct vhd_ctx *ctx;
    struct vhd_device *dev = api_stop_device(&dm, "api0", &ctx);
    VHD_CHECK_EQ(vhd_blk_device_paused_queues(dev), 0);
    VHD_CHECK_EQ(vhd_blk_device_resume(dev), 0); /* nothing paused: a no-op */

    VHD_CHECK_EQ(ftruncate(fd, (off_t)b * BS + BS / 2), 0); /* the read will meet EOF */
    struct api_reader a = {.sock = dm.sock, .blk = b, .want = want};
    pthread_t th;
    VHD_CHECK_EQ(pthread_create(&th, NULL, api_reader_main, &a), 0);
    uint64_t t0 = ms_now();
    while (vhd_blk_device_paused_queues(dev) == 0) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        VHD_CHECK(vhd_ctx_dispatch(ctx, 10) >= 0);
    }
    VHD_CHECK(!__atomic_load_n(&a.finished, __ATOMIC_ACQUIRE)); /* held, not failed */
    VHD_CHECK_EQ(ftruncate(fd, IMG_SIZE), 0);
    VHD_CHECK_EQ(pwrite(fd, want, BS, (off_t)b * BS), (ssize_t)BS);
    close(fd);
    VHD_CHECK_EQ(vhd_blk_device_resume(dev), 1);
    t0 = ms_now();
    while (!__atomic_load_n(&a.finished, __ATOMIC_ACQUIRE)) {
        VHD_CHECK(ms_now() - t0 < 3 * WAIT_MS);
        VHD_CHECK(vhd_ctx_dispatch(ctx, 10) >= 0);
    }
    VHD_CHECK_EQ(pthread_join(th, NULL), 0);
    VHD_CHECK_EQ(a.ret, 0);
    VHD_CHECK(a.same);
    VHD_CHECK_EQ(vhd_blk_device_paused_queues(dev), 0);
    vhd_ctx_destroy(ctx);
    test_done();
}

/*
 * A read held by rerror=stop past the end of a device that then shrinks:
 * its retry after the resume fails with IOERR (it is past the capacity now)
 * instead of reading beyond the new end; the resize does not wait for the
 * held request (it would wait for a resume that comes after it).
 */
VHD_TEST(api_shrink_while_held)
{
    struct daemon dm; /* only its dir, image and socket path: no daemon runs */
    static uint8_t want[BS];
    const uint32_t b = NBLK - 2; /* past the new end (half the image) */
    image_prepare(&dm, "blk.sock", IMG_SIZE);
    int fd = open(dm.img, O_RDWR | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    fill(want, b, 1);

    struct vhd_ctx *ctx;
    struct vhd_device *dev = api_stop_device(&dm, "api1", &ctx);

    VHD_CHECK_EQ(ftruncate(fd, (off_t)b * BS + BS / 2), 0); /* the read will meet EOF */
    struct api_reader a = {.sock = dm.sock, .blk = b, .want = want};
    pthread_t th;
    VHD_CHECK_EQ(pthread_create(&th, NULL, api_reader_main, &a), 0);
    uint64_t t0 = ms_now();
    while (vhd_blk_device_paused_queues(dev) == 0) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        VHD_CHECK(vhd_ctx_dispatch(ctx, 10) >= 0);
    }
    char err[256];
    t0 = ms_now();
    int rc = vhd_blk_device_resize(dev, IMG_SIZE / 2, true, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  resize: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK(ms_now() - t0 < 1000); /* not waiting for the held read */
    /* The data is back where the read wants it: only the capacity stops it now. */
    VHD_CHECK_EQ(ftruncate(fd, IMG_SIZE), 0);
    VHD_CHECK_EQ(pwrite(fd, want, BS, (off_t)b * BS), (ssize_t)BS);
    close(fd);
    VHD_CHECK_EQ(vhd_blk_device_resume(dev), 1);
    t0 = ms_now();
    while (!__atomic_load_n(&a.finished, __ATOMIC_ACQUIRE)) {
        VHD_CHECK(ms_now() - t0 < 3 * WAIT_MS);
        VHD_CHECK(vhd_ctx_dispatch(ctx, 10) >= 0);
    }
    VHD_CHECK_EQ(pthread_join(th, NULL), 0);
    VHD_CHECK_EQ(a.ret, -EIO);
    VHD_CHECK(!a.same);
    VHD_CHECK_EQ(vhd_blk_device_paused_queues(dev), 0);
    vhd_ctx_destroy(ctx);
    test_done();
}

/* ======================= shrinking under a request in flight ======================= */

/*
 * This program's own copy of src/dev/blk.c has its race points on (race.h):
 * the hook holds the next request that reaches "blk_submit" (admitted,
 * counted in its size epoch, not yet given to the backend) until released.
 */
void (*vhd_race_hook)(const char *point);
enum { HOLD_IDLE, HOLD_ARMED, HOLD_HOLDING, HOLD_RELEASED };
static int hold_state;

static void hold_hook(const char *point)
{
    int armed = HOLD_ARMED;
    if (strcmp(point, "blk_submit") ||
        !__atomic_compare_exchange_n(&hold_state, &armed, HOLD_HOLDING, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return;
    uint64_t t0 = ms_now();
    while (__atomic_load_n(&hold_state, __ATOMIC_ACQUIRE) == HOLD_HOLDING &&
           ms_now() - t0 < 3 * WAIT_MS)
        usleep(1000);
}

struct api_writer {
    const char *sock;
    uint32_t blk;
    int ret;       /* the write's result; 1 until it completed */
    bool finished; /* (atomic) the thread is done */
};

static void *api_writer_main(void *arg)
{
    struct api_writer *a = arg;
    struct writer w = {0};
    writer_connect(&w, a->sock, 0);
    fill(w.s[0][0].buf, a->blk, 7);
    a->ret = 1;
    if (vhd_blkdrv_submit_write(w.q, (uint64_t)a->blk * BS, w.s[0][0].buf, BS, NULL) == 0) {
        struct vhd_blkdrv_completion c;
        if (vhd_blkdrv_wait(w.q, &c, 1, 3 * WAIT_MS) == 1)
            a->ret = c.ret;
    }
    vhd_blkdrv_disconnect(w.d);
    __atomic_store_n(&a->finished, true, __ATOMIC_RELEASE);
    return NULL;
}

/* A device on dm's image, started on ctx, with one write of block b held in flight. */
static struct vhd_device *held_write_start(struct daemon *dm, struct vhd_ctx **ctx,
                                           struct api_writer *a, pthread_t *th, uint32_t b)
{
    struct vhd_ctx_config cc;
    vhd_ctx_config_init(&cc);
    VHD_CHECK_EQ(vhd_ctx_new(&cc, ctx), 0);
    struct vhd_blk_config c = {.dev = {.name = "hold", .endpoint = {.path = dm->sock}},
                               .image = dm->img};
    struct vhd_device *dev;
    char err[256];
    VHD_CHECK_EQ(vhd_blk_device_new(*ctx, &c, &dev, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    vhd_race_hook = hold_hook;
    __atomic_store_n(&hold_state, HOLD_ARMED, __ATOMIC_RELEASE);
    *a = (struct api_writer){.sock = dm->sock, .blk = b};
    VHD_CHECK_EQ(pthread_create(th, NULL, api_writer_main, a), 0);
    uint64_t t0 = ms_now();
    while (__atomic_load_n(&hold_state, __ATOMIC_ACQUIRE) != HOLD_HOLDING) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        VHD_CHECK(vhd_ctx_dispatch(*ctx, 10) >= 0);
    }
    return dev;
}

static void held_write_finish(struct vhd_ctx *ctx, struct api_writer *a, pthread_t th)
{
    __atomic_store_n(&hold_state, HOLD_RELEASED, __ATOMIC_RELEASE);
    uint64_t t0 = ms_now();
    while (!__atomic_load_n(&a->finished, __ATOMIC_ACQUIRE)) {
        VHD_CHECK(ms_now() - t0 < 3 * WAIT_MS);
        VHD_CHECK(vhd_ctx_dispatch(ctx, 10) >= 0);
    }
    VHD_CHECK_EQ(pthread_join(th, NULL), 0);
    vhd_race_hook = NULL;
    __atomic_store_n(&hold_state, HOLD_IDLE, __ATOMIC_RELEASE);
}

static off_t file_size(const char *path)
{
    struct stat st;
    VHD_CHECK_EQ(stat(path, &st), 0);
    return st.st_size;
}

/*
 * A write of the last block held in flight: a shrink times out (nothing
 * changes); a second shrink must wait for it too (time out again), never
 * cut the image under it: once released, the image is not longer than a
 * shrink that returned 0 made it.
 */
VHD_TEST(api_shrink_after_timed_out_shrink)
{
    struct daemon dm; /* only its dir, image and socket path: no daemon runs */
    image_prepare(&dm, "blk.sock", IMG_SIZE);
    struct vhd_ctx *ctx;
    struct api_writer a;
    pthread_t th;
    struct vhd_device *dev = held_write_start(&dm, &ctx, &a, &th, NBLK - 1);
    char err[256];
    VHD_CHECK_EQ(vhd_blk_device_resize(dev, IMG_SIZE / 2, true, err, sizeof(err)), -ETIMEDOUT);
    VHD_CHECK_EQ(vhd_blk_device_size(dev), IMG_SIZE);
    int rc = vhd_blk_device_resize(dev, IMG_SIZE / 2, true, err, sizeof(err));
    held_write_finish(ctx, &a, th);
    if (rc == 0) { /* it did not wait: the write landed past the new end */
        fprintf(stderr, "  second shrink: 0; image now %lld bytes\n", (long long)file_size(dm.img));
        VHD_CHECK(file_size(dm.img) <= (off_t)IMG_SIZE / 2);
    }
    VHD_CHECK_EQ(rc, -ETIMEDOUT);
    VHD_CHECK_EQ(a.ret, 0); /* nothing changed under it */
    VHD_CHECK_EQ(file_size(dm.img), (off_t)IMG_SIZE);
    /* Drained: the shrink goes through now. */
    VHD_CHECK_EQ(vhd_blk_device_resize(dev, IMG_SIZE / 2, true, err, sizeof(err)), 0);
    VHD_CHECK_EQ(file_size(dm.img), (off_t)IMG_SIZE / 2);
    vhd_ctx_destroy(ctx);
    test_done();
}

/*
 * A shrink the backend refuses (data past the new end, not forced) is
 * refused before the capacity drops: at once, without waiting for the
 * request in flight (which goes on past the new end).
 */
VHD_TEST(api_refused_shrink_does_not_wait)
{
    struct daemon dm;
    image_prepare(&dm, "blk.sock", IMG_SIZE);
    int fd = open(dm.img, O_WRONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(pwrite(fd, "x", 1, IMG_SIZE - BS), 1); /* data past the new end */
    close(fd);
    struct vhd_ctx *ctx;
    struct api_writer a;
    pthread_t th;
    struct vhd_device *dev = held_write_start(&dm, &ctx, &a, &th, NBLK - 1);
    char err[256] = "";
    uint64_t t0 = ms_now();
    int rc = vhd_blk_device_resize(dev, IMG_SIZE / 2, false, err, sizeof(err));
    uint64_t took = ms_now() - t0;
    held_write_finish(ctx, &a, th);
    if (rc != -EBUSY || took > 500)
        fprintf(stderr, "  refused shrink: %d (%s) after %llu ms\n", rc, err,
                (unsigned long long)took);
    VHD_CHECK_EQ(rc, -EBUSY);
    VHD_CHECK(strstr(err, "holds data past") != NULL);
    VHD_CHECK(took <= 500);
    VHD_CHECK_EQ(a.ret, 0);
    VHD_CHECK_EQ(vhd_blk_device_size(dev), IMG_SIZE);
    vhd_ctx_destroy(ctx);
    test_done();
}

struct resize_result {
    int calls;
    int rc;
};

static void resize_cb(void *opaque, int rc, const char *err)
{
    struct resize_result *r = opaque;
    (void)err;
    r->calls++;
    r->rc = rc;
}

/*
 * vhd_blk_device_resize_async: a shrink that must wait for a write in
 * flight returns at once (-EINPROGRESS) and the control loop goes on; the
 * first times out through the loop (done: -ETIMEDOUT, nothing changed),
 * the second completes through it once the write is released (done: 0, the
 * image cut); a second shrink meanwhile is -EBUSY.
 */
VHD_TEST(api_async_shrink_does_not_block)
{
    struct daemon dm;
    image_prepare(&dm, "blk.sock", IMG_SIZE);
    struct vhd_ctx *ctx;
    struct api_writer a;
    pthread_t th;
    struct vhd_device *dev = held_write_start(&dm, &ctx, &a, &th, 0);
    char err[256] = "";
    struct resize_result res = {0};
    uint64_t t0 = ms_now();
    int rc =
        vhd_blk_device_resize_async(dev, IMG_SIZE / 2, true, resize_cb, &res, err, sizeof(err));
    VHD_CHECK_EQ(rc, -EINPROGRESS);
    VHD_CHECK(ms_now() - t0 < 200);
    VHD_CHECK_EQ(
        vhd_blk_device_resize_async(dev, IMG_SIZE / 4, true, resize_cb, &res, err, sizeof(err)),
        -EBUSY);
    while (res.calls == 0) { /* the loop runs: the shrink's wait is a timer of it */
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        VHD_CHECK(vhd_ctx_dispatch(ctx, 10) >= 0);
    }
    VHD_CHECK_EQ(res.calls, 1);
    VHD_CHECK_EQ(res.rc, -ETIMEDOUT);
    VHD_CHECK_EQ(vhd_blk_device_size(dev), IMG_SIZE);
    VHD_CHECK_EQ(file_size(dm.img), (off_t)IMG_SIZE);

    res = (struct resize_result){0};
    VHD_CHECK_EQ(
        vhd_blk_device_resize_async(dev, IMG_SIZE / 2, true, resize_cb, &res, err, sizeof(err)),
        -EINPROGRESS);
    __atomic_store_n(&hold_state, HOLD_RELEASED, __ATOMIC_RELEASE);
    t0 = ms_now();
    while (res.calls == 0 || !__atomic_load_n(&a.finished, __ATOMIC_ACQUIRE)) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        VHD_CHECK(vhd_ctx_dispatch(ctx, 10) >= 0);
    }
    held_write_finish(ctx, &a, th);
    VHD_CHECK_EQ(res.calls, 1);
    VHD_CHECK_EQ(res.rc, 0);
    VHD_CHECK_EQ(a.ret, 0);
    VHD_CHECK_EQ(vhd_blk_device_size(dev), IMG_SIZE / 2);
    VHD_CHECK_EQ(file_size(dm.img), (off_t)IMG_SIZE / 2);
    /* Growing needs no wait: the outcome at once, no callback. */
    res = (struct resize_result){0};
    VHD_CHECK_EQ(
        vhd_blk_device_resize_async(dev, IMG_SIZE, false, resize_cb, &res, err, sizeof(err)), 0);
    VHD_CHECK_EQ(res.calls, 0);
    VHD_CHECK_EQ(vhd_blk_device_size(dev), IMG_SIZE);
    vhd_ctx_destroy(ctx);
    test_done();
}

static void *release_later(void *arg)
{
    (void)arg;
    sleep_ms(300);
    __atomic_store_n(&hold_state, HOLD_RELEASED, __ATOMIC_RELEASE);
    return NULL;
}

/*
 * A shrink waiting for a write in flight when its device is destroyed: done
 * is called once with -ECANCELED (the old capacity back), before the
 * destruction waits for the write (released a little later).
 */
VHD_TEST(api_async_shrink_cancelled_by_destroy)
{
    struct daemon dm;
    image_prepare(&dm, "blk.sock", IMG_SIZE);
    struct vhd_ctx *ctx;
    struct api_writer a;
    pthread_t th, rel;
    struct vhd_device *dev = held_write_start(&dm, &ctx, &a, &th, 0);
    char err[256] = "";
    struct resize_result res = {0};
    VHD_CHECK_EQ(
        vhd_blk_device_resize_async(dev, IMG_SIZE / 2, true, resize_cb, &res, err, sizeof(err)),
        -EINPROGRESS);
    VHD_CHECK_EQ(pthread_create(&rel, NULL, release_later, NULL), 0);
    vhd_device_destroy(dev);
    VHD_CHECK_EQ(res.calls, 1);
    VHD_CHECK_EQ(res.rc, -ECANCELED);
    VHD_CHECK_EQ(pthread_join(rel, NULL), 0);
    held_write_finish(ctx, &a, th);
    VHD_CHECK_EQ(file_size(dm.img), (off_t)IMG_SIZE); /* nothing cut */
    vhd_ctx_destroy(ctx);
    test_done();
}
