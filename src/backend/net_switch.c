/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The "switch" packet backend: an in-process L2 learning switch between the
 * net devices of one daemon that name the same switch (VM to VM on one
 * host). A frame crosses from the sender's transmit worker to the worker
 * owning the receiver's receive queue through a single-producer /
 * single-consumer ring, so no lock and no atomic read-modify-write is on
 * the path; MAC learning with ageing, flooding of broadcast, multicast and
 * unknown unicast, per-port counters.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "util/compiler.h"
#include "util/iov.h"
#include "net_backend.h"
#include "net_switch.h"
#include "runtime/log.h"

/*
 * Slots per ring (a power of two). 256 frames is a few bursts of the
 * runtime's default budget (64) of headroom for a receiver that is busy
 * elsewhere, at about 400 KiB per ring.
 */
#define SW_RING_SLOTS 256u

/* Frames taken from a ring and handed to the receive queue at once (vhd_net_deliver_burst). */
#define SW_RX_BURST 32u

/*
 * MAC table entries (a power of two), direct-mapped: a MAC lives in the one
 * slot its hash names, and a colliding MAC evicts it (its frames are then
 * flooded until it is learned again). Far above the handful of guests a
 * switch serves, so collisions are rare; in exchange a lookup is one load
 * and learning one store, with no probing and no lock.
 */
#define SW_MAC_SLOTS 4096u

/*
 * A learned entry is rewritten at most once a second while its MAC keeps
 * sending from the same port, so a busy sender does not keep writing a
 * cache line every worker reads.
 */
#define SW_REFRESH_S 1u

/* One frame in a ring: the sender's virtio header and a copy of the frame. */
struct sw_slot {
    struct virtio_net_hdr_v1 hdr;
    uint32_t len;
    uint8_t data[VHD_NET_SWITCH_FRAME_MAX];
};

/*
 * A single-producer / single-consumer ring from one queue pair of one port
 * (the producer: that pair's worker) to one destination port, drained by
 * the destination's pair (src_pair % dst pairs) on its worker. prod and
 * cons run freely (wrapping uint32); prod - cons slots are full. The
 * producer publishes a slot with a release store of prod, the consumer
 * frees it with a release store of cons; each loads the other's index with
 * acquire. Each index on its own cache line.
 */
struct sw_ring {
    uint32_t prod vhd_cacheline_aligned;
    uint32_t cons vhd_cacheline_aligned;
    struct sw_slot *slots;
};

/* Counters of one queue pair of a port; each field has one writer (relaxed stores). */
struct sw_pair_stats {
    /* written by the pair's transmit worker */
    uint64_t in_frames, in_bytes, flooded, in_drops;
    /* written by the pair's receive worker */
    uint64_t out_frames, out_bytes, out_drops;
} vhd_cacheline_aligned;

struct vhd_switch;

/* A port: one net device on the switch. The backend head comes first. */
struct sw_port {
    struct vhd_net_backend be;
    struct vhd_switch *sw;
    unsigned idx;   /* slot in sw->ports */
    uint32_t pairs; /* the device's queue pairs */
    /*
     * Doorbells, one eventfd per pair: a producer that finds the ring to
     * this port empty writes the receiving pair's eventfd, which the
     * runtime watches for that receive queue (queue_wake_fd), so an idle
     * receiver wakes up and drains.
     */
    int *wake_fd;
    /*
     * Incoming rings: in[s] is an array of the rings from port s, one per
     * pair of s (NULL until s joined). Written once by the control thread
     * (release), read by this port's receive workers (acquire).
     */
    struct sw_ring *in[VHD_NET_SWITCH_MAX_PORTS];
    struct sw_pair_stats *st; /* per pair */
};

/* A learned MAC: key = mac << 8 | (port + 1) (0: empty); seen in switch seconds. */
struct sw_mac {
    uint64_t key;
    uint32_t seen;
};

/*
 * A switch. Control thread: joins and leaves under sw_lock. Workers: ports[]
 * (acquire loads) and the MAC table (relaxed loads and stores; several
 * workers may learn into one slot, the last store wins, which costs at most
 * a flood).
 */
struct vhd_switch {
    struct vhd_switch *next; /* sw_list */
    char name[32];
    struct sw_port *ports[VHD_NET_SWITCH_MAX_PORTS]; /* live ports (NULL: free or left) */
    struct sw_port *all[VHD_NET_SWITCH_MAX_PORTS];   /* every port that ever joined */
    unsigned nall;                                   /* slots used */
    unsigned nlive; /* ports still open: the switch is freed when it drops to 0 */
    struct sw_mac mac[SW_MAC_SLOTS];
};

