/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd's management API: the JSON-RPC 2.0 server on --rpc PATH (json-c
 * parses, one request per line), its connections (non-blocking, bounded in
 * size, nesting and time) and the table of the daemon's devices it adds,
 * lists, counts and removes. Everything runs on the library's control thread;
 * a blk add whose backend opens slowly (ops.open_blk) is answered when the
 * open, done on a thread of the library's, reports back to that thread: its
 * connection reads nothing more meanwhile, every other one is served.
 */
#include "rpc.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

struct rdev {
    struct vhd_device *dev;
    bool net;
    char *name;     /* name= (default: the socket's file name) */
    char *spec;     /* KEY=VALUE,... as given, for save-config */
    char **strings; /* the parsed options' owned strings (the config pointed into them) */
    int nstrings;
    enum vhd_rpc_origin origin; /* what may remove it besides device.remove (reload.c) */
    int owned_fd;               /* closed when the entry goes (vhd_rpc_own_fd); -1: none */
};

struct client {
    struct vhd_rpc *r;
    struct client *next;
    int fd, tfd;
    struct vhd_ctx_watch *w, *tw;
    uint32_t events; /* what w watches */
    char *out;
    size_t outlen, outoff;
    bool closing; /* close once out is flushed */
    bool waiting; /* an answer is deferred (an add opening its backend): read nothing more */
    size_t inlen;
    char in[VHD_RPC_MAX_REQUEST]; /* last: a new connection zeroes what is above it */
};

/*
 * A blk add whose backend is opening (ops.open_blk). Freed by add_opened,
 * which the library calls once, even after vhd_rpc_free (r is NULL then).
 */
struct pending_add {
    struct vhd_rpc *r;        /* NULL: the server is gone */
    struct pending_add *next; /* r->pending */
    struct client *cl;        /* who waits for the answer; NULL: it left */
    bool has_id;              /* false: a notification, nobody is answered */
    bool in_process;          /* vhd_rpc_handle's (a reload's): answered at once, outcome logged */
    json_object *id;          /* the request's id (a reference; NULL for null) */
    char *name, *sock, *text; /* the device's name, socket path and KEY=VALUE text */
    char **strings;           /* the parsed options' owned strings (for the table entry) */
    int nstrings;
};

/*
 * A connection's shrink waiting for requests in flight
 * (vhd_blk_device_resize_async). Freed by resize_done, which the library
 * calls once, even after vhd_rpc_free (r is NULL then).
 */
struct pending_resize {
    struct vhd_rpc *r;           /* NULL: the server is gone */
    struct pending_resize *next; /* r->resizes */
    struct client *cl;           /* who waits for the answer; NULL: it left */
    bool has_id;
    json_object *id;
    char *name;
    uint64_t old, size;
};

struct vhd_rpc {
    struct vhd_ctx *ctx;
    const struct vhd_options *opts;
    struct vhd_rpc_ops ops;
    struct rdev *devs;
    unsigned ndevs;
    int lfd, dirfd;
    char *path;
    struct vhd_ctx_watch *lw;
    struct client *clients;
    unsigned nclients;
    struct pending_add *pending; /* blk adds opening their backend */
    unsigned npending;
    struct pending_resize *resizes; /* shrinks waiting for requests in flight */
    struct vhd_options scratch;     /* parses one add at a time */
};

/* ---- the device table ---- */

static struct rdev *find_dev(struct vhd_rpc *r, const char *name)
{
    for (unsigned i = 0; i < r->ndevs; i++)
        if (!strcmp(r->devs[i].name, name))
            return &r->devs[i];
    return NULL;
}

static void free_strings(char **s, int n)
{
    for (int i = 0; i < n; i++)
        free(s[i]);
    free(s);
}

static int table_add(struct vhd_rpc *r, struct vhd_device *dev, bool net, const char *name,
                     const char *spec, char **strings, int nstrings)
{
    if (r->ndevs >= VHD_RPC_MAX_DEVICES)
        return -ENOSPC;
    if (r->ndevs % 16 == 0) {
        struct rdev *n = realloc(r->devs, (r->ndevs + 16) * sizeof(*n));
        if (!n)
            return -ENOMEM;
        r->devs = n;
    }
    struct rdev *d = &r->devs[r->ndevs];
    *d = (struct rdev){.dev = dev,
                       .net = net,
                       .name = strdup(name),
                       .spec = strdup(spec),
                       .origin = VHD_RPC_ORIGIN_API,
                       .owned_fd = -1};
    if (!d->name || !d->spec) {
        free(d->name);
        free(d->spec);
        return -ENOMEM;
    }
    d->strings = strings;
    d->nstrings = nstrings;
    r->ndevs++;
    return 0;
}

static void table_del(struct vhd_rpc *r, struct rdev *d)
{
    free(d->name);
    free(d->spec);
    free_strings(d->strings, d->nstrings);
    if (d->owned_fd >= 0) /* the device accepted on its own duplicate, closed at its stop */
        close(d->owned_fd);
    *d = r->devs[--r->ndevs];
}

int vhd_rpc_new(struct vhd_ctx *ctx, const struct vhd_options *opts, const struct vhd_rpc_ops *ops,
                struct vhd_rpc **out)
{
    struct vhd_rpc *r = calloc(1, sizeof(*r));
    if (!r)
        return -ENOMEM;
    r->ctx = ctx;
    r->opts = opts;
    r->ops = *ops;
    r->lfd = r->dirfd = -1;
    *out = r;
    return 0;
}

int vhd_rpc_adopt(struct vhd_rpc *r, struct vhd_device *dev, bool net, const char *name,
                  const char *spec)
{
    int rc = table_add(r, dev, net, name, spec, NULL, 0);
    if (rc == 0)
        r->devs[r->ndevs - 1].origin = VHD_RPC_ORIGIN_STARTUP;
    return rc;
}

void vhd_rpc_set_origin(struct vhd_rpc *r, const char *name, enum vhd_rpc_origin origin)
{
    struct rdev *d = find_dev(r, name);
    if (d)
        d->origin = origin;
}

enum vhd_rpc_origin vhd_rpc_device_origin(const struct vhd_rpc *r, unsigned i)
{
    return r->devs[i].origin;
}

bool vhd_rpc_owns_fd(const struct vhd_rpc *r, int fd)
{
    for (unsigned i = 0; i < r->ndevs; i++)
        if (r->devs[i].owned_fd == fd)
            return true;
    return false;
}

void vhd_rpc_own_fd(struct vhd_rpc *r, const char *name, int fd)
{
    struct rdev *d = find_dev(r, name);
    if (d)
        d->owned_fd = fd;
}

unsigned vhd_rpc_ndevices(const struct vhd_rpc *r)
{
    return r->ndevs;
}

