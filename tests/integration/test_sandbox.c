/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Tests of vhostd's sandbox (daemon/sandbox.c): the filter the daemon installs
 * is applied in a child process (the harness's test process must survive to
 * report) and must let through what vhostd does after setup, kill the process
 * with SIGSYS for anything else, on every thread, and only log in log mode;
 * --sandbox/--user parsing; the drop to another user; and the real daemon
 * (build/vhostd) serving I/O under the filter and dying on a forbidden call.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/futex.h>
#include <linux/io_uring.h>
#include <linux/if_tun.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../daemon/options.h"
#include "../daemon/sandbox.h"
#include "spec/virtio.h"
#include "spec/virtio_blk.h"
#include "driver/guestmem.h"
#include "driver/vring.h"
#include "harness.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "spec/vhost_user.h"
#include "transport/vu_sock.h"
#include "vhostd/device.h"

#define BIT(n) (1ull << (n))

extern char **environ;

/* =====================================================================
 * A sandboxed child: checks report through write(2), never stdio or exit().
 * ===================================================================== */

static void child_fail(const char *file, int line, const char *what) __attribute__((noreturn));

static void child_fail(const char *file, int line, const char *what)
{
    char buf[256];
    int e = errno;
    int n = snprintf(buf, sizeof(buf), "  %s:%d: check failed in the sandboxed child: %s (%s)\n",
                     file, line, what, strerror(e));
    if (n > 0 && write(STDERR_FILENO, buf, (size_t)n) < 0) {
        /* nothing more to do */
    }
    _exit(1);
}

/* VHD_CHECK for the child: no stdio (its buffers), no exit() (atexit handlers, sanitizers). */
#define CHILD_CHECK(cond)                          \
    do {                                           \
        if (!(cond))                               \
            child_fail(__FILE__, __LINE__, #cond); \
    } while (0)

/*
 * Run fn(arg) in a new child process; returns its wait status. The child
 * ends with _exit(0) when fn returns. It dumps no core: the SIGSYS kills
 * provoked here would otherwise leave core files behind.
 */
static int run_child(void (*fn)(void *), void *arg)
{
    int st = 0;

    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {0, 0};
        setrlimit(RLIMIT_CORE, &rl);
        prctl(PR_SET_DUMPABLE, 0);
        alarm(30); /* a hang fails this child, not the whole test binary */
        fn(arg);
        _exit(0);
    }
    while (waitpid(pid, &st, 0) < 0)
        VHD_CHECK_EQ(errno, EINTR);
    return st;
}

static const char *describe(int st, char *buf, size_t len)
{
    if (WIFEXITED(st))
        snprintf(buf, len, "exit %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
        snprintf(buf, len, "signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(buf, len, "status 0x%x", st);
    return buf;
}

static bool killed_by_sigsys(int st)
{
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS;
}

static bool exited_ok(int st)
{
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

/* =====================================================================
 * The table
 * ===================================================================== */

static const struct vhd_sandbox_rule *find_rule(const char *name)
{
    size_t n;
    const struct vhd_sandbox_rule *r = vhd_sandbox_rules(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(r[i].name, name))
            return &r[i];
    return NULL;
}

VHD_TEST(table_rows_have_reasons)
{
    size_t n;
    const struct vhd_sandbox_rule *r = vhd_sandbox_rules(&n);

    VHD_CHECK(n > 10);
    for (size_t i = 0; i < n; i++) {
        VHD_CHECK(r[i].name && *r[i].name);
        VHD_CHECK(r[i].nr >= 0); /* every row is a real syscall on x86_64 */
        VHD_CHECK(r[i].why && strlen(r[i].why) >= 10);
        VHD_CHECK(strlen(r[i].why) <= 100); /* one line */
        VHD_CHECK(r[i].arg >= -1 && r[i].arg <= 5);
        /* No row twice (rows that differ only in their second condition are two rows). */
        for (size_t j = 0; j < i; j++)
            VHD_CHECK(!(r[j].nr == r[i].nr && r[j].arg == r[i].arg && r[j].op == r[i].op &&
                        r[j].mask == r[i].mask && r[j].value == r[i].value &&
                        r[j].has_and == r[i].has_and && r[j].and_arg == r[i].and_arg &&
                        r[j].and_mask == r[i].and_mask && r[j].and_value == r[i].and_value));
    }
}

VHD_TEST(table_leaves_out_dangerous_syscalls)
{
    char never[] = "execve execveat fork vfork clone3 open openat2 creat "
                   "accept socketpair ptrace kill prctl setuid setgid setresuid setgroups "
                   "capset mount umount2 unshare setns bpf perf_event_open fallocate "
                   "io_uring_setup io_uring_register process_vm_writev process_vm_readv chmod "
                   "chown rename symlink link truncate init_module kexec_load keyctl "
                   "userfaultfd seccomp pipe2 dup dup3 rmdir rename renameat "
                   "renameat2";
    /* What runtime adds need (--rpc): in the table, but only with VHD_SANDBOX_F_RPC. */
    char rpc_only[] = "clone openat bind listen eventfd2 unlink fchmod fchmodat fchownat "
                      "statx getrandom lseek";
    size_t n;
    const struct vhd_sandbox_rule *r = vhd_sandbox_rules(&n);
    int bad = 0;

    for (char *save = NULL, *name = strtok_r(never, " ", &save); name;
         name = strtok_r(NULL, " ", &save)) {
        if (find_rule(name)) {
            fprintf(stderr, "  %s is in the allow table\n", name);
            bad++;
        }
    }
    for (char *save = NULL, *name = strtok_r(rpc_only, " ", &save); name;
         name = strtok_r(NULL, " ", &save)) {
        int rows = 0;
        for (size_t i = 0; i < n; i++)
            if (!strcmp(r[i].name, name)) {
                rows++;
                if (r[i].only_with != VHD_SANDBOX_F_RPC) {
                    fprintf(stderr, "  %s is allowed without --rpc\n", name);
                    bad++;
                }
            }
        if (!rows) {
            fprintf(stderr, "  %s: no --rpc row\n", name);
            bad++;
        }
    }
    /* clone: threads only (CLONE_THREAD and a shared address space required). */
    const struct vhd_sandbox_rule *c = find_rule("clone");
    VHD_CHECK(c && c->arg == 0 && c->op == VHD_SANDBOX_ARG_MASKED_EQ);
    VHD_CHECK((c->mask & c->value & CLONE_THREAD) && (c->mask & c->value & CLONE_VM));
    /* bind: a full sockaddr_un only. */
    VHD_CHECK((c = find_rule("bind")) && c->arg == 2 && c->value == sizeof(struct sockaddr_un));
    VHD_CHECK_EQ(bad, 0);
}

/*
 * socket() is allowed for client mode as a Unix stream socket, and for the
 * nbd backend as a Unix or (an nbd:// device only) TCP stream socket: every
 * row says so.
 */
VHD_TEST(table_socket_only_unix_stream)
{
    size_t n;
    const struct vhd_sandbox_rule *r = vhd_sandbox_rules(&n);
    int rows = 0;

    for (size_t i = 0; i < n; i++) {
        if (strcmp(r[i].name, "socket"))
            continue;
        rows++;
        VHD_CHECK_EQ(r[i].arg, 0); /* the domain ... */
        VHD_CHECK_EQ(r[i].op, VHD_SANDBOX_ARG_MASKED_EQ);
        VHD_CHECK_EQ(r[i].mask & 0xffffffffUL, 0xffffffffUL);
        if (r[i].value == AF_UNIX)
            VHD_CHECK_EQ(r[i].only_with, VHD_SANDBOX_F_CLIENT | VHD_SANDBOX_F_NBD);
        else
            VHD_CHECK((r[i].value == AF_INET || r[i].value == AF_INET6) &&
                      r[i].only_with == VHD_SANDBOX_F_NBD_TCP); /* never with --rpc alone */
        VHD_CHECK(r[i].has_and);                                /* ... and the type, flags aside */
        VHD_CHECK_EQ(r[i].and_arg, 1);
        VHD_CHECK_EQ(r[i].and_mask, 0xffffffffUL & ~(unsigned long)(SOCK_NONBLOCK | SOCK_CLOEXEC));
        VHD_CHECK_EQ(r[i].and_value, SOCK_STREAM);
    }
    VHD_CHECK_EQ(rows, 3);
    /*
     * connect exists for client mode and nbd only, and only with the length
     * of a struct sockaddr_un (no abstract socket with a shorter name), or
     * for nbd of a TCP address.
     */
    rows = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(r[i].name, "connect"))
            continue;
        rows++;
        VHD_CHECK(r[i].arg == 2 && r[i].op == VHD_SANDBOX_ARG_EQ);
        if (r[i].value == sizeof(struct sockaddr_un))
            VHD_CHECK_EQ(r[i].only_with, VHD_SANDBOX_F_CLIENT | VHD_SANDBOX_F_NBD);
        else
            VHD_CHECK((r[i].value == sizeof(struct sockaddr_in) ||
                       r[i].value == sizeof(struct sockaddr_in6)) &&
                      r[i].only_with == VHD_SANDBOX_F_NBD_TCP);
    }
    VHD_CHECK_EQ(rows, 3);
    /* The back-off timer: client mode's reconnects and a server's accept pause (EMFILE). */
    VHD_CHECK(find_rule("timerfd_settime") && find_rule("timerfd_settime")->only_with == 0);
}

/* unlinkat: on the directory fds given to the filter only, never AT_REMOVEDIR; no unlink. */
VHD_TEST(table_unlinkat_only_in_socket_dirs)
{
    size_t n;
    const struct vhd_sandbox_rule *r = vhd_sandbox_rules(&n);
    int rows = 0;

    for (size_t i = 0; i < n; i++) {
        if (strcmp(r[i].name, "unlinkat"))
            continue;
        rows++;
        if (r[i].only_with == VHD_SANDBOX_F_RPC) {
            /* --rpc: a device added at runtime has a directory fd the filter never saw. */
            VHD_CHECK(r[i].arg == 2 && r[i].op == VHD_SANDBOX_ARG_MASKED_EQ && r[i].value == 0);
            VHD_CHECK(r[i].mask & AT_REMOVEDIR);
            continue;
        }
        VHD_CHECK(r[i].arg == 0 && r[i].op == VHD_SANDBOX_ARG_DIRFD);
        VHD_CHECK(r[i].has_and && r[i].and_arg == 2 && r[i].and_value == 0);
        VHD_CHECK(r[i].and_mask & AT_REMOVEDIR);
    }
    VHD_CHECK_EQ(rows, 2);
    VHD_CHECK(find_rule("unlink") == NULL || find_rule("unlink")->only_with == VHD_SANDBOX_F_RPC);
    /* getsockopt: SO_PEERCRED, and SO_ERROR for nbd only. */
    rows = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(r[i].name, "getsockopt"))
            continue;
        rows++;
        VHD_CHECK(r[i].arg == 1 && r[i].value == SOL_SOCKET && r[i].has_and && r[i].and_arg == 2);
        VHD_CHECK(r[i].and_value == SO_PEERCRED ||
                  (r[i].and_value == SO_ERROR && r[i].only_with == VHD_SANDBOX_F_NBD));
    }
    VHD_CHECK_EQ(rows, 2);
}

/* What only the nbd backend needs comes only with it, narrowed to what libnbd does. */
VHD_TEST(table_nbd_rows)
{
    const struct vhd_sandbox_rule *r;
    /* setsockopt: TCP_NODELAY only. */
    VHD_CHECK((r = find_rule("setsockopt")) != NULL && r->only_with == VHD_SANDBOX_F_NBD);
    VHD_CHECK(r->arg == 1 && r->value == IPPROTO_TCP && r->has_and && r->and_arg == 2 &&
              r->and_value == TCP_NODELAY);
    /* send/recv without an address: no datagrams to anywhere. */
    VHD_CHECK((r = find_rule("sendto")) != NULL && r->only_with == VHD_SANDBOX_F_NBD);
    VHD_CHECK(r->arg == 4 && r->op == VHD_SANDBOX_ARG_EQ && r->value == 0);
    VHD_CHECK((r = find_rule("recvfrom")) != NULL && r->only_with == VHD_SANDBOX_F_NBD);
    VHD_CHECK(r->arg == 4 && r->op == VHD_SANDBOX_ARG_EQ && r->value == 0);
    VHD_CHECK((r = find_rule("shutdown")) != NULL && r->only_with == VHD_SANDBOX_F_NBD);
}

