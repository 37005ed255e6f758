/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The generic device model shared by the transport (which fills it from
 * vhost-user messages on the control thread), the runtime (whose workers
 * run the queues) and the device types (blk, net), which plug in through
 * struct vhd_dev_ops.
 *
 * Ownership: struct vhd_dev and the control fields of struct vhd_queue
 * belong to the control thread. A queue's datapath fields (vq, priv,
 * inflight_io, notify_pending) belong to the worker that has it attached
 * (vhd_rt_attach .. vhd_rt_detach), and to the control thread otherwise.
 */
#ifndef VHD_DEV_H
#define VHD_DEV_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/mem.h"
#include "spec/virtio.h"
#include "core/vq.h"
#include "runtime/log.h"

struct vhd_dev;
struct vhd_queue;
struct vhd_worker;
struct vhd_rt;

/* What a device type provides. All but queue_process run on the control thread. */
struct vhd_dev_ops {
    const char *type; /* "blk", "net" */

    /* Virtio feature bits offered (device and transport bits, e.g. VERSION_1). */
    uint64_t (*features)(struct vhd_dev *dev);

    /*
     * Negotiated features (SET_FEATURES), applied while the device's queues
     * are detached. Returns 0 or -errno (e.g. a required feature missing).
     */
    int (*set_features)(struct vhd_dev *dev, uint64_t features);

    /* Size of the config space in bytes. */
    uint32_t config_size;

    /*
     * Read len bytes of config space at off into buf (GET_CONFIG). The
     * transport has already checked off + len <= config_size. 0 or -errno.
     */
    int (*get_config)(struct vhd_dev *dev, void *buf, uint32_t off, uint32_t len);

    /*
     * Write config space (SET_CONFIG), with the device's queues quiesced.
     * -EPERM for read-only fields. May be NULL (then every write fails).
     */
    int (*set_config)(struct vhd_dev *dev, const void *buf, uint32_t off, uint32_t len);

    /*
     * Per-queue device state: queue_init when a ring starts (before it is
     * attached to its worker), queue_fini after it is detached and drained.
     */
    int (*queue_init)(struct vhd_dev *dev, struct vhd_queue *q);
    void (*queue_fini)(struct vhd_dev *dev, struct vhd_queue *q);

    /*
     * Datapath, on the owning worker: pop and handle up to budget chains of
     * q (submitting backend I/O on the worker's io_uring, or completing
     * inline). Completions push used elements and call vhd_queue_mark_used().
     * Returns the number of chains taken (0: ring empty), or a negative
     * value when the queue broke (the runtime then reports NEEDS_RESET).
     */
    int (*queue_process)(struct vhd_queue *q, unsigned budget);

    /* Device reset (RESET_OWNER / RESET_DEVICE / disconnect), queues detached. */
    void (*reset)(struct vhd_dev *dev);

    /*
     * queue_num - optional: the GET_QUEUE_NUM reply (NULL: num_queues). The
     * spec says "how many queues"; for net devices every front-end reads it
     * as queue pairs: QEMU's vhost-user netdev refuses queues=N (pairs) above
     * it, DPDK's vhost library answers rte_vhost_driver_set_max_queue_num's
     * queue pairs. Control thread.
     */
    uint64_t (*queue_num)(const struct vhd_dev *dev);

    /* ---- network devices (src/dev/net.c); NULL / false for others ---- */

    /*
     * VHOST_USER_NET_SET_MTU: the MTU the front-end gives the guest. The
     * transport offers VHOST_USER_PROTOCOL_F_MTU when set. 0 or -EINVAL.
     */
    int (*set_mtu)(struct vhd_dev *dev, uint32_t mtu);

    /*
     * VHOST_USER_SEND_RARP: broadcast a RARP for mac (after a migration, for
     * guests without GUEST_ANNOUNCE). The transport offers
     * VHOST_USER_PROTOCOL_F_RARP when set. 0 or -errno.
     */
    int (*send_rarp)(struct vhd_dev *dev, const uint8_t mac[6]);

    /*
     * Run started-but-disabled rings too (spec "Ring states": the back-end
     * processes them without side effects; net discards transmitted
     * frames and delivers nothing on receive). The transport then keeps a
     * started ring attached whatever its enabled state, and changes
     * q->enabled only while q is detached, so queue_process may read it.
     */
    bool run_disabled;

