/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The SIGHUP reload (reload.h): the configuration parsed again and its
 * devices compared by name with the running ones of the management table;
 * the difference applied through the management API's own methods.
 */
#include <json-c/json.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reload.h"

/*
 * Run one management method in-process (vhd_rpc_handle). 0, or -1 with the
 * error's message in err.
 */
static int call(struct vhd_rpc *r, const char *method, json_object *params, char *err,
                size_t errlen)
{
    json_object *req = json_object_new_object();
    json_object_object_add(req, "jsonrpc", json_object_new_string("2.0"));
    json_object_object_add(req, "id", json_object_new_int(1));
    json_object_object_add(req, "method", json_object_new_string(method));
    json_object_object_add(req, "params", params);
    const char *text = json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN);
    char *resp = vhd_rpc_handle(r, text, strlen(text));
    json_object_put(req);
    if (!resp) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    json_object *o = json_tokener_parse(resp), *e, *m;
    int rc = 0;
    if (!o) {
        snprintf(err, errlen, "unreadable answer");
        rc = -1;
    } else if (json_object_object_get_ex(o, "error", &e)) {
        snprintf(err, errlen, "%s",
                 json_object_object_get_ex(e, "message", &m) ? json_object_get_string(m) : "error");
        rc = -1;
    }
    json_object_put(o);
    free(resp);
    return rc;
}

/* The device named name in o: its kind and spec. false when absent. */
static bool find_in(const struct vhd_options *o, const char *name, bool *net, const char **spec)
{
    for (int i = 0; i < o->nblk; i++)
        if (!strcmp(o->blk[i].name, name)) {
            *net = false;
            *spec = o->blk[i].spec;
            return true;
        }
    for (int i = 0; i < o->nnet; i++)
        if (!strcmp(o->net[i].name, name)) {
            *net = true;
            *spec = o->net[i].spec;
            return true;
        }
    return false;
}

static bool same_str(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

/* Log the global options that differ: they take effect at the next start only. */
static void report_globals(const struct vhd_options *a, const struct vhd_options *b)
{
    const char *what[8];
    int n = 0;
    if (a->workers_set != b->workers_set || a->workers != b->workers)
        what[n++] = "workers";
    if (a->poll_mode != b->poll_mode || a->poll_us != b->poll_us || a->spin_us != b->spin_us)
        what[n++] = "poll";
    if (a->ncpus != b->ncpus || memcmp(a->cpus, b->cpus, a->ncpus * sizeof(a->cpus[0])))
        what[n++] = "cpus";
    if (a->log_level != b->log_level)
        what[n++] = "log-level";
    if (a->sandbox != b->sandbox || !same_str(a->user, b->user))
        what[n++] = "sandbox/user";
    if (a->max_guest_mem != b->max_guest_mem)
        what[n++] = "max-guest-mem";
    if (!same_str(a->rpc, b->rpc))
        what[n++] = "rpc";
    for (int i = 0; i < n; i++)
        vhd_log(VHD_LOG_WARN, "reload: %s changed: not applied (read at start only)", what[i]);
}

/*
 * argv without the conventions' device (--fd, --socket-path, --keys, --type,
 * --blk-file, --read-only, each with its value): the --fd device is not
 * parsed again (the command line does not change; its fd may be closed, its
 * number another file's, and reading its address is a syscall the sandbox
 * forbids after start). The new argc, or -1 when out of memory (*out:
 * malloc'd array, not strings).
 */
static int without_conv_device(int argc, char **argv, char ***out)
{
    static const char *const opts[] = {"fd", "socket-path", "keys", "type", "blk-file"};
    char **v = calloc((size_t)argc + 1, sizeof(*v));
    int n = 0;
    if (!v)
        return -1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        bool drop = i > 0 && (!strcmp(a, "--read-only") || !strncmp(a, "--read-only=", 12));
        for (size_t k = 0; i > 0 && !drop && k < sizeof(opts) / sizeof(opts[0]); k++) {
            size_t l = strlen(opts[k]);
            if (strncmp(a, "--", 2) || strncmp(a + 2, opts[k], l))
                continue;
            if (a[2 + l] == '=')
                drop = true;
            else if (!a[2 + l]) {
                drop = true;
                i++; /* its value */
            }
        }
        if (!drop)
            v[n++] = argv[i];
    }
    *out = v;
    return n;
}

int vhd_reload(struct vhd_rpc *r, const struct vhd_options *running, int argc, char **argv,
               struct vhd_reload_result *res, char *msg, size_t msglen)
{
    struct vhd_options *o = calloc(1, sizeof(*o)); /* ~1 MiB: not on the stack */
    char err[512] = "";
    int rc = 0;

