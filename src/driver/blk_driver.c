/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The userspace virtio-blk driver (public API in include/vhostd/blk_driver.h):
 * shared-memory layout, session set-up over the vhost-user front-end
 * (vu_frontend.c) and its end/restart, per-queue request slots and buffer
 * pools, request building (virtio 1.2, 5.2.6), submission with kick
 * suppression, and completion by polling or by the call eventfd.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "util/bits.h"
#include "util/clock.h"
#include "util/compiler.h"
#include "spec/virtio.h"
#include "spec/virtio_blk.h"
#include "driver/drv_iommu.h"
#include "driver/drv_session.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "driver/vu_frontend.h"
#include "spec/vhost_user.h"
#include "vhostd/blk_driver.h"

#define DEFAULT_QUEUE_SIZE 256u
#define DEFAULT_POOL_SIZE  (4ull << 20)
#define MAX_QUEUES         64u
#define POOL_PAGE          4096u
#define PAGE_ALIGN(v)      (((v) + POOL_PAGE - 1) & ~(uint64_t)(POOL_PAGE - 1))
/* Guest-physical address of the first region: above 0, like a VM's RAM, so GPA 0 is never valid. */
#define GPA_BASE 0x100000ull
/* Descriptors of one request: header + data segments + status. */
#define MAX_REQ_DESCS (VHD_BLKDRV_MAX_SEGS + 2u)
/*
 * Indirect tables are reserved for MAX_REQ_DESCS entries whatever is
 * negotiated, so a reconnect that negotiates differently fits the same
 * layout.
 */
#define AREA_INDIRECT MAX_REQ_DESCS
/* Status value the device never writes: the request is not finished. */
#define STATUS_NONE 0xffu
/* While draining before a stop, pause between looks at the used rings (us). */
#define DRAIN_PAUSE_US 100

/* What a request slot holds in shared memory: one cache line per slot. */
struct blkdrv_shared {
    struct virtio_blk_outhdr hdr; /* device-readable header */
    union {
        struct virtio_blk_discard_write_zeroes seg; /* DISCARD / WRITE_ZEROES range */
        uint8_t id[VIRTIO_BLK_ID_BYTES];            /* GET_ID answer */
    } u;
    uint8_t pad0[8];
    uint8_t status; /* device-writable status byte */
    uint8_t pad1[15];
};
_Static_assert(sizeof(struct blkdrv_shared) == 64, "one cache line per request slot");

enum req_state {
    REQ_FREE,     /* on the free list */
    REQ_RING,     /* in the ring, the device owns it */
    REQ_DEFERRED, /* finished (or lost) during a reconnect; in the deferred list */
};

/* Driver-private state of one request slot (host memory, owner thread only). */
struct blkdrv_req {
    void *cookie;
    char *id_out;   /* GET_ID: caller's destination */
    uint32_t next;  /* free list link / deferred list link */
    uint32_t len;   /* DEFERRED: used length */
    int16_t forced; /* DEFERRED: 0, or -ECONNRESET when the device never completed it */
    uint8_t state;  /* enum req_state */
    uint8_t nmaps; /* IOMMU: data buffers mapped for the request (IOVAs in the queue's slot_iova) */
};

#define NO_SLOT UINT32_MAX

/*
 * One queue. Allocated on its own cache lines, like its slot array and pool
 * bitmap; written only by the owner thread, and by control calls while the
 * owner is quiescent (API contract). The ring bookkeeping that vring.c
 * allocates (dq.slots, dq.id_next) comes from plain calloc: the ends of
 * those arrays may share a line with another queue's (false sharing, never
 * a correctness issue).
 */
struct vhd_blkdrv_queue {
    struct vhd_drv_vq dq;
    struct blkdrv_req *reqs;      /* nslots */
    struct blkdrv_shared *shared; /* nslots, in shared memory */
    uint64_t shared_gpa;
    uint32_t nslots;
    uint32_t free_head;                    /* slot free list */
    uint32_t inflight;                     /* slots not free */
    uint32_t deferred_head, deferred_tail; /* FIFO of DEFERRED slots */
    bool plugged;
    bool broken;   /* the device broke the ring protocol */
    bool dead;     /* no session (a reconnect failed) */
    bool indirect; /* copy of what was negotiated */
    uint32_t max_indirect;
    uint32_t seg_max;
    uint32_t size_max;
    uint64_t features;
    int kick_fd;
    int call_fd;
    uint32_t index;
    /*
     * The ring outlived its session (the session had negotiated
     * INFLIGHT_SHMFD): its memory and outstanding requests are kept as they
     * are for the next session to resume, from resume_base.
     */
    bool held;
    uint32_t resume_base; /* SET_VRING_BASE value for the resumed ring */

    /* shared memory carved for this queue */
    void *area;
    uint64_t area_gpa;
    size_t area_len;
    uint8_t *pool;
    uint64_t pool_gpa;
    uint64_t pool_pages;
    uint64_t *pool_map; /* bit set: page in use */

    const struct vhd_guestmem *gm; /* read-only after connect */
    struct vhd_blkdrv_queue_stats stats;

    /*
     * The driver as the IOMMU (NULL: off). The ring area and the slots are
     * mapped for good (area_gpa then holds an IOVA, shared_iova the slots');
     * data buffers while their request is in flight, MAX_REQ_DESCS IOVAs
     * per slot in slot_iova.
     */
    struct vhd_drv_iommu *io;
    uint64_t shared_iova;
    uint64_t pool_iova; /* opts.iommu_static: the pool's IOVA (else 0) */
    uint64_t *slot_iova;
    uint8_t data_perm_read, data_perm_write; /* a read's buffers (device writes) / a write's */
} vhd_cacheline_aligned;

struct vhd_blkdrv {
    struct vhd_blkdrv_opts o;
    char *path;
    struct vhd_guestmem gm;
    struct vhd_vuf vuf;
    bool connected;
    /*
     * The inflight area (INFLIGHT_SHMFD), fetched with GET_INFLIGHT_FD by the
     * first session that negotiates it and given to every later one, so
     * that a back-end restarted after a crash finds the requests its
     * predecessor had taken from the rings. Zeroed whenever the rings are
     * laid out afresh: its content describes the rings as they are.
     */
    struct vhd_vuf_inflight inflight;
    struct vhd_blkdrv_info info;
    struct vhd_blkdrv_queue *q[MAX_QUEUES];
    bool iommu; /* opts.iommu_page_size: io is set up (for this one session) */
    struct vhd_drv_iommu io;
    int backend_fd; /* our end of the back-end channel (the IOMMU's misses), or -1 */
    char err[256];
};

static int dfail(struct vhd_blkdrv *d, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int dfail(struct vhd_blkdrv *d, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->err, sizeof(d->err), fmt, ap);
    va_end(ap);
    return rc;
}

/* ======================= shared memory layout ======================= */

static size_t ring_area_bytes(const struct vhd_blkdrv_opts *o)
{
    return (size_t)PAGE_ALIGN(vhd_drv_vq_area_size(o->queue_size, o->packed, AREA_INDIRECT));
}

/* Shared bytes of a queue besides its pool: rings and indirect tables, request slots. */
static uint64_t queue_fixed_bytes(const struct vhd_blkdrv_opts *o)
{
    return ring_area_bytes(o) + PAGE_ALIGN((uint64_t)o->queue_size * sizeof(struct blkdrv_shared));
}

/*
 * Queue i lives in region i % nregions: ring area, slots, pool, each page
 * aligned. Every region has the same size. Sets *region_size and *pool.
 */
