/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd: serve virtio-blk and virtio-net devices to vhost-user front-ends.
 * Parses the options, creates the devices, the workers and one listening
 * socket per device (or, in client mode, a connection to the front-end's
 * socket, retried with back-off), runs the control loop, and on SIGINT/SIGTERM drains
 * in-flight I/O, flushes, removes the sockets and exits 0. SIGUSR1 logs the
 * net devices' counters.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "backend/blk_backend.h"
#include "dev/blk.h"
#include "dev/net.h"
#include "options.h"
#include "core/memguard.h"
#include "runtime/log.h"
#include "runtime/rt.h"
#include "sandbox.h"
#include "transport/ctl.h"
#include "transport/vu_client.h"
#include "transport/vu_server.h"

#define VHOSTD_VERSION "0.1.0"

struct daemon {
    struct vhd_options opts;
    struct vhd_ctl *ctl;
    struct vhd_rt *rt;
    int sigfd;
    int ndev;
    struct vhd_dev *dev[VHD_OPT_MAX_DEVICES];
    /* Each device has a listening server, or a client (client=on): never both. */
    struct vhd_vu_server *srv[VHD_OPT_MAX_DEVICES];
    struct vhd_vu_client *cli[VHD_OPT_MAX_DEVICES];
};

/* The current session of device i, in either mode; NULL when there is none. */
static struct vhd_vu_conn *device_conn(const struct daemon *d, int i)
{
    if (d->cli[i])
        return vhd_vu_client_conn(d->cli[i]);
    return d->srv[i] ? vhd_vu_server_conn(d->srv[i]) : NULL;
}

/*
 * Serve device i on socket: listen on it, or with client=on connect to it.
 * 0, or -1 with a message on stderr.
 */
static int device_serve(struct daemon *d, int i, const char *name, const char *socket, bool client,
                        uint32_t reconnect_max_ms, const struct vhd_opt_access *oa)
{
    char err[512] = "";
    struct vhd_vu_sock_access acc;

    if (vhd_sandbox_resolve_access(oa, &acc, err, sizeof(err)) < 0) {
        /* nothing created: reported below */
    } else if (client) {
        struct vhd_vu_client_opts co = {.reconnect_max_ms = reconnect_max_ms, .access = acc};
        d->cli[i] = vhd_vu_client_new(d->ctl, d->dev[i], socket, &co, err, sizeof(err));
    } else {
        d->srv[i] = vhd_vu_server_new_access(d->ctl, d->dev[i], socket, &acc, err, sizeof(err));
    }
    if (!d->srv[i] && !d->cli[i]) {
        fprintf(stderr, "vhostd: %s: %s\n", name, err);
        return -1;
    }
    return 0;
}

