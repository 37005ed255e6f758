/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The shared memory a session maps from the front-end (vu_conn_int.h): the
 * memory table (SET_MEM_TABLE, ADD_MEM_REG, REM_MEM_REG, within the caps of
 * mem.h), the inflight area (GET/SET_INFLIGHT_FD) and the dirty log
 * (SET_LOG_BASE).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <linux/magic.h> /* HUGETLBFS_MAGIC */

#include "core/dirtylog.h"
#include "core/inflight.h"
#include "core/memguard.h"
#include "runtime/log.h"
#include "runtime/numa.h"
#include "runtime/rt.h"
#include "vu_conn_int.h"

/* Do q's rings (as the engine will map them) lie inside mem? Front-end VAs. */
static bool queue_rings_in(const struct vhd_queue *q, const struct vhd_mem *mem)
{
    uint64_t dlen, alen, ulen;

    if (!mem)
        return false;
    if (q->vq.packed) {
        dlen = 16ull * q->vq.size;
        alen = ulen = sizeof(struct vhd_vring_packed_event);
    } else {
        dlen = vhd_vring_desc_size(q->vq.size);
        alen = vhd_vring_avail_size(q->vq.size);
        ulen = vhd_vring_used_size(q->vq.size);
    }
    return vhd_mem_uva_to_hva(mem, q->vq.desc_addr, dlen) &&
           vhd_mem_uva_to_hva(mem, q->vq.avail_addr, alen) &&
           vhd_mem_uva_to_hva(mem, q->vq.used_addr, ulen);
}

/*
 * Install a new memory table: quiesce this device's queues, point every
 * started queue at the new table (its cached ring pointers are dropped and
 * re-translated on next use), free the old table once no worker holds it,
 * resume. Refused (-EBUSY) when a started ring would not be inside the new
 * table. Takes newmem (freed on failure).
 */
static int conn_swap_mem(struct vhd_vu_conn *c, struct vu_req *r, struct vhd_mem *newmem)
{
    struct vhd_dev *dev = c->dev;

    for (uint32_t i = 0; i < dev->num_queues; i++) {
        struct vhd_queue *q = &dev->queues[i];
        /* With an IOTLB the ring addresses are IOVAs, translated again after the flush. */
        if (q->started && !vhd_vu__iotlb_on(c) && !queue_rings_in(q, newmem)) {
            vhd_mem_free(newmem);
            r->why = "a started ring would be outside the new memory table";
            return -EBUSY;
        }
    }
    int rc = vhd_vu__dev_quiesce(c);
    if (rc < 0) {
        vhd_vu__dev_resume(c);
        vhd_mem_free(newmem);
        r->why = "queues did not stop";
        return rc;
    }
    /* IOTLB entries point into the old mappings: gone with them (the queues drop theirs). */
    vhd_vu__iotlb_flush(c);
    for (uint32_t i = 0; i < dev->num_queues; i++) {
        struct vhd_queue *q = &dev->queues[i];
        if (q->started)
            vhd_vq_set_mem(&q->vq, newmem);
    }
    struct vhd_mem *old = dev->mem;
    dev->mem = newmem;
    vhd_mem_free(old);
    vhd_vu__dev_resume(c);
    return 0;
}

/*
 * Which NUMA node the device's memory sits on, against its queues' workers
 * (numa.h). At a new table (last false) nothing may be resident yet: then
 * c->numa_pending asks the first ring start to report it (last true).
 */
void vhd_vu__report_numa(struct vhd_vu_conn *c, bool last)
{
    struct vhd_dev *dev = c->dev;
    struct vhd_numa_qplace *qw = calloc(dev->num_queues ? dev->num_queues : 1, sizeof(*qw));

    if (!qw)
        return; /* only a log line lost */
    for (uint32_t i = 0; i < dev->num_queues; i++) {
        qw[i].worker = vhd_vu__queue_worker_of(dev, i);
        qw[i].cpu = vhd_rt_worker_cpu(dev->rt, qw[i].worker);
        qw[i].node = vhd_rt_worker_node(dev->rt, qw[i].worker);
    }
    c->numa_pending = vhd_numa_report_mem(dev, qw, dev->num_queues, last) == 0 && !last;
    free(qw);
}

/* Drop the inflight area. No started ring may be using it. */
void vhd_vu__inflight_unmap(struct vhd_vu_conn *c)
{
    vhd_memguard_remove(c->inflight_guard);
    c->inflight_guard = -1;
    if (c->inflight)
        munmap(c->inflight, c->inflight_size);
    c->inflight = NULL;
    c->inflight_size = 0;
    c->inflight_num_queues = 0;
    c->inflight_queue_size = 0;
}

/* ---- handlers: memory ---- */

