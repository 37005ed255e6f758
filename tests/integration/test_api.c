/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The public device-side API (include/vhostd/): a custom device driven by
 * the userspace front-end over a real socket, with the context's control
 * loop on its own thread: chains reach the process callback as readable
 * then writable iovecs and come back with the length completed; events,
 * state, counters, config space, completion misuse, a callback error that
 * breaks the queue, and the argument checks of the context and devices.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "driver/guestmem.h"
#include "driver/vring.h"
#include "driver/vu_frontend.h"
#include "harness.h"
#include "spec/vhost_user.h"
#include "spec/virtio.h"
#include "vhostd/vhostd.h"

#define WAIT_MS 5000
#define PAGE    4096ull
#define REGION  (1ull << 20)
#define QSIZE   16u

/* What the device saw: written by the worker (process) or the control thread (events). */
struct probe {
    atomic_int events[5]; /* by enum vhd_event */
    atomic_int processed; /* process calls */
    atomic_int complete_rc[3];
    atomic_uint last_nr, last_nw, last_queue;
    atomic_uchar readable[64]; /* copy of the last chain's readable bytes */
    atomic_uint readable_len;
    atomic_int hold; /* a chain tagged 0xbb waits in process() while this is set */
};

/* Fills every writable byte with 0xa5 and completes; a chain whose first readable byte is
 * 0xff is a protocol violation (-EPROTO); 0xee completes with too much, then twice. */
static int probe_process(struct vhd_device *dev, uint32_t q, struct vhd_chain *chain,
                         const struct iovec *iov, unsigned nr, unsigned nw, void *opaque)
{
    struct probe *p = opaque;
    uint32_t rl = 0, written = 0;

    (void)dev;
    atomic_store(&p->last_nr, nr);
    atomic_store(&p->last_nw, nw);
    atomic_store(&p->last_queue, q);
    for (unsigned i = 0; i < nr; i++)
        for (size_t k = 0; k < iov[i].iov_len && rl < sizeof(p->readable); k++)
            atomic_store(&p->readable[rl++], ((const uint8_t *)iov[i].iov_base)[k]);
    atomic_store(&p->readable_len, rl);
    atomic_fetch_add(&p->processed, 1);
    uint8_t tag = rl ? ((const uint8_t *)iov[0].iov_base)[0] : 0;
    while (tag == 0xbb && atomic_load(&p->hold))
        usleep(1000);
    if (tag == 0xff)
        return -EPROTO; /* not completed: the library completes it with 0 */
    for (unsigned i = nr; i < nr + nw; i++) {
        memset(iov[i].iov_base, 0xa5, iov[i].iov_len);
        written += (uint32_t)iov[i].iov_len;
    }
    if (tag == 0xee) {
        atomic_store(&p->complete_rc[0], vhd_chain_complete(chain, vhd_chain_writable(chain) + 1));
        atomic_store(&p->complete_rc[1], vhd_chain_complete(chain, written));
        atomic_store(&p->complete_rc[2], vhd_chain_complete(chain, written));
        return 0;
    }
    return vhd_chain_complete(chain, written);
}

static void probe_event(struct vhd_device *dev, enum vhd_event ev, void *opaque)
{
    struct probe *p = opaque;
    (void)dev;
    if (ev >= 1 && ev <= 4)
        atomic_fetch_add(&p->events[ev], 1);
}

static const struct vhd_custom_ops probe_ops = {.process = probe_process};

/* The context's control loop on its own thread. */
struct loop {
    struct vhd_ctx *ctx;
    pthread_t thr;
    int rc;
};

static void *loop_main(void *arg)
{
    struct loop *l = arg;
    l->rc = vhd_ctx_run(l->ctx);
    return NULL;
}

static void loop_start(struct loop *l, struct vhd_ctx *ctx)
{
    l->ctx = ctx;
    l->rc = 1;
    VHD_CHECK_EQ(pthread_create(&l->thr, NULL, loop_main, l), 0);
}

static void loop_stop(struct loop *l)
{
    vhd_ctx_stop(l->ctx);
    VHD_CHECK_EQ(pthread_join(l->thr, NULL), 0);
    VHD_CHECK_EQ(l->rc, 0);
}

static bool wait_atomic(atomic_int *v, int want)
{
    for (int i = 0; i < WAIT_MS; i++) {
        if (atomic_load(v) >= want)
            return true;
        usleep(1000);
    }
    return false;
}

/* A front-end session with one started split ring. */
struct fe {
    struct vhd_guestmem gm;
    struct vhd_vuf f;
    struct vhd_drv_vq vq;
    struct vhd_vuf_ring ring;
    int kick, call;
    uint8_t *buf; /* data area, at gpa buf_gpa */
    uint64_t buf_gpa;
};

