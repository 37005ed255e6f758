/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Chaos cases at the vhost-user message level (vu_chaos.h): framing, file
 * descriptors, feature sequences, memory tables, ring addresses and the
 * order of messages. Each opens its own session, gets the back-end into the
 * state it needs with well-formed steps, sends the hostile message and
 * records what the back-end did.
 */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "util/compiler.h"
#include "spec/virtio_blk.h"
#include "vu_chaos_int.h"

/* ======================= cases: framing ======================= */

/* After a truncated message (sent when rc is 0): end of stream; the back-end must close. */
static int then_eof(struct vhd_chaos_sess *s, int rc, const char *what)
{
    if (!rc) {
        shutdown(s->fd, SHUT_WR);
        struct vu_hdr r;
        union vu_payload p;
        rc = vhd_chaos__observe(
            s, vhd_chaos__recv(s, &r, &p) == -ECONNRESET ? VHD_CHAOS_CLOSED : -ETIMEDOUT, what);
    }
    vhd_chaos__close(s);
    return rc;
}

/* Half a header, then end of stream. */
static int c_trunc_header(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__open(ctx, &s);
    struct vu_hdr h = {.request = VHOST_USER_GET_FEATURES, .flags = 1, .size = 0};
    if (!rc)
        rc = vhd_chaos__raw_sendmsg(s.fd, &h, 7, NULL, 0);
    return then_eof(&s, rc, "truncated header");
}

/* A header announcing 8 bytes, 3 sent, then end of stream. */
static int c_trunc_payload(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__open(ctx, &s);
    uint64_t v = 0;
    if (!rc)
        rc = vhd_chaos__send_raw(&s, VHOST_USER_SET_FEATURES, 1, 8, &v, 3, NULL, 0);
    return then_eof(&s, rc, "truncated payload");
}

/* A size field of 1 MiB: the back-end must not wait for (or allocate) that. */
static int c_oversized(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    uint8_t junk[64] = {0};
    int rc = vhd_chaos__open(ctx, &s);
    if (!rc)
        rc = vhd_chaos__observe(
            &s,
            vhd_chaos__ack_raw(&s, VHOST_USER_SET_FEATURES, 1u << 20, junk, sizeof(junk), NULL, 0),
            "size field 1 MiB");
    vhd_chaos__close(&s);
    return rc;
}

/* Size field 4 for an 8-byte payload, with REPLY_ACK negotiated. */
static int c_size_mismatch(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        uint64_t v = BIT(VIRTIO_F_VERSION_1);
        rc = vhd_chaos__observe(&s,
                                vhd_chaos__ack_raw(&s, VHOST_USER_SET_FEATURES, 4, &v, 4, NULL, 0),
                                "SET_FEATURES of 4 bytes");
    }
    vhd_chaos__close(&s);
    return rc;
}

static int send_flags(struct vhd_chaos_ctx *ctx, uint32_t flags, const char *what)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__open(ctx, &s);
    if (!rc) {
        rc = vhd_chaos__send_raw(&s, VHOST_USER_GET_FEATURES, flags, 0, NULL, 0, NULL, 0);
        struct vu_hdr h;
        union vu_payload p;
        if (!rc)
            rc = vhd_chaos__recv(&s, &h, &p);
        rc = vhd_chaos__observe(&s,
                                rc == -ECONNRESET || rc == -EPIPE ? VHD_CHAOS_CLOSED
                                : rc == 1                         ? 0
                                                                  : rc,
                                what);
    }
    vhd_chaos__close(&s);
    return rc;
}

VHD_CHAOS_VARIANT(c_bad_version, send_flags, 2, "version 2")
VHD_CHAOS_VARIANT(c_reply_flag, send_flags, VHOST_USER_VERSION | VHOST_USER_REPLY_MASK,
                  "reply flag in a request")
VHD_CHAOS_VARIANT(c_unknown_flags, send_flags, VHOST_USER_VERSION | 0x100, "unknown flag bits")

/* An unknown request id with NEED_REPLY, after REPLY_ACK. */
static int c_unknown_request(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc)
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, 200, NULL, 0, NULL, 0), "request 200");
    vhd_chaos__close(&s);
    return rc;
}

/* An unknown request id before any REPLY_ACK: the back-end cannot nack, so it must close. */
static int c_unknown_request_noack(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__open(ctx, &s);
    if (!rc)
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, 0xffffffffu, NULL, 0, NULL, 0),
                                "request 0xffffffff");
    vhd_chaos__close(&s);
    return rc;
}

/* A known request the back-end does not implement (SET_LOG_FD). */
static int c_unsupported_request(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        int fd = s.m->fd;
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, VHOST_USER_SET_LOG_FD, NULL, 0, &fd, 1),
                                "SET_LOG_FD");
    }
    vhd_chaos__close(&s);
    return rc;
}

static uint64_t mono_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Longest stall of another device's control plane a case tolerates. */
#define STALL_MAX_MS 500

/*
 * A front-end that sends requests and never reads the replies. The
 * back-end must not block on its full socket: its control thread serves
 * every device, so while it waits, no other front-end is answered (probed
 * on ctx->probe_path). It may close the session, or serve it all.
 */
static int c_never_reads(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s, probe;
    struct vhd_chaos_ctx pctx = *ctx;
    int rc = vhd_chaos__open(ctx, &s);
    bool have_probe = false;
    if (!rc && ctx->probe_path) {
        pctx.socket_path = ctx->probe_path;
        rc = vhd_chaos__open(&pctx, &probe);
        if (rc)
            vhd_chaos__note(&s, rc, "probe session: %s", pctx.note);
        have_probe = rc == 0;
    }
    if (rc) {
        vhd_chaos__close(&s);
        return rc;
    }
    enum { BATCH = 512 };
    struct vu_hdr h[BATCH];
    for (unsigned i = 0; i < BATCH; i++)
        h[i] = (struct vu_hdr){.request = VHOST_USER_GET_FEATURES, .flags = VHOST_USER_VERSION};
    const uint8_t *buf = (const uint8_t *)h;
    size_t off = 0, total = 0;
    bool closed = false;
    uint64_t t0 = mono_ms(), last = t0, stall = 0;
    /* Bounded: 4 s, or 1.5 s without progress, or 4 MiB of requests. */
    while (total < (4u << 20) && mono_ms() - t0 < 4000 && mono_ms() - last < 1500) {
        ssize_t n = send(s.fd, buf + off, sizeof(h) - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            off = (off + (size_t)n) % sizeof(h);
            total += (size_t)n;
            last = mono_ms();
        } else if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) {
            closed = true;
            break;
        } else if (have_probe) {
            /* Stuck: is the back-end still serving another device? */
            uint64_t tp = mono_ms(), v;
            if (vhd_chaos__call_u64(&probe, VHOST_USER_GET_FEATURES, &v) != 0)
                stall = UINT64_MAX;
            else if (mono_ms() - tp > stall)
                stall = mono_ms() - tp;
        } else {
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    /* Now read: the replies that were sent, then EOF if the back-end gave up on us. */
    if (!closed) {
        struct vu_hdr r;
        union vu_payload p;
        int got;
        while ((got = vhd_chaos__recv(&s, &r, &p)) == 1)
            ;
        closed = got == -ECONNRESET;
    }
    if (closed)
        ctx->observed |= VHD_CHAOS_CLOSED;
    else if (off == 0 && vhd_chaos__call_u64(&s, VHOST_USER_GET_FEATURES, &s.offered) == 0)
        ctx->observed |= VHD_CHAOS_SERVED; /* every reply delivered, session still fine */
    vhd_chaos__note(&s, 0, "%zu bytes of requests, another device waited up to %llu ms%s", total,
                    (unsigned long long)stall,
                    ctx->observed ? "" : "; session neither closed nor usable");
    if (stall > STALL_MAX_MS)
        ctx->observed = 0; /* the other devices were not served meanwhile: not survived */
    if (have_probe)
        vhd_chaos__close(&probe);
    vhd_chaos__close(&s);
    return 0;
}

/* ======================= cases: file descriptors ======================= */

/* SET_VRING_KICK without NOFD and without an fd. */
static int c_kick_missing_fd(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(KICK));
    if (!rc) {
        uint64_t v = 0;
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, VHOST_USER_SET_VRING_KICK, &v, 8, NULL, 0),
                                "kick without fd");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* SET_OWNER carrying three fds it has no use for (they must be closed: fd count). */
