/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The drivers' IOMMU (drv_iommu.h): IOVA allocation (sorted free extents,
 * first fit, coalesced on free), the sorted table of live mappings, the lazy
 * batch of unmapped ranges, and the thread answering the back-end's misses.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "transport/vu_sock.h"
#include "drv_iommu.h"

/*
 * Every mapping is followed by one IOVA page that is never mapped: a device
 * running past a buffer faults instead of reaching the next one, and a
 * back-end that treats an INVALIDATE's end as inclusive cannot drop a live
 * neighbour. DPDK's vhost does (lib/vhost/iotlb.c, cache_remove: it stops
 * only at an entry starting beyond iova + size, so the entry starting at
 * iova + size goes too): without the gap, strict invalidation of one buffer
 * evicts the next and the device misses on it (frames dropped).
 */
#define GUARD_PAGES 1u

/* ---- growable arrays ---- */

static int grow(void **arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap * 2 : 64;
    while (n < need)
        n *= 2;
    void *p = realloc(*arr, n * elem);
    if (!p)
        return -ENOMEM;
    *arr = p;
    *cap = n;
    return 0;
}

/* ---- IOVA allocator (pages relative to iova_base) ---- */

/* Index of the first free extent starting at or after page. */
static size_t free_pos(const struct vhd_drv_iommu *io, uint64_t page)
{
    size_t lo = 0, hi = io->nfree;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (io->free[mid].start < page)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Give pages [start, start + n) back, merging with the neighbours. */
static int iova_free(struct vhd_drv_iommu *io, uint64_t start, uint64_t n)
{
    size_t i = free_pos(io, start);
    bool join_prev = i > 0 && io->free[i - 1].start + io->free[i - 1].npages == start;
    bool join_next = i < io->nfree && start + n == io->free[i].start;

    if (join_prev && join_next) {
        io->free[i - 1].npages += n + io->free[i].npages;
        memmove(&io->free[i], &io->free[i + 1], (io->nfree - i - 1) * sizeof(io->free[0]));
        io->nfree--;
    } else if (join_prev) {
        io->free[i - 1].npages += n;
    } else if (join_next) {
        io->free[i].start = start;
        io->free[i].npages += n;
    } else {
        if (grow((void **)&io->free, &io->cap_free, io->nfree + 1, sizeof(io->free[0])) < 0)
            return -ENOMEM;
        memmove(&io->free[i + 1], &io->free[i], (io->nfree - i) * sizeof(io->free[0]));
        io->free[i] = (struct vhd_drv_iova_ext){start, n};
        io->nfree++;
    }
    return 0;
}

/* First fit: the start page of n free pages, or UINT64_MAX. */
static uint64_t iova_alloc(struct vhd_drv_iommu *io, uint64_t n)
{
    for (size_t i = 0; i < io->nfree; i++) {
        struct vhd_drv_iova_ext *e = &io->free[i];
        if (e->npages < n)
            continue;
        uint64_t start = e->start;
        e->start += n;
        e->npages -= n;
        if (e->npages == 0) {
            memmove(e, e + 1, (io->nfree - i - 1) * sizeof(*e));
            io->nfree--;
        }
        return start;
    }
    return UINT64_MAX;
}

/* A mapping's IOVA pages and its guard page (see GUARD_PAGES) go back. */
static int release_range(struct vhd_drv_iommu *io, const struct vhd_drv_iommu_map *m)
{
    return iova_free(io, (m->iova - io->p.iova_base) >> io->page_shift,
                     (m->size >> io->page_shift) + GUARD_PAGES);
}

/* ---- mapping table ---- */

/* Index of the mapping covering iova, or nmaps. */
static size_t map_find(const struct vhd_drv_iommu *io, uint64_t iova)
{
    size_t lo = 0, hi = io->nmaps;
    while (lo < hi) { /* first mapping starting after iova */
        size_t mid = lo + (hi - lo) / 2;
        if (io->maps[mid].iova <= iova)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == 0)
        return io->nmaps;
    const struct vhd_drv_iommu_map *m = &io->maps[lo - 1];
    return iova - m->iova < m->size ? lo - 1 : io->nmaps;
}

static int map_insert(struct vhd_drv_iommu *io, const struct vhd_drv_iommu_map *m)
{
    if (grow((void **)&io->maps, &io->cap_maps, io->nmaps + 1, sizeof(io->maps[0])) < 0)
        return -ENOMEM;
    size_t lo = 0, hi = io->nmaps;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (io->maps[mid].iova < m->iova)
            lo = mid + 1;
        else
            hi = mid;
    }
    memmove(&io->maps[lo + 1], &io->maps[lo], (io->nmaps - lo) * sizeof(io->maps[0]));
    io->maps[lo] = *m;
    io->nmaps++;
    return 0;
}

