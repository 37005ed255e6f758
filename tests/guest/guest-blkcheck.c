/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * guest-blkcheck: checks a virtio-blk disk served by a vhost-user-blk backend, from inside a
 * real Linux guest ("blk" mode), and checks from the host what the guest left in the image
 * files ("host-prepare" before the boot, "host-verify" after it). The same static binary runs
 * on both sides so the stamp format and the workload plan cannot drift apart.
 *
 * Guest checks on the read-write disk (default /dev/vda), one "CHECK <name>: PASS|FAIL|SKIP"
 * line each:
 *   capacity             /sys/block/vda/size (512-byte sectors) == --sectors, BLKGETSIZE64 agrees
 *   mq-queues            number of blk-mq hardware queues (/sys/block/vda/mq/N) == --queues
 *   serial               /sys/block/vda/serial (VIRTIO_BLK_T_GET_ID) == --serial
 *   logical-block-size   /sys/block/vda/queue/logical_block_size == --lbs
 *   ring-layout          negotiated VIRTIO_F_RING_PACKED (bit 34 of device/features) == --ring
 *   features             --require / --forbid feature names are (not) negotiated
 *   host-pattern-read    the region the host stamped before boot reads back intact
 *   random-write-4k/64k/1m  --threads pthreads, each pinned to a vCPU, do O_DIRECT random
 *                        writes of stamped blocks inside the 1 MiB chunks they own; every block
 *                        is read back and verified at once. Every 512-byte sector carries its
 *                        own offset, the run's seed and the write's generation, so a misplaced,
 *                        stale (older generation), lost (zero) or foreign (other seed) sector is
 *                        told apart from corrupted payload.
 *   final-verify         after all writes, every 4 KiB unit ever written is read again and must
 *                        hold its newest generation (catches writes lost or reordered later)
 *   mq-spread            every hardware queue completed requests: its MSI-X vector
 *                        ("virtioN-req.Q" in /proc/interrupts) fired during the workload
 *   flush                fdatasync()+BLKFLSBUF succeed; with a write-back cache a FLUSH request
 *                        must reach the driver (flush counter in /sys/block/vda/stat)
 *   wce-toggle           if VIRTIO_BLK_F_CONFIG_WCE: switch cache_type to "write back" (config
 *                        space write, VHOST_USER_SET_CONFIG on the backend), flush, restore
 *   discard              BLKDISCARD: if the device offers VIRTIO_BLK_F_DISCARD the ioctl must
 *                        succeed and sectors around the range must be untouched
 *   write-zeroes         BLKZEROOUT: range reads back as zeroes, neighbours untouched
 *   host-pattern-write   writes a manifest + stamped region for host-verify, fdatasync, re-read
 * and on the read-only disk (--ro-dev, e.g. vdb, a backend exported with VIRTIO_BLK_F_RO):
 *   ro-flag, ro-capacity, ro-mq-queues, ro-read, ro-write-rejected, ro-zeroout-rejected,
 *   ro-discard-rejected, ro-data-intact.
 *
 * Decisions (see README.md):
 *   - Discard content: the virtio spec (5.2.6.2, driver requirements) says the driver MUST NOT
 *     assume anything about data read after a discard, and Linux reports
 *     discard_zeroes_data = 0 for every device. So "discard" only requires that the ioctl
 *     succeeds, that reads of the range do not fail and that nothing outside the range changes.
 *     We additionally require each discarded sector to read back either as zeroes or as its
 *     previous content: anything else would be data from elsewhere (a leak), which no sane
 *     backend returns. Zeroes are guaranteed only by WRITE_ZEROES (spec 5.2.6.2 device
 *     requirements: "reads of the specified ranges of sectors MUST return zeroes"), which the
 *     write-zeroes check enforces.
 *   - Read-only disk: Linux 6.1 lets open(O_RDWR) succeed and fails write() with EPERM in
 *     blkdev_write_iter() before any request reaches the device. BLKZEROOUT/BLKDISCARD only
 *     warn in bio_check_ro() and do reach the device, which must then fail them
 *     (VIRTIO_BLK_S_IOERR, spec 5.2.6.2: "MUST NOT write any data"). Any of EROFS, EPERM,
 *     EACCES, EIO, EOPNOTSUPP counts as rejected; the data must be unchanged either way.
 *
 * The workload is a pure function of (seed, threads, ops, work region): host-verify replays it
 * without I/O to know the newest generation of every 4 KiB unit and checks the image file.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- image layout, shared by guest and host ------------------------------------------- */

#define KiB ((uint64_t)1024)
#define MiB ((uint64_t)1024 * 1024)

#define SECTOR   512u      /* stamp granularity: the virtio-blk sector */
#define UNIT     4096u     /* generation-map granularity: smallest write we issue */
#define CHUNK    (1 * MiB) /* work-region ownership granularity: one thread per chunk */
#define H2G_OFF  0ull      /* host-to-guest pattern, written by host-prepare */
#define H2G_LEN  (1 * MiB)
#define MANI_OFF (1 * MiB) /* manifest block written by the guest for host-verify */
#define MANI_LEN 4096u
#define G2H_OFF  (MANI_OFF + MANI_LEN) /* guest-to-host pattern */
#define G2H_LEN  (1 * MiB - MANI_LEN)
#define DZ_OFF   (2 * MiB) /* discard / write-zeroes playground, zero at the end */
#define DZ_LEN   (2 * MiB)
#define WORK_OFF (4 * MiB) /* random-write workload */
#define MIN_DISK (WORK_OFF + CHUNK)

/* Region tags stamped into every sector, so a sector from another region is recognised. */
#define TAG_H2G  0x48324720u /* "H2G " */
#define TAG_G2H  0x47324820u /* "G2H " */
#define TAG_DZ   0x445a2020u /* "DZ  " */
#define TAG_WORK 0x574f524bu /* "WORK" */

#define NCLASS 3
static const uint32_t class_size[NCLASS] = {4096, 64 * 1024, 1024 * 1024};
static const char *const class_name[NCLASS] = {"4k", "64k", "1m"};

/* The header of every stamped 512-byte sector; the rest of the sector is a PRNG stream. */
struct stamp {
    char magic[8];   /* "VHDSTMP1" */
    uint64_t offset; /* absolute byte offset of this sector on the disk */
    uint64_t seed;   /* per-run seed chosen by the host */
    uint32_t gen;    /* generation: which write produced this sector */
    uint32_t tag;    /* region tag */
    uint64_t check;  /* hash of the fields above */
};
_Static_assert(sizeof(struct stamp) == 40, "stamp layout");

/* Written by the guest at MANI_OFF: tells host-verify what workload to replay. */
struct manifest {
    char magic[8]; /* "VHDMAN01" */
    uint64_t seed;
    uint64_t capacity; /* bytes, as seen by the guest */
    uint64_t work_off;
    uint64_t work_len;
    uint32_t threads;
    uint32_t ops[NCLASS];
    uint32_t guest_failures; /* failed checks before the manifest was written */
    uint32_t lbs;
    uint64_t check;
};
_Static_assert(sizeof(struct manifest) == 72, "manifest layout");

static const char STAMP_MAGIC[8] = {'V', 'H', 'D', 'S', 'T', 'M', 'P', '1'};
static const char MANI_MAGIC[8] = {'V', 'H', 'D', 'M', 'A', 'N', '0', '1'};

/* splitmix64 finaliser: a cheap, well-mixed 64-bit hash. */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint64_t stamp_hash(const struct stamp *s)
{
    return mix64(s->offset ^ mix64(s->seed ^ mix64(((uint64_t)s->gen << 32) | s->tag)));
}

/* Fill one 512-byte sector at disk offset `off`. */
static void fill_sector(uint8_t *sec, uint64_t off, uint64_t seed, uint32_t gen, uint32_t tag)
{
    struct stamp s;
    memcpy(s.magic, STAMP_MAGIC, sizeof(s.magic));
    s.offset = off;
    s.seed = seed;
    s.gen = gen;
    s.tag = tag;
    s.check = stamp_hash(&s);
    memcpy(sec, &s, sizeof(s));
    uint64_t x = s.check | 1; /* xorshift64 state must be non-zero */
    for (size_t i = sizeof(s); i < SECTOR; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(sec + i, &x, 8);
    }
}

