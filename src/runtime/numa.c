/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * NUMA helpers of the runtime (numa.h): the calling thread's node, moving a
 * worker's pages to it, and the report of a device's guest-memory node
 * against the nodes of the workers that run its queues.
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/mem.h"
#include "dev.h"
#include "log.h"
#include "numa.h"

#define MOVE_BATCH 64 /* pages per move_pages call */
/* <numaif.h> is libnuma's: the kernel's values. */
#define MPOL_MF_MOVE_ (1 << 1)
#define MPOL_F_NODE_  (1 << 0)
#define MPOL_F_ADDR_  (1 << 1)

int vhd_numa_node_here(void)
{
    unsigned cpu, node;

    if (getcpu(&cpu, &node) < 0) /* the vDSO's: usually no syscall */
        return -errno;
    return (int)node;
}

int vhd_numa_move_here(void *addr, size_t len)
{
    long psz = sysconf(_SC_PAGESIZE);
    void *pages[MOVE_BATCH];
    int nodes[MOVE_BATCH], status[MOVE_BATCH];
    int node = vhd_numa_node_here();

    if (node < 0)
        return node;
    if (psz <= 0 || len == 0)
        return psz <= 0 ? -EINVAL : 0;
    uintptr_t p = (uintptr_t)addr & ~(uintptr_t)(psz - 1);
    uintptr_t end = (uintptr_t)addr + len;
    while (p < end) {
        unsigned long n = 0;
        for (; n < MOVE_BATCH && p < end; n++, p += (uintptr_t)psz) {
            pages[n] = (void *)p;
            nodes[n] = node;
        }
        if (syscall(SYS_move_pages, 0, n, pages, nodes, status, MPOL_MF_MOVE_) < 0)
            return -errno;
    }
    return 0;
}

/*
 * Count the nodes of up to VHD_NUMA_SAMPLES pages spread over [base, base +
 * len). Only pages the memory file already has (mincore: in its page cache,
 * whoever touched them) are looked up, with get_mempolicy(MPOL_F_NODE |
 * MPOL_F_ADDR), which maps an existing page but would allocate a missing one
 * on this thread's node: a hole is never asked about. Returns the number of
 * resident pages seen.
 */
static unsigned sample_region(uint8_t *base, uint64_t len, unsigned *counts, unsigned *sampled)
{
    long psz = sysconf(_SC_PAGESIZE);
    uint64_t npages;
    unsigned n, resident = 0;

    if (psz <= 0 || len == 0)
        return 0;
    npages = (len + (uint64_t)psz - 1) / (uint64_t)psz;
    n = npages < VHD_NUMA_SAMPLES ? (unsigned)npages : VHD_NUMA_SAMPLES;
    for (unsigned i = 0; i < n; i++) {
        uint64_t pg = npages * i / n;
        void *page = (void *)(((uintptr_t)base + pg * (uint64_t)psz) & ~(uintptr_t)(psz - 1));
        unsigned char in_core = 0;
        int node = -1;
        (*sampled)++;
        if (mincore(page, (size_t)psz, &in_core) < 0 || !(in_core & 1))
            continue;
        if (syscall(SYS_get_mempolicy, &node, NULL, 0UL, page, MPOL_F_NODE_ | MPOL_F_ADDR_) < 0 ||
            node < 0)
            continue;
        counts[node < VHD_NUMA_MAX_NODE ? node : VHD_NUMA_MAX_NODE]++;
        resident++;
    }
    return resident;
}

unsigned vhd_numa_report_mem(const struct vhd_dev *dev, const struct vhd_numa_qplace *q,
                             unsigned nq, bool last)
{
    unsigned counts[VHD_NUMA_MAX_NODE + 1] = {0};
    unsigned sampled = 0, resident = 0, best = 0;
    char list[256];
    size_t off = 0;
    const struct vhd_mem *mem = dev->mem;

    if (!mem || mem->nregions == 0)
        return 0;
    for (uint32_t r = 0; r < mem->nregions; r++)
        resident += sample_region(mem->regions[r].hva, mem->regions[r].size, counts, &sampled);
    if (resident == 0) {
        if (last)
            vhd_log(VHD_LOG_INFO,
                    "%s: guest memory: none of %u sampled pages is resident yet (NUMA node "
                    "unknown)",
                    dev->name, sampled);
        return 0;
    }
    list[0] = '\0';
    for (unsigned nd = 0; nd <= VHD_NUMA_MAX_NODE; nd++) {
        if (!counts[nd])
            continue;
        if (counts[nd] > counts[best] || !counts[best])
            best = nd;
        int k = snprintf(list + off, sizeof(list) - off, "%s%s%u (%u of %u sampled pages)",
                         off ? ", " : "", nd == VHD_NUMA_MAX_NODE ? ">= " : "", nd, counts[nd],
                         sampled);
        if (k > 0 && (size_t)k < sizeof(list) - off)
            off += (size_t)k;
    }
    vhd_log(VHD_LOG_INFO, "%s: guest memory on NUMA node%s %s", dev->name,
            counts[best] == resident ? "" : "s", list);
    if (best == VHD_NUMA_MAX_NODE)
        return resident;

    /* Each worker once: warn when it is pinned to a CPU of another node. */
    uint64_t seen = 0;
    for (unsigned i = 0; i < nq; i++) {
        unsigned w = q[i].worker;
        if (w >= 64 || (seen >> w & 1))
            continue;
        seen |= 1ull << w;
        int node = q[i].node;
        if (node < 0 || (unsigned)node == best)
            continue;
        vhd_log(VHD_LOG_WARN,
                "%s: queues run on worker %u (CPU %d, NUMA node %d) but guest memory is on node "
                "%u: every request crosses nodes; pin its workers to CPUs of node %u (--cpus, "
                "workers=)",
                dev->name, w, q[i].cpu, node, best, best);
    }
    return resident;
}