static int plan_memory(struct vhd_blkdrv *d, uint64_t *region_size, uint64_t *pool)
{
    const struct vhd_blkdrv_opts *o = &d->o;
    uint32_t per_region = (o->num_queues + o->mem_regions - 1) / o->mem_regions;
    uint64_t fixed = queue_fixed_bytes(o);

    if (o->mem_size == 0) {
        *pool = PAGE_ALIGN(o->pool_size);
        *region_size = per_region * (fixed + *pool);
        return 0;
    }
    uint64_t rs = (o->mem_size / o->mem_regions) & ~(uint64_t)(POOL_PAGE - 1);
    if (rs < per_region * (fixed + POOL_PAGE))
        return dfail(d, -ENOMEM,
                     "mem_size %llu too small: each of %u regions needs at least %llu bytes",
                     (unsigned long long)o->mem_size, o->mem_regions,
                     (unsigned long long)(per_region * (fixed + POOL_PAGE)));
    *region_size = rs;
    *pool = ((rs / per_region) - fixed) & ~(uint64_t)(POOL_PAGE - 1);
    return 0;
}

/* Translate our pointer into shared memory to a gpa; UINT64_MAX when outside. */
static uint64_t hva_to_gpa(const struct vhd_guestmem *gm, const void *p, uint64_t *avail)
{
    uintptr_t a = (uintptr_t)p;
    for (uint32_t i = 0; i < gm->nregions; i++) {
        uintptr_t base = (uintptr_t)gm->r[i].hva;
        if (a >= base && a - base < gm->r[i].size) {
            *avail = gm->r[i].size - (a - base);
            return gm->r[i].gpa + (a - base);
        }
    }
    return UINT64_MAX;
}

/* ======================= buffer pool ======================= */

static bool pool_test(const struct vhd_blkdrv_queue *q, uint64_t pg)
{
    return (q->pool_map[pg / 64] >> (pg % 64)) & 1;
}

static void pool_mark(struct vhd_blkdrv_queue *q, uint64_t first, uint64_t n, bool used)
{
    for (uint64_t pg = first; pg < first + n; pg++) {
        if (used)
            q->pool_map[pg / 64] |= 1ull << (pg % 64);
        else
            q->pool_map[pg / 64] &= ~(1ull << (pg % 64));
    }
}

/* First fit over the page bitmap: allocation is set-up work, not per-I/O. */
void *vhd_blkdrv_buf_alloc(struct vhd_blkdrv_queue *q, size_t len)
{
    if (len == 0 || len > q->pool_pages * POOL_PAGE)
        return NULL;
    uint64_t need = PAGE_ALIGN(len) / POOL_PAGE, run = 0;
    for (uint64_t pg = 0; pg < q->pool_pages; pg++) {
        if (run == 0 && (pg % 64) == 0 && q->pool_map[pg / 64] == UINT64_MAX) {
            pg += 63; /* a full word: skip it */
            continue;
        }
        if (pool_test(q, pg)) {
            run = 0;
            continue;
        }
        if (++run == need) {
            uint64_t first = pg + 1 - need;
            pool_mark(q, first, need, true);
            return q->pool + first * POOL_PAGE;
        }
    }
    return NULL;
}

void vhd_blkdrv_buf_free(struct vhd_blkdrv_queue *q, void *buf, size_t len)
{
    if (!buf || len == 0)
        return;
    uintptr_t off = (uintptr_t)buf - (uintptr_t)q->pool;
    if ((uintptr_t)buf < (uintptr_t)q->pool || off % POOL_PAGE ||
        off / POOL_PAGE + PAGE_ALIGN(len) / POOL_PAGE > q->pool_pages)
        return; /* not from this pool: ignore rather than corrupt the map */
    pool_mark(q, off / POOL_PAGE, PAGE_ALIGN(len) / POOL_PAGE, false);
}

/* ======================= request slots ======================= */

static void slots_reset(struct vhd_blkdrv_queue *q)
{
    for (uint32_t i = 0; i < q->nslots; i++) {
        q->reqs[i].state = REQ_FREE;
        q->reqs[i].next = i + 1 < q->nslots ? i + 1 : NO_SLOT;
    }
    q->free_head = 0;
    q->inflight = 0;
    q->deferred_head = q->deferred_tail = NO_SLOT;
}

static void slot_free(struct vhd_blkdrv_queue *q, uint32_t s)
{
    q->reqs[s].state = REQ_FREE;
    q->reqs[s].next = q->free_head;
    q->free_head = s;
    q->inflight--;
}

static void deferred_push(struct vhd_blkdrv_queue *q, uint32_t s, uint32_t len, int forced)
{
    struct blkdrv_req *r = &q->reqs[s];
    r->state = REQ_DEFERRED;
    r->len = len;
    r->forced = (int16_t)forced;
    r->next = NO_SLOT;
    if (q->deferred_tail == NO_SLOT)
        q->deferred_head = s;
    else
        q->reqs[q->deferred_tail].next = s;
    q->deferred_tail = s;
}

/* Turn a finished slot into a completion for the caller and free it. */
/*
 * IOMMU: the device is done with the request's data buffers: unmap them
 * (strict: INVALIDATE acked before the completion is returned). After the
 * session ended its IOTLB is gone with it: nothing to send.
 */
static void slot_unmap(struct vhd_blkdrv_queue *q, uint32_t s)
{
    struct blkdrv_req *r = &q->reqs[s];
    if (q->io && !q->dead)
        for (uint32_t k = 0; k < r->nmaps; k++)
            if (vhd_drv_iommu_unmap(q->io, q->slot_iova[(size_t)s * MAX_REQ_DESCS + k]) < 0)
                q->broken = true; /* the session is gone or the back-end refuses its IOTLB */
    r->nmaps = 0;
}

static void slot_complete(struct vhd_blkdrv_queue *q, uint32_t s, uint32_t len, int forced,
                          struct vhd_blkdrv_completion *c)
{
    struct blkdrv_req *r = &q->reqs[s];
    /* Read after the used element's acquire (vring get_used): the device's write is visible. */
    uint8_t st = q->shared[s].status;

    c->cookie = r->cookie;
    c->len = len;
    c->status = st;
    if (forced)
        c->ret = forced;
    else if (st == VIRTIO_BLK_S_OK)
        c->ret = 0;
    else if (st == VIRTIO_BLK_S_IOERR)
        c->ret = -EIO;
    else if (st == VIRTIO_BLK_S_UNSUPP)
        c->ret = -ENOTSUP;
    else
        c->ret = -EPROTO;
    if (c->ret == 0 && r->id_out)
        memcpy(r->id_out, q->shared[s].u.id, VIRTIO_BLK_ID_BYTES);
    slot_unmap(q, s);
    slot_free(q, s);
}

/* ======================= submission ======================= */

static inline void kick(struct vhd_blkdrv_queue *q)
{
    uint64_t one = 1;
    /* An eventfd write fails only when the counter would overflow: the device is signalled anyway.
     */
    ssize_t n = write(q->kick_fd, &one, sizeof(one));
    (void)n;
    q->stats.kicks++;
}

static inline void publish_and_kick(struct vhd_blkdrv_queue *q)
{
    vhd_drv_vq_publish(&q->dq);
    if (vhd_drv_vq_kick_needed(&q->dq))
        kick(q);
}

/*
 * Append the gpa segments of [p, p + len) to bufs: one per region crossed
 * and per size_max piece. -EFAULT outside shared memory, -EINVAL when more
 * than max segments.
 */
