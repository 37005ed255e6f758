/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd: serve virtio-blk and virtio-net devices to vhost-user front-ends.
 * Parses the options, turns them into libvhostd configurations (public
 * headers only: include/vhostd/), enters the sandbox and runs the library's
 * control loop. On SIGINT/SIGTERM the library drains in-flight I/O,
 * flushes, removes the sockets, and vhostd exits 0. SIGUSR1 logs the
 * devices' counters; SIGUSR2 resumes paused blk devices (werror=stop);
 * SIGHUP (with --rpc) reloads the configuration (reload.h).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "conventions.h"
#include "options.h"
#include "reload.h"
#include "rpc.h"
#include "sandbox.h"
#include "vhostd/vhostd.h"

struct daemon {
    struct vhd_options opts;
    struct vhd_ctx *ctx;
    struct vhd_rpc *rpc; /* --rpc: the management API and the device table */
    int sigfd;
    int argc; /* the command line, parsed again at SIGHUP */
    char **argv;
    int ndev;
    struct vhd_device *dev[VHD_OPT_MAX_DEVICES];
    bool started; /* the command line's devices exist: any add now is a runtime one */
    bool nbd_tcp; /* the filter allows TCP sockets (an nbd:// device, --rpc-nbd-tcp) */
};

static void on_signal(void *opaque, uint32_t events)
{
    struct daemon *d = opaque;
    struct signalfd_siginfo si;
    (void)events;
    while (read(d->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGINT || si.ssi_signo == SIGTERM) {
            vhd_log(VHD_LOG_INFO, "signal %s: shutting down",
                    si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
            vhd_ctx_stop(d->ctx);
        } else if (si.ssi_signo == SIGUSR1) {
            if (d->rpc) /* devices come and go: the table knows them */
                vhd_rpc_log_counters(d->rpc, "SIGUSR1");
            else
                for (int i = 0; i < d->ndev; i++)
                    vhd_device_log_counters(d->dev[i], "SIGUSR1");
        } else if (si.ssi_signo == SIGUSR2) { /* blk: retry what werror/rerror=stop holds */
            if (d->rpc)
                vhd_rpc_resume_all(d->rpc);
            else
                for (int i = 0; i < d->ndev; i++)
                    (void)vhd_blk_device_resume(d->dev[i]); /* -EINVAL for net devices */
        } else if (si.ssi_signo == SIGHUP) {
            struct vhd_reload_result res;
            char msg[512];
            if (d->rpc) /* the table adds and removes devices at runtime */
                (void)vhd_reload(d->rpc, &d->opts, d->argc, d->argv, &res, msg, sizeof(msg));
            else
                vhd_log(VHD_LOG_WARN, "SIGHUP: reloading the configuration needs --rpc "
                                      "(devices are added at runtime): ignored");
        }
    }
}

static unsigned online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (unsigned)n : 1;
}

/* Every worker index a device names must exist. 0, or -1 with a message on stderr. */
static int check_workers(const char *name, const int *workers, int n, unsigned nworkers)
{
    for (int j = 0; j < n; j++)
        if ((unsigned)workers[j] >= nworkers) {
            fprintf(stderr, "vhostd: device %s: worker %d does not exist (%u workers)\n", name,
                    workers[j], nworkers);
            return -1;
        }
    return 0;
}

/*
 * The worker count: --workers, else one per --cpus CPU, else one per queue
 * (pair) up to the online CPUs.
 */
static unsigned worker_count(const struct vhd_options *o)
{
    if (!o->workers_set && o->ncpus)
        return o->ncpus;
    unsigned total_queues = 0;
    for (int i = 0; i < o->nblk; i++)
        total_queues += o->blk[i].queues;
    for (int i = 0; i < o->nnet; i++)
        total_queues += o->net[i].queues; /* pairs: both rings of a pair share a worker */
    unsigned n = o->workers_set ? o->workers : total_queues;
    if (!o->workers_set && o->rpc) /* devices are added later: one worker per CPU */
        n = online_cpus();
    if (!o->workers_set && n > online_cpus())
        n = online_cpus();
    return n ? n : 1;
}

