/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd's sandbox (sandbox.h): the table of syscalls vhostd's threads may
 * make once setup is done, each with the reason it is needed, the seccomp
 * filter built from it with libseccomp, the drop to an unprivileged user or,
 * as root without one, of every capability, and the fd limit at start.
 */
#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/fs.h>
#include <linux/futex.h>
#include <linux/capability.h>
#include <linux/if_tun.h>
#include <linux/securebits.h>
#include <arpa/inet.h>
#include <libxml/uri.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "options.h"
#include "sandbox.h"
#include "vhostd/device.h"
#include "vhostd/log.h"

_Static_assert(VHD_OPT_MAX_ALLOW == VHD_ENDPOINT_MAX_IDS, "allow-list sizes");

/*
 * The allow table. Everything vhostd does after setup, found by reading the
 * code and confirmed by running the guest test matrix and the demo under
 * strace -f and under --sandbox=log (see docs/USER-GUIDE.md, "Sandboxing").
 * Not here, on purpose: open/openat/creat (every file is open before the
 * filter), socket and connect unless a device is in client mode (then
 * AF_UNIX stream sockets only), bind/listen (listening sockets exist),
 * unlink and unlinkat of any directory but our sockets' (fds given to
 * vhd_sandbox_apply_dirs),
 * clone/clone3/fork/vfork/execve (workers exist; nothing is
 * spawned), io_uring_setup/io_uring_register (rings exist), ptrace, kill,
 * prctl, setuid and friends, mount and namespaces, bpf, perf_event_open.
 * With --rpc (VHD_SANDBOX_F_RPC), devices are created at runtime: openat,
 * bind/listen of Unix sockets, eventfds, timers and the open thread (clone
 * of a thread only) come back, see "runtime devices" below; exec, fork,
 * io_uring_setup, ptrace, kill, prctl, setuid, mount, bpf... stay out.
 *
 * A syscall may appear on several rows: rows are alternatives (the call is
 * allowed when any of its rows matches). A new feature that needs a syscall
 * at run time adds a row here, with its reason.
 */
#define ANY(sys, reason)                                            \
    {                                                               \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = -1, .why = reason \
    }
#define ARG_EQ(sys, argi, val, reason)                                                            \
    {                                                                                             \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = argi, .op = VHD_SANDBOX_ARG_EQ, .value = (val), \
        .why = reason                                                                             \
    }
#define ARG_MASKED(sys, argi, msk, val, reason)                                          \
    {                                                                                    \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = argi, .op = VHD_SANDBOX_ARG_MASKED_EQ, \
        .mask = (msk), .value = (val), .why = reason                                     \
    }
/* Two argument conditions, both required; only: 0 or the VHD_SANDBOX_F_* flag that installs it. */
#define ARG_MASKED_AND_MASKED(sys, argi, msk, val, argj, mskj, valj, only, reason)       \
    {                                                                                    \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = argi, .op = VHD_SANDBOX_ARG_MASKED_EQ, \
        .mask = (msk), .value = (val), .why = reason, .has_and = true, .and_arg = argj,  \
        .and_mask = (mskj), .and_value = (valj), .only_with = (only)                     \
    }
/* Any arguments, installed only with VHD_SANDBOX_F_CLIENT. */
#define CLIENT_ANY(sys, reason)                                      \
    {                                                                \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = -1, .why = reason, \
        .only_with = VHD_SANDBOX_F_CLIENT                            \
    }
/* Any arguments, installed only with VHD_SANDBOX_F_NBD. */
#define NBD_ANY(sys, reason)                                         \
    {                                                                \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = -1, .why = reason, \
        .only_with = VHD_SANDBOX_F_NBD                               \
    }
/* Any arguments, installed only with VHD_SANDBOX_F_RPC. */
#define RPC_ANY(sys, reason)                                         \
    {                                                                \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = -1, .why = reason, \
        .only_with = VHD_SANDBOX_F_RPC                               \
    }
/* (argi & msk) == val, installed only with VHD_SANDBOX_F_RPC. */
#define RPC_ARG_MASKED(sys, argi, msk, val, reason)                                      \
    {                                                                                    \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = argi, .op = VHD_SANDBOX_ARG_MASKED_EQ, \
        .mask = (msk), .value = (val), .why = reason, .only_with = VHD_SANDBOX_F_RPC     \
    }
/* Argument argi == val, installed only with VHD_SANDBOX_F_NBD. */
#define NBD_ARG_EQ(sys, argi, val, reason)                                                        \
    {                                                                                             \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = argi, .op = VHD_SANDBOX_ARG_EQ, .value = (val), \
        .why = reason, .only_with = VHD_SANDBOX_F_NBD                                             \
    }
#define ARG_SELF_PID(sys, argi, reason)                                                 \
    {                                                                                   \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = argi, .op = VHD_SANDBOX_ARG_SELF_PID, \
        .why = reason                                                                   \
    }
/* argi == value, installed only with VHD_SANDBOX_F_CLIENT. */
#define CLIENT_ARG_EQ(sys, argi, val, reason)                                                     \
    {                                                                                             \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = argi, .op = VHD_SANDBOX_ARG_EQ, .value = (val), \
        .why = reason, .only_with = VHD_SANDBOX_F_CLIENT                                          \
    }
/* argi is one of the directory fds given to vhd_sandbox_apply_dirs (one rule each), argj == 0. */
#define ARG_DIRFD_AND_ZERO(sys, argi, argj, reason)                                           \
    {                                                                                         \
        .name = #sys, .nr = SCMP_SYS(sys), .arg = argi, .op = VHD_SANDBOX_ARG_DIRFD,          \
        .why = reason, .has_and = true, .and_arg = argj, .and_mask = INT_BITS, .and_value = 0 \
    }

/* Built with a sanitizer? Its runtime makes a few calls of its own (see the end of the table). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define VHD_SANDBOX_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define VHD_SANDBOX_SANITIZER 1
#endif
#endif
#ifndef VHD_SANDBOX_SANITIZER
#define VHD_SANDBOX_SANITIZER 0
#endif

/*
 * futex: the operation without its modifier flags (FUTEX_PRIVATE_FLAG,
 * FUTEX_CLOCK_REALTIME). The argument is an int: compare its 32 bits only.
 */
/* socket(): the domain and the type are ints; the type without SOCK_NONBLOCK / SOCK_CLOEXEC. */
#define INT_BITS       0xffffffffUL
#define SOCK_TYPE_BITS (INT_BITS & ~(unsigned long)(SOCK_NONBLOCK | SOCK_CLOEXEC))

#define FUTEX_OP_BITS (0xffffffffUL & ~(unsigned long)(FUTEX_PRIVATE_FLAG | FUTEX_CLOCK_REALTIME))

