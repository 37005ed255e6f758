/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Parsing of vhostd's command line (--blk KEY=VALUE,... and global options)
 * and of config files (the same options, one per line, without the dashes).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "options.h"

const char vhd_usage[] =
    "usage: vhostd [OPTIONS] --blk socket=PATH,KEY=VALUE,... [--blk ...]\n"
    "       vhostd [OPTIONS] --net socket=PATH,KEY=VALUE,... [--net ...]\n"
    "\n"
    "Serves virtio-blk and virtio-net devices to vhost-user front-ends (QEMU,\n"
    "cloud-hypervisor, DPDK virtio-user, ...). --blk and --net may be mixed.\n"
    "\n"
    "Global options:\n"
    "  --workers N          worker threads (default: min(total queues, CPUs))\n"
    "  --poll MODE          adaptive (default) | always | never\n"
    "  --poll-us N          adaptive polling: the longest window after the last work, in us\n"
    "                       (default 50); 0: event mode, as --poll never (with the spin)\n"
    "  --spin-us N|auto     event mode (and the adaptive window's floor): poll N us after\n"
    "                       work before re-enabling notifications and sleeping (0: sleep at\n"
    "                       once); auto (default): what a sleep and wake-up cost each worker,\n"
    "                       as it measures them (10..100 us)\n"
    "  --cpus LIST          pin worker i to the i-th CPU of LIST (taskset -c syntax: 0,2-5);\n"
    "                       without --workers, one worker per listed CPU; with more workers\n"
    "                       than CPUs the list repeats\n"
    "  --log-level LEVEL    error | warn | info (default) | debug\n"
    "  --sandbox MODE       on (default): after setup, a seccomp filter confines vhostd to\n"
    "                       the syscalls it needs; another kills it (SIGSYS) | log: allow\n"
    "                       and log them (dmesg) | off\n"
    "  --user NAME          after setup, drop to user NAME (or UID[:GID]); the sockets are\n"
    "                       chowned to it first\n"
    "  --max-guest-mem SIZE most guest memory all devices together may map (default 64T);\n"
    "                       a memory table beyond it is refused\n"
    "  --rpc PATH           serve the management API (JSON-RPC 2.0, see vhostctl(1)) on a\n"
    "                       Unix socket (mode 0600); devices may then be added at runtime\n"
    "                       and none is needed at start (under the filter: docs/SECURITY.md)\n"
    "  --rpc-nbd-tcp on|off with --rpc, may a runtime add use an NBD server over TCP\n"
    "                       (nbd://ADDRESS/)? off (default): the filter forbids inet sockets\n"
    "  --config FILE        read options from FILE, one per line without the dashes\n"
    "                       (e.g. 'workers 2', 'blk socket=/run/vm1.sock,image=vm1.img'); '#' "
    "comments\n"
    "  --help, --version\n"
    "\n"
    "One device the vhost-user way (the spec's backend program conventions):\n"
    "  --print-capabilities print the backend's capabilities as JSON and exit (only --type\n"
    "                       is looked at)\n"
    "  --socket-path PATH   serve one device on a socket vhostd creates at PATH, or\n"
    "  --fd N               on the inherited listening Unix socket N (N >= 3)\n"
    "  --type blk|net       its kind (default blk; net when run as vhostd-net)\n"
    "  --blk-file PATH      blk: the image (image=PATH)\n"
    "  --read-only          blk: a read-only device (ro=on)\n"
    "  --keys KEY=VALUE,... more keys of --blk or --net (not socket=), e.g.\n"
    "                       backend=null,size=1G or backend=tap,tap=tap0\n"
    "\n"
    "--blk keys:\n"
    "  socket=PATH          vhost-user socket to listen on (required); with client=on, the\n"
    "                       front-end's socket to connect to\n"
    "  image=PATH           backing file or block device (uring backend); backend=rbd: the\n"
    "                       RBD image's name\n"
    "  backend=uring|null|nbd|rbd  io_uring file backend (default), null (no storage, reads\n"
    "                       zeroes), nbd (an NBD server, see uri=) or rbd (a Ceph RBD image\n"
    "                       through librbd; needs --sandbox off)\n"
    "  uri=URI              backend=nbd: nbd://HOST[:PORT]/EXPORT or\n"
    "                       nbd+unix:///EXPORT?socket=PATH\n"
    "  pool=NAME            backend=rbd: the RADOS pool (required)\n"
    "  conf=FILE            backend=rbd: ceph.conf (default: librados' search path)\n"
    "  user=ID              backend=rbd: Ceph client id, e.g. admin (default: librados')\n"
    "  snap=NAME            backend=rbd: serve this snapshot, read-only\n"
    "  lost-writes=report|ignore  backend=nbd: when a connection drops while the server holds\n"
    "                       acknowledged writes no flush covered, report: the next guest\n"
    "                       FLUSH fails once (the server may have lost them); ignore\n"
    "                       (default, as QEMU's NBD client): logged, the flush succeeds\n"
    "  size=SIZE            bytes (K/M/G/T suffixes): null device size; for uring, create a\n"
    "                       sparse image of this size when the file does not exist (an\n"
    "                       existing image must then have exactly this size)\n"
    "  queues=N             number of virtqueues (1..64, default 1)\n"
    "  ro=on|off            read-only device (default off)\n"
    "  serial=STR           serial number reported by GET_ID (at most 20 characters)\n"
    "  block-size=N         logical block size, 512..4096, power of two (default 512)\n"
    "  direct=on|off        O_DIRECT on the image (default off: buffered); rbd: librbd's\n"
    "                       cache off\n"
    "  locking=auto|on|off  lock the image as QEMU does, so QEMU, qemu-storage-daemon or\n"
    "                       another vhostd cannot write it while we serve it (default auto:\n"
    "                       on, unless the file system has no OFD locks); off: no locks\n"
    "  werror=report|stop|enospc  a failed write, flush, discard: report (IOERR to the\n"
    "                       guest), stop (hold it and pause the queue until SIGUSR2), or\n"
    "                       enospc (stop on ENOSPC, report others; default)\n"
    "  rerror=report|stop   a failed read: report (default) or stop\n"
    "  rings=split|packed|both   ring layouts offered (default both)\n"
    "  workers=LIST         workers for this device's queues, e.g. 0,1 or 0-3 (default: all,\n"
    "                       round robin)\n"
    "  name=STR             name used in logs (default: the socket's file name)\n"
    "  max-guest-mem=SIZE   most guest memory a front-end may have this device map (memory\n"
    "                       table and added regions; default 16T): more is refused\n"
    "  client=on|off        client mode (default off): connect to a front-end that listens on\n"
    "                       socket= (QEMU server=on, DPDK virtio-user server=1), and connect\n"
    "                       again whenever the connection fails or the session ends\n"
    "  reconnect-max=MS     client mode: retries back off from 50 ms, doubling up to MS\n"
    "                       (10..3600000, default 2000)\n"
    "  socket-mode=MODE     permissions of the socket file, octal (default 0600, whatever\n"
    "                       the umask)\n"
    "  socket-group=GROUP   group of the socket file (a name or GID)\n"
    "  allow-uid=LIST       only peers with one of these uids (or allow-gid= gids) may\n"
    "                       connect (SO_PEERCRED; client mode: the listening front-end);\n"
    "                       names or ids separated by ':', e.g. 0:libvirt-qemu\n"
    "  allow-gid=LIST       the same for the peer's (primary) gid\n"
    /* ---- net ---- */
    "\n"
    "--net keys (virtio-net; SIGUSR1 logs every net device's per-queue counters):\n"
    "  socket=PATH          vhost-user socket to listen on (required); with client=on, the\n"
    "                       front-end's socket to connect to\n"
    "  backend=loopback|switch|tap|gen\n"
    "                       loopback (default): every frame sent on a queue pair comes\n"
    "                       back on the receive queue of the same pair; switch: an L2\n"
    "                       learning switch between the --net devices naming the same\n"
    "                       switch=; tap: a Linux TAP interface (tap=); gen: fills\n"
    "                       receive queues with generated 64-byte frames, discards sent ones\n"
    "  switch=NAME          backend=switch: the in-process switch to join\n"
    "  tap=IFNAME           backend=tap: the TAP interface to attach to (created if it does\n"
    "                       not exist; needs CAP_NET_ADMIN; one TAP queue per queue pair)\n"
    "  queues=N             number of queue pairs (1..64, default 1)\n"
    "  mac=XX:XX:XX:XX:XX:XX  the device's MAC address (default: 52:54:00 and three bytes\n"
    "                       derived from the socket path)\n"
    "  mtu=N                MTU reported to the driver, 68..65535 (default 1500)\n"
    "  rings=split|packed|both   ring layouts offered (default both)\n"
    "  workers=LIST         workers for this device's queue pairs, e.g. 0,1 or 0-3; both\n"
    "                       rings of a pair always share a worker (default: all, round robin)\n"
    "  name=STR             name used in logs (default: the socket's file name)\n"
    "  max-guest-mem=SIZE   as for --blk\n"
    "  client=on|off, reconnect-max=MS   client mode, as for --blk\n"
    "  socket-mode=MODE, socket-group=GROUP, allow-uid=LIST, allow-gid=LIST   as for --blk\n";
