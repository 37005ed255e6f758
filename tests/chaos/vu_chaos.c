/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Chaos mode (see vu_chaos.h): the guest memory with canary guards, a raw
 * vhost-user session that can send anything (any size field, any flags, any
 * number and kind of fds, truncated streams), well-formed set-up steps to
 * reach the state a case needs, descriptor chains written straight into the
 * rings, outcome detection, and the catalogue of cases (the cases live in
 * vu_chaos_msgs.c and vu_chaos_chains.c; the helpers they use are declared
 * in vu_chaos_int.h).
 *
 * Every driver-side write into guest memory goes through vhd_chaos__put /
 * vhd_chaos__mirror, which also update the snapshot: at the end, a byte that differs from the
 * snapshot was written by the back-end, and must lie in an allowed range.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
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

#include "util/compiler.h"
#include "spec/virtio.h"
#include "spec/virtio_blk.h"
#include "spec/vhost_user.h"
#include "vu_chaos_int.h"

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
    if (ctx->allow_overflow) {
        snprintf(why, whylen, "the case allowed more than %d ranges", VHD_CHAOS_MAX_ALLOW);
        return 1;
    }
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

int vhd_chaos__note(struct vhd_chaos_sess *s, int rc, const char *fmt, ...)
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

/*
 * ---- driver-side memory access, mirrored into the snapshot ----
 * Offsets run over the windows back to back: window w holds offsets
 * [w * VHD_CHAOS_WIN_SIZE, (w + 1) * VHD_CHAOS_WIN_SIZE). A range never
 * spans two windows (they are apart in our mapping).
 */

uint8_t *vhd_chaos__hva(struct vhd_chaos_sess *s, size_t off)
{
    return s->m->win[(off / VHD_CHAOS_WIN_SIZE) % VHD_CHAOS_WINDOWS].hva + off % VHD_CHAOS_WIN_SIZE;
}

uint64_t vhd_chaos__uva(struct vhd_chaos_sess *s, size_t off)
{
    return (uint64_t)(uintptr_t)vhd_chaos__hva(s, off);
}

uint64_t vhd_chaos__gpa(struct vhd_chaos_sess *s, size_t off)
{
    if (off >= VHD_CHAOS_WIN_SIZE)
        return s->r1_gpa + (off - VHD_CHAOS_WIN_SIZE);
    return s->r0_gpa + (off - s->r0_off);
}

void vhd_chaos__mirror(struct vhd_chaos_sess *s, size_t off, size_t len)
{
    memcpy(s->m->snap + off, vhd_chaos__hva(s, off), len);
}

void vhd_chaos__put(struct vhd_chaos_sess *s, size_t off, const void *src, size_t len)
{
    memcpy(vhd_chaos__hva(s, off), src, len);
    vhd_chaos__mirror(s, off, len);
}

static void zero(struct vhd_chaos_sess *s, size_t off, size_t len)
{
    memset(vhd_chaos__hva(s, off), 0, len);
    vhd_chaos__mirror(s, off, len);
}

void vhd_chaos__allow(struct vhd_chaos_sess *s, size_t off, size_t len)
{
    struct vhd_chaos_ctx *c = s->ctx;
    for (unsigned i = 0; i < c->nallow; i++)
        if (off >= c->allow[i].off && len <= c->allow[i].len &&
            off - c->allow[i].off <= c->allow[i].len - len)
            return; /* already allowed (cases that run many sessions repeat themselves) */
    if (c->nallow == VHD_CHAOS_MAX_ALLOW) {
        c->allow_overflow = true; /* vhd_chaos_check_memory fails: never a silent gap */
        return;
    }
    c->allow[c->nallow].off = off;
    c->allow[c->nallow].len = len;
    c->nallow++;
}

/* ---- raw messages ---- */

int vhd_chaos__raw_sendmsg(int fd, const void *buf, size_t len, const int *fds, unsigned nfds)
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

int vhd_chaos__send_raw(struct vhd_chaos_sess *s, uint32_t req, uint32_t flags, uint32_t size,
                        const void *p, uint32_t len, const int *fds, unsigned nfds)
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
    return vhd_chaos__raw_sendmsg(s->fd, buf, sizeof(h) + len, fds, nfds);
}

