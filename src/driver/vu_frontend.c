/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user front-end sessions (see vu_frontend.h): connecting, one
 * synchronous request/reply exchange with validation, and the handful of
 * composite steps a driver needs (handshake, memory table, ring start/stop).
 * Framing is transport/vu_sock.c's, the same code the device side uses.
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "spec/vhost_user.h"
#include "transport/vu_sock.h"
#include "util/bits.h"
#include "util/clock.h"
#include "vu_frontend.h"

/* Pause between connect attempts while the back-end's socket is not there yet. */
#define CONNECT_RETRY_MS 10

static int fail(struct vhd_vuf *f, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct vhd_vuf *f, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->err, sizeof(f->err), fmt, ap);
    va_end(ap);
    return rc;
}

/* Protocol names of the requests we send (vu_request_name lives in the device side). */
static const char *req_name(uint32_t req)
{
    switch (req) {
    case VHOST_USER_GET_FEATURES:
        return "GET_FEATURES";
    case VHOST_USER_SET_FEATURES:
        return "SET_FEATURES";
    case VHOST_USER_SET_OWNER:
        return "SET_OWNER";
    case VHOST_USER_SET_MEM_TABLE:
        return "SET_MEM_TABLE";
    case VHOST_USER_SET_VRING_NUM:
        return "SET_VRING_NUM";
    case VHOST_USER_SET_VRING_ADDR:
        return "SET_VRING_ADDR";
    case VHOST_USER_SET_VRING_BASE:
        return "SET_VRING_BASE";
    case VHOST_USER_GET_VRING_BASE:
        return "GET_VRING_BASE";
    case VHOST_USER_SET_VRING_KICK:
        return "SET_VRING_KICK";
    case VHOST_USER_SET_VRING_CALL:
        return "SET_VRING_CALL";
    case VHOST_USER_GET_PROTOCOL_FEATURES:
        return "GET_PROTOCOL_FEATURES";
    case VHOST_USER_SET_PROTOCOL_FEATURES:
        return "SET_PROTOCOL_FEATURES";
    case VHOST_USER_GET_QUEUE_NUM:
        return "GET_QUEUE_NUM";
    case VHOST_USER_SET_VRING_ENABLE:
        return "SET_VRING_ENABLE";
    case VHOST_USER_GET_CONFIG:
        return "GET_CONFIG";
    case VHOST_USER_GET_INFLIGHT_FD:
        return "GET_INFLIGHT_FD";
    case VHOST_USER_SET_INFLIGHT_FD:
        return "SET_INFLIGHT_FD";
    case VHOST_USER_SET_LOG_BASE:
        return "SET_LOG_BASE";
    case VHOST_USER_IOTLB_MSG:
        return "IOTLB_MSG";
    case VHOST_USER_SET_BACKEND_REQ_FD:
        return "SET_BACKEND_REQ_FD";
    default:
        return "request";
    }
}

/* Milliseconds since t0 (a vhd_now_ms() value). */
static long ms_since(uint64_t t0)
{
    return (long)(vhd_now_ms() - t0);
}

void vhd_vuf_init(struct vhd_vuf *f, int timeout_ms)
{
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->timeout_ms = timeout_ms > 0 ? timeout_ms : VHD_VUF_DEFAULT_TIMEOUT_MS;
    f->queue_num = 1;
    f->max_rings = 1;
}

void vhd_vuf_close(struct vhd_vuf *f)
{
    if (f->fd >= 0)
        close(f->fd);
    f->fd = -1;
}

const char *vhd_vuf_strerror(const struct vhd_vuf *f)
{
    return f->err;
}

bool vhd_vuf_alive(const struct vhd_vuf *f)
{
    if (f->fd < 0)
        return false;
    struct pollfd p = {.fd = f->fd, .events = POLLIN};
    /* A reply-less session has nothing to read: readable means EOF or an error. */
    if (poll(&p, 1, 0) <= 0)
        return true;
    return !(p.revents & (POLLHUP | POLLERR | POLLIN));
}