static int add_segments(const struct vhd_blkdrv_queue *q, const void *p, size_t len,
                        struct vhd_drv_buf *bufs, unsigned *n, unsigned max)
{
    const uint8_t *a = p;
    while (len) {
        uint64_t avail, gpa;
        /* Fast path: the queue's own pool. */
        if (a >= q->pool && (uint64_t)(a - q->pool) < q->pool_pages * POOL_PAGE) {
            avail = q->pool_pages * POOL_PAGE - (uint64_t)(a - q->pool);
            gpa = q->pool_gpa + (uint64_t)(a - q->pool);
        } else {
            gpa = hva_to_gpa(q->gm, a, &avail);
            if (gpa == UINT64_MAX)
                return -EFAULT;
        }
        uint64_t chunk = len < avail ? len : avail;
        if (q->size_max && chunk > q->size_max)
            chunk = q->size_max;
        if (chunk > UINT32_MAX)
            chunk = (uint64_t)UINT32_MAX & ~(uint64_t)(VIRTIO_BLK_SECTOR_SIZE - 1);
        if (*n >= max)
            return -EINVAL;
        bufs[*n].gpa = gpa;
        bufs[*n].len = (uint32_t)chunk;
        (*n)++;
        a += chunk;
        len -= chunk;
    }
    return 0;
}

/*
 * IOMMU: replace the GPAs of bufs[1..ndata] by IOVAs. Those inside the slots
 * (DISCARD ranges, GET_ID answers) are mapped already; the others are mapped
 * now, for slot s, with the access the device needs. -EFAULT for a buffer
 * outside the shared memory, -EIO when the back-end refused an UPDATE (the
 * queue is then broken), -ENOSPC when the IOVA window is full.
 */
static int iommu_map_data(struct vhd_blkdrv_queue *q, uint32_t s, struct vhd_drv_buf *bufs,
                          unsigned ndata, bool data_writable)
{
    struct blkdrv_req *r = &q->reqs[s];
    uint64_t shared_len = (uint64_t)q->nslots * sizeof(struct blkdrv_shared);
    uint8_t perm = data_writable ? q->data_perm_read : q->data_perm_write;

    r->nmaps = 0;
    for (unsigned i = 1; i <= ndata; i++) {
        uint64_t gpa = bufs[i].gpa;
        if (gpa >= q->shared_gpa && gpa - q->shared_gpa < shared_len) {
            bufs[i].gpa = q->shared_iova + (gpa - q->shared_gpa);
            continue;
        }
        if (q->pool_iova && gpa >= q->pool_gpa &&
            gpa - q->pool_gpa < q->pool_pages * POOL_PAGE) { /* mapped for good */
            bufs[i].gpa = q->pool_iova + (gpa - q->pool_gpa);
            continue;
        }
        void *hva = vhd_guestmem_ptr(q->gm, gpa, bufs[i].len);
        uint64_t iova;
        int rc = hva ? vhd_drv_iommu_map(q->io, hva, bufs[i].len, perm, &iova) : -EFAULT;
        if (rc < 0) {
            if (rc != -EFAULT && rc != -ENOSPC)
                q->broken = true;
            slot_unmap(q, s);
            return rc == -EFAULT || rc == -ENOSPC ? rc : -EIO;
        }
        q->slot_iova[(size_t)s * MAX_REQ_DESCS + r->nmaps++] = iova;
        bufs[i].gpa = iova;
    }
    return 0;
}

/*
 * Queue one request: header (type, sector) in the slot, nr device-readable
 * then nw device-writable buffers from bufs[1..], the status byte last.
 * bufs[0] and the status entry are filled here.
 */
static int submit_req(struct vhd_blkdrv_queue *q, uint32_t type, uint64_t sector,
                      struct vhd_drv_buf *bufs, unsigned ndata, bool data_writable, char *id_out,
                      void *cookie)
{
    if (vhd_unlikely(q->dead))
        return -ENOTCONN;
    if (vhd_unlikely(q->broken))
        return -EIO;
    uint32_t s = q->free_head;
    if (s == NO_SLOT)
        return -EAGAIN;

    struct blkdrv_shared *sh = &q->shared[s];
    struct blkdrv_req *r = &q->reqs[s];
    if (q->io) {
        int rc = iommu_map_data(q, s, bufs, ndata, data_writable);
        if (rc < 0)
            return rc;
    }
    sh->hdr.type = vhd_le32(type);
    sh->hdr.reserved = 0;
    sh->hdr.sector = vhd_le64(sector);
    sh->status = STATUS_NONE;
    uint64_t sh_gpa = (q->io ? q->shared_iova : q->shared_gpa) + (uint64_t)s * sizeof(*sh);
    bufs[0].gpa = sh_gpa + offsetof(struct blkdrv_shared, hdr);
    bufs[0].len = sizeof(sh->hdr);
    bufs[ndata + 1].gpa = sh_gpa + offsetof(struct blkdrv_shared, status);
    bufs[ndata + 1].len = 1;

    uint32_t n = ndata + 2;
    uint32_t nr = data_writable ? 1 : 1 + ndata;
    bool ind = q->indirect && n <= q->max_indirect;
    int rc = vhd_drv_vq_add(&q->dq, bufs, nr, n - nr, ind, r);
    if (rc < 0) {
        slot_unmap(q, s);
        return rc == -ENOSPC ? -EAGAIN : rc;
    }

    q->free_head = r->next;
    r->state = REQ_RING;
    r->cookie = cookie;
    r->id_out = id_out;
    q->inflight++;
    q->stats.submitted++;
    if (!q->plugged)
        publish_and_kick(q);
    return 0;
}

static int submit_rw(struct vhd_blkdrv_queue *q, bool write, uint64_t offset,
                     const struct iovec *iov, unsigned iovcnt, void *cookie)
{
    struct vhd_drv_buf bufs[MAX_REQ_DESCS];
    unsigned n = 1; /* bufs[0] is the header */
    uint64_t total = 0;

    if (offset % VIRTIO_BLK_SECTOR_SIZE)
        return -EINVAL;
    for (unsigned i = 0; i < iovcnt; i++) {
        if (iov[i].iov_len == 0)
            continue;
        total += iov[i].iov_len;
        int rc = add_segments(q, iov[i].iov_base, iov[i].iov_len, bufs, &n, q->seg_max + 1);
        if (rc < 0)
            return rc;
    }
    if (total == 0 || total % VIRTIO_BLK_SECTOR_SIZE || total > UINT32_MAX)
        return -EINVAL;
    return submit_req(q, write ? VIRTIO_BLK_T_OUT : VIRTIO_BLK_T_IN,
                      offset >> VIRTIO_BLK_SECTOR_SHIFT, bufs, n - 1, !write, NULL, cookie);
}

int vhd_blkdrv_submit_readv(struct vhd_blkdrv_queue *q, uint64_t offset, const struct iovec *iov,
                            unsigned iovcnt, void *cookie)
{
    return submit_rw(q, false, offset, iov, iovcnt, cookie);
}

int vhd_blkdrv_submit_writev(struct vhd_blkdrv_queue *q, uint64_t offset, const struct iovec *iov,
                             unsigned iovcnt, void *cookie)
{
    return submit_rw(q, true, offset, iov, iovcnt, cookie);
}

int vhd_blkdrv_submit_read(struct vhd_blkdrv_queue *q, uint64_t offset, void *buf, size_t len,
                           void *cookie)
{
    struct iovec v = {.iov_base = buf, .iov_len = len};
    return submit_rw(q, false, offset, &v, 1, cookie);
}

