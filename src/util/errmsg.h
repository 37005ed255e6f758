/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The one-line error message of a failed setup call: most constructors
 * (devices, backends, endpoints) take a caller's buffer and fill it with
 * why they failed, next to the -errno they return.
 */
#ifndef VHD_UTIL_ERRMSG_H
#define VHD_UTIL_ERRMSG_H

#include <stddef.h>

/*
 * vhd_errf - format the reason into err (errlen bytes, truncated; nothing
 * when err is NULL or errlen 0) and return rc, so a failure path is one
 * statement: `return vhd_errf(err, errlen, -EINVAL, "bad size %s", s);`.
 * Any thread.
 */
int vhd_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif /* VHD_UTIL_ERRMSG_H */
