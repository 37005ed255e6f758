/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Eventfd signalling that never blocks the caller (efd.h): RWF_NOWAIT reads,
 * and writes under a per-thread timer guard whose signal interrupts a write
 * that sleeps.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <linux/magic.h> /* ANON_INODE_FS_MAGIC */

#include "efd.h"
#include "log.h"

/* The guard's signal: a real-time signal nothing else here uses. */
static int guard_signo(void)
{
    return SIGRTMIN + 5;
}

/* The thread's guard fired since its last vhd_efd_tick (set by the handler, on this thread). */
static __thread volatile sig_atomic_t guard_fired;

/*
 * The handler only notes that it ran: the signal exists to interrupt a
 * sleeping write (no SA_RESTART). Timer signals go to the thread whose
 * guard it is (SIGEV_THREAD_ID), so the thread-local flag is that thread's.
 */
static void guard_handler(int sig)
{
    (void)sig;
    guard_fired = 1;
}

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static int init_rc;

static void init_handler(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = guard_handler;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: a sleeping write returns EINTR */
    init_rc = sigaction(guard_signo(), &sa, NULL) < 0 ? -errno : 0;
}

int vhd_efd_init(void)
{
    pthread_once(&init_once, init_handler);
    return init_rc;
}

/* The calling thread's guard. */
static __thread struct {
    bool created; /* timer exists */
    bool failed;  /* could not be created: writes go unguarded (logged once) */
    bool keep;    /* stay armed until a period passes without a write (vhd_efd_tick) */
    bool armed;
    unsigned writes; /* guarded writes since the guard last fired */
    timer_t timer;
} guard;

static int guard_create(void)
{
    if (guard.created)
        return 0;
    if (guard.failed)
        return -1;
    int rc = vhd_efd_init();
    if (rc == 0) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, guard_signo());
        pthread_sigmask(SIG_UNBLOCK, &set, NULL);
        struct sigevent sev;
        memset(&sev, 0, sizeof(sev));
        sev.sigev_notify = SIGEV_THREAD_ID;
        sev.sigev_signo = guard_signo();
        sev._sigev_un._tid = gettid(); /* glibc spells sigev_notify_thread_id so */
        if (timer_create(CLOCK_MONOTONIC, &sev, &guard.timer) < 0)
            rc = -errno;
    }
    if (rc < 0) {
        guard.failed = true;
        vhd_log(VHD_LOG_ERROR, "eventfd guard: no timer (%s): a front-end could stall this thread",
                strerror(-rc));
        return -1;
    }
    guard.created = true;
    return 0;
}

/* Arm: first expiry and period VHD_EFD_GUARD_MS (the period covers a thread preempted after
 * arming). */
static void guard_arm(void)
{
    if (guard.armed || guard_create() < 0)
        return;
    struct itimerspec its = {
        .it_value = {.tv_nsec = VHD_EFD_GUARD_MS * 1000000L},
        .it_interval = {.tv_nsec = VHD_EFD_GUARD_MS * 1000000L},
    };
    if (timer_settime(guard.timer, 0, &its, NULL) == 0)
        guard.armed = true;
}

static void guard_disarm(void)
{
    if (!guard.armed)
        return;
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    (void)timer_settime(guard.timer, 0, &its, NULL);
    guard.armed = false;
}

void vhd_efd_keep_armed(bool keep)
{
    guard.keep = keep;
    if (!keep)
        guard_disarm();
}

void vhd_efd_tick(void)
{
    if (!guard_fired)
        return;
    guard_fired = 0;
    if (guard.writes == 0)
        guard_disarm(); /* a whole period without a write: stop the signals */
    guard.writes = 0;
}

void vhd_efd_thread_end(void)
{
    guard_disarm();
    if (guard.created)
        (void)timer_delete(guard.timer);
    guard.created = false;
}

int vhd_efd_signal(int fd)
{
    static const uint64_t one = 1;

    guard_arm();
    guard.writes++;
    ssize_t n = write(fd, &one, sizeof(one));
    int rc = n == (ssize_t)sizeof(one) ? 0 : n >= 0 ? -EIO : errno == EINTR ? -ETIMEDOUT : -errno;
    if (!guard.keep)
        guard_disarm();
    return rc;
}

ssize_t vhd_efd_read(int fd, uint64_t *v)
{
    struct iovec iov = {.iov_base = v, .iov_len = sizeof(*v)};
    ssize_t n = preadv2(fd, &iov, 1, -1, RWF_NOWAIT);

    if (n >= 0)
        return n;
    if (errno != EOPNOTSUPP)
        return -errno;
    /* A file without RWF_NOWAIT reads: the guard bounds a read that sleeps. */
    guard_arm();
    n = read(fd, v, sizeof(*v));
    int err = errno;
    if (!guard.keep)
        guard_disarm();
    if (n >= 0)
        return n;
    return err == EINTR ? -ETIMEDOUT : -err;
}

int vhd_efd_check(int fd)
{
    static const char want[] = "anon_inode:[eventfd]";
    static int no_proc_logged;
    struct statfs sfs;
    char path[48], name[sizeof(want) + 1];

    if (fstatfs(fd, &sfs) < 0)
        return -errno;
    if ((unsigned long)sfs.f_type != ANON_INODE_FS_MAGIC)
        return -EINVAL;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
    ssize_t n = readlinkat(AT_FDCWD, path, name, sizeof(name));
    if (n < 0) {
        if (!__atomic_exchange_n(&no_proc_logged, 1, __ATOMIC_RELAXED))
            vhd_log(VHD_LOG_WARN,
                    "cannot read %s (%s): kick, call and error fds are checked to be "
                    "anonymous-inode files only, not eventfds",
                    path, strerror(errno));
        return 0;
    }
    if ((size_t)n != sizeof(want) - 1 || memcmp(name, want, sizeof(want) - 1) != 0)
        return -EINVAL;
    return 0;
}