/* Read exactly len bytes within the timeout. 1, -ECONNRESET (EOF/reset), -ETIMEDOUT. */
static int read_full(int fd, void *buf, size_t len, int tmo, int *keep)
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
        /* Keep the first fd when asked to (GET_INFLIGHT_FD), close any other. */
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
                int nf = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
                for (int i = 0; i < nf; i++) {
                    int f;
                    memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
                    if (keep && *keep < 0)
                        *keep = f;
                    else
                        close(f);
                }
            }
        }
        got += (size_t)n;
    }
    return 1;
}

int vhd_chaos__recv(struct vhd_chaos_sess *s, struct vu_hdr *h, union vu_payload *p)
{
    return vhd_chaos__recv_fd(s, h, p, NULL);
}

int vhd_chaos__recv_fd(struct vhd_chaos_sess *s, struct vu_hdr *h, union vu_payload *p, int *keep)
{
    int rc = read_full(s->fd, h, sizeof(*h), s->tmo, keep);
    if (rc < 0)
        return rc;
    if (h->size > sizeof(*p))
        return -EPROTO;
    return h->size ? read_full(s->fd, p, h->size, s->tmo, keep) : 1;
}

int vhd_chaos__call(struct vhd_chaos_sess *s, uint32_t req, const void *pl, uint32_t size,
                    struct vu_hdr *h, union vu_payload *p)
{
    return vhd_chaos__call_fd(s, req, pl, size, h, p, NULL);
}

int vhd_chaos__call_fd(struct vhd_chaos_sess *s, uint32_t req, const void *pl, uint32_t size,
                       struct vu_hdr *h, union vu_payload *p, int *fd)
{
    int rc = vhd_chaos__send_raw(s, req, VHOST_USER_VERSION, size, pl, size, NULL, 0);
    if (rc == -EPIPE || rc == -ECONNRESET)
        return VHD_CHAOS_CLOSED;
    if (rc < 0)
        return rc;
    rc = vhd_chaos__recv_fd(s, h, p, fd);
    if (rc == -ECONNRESET)
        return VHD_CHAOS_CLOSED;
    if (rc < 0)
        return rc;
    if (h->request != req || h->flags != (VHOST_USER_VERSION | VHOST_USER_REPLY_MASK))
        return vhd_chaos__note(s, -EPROTO, "reply %u flags 0x%x to request %u", h->request,
                               h->flags, req);
    return 0;
}

int vhd_chaos__call_u64(struct vhd_chaos_sess *s, uint32_t req, uint64_t *out)
{
    struct vu_hdr h;
    union vu_payload p;
    int rc = vhd_chaos__call(s, req, NULL, 0, &h, &p);
    if (rc != 0)
        return rc;
    if (h.size != 8)
        return vhd_chaos__note(s, -EPROTO, "reply of %u bytes to request %u", h.size, req);
    *out = p.u64;
    return 0;
}

/* Is the session still served? A GET_FEATURES round trip: 0 or VHD_CHAOS_CLOSED (or -errno). */
static int cs_probe(struct vhd_chaos_sess *s)
{
    uint64_t v;
    return vhd_chaos__call_u64(s, VHOST_USER_GET_FEATURES, &v);
}

int vhd_chaos__ack_raw(struct vhd_chaos_sess *s, uint32_t req, uint32_t size, const void *pl,
                       uint32_t len, const int *fds, unsigned nfds)
{
    struct vu_hdr h;
    union vu_payload p;
    int rc = vhd_chaos__send_raw(s, req, VHOST_USER_VERSION | VHOST_USER_NEED_REPLY_MASK, size, pl,
                                 len, fds, nfds);
    if (rc == -EPIPE || rc == -ECONNRESET)
        return VHD_CHAOS_CLOSED;
    if (rc < 0)
        return rc;
    if (!(s->proto & BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK)))
        return cs_probe(s);
    rc = vhd_chaos__recv(s, &h, &p);
    if (rc == -ECONNRESET)
        return VHD_CHAOS_CLOSED;
    if (rc < 0)
        return rc;
    if (h.request != req || h.size != 8)
        return vhd_chaos__note(s, -EPROTO, "ack for request %u of %u bytes (sent %u)", h.request,
                               h.size, req);
    if (p.u64)
        return VHD_CHAOS_NACK;
    return 0;
}