void vhd_rpc_resume_all(struct vhd_rpc *r)
{
    for (unsigned i = 0; i < r->ndevs; i++)
        if (!r->devs[i].net)
            (void)vhd_blk_device_resume(r->devs[i].dev);
}

void vhd_rpc_log_counters(struct vhd_rpc *r, const char *why)
{
    for (unsigned i = 0; i < r->ndevs; i++)
        vhd_device_log_counters(r->devs[i].dev, why);
}

/* ---- methods: each returns a result object, or NULL with *code and msg set ---- */

struct call {
    struct vhd_rpc *r;
    struct client *cl;   /* the connection asking (NULL: vhd_rpc_handle) */
    json_object *id;     /* the request's id */
    bool has_id;         /* false: a notification */
    bool deferred;       /* the method answers later (add_opened) */
    json_object *params; /* an object, or NULL */
    int code;
    char msg[512];
};

static json_object *failf(struct call *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static json_object *failf(struct call *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof(c->msg), fmt, ap);
    va_end(ap);
    c->code = code;
    return NULL;
}

/*
 * A parameter of the given type: 1 and *out when present, 0 when absent, -1
 * (with the error set) when present with another type.
 */
static int param(struct call *c, const char *key, json_type type, json_object **out)
{
    static const char *const names[] = {
        [json_type_null] = "null",        [json_type_boolean] = "a boolean",
        [json_type_double] = "a number",  [json_type_int] = "an integer",
        [json_type_object] = "an object", [json_type_array] = "an array",
        [json_type_string] = "a string",
    };
    json_object *v;
    if (!c->params || !json_object_object_get_ex(c->params, key, &v) || !v)
        return 0;
    if (!json_object_is_type(v, type)) {
        failf(c, VHD_RPC_E_PARAMS, "params.%s must be %s", key, names[type]);
        return -1;
    }
    *out = v;
    return 1;
}

static const char *state_name(enum vhd_device_state s)
{
    switch (s) {
    case VHD_DEVICE_STOPPED:
        return "stopped";
    case VHD_DEVICE_WAITING:
        return "waiting";
    case VHD_DEVICE_CONNECTED:
        return "connected";
    case VHD_DEVICE_BROKEN:
        return "broken";
    case VHD_DEVICE_DISABLED:
        return "disabled";
    }
    return "unknown";
}

static json_object *m_version(struct call *c)
{
    (void)c;
    json_object *o = json_object_new_object();
    json_object_object_add(o, "version", json_object_new_string(vhd_version()));
    json_object_object_add(o, "api", json_object_new_int(1));
    return o;
}

static void pending_free(struct pending_add *p)
{
    if (!p)
        return;
    json_object_put(p->id);
    free(p->name);
    free(p->sock);
    free(p->text);
    free_strings(p->strings, p->nstrings);
    free(p);
}

static void add_opened(void *opaque, struct vhd_device *dev, int rc, const char *err);
static void resize_done(void *opaque, int rc, const char *err);

/*
 * add: {"kind": "blk"|"net", "spec": "socket=...,..."} or {"kind": ...,
 * "keys": {"socket": "...", ...}} (string, integer or boolean values) -
 * parsed by the command line's own parser, so the keys and the messages are
 * those of --blk and --net.
 */