static pthread_mutex_t sw_lock = PTHREAD_MUTEX_INITIALIZER;
static struct vhd_switch *sw_list; /* under sw_lock */
static uint32_t sw_time_offset;    /* test hook: seconds added to the clock */

void vhd_net_switch_test_advance(uint32_t seconds)
{
    vhd_store_relaxed(&sw_time_offset, vhd_load_relaxed(&sw_time_offset) + seconds);
}

/* The switch clock in seconds (monotonic, coarse: ageing needs no more). */
static uint32_t sw_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint32_t)ts.tv_sec + vhd_load_relaxed(&sw_time_offset);
}

static uint64_t mac_key(const uint8_t *m)
{
    uint64_t v = 0;
    for (int i = 0; i < 6; i++)
        v = v << 8 | m[i];
    return v;
}

static unsigned mac_hash(uint64_t mac)
{
    uint64_t h =
        mac * 0x9e3779b97f4a7c15ull; /* Fibonacci hashing: the top bits mix all six bytes */
    return (unsigned)(h >> 52) & (SW_MAC_SLOTS - 1);
}

/* The port mac was learned on and not aged out, or -1. */
static int mac_lookup(struct vhd_switch *sw, uint64_t mac, uint32_t now)
{
    struct sw_mac *e = &sw->mac[mac_hash(mac)];
    uint64_t key = vhd_load_relaxed(&e->key);
    if (key == 0 || key >> 8 != mac)
        return -1;
    if (now - vhd_load_relaxed(&e->seen) > VHD_NET_SWITCH_AGEING_S)
        return -1;
    return (int)(key & 0xff) - 1;
}

static void mac_learn(struct vhd_switch *sw, uint64_t mac, unsigned port, uint32_t now)
{
    struct sw_mac *e = &sw->mac[mac_hash(mac)];
    uint64_t key = mac << 8 | (port + 1);
    if (vhd_load_relaxed(&e->key) != key) {
        vhd_store_relaxed(&e->seen, now);
        vhd_store_relaxed(&e->key, key);
    } else if (now - vhd_load_relaxed(&e->seen) >= SW_REFRESH_S) {
        vhd_store_relaxed(&e->seen, now);
    }
}

/* ---- the datapath ---- */

/*
 * Put f into the ring from (src, pair) to dst and ring dst's doorbell when
 * the receiver may be idle. Returns 0, or -ENOBUFS when the ring is full.
 *
 * The doorbell: write the receiving pair's eventfd when the consumer had
 * already taken everything before this frame (cons == our slot's index).
 * The store of prod, a full fence, then the load of cons here pair with
 * the consumer's store of cons, full fence, load of prod (sw_rx_poll):
 * either we see it caught up and ring, or it sees our frame before it
 * stops draining. No frame waits for an unrelated wake-up.
 */
static int sw_push(struct sw_port *src, uint16_t pair, struct sw_port *dst,
                   const struct vhd_net_frame *f)
{
    struct sw_ring *r = &vhd_load_acquire(&dst->in[src->idx])[pair];
    uint32_t prod = r->prod; /* only we write it */
    if (prod - vhd_load_acquire(&r->cons) >= SW_RING_SLOTS)
        return -ENOBUFS;
    struct sw_slot *s = &r->slots[prod & (SW_RING_SLOTS - 1)];
    s->hdr = f->hdr;
    s->len = f->len;
    (void)vhd_iov_to_buf(f->iov, f->iovcnt, f->off, s->data, f->len);
    vhd_store_release(&r->prod, prod + 1);
    vhd_smp_mb();
    if (vhd_load_relaxed(&r->cons) == prod)
        (void)eventfd_write(dst->wake_fd[pair % dst->pairs], 1);
    return 0;
}

