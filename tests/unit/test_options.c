/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * vhostd's option parsing: sizes, --blk keys and their defaults, every
 * rejected value with its one-line message, config files.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../daemon/options.h"
#include "harness.h"

static int parse(struct vhd_options *o, char *err, const char *a1, const char *a2, const char *a3,
                 const char *a4)
{
    char *argv[6] = {"vhostd", (char *)a1, (char *)a2, (char *)a3, (char *)a4, NULL};
    int argc = 1;
    while (argc < 5 && argv[argc])
        argc++;
    return vhd_options_parse(o, argc, argv, err, 256);
}

VHD_TEST(sizes)
{
    uint64_t v;
    VHD_CHECK(vhd_parse_size("512", &v) == 0 && v == 512);
    VHD_CHECK(vhd_parse_size("4K", &v) == 0 && v == 4096);
    VHD_CHECK(vhd_parse_size("8G", &v) == 0 && v == 8ull << 30);
    VHD_CHECK(vhd_parse_size("1TiB", &v) == 0 && v == 1ull << 40);
    VHD_CHECK(vhd_parse_size("10MB", &v) == 0 && v == 10ull << 20);
    VHD_CHECK(vhd_parse_size("4k", &v) == 0 && v == 4096);
    VHD_CHECK(vhd_parse_size("4KIB", &v) == 0 && v == 4096);
    VHD_CHECK(vhd_parse_size("4kib", &v) == 0 && v == 4096);
    VHD_CHECK(vhd_parse_size("2mb", &v) == 0 && v == 2ull << 20);
    VHD_CHECK(vhd_parse_size("0x1000", &v) == 0 && v == 4096);
    VHD_CHECK(vhd_parse_size("0X10k", &v) == 0 && v == 16ull << 10);
    VHD_CHECK(vhd_parse_size("012", &v) == 0 && v == 12); /* decimal, not octal */
    VHD_CHECK(vhd_parse_size("0x", &v) < 0);
    VHD_CHECK(vhd_parse_size("4KBi", &v) < 0);
    VHD_CHECK(vhd_parse_size("", &v) < 0);
    VHD_CHECK(vhd_parse_size("-1", &v) < 0);
    VHD_CHECK(vhd_parse_size("12X", &v) < 0);
    VHD_CHECK(vhd_parse_size("99999999999999999999", &v) < 0);
    VHD_CHECK(vhd_parse_size("20000000T", &v) < 0); /* overflows 64 bits */
}

VHD_TEST(blk_defaults_and_keys)
{
    struct vhd_options o;
    char err[256] = "";
    VHD_CHECK_EQ(parse(&o, err, "--workers", "2",
                       "--blk=socket=/run/vm1.sock,image=vm1.img,queues=4,serial=vm1-disk",
                       "--blk=socket=/run/vm2.sock,backend=null,size=8G,ro=on,workers=0,1"),
                 0);
    VHD_CHECK_EQ(o.workers, 2);
    VHD_CHECK_EQ(o.nblk, 2);
    VHD_CHECK(!strcmp(o.blk[0].socket, "/run/vm1.sock"));
    VHD_CHECK(!strcmp(o.blk[0].image, "vm1.img"));
    VHD_CHECK(!strcmp(o.blk[0].backend, "uring"));
    VHD_CHECK(!strcmp(o.blk[0].name, "vm1.sock"));
    VHD_CHECK(!strcmp(o.blk[0].serial, "vm1-disk"));
    VHD_CHECK_EQ(o.blk[0].queues, 4);
    VHD_CHECK_EQ(o.blk[0].block_size, 512);
    VHD_CHECK(!o.blk[0].ro && o.blk[0].allow_split && o.blk[0].allow_packed);
    VHD_CHECK(!strcmp(o.blk[1].backend, "null"));
    VHD_CHECK_EQ(o.blk[1].size, 8ull << 30);
    VHD_CHECK(o.blk[1].ro);
    VHD_CHECK_EQ(o.blk[1].nworkers, 2);
    VHD_CHECK(o.blk[1].workers[0] == 0 && o.blk[1].workers[1] == 1);
    vhd_options_free(&o);
}

/* backend=nbd takes uri=; TLS URIs only without the sandbox (workers read certificates). */
VHD_TEST(blk_nbd_keys)
{
    struct vhd_options o;
    char err[256] = "";
    VHD_CHECK_EQ(parse(&o, err, "--blk=socket=/run/n.sock,backend=nbd,uri=nbd+unix:///?socket=/x",
                       "--blk=socket=/run/t.sock,backend=nbd,uri=nbds://h/e", "--sandbox", "off"),
                 0);
    VHD_CHECK_EQ(o.nblk, 2);
    VHD_CHECK(!strcmp(o.blk[0].backend, "nbd"));
    VHD_CHECK(!strcmp(o.blk[0].uri, "nbd+unix:///?socket=/x"));
    VHD_CHECK(o.blk[0].image == NULL);
    VHD_CHECK(!strcmp(o.blk[1].uri, "nbds://h/e"));
    vhd_options_free(&o);
}

VHD_TEST(blk_rbd_keys)
{
    struct vhd_options o;
    char err[256] = "";
    VHD_CHECK_EQ(parse(&o, err, "--sandbox", "off",
                       "--blk=socket=/run/vm1.sock,backend=rbd,pool=vms,image=vm1,"
                       "conf=/etc/ceph/c.conf,user=vhostd,snap=base",
                       NULL),
                 0);
    VHD_CHECK(!strcmp(o.blk[0].backend, "rbd"));
    VHD_CHECK(!strcmp(o.blk[0].pool, "vms"));
    VHD_CHECK(!strcmp(o.blk[0].image, "vm1"));
    VHD_CHECK(!strcmp(o.blk[0].conf, "/etc/ceph/c.conf"));
    VHD_CHECK(!strcmp(o.blk[0].user, "vhostd"));
    VHD_CHECK(!strcmp(o.blk[0].snap, "base"));
    vhd_options_free(&o);
    /* The sandbox check sees --sandbox wherever it stands on the line. */
    VHD_CHECK_EQ(parse(&o, err, "--blk=socket=/run/vm1.sock,backend=rbd,pool=vms,image=vm1",
                       "--sandbox", "off", NULL),
                 0);
    VHD_CHECK(o.blk[0].conf == NULL && o.blk[0].user == NULL && o.blk[0].snap == NULL);
    vhd_options_free(&o);
}

