/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The NBD block backend: an NBD server (nbd:// or nbd+unix:// URI) through
 * libnbd's asynchronous API, driven by the io_uring of the worker that
 * submits: one connection per worker, its socket polled with POLL_ADD SQEs,
 * reconnection after a lost connection on a TIMEOUT back-off, and the
 * operations the lost connection carried issued again on the new one;
 * acknowledged writes a lost connection may have taken with it are logged,
 * or with lost-writes=report reported to the next flush.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <libnbd.h>
#include <netdb.h>
#include <liburing.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blk_backend.h"
#include "util/clock.h"
#include "util/compiler.h"
#include "runtime/log.h"
#include "util/errmsg.h"

/*
 * Largest data command: NBD servers must accept 32 MiB (NBD spec, "Block
 * size constraints", the default maximum payload) unless they advertise
 * another maximum; a larger guest segment is split.
 */
#define NBD_MAX_PAYLOAD (32u << 20)
/*
 * Largest trim / write-zeroes command: the length field of an NBD request is
 * 32 bits; 1 GiB keeps every part a multiple of any block size.
 */
#define NBD_MAX_RANGE (1u << 30)
/*
 * Reconnect back-off: 10 ms after a loss, doubled per failed attempt up to
 * 1 s, so a restarting server is found within a second of coming back and
 * a dead one costs one connect attempt per second.
 */
#define NBD_BACKOFF_MIN_MS 10u
#define NBD_BACKOFF_MAX_MS 1000u
/* Control-thread bounds: the probe connection at open, the flush at close. */
#define NBD_SYNC_TIMEOUT_MS 10000

enum conn_state {
    CS_DOWN,       /* no handle: connect when work arrives */
    CS_CONNECTING, /* a handle in nbd_aio_connect_uri's handshake */
    CS_READY,      /* connected: operations are issued */
    CS_BACKOFF,    /* a connect failed: the back-off timer runs */
};

/*
 * One connection, owned by one worker (c->w): every field is that worker's.
 * The io_uring SQEs it has outstanding (poll, poll removal, timer) point at
 * the callbacks below; c->sqes counts them, and close() frees a connection
 * only when none is left.
 */
struct nbd_conn {
    struct nbd_be *nb;
    struct vhd_worker *w;
    struct nbd_handle *h; /* NULL in CS_DOWN / CS_BACKOFF */
    uint8_t state;        /* enum conn_state */
    bool ever_ready;      /* a connection was up once (later ones are reconnections) */
    bool down_logged;     /* the current outage was logged */
    bool wrote;           /* writes were issued: close() flushes */
    uint32_t gen;         /* handle generation: a poll armed for an older one is stale */
    uint32_t poll_gen;    /* generation the armed poll watches */
    uint32_t armed;       /* POLLIN / POLLOUT of the armed poll; 0: none */
    bool remove_sent;     /* a POLL_REMOVE for the armed poll is on its way */
    uint32_t sqes;        /* SQEs outstanding */
    uint32_t parts;       /* libnbd commands issued and not retired */
    uint32_t backoff_ms;
    /*
     * Durability bookkeeping (unused when the server keeps no write cache,
     * be.no_flush), in CLOCK_MONOTONIC ns: written by this worker only,
     * read by every worker of the backend when one of them loses its
     * connection (relaxed atomics: a plain 64-bit store and load).
     * wr_ns: when the last write (write, discard, write zeroes) completed
     * to the device without being durable by itself (FUA); 0: none yet.
     * flush_ns: when the last flush that succeeded was sent; flush_ready_ns:
     * when the handle it ran on had connected (stored first; flush_ns with
     * release, read with acquire, then flush_ready_ns). A flush covers every
     * write completed between the two, on any connection of the backend
     * (multi-conn; without it there is only one connection): one server
     * instance answered on that handle all along. A write completed before
     * the handle connected may have gone to a server that died since.
     */
    uint64_t wr_ns, flush_ns, flush_ready_ns;
    uint64_t ready_ns; /* when c->h connected (this worker only) */
    /*
     * ops->cancel's owner (blk: a stopping queue): its operations that come
     * back to the waiting list complete with -ECANCELED instead, until it
     * submits again. NULL: none. One is enough: the control thread stops
     * queues one after another, each stop waiting for all its requests.
     */
    const void *cancel_owner;
    struct vhd_io_cb poll_cb, remove_cb, timer_cb;
    struct __kernel_timespec ts;
    struct vhd_blk_io *wait_head, *wait_tail; /* to issue once connected */
    struct vhd_blk_io *done_head, *done_tail; /* retired inside libnbd: finished after it returns */
};

struct nbd_be {
    struct vhd_blk_backend be; /* first: the common head */
    char *uri;
    bool can_fua;         /* NBD_CMD_FLAG_FUA: a write durable at completion */
    bool report_lost;     /* lost-writes=report: a loss fails the next flush (else logged) */
    uint32_t max_payload; /* largest read / write command */
    /*
     * A connection was lost while the server held writes it had acknowledged
     * and no flush had covered (nbd_conn.wr_ns): the server may have lost
     * them (a restart, a crash). With report_lost, the next flush that
     * succeeds on the storage reports -EIO instead, once: set by any worker
     * (relaxed store), taken
     * with an exchange by the worker whose flush reports it (the only atomic
     * read-modify-write, and only after a loss).
     */
    int lost_writes;
    /* When the last loss check ran (CLOCK_MONOTONIC ns): writes before it are accounted for. */
    uint64_t checked_ns;
    /*
     * Connections by worker index; slot i is written by worker i only (slot 0
     * by whichever worker owns the single connection without multi-conn),
     * and by the control thread at close when no worker uses them.
     */
    struct nbd_conn *conns[VHD_RT_MAX_WORKERS];
};

static void conn_drive(struct nbd_conn *c);

static struct nbd_be *to_nb(struct vhd_blk_backend *be)
{
    return vhd_container_of(be, struct nbd_be, be);
}

/* A libnbd error in a sentence (libnbd keeps it per thread). */
static const char *nbd_msg(void)
{
    const char *m = nbd_get_error();
    return m ? m : "unknown error";
}

/* ---- the probe connection (open: the opening thread) and the final flush (close: control) ---- */

/*
 * Run h's state machine until done(h) says so, the handle dies, or
 * NBD_SYNC_TIMEOUT_MS pass. Returns 0, -ETIMEDOUT, or -EIO (dead). Blocks
 * the calling thread: only open() and close() use it.
 */
static int sync_run(struct nbd_handle *h, int64_t cookie, bool connecting)
{
    uint64_t deadline = vhd_now_ms() + NBD_SYNC_TIMEOUT_MS;

    for (;;) {
        if (nbd_aio_is_dead(h) || nbd_aio_is_closed(h))
            return -EIO;
        if (connecting && nbd_aio_is_ready(h))
            return 0;
        if (!connecting) {
            int r = nbd_aio_command_completed(h, cookie); /* 1 done, -1 failed, 0 in flight */
            if (r != 0)
                return r > 0 ? 0 : -EIO;
        }
        uint64_t t = vhd_now_ms();
        if (t >= deadline)
            return -ETIMEDOUT;
        unsigned dir = nbd_aio_get_direction(h);
        struct pollfd p = {.fd = nbd_aio_get_fd(h), .events = 0};
        if (p.fd < 0)
            return -EIO;
        if (dir & LIBNBD_AIO_DIRECTION_READ)
            p.events |= POLLIN;
        if (dir & LIBNBD_AIO_DIRECTION_WRITE)
            p.events |= POLLOUT;
        int n = poll(&p, 1, (int)(deadline - t));
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n <= 0)
            continue;
        if ((p.revents & (POLLIN | POLLHUP | POLLERR)) &&
            (nbd_aio_get_direction(h) & LIBNBD_AIO_DIRECTION_READ))
            nbd_aio_notify_read(h);
        if ((p.revents & (POLLOUT | POLLHUP | POLLERR)) &&
            (nbd_aio_get_direction(h) & LIBNBD_AIO_DIRECTION_WRITE))
            nbd_aio_notify_write(h);
    }
}