static void on_signal(void *opaque, uint32_t events)
{
    struct daemon *d = opaque;
    struct signalfd_siginfo si;
    (void)events;
    while (read(d->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM) {
            vhd_log(VHD_LOG_INFO, "signal %s: shutting down",
                    si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
            vhd_ctl_stop(d->ctl);
        } else if (si.ssi_signo == SIGUSR1) { /* net: per-queue counters */
            for (int i = 0; i < d->ndev; i++)
                if (vhd_dev_is_net(d->dev[i]))
                    vhd_net_log_stats(d->dev[i], "SIGUSR1");
        }
    }
}

/* A worker marked a queue broken: let each session report NEEDS_RESET. */
static void on_rt_event(void *opaque, uint32_t events)
{
    struct daemon *d = opaque;
    uint64_t v;
    (void)events;
    if (read(vhd_rt_event_fd(d->rt), &v, sizeof(v)) < 0 && errno != EAGAIN)
        vhd_log(VHD_LOG_WARN, "runtime event fd: %s", strerror(errno));
    for (int i = 0; i < d->ndev; i++) {
        struct vhd_vu_conn *c = device_conn(d, i);
        if (c)
            vhd_vu_conn_check_queues(c);
    }
}

static unsigned online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

/* Spread a device's queues over its worker list (or all workers), round robin. */
static int assign_workers(struct vhd_dev *dev, const struct vhd_opt_blk *b, unsigned nworkers,
                          unsigned *next_rr)
{
    int *map = calloc(dev->num_queues, sizeof(*map));
    if (!map)
        return -ENOMEM;
    for (uint32_t q = 0; q < dev->num_queues; q++) {
        if (b->nworkers)
            map[q] = b->workers[q % (uint32_t)b->nworkers];
        else
            map[q] = (int)((*next_rr)++ % nworkers);
    }
    free(dev->queue_worker);
    dev->queue_worker = map;
    return 0;
}

static void shutdown_all(struct daemon *d)
{
    /* Ending each session detaches its queues: in-flight I/O completes first. */
    for (int i = 0; i < d->ndev; i++) {
        vhd_vu_server_free(d->srv[i]);
        d->srv[i] = NULL;
        vhd_vu_client_free(d->cli[i]);
        d->cli[i] = NULL;
    }
    /* Closing the backend flushes what the cache holds. */
    for (int i = 0; i < d->ndev; i++) {
        if (vhd_dev_is_net(d->dev[i]))
            vhd_net_free(d->dev[i]);
        else
            vhd_blk_free(d->dev[i]);
        d->dev[i] = NULL;
    }
    vhd_rt_free(d->rt);
    vhd_ctl_free(d->ctl);
    if (d->sigfd >= 0)
        close(d->sigfd);
    vhd_options_free(&d->opts);
}

int main(int argc, char **argv)
{
    static struct daemon d = {.sigfd = -1};
    char err[512] = "";

    if (vhd_options_parse(&d.opts, argc, argv, err, sizeof(err)) < 0) {
        fprintf(stderr, "vhostd: %s\n", err);
        vhd_options_free(&d.opts);
        return 2;
    }
    if (d.opts.help) {
        fputs(vhd_usage, stdout);
        vhd_options_free(&d.opts);
        return 0;
    }
    if (d.opts.version) {
        printf("vhostd %s\n", VHOSTD_VERSION);
        vhd_options_free(&d.opts);
        return 0;
    }
    vhd_log_set_level((enum vhd_log_level)d.opts.log_level);
    (void)vhd_sandbox_raise_nofile(); /* logged; a failure is not fatal */

    /* Signals go to the control loop through a signalfd; block them before any thread starts. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    unsigned total_queues = 0;
    for (int i = 0; i < d.opts.nblk; i++)
        total_queues += d.opts.blk[i].queues;
    for (int i = 0; i < d.opts.nnet; i++)
        total_queues += d.opts.net[i].queues; /* pairs: both rings of a pair share a worker */
    unsigned nworkers = d.opts.workers_set ? d.opts.workers : total_queues;
    if (!d.opts.workers_set && nworkers > online_cpus())
        nworkers = online_cpus();
    if (nworkers == 0)
        nworkers = 1;
    for (int i = 0; i < d.opts.nblk; i++)
        for (int j = 0; j < d.opts.blk[i].nworkers; j++)
            if ((unsigned)d.opts.blk[i].workers[j] >= nworkers) {
                fprintf(stderr, "vhostd: device %s: worker %d does not exist (%u workers)\n",
                        d.opts.blk[i].name, d.opts.blk[i].workers[j], nworkers);
                vhd_options_free(&d.opts);
                return 2;
            }
    for (int i = 0; i < d.opts.nnet; i++)
        for (int j = 0; j < d.opts.net[i].nworkers; j++)
            if ((unsigned)d.opts.net[i].workers[j] >= nworkers) {
                fprintf(stderr, "vhostd: device %s: worker %d does not exist (%u workers)\n",
                        d.opts.net[i].name, d.opts.net[i].workers[j], nworkers);
                vhd_options_free(&d.opts);
                return 2;
            }

    int rc = vhd_ctl_new(&d.ctl);
    if (rc < 0) {
        fprintf(stderr, "vhostd: control loop: %s\n", strerror(-rc));
        goto fail;
    }
    struct vhd_rt_opts ro;
    vhd_rt_opts_default(&ro);
    ro.nworkers = nworkers;
    ro.poll_us = d.opts.poll_us;
    /* Only what the block backends submit: the kernel refuses other opcodes (rt.h). */
    ro.uring_ops = vhd_blk_backend_uring.uring_ops | vhd_blk_backend_null.uring_ops;
    ro.poll_mode = d.opts.poll_mode == VHD_OPT_POLL_ALWAYS  ? VHD_POLL_ALWAYS
                   : d.opts.poll_mode == VHD_OPT_POLL_NEVER ? VHD_POLL_NEVER
                                                            : VHD_POLL_ADAPTIVE;
    vhd_mem_set_total_max(d.opts.max_guest_mem);
    rc = vhd_rt_new(&ro, &d.rt);
    if (rc < 0) {
        fprintf(stderr, "vhostd: workers: %s\n", strerror(-rc));
        goto fail;
    }

    unsigned next_rr = 0;
    for (int i = 0; i < d.opts.nblk; i++) {
        const struct vhd_opt_blk *b = &d.opts.blk[i];
        struct vhd_blk_opts bo = {
            .name = b->name,
            .image = b->image,
            .backend = b->backend,
            .size = b->size,
            .ro = b->ro,
            .direct = b->direct,
            .serial = b->serial,
            .block_size = b->block_size,
            .num_queues = b->queues,
            .allow_packed = b->allow_packed,
            .no_split = !b->allow_split,
        };
        rc = vhd_blk_new(&bo, &d.dev[i], err, sizeof(err));
        if (rc < 0) {
            fprintf(stderr, "vhostd: %s: %s\n", b->name, err);
            goto fail;
        }
        d.ndev = i + 1;
        d.dev[i]->rt = d.rt;
        d.dev[i]->max_mem = b->max_guest_mem;
        if (assign_workers(d.dev[i], b, nworkers, &next_rr) < 0) {
            fprintf(stderr, "vhostd: %s: out of memory\n", b->name);
            goto fail;
        }
        if (device_serve(&d, i, b->name, b->socket, b->client, b->reconnect_max_ms, &b->access) < 0)
            goto fail;
        char wl[256] = "";
        for (uint32_t q = 0; q < d.dev[i]->num_queues && strlen(wl) < sizeof(wl) - 8; q++)
            snprintf(wl + strlen(wl), sizeof(wl) - strlen(wl), "%s%d", q ? "," : "",
                     d.dev[i]->queue_worker[q]);
        vhd_log(VHD_LOG_INFO, "%s: %u queue(s) on worker(s) %s", b->name, b->queues, wl);
    }
    /* ---- net devices: after the blk ones, in d.dev[] too ---- */
    for (int i = 0; i < d.opts.nnet; i++) {
        const struct vhd_opt_net *n = &d.opts.net[i];
        uint8_t mac[6];
        int k = d.ndev;
        if (n->mac_set)
            memcpy(mac, n->mac, sizeof(mac));
        else
            vhd_net_default_mac(n->socket, mac); /* stable across restarts, distinct per socket */
        struct vhd_net_opts no = {
            .name = n->name,
            .backend = n->backend,
            .switch_name = n->switch_name,
            .tap_name = n->tap_name,
            .pairs = n->queues,
            .mac = mac,
            .mtu = n->mtu,
            .allow_packed = n->allow_packed,
            .no_split = !n->allow_split,
        };
        rc = vhd_net_new(&no, &d.dev[k], err, sizeof(err));
        if (rc < 0) {
            fprintf(stderr, "vhostd: %s: %s\n", n->name, err);
            goto fail;
        }
        d.ndev = k + 1;
        d.dev[k]->rt = d.rt;
        d.dev[k]->max_mem = n->max_guest_mem;
        if (vhd_net_assign_workers(d.dev[k], n->workers, (unsigned)n->nworkers, nworkers,
                                   &next_rr) < 0) {
            fprintf(stderr, "vhostd: %s: out of memory\n", n->name);
            goto fail;
        }
        if (device_serve(&d, k, n->name, n->socket, n->client, n->reconnect_max_ms, &n->access) < 0)
            goto fail;
        char wl[256] = "";
        for (uint32_t p = 0; p < n->queues && strlen(wl) < sizeof(wl) - 8; p++)
            snprintf(wl + strlen(wl), sizeof(wl) - strlen(wl), "%s%d", p ? "," : "",
                     d.dev[k]->queue_worker[2 * p]);
        vhd_log(VHD_LOG_INFO, "%s: %u queue pair(s) on worker(s) %s", n->name, n->queues, wl);
    }

    d.sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (d.sigfd < 0 || vhd_ctl_add(d.ctl, d.sigfd, EPOLLIN, on_signal, &d, NULL) < 0 ||
        vhd_ctl_add(d.ctl, vhd_rt_event_fd(d.rt), EPOLLIN, on_rt_event, &d, NULL) < 0) {
        fprintf(stderr, "vhostd: signal handling: %s\n", strerror(errno));
        goto fail;
    }
    /*
     * A front-end that shrinks its guest-memory file makes our next touch of
     * the lost pages SIGBUS: absorb it and let the control loop (runtime
     * event) mark that device broken instead of dying (core/memguard.h).
     */
    rc = vhd_memguard_install(vhd_rt_event_fd(d.rt));
    if (rc < 0) {
        fprintf(stderr, "vhostd: SIGBUS guard: %s\n", strerror(-rc));
        goto fail;
    }
    if (ro.poll_mode == VHD_POLL_ADAPTIVE)
        vhd_log(VHD_LOG_INFO, "vhostd %s: %d device(s), %u worker(s), adaptive polling %u us",
                VHOSTD_VERSION, d.ndev, nworkers, ro.poll_us);
    else
        vhd_log(VHD_LOG_INFO, "vhostd %s: %d device(s), %u worker(s), polling %s", VHOSTD_VERSION,
                d.ndev, nworkers, ro.poll_mode == VHD_POLL_ALWAYS ? "always" : "never");

    /*
     * Sandbox (sandbox.h): the last step of setup, once every socket, image,
     * eventfd and thread exists. Drops to --user, then the seccomp filter.
     */
    {
        /* Our listening sockets; a client-mode device's socket is the front-end's. */
        const char *socks[sizeof(d.srv) / sizeof(d.srv[0])];
        int dirs[sizeof(d.srv) / sizeof(d.srv[0])]; /* where they are removed at exit */
        unsigned nsocks = 0;
        for (int i = 0; i < d.ndev; i++)
            if (d.srv[i]) {
                dirs[nsocks] = vhd_vu_server_dir_fd(d.srv[i]);
                socks[nsocks++] = vhd_vu_server_path(d.srv[i]);
            }
        struct vhd_sandbox_opts so = {
            .mode = d.opts.sandbox == VHD_OPT_SANDBOX_OFF   ? VHD_SANDBOX_OFF
                    : d.opts.sandbox == VHD_OPT_SANDBOX_LOG ? VHD_SANDBOX_LOG
                                                            : VHD_SANDBOX_ON,
            .user = d.opts.user,
            .chown_paths = socks,
            .nchown = nsocks,
            .client_mode = nsocks < (unsigned)d.ndev, /* a device without a listening socket */
            .unlink_dirs = dirs,
            .nunlink_dirs = nsocks,
        };
        if (vhd_sandbox_enter(&so, err, sizeof(err)) < 0) {
            fprintf(stderr, "vhostd: sandbox: %s\n", err);
            goto fail;
        }
    }

    rc = vhd_ctl_run(d.ctl);
    if (rc < 0)
        vhd_log(VHD_LOG_ERROR, "control loop: %s", strerror(-rc));
    shutdown_all(&d);
    vhd_log(VHD_LOG_INFO, "stopped");
    return rc < 0 ? 1 : 0;

fail:
    shutdown_all(&d);
    return 1;
}