static const struct vhd_sandbox_rule sandbox_rules[] = {
    /* ---- event loops (control thread and workers) ---- */
    ANY(epoll_wait, "control loop and worker loops wait for events"),
    ANY(epoll_pwait, "the same, as some libcs implement epoll_wait"),
    ANY(epoll_ctl, "add/remove kick fds, sessions and listening sockets"),
    ANY(read, "eventfds (kicks, mailboxes, stop, runtime events), the signalfd, TAP frames"),
    ANY(write, "eventfds (calls, errors, wake-ups), log lines to stderr"),
    ANY(preadv2, "kicks read with RWF_NOWAIT: a front-end cannot make the read block"),
    ANY(timer_create, "each thread's eventfd-write guard (a timer signalling that thread)"),
    ANY(timer_settime, "arm/disarm the guard that interrupts a call-fd write that sleeps"),
    ANY(timer_delete, "a worker's guard timer at its exit"),
    ANY(io_uring_enter, "workers submit block I/O and reap completions"),
    /* ---- vhost-user sessions (control thread) ---- */
    ANY(accept4, "a front-end connects to a listening socket"),
    ANY(recvmsg, "vhost-user messages, with fds (SCM_RIGHTS)"),
    ANY(sendmsg, "vhost-user replies and back-end requests, with fds"),
    ANY(poll, "a reply waits (bounded) for room in the socket buffer"),
    /*
     * ---- client mode (vu_client.c): connect to the front-end, retry on a timer ----
     * Installed only when a device is in client mode: a daemon that only listens
     * keeps connect forbidden.
     */
    ARG_MASKED_AND_MASKED(socket, 0, INT_BITS, AF_UNIX, 1, SOCK_TYPE_BITS, SOCK_STREAM,
                          VHD_SANDBOX_F_CLIENT | VHD_SANDBOX_F_NBD,
                          "client mode, nbd: a Unix stream socket (front-end, NBD server)"),
    /*
     * The filter cannot read the address: any Unix stream socket the process
     * may reach by its path. The exact length of a struct sockaddr_un keeps
     * out abstract sockets (their name is the whole length: 108 bytes).
     */
    {.name = "connect",
     .nr = SCMP_SYS(connect),
     .arg = 2,
     .op = VHD_SANDBOX_ARG_EQ,
     .value = sizeof(struct sockaddr_un),
     .why = "client mode, nbd: connect to the front-end's or NBD server's socket (a full sun)",
     .only_with = VHD_SANDBOX_F_CLIENT | VHD_SANDBOX_F_NBD},
    ANY(timerfd_settime, "arm the reconnect back-off (client) and accept back-off (EMFILE) timers"),
    ANY(timerfd_create, "IOTLB miss timers; --rpc: connections' idle timers, back-off timers"),
    ARG_MASKED_AND_MASKED(getsockopt, 1, INT_BITS, SOL_SOCKET, 2, INT_BITS, SO_PEERCRED, 0,
                          "the front-end's credentials: allow-uid/allow-gid, log lines"),
    /*
     * ---- the nbd block backend (src/backend/nbd.c): libnbd on the workers ----
     * A worker connects when its first request comes and reconnects after the
     * server went away, both after setup. Installed only with an nbd device.
     * Not allowed: opening files (nbd.c resolves a host name at start-up;
     * TLS URIs need --sandbox off, options.c says so). A Unix socket: the
     * client-mode rows above (libnbd connects with a full sockaddr_un).
     */
    /*
     * TCP only with an nbd:// device (VHD_SANDBOX_F_NBD_TCP): with --rpc's bind
     * and listen rows, an inet socket could listen (the filter cannot read a
     * bind's address family), so --rpc alone never brings these rows.
     */
    ARG_MASKED_AND_MASKED(socket, 0, INT_BITS, AF_INET, 1, SOCK_TYPE_BITS, SOCK_STREAM,
                          VHD_SANDBOX_F_NBD_TCP, "nbd: a TCP socket to the NBD server (IPv4)"),
    ARG_MASKED_AND_MASKED(socket, 0, INT_BITS, AF_INET6, 1, SOCK_TYPE_BITS, SOCK_STREAM,
                          VHD_SANDBOX_F_NBD_TCP, "nbd: a TCP socket to the NBD server (IPv6)"),
    {.name = "connect",
     .nr = SCMP_SYS(connect),
     .arg = 2,
     .op = VHD_SANDBOX_ARG_EQ,
     .value = sizeof(struct sockaddr_in),
     .why = "nbd: connect to the NBD server (IPv4)",
     .only_with = VHD_SANDBOX_F_NBD_TCP},
    {.name = "connect",
     .nr = SCMP_SYS(connect),
     .arg = 2,
     .op = VHD_SANDBOX_ARG_EQ,
     .value = sizeof(struct sockaddr_in6),
     .why = "nbd: connect to the NBD server (IPv6)",
     .only_with = VHD_SANDBOX_F_NBD_TCP},
    ARG_MASKED_AND_MASKED(getsockopt, 1, INT_BITS, SOL_SOCKET, 2, INT_BITS, SO_ERROR,
                          VHD_SANDBOX_F_NBD, "nbd: the result of a non-blocking connect"),
    ARG_MASKED_AND_MASKED(setsockopt, 1, INT_BITS, IPPROTO_TCP, 2, INT_BITS, TCP_NODELAY,
                          VHD_SANDBOX_F_NBD, "nbd: libnbd sets TCP_NODELAY (tried on Unix too)"),
    NBD_ARG_EQ(sendto, 4, 0, "nbd: libnbd's send() on its connected socket (no address)"),
    NBD_ARG_EQ(recvfrom, 4, 0, "nbd: libnbd's recv() on its connected socket (no address)"),
    NBD_ANY(shutdown, "nbd: libnbd half-closes after NBD_CMD_DISC (device close)"),
    ANY(close, "fds of ended sessions, replaced ring fds, region fds after mmap"),
    ARG_EQ(fcntl, 1, F_GETFL, "read the flags of a session, kick or back-end fd"),
    ARG_EQ(fcntl, 1, F_SETFL, "O_NONBLOCK on session, kick and back-end-channel fds"),
    ARG_EQ(fcntl, 1, F_SETFD, "FD_CLOEXEC on an accepted session"),
    ANY(fstat, "mem.c checks a region fd's size before mmap"),
    ANY(newfstatat, "fstat() and stat() as glibc implements them"),
    ANY(fstatfs, "mem.c checks whether a region fd is on hugetlbfs (page alignment)"),
    ANY(readlinkat, "efd.c reads /proc/self/fd/N: a kick, call or error fd must be an eventfd"),
    ANY(memfd_create, "GET_INFLIGHT_FD allocates the inflight area (after the filter is on)"),
    ANY(ftruncate, "GET_INFLIGHT_FD sizes the inflight area"),
    ARG_EQ(fcntl, 1, F_ADD_SEALS, "seal the inflight area's size: it can never shrink under us"),
    /* ---- guest memory and the heap ---- */
    ARG_MASKED(mmap, 2, PROT_EXEC, 0,
               "SET_MEM_TABLE/ADD_MEM_REG map guest memory; malloc; never executable"),
    ANY(munmap, "memory tables released; free(); io_uring rings at exit"),
    ANY(mremap, "realloc() of large blocks"),
    ARG_MASKED(mprotect, 2, PROT_EXEC, 0, "glibc grows per-thread malloc arenas; never executable"),
    ANY(brk, "malloc() in the main arena"),
    ANY(madvise, "MADV_DONTDUMP on guest memory; glibc trims arenas and thread stacks"),
    ANY(sysinfo, "glibc's qsort() sizes its buffer by RAM on its first big sort (61+ regions)"),
    /* ---- threads and time (futex: the plain operations only; no PI, no requeue) ---- */
    ARG_MASKED(futex, 1, FUTEX_OP_BITS, FUTEX_WAIT, "mailbox mutex/condvar waits, pthread_join"),
    ARG_MASKED(futex, 1, FUTEX_OP_BITS, FUTEX_WAKE, "mailbox mutex/condvar wake-ups"),
    ARG_MASKED(futex, 1, FUTEX_OP_BITS, FUTEX_WAIT_BITSET, "condvar waits with a deadline"),
    ARG_MASKED(futex, 1, FUTEX_OP_BITS, FUTEX_WAKE_BITSET, "wake-ups of bitset waiters"),
    ANY(clock_gettime,
        "timestamps, bounded waits, log lines (vDSO fallback); a worker's CPU clock"),
    ANY(clock_nanosleep, "a worker backs off after an epoll error (usleep)"),
    ANY(nanosleep, "the same, on older libcs"),
    ANY(sched_yield, "sanitizer runtimes' internal spin locks yield (TSan builds in the tests)"),
    /*
     * A worker created just before the filter may not have run yet: its own
     * start-up (glibc start_thread) then happens under the filter.
     */
    ANY(rseq, "glibc registers a new thread's restartable sequence area"),
    ANY(set_robust_list, "glibc registers a new thread's robust futex list"),
    ANY(restart_syscall, "the kernel resumes an interrupted sleep"),
    ANY(rt_sigreturn, "return from a signal handler"),
    ARG_EQ(rt_sigaction, 0, SIGBUS,
           "the SIGBUS guard hands a fault outside guest memory back to the default action"),
    ANY(rt_sigprocmask, "glibc blocks signals in a thread that exits; abort()"),
    ANY(exit, "a worker thread ends at shutdown"),
    ANY(exit_group, "the process exits"),
    ANY(writev, "frames to a TAP fd (net tap backend); glibc's fatal-error message before abort()"),
    ARG_EQ(ioctl, 1, TUNSETOFFLOAD,
           "tap backend: offloads follow each guest's negotiated features"),
    ANY(getpid, "abort() looks up its own process"),
    ANY(gettid, "abort() looks up its own thread"),
    ARG_SELF_PID(tgkill, 0, "abort() sends SIGABRT to its own thread (a core, not a SIGSYS)"),
    /* ---- the block backend ---- */
    ARG_EQ(ioctl, 1, BLKDISCARD, "discard fallback on a block device that cannot punch holes"),
    ANY(fdatasync, "the uring backend flushes the image when a device closes"),
    /*
     * ---- exit ----
     * No unlink(): unlinkat on our sockets' directory fds only, never with
     * AT_REMOVEDIR. The filter cannot read the name, and an absolute name
     * ignores the fd: what bounds the files that remain removable is the uid
     * without capabilities (root without --user: files in directories uid 0
     * owns; --user: that user's).
     */
    ARG_DIRFD_AND_ZERO(unlinkat, 0, 2, "remove our listening socket at exit, by name in its dir"),
    /*
     * ---- runtime devices (--rpc only: device.add, device.remove, resize) ----
     * The filter cannot read a path: what bounds the files an add may open,
     * create, replace (a stale socket) or remove is the uid and its
     * capabilities (--user, or root without any; docs/SECURITY.md). Sockets:
     * Unix stream only (the client-mode rows), bound with a full sun.
     */
    /*
     * openat: an existing file (no O_CREAT, no O_TRUNC), or a new one
     * created with O_EXCL (an image of a size that does not exist yet): an
     * existing file is never created over or truncated.
     */
    RPC_ARG_MASKED(openat, 2, O_CREAT | O_EXCL | O_TRUNC, 0,
                   "add: open an image, the socket's dir (O_PATH), user/group names"),
    RPC_ARG_MASKED(openat, 2, O_CREAT | O_EXCL | O_TRUNC, O_CREAT | O_EXCL,
                   "add: create a new image (O_EXCL: never an existing file)"),
    RPC_ARG_MASKED(bind, 2, INT_BITS, sizeof(struct sockaddr_un),
                   "add: bind a new device's listening Unix socket (a full sun)"),
    RPC_ANY(listen, "add: a new device's socket starts listening"),
    RPC_ANY(fchmod, "add: the socket's mode is set on it before bind"),
    RPC_ANY(fchmodat, "add: socket-mode= on the new socket file, by name in its dir"),
    RPC_ANY(fchownat, "add: socket-group= on the new socket file, by name in its dir"),
    RPC_ANY(unlink, "add: a stale socket at a new device's path is replaced"),
    RPC_ARG_MASKED(unlinkat, 2, INT_BITS, 0,
                   "remove: the socket of a device added at runtime (its dir fd is new)"),
    RPC_ANY(eventfd2, "add: a new device's eventfds; an add's open reports through one"),
    RPC_ARG_MASKED(clone, 0, CLONE_THREAD | CLONE_VM | CLONE_SIGHAND | CLONE_FILES,
                   CLONE_THREAD | CLONE_VM | CLONE_SIGHAND | CLONE_FILES,
                   "add: the thread that opens a blk backend (a thread, never a process)"),
    RPC_ARG_MASKED(fcntl, 1, INT_BITS, F_OFD_SETLK, "add: lock a new image as QEMU does"),
    RPC_ARG_MASKED(fcntl, 1, INT_BITS, F_OFD_GETLK, "add: see another user's image locks"),
    RPC_ANY(statx, "add: O_DIRECT alignment of a new image (STATX_DIOALIGN)"),
    RPC_ARG_MASKED(ioctl, 1, INT_BITS, BLKGETSIZE64, "add: the size of a block device image"),
    RPC_ARG_MASKED(ioctl, 1, INT_BITS, BLKSSZGET, "add: a block device's logical block size"),
    RPC_ARG_MASKED(ioctl, 1, INT_BITS, BLKPBSZGET, "add: a block device's physical block size"),
    RPC_ARG_MASKED(lseek, 2, INT_BITS, SEEK_DATA,
                   "resize: is there data past a shrunk image's new end"),
    RPC_ARG_MASKED(lseek, 2, INT_BITS, SEEK_SET,
                   "add: glibc's files NSS module rewinds /etc/passwd, /etc/group"),
    RPC_ARG_MASKED(lseek, 2, INT_BITS, SEEK_CUR, "add: stdio's ftell on the NSS files it reads"),
    RPC_ANY(getrandom, "json-c seeds its hash tables at the first request"),
    RPC_ARG_MASKED(ioctl, 1, INT_BITS, TUNSETIFF,
                   "add net tap: attach to the interface (creating one needs CAP_NET_ADMIN)"),
    RPC_ARG_MASKED(ioctl, 1, INT_BITS, TUNSETVNETHDRSZ, "add net tap: the virtio header's size"),
    /* The NUMA report (runtime/numa.c): pages the guest-memory file has, then their node. */
    ANY(mincore, "the NUMA report looks up only guest-memory pages that exist"),
    ARG_EQ(get_mempolicy, 4, 3 /* MPOL_F_NODE | MPOL_F_ADDR */,
           "the NUMA report reads which node a guest-memory page is on"),
    ANY(getcpu, "a pinned worker learns its NUMA node (when the vDSO falls back to the syscall)"),
    /* move_pages(0, n, pages, nodes, status, MPOL_MF_MOVE): our own pages only. */
    ARG_MASKED_AND_MASKED(move_pages, 0, ~0ull, 0, 5, ~0ull, 2 /* MPOL_MF_MOVE */, 0,
                          "a pinned worker moves a queue's state to its NUMA node (attach)"),
#if VHD_SANDBOX_SANITIZER
    /* ---- sanitizer builds only (ASan/UBSan/TSan runtimes; never in a release build) ---- */
    ANY(sigaltstack, "the sanitizer runtime sets up and tears down a thread's signal stack"),
    ANY(sched_getaffinity, "the sanitizer runtime's start-up of a new thread"),
    ANY(gettimeofday, "ThreadSanitizer reads the time with a real syscall, not the vDSO"),
#endif
};