/* What blk and net devices share, from either kind of option struct. */
#define DEVICE_CONFIG(o)                                         \
    ((struct vhd_device_config){                                 \
        .name = (o)->name,                                       \
        .endpoint = {.path = (o)->socket,                        \
                     .client = (o)->client,                      \
                     .reconnect_max_ms = (o)->reconnect_max_ms}, \
        .workers = (o)->workers,                                 \
        .nworkers = (unsigned)(o)->nworkers,                     \
        .allow_packed = (o)->allow_packed,                       \
        .no_split = !(o)->allow_split,                           \
        .max_guest_mem = (o)->max_guest_mem,                     \
        .endpoint.listen_fd_set = (o)->fd > 0,                   \
        .endpoint.listen_fd = (o)->fd,                           \
    })

/* config.reload (rpc.h): SIGHUP's reload, its outcome in msg. */
static int reload_op(void *opaque, char *msg, size_t msglen)
{
    struct daemon *d = opaque;
    struct vhd_reload_result res;
    return vhd_reload(d->rpc, &d->opts, d->argc, d->argv, &res, msg, msglen);
}

/* The library's config of one --blk device (pointers into b). 0, or -errno with a reason. */
static int blk_config(struct daemon *d, const struct vhd_opt_blk *b, struct vhd_blk_config *out,
                      char *err, size_t errlen)
{
    struct vhd_blk_config c = {
        .dev = DEVICE_CONFIG(b),
        .backend = b->backend,
        .image = b->image,
        .uri = b->uri,
        .size = b->size,
        .read_only = b->ro,
        .direct = b->direct,
        .report_lost_writes = b->lost_writes && !strcmp(b->lost_writes, "report"),
        .serial = b->serial,
        .block_size = b->block_size,
        .num_queues = b->queues,
        .locking = b->locking,
        .werror = b->werror,
        .rerror = b->rerror,
        .pool = b->pool,
        .conf = b->conf,
        .user = b->user,
        .snap = b->snap,
    };
    /*
     * The command line is checked as a whole (options.c); an add after
     * start-up (a connection's, a SIGHUP reload's) comes here alone, and
     * will run under the filter.
     */
    if (!strcmp(b->backend, "rbd") && d->opts.sandbox != VHD_OPT_SANDBOX_OFF) {
        snprintf(err, errlen,
                 "backend=rbd needs --sandbox off (librados connects to the Ceph "
                 "cluster from its own threads at any time)");
        return -EPERM;
    }
    if (d->started && d->opts.sandbox != VHD_OPT_SANDBOX_OFF) {
        int rc = vhd_sandbox_check_runtime_blk(b, d->nbd_tcp, err, errlen);
        if (rc < 0)
            return rc;
    }
    *out = c;
    return vhd_sandbox_resolve_access(&b->access, &out->dev.endpoint.access, err, errlen);
}

/* Create and start one --blk device (the command line's). 0, or -errno with a reason in err. */
static int new_blk(void *opaque, const struct vhd_opt_blk *b, struct vhd_device **out, char *err,
                   size_t errlen)
{
    struct daemon *d = opaque;
    struct vhd_blk_config c;
    int rc = blk_config(d, b, &c, err, errlen);
    if (rc == 0)
        rc = vhd_blk_device_new(d->ctx, &c, out, err, errlen);
    if (rc == 0 && (rc = vhd_device_start(*out, err, errlen)) < 0)
        vhd_device_destroy(*out);
    return rc;
}

/* The RPC's blk add: the backend opens off the control thread (rpc.h). */
static int open_blk(void *opaque, const struct vhd_opt_blk *b, vhd_device_open_fn done,
                    void *done_opaque, char *err, size_t errlen)
{
    struct daemon *d = opaque;
    struct vhd_blk_config c;
    int rc = blk_config(d, b, &c, err, errlen);
    return rc < 0 ? rc : vhd_blk_device_open(d->ctx, &c, done, done_opaque, err, errlen);
}