static int c_extra_fds(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        int fds[3] = {eventfd(0, EFD_CLOEXEC), eventfd(0, EFD_CLOEXEC), s.m->fd};
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, VHOST_USER_SET_OWNER, NULL, 0, fds, 3),
                                "SET_OWNER + 3 fds");
        close(fds[0]);
        close(fds[1]);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* SET_VRING_CALL with NOFD set and an fd anyway. */
static int c_nofd_with_fd(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    if (!rc) {
        uint64_t v = VHOST_USER_VRING_NOFD_MASK;
        int fd = eventfd(0, EFD_CLOEXEC);
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, VHOST_USER_SET_VRING_CALL, &v, 8, &fd, 1),
                                "NOFD with an fd");
        close(fd);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* Twelve fds on one message: more than any message may carry. */
static int c_too_many_fds(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        int fds[12];
        for (int i = 0; i < 12; i++)
            fds[i] = s.m->fd;
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, VHOST_USER_SET_OWNER, NULL, 0, fds, 12),
                                "12 fds");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* Memory regions whose fd is an eventfd, a pipe, a socket. */
static int c_mem_wrong_fd(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(MEM));
    /*
     * An eventfd, a pipe, our socket, /dev/null, the guest memfd opened
     * read-only, and a memfd sealed against writes: none can be mapped
     * shared and writable.
     */
    int p[2] = {-1, -1}, kinds[6];
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", s.m->fd);
    kinds[0] = eventfd(0, EFD_CLOEXEC);
    kinds[1] = pipe2(p, O_CLOEXEC) == 0 ? p[0] : -1;
    kinds[2] = s.fd;
    kinds[3] = open("/dev/null", O_RDWR | O_CLOEXEC);
    kinds[4] = open(path, O_RDONLY | O_CLOEXEC);
    kinds[5] = memfd_create("chaos-sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (kinds[5] >= 0 &&
        (ftruncate(kinds[5], (off_t)s.m->len) < 0 ||
         fcntl(kinds[5], F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW) < 0)) {
        close(kinds[5]);
        kinds[5] = -1;
    }
    unsigned all = ~0u;
    /* Each must be refused on its own: keep only what all of them saw. */
    for (int i = 0; i < 6 && !rc; i++) {
        if (kinds[i] < 0) {
            rc = vhd_chaos__note(&s, -EMFILE, "cannot make fd kind %d: %s", i, strerror(errno));
            break;
        }
        struct vu_mem_region r = vhd_chaos__win_region(&s, 0);
        ctx->observed = 0;
        rc = vhd_chaos__observe(&s, vhd_chaos__mem_table(&s, &r, 1, &kinds[i], 1),
                                "region fd of the wrong kind");
        all &= ctx->observed;
        if (ctx->observed & VHD_CHAOS_CLOSED)
            break;
    }
    ctx->observed = rc ? ctx->observed : all;
    for (int i = 0; i < 6; i++)
        if (kinds[i] >= 0 && i != 2)
            close(kinds[i]);
    if (p[1] >= 0)
        close(p[1]);
    vhd_chaos__close(&s);
    return rc;
}

/* Two regions, one fd. */
static int c_mem_fd_count(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        struct vu_mem_region r[2] = {vhd_chaos__win_region(&s, 0), vhd_chaos__win_region(&s, 1)};
        rc = vhd_chaos__observe(&s, vhd_chaos__mem_table(&s, r, 2, &s.m->fd, 1), "2 regions, 1 fd");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A started ring's kick fd is a memfd: it cannot be polled. */
static int c_kick_memfd(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(KICK));
    if (!rc) {
        int fd = memfd_create("chaos-kick", MFD_CLOEXEC);
        rc = vhd_chaos__observe(&s, vhd_chaos__set_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, fd),
                                "memfd as kick fd");
        if (!rc)
            rc = vhd_chaos__observe(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 1),
                                    "enable");
        close(fd);
        if (!rc && vhd_chaos__needs_reset(&s) == 1)
            ctx->observed |= VHD_CHAOS_BROKEN;
        /* An ack of the kick or enable alone is not an outcome. */
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * A kick fd whose other end is already closed (a pipe, or a socket pair):
 * it is readable (EOF) and hung up for ever, so it can never carry a kick;
 * a back-end that keeps polling it spins. The queue must break instead.
 */
static int kick_hangup(struct vhd_chaos_ctx *ctx, bool sock)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(KICK));
    int p[2] = {-1, -1};
    if (!rc &&
        (sock ? socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, p) : pipe2(p, O_CLOEXEC)) < 0)
        rc = vhd_chaos__note(&s, -errno, "pipe: %s", strerror(errno));
    if (!rc) {
        close(p[1]);
        rc = vhd_chaos__observe(&s, vhd_chaos__set_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, p[0]),
                                "kick fd hung up");
        close(p[0]);
        if (!rc && !(ctx->observed & VHD_CHAOS_NACK))
            rc = vhd_chaos__observe(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 1),
                                    "enable");
        for (int i = 0; !rc && i < 1000 && !(ctx->observed & (VHD_CHAOS_BROKEN | VHD_CHAOS_NACK));
             i++) {
            int b = vhd_chaos__needs_reset(&s);
            if (b == 1)
                ctx->observed |= VHD_CHAOS_BROKEN;
            else if (b < 0)
                rc = b;
            else {
                struct timespec ts = {0, 2000000L};
                nanosleep(&ts, NULL);
            }
        }
    }
    vhd_chaos__close(&s);
    return rc;
}

VHD_CHAOS_VARIANT(c_kick_pipe_hangup, kick_hangup, false)
VHD_CHAOS_VARIANT(c_kick_socket_hangup, kick_hangup, true)

/* Files that are not eventfds, each harmful as a ring fd in its own way (issue 12). */
enum ring_fd_kind {
    RFD_LISTEN, /* a listening socket with a connection waiting: readable, read fails */
    RFD_EPOLL,  /* an epoll fd with a ready event: readable, read fails */
    RFD_FIFO,   /* a FIFO: its poll and reads go to a pipe, writes fill it */
    RFD_MEMFD,  /* a regular file: not pollable, writes land in it */
};

/* Make a file of that kind (*peer: a second fd to close with it, or -1). -errno on failure. */
static int ring_fd_make(enum ring_fd_kind kind, int *peer)
{
    int fd = -1;
    *peer = -1;
    switch (kind) {
    case RFD_LISTEN: {
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -errno;
        /* Autobind: the kernel picks an abstract name. */
        socklen_t len = sizeof(sa_family_t);
        if (bind(fd, (struct sockaddr *)&a, len) < 0 || listen(fd, 4) < 0 ||
            getsockname(fd, (struct sockaddr *)&a, &(socklen_t){sizeof(a)}) < 0)
            goto fail;
        *peer = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (*peer < 0 || connect(*peer, (struct sockaddr *)&a,
                                 (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 6)) < 0)
            goto fail;
        return fd;
    }
    case RFD_EPOLL: {
        fd = epoll_create1(EPOLL_CLOEXEC);
        *peer = eventfd(1, EFD_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN};
        if (fd < 0 || *peer < 0 || epoll_ctl(fd, EPOLL_CTL_ADD, *peer, &ev) < 0)
            goto fail;
        return fd;
    }
    case RFD_FIFO: {
        char path[64];
        snprintf(path, sizeof(path), "/tmp/vhd-chaos-fifo-%d", (int)getpid());
        unlink(path);
        if (mkfifo(path, 0600) < 0)
            return -errno;
        fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
        int err = errno;
        unlink(path);
        return fd < 0 ? -err : fd;
    }
    case RFD_MEMFD:
        fd = memfd_create("chaos-ring-fd", MFD_CLOEXEC);
        return fd < 0 ? -errno : fd;
    }
    return -EINVAL;
fail:;
    int err = errno;
    if (fd >= 0)
        close(fd);
    if (*peer >= 0)
        close(*peer);
    *peer = -1;
    return -err;
}

/*
 * SET_VRING_KICK, CALL or ERR of ring 0 with a file that is not an eventfd
 * (the rest of the ring set up as usual). The back-end must refuse it: a
 * kick fd that is readable but cannot be read makes a worker spin, one whose
 * reads or poll can sleep hangs it (and, through epoll_ctl under the
 * worker's lock, the control thread); writes to a call or error fd that is
 * a file or a pipe go to the wrong place or sleep.
 */
