/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A vhost-user front-end session (see vu_conn.h): the request table, the
 * generic validation that runs before any handler, the session's state, the
 * hand-over of queues to workers and the quiescence of a device's queues
 * around control-plane changes, and the device-level handlers (features,
 * config, status, reset). Ring messages are in vu_conn_rings.c, the memory
 * table, inflight area and dirty log in vu_conn_shm.c (vu_conn_int.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dirtylog.h"
#include "core/memguard.h"
#include "spec/virtio.h"
#include "runtime/efd.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "vu_conn_int.h"
#include "vu_sock.h"

/* Messages handled per readable event before yielding to other fds of the loop. */
#define CONN_MSGS_PER_WAKEUP 32
/*
 * Bound on sending a reply or a back-end message to a front-end that does
 * not read. The control thread serves every device, so while it waits here
 * no other front-end is answered: a full socket buffer means a couple of
 * hundred KiB of replies left unread, which no working front-end does (they
 * read each reply before the next request), so give up almost at once and
 * end that session. (At 1000 ms one such front-end stalled every other
 * device's control plane for a second per attempt: test_chaos never_reads.)
 */
#define CONN_SEND_TIMEOUT_MS 10

/* ---- the request table ---- */

/* Payload size rules. */
enum vu_size_rule {
    SZ_EXACT,     /* size == info->size */
    SZ_MEM_TABLE, /* 8 + nregions * 32, nregions <= 8 */
    SZ_CONFIG,    /* 12 + config.size, config.size <= 256 */
};

/* Fd rules. */
enum vu_fd_rule {
    FD_NONE,      /* no fd */
    FD_ONE,       /* exactly one fd */
    FD_OPT_ONE,   /* zero or one fd, which is closed unused (REM_MEM_REG) */
    FD_VRING,     /* u64 payload: one fd, or none when bit 8 (NOFD) is set */
    FD_PER_REGION /* one fd per memory region (SET_MEM_TABLE) */
};

/* Where the ring index is, for the generic range check. */
enum vu_index_rule {
    IDX_NONE,
    IDX_STATE, /* vring state .index */
    IDX_ADDR,  /* vring address .index */
    IDX_U64,   /* bits 0-7 of the u64 */
};

typedef int (*vu_handler)(struct vhd_vu_conn *c, struct vu_req *r);

struct vu_req_info {
    const char *name;
    vu_handler handler;     /* NULL: known to the spec, not supported (yet) */
    uint8_t size_rule;      /* enum vu_size_rule */
    uint16_t size;          /* SZ_EXACT */
    uint8_t fd_rule;        /* enum vu_fd_rule */
    uint8_t index_rule;     /* enum vu_index_rule */
    uint64_t gate;          /* protocol feature bit (as a mask) that must be negotiated; 0: none */
    bool gate_offered;      /* the spec only requires the back-end to offer it */
    bool reply;             /* the request has its own reply (REPLY_ACK adds nothing) */
    bool empty_error_reply; /* failures are a zero-size reply (GET_CONFIG) */
    bool errno_reply;       /* failures reply u64 errno (SET_LOG_BASE), once the gate is met */
};

static int h_get_features(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_features(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_owner(struct vhd_vu_conn *c, struct vu_req *r);
static int h_reset_owner(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_protocol_features(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_protocol_features(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_queue_num(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_backend_req_fd(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_config(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_config(struct vhd_vu_conn *c, struct vu_req *r);
static int h_reset_device(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_status(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_status(struct vhd_vu_conn *c, struct vu_req *r);
static int h_send_rarp(struct vhd_vu_conn *c, struct vu_req *r);
static int h_net_set_mtu(struct vhd_vu_conn *c, struct vu_req *r);

/* Payload sizes and gates, for the table below. */
#define U64             ((uint16_t)sizeof(uint64_t))
#define STATE           ((uint16_t)sizeof(struct vu_vring_state))
#define ADDR            ((uint16_t)sizeof(struct vu_vring_addr))
#define MREG            ((uint16_t)sizeof(struct vu_mem_single))
#define INFLIGHT        ((uint16_t)sizeof(struct vu_inflight))
#define LOG             ((uint16_t)sizeof(struct vu_log))
#define IOTLB           ((uint16_t)sizeof(struct vu_iotlb))
#define PF(name)        BIT(VHOST_USER_PROTOCOL_F_##name)
#define REQ(id, h, ...) [VHOST_USER_##id] = {.name = #id, .handler = (h), __VA_ARGS__}

/*
 * One entry per request id of the spec's "Front-end message types". Sizes are
 * the spec's payload types; gates are the "Only legal if / When ... is
 * negotiated" sentences of each message. Unset fields mean: empty payload, no
 * fd, no ring index, no gate, no reply of its own. Requests without a handler
 * (log, IOTLB, inflight, postcopy, crypto, ...) are rejected like unknown
 * ones until their features are built and offered.
 */
static const struct vu_req_info vu_reqs[VHOST_USER_REQUEST_MAX] = {
    REQ(GET_FEATURES, h_get_features, .reply = true),
    REQ(SET_FEATURES, h_set_features, .size = U64),
    REQ(SET_OWNER, h_set_owner),
    REQ(RESET_OWNER, h_reset_owner),
    REQ(SET_MEM_TABLE, vhd_vu__set_mem_table, .size_rule = SZ_MEM_TABLE, .fd_rule = FD_PER_REGION),
    /* Spec "Communication": with LOG_SHMFD, SET_LOG_BASE has a reply. */
    REQ(SET_LOG_BASE, vhd_vu__set_log_base, .size = LOG, .fd_rule = FD_ONE, .gate = PF(LOG_SHMFD),
        .reply = true, .errno_reply = true),
    REQ(SET_LOG_FD, NULL),
    REQ(SET_VRING_NUM, vhd_vu__set_vring_num, .size = STATE, .index_rule = IDX_STATE),
    REQ(SET_VRING_ADDR, vhd_vu__set_vring_addr, .size = ADDR, .index_rule = IDX_ADDR),
    REQ(SET_VRING_BASE, vhd_vu__set_vring_base, .size = STATE, .index_rule = IDX_STATE),
    REQ(GET_VRING_BASE, vhd_vu__get_vring_base, .size = STATE, .index_rule = IDX_STATE,
        .reply = true),
    REQ(SET_VRING_KICK, vhd_vu__set_vring_kick, .size = U64, .fd_rule = FD_VRING,
        .index_rule = IDX_U64),
    REQ(SET_VRING_CALL, vhd_vu__set_vring_call, .size = U64, .fd_rule = FD_VRING,
        .index_rule = IDX_U64),
    REQ(SET_VRING_ERR, vhd_vu__set_vring_err, .size = U64, .fd_rule = FD_VRING,
        .index_rule = IDX_U64),
    REQ(GET_PROTOCOL_FEATURES, h_get_protocol_features, .reply = true),
    REQ(SET_PROTOCOL_FEATURES, h_set_protocol_features, .size = U64),
    /* "should be sent only when MQ is set in queried protocol features": offered suffices. */
    REQ(GET_QUEUE_NUM, h_get_queue_num, .gate = PF(MQ), .gate_offered = true, .reply = true),
    REQ(SET_VRING_ENABLE, vhd_vu__set_vring_enable, .size = STATE, .index_rule = IDX_STATE),
    /* Net devices (ops->send_rarp / set_mtu): "present in GET_PROTOCOL_FEATURES", so offered. */
    REQ(SEND_RARP, h_send_rarp, .size = U64, .gate = PF(RARP), .gate_offered = true),
    REQ(NET_SET_MTU, h_net_set_mtu, .size = U64, .gate = PF(MTU), .gate_offered = true),
    REQ(SET_BACKEND_REQ_FD, h_set_backend_req_fd, .fd_rule = FD_ONE, .gate = PF(BACKEND_REQ)),
    /* "IOMMU support": acked through REPLY_ACK (QEMU sets NEED_REPLY and waits). */
    REQ(IOTLB_MSG, vhd_vu__iotlb_msg, .size = IOTLB),
    REQ(SET_VRING_ENDIAN, NULL),
    REQ(GET_CONFIG, h_get_config, .size_rule = SZ_CONFIG, .gate = PF(CONFIG), .reply = true,
        .empty_error_reply = true),
    REQ(SET_CONFIG, h_set_config, .size_rule = SZ_CONFIG, .gate = PF(CONFIG)),
    REQ(CREATE_CRYPTO_SESSION, NULL, .reply = true),
    REQ(CLOSE_CRYPTO_SESSION, NULL),
    REQ(POSTCOPY_ADVISE, NULL, .reply = true),
    REQ(POSTCOPY_LISTEN, NULL),
    REQ(POSTCOPY_END, NULL, .reply = true),
    REQ(GET_INFLIGHT_FD, vhd_vu__get_inflight_fd, .size = INFLIGHT, .gate = PF(INFLIGHT_SHMFD),
        .reply = true),
    REQ(SET_INFLIGHT_FD, vhd_vu__set_inflight_fd, .size = INFLIGHT, .fd_rule = FD_ONE,
        .gate = PF(INFLIGHT_SHMFD)),
    REQ(GPU_SET_SOCKET, NULL),
    /* "Only valid if the RESET_DEVICE protocol feature is set by the back-end": offered. */
    REQ(RESET_DEVICE, h_reset_device, .gate = PF(RESET_DEVICE), .gate_offered = true),
    REQ(VRING_KICK, NULL),
    REQ(GET_MAX_MEM_SLOTS, vhd_vu__get_max_mem_slots, .gate = PF(CONFIGURE_MEM_SLOTS),
        .reply = true),
    REQ(ADD_MEM_REG, vhd_vu__add_mem_reg, .size = MREG, .fd_rule = FD_ONE,
        .gate = PF(CONFIGURE_MEM_SLOTS)),
    REQ(REM_MEM_REG, vhd_vu__rem_mem_reg, .size = MREG, .fd_rule = FD_OPT_ONE,
        .gate = PF(CONFIGURE_MEM_SLOTS)),
    REQ(SET_STATUS, h_set_status, .size = U64, .gate = PF(STATUS)),
    REQ(GET_STATUS, h_get_status, .gate = PF(STATUS), .reply = true),
    REQ(GET_SHARED_OBJECT, NULL, .reply = true),
    REQ(SET_DEVICE_STATE_FD, NULL, .reply = true),
    REQ(CHECK_DEVICE_STATE, NULL, .reply = true),
};

const char *vu_request_name(uint32_t request)
{
    if (request < VHOST_USER_REQUEST_MAX && vu_reqs[request].name)
        return vu_reqs[request].name;
    return "UNKNOWN";
}

/* ---- offered features ---- */

/*
 * Virtio bits that are the transport's own, whatever the device offers:
 * VHOST_F_LOG_ALL and VIRTIO_F_ACCESS_PLATFORM, offered for devices that
 * touch guest memory only through the buffers the engine hands out (which
 * is also what dirty logging needs: ops->dirty_log, blk and net). Bit 33
 * needs BACKEND_REQ (misses) and REPLY_ACK (QEMU refuses iommu_platform=on
 * without both), which are always offered.
 */
#define VU_FEATURES_NOT_YET (BIT(VHOST_F_LOG_ALL) | BIT(VIRTIO_F_ACCESS_PLATFORM))

/* Layouts allowed; both flags false means "not configured": both allowed. */
static bool layout_allowed(const struct vhd_dev *dev, bool packed)
{
    if (!dev->allow_split && !dev->allow_packed)
        return true;
    return packed ? dev->allow_packed : dev->allow_split;
}

uint64_t vhd_vu_offered_features(const struct vhd_dev *dev)
{
    uint64_t f = dev->ops->features ? dev->ops->features((struct vhd_dev *)dev) : 0;

    f &= ~VU_FEATURES_NOT_YET;
    if (dev->ops->dirty_log)
        f |= BIT(VHOST_F_LOG_ALL) | BIT(VIRTIO_F_ACCESS_PLATFORM);
    if (!layout_allowed(dev, true))
        f &= ~BIT(VIRTIO_F_RING_PACKED);
    return f | BIT(VHOST_USER_F_PROTOCOL_FEATURES);
}

/*
 * Offered: MQ (the spec says back-ends should always implement it), REPLY_ACK,
 * BACKEND_REQ (config change notifications), CONFIG when the device has a
 * config space, RESET_DEVICE, CONFIGURE_MEM_SLOTS, STATUS, and INFLIGHT_SHMFD
 * for devices that resubmit (ops->inflight_shmfd), LOG_SHMFD for devices that
 * log their writes (ops->dirty_log). Not offered: BACKEND_SEND_FD (we never
 * send fds), INBAND_NOTIFICATIONS, PAGEFAULT (postcopy), and the rest.
 */
uint64_t vhd_vu_offered_protocol_features(const struct vhd_dev *dev)
{
    uint64_t f = BIT(VHOST_USER_PROTOCOL_F_MQ) | BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK) |
                 BIT(VHOST_USER_PROTOCOL_F_BACKEND_REQ) | BIT(VHOST_USER_PROTOCOL_F_RESET_DEVICE) |
                 BIT(VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS) | BIT(VHOST_USER_PROTOCOL_F_STATUS);

    if (dev->ops->get_config && dev->ops->config_size > 0)
        f |= BIT(VHOST_USER_PROTOCOL_F_CONFIG);
    if (dev->ops->set_mtu) /* net devices */
        f |= BIT(VHOST_USER_PROTOCOL_F_MTU);
    if (dev->ops->send_rarp)
        f |= BIT(VHOST_USER_PROTOCOL_F_RARP);
    if (dev->ops->inflight_shmfd)
        f |= BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD);
    if (dev->ops->dirty_log)
        f |= BIT(VHOST_USER_PROTOCOL_F_LOG_SHMFD);
    return f;
}

static bool proto_has(const struct vhd_vu_conn *c, int bit)
{
    return (c->dev->protocol_features & BIT(bit)) != 0;
}

bool vhd_vu__feature_has(const struct vhd_vu_conn *c, int bit)
{
    return (c->dev->features & BIT(bit)) != 0;
}

/* ---- queues: attach, detach, quiescence ---- */

bool vhd_vu__any_ring_started(const struct vhd_dev *dev)
{
    for (uint32_t i = 0; i < dev->num_queues; i++)
        if (dev->queues[i].started)
            return true;
    return false;
}

unsigned vhd_vu__queue_worker_of(const struct vhd_dev *dev, uint32_t i)
{
    unsigned n = vhd_rt_nworkers(dev->rt);
    int w = dev->queue_worker ? dev->queue_worker[i] : (int)i;

    if (n == 0)
        return 0;
    return w < 0 ? 0 : (unsigned)w % n;
}

/* Fresh control state for queue i: stopped, disabled, no fds. No worker may hold it. */
static void queue_clear(struct vhd_dev *dev, uint32_t i)
{
    struct vhd_queue *q = &dev->queues[i];

    memset(q, 0, sizeof(*q));
    q->dev = dev;
    q->index = (uint16_t)i;
    q->kick_fd = -1;
    q->call_fd = -1;
    q->err_fd = -1;
    q->worker_idx = (int)vhd_vu__queue_worker_of(dev, i);
}

void vhd_vu__close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/*
 * Spec "Ring states": a ring is processed only while started; we also require
 * it enabled (see vhd_vu__set_vring_enable), unless the device processes disabled
 * rings itself (ops->run_disabled: net discards their transmitted frames).
 */
static bool queue_should_run(const struct vhd_queue *q)
{
    return q->started && (q->enabled || q->dev->ops->run_disabled);
}

/*
 * Point q's engine at the dirty log, or at none: logging runs while
 * VHOST_F_LOG_ALL is negotiated and a log is set (QEMU may start a ring
 * with LOG_ALL before it sends the log: vhost_dev_start). q must be
 * detached (or not started: vhd_vq_init clears it anyway).
 */
void vhd_vu__queue_apply_log(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    const struct vhd_dirtylog *log = vhd_vu__feature_has(c, VHOST_F_LOG_ALL) ? c->log : NULL;

    vhd_vq_set_log(&q->vq, log, q->addr_log_on, q->addr_log);
}

/*
 * Take q back from its worker (in-flight requests complete first). On
 * timeout the queue stays attached: the device is broken and the session
 * must never free memory the worker may still use.
 */
int vhd_vu__queue_detach(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    if (!q->attached)
        return 0;
    int rc = vhd_rt_detach(c->dev->rt, q, c->detach_timeout_ms);
    if (rc < 0) {
        /* vhd_rt_detach logged it. */
        vhd_vu__conn_mark_broken(c, "a queue does not stop", false);
        return rc;
    }
    q->attached = false;
    return 0;
}

/*
 * Has the front-end taken memory away under one of this device's mappings
 * (guest memory, dirty log, inflight area: a SIGBUS absorbed, memguard.h)?
 * Those mappings read zeros now; the device is broken until reset.
 */
static bool conn_memory_lost(const struct vhd_vu_conn *c)
{
    return vhd_mem_faulted(c->dev->mem) || vhd_dirtylog_faulted(c->log) ||
           (c->inflight_guard >= 0 && vhd_memguard_faulted(c->inflight_guard));
}

/*
 * Hand q to its worker. Not while the device's memory is lost: its queues
 * stay stopped (vhd_vu_conn_check_queues), and so does a queue started or
 * enabled afterwards; the front-end must reset the device (new memory).
 */
static int queue_attach(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    if (q->attached || conn_memory_lost(c))
        return 0;
    q->worker_idx = (int)vhd_vu__queue_worker_of(c->dev, q->index);
    int rc = vhd_rt_attach(c->dev->rt, q, (unsigned)q->worker_idx);
    if (rc < 0) {
        /* vhd_rt_attach logged it. */
        vhd_vu__conn_mark_broken(c, "a queue cannot be started", false);
        return rc;
    }
    q->attached = true;
    return 0;
}

/* Attach or detach q so that it runs exactly when it should. */
int vhd_vu__queue_sync(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    if (queue_should_run(q))
        return queue_attach(c, q);
    return vhd_vu__queue_detach(c, q);
}

/*
 * Change q's enabled state, then sync. A worker may read q->enabled while it
 * runs q (ops->run_disabled, dev.h), so the state changes only while q is
 * detached.
 */
int vhd_vu__queue_set_enabled(struct vhd_vu_conn *c, struct vhd_queue *q, bool enabled)
{
    if (q->attached && q->enabled != enabled) {
        int rc = vhd_vu__queue_detach(c, q);
        if (rc < 0)
            return rc;
    }
    q->enabled = enabled;
    return vhd_vu__queue_sync(c, q);
}

/*
 * Targeted quiescence: detach every attached queue of this device only (the
 * workers of other devices are not involved). On failure some queues may be
 * detached and one is stuck; call vhd_vu__dev_resume() either way.
 */
int vhd_vu__dev_quiesce(struct vhd_vu_conn *c)
{
    for (uint32_t i = 0; i < c->dev->num_queues; i++) {
        int rc = vhd_vu__queue_detach(c, &c->dev->queues[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Re-attach every queue that should run. Failures are logged and break the device. */
void vhd_vu__dev_resume(struct vhd_vu_conn *c)
{
    for (uint32_t i = 0; i < c->dev->num_queues; i++) {
        struct vhd_queue *q = &c->dev->queues[i];
        if (queue_should_run(q))
            (void)queue_attach(c, q);
    }
}

/* ---- session ---- */

int vhd_vu_conn_new(struct vhd_dev *dev, int fd, struct vhd_vu_conn **out)
{
    struct vhd_vu_conn *c;

    if (!dev || !dev->ops || !dev->queues || fd < 0) {
        if (fd >= 0)
            close(fd);
        return -EINVAL;
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return -ENOMEM;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
        int err = -errno;
        close(fd);
        free(c);
        return err;
    }
    c->err_signalled = calloc(dev->num_queues ? dev->num_queues : 1, sizeof(bool));
    if (!c->err_signalled) {
        close(fd);
        free(c);
        return -ENOMEM;
    }
    c->dev = dev;
    c->fd = fd;
    c->backend_fd = -1;
    c->inflight_guard = -1;
    c->miss_timer_fd = -1;
    c->iotlb_miss_timeout_ms = VHD_VU_IOTLB_MISS_TIMEOUT_MS;
    c->detach_timeout_ms = VHD_VU_DETACH_TIMEOUT_MS;
    vu_rx_init(&c->rx);
    for (uint32_t i = 0; i < dev->num_queues; i++)
        queue_clear(dev, i);
    dev->mem = NULL;
    dev->features = 0;
    dev->protocol_features = 0;
    dev->status = 0;
    dev->broken = false;
    *out = c;
    return 0;
}

/*
 * Stop every ring and return the device to its initial state, keeping what
 * `keep_session` says: RESET_DEVICE keeps the session's memory table,
 * protocol features, back-end channel and the rings' call and error fds
 * (QEMU sends SET_VRING_ERR only once per connection); a disconnect drops
 * everything. Returns 0 or the detach error (then nothing that a worker may
 * use is freed).
 */
static int conn_reset_device(struct vhd_vu_conn *c, bool keep_session)
{
    struct vhd_dev *dev = c->dev;
    int rc = 0;

    for (uint32_t i = 0; i < dev->num_queues; i++) {
        int qrc = vhd_vu__queue_stop(c, &dev->queues[i]);
        if (qrc < 0 && rc == 0)
            rc = qrc;
    }
    for (uint32_t i = 0; i < dev->num_queues; i++)
        if (dev->queues[i].attached)
            return -EBUSY; /* a worker still runs it: free nothing it may use */
    if (rc < 0)
        return rc;
    for (uint32_t i = 0; i < dev->num_queues; i++) {
        struct vhd_queue *q = &dev->queues[i];
        int call_fd = q->call_fd, err_fd = q->err_fd;
        vhd_vu__close_fd(&q->kick_fd);
        if (!keep_session) {
            vhd_vu__close_fd(&call_fd);
            vhd_vu__close_fd(&err_fd);
        }
        queue_clear(dev, i);
        q->call_fd = call_fd;
        q->err_fd = err_fd;
    }
    if (dev->ops->reset)
        dev->ops->reset(dev);
    /*
     * Every ring is stopped: nothing uses the inflight area. A reset device
     * starts over; the front-end sends an area again (QEMU gets a new one
     * on reset, then SET_INFLIGHT_FD before each start).
     */
    vhd_vu__inflight_unmap(c);
    vhd_vu__iotlb_flush(c); /* a reset device starts with no translation */
    dev->features = 0;
    dev->status = 0;
    dev->broken = false;
    c->acked_features = 0;
    c->features_set = false;
    if (!keep_session) {
        vhd_mem_free(dev->mem);
        dev->mem = NULL;
        dev->protocol_features = 0;
        c->protocol_features_set = false;
        vhd_vu__close_fd(&c->backend_fd);
        vhd_dirtylog_free(c->log); /* every ring is stopped: nothing marks it */
        c->log = NULL;
    }
    return 0;
}

int vhd_vu_conn_free(struct vhd_vu_conn *c)
{
    int rc;

    if (!c)
        return 0;
    rc = conn_reset_device(c, false);
    if (rc < 0) {
        /*
         * A worker still owns a queue: leave the device, its queues' fds and
         * its memory table alone (freeing them could crash that worker).
         */
        vhd_log(VHD_LOG_ERROR, "%s: session ended with a queue still running; device disabled",
                c->dev->name);
        vhd_vu__close_fd(&c->backend_fd);
    }
    vu_rx_reset(&c->rx);
    close(c->fd);
    vhd_vu__iotlb_free(c, rc == 0); /* the table only when no worker may still read it */
    free(c->err_signalled);
    free(c);
    return rc < 0 ? -EBUSY : 0;
}

int vhd_vu_conn_fd(const struct vhd_vu_conn *c)
{
    return c->fd;
}

struct vhd_dev *vhd_vu_conn_dev(const struct vhd_vu_conn *c)
{
    return c->dev;
}

void vhd_vu_conn_set_detach_timeout(struct vhd_vu_conn *c, int timeout_ms)
{
    c->detach_timeout_ms = timeout_ms;
}

int vhd_vu_conn_config_changed(struct vhd_vu_conn *c)
{
    struct vu_hdr h = {
        .request = VHOST_USER_BACKEND_CONFIG_CHANGE_MSG,
        .flags = VHOST_USER_VERSION,
        .size = 0,
    };

    /*
     * Suspended (every ring stopped: a stopped VM, a migration's source):
     * the spec forbids messages to the front-end; sent when a ring starts.
     */
    if (!vhd_vu__any_ring_started(c->dev)) {
        c->config_change_pending = true;
        return 0;
    }
    c->config_change_pending = false;
    if (c->backend_fd < 0 || !proto_has(c, VHOST_USER_PROTOCOL_F_BACKEND_REQ) ||
        !proto_has(c, VHOST_USER_PROTOCOL_F_CONFIG))
        return -ENOTCONN;
    int rc = vu_send(c->backend_fd, &h, NULL, NULL, 0, CONN_SEND_TIMEOUT_MS);
    if (rc < 0) {
        vhd_log(VHD_LOG_WARN,
                "%s: cannot send CONFIG_CHANGE to the front-end: %s; "
                "closing the back-end channel",
                c->dev->name, strerror(-rc));
        vhd_vu__close_fd(&c->backend_fd);
    }
    return rc;
}

/*
 * Set NEEDS_RESET and notify the front-end, except while the device is
 * suspended (spec "Suspended device state": with every ring stopped the
 * back-end must not send messages to the front-end); GET_STATUS still
 * reports it.
 */
void vhd_vu__conn_mark_broken(struct vhd_vu_conn *c, const char *why, bool log)
{
    if (c->dev->broken)
        return;
    c->dev->broken = true;
    if (log)
        vhd_log(VHD_LOG_ERROR, "%s: device needs reset: %s", c->dev->name, why);
    if (vhd_vu__any_ring_started(c->dev))
        (void)vhd_vu_conn_config_changed(c);
}

void vhd_vu_conn_set_broken(struct vhd_vu_conn *c, const char *why)
{
    vhd_vu__conn_mark_broken(c, why, true);
}

bool vhd_vu_conn_check_queues(struct vhd_vu_conn *c)
{
    bool found = false;

    for (uint32_t i = 0; i < c->dev->num_queues; i++) {
        struct vhd_queue *q = &c->dev->queues[i];
        /* Pairs with the worker's release store (dev.h, vhd_queue.broken). */
        if (!vhd_load_acquire(&q->broken))
            continue;
        found = true;
        /* SET_VRING_ERR: tell the front-end once per ring start (QEMU logs it). */
        if (!c->err_signalled[i] && q->err_fd >= 0) {
            /* Never blocks (efd.h); a full or stuck counter: the front-end has a signal. */
            (void)vhd_efd_signal(q->err_fd);
        }
        c->err_signalled[i] = true;
    }
    if (found)
        vhd_vu__conn_mark_broken(c, "a queue broke", false); /* the worker logged why */
    vhd_vu__iotlb_service(c); /* misses the workers recorded (they wrote the event fd) */
    const char *lost = NULL;
    if (vhd_mem_faulted(c->dev->mem))
        lost = "guest memory was truncated by the front-end (SIGBUS absorbed)";
    else if (vhd_dirtylog_faulted(c->log))
        lost = "the dirty log was truncated by the front-end (SIGBUS absorbed)";
    else if (c->inflight_guard >= 0 && vhd_memguard_faulted(c->inflight_guard))
        lost = "the inflight area was truncated by the front-end (SIGBUS absorbed)";
    if (lost) {
        /*
         * The mapping reads zeros now (memguard.h): stop every queue of the
         * device, so it touches that memory no more; queue_attach keeps
         * them stopped until the front-end resets the device.
         */
        vhd_vu__conn_mark_broken(c, lost, true);
        (void)vhd_vu__dev_quiesce(c);
        found = true;
    }
    return found;
}

/* ---- generic validation and dispatch ---- */

/* Check the request against its table entry. 0 or -errno with r->why set. */
static int req_validate(struct vhd_vu_conn *c, const struct vu_req_info *info, struct vu_req *r)
{
    uint32_t size = r->hdr->size;
    const union vu_payload *p = r->p;

    if (info->gate) {
        uint64_t have = info->gate_offered ? vhd_vu_offered_protocol_features(c->dev)
                                           : c->dev->protocol_features;
        if (!(have & info->gate)) {
            r->why = info->gate_offered ? "protocol feature not offered"
                                        : "protocol feature not negotiated";
            return -EOPNOTSUPP;
        }
    }

    switch (info->size_rule) {
    case SZ_EXACT:
        if (size != info->size) {
            r->why = "bad payload size";
            return -EINVAL;
        }
        break;
    case SZ_MEM_TABLE:
        if (size < VU_MEM_TABLE_HDR_SIZE) {
            r->why = "bad payload size";
            return -EINVAL;
        }
        if (p->mem.nregions > VHOST_USER_MEM_TABLE_MAX_REGIONS) {
            r->why = "too many memory regions";
            return -E2BIG;
        }
        if (size != VU_MEM_TABLE_HDR_SIZE + p->mem.nregions * sizeof(struct vu_mem_region)) {
            r->why = "payload size does not match the region count";
            return -EINVAL;
        }
        break;
    case SZ_CONFIG:
        if (size < VU_CONFIG_HDR_SIZE || p->config.size > VHOST_USER_MAX_CONFIG_SIZE ||
            size != VU_CONFIG_HDR_SIZE + p->config.size) {
            r->why = "bad config payload size";
            return -EINVAL;
        }
        break;
    default:
        r->why = "internal: bad size rule";
        return -EINVAL;
    }

    unsigned want_min = 0, want_max = 0;
    switch (info->fd_rule) {
    case FD_NONE:
        break;
    case FD_ONE:
        want_min = want_max = 1;
        break;
    case FD_OPT_ONE:
        want_max = 1;
        break;
    case FD_VRING: {
        uint64_t v = p->u64;
        if (v & ~(uint64_t)(VHOST_USER_VRING_IDX_MASK | VHOST_USER_VRING_NOFD_MASK)) {
            r->why = "reserved bits set in the ring index word";
            return -EINVAL;
        }
        want_min = want_max = (v & VHOST_USER_VRING_NOFD_MASK) ? 0 : 1;
        break;
    }
    case FD_PER_REGION:
        want_min = want_max = p->mem.nregions;
        break;
    default:
        r->why = "internal: bad fd rule";
        return -EINVAL;
    }
    if (r->nfds < want_min || r->nfds > want_max) {
        r->why = "wrong number of file descriptors";
        return -EBADF;
    }

    uint64_t idx;
    switch (info->index_rule) {
    case IDX_NONE:
        return 0;
    case IDX_STATE:
        idx = p->state.index;
        break;
    case IDX_ADDR:
        idx = p->addr.index;
        break;
    case IDX_U64:
        idx = p->u64 & VHOST_USER_VRING_IDX_MASK;
        break;
    default:
        r->why = "internal: bad index rule";
        return -EINVAL;
    }
    if (idx >= c->dev->num_queues) {
        r->why = "ring index out of range";
        return -ERANGE;
    }
    return 0;
}

/* The queue named by a validated ring index, clamped against speculation. */
struct vhd_queue *vhd_vu__req_queue(struct vhd_vu_conn *c, uint64_t idx)
{
    return &c->dev->queues[vhd_index_nospec(idx, c->dev->num_queues)];
}

/* Send a reply, with fd (-1: none; the caller still owns it) in its ancillary data. */
static int send_reply_fd(struct vhd_vu_conn *c, uint32_t request, const void *payload,
                         uint32_t size, int fd)
{
    /* Spec "Header": replies carry the version and the reply flag, nothing else. */
    struct vu_hdr h = {
        .request = request, .flags = VHOST_USER_VERSION | VHOST_USER_REPLY_MASK, .size = size};
    int rc = vu_send(c->fd, &h, size ? payload : NULL, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0,
                     CONN_SEND_TIMEOUT_MS);
    if (rc < 0)
        VHD_LOG_RL(VHD_LOG_WARN, "%s: cannot send %s reply: %s", c->dev->name,
                   vu_request_name(request), strerror(-rc));
    return rc;
}

static int send_reply(struct vhd_vu_conn *c, uint32_t request, const void *payload, uint32_t size)
{
    return send_reply_fd(c, request, payload, size, -1);
}

static void req_close_fds(struct vu_req *r)
{
    for (unsigned i = 0; i < r->nfds; i++)
        vhd_vu__close_fd(&r->fds[i]);
}

/*
 * Does the request have a reply of its own? An errno_reply request has one
 * only once its gate is negotiated (SET_LOG_BASE: with LOG_SHMFD); before,
 * it is acked (REPLY_ACK) like any request without one.
 */
static bool req_has_reply(const struct vhd_vu_conn *c, const struct vu_req_info *info)
{
    if (!info->reply)
        return false;
    return !info->errno_reply || !info->gate || (c->dev->protocol_features & info->gate);
}

int vhd_vu_conn_handle(struct vhd_vu_conn *c, const struct vu_hdr *hdr,
                       const union vu_payload *payload, int *fds, unsigned nfds)
{
    struct vu_req r = {.hdr = hdr, .p = payload, .reply_fd = -1};
    const struct vu_req_info *info = NULL;
    uint32_t req = hdr->request;
    int rc;

    if (nfds > VHOST_USER_MAX_FDS) {
        for (unsigned i = 0; i < nfds; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        VHD_LOG_RL(VHD_LOG_WARN, "%s: %s with %u fds (at most %d): closing the connection",
                   c->dev->name, vu_request_name(req), nfds, VHOST_USER_MAX_FDS);
        return -EPROTO;
    }
    memcpy(r.fds, fds, nfds * sizeof(int));
    r.nfds = nfds;

    /* Header (spec "Header"): version 1; a request never has the reply flag. */
    if ((hdr->flags & VHOST_USER_VERSION_MASK) != VHOST_USER_VERSION ||
        (hdr->flags & ~(VHOST_USER_VERSION_MASK | VHOST_USER_NEED_REPLY_MASK)) ||
        hdr->size > VU_MAX_PAYLOAD) {
        req_close_fds(&r);
        VHD_LOG_RL(VHD_LOG_WARN, "%s: %s: bad header (flags 0x%x, size %u): closing the connection",
                   c->dev->name, vu_request_name(req), hdr->flags, hdr->size);
        return -EPROTO;
    }

    bool need_reply = (hdr->flags & VHOST_USER_NEED_REPLY_MASK) != 0;
    bool ack_before = proto_has(c, VHOST_USER_PROTOCOL_F_REPLY_ACK);

    if (req < VHOST_USER_REQUEST_MAX) /* clamped: info->handler is an indirect call */
        info = &vu_reqs[vhd_index_nospec(req, VHOST_USER_REQUEST_MAX)];
    if (!info || !info->handler) {
        r.why = "unsupported request";
        rc = -EOPNOTSUPP;
        goto fail;
    }
    rc = req_validate(c, info, &r);
    if (rc < 0)
        goto fail;
    vhd_log(VHD_LOG_DEBUG, "%s: %s size %u fds %u%s", c->dev->name, info->name, hdr->size, nfds,
            need_reply ? " need-reply" : "");
    rc = info->handler(c, &r);
    if (rc < 0)
        goto fail;
    if (c->dev->config_changed) { /* the device changed its config space (dev.h) */
        c->dev->config_changed = false;
        (void)vhd_vu_conn_config_changed(c);
    }
    if (c->config_change_pending && vhd_vu__any_ring_started(c->dev))
        (void)vhd_vu_conn_config_changed(c); /* held while suspended: the device resumed */
    req_close_fds(&r);                       /* fds the handler did not keep */
    if (req_has_reply(c, info)) {
        rc = send_reply_fd(c, req, &r.reply, r.reply_size, r.reply_fd);
        vhd_vu__close_fd(&r.reply_fd); /* the front-end has its own copy now */
        return rc;
    }
    if (need_reply && (ack_before || proto_has(c, VHOST_USER_PROTOCOL_F_REPLY_ACK))) {
        uint64_t ok = 0;
        return send_reply(c, req, &ok, sizeof(ok));
    }
    return 0;

fail:
    req_close_fds(&r);
    vhd_vu__close_fd(&r.reply_fd);
    VHD_LOG_RL(VHD_LOG_WARN, "%s: %s (request %u, size %u, %u fds) failed: %s (%s)", c->dev->name,
               vu_request_name(req), req, hdr->size, nfds, r.why ? r.why : "error", strerror(-rc));
    if (info && req_has_reply(c, info)) {
        if (info->empty_error_reply)
            return send_reply(c, req, NULL, 0);
        if (info->errno_reply) {
            uint64_t err = (uint64_t)-rc;
            return send_reply(c, req, &err, sizeof(err));
        }
        return rc; /* no error form of this reply: end the session */
    }
    if (need_reply && (ack_before || proto_has(c, VHOST_USER_PROTOCOL_F_REPLY_ACK))) {
        /* REPLY_ACK: "non-zero on failure"; the positive errno says which. */
        uint64_t err = (uint64_t)-rc;
        return send_reply(c, req, &err, sizeof(err));
    }
    return rc; /* the front-end cannot learn of the failure: end the session */
}

int vhd_vu_conn_process(struct vhd_vu_conn *c)
{
    for (int n = 0; n < CONN_MSGS_PER_WAKEUP; n++) {
        int rc = vu_rx_read(&c->rx, c->fd);
        if (rc == 0)
            return 0;
        if (rc < 0) {
            if (rc == -ECONNRESET)
                vhd_log(VHD_LOG_INFO, "%s: front-end disconnected", c->dev->name);
            else
                VHD_LOG_RL(VHD_LOG_WARN, "%s: bad message framing: %s: closing the connection",
                           c->dev->name,
                           rc == -EMSGSIZE ? "payload size above the largest message"
                           : rc == -EPROTO ? "too many fds or bad ancillary data"
                                           : strerror(-rc));
            return rc;
        }
        rc = vhd_vu_conn_handle(c, &c->rx.hdr, &c->rx.payload, c->rx.fds, c->rx.nfds);
        vu_rx_next(&c->rx); /* the fds were consumed by the handler */
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- handlers: features ---- */

static int h_get_features(struct vhd_vu_conn *c, struct vu_req *r)
{
    r->reply.u64 = vhd_vu_offered_features(c->dev);
    r->reply_size = sizeof(uint64_t);
    return 0;
}

/*
 * SET_FEATURES: the value must be a subset of what GET_FEATURES offers, with
 * a ring layout the device allows. Virtio features are fixed once the rings
 * run, so a different value while a ring is started is refused, except for
 * VHOST_F_LOG_ALL: QEMU turns dirty logging on and off on running rings
 * (spec "Migration"); every started queue follows it (vhd_vu__queue_apply_log). The device sees
 * the virtio bits only (PROTOCOL_FEATURES stripped), with its queues
 * detached. Spec "Ring states": without PROTOCOL_FEATURES every ring is
 * enabled immediately.
 */
static int h_set_features(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_dev *dev = c->dev;
    uint64_t f = r->p->u64;
    uint64_t vf = f & ~BIT(VHOST_USER_F_PROTOCOL_FEATURES);

    if (f & ~vhd_vu_offered_features(dev)) {
        r->why = "features not offered";
        return -EINVAL;
    }
    if (!layout_allowed(dev, (vf & BIT(VIRTIO_F_RING_PACKED)) != 0)) {
        r->why = "ring layout not allowed for this device";
        return -EINVAL;
    }
    if (c->features_set && vhd_vu__any_ring_started(dev) &&
        ((vf ^ dev->features) & ~BIT(VHOST_F_LOG_ALL))) {
        r->why = "features changed while a ring is started";
        return -EBUSY;
    }
    uint64_t prev = dev->features; /* ops->set_features may store the new value */
    int rc = vhd_vu__dev_quiesce(c);
    if (rc < 0) {
        vhd_vu__dev_resume(c);
        r->why = "queues did not stop";
        return rc;
    }
    if (vf & BIT(VIRTIO_F_ACCESS_PLATFORM)) {
        rc = vhd_vu__iotlb_setup(c);
        if (rc < 0) {
            vhd_vu__dev_resume(c);
            r->why = "no memory for the IOTLB";
            return rc;
        }
    }
    if (dev->ops->set_features) {
        /* ACCESS_PLATFORM is the transport's (addresses are IOVAs), not the device's. */
        rc = dev->ops->set_features(dev, vf & ~BIT(VIRTIO_F_ACCESS_PLATFORM));
        if (rc < 0) {
            vhd_vu__dev_resume(c);
            r->why = "the device refused the features";
            return rc;
        }
    }
    if (!c->features_set || dev->features != vf || c->acked_features != f)
        vhd_log(VHD_LOG_INFO, "%s: features 0x%llx%s", dev->name, (unsigned long long)vf,
                (f & BIT(VHOST_USER_F_PROTOCOL_FEATURES)) ? " + PROTOCOL_FEATURES" : "");
    if ((vf ^ prev) & BIT(VHOST_F_LOG_ALL))
        vhd_log(VHD_LOG_INFO, "%s: dirty logging %s%s", dev->name,
                (vf & BIT(VHOST_F_LOG_ALL)) ? "on" : "off",
                (vf & BIT(VHOST_F_LOG_ALL)) && !c->log ? " (no log yet: SET_LOG_BASE)" : "");
    dev->features = vf;
    c->acked_features = f;
    c->features_set = true;
    if (!(f & BIT(VHOST_USER_F_PROTOCOL_FEATURES)))
        for (uint32_t i = 0; i < dev->num_queues; i++)
            dev->queues[i].enabled = true;
    for (uint32_t i = 0; i < dev->num_queues; i++)
        if (dev->queues[i].started)
            vhd_vu__queue_apply_log(c, &dev->queues[i]);
    vhd_vu__dev_resume(c);
    return 0;
}

static int h_get_protocol_features(struct vhd_vu_conn *c, struct vu_req *r)
{
    r->reply.u64 = vhd_vu_offered_protocol_features(c->dev);
    r->reply_size = sizeof(uint64_t);
    return 0;
}

/* Must be a subset of the offer (so INBAND_NOTIFICATIONS, never offered, cannot be set). */
static int h_set_protocol_features(struct vhd_vu_conn *c, struct vu_req *r)
{
    uint64_t f = r->p->u64;

    if (f & ~vhd_vu_offered_protocol_features(c->dev)) {
        r->why = "protocol features not offered";
        return -EINVAL;
    }
    c->dev->protocol_features = f;
    c->protocol_features_set = true;
    vhd_log(VHD_LOG_INFO, "%s: protocol features 0x%llx", c->dev->name, (unsigned long long)f);
    return 0;
}

/* SET_OWNER marks the session start; repeating it in the same session is harmless. */
static int h_set_owner(struct vhd_vu_conn *c, struct vu_req *r)
{
    (void)c;
    (void)r;
    return 0;
}

/*
 * RESET_OWNER is deprecated; the spec recommends ignoring it or disabling all
 * rings. We disable all rings (started rings keep their state and resume on
 * SET_VRING_ENABLE), which never loses ring state.
 */
static int h_reset_owner(struct vhd_vu_conn *c, struct vu_req *r)
{
    int rc = 0;

    for (uint32_t i = 0; i < c->dev->num_queues; i++) {
        struct vhd_queue *q = &c->dev->queues[i];
        int qrc = vhd_vu__queue_set_enabled(c, q, false);
        if (qrc < 0 && rc == 0)
            rc = qrc;
    }
    if (rc < 0)
        r->why = "queues did not stop";
    return rc;
}

static int h_get_queue_num(struct vhd_vu_conn *c, struct vu_req *r)
{
    r->reply.u64 = c->dev->ops->queue_num ? c->dev->ops->queue_num(c->dev) : c->dev->num_queues;
    r->reply_size = sizeof(uint64_t);
    return 0;
}

/* ---- handlers: network devices (ops->set_mtu, ops->send_rarp) ---- */

/* NET_SET_MTU: u64 MTU; with REPLY_ACK the ack says whether the device took it. */
static int h_net_set_mtu(struct vhd_vu_conn *c, struct vu_req *r)
{
    uint64_t mtu = r->p->u64;

    if (!c->dev->ops->set_mtu) {
        r->why = "not a network device";
        return -EOPNOTSUPP;
    }
    int rc = mtu > UINT32_MAX ? -EINVAL : c->dev->ops->set_mtu(c->dev, (uint32_t)mtu);
    if (rc < 0)
        r->why = "MTU refused by the device";
    return rc;
}

/* SEND_RARP: the first 6 bytes of the u64 payload are the guest's MAC address. */
static int h_send_rarp(struct vhd_vu_conn *c, struct vu_req *r)
{
    uint8_t mac[6];

    if (!c->dev->ops->send_rarp) {
        r->why = "not a network device";
        return -EOPNOTSUPP;
    }
    memcpy(mac, &r->p->u64, sizeof(mac));
    int rc = c->dev->ops->send_rarp(c->dev, mac);
    if (rc < 0)
        r->why = "RARP refused by the device";
    return rc;
}

/* ---- handlers: config, back-end channel, reset, status ---- */

static int config_check(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_config *cfg = &r->p->config;
    uint32_t cs = c->dev->ops->config_size;

    if (cfg->flags > VHOST_USER_CONFIG_FLAG_MIGRATION) {
        r->why = "unknown config flags";
        return -EINVAL;
    }
    if (cfg->size == 0 || cfg->offset > cs || cfg->size > cs - cfg->offset) {
        r->why = "config access outside the config space";
        return -EINVAL;
    }
    return 0;
}

/* GET_CONFIG: the reply echoes offset, size and flags; a failure is an empty reply (spec). */
static int h_get_config(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_config *cfg = &r->p->config;

    int rc = config_check(c, r);
    if (rc < 0)
        return rc;
    if (!c->dev->ops->get_config) {
        r->why = "device has no config space";
        return -EOPNOTSUPP;
    }
    r->reply.config.offset = cfg->offset;
    r->reply.config.size = cfg->size;
    r->reply.config.flags = cfg->flags;
    rc = c->dev->ops->get_config(c->dev, r->reply.config.region, cfg->offset, cfg->size);
    if (rc < 0) {
        r->why = "the device could not read its config space";
        return rc;
    }
    r->reply_size = VU_CONFIG_HDR_SIZE + cfg->size;
    return 0;
}

/*
 * SET_CONFIG with the device's queues quiesced. Flag 0: the device accepts
 * writable fields only (-EPERM otherwise). Flag 1 (live migration): read-only
 * fields may be "written" too; since dev.h's set_config has no flags, a write
 * the device refuses with -EPERM is accepted when it matches the current
 * contents (the destination restoring the source's identical config).
 */
static int h_set_config(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_config *cfg = &r->p->config;
    struct vhd_dev *dev = c->dev;

    int rc = config_check(c, r);
    if (rc < 0)
        return rc;
    if (!dev->ops->set_config) {
        r->why = "config space is read-only";
        return -EPERM;
    }
    rc = vhd_vu__dev_quiesce(c);
    if (rc < 0) {
        vhd_vu__dev_resume(c);
        r->why = "queues did not stop";
        return rc;
    }
    rc = dev->ops->set_config(dev, cfg->region, cfg->offset, cfg->size);
    if (rc == -EPERM && cfg->flags == VHOST_USER_CONFIG_FLAG_MIGRATION && dev->ops->get_config) {
        uint8_t cur[VHOST_USER_MAX_CONFIG_SIZE];
        if (dev->ops->get_config(dev, cur, cfg->offset, cfg->size) == 0 &&
            memcmp(cur, cfg->region, cfg->size) == 0)
            rc = 0;
    }
    vhd_vu__dev_resume(c);
    if (rc < 0)
        r->why = "the device refused the config write";
    return rc;
}

/* SET_BACKEND_REQ_FD: keep the channel for back-end requests (replaces an earlier one). */
static int h_set_backend_req_fd(struct vhd_vu_conn *c, struct vu_req *r)
{
    vhd_vu__close_fd(&c->backend_fd);
    c->backend_fd = r->fds[0];
    r->fds[0] = -1;
    /* Back-end messages must never block the control thread for long. */
    int fl = fcntl(c->backend_fd, F_GETFL);
    if (fl >= 0)
        (void)fcntl(c->backend_fd, F_SETFL, fl | O_NONBLOCK);
    return 0;
}

/*
 * RESET_DEVICE: "disable all rings and reset all internal device state to the
 * initial state, ready to be reinitialized. The back-end retains ownership".
 * Every ring is stopped (kick fd closed) and disabled and forgets its size,
 * addresses and base; features and status are cleared; ops->reset runs. The
 * session keeps its memory table, protocol features, back-end channel and
 * the call/error fds: QEMU negotiates those once per connection and does not
 * send them again before reinitialising the rings.
 */
static int h_reset_device(struct vhd_vu_conn *c, struct vu_req *r)
{
    int rc = conn_reset_device(c, true);
    if (rc < 0)
        r->why = "queues did not stop";
    else
        vhd_log(VHD_LOG_INFO, "%s: device reset by the front-end", c->dev->name);
    return rc;
}

/*
 * SET_STATUS records the virtio status byte; it does not reset or stop
 * anything: QEMU writes 0 before it stops the rings with GET_VRING_BASE, so
 * a reset here would lose the ring state. Writing 0 (a driver reset) clears
 * a previous NEEDS_RESET.
 */
static int h_set_status(struct vhd_vu_conn *c, struct vu_req *r)
{
    uint64_t v = r->p->u64;

    if (v > 0xff) {
        r->why = "status above 8 bits";
        return -EINVAL;
    }
    c->dev->status = (uint8_t)(v & ~(uint64_t)VIRTIO_STATUS_NEEDS_RESET);
    if (v == 0)
        c->dev->broken = false;
    return 0;
}

static int h_get_status(struct vhd_vu_conn *c, struct vu_req *r)
{
    (void)vhd_vu_conn_check_queues(c); /* a worker may have broken a queue since */
    r->reply.u64 = c->dev->status | (c->dev->broken ? VIRTIO_STATUS_NEEDS_RESET : 0);
    r->reply_size = sizeof(uint64_t);
    return 0;
}