int vhd_chaos__ack(struct vhd_chaos_sess *s, uint32_t req, const void *pl, uint32_t size,
                   const int *fds, unsigned nfds)
{
    return vhd_chaos__ack_raw(s, req, size, pl, size, fds, nfds);
}

int vhd_chaos__must(struct vhd_chaos_sess *s, int rc, const char *what)
{
    if (rc == 0)
        return 0;
    if (rc > 0)
        return vhd_chaos__note(s, -EIO, "set-up step %s: %s", what,
                               rc == VHD_CHAOS_NACK ? "refused" : "connection closed");
    return vhd_chaos__note(s, rc, "set-up step %s: %s", what, strerror(-rc));
}

int vhd_chaos__observe(struct vhd_chaos_sess *s, int rc, const char *what)
{
    if (rc < 0)
        return vhd_chaos__note(s, rc, "%s: no answer (%s)", what, strerror(-rc));
    if (rc > 0)
        s->ctx->observed |= (unsigned)rc;
    else
        vhd_chaos__note(s, 0, "%s: accepted", what);
    return 0;
}

/* ---- sessions ---- */

static int cs_connect_once(struct vhd_chaos_sess *s)
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

void vhd_chaos__close(struct vhd_chaos_sess *s)
{
    if (s->fd >= 0)
        close(s->fd);
    if (s->be_fd >= 0)
        close(s->be_fd);
    for (int i = 0; i < VHD_CHAOS_NRINGS; i++) {
        if (s->kick[i] >= 0)
            close(s->kick[i]);
        if (s->call[i] >= 0)
            close(s->call[i]);
        s->kick[i] = s->call[i] = -1;
    }
    s->fd = s->be_fd = -1;
}

int vhd_chaos__open(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s)
{
    memset(s, 0, sizeof(*s));
    s->ctx = ctx;
    s->m = ctx->mem;
    s->fd = s->be_fd = -1;
    for (int i = 0; i < VHD_CHAOS_NRINGS; i++)
        s->kick[i] = s->call[i] = -1;
    s->tmo = ctx->timeout_ms > 0 ? ctx->timeout_ms : 2000;
    s->r0_gpa = s->m->win[0].gpa;
    s->r0_off = 0;
    s->r1_gpa = s->m->win[1].gpa;
    uint64_t t0 = now_ms();
    int rc;
    for (;;) {
        rc = cs_connect_once(s);
        if (rc == 0) {
            rc = vhd_chaos__call_u64(s, VHOST_USER_GET_FEATURES, &s->offered);
            if (rc == 0)
                return 0;
            vhd_chaos__close(s);
        }
        if (now_ms() - t0 > (uint64_t)s->tmo * 2)
            break;
        nap_ms(10);
    }
    return vhd_chaos__note(s, rc < 0 ? rc : -ECONNREFUSED, "cannot open a session on %s",
                           ctx->socket_path);
}

int vhd_chaos__negotiate(struct vhd_chaos_sess *s, uint64_t want)
{
    int rc = vhd_chaos__must(
        s, vhd_chaos__call_u64(s, VHOST_USER_GET_PROTOCOL_FEATURES, &s->proto_offered),
        "GET_PROTOCOL_FEATURES");
    if (rc)
        return rc;
    uint64_t p = s->proto_offered & want;
    rc = vhd_chaos__send_raw(s, VHOST_USER_SET_PROTOCOL_FEATURES, VHOST_USER_VERSION, 8, &p, 8,
                             NULL, 0);
    if (rc)
        return vhd_chaos__must(s, rc, "SET_PROTOCOL_FEATURES");
    s->proto = p;
    rc = vhd_chaos__must(s, vhd_chaos__ack(s, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0), "SET_OWNER");
    if (rc)
        return rc;
    if (p & BIT(VHOST_USER_PROTOCOL_F_BACKEND_REQ)) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
            return vhd_chaos__note(s, -errno, "socketpair: %s", strerror(errno));
        rc = vhd_chaos__ack(s, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, &sv[1], 1);
        close(sv[1]);
        s->be_fd = sv[0];
        rc = vhd_chaos__must(s, rc, "SET_BACKEND_REQ_FD");
    }
    return rc;
}

