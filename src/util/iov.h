/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Copies between a flat buffer and a byte range of an iovec array (a chain
 * popped from a virtqueue, a frame's segments): one definition for the
 * devices and backends that each had their own loop. Inline: callers use
 * them on the request path with small, often constant lengths.
 */
#ifndef VHD_UTIL_IOV_H
#define VHD_UTIL_IOV_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>

/*
 * vhd_iov_to_buf - copy up to len bytes, starting at byte off of
 * iov[0..cnt), to dst. Returns the bytes copied: less than len when the
 * iovecs end first. The ranges must not overlap.
 * The source is usually guest memory (request headers, commands, frames),
 * which the driver may rewrite at any time: the compiler barrier at the end
 * keeps the compiler from reading it again in place of dst (read once, then
 * check and use only the copy).
 */
static inline size_t vhd_iov_to_buf(const struct iovec *iov, uint32_t cnt, size_t off, void *dst,
                                    size_t len)
{
    uint8_t *d = dst;
    size_t done = 0;

    for (uint32_t i = 0; i < cnt && done < len; i++) {
        if (off >= iov[i].iov_len) {
            off -= iov[i].iov_len;
            continue;
        }
        size_t n = iov[i].iov_len - off;
        if (n > len - done)
            n = len - done;
        memcpy(d + done, (const uint8_t *)iov[i].iov_base + off, n);
        done += n;
        off = 0;
    }
    __asm__ volatile("" ::: "memory");
    return done;
}

/*
 * vhd_iov_from_buf - copy up to len bytes from src to byte off of
 * iov[0..cnt) onwards. Returns the bytes copied: less than len when the
 * iovecs end first. The ranges must not overlap.
 */
static inline size_t vhd_iov_from_buf(const struct iovec *iov, uint32_t cnt, size_t off,
                                      const void *src, size_t len)
{
    const uint8_t *s = src;
    size_t done = 0;

    for (uint32_t i = 0; i < cnt && done < len; i++) {
        if (off >= iov[i].iov_len) {
            off -= iov[i].iov_len;
            continue;
        }
        size_t n = iov[i].iov_len - off;
        if (n > len - done)
            n = len - done;
        memcpy((uint8_t *)iov[i].iov_base + off, s + done, n);
        done += n;
        off = 0;
    }
    return done;
}

#endif /* VHD_UTIL_IOV_H */