/*
 * The URI workers connect to: for nbd://HOST..., HOST resolved to an address
 * now, on the thread that opens the device. libnbd resolves the host at every
 * connect, which on a worker would block it on DNS and, under the sandbox,
 * cannot open /etc/hosts or resolv.conf at all. Other URIs (nbd+unix,
 * addresses, TLS where the certificate names the host) are kept as they are.
 * Returns 0 and a malloc'ed *out, or -errno with a message.
 */
static int uri_resolve(const char *uri, char **out, char *err, size_t errlen)
{
    static const char scheme[] = "nbd://";
    char host[256], addr[INET6_ADDRSTRLEN];
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST}, *ai;

    *out = NULL;
    if (strncmp(uri, scheme, sizeof(scheme) - 1) != 0 || uri[sizeof(scheme) - 1] == '[')
        goto keep; /* not plain TCP, or an IPv6 address */
    const char *h = uri + sizeof(scheme) - 1;
    size_t n = strcspn(h, ":/?#@");
    if (h[n] == '@' || n >= sizeof(host))
        goto keep; /* user info, or not a host name */
    memcpy(host, n ? h : "localhost", n ? n : 9);
    host[n ? n : 9] = '\0';
    if (getaddrinfo(host, NULL, &hints, &ai) == 0) {
        freeaddrinfo(ai);
        goto keep; /* already an address */
    }
    hints.ai_flags = AI_ADDRCONFIG;
    int rc = getaddrinfo(host, NULL, &hints, &ai);
    if (rc != 0)
        return vhd_errf(err, errlen, -EINVAL, "nbd: %s: cannot resolve %s: %s", uri, host,
                        gai_strerror(rc));
    const void *a = ai->ai_family == AF_INET6
                        ? (const void *)&((struct sockaddr_in6 *)(void *)ai->ai_addr)->sin6_addr
                        : (const void *)&((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr;
    bool v6 = ai->ai_family == AF_INET6;
    const char *ok = inet_ntop(ai->ai_family, a, addr, sizeof(addr));
    freeaddrinfo(ai);
    if (!ok)
        return vhd_errf(err, errlen, -EINVAL, "nbd: %s: cannot print the address of %s", uri, host);
    size_t len = strlen(uri) + sizeof(addr) + 4;
    *out = malloc(len);
    if (!*out)
        return vhd_errf(err, errlen, -ENOMEM, "out of memory");
    snprintf(*out, len, "%s%s%s%s%s", scheme, v6 ? "[" : "", addr, v6 ? "]" : "", h + n);
    vhd_log(VHD_LOG_INFO, "nbd: %s: %s is %s (connections go to this address)", uri, host, addr);
    return 0;
keep:
    *out = strdup(uri);
    return *out ? 0 : vhd_errf(err, errlen, -ENOMEM, "out of memory");
}

/* A new handle for uri, connecting (asynchronously). NULL with the reason in libnbd's error. */
static struct nbd_handle *handle_start(const char *uri)
{
    struct nbd_handle *h = nbd_create();
    if (!h)
        return NULL;
    /*
     * A failed read leaves the guest's buffer unspecified, and the guest
     * gets IOERR for it: no need to pay a memset on every read.
     */
    nbd_set_pread_initialize(h, false);
    if (nbd_aio_connect_uri(h, uri) < 0) {
        nbd_close(h);
        return NULL;
    }
    return h;
}

static int nbd_open(const struct vhd_blk_backend_opts *o, struct vhd_blk_backend **out, char *err,
                    size_t errlen)
{
    struct nbd_be *nb;
    struct nbd_handle *h;
    int64_t size;
    int rc;

    if (!o->uri || !o->uri[0])
        return vhd_errf(err, errlen, -EINVAL, "the nbd backend needs uri=");
    if (o->image)
        return vhd_errf(err, errlen, -EINVAL, "the nbd backend takes uri=, not image=");

    /*
     * The probe: size and capabilities come from the server now, so the
     * device's config space and features are known before any front-end
     * connects. It blocks its caller for at most NBD_SYNC_TIMEOUT_MS: the
     * main thread at start-up, before the control loop runs, or the open
     * thread of a device added at runtime (vhd_blk_device_open).
     */
    char *uri;
    rc = uri_resolve(o->uri, &uri, err, errlen);
    if (rc < 0)
        return rc;
    h = nbd_create();
    if (!h) {
        free(uri);
        return vhd_errf(err, errlen, -ENOMEM, "nbd: %s", nbd_msg());
    }
    if (nbd_aio_connect_uri(h, uri) < 0) {
        rc = vhd_errf(err, errlen, -EINVAL, "nbd: cannot connect to %s: %s", o->uri, nbd_msg());
        goto err_close;
    }
    rc = sync_run(h, 0, true);
    if (rc < 0) {
        rc = vhd_errf(err, errlen, rc == -ETIMEDOUT ? -ETIMEDOUT : -ECONNREFUSED,
                      "nbd: cannot connect to %s: %s", o->uri,
                      rc == -ETIMEDOUT ? "timed out" : nbd_msg());
        goto err_close;
    }
    size = nbd_get_size(h);
    if (size < 0) {
        rc = vhd_errf(err, errlen, -EIO, "nbd: %s: no export size: %s", o->uri, nbd_msg());
        goto err_close;
    }
    if (o->size && (uint64_t)size != o->size) {
        rc = vhd_errf(err, errlen, -EINVAL, "nbd: %s has %lld bytes, not the %llu requested",
                      o->uri, (long long)size, (unsigned long long)o->size);
        goto err_close;
    }

    nb = calloc(1, sizeof(*nb));
    if (!nb) {
        rc = vhd_errf(err, errlen, -ENOMEM, "out of memory");
        goto err_close;
    }
    nb->uri = uri;
    nb->report_lost = o->report_lost_writes;
    uri = NULL;
    nb->be.ops = &vhd_blk_backend_nbd;
    nb->be.size = (uint64_t)size;
    nb->be.ro = o->ro || nbd_is_read_only(h) == 1;
    nb->be.no_flush = nbd_can_flush(h) != 1;
    nb->be.no_discard = nbd_can_trim(h) != 1;
    nb->be.no_write_zeroes = nbd_can_zero(h) != 1;
    nb->be.single_conn = nbd_can_multi_conn(h) != 1;
    nb->be.zeroes_may_unmap = !nb->be.no_write_zeroes; /* without NO_HOLE, zero may punch */
    nb->can_fua = nbd_can_fua(h) == 1;
    int64_t pref = nbd_get_block_size(h, LIBNBD_SIZE_PREFERRED);
    if (pref >= 512 && pref <= 65536 && !(pref & (pref - 1)) && (uint64_t)pref >= o->block_size)
        nb->be.phys_block_size = (uint32_t)pref;
    int64_t max = nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);
    nb->max_payload = NBD_MAX_PAYLOAD;
    if (max >= 4096 && max < NBD_MAX_PAYLOAD)
        nb->max_payload = (uint32_t)max & ~4095u; /* whole 4 KiB blocks: any block size fits */
    snprintf(nb->be.desc, sizeof(nb->be.desc), "nbd %s%s%s", o->uri,
             nb->be.single_conn ? " (one connection)" : " (multi-conn)",
             nb->be.ro && !o->ro ? " (read-only export)" : "");
    nbd_close(h);
    *out = &nb->be;
    return 0;

err_close:
    nbd_close(h);
    free(uri);
    return rc;
}

