/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The management API of the real daemon (build/vhostd --rpc, daemon/rpc.c)
 * and vhostctl: devices added at runtime to a daemon started without any,
 * driven with the userspace blk driver, listed, counted and removed (refused
 * while a front-end is connected, forced: in-flight writes land, the session
 * ends, socket, mappings and fds go); hostile requests (malformed, unknown,
 * mistyped, oversized, half-sent, too many clients) answered with errors
 * while the devices keep serving; hundreds of devices added and removed.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
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
#define MB      (1024 * 1024)

/* ---- a daemon with --rpc on dm->sock and no device ---- */

static void start(struct daemon *dm, const char *extra)
{
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    daemon_prepare_dir(dm, "vhd-test-rpc-XXXXXX", "rpc.sock");
    track(dm);
    char *argv[] = {(char *)bin, "--rpc", dm->sock, "--workers", "2", (char *)extra, NULL};
    daemon_spawn(dm, argv);
}

static int rpc_connect(const struct daemon *dm)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    VHD_CHECK(strlen(dm->sock) < sizeof(sa.sun_path));
    memcpy(sa.sun_path, dm->sock, strlen(dm->sock) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    VHD_CHECK(fd >= 0);
    VHD_CHECK(connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0);
    return fd;
}

static void send_all(int fd, const char *s, size_t len)
{
    while (len) {
        ssize_t n = send(fd, s, len, MSG_NOSIGNAL);
        VHD_CHECK(n > 0);
        s += n;
        len -= (size_t)n;
    }
}

/* One answer line (without its newline) into out within wait_ms; false when the server closed. */
static bool read_line_within(int fd, char *out, size_t outlen, uint64_t wait_ms)
{
    size_t have = 0;
    uint64_t t0 = ms_now();
    while (have + 1 < outlen) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        VHD_CHECK(ms_now() - t0 < wait_ms);
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fd, out + have, 1, 0); /* byte by byte: never past the line */
        if (n <= 0)
            return false;
        if (out[have] == '\n') {
            out[have] = '\0';
            return true;
        }
        have++;
    }
    VHD_CHECK(!"answer too long");
    return false;
}

static bool read_line(int fd, char *out, size_t outlen)
{
    return read_line_within(fd, out, outlen, WAIT_MS);
}

/* Send a request line and return its answer (static buffer). */
static const char *call_raw(int fd, const char *req)
{
    static char resp[1 << 20];
    send_all(fd, req, strlen(req));
    send_all(fd, "\n", 1);
    VHD_CHECK(read_line(fd, resp, sizeof(resp)));
    return resp;
}

static const char *call(int fd, const char *method, const char *params)
{
    char req[4096];
    snprintf(req, sizeof(req), "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"%s\",\"params\":%s}",
             method, params ? params : "{}");
    return call_raw(fd, req);
}

#define CHECK_HAS(s, needle)                                                               \
    do {                                                                                   \
        const char *s_ = (s);                                                              \
        if (!strstr(s_, needle)) {                                                         \
            fprintf(stderr, "  %s:%d: '%s' lacks '%s'\n", __FILE__, __LINE__, s_, needle); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

static int fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    VHD_CHECK(d != NULL);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* How many lines of /proc/PID/maps name needle. */
static int maps_count(pid_t pid, const char *needle)
{
    char path[64], line[512];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    VHD_CHECK(f != NULL);
    int n = 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    fclose(f);
    return n;
}

/* Write then read back one block at off; the data must match. */
static void drv_rw(struct vhd_blkdrv *d, uint64_t off, uint8_t pattern)
{
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, 4096);
    struct vhd_blkdrv_completion c;
    VHD_CHECK(buf != NULL);
    memset(buf, pattern, 4096);
    VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, off, buf, 4096, buf), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    memset(buf, 0, 4096);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, off, buf, 4096, buf), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    VHD_CHECK(buf[0] == pattern && buf[4095] == pattern);
    vhd_blkdrv_buf_free(q, buf, 4096);
}

/* Poll the device's state through list until it says connected (or not). */
static void wait_connected(int fd, const char *name, bool want)
{
    char needle[256];
    snprintf(needle, sizeof(needle), "\"name\":\"%s\",\"kind\"", name);
    uint64_t t0 = ms_now();
    for (;;) {
        const char *r = call(fd, "device.list", NULL);
        const char *p = strstr(r, needle);
        VHD_CHECK(p != NULL);
        const char *c = strstr(p, "\"connected\":");
        VHD_CHECK(c != NULL);
        if (!strncmp(c + 12, want ? "true" : "false", want ? 4 : 5))
            return;
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(10);
    }
}

/*
 * Devices added at runtime serve I/O; a connected one is not removed without
 * force; forced removal lets in-flight writes land, ends the session, and
 * leaves no socket, mapping or fd behind; the other devices keep serving.
 */
