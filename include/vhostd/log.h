/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libvhostd logging: one line per message to stderr, "<UTC timestamp> <level>:
 * <message>", filtered by one process-wide level. The library logs device
 * life-cycle events at INFO and anything a guest or front-end can trigger
 * rate-limited at WARN; an embedder may log through the same sink.
 */
#ifndef VHOSTD_LOG_H
#define VHOSTD_LOG_H

#ifdef __cplusplus
extern "C" {
#endif

enum vhd_log_level {
    VHD_LOG_ERROR = 0, /* something failed: a device, a queue, a connection */
    VHD_LOG_WARN = 1,  /* unexpected but handled (bad guest input, retries) */
    VHD_LOG_INFO = 2,  /* lifecycle: devices, connections, features (the default level) */
    VHD_LOG_DEBUG = 3, /* protocol traces; never on a per-request path */
};

/* Lines above this level are dropped. Any thread; normally set once at start-up. */
void vhd_log_set_level(enum vhd_log_level level);
enum vhd_log_level vhd_log_get_level(void);

/* "error", "warn" (or "warning"), "info", "debug" -> level; -EINVAL otherwise. */
int vhd_log_parse_level(const char *s);

/*
 * vhd_log - write one line (no trailing newline needed; one is added). Any
 * thread: the line is formatted into a local buffer (truncated at 1 KiB)
 * and written with a single write(2), so lines of concurrent threads never
 * interleave. errno is preserved.
 */
void vhd_log(enum vhd_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif /* VHOSTD_LOG_H */
