/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * --print-capabilities (the vhost-user spec, "Backend program conventions";
 * the JSON is qemu's docs/interop/vhost-user.json VHostUserBackendCapabilities).
 * Answered before the options are parsed: the spec says every other option
 * is ignored, so a management tool can ask with no device configured.
 * Also the service manager's readiness notification ($NOTIFY_SOCKET).
 */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "vhostd/log.h"

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

int vhd_conv_notify_open(void)
{
    const char *p = getenv("NOTIFY_SOCKET");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    size_t len = p ? strlen(p) : 0;

    if (!p || !*p)
        return -1;
    if ((p[0] != '/' && p[0] != '@') || len >= sizeof(sa.sun_path)) {
        vhd_log(VHD_LOG_WARN, "NOTIFY_SOCKET=%.108s: not a socket path: no readiness sent", p);
        return -1;
    }
    memcpy(sa.sun_path, p, len);
    if (p[0] == '@') /* abstract */
        sa.sun_path[0] = '\0';
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa,
                          (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len)) < 0) {
        vhd_log(VHD_LOG_WARN, "NOTIFY_SOCKET=%s: %s: no readiness sent", p, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

void vhd_conv_notify_ready(int fd)
{
    static const char msg[] = "READY=1\n";
    if (fd < 0)
        return;
    if (write(fd, msg, sizeof(msg) - 1) != (ssize_t)(sizeof(msg) - 1))
        vhd_log(VHD_LOG_WARN, "NOTIFY_SOCKET: READY=1 not sent: %s", strerror(errno));
    close(fd);
}
