/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The runtime's workers (rt.h): one thread per worker with its own epoll
 * loop, io_uring and mailbox; round-robin processing of the attached
 * virtqueues with a per-queue budget; adaptive / always / never polling; and
 * attach/detach through the owning worker's mailbox (targeted quiescence).
 *
 * Ownership. Everything in struct vhd_worker above the mailbox line, the
 * entries and the datapath fields of attached queues are touched by the
 * worker thread only: no lock and no atomic read-modify-write on the request
 * path. The mailbox (request list, ids) is shared with the control thread
 * and protected by the worker's mutex; it is control path only.
 *
 * Ordering of queue ownership hand-over. vhd_rt_attach: the control thread's
 * writes to q (vq set-up, fds) precede its mutex-protected enqueue; the
 * worker takes the request under the same mutex, so it sees them. Detach and
 * attach acknowledgements: the worker's last writes to q (used ring flush,
 * stats, inflight_io, q->worker = NULL) precede its unlock after marking the
 * request done; the control thread reads `done` under that mutex, so every
 * worker write to q happens-before the control thread's next access. The
 * mailbox eventfd and the `mail` flag are only wake-ups; they carry no data.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/compiler.h"
#include "efd.h"
#include "log.h"
#include "numa.h"
#include "rt.h"

/*
 * Tuning constants.
 *  RT_EVENTS: epoll events taken per wait; more just wait for the next turn.
 *  RT_CQE_BATCH: CQEs copied out per peek; the loop repeats until the CQ is
 *    empty, so this only sizes a stack array.
 *  RT_CLOCK_EVERY: while polling, the clock is read once per 16 turns, not
 *    every turn (a kvm-clock read was 26 % of a polling worker's CPU). An
 *    idle polling turn is well under a microsecond, so the poll window and
 *    the epoll interval below are late by a few microseconds at most; a turn
 *    that did work is stamped at the next read, which makes the window a
 *    few turns longer, never shorter. The same turns also look at passive
 *    rings (dev.h), whose chains are not work by themselves. A power of two.
 *  RT_POLL_EPOLL_NS: while polling (no sleep) the rings and the CQ are
 *    checked directly every turn and the mailbox through the `mail` flag, so
 *    epoll_wait(0) is needed only for kicks that raced with disabling
 *    notifications and for the devices' wake fds (a TAP fd). Once per 50 us,
 *    on the clock, not per turn count: the same order as the default poll
 *    window, so a wake fd waits no longer than a sleeping worker would, and
 *    one syscall (~1 us) per 50 us costs a polling worker about 2 %.
 *  RT_PUBLISH_EVERY: a worker publishes its used rings (and calls where
 *    need_notify asks) after this many completions (vhd_queue_mark_used
 *    calls) even in the middle of a turn, so an interrupt-driven driver
 *    starts refilling while the worker goes on instead of the two sides
 *    alternating batch by batch. 8: a quarter of a 32-deep batch, so the
 *    driver gets its first completions after a quarter of the batch time; a
 *    publish is a release store per queue, and with EVENT_IDX a call goes
 *    out only when the driver's used_event asks for one (a driver that is
 *    still awake asks for none). Fewer would mean more calls without
 *    EVENT_IDX; more, a later refill.
 *  RT_ATTACH_TIMEOUT_MS: an attach is taken at the worker's next loop turn,
 *    which is bounded by budget x queues; 5 s only trips when a worker is
 *    wedged inside a device callback, and then attach reports it.
 */
#define RT_EVENTS            64
#define RT_CQE_BATCH         32
#define RT_CLOCK_EVERY       16u
#define RT_POLL_EPOLL_NS     50000u
#define RT_PUBLISH_EVERY     8u
#define RT_ATTACH_TIMEOUT_MS 5000

/*
 * The automatic spin (VHD_RT_SPIN_AUTO, the default). Polling for a while
 * before sleeping saves a sleep and its wake-up when work comes within that
 * while; it wastes the while when work comes later. Polling exactly as long
 * as one sleep and wake-up costs never spends more than twice the CPU of the
 * best choice made knowing when the work comes (the ski-rental bound), and
 * that cost is a property of the host: 1-2 us of CPU between two threads of
 * one CPU, 10-30 us across CPUs of a virtual machine (docs/PERFORMANCE.md).
 * So each worker measures it: the thread CPU time (CLOCK_THREAD_CPUTIME_ID,
 * two reads of 0.2 us around a sleep of 10+ us) spent inside every
 * epoll_wait that actually slept (its wall time exceeded its CPU time by
 * RT_WAKE_SLEPT_NS: one that returned at once is not a wake-up), averaged
 * with weight 1/8, and uses it as the spin.
 *  RT_WAKE_INIT_NS: the cost assumed before the first measured sleep (a quiet host's).
 *  RT_WAKE_MAX_SAMPLE_NS: a sample is capped there (a page fault or an interrupt
 *    storm inside one sleep must not set the spin for the next eight).
 *  RT_SPIN_AUTO_MIN_NS / MAX_NS: the spin's range whatever the measurement. The
 *    floor is the fixed spin this replaced (10 us): the thread CPU inside
 *    epoll_wait is not all a sleep costs (the re-enable and re-check before
 *    it, the kick's read after it are not in it), and on a quiet 2-vCPU host
 *    it measured below what event mode needed (docs/perf-log/2026-12-01-quiet.md).
 */
#define RT_WAKE_INIT_NS       10000u
#define RT_WAKE_SLEPT_NS      1000u
#define RT_WAKE_MAX_SAMPLE_NS 200000u
#define RT_SPIN_AUTO_MIN_NS   10000u
#define RT_SPIN_AUTO_MAX_NS   100000u

/* Distinct addresses tagging the non-queue epoll sources. */
static char rt_tag_mailbox, rt_tag_uring;

/* ---- mailbox requests (control path) ---- */

enum rt_req_type {
    RT_REQ_ATTACH, /* take q: register its kick, set notifications, process once */
    RT_REQ_DETACH, /* let go of q once its in-flight I/O has completed */
    RT_REQ_DRAIN,  /* take q, run it until it takes less than a budget, then detach */
    RT_REQ_STOP,   /* leave the loop (vhd_rt_free) */
};

/*
 * One request, on the stack of the control thread that posted it. It is in
 * its worker's list (w->reqs) from posting until it is completed (by the
 * worker) or abandoned (by the poster on timeout); it is touched only under
 * w->lock. The worker never keeps a pointer to a request outside the lock:
 * a detach in progress remembers the request's id, and completing it looks
 * the id up again, so an abandoned request (gone with its stack frame) is
 * never dereferenced.
 */
struct rt_req {
    enum rt_req_type type;
    struct vhd_queue *q;
    uint64_t id; /* unique per worker, never 0 */
    bool taken;  /* the worker has acted on it */
    bool done;   /* completed; rc is valid */
    int rc;      /* 0 or -errno */
    struct rt_req *next;
};

/* ---- worker ---- */

/*
 * One attached queue, private to its worker (allocated on its own so epoll
 * can point at it while the entries array grows).
 */
struct rt_entry {
    struct vhd_queue *q;
    bool pending;       /* process at the next turn: kicked, budget exhausted, or work slipped in */
    bool kickless;      /* no kick fd: polled every turn */
    bool kick_in_epoll; /* q->kick_fd is registered in the worker's epoll */
    bool wake_in_epoll; /* wake_fd is registered (tagged e | 1, edge-triggered) */
    int wake_fd;        /* the device's extra fd (dev ops queue_wake_fd), or -1 */
    bool broken;        /* queue_process failed: never popped again */
    bool detaching;     /* a detach was taken: not popped, waiting for inflight_io == 0 */
    uint64_t detach_id; /* request to complete when drained; 0: none (its poster gave up) */
    uint64_t drain_id;  /* RT_REQ_DRAIN: running until a turn takes less than a budget */
};

/*
 * Each worker on pages of its own: a pinned worker moves them to its NUMA
 * node at start (numa.h), which must not drag a neighbour's state along.
 */
#define RT_WORKER_ALIGN 4096