static json_object *m_add(struct call *c)
{
    struct vhd_rpc *r = c->r;
    json_object *kind, *spec = NULL, *keys = NULL;
    char *text = NULL;
    int rc;

    if ((rc = param(c, "kind", json_type_string, &kind)) <= 0)
        return rc < 0 ? NULL : failf(c, VHD_RPC_E_PARAMS, "params.kind (blk or net) is required");
    const char *k = json_object_get_string(kind);
    bool net = !strcmp(k, "net");
    if (!net && strcmp(k, "blk"))
        return failf(c, VHD_RPC_E_PARAMS, "params.kind must be blk or net, not '%.32s'", k);
    if (param(c, "spec", json_type_string, &spec) < 0 ||
        param(c, "keys", json_type_object, &keys) < 0)
        return NULL;
    if (!spec == !keys)
        return failf(c, VHD_RPC_E_PARAMS, "give either params.spec or params.keys");
    if (spec) {
        text = strdup(json_object_get_string(spec));
    } else {
        /* keys: joined into the same KEY=VALUE,... text the parser takes. */
        size_t len = 0, cap = 256;
        text = malloc(cap);
        json_object_object_foreach(keys, key, val)
        {
            const char *v;
            if (json_object_is_type(val, json_type_string) ||
                json_object_is_type(val, json_type_int))
                v = json_object_get_string(val);
            else if (json_object_is_type(val, json_type_boolean))
                v = json_object_get_boolean(val) ? "on" : "off";
            else {
                free(text);
                return failf(c, VHD_RPC_E_PARAMS,
                             "params.keys.%.64s must be a string, an integer or a boolean", key);
            }
            size_t need = len + strlen(key) + strlen(v) + 3;
            if (!text || need > cap) {
                char *n = text ? realloc(text, cap = need * 2) : NULL;
                if (!n) {
                    free(text);
                    return failf(c, VHD_RPC_E_FAILED, "out of memory");
                }
                text = n;
            }
            len += (size_t)sprintf(text + len, "%s%s=%s", len ? "," : "", key, v);
        }
        if (text && !len)
            text[0] = '\0';
    }
    if (!text)
        return failf(c, VHD_RPC_E_FAILED, "out of memory");

    /* Parse into the scratch options; their owned strings move to the table entry. */
    struct vhd_options *o = &r->scratch;
    o->strings = NULL;
    o->nstrings = 0;
    char err[384] = "";
    struct vhd_device *dev = NULL;
    const char *name, *sock;
    if (net) {
        rc = vhd_options_parse_net(o, text, &o->net[0], err, sizeof(err));
        name = o->net[0].name;
        sock = o->net[0].socket;
    } else {
        rc = vhd_options_parse_blk(o, text, &o->blk[0], err, sizeof(err));
        name = o->blk[0].name;
        sock = o->blk[0].socket;
    }
    if (rc < 0) {
        failf(c, VHD_RPC_E_PARAMS, "%s", err);
        goto out;
    }
    const int *workers = net ? o->net[0].workers : o->blk[0].workers;
    int nw = net ? o->net[0].nworkers : o->blk[0].nworkers;
    for (int i = 0; i < nw; i++)
        if ((unsigned)workers[i] >= vhd_ctx_workers(r->ctx)) {
            failf(c, VHD_RPC_E_PARAMS, "device %s: worker %d does not exist (%u workers)", name,
                  workers[i], vhd_ctx_workers(r->ctx));
            goto out;
        }
    if (find_dev(r, name)) {
        failf(c, VHD_RPC_E_FAILED, "a device named %s exists", name);
        goto out;
    }
    for (unsigned i = 0; i < r->ndevs; i++)
        if (!strcmp(vhd_device_socket_path(r->devs[i].dev), sock)) {
            failf(c, VHD_RPC_E_FAILED, "socket %s given twice (device %s)", sock, r->devs[i].name);
            goto out;
        }
    for (struct pending_add *p = r->pending; p; p = p->next)
        if (!strcmp(p->name, name) || !strcmp(p->sock, sock)) {
            failf(c, VHD_RPC_E_FAILED, "device %s (socket %s) is being added", p->name, p->sock);
            goto out;
        }
    if (r->ndevs + r->npending >= VHD_RPC_MAX_DEVICES) {
        failf(c, VHD_RPC_E_FAILED, "too many devices (at most %d)", VHD_RPC_MAX_DEVICES);
        goto out;
    }
    if (!net && r->ops.open_blk && strcmp(o->blk[0].backend, "null")) {
        /*
         * The backend opens off this thread. A connection's add: add_opened
         * answers. vhd_rpc_handle's (a SIGHUP reload's): answered now with
         * "opening": true, and add_opened logs the outcome. (A null disk
         * opens nothing: no thread for it.)
         */
        struct pending_add *p = calloc(1, sizeof(*p));
        if (p) {
            p->name = strdup(name);
            p->sock = strdup(sock);
        }
        if (!p || !p->name || !p->sock) {
            pending_free(p);
            failf(c, VHD_RPC_E_FAILED, "out of memory");
            goto out;
        }
        rc = r->ops.open_blk(r->ops.opaque, &o->blk[0], add_opened, p, err, sizeof(err));
        if (rc < 0) {
            pending_free(p);
            failf(c, VHD_RPC_E_FAILED, "%s: %s", name, err);
            goto out;
        }
        p->r = r;
        p->cl = c->cl;
        p->in_process = !c->cl;
        p->has_id = c->has_id && c->cl;
        p->id = c->cl ? json_object_get(c->id) : NULL;
        p->text = text;
        p->strings = o->strings; /* the entry will own them */
        p->nstrings = o->nstrings;
        o->strings = NULL;
        o->nstrings = 0;
        p->next = r->pending;
        r->pending = p;
        r->npending++;
        if (!c->cl) {
            vhd_log(VHD_LOG_INFO, "rpc: adding blk device %s on %s: its backend opens", name, sock);
            json_object *res = json_object_new_object();
            json_object_object_add(res, "name", json_object_new_string(name));
            json_object_object_add(res, "opening", json_object_new_boolean(true));
            return res;
        }
        c->deferred = true;
        return NULL;
    }
    rc = net ? r->ops.new_net(r->ops.opaque, &o->net[0], &dev, err, sizeof(err))
             : r->ops.new_blk(r->ops.opaque, &o->blk[0], &dev, err, sizeof(err));
    if (rc < 0) {
        failf(c, VHD_RPC_E_FAILED, "%s: %s", name, err);
        goto out;
    }
    rc = table_add(r, dev, net, name, text, o->strings, o->nstrings);
    if (rc < 0) {
        vhd_device_destroy(dev);
        failf(c, VHD_RPC_E_FAILED, "%s: %s", name, strerror(-rc));
        goto out;
    }
    o->strings = NULL; /* the entry owns them now */
    o->nstrings = 0;
    vhd_log(VHD_LOG_INFO, "rpc: added %s device %s on %s", net ? "net" : "blk", name, sock);
    json_object *res = json_object_new_object();
    json_object_object_add(res, "name", json_object_new_string(find_dev(r, name)->name));
    free(text);
    return res;
out:
    vhd_options_free(o);
    free(text);
    return NULL;
}

static json_object *m_remove(struct call *c)
{
    json_object *jn, *jf = NULL;
    int rc;
    if ((rc = param(c, "name", json_type_string, &jn)) <= 0)
        return rc < 0 ? NULL : failf(c, VHD_RPC_E_PARAMS, "params.name is required");
    if (param(c, "force", json_type_boolean, &jf) < 0)
        return NULL;
    bool force = jf && json_object_get_boolean(jf);
    struct rdev *d = find_dev(c->r, json_object_get_string(jn));
    if (!d)
        return failf(c, VHD_RPC_E_FAILED, "no device named %.64s", json_object_get_string(jn));
    enum vhd_device_state st = vhd_device_state(d->dev);
    bool connected = st == VHD_DEVICE_CONNECTED || st == VHD_DEVICE_BROKEN;
    if (connected && !force)
        return failf(c, VHD_RPC_E_FAILED,
                     "device %s has a front-end connected: remove it with force to end the "
                     "session",
                     d->name);
    /* Stop first: in-flight requests complete, the session is closed, the socket removed. */
    rc = vhd_device_stop(d->dev);
    json_object *res = json_object_new_object();
    json_object_object_add(res, "name", json_object_new_string(d->name));
    json_object_object_add(res, "was_connected", json_object_new_boolean(connected));
    vhd_log(VHD_LOG_INFO, "rpc: removing device %s%s", d->name,
            connected ? " (front-end disconnected)" : "");
    vhd_device_destroy(d->dev); /* a disabled one (rc -EBUSY) stays allocated, logged */
    if (rc < 0)
        json_object_object_add(res, "warning",
                               json_object_new_string("a queue did not stop in time: the "
                                                      "device's memory stays allocated"));
    table_del(c->r, d);
    return res;
}

/*
 * resize: {"name", "size": bytes or "20G", "force"}: the device's size and
 * config space change and its front-end is told (vhostd/blk.h).
 */