/* =====================================================================
 * What vhostd does after setup still works under the filter.
 * ===================================================================== */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x, y;
    memcpy(&x, a, sizeof(x));
    memcpy(&y, b, sizeof(y));
    return x < y ? -1 : x > y;
}

static void allowed_ops_child(void *arg)
{
    (void)arg;
    char tmpl[] = "/tmp/vhd-sandbox-XXXXXX";

    /* Everything is created before the filter, as in the daemon. */
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int kick = eventfd(0, EFD_CLOEXEC); /* blocking, like a front-end's kick fd */
    int ep = epoll_create1(EPOLL_CLOEXEC);
    int mfd = memfd_create("vhd-sandbox", MFD_CLOEXEC);
    int sp[2];
    CHILD_CHECK(efd >= 0 && kick >= 0 && ep >= 0 && mfd >= 0);
    CHILD_CHECK(ftruncate(mfd, 1 << 20) == 0);
    CHILD_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0);
    int tfd = mkstemp(tmpl);
    CHILD_CHECK(tfd >= 0);
    int dirfd = open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC); /* the socket's directory */
    CHILD_CHECK(dirfd >= 0);
    uid_t me = getuid(); /* getuid is not in the table */

    CHILD_CHECK(vhd_sandbox_apply_dirs(VHD_SANDBOX_ON, 0, &dirfd, 1) == 0);

    /* epoll + eventfd: a kick wakes a loop. */
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = efd}, out[4];
    CHILD_CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) == 0);
    CHILD_CHECK(eventfd_write(efd, 3) == 0);
    CHILD_CHECK(epoll_wait(ep, out, 4, 1000) == 1 && out[0].data.fd == efd);
    uint64_t v = 0;
    CHILD_CHECK(read(efd, &v, sizeof(v)) == 8 && v == 3);
    CHILD_CHECK(epoll_wait(ep, out, 4, 0) == 0);
    CHILD_CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, efd, NULL) == 0);

    /* fcntl: O_NONBLOCK on a kick fd (vhd_rt_attach), FD_CLOEXEC. */
    int fl = fcntl(kick, F_GETFL);
    CHILD_CHECK(fl >= 0);
    CHILD_CHECK(fcntl(kick, F_SETFL, fl | O_NONBLOCK) == 0);
    CHILD_CHECK(fcntl(kick, F_SETFD, FD_CLOEXEC) == 0);
    CHILD_CHECK(read(kick, &v, sizeof(v)) < 0 && errno == EAGAIN);

    /* recvmsg with SCM_RIGHTS: a memory-region fd arrives, is checked and mapped. */
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    char byte = 'm';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = ctl.buf,
                        .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &mfd, sizeof(int));
    CHILD_CHECK(sendmsg(sp[0], &mh, MSG_NOSIGNAL | MSG_DONTWAIT) == 1);
    memset(&ctl, 0, sizeof(ctl));
    mh.msg_controllen = sizeof(ctl.buf);
    byte = 0;
    CHILD_CHECK(recvmsg(sp[1], &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT) == 1 && byte == 'm');
    cm = CMSG_FIRSTHDR(&mh);
    CHILD_CHECK(cm && cm->cmsg_type == SCM_RIGHTS);
    int rfd;
    memcpy(&rfd, CMSG_DATA(cm), sizeof(int));
    struct stat st;
    CHILD_CHECK(fstat(rfd, &st) == 0 && st.st_size == 1 << 20);
    uint8_t *a = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, rfd, 0);
    uint8_t *b = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
    CHILD_CHECK(a != MAP_FAILED && b != MAP_FAILED);
    CHILD_CHECK(madvise(a, 1 << 20, MADV_DONTDUMP) == 0);
    a[4096] = 0x5a;
    CHILD_CHECK(b[4096] == 0x5a);
    CHILD_CHECK(munmap(a, 1 << 20) == 0 && munmap(b, 1 << 20) == 0);
    CHILD_CHECK(close(rfd) == 0);

    /* poll: a reply waiting for room in the socket buffer. */
    struct pollfd pfd = {.fd = sp[0], .events = POLLOUT};
    CHILD_CHECK(poll(&pfd, 1, 1000) == 1);

    /* The heap: small, large (mmap), grown (mremap), aligned (bounce buffers). */
    void *p = malloc(64), *q = malloc(8 << 20), *al = NULL;
    CHILD_CHECK(p && q);
    q = realloc(q, 32 << 20);
    CHILD_CHECK(q);
    CHILD_CHECK(posix_memalign(&al, 4096, 1 << 20) == 0);
    memset(q, 1, 32 << 20);
    free(al);
    free(q);
    free(p);

    /*
     * Time, a short sleep, a log line. This process never formatted a time
     * before the filter: its first gmtime_r() would read /etc/localtime
     * (openat) had the sandbox not primed the time zone (--log-level warn).
     */
    struct timespec ts;
    CHILD_CHECK(clock_gettime(CLOCK_MONOTONIC, &ts) == 0);
    CHILD_CHECK(clock_gettime(CLOCK_REALTIME, &ts) == 0);
    CHILD_CHECK(usleep(100) == 0);
    struct tm tm;
    CHILD_CHECK(gmtime_r(&ts.tv_sec, &tm) != NULL);
    vhd_log(VHD_LOG_INFO, "a log line from the sandbox");

    /*
     * A big qsort, as mem.c does for a table of 61+ regions: glibc sizes
     * its buffer by the machine's RAM (sysinfo) the first time.
     */
    struct {
        uint64_t key, pad[5];
    } *big = calloc(200, sizeof(*big));
    CHILD_CHECK(big);
    for (int i = 0; i < 200; i++)
        big[i].key = (uint64_t)(200 - i);
    qsort(big, 200, sizeof(*big), cmp_u64);
    CHILD_CHECK(big[0].key == 1 && big[199].key == 200);
    free(big);

    /* GET_INFLIGHT_FD under the filter: a sealed memfd, sized, mapped shared (SET_INFLIGHT_FD). */
    int ifd = memfd_create("vhostd-inflight", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    CHILD_CHECK(ifd >= 0 && ftruncate(ifd, 8192) == 0);
    CHILD_CHECK(fcntl(ifd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0);
    void *ia = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_SHARED, ifd, 0);
    CHILD_CHECK(ia != MAP_FAILED && munmap(ia, 8192) == 0 && close(ifd) == 0);

    /* The backend at close: fdatasync; discard fallback ioctl (a file: ENOTTY, not SIGSYS). */
    CHILD_CHECK(write(tfd, "x", 1) == 1);
    CHILD_CHECK(fdatasync(tfd) == 0);
    uint64_t range[2] = {0, 4096};
    CHILD_CHECK(ioctl(tfd, BLKDISCARD, range) < 0 && errno == ENOTTY);

    /* Exit: stat and unlinkat of our socket file, by name in its directory. */
    CHILD_CHECK(fstatat(dirfd, tmpl + 5, &st, AT_SYMLINK_NOFOLLOW) == 0);
    CHILD_CHECK(unlinkat(dirfd, tmpl + 5, 0) == 0);
    CHILD_CHECK(close(dirfd) == 0);

    /* The session's peer, for allow-uid/allow-gid and the log line. */
    struct ucred cred;
    socklen_t clen = sizeof(cred);
    CHILD_CHECK(getsockopt(sp[0], SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0);
    CHILD_CHECK(cred.pid == getpid() && cred.uid == me);
    CHILD_CHECK(close(tfd) == 0 && close(sp[0]) == 0 && close(sp[1]) == 0);
    CHILD_CHECK(close(mfd) == 0 && close(ep) == 0 && close(kick) == 0 && close(efd) == 0);
}

VHD_TEST(allowed_operations_work)
{
    char d[64];
    int st = run_child(allowed_ops_child, NULL);
    if (!exited_ok(st))
        fprintf(stderr, "  sandboxed child: %s\n", describe(st, d, sizeof(d)));
    VHD_CHECK(exited_ok(st));
}

/* The workers (epoll, io_uring, mailbox) start before the filter and stop under it. */
static void runtime_child(void *arg)
{
    (void)arg;
    struct vhd_rt_opts o;
    struct vhd_rt *rt = NULL;

    vhd_rt_opts_default(&o);
    o.nworkers = 3;
    CHILD_CHECK(vhd_rt_new(&o, &rt) == 0);
    CHILD_CHECK(vhd_sandbox_apply(VHD_SANDBOX_ON) == 0);
    CHILD_CHECK(usleep(20000) == 0);
    CHILD_CHECK(eventfd_write(vhd_rt_event_fd(rt), 1) == 0);
    vhd_rt_free(rt); /* mailbox stop, pthread_join, io_uring_queue_exit, close */
}

VHD_TEST(runtime_stops_under_filter)
{
    char d[64];
    int st = run_child(runtime_child, NULL);
    if (!exited_ok(st))
        fprintf(stderr, "  sandboxed child: %s\n", describe(st, d, sizeof(d)));
    VHD_CHECK(exited_ok(st));
}

/* An internal assertion under the filter still ends in SIGABRT (and a core), not SIGSYS. */
static void abort_child(void *arg)
{
    (void)arg;
    CHILD_CHECK(vhd_sandbox_apply(VHD_SANDBOX_ON) == 0);
    abort();
}

VHD_TEST(abort_is_still_sigabrt)
{
    char d[64];
    int st = run_child(abort_child, NULL);
    if (!(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT))
        fprintf(stderr, "  sandboxed child: %s\n", describe(st, d, sizeof(d)));
    VHD_CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
}

/* =====================================================================
 * Forbidden syscalls: SIGSYS under the filter, harmless without it.
 * ===================================================================== */

static void *noop_thread(void *arg)
{
    return arg;
}

static void probe_execve(void)
{
    char *argv[] = {(char *)"true", NULL};
    execve("/bin/true", argv, environ);
}

static void probe_fork(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid(pid, NULL, 0);
}

static void probe_thread(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, noop_thread, NULL) == 0)
        pthread_join(t, NULL);
}

/* The directory fd the probes' filter allows unlinkat in (probe_child). */
static int probe_dirfd = -1;

static void probe_open_new_file(void)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/vhd-sandbox-probe-%d", (int)getpid());
    int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
    if (fd >= 0) {
        close(fd);
        unlink(path);
    }
}

/*
 * Client mode (VHD_SANDBOX_F_CLIENT): a Unix stream socket connects to the
 * front-end's listening socket; the back-off timer is armed and fires.
 * Without the flag (arg NULL) the first socket() must kill the child.
 */
