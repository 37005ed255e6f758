/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * libFuzzer target for vhostd's management API (daemon/rpc.c): the input is
 * a management client gone wrong, one request per line, run through the
 * request parser and the dispatcher against a real context. Devices are
 * created for real from what the command line's parser (daemon/options.c)
 * accepts, but never started, and only null disks and loopback NICs (no
 * file or socket is created). Checked: every request with an id gets exactly
 * one JSON-RPC 2.0 answer with a result or an error, never both.
 */
#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "rpc.h"
#include "vhostd/vhostd.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond)                                                                 \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond); \
            abort();                                                                     \
        }                                                                                \
    } while (0)

static struct vhd_ctx *ctx;
static struct vhd_options opts;

static int refuse(char *err, size_t errlen, const char *what)
{
    snprintf(err, errlen, "fuzz: %s is not created here", what);
    return -1;
}

static int new_blk(void *opaque, const struct vhd_opt_blk *b, struct vhd_device **out, char *err,
                   size_t errlen)
{
    (void)opaque;
    if (strcmp(b->backend, "null"))
        return refuse(err, errlen, "a disk image");
    struct vhd_blk_config c = {
        .dev = {.name = b->name,
                .endpoint = {.path = b->socket, .client = b->client},
                .workers = b->workers,
                .nworkers = (unsigned)b->nworkers},
        .backend = b->backend,
        .size = b->size,
        .read_only = b->ro,
        .serial = b->serial,
        .block_size = b->block_size,
        .num_queues = b->queues,
    };
    return vhd_blk_device_new(ctx, &c, out, err, errlen);
}

static int new_net(void *opaque, const struct vhd_opt_net *n, struct vhd_device **out, char *err,
                   size_t errlen)
{
    (void)opaque;
    if (strcmp(n->backend, "loopback"))
        return refuse(err, errlen, "a switch port or TAP");
    struct vhd_net_config c = {
        .dev = {.name = n->name,
                .endpoint = {.path = n->socket, .client = n->client},
                .workers = n->workers,
                .nworkers = (unsigned)n->nworkers},
        .backend = n->backend,
        .pairs = n->queues,
        .mac = n->mac_set ? n->mac : NULL,
        .mtu = n->mtu,
    };
    return vhd_net_device_new(ctx, &c, out, err, errlen);
}

static void check_answer(const char *resp)
{
    json_object *o = json_tokener_parse(resp), *v;
    FUZZ_CHECK(o && json_object_is_type(o, json_type_object));
    FUZZ_CHECK(json_object_object_get_ex(o, "jsonrpc", &v) &&
               !strcmp(json_object_get_string(v), "2.0"));
    FUZZ_CHECK(json_object_object_get_ex(o, "id", &v));
    bool res = json_object_object_get_ex(o, "result", &v);
    bool err = json_object_object_get_ex(o, "error", &v);
    FUZZ_CHECK(res != err);
    if (err) {
        json_object *m;
        FUZZ_CHECK(json_object_object_get_ex(v, "message", &m) &&
                   json_object_is_type(m, json_type_string));
        FUZZ_CHECK(json_object_object_get_ex(v, "code", &m) &&
                   json_object_is_type(m, json_type_int));
    }
    json_object_put(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!ctx) {
        struct vhd_ctx_config cc;
        vhd_ctx_config_init(&cc);
        cc.workers = 2;
        vhd_log_set_level(VHD_LOG_ERROR);
        FUZZ_CHECK(vhd_ctx_new(&cc, &ctx) == 0);
        opts.poll_us = 50;
    }
    const struct vhd_rpc_ops ops = {.new_blk = new_blk, .new_net = new_net};
    struct vhd_rpc *r;
    FUZZ_CHECK(vhd_rpc_new(ctx, &opts, &ops, &r) == 0);
    const char *p = (const char *)data, *end = p + size;
    for (int n = 0; p < end && n < 64; n++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        char *resp = vhd_rpc_handle(r, p, len);
        if (resp)
            check_answer(resp);
        free(resp);
        p += len + 1;
    }
    vhd_rpc_destroy_devices(r);
    vhd_rpc_free(r);
    return 0;
}