/* Flush h (bounded). 0 or -errno. */
static int flush_sync(struct nbd_handle *h)
{
    int64_t cookie = nbd_aio_flush(h, NBD_NULL_COMPLETION, 0);
    return cookie < 0 ? -EIO : sync_run(h, cookie, false);
}

/*
 * Writes went through c and were acknowledged: make them durable before we
 * go. On c's connection; when that one is gone (the server restarted while
 * the device was idle), on a new one: the restarted server's flush covers
 * what it holds. Control thread (close), bounded by NBD_SYNC_TIMEOUT_MS per
 * step. 0, or -errno (logged).
 */
static int final_flush(struct nbd_be *nb, struct nbd_conn *c)
{
    struct nbd_handle *h;
    int rc = -EIO;

    if (c->h && c->state == CS_READY && !nbd_aio_is_dead(c->h) && flush_sync(c->h) == 0)
        return 0;
    h = handle_start(nb->uri);
    if (h) {
        rc = sync_run(h, 0, true);
        if (rc == 0)
            rc = flush_sync(h);
        nbd_close(h);
    }
    if (rc < 0)
        vhd_log(VHD_LOG_ERROR, "%s: final flush failed: %s", nb->be.desc,
                rc == -ETIMEDOUT ? "timed out" : nbd_msg());
    return rc;
}

