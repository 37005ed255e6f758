/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The vhost-user spec's backend program conventions that are not options
 * parsing (options.c takes --socket-path, --fd, --type, --blk-file,
 * --read-only and --keys): --print-capabilities.
 */
#ifndef VHD_CONVENTIONS_H
#define VHD_CONVENTIONS_H

#include <stdio.h>

/*
 * vhd_conv_print_capabilities - when argv has --print-capabilities, print
 * the backend's capabilities for the device kind (--type, else the program
 * name: vhostd-net is net, anything else blk) to out as the spec's JSON
 * object ({"type": "block", "features": [...]} or {"type": "net"}) and
 * return 1; every other option is ignored, as the spec asks. 0 when not
 * asked; -1 with a message on stderr for a --type that is neither blk nor
 * net, or for --print-capabilities=VALUE (a flag: never a daemon started).
 */
int vhd_conv_print_capabilities(int argc, char **argv, FILE *out);

/*
 * Readiness for a service manager (systemd Type=notify), without libsystemd:
 * vhd_conv_notify_open connects a datagram socket to $NOTIFY_SOCKET (a path,
 * or "@name" in the abstract namespace) while the daemon may still connect
 * (before the sandbox); -1 when unset or unusable (logged). Then, once every
 * socket serves, vhd_conv_notify_ready writes READY=1 on it (a plain write:
 * allowed after the sandbox) and closes it; -1 does nothing.
 */
int vhd_conv_notify_open(void);
void vhd_conv_notify_ready(int fd);

#endif /* VHD_CONVENTIONS_H */