static void fe_open(struct fe *e, const char *sock, uint64_t want_proto)
{
    void *area, *h;

    memset(e, 0, sizeof(*e));
    VHD_CHECK_EQ(vhd_guestmem_init(&e->gm, 1, REGION, 0x100000, 0x100000), 0);
    vhd_vuf_init(&e->f, WAIT_MS);
    VHD_CHECK_EQ(vhd_vuf_connect(&e->f, sock), 0);
    VHD_CHECK_EQ(vhd_vuf_handshake(&e->f, want_proto), 0);
    VHD_CHECK_EQ(vhd_vuf_set_features(&e->f, 1ull << VIRTIO_F_VERSION_1), 0);
    VHD_CHECK_EQ(vhd_vuf_set_mem_table(&e->f, &e->gm), 0);
    size_t area_len = vhd_drv_vq_area_size(QSIZE, false, 0);
    uint64_t area_gpa = vhd_guestmem_alloc(&e->gm, area_len, PAGE, &area);
    struct vhd_drv_vq_params p = {
        .size = QSIZE, .area = area, .area_gpa = area_gpa, .area_len = area_len};
    VHD_CHECK_EQ(vhd_drv_vq_init(&e->vq, &p), 0);
    e->buf_gpa = vhd_guestmem_alloc(&e->gm, 4 * PAGE, PAGE, &h);
    e->buf = h;
    e->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    e->call = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    VHD_CHECK(e->kick >= 0 && e->call >= 0);
    e->ring = (struct vhd_vuf_ring){.index = 0,
                                    .num = QSIZE,
                                    .desc = vhd_guestmem_uva(&e->gm, e->vq.desc_gpa),
                                    .avail = vhd_guestmem_uva(&e->gm, e->vq.avail_gpa),
                                    .used = vhd_guestmem_uva(&e->gm, e->vq.used_gpa),
                                    .kick_fd = e->kick,
                                    .call_fd = e->call};
    VHD_CHECK_EQ(vhd_vuf_ring_start(&e->f, &e->ring), 0);
}

static void fe_close(struct fe *e)
{
    vhd_vuf_close(&e->f);
    vhd_drv_vq_fini(&e->vq);
    close(e->kick);
    close(e->call);
    vhd_guestmem_fini(&e->gm);
}

/*
 * One request: rlen readable bytes (first byte tag) at buf, then two writable
 * buffers of wlen bytes each. Waits up to wait_ms for it to come back: its used
 * length, or -1.
 */
static int64_t fe_request_wait(struct fe *e, uint8_t tag, uint32_t rlen, uint32_t wlen, int wait_ms)
{
    struct vhd_drv_buf b[3] = {
        {.gpa = e->buf_gpa, .len = rlen},
        {.gpa = e->buf_gpa + PAGE, .len = wlen},
        {.gpa = e->buf_gpa + 2 * PAGE, .len = wlen},
    };
    memset(e->buf, 0, 3 * PAGE);
    e->buf[0] = tag;
    for (uint32_t i = 1; i < rlen; i++)
        e->buf[i] = (uint8_t)i;
    if (vhd_drv_vq_add(&e->vq, b, 1, 2, false, e) < 0)
        return -1;
    vhd_drv_vq_publish(&e->vq);
    uint64_t one = 1;
    if (write(e->kick, &one, sizeof(one)) != sizeof(one))
        return -1;
    for (int i = 0; i < wait_ms; i++) {
        void *cookie;
        uint32_t len;
        if (vhd_drv_vq_get_used(&e->vq, &cookie, &len) == 1)
            return len;
        usleep(1000);
    }
    return -1;
}

static int64_t fe_request(struct fe *e, uint8_t tag, uint32_t rlen, uint32_t wlen)
{
    return fe_request_wait(e, tag, rlen, wlen, WAIT_MS);
}

static struct vhd_ctx *new_ctx(unsigned workers)
{
    struct vhd_ctx_config cc;
    struct vhd_ctx *ctx = NULL;
    vhd_ctx_config_init(&cc);
    cc.workers = workers;
    VHD_CHECK_EQ(vhd_ctx_new(&cc, &ctx), 0);
    return ctx;
}

static void sock_path(char *buf, size_t len, const char *what)
{
    snprintf(buf, len, "/tmp/vhd-test-api-%d-%s.sock", (int)getpid(), what);
    unlink(buf);
}

static struct vhd_device *new_probe(struct vhd_ctx *ctx, const char *sock, struct probe *p,
                                    const void *config, uint32_t config_size)
{
    struct vhd_custom_config c = {
        .dev = {.name = "probe", .endpoint = {.path = sock}, .on_event = probe_event, .opaque = p},
        .ops = &probe_ops,
        .num_queues = 2,
        .config = config,
        .config_size = config_size,
    };
    struct vhd_device *dev = NULL;
    char err[256] = "";
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), 0);
    return dev;
}

