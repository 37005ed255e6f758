/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Chaos mode (see vu_chaos.h): the guest memory with canary guards, a raw
 * vhost-user session that can send anything (any size field, any flags, any
 * number and kind of fds, truncated streams), well-formed set-up steps to
 * reach the state a case needs, descriptor chains written straight into the
 * rings, outcome detection, and the catalogue of cases.
 *
 * Every driver-side write into guest memory goes through put*() / mirror(),
 * which also update the snapshot: at the end, a byte that differs from the
 * snapshot was written by the back-end, and must lie in an allowed range.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "core/compiler.h"
#include "core/virtio.h"
#include "dev/virtio_blk.h"
#include "transport/vu_msg.h"
#include "vu_chaos.h"

#define BIT(n) (1ull << (n))

/* Queue size of every ring a case starts: small, so "longer than the queue" is cheap. */
#define QSZ 8u

/*
 * Layout inside window 0 (offsets from its start). Rings start at 0x1000 so
 * that a region beginning 512 bytes into the window (unaligned mmap offset
 * case) still holds them.
 */
#define OFF_R0     0x1000u  /* ring 0: descriptors; +RING_AVAIL avail; +RING_USED used */
#define OFF_R1     0x4000u  /* ring 1 (net transmit queue) */
#define RING_AVAIL 0x1000u  /* split avail ring / packed driver event area */
#define RING_USED  0x2000u  /* split used ring / packed device event area */
#define OFF_IND    0x7000u  /* indirect tables */
#define OFF_HDR    0x8000u  /* request headers, 64 bytes apart */
#define OFF_STAT   0x9000u  /* status bytes, 64 bytes apart */
#define OFF_DATA   0x10000u /* 4 KiB data buffers */

#define SECTOR  512u
#define PKT_LEN 60u /* Ethernet frame of the net cases (minimum size) */
#define NET_HDR 12u /* virtio-net header with VERSION_1 */

/* Protocol features every full session asks for. */
#define WANT_PROTO                                                                        \
    (BIT(VHOST_USER_PROTOCOL_F_MQ) | BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK) |               \
     BIT(VHOST_USER_PROTOCOL_F_BACKEND_REQ) | BIT(VHOST_USER_PROTOCOL_F_CONFIG) |         \
     BIT(VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS) | BIT(VHOST_USER_PROTOCOL_F_STATUS) | \
     BIT(VHOST_USER_PROTOCOL_F_RESET_DEVICE))

/* ======================= guest memory ======================= */

static uint8_t win_pattern(unsigned w, size_t off)
{
    uint32_t x = (uint32_t)off * 2654435761u + w * 0x9e37u;
    return (uint8_t)(x >> 13);
}

static uint8_t guard_canary(size_t k)
{
    return (uint8_t)(0xc5 ^ (k * 31));
}

int vhd_chaos_mem_init(struct vhd_chaos_mem *m)
{
    memset(m, 0, sizeof(*m));
    m->len = (size_t)VHD_CHAOS_WINDOWS * (VHD_CHAOS_WIN_SIZE + VHD_CHAOS_GUARD) + VHD_CHAOS_GUARD;
    m->fd = memfd_create("vhostd-chaos", MFD_CLOEXEC);
    if (m->fd < 0)
        return -errno;
    if (ftruncate(m->fd, (off_t)m->len) < 0)
        goto fail;
    m->base = mmap(NULL, m->len, PROT_READ | PROT_WRITE, MAP_SHARED, m->fd, 0);
    if (m->base == MAP_FAILED) {
        m->base = NULL;
        goto fail;
    }
    m->snap = malloc((size_t)VHD_CHAOS_WINDOWS * VHD_CHAOS_WIN_SIZE);
    if (!m->snap) {
        errno = ENOMEM;
        goto fail;
    }
    for (unsigned i = 0; i < VHD_CHAOS_WINDOWS; i++) {
        m->win[i].off = VHD_CHAOS_GUARD + (uint64_t)i * (VHD_CHAOS_WIN_SIZE + VHD_CHAOS_GUARD);
        m->win[i].hva = m->base + m->win[i].off;
        /* Adjacent in guest-physical space, apart (guards between) in ours. */
        m->win[i].gpa = 0x40000000ull + (uint64_t)i * VHD_CHAOS_WIN_SIZE;
    }
    return 0;
fail : {
    int err = -errno;
    vhd_chaos_mem_fini(m);
    return err;
}
}

void vhd_chaos_mem_fini(struct vhd_chaos_mem *m)
{
    if (m->base)
        munmap(m->base, m->len);
    if (m->fd >= 0)
        close(m->fd);
    free(m->snap);
    memset(m, 0, sizeof(*m));
    m->fd = -1;
}

/* Windows to their pattern (snapshot too), guards to their canaries. */
static void mem_reset(struct vhd_chaos_mem *m)
{
    size_t pos = 0;
    for (unsigned i = 0; i < VHD_CHAOS_WINDOWS; i++) {
        for (size_t k = pos; k < m->win[i].off; k++)
            m->base[k] = guard_canary(k);
        for (size_t o = 0; o < VHD_CHAOS_WIN_SIZE; o++)
            m->win[i].hva[o] = win_pattern(i, o);
        memcpy(m->snap + (size_t)i * VHD_CHAOS_WIN_SIZE, m->win[i].hva, VHD_CHAOS_WIN_SIZE);
        pos = m->win[i].off + VHD_CHAOS_WIN_SIZE;
    }
    for (size_t k = pos; k < m->len; k++)
        m->base[k] = guard_canary(k);
}

static bool allowed(const struct vhd_chaos_ctx *ctx, size_t off)
{
    for (unsigned i = 0; i < ctx->nallow; i++)
        if (off >= ctx->allow[i].off && off - ctx->allow[i].off < ctx->allow[i].len)
            return true;
    return false;
}

long vhd_chaos_check_memory(const struct vhd_chaos_ctx *ctx, char *why, size_t whylen)
{
    const struct vhd_chaos_mem *m = ctx->mem;
    long bad = 0;
    size_t pos = 0;

    if (whylen)
        why[0] = 0;
    for (unsigned i = 0; i <= VHD_CHAOS_WINDOWS; i++) {
        size_t end = i < VHD_CHAOS_WINDOWS ? m->win[i].off : m->len;
        for (size_t k = pos; k < end; k++) {
            if (m->base[k] == guard_canary(k))
                continue;
            if (!bad++)
                snprintf(why, whylen, "canary at memfd offset 0x%zx changed (0x%02x)", k,
                         m->base[k]);
        }
        if (i == VHD_CHAOS_WINDOWS)
            break;
        const uint8_t *snap = m->snap + (size_t)i * VHD_CHAOS_WIN_SIZE;
        for (size_t o = 0; o < VHD_CHAOS_WIN_SIZE; o++) {
            size_t vo = (size_t)i * VHD_CHAOS_WIN_SIZE + o;
            if (m->win[i].hva[o] == snap[o] || allowed(ctx, vo))
                continue;
            if (!bad++)
                snprintf(why, whylen,
                         "window %u offset 0x%zx written by the back-end (0x%02x, was 0x%02x) "
                         "outside the buffers it owned",
                         i, o, m->win[i].hva[o], snap[o]);
        }
        pos = m->win[i].off + VHD_CHAOS_WIN_SIZE;
    }
    return bad;
}

/* ======================= the raw session ======================= */

struct cs {
    struct vhd_chaos_ctx *ctx;
    struct vhd_chaos_mem *m;
    int fd;    /* the session socket */
    int be_fd; /* our end of the back-end channel, or -1 */
    int tmo;   /* ms */
    uint64_t offered, proto_offered, proto;
    bool packed;
    uint64_t r0_gpa; /* guest address of window-0 offset r0_off (region 0 start) */
    uint64_t r0_off;
    int kick[2], call[2];
};

