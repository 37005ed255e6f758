/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The virtio-net device (virtio 1.2, section 5.1): features, config space,
 * the transmit path (pop a chain, validate its header, hand the frame to the
 * packet backend), delivery into receive queues (vhd_net_deliver: mergeable
 * buffers, one copy), and the control queue. Both rings of a queue pair run
 * on one worker, so a loopback frame crosses from TX to RX with no lock.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "net.h"
#include "backend/net_backend.h"
#include "util/bits.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "runtime/efd.h"
#include "runtime/log.h"
#include "runtime/numa.h"
#include "runtime/rt.h"
#include "spec/virtio_net.h"
#include "util/errmsg.h"

/*
 * Feature bits that belong to the vhost-user transport rather than to the
 * device (VHOST_F_LOG_ALL 26, VHOST_USER_F_PROTOCOL_FEATURES 30): the
 * transport may pass them through SET_FEATURES; set_features tolerates them.
 */
#define NET_TRANSPORT_BITS (BIT(26) | BIT(30))

/* Offload bits a backend may ask us to offer (net_backend.h, offloads). */
#define NET_OFFLOAD_BITS                                                                         \
    (BIT(VIRTIO_NET_F_CSUM) | BIT(VIRTIO_NET_F_GUEST_CSUM) | BIT(VIRTIO_NET_F_HOST_TSO4) |       \
     BIT(VIRTIO_NET_F_HOST_TSO6) | BIT(VIRTIO_NET_F_HOST_ECN) | BIT(VIRTIO_NET_F_HOST_UFO) |     \
     BIT(VIRTIO_NET_F_GUEST_TSO4) | BIT(VIRTIO_NET_F_GUEST_TSO6) | BIT(VIRTIO_NET_F_GUEST_ECN) | \
     BIT(VIRTIO_NET_F_GUEST_UFO))

/*
 * Segmentation offloads one side takes, as a mask of GSO_* bits: the
 * transmit side from the HOST_* features (the device accepts such frames),
 * the receive side from the GUEST_* ones (the driver accepts them). Both
 * need the matching checksum offload (5.1.3.1: HOST_TSO4 requires CSUM,
 * GUEST_TSO4 GUEST_CSUM): without it nothing is taken.
 */
#define GSO_TCPV4 1u
#define GSO_TCPV6 2u
#define GSO_UDP   4u
#define GSO_ECN   8u

static uint8_t gso_mask(uint64_t f, bool host)
{
    unsigned b4 = host ? VIRTIO_NET_F_HOST_TSO4 : VIRTIO_NET_F_GUEST_TSO4;
    unsigned b6 = host ? VIRTIO_NET_F_HOST_TSO6 : VIRTIO_NET_F_GUEST_TSO6;
    unsigned bu = host ? VIRTIO_NET_F_HOST_UFO : VIRTIO_NET_F_GUEST_UFO;
    unsigned be = host ? VIRTIO_NET_F_HOST_ECN : VIRTIO_NET_F_GUEST_ECN;
    if (!(f & BIT(host ? VIRTIO_NET_F_CSUM : VIRTIO_NET_F_GUEST_CSUM)))
        return 0;
    return (uint8_t)(((f & BIT(b4)) ? GSO_TCPV4 : 0) | ((f & BIT(b6)) ? GSO_TCPV6 : 0) |
                     ((f & BIT(bu)) ? GSO_UDP : 0) | ((f & BIT(be)) ? GSO_ECN : 0));
}

/* Is a header's gso_type (5.1.6: a type, maybe with the ECN bit) among mask's? NONE always is. */
static bool gso_allowed(uint8_t gso_type, uint8_t mask)
{
    if ((gso_type & VIRTIO_NET_HDR_GSO_ECN) && !(mask & GSO_ECN))
        return false;
    switch (gso_type & (uint8_t)~VIRTIO_NET_HDR_GSO_ECN) {
    case VIRTIO_NET_HDR_GSO_NONE:
        return !(gso_type & VIRTIO_NET_HDR_GSO_ECN);
    case VIRTIO_NET_HDR_GSO_TCPV4:
        return (mask & GSO_TCPV4) != 0;
    case VIRTIO_NET_HDR_GSO_TCPV6:
        return (mask & GSO_TCPV6) != 0;
    case VIRTIO_NET_HDR_GSO_UDP:
        return (mask & GSO_UDP) != 0;
    default:
        return false;
    }
}

#define HDR_LEN ((uint32_t)sizeof(struct virtio_net_hdr_v1))

/* The queue roles of 5.1.2: receiveqN = 2N, transmitqN = 2N + 1, controlq after them. */
enum net_role { NET_Q_RX = 1, NET_Q_TX, NET_Q_CTRL };

static const char *const role_names[] = {"?", "rx", "tx", "ctrl"};

/* The device: generic part first (container_of from struct vhd_dev). */
struct vhd_net {
    struct vhd_dev dev;
    struct vhd_net_backend *be;
    uint32_t pairs;       /* max_virtqueue_pairs */
    uint64_t offered;     /* feature bits offered */
    bool no_split;        /* rings=packed */
    uint64_t default_mac; /* 6 bytes packed, see mac_pack() */
    uint16_t default_mtu;
    /*
     * Negotiated features: written by the control thread only while every
     * queue is detached (set_features, reset); workers copy what they need
     * at queue_init.
     */
    uint64_t features;
    /*
     * Device state shared by the control thread and the workers. Each field
     * is read and written with plain atomic loads and stores (never a
     * read-modify-write): a field has one writer at a time, or two whose
     * race is harmless and noted.
     */
    uint64_t mac;        /* config space mac: default; MAC_ADDR_SET (control queue's worker) */
    uint32_t curr_pairs; /* pairs in use (5.1.6.5.5): control thread at ctrl start/reset, ctrl
                            worker on VQ_PAIRS_SET; never both at once (ctrl detached then) */
    uint16_t mtu;        /* config space mtu: default, NET_SET_MTU (control thread) */
    uint8_t announce;    /* VIRTIO_NET_S_ANNOUNCE: set by vhd_net_announce (control), cleared by
                            ANNOUNCE_ACK (ctrl worker); an ack racing a new announce may clear it,
                            which costs one announcement (the driver acks before it announces) */
    uint8_t promisc;     /* CTRL_RX state, recorded for backends that filter (loopback does not) */
    uint8_t allmulti;
    uint32_t rarp_seq; /* SEND_RARP requests (control thread); pair 0's TX worker injects */
    uint64_t rarp_mac; /* the MAC of the last SEND_RARP (written before rarp_seq, release) */
    bool ctrl_seen;    /* control thread: the control queue started in this session */
    bool resumed;      /* control thread: a data ring of this session started where an
                          earlier session left it (a front-end or vhostd reconnect) */
    /*
     * Per pair, for a backend whose receive buffers are work (gen) and that
     * has no wake fd of its own: an eventfd the runtime watches for the
     * pair's receive queue (queue_wake_fd). VQ_PAIRS_SET rings the pairs it
     * brings back into use, whose (passive) rings may sit on a sleeping
     * worker of their own. NULL otherwise.
     */
    int *rx_doorbell;
    struct vhd_net_queue_stats *totals; /* per queue: finished ring runs (control thread) */
    uint8_t *roles;                     /* per queue: enum net_role at its last start (logs) */
};

/* Chains of one run (NET_BURST below). */
#define NET_BURST_SLOTS 32u

/* Per-queue state (q->priv), owned by the queue's worker while attached. */
struct net_queue {
    struct vhd_queue *q;
    struct vhd_net *net;
    size_t alloc_size;  /* this allocation's bytes (iovecs and run slots included) */
    uint8_t role;       /* enum net_role */
    uint16_t pair;      /* rx/tx: the pair's number */
    bool mrg;           /* rx: MRG_RXBUF negotiated (5.1.6.3.1) */
    bool guest_csum;    /* rx: the driver takes partial checksums (GUEST_CSUM) */
    bool host_csum;     /* tx: NEEDS_CSUM honoured (CSUM) */
    bool mtu_limit;     /* rx: MTU negotiated: larger frames are not passed (5.1.6.4.1) */
    uint8_t gso;        /* GSO_* the driver takes (rx, GUEST_*) or may send (tx, HOST_*) */
    bool broken;        /* rx: the driver posted an unusable buffer: NEEDS_RESET */
    uint32_t rarp_done; /* tx of pair 0: rarp_seq value already injected */
    uint64_t features;  /* ctrl: negotiated features */
    struct vhd_net_queue_stats st; /* relaxed atomic stores by the owner; any thread reads */
    uint32_t niov;                 /* entries in iov[] */
    /*
     * rx, tx: chain slot k of a run popped with vhd_vq_pop_burstv:
     * slot_iov[k] = iov + k * NET_SLOT_IOV and slot_c[k] = &chains[k].
     */
    struct iovec *slot_iov[NET_BURST_SLOTS];
    struct vhd_vq_chain *slot_c[NET_BURST_SLOTS];
    struct vhd_vq_chain *chains; /* rx: VHD_NET_RX_MAX_BUFS chains, tx: NET_BURST */
    struct iovec iov[];          /* chain segments: the run's slots, or (rx, a packet merged
                                    into several buffers) every chain of one packet in a row */
};

/*
 * Runs (net_tx_process, vhd_net_deliver_burst): at most NET_BURST chains
 * are popped in one vhd_vq_pop_burstv call before they are handled, 32
 * like DPDK's bursts: enough prefetches in flight to hide the transfers,
 * small arrays. Each chain has a slot of VHD_NET_CHAIN_IOV segments (the
 * limit of a chain) plus 4 spare entries: 2112-byte slots put the first
 * segments of a run in different cache sets (2048-byte ones would share
 * two).
 */
#define NET_BURST    NET_BURST_SLOTS
#define NET_SLOT_IOV (VHD_NET_CHAIN_IOV + 4u)
#define RUN_IOV      (NET_BURST * NET_SLOT_IOV)
#define TX_BURST     NET_BURST
_Static_assert(NET_BURST <= VHD_VQ_BURST_MAX, "a run is one vhd_vq_pop_burstv call");

/*
 * A packet merged into several buffers is popped chain by chain into iov
 * and chains from their start (rx_take_buffers): room for a last chain of
 * full size after VHD_NET_RX_MAX_BUFS one-segment ones. Shares the memory
 * of the run's slots (such a packet is a run of its own).
 */
#define RX_IOV (VHD_NET_RX_MAX_BUFS + VHD_NET_CHAIN_IOV)
_Static_assert(RX_IOV <= RUN_IOV && NET_BURST <= VHD_NET_RX_MAX_BUFS, "rx arrays shared");

