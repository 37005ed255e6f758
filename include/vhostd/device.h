/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libvhostd devices: what every device type (blk, net, custom) shares. A
 * device is created in a context from its type's configuration struct
 * (vhostd/blk.h, net.h, custom.h), which embeds a struct vhd_device_config;
 * it serves one vhost-user endpoint, a listening socket (server) or the
 * front-end's socket (client, reconnecting with back-off), one front-end
 * session at a time.
 *
 *     cfg.dev.name = "disk0";
 *     cfg.dev.endpoint.path = "/run/vhostd/disk0.sock";
 *     cfg.dev.on_event = my_event_cb;          // optional
 *     vhd_blk_device_new(ctx, &cfg, &dev, err, sizeof(err));
 *     vhd_device_start(dev, err, sizeof(err)); // listen (or start connecting)
 *     ... vhd_ctx_run(ctx) ...
 *     vhd_device_stop(dev);                    // optional: destroy stops too
 *     vhd_device_destroy(dev);
 *
 * Threading: every call here is a control-thread call (vhostd/ctx.h), except
 * where a function says otherwise. Event callbacks run on the control thread
 * from inside vhd_ctx_run / vhd_ctx_dispatch (and vhd_device_stop /
 * destroy, which report the end of a session); they may query any device,
 * create and start devices, update a custom device's config space and call
 * vhd_ctx_stop(), but must not stop or destroy a device.
 */
#ifndef VHOSTD_DEVICE_H
#define VHOSTD_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

struct vhd_device; /* one virtio device and its vhost-user endpoint */

/* Ids per allow-list of struct vhd_endpoint_access. */
#define VHD_ENDPOINT_MAX_IDS 16

/*
 * Who may connect (struct vhd_endpoint access). All zero is the default:
 * socket file mode 0600 whatever the umask, the creator's group, any peer
 * that can reach the socket.
 */
struct vhd_endpoint_access {
    /* Server mode: permission bits of the socket file (0: 0600), set before listen(). */
    mode_t mode;
    /* Server mode: the socket file's group (when gid_set); needs the right to chown. */
    bool gid_set;
    gid_t gid;
    /*
     * The peer allow-list, checked with SO_PEERCRED on every accepted
     * connection (server mode) and on the front-end we connect to (client
     * mode: its credentials when it called listen()); a peer not allowed is
     * closed at once. Allowed: both lists empty, or the peer's uid in uids,
     * or its (effective, primary) gid in gids. Supplementary groups are not
     * looked at.
     */
    unsigned nuids, ngids;
    uid_t uids[VHD_ENDPOINT_MAX_IDS];
    gid_t gids[VHD_ENDPOINT_MAX_IDS];
};

/* Where a device meets its front-end. */
struct vhd_endpoint {
    /* Unix socket path (required, shorter than sun_path: 107 bytes). */
    const char *path;
    /*
     * false: listen on path (a stale socket file is replaced, a live one is
     * an error, any other file is never touched) and unlink it at stop.
     * true: connect to the front-end listening on path, again and again
     * with exponential back-off whenever a connect fails or a session ends.
     */
    bool client;
    unsigned reconnect_min_ms;         /* client: first retry delay (0: 50 ms) */
    unsigned reconnect_max_ms;         /* client: the delay doubles up to this (0: 2000 ms) */
    struct vhd_endpoint_access access; /* who may connect (zero: the defaults) */
    /*
     * (Last, added after the fields above: they keep their offsets.)
     * Server mode with a listening socket made by someone else (a management
     * layer, systemd socket activation, the vhost-user spec's --fd): when
     * listen_fd_set, the device accepts on listen_fd (an AF_UNIX SOCK_STREAM
     * socket in the listening state, else vhd_device_start fails with
     * -ENOTSOCK or -EINVAL) instead of binding path. path is then only the
     * endpoint's name (logs, vhd_device_socket_path, the default MAC of a
     * net device): no file is created, checked or removed. The caller keeps
     * listen_fd and must keep it open while the device exists; the device
     * accepts on a duplicate it closes at stop. access.mode and access.gid
     * do not apply (-EINVAL); the allow-lists do.
     */
    bool listen_fd_set;
    int listen_fd;
};

