/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the virtio-blk device (src/dev/blk.c) and its
 * backends: the input is a guest driver gone wrong. It picks a device (null
 * or io_uring over a memfd image, buffered or O_DIRECT; 512 or 4096-byte
 * blocks; read-only or not), the features the driver accepts and
 * config-space accesses, then queues requests with fuzzed headers, bodies
 * and buffer layouts (split headers, buffers crossing a memory region
 * boundary, buffers outside guest memory, no status byte) and lets the
 * device run them to completion.
 * Checked: every chain comes back at most once, used lengths fit the
 * writable part, status bytes are valid, nothing stays in flight, the image
 * never grows.
 *
 * This binary has its own minimal worker (one io_uring, run inline) instead
 * of src/runtime/worker.c, so it is single-threaded and deterministic.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/vq.h"
#include "dev/blk.h"
#include "spec/virtio_blk.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "fuzz_common.h"

#define BIT(n) (1ull << (n))

/*
 * Guest memory: two 256 KiB regions adjacent in GPA but mapped separately,
 * so a buffer crossing 0x140000 becomes two iovecs. The ring area sits at
 * the start of the first; request buffers are bump-allocated from ARENA.
 */
#define RSZ        0x40000ull
#define MEM_GPA    0x100000ull
#define ARENA_GPA  0x110000ull
#define ARENA_END  (MEM_GPA + 2 * RSZ)
#define BAD_GPA    0x7000000000ull /* outside guest memory */
#define QSIZE      16
#define MAX_BUFS   8
#define MAX_BUFLEN 0x3000u
#define IMG_SIZE   (1u << 20)
#define NDEV       5

/* ---- the fuzzer's own worker: one io_uring, driven inline ---- */

struct vhd_worker {
    struct io_uring ring;
};

static struct vhd_worker fw;

unsigned vhd_worker_index(const struct vhd_worker *w)
{
    (void)w;
    return 0;
}

struct io_uring *vhd_worker_uring(struct vhd_worker *w)
{
    return &w->ring;
}

void vhd_worker_submit_pending(struct vhd_worker *w)
{
    (void)w;
}

struct io_uring_sqe *vhd_worker_get_sqe(struct vhd_worker *w)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
    if (!sqe) {
        io_uring_submit(&w->ring);
        sqe = io_uring_get_sqe(&w->ring);
    }
    return sqe;
}

void vhd_queue_mark_used(struct vhd_queue *q)
{
    q->notify_pending = true; /* published by the loop below with one flush */
}

/* Run CQE callbacks until q has nothing in flight. */
static void drain(struct vhd_queue *q)
{
    unsigned rounds = 0;
    while (q->inflight_io) {
        struct io_uring_cqe *cqe;
        FUZZ_CHECK(++rounds < 100000);
        int rc = io_uring_submit_and_wait(&fw.ring, 1);
        FUZZ_CHECK(rc >= 0 || rc == -EINTR);
        while (io_uring_peek_cqe(&fw.ring, &cqe) == 0) {
            struct vhd_io_cb *cb = io_uring_cqe_get_data(cqe);
            int res = cqe->res;
            io_uring_cqe_seen(&fw.ring, cqe);
            FUZZ_CHECK(cb != NULL);
            cb->done(cb, res);
        }
    }
}

/* ---- fixtures ---- */

static struct vhd_guestmem gm;
static struct vhd_mem *mem;
static void *area;
static uint64_t area_gpa;
static size_t area_len;
static struct vhd_dev *devs[NDEV];
static int memfd[NDEV] = {-1, -1, -1, -1, -1};

static struct vhd_dev *make_dev(int i, const char *backend, uint32_t bs, bool ro, bool wt,
                                bool direct)
{
    struct vhd_blk_opts o = {.name = "fuzz",
                             .backend = backend,
                             .block_size = bs,
                             .ro = ro,
                             .writethrough = wt,
                             .serial = "fuzz-serial",
                             .direct = direct,
                             .allow_packed = true};
    char path[64], err[256];
    struct vhd_dev *d = NULL;

    if (!strcmp(backend, "null")) {
        o.size = IMG_SIZE;
    } else {
        memfd[i] = memfd_create("fuzz-blk", MFD_CLOEXEC);
        if (memfd[i] < 0 || ftruncate(memfd[i], IMG_SIZE) < 0)
            abort();
        snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd[i]);
        o.image = path;
    }
    if (vhd_blk_new(&o, &d, err, sizeof(err)) < 0) {
        if (direct) { /* O_DIRECT on tmpfs needs Linux 6.6 */
            close(memfd[i]);
            memfd[i] = -1;
            return NULL;
        }
        fprintf(stderr, "vhd_blk_new: %s\n", err);
        abort();
    }
    return d;
}

