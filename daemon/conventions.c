/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * --print-capabilities (the vhost-user spec, "Backend program conventions";
 * the JSON is qemu's docs/interop/vhost-user.json VHostUserBackendCapabilities).
 * Answered before the options are parsed: the spec says every other option
 * is ignored, so a management tool can ask with no device configured.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "conventions.h"

int vhd_conv_print_capabilities(int argc, char **argv, FILE *out)
{
    const char *type = NULL;
    bool asked = false;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--print-capabilities"))
            asked = true;
        else if (!strncmp(argv[i], "--print-capabilities=", 21)) {
            /* A flag: with a value it is a mistake, never a reason to start serving. */
            fprintf(stderr, "vhostd: --print-capabilities takes no value\n");
            return -1;
        } else if (!strcmp(argv[i], "--type") && i + 1 < argc)
            type = argv[++i];
        else if (!strncmp(argv[i], "--type=", 7))
            type = argv[i] + 7;
    }
    if (!asked)
        return 0;
    if (!type) {
        const char *base = argc > 0 && argv[0] ? strrchr(argv[0], '/') : NULL;
        base = base ? base + 1 : (argc > 0 ? argv[0] : NULL);
        type = base && !strcmp(base, "vhostd-net") ? "net" : "blk";
    }
    if (!strcmp(type, "blk")) {
        /*
         * The block features the schema defines, both ours: --read-only and
         * --blk-file (options.c).
         */
        fputs("{\n  \"type\": \"block\",\n  \"features\": [\n    \"read-only\",\n"
              "    \"blk-file\"\n  ]\n}\n",
              out);
    } else if (!strcmp(type, "net")) {
        fputs("{\n  \"type\": \"net\"\n}\n", out); /* the schema defines no net features */
    } else {
        fprintf(stderr, "vhostd: --type %s: expected blk or net\n", type);
        return -1;
    }
    fflush(out);
    return 1;
}
