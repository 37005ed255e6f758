/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Tests of the vhost-user transport (src/transport/) over real sockets: a raw
 * vhost-user client of our own drives devices of a tiny fake device type
 * served by vhd_vu_server on a control loop thread, with queues run by the
 * real runtime (src/runtime/worker.c). Rings live in memfd guest memory
 * built with src/driver/. Covers the happy path on both ring layouts,
 * REPLY_ACK, config bounds, the spec's ring states, and malformed input
 * (each gets an error reply or a closed connection, fds are not leaked, and
 * another device on the same loop and runtime keeps serving).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/lsan_interface.h>
#endif

#include "core/mem.h"
#include "spec/virtio.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "harness.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "transport/ctl.h"
#include "transport/vu_conn.h"
#include "spec/vhost_user.h"
#include "transport/vu_server.h"

#define BIT(n)     (1ull << (n))
#define TIMEOUT_MS 5000
#define V1         VHOST_USER_VERSION

/* =====================================================================
 * The fake device type: config space of 16 bytes (byte 8 writable), each
 * request = readable header {op, delay_ms, tag} + writable buffer, answered
 * with {tag ^ MAGIC, queue index}. op 1 completes after delay_ms through an
 * io_uring timeout on the worker (in-flight I/O for the drain tests).
 * ===================================================================== */

#define FAKE_MAGIC       0x5a5a5a5a00000000ull
#define FAKE_CONFIG_SIZE 16
#define FAKE_NQUEUES     2

struct fake_hdr {
    uint32_t op;
    uint32_t delay_ms;
    uint64_t tag;
};

struct fake_resp {
    uint64_t tag;
    uint32_t queue;
    uint32_t pad;
};

struct fake_dev {
    struct vhd_dev dev;
    uint8_t config[FAKE_CONFIG_SIZE];
    /* Counters read by the test thread: atomics. */
    int resets, queue_inits, queue_finis, set_features_calls;
    int fini_with_inflight; /* queue_fini saw in-flight I/O: a drain bug */
    int popped;             /* chains popped by fake_process (workers) */
    uint64_t features;      /* last set_features value (control thread) */
};

struct fake_req {
    struct vhd_io_cb cb;
    struct vhd_queue *q;
    struct vhd_vq_chain chain;
    uint32_t written;
    struct __kernel_timespec ts;
};

static uint64_t fake_features(struct vhd_dev *dev)
{
    (void)dev;
    return BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_F_RING_PACKED) | BIT(VIRTIO_F_INDIRECT_DESC) |
           BIT(VIRTIO_F_EVENT_IDX) | BIT(VIRTIO_F_ACCESS_PLATFORM) | BIT(VHOST_F_LOG_ALL);
}