/* ---- end net ---- */

static int fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -1;
}

/* Keep a copy of s owned by o; NULL on allocation failure. */
static char *own(struct vhd_options *o, const char *s)
{
    char **n = realloc(o->strings, (size_t)(o->nstrings + 1) * sizeof(*n));
    if (!n)
        return NULL;
    o->strings = n;
    char *c = strdup(s);
    if (!c)
        return NULL;
    o->strings[o->nstrings++] = c;
    return c;
}

void vhd_options_free(struct vhd_options *o)
{
    for (int i = 0; i < o->nstrings; i++)
        free(o->strings[i]);
    free(o->strings);
    o->strings = NULL;
    o->nstrings = 0;
}

static int parse_uint(const char *s, uint64_t max, uint64_t *out)
{
    char *end;
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end || v > max)
        return -1;
    *out = v;
    return 0;
}

static int parse_bool(const char *s, bool *out)
{
    if (!strcmp(s, "on") || !strcmp(s, "yes") || !strcmp(s, "true") || !strcmp(s, "1")) {
        *out = true;
        return 0;
    }
    if (!strcmp(s, "off") || !strcmp(s, "no") || !strcmp(s, "false") || !strcmp(s, "0")) {
        *out = false;
        return 0;
    }
    return -1;
}

/* "0,2,5-7" -> workers[0..*nworkers) (the list of a --blk or --net device). */
static int parse_worker_list(char *s, int *nworkers, int *workers)
{
    *nworkers = 0;
    for (char *save = NULL, *tok = strtok_r(s, ":;", &save); tok;
         tok = strtok_r(NULL, ":;", &save)) {
        uint64_t lo, hi;
        char *dash = strchr(tok, '-');
        if (dash) {
            *dash = '\0';
            if (parse_uint(tok, VHD_OPT_MAX_WORKERS - 1, &lo) ||
                parse_uint(dash + 1, VHD_OPT_MAX_WORKERS - 1, &hi) || lo > hi)
                return -1;
        } else {
            if (parse_uint(tok, VHD_OPT_MAX_WORKERS - 1, &lo))
                return -1;
            hi = lo;
        }
        for (uint64_t w = lo; w <= hi; w++) {
            if (*nworkers >= VHD_OPT_MAX_WORKERS)
                return -1;
            workers[(*nworkers)++] = (int)w;
        }
    }
    return *nworkers ? 0 : -1;
}

/* ---- device keys: --blk and --net (and their config-file lines) ---- */

/* The device kinds, as bits of struct dev_key's kinds. */
enum { DEV_BLK = 1, DEV_NET = 2 };

/* How a key's value is parsed and stored. */
enum key_type {
    KEY_STR,     /* const char *; max: longest length (0: any) */
    KEY_CHOICE,  /* const char *, one of choices */
    KEY_SIZE,    /* uint64_t, vhd_parse_size, not 0 */
    KEY_UINT,    /* uint32_t in min..max */
    KEY_POW2,    /* uint32_t, a power of two in min..max */
    KEY_BOOL,    /* bool: on/off, yes/no, true/false, 1/0 */
    KEY_RINGS,   /* split|packed|both into allow_split and allow_packed */
    KEY_MAC,     /* uint8_t[6], vhd_parse_mac */
    KEY_WORKERS, /* a worker list; commas may continue it (parse_device) */
    KEY_MODE,    /* uint32_t, octal permission bits in min..max */
    KEY_IDS,     /* const char *: 1..VHD_OPT_MAX_ALLOW non-empty items separated by ':' */
};

/*
 * One key of a device spec: its name, which kinds take it, how its value is
 * parsed, where it goes in struct vhd_opt_blk (dst[0]) and struct vhd_opt_net
 * (dst[1]), and what a bad value is told.
 */