static int note(struct cs *s, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Append to the case's note; returns rc. */
static int note(struct cs *s, int rc, const char *fmt, ...)
{
    char *n = s->ctx->note;
    size_t used = strlen(n);
    va_list ap;
    if (used && used + 2 < sizeof(s->ctx->note)) {
        strcpy(n + used, "; ");
        used += 2;
    }
    va_start(ap, fmt);
    vsnprintf(n + used, sizeof(s->ctx->note) - used, fmt, ap);
    va_end(ap);
    return rc;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void nap_ms(unsigned ms)
{
    struct timespec ts = {0, (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* ---- driver-side memory access (window-0 offsets), mirrored into the snapshot ---- */

static uint8_t *hva(struct cs *s, size_t off)
{
    return s->m->win[0].hva + off;
}

static uint64_t uva(struct cs *s, size_t off)
{
    return (uint64_t)(uintptr_t)hva(s, off);
}

static uint64_t gpa(struct cs *s, size_t off)
{
    return s->r0_gpa + (off - s->r0_off);
}

/* The driver just wrote [off, off + len) of window 0: that is the expected content now. */
static void mirror(struct cs *s, size_t off, size_t len)
{
    memcpy(s->m->snap + off, hva(s, off), len);
}

static void put(struct cs *s, size_t off, const void *src, size_t len)
{
    memcpy(hva(s, off), src, len);
    mirror(s, off, len);
}

static void zero(struct cs *s, size_t off, size_t len)
{
    memset(hva(s, off), 0, len);
    mirror(s, off, len);
}

/* Let the back-end write [off, off + len) of window 0. */
static void allow(struct cs *s, size_t off, size_t len)
{
    struct vhd_chaos_ctx *c = s->ctx;
    if (c->nallow < VHD_CHAOS_MAX_ALLOW) {
        c->allow[c->nallow].off = off;
        c->allow[c->nallow].len = len;
        c->nallow++;
    }
}

/* ---- raw messages ---- */

/* sendmsg of len bytes with nfds fds (any number up to 16) on the first chunk. */
static int raw_sendmsg(int fd, const void *buf, size_t len, const int *fds, unsigned nfds)
{
    union {
        char buf[CMSG_SPACE(16 * sizeof(int))];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    size_t done = 0;

    if (nfds > 16)
        return -EINVAL;
    if (nfds) {
        memset(&u, 0, sizeof(u));
        mh.msg_control = u.buf;
        mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
    }
    while (done < len) {
        ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EAGAIN ? -ETIMEDOUT : -errno;
        }
        done += (size_t)n;
        iov.iov_base = (char *)buf + done;
        iov.iov_len = len - done;
        mh.msg_control = NULL;
        mh.msg_controllen = 0;
    }
    return 0;
}

/*
 * Send a header with any request, flags and size field, followed by len
 * payload bytes (len need not match size), with any fds.
 */
static int cs_send_raw(struct cs *s, uint32_t req, uint32_t flags, uint32_t size, const void *p,
                       uint32_t len, const int *fds, unsigned nfds)
{
    uint8_t buf[sizeof(struct vu_hdr) + 512];
    struct vu_hdr h = {.request = req, .flags = flags, .size = size};

    if (s->fd < 0)
        return -ENOTCONN;
    if (len > 512)
        return -EINVAL;
    memcpy(buf, &h, sizeof(h));
    if (len)
        memcpy(buf + sizeof(h), p, len);
    return raw_sendmsg(s->fd, buf, sizeof(h) + len, fds, nfds);
}

/* Read exactly len bytes within the timeout. 1, -ECONNRESET (EOF/reset), -ETIMEDOUT. */
static int read_full(int fd, void *buf, size_t len, int tmo)
{
    uint64_t t0 = now_ms();
    size_t got = 0;
    while (got < len) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        long left = tmo - (long)(now_ms() - t0);
        if (left <= 0)
            return -ETIMEDOUT;
        int pr = poll(&p, 1, (int)left);
        if (pr < 0 && errno != EINTR)
            return -errno;
        if (pr <= 0)
            continue;
        char cbuf[CMSG_SPACE(8 * sizeof(int))];
        struct iovec iov = {.iov_base = (char *)buf + got, .iov_len = len - got};
        struct msghdr mh = {
            .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
        ssize_t n = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                continue;
            return errno == ECONNRESET ? -ECONNRESET : -errno;
        }
        if (n == 0)
            return -ECONNRESET;
        /* A back-end never sends us fds: close any. */
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int nf = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                for (int i = 0; i < nf; i++) {
                    int f;
                    memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                    close(f);
                }
            }
        }
        got += (size_t)n;
    }
    return 1;
}

/* Receive one message: 1, -ECONNRESET, -ETIMEDOUT, -EPROTO (payload too big). */
static int cs_recv(struct cs *s, struct vu_hdr *h, union vu_payload *p)
{
    int rc = read_full(s->fd, h, sizeof(*h), s->tmo);
    if (rc < 0)
        return rc;
    if (h->size > sizeof(*p))
        return -EPROTO;
    return h->size ? read_full(s->fd, p, h->size, s->tmo) : 1;
}

/* A request with a reply of its own: 0 with the reply in *h and *p, VHD_CHAOS_CLOSED, or -errno. */
static int cs_call(struct cs *s, uint32_t req, const void *pl, uint32_t size, struct vu_hdr *h,
                   union vu_payload *p)
{
    int rc = cs_send_raw(s, req, VHOST_USER_VERSION, size, pl, size, NULL, 0);
    if (rc == -EPIPE || rc == -ECONNRESET)
        return VHD_CHAOS_CLOSED;
    if (rc < 0)
        return rc;
    rc = cs_recv(s, h, p);
    if (rc == -ECONNRESET)
        return VHD_CHAOS_CLOSED;
    if (rc < 0)
        return rc;
    if (h->request != req || h->flags != (VHOST_USER_VERSION | VHOST_USER_REPLY_MASK))
        return note(s, -EPROTO, "reply %u flags 0x%x to request %u", h->request, h->flags, req);
    return 0;
}

static int cs_call_u64(struct cs *s, uint32_t req, uint64_t *out)
{
    struct vu_hdr h;
    union vu_payload p;
    int rc = cs_call(s, req, NULL, 0, &h, &p);
    if (rc != 0)
        return rc;
    if (h.size != 8)
        return note(s, -EPROTO, "reply of %u bytes to request %u", h.size, req);
    *out = p.u64;
    return 0;
}

/* Is the session still served? A GET_FEATURES round trip: 0 or VHD_CHAOS_CLOSED (or -errno). */
static int cs_probe(struct cs *s)
{
    uint64_t v;
    return cs_call_u64(s, VHOST_USER_GET_FEATURES, &v);
}

/*
 * Send a request that has no reply of its own, asking for an ack
 * (NEED_REPLY) and classify the answer: 0 (acked, or accepted when
 * REPLY_ACK is not negotiated: checked with a round trip), VHD_CHAOS_NACK,
 * VHD_CHAOS_CLOSED, or -errno when nothing came back.
 */
static int cs_ack_raw(struct cs *s, uint32_t req, uint32_t size, const void *pl, uint32_t len,
                      const int *fds, unsigned nfds)
{
    struct vu_hdr h;
    union vu_payload p;
    int rc = cs_send_raw(s, req, VHOST_USER_VERSION | VHOST_USER_NEED_REPLY_MASK, size, pl, len,
                         fds, nfds);
    if (rc == -EPIPE || rc == -ECONNRESET)
        return VHD_CHAOS_CLOSED;
    if (rc < 0)
        return rc;
    if (!(s->proto & BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK)))
        return cs_probe(s);
    rc = cs_recv(s, &h, &p);
    if (rc == -ECONNRESET)
        return VHD_CHAOS_CLOSED;
    if (rc < 0)
        return rc;
    if (h.request != req || h.size != 8)
        return note(s, -EPROTO, "ack for request %u of %u bytes (sent %u)", h.request, h.size, req);
    if (p.u64)
        return VHD_CHAOS_NACK;
    return 0;
}

static int cs_ack(struct cs *s, uint32_t req, const void *pl, uint32_t size, const int *fds,
                  unsigned nfds)
{
    return cs_ack_raw(s, req, size, pl, size, fds, nfds);
}

/* A set-up step that must succeed. */
static int must(struct cs *s, int rc, const char *what)
{
    if (rc == 0)
        return 0;
    if (rc > 0)
        return note(s, -EIO, "set-up step %s: %s", what,
                    rc == VHD_CHAOS_NACK ? "refused" : "connection closed");
    return note(s, rc, "set-up step %s: %s", what, strerror(-rc));
}

/* Record the outcome of a hostile step. 0 (accepted: nothing to record) or an outcome bit. */
static int observe(struct cs *s, int rc, const char *what)
{
    if (rc < 0)
        return note(s, rc, "%s: no answer (%s)", what, strerror(-rc));
    if (rc > 0)
        s->ctx->observed |= (unsigned)rc;
    else
        note(s, 0, "%s: accepted", what);
    return 0;
}

/* ---- sessions ---- */

static int cs_connect_once(struct cs *s)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(s->ctx->socket_path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    strcpy(sa.sun_path, s->ctx->socket_path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    struct timeval tv = {.tv_sec = s->tmo / 1000, .tv_usec = (s->tmo % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    s->fd = fd;
    return 0;
}

static void cs_close(struct cs *s)
{
    if (s->fd >= 0)
        close(s->fd);
    if (s->be_fd >= 0)
        close(s->be_fd);
    for (int i = 0; i < 2; i++) {
        if (s->kick[i] >= 0)
            close(s->kick[i]);
        if (s->call[i] >= 0)
            close(s->call[i]);
        s->kick[i] = s->call[i] = -1;
    }
    s->fd = s->be_fd = -1;
}

/*
 * Connect and make sure the device serves us: the back-end serves one
 * session per device and refuses (closes) a connection while it is still
 * tearing the previous one down, so retry for a while.
 */
static int cs_open(struct vhd_chaos_ctx *ctx, struct cs *s)
{
    memset(s, 0, sizeof(*s));
    s->ctx = ctx;
    s->m = ctx->mem;
    s->fd = s->be_fd = -1;
    s->kick[0] = s->kick[1] = s->call[0] = s->call[1] = -1;
    s->tmo = ctx->timeout_ms > 0 ? ctx->timeout_ms : 2000;
    s->r0_gpa = s->m->win[0].gpa;
    s->r0_off = 0;
    uint64_t t0 = now_ms();
    int rc;
    for (;;) {
        rc = cs_connect_once(s);
        if (rc == 0) {
            rc = cs_call_u64(s, VHOST_USER_GET_FEATURES, &s->offered);
            if (rc == 0)
                return 0;
            cs_close(s);
        }
        if (now_ms() - t0 > (uint64_t)s->tmo * 2)
            break;
        nap_ms(10);
    }
    return note(s, rc < 0 ? rc : -ECONNREFUSED, "cannot open a session on %s", ctx->socket_path);
}

/*
 * The usual opening: GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES(offer &
 * want), SET_OWNER, and the back-end channel when BACKEND_REQ was taken.
 */
static int cs_negotiate(struct cs *s, uint64_t want)
{
    int rc = must(s, cs_call_u64(s, VHOST_USER_GET_PROTOCOL_FEATURES, &s->proto_offered),
                  "GET_PROTOCOL_FEATURES");
    if (rc)
        return rc;
    uint64_t p = s->proto_offered & want;
    rc = cs_send_raw(s, VHOST_USER_SET_PROTOCOL_FEATURES, VHOST_USER_VERSION, 8, &p, 8, NULL, 0);
    if (rc)
        return must(s, rc, "SET_PROTOCOL_FEATURES");
    s->proto = p;
    rc = must(s, cs_ack(s, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0), "SET_OWNER");
    if (rc)
        return rc;
    if (p & BIT(VHOST_USER_PROTOCOL_F_BACKEND_REQ)) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
            return note(s, -errno, "socketpair: %s", strerror(errno));
        rc = cs_ack(s, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, &sv[1], 1);
        close(sv[1]);
        s->be_fd = sv[0];
        rc = must(s, rc, "SET_BACKEND_REQ_FD");
    }
    return rc;
}

static int cs_set_features(struct cs *s, uint64_t virtio)
{
    uint64_t f = virtio | BIT(VHOST_USER_F_PROTOCOL_FEATURES);
    s->packed = (virtio & BIT(VIRTIO_F_RING_PACKED)) != 0;
    return cs_ack(s, VHOST_USER_SET_FEATURES, &f, 8, NULL, 0);
}

/* SET_MEM_TABLE of n regions with the fds given (one each unless nfds says otherwise). */
static int cs_mem_table(struct cs *s, const struct vu_mem_region *r, uint32_t n, const int *fds,
                        unsigned nfds)
{
    struct vu_mem_table t;
    memset(&t, 0, sizeof(t));
    t.nregions = n;
    memcpy(t.regions, r, (n > 8 ? 8 : n) * sizeof(*r));
    return cs_ack_raw(s, VHOST_USER_SET_MEM_TABLE, VU_MEM_TABLE_HDR_SIZE + n * 32u, &t,
                      VU_MEM_TABLE_HDR_SIZE + (n > 8 ? 8 : n) * 32u, fds, nfds);
}

/* Region i as the window it is. */
static struct vu_mem_region win_region(struct cs *s, unsigned i)
{
    struct vu_mem_region r = {.gpa = s->m->win[i].gpa,
                              .size = VHD_CHAOS_WIN_SIZE,
                              .uva = (uint64_t)(uintptr_t)s->m->win[i].hva,
                              .mmap_offset = s->m->win[i].off};
    return r;
}

static int cs_mem_default(struct cs *s)
{
    struct vu_mem_region r[2] = {win_region(s, 0), win_region(s, 1)};
    int fds[2] = {s->m->fd, s->m->fd};
    return cs_mem_table(s, r, 2, fds, 2);
}

static int set_state(struct cs *s, uint32_t req, uint32_t index, uint32_t num)
{
    struct vu_vring_state st = {.index = index, .num = num};
    return cs_ack(s, req, &st, sizeof(st), NULL, 0);
}

static int set_addr(struct cs *s, uint32_t index, uint64_t desc, uint64_t avail, uint64_t used)
{
    struct vu_vring_addr a = {.index = index, .desc = desc, .avail = avail, .used = used};
    return cs_ack(s, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
}

/* SET_VRING_KICK / CALL with an fd (or none: NOFD). */
static int set_vring_fd(struct cs *s, uint32_t req, uint32_t index, int fd)
{
    uint64_t v = index | (fd < 0 ? VHOST_USER_VRING_NOFD_MASK : 0);
    return cs_ack(s, req, &v, 8, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
}

/* Zero a ring's parts at window offset off and let the back-end write what it owns. */
static void ring_layout(struct cs *s, size_t off)
{
    zero(s, off, 16 * QSZ);
    zero(s, off + RING_AVAIL, 64);
    zero(s, off + RING_USED, 8 * QSZ + 64);
    if (s->packed) {
        allow(s, off, 16 * QSZ); /* used descriptors are written in place */
        allow(s, off + RING_USED, 4);
    } else {
        allow(s, off + RING_USED, 4 + 8 * QSZ + 2);
    }
}

/* Everything up to (not including) SET_VRING_KICK for ring q at window offset off. */
static int ring_prepare(struct cs *s, uint32_t q, size_t off)
{
    ring_layout(s, off);
    int rc = must(s, set_state(s, VHOST_USER_SET_VRING_NUM, q, QSZ), "SET_VRING_NUM");
    if (!rc)
        rc = must(s, set_state(s, VHOST_USER_SET_VRING_BASE, q, s->packed ? 0x80008000u : 0),
                  "SET_VRING_BASE");
    if (!rc)
        rc = must(s, set_addr(s, q, uva(s, off), uva(s, off + RING_AVAIL), uva(s, off + RING_USED)),
                  "SET_VRING_ADDR");
    if (rc)
        return rc;
    if (s->call[q & 1] < 0)
        s->call[q & 1] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->kick[q & 1] < 0)
        s->kick[q & 1] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (s->call[q & 1] < 0 || s->kick[q & 1] < 0)
        return note(s, -EMFILE, "eventfd: %s", strerror(errno));
    return must(s, set_vring_fd(s, VHOST_USER_SET_VRING_CALL, q, s->call[q & 1]), "SET_VRING_CALL");
}

/* Start ring q at window offset off (and enable it). */
static int ring_start(struct cs *s, uint32_t q, size_t off)
{
    int rc = ring_prepare(s, q, off);
    if (!rc)
        rc = must(s, set_vring_fd(s, VHOST_USER_SET_VRING_KICK, q, s->kick[q & 1]),
                  "SET_VRING_KICK");
    if (!rc)
        rc = must(s, set_state(s, VHOST_USER_SET_VRING_ENABLE, q, 1), "SET_VRING_ENABLE");
    return rc;
}

/* Open, negotiate, features, default memory table. */
static int cs_setup(struct vhd_chaos_ctx *ctx, struct cs *s, uint64_t virtio)
{
    int rc = cs_open(ctx, s);
    if (!rc)
        rc = cs_negotiate(s, WANT_PROTO);
    if (!rc)
        rc = must(s, cs_set_features(s, BIT(VIRTIO_F_VERSION_1) | virtio), "SET_FEATURES");
    if (!rc)
        rc = must(s, cs_mem_default(s), "SET_MEM_TABLE");
    return rc;
}

/* A blk session with ring 0 started. */
static int cs_blk(struct vhd_chaos_ctx *ctx, struct cs *s, bool packed, bool indirect)
{
    uint64_t f =
        (packed ? BIT(VIRTIO_F_RING_PACKED) : 0) | (indirect ? BIT(VIRTIO_F_INDIRECT_DESC) : 0);
    int rc = cs_setup(ctx, s, f);
    return rc ? rc : ring_start(s, 0, OFF_R0);
}

/* A net session: receive ring 0 at OFF_R0, transmit ring 1 at OFF_R1. */
static int cs_net(struct vhd_chaos_ctx *ctx, struct cs *s)
{
    int rc = cs_setup(ctx, s, 0);
    if (!rc)
        rc = ring_start(s, 0, OFF_R0);
    return rc ? rc : ring_start(s, 1, OFF_R1);
}

/* ---- outcome detection ---- */

/* Count CONFIG_CHANGE messages waiting on the back-end channel (never blocks). */
static void cs_drain_backend(struct cs *s)
{
    while (s->be_fd >= 0) {
        struct pollfd p = {.fd = s->be_fd, .events = POLLIN};
        if (poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN))
            return;
        struct vu_hdr h;
        union vu_payload pl;
        if (read_full(s->be_fd, &h, sizeof(h), s->tmo) < 0 || h.size > sizeof(pl) ||
            (h.size && read_full(s->be_fd, &pl, h.size, s->tmo) < 0)) {
            close(s->be_fd);
            s->be_fd = -1;
            return;
        }
        if (h.request == VHOST_USER_BACKEND_CONFIG_CHANGE_MSG)
            s->ctx->config_changes++;
    }
}

/* GET_STATUS: 1 (NEEDS_RESET), 0 (not), VHD_CHAOS_CLOSED... as an outcome-ish code. */
static int cs_needs_reset(struct cs *s)
{
    uint64_t st;
    cs_drain_backend(s);
    if (!(s->proto & BIT(VHOST_USER_PROTOCOL_F_STATUS)))
        return 0;
    int rc = cs_call_u64(s, VHOST_USER_GET_STATUS, &st);
    if (rc)
        return rc > 0 ? 0 : rc;
    return (st & VIRTIO_STATUS_NEEDS_RESET) ? 1 : 0;
}

static void kick(struct cs *s, uint32_t q)
{
    uint64_t one = 1;
    if (write(s->kick[q & 1], &one, sizeof(one)) < 0) {
        /* EAGAIN: a kick is already pending, which is all we want. */
    }
}

/* Split ring at window offset off: used->idx. */
static uint16_t split_used_idx(struct cs *s, size_t off)
{
    struct vhd_vring_used *u = (void *)hva(s, off + RING_USED);
    return vhd_le16(vhd_load_acquire(&u->idx));
}

/* Packed ring: is slot `slot` used (wrap counter 1: AVAIL and USED both set)? */
static bool packed_slot_used(struct cs *s, size_t off, uint16_t slot)
{
    struct vhd_vring_packed_desc *d = (void *)hva(s, off + 16u * slot);
    uint16_t f = vhd_le16(vhd_load_acquire(&d->flags));
    return (f & VRING_PACKED_DESC_F_AVAIL) && (f & VRING_PACKED_DESC_F_USED);
}

struct used {
    bool got;
    uint32_t id, len;
};

/* The n-th used element (0-based) of the ring at off, if there. */
static bool used_get(struct cs *s, size_t off, uint16_t n, struct used *u)
{
    if (s->packed) {
        if (n != 0 || !packed_slot_used(s, off, 0))
            return false;
        struct vhd_vring_packed_desc *d = (void *)hva(s, off);
        u->id = vhd_le16(d->id);
        u->len = vhd_le32(d->len);
    } else {
        if (split_used_idx(s, off) <= n)
            return false;
        struct vhd_vring_used *ur = (void *)hva(s, off + RING_USED);
        u->id = vhd_le32(ur->ring[n % QSZ].id);
        u->len = vhd_le32(ur->ring[n % QSZ].len);
    }
    u->got = true;
    return true;
}

/*
 * After a kick: wait until the n-th used element of the ring at off shows
 * up, or the device reports NEEDS_RESET, or ms pass. Records BROKEN.
 * Returns 0 or -errno (no answer to GET_STATUS).
 */
static int await_used(struct cs *s, size_t off, uint16_t n, struct used *u, int ms)
{
    uint64_t t0 = now_ms();
    memset(u, 0, sizeof(*u));
    for (;;) {
        if (used_get(s, off, n, u))
            break;
        int b = cs_needs_reset(s);
        if (b < 0)
            return note(s, b, "GET_STATUS: %s", strerror(-b));
        if (b == 1) {
            s->ctx->observed |= VHD_CHAOS_BROKEN;
            used_get(s, off, n, u); /* it may have been given back unanswered */
            return 0;
        }
        if (now_ms() - t0 > (uint64_t)ms)
            return 0;
        nap_ms(2);
    }
    /* Used: the device may still break the queue right after (a returned bad chain). */
    nap_ms(20);
    int b = cs_needs_reset(s);
    if (b == 1)
        s->ctx->observed |= VHD_CHAOS_BROKEN;
    return b < 0 ? b : 0;
}

/* ---- descriptors ---- */

/* Split descriptor i of the table at window offset tbl (ring or indirect table). */
static void sdesc(struct cs *s, size_t tbl, uint16_t i, uint64_t addr, uint32_t len, uint16_t flags,
                  uint16_t next)
{
    struct vhd_vring_desc d = {.addr = vhd_le64(addr),
                               .len = vhd_le32(len),
                               .flags = vhd_le16(flags),
                               .next = vhd_le16(next)};
    put(s, tbl + 16u * i, &d, sizeof(d));
}

/* Make `head` available at avail slot idx - 1 and publish avail->idx = idx (release). */
static void split_publish(struct cs *s, size_t off, uint16_t head, uint16_t idx)
{
    struct vhd_vring_avail *a = (void *)hva(s, off + RING_AVAIL);
    a->ring[(uint16_t)(idx - 1) % QSZ] = vhd_le16(head);
    mirror(s, off + RING_AVAIL + 4 + 2u * ((uint16_t)(idx - 1) % QSZ), 2);
    vhd_store_release(&a->idx, vhd_le16(idx));
    mirror(s, off + RING_AVAIL + 2, 2);
}

/*
 * Packed descriptors slot0 .. slot0 + n - 1 (first lap, wrap counter 1:
 * AVAIL set, USED clear); the first slot's flags are stored last, with
 * release, which publishes the chain.
 */
struct pd {
    uint64_t addr;
    uint32_t len;
    uint16_t id;
    uint16_t flags; /* VRING_DESC_F_*; AVAIL is added */
};

static void packed_publish(struct cs *s, size_t off, const struct pd *d, unsigned n)
{
    for (unsigned i = n; i-- > 0;) {
        struct vhd_vring_packed_desc *x = (void *)hva(s, off + 16u * i);
        x->addr = vhd_le64(d[i].addr);
        x->len = vhd_le32(d[i].len);
        x->id = vhd_le16(d[i].id);
        uint16_t fl = vhd_le16((uint16_t)(d[i].flags | VRING_PACKED_DESC_F_AVAIL));
        if (i)
            x->flags = fl;
        else
            vhd_store_release(&x->flags, fl);
        mirror(s, off + 16u * i, 16);
    }
}

/* ---- blk requests ---- */

/* Header k at OFF_HDR + 64k; status byte k at OFF_STAT + 64k (0xff until written). */
static void blk_hdr(struct cs *s, unsigned k, uint32_t type, uint64_t sector)
{
    struct virtio_blk_outhdr h = {.type = vhd_le32(type), .sector = vhd_le64(sector)};
    put(s, OFF_HDR + 64u * k, &h, sizeof(h));
    uint8_t ff = 0xff;
    put(s, OFF_STAT + 64u * k, &ff, 1);
}

static uint8_t blk_status(struct cs *s, unsigned k)
{
    return *hva(s, OFF_STAT + 64u * k);
}

/*
 * Classify a blk request after await_used: served (status OK), failed with
 * an error status, or given back unanswered (used length 0: nothing to
 * record; the device should also be broken).
 */
static void blk_classify(struct cs *s, const struct used *u, unsigned k)
{
    if (!u->got)
        return;
    if (u->len == 0) {
        note(s, 0, "request given back unanswered");
        return;
    }
    uint8_t st = blk_status(s, k);
    if (st == VIRTIO_BLK_S_OK)
        s->ctx->observed |= VHD_CHAOS_SERVED;
    else if (st == VIRTIO_BLK_S_IOERR || st == VIRTIO_BLK_S_UNSUPP)
        s->ctx->observed |= VHD_CHAOS_REQ_ERROR;
    else
        note(s, 0, "used with length %u but status byte 0x%02x", u->len, st);
}

/* Kick ring 0 and wait for the first request's fate; classify as blk request 0. */
static int blk_go(struct cs *s)
{
    struct used u;
    kick(s, 0);
    int rc = await_used(s, OFF_R0, 0, &u, s->tmo);
    if (rc)
        return rc;
    blk_classify(s, &u, 0);
    return 0;
}

/* ======================= cases: framing ======================= */

/* Half a header, then end of stream. */
static int c_trunc_header(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc) {
        struct vu_hdr h = {.request = VHOST_USER_GET_FEATURES, .flags = 1, .size = 0};
        rc = raw_sendmsg(s.fd, &h, 7, NULL, 0);
        if (!rc) {
            shutdown(s.fd, SHUT_WR);
            struct vu_hdr r;
            union vu_payload p;
            rc = observe(&s, cs_recv(&s, &r, &p) == -ECONNRESET ? VHD_CHAOS_CLOSED : -ETIMEDOUT,
                         "truncated header");
        }
    }
    cs_close(&s);
    return rc;
}

/* A header announcing 8 bytes, 3 sent, then end of stream. */
static int c_trunc_payload(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc) {
        uint64_t v = 0;
        rc = cs_send_raw(&s, VHOST_USER_SET_FEATURES, 1, 8, &v, 3, NULL, 0);
        if (!rc) {
            shutdown(s.fd, SHUT_WR);
            struct vu_hdr r;
            union vu_payload p;
            rc = observe(&s, cs_recv(&s, &r, &p) == -ECONNRESET ? VHD_CHAOS_CLOSED : -ETIMEDOUT,
                         "truncated payload");
        }
    }
    cs_close(&s);
    return rc;
}

/* A size field of 1 MiB: the back-end must not wait for (or allocate) that. */
static int c_oversized(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    uint8_t junk[64] = {0};
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = observe(&s,
                     cs_ack_raw(&s, VHOST_USER_SET_FEATURES, 1u << 20, junk, sizeof(junk), NULL, 0),
                     "size field 1 MiB");
    cs_close(&s);
    return rc;
}

/* Size field 4 for an 8-byte payload, with REPLY_ACK negotiated. */
static int c_size_mismatch(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc) {
        uint64_t v = BIT(VIRTIO_F_VERSION_1);
        rc = observe(&s, cs_ack_raw(&s, VHOST_USER_SET_FEATURES, 4, &v, 4, NULL, 0),
                     "SET_FEATURES of 4 bytes");
    }
    cs_close(&s);
    return rc;
}

