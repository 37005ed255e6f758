/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared fixture of the tests that run the real daemon: a temp dir per daemon,
 * build/vhostd started in a child (PR_SET_PDEATHSIG) and waited for on its
 * socket, killed on every exit path (atexit, SIGALRM) with its log on failure.
 * Define MAX_DAEMONS before including; START_MS and STOP_MS bound every wait.
 */
#ifndef VHD_TEST_DAEMON_FIXTURE_H
#define VHD_TEST_DAEMON_FIXTURE_H

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#ifndef MAX_DAEMONS
#error "define MAX_DAEMONS before including daemon_fixture.h"
#endif
#define START_MS 10000 /* a daemon has this long to create its socket */
#define STOP_MS  10000 /* ... and to exit after SIGTERM */

struct daemon {
    pid_t pid;
    char dir[160]; /* socket paths are short (sun_path): keep TMPDIR short too */
    char sock[192];
    char img[192]; /* "" when the daemon has no image */
    char log[192];
};

static struct daemon *g_daemons[MAX_DAEMONS];
static bool g_test_ok; /* set at the end of a test: no log dump at exit */

static inline void dump_log(const struct daemon *dm)
{
    FILE *f = fopen(dm->log, "r");
    char line[512];
    if (!f)
        return;
    fprintf(stderr, "  --- daemon log (%s) ---\n", dm->log);
    while (fgets(line, sizeof(line), f))
        fprintf(stderr, "  | %s", line);
    fclose(f);
}

static inline void daemon_cleanup_files(struct daemon *dm)
{
    unlink(dm->sock);
    if (dm->img[0])
        unlink(dm->img);
    unlink(dm->log);
    rmdir(dm->dir);
}

/* Stop every daemon (SIGKILL) and remove its files; the log goes to stderr when the test failed. */
static inline void kill_daemons(void)
{
    for (int i = 0; i < MAX_DAEMONS; i++) {
        struct daemon *dm = g_daemons[i];
        if (!dm)
            continue;
        if (dm->pid > 0) {
            int status = 0;
            /* Did it die on its own? That is often the reason the test failed. */
            if (waitpid(dm->pid, &status, WNOHANG) == dm->pid) {
                if (!g_test_ok && WIFSIGNALED(status))
                    fprintf(stderr, "  daemon %d was killed by signal %d (%s)\n", (int)dm->pid,
                            WTERMSIG(status), strsignal(WTERMSIG(status)));
                else if (!g_test_ok && WIFEXITED(status))
                    fprintf(stderr, "  daemon %d exited with status %d\n", (int)dm->pid,
                            WEXITSTATUS(status));
            } else {
                kill(dm->pid, SIGKILL);
                waitpid(dm->pid, NULL, 0);
            }
            dm->pid = 0;
        }
        if (!g_test_ok)
            dump_log(dm);
        daemon_cleanup_files(dm);
        g_daemons[i] = NULL;
    }
}

