/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd's sandbox: once setup is done (sockets bound, images open, workers
 * running), drop to an unprivileged user or, as root without one, drop every
 * capability not needed any more, then confine every thread of the process
 * to the syscalls the control thread and the workers need, with a seccomp
 * filter (libseccomp). The allowed syscalls and the reason for each are one
 * table in sandbox.c. Also the fd limit, raised at start.
 */
#ifndef VHD_SANDBOX_H
#define VHD_SANDBOX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum vhd_sandbox_mode {
    VHD_SANDBOX_OFF, /* no filter */
    VHD_SANDBOX_ON,  /* a syscall outside the table kills the process (SIGSYS) */
    VHD_SANDBOX_LOG, /* a syscall outside the table is allowed and logged by the kernel */
};

struct vhd_sandbox_opts {
    enum vhd_sandbox_mode mode;
    /* Drop to this user after setup: a name, or UID[:GID]. NULL: stay who we are. */
    const char *user;
    /* Files handed to that user first (our listening sockets, so its front-end can connect). */
    const char *const *chown_paths;
    /* Per path (NULL: none): its group was set (socket-group=): chown the owner only. */
    const bool *chown_keep_group;
    unsigned nchown;
    /* A device is in client mode: allow its rows (VHD_SANDBOX_F_CLIENT). */
    bool client_mode;
    /* Directory fds of our listening sockets (vhd_vu_server_dir_fd): unlinkat only there. */
    const int *unlink_dirs;
    unsigned nunlink_dirs;
    /* A block device has the nbd backend: allow its rows (VHD_SANDBOX_F_NBD). */
    bool nbd;
    /*
     * One reaches its server over TCP (nbd://), or --rpc-nbd-tcp: the inet
     * socket rows too (VHD_SANDBOX_F_NBD_TCP).
     */
    bool nbd_tcp;
    /*
     * --rpc: devices come and go at runtime: the rows of VHD_SANDBOX_F_RPC,
     * and those of client mode and nbd over a Unix socket (a device added
     * later may use them); nbd over TCP only with nbd_tcp (the filter cannot
     * tell a TCP listener's bind from a Unix socket's).
     * Capabilities are dropped as for the devices of the command line only.
     */
    bool rpc;
};

struct vhd_opt_access;
struct vhd_endpoint_access;

/*
 * vhd_sandbox_resolve_access - a device's socket-mode=, socket-group=,
 * allow-uid= and allow-gid= (names or numeric ids; names are looked up in
 * the user and group databases) into the device's access settings
 * (struct vhd_endpoint_access, include/vhostd/device.h).
 * Returns 0, or -errno with a one-line reason in err (an unknown name).
 */
int vhd_sandbox_resolve_access(const struct vhd_opt_access *in, struct vhd_endpoint_access *out,
                               char *err, size_t errlen);

/*
 * vhd_sandbox_check_runtime_blk - may blk device b be added after start-up
 * (a --rpc add, a SIGHUP reload's) under the seccomp filter? The URI is read
 * with libxml2's parser, as libnbd reads it: only nbd:// and nbd+unix://, no
 * user information, and an nbd:// server given by its address (what
 * getaddrinfo takes with AI_NUMERICHOST, or [IPv6]): resolving a host name
 * (netlink, DNS over UDP), vsock and TLS (certificates read by the workers)
 * need calls the filter forbids, and would kill vhostd; TCP at all needs
 * tcp (the filter's VHD_SANDBOX_F_NBD_TCP rows). 0, or -EPERM with a
 * one-line reason in err.
 */
struct vhd_opt_blk;
int vhd_sandbox_check_runtime_blk(const struct vhd_opt_blk *b, bool tcp, char *err, size_t errlen);

/* Does b reach an NBD server over TCP (an nbd:// URI)? */
bool vhd_sandbox_blk_uses_tcp(const struct vhd_opt_blk *b);

/*
 * vhd_sandbox_raise_nofile - raise the soft fd limit (RLIMIT_NOFILE) to the
 * hard one, logging it: each vhost-user session holds a few fds per queue and
 * per memory region, and the usual soft limit of 1024 runs out at a few dozen
 * devices. Call first thing in main. 0 or -errno (logged; not fatal).
 */
int vhd_sandbox_raise_nofile(void);

/*
 * vhd_sandbox_drop_caps - keep only the capabilities in keep (bits
 * 1 << CAP_*), in the permitted and effective sets; clear the ambient set;
 * with CAP_SETPCAP, also shrink the bounding set to keep and lock
 * SECBIT_NOROOT (uid 0 gets nothing back from an execve). Checks the result.
 * Capabilities are per thread: every other thread of the process drops its
 * own through a signal (a thread that blocks it, as librbd's do, is named
 * in a warning and keeps them). Returns 0, or -errno with a one-line reason
 * in err. Control thread, before the seccomp filter.
 */
