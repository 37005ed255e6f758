/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for the vhost-user dispatcher (src/transport/vu_conn*.c):
 * feeds fuzzed message streams (header, payload, and real fds: memfds,
 * eventfds, socket ends) to vhd_vu_conn_handle() on one thread, with a stub
 * runtime whose attach touches the queue's rings (so a ring left pointing at
 * unmapped memory crashes here). After every input no fd may be left open.
 *
 * Built with -DFUZZ_VU_WRITE_SEEDS it is instead a program that writes the
 * seed corpus into the directory given as its argument.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "spec/virtio.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "transport/vu_conn.h"
#include "spec/vhost_user.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/*
 * Input format: messages, front to back, until the input ends or MAX_MSGS:
 *   u8  nfds_and_mode: bits 0-3 fd count (0..15; above 8 is a protocol
 *       error), bit 4: the stub runtime's next attach fails, bit 5: end the
 *       session before this message (a disconnect) and start a new one
 *   u8  kind per fd: 0 memfd of MEMFD_SIZE bytes, 1 memfd of one page,
 *       2 eventfd, 3 socket (one end of a socketpair)
 *   u8  request (0xff: a u32 request follows)
 *   u8  flags (the header's flags, as is)
 *   u16 size (little-endian; the header's size field)
 *   min(size, VU_MAX_PAYLOAD) payload bytes (short inputs: zero-filled)
 * A handler error that ends the session starts a new one, as the server does.
 */

#define MAX_MSGS   64
#define MEMFD_SIZE (64 * 1024)
#define MAX_PEERS  (MAX_MSGS * 16)

/* ---- a fake device and a stub runtime ---- */

#define NQUEUES 3

static struct vhd_dev dev;
static int fail_next_attach;
static char rt_dummy;

unsigned vhd_rt_nworkers(const struct vhd_rt *rt)
{
    (void)rt;
    return 2;
}

/* Floating workers: the NUMA report (runtime/numa.c) has nothing to warn about. */
int vhd_rt_worker_cpu(const struct vhd_rt *rt, unsigned worker)
{
    (void)rt;
    (void)worker;
    return -1;
}

int vhd_rt_worker_node(const struct vhd_rt *rt, unsigned worker)
{
    (void)rt;
    (void)worker;
    return -1;
}

/* No runtime events here: a queue's IOTLB misses are looked at after each message. */
int vhd_rt_event_fd(const struct vhd_rt *rt)
{
    (void)rt;
    return -1;
}

int vhd_rt_attach(struct vhd_rt *rt, struct vhd_queue *q, unsigned worker)
{
    (void)rt;
    if (worker >= 2 || q->attached || !q->started || !q->enabled)
        abort(); /* the transport must only attach started, enabled, detached queues */
    if (q->vq.mem != dev.mem)
        abort(); /* a queue running on a stale memory table */
    if (fail_next_attach) {
        fail_next_attach = 0;
        return -ENOMEM;
    }
    /* Touch the rings as a worker would: a stale mapping faults here. */
    (void)vhd_vq_has_work(&q->vq);
    q->attached = true;
    return 0;
}

int vhd_rt_detach(struct vhd_rt *rt, struct vhd_queue *q, int timeout_ms)
{
    (void)rt;
    (void)timeout_ms;
    q->attached = false;
    return 0;
}

/*
 * A drain (a stopped ring's resubmissions): the fake device completes what
 * it pops at once, as a worker running it would before letting go.
 */
int vhd_rt_drain(struct vhd_rt *rt, struct vhd_queue *q, unsigned worker, int timeout_ms)
{
    struct iovec iov[8];
    struct vhd_vq_chain c;

    (void)rt;
    (void)timeout_ms;
    if (worker >= 2 || q->attached || !q->started)
        abort(); /* the transport drains only started, detached queues */
    if (q->vq.mem != dev.mem)
        abort();
    while (vhd_vq_pop(&q->vq, iov, 8, &c) == 1)
        if (vhd_vq_push(&q->vq, &c, 0) < 0)
            break;
    vhd_vq_flush(&q->vq);
    return 0;
}

void vhd_queue_mark_used(struct vhd_queue *q)
{
    (void)q;
}

static uint64_t f_features(struct vhd_dev *d)
{
    (void)d;
    return (1ull << VIRTIO_F_VERSION_1) | (1ull << VIRTIO_F_RING_PACKED) |
           (1ull << VIRTIO_F_EVENT_IDX) | (1ull << VIRTIO_F_INDIRECT_DESC);
}

static int f_set_features(struct vhd_dev *d, uint64_t f)
{
    (void)d;
    return (f & (1ull << VIRTIO_F_VERSION_1)) ? 0 : -EINVAL;
}

static uint8_t f_config[24];

static int f_get_config(struct vhd_dev *d, void *buf, uint32_t off, uint32_t len)
{
    (void)d;
    if (off > sizeof(f_config) || len > sizeof(f_config) - off)
        abort(); /* the transport checks bounds first */
    memcpy(buf, f_config + off, len);
    return 0;
}

static int f_set_config(struct vhd_dev *d, const void *buf, uint32_t off, uint32_t len)
{
    (void)d;
    if (off > sizeof(f_config) || len > sizeof(f_config) - off)
        abort();
    if (off < 16)
        return -EPERM;
    memcpy(f_config + off, buf, len);
    return 0;
}

static int f_queue_init(struct vhd_dev *d, struct vhd_queue *q)
{
    (void)d;
    if (q->attached || q->started)
        abort();
    return q->size == 3 ? -EIO : 0; /* some failure path */
}

static void f_queue_fini(struct vhd_dev *d, struct vhd_queue *q)
{
    (void)d;
    if (q->attached)
        abort();
}

static int f_process(struct vhd_queue *q, unsigned budget)
{
    (void)q;
    (void)budget;
    return 0;
}

static void f_reset(struct vhd_dev *d)
{
    for (uint32_t i = 0; i < d->num_queues; i++)
        if (d->queues[i].attached)
            abort();
}

static const struct vhd_dev_ops f_ops = {
    .type = "fuzz",
    .features = f_features,
    .set_features = f_set_features,
    .config_size = sizeof(f_config),
    .get_config = f_get_config,
    .set_config = f_set_config,
    .queue_init = f_queue_init,
    .queue_fini = f_queue_fini,
    .queue_process = f_process,
    .reset = f_reset,
    .inflight_shmfd = true, /* GET/SET_INFLIGHT_FD and rings tracked in the area */
    .dirty_log = true,      /* LOG_ALL, SET_LOG_BASE, ring log flags */
};

/* ---- fds ---- */

static int memfd_big = -1, memfd_small = -1;
static int peers[MAX_PEERS]; /* our ends of socketpairs handed over */
static int npeers;

/*
 * Every fd number handed to the transport during the current input. Once the
 * input is done (sessions ended, our own ends closed) none may be open: each
 * was free when we created it, and nothing but this code opens fds during
 * the callback, so an open one is a leak. (Counting /proc/self/fd instead
 * would see libFuzzer's own pipes come and go.)
 */
#define MAX_HANDED (MAX_MSGS * 16 + MAX_MSGS + 8)
static int handed[MAX_HANDED];
static int nhanded;

static void note_handed(int fd)
{
    if (nhanded < MAX_HANDED)
        handed[nhanded++] = fd;
}

/* On a leak: what is open. */
static void print_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    if (!d)
        return;
    while ((e = readdir(d))) {
        char path[300], target[256];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = 0;
        fprintf(stderr, "  fd %s -> %s\n", e->d_name, target);
    }
    closedir(d);
}

static int make_fd_kind(uint8_t kind)
{
    int sp[2];

    switch (kind & 3) {
    case 0:
        return fcntl(memfd_big, F_DUPFD_CLOEXEC, 0);
    case 1:
        return fcntl(memfd_small, F_DUPFD_CLOEXEC, 0);
    case 2:
        return eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    default:
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, sp) < 0)
            return -1;
        if (npeers < MAX_PEERS) {
            peers[npeers++] = sp[1];
        } else {
            close(sp[1]);
        }
        return sp[0];
    }
}

