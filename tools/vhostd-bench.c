/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd-bench: an fio-like load generator for any vhost-user-blk back-end
 * (vhostd, qemu-storage-daemon, ...), built on libvhostd's userspace
 * virtio-blk driver. Each job is a thread that owns one virtqueue; buffers
 * live in the driver's shared memory (zero copy). Live progress once a
 * second on stderr; a summary (or JSON) with IOPS, MB/s and latency
 * percentiles from a log-linear histogram; optional fio-style verification.
 * "vhostd-bench net" measures a vhost-user-net back-end's packet rate through
 * the virtio-net driver (tx, rx and echo modes; Mpps and Gbit/s).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/parse.h"
#include "bench_report.h"
#include "util/clock.h"
#include "vhostd/blk_driver.h"
#include "vhostd/net_driver.h"

/* ======================= options ======================= */

enum rw_mode { RW_READ, RW_WRITE, RW_RANDREAD, RW_RANDWRITE, RW_RANDRW, RW_RW };

static const char *const rw_names[] = {"read", "write", "randread", "randwrite", "randrw", "rw"};

struct opts {
    const char *socket;
    enum rw_mode rw;
    unsigned rwmixread; /* percent of reads in mixed modes */
    uint64_t bs;
    unsigned iodepth;
    unsigned numjobs;
    double runtime;      /* seconds; 0: not time-bound */
    uint64_t number_ios; /* per job; 0: not count-bound */
    uint64_t offset;     /* start of the range */
    uint64_t size;       /* length of the range; 0: to the end of the device */
    bool packed;
    unsigned queue_size; /* 0: default */
    bool interrupt;      /* completion by the call eventfd instead of polling */
    bool verify;
    bool json;
    int indirect; /* -1 auto, 0 off, 1 on */
    uint64_t seed;
};

/* Up to 20 s without any completion while I/O is in flight: the device is stuck. */
#define STALL_MS 20000
/* Verify keeps this many generations per block at most (memory bound). */
#define MAX_VERIFY_BLOCKS (64ull << 20)
#define VERIFY_MAGIC      0x48434e4542444856ull /* "VHDBENCH" */

static void usage(FILE *f)
{
    fputs(
        "usage: vhostd-bench --socket=PATH [options]\n"
        "       vhostd-bench net --socket=PATH [options]   (packet rate; net --help)\n"
        "\n"
        "  --socket=PATH          vhost-user-blk socket of the back-end (required)\n"
        "  --rw=MODE              read | write | randread (default) | randwrite | randrw | rw\n"
        "  --rwmixread=PCT        reads in randrw/rw, percent (default 50)\n"
        "  --bs=SIZE              block size, multiple of 512 (default 4k)\n"
        "  --iodepth=N            requests in flight per job (default 1)\n"
        "  --numjobs=N            threads, each with its own queue (default 1)\n"
        "  --runtime=SECONDS      run for this long\n"
        "  --number_ios=N         I/Os per job (default without --runtime: one pass of the range)\n"
        "  --offset=SIZE          start of the range (default 0)\n"
        "  --size=SIZE            length of the range (default: to the end); split between jobs\n"
        "  --ring=split|packed    ring layout (default split)\n"
        "  --queue-size=N         ring entries (default 256, more when iodepth needs it)\n"
        "  --completion=poll|interrupt  busy-poll the used ring (default) or sleep on the\n"
        "                         call eventfd\n"
        "  --indirect=0|1         indirect descriptors when offered (default 1)\n"
        "  --verify=0|1           stamp written blocks (offset, generation, seed) and check them\n"
        "                         when read; write workloads end with a read-back of every\n"
        "                         written block. With read-only workloads, checks blocks\n"
        "                         written by an earlier --verify=1 run with the same --bs\n"
        "  --verify_seed=N        seed of the stamps (default: from the clock)\n"
        "  --json                 print the results as one JSON object on stdout\n"
        "  --help\n"
        "\n"
        "SIZE accepts k, m, g, t suffixes (powers of 1024).\n",
        f);
}