static int fake_set_features(struct vhd_dev *dev, uint64_t f)
{
    struct fake_dev *fd = dev->priv;
    if (!(f & BIT(VIRTIO_F_VERSION_1)))
        return -EINVAL; /* virtio 1.x only */
    fd->features = f;
    __atomic_fetch_add(&fd->set_features_calls, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static int fake_get_config(struct vhd_dev *dev, void *buf, uint32_t off, uint32_t len)
{
    struct fake_dev *fd = dev->priv;
    memcpy(buf, fd->config + off, len);
    return 0;
}

static int fake_set_config(struct vhd_dev *dev, const void *buf, uint32_t off, uint32_t len)
{
    struct fake_dev *fd = dev->priv;
    if (off != 8 || len != 1)
        return -EPERM;
    memcpy(fd->config + off, buf, len);
    return 0;
}

static int fake_queue_init(struct vhd_dev *dev, struct vhd_queue *q)
{
    struct fake_dev *fd = dev->priv;
    (void)q;
    __atomic_fetch_add(&fd->queue_inits, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static void fake_queue_fini(struct vhd_dev *dev, struct vhd_queue *q)
{
    struct fake_dev *fd = dev->priv;
    if (q->inflight_io)
        __atomic_fetch_add(&fd->fini_with_inflight, 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&fd->queue_finis, 1, __ATOMIC_SEQ_CST);
}

static void fake_reset(struct vhd_dev *dev)
{
    struct fake_dev *fd = dev->priv;
    fd->config[8] = 0;
    __atomic_fetch_add(&fd->resets, 1, __ATOMIC_SEQ_CST);
}

static void fake_complete(struct fake_req *r)
{
    struct vhd_queue *q = r->q;
    (void)vhd_vq_push(&q->vq, &r->chain, r->written);
    q->inflight_io--;
    vhd_queue_mark_used(q);
    free(r);
}

static void fake_timer_done(struct vhd_io_cb *cb, int res)
{
    (void)res; /* -ETIME: the timeout expired */
    fake_complete(vhd_container_of(cb, struct fake_req, cb));
}

static int fake_process(struct vhd_queue *q, unsigned budget)
{
    unsigned n = 0;

    while (n < budget) {
        struct iovec iov[8];
        struct vhd_vq_chain ch;
        int rc = vhd_vq_pop(&q->vq, iov, 8, &ch);
        if (rc < 0)
            return rc;
        if (rc == 0)
            break;
        n++;
        q->inflight_io++;
        __atomic_fetch_add(&((struct fake_dev *)q->dev->priv)->popped, 1, __ATOMIC_SEQ_CST);
        struct fake_req *r = calloc(1, sizeof(*r));
        if (!r)
            return -ENOMEM;
        r->q = q;
        r->chain = ch;
        struct fake_hdr h = {0};
        if (ch.nr >= 1 && iov[0].iov_len >= sizeof(h))
            memcpy(&h, iov[0].iov_base, sizeof(h));
        struct fake_resp resp = {.tag = h.tag ^ FAKE_MAGIC, .queue = q->index};
        if (ch.nw >= 1 && iov[ch.nr].iov_len >= sizeof(resp)) {
            memcpy(iov[ch.nr].iov_base, &resp, sizeof(resp));
            r->written = sizeof(resp);
        }
        if (h.op == 1 && q->worker) {
            struct io_uring_sqe *sqe = vhd_worker_get_sqe(q->worker);
            if (sqe) {
                r->ts.tv_sec = h.delay_ms / 1000;
                r->ts.tv_nsec = (long long)(h.delay_ms % 1000) * 1000000;
                r->cb.done = fake_timer_done;
                io_uring_prep_timeout(sqe, &r->ts, 0, 0);
                io_uring_sqe_set_data(sqe, &r->cb);
                continue;
            }
        }
        fake_complete(r);
    }
    return (int)n;
}

static const struct vhd_dev_ops fake_ops = {
    .type = "fake",
    .features = fake_features,
    .set_features = fake_set_features,
    .config_size = FAKE_CONFIG_SIZE,
    .get_config = fake_get_config,
    .set_config = fake_set_config,
    .queue_init = fake_queue_init,
    .queue_fini = fake_queue_fini,
    .queue_process = fake_process,
    .reset = fake_reset,
};

static int fcount(struct fake_dev *fd, int *p)
{
    (void)fd;
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}

/* =====================================================================
 * Environment: runtime, control loop thread, two devices with servers.
 * ===================================================================== */

#define NDEVS 2

struct env {
    struct vhd_rt *rt;
    struct vhd_ctl *ctl;
    pthread_t thread;
    struct fake_dev fdev[NDEVS];
    struct vhd_vu_server *srv[NDEVS];
    char path[NDEVS][108];
    char dir[64];
    struct vhd_ctl_src *rt_src;
};

static struct env E;

static void on_rt_event(void *opaque, uint32_t events)
{
    struct env *e = opaque;
    uint64_t v;
    (void)events;
    if (read(vhd_rt_event_fd(e->rt), &v, sizeof(v)) < 0) {
        /* already drained */
    }
    for (int i = 0; i < NDEVS; i++)
        if (e->srv[i])
            vhd_vu_server_check_queues(e->srv[i]);
}

static void *ctl_thread(void *arg)
{
    struct env *e = arg;
    int rc = vhd_ctl_run(e->ctl);
    if (rc < 0)
        fprintf(stderr, "ctl loop: %s\n", strerror(-rc));
    return NULL;
}

static void fake_dev_init(struct fake_dev *fd, int i, struct vhd_rt *rt)
{
    memset(fd, 0, sizeof(*fd));
    for (int k = 0; k < FAKE_CONFIG_SIZE; k++)
        fd->config[k] = (uint8_t)(0x10 + k);
    fd->config[8] = 0;
    struct vhd_dev *d = &fd->dev;
    d->ops = &fake_ops;
    snprintf(d->name, sizeof(d->name), "fake%d", i);
    d->num_queues = FAKE_NQUEUES;
    d->queues = aligned_alloc(VHD_CACHELINE, FAKE_NQUEUES * sizeof(struct vhd_queue));
    VHD_CHECK(d->queues != NULL);
    memset(d->queues, 0, FAKE_NQUEUES * sizeof(struct vhd_queue));
    d->queue_worker = NULL; /* round robin */
    d->rt = rt;
    d->priv = fd;
}

static void env_up(void)
{
    struct vhd_rt_opts o;
    char err[256];

    vhd_log_set_level(getenv("VHD_TEST_DEBUG") ? VHD_LOG_DEBUG : VHD_LOG_ERROR);
    vhd_rt_opts_default(&o);
    o.nworkers = 2;
    VHD_CHECK_EQ(vhd_rt_new(&o, &E.rt), 0);
    VHD_CHECK_EQ(vhd_ctl_new(&E.ctl), 0);
    snprintf(E.dir, sizeof(E.dir), "/tmp/vhd-test-vu-XXXXXX");
    VHD_CHECK(mkdtemp(E.dir) != NULL);
    for (int i = 0; i < NDEVS; i++) {
        fake_dev_init(&E.fdev[i], i, E.rt);
        snprintf(E.path[i], sizeof(E.path[i]), "%s/dev%d.sock", E.dir, i);
        E.srv[i] = vhd_vu_server_new(E.ctl, &E.fdev[i].dev, E.path[i], err, sizeof(err));
        if (!E.srv[i])
            fprintf(stderr, "server: %s\n", err);
        VHD_CHECK(E.srv[i] != NULL);
    }
    VHD_CHECK_EQ(vhd_ctl_add(E.ctl, vhd_rt_event_fd(E.rt), EPOLLIN, on_rt_event, &E, &E.rt_src), 0);
    VHD_CHECK_EQ(pthread_create(&E.thread, NULL, ctl_thread, &E), 0);
}

static void env_down(void)
{
    vhd_ctl_stop(E.ctl);
    pthread_join(E.thread, NULL);
    for (int i = 0; i < NDEVS; i++) {
        vhd_vu_server_free(E.srv[i]);
        VHD_CHECK(access(E.path[i], F_OK) < 0); /* the socket is gone */
        free(E.fdev[i].dev.queues);
    }
    vhd_ctl_del(E.rt_src);
    vhd_ctl_free(E.ctl);
    vhd_rt_free(E.rt);
    rmdir(E.dir);
#ifdef __SANITIZE_ADDRESS__
    /* The harness ends tests with _exit(), which skips LeakSanitizer: check here. */
    __lsan_do_leak_check();
#endif
}

/* Run fn on the control thread? Not needed: the tests only talk over sockets. */

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    VHD_CHECK(d != NULL);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Wait until the process has exactly n open fds (the server closes asynchronously). */
static void wait_fds(int n)
{
    uint64_t t0 = now_ms();
    while (count_fds() != n && now_ms() - t0 < TIMEOUT_MS)
        usleep(1000);
    if (count_fds() != n)
        fprintf(stderr, "  open fds: %d, expected %d\n", count_fds(), n);
    VHD_CHECK_EQ(count_fds(), n);
}

/* =====================================================================
 * A raw vhost-user client.
 * ===================================================================== */

static int cli_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(fd >= 0);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    VHD_CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* Send raw bytes with fds (no framing help: tests forge anything). */
static void cli_send_raw(int fd, const void *buf, size_t len, const int *fds, unsigned nfds)
{
    char ctl[CMSG_SPACE(16 * sizeof(int))];
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds) {
        memset(ctl, 0, sizeof(ctl));
        mh.msg_control = ctl;
        mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
    }
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
    VHD_CHECK_EQ(n, (ssize_t)len);
}

static void cli_send(int fd, uint32_t req, uint32_t flags, const void *p, uint32_t size,
                     const int *fds, unsigned nfds)
{
    uint8_t buf[sizeof(struct vu_hdr) + 4096];
    struct vu_hdr h = {.request = req, .flags = flags, .size = size};
    VHD_CHECK(size <= 4096);
    memcpy(buf, &h, sizeof(h));
    if (size)
        memcpy(buf + sizeof(h), p, size);
    cli_send_raw(fd, buf, sizeof(h) + size, fds, nfds);
}

static int read_full(int fd, void *buf, size_t len, int timeout_ms)
{
    size_t got = 0;
    while (got < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = poll(&pfd, 1, timeout_ms);
        if (pr == 0)
            return -ETIMEDOUT;
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)n;
    }
    return 0;
}

/* Receive one reply. Returns its payload size, or -ETIMEDOUT / -ECONNRESET. */
static int cli_recv(int fd, struct vu_hdr *h, void *p, size_t cap, int timeout_ms)
{
    int rc = read_full(fd, h, sizeof(*h), timeout_ms);
    if (rc < 0)
        return rc;
    VHD_CHECK(h->size <= cap);
    rc = read_full(fd, p, h->size, timeout_ms);
    if (rc < 0)
        return rc;
    return (int)h->size;
}

/* Expect a reply to req with exactly version 1 | REPLY. */
static int cli_reply(int fd, uint32_t req, void *p, size_t cap)
{
    struct vu_hdr h;
    int n = cli_recv(fd, &h, p, cap, TIMEOUT_MS);
    VHD_CHECK(n >= 0);
    VHD_CHECK_EQ(h.request, req);
    VHD_CHECK_EQ(h.flags, VHOST_USER_VERSION | VHOST_USER_REPLY_MASK);
    return n;
}

static uint64_t cli_get_u64(int fd, uint32_t req)
{
    uint64_t v = 0;
    cli_send(fd, req, VHOST_USER_VERSION, NULL, 0, NULL, 0);
    VHD_CHECK_EQ(cli_reply(fd, req, &v, sizeof(v)), 8);
    return v;
}

/* The connection was closed by the server (no reply). */
static void cli_expect_closed(int fd)
{
    char buf[512];
    struct vu_hdr h;
    int n = cli_recv(fd, &h, buf, sizeof(buf), TIMEOUT_MS);
    VHD_CHECK_EQ(n, -ECONNRESET);
}

/* Nothing arrives within ms (the server is still connected and silent). */
static void cli_expect_silence(int fd, int ms)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    VHD_CHECK_EQ(poll(&pfd, 1, ms), 0);
}

/* A session: client socket + what it negotiated. */
struct sess {
    int fd;
    uint64_t proto; /* negotiated protocol features */
    bool ack;       /* REPLY_ACK negotiated: every set message asks for an ack */
};

/*
 * Send a message without its own reply. With REPLY_ACK negotiated it asks
 * for an ack and returns the ack value; otherwise returns 0.
 */
static uint64_t s_set(struct sess *s, uint32_t req, const void *p, uint32_t size, const int *fds,
                      unsigned nfds)
{
    uint32_t flags = VHOST_USER_VERSION | (s->ack ? VHOST_USER_NEED_REPLY_MASK : 0);
    cli_send(s->fd, req, flags, p, size, fds, nfds);
    if (!s->ack)
        return 0;
    uint64_t v = ~0ull;
    VHD_CHECK_EQ(cli_reply(s->fd, req, &v, sizeof(v)), 8);
    return v;
}

static void s_set_ok(struct sess *s, uint32_t req, const void *p, uint32_t size, const int *fds,
                     unsigned nfds)
{
    VHD_CHECK_EQ(s_set(s, req, p, size, fds, nfds), 0);
}

static void s_set_u64(struct sess *s, uint32_t req, uint64_t v)
{
    s_set_ok(s, req, &v, sizeof(v), NULL, 0);
}

static void s_set_state(struct sess *s, uint32_t req, uint32_t index, uint32_t num)
{
    struct vu_vring_state st = {.index = index, .num = num};
    s_set_ok(s, req, &st, sizeof(st), NULL, 0);
}

/*
 * Connect and get the features. A connection made while the server is still
 * tearing down the previous session is refused (closed): retry then.
 */
static int cli_connect_session(int devi, uint64_t *features)
{
    uint64_t t0 = now_ms();
    for (;;) {
        int fd = cli_connect(E.path[devi]);
        struct vu_hdr h = {VHOST_USER_GET_FEATURES, VHOST_USER_VERSION, 0};
        int n = -ECONNRESET;
        /* The refusal may come before our request is even written (EPIPE). */
        if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) == (ssize_t)sizeof(h))
            n = cli_recv(fd, &h, features, sizeof(*features), TIMEOUT_MS);
        if (n == 8) {
            VHD_CHECK_EQ(h.flags, VHOST_USER_VERSION | VHOST_USER_REPLY_MASK);
            return fd;
        }
        close(fd);
        VHD_CHECK_EQ(n, -ECONNRESET);
        VHD_CHECK(now_ms() - t0 < TIMEOUT_MS);
        usleep(2000);
    }
}

/* Open a session and negotiate protocol features `proto` (a subset of the offer). */
static void sess_open(struct sess *s, int devi, uint64_t proto)
{
    uint64_t f;

    memset(s, 0, sizeof(*s));
    s->fd = cli_connect_session(devi, &f);
    VHD_CHECK(f & BIT(VHOST_USER_F_PROTOCOL_FEATURES));
    /* Never offered: LOG_ALL (this device does not log its writes: ops->dirty_log), IOMMU. */
    VHD_CHECK(!(f & BIT(VHOST_F_LOG_ALL)));
    VHD_CHECK(!(f & BIT(VIRTIO_F_ACCESS_PLATFORM)));
    uint64_t pf = cli_get_u64(s->fd, VHOST_USER_GET_PROTOCOL_FEATURES);
    VHD_CHECK_EQ(pf & proto, proto);
    VHD_CHECK(!(pf & BIT(VHOST_USER_PROTOCOL_F_LOG_SHMFD)));
    VHD_CHECK(!(pf & BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)));
    VHD_CHECK(!(pf & BIT(VHOST_USER_PROTOCOL_F_BACKEND_SEND_FD)));
    s_set_u64(s, VHOST_USER_SET_PROTOCOL_FEATURES, proto);
    s->proto = proto;
    s->ack = (proto & BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK)) != 0;
    s_set_ok(s, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0);
}

static void sess_close(struct sess *s)
{
    close(s->fd);
    s->fd = -1;
}

/* Every protocol feature we use in the happy path. */
#define PROTO_ALL                                                                         \
    (BIT(VHOST_USER_PROTOCOL_F_MQ) | BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK) |               \
     BIT(VHOST_USER_PROTOCOL_F_CONFIG) | BIT(VHOST_USER_PROTOCOL_F_RESET_DEVICE) |        \
     BIT(VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS) | BIT(VHOST_USER_PROTOCOL_F_STATUS) | \
     BIT(VHOST_USER_PROTOCOL_F_BACKEND_REQ))

/* =====================================================================
 * The guest side: memfd memory, driver rings, kick/call eventfds.
 * ===================================================================== */

#define GUEST_GPA  0x40000000ull
#define GUEST_SIZE (4ull << 20)
#define QSIZE      64

struct guest {
    struct vhd_guestmem gm;
    bool packed;
    struct vhd_drv_vq dq[FAKE_NQUEUES];
    int kick[FAKE_NQUEUES], call[FAKE_NQUEUES];
    uint64_t buf_gpa; /* request buffers, 64 bytes per id and queue */
    uint8_t *buf;
};

