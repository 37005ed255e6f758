/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Crash test: the back-end is killed with SIGKILL, again and again, under a
 * verifying write workload from the userspace driver, and restarted on the
 * same socket and image; the driver reconnects and resumes its rings with
 * the inflight area (INFLIGHT_SHMFD), so the new back-end resubmits what
 * the dead one had taken. At the end: the workload completed, no request
 * failed, every request completed exactly once, and every acknowledged
 * write is on the device (read back through the driver) and in the image
 * file (after a clean SIGTERM).
 *
 * The workload runs in the test's main thread over every queue (each block
 * of a queue's region has at most one request in flight, so the last
 * acknowledged write of a block is what must be there); a killer thread
 * kills and restarts the daemon after random delays. Each write carries
 * the pattern of (block, generation); reads check the last acknowledged
 * generation. VHD_CRASH_SEED fixes the random choices (printed with the result).
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "vhostd/blk_driver.h"

#define MAX_DAEMONS 1
#include "daemon_fixture.h"

#define NQ       4u   /* queues */
#define DEPTH    16u  /* requests in flight per queue */
#define QBLOCKS  256u /* blocks of a queue's region */
#define NBLOCKS  (NQ * QBLOCKS)
#define BS       4096u
#define IMG_SIZE ((uint64_t)NBLOCKS * BS)
#define KILLS    20u
#define TAIL_OPS 1500u      /* requests after the last restart */
#define MAX_IDS  (1u << 22) /* request ids (a byte each); ~1M are used in a fast run */
/*
 * The whole workload, kills included: seconds normally, but a daemon under
 * TSan on a loaded 2-CPU machine takes seconds to start, twenty times.
 */
#define RUN_MS       150000u
#define STALL_MS     60000u /* no completion for this long with requests in flight: stuck */
#define DRV_TIMEOUT  10000  /* driver connect/exchange bound: a restarting daemon under ASan */
#define MIN_DELAY_MS 20u    /* killer: delay after a restart before the next kill */
#define MAX_DELAY_MS 350u

/* ======================= data ======================= */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

/* Content of block blk after its write of generation gen (gen 0: never written, zeroes). */
static void fill(void *buf, uint32_t blk, uint32_t gen)
{
    uint64_t *w = buf;
    if (gen == 0) {
        memset(buf, 0, BS);
        return;
    }
    w[0] = 0x63726173685f7631ull; /* "crash_v1": marks a written block */
    w[1] = (uint64_t)blk << 32 | gen;
    for (size_t i = 2; i < BS / 8; i++)
        w[i] = mix64((uint64_t)blk << 40 ^ (uint64_t)gen << 12 ^ i) | 1;
}

/* -1 when buf holds (blk, gen), else the first bad byte; *found gets the generation it holds. */
static long check(const void *buf, uint32_t blk, uint32_t gen, uint32_t *found)
{
    static _Thread_local uint64_t want[BS / 8];
    const uint64_t *w = buf;
    fill(want, blk, gen);
    *found = w[0] == 0x63726173685f7631ull ? (uint32_t)w[1] : 0;
    for (size_t i = 0; i < BS / 8; i++)
        if (w[i] != want[i])
            return (long)(i * 8);
    return -1;
}

/* ======================= daemons ======================= */

/* Start (or restart) vhostd on dm's socket and image; returns when it listens. */
static void backend_start(struct daemon *dm)
{
    char spec[PATH_MAX * 3];
    snprintf(spec, sizeof(spec), "socket=%s,image=%s,queues=%u", dm->sock, dm->img, NQ);
    char *argv[] = {(char *)vhostd_path(), "--log-level", "info", "--blk", spec, NULL};
    daemon_spawn(dm, argv);
}

/* SIGKILL, reap, and remove the socket it left (so a restart is waited for). */
static void backend_kill(struct daemon *dm)
{
    kill(dm->pid, SIGKILL);
    waitpid(dm->pid, NULL, 0);
    dm->pid = 0;
    unlink(dm->sock);
}

