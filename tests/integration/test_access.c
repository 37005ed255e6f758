/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Who may connect to the real daemon (build/vhostd) and what a full fd table
 * does to it: the socket file's mode (0600 under any umask, from the moment
 * bind() creates it), socket-mode= and socket-group=, the warning about a
 * directory anyone may write to, the SO_PEERCRED allow-lists (allow-uid=,
 * allow-gid=) against connections from other users, the fd limit raised at
 * start, and accept() backing off when the fd table is full instead of
 * spinning. Needs root (other users, other groups, prlimit).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "spec/vhost_user.h"

#define MAX_DAEMONS 1
#include "daemon_fixture.h"

#define WAIT_MS   5000
#define OTHER_UID 65534 /* nobody */
#define OTHER_GID 65533

static void need_root(void)
{
    if (geteuid() != 0)
        vhd_test_skip("needs root (other users and groups)");
}

/* ---- a daemon: a null disk on dm->sock, with extra --blk keys ---- */

static void wait_log(const struct daemon *dm, const char *needle);

static void start(struct daemon *dm, const char *keys, bool poke_bind)
{
    const char *bin = vhostd_path();
    char spec[600];

    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    daemon_prepare_dir(dm, "vhd-test-acc-XXXXXX", "d.sock");
    track(dm);
    if (poke_bind) {
        /* The preload reports the socket file's mode right after bind(). */
        char lib[PATH_MAX];
        snprintf(lib, sizeof(lib), "%s", bin);
        char *slash = strrchr(lib, '/');
        VHD_CHECK(slash != NULL);
        snprintf(slash + 1, sizeof(lib) - (size_t)(slash + 1 - lib), "sandbox-poke.so");
        if (access(lib, F_OK) < 0)
            vhd_test_skip("sandbox-poke.so is not built next to vhostd");
        setenv("LD_PRELOAD", lib, 1);
        setenv("VHD_SANDBOX_POKE", "bind-mode", 1);
        const char *ao = getenv("ASAN_OPTIONS");
        char buf[512];
        snprintf(buf, sizeof(buf), "%s%sverify_asan_link_order=0", ao ? ao : "", ao ? ":" : "");
        setenv("ASAN_OPTIONS", buf, 1);
    }
    snprintf(spec, sizeof(spec), "socket=%s,backend=null,size=1M%s%s", dm->sock, *keys ? "," : "",
             keys);
    char *argv[] = {(char *)bin, "--blk", spec, NULL};
    daemon_spawn(dm, argv);
    unsetenv("LD_PRELOAD");
    unsetenv("VHD_SANDBOX_POKE");
    /*
     * The socket file exists from bind() on, its group and mode are set
     * after it: what the tests look at is there once the daemon says it
     * listens (a check at the file's appearance saw gid 0 under load).
     */
    wait_log(dm, "listening on ");
}

/* Occurrences of needle in the daemon's log. */
static int log_count(const struct daemon *dm, const char *needle)
{
    FILE *f = fopen(dm->log, "r");
    char line[1024];
    int n = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

static void wait_log(const struct daemon *dm, const char *needle)
{
    uint64_t t0 = ms_now();
    while (!daemon_log_has(dm, needle)) {
        if (ms_now() - t0 > WAIT_MS) {
            fprintf(stderr, "  '%s' not in the log\n", needle);
            VHD_CHECK(!"log line");
        }
        sleep_ms(10);
    }
}

static int connect_to(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
}

/*
 * Ask GET_FEATURES on fd: 1 when answered, 0 when the daemon hung up, -1 on
 * a timeout (ms).
 */
static int features_answered(int fd, int ms)
{
    struct vu_hdr h = {.request = VHOST_USER_GET_FEATURES, .flags = VHOST_USER_VERSION};
    if (send(fd, &h, sizeof(h), MSG_NOSIGNAL) != (ssize_t)sizeof(h))
        return 0;
    uint8_t buf[sizeof(h) + 8];
    size_t got = 0;
    while (got < sizeof(buf)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, ms) != 1)
            return -1;
        ssize_t n = read(fd, buf + got, sizeof(buf) - got);
        if (n <= 0)
            return 0;
        got += (size_t)n;
    }
    return 1;
}