static void region_desc(const struct vu_mem_region *w, int fd, struct vhd_mem_region_desc *d)
{
    d->gpa = w->gpa;
    d->size = w->size;
    d->uva = w->uva;
    d->mmap_offset = w->mmap_offset;
    d->fd = fd;
}

static const char *mem_error(int rc)
{
    switch (rc) {
    case -EINVAL:
        return "invalid or overlapping memory regions";
    case -ENXIO:
        return "mmap offset and size beyond the end of the file";
    case -ENOENT:
        return "no such memory region";
    default:
        return "cannot map the memory regions";
    }
}

/* a + b, or UINT64_MAX when that wraps (sizes a front-end chose). */
static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/*
 * The caps on guest memory (mem.h) for a table of `bytes` that replaces the
 * device's current one: at most the device's cap, and with what every
 * other table maps, at most the process's. Checked before anything is
 * mapped. 0, or -E2BIG with r->why (the numbers are logged, rate-limited).
 */
static int conn_mem_cap(struct vhd_vu_conn *c, struct vu_req *r, uint64_t bytes)
{
    uint64_t dev_max = c->dev->max_mem ? c->dev->max_mem : VHD_MEM_DEV_MAX_DEFAULT;
    uint64_t total_max = vhd_mem_total_max();
    uint64_t mine = vhd_mem_bytes(c->dev->mem), all = vhd_mem_mapped();
    uint64_t others = all > mine ? all - mine : 0;

    if (bytes > dev_max) {
        r->why = "guest memory beyond the device's cap (max-guest-mem=)";
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: a memory table of %llu bytes exceeds the device's cap of %llu",
                   c->dev->name, (unsigned long long)bytes, (unsigned long long)dev_max);
        return -E2BIG;
    }
    if (bytes > total_max || others > total_max - bytes) {
        r->why = "guest memory beyond the daemon's cap (--max-guest-mem)";
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: a memory table of %llu bytes, with the %llu bytes other devices map, "
                   "exceeds the daemon's cap of %llu",
                   c->dev->name, (unsigned long long)bytes, (unsigned long long)others,
                   (unsigned long long)total_max);
        return -E2BIG;
    }
    return 0;
}

/*
 * SET_MEM_TABLE: map the regions (fds in region order, closed afterwards:
 * the mappings keep the memory) and swap the table in. Up to 8 regions
 * (the spec's region0..region7, one fd each), within the memory caps.
 */
int vhd_vu__set_mem_table(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_mem_table *m = &r->p->mem;
    struct vhd_mem_region_desc d[VHOST_USER_MEM_TABLE_MAX_REGIONS];
    struct vhd_mem *mem = NULL;

    uint64_t bytes = 0;
    for (uint32_t i = 0; i < m->nregions; i++) {
        region_desc(&m->regions[i], r->fds[i], &d[i]);
        bytes = add_sat(bytes, m->regions[i].size);
    }
    int rc = conn_mem_cap(c, r, bytes);
    if (rc < 0)
        return rc;
    rc = vhd_mem_new(d, m->nregions, &mem);
    if (rc < 0) {
        r->why = mem_error(rc);
        return rc;
    }
    rc = conn_swap_mem(c, r, mem);
    if (rc == 0) {
        vhd_log(VHD_LOG_INFO, "%s: memory table: %u regions", c->dev->name, m->nregions);
        vhd_vu__report_numa(c, false);
    }
    return rc;
}

int vhd_vu__get_max_mem_slots(struct vhd_vu_conn *c, struct vu_req *r)
{
    (void)c;
    r->reply.u64 = VHD_MEM_MAX_REGIONS;
    r->reply_size = sizeof(uint64_t);
    return 0;
}

/*
 * ADD_MEM_REG: the table plus one region (existing mappings are shared, not
 * remapped), within the memory caps.
 */
int vhd_vu__add_mem_reg(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_mem_region_desc d;
    struct vhd_mem *mem = NULL;

    if (c->dev->mem && c->dev->mem->nregions >= VHD_MEM_MAX_REGIONS) {
        r->why = "all memory slots are in use";
        return -ENOSPC;
    }
    region_desc(&r->p->mreg.region, r->fds[0], &d);
    int rc = conn_mem_cap(c, r, add_sat(vhd_mem_bytes(c->dev->mem), d.size));
    if (rc < 0)
        return rc;
    bool first = vhd_mem_bytes(c->dev->mem) == 0;
    rc = vhd_mem_add(c->dev->mem, &d, &mem);
    if (rc < 0) {
        r->why = mem_error(rc);
        return rc;
    }
    rc = conn_swap_mem(c, r, mem);
    if (rc == 0 && first)
        vhd_vu__report_numa(c, false); /* once per table, not once per region */
    return rc;
}