static void fill_range(uint8_t *buf, uint64_t off, size_t len, uint64_t seed, uint32_t gen,
                       uint32_t tag)
{
    for (size_t i = 0; i < len; i += SECTOR)
        fill_sector(buf + i, off + i, seed, gen, tag);
}

static bool all_zero(const uint8_t *p, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (p[i])
            return false;
    return true;
}

/*
 * Verify one sector against the expected stamp. Returns true if it matches; otherwise writes
 * a classification into why: lost (zeroes), stale (older generation), misplaced (stamp of
 * another offset), foreign (other seed or region) or corrupt (bad header or payload).
 */
static bool verify_sector(const uint8_t *sec, uint64_t off, uint64_t seed, uint32_t gen,
                          uint32_t tag, char *why, size_t whylen)
{
    uint8_t want[SECTOR];
    struct stamp got;

    fill_sector(want, off, seed, gen, tag);
    if (memcmp(sec, want, SECTOR) == 0)
        return true;
    memcpy(&got, sec, sizeof(got));
    if (all_zero(sec, SECTOR)) {
        snprintf(why, whylen, "sector @%" PRIu64 " reads zeroes (write lost?), want gen %" PRIu32,
                 off, gen);
    } else if (memcmp(got.magic, STAMP_MAGIC, 8) != 0 || got.check != stamp_hash(&got)) {
        snprintf(why, whylen, "sector @%" PRIu64 " has no valid stamp (corrupt header)", off);
    } else if (got.seed != seed) {
        snprintf(why, whylen, "sector @%" PRIu64 " is from another run (seed %" PRIu64 ")", off,
                 got.seed);
    } else if (got.offset != off) {
        snprintf(why, whylen, "sector @%" PRIu64 " holds data written for offset %" PRIu64, off,
                 got.offset);
    } else if (got.tag != tag) {
        snprintf(why, whylen, "sector @%" PRIu64 " holds data of region tag 0x%08" PRIx32, off,
                 got.tag);
    } else if (got.gen != gen) {
        snprintf(why, whylen,
                 "sector @%" PRIu64 " is stale: generation %#" PRIx32 ", want %#" PRIx32, off,
                 got.gen, gen);
    } else {
        size_t i = sizeof(got);
        while (i < SECTOR && sec[i] == want[i])
            i++;
        snprintf(why, whylen, "sector @%" PRIu64 " payload corrupt at byte %zu", off, i);
    }
    return false;
}

/* Verify a range; returns the number of bad sectors, first reason in why. */
static size_t verify_range(const uint8_t *buf, uint64_t off, size_t len, uint64_t seed,
                           uint32_t gen, uint32_t tag, char *why, size_t whylen)
{
    size_t bad = 0;
    char tmp[256];
    for (size_t i = 0; i < len; i += SECTOR) {
        if (!verify_sector(buf + i, off + i, seed, gen, tag, tmp, sizeof(tmp))) {
            if (!bad)
                snprintf(why, whylen, "%s", tmp);
            bad++;
        }
    }
    return bad;
}

/* ---- the workload plan, a pure function replayed by host-verify ---------------------- */

struct plan {
    uint64_t seed;
    unsigned threads;
    uint64_t work_off; /* bytes, CHUNK aligned */
    uint64_t work_len; /* bytes, multiple of CHUNK, >= threads chunks */
    unsigned ops[NCLASS];
};

/* Generation of op idx of class c for thread t: unique per write, increasing per thread. */
static uint32_t plan_gen(const struct plan *p, unsigned t, unsigned c, unsigned idx)
{
    uint32_t seq = 1;
    for (unsigned i = 0; i < c; i++)
        seq += p->ops[i];
    return ((uint32_t)(t + 1) << 24) | (seq + idx);
}

/* Offset of op idx of class c for thread t: a random aligned block in a chunk t owns. */
static uint64_t plan_off(const struct plan *p, unsigned t, unsigned c, unsigned idx)
{
    uint64_t nchunks = p->work_len / CHUNK;
    uint64_t owned = (nchunks - t + p->threads - 1) / p->threads; /* chunks t, t+T, ... */
    uint64_t r = mix64(p->seed ^ mix64(((uint64_t)t << 40) ^ ((uint64_t)c << 32) ^ idx));
    uint64_t chunk = t + (r % owned) * p->threads;
    uint64_t slots = CHUNK / class_size[c];
    uint64_t slot = (r >> 32) % slots;
    return p->work_off + chunk * CHUNK + slot * class_size[c];
}

static bool plan_valid(const struct plan *p, char *why, size_t whylen)
{
    if (p->threads < 1 || p->threads > 64) {
        snprintf(why, whylen, "threads must be 1..64");
        return false;
    }
    if (p->work_len % CHUNK || p->work_len / CHUNK < p->threads) {
        snprintf(why, whylen, "work region %" PRIu64 " bytes is smaller than %u MiB chunks",
                 p->work_len, p->threads);
        return false;
    }
    for (unsigned c = 0; c < NCLASS; c++) {
        if (p->ops[c] >= (1u << 22)) {
            snprintf(why, whylen, "too many ops");
            return false;
        }
    }
    return true;
}

/* Replays the whole plan into map[unit] = newest generation (0: never written). */
static void plan_replay(const struct plan *p, uint32_t *map)
{
    for (unsigned c = 0; c < NCLASS; c++) {
        for (unsigned t = 0; t < p->threads; t++) {
            for (unsigned i = 0; i < p->ops[c]; i++) {
                uint64_t off = plan_off(p, t, c, i);
                uint32_t gen = plan_gen(p, t, c, i);
                for (uint64_t u = 0; u < class_size[c] / UNIT; u++)
                    map[(off - p->work_off) / UNIT + u] = gen;
            }
        }
    }
}

/* ---- small utilities ------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *xalloc(size_t len)
{
    void *p = NULL;
    if (posix_memalign(&p, 4096, len)) {
        fprintf(stderr, "blkcheck: out of memory (%zu bytes)\n", len);
        exit(2);
    }
    memset(p, 0, len);
    return p;
}

/* pread/pwrite the whole range: 0 or -errno (-EIO for an unexpected end of device). */
static int full_pread(int fd, void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;
        done += (size_t)n;
    }
    return 0;
}

static int full_pwrite(int fd, const void *buf, size_t len, uint64_t off)
{
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(fd, (const char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return -EIO;
        done += (size_t)n;
    }
    return 0;
}

/* Read a sysfs file into buf with trailing whitespace removed: 0 or -errno. */
static int sysfs_read(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = read(fd, buf, len - 1);
    int err = n < 0 ? -errno : 0;
    close(fd);
    if (err)
        return err;
    buf[n] = '\0';
    while (n > 0 && isspace((unsigned char)buf[n - 1]))
        buf[--n] = '\0';
    return 0;
}

static int sysfs_u64(const char *path, uint64_t *val)
{
    char buf[64];
    int err = sysfs_read(path, buf, sizeof(buf));
    if (err)
        return err;
    char *end;
    errno = 0;
    *val = strtoull(buf, &end, 0);
    return (errno || end == buf) ? -EINVAL : 0;
}

static int sysfs_write(const char *path, const char *val)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n = write(fd, val, strlen(val));
    int err = n < 0 ? -errno : 0;
    close(fd);
    return err;
}

/* Field idx (0-based) of /sys/block/<dev>/stat; 15 = flush requests, 11 = discards. */
static int blk_stat_field(const char *dev, unsigned idx, uint64_t *val)
{
    char path[128], buf[512];
    snprintf(path, sizeof(path), "/sys/block/%s/stat", dev);
    int err = sysfs_read(path, buf, sizeof(buf));
    if (err)
        return err;
    char *p = buf;
    for (unsigned i = 0; i <= idx; i++) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(p, &end, 10);
        if (end == p || errno)
            return -ENOENT; /* field not present in this kernel */
        if (i == idx)
            *val = v;
        p = end;
    }
    return 0;
}

/*
 * blk_stat_field, once the counter has passed old (or after 500 ms): the block
 * layer completes a request's bios (waking a synchronous ioctl or fdatasync)
 * before it accounts the request in /sys/block/<dev>/stat (blk_mq_end_request:
 * update, then account), possibly on the other vCPU, so a read right after
 * the call may miss it.
 */
