/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Device IOTLB (see iotlb.h): a persistent treap of non-overlapping IOVA
 * intervals. A change copies the O(log n) nodes on the paths it touches and
 * publishes a new version; older versions share every other node and are
 * freed once no reader's hazard slot holds them.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "iotlb.h"

/*
 * Nodes. A node reachable from a published version is never written again
 * except for refs, which only the control thread touches (readers never
 * read it). The builder may write a node only while it holds the sole
 * reference (refs == 1 and not part of a published version: a published
 * version holds its own reference to every node it reaches), which is what
 * unshare() guarantees.
 */
struct vhd_iotlb_node {
    struct vhd_iotlb_ent e;
    struct vhd_iotlb_node *l, *r; /* iova below / above e.iova */
    uint64_t prio;                /* heap order: a parent's prio >= its children's */
    uint32_t refs;                /* parents and version roots holding it */
    uint32_t cnt;                 /* entries in this subtree */
    uint32_t h;                   /* height of this subtree (a leaf: 1) */
};

/* Builder state of one change: the node reserve, so a change never fails halfway. */
struct build {
    struct vhd_iotlb *t;
    struct vhd_iotlb_node *pool; /* free nodes, linked through l */
    uint32_t npool;
};

static uint64_t mix64(uint64_t x)
{
    /* splitmix64 finaliser: a bijection, so distinct iovas get distinct priorities */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static uint32_t h_of(const struct vhd_iotlb_node *n)
{
    return n ? n->h : 0;
}

static uint32_t cnt_of(const struct vhd_iotlb_node *n)
{
    return n ? n->cnt : 0;
}

static void fix(struct vhd_iotlb_node *n)
{
    uint32_t hl = h_of(n->l), hr = h_of(n->r);
    n->h = 1 + (hl > hr ? hl : hr);
    n->cnt = 1 + cnt_of(n->l) + cnt_of(n->r);
}

/* Make sure the pool holds at least need nodes. 0 or -ENOMEM (pool kept). */
static int reserve(struct build *b, uint64_t need)
{
    while (b->npool < need) {
        struct vhd_iotlb_node *n = malloc(sizeof(*n));
        if (!n)
            return -ENOMEM;
        n->l = b->pool;
        b->pool = n;
        b->npool++;
    }
    return 0;
}

/* A node from the reserve (reserve() guaranteed enough: never NULL). */
static struct vhd_iotlb_node *take(struct build *b)
{
    struct vhd_iotlb_node *n = b->pool;
    b->pool = n->l;
    b->npool--;
    return n;
}

/*
 * Spare nodes kept for the next change (each 80 bytes): a change reserves
 * about 12 times the tree's height and uses a few; keeping the rest saves
 * hundreds of malloc/free pairs per UPDATE.
 */
#define POOL_KEEP 2048u

static void build_begin(struct build *b, struct vhd_iotlb *t)
{
    b->t = t;
    b->pool = t->pool;
    b->npool = t->npool;
    t->pool = NULL;
    t->npool = 0;
}

static void build_end(struct build *b)
{
    while (b->pool && b->npool > POOL_KEEP) {
        struct vhd_iotlb_node *n = b->pool;
        b->pool = n->l;
        b->npool--;
        free(n);
    }
    b->t->pool = b->pool;
    b->t->npool = b->npool;
    b->pool = NULL;
    b->npool = 0;
}

static void node_ref(struct vhd_iotlb_node *n)
{
    if (n)
        n->refs++;
}

/* Drop one reference; free the subtree parts nobody else holds. */
static void node_unref(struct vhd_iotlb_node *n)
{
    while (n && --n->refs == 0) {
        struct vhd_iotlb_node *r = n->r;
        node_unref(n->l); /* recursion depth: the tree's height */
        free(n);
        n = r;
    }
}

static struct vhd_iotlb_node *node_new(struct build *b, const struct vhd_iotlb_ent *e)
{
    struct vhd_iotlb_node *n = take(b);

    n->e = *e;
    n->l = n->r = NULL;
    n->prio = mix64(e->iova ^ b->t->seed);
    n->refs = 1;
    fix(n);
    return n;
}

/*
 * The caller holds one reference to n; returns a node it may write, with
 * the same content: n itself when that reference is the only one, else a
 * copy (children shared, one reference each) and n's count dropped.
 */
static struct vhd_iotlb_node *unshare(struct build *b, struct vhd_iotlb_node *n)
{
    if (n->refs == 1)
        return n;
    struct vhd_iotlb_node *m = take(b);
    *m = *n;
    m->refs = 1;
    node_ref(m->l);
    node_ref(m->r);
    n->refs--;
    return m;
}

/*
 * Split owned tree n into *l (entries with iova < key) and *r (the rest),
 * both owned. Copies at most height(n) nodes.
 */
static void split(struct build *b, struct vhd_iotlb_node *n, uint64_t key,
                  struct vhd_iotlb_node **l, struct vhd_iotlb_node **r)
{
    if (!n) {
        *l = *r = NULL;
        return;
    }
    n = unshare(b, n);
    if (n->e.iova < key) {
        split(b, n->r, key, &n->r, r);
        *l = n;
    } else {
        split(b, n->l, key, l, &n->l);
        *r = n;
    }
    fix(n);
}

/* Join owned trees a and b (every key of a below every key of b); owned result. */
static struct vhd_iotlb_node *merge(struct build *b, struct vhd_iotlb_node *x,
                                    struct vhd_iotlb_node *y)
{
    if (!x)
        return y;
    if (!y)
        return x;
    if (x->prio >= y->prio) {
        x = unshare(b, x);
        x->r = merge(b, x->r, y);
        fix(x);
        return x;
    }
    y = unshare(b, y);
    y->l = merge(b, x, y->l);
    fix(y);
    return y;
}

/* The part of e from IOVA x (inside e) to its end. */
static struct vhd_iotlb_ent ent_from(const struct vhd_iotlb_ent *e, uint64_t x)
{
    struct vhd_iotlb_ent p = *e;
    uint64_t off = x - e->iova;

    p.iova = x;
    p.size = e->size - off;
    p.hva = e->hva + off;
    p.gpa = e->gpa + off;
    return p;
}

/* Does the last entry of n run past key? (every entry of n starts below key) */
static bool max_crosses(const struct vhd_iotlb_node *n, uint64_t key)
{
    if (!n)
        return false;
    while (n->r)
        n = n->r;
    return n->e.size > key - n->e.iova;
}

/* Cut the last entry of owned n at key: it ends there, *tail gets the rest. */
static struct vhd_iotlb_node *trim_max(struct build *b, struct vhd_iotlb_node *n, uint64_t key,
                                       struct vhd_iotlb_ent *tail)
{
    n = unshare(b, n);
    if (n->r) {
        n->r = trim_max(b, n->r, key, tail);
    } else {
        *tail = ent_from(&n->e, key);
        n->e.size = key - n->e.iova;
    }
    fix(n);
    return n;
}

/* Nodes a cut may copy, for a tree of height h (see cut()). */
static uint64_t cut_need(uint32_t h)
{
    return 12ull * (h + 2);
}

/*
 * Remove [a, a + size) (to_end, or a + size == 2^64: [a, 2^64)) from owned
 * tree *root. Returns
 * whether anything was removed. The pool must hold cut_need(height) nodes:
 * two splits and two trims copy a path each, the two merges at most the sum
 * of their inputs' heights, plus one new node.
 */
static bool cut(struct build *b, struct vhd_iotlb_node **root, uint32_t *n, uint64_t a,
                uint64_t size, bool to_end)
{
    struct vhd_iotlb_node *l, *mid, *r2 = NULL, *keep = NULL;
    struct vhd_iotlb_ent tail, tail2;
    bool has_tail = false, removed = false;

    split(b, *root, a, &l, &mid);
    if (max_crosses(l, a)) {
        l = trim_max(b, l, a, &tail);
        has_tail = true;
        removed = true;
    }
    /* a range ending exactly at 2^64 (a + size wraps to 0) runs to the end too */
    if (!to_end && a + size != 0) {
        uint64_t end = a + size;
        split(b, mid, end, &mid, &r2);
        if (max_crosses(mid, end)) {
            mid = trim_max(b, mid, end, &tail2);
            keep = node_new(b, &tail2); /* tail2 starts at end */
        } else if (has_tail && tail.size > size) {
            /* an entry covering the whole range: keep its part beyond it */
            struct vhd_iotlb_ent rest = ent_from(&tail, end);
            keep = node_new(b, &rest);
        }
    }
    if (mid) {
        removed = true;
        *n -= mid->cnt;
    }
    node_unref(mid);
    if (keep)
        (*n)++;
    *root = merge(b, merge(b, l, keep), r2);
    return removed;
}

/* Insert e into owned *root, where nothing overlaps it. Pool: 6 * (height + 2). */
static void insert(struct build *b, struct vhd_iotlb_node **root, const struct vhd_iotlb_ent *e)
{
    struct vhd_iotlb_node *l, *r;

    split(b, *root, e->iova, &l, &r);
    *root = merge(b, merge(b, l, node_new(b, e)), r);
}

/* ---- versions ---- */

static struct vhd_iotlb_ver *ver_new(void)
{
    return calloc(1, sizeof(struct vhd_iotlb_ver));
}

static void ver_free(struct vhd_iotlb_ver *v)
{
    node_unref((struct vhd_iotlb_node *)v->root);
    free(v);
}

int vhd_iotlb_new(uint32_t nslots, struct vhd_iotlb **out)
{
    struct vhd_iotlb *t;

    if (nslots == 0)
        return -EINVAL;
    t = calloc(1, sizeof(*t));
    if (!t)
        return -ENOMEM;
    t->max_entries = VHD_IOTLB_MAX_ENTRIES;
    t->slots = aligned_alloc(VHD_CACHELINE, (size_t)nslots * sizeof(*t->slots));
    struct vhd_iotlb_ver *v = ver_new();
    if (!t->slots || !v) {
        free(t->slots);
        free(v);
        free(t);
        return -ENOMEM;
    }
    memset(t->slots, 0, (size_t)nslots * sizeof(*t->slots));
    t->nslots = nslots;
    /*
     * The seed only has to be unknown to the front-end (so it cannot build a
     * degenerate tree): the clock's nanoseconds and the heap address (ASLR).
     * Not getrandom(): the daemon's seccomp filter has no reason to allow it.
     */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    t->seed = mix64((uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)(uintptr_t)t);
    t->cur = v;
    *out = t;
    return 0;
}

uint32_t vhd_iotlb_reclaim(struct vhd_iotlb *t)
{
    struct vhd_iotlb_ver **pp = &t->retired;
    uint32_t waiting = 0;

    while (*pp) {
        struct vhd_iotlb_ver *v = *pp;
        bool held = false;
        for (uint32_t i = 0; i < t->nslots && !held; i++)
            held = vhd_load_acquire(&t->slots[i].hz) == v;
        if (held) {
            pp = &v->next;
            waiting++;
            continue;
        }
        *pp = v->next;
        ver_free(v);
    }
    return waiting;
}

void vhd_iotlb_free(struct vhd_iotlb *t)
{
    if (!t)
        return;
    while (t->retired) {
        struct vhd_iotlb_ver *v = t->retired;
        t->retired = v->next;
        ver_free(v);
    }
    ver_free((struct vhd_iotlb_ver *)t->cur);
    while (t->pool) {
        struct vhd_iotlb_node *n = t->pool;
        t->pool = n->l;
        free(n);
    }
    free(t->slots);
    free(t);
}

uint32_t vhd_iotlb_count(const struct vhd_iotlb *t)
{
    return vhd_load_relaxed(&t->cur)->n;
}

uint32_t vhd_iotlb_height(const struct vhd_iotlb *t)
{
    return h_of(vhd_load_relaxed(&t->cur)->root);
}

/* Start a change: an owned copy of the published root. */
static struct vhd_iotlb_node *begin(struct vhd_iotlb *t, uint32_t *n)
{
    const struct vhd_iotlb_ver *cur = t->cur;
    struct vhd_iotlb_node *root = (struct vhd_iotlb_node *)cur->root;

    node_ref(root);
    *n = cur->n;
    return root;
}

/*
 * Publish root (owned) as the new version v: release store, then a full
 * fence before reclaim looks at the hazard slots (pairs with the fence in
 * vhd_iotlb_enter). The old version is retired.
 */
static void publish(struct vhd_iotlb *t, struct vhd_iotlb_ver *v, struct vhd_iotlb_node *root,
                    uint32_t n)
{
    struct vhd_iotlb_ver *old = (struct vhd_iotlb_ver *)t->cur;

    v->root = root;
    v->n = n;
    vhd_store_release(&t->cur, (const struct vhd_iotlb_ver *)v);
    vhd_smp_mb();
    old->next = t->retired;
    t->retired = old;
    t->changes++;
    vhd_iotlb_reclaim(t);
}

/*
 * Does every published translation overlapping [iova, iova + size) stay
 * what a reader may have cached once uva/perm map the range: the same host
 * address and region at each byte, and no permission taken away? (Only
 * coverage or permission is added: no quiescence needed.) The UVA range was
 * checked to lie in regions. An old entry lies in one region, contiguous in
 * host memory, so agreeing at its first overlapped byte agrees throughout.
 */
static bool update_keeps(const struct vhd_iotlb *t, const struct vhd_mem *mem, uint64_t iova,
                         uint64_t size, uint64_t uva, uint8_t perm)
{
    const struct vhd_iotlb_ver *v = t->cur;
    struct vhd_iotlb_ent e;
    uint64_t x = iova, last = iova + (size - 1);

    while (vhd_iotlb_next(v, x, &e) == 0 && e.iova <= last) {
        uint64_t from = e.iova > x ? e.iova : x, off = from - iova;
        int i = vhd_mem__find_uva(mem, uva + off);
        if (i < 0 || (uint32_t)i != e.region || (e.perm & ~perm))
            return false;
        const struct vhd_mem_region *r = &mem->regions[i];
        if (r->hva + (uva + off - r->uva) != e.hva + (from - e.iova))
            return false;
        uint64_t e_last = e.iova + (e.size - 1);
        if (e_last >= last)
            break;
        x = e_last + 1;
    }
    return true;
}

int vhd_iotlb_update(struct vhd_iotlb *t, const struct vhd_mem *mem, uint64_t iova, uint64_t size,
                     uint64_t uva, uint8_t perm)
{
    struct build b;
    struct vhd_iotlb_ver *v;
    struct vhd_iotlb_node *root;
    uint32_t n;
    bool replaced;
    int rc = -ENOMEM;

    if (size == 0 || size - 1 > UINT64_MAX - iova || size - 1 > UINT64_MAX - uva)
        return -EINVAL;
    if (perm == 0 || (perm & ~VHD_IOTLB_RW))
        return -EINVAL;
    /* Every byte must lie in a region; pieces are in distinct regions, so <= nregions. */
    uint32_t pieces = 0;
    for (uint64_t x = uva, rem = size; rem;) {
        int i = mem ? vhd_mem__find_uva(mem, x) : -1;
        if (i < 0)
            return -EFAULT;
        const struct vhd_mem_region *r = &mem->regions[i];
        uint64_t off = x - r->uva, take = r->size - off < rem ? r->size - off : rem;
        rem -= take;
        x += take; /* may reach 2^64 only with rem == 0 */
        pieces++;
    }

    bool keeps = update_keeps(t, mem, iova, size, uva, perm);

    v = ver_new();
    if (!v)
        return -ENOMEM;
    build_begin(&b, t);
    root = begin(t, &n);
    if (reserve(&b, cut_need(h_of(root))) < 0)
        goto fail;
    replaced = cut(&b, &root, &n, iova, size, false) && !keeps;
    if (n > t->max_entries || pieces > t->max_entries - n) { /* after the cut: overwrites fit */
        rc = -ENOSPC;
        goto fail;
    }
    uint64_t done = 0;
    for (uint32_t k = 0; k < pieces; k++) {
        int i = vhd_mem__find_uva(mem, uva + done);
        const struct vhd_mem_region *r = &mem->regions[i];
        uint64_t off = uva + done - r->uva;
        uint64_t take = r->size - off < size - done ? r->size - off : size - done;
        struct vhd_iotlb_ent e = {
            .iova = iova + done,
            .size = take,
            .hva = r->hva + off,
            .gpa = r->gpa + off,
            .region = (uint32_t)i,
            .perm = perm,
        };
        if (reserve(&b, 6ull * (h_of(root) + 3)) < 0)
            goto fail;
        insert(&b, &root, &e);
        n++;
        done += take;
    }
    publish(t, v, root, n);
    build_end(&b);
    return replaced ? 1 : 0;

fail:
    node_unref(root);
    build_end(&b);
    free(v);
    return rc;
}

int vhd_iotlb_invalidate(struct vhd_iotlb *t, uint64_t iova, uint64_t size)
{
    struct build b;
    struct vhd_iotlb_ver *v;
    struct vhd_iotlb_node *root;
    uint32_t n;

    if (size == 0)
        return 0;
    v = ver_new();
    if (!v)
        return -ENOMEM;
    build_begin(&b, t);
    root = begin(t, &n);
    if (reserve(&b, cut_need(h_of(root))) < 0) {
        node_unref(root);
        build_end(&b);
        free(v);
        return -ENOMEM;
    }
    bool to_end = size - 1 > UINT64_MAX - iova;
    if (!cut(&b, &root, &n, iova, size, to_end)) {
        /* nothing mapped there: keep the published version, publish nothing */
        node_unref(root);
        build_end(&b);
        free(v);
        return 0;
    }
    publish(t, v, root, n);
    build_end(&b);
    return 1;
}

int vhd_iotlb_flush(struct vhd_iotlb *t)
{
    if (t->cur->n == 0)
        return 0;
    struct vhd_iotlb_ver *v = ver_new();
    if (!v)
        return -ENOMEM;
    publish(t, v, NULL, 0);
    return 1;
}

/* ---- lookups (any thread holding the version) ---- */

int vhd_iotlb_lookup(const struct vhd_iotlb_ver *v, uint64_t iova, struct vhd_iotlb_ent *e)
{
    const struct vhd_iotlb_node *n = v->root, *best = NULL;

    while (n) {
        if (iova < n->e.iova) {
            n = n->l;
        } else {
            best = n;
            n = n->r;
        }
    }
    if (!best || iova - best->e.iova >= best->e.size)
        return -ENOENT;
    *e = best->e;
    return 0;
}

int vhd_iotlb_next(const struct vhd_iotlb_ver *v, uint64_t iova, struct vhd_iotlb_ent *e)
{
    const struct vhd_iotlb_node *n = v->root, *succ = NULL;

    if (vhd_iotlb_lookup(v, iova, e) == 0)
        return 0;
    while (n) {
        if (n->e.iova > iova) {
            succ = n;
            n = n->l;
        } else {
            n = n->r;
        }
    }
    if (!succ)
        return -ENOENT;
    *e = succ->e;
    return 0;
}

int vhd_iotlb_to_iov(const struct vhd_iotlb_ver *v, uint64_t iova, uint64_t len, uint8_t perm,
                     struct iovec *iov, uint32_t max_iov, uint64_t *miss)
{
    uint32_t cnt = 0, last_region = 0;
    uint64_t x = iova, rem = len;

    if (len == 0)
        return 0;
    if (len - 1 > UINT64_MAX - iova)
        return -EOVERFLOW;
    while (rem) {
        struct vhd_iotlb_ent e;
        if (vhd_iotlb_lookup(v, x, &e) < 0) {
            *miss = x;
            return -EFAULT;
        }
        if ((e.perm & perm) != perm)
            return -EACCES;
        uint64_t off = x - e.iova;
        uint64_t take = e.size - off < rem ? e.size - off : rem;
        uint8_t *p = e.hva + off;
        if (cnt && last_region == e.region &&
            (uint8_t *)iov[cnt - 1].iov_base + iov[cnt - 1].iov_len == p) {
            iov[cnt - 1].iov_len += take;
        } else {
            if (cnt == max_iov)
                return -ENOBUFS;
            iov[cnt].iov_base = p;
            iov[cnt].iov_len = take;
            cnt++;
            last_region = e.region;
        }
        rem -= take;
        x += take; /* wraps to 0 only when rem is 0 */
    }
    return (int)cnt;
}

int vhd_iotlb_to_hva(const struct vhd_iotlb_ver *v, uint64_t iova, uint64_t len, uint8_t perm,
                     void **hva, uint64_t *miss)
{
    struct iovec seg;
    int rc = vhd_iotlb_to_iov(v, iova, len ? len : 1, perm, &seg, 1, miss);

    if (rc == -ENOBUFS)
        return -ENXIO;
    if (rc < 0)
        return rc;
    *hva = seg.iov_base;
    return 0;
}
