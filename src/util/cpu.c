/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CPU features read once when the library is loaded (compiler.h).
 */
#include <stdbool.h>

#include "compiler.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

bool vhd_cpu_prefetchw;

/* PREFETCHW: CPUID 0x80000001, ECX bit 8 (PRFCHW, "3DNowPrefetch"). */
__attribute__((constructor)) static void vhd_cpu_probe(void)
{
    unsigned a, b, c, d;
    if (__get_cpuid(0x80000001u, &a, &b, &c, &d))
        vhd_cpu_prefetchw = (c >> 8) & 1;
}
#endif