static int blk_stat_field_after(const char *dev, unsigned idx, uint64_t old, uint64_t *val)
{
    int err = 0;
    for (int i = 0; i < 50; i++) {
        err = blk_stat_field(dev, idx, val);
        if (err || *val > old)
            break;
        usleep(10000);
    }
    return err;
}

static bool errno_is_rejection(int err)
{
    return err == EROFS || err == EPERM || err == EACCES || err == EIO || err == EOPNOTSUPP ||
           err == EBADF;
}

static const char *reject_layer(int err)
{
    switch (err) {
    case EPERM:
    case EROFS:
    case EACCES:
    case EBADF:
        return "guest kernel refused";
    case EIO:
        return "device failed the request";
    case EOPNOTSUPP:
        return "not supported";
    default:
        return "?";
    }
}

/* ---- check bookkeeping ---------------------------------------------------------------- */

enum verdict { PASS, FAIL, SKIP };

static unsigned n_pass, n_fail, n_skip;
static char failed_names[1024];

static void check(const char *name, enum verdict v, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void check(const char *name, enum verdict v, const char *fmt, ...)
{
    static const char *const vname[] = {"PASS", "FAIL", "SKIP"};
    char detail[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    printf("CHECK %s: %s %s\n", name, vname[v], detail);
    fflush(stdout);
    if (v == PASS) {
        n_pass++;
    } else if (v == SKIP) {
        n_skip++;
    } else {
        n_fail++;
        size_t l = strlen(failed_names);
        snprintf(failed_names + l, sizeof(failed_names) - l, "%s%s", l ? "," : "", name);
    }
}

static void info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void info(const char *fmt, ...)
{
    va_list ap;
    printf("INFO ");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    fflush(stdout);
}

/* ---- options -------------------------------------------------------------------------- */

struct opts {
    const char *dev;    /* read-write disk, e.g. "vda" */
    const char *ro_dev; /* read-only disk or NULL */
    uint64_t queues, ro_queues, sectors, ro_sectors, lbs;
    const char *serial, *ro_serial;
    const char *ring;    /* split | packed | any */
    const char *discard; /* yes | no | any */
    const char *require, *forbid;
    const char *result_file;
    bool host_pattern; /* the host stamped H2G before boot */
    struct plan plan;
    uint64_t work_mb;
    /* host modes */
    const char *image;
    bool ro_image;
    bool strict;
};

static void usage(void)
{
    fprintf(stderr,
            "usage: guest-blkcheck blk [--dev vda] [--ro-dev vdb] [--queues N] [--ro-queues N]\n"
            "         [--sectors N] [--ro-sectors N] [--serial S] [--ro-serial S] [--lbs N]\n"
            "         [--ring split|packed|any] [--discard yes|no|any] [--require F1,F2]\n"
            "         [--forbid F1,F2] [--seed N] [--threads N] [--work-mb N] [--ops-4k N]\n"
            "         [--ops-64k N] [--ops-1m N] [--no-host-pattern] [--result-file PATH]\n"
            "       guest-blkcheck host-prepare --image FILE --seed N\n"
            "       guest-blkcheck host-verify --image FILE --seed N [--ro] [--no-strict]\n"
            "         [--no-host-pattern]\n"
            "Numbers 0 (the default) mean 'do not check'.\n");
    exit(2);
}

static uint64_t parse_u64(const char *opt, const char *s)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end) {
        fprintf(stderr, "blkcheck: bad number for %s: '%s'\n", opt, s);
        exit(2);
    }
    return v;
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof(*o));
    o->dev = "vda";
    o->ring = "any";
    o->discard = "any";
    o->host_pattern = true;
    o->strict = true;
    o->plan.seed = 1;
    o->plan.threads = 4;
    o->work_mb = 32;
    o->plan.ops[0] = 512;
    o->plan.ops[1] = 96;
    o->plan.ops[2] = 12;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define OPT(name) (strcmp(a, name) == 0 && (v || (usage(), 0)) && ++i)
        if (OPT("--dev"))
            o->dev = v;
        else if (OPT("--ro-dev"))
            o->ro_dev = *v ? v : NULL;
        else if (OPT("--queues"))
            o->queues = parse_u64(a, v);
        else if (OPT("--ro-queues"))
            o->ro_queues = parse_u64(a, v);
        else if (OPT("--sectors"))
            o->sectors = parse_u64(a, v);
        else if (OPT("--ro-sectors"))
            o->ro_sectors = parse_u64(a, v);
        else if (OPT("--serial"))
            o->serial = v;
        else if (OPT("--ro-serial"))
            o->ro_serial = v;
        else if (OPT("--lbs"))
            o->lbs = parse_u64(a, v);
        else if (OPT("--ring"))
            o->ring = v;
        else if (OPT("--discard"))
            o->discard = v;
        else if (OPT("--require"))
            o->require = v;
        else if (OPT("--forbid"))
            o->forbid = v;
        else if (OPT("--seed"))
            o->plan.seed = parse_u64(a, v);
        else if (OPT("--threads"))
            o->plan.threads = (unsigned)parse_u64(a, v);
        else if (OPT("--work-mb"))
            o->work_mb = parse_u64(a, v);
        else if (OPT("--ops-4k"))
            o->plan.ops[0] = (unsigned)parse_u64(a, v);
        else if (OPT("--ops-64k"))
            o->plan.ops[1] = (unsigned)parse_u64(a, v);
        else if (OPT("--ops-1m"))
            o->plan.ops[2] = (unsigned)parse_u64(a, v);
        else if (OPT("--result-file"))
            o->result_file = v;
        else if (OPT("--image"))
            o->image = v;
        else if (strcmp(a, "--no-host-pattern") == 0)
            o->host_pattern = false;
        else if (strcmp(a, "--ro") == 0)
            o->ro_image = true;
        else if (strcmp(a, "--no-strict") == 0)
            o->strict = false;
        else {
            fprintf(stderr, "blkcheck: unknown option '%s'\n", a);
            usage();
        }
#undef OPT
    }
    if (strcmp(o->ring, "split") && strcmp(o->ring, "packed") && strcmp(o->ring, "any"))
        usage();
    if (strcmp(o->discard, "yes") && strcmp(o->discard, "no") && strcmp(o->discard, "any"))
        usage();
}

/* ---- virtio feature bits (virtio spec 5.2.3 and 6) ------------------------------------ */

static const struct {
    unsigned bit;
    const char *name;
} feature_names[] = {
    {1, "SIZE_MAX"},
    {2, "SEG_MAX"},
    {4, "GEOMETRY"},
    {5, "RO"},
    {6, "BLK_SIZE"},
    {9, "FLUSH"},
    {10, "TOPOLOGY"},
    {11, "CONFIG_WCE"},
    {12, "MQ"},
    {13, "DISCARD"},
    {14, "WRITE_ZEROES"},
    {15, "LIFETIME"},
    {16, "SECURE_ERASE"},
    {17, "ZONED"},
    {28, "INDIRECT_DESC"},
    {29, "EVENT_IDX"},
    {32, "VERSION_1"},
    {33, "ACCESS_PLATFORM"},
    {34, "RING_PACKED"},
    {35, "IN_ORDER"},
    {36, "ORDER_PLATFORM"},
    {37, "SR_IOV"},
    {38, "NOTIFICATION_DATA"},
    {39, "NOTIF_CONFIG_DATA"},
    {40, "RING_RESET"},
};

static int feature_bit(const char *name)
{
    for (size_t i = 0; i < sizeof(feature_names) / sizeof(feature_names[0]); i++)
        if (strcasecmp(feature_names[i].name, name) == 0)
            return (int)feature_names[i].bit;
    return -1;
}

/* Negotiated features from /sys/block/<dev>/device/features ('0'/'1' per bit). */
static int read_features(const char *dev, uint64_t *feat)
{
    char path[128], buf[256];
    snprintf(path, sizeof(path), "/sys/block/%s/device/features", dev);
    int err = sysfs_read(path, buf, sizeof(buf));
    if (err)
        return err;
    *feat = 0;
    for (size_t i = 0; buf[i] && i < 64; i++)
        if (buf[i] == '1')
            *feat |= 1ull << i;
    return 0;
}