#undef ANY
#undef ARG_EQ
#undef ARG_MASKED
#undef ARG_SELF_PID
#undef ARG_MASKED_AND_MASKED
#undef CLIENT_ANY
#undef CLIENT_ARG_EQ
#undef RPC_ANY
#undef RPC_ARG_MASKED
#undef ARG_DIRFD_AND_ZERO

const struct vhd_sandbox_rule *vhd_sandbox_rules(size_t *n)
{
    *n = sizeof(sandbox_rules) / sizeof(sandbox_rules[0]);
    return sandbox_rules;
}

static int set_err(char *err, size_t errlen, int rc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Write a one-line reason to err (when given) and return rc. */
static int set_err(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    va_list ap;

    if (err && errlen) {
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

/*
 * Run glibc's lazy initialisations that need syscalls the filter forbids,
 * while they are still allowed: the first gmtime_r() (every log line's
 * timestamp) reads the time zone, opening /etc/localtime. With --log-level
 * warn, the first log line may well come after the filter.
 */
static void prime_libc(void)
{
    tzset();
}

/* Add rule r (dirfd: the value for VHD_SANDBOX_ARG_DIRFD). 0 or -errno. */
static int add_rule(scmp_filter_ctx ctx, const struct vhd_sandbox_rule *r, pid_t self, int dirfd)
{
    struct scmp_arg_cmp cmp[2] = {{0}};
    unsigned ncmp = 0;

    if (r->arg >= 0) {
        cmp[0].arg = (unsigned)r->arg;
        switch (r->op) {
        case VHD_SANDBOX_ARG_EQ:
            cmp[0].op = SCMP_CMP_EQ;
            cmp[0].datum_a = r->value;
            break;
        case VHD_SANDBOX_ARG_MASKED_EQ:
            cmp[0].op = SCMP_CMP_MASKED_EQ;
            cmp[0].datum_a = r->mask;
            cmp[0].datum_b = r->value;
            break;
        case VHD_SANDBOX_ARG_SELF_PID:
            cmp[0].op = SCMP_CMP_EQ;
            cmp[0].datum_a = (scmp_datum_t)self;
            break;
        case VHD_SANDBOX_ARG_DIRFD: /* an int: its 32 bits only */
            cmp[0].op = SCMP_CMP_MASKED_EQ;
            cmp[0].datum_a = INT_BITS;
            cmp[0].datum_b = (scmp_datum_t)(unsigned)dirfd;
            break;
        default:
            return -EINVAL;
        }
        ncmp = 1;
        if (r->has_and) { /* comparisons of one rule are ANDed by libseccomp */
            cmp[1].arg = (unsigned)r->and_arg;
            cmp[1].op = SCMP_CMP_MASKED_EQ;
            cmp[1].datum_a = r->and_mask;
            cmp[1].datum_b = r->and_value;
            ncmp = 2;
        }
    }
    return seccomp_rule_add_array(ctx, SCMP_ACT_ALLOW, r->nr, ncmp, ncmp ? cmp : NULL);
}

int vhd_sandbox_apply(enum vhd_sandbox_mode mode)
{
    return vhd_sandbox_apply_dirs(mode, 0, NULL, 0);
}

int vhd_sandbox_apply_with(enum vhd_sandbox_mode mode, unsigned flags)
{
    return vhd_sandbox_apply_dirs(mode, flags, NULL, 0);
}

int vhd_sandbox_apply_dirs(enum vhd_sandbox_mode mode, unsigned flags, const int *dirs,
                           unsigned ndirs)
{
    uint32_t deny;
    size_t n;
    int rc;

    if (mode == VHD_SANDBOX_OFF)
        return 0;
    if (mode != VHD_SANDBOX_ON && mode != VHD_SANDBOX_LOG)
        return -EINVAL;
    deny = mode == VHD_SANDBOX_ON ? SCMP_ACT_KILL_PROCESS : SCMP_ACT_LOG;
    prime_libc();

    scmp_filter_ctx ctx = seccomp_init(deny);
    if (!ctx)
        return -ENOMEM;
    /* Every thread, not just the caller's: the workers already run. */
    rc = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_TSYNC, 1);
    /* A syscall of another ABI (int 0x80, x32) is denied like any other. */
    if (rc == 0)
        rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, deny);
    if (rc < 0)
        goto release;
#if SCMP_VER_MAJOR > 2 || (SCMP_VER_MAJOR == 2 && SCMP_VER_MINOR >= 5)
    /* Kernel errnos from seccomp_load rather than libseccomp's -ECANCELED. */
    (void)seccomp_attr_set(ctx, SCMP_FLTATR_API_SYSRAWRC, 1);
#endif

    const struct vhd_sandbox_rule *rules = vhd_sandbox_rules(&n);
    pid_t self = getpid();
    for (size_t i = 0; i < n; i++) {
        const struct vhd_sandbox_rule *r = &rules[i];

        if (r->nr < 0)
            continue; /* not a syscall on this architecture (libseccomp's pseudo number) */
        if (r->only_with && !(r->only_with & flags))
            continue; /* a feature not in use */
        /* A rule per directory fd; none without directories. */
        unsigned copies = r->op == VHD_SANDBOX_ARG_DIRFD && r->arg >= 0 ? ndirs : 1;
        for (unsigned k = 0; k < copies; k++) {
            rc = add_rule(ctx, r, self, r->op == VHD_SANDBOX_ARG_DIRFD ? dirs[k] : 0);
            if (rc < 0) {
                vhd_log(VHD_LOG_ERROR, "sandbox: rule for %s: %s", r->name, strerror(-rc));
                goto release;
            }
        }
    }
    /*
     * clone3 passes its flags in memory the filter cannot read: refused as
     * if unknown, glibc's pthread_create falls back to clone, whose flags
     * the table checks. Without F_RPC, clone3 kills like any other call.
     */
    if (flags & VHD_SANDBOX_F_RPC) {
        rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
        if (rc < 0)
            goto release;
    }
    rc = seccomp_load(ctx);
    if (rc > 0)
        rc = -ESRCH; /* TSYNC: the id of a thread that could not be synchronised */
release:
    seccomp_release(ctx);
    return rc;
}

/* Resolve "NAME" or "UID[:GID]" to ids. 0 or -errno. */
static int resolve_user(const char *user, uid_t *uid, gid_t *gid)
{
    char buf[16384];
    struct passwd pw, *res = NULL;
    char *end;

    int e = getpwnam_r(user, &pw, buf, sizeof(buf), &res);
    if (e == 0 && res) {
        *uid = res->pw_uid;
        *gid = res->pw_gid;
        return 0;
    }
    /* Not a known name: numeric ids (containers often have no passwd entry). */
    errno = 0;
    unsigned long u = strtoul(user, &end, 10);
    if (end == user || errno || u > (uid_t)-2 || (*end && *end != ':'))
        return e ? -e : -ENOENT;
    *uid = (uid_t)u;
    if (*end == ':') {
        const char *g = end + 1;
        errno = 0;
        unsigned long gv = strtoul(g, &end, 10);
        if (end == g || *end || errno || gv > (gid_t)-2)
            return -EINVAL;
        *gid = (gid_t)gv;
    } else if (getpwuid_r(*uid, &pw, buf, sizeof(buf), &res) == 0 && res) {
        *gid = res->pw_gid;
    } else {
        *gid = (gid_t)u;
    }
    return 0;
}

/*
 * A decimal id in text (the whole of it), or -1. Ids are parsed before any
 * name lookup: a number needs no database (and under the --rpc filter, a
 * lookup is a risk of its own: warm_nss).
 */
static long long parse_id(const char *text)
{
    char *end;

    if (!text[0] || text[0] < '0' || text[0] > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (*end || errno || v > (unsigned long long)(uid_t)-2)
        return -1;
    return (long long)v;
}

/* A GID or group name. 0 or -errno. */
static int resolve_group(const char *name, gid_t *gid)
{
    char buf[16384];
    struct group gr, *res = NULL;
    long long id = parse_id(name);

    if (id >= 0) {
        *gid = (gid_t)id;
        return 0;
    }
    if (getgrnam_r(name, &gr, buf, sizeof(buf), &res) == 0 && res) {
        *gid = res->gr_gid;
        return 0;
    }
    return -ENOENT;
}

/* A UID or user name (a name's own uid, not its group). 0 or -errno. */
static int resolve_uid(const char *name, uid_t *uid)
{
    char buf[16384];
    struct passwd pw, *res = NULL;
    long long id = parse_id(name);

    if (id >= 0) {
        *uid = (uid_t)id;
        return 0;
    }
    if (getpwnam_r(name, &pw, buf, sizeof(buf), &res) == 0 && res) {
        *uid = res->pw_uid;
        return 0;
    }
    return -ENOENT;
}

/*
 * With --rpc, an add's socket-group=/allow-uid=/allow-gid= names are looked
 * up under the filter. glibc loads an NSS module (nsswitch.conf: "files
 * systemd") the first time a database needs it, with mmap(PROT_EXEC), which
 * the filter forbids: look up a present and a missing name of each database
 * now, so every module of both chains is loaded. What the loaded modules do
 * per lookup (open and read /etc/passwd, lseek, a Unix socket to
 * systemd-userdb) has rows. Before the filter; 0 always (a failed lookup is
 * what warms a chain).
 */
static void warm_nss(void)
{
    char buf[16384];
    struct passwd pw, *pres;
    struct group gr, *gres;
    static const char *const names[] = {"root", "vhostd-nss-warm-up-no-such-name"};

    for (int i = 0; i < 2; i++) {
        (void)getpwnam_r(names[i], &pw, buf, sizeof(buf), &pres);
        (void)getgrnam_r(names[i], &gr, buf, sizeof(buf), &gres);
    }
}

int vhd_sandbox_resolve_access(const struct vhd_opt_access *in, struct vhd_endpoint_access *out,
                               char *err, size_t errlen)
{
    char list[1024];

    memset(out, 0, sizeof(*out));
    out->mode = (mode_t)in->mode;
    if (in->group) {
        if (resolve_group(in->group, &out->gid) < 0)
            return set_err(err, errlen, -ENOENT, "socket-group=%s: no such group", in->group);
        out->gid_set = true;
    }
    for (int which = 0; which < 2; which++) {
        const char *v = which ? in->allow_gid : in->allow_uid;
        if (!v)
            continue;
        if (strlen(v) >= sizeof(list))
            return set_err(err, errlen, -EINVAL, "allow-%s=: list too long", which ? "gid" : "uid");
        strcpy(list, v);
        for (char *save = NULL, *tok = strtok_r(list, ":", &save); tok;
             tok = strtok_r(NULL, ":", &save)) {
            unsigned *n = which ? &out->ngids : &out->nuids;
            if (*n >= VHD_ENDPOINT_MAX_IDS)
                return set_err(err, errlen, -E2BIG, "allow-%s=: more than %d ids",
                               which ? "gid" : "uid", VHD_ENDPOINT_MAX_IDS);
            int rc = which ? resolve_group(tok, &out->gids[*n]) : resolve_uid(tok, &out->uids[*n]);
            if (rc < 0)
                return set_err(err, errlen, rc, "allow-%s=%s: no such %s", which ? "gid" : "uid",
                               tok, which ? "group" : "user");
            (*n)++;
        }
    }
    return 0;
}

/*
 * Whether server (an NBD URI's host, as libxml2 decoded it) is an address
 * given as such: [IPv6] or what getaddrinfo takes with AI_NUMERICHOST. No
 * lookup happens either way.
 */
static bool numeric_host(const char *server)
{
    char host[INET6_ADDRSTRLEN + 2];
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST, .ai_family = AF_UNSPEC}, *ai = NULL;
    size_t n = strlen(server);

    if (!n || n >= sizeof(host))
        return false;
    if (server[0] == '[') { /* an IPv6 literal: libnbd strips the brackets */
        if (n < 3 || server[n - 1] != ']')
            return false;
        memcpy(host, server + 1, n - 2);
        host[n - 2] = '\0';
        hints.ai_family = AF_INET6;
    } else {
        memcpy(host, server, n + 1);
        hints.ai_family = AF_INET;
    }
    if (getaddrinfo(host, NULL, &hints, &ai) != 0)
        return false;
    freeaddrinfo(ai);
    return true;
}

bool vhd_sandbox_blk_uses_tcp(const struct vhd_opt_blk *b)
{
    if (!b->uri || strcmp(b->backend, "nbd"))
        return false;
    xmlURIPtr u = xmlParseURI(b->uri);
    bool tcp = u && u->scheme && (!strcmp(u->scheme, "nbd") || !strcmp(u->scheme, "nbds"));
    xmlFreeURI(u);
    return tcp;
}

int vhd_sandbox_check_runtime_blk(const struct vhd_opt_blk *b, bool tcp, char *err, size_t errlen)
{
    const char *uri = b->uri;
    int rc = 0;

    if (!uri || strcmp(b->backend, "nbd"))
        return 0;
    /* libnbd parses the URI with libxml2 too: both read the same scheme, user and host. */
    xmlURIPtr u = xmlParseURI(uri);
    if (!u)
        return set_err(err, errlen, -EPERM, "%s: not a URI libnbd can read", uri);
    if (u->scheme && !strcmp(u->scheme, "nbds"))
        rc = set_err(err, errlen, -EPERM,
                     "an NBD URI with TLS (%s) needs --sandbox off: workers read certificates "
                     "when they connect",
                     uri);
    else if (!u->scheme || (strcmp(u->scheme, "nbd") && strcmp(u->scheme, "nbd+unix")))
        rc = set_err(err, errlen, -EPERM,
                     "%s: under the sandbox, an NBD server added at runtime is reached by "
                     "nbd:// (TCP) or nbd+unix:// only (vsock, TLS: --sandbox off)",
                     uri);
    else if (u->user)
        rc = set_err(err, errlen, -EPERM, "%s: an NBD URI with user information is refused", uri);
    else if (!strcmp(u->scheme, "nbd") && (!u->server || !numeric_host(u->server)))
        rc = set_err(err, errlen, -EPERM,
                     "%s: under the sandbox, an NBD server added at runtime is given by its "
                     "address (nbd://127.0.0.1/..., nbd://[::1]/...) or a Unix socket: resolving "
                     "a host name needs calls the filter forbids (or --sandbox off)",
                     uri);
    else if (!strcmp(u->scheme, "nbd") && !tcp)
        rc = set_err(err, errlen, -EPERM,
                     "%s: under the sandbox, a runtime add reaches an NBD server over TCP only "
                     "with --rpc-nbd-tcp on (the filter then allows inet sockets) or a Unix "
                     "socket (nbd+unix://)",
                     uri);
    xmlFreeURI(u);
    return rc;
}

/*
 * Removing a socket at exit needs write access to its directory, which the
 * new user may lack: say so now rather than leave a stale socket silently
 * (the next vhostd removes a stale socket before binding anyway).
 */
static void warn_if_dir_not_writable(const char *path)
{
    char dir[4096];
    const char *slash = strrchr(path, '/');

    if (!slash) {
        strcpy(dir, ".");
    } else if (slash == path) {
        strcpy(dir, "/");
    } else {
        size_t len = (size_t)(slash - path);
        if (len >= sizeof(dir))
            return;
        memcpy(dir, path, len);
        dir[len] = '\0';
    }
    if (access(dir, W_OK | X_OK) < 0)
        vhd_log(VHD_LOG_WARN,
                "sandbox: %s: directory not writable without privileges (%s): the "
                "socket will stay behind at exit",
                path, strerror(errno));
}

int vhd_sandbox_drop_user(const char *user, const char *const *paths, const bool *keep_group,
                          unsigned npaths, char *err, size_t errlen)
{
    uid_t uid;
    gid_t gid;
    int rc;

    if (!user || !*user)
        return set_err(err, errlen, -EINVAL, "--user: empty user name");
    rc = resolve_user(user, &uid, &gid);
    if (rc < 0)
        return set_err(err, errlen, rc, "--user %s: no such user", user);

    /* Sockets first, while we may still chown: the front-end may run as that user. */
    for (unsigned i = 0; i < npaths; i++)
        if (paths[i] &&
            fchownat(AT_FDCWD, paths[i], uid, keep_group && keep_group[i] ? (gid_t)-1 : gid,
                     AT_SYMLINK_NOFOLLOW) < 0)
            return set_err(err, errlen, -errno, "--user %s: chown %s: %s", user, paths[i],
                           strerror(errno));

    if (getuid() == uid && geteuid() == uid && getgid() == gid && getegid() == gid &&
        geteuid() != 0)
        return 0; /* already that user, and not root: nothing to drop */
    /* Groups before the uid: once the uid is gone, so is the right to change them. */
    if (setgroups(1, &gid) < 0)
        return set_err(err, errlen, -errno, "--user %s: setgroups: %s", user, strerror(errno));
    if (setresgid(gid, gid, gid) < 0)
        return set_err(err, errlen, -errno, "--user %s: setresgid(%u): %s", user, (unsigned)gid,
                       strerror(errno));
    if (setresuid(uid, uid, uid) < 0)
        return set_err(err, errlen, -errno, "--user %s: setresuid(%u): %s", user, (unsigned)uid,
                       strerror(errno));

    /* Paranoia (as OpenSSH does): the ids stuck and root cannot be taken back. */
    uid_t ru, eu, su;
    gid_t rg, eg, sg;
    if (getresuid(&ru, &eu, &su) < 0 || getresgid(&rg, &eg, &sg) < 0 || ru != uid || eu != uid ||
        su != uid || rg != gid || eg != gid || sg != gid)
        return set_err(err, errlen, -EPERM, "--user %s: the new ids did not stick", user);
    if (uid != 0 && (setuid(0) == 0 || seteuid(0) == 0))
        return set_err(err, errlen, -EPERM, "--user %s: root could be regained", user);
    vhd_log(VHD_LOG_INFO, "sandbox: running as uid %u gid %u", (unsigned)uid, (unsigned)gid);
    for (unsigned i = 0; i < npaths; i++)
        if (paths[i])
            warn_if_dir_not_writable(paths[i]);
    return 0;
}

#if VHD_SANDBOX_SANITIZER
/* Weak: present when the sanitizer runtime includes LeakSanitizer (ASan does). */
void __lsan_do_leak_check(void) __attribute__((weak));

/*
 * LeakSanitizer's check at exit stops the world with clone, ptrace, open of
 * /proc and more: it cannot run under the filter, and would die of SIGSYS
 * there. So check now, which also disables the check at exit. Leaks made
 * after this point are only found with --sandbox=off.
 */
static void sanitizer_before_filter(void)
{
    if (__lsan_do_leak_check) {
        vhd_log(VHD_LOG_INFO, "sandbox: sanitizer build: LeakSanitizer checks now, not at exit "
                              "(--sandbox=off for a check at exit)");
        __lsan_do_leak_check();
    }
}
#else
static void sanitizer_before_filter(void)
{
}
#endif

int vhd_sandbox_raise_nofile(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        return -errno;
    if (rl.rlim_cur >= rl.rlim_max) {
        vhd_log(VHD_LOG_DEBUG, "fd limit: %llu", (unsigned long long)rl.rlim_cur);
        return 0;
    }
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
        int rc = -errno;
        vhd_log(VHD_LOG_WARN, "fd limit: cannot raise %llu to %llu: %s", (unsigned long long)old,
                (unsigned long long)rl.rlim_max, strerror(-rc));
        return rc;
    }
    vhd_log(VHD_LOG_INFO, "fd limit raised from %llu to %llu (the hard limit)",
            (unsigned long long)old, (unsigned long long)rl.rlim_max);
    return 0;
}