static json_object *m_resize(struct call *c)
{
    json_object *jn, *js, *jf = NULL;
    uint64_t size = 0;
    int rc;
    if ((rc = param(c, "name", json_type_string, &jn)) <= 0)
        return rc < 0 ? NULL : failf(c, VHD_RPC_E_PARAMS, "params.name is required");
    if (param(c, "force", json_type_boolean, &jf) < 0)
        return NULL;
    if (!c->params || !json_object_object_get_ex(c->params, "size", &js) || !js)
        return failf(c, VHD_RPC_E_PARAMS, "params.size is required");
    if (json_object_is_type(js, json_type_int) && json_object_get_int64(js) > 0)
        size = (uint64_t)json_object_get_int64(js);
    else if (!json_object_is_type(js, json_type_string) ||
             vhd_parse_size(json_object_get_string(js), &size) || !size)
        return failf(c, VHD_RPC_E_PARAMS,
                     "params.size must be a positive integer or a size like 20G");
    struct rdev *d = find_dev(c->r, json_object_get_string(jn));
    if (!d)
        return failf(c, VHD_RPC_E_FAILED, "no device named %.64s", json_object_get_string(jn));
    if (d->net)
        return failf(c, VHD_RPC_E_FAILED, "device %s is not a blk device", d->name);
    char err[256] = "";
    uint64_t old = vhd_blk_device_size(d->dev);
    bool force = jf && json_object_get_boolean(jf);
    if (c->cl) {
        /* A shrink's wait for requests in flight runs from the loop: resize_done answers. */
        struct pending_resize *p = calloc(1, sizeof(*p));
        if (!p || !(p->name = strdup(d->name))) {
            free(p);
            return failf(c, VHD_RPC_E_FAILED, "out of memory");
        }
        rc = vhd_blk_device_resize_async(d->dev, size, force, resize_done, p, err, sizeof(err));
        if (rc == -EINPROGRESS) {
            p->r = c->r;
            p->cl = c->cl;
            p->has_id = c->has_id;
            p->id = json_object_get(c->id);
            p->old = old;
            p->size = size;
            p->next = c->r->resizes;
            c->r->resizes = p;
            c->deferred = true;
            return NULL;
        }
        free(p->name);
        free(p);
    } else {
        rc = vhd_blk_device_resize(d->dev, size, force, err, sizeof(err));
    }
    if (rc < 0)
        return failf(c, VHD_RPC_E_FAILED, "%s: resize: %s", d->name, err);
    json_object *res = json_object_new_object();
    json_object_object_add(res, "name", json_object_new_string(d->name));
    json_object_object_add(res, "old_size", json_object_new_uint64(old));
    json_object_object_add(res, "size", json_object_new_uint64(vhd_blk_device_size(d->dev)));
    return res;
}

/* resume: retry what a blk device paused by werror/rerror=stop holds. */
static json_object *m_resume(struct call *c)
{
    json_object *jn;
    int rc;
    if ((rc = param(c, "name", json_type_string, &jn)) <= 0)
        return rc < 0 ? NULL : failf(c, VHD_RPC_E_PARAMS, "params.name is required");
    struct rdev *d = find_dev(c->r, json_object_get_string(jn));
    if (!d)
        return failf(c, VHD_RPC_E_FAILED, "no device named %.64s", json_object_get_string(jn));
    if (d->net)
        return failf(c, VHD_RPC_E_FAILED, "device %s is not a blk device", d->name);
    rc = vhd_blk_device_resume(d->dev);
    if (rc < 0)
        return failf(c, VHD_RPC_E_FAILED, "%s: resume: %s", d->name, strerror(-rc));
    json_object *res = json_object_new_object();
    json_object_object_add(res, "name", json_object_new_string(d->name));
    json_object_object_add(res, "resumed_queues", json_object_new_int(rc));
    return res;
}

static json_object *device_json(const struct rdev *d)
{
    json_object *o = json_object_new_object();
    enum vhd_device_state st = vhd_device_state(d->dev);
    uint32_t nq = vhd_device_num_queues(d->dev);
    char feat[24];
    json_object_object_add(o, "name", json_object_new_string(d->name));
    json_object_object_add(o, "kind", json_object_new_string(d->net ? "net" : "blk"));
    json_object_object_add(o, "socket", json_object_new_string(vhd_device_socket_path(d->dev)));
    json_object_object_add(o, "client", json_object_new_boolean(vhd_device_is_client(d->dev)));
    json_object_object_add(o, "state", json_object_new_string(state_name(st)));
    json_object_object_add(
        o, "connected",
        json_object_new_boolean(st == VHD_DEVICE_CONNECTED || st == VHD_DEVICE_BROKEN));
    json_object_object_add(o, "queues", json_object_new_int((int)nq));
    if (!d->net)
        json_object_object_add(o, "size", json_object_new_uint64(vhd_blk_device_size(d->dev)));
    if (!d->net) /* werror/rerror=stop: queues holding requests until a resume */
        json_object_object_add(o, "paused_queues",
                               json_object_new_int((int)vhd_blk_device_paused_queues(d->dev)));
    json_object *w = json_object_new_array();
    for (uint32_t q = 0; q < nq; q++)
        json_object_array_add(w, json_object_new_int(vhd_device_queue_worker(d->dev, q)));
    json_object_object_add(o, "workers", w);
    snprintf(feat, sizeof(feat), "0x%016" PRIx64, vhd_device_features(d->dev));
    json_object_object_add(o, "features", json_object_new_string(feat));
    return o;
}

static json_object *m_list(struct call *c)
{
    json_object *o = json_object_new_object(), *a = json_object_new_array();
    for (unsigned i = 0; i < c->r->ndevs; i++)
        json_object_array_add(a, device_json(&c->r->devs[i]));
    json_object_object_add(o, "devices", a);
    return o;
}

static json_object *stats_json(const struct rdev *d)
{
    json_object *o = json_object_new_object(), *qa = json_object_new_array();
    struct vhd_device_counters dc = {0};
    (void)vhd_device_counters(d->dev, &dc);
    json_object_object_add(o, "name", json_object_new_string(d->name));
    json_object_object_add(o, "kind", json_object_new_string(d->net ? "net" : "blk"));
    json_object_object_add(o, "sessions", json_object_new_uint64(dc.sessions));
    json_object_object_add(o, "connect_attempts", json_object_new_uint64(dc.connect_attempts));
    json_object_object_add(o, "broken", json_object_new_uint64(dc.broken));
    enum vhd_device_state st = vhd_device_state(d->dev);
    json_object_object_add(
        o, "connected",
        json_object_new_boolean(st == VHD_DEVICE_CONNECTED || st == VHD_DEVICE_BROKEN));
    if (!d->net) {
        json_object_object_add(o, "size", json_object_new_uint64(vhd_blk_device_size(d->dev)));
        json_object_object_add(o, "paused_queues",
                               json_object_new_int((int)vhd_blk_device_paused_queues(d->dev)));
    }
    for (uint32_t q = 0; q < vhd_device_num_queues(d->dev); q++) {
        struct vhd_queue_counters qc = {0};
        int rc = vhd_device_queue_counters(d->dev, q, &qc);
        json_object *jq = json_object_new_object();
        json_object_object_add(jq, "queue", json_object_new_int((int)q));
        json_object_object_add(jq, "worker",
                               json_object_new_int(vhd_device_queue_worker(d->dev, q)));
        /* blk: a running queue's counters are its worker's (vhostd/device.h) */
        json_object_object_add(jq, "available", json_object_new_boolean(rc == 0));
        json_object_object_add(jq, "requests", json_object_new_uint64(qc.requests));
        json_object_object_add(jq, "bytes", json_object_new_uint64(qc.bytes));
        json_object_object_add(jq, "drops", json_object_new_uint64(qc.drops));
        json_object_object_add(jq, "errors", json_object_new_uint64(qc.errors));
        struct vhd_queue_activity act = {0};
        (void)vhd_device_queue_activity(d->dev, q, &act);
        json_object_object_add(jq, "kicks", json_object_new_uint64(act.kicks));
        json_object_object_add(jq, "calls", json_object_new_uint64(act.calls));
        json_object_object_add(jq, "in_flight", json_object_new_uint64(act.in_flight));
        json_object_array_add(qa, jq);
    }
    json_object_object_add(o, "queues", qa);
    return o;
}