/* ======================= killer thread ======================= */

struct killer {
    struct daemon *dm;
    unsigned seed;
    unsigned kills;    /* done so far (atomic: read by the workload) */
    bool finished;     /* atomic: the kills are done */
    bool release;      /* atomic: the test is done with the last daemon, the thread may end */
    uint64_t start_ms; /* total time spent restarting */
    /* Sessions the workload has opened (atomic: written by the workload, read here). */
    const uint64_t *sessions;
};

/* Kills that do not wait for the driver to be back: they may land mid-reconnect. */
#define BLIND_KILL_EVERY 4u
/* Bound on waiting for the driver to reconnect to a restarted daemon (ASan, loaded machine). */
#define SESSION_WAIT_MS 20000u

static void *killer_main(void *arg)
{
    struct killer *k = arg;
    uint64_t want = 1; /* the session of the first daemon */
    for (unsigned i = 0; i < KILLS && !__atomic_load_n(&k->release, __ATOMIC_ACQUIRE); i++) {
        /*
         * Most kills wait until the driver runs a session on this daemon, so
         * that they catch requests in flight whatever the machine's speed;
         * every BLIND_KILL_EVERY-th one does not, and may hit a handshake.
         */
        uint64_t t1 = ms_now();
        while (i % BLIND_KILL_EVERY != BLIND_KILL_EVERY - 1 &&
               __atomic_load_n(k->sessions, __ATOMIC_ACQUIRE) < want &&
               ms_now() - t1 < SESSION_WAIT_MS)
            sleep_ms(1);
        sleep_ms(MIN_DELAY_MS + (unsigned)rand_r(&k->seed) % (MAX_DELAY_MS - MIN_DELAY_MS));
        backend_kill(k->dm);
        uint64_t t0 = ms_now();
        backend_start(k->dm);
        k->start_ms += ms_now() - t0;
        __atomic_store_n(&k->kills, i + 1, __ATOMIC_RELEASE);
        want = __atomic_load_n(k->sessions, __ATOMIC_ACQUIRE) + 1;
    }
    __atomic_store_n(&k->finished, true, __ATOMIC_RELEASE);
    /*
     * The daemons die with the thread that forked them (PR_SET_PDEATHSIG
     * follows the thread): stay until the test has stopped the last one.
     */
    uint64_t t0 = ms_now();
    while (!__atomic_load_n(&k->release, __ATOMIC_ACQUIRE) && ms_now() - t0 < 2 * RUN_MS)
        sleep_ms(10);
    return NULL;
}

/* A failing check exits the test: end the killer before the fixture kills the daemons. */
static struct killer *g_killer;
static pthread_t g_killer_thread;

static void stop_killer(void)
{
    if (!g_killer)
        return;
    __atomic_store_n(&g_killer->release, true, __ATOMIC_RELEASE);
    pthread_join(g_killer_thread, NULL);
    g_killer = NULL;
}

/* ======================= workload ======================= */

struct req {
    uint32_t id;
    uint32_t blk;
    uint32_t gen; /* write: generation written; read: generation expected */
    bool write;
    bool busy;
    uint8_t *buf;
};

struct wl {
    struct vhd_blkdrv *d;
    struct vhd_blkdrv_queue *q[NQ];
    struct req r[NQ][DEPTH];
    uint32_t inflight[NQ];
    uint32_t acked[NBLOCKS]; /* generation of the last acknowledged write */
    uint32_t gen[NBLOCKS];   /* last generation submitted */
    bool blk_busy[NBLOCKS];
    uint8_t *done; /* completions per request id */
    uint32_t next_id;
    unsigned seed;
    uint64_t writes, reads, errors, reconnects, tail;
    uint64_t sessions; /* connect + reconnects (atomic: the killer reads it) */
    uint64_t last_progress;
};