struct vhd_worker {
    /* ---- worker thread only ---- */
    struct io_uring ring;
    struct vhd_rt *rt;
    struct vhd_queue *dirty;   /* queues with pushed, unpublished used elements */
    struct rt_entry **entries; /* attached queues */
    unsigned nentries, cap;
    unsigned rr;         /* round-robin start of the next turn */
    unsigned nkickless;  /* entries polled every turn (kickless, not stopped) */
    unsigned ndetaching; /* entries with a detach in progress */
    bool submit_pending; /* SQEs queued since the last io_uring_submit */
    bool uring_used;     /* a device used the ring: peek the CQ (vhd_worker_uring) */
    bool polling;        /* adaptive: in the poll window, notifications disabled */
    bool more;           /* some queue still has work: do not sleep */
    bool stopping;       /* RT_REQ_STOP taken */
    enum vhd_poll_mode mode;
    unsigned budget;
    unsigned unpublished;  /* vhd_queue_mark_used calls since the last worker_flush_dirty */
    bool windowed;         /* polls for a window after work (adaptive, or event mode spin) */
    bool work_unstamped;   /* polling: work seen since the last clock read */
    bool epoll_due;        /* polling: RT_POLL_EPOLL_NS passed since the last epoll_wait(0) */
    bool slow_turn;        /* this turn also checks passive rings (every RT_CLOCK_EVERY) */
    bool window_closed;    /* windowed: the window closed since polling last started */
    uint64_t poll_ns;      /* windowed: the poll window, in [win_min_ns, win_max_ns] */
    uint64_t win_min_ns;   /* adaptive: the window's floor (opts.spin_us; = max: fixed) */
    uint64_t win_max_ns;   /* adaptive: the window's ceiling (opts.poll_us) */
    bool spin_auto;        /* the spin follows the measured wake-up cost (RT_WAKE_*) */
    uint64_t wake_cost_ns; /* measured CPU cost of a sleep and its wake-up (average) */
    uint64_t now_ns;       /* the last clock read while polling */
    uint64_t closed_ns;    /* when the window last closed */
    uint64_t last_work_ns; /* windowed: when work was last seen (to RT_CLOCK_EVERY turns) */
    uint64_t last_epoll_ns;
    uint32_t turns;                /* polling turns, to space out clock reads */
    uint64_t acct_ns;              /* time accounted up to here (worker_account) */
    struct vhd_rt_worker_stats st; /* written by this worker only (relaxed stores) */
    unsigned index;
    int epfd;
    int mbox_fd; /* eventfd: wakes the worker for the mailbox */

    /* ---- mailbox, shared with the control thread (own cache line) ---- */
    int mail vhd_cacheline_aligned; /* set (release) by the poster after enqueueing */
    pthread_mutex_t lock;           /* protects reqs, next_id and every struct rt_req */
    pthread_cond_t cond;            /* broadcast when a request completes */
    struct rt_req *reqs;            /* outstanding requests, oldest first */
    uint64_t next_id;
    uint64_t window_pub; /* poll_ns for vhd_rt_poll_window_ns (relaxed; written on change) */
    pthread_t thread;
    bool thread_started;
    bool lock_ready; /* lock and cond initialised */
    bool ring_ready; /* the io_uring exists (worker_start) */
    /* Placement: set before the thread starts (cpu) or by it before start_done (node). */
    int cpu;         /* pinned to this CPU; -1: floats */
    int node;        /* cpu's NUMA node; -1: floating or unknown */
    bool start_done; /* worker_start finished (under lock); start_rc is valid */
    int start_rc;
} __attribute__((aligned(RT_WORKER_ALIGN)));

struct vhd_rt {
    struct vhd_rt_opts opts;
    unsigned nworkers;
    int event_fd; /* written by workers when a queue breaks */
    struct vhd_worker *workers;
};

/* ---- datapath helpers (worker thread) ---- */

/*
 * Interrupt the driver of q through its call fd, never blocking (efd.h). A
 * call fd that would block (the front-end cleared O_NONBLOCK and filled the
 * counter, so it has a signal pending whatever we do) gets no more writes
 * until the front-end sets a new one: it only hurts itself.
 */
static void queue_call(struct vhd_queue *q)
{
    if (q->call_fd < 0 || q->call_stuck)
        return;
    int rc = vhd_efd_signal(q->call_fd);
    if (vhd_likely(rc == 0)) {
        vhd_store_relaxed(&q->stat_notifies, q->stat_notifies + 1);
    } else if (rc == -ETIMEDOUT) {
        q->call_stuck = true;
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: queue %u: its call fd blocks (O_NONBLOCK cleared, counter full): no more "
                   "interrupts on it until the front-end sets a new one",
                   q->dev->name, q->index);
    }
    /* -EAGAIN: the counter is full, a signal is pending anyway. */
}

static void worker_flush_dirty(struct vhd_worker *w);

void vhd_queue_mark_used(struct vhd_queue *q)
{
    struct vhd_worker *w = q->worker;

    q->notify_pending = true;
    if (vhd_unlikely(w == NULL)) {
        /*
         * Not attached: the caller is the control thread, which owns q
         * (e.g. a device completing leftovers in queue_fini). Publish now.
         */
        q->notify_pending = false;
        vhd_vq_flush(&q->vq);
        if (vhd_vq_need_notify(&q->vq))
            queue_call(q);
        return;
    }
    if (!q->on_dirty_list) {
        q->on_dirty_list = true;
        q->dirty_next = w->dirty;
        w->dirty = q;
    }
    /* Publish before the batch ends (RT_PUBLISH_EVERY): the driver refills meanwhile. */
    if (++w->unpublished >= RT_PUBLISH_EVERY)
        worker_flush_dirty(w);
}

/*
 * A worker peeks its CQ only once a device on it has used the ring (here,
 * vhd_worker_submit_pending, vhd_worker_get_sqe): before that no CQE can
 * arrive, and a net-only worker never pays the peek in its turns.
 */
struct io_uring *vhd_worker_uring(struct vhd_worker *w)
{
    w->uring_used = true;
    return &w->ring;
}

unsigned vhd_worker_index(const struct vhd_worker *w)
{
    return w->index;
}

void vhd_worker_submit_pending(struct vhd_worker *w)
{
    w->uring_used = true;
    w->submit_pending = true;
}

struct io_uring_sqe *vhd_worker_get_sqe(struct vhd_worker *w)
{
    struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);

    if (vhd_unlikely(sqe == NULL)) {
        /* SQ full: hand what is queued to the kernel, then retry once. */
        io_uring_submit(&w->ring);
        sqe = io_uring_get_sqe(&w->ring);
    }
    if (sqe) {
        w->uring_used = true;
        w->submit_pending = true;
    }
    return sqe;
}

/*
 * Publish every queue on the dirty list (one release store each) and signal
 * the driver where need_notify says so: once per burst, not per request.
 */
static void worker_flush_dirty(struct vhd_worker *w)
{
    struct vhd_queue *q;

    w->unpublished = 0;
    while ((q = w->dirty) != NULL) {
        w->dirty = q->dirty_next;
        q->dirty_next = NULL;
        q->on_dirty_list = false;
        q->notify_pending = false;
        vhd_vq_flush(&q->vq);
        if (vhd_vq_need_notify(&q->vq))
            queue_call(q);
    }
}

/*
 * Run the completions: copy each CQE's callback and result out, release the
 * CQ slots, then call the callbacks (which may queue new SQEs or push used
 * elements). Returns the number of CQEs seen.
 */
static unsigned worker_reap(struct vhd_worker *w)
{
    struct io_uring_cqe *cqes[RT_CQE_BATCH];
    struct {
        struct vhd_io_cb *cb;
        int res;
    } done[RT_CQE_BATCH];
    unsigned total = 0;

    for (;;) {
        unsigned n = io_uring_peek_batch_cqe(&w->ring, cqes, RT_CQE_BATCH);
        if (n == 0)
            break;
        for (unsigned i = 0; i < n; i++) {
            done[i].cb = io_uring_cqe_get_data(cqes[i]);
            done[i].res = cqes[i]->res;
        }
        io_uring_cq_advance(&w->ring, n);
        for (unsigned i = 0; i < n; i++)
            if (done[i].cb)
                done[i].cb->done(done[i].cb, done[i].res);
        total += n;
        if (n < RT_CQE_BATCH)
            break;
    }
    return total;
}