VHD_TEST(custom_device_serves_chains_as_iovecs)
{
    struct probe *p = calloc(1, sizeof(*p));
    char sock[128];
    struct loop l;
    struct fe e;

    sock_path(sock, sizeof(sock), "serve");
    struct vhd_ctx *ctx = new_ctx(2);
    struct vhd_device *dev = new_probe(ctx, sock, p, NULL, 0);
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_STOPPED);
    char err[256] = "";
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), -EALREADY);
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_WAITING);
    VHD_CHECK_EQ(vhd_device_num_queues(dev), 2u);
    VHD_CHECK(strcmp(vhd_device_socket_path(dev), sock) == 0);
    struct stat st;
    VHD_CHECK(stat(sock, &st) == 0 && S_ISSOCK(st.st_mode));

    loop_start(&l, ctx);
    fe_open(&e, sock, 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK);
    VHD_CHECK(wait_atomic(&p->events[VHD_EVENT_CONNECTED], 1));

    VHD_CHECK_EQ(fe_request(&e, 0x11, 24, 100), 200);
    VHD_CHECK_EQ(atomic_load(&p->last_nr), 1u);
    VHD_CHECK_EQ(atomic_load(&p->last_nw), 2u);
    VHD_CHECK_EQ(atomic_load(&p->last_queue), 0u);
    VHD_CHECK_EQ(atomic_load(&p->readable_len), 24u);
    VHD_CHECK_EQ(atomic_load(&p->readable[0]), 0x11);
    VHD_CHECK_EQ(atomic_load(&p->readable[23]), 23);
    /* Both writable buffers filled, nothing past them. */
    VHD_CHECK(e.buf[PAGE] == 0xa5 && e.buf[PAGE + 99] == 0xa5 && e.buf[PAGE + 100] == 0);
    VHD_CHECK(e.buf[2 * PAGE] == 0xa5 && e.buf[2 * PAGE + 99] == 0xa5 &&
              e.buf[2 * PAGE + 100] == 0);
    VHD_CHECK_EQ(fe_request(&e, 0x12, 1, 7), 14);

    struct vhd_queue_counters qc;
    VHD_CHECK_EQ(vhd_device_queue_counters(dev, 0, &qc), 0); /* any time for custom devices */
    VHD_CHECK_EQ(qc.requests, 2u);
    VHD_CHECK_EQ(qc.bytes, 214u);
    VHD_CHECK_EQ(qc.errors, 0u);
    VHD_CHECK_EQ(vhd_device_queue_counters(dev, 2, &qc), -EINVAL);

    fe_close(&e);
    VHD_CHECK(wait_atomic(&p->events[VHD_EVENT_DISCONNECTED], 1));
    loop_stop(&l);
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_WAITING);
    struct vhd_device_counters dc;
    VHD_CHECK_EQ(vhd_device_counters(dev, &dc), 0);
    VHD_CHECK_EQ(dc.sessions, 1u);
    VHD_CHECK_EQ(dc.broken, 0u);
    VHD_CHECK_EQ(atomic_load(&p->events[VHD_EVENT_CONNECTED]), 1);
    VHD_CHECK_EQ(atomic_load(&p->events[VHD_EVENT_BROKEN]), 0);

    VHD_CHECK_EQ(vhd_device_stop(dev), 0);
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_STOPPED);
    VHD_CHECK(stat(sock, &st) < 0 && errno == ENOENT); /* the socket file is gone */
    VHD_CHECK_EQ(vhd_device_stop(dev), 0);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0); /* and may start again */
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_WAITING);
    vhd_ctx_destroy(ctx); /* destroys the device, which removes its socket */
    VHD_CHECK(stat(sock, &st) < 0 && errno == ENOENT);
    free(p);
}

VHD_TEST(custom_callback_error_breaks_the_device)
{
    struct probe *p = calloc(1, sizeof(*p));
    char sock[128], err[256] = "";
    struct loop l;
    struct fe e;

    sock_path(sock, sizeof(sock), "broken");
    struct vhd_ctx *ctx = new_ctx(1);
    struct vhd_device *dev = new_probe(ctx, sock, p, NULL, 0);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    loop_start(&l, ctx);
    fe_open(&e, sock, 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK);
    /* The chain the device refuses still comes back, with nothing written. */
    VHD_CHECK_EQ(fe_request(&e, 0xff, 4, 64), 0);
    VHD_CHECK(wait_atomic(&p->events[VHD_EVENT_BROKEN], 1));
    struct vhd_queue_counters qc;
    VHD_CHECK_EQ(vhd_device_queue_counters(dev, 0, &qc), 0);
    VHD_CHECK_EQ(qc.errors, 2u); /* not completed + the error */
    /* The queue stopped: a new chain is not taken. */
    VHD_CHECK_EQ(fe_request_wait(&e, 0x01, 4, 64, 300), -1);
    VHD_CHECK_EQ(atomic_load(&p->processed), 1);
    loop_stop(&l);
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_BROKEN);
    struct vhd_device_counters dc;
    VHD_CHECK_EQ(vhd_device_counters(dev, &dc), 0);
    VHD_CHECK_EQ(dc.broken, 1u);
    fe_close(&e);
    vhd_ctx_destroy(ctx);
    VHD_CHECK_EQ(atomic_load(&p->events[VHD_EVENT_DISCONNECTED]), 1);
    free(p);
}

VHD_TEST(chain_complete_refuses_overlong_and_twice)
{
    struct probe *p = calloc(1, sizeof(*p));
    char sock[128], err[256] = "";
    struct loop l;
    struct fe e;

    sock_path(sock, sizeof(sock), "complete");
    struct vhd_ctx *ctx = new_ctx(1);
    struct vhd_device *dev = new_probe(ctx, sock, p, NULL, 0);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    loop_start(&l, ctx);
    fe_open(&e, sock, 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK);
    VHD_CHECK_EQ(fe_request(&e, 0xee, 4, 10), 20);
    VHD_CHECK_EQ(atomic_load(&p->complete_rc[0]), -EINVAL);
    VHD_CHECK_EQ(atomic_load(&p->complete_rc[1]), 0);
    VHD_CHECK_EQ(atomic_load(&p->complete_rc[2]), -EALREADY);
    VHD_CHECK_EQ(fe_request(&e, 0x01, 4, 10), 20); /* the queue is fine */
    loop_stop(&l);
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_CONNECTED);
    fe_close(&e);
    vhd_ctx_destroy(ctx);
    free(p);
}