static void guest_init(struct guest *g, bool packed)
{
    memset(g, 0, sizeof(*g));
    g->packed = packed;
    VHD_CHECK_EQ(vhd_guestmem_init(&g->gm, 1, GUEST_SIZE, GUEST_GPA, 0), 0);
    for (int i = 0; i < FAKE_NQUEUES; i++) {
        struct vhd_drv_vq_params p = {.size = QSIZE, .packed = packed, .max_indirect = 4};
        p.area_len = vhd_drv_vq_area_size(QSIZE, packed, 4);
        p.area_gpa = vhd_guestmem_alloc(&g->gm, p.area_len, 4096, &p.area);
        VHD_CHECK(p.area_gpa != UINT64_MAX);
        VHD_CHECK_EQ(vhd_drv_vq_init(&g->dq[i], &p), 0);
        g->kick[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        g->call[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        VHD_CHECK(g->kick[i] >= 0 && g->call[i] >= 0);
    }
    void *b;
    g->buf_gpa = vhd_guestmem_alloc(&g->gm, FAKE_NQUEUES * QSIZE * 64, 64, &b);
    VHD_CHECK(g->buf_gpa != UINT64_MAX);
    g->buf = b;
}

static void guest_fini(struct guest *g)
{
    for (int i = 0; i < FAKE_NQUEUES; i++) {
        vhd_drv_vq_fini(&g->dq[i]);
        close(g->kick[i]);
        close(g->call[i]);
    }
    vhd_guestmem_fini(&g->gm);
}

static uint64_t g_uva(struct guest *g, uint64_t gpa)
{
    return vhd_guestmem_uva(&g->gm, gpa);
}

static void s_mem_table(struct sess *s, struct guest *g)
{
    struct vu_mem_table m = {.nregions = 1};
    m.regions[0].gpa = g->gm.r[0].gpa;
    m.regions[0].size = g->gm.r[0].size;
    m.regions[0].uva = g_uva(g, g->gm.r[0].gpa);
    m.regions[0].mmap_offset = 0;
    s_set_ok(s, VHOST_USER_SET_MEM_TABLE, &m, VU_MEM_TABLE_HDR_SIZE + 32, &g->gm.r[0].fd, 1);
}

static void s_vring_addr(struct sess *s, struct guest *g, uint32_t i)
{
    struct vu_vring_addr a = {
        .index = i,
        .desc = g_uva(g, g->dq[i].desc_gpa),
        .avail = g_uva(g, g->dq[i].avail_gpa),
        .used = g_uva(g, g->dq[i].used_gpa),
    };
    s_set_ok(s, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
}

static void s_vring_fd(struct sess *s, uint32_t req, uint32_t i, int fd)
{
    uint64_t v = i | (fd < 0 ? VHOST_USER_VRING_NOFD_MASK : 0);
    s_set_ok(s, req, &v, sizeof(v), fd < 0 ? NULL : &fd, fd < 0 ? 0 : 1);
}

/* Set up queue i as QEMU does: NUM, BASE, ADDR, KICK, CALL (+ ENABLE if asked). */
static void s_start_queue(struct sess *s, struct guest *g, uint32_t i, bool enable)
{
    s_set_state(s, VHOST_USER_SET_VRING_NUM, i, QSIZE);
    /* A fresh ring: index 0; packed: both wrap counters 1 (virtio 1.2, 2.8.1). */
    s_set_state(s, VHOST_USER_SET_VRING_BASE, i, g->packed ? (1u << 15 | 1u << 31) : 0);
    s_vring_addr(s, g, i);
    s_vring_fd(s, VHOST_USER_SET_VRING_KICK, i, g->kick[i]);
    s_vring_fd(s, VHOST_USER_SET_VRING_CALL, i, g->call[i]);
    if (enable)
        s_set_state(s, VHOST_USER_SET_VRING_ENABLE, i, 1);
}

static uint64_t guest_features(bool packed)
{
    return BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_F_INDIRECT_DESC) |
           (packed ? BIT(VIRTIO_F_RING_PACKED) : 0) | BIT(VHOST_USER_F_PROTOCOL_FEATURES);
}

/* Full bring-up of both queues with protocol features `proto`. */
static void sess_up(struct sess *s, int devi, struct guest *g, uint64_t proto)
{
    sess_open(s, devi, proto);
    s_set_u64(s, VHOST_USER_SET_FEATURES, guest_features(g->packed));
    s_mem_table(s, g);
    for (uint32_t i = 0; i < FAKE_NQUEUES; i++)
        s_start_queue(s, g, i, true);
}

/* Submit one request on queue i with tag; op 1 = completes after delay_ms. */
static void g_submit(struct guest *g, uint32_t i, uint64_t tag, uint32_t op, uint32_t delay_ms)
{
    uint32_t slot = (uint32_t)(tag % QSIZE);
    uint64_t base = g->buf_gpa + ((uint64_t)i * QSIZE + slot) * 64;
    struct fake_hdr h = {.op = op, .delay_ms = delay_ms, .tag = tag};
    memcpy(g->buf + (base - g->buf_gpa), &h, sizeof(h));
    memset(g->buf + (base - g->buf_gpa) + 32, 0, 32);
    struct vhd_drv_buf bufs[2] = {{base, sizeof(h)}, {base + 32, 32}};
    VHD_CHECK_EQ(vhd_drv_vq_add(&g->dq[i], bufs, 1, 1, false, (void *)(uintptr_t)(tag + 1)), 0);
    vhd_drv_vq_publish(&g->dq[i]);
    uint64_t one = 1;
    VHD_CHECK_EQ(write(g->kick[i], &one, sizeof(one)), 8);
}

/* Wait up to ms for one completion on queue i; returns its tag or -1 on timeout. */
static int64_t g_wait(struct guest *g, uint32_t i, int ms)
{
    uint64_t t0 = now_ms();
    for (;;) {
        void *cookie;
        uint32_t len;
        int rc = vhd_drv_vq_get_used(&g->dq[i], &cookie, &len);
        VHD_CHECK(rc >= 0);
        if (rc == 1) {
            uint64_t tag = (uint64_t)(uintptr_t)cookie - 1;
            uint32_t slot = (uint32_t)(tag % QSIZE);
            struct fake_resp resp;
            memcpy(&resp, g->buf + ((uint64_t)i * QSIZE + slot) * 64 + 32, sizeof(resp));
            VHD_CHECK_EQ(len, sizeof(resp));
            VHD_CHECK_EQ(resp.tag, tag ^ FAKE_MAGIC);
            VHD_CHECK_EQ(resp.queue, i);
            return (int64_t)tag;
        }
        if (now_ms() - t0 > (uint64_t)ms)
            return -1;
        usleep(200);
    }
}

/* One request round trip on queue i. */
static void g_roundtrip(struct guest *g, uint32_t i, uint64_t tag)
{
    g_submit(g, i, tag, 0, 0);
    VHD_CHECK_EQ(g_wait(g, i, TIMEOUT_MS), (int64_t)tag);
}

/* The call eventfd was signalled. */
static bool g_called(struct guest *g, uint32_t i)
{
    uint64_t v;
    return read(g->call[i], &v, sizeof(v)) == 8;
}

/* =====================================================================
 * Tests
 * ===================================================================== */

static void happy_path(bool packed)
{
    struct guest g;
    struct sess s;

    env_up();
    int fds0 = count_fds();
    guest_init(&g, packed);
    sess_up(&s, 0, &g, PROTO_ALL);
    VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_QUEUE_NUM), FAKE_NQUEUES);
    VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_MAX_MEM_SLOTS), 509);
    VHD_CHECK_EQ(fcount(&E.fdev[0], &E.fdev[0].queue_inits), FAKE_NQUEUES);

    for (uint64_t t = 0; t < 3 * QSIZE; t++)
        g_roundtrip(&g, (uint32_t)(t & 1), t);
    VHD_CHECK(g_called(&g, 0) && g_called(&g, 1));

    /* GET_VRING_BASE stops the ring and answers the next avail index. */
    struct vu_vring_state st = {.index = 0, .num = 0};
    cli_send(s.fd, VHOST_USER_GET_VRING_BASE, VHOST_USER_VERSION, &st, sizeof(st), NULL, 0);
    VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_VRING_BASE, &st, sizeof(st)), 8);
    VHD_CHECK_EQ(st.index, 0);
    if (!packed) {
        VHD_CHECK_EQ(st.num, 3 * QSIZE / 2);
    } else {
        /* 96 two-descriptor requests: 192 slots of a 64-slot ring, wrap counters from 1. */
        uint32_t slots = 3 * QSIZE / 2 * 2, idx = slots % QSIZE, wrap = 1 ^ ((slots / QSIZE) & 1);
        uint32_t want = idx | wrap << 15 | idx << 16 | wrap << 31;
        VHD_CHECK_EQ(st.num, want);
    }
    VHD_CHECK_EQ(fcount(&E.fdev[0], &E.fdev[0].queue_finis), 1);
    /* A stopped ring is not processed. */
    g_submit(&g, 0, 1000, 0, 0);
    VHD_CHECK_EQ(g_wait(&g, 0, 200), -1);
    /* Restart it as QEMU does (same base, new kick), and the request completes. */
    s_set_state(&s, VHOST_USER_SET_VRING_BASE, 0, st.num);
    s_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, g.kick[0]);
    VHD_CHECK_EQ(g_wait(&g, 0, TIMEOUT_MS), 1000);
    g_roundtrip(&g, 1, 1001);

    sess_close(&s);
    /* The disconnect resets the device. */
    uint64_t t0 = now_ms();
    while (fcount(&E.fdev[0], &E.fdev[0].resets) < 1 && now_ms() - t0 < TIMEOUT_MS)
        usleep(1000);
    VHD_CHECK_EQ(fcount(&E.fdev[0], &E.fdev[0].resets), 1);
    VHD_CHECK_EQ(fcount(&E.fdev[0], &E.fdev[0].queue_finis), FAKE_NQUEUES + 1);
    VHD_CHECK_EQ(fcount(&E.fdev[0], &E.fdev[0].fini_with_inflight), 0);
    guest_fini(&g);
    /* Every fd the server received was closed, every mapping dropped. */
    wait_fds(fds0);

    /* The device waits for the next front-end and serves it. */
    guest_init(&g, packed);
    sess_up(&s, 0, &g, PROTO_ALL);
    g_roundtrip(&g, 0, 7);
    g_roundtrip(&g, 1, 8);
    sess_close(&s);
    guest_fini(&g);
    env_down();
}