struct dev_key {
    const char *name;
    const char *alias; /* another spelling ("block_size"), or NULL */
    unsigned kinds;    /* DEV_BLK | DEV_NET: the specs that accept it */
    enum key_type type;
    uint64_t min, max;
    const char *const *choices; /* KEY_CHOICE: NULL-terminated */
    const char *expect;         /* "KEY=VALUE: <expect>"; KEY_UINT: follows "expected MIN..MAX" */
    size_t dst[2];              /* offset of the field, per kind (unused for kinds not taking it) */
    size_t flag[2];             /* offset of a bool set when the key is given; 0: none */
};

#define BLK_AT(f)                          \
    {                                      \
        offsetof(struct vhd_opt_blk, f), 0 \
    }
#define NET_AT(f)                          \
    {                                      \
        0, offsetof(struct vhd_opt_net, f) \
    }
#define BOTH_AT(f)                                                       \
    {                                                                    \
        offsetof(struct vhd_opt_blk, f), offsetof(struct vhd_opt_net, f) \
    }
#define ON_OFF         "expected on or off"
#define WORKERS_EXPECT "expected a list like 0,1 or 0-3"

/* KEY_RINGS writes allow_packed right after allow_split. */
_Static_assert(offsetof(struct vhd_opt_blk, allow_packed) ==
                   offsetof(struct vhd_opt_blk, allow_split) + sizeof(bool),
               "blk rings fields");
_Static_assert(offsetof(struct vhd_opt_net, allow_packed) ==
                   offsetof(struct vhd_opt_net, allow_split) + sizeof(bool),
               "net rings fields");

static const char *const blk_backends[] = {"uring", "null", "nbd", "rbd", NULL};
static const char *const blk_locking[] = {"auto", "on", "off", NULL};
static const char *const blk_werror[] = {"report", "stop", "enospc", NULL};
static const char *const blk_lost_writes[] = {"report", "ignore", NULL};
static const char *const blk_rerror[] = {"report", "stop", NULL};
static const char *const net_backends[] = {"loopback", "switch", "tap", "gen", NULL};

static const struct dev_key dev_keys[] = {
    {"socket", NULL, DEV_BLK | DEV_NET, KEY_STR, 0, 0, NULL, NULL, BOTH_AT(socket), {0, 0}},
    {"name", NULL, DEV_BLK | DEV_NET, KEY_STR, 0, 0, NULL, NULL, BOTH_AT(name), {0, 0}},
    {"image", NULL, DEV_BLK, KEY_STR, 0, 0, NULL, NULL, BLK_AT(image), {0, 0}},
    {"uri", NULL, DEV_BLK, KEY_STR, 0, 0, NULL, NULL, BLK_AT(uri), {0, 0}},
    {"backend",
     NULL,
     DEV_BLK,
     KEY_CHOICE,
     0,
     0,
     blk_backends,
     "expected uring, null, nbd or rbd",
     BLK_AT(backend),
     {0, 0}},
    {"backend",
     NULL,
     DEV_NET,
     KEY_CHOICE,
     0,
     0,
     net_backends,
     "expected loopback, switch, tap or gen",
     NET_AT(backend),
     {0, 0}},
    {"switch",
     NULL,
     DEV_NET,
     KEY_STR,
     0,
     31,
     NULL,
     "name longer than 31 bytes",
     NET_AT(switch_name),
     {0, 0}},
    {"tap",
     NULL,
     DEV_NET,
     KEY_STR,
     0,
     15,
     NULL,
     "interface name longer than 15 bytes",
     NET_AT(tap_name),
     {0, 0}},
    {"size",
     NULL,
     DEV_BLK,
     KEY_SIZE,
     0,
     0,
     NULL,
     "expected a size like 512M or 8G",
     BLK_AT(size),
     {0, 0}},
    {"queues", NULL, DEV_BLK, KEY_UINT, 1, VHD_OPT_MAX_QUEUES, NULL, "", BLK_AT(queues), {0, 0}},
    {"queues",
     NULL,
     DEV_NET,
     KEY_UINT,
     1,
     VHD_OPT_MAX_QUEUES,
     NULL,
     " queue pairs",
     NET_AT(queues),
     {0, 0}},
    {"block-size",
     "block_size",
     DEV_BLK,
     KEY_POW2,
     512,
     4096,
     NULL,
     "expected a power of two in 512..4096",
     BLK_AT(block_size),
     {0, 0}},
    {"serial",
     NULL,
     DEV_BLK,
     KEY_STR,
     0,
     20,
     NULL,
     "at most 20 characters",
     BLK_AT(serial),
     {0, 0}},
    {"ro", NULL, DEV_BLK, KEY_BOOL, 0, 0, NULL, ON_OFF, BLK_AT(ro), {0, 0}},
    {"direct", NULL, DEV_BLK, KEY_BOOL, 0, 0, NULL, ON_OFF, BLK_AT(direct), {0, 0}},
    {"lost-writes",
     NULL,
     DEV_BLK,
     KEY_CHOICE,
     0,
     0,
     blk_lost_writes,
     "expected report or ignore",
     BLK_AT(lost_writes),
     {0, 0}},
    {"locking",
     NULL,
     DEV_BLK,
     KEY_CHOICE,
     0,
     0,
     blk_locking,
     "expected auto, on or off",
     BLK_AT(locking),
     {0, 0}},
    {"werror",
     NULL,
     DEV_BLK,
     KEY_CHOICE,
     0,
     0,
     blk_werror,
     "expected report, stop or enospc",
     BLK_AT(werror),
     {0, 0}},
    {"rerror",
     NULL,
     DEV_BLK,
     KEY_CHOICE,
     0,
     0,
     blk_rerror,
     "expected report or stop",
     BLK_AT(rerror),
     {0, 0}},
    /* backend=rbd */
    {"pool", NULL, DEV_BLK, KEY_STR, 0, 0, NULL, NULL, BLK_AT(pool), {0, 0}},
    {"conf", NULL, DEV_BLK, KEY_STR, 0, 0, NULL, NULL, BLK_AT(conf), {0, 0}},
    {"user", NULL, DEV_BLK, KEY_STR, 0, 0, NULL, NULL, BLK_AT(user), {0, 0}},
    {"snap", NULL, DEV_BLK, KEY_STR, 0, 0, NULL, NULL, BLK_AT(snap), {0, 0}},
    {"mac", NULL, DEV_NET, KEY_MAC, 0, 0, NULL, "expected a unicast address like 52:54:00:12:34:56",
     NET_AT(mac), NET_AT(mac_set)},
    {"mtu", NULL, DEV_NET, KEY_UINT, 68, 65535, NULL, "", NET_AT(mtu), {0, 0}},
    {"rings",
     NULL,
     DEV_BLK | DEV_NET,
     KEY_RINGS,
     0,
     0,
     NULL,
     "expected split, packed or both",
     BOTH_AT(allow_split),
     {0, 0}},
    {"workers", NULL, DEV_BLK | DEV_NET, KEY_WORKERS, 0, 0, NULL, WORKERS_EXPECT, {0, 0}, {0, 0}},
    {"max-guest-mem",
     "max_guest_mem",
     DEV_BLK | DEV_NET,
     KEY_SIZE,
     0,
     0,
     NULL,
     "expected a size like 64G or 2T",
     BOTH_AT(max_guest_mem),
     {0, 0}},
    /* client mode */
    {"client", NULL, DEV_BLK | DEV_NET, KEY_BOOL, 0, 0, NULL, ON_OFF, BOTH_AT(client), {0, 0}},
    {"reconnect-max",
     "reconnect_max",
     DEV_BLK | DEV_NET,
     KEY_UINT,
     VHD_OPT_RECONNECT_MAX_MIN_MS,
     VHD_OPT_RECONNECT_MAX_MAX_MS,
     NULL,
     " milliseconds",
     BOTH_AT(reconnect_max_ms),
     {0, 0}},
    /* socket access (transport/vu_sock.h) */
    {"socket-mode",
     "socket_mode",
     DEV_BLK | DEV_NET,
     KEY_MODE,
     1,
     0777,
     NULL,
     "expected octal permissions like 0660",
     BOTH_AT(access.mode),
     {0, 0}},
    {"socket-group",
     "socket_group",
     DEV_BLK | DEV_NET,
     KEY_STR,
     0,
     0,
     NULL,
     NULL,
     BOTH_AT(access.group),
     {0, 0}},
    {"allow-uid",
     "allow_uid",
     DEV_BLK | DEV_NET,
     KEY_IDS,
     0,
     0,
     NULL,
     "expected users separated by ':' (at most 16), e.g. 0:libvirt-qemu",
     BOTH_AT(access.allow_uid),
     {0, 0}},
    {"allow-gid",
     "allow_gid",
     DEV_BLK | DEV_NET,
     KEY_IDS,
     0,
     0,
     NULL,
     "expected groups separated by ':' (at most 16), e.g. kvm:107",
     BOTH_AT(access.allow_gid),
     {0, 0}},
};

