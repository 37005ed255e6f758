/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Runtime tests (src/runtime): real worker threads running real virtqueues
 * over memfd guest memory, driven by the mock driver (src/driver) through
 * real kick and call eventfds, with a fake device type that completes
 * requests inline or through the worker's io_uring. Also the log module.
 */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "core/vq.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "harness.h"
#include "runtime/efd.h"
#include "runtime/log.h"
#include "runtime/rt.h"

#define QSIZE      256
#define REQ_MAGIC  0x56484452554e5449ull /* "VHDRUNTI" */
#define WAIT_MS    5000                  /* a completion or state change must come within this */
#define DETACH_MS  5000                  /* detach bound when completion is expected */
#define MAX_QUEUES 8

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ======================= fake device ======================= */

/* How the fake device completes a request. */
enum fake_mode {
    FAKE_INLINE,  /* push inside queue_process */
    FAKE_NOP,     /* IORING_OP_NOP on the worker's ring, push in the CQE callback */
    FAKE_READ,    /* read 8 bytes of /dev/zero through the ring, then push */
    FAKE_TIMEOUT, /* an io_uring timeout of 60 ms, then push (slow backend) */
    FAKE_PIPE,    /* read 1 byte from a pipe the test writes to (stuck backend) */
};

/* Request header in guest memory (device-readable) and response (device-writable). */
struct req_hdr {
    uint64_t seq;
    uint64_t magic;
};
struct req_resp {
    uint64_t echo; /* seq ^ REQ_MAGIC */
    uint8_t status;
};
#define RESP_LEN 9

struct fake_req {
    struct vhd_io_cb cb;
    struct fake_queue *fq;
    struct vhd_vq_chain c;
    uint8_t *wbuf;    /* response buffer (guest memory) */
    uint64_t echo;    /* what to write there */
    uint8_t status;   /* 0 ok */
    bool busy;        /* popped, not yet pushed */
    uint64_t scratch; /* FAKE_READ target */
    struct __kernel_timespec ts;
};

/* A queue of the fake device: the generic queue first, then our state. */
struct fake_queue {
    struct vhd_queue q;
    enum fake_mode mode;
    int src_fd;      /* /dev/zero (FAKE_READ) or the pipe's read end (FAKE_PIPE) */
    long fail_after; /* queue_process fails once this many chains were taken; -1 never */
    /* ---- written by the owning worker; read by the test after detach or atomically ---- */
    uint64_t taken;         /* chains popped */
    uint64_t completed;     /* chains pushed */
    uint64_t popped_atomic; /* = taken, for the test to watch while attached */
    pthread_t threads[4];   /* distinct worker threads that processed the queue */
    unsigned nthreads;
    unsigned max_budget_seen;
    struct fake_req reqs[QSIZE];
} vhd_cacheline_aligned;

/*
 * The order in which the worker served queues: one entry per queue_process
 * call that took chains. Off (v NULL) except in budget_fairness_one_worker,
 * whose single worker is its only writer; the test reads it after detach.
 */
struct service {
    const struct fake_queue *fq;
    unsigned n; /* chains taken by the call */
};
static struct {
    struct service *v;
    unsigned n, cap;
} service_log;
/*
 * A gate in front of the worker: when the worker enters queue_process of
 * gate.fq it sets gate.entered and blocks reading gate.fd (a pipe) until the
 * test writes a byte. Meanwhile the test queues work on other queues, which
 * the worker then finds all at once. Off (fq NULL) except in
 * budget_fairness_one_worker.
 */
static struct {
    const struct fake_queue *fq;
    int fd;
    int entered;
} gate = {.fd = -1};
/*
 * A stall inside a batch: when the worker has completed stall.after chains
 * of stall.fq (FAKE_INLINE) within one queue_process call, it sets
 * stall.entered and blocks reading stall.fd until the test writes a byte:
 * a backend that completes slowly, caught mid-batch. Off (fq NULL) except
 * in publish_before_batch_ends.
 */
static struct {
    const struct fake_queue *fq;
    unsigned after;
    int fd;
    int entered;
} stall = {.fd = -1};

static struct fake_queue *fq_of(struct vhd_queue *q)
{
    return vhd_container_of(q, struct fake_queue, q);
}

static void fake_complete(struct fake_req *r, int res)
{
    struct fake_queue *fq = r->fq;
    struct vhd_queue *q = &fq->q;

    VHD_CHECK(r->busy);
    if (res < 0 && res != -ETIME) /* a timeout op "fails" with -ETIME: that is its success */
        r->status = 1;
    memcpy(r->wbuf, &r->echo, 8);
    r->wbuf[8] = r->status;
    r->busy = false;
    VHD_CHECK_EQ(vhd_vq_push(&q->vq, &r->c, RESP_LEN), 0);
    q->inflight_io--;
    q->stat_requests++;
    fq->completed++;
    vhd_queue_mark_used(q);
}

static void fake_io_done(struct vhd_io_cb *cb, int res)
{
    fake_complete(vhd_container_of(cb, struct fake_req, cb), res);
}

static void fake_note_thread(struct fake_queue *fq)
{
    pthread_t self = pthread_self();
    for (unsigned i = 0; i < fq->nthreads; i++)
        if (pthread_equal(fq->threads[i], self))
            return;
    if (fq->nthreads < VHD_ARRAY_SIZE(fq->threads))
        fq->threads[fq->nthreads++] = self;
}

static int fake_queue_process(struct vhd_queue *q, unsigned budget)
{
    struct fake_queue *fq = fq_of(q);
    unsigned n;

    VHD_CHECK(q->worker != NULL);
    if (fq == gate.fq) {
        char c;
        __atomic_store_n(&gate.entered, 1, __ATOMIC_RELEASE);
        ssize_t got;
        while ((got = read(gate.fd, &c, 1)) < 0 && errno == EINTR) /* the efd guard's signal */
            ;
        VHD_CHECK_EQ(got, 1);
        gate.fq = NULL;
    }
    fake_note_thread(fq);
    if (budget > fq->max_budget_seen)
        fq->max_budget_seen = budget;
    for (n = 0; n < budget; n++) {
        struct iovec iov[8];
        struct vhd_vq_chain c;

        if (fq->fail_after >= 0 && fq->taken >= (uint64_t)fq->fail_after)
            return -EIO;
        int rc = vhd_vq_pop(&q->vq, iov, VHD_ARRAY_SIZE(iov), &c);
        if (rc < 0)
            return rc;
        if (rc == 0)
            break;
        fq->taken++;
        __atomic_store_n(&fq->popped_atomic, fq->taken, __ATOMIC_RELEASE);
        q->inflight_io++;

        VHD_CHECK(c.id < QSIZE);
        struct fake_req *r = &fq->reqs[c.id];
        VHD_CHECK(!r->busy);
        r->busy = true;
        r->fq = fq;
        r->c = c;
        r->cb.done = fake_io_done;
        r->status = 0;
        /* One readable header, one writable response: anything else is a test bug. */
        VHD_CHECK_EQ(c.nr, 1);
        VHD_CHECK_EQ(c.nw, 1);
        VHD_CHECK(iov[0].iov_len >= sizeof(struct req_hdr) && iov[1].iov_len >= RESP_LEN);
        struct req_hdr h;
        memcpy(&h, iov[0].iov_base, sizeof(h));
        if (h.magic != REQ_MAGIC)
            r->status = 2;
        r->echo = h.seq ^ REQ_MAGIC;
        r->wbuf = iov[1].iov_base;

        struct io_uring_sqe *sqe = NULL;
        if (fq->mode != FAKE_INLINE) {
            sqe = vhd_worker_get_sqe(q->worker);
            VHD_CHECK(sqe != NULL);
        }
        switch (fq->mode) {
        case FAKE_INLINE:
            fake_complete(r, 0);
            if (fq == stall.fq && n + 1 == stall.after) {
                char ch;
                __atomic_store_n(&stall.entered, 1, __ATOMIC_RELEASE);
                /* EINTR: the eventfd guard's timer signal (efd.c) may land on this worker. */
                ssize_t got;
                while ((got = read(stall.fd, &ch, 1)) < 0 && errno == EINTR)
                    ;
                VHD_CHECK_EQ(got, 1);
                stall.fq = NULL;
            }
            continue;
        case FAKE_NOP:
            io_uring_prep_nop(sqe);
            break;
        case FAKE_READ:
            io_uring_prep_read(sqe, fq->src_fd, &r->scratch, sizeof(r->scratch), 0);
            break;
        case FAKE_TIMEOUT:
            r->ts.tv_sec = 0;
            r->ts.tv_nsec = 60 * 1000000;
            io_uring_prep_timeout(sqe, &r->ts, 0, 0);
            break;
        case FAKE_PIPE:
            io_uring_prep_read(sqe, fq->src_fd, &r->scratch, 1, (uint64_t)-1);
            break;
        }
        io_uring_sqe_set_data(sqe, &r->cb);
    }
    if (service_log.v && n > 0 && service_log.n < service_log.cap)
        service_log.v[service_log.n++] = (struct service){fq, n};
    return (int)n;
}

static const struct vhd_dev_ops fake_ops = {
    .type = "fake",
    .queue_process = fake_queue_process,
};

/* Process a detached queue from the control thread (which owns it then). */
static int fake_queue_process_detached(struct vhd_queue *q)
{
    VHD_CHECK(q->worker == NULL);
    struct fake_queue *fq = fq_of(q);
    struct iovec iov[8];
    struct vhd_vq_chain c;
    int n = 0;

    while (vhd_vq_pop(&q->vq, iov, VHD_ARRAY_SIZE(iov), &c) == 1) {
        struct fake_req *r = &fq->reqs[c.id];
        struct req_hdr h;
        memcpy(&h, iov[0].iov_base, sizeof(h));
        r->busy = true;
        r->fq = fq;
        r->c = c;
        r->status = 0;
        r->echo = h.seq ^ REQ_MAGIC;
        r->wbuf = iov[1].iov_base;
        q->inflight_io++;
        fake_complete(r, 0);
        n++;
    }
    return n;
}