static int sw_tx(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                 const struct vhd_net_frame *f)
{
    struct sw_port *p = (struct sw_port *)be;
    struct vhd_switch *sw = p->sw;
    struct sw_pair_stats *st = &p->st[pair];
    uint8_t eth[12];
    (void)self;

    vhd_store_relaxed(&st->in_frames, st->in_frames + 1);
    vhd_store_relaxed(&st->in_bytes, st->in_bytes + f->len);
    if (vhd_unlikely(f->len > VHD_NET_SWITCH_FRAME_MAX || f->len < sizeof(eth))) {
        vhd_store_relaxed(&st->in_drops, st->in_drops + 1);
        return -EMSGSIZE;
    }
    (void)vhd_iov_to_buf(f->iov, f->iovcnt, f->off, eth, sizeof(eth));
    uint32_t now = sw_now();
    /* Learn the source unless it is a group address (never a valid source). */
    if (!(eth[6] & 1))
        mac_learn(sw, mac_key(eth + 6), p->idx, now);

    int out = (eth[0] & 1) ? -1 : mac_lookup(sw, mac_key(eth), now);
    if (out >= 0) {
        struct sw_port *d = vhd_load_acquire(&sw->ports[out]);
        if (out == (int)p->idx)
            return 0; /* the destination is on the sender's side: filtered, as a bridge does */
        if (d) {
            if (sw_push(p, pair, d, f) == 0)
                return 0;
            vhd_store_relaxed(&st->in_drops, st->in_drops + 1);
            return -ENOBUFS;
        }
        /* The port left: flood (the entry will be relearned or age out). */
    }
    /* Broadcast, multicast, unknown unicast: every other live port. */
    vhd_store_relaxed(&st->flooded, st->flooded + 1);
    for (unsigned i = 0; i < VHD_NET_SWITCH_MAX_PORTS; i++) {
        struct sw_port *d = vhd_load_acquire(&sw->ports[i]);
        if (!d || d == p)
            continue;
        if (sw_push(p, pair, d, f) < 0)
            vhd_store_relaxed(&st->in_drops, st->in_drops + 1);
    }
    return 0;
}

/*
 * The receive queue of `pair` is being processed on self: drain the rings
 * that feed it (from every pair s of every port with s % pairs == pair)
 * into the guest. A frame the guest cannot take (no buffers) is dropped,
 * as a NIC does, and counted by the device and here. Returns frames taken
 * from the rings; budget means "maybe more" (the runtime comes back).
 */
static int sw_rx_poll(struct vhd_net_backend *be, uint16_t pair, struct vhd_worker *self,
                      unsigned budget)
{
    struct sw_port *p = (struct sw_port *)be;
    struct sw_pair_stats *st = &p->st[pair];
    struct iovec iov[SW_RX_BURST];
    struct vhd_net_frame f[SW_RX_BURST];
    int rc[SW_RX_BURST];
    unsigned n = 0;

    for (unsigned s = 0; s < VHD_NET_SWITCH_MAX_PORTS && n < budget; s++) {
        struct sw_ring *rings = vhd_load_acquire(&p->in[s]);
        if (!rings)
            continue;
        uint32_t spairs = p->sw->all[s]->pairs;
        for (uint32_t sp = pair; sp < spairs && n < budget; sp += p->pairs) {
            struct sw_ring *r = &rings[sp];
            uint32_t cons = r->cons; /* only we write it */
            for (;;) {
                uint32_t prod = vhd_load_acquire(&r->prod);
                if (prod == cons) {
                    /* Caught up: publish, fence, look again (see sw_push). */
                    vhd_store_release(&r->cons, cons);
                    vhd_smp_mb();
                    if (vhd_load_acquire(&r->prod) == cons)
                        break;
                    continue;
                }
                if (n == budget) {
                    vhd_store_release(&r->cons, cons);
                    break;
                }
                /* The slots published so far, as one receive burst. */
                unsigned k = prod - cons;
                if (k > budget - n)
                    k = budget - n;
                if (k > SW_RX_BURST)
                    k = SW_RX_BURST;
                for (unsigned i = 0; i < k; i++) {
                    struct sw_slot *slot = &r->slots[(cons + i) & (SW_RING_SLOTS - 1)];
                    iov[i].iov_base = slot->data;
                    iov[i].iov_len = slot->len;
                    f[i].hdr = slot->hdr;
                    f[i].iov = &iov[i];
                    f[i].iovcnt = 1;
                    f[i].off = 0;
                    f[i].len = slot->len;
                }
                (void)vhd_net_deliver_burst(be->dev, pair, self, f, k, 0, rc);
                uint64_t frames = 0, bytes = 0;
                for (unsigned i = 0; i < k; i++) {
                    frames += rc[i] == 0;
                    bytes += rc[i] == 0 ? f[i].len : 0;
                }
                vhd_store_relaxed(&st->out_frames, st->out_frames + frames);
                vhd_store_relaxed(&st->out_bytes, st->out_bytes + bytes);
                vhd_store_relaxed(&st->out_drops, st->out_drops + (k - frames));
                cons += k;
                n += k;
            }
        }
    }
    return (int)n;
}