static void client_ops_child(void *arg)
{
    bool client = arg != NULL;
    char tmpl[] = "/tmp/vhd-sandbox-cl-XXXXXX";
    int tfd = mkstemp(tmpl);
    CHILD_CHECK(tfd >= 0);
    close(tfd);
    unlink(tmpl);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    CHILD_CHECK(strlen(tmpl) < sizeof(sa.sun_path));
    strcpy(sa.sun_path, tmpl);
    int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHILD_CHECK(lfd >= 0 && bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    CHILD_CHECK(listen(lfd, 1) == 0);
    int timer = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    CHILD_CHECK(timer >= 0);
    int dirfd = open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC);
    CHILD_CHECK(dirfd >= 0);

    CHILD_CHECK(
        vhd_sandbox_apply_dirs(VHD_SANDBOX_ON, client ? VHD_SANDBOX_F_CLIENT : 0, &dirfd, 1) == 0);

    int cfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    CHILD_CHECK(cfd >= 0);
    CHILD_CHECK(connect(cfd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    CHILD_CHECK(close(cfd) == 0);
    struct itimerspec its = {.it_value = {.tv_nsec = 1000000}};
    CHILD_CHECK(timerfd_settime(timer, 0, &its, NULL) == 0);
    uint64_t expired = 0;
    struct pollfd tp = {.fd = timer, .events = POLLIN};
    CHILD_CHECK(poll(&tp, 1, 1000) == 1);
    CHILD_CHECK(read(timer, &expired, sizeof(expired)) == 8 && expired == 1);
    CHILD_CHECK(close(timer) == 0 && close(lfd) == 0 && unlinkat(dirfd, tmpl + 5, 0) == 0);
}

/*
 * The --rpc rows (arg: non-NULL to install them): a thread is created (clone3
 * refused with ENOSYS, glibc falls back to clone) and an image opened; a
 * process is not created even then (run separately: rpc_fork_child).
 */
static void *rpc_thread_fn(void *arg)
{
    return arg;
}

static void rpc_ops_child(void *arg)
{
    pthread_t t;
    void *ret = NULL;
    /* glibc's first thread installs its signal handlers: the daemon has workers by then. */
    CHILD_CHECK(pthread_create(&t, NULL, rpc_thread_fn, NULL) == 0 && pthread_join(t, NULL) == 0);
    CHILD_CHECK(vhd_sandbox_apply_with(VHD_SANDBOX_ON, arg ? VHD_SANDBOX_F_RPC : 0) == 0);
    CHILD_CHECK(pthread_create(&t, NULL, rpc_thread_fn, (void *)7) == 0);
    CHILD_CHECK(pthread_join(t, &ret) == 0 && ret == (void *)7);
    int fd = open("/etc/passwd", O_RDONLY | O_CLOEXEC);
    CHILD_CHECK(fd >= 0 && close(fd) == 0);
}

static void rpc_fork_child(void *arg)
{
    (void)arg;
    CHILD_CHECK(vhd_sandbox_apply_with(VHD_SANDBOX_ON, VHD_SANDBOX_F_RPC) == 0);
    long pid = syscall(SYS_clone, (unsigned long)SIGCHLD, 0UL, 0UL, 0UL, 0UL);
    if (pid == 0)
        _exit(0);
}

VHD_TEST(rpc_rows_only_with_the_flag)
{
    char d[64];
    int st = run_child(rpc_ops_child, (void *)1);
    if (!exited_ok(st))
        fprintf(stderr, "  --rpc rows: %s\n", describe(st, d, sizeof(d)));
    VHD_CHECK(exited_ok(st));
    st = run_child(rpc_ops_child, NULL);
    if (!killed_by_sigsys(st))
        fprintf(stderr, "  without --rpc: %s, expected SIGSYS\n", describe(st, d, sizeof(d)));
    VHD_CHECK(killed_by_sigsys(st));
    st = run_child(rpc_fork_child, NULL);
    if (!killed_by_sigsys(st))
        fprintf(stderr, "  a process under --rpc: %s, expected SIGSYS\n",
                describe(st, d, sizeof(d)));
    VHD_CHECK(killed_by_sigsys(st));
}

/* The client-mode rows are there with the flag, and only with it. */
VHD_TEST(client_mode_rows_only_with_the_flag)
{
    char d[64];
    int st = run_child(client_ops_child, (void *)1);
    if (!exited_ok(st))
        fprintf(stderr, "  client mode: %s\n", describe(st, d, sizeof(d)));
    VHD_CHECK(exited_ok(st));
    st = run_child(client_ops_child, NULL);
    if (!killed_by_sigsys(st))
        fprintf(stderr, "  without client mode: %s, expected SIGSYS\n", describe(st, d, sizeof(d)));
    VHD_CHECK(killed_by_sigsys(st));
}

static void probe_open_existing_file(void)
{
    int fd = open("/etc/passwd", O_RDONLY | O_CLOEXEC);
    if (fd >= 0)
        close(fd);
}

static void probe_socket_inet(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0)
        close(fd);
}

/* Unix stream sockets are allowed (client mode); other Unix types and families are not. */
static void probe_socket_unix_dgram(void)
{
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd >= 0)
        close(fd);
}

static void probe_socket_unix_seqpacket(void)
{
    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0);
    if (fd >= 0)
        close(fd);
}

static void probe_socket_inet6_stream(void)
{
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0)
        close(fd);
}

static void probe_socket_netlink(void)
{
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (fd >= 0)
        close(fd);
}

static void probe_socketpair(void)
{
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) == 0) {
        close(sp[0]);
        close(sp[1]);
    }
}

static void probe_mmap_exec(void)
{
    void *p = mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED)
        munmap(p, 4096);
}

static void probe_mprotect_exec(void)
{
    void *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return;
    mprotect(p, 4096, PROT_READ | PROT_EXEC);
    munmap(p, 4096);
}

static void probe_fcntl_dupfd(void)
{
    int fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 10);
    if (fd >= 0)
        close(fd);
}

static void probe_ioctl_other(void)
{
    int n;
    ioctl(STDIN_FILENO, FIONREAD, &n);
}

static void probe_kill(void)
{
    kill(getppid(), 0);
}

static void probe_tgkill_other_process(void)
{
    syscall(SYS_tgkill, (long)getppid(), (long)getppid(), 0L);
}

static void probe_futex_requeue(void)
{
    static uint32_t f1, f2;
    syscall(SYS_futex, &f1, FUTEX_CMP_REQUEUE_PRIVATE, 1, 1, &f2, 0);
}

static void probe_io_uring_setup(void)
{
    struct io_uring_params p;
    memset(&p, 0, sizeof(p));
    long fd = syscall(SYS_io_uring_setup, 4L, &p);
    if (fd >= 0)
        close((int)fd);
}

static void probe_pipe(void)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) == 0) {
        close(fds[0]);
        close(fds[1]);
    }
}

static void probe_eventfd(void)
{
    int fd = eventfd(0, EFD_CLOEXEC);
    if (fd >= 0)
        close(fd);
}

static void probe_setuid(void)
{
    syscall(SYS_setuid, (long)getuid());
}

static void probe_prctl(void)
{
    prctl(PR_GET_SECCOMP);
}

static void probe_unshare(void)
{
    syscall(SYS_unshare, 0L);
}

/* No unlink by path: not of a file that does not exist either (the call itself is the probe). */
static void probe_unlink(void)
{
    unlink("/tmp/vhd-sandbox-no-such-file");
}

static void probe_unlinkat_cwd(void)
{
    unlinkat(AT_FDCWD, "/tmp/vhd-sandbox-no-such-file", 0);
}

/* The probes run with /tmp's fd as the sockets' directory (probe_child): rmdir through it. */
static void probe_unlinkat_removedir(void)
{
    unlinkat(probe_dirfd, "vhd-sandbox-no-such-dir", AT_REMOVEDIR);
}

/* Another fd than the sockets' directory (stderr: ENOTDIR without the filter). */
static void probe_unlinkat_other_dir(void)
{
    unlinkat(STDERR_FILENO, "vhd-sandbox-no-such-file", 0);
}

/* getsockopt for anything but SO_PEERCRED. */
static void probe_getsockopt_other(void)
{
    int v;
    socklen_t len = sizeof(v);
    getsockopt(STDERR_FILENO, SOL_SOCKET, SO_RCVBUF, &v, &len);
}

/* connect to an abstract Unix socket (a short name, no file permissions apply). */
static void probe_connect_abstract(void)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, "\0vhd-sandbox-abstract", 22);
    connect(fd, (struct sockaddr *)&sa, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 22));
    close(fd);
}

static const struct probe {
    const char *name;
    void (*fn)(void);
} probes[] = {
    {"execve", probe_execve},
    {"fork", probe_fork},
    {"pthread_create", probe_thread},
    {"open a new file", probe_open_new_file},
    {"open /etc/passwd", probe_open_existing_file},
    {"socket(AF_INET)", probe_socket_inet},
    {"socket(AF_UNIX, SOCK_DGRAM)", probe_socket_unix_dgram},
    {"socket(AF_UNIX, SOCK_SEQPACKET)", probe_socket_unix_seqpacket},
    {"socket(AF_INET6, SOCK_STREAM)", probe_socket_inet6_stream},
    {"socket(AF_NETLINK)", probe_socket_netlink},
    {"socketpair", probe_socketpair},
    {"mmap(PROT_EXEC)", probe_mmap_exec},
    {"mprotect(PROT_EXEC)", probe_mprotect_exec},
    {"fcntl(F_DUPFD_CLOEXEC)", probe_fcntl_dupfd},
    {"ioctl(FIONREAD)", probe_ioctl_other},
    {"kill", probe_kill},
    {"tgkill of another process", probe_tgkill_other_process},
    {"futex(FUTEX_CMP_REQUEUE)", probe_futex_requeue},
    {"io_uring_setup", probe_io_uring_setup},
    {"pipe2", probe_pipe},
    {"eventfd", probe_eventfd},
    {"setuid", probe_setuid},
    {"prctl", probe_prctl},
    {"unshare", probe_unshare},
    {"unlink", probe_unlink},
    {"unlinkat(AT_FDCWD)", probe_unlinkat_cwd},
    {"unlinkat(AT_REMOVEDIR) in the socket dir", probe_unlinkat_removedir},
    {"unlinkat relative to another fd", probe_unlinkat_other_dir},
    {"getsockopt(SO_RCVBUF)", probe_getsockopt_other},
    {"connect to an abstract socket", probe_connect_abstract},
};
#define NPROBES (sizeof(probes) / sizeof(probes[0]))

struct probe_run {
    enum vhd_sandbox_mode mode;
    unsigned flags;
    const struct probe *p;
};

static void probe_child(void *arg)
{
    const struct probe_run *r = arg;
    /* As in the daemon: a socket directory where unlinkat is allowed. */
    probe_dirfd = open("/tmp", O_PATH | O_DIRECTORY | O_CLOEXEC);
    CHILD_CHECK(probe_dirfd >= 0);
    CHILD_CHECK(vhd_sandbox_apply_dirs(r->mode, r->flags, &probe_dirfd, 1) == 0);
    r->p->fn();
}

/* Run every probe under mode; count those whose outcome is not the expected one. */
static int run_probes_with(enum vhd_sandbox_mode mode, unsigned flags, bool expect_sigsys)
{
    int bad = 0;
    char d[64];

    for (size_t i = 0; i < NPROBES; i++) {
        struct probe_run r = {.mode = mode, .flags = flags, .p = &probes[i]};
        int st = run_child(probe_child, &r);
        bool ok = expect_sigsys ? killed_by_sigsys(st) : exited_ok(st);
        if (!ok) {
            fprintf(stderr, "  %s: %s, expected %s\n", probes[i].name, describe(st, d, sizeof(d)),
                    expect_sigsys ? "SIGSYS" : "exit 0");
            bad++;
        }
    }
    return bad;
}

static int run_probes(enum vhd_sandbox_mode mode, bool expect_sigsys)
{
    return run_probes_with(mode, 0, expect_sigsys);
}

VHD_TEST(forbidden_syscalls_kill_with_sigsys)
{
    VHD_CHECK_EQ(run_probes(VHD_SANDBOX_ON, true), 0);
    /* Client mode's rows let nothing else through (other sockets, socketpair). */
    VHD_CHECK_EQ(run_probes_with(VHD_SANDBOX_ON, VHD_SANDBOX_F_CLIENT, true), 0);
}

VHD_TEST(forbidden_syscalls_are_harmless_without_filter)
{
    /* The control: the same calls do not kill a process without the filter. */
    VHD_CHECK_EQ(run_probes(VHD_SANDBOX_OFF, false), 0);
}

VHD_TEST(log_mode_does_not_kill)
{
    VHD_CHECK_EQ(run_probes(VHD_SANDBOX_LOG, false), 0);
}