int vhd_vuf_connect(struct vhd_vuf *f, const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    uint64_t t0;
    int last = 0;

    if (strlen(path) >= sizeof(sa.sun_path))
        return fail(f, -ENAMETOOLONG, "socket path too long: %s", path);
    strcpy(sa.sun_path, path);
    vhd_vuf_close(f);
    t0 = vhd_now_ms();
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return fail(f, -errno, "socket: %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            f->fd = fd;
            f->err[0] = 0;
            return 0;
        }
        last = errno;
        close(fd);
        /* A daemon that is starting has no socket yet, or has not listen()ed. */
        if (last != ENOENT && last != ECONNREFUSED && last != EAGAIN && last != EINTR)
            return fail(f, -last, "connect %s: %s", path, strerror(last));
        if (ms_since(t0) >= f->timeout_ms)
            return fail(f, -ETIMEDOUT, "connect %s: %s (gave up after %d ms)", path, strerror(last),
                        f->timeout_ms);
        struct timespec ts = {0, CONNECT_RETRY_MS * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* The stream can no longer be trusted: drop it. Returns rc. */
static int broken(struct vhd_vuf *f, int rc)
{
    vhd_vuf_close(f);
    return rc;
}

static int send_msg(struct vhd_vuf *f, uint32_t req, uint32_t flags, const void *payload,
                    uint32_t size, const int *fds, unsigned nfds)
{
    if (f->fd < 0)
        return fail(f, -ENOTCONN, "%s: not connected", req_name(req));
    struct vu_hdr h = {.request = req, .flags = VHOST_USER_VERSION | flags, .size = size};
    int rc = vu_send(f->fd, &h, size ? payload : NULL, fds, nfds, f->timeout_ms);
    if (rc < 0)
        return broken(f, fail(f, rc, "%s: send: %s", req_name(req), strerror(-rc)));
    return 0;
}

/*
 * Receive the reply to req: the same request id, exactly version 1 plus the
 * reply flag. At most max_fds fds may come with it (GET_INFLIGHT_FD's one;
 * 0 for every other reply): more are closed and the reply refused. The
 * caller owns rx->fds on success.
 */
static int recv_reply_fds(struct vhd_vuf *f, uint32_t req, struct vu_rx *rx, unsigned max_fds)
{
    uint64_t t0;

    vu_rx_init(rx);
    t0 = vhd_now_ms();
    for (;;) {
        int rc = vu_rx_read(rx, f->fd);
        if (rc == 1)
            break;
        if (rc < 0) {
            if (rc == -ECONNRESET)
                return broken(f, fail(f, -ECONNRESET, "%s: the back-end closed the connection",
                                      req_name(req)));
            return broken(f, fail(f, rc, "%s: receive: %s", req_name(req), strerror(-rc)));
        }
        long left = f->timeout_ms - ms_since(t0);
        if (left <= 0)
            return broken(
                f, fail(f, -ETIMEDOUT, "%s: no reply within %d ms", req_name(req), f->timeout_ms));
        struct pollfd p = {.fd = f->fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
            return broken(f, fail(f, -errno, "%s: poll: %s", req_name(req), strerror(errno)));
    }
    if (rx->nfds > max_fds) {
        vu_rx_reset(rx);
        return broken(f, fail(f, -EPROTO, "%s: reply carries file descriptors", req_name(req)));
    }
    if (rx->hdr.request != req || rx->hdr.flags != (VHOST_USER_VERSION | VHOST_USER_REPLY_MASK)) {
        int rc = fail(f, -EPROTO, "%s: reply for request %u with flags 0x%x (expected 0x%x)",
                      req_name(req), rx->hdr.request, rx->hdr.flags,
                      VHOST_USER_VERSION | VHOST_USER_REPLY_MASK);
        vu_rx_reset(rx);
        return broken(f, rc);
    }
    return 0;
}

/* Receive the reply to req; no fds allowed (see recv_reply_fds). */
static int recv_reply(struct vhd_vuf *f, uint32_t req, struct vu_rx *rx)
{
    return recv_reply_fds(f, req, rx, 0);
}

/*
 * A request with a reply of exactly `size` bytes (GET_FEATURES and the like).
 * out receives the payload.
 */
static int call(struct vhd_vuf *f, uint32_t req, const void *payload, uint32_t psize, void *out,
                uint32_t size)
{
    struct vu_rx rx;
    int rc = send_msg(f, req, 0, payload, psize, NULL, 0);
    if (rc < 0)
        return rc;
    rc = recv_reply(f, req, &rx);
    if (rc < 0)
        return rc;
    if (rx.hdr.size != size)
        return broken(f, fail(f, -EPROTO, "%s: reply of %u bytes (expected %u)", req_name(req),
                              rx.hdr.size, size));
    memcpy(out, rx.payload.raw, size);
    return 0;
}

static int call_u64(struct vhd_vuf *f, uint32_t req, uint64_t *out)
{
    return call(f, req, NULL, 0, out, sizeof(*out));
}

/*
 * A request without a reply of its own. With REPLY_ACK negotiated it asks
 * for an ack (NEED_REPLY) and waits: u64 0 is success, anything else the
 * back-end's refusal (-EIO, session still usable).
 */
static int call_noreply(struct vhd_vuf *f, uint32_t req, const void *payload, uint32_t size,
                        const int *fds, unsigned nfds)
{
    bool ack = vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_REPLY_ACK);
    int rc = send_msg(f, req, ack ? VHOST_USER_NEED_REPLY_MASK : 0, payload, size, fds, nfds);
    if (rc < 0 || !ack)
        return rc;
    struct vu_rx rx;
    rc = recv_reply(f, req, &rx);
    if (rc < 0)
        return rc;
    if (rx.hdr.size != sizeof(uint64_t))
        return broken(
            f, fail(f, -EPROTO, "%s: ack of %u bytes (expected 8)", req_name(req), rx.hdr.size));
    if (rx.payload.u64 != 0)
        return fail(f, -EIO, "%s: refused by the back-end (ack %llu)", req_name(req),
                    (unsigned long long)rx.payload.u64);
    return 0;
}

int vhd_vuf_handshake(struct vhd_vuf *f, uint64_t want_proto)
{
    int rc = call_u64(f, VHOST_USER_GET_FEATURES, &f->offered);
    if (rc < 0)
        return rc;
    f->has_proto = (f->offered & BIT(VHOST_USER_F_PROTOCOL_FEATURES)) != 0;
    f->proto = 0;
    f->proto_offered = 0;
    f->queue_num = 1;
    if (f->has_proto) {
        rc = call_u64(f, VHOST_USER_GET_PROTOCOL_FEATURES, &f->proto_offered);
        if (rc < 0)
            return rc;
        uint64_t p = f->proto_offered & want_proto;
        /* Not acked yet: SET_PROTOCOL_FEATURES itself never asks for REPLY_ACK. */
        rc = send_msg(f, VHOST_USER_SET_PROTOCOL_FEATURES, 0, &p, sizeof(p), NULL, 0);
        if (rc < 0)
            return rc;
        f->proto = p;
    }
    rc = call_noreply(f, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0);
    if (rc < 0)
        return rc;
    if (vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_MQ)) {
        uint64_t n;
        rc = call_u64(f, VHOST_USER_GET_QUEUE_NUM, &n);
        if (rc < 0)
            return rc;
        if (n == 0 || n > 0xffff)
            return broken(f, fail(f, -EPROTO, "GET_QUEUE_NUM: %llu queues", (unsigned long long)n));
        f->queue_num = (uint32_t)n;
    }
    f->max_rings = f->queue_num;
    return 0;
}

int vhd_vuf_set_features(struct vhd_vuf *f, uint64_t virtio_features)
{
    uint64_t v = virtio_features & ~BIT(VHOST_USER_F_PROTOCOL_FEATURES);
    if (f->has_proto)
        v |= BIT(VHOST_USER_F_PROTOCOL_FEATURES);
    if (v & ~f->offered)
        return fail(f, -EINVAL, "SET_FEATURES: bits 0x%llx were not offered",
                    (unsigned long long)(v & ~f->offered));
    int rc = call_noreply(f, VHOST_USER_SET_FEATURES, &v, sizeof(v), NULL, 0);
    if (rc == 0)
        f->features = v;
    return rc;
}

int vhd_vuf_get_config(struct vhd_vuf *f, uint32_t offset, void *buf, uint32_t len)
{
    struct vu_config c;
    struct vu_rx rx;

    if (!vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_CONFIG))
        return fail(f, -ENOTSUP, "GET_CONFIG: the back-end does not offer the CONFIG feature");
    if (len == 0 || len > VHOST_USER_MAX_CONFIG_SIZE)
        return fail(f, -EINVAL, "GET_CONFIG: %u bytes asked", len);
    memset(&c, 0, sizeof(c));
    c.offset = offset;
    c.size = len;
    c.flags = VHOST_USER_CONFIG_FLAG_FRONTEND;
    int rc = send_msg(f, VHOST_USER_GET_CONFIG, 0, &c, VU_CONFIG_HDR_SIZE + len, NULL, 0);
    if (rc < 0)
        return rc;
    rc = recv_reply(f, VHOST_USER_GET_CONFIG, &rx);
    if (rc < 0)
        return rc;
    if (rx.hdr.size == 0)
        return fail(f, -EIO, "GET_CONFIG: the back-end cannot read %u bytes at %u", len, offset);
    if (rx.hdr.size != VU_CONFIG_HDR_SIZE + len || rx.payload.config.size != len ||
        rx.payload.config.offset != offset)
        return broken(f,
                      fail(f, -EPROTO, "GET_CONFIG: reply of %u bytes for %u at %u (expected %u)",
                           rx.hdr.size, rx.payload.config.size, rx.payload.config.offset,
                           VU_CONFIG_HDR_SIZE + len));
    memcpy(buf, rx.payload.config.region, len);
    return 0;
}