    /*
     * The device resubmits what the vq engine pops again after a restart
     * (vhost-user inflight I/O tracking): the transport offers
     * VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD and tracks every ring in the area
     * the front-end gives with SET_INFLIGHT_FD. Block devices, where a lost
     * request is lost data; false for devices whose requests may be dropped.
     */
    bool inflight_shmfd;

    /*
     * The device logs every byte it writes into guest buffers with
     * vhd_vq_log_write() (the engine logs the rings itself): the transport
     * offers VHOST_F_LOG_ALL and VHOST_USER_PROTOCOL_F_LOG_SHMFD (dirty
     * logging for live migration, core/dirtylog.h).
     */
    bool dirty_log;

    /*
     * queue_wake_fd - optional (NULL: none): an extra fd the worker watches
     * for q while q is attached, besides its kick fd. The runtime registers
     * it edge-triggered (EPOLLIN | EPOLLET) at attach and removes it when q
     * stops; a readiness edge marks q pending, so queue_process runs at the
     * next turn. The runtime never reads the fd: the device does (a TAP fd)
     * or need not (an eventfd used as a doorbell: each write is a new edge).
     * The fd must stay open while q is attached. Called on the control
     * thread before attach, after queue_init. -1: nothing to watch.
     */
    int (*queue_wake_fd)(struct vhd_queue *q);

    /*
     * queue_stop - optional: q's worker stops running it (a detach or a
     * drain begins, or q broke); queue_process is not called again until q
     * is attached anew. A device that holds popped requests back (blk under
     * werror=stop) must complete them now: the detach waits for
     * q->inflight_io to reach 0. On the owning worker.
     */
    void (*queue_stop)(struct vhd_queue *q);

    /*
     * queue_place - optional: q's worker is pinned to a CPU (rt.h,
     * opts.cpus) and has just taken q: move the device's per-queue state
     * (q->priv and what it points to, allocated by queue_init on the
     * control thread) to the worker's NUMA node, vhd_numa_move_here()
     * (numa.h). On the owning worker, at attach. 0 or -errno (the state just
     * stays where it is).
     */
    int (*queue_place)(struct vhd_queue *q);
};

/* One virtqueue of a device. Cache-line aligned; never written by two threads at once. */
struct vhd_queue {
    /* ---- datapath, owned by the attached worker ---- */
    struct vhd_vq vq; /* engine state */
    void *priv;       /* device-type per-queue state (queue_init) */
    struct vhd_dev *dev;
    struct vhd_worker *worker; /* owner while attached, else NULL */
    /*
     * inflight_io, stat_notifies, stat_kicks: the worker writes them with
     * vhd_store_relaxed (it is their only writer: no atomic read-modify-
     * write), so the control thread may read them with vhd_load_relaxed at
     * any time (statistics); plain reads once q is detached.
     */
    uint32_t inflight_io; /* chains popped and not yet pushed */
    bool notify_pending;  /* pushed since the last flush */
    bool call_stuck;      /* a write to call_fd would block: not written again (efd.h) */
    bool on_dirty_list;   /* runtime bookkeeping */
    struct vhd_queue *dirty_next;
    int call_fd;            /* eventfd to signal the driver; -1: none */
    uint64_t stat_requests; /* chains completed */
    uint64_t stat_notifies; /* call_fd signals */
    uint64_t stat_kicks;    /* kick_fd wake-ups */
    /*
     * Set (release store) by the worker when queue_process() failed: the
     * worker stops popping the queue (it stays attached; in-flight I/O still
     * completes) and signals vhd_rt_event_fd(). The control thread reads it
     * with vhd_load_acquire() at any time, or plainly after vhd_rt_detach(),
     * and clears it when it restarts the ring. The device should then report
     * NEEDS_RESET.
     */
    bool broken;