/* Not just "not killed": in log mode the forbidden call really happens (the kernel logs it). */
static void log_mode_child(void *arg)
{
    (void)arg;
    CHILD_CHECK(vhd_sandbox_apply(VHD_SANDBOX_LOG) == 0);
    int fd = open("/etc/passwd", O_RDONLY | O_CLOEXEC);
    CHILD_CHECK(fd >= 0);
    char c;
    CHILD_CHECK(read(fd, &c, 1) == 1);
    close(fd);
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    CHILD_CHECK(fd >= 0);
    close(fd);
}

VHD_TEST(log_mode_lets_the_call_succeed)
{
    char d[64];
    int st = run_child(log_mode_child, NULL);
    if (!exited_ok(st))
        fprintf(stderr, "  child: %s\n", describe(st, d, sizeof(d)));
    VHD_CHECK(exited_ok(st));
}

/* =====================================================================
 * Every thread: the filter reaches threads that existed before it (TSYNC).
 * ===================================================================== */

struct tsync {
    int go; /* blocking eventfd: the thread waits on it until the filter is on */
    bool forbidden;
};

static void *tsync_thread(void *arg)
{
    struct tsync *t = arg;
    uint64_t v;
    CHILD_CHECK(read(t->go, &v, sizeof(v)) == 8);
    if (t->forbidden) {
        int fd = socket(AF_INET, SOCK_STREAM, 0); /* the whole process dies here */
        child_fail(__FILE__, __LINE__, "socket(AF_INET) in a thread survived the filter");
        (void)fd;
    }
    void *p = malloc(1 << 20); /* a thread arena, then the thread exits under the filter */
    CHILD_CHECK(p);
    free(p);
    return NULL;
}

static void tsync_child(void *arg)
{
    struct tsync t = {.go = eventfd(0, EFD_CLOEXEC), .forbidden = *(bool *)arg};
    pthread_t th;
    CHILD_CHECK(t.go >= 0);
    CHILD_CHECK(pthread_create(&th, NULL, tsync_thread, &t) == 0);
    CHILD_CHECK(vhd_sandbox_apply(VHD_SANDBOX_ON) == 0);
    CHILD_CHECK(eventfd_write(t.go, 1) == 0);
    CHILD_CHECK(pthread_join(th, NULL) == 0);
}

VHD_TEST(filter_covers_existing_threads)
{
    char d[64];
    bool forbidden = true;
    int st = run_child(tsync_child, &forbidden);
    if (!killed_by_sigsys(st))
        fprintf(stderr, "  child: %s, expected SIGSYS\n", describe(st, d, sizeof(d)));
    VHD_CHECK(killed_by_sigsys(st));

    /* And a thread that only does allowed things runs and exits normally. */
    forbidden = false;
    st = run_child(tsync_child, &forbidden);
    if (!exited_ok(st))
        fprintf(stderr, "  child: %s, expected exit 0\n", describe(st, d, sizeof(d)));
    VHD_CHECK(exited_ok(st));
}

/* A thread created just before the filter starts up under it (the race seen in the daemon). */
static void late_start_child(void *arg)
{
    (void)arg;
    pthread_t th[8];
    for (int i = 0; i < 8; i++)
        CHILD_CHECK(pthread_create(&th[i], NULL, noop_thread, NULL) == 0);
    CHILD_CHECK(vhd_sandbox_apply(VHD_SANDBOX_ON) == 0);
    for (int i = 0; i < 8; i++)
        CHILD_CHECK(pthread_join(th[i], NULL) == 0);
}

VHD_TEST(threads_starting_under_filter)
{
    char d[64];
    for (int i = 0; i < 20; i++) {
        int st = run_child(late_start_child, NULL);
        if (!exited_ok(st))
            fprintf(stderr, "  round %d: child: %s\n", i, describe(st, d, sizeof(d)));
        VHD_CHECK(exited_ok(st));
    }
}

/* =====================================================================
 * Options
 * ===================================================================== */

static int parse(struct vhd_options *o, const char *const *args, int n, char *err, size_t len)
{
    char *argv[16];
    argv[0] = (char *)"vhostd";
    for (int i = 0; i < n; i++)
        argv[i + 1] = (char *)args[i];
    return vhd_options_parse(o, n + 1, argv, err, len);
}

VHD_TEST(options_sandbox_and_user)
{
    struct vhd_options o;
    char err[256];

    const char *dflt[] = {"--blk", "socket=/tmp/x.sock,backend=null,size=1M"};
    VHD_CHECK_EQ(parse(&o, dflt, 2, err, sizeof(err)), 0);
    VHD_CHECK_EQ(o.sandbox, VHD_OPT_SANDBOX_ON); /* on unless asked otherwise */
    VHD_CHECK(o.user == NULL);
    vhd_options_free(&o);

    const char *off[] = {"--sandbox=off", "--blk", "socket=/tmp/x.sock,backend=null,size=1M"};
    VHD_CHECK_EQ(parse(&o, off, 3, err, sizeof(err)), 0);
    VHD_CHECK_EQ(o.sandbox, VHD_OPT_SANDBOX_OFF);
    vhd_options_free(&o);

    const char *log[] = {"--sandbox", "log",   "--user",
                         "nobody",    "--blk", "socket=/tmp/x.sock,backend=null,size=1M"};
    VHD_CHECK_EQ(parse(&o, log, 6, err, sizeof(err)), 0);
    VHD_CHECK_EQ(o.sandbox, VHD_OPT_SANDBOX_LOG);
    VHD_CHECK(o.user && !strcmp(o.user, "nobody"));
    vhd_options_free(&o);

    const char *bad[] = {"--sandbox=yes", "--blk", "socket=/tmp/x.sock,backend=null,size=1M"};
    VHD_CHECK_EQ(parse(&o, bad, 3, err, sizeof(err)), -1);
    VHD_CHECK(strstr(err, "--sandbox yes: expected on, off or log"));
    vhd_options_free(&o);

    const char *nouser[] = {"--user=", "--blk", "socket=/tmp/x.sock,backend=null,size=1M"};
    VHD_CHECK_EQ(parse(&o, nouser, 3, err, sizeof(err)), -1);
    vhd_options_free(&o);

    /* The config file takes them too. */
    char path[] = "/tmp/vhd-sandbox-conf-XXXXXX";
    int fd = mkstemp(path);
    VHD_CHECK(fd >= 0);
    const char conf[] =
        "sandbox log\nuser 1000:1000\nblk socket=/tmp/x.sock,backend=null,size=1M\n";
    VHD_CHECK_EQ(write(fd, conf, strlen(conf)), (ssize_t)strlen(conf));
    close(fd);
    const char *cf[] = {"--config", path};
    int rc = parse(&o, cf, 2, err, sizeof(err));
    unlink(path);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK_EQ(o.sandbox, VHD_OPT_SANDBOX_LOG);
    VHD_CHECK(o.user && !strcmp(o.user, "1000:1000"));
    vhd_options_free(&o);
}

/* socket-group=, allow-uid=, allow-gid=: names and numbers into the transport's settings. */
VHD_TEST(access_names_resolve)
{
    struct vhd_opt_access in = {
        .mode = 0660, .group = "root", .allow_uid = "root:65534", .allow_gid = "0:107"};
    struct vhd_endpoint_access out;
    char err[256] = "";

    VHD_CHECK_EQ(vhd_sandbox_resolve_access(&in, &out, err, sizeof(err)), 0);
    VHD_CHECK(out.mode == 0660 && out.gid_set && out.gid == 0);
    VHD_CHECK(out.nuids == 2 && out.uids[0] == 0 && out.uids[1] == 65534);
    VHD_CHECK(out.ngids == 2 && out.gids[0] == 0 && out.gids[1] == 107);

    struct vhd_opt_access none = {0};
    VHD_CHECK_EQ(vhd_sandbox_resolve_access(&none, &out, err, sizeof(err)), 0);
    VHD_CHECK(out.mode == 0 && !out.gid_set && out.nuids == 0 && out.ngids == 0);

    struct vhd_opt_access bad = {.allow_uid = "0:vhd-no-such-user"};
    VHD_CHECK_EQ(vhd_sandbox_resolve_access(&bad, &out, err, sizeof(err)), -ENOENT);
    VHD_CHECK(strstr(err, "allow-uid=vhd-no-such-user: no such user"));
    struct vhd_opt_access badg = {.group = "vhd-no-such-group"};
    VHD_CHECK(vhd_sandbox_resolve_access(&badg, &out, err, sizeof(err)) < 0);
    VHD_CHECK(strstr(err, "socket-group=vhd-no-such-group: no such group"));
}

/* =====================================================================
 * --user
 * ===================================================================== */

struct drop_args {
    const char *user;
    const char *sock; /* a socket file to hand over */
    uid_t uid;
    gid_t gid;
};

static void drop_child(void *arg)
{
    const struct drop_args *a = arg;
    char err[256] = "";
    const char *paths[] = {a->sock};

    int rc = vhd_sandbox_drop_user(a->user, paths, NULL, 1, err, sizeof(err));
    if (rc < 0)
        child_fail(__FILE__, __LINE__, err);
    uid_t r, e, s;
    gid_t rg, eg, sg;
    CHILD_CHECK(getresuid(&r, &e, &s) == 0 && r == a->uid && e == a->uid && s == a->uid);
    CHILD_CHECK(getresgid(&rg, &eg, &sg) == 0 && rg == a->gid && eg == a->gid && sg == a->gid);
    gid_t groups[4];
    int ng = getgroups(4, groups);
    CHILD_CHECK(ng == 1 && groups[0] == a->gid);
    CHILD_CHECK(setuid(0) < 0 && errno == EPERM);
    /* Then the filter goes on as that user, as in the daemon. */
    CHILD_CHECK(vhd_sandbox_apply(VHD_SANDBOX_ON) == 0);
}

VHD_TEST(drop_to_user)
{
    if (geteuid() != 0)
        vhd_test_skip("needs root to change users");
    char dir[] = "/tmp/vhd-sandbox-user-XXXXXX";
    VHD_CHECK(mkdtemp(dir));
    struct drop_args a = {.user = "65534:65533", .uid = 65534, .gid = 65533};
    char sock[64];
    snprintf(sock, sizeof(sock), "%s/s.sock", dir);
    a.sock = sock;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", sock);
    VHD_CHECK_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);

    char d[64];
    int st = run_child(drop_child, &a);
    if (!exited_ok(st))
        fprintf(stderr, "  child: %s\n", describe(st, d, sizeof(d)));
    struct stat sb;
    VHD_CHECK_EQ(lstat(sock, &sb), 0); /* in the parent: the child cannot enter our 0700 dir */
    close(fd);
    unlink(sock);
    rmdir(dir);
    VHD_CHECK(exited_ok(st));
    VHD_CHECK(sb.st_uid == a.uid && sb.st_gid == a.gid); /* handed over to the user */
}

static void unknown_user_child(void *arg)
{
    (void)arg;
    char err[256] = "";
    CHILD_CHECK(vhd_sandbox_drop_user("vhd-no-such-user", NULL, NULL, 0, err, sizeof(err)) ==
                -ENOENT);
    CHILD_CHECK(strstr(err, "no such user") != NULL);
    CHILD_CHECK(vhd_sandbox_drop_user("12:x", NULL, NULL, 0, err, sizeof(err)) < 0);
    CHILD_CHECK(vhd_sandbox_drop_user("", NULL, NULL, 0, err, sizeof(err)) == -EINVAL);
}

VHD_TEST(drop_to_unknown_user_fails)
{
    VHD_CHECK(exited_ok(run_child(unknown_user_child, NULL)));
}

/* =====================================================================
 * The real daemon: build/vhostd (next to this test binary) under the filter.
 * ===================================================================== */

#define TIMEOUT_MS 10000
#define QSIZE      16
#define NQ         2
#define IMG_SIZE   (16u << 20)

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* dir/name for a file next to this test program; false when it does not exist. */
static bool beside_me(const char *name, char *out, size_t len)
{
    char self[512];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return false;
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (!slash)
        return false;
    *slash = '\0';
    snprintf(out, len, "%s/%s", self, name);
    return access(out, F_OK) == 0;
}

struct daemon_run {
    char dir[64];   /* scratch directory */
    char sock[128]; /* its socket */
    char img[128];  /* its image */
    char log[128];  /* its stdout + stderr */
    pid_t pid;
};

