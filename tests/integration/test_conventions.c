/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd the way the vhost-user spec's backend program conventions and a
 * service manager run it: --print-capabilities (valid JSON of the spec's
 * schema, whatever else the command line says, the type from --type or the
 * program name), one device on --socket-path or on an inherited listening
 * --fd (served through our blk driver; an fd that is not a listening socket
 * refused; its socket closed when the device is removed), paths taken as
 * paths (a ',' starts no keys), and SIGHUP re-reading --config: new devices
 * added, gone ones removed unless connected or added through the API,
 * changed ones left running, a broken file changing nothing (checked through
 * the management API's device.list); SIGHUP during start-up, READY=1 on
 * $NOTIFY_SOCKET, and vhostctl reload.
 */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"
#include "vhostd/blk_driver.h"

#define MAX_DAEMONS 1
#include "daemon_fixture.h"
#include "blkdrv_fixture.h"

#define WAIT_MS 10000

static const char *bin(void)
{
    const char *b = vhostd_path();
    if (!b)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    return b;
}

/* Run argv to its end (bounded) with stdout into out; its exit status, -1 if killed. */
static int run(char *const argv[], char *out, size_t outlen, const char *log)
{
    int p[2];
    VHD_CHECK_EQ(pipe2(p, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 1);
        int fd = log ? open(log, O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600) : -1;
        if (fd >= 0)
            dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    size_t have = 0;
    uint64_t t0 = ms_now();
    for (;;) {
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t n = read(p[0], out + have, outlen - 1 - have);
        if (n <= 0)
            break;
        have += (size_t)n;
        VHD_CHECK(have < outlen - 1);
    }
    out[have] = '\0';
    close(p[0]);
    int status;
    while (waitpid(pid, &status, WNOHANG) != pid) {
        if (ms_now() - t0 > WAIT_MS) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
            return -1;
        }
        sleep_ms(5);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The capabilities object printed by argv: exit 0, one JSON object, type want. */
static json_object *capabilities(char *const argv[], const char *want)
{
    char out[4096];
    VHD_CHECK_EQ(run(argv, out, sizeof(out), NULL), 0);
    json_object *o = json_tokener_parse(out), *t;
    if (!o)
        fprintf(stderr, "  not JSON: '%s'\n", out);
    VHD_CHECK(o && json_object_is_type(o, json_type_object));
    VHD_CHECK(json_object_object_get_ex(o, "type", &t));
    VHD_CHECK(!strcmp(json_object_get_string(t), want));
    return o;
}

/*
 * --print-capabilities: the spec's JSON, the block features we implement,
 * other options ignored; --type net or the name vhostd-net gives net.
 */
VHD_TEST(print_capabilities)
{
    char *a1[] = {(char *)bin(), "--print-capabilities", "--no-such-option", "--blk", "junk", NULL};
    json_object *o = capabilities(a1, "block"), *f;
    VHD_CHECK(json_object_object_get_ex(o, "features", &f));
    VHD_CHECK(json_object_is_type(f, json_type_array));
    bool ro = false, file = false;
    for (size_t i = 0; i < json_object_array_length(f); i++) {
        const char *s = json_object_get_string(json_object_array_get_idx(f, i));
        ro |= !strcmp(s, "read-only");
        file |= !strcmp(s, "blk-file");
    }
    VHD_CHECK(ro && file);
    json_object_put(o);

    char *a2[] = {(char *)bin(), "--type", "net", "--print-capabilities", NULL};
    json_object_put(capabilities(a2, "net"));

    /* Under the name the installed descriptor gives (packaging/vhost-user). */
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-conv-XXXXXX", "unused");
    track(&dm);
    char link[256], real[4096];
    VHD_CHECK(realpath(bin(), real) != NULL);
    snprintf(link, sizeof(link), "%s/vhostd-net", dm.dir);
    VHD_CHECK_EQ(symlink(real, link), 0);
    char *a3[] = {link, "--print-capabilities", NULL};
    json_object_put(capabilities(a3, "net"));
    unlink(link);

    char *a4[] = {(char *)bin(), "--print-capabilities", "--type", "scsi", NULL};
    char out[256];
    VHD_CHECK(run(a4, out, sizeof(out), NULL) != 0);
    test_done();
}

/* Write (unless read_only) then read one block at off; the result must be pattern. */
static int drv_rw(struct vhd_blkdrv *d, uint64_t off, uint8_t pattern, bool write)
{
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, 4096);
    struct vhd_blkdrv_completion c;
    int wret = 0;
    VHD_CHECK(buf != NULL);
    if (write) {
        memset(buf, pattern, 4096);
        VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, off, buf, 4096, buf), 0);
        VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
        wret = c.ret;
    }
    memset(buf, 0xee, 4096);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, off, buf, 4096, buf), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    VHD_CHECK(buf[0] == pattern && buf[4095] == pattern);
    vhd_blkdrv_buf_free(q, buf, 4096);
    return wret;
}

