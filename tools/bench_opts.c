/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd-bench's command lines: the blk run's options (fio's names) and the
 * net run's, their usage texts and their checks. The values both take the
 * same way are parsed by bench_report.c's helpers.
 */
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "bench_report.h"
#include "util/parse.h"
#include "vhostd/net_driver.h"

const char *const rw_names[RW_NMODES] = {"read", "write", "randread", "randwrite", "randrw", "rw"};
const char *const net_mode_names[NET_NMODES] = {"tx", "rx", "echo"};

int bench_parse_iommu(const char *a, uint64_t *page)
{
    uint64_t v = 4096;
    if (a && (vhd_parse_size(a, &v) || v < 4096 || v > (1ull << 30) || (v & (v - 1))))
        return -1;
    *page = v;
    return 0;
}

/* ======================= blk ======================= */

static void usage(FILE *f)
{
    fputs(
        "usage: vhostd-bench --socket=PATH [options]\n"
        "       vhostd-bench net --socket=PATH [options]   (packet rate; net --help)\n"
        "\n"
        "  --socket=PATH          vhost-user-blk socket of the back-end (required)\n"
        "  --rw=MODE              read | write | randread (default) | randwrite | randrw | rw\n"
        "  --rwmixread=PCT        reads in randrw/rw, percent (default 50)\n"
        "  --bs=SIZE              block size, multiple of 512 (default 4k)\n"
        "  --iodepth=N            requests in flight per job (default 1)\n"
        "  --numjobs=N            threads, each with its own queue (default 1)\n"
        "  --runtime=SECONDS      run for this long\n"
        "  --number_ios=N         I/Os per job (default without --runtime: one pass of the range)\n"
        "  --offset=SIZE          start of the range (default 0)\n"
        "  --size=SIZE            length of the range (default: to the end); split between jobs\n"
        "  --ring=split|packed    ring layout (default split)\n"
        "  --queue-size=N         ring entries (default 256, more when iodepth needs it)\n"
        "  --completion=poll|interrupt  busy-poll the used ring (default) or sleep on the\n"
        "                         call eventfd\n"
        "  --indirect=0|1         indirect descriptors when offered (default 1)\n"
        "  --verify=0|1           stamp written blocks (offset, generation, seed) and check them\n"
        "                         when read; write workloads end with a read-back of every\n"
        "                         written block. With read-only workloads, checks blocks\n"
        "                         written by an earlier --verify=1 run with the same --bs\n"
        "  --verify_seed=N        seed of the stamps (default: from the clock)\n"
        "  --json                 print the results as one JSON object on stdout\n"
        "  --iommu[=SIZE]         act as the device's IOMMU (VIRTIO_F_ACCESS_PLATFORM): map\n"
        "                         rings and buffers at IOVAs with IOTLB messages, pages of SIZE\n"
        "                         (default 4k; 2m for huge pages); the back-end must support it\n"
        "  --iommu-strict         invalidate each buffer when its request completes and wait for\n"
        "                         the ack (default lazy: invalidations batched)\n"
        "  --iommu-batch=N        lazy: unmaps per batch of invalidations (default 32)\n"
        "  --iommu-exact          map data read-only for writes, write-only for reads (default\n"
        "                         read-write)\n"
        "  --iommu-static[=SIZE]  map each queue's buffer pool once, one IOTLB entry per IOMMU\n"
        "                         page, and keep it mapped (no message per I/O); SIZE: the pool\n"
        "                         per job (e.g. 1g: 262144 entries of 4k)\n"
        "  --help\n"
        "\n"
        "SIZE accepts k, m, g, t suffixes (powers of 1024).\n",
        f);
}

int bench_blk_parse_opts(int argc, char **argv, struct blk_opts *o)
{
    enum {
        O_SOCKET = 256,
        O_RW,
        O_MIX,
        O_BS,
        O_DEPTH,
        O_JOBS,
        O_RUNTIME,
        O_NIOS,
        O_OFFSET,
        O_SIZE,
        O_RING,
        O_QSIZE,
        O_COMPL,
        O_VERIFY,
        O_VSEED,
        O_JSON,
        O_INDIRECT,
        O_IOMMU,
        O_IOMMU_STRICT,
        O_IOMMU_BATCH,
        O_IOMMU_EXACT,
        O_IOMMU_STATIC,
        O_HELP
    };
    static const struct option lo[] = {
        {"socket", required_argument, 0, O_SOCKET},
        {"rw", required_argument, 0, O_RW},
        {"readwrite", required_argument, 0, O_RW},
        {"rwmixread", required_argument, 0, O_MIX},
        {"bs", required_argument, 0, O_BS},
        {"iodepth", required_argument, 0, O_DEPTH},
        {"numjobs", required_argument, 0, O_JOBS},
        {"runtime", required_argument, 0, O_RUNTIME},
        {"number_ios", required_argument, 0, O_NIOS},
        {"offset", required_argument, 0, O_OFFSET},
        {"size", required_argument, 0, O_SIZE},
        {"ring", required_argument, 0, O_RING},
        {"queue-size", required_argument, 0, O_QSIZE},
        {"queue_size", required_argument, 0, O_QSIZE},
        {"completion", required_argument, 0, O_COMPL},
        {"verify", required_argument, 0, O_VERIFY},
        {"verify_seed", required_argument, 0, O_VSEED},
        {"json", no_argument, 0, O_JSON},
        {"indirect", required_argument, 0, O_INDIRECT},
        {"iommu", optional_argument, 0, O_IOMMU},
        {"iommu-strict", no_argument, 0, O_IOMMU_STRICT},
        {"iommu-batch", required_argument, 0, O_IOMMU_BATCH},
        {"iommu-exact", no_argument, 0, O_IOMMU_EXACT},
        {"iommu-static", optional_argument, 0, O_IOMMU_STATIC},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    uint64_t v;
    int c;

    memset(o, 0, sizeof(*o));
    o->rw = RW_RANDREAD;
    o->rwmixread = 50;
    o->bs = 4096;
    o->iodepth = 1;
    o->numjobs = 1;
    o->indirect = -1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o->seed = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec;

    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case O_SOCKET:
            o->socket = a;
            break;
        case O_RW: {
            size_t i;
            for (i = 0; i < sizeof(rw_names) / sizeof(rw_names[0]); i++)
                if (!strcmp(a, rw_names[i]))
                    break;
            if (!strcmp(a, "readwrite"))
                i = RW_RW;
            if (i == sizeof(rw_names) / sizeof(rw_names[0])) {
                fprintf(stderr, "vhostd-bench: --rw=%s: unknown mode\n", a);
                return -1;
            }
            o->rw = (enum rw_mode)i;
            break;
        }
        case O_MIX:
            if (bench_parse_uint(a, 0, 100, &v))
                goto bad;
            o->rwmixread = (unsigned)v;
            break;
        case O_BS:
            if (vhd_parse_size(a, &o->bs) || o->bs == 0 || o->bs % 512 || o->bs > (64u << 20))
                goto bad;
            break;
        case O_DEPTH:
            if (bench_parse_uint(a, 1, 32768, &v))
                goto bad;
            o->iodepth = (unsigned)v;
            break;
        case O_JOBS:
            if (bench_parse_uint(a, 1, 64, &v))
                goto bad;
            o->numjobs = (unsigned)v;
            break;
        case O_RUNTIME:
            if (bench_parse_runtime(a, &o->runtime))
                goto bad;
            break;
        case O_NIOS:
            if (vhd_parse_size(a, &o->number_ios) || o->number_ios == 0)
                goto bad;
            break;
        case O_OFFSET:
            if (vhd_parse_size(a, &o->offset) || o->offset % 512)
                goto bad;
            break;
        case O_SIZE:
            if (vhd_parse_size(a, &o->size) || o->size == 0)
                goto bad;
            break;
        case O_RING:
            if (bench_parse_ring(a, &o->packed))
                goto bad;
            break;
        case O_QSIZE:
            if (bench_parse_uint(a, 1, 32768, &v))
                goto bad;
            o->queue_size = (unsigned)v;
            break;
        case O_COMPL:
            if (bench_parse_completion(a, &o->interrupt))
                goto bad;
            break;
        case O_VERIFY:
            if (bench_parse_uint(a, 0, 1, &v))
                goto bad;
            o->verify = v;
            break;
        case O_VSEED:
            if (bench_parse_uint(a, 0, UINT64_MAX, &o->seed))
                goto bad;
            break;
        case O_JSON:
            o->json = true;
            break;
        case O_INDIRECT:
            if (bench_parse_uint(a, 0, 1, &v))
                goto bad;
            o->indirect = (int)v;
            break;
        case O_IOMMU:
            if (bench_parse_iommu(a, &o->iommu_page))
                goto bad;
            break;
        case O_IOMMU_STRICT:
            o->iommu_strict = true;
            break;
        case O_IOMMU_EXACT:
            o->iommu_exact = true;
            break;
        case O_IOMMU_STATIC:
            o->iommu_static = 1;
            if (a && (vhd_parse_size(a, &o->iommu_static) || o->iommu_static == 0))
                goto bad;
            break;
        case O_IOMMU_BATCH:
            if (bench_parse_uint(a, 1, 1u << 20, &v))
                goto bad;
            o->iommu_batch = (unsigned)v;
            break;
        case O_HELP:
        case 'h':
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
        continue;
    bad:
        return bench_bad_value("vhostd-bench", lo, c, a);
    }
    return bench_check_rest("vhostd-bench", argc, argv, o->socket);
}

/* ======================= net ======================= */

static void net_usage(FILE *f)
{
    fputs(
        "usage: vhostd-bench net --socket=PATH [options]\n"
        "\n"
        "  --socket=PATH          vhost-user-net socket of the back-end (required)\n"
        "  --mode=MODE            tx | rx | echo (default echo). tx: count TX completions;\n"
        "                         rx: count received frames (needs a back-end that sends);\n"
        "                         echo: send and count frames that come back (loopback)\n"
        "  --size=N               frame bytes without the 12-byte virtio header (default 64)\n"
        "  --pairs=N              queue pairs, one thread each (default 1)\n"
        "  --runtime=SECONDS      run for this long (default 10)\n"
        "  --ring=split|packed    ring layout (default split)\n"
        "  --mrg=0|1              negotiate VIRTIO_NET_F_MRG_RXBUF (default 0)\n"
        "  --in-order=0|1         negotiate VIRTIO_F_IN_ORDER when offered (default 1)\n"
        "  --queue-size=N         ring entries (default 256)\n"
        "  --burst=N              frames per tx/rx call (default 32, at most 256)\n"
        "  --completion=poll|interrupt  busy-poll the used rings (default) or sleep on the\n"
        "                         call eventfds when idle\n"
        "  --json                 print the results as one JSON object on stdout\n"
        "  --iommu[=SIZE]         act as the device's IOMMU (VIRTIO_F_ACCESS_PLATFORM), pages of\n"
        "                         SIZE (default 4k); the back-end must support it\n"
        "  --iommu-strict         invalidate each buffer as soon as the device used it\n"
        "  --iommu-batch=N        lazy: unmaps per batch of invalidations (default 32)\n"
        "  --iommu-exact          map TX slots read-only, receive buffers write-only (DPDK's\n"
        "                         vhost needs read-write receive buffers)\n"
        "  --iommu-static         map the receive buffers and TX slots once, one IOTLB entry per\n"
        "                         page, and keep them mapped (no message per frame)\n"
        "  --help\n"
        "\n"
        "Gbit/s counts frame bytes (no virtio header, no Ethernet preamble or gap).\n",
        f);
}

int bench_net_parse_opts(int argc, char **argv, struct net_opts *o)
{
    enum {
        N_SOCKET = 256,
        N_MODE,
        N_SIZE,
        N_PAIRS,
        N_RUNTIME,
        N_RING,
        N_MRG,
        N_IN_ORDER,
        N_QSIZE,
        N_BURST,
        N_COMPL,
        N_JSON,
        N_IOMMU,
        N_IOMMU_STRICT,
        N_IOMMU_BATCH,
        N_IOMMU_EXACT,
        N_IOMMU_STATIC,
        N_HELP
    };
    static const struct option lo[] = {
        {"socket", required_argument, 0, N_SOCKET},
        {"mode", required_argument, 0, N_MODE},
        {"size", required_argument, 0, N_SIZE},
        {"pairs", required_argument, 0, N_PAIRS},
        {"runtime", required_argument, 0, N_RUNTIME},
        {"ring", required_argument, 0, N_RING},
        {"mrg", required_argument, 0, N_MRG},
        {"in-order", required_argument, 0, N_IN_ORDER},
        {"queue-size", required_argument, 0, N_QSIZE},
        {"queue_size", required_argument, 0, N_QSIZE},
        {"burst", required_argument, 0, N_BURST},
        {"completion", required_argument, 0, N_COMPL},
        {"json", no_argument, 0, N_JSON},
        {"iommu", optional_argument, 0, N_IOMMU},
        {"iommu-strict", no_argument, 0, N_IOMMU_STRICT},
        {"iommu-batch", required_argument, 0, N_IOMMU_BATCH},
        {"iommu-exact", no_argument, 0, N_IOMMU_EXACT},
        {"iommu-static", no_argument, 0, N_IOMMU_STATIC},
        {"help", no_argument, 0, N_HELP},
        {0, 0, 0, 0},
    };
    uint64_t v;
    int c;

    memset(o, 0, sizeof(*o));
    o->mode = NET_ECHO;
    o->size = 64;
    o->pairs = 1;
    o->runtime = 10;
    o->queue_size = 256;
    o->burst = 32;
    while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
        const char *a = optarg;
        switch (c) {
        case N_SOCKET:
            o->socket = a;
            break;
        case N_MODE: {
            size_t i;
            for (i = 0; i < sizeof(net_mode_names) / sizeof(net_mode_names[0]); i++)
                if (!strcmp(a, net_mode_names[i]))
                    break;
            if (i == sizeof(net_mode_names) / sizeof(net_mode_names[0]))
                goto bad;
            o->mode = (enum net_mode)i;
            break;
        }
        case N_SIZE:
            if (bench_parse_uint(a, NET_MIN_FRAME, NET_MAX_FRAME, &v))
                goto bad;
            o->size = (unsigned)v;
            break;
        case N_PAIRS:
            if (bench_parse_uint(a, 1, VHD_NETDRV_MAX_PAIRS, &v))
                goto bad;
            o->pairs = (unsigned)v;
            break;
        case N_RUNTIME:
            if (bench_parse_runtime(a, &o->runtime))
                goto bad;
            break;
        case N_RING:
            if (bench_parse_ring(a, &o->packed))
                goto bad;
            break;
        case N_MRG:
            if (bench_parse_uint(a, 0, 1, &v))
                goto bad;
            o->mrg = v;
            break;
        case N_IN_ORDER:
            if (bench_parse_uint(a, 0, 1, &v))
                goto bad;
            o->no_in_order = !v;
            break;
        case N_QSIZE:
            if (bench_parse_uint(a, 1, 32768, &v))
                goto bad;
            o->queue_size = (unsigned)v;
            break;
        case N_BURST:
            if (bench_parse_uint(a, 1, NET_MAX_BURST, &v))
                goto bad;
            o->burst = (unsigned)v;
            break;
        case N_COMPL:
            if (bench_parse_completion(a, &o->interrupt))
                goto bad;
            break;
        case N_IOMMU:
            if (bench_parse_iommu(a, &o->iommu_page))
                goto bad;
            break;
        case N_IOMMU_STRICT:
            o->iommu_strict = true;
            break;
        case N_IOMMU_EXACT:
            o->iommu_exact = true;
            break;
        case N_IOMMU_STATIC:
            o->iommu_static = true;
            break;
        case N_IOMMU_BATCH:
            if (bench_parse_uint(a, 1, 1u << 20, &v))
                goto bad;
            o->iommu_batch = (unsigned)v;
            break;
        case N_JSON:
            o->json = true;
            break;
        case N_HELP:
        case 'h':
            net_usage(stdout);
            exit(0);
        default:
            net_usage(stderr);
            return -1;
        }
        continue;
    bad:
        return bench_bad_value("vhostd-bench net", lo, c, a);
    }
    return bench_check_rest("vhostd-bench net", argc, argv, o->socket);
}