static int make_fd(uint8_t kind)
{
    int fd = make_fd_kind(kind);
    if (fd >= 0)
        note_handed(fd);
    return fd;
}

static void init_once(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    /* VHD_FUZZ_DEBUG=1 traces every message (for reading what a seed does). */
    vhd_log_set_level(getenv("VHD_FUZZ_DEBUG") ? VHD_LOG_DEBUG : VHD_LOG_ERROR);
    memfd_big = memfd_create("fuzz-vu", MFD_CLOEXEC);
    memfd_small = memfd_create("fuzz-vu-small", MFD_CLOEXEC);
    if (memfd_big < 0 || memfd_small < 0 || ftruncate(memfd_big, MEMFD_SIZE) < 0 ||
        ftruncate(memfd_small, 4096) < 0)
        abort();
    /* Non-zero ring contents: an avail index the rings may see. */
    uint16_t idx = 1;
    for (off_t off = 0; off < MEMFD_SIZE; off += 4096)
        if (pwrite(memfd_big, &idx, sizeof(idx), off + 2) != sizeof(idx))
            abort();
    dev.ops = &f_ops;
    snprintf(dev.name, sizeof(dev.name), "fuzz");
    dev.num_queues = NQUEUES;
    dev.queues = aligned_alloc(VHD_CACHELINE, NQUEUES * sizeof(struct vhd_queue));
    if (!dev.queues)
        abort();
    memset(dev.queues, 0, NQUEUES * sizeof(struct vhd_queue));
    dev.rt = (struct vhd_rt *)(void *)&rt_dummy;
}