/* One device spec being parsed: its kind and the fields every kind has. */
struct dev_spec {
    const char *opt; /* "--blk" or "--net": the prefix of every message */
    unsigned kind;   /* DEV_BLK or DEV_NET */
    void *dev;       /* struct vhd_opt_blk or struct vhd_opt_net */
    const char **socket, **name;
    bool *client;
    uint32_t *reconnect_max_ms;
    int *nworkers, *workers;
    const struct vhd_opt_access *access;
};

/* The dev_spec of d, a struct vhd_opt_blk or vhd_opt_net (the fields every kind has). */
#define DEV_SPEC(opt_, kind_, d)                                                                \
    {                                                                                           \
        .opt = (opt_), .kind = (kind_), .dev = (d), .socket = &(d)->socket, .name = &(d)->name, \
        .client = &(d)->client, .reconnect_max_ms = &(d)->reconnect_max_ms,                     \
        .nworkers = &(d)->nworkers, .workers = (d)->workers, .access = &(d)->access,            \
    }

/* The entry for key k of this kind; NULL, with *other set when another kind takes k. */
static const struct dev_key *find_key(unsigned kind, const char *k, unsigned *other)
{
    *other = 0;
    for (size_t i = 0; i < sizeof(dev_keys) / sizeof(dev_keys[0]); i++) {
        const struct dev_key *d = &dev_keys[i];
        if (strcmp(k, d->name) && (!d->alias || strcmp(k, d->alias)))
            continue;
        if (d->kinds & kind)
            return d;
        *other |= d->kinds;
    }
    return NULL;
}

/* Store value v of key d (not KEY_WORKERS) into dev; 0, or -1 when v is not a value of d. */
static int set_key(const struct dev_key *d, unsigned kind, void *dev, const char *v)
{
    char *dst = (char *)dev + d->dst[kind == DEV_NET];
    uint64_t n;

    switch (d->type) {
    case KEY_STR:
        if (d->max && strlen(v) > d->max)
            return -1;
        *(const char **)dst = v;
        break;
    case KEY_CHOICE: {
        const char *const *c = d->choices;
        while (*c && strcmp(v, *c))
            c++;
        if (!*c)
            return -1;
        *(const char **)dst = v;
        break;
    }
    case KEY_SIZE:
        if (vhd_parse_size(v, &n) || n == 0)
            return -1;
        *(uint64_t *)dst = n;
        break;
    case KEY_UINT:
    case KEY_POW2:
        if (parse_uint(v, d->max, &n) || n < d->min || (d->type == KEY_POW2 && (n & (n - 1))))
            return -1;
        *(uint32_t *)dst = (uint32_t)n;
        break;
    case KEY_BOOL:
        if (parse_bool(v, (bool *)dst))
            return -1;
        break;
    case KEY_RINGS: {
        bool *allow = (bool *)dst; /* allow_split, allow_packed */
        allow[0] = !strcmp(v, "split") || !strcmp(v, "both");
        allow[1] = !strcmp(v, "packed") || !strcmp(v, "both");
        if (!allow[0] && !allow[1])
            return -1;
        break;
    }
    case KEY_MAC:
        if (vhd_parse_mac(v, (uint8_t *)dst))
            return -1;
        break;
    case KEY_WORKERS:
        return -1;
    case KEY_MODE: {
        char *end;
        errno = 0;
        unsigned long m = strtoul(v, &end, 8);
        if (!isdigit((unsigned char)*v) || *end || errno || m < d->min || m > d->max)
            return -1;
        *(uint32_t *)dst = (uint32_t)m;
        break;
    }
    case KEY_IDS: {
        unsigned items = 1;
        for (const char *c = v; *c; c++)
            items += *c == ':';
        if (items > VHD_OPT_MAX_ALLOW || v[0] == ':' || v[strlen(v) - 1] == ':' || strstr(v, "::"))
            return -1;
        *(const char **)dst = v;
        break;
    }
    }
    size_t flag = d->flag[kind == DEV_NET];
    if (flag)
        *(bool *)((char *)dev + flag) = true;
    return 0;
}