/* ======================= test environment ======================= */

/* One queue seen from both sides: the device's fake_queue and our driver ring. */
struct tq {
    struct fake_queue *fq;
    struct vhd_drv_vq dq;
    bool packed, event_idx, indirect;
    int kick_fd, call_fd;
    uint64_t hdr_gpa, resp_gpa; /* per-slot request buffers */
    uint8_t *hdr, *resp;
    uint16_t free_slots[QSIZE];
    unsigned nfree;
    /* driver statistics */
    uint64_t next_seq, submitted, completed, inflight;
    uint64_t kicks, waits;
    uint8_t *seen; /* per sequence number: completions seen */
    uint64_t max_seq;
    uint8_t expect_status; /* every response's status byte (0: success) */
};

struct env {
    struct vhd_guestmem gm;
    struct vhd_mem *mem;
    struct vhd_dev dev[MAX_QUEUES];
    struct tq tq[MAX_QUEUES];
    unsigned ntq;
    struct vhd_rt *rt;
};

struct qopts {
    bool packed;
    bool event_idx;
    bool indirect;
    bool kickless;
    enum fake_mode mode;
    long fail_after; /* 0 means never here (tests set > 0) */
};

static void env_init(struct env *e, const struct vhd_rt_opts *ro)
{
    struct vhd_mem_region_desc d[1];

    memset(e, 0, sizeof(*e));
    VHD_CHECK_EQ(vhd_guestmem_init(&e->gm, 1, 32ull << 20, 0x100000, 0), 0);
    vhd_guestmem_descs(&e->gm, d);
    VHD_CHECK_EQ(vhd_mem_new(d, 1, &e->mem), 0);
    VHD_CHECK_EQ(vhd_rt_new(ro, &e->rt), 0);
}

/* Queue i of its own device "devI", set up on both sides; not attached. */
static struct tq *env_add_queue(struct env *e, const struct qopts *o, uint64_t max_seq)
{
    unsigned i = e->ntq++;
    struct tq *t = &e->tq[i];
    struct vhd_dev *dev = &e->dev[i];

    VHD_CHECK(i < MAX_QUEUES);
    memset(t, 0, sizeof(*t));
    t->packed = o->packed;
    t->event_idx = o->event_idx;
    t->indirect = o->indirect;

    dev->ops = &fake_ops;
    snprintf(dev->name, sizeof(dev->name), "dev%u", i);
    dev->num_queues = 1;

    /* driver ring */
    uint32_t max_ind = o->indirect ? 4 : 0;
    size_t area_len = vhd_drv_vq_area_size(QSIZE, o->packed, max_ind);
    void *area;
    uint64_t area_gpa = vhd_guestmem_alloc(&e->gm, area_len, 4096, &area);
    VHD_CHECK(area_gpa != UINT64_MAX);
    struct vhd_drv_vq_params dp = {.size = QSIZE,
                                   .packed = o->packed,
                                   .event_idx = o->event_idx,
                                   .max_indirect = max_ind,
                                   .area = area,
                                   .area_gpa = area_gpa,
                                   .area_len = area_len};
    VHD_CHECK_EQ(vhd_drv_vq_init(&t->dq, &dp), 0);
    void *p;
    t->hdr_gpa = vhd_guestmem_alloc(&e->gm, 16ull * QSIZE, 64, &p);
    VHD_CHECK(t->hdr_gpa != UINT64_MAX);
    t->hdr = p;
    t->resp_gpa = vhd_guestmem_alloc(&e->gm, 16ull * QSIZE, 64, &p);
    VHD_CHECK(t->resp_gpa != UINT64_MAX);
    t->resp = p;
    for (unsigned s = 0; s < QSIZE; s++)
        t->free_slots[s] = (uint16_t)(QSIZE - 1 - s);
    t->nfree = QSIZE;
    t->max_seq = max_seq;
    t->seen = calloc(max_seq, 1);
    VHD_CHECK(t->seen != NULL);

    /* device queue */
    struct fake_queue *fq = aligned_alloc(VHD_CACHELINE, sizeof(*fq));
    VHD_CHECK(fq != NULL);
    memset(fq, 0, sizeof(*fq));
    t->fq = fq;
    fq->mode = o->mode;
    fq->fail_after = o->fail_after > 0 ? o->fail_after : -1;
    fq->src_fd = -1;
    if (o->mode == FAKE_READ) {
        fq->src_fd = open("/dev/zero", O_RDONLY | O_CLOEXEC);
        VHD_CHECK(fq->src_fd >= 0);
    }
    struct vhd_queue *q = &fq->q;
    struct vhd_vq_params vp = {.size = QSIZE,
                               .packed = o->packed,
                               .event_idx = o->event_idx,
                               .indirect = o->indirect,
                               .addr_is_gpa = true,
                               .desc = t->dq.desc_gpa,
                               .avail = t->dq.avail_gpa,
                               .used = t->dq.used_gpa};
    VHD_CHECK_EQ(vhd_vq_init(&q->vq, &vp, e->mem), 0);
    VHD_CHECK_EQ(vhd_vq_start(&q->vq), 0);
    q->dev = dev;
    q->index = 0;
    q->size = QSIZE;
    q->worker_idx = -1;
    q->err_fd = -1;
    t->kick_fd = o->kickless ? -1 : eventfd(0, EFD_CLOEXEC);
    VHD_CHECK(o->kickless || t->kick_fd >= 0);
    t->call_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    VHD_CHECK(t->call_fd >= 0);
    q->kick_fd = t->kick_fd;
    q->call_fd = t->call_fd;
    dev->queues = q;
    return t;
}

/* Use a pipe as the stuck backend of t; returns the write end. */
static int tq_use_pipe(struct tq *t)
{
    int p[2];
    VHD_CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    t->fq->src_fd = p[0];
    return p[1];
}

static void env_fini(struct env *e)
{
    vhd_rt_free(e->rt);
    for (unsigned i = 0; i < e->ntq; i++) {
        struct tq *t = &e->tq[i];
        VHD_CHECK(!t->fq->q.attached);
        if (t->kick_fd >= 0)
            close(t->kick_fd);
        close(t->call_fd);
        if (t->fq->src_fd >= 0)
            close(t->fq->src_fd);
        vhd_drv_vq_fini(&t->dq);
        free(t->seen);
        free(t->fq);
    }
    vhd_mem_free(e->mem);
    vhd_guestmem_fini(&e->gm);
}

/* ---- the driver ---- */

/* Queue up to n new requests (bounded by the window); publish and kick if asked. */
static unsigned drv_submit(struct tq *t, uint64_t n, unsigned window)
{
    unsigned added = 0;

    while (n > 0 && t->inflight < window && t->nfree > 0 && t->next_seq < t->max_seq) {
        uint16_t slot = t->free_slots[t->nfree - 1];
        struct req_hdr h = {.seq = t->next_seq, .magic = REQ_MAGIC};
        memcpy(t->hdr + 16u * slot, &h, sizeof(h));
        memset(t->resp + 16u * slot, 0xff, 16);
        struct vhd_drv_buf bufs[2] = {{t->hdr_gpa + 16u * slot, sizeof(h)},
                                      {t->resp_gpa + 16u * slot, RESP_LEN}};
        int rc = vhd_drv_vq_add(&t->dq, bufs, 1, 1, t->indirect, (void *)(uintptr_t)(slot + 1));
        if (rc == -ENOSPC)
            break;
        VHD_CHECK_EQ(rc, 0);
        t->nfree--;
        t->next_seq++;
        t->submitted++;
        t->inflight++;
        added++;
        n--;
    }
    if (added) {
        vhd_drv_vq_publish(&t->dq);
        if (vhd_drv_vq_kick_needed(&t->dq) && t->kick_fd >= 0) {
            VHD_CHECK_EQ(eventfd_write(t->kick_fd, 1), 0);
            t->kicks++;
        }
    }
    return added;
}

/* Collect every used element, checking each response. Returns how many. */
static unsigned drv_collect(struct tq *t)
{
    unsigned got = 0;
    void *cookie;
    uint32_t len;
    int rc;

    while ((rc = vhd_drv_vq_get_used(&t->dq, &cookie, &len)) == 1) {
        uint16_t slot = (uint16_t)((uintptr_t)cookie - 1);
        struct req_hdr h;
        struct req_resp r;
        VHD_CHECK(slot < QSIZE);
        memcpy(&h, t->hdr + 16u * slot, sizeof(h));
        memcpy(&r.echo, t->resp + 16u * slot, 8);
        r.status = t->resp[16u * slot + 8];
        VHD_CHECK_EQ(len, RESP_LEN);
        VHD_CHECK_EQ(r.status, t->expect_status);
        VHD_CHECK(r.echo == (h.seq ^ REQ_MAGIC));
        VHD_CHECK(h.seq < t->max_seq);
        VHD_CHECK_EQ(t->seen[h.seq], 0);
        t->seen[h.seq] = 1;
        t->free_slots[t->nfree++] = slot;
        t->completed++;
        t->inflight--;
        got++;
    }
    VHD_CHECK_EQ(rc, 0);
    return got;
}

/* Wait for the call eventfd (with callbacks enabled, the classic re-check first). */
static bool drv_wait_call(struct tq *t, int timeout_ms)
{
    if (vhd_drv_vq_enable_cb(&t->dq))
        return true; /* used elements slipped in: no need to sleep */
    struct pollfd pfd = {.fd = t->call_fd, .events = POLLIN};
    int n = poll(&pfd, 1, timeout_ms);
    VHD_CHECK(n >= 0);
    if (n == 0)
        return false;
    eventfd_t v;
    VHD_CHECK_EQ(eventfd_read(t->call_fd, &v), 0);
    t->waits++;
    vhd_drv_vq_disable_cb(&t->dq);
    return true;
}

