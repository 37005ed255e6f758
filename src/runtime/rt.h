/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The runtime: N worker threads, each with its own epoll loop, io_uring and
 * mailbox eventfd, running the virtqueues attached to it. Control-plane
 * changes go through attach/detach, which pause only the worker that owns
 * the queue (targeted quiescence); no lock or atomic read-modify-write is
 * taken on the request path.
 */
#ifndef VHD_RT_H
#define VHD_RT_H

#include <stdbool.h>
#include <stdint.h>

#include "dev.h"

struct io_uring;
struct io_uring_sqe;

enum vhd_poll_mode {
    VHD_POLL_ADAPTIVE, /* poll poll_us after work, then notifications + sleep */
    VHD_POLL_ALWAYS,   /* never sleep: busy-poll the rings (lowest latency, one core per worker) */
    VHD_POLL_NEVER,    /* pure event mode: notifications always on */
};

struct vhd_rt_opts {
    unsigned nworkers; /* 1..VHD_RT_MAX_WORKERS */
    enum vhd_poll_mode poll_mode;
    unsigned poll_us; /* adaptive: the longest the worker keeps polling after the last work */
    /*
     * Event mode (VHD_POLL_NEVER): after work, poll the rings this long with
     * notifications off before turning them back on (then the re-check) and
     * sleeping; 0: pure event mode, notifications always on. Adaptive: the
     * shortest poll window. The adaptive window starts at poll_us, doubles
     * (up to poll_us) when work comes within poll_us of a window closing, and
     * halves (down to spin_us) when it comes later; spin_us 0 (or >= poll_us)
     * keeps it fixed at poll_us. VHD_RT_SPIN_AUTO (the default): each
     * worker's spin is what a sleep and its wake-up cost it, as measured
     * (worker.c, RT_WAKE_*), between 10 and 100 us.
     */
    unsigned spin_us;
    unsigned uring_entries; /* io_uring SQ size per worker (power of two) */
    unsigned budget;        /* chains per queue per turn (fairness between queues) */
    /*
     * io_uring opcodes the workers' rings accept, as bits (1ull << IORING_OP_*);
     * 0: no restriction. With a set, each ring is created disabled, restricted
     * to these opcodes (no SQE flags, no register operations) and then enabled,
     * so the kernel refuses anything else (open, connect, ...) even if a bug
     * let a request build a foreign SQE: the seccomp filter cannot see inside
     * io_uring. The daemon passes what its backends use.
     */
    uint64_t uring_ops;
    /*
     * Placement: worker i runs pinned to CPU cpus[i] (< 0: floats, as every
     * worker does without a list); NULL: none pinned. nworkers entries,
     * copied. A pinned worker is created with its affinity set (it never runs
     * elsewhere) and then, on its own thread, moves its state to its node and
     * creates its io_uring, so first touch puts both on the worker's node.
     */
    const int *cpus;
};

#define VHD_RT_MAX_WORKERS 64
#define VHD_RT_SPIN_AUTO   0xffffffffu /* spin_us: follow the measured wake-up cost */

/* Fill defaults: 1 worker, adaptive, 50 us, spin auto, 256 entries, budget 64. */
void vhd_rt_opts_default(struct vhd_rt_opts *o);

/* Start the workers. 0 and *out, or -errno. */
int vhd_rt_new(const struct vhd_rt_opts *o, struct vhd_rt **out);

/* Stop and join the workers; every queue must be detached. */
void vhd_rt_free(struct vhd_rt *rt);

unsigned vhd_rt_nworkers(const struct vhd_rt *rt);

/*
 * What a worker thread did with its time, since it started. Written by the
 * worker alone (relaxed stores: no lock, no atomic read-modify-write), read
 * by any thread with vhd_rt_worker_stats (each field relaxed: a snapshot
 * may be up to RT_CLOCK_EVERY polling turns, or one sleep, behind).
 *   sleeps:   epoll_wait calls that may block (timeout -1: event mode, nothing to do)
 *   sleep_ns: time inside those calls (part of event_ns)
 *   poll_ns:  time polling (poll-always mode, or inside a poll window with
 *             notifications off)
 *   event_ns: the rest: notifications on, handling kicks and completions or asleep
 *   wake_cost_ns: thread CPU time one sleep and its wake-up cost, averaged over
 *             the last sleeps (a gauge; 10 us until the worker first slept)
 * The worker's time belongs to all the queues it runs: it is reported per
 * worker, and each queue says which worker runs it.
 */
struct vhd_rt_worker_stats {
    uint64_t sleeps;
    uint64_t sleep_ns;
    uint64_t poll_ns;
    uint64_t event_ns;
    uint64_t wake_cost_ns;
};

/* Worker `worker`'s counters; -EINVAL for a bad index. Any thread. */
int vhd_rt_worker_stats(const struct vhd_rt *rt, unsigned worker, struct vhd_rt_worker_stats *out);