/* Counters are written by one thread and read by any: relaxed store of the new value, no RMW. */
#define STAT_ADD(field, v) vhd_store_relaxed(&(field), (field) + (v))
#define STAT_MAX(field, v)                    \
    do {                                      \
        if ((v) > (field))                    \
            vhd_store_relaxed(&(field), (v)); \
    } while (0)

static struct vhd_net *to_net(struct vhd_dev *dev)
{
    return vhd_container_of(dev, struct vhd_net, dev);
}

static const struct vhd_net *to_cnet(const struct vhd_dev *dev)
{
    return vhd_container_of(dev, struct vhd_net, dev);
}

/* ---- small helpers ---- */

static uint64_t mac_pack(const uint8_t mac[6])
{
    uint64_t v = 0;
    for (int i = 0; i < 6; i++)
        v |= (uint64_t)mac[i] << (8 * i);
    return v;
}

static void mac_unpack(uint64_t v, uint8_t mac[6])
{
    for (int i = 0; i < 6; i++)
        mac[i] = (uint8_t)(v >> (8 * i));
}

void vhd_net_default_mac(const char *key, uint8_t mac[6])
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const char *p = key ? key : ""; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    mac[0] = 0x52;
    mac[1] = 0x54;
    mac[2] = 0x00;
    mac[3] = (uint8_t)(h >> 16);
    mac[4] = (uint8_t)(h >> 8);
    mac[5] = (uint8_t)h;
}

/*
 * The virtio-net header in and out of guest buffers. Drivers put it in the
 * first segment (DPDK and Linux prepend it to the frame, 5.1.6.2), so the
 * common case is one fixed-size copy the compiler inlines; a header split
 * across segments takes the general walk.
 */
static inline void hdr_read(const struct iovec *iov, uint32_t cnt, struct virtio_net_hdr_v1 *h)
{
    if (vhd_likely(cnt > 0 && iov[0].iov_len >= HDR_LEN))
        memcpy(h, iov[0].iov_base, HDR_LEN);
    else
        (void)vhd_iov_to_buf(iov, cnt, 0, h, HDR_LEN);
    /*
     * The driver can rewrite its header at any time: every check and use
     * reads *h, never the guest's bytes again. The empty asm says *h may
     * have changed, so the compiler cannot read the guest copy in its place
     * (unlike a "memory" clobber it costs the transmit loop nothing else).
     */
    __asm__ volatile("" : "+m"(*h));
}

/*
 * The receive header: the sender's fields with flags and num_buffers
 * replaced, stored field by field. Never through a whole-header copy of the
 * sender's header: that was just written with stores of other widths
 * (parsed out of the transmit buffer, then flags and num_buffers rewritten),
 * and a wide load across several stores cannot be forwarded from the store
 * buffer, so it waits until every older store reaches the cache, including
 * the stores into the driver's buffers and rings, each a cache line owned by
 * the driver's CPU. perf put 80% of delivery's samples on that one load.
 */
static inline void hdr_write(const struct iovec *iov, uint32_t cnt,
                             const struct virtio_net_hdr_v1 *src, uint8_t flags,
                             uint16_t num_buffers)
{
    uint8_t gso_type = src->gso_type;
    uint16_t hdr_len = src->hdr_len, gso_size = src->gso_size;
    uint16_t csum_start = src->csum_start, csum_offset = src->csum_offset;
    /*
     * Keep the compiler from merging these loads into one that crosses
     * byte 8 (a 12-byte copy stores bytes 0-7 and 8-11 separately): the
     * empty asm hides where csum_offset came from.
     */
    __asm__("" : "+r"(csum_offset));

    if (vhd_likely(cnt > 0 && iov[0].iov_len >= HDR_LEN)) {
        uint8_t *p = iov[0].iov_base;
        p[0] = flags;
        p[1] = gso_type;
        memcpy(p + 2, &hdr_len, 2);
        memcpy(p + 4, &gso_size, 2);
        memcpy(p + 6, &csum_start, 2);
        memcpy(p + 8, &csum_offset, 2);
        memcpy(p + 10, &num_buffers, 2);
    } else {
        struct virtio_net_hdr_v1 h = {.flags = flags,
                                      .gso_type = gso_type,
                                      .hdr_len = hdr_len,
                                      .gso_size = gso_size,
                                      .csum_start = csum_start,
                                      .csum_offset = csum_offset,
                                      .num_buffers = num_buffers};
        (void)vhd_iov_from_buf(iov, cnt, 0, &h, HDR_LEN);
    }
}

/*
 * Copy len bytes from byte soff of src to byte doff of dst (both iovec
 * lists; stops early if either runs out). Guest to guest: the driver may
 * point a receive buffer at its own transmit buffer, so the ranges may
 * overlap, which is legal input for us: memmove, never memcpy (glibc's
 * memmove is the same code as memcpy when they do not overlap).
 */
static void iov_copy(const struct iovec *dst, uint32_t dcnt, size_t doff, const struct iovec *src,
                     uint32_t scnt, size_t soff, size_t len)
{
    uint32_t di = 0, si = 0;

    /* Small frames: header and frame in the first segment of both sides (one memmove). */
    if (vhd_likely(dcnt > 0 && scnt > 0 && dst[0].iov_len >= doff && dst[0].iov_len - doff >= len &&
                   src[0].iov_len >= soff && src[0].iov_len - soff >= len)) {
        memmove((uint8_t *)dst[0].iov_base + doff, (const uint8_t *)src[0].iov_base + soff, len);
        return;
    }

    while (di < dcnt && doff >= dst[di].iov_len)
        doff -= dst[di++].iov_len;
    while (si < scnt && soff >= src[si].iov_len)
        soff -= src[si++].iov_len;
    while (len && di < dcnt && si < scnt) {
        size_t n = dst[di].iov_len - doff;
        if (n > src[si].iov_len - soff)
            n = src[si].iov_len - soff;
        if (n > len)
            n = len;
        memmove((uint8_t *)dst[di].iov_base + doff, (const uint8_t *)src[si].iov_base + soff, n);
        len -= n;
        doff += n;
        soff += n;
        if (doff == dst[di].iov_len) {
            di++;
            doff = 0;
        }
        if (soff == src[si].iov_len) {
            si++;
            soff = 0;
        }
    }
}

/*
 * Complete a partial checksum in place (the device side of
 * VIRTIO_NET_HDR_F_NEEDS_CSUM, 5.1.6.2): the Internet checksum of the
 * packet from csum_start to its end, whose 16-bit field at csum_start +
 * csum_offset already holds the pseudo-header sum the driver put there, is
 * stored complemented into that field. A result of 0 is stored as 0xffff
 * (for UDP 0 means "no checksum"; both are the same one's-complement
 * number), as Linux's skb_checksum_help does. iov holds the packet from
 * byte base on; the caller checked csum_start + csum_offset + 2 <= len.
 */
static void csum_fill(const struct iovec *iov, uint32_t cnt, size_t base, uint32_t len,
                      uint16_t csum_start, uint16_t csum_offset)
{
    uint64_t sum = 0;
    size_t off = base + csum_start, left = len - csum_start;
    bool odd = false; /* the next byte is the low half of a 16-bit word */

    for (uint32_t i = 0; i < cnt && left; i++) {
        if (off >= iov[i].iov_len) {
            off -= iov[i].iov_len;
            continue;
        }
        const uint8_t *p = (const uint8_t *)iov[i].iov_base + off;
        size_t n = iov[i].iov_len - off, k = 0;
        if (n > left)
            n = left;
        left -= n;
        off = 0;
        if (odd && n) {
            sum += p[0];
            k = 1;
            odd = false;
        }
        for (; k + 1 < n; k += 2)
            sum += (uint32_t)p[k] << 8 | p[k + 1];
        if (k < n) {
            sum += (uint32_t)p[k] << 8;
            odd = true;
        }
    }
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    uint16_t c = (uint16_t)~sum;
    if (c == 0)
        c = 0xffff;
    uint8_t be[2] = {(uint8_t)(c >> 8), (uint8_t)c};
    (void)vhd_iov_from_buf(iov, cnt, base + csum_start + csum_offset, be, 2);
}

/*
 * Undoing pops. A packet that turns out not to fit (no buffers left for
 * the rest of it, or a size limit) must leave the receive ring as it found
 * it: the buffers stay with the device for the next packet. vhd_vq_unpop
 * gives the chains back, latest first; nothing is pushed on the receive
 * queue between the pops and this (what unpop requires of packed rings):
 * a burst pushes only after every pop of its run. chains[first..first+n)
 * are the packet's, the last ones popped. An unpop that fails breaks the
 * queue (the engine reports it).
 */
static void rx_unpop(struct vhd_queue *q, const struct net_queue *rq, uint32_t first, uint32_t n)
{
    while (n > 0)
        if (vhd_unlikely(vhd_vq_unpop(&q->vq, &rq->chains[first + --n]) < 0))
            return;
}

/* ---- backends ---- */

const struct vhd_net_backend_ops *vhd_net_backend_find(const char *name)
{
    static const struct vhd_net_backend_ops *const all[] = {
        &vhd_net_backend_loopback, &vhd_net_backend_switch, &vhd_net_backend_tap,
        &vhd_net_backend_gen};
    for (size_t i = 0; i < VHD_ARRAY_SIZE(all); i++)
        if (!strcmp(all[i]->name, name))
            return all[i];
    return NULL;
}

/* ---- receive: delivery into a guest receive queue (5.1.6.3, 5.1.6.4) ---- */

/* An unusable receive buffer (a MUST of 5.1.6.3.1 broken): the ring stops until reset. */
static int rx_break(struct vhd_queue *q, struct net_queue *rq, const char *why)
{
    rq->broken = true;
    STAT_ADD(rq->st.errors, 1);
    VHD_LOG_RL(VHD_LOG_WARN, "%s: queue %u: %s; queue stopped until the device is reset",
               q->dev->name, q->index, why);
    return -EIO;
}

/*
 * One frame of a receive run, between its buffers and its copy: where its
 * segments are, how many chains it takes (the next ones of rq->chains, in
 * run order) and its header.
 */
struct rx_pkt {
    const struct iovec *iov; /* its segments: a run slot, or rq->iov for a merged packet */
    uint32_t frame;          /* index in the caller's array */
    uint16_t nbufs;          /* chains (buffers) it takes */
    uint16_t niov;           /* segments of all its chains, in a row from iov */
    uint8_t flags;           /* receive header flags */
    bool fill;               /* complete the checksum in software */
};