/* Create and start one --net device (also the RPC's add). 0, or -errno with a reason in err. */
static int new_net(void *opaque, const struct vhd_opt_net *n, struct vhd_device **out, char *err,
                   size_t errlen)
{
    struct daemon *d = opaque;
    struct vhd_net_config c = {
        .dev = DEVICE_CONFIG(n),
        .backend = n->backend,
        .switch_name = n->switch_name,
        .tap_name = n->tap_name,
        .pairs = n->queues,
        .mac = n->mac_set ? n->mac : NULL, /* NULL: derived from the socket path */
        .mtu = n->mtu,
    };
    int rc = vhd_sandbox_resolve_access(&n->access, &c.dev.endpoint.access, err, errlen);
    if (rc == 0)
        rc = vhd_net_device_new(d->ctx, &c, out, err, errlen);
    if (rc == 0 && (rc = vhd_device_start(*out, err, errlen)) < 0)
        vhd_device_destroy(*out);
    return rc;
}

/*
 * Create and start every device of the options; with --rpc, they go into the
 * RPC's table (which removes devices at runtime). 0, or -1 with a message on
 * stderr.
 */
static int create_devices(struct daemon *d)
{
    char err[512] = "";

    for (int i = 0; i < d->opts.nblk; i++) {
        const struct vhd_opt_blk *b = &d->opts.blk[i];
        if (new_blk(d, b, &d->dev[d->ndev], err, sizeof(err)) < 0) {
            fprintf(stderr, "vhostd: %s: %s\n", b->name, err);
            return -1;
        }
        d->ndev++;
        if (d->rpc && vhd_rpc_adopt(d->rpc, d->dev[d->ndev - 1], false, b->name, b->spec) < 0)
            goto oom;
        if (d->rpc && b->fd > 0) /* --fd: closed when the device is removed */
            vhd_rpc_own_fd(d->rpc, b->name, b->fd);
    }
    for (int i = 0; i < d->opts.nnet; i++) {
        const struct vhd_opt_net *n = &d->opts.net[i];
        if (new_net(d, n, &d->dev[d->ndev], err, sizeof(err)) < 0) {
            fprintf(stderr, "vhostd: %s: %s\n", n->name, err);
            return -1;
        }
        d->ndev++;
        if (d->rpc && vhd_rpc_adopt(d->rpc, d->dev[d->ndev - 1], true, n->name, n->spec) < 0)
            goto oom;
        if (d->rpc && n->fd > 0)
            vhd_rpc_own_fd(d->rpc, n->name, n->fd);
    }
    return 0;
oom:
    fprintf(stderr, "vhostd: out of memory\n");
    return -1;
}

/* Whether the device listening on socket was given socket-group= (--user must not change it). */
static bool socket_group_set(const struct vhd_options *o, const char *socket)
{
    for (int i = 0; i < o->nblk; i++)
        if (o->blk[i].access.group && !strcmp(o->blk[i].socket, socket))
            return true;
    for (int i = 0; i < o->nnet; i++)
        if (o->net[i].access.group && !strcmp(o->net[i].socket, socket))
            return true;
    return false;
}

/*
 * Sandbox (sandbox.h): the last step of setup, once every socket, image,
 * eventfd and thread exists. Drops to --user, then the seccomp filter.
 */