/* One io_uring_submit for everything queued this turn; keep the flag if some are left. */
static void worker_submit(struct vhd_worker *w)
{
    int rc = io_uring_submit(&w->ring);

    if (rc < 0 && rc != -EAGAIN && rc != -EBUSY && rc != -EINTR)
        VHD_LOG_RL(VHD_LOG_ERROR, "worker %u: io_uring_submit: %s", w->index, strerror(-rc));
    /* -EAGAIN/-EBUSY (no memory, CQ overflow): retried next turn after reaping. */
    w->submit_pending = io_uring_sq_ready(&w->ring) > 0;
}

static void worker_kick_del(struct vhd_worker *w, struct rt_entry *e)
{
    if (e->wake_in_epoll) {
        epoll_ctl(w->epfd, EPOLL_CTL_DEL, e->wake_fd, NULL);
        e->wake_in_epoll = false;
    }
    if (!e->kick_in_epoll)
        return;
    /* Errors are ignored: the fd may already be gone; either way it no longer wakes us. */
    epoll_ctl(w->epfd, EPOLL_CTL_DEL, e->q->kick_fd, NULL);
    e->kick_in_epoll = false;
}

/* Stop processing e (broken or detaching): no more pops, no more polling. */
static void worker_entry_stop(struct vhd_worker *w, struct rt_entry *e)
{
    if (e->broken || e->detaching)
        return;
    if (e->q->dev->ops->queue_stop)
        e->q->dev->ops->queue_stop(e->q); /* requests the device held back complete now */
    worker_kick_del(w, e);
    if (e->kickless)
        w->nkickless--;
    e->pending = false;
}

/*
 * A drain (vhd_rt_drain) is over: the queue's turn took less than a budget,
 * or it broke. From here it is a detach in progress, completed by
 * worker_check_detaching once its in-flight I/O is in.
 */
static void worker_drain_done(struct vhd_worker *w, struct rt_entry *e)
{
    worker_entry_stop(w, e);
    if (!e->detaching) {
        e->detaching = true;
        w->ndetaching++;
    }
    e->detach_id = e->drain_id;
    e->drain_id = 0;
}

/*
 * queue_process failed: the queue is broken until the control thread resets
 * it. It stays attached (its in-flight I/O still completes and is flushed);
 * the control thread learns of it through q->broken and rt->event_fd.
 */
static void worker_queue_broke(struct vhd_worker *w, struct rt_entry *e, int rc)
{
    struct vhd_queue *q = e->q;
    char buf[64];
    const char *why;

    worker_entry_stop(w, e);
    e->broken = true;
    if (e->drain_id)
        worker_drain_done(w, e);
    if (q->vq.error)
        why = vhd_vq_strerror(q->vq.error);
    else
        why = strerror_r(rc < 0 ? -rc : rc, buf, sizeof(buf));
    /* A guest can trigger this (a malformed ring): rate-limited. */
    VHD_LOG_RL(VHD_LOG_ERROR, "%s: queue %u broken (%s): stopped until the device is reset",
               q->dev->name, q->index, why);
    /* Pairs with the control thread's acquire load of q->broken. */
    vhd_store_release(&q->broken, true);
    eventfd_write(w->rt->event_fd, 1);
}

/* Set e's notification state for the worker's current mode (attach, mode switches). */
static void worker_entry_set_notify(struct vhd_worker *w, struct rt_entry *e)
{
    struct vhd_vq *vq = &e->q->vq;

    if (w->mode == VHD_POLL_ALWAYS || w->polling) {
        vhd_vq_disable_notify(vq);
    } else if (vhd_vq_enable_notify(vq) && !e->q->passive) {
        /* Work slipped in before the enable became visible: do not wait for a kick. */
        e->pending = true;
    }
}

/*
 * Process the attached queues once, round-robin from a rotating start, each
 * for at most `budget` chains, so a busy queue cannot starve the others.
 * Which queues: those kicked or left with work (pending), those without a
 * kick fd, and, while polling, any queue whose ring has work. Returns true
 * when some chain was taken.
 */
static bool worker_process_queues(struct vhd_worker *w)
{
    unsigned n = w->nentries;
    bool poll = w->mode == VHD_POLL_ALWAYS || w->polling;
    bool work = false, more = false;

    if (n == 0) {
        w->more = false;
        return false;
    }
    unsigned i = w->rr < n ? w->rr : 0;
    w->rr = i + 1;
    for (unsigned k = 0; k < n; k++, i = (i + 1 == n) ? 0 : i + 1) {
        struct rt_entry *e = w->entries[i];
        struct vhd_queue *q = e->q;

        if (e->broken || e->detaching)
            continue;
        /*
         * The engine marks a queue broken wherever it meets bad guest data,
         * also outside queue_process (a push in a completion, a corrupt index
         * seen by enable_notify). A broken vq never reports work, so catch it
         * here rather than let the queue stall silently.
         */
        if (vhd_unlikely(q->vq.error)) {
            worker_queue_broke(w, e, -EIO);
            continue;
        }
        /*
         * Polling looks at every ring each turn, except passive ones (their
         * chains are not work: they run on kicks, wake fds or their pair),
         * which it checks only on slow turns, for refills that came while
         * kicks were off.
         */
        if (!e->pending &&
            !(((poll && (w->slow_turn || !q->passive)) || e->kickless) && vhd_vq_has_work(&q->vq)))
            continue;
        int r = q->dev->ops->queue_process(q, w->budget);
        if (vhd_unlikely(r < 0)) {
            worker_queue_broke(w, e, r);
            continue;
        }
        if (r > 0)
            work = true;
        if ((unsigned)r >= w->budget) {
            /* Budget used up: the ring may hold more; come back next turn. */
            e->pending = true;
            more = true;
            continue;
        }
        e->pending = false;
        if (vhd_unlikely(e->drain_id)) {
            worker_drain_done(w, e); /* the device took all it would */
            continue;
        }
        /*
         * Event mode: the ring looked empty. Re-arm the kick and check again:
         * the driver may have added a chain after our last pop and, seeing
         * the old avail_event (or NO_NOTIFY), not kicked. enable_notify makes
         * the request visible with a full barrier and re-reads the ring
         * (vq_split.c / vq_packed.c, pairing D); true means the chain slipped
         * in and we must process it rather than sleep. Polling modes do this
         * once, when the poll window closes (worker_enable_notify_all). On a
         * passive ring (dev.h) chains are not work: notifications are armed,
         * and what the ring holds does not keep us awake.
         */
        if (!w->windowed && w->mode == VHD_POLL_NEVER && vhd_vq_enable_notify(&q->vq) &&
            !q->passive) {
            e->pending = true;
            more = true;
        }
    }
    w->more = more;
    return work;
}

/* Adaptive: entering the poll window. Kicks are not needed while we poll. */
static void worker_disable_notify_all(struct vhd_worker *w)
{
    for (unsigned i = 0; i < w->nentries; i++) {
        struct rt_entry *e = w->entries[i];
        if (!e->broken && !e->detaching)
            vhd_vq_disable_notify(&e->q->vq);
    }
}

/*
 * Adaptive: the poll window closed. Re-enable notifications on every queue,
 * and re-check each ring after its enable is visible (the classic race: a
 * chain added while kicks were off produced no kick). Returns true when some
 * ring has work (those entries are marked pending: do not sleep).
 */
static bool worker_enable_notify_all(struct vhd_worker *w)
{
    bool slipped = false;

    for (unsigned i = 0; i < w->nentries; i++) {
        struct rt_entry *e = w->entries[i];
        if (e->broken || e->detaching)
            continue;
        /* A passive ring's chains are not work (dev.h): armed, but not a reason to stay up. */
        if (vhd_vq_enable_notify(&e->q->vq) && !e->q->passive) {
            e->pending = true;
            slipped = true;
        }
    }
    return slipped;
}