static void setup_once(void)
{

    vhd_log_set_level(VHD_LOG_ERROR);
    fuzz_guestmem(&gm, 2, RSZ, MEM_GPA, &mem);
    area_len = fuzz_area_len(QSIZE, MAX_BUFS);
    area_gpa = vhd_guestmem_alloc(&gm, area_len, 4096, &area);
    if (area_gpa == UINT64_MAX || area_gpa + area_len > ARENA_GPA)
        abort();
    if (io_uring_queue_init(64, &fw.ring, 0) < 0)
        abort();
    devs[0] = make_dev(0, "null", 512, false, false, false);
    devs[1] = make_dev(1, "null", 4096, true, false, false);
    devs[2] = make_dev(2, "uring", 512, false, false, false);
    devs[3] = make_dev(3, "uring", 4096, false, true, false);
    devs[4] = make_dev(4, "uring", 512, false, false, true); /* O_DIRECT: bounce paths */
}

/* Host pointer of a gpa range (ours), or NULL outside guest memory or across regions. */
static uint8_t *gptr(uint64_t gpa, uint64_t len)
{
    return vhd_guestmem_ptr(&gm, gpa, len);
}

/* What we remember of a queued request. */
struct sent {
    bool queued;
    bool done;
    uint32_t wlen;       /* writable bytes */
    uint64_t status_gpa; /* last writable byte, when wlen > 0 and all buffers are good */
    bool status_known;
};

static const uint32_t types[] = {VIRTIO_BLK_T_IN,      VIRTIO_BLK_T_OUT,
                                 VIRTIO_BLK_T_FLUSH,   VIRTIO_BLK_T_GET_ID,
                                 VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_WRITE_ZEROES};

/*
 * One request: control byte (buffer count, readable count, raw or
 * structured), then per buffer a length, a gap and a flag byte; then the
 * header (type, sector) unless raw, then the readable bytes.
 */
static bool add_request(struct in *in, struct vhd_drv_vq *dq, bool indirect, uint64_t *cursor,
                        struct sent *s, uint16_t cookie, uint64_t capacity)
{
    struct vhd_drv_buf bufs[MAX_BUFS];
    uint8_t ctl = get8(in);
    uint32_t nbufs = 1 + ctl % MAX_BUFS;
    uint32_t nr = (ctl >> 3) % (nbufs + 1);
    bool raw = ctl & 0x80;
    bool all_good = true;
    uint64_t rlen = 0;

    memset(s, 0, sizeof(*s));
    for (uint32_t i = 0; i < nbufs; i++) {
        uint32_t len = get16(in) % MAX_BUFLEN;
        uint8_t fl = get8(in);
        uint64_t gap = fl & 0x0f;
        if (i == 0 && !raw && len < 16 && !(fl & 0x10))
            len = 16 + len; /* mostly a whole header first */
        if (fl & 0x20)
            len = 1 + (len & 0x1f); /* small pieces: split headers, lone status bytes */
        if (*cursor + gap + len > ARENA_END)
            return false;
        bufs[i].gpa = *cursor + gap;
        bufs[i].len = len;
        *cursor += gap + len;
        if ((fl & 0xc0) == 0xc0 && (get8(in) & 7) == 0) {
            bufs[i].gpa = BAD_GPA; /* the engine refuses the chain: queue broken */
            all_good = false;
        }
        if (i < nr)
            rlen += len;
        else
            s->wlen += len;
    }

    /* Fill the readable buffers: header, then bytes from the input. */
    static uint8_t rbuf[MAX_BUFS * MAX_BUFLEN];
    uint64_t fill = rlen < sizeof(rbuf) ? rlen : sizeof(rbuf);
    size_t off = 0;
    if (!raw) {
        struct virtio_blk_outhdr h;
        uint8_t tsel = get8(in);
        uint32_t type = tsel < 0xf0 ? types[tsel % VHD_ARRAY_SIZE(types)] : get32(in);
        uint8_t ssel = get8(in);
        uint64_t sector;
        if (ssel < 0xc0)
            sector = (uint64_t)(ssel & 0x3f) * 8;
        else if (ssel < 0xf0)
            sector = capacity - (ssel & 0x1f);
        else
            sector = get64(in);
        h.type = vhd_le32(type);
        h.reserved = 0;
        h.sector = vhd_le64(sector);
        memcpy(rbuf, &h, fill < 16 ? fill : 16);
        off = 16;
    }
    for (; off < fill; off++)
        rbuf[off] = get8(in);
    uint64_t done = 0;
    for (uint32_t i = 0; i < nr && done < fill; i++) {
        uint64_t n = bufs[i].len < fill - done ? bufs[i].len : fill - done;
        if (bufs[i].gpa != BAD_GPA)
            fuzz_gwrite(&gm, bufs[i].gpa, rbuf + done, n);
        done += n;
    }
    /* Mark the writable bytes so an unwritten status is recognisable. */
    for (uint32_t i = nr; i < nbufs; i++)
        if (bufs[i].gpa != BAD_GPA)
            for (uint32_t k = 0; k < bufs[i].len; k++) {
                uint8_t *p = gptr(bufs[i].gpa + k, 1);
                if (p)
                    *p = 0xee;
            }