/* What happened to a device (its event callback's argument). */
enum vhd_event {
    VHD_EVENT_CONNECTED = 1,    /* a front-end session started */
    VHD_EVENT_DISCONNECTED = 2, /* the session ended (the device was reset, its queues stopped) */
    /*
     * The device needs a reset (virtio DEVICE_NEEDS_RESET was reported to the
     * front-end): a queue broke on bad guest input, or guest memory vanished.
     * Once per session.
     */
    VHD_EVENT_BROKEN = 3,
    /* Custom devices: the front-end wrote config space and ops->set_config accepted it. */
    VHD_EVENT_CONFIG_CHANGED = 4,
};

/* Event callback: control thread (see the threading note above). */
typedef void (*vhd_event_fn)(struct vhd_device *dev, enum vhd_event ev, void *opaque);

/* What every device type's configuration starts with. Zero-initialise, then set. */
struct vhd_device_config {
    const char *name; /* for logs (copied; at most 63 bytes kept); NULL: the type's name */
    struct vhd_endpoint endpoint;
    /*
     * Workers of the context that run the device's queues, round robin over
     * the list (net: per queue pair, both rings of a pair on one worker);
     * nworkers 0: spread over all workers, continuing where the previous
     * device left off. Each entry must be below vhd_ctx_workers().
     */
    const int *workers;
    unsigned nworkers;
    /*
     * How long the end of a session (a disconnect, a reset, vhd_device_stop)
     * waits for each queue's in-flight requests to complete; 0: 10000 ms. A
     * queue that does not give them back in time leaves the device
     * VHD_DEVICE_DISABLED.
     */
    unsigned stop_timeout_ms;
    bool allow_packed;     /* offer the packed ring layout (VIRTIO_F_RING_PACKED) */
    bool no_split;         /* refuse split rings (a front-end must take packed ones) */
    vhd_event_fn on_event; /* optional */
    void *opaque;          /* handed to on_event and the custom device's callbacks */
    /*
     * Guest memory the front-end may map for this device, bytes (0: 16 TiB).
     * A memory table beyond it, or beyond the process-wide limit
     * (vhd_set_guest_mem_limit), is refused before anything is mapped.
     */
    uint64_t max_guest_mem;
};

/* Where a device is in its life. */
enum vhd_device_state {
    VHD_DEVICE_STOPPED = 0,   /* created, or stopped: no endpoint */
    VHD_DEVICE_WAITING = 1,   /* listening, or (client) connecting: no session */
    VHD_DEVICE_CONNECTED = 2, /* a front-end session is running */
    VHD_DEVICE_BROKEN = 3,    /* connected, but the device needs a reset (VHD_EVENT_BROKEN) */
    /*
     * A queue could not be taken back from its worker when a session ended
     * (a backend request that never completes): the device refuses every
     * new session; only destroying it (and the process) clears this.
     */
    VHD_DEVICE_DISABLED = 4,
};

/*
 * vhd_device_start - open the endpoint: listen on its socket, or start
 * connecting to the front-end's (the first attempt runs from the control
 * loop). Returns 0, -EALREADY when started, or -errno (-EADDRINUSE: a live
 * server answers on the path; -ENAMETOOLONG; -EEXIST: the path is not a
 * socket; ...) with a one-line reason in err (errlen bytes, may be 0).
 */
int vhd_device_start(struct vhd_device *dev, char *err, size_t errlen);

/*
 * vhd_device_stop - end the session if any (queues stopped after their
 * in-flight requests complete, the device reset) and close the endpoint
 * (a listening socket file is unlinked). The device may be started again.
 * Returns 0, or -EBUSY when a queue could not be stopped (the device is
 * then VHD_DEVICE_DISABLED). Stopping a stopped device is 0.
 */
int vhd_device_stop(struct vhd_device *dev);

