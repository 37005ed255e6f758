/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the parts of vhostd-bench share: the options of its blk run
 * (bench_blk.c) and of its net run (bench_net.c), parsed in bench_opts.c,
 * and the entry point of each run (main in vhostd-bench.c picks one).
 */
#ifndef VHD_BENCH_H
#define VHD_BENCH_H

#include <stdbool.h>
#include <stdint.h>

enum rw_mode { RW_READ, RW_WRITE, RW_RANDREAD, RW_RANDWRITE, RW_RANDRW, RW_RW, RW_NMODES };

/* --rw spellings, by enum rw_mode. */
extern const char *const rw_names[RW_NMODES];

/* The blk run's options (vhostd-bench [options]). */
struct blk_opts {
    const char *socket;
    enum rw_mode rw;
    unsigned rwmixread; /* percent of reads in mixed modes */
    uint64_t bs;
    unsigned iodepth;
    unsigned numjobs;
    double runtime;      /* seconds; 0: not time-bound */
    uint64_t number_ios; /* per job; 0: not count-bound */
    uint64_t offset;     /* start of the range */
    uint64_t size;       /* length of the range; 0: to the end of the device */
    bool packed;
    unsigned queue_size; /* 0: default */
    bool interrupt;      /* completion by the call eventfd instead of polling */
    bool verify;
    bool json;
    int indirect; /* -1 auto, 0 off, 1 on */
    uint64_t seed;
    uint64_t iommu_page;   /* --iommu[=SIZE]: the driver is the IOMMU (0: off) */
    bool iommu_strict;     /* --iommu-strict */
    unsigned iommu_batch;  /* --iommu-batch=N (0: the driver's default) */
    bool iommu_exact;      /* --iommu-exact: data mapped RO/WO as the device uses it */
    uint64_t iommu_static; /* --iommu-static[=SIZE]: pools mapped for good (1: no SIZE) */
};

enum net_mode { NET_TX, NET_RX, NET_ECHO, NET_NMODES };

/* --mode spellings, by enum net_mode. */
extern const char *const net_mode_names[NET_NMODES];

/* The net run's options (vhostd-bench net [options]). */
struct net_opts {
    const char *socket;
    enum net_mode mode;
    unsigned size; /* frame bytes, virtio header excluded */
    unsigned pairs;
    double runtime;
    bool packed;
    bool mrg;
    bool no_in_order; /* --in-order=0 */
    unsigned queue_size;
    unsigned burst;
    bool interrupt;
    bool json;
    uint64_t iommu_page; /* --iommu[=SIZE] (0: off) */
    bool iommu_strict;
    unsigned iommu_batch;
    bool iommu_exact;
    bool iommu_static; /* --iommu-static */
};

#define NET_MIN_FRAME 14u   /* an Ethernet header */
#define NET_MAX_FRAME 9014u /* a jumbo frame; TX slots are sized to --size */
#define NET_MAX_BURST 256u

/*
 * --iommu[=SIZE]: the IOMMU page size, 4k when no SIZE is given; a power of
 * two from 4k to 1g. 0 or -1.
 */
int bench_parse_iommu(const char *a, uint64_t *page);

/*
 * Parse argv into o (defaults first). 0, or -1 with the message and the usage
 * on stderr; --help prints the usage on stdout and exits 0.
 */
int bench_blk_parse_opts(int argc, char **argv, struct blk_opts *o);
/* Same for the net run; argv[0] is "net". */
int bench_net_parse_opts(int argc, char **argv, struct net_opts *o);

/*
 * Run a benchmark from its command line and print its results: the exit
 * status (0 ok, 1 the run or the device failed, 2 bad options).
 */
int bench_blk_main(int argc, char **argv);
int bench_net_main(int argc, char **argv);

#endif /* VHD_BENCH_H */