VHD_TEST(custom_config_space)
{
    struct probe *p = calloc(1, sizeof(*p));
    const uint8_t cfg[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    char sock[128], err[256] = "";
    uint8_t got[8];
    struct loop l;
    struct fe e;

    sock_path(sock, sizeof(sock), "config");
    struct vhd_ctx *ctx = new_ctx(1);
    struct vhd_device *dev = new_probe(ctx, sock, p, cfg, sizeof(cfg));
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    loop_start(&l, ctx);
    fe_open(&e, sock,
            (1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK) | (1ull << VHOST_USER_PROTOCOL_F_CONFIG));
    VHD_CHECK_EQ(vhd_vuf_get_config(&e.f, 0, got, sizeof(got)), 0);
    VHD_CHECK(memcmp(got, cfg, sizeof(cfg)) == 0);
    VHD_CHECK_EQ(vhd_vuf_get_config(&e.f, 6, got, 2), 0);
    VHD_CHECK(got[0] == 7 && got[1] == 8);
    loop_stop(&l);
    const uint8_t upd[2] = {0xaa, 0xbb};
    VHD_CHECK_EQ(vhd_custom_update_config(dev, upd, 7, 2), -EINVAL); /* past the end */
    VHD_CHECK_EQ(vhd_custom_update_config(dev, upd, 2, 2), 0);
    loop_start(&l, ctx);
    VHD_CHECK_EQ(vhd_vuf_get_config(&e.f, 0, got, sizeof(got)), 0);
    VHD_CHECK(got[1] == 2 && got[2] == 0xaa && got[3] == 0xbb && got[4] == 5);
    loop_stop(&l);
    fe_close(&e);
    vhd_ctx_destroy(ctx);
    free(p);
}

VHD_TEST(arguments_are_checked)
{
    struct vhd_ctx_config cc;
    struct vhd_ctx *ctx = NULL;
    struct vhd_device *dev = NULL;
    struct probe p;
    char err[256] = "", sock[128];

    vhd_ctx_config_init(&cc);
    VHD_CHECK_EQ(cc.workers, 1u);
    cc.workers = 0;
    VHD_CHECK_EQ(vhd_ctx_new(&cc, &ctx), -EINVAL);
    cc.workers = VHD_CTX_MAX_WORKERS + 1;
    VHD_CHECK_EQ(vhd_ctx_new(&cc, &ctx), -EINVAL);
    VHD_CHECK_EQ(vhd_ctx_new(NULL, &ctx), 0); /* the defaults */
    VHD_CHECK_EQ(vhd_ctx_workers(ctx), 1u);

    sock_path(sock, sizeof(sock), "args");
    int bad_worker = 1;
    struct vhd_custom_config c = {
        .dev = {.endpoint = {.path = sock}, .workers = &bad_worker, .nworkers = 1, .opaque = &p},
        .ops = &probe_ops,
        .num_queues = 1,
    };
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), -EINVAL);
    VHD_CHECK(strstr(err, "worker 1 does not exist") != NULL);
    c.dev.nworkers = 0;
    c.num_queues = 0;
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), -EINVAL);
    c.num_queues = 1;
    c.ops = NULL;
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), -EINVAL);
    c.ops = &probe_ops;
    c.dev.endpoint.path = NULL;
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), -EINVAL);
    c.dev.endpoint.path = sock;
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), 0);
    VHD_CHECK(strcmp(vhd_device_name(dev), "custom") == 0);
    VHD_CHECK_EQ(vhd_device_queue_worker(dev, 0), 0);
    VHD_CHECK_EQ(vhd_device_queue_worker(dev, 1), -EINVAL);
    VHD_CHECK_EQ(vhd_custom_update_config(dev, NULL, 0, 0), 0);

    /* blk and net through the same life cycle */
    struct vhd_blk_config bc = {.dev = {.name = "nulldisk", .endpoint = {.path = sock}},
                                .backend = "null"};
    VHD_CHECK(vhd_blk_device_new(ctx, &bc, &dev, err, sizeof(err)) < 0); /* null needs a size */
    bc.size = 1 << 20;
    VHD_CHECK_EQ(vhd_blk_device_new(ctx, &bc, &dev, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_custom_update_config(dev, NULL, 0, 0), -ENOTSUP);
    struct vhd_queue_counters qc;
    VHD_CHECK_EQ(vhd_device_queue_counters(dev, 0, &qc), -ENODATA); /* never ran */
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    vhd_device_destroy(dev);
    struct vhd_net_config nc = {.dev = {.endpoint = {.path = sock}}, .pairs = 2};
    VHD_CHECK_EQ(vhd_net_device_new(ctx, &nc, &dev, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_device_num_queues(dev), 5u);
    VHD_CHECK_EQ(vhd_device_queue_worker(dev, 0), vhd_device_queue_worker(dev, 1));
    VHD_CHECK_EQ(vhd_device_queue_counters(dev, 1, &qc), 0);
    VHD_CHECK_EQ(qc.requests, 0u);
    vhd_ctx_destroy(ctx);
}

VHD_TEST(version)
{
    VHD_CHECK(strcmp(vhd_version(), VHD_VERSION_STRING) == 0);
    VHD_CHECK_EQ(vhd_version_number(), (unsigned)VHD_VERSION);
    VHD_CHECK(VHD_VERSION >= VHD_VERSION_NUM(0, 1, 0));
}

static void on_efd(void *opaque, uint32_t events)
{
    int *fd = opaque;
    uint64_t v;
    (void)events;
    if (read(fd[0], &v, sizeof(v)) == sizeof(v))
        fd[1] += (int)v;
}

VHD_TEST(dispatch_and_watch)
{
    struct vhd_ctx *ctx = NULL;
    struct vhd_ctx_watch *w = NULL;
    int fd[2] = {eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK), 0};
    uint64_t three = 3;

    VHD_CHECK(fd[0] >= 0);
    VHD_CHECK_EQ(vhd_ctx_new(NULL, &ctx), 0);
    VHD_CHECK(vhd_ctx_fd(ctx) >= 0);
    VHD_CHECK_EQ(vhd_ctx_dispatch(ctx, 0), 0); /* nothing to do */
    VHD_CHECK_EQ(vhd_ctx_watch_fd(ctx, -1, EPOLLIN, on_efd, fd, &w), -EINVAL);
    VHD_CHECK_EQ(vhd_ctx_watch_fd(ctx, fd[0], EPOLLIN, NULL, fd, &w), -EINVAL);
    VHD_CHECK_EQ(vhd_ctx_watch_fd(ctx, fd[0], EPOLLIN, on_efd, fd, &w), 0);
    VHD_CHECK_EQ(write(fd[0], &three, sizeof(three)), (ssize_t)sizeof(three));
    struct pollfd pfd = {.fd = vhd_ctx_fd(ctx), .events = POLLIN};
    VHD_CHECK_EQ(poll(&pfd, 1, WAIT_MS), 1); /* the context's fd says there is work */
    VHD_CHECK_EQ(vhd_ctx_dispatch(ctx, WAIT_MS), 1);
    VHD_CHECK_EQ(fd[1], 3);
    vhd_ctx_unwatch(w);
    VHD_CHECK_EQ(write(fd[0], &three, sizeof(three)), (ssize_t)sizeof(three));
    VHD_CHECK_EQ(vhd_ctx_dispatch(ctx, 50), 0); /* unwatched */
    vhd_ctx_stop(ctx);
    VHD_CHECK_EQ(vhd_ctx_run(ctx), 0); /* a pending stop returns at once, and is consumed */
    VHD_CHECK_EQ(vhd_ctx_dispatch(ctx, 0), 0);
    close(fd[0]);
    vhd_ctx_destroy(ctx);
}