/*
 * vhd_device_destroy - stop the device and free it: a block backend is
 * flushed (fdatasync) and closed, a TAP or switch port released. A
 * VHD_DEVICE_DISABLED device is not freed (a worker may still hold one of
 * its requests): its memory and backend stay allocated for the process's
 * life, with an error logged. NULL is fine.
 */
void vhd_device_destroy(struct vhd_device *dev);

enum vhd_device_state vhd_device_state(const struct vhd_device *dev);

/* The name used in logs, and the endpoint's socket path (both owned by dev). */
const char *vhd_device_name(const struct vhd_device *dev);
const char *vhd_device_socket_path(const struct vhd_device *dev);

/*
 * vhd_device_socket_dir_fd - an O_PATH fd of the listening socket's
 * directory, through which the socket file is removed at stop (unlinkat): a
 * seccomp filter may allow unlinkat on this fd only. Owned by dev, valid
 * while the device is started in server mode; -1 otherwise.
 */
int vhd_device_socket_dir_fd(const struct vhd_device *dev);
bool vhd_device_is_client(const struct vhd_device *dev);

/*
 * Virtqueues of the device (blk and custom: num_queues; net: 2 * pairs + 1,
 * rx0, tx0, rx1, tx1, ..., the control queue last), and the worker that runs
 * queue q (-EINVAL for a bad index).
 */
uint32_t vhd_device_num_queues(const struct vhd_device *dev);
int vhd_device_queue_worker(const struct vhd_device *dev, uint32_t q);

/* The virtio feature bits the front-end accepted in the current session (0 without one). */
uint64_t vhd_device_features(const struct vhd_device *dev);

/* Session-level counters, since the device was created. */
struct vhd_device_counters {
    uint64_t sessions;         /* front-end sessions started */
    uint64_t connect_attempts; /* client: connect attempts made (server: 0) */
    uint64_t broken;           /* VHD_EVENT_BROKEN events */
};
int vhd_device_counters(const struct vhd_device *dev, struct vhd_device_counters *out);

/*
 * Per-queue counters. requests: chains completed (net: frames); bytes: data
 * moved (blk: read + written; net: frame bytes; custom: bytes the device
 * wrote, as given to vhd_chain_complete); drops (net: frames dropped);
 * errors: requests completed with an error or unusable chains.
 */
struct vhd_queue_counters {
    uint64_t requests;
    uint64_t bytes;
    uint64_t drops;
    uint64_t errors;
};

/*
 * vhd_device_queue_counters - q's counters. net and custom devices: any time
 * (the worker stores them with relaxed atomics: a snapshot may be a burst
 * old); they survive ring restarts within a session (net) or the device's
 * life (custom). blk: the counters of the ring's current (or last) run,
 * any time, also while it runs (relaxed atomics, as net); -ENODATA before
 * it first ran. -EINVAL for a bad index.
 */
int vhd_device_queue_counters(const struct vhd_device *dev, uint32_t q,
                              struct vhd_queue_counters *out);

/*
 * Per-queue activity, any device type, since the device was created:
 * kicks: driver notifications the worker took (kick eventfd reads; none
 * while the worker polls with notifications off); calls: interrupts sent to
 * the driver (call eventfd writes); in_flight: chains popped and not yet
 * completed, now. The worker writes these without locks (relaxed stores);
 * a snapshot may be a burst old. Which worker runs the queue:
 * vhd_device_queue_worker; its polling and sleeping: vhd_ctx_worker_stats.
 */
struct vhd_queue_activity {
    uint64_t kicks;
    uint64_t calls;
    uint32_t in_flight;
};

/* vhd_device_queue_activity - q's activity; -EINVAL for a bad index. Any time. */
int vhd_device_queue_activity(const struct vhd_device *dev, uint32_t q,
                              struct vhd_queue_activity *out);

/*
 * vhd_device_log_counters - log one info line per queue with traffic and a
 * device total, prefixed "NAME: stats (WHY)", running queues included.
 */
void vhd_device_log_counters(const struct vhd_device *dev, const char *why);

#ifdef __cplusplus
}
#endif

#endif /* VHOSTD_DEVICE_H */