/* --socket-path with --keys: one device, served, its socket removed at SIGTERM. */
VHD_TEST(socket_path)
{
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-conv-XXXXXX", "disk.sock");
    track(&dm);
    char *argv[] = {(char *)bin(),
                    "--socket-path",
                    dm.sock,
                    "--keys",
                    "backend=null,size=64M,queues=2",
                    "--workers",
                    "1",
                    NULL};
    daemon_spawn(&dm, argv);
    struct vhd_blkdrv *d = blkdrv_connect_at(dm.sock, WAIT_MS);
    VHD_CHECK_EQ(vhd_blkdrv_get_info(d)->capacity, 64ull << 20);
    VHD_CHECK_EQ(vhd_blkdrv_get_info(d)->device_queues, 2u);
    drv_rw(d, 0, 0, false); /* null: reads zeroes */
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    struct stat st;
    VHD_CHECK(stat(dm.sock, &st) < 0);
    test_done();
}

/* dm's image (<dir>/disk.img) of size bytes: zeroes but for 4 KiB of 0x5a at offset 8192. */
static void image_5a_at_8k(struct daemon *dm, uint64_t size)
{
    static uint8_t blk[4096];
    daemon_make_image(dm, size);
    int fd = open(dm->img, O_WRONLY | O_CLOEXEC);
    VHD_CHECK(fd >= 0);
    memset(blk, 0x5a, sizeof(blk));
    VHD_CHECK_EQ(pwrite(fd, blk, sizeof(blk), 8192), (ssize_t)sizeof(blk));
    close(fd);
}

/* --blk-file and --read-only (the spec's vhost-user-blk options): the image served read-only. */
VHD_TEST(blk_file_read_only)
{
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-conv-XXXXXX", "disk.sock");
    track(&dm);
    image_5a_at_8k(&dm, 1u << 20);
    char *argv[] = {(char *)bin(), "--socket-path", dm.sock, "--blk-file",
                    dm.img,        "--read-only",   NULL};
    daemon_spawn(&dm, argv);
    struct vhd_blkdrv *d = blkdrv_connect_at(dm.sock, WAIT_MS);
    VHD_CHECK(vhd_blkdrv_get_info(d)->read_only);
    VHD_CHECK(drv_rw(d, 8192, 0x5a, true) != 0); /* the write refused, the data unchanged */
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* Grep a file (the first 64 KiB) for needle. */
static bool file_has(const char *path, const char *needle)
{
    static char buf[65536];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    buf[n > 0 ? n : 0] = '\0';
    return strstr(buf, needle) != NULL;
}

/*
 * A ',' in --socket-path is part of the path (it used to start keys: this one
 * served a null disk of 1M instead of the image); --read-only=off is
 * writable; --print-capabilities=x is refused at once (it used to be missed by
 * the pre-scan: the daemon started serving).
 */
VHD_TEST(paths_and_flags)
{
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-conv-XXXXXX", "a,backend=null,size=1M");
    track(&dm);
    image_5a_at_8k(&dm, 2u << 20);
    char *argv[] = {(char *)bin(),     "--socket-path", dm.sock, "--blk-file", dm.img,
                    "--read-only=off", "--workers",     "1",     NULL};
    daemon_spawn(&dm, argv);
    struct vhd_blkdrv *d = blkdrv_connect_at(dm.sock, WAIT_MS);
    VHD_CHECK_EQ(vhd_blkdrv_get_info(d)->capacity, 2ull << 20);
    VHD_CHECK(!vhd_blkdrv_get_info(d)->read_only);
    drv_rw(d, 8192, 0x5a, false);              /* the image, not a null disk */
    VHD_CHECK_EQ(drv_rw(d, 0, 0x33, true), 0); /* --read-only=off: writable */
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    char sock2[256], out[256];
    snprintf(sock2, sizeof(sock2), "%s/caps.sock", dm.dir);
    char *a2[] = {(char *)bin(),
                  "--print-capabilities=x",
                  "--socket-path",
                  sock2,
                  "--keys",
                  "backend=null,size=1M",
                  NULL};
    VHD_CHECK_EQ(run(a2, out, sizeof(out), dm.log), 2);
    VHD_CHECK(file_has(dm.log, "--print-capabilities takes no value"));
    struct stat st;
    VHD_CHECK(stat(sock2, &st) < 0);
    test_done();
}

/* A listening socket at path, as fd number want (no close-on-exec): what a manager passes. */
static void listen_as_fd(const char *path, int want)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    VHD_CHECK(strlen(path) < sizeof(sa.sun_path));
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    VHD_CHECK_EQ(listen(fd, 4), 0);
    VHD_CHECK_EQ(dup2(fd, want), want);
    close(fd);
}