VHD_TEST(client_endpoint_connects_to_the_front_end)
{
    struct probe *p = calloc(1, sizeof(*p));
    char sock[128], err[256] = "";
    struct loop l;
    struct vhd_vuf f;

    sock_path(sock, sizeof(sock), "client");
    struct vhd_ctx *ctx = new_ctx(1);
    struct vhd_custom_config c = {
        .dev = {.endpoint =
                    {.path = sock, .client = true, .reconnect_min_ms = 10, .reconnect_max_ms = 20},
                .on_event = probe_event,
                .opaque = p},
        .ops = &probe_ops,
        .num_queues = 1,
    };
    struct vhd_device *dev = NULL;
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), 0);
    VHD_CHECK(vhd_device_is_client(dev));
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    loop_start(&l, ctx); /* it retries until the front-end listens */
    usleep(100 * 1000);
    vhd_vuf_init(&f, WAIT_MS);
    VHD_CHECK_EQ(vhd_vuf_accept(&f, sock), 0);
    VHD_CHECK_EQ(vhd_vuf_handshake(&f, 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK), 0);
    VHD_CHECK(wait_atomic(&p->events[VHD_EVENT_CONNECTED], 1));
    vhd_vuf_close(&f);
    VHD_CHECK(wait_atomic(&p->events[VHD_EVENT_DISCONNECTED], 1));
    loop_stop(&l);
    struct vhd_device_counters dc;
    VHD_CHECK_EQ(vhd_device_counters(dev, &dc), 0);
    VHD_CHECK_EQ(dc.sessions, 1u);
    VHD_CHECK(dc.connect_attempts >= 2); /* the first ones found nobody listening */
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_WAITING); /* reconnecting */
    vhd_ctx_destroy(ctx);
    free(p);
}

VHD_TEST(one_context_holds_the_sigbus_guard)
{
    struct vhd_ctx_config cc;
    struct vhd_ctx *a = NULL, *b = NULL;

    vhd_ctx_config_init(&cc);
    VHD_CHECK(!cc.sigbus_guard); /* off unless asked for */
    cc.sigbus_guard = true;
    VHD_CHECK_EQ(vhd_ctx_new(&cc, &a), 0);
    VHD_CHECK_EQ(vhd_ctx_new(&cc, &b), -EBUSY);
    cc.sigbus_guard = false;
    VHD_CHECK_EQ(vhd_ctx_new(&cc, &b), 0); /* a context without it is fine */
    vhd_ctx_destroy(b);
    vhd_ctx_destroy(a);
    cc.sigbus_guard = true;
    VHD_CHECK_EQ(vhd_ctx_new(&cc, &a), 0); /* released by destroy */
    vhd_ctx_destroy(a);
}