/* Submit on queue qi until it is full (or no idle block is found quickly). */
static void submit_some(struct wl *w, uint32_t qi, bool more)
{
    while (more && w->inflight[qi] < DEPTH && w->next_id < MAX_IDS) {
        uint32_t k = 0;
        while (w->r[qi][k].busy)
            k++;
        uint32_t blk = qi * QBLOCKS + (uint32_t)rand_r(&w->seed) % QBLOCKS;
        for (unsigned tries = 0; w->blk_busy[blk] && tries < QBLOCKS; tries++)
            blk = qi * QBLOCKS + (blk + 1) % QBLOCKS;
        if (w->blk_busy[blk])
            return;
        struct req *r = &w->r[qi][k];
        r->write = rand_r(&w->seed) % 4 != 0;
        r->blk = blk;
        r->id = w->next_id;
        int rc;
        if (r->write) {
            r->gen = w->gen[blk] + 1;
            fill(r->buf, blk, r->gen);
            rc = vhd_blkdrv_submit_write(w->q[qi], (uint64_t)blk * BS, r->buf, BS, r);
        } else {
            r->gen = w->acked[blk];
            memset(r->buf, 0xa5, BS);
            rc = vhd_blkdrv_submit_read(w->q[qi], (uint64_t)blk * BS, r->buf, BS, r);
        }
        if (rc == -EAGAIN)
            return;
        if (rc < 0)
            fprintf(stderr, "  queue %u: submit: %s\n", qi, strerror(-rc));
        VHD_CHECK_EQ(rc, 0);
        if (r->write)
            w->gen[blk] = r->gen;
        r->busy = true;
        w->blk_busy[blk] = true;
        w->inflight[qi]++;
        w->next_id++;
        if (w->tail != UINT64_MAX)
            w->tail++;
    }
}

/* Collect queue qi's completions and check each. Returns how many. */
static int reap(struct wl *w, uint32_t qi)
{
    struct vhd_blkdrv_completion c[DEPTH];
    int n = vhd_blkdrv_poll(w->q[qi], c, DEPTH);
    if (n < 0)
        fprintf(stderr, "  queue %u: poll: %s\n", qi, strerror(-n));
    VHD_CHECK(n >= 0);
    for (int i = 0; i < n; i++) {
        struct req *r = c[i].cookie;
        VHD_CHECK(r >= &w->r[qi][0] && r < &w->r[qi][DEPTH]);
        if (!r->busy)
            fprintf(stderr, "  queue %u: completion of an idle request (last id %u)\n", qi, r->id);
        VHD_CHECK(r->busy);
        VHD_CHECK_EQ(++w->done[r->id], 1); /* exactly once */
        if (c[i].ret != 0) {
            if (w->errors++ < 5)
                fprintf(stderr, "  queue %u: %s of block %u (id %u): ret %d status %u\n", qi,
                        r->write ? "write" : "read", r->blk, r->id, c[i].ret, c[i].status);
        } else if (r->write) {
            w->acked[r->blk] = r->gen;
            w->writes++;
        } else {
            uint32_t found;
            long bad = check(r->buf, r->blk, r->gen, &found);
            if (bad >= 0)
                fprintf(stderr,
                        "  read of block %u: byte %ld differs (expected generation %u, "
                        "found %u)\n",
                        r->blk, bad, r->gen, found);
            VHD_CHECK_EQ(bad, -1);
            w->reads++;
        }
        r->busy = false;
        w->blk_busy[r->blk] = false;
        w->inflight[qi]--;
    }
    return n;
}

/* The session died: reconnect (the killer is restarting the back-end). Bounded. */
static void reconnect(struct wl *w)
{
    uint64_t t0 = ms_now();
    for (;;) {
        int rc = vhd_blkdrv_reconnect(w->d);
        if (rc == 0)
            break;
        /* Killed again while we reconnected, or not listening yet: try again. */
        if (ms_now() - t0 > 4 * (uint64_t)DRV_TIMEOUT) {
            fprintf(stderr, "  reconnect: %s\n", vhd_blkdrv_errmsg(w->d));
            VHD_CHECK(!"reconnect");
        }
        sleep_ms(5);
    }
    VHD_CHECK(vhd_blkdrv_get_info(w->d)->inflight);
    w->reconnects++;
    __atomic_store_n(&w->sessions, w->reconnects + 1, __ATOMIC_RELEASE);
}

