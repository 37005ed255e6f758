/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Internals of a vhost-user session shared by its files: vu_conn.c (the
 * request table, validation and dispatch, session state, queue hand-over and
 * quiescence, the device-level handlers), vu_conn_rings.c (ring messages and
 * ring states) and vu_conn_shm.c (memory table, inflight area, dirty log).
 * Not part of the transport's interface (vu_conn.h). Control thread only.
 * Handlers take the session and the validated request and return 0 or
 * -errno with r->why set.
 */
#ifndef VHD_VU_CONN_INT_H
#define VHD_VU_CONN_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/dev.h"
#include "vu_conn.h"
#include "spec/vhost_user.h"
#include "util/bits.h"
#include "vu_sock.h"

struct vhd_vu_conn {
    struct vhd_dev *dev;
    int fd;                     /* the session socket (owned) */
    struct vu_rx rx;            /* message being received */
    uint64_t acked_features;    /* SET_FEATURES value, PROTOCOL_FEATURES bit included */
    bool features_set;          /* SET_FEATURES received since the session/reset started */
    bool protocol_features_set; /* SET_PROTOCOL_FEATURES received */
    int backend_fd;             /* SET_BACKEND_REQ_FD channel, or -1 */
    bool config_change_pending; /* a config change while suspended: told when a ring starts */
    int detach_timeout_ms;
    bool *err_signalled; /* per queue: its broken state was signalled on err_fd */
    bool numa_pending;   /* the memory table's node is reported when a ring starts (numa.h) */
    /* SET_INFLIGHT_FD: the mapped inflight area (NULL: none) and its shape. */
    void *inflight;
    uint64_t inflight_size;
    uint16_t inflight_num_queues;
    uint16_t inflight_queue_size;
    int inflight_guard; /* its vhd_memguard slot (a truncated file cannot kill us), or -1 */
    /* SET_LOG_BASE: the dirty log (NULL: none); queues use it while LOG_ALL is negotiated. */
    struct vhd_dirtylog *log;
    /* IOTLB (VIRTIO_F_ACCESS_PLATFORM, vu_conn_iotlb.c): NULL until first negotiated. */
    struct vhd_iotlb *iotlb;
    uint64_t *miss_sent;  /* per queue: miss word (vq.h iotlb_miss) sent, 0: none */
    uint64_t *miss_since; /* per queue: when it was sent (ms) */
    /* per queue: iotlb_gen + 1 when miss_sent was cleared as answered, 0: not cleared */
    uint64_t *miss_cleared;
    uint64_t iotlb_gen; /* bumped by every table change (UPDATE, INVALIDATE, flush) */
    uint64_t iotlb_miss_timeout_ms;
    struct vhd_ctl *ctl; /* for the miss timer (vhd_vu_conn_set_ctl), or NULL */
    struct vhd_ctl_src *miss_timer_src;
    int miss_timer_fd; /* timerfd while misses are pending, or -1 */
    bool miss_timer_armed;
    uint64_t stat_updates, stat_invalidates, stat_misses_sent;
};

/* The request being handled, as the handlers see it. */
struct vu_req {
    const struct vu_hdr *hdr;
    const union vu_payload *p;
    int fds[VHOST_USER_MAX_FDS]; /* a handler that keeps an fd sets its slot to -1 */
    unsigned nfds;
    union vu_payload reply; /* filled by handlers of requests that have a reply */
    uint32_t reply_size;
    int reply_fd;    /* fd sent with the reply (closed after sending), or -1 */
    const char *why; /* failure reason for the log line */
};

/* ---- vu_conn.c: features, queue hand-over, quiescence, session state ---- */

/* Has the session negotiated virtio feature `bit` (SET_FEATURES)? */
bool vhd_vu__feature_has(const struct vhd_vu_conn *c, int bit);

/* Is any ring of dev started? */
bool vhd_vu__any_ring_started(const struct vhd_dev *dev);