int vhd_vuf_set_mem_table(struct vhd_vuf *f, const struct vhd_guestmem *gm)
{
    struct vu_mem_table m;
    int fds[VHOST_USER_MEM_TABLE_MAX_REGIONS];

    if (gm->nregions == 0 || gm->nregions > VHOST_USER_MEM_TABLE_MAX_REGIONS)
        return fail(f, -EINVAL, "SET_MEM_TABLE: %u regions", gm->nregions);
    memset(&m, 0, sizeof(m));
    m.nregions = gm->nregions;
    for (uint32_t i = 0; i < gm->nregions; i++) {
        m.regions[i].gpa = gm->r[i].gpa;
        m.regions[i].size = gm->r[i].size;
        m.regions[i].uva = (uint64_t)(uintptr_t)gm->r[i].hva;
        m.regions[i].mmap_offset = 0;
        fds[i] = gm->r[i].fd;
    }
    return call_noreply(f, VHOST_USER_SET_MEM_TABLE, &m,
                        VU_MEM_TABLE_HDR_SIZE + gm->nregions * (uint32_t)sizeof(m.regions[0]), fds,
                        gm->nregions);
}

static int set_state(struct vhd_vuf *f, uint32_t req, uint32_t index, uint32_t num)
{
    struct vu_vring_state s = {.index = index, .num = num};
    return call_noreply(f, req, &s, sizeof(s), NULL, 0);
}

