/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The userspace drivers acting as the device's IOMMU (VIRTIO_F_ACCESS_PLATFORM,
 * vhost-user "IOMMU support"): an IOVA allocator in page units, the table of
 * live mappings (IOVA -> our address, size, access), and the IOTLB messages
 * that keep the back-end's device IOTLB in step: UPDATE when a buffer is mapped,
 * INVALIDATE when it is unmapped (at once: strict; in batches: lazy), UPDATE
 * again to answer a MISS from the back-end channel.
 *
 * IOVAs are chosen here, in a window far from every guest-physical address
 * the drivers use, so a back-end that ignores the IOTLB and reads descriptor
 * addresses as GPAs fails visibly. A mapping covers whole pages of page_size
 * bytes: the page-aligned span around the buffer, which must lie in one
 * region of the shared memory (regions are aligned to page_size for that).
 * An IOVA range is not reused before the back-end acknowledged its
 * invalidation, and an unmapped guard page follows every mapping.
 *
 * Messages go through a send callback that returns only after the back-end
 * acknowledged (REPLY_ACK): 0, or -errno. Threading: every call takes the
 * object's mutex, and the callback runs under it, so queue threads and the
 * miss thread share the session socket safely; vhd_drv_iommu_lock() lets a
 * control call use the socket meanwhile.
 */
#ifndef VHD_DRV_IOMMU_H
#define VHD_DRV_IOMMU_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spec/vhost_user.h"

/* Where IOVAs start and how far they go: above any GPA the drivers use (those are < 1 TiB). */
#define VHD_DRV_IOVA_BASE (1ull << 44)
#define VHD_DRV_IOVA_SIZE (1ull << 40)
/* Lazy style: unmapped ranges waiting for INVALIDATE before a flush is forced (0 asked). */
#define VHD_DRV_IOMMU_DEFAULT_BATCH 32u
#define VHD_DRV_IOMMU_MAX_REGIONS   8u

/* Sends one IOTLB message and waits for the back-end's ack: 0 or -errno. */
typedef int (*vhd_drv_iotlb_send_fn)(void *ctx, const struct vu_iotlb *m);

struct vhd_drv_iommu_params {
    uint64_t page_size; /* a power of two, 4096 or more */
    bool strict;        /* INVALIDATE at each unmap (else lazy, every `batch` unmaps) */
    uint32_t batch;     /* lazy batch (0: VHD_DRV_IOMMU_DEFAULT_BATCH) */
    uint64_t iova_base; /* first IOVA (0: VHD_DRV_IOVA_BASE); page aligned */
    uint64_t iova_size; /* window (0: VHD_DRV_IOVA_SIZE); a multiple of page_size */
    vhd_drv_iotlb_send_fn send;
    void *send_ctx;
};

/* One mapping: IOVA range -> our address range, with the device's access. */
struct vhd_drv_iommu_map {
    uint64_t iova;
    uint64_t size;
    uint64_t uaddr;
    uint8_t perm;
    bool paged; /* the back-end got one UPDATE per page (vhd_drv_iommu_map_paged) */
};

/* A free IOVA range, in pages. */
struct vhd_drv_iova_ext {
    uint64_t start;
    uint64_t npages;
};

struct vhd_drv_iommu_stats {
    uint64_t updates;      /* UPDATE messages acknowledged (misses answered included) */
    uint64_t invalidates;  /* INVALIDATE messages acknowledged */
    uint64_t misses;       /* MISS messages received */
    uint64_t misses_bad;   /* ... for an IOVA that is not mapped (not answered) */
    uint64_t flushes;      /* lazy batches flushed */
    uint64_t mapped;       /* live mappings now */
    uint64_t pending;      /* unmapped ranges waiting for INVALIDATE now */
    uint64_t free_extents; /* free IOVA ranges now (fragmentation) */
};

struct vhd_drv_iommu {
    pthread_mutex_t lock;
    struct vhd_drv_iommu_params p;
    unsigned page_shift;
    /* where mappings may point: [start, end) of each region of the shared memory */
    uint64_t reg_start[VHD_DRV_IOMMU_MAX_REGIONS], reg_end[VHD_DRV_IOMMU_MAX_REGIONS];
    uint32_t nregs;
    /* live mappings, sorted by iova */
    struct vhd_drv_iommu_map *maps;
    size_t nmaps, cap_maps;
    /* unmapped, not yet invalidated (lazy) */
    struct vhd_drv_iommu_map *pend;
    size_t npend, cap_pend;
    /* free IOVA space, sorted by start, never adjacent (coalesced) */
    struct vhd_drv_iova_ext *free;
    size_t nfree, cap_free;
    struct vhd_drv_iommu_stats st;
    /* miss thread (vhd_drv_iommu_serve) */
    pthread_t thr;
    bool thr_running;
    int backend_fd;
    int stop_fd;
    int config_efd; /* signalled on a config change message, or -1 */
    int timeout_ms;
    char err[160]; /* last failure of a message */
};

/*
 * vhd_drv_iommu_init - an empty table for params (send is required). 0 or
 * -EINVAL (page size not a power of two >= 4096, window not page multiples).
 */
