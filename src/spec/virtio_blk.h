/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * virtio-blk wire format (virtio 1.2, section 5.2): feature bits, the
 * configuration space layout, the request header, request types, status
 * values and the discard / write-zeroes segment. All multi-byte fields are
 * little-endian (virtio 1.x); read and write them through vhd_le16/32/64.
 */
#ifndef VHD_VIRTIO_BLK_H
#define VHD_VIRTIO_BLK_H

#include <stddef.h>
#include <stdint.h>

/* Device ID (5.2.1). */
#define VIRTIO_ID_BLOCK 2

/* Feature bits (5.2.3). */
#define VIRTIO_BLK_F_SIZE_MAX     1  /* size_max is valid */
#define VIRTIO_BLK_F_SEG_MAX      2  /* seg_max is valid */
#define VIRTIO_BLK_F_GEOMETRY     4  /* geometry is valid (not offered) */
#define VIRTIO_BLK_F_RO           5  /* device is read-only */
#define VIRTIO_BLK_F_BLK_SIZE     6  /* blk_size is valid */
#define VIRTIO_BLK_F_FLUSH        9  /* VIRTIO_BLK_T_FLUSH supported */
#define VIRTIO_BLK_F_TOPOLOGY     10 /* topology is valid */
#define VIRTIO_BLK_F_CONFIG_WCE   11 /* writeback is writable */
#define VIRTIO_BLK_F_MQ           12 /* num_queues is valid */
#define VIRTIO_BLK_F_DISCARD      13 /* VIRTIO_BLK_T_DISCARD supported */
#define VIRTIO_BLK_F_WRITE_ZEROES 14 /* VIRTIO_BLK_T_WRITE_ZEROES supported */
#define VIRTIO_BLK_F_LIFETIME     15 /* not offered */
#define VIRTIO_BLK_F_SECURE_ERASE 16 /* not offered */

/* Requests are always in 512-byte units, whatever blk_size says (5.2.5). */
#define VIRTIO_BLK_SECTOR_SHIFT 9
#define VIRTIO_BLK_SECTOR_SIZE  512u

/*
 * Configuration space (5.2.4), up to and including the secure-erase fields
 * of virtio 1.2. Front-ends size their GET_CONFIG by the features they know
 * (QEMU: up to write_zeroes_may_unmap, 57 bytes, with DISCARD and
 * WRITE_ZEROES); every byte of this struct is readable.
 */
struct virtio_blk_geometry {
    uint16_t cylinders;
    uint8_t heads;
    uint8_t sectors;
};

struct virtio_blk_topology {
    uint8_t physical_block_exp; /* log2(physical block / logical block) */
    uint8_t alignment_offset;   /* offset of the first aligned logical block */
    uint16_t min_io_size;       /* suggested minimum I/O size, in logical blocks */
    uint32_t opt_io_size;       /* optimal (suggested maximum) I/O size, in logical blocks */
};

struct virtio_blk_config {
    uint64_t capacity; /* in 512-byte sectors */
    uint32_t size_max; /* largest single segment, bytes (SIZE_MAX) */
    uint32_t seg_max;  /* most data segments per request (SEG_MAX) */
    struct virtio_blk_geometry geometry;
    uint32_t blk_size; /* logical block size, bytes (BLK_SIZE) */
    struct virtio_blk_topology topology;
    uint8_t writeback; /* 1: writeback cache, 0: writethrough (CONFIG_WCE) */
    uint8_t unused0;
    uint16_t num_queues; /* MQ */
    uint32_t max_discard_sectors;
    uint32_t max_discard_seg;
    uint32_t discard_sector_alignment;
    uint32_t max_write_zeroes_sectors;
    uint32_t max_write_zeroes_seg;
    uint8_t write_zeroes_may_unmap;
    uint8_t unused1[3];
    uint32_t max_secure_erase_sectors;
    uint32_t max_secure_erase_seg;
    uint32_t secure_erase_sector_alignment;
};