static void nbd_be_close(struct vhd_blk_backend *be)
{
    struct nbd_be *nb = to_nb(be);
    bool server_failed = false; /* one bounded wait per close, not one per connection */

    if (__atomic_load_n(&nb->lost_writes, __ATOMIC_RELAXED))
        vhd_log(VHD_LOG_ERROR,
                "%s: writes the server acknowledged before a lost connection, and no flush "
                "covered, may be lost; no flush reported it",
                be->desc);

    for (unsigned i = 0; i < VHD_RT_MAX_WORKERS; i++) {
        struct nbd_conn *c = nb->conns[i];
        if (!c)
            continue;
        if (c->sqes || c->parts || c->wait_head || c->done_head) {
            /*
             * Cannot happen (the contract: nothing in flight); survive it.
             * An SQE still points at c: leak it rather than free it.
             */
            vhd_log(VHD_LOG_ERROR, "%s: closed with operations in flight: connection leaked",
                    be->desc);
            continue;
        }
        if (c->wrote && !be->no_flush && !server_failed)
            server_failed = final_flush(nb, c) < 0;
        if (c->h) {
            /* NBD_CMD_DISC, best effort: the server may drop the connection already. */
            nbd_aio_disconnect(c->h, 0);
            nbd_close(c->h);
        }
        free(c);
    }
    free(nb->uri);
    free(nb);
}

/* ---- worker: lists ---- */

static void list_add(struct vhd_blk_io **head, struct vhd_blk_io **tail, struct vhd_blk_io *io)
{
    io->next = NULL;
    if (*tail)
        (*tail)->next = io;
    else
        *head = io;
    *tail = io;
}

static struct vhd_blk_io *list_pop(struct vhd_blk_io **head, struct vhd_blk_io **tail)
{
    struct vhd_blk_io *io = *head;
    if (io) {
        *head = io->next;
        if (!*head)
            *tail = NULL;
        io->next = NULL;
    }
    return io;
}

/* ---- worker: libnbd callbacks (inside libnbd, its handle lock held: no nbd_* calls) ---- */

/*
 * Errors that mean "the connection went away", not "the server failed this
 * command": libnbd retires a dead connection's commands with ENOTCONN, and
 * a server that is shutting down answers ESHUTDOWN (NBD spec). The command
 * is issued again on the next connection.
 */
static bool conn_error(int e)
{
    return e == ENOTCONN || e == ESHUTDOWN || e == ECONNRESET || e == EPIPE;
}

static int part_done(void *user_data, int *error)
{
    struct vhd_blk_io *io = user_data;

    if (*error) {
        if (conn_error(*error))
            io->lost = true;
        else if (!io->res)
            io->res = -*error;
    }
    return 1; /* retire the command */
}

/* Called exactly once per command, after part_done or when issuing failed. */
static void part_free(void *user_data)
{
    struct vhd_blk_io *io = user_data;
    struct nbd_conn *c = io->conn;

    c->parts--;
    if (--io->parts == 0)
        list_add(&c->done_head, &c->done_tail, io);
}

/* ---- worker: issuing ---- */

enum part_kind { P_READ, P_WRITE, P_FLUSH, P_TRIM, P_ZERO };

/* Issue one command of io on c->h. A failure to issue retires it at once (part_free). */
static void issue_part(struct nbd_conn *c, struct vhd_blk_io *io, enum part_kind k, void *buf,
                       uint64_t len, uint64_t off, uint32_t flags)
{
    nbd_completion_callback cb = {.callback = part_done, .user_data = io, .free = part_free};
    int64_t cookie = -1;

    c->parts++;
    io->parts++;
    switch (k) {
    case P_READ:
        cookie = nbd_aio_pread(c->h, buf, len, off, cb, 0);
        break;
    case P_WRITE:
        cookie = nbd_aio_pwrite(c->h, buf, len, off, cb, flags);
        break;
    case P_FLUSH:
        cookie = nbd_aio_flush(c->h, cb, 0);
        break;
    case P_TRIM:
        cookie = nbd_aio_trim(c->h, len, off, cb, 0);
        break;
    case P_ZERO:
        cookie = nbd_aio_zero(c->h, len, off, cb, flags);
        break;
    }
    if (cookie < 0) {
        int e = nbd_get_errno();
        /* Not issued: either the connection is gone (issue again later) or libnbd refused it. */
        if (nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h) || conn_error(e)) {
            io->lost = true;
        } else if (!io->res) {
            VHD_LOG_RL(VHD_LOG_WARN, "%s: command refused by libnbd: %s", c->nb->be.desc,
                       nbd_msg());
            io->res = -EIO;
        }
    }
}