/* SET_VRING_KICK / SET_VRING_CALL: the ring index in the u64, the eventfd attached. */
static int set_vring_fd(struct vhd_vuf *f, uint32_t req, uint32_t index, int fd)
{
    uint64_t v = index & VHOST_USER_VRING_IDX_MASK;
    if (fd < 0)
        v |= VHOST_USER_VRING_NOFD_MASK;
    return call_noreply(f, req, &v, sizeof(v), fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
}

int vhd_vuf_set_backend_req_fd(struct vhd_vuf *f, int fd)
{
    if (!vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_BACKEND_REQ))
        return fail(f, -ENOTSUP, "SET_BACKEND_REQ_FD: BACKEND_REQ not negotiated");
    return call_noreply(f, VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, &fd, 1);
}

int vhd_vuf_iotlb_msg(struct vhd_vuf *f, const struct vu_iotlb *m)
{
    if (!vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_REPLY_ACK))
        return fail(f, -ENOTSUP, "IOTLB_MSG: REPLY_ACK not negotiated");
    return call_noreply(f, VHOST_USER_IOTLB_MSG, m, sizeof(*m), NULL, 0);
}

int vhd_vuf_send_rarp(struct vhd_vuf *f, const uint8_t mac[6])
{
    uint64_t v = 0;
    if (!vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_RARP))
        return fail(f, -ENOTSUP, "SEND_RARP: RARP not negotiated");
    memcpy(&v, mac, 6);
    return call_noreply(f, VHOST_USER_SEND_RARP, &v, sizeof(v), NULL, 0);
}