static void map_remove(struct vhd_drv_iommu *io, size_t i)
{
    memmove(&io->maps[i], &io->maps[i + 1], (io->nmaps - i - 1) * sizeof(io->maps[0]));
    io->nmaps--;
}

/* ---- messages ---- */

static int send_iotlb(struct vhd_drv_iommu *io, uint8_t type, const struct vhd_drv_iommu_map *m)
{
    struct vu_iotlb msg = {.iova = m->iova, .size = m->size, .type = type};
    if (type == VHOST_IOTLB_UPDATE) {
        msg.uva = m->uaddr;
        msg.perm = m->perm;
    }
    int rc = io->p.send(io->p.send_ctx, &msg);
    if (rc < 0) {
        snprintf(io->err, sizeof(io->err), "IOTLB %s of 0x%llx+0x%llx: %s",
                 type == VHOST_IOTLB_UPDATE ? "UPDATE" : "INVALIDATE", (unsigned long long)m->iova,
                 (unsigned long long)m->size, strerror(-rc));
        return rc;
    }
    if (type == VHOST_IOTLB_UPDATE)
        io->st.updates++;
    else
        io->st.invalidates++;
    return 0;
}

/* ---- public ---- */

int vhd_drv_iommu_init(struct vhd_drv_iommu *io, const struct vhd_drv_iommu_params *p)
{
    memset(io, 0, sizeof(*io));
    io->backend_fd = io->stop_fd = io->config_efd = -1;
    if (!p->send || p->page_size < 4096 || (p->page_size & (p->page_size - 1)))
        return -EINVAL;
    io->p = *p;
    if (!io->p.batch)
        io->p.batch = VHD_DRV_IOMMU_DEFAULT_BATCH;
    if (!io->p.iova_base)
        io->p.iova_base = VHD_DRV_IOVA_BASE;
    if (!io->p.iova_size)
        io->p.iova_size = VHD_DRV_IOVA_SIZE;
    if ((io->p.iova_base | io->p.iova_size) & (p->page_size - 1) ||
        io->p.iova_base + io->p.iova_size < io->p.iova_base)
        return -EINVAL;
    io->page_shift = (unsigned)__builtin_ctzll(p->page_size);
    if (pthread_mutex_init(&io->lock, NULL) != 0)
        return -ENOMEM;
    int rc = iova_free(io, 0, io->p.iova_size >> io->page_shift);
    if (rc < 0) {
        pthread_mutex_destroy(&io->lock);
        return rc;
    }
    return 0;
}

void vhd_drv_iommu_fini(struct vhd_drv_iommu *io)
{
    if (!io->p.send)
        return; /* never initialised, or already finished */
    if (io->thr_running) {
        uint64_t one = 1;
        ssize_t n = write(io->stop_fd, &one, sizeof(one));
        (void)n;
        pthread_join(io->thr, NULL);
        io->thr_running = false;
    }
    if (io->stop_fd >= 0)
        close(io->stop_fd);
    free(io->maps);
    free(io->pend);
    free(io->free);
    pthread_mutex_destroy(&io->lock);
    memset(io, 0, sizeof(*io));
    io->backend_fd = io->stop_fd = io->config_efd = -1;
}

