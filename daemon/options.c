/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Parsing of vhostd's command line (--blk KEY=VALUE,... and global options)
 * and of config files (the same options, one per line, without the dashes).
 */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"

const char vhd_usage[] =
    "usage: vhostd [OPTIONS] --blk socket=PATH,KEY=VALUE,... [--blk ...]\n"
    "\n"
    "Serves virtio-blk devices to vhost-user front-ends (QEMU, cloud-hypervisor, ...).\n"
    "\n"
    "Global options:\n"
    "  --workers N          worker threads (default: min(total queues, CPUs))\n"
    "  --poll MODE          adaptive (default) | always | never\n"
    "  --poll-us N          adaptive polling window after the last work, in us (default 50)\n"
    "  --log-level LEVEL    error | warn | info (default) | debug\n"
    "  --config FILE        read options from FILE, one per line without the dashes\n"
    "                       (e.g. 'workers 2', 'blk socket=/run/vm1.sock,image=vm1.img'); '#' "
    "comments\n"
    "  --help, --version\n"
    "\n"
    "--blk keys:\n"
    "  socket=PATH          vhost-user socket to listen on (required)\n"
    "  image=PATH           backing file or block device (uring backend)\n"
    "  backend=uring|null   io_uring file backend (default) or null (no storage, reads zeroes)\n"
    "  size=SIZE            bytes (K/M/G/T suffixes): null device size; for uring, create a\n"
    "                       sparse image of this size when the file does not exist (an\n"
    "                       existing image must then have exactly this size)\n"
    "  queues=N             number of virtqueues (1..64, default 1)\n"
    "  ro=on|off            read-only device (default off)\n"
    "  serial=STR           serial number reported by GET_ID (at most 20 characters)\n"
    "  block-size=N         logical block size, 512..4096, power of two (default 512)\n"
    "  direct=on|off        O_DIRECT on the image (default off: buffered)\n"
    "  rings=split|packed|both   ring layouts offered (default both)\n"
    "  workers=LIST         workers for this device's queues, e.g. 0,1 or 0-3 (default: all,\n"
    "                       round robin)\n"
    "  name=STR             name used in logs (default: the socket's file name)\n";

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

int vhd_parse_size(const char *s, uint64_t *out)
{
    char *end;
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case '\0':
        break;
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    case 't':
    case 'T':
        shift = 40;
        end++;
        break;
    default:
        return -1;
    }
    if (shift && *end == 'i') /* accept "Ki", "GiB" too */
        end++;
    if (*end == 'B' && shift)
        end++;
    if (*end != '\0')
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
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

/* "0,2,5-7" -> workers[]. */
static int parse_worker_list(char *s, struct vhd_opt_blk *b)
{
    b->nworkers = 0;
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
            if (b->nworkers >= VHD_OPT_MAX_WORKERS)
                return -1;
            b->workers[b->nworkers++] = (int)w;
        }
    }
    return b->nworkers ? 0 : -1;
}

/*
 * Split "k=v,k=v" at commas. A worker list may use commas too ("workers=0,1"),
 * so a token without '=' after workers= continues the list.
 */
