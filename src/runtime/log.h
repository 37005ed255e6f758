/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Logging: one line per call to stderr, "<UTC timestamp> <level>: <message>",
 * filtered by one process-wide level (the public part: include/vhostd/log.h). Anything a guest or
 * front-end can trigger goes through the rate-limited variant (VHD_LOG_RL) so a hostile guest
 * cannot flood the log or slow the worker that serves it.
 */
#ifndef VHD_LOG_H
#define VHD_LOG_H

#include <stdint.h>

/* The level, vhd_log() and its level controls are public: include/vhostd/log.h. */
#include "vhostd/log.h"

/*
 * Rate-limit state of one call site: at most VHD_LOG_RL_BURST lines per
 * VHD_LOG_RL_INTERVAL_MS; the next line after a window with drops says how
 * many were dropped. Zero-initialised (a static) is the initial state. It
 * may be shared by several threads (a static at a call site reached by every
 * worker); its counters are updated with relaxed atomics, which only ever
 * run on error paths, so a race costs at most a line more or less.
 */
struct vhd_log_ratelimit {
    uint64_t window_start_ns; /* CLOCK_MONOTONIC start of the current window */
    uint32_t printed;         /* lines printed (or attempted) in this window */
    uint32_t dropped;         /* lines dropped since the last report */
};

/* 10 lines per 5 s per call site: a guest error shows up, a guest error loop does not flood. */
#define VHD_LOG_RL_BURST       10
#define VHD_LOG_RL_INTERVAL_MS 5000

/* vhd_log through rl. Returns 1 when the line was printed, 0 when dropped or filtered. */
int vhd_log_ratelimited(struct vhd_log_ratelimit *rl, enum vhd_log_level level, const char *fmt,
                        ...) __attribute__((format(printf, 3, 4)));

/* Rate-limited log line with its own per-call-site state. */
#define VHD_LOG_RL(level, ...)                                         \
    do {                                                               \
        static struct vhd_log_ratelimit vhd_log_rl_;                   \
        (void)vhd_log_ratelimited(&vhd_log_rl_, (level), __VA_ARGS__); \
    } while (0)

#endif /* VHD_LOG_H */