int vhd_blkdrv_submit_write(struct vhd_blkdrv_queue *q, uint64_t offset, const void *buf,
                            size_t len, void *cookie)
{
    struct iovec v = {.iov_base = (void *)buf, .iov_len = len};
    return submit_rw(q, true, offset, &v, 1, cookie);
}

int vhd_blkdrv_submit_flush(struct vhd_blkdrv_queue *q, void *cookie)
{
    struct vhd_drv_buf bufs[2];
    if (!(q->features & BIT(VIRTIO_BLK_F_FLUSH)))
        return -ENOTSUP;
    return submit_req(q, VIRTIO_BLK_T_FLUSH, 0, bufs, 0, false, NULL, cookie);
}

/* DISCARD / WRITE_ZEROES: one segment (5.2.6), device-readable, in the slot. */
static int submit_range(struct vhd_blkdrv_queue *q, uint32_t type, uint64_t offset, uint64_t len,
                        uint32_t flags, void *cookie)
{
    struct vhd_drv_buf bufs[3];
    unsigned feature =
        type == VIRTIO_BLK_T_DISCARD ? VIRTIO_BLK_F_DISCARD : VIRTIO_BLK_F_WRITE_ZEROES;
    if (!(q->features & BIT(feature)))
        return -ENOTSUP;
    if (offset % VIRTIO_BLK_SECTOR_SIZE || len % VIRTIO_BLK_SECTOR_SIZE || len == 0 ||
        (len >> VIRTIO_BLK_SECTOR_SHIFT) > UINT32_MAX)
        return -EINVAL;
    uint32_t s = q->free_head;
    if (s == NO_SLOT)
        return -EAGAIN;
    struct virtio_blk_discard_write_zeroes *seg = &q->shared[s].u.seg;
    seg->sector = vhd_le64(offset >> VIRTIO_BLK_SECTOR_SHIFT);
    seg->num_sectors = vhd_le32((uint32_t)(len >> VIRTIO_BLK_SECTOR_SHIFT));
    seg->flags = vhd_le32(flags);
    bufs[1].gpa = q->shared_gpa + (uint64_t)s * sizeof(struct blkdrv_shared) +
                  offsetof(struct blkdrv_shared, u.seg);
    bufs[1].len = sizeof(*seg);
    return submit_req(q, type, 0, bufs, 1, false, NULL, cookie);
}

int vhd_blkdrv_submit_discard(struct vhd_blkdrv_queue *q, uint64_t offset, uint64_t len,
                              void *cookie)
{
    return submit_range(q, VIRTIO_BLK_T_DISCARD, offset, len, 0, cookie);
}

int vhd_blkdrv_submit_write_zeroes(struct vhd_blkdrv_queue *q, uint64_t offset, uint64_t len,
                                   bool unmap, void *cookie)
{
    return submit_range(q, VIRTIO_BLK_T_WRITE_ZEROES, offset, len,
                        unmap ? VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP : 0, cookie);
}

int vhd_blkdrv_submit_get_id(struct vhd_blkdrv_queue *q, char *id, void *cookie)
{
    struct vhd_drv_buf bufs[3];
    uint32_t s = q->free_head;
    if (!id)
        return -EINVAL;
    if (s == NO_SLOT)
        return -EAGAIN;
    bufs[1].gpa = q->shared_gpa + (uint64_t)s * sizeof(struct blkdrv_shared) +
                  offsetof(struct blkdrv_shared, u.id);
    bufs[1].len = VIRTIO_BLK_ID_BYTES;
    return submit_req(q, VIRTIO_BLK_T_GET_ID, 0, bufs, 1, true, id, cookie);
}

void vhd_blkdrv_plug(struct vhd_blkdrv_queue *q)
{
    q->plugged = true;
}

void vhd_blkdrv_unplug(struct vhd_blkdrv_queue *q)
{
    q->plugged = false;
    if (!q->dead)
        publish_and_kick(q);
}

/* ======================= completion ======================= */

/* Move every used element of the ring into the deferred list (control calls only). */
static int reap_to_deferred(struct vhd_blkdrv_queue *q)
{
    for (;;) {
        void *ck;
        uint32_t len;
        int rc = vhd_drv_vq_get_used(&q->dq, &ck, &len);
        if (rc <= 0)
            return rc;
        deferred_push(q, (uint32_t)((struct blkdrv_req *)ck - q->reqs), len, 0);
    }
}

int vhd_blkdrv_poll(struct vhd_blkdrv_queue *q, struct vhd_blkdrv_completion *c, unsigned max)
{
    unsigned n = 0;

    while (n < max && q->deferred_head != NO_SLOT) {
        uint32_t s = q->deferred_head;
        struct blkdrv_req *r = &q->reqs[s];
        q->deferred_head = r->next;
        if (q->deferred_head == NO_SLOT)
            q->deferred_tail = NO_SLOT;
        slot_complete(q, s, r->len, r->forced, &c[n++]);
    }
    while (n < max && !q->dead) {
        void *ck;
        uint32_t len;
        int rc = vhd_drv_vq_get_used(&q->dq, &ck, &len);
        if (rc == 0)
            break;
        if (vhd_unlikely(rc < 0)) {
            q->broken = true;
            if (n)
                break;
            return -EIO;
        }
        /* ck is one of our slots: vring only returns cookies of requests in flight. */
        slot_complete(q, (uint32_t)((struct blkdrv_req *)ck - q->reqs), len, 0, &c[n++]);
    }
    q->stats.completed += n;
    return (int)n;
}

/*
 * Interrupt-driven completion. The classic race: the device may finish a
 * request between our last look and our request for a notification, and
 * skip the notification because we had asked for none. enable_cb's barrier
 * plus its re-check closes it: either the device sees the request and
 * signals the call eventfd, or enable_cb sees the used element.
 * Notifications are disabled again after each wake-up so a caller that
 * mixes poll and wait does not keep the device signalling.
 */
int vhd_blkdrv_wait(struct vhd_blkdrv_queue *q, struct vhd_blkdrv_completion *c, unsigned max,
                    int timeout_ms)
{
    int64_t deadline = timeout_ms >= 0 ? (int64_t)vhd_now_ms() + timeout_ms : 0;

    for (;;) {
        int n = vhd_blkdrv_poll(q, c, max);
        if (n != 0)
            return n;
        if (q->inflight == 0 || max == 0)
            return 0;
        if (q->dead)
            return -ENOTCONN;
        if (vhd_drv_vq_enable_cb(&q->dq)) {
            vhd_drv_vq_disable_cb(&q->dq);
            continue;
        }
        int left = -1;
        if (timeout_ms >= 0) {
            int64_t l = deadline - (int64_t)vhd_now_ms();
            if (l <= 0) {
                vhd_drv_vq_disable_cb(&q->dq);
                return -ETIMEDOUT;
            }
            left = (int)l;
        }
        struct pollfd p = {.fd = q->call_fd, .events = POLLIN};
        q->stats.sleeps++;
        int rc = poll(&p, 1, left);
        vhd_drv_vq_disable_cb(&q->dq);
        if (rc < 0 && errno != EINTR)
            return -errno;
        if (rc > 0) {
            uint64_t v;
            /* Clear the eventfd; EAGAIN if another reader raced us (there is none). */
            ssize_t r = read(q->call_fd, &v, sizeof(v));
            (void)r;
        }
    }
}

unsigned vhd_blkdrv_inflight(const struct vhd_blkdrv_queue *q)
{
    return q->inflight;
}