VHD_TEST(vu_happy_path_split)
{
    happy_path(false);
}

VHD_TEST(vu_happy_path_packed)
{
    happy_path(true);
}

/* GET_VRING_BASE waits for in-flight requests: the used ring holds them before the reply. */
VHD_TEST(vu_get_vring_base_drains_inflight)
{
    struct guest g;
    struct sess s;

    env_up();
    guest_init(&g, false);
    sess_up(&s, 0, &g, PROTO_ALL);
    for (uint64_t t = 0; t < 8; t++)
        g_submit(&g, 0, t, 1, 300); /* each completes 300 ms after it was popped */
    /* The worker popped all 8 (their timers run) before the ring is stopped. */
    uint64_t t0 = now_ms();
    while (fcount(&E.fdev[0], &E.fdev[0].popped) < 8 && now_ms() - t0 < TIMEOUT_MS)
        usleep(1000);
    VHD_CHECK_EQ(fcount(&E.fdev[0], &E.fdev[0].popped), 8);
    t0 = now_ms();
    struct vu_vring_state st = {.index = 0};
    cli_send(s.fd, VHOST_USER_GET_VRING_BASE, VHOST_USER_VERSION, &st, sizeof(st), NULL, 0);
    VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_VRING_BASE, &st, sizeof(st)), 8);
    VHD_CHECK(now_ms() - t0 >= 150); /* it waited for the timers */
    VHD_CHECK_EQ(st.num, 8);
    /* All 8 completions are already in the used ring: no waiting now. */
    for (int k = 0; k < 8; k++)
        VHD_CHECK(g_wait(&g, 0, 0) >= 0);
    VHD_CHECK_EQ(fcount(&E.fdev[0], &E.fdev[0].fini_with_inflight), 0);
    sess_close(&s);
    guest_fini(&g);
    env_down();
}

VHD_TEST(vu_reply_ack)
{
    struct guest g;
    struct sess s;

    env_up();
    guest_init(&g, false);
    sess_open(&s, 0, PROTO_ALL);
    /* Success acks 0, failure non-zero, and the session goes on. */
    VHD_CHECK_EQ(s_set(&s, VHOST_USER_SET_FEATURES, &(uint64_t){guest_features(false)}, 8, NULL, 0),
                 0);
    struct vu_vring_state st = {.index = 0, .num = 3}; /* split: not a power of two */
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), NULL, 0) != 0);
    st.num = 0;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), NULL, 0) != 0);
    st.num = 32768 * 2;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), NULL, 0) != 0);
    st.num = 32768;
    VHD_CHECK_EQ(s_set(&s, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), NULL, 0), 0);
    /* Unknown request with NEED_REPLY: a non-zero ack, connection kept. */
    VHD_CHECK(s_set(&s, 99, NULL, 0, NULL, 0) != 0);
    /* Known but not offered (SET_LOG_BASE without LOG_SHMFD). */
    VHD_CHECK(s_set(&s, VHOST_USER_SET_LOG_BASE, &(struct vu_log){0}, 16, NULL, 0) != 0);
    /* Bad size. */
    VHD_CHECK(s_set(&s, VHOST_USER_SET_FEATURES, &st, 4, NULL, 0) != 0);
    /* Features not offered. */
    VHD_CHECK(s_set(&s, VHOST_USER_SET_FEATURES, &(uint64_t){BIT(VHOST_F_LOG_ALL)}, 8, NULL, 0) !=
              0);
    /* The device refusing the features (no VERSION_1). */
    VHD_CHECK(s_set(&s, VHOST_USER_SET_FEATURES, &(uint64_t){0}, 8, NULL, 0) != 0);
    /* A request with its own reply gets exactly that reply, no extra ack. */
    cli_send(s.fd, VHOST_USER_GET_FEATURES, VHOST_USER_VERSION | VHOST_USER_NEED_REPLY_MASK, NULL,
             0, NULL, 0);
    uint64_t f;
    VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_FEATURES, &f, sizeof(f)), 8);
    VHD_CHECK(f & BIT(VIRTIO_F_VERSION_1));
    VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_STATUS), 0);
    cli_expect_silence(s.fd, 50);
    sess_close(&s);

    /* Without REPLY_ACK negotiated, NEED_REPLY is ignored: no ack. */
    sess_open(&s, 0, BIT(VHOST_USER_PROTOCOL_F_MQ));
    cli_send(s.fd, VHOST_USER_SET_FEATURES, VHOST_USER_VERSION | VHOST_USER_NEED_REPLY_MASK,
             &(uint64_t){guest_features(false)}, 8, NULL, 0);
    cli_expect_silence(s.fd, 100);
    VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_QUEUE_NUM), FAKE_NQUEUES);
    /* ...and a failure it cannot report closes the connection. */
    st.num = 3;
    cli_send(s.fd, VHOST_USER_SET_VRING_NUM, VHOST_USER_VERSION, &st, sizeof(st), NULL, 0);
    cli_expect_closed(s.fd);
    sess_close(&s);
    guest_fini(&g);
    env_down();
}

VHD_TEST(vu_config)
{
    struct sess s;
    struct vu_config cfg;
    int n;

    env_up();
    sess_open(&s, 0, PROTO_ALL);
    /* Whole space. */
    memset(&cfg, 0, sizeof(cfg));
    cfg.size = FAKE_CONFIG_SIZE;
    cli_send(s.fd, VHOST_USER_GET_CONFIG, VHOST_USER_VERSION, &cfg, 12 + cfg.size, NULL, 0);
    n = cli_reply(s.fd, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg));
    VHD_CHECK_EQ(n, 12 + FAKE_CONFIG_SIZE);
    VHD_CHECK_EQ(cfg.size, FAKE_CONFIG_SIZE);
    VHD_CHECK_EQ(cfg.region[3], 0x13);
    /* Part of it. */
    memset(&cfg, 0, sizeof(cfg));
    cfg.offset = 4;
    cfg.size = 4;
    cli_send(s.fd, VHOST_USER_GET_CONFIG, VHOST_USER_VERSION, &cfg, 12 + cfg.size, NULL, 0);
    n = cli_reply(s.fd, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg));
    VHD_CHECK_EQ(n, 16);
    VHD_CHECK_EQ(cfg.offset, 4);
    VHD_CHECK_EQ(cfg.region[0], 0x14);
    /* Out of bounds: offset + size beyond the space, wrap-around, size 0: empty reply. */
    const uint32_t bad[][2] = {{8, 16}, {16, 1}, {0xffffffffu, 2}, {0, 0}, {17, 0}};
    for (unsigned k = 0; k < VHD_ARRAY_SIZE(bad); k++) {
        memset(&cfg, 0, sizeof(cfg));
        cfg.offset = bad[k][0];
        cfg.size = bad[k][1];
        cli_send(s.fd, VHOST_USER_GET_CONFIG, VHOST_USER_VERSION, &cfg, 12 + cfg.size, NULL, 0);
        VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg)), 0);
    }
    /* size field and payload size disagree; size above 256. */
    memset(&cfg, 0, sizeof(cfg));
    cfg.size = 8;
    cli_send(s.fd, VHOST_USER_GET_CONFIG, VHOST_USER_VERSION, &cfg, 12 + 4, NULL, 0);
    VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg)), 0);
    cfg.size = 257;
    cli_send(s.fd, VHOST_USER_GET_CONFIG, VHOST_USER_VERSION, &cfg, 12, NULL, 0);
    VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg)), 0);
    /* SET_CONFIG: the writable byte, then a read-only one (refused unless migrating). */
    memset(&cfg, 0, sizeof(cfg));
    cfg.offset = 8;
    cfg.size = 1;
    cfg.region[0] = 0x77;
    s_set_ok(&s, VHOST_USER_SET_CONFIG, &cfg, 13, NULL, 0);
    cfg.offset = 2;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_CONFIG, &cfg, 13, NULL, 0) != 0);
    cfg.flags = VHOST_USER_CONFIG_FLAG_MIGRATION;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_CONFIG, &cfg, 13, NULL, 0) != 0); /* differs */
    cfg.region[0] = 0x12;                                                /* same value */
    VHD_CHECK_EQ(s_set(&s, VHOST_USER_SET_CONFIG, &cfg, 13, NULL, 0), 0);
    cfg.flags = 2;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_CONFIG, &cfg, 13, NULL, 0) != 0);
    memset(&cfg, 0, sizeof(cfg));
    cfg.size = FAKE_CONFIG_SIZE;
    cli_send(s.fd, VHOST_USER_GET_CONFIG, VHOST_USER_VERSION, &cfg, 12 + cfg.size, NULL, 0);
    VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg)), 28);
    VHD_CHECK_EQ(cfg.region[8], 0x77);
    sess_close(&s);

    /* Without CONFIG negotiated GET_CONFIG is refused (empty reply). */
    sess_open(&s, 0, BIT(VHOST_USER_PROTOCOL_F_MQ));
    memset(&cfg, 0, sizeof(cfg));
    cfg.size = 4;
    cli_send(s.fd, VHOST_USER_GET_CONFIG, VHOST_USER_VERSION, &cfg, 16, NULL, 0);
    VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg)), 0);
    sess_close(&s);
    env_down();
}