static int send_flags(struct vhd_chaos_ctx *ctx, uint32_t flags, const char *what)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc) {
        rc = cs_send_raw(&s, VHOST_USER_GET_FEATURES, flags, 0, NULL, 0, NULL, 0);
        struct vu_hdr h;
        union vu_payload p;
        if (!rc)
            rc = cs_recv(&s, &h, &p);
        rc = observe(&s,
                     rc == -ECONNRESET || rc == -EPIPE ? VHD_CHAOS_CLOSED
                     : rc == 1                         ? 0
                                                       : rc,
                     what);
    }
    cs_close(&s);
    return rc;
}

static int c_bad_version(struct vhd_chaos_ctx *ctx)
{
    return send_flags(ctx, 2, "version 2");
}

static int c_reply_flag(struct vhd_chaos_ctx *ctx)
{
    return send_flags(ctx, VHOST_USER_VERSION | VHOST_USER_REPLY_MASK, "reply flag in a request");
}

static int c_unknown_flags(struct vhd_chaos_ctx *ctx)
{
    return send_flags(ctx, VHOST_USER_VERSION | 0x100, "unknown flag bits");
}

/* An unknown request id with NEED_REPLY, after REPLY_ACK. */
static int c_unknown_request(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc)
        rc = observe(&s, cs_ack(&s, 200, NULL, 0, NULL, 0), "request 200");
    cs_close(&s);
    return rc;
}

