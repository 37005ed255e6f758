/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * CPU placement and NUMA nodes: the node a thread runs on, moving a worker's
 * own pages to it, and the report of which node a device's guest memory sits
 * on (with a warning when its queues run on workers pinned to another node).
 * Raw syscalls (getcpu, move_pages, get_mempolicy): no libnuma.
 */
#ifndef VHD_NUMA_H
#define VHD_NUMA_H

#include <stdbool.h>
#include <stddef.h>

struct vhd_dev;

/* Where queue i of a device runs: its worker, and that worker's CPU and node (-1: floating). */
struct vhd_numa_qplace {
    unsigned worker;
    int cpu;
    int node;
};

/* The NUMA node of the CPU the calling thread runs on, or -errno. Any thread. */
int vhd_numa_node_here(void);

/*
 * vhd_numa_move_here - move the pages holding [addr, addr + len) to the
 * calling thread's node (move_pages, MPOL_MF_MOVE: pages shared with other
 * processes stay where they are). A worker calls it on its own state right
 * after pinning. 0, or -errno (nothing is wrong when it fails: the memory
 * just stays remote). Any thread.
 */
int vhd_numa_move_here(void *addr, size_t len);

/*
 * vhd_numa_report_mem - log which node(s) dev's guest memory sits on (up to
 * VHD_NUMA_SAMPLES pages of each region: those the memory file has, through
 * mincore and get_mempolicy; a hole is never faulted in), and warn when one of dev's queues runs on
 * a worker pinned to a CPU of another node. q[i] says where queue i runs
 * (nq queues). Info line:
 *   "NAME: guest memory on NUMA node 0 (16 of 16 sampled pages)".
 * When no sampled page is resident yet (a front-end that has not touched
 * its memory), says so only when `last` is set and returns 0: the caller
 * asks again later (the transport: when a ring starts). Returns the number
 * of resident pages seen. Control thread; dev->mem may be NULL.
 */
unsigned vhd_numa_report_mem(const struct vhd_dev *dev, const struct vhd_numa_qplace *q,
                             unsigned nq, bool last);

#define VHD_NUMA_SAMPLES  16u /* pages looked up per memory region */
#define VHD_NUMA_MAX_NODE 64  /* nodes counted separately; higher ones are reported as ">= 64" */

#endif /* VHD_NUMA_H */