VHD_TEST(a_queue_that_never_stops_disables_the_device)
{
    struct probe *p = calloc(1, sizeof(*p));
    char sock[128], err[256] = "";
    struct loop l;
    struct fe e;

    sock_path(sock, sizeof(sock), "disabled");
    struct vhd_ctx *ctx = new_ctx(1);
    struct vhd_custom_config c = {
        .dev = {.endpoint = {.path = sock},
                .stop_timeout_ms = 200,
                .on_event = probe_event,
                .opaque = p},
        .ops = &probe_ops,
        .num_queues = 1,
    };
    struct vhd_device *dev = NULL;
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    loop_start(&l, ctx);
    fe_open(&e, sock, 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK);
    VHD_CHECK(wait_atomic(&p->events[VHD_EVENT_CONNECTED], 1));
    atomic_store(&p->hold, 1);
    VHD_CHECK_EQ(fe_request_wait(&e, 0xbb, 4, 16, 0), -1); /* kicked, not answered */
    VHD_CHECK(wait_atomic(&p->processed, 1));
    fe_close(&e); /* the session ends; its queue cannot be taken back within 200 ms */
    VHD_CHECK(wait_atomic(&p->events[VHD_EVENT_DISCONNECTED], 1));
    loop_stop(&l);
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_DISABLED);
    VHD_CHECK_EQ(vhd_device_stop(dev), -EBUSY);
    VHD_CHECK_EQ(vhd_device_state(dev), VHD_DEVICE_DISABLED);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), -EBUSY);
    /* The worker finishes the chain late; destroy leaves the device's memory alone. */
    atomic_store(&p->hold, 0);
    vhd_device_destroy(dev);
    vhd_ctx_destroy(ctx);
    free(p);
}

/* A memory table of REGION bytes offered to a fresh device with the given limits: 0 or the error.
 */
static int mem_table_with_limits(uint64_t dev_max, uint64_t process_max)
{
    struct probe *p = calloc(1, sizeof(*p));
    char sock[128], err[256] = "";
    struct vhd_guestmem gm;
    struct vhd_vuf f;
    struct loop l;

    sock_path(sock, sizeof(sock), "memcap");
    vhd_set_guest_mem_limit(process_max);
    struct vhd_ctx *ctx = new_ctx(1);
    struct vhd_custom_config c = {
        .dev = {.endpoint = {.path = sock}, .max_guest_mem = dev_max, .opaque = p},
        .ops = &probe_ops,
        .num_queues = 1,
    };
    struct vhd_device *dev = NULL;
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    loop_start(&l, ctx);
    VHD_CHECK_EQ(vhd_guestmem_init(&gm, 1, REGION, 0x100000, 0x100000), 0);
    vhd_vuf_init(&f, WAIT_MS);
    VHD_CHECK_EQ(vhd_vuf_connect(&f, sock), 0);
    VHD_CHECK_EQ(vhd_vuf_handshake(&f, 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK), 0);
    VHD_CHECK_EQ(vhd_vuf_set_features(&f, 1ull << VIRTIO_F_VERSION_1), 0);
    int rc = vhd_vuf_set_mem_table(&f, &gm);
    vhd_vuf_close(&f);
    vhd_guestmem_fini(&gm);
    loop_stop(&l);
    vhd_ctx_destroy(ctx);
    vhd_set_guest_mem_limit(0);
    free(p);
    return rc;
}

VHD_TEST(guest_memory_limits)
{
    VHD_CHECK_EQ(mem_table_with_limits(0, 0), 0);        /* the defaults: 16T, 64T */
    VHD_CHECK_EQ(mem_table_with_limits(REGION, 0), 0);   /* exactly the device's limit */
    VHD_CHECK(mem_table_with_limits(REGION / 2, 0) < 0); /* above the device's */
    VHD_CHECK(mem_table_with_limits(0, REGION / 2) < 0); /* above the process's */
    VHD_CHECK_EQ(mem_table_with_limits(REGION, REGION), 0);
}

/*
 * vhd_blk_device_resize: the config space's capacity changes and the
 * front-end hears VHOST_USER_BACKEND_CONFIG_CHANGE_MSG on the back-end
 * channel; an image file grows sparse; shrinking over data needs force; a
 * net device or a bad size is refused.
 */
