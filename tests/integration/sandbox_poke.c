/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A preload library for test_sandbox: interposes accept4() in vhostd so that
 * the control thread, at its first accept (a front-end connecting, long after
 * the sandbox is on), first tries what VHD_SANDBOX_POKE names ("open": open
 * /etc/passwd; "socket": an AF_INET socket; "fork": clone a process, not a
 * thread; "prctl": PR_GET_DUMPABLE) and reports it on stderr. With
 * VHD_SANDBOX_POKE=bind-mode (test_access), bind() of a Unix socket reports
 * the mode its file has the moment it exists. Test-only.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/*
 * Declared here rather than from <sys/socket.h>, whose _GNU_SOURCE prototype
 * takes a transparent union (hence socket() through syscall() below).
 */
int accept4(int fd, void *addr, unsigned *addrlen, int flags);
int bind(int fd, const void *addr, unsigned addrlen);

static int (*real_accept4)(int, void *, unsigned *, int);
static int (*real_bind)(int, const void *, unsigned);
static const char *poke;

/* Resolved at load time, before any sandbox: dlsym itself may need forbidden syscalls. */
__attribute__((constructor)) static void poke_init(void)
{
    real_accept4 = (int (*)(int, void *, unsigned *, int))dlsym(RTLD_NEXT, "accept4");
    real_bind = (int (*)(int, const void *, unsigned))dlsym(RTLD_NEXT, "bind");
    poke = getenv("VHD_SANDBOX_POKE");
}

static void say(const char *what, int rc)
{
    char line[128];
    int n = snprintf(line, sizeof(line), "sandbox-poke: %s: %s\n", what,
                     rc >= 0 ? "allowed" : strerror(errno));
    if (n > 0 && write(STDERR_FILENO, line, (size_t)n) < 0) {
        /* nothing to do */
    }
}

int accept4(int fd, void *addr, unsigned *addrlen, int flags)
{
    static int done;

    if (poke && !done) {
        done = 1;
        int rc = -1;
        if (!strcmp(poke, "open")) {
            rc = open("/etc/passwd", O_RDONLY | O_CLOEXEC);
            say("open /etc/passwd", rc);
        } else if (!strcmp(poke, "socket")) {
            rc = (int)syscall(SYS_socket, 2 /* AF_INET */, 1 /* SOCK_STREAM */, 0);
            say("socket(AF_INET)", rc);
        } else if (!strcmp(poke, "fork")) {
            long pid = syscall(SYS_clone, (unsigned long)SIGCHLD, 0UL, 0UL, 0UL, 0UL);
            if (pid == 0)
                _exit(0); /* the child, had it been allowed */
            say("clone(SIGCHLD)", (int)pid);
            rc = -1; /* nothing to close (the child is left to init) */
        } else if (!strcmp(poke, "prctl")) {
            rc = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
            say("prctl(PR_GET_DUMPABLE)", rc);
            rc = -1;
        }
        if (rc >= 0)
            close(rc);
    }
    if (!real_accept4) {
        errno = ENOSYS;
        return -1;
    }
    return real_accept4(fd, addr, addrlen, flags);
}

/* bind-mode: the mode of a Unix socket's file right after bind() created it. */
int bind(int fd, const void *addr, unsigned addrlen)
{
    if (!real_bind) {
        errno = ENOSYS;
        return -1;
    }
    int rc = real_bind(fd, addr, addrlen);
    unsigned short family;
    memcpy(&family, addr, sizeof(family)); /* sockaddr_un: sun_family, then sun_path */
    const char *path = (const char *)addr + sizeof(family);
    struct stat st;
    if (rc == 0 && poke && !strcmp(poke, "bind-mode") && family == 1 /* AF_UNIX */ && path[0] &&
        lstat(path, &st) == 0) {
        char line[300];
        int n = snprintf(line, sizeof(line), "sandbox-poke: bind %s mode %04o\n", path,
                         (unsigned)(st.st_mode & 07777));
        if (n > 0 && write(STDERR_FILENO, line, (size_t)n) < 0) {
            /* nothing to do */
        }
    }
    return rc;
}