VHD_TEST(rpc_add_serve_remove)
{
    struct daemon dm;
    char params[1024], sock_null[300], sock_file[300], sock_net[300];
    struct stat st;

    start(&dm, NULL);
    VHD_CHECK(stat(dm.sock, &st) == 0);
    VHD_CHECK_EQ(st.st_mode & 0777, 0600);
    int fd = rpc_connect(&dm);
    CHECK_HAS(call(fd, "version", NULL), "\"version\":\"");
    CHECK_HAS(call(fd, "device.list", NULL), "{\"devices\":[]}");

    snprintf(sock_null, sizeof(sock_null), "%s/null.sock", dm.dir);
    snprintf(sock_file, sizeof(sock_file), "%s/file.sock", dm.dir);
    snprintf(sock_net, sizeof(sock_net), "%s/net.sock", dm.dir);
    snprintf(dm.img, sizeof(dm.img), "%s/disk.img", dm.dir);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s,backend=null,size=8M,name=nul\"}", sock_null);
    CHECK_HAS(call(fd, "device.add", params), "\"result\":{\"name\":\"nul\"}");
    /* keys: the same parser through a JSON object */
    snprintf(params, sizeof(params),
             "{\"kind\":\"net\",\"keys\":{\"socket\":\"%s\",\"queues\":2,\"rings\":\"split\"}}",
             sock_net);
    CHECK_HAS(call(fd, "device.add", params), "\"result\":{\"name\":\"net.sock\"}");
    struct vhd_blkdrv *nul = blkdrv_connect_at(sock_null, WAIT_MS);
    drv_rw(nul, 0, 0); /* null reads zeroes */
    int fds_before = fd_count(dm.pid);
    snprintf(params, sizeof(params), "{\"kind\":\"blk\",\"spec\":\"socket=%s,image=%s,size=16M\"}",
             sock_file, dm.img);
    CHECK_HAS(call(fd, "device.add", params), "\"result\":{\"name\":\"file.sock\"}");

    /* The command line's messages, word for word. */
    snprintf(params, sizeof(params), "{\"kind\":\"blk\",\"spec\":\"socket=%s/x.sock,color=red\"}",
             dm.dir);
    CHECK_HAS(call(fd, "device.add", params), "\"message\":\"--blk: unknown key 'color'\"");
    snprintf(params, sizeof(params), "{\"kind\":\"blk\",\"spec\":\"socket=%s\"}", sock_file);
    CHECK_HAS(call(fd, "device.add", params), "\"code\":-32");

    const char *l = call(fd, "device.list", NULL);
    VHD_CHECK_EQ(count(l, "\"kind\":"), 3);
    CHECK_HAS(l, "\"name\":\"file.sock\",\"kind\":\"blk\"");
    CHECK_HAS(l, "\"name\":\"net.sock\",\"kind\":\"net\"");
    VHD_CHECK_EQ(count(l, "\"connected\":false"), 2); /* nul is connected */

    /* The guest memory the daemon maps for its sessions (our driver's memfd). */
    int guest_maps = maps_count(dm.pid, "vhostd-guest");
    struct vhd_blkdrv *d = blkdrv_connect_at(sock_file, WAIT_MS);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(d), 16 * MB);
    drv_rw(d, 4096, 0x5a);
    wait_connected(fd, "file.sock", true);
    VHD_CHECK(maps_count(dm.pid, "vhostd-guest") > guest_maps);
    /* A running blk queue's counters: one write and one read of 4 KiB so far. */
    CHECK_HAS(call(fd, "device.stats", "{\"name\":\"file.sock\"}"),
              "\"available\":true,\"requests\":2,\"bytes\":8192,\"drops\":0,\"errors\":0");
    /* negotiated features: at least VIRTIO_F_VERSION_1 (bit 32) */
    l = strstr(call(fd, "device.list", NULL), "\"name\":\"file.sock\"");
    VHD_CHECK(l != NULL);
    CHECK_HAS(l, "\"connected\":true");
    CHECK_HAS(l, "\"features\":\"0x00000001");
    CHECK_HAS(call(fd, "device.stats", "{\"name\":\"net.sock\"}"), "\"queues\":[{\"queue\":0");
    CHECK_HAS(call(fd, "device.stats", "{\"name\":\"nope\"}"), "no device named nope");

    /* Connected: refused without force, the session untouched. */
    CHECK_HAS(call(fd, "device.remove", "{\"name\":\"file.sock\"}"), "has a front-end connected");
    drv_rw(d, 8192, 0x11);

    /*
     * Forced, with writes submitted: what the device had taken completes
     * before the session ends and is in the image. (A chain still in the
     * avail ring when the rings stop is not taken, as at any disconnect:
     * the front-end resubmits it, from its inflight area for QEMU.)
     */
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    enum { N = 16 };
    uint8_t *bufs[N];
    for (int i = 0; i < N; i++) {
        bufs[i] = vhd_blkdrv_buf_alloc(q, 65536);
        VHD_CHECK(bufs[i] != NULL);
        memset(bufs[i], 0xc0 + i, 65536);
        VHD_CHECK_EQ(vhd_blkdrv_submit_write(q, (uint64_t)i * 65536 + MB, bufs[i], 65536, bufs[i]),
                     0);
    }
    CHECK_HAS(call(fd, "device.remove", "{\"name\":\"file.sock\",\"force\":true}"),
              "\"was_connected\":true");
    /* The completions the device published before it let go. */
    bool acked[N] = {false};
    int nacked = 0;
    struct vhd_blkdrv_completion cs[N];
    for (uint64_t t1 = ms_now(); ms_now() - t1 < 500;) {
        int n = vhd_blkdrv_poll(q, cs, N);
        for (int k = 0; k < n; k++)
            for (int i = 0; i < N; i++)
                if (cs[k].cookie == bufs[i] && cs[k].ret == 0 && !acked[i]) {
                    acked[i] = true;
                    nacked++;
                }
        if (n <= 0)
            sleep_ms(10);
    }
    if (getenv("VHD_TEST_DEBUG"))
        fprintf(stderr, "  forced removal: %d of %d writes acknowledged\n", nacked, N);
    /* Every acknowledged write is in the image (completed and flushed before freeing). */
    int img = open(dm.img, O_RDONLY | O_CLOEXEC);
    VHD_CHECK(img >= 0);
    VHD_CHECK(fstat(img, &st) == 0);
    VHD_CHECK_EQ(st.st_size, 16 * MB);
    for (int i = 0; i < N; i++) {
        uint8_t b[2];
        VHD_CHECK_EQ(pread(img, b, 1, (off_t)i * 65536 + MB), 1);
        VHD_CHECK_EQ(pread(img, b + 1, 1, (off_t)i * 65536 + MB + 65535), 1);
        if (!acked[i])
            continue;
        VHD_CHECK_EQ(b[0], 0xc0 + i);
        VHD_CHECK_EQ(b[1], 0xc0 + i);
    }
    close(img);
    /* The front-end hears it: the session is closed. */
    uint64_t t0 = ms_now();
    while (vhd_blkdrv_session_alive(d)) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(10);
    }
    vhd_blkdrv_disconnect(d);
    VHD_CHECK(stat(sock_file, &st) < 0 && errno == ENOENT);
    VHD_CHECK_EQ(maps_count(dm.pid, "vhostd-guest"), guest_maps); /* its guest memory unmapped */
    VHD_CHECK_EQ(fd_count(dm.pid), fds_before);
    l = call(fd, "device.list", NULL);
    VHD_CHECK_EQ(count(l, "\"kind\":"), 2);
    VHD_CHECK(!strstr(l, "file.sock"));

    /* The others never noticed. */
    drv_rw(nul, 4096, 0);
    VHD_CHECK(vhd_blkdrv_session_alive(nul));
    /* The name and socket are free again. */
    snprintf(params, sizeof(params), "{\"kind\":\"blk\",\"spec\":\"socket=%s,image=%s\"}",
             sock_file, dm.img);
    CHECK_HAS(call(fd, "device.add", params), "\"result\":{\"name\":\"file.sock\"}");
    d = blkdrv_connect_at(sock_file, WAIT_MS);
    drv_rw(d, 0, 0x77);
    vhd_blkdrv_disconnect(d);
    vhd_blkdrv_disconnect(nul);

    /* save-config: a --config file with the globals and every device as given. */
    const char *cfg = call(fd, "config.save", NULL);
    CHECK_HAS(cfg, "workers 2\\n");
    CHECK_HAS(cfg, "rpc ");
    CHECK_HAS(cfg, "blk socket=");
    CHECK_HAS(cfg, "backend=null,size=8M,name=nul\\n");
    CHECK_HAS(cfg, "net socket=");
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    VHD_CHECK(stat(dm.sock, &st) < 0); /* the RPC socket is removed at exit */
    test_done();
}

