/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd's management API (--rpc PATH): JSON-RPC 2.0 over a Unix socket, one
 * request per line, served from the library's control loop (non-blocking,
 * bounded per connection; an add whose backend opens slowly is answered when
 * the open ends, off the control thread, while the rest is served). Owns the table of the daemon's
 * devices: those of the command line (adopted) and those added at runtime.
 */
#ifndef VHD_RPC_H
#define VHD_RPC_H

#include <stdbool.h>
#include <stddef.h>

#include "options.h"
#include "vhostd/vhostd.h"

#define VHD_RPC_MAX_REQUEST 65536u /* bytes of one request line */
#define VHD_RPC_MAX_DEPTH   16     /* JSON nesting */
#define VHD_RPC_IDLE_MS     10000u /* a connection silent (or mid-request) this long is closed */
#define VHD_RPC_MAX_CLIENTS 64u    /* concurrent connections; more are answered with an error */
#define VHD_RPC_MAX_DEVICES VHD_OPT_MAX_DEVICES /* devices in the table */

/* JSON-RPC 2.0 error codes; -32000: a device operation failed (the message says why). */
#define VHD_RPC_E_PARSE   (-32700)
#define VHD_RPC_E_REQUEST (-32600)
#define VHD_RPC_E_METHOD  (-32601)
#define VHD_RPC_E_PARAMS  (-32602)
#define VHD_RPC_E_FAILED  (-32000)

struct vhd_rpc;

/*
 * How the table creates a device from its parsed keys: create it and start
 * it (the daemon's own code, so that --blk and the RPC build devices the same
 * way). 0, or -errno with a one-line reason in err.
 */
struct vhd_rpc_ops {
    int (*new_blk)(void *opaque, const struct vhd_opt_blk *b, struct vhd_device **out, char *err,
                   size_t errlen);
    int (*new_net)(void *opaque, const struct vhd_opt_net *n, struct vhd_device **out, char *err,
                   size_t errlen);
    /*
     * Optional: begin creating a blk device without blocking the control
     * thread (vhd_blk_device_open: the backend opens on a thread of its own).
     * 0 and done(done_opaque, ...) called later, once, on the control thread
     * with the stopped device (the table starts it) or -errno and a reason;
     * or -errno with err set and done never called. When set, device.add of
     * a blk device from a connection answers once the open has finished, and
     * the server goes on serving every other connection (and every device)
     * meanwhile.
     */
    int (*open_blk)(void *opaque, const struct vhd_opt_blk *b, vhd_device_open_fn done,
                    void *done_opaque, char *err, size_t errlen);
    /*
     * config.reload: what SIGHUP does (reload.h). 0 with the summary line in
     * msg, or -1 with the reason (the configuration does not parse). NULL:
     * the method answers that reloading is not available.
     */
    int (*reload)(void *opaque, char *msg, size_t msglen);
    void *opaque;
};

/*
 * vhd_rpc_new - an empty device table for ctx. opts (kept, not copied) gives
 * the globals that save-config writes. 0 and *out, or -ENOMEM.
 */
int vhd_rpc_new(struct vhd_ctx *ctx, const struct vhd_options *opts, const struct vhd_rpc_ops *ops,
                struct vhd_rpc **out);

/*
 * Where a device of the table came from. A reload (reload.h) removes only
 * the devices a configuration made (STARTUP, RELOAD) and that it no longer
 * names; those added through the API stay until device.remove.
 */
enum vhd_rpc_origin {
    VHD_RPC_ORIGIN_API = 0,     /* device.add (the default of every entry) */
    VHD_RPC_ORIGIN_STARTUP = 1, /* the command line or --config at start (vhd_rpc_adopt) */
    VHD_RPC_ORIGIN_RELOAD = 2,  /* added by a reload */
};

/*
 * vhd_rpc_adopt - add a device created elsewhere (the command line's) to the
 * table, origin VHD_RPC_ORIGIN_STARTUP; spec is its KEY=VALUE,... text
 * (copied), for save-config. 0, or -ENOMEM / -ENOSPC.
 */
int vhd_rpc_adopt(struct vhd_rpc *r, struct vhd_device *dev, bool net, const char *name,
                  const char *spec);

/* Set the origin of the device named name (no such device: nothing). Control thread. */
void vhd_rpc_set_origin(struct vhd_rpc *r, const char *name, enum vhd_rpc_origin origin);

/* The origin of the i-th device (i < vhd_rpc_ndevices). Control thread. */
enum vhd_rpc_origin vhd_rpc_device_origin(const struct vhd_rpc *r, unsigned i);

/*
 * vhd_rpc_own_fd - the table owns fd (an --fd listening socket the device
 * named name serves) and closes it when the entry leaves the table, so that a
 * removed device's socket stops accepting connections. Control thread.
 */
void vhd_rpc_own_fd(struct vhd_rpc *r, const char *name, int fd);

/* Whether a device of the table owns fd (vhd_rpc_own_fd). */
bool vhd_rpc_owns_fd(const struct vhd_rpc *r, int fd);

/*
 * vhd_rpc_listen - serve the API on a Unix socket at path (mode 0600; a
 * stale socket is replaced, a live one is -EADDRINUSE) from the control loop.
 * 0, or -errno with a one-line reason in err.
 */
int vhd_rpc_listen(struct vhd_rpc *r, const char *path, char *err, size_t errlen);

/* The listening socket's path and an O_PATH fd of its directory (-1 without vhd_rpc_listen). */
const char *vhd_rpc_path(const struct vhd_rpc *r);
int vhd_rpc_dir_fd(const struct vhd_rpc *r);

/*
 * vhd_rpc_handle - one request (JSON text, len bytes, no NUL needed): run
 * it and return the response object's text (malloc'd, no newline), or NULL
 * for a notification (a request without an id) or when out of memory. A
 * blk add with a backend to open (not null) goes through ops.open_blk too:
 * answered at once with "opening": true, the device joins the table once
 * its backend has opened, and a failure then is logged (nobody is
 * answered); other adds run synchronously.
 * Control thread.
 */
char *vhd_rpc_handle(struct vhd_rpc *r, const char *req, size_t len);

/* SIGUSR2: resume every paused blk device (werror/rerror=stop). */
void vhd_rpc_resume_all(struct vhd_rpc *r);

/* SIGUSR1: log every device's counters. */
void vhd_rpc_log_counters(struct vhd_rpc *r, const char *why);

/* Number of devices in the table. */
unsigned vhd_rpc_ndevices(const struct vhd_rpc *r);

/*
 * vhd_rpc_device_at - the i-th device of the table (i < vhd_rpc_ndevices;
 * the order changes when a device is removed): its name, kind, KEY=VALUE
 * text as given, and handle. Pointers valid until it is removed. Control
 * thread (daemon/reload.c).
 */
void vhd_rpc_device_at(const struct vhd_rpc *r, unsigned i, const char **name, bool *net,
                       const char **spec, struct vhd_device **dev);

/*
 * vhd_rpc_destroy_devices - stop and destroy every device of the table (as
 * a forced removal does) and empty it. Control thread.
 */
void vhd_rpc_destroy_devices(struct vhd_rpc *r);

/*
 * vhd_rpc_free - close every connection and the listening socket (its file
 * removed) and forget the table; the devices themselves stay in the context
 * (vhd_ctx_destroy frees them, and reports adds still opening as cancelled:
 * their bookkeeping outlives r until then). NULL is fine.
 */
void vhd_rpc_free(struct vhd_rpc *r);

#endif /* VHD_RPC_H */