int vhd_vuf_ring_enable(struct vhd_vuf *f, uint32_t index, bool enable)
{
    if (!f->has_proto)
        return fail(f, -ENOTSUP, "SET_VRING_ENABLE: protocol features not negotiated");
    return set_state(f, VHOST_USER_SET_VRING_ENABLE, index, enable ? 1 : 0);
}

int vhd_vuf_ring_start(struct vhd_vuf *f, const struct vhd_vuf_ring *r)
{
    if (r->index > VHOST_USER_VRING_IDX_MASK || r->index >= f->max_rings)
        return fail(f, -EINVAL, "ring %u: the back-end has %u queues", r->index, f->max_rings);
    int rc = set_state(f, VHOST_USER_SET_VRING_NUM, r->index, r->num);
    if (rc == 0)
        rc = set_state(f, VHOST_USER_SET_VRING_BASE, r->index, r->base);
    if (rc == 0) {
        struct vu_vring_addr a = {.index = r->index,
                                  .flags = 0,
                                  .desc = r->desc,
                                  .used = r->used,
                                  .avail = r->avail,
                                  .log = 0};
        rc = call_noreply(f, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
    }
    /* The call fd first, so the ring never runs without a way to signal us. */
    if (rc == 0)
        rc = set_vring_fd(f, VHOST_USER_SET_VRING_CALL, r->index, r->call_fd);
    if (rc == 0)
        rc = set_vring_fd(f, VHOST_USER_SET_VRING_KICK, r->index, r->kick_fd);
    if (rc == 0 && f->has_proto)
        rc = vhd_vuf_ring_enable(f, r->index, true);
    if (rc < 0 && f->err[0] && strncmp(f->err, "ring ", 5)) {
        char tmp[sizeof(f->err)];
        snprintf(tmp, sizeof(tmp), "%s", f->err);
        fail(f, rc, "ring %u: %s", r->index, tmp);
    }
    return rc;
}

int vhd_vuf_ring_stop(struct vhd_vuf *f, uint32_t index, uint32_t *base)
{
    int rc = 0;
    if (f->has_proto)
        rc = vhd_vuf_ring_enable(f, index, false);
    if (rc < 0)
        return rc;
    struct vu_vring_state s = {.index = index, .num = 0}, out;
    rc = call(f, VHOST_USER_GET_VRING_BASE, &s, sizeof(s), &out, sizeof(out));
    if (rc < 0)
        return rc;
    if (out.index != index)
        return broken(
            f, fail(f, -EPROTO, "GET_VRING_BASE: reply for ring %u (asked %u)", out.index, index));
    if (base)
        *base = out.num;
    return 0;
}

int vhd_vuf_get_inflight_fd(struct vhd_vuf *f, uint16_t num_queues, uint16_t queue_size,
                            struct vhd_vuf_inflight *out)
{
    struct vu_inflight in = {.num_queues = num_queues, .queue_size = queue_size};
    struct vu_rx rx;

    if (!vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD))
        return fail(f, -ENOTSUP, "GET_INFLIGHT_FD: INFLIGHT_SHMFD not negotiated");
    int rc = send_msg(f, VHOST_USER_GET_INFLIGHT_FD, 0, &in, sizeof(in), NULL, 0);
    if (rc == 0)
        rc = recv_reply_fds(f, VHOST_USER_GET_INFLIGHT_FD, &rx, 1);
    if (rc < 0)
        return rc;
    if (rx.hdr.size != sizeof(in) || rx.nfds != 1) {
        rc = fail(f, -EPROTO, "GET_INFLIGHT_FD: reply of %u bytes with %u fds (expected %zu, 1)",
                  rx.hdr.size, rx.nfds, sizeof(in));
        vu_rx_reset(&rx);
        return broken(f, rc);
    }
    int fd = rx.fds[0];
    const struct vu_inflight *r = &rx.payload.inflight;
    /* The area is the back-end's to size; a real one is a few pages per queue. */
    if (r->mmap_size == 0 || r->mmap_size > VHD_VUF_INFLIGHT_MAX ||
        r->mmap_offset > VHD_VUF_INFLIGHT_MAX || (r->mmap_offset & 4095)) {
        close(fd);
        return fail(f, -EPROTO, "GET_INFLIGHT_FD: area of %llu bytes at offset %llu",
                    (unsigned long long)r->mmap_size, (unsigned long long)r->mmap_offset);
    }
    void *p =
        mmap(NULL, r->mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)r->mmap_offset);
    if (p == MAP_FAILED) {
        rc = -errno;
        close(fd);
        return fail(f, rc, "GET_INFLIGHT_FD: mmap of %llu bytes: %s",
                    (unsigned long long)r->mmap_size, strerror(-rc));
    }
    out->fd = fd;
    out->addr = p;
    out->mmap_size = r->mmap_size;
    out->mmap_offset = r->mmap_offset;
    out->num_queues = num_queues;
    out->queue_size = queue_size;
    return 0;
}

