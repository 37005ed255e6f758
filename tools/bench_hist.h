/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd-bench's latency histogram: fixed-size, log-linear buckets of
 * nanoseconds; adding a sample is a few instructions on the I/O path,
 * percentiles are read once at the end.
 */
#ifndef VHD_BENCH_HIST_H
#define VHD_BENCH_HIST_H

#include <stdint.h>

/*
 * Log-linear histogram of nanoseconds (the HdrHistogram layout): values
 * below 64 have their own bucket; above, each power of two is split into 32
 * buckets, so a bucket is at most ~3% wide. 1376 buckets reach 2^46 ns
 * (~20 hours); larger values land in the last one. Fixed size: no
 * allocation per I/O.
 */
#define HIST_SUB     32u
#define HIST_BUCKETS 1376u

struct hist {
    uint64_t n[HIST_BUCKETS];
    uint64_t count, sum, min, max;
};

/* Empty (min at UINT64_MAX until the first sample). */
void hist_init(struct hist *h);

/* Add src's samples to dst. */
void hist_merge(struct hist *dst, const struct hist *src);

/* The value below which a fraction p of the samples fall, clamped to [min, max]; 0 if empty. */
uint64_t hist_pct(const struct hist *h, double p);

/* The bucket of v. */
static inline unsigned hist_index(uint64_t v)
{
    if (v < 2 * HIST_SUB)
        return (unsigned)v;
    unsigned msb = 63u - (unsigned)__builtin_clzll(v);
    unsigned k = msb - 5; /* v >> k lands in [32, 64) */
    unsigned idx = HIST_SUB * k + (unsigned)(v >> k);
    return idx < HIST_BUCKETS ? idx : HIST_BUCKETS - 1;
}

/* Record one sample (ns). */
static inline void hist_add(struct hist *h, uint64_t v)
{
    h->n[hist_index(v)]++;
    h->count++;
    h->sum += v;
    if (v < h->min)
        h->min = v;
    if (v > h->max)
        h->max = v;
}

#endif /* VHD_BENCH_HIST_H */