/* Split [off, off + len) into commands of at most max bytes. */
static void issue_range(struct nbd_conn *c, struct vhd_blk_io *io, enum part_kind k, uint8_t *buf,
                        uint64_t len, uint64_t off, uint32_t flags, uint64_t max)
{
    while (len) {
        uint64_t n = len < max ? len : max;
        issue_part(c, io, k, buf, n, off, flags);
        if (buf)
            buf += n;
        off += n;
        len -= n;
    }
}

/*
 * Issue io (its current stage: 0 the operation, 1 the flush that follows a
 * durable write when the server has no FUA). One guard part keeps io from
 * retiring while its commands are being issued.
 */
static void issue(struct nbd_conn *c, struct vhd_blk_io *io)
{
    struct nbd_be *nb = c->nb;

    io->lost = false;
    io->res = 0;
    io->parts = 1;
    if (io->stage == 1 || io->op == VHD_BLK_IO_FLUSH)
        io->issued_ns = vhd_now_ns(); /* it covers the writes completed before now */
    if (io->stage == 1) {
        issue_part(c, io, P_FLUSH, NULL, 0, 0, 0);
    } else {
        switch (io->op) {
        case VHD_BLK_IO_READ:
        case VHD_BLK_IO_WRITE: {
            bool w = io->op == VHD_BLK_IO_WRITE;
            uint32_t fl =
                w && (io->flags & VHD_BLK_IO_F_DSYNC) && nb->can_fua ? LIBNBD_CMD_FLAG_FUA : 0;
            uint64_t off = io->offset;
            for (uint32_t i = 0; i < io->iovcnt; i++) {
                issue_range(c, io, w ? P_WRITE : P_READ, io->iov[i].iov_base, io->iov[i].iov_len,
                            off, fl, nb->max_payload);
                off += io->iov[i].iov_len;
            }
            c->wrote |= w;
            break;
        }
        case VHD_BLK_IO_FLUSH:
            issue_part(c, io, P_FLUSH, NULL, 0, 0, 0);
            break;
        case VHD_BLK_IO_DISCARD:
            issue_range(c, io, P_TRIM, NULL, io->len, io->offset, 0, NBD_MAX_RANGE);
            c->wrote = true;
            break;
        case VHD_BLK_IO_WRITE_ZEROES:
            issue_range(c, io, P_ZERO, NULL, io->len, io->offset,
                        (io->flags & VHD_BLK_IO_F_UNMAP) ? 0 : LIBNBD_CMD_FLAG_NO_HOLE,
                        NBD_MAX_RANGE);
            c->wrote = true;
            break;
        }
    }
    if (--io->parts == 0)
        list_add(&c->done_head, &c->done_tail, io);
}

/*
 * A flush of io succeeded on c's current handle (one issued on an earlier
 * handle was lost with it and issued again): publish what it covers.
 */
static void flush_done(struct nbd_conn *c, const struct vhd_blk_io *io)
{
    if (io->issued_ns <= c->flush_ns)
        return;
    __atomic_store_n(&c->flush_ready_ns, c->ready_ns, __ATOMIC_RELAXED);
    __atomic_store_n(&c->flush_ns, io->issued_ns, __ATOMIC_RELEASE);
}

/*
 * io completes successfully: keep the durability bookkeeping (nbd_conn.wr_ns,
 * flush_ns) and report a loss to a flush. Returns the result for the device.
 */
static int done_ok(struct nbd_conn *c, struct vhd_blk_io *io)
{
    struct nbd_be *nb = c->nb;

    if (nb->be.no_flush || io->op == VHD_BLK_IO_READ)
        return 0; /* writes are durable when acknowledged; reads change nothing */
    if (io->op == VHD_BLK_IO_FLUSH) {
        flush_done(c, io);
        if (vhd_unlikely(__atomic_load_n(&nb->lost_writes, __ATOMIC_RELAXED)) &&
            __atomic_exchange_n(&nb->lost_writes, 0, __ATOMIC_RELAXED)) {
            vhd_log(VHD_LOG_ERROR,
                    "%s: flush fails: writes acknowledged before the connection was lost may "
                    "not be on the server's storage",
                    nb->be.desc);
            return -EIO;
        }
        return 0;
    }
    if (io->op == VHD_BLK_IO_WRITE && (io->flags & VHD_BLK_IO_F_DSYNC)) {
        /* Durable by itself (FUA, or its own flush, which covers earlier writes too). */
        if (io->stage == 1)
            flush_done(c, io);
        return 0;
    }
    __atomic_store_n(&c->wr_ns, vhd_now_ns(), __ATOMIC_RELAXED);
    return 0;
}

/*
 * c's connection is lost (c->h was ready). If some connection of the backend
 * completed a write (after the last check) that no successful flush covered
 * (nbd_conn.flush_ns), the server may have lost it: with lost-writes=report
 * the next flush reports it (nbd_be.lost_writes), else it is logged. The guest's data is no longer
 * ours to write again: the write completed. Any connection's loss counts for all: a restarted
 * server drops every connection's unflushed writes, and a connection that
 * was idle notices only at its next command. Worker (c's).
 */