/* ---- joining and leaving (control thread) ---- */

static struct sw_ring *rings_new(uint32_t n)
{
    struct sw_ring *r = aligned_alloc(VHD_CACHELINE, n * sizeof(*r));
    if (!r)
        return NULL;
    memset(r, 0, n * sizeof(*r));
    for (uint32_t i = 0; i < n; i++) {
        r[i].slots = calloc(SW_RING_SLOTS, sizeof(struct sw_slot));
        if (!r[i].slots) {
            while (i--)
                free(r[i].slots);
            free(r);
            return NULL;
        }
    }
    return r;
}

static void rings_free(struct sw_ring *r, uint32_t n)
{
    if (!r)
        return;
    for (uint32_t i = 0; i < n; i++)
        free(r[i].slots);
    free(r);
}

/* Free p's incoming rings; their sizes come from sw->all[], so before any port is freed. */
static void port_free_rings(struct sw_port *p)
{
    for (unsigned s = 0; s < VHD_NET_SWITCH_MAX_PORTS; s++) {
        if (p->in[s])
            rings_free(p->in[s], p->sw->all[s]->pairs);
        p->in[s] = NULL;
    }
}

static void port_free(struct sw_port *p)
{
    port_free_rings(p);
    for (uint32_t i = 0; p->wake_fd && i < p->pairs; i++)
        if (p->wake_fd[i] >= 0)
            close(p->wake_fd[i]);
    free(p->wake_fd);
    free(p->st);
    free(p);
}

static void switch_free(struct vhd_switch *sw)
{
    for (struct vhd_switch **pp = &sw_list; *pp; pp = &(*pp)->next) {
        if (*pp == sw) {
            *pp = sw->next;
            break;
        }
    }
    for (unsigned i = 0; i < sw->nall; i++)
        port_free_rings(sw->all[i]);
    for (unsigned i = 0; i < sw->nall; i++)
        port_free(sw->all[i]);
    free(sw);
}

static int sw_err(char *err, size_t errlen, int rc, const char *msg, const char *name)
{
    if (err && errlen)
        snprintf(err, errlen, "switch %s: %s", name, msg);
    return rc;
}

static int sw_open(const struct vhd_net_backend_opts *o, struct vhd_dev *dev,
                   struct vhd_net_backend **out, char *err, size_t errlen)
{
    const char *name = o->switch_name;
    struct vhd_switch *sw;
    struct sw_port *p;
    int rc;

    if (!name || !*name)
        return sw_err(err, errlen, -EINVAL, "no switch name (switch=NAME)", "?");
    if (strlen(name) >= sizeof(sw->name))
        return sw_err(err, errlen, -EINVAL, "name too long", name);