int vhd_vuf_set_inflight_fd(struct vhd_vuf *f, const struct vhd_vuf_inflight *in)
{
    if (!vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD))
        return fail(f, -ENOTSUP, "SET_INFLIGHT_FD: INFLIGHT_SHMFD not negotiated");
    if (in->fd < 0)
        return fail(f, -EINVAL, "SET_INFLIGHT_FD: no area");
    struct vu_inflight m = {.mmap_size = in->mmap_size,
                            .mmap_offset = in->mmap_offset,
                            .num_queues = in->num_queues,
                            .queue_size = in->queue_size};
    return call_noreply(f, VHOST_USER_SET_INFLIGHT_FD, &m, sizeof(m), &in->fd, 1);
}

void vhd_vuf_inflight_init(struct vhd_vuf_inflight *in)
{
    memset(in, 0, sizeof(*in));
    in->fd = -1;
}

void vhd_vuf_inflight_release(struct vhd_vuf_inflight *in)
{
    if (in->addr)
        munmap(in->addr, in->mmap_size);
    if (in->fd >= 0)
        close(in->fd);
    vhd_vuf_inflight_init(in);
}

/* ---- dirty logging ---- */

/* Pages per bitmap chunk (QEMU's vhost_log_chunk_t is a u64). */
#define LOG_CHUNK_PAGES 64u

int vhd_vuf_log_alloc(struct vhd_vuf_log *log, uint64_t top, const char *name)
{
    uint64_t pages = (top + 4095) / 4096;
    uint64_t size = (pages + LOG_CHUNK_PAGES - 1) / LOG_CHUNK_PAGES * sizeof(uint64_t);

    log->fd = -1;
    log->chunks = NULL;
    log->size = 0;
    if (size == 0)
        size = sizeof(uint64_t);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)size) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    log->fd = fd;
    log->chunks = p;
    log->size = size;
    return 0;
}

void vhd_vuf_log_release(struct vhd_vuf_log *log)
{
    if (log->chunks)
        munmap(log->chunks, log->size);
    if (log->fd >= 0)
        close(log->fd);
    log->chunks = NULL;
    log->fd = -1;
    log->size = 0;
}

size_t vhd_vuf_log_collect(struct vhd_vuf_log *log, uint64_t *pages, size_t max)
{
    size_t n = 0;

    for (uint64_t i = 0; i < log->size / sizeof(uint64_t); i++) {
        /* Read and clear in one step: a bit the back-end sets meanwhile is kept for later. */
        uint64_t v = __atomic_exchange_n(&log->chunks[i], 0, __ATOMIC_ACQ_REL);
        while (v) {
            unsigned b = (unsigned)__builtin_ctzll(v);
            v &= v - 1;
            if (n < max)
                pages[n] = i * LOG_CHUNK_PAGES + b;
            n++;
        }
    }
    return n;
}

