/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The public face of the in-process L2 learning switch backend
 * (net_switch.c): per-port counters and a test hook that moves the
 * switch's clock, so MAC ageing can be tested without waiting.
 */
#ifndef VHD_NET_SWITCH_H
#define VHD_NET_SWITCH_H

#include <stdint.h>

#include "runtime/dev.h"

/* Most ports one switch ever has (slots are not reused after a port leaves). */
#define VHD_NET_SWITCH_MAX_PORTS 16u

/*
 * Seconds a learned MAC stays in the table without traffic from it
 * (IEEE 802.1D's default ageing time).
 */
#define VHD_NET_SWITCH_AGEING_S 300u

/*
 * Largest frame the switch carries (bytes from the Ethernet header on):
 * a 1500-byte MTU plus Ethernet header, VLAN tag and 4 bytes of slack.
 * Ring slots are sized for it; larger frames are dropped and counted.
 */
#define VHD_NET_SWITCH_FRAME_MAX 1522u

/*
 * Per-port counters, summed over the port's queue pairs. "in": frames the
 * port's guest sent into the switch; "out": frames delivered to the
 * port's guest. flooded counts frames from this port sent to every other
 * port (broadcast, multicast, unknown unicast); in_drops frames that found
 * a destination ring full or were too large; out_drops frames the port's
 * guest could not take (no receive buffers, receive ring not in use).
 */
struct vhd_net_switch_stats {
    uint64_t in_frames;
    uint64_t in_bytes;
    uint64_t flooded;
    uint64_t in_drops;
    uint64_t out_frames;
    uint64_t out_bytes;
    uint64_t out_drops;
};

/*
 * vhd_net_switch_port_stats - dev's counters as a switch port. Any thread
 * (relaxed loads: a snapshot may be a burst old). -EINVAL when dev is not
 * a net device on the switch backend.
 */
int vhd_net_switch_port_stats(const struct vhd_dev *dev, struct vhd_net_switch_stats *out);

/* Tests only: move every switch's clock forward by seconds (ageing). Any thread. */
void vhd_net_switch_test_advance(uint32_t seconds);

#endif /* VHD_NET_SWITCH_H */