/*
 * Parse "k=v,k=v" into the device of sp, whose defaults are already set, and
 * check what every kind needs (the worker list, socket=, client mode); the
 * caller checks its kind's own rules after. A worker list may use commas too
 * ("workers=0,1"), so a token without '=' after workers= continues the list.
 */
static int parse_device(struct vhd_options *o, const char *spec, const struct dev_spec *sp,
                        char *err, size_t errlen)
{
    const char *opt = sp->opt;
    char *s = own(o, spec);
    char wl[256] = "";
    bool in_workers = false;

    if (!s)
        return fail(err, errlen, "out of memory");
    /*
     * A device spec must read back as the same one line of a config file
     * (the management API saves running devices as such lines): no control
     * character (a newline would start a line of its own, with any option
     * in it) and no '#' (the rest of the line would be a comment).
     */
    for (const char *p = spec; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '#')
            return fail(err, errlen, "%s: control characters and '#' are not allowed in keys", opt);
    for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            if (in_workers && strlen(wl) + strlen(tok) + 2 < sizeof(wl)) {
                strcat(wl, ":");
                strcat(wl, tok);
                continue;
            }
            return fail(err, errlen, "%s: '%s' is not KEY=VALUE", opt, tok);
        }
        *eq = '\0';
        const char *k = tok, *v = eq + 1;
        in_workers = false;
        if (!*v)
            return fail(err, errlen, "%s: %s= needs a value", opt, k);
        unsigned other;
        const struct dev_key *d = find_key(sp->kind, k, &other);
        if (!d && other)
            return fail(err, errlen, "%s: unknown key '%s' (only %s takes it)", opt, k,
                        other & DEV_BLK ? "--blk" : "--net");
        if (!d)
            return fail(err, errlen, "%s: unknown key '%s'", opt, k);
        if (d->type == KEY_WORKERS) {
            if (strlen(v) >= sizeof(wl))
                return fail(err, errlen, "%s: workers=: list too long", opt);
            strcpy(wl, v);
            in_workers = true;
        } else if (set_key(d, sp->kind, sp->dev, v)) {
            if (d->type == KEY_UINT)
                return fail(err, errlen, "%s: %s=%s: expected %" PRIu64 "..%" PRIu64 "%s", opt,
                            d->name, v, d->min, d->max, d->expect);
            return fail(err, errlen, "%s: %s=%s: %s", opt, d->name, v, d->expect);
        }
    }
    /* parse_worker_list cuts wl at its separators: the message shows the first item. */
    if (wl[0] && parse_worker_list(wl, sp->nworkers, sp->workers))
        return fail(err, errlen, "%s: workers=%s: " WORKERS_EXPECT, opt, wl);
    if (!*sp->socket)
        return fail(err, errlen, "%s: socket=PATH is required", opt);
    if (*sp->reconnect_max_ms && !*sp->client)
        return fail(err, errlen, "%s: reconnect-max= goes with client=on", opt);
    if ((sp->access->mode || sp->access->group) && *sp->client)
        return fail(err, errlen,
                    "%s: socket-mode= and socket-group= are for a socket vhostd listens on, not "
                    "client=on",
                    opt);
    if (!*sp->name) {
        const char *slash = strrchr(*sp->socket, '/');
        *sp->name = slash ? slash + 1 : *sp->socket;
    }
    return 0;
}

int vhd_options_parse_blk(struct vhd_options *o, const char *spec, struct vhd_opt_blk *b, char *err,
                          size_t errlen)
{
    const struct dev_spec sp = DEV_SPEC("--blk", DEV_BLK, b);

    memset(b, 0, sizeof(*b));
    b->backend = "uring";
    b->queues = 1;
    b->block_size = 512;
    b->allow_split = b->allow_packed = true;
    b->spec = own(o, spec);
    if (parse_device(o, spec, &sp, err, errlen))
        return -1;
    bool rbd = !strcmp(b->backend, "rbd");
    if (!rbd && (b->pool || b->conf || b->user || b->snap))
        return fail(err, errlen, "--blk: pool=, conf=, user= and snap= go with backend=rbd");
    if (rbd && (!b->pool || !b->image))
        return fail(err, errlen, "--blk: backend=rbd needs pool=NAME and image=NAME");
    if (!strcmp(b->backend, "nbd") != (b->uri != NULL))
        return fail(err, errlen, "--blk: uri=URI goes with backend=nbd, and only with it");
    if (b->lost_writes && strcmp(b->backend, "nbd"))
        return fail(err, errlen, "--blk: lost-writes= goes with backend=nbd");
    if (!strcmp(b->backend, "nbd")) {
        if (b->image)
            return fail(err, errlen, "--blk: backend=nbd takes uri=, not image=");
    } else if (!strcmp(b->backend, "null")) {
        if (!b->size) /* size= takes no 0 */
            return fail(err, errlen, "--blk: backend=null needs size=");
        if (b->image)
            return fail(err, errlen, "--blk: backend=null takes no image=");
    } else if (!b->image) {
        return fail(err, errlen, "--blk: image=PATH is required (or backend=null,size=...)");
    }
    if (b->size % b->block_size)
        return fail(err, errlen, "--blk: size is not a multiple of block-size %u", b->block_size);
    return 0;
}

/* ---- net ---- */

int vhd_parse_mac(const char *s, uint8_t mac[6])
{
    for (int i = 0; i < 6; i++) {
        if (!isxdigit((unsigned char)s[0]) || !isxdigit((unsigned char)s[1]))
            return -1;
        char hex[3] = {s[0], s[1], '\0'};
        mac[i] = (uint8_t)strtoul(hex, NULL, 16);
        s += 2;
        if (i < 5 && *s++ != ':')
            return -1;
    }
    if (*s != '\0' || (mac[0] & 1) || !(mac[0] | mac[1] | mac[2] | mac[3] | mac[4] | mac[5]))
        return -1;
    return 0;
}

int vhd_options_parse_net(struct vhd_options *o, const char *spec, struct vhd_opt_net *n, char *err,
                          size_t errlen)
{
    const struct dev_spec sp = DEV_SPEC("--net", DEV_NET, n);

    memset(n, 0, sizeof(*n));
    n->backend = "loopback";
    n->queues = 1;
    n->mtu = 1500;
    n->allow_split = n->allow_packed = true;
    n->spec = own(o, spec);
    if (parse_device(o, spec, &sp, err, errlen))
        return -1;
    if (!strcmp(n->backend, "switch") != (n->switch_name != NULL))
        return fail(err, errlen, "--net: switch=NAME goes with backend=switch, and only with it");
    if (!strcmp(n->backend, "tap") != (n->tap_name != NULL))
        return fail(err, errlen, "--net: tap=IFNAME goes with backend=tap, and only with it");
    return 0;
}