    memset(res, 0, sizeof(*res));
    snprintf(msg, msglen, "out of memory: nothing changed");
    if (!o) {
        vhd_log(VHD_LOG_ERROR, "reload: out of memory: nothing changed");
        return -1;
    }
    char **v = NULL;
    const char *fd_name = NULL; /* the --fd device's name, while the table owns its socket */
    for (int i = 0; i < running->nblk && running->conv.fd > 0; i++)
        if (running->blk[i].fd > 0)
            fd_name = running->blk[i].name;
    for (int i = 0; i < running->nnet && running->conv.fd > 0; i++)
        if (running->net[i].fd > 0)
            fd_name = running->net[i].name;
    if (fd_name && !vhd_rpc_owns_fd(r, running->conv.fd))
        fd_name = NULL; /* removed since start: not the configuration's any more */
    if (running->conv.fd > 0 && (argc = without_conv_device(argc, argv, &v)) < 0) {
        vhd_log(VHD_LOG_ERROR, "reload: out of memory: nothing changed");
        rc = -1;
        goto out;
    }
    int prc = vhd_options_parse(o, argc, v ? v : argv, err, sizeof(err));
    free(v);
    if (prc < 0) {
        vhd_log(VHD_LOG_ERROR, "reload: %s: nothing changed", err);
        snprintf(msg, msglen, "%s: nothing changed", err);
        rc = -1;
        goto out;
    }
    report_globals(running, o);

    /* Running devices: unchanged, changed, or gone (removed, or kept while connected). */
    unsigned n = vhd_rpc_ndevices(r);
    char **gone = calloc(n ? n : 1, sizeof(*gone));
    unsigned ngone = 0;
    if (!gone) {
        vhd_log(VHD_LOG_ERROR, "reload: out of memory: nothing changed");
        rc = -1;
        goto out;
    }
    for (unsigned i = 0; i < n; i++) {
        const char *name, *spec, *want_spec;
        bool net, want_net;
        struct vhd_device *dev;
        vhd_rpc_device_at(r, i, &name, &net, &spec, &dev);
        if (fd_name && !strcmp(name, fd_name)) {
            res->unchanged++; /* the command line's --fd device: as it started */
            continue;
        }
        if (find_in(o, name, &want_net, &want_spec)) {
            if (want_net == net && !strcmp(spec, want_spec)) {
                res->unchanged++;
            } else {
                res->changed++;
                vhd_log(VHD_LOG_WARN,
                        "reload: device %s changed (now %s %s): not applied; it keeps running as "
                        "%s %s (remove it and reload, or use the management API)",
                        name, want_net ? "net" : "blk", want_spec, net ? "net" : "blk", spec);
            }
            continue;
        }
        if (vhd_rpc_device_origin(r, i) == VHD_RPC_ORIGIN_API) {
            res->api++; /* added through the management API: not the file's to remove */
            continue;
        }
        enum vhd_device_state st = vhd_device_state(dev);
        if (st == VHD_DEVICE_CONNECTED || st == VHD_DEVICE_BROKEN) {
            res->kept++;
            vhd_log(VHD_LOG_WARN,
                    "reload: device %s is gone from the configuration but a front-end is "
                    "connected: kept (remove it with force through the management API)",
                    name);
        } else if (!(gone[ngone++] = strdup(name))) {
            ngone--;
            res->failed++;
        }
    }
    /* By name: a removal reorders the table. */
    for (unsigned i = 0; i < ngone; i++) {
        json_object *p = json_object_new_object();
        json_object_object_add(p, "name", json_object_new_string(gone[i]));
        if (call(r, "device.remove", p, err, sizeof(err)) == 0) {
            res->removed++;
            vhd_log(VHD_LOG_INFO, "reload: removed device %s (gone from the configuration)",
                    gone[i]);
        } else {
            res->failed++;
            vhd_log(VHD_LOG_ERROR, "reload: cannot remove device %s: %s", gone[i], err);
        }
        free(gone[i]);
    }
    free(gone);

    /* New devices, in the configuration's order (blk, then net). */
    for (int k = 0; k < 2; k++) {
        int cnt = k ? o->nnet : o->nblk;
        for (int i = 0; i < cnt; i++) {
            const char *name = k ? o->net[i].name : o->blk[i].name;
            const char *spec = k ? o->net[i].spec : o->blk[i].spec;
            bool found = false;
            for (unsigned j = 0; j < vhd_rpc_ndevices(r) && !found; j++) {
                const char *nm, *sp;
                bool nt;
                struct vhd_device *dv;
                vhd_rpc_device_at(r, j, &nm, &nt, &sp, &dv);
                found = !strcmp(nm, name);
            }
            if (found)
                continue;
            if ((k ? o->net[i].fd : o->blk[i].fd) > 0) { /* --fd: only at start */
                res->failed++;
                vhd_log(VHD_LOG_ERROR,
                        "reload: device %s: an inherited socket is taken at "
                        "start only",
                        name);
                continue;
            }
            json_object *p = json_object_new_object();
            json_object_object_add(p, "kind", json_object_new_string(k ? "net" : "blk"));
            json_object_object_add(p, "spec", json_object_new_string(spec));
            if (call(r, "device.add", p, err, sizeof(err)) == 0) {
                vhd_rpc_set_origin(r, name, VHD_RPC_ORIGIN_RELOAD);
                res->added++;
                vhd_log(VHD_LOG_INFO, "reload: added %s device %s", k ? "net" : "blk", name);
            } else {
                res->failed++;
                vhd_log(VHD_LOG_ERROR, "reload: cannot add device %s: %s", name, err);
            }
        }
    }
    snprintf(msg, msglen,
             "%u added, %u removed, %u unchanged, %u changed (not applied), %u gone but "
             "connected (kept), %u failed, %u added through the API (kept)",
             res->added, res->removed, res->unchanged, res->changed, res->kept, res->failed,
             res->api);
    vhd_log(VHD_LOG_INFO, "reload: %s", msg);
out:
    vhd_options_free(o);
    free(o);
    return rc;
}