static void loss_check(struct nbd_conn *c)
{
    struct nbd_be *nb = c->nb;
    uint64_t checked = __atomic_load_n(&nb->checked_ns, __ATOMIC_RELAXED);
    bool lost = false;

    if (nb->be.no_flush)
        return;
    /* Quadratic in the connections, at most VHD_RT_MAX_WORKERS: only when one is lost. */
    for (unsigned i = 0; i < VHD_RT_MAX_WORKERS && !lost; i++) {
        struct nbd_conn *y = __atomic_load_n(&nb->conns[i], __ATOMIC_ACQUIRE);
        uint64_t w = y ? __atomic_load_n(&y->wr_ns, __ATOMIC_RELAXED) : 0;
        if (!w || w < checked)
            continue; /* no write, or accounted for by an earlier check */
        bool covered = false;
        for (unsigned k = 0; k < VHD_RT_MAX_WORKERS && !covered; k++) {
            struct nbd_conn *x = __atomic_load_n(&nb->conns[k], __ATOMIC_ACQUIRE);
            if (!x)
                continue;
            uint64_t f = __atomic_load_n(&x->flush_ns, __ATOMIC_ACQUIRE);
            uint64_t r = __atomic_load_n(&x->flush_ready_ns, __ATOMIC_RELAXED);
            covered = r <= w && w < f;
        }
        lost = !covered;
    }
    __atomic_store_n(&nb->checked_ns, vhd_now_ns(), __ATOMIC_RELAXED);
    if (lost && nb->report_lost) {
        __atomic_store_n(&nb->lost_writes, 1, __ATOMIC_RELAXED);
        vhd_log(VHD_LOG_ERROR,
                "%s: connection lost with acknowledged writes no flush covered: the server may "
                "have lost them; the next flush fails",
                nb->be.desc);
    } else if (lost) {
        /* lost-writes=ignore (default, as QEMU's NBD client): a server that kept its data lost
         * nothing. */
        vhd_log(VHD_LOG_INFO,
                "%s: connection lost with acknowledged writes no flush covered (lost-writes=report "
                "would fail the next flush)",
                nb->be.desc);
    }
}

/*
 * An attempt of io retired: issue it again when a part went down with its
 * connection (a read reads again, a write writes the same data again: both
 * are idempotent), go on to the flush stage of a durable write without FUA,
 * or complete it.
 */
static void finish(struct nbd_conn *c, struct vhd_blk_io *io)
{
    if (io->lost) {
        io->stage = 0; /* the old server may have lost an unflushed write: write it again */
        if (vhd_unlikely(c->cancel_owner && io->owner == c->cancel_owner)) {
            io->complete(io, -ECANCELED); /* its queue stops: it cannot wait (ops->cancel) */
            return;
        }
        list_add(&c->wait_head, &c->wait_tail, io);
        return;
    }
    if (io->res) {
        VHD_LOG_RL(VHD_LOG_WARN, "%s: server failed an operation (op %u, offset %llu): %s",
                   c->nb->be.desc, io->op, (unsigned long long)io->offset, strerror(-io->res));
        /*
         * The server's errno as libnbd maps it, not a flat EIO: the device's
         * error policy tells ENOSPC (werror=enospc pauses) from the rest.
         */
        io->complete(io, io->res);
        return;
    }
    if (io->stage == 0 && io->op == VHD_BLK_IO_WRITE && (io->flags & VHD_BLK_IO_F_DSYNC) &&
        !c->nb->can_fua && !c->nb->be.no_flush) {
        io->stage = 1;
        list_add(&c->wait_head, &c->wait_tail, io);
        return;
    }
    io->complete(io, done_ok(c, io));
}

/* ---- worker: io_uring SQEs (poll, poll removal, back-off timer) ---- */

static void conn_arm(struct nbd_conn *c)
{
    uint32_t want = 0;

    if (c->h && (c->parts || c->state == CS_CONNECTING)) {
        unsigned dir = nbd_aio_get_direction(c->h);
        if (dir & LIBNBD_AIO_DIRECTION_READ)
            want |= POLLIN;
        if (dir & LIBNBD_AIO_DIRECTION_WRITE)
            want |= POLLOUT;
    }
    if (c->armed) {
        /* Armed for the wrong thing (another handle, a direction it lacks, nothing wanted)? */
        bool stale = c->poll_gen != c->gen || !want || (want & ~c->armed);
        if (stale && !c->remove_sent) {
            struct io_uring_sqe *sqe = vhd_worker_get_sqe(c->w);
            if (!sqe) {
                VHD_LOG_RL(VHD_LOG_WARN, "%s: io_uring full: poll not updated", c->nb->be.desc);
                return;
            }
            io_uring_prep_poll_remove(sqe, (uint64_t)(uintptr_t)&c->poll_cb);
            io_uring_sqe_set_data(sqe, &c->remove_cb);
            c->sqes++;
            c->remove_sent = true;
        }
        return; /* the poll's CQE (revents or -ECANCELED) re-arms */
    }
    if (!want)
        return;
    int fd = nbd_aio_get_fd(c->h);
    struct io_uring_sqe *sqe = fd >= 0 ? vhd_worker_get_sqe(c->w) : NULL;
    if (!sqe) {
        /*
         * The kernel takes no SQE right now (vhd_worker_get_sqe: practically
         * never): the next submit or completion on this worker tries again.
         */
        VHD_LOG_RL(VHD_LOG_WARN, "%s: cannot poll the connection (fd %d, io_uring full)",
                   c->nb->be.desc, fd);
        return;
    }
    io_uring_prep_poll_add(sqe, fd, want);
    io_uring_sqe_set_data(sqe, &c->poll_cb);
    c->sqes++;
    c->armed = want;
    c->poll_gen = c->gen;
}

