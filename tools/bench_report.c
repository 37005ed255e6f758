/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd-bench's shared reporter: option values and their messages, the stop
 * flag, starting the jobs and the live progress line, the run's span and the
 * JSON helpers. Used by the blk and net subcommands alike (bench_report.h).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_report.h"
#include "util/clock.h"

/* Set by SIGINT/SIGTERM (or a failed start); read by every job. */
static int g_stop;

void bench_stop(int sig)
{
    (void)sig;
    __atomic_store_n(&g_stop, 1, __ATOMIC_RELAXED); /* lock-free: async-signal-safe */
}

bool bench_stopping(void)
{
    return __atomic_load_n(&g_stop, __ATOMIC_RELAXED) != 0;
}

/* ---- option values ---- */

int bench_parse_uint(const char *a, uint64_t min, uint64_t max, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(a, &end, 10);
    if (errno || end == a || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int bench_parse_runtime(const char *a, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(a, &end);
    if (end != a && *end == 's') /* fio accepts "10s" */
        end++;
    if (errno || end == a || *end || !(*out > 0))
        return -1;
    return 0;
}

int bench_parse_ring(const char *a, bool *packed)
{
    if (!strcmp(a, "split"))
        *packed = false;
    else if (!strcmp(a, "packed"))
        *packed = true;
    else
        return -1;
    return 0;
}

int bench_parse_completion(const char *a, bool *interrupt)
{
    if (!strcmp(a, "poll"))
        *interrupt = false;
    else if (!strcmp(a, "interrupt") || !strcmp(a, "irq"))
        *interrupt = true;
    else
        return -1;
    return 0;
}

int bench_bad_value(const char *prog, const struct option *lo, int c, const char *a)
{
    for (const struct option *l = lo; l->name; l++) {
        if (l->val == c) {
            fprintf(stderr, "%s: invalid value for --%s: '%s'\n", prog, l->name, a);
            break;
        }
    }
    return -1;
}

int bench_check_rest(const char *prog, int argc, char **argv, const char *socket)
{
    if (optind < argc) {
        fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
        return -1;
    }
    if (!socket) {
        fprintf(stderr, "%s: --socket=PATH is required\n", prog);
        return -1;
    }
    return 0;
}

/* ---- jobs and progress ---- */

struct bench_live *bench_job(const struct bench_reporter *r, unsigned i)
{
    return (struct bench_live *)((char *)r->jobs + (size_t)i * r->stride);
}

/* Sleeps up to a second, returning early (true) once every started job finished. */
static bool wait_second(const struct bench_reporter *r)
{
    for (unsigned k = 0; k < 20; k++) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL);
        bool all = true;
        for (unsigned i = 0; i < r->started; i++)
            if (!__atomic_load_n(&bench_job(r, i)->finished, __ATOMIC_ACQUIRE))
                all = false;
        if (all)
            return true;
    }
    return false;
}

int bench_run(struct bench_reporter *r)
{
    int status = 0;

    signal(SIGINT, bench_stop);
    signal(SIGTERM, bench_stop);
    fflush(stdout);

    uint64_t t0 = vhd_now_ns();
    for (r->started = 0; r->started < r->n; r->started++) {
        struct bench_live *l = bench_job(r, r->started);
        int rc = pthread_create(&l->thread, NULL, r->job_main, l);
        if (rc) {
            fprintf(stderr, "%s: pthread_create: %s\n", r->prog, strerror(rc));
            bench_stop(0);
            status = 1;
            break;
        }
    }

    /* Progress once a second until every job finished. */
    bool tty = isatty(STDERR_FILENO);
    uint64_t prev_done = 0, prev_t = t0;
    while (!wait_second(r)) {
        uint64_t done = 0, t = vhd_now_ns();
        for (unsigned i = 0; i < r->started; i++)
            done += __atomic_load_n(&bench_job(r, i)->done, __ATOMIC_RELAXED);
        double per_sec = (double)(done - prev_done) / ((double)(t - prev_t) / 1e9);
        fprintf(stderr, "%s[%5.0fs] %*.*f %s %*.*f %s%s", tty ? "\r" : "", (double)(t - t0) / 1e9,
                r->rate_width[0], r->rate_prec[0], per_sec * r->rate_scale[0], r->rate_unit[0],
                r->rate_width[1], r->rate_prec[1], per_sec * r->rate_scale[1], r->rate_unit[1],
                tty ? "   " : "\n");
        prev_done = done;
        prev_t = t;
    }
    if (tty)
        fputc('\n', stderr);
    for (unsigned i = 0; i < r->started; i++)
        pthread_join(bench_job(r, i)->thread, NULL);
    return status;
}

double bench_span(const struct bench_reporter *r)
{
    uint64_t t_first = UINT64_MAX, t_last = 0;
    for (unsigned i = 0; i < r->started; i++) {
        const struct bench_live *l = bench_job(r, i);
        if (l->t_start < t_first)
            t_first = l->t_start;
        if (l->t_end > t_last)
            t_last = l->t_end;
    }
    return t_last > t_first ? (double)(t_last - t_first) / 1e9 : 0;
}

/* ---- JSON ---- */

void bench_json_str(const char *s)
{
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
}

void bench_json_open(const char *socket)
{
    printf("{\"socket\": \"");
    bench_json_str(socket);
    putchar('"');
}