static int ring_fd_case(struct vhd_chaos_ctx *ctx, uint32_t req, enum ring_fd_kind kind)
{
    struct vhd_chaos_sess s;
    enum vhd_chaos_step stop = req == VHOST_USER_SET_VRING_KICK ? VHD_STEP_KICK : VHD_STEP_END;
    int rc = vhd_chaos__steps(ctx, &s, (struct vhd_chaos_plan){.stop = stop});
    int peer = -1, fd = -1;
    if (!rc) {
        fd = ring_fd_make(kind, &peer);
        if (fd < 0)
            rc = vhd_chaos__note(&s, fd, "making the fd: %s", strerror(-fd));
    }
    if (!rc)
        rc = vhd_chaos__observe(&s, vhd_chaos__set_vring_fd(&s, req, 0, fd), "not an eventfd");
    if (fd >= 0)
        close(fd);
    if (peer >= 0)
        close(peer);
    vhd_chaos__close(&s);
    return rc;
}

VHD_CHAOS_VARIANT(c_kick_listen_socket, ring_fd_case, VHOST_USER_SET_VRING_KICK, RFD_LISTEN)
VHD_CHAOS_VARIANT(c_kick_epoll, ring_fd_case, VHOST_USER_SET_VRING_KICK, RFD_EPOLL)
VHD_CHAOS_VARIANT(c_kick_fifo, ring_fd_case, VHOST_USER_SET_VRING_KICK, RFD_FIFO)
VHD_CHAOS_VARIANT(c_call_memfd, ring_fd_case, VHOST_USER_SET_VRING_CALL, RFD_MEMFD)
VHD_CHAOS_VARIANT(c_call_fifo, ring_fd_case, VHOST_USER_SET_VRING_CALL, RFD_FIFO)
VHD_CHAOS_VARIANT(c_err_epoll, ring_fd_case, VHOST_USER_SET_VRING_ERR, RFD_EPOLL)
VHD_CHAOS_VARIANT(c_err_listen_socket, ring_fd_case, VHOST_USER_SET_VRING_ERR, RFD_LISTEN)

/* ADD_MEM_REG with a pipe. */
static int c_add_reg_pipe(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    int p[2];
    if (!rc && pipe2(p, O_CLOEXEC) == 0) {
        struct vu_mem_single m = {.region = vhd_chaos__win_region(&s, 1)};
        m.region.gpa += 16u * VHD_CHAOS_WIN_SIZE;
        m.region.uva += 4u * VHD_CHAOS_WIN_SIZE;
        m.region.mmap_offset = 0;
        rc = vhd_chaos__observe(&s,
                                vhd_chaos__ack(&s, VHOST_USER_ADD_MEM_REG, &m, sizeof(m), &p[1], 1),
                                "ADD_MEM_REG with a pipe");
        close(p[0]);
        close(p[1]);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ======================= cases: features ======================= */

static int c_features_unoffered(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        uint64_t f = s.offered | BIT(63) | BIT(VIRTIO_F_ACCESS_PLATFORM);
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, VHOST_USER_SET_FEATURES, &f, 8, NULL, 0),
                                "features not offered");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* SET_PROTOCOL_FEATURES with a bit never offered, before REPLY_ACK exists. */
static int c_proto_unoffered(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__open(ctx, &s);
    uint64_t off;
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__call_u64(&s, VHOST_USER_GET_PROTOCOL_FEATURES, &off),
                             "GET_PROTOCOL");
    if (!rc) {
        uint64_t p = BIT(VHOST_USER_PROTOCOL_F_INBAND_NOTIFICATIONS) | BIT(60);
        rc = vhd_chaos__observe(
            &s, vhd_chaos__ack(&s, VHOST_USER_SET_PROTOCOL_FEATURES, &p, 8, NULL, 0),
            "protocol features not offered");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A request gated by a protocol feature that was not negotiated (own reply: must close). */
static int c_gated_not_negotiated(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc =
        vhd_chaos__steps(ctx, &s, UPTO(FEATURES, .proto = BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK)));
    if (!rc) {
        uint64_t v;
        rc = vhd_chaos__observe(&s, vhd_chaos__call_u64(&s, VHOST_USER_GET_MAX_MEM_SLOTS, &v),
                                "GET_MAX_MEM_SLOTS without CONFIGURE_MEM_SLOTS");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* Virtio features changed under a started ring. */
static int c_features_change_started(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc)
        rc = vhd_chaos__observe(
            &s, vhd_chaos__set_features(&s, BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_F_EVENT_IDX)),
            "features changed on a started ring");
    vhd_chaos__close(&s);
    return rc;
}

/* Ring sizes 0, 65536 and 7 (split). */
static int c_vring_num_bad(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    static const uint32_t bad[] = {0, 65536, 7, 0xffffffffu};
    unsigned all = ~0u;
    for (unsigned i = 0; i < 4 && !rc; i++) {
        ctx->observed = 0;
        rc = vhd_chaos__observe(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_NUM, 0, bad[i]),
                                "ring size");
        all &= ctx->observed;
    }
    ctx->observed = rc ? ctx->observed : all;
    vhd_chaos__close(&s);
    return rc;
}

/* Ring index 200 on a reply-less request (nack) ... */
static int c_ring_index_oob(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    if (!rc)
        rc = vhd_chaos__observe(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_NUM, 200, QSZ),
                                "ring index 200");
    vhd_chaos__close(&s);
    return rc;
}

/* ... and on GET_VRING_BASE, which has no error reply: the session must end. */
static int c_get_base_oob(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    if (!rc) {
        struct vu_vring_state st = {.index = 0xffffu, .num = 0};
        struct vu_hdr h;
        union vu_payload p;
        rc = vhd_chaos__observe(
            &s, vhd_chaos__call(&s, VHOST_USER_GET_VRING_BASE, &st, sizeof(st), &h, &p),
            "GET_VRING_BASE 0xffff");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* Reserved bits in a SET_VRING_KICK word. */
static int c_kick_reserved_bits(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(KICK));
    if (!rc) {
        uint64_t v = 0 | (1ull << 40);
        int fd = s.kick[0];
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, VHOST_USER_SET_VRING_KICK, &v, 8, &fd, 1),
                                "reserved bits");
    }
    vhd_chaos__close(&s);
    return rc;
}

static int c_enable_bad(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    if (!rc)
        rc = vhd_chaos__observe(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 2),
                                "enable value 2");
    vhd_chaos__close(&s);
    return rc;
}

static int c_status_bad(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    if (!rc) {
        uint64_t v = 0x1ff;
        rc = vhd_chaos__observe(&s, vhd_chaos__ack(&s, VHOST_USER_SET_STATUS, &v, 8, NULL, 0),
                                "status 0x1ff");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* GET_CONFIG beyond the config space, and of more than 256 bytes. */
static int c_config_oob(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        struct vu_config c;
        memset(&c, 0, sizeof(c));
        c.offset = 250;
        c.size = 100;
        struct vu_hdr h;
        union vu_payload p;
        rc = vhd_chaos__call(&s, VHOST_USER_GET_CONFIG, &c, VU_CONFIG_HDR_SIZE + 100, &h, &p);
        if (rc == 0)
            rc = h.size == 0 ? VHD_CHAOS_NACK : 0;
        rc = vhd_chaos__observe(&s, rc, "GET_CONFIG 100 bytes at 250");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A packed ring started with the base word given. */
static int packed_base(struct vhd_chaos_ctx *ctx, uint32_t base, const char *what)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(KICK, .virtio = BIT(VIRTIO_F_RING_PACKED)));
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_BASE, 0, base),
                             "SET_VRING_BASE");
    if (!rc)
        rc = vhd_chaos__kick_observe(&s, what);
    vhd_chaos__close(&s);
    return rc;
}

/* A packed ring whose base names a slot beyond the ring. */
VHD_CHAOS_VARIANT(c_packed_base_oob, packed_base, 0x80008000u | 100u,
                  "start with base slot 100 of 8")

/* A packed ring whose base names a used slot beyond the ring. */
VHD_CHAOS_VARIANT(c_packed_base_used_oob, packed_base, 0x80008000u | (100u << 16),
                  "start with used slot 100 of 8")