static void features_string(uint64_t feat, char *out, size_t len)
{
    size_t l = 0;
    out[0] = '\0';
    for (unsigned b = 0; b < 64; b++) {
        if (!(feat & (1ull << b)))
            continue;
        const char *name = NULL;
        for (size_t i = 0; i < sizeof(feature_names) / sizeof(feature_names[0]); i++)
            if (feature_names[i].bit == b)
                name = feature_names[i].name;
        if (l < len) {
            if (name)
                l += (size_t)snprintf(out + l, len - l, "%s%s", l ? "," : "", name);
            else
                l += (size_t)snprintf(out + l, len - l, "%sbit%u", l ? "," : "", b);
        }
    }
}

/* Checks that each comma-separated feature in list is (want=true) / is not negotiated. */
static void check_feature_list(const char *cname, uint64_t feat, const char *list, bool want)
{
    char buf[256], bad[256] = "";
    snprintf(buf, sizeof(buf), "%s", list);
    for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int bit = feature_bit(tok);
        if (bit < 0 || (((feat >> bit) & 1) != want)) {
            size_t l = strlen(bad);
            snprintf(bad + l, sizeof(bad) - l, "%s%s%s", l ? "," : "", tok,
                     bit < 0 ? "(unknown)" : "");
        }
    }
    if (bad[0])
        check(cname, FAIL, "%s: %s", want ? "not negotiated" : "negotiated but forbidden", bad);
    else
        check(cname, PASS, "%s: %s", want ? "negotiated" : "absent", list);
}

/* ---- guest: device identity checks ---------------------------------------------------- */

static unsigned count_mq(const char *dev)
{
    char path[128];
    snprintf(path, sizeof(path), "/sys/block/%s/mq", dev);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    unsigned n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] >= '0' && e->d_name[0] <= '9')
            n++;
    closedir(d);
    return n;
}

/* capacity / mq-queues / serial / logical-block-size checks, shared by both disks. */
static void check_identity(const char *prefix, const char *dev, uint64_t want_sectors,
                           uint64_t want_queues, const char *want_serial, uint64_t want_lbs,
                           uint64_t *capacity_bytes)
{
    char name[64], path[128], buf[128];
    uint64_t v;
    int fd;

    snprintf(name, sizeof(name), "%scapacity", prefix);
    snprintf(path, sizeof(path), "/sys/block/%s/size", dev);
    if (sysfs_u64(path, &v)) {
        check(name, FAIL, "cannot read %s", path);
        v = 0;
    } else {
        uint64_t bytes = 0;
        snprintf(path, sizeof(path), "/dev/%s", dev);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0 || ioctl(fd, BLKGETSIZE64, &bytes) < 0)
            bytes = UINT64_MAX;
        if (fd >= 0)
            close(fd);
        if (bytes != v * 512)
            check(name, FAIL, "sysfs says %" PRIu64 " sectors, BLKGETSIZE64 %" PRIu64, v, bytes);
        else if (want_sectors && v != want_sectors)
            check(name, FAIL, "%" PRIu64 " sectors, expected %" PRIu64, v, want_sectors);
        else
            check(name, want_sectors ? PASS : SKIP, "%" PRIu64 " sectors (%" PRIu64 " MiB)%s", v,
                  v / 2048, want_sectors ? "" : ", no expectation given");
    }
    *capacity_bytes = v * 512;

    snprintf(name, sizeof(name), "%smq-queues", prefix);
    unsigned nq = count_mq(dev);
    if (!want_queues)
        check(name, SKIP, "%u hardware queues, no expectation given", nq);
    else
        check(name, nq == want_queues ? PASS : FAIL, "%u hardware queues, expected %" PRIu64, nq,
              want_queues);

    snprintf(name, sizeof(name), "%sserial", prefix);
    snprintf(path, sizeof(path), "/sys/block/%s/serial", dev);
    int err = sysfs_read(path, buf, sizeof(buf));
    if (err)
        snprintf(buf, sizeof(buf), "<error %s>", strerror(-err));
    if (!want_serial)
        check(name, SKIP, "'%s', no expectation given", buf);
    else
        check(name, strcmp(buf, want_serial) == 0 ? PASS : FAIL, "'%s', expected '%s'", buf,
              want_serial);

    snprintf(name, sizeof(name), "%slogical-block-size", prefix);
    snprintf(path, sizeof(path), "/sys/block/%s/queue/logical_block_size", dev);
    if (sysfs_u64(path, &v))
        check(name, FAIL, "cannot read %s", path);
    else if (!want_lbs)
        check(name, SKIP, "%" PRIu64 " bytes, no expectation given", v);
    else
        check(name, v == want_lbs ? PASS : FAIL, "%" PRIu64 " bytes, expected %" PRIu64, v,
              want_lbs);
}

/* Reads and verifies a stamped region; prefix/label name the check. */
static void check_region(const char *cname, int fd, uint64_t off, size_t len, uint64_t seed,
                         uint32_t gen, uint32_t tag)
{
    uint8_t *buf = xalloc(len);
    char why[256] = "";
    int err = full_pread(fd, buf, len, off);
    if (err) {
        check(cname, FAIL, "read of %zu bytes at %" PRIu64 " failed: %s", len, off, strerror(-err));
    } else {
        size_t bad = verify_range(buf, off, len, seed, gen, tag, why, sizeof(why));
        if (bad)
            check(cname, FAIL, "%zu of %zu sectors bad; first: %s", bad, len / SECTOR, why);
        else
            check(cname, PASS, "%zu KiB at offset %" PRIu64 " verified", len / 1024, off);
    }
    free(buf);
}

/* ---- guest: multi-threaded random write workload -------------------------------------- */

struct worker {
    pthread_t tid;
    const struct plan *plan;
    uint32_t *map; /* shared; thread t only touches the units of its own chunks */
    int fd;
    unsigned t, c, ncpu;
    uint64_t bytes;
    unsigned bad;
    char why[384];
};

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    size_t len = class_size[w->c];
    uint8_t *wbuf = xalloc(len), *rbuf = xalloc(len);
    cpu_set_t set;

    /* Pin to a vCPU so that every blk-mq hardware queue gets traffic (ctx -> hctx map). */
    CPU_ZERO(&set);
    CPU_SET(w->t % w->ncpu, &set);
    sched_setaffinity(0, sizeof(set), &set);

    for (unsigned i = 0; i < w->plan->ops[w->c] && w->bad < 1; i++) {
        uint64_t off = plan_off(w->plan, w->t, w->c, i);
        uint32_t gen = plan_gen(w->plan, w->t, w->c, i);
        fill_range(wbuf, off, len, w->plan->seed, gen, TAG_WORK);
        int err = full_pwrite(w->fd, wbuf, len, off);
        if (!err)
            err = full_pread(w->fd, rbuf, len, off);
        if (err) {
            snprintf(w->why, sizeof(w->why), "thread %u: I/O of %zu bytes at %" PRIu64 ": %s", w->t,
                     len, off, strerror(-err));
            w->bad++;
            break;
        }
        char why[256];
        if (verify_range(rbuf, off, len, w->plan->seed, gen, TAG_WORK, why, sizeof(why))) {
            snprintf(w->why, sizeof(w->why), "thread %u: read-back: %s", w->t, why);
            w->bad++;
        }
        for (uint64_t u = 0; u < len / UNIT; u++)
            w->map[(off - w->plan->work_off) / UNIT + u] = gen;
        w->bytes += len;
    }
    free(wbuf);
    free(rbuf);
    return NULL;
}

