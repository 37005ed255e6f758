/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd-bench's blk run: an fio-like load over libvhostd's userspace
 * virtio-blk driver. Each job is a thread that owns one virtqueue; buffers
 * live in the driver's shared memory (zero copy). A summary (or JSON) with
 * IOPS, MB/s and latency percentiles; optional fio-style verification
 * (stamped blocks checked when read back).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_hist.h"
#include "bench_report.h"
#include "util/clock.h"
#include "vhostd/blk_driver.h"

/* Up to 20 s without any completion while I/O is in flight: the device is stuck. */
#define STALL_MS 20000
/* Verify keeps this many generations per block at most (memory bound). */
#define MAX_VERIFY_BLOCKS (64ull << 20)
#define VERIFY_MAGIC      0x48434e4542444856ull /* "VHDBENCH" */

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
    const struct blk_opts *o;
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
    const struct blk_opts *o = j->o;
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
    const struct blk_opts *o = j->o;
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
    const struct blk_opts *o = j->o;
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
    const struct blk_opts *o = j->o;
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
    const struct blk_opts *o = j->o;

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

/* ======================= the run ======================= */

static unsigned pow2_at_least(unsigned v)
{
    unsigned p = 1;
    while (p < v && p < 32768)
        p <<= 1;
    return p;
}

int bench_blk_main(int argc, char **argv)
{
    struct blk_opts o;
    char err[256];
    int status = 0;

    if (bench_blk_parse_opts(argc, argv, &o) < 0)
        return 2;

    struct vhd_blkdrv_opts d_o = {
        .socket_path = o.socket,
        .num_queues = o.numjobs,
        .packed = o.packed,
        .no_indirect = o.indirect == 0,
        .iommu_page_size = o.iommu_page,
        .iommu_strict = o.iommu_strict,
        .iommu_batch = o.iommu_batch,
        .iommu_exact_perms = o.iommu_exact,
        .iommu_static = o.iommu_static != 0,
        /* iodepth buffers of bs each, page-rounded, plus slack. */
        .pool_size = (uint64_t)o.iodepth * ((o.bs + 4095) & ~4095ull) + (64u << 10),
    };
    if (o.iommu_static > d_o.pool_size) /* --iommu-static=SIZE: that much mapped for good */
        d_o.pool_size = o.iommu_static;
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
    if (!o.json && o.iommu_page)
        printf("vhostd-bench: iommu page=%" PRIu64 " %s%s%s\n", o.iommu_page,
               o.iommu_strict ? "strict" : "lazy", o.iommu_exact ? " exact-perms" : "",
               o.iommu_static ? " static-pool" : "");

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
    struct vhd_blkdrv_iommu_stats is;
    if (!o.json && vhd_blkdrv_iommu_stats(d, &is) == 0)
        printf("iommu  updates %" PRIu64 " invalidates %" PRIu64 " misses %" PRIu64
               " (unmapped %" PRIu64 ") mapped %" PRIu64 "\n",
               is.updates, is.invalidates, is.misses, is.misses_bad, is.mapped);
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