static void poll_done(struct vhd_io_cb *cb, int res)
{
    struct nbd_conn *c = vhd_container_of(cb, struct nbd_conn, poll_cb);
    bool current = c->poll_gen == c->gen && c->h;

    c->sqes--;
    c->armed = 0;
    c->remove_sent = false;
    if (current && res > 0) {
        if ((res & (POLLIN | POLLHUP | POLLERR)) &&
            (nbd_aio_get_direction(c->h) & LIBNBD_AIO_DIRECTION_READ))
            nbd_aio_notify_read(c->h);
        if ((res & (POLLOUT | POLLHUP | POLLERR)) &&
            (nbd_aio_get_direction(c->h) & LIBNBD_AIO_DIRECTION_WRITE))
            nbd_aio_notify_write(c->h);
    }
    conn_drive(c);
}

static void remove_done(struct vhd_io_cb *cb, int res)
{
    struct nbd_conn *c = vhd_container_of(cb, struct nbd_conn, remove_cb);
    (void)res; /* -ENOENT: the poll had completed already; its CQE does the work */
    c->sqes--;
}

static void timer_done(struct vhd_io_cb *cb, int res)
{
    struct nbd_conn *c = vhd_container_of(cb, struct nbd_conn, timer_cb);
    (void)res; /* -ETIME: expired */
    c->sqes--;
    c->state = CS_DOWN;
    conn_drive(c);
}

/* A connect failed or a connection died: close the handle, wait, try again. */
static void conn_down(struct nbd_conn *c, const char *why)
{
    if (!c->down_logged) {
        vhd_log(VHD_LOG_WARN, "%s: %s: %s; reconnecting (operations wait, none fails)",
                c->nb->be.desc, why, nbd_msg());
        c->down_logged = true;
    }
    if (c->state == CS_READY)
        loss_check(c);
    if (c->h) {
        /* Commands still on it are retired with ENOTCONN: back to the waiting list (finish). */
        nbd_close(c->h);
        c->h = NULL;
        c->gen++;
    }
    c->state = CS_BACKOFF;
    c->backoff_ms = c->backoff_ms ? c->backoff_ms * 2 : NBD_BACKOFF_MIN_MS;
    if (c->backoff_ms > NBD_BACKOFF_MAX_MS)
        c->backoff_ms = NBD_BACKOFF_MAX_MS;
    struct io_uring_sqe *sqe = vhd_worker_get_sqe(c->w);
    if (!sqe) {
        /* No timer: the next completion or submit on this worker retries (CS_DOWN). */
        VHD_LOG_RL(VHD_LOG_WARN, "%s: io_uring full: reconnect not timed", c->nb->be.desc);
        c->state = CS_DOWN;
        return;
    }
    c->ts.tv_sec = c->backoff_ms / 1000u;
    c->ts.tv_nsec = (long long)(c->backoff_ms % 1000u) * 1000000;
    io_uring_prep_timeout(sqe, &c->ts, 0, 0);
    io_uring_sqe_set_data(sqe, &c->timer_cb);
    c->sqes++;
}

/*
 * Make progress after anything happened on c: finish retired operations,
 * follow the handle's state (connected, dead), issue what waits, connect
 * when work waits and no connection is there, then poll for what the
 * handle wants next. Loops until nothing changes (bounded: each round
 * either empties a list or changes the state).
 */
static void conn_drive(struct nbd_conn *c)
{
    for (unsigned round = 0; round < 64; round++) {
        struct vhd_blk_io *io;
        while ((io = list_pop(&c->done_head, &c->done_tail)) != NULL)
            finish(c, io);

        if (c->state == CS_CONNECTING) {
            if (nbd_aio_is_ready(c->h)) {
                int64_t size = nbd_get_size(c->h);
                if (size >= 0 && (uint64_t)size != c->nb->be.size)
                    vhd_log(VHD_LOG_WARN, "%s: the export now has %lld bytes (was %llu)",
                            c->nb->be.desc, (long long)size, (unsigned long long)c->nb->be.size);
                if (c->ever_ready)
                    vhd_log(VHD_LOG_INFO, "%s: reconnected", c->nb->be.desc);
                c->state = CS_READY;
                c->ready_ns = vhd_now_ns();
                c->ever_ready = true;
                c->down_logged = false;
                c->backoff_ms = 0;
            } else if (nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h)) {
                conn_down(c, "cannot connect");
                continue;
            }
        } else if (c->state == CS_READY && (nbd_aio_is_dead(c->h) || nbd_aio_is_closed(c->h))) {
            conn_down(c, "connection lost");
            continue;
        }

        if (c->state == CS_READY && c->wait_head) {
            while ((io = list_pop(&c->wait_head, &c->wait_tail)) != NULL)
                issue(c, io);
            continue;
        }
        if (c->state == CS_DOWN && c->wait_head) {
            c->h = handle_start(c->nb->uri);
            if (!c->h) {
                conn_down(c, "cannot connect");
                continue;
            }
            c->gen++;
            c->state = CS_CONNECTING;
            continue;
        }
        break;
    }
    conn_arm(c);
}