/* Spec "Ring states". */
VHD_TEST(vu_ring_states)
{
    struct guest g;
    struct sess s;

    env_up();
    /* Without PROTOCOL_FEATURES acked in SET_FEATURES, rings are enabled at once. */
    guest_init(&g, false);
    sess_open(&s, 0, PROTO_ALL);
    s_set_u64(&s, VHOST_USER_SET_FEATURES,
              guest_features(false) & ~BIT(VHOST_USER_F_PROTOCOL_FEATURES));
    s_mem_table(&s, &g);
    s_start_queue(&s, &g, 0, false);
    g_roundtrip(&g, 0, 1);
    sess_close(&s);
    guest_fini(&g);

    /* With it, a started ring stays disabled (not processed) until SET_VRING_ENABLE 1. */
    guest_init(&g, true);
    sess_open(&s, 0, PROTO_ALL);
    s_set_u64(&s, VHOST_USER_SET_FEATURES, guest_features(true));
    s_mem_table(&s, &g);
    s_start_queue(&s, &g, 0, false);
    g_submit(&g, 0, 2, 0, 0);
    VHD_CHECK_EQ(g_wait(&g, 0, 300), -1);
    s_set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 1);
    VHD_CHECK_EQ(g_wait(&g, 0, TIMEOUT_MS), 2);
    /* Disabled again: not processed; re-enabled: processed. */
    s_set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 0);
    g_submit(&g, 0, 3, 0, 0);
    VHD_CHECK_EQ(g_wait(&g, 0, 300), -1);
    s_set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 1);
    VHD_CHECK_EQ(g_wait(&g, 0, TIMEOUT_MS), 3);
    /* Enabled before started: takes effect when the kick fd starts it. */
    s_set_state(&s, VHOST_USER_SET_VRING_ENABLE, 1, 1);
    s_start_queue(&s, &g, 1, false);
    g_roundtrip(&g, 1, 4);
    /* Enable values other than 0/1 are refused. */
    struct vu_vring_state st = {.index = 1, .num = 2};
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_ENABLE, &st, sizeof(st), NULL, 0) != 0);
    /* RESET_OWNER disables all rings but keeps their state. */
    s_set_ok(&s, VHOST_USER_RESET_OWNER, NULL, 0, NULL, 0);
    g_submit(&g, 1, 5, 0, 0);
    VHD_CHECK_EQ(g_wait(&g, 1, 300), -1);
    s_set_state(&s, VHOST_USER_SET_VRING_ENABLE, 1, 1);
    VHD_CHECK_EQ(g_wait(&g, 1, TIMEOUT_MS), 5);
    /* The call fd can change while the ring runs. */
    int call2 = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s_vring_fd(&s, VHOST_USER_SET_VRING_CALL, 1, call2);
    (void)g_called(&g, 1);
    g_roundtrip(&g, 1, 6);
    /* The guest polls its used ring: the call may follow the publication by a moment. */
    struct pollfd cp = {.fd = call2, .events = POLLIN};
    VHD_CHECK_EQ(poll(&cp, 1, TIMEOUT_MS), 1);
    uint64_t v;
    VHD_CHECK_EQ(read(call2, &v, 8), 8);
    VHD_CHECK(!g_called(&g, 1));
    close(call2);
    /* Kick fd without fd (polling). */
    s_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 1, -1);
    g_roundtrip(&g, 1, 7);
    /* Changes of a started ring's size/base are refused. */
    st.num = 32;
    st.index = 1;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_NUM, &st, sizeof(st), NULL, 0) != 0);
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_BASE, &st, sizeof(st), NULL, 0) != 0);
    /* RESET_DEVICE stops everything; the ring starts again only after a new set-up. */
    st.index = 0;
    st.num = 0;
    cli_send(s.fd, VHOST_USER_GET_VRING_BASE, V1, &st, sizeof(st), NULL, 0);
    VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_VRING_BASE, &st, sizeof(st)), 8);
    uint32_t base0 = st.num;
    s_set_ok(&s, VHOST_USER_RESET_DEVICE, NULL, 0, NULL, 0);
    g_submit(&g, 0, 8, 0, 0);
    VHD_CHECK_EQ(g_wait(&g, 0, 300), -1);
    uint64_t k0 = 0;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_KICK, &k0, 8, &g.kick[0], 1) != 0); /* no set-up */
    /* Set up again (features, ring; the call fd survives the reset) and it runs. */
    s_set_u64(&s, VHOST_USER_SET_FEATURES, guest_features(true));
    s_set_state(&s, VHOST_USER_SET_VRING_NUM, 0, QSIZE);
    s_set_state(&s, VHOST_USER_SET_VRING_BASE, 0, base0);
    s_vring_addr(&s, &g, 0);
    s_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, g.kick[0]);
    (void)g_called(&g, 0);
    s_set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 1);
    VHD_CHECK_EQ(g_wait(&g, 0, TIMEOUT_MS), 8);
    uint64_t t0 = now_ms();
    while (!g_called(&g, 0))
        VHD_CHECK(now_ms() - t0 < TIMEOUT_MS);
    sess_close(&s);
    guest_fini(&g);
    env_down();
}

/* Memory table changes while rings run. */
VHD_TEST(vu_mem_table_changes)
{
    struct guest g;
    struct sess s;

    env_up();
    guest_init(&g, false);
    sess_up(&s, 0, &g, PROTO_ALL);
    g_roundtrip(&g, 0, 1);
    /* Resend the same table (QEMU does on every layout change): rings keep going. */
    s_mem_table(&s, &g);
    g_roundtrip(&g, 0, 2);
    g_roundtrip(&g, 1, 3);
    /* Add a second region, then remove it again. */
    int mfd = memfd_create("extra", MFD_CLOEXEC);
    VHD_CHECK(mfd >= 0 && ftruncate(mfd, 1 << 20) == 0);
    struct vu_mem_single r = {0};
    r.region.gpa = 0x100000000ull;
    r.region.size = 1 << 20;
    r.region.uva = 0x100000000000ull;
    s_set_ok(&s, VHOST_USER_ADD_MEM_REG, &r, sizeof(r), &mfd, 1);
    g_roundtrip(&g, 0, 4);
    s_set_ok(&s, VHOST_USER_REM_MEM_REG, &r, sizeof(r), NULL, 0);
    VHD_CHECK(s_set(&s, VHOST_USER_REM_MEM_REG, &r, sizeof(r), NULL, 0) != 0); /* gone */
    /* Removing the region that holds started rings is refused. */
    struct vu_mem_single r0 = {0};
    r0.region.gpa = g.gm.r[0].gpa;
    r0.region.size = g.gm.r[0].size;
    r0.region.uva = g_uva(&g, g.gm.r[0].gpa);
    VHD_CHECK(s_set(&s, VHOST_USER_REM_MEM_REG, &r0, sizeof(r0), NULL, 0) != 0);
    /* So is a new table without them. */
    struct vu_mem_table m = {.nregions = 1};
    m.regions[0] = r.region;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_MEM_TABLE, &m, 8 + 32, &mfd, 1) != 0);
    g_roundtrip(&g, 0, 5);
    g_roundtrip(&g, 1, 6);
    close(mfd);
    sess_close(&s);
    guest_fini(&g);
    env_down();
}

/* Up to 509 regions with ADD_MEM_REG; the 510th is refused. */
VHD_TEST(vu_mem_slots_limit)
{
    struct sess s;

    env_up();
    int fds0 = count_fds();
    sess_open(&s, 0, PROTO_ALL);
    long page = sysconf(_SC_PAGESIZE);
    int mfd = memfd_create("slots", MFD_CLOEXEC);
    VHD_CHECK(mfd >= 0 && ftruncate(mfd, page * 510) == 0);
    for (int i = 0; i < 510; i++) {
        struct vu_mem_single r = {0};
        r.region.gpa = (uint64_t)i * 0x100000;
        r.region.size = (uint64_t)page;
        r.region.uva = 0x10000000000ull + (uint64_t)i * 0x100000;
        r.region.mmap_offset = (uint64_t)i * (uint64_t)page;
        uint64_t rc = s_set(&s, VHOST_USER_ADD_MEM_REG, &r, sizeof(r), &mfd, 1);
        if (i < 509)
            VHD_CHECK_EQ(rc, 0);
        else
            VHD_CHECK(rc != 0);
    }
    close(mfd);
    sess_close(&s);
    /* All 509 mappings and fds are gone after the disconnect. */
    wait_fds(fds0);
    env_down();
}

/* SET_MEM_TABLE of one region of `size` bytes of fd at gpa 0; the ack value. */
static uint64_t s_mem_one(struct sess *s, int fd, uint64_t size, uint64_t uva)
{
    struct vu_mem_table m = {.nregions = 1};
    m.regions[0].size = size;
    m.regions[0].uva = uva;
    return s_set(s, VHOST_USER_SET_MEM_TABLE, &m, VU_MEM_TABLE_HDR_SIZE + 32, &fd, 1);
}

/*
 * Issue 12: the guest memory a session maps is capped per device and for
 * the process (mem.h). Sparse memfds: nothing is allocated. Device 0 has a
 * cap of 8 MiB, the process one of 12 MiB. A table or a region beyond a cap
 * is refused (NACK) and the session goes on; a device may replace its own
 * table up to the cap (its current table does not count against it).
 */