static int parse_opts(int argc, char **argv, struct opts *o)
{
    enum {
        O_SOCKET = 256,
        O_RW,
        O_MIX,
        O_BS,
        O_DEPTH,
        O_JOBS,
        O_RUNTIME,
        O_NIOS,
        O_OFFSET,
        O_SIZE,
        O_RING,
        O_QSIZE,
        O_COMPL,
        O_VERIFY,
        O_VSEED,
        O_JSON,
        O_INDIRECT,
        O_HELP
    };
    static const struct option lo[] = {
        {"socket", required_argument, 0, O_SOCKET},
        {"rw", required_argument, 0, O_RW},
        {"readwrite", required_argument, 0, O_RW},
        {"rwmixread", required_argument, 0, O_MIX},
        {"bs", required_argument, 0, O_BS},
        {"iodepth", required_argument, 0, O_DEPTH},
        {"numjobs", required_argument, 0, O_JOBS},
        {"runtime", required_argument, 0, O_RUNTIME},
        {"number_ios", required_argument, 0, O_NIOS},
        {"offset", required_argument, 0, O_OFFSET},
        {"size", required_argument, 0, O_SIZE},
        {"ring", required_argument, 0, O_RING},
        {"queue-size", required_argument, 0, O_QSIZE},
        {"queue_size", required_argument, 0, O_QSIZE},
        {"completion", required_argument, 0, O_COMPL},
        {"verify", required_argument, 0, O_VERIFY},
        {"verify_seed", required_argument, 0, O_VSEED},
        {"json", no_argument, 0, O_JSON},
        {"indirect", required_argument, 0, O_INDIRECT},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    uint64_t v;
    int c;

    memset(o, 0, sizeof(*o));
    o->rw = RW_RANDREAD;
    o->rwmixread = 50;
    o->bs = 4096;
    o->iodepth = 1;
    o->numjobs = 1;
    o->indirect = -1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o->seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;

    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case O_SOCKET:
            o->socket = a;
            break;
        case O_RW: {
            size_t i;
            for (i = 0; i < sizeof(rw_names) / sizeof(rw_names[0]); i++)
                if (!strcmp(a, rw_names[i]))
                    break;
            if (!strcmp(a, "readwrite"))
                i = RW_RW;
            if (i == sizeof(rw_names) / sizeof(rw_names[0])) {
                fprintf(stderr, "vhostd-bench: --rw=%s: unknown mode\n", a);
                return -1;
            }
            o->rw = (enum rw_mode)i;
            break;
        }
        case O_MIX:
            if (bench_parse_uint(a, 0, 100, &v))
                goto bad;
            o->rwmixread = (unsigned)v;
            break;
        case O_BS:
            if (vhd_parse_size(a, &o->bs) || o->bs == 0 || o->bs % 512 || o->bs > (64u << 20))
                goto bad;
            break;
        case O_DEPTH:
            if (bench_parse_uint(a, 1, 32768, &v))
                goto bad;
            o->iodepth = (unsigned)v;
            break;
        case O_JOBS:
            if (bench_parse_uint(a, 1, 64, &v))
                goto bad;
            o->numjobs = (unsigned)v;
            break;
        case O_RUNTIME:
            if (bench_parse_runtime(a, &o->runtime))
                goto bad;
            break;
        case O_NIOS:
            if (vhd_parse_size(a, &o->number_ios) || o->number_ios == 0)
                goto bad;
            break;
        case O_OFFSET:
            if (vhd_parse_size(a, &o->offset) || o->offset % 512)
                goto bad;
            break;
        case O_SIZE:
            if (vhd_parse_size(a, &o->size) || o->size == 0)
                goto bad;
            break;
        case O_RING:
            if (bench_parse_ring(a, &o->packed))
                goto bad;
            break;
        case O_QSIZE:
            if (bench_parse_uint(a, 1, 32768, &v))
                goto bad;
            o->queue_size = (unsigned)v;
            break;
        case O_COMPL:
            if (bench_parse_completion(a, &o->interrupt))
                goto bad;
            break;
        case O_VERIFY:
            if (bench_parse_uint(a, 0, 1, &v))
                goto bad;
            o->verify = v;
            break;
        case O_VSEED:
            if (bench_parse_uint(a, 0, UINT64_MAX, &o->seed))
                goto bad;
            break;
        case O_JSON:
            o->json = true;
            break;
        case O_INDIRECT:
            if (bench_parse_uint(a, 0, 1, &v))
                goto bad;
            o->indirect = (int)v;
            break;
        case O_HELP:
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
        continue;
    bad:
        return bench_bad_value("vhostd-bench", lo, c, a);
    }
    return bench_check_rest("vhostd-bench", argc, argv, o->socket);
}

/* ======================= latency histogram ======================= */

/*
 * Log-linear histogram of nanoseconds (the HdrHistogram layout): values
 * below 64 have their own bucket; above, each power of two is split into 32
 * buckets, so a bucket is at most ~3% wide. 1376 buckets reach 2^46 ns
 * (~20 hours); larger values land in the last one. Fixed size: no
 * allocation per I/O.
 */
#define HIST_SUB     32u
#define HIST_BUCKETS 1376u

struct hist {
    uint64_t n[HIST_BUCKETS];
    uint64_t count, sum, min, max;
};