/* An unknown request id before any REPLY_ACK: the back-end cannot nack, so it must close. */
static int c_unknown_request_noack(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = observe(&s, cs_ack(&s, 0xffffffffu, NULL, 0, NULL, 0), "request 0xffffffff");
    cs_close(&s);
    return rc;
}

/* A known request the back-end does not implement (SET_LOG_BASE). */
static int c_unsupported_request(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc) {
        struct vu_log l = {.size = 4096, .offset = 0};
        int fd = s.m->fd;
        rc =
            observe(&s, cs_ack(&s, VHOST_USER_SET_LOG_BASE, &l, sizeof(l), &fd, 1), "SET_LOG_BASE");
    }
    cs_close(&s);
    return rc;
}

/* ======================= cases: file descriptors ======================= */

/* SET_VRING_KICK without NOFD and without an fd. */
static int c_kick_missing_fd(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc)
        rc = ring_prepare(&s, 0, OFF_R0);
    if (!rc) {
        uint64_t v = 0;
        rc = observe(&s, cs_ack(&s, VHOST_USER_SET_VRING_KICK, &v, 8, NULL, 0), "kick without fd");
    }
    cs_close(&s);
    return rc;
}

/* SET_OWNER carrying three fds it has no use for (they must be closed: fd count). */
static int c_extra_fds(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc) {
        int fds[3] = {eventfd(0, EFD_CLOEXEC), eventfd(0, EFD_CLOEXEC), s.m->fd};
        rc = observe(&s, cs_ack(&s, VHOST_USER_SET_OWNER, NULL, 0, fds, 3), "SET_OWNER + 3 fds");
        close(fds[0]);
        close(fds[1]);
    }
    cs_close(&s);
    return rc;
}

/* SET_VRING_CALL with NOFD set and an fd anyway. */
static int c_nofd_with_fd(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc) {
        uint64_t v = VHOST_USER_VRING_NOFD_MASK;
        int fd = eventfd(0, EFD_CLOEXEC);
        rc = observe(&s, cs_ack(&s, VHOST_USER_SET_VRING_CALL, &v, 8, &fd, 1), "NOFD with an fd");
        close(fd);
    }
    cs_close(&s);
    return rc;
}

/* Twelve fds on one message: more than any message may carry. */
static int c_too_many_fds(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc) {
        int fds[12];
        for (int i = 0; i < 12; i++)
            fds[i] = s.m->fd;
        rc = observe(&s, cs_ack(&s, VHOST_USER_SET_OWNER, NULL, 0, fds, 12), "12 fds");
    }
    cs_close(&s);
    return rc;
}

/* Memory regions whose fd is an eventfd, a pipe, a socket. */
static int c_mem_wrong_fd(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc)
        rc = must(&s, cs_set_features(&s, BIT(VIRTIO_F_VERSION_1)), "SET_FEATURES");
    int p[2] = {-1, -1}, efd = eventfd(0, EFD_CLOEXEC);
    if (!rc && pipe2(p, O_CLOEXEC) < 0)
        rc = note(&s, -errno, "pipe");
    const int kinds[3] = {efd, p[0], s.fd};
    unsigned all = ~0u;
    /* Each must be refused on its own: keep only what all three saw. */
    for (int i = 0; i < 3 && !rc; i++) {
        struct vu_mem_region r = win_region(&s, 0);
        r.mmap_offset = 0;
        ctx->observed = 0;
        rc = observe(&s, cs_mem_table(&s, &r, 1, &kinds[i], 1), "region fd of the wrong kind");
        all &= ctx->observed;
        if (ctx->observed & VHD_CHAOS_CLOSED)
            break;
    }
    ctx->observed = rc ? ctx->observed : all;
    close(efd);
    if (p[0] >= 0) {
        close(p[0]);
        close(p[1]);
    }
    cs_close(&s);
    return rc;
}

/* Two regions, one fd. */
static int c_mem_fd_count(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc) {
        struct vu_mem_region r[2] = {win_region(&s, 0), win_region(&s, 1)};
        rc = observe(&s, cs_mem_table(&s, r, 2, &s.m->fd, 1), "2 regions, 1 fd");
    }
    cs_close(&s);
    return rc;
}