/* The worker that runs queue i of dev (its workers= list, or round robin). */
unsigned vhd_vu__queue_worker_of(const struct vhd_dev *dev, uint32_t i);

/* close(*fd) if open, then *fd = -1. */
void vhd_vu__close_fd(int *fd);

/* Set NEEDS_RESET and notify the front-end (see vu_conn.c); log says whether to log why. */
void vhd_vu__conn_mark_broken(struct vhd_vu_conn *c, const char *why, bool log);

/* Point q's engine at the dirty log, or at none (q detached or not started). */
void vhd_vu__queue_apply_log(struct vhd_vu_conn *c, struct vhd_queue *q);

/* Take q back from its worker (in-flight requests complete first). 0 or -errno. */
int vhd_vu__queue_detach(struct vhd_vu_conn *c, struct vhd_queue *q);

/* Attach or detach q so that it runs exactly when it should. */
int vhd_vu__queue_sync(struct vhd_vu_conn *c, struct vhd_queue *q);

/* Change q's enabled state (detached meanwhile), then sync. */
int vhd_vu__queue_set_enabled(struct vhd_vu_conn *c, struct vhd_queue *q, bool enabled);

/* Targeted quiescence of this device's queues, and their resumption. */
int vhd_vu__dev_quiesce(struct vhd_vu_conn *c);
void vhd_vu__dev_resume(struct vhd_vu_conn *c);

/* The queue named by a validated ring index, clamped against speculation. */
struct vhd_queue *vhd_vu__req_queue(struct vhd_vu_conn *c, uint64_t idx);

/* ---- vu_conn_rings.c ---- */

/* Stop a started ring (GET_VRING_BASE, reset, disconnect). 0 or -errno. */
int vhd_vu__queue_stop(struct vhd_vu_conn *c, struct vhd_queue *q);

int vhd_vu__set_vring_num(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__set_vring_addr(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__set_vring_base(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__get_vring_base(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__set_vring_kick(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__set_vring_call(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__set_vring_err(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__set_vring_enable(struct vhd_vu_conn *c, struct vu_req *r);

/* ---- vu_conn_shm.c ---- */

/* Drop the inflight area. No started ring may be using it. */
void vhd_vu__inflight_unmap(struct vhd_vu_conn *c);

int vhd_vu__set_mem_table(struct vhd_vu_conn *c, struct vu_req *r);
/* Log the NUMA node of the device's guest memory (vu_conn_shm.c; numa.h). */
void vhd_vu__report_numa(struct vhd_vu_conn *c, bool last);
int vhd_vu__get_max_mem_slots(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__add_mem_reg(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__rem_mem_reg(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__get_inflight_fd(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__set_inflight_fd(struct vhd_vu_conn *c, struct vu_req *r);
int vhd_vu__set_log_base(struct vhd_vu_conn *c, struct vu_req *r);

/* ---- vu_conn_iotlb.c ---- */

/* Is VIRTIO_F_ACCESS_PLATFORM negotiated (and the IOTLB there)? */
bool vhd_vu__iotlb_on(const struct vhd_vu_conn *c);
/* Create the session's IOTLB (SET_FEATURES with ACCESS_PLATFORM). 0 or -ENOMEM. */
int vhd_vu__iotlb_setup(struct vhd_vu_conn *c);
/* Stop its miss timer; free the table too when table (no worker may read it). */
void vhd_vu__iotlb_free(struct vhd_vu_conn *c, bool table);
/* Drop every entry (memory table change; the device's queues are detached). */
void vhd_vu__iotlb_flush(struct vhd_vu_conn *c);
/* Send new misses, retry answered ones, break the device on an expired one. */
void vhd_vu__iotlb_service(struct vhd_vu_conn *c);
/* Point a starting queue at the IOTLB when negotiated (after vhd_vq_init). */
void vhd_vu__iotlb_queue_init(struct vhd_vu_conn *c, struct vhd_queue *q);
int vhd_vu__iotlb_msg(struct vhd_vu_conn *c, struct vu_req *r);

#endif /* VHD_VU_CONN_INT_H */