/*
 * Start vhostd with `sandbox` serving a 16 MiB image with NQ queues on 2
 * workers; poke: VHD_SANDBOX_POKE for the preload library (NULL: none).
 * Waits until the daemon reports its sandbox state. Skips when build/vhostd
 * is missing.
 */
/* With --rpc PATH (the management API) too: daemon_start_rpc; and --config FILE. */
static bool start_with_rpc;
static const char *start_config;

static void daemon_start(struct daemon_run *d, const char *sandbox, const char *poke)
{
    char vhostd[600], pokelib[600];
    if (!beside_me("vhostd", vhostd, sizeof(vhostd)))
        vhd_test_skip("vhostd is not built next to this test");
    if (poke && !beside_me("sandbox-poke.so", pokelib, sizeof(pokelib)))
        vhd_test_skip("sandbox-poke.so is not built next to this test");

    snprintf(d->dir, sizeof(d->dir), "/tmp/vhd-sandbox-daemon-XXXXXX");
    VHD_CHECK(mkdtemp(d->dir));
    snprintf(d->sock, sizeof(d->sock), "%s/vhostd.sock", d->dir);
    snprintf(d->img, sizeof(d->img), "%s/disk.img", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/vhostd.log", d->dir);
    int fd = open(d->img, O_CREAT | O_RDWR | O_CLOEXEC, 0600);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(ftruncate(fd, IMG_SIZE), 0);
    close(fd);

    char sb[64], blk[400];
    snprintf(sb, sizeof(sb), "--sandbox=%s", sandbox);
    snprintf(blk, sizeof(blk), "socket=%s,image=%s,queues=%d,serial=sandbox", d->sock, d->img, NQ);
    fflush(NULL);
    d->pid = fork();
    VHD_CHECK(d->pid >= 0);
    if (d->pid == 0) {
        int lfd = open(d->log, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
        if (lfd < 0 || dup2(lfd, STDOUT_FILENO) < 0 || dup2(lfd, STDERR_FILENO) < 0)
            _exit(126);
        /* A SIGSYS kill dumps core: not into the source tree. */
        struct rlimit rl = {0, 0};
        setrlimit(RLIMIT_CORE, &rl);
        if (chdir(d->dir) < 0)
            _exit(126);
        if (poke) {
            setenv("LD_PRELOAD", pokelib, 1);
            setenv("VHD_SANDBOX_POKE", poke, 1);
            /* ASan insists on being first in the library list; the poke goes first. */
            const char *ao = getenv("ASAN_OPTIONS");
            char buf[512];
            snprintf(buf, sizeof(buf), "%s%sverify_asan_link_order=0", ao ? ao : "", ao ? ":" : "");
            setenv("ASAN_OPTIONS", buf, 1);
        }
        char rpc[128];
        snprintf(rpc, sizeof(rpc), "%s/rpc.sock", d->dir);
        char *argv[] = {
            vhostd, sb,  (char *)"--workers", (char *)"2", (char *)"--blk", blk, NULL, NULL, NULL,
            NULL,   NULL};
        if (start_with_rpc) {
            argv[6] = (char *)"--rpc";
            argv[7] = rpc;
        }
        if (start_config) {
            argv[8] = (char *)"--config";
            argv[9] = (char *)start_config;
        }
        execv(vhostd, argv);
        _exit(127);
    }
    /* The sandbox line is logged once setup is complete and the filter is on. */
    const char *want = !strcmp(sandbox, "on")    ? "sandbox: seccomp filter on"
                       : !strcmp(sandbox, "log") ? "sandbox: seccomp filter in log mode"
                                                 : "sandbox: off";
    uint64_t t0 = now_ms();
    for (;;) {
        char buf[8192] = "";
        int lfd = open(d->log, O_RDONLY | O_CLOEXEC);
        if (lfd >= 0) {
            ssize_t n = read(lfd, buf, sizeof(buf) - 1);
            buf[n > 0 ? n : 0] = '\0';
            close(lfd);
        }
        if (strstr(buf, want))
            break;
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            fprintf(stderr, "  vhostd exited during setup:\n%s\n", buf);
            VHD_CHECK(!"vhostd did not start");
        }
        VHD_CHECK(now_ms() - t0 < TIMEOUT_MS);
        usleep(10000);
    }
}

/* Print the daemon's log (on failure). */
static void daemon_dump_log(const struct daemon_run *d)
{
    char buf[8192];
    int fd = open(d->log, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    fprintf(stderr, "  --- vhostd log ---\n%s  ---\n", buf);
}

static bool log_has(const struct daemon_run *d, const char *needle)
{
    char buf[8192];
    int fd = open(d->log, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return strstr(buf, needle) != NULL;
}

/* Wait (bounded) for the daemon to end; its wait status, or -1 when it still runs. */
static int daemon_wait(struct daemon_run *d, int timeout_ms)
{
    uint64_t t0 = now_ms();
    int st;
    for (;;) {
        pid_t r = waitpid(d->pid, &st, WNOHANG);
        if (r == d->pid) {
            d->pid = -1;
            return st;
        }
        if (now_ms() - t0 > (uint64_t)timeout_ms)
            return -1;
        usleep(5000);
    }
}

static void daemon_cleanup(struct daemon_run *d)
{
    if (d->pid > 0) {
        kill(d->pid, SIGKILL);
        waitpid(d->pid, NULL, 0);
        d->pid = -1;
    }
    unlink(d->sock);
    unlink(d->img);
    unlink(d->log);
    rmdir(d->dir);
}

/* ---- a small vhost-user front-end: raw messages, driver rings from src/driver ---- */

struct fe {
    int fd;
    bool ack; /* REPLY_ACK negotiated */
    uint64_t features;
    struct vhd_guestmem gm;
    struct vhd_drv_vq dq[NQ];
    int kick[NQ], call[NQ];
    uint8_t *buf; /* per queue: header at 0, status at 64, data at 4096 (4 KiB) */
    uint64_t buf_gpa;
};

#define FE_BUF_STRIDE (3u * 4096)

static int fe_connect_once(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(fd >= 0);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static void fe_send(struct fe *f, uint32_t req, uint32_t flags, const void *p, uint32_t size,
                    const int *fds, unsigned nfds)
{
    uint8_t buf[sizeof(struct vu_hdr) + 512];
    struct vu_hdr h = {.request = req, .flags = flags, .size = size};
    union {
        char b[CMSG_SPACE(8 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    VHD_CHECK(size <= 512 && nfds <= 8);
    memcpy(buf, &h, sizeof(h));
    if (size)
        memcpy(buf + sizeof(h), p, size);
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(h) + size};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    if (nfds) {
        memset(&ctl, 0, sizeof(ctl));
        mh.msg_control = ctl.b;
        mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
    }
    VHD_CHECK_EQ(sendmsg(f->fd, &mh, MSG_NOSIGNAL), (ssize_t)iov.iov_len);
}

static int fe_read_full(int fd, void *buf, size_t len)
{
    size_t got = 0;
    while (got < len) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, TIMEOUT_MS) == 0)
            return -ETIMEDOUT;
        ssize_t n = read(fd, (char *)buf + got, len - got);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n > 0)
            got += (size_t)n;
    }
    return 0;
}

/* Receive the reply to req; returns its payload size or -errno (connection gone, timeout). */
static int fe_reply(struct fe *f, uint32_t req, void *p, size_t cap)
{
    struct vu_hdr h;
    int rc = fe_read_full(f->fd, &h, sizeof(h));
    if (rc < 0)
        return rc;
    VHD_CHECK_EQ(h.request, req);
    VHD_CHECK_EQ(h.flags, VHOST_USER_VERSION | VHOST_USER_REPLY_MASK);
    VHD_CHECK(h.size <= cap);
    rc = fe_read_full(f->fd, p, h.size);
    return rc < 0 ? rc : (int)h.size;
}

static uint64_t fe_get_u64(struct fe *f, uint32_t req)
{
    uint64_t v = 0;
    fe_send(f, req, VHOST_USER_VERSION, NULL, 0, NULL, 0);
    VHD_CHECK_EQ(fe_reply(f, req, &v, sizeof(v)), 8);
    return v;
}

/* A message without a reply of its own; acked (and checked) when REPLY_ACK is on. */
static void fe_set(struct fe *f, uint32_t req, const void *p, uint32_t size, const int *fds,
                   unsigned nfds)
{
    fe_send(f, req, VHOST_USER_VERSION | (f->ack ? VHOST_USER_NEED_REPLY_MASK : 0), p, size, fds,
            nfds);
    if (f->ack) {
        uint64_t v = ~0ull;
        VHD_CHECK_EQ(fe_reply(f, req, &v, sizeof(v)), 8);
        VHD_CHECK_EQ(v, 0);
    }
}

static void fe_set_u64(struct fe *f, uint32_t req, uint64_t v)
{
    fe_set(f, req, &v, sizeof(v), NULL, 0);
}

static void fe_set_state(struct fe *f, uint32_t req, uint32_t index, uint32_t num)
{
    struct vu_vring_state st = {.index = index, .num = num};
    fe_set(f, req, &st, sizeof(st), NULL, 0);
}

/*
 * Connect and bring the device up the way QEMU does: features, protocol
 * features, owner, config, memory table (mmap'ed by the daemon under the
 * filter), then NQ split rings with kick and call eventfds.
 */
static void fe_up(struct fe *f, const char *path)
{
    memset(f, 0, sizeof(*f));
    /* A reconnect right after a disconnect may be refused while the old session ends. */
    uint64_t t0 = now_ms(), feat = 0;
    for (;;) {
        f->fd = fe_connect_once(path);
        if (f->fd >= 0) {
            struct vu_hdr h = {VHOST_USER_GET_FEATURES, VHOST_USER_VERSION, 0};
            if (send(f->fd, &h, sizeof(h), MSG_NOSIGNAL) == (ssize_t)sizeof(h) &&
                fe_reply(f, VHOST_USER_GET_FEATURES, &feat, sizeof(feat)) == 8)
                break;
            close(f->fd);
        }
        VHD_CHECK(now_ms() - t0 < TIMEOUT_MS);
        usleep(5000);
    }
    VHD_CHECK(feat & BIT(VIRTIO_F_VERSION_1));
    VHD_CHECK(feat & BIT(VHOST_USER_F_PROTOCOL_FEATURES));
    uint64_t pf = fe_get_u64(f, VHOST_USER_GET_PROTOCOL_FEATURES);
    uint64_t want = BIT(VHOST_USER_PROTOCOL_F_REPLY_ACK) | BIT(VHOST_USER_PROTOCOL_F_CONFIG) |
                    BIT(VHOST_USER_PROTOCOL_F_MQ);
    VHD_CHECK_EQ(pf & want, want);
    fe_set_u64(f, VHOST_USER_SET_PROTOCOL_FEATURES, want);
    f->ack = true;
    fe_set(f, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0);
    VHD_CHECK(fe_get_u64(f, VHOST_USER_GET_QUEUE_NUM) >= NQ);
    f->features = (feat & (BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_BLK_F_FLUSH) |
                           BIT(VIRTIO_BLK_F_MQ) | BIT(VIRTIO_BLK_F_DISCARD))) |
                  BIT(VHOST_USER_F_PROTOCOL_FEATURES);
    fe_set_u64(f, VHOST_USER_SET_FEATURES, f->features);

    struct vu_config cfg = {.offset = 0, .size = 8};
    fe_send(f, VHOST_USER_GET_CONFIG, VHOST_USER_VERSION, &cfg, VU_CONFIG_HDR_SIZE + 8, NULL, 0);
    VHD_CHECK_EQ(fe_reply(f, VHOST_USER_GET_CONFIG, &cfg, sizeof(cfg)), VU_CONFIG_HDR_SIZE + 8);
    uint64_t capacity;
    memcpy(&capacity, cfg.region, 8);
    VHD_CHECK_EQ(capacity, IMG_SIZE / 512);

    VHD_CHECK_EQ(vhd_guestmem_init(&f->gm, 1, 2u << 20, 0x40000000ull, 0), 0);
    struct vu_mem_table m = {.nregions = 1};
    m.regions[0].gpa = f->gm.r[0].gpa;
    m.regions[0].size = f->gm.r[0].size;
    m.regions[0].uva = vhd_guestmem_uva(&f->gm, f->gm.r[0].gpa);
    fe_set(f, VHOST_USER_SET_MEM_TABLE, &m, VU_MEM_TABLE_HDR_SIZE + 32, &f->gm.r[0].fd, 1);

    void *b;
    f->buf_gpa = vhd_guestmem_alloc(&f->gm, NQ * FE_BUF_STRIDE, 4096, &b);
    VHD_CHECK(f->buf_gpa != UINT64_MAX);
    f->buf = b;
    for (uint32_t i = 0; i < NQ; i++) {
        struct vhd_drv_vq_params p = {.size = QSIZE};
        p.area_len = vhd_drv_vq_area_size(QSIZE, false, 0);
        p.area_gpa = vhd_guestmem_alloc(&f->gm, p.area_len, 4096, &p.area);
        VHD_CHECK(p.area_gpa != UINT64_MAX);
        VHD_CHECK_EQ(vhd_drv_vq_init(&f->dq[i], &p), 0);
        f->kick[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        f->call[i] = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        VHD_CHECK(f->kick[i] >= 0 && f->call[i] >= 0);
        fe_set_state(f, VHOST_USER_SET_VRING_NUM, i, QSIZE);
        fe_set_state(f, VHOST_USER_SET_VRING_BASE, i, 0);
        struct vu_vring_addr a = {
            .index = i,
            .desc = vhd_guestmem_uva(&f->gm, f->dq[i].desc_gpa),
            .avail = vhd_guestmem_uva(&f->gm, f->dq[i].avail_gpa),
            .used = vhd_guestmem_uva(&f->gm, f->dq[i].used_gpa),
        };
        fe_set(f, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0);
        uint64_t idx = i;
        fe_set(f, VHOST_USER_SET_VRING_KICK, &idx, sizeof(idx), &f->kick[i], 1);
        fe_set(f, VHOST_USER_SET_VRING_CALL, &idx, sizeof(idx), &f->call[i], 1);
        fe_set_state(f, VHOST_USER_SET_VRING_ENABLE, i, 1);
    }
}

/* One request on queue q: type, sector, data (len bytes, device-readable or -writable). */
static uint8_t fe_request(struct fe *f, uint32_t q, uint32_t type, uint64_t sector, uint32_t len)
{
    uint8_t *base = f->buf + q * FE_BUF_STRIDE;
    uint64_t gpa = f->buf_gpa + q * FE_BUF_STRIDE;
    struct virtio_blk_outhdr h = {.type = type, .sector = sector};
    memcpy(base, &h, sizeof(h));
    base[64] = 0xff;
    struct vhd_drv_buf bufs[3];
    uint32_t nr = 1, nw = 1, n = 0;
    bufs[n++] = (struct vhd_drv_buf){gpa, sizeof(h)};
    if (len && type == VIRTIO_BLK_T_IN) {
        bufs[n++] = (struct vhd_drv_buf){gpa + 4096, len};
        nw++;
    } else if (len) {
        bufs[n++] = (struct vhd_drv_buf){gpa + 4096, len};
        nr++;
    }
    bufs[n++] = (struct vhd_drv_buf){gpa + 64, 1};
    VHD_CHECK_EQ(vhd_drv_vq_add(&f->dq[q], bufs, nr, nw, false, (void *)(uintptr_t)(q + 1)), 0);
    vhd_drv_vq_publish(&f->dq[q]);
    VHD_CHECK_EQ(eventfd_write(f->kick[q], 1), 0);

    uint64_t t0 = now_ms();
    for (;;) {
        void *cookie;
        uint32_t used_len;
        int rc = vhd_drv_vq_get_used(&f->dq[q], &cookie, &used_len);
        VHD_CHECK(rc >= 0);
        if (rc == 1) {
            VHD_CHECK_EQ((uintptr_t)cookie, q + 1);
            return base[64];
        }
        VHD_CHECK(now_ms() - t0 < TIMEOUT_MS);
        struct pollfd pfd = {.fd = f->call[q], .events = POLLIN};
        if (poll(&pfd, 1, 100) == 1) {
            uint64_t v;
            VHD_CHECK_EQ(read(f->call[q], &v, sizeof(v)), 8);
        }
    }
}

static void fe_down(struct fe *f)
{
    /* GET_VRING_BASE stops each ring (the worker detaches it) before the disconnect. */
    for (uint32_t i = 0; i < NQ; i++) {
        struct vu_vring_state st = {.index = i};
        fe_send(f, VHOST_USER_GET_VRING_BASE, VHOST_USER_VERSION, &st, sizeof(st), NULL, 0);
        VHD_CHECK_EQ(fe_reply(f, VHOST_USER_GET_VRING_BASE, &st, sizeof(st)), 8);
    }
    close(f->fd);
    for (uint32_t i = 0; i < NQ; i++) {
        vhd_drv_vq_fini(&f->dq[i]);
        close(f->kick[i]);
        close(f->call[i]);
    }
    vhd_guestmem_fini(&f->gm);
}

static void fill(uint8_t *p, size_t len, uint32_t seed)
{
    for (size_t i = 0; i < len; i++)
        p[i] = (uint8_t)(seed * 131 + i * 7 + (i >> 9));
}

static void daemon_io(struct daemon_run *d)
{
    struct fe f;
    uint8_t want[4096];

    /* Session 1: write on both queues (both workers), flush, read back, discard. */
    fe_up(&f, d->sock);
    for (uint32_t q = 0; q < NQ; q++) {
        fill(f.buf + q * FE_BUF_STRIDE + 4096, 4096, q + 1);
        VHD_CHECK_EQ(fe_request(&f, q, VIRTIO_BLK_T_OUT, 8 + 8 * q, 4096), VIRTIO_BLK_S_OK);
    }
    VHD_CHECK_EQ(fe_request(&f, 0, VIRTIO_BLK_T_FLUSH, 0, 0), VIRTIO_BLK_S_OK);
    for (uint32_t q = 0; q < NQ; q++) {
        memset(f.buf + q * FE_BUF_STRIDE + 4096, 0, 4096);
        VHD_CHECK_EQ(fe_request(&f, q, VIRTIO_BLK_T_IN, 8 + 8 * q, 4096), VIRTIO_BLK_S_OK);
        fill(want, sizeof(want), q + 1);
        VHD_CHECK(!memcmp(f.buf + q * FE_BUF_STRIDE + 4096, want, 4096));
    }
    if (f.features & BIT(VIRTIO_BLK_F_DISCARD)) {
        struct virtio_blk_discard_write_zeroes seg = {.sector = 1024, .num_sectors = 64};
        memcpy(f.buf + 4096, &seg, sizeof(seg));
        VHD_CHECK_EQ(fe_request(&f, 0, VIRTIO_BLK_T_DISCARD, 0, sizeof(seg)), VIRTIO_BLK_S_OK);
    }
    fe_down(&f);

    /* Session 2 (a reconnect: a new memory table mapped under the filter): the data is there. */
    fe_up(&f, d->sock);
    VHD_CHECK_EQ(fe_request(&f, 1, VIRTIO_BLK_T_IN, 8, 4096), VIRTIO_BLK_S_OK);
    fill(want, sizeof(want), 1);
    VHD_CHECK(!memcmp(f.buf + FE_BUF_STRIDE + 4096, want, 4096));
    fe_down(&f);
}

VHD_TEST(daemon_serves_io_under_sandbox)
{
    struct daemon_run d;
    daemon_start(&d, "on", NULL);
    daemon_io(&d);

    /* SIGTERM: drain, fdatasync, close, unlink, exit 0, all under the filter. */
    VHD_CHECK_EQ(kill(d.pid, SIGTERM), 0);
    int st = daemon_wait(&d, TIMEOUT_MS);
    char desc[64];
    if (!exited_ok(st)) {
        fprintf(stderr, "  vhostd: %s\n", st == -1 ? "still running" : describe(st, desc, 64));
        daemon_dump_log(&d);
    }
    VHD_CHECK(exited_ok(st));
    VHD_CHECK(access(d.sock, F_OK) < 0 && errno == ENOENT); /* removed at exit */

    /* What session 1 wrote through queue 0 is in the image on the host. */
    uint8_t got[4096], want[4096];
    int fd = open(d.img, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(pread(fd, got, sizeof(got), 8 * 512), (ssize_t)sizeof(got));
    close(fd);
    fill(want, sizeof(want), 1);
    VHD_CHECK(!memcmp(got, want, sizeof(got)));
    VHD_CHECK(!log_has(&d, " error:") && !log_has(&d, " warn:"));
    daemon_cleanup(&d);
}

/* Connect (the daemon's next accept4 runs the poke), then see what became of the daemon. */
static int daemon_poke(struct daemon_run *d)
{
    uint64_t t0 = now_ms();
    int fd;
    while ((fd = fe_connect_once(d->sock)) < 0)
        VHD_CHECK(now_ms() - t0 < TIMEOUT_MS);
    int st = daemon_wait(d, 2000);
    close(fd);
    return st;
}

VHD_TEST(daemon_dies_on_forbidden_syscall)
{
    static const char *const pokes[] = {"open", "socket"};
    char desc[64];

    for (int i = 0; i < 2; i++) {
        struct daemon_run d;
        daemon_start(&d, "on", pokes[i]);
        int st = daemon_poke(&d);
        if (!killed_by_sigsys(st)) {
            fprintf(stderr, "  poke %s: vhostd %s, expected SIGSYS\n", pokes[i],
                    st == -1 ? "still running" : describe(st, desc, sizeof(desc)));
            daemon_dump_log(&d);
        }
        VHD_CHECK(killed_by_sigsys(st));
        VHD_CHECK(!log_has(&d, "sandbox-poke")); /* it never got past the call */
        daemon_cleanup(&d);
    }
}

VHD_TEST(daemon_survives_the_poke_without_filter_or_in_log_mode)
{
    static const char *const modes[] = {"off", "log"};
    char desc[64];

    for (int i = 0; i < 2; i++) {
        struct daemon_run d;
        daemon_start(&d, modes[i], "open");
        int st = daemon_poke(&d);
        if (st != -1) {
            fprintf(stderr, "  --sandbox=%s: vhostd %s, expected it to keep running\n", modes[i],
                    describe(st, desc, sizeof(desc)));
            daemon_dump_log(&d);
        }
        VHD_CHECK_EQ(st, -1);
        VHD_CHECK(log_has(&d, "sandbox-poke: open /etc/passwd: allowed"));
        VHD_CHECK_EQ(kill(d.pid, SIGTERM), 0);
        st = daemon_wait(&d, TIMEOUT_MS);
        VHD_CHECK(exited_ok(st));
        daemon_cleanup(&d);
    }
}

/* =====================================================================
 * Capabilities: root without --user keeps none once setup is done.
 * ===================================================================== */

/*
 * The union over every thread of pid of the hexadecimal mask of field
 * ("CapEff:") in /proc/PID/task/TID/status (capabilities are per thread);
 * -1 when absent. *nthreads: how many threads were read.
 */
static long long proc_caps(pid_t pid, const char *field, int *nthreads)
{
    char path[320], line[256];
    long long v = 0;
    int n = 0;
    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    DIR *dir = opendir(path);
    VHD_CHECK(dir != NULL);
    for (struct dirent *de; (de = readdir(dir));) {
        if (de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)pid, de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue; /* the thread just exited */
        bool seen = false;
        while (fgets(line, sizeof(line), f))
            if (!strncmp(line, field, strlen(field))) {
                v |= strtoll(line + strlen(field), NULL, 16);
                seen = true;
            }
        fclose(f);
        if (!seen)
            v = -1;
        n++;
    }
    closedir(dir);
    if (nthreads)
        *nthreads = n;
    return v;
}

VHD_TEST(daemon_as_root_drops_every_capability)
{
    if (geteuid() != 0)
        vhd_test_skip("needs root");
    struct daemon_run d;
    daemon_start(&d, "on", NULL);
    /* Every thread: the workers existed before the drop and each must drop its own. */
    int nthreads = 0;
    long long eff = proc_caps(d.pid, "CapEff:", &nthreads), prm = proc_caps(d.pid, "CapPrm:", NULL);
    long long bnd = proc_caps(d.pid, "CapBnd:", NULL), amb = proc_caps(d.pid, "CapAmb:", NULL);
    VHD_CHECK(nthreads >= 2); /* the control thread and a worker at least */
    if (eff || prm || bnd || amb) {
        fprintf(stderr, "  CapEff %llx CapPrm %llx CapBnd %llx CapAmb %llx\n", eff, prm, bnd, amb);
        daemon_dump_log(&d);
    }
    VHD_CHECK_EQ(eff, 0);
    VHD_CHECK_EQ(prm, 0);
    VHD_CHECK_EQ(bnd, 0);
    VHD_CHECK_EQ(amb, 0);
    VHD_CHECK(log_has(&d, "sandbox: no --user: dropped every capability"));
    /* And it still serves, and removes its socket at exit as uid 0 without capabilities. */
    daemon_io(&d);
    VHD_CHECK_EQ(kill(d.pid, SIGTERM), 0);
    VHD_CHECK(exited_ok(daemon_wait(&d, TIMEOUT_MS)));
    VHD_CHECK(access(d.sock, F_OK) < 0 && errno == ENOENT);
    daemon_cleanup(&d);
}

/* =====================================================================
 * --rpc: devices come and go under the filter; what it forbids still kills.
 * ===================================================================== */

static void daemon_start_rpc(struct daemon_run *d, const char *sandbox, const char *poke)
{
    start_with_rpc = true;
    daemon_start(d, sandbox, poke);
    start_with_rpc = false;
}

/* One JSON-RPC call on the daemon's --rpc socket; its answer line (static buffer). */
static const char *rpc_call(const struct daemon_run *d, const char *method, const char *params)
{
    static char resp[16384];
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/rpc.sock", d->dir);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    char req[2048];
    int n = snprintf(req, sizeof(req),
                     "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"%s\",\"params\":%s}\n", method,
                     params ? params : "{}");
    VHD_CHECK(n > 0 && (size_t)n < sizeof(req));
    VHD_CHECK_EQ(send(fd, req, (size_t)n, MSG_NOSIGNAL), n);
    size_t have = 0;
    uint64_t t0 = now_ms();
    while (have == 0 || resp[have - 1] != '\n') {
        VHD_CHECK(now_ms() - t0 < TIMEOUT_MS && have + 1 < sizeof(resp));
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t got = recv(fd, resp + have, sizeof(resp) - 1 - have, 0);
        VHD_CHECK(got > 0);
        have += (size_t)got;
    }
    resp[have - 1] = '\0';
    close(fd);
    return resp;
}

#define CHECK_ANSWER(s, needle)                                                            \
    do {                                                                                   \
        const char *s_ = (s);                                                              \
        if (!strstr(s_, needle)) {                                                         \
            fprintf(stderr, "  %s:%d: '%s' lacks '%s'\n", __FILE__, __LINE__, s_, needle); \
            VHD_CHECK(!"unexpected answer");                                               \
        }                                                                                  \
    } while (0)

/* Make TAP interface name persistent (owned by our uid), or remove it. false: not possible here. */
static bool tap_persist(const char *name, bool on)
{
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct ifreq ifr = {.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR};
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
    bool ok = ioctl(fd, TUNSETIFF, &ifr) == 0 &&
              (!on || ioctl(fd, TUNSETOWNER, (unsigned long)geteuid()) == 0) &&
              ioctl(fd, TUNSETPERSIST, on ? 1UL : 0UL) == 0;
    close(fd);
    return ok;
}

/*
 * With --rpc the filter is on: devices added at runtime (a uring blk that
 * creates its image, a null blk, a net device) serve, resize, save-config and
 * remove under it; as root without --user no capability is kept.
 */
VHD_TEST(daemon_with_rpc_adds_devices_under_filter)
{
    struct daemon_run d;
    char params[1024];
    daemon_start_rpc(&d, "on", NULL);
    VHD_CHECK(log_has(&d, "sandbox: seccomp filter on"));
    if (geteuid() == 0) {
        long long eff = proc_caps(d.pid, "CapEff:", NULL), prm = proc_caps(d.pid, "CapPrm:", NULL);
        if (eff || prm)
            fprintf(stderr, "  CapEff %llx CapPrm %llx\n", eff, prm);
        VHD_CHECK(eff == 0 && prm == 0);
    }

    /* A uring blk whose image the add creates, a null blk and a net device. */
    struct daemon_run rt = d;
    snprintf(rt.sock, sizeof(rt.sock), "%s/rt.sock", d.dir);
    snprintf(rt.img, sizeof(rt.img), "%s/rt.img", d.dir);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s,image=%s,size=%d,queues=%d,name=rt\"}",
             rt.sock, rt.img, IMG_SIZE, NQ);
    CHECK_ANSWER(rpc_call(&d, "device.add", params), "\"result\":{\"name\":\"rt\"}");
    char nul_sock[128];
    snprintf(nul_sock, sizeof(nul_sock), "%s/nul.sock", d.dir);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s,backend=null,size=%u,queues=%d,name=nul\"}",
             nul_sock, IMG_SIZE, NQ); /* fe_up expects IMG_SIZE */
    CHECK_ANSWER(rpc_call(&d, "device.add", params), "\"result\":{\"name\":\"nul\"}");
    snprintf(params, sizeof(params), "{\"kind\":\"net\",\"spec\":\"socket=%s/net.sock,name=net\"}",
             d.dir);
    CHECK_ANSWER(rpc_call(&d, "device.add", params), "\"result\":{\"name\":\"net\"}");

    /*
     * A TAP interface made persistent and owned by us beforehand: the daemon,
     * without capabilities, attaches to it under the filter.
     */
    char tap[IFNAMSIZ];
    snprintf(tap, sizeof(tap), "vhdrpc%d", (int)getpid() % 100000);
    bool have_tap = tap_persist(tap, true);
    if (have_tap) {
        snprintf(params, sizeof(params),
                 "{\"kind\":\"net\",\"spec\":\"socket=%s/tap.sock,backend=tap,tap=%s,name=tap\"}",
                 d.dir, tap);
        CHECK_ANSWER(rpc_call(&d, "device.add", params), "\"result\":{\"name\":\"tap\"}");
        CHECK_ANSWER(rpc_call(&d, "device.remove", "{\"name\":\"tap\"}"), "\"result\"");
        VHD_CHECK(tap_persist(tap, false));
    } else {
        fprintf(stderr, "  (no TAP interface can be made here: the tap add is not tried)\n");
    }

    /* I/O on both blk devices (two sessions each on rt: memory mapped under the filter). */
    daemon_io(&rt);
    struct fe f;
    fe_up(&f, nul_sock);
    VHD_CHECK_EQ(fe_request(&f, 0, VIRTIO_BLK_T_IN, 0, 4096), VIRTIO_BLK_S_OK);
    fe_down(&f);

    CHECK_ANSWER(rpc_call(&d, "device.resize", "{\"name\":\"rt\",\"size\":\"2M\"}"), "\"result\"");
    CHECK_ANSWER(rpc_call(&d, "device.resize", "{\"name\":\"nul\",\"size\":\"4M\"}"), "\"result\"");
    const char *cfg = rpc_call(&d, "config.save", NULL);
    CHECK_ANSWER(cfg, "rt.sock");
    CHECK_ANSWER(cfg, "net.sock");
    CHECK_ANSWER(rpc_call(&d, "device.list", NULL), "\"name\":\"nul\"");
    static const char *const names[] = {"rt", "nul", "net"};
    for (int i = 0; i < 3; i++) {
        snprintf(params, sizeof(params), "{\"name\":\"%s\",\"force\":true}", names[i]);
        CHECK_ANSWER(rpc_call(&d, "device.remove", params), "\"result\"");
    }
    VHD_CHECK(access(rt.sock, F_OK) < 0 && errno == ENOENT); /* removed under the filter */
    /* Added again at the same path (its stale-socket check, a new dir fd). */
    snprintf(params, sizeof(params), "{\"kind\":\"blk\",\"spec\":\"socket=%s,image=%s,name=rt\"}",
             rt.sock, rt.img);
    CHECK_ANSWER(rpc_call(&d, "device.add", params), "\"result\":{\"name\":\"rt\"}");

    VHD_CHECK_EQ(kill(d.pid, SIGTERM), 0);
    int st = daemon_wait(&d, TIMEOUT_MS);
    char desc[64];
    if (!exited_ok(st)) {
        fprintf(stderr, "  vhostd: %s\n", st == -1 ? "still running" : describe(st, desc, 64));
        daemon_dump_log(&d);
    }
    VHD_CHECK(exited_ok(st));
    VHD_CHECK(access(rt.sock, F_OK) < 0 && errno == ENOENT);
    if (log_has(&d, " error:"))
        daemon_dump_log(&d);
    VHD_CHECK(!log_has(&d, " error:"));
    daemon_cleanup(&d);
}

/* With --rpc, a process (not a thread) or a prctl still kills vhostd. */
VHD_TEST(daemon_with_rpc_dies_on_forbidden_syscall)
{
    static const char *const pokes[] = {"fork", "prctl"};
    char desc[64];

    for (int i = 0; i < 2; i++) {
        struct daemon_run d;
        daemon_start_rpc(&d, "on", pokes[i]);
        int st = daemon_poke(&d);
        if (!killed_by_sigsys(st)) {
            fprintf(stderr, "  --rpc, poke %s: vhostd %s, expected SIGSYS\n", pokes[i],
                    st == -1 ? "still running" : describe(st, desc, sizeof(desc)));
            daemon_dump_log(&d);
        }
        VHD_CHECK(killed_by_sigsys(st));
        VHD_CHECK(!log_has(&d, "sandbox-poke"));
        daemon_cleanup(&d);
    }
}

/* Whether the daemon is still running (not reaped, no exit pending). */
static bool daemon_alive(struct daemon_run *d)
{
    int st;
    pid_t r = waitpid(d->pid, &st, WNOHANG);
    if (r == d->pid) {
        char desc[64];
        fprintf(stderr, "  vhostd: %s\n", describe(st, desc, sizeof(desc)));
        d->pid = -1;
        daemon_dump_log(d);
        return false;
    }
    return r == 0;
}

/*
 * With --rpc and the filter on, an add's socket-group=, allow-uid= and
 * allow-gid= resolve names and numbers (the files database, a name missing
 * from it: other NSS modules) without killing the daemon.
 */
VHD_TEST(daemon_with_rpc_resolves_access_ids_under_filter)
{
    if (geteuid() != 0)
        vhd_test_skip("socket-group=root needs root");
    struct daemon_run d;
    char params[1024];
    daemon_start_rpc(&d, "on", NULL);
    static const char *const access[] = {
        "socket-group=root", "socket-group=0",   "allow-uid=0",       "allow-uid=root",
        "allow-gid=root",    "allow-gid=0:root", "allow-uid=0:65534",
    };
    for (size_t i = 0; i < sizeof(access) / sizeof(access[0]); i++) {
        snprintf(params, sizeof(params),
                 "{\"kind\":\"blk\",\"spec\":\"socket=%s/a%zu.sock,backend=null,size=1M,%s,"
                 "name=a%zu\"}",
                 d.dir, i, access[i], i);
        char want[64];
        snprintf(want, sizeof(want), "\"result\":{\"name\":\"a%zu\"}", i);
        const char *ans = rpc_call(&d, "device.add", params);
        VHD_CHECK(daemon_alive(&d));
        CHECK_ANSWER(ans, want);
    }
    /* Names no database has: refused with a reason, the daemon lives. */
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s/m.sock,backend=null,size=1M,"
             "allow-gid=vhd-no-such-group,name=m\"}",
             d.dir);
    const char *ans = rpc_call(&d, "device.add", params);
    VHD_CHECK(daemon_alive(&d));
    CHECK_ANSWER(ans, "no such group");
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s/m.sock,backend=null,size=1M,"
             "allow-uid=vhd-no-such-user,name=m\"}",
             d.dir);
    ans = rpc_call(&d, "device.add", params);
    VHD_CHECK(daemon_alive(&d));
    CHECK_ANSWER(ans, "no such user");
    VHD_CHECK_EQ(kill(d.pid, SIGTERM), 0);
    int st = daemon_wait(&d, TIMEOUT_MS);
    VHD_CHECK(exited_ok(st));
    daemon_cleanup(&d);
}