/*
 * Receive the buffers of a frame that one buffer cannot take (MRG_RXBUF),
 * as a run of its own: pop chains one by one into rq->chains[*nch..] and
 * rq->iov[*niov..] (the memory of the run slots, unused then; the
 * segments of all its chains in a row) until header and frame fit (one chain without
 * MRG_RXBUF, 5.1.6.3.1; as many as needed with it). On success the packet's
 * place is in *p and *nch / *niov moved past it; on failure its chains are
 * given back (or the ring is broken) and nothing moved. Returns 0, or
 *  -E2BIG    the arrays cannot take another chain of the frame's worst
 *            case (the caller reports -EMSGSIZE: the frame has them alone);
 *  -EMSGSIZE more buffers than a packet may take, or larger than one buffer
 *            without MRG_RXBUF;
 *  -ENOBUFS  no buffer posted; -ENOSPC: fewer than the frame needs;
 *  -EIO      the ring broke: by the engine (vq->error, nothing may be
 *            pushed any more) or by an unusable buffer (rq->broken).
 */
static int rx_take_buffers(struct vhd_queue *q, struct net_queue *rq, uint32_t total, uint32_t *nch,
                           uint32_t *niov, struct rx_pkt *p)
{
    uint32_t c0 = *nch, i0 = *niov, nbufs = 0, iov = i0;
    uint64_t room = 0;

    do {
        if (vhd_unlikely(c0 + nbufs == VHD_NET_RX_MAX_BUFS || RX_IOV - iov < VHD_NET_CHAIN_IOV)) {
            rx_unpop(q, rq, c0, nbufs);
            return nbufs == VHD_NET_RX_MAX_BUFS ? -EMSGSIZE : -E2BIG;
        }
        struct vhd_vq_chain *c = &rq->chains[c0 + nbufs];
        int rc = vhd_vq_pop(&q->vq, rq->iov + iov, VHD_NET_CHAIN_IOV, c);
        if (rc == 0) {
            /*
             * Out of buffers: the frame is dropped, as a NIC does; its buffers
             * stay posted. -ENOSPC when some were there (a smaller frame may
             * still fit them), -ENOBUFS when the ring was empty.
             */
            rx_unpop(q, rq, c0, nbufs);
            return nbufs ? -ENOSPC : -ENOBUFS;
        }
        if (vhd_unlikely(rc < 0))
            return -EIO; /* the engine broke the ring (sticky vq->error); the runtime reports it */
        /* 5.1.6.3.1: receive buffers are device-writable, and with MRG_RXBUF each holds a header.
         */
        if (vhd_unlikely(c->nr != 0 || c->wlen == 0 || (rq->mrg && c->wlen < HDR_LEN))) {
            rx_unpop(q, rq, c0, nbufs + 1);
            return rx_break(q, rq,
                            c->nr ? "receive buffer with device-readable descriptors"
                                  : "receive buffer smaller than the virtio-net header");
        }
        /*
         * The buffer's first line: the header goes there. It belongs to the
         * driver's CPU, which wrote the descriptor; fetch it for writing
         * while the rest of the run is popped.
         */
        vhd_prefetch_w(rq->iov[iov].iov_base);
        iov += c->nw;
        room += c->wlen;
        nbufs++;
    } while (rq->mrg && room < total);
    if (vhd_unlikely(room < total)) {
        /* Without MRG_RXBUF the packet must fit one buffer; the buffer stays for the next. */
        rx_unpop(q, rq, c0, nbufs);
        return -EMSGSIZE;
    }
    p->nbufs = (uint16_t)nbufs;
    p->niov = (uint16_t)(iov - i0);
    *nch = c0 + nbufs;
    *niov = iov;
    return 0;
}

/*
 * Frames delivered per run: up to RX_BURST receive buffers are popped with
 * one vhd_vq_pop_burstv (one check of the ring) into the run's slots and
 * matched to frames in order, one buffer per frame (a run ends when they
 * are used up; a chain the engine refuses after the first ends the pop
 * before it, and the next run's pop breaks the ring once this run is
 * published: the frames before it are delivered); then each frame gets
 * its header, its one copy and its dirty log entry, and the run's buffers
 * are pushed with one vhd_vq_push_burst and published with one flush.
 * Buffers the run popped but no frame took are given back before anything
 * is pushed (vhd_vq_unpop). With MRG_RXBUF a frame that does not fit its
 * buffer is a run of its own (rx_take_buffers); after one, runs start with
 * one buffer until a frame fits one again (so a stream of large frames
 * does not pop and give back whole runs).
 */
#define RX_BURST NET_BURST

