/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user front-end: the side of the protocol QEMU plays, for the
 * userspace drivers. One struct vhd_vuf is one session on one connected Unix
 * socket: feature and protocol-feature negotiation, the memory table, ring
 * set-up and orderly stop, config space. Wire format from spec/vhost_user.h.
 *
 * Every exchange is synchronous and bounded by the session's timeout; every
 * reply is validated (request id, flags, size). Functions return 0 or -errno
 * and leave a one-line reason in vhd_vuf_strerror(). A framing error or a
 * timeout closes the socket (the stream can no longer be trusted); later
 * calls fail with -ENOTCONN. A back-end that refuses a request (non-zero
 * REPLY_ACK) yields -EIO and the session stays usable.
 *
 * Threading: a session is used by one thread at a time; nothing here is on
 * the datapath.
 */
#ifndef VHD_DRV_VU_FRONTEND_H
#define VHD_DRV_VU_FRONTEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guestmem.h"

#define VHD_VUF_DEFAULT_TIMEOUT_MS 5000

struct vhd_vuf {
    int fd;                 /* session socket; -1 when closed */
    int timeout_ms;         /* bound on each exchange (connect, send, reply) */
    uint64_t offered;       /* GET_FEATURES reply */
    uint64_t features;      /* last SET_FEATURES value (PROTOCOL_FEATURES bit included) */
    uint64_t proto_offered; /* GET_PROTOCOL_FEATURES reply (0 when not offered) */
    uint64_t proto;         /* SET_PROTOCOL_FEATURES value we sent */
    bool has_proto;         /* VHOST_USER_F_PROTOCOL_FEATURES offered (and so acked) */
    uint32_t queue_num;     /* GET_QUEUE_NUM with MQ, else 1 */
    uint32_t max_rings;     /* ring indices below this are valid (default queue_num; net:
                               2 * pairs + 1, GET_QUEUE_NUM counting pairs there) */
    char err[192];          /* reason of the last failure */
};

/* One ring as the front-end describes it to the back-end. */
struct vhd_vuf_ring {
    uint32_t index;
    uint32_t num;   /* queue size */
    uint64_t desc;  /* front-end virtual addresses (our mapping; spec "Memory access") */
    uint64_t avail; /* split: available ring; packed: driver event suppression area */
    uint64_t used;  /* split: used ring; packed: device event suppression area */
    uint32_t base;  /* split: next avail index; packed: 0x80008000 for a fresh ring */
    int kick_fd;    /* eventfd we write to; the back-end receives a copy */
    int call_fd;    /* eventfd the back-end signals; the back-end receives a copy */
};

/* A fresh (zeroed) session object, not connected. */
void vhd_vuf_init(struct vhd_vuf *f, int timeout_ms);

/*
 * vhd_vuf_connect - connect to the back-end's listening socket at path,
 * retrying while it does not exist yet or refuses (a daemon still starting)
 * until the timeout. 0, -ENAMETOOLONG, -ETIMEDOUT (with the last connect
 * error in the message), or another -errno.
 */
int vhd_vuf_connect(struct vhd_vuf *f, const char *path);

/*
 * vhd_vuf_handshake - the session's opening, as QEMU does it: GET_FEATURES;
 * when PROTOCOL_FEATURES is offered, GET_PROTOCOL_FEATURES and
 * SET_PROTOCOL_FEATURES(offered & want); SET_OWNER; GET_QUEUE_NUM when MQ
 * was negotiated. want is a mask of VHOST_USER_PROTOCOL_F_* bits (the
 * caller should ask only for what it implements; REPLY_ACK, MQ and CONFIG
 * are what the drivers use).
 */
int vhd_vuf_handshake(struct vhd_vuf *f, uint64_t want_proto);

/* Whether a protocol feature (VHOST_USER_PROTOCOL_F_*) was negotiated. */
static inline bool vhd_vuf_has_proto(const struct vhd_vuf *f, unsigned bit)
{
    return (f->proto >> bit) & 1;
}

/*
 * vhd_vuf_set_features - SET_FEATURES with the virtio bits given, plus
 * VHOST_USER_F_PROTOCOL_FEATURES when it was offered (spec: it must be
 * acked for the protocol features to stay enabled). -EINVAL when a bit was
 * not offered.
 */
int vhd_vuf_set_features(struct vhd_vuf *f, uint64_t virtio_features);