/* NBD URIs an add after start-up must refuse under the filter (each would kill or resolve). */
static const char *const bad_runtime_uris[] = {
    "nbd+vsock://2/x",                   /* a vsock socket: no row */
    "nbd://[localhost]/x",               /* a host name in brackets */
    "nbd://127.0.0.1:10809@localhost/x", /* an address as user info, the host a name */
    "nbd://localhost/x",                 /* a host name */
    "nbd:///x",                          /* no host: libnbd resolves localhost */
    "nbds://127.0.0.1/x",                /* TLS */
    "nbd+tcp://127.0.0.1/x",             /* a scheme libnbd may grow */
    "nbd://127.0.0.1:10809/x",           /* TCP without --rpc-nbd-tcp on */
};

/* Each bad URI is refused by device.add with a reason, and the daemon lives. */
VHD_TEST(daemon_with_rpc_refuses_nbd_uris)
{
    struct daemon_run d;
    char params[1024];
    daemon_start_rpc(&d, "on", NULL);
    for (size_t i = 0; i < sizeof(bad_runtime_uris) / sizeof(bad_runtime_uris[0]); i++) {
        snprintf(params, sizeof(params),
                 "{\"kind\":\"blk\",\"spec\":\"socket=%s/n%zu.sock,backend=nbd,uri=%s,"
                 "name=n%zu\"}",
                 d.dir, i, bad_runtime_uris[i], i);
        const char *ans = rpc_call(&d, "device.add", params);
        if (!strstr(ans, "\"error\"") || !strstr(ans, bad_runtime_uris[i]))
            fprintf(stderr, "  %s: %s\n", bad_runtime_uris[i], ans);
        VHD_CHECK(strstr(ans, "\"error\"") && strstr(ans, bad_runtime_uris[i]));
        VHD_CHECK(daemon_alive(&d));
    }
    VHD_CHECK_EQ(kill(d.pid, SIGTERM), 0);
    VHD_CHECK(exited_ok(daemon_wait(&d, TIMEOUT_MS)));
    daemon_cleanup(&d);
}

