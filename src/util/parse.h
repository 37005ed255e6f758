/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Parsing of numbers people type: sizes with binary units. Shared by the
 * daemon's options (daemon/options.c) and vhostd-bench (tools/).
 */
#ifndef VHD_UTIL_PARSE_H
#define VHD_UTIL_PARSE_H

#include <stdint.h>

/*
 * Parse "512", "4K", "10M", "8G", "1T" (binary units; case-insensitive, "KiB"/"kb" too)
 * or "0x1000" (hexadecimal). 0 or -1 (not a size, or above UINT64_MAX). Any thread.
 */
int vhd_parse_size(const char *s, uint64_t *out);

#endif /* VHD_UTIL_PARSE_H */