VHD_TEST(vu_guest_mem_caps)
{
    const uint64_t mib = 1ull << 20;
    struct sess s0, s1;

    env_up();
    E.fdev[0].dev.max_mem = 8 * mib; /* before any session: the control thread reads it then */
    vhd_mem_set_total_max(12 * mib);
    int mfd = memfd_create("caps", MFD_CLOEXEC);
    VHD_CHECK(mfd >= 0 && ftruncate(mfd, (off_t)(64 * mib)) == 0);
    sess_open(&s0, 0, PROTO_ALL);
    VHD_CHECK(s_mem_one(&s0, mfd, 16 * mib, 0x10000000000ull) != 0); /* device cap */
    VHD_CHECK_EQ(vhd_mem_mapped(), 0);
    VHD_CHECK_EQ(s_mem_one(&s0, mfd, 8 * mib, 0x10000000000ull), 0);
    struct vu_mem_single r = {0};
    r.region.gpa = 16 * mib;
    r.region.size = mib;
    r.region.uva = 0x20000000000ull;
    VHD_CHECK(s_set(&s0, VHOST_USER_ADD_MEM_REG, &r, sizeof(r), &mfd, 1) != 0); /* 9 MiB */
    VHD_CHECK_EQ(vhd_mem_mapped(), 8 * mib);

    sess_open(&s1, 1, PROTO_ALL); /* no cap of its own: the process's applies */
    VHD_CHECK(s_mem_one(&s1, mfd, 8 * mib, 0x30000000000ull) != 0); /* 8 + 8 > 12 */
    VHD_CHECK_EQ(s_mem_one(&s1, mfd, 4 * mib, 0x30000000000ull), 0);
    VHD_CHECK_EQ(vhd_mem_mapped(), 12 * mib);
    /* Device 0 replaces its 8 MiB by another 8 MiB: 4 + 8 fits. */
    VHD_CHECK_EQ(s_mem_one(&s0, mfd, 8 * mib, 0x40000000000ull), 0);
    VHD_CHECK(s_set(&s1, VHOST_USER_ADD_MEM_REG, &r, sizeof(r), &mfd, 1) != 0); /* 13 MiB */
    /* Both sessions still answer. */
    VHD_CHECK_EQ(cli_get_u64(s0.fd, VHOST_USER_GET_QUEUE_NUM), FAKE_NQUEUES);
    VHD_CHECK_EQ(cli_get_u64(s1.fd, VHOST_USER_GET_QUEUE_NUM), FAKE_NQUEUES);
    sess_close(&s0);
    sess_close(&s1);
    close(mfd);
    uint64_t t0 = now_ms();
    while (vhd_mem_mapped() != 0 && now_ms() - t0 < TIMEOUT_MS)
        usleep(1000);
    VHD_CHECK_EQ(vhd_mem_mapped(), 0);
    vhd_mem_set_total_max(0);
    VHD_CHECK_EQ(vhd_mem_total_max(), VHD_MEM_TOTAL_MAX_DEFAULT);
    env_down();
}

/* One malformed-input case: what to send, and what must happen. */
enum expect { EXPECT_CLOSE, EXPECT_NACK, EXPECT_EMPTY };

/*
 * Run `abuse` on device 0 from a fresh session, while device 1 keeps
 * completing requests on the same loop and runtime; then check that device
 * 0 still serves a new session and that no fd leaked.
 */
struct bg {
    struct guest g;
    struct sess s;
    int stop; /* atomic */
    uint64_t done;
    pthread_t thr;
};

static void *bg_thread(void *arg)
{
    struct bg *b = arg;
    uint64_t t = 0;
    while (!__atomic_load_n(&b->stop, __ATOMIC_ACQUIRE)) {
        g_submit(&b->g, (uint32_t)(t & 1), t, 0, 0);
        if (g_wait(&b->g, (uint32_t)(t & 1), TIMEOUT_MS) != (int64_t)t) {
            fprintf(stderr, "  background device stalled at request %llu\n", (unsigned long long)t);
            exit(1);
        }
        t++;
    }
    b->done = t;
    return NULL;
}

static void check_dev0_serves(void)
{
    struct guest g;
    struct sess s;
    guest_init(&g, false);
    sess_up(&s, 0, &g, PROTO_ALL);
    g_roundtrip(&g, 0, 11);
    g_roundtrip(&g, 1, 12);
    sess_close(&s);
    guest_fini(&g);
}

/* A connect that gets served means the old session ended. */
static void wait_session_gone(int devi)
{
    uint64_t f;
    close(cli_connect_session(devi, &f));
}

/* A memfd of `size` bytes. */
static int mk_memfd(uint64_t size)
{
    int fd = memfd_create("abuse", MFD_CLOEXEC);
    VHD_CHECK(fd >= 0 && ftruncate(fd, (off_t)size) == 0);
    return fd;
}

static int mk_eventfd(void)
{
    int fd = eventfd(0, EFD_CLOEXEC);
    VHD_CHECK(fd >= 0);
    return fd;
}

/* A raw message for the abuse cases. */
struct abuse {
    const char *name;
    uint64_t proto; /* protocol features of the session */
    bool features;  /* SET_FEATURES + memory table first */
    uint32_t req, flags, size;
    union vu_payload p;
    int nfds; /* fds to attach (memfds of 1 MiB, or eventfds) */
    bool eventfds;
    enum expect expect;
    size_t raw_len; /* >0: send only this many bytes of header+payload, then close */
};

static void run_abuse(const struct abuse *a, struct guest *g)
{
    struct sess s;
    int fds[16];

    if (getenv("VHD_TEST_DEBUG"))
        fprintf(stderr, "  abuse: %s\n", a->name);
    int fds0 = count_fds();
    sess_open(&s, 0, a->proto);
    if (a->features) {
        s_set_u64(&s, VHOST_USER_SET_FEATURES, guest_features(false));
        s_mem_table(&s, g);
    }
    for (int i = 0; i < a->nfds; i++)
        fds[i] = a->eventfds ? mk_eventfd() : mk_memfd(1 << 20);
    if (a->raw_len) {
        uint8_t buf[sizeof(struct vu_hdr) + sizeof(union vu_payload)];
        struct vu_hdr h = {a->req, a->flags, a->size};
        memcpy(buf, &h, sizeof(h));
        memcpy(buf + sizeof(h), &a->p, sizeof(a->p));
        cli_send_raw(s.fd, buf, a->raw_len, fds, (unsigned)a->nfds);
        shutdown(s.fd, SHUT_WR);
        cli_expect_closed(s.fd);
    } else {
        static uint8_t payload[4096];
        memset(payload, 0, sizeof(payload));
        memcpy(payload, &a->p, sizeof(a->p));
        cli_send(s.fd, a->req, a->flags, payload, a->size, fds, (unsigned)a->nfds);
        if (a->expect == EXPECT_CLOSE) {
            cli_expect_closed(s.fd);
        } else if (a->expect == EXPECT_EMPTY) {
            uint8_t r[512];
            VHD_CHECK_EQ(cli_reply(s.fd, a->req, r, sizeof(r)), 0);
            VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_QUEUE_NUM), FAKE_NQUEUES);
        } else {
            uint64_t v = 0;
            VHD_CHECK_EQ(cli_reply(s.fd, a->req, &v, sizeof(v)), 8);
            VHD_CHECK(v != 0);
            /* Still serving this session. */
            VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_QUEUE_NUM), FAKE_NQUEUES);
        }
    }
    for (int i = 0; i < a->nfds; i++)
        close(fds[i]);
    sess_close(&s);
    wait_session_gone(0);
    /* Whatever the server received was closed (and unmapped). */
    wait_fds(fds0);
}

#define NR    (VHOST_USER_VERSION | VHOST_USER_NEED_REPLY_MASK)
#define ACK   BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK)
#define SLOTS BIT(VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS)

