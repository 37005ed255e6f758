/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What vhostd-bench's blk and net subcommands share: the option values both
 * take the same way and their error messages, the stop flag, the jobs'
 * threads with the live progress line once a second, and the JSON helpers
 * of the summary.
 */
#ifndef VHD_BENCH_REPORT_H
#define VHD_BENCH_REPORT_H

#include <getopt.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Asks every job to stop (SIGINT/SIGTERM or a failed start); async-signal-safe. */
void bench_stop(int sig);

/* Whether bench_stop was called; read by the jobs. */
bool bench_stopping(void);

/* Option values (0, or -1 when a is not one). An integer min..max in decimal. */
int bench_parse_uint(const char *a, uint64_t min, uint64_t max, uint64_t *out);
/* Seconds > 0, with an optional 's' as fio writes it ("10s"). */
int bench_parse_runtime(const char *a, double *out);
/* "split" or "packed". */
int bench_parse_ring(const char *a, bool *packed);
/* "poll", or "interrupt" / "irq". */
int bench_parse_completion(const char *a, bool *interrupt);

/*
 * "PROG: invalid value for --NAME: 'A'" for the option of lo whose value is c;
 * returns -1.
 */
int bench_bad_value(const char *prog, const struct option *lo, int c, const char *a);

/*
 * After getopt_long: no operands are left and --socket was given. 0, or -1
 * with the message on stderr.
 */
int bench_check_rest(const char *prog, int argc, char **argv, const char *socket);

/*
 * The part of a job that the reporter reads; the first member of each job
 * struct (a blk queue's, a net pair's).
 */
struct bench_live {
    pthread_t thread;
    uint64_t done;           /* completions so far: the job stores it (relaxed) as it goes */
    uint64_t t_start, t_end; /* the job's measured span, ns; read after it finished */
    int finished;            /* stored (release) when the job's thread ends */
};

/* A run's jobs and how its progress line reads. */
struct bench_reporter {
    const char *prog; /* message prefix: "vhostd-bench" or "vhostd-bench net" */
    void *jobs;       /* n jobs, stride bytes apart, each starting with bench_live */
    size_t stride;
    unsigned n;
    void *(*job_main)(void *); /* a job's thread; gets the job */
    const char *rate_unit[2];  /* the progress line's two rates, e.g. "IOPS" and "MB/s" */
    int rate_width[2], rate_prec[2];
    double rate_scale[2]; /* rate = completions per second times this */
    unsigned started;     /* set by bench_run: threads that were started */
};

/* The live part of job i. */
struct bench_live *bench_job(const struct bench_reporter *r, unsigned i);

/*
 * Install the stop signals, start every job's thread, print the progress
 * line on stderr once a second until every started job finished, and join
 * them. Returns 0, or 1 when a thread could not be started (the others are
 * told to stop; r->started says how many ran).
 */
int bench_run(struct bench_reporter *r);

/* Seconds from the first job's start to the last one's end (0 without any). */
double bench_span(const struct bench_reporter *r);

/* s as a JSON string body (quotes, backslashes and control characters escaped). */
void bench_json_str(const char *s);

/* Opens the summary object: {"socket": "PATH" (the caller continues with ", ..."). */
void bench_json_open(const char *socket);

#endif /* VHD_BENCH_REPORT_H */