/* ======================= cases: memory tables ======================= */

static int mem_case(struct vhd_chaos_ctx *ctx, struct vu_mem_region *r, unsigned n,
                    const char *what)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        int fds[8];
        for (unsigned i = 0; i < 8; i++)
            fds[i] = s.m->fd;
        rc = vhd_chaos__observe(&s, vhd_chaos__mem_table(&s, r, n, fds, n > 8 ? 8 : n), what);
    }
    vhd_chaos__close(&s);
    return rc;
}

static struct vu_mem_region ctx_region(struct vhd_chaos_ctx *ctx, unsigned i)
{
    struct vu_mem_region r = {.gpa = ctx->mem->win[i].gpa,
                              .size = VHD_CHAOS_WIN_SIZE,
                              .uva = (uint64_t)(uintptr_t)ctx->mem->win[i].hva,
                              .mmap_offset = ctx->mem->win[i].off};
    return r;
}

static int c_overlap_gpa(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r[2] = {ctx_region(ctx, 0), ctx_region(ctx, 1)};
    r[1].gpa = r[0].gpa + 4096;
    return mem_case(ctx, r, 2, "regions overlapping in GPA");
}

static int c_overlap_uva(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r[2] = {ctx_region(ctx, 0), ctx_region(ctx, 1)};
    r[1].uva = r[0].uva + 4096;
    return mem_case(ctx, r, 2, "regions overlapping in UVA");
}

static int c_gpa_overflow(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r = ctx_region(ctx, 0);
    r.gpa = UINT64_MAX - 4095;
    return mem_case(ctx, &r, 1, "GPA + size wraps");
}

static int c_uva_overflow(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r = ctx_region(ctx, 0);
    r.uva = UINT64_MAX - 4095;
    return mem_case(ctx, &r, 1, "UVA + size wraps");
}

static int c_size_zero(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r = ctx_region(ctx, 0);
    r.size = 0;
    return mem_case(ctx, &r, 1, "region of 0 bytes");
}

static int c_size_huge(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r = ctx_region(ctx, 0);
    r.size = 1ull << 62;
    r.gpa = 0;
    r.uva = 0x1000;
    return mem_case(ctx, &r, 1, "region of 2^62 bytes");
}

/*
 * Issue 12: guest memory beyond the device's cap (default 16 TiB, mem.h),
 * from a sparse memfd that costs the front-end nothing and the back-end
 * address space every other tenant needs: SET_MEM_TABLE of one 17 TiB
 * region, or ADD_MEM_REG of 16 TiB on top of the usual table. Refused.
 */
#define OVER_CAP (17ull << 40)

static int over_cap(struct vhd_chaos_ctx *ctx, bool add)
{
    struct vhd_chaos_sess s;
    int rc = add ? vhd_chaos__setup(ctx, &s, 0) : vhd_chaos__steps(ctx, &s, UPTO(MEM));
    int fd = -1;
    if (!rc) {
        fd = memfd_create("chaos-over-cap", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, (off_t)OVER_CAP) < 0)
            rc = vhd_chaos__note(&s, -errno, "memfd of 17 TiB: %s", strerror(errno));
    }
    if (!rc && add) {
        struct vu_mem_single m = {
            .region = {.gpa = 1ull << 44, .size = 16ull << 40, .uva = 1ull << 45}};
        rc = vhd_chaos__observe(&s,
                                vhd_chaos__ack(&s, VHOST_USER_ADD_MEM_REG, &m, sizeof(m), &fd, 1),
                                "ADD_MEM_REG of 16 TiB");
    } else if (!rc) {
        struct vu_mem_region r = {.gpa = 0, .size = OVER_CAP, .uva = 1ull << 45};
        rc = vhd_chaos__observe(&s, vhd_chaos__mem_table(&s, &r, 1, &fd, 1),
                                "SET_MEM_TABLE of 17 TiB");
    }
    if (fd >= 0)
        close(fd);
    vhd_chaos__close(&s);
    return rc;
}

VHD_CHAOS_VARIANT(c_mem_over_cap, over_cap, false)
VHD_CHAOS_VARIANT(c_add_reg_over_cap, over_cap, true)

static int c_mmap_beyond(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r = ctx_region(ctx, 0);
    r.mmap_offset = ctx->mem->len;
    return mem_case(ctx, &r, 1, "mmap offset at the end of the file");
}

static int c_mmap_unaligned_beyond(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r = ctx_region(ctx, 1);
    r.mmap_offset += VHD_CHAOS_GUARD + 1; /* unaligned, and the window ends past the file */
    return mem_case(ctx, &r, 1, "unaligned mmap offset, range beyond the file");
}

static int c_mmap_offset_wraps(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r = ctx_region(ctx, 0);
    r.mmap_offset = UINT64_MAX - 100;
    return mem_case(ctx, &r, 1, "mmap offset + size wraps");
}

static int c_nine_regions(struct vhd_chaos_ctx *ctx)
{
    struct vu_mem_region r[9];
    for (unsigned i = 0; i < 9; i++) {
        r[i] = ctx_region(ctx, 0);
        r[i].size = 4096;
        r[i].gpa += 4096ull * i;
        r[i].uva += 4096ull * i;
        r[i].mmap_offset += 4096ull * i;
    }
    return mem_case(ctx, r, 9, "9 regions");
}

/*
 * A legal but unusual table: region 0 starts 512 bytes into its page
 * (unaligned mmap offset). A write then a read through it must land exactly
 * where the table says: a back-end that mis-rounds the offset writes
 * outside the buffers (memory check) or reads back other bytes.
 */