/* In a child running as uid:gid, connect to path and ask GET_FEATURES; its result as exit code. */
static int as_user(uid_t uid, gid_t gid, const char *path)
{
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0)
            _exit(10);
        int fd = connect_to(path);
        if (fd < 0)
            _exit(11);
        int r = features_answered(fd, WAIT_MS);
        _exit(r == 1 ? 0 : r == 0 ? 1 : 2);
    }
    int st;
    VHD_CHECK_EQ(waitpid(pid, &st, 0), pid);
    VHD_CHECK(WIFEXITED(st));
    return WEXITSTATUS(st);
}

/* ======================= the socket file ======================= */

/*
 * Under umask 0 a socket used to be born 0777: any local user could connect
 * first and read or write the disk. It is 0600 now, from bind() on (the
 * preload reads the mode the moment bind() returns, before anything else).
 */
VHD_TEST(socket_is_0600_under_umask_0)
{
    struct daemon dm;
    struct stat st;

    need_root();
    umask(0);
    start(&dm, "", true);
    VHD_CHECK_EQ(lstat(dm.sock, &st), 0);
    if ((st.st_mode & 07777) != 0600)
        fprintf(stderr, "  socket mode %04o\n", (unsigned)(st.st_mode & 07777));
    VHD_CHECK_EQ(st.st_mode & 07777, 0600);
    char want[300];
    snprintf(want, sizeof(want), "sandbox-poke: bind %s mode 0600", dm.sock);
    wait_log(&dm, "sandbox-poke: bind ");
    if (!daemon_log_has(&dm, want))
        dump_log(&dm);
    VHD_CHECK(daemon_log_has(&dm, want));
    /* Another user cannot connect (the 0700 test directory aside: opened up here). */
    VHD_CHECK_EQ(chmod(dm.dir, 0755), 0);
    VHD_CHECK_EQ(as_user(OTHER_UID, OTHER_GID, dm.sock), 11);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* socket-mode= and socket-group=: a group may connect, and the file never had more. */
VHD_TEST(socket_mode_and_group_keys)
{
    struct daemon dm;
    struct stat st;
    char keys[64];

    need_root();
    umask(0);
    snprintf(keys, sizeof(keys), "socket-mode=0660,socket-group=%d", OTHER_GID);
    start(&dm, keys, true);
    VHD_CHECK_EQ(lstat(dm.sock, &st), 0);
    VHD_CHECK_EQ(st.st_mode & 07777, 0660);
    VHD_CHECK_EQ(st.st_gid, OTHER_GID);
    wait_log(&dm, "sandbox-poke: bind ");
    char want[300];
    snprintf(want, sizeof(want), "sandbox-poke: bind %s mode 0660", dm.sock);
    VHD_CHECK(daemon_log_has(&dm, want));
    VHD_CHECK_EQ(chmod(dm.dir, 0755), 0);
    VHD_CHECK_EQ(as_user(OTHER_UID, OTHER_GID, dm.sock), 0); /* in the group: served */
    VHD_CHECK_EQ(as_user(OTHER_UID, OTHER_GID + 1, dm.sock), 11);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * --user hands the sockets to that user, but a socket-group= stays: the
 * chown used to set the user's group on every socket, locking the intended
 * group out and letting the user's own group in.
 */
VHD_TEST(user_keeps_socket_group)
{
    struct daemon dm;
    struct stat st;
    char spec[600];

    need_root();
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    daemon_prepare_dir(&dm, "vhd-test-acc-XXXXXX", "d.sock");
    track(&dm);
    snprintf(spec, sizeof(spec), "socket=%s,backend=null,size=1M,socket-mode=0660,socket-group=%d",
             dm.sock, OTHER_GID);
    char user[32];
    snprintf(user, sizeof(user), "%d:%d", OTHER_UID, OTHER_UID);
    char *argv[] = {(char *)bin, "--user", user, "--blk", spec, NULL};
    daemon_spawn(&dm, argv);
    wait_log(&dm, "sandbox:");
    VHD_CHECK_EQ(lstat(dm.sock, &st), 0);
    if (st.st_gid != OTHER_GID || st.st_uid != OTHER_UID)
        dump_log(&dm);
    VHD_CHECK_EQ(st.st_uid, OTHER_UID); /* the user's: it may remove it at exit */
    VHD_CHECK_EQ(st.st_gid, OTHER_GID); /* the group given, not the user's */
    VHD_CHECK_EQ(st.st_mode & 07777, 0660);
    VHD_CHECK_EQ(chmod(dm.dir, 0755), 0);
    VHD_CHECK_EQ(as_user(OTHER_UID + 1, OTHER_GID, dm.sock), 0);  /* in the group: served */
    VHD_CHECK_EQ(as_user(OTHER_UID + 1, OTHER_UID, dm.sock), 11); /* the user's group: not */
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* A directory anyone may write to without the sticky bit: anyone could replace the socket. */
VHD_TEST(open_directory_is_warned_about)
{
    struct daemon dm;
    char spec[300];

    need_root();
    start(&dm, "", false); /* in its 0700 directory: nothing to say */
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    VHD_CHECK(!daemon_log_has(&dm, "writable by every user"));

    snprintf(spec, sizeof(spec), "socket=%s,backend=null,size=1M", dm.sock);
    char *argv[] = {(char *)vhostd_path(), "--blk", spec, NULL};
    VHD_CHECK_EQ(chmod(dm.dir, 0777), 0);
    unlink(dm.log);
    daemon_spawn(&dm, argv);
    wait_log(&dm, "is writable by every user and not sticky: anyone can replace the socket");
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    /* Sticky, like /tmp: only the socket's owner may remove it. */
    VHD_CHECK_EQ(chmod(dm.dir, 01777), 0);
    unlink(dm.log);
    daemon_spawn(&dm, argv);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    VHD_CHECK(!daemon_log_has(&dm, "writable by every user"));
    test_done();
}

/* ======================= the peer allow-lists ======================= */

VHD_TEST(allow_uid_refuses_other_users)
{
    struct daemon dm;

    need_root();
    /* The file lets everyone connect: the allow-list is what stops them. */
    start(&dm, "socket-mode=0666,allow-uid=0", false);
    VHD_CHECK_EQ(chmod(dm.dir, 0755), 0);
    VHD_CHECK_EQ(as_user(OTHER_UID, OTHER_GID, dm.sock), 1); /* connected, then hung up on */
    char want[300];
    snprintf(want, sizeof(want), "uid %d gid %d not in allow-uid/allow-gid", OTHER_UID, OTHER_GID);
    wait_log(&dm, want);
    /* Root is on the list; the refused connection left no session behind. */
    int fd = connect_to(dm.sock);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(features_answered(fd, WAIT_MS), 1);
    close(fd);
    wait_log(&dm, "front-end connected on");
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

VHD_TEST(allow_gid_admits_a_group)
{
    struct daemon dm;
    char keys[96];

    need_root();
    snprintf(keys, sizeof(keys), "socket-mode=0666,allow-uid=0,allow-gid=%d", OTHER_GID);
    start(&dm, keys, false);
    VHD_CHECK_EQ(chmod(dm.dir, 0755), 0);
    VHD_CHECK_EQ(as_user(OTHER_UID, OTHER_GID, dm.sock), 0);     /* its gid is listed */
    VHD_CHECK_EQ(as_user(OTHER_UID, OTHER_GID - 1, dm.sock), 1); /* neither uid nor gid */
    char want[300];
    snprintf(want, sizeof(want), "front-end connected on %s (pid", dm.sock);
    wait_log(&dm, want);
    snprintf(want, sizeof(want), "uid %d gid %d)", OTHER_UID, OTHER_GID);
    VHD_CHECK(daemon_log_has(&dm, want));
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* ======================= fds ======================= */

/* A low soft limit is raised to the hard one at start. */
VHD_TEST(fd_limit_raised_at_start)
{
    struct daemon dm;
    struct rlimit rl;

    VHD_CHECK_EQ(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max <= 64)
        vhd_test_skip("hard fd limit too low to test");
    rl.rlim_cur = 64; /* inherited by the daemon */
    VHD_CHECK_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
    start(&dm, "", false);
    struct rlimit got;
    VHD_CHECK_EQ(prlimit(dm.pid, RLIMIT_NOFILE, NULL, &got), 0);
    if (got.rlim_cur != rl.rlim_max)
        fprintf(stderr, "  daemon's fd limit %llu, hard %llu\n", (unsigned long long)got.rlim_cur,
                (unsigned long long)rl.rlim_max);
    VHD_CHECK_EQ(got.rlim_cur, rl.rlim_max);
    VHD_CHECK(daemon_log_has(&dm, "fd limit raised from 64 to"));
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* The lowest fd number not open in pid. */
static int lowest_free_fd(pid_t pid)
{
    char p[64];
    for (int fd = 0;; fd++) {
        snprintf(p, sizeof(p), "/proc/%d/fd/%d", (int)pid, fd);
        if (access(p, F_OK) < 0)
            return fd;
    }
}

/* User + system CPU time of pid in clock ticks. */
static long cpu_ticks(pid_t pid)
{
    char p[64], buf[1024];
    snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    VHD_CHECK(n > 0);
    buf[n] = 0;
    char *s = strrchr(buf, ')');
    VHD_CHECK(s != NULL);
    long ut = 0, stt = 0;
    VHD_CHECK(sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %ld %ld", &ut, &stt) == 2);
    return ut + stt;
}

/*
 * The fd table is full (the limit lowered to what the daemon has open) and
 * front-ends keep connecting: accept() fails with EMFILE and leaves them
 * queued. The daemon must not spin on its readable socket: over 2 s it uses
 * little CPU and logs the condition once. Once fds are available again the
 * queued front-end is served.
 */
VHD_TEST(accept_backs_off_when_out_of_fds)
{
    struct daemon dm;
    int c[3];

    need_root();
    start(&dm, "", false);
    int fd = connect_to(dm.sock); /* one session served: the daemon is fully up */
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(features_answered(fd, WAIT_MS), 1);
    close(fd);
    wait_log(&dm, "session ended");
    sleep_ms(100);
    struct rlimit old, full;
    VHD_CHECK_EQ(prlimit(dm.pid, RLIMIT_NOFILE, NULL, &old), 0);
    full.rlim_cur = (rlim_t)lowest_free_fd(dm.pid); /* the soft limit only: no CAP_SYS_RESOURCE */
    full.rlim_max = old.rlim_max;
    VHD_CHECK_EQ(prlimit(dm.pid, RLIMIT_NOFILE, &full, NULL), 0);

    for (int i = 0; i < 3; i++) {
        c[i] = connect_to(dm.sock); /* queued in the backlog: nobody can accept them */
        VHD_CHECK(c[i] >= 0);
    }
    wait_log(&dm, "Too many open files");
    long t0 = cpu_ticks(dm.pid);
    sleep_ms(2000);
    long used = cpu_ticks(dm.pid) - t0, hz = sysconf(_SC_CLK_TCK);
    int lines = log_count(&dm, "Too many open files");
    if (getenv("VHD_TEST_DEBUG") || used * 1000 / hz >= 200 || lines != 1)
        fprintf(stderr, "  out of fds: %ld ticks in 2 s, %d log lines\n", used, lines);
    VHD_CHECK(used * 1000 / hz < 100); /* < 5% of a CPU; a spin is up to 100% */
    VHD_CHECK_EQ(lines, 1);

    /* Fds again: the back-off (at most 1 s) looks again and the queue is served. */
    VHD_CHECK_EQ(prlimit(dm.pid, RLIMIT_NOFILE, &old, NULL), 0);
    VHD_CHECK_EQ(features_answered(c[0], WAIT_MS), 1);
    wait_log(&dm, "accepting connections on");
    for (int i = 0; i < 3; i++)
        close(c[i]);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}