/* Hostile requests get JSON-RPC errors; the daemon and its devices carry on. */
VHD_TEST(rpc_bad_requests)
{
    struct daemon dm;
    char params[512], sock_null[300];

    start(&dm, NULL);
    int fd = rpc_connect(&dm);
    snprintf(sock_null, sizeof(sock_null), "%s/null.sock", dm.dir);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s,backend=null,size=1M\"}", sock_null);
    CHECK_HAS(call(fd, "device.add", params), "\"result\"");
    struct vhd_blkdrv *nul = blkdrv_connect_at(sock_null, WAIT_MS);

    CHECK_HAS(call_raw(fd, "{\"jsonrpc\":\"2.0\",\"id\":1,"), "\"code\":-32700");
    CHECK_HAS(call_raw(fd, "nonsense"), "\"code\":-32700");
    CHECK_HAS(call_raw(fd, "{\"a\":1} {\"b\":2}"), "\"code\":-32700");
    CHECK_HAS(call_raw(fd, "[]"), "\"code\":-32600");
    CHECK_HAS(call_raw(fd, "{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"version\"}"),
              "\"code\":-32600");
    CHECK_HAS(call_raw(fd, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":5}"), "\"code\":-32600");
    CHECK_HAS(call_raw(fd, "{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"version\"}"),
              "\"code\":-32600");
    CHECK_HAS(call(fd, "device.explode", NULL), "unknown method 'device.explode'");
    CHECK_HAS(call(fd, "device.list", "[1]"), "\"code\":-32602");
    CHECK_HAS(call(fd, "device.remove", "{\"name\":5}"), "params.name must be a string");
    CHECK_HAS(call(fd, "device.remove", "{\"name\":\"null.sock\",\"force\":\"yes\"}"),
              "params.force must be a boolean");
    CHECK_HAS(call(fd, "device.remove", "{}"), "params.name is required");
    CHECK_HAS(call(fd, "device.add", "{\"kind\":\"scsi\",\"spec\":\"socket=/x\"}"),
              "params.kind must be blk or net");
    CHECK_HAS(call(fd, "device.add", "{\"kind\":\"blk\",\"keys\":{\"socket\":[1]}}"),
              "params.keys.socket must be");
    CHECK_HAS(call(fd, "device.add", "{\"kind\":\"blk\"}"), "give either params.spec or");
    /*
     * A newline in a value would become a line of its own in config.save's
     * output (a config file root may start from): "sandbox off", "user root".
     */
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s/x.sock,backend=null,size=1M,"
             "name=x\\nsandbox off\\nuser root\"}",
             dm.dir);
    CHECK_HAS(call(fd, "device.add", params), "control characters and '#' are not allowed");
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"keys\":{\"socket\":\"%s/y.sock\",\"backend\":\"null\","
             "\"size\":\"1M\",\"name\":\"y#z\"}}",
             dm.dir);
    CHECK_HAS(call(fd, "device.add", params), "control characters and '#' are not allowed");
    VHD_CHECK(!strstr(call(fd, "config.save", NULL), "sandbox off"));
    /* A FIFO as image: refused at once (its open() used to wait for a writer, for ever). */
    char fifo[300];
    snprintf(fifo, sizeof(fifo), "%s/fifo.img", dm.dir);
    VHD_CHECK_EQ(mkfifo(fifo, 0600), 0);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s/f.sock,image=%s,ro=on\"}", dm.dir, fifo);
    CHECK_HAS(call(fd, "device.add", params), "is neither a regular file nor a block device");
    unlink(fifo);
    /* nesting beyond the cap */
    char deep[256] = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"version\",\"params\":{\"a\":";
    for (int i = 0; i < 30; i++)
        strcat(deep, "[");
    for (int i = 0; i < 30; i++)
        strcat(deep, "]");
    strcat(deep, "}}");
    CHECK_HAS(call_raw(fd, deep), "nesting too deep");
    /* invalid UTF-8 */
    CHECK_HAS(call_raw(fd, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\xfe\"}"),
              "\"code\":-32700");
    /* The connection still works after all that. */
    CHECK_HAS(call(fd, "version", NULL), "\"result\"");

    /* Three requests in one write: three answers, in order, without more input. */
    const char three[] = "{\"jsonrpc\":\"2.0\",\"id\":11,\"method\":\"version\"}\n"
                         "{\"jsonrpc\":\"2.0\",\"id\":12,\"method\":\"device.list\"}\n"
                         "{\"jsonrpc\":\"2.0\",\"id\":13,\"method\":\"nope\"}\n";
    send_all(fd, three, sizeof(three) - 1);
    char ans[4096];
    VHD_CHECK(read_line(fd, ans, sizeof(ans)));
    CHECK_HAS(ans, "\"id\":11");
    VHD_CHECK(read_line(fd, ans, sizeof(ans)));
    CHECK_HAS(ans, "\"id\":12");
    VHD_CHECK(read_line(fd, ans, sizeof(ans)));
    CHECK_HAS(ans, "\"id\":13");

    /* A notification (no id): run, not answered; the next answer is the next request's. */
    send_all(fd, "{\"jsonrpc\":\"2.0\",\"method\":\"version\"}\n", 37);
    CHECK_HAS(call(fd, "device.list", NULL), "\"devices\"");

    /* Oversized: an error, then the connection is closed. */
    int big = rpc_connect(&dm);
    size_t blen = 70000;
    char *b = malloc(blen);
    VHD_CHECK(b != NULL);
    memset(b, ' ', blen);
    b[0] = '{';
    send_all(big, b, blen);
    free(b);
    char line[512];
    VHD_CHECK(read_line(big, line, sizeof(line)));
    CHECK_HAS(line, "larger than 65536 bytes");
    VHD_CHECK(!read_line(big, line, sizeof(line)));
    close(big);

    /* Half a request, then gone. */
    int half = rpc_connect(&dm);
    send_all(half, "{\"jsonrpc\":\"2.0\",\"id\":1,\"meth", 30);
    close(half);
    /* Half a request, then silence: others are served meanwhile. */
    half = rpc_connect(&dm);
    send_all(half, "{\"jsonrpc\":\"2.0\",\"id\":1,\"meth", 30);
    CHECK_HAS(call(fd, "version", NULL), "\"result\"");
    drv_rw(nul, 0, 0);
    close(half);

    VHD_CHECK(vhd_blkdrv_session_alive(nul));
    drv_rw(nul, 4096, 0);
    vhd_blkdrv_disconnect(nul);
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* Many clients at once: each is answered; beyond the cap, an error, not a hang. */
VHD_TEST(rpc_many_clients)
{
    struct daemon dm;
    enum { N = 100 };
    int fds[N];
    char line[512];

    start(&dm, NULL);
    for (int i = 0; i < N; i++)
        fds[i] = rpc_connect(&dm);
    /* Every request is sent before any answer is read. */
    for (int i = 0; i < N; i++) /* one refused may be closed already: EPIPE is fine */
        (void)!send(fds[i], "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"version\"}\n", 45,
                    MSG_NOSIGNAL);
    int ok = 0, refused = 0;
    for (int i = 0; i < N; i++) {
        VHD_CHECK(read_line(fds[i], line, sizeof(line)));
        if (strstr(line, "\"result\""))
            ok++;
        else if (strstr(line, "too many connections"))
            refused++;
        close(fds[i]);
    }
    VHD_CHECK_EQ(ok + refused, N);
    VHD_CHECK(ok >= 64);
    /* All gone: a new client is served. */
    int fd = rpc_connect(&dm);
    CHECK_HAS(call(fd, "version", NULL), "\"result\"");
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* 1024 devices (the cap) added at runtime, one more refused, all removed. */
VHD_TEST(rpc_many_devices)
{
    struct daemon dm;
    enum { N = 1024 };
    char params[512], sock[300];

    start(&dm, NULL);
    int fd = rpc_connect(&dm);
    CHECK_HAS(call(fd, "version", NULL), "\"result\""); /* our connection is accepted */
    int fds_before = fd_count(dm.pid);
    for (int i = 0; i < N; i++) {
        snprintf(
            params, sizeof(params), "{\"kind\":\"%s\",\"spec\":\"socket=%s/d%d.sock,name=d%d%s\"}",
            i % 4 == 3 ? "net" : "blk", dm.dir, i, i, i % 4 == 3 ? "" : ",backend=null,size=1M");
        CHECK_HAS(call(fd, "device.add", params), "\"result\"");
    }
    VHD_CHECK_EQ(count(call(fd, "device.list", NULL), "\"kind\":"), N);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s/over.sock,backend=null,size=1M\"}", dm.dir);
    CHECK_HAS(call(fd, "device.add", params), "too many devices (at most 1024)");
    /* One of them serves I/O among all the others. */
    snprintf(sock, sizeof(sock), "%s/d200.sock", dm.dir);
    struct vhd_blkdrv *d = blkdrv_connect_at(sock, WAIT_MS);
    drv_rw(d, 0, 0);
    for (int i = 0; i < N; i++) {
        if (i == 200)
            continue;
        snprintf(params, sizeof(params), "{\"name\":\"d%d\"}", i);
        CHECK_HAS(call(fd, "device.remove", params), "\"result\"");
    }
    drv_rw(d, 512, 0);
    vhd_blkdrv_disconnect(d);
    wait_connected(fd, "d200", false);
    CHECK_HAS(call(fd, "device.remove", "{\"name\":\"d200\"}"), "\"result\"");
    VHD_CHECK_EQ(count(call(fd, "device.list", NULL), "\"kind\":"), 0);
    VHD_CHECK_EQ(fd_count(dm.pid), fds_before);
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* ---- vhostctl ---- */

static const char *vhostctl_path(void)
{
    static char path[PATH_MAX];
    const char *bin = vhostd_path();
    if (!bin)
        return NULL;
    snprintf(path, sizeof(path), "%s", bin);
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, sizeof(path) - (size_t)(slash ? slash + 1 - path : 0),
             "vhostctl");
    return access(path, X_OK) == 0 ? path : NULL;
}

/* Run vhostctl with args; its stdout and stderr into out. Returns the exit status. */
static int ctl(const char *rpc, char *out, size_t outlen, const char *a1, const char *a2,
               const char *a3, const char *a4)
{
    const char *bin = vhostctl_path();
    int p[2];
    VHD_CHECK(pipe(p) == 0);
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 1);
        dup2(p[1], 2);
        execl(bin, bin, "--rpc", rpc, a1, a2, a3, a4, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    size_t have = 0;
    ssize_t n;
    while (have + 1 < outlen && (n = read(p[0], out + have, outlen - 1 - have)) > 0)
        have += (size_t)n;
    out[have] = '\0';
    close(p[0]);
    int status;
    VHD_CHECK(waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

VHD_TEST(vhostctl_commands)
{
    struct daemon dm;
    static char out[65536];
    char spec[400], sock[300], nodaemon[300];

    if (!vhostctl_path())
        vhd_test_skip("vhostctl is not built next to vhostd");
    start(&dm, NULL);
    snprintf(sock, sizeof(sock), "%s/v.sock", dm.dir);
    snprintf(spec, sizeof(spec), "socket=%s,backend=null,size=4M", sock);
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "add", "blk", spec, NULL), 0);
    CHECK_HAS(out, "v.sock\n");
    snprintf(spec, sizeof(spec), "socket=%s/n.sock,queues=2", dm.dir);
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "add", "net", spec, NULL), 0);
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "add", "blk", "socket=/tmp/x.sock", NULL), 1);
    CHECK_HAS(out, "vhostctl: --blk: image=PATH is required");

    /* list: an aligned table; the columns line up under the header */
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "list", NULL, NULL, NULL), 0);
    CHECK_HAS(out, "NAME    KIND  STATE    CONNECTED  QUEUES  WORKERS");
    const char *row = strstr(out, "\nn.sock  net   waiting  no         5");
    VHD_CHECK(row != NULL);
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "list", "--json", NULL, NULL), 0);
    CHECK_HAS(out, "\"devices\": [");
    CHECK_HAS(out, "\"connected\": false");
    CHECK_HAS(out, "\"workers\": [");

    struct vhd_blkdrv *d = blkdrv_connect_at(sock, WAIT_MS);
    drv_rw(d, 0, 0);
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "remove", "v.sock", NULL, NULL), 1);
    CHECK_HAS(out, "has a front-end connected");
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "stats", "n.sock", "--prometheus", NULL), 0);
    CHECK_HAS(out, "# TYPE vhostd_queue_requests_total counter\n");
    CHECK_HAS(out, "vhostd_queue_requests_total{device=\"n.sock\",kind=\"net\",queue=\"4\"} 0\n");
    CHECK_HAS(out, "# TYPE vhostd_device_connected gauge\n"
                   "vhostd_device_connected{device=\"n.sock\",kind=\"net\"} 0\n");
    VHD_CHECK(!strstr(out, "vhostd_device_size_bytes{")); /* a NIC has no size */
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "stats", "v.sock", "--prometheus", NULL), 0);
    CHECK_HAS(out, "vhostd_device_connected{device=\"v.sock\",kind=\"blk\"} 1\n");
    CHECK_HAS(out, "vhostd_device_size_bytes{device=\"v.sock\",kind=\"blk\"} 4194304\n");
    CHECK_HAS(out, "vhostd_queue_requests_total{device=\"v.sock\",kind=\"blk\",queue=\"0\"} 2\n");
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "stats", NULL, NULL, NULL), 0);
    CHECK_HAS(out, "DEVICE  QUEUE  WORKER  REQUESTS");
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "remove", "v.sock", "--force", NULL), 0);
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "remove", "v.sock", NULL, NULL), 1);
    CHECK_HAS(out, "vhostctl: no device named v.sock");
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "save-config", NULL, NULL, NULL), 0);
    CHECK_HAS(out, "net socket=");
    VHD_CHECK(!strstr(out, "v.sock"));
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "version", NULL, NULL, NULL), 0);
    CHECK_HAS(out, "vhostd ");
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "frobnicate", NULL, NULL, NULL), 2);
    VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "remove", NULL, NULL, NULL), 2);
    snprintf(nodaemon, sizeof(nodaemon), "%s/none.sock", dm.dir);
    VHD_CHECK_EQ(ctl(nodaemon, out, sizeof(out), "list", NULL, NULL, NULL), 3);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* `rpc PATH` in a config file, with a device of the file: the RPC manages both. */