unsigned vhd_net_deliver_burst(struct vhd_dev *dev, uint16_t pair, struct vhd_worker *self,
                               const struct vhd_net_frame *f, unsigned n, unsigned flags, int *rc)
{
    struct vhd_net *net = to_net(dev);
    bool stop = (flags & VHD_NET_DELIVER_STOP) != 0;
    int *const rc_all = rc; /* ONE_RC: the one status (nodev below) */
    if (flags & VHD_NET_DELIVER_ONE_RC)
        rc = NULL; /* no per-frame statuses */
    int fail = 0;  /* what every frame from `i` on gets, once set */
    unsigned i = 0;

    if (n == 0)
        return 0;
    /* 5.1.6.5.5: nothing is queued on receive queues beyond the pairs in use. */
    if (vhd_unlikely(pair >= vhd_load_relaxed(&net->curr_pairs) || pair >= net->pairs))
        goto nodev;
    struct vhd_queue *q = &dev->queues[vhd_index_nospec(2u * pair, dev->num_queues)];
    /*
     * Ownership: q->worker is set to a worker by that worker's own thread
     * when it takes the ring and cleared by it when it lets go (worker.c), so
     * reading our own pointer here proves we own q right now; anything else
     * (NULL, another worker) means hands off. q->enabled only changes while
     * q is detached (dev.h, run_disabled), so it is stable while we own q.
     */
    if (vhd_unlikely(q->worker != self || self == NULL || !q->enabled))
        goto nodev;
    struct net_queue *rq = q->priv;
    if (vhd_unlikely(rq == NULL || rq->role != NET_Q_RX))
        goto nodev;

    uint32_t max_len = VHD_NET_MAX_FRAME;
    if (rq->mtu_limit) {
        uint32_t m = (uint32_t)vhd_load_relaxed(&net->mtu) + VHD_ETH_HLEN + VHD_ETH_VLAN_LEN;
        max_len = m < max_len ? m : max_len;
    }
    uint64_t pkts = 0, bytes = 0, bufs = 0, drops = 0, largest = 0;
    struct rx_pkt run[RX_BURST];
    uint32_t written[VHD_NET_RX_MAX_BUFS];
    uint32_t hint = RX_BURST; /* most buffers a pop asks for (1 after a merged packet) */
    bool ended = false;       /* a frame failed and ended the call (stop, or the ring's state) */

    while (i < n && fail == 0) {
        /*
         * Phase 1: the run's buffers. rq->chains[0..got) were popped,
         * [0..ci) taken by the run's k frames, one each, or (merged) all
         * by its one frame.
         */
        unsigned k = 0;
        uint32_t got = 0, ci = 0;
        bool alone = false; /* the run is one frame popped by rx_take_buffers */

        if (vhd_unlikely(rq->broken || q->vq.error)) {
            fail = -EIO;
            break;
        }
        for (; i < n && k < RX_BURST; i++) {
            const struct vhd_net_frame *fr = &f[i];
            /*
             * 5.1.6.4.1: with MTU negotiated, nothing above mtu plus the
             * link-level header is passed, except segmentation-offload
             * frames (GSO), which go only to a driver that negotiated their
             * GUEST_* feature. A partial checksum whose offsets do not fit
             * the frame (a backend's bug) is not passed on either.
             */
            bool gso = fr->hdr.gso_type != VIRTIO_NET_HDR_GSO_NONE;
            uint16_t cs = vhd_le16(fr->hdr.csum_start), co = vhd_le16(fr->hdr.csum_offset);
            bool partial = (fr->hdr.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM) != 0;
            uint32_t total = HDR_LEN + fr->len;
            struct rx_pkt *p = &run[k];
            int r = 0;
            if (vhd_unlikely(fr->len > VHD_NET_MAX_FRAME || (!gso && fr->len > max_len) ||
                             (gso && !gso_allowed(fr->hdr.gso_type, rq->gso)) ||
                             (partial && (uint32_t)cs + co + 2u > fr->len))) {
                r = -EMSGSIZE;
                goto drop;
            }
            if (ci == got) {
                /*
                 * The run's buffers are used up: this frame starts the next
                 * run (so a bad chain that ended the pop is met by that
                 * run's pop, after this run is published), or this is the
                 * run's one pop.
                 */
                if (got > 0)
                    break;
                uint32_t w = n - i < RX_BURST ? n - i : RX_BURST;
                w = hint < w ? hint : w;
                int pr = vhd_vq_pop_burstv(&q->vq, rq->slot_iov, VHD_NET_CHAIN_IOV, rq->slot_c, w);
                if (pr <= 0) {
                    /*
                     * Out of buffers: the frame is dropped, as a NIC does
                     * (-ENOBUFS, and every later frame with it); or the
                     * engine broke the ring (sticky vq->error; the runtime
                     * reports it).
                     */
                    r = pr == 0 ? -ENOBUFS : -EIO;
                    goto drop;
                }
                got = (uint32_t)pr;
            }
            const struct vhd_vq_chain *c = &rq->chains[ci];
            /*
             * 5.1.6.3.1: receive buffers are device-writable, and with
             * MRG_RXBUF each holds a header. A writable-only buffer that
             * takes header and frame passes both (one test per frame).
             */
            bool fits = c->nr == 0 && c->wlen >= total;
            if (vhd_unlikely(!fits &&
                             (c->nr != 0 || c->wlen == 0 || (rq->mrg && c->wlen < HDR_LEN)))) {
                const char *why = c->nr ? "receive buffer with device-readable descriptors"
                                        : "receive buffer smaller than the virtio-net header";
                rx_unpop(q, rq, ci, got - ci);
                got = ci;
                r = rx_break(q, rq, why);
                goto drop;
            }
            if (vhd_likely(fits)) {
                /*
                 * The buffer's first line: the header goes there. It
                 * belongs to the driver's CPU, which wrote the descriptor;
                 * fetch it for writing while the rest of the run is matched.
                 */
                p->iov = rq->slot_iov[ci];
                const uint8_t *b = p->iov[0].iov_base;
                vhd_prefetch_w(b);
                /* ... and the line the frame ends in, when another (64 bytes behind a header). */
                if (total <= p->iov[0].iov_len &&
                    ((uintptr_t)b & (VHD_CACHELINE - 1)) + total > VHD_CACHELINE)
                    vhd_prefetch_w(b + total - 1);
                /*
                 * The frame's second line, for the copy (its first was read
                 * with its header): fetched only now that a buffer takes the
                 * frame. A frame that finds none is dropped unread, and the
                 * sender keeps that line to itself.
                 */
                if (vhd_likely(fr->iovcnt > 0))
                    __builtin_prefetch((const uint8_t *)fr->iov[0].iov_base + VHD_CACHELINE);
                p->nbufs = 1;
                p->niov = (uint16_t)c->nw;
                ci++;
                hint = RX_BURST;
            } else if (!rq->mrg) {
                /* Without MRG_RXBUF the packet must fit one buffer; the buffer stays for the next.
                 */
                r = -EMSGSIZE;
                goto drop;
            } else if (k > 0) {
                break; /* several buffers: this frame is the next run, on its own */
            } else {
                /* A run of its own: the buffers popped go back, then chain by chain. */
                uint32_t nch = 0, niov = 0;
                rx_unpop(q, rq, 0, got);
                got = 0;
                hint = 1;
                r = rx_take_buffers(q, rq, total, &nch, &niov, p);
                if (r == -E2BIG)
                    r = -EMSGSIZE;
                if (r < 0)
                    goto drop;
                p->iov = rq->iov;
                ci = got = nch;
                alone = true;
            }
            /*
             * The header the receiving driver sees (5.1.6.4): flags limited
             * to NEEDS_CSUM, kept only when the driver negotiated
             * GUEST_CSUM; otherwise the checksum is completed here and
             * flags is 0.
             */
            p->frame = i;
            p->fill = partial && !rq->guest_csum;
            p->flags = partial && rq->guest_csum ? VIRTIO_NET_HDR_F_NEEDS_CSUM : 0;
            k++;
            if (alone) {
                i++;
                break; /* a merged packet is a run of its own */
            }
            continue;
        drop:
            /* No buffer at all, or a broken ring: the same for every later frame. */
            if (r == -ENOBUFS || r == -EIO)
                fail = r;
            else if (r == -ENOSPC)
                r = -ENOBUFS; /* what is left may fit the next frame */
            /* Not delivered: counted as a drop of the receive queue. */
            drops++;
            if (rc)
                rc[i] = r;
            if (fail || stop) {
                i++; /* handled */
                ended = true;
                break;
            }
        }
        /* Buffers no frame took go back before anything is pushed (vhd_vq_unpop). */
        if (got > ci)
            rx_unpop(q, rq, ci, got - ci);

        if (vhd_unlikely(q->vq.error)) {
            /*
             * The engine broke the ring during the pops: nothing can be
             * pushed or published any more, so the run's frames (not yet
             * copied) are dropped, not delivered.
             */
            for (unsigned j = 0; j < k; j++)
                if (rc)
                    rc[run[j].frame] = -EIO;
            drops += k;
            fail = -EIO;
            break;
        }
        if (k == 0) {
            if (ended)
                break;
            continue;
        }

        /*
         * Phase 2: per frame, the header, one copy and its dirty log entry;
         * each buffer's used length is what it holds: all of it but the
         * last (2.7.8, 5.1.6.4). The run's chains are rq->chains[0..ci),
         * frame after frame.
         */
        uint64_t rpkts = 0, rbytes = 0, rlargest = 0;
        uint32_t nb = 0;
        for (unsigned j = 0; j < k; j++) {
            const struct rx_pkt *p = &run[j];
            const struct vhd_net_frame *fr = &f[p->frame];
            uint32_t len = fr->len;
            hdr_write(p->iov, p->niov, &fr->hdr, p->flags, vhd_le16(p->nbufs));
            iov_copy(p->iov, p->niov, HDR_LEN, fr->iov, fr->iovcnt, fr->off, len);
            if (vhd_unlikely(p->fill))
                csum_fill(p->iov, p->niov, HDR_LEN, len, vhd_le16(fr->hdr.csum_start),
                          vhd_le16(fr->hdr.csum_offset));
            vhd_vq_log_write(&q->vq, p->iov, p->niov, HDR_LEN + len); /* dirty logging */
            if (vhd_likely(p->nbufs == 1)) {
                written[nb++] = HDR_LEN + len;
            } else {
                uint32_t left = HDR_LEN + len;
                for (uint32_t b = 0; b < p->nbufs; b++) {
                    uint32_t m = rq->chains[nb].wlen < left ? rq->chains[nb].wlen : left;
                    left -= m;
                    written[nb++] = m;
                }
            }
            if (rc)
                rc[p->frame] = 0;
            rpkts++;
            rbytes += len;
            rlargest = len > rlargest ? len : rlargest;
        }
        if (vhd_unlikely(vhd_vq_push_burst(&q->vq, rq->chains, written, nb) < 0)) {
            /*
             * Cannot happen (our own chains): the queue is broken and
             * publishes nothing more, this run included (reported).
             */
            drops += k;
            for (unsigned j = 0; j < k; j++)
                if (rc)
                    rc[run[j].frame] = -EIO;
            fail = -EIO;
            break;
        }
        pkts += rpkts;
        bytes += rbytes;
        bufs += nb;
        largest = rlargest > largest ? rlargest : largest;
        /*
         * Published now, once per run: a ring that breaks in a later run
         * of this call can publish nothing more (the engine refuses), and
         * what was copied must not be lost with it. The notification
         * decision stays with the runtime, once per turn (mark_used).
         */
        vhd_vq_flush(&q->vq);
        vhd_queue_mark_used(q);
        if (ended)
            break;
    }
    if (fail && !(stop && ended)) {
        /* The frames not handled yet share the ring's fate (with stop: only the next one). */
        unsigned end = stop ? (i < n ? i + 1 : n) : n;
        if (i < end) {
            drops += end - i;
            if (rc)
                for (unsigned j = i; j < end; j++)
                    rc[j] = fail;
            i = end;
        }
    }
    STAT_ADD(rq->st.packets, pkts);
    STAT_ADD(rq->st.bytes, bytes);
    STAT_ADD(rq->st.buffers, bufs);
    STAT_ADD(rq->st.drops, drops);
    STAT_MAX(rq->st.largest, largest);
    return i;

nodev:
    /* Not our ring (stopped, disabled, pair not in use): nothing counted, the caller drops. */
    if (rc_all && (flags & VHD_NET_DELIVER_ONE_RC))
        *rc_all = -ENODEV;
    else if (rc)
        for (unsigned j = 0; j < (stop ? 1u : n); j++)
            rc[j] = -ENODEV;
    return stop ? 1u : n;
}

int vhd_net_deliver(struct vhd_dev *dev, uint16_t pair, struct vhd_worker *self,
                    const struct vhd_net_frame *f)
{
    int rc = -ENODEV;

    (void)vhd_net_deliver_burst(dev, pair, self, f, 1, 0, &rc);
    return rc;
}

/* Receive chains translated ahead per turn (vhd_vq_prefault): a whole ring of Linux's. */
#define NET_RX_PREFAULT 256u

/*
 * Receive queue processing: the driver added buffers (a kick) or we poll.
 * The loopback delivers from the transmit path, so there is nothing to do
 * here; a backend with its own receive side (switch, TAP) is polled.
 */
static int net_rx_process(struct vhd_queue *q, struct net_queue *rq, unsigned budget)
{
    struct vhd_net *net = rq->net;

    if (vhd_unlikely(rq->broken))
        return -EPROTO;
    /*
     * Behind an IOMMU every receive buffer the guest posts may be a new
     * mapping: translate them now (a kick, a poll turn), so that the MISS
     * goes out and the UPDATE is in before a frame needs the buffer
     * (else the frame would be dropped). One branch without an IOTLB.
     */
    (void)vhd_vq_prefault(&q->vq, NET_RX_PREFAULT);
    /*
     * A generator's buffers are work only while its pair is in use: a
     * disabled ring, or a pair beyond VQ_PAIRS_SET, takes no frame, and left
     * active it would keep an event-mode worker spinning on buffers it
     * never fills. Passive (dev.h) until then: it runs again on a kick, a
     * re-attach (enable) or while a worker polls.
     */
    if (net->be->ops->rx_buffers_are_work)
        q->passive = !q->enabled || rq->pair >= vhd_load_relaxed(&net->curr_pairs);
    if (net->be->ops->rx_poll && q->enabled)
        return net->be->ops->rx_poll(net->be, rq->pair, q->worker, budget);
    return 0;
}

/* ---- transmit (5.1.6.2) ---- */

/*
 * Check a transmit chain (its segments in iov) and describe its frame in f.
 * The header is copied out once; every decision uses the copy. Returns 0,
 * or -EINVAL/-EMSGSIZE for a chain the device cannot send (counted as an
 * error, given back). Inlined into both transmit loops: a call per frame
 * (register saves included) cost ~50 instructions of a looped frame.
 */
static inline __attribute__((always_inline)) int
net_tx_parse(struct vhd_queue *q, struct net_queue *tq, const struct iovec *iov,
             const struct vhd_vq_chain *c, struct vhd_net_frame *f)
{
    if (vhd_unlikely(c->rlen < HDR_LEN + VHD_ETH_HLEN)) {
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: queue %u: transmit chain of %u bytes: shorter than a header "
                   "and an Ethernet header",
                   q->dev->name, q->index, c->rlen);
        return -EINVAL;
    }
    uint32_t len = c->rlen - HDR_LEN;
    if (vhd_unlikely(len > VHD_NET_MAX_FRAME)) {
        VHD_LOG_RL(VHD_LOG_WARN, "%s: queue %u: transmit frame of %u bytes (at most %u)",
                   q->dev->name, q->index, len, VHD_NET_MAX_FRAME);
        return -EMSGSIZE;
    }
    hdr_read(iov, c->nr, &f->hdr);
    /*
     * 5.1.6.2.1: gso_type other than NONE only with its HOST_* feature
     * (which the backend offered, net_backend.h), and then with a partial
     * checksum and a segment size, as the backend (the kernel) needs them.
     */
    if (vhd_unlikely(f->hdr.gso_type != VIRTIO_NET_HDR_GSO_NONE) &&
        (!gso_allowed(f->hdr.gso_type, tq->gso) || f->hdr.gso_size == 0 ||
         !(f->hdr.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM))) {
        VHD_LOG_RL(VHD_LOG_WARN,
                   "%s: queue %u: transmit frame with gso_type %u (gso_size %u, flags %u): "
                   "not negotiated or incomplete",
                   q->dev->name, q->index, f->hdr.gso_type, vhd_le16(f->hdr.gso_size),
                   f->hdr.flags);
        return -EINVAL;
    }
    /*
     * 5.1.6.2.2: flags the device does not recognise are ignored, and
     * NEEDS_CSUM means something only with CSUM negotiated; then the field
     * it names must lie inside the frame.
     */
    if (tq->host_csum && (f->hdr.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM)) {
        uint32_t cs = vhd_le16(f->hdr.csum_start), co = vhd_le16(f->hdr.csum_offset);
        if (vhd_unlikely(cs + co + 2u > len)) {
            VHD_LOG_RL(VHD_LOG_WARN, "%s: queue %u: checksum at %u+%u outside the %u-byte frame",
                       q->dev->name, q->index, cs, co, len);
            return -EINVAL;
        }
        f->hdr.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
    } else {
        f->hdr.flags = 0;
    }
    f->hdr.num_buffers = 0;
    f->iov = iov;
    f->iovcnt = c->nr;
    f->off = HDR_LEN;
    f->len = len;
    return 0;
}

