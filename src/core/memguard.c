/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SIGBUS guard for guest-memory mappings (see memguard.h).
 *
 * The registry is a two-level table: VHD_MEMGUARD_MAX / CHUNK chunk
 * pointers, each chunk allocated on first use and never freed, so the
 * handler can walk it without locks while the control thread adds and
 * removes entries. An entry is live while start != 0; the control thread
 * fills len/page/faulted first and publishes start with a release store.
 */
#include "memguard.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CHUNK   256
#define NCHUNKS (VHD_MEMGUARD_MAX / CHUNK)

struct guard_entry {
    uintptr_t start; /* 0: free */
    size_t len;
    size_t page;
    int faulted;  /* a fault was absorbed here */
    int claimed;  /* a handler is replacing the mapping (taken with a CAS) */
    int replaced; /* the whole mapping is private zero memory now */
};

static struct guard_entry *g_chunks[NCHUNKS];
static int g_notify_fd = -1;
static unsigned long g_faults;
static volatile sig_atomic_t g_installed; /* also cleared by the handler */
static struct sigaction g_old;

static struct guard_entry *entry_of(int slot)
{
    if (slot < 0 || slot >= VHD_MEMGUARD_MAX)
        return NULL;
    struct guard_entry *c = __atomic_load_n(&g_chunks[slot / CHUNK], __ATOMIC_ACQUIRE);
    return c ? &c[slot % CHUNK] : NULL;
}

/*
 * Replace the page(s) around addr in entry e by private zero memory (the
 * fallback when the whole mapping cannot be replaced).
 */
static bool absorb_page(struct guard_entry *e, uintptr_t addr)
{
    uintptr_t start = e->start;
    uintptr_t page_start = addr & ~(uintptr_t)(e->page - 1);
    size_t len = e->page;

    /* Never reach outside the registered mapping (its ends are page-aligned). */
    if (page_start < start)
        page_start = start;
    if (page_start + len > start + e->len)
        len = start + e->len - page_start;
    void *p = mmap((void *)page_start, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    return p != MAP_FAILED;
}

/*
 * Absorb a fault at addr in e. The first fault replaces the whole mapping,
 * once: a front-end that truncated one page may have truncated them all,
 * and a page-by-page replacement splits the mapping at each fault (a
 * private page between two shared ones is three mappings), so tens of
 * thousands of faults on distinct pages would exhaust vm.max_map_count and
 * the mmap of the next one would fail, which kills us. The whole range
 * replaced is one mapping again, and nothing in it can fault any more.
 * MAP_NORESERVE: zero pages never touched cost nothing. Only when that is
 * refused (strict overcommit on a large region) does the faulting page
 * alone get replaced.
 *
 * Several threads may fault in e at once: the one that wins the claim
 * replaces, the others return and their access faults again until the
 * replacement is in place. Returns 1 when this call mapped something (a
 * fault to count and report), 0 when the access is just to be retried,
 * -1 when nothing could be mapped.
 */
static int absorb(struct guard_entry *e, uintptr_t addr)
{
    int zero = 0;

    if (__atomic_load_n(&e->replaced, __ATOMIC_ACQUIRE))
        return 0; /* a fault from before the replacement, retried */
    if (!__atomic_compare_exchange_n(&e->claimed, &zero, 1, false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE))
        return 0; /* another thread is replacing it: fault again until it is done */
    int rc = 1;
    void *p = mmap((void *)e->start, e->len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
        /* Zeros have no place in a core dump either (best effort). */
        (void)madvise(p, e->len, MADV_DONTDUMP);
        __atomic_store_n(&e->replaced, 1, __ATOMIC_RELEASE);
    } else {
        rc = absorb_page(e, addr) ? 1 : -1;
        __atomic_store_n(&e->claimed, 0, __ATOMIC_RELEASE);
    }
    return rc;
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    int saved_errno = errno;
    uintptr_t addr = (uintptr_t)si->si_addr;

    (void)uc;
    if (si->si_code == BUS_ADRERR) {
        for (int c = 0; c < NCHUNKS; c++) {
            struct guard_entry *chunk = __atomic_load_n(&g_chunks[c], __ATOMIC_ACQUIRE);
            if (!chunk)
                break; /* chunks are allocated in order */
            for (int i = 0; i < CHUNK; i++) {
                struct guard_entry *e = &chunk[i];
                uintptr_t start = __atomic_load_n(&e->start, __ATOMIC_ACQUIRE);
                if (!start || addr - start >= e->len)
                    continue;
                int rc = absorb(e, addr);
                if (rc < 0)
                    goto not_ours;
                if (rc == 0) {
                    errno = saved_errno;
                    return;
                }
                __atomic_store_n(&e->faulted, 1, __ATOMIC_RELEASE);
                __atomic_add_fetch(&g_faults, 1, __ATOMIC_RELAXED); /* fault path, not datapath */
                int fd = __atomic_load_n(&g_notify_fd, __ATOMIC_RELAXED);
                if (fd >= 0) {
                    uint64_t one = 1;
                    if (write(fd, &one, sizeof(one)) < 0) {
                        /* EAGAIN: already signalled. */
                    }
                }
                errno = saved_errno;
                return;
            }
        }
    }
not_ours:
    /*
     * Not a guest-memory fault: put the previous disposition back. A fault
     * then happens again when we return and gets it (default: die with
     * SIGBUS, or a sanitizer's report); a SIGBUS another process sent
     * (si_code <= 0: kill, sigqueue, tgkill) repeats nothing, so it is
     * raised again here.
     */
    sigaction(sig, &g_old, NULL);
    g_installed = false;
    if (si->si_code <= 0)
        raise(sig);
    errno = saved_errno;
}

int vhd_memguard_install(int notify_fd)
{
    __atomic_store_n(&g_notify_fd, notify_fd, __ATOMIC_RELAXED);
    if (g_installed)
        return 0;

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, &g_old) < 0)
        return -errno;
    g_installed = true;
    return 0;
}

void vhd_memguard_uninstall(void)
{
    if (!g_installed)
        return;
    sigaction(SIGBUS, &g_old, NULL);
    g_installed = false;
    __atomic_store_n(&g_notify_fd, -1, __ATOMIC_RELAXED);
}

int vhd_memguard_add(void *base, size_t len, size_t page)
{
    if (!base || !len || !page || (page & (page - 1)))
        return -EINVAL;
    for (int c = 0; c < NCHUNKS; c++) {
        struct guard_entry *chunk = g_chunks[c];
        if (!chunk) {
            chunk = calloc(CHUNK, sizeof(*chunk));
            if (!chunk)
                return -ENOMEM;
            __atomic_store_n(&g_chunks[c], chunk, __ATOMIC_RELEASE);
        }
        for (int i = 0; i < CHUNK; i++) {
            struct guard_entry *e = &chunk[i];
            if (e->start)
                continue;
            e->len = len;
            e->page = page;
            __atomic_store_n(&e->faulted, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&e->claimed, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&e->replaced, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&e->start, (uintptr_t)base, __ATOMIC_RELEASE);
            return c * CHUNK + i;
        }
    }
    return -ENOSPC;
}

void vhd_memguard_remove(int slot)
{
    struct guard_entry *e = entry_of(slot);

    if (e)
        __atomic_store_n(&e->start, 0, __ATOMIC_RELEASE);
}

bool vhd_memguard_faulted(int slot)
{
    struct guard_entry *e = entry_of(slot);

    return e && __atomic_load_n(&e->faulted, __ATOMIC_ACQUIRE);
}

unsigned long vhd_memguard_faults(void)
{
    return __atomic_load_n(&g_faults, __ATOMIC_RELAXED);
}
