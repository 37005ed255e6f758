/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Worker placement and the NUMA report: the CPU list parser
 * (vhd_parse_cpu_list), workers pinned by a library context and by the
 * daemon's --cpus (each worker thread's affinity read back from
 * /proc/PID/task/TID/status), lists refused with a clear error, the
 * event-mode spin reaching the workers (library config and --spin-us), and
 * the report of which NUMA node a device's guest memory sits on once a
 * front-end's memory table arrives (node 0 on a one-node host).
 */
#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/api.h"
#include "core/mem.h"
#include "runtime/dev.h"
#include "runtime/log.h"
#include "runtime/numa.h"
#include "harness.h"
#include "runtime/rt.h"
#include "vhostd/blk_driver.h"
#include "vhostd/ctx.h"

#define MAX_DAEMONS 4
#include "daemon_fixture.h"

#define WAIT_MS 5000

/* The i-th CPU this process may run on (the tests use CPUs 0 and 1 only when allowed). */
static int allowed_cpu(unsigned i)
{
    cpu_set_t set;
    VHD_CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &set) && i-- == 0)
            return c;
    return -1;
}

/*
 * Cpus_allowed_list of the thread of process pid named "vhd-worker<w>", into
 * out; false when there is no such thread.
 */
static bool worker_cpus(pid_t pid, unsigned w, char *out, size_t len)
{
    char path[512], want[32], line[256];
    bool found = false;

    snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
    snprintf(want, sizeof(want), "vhd-worker%u\n", w);
    DIR *d = opendir(path);
    VHD_CHECK(d != NULL);
    for (struct dirent *e; !found && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        bool match = fgets(line, sizeof(line), f) && !strcmp(line, want);
        fclose(f);
        if (!match)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/task/%s/status", (int)pid, e->d_name);
        f = fopen(path, "r");
        VHD_CHECK(f != NULL);
        while (fgets(line, sizeof(line), f)) {
            if (strncmp(line, "Cpus_allowed_list:", 18))
                continue;
            char *v = line + 18;
            v += strspn(v, " \t");
            v[strcspn(v, "\n")] = '\0';
            snprintf(out, len, "%s", v);
            found = true;
        }
        fclose(f);
    }
    closedir(d);
    return found;
}

static void check_pinned(pid_t pid, unsigned w, int cpu)
{
    char got[64], want[16];
    VHD_CHECK(worker_cpus(pid, w, got, sizeof(got)));
    snprintf(want, sizeof(want), "%d", cpu);
    if (strcmp(got, want))
        fprintf(stderr, "  worker %u: Cpus_allowed_list %s, expected %s\n", w, got, want);
    VHD_CHECK(!strcmp(got, want));
}

/* ---- the list syntax ---- */

VHD_TEST(parse_cpu_list)
{
    unsigned c[8];
    VHD_CHECK_EQ(vhd_parse_cpu_list("3", c, 8), 1);
    VHD_CHECK_EQ(c[0], 3u);
    VHD_CHECK_EQ(vhd_parse_cpu_list("0,2-5", c, 8), 5);
    VHD_CHECK(c[0] == 0 && c[1] == 2 && c[2] == 3 && c[3] == 4 && c[4] == 5);
    /* In the order given, not sorted: worker i takes the i-th. */
    VHD_CHECK_EQ(vhd_parse_cpu_list("7,1,4-5", c, 8), 4);
    VHD_CHECK(c[0] == 7 && c[1] == 1 && c[2] == 4 && c[3] == 5);
    VHD_CHECK_EQ(vhd_parse_cpu_list("0-9:3", c, 8), 4);
    VHD_CHECK(c[0] == 0 && c[1] == 3 && c[2] == 6 && c[3] == 9);
    VHD_CHECK_EQ(vhd_parse_cpu_list("1023", c, 8), 1);

    static const char *const bad[] = {"",    ",",    "1,",    ",1",   "a",   "1-",  "-1",
                                      "3-1", "1 ,2", "1-4:0", "1-4:", "0x1", "1;2", " 1"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = vhd_parse_cpu_list(bad[i], c, 8);
        if (rc != -EINVAL)
            fprintf(stderr, "  '%s': %d\n", bad[i], rc);
        VHD_CHECK_EQ(rc, -EINVAL);
    }
    VHD_CHECK_EQ(vhd_parse_cpu_list("1024", c, 8), -ERANGE);
    VHD_CHECK_EQ(vhd_parse_cpu_list("0-99999", c, 8), -ERANGE);
    VHD_CHECK_EQ(vhd_parse_cpu_list("1,0-2", c, 8), -EEXIST);
    VHD_CHECK_EQ(vhd_parse_cpu_list("0-8", c, 8), -E2BIG);
    VHD_CHECK_EQ(vhd_parse_cpu_list(NULL, c, 8), -EINVAL);
}