/*
 * A RARP broadcast for a MAC (what SEND_RARP asks for): Ethernet broadcast
 * from mac, ethertype RARP, "reverse request" with mac as sender and
 * target hardware address, padded to the 60-byte minimum frame.
 */
static void build_rarp(const uint8_t mac[6], uint8_t *frame)
{
    static const uint8_t arp_head[8] = {0, 1, 8, 0, 6, 4, 0, 3}; /* Ethernet, IPv4, 6, 4, op 3 */
    memset(frame, 0, 60);
    memset(frame, 0xff, 6);
    memcpy(frame + 6, mac, 6);
    frame[12] = VHD_ETH_P_RARP >> 8;
    frame[13] = VHD_ETH_P_RARP & 0xff;
    memcpy(frame + 14, arp_head, sizeof(arp_head));
    memcpy(frame + 22, mac, 6); /* sender hardware address; sender IP 0 */
    memcpy(frame + 32, mac, 6); /* target hardware address; target IP 0 */
}

/* Pair 0's transmit queue: send a RARP the front-end asked for (SEND_RARP) as if the guest had. */
static void net_tx_rarp(struct net_queue *tq, struct vhd_worker *self)
{
    struct vhd_net *net = tq->net;
    uint32_t seq = vhd_load_acquire(&net->rarp_seq); /* pairs with the release in net_send_rarp */

    if (vhd_likely(seq == tq->rarp_done))
        return;
    tq->rarp_done = seq;
    uint8_t mac[6], buf[HDR_LEN + 60] = {0};
    mac_unpack(vhd_load_relaxed(&net->rarp_mac), mac);
    build_rarp(mac, buf + HDR_LEN);
    struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf)};
    struct vhd_net_frame f = {.iov = &iov, .iovcnt = 1, .off = HDR_LEN, .len = 60};
    STAT_ADD(tq->st.packets, 1);
    STAT_ADD(tq->st.bytes, 60);
    if (net->be->ops->tx(net->be, 0, self, &f) < 0)
        STAT_ADD(tq->st.drops, 1);
}

/*
 * Transmit queue processing: up to budget chains, in runs of up to
 * TX_BURST. A run is popped with one vhd_vq_pop_burstv (each chain in its
 * slot of tq->iov) and the first two cache lines of every frame are
 * prefetched; then each frame is parsed and handed to the backend in pop
 * order (a backend with tx_burst gets the parsed frames of the run in one
 * call), then the run's chains are pushed with one vhd_vq_push_burst. The
 * frames were just written by the driver on another CPU: touching them one
 * after another waits for each transfer in turn, while the prefetches of a
 * run overlap (DPDK's vhost dequeue does the same).
 *
 * A started but disabled ring (vhost-user "Ring states") is processed
 * without side effects: its frames are discarded. Every chain goes back used
 * with length 0 (nothing is written into transmit buffers); one flush per
 * call (the runtime), or of a short run here. A bad chain after the first
 * of a run ends the run before it (vq.h): the run is handled, pushed and
 * published as usual, and the next pop, which meets the bad chain first,
 * breaks the ring and ends the call.
 */
static int net_tx_process(struct vhd_queue *q, struct net_queue *tq, unsigned budget)
{
    struct vhd_net *net = tq->net;
    struct vhd_net_backend *be = net->be;
    struct vhd_worker *self = q->worker;
    bool enabled = q->enabled;
    uint64_t pkts = 0, bytes = 0, drops = 0, errs = 0, largest = 0;
    const struct vhd_vq_chain *cs = tq->chains;
    unsigned n = 0;
    int rc = 0, prc = 1;

    if (vhd_unlikely(tq->pair == 0 && enabled))
        net_tx_rarp(tq, self);
    while (n < budget) {
        uint32_t want = budget - n < TX_BURST ? budget - n : TX_BURST;
        /*
         * Publish the previous run before popping again: should this pop
         * meet a bad chain, the ring breaks and a broken ring publishes
         * nothing. One release store per run of TX_BURST.
         */
        if (n)
            vhd_vq_flush(&q->vq);
        prc = vhd_vq_pop_burstv(&q->vq, tq->slot_iov, VHD_NET_CHAIN_IOV, tq->slot_c, want);
        if (prc <= 0)
            break; /* empty, or the engine broke the ring (reported below) */
        unsigned k = (unsigned)prc;
        for (unsigned i = 0; i < k; i++) {
            if (vhd_likely(cs[i].nr > 0)) {
                const uint8_t *p = tq->slot_iov[i][0].iov_base;
                __builtin_prefetch(p);
            }
        }
        if (vhd_likely(enabled && be->ops->tx_burst)) {
            /* The whole run to the backend at once (loopback: one receive burst). */
            struct vhd_net_frame fs[TX_BURST];
            unsigned m = 0;
            for (unsigned i = 0; i < k; i++) {
                if (vhd_unlikely(net_tx_parse(q, tq, tq->slot_iov[i], &cs[i], &fs[m]) < 0)) {
                    errs++;
                    continue;
                }
                pkts++;
                bytes += fs[m].len;
                largest = fs[m].len > largest ? fs[m].len : largest;
                m++;
            }
            if (m)
                drops += be->ops->tx_burst(be, tq->pair, self, fs, m);
        } else {
            for (unsigned i = 0; i < k; i++) {
                const struct vhd_vq_chain *c = &cs[i];
                if (vhd_likely(enabled)) {
                    struct vhd_net_frame f;
                    if (vhd_unlikely(net_tx_parse(q, tq, tq->slot_iov[i], c, &f) < 0)) {
                        errs++;
                    } else {
                        pkts++;
                        bytes += f.len;
                        largest = f.len > largest ? f.len : largest;
                        if (vhd_unlikely(be->ops->tx(be, tq->pair, self, &f) < 0))
                            drops++;
                    }
                } else {
                    /* Taken and discarded: counted as sent and dropped (the invariant in net.h). */
                    pkts++;
                    bytes += c->rlen > HDR_LEN ? c->rlen - HDR_LEN : 0;
                    drops++;
                }
            }
        }
        n += k;
        rc = vhd_vq_push_burst(&q->vq, cs, NULL, k);
        if (vhd_unlikely(rc < 0))
            break;
    }
    if (n)
        vhd_queue_mark_used(q);
    STAT_ADD(tq->st.packets, pkts);
    STAT_ADD(tq->st.bytes, bytes);
    STAT_ADD(tq->st.drops, drops);
    STAT_ADD(tq->st.errors, errs);
    STAT_MAX(tq->st.largest, largest);
    if (rc >= 0 && prc < 0)
        rc = prc;
    return rc < 0 ? rc : (int)n;
}

/* ---- control queue (5.1.6.5) ---- */

/*
 * Handle one command; returns the ack byte. The readable part is the
 * 2-byte header and the command's data (dlen bytes from offset 2); every
 * size is checked before the data is read, and the data is copied out once.
 */
static uint8_t net_ctrl_handle(struct vhd_queue *q, struct net_queue *cq,
                               const struct vhd_vq_chain *c)
{
    struct vhd_net *net = cq->net;
    const struct iovec *iov = cq->iov;
    struct virtio_net_ctrl_hdr h;
    uint64_t f = cq->features;

    if (c->rlen < sizeof(h)) {
        VHD_LOG_RL(VHD_LOG_WARN, "%s: control command of %u bytes: no class and command",
                   q->dev->name, c->rlen);
        return VIRTIO_NET_ERR;
    }
    (void)vhd_iov_to_buf(iov, c->nr, 0, &h, sizeof(h));
    uint32_t dlen = c->rlen - (uint32_t)sizeof(h);

    switch (h.cls) {
    case VIRTIO_NET_CTRL_RX:
        /* 5.1.6.5.1: PROMISC and ALLMULTI (CTRL_RX) take one byte, on or off. */
        if (!(f & BIT(VIRTIO_NET_F_CTRL_RX)) || dlen != 1 ||
            (h.cmd != VIRTIO_NET_CTRL_RX_PROMISC && h.cmd != VIRTIO_NET_CTRL_RX_ALLMULTI))
            break;
        /* Cannot come up short (rlen counted the byte); checked so `on` is always defined. */
        uint8_t on = 0;
        if (vhd_iov_to_buf(iov, c->nr, sizeof(h), &on, 1) != 1)
            break;
        vhd_store_relaxed(h.cmd == VIRTIO_NET_CTRL_RX_PROMISC ? &net->promisc : &net->allmulti,
                          (uint8_t)(on != 0));
        return VIRTIO_NET_OK;
    case VIRTIO_NET_CTRL_MAC:
        if (h.cmd == VIRTIO_NET_CTRL_MAC_ADDR_SET) {
            /* 5.1.6.5.2: the new default address, reflected in config space (a unicast one). */
            uint8_t mac[6] = {0};
            if (!(f & BIT(VIRTIO_NET_F_CTRL_MAC_ADDR)) || dlen != 6 ||
                vhd_iov_to_buf(iov, c->nr, sizeof(h), mac, 6) != 6)
                break;
            if (mac[0] & 1)
                break;
            vhd_store_relaxed(&net->mac, mac_pack(mac));
            return VIRTIO_NET_OK;
        }
        if (h.cmd == VIRTIO_NET_CTRL_MAC_TABLE_SET && (f & BIT(VIRTIO_NET_F_CTRL_RX))) {
            /* Two tables, each le32 entries + 6 * entries bytes, filling the data exactly. */
            uint32_t off = sizeof(h), left = dlen;
            for (int t = 0; t < 2; t++) {
                uint32_t n = 0;
                if (left < 4 || vhd_iov_to_buf(iov, c->nr, off, &n, 4) != 4)
                    return VIRTIO_NET_ERR;
                n = vhd_le32(n);
                left -= 4;
                off += 4;
                if (n > left / 6)
                    return VIRTIO_NET_ERR;
                left -= 6 * n;
                off += 6 * n;
            }
            if (left != 0)
                break;
            return VIRTIO_NET_OK; /* loopback does not filter: nothing to program */
        }
        break;
    case VIRTIO_NET_CTRL_MQ:
        /* 5.1.6.5.5: 1..max_virtqueue_pairs; out of range is refused. */
        if (h.cmd == VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET && (f & BIT(VIRTIO_NET_F_MQ)) && dlen == 2) {
            struct virtio_net_ctrl_mq mq = {0};
            if (vhd_iov_to_buf(iov, c->nr, sizeof(h), &mq, sizeof(mq)) != sizeof(mq))
                break;
            uint16_t n = vhd_le16(mq.virtqueue_pairs);
            if (n < VIRTIO_NET_CTRL_MQ_VQ_PAIRS_MIN || n > net->pairs)
                break;
            uint32_t old = vhd_load_relaxed(&net->curr_pairs);
            vhd_store_relaxed(&net->curr_pairs, (uint32_t)n);
            /* Wake the pairs back in use (an edge each; nobody reads the counter). */
            for (uint32_t p = old; net->rx_doorbell && p < n; p++)
                (void)!eventfd_write(net->rx_doorbell[p], 1);
            return VIRTIO_NET_OK;
        }
        break;
    case VIRTIO_NET_CTRL_ANNOUNCE:
        /* 5.1.6.5.4: the driver announced; clear VIRTIO_NET_S_ANNOUNCE. */
        if (h.cmd == VIRTIO_NET_CTRL_ANNOUNCE_ACK && (f & BIT(VIRTIO_NET_F_GUEST_ANNOUNCE)) &&
            dlen == 0) {
            vhd_store_relaxed(&net->announce, (uint8_t)0);
            return VIRTIO_NET_OK;
        }
        break;
    default:
        break;
    }
    VHD_LOG_RL(VHD_LOG_WARN,
               "%s: control command class %u command %u with %u bytes of data refused "
               "(unknown, not negotiated or malformed)",
               q->dev->name, h.cls, h.cmd, dlen);
    return VIRTIO_NET_ERR;
}