/* Runs every size class, one set of threads per class; prints a PERF line per class. */
static void run_workload(int fd, const struct plan *p, uint32_t *map)
{
    unsigned ncpu = (unsigned)sysconf(_SC_NPROCESSORS_ONLN);
    uint64_t total = 0;
    double total_t = 0;

    if (ncpu < 1)
        ncpu = 1;
    for (unsigned c = 0; c < NCLASS; c++) {
        struct worker *w = calloc(p->threads, sizeof(*w));
        char cname[32];
        uint64_t bytes = 0;
        unsigned bad = 0;
        const char *why = "";
        double t0 = now_s();

        if (!w) {
            fprintf(stderr, "blkcheck: out of memory\n");
            exit(2);
        }
        for (unsigned t = 0; t < p->threads; t++) {
            w[t] = (struct worker){.plan = p, .map = map, .fd = fd, .t = t, .c = c, .ncpu = ncpu};
            if (pthread_create(&w[t].tid, NULL, worker_main, &w[t])) {
                fprintf(stderr, "blkcheck: pthread_create failed\n");
                exit(2);
            }
        }
        for (unsigned t = 0; t < p->threads; t++) {
            pthread_join(w[t].tid, NULL);
            bytes += w[t].bytes;
            if (w[t].bad && !bad)
                why = w[t].why;
            bad += w[t].bad;
        }
        double dt = now_s() - t0;
        snprintf(cname, sizeof(cname), "random-write-%s", class_name[c]);
        if (bad)
            check(cname, FAIL, "%u bad ops; first: %s", bad, why);
        else
            check(cname, PASS,
                  "%u threads x %u O_DIRECT writes of %" PRIu32 " bytes, each read back",
                  p->threads, p->ops[c], class_size[c]);
        printf("PERF random-%s: %.1f MiB written + read back in %.2f s: %.1f MB/s, %.0f IOPS\n",
               class_name[c], (double)bytes / MiB, dt, 2.0 * (double)bytes / 1e6 / dt,
               2.0 * (double)(bytes / class_size[c]) / dt);
        total += bytes;
        total_t += dt;
        free(w);
    }
    printf("PERF total: %.1f MiB written + read back in %.2f s: %.1f MB/s\n", (double)total / MiB,
           total_t, 2.0 * (double)total / 1e6 / total_t);
    fflush(stdout);
}

/* Every unit written must hold its newest generation. */
static void final_verify(int fd, const struct plan *p, const uint32_t *map)
{
    uint8_t *buf = xalloc(CHUNK);
    uint64_t units = 0, bad = 0;
    char why[256] = "";

    for (uint64_t off = 0; off < p->work_len; off += CHUNK) {
        int err = full_pread(fd, buf, CHUNK, p->work_off + off);
        if (err) {
            check("final-verify", FAIL, "read at %" PRIu64 ": %s", p->work_off + off,
                  strerror(-err));
            free(buf);
            return;
        }
        for (uint64_t u = 0; u < CHUNK / UNIT; u++) {
            uint32_t gen = map[(off / UNIT) + u];
            if (!gen)
                continue;
            units++;
            char tmp[256];
            if (verify_range(buf + u * UNIT, p->work_off + off + u * UNIT, UNIT, p->seed, gen,
                             TAG_WORK, tmp, sizeof(tmp))) {
                if (!bad)
                    snprintf(why, sizeof(why), "%s", tmp);
                bad++;
            }
        }
    }
    free(buf);
    if (bad)
        check("final-verify", FAIL, "%" PRIu64 " of %" PRIu64 " units bad; first: %s", bad, units,
              why);
    else
        check("final-verify", PASS, "%" PRIu64 " written 4 KiB units hold their newest generation",
              units);
}

/*
 * Per-virtqueue completion interrupts from /proc/interrupts. With MSI-X, virtio_pci gives each
 * request queue its own vector named "<virtioN>-req.<q>"; counts[q] is the sum over all CPUs.
 * Returns the number of queues found (0: shared vector or no MSI-X).
 */
#define MAX_QUEUES 64
static unsigned vq_interrupts(const char *dev, uint64_t counts[MAX_QUEUES])
{
    char path[128], link[256], want[300], line[1024];
    ssize_t n;
    unsigned found = 0;

    memset(counts, 0, sizeof(uint64_t) * MAX_QUEUES);
    snprintf(path, sizeof(path), "/sys/block/%s/device", dev);
    n = readlink(path, link, sizeof(link) - 1);
    if (n < 0)
        return 0;
    link[n] = '\0';
    const char *vdev = strrchr(link, '/') ? strrchr(link, '/') + 1 : link;
    snprintf(want, sizeof(want), "%s-req.", vdev);

    FILE *f = fopen("/proc/interrupts", "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f)) {
        char *name = strstr(line, want);
        if (!name)
            continue;
        unsigned q = (unsigned)strtoul(name + strlen(want), NULL, 10);
        char *p = strchr(line, ':');
        if (!p || q >= MAX_QUEUES)
            continue;
        p++;
        uint64_t sum = 0;
        for (;;) {
            char *end;
            unsigned long long v = strtoull(p, &end, 10);
            if (end == p)
                break;
            sum += v;
            p = end;
        }
        counts[q] = sum;
        if (q + 1 > found)
            found = q + 1;
    }
    fclose(f);
    return found;
}

/* Each hardware queue must have completed requests during the workload (its own interrupt). */
static void check_mq_spread(const char *dev, const uint64_t before[MAX_QUEUES])
{
    uint64_t after[MAX_QUEUES];
    unsigned nq = vq_interrupts(dev, after), idle = 0, hw = count_mq(dev);
    char out[512] = "";
    size_t l = 0;

    if (!nq) {
        check("mq-spread", SKIP, "no per-queue MSI-X vectors in /proc/interrupts");
        return;
    }
    for (unsigned q = 0; q < nq && l < sizeof(out) - 32; q++) {
        uint64_t d = after[q] - before[q];
        if (!d)
            idle++;
        l += (size_t)snprintf(out + l, sizeof(out) - l, "%sreq.%u=%" PRIu64, l ? " " : "", q, d);
    }
    if (hw < 2)
        check("mq-spread", SKIP, "single hardware queue (interrupts: %s)", out);
    else if (nq != hw)
        check("mq-spread", FAIL, "%u hardware queues but %u request-queue vectors (%s)", hw, nq,
              out);
    else
        check("mq-spread", idle ? FAIL : PASS,
              "completion interrupts per queue during the workload: %s", out);
}

/* ---- guest: flush, cache mode, discard, write zeroes ---------------------------------- */

static int do_flush(int fd)
{
    if (fdatasync(fd) < 0)
        return -errno;
    if (ioctl(fd, BLKFLSBUF, 0) < 0)
        return -errno;
    return 0;
}

/* Writes one block and flushes; reports whether a FLUSH request reached the driver. */
static int write_and_flush(int fd, const char *dev, uint64_t seed, bool *flushed)
{
    uint8_t *buf = xalloc(UNIT);
    uint64_t before = 0, after = 0;
    int err;

    blk_stat_field(dev, 15, &before);
    fill_range(buf, DZ_OFF, UNIT, seed, 1, TAG_DZ);
    err = full_pwrite(fd, buf, UNIT, DZ_OFF);
    if (!err)
        err = do_flush(fd);
    free(buf);
    if (blk_stat_field_after(dev, 15, before, &after) == 0)
        *flushed = after > before;
    else
        *flushed = false;
    return err;
}

static void check_flush(int fd, const char *dev, uint64_t seed, uint64_t feat)
{
    char path[128], mode[64] = "", orig[64] = "";
    bool flushed = false;
    int err;

    snprintf(path, sizeof(path), "/sys/block/%s/queue/write_cache", dev);
    sysfs_read(path, mode, sizeof(mode));
    err = write_and_flush(fd, dev, seed, &flushed);
    if (err)
        check("flush", FAIL, "fdatasync/BLKFLSBUF failed: %s", strerror(-err));
    else if (strcmp(mode, "write back") == 0 && !flushed)
        check("flush", FAIL, "write-back cache but no FLUSH request was sent");
    else
        check("flush", PASS, "cache '%s', VIRTIO_BLK_F_FLUSH %s, FLUSH request %s", mode,
              (feat >> 9) & 1 ? "on" : "off", flushed ? "sent" : "not needed");

    /* VIRTIO_BLK_F_CONFIG_WCE: the driver may flip the cache mode through config space. */
    snprintf(path, sizeof(path), "/sys/block/%s/cache_type", dev);
    if (!((feat >> 11) & 1)) {
        check("wce-toggle", SKIP, "VIRTIO_BLK_F_CONFIG_WCE not negotiated");
        return;
    }
    if (sysfs_read(path, orig, sizeof(orig))) {
        check("wce-toggle", SKIP, "no %s", path);
        return;
    }
    const char *other = strcmp(orig, "write back") == 0 ? "write through" : "write back";
    err = sysfs_write(path, other);
    sysfs_read(path, mode, sizeof(mode));
    if (err || strcmp(mode, other) != 0) {
        check("wce-toggle", FAIL, "writing '%s' to cache_type: %s, reads back '%s'", other,
              err ? strerror(-err) : "ok", mode);
        return;
    }
    /* In whichever mode is write back, a flush must reach the driver. */
    bool wb_flushed = false, wt_flushed = false;
    err = write_and_flush(fd, dev, seed,
                          strcmp(other, "write back") == 0 ? &wb_flushed : &wt_flushed);
    int err2 = sysfs_write(path, orig);
    sysfs_read(path, mode, sizeof(mode));
    if (!err)
        err = write_and_flush(fd, dev, seed,
                              strcmp(orig, "write back") == 0 ? &wb_flushed : &wt_flushed);
    if (err || err2 || strcmp(mode, orig) != 0)
        check("wce-toggle", FAIL, "I/O or restore failed: %s / %s, mode now '%s'", strerror(-err),
              strerror(-err2), mode);
    else if (!wb_flushed)
        check("wce-toggle", FAIL, "in write-back mode fdatasync sent no FLUSH request");
    else
        check("wce-toggle", PASS, "'%s' -> '%s' -> '%s', FLUSH sent in write-back mode", orig,
              other, orig);
}