int vhd_drv_iommu_add_region(struct vhd_drv_iommu *io, uint64_t uaddr, uint64_t size)
{
    if (io->nregs == VHD_DRV_IOMMU_MAX_REGIONS)
        return -E2BIG;
    if (size == 0 || uaddr + size < uaddr)
        return -EINVAL;
    io->reg_start[io->nregs] = uaddr;
    io->reg_end[io->nregs] = uaddr + size;
    io->nregs++;
    return 0;
}

/* UPDATE m, one message or (paged) one per page. On failure, what was sent is invalidated. */
static int send_update(struct vhd_drv_iommu *io, const struct vhd_drv_iommu_map *m)
{
    if (!m->paged)
        return send_iotlb(io, VHOST_IOTLB_UPDATE, m);
    for (uint64_t off = 0; off < m->size; off += io->p.page_size) {
        struct vhd_drv_iommu_map pg = {.iova = m->iova + off,
                                       .size = io->p.page_size,
                                       .uaddr = m->uaddr + off,
                                       .perm = m->perm};
        int rc = send_iotlb(io, VHOST_IOTLB_UPDATE, &pg);
        if (rc < 0) {
            struct vhd_drv_iommu_map sent = {.iova = m->iova, .size = off};
            if (off && send_iotlb(io, VHOST_IOTLB_INVALIDATE, &sent) < 0)
                return -EHOSTUNREACH; /* the back-end may still hold pages: keep the IOVAs */
            return rc;
        }
    }
    return 0;
}

static int map_common(struct vhd_drv_iommu *io, const void *addr, uint64_t len, uint8_t perm,
                      bool paged, uint64_t *iova)
{
    uint64_t a = (uint64_t)(uintptr_t)addr;
    uint64_t pmask = io->p.page_size - 1;
    int rc;

    if (len == 0 || perm < VHOST_ACCESS_RO || perm > VHOST_ACCESS_RW || a + len < a ||
        a + len + pmask < a + len)
        return -EINVAL;
    uint64_t start = a & ~pmask, end = (a + len + pmask) & ~pmask;
    bool inside = false;
    for (uint32_t i = 0; i < io->nregs && !inside; i++)
        inside = start >= io->reg_start[i] && end <= io->reg_end[i];
    if (!inside)
        return -EINVAL;
    uint64_t npages = (end - start) >> io->page_shift;

    pthread_mutex_lock(&io->lock);
    uint64_t page = iova_alloc(io, npages + GUARD_PAGES);
    if (page == UINT64_MAX) {
        rc = -ENOSPC;
        goto out;
    }
    struct vhd_drv_iommu_map m = {.iova = io->p.iova_base + (page << io->page_shift),
                                  .size = end - start,
                                  .uaddr = start,
                                  .perm = perm,
                                  .paged = paged};
    rc = map_insert(io, &m);
    if (rc == 0) {
        rc = send_update(io, &m);
        if (rc < 0) /* the back-end does not have it: forget it */
            map_remove(io, map_find(io, m.iova));
    }
    if (rc == -EHOSTUNREACH) {
        rc = -EIO; /* pages the back-end may still hold: their IOVAs stay allocated for good */
        goto out;
    }
    if (rc < 0) {
        (void)release_range(io, &m); /* merges back into what it was cut from: no allocation */
        goto out;
    }
    *iova = m.iova + (a - start);
out:
    pthread_mutex_unlock(&io->lock);
    return rc;
}

int vhd_drv_iommu_map(struct vhd_drv_iommu *io, const void *addr, uint64_t len, uint8_t perm,
                      uint64_t *iova)
{
    return map_common(io, addr, len, perm, false, iova);
}

int vhd_drv_iommu_map_paged(struct vhd_drv_iommu *io, const void *addr, uint64_t len, uint8_t perm,
                            uint64_t *iova)
{
    return map_common(io, addr, len, perm, true, iova);
}