/*
 * REM_MEM_REG: identified by guest address, user address and size; "the mmap
 * offset is ignored"; an fd, if any, is closed unused (generic code). The
 * spec does not say what happens to a started ring inside the region; we
 * refuse (-EBUSY) rather than leave a running ring without memory.
 */
int vhd_vu__rem_mem_reg(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_mem_region *w = &r->p->mreg.region;
    struct vhd_mem *mem = NULL;

    int rc = vhd_mem_remove(c->dev->mem, w->gpa, w->size, w->uva, &mem);
    if (rc < 0) {
        r->why = mem_error(rc);
        return rc;
    }
    return conn_swap_mem(c, r, mem);
}

/* ---- handlers: inflight I/O tracking (INFLIGHT_SHMFD) ---- */

/* Check num_queues and queue_size of an inflight description against the device. */
static const char *inflight_shape_error(const struct vhd_vu_conn *c, const struct vu_inflight *in)
{
    if (in->num_queues == 0 || in->num_queues > c->dev->num_queues)
        return "inflight num_queues out of range";
    if (in->queue_size == 0 || in->queue_size > VHD_VQ_MAX_SIZE)
        return "inflight queue_size out of range";
    return NULL;
}

/*
 * The ring layout the area is sized for: the negotiated one, or, before
 * SET_FEATURES (QEMU asks for the area before it starts the device), packed
 * when it may still be negotiated: the packed region is the larger one, and
 * the layout is chosen per queue when it starts (queue_set_inflight).
 */
static bool inflight_packed(const struct vhd_vu_conn *c)
{
    if (c->features_set)
        return vhd_vu__feature_has(c, VIRTIO_F_RING_PACKED);
    return (vhd_vu_offered_features(c->dev) & BIT(VIRTIO_F_RING_PACKED)) != 0;
}

/*
 * GET_INFLIGHT_FD: a new zeroed area of num_queues regions of queue_size
 * records, in a sealed memfd (it can never shrink under a back-end that maps
 * it: no SIGBUS), sent with the reply; we keep no copy, SET_INFLIGHT_FD gives
 * it back. The message has no error form but mmap_size 0, which QEMU reads
 * as "no area": a refused request is answered that way (and logged).
 */
int vhd_vu__get_inflight_fd(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_inflight *in = &r->p->inflight;
    struct vu_inflight *out = &r->reply.inflight;
    const char *why = inflight_shape_error(c, in);
    int fd = -1, err = 0;

    memset(out, 0, sizeof(*out));
    out->num_queues = in->num_queues;
    out->queue_size = in->queue_size;
    r->reply_size = sizeof(*out);
    if (why)
        goto refuse;
    uint64_t size = in->num_queues * vhd_inflight_queue_size(inflight_packed(c), in->queue_size);
    fd = memfd_create("vhostd-inflight", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)size) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        why = "cannot allocate the inflight area";
        err = errno;
        goto refuse;
    }
    out->mmap_size = size;
    out->mmap_offset = 0;
    r->reply_fd = fd;
    vhd_log(VHD_LOG_INFO, "%s: inflight area: %u queues of %u, %llu bytes", c->dev->name,
            in->num_queues, in->queue_size, (unsigned long long)size);
    return 0;

refuse:
    VHD_LOG_RL(VHD_LOG_WARN, "%s: GET_INFLIGHT_FD (%u queues of %u) refused: %s%s%s", c->dev->name,
               in->num_queues, in->queue_size, why, err ? ": " : "", err ? strerror(err) : "");
    if (fd >= 0)
        close(fd);
    return 0;
}

/*
 * SET_INFLIGHT_FD: map the area the front-end gives back (its fd is closed
 * afterwards: the mapping keeps it). Checked: the shape (as GET), a size
 * between the split and the packed layout's need for it (mmap_size is
 * untrusted: that also caps it), a page-aligned offset, a regular file not
 * on hugetlbfs that holds the whole range (a shorter file would fault when
 * touched). Only
 * while every ring is stopped: nothing uses the previous area, which is
 * unmapped.
 */
