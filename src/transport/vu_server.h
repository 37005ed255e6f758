/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhost-user server mode: a listening Unix socket per device, served from the
 * control loop (struct vhd_ctl). One front-end session at a time per device;
 * a second connection while one is active is refused (closed, one log line);
 * after a disconnect the device is reset and waits for the next front-end.
 *
 * Threading: control thread only.
 */
#ifndef VHD_VU_SERVER_H
#define VHD_VU_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "ctl.h"
#include "runtime/dev.h"
#include "vu_conn.h"
#include "vu_sock.h"

struct vhd_vu_server;

/*
 * vhd_vu_server_new - listen on the Unix socket `path` for dev's front-end.
 * An existing socket file is checked first: if a live server answers on it
 * the call fails ("socket path in use"); a stale one (nobody listening) is
 * removed. Any other existing file is an error (never unlinked). dev must
 * be set up as vhd_vu_conn_new() requires and outlive the server. The
 * socket file is 0600 whatever the umask; any peer that can reach it is
 * served (vhd_vu_server_new_access for other settings).
 * Returns the server, or NULL with a one-line reason in err (errlen bytes,
 * may be 0) and errno set.
 */
struct vhd_vu_server *vhd_vu_server_new(struct vhd_ctl *ctl, struct vhd_dev *dev, const char *path,
                                        char *err, size_t errlen);

/*
 * vhd_vu_server_new_access - vhd_vu_server_new with access settings (acc may
 * be NULL: the defaults). The socket file gets acc->mode (default 0600) and
 * acc->gid whatever the umask, before listen(): no front-end can connect
 * before they are in place. Every accepted connection is checked against
 * acc's allow-lists (SO_PEERCRED) and closed at once when not allowed. A
 * directory writable by every user without the sticky bit is warned about.
 * acc is copied.
 */
struct vhd_vu_server *vhd_vu_server_new_access(struct vhd_ctl *ctl, struct vhd_dev *dev,
                                               const char *path,
                                               const struct vhd_vu_sock_access *acc, char *err,
                                               size_t errlen);

/*
 * vhd_vu_server_new_fd - serve dev's front-ends on listen_fd, a listening
 * AF_UNIX stream socket made by someone else (the vhost-user spec's --fd):
 * nothing is bound, chmod'ed or unlinked; path only names the endpoint.
 * The server accepts on a duplicate of listen_fd (close-on-exec,
 * non-blocking: the flag is shared with listen_fd) and closes it at free;
 * the caller keeps listen_fd. acc's allow-lists apply, its mode and gid
 * must be 0. NULL with errno ENOTSOCK (not a Unix stream socket), EINVAL
 * (not listening, or mode/gid given) or another errno, and err.
 */
struct vhd_vu_server *vhd_vu_server_new_fd(struct vhd_ctl *ctl, struct vhd_dev *dev,
                                           const char *path, int listen_fd,
                                           const struct vhd_vu_sock_access *acc, char *err,
                                           size_t errlen);

/*
 * vhd_vu_server_free - end the session if any (queues stopped, device
 * reset), stop listening, and unlink the socket (only if the path still
 * names the socket we created). NULL is fine.
 */
void vhd_vu_server_free(struct vhd_vu_server *srv);

/* The current session, or NULL when waiting for a front-end. */
struct vhd_vu_conn *vhd_vu_server_conn(const struct vhd_vu_server *srv);

/*
 * vhd_vu_server_check_queues - the runtime's event fd (vhd_rt_event_fd) fired:
 * let the session look for broken queues (vhd_vu_conn_check_queues). No-op
 * without a session. Returns true when a broken queue was found.
 */
bool vhd_vu_server_check_queues(struct vhd_vu_server *srv);

/* The socket path. */
const char *vhd_vu_server_path(const struct vhd_vu_server *srv);

/*
 * The O_PATH fd of the socket's directory, through which the socket is
 * removed at free (unlinkat): a sandbox may allow unlinkat on it only.
 * -1 for a server on an inherited socket (vhd_vu_server_new_fd).
 */
int vhd_vu_server_dir_fd(const struct vhd_vu_server *srv);

/*
 * Sessions accepted so far (diagnostics and tests), and whether the device
 * was disabled because a queue could not be stopped (it then refuses
 * every new connection).
 */
unsigned vhd_vu_server_sessions(const struct vhd_vu_server *srv);
bool vhd_vu_server_disabled(const struct vhd_vu_server *srv);

#endif /* VHD_VU_SERVER_H */