    /* ---- control thread ---- */
    uint16_t index;
    int kick_fd;   /* eventfd the driver kicks; -1: none (then polled) */
    int err_fd;    /* eventfd for errors; -1: none */
    uint32_t size; /* SET_VRING_NUM */
    uint64_t addr_desc, addr_avail, addr_used, addr_log; /* SET_VRING_ADDR (front-end VAs) */
    uint32_t base; /* SET_VRING_BASE value (vhost-user encoding) */
    bool have_addr;
    bool addr_log_on; /* SET_VRING_ADDR flags: VHOST_VRING_F_LOG (log used-ring writes) */
    /*
     * Available chains on this ring are not work by themselves (set by the
     * device in queue_init, read by the worker after each processing). A virtio-net
     * receive queue is such a ring: the driver keeps it stocked with empty
     * buffers, and it runs when its backend has frames (its wake fd, or the
     * pair's transmit path) or the driver kicks, never just because buffers
     * are there; otherwise an idle device with posted buffers would keep an
     * event-mode worker spinning. The device must not keep work waiting for
     * chains without a wake-up of its own (net drops frames when the
     * receive ring has no buffers, as a NIC does). Polling modes still
     * process it while they poll. The device may also change it from
     * queue_process (the worker owns q then): a ring whose chains are work
     * only at times (a generator's ring while its pair is out of use).
     */
    bool passive;
    bool started;   /* vhost-user ring state: started (kick fd received) */
    bool enabled;   /* vhost-user ring state: enabled (worker-readable, see run_disabled) */
    bool attached;  /* runtime: a worker is running it */
    int worker_idx; /* which worker runs it */
} vhd_cacheline_aligned;

/* Generic device state, control thread. */
struct vhd_dev {
    const struct vhd_dev_ops *ops;
    char name[64];       /* for logs: the device's name or socket */
    uint32_t num_queues; /* queues configured (upper bound for the front-end) */
    struct vhd_queue *queues;
    int *queue_worker;          /* queue index -> worker index (default round robin) */
    struct vhd_rt *rt;          /* runtime whose workers run the queues */
    struct vhd_mem *mem;        /* current memory table, or NULL */
    uint64_t features;          /* negotiated virtio features */
    uint64_t protocol_features; /* negotiated vhost-user protocol features */
    uint8_t status;             /* SET_STATUS value; NEEDS_RESET added when broken */
    bool broken;                /* a queue broke: NEEDS_RESET reported */
    /*
     * Set by the device (control thread, inside an ops call) when its config
     * space changed on its own (net: VIRTIO_NET_S_ANNOUNCE); the transport
     * sends a config change notification once the current message is
     * handled, and clears it.
     */
    bool config_changed;
    bool allow_split, allow_packed; /* ring layouts allowed (daemon option) */
    uint64_t max_mem; /* guest memory a front-end may map, bytes; 0: VHD_MEM_DEV_MAX_DEFAULT */
    void *priv;       /* device-type state */
};

/*
 * vhd_queue_mark_used - called by the device after vhd_vq_push() on the
 * owning worker: the runtime flushes the ring and signals the driver (if
 * need_notify says so) once per burst, not per request.
 */
void vhd_queue_mark_used(struct vhd_queue *q);

/*
 * vhd_dev_check_features - the SET_FEATURES checks every device type makes:
 * VERSION_1 accepted, nothing beyond offered | transport_bits, and packed
 * rings when no_split. Returns 0, or -EINVAL after a rate-limited warning.
 * Static inline: each device type keeps its own rate-limit state.
 */
static inline int vhd_dev_check_features(const struct vhd_dev *dev, uint64_t features,
                                         uint64_t offered, uint64_t transport_bits, bool no_split)
{
    if (!(features & (1ull << VIRTIO_F_VERSION_1))) {
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: driver did not accept VIRTIO_F_VERSION_1 (legacy virtio is not supported)",
                   dev->name);
        return -EINVAL;
    }
    if (features & ~(offered | transport_bits)) {
        VHD_LOG_RL(VHD_LOG_WARN, "%s: driver accepted features 0x%llx that were not offered",
                   dev->name, (unsigned long long)(features & ~(offered | transport_bits)));
        return -EINVAL;
    }
    if (no_split && !(features & (1ull << VIRTIO_F_RING_PACKED))) {
        VHD_LOG_RL(VHD_LOG_WARN, "%s: driver wants split rings, which this device refuses",
                   dev->name);
        return -EINVAL;
    }
    return 0;
}

#endif /* VHD_DEV_H */