/*
 * vhd_rt_poll_window_ns - worker `worker`'s current poll window (adaptive
 * or event-mode spin; 0 in pure event mode or for a bad index), as last
 * published by the worker. For statistics and tests. Any thread.
 */
uint64_t vhd_rt_poll_window_ns(const struct vhd_rt *rt, unsigned worker);

/*
 * vhd_rt_worker_cpu / vhd_rt_worker_node - the CPU worker `worker` is pinned
 * to and that CPU's NUMA node (as the worker saw it at start), or -1 for a
 * floating worker or a bad index. Any thread.
 */
int vhd_rt_worker_cpu(const struct vhd_rt *rt, unsigned worker);
int vhd_rt_worker_node(const struct vhd_rt *rt, unsigned worker);

/*
 * vhd_rt_attach - hand queue q (its vq initialised and started, kick/call
 * fds set, q->dev->ops->queue_init done) to worker `worker`, which from then
 * on owns its datapath fields and processes it on kicks (or by polling).
 * Control thread only; returns once the worker has taken it. 0 or -errno
 * (-EBUSY already attached, -EINVAL bad worker index, -ETIMEDOUT the worker
 * did not take it within 5 s: nothing changed). The kick fd is switched to
 * O_NONBLOCK (harmless for the front-end's copy). The worker drops the
 * queue's cached ring pointers (a queue moved between workers starts with a
 * clean translation cache) and processes it once: work may already be queued.
 */
int vhd_rt_attach(struct vhd_rt *rt, struct vhd_queue *q, unsigned worker);

/*
 * vhd_rt_detach - take q back from its worker: the worker stops popping,
 * waits until every in-flight request of q has completed and been pushed,
 * flushes and signals, and lets go. Returns 0 once the control thread owns
 * q again (also when q was not attached), or -ETIMEDOUT after timeout_ms
 * (the queue stays attached and the caller must treat the device as broken).
 * After -ETIMEDOUT the queue stays parked on its worker: not popped, its
 * late completions still pushed and signalled; calling vhd_rt_detach again
 * succeeds once they are all in. timeout_ms < 0 is -EINVAL. Only q's worker
 * takes part, and it keeps serving its other queues meanwhile; the other
 * workers are not involved at all.
 */
int vhd_rt_detach(struct vhd_rt *rt, struct vhd_queue *q, int timeout_ms);

/*
 * vhd_rt_drain - run a detached queue q on worker `worker` until a turn of
 * q->dev->ops->queue_process takes fewer chains than the budget (the device
 * took everything it would: with vhd_vq inf_resubmit_only, the chains left
 * to resubmit), then detach it as vhd_rt_detach does. The control thread
 * uses it to finish a stopped ring's work before answering for it. Returns
 * 0 once the control thread owns q again, -EBUSY when q is attached,
 * -EINVAL, or -ETIMEDOUT after timeout_ms: then, if the worker had taken
 * q, q stays parked there (q->attached set) as after a timed-out detach.
 */
int vhd_rt_drain(struct vhd_rt *rt, struct vhd_queue *q, unsigned worker, int timeout_ms);

/* The io_uring of the worker running the caller (backends use it). Worker threads only. */
struct io_uring *vhd_worker_uring(struct vhd_worker *w);

/* w's index, 0 .. vhd_rt_nworkers() - 1 (< VHD_RT_MAX_WORKERS): per-worker state of a backend. */
unsigned vhd_worker_index(const struct vhd_worker *w);

/*
 * Completion callback for backend I/O submitted on a worker's io_uring: set
 * the SQE's user_data to a struct vhd_io_cb *; the worker calls done(cb, res)
 * with the CQE's result on the same thread.
 */
struct vhd_io_cb {
    void (*done)(struct vhd_io_cb *cb, int res);
};

/*
 * vhd_worker_submit_pending - ask the worker to io_uring_submit() before it
 * next sleeps or polls completions (batches many SQEs into one syscall).
 */
void vhd_worker_submit_pending(struct vhd_worker *w);

/*
 * vhd_worker_get_sqe - an SQE of w's ring, already counted for the next
 * submit (as if vhd_worker_submit_pending() had been called). When the SQ is
 * full the queued SQEs are submitted first to make room. NULL only when the
 * kernel cannot take more right now (the caller leaves the request for later
 * or fails it). Worker thread only.
 */
struct io_uring_sqe *vhd_worker_get_sqe(struct vhd_worker *w);

/*
 * vhd_rt_event_fd - an eventfd (non-blocking, owned by rt) that becomes
 * readable when a worker marked some queue broken (vhd_queue.broken), or
 * when the SIGBUS guard absorbed a fault in guest memory (core/memguard.h;
 * the daemon hands it this fd). The control thread polls it, reads it, and
 * scans its queues and memory tables. Control thread.
 */
int vhd_rt_event_fd(const struct vhd_rt *rt);

#endif /* VHD_RT_H */