/*
 * The same URIs in a configuration re-read at SIGHUP: refused, logged, the
 * daemon lives (vsock and TLS: the whole configuration is refused, as at
 * start, and nothing changes: not tried here).
 */
static bool reload_tries(const char *uri)
{
    return !strstr(uri, "nbds") && !strstr(uri, "vsock");
}

VHD_TEST(daemon_reload_refuses_nbd_uris)
{
    char conf[128], text[4096];
    snprintf(conf, sizeof(conf), "/tmp/vhd-sandbox-conf-%d.conf", (int)getpid());
    FILE *f = fopen(conf, "w");
    VHD_CHECK(f && fputs("# empty at start\n", f) >= 0 && fclose(f) == 0);
    struct daemon_run d;
    start_config = conf;
    daemon_start_rpc(&d, "on", NULL);
    start_config = NULL;
    size_t n = sizeof(bad_runtime_uris) / sizeof(bad_runtime_uris[0]), len = 0;
    for (size_t i = 0; i < n; i++)
        if (reload_tries(bad_runtime_uris[i]))
            len += (size_t)snprintf(text + len, sizeof(text) - len,
                                    "blk socket=%s/r%zu.sock,backend=nbd,uri=%s,name=r%zu\n", d.dir,
                                    i, bad_runtime_uris[i], i);
    VHD_CHECK(len < sizeof(text));
    f = fopen(conf, "w");
    VHD_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
    VHD_CHECK_EQ(kill(d.pid, SIGHUP), 0);
    uint64_t t0 = now_ms();
    while (!log_has(&d, "reload: 0 added")) {
        VHD_CHECK(daemon_alive(&d));
        if (now_ms() - t0 > TIMEOUT_MS)
            daemon_dump_log(&d);
        VHD_CHECK(now_ms() - t0 < TIMEOUT_MS);
        usleep(10000);
    }
    for (size_t i = 0; i < n; i++) {
        if (!reload_tries(bad_runtime_uris[i]))
            continue;
        char want[256];
        snprintf(want, sizeof(want), "cannot add device r%zu: r%zu: %s", i, i, bad_runtime_uris[i]);
        if (!log_has(&d, want)) {
            fprintf(stderr, "  log lacks '%s'\n", want);
            daemon_dump_log(&d);
        }
        VHD_CHECK(log_has(&d, want));
    }
    VHD_CHECK(daemon_alive(&d));
    VHD_CHECK_EQ(kill(d.pid, SIGTERM), 0);
    VHD_CHECK(exited_ok(daemon_wait(&d, TIMEOUT_MS)));
    daemon_cleanup(&d);
    unlink(conf);
}

