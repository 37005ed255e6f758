/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * wakeup_pingpong: calibrates the machine for bench/side-by-side.sh. Two
 * threads bounce a token through two eventfds (blocking reads, the way a
 * vhost-user kick and call wake a sleeping daemon and driver), each thread
 * pinned to a given CPU. Prints the round-trip time (p50/p99) and the CPU time
 * charged per wake-up, so the daemons' event-mode numbers can be read against
 * what one sleep/wake-up costs here, whatever the daemon does.
 *
 * usage: wakeup_pingpong [CPU_A CPU_B [SECONDS]]   (default 0 1 2)
 * build: cc -O2 -pthread -o build/bench/wakeup_pingpong bench/wakeup_pingpong.c
 */
#define _GNU_SOURCE /* CPU_SET, pthread_setaffinity_np */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define MAX_SAMPLES (1u << 22)

static int efd_ab, efd_ba;     /* A -> B, B -> A */
static volatile int stop_flag; /* set by A when done; B leaves on its next token */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
    if (rc) {
        fprintf(stderr, "wakeup_pingpong: pin to CPU %d: %s\n", cpu, strerror(rc));
        exit(1);
    }
}

static void must_read(int fd)
{
    uint64_t v;
    while (read(fd, &v, sizeof(v)) != (ssize_t)sizeof(v))
        if (errno != EINTR) {
            perror("read");
            exit(1);
        }
}

static void must_write(int fd)
{
    if (eventfd_write(fd, 1) != 0) {
        perror("eventfd_write");
        exit(1);
    }
}

struct b_args {
    int cpu;
    uint64_t cpu_ns, wakeups;
};

static void *thread_b(void *arg)
{
    struct b_args *a = arg;
    pin(a->cpu);
    uint64_t c0 = thread_cpu_ns();
    for (;;) {
        must_read(efd_ab);
        if (stop_flag)
            break;
        a->wakeups++;
        must_write(efd_ba);
    }
    a->cpu_ns = thread_cpu_ns() - c0;
    return NULL;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

int main(int argc, char **argv)
{
    int cpu_a = argc > 1 ? atoi(argv[1]) : 0;
    int cpu_b = argc > 2 ? atoi(argv[2]) : 1;
    double secs = argc > 3 ? atof(argv[3]) : 2.0;
    uint64_t *rtt = malloc(MAX_SAMPLES * sizeof(*rtt));
    struct b_args b = {.cpu = cpu_b};
    pthread_t tb;

    efd_ab = eventfd(0, EFD_CLOEXEC);
    efd_ba = eventfd(0, EFD_CLOEXEC);
    if (!rtt || efd_ab < 0 || efd_ba < 0) {
        perror("wakeup_pingpong: setup");
        return 1;
    }
    pin(cpu_a);
    if (pthread_create(&tb, NULL, thread_b, &b)) {
        perror("pthread_create");
        return 1;
    }
    uint64_t n = 0, t_end = now_ns() + (uint64_t)(secs * 1e9), c0 = thread_cpu_ns();
    uint64_t t0 = now_ns();
    while (n < MAX_SAMPLES) {
        uint64_t t = now_ns();
        if (t >= t_end)
            break;
        must_write(efd_ab);
        must_read(efd_ba);
        rtt[n++] = now_ns() - t;
    }
    uint64_t wall = now_ns() - t0, cpu_a_ns = thread_cpu_ns() - c0;
    stop_flag = 1;
    must_write(efd_ab);
    pthread_join(tb, NULL);

    qsort(rtt, n, sizeof(*rtt), cmp_u64);
    printf("{\"cpu_a\": %d, \"cpu_b\": %d, \"round_trips\": %llu, \"rtt_us\": {\"p50\": %.1f, "
           "\"p99\": %.1f, \"min\": %.1f}, \"round_trips_per_s\": %.0f, "
           "\"cpu_us_per_wakeup\": {\"a\": %.2f, \"b\": %.2f}}\n",
           cpu_a, cpu_b, (unsigned long long)n, n ? rtt[n / 2] / 1e3 : 0.0,
           n ? rtt[n * 99 / 100] / 1e3 : 0.0, n ? rtt[0] / 1e3 : 0.0,
           wall ? n * 1e9 / (double)wall : 0.0, n ? cpu_a_ns / 1e3 / (double)n : 0.0,
           b.wakeups ? b.cpu_ns / 1e3 / (double)b.wakeups : 0.0);
    free(rtt);
    return 0;
}
