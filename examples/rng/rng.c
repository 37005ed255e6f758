/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A vhost-user virtio-rng device (virtio 1.2 section 5.4) on libvhostd's
 * custom device API: every writable buffer the guest posts on its one
 * queue is filled with random bytes from getrandom(2). The whole device is
 * the process callback below; the library does the vhost-user protocol,
 * guest memory, rings and notifications. Copy this file to start a new
 * device type: change the queue count, the config space, the features and
 * process().
 *
 *   cc -Wall -Wextra -o vhost-user-rng rng.c $(pkg-config --cflags --libs libvhostd)
 *   ./vhost-user-rng --socket /tmp/rng.sock &
 *   qemu-system-x86_64 ... -object memory-backend-memfd,id=mem,size=512M,share=on \
 *       -numa node,memdev=mem -chardev socket,id=rng0,path=/tmp/rng.sock \
 *       -device vhost-user-rng-pci,chardev=rng0
 *
 * In the guest: cat /sys/class/misc/hw_random/rng_current (virtio_rng.0),
 * then read /dev/hwrng. SIGINT or SIGTERM stops the device and prints what
 * it served.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <vhostd/vhostd.h>

static struct vhd_ctx *stop_ctx; /* for the signal handler */

/* Fill len bytes at p from the kernel's CSPRNG. 0 or -errno. */
static int fill_random(void *p, size_t len)
{
    char *b = p;

    while (len > 0) {
        ssize_t n = getrandom(b, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        b += n;
        len -= (size_t)n;
    }
    return 0;
}

/*
 * The virtio-rng request queue: the driver posts device-writable buffers and
 * the device fills them (5.4.6). Runs on a library worker thread.
 */
static int rng_process(struct vhd_device *dev, uint32_t q, struct vhd_chain *chain,
                       const struct iovec *iov, unsigned nr, unsigned nw, void *opaque)
{
    uint32_t written = 0;

    (void)dev;
    (void)q;
    (void)opaque;
    /* Device-readable buffers mean nothing to virtio-rng: they are skipped. */
    for (unsigned i = nr; i < nr + nw; i++) {
        if (fill_random(iov[i].iov_base, iov[i].iov_len) < 0)
            break; /* hand back what was filled */
        written += (uint32_t)iov[i].iov_len;
    }
    return vhd_chain_complete(chain, written);
}

static void rng_event(struct vhd_device *dev, enum vhd_event ev, void *opaque)
{
    (void)opaque;
    switch (ev) {
    case VHD_EVENT_CONNECTED:
        printf("rng: %s: front-end connected\n", vhd_device_name(dev));
        break;
    case VHD_EVENT_DISCONNECTED:
        printf("rng: %s: front-end disconnected\n", vhd_device_name(dev));
        break;
    case VHD_EVENT_BROKEN:
        printf("rng: %s: device needs a reset\n", vhd_device_name(dev));
        break;
    case VHD_EVENT_CONFIG_CHANGED:
        break;
    }
    fflush(stdout);
}

static void on_signal(int sig)
{
    (void)sig;
    vhd_ctx_stop(stop_ctx); /* async-signal-safe */
}

static void usage(FILE *f)
{
    fprintf(f, "usage: vhost-user-rng --socket PATH [--client] [--name NAME]\n"
               "  --socket PATH  vhost-user socket: listen on it (or connect, with --client)\n"
               "  --client       connect to a front-end listening on PATH, reconnecting\n"
               "  --name NAME    device name in logs (default: rng)\n");
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"socket", required_argument, NULL, 's'},
        {"client", no_argument, NULL, 'c'},
        {"name", required_argument, NULL, 'n'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    static const struct vhd_custom_ops ops = {.process = rng_process};
    const char *socket = NULL, *name = "rng";
    bool client = false;
    struct vhd_device *dev = NULL;
    struct vhd_ctx *ctx = NULL;
    char err[256] = "";
    int c, rc;

    while ((c = getopt_long(argc, argv, "s:cn:h", longopts, NULL)) != -1) {
        switch (c) {
        case 's':
            socket = optarg;
            break;
        case 'c':
            client = true;
            break;
        case 'n':
            name = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (!socket || optind != argc) {
        usage(stderr);
        return 2;
    }

    rc = vhd_ctx_new(NULL, &ctx); /* one worker, adaptive polling */
    if (rc < 0) {
        fprintf(stderr, "rng: context: %s\n", strerror(-rc));
        return 1;
    }
    struct vhd_custom_config cfg = {
        .dev = {.name = name,
                .endpoint = {.path = socket, .client = client},
                .allow_packed = true,
                .on_event = rng_event},
        .ops = &ops,
        .num_queues = 1, /* requestq */
        .features = 0,   /* virtio-rng has no feature bits and no config space */
    };
    rc = vhd_custom_device_new(ctx, &cfg, &dev, err, sizeof(err));
    if (rc == 0)
        rc = vhd_device_start(dev, err, sizeof(err));
    if (rc < 0) {
        fprintf(stderr, "rng: %s: %s\n", socket, err);
        vhd_ctx_destroy(ctx);
        return 1;
    }

    stop_ctx = ctx;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);
    printf("rng: libvhostd %s, serving virtio-rng on %s\n", vhd_version(), socket);
    fflush(stdout);

    rc = vhd_ctx_run(ctx);

    struct vhd_queue_counters qc;
    struct vhd_device_counters dc;
    if (vhd_device_queue_counters(dev, 0, &qc) == 0 && vhd_device_counters(dev, &dc) == 0)
        printf("rng: served %llu requests, %llu bytes, %llu errors in %llu session(s)\n",
               (unsigned long long)qc.requests, (unsigned long long)qc.bytes,
               (unsigned long long)qc.errors, (unsigned long long)dc.sessions);
    vhd_ctx_destroy(ctx); /* ends the session, frees the device */
    return rc < 0 ? 1 : 0;
}