/* The first 64 KiB of dm's log contain needle. */
static inline bool daemon_log_has(const struct daemon *dm, const char *needle)
{
    static char buf[1 << 16];
    int fd = open(dm->log, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = 0;
    return strstr(buf, needle) != NULL;
}

/* A passing test ends here: the harness leaves a test with _exit(), past atexit handlers. */
static inline void test_done(void)
{
    g_test_ok = true;
    kill_daemons();
}

/*
 * The harness's timeout (SIGALRM) would kill us past atexit: the daemons
 * would die anyway (PDEATHSIG) but leave their files. Clean up with
 * async-signal-safe calls only, then die of the same signal.
 */
static inline void on_alarm(int sig)
{
    static const char msg[] = "  timeout: daemons killed, log follows\n";
    ssize_t w = write(2, msg, sizeof(msg) - 1);
    for (int i = 0; i < MAX_DAEMONS; i++) {
        struct daemon *dm = g_daemons[i];
        if (!dm)
            continue;
        if (dm->pid > 0)
            kill(dm->pid, SIGKILL);
        int fd = open(dm->log, O_RDONLY | O_CLOEXEC);
        char buf[4096];
        ssize_t n;
        while (fd >= 0 && (n = read(fd, buf, sizeof(buf))) > 0)
            w = write(2, buf, (size_t)n);
        if (fd >= 0)
            close(fd);
        unlink(dm->sock);
        if (dm->img[0])
            unlink(dm->img);
        unlink(dm->log);
        rmdir(dm->dir);
    }
    (void)w;
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Failing checks exit() through atexit; timeouts come through on_alarm. */
static inline void track(struct daemon *dm)
{
    static bool registered;
    if (!registered) {
        atexit(kill_daemons);
        signal(SIGALRM, on_alarm);
        registered = true;
    }
    for (int i = 0; i < MAX_DAEMONS; i++) {
        if (!g_daemons[i]) {
            g_daemons[i] = dm;
            return;
        }
    }
    VHD_CHECK(!"too many daemons");
}

static inline bool executable(const char *p)
{
    return access(p, X_OK) == 0;
}

/* The daemon binary: $VHD_VHOSTD, next to this test program, or build/vhostd. */
static inline const char *vhostd_path(void)
{
    static char path[PATH_MAX];
    const char *env = getenv("VHD_VHOSTD");
    if (env && *env)
        return executable(env) ? env : NULL;
    ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 16);
    if (n > 0) {
        path[n] = 0;
        char *slash = strrchr(path, '/');
        if (slash) {
            strcpy(slash + 1, "vhostd");
            if (executable(path))
                return path;
        }
    }
    if (executable("build/vhostd"))
        return "build/vhostd";
    return NULL;
}

static inline uint64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static inline void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Temp dir "<TMPDIR>/<tmpl>" (ends in XXXXXX) with socket <sock_name> and daemon.log; not tracked
 * yet. */
static inline void daemon_prepare_dir(struct daemon *dm, const char *tmpl, const char *sock_name)
{
    const char *t = getenv("TMPDIR");
    memset(dm, 0, sizeof(*dm));
    snprintf(dm->dir, sizeof(dm->dir), "%s/%s", t && *t ? t : "/tmp", tmpl);
    VHD_CHECK(mkdtemp(dm->dir) != NULL);
    snprintf(dm->sock, sizeof(dm->sock), "%s/%s", dm->dir, sock_name);
    snprintf(dm->log, sizeof(dm->log), "%s/daemon.log", dm->dir);
}

/* A sparse image of size bytes at dm->img, <dir>/disk.img (removed with dm's files). */
static inline void daemon_make_image(struct daemon *dm, uint64_t size)
{
    snprintf(dm->img, sizeof(dm->img), "%s/disk.img", dm->dir);
    int fd = open(dm->img, O_CREAT | O_RDWR | O_TRUNC | O_CLOEXEC, 0600);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(ftruncate(fd, (off_t)size), 0);
    close(fd);
}

/* Fork and exec argv with its output in dm->log; it dies with us (PDEATHSIG). */
static inline void daemon_spawn(struct daemon *dm, char *const argv[])
{
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127); /* the test died before prctl */
        int fd = open(dm->log, O_CREAT | O_WRONLY | O_APPEND | O_CLOEXEC, 0600);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    dm->pid = pid;
    /* Wait for the socket (bounded); a daemon that exits early fails the test. */
    uint64_t t0 = ms_now();
    struct stat st;
    while (stat(dm->sock, &st) < 0 || !S_ISSOCK(st.st_mode)) {
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            dm->pid = 0;
            fprintf(stderr, "  daemon exited early (status 0x%x)\n", status);
            VHD_CHECK(!"daemon start");
        }
        VHD_CHECK(ms_now() - t0 < START_MS);
        sleep_ms(5);
    }
}

/* SIGTERM and wait (bounded); returns the exit status, or -1 when it had to be killed. */
static inline int daemon_stop(struct daemon *dm)
{
    int status = 0;
    if (dm->pid <= 0)
        return -1;
    kill(dm->pid, SIGTERM);
    uint64_t t0 = ms_now();
    for (;;) {
        pid_t r = waitpid(dm->pid, &status, WNOHANG);
        if (r == dm->pid)
            break;
        if (ms_now() - t0 > STOP_MS) {
            kill(dm->pid, SIGKILL);
            waitpid(dm->pid, NULL, 0);
            dm->pid = 0;
            fprintf(stderr, "  daemon ignored SIGTERM for %d ms\n", STOP_MS);
            return -1;
        }
        sleep_ms(5);
    }
    dm->pid = 0;
    if (!WIFEXITED(status)) {
        fprintf(stderr, "  daemon ended by signal %d\n",
                WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        return -1;
    }
    return WEXITSTATUS(status);
}

#endif