/* ---- worker: submit ---- */

static struct nbd_conn *conn_get(struct nbd_be *nb, struct vhd_worker *w)
{
    unsigned i = nb->be.single_conn ? 0 : vhd_worker_index(w);
    struct nbd_conn *c;

    if (vhd_unlikely(i >= VHD_RT_MAX_WORKERS))
        return NULL;
    c = nb->conns[i];
    if (c) {
        if (vhd_likely(c->w == w))
            return c;
        /*
         * One connection, and its queue moved to another worker: the
         * previous owner let go of the queue with nothing in flight
         * (vhd_rt_detach), and the attach that followed orders its writes
         * before ours. A busy connection cannot change hands.
         */
        if (c->sqes || c->parts || c->wait_head || c->done_head)
            return NULL;
        c->w = w;
        return c;
    }
    c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->nb = nb;
    c->w = w;
    c->state = CS_DOWN;
    c->poll_cb.done = poll_done;
    c->remove_cb.done = remove_done;
    c->timer_cb.done = timer_done;
    /* Release: other workers' loss_check reads c's fields through this pointer. */
    __atomic_store_n(&nb->conns[i], c, __ATOMIC_RELEASE);
    return c;
}

static void nbd_submit(struct vhd_blk_backend *be, struct vhd_worker *w, struct vhd_blk_io *io)
{
    struct nbd_be *nb = to_nb(be);
    struct nbd_conn *c;

    io->be = be;
    io->worker = w;
    io->stage = 0;
    switch (io->op) {
    case VHD_BLK_IO_READ:
        break;
    case VHD_BLK_IO_WRITE:
    case VHD_BLK_IO_DISCARD:
    case VHD_BLK_IO_WRITE_ZEROES:
        if (be->ro) {
            io->complete(io, -EROFS); /* blk.c never sends these to a read-only device */
            return;
        }
        if ((io->op == VHD_BLK_IO_DISCARD && be->no_discard) ||
            (io->op == VHD_BLK_IO_WRITE_ZEROES && be->no_write_zeroes)) {
            io->complete(io, -EOPNOTSUPP); /* not offered, so not sent */
            return;
        }
        break;
    case VHD_BLK_IO_FLUSH:
        if (be->no_flush) {
            io->complete(io, 0); /* the server keeps no volatile cache */
            return;
        }
        break;
    default:
        io->complete(io, -EOPNOTSUPP);
        return;
    }
    c = conn_get(nb, w);
    if (vhd_unlikely(!c)) {
        VHD_LOG_RL(VHD_LOG_ERROR,
                   "%s: no connection for this worker (out of memory, or the "
                   "single connection is busy on another worker)",
                   be->desc);
        io->complete(io, -EIO);
        return;
    }
    io->conn = c;
    if (vhd_unlikely(c->cancel_owner) && io->owner == c->cancel_owner)
        c->cancel_owner = NULL; /* its queue runs again */
    list_add(&c->wait_head, &c->wait_tail, io);
    conn_drive(c);
}

/*
 * ops->cancel: operations of owner waiting for a connection on w's complete
 * with -ECANCELED now (blk: IOERR), so a ring stop during an outage need not
 * wait for the server; the ones on the wire stay (they complete, or come
 * back when their connection dies and are cancelled then: finish). The
 * connection keeps reconnecting for the other owners' operations, or waits
 * for the next submit. Worker w.
 */
static void nbd_cancel(struct vhd_blk_backend *be, struct vhd_worker *w, const void *owner)
{
    struct nbd_be *nb = to_nb(be);
    unsigned i = be->single_conn ? 0 : vhd_worker_index(w);
    struct vhd_blk_io *head = NULL, *tail = NULL, *list, *io;
    unsigned n = 0;

    if (i >= VHD_RT_MAX_WORKERS || !nb->conns[i] || nb->conns[i]->w != w)
        return; /* no connection on w: nothing waits there */
    struct nbd_conn *c = nb->conns[i];
    c->cancel_owner = owner;
    list = c->wait_head;
    c->wait_head = c->wait_tail = NULL;
    while ((io = list) != NULL) {
        list = io->next;
        if (io->owner == owner)
            list_add(&head, &tail, io);
        else
            list_add(&c->wait_head, &c->wait_tail, io);
    }
    /* Taken off the list first: complete() may submit again. */
    while ((io = list_pop(&head, &tail)) != NULL) {
        io->stage = 0;
        io->complete(io, -ECANCELED);
        n++;
    }
    if (n) /* a front-end stops rings at will: rate-limited */
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: %u operation%s waiting for the server cancelled (queue stops)", be->desc, n,
                   n == 1 ? "" : "s");
}

const struct vhd_blk_backend_ops vhd_blk_backend_nbd = {
    .name = "nbd",
    .open = nbd_open,
    .close = nbd_be_close,
    .submit = nbd_submit,
    .cancel = nbd_cancel,
    .uring_ops =
        1ull << IORING_OP_POLL_ADD | 1ull << IORING_OP_POLL_REMOVE | 1ull << IORING_OP_TIMEOUT,
};
