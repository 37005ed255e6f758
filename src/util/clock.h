/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Monotonic clock reads for deadlines, polling windows and rates: one
 * definition instead of a copy per file. CLOCK_MONOTONIC goes through the
 * vDSO (no syscall) and never jumps with the wall clock.
 */
#ifndef VHD_UTIL_CLOCK_H
#define VHD_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC (an arbitrary origin). Any thread. */
static inline uint64_t vhd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Milliseconds on CLOCK_MONOTONIC (an arbitrary origin). Any thread. */
static inline uint64_t vhd_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

#endif /* VHD_UTIL_CLOCK_H */