static void hist_init(struct hist *h)
{
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

static inline unsigned hist_index(uint64_t v)
{
    if (v < 2 * HIST_SUB)
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned k = msb - 5; /* v >> k lands in [32, 64) */
    unsigned idx = HIST_SUB * k + (unsigned)(v >> k);
    return idx < HIST_BUCKETS ? idx : HIST_BUCKETS - 1;
}

/* Middle of bucket idx. */
static uint64_t hist_value(unsigned idx)
{
    if (idx < 2 * HIST_SUB)
        return idx;
    unsigned k = idx / HIST_SUB - 1;
    uint64_t sub = idx - HIST_SUB * k;
    return (sub << k) + ((1ull << k) - 1) / 2;
}

static inline void hist_add(struct hist *h, uint64_t v)
{
    h->n[hist_index(v)]++;
    h->count++;
    h->sum += v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

static void hist_merge(struct hist *dst, const struct hist *src)
{
    for (unsigned i = 0; i < HIST_BUCKETS; i++)
        dst->n[i] += src->n[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
}

/* The value below which a fraction p of the samples fall, clamped to [min, max]. */
static uint64_t hist_pct(const struct hist *h, double p)
{
    if (!h->count)
        return 0;
    uint64_t rank = (uint64_t)(p * (double)h->count + 0.5), seen = 0;
    if (rank < 1)
        rank = 1;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->n[i];
        if (seen >= rank) {
            uint64_t v = hist_value(i);
            return v < h->min ? h->min : v > h->max ? h->max : v;
        }
    }
    return h->max;
}

/* ======================= jobs ======================= */

struct io {
    void *buf;
    uint64_t off;
    uint64_t block; /* index in the job's range */
    uint64_t t0;    /* submit time, ns */
    uint64_t gen;   /* write: the generation stamped; read: the one expected (0: unknown) */
    bool write;
    struct io *next_free;
};

enum phase { PHASE_MAIN, PHASE_VERIFY };

struct job {
    /* read by the reporter: live.done counts main-phase I/Os; live.t_start, t_end span the main
       phase */
    struct bench_live live;
    char pad0[64];

    unsigned index;
    const struct opts *o;
    struct vhd_blkdrv_queue *q;
    uint64_t start, len, nblocks; /* range, bytes and blocks */
    uint64_t rng;
    uint64_t seq_next; /* next block of sequential modes */
    struct io *ios;
    struct io *free_io;
    uint64_t *gen; /* verify: last generation written per block (0: never) */
    uint8_t *busy; /* verify: a request on this block is in flight */
    uint64_t next_gen;

    /* results */
    struct hist hist;
    uint64_t reads, writes;
    uint64_t verify_checked, verify_failed;
    struct vhd_blkdrv_queue_stats qstats; /* after the main phase */
    int error;                            /* first I/O error (-errno) */
    char errmsg[256];
} __attribute__((aligned(64)));

/* xorshift64*: fast, good enough for offsets and fill patterns. */
static inline uint64_t rnd(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x ? x : 1;
}

/* ---- verify stamps ---- */

struct stamp {
    uint64_t magic;
    uint64_t offset; /* device byte offset of the block */
    uint64_t gen;
    uint64_t seed;
    uint64_t bs;
};

static void stamp_fill(void *buf, uint64_t bs, uint64_t off, uint64_t gen, uint64_t seed)
{
    struct stamp *s = buf;
    s->magic = VERIFY_MAGIC;
    s->offset = off;
    s->gen = gen;
    s->seed = seed;
    s->bs = bs;
    uint64_t st = mix64(seed ^ mix64(off) ^ (gen * 0x9e3779b97f4a7c15ull));
    uint64_t *w = (uint64_t *)buf;
    for (uint64_t i = sizeof(*s) / 8; i < bs / 8; i++)
        w[i] = rnd(&st);
}

/*
 * Check a block read at off. expect_gen 0: any generation stamped by a
 * verify run with this bs. Returns NULL or what is wrong.
 */
static const char *stamp_check(const void *buf, uint64_t bs, uint64_t off, uint64_t expect_gen,
                               uint64_t seed, bool any_seed, char *why, size_t whylen)
{
    const struct stamp *s = buf;
    if (s->magic != VERIFY_MAGIC) {
        snprintf(why, whylen, "no verify header (magic 0x%016" PRIx64 ")", s->magic);
        return why;
    }
    if (s->offset != off) {
        snprintf(why, whylen, "block stamped for offset %" PRIu64, s->offset);
        return why;
    }
    if (s->bs != bs) {
        snprintf(why, whylen, "block stamped with bs %" PRIu64, s->bs);
        return why;
    }
    if (!any_seed && s->seed != seed) {
        snprintf(why, whylen, "seed 0x%" PRIx64 " (expected 0x%" PRIx64 ")", s->seed, seed);
        return why;
    }
    if (expect_gen && s->gen != expect_gen) {
        snprintf(why, whylen, "generation %" PRIu64 " (expected %" PRIu64 ": stale data)", s->gen,
                 expect_gen);
        return why;
    }
    uint64_t st = mix64(s->seed ^ mix64(off) ^ (s->gen * 0x9e3779b97f4a7c15ull));
    const uint64_t *w = (const uint64_t *)buf;
    for (uint64_t i = sizeof(*s) / 8; i < bs / 8; i++) {
        if (w[i] != rnd(&st)) {
            snprintf(why, whylen, "data mismatch at byte %" PRIu64 " of the block", i * 8);
            return why;
        }
    }
    return NULL;
}

static bool has_writes(enum rw_mode m)
{
    return m == RW_WRITE || m == RW_RANDWRITE || m == RW_RANDRW || m == RW_RW;
}

static bool is_random(enum rw_mode m)
{
    return m == RW_RANDREAD || m == RW_RANDWRITE || m == RW_RANDRW;
}

static void job_error(struct job *j, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void job_error(struct job *j, int err, const char *fmt, ...)
{
    if (j->error)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(j->errmsg, sizeof(j->errmsg), fmt, ap);
    va_end(ap);
    j->error = err ? err : -EIO;
}

/*
 * Choose the next I/O of the main phase: block and direction. Returns false
 * when none can be chosen now (verify: every candidate block is busy).
 */
static bool pick_main(struct job *j, struct io *io)
{
    const struct opts *o = j->o;
    bool write;
    switch (o->rw) {
    case RW_READ:
    case RW_RANDREAD:
        write = false;
        break;
    case RW_WRITE:
    case RW_RANDWRITE:
        write = true;
        break;
    default:
        write = (rnd(&j->rng) % 100) >= o->rwmixread;
        break;
    }
    uint64_t b = 0;
    for (int tries = 0; tries < 16; tries++) {
        if (is_random(o->rw)) {
            b = rnd(&j->rng) % j->nblocks;
        } else {
            b = j->seq_next;
            j->seq_next = (j->seq_next + 1) % j->nblocks;
        }
        if (!j->busy || !j->busy[b])
            goto found;
    }
    return false;
found:
    io->block = b;
    io->off = j->start + b * o->bs;
    io->write = write;
    return true;
}

static int submit_io(struct job *j, struct io *io)
{
    const struct opts *o = j->o;
    if (io->write) {
        if (o->verify) {
            io->gen = ++j->next_gen;
            stamp_fill(io->buf, o->bs, io->off, io->gen, o->seed);
        }
        return vhd_blkdrv_submit_write(j->q, io->off, io->buf, o->bs, io);
    }
    io->gen = j->gen ? j->gen[io->block] : 0;
    return vhd_blkdrv_submit_read(j->q, io->off, io->buf, o->bs, io);
}

/* Account one completion; verify a read. */
static void complete_io(struct job *j, struct io *io, const struct vhd_blkdrv_completion *c,
                        uint64_t t, enum phase ph)
{
    const struct opts *o = j->o;
    if (j->busy)
        j->busy[io->block] = 0;
    if (c->ret < 0) {
        job_error(j, c->ret,
                  "job %u: %s of %" PRIu64 " bytes at offset %" PRIu64
                  " failed: %s (virtio-blk status %u)",
                  j->index, io->write ? "write" : "read", o->bs, io->off, strerror(-c->ret),
                  c->status);
        return;
    }
    if (ph == PHASE_MAIN) {
        hist_add(&j->hist, t - io->t0);
        if (io->write)
            j->writes++;
        else
            j->reads++;
        __atomic_store_n(&j->live.done, j->live.done + 1, __ATOMIC_RELAXED);
    }
    if (!o->verify)
        return;
    if (io->write) {
        j->gen[io->block] = io->gen;
        return;
    }
    /* Mixed workloads: a block this run never wrote has unknown contents. */
    if (j->gen && io->gen == 0 && has_writes(o->rw))
        return;
    char why[160];
    j->verify_checked++;
    if (stamp_check(io->buf, o->bs, io->off, io->gen, o->seed, !has_writes(o->rw), why,
                    sizeof(why))) {
        j->verify_failed++;
        job_error(j, -EILSEQ, "job %u: verify failed at offset %" PRIu64 ": %s", j->index, io->off,
                  why);
    }
}

/*
 * Run one phase: keep iodepth requests in flight until the phase's end
 * (time, count, or for the verify phase every written block read once),
 * then drain. Submissions are batched (plug) so one refill costs one index
 * update and at most one kick.
 */
static void run_phase(struct job *j, enum phase ph, uint64_t deadline, uint64_t limit)
{
    const struct opts *o = j->o;
    struct vhd_blkdrv_completion comp[256];
    unsigned maxc = o->iodepth < 256 ? o->iodepth : 256;
    uint64_t issued = 0, vblock = 0, inflight = 0, last_progress = vhd_now_ns();
    bool done = false;

    while (!done || inflight) {
        uint64_t t = vhd_now_ns();
        if (!done && (bench_stopping() || j->error || (deadline && t >= deadline) ||
                      (limit && issued >= limit)))
            done = true;
        if (!done && j->free_io) {
            vhd_blkdrv_plug(j->q);
            while (j->free_io && !(limit && issued >= limit)) {
                struct io *io = j->free_io;
                if (ph == PHASE_MAIN) {
                    if (!pick_main(j, io))
                        break;
                } else {
                    while (vblock < j->nblocks && j->gen[vblock] == 0)
                        vblock++;
                    if (vblock == j->nblocks) {
                        done = true;
                        break;
                    }
                    io->block = vblock++;
                    io->off = j->start + io->block * o->bs;
                    io->write = false;
                }
                io->t0 = t;
                int rc = submit_io(j, io);
                if (rc == -EAGAIN)
                    break;
                if (rc < 0) {
                    job_error(j, rc, "job %u: submit at offset %" PRIu64 ": %s", j->index, io->off,
                              strerror(-rc));
                    done = true;
                    break;
                }
                if (j->busy)
                    j->busy[io->block] = 1;
                j->free_io = io->next_free;
                inflight++;
                issued++;
            }
            vhd_blkdrv_unplug(j->q);
        }
        if (!inflight)
            continue;
        int n = o->interrupt ? vhd_blkdrv_wait(j->q, comp, maxc, 1000)
                             : vhd_blkdrv_poll(j->q, comp, maxc);
        if (n == -ETIMEDOUT)
            n = 0;
        if (n < 0) {
            job_error(j, n, "job %u: collecting completions: %s", j->index, strerror(-n));
            return;
        }
        if (n == 0) {
            if (vhd_now_ns() - last_progress > (uint64_t)STALL_MS * 1000000ull) {
                job_error(j, -ETIMEDOUT,
                          "job %u: no completion for %d s with %" PRIu64
                          " requests in flight: the back-end is stuck",
                          j->index, STALL_MS / 1000, inflight);
                return;
            }
            continue;
        }
        t = vhd_now_ns();
        last_progress = t;
        for (int i = 0; i < n; i++) {
            struct io *io = comp[i].cookie;
            complete_io(j, io, &comp[i], t, ph);
            io->next_free = j->free_io;
            j->free_io = io;
        }
        inflight -= (uint64_t)n;
        if (ph == PHASE_MAIN)
            j->live.t_end = t;
    }
}

static void *job_main(void *arg)
{
    struct job *j = arg;
    const struct opts *o = j->o;

    j->live.t_start = vhd_now_ns();
    j->live.t_end = j->live.t_start;
    uint64_t deadline = o->runtime > 0 ? j->live.t_start + (uint64_t)(o->runtime * 1e9) : 0;
    uint64_t limit = o->number_ios;
    if (!limit && !deadline)
        limit = j->nblocks; /* fio's default: one pass over the range */
    run_phase(j, PHASE_MAIN, deadline, limit);
    vhd_blkdrv_queue_stats(j->q, &j->qstats);
    if (!j->error && o->verify && has_writes(o->rw) && !bench_stopping())
        run_phase(j, PHASE_VERIFY, 0, 0);
    __atomic_store_n(&j->live.finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* ======================= reporting ======================= */

struct result {
    uint64_t ios, bytes;
    double secs, iops, mbps;
    const struct hist *h;
};

static void print_line(const char *name, const struct result *r)
{
    const struct hist *h = r->h;
    double avg = h->count ? (double)h->sum / (double)h->count : 0;
    printf("%-6s %11.0f %9.1f %10" PRIu64 " | %8.1f %8.1f %8.1f %8.1f %8.1f %9.1f\n", name, r->iops,
           r->mbps, r->ios, h->count ? (double)h->min / 1e3 : 0.0, avg / 1e3,
           (double)hist_pct(h, 0.50) / 1e3, (double)hist_pct(h, 0.99) / 1e3,
           (double)hist_pct(h, 0.999) / 1e3, (double)h->max / 1e3);
}

static void json_result(const struct result *r)
{
    const struct hist *h = r->h;
    double avg = h->count ? (double)h->sum / (double)h->count : 0;
    printf("\"ios\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"runtime_s\": %.6f, \"iops\": %.1f, "
           "\"mbps\": %.3f, \"lat_us\": {\"min\": %.3f, \"avg\": %.3f, \"p50\": %.3f, "
           "\"p99\": %.3f, \"p99_9\": %.3f, \"max\": %.3f}",
           r->ios, r->bytes, r->secs, r->iops, r->mbps, h->count ? (double)h->min / 1e3 : 0.0,
           avg / 1e3, (double)hist_pct(h, 0.50) / 1e3, (double)hist_pct(h, 0.99) / 1e3,
           (double)hist_pct(h, 0.999) / 1e3, (double)h->max / 1e3);
}

/* ======================= net: packet-rate benchmark ======================= */

/*
 * vhostd-bench net: one thread per queue pair of libvhostd's virtio-net
 * driver. tx: send frames as fast as the ring takes them, count TX
 * completions (the back-end's dequeue rate). rx: keep receive buffers
 * posted and count what arrives (a back-end that generates traffic). echo:
 * send and receive, count frames that came back (a loopback back-end's
 * round trips); at most queue-size frames in flight, so the back-end never
 * runs out of receive buffers because of us.
 */

enum net_mode { NET_TX, NET_RX, NET_ECHO };

static const char *const net_mode_names[] = {"tx", "rx", "echo"};

struct net_opts {
    const char *socket;
    enum net_mode mode;
    unsigned size; /* frame bytes, virtio header excluded */
    unsigned pairs;
    double runtime;
    bool packed;
    bool mrg;
    unsigned queue_size;
    unsigned burst;
    bool interrupt;
    bool json;
};

#define NET_MIN_FRAME 14u   /* an Ethernet header */
#define NET_MAX_FRAME 9014u /* a jumbo frame; TX slots are sized to --size */
#define NET_MAX_BURST 256u

static void net_usage(FILE *f)
{
    fputs("usage: vhostd-bench net --socket=PATH [options]\n"
          "\n"
          "  --socket=PATH          vhost-user-net socket of the back-end (required)\n"
          "  --mode=MODE            tx | rx | echo (default echo). tx: count TX completions;\n"
          "                         rx: count received frames (needs a back-end that sends);\n"
          "                         echo: send and count frames that come back (loopback)\n"
          "  --size=N               frame bytes without the 12-byte virtio header (default 64)\n"
          "  --pairs=N              queue pairs, one thread each (default 1)\n"
          "  --runtime=SECONDS      run for this long (default 10)\n"
          "  --ring=split|packed    ring layout (default split)\n"
          "  --mrg=0|1              negotiate VIRTIO_NET_F_MRG_RXBUF (default 0)\n"
          "  --queue-size=N         ring entries (default 256)\n"
          "  --burst=N              frames per tx/rx call (default 32, at most 256)\n"
          "  --completion=poll|interrupt  busy-poll the used rings (default) or sleep on the\n"
          "                         call eventfds when idle\n"
          "  --json                 print the results as one JSON object on stdout\n"
          "  --help\n"
          "\n"
          "Gbit/s counts frame bytes (no virtio header, no Ethernet preamble or gap).\n",
          f);
}

static int net_parse_opts(int argc, char **argv, struct net_opts *o)
{
    enum {
        N_SOCKET = 256,
        N_MODE,
        N_SIZE,
        N_PAIRS,
        N_RUNTIME,
        N_RING,
        N_MRG,
        N_QSIZE,
        N_BURST,
        N_COMPL,
        N_JSON,
        N_HELP
    };
    static const struct option lo[] = {
        {"socket", required_argument, 0, N_SOCKET},
        {"mode", required_argument, 0, N_MODE},
        {"size", required_argument, 0, N_SIZE},
        {"pairs", required_argument, 0, N_PAIRS},
        {"runtime", required_argument, 0, N_RUNTIME},
        {"ring", required_argument, 0, N_RING},
        {"mrg", required_argument, 0, N_MRG},
        {"queue-size", required_argument, 0, N_QSIZE},
        {"queue_size", required_argument, 0, N_QSIZE},
        {"burst", required_argument, 0, N_BURST},
        {"completion", required_argument, 0, N_COMPL},
        {"json", no_argument, 0, N_JSON},
        {"help", no_argument, 0, N_HELP},
        {0, 0, 0, 0},
    };
    uint64_t v;
    int c;

    memset(o, 0, sizeof(*o));
    o->mode = NET_ECHO;
    o->size = 64;
    o->pairs = 1;
    o->runtime = 10;
    o->queue_size = 256;
    o->burst = 32;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case N_SOCKET:
            o->socket = a;
            break;
        case N_MODE: {
            size_t i;
            for (i = 0; i < sizeof(net_mode_names) / sizeof(net_mode_names[0]); i++)
                if (!strcmp(a, net_mode_names[i]))
                    break;
            if (i == sizeof(net_mode_names) / sizeof(net_mode_names[0]))
                goto bad;
            o->mode = (enum net_mode)i;
            break;
        }
        case N_SIZE:
            if (bench_parse_uint(a, NET_MIN_FRAME, NET_MAX_FRAME, &v))
                goto bad;
            o->size = (unsigned)v;
            break;
        case N_PAIRS:
            if (bench_parse_uint(a, 1, VHD_NETDRV_MAX_PAIRS, &v))
                goto bad;
            o->pairs = (unsigned)v;
            break;
        case N_RUNTIME:
            if (bench_parse_runtime(a, &o->runtime))
                goto bad;
            break;
        case N_RING:
            if (bench_parse_ring(a, &o->packed))
                goto bad;
            break;
        case N_MRG:
            if (bench_parse_uint(a, 0, 1, &v))
                goto bad;
            o->mrg = v;
            break;
        case N_QSIZE:
            if (bench_parse_uint(a, 1, 32768, &v))
                goto bad;
            o->queue_size = (unsigned)v;
            break;
        case N_BURST:
            if (bench_parse_uint(a, 1, NET_MAX_BURST, &v))
                goto bad;
            o->burst = (unsigned)v;
            break;
        case N_COMPL:
            if (bench_parse_completion(a, &o->interrupt))
                goto bad;
            break;
        case N_JSON:
            o->json = true;
            break;
        case N_HELP:
        case 'h':
            net_usage(stdout);
            exit(0);
        default:
            net_usage(stderr);
            return -1;
        }
        continue;
    bad:
        return bench_bad_value("vhostd-bench net", lo, c, a);
    }
    return bench_check_rest("vhostd-bench net", argc, argv, o->socket);
}

/*
 * One pair's thread. live.done is the mode's count, read by the progress loop
 * (relaxed atomics): TX completions (tx) or frames received (rx, echo).
 */
struct net_job {
    struct bench_live live;
    const struct net_opts *o;
    struct vhd_netdrv_pair *p;
    unsigned index;
    uint64_t sent; /* frames queued on TX */
    int error;
    struct vhd_netdrv_pair_stats st;
} __attribute__((aligned(64)));

static void net_count(void *arg, const struct vhd_netdrv_rxframe *f)
{
    (void)f;
    (*(uint64_t *)arg)++;
}

static void *net_job_main(void *arg)
{
    struct net_job *j = arg;
    const struct net_opts *o = j->o;
    uint8_t *frame = calloc(1, o->size);
    struct iovec iov[NET_MAX_BURST];

    if (!frame) {
        j->error = -ENOMEM;
        __atomic_store_n(&j->live.finished, 1, __ATOMIC_RELEASE);
        return NULL;
    }
    /* Broadcast destination, locally administered source, IPv4 ethertype; zero payload. */
    memset(frame, 0xff, 6);
    if (o->size >= 14) {
        static const uint8_t src[6] = {0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
        memcpy(frame + 6, src, 6);
        frame[11] = (uint8_t)j->index;
        frame[12] = 0x08;
    }
    for (unsigned k = 0; k < o->burst; k++)
        iov[k] = (struct iovec){frame, o->size};

    uint64_t received = 0, sent = 0, window = o->queue_size;
    uint64_t t0 = vhd_now_ns(), deadline = t0 + (uint64_t)(o->runtime * 1e9);
    j->live.t_start = t0;
    for (uint64_t it = 0;; it++) {
        if ((it & 63) == 0 && (vhd_now_ns() >= deadline || bench_stopping()))
            break;
        bool progress = false;
        if (o->mode != NET_RX) {
            unsigned n = o->burst;
            if (o->mode == NET_ECHO) {
                uint64_t room = window - (sent - received);
                n = room < n ? (unsigned)room : n;
            }
            int rc = n ? vhd_netdrv_tx_burst(j->p, iov, n) : 0;
            if (rc < 0) {
                j->error = rc;
                break;
            }
            sent += (unsigned)rc;
            progress |= rc > 0;
        }
        if (o->mode == NET_TX) {
            int rc = vhd_netdrv_tx_reap(j->p);
            if (rc < 0) {
                j->error = rc;
                break;
            }
            progress |= rc > 0;
            struct vhd_netdrv_pair_stats s;
            vhd_netdrv_pair_stats(j->p, &s);
            __atomic_store_n(&j->live.done, s.tx_done, __ATOMIC_RELAXED);
        } else {
            int rc = vhd_netdrv_rx_burst(j->p, net_count, &received, o->burst);
            if (rc < 0) {
                j->error = rc;
                break;
            }
            progress |= rc > 0;
            __atomic_store_n(&j->live.done, received, __ATOMIC_RELAXED);
        }
        __atomic_store_n(&j->sent, sent, __ATOMIC_RELAXED);
        if (!progress && o->interrupt && vhd_netdrv_wait(j->p, 100) < 0) {
            j->error = -EIO;
            break;
        }
    }
    j->live.t_end = vhd_now_ns();
    vhd_netdrv_pair_stats(j->p, &j->st);
    free(frame);
    __atomic_store_n(&j->live.finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

static int net_main(int argc, char **argv)
{
    struct net_opts o;
    char err[256];
    int status = 0;

    if (net_parse_opts(argc, argv, &o) < 0)
        return 2;
    struct vhd_netdrv_opts d_o = {
        .socket_path = o.socket,
        .num_pairs = o.pairs,
        .queue_size = o.queue_size,
        .packed = o.packed,
        .mrg_rxbuf = o.mrg,
        .max_tx_frame = o.size,
        /* Without merging, each receive buffer must hold a whole frame. */
        .rx_buf_size =
            o.mrg ? 2048
                  : (o.size + VHD_NETDRV_HDR_LEN > 2048 ? o.size + VHD_NETDRV_HDR_LEN : 2048),
    };
    struct vhd_netdrv *d;
    int rc = vhd_netdrv_connect(&d_o, &d, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "vhostd-bench net: %s: %s\n", o.socket, err);
        return 1;
    }
    const struct vhd_netdrv_info *in = vhd_netdrv_get_info(d);
    struct net_job *jobs = aligned_alloc(64, sizeof(struct net_job) * o.pairs);
    if (!jobs) {
        fprintf(stderr, "vhostd-bench net: out of memory\n");
        vhd_netdrv_disconnect(d);
        return 1;
    }
    memset(jobs, 0, sizeof(struct net_job) * o.pairs);
    for (unsigned i = 0; i < o.pairs; i++) {
        jobs[i].o = &o;
        jobs[i].index = i;
        jobs[i].p = vhd_netdrv_get_pair(d, i);
    }
    if (!o.json)
        printf("vhostd-bench net: %s mode=%s size=%u pairs=%u ring=%s mrg_rxbuf=%s queue-size=%u "
               "burst=%u completion=%s event_idx=%s\n",
               o.socket, net_mode_names[o.mode], o.size, o.pairs, in->packed ? "packed" : "split",
               in->mrg_rxbuf ? "on" : "off", in->queue_size, o.burst,
               o.interrupt ? "interrupt" : "poll", in->event_idx ? "on" : "off");

    struct bench_reporter r = {
        .prog = "vhostd-bench net",
        .jobs = jobs,
        .stride = sizeof(*jobs),
        .n = o.pairs,
        .job_main = net_job_main,
        .rate_unit = {"Mpps", "Gbit/s"},
        .rate_width = {8, 8},
        .rate_prec = {3, 3},
        .rate_scale = {1e-6, o.size * 8 / 1e9},
    };
    status = bench_run(&r);
    unsigned started = r.started;

    uint64_t tot_pk = 0, tot_sent = 0;
    for (unsigned i = 0; i < started; i++) {
        tot_pk += jobs[i].live.done;
        tot_sent += jobs[i].sent;
    }
    double secs = bench_span(&r);
    double mpps = secs > 0 ? (double)tot_pk / secs / 1e6 : 0;
    double gbps = mpps * o.size * 8 / 1e3;
    if (o.json) {
        bench_json_open(o.socket);
        printf(", \"mode\": \"%s\", \"size\": %u, \"pairs\": %u, \"ring\": \"%s\", "
               "\"mrg_rxbuf\": %s, \"event_idx\": %s, \"queue_size\": %u, \"burst\": %u, "
               "\"completion\": \"%s\",\n \"pairs_detail\": [",
               net_mode_names[o.mode], o.size, o.pairs, in->packed ? "packed" : "split",
               in->mrg_rxbuf ? "true" : "false", in->event_idx ? "true" : "false", in->queue_size,
               o.burst, o.interrupt ? "interrupt" : "poll");
        for (unsigned i = 0; i < started; i++) {
            const struct net_job *j = &jobs[i];
            double s = (double)(j->live.t_end - j->live.t_start) / 1e9;
            printf("%s\n  {\"pair\": %u, \"packets\": %" PRIu64 ", \"sent\": %" PRIu64
                   ", \"runtime_s\": %.6f, \"mpps\": %.4f, \"tx_done\": %" PRIu64
                   ", \"rx_packets\": %" PRIu64 ", \"rx_errors\": %" PRIu64 ", \"kicks\": %" PRIu64
                   ", \"sleeps\": %" PRIu64 ", \"error\": %d}",
                   i ? "," : "", i, j->live.done, j->sent, s,
                   s > 0 ? (double)j->live.done / s / 1e6 : 0.0, j->st.tx_done, j->st.rx_packets,
                   j->st.rx_errors, j->st.kicks, j->st.sleeps, j->error);
        }
        printf("],\n \"total\": {\"packets\": %" PRIu64 ", \"sent\": %" PRIu64
               ", \"runtime_s\": %.6f, \"mpps\": %.4f, \"gbps\": %.4f}}\n",
               tot_pk, tot_sent, secs, mpps, gbps);
    } else {
        printf("%-6s %12s %12s %9s %9s %12s\n", "pair", "packets", "sent", "Mpps", "Gbit/s",
               "kicks/frame");
        for (unsigned i = 0; i < started; i++) {
            const struct net_job *j = &jobs[i];
            double s = (double)(j->live.t_end - j->live.t_start) / 1e9;
            double m = s > 0 ? (double)j->live.done / s / 1e6 : 0;
            printf("%-6u %12" PRIu64 " %12" PRIu64 " %9.3f %9.3f %12.4f\n", i, j->live.done,
                   j->sent, m, m * o.size * 8 / 1e3,
                   (double)j->st.kicks /
                       (double)(j->sent + j->st.rx_packets ? j->sent + j->st.rx_packets : 1));
        }
        printf("total  %12" PRIu64 " %12" PRIu64 " %9.3f %9.3f   (%s, %.2f s)\n", tot_pk, tot_sent,
               mpps, gbps, o.mode == NET_TX ? "TX completions" : "frames received", secs);
        if (o.mode == NET_RX && tot_pk == 0)
            printf("note: nothing arrived; a loopback back-end only returns what is sent "
                   "(use --mode=echo)\n");
    }
    for (unsigned i = 0; i < started; i++) {
        if (jobs[i].error) {
            fprintf(stderr, "vhostd-bench net: pair %u: %s\n", i, strerror(-jobs[i].error));
            status = 1;
        }
    }
    free(jobs);
    vhd_netdrv_disconnect(d);
    return status;
}

/* ======================= main ======================= */

static unsigned pow2_at_least(unsigned v)
{
    unsigned p = 1;
    while (p < v && p < 32768)
        p <<= 1;
    return p;
}

int main(int argc, char **argv)
{
    struct opts o;
    char err[256];
    int status = 0;

    if (argc > 1 && !strcmp(argv[1], "net"))
        return net_main(argc - 1, argv + 1);
    if (parse_opts(argc, argv, &o) < 0)
        return 2;

    struct vhd_blkdrv_opts d_o = {
        .socket_path = o.socket,
        .num_queues = o.numjobs,
        .packed = o.packed,
        .no_indirect = o.indirect == 0,
        /* iodepth buffers of bs each, page-rounded, plus slack. */
        .pool_size = (uint64_t)o.iodepth * ((o.bs + 4095) & ~4095ull) + (64u << 10),
    };
    d_o.queue_size = o.queue_size;
    if (!d_o.queue_size) {
        unsigned need = o.indirect == 0 ? 3 * o.iodepth : o.iodepth;
        d_o.queue_size = need > 256 ? pow2_at_least(need) : 256;
    }
    struct vhd_blkdrv *d;
    int rc = vhd_blkdrv_connect(&d_o, &d, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "vhostd-bench: %s: %s\n", o.socket, err);
        return 1;
    }
    const struct vhd_blkdrv_info *in = vhd_blkdrv_get_info(d);
    if (o.iodepth > in->max_inflight) {
        fprintf(stderr,
                "vhostd-bench: iodepth %u exceeds the %u requests a queue of %u entries holds%s; "
                "raise --queue-size\n",
                o.iodepth, in->max_inflight, in->queue_size,
                in->indirect ? "" : " without indirect descriptors");
        vhd_blkdrv_disconnect(d);
        return 1;
    }
    uint64_t cap = in->capacity;
    if (o.offset >= cap || (o.size && o.size > cap - o.offset)) {
        fprintf(stderr,
                "vhostd-bench: range offset %" PRIu64 " size %" PRIu64
                " is beyond the device (%" PRIu64 " bytes)\n",
                o.offset, o.size, cap);
        vhd_blkdrv_disconnect(d);
        return 1;
    }
    uint64_t range = o.size ? o.size : cap - o.offset;
    uint64_t per_job = (range / o.numjobs) / o.bs * o.bs;
    if (per_job == 0) {
        fprintf(stderr,
                "vhostd-bench: range of %" PRIu64 " bytes holds no %" PRIu64
                "-byte block per job\n",
                range, o.bs);
        vhd_blkdrv_disconnect(d);
        return 1;
    }
    if (o.verify && has_writes(o.rw) && per_job / o.bs > MAX_VERIFY_BLOCKS) {
        fprintf(stderr,
                "vhostd-bench: --verify keeps state per block: at most %llu blocks per "
                "job (use --size)\n",
                MAX_VERIFY_BLOCKS);
        vhd_blkdrv_disconnect(d);
        return 1;
    }

    struct job *jobs = aligned_alloc(64, sizeof(struct job) * o.numjobs);
    if (!jobs) {
        fprintf(stderr, "vhostd-bench: out of memory\n");
        vhd_blkdrv_disconnect(d);
        return 1;
    }
    memset(jobs, 0, sizeof(struct job) * o.numjobs);
    for (unsigned i = 0; i < o.numjobs; i++) {
        struct job *j = &jobs[i];
        j->index = i;
        j->o = &o;
        j->q = vhd_blkdrv_get_queue(d, i);
        j->start = o.offset + i * per_job;
        j->len = per_job;
        j->nblocks = per_job / o.bs;
        j->rng = mix64(o.seed + 0x1234567ull * (i + 1));
        hist_init(&j->hist);
        j->ios = calloc(o.iodepth, sizeof(*j->ios));
        if (!j->ios)
            goto oom;
        for (unsigned k = 0; k < o.iodepth; k++) {
            j->ios[k].buf = vhd_blkdrv_buf_alloc(j->q, o.bs);
            if (!j->ios[k].buf) {
                fprintf(stderr, "vhostd-bench: job %u: the buffer pool is too small\n", i);
                status = 1;
                goto out;
            }
            memset(j->ios[k].buf, 0, o.bs);
            j->ios[k].next_free = j->free_io;
            j->free_io = &j->ios[k];
        }
        if (o.verify && has_writes(o.rw)) {
            j->gen = calloc(j->nblocks, sizeof(*j->gen));
            j->busy = calloc(j->nblocks, 1);
            if (!j->gen || !j->busy)
                goto oom;
        }
    }

    if (!o.json)
        printf("vhostd-bench: %s rw=%s bs=%" PRIu64 " iodepth=%u numjobs=%u ring=%s%s "
               "queue-size=%u completion=%s event_idx=%s%s\n",
               o.socket, rw_names[o.rw], o.bs, o.iodepth, o.numjobs,
               in->packed ? "packed" : "split", in->indirect ? "+indirect" : "", in->queue_size,
               o.interrupt ? "interrupt" : "poll", in->event_idx ? "on" : "off",
               o.verify ? " verify=1" : "");

    struct bench_reporter rep = {
        .prog = "vhostd-bench",
        .jobs = jobs,
        .stride = sizeof(*jobs),
        .n = o.numjobs,
        .job_main = job_main,
        .rate_unit = {"IOPS", "MB/s"},
        .rate_width = {10, 9},
        .rate_prec = {0, 1},
        .rate_scale = {1, (double)o.bs / 1e6},
    };
    status = bench_run(&rep);
    unsigned started = rep.started;

    /* Results. */
    struct hist *total_h = malloc(sizeof(*total_h));
    struct result *res = calloc(o.numjobs, sizeof(*res));
    if (!total_h || !res) {
        free(total_h);
        free(res);
        goto oom;
    }
    hist_init(total_h);
    struct result tot = {.h = total_h};
    uint64_t vchecked = 0, vfailed = 0;
    for (unsigned i = 0; i < started; i++) {
        struct job *j = &jobs[i];
        struct result *r = &res[i];
        r->ios = j->hist.count;
        r->bytes = r->ios * o.bs;
        r->secs = (double)(j->live.t_end - j->live.t_start) / 1e9;
        r->iops = r->secs > 0 ? (double)r->ios / r->secs : 0;
        r->mbps = r->secs > 0 ? (double)r->bytes / r->secs / 1e6 : 0;
        r->h = &j->hist;
        hist_merge(total_h, &j->hist);
        tot.ios += r->ios;
        tot.bytes += r->bytes;
        vchecked += j->verify_checked;
        vfailed += j->verify_failed;
    }
    tot.secs = bench_span(&rep);
    tot.iops = tot.secs > 0 ? (double)tot.ios / tot.secs : 0;
    tot.mbps = tot.secs > 0 ? (double)tot.bytes / tot.secs / 1e6 : 0;

    if (o.json) {
        bench_json_open(o.socket);
        printf(", \"rw\": \"%s\", \"bs\": %" PRIu64 ", \"iodepth\": %u, "
               "\"numjobs\": %u, \"ring\": \"%s\", \"indirect\": %s, \"event_idx\": %s, "
               "\"queue_size\": %u, \"completion\": \"%s\",\n \"jobs\": [",
               rw_names[o.rw], o.bs, o.iodepth, o.numjobs, in->packed ? "packed" : "split",
               in->indirect ? "true" : "false", in->event_idx ? "true" : "false", in->queue_size,
               o.interrupt ? "interrupt" : "poll");
        for (unsigned i = 0; i < started; i++) {
            printf("%s\n  {\"job\": %u, \"reads\": %" PRIu64 ", \"writes\": %" PRIu64 ", ",
                   i ? "," : "", i, jobs[i].reads, jobs[i].writes);
            json_result(&res[i]);
            printf(", \"kicks\": %" PRIu64 ", \"sleeps\": %" PRIu64 ", \"error\": %d}",
                   jobs[i].qstats.kicks, jobs[i].qstats.sleeps, jobs[i].error);
        }
        printf("],\n \"total\": {");
        json_result(&tot);
        printf("}");
        if (o.verify)
            printf(",\n \"verify\": {\"checked\": %" PRIu64 ", \"failed\": %" PRIu64 "}", vchecked,
                   vfailed);
        printf("}\n");
    } else {
        printf("%-6s %11s %9s %10s | %8s %8s %8s %8s %8s %9s\n", "job", "IOPS", "MB/s", "I/Os",
               "min", "avg", "p50", "p99", "p99.9", "max(us)");
        for (unsigned i = 0; i < started; i++) {
            char name[16];
            snprintf(name, sizeof(name), "%u", i);
            print_line(name, &res[i]);
        }
        if (started > 1)
            print_line("total", &tot);
        for (unsigned i = 0; i < started; i++) {
            const struct vhd_blkdrv_queue_stats *qs = &jobs[i].qstats;
            double ios = res[i].ios ? (double)res[i].ios : 1;
            printf("job %u: %.3f kicks and %.3f sleeps per I/O\n", i, (double)qs->kicks / ios,
                   (double)qs->sleeps / ios);
        }
        if (o.verify)
            printf("verify: %" PRIu64 " blocks checked, %" PRIu64 " failed\n", vchecked, vfailed);
    }
    for (unsigned i = 0; i < started; i++) {
        if (jobs[i].error) {
            fprintf(stderr, "vhostd-bench: error: %s\n", jobs[i].errmsg);
            status = 1;
        }
    }
    if (bench_stopping() && !status)
        fprintf(stderr, "vhostd-bench: interrupted\n");
    free(total_h);
    free(res);
    goto out;

oom:
    fprintf(stderr, "vhostd-bench: out of memory\n");
    status = 1;
out:
    for (unsigned i = 0; i < o.numjobs; i++) {
        free(jobs[i].ios);
        free(jobs[i].gen);
        free(jobs[i].busy);
    }
    free(jobs);
    vhd_blkdrv_disconnect(d);
    return status;
}
