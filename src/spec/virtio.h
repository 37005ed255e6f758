/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Virtio wire format: feature bits, device status bits, and the split and
 * packed ring layouts (virtio 1.2, sections 2.7 and 2.8). All fields are
 * little-endian; read them through vhd_le16/32/64.
 */
#ifndef VHD_VIRTIO_H
#define VHD_VIRTIO_H

#include <stdint.h>

/* Transport-independent feature bits (virtio 1.2, 6). */
#define VIRTIO_F_INDIRECT_DESC     28
#define VIRTIO_F_EVENT_IDX         29
#define VIRTIO_F_VERSION_1         32
#define VIRTIO_F_ACCESS_PLATFORM   33 /* a.k.a. IOMMU_PLATFORM */
#define VIRTIO_F_RING_PACKED       34
#define VIRTIO_F_IN_ORDER          35
#define VIRTIO_F_NOTIFICATION_DATA 38

/* Device status (virtio 1.2, 2.1). */
#define VIRTIO_STATUS_ACKNOWLEDGE 1
#define VIRTIO_STATUS_DRIVER      2
#define VIRTIO_STATUS_DRIVER_OK   4
#define VIRTIO_STATUS_FEATURES_OK 8
#define VIRTIO_STATUS_NEEDS_RESET 64
#define VIRTIO_STATUS_FAILED      128

/* Largest queue size either layout allows (2.7 and 2.8: at most 32768). */
#define VHD_VQ_MAX_SIZE 32768u

/* Descriptor flags, common to both layouts (2.7.5, 2.8.?). */
#define VRING_DESC_F_NEXT     1
#define VRING_DESC_F_WRITE    2
#define VRING_DESC_F_INDIRECT 4

/* ---- split ring (2.7) ---- */

struct vhd_vring_desc {
    uint64_t addr;  /* guest-physical address */
    uint32_t len;   /* length in bytes */
    uint16_t flags; /* VRING_DESC_F_* */
    uint16_t next;  /* next descriptor index when F_NEXT */
};
_Static_assert(sizeof(struct vhd_vring_desc) == 16, "split descriptor is 16 bytes");

#define VRING_AVAIL_F_NO_INTERRUPT 1

/* Followed by uint16_t used_event when VIRTIO_F_EVENT_IDX is negotiated. */
struct vhd_vring_avail {
    uint16_t flags;
    uint16_t idx;
    uint16_t ring[];
};
_Static_assert(sizeof(struct vhd_vring_avail) == 4, "avail header is 4 bytes");

#define VRING_USED_F_NO_NOTIFY 1

struct vhd_vring_used_elem {
    uint32_t id;  /* head index of the chain */
    uint32_t len; /* bytes written into device-writable buffers */
};
_Static_assert(sizeof(struct vhd_vring_used_elem) == 8, "used element is 8 bytes");

/* Followed by uint16_t avail_event when VIRTIO_F_EVENT_IDX is negotiated. */
struct vhd_vring_used {
    uint16_t flags;
    uint16_t idx;
    struct vhd_vring_used_elem ring[];
};
_Static_assert(sizeof(struct vhd_vring_used) == 4, "used header is 4 bytes");

/* Byte sizes of the split ring parts for a queue of num entries (2.7). */
static inline uint64_t vhd_vring_desc_size(uint32_t num)
{
    return 16ull * num;
}
static inline uint64_t vhd_vring_avail_size(uint32_t num)
{
    return 4 + 2ull * num + 2; /* including used_event */
}
static inline uint64_t vhd_vring_used_size(uint32_t num)
{
    return 4 + 8ull * num + 2; /* including avail_event */
}

/*
 * The spec's vring_need_event (2.7.10): true when event_idx lies in the
 * half-open window (old, new] of indices just published, modulo 2^16.
 */
static inline int vhd_vring_need_event(uint16_t event_idx, uint16_t new_idx, uint16_t old)
{
    return (uint16_t)(new_idx - event_idx - 1) < (uint16_t)(new_idx - old);
}

/* ---- packed ring (2.8) ---- */

#define VRING_PACKED_DESC_F_AVAIL (1u << 7)
#define VRING_PACKED_DESC_F_USED  (1u << 15)

struct vhd_vring_packed_desc {
    uint64_t addr;
    uint32_t len;
    uint16_t id;    /* buffer id, taken from the last descriptor of a chain */
    uint16_t flags; /* VRING_DESC_F_* | AVAIL | USED */
};
_Static_assert(sizeof(struct vhd_vring_packed_desc) == 16, "packed descriptor is 16 bytes");

#define VRING_PACKED_EVENT_FLAG_ENABLE  0
#define VRING_PACKED_EVENT_FLAG_DISABLE 1
#define VRING_PACKED_EVENT_FLAG_DESC    2
#define VRING_PACKED_EVENT_WRAP_SHIFT   15

/* Event suppression structure (2.8.14): driver area and device area. */
struct vhd_vring_packed_event {
    uint16_t off_wrap; /* bits 0..14 descriptor offset, bit 15 wrap counter */
    uint16_t flags;    /* VRING_PACKED_EVENT_FLAG_* */
};
_Static_assert(sizeof(struct vhd_vring_packed_event) == 4, "event suppression is 4 bytes");

#endif /* VHD_VIRTIO_H */