/* A started ring's kick fd is a memfd: it cannot be polled. */
static int c_kick_memfd(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc)
        rc = ring_prepare(&s, 0, OFF_R0);
    if (!rc) {
        int fd = memfd_create("chaos-kick", MFD_CLOEXEC);
        rc = observe(&s, set_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, fd), "memfd as kick fd");
        if (!rc)
            rc = observe(&s, set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 1), "enable");
        close(fd);
        if (!rc && cs_needs_reset(&s) == 1)
            ctx->observed |= VHD_CHAOS_BROKEN;
        /* An ack of the kick or enable alone is not an outcome. */
    }
    cs_close(&s);
    return rc;
}

/* ADD_MEM_REG with a pipe. */
static int c_add_reg_pipe(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    int p[2];
    if (!rc && pipe2(p, O_CLOEXEC) == 0) {
        struct vu_mem_single m = {.region = win_region(&s, 1)};
        m.region.gpa += 16u * VHD_CHAOS_WIN_SIZE;
        m.region.uva += 4u * VHD_CHAOS_WIN_SIZE;
        m.region.mmap_offset = 0;
        rc = observe(&s, cs_ack(&s, VHOST_USER_ADD_MEM_REG, &m, sizeof(m), &p[1], 1),
                     "ADD_MEM_REG with a pipe");
        close(p[0]);
        close(p[1]);
    }
    cs_close(&s);
    return rc;
}

/* ======================= cases: features ======================= */

static int c_features_unoffered(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc) {
        uint64_t f = s.offered | BIT(63) | BIT(VIRTIO_F_ACCESS_PLATFORM);
        rc = observe(&s, cs_ack(&s, VHOST_USER_SET_FEATURES, &f, 8, NULL, 0),
                     "features not offered");
    }
    cs_close(&s);
    return rc;
}

/* SET_PROTOCOL_FEATURES with a bit never offered, before REPLY_ACK exists. */
static int c_proto_unoffered(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    uint64_t off;
    if (!rc)
        rc = must(&s, cs_call_u64(&s, VHOST_USER_GET_PROTOCOL_FEATURES, &off), "GET_PROTOCOL");
    if (!rc) {
        uint64_t p = BIT(VHOST_USER_PROTOCOL_F_INBAND_NOTIFICATIONS) | BIT(60);
        rc = observe(&s, cs_ack(&s, VHOST_USER_SET_PROTOCOL_FEATURES, &p, 8, NULL, 0),
                     "protocol features not offered");
    }
    cs_close(&s);
    return rc;
}

/* A request gated by a protocol feature that was not negotiated (own reply: must close). */
static int c_gated_not_negotiated(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK));
    if (!rc) {
        uint64_t v;
        rc = observe(&s, cs_call_u64(&s, VHOST_USER_GET_MAX_MEM_SLOTS, &v),
                     "GET_MAX_MEM_SLOTS without CONFIGURE_MEM_SLOTS");
    }
    cs_close(&s);
    return rc;
}

/* Virtio features changed under a started ring. */
static int c_features_change_started(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_blk(ctx, &s, false, false);
    if (!rc)
        rc = observe(&s, cs_set_features(&s, BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_F_EVENT_IDX)),
                     "features changed on a started ring");
    cs_close(&s);
    return rc;
}

/* Ring sizes 0, 65536 and 7 (split). */
static int c_vring_num_bad(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    static const uint32_t bad[] = {0, 65536, 7, 0xffffffffu};
    unsigned all = ~0u;
    for (unsigned i = 0; i < 4 && !rc; i++) {
        ctx->observed = 0;
        rc = observe(&s, set_state(&s, VHOST_USER_SET_VRING_NUM, 0, bad[i]), "ring size");
        all &= ctx->observed;
    }
    ctx->observed = rc ? ctx->observed : all;
    cs_close(&s);
    return rc;
}

/* Ring index 200 on a reply-less request (nack) ... */
static int c_ring_index_oob(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc)
        rc = observe(&s, set_state(&s, VHOST_USER_SET_VRING_NUM, 200, QSZ), "ring index 200");
    cs_close(&s);
    return rc;
}

/* ... and on GET_VRING_BASE, which has no error reply: the session must end. */
static int c_get_base_oob(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc) {
        struct vu_vring_state st = {.index = 0xffffu, .num = 0};
        struct vu_hdr h;
        union vu_payload p;
        rc = observe(&s, cs_call(&s, VHOST_USER_GET_VRING_BASE, &st, sizeof(st), &h, &p),
                     "GET_VRING_BASE 0xffff");
    }
    cs_close(&s);
    return rc;
}

/* Reserved bits in a SET_VRING_KICK word. */
static int c_kick_reserved_bits(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc)
        rc = ring_prepare(&s, 0, OFF_R0);
    if (!rc) {
        uint64_t v = 0 | (1ull << 40);
        int fd = s.kick[0];
        rc = observe(&s, cs_ack(&s, VHOST_USER_SET_VRING_KICK, &v, 8, &fd, 1), "reserved bits");
    }
    cs_close(&s);
    return rc;
}

static int c_enable_bad(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc)
        rc = observe(&s, set_state(&s, VHOST_USER_SET_VRING_ENABLE, 0, 2), "enable value 2");
    cs_close(&s);
    return rc;
}

static int c_status_bad(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc) {
        uint64_t v = 0x1ff;
        rc = observe(&s, cs_ack(&s, VHOST_USER_SET_STATUS, &v, 8, NULL, 0), "status 0x1ff");
    }
    cs_close(&s);
    return rc;
}

/* GET_CONFIG beyond the config space, and of more than 256 bytes. */
static int c_config_oob(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc) {
        struct vu_config c;
        memset(&c, 0, sizeof(c));
        c.offset = 250;
        c.size = 100;
        struct vu_hdr h;
        union vu_payload p;
        rc = cs_call(&s, VHOST_USER_GET_CONFIG, &c, VU_CONFIG_HDR_SIZE + 100, &h, &p);
        if (rc == 0)
            rc = h.size == 0 ? VHD_CHAOS_NACK : 0;
        rc = observe(&s, rc, "GET_CONFIG 100 bytes at 250");
    }
    cs_close(&s);
    return rc;
}

/* A packed ring whose base names a slot beyond the ring. */
static int c_packed_base_oob(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, BIT(VIRTIO_F_RING_PACKED));
    if (!rc)
        rc = ring_prepare(&s, 0, OFF_R0);
    if (!rc)
        rc = must(&s, set_state(&s, VHOST_USER_SET_VRING_BASE, 0, 0x80008000u | 100u),
                  "SET_VRING_BASE");
    if (!rc)
        rc = observe(&s, set_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, s.kick[0]),
                     "start with base slot 100 of 8");
    cs_close(&s);
    return rc;
}

/* ======================= cases: memory tables ======================= */

static int mem_case(struct vhd_chaos_ctx *ctx, struct vu_mem_region *r, unsigned n,
                    const char *what)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc) {
        int fds[8];
        for (unsigned i = 0; i < 8; i++)
            fds[i] = s.m->fd;
        rc = observe(&s, cs_mem_table(&s, r, n, fds, n > 8 ? 8 : n), what);
    }
    cs_close(&s);
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
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc)
        rc = must(&s, cs_set_features(&s, BIT(VIRTIO_F_VERSION_1)), "SET_FEATURES");
    if (rc) {
        cs_close(&s);
        return rc;
    }
    struct vu_mem_region r[2] = {win_region(&s, 0), win_region(&s, 1)};
    r[0].mmap_offset += 512;
    r[0].uva += 512;
    r[0].size -= 512;
    r[1].gpa = r[0].gpa + r[0].size;
    s.r0_off = 512;
    int fds[2] = {s.m->fd, s.m->fd};
    rc = must(&s, cs_mem_table(&s, r, 2, fds, 2), "SET_MEM_TABLE (offset 512)");
    if (!rc)
        rc = ring_start(&s, 0, OFF_R0);
    if (!rc) {
        uint8_t *a = hva(&s, OFF_DATA), *b = hva(&s, OFF_DATA + 4096);
        for (unsigned i = 0; i < 4096; i++)
            a[i] = (uint8_t)(i * 7 + 3);
        mirror(&s, OFF_DATA, 4096);
        blk_hdr(&s, 0, VIRTIO_BLK_T_OUT, 64);
        blk_hdr(&s, 1, VIRTIO_BLK_T_IN, 64);
        allow(&s, OFF_STAT, 1);
        allow(&s, OFF_STAT + 64, 1);
        allow(&s, OFF_DATA + 4096, 4096);
        sdesc(&s, OFF_R0, 0, gpa(&s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
        sdesc(&s, OFF_R0, 1, gpa(&s, OFF_DATA), 4096, VRING_DESC_F_NEXT, 2);
        sdesc(&s, OFF_R0, 2, gpa(&s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
        sdesc(&s, OFF_R0, 3, gpa(&s, OFF_HDR + 64), 16, VRING_DESC_F_NEXT, 4);
        sdesc(&s, OFF_R0, 4, gpa(&s, OFF_DATA + 4096), 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE,
              5);
        sdesc(&s, OFF_R0, 5, gpa(&s, OFF_STAT + 64), 1, VRING_DESC_F_WRITE, 0);
        struct used u0, u1;
        split_publish(&s, OFF_R0, 0, 1);
        kick(&s, 0);
        rc = await_used(&s, OFF_R0, 0, &u0, s.tmo);
        if (!rc && u0.got) {
            split_publish(&s, OFF_R0, 3, 2);
            kick(&s, 0);
            rc = await_used(&s, OFF_R0, 1, &u1, s.tmo);
            if (!rc && u1.got && blk_status(&s, 0) == 0 && blk_status(&s, 1) == 0 &&
                memcmp(a, b, 4096) == 0)
                ctx->observed |= VHD_CHAOS_SERVED;
            else if (!rc)
                note(&s, 0, "status %u/%u, data %s", blk_status(&s, 0), blk_status(&s, 1),
                     memcmp(a, b, 4096) ? "differs" : "same");
        } else if (!rc) {
            note(&s, 0, "write not completed");
        }
    }
    cs_close(&s);
    return rc;
}

/* ADD_MEM_REG overlapping a region of the table. */
static int c_add_overlap(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc) {
        struct vu_mem_single m = {.region = win_region(&s, 1)};
        m.region.gpa = s.m->win[0].gpa + 8192; /* inside region 0 */
        m.region.uva += 3 * VHD_CHAOS_WIN_SIZE;
        int fd = s.m->fd;
        rc = observe(&s, cs_ack(&s, VHOST_USER_ADD_MEM_REG, &m, sizeof(m), &fd, 1),
                     "ADD_MEM_REG overlapping region 0");
    }
    cs_close(&s);
    return rc;
}

static int c_rem_unknown(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc) {
        struct vu_mem_single m = {.region = win_region(&s, 1)};
        m.region.size -= 4096;
        rc = observe(&s, cs_ack(&s, VHOST_USER_REM_MEM_REG, &m, sizeof(m), NULL, 0),
                     "REM_MEM_REG of a region that does not exist");
    }
    cs_close(&s);
    return rc;
}

/* ======================= cases: rings ======================= */

/* Ring 0 with the given addresses; the start must be refused or break the device. */
static int ring_case(struct vhd_chaos_ctx *ctx, uint64_t desc, uint64_t avail, uint64_t used,
                     bool packed, const char *what)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, packed ? BIT(VIRTIO_F_RING_PACKED) : 0);
    if (!rc) {
        ring_layout(&s, OFF_R0);
        rc = must(&s, set_state(&s, VHOST_USER_SET_VRING_NUM, 0, QSZ), "SET_VRING_NUM");
    }
    if (!rc) {
        if (!desc)
            desc = uva(&s, OFF_R0);
        if (!avail)
            avail = uva(&s, OFF_R0 + RING_AVAIL);
        if (!used)
            used = uva(&s, OFF_R0 + RING_USED);
        rc = set_addr(&s, 0, desc, avail, used);
        if (rc) {
            rc = observe(&s, rc, what); /* refused at SET_VRING_ADDR already */
        } else {
            s.kick[0] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
            rc = observe(&s, set_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, s.kick[0]), what);
            if (!rc && cs_needs_reset(&s) == 1)
                ctx->observed |= VHD_CHAOS_BROKEN;
        }
    }
    cs_close(&s);
    return rc;
}

