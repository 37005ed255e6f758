/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libvhostd library context: the worker threads that run every device's
 * virtqueues (each with its own epoll loop and io_uring, no locks on the
 * request path), their polling policy, and the control loop that serves the
 * vhost-user sockets of the devices created in it.
 *
 * Typical use (see examples/rng/rng.c for a whole program):
 *
 *     struct vhd_ctx_config cfg;
 *     vhd_ctx_config_init(&cfg);
 *     cfg.workers = 2;
 *     struct vhd_ctx *ctx;
 *     if (vhd_ctx_new(&cfg, &ctx) < 0) ...
 *     ... vhd_blk_device_new(ctx, ...), vhd_device_start(dev, ...) ...
 *     vhd_ctx_run(ctx);            // until vhd_ctx_stop(ctx), e.g. from a signal handler
 *     vhd_ctx_destroy(ctx);        // ends the sessions, frees the devices
 *
 * Threading: the thread that calls vhd_ctx_run() / vhd_ctx_dispatch() is the
 * context's control thread; every call on the context and its devices must
 * come from it (or from the thread that created them before the loop first
 * runs), except vhd_ctx_stop(), which any thread and any signal handler may
 * call. Device callbacks for events run on the control thread; queue
 * callbacks (vhostd/custom.h) run on the workers.
 */
#ifndef VHOSTD_CTX_H
#define VHOSTD_CTX_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct vhd_ctx;       /* a library context: workers + control loop + devices */
struct vhd_ctx_watch; /* an embedder's fd watched by the control loop */

/* Most worker threads a context may have. */
#define VHD_CTX_MAX_WORKERS 64u
#define VHD_CTX_SPIN_AUTO   0xffffffffu /* vhd_ctx_config.spin_us: the measured wake-up cost */

/* How idle workers wait for work. */
enum vhd_ctx_poll {
    VHD_CTX_POLL_ADAPTIVE = 0, /* keep polling poll_us after the last work, then sleep on kicks */
    VHD_CTX_POLL_ALWAYS = 1,   /* never sleep: lowest latency, one busy core per worker */
    /*
     * Event mode: after work, poll spin_us with notifications off (about one
     * wake-up's worth), then turn them back on and sleep until a kick; with
     * spin_us 0, notifications stay on and the worker sleeps at once.
     */
    VHD_CTX_POLL_NEVER = 2,
};

struct vhd_ctx_config {
    unsigned workers;       /* worker threads, 1..VHD_CTX_MAX_WORKERS */
    enum vhd_ctx_poll poll; /* polling policy */
    /*
     * VHD_CTX_POLL_ADAPTIVE: the longest the worker keeps polling after the
     * last work, us (the window adapts between spin_us and poll_us). 0 makes
     * adaptive polling event mode (VHD_CTX_POLL_NEVER, with its spin).
     */
    unsigned poll_us;
    unsigned budget; /* chains per queue per turn (fairness between queues), >= 1 */
    /*
     * Install the process-wide SIGBUS guard: a front-end that shrinks its
     * guest-memory file makes the next access to the lost pages SIGBUS; with
     * the guard the access is absorbed and the device marked broken instead
     * of the process dying. It replaces any SIGBUS handler of the process, so
     * it is off by default; a daemon turns it on.
     */
    bool sigbus_guard;
    /*
     * Event-mode spin, us (at most 1000000, or VHD_CTX_SPIN_AUTO, the
     * default): VHD_CTX_POLL_NEVER polls this long after work before it
     * turns notifications back on and sleeps (0: sleep at once);
     * VHD_CTX_POLL_ADAPTIVE never shrinks its window below it (0: a fixed
     * window of poll_us). VHD_CTX_SPIN_AUTO: each worker spins as long as
     * one of its sleeps and wake-ups costs it in CPU, as it measures them
     * (vhd_worker_stats.wake_cost_ns; 10..100 us): no choice of spin can
     * then cost more than twice the CPU of the best one for the gaps that
     * come.
     */
    unsigned spin_us;
    /*
     * Placement: worker i runs pinned to CPU cpus[i % ncpus] (each worker on
     * one CPU, never moved; several workers share a CPU when workers >
     * ncpus; CPUs past the first `workers` entries are not used). Each
     * pinned worker creates its io_uring and moves its own state to its
     * CPU's NUMA node before it serves anything. ncpus 0 (default): workers
     * float on every CPU the process may use. At most VHD_CTX_MAX_WORKERS
     * entries, each a CPU of the process's affinity mask (sched_getaffinity)
     * and none twice, else vhd_ctx_new returns -EINVAL (and logs which).
     * The array is copied; vhd_parse_cpu_list() reads the taskset -c syntax.
     */
    const unsigned *cpus;
    unsigned ncpus;
};

/*
 * vhd_parse_cpu_list - parse a CPU list in taskset -c syntax: CPU numbers
 * and ranges separated by commas, a range A-B or A-B:STRIDE ("0,2-5",
 * "0-15:2"), in the order given into cpus[0..max). Returns the number of
 * CPUs (>= 1), or -EINVAL (not such a list, or a range backwards or with
 * stride 0), -ERANGE (a CPU number >= 1024, beyond what sched_setaffinity's
 * default mask holds), -EEXIST (a CPU listed twice), -E2BIG (more than max
 * CPUs). Whether the CPUs exist is vhd_ctx_new's check. Any thread.
 */
int vhd_parse_cpu_list(const char *s, unsigned *cpus, unsigned max);