static int c_mmap_unaligned_exact(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(MEM));
    if (rc) {
        vhd_chaos__close(&s);
        return rc;
    }
    struct vu_mem_region r[2] = {vhd_chaos__win_region(&s, 0), vhd_chaos__win_region(&s, 1)};
    r[0].mmap_offset += 512;
    r[0].uva += 512;
    r[0].size -= 512;
    r[1].gpa = r[0].gpa + r[0].size;
    s.r0_off = 512;
    s.r1_gpa = r[1].gpa;
    int fds[2] = {s.m->fd, s.m->fd};
    rc = vhd_chaos__must(&s, vhd_chaos__mem_table(&s, r, 2, fds, 2), "SET_MEM_TABLE (offset 512)");
    if (!rc)
        rc = vhd_chaos__ring_start(&s, 0, OFF_R0);
    if (!rc) {
        uint8_t *a = vhd_chaos__hva(&s, OFF_DATA), *b = vhd_chaos__hva(&s, OFF_DATA + 4096);
        for (unsigned i = 0; i < 4096; i++)
            a[i] = (uint8_t)(i * 7 + 3);
        vhd_chaos__mirror(&s, OFF_DATA, 4096);
        vhd_chaos__blk_hdr(&s, 0, VIRTIO_BLK_T_OUT, 64);
        vhd_chaos__blk_hdr(&s, 1, VIRTIO_BLK_T_IN, 64);
        vhd_chaos__allow(&s, OFF_STAT, 1);
        vhd_chaos__allow(&s, OFF_STAT + 64, 1);
        vhd_chaos__allow(&s, OFF_DATA + 4096, 4096);
        vhd_chaos__sdesc(&s, OFF_R0, 0, vhd_chaos__gpa(&s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
        vhd_chaos__sdesc(&s, OFF_R0, 1, vhd_chaos__gpa(&s, OFF_DATA), 4096, VRING_DESC_F_NEXT, 2);
        vhd_chaos__sdesc(&s, OFF_R0, 2, vhd_chaos__gpa(&s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
        vhd_chaos__sdesc(&s, OFF_R0, 3, vhd_chaos__gpa(&s, OFF_HDR + 64), 16, VRING_DESC_F_NEXT, 4);
        vhd_chaos__sdesc(&s, OFF_R0, 4, vhd_chaos__gpa(&s, OFF_DATA + 4096), 4096,
                         VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 5);
        vhd_chaos__sdesc(&s, OFF_R0, 5, vhd_chaos__gpa(&s, OFF_STAT + 64), 1, VRING_DESC_F_WRITE,
                         0);
        struct vhd_chaos_used u0, u1;
        vhd_chaos__split_publish(&s, OFF_R0, 0, 1);
        vhd_chaos__kick(&s, 0);
        rc = vhd_chaos__await_used(&s, OFF_R0, 0, &u0, s.tmo);
        if (!rc && u0.got) {
            vhd_chaos__split_publish(&s, OFF_R0, 3, 2);
            vhd_chaos__kick(&s, 0);
            rc = vhd_chaos__await_used(&s, OFF_R0, 1, &u1, s.tmo);
            if (!rc && u1.got && vhd_chaos__blk_status(&s, 0) == 0 &&
                vhd_chaos__blk_status(&s, 1) == 0 && memcmp(a, b, 4096) == 0)
                ctx->observed |= VHD_CHAOS_SERVED;
            else if (!rc)
                vhd_chaos__note(&s, 0, "status %u/%u, data %s", vhd_chaos__blk_status(&s, 0),
                                vhd_chaos__blk_status(&s, 1),
                                memcmp(a, b, 4096) ? "differs" : "same");
        } else if (!rc) {
            vhd_chaos__note(&s, 0, "write not completed");
        }
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ADD_MEM_REG overlapping a region of the table. */
static int c_add_overlap(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    if (!rc) {
        struct vu_mem_single m = {.region = vhd_chaos__win_region(&s, 1)};
        m.region.gpa = s.m->win[0].gpa + 8192; /* inside region 0 */
        m.region.uva += 3 * VHD_CHAOS_WIN_SIZE;
        int fd = s.m->fd;
        rc = vhd_chaos__observe(&s,
                                vhd_chaos__ack(&s, VHOST_USER_ADD_MEM_REG, &m, sizeof(m), &fd, 1),
                                "ADD_MEM_REG overlapping region 0");
    }
    vhd_chaos__close(&s);
    return rc;
}

static int c_rem_unknown(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    if (!rc) {
        struct vu_mem_single m = {.region = vhd_chaos__win_region(&s, 1)};
        m.region.size -= 4096;
        rc = vhd_chaos__observe(&s,
                                vhd_chaos__ack(&s, VHOST_USER_REM_MEM_REG, &m, sizeof(m), NULL, 0),
                                "REM_MEM_REG of a region that does not exist");
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * ADD_MEM_REG until the table is full: one 4 KiB region per page of both
 * windows, without a SET_MEM_TABLE; the one past the advertised slot count
 * must be refused, and all of it unmapped when the session ends.
 */
static int c_add_until_full(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    uint64_t slots = 0;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__call_u64(&s, VHOST_USER_GET_MAX_MEM_SLOTS, &slots),
                             "GET_MAX_MEM_SLOTS");
    const unsigned per_win = VHD_CHAOS_WIN_SIZE / 4096;
    if (!rc && slots >= (uint64_t)VHD_CHAOS_WINDOWS * per_win)
        rc = vhd_chaos__note(&s, -ENOSPC, "%llu slots: more than this case can fill",
                             (unsigned long long)slots);
    for (unsigned i = 0; !rc && i <= slots; i++) {
        unsigned w = i / per_win, pg = i % per_win;
        struct vu_mem_single m = {.region = vhd_chaos__win_region(&s, w)};
        m.region.gpa += 4096ull * pg;
        m.region.uva += 4096ull * pg;
        m.region.mmap_offset += 4096ull * pg;
        m.region.size = 4096;
        int fd = s.m->fd;
        int a = vhd_chaos__ack(&s, VHOST_USER_ADD_MEM_REG, &m, sizeof(m), &fd, 1);
        if (i < slots)
            rc = vhd_chaos__must(&s, a, "ADD_MEM_REG below the slot count");
        else
            rc = vhd_chaos__observe(&s, a, "ADD_MEM_REG past the slot count");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ======================= cases: inflight areas (INFLIGHT_SHMFD) ======================= */

/* SET_INFLIGHT_FD of `in` with fd (a memfd of file_len bytes when fd < 0), after `started`. */
static int inflight_msg(struct vhd_chaos_ctx *ctx, struct vu_inflight in, int fd, off_t file_len,
                        bool started, const char *what)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(
        ctx, &s, UPTO(FEATURES, .proto = WANT_PROTO | BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)));
    if (!rc && !(s.proto & BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)))
        rc = vhd_chaos__note(&s, -ENOTSUP, "INFLIGHT_SHMFD not offered");
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__set_features(&s, BIT(VIRTIO_F_VERSION_1)),
                             "SET_FEATURES");
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__mem_default(&s), "SET_MEM_TABLE");
    if (!rc && started)
        rc = vhd_chaos__ring_start(&s, 0, OFF_R0);
    int own = -1;
    if (!rc && fd < 0) {
        own = fd = memfd_create("chaos-inflight", MFD_CLOEXEC);
        if (fd < 0 || ftruncate(fd, file_len) < 0)
            rc = vhd_chaos__note(&s, -errno, "memfd: %s", strerror(errno));
    }
    if (!rc)
        rc = vhd_chaos__observe(
            &s, vhd_chaos__ack(&s, VHOST_USER_SET_INFLIGHT_FD, &in, sizeof(in), &fd, 1), what);
    if (own >= 0)
        close(own);
    vhd_chaos__close(&s);
    return rc;
}

/* The split size of one ring of QSZ: 16 + 16 * QSZ, padded to 64. */
#define INFL_SIZE 192u

static int c_inflight_beyond_file(struct vhd_chaos_ctx *ctx)
{
    struct vu_inflight in = {.mmap_size = INFL_SIZE, .num_queues = 1, .queue_size = QSZ};
    return inflight_msg(ctx, in, -1, 64, false, "inflight area past the end of its file");
}

static int c_inflight_offset_unaligned(struct vhd_chaos_ctx *ctx)
{
    struct vu_inflight in = {
        .mmap_size = INFL_SIZE, .mmap_offset = 100, .num_queues = 1, .queue_size = QSZ};
    return inflight_msg(ctx, in, -1, 1 << 16, false, "inflight offset 100");
}

static int c_inflight_offset_wraps(struct vhd_chaos_ctx *ctx)
{
    struct vu_inflight in = {.mmap_size = INFL_SIZE,
                             .mmap_offset = UINT64_MAX - 4095,
                             .num_queues = 1,
                             .queue_size = QSZ};
    return inflight_msg(ctx, in, -1, 1 << 16, false, "inflight offset + size wraps");
}

static int c_inflight_size_huge(struct vhd_chaos_ctx *ctx)
{
    struct vu_inflight in = {.mmap_size = 1ull << 40, .num_queues = 1, .queue_size = QSZ};
    return inflight_msg(ctx, in, -1, 1 << 16, false, "inflight area of 1 TiB");
}

static int c_inflight_shape(struct vhd_chaos_ctx *ctx)
{
    struct vu_inflight in = {.mmap_size = INFL_SIZE, .num_queues = 500, .queue_size = 0};
    return inflight_msg(ctx, in, -1, 1 << 16, false, "inflight 500 queues of 0");
}

static int c_inflight_eventfd(struct vhd_chaos_ctx *ctx)
{
    struct vu_inflight in = {.mmap_size = INFL_SIZE, .num_queues = 1, .queue_size = QSZ};
    int fd = eventfd(0, EFD_CLOEXEC);
    int rc = inflight_msg(ctx, in, fd, 0, false, "inflight area in an eventfd");
    close(fd);
    return rc;
}

/*
 * Issue 12: an inflight area in a hugetlbfs file (2 MiB pages), which the
 * front-end truncates before the ring starts and the back-end reads the
 * area. The SIGBUS guard cannot replace part of a huge page by base pages,
 * so a back-end that mapped it dies there; it must refuse the area. The
 * back-end maps it only with a free huge page (the test reserves some when
 * it can); without hugetlbfs at all the case cannot run.
 */
static int c_inflight_hugetlb(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    struct vu_inflight in = {.mmap_size = INFL_SIZE, .num_queues = 1, .queue_size = QSZ};
    int rc = vhd_chaos__steps(
        ctx, &s, UPTO(FEATURES, .proto = WANT_PROTO | BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)));
    if (!rc && !(s.proto & BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)))
        rc = vhd_chaos__note(&s, -ENOTSUP, "INFLIGHT_SHMFD not offered");
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__set_features(&s, BIT(VIRTIO_F_VERSION_1)),
                             "SET_FEATURES");
    if (!rc)
        rc = vhd_chaos__must(&s, vhd_chaos__mem_default(&s), "SET_MEM_TABLE");
    int fd = -1;
    if (!rc) {
        fd = memfd_create("chaos-inflight-huge", MFD_CLOEXEC | MFD_HUGETLB);
        if (fd < 0 || ftruncate(fd, 2 << 20) < 0)
            rc = vhd_chaos__note(&s, -errno, "hugetlbfs memfd of 2 MiB: %s", strerror(errno));
    }
    if (!rc)
        rc = vhd_chaos__observe(
            &s, vhd_chaos__ack(&s, VHOST_USER_SET_INFLIGHT_FD, &in, sizeof(in), &fd, 1),
            "inflight area on hugetlbfs");
    if (!rc && !(ctx->observed & VHD_CHAOS_NACK)) {
        /* Accepted: take the file away and make the back-end read the area. */
        if (ftruncate(fd, 0) < 0)
            rc = vhd_chaos__note(&s, -errno, "truncate: %s", strerror(errno));
        if (!rc)
            rc = vhd_chaos__observe(&s, vhd_chaos__ring_start(&s, 0, OFF_R0),
                                    "ring start over the truncated area");
        if (!rc && vhd_chaos__needs_reset(&s) == 1)
            ctx->observed |= VHD_CHAOS_BROKEN;
    }
    if (fd >= 0)
        close(fd);
    vhd_chaos__close(&s);
    return rc;
}

