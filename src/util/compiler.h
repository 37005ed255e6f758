/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Compiler and CPU helpers shared by every part of vhostd: branch hints, memory
 * barriers for rings shared with another agent, little-endian accessors and the
 * speculation-safe index clamp used on every guest-supplied index.
 */
#ifndef VHD_COMPILER_H
#define VHD_COMPILER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define vhd_likely(x)   __builtin_expect(!!(x), 1)
#define vhd_unlikely(x) __builtin_expect(!!(x), 0)

#define VHD_CACHELINE         64
#define vhd_cacheline_aligned __attribute__((aligned(VHD_CACHELINE)))

#define VHD_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#define vhd_container_of(ptr, type, member) ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

/*
 * Barriers. The rings are shared with a driver running on another CPU; the C11
 * fences below compile to nothing on x86 except the full fence (mfence or a
 * locked instruction), which is needed for store->load ordering (the
 * "publish index, then read event index" pattern).
 */
#define vhd_smp_rmb() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#define vhd_smp_wmb() __atomic_thread_fence(__ATOMIC_RELEASE)
#define vhd_smp_mb()  __atomic_thread_fence(__ATOMIC_SEQ_CST)

/* Plain (non read-modify-write) accesses with ordering, for shared ring fields. */
#define vhd_load_acquire(p)     __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define vhd_store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define vhd_load_relaxed(p)     __atomic_load_n((p), __ATOMIC_RELAXED)
#define vhd_store_relaxed(p, v) __atomic_store_n((p), (v), __ATOMIC_RELAXED)

/*
 * Virtio 1.x structures are little-endian. These accessors are no-ops on
 * little-endian hosts and keep the conversions visible in the code.
 */
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
static inline uint16_t vhd_le16(uint16_t v)
{
    return v;
}
static inline uint32_t vhd_le32(uint32_t v)
{
    return v;
}
static inline uint64_t vhd_le64(uint64_t v)
{
    return v;
}
#else
static inline uint16_t vhd_le16(uint16_t v)
{
    return __builtin_bswap16(v);
}
static inline uint32_t vhd_le32(uint32_t v)
{
    return __builtin_bswap32(v);
}
static inline uint64_t vhd_le64(uint64_t v)
{
    return __builtin_bswap64(v);
}
#endif

/*
 * vhd_index_nospec - clamp an index that has already been bounds-checked.
 *
 * Returns idx when idx < size and 0 otherwise, computed without a branch so
 * that a mispredicted bounds check cannot speculatively index past the array
 * (the array_index_nospec idea). The empty asm hides the mask from the
 * optimiser so it cannot turn the arithmetic back into a branch.
 * size must be non-zero and below 2^63.
 */
static inline uint64_t vhd_index_nospec(uint64_t idx, uint64_t size)
{
    /* All ones when idx < size: (idx - size) borrows, setting the top bit. */
    uint64_t mask = (uint64_t)((int64_t)(idx - size) >> 63);
    /* ...unless idx itself has the top bit set (then idx >= size). */
    mask &= ~(uint64_t)((int64_t)idx >> 63);
    __asm__ volatile("" : "+r"(mask));
    return idx & mask;
}

/*
 * vhd_prefetch_w - fetch the line at p to be written soon (p need not be
 * valid: a prefetch never faults). A buffer the driver's CPU owns, fetched
 * with a plain prefetch, arrives shared and the store still has to take it
 * from that CPU; PREFETCHW (x86, when the CPU has it: cpu.c) takes it for
 * writing at once. The receive path's header store and copy wait on exactly
 * that: PERFORMANCE.md §2.
 */
#if defined(__x86_64__) || defined(__i386__)
extern bool vhd_cpu_prefetchw;
static inline void vhd_prefetch_w(const void *p)
{
    if (vhd_likely(vhd_cpu_prefetchw))
        __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
    else
        __builtin_prefetch(p, 1);
}
#else
static inline void vhd_prefetch_w(const void *p)
{
    __builtin_prefetch(p, 1);
}
#endif

#endif /* VHD_COMPILER_H */
