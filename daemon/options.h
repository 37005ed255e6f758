/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd's command line and config file: parsed into plain structs, with a
 * one-line error for anything wrong. No side effects (nothing is opened or
 * created here), so it is unit-tested on its own.
 */
#ifndef VHD_OPTIONS_H
#define VHD_OPTIONS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vhostd/vhostd.h" /* vhd_parse_size: the values of size keys */

#define VHD_OPT_MAX_DEVICES 1024 /* --blk and --net together (and the RPC's table) */
#define VHD_OPT_MAX_WORKERS 64
#define VHD_OPT_MAX_QUEUES  64

/* ---- socket access: who may connect (transport/vu_sock.h), for --blk and --net ---- */
#define VHD_OPT_MAX_ALLOW 16 /* ids per allow-uid= / allow-gid= list */
struct vhd_opt_access {
    uint32_t mode;         /* socket-mode=0660 (octal); 0: the default, 0600 */
    const char *group;     /* socket-group=NAME|GID; NULL: the creator's */
    const char *allow_uid; /* allow-uid=LIST: NAME|UID items separated by ':'; NULL: anyone */
    const char *allow_gid; /* allow-gid=LIST: GROUP|GID items separated by ':' */
};

/* One --blk device. Strings point into storage owned by struct vhd_options. */
struct vhd_opt_blk {
    const char *spec;        /* the KEY=VALUE,... text as given (vhostd's save-config) */
    const char *socket;      /* required */
    const char *name;        /* for logs; default: the socket's file name */
    const char *image;       /* uring backend: the file or block device */
    const char *uri;         /* nbd backend: the server's URI */
    const char *backend;     /* "uring" (default), "null", "nbd" or "rbd" */
    const char *pool;        /* rbd: RADOS pool (required) */
    const char *conf;        /* rbd: ceph.conf; NULL: librados' default search */
    const char *user;        /* rbd: client id; NULL: librados' default */
    const char *lost_writes; /* nbd: "report" or "ignore" (NULL: ignore) */
    const char *snap;        /* rbd: snapshot, served read-only */
    uint64_t size;           /* bytes; null: required; uring: create a sparse image if absent */
    uint32_t queues;         /* 1..VHD_OPT_MAX_QUEUES, default 1 */
    uint32_t block_size;     /* 512..4096, power of two, default 512 */
    const char *serial;      /* GET_ID answer, at most 20 bytes */
    bool ro;
    bool direct;         /* O_DIRECT */
    const char *locking; /* locking=auto|on|off (NULL: auto) */
    const char *werror;  /* werror=report|stop|enospc (NULL: enospc) */
    const char *rerror;  /* rerror=report|stop (NULL: report) */
    bool allow_split;    /* rings=split|packed|both (default both) */
    bool allow_packed;
    int nworkers;                     /* 0: round robin over every worker */
    int workers[VHD_OPT_MAX_WORKERS]; /* queue i runs on workers[i % nworkers] */
    uint64_t max_guest_mem;           /* max-guest-mem=SIZE; 0: the library's default */
    /* ---- client mode ---- */
    bool client;               /* client=on: connect to the front-end's socket, do not listen */
    uint32_t reconnect_max_ms; /* reconnect-max=MS: longest back-off (0: the default, 2000) */
    struct vhd_opt_access access;
    int fd; /* --fd N: serve this inherited listening socket (socket= names it); 0: none */
};

/* ---- net ---- */
/* One --net device (virtio-net). Strings point into storage owned by struct vhd_options. */
struct vhd_opt_net {
    const char *spec;        /* the KEY=VALUE,... text as given (vhostd's save-config) */
    const char *socket;      /* required */
    const char *name;        /* for logs; default: the socket's file name */
    const char *backend;     /* "loopback" (default), "switch", "tap" */
    const char *switch_name; /* backend=switch: switch=NAME */
    const char *tap_name;    /* backend=tap: tap=IFNAME */
    uint32_t queues;         /* queue pairs, 1..VHD_OPT_MAX_QUEUES, default 1 */
    uint8_t mac[6];          /* when mac_set; else the daemon derives one from the socket path */
    bool mac_set;
    uint32_t mtu;     /* 68..65535, default 1500 */
    bool allow_split; /* rings=split|packed|both (default both) */
    bool allow_packed;
    int nworkers;                     /* 0: pairs round robin over every worker */
    int workers[VHD_OPT_MAX_WORKERS]; /* pair i (both rings) runs on workers[i % nworkers] */
    uint64_t max_guest_mem;           /* max-guest-mem=SIZE; 0: the library's default */
    /* ---- client mode ---- */
    bool client;               /* client=on: connect to the front-end's socket, do not listen */
    uint32_t reconnect_max_ms; /* reconnect-max=MS: longest back-off (0: the default, 2000) */
    struct vhd_opt_access access;
    int fd; /* --fd N: serve this inherited listening socket (socket= names it); 0: none */
};
/* ---- end net ---- */