/* The effective and permitted capability sets, as 64-bit masks. 0 or -errno. */
static int caps_get(uint64_t *eff, uint64_t *prm)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct d[2];

    memset(d, 0, sizeof(d));
    if (syscall(SYS_capget, &h, d) < 0)
        return -errno;
    *eff = (uint64_t)d[1].effective << 32 | d[0].effective;
    *prm = (uint64_t)d[1].permitted << 32 | d[0].permitted;
    return 0;
}

/*
 * Drop the calling thread's capabilities to keep: securebits (with
 * CAP_SETPCAP), the bounding set, the ambient set, then the permitted and
 * effective sets. Every one of these is a per-thread attribute. Only
 * syscalls, no allocation: async-signal-safe, so caps_signal_handler runs
 * it too. 0 or -errno; *step names what failed.
 */
static int caps_drop_self(uint64_t keep, const char **step)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct d[2];
    uint64_t eff = 0, prm = 0;
    int rc = caps_get(&eff, &prm);

    *step = "capget";
    if (rc < 0)
        return rc;
    if (prm & (1ull << CAP_SETPCAP)) {
        /*
         * uid 0 would get every capability back from any execve (the filter
         * forbids it, but not with --sandbox=off): SECBIT_NOROOT says no,
         * locked. Then the bounding set, which also takes CAP_SETPCAP.
         */
        *step = "securebits";
        if (prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED, 0, 0, 0) < 0)
            return -errno;
        *step = "bounding set";
        for (unsigned cap = 0; cap < 64; cap++) {
            if (keep & (1ull << cap))
                continue;
            if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
                if (errno == EINVAL)
                    break; /* past the last capability this kernel knows */
                return -errno;
            }
        }
    }
    (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); /* EINVAL before 4.3 */

    uint64_t want = keep & prm;
    memset(d, 0, sizeof(d));
    for (int i = 0; i < 2; i++)
        d[i].effective = d[i].permitted = (uint32_t)(want >> (32 * i));
    *step = "capset";
    if (syscall(SYS_capset, &h, d) < 0)
        return -errno;
    *step = "check";
    rc = caps_get(&eff, &prm);
    if (rc < 0)
        return rc;
    return eff == want && prm == want ? 0 : -EPERM;
}

