/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user client mode: the device connects to a front-end's listening
 * Unix socket (QEMU -chardev socket,server=on; cloud-hypervisor; DPDK
 * virtio-user server=1) instead of listening itself, and connects again
 * with exponential back-off whenever a connect fails or the session ends.
 * Retries are driven by a timerfd in the control loop: the control thread
 * never sleeps or blocks on a connect.
 *
 * Threading: control thread only.
 */
#ifndef VHD_VU_CLIENT_H
#define VHD_VU_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#include "ctl.h"
#include "runtime/dev.h"
#include "vu_conn.h"
#include "vu_sock.h"

/* Back-off defaults: the first retry after 50 ms, doubling up to 2 s. */
#define VHD_VU_CLIENT_RECONNECT_MIN_MS 50u
#define VHD_VU_CLIENT_RECONNECT_MAX_MS 2000u
/*
 * A session that lasted at least this long counts as successful: the next
 * reconnect starts from the shortest delay again. A front-end that accepts
 * and drops us at once keeps the delay growing, so it cannot make us spin.
 */
#define VHD_VU_CLIENT_STABLE_MS 1000u

struct vhd_vu_client;

/* Retry policy. Zero fields take the defaults above; min is clamped to max. */
struct vhd_vu_client_opts {
    unsigned reconnect_min_ms;
    unsigned reconnect_max_ms;
    /*
     * Only the allow-lists apply (the socket file is the front-end's): a
     * front-end whose credentials at listen() are not allowed is hung up on
     * and retried like a failed connect (its socket may have been replaced).
     */
    struct vhd_vu_sock_access access;
};

/*
 * vhd_vu_client_new - serve dev by connecting to the front-end's socket at
 * path. The first attempt runs from the control loop as soon as it runs;
 * failures are retried (ENOENT, ECONNREFUSED, a full backlog, anything else)
 * with the delay doubling from min to max. dev must be set up as
 * vhd_vu_conn_new() requires and outlive the client. o may be NULL.
 * Returns the client, or NULL with a one-line reason in err (errlen bytes,
 * may be 0) and errno set (ENAMETOOLONG: the path does not fit sun_path).
 */
struct vhd_vu_client *vhd_vu_client_new(struct vhd_ctl *ctl, struct vhd_dev *dev, const char *path,
                                        const struct vhd_vu_client_opts *o, char *err,
                                        size_t errlen);

/*
 * vhd_vu_client_free - end the session if any (queues stopped, device
 * reset), stop retrying, close everything. The front-end's socket file is
 * never touched. NULL is fine.
 */
void vhd_vu_client_free(struct vhd_vu_client *cl);

/* The current session, or NULL while (re)connecting. */
struct vhd_vu_conn *vhd_vu_client_conn(const struct vhd_vu_client *cl);

/* As vhd_vu_server_check_queues. */
bool vhd_vu_client_check_queues(struct vhd_vu_client *cl);

/* The front-end's socket path. */
const char *vhd_vu_client_path(const struct vhd_vu_client *cl);

/*
 * Diagnostics and tests: connect attempts made, sessions started, the delay
 * before the next attempt (ms; 0 while connected), and whether the device
 * was disabled because a queue could not be stopped (no more attempts).
 */
unsigned vhd_vu_client_attempts(const struct vhd_vu_client *cl);
unsigned vhd_vu_client_sessions(const struct vhd_vu_client *cl);
unsigned vhd_vu_client_next_delay_ms(const struct vhd_vu_client *cl);
bool vhd_vu_client_disabled(const struct vhd_vu_client *cl);

#endif /* VHD_VU_CLIENT_H */
