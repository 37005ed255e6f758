/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The chaos front-end (test support, built only into the test programs): a
 * hostile vhost-user front-end over the driver library. Each case opens its
 * own session on a back-end's socket and sends something a correct
 * front-end never would — malformed or truncated messages, wrong fd counts
 * and kinds, bad feature sequences, bad memory tables, rings outside guest
 * memory, messages out of order — or writes a malformed descriptor chain
 * straight into the driver-side rings, and reports what the back-end did
 * about it. A robust back-end answers every case with one of the outcomes
 * below and keeps running; the test (tests/integration/test_chaos.c) checks that
 * and everything around it.
 *
 * Guest memory is one memfd whose regions are windows with canary guard
 * bytes around them; every byte the back-end changed is checked against the
 * ranges a case allowed it to write (rings it owns, writable buffers).
 *
 * Threading: one thread drives a context at a time. Nothing here is on the
 * datapath of the real drivers.
 */
#ifndef VHD_DRV_VU_CHAOS_H
#define VHD_DRV_VU_CHAOS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the back-end did with a hostile input (bits, so a case may see several). */
enum vhd_chaos_outcome {
    VHD_CHAOS_NACK = 1u << 0,      /* refused: non-zero REPLY_ACK, or an empty GET_CONFIG reply */
    VHD_CHAOS_CLOSED = 1u << 1,    /* the back-end closed the connection */
    VHD_CHAOS_REQ_ERROR = 1u << 2, /* the request completed with an error status (net: dropped) */
    VHD_CHAOS_BROKEN = 1u << 3,    /* device marked broken: NEEDS_RESET in GET_STATUS */
    VHD_CHAOS_SERVED = 1u << 4,    /* handled correctly (legal-but-odd input, controls) */
};

enum vhd_chaos_category {
    VHD_CHAOS_FRAMING,  /* truncated header/payload, size field, flags, unknown ids */
    VHD_CHAOS_FDS,      /* missing, extra, too many fds, fds of the wrong kind */
    VHD_CHAOS_FEATURES, /* feature / protocol feature sequences, out-of-range values */
    VHD_CHAOS_MEMORY,   /* overlapping / overflowing regions, bad mmap offsets */
    VHD_CHAOS_RINGS,    /* rings outside guest memory, crossing regions, misaligned */
    VHD_CHAOS_ORDER,    /* messages out of order, changes to started rings / memory in use */
    VHD_CHAOS_CHAINS,   /* malformed descriptor chains and device requests */
    VHD_CHAOS_IOTLB,    /* IOVAs and IOTLB messages (VIRTIO_F_ACCESS_PLATFORM) */
    VHD_CHAOS_NCATEGORIES
};

/* The kind of device a case needs. */
enum vhd_chaos_dev {
    VHD_CHAOS_DEV_BLK,      /* virtio-blk (any backend) */
    VHD_CHAOS_DEV_BLK_DATA, /* virtio-blk that keeps what is written (reads it back) */
    VHD_CHAOS_DEV_NET,      /* virtio-net with a loopback backend */
};

#define VHD_CHAOS_WINDOWS   2          /* guest memory regions (windows of one memfd) */
#define VHD_CHAOS_WIN_SIZE  (1u << 20) /* bytes of each window */
#define VHD_CHAOS_GUARD     (1u << 16) /* canary bytes before each window and after the last */
#define VHD_CHAOS_MAX_ALLOW 32

/* One window: a region of guest memory at offset `off` of the memfd. */
struct vhd_chaos_win {
    uint64_t gpa;
    uint64_t off; /* offset in the memfd */
    uint8_t *hva; /* our mapping (also the front-end VA we advertise) */
};

/* Guest memory of the chaos front-end. */
struct vhd_chaos_mem {
    int fd;        /* the memfd */
    uint8_t *base; /* mapping of the whole file */
    size_t len;
    struct vhd_chaos_win win[VHD_CHAOS_WINDOWS];
    uint8_t *snap; /* copy of the windows taken before the back-end may act */
};

