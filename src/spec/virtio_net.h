/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * virtio-net wire format (virtio 1.2, section 5.1): feature bits, the
 * configuration space, the per-packet header and the control virtqueue's
 * classes, commands and payloads. All multi-byte fields are little-endian
 * (virtio 1.x); read and write them through vhd_le16/32/64.
 */
#ifndef VHD_VIRTIO_NET_H
#define VHD_VIRTIO_NET_H

#include <stddef.h>
#include <stdint.h>

/* Device ID (5.1.1). */
#define VIRTIO_ID_NET 1

/* Feature bits (5.1.3). */
#define VIRTIO_NET_F_CSUM                0  /* device handles packets with partial checksum */
#define VIRTIO_NET_F_GUEST_CSUM          1  /* driver handles packets with partial checksum */
#define VIRTIO_NET_F_CTRL_GUEST_OFFLOADS 2  /* control channel offloads reconfiguration */
#define VIRTIO_NET_F_MTU                 3  /* mtu in config space is valid */
#define VIRTIO_NET_F_MAC                 5  /* mac in config space is valid */
#define VIRTIO_NET_F_GUEST_TSO4          7  /* driver can receive TSOv4 */
#define VIRTIO_NET_F_GUEST_TSO6          8  /* driver can receive TSOv6 */
#define VIRTIO_NET_F_GUEST_ECN           9  /* driver can receive TSO with ECN */
#define VIRTIO_NET_F_GUEST_UFO           10 /* driver can receive UFO */
#define VIRTIO_NET_F_HOST_TSO4           11 /* device can receive TSOv4 */
#define VIRTIO_NET_F_HOST_TSO6           12 /* device can receive TSOv6 */
#define VIRTIO_NET_F_HOST_ECN            13 /* device can receive TSO with ECN */
#define VIRTIO_NET_F_HOST_UFO            14 /* device can receive UFO */
#define VIRTIO_NET_F_MRG_RXBUF           15 /* driver can merge receive buffers */
#define VIRTIO_NET_F_STATUS              16 /* status in config space is valid */
#define VIRTIO_NET_F_CTRL_VQ             17 /* control channel is available */
#define VIRTIO_NET_F_CTRL_RX             18 /* control channel RX mode support */
#define VIRTIO_NET_F_CTRL_VLAN           19 /* control channel VLAN filtering */
#define VIRTIO_NET_F_CTRL_RX_EXTRA       20 /* extra RX mode control support */
#define VIRTIO_NET_F_GUEST_ANNOUNCE      21 /* driver can send gratuitous packets */
#define VIRTIO_NET_F_MQ                  22 /* multiqueue with automatic receive steering */
#define VIRTIO_NET_F_CTRL_MAC_ADDR       23 /* set MAC address through the control channel */
#define VIRTIO_NET_F_HASH_REPORT         57 /* not offered: the header would be 20 bytes */
#define VIRTIO_NET_F_RSS                 60 /* not offered */
#define VIRTIO_NET_F_SPEED_DUPLEX        63 /* not offered: speed/duplex stay "unknown" */

/* status bits (5.1.4). */
#define VIRTIO_NET_S_LINK_UP  1
#define VIRTIO_NET_S_ANNOUNCE 2

/* max_virtqueue_pairs range (5.1.4.1: 1..0x8000). */
#define VIRTIO_NET_CTRL_MQ_VQ_PAIRS_MIN 1
#define VIRTIO_NET_CTRL_MQ_VQ_PAIRS_MAX 0x8000

/* mtu range the device may advertise (5.1.4.1: 68..65535). */
#define VIRTIO_NET_MIN_MTU 68
#define VIRTIO_NET_MAX_MTU 65535

/* speed and duplex when SPEED_DUPLEX is not offered (5.1.4: unknown). */
#define VIRTIO_NET_SPEED_UNKNOWN  0xffffffffu
#define VIRTIO_NET_DUPLEX_UNKNOWN 0xff

/*
 * Configuration space (5.1.4), virtio 1.2. Every byte of it is readable;
 * a field is meaningful only with its feature (mac: MAC, status: STATUS,
 * max_virtqueue_pairs: MQ, mtu: MTU, speed/duplex: SPEED_DUPLEX, rss_*:
 * RSS or HASH_REPORT).
 */
struct virtio_net_config {
    uint8_t mac[6];
    uint16_t status;
    uint16_t max_virtqueue_pairs;
    uint16_t mtu;
    uint32_t speed;
    uint8_t duplex;
    uint8_t rss_max_key_size;
    uint16_t rss_max_indirection_table_length;
    uint32_t supported_hash_types;
};
_Static_assert(offsetof(struct virtio_net_config, mac) == 0, "mac at 0");
_Static_assert(offsetof(struct virtio_net_config, status) == 6, "status at 6");
_Static_assert(offsetof(struct virtio_net_config, max_virtqueue_pairs) == 8, "pairs at 8");
_Static_assert(offsetof(struct virtio_net_config, mtu) == 10, "mtu at 10");
_Static_assert(offsetof(struct virtio_net_config, speed) == 12, "speed at 12");
_Static_assert(offsetof(struct virtio_net_config, duplex) == 16, "duplex at 16");
_Static_assert(offsetof(struct virtio_net_config, rss_max_key_size) == 17, "at 17");
_Static_assert(offsetof(struct virtio_net_config, rss_max_indirection_table_length) == 18, "at 18");
_Static_assert(offsetof(struct virtio_net_config, supported_hash_types) == 20, "at 20");
_Static_assert(sizeof(struct virtio_net_config) == 24, "virtio 1.2 net config is 24 bytes");