/* An NBD server over vsock is refused at start-up under the filter (a worker reconnects). */
VHD_TEST(options_refuse_vsock_under_filter)
{
    struct vhd_options o;
    char err[256] = "";
    const char *on[] = {"--blk", "socket=/tmp/x.sock,backend=nbd,uri=nbd+vsock://2/x"};
    VHD_CHECK(parse(&o, on, 2, err, sizeof(err)) < 0);
    vhd_options_free(&o); /* what was parsed before the refusal */
    VHD_CHECK(strstr(err, "vsock") && strstr(err, "--sandbox off"));
    const char *off[] = {"--sandbox=off", "--blk",
                         "socket=/tmp/x.sock,backend=nbd,uri=nbd+vsock://2/x"};
    VHD_CHECK_EQ(parse(&o, off, 3, err, sizeof(err)), 0);
    vhd_options_free(&o);
}

/*
 * --rpc alone allows no inet socket: with its bind and listen rows, one
 * could listen on TCP (the filter cannot read the address family).
 */
VHD_TEST(daemon_with_rpc_forbids_inet_sockets)
{
    struct daemon_run d;
    char desc[64];
    daemon_start_rpc(&d, "on", "socket");
    int st = daemon_poke(&d);
    if (!killed_by_sigsys(st)) {
        fprintf(stderr, "  --rpc, poke socket(AF_INET): vhostd %s, expected SIGSYS\n",
                st == -1 ? "still running" : describe(st, desc, sizeof(desc)));
        daemon_dump_log(&d);
    }
    VHD_CHECK(killed_by_sigsys(st));
    daemon_cleanup(&d);
}

/*
 * --rpc-nbd-tcp on: the inet rows are there, a runtime nbd:// add by address
 * passes the check and its open runs under the filter (no server listens at
 * the port: an error, and the daemon lives).
 */
VHD_TEST(daemon_with_rpc_nbd_tcp_opt_in)
{
    char conf[128], params[1024];
    snprintf(conf, sizeof(conf), "/tmp/vhd-sandbox-tcp-%d.conf", (int)getpid());
    FILE *f = fopen(conf, "w");
    VHD_CHECK(f && fputs("rpc-nbd-tcp on\n", f) >= 0 && fclose(f) == 0);
    struct daemon_run d;
    start_config = conf;
    daemon_start_rpc(&d, "on", NULL);
    start_config = NULL;
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s/t.sock,backend=nbd,uri=nbd://127.0.0.1:1/x,"
             "name=t\"}",
             d.dir);
    const char *ans = rpc_call(&d, "device.add", params);
    VHD_CHECK(daemon_alive(&d));
    CHECK_ANSWER(ans, "\"error\"");
    VHD_CHECK(!strstr(ans, "rpc-nbd-tcp"));
    CHECK_ANSWER(rpc_call(&d, "config.save", NULL), "rpc-nbd-tcp on");
    VHD_CHECK_EQ(kill(d.pid, SIGTERM), 0);
    VHD_CHECK(exited_ok(daemon_wait(&d, TIMEOUT_MS)));
    daemon_cleanup(&d);
    unlink(conf);
}

/* --rpc's openat rows: an existing file, or a new one with O_EXCL; never O_TRUNC or a bare O_CREAT.
 */
static int open_probe_dirfd = -1;

static void rpc_open_child(void *arg)
{
    int flags = (int)(intptr_t)arg;
    CHILD_CHECK(vhd_sandbox_apply_with(VHD_SANDBOX_ON, VHD_SANDBOX_F_RPC) == 0);
    int fd = openat(open_probe_dirfd, "f", flags | O_RDWR | O_CLOEXEC, 0600);
    CHILD_CHECK(fd >= 0 && close(fd) == 0);
}

VHD_TEST(rpc_openat_never_truncates_or_creates_over)
{
    char dir[] = "/tmp/vhd-sandbox-open-XXXXXX", d[64];
    VHD_CHECK(mkdtemp(dir));
    open_probe_dirfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    VHD_CHECK(open_probe_dirfd >= 0);
    int st = run_child(rpc_open_child, (void *)(intptr_t)(O_CREAT | O_EXCL)); /* a new file */
    if (!exited_ok(st))
        fprintf(stderr, "  O_CREAT|O_EXCL: %s\n", describe(st, d, sizeof(d)));
    VHD_CHECK(exited_ok(st));
    st = run_child(rpc_open_child, (void *)(intptr_t)0); /* it exists now */
    VHD_CHECK(exited_ok(st));
    static const int refused[] = {O_CREAT, O_TRUNC, O_CREAT | O_TRUNC, O_CREAT | O_EXCL | O_TRUNC};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        st = run_child(rpc_open_child, (void *)(intptr_t)refused[i]);
        if (!killed_by_sigsys(st))
            fprintf(stderr, "  flags %#x: %s, expected SIGSYS\n", refused[i],
                    describe(st, d, sizeof(d)));
        VHD_CHECK(killed_by_sigsys(st));
    }
    VHD_CHECK_EQ(unlinkat(open_probe_dirfd, "f", 0), 0);
    close(open_probe_dirfd);
    VHD_CHECK_EQ(rmdir(dir), 0);
}

/*
 * Root without --user, --rpc and a client-mode device of the command line:
 * no capability is kept (not even CAP_DAC_OVERRIDE), and a warning says
 * that runtime adds reach what uid 0 owns.
 */
VHD_TEST(daemon_with_rpc_as_root_keeps_no_capability)
{
    if (geteuid() != 0)
        vhd_test_skip("needs root");
    char conf[128], text[512];
    snprintf(conf, sizeof(conf), "/tmp/vhd-sandbox-cl-%d.conf", (int)getpid());
    snprintf(text, sizeof(text),
             "blk socket=/tmp/vhd-sandbox-cl-%d.sock,backend=null,size=1M,client=on\n",
             (int)getpid());
    FILE *f = fopen(conf, "w");
    VHD_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
    struct daemon_run d;
    start_config = conf;
    daemon_start_rpc(&d, "on", NULL);
    start_config = NULL;
    long long eff = proc_caps(d.pid, "CapEff:", NULL), prm = proc_caps(d.pid, "CapPrm:", NULL);
    if (eff || prm)
        fprintf(stderr, "  CapEff %llx CapPrm %llx\n", eff, prm);
    VHD_CHECK(eff == 0 && prm == 0);
    VHD_CHECK(log_has(&d, "--rpc as root without --user"));
    VHD_CHECK_EQ(kill(d.pid, SIGTERM), 0);
    VHD_CHECK(exited_ok(daemon_wait(&d, TIMEOUT_MS)));
    daemon_cleanup(&d);
    unlink(conf);
}