static struct abuse *abuse_cases(size_t *n)
{
    static struct abuse c[64];
    size_t k = 0;

#define CASE(...) c[k++] = (struct abuse){__VA_ARGS__}
    CASE(.name = "version 0", .req = VHOST_USER_GET_FEATURES, .flags = 0, .expect = EXPECT_CLOSE);
    CASE(.name = "version 2", .req = VHOST_USER_GET_FEATURES, .flags = 2, .expect = EXPECT_CLOSE);
    CASE(.name = "reply flag in a request", .req = VHOST_USER_SET_OWNER,
         .flags = V1 | VHOST_USER_REPLY_MASK, .expect = EXPECT_CLOSE);
    CASE(.name = "unknown flag bit", .req = VHOST_USER_SET_OWNER, .flags = V1 | 0x100,
         .expect = EXPECT_CLOSE);
    CASE(.name = "unknown request", .req = 1234, .flags = V1, .expect = EXPECT_CLOSE);
    CASE(.name = "unknown request, acked", .proto = ACK, .req = 1234, .flags = NR,
         .expect = EXPECT_NACK);
    CASE(.name = "request 0", .proto = ACK, .req = 0, .flags = NR, .expect = EXPECT_NACK);
    CASE(.name = "oversized payload", .req = VHOST_USER_SET_OWNER, .flags = V1, .size = 4096,
         .expect = EXPECT_CLOSE);
    CASE(.name = "oversized payload, acked", .proto = ACK, .req = VHOST_USER_SET_OWNER, .flags = NR,
         .size = 269, .expect = EXPECT_CLOSE);
    CASE(.name = "bad size SET_FEATURES", .proto = ACK, .req = VHOST_USER_SET_FEATURES, .flags = NR,
         .size = 4, .expect = EXPECT_NACK);
    CASE(.name = "bad size GET_FEATURES", .req = VHOST_USER_GET_FEATURES, .flags = V1, .size = 8,
         .expect = EXPECT_CLOSE);
    CASE(.name = "bad size SET_VRING_ADDR", .proto = ACK, .req = VHOST_USER_SET_VRING_ADDR,
         .flags = NR, .size = 32, .expect = EXPECT_NACK);
    CASE(.name = "fd with SET_OWNER", .proto = ACK, .req = VHOST_USER_SET_OWNER, .flags = NR,
         .nfds = 1, .eventfds = true, .expect = EXPECT_NACK);
    CASE(.name = "fd with SET_FEATURES, no ack", .req = VHOST_USER_SET_FEATURES, .flags = V1,
         .size = 8, .p.u64 = BIT(VIRTIO_F_VERSION_1), .nfds = 2, .eventfds = true,
         .expect = EXPECT_CLOSE);
    CASE(.name = "kick without fd and without NOFD", .proto = ACK, .req = VHOST_USER_SET_VRING_KICK,
         .flags = NR, .size = 8, .p.u64 = 0, .expect = EXPECT_NACK);
    CASE(.name = "call with NOFD and an fd", .proto = ACK, .req = VHOST_USER_SET_VRING_CALL,
         .flags = NR, .size = 8, .p.u64 = VHOST_USER_VRING_NOFD_MASK, .nfds = 1, .eventfds = true,
         .expect = EXPECT_NACK);
    CASE(.name = "err with two fds", .proto = ACK, .req = VHOST_USER_SET_VRING_ERR, .flags = NR,
         .size = 8, .p.u64 = 0, .nfds = 2, .eventfds = true, .expect = EXPECT_NACK);
    CASE(.name = "call with reserved bits", .proto = ACK, .req = VHOST_USER_SET_VRING_CALL,
         .flags = NR, .size = 8, .p.u64 = 1ull << 40, .nfds = 1, .eventfds = true,
         .expect = EXPECT_NACK);
    CASE(.name = "nine fds", .req = VHOST_USER_SET_OWNER, .flags = V1, .nfds = 9, .eventfds = true,
         .expect = EXPECT_CLOSE);
    CASE(.name = "ring index >= queues (kick)", .proto = ACK, .req = VHOST_USER_SET_VRING_KICK,
         .flags = NR, .size = 8, .p.u64 = FAKE_NQUEUES, .nfds = 1, .eventfds = true,
         .expect = EXPECT_NACK);
    CASE(.name = "ring index >= queues (num)", .proto = ACK, .req = VHOST_USER_SET_VRING_NUM,
         .flags = NR, .size = 8, .p.state = {255, 64}, .expect = EXPECT_NACK);
    CASE(.name = "ring index >= queues (addr)", .proto = ACK, .req = VHOST_USER_SET_VRING_ADDR,
         .flags = NR, .size = 40, .p.addr = {.index = 0x10000}, .expect = EXPECT_NACK);
    CASE(.name = "ring index >= queues (get base), no reply form", .proto = ACK,
         .req = VHOST_USER_GET_VRING_BASE, .flags = NR, .size = 8, .p.state = {2, 0},
         .expect = EXPECT_CLOSE);
    CASE(.name = "ring index >= queues (enable), no ack", .req = VHOST_USER_SET_VRING_ENABLE,
         .flags = V1, .size = 8, .p.state = {7, 1}, .expect = EXPECT_CLOSE);
    /* Memory tables. */
    {
        struct abuse a = {.name = "10 regions",
                          .proto = ACK,
                          .req = VHOST_USER_SET_MEM_TABLE,
                          .flags = NR,
                          .size = 8 + 8 * 32,
                          .nfds = 8,
                          .expect = EXPECT_NACK};
        a.p.mem.nregions = 10;
        c[k++] = a;
        a.name = "510 regions";
        a.p.mem.nregions = 510;
        c[k++] = a;
        a.name = "region count and size disagree";
        a.p.mem.nregions = 2;
        a.size = 8 + 32;
        a.nfds = 2;
        c[k++] = a;
        a.name = "fewer fds than regions";
        a.size = 8 + 2 * 32;
        a.nfds = 1;
        a.p.mem.regions[0] = (struct vu_mem_region){0, 4096, 0x1000000, 0};
        a.p.mem.regions[1] = (struct vu_mem_region){0x100000, 4096, 0x2000000, 0};
        c[k++] = a;
        a.name = "overlapping regions (gpa)";
        a.nfds = 2;
        a.p.mem.regions[1] = (struct vu_mem_region){0x800, 4096, 0x2000000, 0};
        c[k++] = a;
        a.name = "overlapping regions (uva)";
        a.p.mem.regions[1] = (struct vu_mem_region){0x100000, 4096, 0x1000800, 0};
        c[k++] = a;
        a.name = "mmap offset beyond the file";
        a.p.mem.nregions = 1;
        a.size = 8 + 32;
        a.nfds = 1;
        a.p.mem.regions[0] = (struct vu_mem_region){0, 4096, 0x1000000, 2 << 20};
        c[k++] = a;
        a.name = "region larger than the file";
        a.p.mem.regions[0] = (struct vu_mem_region){0, 2 << 20, 0x1000000, 0};
        c[k++] = a;
        a.name = "zero-size region";
        a.p.mem.regions[0] = (struct vu_mem_region){0, 0, 0x1000000, 0};
        c[k++] = a;
        a.name = "region wraps";
        a.p.mem.regions[0] = (struct vu_mem_region){~0ull - 100, 4096, 0x1000000, 0};
        c[k++] = a;
        a.name = "eventfd as memory";
        a.p.mem.regions[0] = (struct vu_mem_region){0, 4096, 0x1000000, 0};
        a.eventfds = true;
        c[k++] = a;
    }
    {
        struct abuse a = {.name = "ADD_MEM_REG not negotiated",
                          .proto = ACK,
                          .req = VHOST_USER_ADD_MEM_REG,
                          .flags = NR,
                          .size = 40,
                          .nfds = 1,
                          .expect = EXPECT_NACK};
        a.p.mreg.region = (struct vu_mem_region){0, 4096, 0x1000000, 0};
        c[k++] = a;
        a.name = "ADD_MEM_REG without fd";
        a.proto = ACK | SLOTS;
        a.nfds = 0;
        c[k++] = a;
        a.name = "ADD_MEM_REG overlapping the table";
        a.features = true;
        a.nfds = 1;
        a.p.mreg.region = (struct vu_mem_region){GUEST_GPA + 4096, 4096, 0x1000000, 0};
        c[k++] = a;
        a.name = "ADD_MEM_REG offset beyond the file";
        a.p.mreg.region = (struct vu_mem_region){0, 4096, 0x1000000, 1 << 20};
        c[k++] = a;
        a.name = "REM_MEM_REG unknown region";
        a.req = VHOST_USER_REM_MEM_REG;
        a.p.mreg.region = (struct vu_mem_region){0, 4096, 0x1000000, 0};
        c[k++] = a; /* (with an fd: closed unused) */
        a.name = "REM_MEM_REG two fds";
        a.nfds = 2;
        c[k++] = a;
    }
    /* Out of order and rings outside memory. */
    {
        struct abuse a = {.name = "kick before SET_MEM_TABLE",
                          .proto = ACK,
                          .req = VHOST_USER_SET_VRING_KICK,
                          .flags = NR,
                          .size = 8,
                          .p.u64 = 0,
                          .nfds = 1,
                          .eventfds = true,
                          .expect = EXPECT_NACK};
        c[k++] = a;
        a.name = "kick before SET_VRING_NUM/ADDR";
        a.features = true;
        c[k++] = a;
        a.name = "kick before SET_MEM_TABLE, no ack";
        a.features = false;
        a.proto = 0;
        a.flags = V1;
        a.expect = EXPECT_CLOSE;
        c[k++] = a;
    }
    CASE(.name = "GET_CONFIG not negotiated", .req = VHOST_USER_GET_CONFIG, .flags = V1, .size = 16,
         .p.config = {.size = 4}, .expect = EXPECT_EMPTY);
    CASE(.name = "GET_CONFIG huge size field", .proto = BIT(VHOST_USER_PROTOCOL_F_CONFIG),
         .req = VHOST_USER_GET_CONFIG, .flags = V1, .size = 12, .p.config = {.size = 0xffffffffu},
         .expect = EXPECT_EMPTY);
    CASE(.name = "GET_CONFIG with an fd", .proto = BIT(VHOST_USER_PROTOCOL_F_CONFIG),
         .req = VHOST_USER_GET_CONFIG, .flags = V1, .size = 16, .p.config = {.size = 4}, .nfds = 1,
         .eventfds = true, .expect = EXPECT_EMPTY);
    /* Truncated messages: header only partly, payload partly, then EOF. */
    CASE(.name = "truncated header", .req = VHOST_USER_GET_FEATURES, .flags = V1, .raw_len = 7);
    CASE(.name = "truncated payload", .req = VHOST_USER_SET_FEATURES, .flags = V1, .size = 8,
         .raw_len = 12 + 3);
    CASE(.name = "truncated payload with fds", .req = VHOST_USER_SET_MEM_TABLE, .flags = V1,
         .size = 8 + 32, .p.mem = {.nregions = 1}, .nfds = 1, .raw_len = 12 + 20);
#undef CASE
    *n = k;
    return c;
}