/*
 * Time accounting (struct vhd_rt_worker_stats): the time since the last
 * accounting point goes to polling (poll-always, or inside a poll window:
 * notifications off) or to event mode. Called where the loop reads the clock
 * anyway, and around sleeps; the polling state changes only at such points.
 */
static void worker_account(struct vhd_worker *w, uint64_t now)
{
    uint64_t d = now > w->acct_ns ? now - w->acct_ns : 0;
    w->acct_ns = now;
    if (w->mode == VHD_POLL_ALWAYS || w->polling)
        vhd_store_relaxed(&w->st.poll_ns, w->st.poll_ns + d);
    else
        vhd_store_relaxed(&w->st.event_ns, w->st.event_ns + d);
}

/*
 * A polling turn's clock work, every RT_CLOCK_EVERY turns: stamp work seen
 * since the last read, schedule an epoll_wait(0), and say whether the poll
 * window (windowed modes) is over. The turn after a read is a slow turn.
 */
static bool worker_poll_tick(struct vhd_worker *w, bool work)
{
    w->slow_turn = false;
    if (work)
        w->work_unstamped = true;
    if ((++w->turns & (RT_CLOCK_EVERY - 1)) != 0)
        return false;
    uint64_t now = vhd_now_ns();
    w->now_ns = now;
    worker_account(w, now);
    w->slow_turn = true;
    if (now - w->last_epoll_ns >= RT_POLL_EPOLL_NS) {
        w->epoll_due = true;
        w->last_epoll_ns = now;
    }
    if (w->work_unstamped) {
        w->work_unstamped = false;
        w->last_work_ns = now;
        return false;
    }
    return w->polling && now - w->last_work_ns >= w->poll_ns;
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * Set the window bounds from the spin (win_min_ns) under the mode's rules:
 * event mode polls a fixed window of the spin; adaptive keeps its window in
 * [spin, poll_us] (a spin above the ceiling: a fixed window of poll_us).
 * The current window is moved into the bounds and published.
 */
static void worker_set_spin(struct vhd_worker *w, uint64_t spin_ns)
{
    uint64_t ceiling = (uint64_t)w->rt->opts.poll_us * 1000u;
    if (w->mode == VHD_POLL_NEVER)
        ceiling = spin_ns;
    w->win_max_ns = ceiling;
    w->win_min_ns = spin_ns == 0 || spin_ns > ceiling ? ceiling : spin_ns;
    uint64_t win = w->poll_ns;
    if (w->mode == VHD_POLL_NEVER || win > w->win_max_ns)
        win = w->win_max_ns;
    if (win < w->win_min_ns)
        win = w->win_min_ns;
    w->poll_ns = win;
    vhd_store_relaxed(&w->window_pub, win);
}

/*
 * After an epoll_wait that may have blocked: cpu_ns of thread CPU and
 * wall_ns of time went by inside it. A real sleep (RT_WAKE_SLEPT_NS more
 * wall than CPU) updates the wake-up cost; with the automatic spin, the
 * spin follows it (RT_SPIN_AUTO_*).
 */
static void worker_wake_sample(struct vhd_worker *w, uint64_t cpu_ns, uint64_t wall_ns)
{
    if (wall_ns < cpu_ns + RT_WAKE_SLEPT_NS)
        return;
    if (cpu_ns > RT_WAKE_MAX_SAMPLE_NS)
        cpu_ns = RT_WAKE_MAX_SAMPLE_NS;
    uint64_t c = w->wake_cost_ns;
    c = c - c / 8 + cpu_ns / 8;
    w->wake_cost_ns = c;
    vhd_store_relaxed(&w->st.wake_cost_ns, c);
    if (!w->spin_auto)
        return;
    uint64_t spin = c < RT_SPIN_AUTO_MIN_NS   ? RT_SPIN_AUTO_MIN_NS
                    : c > RT_SPIN_AUTO_MAX_NS ? RT_SPIN_AUTO_MAX_NS
                                              : c;
    /* Move the bounds only for a change of 1/16 or more: no churn for noise. */
    uint64_t cur = w->win_min_ns, d = spin > cur ? spin - cur : cur - spin;
    if (d * 16 >= cur)
        worker_set_spin(w, spin);
}

/*
 * Adaptive window (in the spirit of QEMU's poll-grow / poll-shrink): work
 * came `gap` ns after the last window closed (after a sleep, or found by the
 * re-check). Within the ceiling, a longer window would have caught it
 * without the sleep and its wake-up: double it (up to the ceiling). Beyond
 * the ceiling, polling could not have caught it and only burnt CPU: halve
 * it (down to the floor). Once the window covers the gaps, it stops
 * closing and stays where it is.
 */
static void worker_window_adapt(struct vhd_worker *w, uint64_t gap)
{
    uint64_t win = w->poll_ns;

    w->window_closed = false;
    if (w->win_min_ns >= w->win_max_ns)
        return; /* fixed window (event-mode spin, or no floor given) */
    if (gap > w->win_max_ns)
        win = win / 2 > w->win_min_ns ? win / 2 : w->win_min_ns;
    else
        win = win * 2 < w->win_max_ns ? win * 2 : w->win_max_ns;
    if (win != w->poll_ns) {
        w->poll_ns = win;
        vhd_store_relaxed(&w->window_pub, win);
    }
}

/*
 * After a turn: how long may the next epoll_wait sleep? 0 (poll again) or
 * -1 (until a kick, a CQE, or mail). CQEs wake us through the ring fd in the
 * epoll set, so in-flight I/O needs no timeout. While polling the clock is
 * read once per RT_CLOCK_EVERY turns (worker_poll_tick).
 */
static int worker_next_timeout(struct vhd_worker *w, bool work)
{
    if (w->stopping)
        return 0;
    if (w->mode == VHD_POLL_ALWAYS) {
        (void)worker_poll_tick(w, work);
        return 0;
    }
    if (w->windowed) {
        if (w->polling) {
            if (!worker_poll_tick(w, work))
                return 0;
            /* The window closed: notifications on, then look again (the race). */
            w->polling = false;
            w->slow_turn = false;
            w->window_closed = true;
            w->closed_ns = w->now_ns;
            if (worker_enable_notify_all(w))
                return 0;
        } else if (work) {
            /* Work after a sleep (or after a kick while awake): poll for a window. */
            uint64_t now = vhd_now_ns();
            if (w->window_closed)
                worker_window_adapt(w, now - w->closed_ns);
            w->last_work_ns = now;
            w->last_epoll_ns = now;
            w->work_unstamped = false;
            w->turns = 0;
            worker_account(w, now);
            w->polling = true;
            worker_disable_notify_all(w);
            return 0;
        }
    }
    if (w->more || w->submit_pending || w->nkickless)
        return 0;
    return -1;
}

/* ---- attach / detach on the worker (called with w->lock held) ---- */

static int worker_find(const struct vhd_worker *w, const struct vhd_queue *q)
{
    for (unsigned i = 0; i < w->nentries; i++)
        if (w->entries[i]->q == q)
            return (int)i;
    return -1;
}

/*
 * Take q: from here on this thread owns its datapath fields. The translation
 * cache is dropped so a queue moved from another worker starts clean here
 * (the next verb re-translates its rings). Then notifications are set for
 * the current mode and the queue is marked pending: the driver may have
 * queued work (and kicked) before we were listening.
 */
static int worker_do_attach(struct vhd_worker *w, struct vhd_queue *q)
{
    if (worker_find(w, q) >= 0)
        return -EEXIST;
    if (w->nentries == w->cap) {
        unsigned cap = w->cap ? 2 * w->cap : 8;
        struct rt_entry **a = realloc(w->entries, cap * sizeof(*a));
        if (!a)
            return -ENOMEM;
        w->entries = a;
        w->cap = cap;
    }
    struct rt_entry *e = calloc(1, sizeof(*e));
    if (!e)
        return -ENOMEM;
    e->q = q;
    if (q->kick_fd >= 0) {
        /*
         * Under w->lock, which the control thread waits for: EPOLL_CTL_ADD
         * polls the file once, so it must be one whose poll never sleeps.
         * The transport hands over eventfds only (vhd_efd_check); a FUSE
         * file or a FIFO here could hold the lock for as long as its
         * server wants.
         */
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = e};
        if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, q->kick_fd, &ev) < 0) {
            int rc = -errno;
            free(e);
            return rc;
        }
        e->kick_in_epoll = true;
    } else {
        e->kickless = true;
        w->nkickless++;
    }
    /*
     * The device's extra fd (a TAP fd, a switch doorbell), tagged with the
     * entry's address + 1 (entries are malloc'ed, so bit 0 is free) to tell
     * it from the kick fd. Edge-triggered: nobody here reads it.
     */
    e->wake_fd = q->dev->ops->queue_wake_fd ? q->dev->ops->queue_wake_fd(q) : -1;
    if (e->wake_fd >= 0) {
        struct epoll_event ev = {.events = EPOLLIN | EPOLLET,
                                 .data.ptr = (void *)((uintptr_t)e | 1u)};
        if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, e->wake_fd, &ev) < 0) {
            int rc = -errno;
            if (e->kick_in_epoll)
                epoll_ctl(w->epfd, EPOLL_CTL_DEL, q->kick_fd, NULL);
            if (e->kickless)
                w->nkickless--;
            free(e);
            return rc;
        }
        e->wake_in_epoll = true;
    }
    q->worker = w;
    q->on_dirty_list = false;
    q->dirty_next = NULL;
    q->notify_pending = false;
    vhd_vq_invalidate(&q->vq);
    q->vq.mem_hint = 0;
    e->pending = true;
    worker_entry_set_notify(w, e);
    w->entries[w->nentries++] = e;
    if (w->cpu >= 0 && q->dev->ops->queue_place) {
        /* Pinned: the queue's state follows the worker to its node (first touch was elsewhere). */
        int rc = q->dev->ops->queue_place(q);
        VHD_LOG_RL(VHD_LOG_DEBUG, "%s: queue %u: state %s worker %u's NUMA node %d%s%s",
                   q->dev->name, q->index, rc == 0 ? "moved to" : "not moved to", w->index, w->node,
                   rc == 0 ? "" : ": ", rc == 0 ? "" : strerror(-rc));
    }
    return 0;
}