static json_object *m_stats(struct call *c)
{
    json_object *jn = NULL;
    if (param(c, "name", json_type_string, &jn) < 0)
        return NULL;
    json_object *a = json_object_new_array();
    for (unsigned i = 0; i < c->r->ndevs; i++)
        if (!jn || !strcmp(c->r->devs[i].name, json_object_get_string(jn)))
            json_object_array_add(a, stats_json(&c->r->devs[i]));
    if (jn && json_object_array_length(a) == 0) {
        json_object_put(a);
        return failf(c, VHD_RPC_E_FAILED, "no device named %.64s", json_object_get_string(jn));
    }
    json_object *o = json_object_new_object();
    json_object_object_add(o, "devices", a);
    /*
     * Polling and sleeping belong to a worker, shared by all its queues:
     * reported per worker; each queue above names its worker.
     */
    json_object *wa = json_object_new_array();
    for (unsigned w = 0; w < vhd_ctx_workers(c->r->ctx); w++) {
        struct vhd_worker_stats ws;
        if (vhd_ctx_worker_stats(c->r->ctx, w, &ws) < 0)
            continue;
        json_object *jw = json_object_new_object();
        json_object_object_add(jw, "worker", json_object_new_int((int)w));
        json_object_object_add(jw, "sleeps", json_object_new_uint64(ws.sleeps));
        json_object_object_add(jw, "sleep_ns", json_object_new_uint64(ws.sleep_ns));
        json_object_object_add(jw, "poll_ns", json_object_new_uint64(ws.poll_ns));
        json_object_object_add(jw, "event_ns", json_object_new_uint64(ws.event_ns));
        json_object_object_add(jw, "wake_cost_ns", json_object_new_uint64(ws.wake_cost_ns));
        json_object_array_add(wa, jw);
    }
    json_object_object_add(o, "workers", wa);
    return o;
}

/* save-config: the running configuration as a --config file. */
static json_object *m_save_config(struct call *c)
{
    static const char *const polls[] = {"adaptive", "always", "never"};
    static const char *const levels[] = {"error", "warn", "info", "debug"};
    static const char *const sandboxes[] = {"on", "off", "log"};
    const struct vhd_options *o = c->r->opts;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f)
        return failf(c, VHD_RPC_E_FAILED, "out of memory");
    fprintf(f, "# vhostd %s: running configuration\n", vhd_version());
    fprintf(f, "workers %u\n", vhd_ctx_workers(c->r->ctx));
    fprintf(f, "poll %s\npoll-us %u\n", polls[o->poll_mode], o->poll_us);
    if (o->spin_us == VHD_CTX_SPIN_AUTO)
        fprintf(f, "spin-us auto\n");
    else
        fprintf(f, "spin-us %u\n", o->spin_us);
    for (unsigned i = 0; i < o->ncpus; i++)
        fprintf(f, "%s%u%s", i ? "," : "cpus ", o->cpus[i], i + 1 == o->ncpus ? "\n" : "");
    if (o->log_level >= 0 && o->log_level < 4)
        fprintf(f, "log-level %s\n", levels[o->log_level]);
    fprintf(f, "sandbox %s\n", sandboxes[o->sandbox]);
    if (o->user)
        fprintf(f, "user %s\n", o->user);
    if (o->max_guest_mem)
        fprintf(f, "max-guest-mem %" PRIu64 "\n", o->max_guest_mem);
    if (c->r->path)
        fprintf(f, "rpc %s\n", c->r->path);
    if (o->rpc_nbd_tcp)
        fprintf(f, "rpc-nbd-tcp on\n");
    for (unsigned i = 0; i < c->r->ndevs; i++) {
        const struct rdev *d = &c->r->devs[i];
        fprintf(f, "%s ", d->net ? "net" : "blk");
        /* A resized disk: its size= says the size it has now (an image must match it). */
        const char *p = d->spec;
        while (*p) {
            size_t n = strcspn(p, ",");
            char given[32] = "";
            uint64_t was = 0;
            if (!d->net && !strncmp(p, "size=", 5) && n - 5 < sizeof(given))
                memcpy(given, p + 5, n - 5);
            if (given[0] && (vhd_parse_size(given, &was) || was != vhd_blk_device_size(d->dev)))
                fprintf(f, "size=%" PRIu64, vhd_blk_device_size(d->dev));
            else
                fwrite(p, 1, n, f);
            p += n;
            if (*p == ',')
                fputc(*p++, f);
        }
        fputc('\n', f);
    }
    if (fclose(f) != 0 || !buf) {
        free(buf);
        return failf(c, VHD_RPC_E_FAILED, "out of memory");
    }
    json_object *res = json_object_new_object();
    json_object_object_add(res, "config", json_object_new_string_len(buf, (int)len));
    free(buf);
    return res;
}

/* reload: the configuration read again and applied, as SIGHUP does; {"summary": "..."}. */
static json_object *m_reload(struct call *c)
{
    char msg[512] = "";
    if (!c->r->ops.reload)
        return failf(c, VHD_RPC_E_FAILED, "reloading is not available");
    if (c->r->ops.reload(c->r->ops.opaque, msg, sizeof(msg)) < 0)
        return failf(c, VHD_RPC_E_FAILED, "%s", msg);
    json_object *res = json_object_new_object();
    json_object_object_add(res, "summary", json_object_new_string(msg));
    return res;
}

static const struct {
    const char *name;
    json_object *(*fn)(struct call *c);
} methods[] = {
    {"version", m_version},    {"device.add", m_add},          {"device.remove", m_remove},
    {"device.list", m_list},   {"device.resume", m_resume},    {"device.resize", m_resize},
    {"device.stats", m_stats}, {"config.save", m_save_config}, {"config.reload", m_reload},
};

/* ---- requests ---- */