void vhd_blkdrv_queue_stats(const struct vhd_blkdrv_queue *q, struct vhd_blkdrv_queue_stats *s)
{
    *s = q->stats;
}

uint32_t vhd_blkdrv_queue_index(const struct vhd_blkdrv_queue *q)
{
    return q->index;
}

/* ======================= session ======================= */

/* Features we implement (virtio 1.2, 5.2.3 and 6). */
static uint64_t wanted_features(const struct vhd_blkdrv_opts *o)
{
    uint64_t f = BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_BLK_F_SIZE_MAX) | BIT(VIRTIO_BLK_F_SEG_MAX) |
                 BIT(VIRTIO_BLK_F_BLK_SIZE) | BIT(VIRTIO_BLK_F_TOPOLOGY) | BIT(VIRTIO_BLK_F_FLUSH) |
                 BIT(VIRTIO_BLK_F_RO) | BIT(VIRTIO_BLK_F_MQ) | BIT(VIRTIO_BLK_F_DISCARD) |
                 BIT(VIRTIO_BLK_F_WRITE_ZEROES);
    if (!o->no_event_idx)
        f |= BIT(VIRTIO_F_EVENT_IDX);
    if (!o->no_indirect)
        f |= BIT(VIRTIO_F_INDIRECT_DESC);
    if (o->packed)
        f |= BIT(VIRTIO_F_RING_PACKED);
    return f;
}

/*
 * Read the config space. QEMU 7.2's vhost-user-blk export refuses reads
 * longer than its struct (60 bytes, without the secure-erase fields), others
 * may be shorter still: try 60, then the fields up to num_queues, then the
 * capacity alone.
 */
static int read_config(struct vhd_blkdrv *d, struct virtio_blk_config *cfg)
{
    static const uint32_t sizes[] = {offsetof(struct virtio_blk_config, max_secure_erase_sectors),
                                     offsetof(struct virtio_blk_config, max_discard_sectors),
                                     sizeof(uint64_t)};
    int rc = -EIO;
    memset(cfg, 0, sizeof(*cfg));
    for (size_t i = 0; i < VHD_ARRAY_SIZE(sizes); i++) {
        rc = vhd_vuf_get_config(&d->vuf, 0, cfg, sizes[i]);
        if (rc != -EIO || !vhd_vuf_alive(&d->vuf))
            break;
    }
    if (rc < 0)
        return dfail(d, rc, "config space: %s", vhd_vuf_strerror(&d->vuf));
    return 0;
}

static void fill_info(struct vhd_blkdrv *d, uint64_t f, const struct virtio_blk_config *cfg)
{
    struct vhd_blkdrv_info *in = &d->info;
    memset(in, 0, sizeof(*in));
    in->features = f;
    in->capacity = vhd_le64(cfg->capacity) << VIRTIO_BLK_SECTOR_SHIFT;
    in->blk_size = (f & BIT(VIRTIO_BLK_F_BLK_SIZE)) && vhd_le32(cfg->blk_size)
                       ? vhd_le32(cfg->blk_size)
                       : VIRTIO_BLK_SECTOR_SIZE;
    in->size_max = (f & BIT(VIRTIO_BLK_F_SIZE_MAX)) ? vhd_le32(cfg->size_max) : 0;
    uint32_t seg_max = VHD_BLKDRV_MAX_SEGS;
    if ((f & BIT(VIRTIO_BLK_F_SEG_MAX)) && vhd_le32(cfg->seg_max) &&
        vhd_le32(cfg->seg_max) < seg_max)
        seg_max = vhd_le32(cfg->seg_max);
    /* Without indirect a request's descriptors must fit the ring. */
    if (!(f & BIT(VIRTIO_F_INDIRECT_DESC)) && seg_max + 2 > d->o.queue_size)
        seg_max = d->o.queue_size > 2 ? d->o.queue_size - 2 : 1;
    in->seg_max = seg_max;
    in->device_queues = (f & BIT(VIRTIO_BLK_F_MQ)) ? vhd_le16(cfg->num_queues) : 1;
    if (in->device_queues == 0)
        in->device_queues = 1;
    in->num_queues = d->o.num_queues;
    in->queue_size = d->o.queue_size;
    in->indirect = (f & BIT(VIRTIO_F_INDIRECT_DESC)) != 0;
    in->max_inflight = in->indirect ? d->o.queue_size : d->o.queue_size / 3;
    if (in->max_inflight == 0)
        in->max_inflight = 1;
    in->read_only = (f & BIT(VIRTIO_BLK_F_RO)) != 0;
    in->flush = (f & BIT(VIRTIO_BLK_F_FLUSH)) != 0;
    in->discard = (f & BIT(VIRTIO_BLK_F_DISCARD)) != 0;
    if (in->discard) {
        in->max_discard_sectors = vhd_le32(cfg->max_discard_sectors);
        in->max_discard_seg = vhd_le32(cfg->max_discard_seg);
        in->discard_sector_alignment = vhd_le32(cfg->discard_sector_alignment);
    }
    in->write_zeroes = (f & BIT(VIRTIO_BLK_F_WRITE_ZEROES)) != 0;
    if (in->write_zeroes) {
        in->max_write_zeroes_sectors = vhd_le32(cfg->max_write_zeroes_sectors);
        in->max_write_zeroes_seg = vhd_le32(cfg->max_write_zeroes_seg);
        in->write_zeroes_may_unmap = cfg->write_zeroes_may_unmap != 0;
    }
    in->packed = (f & BIT(VIRTIO_F_RING_PACKED)) != 0;
    in->event_idx = (f & BIT(VIRTIO_F_EVENT_IDX)) != 0;
    in->reply_ack = vhd_vuf_has_proto(&d->vuf, VHOST_USER_PROTOCOL_F_REPLY_ACK);
    in->inflight = vhd_vuf_has_proto(&d->vuf, VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD);
}

/*
 * Start a queue's ring on the back-end. A held ring (resume) is started as
 * it is, from its resume base, its outstanding requests left in place;
 * otherwise the ring is laid out afresh (zeroed) with what was negotiated.
 */
static int queue_start(struct vhd_blkdrv *d, struct vhd_blkdrv_queue *q, bool resume)
{
    const struct vhd_blkdrv_info *in = &d->info;
    int rc;

    q->seg_max = in->seg_max;
    q->size_max = in->size_max;
    q->features = in->features;
    if (resume) {
        /* The indirect tables keep the stride the ring was laid out with. */
        q->max_indirect = in->indirect ? in->seg_max + 2 : 0;
        if (q->max_indirect > q->dq.max_indirect)
            q->max_indirect = q->dq.max_indirect;
    } else {
        vhd_drv_vq_fini(&q->dq);
        q->indirect = in->indirect;
        q->max_indirect = in->indirect ? in->seg_max + 2 : 0;
        struct vhd_drv_vq_params p = {.size = in->queue_size,
                                      .packed = in->packed,
                                      .event_idx = in->event_idx,
                                      .max_indirect = q->max_indirect,
                                      .area = q->area,
                                      .area_gpa = q->area_gpa,
                                      .area_len = q->area_len};
        rc = vhd_drv_vq_init(&q->dq, &p);
        if (rc < 0)
            return dfail(d, rc, "queue %u: ring set-up: %s", q->index, strerror(-rc));
        /* No notifications until someone waits (vhd_blkdrv_wait). */
        vhd_drv_vq_disable_cb(&q->dq);
        q->broken = false;
        q->plugged = false;
        q->resume_base = vhd_drv_ring_fresh_base(in->packed);
    }
    vhd_drv_drain_eventfd(q->call_fd);
    if (d->iommu) /* the miss thread answers on the same session */
        vhd_drv_iommu_lock(&d->io);
    rc = vhd_drv_ring_announce(&d->vuf, d->iommu ? NULL : &d->gm, &q->dq, q->index, q->resume_base,
                               q->kick_fd, q->call_fd);
    if (d->iommu)
        vhd_drv_iommu_unlock(&d->io);
    if (rc < 0)
        return dfail(d, rc, "%s", vhd_vuf_strerror(&d->vuf));
    q->dead = false;
    return 0;
}