/*
 * Begin letting go of q: stop popping it and stop listening to its kicks.
 * In-flight I/O keeps completing through the CQ; worker_check_detaching()
 * finishes once q->inflight_io is 0. Returns 1 (in progress) or -ENOENT.
 */
static int worker_begin_detach(struct vhd_worker *w, struct vhd_queue *q, uint64_t id)
{
    int i = worker_find(w, q);
    if (i < 0)
        return -ENOENT;
    struct rt_entry *e = w->entries[i];
    if (!e->detaching) {
        worker_entry_stop(w, e);
        e->detaching = true;
        w->ndetaching++;
    }
    /* A retry after a timed-out detach lands here too: it takes over. */
    e->detach_id = id;
    return 1;
}

/* Complete req (w->lock held): unlink it, publish rc. The caller broadcasts. */
static void req_complete(struct vhd_worker *w, struct rt_req *req, int rc)
{
    for (struct rt_req **pp = &w->reqs; *pp; pp = &(*pp)->next) {
        if (*pp == req) {
            *pp = req->next;
            break;
        }
    }
    req->rc = rc;
    req->done = true;
}

static struct rt_req *req_find(struct vhd_worker *w, uint64_t id)
{
    for (struct rt_req *r = w->reqs; r; r = r->next)
        if (r->id == id)
            return r;
    return NULL;
}

/*
 * Handle the mailbox: act on every request not yet taken. Attach and stop
 * complete at once (bounded work under the lock: an epoll_ctl, a ring
 * check); a detach completes later, when its queue has drained.
 */