static int c_inflight_while_started(struct vhd_chaos_ctx *ctx)
{
    struct vu_inflight in = {.mmap_size = INFL_SIZE, .num_queues = 1, .queue_size = QSZ};
    return inflight_msg(ctx, in, -1, 1 << 16, true, "inflight area under a started ring");
}

/* GET_INFLIGHT_FD for more queues than the device has: answered with no area. */
static int c_get_inflight_shape(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(
        ctx, &s, UPTO(FEATURES, .proto = WANT_PROTO | BIT(VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD)));
    if (!rc) {
        struct vu_inflight in = {.num_queues = 0xffff, .queue_size = 0xffff};
        struct vu_hdr h;
        union vu_payload p;
        int fd = -1;
        rc = vhd_chaos__call_fd(&s, VHOST_USER_GET_INFLIGHT_FD, &in, sizeof(in), &h, &p, &fd);
        if (rc == 0)
            rc = fd < 0 && h.size == sizeof(in) && p.inflight.mmap_size == 0 ? VHD_CHAOS_NACK : 0;
        if (fd >= 0)
            close(fd);
        rc = vhd_chaos__observe(&s, rc, "GET_INFLIGHT_FD of 65535 queues of 65535");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ======================= cases: rings ======================= */

/* Ring 0 with the given addresses; the start must be refused or break the device. */
static int ring_case(struct vhd_chaos_ctx *ctx, uint64_t desc, uint64_t avail, uint64_t used,
                     bool packed, const char *what)
{
    struct vhd_chaos_sess s;
    int rc =
        vhd_chaos__steps(ctx, &s, UPTO(BASE, .virtio = packed ? BIT(VIRTIO_F_RING_PACKED) : 0));
    if (!rc) {
        if (!desc)
            desc = vhd_chaos__uva(&s, OFF_R0);
        if (!avail)
            avail = vhd_chaos__uva(&s, OFF_R0 + RING_AVAIL);
        if (!used)
            used = vhd_chaos__uva(&s, OFF_R0 + RING_USED);
        rc = vhd_chaos__set_addr(&s, 0, desc, avail, used);
        if (rc) {
            rc = vhd_chaos__observe(&s, rc, what); /* refused at SET_VRING_ADDR already */
        } else {
            rc = vhd_chaos__kick_observe(&s, what);
            if (!rc && vhd_chaos__needs_reset(&s) == 1)
                ctx->observed |= VHD_CHAOS_BROKEN;
        }
    }
    vhd_chaos__close(&s);
    return rc;
}

static uint64_t ctx_uva(struct vhd_chaos_ctx *ctx, unsigned w, size_t off)
{
    return (uint64_t)(uintptr_t)(ctx->mem->win[w].hva + off);
}

VHD_CHAOS_VARIANT(c_desc_outside, ring_case, 0x10000, 0, 0, false,
                  "descriptor table outside guest memory")
VHD_CHAOS_VARIANT(c_used_outside, ring_case, 0, 0, ctx_uva(ctx, 1, VHD_CHAOS_WIN_SIZE) + 64, false,
                  "used ring outside guest memory")

static int c_avail_in_guard(struct vhd_chaos_ctx *ctx)
{
    /* The guard before window 1 is mapped in our process, but not a region. */
    return ring_case(ctx, 0, ctx_uva(ctx, 1, 0) - 256, 0, false, "avail ring in a guard");
}

static int c_desc_crosses(struct vhd_chaos_ctx *ctx)
{
    /* The table's last 16 bytes lie past window 0 (in the guard). */
    return ring_case(ctx, ctx_uva(ctx, 0, VHD_CHAOS_WIN_SIZE - 16 * (QSZ - 1)), 0, 0, false,
                     "descriptor table crossing the region's end");
}

VHD_CHAOS_VARIANT(c_used_crosses, ring_case, 0, 0, ctx_uva(ctx, 0, VHD_CHAOS_WIN_SIZE - 8), false,
                  "used ring crossing the region's end")
VHD_CHAOS_VARIANT(c_packed_desc_crosses, ring_case, ctx_uva(ctx, 0, VHD_CHAOS_WIN_SIZE - 16), 0, 0,
                  true, "packed ring crossing the region's end")
VHD_CHAOS_VARIANT(c_ring_misaligned, ring_case, ctx_uva(ctx, 0, OFF_R0) + 8, 0, 0, false,
                  "descriptor table at +8")
VHD_CHAOS_VARIANT(c_ring_uva_wraps, ring_case, UINT64_MAX - 15, 0, 0, false,
                  "descriptor table at 2^64 - 16")

/* ======================= cases: order ======================= */

/* SET_VRING_KICK after the ring's NUM and ADDR, with the step `skip` leaves out never done. */
static int kick_before(struct vhd_chaos_ctx *ctx, struct vhd_chaos_plan p, const char *what)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, p);
    if (!rc)
        rc = vhd_chaos__kick_observe(&s, what);
    vhd_chaos__close(&s);
    return rc;
}

VHD_CHAOS_VARIANT(c_kick_before_mem, kick_before,
                  UPTO(KICK, .skip = SKIP(MEM) | SKIP(BASE) | SKIP(CALL)),
                  "kick before SET_MEM_TABLE")
VHD_CHAOS_VARIANT(c_kick_before_features, kick_before,
                  UPTO(KICK, .skip = SKIP(FEATURES) | SKIP(BASE) | SKIP(CALL)),
                  "kick before SET_FEATURES")

static int c_kick_before_addr(struct vhd_chaos_ctx *ctx)
{
    /* The ring's layout is not even written: only SET_VRING_NUM. */
    return kick_before(ctx, UPTO(ADDR, .skip = SKIP(LAYOUT) | SKIP(BASE)),
                       "kick before SET_VRING_ADDR");
}

static int c_addr_on_started(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc)
        rc = vhd_chaos__observe(&s,
                                vhd_chaos__set_addr(&s, 0, vhd_chaos__uva(&s, OFF_R1),
                                                    vhd_chaos__uva(&s, OFF_R1 + RING_AVAIL),
                                                    vhd_chaos__uva(&s, OFF_R1 + RING_USED)),
                                "SET_VRING_ADDR on a started ring");
    vhd_chaos__close(&s);
    return rc;
}

static int c_num_on_started(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc)
        rc = vhd_chaos__observe(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_NUM, 0, 2 * QSZ),
                                "SET_VRING_NUM on a started ring");
    vhd_chaos__close(&s);
    return rc;
}

static int c_base_on_started(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc)
        rc = vhd_chaos__observe(&s, vhd_chaos__set_state(&s, VHOST_USER_SET_VRING_BASE, 0, 5),
                                "SET_VRING_BASE on a started ring");
    vhd_chaos__close(&s);
    return rc;
}