/* ---- one session over a socketpair ---- */

struct session {
    struct vhd_vu_conn *c;
    int peer; /* our end: replies arrive here */
};

static void session_start(struct session *s)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0)
        abort();
    s->peer = sp[1];
    if (fcntl(s->peer, F_SETFL, O_NONBLOCK) < 0)
        abort();
    note_handed(sp[0]);
    if (vhd_vu_conn_new(&dev, sp[0], &s->c) < 0)
        abort();
}

static void session_drain(struct session *s)
{
    char buf[4096];
    while (read(s->peer, buf, sizeof(buf)) > 0) {
    }
}

static void session_end(struct session *s)
{
    if (vhd_vu_conn_free(s->c) < 0)
        abort(); /* the stub never fails a detach: the device must come back clean */
    s->c = NULL;
    close(s->peer);
    s->peer = -1;
    if (dev.mem)
        abort(); /* the table was freed */
    for (uint32_t i = 0; i < NQUEUES; i++) {
        const struct vhd_queue *q = &dev.queues[i];
        if (q->attached || q->started || q->kick_fd >= 0 || q->call_fd >= 0 || q->err_fd >= 0)
            abort();
    }
}

struct reader {
    const uint8_t *p;
    size_t left;
};

static uint8_t rd8(struct reader *r)
{
    if (!r->left)
        return 0;
    r->left--;
    return *r->p++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct reader r = {data, size};
    struct session s;

    init_once();
    npeers = 0;
    nhanded = 0;
    fail_next_attach = 0;
    session_start(&s);
    for (int m = 0; m < MAX_MSGS && r.left; m++) {
        uint8_t ctl = rd8(&r);
        unsigned nfds = ctl & 15;
        int fds[16];
        for (unsigned i = 0; i < nfds; i++)
            fds[i] = make_fd(rd8(&r));
        for (unsigned i = 0; i < nfds; i++)
            if (fds[i] < 0)
                abort();
        if (ctl & 0x10)
            fail_next_attach = 1;
        if (ctl & 0x20) {
            session_end(&s);
            session_start(&s);
        }
        struct vu_hdr h;
        uint8_t req = rd8(&r);
        h.request = req;
        if (req == 0xff) {
            h.request = rd8(&r);
            h.request |= (uint32_t)rd8(&r) << 8;
            h.request |= (uint32_t)rd8(&r) << 16;
            h.request |= (uint32_t)rd8(&r) << 24;
        }
        h.flags = rd8(&r);
        h.size = rd8(&r);
        h.size |= (uint32_t)rd8(&r) << 8;
        union vu_payload p;
        memset(&p, 0, sizeof(p));
        uint32_t n = h.size < VU_MAX_PAYLOAD ? h.size : VU_MAX_PAYLOAD;
        for (uint32_t i = 0; i < n; i++)
            p.raw[i] = rd8(&r);

        int rc = vhd_vu_conn_handle(s.c, &h, &p, fds, nfds);
        session_drain(&s);
        if (rc < 0) {
            session_end(&s);
            session_start(&s);
        }
    }
    session_end(&s);
    for (int i = 0; i < npeers; i++)
        close(peers[i]);
    npeers = 0;
    for (int i = 0; i < nhanded; i++) {
        if (fcntl(handed[i], F_GETFD) != -1) {
            fprintf(stderr, "fd leak: fd %d handed to the transport is still open\n", handed[i]);
            print_fds();
            abort();
        }
    }
    return 0;
}

