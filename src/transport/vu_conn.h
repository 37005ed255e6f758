/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * One vhost-user front-end session on a struct vhd_dev: validates each
 * message against a per-request table before any handler runs, applies it to
 * the device and its queues (attaching/detaching them to runtime workers),
 * and replies. Spec: qemu docs/interop/vhost-user.rst.
 */
#ifndef VHD_VU_CONN_H
#define VHD_VU_CONN_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/dev.h"
#include "spec/vhost_user.h"

/* Short name of a front-end request for logs ("SET_MEM_TABLE"), "UNKNOWN" otherwise. */
const char *vu_request_name(uint32_t request);

/*
 * Threading: control thread only. A queue is touched by the session only
 * while it is detached from its worker (vhd_rt_detach .. vhd_rt_attach).
 *
 * Error policy (every failure logs one rate-limited line with the device
 * name and request):
 *  - framing errors (short stream, size above VU_MAX_PAYLOAD, more than 8
 *    fds), a version other than 1 or unknown/REPLY flag bits in a request:
 *    the session ends (the connection is closed);
 *  - a request that is unknown, not negotiated, malformed (size, fd count,
 *    ring index) or whose handler fails gets an error reply when the protocol
 *    has one: a non-zero u64 under REPLY_ACK + NEED_REPLY, an empty
 *    GET_CONFIG reply; otherwise the session ends, because the front-end
 *    could not tell that the request failed.
 * Every fd received is either kept by a handler or closed before the next
 * message is read.
 */
struct vhd_vu_conn;

/* Default bound on draining a queue's in-flight I/O when it is detached. */
#define VHD_VU_DETACH_TIMEOUT_MS 10000

/*
 * vhd_vu_conn_new - start a session on dev over the connected stream socket
 * fd, which the session takes (made non-blocking and close-on-exec; closed
 * by vhd_vu_conn_free, also on failure here). dev must have no session and
 * all its queues detached: the session (re)initialises every queue's control
 * state (no ring started or enabled, no fds, no memory table).
 * dev->ops, name, num_queues, queues, queue_worker (may be NULL: round
 * robin) and rt must be set. 0 and *out, or -errno.
 */
int vhd_vu_conn_new(struct vhd_dev *dev, int fd, struct vhd_vu_conn **out);

/*
 * vhd_vu_conn_free - end the session (disconnect): detach and stop every
 * queue (in-flight I/O completes), queue_fini, ops->reset, free the memory
 * table, close every fd, reset the negotiated state; the device is then
 * ready for the next session. Returns 0, or -EBUSY when a queue could not be
 * taken back from its worker within the timeout: the device and its memory
 * are then left as they are (leaked, never freed under a running worker)
 * and the device must not be given to another session. NULL is fine.
 */
int vhd_vu_conn_free(struct vhd_vu_conn *c);

/* The session's socket (for the event loop). */
int vhd_vu_conn_fd(const struct vhd_vu_conn *c);

/* The device it serves. */
struct vhd_dev *vhd_vu_conn_dev(const struct vhd_vu_conn *c);

/*
 * vhd_vu_conn_process - the socket is readable: receive and handle the
 * messages available (a bounded number per call, for fairness between
 * devices; level-triggered polling calls again). Returns 0 to keep the
 * session, or a negative errno when it must end (-ECONNRESET: the front-end
 * closed it; anything else: protocol error, already logged).
 */
int vhd_vu_conn_process(struct vhd_vu_conn *c);

/*
 * vhd_vu_conn_handle - validate and handle one received message: hdr, its
 * payload (hdr->size bytes; payload must point to a whole union), and the
 * fds that came with it, which the call consumes (each kept or closed, also
 * on error; nfds above VHOST_USER_MAX_FDS is a protocol error). Sends the
 * reply, if any, on the session's socket. Returns 0, or -errno when the
 * session must end. This is vhd_vu_conn_process minus the socket reading,
 * exposed for the fuzzer.
 */
int vhd_vu_conn_handle(struct vhd_vu_conn *c, const struct vu_hdr *hdr,
                       const union vu_payload *payload, int *fds, unsigned nfds);

/*
 * vhd_vu_conn_config_changed - tell the front-end that config space changed
 * (BACKEND_CONFIG_CHANGE_MSG on the SET_BACKEND_REQ_FD channel; spec "Back-end
 * message types"). Needs BACKEND_REQ and CONFIG negotiated and a channel fd.
 * Never waits for a reply (NEED_REPLY is not set: a front-end blocked on
 * our reply to one of its own requests could otherwise deadlock with us).
 * While the device is suspended (every ring stopped; spec "Suspended device
 * state": no message to the front-end) the notification waits, and goes
 * once a ring has started (after the message that started it): 0 then.
 * 0, -ENOTCONN (no channel / not negotiated), or the send error.
 */
int vhd_vu_conn_config_changed(struct vhd_vu_conn *c);

/*
 * vhd_vu_conn_set_broken - the device entered an error state that needs a
 * reset: set dev->broken (GET_STATUS reports VIRTIO_STATUS_NEEDS_RESET) and,
 * the first time, log `why` and send a config change notification (virtio
 * 1.2, 2.1.2: after setting DEVICE_NEEDS_RESET the device sends a
 * configuration change notification).
 */
void vhd_vu_conn_set_broken(struct vhd_vu_conn *c, const char *why);

/*
 * vhd_vu_conn_check_queues - look for queues a worker marked broken
 * (vhd_queue.broken; the runtime signals vhd_rt_event_fd()) and, if any,
 * signal each one's SET_VRING_ERR eventfd (once per ring start) and mark the
 * device broken as vhd_vu_conn_set_broken() does. Call it when the runtime's
 * event fd fires (GET_STATUS also calls it). Returns true when a broken queue
 * was found.
 */
bool vhd_vu_conn_check_queues(struct vhd_vu_conn *c);

/*
 * How long an IOTLB miss may stay unanswered before the device is broken
 * (NEEDS_RESET). QEMU answers a miss within microseconds or never (an IOVA
 * its vIOMMU does not map: a guest bug): 5 s bounds the second case well
 * above any scheduling hiccup of the first.
 */
#define VHD_VU_IOTLB_MISS_TIMEOUT_MS 5000

struct vhd_ctl;

/*
 * vhd_vu_conn_set_ctl - the control loop the session runs in, where it may
 * watch fds of its own (the IOTLB miss timer). Optional; without it an
 * unanswered miss is bounded only when the session next gets a message or
 * a runtime event.
 */
void vhd_vu_conn_set_ctl(struct vhd_vu_conn *c, struct vhd_ctl *ctl);

/* Bound on vhd_rt_detach waits (default VHD_VU_DETACH_TIMEOUT_MS). */
void vhd_vu_conn_set_detach_timeout(struct vhd_vu_conn *c, int timeout_ms);

/* Virtio feature bits offered in GET_FEATURES (device bits filtered, plus PROTOCOL_FEATURES). */
uint64_t vhd_vu_offered_features(const struct vhd_dev *dev);

/* Protocol feature bits offered in GET_PROTOCOL_FEATURES. */
uint64_t vhd_vu_offered_protocol_features(const struct vhd_dev *dev);

#endif /* VHD_VU_CONN_H */