/* Run n requests through t with at most `window` in flight; every one must complete. */
static void drv_run(struct tq *t, uint64_t n, unsigned window)
{
    uint64_t target = t->completed + n;
    uint64_t to_submit = n;

    vhd_drv_vq_disable_cb(&t->dq);
    while (t->completed < target) {
        unsigned added = drv_submit(t, to_submit, window);
        to_submit -= added;
        unsigned got = drv_collect(t);
        if (added || got)
            continue;
        if (!drv_wait_call(t, WAIT_MS)) {
            fprintf(stderr, "  driver: no completion within %d ms (%llu of %llu done)\n", WAIT_MS,
                    (unsigned long long)t->completed, (unsigned long long)target);
            VHD_CHECK(0);
        }
    }
}

/* Wait until every request the driver submitted has completed (call-driven). */
static void drv_drain(struct tq *t)
{
    while (t->inflight > 0) {
        if (drv_collect(t))
            continue;
        VHD_CHECK(drv_wait_call(t, WAIT_MS));
    }
}

struct drv_thread_arg {
    struct tq *t;
    uint64_t n;
    unsigned window;
};

static void *drv_thread(void *arg)
{
    struct drv_thread_arg *a = arg;
    drv_run(a->t, a->n, a->window);
    return NULL;
}

/* Wait (bounded) until the device has popped at least n chains of t. */
static void wait_popped(struct tq *t, uint64_t n)
{
    uint64_t t0 = mono_ms();
    while (__atomic_load_n(&t->fq->popped_atomic, __ATOMIC_ACQUIRE) < n) {
        VHD_CHECK(mono_ms() - t0 < WAIT_MS);
        usleep(200);
    }
}

static void check_all_seen(const struct tq *t, uint64_t n)
{
    for (uint64_t s = 0; s < n; s++)
        if (t->seen[s] != 1) {
            fprintf(stderr, "  request %llu completed %u times\n", (unsigned long long)s,
                    t->seen[s]);
            VHD_CHECK(0);
        }
}

static void rt_opts(struct vhd_rt_opts *o, unsigned nworkers, enum vhd_poll_mode mode)
{
    vhd_rt_opts_default(o);
    o->nworkers = nworkers;
    o->poll_mode = mode;
}

/* ======================= tests ======================= */

VHD_TEST(opts_and_lifecycle)
{
    struct vhd_rt_opts o;
    struct vhd_rt *rt = NULL;

    vhd_rt_opts_default(&o);
    VHD_CHECK_EQ(o.nworkers, 1);
    VHD_CHECK_EQ(o.poll_mode, VHD_POLL_ADAPTIVE);
    VHD_CHECK_EQ(o.poll_us, 50);
    VHD_CHECK_EQ(o.spin_us, VHD_RT_SPIN_AUTO);
    VHD_CHECK_EQ(o.uring_entries, 256);
    VHD_CHECK_EQ(o.budget, 64);

    o.nworkers = 0;
    VHD_CHECK_EQ(vhd_rt_new(&o, &rt), -EINVAL);
    o.nworkers = VHD_RT_MAX_WORKERS + 1;
    VHD_CHECK_EQ(vhd_rt_new(&o, &rt), -EINVAL);
    o.nworkers = 2;
    o.budget = 0;
    VHD_CHECK_EQ(vhd_rt_new(&o, &rt), -EINVAL);
    o.budget = 64;
    o.poll_mode = (enum vhd_poll_mode)42;
    VHD_CHECK_EQ(vhd_rt_new(&o, &rt), -EINVAL);
    o.poll_mode = VHD_POLL_NEVER;
    VHD_CHECK_EQ(vhd_rt_new(&o, &rt), 0);
    VHD_CHECK_EQ(vhd_rt_nworkers(rt), 2);
    VHD_CHECK(vhd_rt_event_fd(rt) >= 0);
    vhd_rt_free(rt);
    vhd_rt_free(NULL);

    /* Many workers start and stop cleanly. */
    o.nworkers = 16;
    VHD_CHECK_EQ(vhd_rt_new(&o, &rt), 0);
    vhd_rt_free(rt);
}

VHD_TEST(attach_errors)
{
    struct vhd_rt_opts ro;
    struct env e;

    rt_opts(&ro, 2, VHD_POLL_ADAPTIVE);
    env_init(&e, &ro);
    struct qopts qo = {.mode = FAKE_INLINE};
    struct tq *t = env_add_queue(&e, &qo, 16);
    struct vhd_queue *q = &t->fq->q;

    VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, 2), -EINVAL); /* no such worker */
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, 100), 0);     /* not attached: nothing to do */
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, 1), 0);
    VHD_CHECK(q->attached);
    VHD_CHECK_EQ(q->worker_idx, 1);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, 0), -EBUSY);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, -1), -EINVAL);
    /* The kick fd was made non-blocking for the worker's reads. */
    VHD_CHECK(fcntl(t->kick_fd, F_GETFL) & O_NONBLOCK);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, DETACH_MS), 0);
    VHD_CHECK(!q->attached);
    VHD_CHECK(q->worker == NULL);
    env_fini(&e);
}

/* Basic: requests kicked by the driver complete and the call fd fires. */
static void basic_run(bool packed, bool event_idx, bool indirect, enum fake_mode mode)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 3000;

    rt_opts(&ro, 1, VHD_POLL_ADAPTIVE);
    env_init(&e, &ro);
    struct qopts qo = {
        .packed = packed, .event_idx = event_idx, .indirect = indirect, .mode = mode};
    struct tq *t = env_add_queue(&e, &qo, n);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t->fq->q, 0), 0);
    drv_run(t, n, 64);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t->fq->q, DETACH_MS), 0);
    check_all_seen(t, n);
    struct vhd_queue *q = &t->fq->q;
    VHD_CHECK_EQ(q->stat_requests, n);
    VHD_CHECK_EQ(q->inflight_io, 0);
    VHD_CHECK(!q->broken);
    VHD_CHECK(t->kicks >= 1);
    VHD_CHECK(q->stat_kicks >= 1);
    VHD_CHECK(q->stat_notifies >= 1);
    VHD_CHECK(t->fq->max_budget_seen <= ro.budget);
    env_fini(&e);
}

VHD_TEST(complete_split_inline)
{
    basic_run(false, true, false, FAKE_INLINE);
}

VHD_TEST(complete_split_nop_noevidx)
{
    basic_run(false, false, false, FAKE_NOP);
}

VHD_TEST(complete_split_read_indirect)
{
    basic_run(false, true, true, FAKE_READ);
}

VHD_TEST(complete_packed_inline)
{
    basic_run(true, true, false, FAKE_INLINE);
}

VHD_TEST(complete_packed_nop)
{
    basic_run(true, true, true, FAKE_NOP);
}

VHD_TEST(complete_packed_read_noevidx)
{
    basic_run(true, false, false, FAKE_READ);
}

/*
 * uring_ops: a worker ring restricted to NOP serves NOP requests, and the
 * kernel refuses a READ on it (the fake device then answers status 1).
 */
static void restricted_run(enum fake_mode mode, uint8_t expect_status)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 200;

    rt_opts(&ro, 1, VHD_POLL_ADAPTIVE);
    ro.uring_ops = 1ull << IORING_OP_NOP;
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = mode};
    struct tq *t = env_add_queue(&e, &qo, n);
    t->expect_status = expect_status;
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t->fq->q, 0), 0);
    drv_run(t, n, 16);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t->fq->q, DETACH_MS), 0);
    check_all_seen(t, n);
    env_fini(&e);
}

VHD_TEST(uring_restricted_allows_listed_op)
{
    restricted_run(FAKE_NOP, 0);
}

VHD_TEST(uring_restricted_refuses_other_ops)
{
    restricted_run(FAKE_READ, 1);
}

/*
 * EVENT_IDX: the driver asks to be told only when the last request of each
 * batch is used (used_event = last_used + batch - 1, what Linux's
 * virtqueue_enable_cb_delayed does). With budget 8 the device completes a
 * batch of 64 in at least 8 flushes (8 pops per turn, one flush per turn);
 * the runtime must signal only when need_notify says so: once per batch
 * (plus the engine's allowed spurious first one), and each notification must
 * find the whole batch done. Without EVENT_IDX and with interrupts left on,
 * the same workload is signalled at every flush: at least 8 per batch. The
 * driver counts the signals it reads (an eventfd adds them up): with EVENT_IDX
 * the first batch gets exactly two, the first flush after the ring started
 * (need_notify has no signalled index yet) and the crossing of used_event.
 */