/* One run of one case. */
struct vhd_chaos_ctx {
    const char *socket_path; /* in: the device's socket */
    const char *probe_path;  /* in: another idle device's socket (NULL: not probed) */
    int timeout_ms;          /* in: bound on every wait (0: 2000) */
    struct vhd_chaos_mem *mem;
    /* out */
    unsigned observed;       /* enum vhd_chaos_outcome bits seen */
    unsigned config_changes; /* BACKEND_CONFIG_CHANGE_MSG messages received */
    char note[192];          /* what was seen, or why the case could not run */
    /* bytes of the windows (offsets from the first window's start) the back-end may change */
    unsigned nallow;
    bool allow_overflow; /* more ranges than allow[] holds: the memory check fails */
    struct {
        size_t off, len;
    } allow[VHD_CHAOS_MAX_ALLOW];
};

struct vhd_chaos_case {
    const char *name;
    enum vhd_chaos_category cat;
    enum vhd_chaos_dev dev;
    unsigned expect; /* acceptable outcomes: what is seen must be non-empty and inside this */
    int (*run)(struct vhd_chaos_ctx *ctx);
};

/* The catalogue, in a fixed order; *n gets its length. */
const struct vhd_chaos_case *vhd_chaos_cases(unsigned *n);

/* Create the memfd (windows and guards). 0 or -errno. */
int vhd_chaos_mem_init(struct vhd_chaos_mem *m);
void vhd_chaos_mem_fini(struct vhd_chaos_mem *m);

/*
 * vhd_chaos_run - run one case against ctx->socket_path: resets the
 * outcome fields, refills the windows with their pattern and the guards
 * with canaries, runs the case and closes its session. Returns 0 when the
 * case ran (ctx->observed says what happened; check it with
 * vhd_chaos_verdict), or -errno when it could not (set-up refused, no
 * answer within the timeout: reason in ctx->note).
 */
int vhd_chaos_run(const struct vhd_chaos_case *cs, struct vhd_chaos_ctx *ctx);

/* Did the run see an acceptable outcome, and nothing else? */
bool vhd_chaos_verdict(const struct vhd_chaos_case *cs, const struct vhd_chaos_ctx *ctx);

/*
 * vhd_chaos_check_memory - after the back-end let go of the session: every
 * guard byte still holds its canary, and every window byte the back-end
 * changed lies in a range the case allowed. Returns 0, or the number of bad
 * bytes with the first described in why.
 */
long vhd_chaos_check_memory(const struct vhd_chaos_ctx *ctx, char *why, size_t whylen);

const char *vhd_chaos_category_name(enum vhd_chaos_category cat);

/*
 * vhd_chaos_iotlb_latency - on a blk device at ctx->socket_path, with
 * VIRTIO_F_ACCESS_PLATFORM: `rounds` times, make two 4 KiB reads available,
 * kick, and time an INVALIDATE of their buffers until its ack (ns[r]), map
 * them again and wait for both. 0, or -errno (reason in ctx->note).
 */
int vhd_chaos_iotlb_latency(struct vhd_chaos_ctx *ctx, unsigned rounds, uint64_t *ns);

/*
 * vhd_chaos_iotlb_resend - on a blk device with VIRTIO_F_ACCESS_PLATFORM:
 * n rounds of two 4 KiB reads made available and kicked, then the mapping
 * of their buffers and of the ring sent again unchanged while they run;
 * every read must be served. Then an UPDATE takes write permission away
 * from the first read's data page and one more read is sent there:
 * *reduced_failed says it failed without changing the page (or broke the
 * device). 0, or -errno (reason in ctx->note).
 */
int vhd_chaos_iotlb_resend(struct vhd_chaos_ctx *ctx, unsigned n, bool *reduced_failed);

/* "NACK|BROKEN" for a set of outcome bits ("none" for 0). */
const char *vhd_chaos_outcome_str(unsigned outcomes, char *buf, size_t len);

#endif /* VHD_DRV_VU_CHAOS_H */
