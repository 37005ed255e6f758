/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The control thread's event loop: one epoll set of fds (listening sockets,
 * vhost-user connections, later the management socket), each with a
 * callback, run until stopped. Stopping is async-signal-safe (an eventfd),
 * so a SIGINT/SIGTERM handler can end the loop.
 *
 * Threading: everything but vhd_ctl_stop() runs on the thread that runs the
 * loop (the control thread).
 */
#ifndef VHD_CTL_H
#define VHD_CTL_H

#include <stdbool.h>
#include <stdint.h>

struct vhd_ctl;
struct vhd_ctl_src;

/* Callback: `events` is the epoll event mask that fired (EPOLLIN, EPOLLHUP, ...). */
typedef void (*vhd_ctl_fn)(void *opaque, uint32_t events);

/* Create a loop. 0 and *out, or -errno. */
int vhd_ctl_new(struct vhd_ctl **out);

/* Free the loop and any sources still registered (their fds are not closed). NULL is fine. */
void vhd_ctl_free(struct vhd_ctl *ctl);

/*
 * vhd_ctl_add - watch fd for `events` (EPOLLIN, EPOLLOUT; level-triggered)
 * and call fn(opaque, events) from the loop. The fd stays owned by the
 * caller, who must vhd_ctl_del() the source before closing it.
 * 0 and *out (may be NULL if the caller never removes it), or -errno.
 */
int vhd_ctl_add(struct vhd_ctl *ctl, int fd, uint32_t events, vhd_ctl_fn fn, void *opaque,
                struct vhd_ctl_src **out);

/* Change the watched events. 0 or -errno. */
int vhd_ctl_mod(struct vhd_ctl_src *src, uint32_t events);

/*
 * vhd_ctl_del - stop watching and forget the source. Safe from any callback,
 * including the source's own and for a source whose event is pending in the
 * current batch (it will not be called). NULL is fine.
 */
void vhd_ctl_del(struct vhd_ctl_src *src);

/*
 * vhd_ctl_run_once - wait up to timeout_ms (-1: forever) for events and
 * dispatch them. Returns the number of callbacks run (0 on timeout or when
 * the wake-up was a stop request), or -errno.
 */
int vhd_ctl_run_once(struct vhd_ctl *ctl, int timeout_ms);

/*
 * vhd_ctl_run - dispatch until vhd_ctl_stop(). A stop requested before the
 * call makes it return at once. Consumes the stop request. 0 or -errno.
 */
int vhd_ctl_run(struct vhd_ctl *ctl);

/* The loop's epoll fd: readable when vhd_ctl_run_once(ctl, 0) has work. Owned by ctl. */
int vhd_ctl_fd(const struct vhd_ctl *ctl);

/* Ask vhd_ctl_run to return. Any thread, and async-signal-safe. */
void vhd_ctl_stop(struct vhd_ctl *ctl);

/* Has a stop been requested and not yet consumed by vhd_ctl_run? */
bool vhd_ctl_stop_requested(const struct vhd_ctl *ctl);

#endif /* VHD_CTL_H */
