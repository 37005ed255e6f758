/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Internals of the chaos mode shared by its files: vu_chaos.c (guest memory,
 * the raw session, set-up steps, outcome detection, descriptor writers),
 * vu_chaos_msgs.c (message cases) and vu_chaos_chains.c (descriptor chain
 * cases). Not part of the chaos front-end's interface.
 *
 * Conventions of the helpers: 0 / -errno; the helpers that send something
 * hostile or ask the back-end something may also return an outcome bit
 * (VHD_CHAOS_NACK, VHD_CHAOS_CLOSED) for what the back-end did. Offsets are
 * from the start of window 0 of the guest memory; every driver-side write
 * goes through vhd_chaos__put / vhd_chaos__mirror so that the snapshot knows
 * it (vu_chaos.h).
 */
#ifndef VHD_DRV_VU_CHAOS_INT_H
#define VHD_DRV_VU_CHAOS_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spec/virtio.h"
#include "spec/vhost_user.h"
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
#define OFF_R2     0xa000u  /* ring 2 (net control queue) */
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

/* Rings a case may start (net: receive, transmit, control). */
#define VHD_CHAOS_NRINGS 3

/* One raw session of a case. */
struct vhd_chaos_sess {
    struct vhd_chaos_ctx *ctx;
    struct vhd_chaos_mem *m;
    int fd;    /* the session socket */
    int be_fd; /* our end of the back-end channel, or -1 */
    int tmo;   /* ms */
    uint64_t offered, proto_offered, proto;
    bool packed;
    uint64_t r0_gpa; /* guest address of window-0 offset r0_off (region 0 start) */
    uint64_t r0_off;
    uint64_t r1_gpa;                                    /* guest address of window 1 */
    int kick[VHD_CHAOS_NRINGS], call[VHD_CHAOS_NRINGS]; /* eventfds of rings 0..2 */
};

/* A used element as the driver sees it. */
struct vhd_chaos_used {
    bool got;
    uint32_t id, len;
};

