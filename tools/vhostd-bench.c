/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd-bench: an fio-like load generator for any vhost-user-blk back-end
 * (vhostd, qemu-storage-daemon, ...), built on libvhostd's userspace
 * virtio-blk driver. Each job is a thread that owns one virtqueue; buffers
 * live in the driver's shared memory (zero copy). Live progress once a
 * second on stderr; a summary (or JSON) with IOPS, MB/s and latency
 * percentiles from a log-linear histogram; optional fio-style verification.
 * "vhostd-bench net" measures a vhost-user-net back-end's packet rate through
 * the virtio-net driver (tx, rx and echo modes; Mpps and Gbit/s).
 * This file picks the run; bench_opts.c parses the options, bench_blk.c and
 * bench_net.c run the two, bench_report.c and bench_hist.c serve both.
 */
#include <string.h>

#include "bench.h"

/* "vhostd-bench net ..." is the net run; anything else the blk run. */
int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "net"))
        return bench_net_main(argc - 1, argv + 1);
    return bench_blk_main(argc, argv);
}