/*
 * Control queue processing. The ack goes into the first device-writable
 * byte (5.1.6.5: class, command, data, then ack); a command with no
 * writable byte cannot be answered and is given back with length 0. A
 * disabled control ring is left alone (a command always has side effects).
 */
static int net_ctrl_process(struct vhd_queue *q, struct net_queue *cq, unsigned budget)
{
    unsigned n = 0;
    uint64_t cmds = 0, errs = 0;
    int rc = 0;

    if (!q->enabled)
        return 0;
    while (n < budget) {
        struct vhd_vq_chain c;
        rc = vhd_vq_pop(&q->vq, cq->iov, VHD_NET_CHAIN_IOV, &c);
        if (rc <= 0)
            break;
        n++;
        cmds++;
        uint8_t ack = net_ctrl_handle(q, cq, &c);
        uint32_t written = 0;
        if (vhd_likely(c.nw > 0)) {
            /* The engine never yields an empty segment, so the first writable one has a byte. */
            *(uint8_t *)cq->iov[c.nr].iov_base = ack;
            written = 1;
            vhd_vq_log_write(&q->vq, &cq->iov[c.nr], 1, 1);
        } else {
            VHD_LOG_RL(VHD_LOG_WARN, "%s: control command without an ack byte", q->dev->name);
            ack = VIRTIO_NET_ERR;
        }
        if (ack != VIRTIO_NET_OK)
            errs++;
        rc = vhd_vq_push(&q->vq, &c, written);
        if (vhd_unlikely(rc < 0))
            break;
    }
    if (n)
        vhd_queue_mark_used(q);
    STAT_ADD(cq->st.packets, cmds);
    STAT_ADD(cq->st.errors, errs);
    return rc < 0 ? rc : (int)n;
}

/* ---- vhd_dev_ops ---- */

static int net_queue_process(struct vhd_queue *q, unsigned budget)
{
    struct net_queue *nq = q->priv;

    if (vhd_unlikely(!nq))
        return -ENODEV;
    switch (nq->role) {
    case NET_Q_TX:
        return net_tx_process(q, nq, budget);
    case NET_Q_RX:
        return net_rx_process(q, nq, budget);
    case NET_Q_CTRL:
        return net_ctrl_process(q, nq, budget);
    default:
        return -ENODEV;
    }
}

/* A receive queue's wake fd: the backend's (switch doorbell, TAP fd), for the runtime to watch. */
static int net_queue_wake_fd(struct vhd_queue *q)
{
    struct vhd_net *net = to_net(q->dev);
    struct net_queue *nq = q->priv;

    if (!nq || nq->role != NET_Q_RX)
        return -1;
    if (net->rx_doorbell)
        return net->rx_doorbell[nq->pair];
    if (!net->be->ops->rx_wake_fd)
        return -1;
    return net->be->ops->rx_wake_fd(net->be, nq->pair);
}

const struct vhd_net_backend *vhd_net_backend_of(const struct vhd_dev *dev)
{
    return to_cnet(dev)->be;
}

static uint64_t net_features(struct vhd_dev *dev)
{
    return to_net(dev)->offered;
}

/*
 * SET_FEATURES. VERSION_1 is required (no legacy header layout). Feature
 * dependencies (5.1.3.1) are not enforced: vhost-user front-ends handle the
 * control queue themselves and clear CTRL_VQ, MAC and STATUS from what they
 * send while keeping MQ or CTRL_RX (DPDK's virtio-user does), and none of
 * them changes what the datapath does.
 */
static int net_set_features(struct vhd_dev *dev, uint64_t features)
{
    struct vhd_net *net = to_net(dev);

    int rc = vhd_dev_check_features(dev, features, net->offered, NET_TRANSPORT_BITS, net->no_split);

    if (rc)
        return rc;
    if (net->be->ops->set_features) {
        rc = net->be->ops->set_features(net->be, features & net->offered);
        if (rc < 0)
            return rc;
    }
    net->features = features & net->offered;
    dev->features = features;
    return 0;
}

static void net_fill_config(const struct vhd_net *net, struct virtio_net_config *cfg)
{
    uint16_t status = VIRTIO_NET_S_LINK_UP;

    memset(cfg, 0, sizeof(*cfg));
    mac_unpack(vhd_load_relaxed(&net->mac), cfg->mac);
    if (vhd_load_relaxed(&net->announce))
        status |= VIRTIO_NET_S_ANNOUNCE;
    cfg->status = vhd_le16(status);
    cfg->max_virtqueue_pairs = vhd_le16((uint16_t)net->pairs);
    cfg->mtu = vhd_le16(vhd_load_relaxed(&net->mtu));
    cfg->speed = vhd_le32(VIRTIO_NET_SPEED_UNKNOWN);
    cfg->duplex = VIRTIO_NET_DUPLEX_UNKNOWN;
}

/* Config space (5.1.4) is read-only for the driver: no set_config. */
static int net_get_config(struct vhd_dev *dev, void *buf, uint32_t off, uint32_t len)
{
    struct virtio_net_config cfg;

    if (off > sizeof(cfg) || len > sizeof(cfg) - off)
        return -EINVAL;
    net_fill_config(to_net(dev), &cfg);
    memcpy(buf, (const uint8_t *)&cfg + off, len);
    return 0;
}

/* Fold a finished ring run's counters into the session totals. Control thread, q detached. */
/* A pinned worker took q: its state (iovecs, run slots) goes to the worker's node (dev.h). */
static int net_queue_place(struct vhd_queue *q)
{
    struct net_queue *nq = q->priv;
    return nq ? vhd_numa_move_here(nq, nq->alloc_size) : 0;
}

static void net_queue_fini(struct vhd_dev *dev, struct vhd_queue *q)
{
    struct vhd_net *net = to_net(dev);
    struct net_queue *nq = q->priv;

    if (!nq)
        return;
    if (q->index < dev->num_queues) {
        struct vhd_net_queue_stats *t = &net->totals[q->index];
        t->packets += nq->st.packets;
        t->bytes += nq->st.bytes;
        t->drops += nq->st.drops;
        t->errors += nq->st.errors;
        t->buffers += nq->st.buffers;
        t->largest = nq->st.largest > t->largest ? nq->st.largest : t->largest;
    }
    free(nq);
    q->priv = NULL;
}

static int net_announce(struct vhd_net *net, const char *why);

/*
 * A ring starts: its role follows from its index and the negotiated
 * features (5.1.2): with MQ the data queues are 0 .. 2 * pairs - 1 and the
 * control queue is 2 * pairs; without MQ, 0 and 1 and the control queue 2.
 * Any other ring is not part of the device: -EINVAL.
 */