/*
 * The other threads. Capabilities belong to each thread, and the workers
 * (and any thread a library started) exist before the sandbox is entered:
 * each must drop its own. A real-time signal that nothing else here uses
 * (efd.c's guard is SIGRTMIN + 5) runs caps_drop_self on each of them;
 * the caller reads the result back from /proc, and counts failures.
 */
#define CAPS_SIGNO (SIGRTMIN + 6)
static uint64_t caps_keep;     /* written before any signal is sent */
static volatile int caps_fail; /* atomic: handlers on other threads */

static void caps_signal_handler(int sig)
{
    const char *step;
    int saved = errno;
    (void)sig;
    if (caps_drop_self(caps_keep, &step) < 0)
        __atomic_add_fetch(&caps_fail, 1, __ATOMIC_RELEASE);
    errno = saved;
}

/*
 * What /proc says of thread tid: its name, whether it blocks signal sig, and
 * whether its effective or permitted set holds more than keep. false when
 * the thread is gone.
 */
static bool thread_state(pid_t tid, int sig, uint64_t keep, char *comm, size_t commlen,
                         bool *blocks, bool *holds)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/self/task/%d/status", (int)tid);
    FILE *f = fopen(path, "re");
    if (!f)
        return false;
    *blocks = *holds = false;
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "Name:", 5)) {
            snprintf(comm, commlen, "%s", line + 5 + strspn(line + 5, " \t"));
            comm[strcspn(comm, "\n")] = 0;
        } else if (!strncmp(line, "SigBlk:", 7)) {
            *blocks = (strtoull(line + 7, NULL, 16) >> (sig - 1)) & 1;
        } else if (!strncmp(line, "CapEff:", 7) || !strncmp(line, "CapPrm:", 7)) {
            *holds |= (strtoull(line + 7, NULL, 16) & ~keep) != 0;
        }
    }
    fclose(f);
    return true;
}