VHD_TEST(rpc_config_file)
{
    struct daemon dm;
    char cfg[300], line[600];
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found");
    daemon_prepare_dir(&dm, "vhd-test-rpc-XXXXXX", "rpc.sock");
    track(&dm);
    snprintf(cfg, sizeof(cfg), "%s/vhostd.conf", dm.dir);
    FILE *f = fopen(cfg, "w");
    VHD_CHECK(f != NULL);
    fprintf(f, "rpc %s\nblk socket=%s/c.sock,backend=null,size=1M,name=cfgdisk\n", dm.sock, dm.dir);
    fclose(f);
    char *argv[] = {(char *)bin, "--config", cfg, NULL};
    daemon_spawn(&dm, argv);
    int fd = rpc_connect(&dm);
    CHECK_HAS(call(fd, "device.list", NULL), "\"name\":\"cfgdisk\"");
    snprintf(line, sizeof(line), "blk socket=%s/c.sock,backend=null,size=1M,name=cfgdisk\\n",
             dm.dir);
    CHECK_HAS(call(fd, "config.save", NULL), line);
    CHECK_HAS(call(fd, "device.remove", "{\"name\":\"cfgdisk\"}"), "\"result\"");
    CHECK_HAS(call(fd, "device.list", NULL), "{\"devices\":[]}");
    close(fd);
    unlink(cfg);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * resume: a read that fails under rerror=stop (the image shrank under it) is
 * held and its queue paused, as list shows; once the image is whole again,
 * device.resume retries it and it completes with the data.
 */
VHD_TEST(rpc_resume)
{
    struct daemon dm;
    char params[1024], sock[300];
    static uint8_t want[4096];

    start(&dm, NULL);
    int fd = rpc_connect(&dm);
    snprintf(sock, sizeof(sock), "%s/r.sock", dm.dir);
    snprintf(dm.img, sizeof(dm.img), "%s/disk.img", dm.dir);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s,image=%s,size=1M,rerror=stop\"}", sock,
             dm.img);
    CHECK_HAS(call(fd, "device.add", params), "\"result\"");
    int img = open(dm.img, O_RDWR | O_CLOEXEC);
    VHD_CHECK(img >= 0);
    memset(want, 0x3c, sizeof(want));
    VHD_CHECK_EQ(pwrite(img, want, sizeof(want), 8192), (ssize_t)sizeof(want));
    struct vhd_blkdrv *d = blkdrv_connect_at(sock, WAIT_MS);
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, 4096);
    VHD_CHECK(buf != NULL);
    CHECK_HAS(call(fd, "device.list", NULL), "\"paused_queues\":0");

    VHD_CHECK_EQ(ftruncate(img, 8192 + 2048), 0); /* the block ends half-way */
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 8192, buf, 4096, buf), 0);
    uint64_t t0 = ms_now();
    while (!strstr(call(fd, "device.list", NULL), "\"paused_queues\":1")) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(10);
    }
    CHECK_HAS(call(fd, "device.resume", "{\"name\":\"nope\"}"), "no device named nope");
    VHD_CHECK_EQ(ftruncate(img, MB), 0);
    VHD_CHECK_EQ(pwrite(img, want, sizeof(want), 8192), (ssize_t)sizeof(want));
    close(img);
    CHECK_HAS(call(fd, "device.resume", "{\"name\":\"r.sock\"}"), "\"resumed_queues\":1");
    struct vhd_blkdrv_completion c;
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, 0);
    VHD_CHECK(memcmp(buf, want, sizeof(want)) == 0);
    CHECK_HAS(call(fd, "device.list", NULL), "\"paused_queues\":0");
    CHECK_HAS(call(fd, "device.resume", "{\"name\":\"r.sock\"}"), "\"resumed_queues\":0");
    vhd_blkdrv_disconnect(d);
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* resize: the image grows, a new session sees the capacity; shrinking over data needs force. */
VHD_TEST(rpc_resize)
{
    struct daemon dm;
    char params[1024], sock[300], out[4096];
    struct stat st;

    start(&dm, NULL);
    int fd = rpc_connect(&dm);
    snprintf(sock, sizeof(sock), "%s/z.sock", dm.dir);
    snprintf(dm.img, sizeof(dm.img), "%s/disk.img", dm.dir);
    snprintf(params, sizeof(params), "{\"kind\":\"blk\",\"spec\":\"socket=%s,image=%s,size=8M\"}",
             sock, dm.img);
    CHECK_HAS(call(fd, "device.add", params), "\"result\"");
    snprintf(params, sizeof(params), "{\"kind\":\"net\",\"spec\":\"socket=%s/zn.sock\"}", dm.dir);
    CHECK_HAS(call(fd, "device.add", params), "\"result\"");
    struct vhd_blkdrv *d = blkdrv_connect_at(sock, WAIT_MS);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(d), 8 * MB);
    drv_rw(d, 6 * MB, 0x42);

    CHECK_HAS(call(fd, "device.resize", "{\"name\":\"z.sock\",\"size\":\"16M\"}"),
              "\"old_size\":8388608,\"size\":16777216");
    VHD_CHECK(stat(dm.img, &st) == 0);
    VHD_CHECK_EQ(st.st_size, 16 * MB);
    CHECK_HAS(call(fd, "device.list", NULL), "\"size\":16777216");
    drv_rw(d, 0, 0x43); /* the running session is not disturbed */
    vhd_blkdrv_disconnect(d);
    d = blkdrv_connect_at(sock, WAIT_MS);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(d), 16 * MB);
    drv_rw(d, 12 * MB, 0x44);

    CHECK_HAS(call(fd, "device.resize", "{\"name\":\"z.sock\",\"size\":4194304}"),
              "holds data past 4194304 bytes");
    VHD_CHECK(stat(dm.img, &st) == 0 && st.st_size == 16 * MB);
    CHECK_HAS(call(fd, "device.resize", "{\"name\":\"z.sock\",\"size\":\"lots\"}"),
              "params.size must be");
    CHECK_HAS(call(fd, "device.resize", "{\"name\":\"z.sock\",\"size\":1000}"),
              "not a positive multiple");
    CHECK_HAS(call(fd, "device.resize", "{\"name\":\"zn.sock\",\"size\":\"1M\"}"),
              "not a blk device");
    snprintf(params, sizeof(params), "blk socket=%s,image=%s,size=16777216\\n", sock, dm.img);
    CHECK_HAS(call(fd, "config.save", NULL), params);
    vhd_blkdrv_disconnect(d);
    if (vhostctl_path()) {
        VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "resize", "z.sock", "4M", NULL), 1);
        CHECK_HAS(out, "vhostctl: z.sock: resize: the image holds data");
        VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "resize", "z.sock", "4M", "--force"), 0);
        CHECK_HAS(out, "z.sock: 4194304 bytes");
        VHD_CHECK(stat(dm.img, &st) == 0 && st.st_size == 4 * MB);
    }
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/*
 * A client that sends half a request and goes silent gets an error after
 * the idle timeout (10 s) and is closed; one that sends nothing is closed.
 * Meanwhile others are served.
 */