int vhd_chaos__set_features(struct vhd_chaos_sess *s, uint64_t virtio)
{
    uint64_t f = virtio | BIT(VHOST_USER_F_PROTOCOL_FEATURES);
    s->packed = (virtio & BIT(VIRTIO_F_RING_PACKED)) != 0;
    return vhd_chaos__ack(s, VHOST_USER_SET_FEATURES, &f, 8, NULL, 0);
}

int vhd_chaos__mem_table(struct vhd_chaos_sess *s, const struct vu_mem_region *r, uint32_t n,
                         const int *fds, unsigned nfds)
{
    struct vu_mem_table t;
    memset(&t, 0, sizeof(t));
    t.nregions = n;
    memcpy(t.regions, r, (n > 8 ? 8 : n) * sizeof(*r));
    return vhd_chaos__ack_raw(s, VHOST_USER_SET_MEM_TABLE, VU_MEM_TABLE_HDR_SIZE + n * 32u, &t,
                              VU_MEM_TABLE_HDR_SIZE + (n > 8 ? 8 : n) * 32u, fds, nfds);
}

struct vu_mem_region vhd_chaos__win_region(struct vhd_chaos_sess *s, unsigned i)
{
    struct vu_mem_region r = {.gpa = s->m->win[i].gpa,
                              .size = VHD_CHAOS_WIN_SIZE,
                              .uva = (uint64_t)(uintptr_t)s->m->win[i].hva,
                              .mmap_offset = s->m->win[i].off};
    return r;
}

int vhd_chaos__mem_default(struct vhd_chaos_sess *s)
{
    struct vu_mem_region r[2] = {vhd_chaos__win_region(s, 0), vhd_chaos__win_region(s, 1)};
    int fds[2] = {s->m->fd, s->m->fd};
    return vhd_chaos__mem_table(s, r, 2, fds, 2);
}

int vhd_chaos__set_state(struct vhd_chaos_sess *s, uint32_t req, uint32_t index, uint32_t num)
{
    struct vu_vring_state st = {.index = index, .num = num};
    return vhd_chaos__ack(s, req, &st, sizeof(st), NULL, 0);
}

