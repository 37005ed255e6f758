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

#endif /* VHD_CONVENTIONS_H */