/* ---- end net ---- */

static int parse_global(struct vhd_options *o, const char *k, const char *v, char *err,
                        size_t errlen, int depth);

/* ---- the vhost-user spec's backend program conventions (struct vhd_opt_conv) ---- */

/* Whether option k takes no value. */
static bool is_flag(const char *k)
{
    return !strcmp(k, "help") || !strcmp(k, "version") || !strcmp(k, "read-only") ||
           !strcmp(k, "print-capabilities");
}

/* One of --socket-path, --fd, --type, --blk-file, --read-only, --keys, --print-capabilities. */
static int parse_conv(struct vhd_options *o, const char *k, const char *v, char *err, size_t errlen)
{
    struct vhd_opt_conv *c = &o->conv;
    uint64_t n;

    if (!strcmp(k, "read-only")) { /* --read-only, or --read-only=on|off */
        c->read_only = true;
        if (v && parse_bool(v, &c->read_only))
            return fail(err, errlen, "--read-only=%s: expected on or off", v);
        return 0;
    }
    if (!strcmp(k, "print-capabilities")) {
        if (v) /* main.c's pre-scan refuses it too: it must never start a daemon */
            return fail(err, errlen, "--print-capabilities takes no value");
        c->print_capabilities = true;
        return 0;
    }
    if (!strcmp(k, "fd")) {
        if (parse_uint(v, INT32_MAX, &n) || n < 3)
            return fail(err, errlen, "--fd %s: expected a file descriptor number >= 3", v);
        c->fd = (int)n;
        return 0;
    }
    if (!strcmp(k, "type") && strcmp(v, "blk") && strcmp(v, "net"))
        return fail(err, errlen, "--type %s: expected blk or net", v);
    if (!*v)
        return fail(err, errlen, "--%s needs a value", k);
    const char *s = own(o, v);
    if (!s)
        return fail(err, errlen, "out of memory");
    if (!strcmp(k, "socket-path"))
        c->socket_path = s;
    else if (!strcmp(k, "type"))
        c->type = s;
    else if (!strcmp(k, "blk-file"))
        c->blk_file = s;
    else
        c->keys = s;
    return 0;
}

/*
 * The name of the --fd socket: the path it is bound to, or "fd:N" (an
 * unnamed or abstract socket). Reads the address only; opens nothing.
 */
static void conv_fd_name(int fd, char *out, size_t outlen)
{
    struct sockaddr_un sa;
    socklen_t sl = sizeof(sa);
    memset(&sa, 0, sizeof(sa));
    if (getsockname(fd, (struct sockaddr *)&sa, &sl) == 0 && sa.sun_family == AF_UNIX &&
        sl > offsetof(struct sockaddr_un, sun_path) && sa.sun_path[0] == '/')
        snprintf(out, outlen, "%.*s", (int)sizeof(sa.sun_path), sa.sun_path);
    else
        snprintf(out, outlen, "fd:%d", fd);
}

/*
 * The --socket-path / --fd device, appended to blk[] or net[] through the
 * --blk / --net parser (one parser, one set of messages). argv0 picks the
 * kind without --type. 0, or -1 with a message in err.
 */
static int conv_device(struct vhd_options *o, const char *argv0, char *err, size_t errlen)
{
    struct vhd_opt_conv *c = &o->conv;
    bool dev = c->socket_path || c->fd;

    if (!dev) {
        if (c->type || c->blk_file || c->read_only || c->keys)
            return fail(err, errlen,
                        "--type, --blk-file, --read-only and --keys go with --socket-path or --fd");
        return 0;
    }
    if (c->socket_path && c->fd)
        return fail(err, errlen, "--socket-path and --fd are incompatible: give one");
    const char *base = argv0 ? strrchr(argv0, '/') : NULL;
    base = base ? base + 1 : argv0;
    bool net = c->type ? !strcmp(c->type, "net") : base && !strcmp(base, "vhostd-net");
    if (net && (c->blk_file || c->read_only))
        return fail(err, errlen, "--blk-file and --read-only are for --type blk");
    char name[sizeof(((struct sockaddr_un *)0)->sun_path) + 1];
    /* Checked now: before vhostd opens anything that could take the number. */
    if (c->fd && fcntl(c->fd, F_GETFD) < 0)
        return fail(err, errlen, "--fd %d: not an open file descriptor", c->fd);
    if (c->fd)
        conv_fd_name(c->fd, name, sizeof(name));
    const char *sock = c->fd ? name : c->socket_path;
    if (c->keys && (!strncmp(c->keys, "socket=", 7) || strstr(c->keys, ",socket=")))
        return fail(err, errlen, "--keys: socket= is --socket-path (or --fd)");
    if (o->nblk + o->nnet >= VHD_OPT_MAX_DEVICES)
        return fail(err, errlen, "too many devices (at most %d)", VHD_OPT_MAX_DEVICES);
    /*
     * The key parser has no escaping: a path pasted into the text would be cut
     * at its first ',' and the rest read as keys. The paths go in as
     * placeholders ("/": no file name, so name= is left unset) and are set
     * after parsing; the text (logs, reload, save-config) shows them as given.
     */
    const char *paths[2] = {sock, c->blk_file};
    for (int i = 0; i < 2 && paths[i]; i++)
        for (const char *p = paths[i]; *p; p++) {
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                return fail(err, errlen, "%s: control characters are not allowed in a path",
                            paths[i] == sock ? (c->fd ? "--fd" : "--socket-path") : "--blk-file");
            /* config.save writes the device as one KEY=VALUE,... line of a config file. */
            if ((*p == ',' || *p == '#') && o->rpc)
                return fail(err, errlen,
                            "%s %s: with --rpc a path may not contain ',' or '#' (config.save "
                            "could not write it as a device line)",
                            paths[i] == sock ? (c->fd ? "--fd" : "--socket-path") : "--blk-file",
                            paths[i]);
        }
    char *parse = NULL, *spec = NULL;
    if (asprintf(&parse, "socket=/%s%s%s%s", c->blk_file ? ",image=/" : "",
                 c->read_only ? ",ro=on" : "", c->keys ? "," : "", c->keys ? c->keys : "") < 0)
        return fail(err, errlen, "out of memory");
    if (asprintf(&spec, "socket=%s%s%s%s%s%s", sock, c->blk_file ? ",image=" : "",
                 c->blk_file ? c->blk_file : "", c->read_only ? ",ro=on" : "", c->keys ? "," : "",
                 c->keys ? c->keys : "") < 0) {
        free(parse);
        return fail(err, errlen, "out of memory");
    }
    const char *osock = own(o, sock), *ospec = own(o, spec);
    const char *slash = osock ? strrchr(osock, '/') : NULL;
    int rc = osock && ospec ? 0 : fail(err, errlen, "out of memory");
    if (rc == 0 && net) {
        struct vhd_opt_net *n = &o->net[o->nnet];
        rc = vhd_options_parse_net(o, parse, n, err, errlen);
        if (rc == 0) {
            n->socket = osock;
            n->spec = ospec;
            n->name = *n->name ? n->name : slash ? slash + 1 : osock;
            n->fd = c->fd;
            o->nnet++;
        }
    } else if (rc == 0) {
        struct vhd_opt_blk *b = &o->blk[o->nblk];
        rc = vhd_options_parse_blk(o, parse, b, err, errlen);
        if (rc == 0) {
            b->socket = osock;
            b->spec = ospec;
            if (c->blk_file && !strcmp(b->image, "/")) /* else --keys image= came after it */
                b->image = c->blk_file;
            b->name = *b->name ? b->name : slash ? slash + 1 : osock;
            b->fd = c->fd;
            o->nblk++;
        }
    }
    free(parse);
    free(spec);
    return rc;
}