static int net_queue_init(struct vhd_dev *dev, struct vhd_queue *q)
{
    struct vhd_net *net = to_net(dev);
    uint64_t f = net->features;
    uint32_t ndata = (f & BIT(VIRTIO_NET_F_MQ)) ? 2 * net->pairs : 2;
    uint8_t role;
    uint32_t niov = VHD_NET_CHAIN_IOV;

    if (q->index < ndata) {
        role = (q->index & 1) ? NET_Q_TX : NET_Q_RX;
    } else if (q->index == ndata && (f & BIT(VIRTIO_NET_F_CTRL_VQ))) {
        role = NET_Q_CTRL;
    } else {
        VHD_LOG_RL(VHD_LOG_WARN, "%s: queue %u is not used with the negotiated features", dev->name,
                   q->index);
        return -EINVAL;
    }
    if (q->priv)
        net_queue_fini(dev, q);
    net->roles[q->index] = role;
    if (role == NET_Q_RX || role == NET_Q_TX)
        niov = RUN_IOV;
    size_t sz = sizeof(struct net_queue) + (size_t)niov * sizeof(struct iovec);
    size_t chains_off = sz;
    if (role == NET_Q_RX)
        sz += VHD_NET_RX_MAX_BUFS * sizeof(struct vhd_vq_chain);
    else if (role == NET_Q_TX)
        sz += NET_BURST * sizeof(struct vhd_vq_chain);
    sz = (sz + VHD_CACHELINE - 1) & ~(size_t)(VHD_CACHELINE - 1);
    struct net_queue *nq = aligned_alloc(VHD_CACHELINE, sz);
    if (!nq)
        return -ENOMEM;
    memset(nq, 0, sizeof(*nq));
    nq->q = q;
    nq->net = net;
    nq->alloc_size = sz;
    nq->role = role;
    nq->pair = (uint16_t)(q->index / 2);
    nq->niov = niov;
    nq->features = f;
    nq->mrg = (f & BIT(VIRTIO_NET_F_MRG_RXBUF)) != 0;
    nq->guest_csum = (f & BIT(VIRTIO_NET_F_GUEST_CSUM)) != 0;
    nq->host_csum = (f & BIT(VIRTIO_NET_F_CSUM)) != 0;
    nq->mtu_limit = (f & BIT(VIRTIO_NET_F_MTU)) != 0;
    nq->gso = role == NET_Q_RX ? gso_mask(f, false) : role == NET_Q_TX ? gso_mask(f, true) : 0;
    nq->chains = role == NET_Q_RX || role == NET_Q_TX
                     ? (struct vhd_vq_chain *)((uint8_t *)nq + chains_off)
                     : NULL;
    if (nq->chains)
        for (uint32_t k = 0; k < NET_BURST; k++) {
            nq->slot_iov[k] = nq->iov + (size_t)k * NET_SLOT_IOV;
            nq->slot_c[k] = &nq->chains[k];
        }
    /*
     * Receive buffers are not work (dev.h, passive): the queue runs on its
     * backend's wake fd, its pair's transmit path (loopback) and kicks;
     * frames that find no buffer are dropped, never kept waiting for one.
     * Except with a generator (gen), which has a frame for every buffer.
     */
    q->passive = role == NET_Q_RX && !net->be->ops->rx_buffers_are_work;
    /*
     * A data ring that does not start at the beginning was in use before
     * this session: the guest kept running while the front-end or vhostd
     * reconnected, and whatever learned its MAC (the switch's table, a
     * bridge behind the TAP) may have forgotten it.
     */
    if (role != NET_Q_CTRL &&
        (q->vq.last_avail_idx != 0 || ((f & BIT(VIRTIO_F_RING_PACKED)) && !q->vq.avail_wrap)))
        net->resumed = true;
    q->priv = nq;
    if (role == NET_Q_CTRL && !net->ctrl_seen) {
        /* The driver steers through us from now on: one pair until VQ_PAIRS_SET (5.1.6.5.5). */
        net->ctrl_seen = true;
        if (f & BIT(VIRTIO_NET_F_MQ))
            vhd_store_relaxed(&net->curr_pairs, 1u);
    }
    /* A resumed session: ask the guest to announce itself (5.1.6.5.4) once it can ack. */
    if (net->resumed && net->ctrl_seen && net_announce(net, "session resumed") == 0)
        net->resumed = false;
    return 0;
}

/*
 * Ask the driver to announce itself (5.1.6.5.4): VIRTIO_NET_S_ANNOUNCE in
 * the status, then a configuration change notification (dev.h,
 * config_changed: the transport sends it); the driver sends its gratuitous
 * packets and acks with VIRTIO_NET_CTRL_ANNOUNCE_ACK, which clears the bit.
 * Needs GUEST_ANNOUNCE (which needs CTRL_VQ): -EOPNOTSUPP otherwise.
 * Control thread.
 */
static int net_announce(struct vhd_net *net, const char *why)
{
    if (!(net->features & BIT(VIRTIO_NET_F_GUEST_ANNOUNCE)) ||
        !(net->features & BIT(VIRTIO_NET_F_CTRL_VQ)))
        return -EOPNOTSUPP;
    vhd_store_relaxed(&net->announce, (uint8_t)1);
    net->dev.config_changed = true;
    vhd_log(VHD_LOG_INFO, "%s: asking the guest to announce itself (%s)", net->dev.name, why);
    return 0;
}

/* Device reset (RESET_DEVICE, disconnect): every queue is detached and finalised. */
static void net_reset(struct vhd_dev *dev)
{
    struct vhd_net *net = to_net(dev);

    vhd_net_log_stats(dev, "session end");
    memset(net->totals, 0, dev->num_queues * sizeof(*net->totals));
    memset(net->roles, 0, dev->num_queues);
    net->features = 0;
    if (net->be->ops->set_features)
        (void)net->be->ops->set_features(net->be, 0);
    net->ctrl_seen = false;
    net->resumed = false;
    dev->config_changed = false;
    vhd_store_relaxed(&net->mac, net->default_mac);
    vhd_store_relaxed(&net->mtu, net->default_mtu);
    vhd_store_relaxed(&net->curr_pairs, net->pairs);
    vhd_store_relaxed(&net->announce, (uint8_t)0);
    vhd_store_relaxed(&net->promisc, (uint8_t)0);
    vhd_store_relaxed(&net->allmulti, (uint8_t)0);
    vhd_store_relaxed(&net->rarp_seq, 0u);
}

/* VHOST_USER_NET_SET_MTU: the MTU the front-end exposes to the guest (5.1.4.1 range). */
static int net_set_mtu(struct vhd_dev *dev, uint32_t mtu)
{
    struct vhd_net *net = to_net(dev);

    if (mtu < VIRTIO_NET_MIN_MTU || mtu > VIRTIO_NET_MAX_MTU)
        return -EINVAL;
    vhd_store_relaxed(&net->mtu, (uint16_t)mtu);
    vhd_log(VHD_LOG_INFO, "%s: MTU %u (set by the front-end)", dev->name, mtu);
    return 0;
}

/*
 * VHOST_USER_SEND_RARP: broadcast a RARP for mac, as the guest would after
 * a migration, through the backend (loopback: back to the guest, on pair
 * 0). The transmit worker of pair 0 sends it at its next turn; a write to
 * that ring's kick eventfd makes sure it has one.
 */
static int net_send_rarp(struct vhd_dev *dev, const uint8_t mac[6])
{
    struct vhd_net *net = to_net(dev);

    /*
     * A guest that takes announce requests and whose control queue runs
     * announces itself better than a RARP can (gratuitous ARP and IPv6
     * neighbour advertisements with its addresses, every VLAN).
     */
    if (net->ctrl_seen && net_announce(net, "SEND_RARP") == 0)
        return 0;
    vhd_store_relaxed(&net->rarp_mac, mac_pack(mac));
    /* Only the control thread writes rarp_seq: a plain increment, published with release. */
    vhd_store_release(&net->rarp_seq, net->rarp_seq + 1);
    struct vhd_queue *tx0 = &dev->queues[1];
    if (tx0->started && tx0->kick_fd >= 0)
        (void)vhd_efd_signal(tx0->kick_fd); /* the front-end's eventfd: never blocks (efd.h) */
    vhd_log(VHD_LOG_INFO, "%s: RARP for %02x:%02x:%02x:%02x:%02x:%02x requested", dev->name, mac[0],
            mac[1], mac[2], mac[3], mac[4], mac[5]);
    return 0;
}

/* GET_QUEUE_NUM: queue pairs, as QEMU and DPDK read it for net devices (dev.h). */
static uint64_t net_queue_num(const struct vhd_dev *dev)
{
    return to_cnet(dev)->pairs;
}

const struct vhd_dev_ops vhd_net_ops = {
    .type = "net",
    .features = net_features,
    .set_features = net_set_features,
    .config_size = sizeof(struct virtio_net_config),
    .get_config = net_get_config,
    .set_config = NULL,
    .queue_init = net_queue_init,
    .queue_place = net_queue_place,
    .queue_fini = net_queue_fini,
    .queue_process = net_queue_process,
    .reset = net_reset,
    .set_mtu = net_set_mtu,
    .send_rarp = net_send_rarp,
    .run_disabled = true,
    .dirty_log = true, /* receive frames and control acks: vhd_vq_log_write() */
    .queue_wake_fd = net_queue_wake_fd,
    .queue_num = net_queue_num,
};

bool vhd_dev_is_net(const struct vhd_dev *dev)
{
    return dev && dev->ops == &vhd_net_ops;
}

/* ---- creation, worker map, counters ---- */

int vhd_net_assign_workers(struct vhd_dev *dev, const int *list, unsigned nlist, unsigned nworkers,
                           unsigned *next_rr)
{
    struct vhd_net *net = to_net(dev);
    unsigned rr = next_rr ? *next_rr : 0;

    if (nlist == 0 && nworkers == 0)
        return -EINVAL;
    for (unsigned i = 0; i < nlist; i++)
        if (list[i] < 0)
            return -EINVAL;
    int *map = calloc(dev->num_queues, sizeof(*map));
    if (!map)
        return -ENOMEM;
    for (uint32_t p = 0; p < net->pairs; p++) {
        int w = nlist ? list[p % nlist] : (int)(rr++ % nworkers);
        map[2 * p] = w;
        map[2 * p + 1] = w;
    }
    map[2 * net->pairs] = map[0]; /* the control queue: rare, with pair 0 */
    if (next_rr)
        *next_rr = rr;
    free(dev->queue_worker);
    dev->queue_worker = map;
    return 0;
}

/* Close and free the receive doorbells (rx_doorbell), if any. Control thread. */
static void net_doorbells_free(struct vhd_net *net, uint32_t pairs)
{
    if (!net->rx_doorbell)
        return;
    for (uint32_t p = 0; p < pairs; p++)
        if (net->rx_doorbell[p] >= 0)
            close(net->rx_doorbell[p]);
    free(net->rx_doorbell);
    net->rx_doorbell = NULL;
}