/* A packed descriptor to publish (vhd_chaos__packed_publish). */
struct vhd_chaos_pd {
    uint64_t addr;
    uint32_t len;
    uint16_t id;
    uint16_t flags; /* VRING_DESC_F_*; AVAIL is added */
};
/* Append to the case's note; returns rc. */
int vhd_chaos__note(struct vhd_chaos_sess *s, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Our pointer, front-end VA and guest-physical address of window-0 offset off. */
uint8_t *vhd_chaos__hva(struct vhd_chaos_sess *s, size_t off);

uint64_t vhd_chaos__uva(struct vhd_chaos_sess *s, size_t off);

uint64_t vhd_chaos__gpa(struct vhd_chaos_sess *s, size_t off);

/* The driver just wrote [off, off + len) of window 0: that is the expected content now. */
void vhd_chaos__mirror(struct vhd_chaos_sess *s, size_t off, size_t len);

/* Write len bytes at window-0 offset off (and into the snapshot). */
void vhd_chaos__put(struct vhd_chaos_sess *s, size_t off, const void *src, size_t len);

/* Let the back-end write [off, off + len) of window 0. */
void vhd_chaos__allow(struct vhd_chaos_sess *s, size_t off, size_t len);

/* sendmsg of len bytes with nfds fds (any number up to 16) on the first chunk. */
int vhd_chaos__raw_sendmsg(int fd, const void *buf, size_t len, const int *fds, unsigned nfds);

/*
 * Send a header with any request, flags and size field, followed by len
 * payload bytes (len need not match size), with any fds.
 */
int vhd_chaos__send_raw(struct vhd_chaos_sess *s, uint32_t req, uint32_t flags, uint32_t size,
                        const void *p, uint32_t len, const int *fds, unsigned nfds);

/* Receive one message: 1, -ECONNRESET, -ETIMEDOUT, -EPROTO (payload too big). */
int vhd_chaos__recv(struct vhd_chaos_sess *s, struct vu_hdr *h, union vu_payload *p);

/* vhd_chaos__recv, keeping the first fd that comes with the message in *fd (if still -1). */
int vhd_chaos__recv_fd(struct vhd_chaos_sess *s, struct vu_hdr *h, union vu_payload *p, int *fd);

/* A request with a reply of its own: 0 with the reply in *h and *p, VHD_CHAOS_CLOSED, or -errno. */
int vhd_chaos__call(struct vhd_chaos_sess *s, uint32_t req, const void *pl, uint32_t size,
                    struct vu_hdr *h, union vu_payload *p);

/* vhd_chaos__call, keeping the fd of the reply in *fd (GET_INFLIGHT_FD; caller closes it). */
int vhd_chaos__call_fd(struct vhd_chaos_sess *s, uint32_t req, const void *pl, uint32_t size,
                       struct vu_hdr *h, union vu_payload *p, int *fd);

/* cs_call of a request whose reply is one u64. */
int vhd_chaos__call_u64(struct vhd_chaos_sess *s, uint32_t req, uint64_t *out);

/*
 * Send a request that has no reply of its own, asking for an ack
 * (NEED_REPLY) and classify the answer: 0 (acked, or accepted when
 * REPLY_ACK is not negotiated: checked with a round trip), VHD_CHAOS_NACK,
 * VHD_CHAOS_CLOSED, or -errno when nothing came back.
 */
int vhd_chaos__ack_raw(struct vhd_chaos_sess *s, uint32_t req, uint32_t size, const void *pl,
                       uint32_t len, const int *fds, unsigned nfds);

/* vhd_chaos__ack_raw with the size field matching the payload. */
int vhd_chaos__ack(struct vhd_chaos_sess *s, uint32_t req, const void *pl, uint32_t size,
                   const int *fds, unsigned nfds);

/* A set-up step that must succeed. */
int vhd_chaos__must(struct vhd_chaos_sess *s, int rc, const char *what);

/* Record the outcome of a hostile step. 0 (accepted: nothing to record) or an outcome bit. */
int vhd_chaos__observe(struct vhd_chaos_sess *s, int rc, const char *what);

/* Close the session socket, the back-end channel and the ring eventfds (idempotent). */
void vhd_chaos__close(struct vhd_chaos_sess *s);

/*
 * Connect and make sure the device serves us: the back-end serves one
 * session per device and refuses (closes) a connection while it is still
 * tearing the previous one down, so retry for a while.
 */
int vhd_chaos__open(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s);

/*
 * The usual opening: GET_PROTOCOL_FEATURES, SET_PROTOCOL_FEATURES(offer &
 * want), SET_OWNER, and the back-end channel when BACKEND_REQ was taken.
 */
int vhd_chaos__negotiate(struct vhd_chaos_sess *s, uint64_t want);

/* SET_FEATURES(virtio | PROTOCOL_FEATURES) with an ack; notes the ring layout. */
int vhd_chaos__set_features(struct vhd_chaos_sess *s, uint64_t virtio);

/* SET_MEM_TABLE of n regions with the fds given (one each unless nfds says otherwise). */
int vhd_chaos__mem_table(struct vhd_chaos_sess *s, const struct vu_mem_region *r, uint32_t n,
                         const int *fds, unsigned nfds);

/* Region i as the window it is. */
struct vu_mem_region vhd_chaos__win_region(struct vhd_chaos_sess *s, unsigned i);

/* SET_MEM_TABLE of both windows as they are (mmap offsets into the one memfd). */
int vhd_chaos__mem_default(struct vhd_chaos_sess *s);

/* A vring state request (NUM, BASE, ENABLE, ...) with an ack. */
int vhd_chaos__set_state(struct vhd_chaos_sess *s, uint32_t req, uint32_t index, uint32_t num);

/* SET_VRING_ADDR (front-end VAs, flags 0) with an ack. */
int vhd_chaos__set_addr(struct vhd_chaos_sess *s, uint32_t index, uint64_t desc, uint64_t avail,
                        uint64_t used);

/* SET_VRING_KICK / CALL with an fd (or none: NOFD). */
int vhd_chaos__set_vring_fd(struct vhd_chaos_sess *s, uint32_t req, uint32_t index, int fd);

/* Zero a ring's parts at window offset off and let the back-end write what it owns. */
void vhd_chaos__ring_layout(struct vhd_chaos_sess *s, size_t off);

/*
 * The standard set-up of a session, in order: connect (and GET_FEATURES),
 * negotiate protocol features (and SET_OWNER), SET_FEATURES, the default
 * memory table, then ring 0 at OFF_R0: zero its layout, SET_VRING_NUM,
 * SET_VRING_BASE, SET_VRING_ADDR, SET_VRING_CALL (eventfds made here),
 * SET_VRING_KICK, SET_VRING_ENABLE.
 */
enum vhd_chaos_step {
    VHD_STEP_OPEN,
    VHD_STEP_NEGOTIATE,
    VHD_STEP_FEATURES,
    VHD_STEP_MEM,
    VHD_STEP_LAYOUT,
    VHD_STEP_NUM,
    VHD_STEP_BASE,
    VHD_STEP_ADDR,
    VHD_STEP_CALL,
    VHD_STEP_KICK,
    VHD_STEP_ENABLE,
    VHD_STEP_END
};

/* How far a case's session is set up before what makes it hostile. */
struct vhd_chaos_plan {
    enum vhd_chaos_step stop; /* run the steps before this one */
    unsigned skip;            /* SKIP() of the steps left out (OPEN cannot be) */
    uint64_t virtio;          /* virtio features besides VERSION_1 */
    uint64_t proto;           /* protocol features asked for; 0: WANT_PROTO */
};

/* The skip bit of step st (LAYOUT, BASE, ...). */
#define SKIP(st) (1u << VHD_STEP_##st)

/* A plan that stops before step st: UPTO(KICK, .virtio = BIT(VIRTIO_F_RING_PACKED)). */
#define UPTO(st, ...) ((struct vhd_chaos_plan){.stop = VHD_STEP_##st, __VA_ARGS__})

/* Run the standard steps of plan p; 0 or the failing step's code (noted). */
int vhd_chaos__steps(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, struct vhd_chaos_plan p);

/*
 * The hostile start of ring 0: SET_VRING_KICK with its eventfd (made if
 * there is none yet), the outcome observed as `what`.
 */
int vhd_chaos__kick_observe(struct vhd_chaos_sess *s, const char *what);

/* The ring steps [from, to) (LAYOUT .. ENABLE) of ring q at window offset off. */
int vhd_chaos__ring_steps(struct vhd_chaos_sess *s, uint32_t q, size_t off,
                          enum vhd_chaos_step from, enum vhd_chaos_step to);

/* Everything up to (not including) SET_VRING_KICK for ring q at window offset off. */
int vhd_chaos__ring_prepare(struct vhd_chaos_sess *s, uint32_t q, size_t off);

/* Start ring q at window offset off (and enable it). */
int vhd_chaos__ring_start(struct vhd_chaos_sess *s, uint32_t q, size_t off);

/* Open, negotiate, features, default memory table. */
int vhd_chaos__setup(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, uint64_t virtio);

/* A blk session with ring 0 started. */
int vhd_chaos__blk(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s, bool packed, bool indirect);

/* A net session: receive ring 0 at OFF_R0, transmit ring 1 at OFF_R1. */
int vhd_chaos__net(struct vhd_chaos_ctx *ctx, struct vhd_chaos_sess *s);

/* The net cases' transmit and receive buffers (window 0). */
#define OFF_TXBUF OFF_DATA
#define OFF_RXBUF (OFF_DATA + 0x1000u)

/* The net cases' frame at OFF_TXBUF: a virtio-net header, then 60 bytes to broadcast. */
void vhd_chaos__net_frame(struct vhd_chaos_sess *s);

/*
 * Transmit head 0 of ring 1 (made available first when publish), then see
 * what came back on ring 0 within rx_ms: SERVED when the frame arrived whole
 * at OFF_RXBUF, REQ_ERROR when it was transmitted and dropped (the device not
 * broken). 0, or the wait's error.
 */
int vhd_chaos__net_go(struct vhd_chaos_sess *s, bool publish, int rx_ms);

/* GET_STATUS: 1 (NEEDS_RESET), 0 (not), VHD_CHAOS_CLOSED... as an outcome-ish code. */
int vhd_chaos__needs_reset(struct vhd_chaos_sess *s);

/* Write the kick eventfd of ring q. */
void vhd_chaos__kick(struct vhd_chaos_sess *s, uint32_t q);

/*
 * After a kick: wait until the n-th used element of the ring at off shows
 * up, or the device reports NEEDS_RESET, or ms pass. Records BROKEN.
 * Returns 0 or -errno (no answer to GET_STATUS).
 */
int vhd_chaos__await_used(struct vhd_chaos_sess *s, size_t off, uint16_t n,
                          struct vhd_chaos_used *u, int ms);

/* Split descriptor i of the table at window offset tbl (ring or indirect table). */
void vhd_chaos__sdesc(struct vhd_chaos_sess *s, size_t tbl, uint16_t i, uint64_t addr, uint32_t len,
                      uint16_t flags, uint16_t next);

/* Make `head` available at avail slot idx - 1 and publish avail->idx = idx (release). */
void vhd_chaos__split_publish(struct vhd_chaos_sess *s, size_t off, uint16_t head, uint16_t idx);

/*
 * Publish packed descriptors d[0..n) in slots 0..n-1 (first lap, wrap
 * counter 1: AVAIL set, USED clear); slot 0's flags are stored last, with
 * release.
 */
void vhd_chaos__packed_publish(struct vhd_chaos_sess *s, size_t off, const struct vhd_chaos_pd *d,
                               unsigned n);

/* Header k at OFF_HDR + 64k; status byte k at OFF_STAT + 64k (0xff until written). */
void vhd_chaos__blk_hdr(struct vhd_chaos_sess *s, unsigned k, uint32_t type, uint64_t sector);

/*
 * Classify a blk request after await_used: served (status OK), failed with
 * an error status, or given back unanswered (used length 0: nothing to
 * record; the device should also be broken).
 */
void vhd_chaos__blk_classify(struct vhd_chaos_sess *s, const struct vhd_chaos_used *u, unsigned k);

/* The status byte of blk request k (0xff until the device writes it). */
uint8_t vhd_chaos__blk_status(struct vhd_chaos_sess *s, unsigned k);

/* Kick ring 0 and wait for the first request's fate; classify as blk request 0. */
int vhd_chaos__blk_go(struct vhd_chaos_sess *s);

/* The case tables of vu_chaos_msgs.c and vu_chaos_chains.c. */
extern const struct vhd_chaos_case vhd_chaos__msg_cases[];
extern const unsigned vhd_chaos__msg_ncases;
extern const struct vhd_chaos_case vhd_chaos__chain_cases[];
extern const unsigned vhd_chaos__chain_ncases;
extern const struct vhd_chaos_case vhd_chaos__iotlb_cases[];
extern const unsigned vhd_chaos__iotlb_ncases;

/* Catalogue entries: outcomes in short, and a case of each device kind. */
#define N VHD_CHAOS_NACK
#define C VHD_CHAOS_CLOSED
#define E VHD_CHAOS_REQ_ERROR
#define B VHD_CHAOS_BROKEN
#define S VHD_CHAOS_SERVED
#define BLK(name, cat, expect)                                        \
    {                                                                 \
#name, VHD_CHAOS_##cat, VHD_CHAOS_DEV_BLK, (expect), c_##name \
    }
#define BLKD(name, cat, expect)                                            \
    {                                                                      \
#name, VHD_CHAOS_##cat, VHD_CHAOS_DEV_BLK_DATA, (expect), c_##name \
    }
#define NET(name, cat, expect)                                        \
    {                                                                 \
#name, VHD_CHAOS_##cat, VHD_CHAOS_DEV_NET, (expect), c_##name \
    }

/*
 * A case that is another case's body with fixed arguments: defines
 * static int name(struct vhd_chaos_ctx *ctx) returning fn(ctx, args...);
 * the arguments may use ctx.
 */
#define VHD_CHAOS_VARIANT(name, fn, ...)       \
    static int name(struct vhd_chaos_ctx *ctx) \
    {                                          \
        return fn(ctx, __VA_ARGS__);           \
    }

#endif /* VHD_DRV_VU_CHAOS_INT_H */