/*
 * Where a ring resumes when its back-end gave no GET_VRING_BASE answer (it
 * died): where the device's used ring stands, as QEMU does it (split:
 * last_avail_idx := used->idx; packed: the used position, for the avail
 * half too). The new back-end resubmits from the inflight area what its
 * predecessor had taken beyond that and not completed. Call after reaping.
 */
static uint32_t ring_used_base(const struct vhd_blkdrv_queue *q)
{
    if (!q->dq.packed)
        return q->dq.last_used_idx;
    uint32_t pos = q->dq.last_used | (q->dq.used_wrap ? 0x8000u : 0);
    return pos | pos << 16;
}

/*
 * Can this session resume the held rings? It needs INFLIGHT_SHMFD (the new
 * back-end finds in the area what its predecessor had taken from the rings)
 * and the features that shape the rings as they were. All queues or none:
 * the area's per-queue layout is the back-end's, so it can only be reset
 * as a whole.
 */
static bool can_resume(const struct vhd_blkdrv *d)
{
    const uint64_t shape =
        BIT(VIRTIO_F_RING_PACKED) | BIT(VIRTIO_F_EVENT_IDX) | BIT(VIRTIO_F_INDIRECT_DESC);

    if (!vhd_vuf_has_proto(&d->vuf, VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD) || d->inflight.fd < 0)
        return false;
    for (uint32_t i = 0; i < d->o.num_queues; i++) {
        const struct vhd_blkdrv_queue *q = d->q[i];
        if (!q->held || q->broken || ((q->features ^ d->info.features) & shape))
            return false;
    }
    return true;
}

/*
 * The rings are to be laid out afresh: requests still outstanding in held
 * rings are given up (-ECONNRESET, in slot order), and the inflight area is
 * zeroed so that it describes no request (the back-end then initialises it).
 */
static void release_held(struct vhd_blkdrv *d)
{
    for (uint32_t i = 0; i < d->o.num_queues; i++) {
        struct vhd_blkdrv_queue *q = d->q[i];
        if (!q->held)
            continue;
        for (uint32_t s = 0; s < q->nslots; s++)
            if (q->reqs[s].state == REQ_RING)
                deferred_push(q, s, 0, -ECONNRESET);
        q->held = false;
    }
    if (d->inflight.addr)
        memset(d->inflight.addr, 0, d->inflight.mmap_size);
}

/*
 * The driver as the IOMMU, after SET_MEM_TABLE: the table, the back-end
 * channel and its miss thread (misses may come as soon as a ring is
 * announced: DPDK translates rings at SET_VRING_KICK), then every ring area
 * and slot array mapped read-write for good (coherent memory, as Linux's
 * dma_alloc_coherent) at IOVAs that replace their GPAs.
 */
static int iommu_setup(struct vhd_blkdrv *d)
{
    const struct vhd_blkdrv_opts *o = &d->o;
    int rc = vhd_drv_iommu_start(&d->io, &d->vuf, &d->gm, o->iommu_page_size, o->iommu_strict,
                                 o->iommu_batch, &d->backend_fd, -1, d->err, sizeof(d->err));
    if (rc < 0)
        return rc;
    d->iommu = true;
    for (uint32_t i = 0; i < o->num_queues && rc == 0; i++) {
        struct vhd_blkdrv_queue *q = d->q[i];
        rc = vhd_drv_iommu_map(&d->io, q->area, q->area_len, VHOST_ACCESS_RW, &q->area_gpa);
        if (rc == 0)
            rc = vhd_drv_iommu_map(&d->io, q->shared,
                                   (uint64_t)q->nslots * sizeof(struct blkdrv_shared),
                                   VHOST_ACCESS_RW, &q->shared_iova);
        q->io = &d->io;
        q->data_perm_read = o->iommu_exact_perms ? VHOST_ACCESS_WO : VHOST_ACCESS_RW;
        q->data_perm_write = o->iommu_exact_perms ? VHOST_ACCESS_RO : VHOST_ACCESS_RW;
    }
    if (rc < 0)
        return dfail(d, rc, "IOMMU mapping of the rings: %s", vhd_drv_iommu_reason(&d->io, rc));
    return 0;
}

/* A new session on a new connection: negotiate, read config, memory table, start the rings. */
static int session_open(struct vhd_blkdrv *d)
{
    struct vhd_vuf *f = &d->vuf;
    struct virtio_blk_config cfg;
    const struct vhd_blkdrv_opts *o = &d->o;

    uint64_t want_proto = BIT(VHOST_USER_PROTOCOL_F_MQ) | BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK) |
                          BIT(VHOST_USER_PROTOCOL_F_CONFIG);
    if (o->iommu_page_size)
        want_proto |= BIT(VHOST_USER_PROTOCOL_F_BACKEND_REQ);
    if (!o->no_inflight)
        want_proto |= BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD);

    const struct vhd_drv_session_params sp = {.path = d->path,
                                              .listen = o->listen,
                                              .timeout_ms = o->timeout_ms,
                                              .want_proto = want_proto,
                                              .packed = o->packed};
    int rc = vhd_drv_session_open(f, &sp, d->err, sizeof(d->err));
    if (rc < 0)
        goto fail;
    if (o->iommu_page_size) {
        rc = vhd_drv_iommu_check_peer(f, d->err, sizeof(d->err));
        if (rc < 0)
            goto fail;
    }
    uint64_t feat = f->offered & wanted_features(o);
    if (o->iommu_page_size)
        feat |= BIT(VIRTIO_F_ACCESS_PLATFORM); /* offered: checked above */
    if (o->num_queues > 1 && !(feat & BIT(VIRTIO_BLK_F_MQ))) {
        rc = dfail(d, -ENOTSUP, "%u queues asked for, but the device has one (no VIRTIO_BLK_F_MQ)",
                   o->num_queues);
        goto fail;
    }
    if (o->num_queues > f->queue_num) {
        rc = dfail(d, -ENOTSUP, "%u queues asked for, the back-end serves %u (GET_QUEUE_NUM)",
                   o->num_queues, f->queue_num);
        goto fail;
    }
    rc = read_config(d, &cfg);
    if (rc < 0)
        goto fail;
    fill_info(d, feat, &cfg);
    d->info.pool_size = d->q[0]->pool_pages * POOL_PAGE;
    if (o->num_queues > d->info.device_queues) {
        rc = dfail(d, -ENOTSUP, "%u queues asked for, the device has %u (config num_queues)",
                   o->num_queues, d->info.device_queues);
        goto fail;
    }
    bool resume = can_resume(d);
    if (!resume)
        release_held(d);
    rc = vhd_vuf_set_features(f, feat);
    /*
     * As QEMU's vhost-user-blk: features first (the area's layout depends on
     * the ring layout), GET_INFLIGHT_FD once, SET_INFLIGHT_FD every session,
     * before the memory table and the rings.
     */
    if (rc == 0 && d->info.inflight && d->inflight.fd < 0)
        rc = vhd_vuf_get_inflight_fd(f, (uint16_t)o->num_queues, (uint16_t)o->queue_size,
                                     &d->inflight);
    if (rc == 0 && d->info.inflight)
        rc = vhd_vuf_set_inflight_fd(f, &d->inflight);
    if (rc == 0)
        rc = vhd_vuf_set_mem_table(f, &d->gm);
    if (rc < 0)
        goto fail_vuf;
    d->info.iommu_page_size = o->iommu_page_size;
    if (o->iommu_page_size) {
        rc = iommu_setup(d);
        if (rc < 0)
            goto fail;
    }
    for (uint32_t i = 0; i < o->num_queues; i++) {
        rc = queue_start(d, d->q[i], resume);
        if (rc < 0)
            goto fail;
    }
    rc = vhd_vuf_sync(f);
    if (rc < 0)
        goto fail_vuf;
    if (d->iommu && vhd_drv_iommu_replay(&d->io) < 0) {
        rc = dfail(d, -EIO, "%s", vhd_drv_iommu_strerror(&d->io));
        goto fail;
    }
    /* Static pools after the replay (the rings exist now): each page is sent once. */
    for (uint32_t i = 0; d->iommu && o->iommu_static && i < o->num_queues; i++) {
        struct vhd_blkdrv_queue *q = d->q[i];
        rc = vhd_drv_iommu_map_paged(&d->io, q->pool, q->pool_pages * POOL_PAGE, VHOST_ACCESS_RW,
                                     &q->pool_iova);
        if (rc < 0) {
            dfail(d, rc, "IOMMU mapping of queue %u's pool: %s", i,
                  vhd_drv_iommu_reason(&d->io, rc));
            goto fail;
        }
    }
    for (uint32_t i = 0; i < o->num_queues; i++)
        d->q[i]->held = false;
    /*
     * A resumed ring may hold requests made available while no back-end ran:
     * kick, so the back-end looks at the ring (it resubmits what its area
     * says was in flight on its own).
     */
    if (resume)
        for (uint32_t i = 0; i < o->num_queues; i++)
            kick(d->q[i]);
    d->connected = true;
    d->err[0] = 0;
    return 0;