enum vhd_opt_poll { VHD_OPT_POLL_ADAPTIVE, VHD_OPT_POLL_ALWAYS, VHD_OPT_POLL_NEVER };

/* --sandbox (daemon/sandbox.h). */
enum vhd_opt_sandbox { VHD_OPT_SANDBOX_ON, VHD_OPT_SANDBOX_OFF, VHD_OPT_SANDBOX_LOG };

struct vhd_options {
    unsigned workers; /* default: min(total queues, online CPUs) */
    bool workers_set;
    enum vhd_opt_poll poll_mode;
    unsigned poll_us; /* default 50 */
    unsigned spin_us; /* --spin-us: event-mode spin (default VHD_CTX_SPIN_AUTO) */
    /* --cpus LIST: worker i pinned to cpus[i % ncpus]; ncpus 0: not pinned */
    unsigned cpus[VHD_OPT_MAX_WORKERS];
    unsigned ncpus;
    int log_level; /* 0 error, 1 warn, 2 info (default), 3 debug */
    bool help, version;
    /* ---- sandboxing (daemon/sandbox.h) ---- */
    enum vhd_opt_sandbox sandbox; /* default on */
    const char *user;             /* --user: drop to this user after setup; NULL: stay */
    /* ---- end sandboxing ---- */
    /* --max-guest-mem: guest memory all devices together may map; 0: the library's default */
    uint64_t max_guest_mem;
    const char *rpc; /* --rpc PATH: the management socket (daemon/rpc.h); devices become optional */
    bool rpc_nbd_tcp; /* --rpc-nbd-tcp on: runtime adds may use nbd:// (TCP) under the filter */
    /*
     * The vhost-user spec's backend program conventions (docs/USER-GUIDE.md):
     * one more device, on --socket-path or on the inherited listening --fd,
     * of kind --type (default: blk, net when the program is called
     * vhostd-net), with --blk-file / --read-only (blk) and --keys KEY=VALUE,...
     * (any key of --blk / --net but socket=). It becomes the last blk[] or
     * net[] entry, parsed as one.
     */
    struct vhd_opt_conv {
        const char *type;        /* "blk" or "net"; NULL: by the program name */
        const char *socket_path; /* --socket-path PATH */
        int fd;                  /* --fd N, N >= 3 (0-2 are stdio, per the spec); 0: none */
        const char *blk_file;    /* --blk-file PATH: image=PATH */
        bool read_only;          /* --read-only: ro=on */
        const char *keys;        /* --keys KEY=VALUE,... */
        bool print_capabilities; /* --print-capabilities (main.c answers it before parsing) */
    } conv;
    int nblk;
    struct vhd_opt_blk blk[VHD_OPT_MAX_DEVICES];
    int nnet; /* --net devices; nblk + nnet <= VHD_OPT_MAX_DEVICES */
    struct vhd_opt_net net[VHD_OPT_MAX_DEVICES];
    char **strings; /* owned copies the fields above point into */
    int nstrings;
};

/*
 * vhd_options_parse - parse argv into o (zeroed and defaulted first). Reads
 * --config files too. Returns 0, or -1 with a one-line message in err.
 */
int vhd_options_parse(struct vhd_options *o, int argc, char **argv, char *err, size_t errlen);

/*
 * vhd_options_parse_blk - parse one device spec "socket=PATH,image=...,..."
 * into b. 0, or -1 with a message in err.
 */
int vhd_options_parse_blk(struct vhd_options *o, const char *spec, struct vhd_opt_blk *b, char *err,
                          size_t errlen);

/*
 * vhd_options_parse_net - parse one --net spec "socket=PATH,backend=loopback,
 * queues=N,..." into n. 0, or -1 with a message in err.
 */
int vhd_options_parse_net(struct vhd_options *o, const char *spec, struct vhd_opt_net *n, char *err,
                          size_t errlen);

/* reconnect-max=MS bounds (client mode). */
#define VHD_OPT_RECONNECT_MAX_MIN_MS 10u
#define VHD_OPT_RECONNECT_MAX_MAX_MS 3600000u

/* Parse a MAC address "52:54:00:12:34:56" (a unicast, non-zero one). 0 or -1. */
int vhd_parse_mac(const char *s, uint8_t mac[6]);

/* Free the owned strings. */
void vhd_options_free(struct vhd_options *o);

/* The --help text. */
extern const char vhd_usage[];

#endif /* VHD_OPTIONS_H */