static char *respond(json_object *id, json_object *result, int code, const char *msg)
{
    json_object *o = json_object_new_object();
    json_object_object_add(o, "jsonrpc", json_object_new_string("2.0"));
    if (result) {
        json_object_object_add(o, "result", result);
    } else {
        json_object *e = json_object_new_object();
        json_object_object_add(e, "code", json_object_new_int(code));
        json_object_object_add(e, "message", json_object_new_string(msg));
        json_object_object_add(o, "error", e);
    }
    json_object_object_add(o, "id", id ? json_object_get(id) : NULL);
    char *s = strdup(
        json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE));
    json_object_put(o);
    return s;
}

/*
 * One request from cl (NULL: no connection): its answer (malloc'd), or NULL
 * for a notification, out of memory, or an answer deferred (*deferred set:
 * the connection reads nothing more until add_opened answers).
 */
static char *handle(struct vhd_rpc *r, struct client *cl, const char *req, size_t len,
                    bool *deferred)
{
    struct call c = {.r = r, .cl = cl};
    json_object *root = NULL, *id = NULL, *v;
    char *resp = NULL;

    if (len > VHD_RPC_MAX_REQUEST)
        return respond(NULL, NULL, VHD_RPC_E_REQUEST, "request too large");
    struct json_tokener *tok = json_tokener_new_ex(VHD_RPC_MAX_DEPTH);
    if (!tok)
        return NULL;
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    root = json_tokener_parse_ex(tok, req, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    if (je == json_tokener_success && tok->char_offset < (int)len) {
        /* Only white space may follow the request. */
        for (size_t i = (size_t)tok->char_offset; i < len; i++)
            if (!strchr(" \t\r\n", req[i])) {
                je = json_tokener_error_parse_unexpected;
                break;
            }
    }
    if (je != json_tokener_success || !root) {
        char msg[160];
        snprintf(msg, sizeof(msg), "parse error: %s",
                 je == json_tokener_continue ? "incomplete JSON" : json_tokener_error_desc(je));
        resp = respond(NULL, NULL, VHD_RPC_E_PARSE, msg);
        goto out;
    }
    if (!json_object_is_type(root, json_type_object)) {
        resp = respond(NULL, NULL, VHD_RPC_E_REQUEST, "a request is a JSON object");
        goto out;
    }
    bool has_id = json_object_object_get_ex(root, "id", &id);
    if (has_id && id && !json_object_is_type(id, json_type_int) &&
        !json_object_is_type(id, json_type_string)) {
        resp = respond(NULL, NULL, VHD_RPC_E_REQUEST, "id must be a string, an integer or null");
        goto out;
    }
    if (!json_object_object_get_ex(root, "jsonrpc", &v) ||
        !json_object_is_type(v, json_type_string) || strcmp(json_object_get_string(v), "2.0")) {
        resp = respond(id, NULL, VHD_RPC_E_REQUEST, "jsonrpc must be \"2.0\"");
        goto out;
    }
    if (!json_object_object_get_ex(root, "method", &v) ||
        !json_object_is_type(v, json_type_string)) {
        resp = respond(id, NULL, VHD_RPC_E_REQUEST, "method must be a string");
        goto out;
    }
    const char *method = json_object_get_string(v);
    c.id = id;
    c.has_id = has_id;
    if (json_object_object_get_ex(root, "params", &c.params) && c.params &&
        !json_object_is_type(c.params, json_type_object)) {
        resp = respond(id, NULL, VHD_RPC_E_PARAMS, "params must be an object");
        goto out;
    }
    json_object *result = NULL;
    bool found = false;
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        if (!strcmp(methods[i].name, method)) {
            found = true;
            result = methods[i].fn(&c);
            break;
        }
    if (c.deferred) {
        *deferred = true;
        goto out;
    }
    if (!found) {
        char msg[128];
        snprintf(msg, sizeof(msg), "unknown method '%.64s'", method);
        resp = respond(id, NULL, VHD_RPC_E_METHOD, msg);
    } else if (!result && !c.code) {
        resp = respond(id, NULL, VHD_RPC_E_FAILED, "out of memory");
    } else {
        resp = respond(id, result, c.code, c.msg);
    }
    if (!has_id) { /* a notification: run, no answer */
        free(resp);
        resp = NULL;
    }
out:
    json_object_put(root);
    json_tokener_free(tok);
    return resp;
}

char *vhd_rpc_handle(struct vhd_rpc *r, const char *req, size_t len)
{
    bool deferred = false;
    return handle(r, NULL, req, len, &deferred);
}

/* ---- connections ---- */

static void client_close(struct client *cl)
{
    struct vhd_rpc *r = cl->r;
    for (struct client **p = &r->clients; *p; p = &(*p)->next)
        if (*p == cl) {
            *p = cl->next;
            break;
        }
    r->nclients--;
    for (struct pending_add *p = r->pending; p; p = p->next)
        if (p->cl == cl)
            p->cl = NULL; /* the device is still added; nobody hears it */
    for (struct pending_resize *p = r->resizes; p; p = p->next)
        if (p->cl == cl)
            p->cl = NULL;
    vhd_ctx_unwatch(cl->w);
    vhd_ctx_unwatch(cl->tw);
    close(cl->fd);
    close(cl->tfd);
    free(cl->out);
    free(cl);
}

static void on_client(void *opaque, uint32_t events);

/*
 * Watch what the connection waits for: output to flush, else input, else
 * (an answer deferred) only its hang-up. 0 or -errno.
 */
static int client_watch(struct client *cl)
{
    uint32_t want = cl->outoff < cl->outlen ? EPOLLOUT : cl->waiting ? 0 : EPOLLIN;
    if (cl->w && want == cl->events)
        return 0;
    vhd_ctx_unwatch(cl->w);
    cl->w = NULL;
    cl->events = want;
    return vhd_ctx_watch_fd(cl->r->ctx, cl->fd, want, on_client, cl, &cl->w);
}

static void arm_idle(struct client *cl)
{
    struct itimerspec its = {.it_value = {.tv_sec = VHD_RPC_IDLE_MS / 1000,
                                          .tv_nsec = (VHD_RPC_IDLE_MS % 1000) * 1000000L}};
    (void)timerfd_settime(cl->tfd, 0, &its, NULL);
}

/* Queue a response line. 0 or -ENOMEM. */
static int client_queue(struct client *cl, const char *s)
{
    size_t n = strlen(s);
    if (cl->outoff == cl->outlen)
        cl->outoff = cl->outlen = 0;
    char *o = realloc(cl->out, cl->outlen + n + 1);
    if (!o)
        return -ENOMEM;
    memcpy(o + cl->outlen, s, n);
    o[cl->outlen + n] = '\n';
    cl->out = o;
    cl->outlen += n + 1;
    return 0;
}

/* Write what the socket takes. 0, or -1 when the connection is gone (it was closed). */
static int client_flush(struct client *cl)
{
    while (cl->outoff < cl->outlen) {
        ssize_t n = send(cl->fd, cl->out + cl->outoff, cl->outlen - cl->outoff,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            client_close(cl);
            return -1;
        }
        cl->outoff += (size_t)n;
    }
    if (cl->outoff == cl->outlen && cl->closing) {
        client_close(cl);
        return -1;
    }
    if (client_watch(cl) < 0) {
        client_close(cl);
        return -1;
    }
    return 0;
}

/* Answer with an error and close once it is written. */
static void client_fail(struct client *cl, int code, const char *msg)
{
    char *s = respond(NULL, NULL, code, msg);
    cl->closing = true;
    cl->inlen = 0;
    if (!s || client_queue(cl, s) < 0) {
        free(s);
        client_close(cl);
        return;
    }
    free(s);
    client_flush(cl);
}

/*
 * Answer the complete requests in the buffer in order, the next only once
 * the previous answer is written (a client that does not read is not fed;
 * the rest waits for EPOLLOUT). 0, or -1 when the connection was closed.
 */
static int client_serve(struct client *cl)
{
    char *nl;
    while (!cl->waiting && cl->outoff == cl->outlen && (nl = memchr(cl->in, '\n', cl->inlen))) {
        size_t line = (size_t)(nl - cl->in);
        bool deferred = false;
        char *resp = handle(cl->r, cl, cl->in, line, &deferred);
        memmove(cl->in, nl + 1, cl->inlen - line - 1);
        cl->inlen -= line + 1;
        if (deferred) {
            cl->waiting = true;
            if (client_watch(cl) < 0) {
                client_close(cl);
                return -1;
            }
            return 0;
        }
        if (resp && client_queue(cl, resp) < 0) {
            free(resp);
            client_close(cl);
            return -1;
        }
        free(resp);
        if (client_flush(cl) < 0)
            return -1;
    }
    return 0;
}

static void on_client(void *opaque, uint32_t events)
{
    struct client *cl = opaque;

    if (cl->waiting && !(events & EPOLLOUT)) {
        if (events & (EPOLLHUP | EPOLLERR))
            client_close(cl); /* gone while its add opens: the add goes on */
        return;
    }
    if (events & EPOLLOUT) {
        if (client_flush(cl) == 0)
            (void)client_serve(cl);
        return;
    }
    while (cl->outoff == cl->outlen) {
        if (cl->inlen == sizeof(cl->in)) {
            client_fail(cl, VHD_RPC_E_REQUEST, "request larger than 65536 bytes");
            return;
        }
        ssize_t n = recv(cl->fd, cl->in + cl->inlen, sizeof(cl->in) - cl->inlen, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) { /* gone, possibly mid-request: nothing to answer */
            client_close(cl);
            return;
        }
        arm_idle(cl);
        cl->inlen += (size_t)n;
        if (client_serve(cl) < 0)
            return;
    }
}

static void on_idle(void *opaque, uint32_t events)
{
    struct client *cl = opaque;
    uint64_t ticks;
    (void)events;
    (void)!read(cl->tfd, &ticks, sizeof(ticks));
    if (cl->waiting) { /* we are the slow party, not the client */
        arm_idle(cl);
        return;
    }
    /*
     * Quiet for a whole period with answers still unread (a client that
     * does not read), or after its error answer: closed outright, else it
     * would hold its connection slot for ever waiting for EPOLLOUT.
     */
    if (cl->closing || cl->outoff < cl->outlen) {
        client_close(cl);
        return;
    }
    if (cl->inlen) {
        arm_idle(cl); /* the error answer gets one more period to be read */
        client_fail(cl, VHD_RPC_E_REQUEST, "request not completed in time");
    } else {
        client_close(cl);
    }
}

static void on_accept(void *opaque, uint32_t events)
{
    struct vhd_rpc *r = opaque;
    (void)events;
    for (;;) {
        int fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* EAGAIN, or out of fds: the client waits in the backlog */
        if (r->nclients >= VHD_RPC_MAX_CLIENTS) {
            char *s = respond(NULL, NULL, VHD_RPC_E_FAILED, "too many connections");
            if (s) {
                (void)!send(fd, s, strlen(s), MSG_NOSIGNAL | MSG_DONTWAIT);
                (void)!send(fd, "\n", 1, MSG_NOSIGNAL | MSG_DONTWAIT);
            }
            free(s);
            close(fd);
            continue;
        }
        struct client *cl = malloc(sizeof(*cl));
        if (!cl) {
            close(fd);
            continue;
        }
        memset(cl, 0, offsetof(struct client, in));
        cl->r = r;
        cl->fd = fd;
        cl->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
        cl->next = r->clients;
        r->clients = cl;
        r->nclients++;
        if (cl->tfd < 0 || vhd_ctx_watch_fd(r->ctx, cl->tfd, EPOLLIN, on_idle, cl, &cl->tw) < 0 ||
            client_watch(cl) < 0) {
            vhd_log(VHD_LOG_WARN, "rpc: cannot serve a connection: %s", strerror(errno));
            client_close(cl);
            continue;
        }
        arm_idle(cl);
    }
}

int vhd_rpc_listen(struct vhd_rpc *r, const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat st;
    int rc;

    if (strlen(path) >= sizeof(sa.sun_path)) {
        snprintf(err, errlen, "--rpc %s: path too long", path);
        return -ENAMETOOLONG;
    }
    strcpy(sa.sun_path, path);
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode)) {
            snprintf(err, errlen, "--rpc %s: exists and is not a socket", path);
            return -EEXIST;
        }
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (probe >= 0 && connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
            close(probe);
            snprintf(err, errlen, "--rpc %s: another server answers there", path);
            return -EADDRINUSE;
        }
        if (probe >= 0)
            close(probe);
        unlink(path); /* stale */
    }
    r->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (r->lfd < 0)
        goto fail_errno;
    /*
     * Bound and listening under a temporary name, then renamed: the socket
     * never exists with another mode, nor before it accepts connections.
     */
    char tmp[sizeof(sa.sun_path) + 16];
    if (snprintf(tmp, sizeof(tmp), "%s.%d", path, (int)getpid()) >= (int)sizeof(sa.sun_path)) {
        errno = ENAMETOOLONG;
        goto fail_errno;
    }
    strcpy(sa.sun_path, tmp);
    unlink(tmp);
    mode_t old = umask(0177); /* 0600 from the start, whatever the umask */
    rc = bind(r->lfd, (struct sockaddr *)&sa, sizeof(sa));
    umask(old);
    if (rc < 0)
        goto fail_errno;
    if (chmod(tmp, 0600) < 0 || listen(r->lfd, 64) < 0 || rename(tmp, path) < 0) {
        rc = errno;
        unlink(tmp);
        errno = rc;
        goto fail_errno;
    }
    r->path = strdup(path);
    char *dir = strdup(path);
    if (!r->path || !dir) {
        free(dir);
        errno = ENOMEM;
        goto fail_errno;
    }
    char *slash = strrchr(dir, '/');
    if (slash == dir)
        slash[1] = '\0';
    else if (slash)
        *slash = '\0';
    r->dirfd = open(slash ? dir : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    free(dir);
    rc = vhd_ctx_watch_fd(r->ctx, r->lfd, EPOLLIN, on_accept, r, &r->lw);
    if (rc < 0) {
        errno = -rc;
        goto fail_errno;
    }
    vhd_log(VHD_LOG_INFO, "rpc: listening on %s", path);
    return 0;

fail_errno:
    rc = -errno;
    snprintf(err, errlen, "--rpc %s: %s", path, strerror(errno));
    if (r->lfd >= 0) {
        close(r->lfd);
        r->lfd = -1;
    }
    return rc;
}