fail_vuf:
    dfail(d, rc, "%s", vhd_vuf_strerror(f));
fail:
    vhd_drv_iommu_fini(&d->io); /* its thread may use the session: it goes first */
    vhd_vuf_close(f);
    for (uint32_t i = 0; i < o->num_queues; i++) {
        struct vhd_blkdrv_queue *q = d->q[i];
        /*
         * Held rings stay held for the next attempt. This back-end may have
         * run some of them before the session failed: collect what it
         * completed and resume from there.
         */
        if (q->held && !q->dead && !q->broken) {
            if (reap_to_deferred(q) < 0)
                q->broken = true;
            else
                q->resume_base = ring_used_base(q);
        }
        q->dead = true;
    }
    return rc;
}

/*
 * End the session. Wait (bounded) for the device to finish what is in
 * flight, stop each ring (GET_VRING_BASE: the back-end completes its
 * requests first) and collect what was completed into the deferred lists.
 * What never was: with INFLIGHT_SHMFD negotiated the ring is held as it is
 * (its requests stay outstanding and the next session resumes it, see
 * can_resume); without, those requests are marked -ECONNRESET and the ring
 * may be laid out afresh.
 * The drain comes before the stop because not every back-end finishes its
 * requests inside GET_VRING_BASE (libvhost-user, under qemu-storage-daemon,
 * answers at once): one that completes after the stop would write into the
 * restarted rings. After the drain's timeout that risk remains, as it does
 * for any driver whose device ignores a reset.
 */
static void session_end(struct vhd_blkdrv *d)
{
    const struct vhd_blkdrv_opts *o = &d->o;
    bool alive = vhd_vuf_alive(&d->vuf);
    bool keep = d->info.inflight && d->inflight.fd >= 0;
    uint32_t base[MAX_QUEUES];
    bool stopped[MAX_QUEUES] = {false};

    if (alive) {
        int64_t deadline = (int64_t)vhd_now_ms() + o->timeout_ms;
        for (;;) {
            bool pending = false;
            for (uint32_t i = 0; i < o->num_queues; i++) {
                struct vhd_blkdrv_queue *q = d->q[i];
                if (q->dead || q->broken)
                    continue;
                vhd_drv_vq_publish(&q->dq); /* a plugged batch still goes out */
                if (vhd_drv_vq_kick_needed(&q->dq))
                    kick(q);
                if (reap_to_deferred(q) < 0)
                    q->broken = true;
                else if (vhd_drv_vq_inflight(&q->dq))
                    pending = true;
            }
            if (!pending || (int64_t)vhd_now_ms() >= deadline || !vhd_vuf_alive(&d->vuf))
                break;
            usleep(DRAIN_PAUSE_US);
        }
        for (uint32_t i = 0; i < o->num_queues; i++) {
            if (d->q[i]->dead)
                continue;
            if (d->iommu)
                vhd_drv_iommu_lock(&d->io);
            int src = vhd_vuf_ring_stop(&d->vuf, i, &base[i]);
            if (d->iommu)
                vhd_drv_iommu_unlock(&d->io);
            if (src < 0)
                break; /* the session is gone or refusing: nothing more to stop */
            stopped[i] = true;
        }
    }
    /* The IOTLB ends with the session (the miss thread before the socket). */
    vhd_drv_iommu_fini(&d->io);
    vhd_vuf_close(&d->vuf);
    for (uint32_t i = 0; i < o->num_queues; i++) {
        struct vhd_blkdrv_queue *q = d->q[i];
        bool live = !q->dead;
        if (live && !q->broken && reap_to_deferred(q) < 0)
            q->broken = true;
        if (keep && live && !q->broken) {
            q->held = true;
            q->resume_base = stopped[i] ? base[i] : ring_used_base(q);
            for (uint32_t s = 0; s < q->nslots; s++)
                q->stats.carried += q->reqs[s].state == REQ_RING;
        } else if (!q->held) {
            for (uint32_t s = 0; s < q->nslots; s++)
                if (q->reqs[s].state == REQ_RING)
                    deferred_push(q, s, 0, -ECONNRESET);
        }
        q->dead = true;
    }
    d->connected = false;
}

/* ======================= connect / disconnect ======================= */

static void queue_free(struct vhd_blkdrv_queue *q)
{
    if (!q)
        return;
    vhd_drv_vq_fini(&q->dq);
    if (q->kick_fd >= 0)
        close(q->kick_fd);
    if (q->call_fd >= 0)
        close(q->call_fd);
    free(q->reqs);
    free(q->pool_map);
    free(q->slot_iova);
    free(q);
}

static void drv_free(struct vhd_blkdrv *d)
{
    for (uint32_t i = 0; i < MAX_QUEUES; i++)
        queue_free(d->q[i]);
    vhd_drv_iommu_fini(&d->io);
    if (d->backend_fd >= 0)
        close(d->backend_fd);
    vhd_vuf_close(&d->vuf);
    vhd_vuf_inflight_release(&d->inflight);
    vhd_guestmem_fini(&d->gm);
    free(d->path);
    free(d);
}