static uint64_t event_idx_run(bool suppress)
{
    struct vhd_rt_opts ro;
    struct env e;
    const unsigned batch = 64, nbatches = 50;

    rt_opts(&ro, 1, VHD_POLL_NEVER);
    ro.budget = 8;
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = suppress, .mode = FAKE_NOP};
    struct tq *t = env_add_queue(&e, &qo, (uint64_t)batch * nbatches);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t->fq->q, 0), 0);

    uint16_t *used_event = &t->dq.ring.split.avail->ring[QSIZE];
    for (unsigned b = 0; b < nbatches; b++) {
        if (suppress) {
            vhd_store_relaxed(used_event, vhd_le16((uint16_t)(t->dq.last_used_idx + batch - 1)));
            vhd_smp_mb();
        }
        VHD_CHECK_EQ(drv_submit(t, batch, batch), batch);
        unsigned got = 0;
        uint64_t signals = 0;
        while (got < batch) {
            struct pollfd pfd = {.fd = t->call_fd, .events = POLLIN};
            VHD_CHECK_EQ(poll(&pfd, 1, WAIT_MS), 1);
            eventfd_t v;
            VHD_CHECK_EQ(eventfd_read(t->call_fd, &v), 0);
            signals += v;
            unsigned g = drv_collect(t);
            /* One notification, and it comes with the whole batch (the first may be spurious). */
            if (suppress && b > 0 && g != batch) {
                fprintf(stderr, "  batch %u: notified with %u of %u used\n", b, got + g, batch);
                VHD_CHECK(0);
            }
            got += g;
        }
        if (suppress && b == 0) {
            /*
             * The first batch is signalled twice (the first flush, then the crossing of
             * used_event). When the first call already found the whole batch, the second
             * can land after our read: wait for it, so it is not counted against batch 1.
             */
            while (signals < 2) {
                struct pollfd pfd = {.fd = t->call_fd, .events = POLLIN};
                VHD_CHECK_EQ(poll(&pfd, 1, WAIT_MS), 1);
                eventfd_t v;
                VHD_CHECK_EQ(eventfd_read(t->call_fd, &v), 0);
                signals += v;
                VHD_CHECK_EQ(drv_collect(t), 0);
            }
            VHD_CHECK_EQ(signals, 2);
        }
    }
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t->fq->q, DETACH_MS), 0);
    check_all_seen(t, (uint64_t)batch * nbatches);
    uint64_t notifies = t->fq->q.stat_notifies;
    env_fini(&e);
    return notifies;
}

VHD_TEST(event_idx_suppresses_notifies)
{
    uint64_t with = event_idx_run(true);
    uint64_t without = event_idx_run(false);

    fprintf(stderr, "  3200 requests: %llu notifies with EVENT_IDX, %llu without\n",
            (unsigned long long)with, (unsigned long long)without);
    VHD_CHECK(with <= 50 + 1);
    VHD_CHECK(without >= 50 * 8); /* one per flush: still batched, never one per request */
    VHD_CHECK(without < 3200);
}

/* Under a pipelined load the driver sleeps rarely, and the device signals about as rarely. */
VHD_TEST(event_idx_load_fewer_notifies_than_requests)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 20000;

    rt_opts(&ro, 1, VHD_POLL_ADAPTIVE);
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = FAKE_NOP};
    struct tq *t = env_add_queue(&e, &qo, n);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t->fq->q, 0), 0);
    drv_run(t, n, 128);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t->fq->q, DETACH_MS), 0);
    check_all_seen(t, n);
    uint64_t notifies = t->fq->q.stat_notifies;
    fprintf(stderr, "  %llu requests, %llu notifies, %llu driver waits, %llu kicks\n",
            (unsigned long long)n, (unsigned long long)notifies, (unsigned long long)t->waits,
            (unsigned long long)t->kicks);
    /* A notify is only sent when the driver re-armed used_event (one per wait, +1 first). */
    VHD_CHECK(notifies <= t->waits + 2);
    VHD_CHECK(notifies < n / 4);
    env_fini(&e);
}

/* Two devices, one queue each, on two workers, driven concurrently. */
VHD_TEST(two_devices_two_workers)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 5000;

    rt_opts(&ro, 2, VHD_POLL_ADAPTIVE);
    env_init(&e, &ro);
    struct qopts qa = {.event_idx = true, .mode = FAKE_NOP};
    struct qopts qb = {.packed = true, .event_idx = true, .mode = FAKE_INLINE};
    struct tq *a = env_add_queue(&e, &qa, n);
    struct tq *b = env_add_queue(&e, &qb, n);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &a->fq->q, 0), 0);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &b->fq->q, 1), 0);
    VHD_CHECK(a->fq->q.worker != b->fq->q.worker);

    pthread_t ta, tb;
    struct drv_thread_arg aa = {a, n, 32}, ab = {b, n, 32};
    VHD_CHECK_EQ(pthread_create(&ta, NULL, drv_thread, &aa), 0);
    VHD_CHECK_EQ(pthread_create(&tb, NULL, drv_thread, &ab), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);

    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &a->fq->q, DETACH_MS), 0);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &b->fq->q, DETACH_MS), 0);
    check_all_seen(a, n);
    check_all_seen(b, n);
    VHD_CHECK_EQ(a->fq->nthreads, 1);
    VHD_CHECK_EQ(b->fq->nthreads, 1);
    VHD_CHECK(!pthread_equal(a->fq->threads[0], b->fq->threads[0]));
    env_fini(&e);
}

/*
 * The most services any other queue got while t[a] waited: before its first
 * service or between two consecutive ones, up to its last (after it, t[a]
 * had nothing left to wait for). Every queue must have had work from the
 * log's start.
 */
static unsigned served_between(const struct service *log, unsigned n, struct tq *const *t, int nq,
                               int a)
{
    unsigned last = 0, worst = 0, between[MAX_QUEUES] = {0};

    for (unsigned k = 0; k < n; k++)
        if (log[k].fq == t[a]->fq)
            last = k;
    for (unsigned k = 0; k < last; k++) {
        if (log[k].fq == t[a]->fq) {
            memset(between, 0, sizeof(between));
            continue;
        }
        for (int b = 0; b < nq; b++)
            if (log[k].fq == t[b]->fq && ++between[b] > worst)
                worst = between[b];
    }
    return worst;
}

/*
 * Four queues on one worker, one of them flooded (a full ring, four times what
 * each other queue holds), all their requests queued while the worker is held
 * in a gate, so it finds them all at once: the worker must take at most a
 * budget per queue per turn and go round the queues, so they progress
 * interleaved. Measured on the order of the worker's queue_process calls: no
 * call takes more than the budget, and while a queue waits (before its first
 * service and between two), no other queue is served more than twice (once
 * per turn; the turn's first queue rotates). A worker that stayed on a queue
 * while it had work would serve the flooded one 16 times in a row, and each
 * other one 4 times.
 */
VHD_TEST(budget_fairness_one_worker)
{
    struct vhd_rt_opts ro;
    struct env e;
    const unsigned budget = 8;
    static struct service log[1024];

    rt_opts(&ro, 1, VHD_POLL_NEVER);
    ro.budget = budget;
    env_init(&e, &ro);
    struct tq *t[5]; /* t[4]: the gate */
    uint64_t n[5];
    for (int i = 0; i < 5; i++) {
        struct qopts qo = {.event_idx = true, .mode = FAKE_INLINE};
        /* two descriptors a request: QSIZE / 2 fill the ring */
        n[i] = i == 0 ? QSIZE / 2 : i < 4 ? QSIZE / 8 : 1;
        t[i] = env_add_queue(&e, &qo, n[i]);
    }
    /* Set before the attaches, which publish them to the worker. */
    int gp[2];
    VHD_CHECK_EQ(pipe(gp), 0);
    gate.fd = gp[0];
    gate.fq = t[4]->fq;
    service_log.v = log;
    service_log.cap = VHD_ARRAY_SIZE(log);
    for (int i = 0; i < 5; i++)
        VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t[i]->fq->q, 0), 0);
    /* Hold the worker in the gate, queue everything, open the gate. */
    VHD_CHECK_EQ(drv_submit(t[4], 1, QSIZE), 1);
    uint64_t t0 = mono_ms();
    while (!__atomic_load_n(&gate.entered, __ATOMIC_ACQUIRE)) {
        VHD_CHECK(mono_ms() - t0 < WAIT_MS);
        usleep(200);
    }
    for (int i = 0; i < 4; i++)
        VHD_CHECK_EQ(drv_submit(t[i], n[i], QSIZE), n[i]);
    VHD_CHECK_EQ(write(gp[1], "g", 1), 1);
    for (int i = 0; i < 5; i++)
        wait_popped(t[i], n[i]);
    for (int i = 0; i < 5; i++) {
        VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t[i]->fq->q, DETACH_MS), 0);
        drv_collect(t[i]);
        check_all_seen(t[i], n[i]);
        if (i < 4)
            VHD_CHECK(t[i]->fq->max_budget_seen == budget);
    }
    close(gp[0]);
    close(gp[1]);
    /* The detaches published the worker's log to us. */
    unsigned total = 0;
    for (unsigned k = 0; k < service_log.n; k++) {
        VHD_CHECK(log[k].n <= budget);
        total += log[k].n;
    }
    VHD_CHECK_EQ(total, n[0] + n[1] + n[2] + n[3] + n[4]);
    for (int q = 0; q < 4; q++) {
        unsigned worst = served_between(log, service_log.n, t, 5, q);
        if (worst > 2)
            fprintf(stderr, "  queue %d waited while another was served %u times\n", q, worst);
        VHD_CHECK(worst <= 2);
    }
    fprintf(stderr, "  %u services of at most %u chains, interleaved\n", service_log.n, budget);
    service_log.v = NULL;
    env_fini(&e);
}

/* Detach while I/O is in flight waits for it: inflight reaches 0, every request is pushed. */
VHD_TEST(detach_waits_for_inflight)
{
    struct vhd_rt_opts ro;
    struct env e;
    const unsigned n = 48;

    rt_opts(&ro, 1, VHD_POLL_ADAPTIVE);
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = FAKE_TIMEOUT};
    struct tq *t = env_add_queue(&e, &qo, n);
    struct vhd_queue *q = &t->fq->q;
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, 0), 0);
    VHD_CHECK_EQ(drv_submit(t, n, n), n);
    wait_popped(t, n);

    uint64_t t0 = mono_ms();
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, DETACH_MS), 0);
    uint64_t dt = mono_ms() - t0;
    fprintf(stderr, "  detach took %llu ms\n", (unsigned long long)dt);
    /* Control thread owns q now: everything the worker did is visible. */
    VHD_CHECK_EQ(q->inflight_io, 0);
    VHD_CHECK_EQ(q->stat_requests, n);
    VHD_CHECK_EQ(t->fq->completed, n);
    VHD_CHECK(q->worker == NULL);
    VHD_CHECK(!q->on_dirty_list);
    /* Every request was published (and signalled) before the detach returned. */
    VHD_CHECK_EQ(drv_collect(t), n);
    check_all_seen(t, n);
    env_fini(&e);
}