VHD_TEST(blk_resize_tells_the_front_end)
{
    char sock[128], img[128], err[256] = "";
    struct loop l;
    struct fe e;
    uint64_t cap = 0;
    int sv[2];

    sock_path(sock, sizeof(sock), "resize");
    snprintf(img, sizeof(img), "/tmp/vhd-test-api-%d-resize.img", (int)getpid());
    unlink(img);
    struct vhd_ctx *ctx = new_ctx(1);
    struct vhd_blk_config c = {
        .dev = {.name = "rs", .endpoint = {.path = sock}}, .image = img, .size = 1 << 20};
    struct vhd_device *dev = NULL;
    VHD_CHECK_EQ(vhd_blk_device_new(ctx, &c, &dev, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_blk_device_size(dev), 1 << 20);
    VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
    loop_start(&l, ctx);
    fe_open(&e, sock,
            (1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK) | (1ull << VHOST_USER_PROTOCOL_F_CONFIG) |
                (1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ));
    VHD_CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    VHD_CHECK_EQ(vhd_vuf_set_backend_req_fd(&e.f, sv[1]), 0);
    close(sv[1]);
    VHD_CHECK_EQ(vhd_vuf_get_config(&e.f, 0, &cap, sizeof(cap)), 0);
    VHD_CHECK_EQ(cap, (1 << 20) / 512);
    loop_stop(&l);

    /* Grow: the file, the config space, a CONFIG_CHANGE message. */
    VHD_CHECK_EQ(vhd_blk_device_resize(dev, 4 << 20, false, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_blk_device_size(dev), 4 << 20);
    struct stat st;
    VHD_CHECK(stat(img, &st) == 0);
    VHD_CHECK_EQ(st.st_size, 4 << 20);
    struct pollfd pf = {.fd = sv[0], .events = POLLIN};
    VHD_CHECK_EQ(poll(&pf, 1, WAIT_MS), 1);
    uint32_t hdr[3];
    VHD_CHECK_EQ(read(sv[0], hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
    VHD_CHECK_EQ(hdr[0], VHOST_USER_BACKEND_CONFIG_CHANGE_MSG);
    VHD_CHECK_EQ(hdr[2], 0);
    loop_start(&l, ctx);
    VHD_CHECK_EQ(vhd_vuf_get_config(&e.f, 0, &cap, sizeof(cap)), 0);
    VHD_CHECK_EQ(cap, (4 << 20) / 512);
    loop_stop(&l);

    /* Shrink over data: refused, nothing changed; forced: done. */
    int fd = open(img, O_WRONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(pwrite(fd, "x", 1, 3 << 20), 1);
    close(fd);
    VHD_CHECK_EQ(vhd_blk_device_resize(dev, 2 << 20, false, err, sizeof(err)), -EBUSY);
    VHD_CHECK(strstr(err, "holds data past") != NULL);
    VHD_CHECK_EQ(vhd_blk_device_size(dev), 4 << 20);
    VHD_CHECK(stat(img, &st) == 0 && st.st_size == 4 << 20);
    VHD_CHECK_EQ(vhd_blk_device_resize(dev, 2 << 20, true, err, sizeof(err)), 0);
    VHD_CHECK(stat(img, &st) == 0 && st.st_size == 2 << 20);
    VHD_CHECK_EQ(vhd_blk_device_resize(dev, 1000, false, err, sizeof(err)), -EINVAL);
    VHD_CHECK_EQ(vhd_blk_device_resize(dev, 0, false, err, sizeof(err)), -EINVAL);
    loop_start(&l, ctx);
    VHD_CHECK_EQ(vhd_vuf_get_config(&e.f, 0, &cap, sizeof(cap)), 0);
    VHD_CHECK_EQ(cap, (2 << 20) / 512);

    /*
     * Suspended (its only ring stopped, as a stopped VM's): no message to the
     * front-end (spec "Suspended device state"); the session goes on, and
     * the notification comes once a ring starts again.
     */
    VHD_CHECK_EQ(poll(&pf, 1, WAIT_MS), 1); /* the forced shrink's, the refused one sent none */
    VHD_CHECK_EQ(read(sv[0], hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
    VHD_CHECK_EQ(hdr[0], VHOST_USER_BACKEND_CONFIG_CHANGE_MSG);
    VHD_CHECK_EQ(poll(&pf, 1, 0), 0);
    uint32_t base = 0;
    VHD_CHECK_EQ(vhd_vuf_ring_stop(&e.f, 0, &base), 0);
    loop_stop(&l);
    VHD_CHECK_EQ(vhd_blk_device_resize(dev, 3 << 20, false, err, sizeof(err)), 0);
    VHD_CHECK_EQ(poll(&pf, 1, 200), 0);
    loop_start(&l, ctx);
    VHD_CHECK_EQ(vhd_vuf_get_config(&e.f, 0, &cap, sizeof(cap)), 0);
    VHD_CHECK_EQ(cap, (3 << 20) / 512);
    VHD_CHECK_EQ(poll(&pf, 1, 100), 0);
    e.ring.base = base;
    VHD_CHECK_EQ(vhd_vuf_ring_start(&e.f, &e.ring), 0);
    VHD_CHECK_EQ(poll(&pf, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(read(sv[0], hdr, sizeof(hdr)), (ssize_t)sizeof(hdr));
    VHD_CHECK_EQ(hdr[0], VHOST_USER_BACKEND_CONFIG_CHANGE_MSG);
    VHD_CHECK_EQ(vhd_vuf_get_config(&e.f, 0, &cap, sizeof(cap)), 0); /* the session still works */
    VHD_CHECK_EQ(cap, (3 << 20) / 512);
    VHD_CHECK_EQ(poll(&pf, 1, 100), 0); /* once */
    loop_stop(&l);
    fe_close(&e);
    close(sv[0]);

    struct vhd_net_config nc = {.dev = {.name = "n", .endpoint = {.path = sock}}};
    struct vhd_device *net = NULL;
    VHD_CHECK_EQ(vhd_net_device_new(ctx, &nc, &net, err, sizeof(err)), 0);
    VHD_CHECK_EQ(vhd_blk_device_resize(net, 1 << 20, false, err, sizeof(err)), -EINVAL);
    VHD_CHECK_EQ(vhd_blk_device_size(net), 0);
    vhd_ctx_destroy(ctx);
    unlink(img);
}

/* A listening Unix socket bound at path (not close-on-exec: as a manager would pass it). */
static int listening_socket(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    VHD_CHECK(strlen(path) < sizeof(sa.sun_path));
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    VHD_CHECK_EQ(listen(fd, 4), 0);
    return fd;
}

/*
 * endpoint.listen_fd: the device accepts on a socket it did not make, again
 * after a stop and start (the caller's fd stays open and usable), and never
 * removes its file; what is not a listening Unix stream socket, and socket
 * mode or group with it, are refused.
 */
VHD_TEST(inherited_listening_socket)
{
    struct probe *p = calloc(1, sizeof(*p));
    char sock[128], err[256] = "";
    struct loop l;
    struct vhd_vuf f;
    struct stat st;

    sock_path(sock, sizeof(sock), "inherited");
    int lfd = listening_socket(sock);
    struct vhd_ctx *ctx = new_ctx(1);
    struct vhd_custom_config c = {
        .dev = {.name = "inh",
                .endpoint = {.path = sock, .listen_fd_set = true, .listen_fd = lfd},
                .on_event = probe_event,
                .opaque = p},
        .ops = &probe_ops,
        .num_queues = 1,
    };
    struct vhd_device *dev = NULL;
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), 0);
    VHD_CHECK(!strcmp(vhd_device_socket_path(dev), sock));
    for (int round = 1; round <= 2; round++) {
        VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), 0);
        VHD_CHECK_EQ(vhd_device_socket_dir_fd(dev), -1); /* nothing of the path is ours */
        loop_start(&l, ctx);
        vhd_vuf_init(&f, WAIT_MS);
        VHD_CHECK_EQ(vhd_vuf_connect(&f, sock), 0);
        VHD_CHECK_EQ(vhd_vuf_handshake(&f, 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK), 0);
        VHD_CHECK(wait_atomic(&p->events[VHD_EVENT_CONNECTED], round));
        vhd_vuf_close(&f);
        VHD_CHECK(wait_atomic(&p->events[VHD_EVENT_DISCONNECTED], round));
        loop_stop(&l);
        VHD_CHECK_EQ(vhd_device_stop(dev), 0);
        VHD_CHECK(stat(sock, &st) == 0 && S_ISSOCK(st.st_mode)); /* left in place */
        VHD_CHECK(fcntl(lfd, F_GETFD) >= 0);                     /* and the caller's fd open */
    }
    vhd_device_destroy(dev);

    /* A socket that is not listening, a pipe: refused at start. */
    int sv[2], pf[2];
    VHD_CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    VHD_CHECK_EQ(pipe2(pf, O_CLOEXEC), 0);
    const int bad[2] = {sv[0], pf[0]};
    const int want[2] = {-EINVAL, -ENOTSOCK};
    for (int i = 0; i < 2; i++) {
        c.dev.endpoint.listen_fd = bad[i];
        VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), 0);
        VHD_CHECK_EQ(vhd_device_start(dev, err, sizeof(err)), want[i]);
        vhd_device_destroy(dev);
    }
    /* Socket mode and group belong to whoever made the socket. */
    c.dev.endpoint.listen_fd = lfd;
    c.dev.endpoint.access.mode = 0660;
    VHD_CHECK_EQ(vhd_custom_device_new(ctx, &c, &dev, err, sizeof(err)), -EINVAL);
    vhd_ctx_destroy(ctx);
    close(sv[0]);
    close(sv[1]);
    close(pf[0]);
    close(pf[1]);
    close(lfd);
    unlink(sock);
    free(p);
}

/* ---- a stuck open at shutdown ---- */

struct open_result {
    int calls;
    int rc;
};

static void open_done(void *opaque, struct vhd_device *dev, int rc, const char *err)
{
    struct open_result *r = opaque;
    (void)err;
    r->calls++;
    r->rc = rc;
    if (dev)
        vhd_device_destroy(dev);
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/*
 * vhd_ctx_destroy while an open is stuck (an NBD server that never answers
 * its greeting: the open's own bound is 10 s): the devices are stopped and
 * destroyed, the open is given up after 2 s (its callback: -ECANCELED),
 * and destroy returns well before the open's bound.
 */
VHD_TEST(ctx_destroy_does_not_wait_for_a_stuck_open)
{
    char srv[100], sock[128], uri[256], err[256] = "";
    snprintf(srv, sizeof(srv), "/tmp/vhd-test-api-%d-silent.sock", (int)getpid());
    sock_path(sock, sizeof(sock), "stuck");
    unlink(srv);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", srv);
    VHD_CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0 &&
              listen(lfd, 4) == 0);
    snprintf(uri, sizeof(uri), "nbd+unix:///?socket=%s", srv);
    struct vhd_ctx *ctx = new_ctx(1);
    struct vhd_blk_config c = {
        .dev = {.name = "stuck", .endpoint = {.path = sock}}, .backend = "nbd", .uri = uri};
    struct open_result res = {0};
    int rc = vhd_blk_device_open(ctx, &c, open_done, &res, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  open: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    struct timespec ts = {0, 200 * 1000000}; /* the open thread is in the handshake by then */
    nanosleep(&ts, NULL);
    uint64_t t0 = mono_ms();
    vhd_ctx_destroy(ctx);
    uint64_t took = mono_ms() - t0;
    fprintf(stderr, "  vhd_ctx_destroy: %llu ms\n", (unsigned long long)took);
    VHD_CHECK_EQ(res.calls, 1);
    VHD_CHECK_EQ(res.rc, -ECANCELED);
    VHD_CHECK(took < 5000);
    close(lfd);
    unlink(srv);
}