/* REM_MEM_REG of the region a started ring lives in. */
static int c_rem_in_use(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc) {
        struct vu_mem_single m = {.region = vhd_chaos__win_region(&s, 0)};
        rc = vhd_chaos__observe(&s,
                                vhd_chaos__ack(&s, VHOST_USER_REM_MEM_REG, &m, sizeof(m), NULL, 0),
                                "REM_MEM_REG of the ring's region");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* A new memory table without the region a started ring lives in. */
static int c_table_drops_ring(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc) {
        struct vu_mem_region r = vhd_chaos__win_region(&s, 1);
        int fd = s.m->fd;
        rc = vhd_chaos__observe(&s, vhd_chaos__mem_table(&s, &r, 1, &fd, 1),
                                "SET_MEM_TABLE without the ring");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ADD_MEM_REG when CONFIGURE_MEM_SLOTS was not negotiated. */
static int c_add_reg_not_negotiated(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc =
        vhd_chaos__steps(ctx, &s, UPTO(FEATURES, .proto = BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK)));
    if (!rc) {
        struct vu_mem_single m = {.region = vhd_chaos__win_region(&s, 0)};
        int fd = s.m->fd;
        rc = vhd_chaos__observe(&s,
                                vhd_chaos__ack(&s, VHOST_USER_ADD_MEM_REG, &m, sizeof(m), &fd, 1),
                                "ADD_MEM_REG not negotiated");
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * In-flight work, then REM_MEM_REG of the data buffer's region and
 * RESET_DEVICE: the request (on window 1) must not be lost into unmapped
 * memory. Ring in window 0, data in window 1; the removal is refused while
 * the ring runs or, if the request already finished, the region goes.
 */
static int c_rem_data_region(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc) {
        /* A request reading into window 1 (the whole window: 1 MiB) */
        vhd_chaos__blk_hdr(&s, 0, VIRTIO_BLK_T_IN, 0);
        vhd_chaos__allow(&s, OFF_STAT, 1);
        vhd_chaos__allow(&s, VHD_CHAOS_WIN_SIZE, VHD_CHAOS_WIN_SIZE); /* window 1 */
        vhd_chaos__sdesc(&s, OFF_R0, 0, vhd_chaos__gpa(&s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
        vhd_chaos__sdesc(&s, OFF_R0, 1, s.m->win[1].gpa, VHD_CHAOS_WIN_SIZE,
                         VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
        vhd_chaos__sdesc(&s, OFF_R0, 2, vhd_chaos__gpa(&s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
        vhd_chaos__split_publish(&s, OFF_R0, 0, 1);
        vhd_chaos__kick(&s, 0);
        struct vu_mem_single m = {.region = vhd_chaos__win_region(&s, 1)};
        int r1 = vhd_chaos__ack(&s, VHOST_USER_REM_MEM_REG, &m, sizeof(m), NULL, 0);
        struct vhd_chaos_used u;
        rc = vhd_chaos__await_used(&s, OFF_R0, 0, &u, s.tmo);
        if (!rc) {
            /* Either refused, or accepted after the request completed (then it must be OK). */
            if (r1 == 0 && u.got && vhd_chaos__blk_status(&s, 0) == 0)
                ctx->observed |= VHD_CHAOS_SERVED;
            else
                rc = vhd_chaos__observe(&s, r1, "REM_MEM_REG of an in-flight buffer's region");
        }
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ======================= cases: more unsupported and hostile requests ======================= */

/* SET_INFLIGHT_FD (not offered) with an fd: refused, the fd closed. */
static int c_set_inflight_fd(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        struct vu_inflight in = {.mmap_size = 4096, .num_queues = 1, .queue_size = QSZ};
        int fd = memfd_create("chaos-inflight", MFD_CLOEXEC);
        rc = vhd_chaos__observe(
            &s, vhd_chaos__ack(&s, VHOST_USER_SET_INFLIGHT_FD, &in, sizeof(in), &fd, 1),
            "SET_INFLIGHT_FD");
        close(fd);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* GET_INFLIGHT_FD (not offered): has a reply but no error form: the session ends. */
static int c_get_inflight_fd(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        struct vu_inflight in = {.mmap_size = 0, .num_queues = 1, .queue_size = QSZ};
        struct vu_hdr h;
        union vu_payload p;
        rc = vhd_chaos__observe(
            &s, vhd_chaos__call(&s, VHOST_USER_GET_INFLIGHT_FD, &in, sizeof(in), &h, &p),
            "GET_INFLIGHT_FD");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* An IOTLB message without IOMMU_PLATFORM. */
static int c_iotlb_msg(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__setup(ctx, &s, 0);
    if (!rc) {
        struct vu_iotlb t = {
            .iova = 0, .size = 4096, .uva = vhd_chaos__uva(&s, 0), .perm = 3, .type = 2};
        struct vu_hdr h;
        union vu_payload p;
        rc = vhd_chaos__call(&s, VHOST_USER_IOTLB_MSG, &t, sizeof(t), &h, &p);
        if (rc == 0)
            rc = h.size == 8 && p.u64 ? VHD_CHAOS_NACK : 0;
        rc = vhd_chaos__observe(&s, rc, "IOTLB_MSG");
    }
    vhd_chaos__close(&s);
    return rc;
}

/* SET_CONFIG of the read-only capacity field. */
static int c_set_config_ro(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__steps(ctx, &s, UPTO(FEATURES));
    if (!rc) {
        struct vu_config c;
        memset(&c, 0xff, sizeof(c));
        c.offset = 0;
        c.size = 8;
        c.flags = VHOST_USER_CONFIG_FLAG_FRONTEND;
        rc = vhd_chaos__observe(
            &s, vhd_chaos__ack(&s, VHOST_USER_SET_CONFIG, &c, VU_CONFIG_HDR_SIZE + 8, NULL, 0),
            "SET_CONFIG of the capacity");
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * The back-end channel is a memfd, not a socket; then a ring start that
 * breaks the device makes the back-end try to notify on it.
 */
static int c_backend_fd_memfd(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    uint64_t p = 0;
    int rc = vhd_chaos__open(ctx, &s);
    if (!rc)
        rc = vhd_chaos__must(
            &s, vhd_chaos__call_u64(&s, VHOST_USER_GET_PROTOCOL_FEATURES, &s.proto_offered),
            "GET_PROTOCOL_FEATURES");
    if (!rc) {
        p = s.proto_offered & WANT_PROTO;
        rc = vhd_chaos__must(&s,
                             vhd_chaos__send_raw(&s, VHOST_USER_SET_PROTOCOL_FEATURES,
                                                 VHOST_USER_VERSION, 8, &p, 8, NULL, 0),
                             "SET_PROTOCOL_FEATURES");
        s.proto = p;
    }
    if (!rc) {
        int fd = memfd_create("chaos-backend", MFD_CLOEXEC);
        int a = vhd_chaos__ack(&s, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, &fd, 1);
        close(fd);
        if (a > 0)
            rc = vhd_chaos__observe(&s, a, "SET_BACKEND_REQ_FD with a memfd");
        else if (a < 0)
            rc = a;
        else
            rc = vhd_chaos__must(&s, vhd_chaos__set_features(&s, BIT(VIRTIO_F_VERSION_1)),
                                 "SET_FEATURES");
        if (!a && !rc)
            rc = vhd_chaos__must(&s, vhd_chaos__mem_default(&s), "SET_MEM_TABLE");
        if (!a && !rc)
            rc = vhd_chaos__ring_prepare(&s, 0, OFF_R0);
        if (!a && !rc)
            rc = vhd_chaos__must(&s, vhd_chaos__set_addr(&s, 0, 0x10000, 0x20000, 0x30000),
                                 "SET_VRING_ADDR");
        if (!a && !rc) {
            rc = vhd_chaos__kick_observe(&s, "start a ring outside memory");
            if (!rc && vhd_chaos__needs_reset(&s) == 1)
                ctx->observed |= VHD_CHAOS_BROKEN;
        }
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ======================= cases: control messages while I/O is in flight ======================= */

/* A 1 MiB read into window 1 (all of it) as request 0, published and kicked. */
static void big_read(struct vhd_chaos_sess *s)
{
    vhd_chaos__blk_hdr(s, 0, VIRTIO_BLK_T_IN, 0);
    vhd_chaos__allow(s, OFF_STAT, 1);
    vhd_chaos__allow(s, VHD_CHAOS_WIN_SIZE, VHD_CHAOS_WIN_SIZE);
    vhd_chaos__sdesc(s, OFF_R0, 0, vhd_chaos__gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    vhd_chaos__sdesc(s, OFF_R0, 1, vhd_chaos__gpa(s, VHD_CHAOS_WIN_SIZE), VHD_CHAOS_WIN_SIZE,
                     VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
    vhd_chaos__sdesc(s, OFF_R0, 2, vhd_chaos__gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    vhd_chaos__split_publish(s, OFF_R0, 0, 1);
    vhd_chaos__kick(s, 0);
}

/*
 * GET_VRING_BASE right after the kick: the reply may come only after every
 * request the back-end took is completed and published, so the base it
 * answers equals used->idx at that moment.
 */
static int c_base_mid_io(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc) {
        big_read(&s);
        struct vu_vring_state st = {.index = 0};
        struct vu_hdr h;
        union vu_payload p;
        rc = vhd_chaos__call(&s, VHOST_USER_GET_VRING_BASE, &st, sizeof(st), &h, &p);
        if (rc == 0) {
            struct vhd_vring_used *u = (void *)vhd_chaos__hva(&s, OFF_R0 + RING_USED);
            uint16_t used = vhd_le16(vhd_load_acquire(&u->idx));
            uint8_t status = vhd_chaos__blk_status(&s, 0);
            if (h.size == 8 && p.state.num == used && (used == 0 || status == VIRTIO_BLK_S_OK))
                ctx->observed |= VHD_CHAOS_SERVED;
            else
                vhd_chaos__note(&s, 0, "GET_VRING_BASE %u with used->idx %u, status %u",
                                p.state.num, used, status);
        } else {
            rc = vhd_chaos__observe(&s, rc, "GET_VRING_BASE");
        }
    }
    vhd_chaos__close(&s);
    return rc;
}

/* The same memory table again while a 1 MiB read runs: the read completes, into the right place. */
static int c_mem_table_mid_io(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc) {
        big_read(&s);
        int a = vhd_chaos__mem_default(&s);
        struct vhd_chaos_used u;
        rc = vhd_chaos__await_used(&s, OFF_R0, 0, &u, s.tmo);
        if (!rc && a == 0 && u.got && vhd_chaos__blk_status(&s, 0) == VIRTIO_BLK_S_OK)
            ctx->observed |= VHD_CHAOS_SERVED;
        else if (!rc)
            rc = vhd_chaos__observe(&s, a, "SET_MEM_TABLE during I/O");
    }
    vhd_chaos__close(&s);
    return rc;
}

/*
 * The front-end goes away while a 1 MiB read runs: the back-end must finish
 * (or drop) it before it unmaps the memory. Served when the status byte is
 * then OK or untouched, never anything else.
 */
static int c_disconnect_mid_io(struct vhd_chaos_ctx *ctx)
{
    struct vhd_chaos_sess s;
    int rc = vhd_chaos__blk(ctx, &s, false, false);
    if (!rc) {
        big_read(&s);
        vhd_chaos__close(&s);
        /* Nothing to ask any more: give the back-end time to finish, then look. */
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
        uint8_t st = vhd_chaos__blk_status(&s, 0);
        if (st == VIRTIO_BLK_S_OK || st == 0xff)
            ctx->observed |= VHD_CHAOS_SERVED;
        else
            vhd_chaos__note(&s, 0, "status byte 0x%02x after the disconnect", st);
    }
    vhd_chaos__close(&s);
    return rc;
}

/* ======================= table ======================= */

const struct vhd_chaos_case vhd_chaos__msg_cases[] = {
    BLK(trunc_header, FRAMING, C),
    BLK(trunc_payload, FRAMING, C),
    BLK(oversized, FRAMING, C),
    BLK(size_mismatch, FRAMING, N),
    BLK(bad_version, FRAMING, C),
    BLK(reply_flag, FRAMING, C),
    BLK(unknown_flags, FRAMING, C),
    BLK(unknown_request, FRAMING, N),
    BLK(unknown_request_noack, FRAMING, C),
    BLK(unsupported_request, FRAMING, N),
    BLK(set_inflight_fd, FRAMING, N),
    BLK(get_inflight_fd, FRAMING, C),
    BLK(iotlb_msg, FRAMING, C | N),
    BLK(never_reads, FRAMING, C | S),

    BLK(kick_missing_fd, FDS, N),
    BLK(extra_fds, FDS, N),
    BLK(nofd_with_fd, FDS, N),
    BLK(too_many_fds, FDS, C),
    BLK(mem_wrong_fd, FDS, N),
    BLK(mem_fd_count, FDS, N),
    BLK(kick_memfd, FDS, N),
    BLK(kick_pipe_hangup, FDS, N),
    BLK(kick_socket_hangup, FDS, N),
    BLK(kick_listen_socket, FDS, N),
    BLK(kick_epoll, FDS, N),
    BLK(kick_fifo, FDS, N),
    BLK(call_memfd, FDS, N),
    BLK(call_fifo, FDS, N),
    BLK(err_epoll, FDS, N),
    BLK(err_listen_socket, FDS, N),
    BLK(add_reg_pipe, FDS, N),
    BLK(backend_fd_memfd, FDS, N | B),

    BLK(features_unoffered, FEATURES, N),
    BLK(proto_unoffered, FEATURES, C),
    BLK(gated_not_negotiated, FEATURES, C),
    BLK(features_change_started, FEATURES, N),
    BLK(vring_num_bad, FEATURES, N),
    BLK(ring_index_oob, FEATURES, N),
    BLK(get_base_oob, FEATURES, C),
    BLK(kick_reserved_bits, FEATURES, N),
    BLK(enable_bad, FEATURES, N),
    BLK(status_bad, FEATURES, N),
    BLK(config_oob, FEATURES, N),
    BLK(packed_base_oob, FEATURES, N),
    BLK(packed_base_used_oob, FEATURES, N),
    BLK(set_config_ro, FEATURES, N),

    BLK(overlap_gpa, MEMORY, N),
    BLK(overlap_uva, MEMORY, N),
    BLK(gpa_overflow, MEMORY, N),
    BLK(uva_overflow, MEMORY, N),
    BLK(size_zero, MEMORY, N),
    BLK(size_huge, MEMORY, N),
    BLK(mem_over_cap, MEMORY, N),
    BLK(add_reg_over_cap, MEMORY, N),
    BLK(mmap_beyond, MEMORY, N),
    BLK(mmap_unaligned_beyond, MEMORY, N),
    BLK(mmap_offset_wraps, MEMORY, N),
    BLK(nine_regions, MEMORY, N | C),
    BLKD(mmap_unaligned_exact, MEMORY, S),
    BLK(add_overlap, MEMORY, N),
    BLK(rem_unknown, MEMORY, N),
    BLK(add_until_full, MEMORY, N),
    BLK(inflight_beyond_file, MEMORY, N),
    BLK(inflight_offset_unaligned, MEMORY, N),
    BLK(inflight_offset_wraps, MEMORY, N),
    BLK(inflight_size_huge, MEMORY, N),
    BLK(inflight_shape, MEMORY, N),
    BLK(inflight_eventfd, MEMORY, N),
    BLK(inflight_hugetlb, MEMORY, N),
    BLK(inflight_while_started, MEMORY, N),
    BLK(get_inflight_shape, MEMORY, N),

    BLK(desc_outside, RINGS, N | B),
    BLK(used_outside, RINGS, N | B),
    BLK(avail_in_guard, RINGS, N | B),
    BLK(desc_crosses, RINGS, N | B),
    BLK(used_crosses, RINGS, N | B),
    BLK(packed_desc_crosses, RINGS, N | B),
    BLK(ring_misaligned, RINGS, N),
    BLK(ring_uva_wraps, RINGS, N | B),

    BLK(kick_before_mem, ORDER, N),
    BLK(kick_before_features, ORDER, N),
    BLK(kick_before_addr, ORDER, N),
    BLK(addr_on_started, ORDER, N),
    BLK(num_on_started, ORDER, N),
    BLK(base_on_started, ORDER, N),
    BLK(rem_in_use, ORDER, N),
    BLK(table_drops_ring, ORDER, N),
    BLK(add_reg_not_negotiated, ORDER, N),
    BLK(rem_data_region, ORDER, N | S | B),
    BLK(base_mid_io, ORDER, S),
    BLK(mem_table_mid_io, ORDER, S),
    BLK(disconnect_mid_io, ORDER, S),
};
const unsigned vhd_chaos__msg_ncases = VHD_ARRAY_SIZE(vhd_chaos__msg_cases);