int vhd_vuf_set_log_base(struct vhd_vuf *f, int fd, uint64_t size, uint64_t offset)
{
    struct vu_log l = {.size = size, .offset = offset};
    struct vu_rx rx;

    if (!vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_LOG_SHMFD))
        return fail(f, -ENOTSUP, "SET_LOG_BASE: LOG_SHMFD not negotiated");
    int rc = send_msg(f, VHOST_USER_SET_LOG_BASE, 0, &l, sizeof(l), fd >= 0 ? &fd : NULL,
                      fd >= 0 ? 1 : 0);
    if (rc == 0)
        rc = recv_reply(f, VHOST_USER_SET_LOG_BASE, &rx);
    if (rc < 0)
        return rc;
    if (rx.hdr.size != sizeof(uint64_t))
        return broken(
            f, fail(f, -EPROTO, "SET_LOG_BASE: reply of %u bytes (expected 8)", rx.hdr.size));
    if (rx.payload.u64 != 0)
        return fail(f, -EIO, "SET_LOG_BASE: refused by the back-end: %s",
                    rx.payload.u64 < 4096 ? strerror((int)rx.payload.u64) : "unknown error");
    return 0;
}

int vhd_vuf_set_log_all(struct vhd_vuf *f, bool on)
{
    uint64_t v = f->features & ~BIT(VHOST_F_LOG_ALL);
    return vhd_vuf_set_features(f, on ? v | BIT(VHOST_F_LOG_ALL) : v);
}

int vhd_vuf_ring_set_log(struct vhd_vuf *f, const struct vhd_vuf_ring *r, bool on, uint64_t log_gpa)
{
    struct vu_vring_addr a = {.index = r->index,
                              .flags = on ? 1u << VHOST_VRING_F_LOG : 0,
                              .desc = r->desc,
                              .used = r->used,
                              .avail = r->avail,
                              .log = log_gpa};
    return call_noreply(f, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
}

int vhd_vuf_sync(struct vhd_vuf *f)
{
    uint64_t v;
    if (vhd_vuf_has_proto(f, VHOST_USER_PROTOCOL_F_REPLY_ACK))
        return f->fd >= 0 ? 0 : fail(f, -ENOTCONN, "not connected");
    return call_u64(f, VHOST_USER_GET_FEATURES, &v);
}

/* ---- listening front-end (back-ends in client mode) ---- */

int vhd_vuf_accept(struct vhd_vuf *f, const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat st;
    int rc;

    if (strlen(path) >= sizeof(sa.sun_path))
        return fail(f, -ENAMETOOLONG, "socket path too long: %s", path);
    strcpy(sa.sun_path, path);
    vhd_vuf_close(f);
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return fail(f, -EEXIST, "%s: exists and is not a socket", path);
        unlink(path);
    }
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        return fail(f, -errno, "socket: %s", strerror(errno));
    if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        rc = fail(f, -errno, "bind %s: %s", path, strerror(errno));
        close(lfd);
        return rc;
    }
    if (listen(lfd, 1) < 0) {
        rc = fail(f, -errno, "listen %s: %s", path, strerror(errno));
        goto out;
    }
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    int pr;
    do
        pr = poll(&p, 1, f->timeout_ms);
    while (pr < 0 && errno == EINTR);
    if (pr <= 0) {
        rc = pr == 0 ? fail(f, -ETIMEDOUT, "%s: no back-end connected within %d ms", path,
                            f->timeout_ms)
                     : fail(f, -errno, "poll %s: %s", path, strerror(errno));
        goto out;
    }
    int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
        rc = fail(f, -errno, "accept on %s: %s", path, strerror(errno));
        goto out;
    }
    f->fd = fd;
    f->err[0] = 0;
    rc = 0;
out:
    close(lfd);
    unlink(path);
    return rc;
}
