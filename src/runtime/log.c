/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Logging to stderr: level filter, line formatting with a UTC timestamp, one
 * write(2) per line, and the per-call-site rate limiter used for anything a
 * guest or front-end can trigger.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "util/clock.h"
#include "util/compiler.h"
#include "log.h"

/* The process-wide level; relaxed atomics: a level change needs no ordering. */
static int log_level = VHD_LOG_INFO;

/* Longest line written; longer messages are cut (and end with "..."). */
#define LOG_LINE_MAX 1024

static const char *const level_names[] = {
    [VHD_LOG_ERROR] = "error",
    [VHD_LOG_WARN] = "warn",
    [VHD_LOG_INFO] = "info",
    [VHD_LOG_DEBUG] = "debug",
};

void vhd_log_set_level(enum vhd_log_level level)
{
    if ((int)level < VHD_LOG_ERROR)
        level = VHD_LOG_ERROR;
    if (level > VHD_LOG_DEBUG)
        level = VHD_LOG_DEBUG;
    vhd_store_relaxed(&log_level, (int)level);
}

enum vhd_log_level vhd_log_get_level(void)
{
    return (enum vhd_log_level)vhd_load_relaxed(&log_level);
}

int vhd_log_parse_level(const char *s)
{
    if (!s)
        return -EINVAL;
    for (unsigned i = 0; i < VHD_ARRAY_SIZE(level_names); i++)
        if (!strcasecmp(s, level_names[i]))
            return (int)i;
    if (!strcasecmp(s, "warning"))
        return VHD_LOG_WARN;
    return -EINVAL;
}

static bool log_enabled(enum vhd_log_level level)
{
    return (int)level <= vhd_load_relaxed(&log_level);
}

/* Write all of buf to stderr, retrying on EINTR and short writes; errors are dropped. */
static void log_write(const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(STDERR_FILENO, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        buf += n;
        len -= (size_t)n;
    }
}

/* Format and write one line; `suffix` (may be NULL) is appended to the message. */
static void log_vline(enum vhd_log_level level, const char *suffix, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

static void log_vline(enum vhd_log_level level, const char *suffix, const char *fmt, va_list ap)
{
    char line[LOG_LINE_MAX];
    struct timespec ts;
    struct tm tm;
    size_t len;
    int saved_errno = errno;

    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    int n =
        snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ %s: ", tm.tm_year + 1900,
                 tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000,
                 level_names[level]);
    len = n < 0 ? 0 : (size_t)n;
    /* Leave room for the newline (and the terminating NUL vsnprintf writes). */
    if (len < sizeof(line) - 1) {
        n = vsnprintf(line + len, sizeof(line) - 1 - len, fmt, ap);
        if (n > 0)
            len += (size_t)n;
    }
    if (suffix && len < sizeof(line) - 1) {
        n = snprintf(line + len, sizeof(line) - 1 - len, "%s", suffix);
        if (n > 0)
            len += (size_t)n;
    }
    if (len > sizeof(line) - 2) {
        /* Truncated: mark it, keep the newline. */
        len = sizeof(line) - 2;
        memcpy(line + len - 3, "...", 3);
    }
    /* Strip a newline the caller put in; we add exactly one. */
    while (len > 0 && line[len - 1] == '\n')
        len--;
    line[len++] = '\n';
    log_write(line, len);
    errno = saved_errno;
}

void vhd_log(enum vhd_log_level level, const char *fmt, ...)
{
    va_list ap;

    if (!log_enabled(level))
        return;
    va_start(ap, fmt);
    log_vline(level, NULL, fmt, ap);
    va_end(ap);
}

/*
 * The limiter: a window opens at the first line and lasts
 * VHD_LOG_RL_INTERVAL_MS; the first VHD_LOG_RL_BURST lines in it are
 * printed, the rest counted. The thread that opens the next window (the
 * compare-exchange picks one) resets the count, and the first line printed
 * after drops carries "[N similar lines dropped]". Relaxed atomics suffice:
 * the fields are counters, nothing else is published through them. These
 * read-modify-writes only run when something is being logged (an error
 * path), never per request.
 */
int vhd_log_ratelimited(struct vhd_log_ratelimit *rl, enum vhd_log_level level, const char *fmt,
                        ...)
{
    char suffix[64];
    uint32_t dropped = 0;
    va_list ap;

    if (!log_enabled(level))
        return 0;
    uint64_t now = vhd_now_ns();
    uint64_t start = vhd_load_relaxed(&rl->window_start_ns);
    if (start == 0 || now - start >= (uint64_t)VHD_LOG_RL_INTERVAL_MS * 1000000ull) {
        if (__atomic_compare_exchange_n(&rl->window_start_ns, &start, now, false, __ATOMIC_RELAXED,
                                        __ATOMIC_RELAXED)) {
            vhd_store_relaxed(&rl->printed, 0);
            dropped = __atomic_exchange_n(&rl->dropped, 0, __ATOMIC_RELAXED);
        }
    }
    /* Check before counting so the counter cannot wrap under a flood. */
    if (vhd_load_relaxed(&rl->printed) >= VHD_LOG_RL_BURST ||
        __atomic_fetch_add(&rl->printed, 1, __ATOMIC_RELAXED) >= VHD_LOG_RL_BURST) {
        __atomic_fetch_add(&rl->dropped, 1, __ATOMIC_RELAXED);
        return 0;
    }
    if (dropped)
        snprintf(suffix, sizeof(suffix), " [%u similar lines dropped]", dropped);
    va_start(ap, fmt);
    log_vline(level, dropped ? suffix : NULL, fmt, ap);
    va_end(ap);
    return 1;
}