static void worker_handle_mail(struct vhd_worker *w)
{
    eventfd_t v;
    bool completed = false;

    /*
     * Clear the flag before looking at the list: a request enqueued after
     * our look sets it again (its poster stores the flag after unlocking).
     */
    vhd_store_relaxed(&w->mail, 0);
    (void)eventfd_read(w->mbox_fd, &v); /* non-blocking; EAGAIN is fine */

    pthread_mutex_lock(&w->lock);
    struct rt_req *r = w->reqs;
    while (r) {
        struct rt_req *next = r->next; /* r may be unlinked below */
        if (!r->taken) {
            r->taken = true;
            switch (r->type) {
            case RT_REQ_ATTACH:
                req_complete(w, r, worker_do_attach(w, r->q));
                completed = true;
                break;
            case RT_REQ_DRAIN: {
                /* Attach (processed at the next turn), then detach when it has run dry. */
                int rc = worker_do_attach(w, r->q);
                if (rc < 0) {
                    req_complete(w, r, rc);
                    completed = true;
                } else {
                    w->entries[w->nentries - 1]->drain_id = r->id;
                }
                break;
            }
            case RT_REQ_DETACH: {
                int rc = worker_begin_detach(w, r->q, r->id);
                if (rc < 0) {
                    req_complete(w, r, rc);
                    completed = true;
                }
                break;
            }
            case RT_REQ_STOP:
                w->stopping = true;
                req_complete(w, r, 0);
                completed = true;
                break;
            }
        }
        r = next;
    }
    if (completed)
        pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/*
 * Finish the detach of entries[i] if its poster still waits: remove the
 * entry, hand q back (q->worker = NULL), complete the request. Returns true
 * when the entry was removed. If the poster gave up (timed out), the queue
 * stays parked here, drained and not popped, until a new detach arrives.
 */
static bool worker_finish_detach(struct vhd_worker *w, unsigned i)
{
    struct rt_entry *e = w->entries[i];
    struct vhd_queue *q = e->q;
    bool removed = false;

    /* The turn flushed the dirty list just before; this only guards against a late push. */
    if (q->on_dirty_list)
        worker_flush_dirty(w);

    pthread_mutex_lock(&w->lock);
    struct rt_req *req = req_find(w, e->detach_id);
    if (req) {
        w->entries[i] = w->entries[--w->nentries];
        w->ndetaching--;
        q->worker = NULL;
        /* The unlock below publishes every write we made to q (see file comment). */
        req_complete(w, req, 0);
        pthread_cond_broadcast(&w->cond);
        removed = true;
    } else {
        e->detach_id = 0;
    }
    pthread_mutex_unlock(&w->lock);
    if (removed)
        free(e);
    return removed;
}

static void worker_check_detaching(struct vhd_worker *w)
{
    unsigned i = 0;

    while (i < w->nentries) {
        struct rt_entry *e = w->entries[i];
        if (e->detaching && e->detach_id && e->q->inflight_io == 0 && worker_finish_detach(w, i))
            continue; /* entries[i] now holds another entry */
        i++;
    }
}

/* ---- the loop ---- */

/* One epoll event. Returns true for the mailbox (handled by the caller after the batch). */
static bool worker_dispatch(struct vhd_worker *w, const struct epoll_event *ev)
{
    void *tag = ev->data.ptr;

    if (tag == &rt_tag_mailbox) {
        return true;
    } else if (tag == &rt_tag_uring) {
        /* Nothing to do here: the CQ is reaped every turn. */
    } else if ((uintptr_t)tag & 1u) {
        /* The device's wake fd (see worker_do_attach): just mark the queue. */
        struct rt_entry *e = (struct rt_entry *)((uintptr_t)tag & ~(uintptr_t)1u);
        if (e->wake_in_epoll)
            e->pending = true;
    } else {
        struct rt_entry *e = tag;
        uint64_t v;
        /*
         * A kick. Entries are freed only at the end of a turn, so e is
         * valid; it may have stopped earlier in this batch (then its fd has
         * left the epoll set and the kick is the next owner's to see).
         */
        if (!e->kick_in_epoll)
            return false;
        /*
         * Consume the count, one wake-up. RWF_NOWAIT (efd.h): the front-end
         * may have cleared the O_NONBLOCK set at attach and drained the
         * count since epoll saw it.
         */
        ssize_t n = vhd_efd_read(e->q->kick_fd, &v);
        if (n == 0 || (ev->events & (EPOLLHUP | EPOLLERR))) {
            /*
             * Not an eventfd: a pipe or socket whose other end is closed.
             * It stays readable (EOF) for ever, so level-triggered epoll
             * would spin on it, and it can never carry a kick again: the
             * queue is broken (the front-end sees NEEDS_RESET).
             */
            worker_queue_broke(w, e, -EPIPE);
            return false;
        }
        if (n < 0 && n != -EAGAIN && n != -EINTR && n != -ETIMEDOUT) {
            /*
             * Readable, yet it cannot be read: not an eventfd (an epoll fd,
             * a listening socket). The transport accepts only eventfds
             * (efd.h, vhd_efd_check); should another one get here,
             * level-triggered epoll would report it again at once, for
             * ever: the queue is broken instead of the worker spinning.
             */
            worker_queue_broke(w, e, (int)n);
            return false;
        }
        if (n < 0)
            return false;
        vhd_store_relaxed(&e->q->stat_kicks, e->q->stat_kicks + 1);
        e->pending = true;
    }
    return false;
}

static void worker_shutdown(struct vhd_worker *w)
{
    /* vhd_rt_free requires every queue detached; survive it if not. */
    for (unsigned i = 0; i < w->nentries; i++) {
        struct rt_entry *e = w->entries[i];
        vhd_log(VHD_LOG_WARN, "worker %u: stopping with %s queue %u still attached", w->index,
                e->q->dev->name, e->q->index);
        worker_kick_del(w, e);
        /* Its in-flight I/O is cancelled with the ring, without callbacks. */
        e->q->worker = NULL;
        free(e);
    }
    w->nentries = 0;
    free(w->entries);
    w->entries = NULL;

    /* Fail anything still in the mailbox. */
    pthread_mutex_lock(&w->lock);
    while (w->reqs)
        req_complete(w, w->reqs, -ESHUTDOWN);
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

static int worker_start(struct vhd_worker *w);

static void *worker_main(void *arg)
{
    struct vhd_worker *w = arg;
    struct epoll_event evs[RT_EVENTS];
    int timeout = -1;

    int rc = worker_start(w);
    pthread_mutex_lock(&w->lock);
    w->start_rc = rc;
    w->start_done = true;
    pthread_cond_broadcast(&w->cond);
    pthread_mutex_unlock(&w->lock);
    if (rc < 0)
        return NULL; /* vhd_rt_new joins it and fails */
    /* Call-fd writes stay guarded while we write; disarmed after a quiet period (efd.h). */
    vhd_efd_keep_armed(true);
    w->acct_ns = vhd_now_ns();
    while (!w->stopping) {
        /*
         * Sleep (timeout -1) or peek (0). While polling every ring, epoll is
         * consulted only every RT_POLL_EPOLL_NS (see there) and the mailbox
         * flag catches requests at once. Otherwise a turn that does not
         * sleep still peeks, so kicks on other queues are seen at once.
         */
        bool poll_all = w->mode == VHD_POLL_ALWAYS || w->polling;
        bool mail = vhd_load_acquire(&w->mail) != 0;
        if (timeout != 0 || !poll_all || mail || w->epoll_due) {
            w->epoll_due = false;
            uint64_t t0 = 0, c0 = 0;
            if (timeout != 0) {
                t0 = vhd_now_ns();
                worker_account(w, t0);
                vhd_store_relaxed(&w->st.sleeps, w->st.sleeps + 1);
                c0 = thread_cpu_ns();
            }
            int n = epoll_wait(w->epfd, evs, RT_EVENTS, timeout);
            if (timeout != 0) {
                uint64_t c1 = thread_cpu_ns();
                /* asleep: event time, whatever the mode (poll-always sleeps only at start) */
                uint64_t t1 = vhd_now_ns();
                vhd_store_relaxed(&w->st.sleep_ns, w->st.sleep_ns + (t1 - t0));
                vhd_store_relaxed(&w->st.event_ns, w->st.event_ns + (t1 - t0));
                w->acct_ns = t1;
                if (n > 0 && c1 >= c0 && c0 != 0)
                    worker_wake_sample(w, c1 - c0, t1 - t0);
            }
            for (int i = 0; i < n; i++)
                mail |= worker_dispatch(w, &evs[i]);
            if (n < 0 && errno != EINTR) {
                vhd_log(VHD_LOG_ERROR, "worker %u: epoll_wait: %s", w->index, strerror(errno));
                /* Cannot happen with a valid epfd; do not spin hot if it does. */
                usleep(1000);
            }
        }
        if (mail)
            worker_handle_mail(w);
        if (w->stopping)
            break;

        bool work = w->uring_used && worker_reap(w) > 0;
        work |= worker_process_queues(w);
        if (w->submit_pending) {
            worker_submit(w);
            /*
             * What completed inside the submit (page-cache hits, NOPs) is
             * reaped now and published below in this turn, not after the
             * next epoll_wait. Its callbacks may queue SQEs: submitted next
             * turn (submit_pending keeps the loop awake).
             */
            if (io_uring_cq_ready(&w->ring))
                work |= worker_reap(w) > 0;
        }
        if (w->dirty)
            worker_flush_dirty(w);
        if (w->ndetaching)
            worker_check_detaching(w);
        vhd_efd_tick(); /* the call-fd guard stops once a period passed without a write */
        timeout = worker_next_timeout(w, work);
    }
    worker_shutdown(w);
    vhd_efd_thread_end();
    return NULL;
}

/* ---- control thread API ---- */

void vhd_rt_opts_default(struct vhd_rt_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->nworkers = 1;
    o->poll_mode = VHD_POLL_ADAPTIVE;
    /* Tens of microseconds: longer than a typical guest's gap between requests under load. */
    o->poll_us = 50;
    /* One wake-up's worth, as each worker measures it (RT_WAKE_*). */
    o->spin_us = VHD_RT_SPIN_AUTO;
    o->uring_entries = 256;
    /* 64 chains: enough to batch notifications, small enough to keep other queues' latency low. */
    o->budget = 64;
}

static void worker_fini(struct vhd_worker *w)
{
    if (w->ring_ready)
        io_uring_queue_exit(&w->ring);
    if (w->epfd >= 0)
        close(w->epfd);
    if (w->mbox_fd >= 0)
        close(w->mbox_fd);
    if (w->lock_ready) {
        pthread_mutex_destroy(&w->lock);
        pthread_cond_destroy(&w->cond);
    }
}

/*
 * The worker's io_uring. With opts.uring_ops set (see rt.h) the ring starts
 * disabled, gets its opcode allow-list and is then enabled: from here on the
 * kernel fails any other opcode with -EACCES in its CQE.
 */
static int worker_ring_init(struct vhd_worker *w, const struct vhd_rt *rt)
{
    uint64_t ops = rt->opts.uring_ops;
    struct io_uring_params p;
    struct io_uring_restriction res[65]; /* one per opcode bit, plus the SQE flags rule */
    unsigned n = 0;
    int rc;

    if (!ops)
        return io_uring_queue_init(rt->opts.uring_entries, &w->ring, 0);
    memset(&p, 0, sizeof(p));
    p.flags = IORING_SETUP_R_DISABLED;
    rc = io_uring_queue_init_params(rt->opts.uring_entries, &w->ring, &p);
    if (rc < 0)
        return rc;
    memset(res, 0, sizeof(res));
    for (unsigned op = 0; op < 64; op++) {
        if (!(ops >> op & 1))
            continue;
        res[n].opcode = IORING_RESTRICTION_SQE_OP;
        res[n].sqe_op = (uint8_t)op;
        n++;
    }
    /* No SQE flags (links, fixed files, async) and no register operations allowed. */
    res[n].opcode = IORING_RESTRICTION_SQE_FLAGS_ALLOWED;
    res[n].sqe_flags = 0;
    n++;
    /* Raw syscalls: Debian 12's liburing 2.3 declares the wrappers but does not export them. */
    rc =
        (int)syscall(__NR_io_uring_register, w->ring.ring_fd, IORING_REGISTER_RESTRICTIONS, res, n);
    if (rc == 0)
        rc = (int)syscall(__NR_io_uring_register, w->ring.ring_fd, IORING_REGISTER_ENABLE_RINGS,
                          NULL, 0);
    if (rc < 0) {
        rc = -errno;
        io_uring_queue_exit(&w->ring);
        return rc;
    }
    return 0;
}

static int worker_init(struct vhd_rt *rt, struct vhd_worker *w, unsigned index)
{
    struct epoll_event ev = {.events = EPOLLIN};
    pthread_condattr_t ca;
    int rc;

    w->epfd = -1;
    w->mbox_fd = -1;
    w->index = index;
    w->node = -1; /* w->cpu: set by vhd_rt_new */
    w->mode = rt->opts.poll_mode;
    w->budget = rt->opts.budget;
    /*
     * Adaptive: the window moves between the spin (floor) and poll_us
     * (ceiling), starting at the ceiling. Event mode with a spin: a fixed
     * window of spin_us (poll that long after work before notifications go
     * back on and the worker sleeps); without one, pure event mode. The
     * automatic spin starts at RT_WAKE_INIT_NS and follows the measured
     * wake-up cost (worker_wake_sample).
     */
    w->rt = rt;
    w->spin_auto = rt->opts.spin_us == VHD_RT_SPIN_AUTO;
    w->wake_cost_ns = RT_WAKE_INIT_NS;
    w->st.wake_cost_ns = RT_WAKE_INIT_NS;
    w->poll_ns = (uint64_t)rt->opts.poll_us * 1000u; /* starts at the ceiling */
    worker_set_spin(w, w->spin_auto ? RT_WAKE_INIT_NS : (uint64_t)rt->opts.spin_us * 1000u);
    w->windowed = (w->mode == VHD_POLL_ADAPTIVE || w->mode == VHD_POLL_NEVER) && w->poll_ns > 0;

    if (pthread_mutex_init(&w->lock, NULL) != 0)
        return -ENOMEM;
    pthread_condattr_init(&ca);
    /* Deadlines on the monotonic clock: a wall-clock step must not stretch a bounded wait. */
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(&w->cond, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0) {
        pthread_mutex_destroy(&w->lock);
        return -rc;
    }
    w->lock_ready = true;

    w->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (w->epfd < 0)
        return -errno;
    w->mbox_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (w->mbox_fd < 0)
        return -errno;

    ev.data.ptr = &rt_tag_mailbox;
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->mbox_fd, &ev) < 0)
        return -errno;
    return 0;
}