/*
 * A backend that never completes: detach reports -ETIMEDOUT within its bound
 * and the queue stays attached but stopped (nothing more is popped). Once the
 * I/O completes, a second detach succeeds; re-attached elsewhere, the
 * requests queued meanwhile are served.
 */
VHD_TEST(detach_timeout_then_retry)
{
    struct vhd_rt_opts ro;
    struct env e;

    rt_opts(&ro, 2, VHD_POLL_ADAPTIVE);
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = FAKE_PIPE};
    struct tq *t = env_add_queue(&e, &qo, 64);
    int pipe_w = tq_use_pipe(t);
    struct vhd_queue *q = &t->fq->q;
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, 0), 0);
    VHD_CHECK_EQ(drv_submit(t, 4, 64), 4);
    wait_popped(t, 4);

    uint64_t t0 = mono_ms();
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, 200), -ETIMEDOUT);
    uint64_t dt = mono_ms() - t0;
    fprintf(stderr, "  timed-out detach took %llu ms (bound 200)\n", (unsigned long long)dt);
    VHD_CHECK(dt >= 190 && dt < 1500);
    VHD_CHECK(q->attached);

    /* Parked: new requests and kicks are not taken while the detach is pending. */
    VHD_CHECK_EQ(drv_submit(t, 8, 64), 8);
    usleep(50 * 1000);
    VHD_CHECK_EQ(__atomic_load_n(&t->fq->popped_atomic, __ATOMIC_ACQUIRE), 4);

    /* A timed-out retry is fine too. */
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, 50), -ETIMEDOUT);

    /* Unstick the backend: the 4 complete and are signalled even though no detach waits. */
    VHD_CHECK_EQ(write(pipe_w, "abcd", 4), 4);
    uint64_t got = 0;
    t0 = mono_ms();
    while (got < 4) {
        VHD_CHECK(mono_ms() - t0 < WAIT_MS);
        got += drv_collect(t);
        if (got < 4)
            VHD_CHECK(drv_wait_call(t, WAIT_MS));
    }
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, DETACH_MS), 0);
    VHD_CHECK(!q->attached);
    VHD_CHECK_EQ(q->inflight_io, 0);
    VHD_CHECK_EQ(t->fq->taken, 4);

    /* Re-attach to the other worker: the 8 queued meanwhile are served. */
    VHD_CHECK_EQ(write(pipe_w, "abcdefgh", 8), 8);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, 1), 0);
    drv_drain(t);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, DETACH_MS), 0);
    check_all_seen(t, 12);
    VHD_CHECK_EQ(t->fq->nthreads, 2);
    close(pipe_w);
    env_fini(&e);
}

/* attach -> detach -> attach to another worker, repeatedly, under load: nothing lost. */
static void migrate_run(enum vhd_poll_mode mode, bool packed)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 100000;

    rt_opts(&ro, 3, mode);
    env_init(&e, &ro);
    struct qopts qo = {.packed = packed, .event_idx = true, .mode = FAKE_NOP};
    struct tq *t = env_add_queue(&e, &qo, n);
    struct vhd_queue *q = &t->fq->q;
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, 0), 0);

    pthread_t th;
    struct drv_thread_arg a = {t, n, 64};
    VHD_CHECK_EQ(pthread_create(&th, NULL, drv_thread, &a), 0);
    unsigned moves = 0;
    while (__atomic_load_n(&t->fq->popped_atomic, __ATOMIC_ACQUIRE) < n && moves < 400) {
        usleep(200);
        VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, DETACH_MS), 0);
        VHD_CHECK_EQ(q->inflight_io, 0);
        VHD_CHECK_EQ(q->vq.inflight, 0);
        if (moves % 3 == 0)
            usleep(300); /* detached for a while: kicks pile up unseen */
        VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, ++moves % 3), 0);
    }
    pthread_join(th, NULL);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, DETACH_MS), 0);
    fprintf(stderr, "  %u moves, %u worker threads used\n", moves, t->fq->nthreads);
    check_all_seen(t, n);
    VHD_CHECK_EQ(q->stat_requests, n);
    VHD_CHECK(moves >= 10);
    VHD_CHECK(t->fq->nthreads >= 2);
    env_fini(&e);
}

VHD_TEST(migrate_between_workers_split)
{
    migrate_run(VHD_POLL_ADAPTIVE, false);
}

VHD_TEST(migrate_between_workers_packed_never)
{
    migrate_run(VHD_POLL_NEVER, true);
}

/* Every poll mode completes a workload, split and packed, with and without a kick fd. */
static void mode_run(enum vhd_poll_mode mode, unsigned poll_us, bool kickless)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 4000, more = 100;

    rt_opts(&ro, 2, mode);
    ro.poll_us = poll_us;
    env_init(&e, &ro);
    struct tq *t[4];
    for (int i = 0; i < 4; i++) {
        struct qopts qo = {.packed = i & 1,
                           .event_idx = i < 2,
                           .kickless = kickless && i == 0,
                           .mode = i & 2 ? FAKE_NOP : FAKE_INLINE};
        t[i] = env_add_queue(&e, &qo, n + more);
        VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t[i]->fq->q, (unsigned)i % 2), 0);
    }
    pthread_t th[4];
    struct drv_thread_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct drv_thread_arg){t[i], n, 16u << i};
        VHD_CHECK_EQ(pthread_create(&th[i], NULL, drv_thread, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    /* Idle for a moment (adaptive: the poll window closes, workers go to sleep), then more. */
    usleep(20 * 1000);
    for (uint64_t k = 0; k < more; k++)
        for (int i = 0; i < 4; i++)
            drv_run(t[i], 1, 1);
    for (int i = 0; i < 4; i++) {
        VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t[i]->fq->q, DETACH_MS), 0);
        check_all_seen(t[i], n + more);
        VHD_CHECK_EQ(t[i]->fq->q.stat_requests, n + more);
        /* Always-poll keeps notifications off from attach on: at most the first publish kicks. */
        if (mode == VHD_POLL_ALWAYS)
            VHD_CHECK(t[i]->kicks <= 1);
    }
    env_fini(&e);
}

VHD_TEST(mode_adaptive)
{
    mode_run(VHD_POLL_ADAPTIVE, 50, false);
}

VHD_TEST(mode_adaptive_long_window)
{
    mode_run(VHD_POLL_ADAPTIVE, 1000, false);
}

VHD_TEST(mode_always)
{
    mode_run(VHD_POLL_ALWAYS, 0, false);
}

VHD_TEST(mode_never)
{
    mode_run(VHD_POLL_NEVER, 0, false);
}

VHD_TEST(mode_adaptive_kickless)
{
    mode_run(VHD_POLL_ADAPTIVE, 50, true);
}

VHD_TEST(mode_never_kickless)
{
    mode_run(VHD_POLL_NEVER, 0, true);
}

/* Sequential, latency-bound requests (window 1): the sleep/wake path of every mode. */
static void pingpong_run(enum vhd_poll_mode mode, unsigned spin_us)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 2000;

    rt_opts(&ro, 1, mode);
    ro.poll_us = 5; /* a short window: exercises the enable/re-check/sleep path often */
    ro.spin_us = spin_us;
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = FAKE_NOP};
    struct tq *t = env_add_queue(&e, &qo, n);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t->fq->q, 0), 0);
    for (uint64_t i = 0; i < n; i++) {
        drv_run(t, 1, 1);
        if (i % 200 == 0)
            usleep(100);
    }
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t->fq->q, DETACH_MS), 0);
    check_all_seen(t, n);
    if (mode == VHD_POLL_ALWAYS)
        VHD_CHECK(t->kicks <= 1);
    if (mode == VHD_POLL_NEVER && spin_us == 0)
        VHD_CHECK(t->kicks >= n / 2); /* pure event mode: (nearly) every request is kicked */
    env_fini(&e);
}

/* Process CPU time in ms. */
static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/*
 * Idle queues cost (almost) no CPU in adaptive and event mode: after the
 * poll window the workers sleep in epoll_wait. Always-poll burns its core.
 */
static double idle_cpu_run(enum vhd_poll_mode mode)
{
    struct vhd_rt_opts ro;
    struct env e;

    rt_opts(&ro, 2, mode);
    env_init(&e, &ro);
    struct tq *t[2];
    for (int i = 0; i < 2; i++) {
        struct qopts qo = {.packed = i, .event_idx = true, .mode = FAKE_NOP};
        t[i] = env_add_queue(&e, &qo, 1000);
        VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t[i]->fq->q, (unsigned)i), 0);
        drv_run(t[i], 500, 32);
    }
    usleep(10 * 1000);
    double c0 = cpu_ms();
    usleep(200 * 1000);
    double used = cpu_ms() - c0;
    /* And they wake up again on a kick. */
    for (int i = 0; i < 2; i++) {
        drv_run(t[i], 500, 32);
        VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t[i]->fq->q, DETACH_MS), 0);
        check_all_seen(t[i], 1000);
    }
    env_fini(&e);
    fprintf(stderr, "  %.1f ms CPU in 200 ms idle\n", used);
    return used;
}

VHD_TEST(idle_costs_nothing_adaptive)
{
    VHD_CHECK(idle_cpu_run(VHD_POLL_ADAPTIVE) < 5);
}

VHD_TEST(idle_costs_nothing_never)
{
    VHD_CHECK(idle_cpu_run(VHD_POLL_NEVER) < 5);
}

