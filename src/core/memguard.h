/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Guard for guest-memory mappings against SIGBUS.
 *
 * Guest RAM is a file the front-end shares with us (memfd, tmpfs, hugetlbfs)
 * and mapped MAP_SHARED. The front-end keeps its own descriptor, so it can
 * shrink the file after we mapped it; the next touch of a page past the new
 * end raises SIGBUS in whichever thread touched it. Without a guard that
 * kills the daemon and every other device with it.
 *
 * Every mapping is registered here (vhd_mem does it). Once the guard is
 * installed, a SIGBUS (BUS_ADRERR) whose address lies in a registered
 * mapping is absorbed: the first one replaces the whole mapping, once, by
 * private zero memory (page by page, faults on distinct pages would split
 * it until vm.max_map_count runs out), the mapping is flagged, and
 * notify_fd (an eventfd) is written so the control thread marks the device
 * broken and stops its queues (see vhd_mem_faulted). The access that
 * faulted then completes on zero memory; the device reads zeros and its
 * writes go nowhere, which is harmless because the front-end destroyed that
 * memory itself (and the device is broken). Any other SIGBUS gets the
 * previous disposition.
 *
 * Threading: add/remove are control-thread calls (one thread at a time);
 * the handler runs in any thread and only reads the registry, with
 * acquire/release ordering, and stays async-signal-safe (mmap, write).
 */
#ifndef VHD_MEMGUARD_H
#define VHD_MEMGUARD_H

#include <stdbool.h>
#include <stddef.h>

/* Registry capacity (live mappings in the whole process). */
#define VHD_MEMGUARD_MAX 16384

/*
 * vhd_memguard_install - install the process-wide SIGBUS handler. notify_fd
 * (an eventfd, or -1) is written with 1 after each absorbed fault; a later
 * call replaces it. Returns 0 or -errno.
 */
int vhd_memguard_install(int notify_fd);

/* vhd_memguard_uninstall - restore the disposition found by the first install. */
void vhd_memguard_uninstall(void);

/*
 * vhd_memguard_add - register [base, base+len), mapped in units of page bytes
 * (a power of two; the huge page size for hugetlbfs). Returns a slot >= 0,
 * or -ENOSPC when the registry is full, -ENOMEM.
 */
int vhd_memguard_add(void *base, size_t len, size_t page);

/* vhd_memguard_remove - forget a slot before its mapping is unmapped. -1 is fine. */
void vhd_memguard_remove(int slot);

/* vhd_memguard_faulted - has a SIGBUS been absorbed in this slot's mapping? */
bool vhd_memguard_faulted(int slot);

/* Faults absorbed since start (tests and diagnostics). */
unsigned long vhd_memguard_faults(void);

#endif /* VHD_MEMGUARD_H */