const char *vhd_rpc_path(const struct vhd_rpc *r)
{
    return r->path;
}

int vhd_rpc_dir_fd(const struct vhd_rpc *r)
{
    return r->dirfd;
}

/* A deferred answer s (may be NULL) to cl (NULL: nobody); cl then reads requests again. */
static void deferred_answer(struct client *cl, char *s)
{
    if (!cl) {
        free(s);
        return;
    }
    cl->waiting = false;
    if (s && client_queue(cl, s) < 0) {
        free(s);
        client_close(cl);
        return;
    }
    free(s);
    if (client_flush(cl) == 0)
        (void)client_serve(cl);
}

/*
 * The library reports an add's open (vhd_blk_device_open, via ops.open_blk):
 * start the device, put it in the table, answer the client that asked (if
 * still there) and serve its next requests. Control thread.
 */
static void add_opened(void *opaque, struct vhd_device *dev, int rc, const char *err)
{
    struct pending_add *p = opaque;
    struct vhd_rpc *r = p->r;
    json_object *res = NULL;
    char msg[640] = "";

    if (!r) { /* the server went first (vhd_rpc_free) */
        if (dev)
            vhd_device_destroy(dev);
        pending_free(p);
        return;
    }
    for (struct pending_add **pp = &r->pending; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            r->npending--;
            break;
        }
    if (rc == 0) {
        char e[384] = "";
        if ((rc = vhd_device_start(dev, e, sizeof(e))) < 0) {
            vhd_device_destroy(dev);
            snprintf(msg, sizeof(msg), "%s: %s", p->name, e);
        } else if ((rc = table_add(r, dev, false, p->name, p->text, p->strings, p->nstrings)) < 0) {
            vhd_device_destroy(dev);
            snprintf(msg, sizeof(msg), "%s: %s", p->name, strerror(-rc));
        } else {
            p->strings = NULL; /* the entry owns them now */
            p->nstrings = 0;
            vhd_log(VHD_LOG_INFO, "rpc: added blk device %s on %s", p->name, p->sock);
            res = json_object_new_object();
            json_object_object_add(res, "name", json_object_new_string(p->name));
            if (!res)
                snprintf(msg, sizeof(msg), "out of memory");
        }
    } else {
        snprintf(msg, sizeof(msg), "%s: %s", p->name, err);
    }
    if (rc < 0 && p->in_process) /* nobody waits for an answer: the log is the outcome */
        vhd_log(VHD_LOG_ERROR, "rpc: cannot add device %s", msg);
    struct client *cl = p->cl;
    char *s = NULL;
    if (cl && p->has_id)
        s = respond(p->id, res, VHD_RPC_E_FAILED, msg); /* takes res */
    else
        json_object_put(res); /* nobody is answered */
    pending_free(p);
    deferred_answer(cl, s);
}