/*
 * Discard and write-zeroes on the DZ region:
 *   1. stamp the whole region, 2. BLKDISCARD [256K, 768K) of it, 3. BLKZEROOUT [1M, 1.5M),
 *   4. read back: outside both ranges intact; zeroout range zeroes; discard range each sector
 *      zeroes or its old content, 5. BLKZEROOUT the whole region (host-verify expects zeroes).
 */
static void check_discard_zeroes(int fd, const struct opts *o)
{
    const uint64_t seed = o->plan.seed;
    const uint64_t d_off = DZ_OFF + 256 * KiB, d_len = 512 * KiB;
    const uint64_t z_off = DZ_OFF + 1 * MiB, z_len = 512 * KiB;
    uint8_t *buf = xalloc(DZ_LEN), *want = xalloc(DZ_LEN);
    char path[128], why[256] = "";
    uint64_t dmax = 0, gran = 0, zmax = 0, dcount0 = 0, dcount1 = 0;
    int err, derr = 0;

    snprintf(path, sizeof(path), "/sys/block/%s/queue/discard_max_bytes", o->dev);
    sysfs_u64(path, &dmax);
    snprintf(path, sizeof(path), "/sys/block/%s/queue/discard_granularity", o->dev);
    sysfs_u64(path, &gran);
    snprintf(path, sizeof(path), "/sys/block/%s/queue/write_zeroes_max_bytes", o->dev);
    sysfs_u64(path, &zmax);
    info("discard_max_bytes=%" PRIu64 " discard_granularity=%" PRIu64
         " write_zeroes_max_bytes=%" PRIu64,
         dmax, gran, zmax);

    fill_range(want, DZ_OFF, DZ_LEN, seed, 2, TAG_DZ);
    err = full_pwrite(fd, want, DZ_LEN, DZ_OFF);
    if (err) {
        check("discard", FAIL, "stamping the region failed: %s", strerror(-err));
        check("write-zeroes", FAIL, "stamping the region failed: %s", strerror(-err));
        goto out;
    }

    /* 2. discard */
    bool can_discard = dmax > 0 && (!gran || (d_off % gran == 0 && d_len % gran == 0));
    blk_stat_field(o->dev, 11, &dcount0);
    uint64_t range[2] = {d_off, d_len};
    if (ioctl(fd, BLKDISCARD, range) < 0)
        derr = errno;
    blk_stat_field_after(o->dev, 11, dcount0, &dcount1);

    /* 3. write zeroes */
    uint64_t zrange[2] = {z_off, z_len};
    int zerr = ioctl(fd, BLKZEROOUT, zrange) < 0 ? errno : 0;

    /* 4. read back */
    err = full_pread(fd, buf, DZ_LEN, DZ_OFF);
    if (err) {
        check("discard", FAIL, "read-back failed: %s", strerror(-err));
        check("write-zeroes", FAIL, "read-back failed: %s", strerror(-err));
        goto out;
    }
    size_t outside_bad = 0, d_zero = 0, d_old = 0, d_other = 0, z_bad = 0;
    for (uint64_t i = 0; i < DZ_LEN; i += SECTOR) {
        uint64_t off = DZ_OFF + i;
        const uint8_t *s = buf + i;
        if (off >= d_off && off < d_off + d_len) {
            if (all_zero(s, SECTOR))
                d_zero++;
            else if (memcmp(s, want + i, SECTOR) == 0)
                d_old++;
            else
                d_other++;
        } else if (off >= z_off && off < z_off + z_len) {
            if (!all_zero(s, SECTOR))
                z_bad++;
        } else if (memcmp(s, want + i, SECTOR) != 0) {
            if (!outside_bad)
                verify_sector(s, off, seed, 2, TAG_DZ, why, sizeof(why));
            outside_bad++;
        }
    }

    bool want_discard = strcmp(o->discard, "yes") == 0, no_discard = strcmp(o->discard, "no") == 0;
    if (outside_bad)
        check("discard", FAIL, "%zu sectors outside the discarded/zeroed ranges changed: %s",
              outside_bad, why);
    else if (!dmax && want_discard)
        check("discard", FAIL, "device does not offer discard (discard_max_bytes=0)");
    else if (dmax && no_discard)
        check("discard", FAIL, "device offers discard but --discard no was expected");
    else if (!dmax)
        check("discard", derr == EOPNOTSUPP ? PASS : FAIL,
              "not offered by the device, BLKDISCARD -> %s", derr ? strerror(derr) : "success");
    else if (!can_discard)
        check("discard", SKIP, "granularity %" PRIu64 " does not fit the test range", gran);
    else if (derr)
        check("discard", FAIL, "BLKDISCARD of %" PRIu64 " bytes failed: %s", d_len, strerror(derr));
    else if (d_other)
        check("discard", FAIL,
              "%zu discarded sectors read back neither as zeroes nor as their old data", d_other);
    else if (dcount1 <= dcount0)
        check("discard", FAIL, "BLKDISCARD succeeded but no discard request reached the driver");
    else
        check("discard", PASS,
              "%" PRIu64 " KiB discarded: %zu sectors now read zeroes, %zu old data; "
              "neighbours intact",
              d_len / KiB, d_zero, d_old);

    if (zerr)
        check("write-zeroes", FAIL, "BLKZEROOUT failed: %s", strerror(zerr));
    else if (z_bad)
        check("write-zeroes", FAIL, "%zu of %" PRIu64 " sectors not zero after BLKZEROOUT", z_bad,
              z_len / SECTOR);
    else if (outside_bad)
        check("write-zeroes", FAIL, "neighbouring sectors changed");
    else
        check("write-zeroes", PASS, "%" PRIu64 " KiB read back as zeroes (%s)", z_len / KiB,
              zmax ? "VIRTIO_BLK_T_WRITE_ZEROES" : "kernel fallback: writes of zero pages");

    /* 5. leave the whole region zeroed for host-verify */
    uint64_t all[2] = {DZ_OFF, DZ_LEN};
    if (ioctl(fd, BLKZEROOUT, all) < 0)
        check("write-zeroes-region", FAIL, "BLKZEROOUT of the region failed: %s", strerror(errno));
out:
    free(buf);
    free(want);
}

/* ---- guest: pattern for the host ------------------------------------------------------ */

static void write_host_pattern(int fd, const struct opts *o, uint64_t capacity)
{
    uint8_t *buf = xalloc(G2H_LEN);
    uint8_t *mbuf = xalloc(MANI_LEN);
    struct manifest m;
    int err;

    memset(&m, 0, sizeof(m));
    memcpy(m.magic, MANI_MAGIC, 8);
    m.seed = o->plan.seed;
    m.capacity = capacity;
    m.work_off = o->plan.work_off;
    m.work_len = o->plan.work_len;
    m.threads = o->plan.threads;
    for (unsigned c = 0; c < NCLASS; c++)
        m.ops[c] = o->plan.ops[c];
    m.guest_failures = n_fail;
    m.lbs = (uint32_t)o->lbs;
    m.check = mix64(m.seed ^ mix64(m.work_off ^ mix64(m.work_len ^ mix64(m.threads))));
    memcpy(mbuf, &m, sizeof(m));

    fill_range(buf, G2H_OFF, G2H_LEN, o->plan.seed, 1, TAG_G2H);
    err = full_pwrite(fd, buf, G2H_LEN, G2H_OFF);
    if (!err)
        err = full_pwrite(fd, mbuf, MANI_LEN, MANI_OFF);
    if (!err)
        err = do_flush(fd);
    if (err) {
        check("host-pattern-write", FAIL, "write/flush failed: %s", strerror(-err));
    } else {
        memset(mbuf, 0, MANI_LEN);
        err = full_pread(fd, mbuf, MANI_LEN, MANI_OFF);
        if (err || memcmp(mbuf, &m, sizeof(m)) != 0)
            check("host-pattern-write", FAIL, "manifest does not read back");
        else
            check_region("host-pattern-write", fd, G2H_OFF, G2H_LEN, o->plan.seed, 1, TAG_G2H);
    }
    free(buf);
    free(mbuf);
}