/*
 * vhd_vuf_get_config - GET_CONFIG of len bytes (<= 256) at offset into buf.
 * Needs the CONFIG protocol feature (-ENOTSUP). A back-end that cannot
 * answer replies with an empty payload (spec): -EIO.
 */
int vhd_vuf_get_config(struct vhd_vuf *f, uint32_t offset, void *buf, uint32_t len);

/*
 * vhd_vuf_set_mem_table - SET_MEM_TABLE with every region of gm (uva = our
 * mapping address, mmap_offset 0, one memfd each). The fds stay ours; the
 * back-end receives copies.
 */
int vhd_vuf_set_mem_table(struct vhd_vuf *f, const struct vhd_guestmem *gm);

/*
 * vhd_vuf_ring_start - SET_VRING_NUM, SET_VRING_BASE, SET_VRING_ADDR,
 * SET_VRING_CALL, SET_VRING_KICK (which starts the ring), then, when
 * protocol features were negotiated, SET_VRING_ENABLE 1 (spec "Ring
 * states": such rings start disabled). Memory table and features first.
 */
int vhd_vuf_ring_start(struct vhd_vuf *f, const struct vhd_vuf_ring *r);

/*
 * vhd_vuf_set_backend_req_fd - SET_BACKEND_REQ_FD: give the back-end fd,
 * one end of a socket pair, for its own requests (config change
 * notifications). Needs the BACKEND_REQ protocol feature (-ENOTSUP). The fd
 * stays ours; the back-end receives a copy.
 */
int vhd_vuf_set_backend_req_fd(struct vhd_vuf *f, int fd);

/*
 * vhd_vuf_iotlb_msg - one IOTLB_MSG (UPDATE or INVALIDATE) with NEED_REPLY,
 * and wait for the ack (QEMU's way: the ack of an INVALIDATE means the
 * back-end no longer touches the range). Needs REPLY_ACK (-ENOTSUP); a
 * refusal is -EIO.
 */
struct vu_iotlb;
int vhd_vuf_iotlb_msg(struct vhd_vuf *f, const struct vu_iotlb *m);

/*
 * vhd_vuf_send_rarp - SEND_RARP for mac (what a front-end sends after a
 * migration). Needs the RARP protocol feature (-ENOTSUP).
 */
int vhd_vuf_send_rarp(struct vhd_vuf *f, const uint8_t mac[6]);

/* SET_VRING_ENABLE (needs protocol features: -ENOTSUP otherwise). */
int vhd_vuf_ring_enable(struct vhd_vuf *f, uint32_t index, bool enable);

/*
 * vhd_vuf_ring_stop - stop a ring: SET_VRING_ENABLE 0 when protocol features
 * were negotiated, then GET_VRING_BASE (the back-end completes or records
 * its in-flight requests before it answers). *base gets the reply's value
 * when base is not NULL.
 */
int vhd_vuf_ring_stop(struct vhd_vuf *f, uint32_t index, uint32_t *base);

/*
 * The inflight area (protocol feature INFLIGHT_SHMFD, spec "Inflight I/O
 * tracking"): shared memory the back-end allocates and fills with the state
 * of the requests it has taken from the rings, kept by the front-end across
 * sessions so that a restarted back-end can resubmit them. Its layout is
 * the back-end's business; the front-end only keeps it and hands it back.
 */
struct vhd_vuf_inflight {
    int fd;             /* -1: none */
    void *addr;         /* our mapping of mmap_size bytes at mmap_offset */
    uint64_t mmap_size; /* as the back-end gave them */
    uint64_t mmap_offset;
    uint16_t num_queues; /* what the area was asked for */
    uint16_t queue_size;
};

/* Largest area accepted from a back-end: 1 GiB (spec sizes are ~16-48 bytes per ring entry). */
#define VHD_VUF_INFLIGHT_MAX (1ull << 30)

/* An empty (fd -1) inflight area. */
void vhd_vuf_inflight_init(struct vhd_vuf_inflight *in);

/*
 * vhd_vuf_get_inflight_fd - GET_INFLIGHT_FD for num_queues rings of
 * queue_size entries: the back-end allocates the area and replies with its
 * fd, which is mapped (shared) into *out. Features must be set first (the
 * layout depends on packed vs split). -ENOTSUP when INFLIGHT_SHMFD was not
 * negotiated, -EPROTO on a malformed reply.
 */
int vhd_vuf_get_inflight_fd(struct vhd_vuf *f, uint16_t num_queues, uint16_t queue_size,
                            struct vhd_vuf_inflight *out);