VHD_TEST(rpc_idle_timeout)
{
    struct daemon dm;
    char line[512];

    start(&dm, NULL);
    int half = rpc_connect(&dm), silent = rpc_connect(&dm), fd = rpc_connect(&dm);
    send_all(half, "{\"jsonrpc\":\"2.0\",", 14);
    CHECK_HAS(call(fd, "version", NULL), "\"result\"");
    /*
     * A client that sends and never reads: once its answers fill the socket,
     * it is closed at the timeout (it used to keep its slot for ever).
     */
    int flood = rpc_connect(&dm);
    VHD_CHECK_EQ(fcntl(flood, F_SETFL, O_NONBLOCK), 0);
    static const char req[] = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"device.list\"}\n";
    size_t off = 0;
    for (int i = 0; i < 200000; i++) {
        ssize_t n = send(flood, req + off, sizeof(req) - 1 - off, MSG_NOSIGNAL);
        if (n < 0 && errno == EAGAIN) {
            struct pollfd pw = {.fd = flood, .events = POLLOUT};
            if (poll(&pw, 1, 500) == 0)
                break; /* the daemon stopped reading: its answers are unread */
            continue;
        }
        VHD_CHECK(n > 0);
        off = (off + (size_t)n) % (sizeof(req) - 1);
    }
    uint64_t t0 = ms_now();
    VHD_CHECK(read_line_within(half, line, sizeof(line), 30000));
    CHECK_HAS(line, "request not completed in time");
    VHD_CHECK(ms_now() - t0 >= 5000); /* not before the timeout (10 s from the last byte) */
    VHD_CHECK(!read_line_within(half, line, sizeof(line), 30000));
    VHD_CHECK(!read_line_within(silent, line, sizeof(line), 30000)); /* closed, no answer */
    /*
     * The flooder, its answers left unread: the daemon has closed its end
     * (POLLRDHUP shows it without reading) within the timeout.
     */
    bool hup = false;
    for (uint64_t t1 = ms_now(); !hup && ms_now() - t1 < 30000;) {
        struct pollfd pr = {.fd = flood, .events = POLLRDHUP};
        hup = poll(&pr, 1, 1000) > 0 && (pr.revents & (POLLRDHUP | POLLHUP));
    }
    VHD_CHECK(hup);
    close(flood);
    close(half);
    close(silent);
    close(fd); /* idle too by now: reconnect */
    fd = rpc_connect(&dm);
    CHECK_HAS(call(fd, "version", NULL), "\"result\"");
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* --user: the RPC socket is handed to that user (it may manage the daemon), mode 0600. */
VHD_TEST(rpc_socket_owned_by_user)
{
    struct daemon dm;
    struct stat st;
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found");
    if (geteuid() != 0)
        vhd_test_skip("needs root (--user)");
    daemon_prepare_dir(&dm, "vhd-test-rpc-XXXXXX", "rpc.sock");
    track(&dm);
    VHD_CHECK_EQ(chmod(dm.dir, 0777), 0); /* nobody removes the socket at exit */
    char *argv[] = {(char *)bin, "--rpc", dm.sock, "--user", "nobody", NULL};
    daemon_spawn(&dm, argv);
    uint64_t t0 = ms_now();
    while (stat(dm.sock, &st) == 0 && st.st_uid != 65534) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(10);
    }
    VHD_CHECK(stat(dm.sock, &st) == 0);
    VHD_CHECK_EQ(st.st_uid, 65534);
    VHD_CHECK_EQ(st.st_mode & 0777, 0600);
    int fd = rpc_connect(&dm);
    CHECK_HAS(call(fd, "version", NULL), "\"result\"");
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    VHD_CHECK(stat(dm.sock, &st) < 0);
    test_done();
}

/* ---- counters: device.stats and vhostctl stats --prometheus ---- */

/* The unsigned number after "key": in s, after the first occurrence of anchor. */
static uint64_t u64_after(const char *s, const char *anchor, const char *key)
{
    char k[64];
    const char *p = strstr(s, anchor);
    if (!p)
        fprintf(stderr, "  '%s' lacks '%s'\n", s, anchor);
    VHD_CHECK(p != NULL);
    snprintf(k, sizeof(k), "\"%s\":", key);
    p = strstr(p, k);
    if (!p)
        fprintf(stderr, "  '%s' lacks %s after '%s'\n", s, k, anchor);
    VHD_CHECK(p != NULL);
    return strtoull(p + strlen(k), NULL, 10);
}

static bool prom_name_ok(const char *s, size_t n)
{
    if (n == 0 || !(isalpha((unsigned char)s[0]) || s[0] == '_' || s[0] == ':'))
        return false;
    for (size_t i = 1; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == ':'))
            return false;
    return true;
}

/*
 * A parser for Prometheus' text exposition format (0.0.4), strict: every
 * line is "# HELP name text", "# TYPE name counter|gauge|..." or a sample
 * "name{label="value",...} value"; names and label names valid, label values
 * properly escaped, values numbers; a metric's TYPE comes once, before its
 * samples; no series twice. Returns the number of samples; fails the test
 * on the first bad line (printing it).
 */
static int prom_check(const char *text)
{
    static char typed[64][96], series[4096][256];
    int ntyped = 0, nseries = 0, samples = 0;
    const char *line = text;
    while (*line) {
        const char *end = strchr(line, '\n');
        VHD_CHECK(end != NULL); /* every line ends with a newline */
        size_t len = (size_t)(end - line);
        char l[1024];
        VHD_CHECK(len < sizeof(l));
        memcpy(l, line, len);
        l[len] = '\0';
        line = end + 1;
        bool ok = false;
        if (!strncmp(l, "# HELP ", 7) || !strncmp(l, "# TYPE ", 7)) {
            const char *name = l + 7, *sp = strchr(name, ' ');
            ok = sp && prom_name_ok(name, (size_t)(sp - name)) && sp[1] != '\0';
            if (ok && l[2] == 'T') {
                const char *t = sp + 1;
                ok = !strcmp(t, "counter") || !strcmp(t, "gauge") || !strcmp(t, "histogram") ||
                     !strcmp(t, "summary") || !strcmp(t, "untyped");
                for (int i = 0; ok && i < ntyped; i++)
                    ok = strncmp(typed[i], name, (size_t)(sp - name)) != 0 ||
                         typed[i][sp - name] != '\0';
                if (ok) {
                    VHD_CHECK(ntyped < 64 && (size_t)(sp - name) < sizeof(typed[0]));
                    memcpy(typed[ntyped], name, (size_t)(sp - name));
                    typed[ntyped++][sp - name] = '\0';
                }
            }
        } else if (l[0] != '#') {
            size_t n = strcspn(l, "{ ");
            const char *p = l + n;
            ok = prom_name_ok(l, n);
            bool has_type = false;
            for (int i = 0; ok && i < ntyped; i++)
                has_type |= strlen(typed[i]) == n && !strncmp(typed[i], l, n);
            ok = ok && has_type;
            if (ok && *p == '{') {
                p++;
                while (ok && *p != '}') {
                    size_t ln = strcspn(p, "=");
                    ok = prom_name_ok(p, ln) && p[ln] == '=' && p[ln + 1] == '"';
                    p += ln + 2;
                    while (ok && *p != '"') {
                        if (*p == '\\')
                            ok = p[1] == '\\' || p[1] == '"' || p[1] == 'n', p++;
                        ok = ok && *p != '\0';
                        p++;
                    }
                    if (ok)
                        p++;
                    if (ok && *p == ',')
                        p++;
                    else
                        ok = ok && *p == '}';
                }
                if (ok)
                    p++;
            }
            if (ok) {
                size_t key = (size_t)(p - l);
                ok = *p == ' ';
                char *e = NULL;
                if (ok)
                    (void)strtod(p + 1, &e);
                ok = ok && e != p + 1 && (*e == '\0' || *e == ' ');
                for (int i = 0; ok && i < nseries; i++)
                    ok = strlen(series[i]) != key || strncmp(series[i], l, key) != 0;
                if (ok) {
                    VHD_CHECK(nseries < 4096 && key < sizeof(series[0]));
                    memcpy(series[nseries], l, key);
                    series[nseries++][key] = '\0';
                    samples++;
                }
            }
        }
        if (!ok)
            fprintf(stderr, "  not Prometheus text format: '%s'\n", l);
        VHD_CHECK(ok);
    }
    return samples;
}

/* The parser itself: it refuses what the format does not allow. */
VHD_TEST(prometheus_parser)
{
    VHD_CHECK_EQ(
        prom_check("# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\",y=\"q\\\"\"} "
                   "3\na_total{x=\"2\"} 4.5\n"),
        2);
    static const char *bad[] = {
        "a 1\n",                                   /* no TYPE */
        "# TYPE a counter\na{x=\"1\"} \n",         /* no value */
        "# TYPE a counter\na{x=1} 1\n",            /* unquoted label value */
        "# TYPE a counter\n1a 1\n",                /* bad name */
        "# TYPE a counter\na 1\na 2\n",            /* a series twice */
        "# TYPE a counter\n# TYPE a gauge\na 1\n", /* TYPE twice */
        "# TYPE a countr\na 1\n",                  /* unknown type */
        "# TYPE a counter\na{x=\"1\"} one\n",      /* not a number */
        ("# TYPE a counter\na{x=\"1\",} 1\n"       /* a valid line (trailing comma allowed) */
         "\n"),                                    /* then an empty line */
        "# TYPE a counter\na{x=\"1\"} 1",          /* no final newline */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fflush(NULL);
        pid_t pid = fork();
        VHD_CHECK(pid >= 0);
        if (pid == 0) {
            (void)freopen("/dev/null", "w", stderr);
            prom_check(bad[i]);
            _exit(0);
        }
        int st;
        VHD_CHECK(waitpid(pid, &st, 0) == pid);
        if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
            fprintf(stderr, "  accepted: '%s'\n", bad[i]);
        VHD_CHECK(!(WIFEXITED(st) && WEXITSTATUS(st) == 0));
    }
    test_done();
}