/* ---- the library ---- */

VHD_TEST(ctx_pins_workers_in_order)
{
    int a = allowed_cpu(0), b = allowed_cpu(1);
    if (b < 0)
        vhd_test_skip("needs two CPUs");
    /* Three workers on a list of two: the list repeats. */
    unsigned cpus[2] = {(unsigned)b, (unsigned)a};
    struct vhd_ctx_config cfg;
    vhd_ctx_config_init(&cfg);
    VHD_CHECK_EQ(cfg.ncpus, 0u);
    cfg.workers = 3;
    cfg.cpus = cpus;
    cfg.ncpus = 2;
    struct vhd_ctx *ctx;
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), 0);
    cpus[0] = cpus[1] = 9999; /* copied: the caller's array may go */
    check_pinned(getpid(), 0, b);
    check_pinned(getpid(), 1, a);
    check_pinned(getpid(), 2, b);
    for (unsigned w = 0; w < 3; w++) {
        VHD_CHECK_EQ(vhd_rt_worker_cpu(ctx->rt, w), w == 1 ? a : b);
        VHD_CHECK(vhd_rt_worker_node(ctx->rt, w) >= 0); /* seen by the worker on its CPU */
    }
    vhd_ctx_destroy(ctx);

    /* Without a list the workers float. */
    cfg.ncpus = 0;
    cfg.cpus = NULL;
    cfg.workers = 1;
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), 0);
    VHD_CHECK_EQ(vhd_rt_worker_cpu(ctx->rt, 0), -1);
    VHD_CHECK_EQ(vhd_rt_worker_node(ctx->rt, 0), -1);
    char got[64], one[16];
    VHD_CHECK(worker_cpus(getpid(), 0, got, sizeof(got)));
    snprintf(one, sizeof(one), "%d", a);
    VHD_CHECK(strcmp(got, one) != 0); /* not pinned to one CPU */
    vhd_ctx_destroy(ctx);
}

VHD_TEST(ctx_refuses_bad_cpu_lists)
{
    cpu_set_t set;
    VHD_CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
    unsigned missing = 0;
    while (missing < CPU_SETSIZE && CPU_ISSET(missing, &set))
        missing++;
    unsigned one = (unsigned)allowed_cpu(0);
    unsigned cpus[VHD_CTX_MAX_WORKERS + 1] = {0};
    struct vhd_ctx_config cfg;
    struct vhd_ctx *ctx = NULL;

    vhd_ctx_config_init(&cfg);
    cfg.cpus = cpus;
    cpus[0] = missing; /* a CPU the process may not use (or that does not exist) */
    cfg.ncpus = 1;
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), -EINVAL);
    cpus[0] = 4096; /* beyond any cpu_set_t */
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), -EINVAL);
    cpus[0] = cpus[1] = one; /* twice */
    cfg.ncpus = 2;
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), -EINVAL);
    cfg.ncpus = VHD_CTX_MAX_WORKERS + 1;
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), -EINVAL);
    cfg.ncpus = 1;
    cfg.cpus = NULL;
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), -EINVAL);
    VHD_CHECK(ctx == NULL);
}

/* The spin reaches every worker: its published poll window in event mode. */
VHD_TEST(ctx_spin_reaches_workers)
{
    struct vhd_ctx_config cfg;
    struct vhd_ctx *ctx;
    static const unsigned spins[] = {10, 0, 25, 1000};

    vhd_ctx_config_init(&cfg);
    VHD_CHECK_EQ(cfg.spin_us, VHD_CTX_SPIN_AUTO);
    cfg.workers = 2;
    cfg.poll = VHD_CTX_POLL_NEVER;
    for (size_t i = 0; i < sizeof(spins) / sizeof(spins[0]); i++) {
        cfg.spin_us = spins[i];
        VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), 0);
        for (unsigned w = 0; w < 2; w++)
            VHD_CHECK_EQ(vhd_rt_poll_window_ns(ctx->rt, w), (uint64_t)spins[i] * 1000u);
        vhd_ctx_destroy(ctx);
    }
    /* Adaptive: the window starts at poll_us whatever the spin (its floor). */
    cfg.poll = VHD_CTX_POLL_ADAPTIVE;
    cfg.poll_us = 80;
    cfg.spin_us = 0;
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), 0);
    VHD_CHECK_EQ(vhd_rt_poll_window_ns(ctx->rt, 0), 80000u);
    vhd_ctx_destroy(ctx);
    /* Automatic: every worker starts at the assumed wake-up cost (10 us), then measures. */
    cfg.poll = VHD_CTX_POLL_NEVER;
    cfg.spin_us = VHD_CTX_SPIN_AUTO;
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), 0);
    for (unsigned w = 0; w < 2; w++) {
        struct vhd_worker_stats ws;
        VHD_CHECK_EQ(vhd_rt_poll_window_ns(ctx->rt, w), 10000u);
        VHD_CHECK_EQ(vhd_ctx_worker_stats(ctx, w, &ws), 0);
        VHD_CHECK_EQ(ws.wake_cost_ns, 10000u);
    }
    vhd_ctx_destroy(ctx);
    cfg.spin_us = 1000001;
    VHD_CHECK_EQ(vhd_ctx_new(&cfg, &ctx), -EINVAL);
}