/* virtio_net_hdr flags (5.1.6). */
#define VIRTIO_NET_HDR_F_NEEDS_CSUM 1 /* csum_start/csum_offset are valid */
#define VIRTIO_NET_HDR_F_DATA_VALID 2 /* RX only: checksum already validated */
#define VIRTIO_NET_HDR_F_RSC_INFO   4 /* RX only, RSC_EXT: coalescing info */

/* virtio_net_hdr gso_type (5.1.6). */
#define VIRTIO_NET_HDR_GSO_NONE   0
#define VIRTIO_NET_HDR_GSO_TCPV4  1
#define VIRTIO_NET_HDR_GSO_UDP    3
#define VIRTIO_NET_HDR_GSO_TCPV6  4
#define VIRTIO_NET_HDR_GSO_UDP_L4 5
#define VIRTIO_NET_HDR_GSO_ECN    0x80

/*
 * The header in front of every packet on the receive and transmit queues
 * (5.1.6, struct virtio_net_hdr). With VIRTIO_F_VERSION_1 it always has
 * num_buffers (12 bytes), whether or not MRG_RXBUF is negotiated; the
 * 20-byte HASH_REPORT form is not used (the feature is not offered).
 */
struct virtio_net_hdr_v1 {
    uint8_t flags;        /* VIRTIO_NET_HDR_F_* */
    uint8_t gso_type;     /* VIRTIO_NET_HDR_GSO_* */
    uint16_t hdr_len;     /* length of the headers (GSO hint) */
    uint16_t gso_size;    /* bytes of payload per segment (GSO) */
    uint16_t csum_start;  /* NEEDS_CSUM: checksum from this offset... */
    uint16_t csum_offset; /* ...stored at csum_start + csum_offset */
    uint16_t num_buffers; /* RX: buffers the packet spans (1 without MRG_RXBUF); TX: 0 */
};
_Static_assert(sizeof(struct virtio_net_hdr_v1) == 12, "virtio 1.x net header is 12 bytes");
_Static_assert(offsetof(struct virtio_net_hdr_v1, num_buffers) == 10, "num_buffers at 10");

/* ---- control virtqueue (5.1.6.5) ---- */

/* The device-readable command header; the ack byte is the first device-writable byte. */
struct virtio_net_ctrl_hdr {
    uint8_t cls; /* class (a C++ keyword, hence the name) */
    uint8_t cmd;
};
_Static_assert(sizeof(struct virtio_net_ctrl_hdr) == 2, "control header is 2 bytes");

/* ack values */
#define VIRTIO_NET_OK  0
#define VIRTIO_NET_ERR 1

/* Packet receive filtering (5.1.6.5.1): u8 on/off. NOMULTI.. need CTRL_RX_EXTRA. */
#define VIRTIO_NET_CTRL_RX          0
#define VIRTIO_NET_CTRL_RX_PROMISC  0
#define VIRTIO_NET_CTRL_RX_ALLMULTI 1
#define VIRTIO_NET_CTRL_RX_ALLUNI   2
#define VIRTIO_NET_CTRL_RX_NOMULTI  3
#define VIRTIO_NET_CTRL_RX_NOUNI    4
#define VIRTIO_NET_CTRL_RX_NOBCAST  5

/*
 * MAC address filtering (5.1.6.5.2). TABLE_SET (needs CTRL_RX): two tables,
 * unicast then multicast, each a le32 entry count followed by that many
 * 6-byte addresses. ADDR_SET (needs CTRL_MAC_ADDR): one 6-byte address.
 */
#define VIRTIO_NET_CTRL_MAC           1
#define VIRTIO_NET_CTRL_MAC_TABLE_SET 0
#define VIRTIO_NET_CTRL_MAC_ADDR_SET  1

/* VLAN filtering (5.1.6.5.3, CTRL_VLAN: not offered). */
#define VIRTIO_NET_CTRL_VLAN     2
#define VIRTIO_NET_CTRL_VLAN_ADD 0
#define VIRTIO_NET_CTRL_VLAN_DEL 1

/* Gratuitous packet sending (5.1.6.5.4, GUEST_ANNOUNCE): no data. */
#define VIRTIO_NET_CTRL_ANNOUNCE     3
#define VIRTIO_NET_CTRL_ANNOUNCE_ACK 0

/* Multiqueue (5.1.6.5.5): VQ_PAIRS_SET takes a le16 pair count. RSS/HASH: not offered. */
#define VIRTIO_NET_CTRL_MQ              4
#define VIRTIO_NET_CTRL_MQ_VQ_PAIRS_SET 0
#define VIRTIO_NET_CTRL_MQ_RSS_CONFIG   1
#define VIRTIO_NET_CTRL_MQ_HASH_CONFIG  2

struct virtio_net_ctrl_mq {
    uint16_t virtqueue_pairs;
};
_Static_assert(sizeof(struct virtio_net_ctrl_mq) == 2, "VQ_PAIRS_SET data is 2 bytes");

/* Offloads state configuration (CTRL_GUEST_OFFLOADS: not offered). */
#define VIRTIO_NET_CTRL_GUEST_OFFLOADS     5
#define VIRTIO_NET_CTRL_GUEST_OFFLOADS_SET 0

/* ---- Ethernet, as far as the device needs it ---- */

#define VHD_ETH_ALEN     6
#define VHD_ETH_HLEN     14 /* destination, source, ethertype */
#define VHD_ETH_VLAN_LEN 4  /* an 802.1Q tag */
#define VHD_ETH_P_RARP   0x8035

#endif /* VHD_VIRTIO_NET_H */