/*
 * Every counter of device.stats moves as it must under our driver's I/O in
 * event mode: requests and bytes exactly what was transferred, a request
 * past the end counted as an error, kicks and calls, nothing in flight at
 * rest, the worker's sleeps and its polling/event time; then in poll-always
 * mode the driver never kicks and the worker never sleeps. vhostctl stats
 * --prometheus prints them in valid text format.
 */
static void stats_run(const char *poll, bool event)
{
    struct daemon dm;
    char params[1024], sock[300], img[300], key[300];
    static char out[1 << 16];

    start(&dm, poll);
    int fd = rpc_connect(&dm);
    snprintf(sock, sizeof(sock), "%s/c.sock", dm.dir);
    snprintf(img, sizeof(img), "%s/c.img", dm.dir);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s,image=%s,size=4M,queues=1\"}", sock, img);
    CHECK_HAS(call(fd, "device.add", params), "\"result\"");
    struct vhd_blkdrv *d = blkdrv_connect_at(sock, WAIT_MS);
    const int n = 8;
    for (int i = 0; i < n; i++) {
        drv_rw(d, (uint64_t)i * 8192, (uint8_t)(i + 1));
        sleep_ms(2); /* idle between requests: an event-mode worker sleeps */
    }
    /* one read past the end: IOERR */
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, 4096);
    struct vhd_blkdrv_completion c;
    VHD_CHECK(buf != NULL);
    VHD_CHECK_EQ(vhd_blkdrv_submit_read(q, 4 * MB, buf, 4096, buf), 0);
    VHD_CHECK_EQ(vhd_blkdrv_wait(q, &c, 1, WAIT_MS), 1);
    VHD_CHECK_EQ(c.ret, -EIO);
    vhd_blkdrv_buf_free(q, buf, 4096);

    const char *r = call(fd, "device.stats", "{\"name\":\"c.sock\"}");
    VHD_CHECK_EQ(u64_after(r, "\"queue\":0,", "requests"), 2 * n + 1);
    VHD_CHECK_EQ(u64_after(r, "\"queue\":0,", "bytes"), 2 * n * 4096);
    VHD_CHECK_EQ(u64_after(r, "\"queue\":0,", "errors"), 1);
    VHD_CHECK_EQ(u64_after(r, "\"queue\":0,", "in_flight"), 0);
    uint64_t kicks = u64_after(r, "\"queue\":0,", "kicks");
    uint64_t calls = u64_after(r, "\"queue\":0,", "calls");
    unsigned w = (unsigned)u64_after(r, "\"queue\":0,", "worker");
    VHD_CHECK(w < 2);
    snprintf(key, sizeof(key), "{\"worker\":%u,", w);
    uint64_t sleeps = u64_after(r, key, "sleeps"), sleep_ns = u64_after(r, key, "sleep_ns");
    uint64_t poll_ns = u64_after(r, key, "poll_ns"), event_ns = u64_after(r, key, "event_ns");
    fprintf(stderr,
            "  %s: kicks %llu calls %llu; worker %u: sleeps %llu, asleep %llu us, polling %llu "
            "us, event %llu us\n",
            poll, (unsigned long long)kicks, (unsigned long long)calls, w,
            (unsigned long long)sleeps, (unsigned long long)sleep_ns / 1000,
            (unsigned long long)poll_ns / 1000, (unsigned long long)event_ns / 1000);
    /*
     * What the driver saw bounds what the device counted, whatever the
     * scheduling. Calls: at least one (the driver blocked on its call fd, which
     * only a call wakes), at most one per completion (a completion the driver
     * found by polling needs none; a call it did not wait for leaves the eventfd
     * set and a later wait returns at once, so the driver's count of waits is no
     * bound). Kicks: eventfd writes coalesce, so the device reads at most as
     * many as the driver wrote.
     */
    struct vhd_blkdrv_queue_stats ds;
    vhd_blkdrv_queue_stats(q, &ds);
    fprintf(stderr, "  driver: kicks %llu, blocking waits %llu\n", (unsigned long long)ds.kicks,
            (unsigned long long)ds.sleeps);
    VHD_CHECK(ds.sleeps >= 1);
    VHD_CHECK(calls >= 1 && calls <= 2 * (uint64_t)n + 1);
    VHD_CHECK(kicks <= ds.kicks);
    if (event) {
        /*
         * The driver idled 2 ms between requests: the worker slept and the
         * driver's requests found notifications on (at least once, however
         * loaded the machine).
         */
        VHD_CHECK(ds.kicks >= 1 && kicks >= 1);
        VHD_CHECK(sleeps >= 1);
        VHD_CHECK(sleep_ns > 0 && sleep_ns <= event_ns);
        VHD_CHECK(sleep_ns >= 1000000); /* the test idled >= 2n ms; the worker slept part of it */
        /* Its sleeps were measured: the wake-up cost moved off the 10 us assumed before. */
        uint64_t wake = u64_after(r, key, "wake_cost_ns");
        fprintf(stderr, "  worker %u: wake-up cost %llu ns\n", w, (unsigned long long)wake);
        VHD_CHECK(wake > 0 && wake != 10000);
    } else {
        /*
         * Notifications stay off: no kick but the one a ring may get before
         * its worker turned them off; no sleep but the one before the worker
         * had a queue (its first wait for mail); the rest of the time polling.
         */
        VHD_CHECK(kicks <= 1);
        VHD_CHECK(sleeps <= 1);
        VHD_CHECK_EQ(event_ns, sleep_ns);
        VHD_CHECK(poll_ns >= (uint64_t)n * 1000000);
    }

    if (vhostctl_path()) {
        VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "stats", "--prometheus", NULL, NULL), 0);
        VHD_CHECK(prom_check(out) > 10);
        snprintf(key, sizeof(key),
                 "vhostd_queue_bytes_total{device=\"c.sock\",kind=\"blk\",queue=\"0\"} %d\n",
                 2 * n * 4096);
        CHECK_HAS(out, key);
        CHECK_HAS(out, "vhostd_queue_errors_total{device=\"c.sock\",kind=\"blk\",queue=\"0\"} 1\n");
        CHECK_HAS(out, "vhostd_queue_in_flight{device=\"c.sock\",kind=\"blk\",queue=\"0\"} 0\n");
        CHECK_HAS(out, "# TYPE vhostd_queue_kicks_total counter\n");
        CHECK_HAS(out, "# TYPE vhostd_queue_calls_total counter\n");
        CHECK_HAS(out, "# TYPE vhostd_worker_sleeps_total counter\n");
        CHECK_HAS(out, "# TYPE vhostd_worker_poll_seconds_total counter\n");
        CHECK_HAS(out, "# TYPE vhostd_worker_event_seconds_total counter\n");
        CHECK_HAS(out, "vhostd_worker_sleeps_total{worker=\"1\"} ");
        CHECK_HAS(out, "# TYPE vhostd_worker_wake_cost_seconds gauge\n");
        CHECK_HAS(out, "vhostd_worker_wake_cost_seconds{worker=\"1\"} 0.0");
        VHD_CHECK_EQ(ctl(dm.sock, out, sizeof(out), "stats", NULL, NULL, NULL), 0);
        CHECK_HAS(out, "KICKS  CALLS  INFLIGHT");
        CHECK_HAS(out, "WORKER  SLEEPS  POLL_S");
    }
    vhd_blkdrv_disconnect(d);
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
}

VHD_TEST(rpc_stats_counters_event)
{
    stats_run("--poll=never", true);
    test_done();
}

VHD_TEST(rpc_stats_counters_polling)
{
    stats_run("--poll=always", false);
    test_done();
}

/* ---- shrinking under running queues ---- */

struct shrink_writer {
    struct vhd_blkdrv *d;
    uint64_t lo, hi; /* writes go to [lo, hi) */
    bool stop;       /* (atomic) set by the test */
    uint64_t ok, failed;
};

/* QD32 4 KiB writes spread over [lo, hi) until told to stop; failures (IOERR past the end) counted.
 */
static void *shrink_writer_main(void *arg)
{
    struct shrink_writer *w = arg;
    struct vhd_blkdrv_queue *q = vhd_blkdrv_get_queue(w->d, 0);
    uint8_t *buf = vhd_blkdrv_buf_alloc(q, 4096);
    struct vhd_blkdrv_completion c[32];
    uint64_t slots = (w->hi - w->lo) / 4096, i = 0;
    unsigned inflight = 0;
    if (!buf)
        return NULL;
    memset(buf, 0x5e, 4096);
    while (!__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE) || inflight) {
        while (inflight < 32 && !__atomic_load_n(&w->stop, __ATOMIC_ACQUIRE) &&
               vhd_blkdrv_submit_write(q, w->lo + (i++ % slots) * 4096, buf, 4096, NULL) == 0)
            inflight++;
        int n = vhd_blkdrv_wait(q, c, 32, 1000);
        if (n <= 0)
            break;
        for (int k = 0; k < n; k++)
            c[k].ret == 0 ? w->ok++ : w->failed++;
        inflight -= (unsigned)n;
    }
    vhd_blkdrv_buf_free(q, buf, 4096);
    return NULL;
}

