/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * SIGHUP: read the configuration again (the command line, with its
 * --config files) and bring the running devices to it.
 */
#ifndef VHD_RELOAD_H
#define VHD_RELOAD_H

#include "options.h"
#include "rpc.h"

/* What a reload did (also logged, one line per device and a summary). */
struct vhd_reload_result {
    unsigned added;     /* in the configuration, not running: added */
    unsigned removed;   /* running, gone from it, no front-end: removed */
    unsigned unchanged; /* the same name, kind and keys */
    unsigned changed;   /* the same name, other kind or keys: left as it runs, logged */
    unsigned kept;      /* gone from it but a front-end is connected: kept, logged */
    unsigned failed;    /* an add or a remove the device table refused: logged */
    unsigned api;       /* added through the management API, gone from it: not touched */
};

/*
 * vhd_reload - parse argc/argv again (the options vhostd started with; a
 * --config file is read anew) into a fresh set of options, and apply the
 * difference of its devices to the table r, by device name: add the new
 * ones, remove the gone ones that a configuration made (at start or by a
 * reload, not through the API) and have no front-end connected, and report
 * in the log, without touching them, the changed ones and the gone ones
 * that are connected. Adds and removes go through the management API's
 * own methods (device.add, device.remove): the same checks and messages.
 * Global options (workers, polling, sandbox, ...) are read at start only:
 * a change is logged. 0 and *res, or -1 when the configuration does not
 * parse (logged; nothing changed); msg gets the summary line, or the reason
 * of the -1. The --fd device is not parsed again: unchanged while it runs,
 * gone once removed (its socket was closed with it).
 * Control thread.
 */
int vhd_reload(struct vhd_rpc *r, const struct vhd_options *running, int argc, char **argv,
               struct vhd_reload_result *res, char *msg, size_t msglen);

#endif /* VHD_RELOAD_H */