/*
 * The worker's start, on its own thread (already on its CPU when pinned:
 * vhd_rt_new sets the affinity before the thread runs): move its state to
 * its node, then create its io_uring (the kernel allocates the rings on the
 * node of the CPU that asks) and watch it. The hot state the worker
 * allocates later (queue entries, backends' per-request buffers) is its
 * own first touch too. 0 or -errno.
 */
static int worker_start(struct vhd_worker *w)
{
    struct epoll_event ev = {.events = EPOLLIN};
    int rc;

    if (w->cpu >= 0) {
        rc = vhd_numa_node_here();
        w->node = rc < 0 ? -1 : rc;
        if (rc >= 0)
            rc = vhd_numa_move_here(w, sizeof(*w));
        if (rc < 0 && rc != -ENOSYS)
            vhd_log(VHD_LOG_DEBUG, "worker %u: state not moved to its NUMA node: %s", w->index,
                    strerror(-rc));
    }
    /* Plain ring, no SQPOLL: the worker is the only submitter and reaper. */
    rc = worker_ring_init(w, w->rt);
    if (rc < 0)
        return rc;
    w->ring_ready = true;
    /* The ring fd polls readable when CQEs are pending: completions wake a sleeping worker. */
    ev.data.ptr = &rt_tag_uring;
    if (epoll_ctl(w->epfd, EPOLL_CTL_ADD, w->ring.ring_fd, &ev) < 0)
        return -errno;
    return 0;
}

/*
 * Post req to w and wait (bounded) for its completion. On timeout the
 * request is withdrawn under the lock, so the worker never touches it again.
 * Returns req->rc or -ETIMEDOUT. timeout_ms < 0: wait without bound (stop).
 */
static int rt_post_wait(struct vhd_worker *w, struct rt_req *req, int timeout_ms)
{
    struct timespec deadline;
    int rc;

    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_ms > 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }

    pthread_mutex_lock(&w->lock);
    req->id = ++w->next_id;
    req->taken = false;
    req->done = false;
    req->next = NULL;
    struct rt_req **pp = &w->reqs;
    while (*pp)
        pp = &(*pp)->next;
    *pp = req;
    pthread_mutex_unlock(&w->lock);

    /* Wake-ups only (see worker_handle_mail for why the flag comes after the enqueue). */
    vhd_store_release(&w->mail, 1);
    eventfd_write(w->mbox_fd, 1);

    pthread_mutex_lock(&w->lock);
    while (!req->done) {
        if (timeout_ms < 0) {
            pthread_cond_wait(&w->cond, &w->lock);
            continue;
        }
        if (pthread_cond_timedwait(&w->cond, &w->lock, &deadline) == ETIMEDOUT)
            break;
    }
    if (req->done) {
        rc = req->rc;
    } else {
        /* Withdraw: not done means still linked (only completion unlinks). */
        for (pp = &w->reqs; *pp; pp = &(*pp)->next) {
            if (*pp == req) {
                *pp = req->next;
                break;
            }
        }
        rc = -ETIMEDOUT;
    }
    pthread_mutex_unlock(&w->lock);
    return rc;
}

/*
 * Start w's thread, pinned to w->cpu when set (the affinity is set before it
 * runs), and wait for its start (worker_start). A worker whose start failed
 * has ended: it is joined here. 0 or -errno (-EINVAL: a CPU this process may
 * not use).
 */
static int worker_spawn(struct vhd_worker *w)
{
    pthread_attr_t attr;
    cpu_set_t set;
    int err;

    if (pthread_attr_init(&attr) != 0)
        return -ENOMEM;
    if (w->cpu >= 0) {
        if (w->cpu >= CPU_SETSIZE) {
            pthread_attr_destroy(&attr);
            return -EINVAL;
        }
        CPU_ZERO(&set);
        CPU_SET((unsigned)w->cpu, &set);
        err = pthread_attr_setaffinity_np(&attr, sizeof(set), &set);
        if (err != 0) {
            pthread_attr_destroy(&attr);
            return -err;
        }
    }
    err = pthread_create(&w->thread, &attr, worker_main, w);
    pthread_attr_destroy(&attr);
    if (err != 0)
        return -err;
    pthread_mutex_lock(&w->lock);
    while (!w->start_done)
        pthread_cond_wait(&w->cond, &w->lock);
    err = w->start_rc;
    pthread_mutex_unlock(&w->lock);
    if (err < 0) {
        pthread_join(w->thread, NULL);
        return err;
    }
    w->thread_started = true;
    return 0;
}