VHD_TEST(idle_always_polls)
{
    /*
     * Two busy-polling workers take ~400 ms on free cores; on a loaded
     * machine they get their share, which is still far above the < 1 ms
     * of a sleeping worker.
     */
    VHD_CHECK(idle_cpu_run(VHD_POLL_ALWAYS) > 10);
}

VHD_TEST(pingpong_adaptive)
{
    pingpong_run(VHD_POLL_ADAPTIVE, 0);
}

VHD_TEST(pingpong_adaptive_window)
{
    pingpong_run(VHD_POLL_ADAPTIVE, 1); /* the window moves between 1 and 5 us */
}

VHD_TEST(pingpong_never)
{
    pingpong_run(VHD_POLL_NEVER, 0);
}

VHD_TEST(pingpong_never_spin)
{
    pingpong_run(VHD_POLL_NEVER, 5); /* event mode, spinning 5 us before it sleeps */
}

VHD_TEST(pingpong_always)
{
    pingpong_run(VHD_POLL_ALWAYS, 0);
}

/*
 * Completions are published before the batch ends: a driver waiting for
 * its interrupt sees used elements, and gets its call, while the worker is
 * still in the middle of the batch (held there by a slow backend), so it
 * can refill meanwhile. EVENT_IDX: the call comes because the driver asked
 * for one (used_event at what it had seen).
 */
static void publish_early_run(bool packed)
{
    struct vhd_rt_opts ro;
    struct env e;
    const unsigned batch = 32;
    int sp[2];

    rt_opts(&ro, 1, VHD_POLL_NEVER);
    env_init(&e, &ro);
    struct qopts qo = {.packed = packed, .event_idx = true, .mode = FAKE_INLINE};
    struct tq *t = env_add_queue(&e, &qo, batch);
    VHD_CHECK_EQ(pipe2(sp, O_CLOEXEC), 0);
    stall.fd = sp[0];
    stall.after = batch / 2;
    __atomic_store_n(&stall.entered, 0, __ATOMIC_RELAXED);
    stall.fq = t->fq;
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t->fq->q, 0), 0);

    /* Interrupts wanted from the first completion on, then one kick for the whole batch. */
    VHD_CHECK(!vhd_drv_vq_enable_cb(&t->dq));
    VHD_CHECK_EQ(drv_submit(t, batch, batch), batch);
    uint64_t t0 = mono_ms();
    while (!__atomic_load_n(&stall.entered, __ATOMIC_ACQUIRE)) {
        VHD_CHECK(mono_ms() - t0 < WAIT_MS);
        usleep(200);
    }
    /* The worker is inside the batch, half of it completed: some must be visible. */
    struct pollfd pfd = {.fd = t->call_fd, .events = POLLIN};
    VHD_CHECK_EQ(poll(&pfd, 1, 0), 1);
    unsigned seen = drv_collect(t);
    fprintf(stderr, "  %u of %u completions visible mid-batch\n", seen, batch);
    VHD_CHECK(seen >= batch / 4);
    VHD_CHECK(seen <= batch / 2);

    VHD_CHECK_EQ(write(sp[1], "x", 1), 1);
    drv_drain(t);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t->fq->q, DETACH_MS), 0);
    check_all_seen(t, batch);
    stall.fd = -1;
    close(sp[0]);
    close(sp[1]);
    env_fini(&e);
}

VHD_TEST(publish_before_batch_ends_split)
{
    publish_early_run(false);
}

VHD_TEST(publish_before_batch_ends_packed)
{
    publish_early_run(true);
}

/*
 * The adaptive window shrinks when work comes long after it closed
 * (polling would have found nothing) and grows when work comes soon after
 * it closed (a longer window would have saved the sleep); it stays within
 * [spin_us, poll_us]. Event mode's spin is a fixed window; spin 0 is none.
 */
VHD_TEST(adaptive_window_grows_and_shrinks)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t max = 20 * 1000 * 1000, min = 1000 * 1000; /* 20 ms, 1 ms */

    rt_opts(&ro, 1, VHD_POLL_ADAPTIVE);
    ro.poll_us = (unsigned)(max / 1000);
    ro.spin_us = (unsigned)(min / 1000);
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = FAKE_NOP};
    struct tq *t = env_add_queue(&e, &qo, 200);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t->fq->q, 0), 0);
    VHD_CHECK_EQ(vhd_rt_poll_window_ns(e.rt, 0), max); /* starts at the ceiling */

    /*
     * Requests 5 ceilings apart: the window closes, and the next work comes
     * more than a ceiling later (with room for a worker descheduled under
     * load, which closes the window late): halved each time (from the
     * second request on), down to the floor and no further.
     */
    uint64_t prev = max;
    for (int i = 0; i < 12 && vhd_rt_poll_window_ns(e.rt, 0) > min; i++) {
        drv_run(t, 1, 1);
        usleep((useconds_t)(5 * max / 1000));
        uint64_t now = vhd_rt_poll_window_ns(e.rt, 0);
        VHD_CHECK(now == prev || now == (prev / 2 > min ? prev / 2 : min));
        prev = now;
    }
    VHD_CHECK_EQ(vhd_rt_poll_window_ns(e.rt, 0), min);

    /* Requests 3 ms apart: 2 ms after a 1 ms window closes, within the ceiling: it grows. */
    for (int i = 0; i < 40 && vhd_rt_poll_window_ns(e.rt, 0) < 4 * min; i++) {
        drv_run(t, 1, 1);
        usleep(3000);
    }
    uint64_t grown = vhd_rt_poll_window_ns(e.rt, 0);
    fprintf(stderr, "  window grew to %llu us\n", (unsigned long long)grown / 1000);
    VHD_CHECK(grown >= 4 * min && grown <= max);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t->fq->q, DETACH_MS), 0);
    env_fini(&e);

    /* Event mode: a fixed spin, or none. */
    rt_opts(&ro, 2, VHD_POLL_NEVER);
    ro.spin_us = 7;
    struct vhd_rt *rt;
    VHD_CHECK_EQ(vhd_rt_new(&ro, &rt), 0);
    VHD_CHECK_EQ(vhd_rt_poll_window_ns(rt, 1), 7000);
    VHD_CHECK_EQ(vhd_rt_poll_window_ns(rt, 2), 0); /* no such worker */
    vhd_rt_free(rt);
    ro.spin_us = 0;
    VHD_CHECK_EQ(vhd_rt_new(&ro, &rt), 0);
    VHD_CHECK_EQ(vhd_rt_poll_window_ns(rt, 0), 0);
    vhd_rt_free(rt);
}

/*
 * The automatic spin (the default): a worker that sleeps between requests
 * measures what each sleep and wake-up cost it (thread CPU time inside the
 * blocking epoll_wait), and its event-mode spin follows that cost within
 * [10, 100] us. A fixed spin stays where it was set; the cost is measured
 * in every mode that sleeps.
 */
static uint64_t auto_spin_of(uint64_t cost)
{
    return cost < 10000 ? 10000 : cost > 100000 ? 100000 : cost;
}

VHD_TEST(spin_auto_follows_measured_wake_cost)
{
    for (int fixed = 0; fixed < 2; fixed++) {
        struct vhd_rt_opts ro;
        struct env e;
        rt_opts(&ro, 1, VHD_POLL_NEVER);
        if (fixed)
            ro.spin_us = 7;
        env_init(&e, &ro);
        struct qopts qo = {.event_idx = true, .mode = FAKE_NOP};
        struct tq *t = env_add_queue(&e, &qo, 100);
        VHD_CHECK_EQ(vhd_rt_attach(e.rt, &t->fq->q, 0), 0);
        struct vhd_rt_worker_stats st0, st;
        VHD_CHECK_EQ(vhd_rt_worker_stats(e.rt, 0, &st0), 0);
        if (fixed)
            VHD_CHECK_EQ(vhd_rt_poll_window_ns(e.rt, 0), 7000u);
        /* Requests 2 ms apart: after each the worker spins, then sleeps until the next kick. */
        for (int i = 0; i < 40; i++) {
            drv_run(t, 1, 1);
            usleep(2000);
        }
        VHD_CHECK_EQ(vhd_rt_worker_stats(e.rt, 0, &st), 0);
        uint64_t win = vhd_rt_poll_window_ns(e.rt, 0);
        fprintf(stderr, "  %s spin: %llu sleeps, wake-up cost %llu ns, window %llu ns\n",
                fixed ? "fixed" : "auto", (unsigned long long)(st.sleeps - st0.sleeps),
                (unsigned long long)st.wake_cost_ns, (unsigned long long)win);
        VHD_CHECK(st.sleeps - st0.sleeps >= 20);
        /* 20+ samples at weight 1/8: the assumed 10 us is at most 7 % of the average now. */
        VHD_CHECK(st.wake_cost_ns > 0 && st.wake_cost_ns != 10000u);
        if (fixed) {
            VHD_CHECK_EQ(win, 7000u);
        } else {
            /* The window moves when the cost moved by 1/16 of it or more. */
            uint64_t want = auto_spin_of(st.wake_cost_ns);
            uint64_t d = want > win ? want - win : win - want;
            VHD_CHECK(win >= 10000 && win <= 100000);
            VHD_CHECK(d * 16 < win);
        }
        VHD_CHECK_EQ(vhd_rt_detach(e.rt, &t->fq->q, DETACH_MS), 0);
        env_fini(&e);
    }
}

/* Wait (bounded) for the runtime's event fd and for q->broken. */
static void wait_broken(struct env *e, struct vhd_queue *q)
{
    struct pollfd pfd = {.fd = vhd_rt_event_fd(e->rt), .events = POLLIN};
    VHD_CHECK_EQ(poll(&pfd, 1, WAIT_MS), 1);
    eventfd_t v;
    VHD_CHECK_EQ(eventfd_read(pfd.fd, &v), 0);
    VHD_CHECK(vhd_load_acquire(&q->broken));
}

