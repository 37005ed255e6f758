/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostctl: the command line over vhostd's management API (--rpc, JSON-RPC
 * 2.0 on a Unix socket, daemon/rpc.c): one request per run, the answer as an
 * aligned table, JSON or Prometheus text. Exit 0 on success, 1 with the
 * server's message when it refused, 2 on a usage error, 3 when it is unreachable.
 */
#include <errno.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_RPC "/run/vhostd/rpc.sock"
#define REPLY_MAX   (64u << 20) /* the largest answer we read */
#define TIMEOUT_MS  60000       /* a forced removal waits for in-flight I/O */

enum { EXIT_REFUSED = 1, EXIT_USAGE = 2, EXIT_UNREACHABLE = 3 };

static const char usage[] =
    "usage: vhostctl [--rpc PATH] COMMAND [ARGS]\n"
    "  add blk KEY=VALUE,...     add a virtio-blk device (the keys of vhostd --blk)\n"
    "  add net KEY=VALUE,...     add a virtio-net device (the keys of vhostd --net)\n"
    "  remove NAME [--force]     remove a device; --force ends a front-end's session\n"
    "  list [--json]             the devices and their state\n"
    "  stats [NAME] [--json | --prometheus]\n"
    "                            per-device and per-queue counters\n"
    "  resize NAME SIZE [--force] change a blk device's capacity\n"
    "  resume NAME               resume a device paused by an error policy\n"
    "  save-config               print the running configuration as a --config file\n"
    "  reload                    read the daemon's configuration again and apply it (as\n"
    "                            SIGHUP does); exit 1 with the reason if it does not parse\n"
    "  version                   the daemon's version\n"
    "--rpc PATH: the daemon's socket (default $VHOSTD_RPC, else " DEFAULT_RPC ")\n";