/* Carve queue i's part of its region: ring area, slots, pool. */
static int queue_new(struct vhd_blkdrv *d, uint32_t i, uint64_t pool, uint64_t *region_off)
{
    const struct vhd_blkdrv_opts *o = &d->o;
    struct vhd_blkdrv_queue *q;
    size_t qbytes = (sizeof(*q) + VHD_CACHELINE - 1) & ~(size_t)(VHD_CACHELINE - 1);

    if (posix_memalign((void **)&q, VHD_CACHELINE, qbytes))
        return -ENOMEM;
    memset(q, 0, qbytes);
    q->kick_fd = q->call_fd = -1;
    d->q[i] = q;
    q->index = i;
    q->gm = &d->gm;
    q->nslots = o->queue_size;
    q->dead = true;

    uint32_t reg = i % o->mem_regions;
    struct vhd_guestmem_region *r = &d->gm.r[reg];
    uint64_t off = region_off[reg];
    q->area = r->hva + off;
    q->area_gpa = r->gpa + off;
    q->area_len = ring_area_bytes(o);
    off += q->area_len;
    q->shared = (struct blkdrv_shared *)(void *)(r->hva + off);
    q->shared_gpa = r->gpa + off;
    off += PAGE_ALIGN((uint64_t)q->nslots * sizeof(struct blkdrv_shared));
    q->pool = r->hva + off;
    q->pool_gpa = r->gpa + off;
    q->pool_pages = pool / POOL_PAGE;
    off += pool;
    if (off > r->size)
        return -ENOMEM; /* plan_memory's arithmetic says this cannot happen */
    region_off[reg] = off;

    /* Slot arrays and the bitmap: cache-line multiples so no line is shared with another queue. */
    size_t rbytes =
        ((size_t)q->nslots * sizeof(*q->reqs) + VHD_CACHELINE - 1) & ~(size_t)(VHD_CACHELINE - 1);
    size_t mbytes =
        (((q->pool_pages + 63) / 64) * 8 + VHD_CACHELINE - 1) & ~(size_t)(VHD_CACHELINE - 1);
    if (posix_memalign((void **)&q->reqs, VHD_CACHELINE, rbytes) ||
        posix_memalign((void **)&q->pool_map, VHD_CACHELINE, mbytes))
        return -ENOMEM;
    memset(q->reqs, 0, rbytes);
    memset(q->pool_map, 0, mbytes);
    if (o->iommu_page_size) {
        q->slot_iova = calloc((size_t)q->nslots * MAX_REQ_DESCS, sizeof(*q->slot_iova));
        if (!q->slot_iova)
            return -ENOMEM;
    }
    slots_reset(q);

    q->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    q->call_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (q->kick_fd < 0 || q->call_fd < 0)
        return -errno;
    return 0;
}

int vhd_blkdrv_connect(const struct vhd_blkdrv_opts *opts, struct vhd_blkdrv **out, char *err,
                       size_t errlen)
{
    struct vhd_blkdrv *d = calloc(1, sizeof(*d));
    int rc;

    if (err && errlen)
        err[0] = 0;
    if (!d) {
        if (err && errlen)
            snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    vhd_vuf_init(&d->vuf, opts->timeout_ms);
    vhd_vuf_inflight_init(&d->inflight);
    d->backend_fd = -1;
    d->o = *opts;
    struct vhd_blkdrv_opts *o = &d->o;
    if (!o->num_queues)
        o->num_queues = 1;
    if (!o->queue_size)
        o->queue_size = DEFAULT_QUEUE_SIZE;
    if (!o->mem_regions)
        o->mem_regions = 1;
    if (!o->pool_size)
        o->pool_size = DEFAULT_POOL_SIZE;
    if (o->timeout_ms <= 0)
        o->timeout_ms = VHD_VUF_DEFAULT_TIMEOUT_MS;

    rc = vhd_drv_check_opts(o->socket_path, "num_queues", o->num_queues, MAX_QUEUES, o->queue_size,
                            o->packed, &d->path, d->err, sizeof(d->err));
    if (rc < 0)
        goto fail;
    o->socket_path = d->path;
    if (o->mem_regions > VHD_GUESTMEM_MAX_REGIONS ||
        o->mem_regions > VHOST_USER_MEM_TABLE_MAX_REGIONS) {
        rc = dfail(d, -EINVAL, "mem_regions %u: 1..%u", o->mem_regions,
                   VHOST_USER_MEM_TABLE_MAX_REGIONS);
        goto fail;
    }

    rc = vhd_drv_iommu_check_opts(o->iommu_page_size, d->err, sizeof(d->err));
    if (rc < 0)
        goto fail;

    uint64_t region_size = 0, pool = 0;
    rc = plan_memory(d, &region_size, &pool);
    if (rc < 0)
        goto fail;
    /* With the IOMMU, whole pages of a region are mapped: aligned to and sized in them. */
    uint64_t align = o->iommu_page_size;
    if (align)
        region_size = (region_size + align - 1) & ~(align - 1);
    rc = vhd_guestmem_init_aligned(&d->gm, o->mem_regions, region_size, GPA_BASE, 0, align);
    if (rc < 0) {
        dfail(d, rc, "shared memory (%u x %llu bytes): %s", o->mem_regions,
              (unsigned long long)region_size, strerror(-rc));
        goto fail;
    }
    uint64_t region_off[VHD_GUESTMEM_MAX_REGIONS] = {0};
    for (uint32_t i = 0; i < o->num_queues; i++) {
        rc = queue_new(d, i, pool, region_off);
        if (rc < 0) {
            dfail(d, rc, "queue %u: %s", i, strerror(-rc));
            goto fail;
        }
    }
    rc = session_open(d);
    if (rc < 0)
        goto fail;
    *out = d;
    return 0;

fail:
    if (err && errlen)
        snprintf(err, errlen, "%s", d->err[0] ? d->err : strerror(-rc));
    drv_free(d);
    return rc;
}

void vhd_blkdrv_disconnect(struct vhd_blkdrv *d)
{
    if (!d)
        return;
    if (d->connected)
        session_end(d);
    drv_free(d);
}

int vhd_blkdrv_reconnect(struct vhd_blkdrv *d)
{
    if (d->o.iommu_page_size)
        return dfail(d, -ENOTSUP, "reconnect: not with the IOMMU on (opts.iommu_page_size)");
    if (d->connected)
        session_end(d);
    /* Slots parked in the deferred lists stay parked; the rings restart empty. */
    return session_open(d);
}

bool vhd_blkdrv_session_alive(const struct vhd_blkdrv *d)
{
    return d->connected && vhd_vuf_alive(&d->vuf);
}

const char *vhd_blkdrv_errmsg(const struct vhd_blkdrv *d)
{
    return d->err;
}

const struct vhd_blkdrv_info *vhd_blkdrv_get_info(const struct vhd_blkdrv *d)
{
    return &d->info;
}

uint64_t vhd_blkdrv_capacity(const struct vhd_blkdrv *d)
{
    return d->info.capacity;
}

struct vhd_blkdrv_queue *vhd_blkdrv_get_queue(struct vhd_blkdrv *d, uint32_t i)
{
    return i < d->o.num_queues ? d->q[i] : NULL;
}

int vhd_blkdrv_iommu_stats(struct vhd_blkdrv *d, struct vhd_blkdrv_iommu_stats *s)
{
    struct vhd_drv_iommu_stats st;
    if (!d->iommu || !d->connected)
        return -ENOTSUP;
    vhd_drv_iommu_get_stats(&d->io, &st);
    s->updates = st.updates;
    s->invalidates = st.invalidates;
    s->misses = st.misses;
    s->misses_bad = st.misses_bad;
    s->mapped = st.mapped;
    return 0;
}
