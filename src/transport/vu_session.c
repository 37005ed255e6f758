/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A device's front-end session, shared by the server and client modes
 * (see vu_session.h).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/epoll.h>

#include "runtime/log.h"
#include "vu_session.h"

void vhd_vu_set_err(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;

    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int vhd_vu_session_start(struct vhd_vu_session *s, struct vhd_ctl *ctl, struct vhd_dev *dev, int fd,
                         vhd_ctl_fn fn, void *opaque, enum vhd_vu_session_step *failed)
{
    struct vhd_vu_conn *c = NULL;
    int rc = vhd_vu_conn_new(dev, fd, &c); /* takes fd */
    if (rc < 0) {
        *failed = VHD_VU_SESSION_CONN;
        return rc;
    }
    rc = vhd_ctl_add(ctl, vhd_vu_conn_fd(c), EPOLLIN, fn, opaque, &s->src);
    if (rc < 0) {
        (void)vhd_vu_conn_free(c);
        *failed = VHD_VU_SESSION_WATCH;
        return rc;
    }
    s->conn = c;
    vhd_vu_conn_set_ctl(c, ctl);
    s->count++;
    return 0;
}

int vhd_vu_session_end(struct vhd_vu_session *s, const struct vhd_dev *dev)
{
    if (!s->conn)
        return 0;
    vhd_ctl_del(s->src);
    s->src = NULL;
    int rc = vhd_vu_conn_free(s->conn);
    s->conn = NULL;
    if (rc == -EBUSY) {
        s->disabled = true;
        vhd_log(VHD_LOG_ERROR, "%s: device disabled: a queue could not be stopped", dev->name);
        return rc;
    }
    return 1;
}

bool vhd_vu_session_serve(struct vhd_vu_session *s)
{
    return !s->conn || vhd_vu_conn_process(s->conn) >= 0;
}

bool vhd_vu_session_check_queues(struct vhd_vu_session *s)
{
    return s->conn ? vhd_vu_conn_check_queues(s->conn) : false;
}