#ifdef FUZZ_VU_WRITE_SEEDS
/* ---- seed corpus writer ---- */

struct seed {
    uint8_t buf[8192];
    size_t len;
};

static void put8(struct seed *s, uint8_t v)
{
    if (s->len >= sizeof(s->buf))
        abort();
    s->buf[s->len++] = v;
}

static void put(struct seed *s, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put8(s, ((const uint8_t *)p)[i]);
}

/* One message: fd kinds (0..8 of them), request, flags, payload. */
static void msg(struct seed *s, const uint8_t *kinds, unsigned nfds, uint8_t mode, uint8_t req,
                uint8_t flags, const void *payload, uint16_t size)
{
    put8(s, (uint8_t)(nfds | mode));
    for (unsigned i = 0; i < nfds; i++)
        put8(s, kinds[i]);
    put8(s, req);
    put8(s, flags);
    put8(s, (uint8_t)size);
    put8(s, (uint8_t)(size >> 8));
    put(s, payload, size);
}

#define V1     1
#define NR     (1 | 8)
#define U64(v) (&(uint64_t){(v)}), 8

static const uint8_t K_MEM[8] = {0, 0, 0, 0, 0, 0, 0, 0};
static const uint8_t K_EVT[1] = {2};
static const uint8_t K_SOCK[1] = {3};

static void negotiate(struct seed *s, uint64_t proto)
{
    msg(s, NULL, 0, 0, VHOST_USER_GET_FEATURES, V1, NULL, 0);
    msg(s, NULL, 0, 0, VHOST_USER_GET_PROTOCOL_FEATURES, V1, NULL, 0);
    msg(s, NULL, 0, 0, VHOST_USER_SET_PROTOCOL_FEATURES, NR, U64(proto));
    msg(s, NULL, 0, 0, VHOST_USER_SET_OWNER, NR, NULL, 0);
}

static void mem_table(struct seed *s)
{
    struct vu_mem_table m = {.nregions = 1};
    m.regions[0] = (struct vu_mem_region){0x100000, MEMFD_SIZE, 0x7000000, 0};
    msg(s, K_MEM, 1, 0, VHOST_USER_SET_MEM_TABLE, NR, &m, 8 + 32);
}

static void ring(struct seed *s, uint32_t i, bool packed)
{
    struct vu_vring_state st = {i, 16};
    msg(s, NULL, 0, 0, VHOST_USER_SET_VRING_NUM, NR, &st, 8);
    st.num = packed ? (1u << 15 | 1u << 31) : 0;
    msg(s, NULL, 0, 0, VHOST_USER_SET_VRING_BASE, NR, &st, 8);
    uint64_t base = 0x7000000 + (uint64_t)i * 0x4000;
    struct vu_vring_addr a = {i, 0, base, base + 0x2000, base + 0x1000, 0};
    msg(s, NULL, 0, 0, VHOST_USER_SET_VRING_ADDR, NR, &a, sizeof(a));
    msg(s, K_EVT, 1, 0, VHOST_USER_SET_VRING_KICK, NR, U64(i));
    msg(s, K_EVT, 1, 0, VHOST_USER_SET_VRING_CALL, NR, U64(i));
    st.num = 1;
    msg(s, NULL, 0, 0, VHOST_USER_SET_VRING_ENABLE, NR, &st, 8);
}

static void write_seed(const char *dir, const char *name, const struct seed *s)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(s->buf, 1, s->len, f) != s->len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