/*
 * Scan the other threads: how many still hold more than keep and do not
 * block sig (they will drop once the signal is taken), and the names of
 * those that block it (they never will) in names.
 */
static int threads_pending(pid_t self, uint64_t keep, int *unreachable, char *names,
                           size_t nameslen)
{
    int pending = 0;
    DIR *dir = opendir("/proc/self/task");
    *unreachable = 0;
    if (names)
        names[0] = 0;
    if (!dir)
        return -errno;
    for (struct dirent *de; (de = readdir(dir));) {
        pid_t tid = (pid_t)atoi(de->d_name);
        char comm[32] = "?";
        bool blocks, holds;
        if (tid <= 0 || tid == self ||
            !thread_state(tid, CAPS_SIGNO, keep, comm, sizeof(comm), &blocks, &holds) || !holds)
            continue;
        if (!blocks) {
            pending++;
            continue;
        }
        (*unreachable)++;
        if (names)
            snprintf(names + strlen(names), nameslen - strlen(names), "%s%s (%d)",
                     names[0] ? ", " : "", comm, (int)tid);
    }
    closedir(dir);
    return pending;
}

/*
 * Run caps_drop_self on every other thread of the process and wait until
 * each has dropped: 10 s at most (a loaded machine, or a sanitizer that
 * defers signals, can keep a thread from running its handler for seconds;
 * the wait ends as soon as all have). A thread that blocks the signal for
 * good (librbd's threads block every signal) cannot be reached: it keeps its
 * capabilities and is named in a warning; one that does not block it and
 * still holds them after the wait, or a failed drop, is an error. Control
 * thread, before the seccomp filter (it forbids tgkill).
 */