    if (vhd_drv_vq_add(dq, bufs, nr, nbufs - nr, indirect, (void *)(uintptr_t)(cookie + 1)) < 0)
        return false;
    s->queued = true;
    if (all_good && s->wlen) {
        /* the last non-empty writable buffer holds the status byte */
        for (uint32_t i = nbufs; i-- > nr;) {
            if (bufs[i].len) {
                s->status_gpa = bufs[i].gpa + bufs[i].len - 1;
                s->status_known = true;
                break;
            }
        }
    }
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool ready;
    struct in in = {data, size};
    struct sent sent[QSIZE];

    if (!ready) {
        setup_once();
        ready = true;
    }

    /* ---- device, features, config ---- */
    uint8_t b0 = get8(&in), b1 = get8(&in);
    unsigned di = (b0 & 0x10) && devs[4] ? 4 : b0 & 3;
    struct vhd_dev *dev = devs[di];
    const struct vhd_dev_ops *ops = dev->ops;
    bool packed = b0 & 4, indirect = b0 & 8;
    uint64_t f = ops->features(dev);
    static const int droppable[] = {VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_WRITE_ZEROES,
                                    VIRTIO_BLK_F_SIZE_MAX, VIRTIO_BLK_F_FLUSH,
                                    VIRTIO_BLK_F_CONFIG_WCE};
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(droppable); i++)
        if (b1 & (1u << i))
            f &= ~BIT(droppable[i]);
    if (!packed)
        f &= ~BIT(VIRTIO_F_RING_PACKED);
    if (!indirect)
        f &= ~BIT(VIRTIO_F_INDIRECT_DESC);
    if (b1 & 0x80)
        f ^= BIT(get8(&in) & 63); /* sometimes a bit the device did not offer, or no VERSION_1 */
    if (ops->set_features(dev, f) < 0) {
        f = ops->features(dev) & ~BIT(VIRTIO_F_RING_PACKED);
        packed = false;
        FUZZ_CHECK(ops->set_features(dev, f) == 0);
    }
    indirect = indirect && (f & BIT(VIRTIO_F_INDIRECT_DESC));
    packed = packed && (f & BIT(VIRTIO_F_RING_PACKED));

    uint8_t cfg[sizeof(struct virtio_blk_config) + 8];
    unsigned ncfg = (b1 >> 5) & 3;
    for (unsigned i = 0; i < ncfg; i++) {
        uint32_t off = get8(&in), len = get8(&in);
        uint8_t v = get8(&in);
        if (v & 1) {
            int rc = ops->get_config(dev, cfg, off % sizeof(cfg), len % sizeof(cfg));
            FUZZ_CHECK(rc == 0 || rc == -EINVAL);
        } else {
            memset(cfg, v >> 1, sizeof(cfg));
            int rc = ops->set_config(dev, cfg, off % sizeof(cfg), len % 4);
            FUZZ_CHECK(rc == 0 || rc == -EPERM || rc == -EINVAL);
        }
    }
    struct virtio_blk_config c;
    FUZZ_CHECK(ops->get_config(dev, &c, 0, sizeof(c)) == 0);
    uint64_t capacity = vhd_le64(c.capacity);
    FUZZ_CHECK(capacity == vhd_blk_capacity(dev));
    FUZZ_CHECK(c.writeback <= 1);

    /* ---- rings ---- */
    struct vhd_drv_vq dq;
    struct vhd_drv_vq_params dp = {.size = QSIZE,
                                   .packed = packed,
                                   .event_idx = (f & BIT(VIRTIO_F_EVENT_IDX)) != 0,
                                   .max_indirect = indirect ? MAX_BUFS : 0,
                                   .area = area,
                                   .area_gpa = area_gpa,
                                   .area_len = area_len};
    FUZZ_CHECK(vhd_drv_vq_init(&dq, &dp) == 0);
    struct vhd_queue *q = &dev->queues[0];
    struct vhd_vq_params vp = {.size = QSIZE,
                               .packed = packed,
                               .event_idx = dp.event_idx,
                               .indirect = indirect,
                               .addr_is_gpa = true,
                               .desc = dq.desc_gpa,
                               .avail = dq.avail_gpa,
                               .used = dq.used_gpa};
    q->size = QSIZE;
    FUZZ_CHECK(vhd_vq_init(&q->vq, &vp, mem) == 0);
    FUZZ_CHECK(vhd_vq_start(&q->vq) == 0);
    FUZZ_CHECK(ops->queue_init(dev, q) == 0);
    q->worker = &fw;
    q->inflight_io = 0;

    /* ---- requests, in rounds: add some, process, drain ---- */
    memset(sent, 0, sizeof(sent));
    uint64_t cursor = ARENA_GPA;
    unsigned nsent = 0;
    bool broken = false, full = false;
    while (in.n && !full && !broken) {
        unsigned batch = 1 + get8(&in) % 4;
        for (unsigned k = 0; k < batch && nsent < QSIZE; k++) {
            if (!add_request(&in, &dq, indirect, &cursor, &sent[nsent], (uint16_t)nsent,
                             capacity)) {
                full = true;
                break;
            }
            nsent++;
        }
        vhd_drv_vq_publish(&dq);
        for (int round = 0; round < 64; round++) {
            int rc = ops->queue_process(q, 1 + (get8(&in) & 7));
            drain(q);
            if (rc < 0) {
                broken = true;
                break;
            }
            if (rc == 0)
                break;
        }
        vhd_vq_flush(&q->vq);
        (void)vhd_vq_need_notify(&q->vq);

        void *cookie;
        uint32_t len;
        int rc;
        while ((rc = vhd_drv_vq_get_used(&dq, &cookie, &len)) == 1) {
            uintptr_t id = (uintptr_t)cookie - 1;
            FUZZ_CHECK(id < nsent);
            struct sent *s = &sent[id];
            FUZZ_CHECK(s->queued && !s->done);
            s->done = true;
            FUZZ_CHECK(len <= s->wlen);
            if (len && s->status_known) {
                uint8_t st = fuzz_gread8(&gm, s->status_gpa);
                FUZZ_CHECK(st == VIRTIO_BLK_S_OK || st == VIRTIO_BLK_S_IOERR ||
                           st == VIRTIO_BLK_S_UNSUPP);
            }
            if (len == 0 && s->status_known && s->wlen)
                FUZZ_CHECK(0); /* a chain with a status byte always gets a status */
        }
        FUZZ_CHECK(rc == 0);
        if (nsent == QSIZE)
            break;
    }
    FUZZ_CHECK(q->inflight_io == 0);

    struct vhd_blk_queue_stats st;
    FUZZ_CHECK(vhd_blk_queue_stats(q, &st) == 0);
    FUZZ_CHECK(st.status_ok + st.status_ioerr + st.status_unsupp == st.completed);
    if (!broken && !q->vq.error) {
        /* nothing broke: every queued chain came back */
        for (unsigned i = 0; i < nsent; i++)
            FUZZ_CHECK(sent[i].done);
    }
    if (di == 1)
        FUZZ_CHECK(st.bytes_written == 0); /* read-only */
    if (getenv("FUZZ_BLK_VERBOSE"))        /* for checking what a seed exercises */
        fprintf(stderr,
                "dev %u%s%s: %u sent, %llu completed (ok %llu ioerr %llu unsupp %llu), "
                "bad chains %llu, broken %d/%d, r %llu w %llu f %llu id %llu d %llu wz %llu\n",
                di, packed ? " packed" : "", indirect ? " indirect" : "", nsent,
                (unsigned long long)st.completed, (unsigned long long)st.status_ok,
                (unsigned long long)st.status_ioerr, (unsigned long long)st.status_unsupp,
                (unsigned long long)st.bad_chains, st.broken, q->vq.error,
                (unsigned long long)st.reads, (unsigned long long)st.writes,
                (unsigned long long)st.flushes, (unsigned long long)st.get_ids,
                (unsigned long long)st.discards, (unsigned long long)st.write_zeroes);
    if (memfd[di] >= 0) {
        struct stat sb;
        FUZZ_CHECK(fstat(memfd[di], &sb) == 0 && sb.st_size == IMG_SIZE);
    }

    ops->queue_fini(dev, q);
    q->worker = NULL;
    vhd_drv_vq_fini(&dq);
    ops->reset(dev);
    return 0;
}