/* INVALIDATE the pending ranges; the mutex is held. */
static int flush_locked(struct vhd_drv_iommu *io)
{
    size_t i = 0, done = 0;
    int rc = 0;

    if (io->npend == 0)
        return 0;
    /* Sort by IOVA (insertion sort: a batch is small and mostly in order already). */
    for (size_t k = 1; k < io->npend; k++) {
        struct vhd_drv_iommu_map t = io->pend[k];
        size_t j = k;
        for (; j > 0 && io->pend[j - 1].iova > t.iova; j--)
            io->pend[j] = io->pend[j - 1];
        io->pend[j] = t;
    }
    uint64_t guard = (uint64_t)GUARD_PAGES << io->page_shift;
    while (i < io->npend) {
        /*
         * One message for a run of ranges whose IOVA allocations are adjacent
         * (the guard pages between them included: never mapped); it ends at
         * the last range's end, before its guard page.
         */
        struct vhd_drv_iommu_map run = io->pend[i];
        size_t j = i + 1;
        while (j < io->npend && run.iova + run.size + guard == io->pend[j].iova) {
            run.size = io->pend[j].iova + io->pend[j].size - run.iova;
            j++;
        }
        rc = send_iotlb(io, VHOST_IOTLB_INVALIDATE, &run);
        if (rc < 0)
            break;
        for (size_t k = i; k < j; k++)
            if (release_range(io, &io->pend[k]) < 0)
                rc = -ENOMEM; /* that IOVA range is lost, never reused: safe */
        i = done = j;
    }
    memmove(io->pend, io->pend + done, (io->npend - done) * sizeof(io->pend[0]));
    io->npend -= done;
    io->st.flushes++;
    return rc;
}

int vhd_drv_iommu_unmap(struct vhd_drv_iommu *io, uint64_t iova)
{
    int rc;

    pthread_mutex_lock(&io->lock);
    size_t i = map_find(io, iova);
    if (i == io->nmaps) {
        rc = -ENOENT;
        goto out;
    }
    rc = grow((void **)&io->pend, &io->cap_pend, io->npend + 1, sizeof(io->pend[0]));
    if (rc < 0)
        goto out;
    io->pend[io->npend++] = io->maps[i];
    map_remove(io, i);
    if (io->p.strict || io->npend >= io->p.batch)
        rc = flush_locked(io);
out:
    pthread_mutex_unlock(&io->lock);
    return rc;
}

int vhd_drv_iommu_flush(struct vhd_drv_iommu *io)
{
    pthread_mutex_lock(&io->lock);
    int rc = flush_locked(io);
    pthread_mutex_unlock(&io->lock);
    return rc;
}

int vhd_drv_iommu_miss(struct vhd_drv_iommu *io, uint64_t iova, uint8_t perm)
{
    int rc = 0;

    pthread_mutex_lock(&io->lock);
    io->st.misses++;
    size_t i = map_find(io, iova);
    /* Not mapped, or not with the access asked for: the spec's invalid IOVA, no answer. */
    if (i == io->nmaps || (perm & ~io->maps[i].perm & VHOST_ACCESS_RW)) {
        io->st.misses_bad++;
        goto out;
    }
    struct vhd_drv_iommu_map m = io->maps[i];
    if (m.paged) { /* the page asked for, as it was sent */
        uint64_t off = (iova - m.iova) & ~(io->p.page_size - 1);
        m.iova += off;
        m.uaddr += off;
        m.size = io->p.page_size;
    }
    rc = send_iotlb(io, VHOST_IOTLB_UPDATE, &m);
    if (rc == 0)
        rc = 1;
out:
    pthread_mutex_unlock(&io->lock);
    return rc;
}

int vhd_drv_iommu_replay(struct vhd_drv_iommu *io)
{
    int rc = 0;
    pthread_mutex_lock(&io->lock);
    for (size_t i = 0; i < io->nmaps && rc == 0; i++) {
        rc = send_update(io, &io->maps[i]);
        if (rc == -EHOSTUNREACH)
            rc = -EIO;
    }
    pthread_mutex_unlock(&io->lock);
    return rc;
}

int vhd_drv_iommu_lookup(struct vhd_drv_iommu *io, uint64_t iova, struct vhd_drv_iommu_map *out)
{
    pthread_mutex_lock(&io->lock);
    size_t i = map_find(io, iova);
    int rc = i == io->nmaps ? -ENOENT : 0;
    if (rc == 0)
        *out = io->maps[i];
    pthread_mutex_unlock(&io->lock);
    return rc;
}