int main(int argc, char **argv)
{
    const uint64_t all =
        (1u << VHOST_USER_PROTOCOL_F_MQ) | (1u << VHOST_USER_PROTOCOL_F_REPLY_ACK) |
        (1u << VHOST_USER_PROTOCOL_F_CONFIG) | (1u << VHOST_USER_PROTOCOL_F_BACKEND_REQ) |
        (1u << VHOST_USER_PROTOCOL_F_RESET_DEVICE) |
        (1u << VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS) | (1u << VHOST_USER_PROTOCOL_F_STATUS);
    const uint64_t feat = (1ull << VIRTIO_F_VERSION_1) | (1ull << VHOST_USER_F_PROTOCOL_FEATURES);
    struct seed s;

    if (argc != 2) {
        fprintf(stderr, "usage: %s corpus-dir\n", argv[0]);
        return 2;
    }

    /* 1: negotiation, queue count, config space, status. */
    memset(&s, 0, sizeof(s));
    negotiate(&s, all);
    msg(&s, NULL, 0, 0, VHOST_USER_GET_QUEUE_NUM, V1, NULL, 0);
    msg(&s, NULL, 0, 0, VHOST_USER_GET_MAX_MEM_SLOTS, V1, NULL, 0);
    struct vu_config cfg = {.offset = 0, .size = 24};
    msg(&s, NULL, 0, 0, VHOST_USER_GET_CONFIG, V1, &cfg, 12 + 24);
    cfg = (struct vu_config){.offset = 16, .size = 4, .region = {1, 2, 3, 4}};
    msg(&s, NULL, 0, 0, VHOST_USER_SET_CONFIG, NR, &cfg, 12 + 4);
    msg(&s, NULL, 0, 0, VHOST_USER_SET_STATUS, NR, U64(15));
    msg(&s, NULL, 0, 0, VHOST_USER_GET_STATUS, V1, NULL, 0);
    write_seed(argv[1], "negotiate-config-status", &s);

    /* 2: split rings up, stopped with GET_VRING_BASE, restarted. */
    memset(&s, 0, sizeof(s));
    negotiate(&s, all);
    msg(&s, NULL, 0, 0, VHOST_USER_SET_FEATURES, NR, U64(feat));
    mem_table(&s);
    ring(&s, 0, false);
    ring(&s, 1, false);
    struct vu_vring_state st = {0, 0};
    msg(&s, NULL, 0, 0, VHOST_USER_GET_VRING_BASE, V1, &st, 8);
    msg(&s, K_EVT, 1, 0, VHOST_USER_SET_VRING_KICK, NR, U64(0));
    mem_table(&s); /* a new table under running rings */
    write_seed(argv[1], "split-rings", &s);

    /* 3: packed rings, ADD/REM_MEM_REG, RESET_DEVICE. */
    memset(&s, 0, sizeof(s));
    negotiate(&s, all);
    msg(&s, NULL, 0, 0, VHOST_USER_SET_FEATURES, NR,
        U64(feat | (1ull << VIRTIO_F_RING_PACKED) | (1ull << VIRTIO_F_EVENT_IDX)));
    struct vu_mem_single r = {0, {0x100000, MEMFD_SIZE, 0x7000000, 0}};
    msg(&s, K_MEM, 1, 0, VHOST_USER_ADD_MEM_REG, NR, &r, sizeof(r));
    r.region = (struct vu_mem_region){0x900000, 4096, 0x9000000, 0};
    uint8_t k_small = 1;
    msg(&s, &k_small, 1, 0, VHOST_USER_ADD_MEM_REG, NR, &r, sizeof(r));
    ring(&s, 2, true);
    msg(&s, NULL, 0, 0, VHOST_USER_REM_MEM_REG, NR, &r, sizeof(r));
    r.region = (struct vu_mem_region){0x100000, MEMFD_SIZE, 0x7000000, 0};
    msg(&s, NULL, 0, 0, VHOST_USER_REM_MEM_REG, NR, &r, sizeof(r)); /* refused: ring inside */
    msg(&s, NULL, 0, 0, VHOST_USER_RESET_DEVICE, NR, NULL, 0);
    msg(&s, NULL, 0, 0, VHOST_USER_REM_MEM_REG, NR, &r, sizeof(r));
    write_seed(argv[1], "packed-mem-slots-reset", &s);

    /* 4: no protocol features (rings enabled by SET_FEATURES), back-end channel, disconnect. */
    memset(&s, 0, sizeof(s));
    msg(&s, NULL, 0, 0, VHOST_USER_GET_FEATURES, V1, NULL, 0);
    msg(&s, NULL, 0, 0, VHOST_USER_SET_OWNER, V1, NULL, 0);
    msg(&s, NULL, 0, 0, VHOST_USER_SET_FEATURES, V1, U64(1ull << VIRTIO_F_VERSION_1));
    mem_table(&s);
    ring(&s, 0, false);
    msg(&s, NULL, 0, 0x20, VHOST_USER_GET_FEATURES, V1, NULL, 0); /* new session */
    negotiate(&s, all);
    msg(&s, K_SOCK, 1, 0, VHOST_USER_SET_BACKEND_REQ_FD, NR, NULL, 0);
    msg(&s, NULL, 0, 0, VHOST_USER_SET_FEATURES, NR, U64(feat));
    mem_table(&s);
    st = (struct vu_vring_state){0, 16};
    msg(&s, NULL, 0, 0, VHOST_USER_SET_VRING_NUM, NR, &st, 8);
    struct vu_vring_addr bad = {0, 0, 0x10, 0x20, 0x40, 0}; /* outside memory */
    msg(&s, NULL, 0, 0, VHOST_USER_SET_VRING_ADDR, NR, &bad, sizeof(bad));
    msg(&s, K_EVT, 1, 0, VHOST_USER_SET_VRING_KICK, NR, U64(0));
    write_seed(argv[1], "no-protocol-backend-channel", &s);

    /* 5: malformed: bad sizes, fds, regions, versions, oversized. */
    memset(&s, 0, sizeof(s));
    negotiate(&s, all);
    msg(&s, NULL, 0, 0, VHOST_USER_SET_FEATURES, NR, U64(feat)); /* ok */
    msg(&s, K_EVT, 1, 0, VHOST_USER_SET_OWNER, NR, NULL, 0);     /* unexpected fd */
    struct vu_mem_table m = {.nregions = 2};
    m.regions[0] = (struct vu_mem_region){0, 8192, 0x1000, 0};
    m.regions[1] = (struct vu_mem_region){4096, 8192, 0x100000, 0}; /* overlap */
    msg(&s, K_MEM, 2, 0, VHOST_USER_SET_MEM_TABLE, NR, &m, 8 + 64);
    m.nregions = 1;
    m.regions[0] = (struct vu_mem_region){0, 4096, 0x1000, 8192}; /* beyond the small file */
    msg(&s, &k_small, 1, 0, VHOST_USER_SET_MEM_TABLE, NR, &m, 8 + 32);
    st = (struct vu_vring_state){9, 16}; /* ring index out of range */
    msg(&s, NULL, 0, 0, VHOST_USER_SET_VRING_NUM, NR, &st, 8);
    msg(&s, K_EVT, 1, 0, VHOST_USER_SET_VRING_KICK, NR, U64(0)); /* before NUM/ADDR */
    msg(&s, NULL, 0, 0, 200, NR, NULL, 0);                       /* unknown */
    msg(&s, NULL, 0, 0, VHOST_USER_GET_FEATURES, 2, NULL, 0);    /* version 2 */
    write_seed(argv[1], "malformed", &s);

    /* 6: too many fds, then an oversized payload. */
    memset(&s, 0, sizeof(s));
    negotiate(&s, all);
    static const uint8_t nine[9] = {2, 2, 2, 2, 2, 2, 2, 2, 2};
    msg(&s, nine, 9, 0, VHOST_USER_SET_OWNER, NR, NULL, 0);
    put8(&s, 0);
    put8(&s, VHOST_USER_SET_OWNER);
    put8(&s, V1);
    put8(&s, 0x00);
    put8(&s, 0x10); /* size 4096 */
    write_seed(argv[1], "too-many-fds-oversized", &s);

    /* 7: inflight area: GET, SET (a memfd of ours), rings tracked, stop, refused SETs. */
    memset(&s, 0, sizeof(s));
    negotiate(&s, all | (1u << VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD));
    msg(&s, NULL, 0, 0, VHOST_USER_SET_FEATURES, NR, U64(feat));
    mem_table(&s);
    struct vu_inflight inf = {.num_queues = NQUEUES, .queue_size = 16};
    msg(&s, NULL, 0, 0, VHOST_USER_GET_INFLIGHT_FD, V1, &inf, sizeof(inf));
    inf.mmap_size = NQUEUES * 320; /* 3 split regions of 16 records, 64-byte aligned */
    msg(&s, K_MEM, 1, 0, VHOST_USER_SET_INFLIGHT_FD, NR, &inf, sizeof(inf));
    ring(&s, 0, false);
    ring(&s, 1, false);
    msg(&s, K_MEM, 1, 0, VHOST_USER_SET_INFLIGHT_FD, NR, &inf, sizeof(inf)); /* rings run */
    st = (struct vu_vring_state){0, 0};
    msg(&s, NULL, 0, 0, VHOST_USER_GET_VRING_BASE, V1, &st, 8);
    st.index = 1;
    msg(&s, NULL, 0, 0, VHOST_USER_GET_VRING_BASE, V1, &st, 8);
    inf.mmap_size = 64; /* too small */
    msg(&s, K_MEM, 1, 0, VHOST_USER_SET_INFLIGHT_FD, NR, &inf, sizeof(inf));
    inf.mmap_size = 8192;
    inf.queue_size = 128;
    msg(&s, &k_small, 1, 0, VHOST_USER_SET_INFLIGHT_FD, NR, &inf, sizeof(inf)); /* file short */
    ring(&s, 2, false);
    write_seed(argv[1], "inflight", &s);

    /* 8: dirty logging: a log, LOG_ALL and ring log flags on running rings, replaced, refused. */
    memset(&s, 0, sizeof(s));
    negotiate(&s, all | (1u << VHOST_USER_PROTOCOL_F_LOG_SHMFD));
    msg(&s, NULL, 0, 0, VHOST_USER_SET_FEATURES, NR, U64(feat));
    mem_table(&s);
    struct vu_log lg = {.size = 4096, .offset = 0};
    msg(&s, K_MEM, 1, 0, VHOST_USER_SET_LOG_BASE, V1, &lg, sizeof(lg));
    ring(&s, 0, false);
    msg(&s, NULL, 0, 0, VHOST_USER_SET_FEATURES, NR, U64(feat | (1ull << VHOST_F_LOG_ALL)));
    struct vu_vring_addr la = {0,       1u << VHOST_VRING_F_LOG, 0x7000000, 0x7002000, 0x7001000,
                               0x102000};
    msg(&s, NULL, 0, 0, VHOST_USER_SET_VRING_ADDR, NR, &la, sizeof(la));
    lg.offset = 8192; /* a new log at an offset, replacing the first under running rings */
    msg(&s, K_MEM, 1, 0, VHOST_USER_SET_LOG_BASE, V1, &lg, sizeof(lg));
    lg.size = 8192; /* the small memfd is one page: refused */
    msg(&s, &k_small, 1, 0, VHOST_USER_SET_LOG_BASE, V1, &lg, sizeof(lg));
    lg = (struct vu_log){.size = 0, .offset = 0};
    msg(&s, K_MEM, 1, 0, VHOST_USER_SET_LOG_BASE, V1, &lg, sizeof(lg));
    lg.size = 64;
    msg(&s, NULL, 0, 0, VHOST_USER_SET_LOG_BASE, V1, &lg, sizeof(lg)); /* no fd */
    lg.offset = 100;
    msg(&s, K_MEM, 1, 0, VHOST_USER_SET_LOG_BASE, V1, &lg, sizeof(lg)); /* unaligned */
    la.flags = 2;                                                       /* unknown flag */
    msg(&s, NULL, 0, 0, VHOST_USER_SET_VRING_ADDR, NR, &la, sizeof(la));
    ring(&s, 1, false);
    msg(&s, NULL, 0, 0, VHOST_USER_SET_FEATURES, NR, U64(feat));
    st = (struct vu_vring_state){0, 0};
    msg(&s, NULL, 0, 0, VHOST_USER_GET_VRING_BASE, V1, &st, 8);
    write_seed(argv[1], "dirty-log", &s);
    return 0;
}
#endif /* FUZZ_VU_WRITE_SEEDS */