/* ---- guest: the read-only disk -------------------------------------------------------- */

static void check_ro_disk(const struct opts *o)
{
    const char *dev = o->ro_dev;
    char path[128];
    uint64_t cap = 0, ro = 0, feat = 0;
    uint8_t *blk = xalloc(64 * KiB);

    check_identity("ro-", dev, o->ro_sectors, o->ro_queues, o->ro_serial, o->lbs, &cap);

    snprintf(path, sizeof(path), "/sys/block/%s/ro", dev);
    sysfs_u64(path, &ro);
    read_features(dev, &feat);
    check("ro-flag", ro == 1 && ((feat >> 5) & 1) ? PASS : FAIL,
          "/sys/block/%s/ro=%" PRIu64 ", VIRTIO_BLK_F_RO %s", dev, ro,
          (feat >> 5) & 1 ? "negotiated" : "not negotiated");

    snprintf(path, sizeof(path), "/dev/%s", dev);
    int rfd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    if (rfd < 0) {
        check("ro-read", FAIL, "open %s O_RDONLY: %s", path, strerror(errno));
        goto out;
    }
    int rov = -1;
    if (ioctl(rfd, BLKROGET, &rov) < 0 || rov != 1)
        info("BLKROGET on %s returned %d", path, rov);
    if (o->host_pattern) {
        check_region("ro-read", rfd, H2G_OFF, H2G_LEN, o->plan.seed, 1, TAG_H2G);
    } else {
        int err = full_pread(rfd, blk, 64 * KiB, 0);
        check("ro-read", err ? FAIL : PASS, "64 KiB read: %s", err ? strerror(-err) : "ok");
    }

    /* Every attempt targets the host-stamped region so that any effect is detectable. */
    int wfd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
    if (wfd < 0) {
        int e = errno;
        check("ro-write-rejected", errno_is_rejection(e) ? PASS : FAIL, "open O_RDWR refused: %s",
              strerror(e));
        check("ro-zeroout-rejected", SKIP, "no writable fd");
        check("ro-discard-rejected", SKIP, "no writable fd");
    } else {
        fill_range(blk, 0, UNIT, o->plan.seed, 7, TAG_G2H);
        ssize_t n = pwrite(wfd, blk, UNIT, 0);
        int e = n < 0 ? errno : 0;
        if (n >= 0)
            check("ro-write-rejected", FAIL, "pwrite of 4 KiB returned %zd", n);
        else
            check("ro-write-rejected", errno_is_rejection(e) ? PASS : FAIL,
                  "open O_RDWR ok, pwrite -> %s (%s)", strerror(e), reject_layer(e));

        uint64_t zr[2] = {64 * KiB, 64 * KiB};
        e = ioctl(wfd, BLKZEROOUT, zr) < 0 ? errno : 0;
        if (!e)
            check("ro-zeroout-rejected", FAIL, "BLKZEROOUT succeeded on a read-only disk");
        else
            check("ro-zeroout-rejected", errno_is_rejection(e) ? PASS : FAIL,
                  "BLKZEROOUT -> %s (%s)", strerror(e), reject_layer(e));

        /* The spec only says writes; a discard the device ignores is fine if data is intact. */
        uint64_t dr[2] = {512 * KiB, 512 * KiB};
        e = ioctl(wfd, BLKDISCARD, dr) < 0 ? errno : 0;
        if (e)
            check("ro-discard-rejected", errno_is_rejection(e) ? PASS : FAIL,
                  "BLKDISCARD -> %s (%s)", strerror(e), reject_layer(e));
        else
            check("ro-discard-rejected", PASS, "BLKDISCARD -> success (data checked below)");
        close(wfd);
    }

    if (o->host_pattern)
        check_region("ro-data-intact", rfd, H2G_OFF, H2G_LEN, o->plan.seed, 1, TAG_H2G);
    else
        check("ro-data-intact", SKIP, "no host pattern to compare with");
    close(rfd);
out:
    free(blk);
}

/* ---- guest main ----------------------------------------------------------------------- */

static int guest_main(struct opts *o)
{
    char path[128], fstr[512];
    uint64_t capacity = 0, feat = 0;
    int fd;

    setvbuf(stdout, NULL, _IOLBF, 0);
    info("guest-blkcheck: dev=%s ro-dev=%s seed=%" PRIu64 " threads=%u", o->dev,
         o->ro_dev ? o->ro_dev : "-", o->plan.seed, o->plan.threads);

    snprintf(path, sizeof(path), "/sys/block/%s", o->dev);
    if (access(path, F_OK) != 0) {
        check("disk-present", FAIL, "%s does not exist", path);
        goto done;
    }
    check_identity("", o->dev, o->sectors, o->queues, o->serial, o->lbs, &capacity);

    if (read_features(o->dev, &feat)) {
        check("ring-layout", FAIL, "cannot read /sys/block/%s/device/features", o->dev);
    } else {
        features_string(feat, fstr, sizeof(fstr));
        info("negotiated features: %s", fstr);
        bool packed = (feat >> 34) & 1;
        const char *got = packed ? "packed" : "split";
        if (strcmp(o->ring, "any") == 0)
            check("ring-layout", SKIP, "%s ring, no expectation given", got);
        else
            check("ring-layout", strcmp(o->ring, got) == 0 ? PASS : FAIL,
                  "%s ring negotiated, expected %s", got, o->ring);
        if (o->require)
            check_feature_list("features-required", feat, o->require, true);
        if (o->forbid)
            check_feature_list("features-forbidden", feat, o->forbid, false);
    }

    if (capacity < MIN_DISK + (uint64_t)o->plan.threads * CHUNK) {
        check("disk-size", FAIL, "disk of %" PRIu64 " bytes is too small (need %" PRIu64 ")",
              capacity, MIN_DISK + (uint64_t)o->plan.threads * CHUNK);
        goto done;
    }
    o->plan.work_off = WORK_OFF;
    o->plan.work_len = o->work_mb * MiB;
    if (o->plan.work_len > capacity - WORK_OFF)
        o->plan.work_len = (capacity - WORK_OFF) / CHUNK * CHUNK;
    char why[128];
    if (!plan_valid(&o->plan, why, sizeof(why))) {
        check("workload-plan", FAIL, "%s", why);
        goto done;
    }

    snprintf(path, sizeof(path), "/dev/%s", o->dev);
    fd = open(path, O_RDWR | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
        check("open", FAIL, "open %s O_RDWR|O_DIRECT: %s", path, strerror(errno));
        goto done;
    }

    if (o->host_pattern)
        check_region("host-pattern-read", fd, H2G_OFF, H2G_LEN, o->plan.seed, 1, TAG_H2G);
    else
        check("host-pattern-read", SKIP, "--no-host-pattern");

    uint32_t *map = calloc(o->plan.work_len / UNIT, sizeof(*map));
    if (!map) {
        fprintf(stderr, "blkcheck: out of memory\n");
        return 2;
    }
    uint64_t irq_before[MAX_QUEUES];
    vq_interrupts(o->dev, irq_before);
    run_workload(fd, &o->plan, map);
    check_mq_spread(o->dev, irq_before);
    final_verify(fd, &o->plan, map);
    free(map);
    check_flush(fd, o->dev, o->plan.seed, feat);
    check_discard_zeroes(fd, o);
    write_host_pattern(fd, o, capacity);
    close(fd);

    if (o->ro_dev)
        check_ro_disk(o);

done:
    printf("BLKCHECK-SUMMARY: pass=%u fail=%u skip=%u%s%s\n", n_pass, n_fail, n_skip,
           n_fail ? " failed=" : "", failed_names);
    fflush(stdout);
    if (o->result_file && n_fail) {
        FILE *f = fopen(o->result_file, "w");
        if (f) {
            fprintf(f, "failed checks (%u): %s\n", n_fail, failed_names);
            fclose(f);
        }
    }
    return n_fail ? 1 : 0;
}