static int enter_sandbox(struct daemon *d)
{
    /* Our listening sockets; a client-mode device's socket is the front-end's. */
    const char *socks[VHD_OPT_MAX_DEVICES + 1];
    int dirs[VHD_OPT_MAX_DEVICES + 1]; /* where they are removed at exit */
    bool keep_group[VHD_OPT_MAX_DEVICES + 1];
    unsigned nsocks = 0;
    char err[512] = "";

    for (int i = 0; i < d->ndev; i++)
        /* A client's socket is the front-end's, an inherited one (--fd) its creator's. */
        if (!vhd_device_is_client(d->dev[i]) && vhd_device_socket_dir_fd(d->dev[i]) >= 0) {
            dirs[nsocks] = vhd_device_socket_dir_fd(d->dev[i]);
            socks[nsocks] = vhd_device_socket_path(d->dev[i]);
            keep_group[nsocks] = socket_group_set(&d->opts, socks[nsocks]);
            nsocks++;
        }
    bool client = false; /* a device that connects (the filter allows connect) */
    for (int i = 0; i < d->ndev; i++)
        client |= vhd_device_is_client(d->dev[i]);
    enum vhd_sandbox_mode mode = d->opts.sandbox == VHD_OPT_SANDBOX_OFF   ? VHD_SANDBOX_OFF
                                 : d->opts.sandbox == VHD_OPT_SANDBOX_LOG ? VHD_SANDBOX_LOG
                                                                          : VHD_SANDBOX_ON;
    if (d->rpc) {
        /* The RPC socket is chowned to --user too (it may manage the daemon). */
        dirs[nsocks] = vhd_rpc_dir_fd(d->rpc);
        keep_group[nsocks] = false;
        socks[nsocks++] = vhd_rpc_path(d->rpc);
    }
    struct vhd_sandbox_opts so = {
        .mode = mode,
        .user = d->opts.user,
        .chown_paths = socks,
        .chown_keep_group = keep_group,
        .nchown = nsocks,
        .client_mode = client,
        .unlink_dirs = dirs,
        .nunlink_dirs = nsocks,
    };
    for (int i = 0; i < d->opts.nblk; i++) {
        so.nbd |= !strcmp(d->opts.blk[i].backend, "nbd"); /* its workers (re)connect */
        so.nbd_tcp |= vhd_sandbox_blk_uses_tcp(&d->opts.blk[i]);
    }
    so.nbd_tcp |= d->rpc && d->opts.rpc_nbd_tcp;
    d->nbd_tcp = so.nbd_tcp;
    so.rpc = d->rpc != NULL; /* devices added at runtime: the filter's --rpc rows */
    if (vhd_sandbox_enter(&so, err, sizeof(err)) < 0) {
        fprintf(stderr, "vhostd: sandbox: %s\n", err);
        return -1;
    }
    return 0;
}

static void shutdown_all(struct daemon *d)
{
    vhd_rpc_free(d->rpc); /* connections closed; the devices stay in the context */
    d->rpc = NULL;
    /* Sessions end first (in-flight I/O completes), then each backend is flushed and closed. */
    vhd_ctx_destroy(d->ctx);
    d->ctx = NULL;
    if (d->sigfd >= 0)
        close(d->sigfd);
    vhd_options_free(&d->opts);
}