/* vhd_vuf_set_inflight_fd - SET_INFLIGHT_FD: give the (kept) area to this session's back-end. */
int vhd_vuf_set_inflight_fd(struct vhd_vuf *f, const struct vhd_vuf_inflight *in);

/* Unmap and close the area (idempotent). */
void vhd_vuf_inflight_release(struct vhd_vuf_inflight *in);

/*
 * Dirty logging (protocol feature LOG_SHMFD, spec "Migration"): a bitmap in
 * shared memory, one bit per 4 KiB guest-physical page, that the back-end
 * sets for every page it writes while VHOST_F_LOG_ALL is negotiated. The
 * front-end reads and clears it (what QEMU does while it migrates).
 */
struct vhd_vuf_log {
    int fd;           /* memfd; -1: none */
    uint64_t *chunks; /* our mapping: page p is bit p % 64 of chunks[p / 64] */
    uint64_t size;    /* bytes (a multiple of 8) */
};

/*
 * vhd_vuf_log_alloc - a zeroed log covering guest-physical [0, top) (QEMU's
 * vhost_get_log_size: whole 64-page chunks), in a memfd named name. The log
 * is ours; the back-end gets a copy of the fd. 0 or -errno.
 */
int vhd_vuf_log_alloc(struct vhd_vuf_log *log, uint64_t top, const char *name);

/* Unmap and close (idempotent; a zeroed or released log is fine). */
void vhd_vuf_log_release(struct vhd_vuf_log *log);

/*
 * vhd_vuf_log_collect - take the dirty pages: each 64-page chunk is read and
 * cleared with one atomic exchange (the back-end sets bits concurrently).
 * Writes up to max page numbers (ascending) to pages and returns how many
 * pages were dirty (possibly more than max).
 */
size_t vhd_vuf_log_collect(struct vhd_vuf_log *log, uint64_t *pages, size_t max);

/*
 * vhd_vuf_set_log_base - SET_LOG_BASE: the log is size bytes at offset of
 * fd (fd -1: none sent, which a back-end must refuse). Needs LOG_SHMFD
 * (-ENOTSUP). Waits for the back-end's reply (u64: 0, else its errno): a
 * refusal is -EIO with the reason, and the session stays usable.
 */
int vhd_vuf_set_log_base(struct vhd_vuf *f, int fd, uint64_t size, uint64_t offset);

/*
 * vhd_vuf_set_log_all - SET_FEATURES with the features last set, with or
 * without VHOST_F_LOG_ALL: dirty logging on or off (-EINVAL when not
 * offered). Rings keep running.
 */
int vhd_vuf_set_log_all(struct vhd_vuf *f, bool on);

/*
 * vhd_vuf_ring_set_log - SET_VRING_ADDR again for a started ring (same
 * addresses), with VHOST_VRING_F_LOG on or off and log_gpa, the
 * guest-physical address at which the back-end logs writes to the ring's
 * used part (split: the used ring; packed: the device event area).
 */
int vhd_vuf_ring_set_log(struct vhd_vuf *f, const struct vhd_vuf_ring *r, bool on,
                         uint64_t log_gpa);

/*
 * vhd_vuf_sync - make sure every message sent so far was handled: a no-op
 * with REPLY_ACK (each message was acknowledged), else a GET_FEATURES round
 * trip (the back-end handles messages in order), as QEMU does.
 */
int vhd_vuf_sync(struct vhd_vuf *f);

/* Is the session's socket still open on both ends? (non-blocking check) */
bool vhd_vuf_alive(const struct vhd_vuf *f);

/* Close the socket (idempotent). The back-end ends the session. */
void vhd_vuf_close(struct vhd_vuf *f);

/* The reason of the last failure ("" when none). */
const char *vhd_vuf_strerror(const struct vhd_vuf *f);

/*
 * vhd_vuf_accept - like vhd_vuf_connect, but this side listens (for
 * back-ends in client mode, such as vhostd's client=on): bind a Unix socket
 * at path (a socket file already there is replaced; any other file is an
 * error), wait up to the session's timeout for one back-end to connect,
 * then close the listening socket and remove path again. 0,
 * -ENAMETOOLONG, -EEXIST, -ETIMEDOUT, or another -errno.
 */
int vhd_vuf_accept(struct vhd_vuf *f, const char *path);

#endif /* VHD_DRV_VU_FRONTEND_H */