int vhd_vu__set_inflight_fd(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_inflight *in = &r->p->inflight;
    struct statfs sfs;
    struct stat st;

    if (vhd_vu__any_ring_started(c->dev)) {
        r->why = "a ring is started";
        return -EBUSY;
    }
    r->why = inflight_shape_error(c, in);
    if (r->why)
        return -EINVAL;
    uint64_t min = in->num_queues * vhd_inflight_queue_size(false, in->queue_size);
    uint64_t max = in->num_queues * vhd_inflight_queue_size(true, in->queue_size);
    if (in->mmap_size < min || in->mmap_size > max) {
        r->why = in->mmap_size < min ? "inflight area too small for its queues"
                                     : "inflight area larger than its queues can use";
        return -EINVAL;
    }
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || (in->mmap_offset & ((uint64_t)page - 1)) ||
        in->mmap_offset > UINT64_MAX - in->mmap_size || in->mmap_offset > (uint64_t)INT64_MAX) {
        r->why = "bad inflight mmap offset";
        return -EINVAL;
    }
    if (fstat(r->fds[0], &st) < 0 || !S_ISREG(st.st_mode)) {
        r->why = "the inflight fd is not a regular file";
        return -ENODEV;
    }
    if (st.st_size < 0 || (uint64_t)st.st_size < in->mmap_offset + in->mmap_size) {
        r->why = "inflight area beyond the end of its file";
        return -ENXIO;
    }
    /*
     * Not on hugetlbfs (as the dirty log): the guard replaces lost memory in
     * units of the page size it is told, and a huge page cannot be replaced
     * by base pages, so a truncated hugetlbfs file would kill us. Our own
     * area is a plain memfd; a front-end has no reason to send another.
     */
    if (fstatfs(r->fds[0], &sfs) < 0 || (uint64_t)sfs.f_type == HUGETLBFS_MAGIC) {
        r->why = "the inflight area is on hugetlbfs";
        return -ENODEV;
    }
    void *p = mmap(NULL, in->mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, r->fds[0],
                   (off_t)in->mmap_offset);
    if (p == MAP_FAILED) {
        int err = -errno;
        r->why = "cannot map the inflight area";
        return err;
    }
    /*
     * An area that is not our sealed memfd could be truncated by the
     * front-end later: guard it like guest memory (memguard.h).
     */
    int guard = vhd_memguard_add(p, in->mmap_size, (size_t)page);
    if (guard < 0) {
        munmap(p, in->mmap_size);
        r->why = "cannot guard the inflight area";
        return guard;
    }
    vhd_vu__inflight_unmap(c);
    c->inflight_guard = guard;
    c->inflight = p;
    c->inflight_size = in->mmap_size;
    c->inflight_num_queues = in->num_queues;
    c->inflight_queue_size = in->queue_size;
    vhd_log(VHD_LOG_INFO, "%s: inflight area set: %u queues of %u", c->dev->name, in->num_queues,
            in->queue_size);
    return 0;
}

/* ---- handlers: dirty logging (LOG_SHMFD, spec "Migration") ---- */

/*
 * SET_LOG_BASE: map the front-end's dirty log (fd, mmap size and offset,
 * checked by vhd_dirtylog_map; the fd is closed afterwards, the mapping
 * keeps it) and swap it in: this device's queues are quiesced (their
 * in-flight requests complete and are logged into the old log), every
 * started queue is pointed at the new log, the queues resume, and only then
 * is the old log unmapped, when no worker can touch it. The reply (spec
 * "Communication": SET_LOG_BASE has one with LOG_SHMFD) is a u64: 0, or the
 * positive errno of a refusal, which leaves the previous log in place.
 * QEMU reads the reply without looking at it, and sends a log from its own
 * sealed memfd, which passes these checks.
 */
int vhd_vu__set_log_base(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_log *l = &r->p->log;
    struct vhd_dev *dev = c->dev;
    struct vhd_dirtylog *log = NULL;
    const char *why = "bad log";

    int rc = vhd_dirtylog_map(r->fds[0], l->size, l->offset, &log, &why);
    if (rc < 0) {
        r->why = why;
        return rc;
    }
    rc = vhd_vu__dev_quiesce(c);
    if (rc < 0) {
        vhd_vu__dev_resume(c);
        vhd_dirtylog_free(log);
        r->why = "queues did not stop";
        return rc;
    }
    struct vhd_dirtylog *old = c->log;
    c->log = log;
    for (uint32_t i = 0; i < dev->num_queues; i++)
        if (dev->queues[i].started)
            vhd_vu__queue_apply_log(c, &dev->queues[i]);
    vhd_vu__dev_resume(c);
    vhd_dirtylog_free(old);

    /* The spec wants a log "large enough to cover all known guest addresses". */
    uint64_t top = 0;
    for (uint32_t i = 0; dev->mem && i < dev->mem->nregions; i++) {
        const struct vhd_mem_region *reg = &dev->mem->regions[i];
        if (reg->gpa + reg->size > top)
            top = reg->gpa + reg->size;
    }
    uint64_t covers = l->size * 8 * VHD_DIRTYLOG_PAGE;
    if (top > covers)
        vhd_log(VHD_LOG_WARN,
                "%s: dirty log covers %llu bytes of guest memory, which reaches %llu: writes "
                "above are not logged",
                dev->name, (unsigned long long)covers, (unsigned long long)top);
    vhd_log(VHD_LOG_INFO, "%s: dirty log set: %llu bytes%s", dev->name, (unsigned long long)l->size,
            old ? " (replaces the previous one)" : "");
    r->reply.u64 = 0;
    r->reply_size = sizeof(uint64_t);
    return 0;
}