int main(int argc, char **argv)
{
    static struct daemon d = {.sigfd = -1};
    char err[512] = "";

    /*
     * SIGHUP, SIGUSR1 and SIGUSR2 kill by default: blocked before anything
     * else (a reload asked while --config is still being read waits for the
     * control loop). SIGINT and SIGTERM keep killing until the devices exist,
     * then go to the signalfd too (below).
     */
    sigset_t early;
    sigemptyset(&early);
    sigaddset(&early, SIGHUP);
    sigaddset(&early, SIGUSR1);
    sigaddset(&early, SIGUSR2);
    sigprocmask(SIG_BLOCK, &early, NULL);

    /* The vhost-user spec: print them and exit, whatever else the command line says. */
    int caps = vhd_conv_print_capabilities(argc, argv, stdout);
    if (caps != 0)
        return caps > 0 ? 0 : 2;
    d.argc = argc;
    d.argv = argv;
    if (vhd_options_parse(&d.opts, argc, argv, err, sizeof(err)) < 0) {
        fprintf(stderr, "vhostd: %s\n", err);
        vhd_options_free(&d.opts);
        return 2;
    }
    if (d.opts.help || d.opts.version) {
        if (d.opts.help)
            fputs(vhd_usage, stdout);
        else
            printf("vhostd %s\n", vhd_version());
        vhd_options_free(&d.opts);
        return 0;
    }
    vhd_log_set_level((enum vhd_log_level)d.opts.log_level);
    (void)vhd_sandbox_raise_nofile(); /* logged; a failure is not fatal */

    unsigned nworkers = worker_count(&d.opts);
    for (int i = 0; i < d.opts.nblk; i++)
        if (check_workers(d.opts.blk[i].name, d.opts.blk[i].workers, d.opts.blk[i].nworkers,
                          nworkers) < 0)
            goto usage;
    for (int i = 0; i < d.opts.nnet; i++)
        if (check_workers(d.opts.net[i].name, d.opts.net[i].workers, d.opts.net[i].nworkers,
                          nworkers) < 0)
            goto usage;

    /* Signals go to the control loop through a signalfd; block them before any thread starts. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct vhd_ctx_config cc;
    vhd_ctx_config_init(&cc);
    cc.workers = nworkers;
    cc.poll_us = d.opts.poll_us;
    cc.spin_us = d.opts.spin_us;
    cc.cpus = d.opts.ncpus ? d.opts.cpus : NULL;
    cc.ncpus = d.opts.ncpus;
    cc.poll = d.opts.poll_mode == VHD_OPT_POLL_ALWAYS  ? VHD_CTX_POLL_ALWAYS
              : d.opts.poll_mode == VHD_OPT_POLL_NEVER ? VHD_CTX_POLL_NEVER
                                                       : VHD_CTX_POLL_ADAPTIVE;
    /*
     * A front-end that shrinks its guest-memory file makes our next touch of
     * the lost pages SIGBUS: the guard absorbs it and the device is marked
     * broken instead of the daemon dying.
     */
    cc.sigbus_guard = true;
    vhd_set_guest_mem_limit(d.opts.max_guest_mem); /* --max-guest-mem: all devices together */
    int rc = vhd_ctx_new(&cc, &d.ctx);
    if (rc < 0) {
        fprintf(stderr, "vhostd: workers: %s%s\n", strerror(-rc),
                rc == -EINVAL && cc.ncpus ? " (--cpus: see the error above)" : "");
        goto fail;
    }
    if (d.opts.rpc) {
        const struct vhd_rpc_ops ops = {.new_blk = new_blk,
                                        .new_net = new_net,
                                        .open_blk = open_blk,
                                        .reload = reload_op,
                                        .opaque = &d};
        rc = vhd_rpc_new(d.ctx, &d.opts, &ops, &d.rpc);
        if (rc < 0) {
            fprintf(stderr, "vhostd: --rpc: %s\n", strerror(-rc));
            goto fail;
        }
    }
    if (create_devices(&d) < 0)
        goto fail;
    d.started = true;
    /* The RPC socket last: once it exists, every device of the command line does. */
    if (d.rpc && vhd_rpc_listen(d.rpc, d.opts.rpc, err, sizeof(err)) < 0) {
        fprintf(stderr, "vhostd: %s\n", err);
        goto fail;
    }

    d.sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    rc = d.sigfd < 0 ? -errno : vhd_ctx_watch_fd(d.ctx, d.sigfd, EPOLLIN, on_signal, &d, NULL);
    if (rc < 0) {
        fprintf(stderr, "vhostd: signal handling: %s\n", strerror(-rc));
        goto fail;
    }
    if (cc.poll == VHD_CTX_POLL_ADAPTIVE && cc.poll_us > 0) /* --poll-us 0: event mode */
        vhd_log(VHD_LOG_INFO, "vhostd %s: %d device(s), %u worker(s), adaptive polling %u us",
                vhd_version(), d.ndev, nworkers, cc.poll_us);
    else if (cc.poll != VHD_CTX_POLL_ALWAYS && cc.spin_us == VHD_CTX_SPIN_AUTO)
        vhd_log(VHD_LOG_INFO,
                "vhostd %s: %d device(s), %u worker(s), polling never, spin auto (one wake-up)",
                vhd_version(), d.ndev, nworkers);
    else
        vhd_log(VHD_LOG_INFO, "vhostd %s: %d device(s), %u worker(s), polling %s, spin %u us",
                vhd_version(), d.ndev, nworkers,
                cc.poll == VHD_CTX_POLL_ALWAYS ? "always" : "never",
                cc.poll == VHD_CTX_POLL_ALWAYS ? 0 : cc.spin_us);
    int notify = vhd_conv_notify_open(); /* connected while the sandbox allows it */
    if (enter_sandbox(&d) < 0) {
        if (notify >= 0)
            close(notify);
        goto fail;
    }
    vhd_conv_notify_ready(notify); /* every device and the RPC socket accept connections */

    rc = vhd_ctx_run(d.ctx);
    if (rc < 0)
        vhd_log(VHD_LOG_ERROR, "control loop: %s", strerror(-rc));
    shutdown_all(&d);
    vhd_log(VHD_LOG_INFO, "stopped");
    return rc < 0 ? 1 : 0;

usage:
    vhd_options_free(&d.opts);
    return 2;
fail:
    shutdown_all(&d);
    return 1;
}