static int die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int die(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("vhostctl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(code);
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Send one request, return its result (the caller puts it); exits on an error answer. */
static json_object *call(const char *path, const char *method, json_object *params)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        die(EXIT_USAGE, "%s: path too long", path);
    strcpy(sa.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        die(EXIT_UNREACHABLE, "%s: %s (is vhostd running with --rpc?)", path, strerror(errno));

    json_object *req = json_object_new_object();
    json_object_object_add(req, "jsonrpc", json_object_new_string("2.0"));
    json_object_object_add(req, "id", json_object_new_int(1));
    json_object_object_add(req, "method", json_object_new_string(method));
    json_object_object_add(req, "params", params ? params : json_object_new_object());
    size_t len;
    const char *s = json_object_to_json_string_length(
        req, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    char *line = malloc(len + 1);
    if (!line)
        die(EXIT_UNREACHABLE, "out of memory");
    memcpy(line, s, len);
    line[len++] = '\n';
    json_object_put(req);
    for (size_t off = 0; off < len;) {
        ssize_t n = send(fd, line + off, len - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            die(EXIT_UNREACHABLE, "%s: %s", path, strerror(errno));
        off += (size_t)n;
    }
    free(line);

    /* The answer: one line. */
    size_t cap = 65536, have = 0;
    char *buf = malloc(cap);
    long long deadline = now_ms() + TIMEOUT_MS;
    for (;;) {
        if (!buf)
            die(EXIT_UNREACHABLE, "out of memory");
        if (have && memchr(buf, '\n', have))
            break;
        long long left = deadline - now_ms();
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (left <= 0 || poll(&p, 1, (int)left) == 0)
            die(EXIT_UNREACHABLE, "%s: no answer in %d s", path, TIMEOUT_MS / 1000);
        if (have == cap) {
            if (cap >= REPLY_MAX)
                die(EXIT_UNREACHABLE, "%s: answer too large", path);
            char *n = realloc(buf, cap *= 2);
            if (!n)
                free(buf);
            buf = n;
            continue;
        }
        ssize_t n = recv(fd, buf + have, cap - have, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die(EXIT_UNREACHABLE, "%s: connection closed before an answer", path);
        have += (size_t)n;
    }
    close(fd);
    json_object *resp = json_tokener_parse(buf);
    free(buf);
    json_object *v;
    if (!resp || !json_object_is_type(resp, json_type_object))
        die(EXIT_UNREACHABLE, "%s: the answer is not JSON-RPC", path);
    if (json_object_object_get_ex(resp, "error", &v)) {
        json_object *m;
        const char *msg = json_object_object_get_ex(v, "message", &m) ? json_object_get_string(m)
                                                                      : "(no message)";
        fprintf(stderr, "vhostctl: %s\n", msg);
        json_object_put(resp);
        exit(EXIT_REFUSED);
    }
    if (!json_object_object_get_ex(resp, "result", &v))
        die(EXIT_UNREACHABLE, "%s: the answer has no result", path);
    json_object_get(v);
    json_object_put(resp);
    return v;
}

static const char *get_str(json_object *o, const char *k)
{
    json_object *v;
    return json_object_object_get_ex(o, k, &v) && v ? json_object_get_string(v) : "";
}

static uint64_t get_u64(json_object *o, const char *k)
{
    json_object *v;
    return json_object_object_get_ex(o, k, &v) && v ? json_object_get_uint64(v) : 0;
}

static void print_json(json_object *o)
{
    puts(json_object_to_json_string_ext(o, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED |
                                               JSON_C_TO_STRING_NOSLASHESCAPE));
}

/* ---- aligned tables: rows of cells, printed with each column as wide as its widest cell ---- */

#define MAX_COLS 12
struct table {
    unsigned ncols, nrows, cap;
    char **cells; /* nrows * ncols */
    size_t width[MAX_COLS];
};

static void table_row(struct table *t, ...)
{
    va_list ap;
    if (t->nrows == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 16;
        t->cells = realloc(t->cells, (size_t)t->cap * t->ncols * sizeof(char *));
        if (!t->cells)
            die(EXIT_UNREACHABLE, "out of memory");
    }
    va_start(ap, t);
    for (unsigned c = 0; c < t->ncols; c++) {
        char *s = strdup(va_arg(ap, const char *));
        if (!s)
            die(EXIT_UNREACHABLE, "out of memory");
        t->cells[t->nrows * t->ncols + c] = s;
        if (strlen(s) > t->width[c])
            t->width[c] = strlen(s);
    }
    va_end(ap);
    t->nrows++;
}

static void table_print(struct table *t)
{
    for (unsigned r = 0; r < t->nrows; r++) {
        for (unsigned c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * t->ncols + c];
            if (c + 1 == t->ncols)
                printf("%s\n", s);
            else
                printf("%-*s  ", (int)t->width[c], s);
            free(t->cells[r * t->ncols + c]);
        }
    }
    free(t->cells);
}

/* ---- commands ---- */

static int cmd_list(const char *path, bool json)
{
    json_object *res = call(path, "device.list", NULL), *devs;
    if (json) {
        print_json(res);
        json_object_put(res);
        return 0;
    }
    struct table t = {.ncols = 8};
    table_row(&t, "NAME", "KIND", "STATE", "CONNECTED", "QUEUES", "WORKERS", "FEATURES", "SOCKET");
    if (json_object_object_get_ex(res, "devices", &devs))
        for (size_t i = 0; i < json_object_array_length(devs); i++) {
            json_object *d = json_object_array_get_idx(devs, i), *w, *c;
            char workers[256] = "", queues[16];
            if (json_object_object_get_ex(d, "workers", &w))
                for (size_t j = 0; j < json_object_array_length(w); j++) {
                    size_t l = strlen(workers);
                    snprintf(workers + l, sizeof(workers) - l, "%s%d", j ? "," : "",
                             json_object_get_int(json_object_array_get_idx(w, j)));
                }
            snprintf(queues, sizeof(queues), "%" PRIu64, get_u64(d, "queues"));
            bool conn = json_object_object_get_ex(d, "connected", &c) && json_object_get_boolean(c);
            table_row(&t, get_str(d, "name"), get_str(d, "kind"), get_str(d, "state"),
                      conn ? "yes" : "no", queues, workers, get_str(d, "features"),
                      get_str(d, "socket"));
        }
    table_print(&t);
    json_object_put(res);
    return 0;
}

/* A Prometheus label value: backslash, double quote and newline escaped. */
static void prom_label(const char *s)
{
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            printf("\\%c", *s);
        else if (*s == '\n')
            fputs("\\n", stdout);
        else
            putchar(*s);
    }
}

/*
 * The Prometheus text exposition format: per metric a HELP and a TYPE line,
 * then `name{labels} value` samples. Devices and queues from res's
 * "devices", workers (polling and sleeping are per worker thread) from its
 * "workers".
 */
static void prometheus(json_object *res)
{
    json_object *devs = NULL, *workers = NULL;
    (void)json_object_object_get_ex(res, "devices", &devs);
    (void)json_object_object_get_ex(res, "workers", &workers);
    static const struct {
        const char *key, *metric, *help;
        bool per_queue;
        const char *type; /* counter or gauge */
        bool always;      /* per queue: readable whatever "available" says */
    } m[] = {
        {"connected", "vhostd_device_connected", "A front-end session is running (1) or not (0).",
         false, "gauge", false},
        {"size", "vhostd_device_size_bytes", "A blk device's size.", false, "gauge", false},
        {"paused_queues", "vhostd_device_paused_queues",
         "A blk device's queues paused by werror/rerror=stop.", false, "gauge", false},
        {"sessions", "vhostd_device_sessions_total", "Front-end sessions started.", false,
         "counter", false},
        {"connect_attempts", "vhostd_device_connect_attempts_total",
         "Client mode: connect attempts made.", false, "counter", false},
        {"broken", "vhostd_device_broken_total", "Times the device needed a reset.", false,
         "counter", false},
        {"requests", "vhostd_queue_requests_total", "Requests completed (net: frames).", true,
         "counter", false},
        {"bytes", "vhostd_queue_bytes_total", "Data moved, bytes.", true, "counter", false},
        {"drops", "vhostd_queue_drops_total", "Frames dropped (net).", true, "counter", false},
        {"errors", "vhostd_queue_errors_total", "Requests completed with an error.", true,
         "counter", false},
        {"kicks", "vhostd_queue_kicks_total", "Driver notifications (kicks) taken.", true,
         "counter", true},
        {"calls", "vhostd_queue_calls_total", "Interrupts (calls) sent to the driver.", true,
         "counter", true},
        {"in_flight", "vhostd_queue_in_flight", "Requests taken and not yet completed.", true,
         "gauge", true},
        {"worker", "vhostd_queue_worker", "The worker thread that runs the queue.", true, "gauge",
         true},
    };
    for (size_t k = 0; devs && k < sizeof(m) / sizeof(m[0]); k++) {
        printf("# HELP %s %s\n# TYPE %s %s\n", m[k].metric, m[k].help, m[k].metric, m[k].type);
        for (size_t i = 0; i < json_object_array_length(devs); i++) {
            json_object *d = json_object_array_get_idx(devs, i), *qs, *v;
            if (!m[k].per_queue) {
                if (!json_object_object_get_ex(d, m[k].key, &v))
                    continue; /* not this kind's (size: blk only) */
                printf("%s{device=\"", m[k].metric);
                prom_label(get_str(d, "name"));
                printf("\",kind=\"%s\"} %" PRIu64 "\n", get_str(d, "kind"), get_u64(d, m[k].key));
                continue;
            }
            if (!json_object_object_get_ex(d, "queues", &qs))
                continue;
            for (size_t q = 0; q < json_object_array_length(qs); q++) {
                json_object *jq = json_object_array_get_idx(qs, q), *av;
                if (!m[k].always && json_object_object_get_ex(jq, "available", &av) &&
                    !json_object_get_boolean(av))
                    continue; /* not readable now: absent rather than a false 0 */
                printf("%s{device=\"", m[k].metric);
                prom_label(get_str(d, "name"));
                printf("\",kind=\"%s\",queue=\"%" PRIu64 "\"} %" PRIu64 "\n", get_str(d, "kind"),
                       get_u64(jq, "queue"), get_u64(jq, m[k].key));
            }
        }
    }
    static const struct {
        const char *key, *metric, *help;
        double scale; /* JSON unit to the metric's */
    } wm[] = {
        {"sleeps", "vhostd_worker_sleeps_total",
         "Times the worker blocked waiting for an event (event mode, idle).", 1},
        {"poll_ns", "vhostd_worker_poll_seconds_total",
         "Time polling the rings with driver notifications off.", 1e-9},
        {"event_ns", "vhostd_worker_event_seconds_total",
         "Time in event mode (notifications on): handling events or asleep.", 1e-9},
        {"sleep_ns", "vhostd_worker_sleep_seconds_total",
         "Time blocked waiting for an event (part of the event time).", 1e-9},
    };
    for (size_t i = 0; workers && i < json_object_array_length(workers); i++) {
        json_object *w = json_object_array_get_idx(workers, i), *wc;
        if (!json_object_object_get_ex(w, "wake_cost_ns", &wc))
            continue;
        if (i == 0)
            printf("# HELP vhostd_worker_wake_cost_seconds CPU time a sleep and its wake-up cost "
                   "the worker (average of the last ones).\n"
                   "# TYPE vhostd_worker_wake_cost_seconds gauge\n");
        printf("vhostd_worker_wake_cost_seconds{worker=\"%" PRIu64 "\"} %.9f\n",
               get_u64(w, "worker"), (double)get_u64(w, "wake_cost_ns") * 1e-9);
    }
    for (size_t k = 0; workers && k < sizeof(wm) / sizeof(wm[0]); k++) {
        printf("# HELP %s %s\n# TYPE %s counter\n", wm[k].metric, wm[k].help, wm[k].metric);
        for (size_t i = 0; i < json_object_array_length(workers); i++) {
            json_object *w = json_object_array_get_idx(workers, i);
            uint64_t v = get_u64(w, wm[k].key);
            if (wm[k].scale == 1)
                printf("%s{worker=\"%" PRIu64 "\"} %" PRIu64 "\n", wm[k].metric,
                       get_u64(w, "worker"), v);
            else
                printf("%s{worker=\"%" PRIu64 "\"} %.9f\n", wm[k].metric, get_u64(w, "worker"),
                       (double)v * wm[k].scale);
        }
    }
}

static int cmd_stats(const char *path, const char *name, bool json, bool prom)
{
    json_object *params = json_object_new_object(), *devs;
    if (name)
        json_object_object_add(params, "name", json_object_new_string(name));
    json_object *res = call(path, "device.stats", params);
    if (json) {
        print_json(res);
    } else if (json_object_object_get_ex(res, "devices", &devs)) {
        if (prom) {
            prometheus(res);
        } else {
            struct table t = {.ncols = 11};
            table_row(&t, "DEVICE", "QUEUE", "WORKER", "REQUESTS", "BYTES", "DROPS", "ERRORS",
                      "KICKS", "CALLS", "INFLIGHT", "SESSIONS");
            for (size_t i = 0; i < json_object_array_length(devs); i++) {
                json_object *d = json_object_array_get_idx(devs, i), *qs, *av;
                char sess[24];
                snprintf(sess, sizeof(sess), "%" PRIu64, get_u64(d, "sessions"));
                if (!json_object_object_get_ex(d, "queues", &qs))
                    continue;
                for (size_t q = 0; q < json_object_array_length(qs); q++) {
                    json_object *jq = json_object_array_get_idx(qs, q);
                    bool ok = !json_object_object_get_ex(jq, "available", &av) ||
                              json_object_get_boolean(av);
                    char c[9][24];
                    snprintf(c[0], 24, "%" PRIu64, get_u64(jq, "queue"));
                    snprintf(c[1], 24, "%" PRIu64, get_u64(jq, "worker"));
                    snprintf(c[2], 24, ok ? "%" PRIu64 : "-", get_u64(jq, "requests"));
                    snprintf(c[3], 24, ok ? "%" PRIu64 : "-", get_u64(jq, "bytes"));
                    snprintf(c[4], 24, ok ? "%" PRIu64 : "-", get_u64(jq, "drops"));
                    snprintf(c[5], 24, ok ? "%" PRIu64 : "-", get_u64(jq, "errors"));
                    snprintf(c[6], 24, "%" PRIu64, get_u64(jq, "kicks"));
                    snprintf(c[7], 24, "%" PRIu64, get_u64(jq, "calls"));
                    snprintf(c[8], 24, "%" PRIu64, get_u64(jq, "in_flight"));
                    table_row(&t, get_str(d, "name"), c[0], c[1], c[2], c[3], c[4], c[5], c[6],
                              c[7], c[8], q == 0 ? sess : "");
                }
            }
            table_print(&t);
            /* polling and sleeping: per worker thread */
            json_object *ws;
            if (json_object_object_get_ex(res, "workers", &ws)) {
                struct table wt = {.ncols = 5};
                table_row(&wt, "WORKER", "SLEEPS", "POLL_S", "EVENT_S", "ASLEEP_S");
                for (size_t i = 0; i < json_object_array_length(ws); i++) {
                    json_object *w = json_object_array_get_idx(ws, i);
                    char c[5][32];
                    snprintf(c[0], 32, "%" PRIu64, get_u64(w, "worker"));
                    snprintf(c[1], 32, "%" PRIu64, get_u64(w, "sleeps"));
                    snprintf(c[2], 32, "%.3f", (double)get_u64(w, "poll_ns") / 1e9);
                    snprintf(c[3], 32, "%.3f", (double)get_u64(w, "event_ns") / 1e9);
                    snprintf(c[4], 32, "%.3f", (double)get_u64(w, "sleep_ns") / 1e9);
                    table_row(&wt, c[0], c[1], c[2], c[3], c[4]);
                }
                putchar('\n');
                table_print(&wt);
            }
        }
    }
    json_object_put(res);
    return 0;
}

int main(int argc, char **argv)
{
    const char *path = getenv("VHOSTD_RPC");
    const char *pos[4] = {0};
    int npos = 0;
    bool json = false, prom = false, force = false;

    if (!path || !*path)
        path = DEFAULT_RPC;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--rpc") && i + 1 < argc)
            path = argv[++i];
        else if (!strncmp(a, "--rpc=", 6))
            path = a + 6;
        else if (!strcmp(a, "--json"))
            json = true;
        else if (!strcmp(a, "--prometheus"))
            prom = true;
        else if (!strcmp(a, "--force"))
            force = true;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        } else if (a[0] == '-' && a[1] == '-')
            return die(EXIT_USAGE, "unknown option %s (see --help)", a);
        else if (npos < 4)
            pos[npos++] = a;
        else
            return die(EXIT_USAGE, "too many arguments (see --help)");
    }
    if (!npos) {
        fputs(usage, stderr);
        return EXIT_USAGE;
    }
    const char *cmd = pos[0];
    json_object *p = json_object_new_object(), *res;
#define NEED(n, what)                                                   \
    do {                                                                \
        if (npos != (n))                                                \
            return die(EXIT_USAGE, "usage: vhostctl %s %s", cmd, what); \
    } while (0)
    if (!strcmp(cmd, "add")) {
        NEED(3, "blk|net KEY=VALUE,...");
        if (strcmp(pos[1], "blk") && strcmp(pos[1], "net"))
            return die(EXIT_USAGE, "add: blk or net, not '%s'", pos[1]);
        json_object_object_add(p, "kind", json_object_new_string(pos[1]));
        json_object_object_add(p, "spec", json_object_new_string(pos[2]));
        res = call(path, "device.add", p);
        printf("%s\n", get_str(res, "name"));
    } else if (!strcmp(cmd, "remove")) {
        NEED(2, "NAME [--force]");
        json_object_object_add(p, "name", json_object_new_string(pos[1]));
        json_object_object_add(p, "force", json_object_new_boolean(force));
        res = call(path, "device.remove", p);
        const char *w = get_str(res, "warning");
        if (*w)
            fprintf(stderr, "vhostctl: %s: %s\n", pos[1], w);
    } else if (!strcmp(cmd, "list")) {
        NEED(1, "[--json]");
        json_object_put(p);
        return cmd_list(path, json);
    } else if (!strcmp(cmd, "stats")) {
        if (npos > 2)
            return die(EXIT_USAGE, "usage: vhostctl stats [NAME] [--json | --prometheus]");
        if (json && prom)
            return die(EXIT_USAGE, "stats: --json or --prometheus, not both");
        json_object_put(p);
        return cmd_stats(path, npos == 2 ? pos[1] : NULL, json, prom);
    } else if (!strcmp(cmd, "resize")) {
        NEED(3, "NAME SIZE [--force]");
        json_object_object_add(p, "name", json_object_new_string(pos[1]));
        json_object_object_add(p, "size", json_object_new_string(pos[2]));
        json_object_object_add(p, "force", json_object_new_boolean(force));
        res = call(path, "device.resize", p);
        printf("%s: %" PRIu64 " bytes\n", pos[1], get_u64(res, "size"));
    } else if (!strcmp(cmd, "resume")) {
        NEED(2, "NAME");
        json_object_object_add(p, "name", json_object_new_string(pos[1]));
        res = call(path, "device.resume", p);
        printf("%s: %" PRIu64 " paused queue(s) resumed\n", pos[1], get_u64(res, "resumed_queues"));
    } else if (!strcmp(cmd, "save-config")) {
        NEED(1, "");
        res = call(path, "config.save", p);
        fputs(get_str(res, "config"), stdout);
    } else if (!strcmp(cmd, "reload")) {
        NEED(1, "");
        res = call(path, "config.reload", p);
        printf("%s\n", get_str(res, "summary"));
    } else if (!strcmp(cmd, "version")) {
        NEED(1, "");
        res = call(path, "version", p);
        if (json)
            print_json(res);
        else
            printf("vhostd %s\n", get_str(res, "version"));
    } else {
        json_object_put(p);
        return die(EXIT_USAGE, "unknown command '%s' (see --help)", cmd);
    }
    json_object_put(res);
    return 0;
}