/*
 * Shrinking a device whose queue runs writes past the new end: every write
 * admitted under the old size completes before the image is cut (none
 * lands after it and grows the file back), writes past the new end fail
 * with IOERR, and the device keeps serving. Shrink and grow, many times.
 */
VHD_TEST(rpc_shrink_under_writes)
{
    struct daemon dm;
    char params[1024], sock[300];
    struct stat st;

    start(&dm, NULL);
    int fd = rpc_connect(&dm);
    snprintf(sock, sizeof(sock), "%s/s.sock", dm.dir);
    snprintf(dm.img, sizeof(dm.img), "%s/s.img", dm.dir);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s,image=%s,size=16M,queues=1\"}", sock, dm.img);
    CHECK_HAS(call(fd, "device.add", params), "\"result\"");
    struct shrink_writer w = {.d = blkdrv_connect_at(sock, WAIT_MS), .lo = 15 * MB, .hi = 16 * MB};
    pthread_t th;
    VHD_CHECK_EQ(pthread_create(&th, NULL, shrink_writer_main, &w), 0);
    int grown_back = 0;
    for (int round = 0; round < 200; round++) {
        CHECK_HAS(call(fd, "device.resize", "{\"name\":\"s.sock\",\"size\":\"8M\",\"force\":true}"),
                  "\"size\":8388608");
        sleep_ms(1); /* a write that slipped past the cut lands by now */
        VHD_CHECK(stat(dm.img, &st) == 0);
        grown_back += st.st_size != 8 * MB;
        CHECK_HAS(call(fd, "device.resize", "{\"name\":\"s.sock\",\"size\":\"16M\"}"),
                  "\"size\":16777216");
        sleep_ms(1);
    }
    __atomic_store_n(&w.stop, true, __ATOMIC_RELEASE);
    VHD_CHECK_EQ(pthread_join(th, NULL), 0);
    fprintf(stderr, "  %llu writes done, %llu failed past the end; image grown back %d times\n",
            (unsigned long long)w.ok, (unsigned long long)w.failed, grown_back);
    VHD_CHECK_EQ(grown_back, 0);
    VHD_CHECK(w.ok > 0 && w.failed > 0);
    drv_rw(w.d, 4 * MB, 0x17); /* still serving */
    vhd_blkdrv_disconnect(w.d);
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* Wait (bounded) until process pid has path open: it is inside that image's open. */
static void wait_fd_open(pid_t pid, const char *path)
{
    char dir[64], link[600], target[600];
    snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
    uint64_t t0 = ms_now();
    for (;;) {
        DIR *d = opendir(dir);
        VHD_CHECK(d != NULL);
        bool found = false;
        for (struct dirent *e; !found && (e = readdir(d));) {
            snprintf(link, sizeof(link), "%s/%s", dir, e->d_name);
            ssize_t n = readlink(link, target, sizeof(target) - 1);
            found = n > 0 && (target[n] = '\0', !strcmp(target, path));
        }
        closedir(d);
        if (found)
            return;
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(5);
    }
}

/* Wait (bounded) until file path contains needle. */
static void wait_file_has(const char *path, const char *needle)
{
    uint64_t t0 = ms_now();
    for (;;) {
        char buf[16384] = "";
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t n = read(fd, buf, sizeof(buf) - 1);
            buf[n > 0 ? n : 0] = '\0';
            close(fd);
        }
        if (strstr(buf, needle))
            return;
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(5);
    }
}

/*
 * An add whose backend opens slowly (here: the image lock of another user,
 * which the daemon waits 2 s to see go) holds up nothing else: meanwhile
 * another client's list is answered, a front-end connects to another device
 * (its vhost-user messages go through the control thread) and does I/O, all
 * promptly; the add is answered when its open ends, and the same connection's
 * next request after it is answered in order.
 */
VHD_TEST(rpc_slow_add_blocks_nothing)
{
    struct daemon dm;
    char params[1024], sock_null[300], sock_file[300], line[4096];

    start(&dm, NULL);
    int fd = rpc_connect(&dm);
    snprintf(sock_null, sizeof(sock_null), "%s/null.sock", dm.dir);
    snprintf(sock_file, sizeof(sock_file), "%s/file.sock", dm.dir);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s,backend=null,size=8M,name=nul\"}", sock_null);
    CHECK_HAS(call(fd, "device.add", params), "\"result\":{\"name\":\"nul\"}");

    /* Someone (as QEMU does) holds the image and does not share "write". */
    snprintf(dm.img, sizeof(dm.img), "%s/disk.img", dm.dir);
    int img = open(dm.img, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    VHD_CHECK(img >= 0);
    VHD_CHECK_EQ(ftruncate(img, 16 * MB), 0);
    struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET, .l_start = 201, .l_len = 1};
    VHD_CHECK_EQ(fcntl(img, F_OFD_SETLK, &fl), 0);

    /* The slow add, and the next request of the same connection right behind it. */
    int slow = rpc_connect(&dm);
    char req[2048];
    snprintf(req, sizeof(req),
             "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"device.add\",\"params\":{\"kind\":"
             "\"blk\",\"spec\":\"socket=%s,image=%s\"}}\n"
             "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"version\"}\n",
             sock_file, dm.img);
    uint64_t t0 = ms_now();
    send_all(slow, req, strlen(req));
    wait_fd_open(dm.pid, dm.img); /* the daemon is in the image's open (its lock wait) */

    /* Meanwhile: another client, and another device's front-end. */
    uint64_t t = ms_now();
    CHECK_HAS(call(fd, "device.list", NULL), "\"name\":\"nul\"");
    uint64_t list_ms = ms_now() - t;
    t = ms_now();
    struct vhd_blkdrv *nul = blkdrv_connect_at(sock_null, WAIT_MS);
    drv_rw(nul, 0, 0);
    uint64_t io_ms = ms_now() - t;
    fprintf(stderr, "  list %llu ms, connect + I/O %llu ms during the add\n",
            (unsigned long long)list_ms, (unsigned long long)io_ms);
    VHD_CHECK(list_ms < 1000);
    VHD_CHECK(io_ms < 1000);

    /* The add: refused once the daemon gave up waiting for the lock, then the next answer. */
    VHD_CHECK(read_line(slow, line, sizeof(line)));
    uint64_t add_ms = ms_now() - t0;
    CHECK_HAS(line, "\"id\":1");
    CHECK_HAS(line, "Failed to get \\\"write\\\" lock");
    VHD_CHECK(add_ms >= 1900); /* it did wait: the checks above overlapped it */
    VHD_CHECK(read_line(slow, line, sizeof(line)));
    CHECK_HAS(line, "\"id\":2");
    CHECK_HAS(line, "\"result\":{\"version\"");

    /* The lock gone, the same add succeeds and the device serves. */
    close(img);
    snprintf(params, sizeof(params), "{\"kind\":\"blk\",\"spec\":\"socket=%s,image=%s\"}",
             sock_file, dm.img);
    CHECK_HAS(call(slow, "device.add", params), "\"result\":{\"name\":\"file.sock\"}");
    struct vhd_blkdrv *d = blkdrv_connect_at(sock_file, WAIT_MS);
    drv_rw(d, 4096, 0x3c);
    vhd_blkdrv_disconnect(d);
    vhd_blkdrv_disconnect(nul);

    /*
     * A client that leaves while its add opens: the add completes (the
     * device is added, nobody told) and the daemon carries on.
     */
    char img2[300], sock2[300];
    snprintf(img2, sizeof(img2), "%s/disk2.img", dm.dir);
    snprintf(sock2, sizeof(sock2), "%s/two.sock", dm.dir);
    int img2fd = open(img2, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    VHD_CHECK(img2fd >= 0);
    VHD_CHECK_EQ(ftruncate(img2fd, MB), 0);
    VHD_CHECK_EQ(fcntl(img2fd, F_OFD_SETLK, &fl), 0);
    int gone = rpc_connect(&dm);
    snprintf(req, sizeof(req),
             "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"device.add\",\"params\":{\"kind\":"
             "\"blk\",\"spec\":\"socket=%s,image=%s,name=two\"}}\n",
             sock2, img2);
    send_all(gone, req, strlen(req));
    wait_fd_open(dm.pid, img2); /* its open waits for the lock */
    close(gone);
    /* A second add of the same name while the first opens is refused at once. */
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s/three.sock,backend=null,size=1M,name=two\"}",
             dm.dir);
    CHECK_HAS(call(fd, "device.add", params), "is being added");
    close(img2fd); /* its open now sees the lock go and succeeds */
    t0 = ms_now();
    while (!strstr(call(fd, "device.list", NULL), "\"name\":\"two\"")) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(20);
    }
    CHECK_HAS(call(fd, "device.remove", "{\"name\":\"two\"}"), "\"result\"");
    close(slow);
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    test_done();
}