int vhd_rt_new(const struct vhd_rt_opts *o, struct vhd_rt **out)
{
    struct vhd_rt *rt;
    sigset_t block, old;
    int rc;

    if (!o || !out || o->nworkers == 0 || o->nworkers > VHD_RT_MAX_WORKERS || o->budget == 0 ||
        o->uring_entries == 0 || o->uring_entries > 32768)
        return -EINVAL;
    if (o->poll_mode != VHD_POLL_ADAPTIVE && o->poll_mode != VHD_POLL_ALWAYS &&
        o->poll_mode != VHD_POLL_NEVER)
        return -EINVAL;
    /* The eventfd guard's handler, before any sandbox forbids installing it (efd.h). */
    rc = vhd_efd_init();
    if (rc < 0)
        return rc;

    rt = calloc(1, sizeof(*rt));
    if (!rt)
        return -ENOMEM;
    rt->opts = *o;
    rt->opts.cpus = NULL; /* o's array is the caller's: worker_init copies each entry */
    /* An adaptive window of 0 us is event mode: skip the disable/enable round trip. */
    if (rt->opts.poll_mode == VHD_POLL_ADAPTIVE && rt->opts.poll_us == 0)
        rt->opts.poll_mode = VHD_POLL_NEVER;
    rt->event_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (rt->event_fd < 0) {
        rc = -errno;
        free(rt);
        return rc;
    }
    rt->workers = aligned_alloc(RT_WORKER_ALIGN, o->nworkers * sizeof(*rt->workers));
    if (!rt->workers) {
        close(rt->event_fd);
        free(rt);
        return -ENOMEM;
    }
    memset(rt->workers, 0, o->nworkers * sizeof(*rt->workers));
    for (unsigned i = 0; i < o->nworkers; i++) {
        rt->workers[i].cpu = o->cpus ? o->cpus[i] : -1;
        rc = worker_init(rt, &rt->workers[i], i);
        rt->nworkers = i + 1; /* vhd_rt_free cleans up to here */
        if (rc < 0)
            goto fail;
    }

    /*
     * Workers never take the process's signals: the daemon handles them on
     * the control thread. The mask is inherited from the creating thread.
     */
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigaddset(&block, SIGQUIT);
    sigaddset(&block, SIGUSR1);
    sigaddset(&block, SIGUSR2);
    sigaddset(&block, SIGCHLD);
    sigaddset(&block, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    rc = 0;
    for (unsigned i = 0; i < rt->nworkers; i++) {
        struct vhd_worker *w = &rt->workers[i];
        rc = worker_spawn(w);
        if (rc < 0)
            break;
        char name[16];
        snprintf(name, sizeof(name), "vhd-worker%u", (unsigned)(uint8_t)i); /* i < 64 */
        pthread_setname_np(w->thread, name);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc < 0)
        goto fail;
    *out = rt;
    return 0;

fail:
    vhd_rt_free(rt);
    return rc;
}

void vhd_rt_free(struct vhd_rt *rt)
{
    if (!rt)
        return;
    for (unsigned i = 0; i < rt->nworkers; i++) {
        struct vhd_worker *w = &rt->workers[i];
        if (w->thread_started) {
            struct rt_req req = {.type = RT_REQ_STOP};
            rt_post_wait(w, &req, -1);
            pthread_join(w->thread, NULL);
            w->thread_started = false;
        }
        worker_fini(w);
    }
    free(rt->workers);
    close(rt->event_fd);
    free(rt);
}

unsigned vhd_rt_nworkers(const struct vhd_rt *rt)
{
    return rt->nworkers;
}

int vhd_rt_worker_stats(const struct vhd_rt *rt, unsigned worker, struct vhd_rt_worker_stats *out)
{
    if (!rt || worker >= rt->nworkers)
        return -EINVAL;
    const struct vhd_rt_worker_stats *st = &rt->workers[worker].st;
    out->sleeps = vhd_load_relaxed(&st->sleeps);
    out->sleep_ns = vhd_load_relaxed(&st->sleep_ns);
    out->poll_ns = vhd_load_relaxed(&st->poll_ns);
    out->event_ns = vhd_load_relaxed(&st->event_ns);
    out->wake_cost_ns = vhd_load_relaxed(&st->wake_cost_ns);
    return 0;
}

uint64_t vhd_rt_poll_window_ns(const struct vhd_rt *rt, unsigned worker)
{
    if (!rt || worker >= rt->nworkers)
        return 0;
    return vhd_load_relaxed(&rt->workers[worker].window_pub);
}

int vhd_rt_worker_cpu(const struct vhd_rt *rt, unsigned worker)
{
    if (!rt || worker >= rt->nworkers)
        return -1;
    return rt->workers[worker].cpu;
}

int vhd_rt_worker_node(const struct vhd_rt *rt, unsigned worker)
{
    if (!rt || worker >= rt->nworkers)
        return -1;
    return rt->workers[worker].node;
}

int vhd_rt_event_fd(const struct vhd_rt *rt)
{
    return rt->event_fd;
}

/*
 * What attach and drain check before they hand q (detached, owned by the
 * control thread) to a worker: 0, or -EINVAL / -EBUSY / -errno.
 */
static int rt_handover_check(const struct vhd_rt *rt, struct vhd_queue *q, unsigned worker)
{
    if (!rt || !q || !q->dev || !q->dev->ops || !q->dev->ops->queue_process)
        return -EINVAL;
    if (worker >= rt->nworkers)
        return -EINVAL;
    if (q->attached)
        return -EBUSY;
    if (q->kick_fd >= 0) {
        /*
         * The worker reads the kick eventfd after epoll reports it; make the
         * read non-blocking so a spurious wake-up cannot stall the worker.
         * The flag is shared with the front-end's copy of the file, which
         * does not care: an eventfd write blocks only on counter overflow.
         */
        int fl = fcntl(q->kick_fd, F_GETFL);
        if (fl < 0 || (!(fl & O_NONBLOCK) && fcntl(q->kick_fd, F_SETFL, fl | O_NONBLOCK) < 0))
            return -errno;
    }
    return 0;
}

int vhd_rt_attach(struct vhd_rt *rt, struct vhd_queue *q, unsigned worker)
{
    int rc = rt_handover_check(rt, q, worker);
    if (rc < 0)
        return rc;

    struct rt_req req = {.type = RT_REQ_ATTACH, .q = q};
    rc = rt_post_wait(&rt->workers[worker], &req, RT_ATTACH_TIMEOUT_MS);
    if (rc == 0) {
        q->attached = true;
        q->worker_idx = (int)worker;
    } else {
        vhd_log(VHD_LOG_ERROR, "%s: queue %u: attach to worker %u failed: %s", q->dev->name,
                q->index, worker, strerror(-rc));
    }
    return rc;
}

int vhd_rt_drain(struct vhd_rt *rt, struct vhd_queue *q, unsigned worker, int timeout_ms)
{
    int rc = timeout_ms < 0 ? -EINVAL : rt_handover_check(rt, q, worker);
    if (rc < 0)
        return rc;

    struct rt_req req = {.type = RT_REQ_DRAIN, .q = q};
    rc = rt_post_wait(&rt->workers[worker], &req, timeout_ms);
    if (rc == -ETIMEDOUT && req.taken) {
        /* Taken, not finished: parked on the worker like a timed-out detach. */
        q->attached = true;
        q->worker_idx = (int)worker;
        vhd_log(VHD_LOG_WARN,
                "%s: queue %u: did not drain within %d ms; queue stays with worker %u",
                q->dev->name, q->index, timeout_ms, worker);
    } else if (rc < 0) {
        vhd_log(VHD_LOG_ERROR, "%s: queue %u: drain on worker %u failed: %s", q->dev->name,
                q->index, worker, strerror(-rc));
    }
    return rc;
}

int vhd_rt_detach(struct vhd_rt *rt, struct vhd_queue *q, int timeout_ms)
{
    if (!rt || !q || timeout_ms < 0)
        return -EINVAL;
    if (!q->attached)
        return 0; /* the control thread already owns it */
    if (q->worker_idx < 0 || (unsigned)q->worker_idx >= rt->nworkers)
        return -EINVAL;

    struct rt_req req = {.type = RT_REQ_DETACH, .q = q};
    int rc = rt_post_wait(&rt->workers[q->worker_idx], &req, timeout_ms);
    if (rc == 0) {
        q->attached = false;
    } else if (rc == -ETIMEDOUT) {
        vhd_log(VHD_LOG_WARN,
                "%s: queue %u: in-flight requests did not complete within %d ms; "
                "queue stays with worker %d",
                q->dev->name, q->index, timeout_ms, q->worker_idx);
    } else {
        vhd_log(VHD_LOG_ERROR, "%s: queue %u: detach failed: %s", q->dev->name, q->index,
                strerror(-rc));
    }
    return rc;
}