/*
 * The library reports a connection's shrink (vhd_blk_device_resize_async):
 * answer as device.resize does, then serve the client's next requests.
 * Control thread.
 */
static void resize_done(void *opaque, int rc, const char *err)
{
    struct pending_resize *p = opaque;
    struct vhd_rpc *r = p->r;
    json_object *res = NULL;
    char msg[400] = "";

    if (r)
        for (struct pending_resize **pp = &r->resizes; *pp; pp = &(*pp)->next)
            if (*pp == p) {
                *pp = p->next;
                break;
            }
    if (rc == 0) {
        res = json_object_new_object();
        json_object_object_add(res, "name", json_object_new_string(p->name));
        json_object_object_add(res, "old_size", json_object_new_uint64(p->old));
        json_object_object_add(res, "size", json_object_new_uint64(p->size));
    } else {
        snprintf(msg, sizeof(msg), "%s: resize: %s", p->name, err);
    }
    struct client *cl = r ? p->cl : NULL;
    char *s = NULL;
    if (cl && p->has_id)
        s = respond(p->id, res, VHD_RPC_E_FAILED, msg); /* takes res */
    else
        json_object_put(res);
    json_object_put(p->id);
    free(p->name);
    free(p);
    deferred_answer(cl, s);
}

void vhd_rpc_destroy_devices(struct vhd_rpc *r)
{
    while (r->ndevs) {
        struct rdev *d = &r->devs[r->ndevs - 1];
        vhd_device_destroy(d->dev);
        table_del(r, d);
    }
}

void vhd_rpc_free(struct vhd_rpc *r)
{
    if (!r)
        return;
    while (r->clients)
        client_close(r->clients);
    for (struct pending_add *p = r->pending; p; p = p->next)
        p->r = NULL; /* add_opened frees them when the library reports */
    for (struct pending_resize *p = r->resizes; p; p = p->next)
        p->r = NULL; /* resize_done frees them (the device's destruction at the latest) */
    vhd_ctx_unwatch(r->lw);
    if (r->lfd >= 0) {
        close(r->lfd);
        const char *base = strrchr(r->path, '/');
        if (r->dirfd < 0 || unlinkat(r->dirfd, base ? base + 1 : r->path, 0) < 0)
            vhd_log(VHD_LOG_WARN, "rpc: cannot remove %s: %s", r->path, strerror(errno));
    }
    if (r->dirfd >= 0)
        close(r->dirfd);
    while (r->ndevs)
        table_del(r, &r->devs[r->ndevs - 1]);
    free(r->devs);
    free(r->path);
    free(r);
}

/* ---- for reload.c ---- */

void vhd_rpc_device_at(const struct vhd_rpc *r, unsigned i, const char **name, bool *net,
                       const char **spec, struct vhd_device **dev)
{
    const struct rdev *d = &r->devs[i];
    *name = d->name;
    *net = d->net;
    *spec = d->spec;
    *dev = d->dev;
}
