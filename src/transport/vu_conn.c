/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A vhost-user front-end session (see vu_conn.h): the request table, the
 * generic validation that runs before any handler, the handlers, the ring
 * state machine of the spec's "Ring states" section, and the quiescence of a
 * device's queues around control-plane changes.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
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
#include "core/virtio.h"
#include "runtime/efd.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "vu_conn.h"
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

#define BIT(n) (1ull << (n))

struct vhd_vu_conn {
    struct vhd_dev *dev;
    int fd;                     /* the session socket (owned) */
    struct vu_rx rx;            /* message being received */
    uint64_t acked_features;    /* SET_FEATURES value, PROTOCOL_FEATURES bit included */
    bool features_set;          /* SET_FEATURES received since the session/reset started */
    bool protocol_features_set; /* SET_PROTOCOL_FEATURES received */
    int backend_fd;             /* SET_BACKEND_REQ_FD channel, or -1 */
    int detach_timeout_ms;
    bool *err_signalled; /* per queue: its broken state was signalled on err_fd */
    /* SET_INFLIGHT_FD: the mapped inflight area (NULL: none) and its shape. */
    void *inflight;
    uint64_t inflight_size;
    uint16_t inflight_num_queues;
    uint16_t inflight_queue_size;
    int inflight_guard; /* its vhd_memguard slot (a truncated file cannot kill us), or -1 */
    /* SET_LOG_BASE: the dirty log (NULL: none); queues use it while LOG_ALL is negotiated. */
    struct vhd_dirtylog *log;
};

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
static int h_set_mem_table(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_vring_num(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_vring_addr(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_vring_base(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_vring_base(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_vring_kick(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_vring_call(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_vring_err(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_protocol_features(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_protocol_features(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_queue_num(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_vring_enable(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_backend_req_fd(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_config(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_config(struct vhd_vu_conn *c, struct vu_req *r);
static int h_reset_device(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_max_mem_slots(struct vhd_vu_conn *c, struct vu_req *r);
static int h_add_mem_reg(struct vhd_vu_conn *c, struct vu_req *r);
static int h_rem_mem_reg(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_status(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_status(struct vhd_vu_conn *c, struct vu_req *r);
static int h_send_rarp(struct vhd_vu_conn *c, struct vu_req *r);
static int h_net_set_mtu(struct vhd_vu_conn *c, struct vu_req *r);
static int h_get_inflight_fd(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_inflight_fd(struct vhd_vu_conn *c, struct vu_req *r);
static int h_set_log_base(struct vhd_vu_conn *c, struct vu_req *r);

/* Payload sizes and gates, for the table below. */
#define U64             ((uint16_t)sizeof(uint64_t))
#define STATE           ((uint16_t)sizeof(struct vu_vring_state))
#define ADDR            ((uint16_t)sizeof(struct vu_vring_addr))
#define MREG            ((uint16_t)sizeof(struct vu_mem_single))
#define INFLIGHT        ((uint16_t)sizeof(struct vu_inflight))
#define LOG             ((uint16_t)sizeof(struct vu_log))
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
    REQ(SET_MEM_TABLE, h_set_mem_table, .size_rule = SZ_MEM_TABLE, .fd_rule = FD_PER_REGION),
    /* Spec "Communication": with LOG_SHMFD, SET_LOG_BASE has a reply. */
    REQ(SET_LOG_BASE, h_set_log_base, .size = LOG, .fd_rule = FD_ONE, .gate = PF(LOG_SHMFD),
        .reply = true, .errno_reply = true),
    REQ(SET_LOG_FD, NULL),
    REQ(SET_VRING_NUM, h_set_vring_num, .size = STATE, .index_rule = IDX_STATE),
    REQ(SET_VRING_ADDR, h_set_vring_addr, .size = ADDR, .index_rule = IDX_ADDR),
    REQ(SET_VRING_BASE, h_set_vring_base, .size = STATE, .index_rule = IDX_STATE),
    REQ(GET_VRING_BASE, h_get_vring_base, .size = STATE, .index_rule = IDX_STATE, .reply = true),
    REQ(SET_VRING_KICK, h_set_vring_kick, .size = U64, .fd_rule = FD_VRING, .index_rule = IDX_U64),
    REQ(SET_VRING_CALL, h_set_vring_call, .size = U64, .fd_rule = FD_VRING, .index_rule = IDX_U64),
    REQ(SET_VRING_ERR, h_set_vring_err, .size = U64, .fd_rule = FD_VRING, .index_rule = IDX_U64),
    REQ(GET_PROTOCOL_FEATURES, h_get_protocol_features, .reply = true),
    REQ(SET_PROTOCOL_FEATURES, h_set_protocol_features, .size = U64),
    /* "should be sent only when MQ is set in queried protocol features": offered suffices. */
    REQ(GET_QUEUE_NUM, h_get_queue_num, .gate = PF(MQ), .gate_offered = true, .reply = true),
    REQ(SET_VRING_ENABLE, h_set_vring_enable, .size = STATE, .index_rule = IDX_STATE),
    /* Net devices (ops->send_rarp / set_mtu): "present in GET_PROTOCOL_FEATURES", so offered. */
    REQ(SEND_RARP, h_send_rarp, .size = U64, .gate = PF(RARP), .gate_offered = true),
    REQ(NET_SET_MTU, h_net_set_mtu, .size = U64, .gate = PF(MTU), .gate_offered = true),
    REQ(SET_BACKEND_REQ_FD, h_set_backend_req_fd, .fd_rule = FD_ONE, .gate = PF(BACKEND_REQ)),
    REQ(IOTLB_MSG, NULL, .reply = true),
    REQ(SET_VRING_ENDIAN, NULL),
    REQ(GET_CONFIG, h_get_config, .size_rule = SZ_CONFIG, .gate = PF(CONFIG), .reply = true,
        .empty_error_reply = true),
    REQ(SET_CONFIG, h_set_config, .size_rule = SZ_CONFIG, .gate = PF(CONFIG)),
    REQ(CREATE_CRYPTO_SESSION, NULL, .reply = true),
    REQ(CLOSE_CRYPTO_SESSION, NULL),
    REQ(POSTCOPY_ADVISE, NULL, .reply = true),
    REQ(POSTCOPY_LISTEN, NULL),
    REQ(POSTCOPY_END, NULL, .reply = true),
    REQ(GET_INFLIGHT_FD, h_get_inflight_fd, .size = INFLIGHT, .gate = PF(INFLIGHT_SHMFD),
        .reply = true),
    REQ(SET_INFLIGHT_FD, h_set_inflight_fd, .size = INFLIGHT, .fd_rule = FD_ONE,
        .gate = PF(INFLIGHT_SHMFD)),
    REQ(GPU_SET_SOCKET, NULL),
    /* "Only valid if the RESET_DEVICE protocol feature is set by the back-end": offered. */
    REQ(RESET_DEVICE, h_reset_device, .gate = PF(RESET_DEVICE), .gate_offered = true),
    REQ(VRING_KICK, NULL),
    REQ(GET_MAX_MEM_SLOTS, h_get_max_mem_slots, .gate = PF(CONFIGURE_MEM_SLOTS), .reply = true),
    REQ(ADD_MEM_REG, h_add_mem_reg, .size = MREG, .fd_rule = FD_ONE,
        .gate = PF(CONFIGURE_MEM_SLOTS)),
    REQ(REM_MEM_REG, h_rem_mem_reg, .size = MREG, .fd_rule = FD_OPT_ONE,
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
 * Virtio bits the transport cannot honour yet, whatever the device offers.
 * VHOST_F_LOG_ALL is the transport's own: offered for devices that log
 * their writes (ops->dirty_log).
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
        f |= BIT(VHOST_F_LOG_ALL);
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

static bool feature_has(const struct vhd_vu_conn *c, int bit)
{
    return (c->dev->features & BIT(bit)) != 0;
}

/* ---- queues: attach, detach, quiescence ---- */

static void conn_mark_broken(struct vhd_vu_conn *c, const char *why, bool log);

static bool any_ring_started(const struct vhd_dev *dev)
{
    for (uint32_t i = 0; i < dev->num_queues; i++)
        if (dev->queues[i].started)
            return true;
    return false;
}

static unsigned queue_worker_of(const struct vhd_dev *dev, uint32_t i)
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
    q->worker_idx = (int)queue_worker_of(dev, i);
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

/*
 * Spec "Ring states": a ring is processed only while started; we also require
 * it enabled (see h_set_vring_enable), unless the device processes disabled
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
static void queue_apply_log(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    const struct vhd_dirtylog *log = feature_has(c, VHOST_F_LOG_ALL) ? c->log : NULL;

    vhd_vq_set_log(&q->vq, log, q->addr_log_on, q->addr_log);
}

/*
 * Take q back from its worker (in-flight requests complete first). On
 * timeout the queue stays attached: the device is broken and the session
 * must never free memory the worker may still use.
 */
static int queue_detach(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    if (!q->attached)
        return 0;
    int rc = vhd_rt_detach(c->dev->rt, q, c->detach_timeout_ms);
    if (rc < 0) {
        /* vhd_rt_detach logged it. */
        conn_mark_broken(c, "a queue does not stop", false);
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
    q->worker_idx = (int)queue_worker_of(c->dev, q->index);
    int rc = vhd_rt_attach(c->dev->rt, q, (unsigned)q->worker_idx);
    if (rc < 0) {
        /* vhd_rt_attach logged it. */
        conn_mark_broken(c, "a queue cannot be started", false);
        return rc;
    }
    q->attached = true;
    return 0;
}

/* Attach or detach q so that it runs exactly when it should. */
static int queue_sync(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    if (queue_should_run(q))
        return queue_attach(c, q);
    return queue_detach(c, q);
}

/*
 * Change q's enabled state, then sync. A worker may read q->enabled while it
 * runs q (ops->run_disabled, dev.h), so the state changes only while q is
 * detached.
 */
static int queue_set_enabled(struct vhd_vu_conn *c, struct vhd_queue *q, bool enabled)
{
    if (q->attached && q->enabled != enabled) {
        int rc = queue_detach(c, q);
        if (rc < 0)
            return rc;
    }
    q->enabled = enabled;
    return queue_sync(c, q);
}

/*
 * Targeted quiescence: detach every attached queue of this device only (the
 * workers of other devices are not involved). On failure some queues may be
 * detached and one is stuck; call dev_resume() either way.
 */
static int dev_quiesce(struct vhd_vu_conn *c)
{
    for (uint32_t i = 0; i < c->dev->num_queues; i++) {
        int rc = queue_detach(c, &c->dev->queues[i]);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Re-attach every queue that should run. Failures are logged and break the device. */
static void dev_resume(struct vhd_vu_conn *c)
{
    for (uint32_t i = 0; i < c->dev->num_queues; i++) {
        struct vhd_queue *q = &c->dev->queues[i];
        if (queue_should_run(q))
            (void)queue_attach(c, q);
    }
}

/*
 * Finish what a restarted ring owes before it stops: the chains the inflight
 * area listed for resubmission that were not popped yet (a ring stopped
 * right after its start, or started but never enabled, which no worker
 * runs).
 *
 * Why complete them rather than answer around them. The engine placed
 * last_avail_idx after every chain in flight when the ring started
 * (inflight.c), so the base GET_VRING_BASE returns already counts these
 * chains as consumed. Only a front-end that hands the same area back would
 * find them again; one that gets only the base (a migration destination,
 * a front-end that resets the area) would lose them. A base that leaves
 * them out cannot be given either: the chains in flight need not be the
 * last ones made available (split: any heads among avail[0 .. base)), so a
 * lower base would make a back-end pop completed chains again. The spec
 * gives GET_VRING_BASE the next index to process with every request before
 * it done (QEMU's vhost-user-blk stops the device this way before a
 * migration and takes used->idx from memory; libvhost-user returns its
 * last_avail_idx as set at restart, and has this gap). So: run the ring on its worker, popping
 * only the listed chains (inf_resubmit_only), until they have completed
 * and been published like any request in flight at a stop. Then base ==
 * used position and the area holds nothing, whoever starts the ring next.
 * A disabled ring runs too: these requests were accepted before the
 * restart; no new chain is taken. Bounded by the detach timeout; on
 * failure the device is broken (NEEDS_RESET) and the area still lists them.
 */
static int queue_finish_resubmit(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    uint32_t n = vhd_vq_resubmit_pending(&q->vq);

    if (n == 0 || q->broken || q->vq.error)
        return 0;
    vhd_log(VHD_LOG_INFO, "%s: queue %u: stopping: completing %u resubmitted requests first",
            c->dev->name, q->index, n);
    q->vq.inf_resubmit_only = true;
    /* Each pass runs until a turn takes less than a budget; a device may stop short. */
    for (int pass = 0; pass < 8 && vhd_vq_resubmit_pending(&q->vq) && !q->broken && !q->vq.error;
         pass++) {
        q->worker_idx = (int)queue_worker_of(c->dev, q->index);
        int rc = vhd_rt_drain(c->dev->rt, q, (unsigned)q->worker_idx, c->detach_timeout_ms);
        if (rc < 0) {
            if (!q->attached)
                q->vq.inf_resubmit_only = false;
            conn_mark_broken(c, "a stopped ring could not complete its resubmitted requests",
                             false);
            return rc;
        }
    }
    q->vq.inf_resubmit_only = false;
    if (vhd_vq_resubmit_pending(&q->vq) && !q->broken && !q->vq.error) {
        conn_mark_broken(c, "a stopped ring could not complete its resubmitted requests", true);
        return -EIO;
    }
    return 0;
}

/*
 * Stop a started ring (GET_VRING_BASE, reset, disconnect): detach (drains
 * in-flight I/O), complete what a restart left to resubmit, save its base,
 * queue_fini, close the kick fd (the spec restarts a ring only on a new
 * kick fd).
 */
static int queue_stop(struct vhd_vu_conn *c, struct vhd_queue *q)
{
    if (!q->started)
        return 0;
    int rc = queue_detach(c, q);
    if (rc < 0)
        return rc;
    rc = queue_finish_resubmit(c, q);
    if (rc < 0)
        return rc;
    q->base = vhd_vq_get_base(&q->vq);
    if (c->dev->ops->queue_fini)
        c->dev->ops->queue_fini(c->dev, q);
    vhd_vq_fini(&q->vq); /* stops using the inflight area */
    q->priv = NULL;
    q->started = false;
    close_fd(&q->kick_fd);
    return 0;
}

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
        if (q->started && !queue_rings_in(q, newmem)) {
            vhd_mem_free(newmem);
            r->why = "a started ring would be outside the new memory table";
            return -EBUSY;
        }
    }
    int rc = dev_quiesce(c);
    if (rc < 0) {
        dev_resume(c);
        vhd_mem_free(newmem);
        r->why = "queues did not stop";
        return rc;
    }
    for (uint32_t i = 0; i < dev->num_queues; i++) {
        struct vhd_queue *q = &dev->queues[i];
        if (q->started)
            vhd_vq_set_mem(&q->vq, newmem);
    }
    struct vhd_mem *old = dev->mem;
    dev->mem = newmem;
    vhd_mem_free(old);
    dev_resume(c);
    return 0;
}

/* Drop the inflight area. No started ring may be using it. */
static void inflight_unmap(struct vhd_vu_conn *c)
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
        int qrc = queue_stop(c, &dev->queues[i]);
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
        close_fd(&q->kick_fd);
        if (!keep_session) {
            close_fd(&call_fd);
            close_fd(&err_fd);
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
    inflight_unmap(c);
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
        close_fd(&c->backend_fd);
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
        close_fd(&c->backend_fd);
    }
    vu_rx_reset(&c->rx);
    close(c->fd);
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

    if (c->backend_fd < 0 || !proto_has(c, VHOST_USER_PROTOCOL_F_BACKEND_REQ) ||
        !proto_has(c, VHOST_USER_PROTOCOL_F_CONFIG))
        return -ENOTCONN;
    int rc = vu_send(c->backend_fd, &h, NULL, NULL, 0, CONN_SEND_TIMEOUT_MS);
    if (rc < 0) {
        vhd_log(VHD_LOG_WARN,
                "%s: cannot send CONFIG_CHANGE to the front-end: %s; "
                "closing the back-end channel",
                c->dev->name, strerror(-rc));
        close_fd(&c->backend_fd);
    }
    return rc;
}

/*
 * Set NEEDS_RESET and notify the front-end, except while the device is
 * suspended (spec "Suspended device state": with every ring stopped the
 * back-end must not send messages to the front-end); GET_STATUS still
 * reports it.
 */
static void conn_mark_broken(struct vhd_vu_conn *c, const char *why, bool log)
{
    if (c->dev->broken)
        return;
    c->dev->broken = true;
    if (log)
        vhd_log(VHD_LOG_ERROR, "%s: device needs reset: %s", c->dev->name, why);
    if (any_ring_started(c->dev))
        (void)vhd_vu_conn_config_changed(c);
}

void vhd_vu_conn_set_broken(struct vhd_vu_conn *c, const char *why)
{
    conn_mark_broken(c, why, true);
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
        conn_mark_broken(c, "a queue broke", false); /* the worker logged why */
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
        conn_mark_broken(c, lost, true);
        (void)dev_quiesce(c);
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
static struct vhd_queue *req_queue(struct vhd_vu_conn *c, uint64_t idx)
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
        close_fd(&r->fds[i]);
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
    req_close_fds(&r); /* fds the handler did not keep */
    if (req_has_reply(c, info)) {
        rc = send_reply_fd(c, req, &r.reply, r.reply_size, r.reply_fd);
        close_fd(&r.reply_fd); /* the front-end has its own copy now */
        return rc;
    }
    if (need_reply && (ack_before || proto_has(c, VHOST_USER_PROTOCOL_F_REPLY_ACK))) {
        uint64_t ok = 0;
        return send_reply(c, req, &ok, sizeof(ok));
    }
    return 0;

fail:
    req_close_fds(&r);
    close_fd(&r.reply_fd);
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
 * (spec "Migration"); every started queue follows it (queue_apply_log). The device sees
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
    if (c->features_set && any_ring_started(dev) &&
        ((vf ^ dev->features) & ~BIT(VHOST_F_LOG_ALL))) {
        r->why = "features changed while a ring is started";
        return -EBUSY;
    }
    uint64_t prev = dev->features; /* ops->set_features may store the new value */
    int rc = dev_quiesce(c);
    if (rc < 0) {
        dev_resume(c);
        r->why = "queues did not stop";
        return rc;
    }
    if (dev->ops->set_features) {
        rc = dev->ops->set_features(dev, vf);
        if (rc < 0) {
            dev_resume(c);
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
            queue_apply_log(c, &dev->queues[i]);
    dev_resume(c);
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
        int qrc = queue_set_enabled(c, q, false);
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
static int h_set_mem_table(struct vhd_vu_conn *c, struct vu_req *r)
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
    if (rc == 0)
        vhd_log(VHD_LOG_INFO, "%s: memory table: %u regions", c->dev->name, m->nregions);
    return rc;
}

static int h_get_max_mem_slots(struct vhd_vu_conn *c, struct vu_req *r)
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
static int h_add_mem_reg(struct vhd_vu_conn *c, struct vu_req *r)
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
    rc = vhd_mem_add(c->dev->mem, &d, &mem);
    if (rc < 0) {
        r->why = mem_error(rc);
        return rc;
    }
    return conn_swap_mem(c, r, mem);
}

/*
 * REM_MEM_REG: identified by guest address, user address and size; "the mmap
 * offset is ignored"; an fd, if any, is closed unused (generic code). The
 * spec does not say what happens to a started ring inside the region; we
 * refuse (-EBUSY) rather than leave a running ring without memory.
 */
static int h_rem_mem_reg(struct vhd_vu_conn *c, struct vu_req *r)
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

/* ---- handlers: rings ---- */

/*
 * SET_VRING_NUM: 1..32768 (virtio 1.2, 2.7 and 2.8); a power of two for split
 * rings, checked here when the layout is already negotiated and again when
 * the ring starts. Refused while the ring is started (like the kernel's
 * -EBUSY): the size of a running ring cannot change.
 */
static int h_set_vring_num(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = req_queue(c, r->p->state.index);
    uint32_t num = r->p->state.num;

    if (q->started) {
        r->why = "ring is started";
        return -EBUSY;
    }
    if (num == 0 || num > VHD_VQ_MAX_SIZE) {
        r->why = "ring size out of range";
        return -EINVAL;
    }
    if (c->features_set && !feature_has(c, VIRTIO_F_RING_PACKED) && (num & (num - 1))) {
        r->why = "split ring size is not a power of two";
        return -EINVAL;
    }
    q->size = num;
    return 0;
}

/*
 * SET_VRING_ADDR: front-end virtual addresses (IOMMU_PLATFORM is not
 * offered). The only flag is VHOST_VRING_F_LOG (log used-ring writes at the
 * guest-physical log address), for devices that offer dirty logging.
 * Alignments that hold for both layouts are checked now (descriptors 16,
 * avail 2, used 4), the rest at ring start. While the ring is started the
 * same addresses may be sent again (QEMU does when toggling logging): the
 * log flag and address change with the ring detached; new ring addresses
 * are refused.
 */
static int h_set_vring_addr(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_vring_addr *a = &r->p->addr;
    struct vhd_queue *q = req_queue(c, a->index);
    uint32_t flags_ok = c->dev->ops->dirty_log ? 1u << VHOST_VRING_F_LOG : 0;

    if (a->flags & ~flags_ok) {
        r->why = "unknown ring address flags (or VHOST_VRING_F_LOG without dirty logging)";
        return -EINVAL;
    }
    if ((a->desc & 15) || (a->avail & 1) || (a->used & 3)) {
        r->why = "misaligned ring address";
        return -EINVAL;
    }
    if (q->started) {
        if (a->desc != q->addr_desc || a->avail != q->addr_avail || a->used != q->addr_used) {
            r->why = "ring is started";
            return -EBUSY;
        }
        bool log_on = (a->flags & flags_ok) != 0;
        if (log_on == q->addr_log_on && a->log == q->addr_log)
            return 0;
        int rc = queue_detach(c, q);
        if (rc < 0) {
            r->why = "the ring did not stop";
            return rc;
        }
        q->addr_log_on = log_on;
        q->addr_log = a->log;
        queue_apply_log(c, q);
        (void)queue_sync(c, q);
        return 0;
    }
    q->addr_desc = a->desc;
    q->addr_avail = a->avail;
    q->addr_used = a->used;
    q->addr_log = a->log;
    q->addr_log_on = (a->flags & flags_ok) != 0;
    q->have_addr = true;
    return 0;
}

/*
 * SET_VRING_BASE: split: bits 0-15 the next avail index, bits 16-31
 * reserved; packed: both indices and wrap counters (checked against the ring
 * size at start). Refused while started.
 */
static int h_set_vring_base(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = req_queue(c, r->p->state.index);
    uint32_t num = r->p->state.num;

    if (q->started) {
        r->why = "ring is started";
        return -EBUSY;
    }
    if (c->features_set && !feature_has(c, VIRTIO_F_RING_PACKED) && num > 0xffff) {
        r->why = "split ring base above 16 bits";
        return -EINVAL;
    }
    q->base = num;
    return 0;
}

/*
 * GET_VRING_BASE stops the ring: it is detached (its in-flight requests
 * complete and are pushed first), its state read, queue_fini called. A ring
 * that is not started answers the base it would start from. The request's
 * num field is reserved (must be 0) and ignored.
 */
static int h_get_vring_base(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = req_queue(c, r->p->state.index);

    int rc = queue_stop(c, q);
    if (rc < 0) {
        r->why = "the ring did not stop";
        return rc;
    }
    r->reply.state.index = r->p->state.index;
    r->reply.state.num = q->base;
    r->reply_size = sizeof(struct vu_vring_state);
    return 0;
}

/*
 * Point q's engine at its region of the inflight area: region i of the
 * layout the features chose, at i * vhd_inflight_queue_size(). A ring
 * without a region (index beyond the area's num_queues, or an area too small
 * for the packed layout) is refused: it would run with no crash protection.
 */
static int queue_set_inflight(struct vhd_vu_conn *c, struct vu_req *r, struct vhd_queue *q)
{
    uint64_t stride = vhd_inflight_queue_size(q->vq.packed, c->inflight_queue_size);

    if (q->index >= c->inflight_num_queues ||
        (uint64_t)(q->index + 1) * stride > c->inflight_size) {
        r->why = "the inflight area has no region for this ring";
        return -EINVAL;
    }
    int rc = vhd_vq_set_inflight(&q->vq, (uint8_t *)c->inflight + (uint64_t)q->index * stride,
                                 c->inflight_queue_size);
    if (rc < 0)
        r->why = "bad inflight queue size";
    return rc;
}

/*
 * Start q (spec "Ring states": started by SET_VRING_KICK): needs a memory
 * table, SET_VRING_NUM, SET_VRING_ADDR and SET_FEATURES first. A ring outside
 * guest memory (or misaligned, or a bad base) is an error and breaks the
 * device (NEEDS_RESET).
 */
static int queue_start(struct vhd_vu_conn *c, struct vu_req *r, struct vhd_queue *q)
{
    struct vhd_dev *dev = c->dev;

    if (!dev->mem) {
        r->why = "ring started before SET_MEM_TABLE";
        return -EPROTO;
    }
    if (!c->features_set) {
        r->why = "ring started before SET_FEATURES";
        return -EPROTO;
    }
    if (q->size == 0 || !q->have_addr) {
        r->why = "ring started before SET_VRING_NUM/SET_VRING_ADDR";
        return -EPROTO;
    }
    struct vhd_vq_params p = {
        .size = q->size,
        .packed = feature_has(c, VIRTIO_F_RING_PACKED),
        .event_idx = feature_has(c, VIRTIO_F_EVENT_IDX),
        .indirect = feature_has(c, VIRTIO_F_INDIRECT_DESC),
        .addr_is_gpa = false,
        .desc = q->addr_desc,
        .avail = q->addr_avail,
        .used = q->addr_used,
    };
    int rc = vhd_vq_init(&q->vq, &p, dev->mem);
    if (rc < 0) {
        r->why = "bad ring size or misaligned ring";
        return rc;
    }
    rc = vhd_vq_set_base(&q->vq, q->base);
    if (rc < 0) {
        r->why = "ring base out of range";
        return rc;
    }
    queue_apply_log(c, q);
    if (c->inflight) {
        rc = queue_set_inflight(c, r, q);
        if (rc < 0)
            return rc;
    }
    rc = vhd_vq_start(&q->vq);
    if (rc == -EBADMSG) {
        r->why = "the inflight area does not fit the ring or is corrupt";
        conn_mark_broken(c, "the inflight area of a ring is corrupt", true);
        return rc;
    }
    if (rc < 0) {
        r->why = "ring outside guest memory";
        conn_mark_broken(c, "a ring is outside guest memory", false);
        return rc;
    }
    q->inflight_io = 0;
    q->notify_pending = false;
    q->broken = false; /* detached: a plain store (dev.h) */
    c->err_signalled[q->index] = false;
    if (dev->ops->queue_init) {
        rc = dev->ops->queue_init(dev, q);
        if (rc < 0) {
            vhd_vq_fini(&q->vq);
            r->why = "the device could not set the queue up";
            return rc;
        }
    }
    q->started = true;
    return 0;
}

/*
 * The fd of SET_VRING_KICK/CALL/ERR (or -1: none) must be an eventfd
 * (efd.h, vhd_efd_check): a worker polls and reads kick fds, and workers and
 * the control thread write call and error fds. 0, or -EINVAL with r->why.
 */
static int ring_fd_check(struct vu_req *r, int fd, const char *why)
{
    if (fd < 0)
        return 0;
    int rc = vhd_efd_check(fd);
    if (rc < 0)
        r->why = why;
    return rc == -EBADF ? rc : rc < 0 ? -EINVAL : 0;
}

/*
 * SET_VRING_KICK: bits 0-7 index, bit 8 no fd (then the ring is polled).
 * On a stopped ring it starts the ring; on a started one it replaces the kick
 * fd (detach, swap, re-attach). A started ring runs only while enabled.
 */
static int h_set_vring_kick(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = req_queue(c, r->p->u64 & VHOST_USER_VRING_IDX_MASK);
    int fd = (r->p->u64 & VHOST_USER_VRING_NOFD_MASK) ? -1 : r->fds[0];
    int rc = ring_fd_check(r, fd, "the kick fd is not an eventfd");

    if (rc < 0)
        return rc;
    if (q->started) {
        rc = queue_detach(c, q);
        if (rc < 0) {
            r->why = "the ring did not stop";
            return rc;
        }
        close_fd(&q->kick_fd);
        q->kick_fd = fd;
        if (fd >= 0)
            r->fds[0] = -1;
        (void)queue_sync(c, q);
        return 0;
    }
    q->kick_fd = fd; /* queue_init may want to see it */
    rc = queue_start(c, r, q);
    if (rc < 0) {
        q->kick_fd = -1; /* still in r->fds: closed by the generic code */
        return rc;
    }
    if (fd >= 0)
        r->fds[0] = -1;
    vhd_log(VHD_LOG_DEBUG, "%s: queue %u started (size %u, %s)%s", c->dev->name, q->index, q->size,
            q->vq.packed ? "packed" : "split", q->enabled ? "" : ", disabled");
    if (q->vq.inf_stale)
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: queue %u: the inflight area does not describe the ring (a reset driver "
                   "with an old area?): starting from the front-end's base 0x%x, %u requests it "
                   "listed dropped",
                   c->dev->name, q->index, q->base, q->vq.inf_dropped);
    if (vhd_vq_resubmit_pending(&q->vq))
        vhd_log(VHD_LOG_INFO, "%s: queue %u: resubmitting %u requests in flight before a restart",
                c->dev->name, q->index, vhd_vq_resubmit_pending(&q->vq));
    (void)queue_sync(c, q);
    return 0;
}

/*
 * Make a signalling fd (call, error) non-blocking. We write 1 to these
 * eventfds; a write blocks when the counter would overflow, so a front-end
 * that never reads one, or hands over one already at the maximum, would
 * stall the thread that signals (a worker serving other devices too, or the
 * control thread). Non-blocking, a full counter just drops the signal: the
 * front-end has one pending anyway. The flag belongs to the file the
 * front-end shares and it can clear it again: every write goes through
 * vhd_efd_signal, which a blocking file cannot stall either (efd.h).
 */
static void fd_set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0 && !(fl & O_NONBLOCK))
        (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* SET_VRING_CALL: the call fd is worker-owned while attached: swap it detached. */
static int h_set_vring_call(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = req_queue(c, r->p->u64 & VHOST_USER_VRING_IDX_MASK);
    int fd = (r->p->u64 & VHOST_USER_VRING_NOFD_MASK) ? -1 : r->fds[0];
    bool was_attached = q->attached;

    int rc = ring_fd_check(r, fd, "the call fd is not an eventfd");
    if (rc < 0)
        return rc;
    rc = queue_detach(c, q);
    if (rc < 0) {
        r->why = "the ring did not stop";
        return rc;
    }
    close_fd(&q->call_fd);
    q->call_fd = fd;
    q->call_stuck = false;
    if (fd >= 0) {
        r->fds[0] = -1;
        fd_set_nonblock(fd);
    }
    if (was_attached)
        (void)queue_sync(c, q);
    return 0;
}

/* SET_VRING_ERR: kept for error signalling; control-thread state only. */
static int h_set_vring_err(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = req_queue(c, r->p->u64 & VHOST_USER_VRING_IDX_MASK);
    int fd = (r->p->u64 & VHOST_USER_VRING_NOFD_MASK) ? -1 : r->fds[0];
    int rc = ring_fd_check(r, fd, "the error fd is not an eventfd");

    if (rc < 0)
        return rc;
    close_fd(&q->err_fd);
    q->err_fd = fd;
    if (fd >= 0) {
        r->fds[0] = -1;
        fd_set_nonblock(fd);
    }
    return 0;
}

/*
 * SET_VRING_ENABLE: num 1 enables, 0 disables; anything else is invalid.
 * The enabled state is tracked whether or not the ring is started (spec
 * "Ring states": it comes into effect once the ring is started). A started
 * but disabled ring is not processed at all: for a block device there is
 * no "processing without side effects" (any request touches guest memory
 * or the image), so disabled rings are left untouched until enabled.
 */
static int h_set_vring_enable(struct vhd_vu_conn *c, struct vu_req *r)
{
    struct vhd_queue *q = req_queue(c, r->p->state.index);
    uint32_t num = r->p->state.num;

    if (num > 1) {
        r->why = "enable value is neither 0 nor 1";
        return -EINVAL;
    }
    int rc = queue_set_enabled(c, q, num == 1);
    if (rc < 0)
        r->why = num == 1 ? "the ring could not start" : "the ring did not stop";
    return rc;
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
    rc = dev_quiesce(c);
    if (rc < 0) {
        dev_resume(c);
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
    dev_resume(c);
    if (rc < 0)
        r->why = "the device refused the config write";
    return rc;
}

/* SET_BACKEND_REQ_FD: keep the channel for back-end requests (replaces an earlier one). */
static int h_set_backend_req_fd(struct vhd_vu_conn *c, struct vu_req *r)
{
    close_fd(&c->backend_fd);
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
        return feature_has(c, VIRTIO_F_RING_PACKED);
    return (vhd_vu_offered_features(c->dev) & BIT(VIRTIO_F_RING_PACKED)) != 0;
}

/*
 * GET_INFLIGHT_FD: a new zeroed area of num_queues regions of queue_size
 * records, in a sealed memfd (it can never shrink under a back-end that maps
 * it: no SIGBUS), sent with the reply; we keep no copy, SET_INFLIGHT_FD gives
 * it back. The message has no error form but mmap_size 0, which QEMU reads
 * as "no area": a refused request is answered that way (and logged).
 */
static int h_get_inflight_fd(struct vhd_vu_conn *c, struct vu_req *r)
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
static int h_set_inflight_fd(struct vhd_vu_conn *c, struct vu_req *r)
{
    const struct vu_inflight *in = &r->p->inflight;
    struct statfs sfs;
    struct stat st;

    if (any_ring_started(c->dev)) {
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
    inflight_unmap(c);
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
static int h_set_log_base(struct vhd_vu_conn *c, struct vu_req *r)
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
    rc = dev_quiesce(c);
    if (rc < 0) {
        dev_resume(c);
        vhd_dirtylog_free(log);
        r->why = "queues did not stop";
        return rc;
    }
    struct vhd_dirtylog *old = c->log;
    c->log = log;
    for (uint32_t i = 0; i < dev->num_queues; i++)
        if (dev->queues[i].started)
            queue_apply_log(c, &dev->queues[i]);
    dev_resume(c);
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