int vhd_options_parse_blk(struct vhd_options *o, const char *spec, struct vhd_opt_blk *b, char *err,
                          size_t errlen)
{
    char *s = own(o, spec);
    char wl[256] = "";
    bool in_workers = false, have_size = false;

    if (!s)
        return fail(err, errlen, "out of memory");
    memset(b, 0, sizeof(*b));
    b->backend = "uring";
    b->queues = 1;
    b->block_size = 512;
    b->allow_split = b->allow_packed = true;

    for (char *save = NULL, *tok = strtok_r(s, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(tok, '=');
        if (!eq) {
            if (in_workers && strlen(wl) + strlen(tok) + 2 < sizeof(wl)) {
                strcat(wl, ":");
                strcat(wl, tok);
                continue;
            }
            return fail(err, errlen, "--blk: '%s' is not KEY=VALUE", tok);
        }
        *eq = '\0';
        const char *k = tok, *v = eq + 1;
        in_workers = false;
        uint64_t n;
        if (!*v)
            return fail(err, errlen, "--blk: %s= needs a value", k);
        if (!strcmp(k, "socket")) {
            b->socket = v;
        } else if (!strcmp(k, "image")) {
            b->image = v;
        } else if (!strcmp(k, "name")) {
            b->name = v;
        } else if (!strcmp(k, "backend")) {
            if (strcmp(v, "uring") && strcmp(v, "null"))
                return fail(err, errlen, "--blk: backend=%s: expected uring or null", v);
            b->backend = v;
        } else if (!strcmp(k, "size")) {
            if (vhd_parse_size(v, &b->size) || b->size == 0)
                return fail(err, errlen, "--blk: size=%s: expected a size like 512M or 8G", v);
            have_size = true;
        } else if (!strcmp(k, "queues")) {
            if (parse_uint(v, VHD_OPT_MAX_QUEUES, &n) || n == 0)
                return fail(err, errlen, "--blk: queues=%s: expected 1..%d", v, VHD_OPT_MAX_QUEUES);
            b->queues = (uint32_t)n;
        } else if (!strcmp(k, "block-size") || !strcmp(k, "block_size")) {
            if (parse_uint(v, 4096, &n) || n < 512 || (n & (n - 1)))
                return fail(err, errlen,
                            "--blk: block-size=%s: expected a power of two in 512..4096", v);
            b->block_size = (uint32_t)n;
        } else if (!strcmp(k, "serial")) {
            if (strlen(v) > 20)
                return fail(err, errlen, "--blk: serial=%s: at most 20 characters", v);
            b->serial = v;
        } else if (!strcmp(k, "ro")) {
            if (parse_bool(v, &b->ro))
                return fail(err, errlen, "--blk: ro=%s: expected on or off", v);
        } else if (!strcmp(k, "direct")) {
            if (parse_bool(v, &b->direct))
                return fail(err, errlen, "--blk: direct=%s: expected on or off", v);
        } else if (!strcmp(k, "rings")) {
            b->allow_split = !strcmp(v, "split") || !strcmp(v, "both");
            b->allow_packed = !strcmp(v, "packed") || !strcmp(v, "both");
            if (!b->allow_split && !b->allow_packed)
                return fail(err, errlen, "--blk: rings=%s: expected split, packed or both", v);
        } else if (!strcmp(k, "workers")) {
            if (strlen(v) >= sizeof(wl))
                return fail(err, errlen, "--blk: workers=: list too long");
            strcpy(wl, v);
            in_workers = true;
        } else {
            return fail(err, errlen, "--blk: unknown key '%s'", k);
        }
    }
    if (wl[0] && parse_worker_list(wl, b))
        return fail(err, errlen, "--blk: workers=%s: expected a list like 0,1 or 0-3", wl);
    if (!b->socket)
        return fail(err, errlen, "--blk: socket=PATH is required");
    if (!strcmp(b->backend, "null")) {
        if (!have_size)
            return fail(err, errlen, "--blk: backend=null needs size=");
        if (b->image)
            return fail(err, errlen, "--blk: backend=null takes no image=");
    } else if (!b->image) {
        return fail(err, errlen, "--blk: image=PATH is required (or backend=null,size=...)");
    }
    if (b->size % b->block_size)
        return fail(err, errlen, "--blk: size is not a multiple of block-size %u", b->block_size);
    if (!b->name) {
        const char *slash = strrchr(b->socket, '/');
        b->name = slash ? slash + 1 : b->socket;
    }
    return 0;
}

static int parse_global(struct vhd_options *o, const char *k, const char *v, char *err,
                        size_t errlen, int depth);

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
    bool needs_value = strcmp(k, "help") && strcmp(k, "version");
    if (needs_value && !v)
        return fail(err, errlen, "--%s needs a value", k);
    if (!strcmp(k, "help")) {
        o->help = true;
    } else if (!strcmp(k, "version")) {
        o->version = true;
    } else if (!strcmp(k, "blk")) {
        if (o->nblk >= VHD_OPT_MAX_DEVICES)
            return fail(err, errlen, "too many devices (at most %d)", VHD_OPT_MAX_DEVICES);
        if (vhd_options_parse_blk(o, v, &o->blk[o->nblk], err, errlen))
            return -1;
        o->nblk++;
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
    } else if (!strcmp(k, "log-level")) {
        static const char *const names[] = {"error", "warn", "info", "debug"};
        int lvl = -1;
        for (int i = 0; i < 4; i++)
            if (!strcmp(v, names[i]))
                lvl = i;
        if (lvl < 0)
            return fail(err, errlen, "--log-level %s: expected error, warn, info or debug", v);
        o->log_level = lvl;
    } else if (!strcmp(k, "config")) {
        return parse_config(o, v, err, errlen, depth);
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
    o->log_level = 2;

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
        } else if (strcmp(key, "help") && strcmp(key, "version")) {
            if (i + 1 >= argc)
                return fail(err, errlen, "--%s needs a value", key);
            v = argv[++i];
        }
        if (parse_global(o, key, v, err, errlen, 0))
            return -1;
    }
    if (o->help || o->version)
        return 0;
    if (o->nblk == 0)
        return fail(err, errlen, "no device given: use --blk socket=PATH,... (see --help)");
    for (int i = 0; i < o->nblk; i++)
        for (int j = 0; j < i; j++)
            if (!strcmp(o->blk[i].socket, o->blk[j].socket))
                return fail(err, errlen, "socket %s given twice", o->blk[i].socket);
    for (int i = 0; i < o->nblk; i++)
        for (int j = 0; j < o->blk[i].nworkers; j++)
            if (o->workers_set && (unsigned)o->blk[i].workers[j] >= o->workers)
                return fail(err, errlen, "device %s: worker %d does not exist (--workers %u)",
                            o->blk[i].name, o->blk[i].workers[j], o->workers);
    return 0;
}