void vhd_drv_iommu_lock(struct vhd_drv_iommu *io)
{
    pthread_mutex_lock(&io->lock);
}

void vhd_drv_iommu_unlock(struct vhd_drv_iommu *io)
{
    pthread_mutex_unlock(&io->lock);
}

void vhd_drv_iommu_get_stats(struct vhd_drv_iommu *io, struct vhd_drv_iommu_stats *st)
{
    pthread_mutex_lock(&io->lock);
    *st = io->st;
    st->mapped = io->nmaps;
    st->pending = io->npend;
    st->free_extents = io->nfree;
    pthread_mutex_unlock(&io->lock);
}

const char *vhd_drv_iommu_strerror(const struct vhd_drv_iommu *io)
{
    return io->err;
}

const char *vhd_drv_iommu_reason(const struct vhd_drv_iommu *io, int rc)
{
    return io->err[0] ? io->err : strerror(-rc);
}

/* ---- the miss thread ---- */

/* Handle one back-end request; -errno when the channel must be dropped. */
static int serve_one(struct vhd_drv_iommu *io, struct vu_rx *rx)
{
    uint64_t v = 1; /* "not handled" for anything but an IOTLB message */

    for (unsigned k = 0; k < rx->nfds; k++)
        close(rx->fds[k]); /* no back-end request we handle carries fds */
    if (rx->hdr.request == VHOST_USER_BACKEND_IOTLB_MSG &&
        rx->hdr.size >= sizeof(struct vu_iotlb)) {
        const struct vu_iotlb *m = &rx->payload.iotlb;
        v = 0;
        /* A failed answer: the device asks again. */
        if (m->type == VHOST_IOTLB_MISS)
            (void)vhd_drv_iommu_miss(io, m->iova, m->perm);
    } else if (rx->hdr.request == VHOST_USER_BACKEND_CONFIG_CHANGE_MSG && io->config_efd >= 0) {
        uint64_t one = 1;
        ssize_t n = write(io->config_efd, &one, sizeof(one));
        (void)n; /* fails only when the counter would overflow: the waiter is woken anyway */
        v = 0;
    }
    if (rx->hdr.flags & VHOST_USER_NEED_REPLY_MASK) {
        struct vu_hdr h = {.request = rx->hdr.request,
                           .flags = VHOST_USER_VERSION | VHOST_USER_REPLY_MASK,
                           .size = sizeof(uint64_t)};
        return vu_send(io->backend_fd, &h, &v, NULL, 0, io->timeout_ms);
    }
    return 0;
}

static void *serve_main(void *arg)
{
    struct vhd_drv_iommu *io = arg;
    struct vu_rx rx;

    vu_rx_init(&rx);
    for (;;) {
        struct pollfd pf[2] = {{.fd = io->backend_fd, .events = POLLIN},
                               {.fd = io->stop_fd, .events = POLLIN}};
        if (poll(pf, 2, -1) < 0 && errno != EINTR)
            break;
        if (pf[1].revents)
            break;
        int rc;
        while ((rc = vu_rx_read(&rx, io->backend_fd)) == 1) {
            rc = serve_one(io, &rx);
            vu_rx_next(&rx);
            if (rc < 0)
                break;
        }
        if (rc < 0)
            break; /* the back-end closed its end (or broke framing): no more misses */
    }
    vu_rx_reset(&rx);
    return NULL;
}

int vhd_drv_iommu_serve(struct vhd_drv_iommu *io, int backend_fd, int timeout_ms, int config_efd)
{
    if (io->thr_running)
        return -EBUSY;
    io->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (io->stop_fd < 0)
        return -errno;
    io->backend_fd = backend_fd;
    io->timeout_ms = timeout_ms;
    io->config_efd = config_efd;
    int rc = pthread_create(&io->thr, NULL, serve_main, io);
    if (rc != 0) {
        close(io->stop_fd);
        io->stop_fd = -1;
        return -rc;
    }
    io->thr_running = true;
    return 0;
}