static int caps_drop_other_threads(uint64_t keep, char *err, size_t errlen)
{
    struct sigaction sa;
    pid_t self = (pid_t)syscall(SYS_gettid);
    int pending = 0, unreachable = 0;
    char names[256];

    caps_keep = keep;
    __atomic_store_n(&caps_fail, 0, __ATOMIC_RELAXED);
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = caps_signal_handler;
    sa.sa_flags = SA_RESTART; /* a worker's epoll_wait or io_uring wait just goes on */
    sigemptyset(&sa.sa_mask);
    if (sigaction(CAPS_SIGNO, &sa, NULL) < 0)
        return set_err(err, errlen, -errno, "sigaction: %s", strerror(errno));
    /*
     * Signal every other thread. One that blocks the signal just now (a
     * thread still starting up) takes it when it unblocks; the handler
     * stays installed for that (never the default action, which exits).
     */
    DIR *dir = opendir("/proc/self/task");
    if (!dir)
        return set_err(err, errlen, -errno, "/proc/self/task: %s", strerror(errno));
    for (struct dirent *de; (de = readdir(dir));) {
        pid_t tid = (pid_t)atoi(de->d_name);
        if (tid > 0 && tid != self && syscall(SYS_tgkill, getpid(), tid, CAPS_SIGNO) < 0 &&
            errno != ESRCH) /* ESRCH: it has just exited */
            vhd_log(VHD_LOG_WARN, "sandbox: tgkill %d: %s", (int)tid, strerror(errno));
    }
    closedir(dir);
    for (int i = 0; i < 10000; i++) {
        pending = threads_pending(self, keep, &unreachable, NULL, 0);
        /*
         * A thread that has not run yet still has the all-blocked mask
         * pthread_create starts it with: give blocking threads 200 ms to
         * start and take the signal before calling them unreachable.
         */
        if ((pending <= 0 && (unreachable == 0 || i >= 200)) ||
            __atomic_load_n(&caps_fail, __ATOMIC_ACQUIRE))
            break;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    pending = threads_pending(self, keep, &unreachable, names, sizeof(names));
    if (pending < 0)
        return set_err(err, errlen, pending, "/proc/self/task: %s", strerror(-pending));
    int failed = __atomic_load_n(&caps_fail, __ATOMIC_ACQUIRE);
    if (pending > 0 || failed)
        return set_err(err, errlen, -EPERM,
                       "%d other thread(s) kept their capabilities, %d failed to drop them",
                       pending, failed);
    if (unreachable)
        vhd_log(VHD_LOG_WARN,
                "sandbox: %d thread(s) block signals and keep their capabilities: %s "
                "(started by a library; --user drops them for every thread)",
                unreachable, names);
    return 0;
}

int vhd_sandbox_drop_caps(uint64_t keep, char *err, size_t errlen)
{
    const char *step;
    int rc = caps_drop_self(keep, &step);

    if (rc < 0)
        return set_err(err, errlen, rc, "%s: %s", step,
                       rc == -EPERM && !strcmp(step, "check") ? "capabilities did not drop"
                                                              : strerror(-rc));
    return caps_drop_other_threads(keep, err, errlen);
}

/*
 * Root without --user: after setup uid 0 needs no capability (sockets and
 * images are open; our sockets are unlinked as their owner) except, in
 * client mode, CAP_DAC_OVERRIDE: a front-end's socket is its own (QEMU as
 * libvirt-qemu, mode 0755) and reconnecting must still reach it.
 */
static int drop_root_caps(const struct vhd_sandbox_opts *o, char *err, size_t errlen)
{
    uint64_t eff = 0, prm = 0;
    /*
     * Reconnections (client mode, nbd) reach sockets the start-up connection
     * reached as root. Never with --rpc: its openat/unlink rows would then
     * reach every file on the host.
     */
    uint64_t keep = !o->rpc && (o->client_mode || o->nbd) ? 1ull << CAP_DAC_OVERRIDE : 0;

    if (o->rpc && geteuid() == 0)
        vhd_log(VHD_LOG_WARN,
                "sandbox: --rpc as root without --user: runtime adds may open, create and "
                "remove whatever uid 0 without capabilities may (files root owns); use --user "
                "with an account that owns only the images and sockets it serves "
                "(docs/SECURITY.md)");

    if (caps_get(&eff, &prm) < 0 || (prm & ~keep) == 0)
        return 0; /* nothing to drop */
    int rc = vhd_sandbox_drop_caps(keep, err, errlen);
    if (rc < 0)
        return rc;
    if (keep)
        vhd_log(VHD_LOG_INFO, "sandbox: no --user: dropped every capability but CAP_DAC_OVERRIDE "
                              "(client mode, nbd: reach the front-end's or the NBD server's "
                              "socket whatever its mode)");
    else
        vhd_log(VHD_LOG_INFO, "sandbox: no --user: dropped every capability");
    for (unsigned i = 0; i < o->nchown; i++)
        if (o->chown_paths[i])
            warn_if_dir_not_writable(o->chown_paths[i]);
    return 0;
}

int vhd_sandbox_enter(const struct vhd_sandbox_opts *o, char *err, size_t errlen)
{
    int rc;

    if (o->user)
        rc = vhd_sandbox_drop_user(o->user, o->chown_paths, o->chown_keep_group, o->nchown, err,
                                   errlen);
    else
        rc = drop_root_caps(o, err, errlen);
    if (rc < 0)
        return rc;
    if (o->mode != VHD_SANDBOX_OFF)
        sanitizer_before_filter();
    if (o->rpc && o->mode != VHD_SANDBOX_OFF)
        warm_nss();
    unsigned flags = (o->client_mode ? VHD_SANDBOX_F_CLIENT : 0) |
                     (o->nbd ? VHD_SANDBOX_F_NBD : 0) |
                     (o->nbd_tcp ? VHD_SANDBOX_F_NBD | VHD_SANDBOX_F_NBD_TCP : 0);
    if (o->rpc) /* a device added later may be in client mode or on nbd (TCP: only nbd_tcp) */
        flags |= VHD_SANDBOX_F_RPC | VHD_SANDBOX_F_CLIENT | VHD_SANDBOX_F_NBD;
    rc = vhd_sandbox_apply_dirs(o->mode, flags, o->unlink_dirs, o->nunlink_dirs);
    if (rc < 0)
        return set_err(err, errlen, rc, "seccomp filter: %s%s", strerror(-rc),
                       rc == -EINVAL || rc == -ENOSYS
                           ? " (no seccomp filter support in this kernel? --sandbox=off)"
                           : "");
    size_t n = 0, all;
    const struct vhd_sandbox_rule *rules = vhd_sandbox_rules(&all);
    for (size_t i = 0; i < all; i++)
        if (!rules[i].only_with || (rules[i].only_with & flags))
            n += rules[i].op == VHD_SANDBOX_ARG_DIRFD ? o->nunlink_dirs : 1;
    if (o->mode == VHD_SANDBOX_ON)
        vhd_log(VHD_LOG_INFO, "sandbox: seccomp filter on (%zu rules): other syscalls kill vhostd",
                n);
    else if (o->mode == VHD_SANDBOX_LOG)
        vhd_log(VHD_LOG_INFO,
                "sandbox: seccomp filter in log mode (%zu rules): other syscalls are allowed and "
                "logged by the kernel (dmesg, audit type=1326)",
                n);
    else
        vhd_log(VHD_LOG_INFO, "sandbox: off");
    return 0;
}