/* ---- host modes ----------------------------------------------------------------------- */

static int host_open(const char *image, int flags, uint64_t *size)
{
    struct stat st;
    int fd = open(image, flags | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "host: cannot open %s: %s\n", image, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_size < MIN_DISK) {
        fprintf(stderr, "host: %s is smaller than %" PRIu64 " bytes\n", image, MIN_DISK);
        close(fd);
        return -1;
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

static int host_prepare(const struct opts *o)
{
    uint64_t size;
    int fd = host_open(o->image, O_RDWR, &size);
    if (fd < 0)
        return 1;
    uint8_t *buf = xalloc(H2G_LEN);
    fill_range(buf, H2G_OFF, H2G_LEN, o->plan.seed, 1, TAG_H2G);
    int err = full_pwrite(fd, buf, H2G_LEN, H2G_OFF);
    if (!err && fsync(fd) < 0)
        err = -errno;
    free(buf);
    close(fd);
    if (err) {
        fprintf(stderr, "host-prepare: writing %s: %s\n", o->image, strerror(-err));
        return 1;
    }
    printf("host-prepare: %s: stamped %" PRIu64 " KiB at offset 0 with seed %" PRIu64 "\n",
           o->image, H2G_LEN / KiB, o->plan.seed);
    return 0;
}

static unsigned h_fail;

static void hcheck(const char *image, const char *name, bool ok, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void hcheck(const char *image, const char *name, bool ok, const char *fmt, ...)
{
    va_list ap;
    printf("HOST-CHECK %s %s: %s ", image, name, ok ? "PASS" : "FAIL");
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    printf("\n");
    if (!ok)
        h_fail++;
}

/* Checks that [off, off+len) of the image reads as zeroes; returns the first bad offset. */
static bool host_zero(int fd, uint64_t off, uint64_t len, uint64_t *bad_at)
{
    uint8_t *buf = xalloc(CHUNK);
    bool ok = true;
    for (uint64_t pos = off; pos < off + len && ok; pos += CHUNK) {
        size_t n = (size_t)(off + len - pos < CHUNK ? off + len - pos : CHUNK);
        if (full_pread(fd, buf, n, pos) || !all_zero(buf, n)) {
            for (size_t i = 0; i < n; i += SECTOR) {
                if (!all_zero(buf + i, SECTOR)) {
                    *bad_at = pos + i;
                    break;
                }
            }
            ok = false;
        }
    }
    free(buf);
    return ok;
}

static bool host_region(int fd, uint64_t off, size_t len, uint64_t seed, uint32_t gen, uint32_t tag,
                        char *why, size_t whylen)
{
    uint8_t *buf = xalloc(len);
    int err = full_pread(fd, buf, len, off);
    bool ok;
    if (err) {
        snprintf(why, whylen, "read: %s", strerror(-err));
        ok = false;
    } else {
        ok = verify_range(buf, off, len, seed, gen, tag, why, whylen) == 0;
    }
    free(buf);
    return ok;
}

static int host_verify(const struct opts *o)
{
    const char *img = o->image;
    uint64_t size, bad_at = 0;
    char why[256] = "";
    int fd = host_open(img, O_RDONLY, &size);
    if (fd < 0)
        return 1;

    bool ok;
    if (o->host_pattern) {
        ok = host_region(fd, H2G_OFF, H2G_LEN, o->plan.seed, 1, TAG_H2G, why, sizeof(why));
        hcheck(img, "host-pattern-intact", ok, "%s",
               ok ? "the pattern stamped before boot is intact" : why);
    }

    if (o->ro_image) {
        if (o->strict) {
            ok = host_zero(fd, H2G_LEN, size - H2G_LEN, &bad_at);
            if (ok)
                hcheck(img, "ro-untouched", true, "everything past the pattern is still zero");
            else
                hcheck(img, "ro-untouched", false, "non-zero data @%" PRIu64, bad_at);
        }
        goto out;
    }

    struct manifest m;
    uint8_t mbuf[MANI_LEN];
    if (full_pread(fd, mbuf, MANI_LEN, MANI_OFF)) {
        hcheck(img, "manifest", false, "cannot read");
        goto out;
    }
    memcpy(&m, mbuf, sizeof(m));
    if (memcmp(m.magic, MANI_MAGIC, 8) != 0 ||
        m.check != mix64(m.seed ^ mix64(m.work_off ^ mix64(m.work_len ^ mix64(m.threads))))) {
        hcheck(img, "manifest", false,
               "no guest manifest at offset %" PRIu64 " (guest did not finish?)", MANI_OFF);
        goto out;
    }
    if (m.seed != o->plan.seed) {
        hcheck(img, "manifest", false, "manifest from another run: seed %" PRIu64 ", want %" PRIu64,
               m.seed, o->plan.seed);
        goto out;
    }
    struct plan p = {
        .seed = m.seed, .threads = m.threads, .work_off = m.work_off, .work_len = m.work_len};
    for (unsigned c = 0; c < NCLASS; c++)
        p.ops[c] = m.ops[c];
    if (p.work_off != WORK_OFF || p.work_off + p.work_len > size ||
        !plan_valid(&p, why, sizeof(why))) {
        hcheck(img, "manifest", false, "implausible workload in manifest");
        goto out;
    }
    hcheck(img, "manifest", m.capacity == size,
           "seed %" PRIu64 ", guest saw %" PRIu64 " bytes (file %" PRIu64 "), %u checks had failed",
           m.seed, m.capacity, size, m.guest_failures);

    ok = host_region(fd, G2H_OFF, G2H_LEN, m.seed, 1, TAG_G2H, why, sizeof(why));
    hcheck(img, "guest-pattern", ok, "%s", ok ? "the guest's pattern is in the image" : why);

    ok = host_zero(fd, DZ_OFF, DZ_LEN, &bad_at);
    hcheck(img, "zeroed-region", ok,
           ok ? "write-zeroes region reads zeroes" : "non-zero data @%" PRIu64, bad_at);

    /* Replay the workload and check every unit's newest generation. */
    uint32_t *map = calloc(p.work_len / UNIT, sizeof(*map));
    uint8_t *buf = xalloc(CHUNK);
    uint64_t units = 0, bad = 0, stray = 0;
    if (!map) {
        fprintf(stderr, "host-verify: out of memory\n");
        return 2;
    }
    plan_replay(&p, map);
    for (uint64_t off = 0; off < p.work_len; off += CHUNK) {
        if (full_pread(fd, buf, CHUNK, p.work_off + off)) {
            bad++;
            continue;
        }
        for (uint64_t u = 0; u < CHUNK / UNIT; u++) {
            uint32_t gen = map[off / UNIT + u];
            const uint8_t *s = buf + u * UNIT;
            char tmp[256];
            if (!gen) {
                if (o->strict && !all_zero(s, UNIT))
                    stray++;
                continue;
            }
            units++;
            if (verify_range(s, p.work_off + off + u * UNIT, UNIT, p.seed, gen, TAG_WORK, tmp,
                             sizeof(tmp))) {
                if (!bad)
                    snprintf(why, sizeof(why), "%s", tmp);
                bad++;
            }
        }
    }
    free(buf);
    free(map);
    hcheck(img, "workload-data", !bad && !stray,
           "%" PRIu64 " units replayed, %" PRIu64 " bad, %" PRIu64
           " never-written units non-zero%s%s",
           units, bad, stray, bad ? "; first: " : "", bad ? why : "");
    if (o->strict) {
        uint64_t tail = p.work_off + p.work_len;
        ok = host_zero(fd, tail, size - tail, &bad_at);
        hcheck(img, "no-stray-writes", ok,
               ok ? "beyond the work region still zero" : "non-zero data @%" PRIu64, bad_at);
    }
out:
    close(fd);
    printf("HOST-RESULT %s: %s\n", img, h_fail ? "FAIL" : "PASS");
    return h_fail ? 1 : 0;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (argc < 2)
        usage();
    parse_opts(argc, argv, &o);
    if (strcmp(argv[1], "blk") == 0)
        return guest_main(&o);
    if (!o.image)
        usage();
    if (strcmp(argv[1], "host-prepare") == 0)
        return host_prepare(&o);
    if (strcmp(argv[1], "host-verify") == 0)
        return host_verify(&o);
    usage();
    return 2;
}