int vhd_net_new(const struct vhd_net_opts *o, struct vhd_dev **out, char *err, size_t errlen)
{
    const struct vhd_net_backend_ops *bops;
    struct vhd_net *net;
    uint32_t pairs, nq, mtu;
    uint8_t mac[6];
    int rc;

    if (err && errlen)
        err[0] = '\0';
    if (!o || !out)
        return vhd_errf(err, errlen, -EINVAL, "no options");
    *out = NULL;
    pairs = o->pairs ? o->pairs : 1;
    if (pairs > VHD_NET_MAX_PAIRS)
        return vhd_errf(err, errlen, -EINVAL, "%u queue pairs: expected 1..%u", pairs,
                        VHD_NET_MAX_PAIRS);
    mtu = o->mtu ? o->mtu : VHD_NET_DEFAULT_MTU;
    if (mtu < VIRTIO_NET_MIN_MTU || mtu > VIRTIO_NET_MAX_MTU)
        return vhd_errf(err, errlen, -EINVAL, "mtu %u: expected %u..%u", mtu, VIRTIO_NET_MIN_MTU,
                        VIRTIO_NET_MAX_MTU);
    if (o->mac) {
        memcpy(mac, o->mac, 6);
        if ((mac[0] & 1) || !(mac[0] | mac[1] | mac[2] | mac[3] | mac[4] | mac[5]))
            return vhd_errf(err, errlen, -EINVAL,
                            "mac %02x:%02x:%02x:%02x:%02x:%02x is not a unicast "
                            "address",
                            mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]);
    } else {
        vhd_net_default_mac(o->name && *o->name ? o->name : "net", mac);
    }
    bops = vhd_net_backend_find(o->backend ? o->backend : "loopback");
    if (!bops)
        return vhd_errf(err, errlen, -EINVAL,
                        "unknown backend '%s' (expected loopback, switch, tap or gen)", o->backend);
    if (o->no_split && !o->allow_packed)
        return vhd_errf(err, errlen, -EINVAL, "split rings refused and packed rings not allowed");

    nq = 2 * pairs + 1;
    net = calloc(1, sizeof(*net));
    if (!net)
        return vhd_errf(err, errlen, -ENOMEM, "out of memory");
    net->dev.queues = aligned_alloc(VHD_CACHELINE, (size_t)nq * sizeof(struct vhd_queue));
    net->totals = calloc(nq, sizeof(*net->totals));
    net->roles = calloc(nq, 1);
    if (!net->dev.queues || !net->totals || !net->roles) {
        rc = vhd_errf(err, errlen, -ENOMEM, "out of memory");
        goto err_free;
    }
    memset(net->dev.queues, 0, (size_t)nq * sizeof(struct vhd_queue));
    snprintf(net->dev.name, sizeof(net->dev.name), "%s", o->name && *o->name ? o->name : "net");
    net->dev.ops = &vhd_net_ops;
    net->dev.num_queues = nq;
    net->dev.allow_split = !o->no_split;
    net->dev.allow_packed = o->allow_packed;
    net->dev.priv = net;
    for (uint32_t i = 0; i < nq; i++) {
        struct vhd_queue *q = &net->dev.queues[i];
        q->index = (uint16_t)i;
        q->dev = &net->dev;
        q->call_fd = -1;
        q->kick_fd = -1;
        q->err_fd = -1;
        q->worker_idx = -1;
    }
    /* Default map: queue q on worker q / 2 (the transport takes it modulo the worker count). */
    net->dev.queue_worker = calloc(nq, sizeof(int));
    if (!net->dev.queue_worker) {
        rc = vhd_errf(err, errlen, -ENOMEM, "out of memory");
        goto err_free;
    }
    for (uint32_t i = 0; i < nq; i++)
        net->dev.queue_worker[i] = (int)(i / 2);

    struct vhd_net_backend_opts bo = {.name = net->dev.name,
                                      .pairs = pairs,
                                      .switch_name = o->switch_name,
                                      .tap_name = o->tap_name};
    rc = bops->open(&bo, &net->dev, &net->be, err, errlen);
    if (rc < 0)
        goto err_free;
    if (net->be->ops->rx_buffers_are_work && !net->be->ops->rx_wake_fd) {
        net->rx_doorbell = malloc(pairs * sizeof(int));
        for (uint32_t p = 0; net->rx_doorbell && p < pairs; p++)
            net->rx_doorbell[p] = -1;
        for (uint32_t p = 0; net->rx_doorbell && p < pairs; p++)
            if ((net->rx_doorbell[p] = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
                rc = vhd_errf(err, errlen, -errno, "eventfd: %s", strerror(errno));
                goto err_close;
            }
        if (!net->rx_doorbell) {
            rc = vhd_errf(err, errlen, -ENOMEM, "out of memory");
            goto err_close;
        }
    }

    net->pairs = pairs;
    net->no_split = o->no_split;
    net->default_mac = mac_pack(mac);
    net->default_mtu = (uint16_t)mtu;
    net->mac = net->default_mac;
    net->mtu = net->default_mtu;
    net->curr_pairs = pairs;
    /*
     * Offered (5.1.3): the datapath features, the control queue with RX
     * mode, MAC address and pair-count commands, the announce handshake,
     * config fields, and the offloads the backend can honour (loopback and
     * switch: CSUM and GUEST_CSUM; tap: also HOST_ and GUEST_TSO4/TSO6/
     * ECN/UFO as far as the kernel takes them, see net_tap.c). IN_ORDER (2.7.9 / 2.8.21 via
     * 6.1): every ring of the device uses its buffers in the order they were
     * made available (transmit pushes in pop order, delivery pops and pushes
     * a packet's buffers in order and gives back what it does not use, the
     * control queue answers in order), and drivers take cheaper paths with
     * it (DPDK's virtio PMD has in-order transmit and receive paths). Not
     * offered: segmentation without a backend that does it (the device
     * never segments), USO, CTRL_VLAN, CTRL_RX_EXTRA,
     * CTRL_GUEST_OFFLOADS, RSS, HASH_REPORT, SPEED_DUPLEX, NOTIFICATION_DATA.
     */
    net->offered = BIT(VIRTIO_F_VERSION_1) | BIT(VIRTIO_F_INDIRECT_DESC) | BIT(VIRTIO_F_EVENT_IDX) |
                   BIT(VIRTIO_NET_F_MRG_RXBUF) | BIT(VIRTIO_NET_F_MQ) | BIT(VIRTIO_NET_F_CTRL_VQ) |
                   BIT(VIRTIO_NET_F_CTRL_RX) | BIT(VIRTIO_NET_F_CTRL_MAC_ADDR) |
                   BIT(VIRTIO_NET_F_GUEST_ANNOUNCE) | BIT(VIRTIO_NET_F_STATUS) |
                   BIT(VIRTIO_NET_F_MAC) | BIT(VIRTIO_NET_F_MTU) | BIT(VIRTIO_F_IN_ORDER) |
                   (net->be->offloads & NET_OFFLOAD_BITS);
    if (o->allow_packed)
        net->offered |= BIT(VIRTIO_F_RING_PACKED);

    vhd_log(VHD_LOG_INFO,
            "%s: virtio-net on %s: %u queue pair%s, mac %02x:%02x:%02x:%02x:%02x:%02x, mtu %u",
            net->dev.name, net->be->desc, pairs, pairs == 1 ? "" : "s", mac[0], mac[1], mac[2],
            mac[3], mac[4], mac[5], mtu);
    *out = &net->dev;
    return 0;

err_close:
    net_doorbells_free(net, pairs);
    net->be->ops->close(net->be);
err_free:
    free(net->dev.queue_worker);
    free(net->dev.queues);
    free(net->totals);
    free(net->roles);
    free(net);
    return rc;
}

void vhd_net_free(struct vhd_dev *dev)
{
    if (!dev)
        return;
    struct vhd_net *net = to_net(dev);
    for (uint32_t i = 0; i < dev->num_queues; i++)
        net_queue_fini(dev, &dev->queues[i]);
    if (net->be)
        net->be->ops->close(net->be);
    net_doorbells_free(net, net->pairs);
    free(dev->queue_worker);
    free(dev->queues);
    free(net->totals);
    free(net->roles);
    free(net);
}

uint32_t vhd_net_pairs(const struct vhd_dev *dev)
{
    return to_cnet(dev)->pairs;
}

uint32_t vhd_net_curr_pairs(const struct vhd_dev *dev)
{
    return vhd_load_relaxed(&to_cnet(dev)->curr_pairs);
}

void vhd_net_get_mac(const struct vhd_dev *dev, uint8_t mac[6])
{
    mac_unpack(vhd_load_relaxed(&to_cnet(dev)->mac), mac);
}

int vhd_net_announce(struct vhd_dev *dev)
{
    return net_announce(to_net(dev), "requested");
}

int vhd_net_queue_stats(const struct vhd_dev *dev, uint32_t q, struct vhd_net_queue_stats *out)
{
    const struct vhd_net *net = to_cnet(dev);

    if (q >= dev->num_queues)
        return -EINVAL;
    *out = net->totals[q];
    const struct net_queue *nq = dev->queues[q].priv;
    if (nq) {
        out->packets += vhd_load_relaxed(&nq->st.packets);
        out->bytes += vhd_load_relaxed(&nq->st.bytes);
        out->drops += vhd_load_relaxed(&nq->st.drops);
        out->errors += vhd_load_relaxed(&nq->st.errors);
        out->buffers += vhd_load_relaxed(&nq->st.buffers);
        uint64_t largest = vhd_load_relaxed(&nq->st.largest);
        out->largest = largest > out->largest ? largest : out->largest;
    }
    return 0;
}

void vhd_net_log_stats(const struct vhd_dev *dev, const char *why)
{
    const struct vhd_net *net = to_cnet(dev);
    struct vhd_net_queue_stats sum[4] = {{0}}; /* by role */
    bool any = false;

    for (uint32_t i = 0; i < dev->num_queues; i++) {
        struct vhd_net_queue_stats st;
        (void)vhd_net_queue_stats(dev, i, &st);
        if (!(st.packets | st.drops | st.errors))
            continue;
        any = true;
        int role = net->roles[i];
        if (role == 0) /* never started: name it by the multiqueue layout */
            role = i == 2 * net->pairs ? NET_Q_CTRL : (i & 1) ? NET_Q_TX : NET_Q_RX;
        vhd_log(VHD_LOG_INFO,
                "%s: stats (%s): queue %u (%s %u): packets=%llu bytes=%llu drops=%llu "
                "errors=%llu buffers=%llu largest=%llu",
                dev->name, why, i, role_names[role], role == NET_Q_CTRL ? 0 : i / 2,
                (unsigned long long)st.packets, (unsigned long long)st.bytes,
                (unsigned long long)st.drops, (unsigned long long)st.errors,
                (unsigned long long)st.buffers, (unsigned long long)st.largest);
        sum[role].packets += st.packets;
        sum[role].bytes += st.bytes;
        sum[role].drops += st.drops;
        sum[role].errors += st.errors;
    }
    if (!any) {
        vhd_log(VHD_LOG_INFO, "%s: stats (%s): no traffic", dev->name, why);
        return;
    }
    vhd_log(VHD_LOG_INFO,
            "%s: stats (%s): total: tx_packets=%llu tx_bytes=%llu tx_drops=%llu tx_errors=%llu "
            "rx_packets=%llu rx_bytes=%llu rx_drops=%llu rx_errors=%llu",
            dev->name, why, (unsigned long long)sum[NET_Q_TX].packets,
            (unsigned long long)sum[NET_Q_TX].bytes, (unsigned long long)sum[NET_Q_TX].drops,
            (unsigned long long)sum[NET_Q_TX].errors, (unsigned long long)sum[NET_Q_RX].packets,
            (unsigned long long)sum[NET_Q_RX].bytes, (unsigned long long)sum[NET_Q_RX].drops,
            (unsigned long long)sum[NET_Q_RX].errors);
}