/*
 * vhd_set_guest_mem_limit - the most guest memory all devices of the process
 * together may map, bytes (0: the default, 64 TiB); a front-end's memory
 * table that would go beyond it is refused before anything is mapped. Each
 * device also has its own limit (vhd_device_config.max_guest_mem). Any
 * thread; process-wide, for every context.
 */
void vhd_set_guest_mem_limit(uint64_t bytes);

/*
 * vhd_ctx_config_init - the defaults: 1 worker, adaptive polling for 50 us,
 * spin 10 us, budget 64, no SIGBUS guard, workers not pinned. Start from this and change what you
 * need (fields added in later versions get their default here).
 */
void vhd_ctx_config_init(struct vhd_ctx_config *cfg);

/*
 * vhd_ctx_new - create a context: start the workers and the control loop.
 * cfg NULL means the defaults. Returns 0 and *out, or -EINVAL (a field out
 * of range, a CPU of cpus the process may not run on), -EBUSY (sigbus_guard while another context
 * holds it), -ENOMEM, or what creating threads, eventfds and io_urings returned.
 */
int vhd_ctx_new(const struct vhd_ctx_config *cfg, struct vhd_ctx **out);

/*
 * vhd_ctx_destroy - end every device's session (in-flight requests complete
 * first), destroy every device still in the context (vhd_device_destroy),
 * then end the opens still in progress (vhd_blk_device_open: their done
 * called with -ECANCELED; one that has not finished 2 s later is left
 * running, detached, and frees what it opens itself), stop and join the
 * workers, free the loop. Watched fds are not closed. NULL is fine. Control
 * thread, not from inside a callback.
 */
void vhd_ctx_destroy(struct vhd_ctx *ctx);

/* Number of worker threads. */
unsigned vhd_ctx_workers(const struct vhd_ctx *ctx);

/*
 * What a worker thread did with its time since it started. Polling and
 * sleeping are properties of a worker, shared by every queue it runs, so they
 * are reported per worker (vhd_device_queue_worker says which worker runs a
 * queue). Nanoseconds of CLOCK_MONOTONIC.
 */
struct vhd_worker_stats {
    uint64_t sleeps;   /* times the worker blocked waiting for an event (event mode, idle) */
    uint64_t sleep_ns; /* time blocked so (part of event_ns) */
    uint64_t poll_ns;  /* time polling the rings, driver notifications off */
    uint64_t event_ns; /* time in event mode (notifications on): handling events or asleep */
    /*
     * Thread CPU time one sleep and its wake-up cost the worker, averaged
     * over its last sleeps (10 us until it first slept): what the host
     * charges for a wake-up; the automatic spin follows it.
     */
    uint64_t wake_cost_ns;
};

/*
 * vhd_ctx_worker_stats - worker `worker`'s counters. The worker updates them
 * without locks; a snapshot may be a few microseconds (or one sleep) behind.
 * 0, or -EINVAL for a bad index. Any thread.
 */
int vhd_ctx_worker_stats(const struct vhd_ctx *ctx, unsigned worker, struct vhd_worker_stats *out);

/*
 * vhd_ctx_run - run the control loop until vhd_ctx_stop(): accept front-ends,
 * handle their vhost-user messages, reconnect client-mode devices, report
 * broken queues, and call the embedder's watches and event callbacks. A stop
 * requested before the call makes it return at once; the request is then
 * consumed (a second vhd_ctx_run runs again). 0 or -errno (epoll failed).
 */
int vhd_ctx_run(struct vhd_ctx *ctx);

/*
 * vhd_ctx_dispatch - one turn of the loop for embedders with their own: wait
 * up to timeout_ms (0: do not wait, -1: forever) for events and handle them.
 * Returns the number of events handled (0 on timeout or after a stop
 * request), or -errno. Use vhd_ctx_fd() to learn when to call it.
 */
int vhd_ctx_dispatch(struct vhd_ctx *ctx, int timeout_ms);

/*
 * vhd_ctx_fd - a file descriptor (an epoll set) that polls readable when
 * vhd_ctx_dispatch(ctx, 0) has something to do. Owned by ctx: do not close it.
 */
int vhd_ctx_fd(const struct vhd_ctx *ctx);

/*
 * vhd_ctx_stop - ask vhd_ctx_run() to return after the current turn. Any
 * thread, and async-signal-safe (an atomic store and a write to an eventfd).
 */
void vhd_ctx_stop(struct vhd_ctx *ctx);

/* Callback of a watched fd: events is the epoll mask that fired (EPOLLIN, EPOLLHUP, ...). */
typedef void (*vhd_ctx_watch_fn)(void *opaque, uint32_t events);

/*
 * vhd_ctx_watch_fd - call fn(opaque, events) from the control loop whenever fd
 * has one of events (EPOLLIN, EPOLLOUT; level-triggered): a daemon's
 * signalfd, a management socket. The fd stays the caller's; unwatch it
 * before closing it. 0 and *out (may be NULL if never unwatched), or -errno.
 */
int vhd_ctx_watch_fd(struct vhd_ctx *ctx, int fd, uint32_t events, vhd_ctx_watch_fn fn,
                     void *opaque, struct vhd_ctx_watch **out);

/* Stop watching (safe from any callback, including the watch's own). NULL is fine. */
void vhd_ctx_unwatch(struct vhd_ctx_watch *w);

#ifdef __cplusplus
}
#endif

#endif /* VHOSTD_CTX_H */
