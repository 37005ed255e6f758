/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The harness's main(): runs every registered test (or those whose name
 * contains one of the arguments) in its own child process with a timeout
 * (VHD_TEST_TIMEOUT seconds, default 60), and prints one result line per test
 * and a summary line. Under ASan a test that returns is also leak-checked
 * before its child exits: a leak fails it like a failed check.
 */
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#if defined(__SANITIZE_ADDRESS__)
#define VHD_TEST_LSAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define VHD_TEST_LSAN 1
#endif
#endif
#ifdef VHD_TEST_LSAN
#include <sanitizer/lsan_interface.h>
#endif

#define MAX_TESTS 1024
#define SKIP_EXIT 77
#define LEAK_EXIT 78

static struct {
    const char *name;
    vhd_test_fn fn;
} tests[MAX_TESTS];
static int ntests;

void vhd_test_register(const char *name, vhd_test_fn fn)
{
    if (ntests < MAX_TESTS) {
        tests[ntests].name = name;
        tests[ntests].fn = fn;
        ntests++;
    }
}

void vhd_test_skip(const char *why)
{
    fprintf(stderr, "  skipped: %s\n", why);
    fflush(NULL);
    _exit(SKIP_EXIT);
}

static bool selected(const char *name, int argc, char **argv)
{
    if (argc <= 1)
        return true;
    for (int i = 1; i < argc; i++)
        if (strstr(name, argv[i]))
            return true;
    return false;
}

/*
 * The child ends with _exit(), which skips LeakSanitizer's at-exit check: run it
 * here, while the test's memory is still in place. True when LSan reported a
 * leak (it prints the report); false without ASan or with detect_leaks=0.
 */
static bool leaked(void)
{
#ifdef VHD_TEST_LSAN
    return __lsan_do_recoverable_leak_check() != 0;
#else
    return false;
#endif
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    const char *prog = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    const char *t = getenv("VHD_TEST_TIMEOUT");
    int timeout = t ? atoi(t) : 60;
    int passed = 0, failed = 0, skipped = 0;

    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 0; i < ntests; i++) {
        if (!selected(tests[i].name, argc, argv))
            continue;
        double t0 = now_s();
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 2;
        }
        if (pid == 0) {
            alarm((unsigned)timeout);
            tests[i].fn();
            fflush(NULL);
            if (leaked())
                _exit(LEAK_EXIT);
            _exit(0);
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0)
            ;
        double dt = now_s() - t0;
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
            printf("PASS %s (%.2fs)\n", tests[i].name, dt);
            passed++;
        } else if (WIFEXITED(st) && WEXITSTATUS(st) == SKIP_EXIT) {
            printf("SKIP %s\n", tests[i].name);
            skipped++;
        } else {
            if (WIFEXITED(st) && WEXITSTATUS(st) == LEAK_EXIT)
                printf("FAIL %s (memory leaked, see the LeakSanitizer report)\n", tests[i].name);
            else if (WIFSIGNALED(st))
                printf("FAIL %s (signal %d%s)\n", tests[i].name, WTERMSIG(st),
                       WTERMSIG(st) == SIGALRM ? ", timeout" : "");
            else
                printf("FAIL %s (exit %d)\n", tests[i].name, WEXITSTATUS(st));
            failed++;
        }
    }
    if (skipped)
        printf("%s: %d passed, %d failed, %d skipped\n", prog, passed, failed, skipped);
    else
        printf("%s: %d passed, %d failed\n", prog, passed, failed);
    return failed ? 1 : 0;
}