static uint64_t ctx_uva(struct vhd_chaos_ctx *ctx, unsigned w, size_t off)
{
    return (uint64_t)(uintptr_t)(ctx->mem->win[w].hva + off);
}

static int c_desc_outside(struct vhd_chaos_ctx *ctx)
{
    return ring_case(ctx, 0x10000, 0, 0, false, "descriptor table outside guest memory");
}

static int c_used_outside(struct vhd_chaos_ctx *ctx)
{
    return ring_case(ctx, 0, 0, ctx_uva(ctx, 1, VHD_CHAOS_WIN_SIZE) + 64, false,
                     "used ring outside guest memory");
}

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

static int c_used_crosses(struct vhd_chaos_ctx *ctx)
{
    return ring_case(ctx, 0, 0, ctx_uva(ctx, 0, VHD_CHAOS_WIN_SIZE - 8), false,
                     "used ring crossing the region's end");
}

static int c_packed_desc_crosses(struct vhd_chaos_ctx *ctx)
{
    return ring_case(ctx, ctx_uva(ctx, 0, VHD_CHAOS_WIN_SIZE - 16), 0, 0, true,
                     "packed ring crossing the region's end");
}

static int c_ring_misaligned(struct vhd_chaos_ctx *ctx)
{
    return ring_case(ctx, ctx_uva(ctx, 0, OFF_R0) + 8, 0, 0, false, "descriptor table at +8");
}

static int c_ring_uva_wraps(struct vhd_chaos_ctx *ctx)
{
    return ring_case(ctx, UINT64_MAX - 15, 0, 0, false, "descriptor table at 2^64 - 16");
}

/* ======================= cases: order ======================= */

static int c_kick_before_mem(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc)
        rc = must(&s, cs_set_features(&s, BIT(VIRTIO_F_VERSION_1)), "SET_FEATURES");
    if (!rc) {
        ring_layout(&s, OFF_R0);
        rc = must(&s, set_state(&s, VHOST_USER_SET_VRING_NUM, 0, QSZ), "SET_VRING_NUM");
    }
    if (!rc)
        rc = must(&s,
                  set_addr(&s, 0, uva(&s, OFF_R0), uva(&s, OFF_R0 + RING_AVAIL),
                           uva(&s, OFF_R0 + RING_USED)),
                  "SET_VRING_ADDR");
    if (!rc) {
        s.kick[0] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        rc = observe(&s, set_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, s.kick[0]),
                     "kick before SET_MEM_TABLE");
    }
    cs_close(&s);
    return rc;
}

static int c_kick_before_features(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, WANT_PROTO);
    if (!rc)
        rc = must(&s, cs_mem_default(&s), "SET_MEM_TABLE");
    if (!rc) {
        ring_layout(&s, OFF_R0);
        rc = must(&s, set_state(&s, VHOST_USER_SET_VRING_NUM, 0, QSZ), "SET_VRING_NUM");
    }
    if (!rc)
        rc = must(&s,
                  set_addr(&s, 0, uva(&s, OFF_R0), uva(&s, OFF_R0 + RING_AVAIL),
                           uva(&s, OFF_R0 + RING_USED)),
                  "SET_VRING_ADDR");
    if (!rc) {
        s.kick[0] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        rc = observe(&s, set_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, s.kick[0]),
                     "kick before SET_FEATURES");
    }
    cs_close(&s);
    return rc;
}

static int c_kick_before_addr(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_setup(ctx, &s, 0);
    if (!rc)
        rc = must(&s, set_state(&s, VHOST_USER_SET_VRING_NUM, 0, QSZ), "SET_VRING_NUM");
    if (!rc) {
        s.kick[0] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        rc = observe(&s, set_vring_fd(&s, VHOST_USER_SET_VRING_KICK, 0, s.kick[0]),
                     "kick before SET_VRING_ADDR");
    }
    cs_close(&s);
    return rc;
}

static int c_addr_on_started(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_blk(ctx, &s, false, false);
    if (!rc)
        rc = observe(&s,
                     set_addr(&s, 0, uva(&s, OFF_R1), uva(&s, OFF_R1 + RING_AVAIL),
                              uva(&s, OFF_R1 + RING_USED)),
                     "SET_VRING_ADDR on a started ring");
    cs_close(&s);
    return rc;
}

static int c_num_on_started(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_blk(ctx, &s, false, false);
    if (!rc)
        rc = observe(&s, set_state(&s, VHOST_USER_SET_VRING_NUM, 0, 2 * QSZ),
                     "SET_VRING_NUM on a started ring");
    cs_close(&s);
    return rc;
}

static int c_base_on_started(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_blk(ctx, &s, false, false);
    if (!rc)
        rc = observe(&s, set_state(&s, VHOST_USER_SET_VRING_BASE, 0, 5),
                     "SET_VRING_BASE on a started ring");
    cs_close(&s);
    return rc;
}

/* REM_MEM_REG of the region a started ring lives in. */
static int c_rem_in_use(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_blk(ctx, &s, false, false);
    if (!rc) {
        struct vu_mem_single m = {.region = win_region(&s, 0)};
        rc = observe(&s, cs_ack(&s, VHOST_USER_REM_MEM_REG, &m, sizeof(m), NULL, 0),
                     "REM_MEM_REG of the ring's region");
    }
    cs_close(&s);
    return rc;
}

/* A new memory table without the region a started ring lives in. */
static int c_table_drops_ring(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_blk(ctx, &s, false, false);
    if (!rc) {
        struct vu_mem_region r = win_region(&s, 1);
        int fd = s.m->fd;
        rc = observe(&s, cs_mem_table(&s, &r, 1, &fd, 1), "SET_MEM_TABLE without the ring");
    }
    cs_close(&s);
    return rc;
}

