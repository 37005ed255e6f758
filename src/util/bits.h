/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Bit helpers for feature and flag words (virtio features, vhost-user protocol
 * features, status bits), one definition for every file that needs them.
 */
#ifndef VHD_UTIL_BITS_H
#define VHD_UTIL_BITS_H

/* The 64-bit mask of bit n (n < 64): feature words are 64 bits wide. */
#define BIT(n) (1ull << (n))

#endif /* VHD_UTIL_BITS_H */