/* ---- end conventions ---- */

static int parse_config(struct vhd_options *o, const char *path, char *err, size_t errlen,
                        int depth)
{
    if (depth > 4)
        return fail(err, errlen, "%s: config files nested too deeply", path);
    FILE *f = fopen(path, "r");
    if (!f)
        return fail(err, errlen, "%s: %s", path, strerror(errno));
    char line[4096];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof(line), f)) {
        lineno++;
        char *p = line, *e;
        while (isspace((unsigned char)*p))
            p++;
        if ((e = strchr(p, '#')))
            *e = '\0';
        e = p + strlen(p);
        while (e > p && isspace((unsigned char)e[-1]))
            *--e = '\0';
        if (!*p)
            continue;
        char *v = p;
        while (*v && !isspace((unsigned char)*v) && *v != '=')
            v++;
        if (*v) {
            *v++ = '\0';
            while (isspace((unsigned char)*v) || *v == '=')
                v++;
        }
        char sub[512];
        if (!strcmp(p, "fd")) { /* the number is the starting process's, not the file's */
            rc = fail(err, errlen, "%s:%d: fd is a command-line option (--fd N)", path, lineno);
            break;
        }
        rc = parse_global(o, p, *v ? v : NULL, sub, sizeof(sub), depth + 1);
        if (rc)
            fail(err, errlen, "%s:%d: %s", path, lineno, sub);
    }
    fclose(f);
    return rc;
}

/* One option by name without dashes; v NULL when absent. */
static int parse_global(struct vhd_options *o, const char *k, const char *v, char *err,
                        size_t errlen, int depth)
{
    uint64_t n;
    bool needs_value = !is_flag(k);
    if (needs_value && !v)
        return fail(err, errlen, "--%s needs a value", k);
    if (!strcmp(k, "help")) {
        o->help = true;
    } else if (!strcmp(k, "version")) {
        o->version = true;
    } else if (!strcmp(k, "blk")) {
        if (o->nblk + o->nnet >= VHD_OPT_MAX_DEVICES)
            return fail(err, errlen, "too many devices (at most %d)", VHD_OPT_MAX_DEVICES);
        if (vhd_options_parse_blk(o, v, &o->blk[o->nblk], err, errlen))
            return -1;
        o->nblk++;
    } else if (!strcmp(k, "net")) {
        if (o->nblk + o->nnet >= VHD_OPT_MAX_DEVICES)
            return fail(err, errlen, "too many devices (at most %d)", VHD_OPT_MAX_DEVICES);
        if (vhd_options_parse_net(o, v, &o->net[o->nnet], err, errlen))
            return -1;
        o->nnet++;
    } else if (!strcmp(k, "workers")) {
        if (parse_uint(v, VHD_OPT_MAX_WORKERS, &n) || n == 0)
            return fail(err, errlen, "--workers %s: expected 1..%d", v, VHD_OPT_MAX_WORKERS);
        o->workers = (unsigned)n;
        o->workers_set = true;
    } else if (!strcmp(k, "poll")) {
        if (!strcmp(v, "adaptive"))
            o->poll_mode = VHD_OPT_POLL_ADAPTIVE;
        else if (!strcmp(v, "always"))
            o->poll_mode = VHD_OPT_POLL_ALWAYS;
        else if (!strcmp(v, "never"))
            o->poll_mode = VHD_OPT_POLL_NEVER;
        else
            return fail(err, errlen, "--poll %s: expected adaptive, always or never", v);
    } else if (!strcmp(k, "poll-us")) {
        if (parse_uint(v, 1000000, &n))
            return fail(err, errlen, "--poll-us %s: expected 0..1000000", v);
        o->poll_us = (unsigned)n;
    } else if (!strcmp(k, "spin-us")) {
        if (!strcmp(v, "auto"))
            o->spin_us = VHD_CTX_SPIN_AUTO;
        else if (parse_uint(v, 1000000, &n))
            return fail(err, errlen, "--spin-us %s: expected 0..1000000 or auto", v);
        else
            o->spin_us = (unsigned)n;
    } else if (!strcmp(k, "cpus")) {
        int c = vhd_parse_cpu_list(v, o->cpus, VHD_OPT_MAX_WORKERS);
        if (c < 0)
            return fail(err, errlen, "--cpus %s: %s", v,
                        c == -EEXIST  ? "a CPU is listed twice"
                        : c == -E2BIG ? "more than 64 CPUs"
                        : c == -ERANGE
                            ? "CPU numbers go up to 1023"
                            : "expected a CPU list like 0,2-5 or 0-7:2 (taskset -c syntax)");
        o->ncpus = (unsigned)c;
    } else if (!strcmp(k, "log-level")) {
        static const char *const names[] = {"error", "warn", "info", "debug"};
        int lvl = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(v, names[i]))
                lvl = i;
        if (lvl < 0)
            return fail(err, errlen, "--log-level %s: expected error, warn, info or debug", v);
        o->log_level = lvl;
    } else if (!strcmp(k, "sandbox")) { /* sandboxing: --sandbox and --user */
        if (!strcmp(v, "on"))
            o->sandbox = VHD_OPT_SANDBOX_ON;
        else if (!strcmp(v, "off"))
            o->sandbox = VHD_OPT_SANDBOX_OFF;
        else if (!strcmp(v, "log"))
            o->sandbox = VHD_OPT_SANDBOX_LOG;
        else
            return fail(err, errlen, "--sandbox %s: expected on, off or log", v);
    } else if (!strcmp(k, "user")) {
        if (!*v)
            return fail(err, errlen, "--user needs a user name");
        if (!(o->user = own(o, v)))
            return fail(err, errlen, "out of memory");
    } else if (!strcmp(k, "max-guest-mem")) {
        if (vhd_parse_size(v, &n) || n == 0)
            return fail(err, errlen, "--max-guest-mem %s: expected a size like 64G or 2T", v);
        o->max_guest_mem = n;
    } else if (!strcmp(k, "rpc")) {
        if (!*v)
            return fail(err, errlen, "--rpc needs a socket path");
        if (!(o->rpc = own(o, v)))
            return fail(err, errlen, "out of memory");
    } else if (!strcmp(k, "rpc-nbd-tcp")) {
        if (parse_bool(v, &o->rpc_nbd_tcp))
            return fail(err, errlen, "--rpc-nbd-tcp %s: expected on or off", v);
    } else if (!strcmp(k, "config")) {
        return parse_config(o, v, err, errlen, depth);
    } else if (!strcmp(k, "socket-path") || !strcmp(k, "fd") || !strcmp(k, "type") ||
               !strcmp(k, "blk-file") || !strcmp(k, "read-only") || !strcmp(k, "keys") ||
               !strcmp(k, "print-capabilities")) {
        return parse_conv(o, k, v, err, errlen);
    } else {
        return fail(err, errlen, "unknown option --%s (see --help)", k);
    }
    return 0;
}

