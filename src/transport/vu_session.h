/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The one front-end session of a device as its listener (vu_server.c) and
 * its connector (vu_client.c) both keep it: started over a connected
 * socket and watched in the control loop; ended on EOF, a protocol error or
 * at free. A session whose queues cannot be stopped disables the device for
 * good (no further session is started).
 *
 * Threading: control thread only.
 */
#ifndef VHD_VU_SESSION_H
#define VHD_VU_SESSION_H

#include <stdbool.h>
#include <stddef.h>

#include "ctl.h"
#include "runtime/dev.h"
#include "vu_conn.h"

struct vhd_vu_session {
    struct vhd_vu_conn *conn; /* current session or NULL */
    struct vhd_ctl_src *src;  /* its socket's watch in the control loop */
    unsigned count;           /* sessions started */
    bool disabled;            /* a queue could not be stopped: the device is unusable */
};

/* Why vhd_vu_session_start failed. */
enum vhd_vu_session_step {
    VHD_VU_SESSION_CONN,  /* vhd_vu_conn_new */
    VHD_VU_SESSION_WATCH, /* vhd_ctl_add */
};

/*
 * vhd_vu_session_start - start a session on dev over the connected stream
 * socket fd (taken, also on failure) and watch it: fn(opaque) runs when it
 * is readable. 0, or -errno with *failed naming the step that failed.
 */
int vhd_vu_session_start(struct vhd_vu_session *s, struct vhd_ctl *ctl, struct vhd_dev *dev, int fd,
                         vhd_ctl_fn fn, void *opaque, enum vhd_vu_session_step *failed);

/*
 * vhd_vu_session_end - end the current session: 1 when one ended, 0 when
 * there was none, -EBUSY when a queue could not be stopped (the device is
 * disabled now; logged as an error).
 */
int vhd_vu_session_end(struct vhd_vu_session *s, const struct vhd_dev *dev);

/* The socket is readable: serve it; false when the session must end. */
bool vhd_vu_session_serve(struct vhd_vu_session *s);

/* vhd_vu_conn_check_queues of the current session; false without one. */
bool vhd_vu_session_check_queues(struct vhd_vu_session *s);

/*
 * vhd_vu_set_err - the one-line reason of a failed vhd_vu_server_new or
 * vhd_vu_client_new into err (errlen bytes); nothing when err is NULL.
 */
void vhd_vu_set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* VHD_VU_SESSION_H */