/* Each bad command line fails with a message naming the problem. */
VHD_TEST(blk_rejects)
{
    static const struct {
        const char *spec, *msg;
    } cases[] = {
        {"image=a.img", "socket=PATH is required"},
        {"socket=s", "image=PATH is required"},
        {"socket=s,backend=null", "needs size="},
        {"socket=s,backend=ceph,image=x", "expected uring, null, nbd or rbd"},
        {"socket=s,backend=nbd", "uri=URI goes with backend=nbd"},
        {"socket=s,image=x,uri=nbd://h/", "uri=URI goes with backend=nbd"},
        {"socket=s,backend=nbd,uri=nbd://h/,image=x", "takes uri=, not image="},
        {"socket=s,image=x,lost-writes=report", "lost-writes= goes with backend=nbd"},
        {"socket=s,backend=nbd,uri=nbd://h/,lost-writes=maybe", "expected report or ignore"},
        {"socket=s,backend=nbd,uri=nbds://h/", "needs --sandbox off"},
        {"socket=s,image=x,pool=p", "go with backend=rbd"},
        {"socket=s,image=x,snap=s1", "go with backend=rbd"},
        {"socket=s,backend=rbd,image=x", "backend=rbd needs pool=NAME and image=NAME"},
        {"socket=s,backend=rbd,pool=p", "backend=rbd needs pool=NAME and image=NAME"},
        {"socket=s,backend=rbd,pool=p,image=x", "backend=rbd needs --sandbox off"},
        {"socket=s,image=x,queues=0", "queues=0"},
        {"socket=s,image=x,queues=65", "queues=65"},
        {"socket=s,image=x,block-size=1000", "power of two"},
        {"socket=s,image=x,block-size=8192", "power of two"},
        {"socket=s,image=x,ro=maybe", "expected on or off"},
        {"socket=s,image=x,serial=123456789012345678901", "at most 20"},
        {"socket=s,image=x,colour=blue", "unknown key 'colour'"},
        {"socket=s,image=x,rings=ring", "expected split, packed or both"},
        {"socket=s,image=x,workers=a", "workers=a"},
        {"socket=s,image=x,size=1000", "multiple of block-size"},
        {"socket=s,image", "not KEY=VALUE"},
        {"socket=s,image=", "needs a value"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct vhd_options o;
        char err[256] = "";
        char arg[256];
        snprintf(arg, sizeof(arg), "--blk=%s", cases[i].spec);
        int rc = parse(&o, err, arg, NULL, NULL, NULL);
        if (rc == 0 || !strstr(err, cases[i].msg)) {
            fprintf(stderr, "  case %s: rc %d, message '%s'\n", cases[i].spec, rc, err);
            VHD_CHECK(0);
        }
        vhd_options_free(&o);
    }
}

/*
 * Every device key's error path, word for word: one table serves --blk and
 * --net, so each kind's messages (bad value, unknown key, a key only the other
 * kind takes, the checks after the keys) are pinned here.
 */
VHD_TEST(device_key_messages)
{
    static const struct {
        const char *arg, *msg;
    } cases[] = {
        {"--blk=image=a.img", "--blk: socket=PATH is required"},
        {"--blk=socket=s", "--blk: image=PATH is required (or backend=null,size=...)"},
        {"--blk=socket=s,backend=null", "--blk: backend=null needs size="},
        {"--blk=socket=s,backend=null,size=1M,image=x", "--blk: backend=null takes no image="},
        {"--blk=socket=s,backend=ceph,image=x",
         "--blk: backend=ceph: expected uring, null, nbd or rbd"},
        {"--blk=socket=s,backend=nbd", "--blk: uri=URI goes with backend=nbd, and only with it"},
        {"--blk=socket=s,backend=nbd,uri=u,image=x", "--blk: backend=nbd takes uri=, not image="},
        {"--blk=socket=s,image=x,size=0", "--blk: size=0: expected a size like 512M or 8G"},
        {"--blk=socket=s,image=x,size=12Q", "--blk: size=12Q: expected a size like 512M or 8G"},
        {"--blk=socket=s,image=x,queues=0", "--blk: queues=0: expected 1..64"},
        {"--blk=socket=s,image=x,queues=65", "--blk: queues=65: expected 1..64"},
        {"--blk=socket=s,image=x,queues=-1", "--blk: queues=-1: expected 1..64"},
        {"--blk=socket=s,image=x,block-size=1000",
         "--blk: block-size=1000: expected a power of two in 512..4096"},
        {"--blk=socket=s,image=x,block_size=8192",
         "--blk: block-size=8192: expected a power of two in 512..4096"},
        {"--blk=socket=s,image=x,block-size=256",
         "--blk: block-size=256: expected a power of two in 512..4096"},
        {"--blk=socket=s,image=x,ro=maybe", "--blk: ro=maybe: expected on or off"},
        {"--blk=socket=s,image=x,direct=2", "--blk: direct=2: expected on or off"},
        {"--blk=socket=s,image=x,locking=yes", "--blk: locking=yes: expected auto, on or off"},
        {"--blk=socket=s,image=x,werror=ignore",
         "--blk: werror=ignore: expected report, stop or enospc"},
        {"--blk=socket=s,image=x,rerror=enospc", "--blk: rerror=enospc: expected report or stop"},
        {"--net=socket=s,werror=stop", "--net: unknown key 'werror' (only --blk takes it)"},
        {"--blk=socket=s,image=x,serial=123456789012345678901",
         "--blk: serial=123456789012345678901: at most 20 characters"},
        {"--blk=socket=s,image=x,colour=blue", "--blk: unknown key 'colour'"},
        {"--blk=socket=s,image=x,mac=52:54:00:12:34:56",
         "--blk: unknown key 'mac' (only --net takes it)"},
        {"--blk=socket=s,image=x,mtu=1500", "--blk: unknown key 'mtu' (only --net takes it)"},
        {"--blk=socket=s,image=x,tap=t0", "--blk: unknown key 'tap' (only --net takes it)"},
        {"--blk=socket=s,image=x,switch=s0", "--blk: unknown key 'switch' (only --net takes it)"},
        {"--blk=socket=s,image=x,rings=ring", "--blk: rings=ring: expected split, packed or both"},
        {"--blk=socket=s,image=x,workers=a", "--blk: workers=a: expected a list like 0,1 or 0-3"},
        {"--blk=socket=s,image=x,workers=0,1,x",
         "--blk: workers=0: expected a list like 0,1 or 0-3"},
        {"--blk=socket=s,image=x,workers=3-1", "--blk: workers=3: expected a list like 0,1 or 0-3"},
        {"--blk=socket=s,image=x,size=1000", "--blk: size is not a multiple of block-size 512"},
        {"--blk=socket=s,image", "--blk: 'image' is not KEY=VALUE"},
        {"--blk=socket=s,image=", "--blk: image= needs a value"},
        {"--blk=socket=s,image=x,=3", "--blk: unknown key ''"},
        {"--blk=socket=s,image=x,client=maybe", "--blk: client=maybe: expected on or off"},
        {"--blk=socket=s,image=x,client=on,reconnect_max=5",
         "--blk: reconnect-max=5: expected 10..3600000 milliseconds"},
        {"--blk=socket=s,image=x,client=on,reconnect-max=3600001",
         "--blk: reconnect-max=3600001: expected 10..3600000 milliseconds"},
        {"--blk=socket=s,image=x,reconnect-max=100", "--blk: reconnect-max= goes with client=on"},
        {"--blk=socket=s,image=x,name=", "--blk: name= needs a value"},
        {"--net=queues=2", "--net: socket=PATH is required"},
        {"--net=socket=s,backend=tap", "--net: tap=IFNAME goes with backend=tap, and only with it"},
        {"--net=socket=s,backend=switch",
         "--net: switch=NAME goes with backend=switch, and only with it"},
        {"--net=socket=s,switch=sw0",
         "--net: switch=NAME goes with backend=switch, and only with it"},
        {"--net=socket=s,backend=loopback,tap=t0",
         "--net: tap=IFNAME goes with backend=tap, and only with it"},
        {"--net=socket=s,backend=switch,switch=0123456789abcdef0123456789abcdef",
         "--net: switch=0123456789abcdef0123456789abcdef: name longer than 31 bytes"},
        {"--net=socket=s,backend=tap,tap=0123456789abcdef",
         "--net: tap=0123456789abcdef: interface name longer than 15 bytes"},
        {"--net=socket=s,backend=bogus",
         "--net: backend=bogus: expected loopback, switch, tap or gen"},
        {"--net=socket=s,backend=uring",
         "--net: backend=uring: expected loopback, switch, tap or gen"},
        {"--net=socket=s,queues=0", "--net: queues=0: expected 1..64 queue pairs"},
        {"--net=socket=s,queues=65", "--net: queues=65: expected 1..64 queue pairs"},
        {"--net=socket=s,mtu=67", "--net: mtu=67: expected 68..65535"},
        {"--net=socket=s,mtu=65536", "--net: mtu=65536: expected 68..65535"},
        {"--net=socket=s,mtu=x", "--net: mtu=x: expected 68..65535"},
        {"--net=socket=s,mac=01:00:5e:00:00:01",
         "--net: mac=01:00:5e:00:00:01: expected a unicast address like 52:54:00:12:34:56"},
        {"--net=socket=s,mac=52:54:00",
         "--net: mac=52:54:00: expected a unicast address like 52:54:00:12:34:56"},
        {"--net=socket=s,rings=ring", "--net: rings=ring: expected split, packed or both"},
        {"--net=socket=s,workers=x", "--net: workers=x: expected a list like 0,1 or 0-3"},
        {"--net=socket=s,workers=0,1-x", "--net: workers=0: expected a list like 0,1 or 0-3"},
        {"--net=socket=s,image=x", "--net: unknown key 'image' (only --blk takes it)"},
        {"--net=socket=s,size=1M", "--net: unknown key 'size' (only --blk takes it)"},
        {"--net=socket=s,ro=on", "--net: unknown key 'ro' (only --blk takes it)"},
        {"--net=socket=s,serial=a", "--net: unknown key 'serial' (only --blk takes it)"},
        {"--net=socket=s,block-size=512", "--net: unknown key 'block-size' (only --blk takes it)"},
        {"--net=socket=s,direct=on", "--net: unknown key 'direct' (only --blk takes it)"},
        {"--net=socket=s,colour=blue", "--net: unknown key 'colour'"},
        {"--net=socket=s,mtu", "--net: 'mtu' is not KEY=VALUE"},
        {"--net=socket=s,mtu=", "--net: mtu= needs a value"},
        {"--net=socket=s,client=yess", "--net: client=yess: expected on or off"},
        {"--net=socket=s,client=on,reconnect-max=9",
         "--net: reconnect-max=9: expected 10..3600000 milliseconds"},
        {"--net=socket=s,reconnect_max=100", "--net: reconnect-max= goes with client=on"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct vhd_options o;
        char err[256] = "";
        int rc = parse(&o, err, cases[i].arg, NULL, NULL, NULL);
        if (rc == 0 || strcmp(err, cases[i].msg)) {
            fprintf(stderr, "  %s: rc %d, message '%s'\n", cases[i].arg, rc, err);
            VHD_CHECK(0);
        }
        vhd_options_free(&o);
    }
    /* A worker list longer than the parser keeps. */
    char arg[400];
    struct vhd_options o;
    char err[256] = "";
    snprintf(arg, sizeof(arg), "--blk=socket=s,image=x,workers=%0300d", 1);
    VHD_CHECK(parse(&o, err, arg, NULL, NULL, NULL) < 0);
    VHD_CHECK(!strcmp(err, "--blk: workers=: list too long"));
    vhd_options_free(&o);
}

/* The spellings and keys the other tests do not set: aliases, direct=, rings=split. */
VHD_TEST(device_key_spellings)
{
    struct vhd_options o;
    char err[256] = "";
    int rc = parse(&o, err,
                   "--blk=socket=s,backend=null,size=8G,direct=yes,block_size=4096,rings=split,"
                   "client=on,reconnect_max=77,locking=off,werror=stop,rerror=stop",
                   "--net=socket=/x/n.sock,backend=gen,reconnect_max=10,client=1", NULL, NULL);
    if (rc)
        fprintf(stderr, "  %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK(o.blk[0].direct && !o.blk[0].ro);
    VHD_CHECK_EQ(o.blk[0].block_size, 4096);
    VHD_CHECK(o.blk[0].allow_split && !o.blk[0].allow_packed);
    VHD_CHECK(o.blk[0].client);
    VHD_CHECK_EQ(o.blk[0].reconnect_max_ms, 77);
    VHD_CHECK(!strcmp(o.blk[0].locking, "off"));
    VHD_CHECK(!strcmp(o.blk[0].werror, "stop"));
    VHD_CHECK(!strcmp(o.blk[0].rerror, "stop"));
    VHD_CHECK(!strcmp(o.net[0].backend, "gen"));
    VHD_CHECK(!strcmp(o.net[0].name, "n.sock"));
    VHD_CHECK(o.net[0].client);
    VHD_CHECK_EQ(o.net[0].reconnect_max_ms, 10);
    VHD_CHECK(!o.net[0].mac_set);
    vhd_options_free(&o);
}

VHD_TEST(global_rejects)
{
    struct vhd_options o;
    char err[256];
    VHD_CHECK(parse(&o, err, "--workers", "0", "--blk=socket=s,image=i", NULL) < 0);
    VHD_CHECK(strstr(err, "--workers 0"));
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--frobnicate", "1", NULL, NULL) < 0);
    VHD_CHECK(strstr(err, "unknown option --frobnicate"));
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, NULL, NULL, NULL, NULL) < 0);
    VHD_CHECK(strstr(err, "no device"));
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--blk=socket=s,image=a", "--blk=socket=s,image=b", NULL, NULL) < 0);
    VHD_CHECK(strstr(err, "given twice"));
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--workers", "2", "--blk=socket=s,image=a,workers=3", NULL) < 0);
    VHD_CHECK(strstr(err, "worker 3 does not exist"));
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--poll", "sometimes", "--blk=socket=s,image=a", NULL) < 0);
    VHD_CHECK(strstr(err, "adaptive, always or never"));
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--spin-us", "soon", "--blk=socket=s,image=a", NULL) < 0);
    VHD_CHECK(strstr(err, "expected 0..1000000 or auto"));
    vhd_options_free(&o);
    VHD_CHECK_EQ(parse(&o, err, "--blk=socket=s,image=a", NULL, NULL, NULL), 0);
    VHD_CHECK_EQ(o.spin_us, VHD_CTX_SPIN_AUTO); /* the default */
    vhd_options_free(&o);
    VHD_CHECK_EQ(parse(&o, err, "--spin-us", "25", "--blk=socket=s,image=a", NULL), 0);
    VHD_CHECK_EQ(o.spin_us, 25u);
    vhd_options_free(&o);
    VHD_CHECK_EQ(parse(&o, err, "--spin-us=0", "--spin-us=auto", "--blk=socket=s,image=a", NULL),
                 0);
    VHD_CHECK_EQ(o.spin_us, VHD_CTX_SPIN_AUTO);
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--workers", NULL, NULL, NULL) < 0);
    VHD_CHECK(strstr(err, "needs a value"));
    vhd_options_free(&o);
    VHD_CHECK_EQ(parse(&o, err, "--help", NULL, NULL, NULL), 0);
    VHD_CHECK(o.help);
    vhd_options_free(&o);
}

VHD_TEST(config_file)
{
    char path[] = "/tmp/vhostd-conf-XXXXXX";
    int fd = mkstemp(path);
    VHD_CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "# two disks\nworkers 3\npoll-us = 20\n\n"
               "blk socket=/tmp/a.sock,backend=null,size=1G   # null disk\n"
               "log-level debug\n");
    fclose(f);
    struct vhd_options o;
    char err[256] = "";
    int rc = parse(&o, err, "--config", path, "--blk=socket=/tmp/b.sock,image=b.img", NULL);
    if (rc)
        fprintf(stderr, "  %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK_EQ(o.workers, 3);
    VHD_CHECK_EQ(o.poll_us, 20);
    VHD_CHECK_EQ(o.log_level, 3);
    VHD_CHECK_EQ(o.nblk, 2);
    VHD_CHECK_EQ(o.blk[0].size, 1ull << 30);
    vhd_options_free(&o);

    f = fopen(path, "w");
    fprintf(f, "workers 2\nbogus 1\n");
    fclose(f);
    VHD_CHECK(parse(&o, err, "--config", path, NULL, NULL) < 0);
    VHD_CHECK(strstr(err, ":2: unknown option --bogus"));
    vhd_options_free(&o);
    unlink(path);
    VHD_CHECK(parse(&o, err, "--config", path, NULL, NULL) < 0);
    VHD_CHECK(strstr(err, "No such file"));
    vhd_options_free(&o);
}

/* ---- net: --net keys, defaults, rejects, config-file lines ---- */

VHD_TEST(net_switch_and_tap_keys)
{
    struct vhd_options o;
    char err[256] = "";
    int rc = parse(&o, err, "--net=socket=/run/a.sock,backend=switch,switch=sw0",
                   "--net=socket=/run/b.sock,backend=tap,tap=vhd0,queues=2", NULL, NULL);
    if (rc)
        fprintf(stderr, "  %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK_EQ(o.nnet, 2);
    VHD_CHECK(!strcmp(o.net[0].backend, "switch"));
    VHD_CHECK(!strcmp(o.net[0].switch_name, "sw0"));
    VHD_CHECK(o.net[0].tap_name == NULL);
    VHD_CHECK(!strcmp(o.net[1].backend, "tap"));
    VHD_CHECK(!strcmp(o.net[1].tap_name, "vhd0"));
    VHD_CHECK(o.net[1].switch_name == NULL);
    VHD_CHECK_EQ(o.net[1].queues, 2);
    vhd_options_free(&o);
}

VHD_TEST(net_defaults_and_keys)
{
    struct vhd_options o;
    char err[256] = "";
    int rc = parse(&o, err, "--net=socket=/run/n1.sock",
                   "--net=socket=/run/n2.sock,backend=loopback,queues=16,mac=52:54:00:ab:cd:ef,"
                   "mtu=9000,rings=packed,workers=0,2-3,name=net2",
                   "--blk=socket=/run/d.sock,backend=null,size=1G", NULL);
    if (rc)
        fprintf(stderr, "  %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK_EQ(o.nnet, 2);
    VHD_CHECK_EQ(o.nblk, 1);
    VHD_CHECK(!strcmp(o.net[0].socket, "/run/n1.sock"));
    VHD_CHECK(!strcmp(o.net[0].name, "n1.sock"));
    VHD_CHECK(!strcmp(o.net[0].backend, "loopback"));
    VHD_CHECK_EQ(o.net[0].queues, 1);
    VHD_CHECK_EQ(o.net[0].mtu, 1500);
    VHD_CHECK(!o.net[0].mac_set);
    VHD_CHECK(o.net[0].allow_split && o.net[0].allow_packed);
    VHD_CHECK_EQ(o.net[0].nworkers, 0);
    VHD_CHECK(!strcmp(o.net[1].name, "net2"));
    VHD_CHECK_EQ(o.net[1].queues, 16);
    VHD_CHECK_EQ(o.net[1].mtu, 9000);
    VHD_CHECK(o.net[1].mac_set);
    static const uint8_t mac[6] = {0x52, 0x54, 0x00, 0xab, 0xcd, 0xef};
    VHD_CHECK(memcmp(o.net[1].mac, mac, 6) == 0);
    VHD_CHECK(!o.net[1].allow_split && o.net[1].allow_packed);
    VHD_CHECK_EQ(o.net[1].nworkers, 3);
    VHD_CHECK(o.net[1].workers[0] == 0 && o.net[1].workers[1] == 2 && o.net[1].workers[2] == 3);
    vhd_options_free(&o);

    uint8_t m[6];
    VHD_CHECK_EQ(vhd_parse_mac("02:00:00:00:00:01", m), 0);
    VHD_CHECK_EQ(m[0], 2);
    VHD_CHECK_EQ(m[5], 1);
    VHD_CHECK(vhd_parse_mac("02:00:00:00:00", m) < 0);
    VHD_CHECK(vhd_parse_mac("02:00:00:00:00:01:02", m) < 0);
    VHD_CHECK(vhd_parse_mac("02-00-00-00-00-01", m) < 0);
    VHD_CHECK(vhd_parse_mac("0g:00:00:00:00:01", m) < 0);
    VHD_CHECK(vhd_parse_mac("01:00:5e:00:00:01", m) < 0); /* multicast */
    VHD_CHECK(vhd_parse_mac("00:00:00:00:00:00", m) < 0);
}

VHD_TEST(net_rejects)
{
    static const struct {
        const char *spec, *msg;
    } cases[] = {
        {"queues=2", "socket=PATH is required"},
        {"socket=s,backend=tap", "tap=IFNAME goes with backend=tap"},
        {"socket=s,backend=switch", "switch=NAME goes with backend=switch"},
        {"socket=s,switch=sw0", "switch=NAME goes with backend=switch"},
        {"socket=s,backend=loopback,tap=t0", "tap=IFNAME goes with backend=tap"},
        {"socket=s,backend=switch,switch=0123456789abcdef0123456789abcdef", "longer than 31"},
        {"socket=s,backend=tap,tap=0123456789abcdef", "longer than 15"},
        {"socket=s,backend=bogus", "expected loopback, switch, tap or gen"},
        {"socket=s,backend=pcap", "expected loopback"},
        {"socket=s,queues=0", "queues=0"},
        {"socket=s,queues=65", "queues=65"},
        {"socket=s,mtu=67", "expected 68..65535"},
        {"socket=s,mtu=65536", "expected 68..65535"},
        {"socket=s,mac=01:00:5e:00:00:01", "unicast address"},
        {"socket=s,mac=52:54:00", "mac=52:54:00"},
        {"socket=s,rings=ring", "expected split, packed or both"},
        {"socket=s,workers=x", "workers=x"},
        {"socket=s,image=x", "unknown key 'image'"},
        {"socket=s,mtu", "not KEY=VALUE"},
        {"socket=s,mtu=", "needs a value"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct vhd_options o;
        char err[256] = "";
        char arg[256];
        snprintf(arg, sizeof(arg), "--net=%s", cases[i].spec);
        int rc = parse(&o, err, arg, NULL, NULL, NULL);
        if (rc == 0 || !strstr(err, cases[i].msg) || !strstr(err, "--net")) {
            fprintf(stderr, "  case %s: rc %d, message '%s'\n", cases[i].spec, rc, err);
            VHD_CHECK(0);
        }
        vhd_options_free(&o);
    }
    struct vhd_options o;
    char err[256];
    /* one socket for two devices, across --blk and --net too */
    VHD_CHECK(parse(&o, err, "--net=socket=s", "--net=socket=s", NULL, NULL) < 0);
    VHD_CHECK(strstr(err, "given twice"));
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--blk=socket=s,image=a", "--net=socket=s", NULL, NULL) < 0);
    VHD_CHECK(strstr(err, "given twice"));
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--workers", "2", "--net=socket=s,workers=2", NULL) < 0);
    VHD_CHECK(strstr(err, "worker 2 does not exist"));
    vhd_options_free(&o);
    /* the device limit counts --blk and --net together */
    char *argv[VHD_OPT_MAX_DEVICES + 3];
    static char specs[VHD_OPT_MAX_DEVICES + 1][64];
    argv[0] = "vhostd";
    for (int i = 0; i <= VHD_OPT_MAX_DEVICES; i++) {
        snprintf(specs[i], sizeof(specs[i]), "--%s=socket=/tmp/s%d%s", i % 2 ? "net" : "blk", i,
                 i % 2 ? "" : ",backend=null,size=1M");
        argv[i + 1] = specs[i];
    }
    VHD_CHECK(vhd_options_parse(&o, VHD_OPT_MAX_DEVICES + 2, argv, err, sizeof(err)) < 0);
    VHD_CHECK(strstr(err, "too many devices"));
    vhd_options_free(&o);
    VHD_CHECK(vhd_options_parse(&o, VHD_OPT_MAX_DEVICES + 1, argv, err, sizeof(err)) == 0);
    VHD_CHECK_EQ(o.nblk + o.nnet, VHD_OPT_MAX_DEVICES);
    vhd_options_free(&o);
    /* --help mentions --net */
    VHD_CHECK(strstr(vhd_usage, "--net keys"));
    VHD_CHECK(strstr(vhd_usage, "backend=loopback"));
}

VHD_TEST(net_config_file)
{
    char path[] = "/tmp/vhostd-conf-XXXXXX";
    int fd = mkstemp(path);
    VHD_CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "workers 2\n"
               "net socket=/tmp/n.sock,queues=2,mac=02:00:00:00:00:07   # loopback NIC\n");
    fclose(f);
    struct vhd_options o;
    char err[256] = "";
    int rc = parse(&o, err, "--config", path, NULL, NULL);
    if (rc)
        fprintf(stderr, "  %s\n", err);
    VHD_CHECK_EQ(rc, 0);
    VHD_CHECK_EQ(o.nnet, 1);
    VHD_CHECK_EQ(o.nblk, 0);
    VHD_CHECK_EQ(o.net[0].queues, 2);
    VHD_CHECK_EQ(o.net[0].mac[5], 7);
    vhd_options_free(&o);
    f = fopen(path, "w");
    fprintf(f, "net socket=/tmp/n.sock,mtu=10\n");
    fclose(f);
    VHD_CHECK(parse(&o, err, "--config", path, NULL, NULL) < 0);
    VHD_CHECK(strstr(err, ":1: --net: mtu=10"));
    vhd_options_free(&o);
    unlink(path);
}

/* ---- client mode: client=on|off and reconnect-max=MS, for --blk and --net and in a config ---- */

VHD_TEST(client_mode_keys)
{
    struct vhd_options o;
    char err[256] = "";

    VHD_CHECK_EQ(parse(&o, err, "--blk=socket=/run/q1.sock,image=a.img,client=on",
                       "--net=socket=/run/q2.sock,client=on,reconnect-max=5000",
                       "--blk=socket=/run/q3.sock,backend=null,size=1M", NULL),
                 0);
    VHD_CHECK(o.blk[0].client);
    VHD_CHECK_EQ(o.blk[0].reconnect_max_ms, 0); /* the default applies */
    VHD_CHECK(o.net[0].client);
    VHD_CHECK_EQ(o.net[0].reconnect_max_ms, 5000);
    VHD_CHECK(!o.blk[1].client); /* server mode by default */
    vhd_options_free(&o);

    VHD_CHECK_EQ(
        parse(&o, err, "--blk=socket=/run/q.sock,image=a.img,client=off", NULL, NULL, NULL), 0);
    VHD_CHECK(!o.blk[0].client);
    vhd_options_free(&o);

    static const struct {
        const char *arg, *msg;
    } bad[] = {
        {"--blk=socket=/a,image=a,client=maybe", "client=maybe: expected on or off"},
        {"--blk=socket=/a,image=a,client=on,reconnect-max=5",
         "reconnect-max=5: expected 10..3600000"},
        {"--blk=socket=/a,image=a,client=on,reconnect-max=3600001", "expected 10..3600000"},
        {"--blk=socket=/a,image=a,client=on,reconnect-max=1s", "reconnect-max=1s"},
        {"--blk=socket=/a,image=a,reconnect-max=100", "reconnect-max= goes with client=on"},
        {"--net=socket=/a,client=yess", "--net: client=yess"},
        {"--net=socket=/a,reconnect-max=100", "--net: reconnect-max= goes with client=on"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        VHD_CHECK(parse(&o, err, bad[i].arg, NULL, NULL, NULL) < 0);
        if (!strstr(err, bad[i].msg))
            fprintf(stderr, "  %s: '%s'\n", bad[i].arg, err);
        VHD_CHECK(strstr(err, bad[i].msg));
        vhd_options_free(&o);
    }

    /* The config file takes the same keys. */
    char path[] = "/tmp/vhostd-conf-XXXXXX";
    int fd = mkstemp(path);
    VHD_CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "blk socket=/tmp/qemu-vm1.sock,backend=null,size=1G,client=on,reconnect-max=250\n"
               "net socket=/tmp/qemu-vm1-net.sock,client=on\n");
    fclose(f);
    VHD_CHECK_EQ(parse(&o, err, "--config", path, NULL, NULL), 0);
    VHD_CHECK(o.blk[0].client && o.net[0].client);
    VHD_CHECK_EQ(o.blk[0].reconnect_max_ms, 250);
    vhd_options_free(&o);
    unlink(path);
    /* --help documents the keys. */
    VHD_CHECK(strstr(vhd_usage, "client=on|off"));
    VHD_CHECK(strstr(vhd_usage, "reconnect-max=MS"));
}

/* ---- guest memory caps: max-guest-mem=SIZE per device, --max-guest-mem SIZE for all ---- */

VHD_TEST(guest_mem_caps)
{
    struct vhd_options o;
    char err[256] = "";

    VHD_CHECK_EQ(parse(&o, err, "--blk=socket=/a,image=a,max-guest-mem=64G",
                       "--net=socket=/n,max_guest_mem=1T", "--max-guest-mem=8T", NULL),
                 0);
    VHD_CHECK_EQ(o.blk[0].max_guest_mem, 64ull << 30);
    VHD_CHECK_EQ(o.net[0].max_guest_mem, 1ull << 40);
    VHD_CHECK_EQ(o.max_guest_mem, 8ull << 40);
    vhd_options_free(&o);
    VHD_CHECK_EQ(parse(&o, err, "--blk=socket=/a,image=a", NULL, NULL, NULL), 0);
    VHD_CHECK_EQ(o.blk[0].max_guest_mem, 0); /* the library's defaults apply */
    VHD_CHECK_EQ(o.max_guest_mem, 0);
    vhd_options_free(&o);

    static const struct {
        const char *arg, *arg2, *msg;
    } bad[] = {
        {"--blk=socket=/a,image=a,max-guest-mem=0", NULL,
         "--blk: max-guest-mem=0: expected a size like 64G or 2T"},
        {"--net=socket=/a,max-guest-mem=lots", NULL,
         "--net: max-guest-mem=lots: expected a size like 64G or 2T"},
        {"--blk=socket=/a,image=a", "--max-guest-mem=1Q",
         "--max-guest-mem 1Q: expected a size like 64G or 2T"},
        {"--blk=socket=/a,image=a", "--max-guest-mem=0",
         "--max-guest-mem 0: expected a size like 64G or 2T"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        VHD_CHECK(parse(&o, err, bad[i].arg, bad[i].arg2, NULL, NULL) < 0);
        if (strcmp(err, bad[i].msg))
            fprintf(stderr, "  %s: '%s'\n", bad[i].arg, err);
        VHD_CHECK(!strcmp(err, bad[i].msg));
        vhd_options_free(&o);
    }
    /* A config file takes both; --help documents them. */
    char path[] = "/tmp/vhostd-conf-XXXXXX";
    int fd = mkstemp(path);
    VHD_CHECK(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "max-guest-mem 2T\nblk socket=/tmp/vm.sock,backend=null,size=1G,max-guest-mem=4G\n");
    fclose(f);
    VHD_CHECK_EQ(parse(&o, err, "--config", path, NULL, NULL), 0);
    VHD_CHECK_EQ(o.max_guest_mem, 2ull << 40);
    VHD_CHECK_EQ(o.blk[0].max_guest_mem, 4ull << 30);
    vhd_options_free(&o);
    unlink(path);
    VHD_CHECK(strstr(vhd_usage, "max-guest-mem=SIZE"));
    VHD_CHECK(strstr(vhd_usage, "--max-guest-mem SIZE"));
}

/* ---- socket access: socket-mode=, socket-group=, allow-uid=, allow-gid= ---- */

/* A device spec reads back as one config line: no control character, no '#'. */
VHD_TEST(no_control_characters_in_keys)
{
    struct vhd_options o;
    char err[256] = "";
    static const char *const bad[] = {
        "--blk=socket=/a.sock,image=a.img,name=x\nuser root",
        "--blk=socket=/a.sock\r,image=a.img",
        "--net=socket=/a.sock,name=a#b",
        "--net=socket=/a.sock,name=a\x7f",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        VHD_CHECK(parse(&o, err, bad[i], NULL, NULL, NULL) < 0);
        VHD_CHECK(strstr(err, "control characters and '#' are not allowed in keys"));
        vhd_options_free(&o);
    }
    VHD_CHECK_EQ(parse(&o, err, "--blk=socket=/a b.sock,image=my disk.img", NULL, NULL, NULL), 0);
    vhd_options_free(&o);
}

VHD_TEST(socket_access_keys)
{
    struct vhd_options o;
    char err[256] = "";

    VHD_CHECK_EQ(parse(&o, err,
                       "--blk=socket=/run/a.sock,image=a.img,socket-mode=0660,socket-group=kvm,"
                       "allow-uid=0:libvirt-qemu,allow-gid=107",
                       "--net=socket=/run/b.sock,socket_mode=640,allow_gid=kvm:108",
                       "--blk=socket=/run/c.sock,backend=null,size=1M,client=on,allow-uid=0", NULL),
                 0);
    VHD_CHECK_EQ(o.blk[0].access.mode, 0660);
    VHD_CHECK(o.blk[0].access.group && !strcmp(o.blk[0].access.group, "kvm"));
    VHD_CHECK(!strcmp(o.blk[0].access.allow_uid, "0:libvirt-qemu"));
    VHD_CHECK(!strcmp(o.blk[0].access.allow_gid, "107"));
    VHD_CHECK_EQ(o.net[0].access.mode, 0640); /* octal without the leading 0 too */
    VHD_CHECK(!strcmp(o.net[0].access.allow_gid, "kvm:108"));
    VHD_CHECK(o.blk[1].client && !strcmp(o.blk[1].access.allow_uid, "0"));
    vhd_options_free(&o);

    /* Nothing given: the transport's defaults (0600, the creator's group, any peer). */
    VHD_CHECK_EQ(parse(&o, err, "--blk=socket=/run/a.sock,image=a.img", NULL, NULL, NULL), 0);
    VHD_CHECK(o.blk[0].access.mode == 0 && !o.blk[0].access.group && !o.blk[0].access.allow_uid &&
              !o.blk[0].access.allow_gid);
    vhd_options_free(&o);

    static const struct {
        const char *arg, *msg;
    } bad[] = {
        {"--blk=socket=/a,image=a,socket-mode=0800",
         "--blk: socket-mode=0800: expected octal permissions like 0660"},
        {"--blk=socket=/a,image=a,socket-mode=01777",
         "--blk: socket-mode=01777: expected octal permissions like 0660"},
        {"--blk=socket=/a,image=a,socket-mode=0", "--blk: socket-mode=0: expected octal"},
        {"--net=socket=/a,socket-mode=rw", "--net: socket-mode=rw: expected octal"},
        {"--blk=socket=/a,image=a,allow-uid=0::1",
         "--blk: allow-uid=0::1: expected users separated by ':' (at most 16), e.g. "
         "0:libvirt-qemu"},
        {"--net=socket=/a,allow-gid=:kvm",
         "--net: allow-gid=:kvm: expected groups separated by ':' (at most 16), e.g. kvm:107"},
        {"--blk=socket=/a,image=a,allow-uid=1:2:3:4:5:6:7:8:9:10:11:12:13:14:15:16:17",
         "allow-uid=1:2:3:4:5:6:7:8:9:10:11:12:13:14:15:16:17: expected users"},
        {"--blk=socket=/a,image=a,client=on,socket-mode=0660",
         "--blk: socket-mode= and socket-group= are for a socket vhostd listens on, not "
         "client=on"},
        {"--net=socket=/a,client=on,socket-group=kvm", "--net: socket-mode= and socket-group="},
        {"--blk=socket=/a,image=a,allow-uid=", "--blk: allow-uid= needs a value"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = 0;
        VHD_CHECK(parse(&o, err, bad[i].arg, NULL, NULL, NULL) < 0);
        if (!strstr(err, bad[i].msg))
            fprintf(stderr, "  %s: '%s'\n", bad[i].arg, err);
        VHD_CHECK(strstr(err, bad[i].msg));
        vhd_options_free(&o);
    }
    VHD_CHECK(strstr(vhd_usage, "socket-mode=MODE"));
    VHD_CHECK(strstr(vhd_usage, "allow-uid=LIST"));
}

/*
 * The vhost-user spec's conventions: --socket-path / --fd and their keys
 * become one more --blk or --net device, parsed by the same parser.
 */
VHD_TEST(backend_program_conventions)
{
    struct vhd_options o;
    char err[256] = "";
    VHD_CHECK_EQ(parse(&o, err, "--socket-path=/run/d.sock", "--blk-file=/img", "--read-only",
                       "--keys=queues=2,name=d0"),
                 0);
    VHD_CHECK_EQ(o.nblk, 1);
    VHD_CHECK(!strcmp(o.blk[0].socket, "/run/d.sock") && !strcmp(o.blk[0].image, "/img"));
    VHD_CHECK(o.blk[0].ro && o.blk[0].queues == 2 && !strcmp(o.blk[0].name, "d0"));
    VHD_CHECK(!strcmp(o.blk[0].spec, "socket=/run/d.sock,image=/img,ro=on,queues=2,name=d0"));
    VHD_CHECK_EQ(o.blk[0].fd, 0);
    vhd_options_free(&o);

    VHD_CHECK_EQ(parse(&o, err, "--socket-path=/run/n.sock", "--type=net", "--keys=queues=3", NULL),
                 0);
    VHD_CHECK(o.nblk == 0 && o.nnet == 1 && o.net[0].queues == 3);
    vhd_options_free(&o);

    /* --fd: an open fd (named fd:N when it has no path), a closed one refused. */
    int fds[2];
    VHD_CHECK_EQ(pipe(fds), 0);
    char fdarg[32];
    snprintf(fdarg, sizeof(fdarg), "--fd=%d", fds[0]);
    VHD_CHECK_EQ(parse(&o, err, fdarg, "--keys=backend=null,size=1M", NULL, NULL), 0);
    VHD_CHECK_EQ(o.blk[0].fd, fds[0]);
    char name[32];
    snprintf(name, sizeof(name), "fd:%d", fds[0]);
    VHD_CHECK(!strcmp(o.blk[0].name, name));
    vhd_options_free(&o);
    close(fds[0]);
    close(fds[1]);
    VHD_CHECK(parse(&o, err, fdarg, "--keys=backend=null,size=1M", NULL, NULL) < 0);
    VHD_CHECK(strstr(err, "not an open file descriptor") != NULL);
    vhd_options_free(&o);

    static const char *const bad[][3] = {
        {"--fd=2", "--keys=backend=null,size=1M", "file descriptor number >= 3"},
        {"--socket-path=/a", "--keys=socket=/b", "socket= is --socket-path"},
        {"--socket-path=/a", "--type=scsi", "expected blk or net"},
        {"--blk-file=/img", "--rpc=/r", "go with --socket-path or --fd"},
        {"--socket-path=/a", "--keys=backend=null", "backend=null needs size="},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        VHD_CHECK(parse(&o, err, bad[i][0], bad[i][1], NULL, NULL) < 0);
        if (!strstr(err, bad[i][2]))
            fprintf(stderr, "  '%s %s': '%s'\n", bad[i][0], bad[i][1], err);
        VHD_CHECK(strstr(err, bad[i][2]) != NULL);
        vhd_options_free(&o);
    }
    VHD_CHECK(parse(&o, err, "--socket-path=/a", "--fd=5", "--keys=backend=null,size=1M", NULL) <
              0);
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--socket-path=/a", "--type=net", "--read-only", NULL) < 0);
    VHD_CHECK(strstr(err, "are for --type blk") != NULL);
    vhd_options_free(&o);
}

/*
 * --socket-path and --blk-file are paths, not key text: a ',' in them is part
 * of the path (it used to start keys: "a,backend=null,size=1M" served a null
 * disk); with --rpc such a path is refused (config.save writes KEY=VALUE
 * lines). --read-only takes on|off; --print-capabilities takes no value.
 */
VHD_TEST(conventions_paths_and_flags)
{
    struct vhd_options o;
    char err[256] = "";
    VHD_CHECK_EQ(parse(&o, err, "--socket-path=/t/a,backend=null,size=1M", "--blk-file=/i,ro=on",
                       NULL, NULL),
                 0);
    VHD_CHECK_EQ(o.nblk, 1);
    VHD_CHECK(!strcmp(o.blk[0].socket, "/t/a,backend=null,size=1M"));
    VHD_CHECK(!strcmp(o.blk[0].image, "/i,ro=on"));
    VHD_CHECK(!strcmp(o.blk[0].backend, "uring") && !o.blk[0].ro && o.blk[0].size == 0);
    VHD_CHECK(!strcmp(o.blk[0].name, "a,backend=null,size=1M"));
    vhd_options_free(&o);
    VHD_CHECK_EQ(parse(&o, err, "--socket-path=/t/n,mac=02:00:00:00:00:01", "--type=net",
                       "--keys=name=n0", NULL),
                 0);
    VHD_CHECK(o.nnet == 1 && !o.net[0].mac_set && !strcmp(o.net[0].name, "n0"));
    VHD_CHECK(!strcmp(o.net[0].socket, "/t/n,mac=02:00:00:00:00:01"));
    vhd_options_free(&o);
    /* --keys image= after --blk-file wins, as it did in the text. */
    VHD_CHECK_EQ(parse(&o, err, "--socket-path=/t/a", "--blk-file=/i", "--keys=image=/j", NULL), 0);
    VHD_CHECK(!strcmp(o.blk[0].image, "/j"));
    vhd_options_free(&o);

    VHD_CHECK(parse(&o, err, "--socket-path=/t/a,b", "--blk-file=/i", "--rpc=/r", NULL) < 0);
    VHD_CHECK(strstr(err, "may not contain ','") != NULL);
    vhd_options_free(&o);
    VHD_CHECK(parse(&o, err, "--socket-path=/t/a\nblk x", "--blk-file=/i", NULL, NULL) < 0);
    VHD_CHECK(strstr(err, "control characters") != NULL);
    vhd_options_free(&o);

    static const struct {
        const char *arg;
        int ro; /* -1: refused */
    } ro[] = {{"--read-only", 1},
              {"--read-only=on", 1},
              {"--read-only=off", 0},
              {"--read-only=maybe", -1}};
    for (size_t i = 0; i < sizeof(ro) / sizeof(ro[0]); i++) {
        int rc = parse(&o, err, "--socket-path=/t/a", "--blk-file=/i", ro[i].arg, NULL);
        if (ro[i].ro < 0) {
            VHD_CHECK(rc < 0 && strstr(err, "expected on or off") != NULL);
        } else {
            VHD_CHECK_EQ(rc, 0);
            VHD_CHECK_EQ(o.blk[0].ro, ro[i].ro == 1);
        }
        vhd_options_free(&o);
    }
    VHD_CHECK(
        parse(&o, err, "--print-capabilities=x", "--socket-path=/t/a", "--blk-file=/i", NULL) < 0);
    VHD_CHECK(strstr(err, "takes no value") != NULL);
    vhd_options_free(&o);

    /* An inherited fd is the starting process's: not in a --config file (a reload reads it). */
    char conf[] = "/tmp/vhd-test-opt-XXXXXX";
    int cfd = mkstemp(conf);
    VHD_CHECK(cfd >= 0);
    VHD_CHECK_EQ(write(cfd, "fd 5\nkeys backend=null,size=1M\n", 31), 31);
    close(cfd);
    char carg[64];
    snprintf(carg, sizeof(carg), "--config=%s", conf);
    VHD_CHECK(parse(&o, err, carg, NULL, NULL, NULL) < 0);
    unlink(conf);
    VHD_CHECK(strstr(err, "fd is a command-line option") != NULL);
    vhd_options_free(&o);
}
