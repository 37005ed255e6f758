/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Signalling through the eventfds a front-end shares with us (call, error
 * and kick fds) without ever blocking the calling thread, whatever the
 * front-end does to them.
 *
 * The file status flags belong to the open file description, which the
 * front-end shares: it can clear the O_NONBLOCK we set, at any time, with
 * fcntl on its own copy. A write of 1 to an eventfd whose counter is at its
 * maximum (0xfffffffffffffffe, which the front-end can write) then sleeps
 * until someone reads it; a read of an empty one sleeps until someone
 * writes. No flag check before the call closes that window (the front-end
 * can change the flag or the counter between the check and the call).
 *
 *  - Reads use preadv2(RWF_NOWAIT), which the eventfd honours per call
 *    (read_iter with IOCB_NOWAIT, Linux 5.8+; pipes and sockets too),
 *    whatever the file's flags.
 *  - Writes cannot: an eventfd has no write_iter (Linux 6.1 and still 6.18
 *    answer EOPNOTSUPP to pwritev2(RWF_NOWAIT)). So a write runs under a
 *    guard: a per-thread POSIX timer (SIGEV_THREAD_ID) repeating every
 *    VHD_EFD_GUARD_MS while armed, whose signal has a handler that only
 *    notes it ran, and no SA_RESTART. A write that sleeps is interrupted
 *    (EINTR) within that time and reported as -ETIMEDOUT; one that does
 *    not sleep never sees the signal. Workers keep the guard armed while
 *    they write (no syscall per write; one timer signal per period, which
 *    only cuts short a sleeping syscall: the loop's epoll_wait handles
 *    EINTR) and disarm it once a whole period passed without a write
 *    (vhd_efd_tick), so an idle worker gets at most two such wake-ups after
 *    its last write, and none after. Other threads arm and disarm it around
 *    each write (control path).
 *
 * The caller decides what a stuck write means (a worker stops signalling
 * that queue: the front-end has a full counter, hence a signal pending,
 * and only hurts itself).
 */
#ifndef VHD_EFD_H
#define VHD_EFD_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* How long a guarded write may sleep before it is interrupted. */
#define VHD_EFD_GUARD_MS 20

/*
 * vhd_efd_init - install the guard signal's handler, once per process
 * (later calls do nothing). Call before a seccomp filter that forbids
 * rt_sigaction; vhd_rt_new does. 0 or -errno.
 */
int vhd_efd_init(void);

/*
 * vhd_efd_keep_armed - the calling thread keeps its guard armed from its
 * first guarded write until a period passes without one (vhd_efd_tick:
 * workers). Otherwise each write arms and disarms it.
 */
void vhd_efd_keep_armed(bool keep);

/*
 * vhd_efd_tick - once per loop turn of a thread that keeps its guard armed:
 * when the guard fired and no guarded write happened in the period before,
 * disarm it. A thread-local flag test when nothing fired.
 */
void vhd_efd_tick(void);

/* vhd_efd_thread_end - delete the calling thread's timer (thread exit). */
void vhd_efd_thread_end(void);

/*
 * vhd_efd_signal - add 1 to the eventfd fd. 0; -EAGAIN when the counter is
 * full (non-blocking file: a signal is pending anyway); -ETIMEDOUT when the
 * write slept (blocking file, full counter) and the guard cut it short; or
 * -errno. Never sleeps longer than about VHD_EFD_GUARD_MS.
 */
int vhd_efd_signal(int fd);

/*
 * vhd_efd_read - take an eventfd's count (a kick) without sleeping: 8 and
 * *v; 0 at end of file (a pipe whose writer is gone); -EAGAIN when there is
 * nothing; -errno. A file that refuses RWF_NOWAIT is read under the guard.
 */
ssize_t vhd_efd_read(int fd, uint64_t *v);

/*
 * vhd_efd_check - is fd an eventfd? A front-end chooses the kick, call and
 * error fds; anything else can hurt the thread that polls, reads or writes
 * it: a listening socket or an epoll fd is readable but cannot be read (a
 * level-triggered loop spins), a FUSE file or a FIFO can sleep in read or
 * in poll (under epoll_ctl). Two checks, both without touching the file's
 * own operations: fstatfs says the file lives on the anonymous-inode
 * filesystem (eventfd, epoll, signalfd, timerfd... share it and even share
 * one inode, so fstat cannot tell them apart), then the name the kernel gave
 * the file, read through /proc/self/fd, is "anon_inode:[eventfd]". Without
 * /proc (not mounted) the first check alone decides, logged once; a worker
 * also breaks a queue whose kick fd fails to read. Control path (the
 * SET_VRING_KICK/CALL/ERR handlers), any thread.
 * Returns 0, -EINVAL (not an eventfd), or the fstatfs errno (-EBADF).
 */
int vhd_efd_check(int fd);

#endif /* VHD_EFD_H */
