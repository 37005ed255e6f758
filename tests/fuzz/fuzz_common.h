/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pieces the libFuzzer targets share: the entry point's prototype, an
 * invariant check that aborts (so libFuzzer keeps the input), a reader
 * that takes little-endian values off the input, giving zeros once it runs
 * out, guest memory set-up and byte-wise access.
 */
#ifndef VHD_FUZZ_COMMON_H
#define VHD_FUZZ_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/dirtylog.h"
#include "core/mem.h"
#include "driver/guestmem.h"
#include "driver/vring.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* What is left of the input. */
struct in {
    const uint8_t *p;
    size_t n;
};

static inline uint8_t get8(struct in *in)
{
    if (!in->n)
        return 0;
    in->n--;
    return *in->p++;
}

static inline uint16_t get16(struct in *in)
{
    uint16_t lo = get8(in);
    return (uint16_t)(lo | get8(in) << 8);
}

static inline uint32_t get32(struct in *in)
{
    uint32_t lo = get16(in);
    return lo | (uint32_t)get16(in) << 16;
}

static inline uint64_t get64(struct in *in)
{
    uint64_t lo = get32(in);
    return lo | (uint64_t)get32(in) << 32;
}

/* len bytes of input into dst, zero-filled past its end. */
static inline void fill(struct in *in, void *dst, size_t len)
{
    size_t n = len < in->n ? len : in->n;
    memcpy(dst, in->p, n);
    memset((uint8_t *)dst + n, 0, len - n);
    in->p += n;
    in->n -= n;
}

/*
 * Guest memory of n regions of rsz bytes each from guest address gpa
 * (adjacent, mapped apart) and its memory table in *mem; aborts on failure.
 */
static inline void fuzz_guestmem(struct vhd_guestmem *gm, uint32_t n, uint64_t rsz, uint64_t gpa,
                                 struct vhd_mem **mem)
{
    struct vhd_mem_region_desc d[VHD_GUESTMEM_MAX_REGIONS];

    if (n > VHD_GUESTMEM_MAX_REGIONS || vhd_guestmem_init(gm, n, rsz, gpa, 0) < 0)
        abort();
    vhd_guestmem_descs(gm, d);
    if (vhd_mem_new(d, n, mem) < 0)
        abort();
}

/* Bytes of a driver ring area that holds either layout (split or packed). */
static inline size_t fuzz_area_len(uint32_t qsize, uint32_t max_indirect)
{
    size_t split = vhd_drv_vq_area_size(qsize, false, max_indirect);
    size_t packed = vhd_drv_vq_area_size(qsize, true, max_indirect);
    return split > packed ? split : packed;
}

/* Copy into guest memory byte by byte (the range may cross a region boundary; bytes outside memory
 * are dropped). */
static inline void fuzz_gwrite(struct vhd_guestmem *gm, uint64_t gpa, const void *src, size_t len)
{
    const uint8_t *s = src;
    for (size_t i = 0; i < len; i++) {
        uint8_t *p = vhd_guestmem_ptr(gm, gpa + i, 1);
        if (p)
            *p = s[i];
    }
}

/* The guest byte at gpa (0 outside memory). */
static inline uint8_t fuzz_gread8(struct vhd_guestmem *gm, uint64_t gpa)
{
    uint8_t *p = vhd_guestmem_ptr(gm, gpa, 1);
    return p ? *p : 0;
}

/* The page of gpa is marked in log. */
static inline bool fuzz_log_bit(const struct vhd_dirtylog *log, uint64_t gpa)
{
    uint64_t pg = gpa >> VHD_DIRTYLOG_PAGE_SHIFT;
    return (log->bits[pg / 8] >> (pg % 8)) & 1;
}

#endif /* VHD_FUZZ_COMMON_H */