int vhd_chaos__set_addr(struct vhd_chaos_sess *s, uint32_t index, uint64_t desc, uint64_t avail,
                        uint64_t used)
{
    struct vu_vring_addr a = {.index = index, .desc = desc, .avail = avail, .used = used};
    return vhd_chaos__ack(s, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
}

int vhd_chaos__set_vring_fd(struct vhd_chaos_sess *s, uint32_t req, uint32_t index, int fd)
{
    uint64_t v = index | (fd < 0 ? VHOST_USER_VRING_NOFD_MASK : 0);
    return vhd_chaos__ack(s, req, &v, 8, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
}

void vhd_chaos__ring_layout(struct vhd_chaos_sess *s, size_t off)
{
    zero(s, off, 16 * QSZ);
    zero(s, off + RING_AVAIL, 64);
    zero(s, off + RING_USED, 8 * QSZ + 64);
    if (s->packed) {
        vhd_chaos__allow(s, off, 16 * QSZ); /* used descriptors are written in place */
        vhd_chaos__allow(s, off + RING_USED, 4);
    } else {
        vhd_chaos__allow(s, off + RING_USED, 4 + 8 * QSZ + 2);
    }
}

/* One ring step (VHD_STEP_LAYOUT .. VHD_STEP_ENABLE) for ring q at window offset off. */
static int ring_step(struct vhd_chaos_sess *s, enum vhd_chaos_step st, uint32_t q, size_t off)
{
    int *call = &s->call[q % VHD_CHAOS_NRINGS], *kick = &s->kick[q % VHD_CHAOS_NRINGS];
    switch (st) {
    case VHD_STEP_LAYOUT:
        vhd_chaos__ring_layout(s, off);
        return 0;
    case VHD_STEP_NUM:
        return vhd_chaos__must(s, vhd_chaos__set_state(s, VHOST_USER_SET_VRING_NUM, q, QSZ),
                               "SET_VRING_NUM");
    case VHD_STEP_BASE:
        return vhd_chaos__must(
            s, vhd_chaos__set_state(s, VHOST_USER_SET_VRING_BASE, q, s->packed ? 0x80008000u : 0),
            "SET_VRING_BASE");
    case VHD_STEP_ADDR:
        return vhd_chaos__must(s,
                               vhd_chaos__set_addr(s, q, vhd_chaos__uva(s, off),
                                                   vhd_chaos__uva(s, off + RING_AVAIL),
                                                   vhd_chaos__uva(s, off + RING_USED)),
                               "SET_VRING_ADDR");
    case VHD_STEP_CALL:
        if (*call < 0)
            *call = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (*kick < 0)
            *kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (*call < 0 || *kick < 0)
            return vhd_chaos__note(s, -EMFILE, "eventfd: %s", strerror(errno));
        return vhd_chaos__must(s, vhd_chaos__set_vring_fd(s, VHOST_USER_SET_VRING_CALL, q, *call),
                               "SET_VRING_CALL");
    case VHD_STEP_KICK:
        if (*kick < 0 && (*kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0)
            return vhd_chaos__note(s, -EMFILE, "eventfd: %s", strerror(errno));
        return vhd_chaos__must(s, vhd_chaos__set_vring_fd(s, VHOST_USER_SET_VRING_KICK, q, *kick),
                               "SET_VRING_KICK");
    case VHD_STEP_ENABLE:
        return vhd_chaos__must(s, vhd_chaos__set_state(s, VHOST_USER_SET_VRING_ENABLE, q, 1),
                               "SET_VRING_ENABLE");
    default:
        return 0;
    }
}

/* The ring steps [from, to) of ring q at window offset off, except those in skip. */
static int ring_steps(struct vhd_chaos_sess *s, uint32_t q, size_t off, enum vhd_chaos_step from,
                      enum vhd_chaos_step to, unsigned skip)
{
    int rc = 0;
    for (enum vhd_chaos_step st = from; st < to && !rc; st++)
        if (!(skip & (1u << st)))
            rc = ring_step(s, st, q, off);
    return rc;
}

int vhd_chaos__ring_steps(struct vhd_chaos_sess *s, uint32_t q, size_t off,
                          enum vhd_chaos_step from, enum vhd_chaos_step to)
{
    return ring_steps(s, q, off, from, to, 0);
}

int vhd_chaos__ring_prepare(struct vhd_chaos_sess *s, uint32_t q, size_t off)
{
    return ring_steps(s, q, off, VHD_STEP_LAYOUT, VHD_STEP_KICK, 0);
}

int vhd_chaos__kick_observe(struct vhd_chaos_sess *s, const char *what)
{
    if (s->kick[0] < 0)
        s->kick[0] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    return vhd_chaos__observe(
        s, vhd_chaos__set_vring_fd(s, VHOST_USER_SET_VRING_KICK, 0, s->kick[0]), what);
}

int vhd_chaos__ring_start(struct vhd_chaos_sess *s, uint32_t q, size_t off)
{
    return ring_steps(s, q, off, VHD_STEP_LAYOUT, VHD_STEP_END, 0);
}

int vhd_chaos__steps(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, struct vhd_chaos_plan p)
{
    int rc = vhd_chaos__open(ctx, s);
    if (!rc && p.stop > VHD_STEP_NEGOTIATE && !(p.skip & (1u << VHD_STEP_NEGOTIATE)))
        rc = vhd_chaos__negotiate(s, p.proto ? p.proto : WANT_PROTO);
    if (!rc && p.stop > VHD_STEP_FEATURES && !(p.skip & (1u << VHD_STEP_FEATURES)))
        rc = vhd_chaos__must(s, vhd_chaos__set_features(s, BIT(VIRTIO_F_VERSION_1) | p.virtio),
                             "SET_FEATURES");
    if (!rc && p.stop > VHD_STEP_MEM && !(p.skip & (1u << VHD_STEP_MEM)))
        rc = vhd_chaos__must(s, vhd_chaos__mem_default(s), "SET_MEM_TABLE");
    return rc ? rc : ring_steps(s, 0, OFF_R0, VHD_STEP_LAYOUT, p.stop, p.skip);
}

int vhd_chaos__setup(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, uint64_t virtio)
{
    return vhd_chaos__steps(ctx, s, UPTO(LAYOUT, .virtio = virtio));
}

int vhd_chaos__blk(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, bool packed, bool indirect)
{
    uint64_t f =
        (packed ? BIT(VIRTIO_F_RING_PACKED) : 0) | (indirect ? BIT(VIRTIO_F_INDIRECT_DESC) : 0);
    return vhd_chaos__steps(ctx, s, UPTO(END, .virtio = f));
}

int vhd_chaos__net(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s)
{
    int rc = vhd_chaos__setup(ctx, s, 0);
    if (!rc)
        rc = vhd_chaos__ring_start(s, 0, OFF_R0);
    return rc ? rc : vhd_chaos__ring_start(s, 1, OFF_R1);
}

void vhd_chaos__net_frame(struct vhd_chaos_sess *s)
{
    uint8_t f[NET_HDR + PKT_LEN];
    memset(f, 0, sizeof(f));
    memset(f + NET_HDR, 0xff, 6);
    for (unsigned i = 6; i < PKT_LEN; i++)
        f[NET_HDR + i] = (uint8_t)(i * 13);
    vhd_chaos__put(s, OFF_TXBUF, f, sizeof(f));
}

int vhd_chaos__net_go(struct vhd_chaos_sess *s, bool publish, int rx_ms)
{
    struct vhd_chaos_used tx, rx;
    if (publish)
        vhd_chaos__split_publish(s, OFF_R1, 0, 1);
    vhd_chaos__kick(s, 1);
    int rc = vhd_chaos__await_used(s, OFF_R1, 0, &tx, s->tmo);
    if (rc || !tx.got)
        return rc;
    rc = vhd_chaos__await_used(s, OFF_R0, 0, &rx, rx_ms);
    if (rc)
        return rc;
    if (rx.got && rx.len == NET_HDR + PKT_LEN &&
        memcmp(vhd_chaos__hva(s, OFF_RXBUF) + NET_HDR, vhd_chaos__hva(s, OFF_TXBUF) + NET_HDR,
               PKT_LEN) == 0)
        s->ctx->observed |= VHD_CHAOS_SERVED;
    else if (!rx.got && !(s->ctx->observed & VHD_CHAOS_BROKEN))
        s->ctx->observed |= VHD_CHAOS_REQ_ERROR; /* transmitted, frame dropped */
    else if (rx.got)
        vhd_chaos__note(s, 0, "received %u bytes", rx.len);
    return 0;
}

/* ---- outcome detection ---- */

/* Count CONFIG_CHANGE messages waiting on the back-end channel (never blocks). */
static void cs_drain_backend(struct vhd_chaos_sess *s)
{
    while (s->be_fd >= 0) {
        struct pollfd p = {.fd = s->be_fd, .events = POLLIN};
        if (poll(&p, 1, 0) <= 0 || !(p.revents & POLLIN))
            return;
        struct vu_hdr h;
        union vu_payload pl;
        if (read_full(s->be_fd, &h, sizeof(h), s->tmo, NULL) < 0 || h.size > sizeof(pl) ||
            (h.size && read_full(s->be_fd, &pl, h.size, s->tmo, NULL) < 0)) {
            close(s->be_fd);
            s->be_fd = -1;
            return;
        }
        if (h.request == VHOST_USER_BACKEND_CONFIG_CHANGE_MSG)
            s->ctx->config_changes++;
    }
}

int vhd_chaos__needs_reset(struct vhd_chaos_sess *s)
{
    uint64_t st;
    cs_drain_backend(s);
    if (!(s->proto & BIT(VHOST_USER_PROTOCOL_F_STATUS)))
        return 0;
    int rc = vhd_chaos__call_u64(s, VHOST_USER_GET_STATUS, &st);
    if (rc)
        return rc > 0 ? 0 : rc;
    return (st & VIRTIO_STATUS_NEEDS_RESET) ? 1 : 0;
}

void vhd_chaos__kick(struct vhd_chaos_sess *s, uint32_t q)
{
    uint64_t one = 1;
    if (write(s->kick[q % VHD_CHAOS_NRINGS], &one, sizeof(one)) < 0) {
        /* EAGAIN: a kick is already pending, which is all we want. */
    }
}

/* Split ring at window offset off: used->idx. */
static uint16_t split_used_idx(struct vhd_chaos_sess *s, size_t off)
{
    struct vhd_vring_used *u = (void *)vhd_chaos__hva(s, off + RING_USED);
    return vhd_le16(vhd_load_acquire(&u->idx));
}

/* Packed ring: is slot `slot` used (wrap counter 1: AVAIL and USED both set)? */
static bool packed_slot_used(struct vhd_chaos_sess *s, size_t off, uint16_t slot)
{
    struct vhd_vring_packed_desc *d = (void *)vhd_chaos__hva(s, off + 16u * slot);
    uint16_t f = vhd_le16(vhd_load_acquire(&d->flags));
    return (f & VRING_PACKED_DESC_F_AVAIL) && (f & VRING_PACKED_DESC_F_USED);
}

/* The n-th used element (0-based) of the ring at off, if there. */
static bool used_get(struct vhd_chaos_sess *s, size_t off, uint16_t n, struct vhd_chaos_used *u)
{
    if (s->packed) {
        if (n != 0 || !packed_slot_used(s, off, 0))
            return false;
        struct vhd_vring_packed_desc *d = (void *)vhd_chaos__hva(s, off);
        u->id = vhd_le16(d->id);
        u->len = vhd_le32(d->len);
    } else {
        if (split_used_idx(s, off) <= n)
            return false;
        struct vhd_vring_used *ur = (void *)vhd_chaos__hva(s, off + RING_USED);
        u->id = vhd_le32(ur->ring[n % QSZ].id);
        u->len = vhd_le32(ur->ring[n % QSZ].len);
    }
    u->got = true;
    return true;
}

int vhd_chaos__await_used(struct vhd_chaos_sess *s, size_t off, uint16_t n,
                          struct vhd_chaos_used *u, int ms)
{
    uint64_t t0 = now_ms();
    memset(u, 0, sizeof(*u));
    for (;;) {
        if (used_get(s, off, n, u))
            break;
        int b = vhd_chaos__needs_reset(s);
        if (b < 0)
            return vhd_chaos__note(s, b, "GET_STATUS: %s", strerror(-b));
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
    int b = vhd_chaos__needs_reset(s);
    if (b == 1)
        s->ctx->observed |= VHD_CHAOS_BROKEN;
    return b < 0 ? b : 0;
}

/* ---- descriptors ---- */

void vhd_chaos__sdesc(struct vhd_chaos_sess *s, size_t tbl, uint16_t i, uint64_t addr, uint32_t len,
                      uint16_t flags, uint16_t next)
{
    struct vhd_vring_desc d = {.addr = vhd_le64(addr),
                               .len = vhd_le32(len),
                               .flags = vhd_le16(flags),
                               .next = vhd_le16(next)};
    vhd_chaos__put(s, tbl + 16u * i, &d, sizeof(d));
}

void vhd_chaos__split_publish(struct vhd_chaos_sess *s, size_t off, uint16_t head, uint16_t idx)
{
    struct vhd_vring_avail *a = (void *)vhd_chaos__hva(s, off + RING_AVAIL);
    a->ring[(uint16_t)(idx - 1) % QSZ] = vhd_le16(head);
    vhd_chaos__mirror(s, off + RING_AVAIL + 4 + 2u * ((uint16_t)(idx - 1) % QSZ), 2);
    vhd_store_release(&a->idx, vhd_le16(idx));
    vhd_chaos__mirror(s, off + RING_AVAIL + 2, 2);
}

void vhd_chaos__packed_publish(struct vhd_chaos_sess *s, size_t off, const struct vhd_chaos_pd *d,
                               unsigned n)
{
    for (unsigned i = n; i-- > 0;) {
        struct vhd_vring_packed_desc *x = (void *)vhd_chaos__hva(s, off + 16u * i);
        x->addr = vhd_le64(d[i].addr);
        x->len = vhd_le32(d[i].len);
        x->id = vhd_le16(d[i].id);
        uint16_t fl = vhd_le16((uint16_t)(d[i].flags | VRING_PACKED_DESC_F_AVAIL));
        if (i)
            x->flags = fl;
        else
            vhd_store_release(&x->flags, fl);
        vhd_chaos__mirror(s, off + 16u * i, 16);
    }
}

/* ---- blk requests ---- */

void vhd_chaos__blk_hdr(struct vhd_chaos_sess *s, unsigned k, uint32_t type, uint64_t sector)
{
    struct virtio_blk_outhdr h = {.type = vhd_le32(type), .sector = vhd_le64(sector)};
    vhd_chaos__put(s, OFF_HDR + 64u * k, &h, sizeof(h));
    uint8_t ff = 0xff;
    vhd_chaos__put(s, OFF_STAT + 64u * k, &ff, 1);
}

uint8_t vhd_chaos__blk_status(struct vhd_chaos_sess *s, unsigned k)
{
    return *vhd_chaos__hva(s, OFF_STAT + 64u * k);
}

void vhd_chaos__blk_classify(struct vhd_chaos_sess *s, const struct vhd_chaos_used *u, unsigned k)
{
    if (!u->got)
        return;
    if (u->len == 0) {
        vhd_chaos__note(s, 0, "request given back unanswered");
        return;
    }
    uint8_t st = vhd_chaos__blk_status(s, k);
    if (st == VIRTIO_BLK_S_OK)
        s->ctx->observed |= VHD_CHAOS_SERVED;
    else if (st == VIRTIO_BLK_S_IOERR || st == VIRTIO_BLK_S_UNSUPP)
        s->ctx->observed |= VHD_CHAOS_REQ_ERROR;
    else
        vhd_chaos__note(s, 0, "used with length %u but status byte 0x%02x", u->len, st);
}

int vhd_chaos__blk_go(struct vhd_chaos_sess *s)
{
    struct vhd_chaos_used u;
    vhd_chaos__kick(s, 0);
    int rc = vhd_chaos__await_used(s, OFF_R0, 0, &u, s->tmo);
    if (rc)
        return rc;
    vhd_chaos__blk_classify(s, &u, 0);
    return 0;
}

/* ======================= the catalogue ======================= */

/* Both tables in one array, built once. */
static struct vhd_chaos_case all_cases[256];
static unsigned all_ncases;
static pthread_once_t all_once = PTHREAD_ONCE_INIT;

static void all_cases_build(void)
{
    for (unsigned i = 0; i < vhd_chaos__msg_ncases && all_ncases < VHD_ARRAY_SIZE(all_cases); i++)
        all_cases[all_ncases++] = vhd_chaos__msg_cases[i];
    for (unsigned i = 0; i < vhd_chaos__chain_ncases && all_ncases < VHD_ARRAY_SIZE(all_cases); i++)
        all_cases[all_ncases++] = vhd_chaos__chain_cases[i];
    for (unsigned i = 0; i < vhd_chaos__iotlb_ncases && all_ncases < VHD_ARRAY_SIZE(all_cases); i++)
        all_cases[all_ncases++] = vhd_chaos__iotlb_cases[i];
}

const struct vhd_chaos_case *vhd_chaos_cases(unsigned *n)
{
    pthread_once(&all_once, all_cases_build);
    *n = all_ncases;
    return all_cases;
}

int vhd_chaos_run(const struct vhd_chaos_case *cs, struct vhd_chaos_ctx *ctx)
{
    ctx->observed = 0;
    ctx->config_changes = 0;
    ctx->note[0] = 0;
    ctx->nallow = 0;
    ctx->allow_overflow = false;
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
        "framing", "fds", "features", "memory", "rings", "order", "chains", "iotlb"};
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
