/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The public device-side API's internal state (include/vhostd/ctx.h,
 * device.h, blk.h, net.h, custom.h): the context that owns the control loop
 * and the runtime, and the public device that wraps an internal struct
 * vhd_dev with its endpoint and event bookkeeping. Shared by the files of
 * src/api only.
 */
#ifndef VHD_API_H
#define VHD_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/dev.h"
#include "vhostd/vhostd.h"

struct vhd_ctl;
struct vhd_rt;
struct vhd_vu_server;
struct vhd_vu_client;
struct vhd_vu_conn;

enum api_dev_type {
    API_DEV_BLK,
    API_DEV_NET,
    API_DEV_CUSTOM,
};

struct vhd_ctx {
    struct vhd_ctl *ctl;
    struct vhd_rt *rt;
    unsigned nworkers;
    unsigned next_rr; /* round robin over the workers, across devices */
    bool sigbus_guard;
    struct vhd_device *devices; /* every device of the context, newest first */
    struct api_open *opens;     /* vhd_blk_device_open calls not finished yet (open.c) */
};

struct vhd_device {
    struct vhd_ctx *ctx;
    struct vhd_device *next; /* ctx->devices */
    enum api_dev_type type;
    struct vhd_dev *dev; /* the internal device (blk.c, net.c, custom.c) */

    /* endpoint (copied from the config) */
    char *path;
    bool client;
    int listen_fd; /* endpoint.listen_fd when listen_fd_set; else -1 */
    unsigned reconnect_min_ms, reconnect_max_ms;
    struct vhd_endpoint_access access;
    struct vhd_vu_server *srv; /* started server, or */
    struct vhd_vu_client *cli; /* started client; both NULL: stopped */
    bool disabled;             /* a stop failed with -EBUSY */
    struct api_resize *resize; /* blk: a shrink in progress (vhd_blk_device_resize_async) */

    vhd_event_fn on_event;
    void *opaque;
    int stop_timeout_ms; /* 0: the transport's default */

    /* event bookkeeping (api_device_scan) */
    unsigned seen_sessions;   /* endpoint's session count at the last scan */
    bool had_conn;            /* a session existed at the last scan */
    bool was_broken;          /* dev->broken at the last scan */
    bool config_event;        /* custom: the front-end changed config space */
    uint64_t sessions_before; /* sessions of endpoints stopped before the current one */
    uint64_t attempts_before;
    uint64_t broken_count;
};

/* The current session of d, or NULL. */
struct vhd_vu_conn *api_device_conn(const struct vhd_device *d);

/*
 * api_device_check - the checks of api_device_init that need no device
 * (socket path, allow-list sizes, worker indexes). 0 or -EINVAL with err set.
 */
int api_device_check(const struct vhd_ctx *ctx, const struct vhd_device_config *cfg, char *err,
                     size_t errlen);

/* The internal blk options of a public blk configuration (pointers into cfg). */
struct vhd_blk_opts;
void api_blk_opts(const struct vhd_blk_config *cfg, struct vhd_blk_opts *bo);

/*
 * api_ctx_cancel_opens - vhd_ctx_destroy, once its devices are stopped and
 * destroyed: wait for every open still running, 2 s for all together (each
 * is bounded by its backend's timeouts, which may be longer), free what it
 * opened and call its callback with -ECANCELED. An open still running at
 * the deadline is detached, logged, and frees what it opens when it ends.
 * Control thread.
 */
void api_ctx_cancel_opens(struct vhd_ctx *ctx);

/*
 * api_device_init - the common part of vhd_*_device_new once the internal
 * device exists: checks and copies the config, assigns the queues to
 * workers (net: pairwise), links d into ctx. 0 or -errno with err set; on
 * failure the caller frees dev and d.
 */
int api_device_init(struct vhd_ctx *ctx, struct vhd_device *d, enum api_dev_type type,
                    struct vhd_dev *dev, const struct vhd_device_config *cfg, char *err,
                    size_t errlen);

/* Free what api_device_init allocated (not the internal device). */
void api_device_fini(struct vhd_device *d);

/* Look at every device of ctx for events to report (after each loop turn). */
void api_ctx_scan(struct vhd_ctx *ctx);

/* Custom devices (custom.c): queue counters, and freeing the internal device. */
int api_custom_queue_counters(const struct vhd_dev *dev, uint32_t q,
                              struct vhd_queue_counters *out);
void api_custom_free(struct vhd_dev *dev);

/* printf-style message into err (errlen bytes, may be 0); returns rc. */
int api_fail(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* VHD_API_H */