/* ADD_MEM_REG when CONFIGURE_MEM_SLOTS was not negotiated. */
static int c_add_reg_not_negotiated(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_open(ctx, &s);
    if (!rc)
        rc = cs_negotiate(&s, BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK));
    if (!rc) {
        struct vu_mem_single m = {.region = win_region(&s, 0)};
        int fd = s.m->fd;
        rc = observe(&s, cs_ack(&s, VHOST_USER_ADD_MEM_REG, &m, sizeof(m), &fd, 1),
                     "ADD_MEM_REG not negotiated");
    }
    cs_close(&s);
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
    struct cs s;
    int rc = cs_blk(ctx, &s, false, false);
    if (!rc) {
        /* A request reading into window 1 (the whole window: 1 MiB) */
        blk_hdr(&s, 0, VIRTIO_BLK_T_IN, 0);
        allow(&s, OFF_STAT, 1);
        allow(&s, VHD_CHAOS_WIN_SIZE, VHD_CHAOS_WIN_SIZE); /* window 1 */
        sdesc(&s, OFF_R0, 0, gpa(&s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
        sdesc(&s, OFF_R0, 1, s.m->win[1].gpa, VHD_CHAOS_WIN_SIZE,
              VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
        sdesc(&s, OFF_R0, 2, gpa(&s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
        split_publish(&s, OFF_R0, 0, 1);
        kick(&s, 0);
        struct vu_mem_single m = {.region = win_region(&s, 1)};
        int r1 = cs_ack(&s, VHOST_USER_REM_MEM_REG, &m, sizeof(m), NULL, 0);
        struct used u;
        rc = await_used(&s, OFF_R0, 0, &u, s.tmo);
        if (!rc) {
            /* Either refused, or accepted after the request completed (then it must be OK). */
            if (r1 == 0 && u.got && blk_status(&s, 0) == 0)
                ctx->observed |= VHD_CHAOS_SERVED;
            else
                rc = observe(&s, r1, "REM_MEM_REG of an in-flight buffer's region");
        }
    }
    cs_close(&s);
    return rc;
}

/* ======================= cases: descriptor chains (blk) ======================= */

/* An IN request [hdr][4 KiB data][status] as descriptors 0..2; the control case. */
static void std_in(struct cs *s)
{
    blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    allow(s, OFF_STAT, 1);
    allow(s, OFF_DATA, 4096);
}

static int chain_case(struct vhd_chaos_ctx *ctx, bool packed, bool indirect,
                      void (*build)(struct cs *s))
{
    struct cs s;
    int rc = cs_blk(ctx, &s, packed, indirect);
    if (!rc) {
        build(&s);
        rc = blk_go(&s);
    }
    cs_close(&s);
    return rc;
}

static void b_control(struct cs *s)
{
    std_in(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 1, gpa(s, OFF_DATA), 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
    sdesc(s, OFF_R0, 2, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_loop(struct cs *s)
{
    std_in(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 1, gpa(s, OFF_DATA), 512, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 0);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_longer_than_queue(struct cs *s)
{
    std_in(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    for (uint16_t i = 1; i < QSZ; i++) /* the last links back to 1: QSZ + more */
        sdesc(s, OFF_R0, i, gpa(s, OFF_DATA) + 512u * i, 512,
              VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, (unsigned)i + 1 < QSZ ? i + 1 : 1);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_head_oob(struct cs *s)
{
    std_in(s);
    split_publish(s, OFF_R0, 100, 1);
}

static void b_next_oob(struct cs *s)
{
    std_in(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 50);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_avail_jump(struct cs *s)
{
    b_control(s);
    split_publish(s, OFF_R0, 0, 1 + 3 * QSZ); /* avail->idx more than a ring ahead */
}

static void b_addr_outside(struct cs *s)
{
    std_in(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 1, 0x1000, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
    sdesc(s, OFF_R0, 2, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    split_publish(s, OFF_R0, 0, 1);
}

/* A data buffer running past the end of guest memory (window 1's end). */
static void b_addr_past_end(struct cs *s)
{
    std_in(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 1, s->m->win[1].gpa + VHD_CHAOS_WIN_SIZE - 512, 4096,
          VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
    sdesc(s, OFF_R0, 2, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_len_wraps(struct cs *s)
{
    std_in(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 1, UINT64_MAX - 255, 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
    sdesc(s, OFF_R0, 2, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    split_publish(s, OFF_R0, 0, 1);
}

/* Readable after writable. */
static void b_write_before_read(struct cs *s)
{
    std_in(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_DATA), 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 1);
    sdesc(s, OFF_R0, 1, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 2);
    sdesc(s, OFF_R0, 2, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    split_publish(s, OFF_R0, 0, 1);
}

/* The status byte in a device-readable buffer: nothing may write it. */
static void b_status_readonly(struct cs *s)
{
    blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 1, gpa(s, OFF_DATA), 4096, VRING_DESC_F_NEXT, 2);
    sdesc(s, OFF_R0, 2, gpa(s, OFF_STAT), 1, 0, 0);
    split_publish(s, OFF_R0, 0, 1);
}

/* An 8-byte request header. */
static void b_hdr_short(struct cs *s)
{
    blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    allow(s, OFF_STAT, 1);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 8, VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 1, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    split_publish(s, OFF_R0, 0, 1);
}

/* A zero-length header descriptor (and a zero-length data one). */
static void b_zero_len(struct cs *s)
{
    blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    allow(s, OFF_STAT, 1);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_HDR), 0, VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 1, gpa(s, OFF_DATA), 0, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
    sdesc(s, OFF_R0, 2, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    split_publish(s, OFF_R0, 0, 1);
}

/* A read beyond the device's capacity (sector 2^60). */
static void b_sector_oob(struct cs *s)
{
    b_control(s);
    blk_hdr(s, 0, VIRTIO_BLK_T_IN, 1ull << 60);
}

/* A read of 100 bytes: not a multiple of the sector size. */
static void b_len_unaligned(struct cs *s)
{
    b_control(s);
    sdesc(s, OFF_R0, 1, gpa(s, OFF_DATA), 100, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
}

static void b_bad_type(struct cs *s)
{
    b_control(s);
    blk_hdr(s, 0, 0x7777, 0);
}

/* Indirect table entry i at table t (OFF_IND + 0x400 t). */
static void idesc(struct cs *s, unsigned t, uint16_t i, uint64_t addr, uint32_t len, uint16_t flags,
                  uint16_t next)
{
    sdesc(s, OFF_IND + 0x400u * t, i, addr, len, flags, next);
}

static void ind_std(struct cs *s)
{
    std_in(s);
    idesc(s, 0, 0, gpa(s, OFF_HDR), 16, VRING_DESC_F_NEXT, 1);
    idesc(s, 0, 1, gpa(s, OFF_DATA), 4096, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
    idesc(s, 0, 2, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
}

static void b_ind_control(struct cs *s)
{
    ind_std(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_IND), 48, VRING_DESC_F_INDIRECT, 0);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_ind_nested(struct cs *s)
{
    ind_std(s);
    idesc(s, 0, 1, gpa(s, OFF_IND + 0x400), 48, VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT, 2);
    idesc(s, 1, 0, gpa(s, OFF_DATA), 4096, VRING_DESC_F_WRITE, 0);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_IND), 48, VRING_DESC_F_INDIRECT, 0);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_ind_with_next(struct cs *s)
{
    ind_std(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_IND), 48, VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 1, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE, 0);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_ind_loop(struct cs *s)
{
    ind_std(s);
    idesc(s, 0, 2, gpa(s, OFF_STAT), 1, VRING_DESC_F_WRITE | VRING_DESC_F_NEXT, 1);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_IND), 48, VRING_DESC_F_INDIRECT, 0);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_ind_len_bad(struct cs *s)
{
    ind_std(s);
    sdesc(s, OFF_R0, 0, gpa(s, OFF_IND), 47, VRING_DESC_F_INDIRECT, 0);
    split_publish(s, OFF_R0, 0, 1);
}

static void b_ind_outside(struct cs *s)
{
    ind_std(s);
    sdesc(s, OFF_R0, 0, 0x2000, 48, VRING_DESC_F_INDIRECT, 0);
    split_publish(s, OFF_R0, 0, 1);
}

static int c_control(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_control);
}
static int c_loop(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_loop);
}
static int c_longer_than_queue(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_longer_than_queue);
}
static int c_head_oob(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_head_oob);
}
static int c_next_oob(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_next_oob);
}
static int c_avail_jump(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_avail_jump);
}
static int c_addr_outside(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_addr_outside);
}
static int c_addr_past_end(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_addr_past_end);
}
static int c_len_wraps(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_len_wraps);
}
static int c_write_before_read(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_write_before_read);
}
static int c_status_readonly(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_status_readonly);
}
static int c_hdr_short(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_hdr_short);
}
static int c_zero_len(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_zero_len);
}
static int c_sector_oob(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_sector_oob);
}
static int c_len_unaligned(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_len_unaligned);
}
static int c_bad_type(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_bad_type);
}
static int c_ind_control(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, true, b_ind_control);
}
static int c_ind_nested(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, true, b_ind_nested);
}
static int c_ind_with_next(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, true, b_ind_with_next);
}
static int c_ind_loop(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, true, b_ind_loop);
}
static int c_ind_len_bad(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, true, b_ind_len_bad);
}
static int c_ind_outside(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, true, b_ind_outside);
}
static int c_ind_not_negotiated(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, false, false, b_ind_control);
}

/* ---- packed ---- */

static void p_std(struct cs *s, struct pd *d)
{
    std_in(s);
    d[0] = (struct pd){gpa(s, OFF_HDR), 16, 0, VRING_DESC_F_NEXT};
    d[1] = (struct pd){gpa(s, OFF_DATA), 4096, 0, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE};
    d[2] = (struct pd){gpa(s, OFF_STAT), 1, 0, VRING_DESC_F_WRITE};
}

static void p_control(struct cs *s)
{
    struct pd d[3];
    p_std(s, d);
    packed_publish(s, OFF_R0, d, 3);
}

static void p_id_oob(struct cs *s)
{
    struct pd d[3];
    p_std(s, d);
    d[2].id = 500;
    packed_publish(s, OFF_R0, d, 3);
}

static void p_write_before_read(struct cs *s)
{
    struct pd d[3];
    p_std(s, d);
    struct pd t = d[0];
    d[0] = d[1];
    d[1] = t;
    packed_publish(s, OFF_R0, d, 3);
}

static void p_addr_outside(struct cs *s)
{
    struct pd d[3];
    p_std(s, d);
    d[1].addr = 0x3000;
    packed_publish(s, OFF_R0, d, 3);
}

static void p_hdr_short(struct cs *s)
{
    struct pd d[2];
    blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    allow(s, OFF_STAT, 1);
    d[0] = (struct pd){gpa(s, OFF_HDR), 4, 0, VRING_DESC_F_NEXT};
    d[1] = (struct pd){gpa(s, OFF_STAT), 1, 0, VRING_DESC_F_WRITE};
    packed_publish(s, OFF_R0, d, 2);
}

/* Every slot says NEXT: the chain runs into slots not made available. */
static void p_endless(struct cs *s)
{
    struct pd d[QSZ];
    std_in(s);
    for (unsigned i = 0; i < QSZ; i++)
        d[i] = (struct pd){gpa(s, OFF_DATA) + 512u * i, 512, 0,
                           VRING_DESC_F_NEXT | (i ? VRING_DESC_F_WRITE : 0)};
    d[0].addr = gpa(s, OFF_HDR);
    d[0].len = 16;
    packed_publish(s, OFF_R0, d, QSZ);
}

static void p_ind_nested(struct cs *s)
{
    struct pd d[1];
    ind_std(s);
    idesc(s, 0, 1, gpa(s, OFF_IND + 0x400), 16, VRING_DESC_F_NEXT | VRING_DESC_F_INDIRECT, 2);
    d[0] = (struct pd){gpa(s, OFF_IND), 48, 0, VRING_DESC_F_INDIRECT};
    packed_publish(s, OFF_R0, d, 1);
}

static void p_ind_in_chain(struct cs *s)
{
    struct pd d[2];
    ind_std(s);
    d[0] = (struct pd){gpa(s, OFF_IND), 48, 0, VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT};
    d[1] = (struct pd){gpa(s, OFF_STAT), 1, 0, VRING_DESC_F_WRITE};
    packed_publish(s, OFF_R0, d, 2);
}

/* Nothing device-writable at all: neither data nor status may be written. */
static void p_status_readonly(struct cs *s)
{
    struct pd d[3];
    blk_hdr(s, 0, VIRTIO_BLK_T_IN, 8);
    d[0] = (struct pd){gpa(s, OFF_HDR), 16, 0, VRING_DESC_F_NEXT};
    d[1] = (struct pd){gpa(s, OFF_DATA), 4096, 0, VRING_DESC_F_NEXT};
    d[2] = (struct pd){gpa(s, OFF_STAT), 1, 0, 0};
    packed_publish(s, OFF_R0, d, 3);
}

static int c_p_control(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, true, false, p_control);
}
static int c_p_id_oob(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, true, false, p_id_oob);
}
static int c_p_write_before_read(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, true, false, p_write_before_read);
}
static int c_p_addr_outside(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, true, false, p_addr_outside);
}
static int c_p_hdr_short(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, true, false, p_hdr_short);
}
static int c_p_endless(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, true, false, p_endless);
}
static int c_p_ind_nested(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, true, true, p_ind_nested);
}
static int c_p_ind_in_chain(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, true, true, p_ind_in_chain);
}
static int c_p_status_readonly(struct vhd_chaos_ctx *ctx)
{
    return chain_case(ctx, true, false, p_status_readonly);
}

/* ======================= cases: descriptor chains (net) ======================= */