/*
 * --fd: the daemon serves the socket it inherited (our driver connects to
 * its path and does I/O, twice: a second session after the first), and
 * leaves the socket file alone at exit: it is its creator's.
 */
VHD_TEST(inherited_fd)
{
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-conv-XXXXXX", "fd.sock");
    track(&dm);
    listen_as_fd(dm.sock, 7);
    char *argv[] = {(char *)bin(), "--fd", "7", "--keys", "backend=null,size=16M", NULL};
    daemon_spawn(&dm, argv);
    close(7); /* the daemon has its own copy */
    for (int i = 0; i < 2; i++) {
        struct vhd_blkdrv *d = blkdrv_connect_at(dm.sock, WAIT_MS);
        VHD_CHECK_EQ(vhd_blkdrv_get_info(d)->capacity, 16ull << 20);
        drv_rw(d, 4096, 0, false);
        vhd_blkdrv_disconnect(d);
    }
    VHD_CHECK(daemon_log_has(&dm, "listening on inherited fd 7"));
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    struct stat st;
    VHD_CHECK(stat(dm.sock, &st) == 0 && S_ISSOCK(st.st_mode));
    test_done();
}

/* --fd that is not a listening Unix socket, or not open: a clear error, exit non-zero. */
VHD_TEST(inherited_fd_refused)
{
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-conv-XXXXXX", "unused");
    track(&dm);
    int sv[2];
    VHD_CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    VHD_CHECK_EQ(dup2(sv[0], 8), 8);
    char out[256];
    char *a1[] = {(char *)bin(), "--fd", "8", "--keys", "backend=null,size=1M", NULL};
    VHD_CHECK(run(a1, out, sizeof(out), dm.log) != 0);
    VHD_CHECK(file_has(dm.log, "not listening"));
    close(8);
    char *a2[] = {(char *)bin(), "--fd", "8", "--keys", "backend=null,size=1M", NULL};
    VHD_CHECK(run(a2, out, sizeof(out), dm.log) != 0);
    VHD_CHECK(file_has(dm.log, "not an open file descriptor"));
    char *a3[] = {(char *)bin(), "--fd", "8", "--socket-path", "/tmp/x.sock", NULL};
    VHD_CHECK_EQ(run(a3, out, sizeof(out), dm.log), 2);
    VHD_CHECK(file_has(dm.log, "incompatible"));
    close(sv[0]);
    close(sv[1]);
    test_done();
}

/* ---- reload ---- */