_Static_assert(sizeof(struct virtio_blk_geometry) == 4, "geometry is 4 bytes");
_Static_assert(sizeof(struct virtio_blk_topology) == 8, "topology is 8 bytes");
_Static_assert(offsetof(struct virtio_blk_config, capacity) == 0, "capacity at 0");
_Static_assert(offsetof(struct virtio_blk_config, size_max) == 8, "size_max at 8");
_Static_assert(offsetof(struct virtio_blk_config, seg_max) == 12, "seg_max at 12");
_Static_assert(offsetof(struct virtio_blk_config, geometry) == 16, "geometry at 16");
_Static_assert(offsetof(struct virtio_blk_config, blk_size) == 20, "blk_size at 20");
_Static_assert(offsetof(struct virtio_blk_config, topology) == 24, "topology at 24");
_Static_assert(offsetof(struct virtio_blk_config, writeback) == 32, "writeback at 32");
_Static_assert(offsetof(struct virtio_blk_config, num_queues) == 34, "num_queues at 34");
_Static_assert(offsetof(struct virtio_blk_config, max_discard_sectors) == 36, "at 36");
_Static_assert(offsetof(struct virtio_blk_config, max_discard_seg) == 40, "at 40");
_Static_assert(offsetof(struct virtio_blk_config, discard_sector_alignment) == 44, "at 44");
_Static_assert(offsetof(struct virtio_blk_config, max_write_zeroes_sectors) == 48, "at 48");
_Static_assert(offsetof(struct virtio_blk_config, max_write_zeroes_seg) == 52, "at 52");
_Static_assert(offsetof(struct virtio_blk_config, write_zeroes_may_unmap) == 56, "at 56");
_Static_assert(offsetof(struct virtio_blk_config, max_secure_erase_sectors) == 60, "at 60");
_Static_assert(offsetof(struct virtio_blk_config, secure_erase_sector_alignment) == 68, "at 68");
_Static_assert(sizeof(struct virtio_blk_config) == 72, "virtio 1.2 blk config is 72 bytes");

/* Request types (5.2.6). */
#define VIRTIO_BLK_T_IN           0
#define VIRTIO_BLK_T_OUT          1
#define VIRTIO_BLK_T_FLUSH        4
#define VIRTIO_BLK_T_GET_ID       8
#define VIRTIO_BLK_T_GET_LIFETIME 10 /* answered UNSUPP: LIFETIME not offered */
#define VIRTIO_BLK_T_DISCARD      11
#define VIRTIO_BLK_T_WRITE_ZEROES 13
#define VIRTIO_BLK_T_SECURE_ERASE 14 /* answered UNSUPP: SECURE_ERASE not offered */

/* Length of the GET_ID answer: a NUL-padded string, no terminator at 20 bytes (5.2.6). */
#define VIRTIO_BLK_ID_BYTES 20

/* Status byte values (5.2.6). */
#define VIRTIO_BLK_S_OK     0
#define VIRTIO_BLK_S_IOERR  1
#define VIRTIO_BLK_S_UNSUPP 2

/* The device-readable header that starts every request (5.2.6, struct virtio_blk_req). */
struct virtio_blk_outhdr {
    uint32_t type;     /* VIRTIO_BLK_T_* */
    uint32_t reserved; /* legacy: ioprio; ignored */
    uint64_t sector;   /* offset in 512-byte units (IN, OUT) */
};
_Static_assert(sizeof(struct virtio_blk_outhdr) == 16, "request header is 16 bytes");

/* One segment of a DISCARD or WRITE_ZEROES request's data (5.2.6). */
#define VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP 1u /* write zeroes: the range may be deallocated */

struct virtio_blk_discard_write_zeroes {
    uint64_t sector;
    uint32_t num_sectors;
    uint32_t flags; /* bit 0 unmap, bits 1..31 reserved */
};
_Static_assert(sizeof(struct virtio_blk_discard_write_zeroes) == 16, "segment is 16 bytes");

#endif /* VHD_VIRTIO_BLK_H */