    pthread_mutex_lock(&sw_lock);
    for (sw = sw_list; sw; sw = sw->next)
        if (!strcmp(sw->name, name))
            break;
    bool created = false;
    if (!sw) {
        sw = calloc(1, sizeof(*sw));
        if (!sw) {
            rc = sw_err(err, errlen, -ENOMEM, "out of memory", name);
            goto err_unlock;
        }
        snprintf(sw->name, sizeof(sw->name), "%s", name);
        sw->next = sw_list;
        sw_list = sw;
        created = true;
    }
    if (sw->nall == VHD_NET_SWITCH_MAX_PORTS) {
        rc = sw_err(err, errlen, -ENOSPC, "no free port", name);
        goto err_switch;
    }
    p = calloc(1, sizeof(*p));
    if (!p) {
        rc = sw_err(err, errlen, -ENOMEM, "out of memory", name);
        goto err_switch;
    }
    p->sw = sw;
    p->idx = sw->nall;
    p->pairs = o->pairs ? o->pairs : 1;
    p->st = aligned_alloc(VHD_CACHELINE, p->pairs * sizeof(*p->st));
    p->wake_fd = malloc(p->pairs * sizeof(int));
    if (!p->st || !p->wake_fd) {
        rc = sw_err(err, errlen, -ENOMEM, "out of memory", name);
        goto err_port;
    }
    memset(p->st, 0, p->pairs * sizeof(*p->st));
    for (uint32_t i = 0; i < p->pairs; i++)
        p->wake_fd[i] = -1;
    for (uint32_t i = 0; i < p->pairs; i++) {
        p->wake_fd[i] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
        if (p->wake_fd[i] < 0) {
            rc = sw_err(err, errlen, -errno, "eventfd failed", name);
            goto err_port;
        }
    }
    /* Our incoming rings from every port that ever joined (a left port's stay unused). */
    for (unsigned s = 0; s < sw->nall; s++) {
        p->in[s] = rings_new(sw->all[s]->pairs);
        if (!p->in[s]) {
            rc = sw_err(err, errlen, -ENOMEM, "out of memory", name);
            goto err_port;
        }
    }
    /* And our outgoing ones, into every live port: allocate all first, then publish. */
    struct sw_ring *outr[VHD_NET_SWITCH_MAX_PORTS] = {0};
    for (unsigned d = 0; d < sw->nall; d++) {
        outr[d] = rings_new(p->pairs);
        if (!outr[d]) {
            for (unsigned k = 0; k < d; k++)
                rings_free(outr[k], p->pairs);
            rc = sw_err(err, errlen, -ENOMEM, "out of memory", name);
            goto err_port;
        }
    }
    p->be.ops = &vhd_net_backend_switch;
    p->be.dev = dev;
    p->be.offloads = (1ull << VIRTIO_NET_F_CSUM) | (1ull << VIRTIO_NET_F_GUEST_CSUM);
    snprintf(p->be.desc, sizeof(p->be.desc), "switch %s port %u", name, p->idx);
    sw->all[p->idx] = p;
    sw->nall++;
    sw->nlive++;
    for (unsigned d = 0; d < p->idx; d++)
        vhd_store_release(&sw->all[d]->in[p->idx], outr[d]);
    vhd_store_release(&sw->ports[p->idx], p);
    pthread_mutex_unlock(&sw_lock);
    *out = &p->be;
    return 0;

err_port:
    p->sw = sw;
    port_free(p);
err_switch:
    if (created)
        switch_free(sw);
err_unlock:
    pthread_mutex_unlock(&sw_lock);
    return rc;
}

/*
 * Leave the switch. Other ports' workers may still be pushing into our
 * rings or reading the port table, so nothing is freed until the last
 * port leaves: then every port's queues are detached (close requires it
 * for its own device) and the whole switch goes.
 */
static void sw_close(struct vhd_net_backend *be)
{
    struct sw_port *p = (struct sw_port *)be;
    struct vhd_switch *sw = p->sw;

    pthread_mutex_lock(&sw_lock);
    vhd_store_release(&sw->ports[p->idx], NULL);
    if (--sw->nlive == 0)
        switch_free(sw);
    pthread_mutex_unlock(&sw_lock);
}

static int sw_rx_wake_fd(struct vhd_net_backend *be, uint16_t pair)
{
    struct sw_port *p = (struct sw_port *)be;
    return pair < p->pairs ? p->wake_fd[pair] : -1;
}

int vhd_net_switch_port_stats(const struct vhd_dev *dev, struct vhd_net_switch_stats *out)
{
    const struct vhd_net_backend *be = vhd_dev_is_net(dev) ? vhd_net_backend_of(dev) : NULL;
    if (!be || be->ops != &vhd_net_backend_switch)
        return -EINVAL;
    const struct sw_port *p = (const struct sw_port *)be;
    memset(out, 0, sizeof(*out));
    for (uint32_t i = 0; i < p->pairs; i++) {
        const struct sw_pair_stats *s = &p->st[i];
        out->in_frames += vhd_load_relaxed(&s->in_frames);
        out->in_bytes += vhd_load_relaxed(&s->in_bytes);
        out->flooded += vhd_load_relaxed(&s->flooded);
        out->in_drops += vhd_load_relaxed(&s->in_drops);
        out->out_frames += vhd_load_relaxed(&s->out_frames);
        out->out_bytes += vhd_load_relaxed(&s->out_bytes);
        out->out_drops += vhd_load_relaxed(&s->out_drops);
    }
    return 0;
}

const struct vhd_net_backend_ops vhd_net_backend_switch = {
    .name = "switch",
    .open = sw_open,
    .close = sw_close,
    .tx = sw_tx,
    .rx_poll = sw_rx_poll,
    .rx_wake_fd = sw_rx_wake_fd,
};