int vhd_drv_iommu_init(struct vhd_drv_iommu *io, const struct vhd_drv_iommu_params *p);

/* Stop the miss thread, free the tables (no message is sent). Idempotent. */
void vhd_drv_iommu_fini(struct vhd_drv_iommu *io);

/* Allow mappings into [uaddr, uaddr + size) (a region of the shared memory); -E2BIG past 8. */
int vhd_drv_iommu_add_region(struct vhd_drv_iommu *io, uint64_t uaddr, uint64_t size);

/*
 * vhd_drv_iommu_map - map [addr, addr + len) (len > 0) for the device with
 * perm (VHOST_ACCESS_RO/WO/RW): allocate IOVA pages for the page-aligned span,
 * send UPDATE and wait for the ack. *iova gets the IOVA of addr itself (same
 * offset in its page). -EINVAL (bad perm, span outside every region),
 * -ENOSPC (IOVA window full), -ENOMEM, or the send's error (nothing left
 * mapped).
 */
int vhd_drv_iommu_map(struct vhd_drv_iommu *io, const void *addr, uint64_t len, uint8_t perm,
                      uint64_t *iova);

/*
 * vhd_drv_iommu_map_paged - the same, but the back-end gets one UPDATE per
 * page (contiguous IOVAs and addresses): a long-lived mapping of many
 * page-sized IOTLB entries, as a guest that maps its buffer pool once with
 * 4 KiB pages makes. A miss is answered with the page asked for; unmap sends
 * one INVALIDATE for the whole range. When an UPDATE is refused midway, the
 * pages sent are invalidated again (their IOVAs are never reused when that
 * fails too).
 */
int vhd_drv_iommu_map_paged(struct vhd_drv_iommu *io, const void *addr, uint64_t len, uint8_t perm,
                            uint64_t *iova);

/*
 * vhd_drv_iommu_unmap - the buffer mapped at iova (the value map returned)
 * goes: strict, INVALIDATE and wait for its ack, then the IOVA is free; lazy,
 * the range joins the pending batch, flushed when it reaches `batch`.
 * -ENOENT when nothing is mapped at iova; the send's error otherwise (the
 * range then stays pending and is retried by the next flush).
 */
int vhd_drv_iommu_unmap(struct vhd_drv_iommu *io, uint64_t iova);

/*
 * vhd_drv_iommu_flush - INVALIDATE every pending range (IOVA-adjacent ranges
 * coalesced into one message) and free their IOVAs once acked. 0 or the
 * first send error (what was not acked stays pending).
 */
int vhd_drv_iommu_flush(struct vhd_drv_iommu *io);

/*
 * vhd_drv_iommu_miss - the back-end asked for iova (perm it needs): answer
 * with UPDATE for the live mapping that covers it. 1 when answered, 0 when
 * the IOVA is not mapped or not with that access (no answer: the spec's
 * invalid IOVA), or the send's error.
 */
int vhd_drv_iommu_miss(struct vhd_drv_iommu *io, uint64_t iova, uint8_t perm);

/*
 * vhd_drv_iommu_replay - UPDATE every live mapping again (in IOVA order). A
 * back-end may drop updates it gets before its rings exist (DPDK keeps its
 * IOTLB per ring): sent once every ring is announced, it spares a miss per
 * mapping. 0 or the first send error.
 */
int vhd_drv_iommu_replay(struct vhd_drv_iommu *io);

/*
 * vhd_drv_iommu_lookup - the live mapping covering iova, copied to *out: 0
 * or -ENOENT.
 */
int vhd_drv_iommu_lookup(struct vhd_drv_iommu *io, uint64_t iova, struct vhd_drv_iommu_map *out);

/*
 * vhd_drv_iommu_serve - start a thread that reads back-end requests on
 * backend_fd (our end of the SET_BACKEND_REQ_FD channel; stays the caller's)
 * and answers IOTLB MISS messages (vhd_drv_iommu_miss); a config change
 * message is passed on by a write to config_efd (an eventfd, the caller's;
 * -1: not handled). A request with NEED_REPLY gets u64 0 (1 for one it does
 * not handle). It ends at vhd_drv_iommu_fini or when the channel closes. 0
 * or -errno.
 */
int vhd_drv_iommu_serve(struct vhd_drv_iommu *io, int backend_fd, int timeout_ms, int config_efd);

/* Hold the mutex around a control exchange on the session the messages use. */
void vhd_drv_iommu_lock(struct vhd_drv_iommu *io);
void vhd_drv_iommu_unlock(struct vhd_drv_iommu *io);

/* Counters now. */
void vhd_drv_iommu_get_stats(struct vhd_drv_iommu *io, struct vhd_drv_iommu_stats *st);

/* The last message failure ("" when none). */
const char *vhd_drv_iommu_strerror(const struct vhd_drv_iommu *io);

/* Why a call on io failed with rc: the last message failure, or strerror(-rc) when none. */
const char *vhd_drv_iommu_reason(const struct vhd_drv_iommu *io, int rc);

#endif /* VHD_DRV_IOMMU_H */