#define OFF_TXBUF OFF_DATA
#define OFF_RXBUF (OFF_DATA + 0x1000u)

/* A frame (header + 60 bytes, broadcast) at OFF_TXBUF; an rx buffer of 2 KiB posted. */
static void net_frame(struct cs *s, bool post_rx)
{
    uint8_t f[NET_HDR + PKT_LEN];
    memset(f, 0, sizeof(f));
    memset(f + NET_HDR, 0xff, 6);
    for (unsigned i = 6; i < PKT_LEN; i++)
        f[NET_HDR + i] = (uint8_t)(i * 13);
    put(s, OFF_TXBUF, f, sizeof(f));
    if (post_rx) {
        allow(s, OFF_RXBUF, 2048);
        sdesc(s, OFF_R0, 0, gpa(s, OFF_RXBUF), 2048, VRING_DESC_F_WRITE, 0);
        split_publish(s, OFF_R0, 0, 1);
        kick(s, 0);
    }
}

/* Transmit head 0 of ring 1, then see what came back on both rings. */
static int net_go(struct cs *s, bool expect_frame_dropped)
{
    struct used tx, rx;
    split_publish(s, OFF_R1, 0, 1);
    kick(s, 1);
    int rc = await_used(s, OFF_R1, 0, &tx, s->tmo);
    if (rc || !tx.got)
        return rc;
    /* Delivered, or not: a loopback answers within the same burst; give it time anyway. */
    rc = await_used(s, OFF_R0, 0, &rx, expect_frame_dropped ? 150 : s->tmo);
    if (rc)
        return rc;
    if (rx.got && rx.len == NET_HDR + PKT_LEN &&
        memcmp(hva(s, OFF_RXBUF) + NET_HDR, hva(s, OFF_TXBUF) + NET_HDR, PKT_LEN) == 0)
        s->ctx->observed |= VHD_CHAOS_SERVED;
    else if (!rx.got && !(s->ctx->observed & VHD_CHAOS_BROKEN))
        s->ctx->observed |= VHD_CHAOS_REQ_ERROR; /* transmit completed, frame dropped */
    else if (rx.got)
        note(s, 0, "received %u bytes", rx.len);
    return 0;
}

static int c_net_control(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_net(ctx, &s);
    if (!rc) {
        net_frame(&s, true);
        sdesc(&s, OFF_R1, 0, gpa(&s, OFF_TXBUF), NET_HDR + PKT_LEN, 0, 0);
        rc = net_go(&s, false);
    }
    cs_close(&s);
    return rc;
}

/* A transmit chain of 6 bytes: shorter than the virtio-net header. */
static int c_net_hdr_short(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_net(ctx, &s);
    if (!rc) {
        net_frame(&s, true);
        sdesc(&s, OFF_R1, 0, gpa(&s, OFF_TXBUF), 6, 0, 0);
        rc = net_go(&s, true);
    }
    cs_close(&s);
    return rc;
}

/* A transmit loop. */
static int c_net_tx_loop(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_net(ctx, &s);
    if (!rc) {
        net_frame(&s, true);
        sdesc(&s, OFF_R1, 0, gpa(&s, OFF_TXBUF), 40, VRING_DESC_F_NEXT, 1);
        sdesc(&s, OFF_R1, 1, gpa(&s, OFF_TXBUF) + 40, 32, VRING_DESC_F_NEXT, 0);
        rc = net_go(&s, true);
    }
    cs_close(&s);
    return rc;
}

/* A receive buffer the device may only read. */
static int c_net_rx_readonly(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_net(ctx, &s);
    if (!rc) {
        net_frame(&s, false);
        sdesc(&s, OFF_R0, 0, gpa(&s, OFF_RXBUF), 2048, 0, 0);
        split_publish(&s, OFF_R0, 0, 1);
        kick(&s, 0);
        sdesc(&s, OFF_R1, 0, gpa(&s, OFF_TXBUF), NET_HDR + PKT_LEN, 0, 0);
        split_publish(&s, OFF_R1, 0, 1);
        kick(&s, 1);
        struct used tx, rx;
        rc = await_used(&s, OFF_R1, 0, &tx, s.tmo);
        if (!rc && !(ctx->observed & VHD_CHAOS_BROKEN)) {
            kick(&s, 0); /* the receive queue learns of its broken state when it runs */
            rc = await_used(&s, OFF_R0, 0, &rx, s.tmo);
            if (!rc && rx.got)
                note(&s, 0, "read-only receive buffer used (%u bytes)", rx.len);
        }
    }
    cs_close(&s);
    return rc;
}

/* A receive buffer of 4 bytes: the frame cannot fit; it is dropped, nothing written. */
static int c_net_rx_tiny(struct vhd_chaos_ctx *ctx)
{
    struct cs s;
    int rc = cs_net(ctx, &s);
    if (!rc) {
        net_frame(&s, false);
        sdesc(&s, OFF_R0, 0, gpa(&s, OFF_RXBUF), 4, VRING_DESC_F_WRITE, 0);
        split_publish(&s, OFF_R0, 0, 1);
        kick(&s, 0);
        sdesc(&s, OFF_R1, 0, gpa(&s, OFF_TXBUF), NET_HDR + PKT_LEN, 0, 0);
        rc = net_go(&s, true);
    }
    cs_close(&s);
    return rc;
}

/* ======================= catalogue ======================= */

#define N VHD_CHAOS_NACK
#define C VHD_CHAOS_CLOSED
#define E VHD_CHAOS_REQ_ERROR
#define B VHD_CHAOS_BROKEN
#define S VHD_CHAOS_SERVED
#define BLK(name, cat, expect)                                        \
    {                                                                 \
#name, VHD_CHAOS_##cat, VHD_CHAOS_DEV_BLK, (expect), c_##name \
    }
#define NET(name, cat, expect)                                        \
    {                                                                 \
#name, VHD_CHAOS_##cat, VHD_CHAOS_DEV_NET, (expect), c_##name \
    }

static const struct vhd_chaos_case cases[] = {
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

    BLK(kick_missing_fd, FDS, N),
    BLK(extra_fds, FDS, N),
    BLK(nofd_with_fd, FDS, N),
    BLK(too_many_fds, FDS, C),
    BLK(mem_wrong_fd, FDS, N),
    BLK(mem_fd_count, FDS, N),
    BLK(kick_memfd, FDS, N | B),
    BLK(add_reg_pipe, FDS, N),

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

    BLK(overlap_gpa, MEMORY, N),
    BLK(overlap_uva, MEMORY, N),
    BLK(gpa_overflow, MEMORY, N),
    BLK(uva_overflow, MEMORY, N),
    BLK(size_zero, MEMORY, N),
    BLK(size_huge, MEMORY, N),
    BLK(mmap_beyond, MEMORY, N),
    BLK(mmap_unaligned_beyond, MEMORY, N),
    BLK(mmap_offset_wraps, MEMORY, N),
    BLK(nine_regions, MEMORY, N | C),
    BLK(mmap_unaligned_exact, MEMORY, S),
    BLK(add_overlap, MEMORY, N),
    BLK(rem_unknown, MEMORY, N),

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

    BLK(control, CHAINS, S),
    BLK(loop, CHAINS, B),
    BLK(longer_than_queue, CHAINS, B),
    BLK(head_oob, CHAINS, B),
    BLK(next_oob, CHAINS, B),
    BLK(avail_jump, CHAINS, B),
    BLK(addr_outside, CHAINS, B | E),
    BLK(addr_past_end, CHAINS, B | E),
    BLK(len_wraps, CHAINS, B | E),
    BLK(write_before_read, CHAINS, B),
    BLK(status_readonly, CHAINS, B),
    BLK(hdr_short, CHAINS, E),
    BLK(zero_len, CHAINS, E | B),
    BLK(sector_oob, CHAINS, E),
    BLK(len_unaligned, CHAINS, E),
    BLK(bad_type, CHAINS, E),
    BLK(ind_control, CHAINS, S),
    BLK(ind_nested, CHAINS, B),
    BLK(ind_with_next, CHAINS, B),
    BLK(ind_loop, CHAINS, B),
    BLK(ind_len_bad, CHAINS, B),
    BLK(ind_outside, CHAINS, B),
    BLK(ind_not_negotiated, CHAINS, B),
    BLK(p_control, CHAINS, S),
    BLK(p_id_oob, CHAINS, B),
    BLK(p_write_before_read, CHAINS, B),
    BLK(p_addr_outside, CHAINS, B | E),
    BLK(p_hdr_short, CHAINS, E),
    BLK(p_endless, CHAINS, B),
    BLK(p_ind_nested, CHAINS, B),
    BLK(p_ind_in_chain, CHAINS, B),
    BLK(p_status_readonly, CHAINS, B),

    NET(net_control, CHAINS, S),
    NET(net_hdr_short, CHAINS, E),
    NET(net_tx_loop, CHAINS, B),
    NET(net_rx_readonly, CHAINS, B),
    NET(net_rx_tiny, CHAINS, E),
};

const struct vhd_chaos_case *vhd_chaos_cases(unsigned *n)
{
    *n = (unsigned)VHD_ARRAY_SIZE(cases);
    return cases;
}

int vhd_chaos_run(const struct vhd_chaos_case *cs, struct vhd_chaos_ctx *ctx)
{
    ctx->observed = 0;
    ctx->config_changes = 0;
    ctx->note[0] = 0;
    ctx->nallow = 0;
    mem_reset(ctx->mem);
    return cs->run(ctx);
}

bool vhd_chaos_verdict(const struct vhd_chaos_case *cs, const struct vhd_chaos_ctx *ctx)
{
    return ctx->observed != 0 && (ctx->observed & ~cs->expect) == 0;
}

const char *vhd_chaos_category_name(enum vhd_chaos_category cat)
{
    static const char *const names[VHD_CHAOS_NCATEGORIES] = {
        "framing", "fds", "features", "memory", "rings", "order", "chains"};
    return (unsigned)cat < VHD_CHAOS_NCATEGORIES ? names[cat] : "?";
}

const char *vhd_chaos_outcome_str(unsigned o, char *buf, size_t len)
{
    static const char *const names[] = {"NACK", "CLOSED", "REQ_ERROR", "BROKEN", "SERVED"};
    size_t used = 0;
    if (len)
        buf[0] = 0;
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(names); i++) {
        if (!(o & (1u << i)) || used >= len)
            continue;
        int n = snprintf(buf + used, len - used, "%s%s", used ? "|" : "", names[i]);
        if (n > 0)
            used += (size_t)n;
    }
    if (!o && len)
        snprintf(buf, len, "none");
    return buf;
}