/*
 * queue_process failing marks that queue broken, stops it (its later kicks
 * are ignored), and leaves another queue on the same worker running.
 */
VHD_TEST(broken_queue_isolated_device_error)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 3000;

    rt_opts(&ro, 1, VHD_POLL_ADAPTIVE);
    env_init(&e, &ro);
    struct qopts qa = {.event_idx = true, .mode = FAKE_INLINE, .fail_after = 10};
    struct qopts qb = {.event_idx = true, .mode = FAKE_NOP};
    struct tq *a = env_add_queue(&e, &qa, 64);
    struct tq *b = env_add_queue(&e, &qb, n);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &a->fq->q, 0), 0);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &b->fq->q, 0), 0);

    VHD_CHECK_EQ(drv_submit(a, 20, 64), 20);
    wait_broken(&e, &a->fq->q);
    VHD_CHECK(!vhd_load_acquire(&b->fq->q.broken));
    /* More work on the broken queue is not taken. */
    VHD_CHECK_EQ(drv_submit(a, 5, 64), 5);
    VHD_CHECK_EQ(eventfd_write(a->kick_fd, 1), 0);

    drv_run(b, n, 64);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &a->fq->q, DETACH_MS), 0);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &b->fq->q, DETACH_MS), 0);
    VHD_CHECK(a->fq->q.broken);
    VHD_CHECK(!b->fq->q.broken);
    VHD_CHECK_EQ(a->fq->taken, 10);
    VHD_CHECK_EQ(a->fq->q.inflight_io, 0);
    VHD_CHECK_EQ(drv_collect(a), 10); /* the ones taken before the failure were completed */
    check_all_seen(b, n);
    env_fini(&e);
}

/*
 * A kick fd that is readable but cannot be read (an epoll fd with a ready
 * event: its read fails) breaks its queue instead of making the worker spin
 * on it; another queue on the same worker keeps running.
 */
VHD_TEST(unreadable_kick_breaks_the_queue)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 3000;

    rt_opts(&ro, 1, VHD_POLL_NEVER);
    env_init(&e, &ro);
    struct qopts qa = {.mode = FAKE_NOP};
    struct qopts qb = {.mode = FAKE_NOP};
    struct tq *a = env_add_queue(&e, &qa, 64);
    struct tq *b = env_add_queue(&e, &qb, n);
    int ready = eventfd(1, EFD_CLOEXEC), ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    VHD_CHECK(ready >= 0 && ep >= 0);
    VHD_CHECK_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, ready, &ev), 0);
    close(a->kick_fd);
    a->kick_fd = a->fq->q.kick_fd = ep; /* closed with the queue */
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &a->fq->q, 0), 0);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &b->fq->q, 0), 0);
    wait_broken(&e, &a->fq->q);
    drv_run(b, n, 64);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &a->fq->q, DETACH_MS), 0);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &b->fq->q, DETACH_MS), 0);
    VHD_CHECK(!b->fq->q.broken);
    check_all_seen(b, n);
    close(ready);
    env_fini(&e);
}

/* vhd_efd_check: an eventfd passes; other anonymous-inode files and other files do not. */
VHD_TEST(efd_check_accepts_only_eventfds)
{
    int efd = eventfd(0, EFD_CLOEXEC), ep = epoll_create1(EPOLL_CLOEXEC), p[2];
    VHD_CHECK(efd >= 0 && ep >= 0);
    VHD_CHECK_EQ(pipe(p), 0);
    int mfd = memfd_create("efd-check", MFD_CLOEXEC);
    VHD_CHECK(mfd >= 0);
    VHD_CHECK_EQ(vhd_efd_check(efd), 0);
    VHD_CHECK_EQ(vhd_efd_check(ep), -EINVAL);
    VHD_CHECK_EQ(vhd_efd_check(p[0]), -EINVAL);
    VHD_CHECK_EQ(vhd_efd_check(mfd), -EINVAL);
    VHD_CHECK_EQ(vhd_efd_check(-1), -EBADF);
    close(efd);
    close(ep);
    close(p[0]);
    close(p[1]);
    close(mfd);
}

/* Same with a malformed ring (a head index out of range): the engine breaks the queue. */
VHD_TEST(broken_queue_isolated_bad_ring)
{
    struct vhd_rt_opts ro;
    struct env e;
    const uint64_t n = 3000;

    rt_opts(&ro, 1, VHD_POLL_NEVER);
    env_init(&e, &ro);
    struct qopts qa = {.event_idx = true, .mode = FAKE_NOP};
    struct qopts qb = {.packed = true, .event_idx = true, .mode = FAKE_INLINE};
    struct tq *a = env_add_queue(&e, &qa, 64);
    struct tq *b = env_add_queue(&e, &qb, n);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &a->fq->q, 0), 0);
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, &b->fq->q, 0), 0);

    /* Three good requests, then a forged avail entry naming descriptor 0xffff. */
    drv_run(a, 3, 8);
    struct vhd_vring_avail *av = a->dq.ring.split.avail;
    uint16_t idx = vhd_le16(av->idx);
    vhd_store_relaxed(&av->ring[idx & (QSIZE - 1)], vhd_le16(0xffff));
    vhd_store_release(&av->idx, vhd_le16((uint16_t)(idx + 1)));
    vhd_smp_mb();
    VHD_CHECK_EQ(eventfd_write(a->kick_fd, 1), 0);
    wait_broken(&e, &a->fq->q);

    drv_run(b, n, 64);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &a->fq->q, DETACH_MS), 0);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, &b->fq->q, DETACH_MS), 0);
    VHD_CHECK(a->fq->q.broken);
    VHD_CHECK_EQ(a->fq->q.vq.error, VHD_VQ_E_DESC_INDEX);
    VHD_CHECK(!b->fq->q.broken);
    check_all_seen(b, n);
    env_fini(&e);
}

/*
 * The control thread owns a detached queue and may complete requests itself
 * (a device draining leftovers in queue_fini): vhd_queue_mark_used then
 * publishes and signals at once.
 */
VHD_TEST(mark_used_when_detached_publishes_at_once)
{
    struct vhd_rt_opts ro;
    struct env e;

    rt_opts(&ro, 1, VHD_POLL_ADAPTIVE);
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = FAKE_INLINE};
    struct tq *t = env_add_queue(&e, &qo, 8);
    struct vhd_queue *q = &t->fq->q;
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, 0), 0);
    drv_run(t, 2, 2);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, DETACH_MS), 0);

    /* Detached: queued requests stay untouched... */
    VHD_CHECK_EQ(drv_submit(t, 1, 8), 1);
    usleep(20 * 1000);
    VHD_CHECK_EQ(drv_collect(t), 0);
    /* ...until the control thread itself processes the queue. */
    vhd_drv_vq_enable_cb(&t->dq);
    VHD_CHECK_EQ(fake_queue_process_detached(q), 1);
    struct pollfd pfd = {.fd = t->call_fd, .events = POLLIN};
    VHD_CHECK_EQ(poll(&pfd, 1, 0), 1);
    VHD_CHECK_EQ(drv_collect(t), 1);
    check_all_seen(t, 3);
    env_fini(&e);
}

/* vhd_rt_free copes with a queue left attached after a timed-out detach. */
VHD_TEST(free_with_stuck_queue)
{
    struct vhd_rt_opts ro;
    struct env e;

    rt_opts(&ro, 1, VHD_POLL_ADAPTIVE);
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = FAKE_PIPE};
    struct tq *t = env_add_queue(&e, &qo, 8);
    int pipe_w = tq_use_pipe(t);
    struct vhd_queue *q = &t->fq->q;
    VHD_CHECK_EQ(vhd_rt_attach(e.rt, q, 0), 0);
    VHD_CHECK_EQ(drv_submit(t, 2, 8), 2);
    wait_popped(t, 2);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, q, 100), -ETIMEDOUT);
    vhd_rt_free(e.rt); /* warns, cancels the stuck reads with the ring */
    e.rt = NULL;
    q->attached = false;
    close(pipe_w);
    env_fini(&e);
}

/* ---- log module ---- */

/* Redirect stderr to a temporary file; returns the saved stderr. */
static int capture_stderr(int *fd_out)
{
    char path[] = "/tmp/vhd-logtest-XXXXXX";
    int fd = mkstemp(path);
    VHD_CHECK(fd >= 0);
    unlink(path);
    int saved = dup(STDERR_FILENO);
    VHD_CHECK(saved >= 0);
    VHD_CHECK(dup2(fd, STDERR_FILENO) >= 0);
    *fd_out = fd;
    return saved;
}

static unsigned captured_lines(int fd, int saved, const char *must_contain)
{
    char buf[16384];
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    VHD_CHECK(n >= 0);
    buf[n] = 0;
    close(fd);
    unsigned lines = 0;
    for (ssize_t i = 0; i < n; i++)
        lines += buf[i] == '\n';
    if (must_contain)
        VHD_CHECK(strstr(buf, must_contain) != NULL);
    return lines;
}

/*
 * vhd_rt_drain runs a detached queue on a worker until a turn takes fewer
 * chains than the budget, then lets go once the in-flight I/O completed
 * and was published: 120 requests with asynchronous completions, budget
 * 50, take three turns (50, 50, 20); every one is completed once and the
 * control thread owns the queue again.
 */