/* Cases needing a started session: rings outside memory, misaligned rings. */
static void abuse_rings(struct guest *g)
{
    struct sess s;
    int fds0 = count_fds();

    sess_open(&s, 0, PROTO_ALL);
    s_set_u64(&s, VHOST_USER_SET_FEATURES, guest_features(false));
    s_mem_table(&s, g);
    VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_STATUS) & VIRTIO_STATUS_NEEDS_RESET, 0);
    /* A back-end channel, to see the config change notification of NEEDS_RESET. */
    int bsp[2];
    VHD_CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, bsp), 0);
    s_set_ok(&s, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, &bsp[1], 1);
    close(bsp[1]);
    /* Ring outside guest memory. */
    s_set_state(&s, VHOST_USER_SET_VRING_NUM, 0, QSIZE);
    struct vu_vring_addr a = {
        .index = 0,
        .desc = g_uva(g, g->dq[0].desc_gpa),
        .avail = g_uva(g, g->dq[0].avail_gpa),
        .used = 0x10, /* not in any region */
    };
    s_set_ok(&s, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
    int kfd = mk_eventfd();
    uint64_t v = 0;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_KICK, &v, 8, &kfd, 1) != 0);
    VHD_CHECK(cli_get_u64(s.fd, VHOST_USER_GET_STATUS) & VIRTIO_STATUS_NEEDS_RESET);
    /* Every ring is stopped (suspended device): no message to the front-end. */
    cli_expect_silence(bsp[0], 100);
    /* With another ring running, the same failure sends CONFIG_CHANGE. */
    s_set_u64(&s, VHOST_USER_SET_STATUS, 0);
    s_start_queue(&s, g, 1, true);
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_KICK, &v, 8, &kfd, 1) != 0);
    struct vu_hdr bh;
    uint8_t bp[16];
    VHD_CHECK_EQ(cli_recv(bsp[0], &bh, bp, sizeof(bp), TIMEOUT_MS), 0);
    VHD_CHECK_EQ(bh.request, VHOST_USER_BACKEND_CONFIG_CHANGE_MSG);
    VHD_CHECK_EQ(bh.flags, VHOST_USER_VERSION);
    close(bsp[0]);
    /* The ring end crosses out of the region. */
    a.used = g_uva(g, g->gm.r[0].gpa + g->gm.r[0].size - 8);
    s_set_ok(&s, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_KICK, &v, 8, &kfd, 1) != 0);
    /* Misaligned ring addresses are refused at once. */
    a.used = g_uva(g, g->dq[0].used_gpa) + 2;
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0) != 0);
    a.used = g_uva(g, g->dq[0].used_gpa);
    a.flags = 1u << VHOST_VRING_F_LOG; /* logging not negotiated */
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0) != 0);
    /* Features cannot change while a ring is started; stop ring 1 first. */
    VHD_CHECK(s_set(&s, VHOST_USER_SET_FEATURES, &(uint64_t){guest_features(true)}, 8, NULL, 0) !=
              0);
    struct vu_vring_state st1 = {.index = 1};
    cli_send(s.fd, VHOST_USER_GET_VRING_BASE, V1, &st1, sizeof(st1), NULL, 0);
    VHD_CHECK_EQ(cli_reply(s.fd, VHOST_USER_GET_VRING_BASE, &st1, sizeof(st1)), 8);
    /* A packed base out of range for the ring. */
    s_set_u64(&s, VHOST_USER_SET_FEATURES, guest_features(true));
    a.flags = 0;
    s_set_ok(&s, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
    s_set_state(&s, VHOST_USER_SET_VRING_BASE, 0, QSIZE + 1);
    VHD_CHECK(s_set(&s, VHOST_USER_SET_VRING_KICK, &v, 8, &kfd, 1) != 0);
    /* SET_STATUS 0 (driver reset) clears NEEDS_RESET; status is 8 bits. */
    s_set_u64(&s, VHOST_USER_SET_STATUS, 0);
    VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_STATUS), 0);
    VHD_CHECK(s_set(&s, VHOST_USER_SET_STATUS, &(uint64_t){0x100}, 8, NULL, 0) != 0);
    s_set_u64(&s, VHOST_USER_SET_STATUS, VIRTIO_STATUS_ACKNOWLEDGE | VIRTIO_STATUS_DRIVER);
    VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_STATUS), 3);
    /* Protocol features not offered. */
    VHD_CHECK(s_set(&s, VHOST_USER_SET_PROTOCOL_FEATURES,
                    &(uint64_t){BIT(VHOST_USER_PROTOCOL_F_INBAND_NOTIFICATIONS)}, 8, NULL, 0) != 0);
    close(kfd);
    sess_close(&s);
    wait_session_gone(0);
    wait_fds(fds0);
}

VHD_TEST(vu_malformed_input_other_device_unaffected)
{
    struct bg b;
    struct guest g;
    size_t n;

    env_up();
    /* Device 1 serves I/O in the background all along. */
    memset(&b, 0, sizeof(b));
    guest_init(&b.g, true);
    sess_up(&b.s, 1, &b.g, PROTO_ALL);
    VHD_CHECK_EQ(pthread_create(&b.thr, NULL, bg_thread, &b), 0);

    guest_init(&g, false);
    struct abuse *cases = abuse_cases(&n);
    for (size_t i = 0; i < n; i++)
        run_abuse(&cases[i], &g);
    abuse_rings(&g);
    check_dev0_serves();

    /* A second connection while a session is active is closed; the first goes on. */
    struct sess s;
    sess_open(&s, 0, PROTO_ALL);
    int fd2 = cli_connect(E.path[0]);
    struct vu_hdr h2 = {VHOST_USER_GET_FEATURES, V1, 0};
    (void)!send(fd2, &h2, sizeof(h2), MSG_NOSIGNAL); /* may already see EPIPE */
    cli_expect_closed(fd2);
    close(fd2);
    VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_QUEUE_NUM), FAKE_NQUEUES);
    sess_close(&s);
    guest_fini(&g);

    __atomic_store_n(&b.stop, 1, __ATOMIC_RELEASE);
    pthread_join(b.thr, NULL);
    VHD_CHECK(b.done > 0);
    sess_close(&b.s);
    guest_fini(&b.g);
    env_down();
}

VHD_TEST(vu_server_socket_path)
{
    char dir[64], path[100], err[256];
    struct vhd_ctl *ctl;
    struct fake_dev fd1, fd2;

    vhd_log_set_level(VHD_LOG_ERROR);
    snprintf(dir, sizeof(dir), "/tmp/vhd-test-vus-XXXXXX");
    VHD_CHECK(mkdtemp(dir) != NULL);
    snprintf(path, sizeof(path), "%s/s.sock", dir);
    VHD_CHECK_EQ(vhd_ctl_new(&ctl), 0);
    fake_dev_init(&fd1, 1, NULL);
    fake_dev_init(&fd2, 2, NULL);

    struct vhd_vu_server *s1 = vhd_vu_server_new(ctl, &fd1.dev, path, err, sizeof(err));
    VHD_CHECK(s1 != NULL);
    /* A live server answers on it: refused. */
    struct vhd_vu_server *s2 = vhd_vu_server_new(ctl, &fd2.dev, path, err, sizeof(err));
    VHD_CHECK(s2 == NULL);
    VHD_CHECK(strstr(err, "socket path in use") != NULL);
    vhd_vu_server_free(s1);
    VHD_CHECK(access(path, F_OK) < 0);

    /* A stale socket file (nobody listening) is replaced. */
    int lfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    VHD_CHECK_EQ(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    close(lfd);
    VHD_CHECK_EQ(access(path, F_OK), 0);
    s1 = vhd_vu_server_new(ctl, &fd1.dev, path, err, sizeof(err));
    VHD_CHECK(s1 != NULL);
    vhd_vu_server_free(s1);

    /* A regular file is never removed. */
    int f = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    VHD_CHECK(f >= 0);
    close(f);
    VHD_CHECK(vhd_vu_server_new(ctl, &fd1.dev, path, err, sizeof(err)) == NULL);
    VHD_CHECK(strstr(err, "not a socket") != NULL);
    VHD_CHECK_EQ(access(path, F_OK), 0);
    unlink(path);

    /* Too long a path. */
    char longp[300];
    memset(longp, 'a', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = 0;
    VHD_CHECK(vhd_vu_server_new(ctl, &fd1.dev, longp, err, sizeof(err)) == NULL);

    vhd_ctl_free(ctl);
    free(fd1.dev.queues);
    free(fd2.dev.queues);
    rmdir(dir);
}

/* The control loop: removal of sources from callbacks, stop from a signal-like context. */
static int ctl_calls[2];
static struct vhd_ctl_src *ctl_srcs[2];

static void ctl_cb(void *opaque, uint32_t events)
{
    int i = (int)(intptr_t)opaque;
    (void)events;
    ctl_calls[i]++;
    /* Each removes both: the other one's pending event must not run. */
    vhd_ctl_del(ctl_srcs[0]);
    vhd_ctl_del(ctl_srcs[1]);
    ctl_srcs[0] = ctl_srcs[1] = NULL;
}

VHD_TEST(vu_ctl_loop)
{
    struct vhd_ctl *ctl;
    int e0 = eventfd(1, EFD_CLOEXEC), e1 = eventfd(1, EFD_CLOEXEC);

    VHD_CHECK_EQ(vhd_ctl_new(&ctl), 0);
    VHD_CHECK_EQ(vhd_ctl_add(ctl, e0, EPOLLIN, ctl_cb, (void *)0, &ctl_srcs[0]), 0);
    VHD_CHECK_EQ(vhd_ctl_add(ctl, e1, EPOLLIN, ctl_cb, (void *)1, &ctl_srcs[1]), 0);
    VHD_CHECK_EQ(vhd_ctl_run_once(ctl, 1000), 1);
    VHD_CHECK_EQ(ctl_calls[0] + ctl_calls[1], 1);
    VHD_CHECK_EQ(vhd_ctl_run_once(ctl, 10), 0);
    /* A stop requested before run makes it return at once, and is consumed. */
    vhd_ctl_stop(ctl);
    VHD_CHECK(vhd_ctl_stop_requested(ctl));
    VHD_CHECK_EQ(vhd_ctl_run(ctl), 0);
    VHD_CHECK(!vhd_ctl_stop_requested(ctl));
    vhd_ctl_free(ctl);
    close(e0);
    close(e1);
}

/* A worker-detected broken queue shows up as NEEDS_RESET in GET_STATUS. */
VHD_TEST(vu_broken_queue_needs_reset)
{
    struct guest g;
    struct sess s;

    env_up();
    guest_init(&g, false);
    sess_up(&s, 0, &g, PROTO_ALL);
    int errfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    s_vring_fd(&s, VHOST_USER_SET_VRING_ERR, 0, errfd);
    g_roundtrip(&g, 0, 1);
    VHD_CHECK_EQ(cli_get_u64(s.fd, VHOST_USER_GET_STATUS) & VIRTIO_STATUS_NEEDS_RESET, 0);
    /* Forge a descriptor index out of range in the avail ring. */
    struct vhd_drv_vq *dq = &g.dq[0];
    uint16_t ai = dq->avail_idx;
    dq->ring.split.avail->ring[ai % QSIZE] = 0xffff;
    __atomic_store_n(&dq->ring.split.avail->idx, (uint16_t)(ai + 1), __ATOMIC_RELEASE);
    uint64_t one = 1;
    VHD_CHECK_EQ(write(g.kick[0], &one, 8), 8);
    uint64_t t0 = now_ms();
    while (!(cli_get_u64(s.fd, VHOST_USER_GET_STATUS) & VIRTIO_STATUS_NEEDS_RESET))
        VHD_CHECK(now_ms() - t0 < TIMEOUT_MS);
    /* The ring's error eventfd was signalled. */
    uint64_t ev = 0;
    VHD_CHECK_EQ(read(errfd, &ev, 8), 8);
    VHD_CHECK_EQ(ev, 1);
    close(errfd);
    /* The other queue keeps working. */
    g_roundtrip(&g, 1, 2);
    sess_close(&s);
    guest_fini(&g);
    env_down();
}