static int rpc_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    VHD_CHECK(strlen(path) < sizeof(sa.sun_path));
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(fd >= 0);
    VHD_CHECK_EQ(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* One request (params: JSON text or NULL) on a new connection: its response (the caller puts it).
 */
static json_object *rpc_call(const char *rpc, const char *method, const char *params)
{
    static char resp[1 << 16];
    char req[1024];
    snprintf(req, sizeof(req), "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"%s\"%s%s}\n", method,
             params ? ",\"params\":" : "", params ? params : "");
    int fd = rpc_connect(rpc);
    VHD_CHECK_EQ(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    size_t have = 0;
    uint64_t t0 = ms_now();
    while (!have || resp[have - 1] != '\n') {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fd, resp + have, sizeof(resp) - 1 - have, 0);
        VHD_CHECK(n > 0);
        have += (size_t)n;
    }
    resp[have] = '\0';
    close(fd);
    json_object *o = json_tokener_parse(resp);
    VHD_CHECK(o != NULL);
    return o;
}

/* A method that must succeed. */
static void rpc_ok(const char *rpc, const char *method, const char *params)
{
    json_object *o = rpc_call(rpc, method, params), *r;
    if (!json_object_object_get_ex(o, "result", &r))
        fprintf(stderr, "  %s: %s\n", method, json_object_to_json_string(o));
    VHD_CHECK(json_object_object_get_ex(o, "result", &r));
    json_object_put(o);
}

/* device.list's devices array (the caller puts it). */
static json_object *list(const char *rpc)
{
    json_object *o = rpc_call(rpc, "device.list", NULL), *r, *devs;
    VHD_CHECK(json_object_object_get_ex(o, "result", &r) &&
              json_object_object_get_ex(r, "devices", &devs));
    json_object_get(devs);
    json_object_put(o);
    return devs;
}

/* How many times needle is in dm's log (its first 64 KiB). */
static int log_count(const struct daemon *dm, const char *needle)
{
    static char buf[1 << 16];
    int fd = open(dm->log, O_RDONLY | O_CLOEXEC), n = 0;
    if (fd < 0)
        return 0;
    ssize_t len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    buf[len > 0 ? len : 0] = '\0';
    for (const char *p = buf; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Wait (bounded) until needle is in dm's log want times. */
static void wait_log_count(const struct daemon *dm, const char *needle, int want)
{
    uint64_t t0 = ms_now();
    while (log_count(dm, needle) < want) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(10);
    }
}

/* The device named name in devs, or NULL. */
static json_object *dev_named(json_object *devs, const char *name)
{
    for (size_t i = 0; i < json_object_array_length(devs); i++) {
        json_object *d = json_object_array_get_idx(devs, i), *n;
        if (json_object_object_get_ex(d, "name", &n) && !strcmp(json_object_get_string(n), name))
            return d;
    }
    return NULL;
}

static const char *field(json_object *d, const char *key)
{
    json_object *v;
    VHD_CHECK(json_object_object_get_ex(d, key, &v));
    return json_object_get_string(v);
}

static void write_file(const char *path, const char *text)
{
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s.new", path);
    FILE *f = fopen(tmp, "w");
    VHD_CHECK(f != NULL);
    fputs(text, f);
    VHD_CHECK_EQ(fclose(f), 0);
    VHD_CHECK_EQ(rename(tmp, path), 0);
}

/*
 * dm's directory (its socket: rpc.sock, for --rpc), tracked; conf (256
 * bytes) gets the path of vhostd.conf in it, text a configuration of one
 * device, a.sock (null, 1M). Nothing is written.
 */
static void conf_prepare(struct daemon *dm, char conf[256], char *text, size_t textlen)
{
    daemon_prepare_dir(dm, "vhd-test-conv-XXXXXX", "rpc.sock");
    track(dm);
    snprintf(conf, 256, "%s/vhostd.conf", dm->dir);
    snprintf(text, textlen, "blk socket=%s/a.sock,backend=null,size=1M\n", dm->dir);
}

/*
 * SIGHUP: the config file read again. Gone and unconnected (a): removed;
 * gone but connected (b): kept, still serving, logged; changed (c): left
 * as it runs, logged; new (d, blk; e, net): added and served; the reload
 * summary logged. Then a config that does not parse: nothing changes.
 */
VHD_TEST(reload)
{
    struct daemon dm;
    char conf[256], text[2048];
    conf_prepare(&dm, conf, text, sizeof(text));
    snprintf(text, sizeof(text),
             "# before\n"
             "blk socket=%s/a.sock,backend=null,size=1M\n"
             "blk socket=%s/b.sock,backend=null,size=1M\n"
             "blk socket=%s/c.sock,backend=null,size=1M\n",
             dm.dir, dm.dir, dm.dir);
    write_file(conf, text);
    char *argv[] = {(char *)bin(), "--rpc", dm.sock, "--config", conf, "--workers", "2", NULL};
    daemon_spawn(&dm, argv);
    json_object *devs = list(dm.sock);
    VHD_CHECK_EQ(json_object_array_length(devs), 3u);
    json_object_put(devs);
    char bsock[256], dsock[256];
    snprintf(bsock, sizeof(bsock), "%s/b.sock", dm.dir);
    snprintf(dsock, sizeof(dsock), "%s/d.sock", dm.dir);
    struct vhd_blkdrv *b = blkdrv_connect_at(bsock, WAIT_MS);
    uint64_t t0 = ms_now();
    for (;;) { /* b's session shows in the table */
        devs = list(dm.sock);
        bool up = !strcmp(field(dev_named(devs, "b.sock"), "connected"), "true");
        json_object_put(devs);
        if (up)
            break;
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(10);
    }

    /* An API device (vhostctl add): not the file's, it survives every reload. */
    char params[512];
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s/api.sock,backend=null,size=1M\"}", dm.dir);
    rpc_ok(dm.sock, "device.add", params);

    snprintf(text, sizeof(text),
             "# after: a and b gone, c changed, d and e new\n"
             "blk socket=%s/c.sock,backend=null,size=2M\n"
             "blk socket=%s/d.sock,backend=null,size=4M\n"
             "net socket=%s/e.sock,backend=loopback\n",
             dm.dir, dm.dir, dm.dir);
    write_file(conf, text);
    VHD_CHECK_EQ(kill(dm.pid, SIGHUP), 0);
    wait_log_count(&dm, "reload: ", 1); /* the summary line is the last */
    wait_log_count(&dm, "1 gone but connected (kept), 0 failed", 1);
    VHD_CHECK(daemon_log_has(&dm, "reload: 2 added, 1 removed, 0 unchanged, 1 changed"));
    VHD_CHECK(daemon_log_has(&dm, "0 failed, 1 added through the API (kept)"));
    VHD_CHECK(daemon_log_has(&dm, "reload: device b.sock is gone from the configuration but a "
                                  "front-end is connected: kept"));
    VHD_CHECK(daemon_log_has(&dm, "reload: device c.sock changed"));
    devs = list(dm.sock);
    VHD_CHECK_EQ(json_object_array_length(devs), 5u);
    VHD_CHECK(dev_named(devs, "api.sock") != NULL);
    VHD_CHECK(dev_named(devs, "a.sock") == NULL);
    VHD_CHECK(!strcmp(field(dev_named(devs, "b.sock"), "connected"), "true"));
    VHD_CHECK(!strcmp(field(dev_named(devs, "c.sock"), "size"), "1048576")); /* as it ran */
    VHD_CHECK(!strcmp(field(dev_named(devs, "d.sock"), "kind"), "blk"));
    VHD_CHECK(!strcmp(field(dev_named(devs, "e.sock"), "kind"), "net"));
    json_object_put(devs);
    char asock[256];
    struct stat st;
    snprintf(asock, sizeof(asock), "%s/a.sock", dm.dir);
    VHD_CHECK(stat(asock, &st) < 0); /* a's socket went with it */
    drv_rw(b, 0, 0, false);          /* b kept serving */
    struct vhd_blkdrv *d = blkdrv_connect_at(dsock, WAIT_MS);
    VHD_CHECK_EQ(vhd_blkdrv_get_info(d)->capacity, 4ull << 20);
    drv_rw(d, 0, 0, false);
    vhd_blkdrv_disconnect(d);

    /* A file that does not parse: logged, nothing changed. */
    write_file(conf, "blk socket=/nowhere,no-such-key=1\n");
    VHD_CHECK_EQ(kill(dm.pid, SIGHUP), 0);
    wait_log_count(&dm, "nothing changed", 1);
    devs = list(dm.sock);
    VHD_CHECK_EQ(json_object_array_length(devs), 5u);
    json_object_put(devs);
    drv_rw(b, 0, 0, false);
    vhd_blkdrv_disconnect(b);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * Reload with an --fd device: the same file twice reports nothing added or
 * removed, everything unchanged. Removing the --fd device through the API
 * closes the inherited socket (a connect is refused, it does not hang in the
 * backlog), and a reload after that still parses (the closed --fd is left out).
 */
VHD_TEST(reload_fd)
{
    struct daemon dm;
    char conf[256], text[512], fdsock[256];
    conf_prepare(&dm, conf, text, sizeof(text));
    write_file(conf, text);
    snprintf(fdsock, sizeof(fdsock), "%s/fd.sock", dm.dir);
    listen_as_fd(fdsock, 7);
    char *argv[] = {(char *)bin(), "--rpc",  dm.sock,
                    "--config",    conf,     "--fd",
                    "7",           "--keys", "backend=null,size=1M,name=fd",
                    "--workers",   "1",      NULL};
    daemon_spawn(&dm, argv);
    close(7);
    for (int i = 1; i <= 2; i++) {
        VHD_CHECK_EQ(kill(dm.pid, SIGHUP), 0);
        wait_log_count(&dm, "reload: 0 added, 0 removed, 2 unchanged, 0 changed", i);
    }
    VHD_CHECK_EQ(log_count(&dm, "reload: "), 2);

    rpc_ok(dm.sock, "device.remove", "{\"name\":\"fd\"}");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, fdsock, strlen(fdsock) + 1);
    int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(c >= 0);
    int rc = connect(c, (struct sockaddr *)&sa, sizeof(sa));
    int e = errno;
    close(c);
    VHD_CHECK(rc < 0 && e == ECONNREFUSED); /* closed, not listening with nobody accepting */

    VHD_CHECK_EQ(kill(dm.pid, SIGHUP), 0);
    wait_log_count(&dm, "reload: ", 3);
    VHD_CHECK(daemon_log_has(
        &dm, "reload: 0 added, 0 removed, 1 unchanged, 0 changed (not applied), 0 gone "
             "but connected (kept), 0 failed"));
    VHD_CHECK(!daemon_log_has(&dm, "nothing changed"));
    json_object *devs = list(dm.sock);
    VHD_CHECK_EQ(json_object_array_length(devs), 1u);
    json_object_put(devs);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* SIGHUP without --rpc: logged and ignored; the daemon keeps serving. */
VHD_TEST(sighup_without_rpc)
{
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-conv-XXXXXX", "disk.sock");
    track(&dm);
    char *argv[] = {(char *)bin(),          "--socket-path", dm.sock, "--keys",
                    "backend=null,size=1M", "--workers",     "1",     NULL};
    daemon_spawn(&dm, argv);
    VHD_CHECK_EQ(kill(dm.pid, SIGHUP), 0);
    wait_log_count(&dm, "SIGHUP: reloading the configuration needs --rpc", 1);
    VHD_CHECK_EQ(waitpid(dm.pid, NULL, WNOHANG), 0); /* still running */
    struct vhd_blkdrv *d = blkdrv_connect_at(dm.sock, WAIT_MS);
    drv_rw(d, 0, 0, false);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * The writer of a FIFO --config: SIGHUP once vhostd is reading it, then the
 * file; then the file again for the reload.
 */
struct fifo_writer {
    const char *path;
    const char *text;
    struct daemon *dm;
};

static void *write_fifo(void *arg)
{
    struct fifo_writer *w = arg;
    int fd = open(w->path, O_WRONLY | O_CLOEXEC); /* returns once vhostd opened it */
    pid_t pid;
    while (!(pid = __atomic_load_n(&w->dm->pid, __ATOMIC_ACQUIRE)))
        sleep_ms(1);
    if (fd >= 0) {
        kill(pid, SIGHUP); /* start-up: killed vhostd when it was not blocked yet */
        sleep_ms(50);
        if (write(fd, w->text, strlen(w->text)) < 0)
            perror("fifo write");
        close(fd);
    }
    /* The reload that SIGHUP asked for reads it again, once start-up is over. */
    struct stat st;
    uint64_t t0 = ms_now();
    while ((stat(w->dm->sock, &st) < 0 || !S_ISSOCK(st.st_mode)) && ms_now() - t0 < WAIT_MS)
        sleep_ms(5);
    if ((fd = open(w->path, O_WRONLY | O_CLOEXEC)) >= 0) {
        if (write(fd, w->text, strlen(w->text)) < 0)
            perror("fifo write");
        close(fd);
    }
    return NULL;
}

/*
 * A SIGHUP while vhostd is still starting (reading its --config from a FIFO)
 * does not kill it; the reload it asked for runs once the control loop does.
 */
VHD_TEST(sighup_during_startup)
{
    struct daemon dm;
    char fifo[256], text[512];
    conf_prepare(&dm, fifo, text, sizeof(text));
    VHD_CHECK_EQ(mkfifo(fifo, 0600), 0);
    struct fifo_writer w = {.path = fifo, .text = text, .dm = &dm};
    pthread_t t;
    VHD_CHECK_EQ(pthread_create(&t, NULL, write_fifo, &w), 0);
    char *argv[] = {(char *)bin(), "--rpc", dm.sock, "--config", fifo, "--workers", "1", NULL};
    daemon_spawn(&dm, argv);
    VHD_CHECK_EQ(pthread_join(t, NULL), 0);
    wait_log_count(&dm, "reload: 0 added, 0 removed, 1 unchanged", 1);
    json_object *devs = list(dm.sock);
    VHD_CHECK_EQ(json_object_array_length(devs), 1u);
    json_object_put(devs);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * Type=notify: READY=1 arrives on $NOTIFY_SOCKET (a datagram socket the test
 * binds) once the management socket accepts connections: a connect right
 * after it succeeds.
 */
VHD_TEST(notify_ready)
{
    struct daemon dm;
    daemon_prepare_dir(&dm, "vhd-test-conv-XXXXXX", "notify.sock");
    track(&dm);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, dm.sock, strlen(dm.sock) + 1);
    int n = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(n >= 0);
    VHD_CHECK_EQ(bind(n, (struct sockaddr *)&sa, sizeof(sa)), 0);
    char rpc[256], dsock[256];
    snprintf(rpc, sizeof(rpc), "%s/rpc.sock", dm.dir);
    snprintf(dsock, sizeof(dsock), "%s/d.sock", dm.dir);
    VHD_CHECK_EQ(setenv("NOTIFY_SOCKET", dm.sock, 1), 0);
    char *argv[] = {
        (char *)bin(), "--rpc", rpc, "--socket-path", dsock, "--keys", "backend=null,size=1M",
        "--workers",   "1",     NULL};
    daemon_spawn(&dm, argv); /* returns at once: the socket it waits for is ours */
    unsetenv("NOTIFY_SOCKET");
    struct pollfd p = {.fd = n, .events = POLLIN};
    VHD_CHECK_EQ(poll(&p, 1, WAIT_MS), 1);
    char msg[256];
    ssize_t len = recv(n, msg, sizeof(msg) - 1, 0);
    VHD_CHECK(len > 0);
    msg[len] = '\0';
    VHD_CHECK(strstr(msg, "READY=1") != NULL);
    close(rpc_connect(rpc)); /* already listening */
    struct vhd_blkdrv *d = blkdrv_connect_at(dsock, WAIT_MS);
    vhd_blkdrv_disconnect(d);
    close(n);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * vhostctl reload (config.reload, the unit's ExecReload=): SIGHUP's reload
 * with its summary printed; a file that does not parse: exit 1 with the
 * reason, nothing changed.
 */
VHD_TEST(vhostctl_reload)
{
    struct daemon dm;
    char ctl[4096], conf[256], text[512], out[1024], errlog[256];
    conf_prepare(&dm, conf, text, sizeof(text));
    VHD_CHECK(realpath(bin(), ctl) != NULL);
    snprintf(strrchr(ctl, '/') + 1, sizeof(ctl) - (size_t)(strrchr(ctl, '/') + 1 - ctl),
             "vhostctl");
    if (access(ctl, X_OK) != 0)
        vhd_test_skip("vhostctl not built next to vhostd");
    snprintf(errlog, sizeof(errlog), "%s/vhostctl.err", dm.dir);
    write_file(conf, text);
    char *argv[] = {(char *)bin(), "--rpc", dm.sock, "--config", conf, "--workers", "1", NULL};
    daemon_spawn(&dm, argv);
    char *a[] = {ctl, "--rpc", dm.sock, "reload", NULL};
    VHD_CHECK_EQ(run(a, out, sizeof(out), errlog), 0);
    VHD_CHECK(strstr(out, "0 added, 0 removed, 1 unchanged") != NULL);

    snprintf(text, sizeof(text),
             "blk socket=%s/a.sock,backend=null,size=1M\n"
             "blk socket=%s/b.sock,backend=null,size=1M\n",
             dm.dir, dm.dir);
    write_file(conf, text);
    VHD_CHECK_EQ(run(a, out, sizeof(out), errlog), 0);
    VHD_CHECK(strstr(out, "1 added, 0 removed, 1 unchanged") != NULL);

    write_file(conf, "blk socket=/nowhere,no-such-key=1\n");
    VHD_CHECK_EQ(run(a, out, sizeof(out), errlog), 1);
    VHD_CHECK(file_has(errlog, "unknown key 'no-such-key'"));
    VHD_CHECK(file_has(errlog, "nothing changed"));
    json_object *devs = list(dm.sock);
    VHD_CHECK_EQ(json_object_array_length(devs), 2u);
    json_object_put(devs);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}