int vhd_sandbox_drop_caps(uint64_t keep, char *err, size_t errlen);

/*
 * vhd_sandbox_enter - the last step of setup: drop to o->user when set, else
 * drop every capability (all but CAP_DAC_OVERRIDE with o->client_mode or o->nbd) and
 * log it, then install the filter for o->mode on every thread
 * (SECCOMP_FILTER_FLAG_TSYNC).
 * Call it from any one thread once every thread that will ever exist has
 * been created: the filter forbids creating threads, but with o->rpc (the
 * open threads of runtime adds: clone with CLONE_THREAD only). Irreversible.
 * Returns 0, or -errno with a one-line reason in err.
 */
int vhd_sandbox_enter(const struct vhd_sandbox_opts *o, char *err, size_t errlen);

/*
 * vhd_sandbox_drop_user - resolve user (a name, or UID[:GID]), chown each of
 * paths to it (the links themselves, never their targets; the owner only
 * where keep_group[i] is set: a socket-group= the user must not undo), then set the
 * supplementary groups to just its group, the gid and the uid (real,
 * effective and saved), and check that the old ids cannot be taken back.
 * Returns 0, or -errno with a one-line reason in err.
 */
int vhd_sandbox_drop_user(const char *user, const char *const *paths, const bool *keep_group,
                          unsigned npaths, char *err, size_t errlen);

/*
 * vhd_sandbox_apply - install vhostd's filter on every thread of the process.
 * VHD_SANDBOX_OFF does nothing. Returns 0, or -errno (-ENOSYS: no seccomp
 * in this kernel; -ESRCH: a thread could not be synchronised).
 */
int vhd_sandbox_apply(enum vhd_sandbox_mode mode);

/*
 * Rows that only a feature needs, installed only when it is in use:
 * VHD_SANDBOX_F_CLIENT: client mode connects out (socket, connect, the back-off timer).
 * VHD_SANDBOX_F_NBD: the nbd block backend's workers (re)connect to the NBD server.
 * VHD_SANDBOX_F_RPC: --rpc adds devices at runtime (images opened, sockets bound, the
 * open thread started); with it clone3 fails with ENOSYS (its flags are out of the
 * filter's reach: glibc then uses clone, whose flags the CLONE_THREAD row checks).
 * vhd_sandbox_apply(mode) is vhd_sandbox_apply_with(mode, 0).
 */
#define VHD_SANDBOX_F_CLIENT 1u
#define VHD_SANDBOX_F_NBD    2u
#define VHD_SANDBOX_F_RPC    4u
/* VHD_SANDBOX_F_NBD_TCP: TCP (inet stream) sockets for nbd://; never implied by --rpc. */
#define VHD_SANDBOX_F_NBD_TCP 8u
int vhd_sandbox_apply_with(enum vhd_sandbox_mode mode, unsigned flags);

/*
 * vhd_sandbox_apply_dirs - vhd_sandbox_apply_with, plus unlinkat(dirfd,
 * name, 0) allowed for each of dirs[0..ndirs) (our sockets' directories).
 * The filter cannot read the name: see the unlinkat row in sandbox.c for
 * what that leaves.
 */
int vhd_sandbox_apply_dirs(enum vhd_sandbox_mode mode, unsigned flags, const int *dirs,
                           unsigned ndirs);

/* One row of the allow table: syscall, optional argument condition, and why. */
struct vhd_sandbox_rule {
    const char *name;    /* syscall name */
    int nr;              /* its number on this architecture */
    int arg;             /* -1: any arguments; else the argument checked */
    int op;              /* how: one of VHD_SANDBOX_ARG_* */
    unsigned long mask;  /* VHD_SANDBOX_ARG_MASKED_EQ: the bits compared */
    unsigned long value; /* what the argument (or its masked bits) must equal */
    const char *why;     /* one line */
    /* A second condition, on another argument, that must hold too: (and_arg & and_mask) ==
     * and_value. */
    bool has_and;
    int and_arg;
    unsigned long and_mask, and_value;
    unsigned only_with; /* 0: always; else the VHD_SANDBOX_F_* flag that installs this row */
};

#define VHD_SANDBOX_ARG_EQ        0 /* argument == value */
#define VHD_SANDBOX_ARG_MASKED_EQ 1 /* (argument & mask) == value */
#define VHD_SANDBOX_ARG_SELF_PID  2 /* argument == our pid (value unused) */
#define VHD_SANDBOX_ARG_DIRFD     3 /* argument == one of the directory fds (apply_dirs) */

/* The table (for tests and documentation); *n gets its length. */
const struct vhd_sandbox_rule *vhd_sandbox_rules(size_t *n);

#endif /* VHD_SANDBOX_H */