int vhd_options_parse(struct vhd_options *o, int argc, char **argv, char *err, size_t errlen)
{
    memset(o, 0, sizeof(*o));
    o->poll_mode = VHD_OPT_POLL_ADAPTIVE;
    o->poll_us = 50;
    struct vhd_ctx_config dc;
    vhd_ctx_config_init(&dc);
    o->spin_us = dc.spin_us; /* the library's default */
    o->log_level = 2;
    o->sandbox = VHD_OPT_SANDBOX_ON;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strncmp(a, "--", 2) != 0) {
            if (!strcmp(a, "-h"))
                a = "--help";
            else
                return fail(err, errlen, "unexpected argument '%s' (see --help)", a);
        }
        char key[64];
        const char *v = NULL, *eq = strchr(a + 2, '=');
        size_t klen = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        if (klen >= sizeof(key))
            return fail(err, errlen, "unknown option %s", a);
        memcpy(key, a + 2, klen);
        key[klen] = '\0';
        if (eq) {
            v = eq + 1;
        } else if (!is_flag(key)) {
            if (i + 1 >= argc)
                return fail(err, errlen, "--%s needs a value", key);
            v = argv[++i];
        }
        if (parse_global(o, key, v, err, errlen, 0))
            return -1;
    }
    if (o->help || o->version)
        return 0;
    if (conv_device(o, argc > 0 ? argv[0] : NULL, err, errlen))
        return -1;
    if (o->nblk + o->nnet == 0 && !o->rpc)
        return fail(err, errlen,
                    "no device given: use --blk socket=PATH,... or --net socket=PATH,... "
                    "(or --rpc PATH to add them at runtime; see --help)");
    for (int i = 0; i < o->nblk; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(o->blk[i].socket, o->blk[j].socket))
                return fail(err, errlen, "socket %s given twice", o->blk[i].socket);
    for (int i = 0; i < o->nblk; i++)
        for (int j = 0; j < o->blk[i].nworkers; j++)
            if (o->workers_set && (unsigned)o->blk[i].workers[j] >= o->workers)
                return fail(err, errlen, "device %s: worker %d does not exist (--workers %u)",
                            o->blk[i].name, o->blk[i].workers[j], o->workers);
    /* TLS loads certificates at every (re)connection, on a worker: files the sandbox forbids. */
    for (int i = 0; i < o->nblk; i++)
        if (o->blk[i].uri && !strncmp(o->blk[i].uri, "nbds", 4) &&
            o->sandbox != VHD_OPT_SANDBOX_OFF)
            return fail(err, errlen,
                        "device %s: an NBD URI with TLS (%s) needs --sandbox off: workers read "
                        "certificates when they connect",
                        o->blk[i].name, o->blk[i].uri);
    /* A worker reconnects to a vsock server with a socket the filter has no row for. */
    for (int i = 0; i < o->nblk; i++)
        if (o->blk[i].uri && !strncmp(o->blk[i].uri, "nbd+vsock:", 10) &&
            o->sandbox != VHD_OPT_SANDBOX_OFF)
            return fail(err, errlen, "device %s: an NBD server over vsock (%s) needs --sandbox off",
                        o->blk[i].name, o->blk[i].uri);
    /*
     * librados' threads open sockets to the monitors and OSDs whenever they
     * need them, long after setup: the syscall filter would kill vhostd.
     */
    for (int i = 0; i < o->nblk; i++)
        if (!strcmp(o->blk[i].backend, "rbd") && o->sandbox != VHD_OPT_SANDBOX_OFF)
            return fail(err, errlen,
                        "device %s: backend=rbd needs --sandbox off (librados connects to the "
                        "Ceph cluster from its own threads at any time)",
                        o->blk[i].name);
    /* ---- net: sockets unique across --blk and --net; worker lists within --workers ---- */
    for (int i = 0; i < o->nnet; i++) {
        for (int j = 0; j < i; j++)
            if (!strcmp(o->net[i].socket, o->net[j].socket))
                return fail(err, errlen, "socket %s given twice", o->net[i].socket);
        for (int j = 0; j < o->nblk; j++)
            if (!strcmp(o->net[i].socket, o->blk[j].socket))
                return fail(err, errlen, "socket %s given twice", o->net[i].socket);
        for (int j = 0; j < o->net[i].nworkers; j++)
            if (o->workers_set && (unsigned)o->net[i].workers[j] >= o->workers)
                return fail(err, errlen, "device %s: worker %d does not exist (--workers %u)",
                            o->net[i].name, o->net[i].workers[j], o->workers);
    }
    return 0;
}
