/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd-bench's latency histogram (see bench_hist.h): setup, merging and
 * percentiles.
 */
#include <string.h>

#include "bench_hist.h"

void hist_init(struct hist *h)
{
    memset(h, 0, sizeof(*h));
    h->min = UINT64_MAX;
}

/* Middle of bucket idx. */
static uint64_t hist_value(unsigned idx)
{
    if (idx < 2 * HIST_SUB)
        return idx;
    unsigned k = idx / HIST_SUB - 1;
    uint64_t sub = idx - HIST_SUB * k;
    return (sub << k) + ((1ull << k) - 1) / 2;
}

void hist_merge(struct hist *dst, const struct hist *src)
{
    for (unsigned i = 0; i < HIST_BUCKETS; i++)
        dst->n[i] += src->n[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
}

uint64_t hist_pct(const struct hist *h, double p)
{
    if (!h->count)
        return 0;
    uint64_t rank = (uint64_t)(p * (double)h->count + 0.5), seen = 0;
    if (rank < 1)
        rank = 1;
    for (unsigned i = 0; i < HIST_BUCKETS; i++) {
        seen += h->n[i];
        if (seen >= rank) {
            uint64_t v = hist_value(i);
            return v < h->min ? h->min : v > h->max ? h->max : v;
        }
    }
    return h->max;
}