static unsigned seed_of_env(void)
{
    const char *s = getenv("VHD_CRASH_SEED");
    if (s && *s)
        return (unsigned)strtoul(s, NULL, 0);
    return (unsigned)time(NULL) ^ (unsigned)getpid();
}

/* Requests the daemons resubmitted, from their log lines "resubmitting N requests", -1: none. */
static long log_resubmissions(const struct daemon *dm)
{
    FILE *f = fopen(dm->log, "r");
    char line[512];
    long n = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "resubmit");
        if (!p)
            continue;
        /* "... resubmitting N ..." */
        const char *num = p;
        while (*num && (*num < '0' || *num > '9'))
            num++;
        if (*num)
            n = (n < 0 ? 0 : n) + strtol(num, NULL, 10);
    }
    fclose(f);
    return n;
}

static void crash_workload(bool packed)
{
    struct daemon dm;
    if (!vhostd_path())
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    alarm(RUN_MS / 1000 + 60); /* this test's own bound, above the harness's default */

    daemon_prepare_dir(&dm, "vhd-crash-XXXXXX", "blk.sock");
    daemon_make_image(&dm, IMG_SIZE);
    track(&dm);
    backend_start(&dm);

    unsigned seed = seed_of_env();
    struct wl *w = calloc(1, sizeof(*w));
    VHD_CHECK(w);
    w->done = calloc(MAX_IDS, 1);
    VHD_CHECK(w->done);
    w->seed = seed;
    w->tail = UINT64_MAX;

    struct vhd_blkdrv_opts o = {.socket_path = dm.sock,
                                .num_queues = NQ,
                                .queue_size = 64,
                                .packed = packed,
                                .timeout_ms = DRV_TIMEOUT};
    char err[256];
    int rc = vhd_blkdrv_connect(&o, &w->d, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  connect: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    /* Without inflight tracking a crash loses requests (-ECONNRESET): this test needs it. */
    VHD_CHECK(vhd_blkdrv_get_info(w->d)->inflight);
    for (uint32_t qi = 0; qi < NQ; qi++) {
        w->q[qi] = vhd_blkdrv_get_queue(w->d, qi);
        for (uint32_t k = 0; k < DEPTH; k++) {
            w->r[qi][k].buf = vhd_blkdrv_buf_alloc(w->q[qi], BS);
            VHD_CHECK(w->r[qi][k].buf);
        }
    }

    __atomic_store_n(&w->sessions, 1, __ATOMIC_RELEASE);
    struct killer k = {.dm = &dm, .seed = seed * 31 + 7, .sessions = &w->sessions};
    pthread_t th;
    VHD_CHECK_EQ(pthread_create(&th, NULL, killer_main, &k), 0);
    g_killer = &k;
    g_killer_thread = th;
    atexit(stop_killer); /* runs before the fixture's kill_daemons (registered earlier) */

    uint64_t t0 = ms_now();
    w->last_progress = t0;
    for (;;) {
        bool killer_done = __atomic_load_n(&k.finished, __ATOMIC_ACQUIRE);
        if (killer_done && w->tail == UINT64_MAX)
            w->tail = 0; /* count requests from here on */
        bool more = (w->tail < TAIL_OPS || w->tail == UINT64_MAX) && w->next_id < MAX_IDS;
        uint32_t busy = 0;
        int got = 0;
        for (uint32_t qi = 0; qi < NQ; qi++) {
            submit_some(w, qi, more);
            got += reap(w, qi);
            busy += w->inflight[qi];
        }
        uint64_t now = ms_now();
        if (got)
            w->last_progress = now;
        if (!more && busy == 0 && killer_done)
            break;
        if (now - t0 > RUN_MS || (busy && now - w->last_progress > STALL_MS)) {
            fprintf(stderr, "  stuck: %u requests in flight, %u kills, %llu reconnects, seed %u\n",
                    busy, __atomic_load_n(&k.kills, __ATOMIC_ACQUIRE),
                    (unsigned long long)w->reconnects, seed);
            VHD_CHECK(!"workload finished in time");
        }
        if (got == 0) {
            if (!vhd_blkdrv_session_alive(w->d))
                reconnect(w);
            else
                usleep(200);
        }
    }

    /* Every request completed once, none failed. */
    if (w->errors)
        fprintf(stderr, "  %llu requests failed (seed %u)\n", (unsigned long long)w->errors, seed);
    VHD_CHECK_EQ(w->errors, 0);
    for (uint32_t id = 0; id < w->next_id; id++)
        VHD_CHECK_EQ(w->done[id], 1);
    VHD_CHECK_EQ(k.kills, KILLS);
    VHD_CHECK(w->reconnects >= 1);

    uint64_t carried = 0;
    for (uint32_t qi = 0; qi < NQ; qi++) {
        struct vhd_blkdrv_queue_stats st;
        vhd_blkdrv_queue_stats(w->q[qi], &st);
        carried += st.carried;
    }
    /* Some kill must have caught requests in flight, or the test proved nothing. */
    VHD_CHECK(carried > 0);

    /* Every acknowledged write is on the device ... */
    uint8_t *buf = w->r[0][0].buf;
    for (uint32_t blk = 0; blk < NBLOCKS; blk++) {
        struct vhd_blkdrv_queue *q = w->q[blk / QBLOCKS];
        struct vhd_blkdrv_completion c;
        VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, (uint64_t)blk * BS, buf, BS, NULL), 0);
        VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, DRV_TIMEOUT), 1);
        VHD_CHECK_EQ(c.ret, 0);
        uint32_t found;
        long bad = check(buf, blk, w->acked[blk], &found);
        if (bad >= 0)
            fprintf(stderr, "  device block %u: generation %u expected, %u found\n", blk,
                    w->acked[blk], found);
        VHD_CHECK_EQ(bad, -1);
    }
    vhd_blkdrv_disconnect(w->d);
    long resub = log_resubmissions(&dm);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    stop_killer();

    /* ... and in the image file. */
    int fd = open(dm.img, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    static uint8_t ibuf[BS];
    for (uint32_t blk = 0; blk < NBLOCKS; blk++) {
        VHD_CHECK_EQ(pread(fd, ibuf, BS, (off_t)blk * BS), (ssize_t)BS);
        uint32_t found;
        long bad = check(ibuf, blk, w->acked[blk], &found);
        if (bad >= 0)
            fprintf(stderr, "  image block %u: generation %u expected, %u found\n", blk,
                    w->acked[blk], found);
        VHD_CHECK_EQ(bad, -1);
    }
    close(fd);

    char resub_s[32] = "not reported";
    if (resub >= 0)
        snprintf(resub_s, sizeof(resub_s), "%ld", resub);
    printf("  %s: %u kills survived, %llu reconnects, %llu requests (%llu writes, %llu reads "
           "verified), %llu carried over a crash, resubmitted by the back-end: %s, 0 errors, "
           "seed %u\n",
           packed ? "packed" : "split", k.kills, (unsigned long long)w->reconnects,
           (unsigned long long)w->next_id, (unsigned long long)w->writes,
           (unsigned long long)w->reads, (unsigned long long)carried, resub_s, seed);
    /*
     * Some request the dead daemon had taken came back through the inflight
     * area (vhostd logs "queue N: resubmitting K requests ..."), or the
     * test proved the ring resume alone.
     */
    VHD_CHECK(resub > 0);
    free(w->done);
    free(w);
    test_done();
}

VHD_TEST(crash_split)
{
    crash_workload(false);
}

VHD_TEST(crash_packed)
{
    crash_workload(true);
}