/* ---- the NUMA report, with placements a one-node host cannot have ---- */

/* Run vhd_numa_report_mem(dev, q, nq, last) with stderr (the log) captured into out. */
static unsigned report_captured(const struct vhd_dev *dev, const struct vhd_numa_qplace *q,
                                unsigned nq, bool last, char *out, size_t len)
{
    FILE *tmp = tmpfile();
    VHD_CHECK(tmp != NULL);
    fflush(stderr);
    int saved = dup(2);
    VHD_CHECK(saved >= 0 && dup2(fileno(tmp), 2) == 2);
    unsigned r = vhd_numa_report_mem(dev, q, nq, last);
    fflush(stderr);
    VHD_CHECK(dup2(saved, 2) == 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(out, 1, len - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
    return r;
}

VHD_TEST(numa_report_warns_about_remote_workers)
{
    int here = vhd_numa_node_here();
    VHD_CHECK(here >= 0);
    /* Guest memory: 64 pages of a memfd, every one touched here (so on this node). */
    size_t len = 64 * 4096;
    int fd = memfd_create("guest", MFD_CLOEXEC);
    VHD_CHECK(fd >= 0 && ftruncate(fd, (off_t)len) == 0);
    struct vhd_mem_region_desc d = {.gpa = 0, .size = len, .uva = 0x10000000, .fd = fd};
    static struct vhd_dev dev;
    snprintf(dev.name, sizeof(dev.name), "g0");
    VHD_CHECK_EQ(vhd_mem_new(&d, 1, &dev.mem), 0);
    char log[4096], want[128];
    vhd_log_set_level(VHD_LOG_INFO);

    /* Nothing resident yet: silent unless it is the last chance; no page is faulted in. */
    struct vhd_numa_qplace q[3] = {{0, -1, -1}, {1, 5, here + 1}, {1, 5, here + 1}};
    VHD_CHECK_EQ(report_captured(&dev, q, 3, false, log, sizeof(log)), 0u);
    VHD_CHECK_EQ(log[0], '\0');
    VHD_CHECK_EQ(report_captured(&dev, q, 3, true, log, sizeof(log)), 0u);
    VHD_CHECK(strstr(log, "g0: guest memory: none of 16 sampled pages is resident yet") != NULL);
    unsigned char vec[64];
    VHD_CHECK(mincore(dev.mem->regions[0].hva, len, vec) == 0);
    for (int i = 0; i < 64; i++)
        VHD_CHECK_EQ(vec[i] & 1, 0);

    /* Touched (through another mapping of the file, as a front-end would). */
    uint8_t *fe = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    VHD_CHECK(fe != MAP_FAILED);
    memset(fe, 1, len);
    VHD_CHECK_EQ(report_captured(&dev, q, 3, false, log, sizeof(log)), 16u);
    snprintf(want, sizeof(want), "g0: guest memory on NUMA node %d (16 of 16 sampled pages)", here);
    VHD_CHECK(strstr(log, want) != NULL);
    /* Worker 1 (queues 1 and 2) is pinned on another node: one warning; floating worker 0 none. */
    snprintf(want, sizeof(want),
             "g0: queues run on worker 1 (CPU 5, NUMA node %d) but guest memory is on node %d",
             here + 1, here);
    char *w = strstr(log, want);
    VHD_CHECK(w != NULL);
    VHD_CHECK(strstr(w + strlen(want), "but guest memory is on node") == NULL);
    VHD_CHECK(strstr(log, "worker 0 (") == NULL);

    /* Every worker on the memory's node: no warning. */
    q[1].node = q[2].node = here;
    report_captured(&dev, q, 3, false, log, sizeof(log));
    VHD_CHECK(strstr(log, "crosses nodes") == NULL);
    munmap(fe, len);
    vhd_mem_free(dev.mem);
    close(fd);
}

/* ---- the daemon ---- */

static void start(struct daemon *dm, const char *const *extra)
{
    const char *bin = vhostd_path();
    char spec[300];
    char *argv[16];
    int n = 0;

    if (!bin)
        vhd_test_skip("vhostd binary not found (set VHD_VHOSTD or build build/vhostd)");
    daemon_prepare_dir(dm, "vhd-test-pl-XXXXXX", "d.sock");
    track(dm);
    snprintf(spec, sizeof(spec), "socket=%s,backend=null,size=1M,queues=2", dm->sock);
    argv[n++] = (char *)bin;
    for (; *extra && n < 12; extra++)
        argv[n++] = (char *)*extra;
    argv[n++] = "--blk";
    argv[n++] = spec;
    argv[n] = NULL;
    daemon_spawn(dm, argv);
}

static void wait_log(const struct daemon *dm, const char *needle)
{
    uint64_t t0 = ms_now();
    while (!daemon_log_has(dm, needle)) {
        if (ms_now() - t0 > WAIT_MS) {
            fprintf(stderr, "  '%s' not in the log\n", needle);
            VHD_CHECK(!"log line");
        }
        sleep_ms(10);
    }
}

VHD_TEST(daemon_pins_workers)
{
    static struct daemon dm;
    int a = allowed_cpu(0), b = allowed_cpu(1);
    if (b < 0)
        vhd_test_skip("needs two CPUs");
    char list[32];
    snprintf(list, sizeof(list), "%d,%d", b, a);
    /* No --workers: one worker per listed CPU. */
    const char *extra[] = {"--cpus", list, NULL};
    start(&dm, extra);
    check_pinned(dm.pid, 0, b);
    check_pinned(dm.pid, 1, a);
    char none[64];
    VHD_CHECK(!worker_cpus(dm.pid, 2, none, sizeof(none)));
    char line[64];
    snprintf(line, sizeof(line), "worker 0: pinned to CPU %d (NUMA node ", b);
    wait_log(&dm, line);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    g_test_ok = true;
    test_done();
}

/* The daemon with args: it must exit at once with status 2 and msg in its output. */
static void refused(const char *cpus, const char *msg)
{
    static struct daemon dm;
    const char *bin = vhostd_path();
    if (!bin)
        vhd_test_skip("vhostd binary not found");
    daemon_prepare_dir(&dm, "vhd-test-pl-XXXXXX", "d.sock");
    char spec[300];
    snprintf(spec, sizeof(spec), "socket=%s,backend=null,size=1M", dm.sock);
    fflush(NULL);
    pid_t pid = fork();
    VHD_CHECK(pid >= 0);
    if (pid == 0) {
        FILE *f = freopen(dm.log, "w", stderr);
        (void)f;
        execl(bin, bin, "--cpus", cpus, "--blk", spec, (char *)NULL);
        _exit(127);
    }
    int status;
    VHD_CHECK(waitpid(pid, &status, 0) == pid);
    bool ok = WIFEXITED(status) && WEXITSTATUS(status) != 0 && daemon_log_has(&dm, msg);
    if (!ok) {
        fprintf(stderr, "  --cpus %s: status 0x%x, expected '%s' in:\n", cpus, status, msg);
        dump_log(&dm);
    }
    daemon_cleanup_files(&dm);
    VHD_CHECK(ok);
}

VHD_TEST(daemon_refuses_bad_cpu_lists)
{
    refused("0,0", "--cpus 0,0: a CPU is listed twice");
    refused("1-0", "--cpus 1-0: expected a CPU list like 0,2-5");
    refused("x", "--cpus x: expected a CPU list");
    refused("", "--cpus : expected a CPU list");
    refused("2000", "--cpus 2000: CPU numbers go up to 1023");
    refused("0-64", "--cpus 0-64: more than 64 CPUs");
    /* Well formed, but not a CPU of this process. */
    cpu_set_t set;
    VHD_CHECK(sched_getaffinity(0, sizeof(set), &set) == 0);
    int missing = 0;
    while (CPU_ISSET(missing, &set))
        missing++;
    char list[16], msg[96];
    snprintf(list, sizeof(list), "%d", missing);
    snprintf(msg, sizeof(msg), "CPU list: CPU %d does not exist or this process may not run on it",
             missing);
    refused(list, msg);
}

/* --spin-us reaches the context: the start-up line says what the workers were given. */
VHD_TEST(daemon_spin_option)
{
    static struct daemon dm;
    const char *extra[] = {"--poll", "never", "--spin-us", "0", "--workers", "1", NULL};
    start(&dm, extra);
    wait_log(&dm, "polling never, spin 0 us");
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    const char *dflt[] = {"--poll-us", "0", "--workers", "1", NULL};
    start(&dm, dflt);
    /* --poll-us 0 is event mode with the spin: the default, automatic */
    wait_log(&dm, "polling never, spin auto (one wake-up)");
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    const char *fixed[] = {"--poll", "never", "--spin-us", "10", "--workers", "1", NULL};
    start(&dm, fixed);
    wait_log(&dm, "polling never, spin 10 us");
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    g_test_ok = true;
    test_done();
}

/* The same options from a config file: `cpus LIST` and `spin-us N`, and a bad list refused. */
VHD_TEST(daemon_config_file_keys)
{
    static struct daemon dm;
    int a = allowed_cpu(0), b = allowed_cpu(1);
    if (b < 0)
        vhd_test_skip("needs two CPUs");
    char cfg[] = "/tmp/vhd-test-pl-cfg-XXXXXX";
    int fd = mkstemp(cfg);
    VHD_CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    VHD_CHECK(f != NULL);
    fprintf(f, "# placement\ncpus %d,%d\npoll never\nspin-us 7\n", b, a);
    fclose(f);
    const char *extra[] = {"--config", cfg, NULL};
    start(&dm, extra);
    check_pinned(dm.pid, 0, b);
    check_pinned(dm.pid, 1, a);
    wait_log(&dm, "2 worker(s), polling never, spin 7 us");
    VHD_CHECK_EQ(daemon_stop(&dm), 0);

    f = fopen(cfg, "w");
    VHD_CHECK(f != NULL);
    fprintf(f, "cpus 1-\n");
    fclose(f);
    const char *bin = vhostd_path();
    char cmd[PATH_MAX + 128];
    snprintf(cmd, sizeof(cmd),
             "%s --config %s --blk socket=/tmp/vhd-pl-none.sock,backend=null 2>&1", bin, cfg);
    FILE *p = popen(cmd, "r");
    VHD_CHECK(p != NULL);
    char out[512] = "";
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    unlink(cfg);
    if (!strstr(out, ":1: --cpus 1-: expected a CPU list"))
        fprintf(stderr, "  output: %s", out);
    VHD_CHECK(strstr(out, ":1: --cpus 1-: expected a CPU list") != NULL);
    VHD_CHECK(WIFEXITED(st) && WEXITSTATUS(st) != 0);
    g_test_ok = true;
    test_done();
}

/*
 * A front-end's memory table: the daemon says which node it is on (node 0 on
 * one node); and the pinned worker that takes each queue moves the queue's
 * state to its node.
 */
VHD_TEST(daemon_reports_guest_memory_node)
{
    static struct daemon dm;
    int a = allowed_cpu(0);
    char list[16];
    snprintf(list, sizeof(list), "%d", a);
    const char *extra[] = {"--cpus", list, "--log-level", "debug", NULL};
    start(&dm, extra);
    struct vhd_blkdrv_opts o = {.socket_path = dm.sock, .num_queues = 2};
    struct vhd_blkdrv *d;
    char err[256];
    int rc = vhd_blkdrv_connect(&o, &d, err, sizeof(err));
    if (rc < 0)
        fprintf(stderr, "  connect: %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    int node = -1;
    FILE *f = fopen("/sys/devices/system/node/online", "r");
    if (f) {
        char buf[32] = "";
        if (fgets(buf, sizeof(buf), f) && !strcmp(buf, "0\n"))
            node = 0; /* a one-node host: the memory can only be there */
        fclose(f);
    }
    if (node == 0)
        wait_log(&dm, "d.sock: guest memory on NUMA node 0 (");
    else
        wait_log(&dm, "d.sock: guest memory on NUMA node");
    /* One node: the workers are on it too, so no warning. */
    if (node == 0)
        VHD_CHECK(!daemon_log_has(&dm, "every request crosses nodes"));
    /* Both queues went to worker 0, pinned: their state followed it. */
    wait_log(&dm, "d.sock: queue 0: state moved to worker 0's NUMA node ");
    wait_log(&dm, "d.sock: queue 1: state moved to worker 0's NUMA node ");
    vhd_blkdrv_disconnect(d);
    VHD_CHECK_EQ(daemon_stop(&dm), 0);
    g_test_ok = true;
    test_done();
}