/* nbdkit ARGS... -f -U sock, started by pid (skip the test without nbdkit); waits for its socket.
 */
static pid_t nbdkit_start(const char *sock, const char *log, char *const *args, int nargs)
{
    if (access("/usr/bin/nbdkit", X_OK) < 0)
        vhd_test_skip("nbdkit not installed (scripts/deps.sh test)");
    char *argv[16] = {(char *)"/usr/bin/nbdkit", (char *)"-f", (char *)"-U", (char *)sock};
    VHD_CHECK(nargs <= 10);
    for (int i = 0; i < nargs; i++)
        argv[4 + i] = args[i];
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0 || dup2(fd, STDERR_FILENO) < 0 || dup2(fd, STDOUT_FILENO) < 0)
            _exit(126);
        execv(argv[0], argv);
        _exit(127);
    }
    uint64_t t0 = ms_now();
    struct stat st;
    while (stat(sock, &st) < 0) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        VHD_CHECK(waitpid(pid, NULL, WNOHANG) == 0); /* still running */
        sleep_ms(10);
    }
    return pid;
}

static void nbdkit_stop(pid_t pid)
{
    VHD_CHECK_EQ(kill(pid, SIGTERM), 0);
    VHD_CHECK_EQ(waitpid(pid, NULL, 0), pid);
}

/*
 * An NBD server slow to accept a new export (nbdkit's delay filter, 2 s per
 * open): the add probes it on its open thread, under the sandbox; meanwhile
 * another client and another device's front-end are served promptly; then
 * the NBD device serves. A server named by a host name is refused at once
 * (resolving it needs calls the filter forbids), and the daemon lives on.
 */
VHD_TEST(rpc_slow_nbd_add_under_sandbox)
{
    struct daemon dm;
    char params[1024], sock_null[300], sock_nbd[300], nbd_srv[300], log[300], line[4096];

    start(&dm, NULL);
    int fd = rpc_connect(&dm);
    snprintf(sock_null, sizeof(sock_null), "%s/null.sock", dm.dir);
    snprintf(sock_nbd, sizeof(sock_nbd), "%s/nbd.sock", dm.dir);
    snprintf(nbd_srv, sizeof(nbd_srv), "%s/server.sock", dm.dir);
    snprintf(log, sizeof(log), "%s/nbdkit.log", dm.dir);
    char *args[] = {(char *)"-v", (char *)"--filter=delay", (char *)"memory", (char *)"16M",
                    (char *)"delay-open=2"};
    pid_t srv = nbdkit_start(nbd_srv, log, args, 5);
    snprintf(params, sizeof(params),
             "{\"kind\":\"blk\",\"spec\":\"socket=%s,backend=null,size=8M,name=nul\"}", sock_null);
    CHECK_HAS(call(fd, "device.add", params), "\"result\":{\"name\":\"nul\"}");

    int slow = rpc_connect(&dm);
    char req[2048];
    snprintf(req, sizeof(req),
             "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"device.add\",\"params\":{\"kind\":"
             "\"blk\",\"spec\":\"socket=%s,backend=nbd,uri=nbd+unix:///?socket=%s\"}}\n",
             sock_nbd, nbd_srv);
    uint64_t t0 = ms_now();
    send_all(slow, req, strlen(req));
    wait_file_has(log, "accepted connection"); /* the daemon's probe is at the server */
    uint64_t t = ms_now();
    CHECK_HAS(call(fd, "device.list", NULL), "\"name\":\"nul\"");
    uint64_t list_ms = ms_now() - t;
    t = ms_now();
    struct vhd_blkdrv *nul = blkdrv_connect_at(sock_null, WAIT_MS);
    drv_rw(nul, 0, 0);
    uint64_t io_ms = ms_now() - t;
    fprintf(stderr, "  list %llu ms, connect + I/O %llu ms during the NBD add\n",
            (unsigned long long)list_ms, (unsigned long long)io_ms);
    VHD_CHECK(list_ms < 1000);
    VHD_CHECK(io_ms < 1000);
    VHD_CHECK(read_line(slow, line, sizeof(line)));
    uint64_t add_ms = ms_now() - t0;
    CHECK_HAS(line, "\"result\":{\"name\":\"nbd.sock\"}");
    VHD_CHECK(add_ms >= 1900);
    struct vhd_blkdrv *d = blkdrv_connect_at(sock_nbd, WAIT_MS);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(d), 16 * MB);
    drv_rw(d, 8192, 0x6b); /* workers connect to the server under the filter */
    vhd_blkdrv_disconnect(d);
    vhd_blkdrv_disconnect(nul);

    /* Refused before anything is opened; the daemon carries on. */
    static const char *const refused[] = {"nbd://localhost:10809/x", "nbd:///x",
                                          "nbds://127.0.0.1/x", "nbd://me@127.0.0.1/x"};
    for (int i = 0; i < 4; i++) {
        snprintf(params, sizeof(params),
                 "{\"kind\":\"blk\",\"spec\":\"socket=%s/r%d.sock,backend=nbd,uri=%s\"}", dm.dir, i,
                 refused[i]);
        CHECK_HAS(call(fd, "device.add", params), "\"error\"");
    }
    CHECK_HAS(call(fd, "device.add",
                   "{\"kind\":\"blk\",\"spec\":\"socket=/tmp/x.sock,backend=nbd,"
                   "uri=nbd://localhost/x\"}"),
              "resolving a host name needs calls the filter forbids");
    CHECK_HAS(call(fd, "device.list", NULL), "\"name\":\"nbd.sock\"");
    close(slow);
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    nbdkit_stop(srv);
    test_done();
}

/*
 * A SIGHUP reload that adds an NBD disk on a server slow to open (2 s):
 * the backend opens off the control thread, as a connection's add does —
 * the reload is done at once and the device joins the table once open,
 * then serves.
 */
VHD_TEST(rpc_reload_nbd_add_does_not_block)
{
    struct daemon dm;
    char conf[300], confarg[320], sock_nbd[300], nbd_srv[300], log[300], text[1024];
    daemon_prepare_dir(&dm, "vhd-test-rpc-XXXXXX", "rpc.sock");
    snprintf(conf, sizeof(conf), "%s/vhostd.conf", dm.dir);
    FILE *f = fopen(conf, "w");
    VHD_CHECK(f && fputs("# empty at start\n", f) >= 0 && fclose(f) == 0);
    snprintf(confarg, sizeof(confarg), "--config=%s", conf);
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found");
    track(&dm);
    char *argv[] = {(char *)bin, "--rpc", dm.sock, "--workers", "2", confarg, NULL};
    daemon_spawn(&dm, argv);
    snprintf(sock_nbd, sizeof(sock_nbd), "%s/nbd.sock", dm.dir);
    snprintf(nbd_srv, sizeof(nbd_srv), "%s/server.sock", dm.dir);
    snprintf(log, sizeof(log), "%s/nbdkit.log", dm.dir);
    char *args[] = {(char *)"-v", (char *)"--filter=delay", (char *)"memory", (char *)"16M",
                    (char *)"delay-open=2"};
    pid_t srv = nbdkit_start(nbd_srv, log, args, 5);
    snprintf(text, sizeof(text), "blk socket=%s,backend=nbd,uri=nbd+unix:///?socket=%s\n", sock_nbd,
             nbd_srv);
    f = fopen(conf, "w");
    VHD_CHECK(f && fputs(text, f) >= 0 && fclose(f) == 0);
    uint64_t t0 = ms_now();
    VHD_CHECK_EQ(kill(dm.pid, SIGHUP), 0);
    while (!daemon_log_has(&dm, "reload: 1 added")) {
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(10);
    }
    uint64_t reload_ms = ms_now() - t0;
    int fd = rpc_connect(&dm);
    t0 = ms_now();
    const char *ans = call(fd, "device.list", NULL);
    uint64_t list_ms = ms_now() - t0;
    fprintf(stderr, "  reload done after %llu ms, device.list %llu ms\n",
            (unsigned long long)reload_ms, (unsigned long long)list_ms);
    VHD_CHECK(reload_ms < 1500); /* the server takes 2 s to open */
    VHD_CHECK(list_ms < 1000);
    (void)ans;
    t0 = ms_now();
    for (;;) { /* in the table once open */
        ans = call(fd, "device.list", NULL);
        if (strstr(ans, "nbd.sock"))
            break;
        VHD_CHECK(ms_now() - t0 < WAIT_MS);
        sleep_ms(50);
    }
    struct vhd_blkdrv *d = blkdrv_connect_at(sock_nbd, WAIT_MS);
    VHD_CHECK_EQ(vhd_blkdrv_capacity(d), 16 * MB);
    drv_rw(d, 4096, 0x5c);
    vhd_blkdrv_disconnect(d);
    close(fd);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    nbdkit_stop(srv);
    test_done();
}