VHD_TEST(drain_runs_until_a_short_turn)
{
    struct vhd_rt_opts ro;
    struct env e;
    const unsigned n = 120;

    rt_opts(&ro, 1, VHD_POLL_NEVER);
    ro.budget = 50;
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = FAKE_TIMEOUT};
    struct tq *t = env_add_queue(&e, &qo, n);
    struct vhd_queue *q = &t->fq->q;
    VHD_CHECK_EQ(drv_submit(t, n, n), n);
    VHD_CHECK_EQ(vhd_rt_drain(e.rt, q, 0, DETACH_MS), 0);
    VHD_CHECK(!q->attached);
    VHD_CHECK(q->worker == NULL);
    VHD_CHECK_EQ(q->inflight_io, 0);
    VHD_CHECK_EQ(t->fq->taken, n);
    VHD_CHECK_EQ(t->fq->completed, n);
    VHD_CHECK_EQ(drv_collect(t), n);
    check_all_seen(t, n);
    VHD_CHECK_EQ(vhd_rt_drain(e.rt, q, 7, DETACH_MS), -EINVAL); /* no such worker */
    env_fini(&e);
}

/*
 * A queue that breaks while it drains ends the drain (detached, broken);
 * one whose I/O does not complete in time stays parked on its worker
 * (-ETIMEDOUT, attached) until a later detach finds it drained.
 */
VHD_TEST(drain_broken_or_stuck)
{
    struct vhd_rt_opts ro;
    struct env e;

    rt_opts(&ro, 1, VHD_POLL_NEVER);
    env_init(&e, &ro);
    struct qopts qo = {.event_idx = true, .mode = FAKE_INLINE};
    struct tq *t = env_add_queue(&e, &qo, 16);
    struct vhd_queue *q = &t->fq->q;
    t->fq->fail_after = 3;
    VHD_CHECK_EQ(drv_submit(t, 8, 16), 8);
    VHD_CHECK_EQ(vhd_rt_drain(e.rt, q, 0, DETACH_MS), 0);
    VHD_CHECK(!q->attached);
    VHD_CHECK(q->broken);
    VHD_CHECK_EQ(t->fq->taken, 3);
    VHD_CHECK_EQ(drv_collect(t), 3);

    struct qopts qp = {.event_idx = true, .mode = FAKE_PIPE};
    struct tq *u = env_add_queue(&e, &qp, 16);
    int pipe_w = tq_use_pipe(u);
    struct vhd_queue *r = &u->fq->q;
    VHD_CHECK_EQ(drv_submit(u, 4, 16), 4);
    VHD_CHECK_EQ(vhd_rt_drain(e.rt, r, 0, 200), -ETIMEDOUT);
    VHD_CHECK(r->attached);
    VHD_CHECK_EQ(write(pipe_w, "abcd", 4), 4);
    VHD_CHECK_EQ(vhd_rt_detach(e.rt, r, DETACH_MS), 0);
    VHD_CHECK_EQ(u->fq->completed, 4);
    VHD_CHECK_EQ(drv_collect(u), 4);
    close(pipe_w);
    env_fini(&e);
}

static uint64_t efd_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * A front-end's eventfd with O_NONBLOCK cleared and its counter at the
 * maximum: a plain write of 1 would sleep for ever. vhd_efd_signal comes
 * back within its guard period (-ETIMEDOUT), in both guard modes, and
 * again on a second try; a full non-blocking one answers -EAGAIN at once;
 * a normal one is incremented.
 */
VHD_TEST(efd_signal_never_blocks)
{
    VHD_CHECK_EQ(vhd_efd_init(), 0);
    int fd = eventfd(0, EFD_CLOEXEC); /* blocking */
    uint64_t max = 0xfffffffffffffffeull, v;
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(vhd_efd_signal(fd), 0);
    VHD_CHECK_EQ(read(fd, &v, sizeof(v)), (ssize_t)sizeof(v));
    VHD_CHECK_EQ(v, 1);
    VHD_CHECK_EQ(write(fd, &max, sizeof(max)), (ssize_t)sizeof(max));
    for (int keep = 0; keep < 2; keep++) {
        vhd_efd_keep_armed(keep != 0);
        for (int k = 0; k < 2; k++) {
            uint64_t t0 = efd_ms();
            VHD_CHECK_EQ(vhd_efd_signal(fd), -ETIMEDOUT);
            VHD_CHECK(efd_ms() - t0 < 1000); /* 20 ms, plus a loaded machine */
        }
    }
    vhd_efd_keep_armed(false);
    VHD_CHECK_EQ(read(fd, &v, sizeof(v)), (ssize_t)sizeof(v));
    VHD_CHECK_EQ(v, max); /* nothing was added */
    VHD_CHECK_EQ(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
    VHD_CHECK_EQ(write(fd, &max, sizeof(max)), (ssize_t)sizeof(max));
    VHD_CHECK_EQ(vhd_efd_signal(fd), -EAGAIN);
    vhd_efd_thread_end();
    close(fd);
}

/*
 * Kicks: a blocking empty eventfd (the front-end cleared O_NONBLOCK and
 * drained it after epoll saw it readable) reads -EAGAIN at once; a count is
 * taken whole; a pipe whose writer is gone reads end of file.
 */
VHD_TEST(efd_read_never_blocks)
{
    int fd = eventfd(0, EFD_CLOEXEC); /* blocking */
    uint64_t v = 0, three = 3;
    VHD_CHECK(fd >= 0);
    uint64_t t0 = efd_ms();
    VHD_CHECK_EQ(vhd_efd_read(fd, &v), -EAGAIN);
    VHD_CHECK(efd_ms() - t0 < 1000);
    VHD_CHECK_EQ(write(fd, &three, sizeof(three)), (ssize_t)sizeof(three));
    VHD_CHECK_EQ(vhd_efd_read(fd, &v), (ssize_t)sizeof(v));
    VHD_CHECK_EQ(v, 3);
    VHD_CHECK_EQ(vhd_efd_read(fd, &v), -EAGAIN);
    close(fd);
    int p[2];
    VHD_CHECK_EQ(pipe(p), 0);
    VHD_CHECK_EQ(vhd_efd_read(p[0], &v), -EAGAIN);
    close(p[1]);
    VHD_CHECK_EQ(vhd_efd_read(p[0], &v), 0);
    close(p[0]);
}

VHD_TEST(log_levels_and_format)
{
    int fd;
    VHD_CHECK_EQ(vhd_log_parse_level("debug"), VHD_LOG_DEBUG);
    VHD_CHECK_EQ(vhd_log_parse_level("WARNING"), VHD_LOG_WARN);
    VHD_CHECK_EQ(vhd_log_parse_level("error"), VHD_LOG_ERROR);
    VHD_CHECK_EQ(vhd_log_parse_level("loud"), -EINVAL);
    VHD_CHECK_EQ(vhd_log_get_level(), VHD_LOG_INFO);

    int saved = capture_stderr(&fd);
    vhd_log(VHD_LOG_INFO, "hello %d", 42);
    vhd_log(VHD_LOG_DEBUG, "hidden");
    vhd_log_set_level(VHD_LOG_DEBUG);
    vhd_log(VHD_LOG_DEBUG, "shown\n");
    vhd_log_set_level(VHD_LOG_ERROR);
    vhd_log(VHD_LOG_WARN, "hidden too");
    vhd_log(VHD_LOG_ERROR, "dev0: queue 1: %s", "bad");
    char big[3000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    vhd_log(VHD_LOG_ERROR, "%s", big); /* truncated, still one line */
    VHD_CHECK_EQ(captured_lines(fd, saved, "Z info: hello 42\n"), 4);
    saved = capture_stderr(&fd);
    vhd_log(VHD_LOG_ERROR, "dev0: queue 1: %s", "bad");
    VHD_CHECK_EQ(captured_lines(fd, saved, " error: dev0: queue 1: bad\n"), 1);
}

static int rl_flood_calls(void)
{
    int printed = 0;
    for (int i = 0; i < 250; i++) {
        static struct vhd_log_ratelimit rl;
        printed += vhd_log_ratelimited(&rl, VHD_LOG_WARN, "guest did something bad %d", i);
    }
    return printed;
}

static void *rl_flood_thread(void *arg)
{
    *(int *)arg = rl_flood_calls();
    return NULL;
}

VHD_TEST(log_ratelimited)
{
    struct vhd_log_ratelimit rl = {0};
    int fd, printed = 0;

    int saved = capture_stderr(&fd);
    for (int i = 0; i < 100; i++)
        printed += vhd_log_ratelimited(&rl, VHD_LOG_WARN, "line %d", i);
    VHD_CHECK_EQ(printed, VHD_LOG_RL_BURST);
    /* The window ends: the next line is printed and says how many were dropped. */
    rl.window_start_ns = 1;
    VHD_CHECK_EQ(vhd_log_ratelimited(&rl, VHD_LOG_WARN, "line again"), 1);
    /* Filtered by level: neither printed nor counted as dropped. */
    VHD_CHECK_EQ(vhd_log_ratelimited(&rl, VHD_LOG_DEBUG, "debug"), 0);
    VHD_CHECK_EQ(captured_lines(fd, saved, "line again [90 similar lines dropped]\n"),
                 VHD_LOG_RL_BURST + 1);

    /* One call site flooded from four threads: still the burst, in one window. */
    saved = capture_stderr(&fd);
    pthread_t th[4];
    int n[4];
    for (int i = 0; i < 4; i++)
        VHD_CHECK_EQ(pthread_create(&th[i], NULL, rl_flood_thread, &n[i]), 0);
    printed = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        printed += n[i];
    }
    VHD_CHECK_EQ(printed, VHD_LOG_RL_BURST);
    VHD_CHECK_EQ(captured_lines(fd, saved, "guest did something bad"), VHD_LOG_RL_BURST);

    /* The macro form keeps its own state per call site. */
    saved = capture_stderr(&fd);
    for (int i = 0; i < 50; i++)
        VHD_LOG_RL(VHD_LOG_ERROR, "site A %d", i);
    for (int i = 0; i < 50; i++)
        VHD_LOG_RL(VHD_LOG_ERROR, "site B %d", i);
    VHD_CHECK_EQ(captured_lines(fd, saved, "site B 9\n"), 2 * VHD_LOG_RL_BURST);
}
