#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/spdk-side-by-side.sh: build SPDK's vhost target from given source
# trees, then run the blk side-by-side (bench/side-by-side.sh) with SPDK
# beside qemu-storage-daemon. A benchmark, not a test: CI has no SPDK tree.
#
#   bench/spdk-side-by-side.sh SPDK_TREE ISAL_TREE [--build-only] [side-by-side options]
#
# SPDK_TREE: a checkout of github.com/spdk/spdk (not modified: it is copied);
# ISAL_TREE: a checkout of github.com/intel/isa-l. The copy is built in
# $SPDK_BUILD (default build/spdk) against Debian 12's DPDK 22.11
# (libdpdk-dev), the recipe of issue 15 §5:
#   - isa-l placed at isa-l/ in the copy;
#   - configure --with-dpdk --without-isal-crypto --without-crypto --disable-tests
#     --disable-unit-tests --disable-examples --without-vfio-user --without-xnvme
#     --without-ocf --without-nvme-cuse --without-rdma --without-usdt --without-idxd;
#   - CONFIG_IPSEC_MB?=n in mk/config.mk;
#   - rte_log and rte_argparse dropped from DPDK_LIB_LIST in lib/env_dpdk/env.mk
#     (22.11 has neither as a library);
#   - lib/env_dpdk/pci_dpdk.c accepts 22.11 minor releases above 4 (PCI is not
#     used: the target runs with -u);
#   - Debian's python3 first on PATH, with python3-tabulate, python3-jinja2 and
#     python3-yaml (checked, not installed);
#   - make -j$(nproc) (about two minutes on 2 CPUs).
# A build whose tree has not changed since is reused (the copy records the
# source commits). Then side-by-side.sh runs with --spdk-vhost: SPDK's target
# (build/bin/vhost --no-huge -s 1024 -m MASK -u, a null bdev of 8 GiB with
# 4 KiB blocks, one vhost-blk controller on the daemon CPU) in every null case,
# alternating with vhostd and qsd. Default cases: the issue's, null 4 KiB
# randread, 1 queue, iodepth 1 and 32, polling and interrupt completion
# (--configs adaptive-benchpoll,adaptive,event --only 'null-randread-q1-d(1|32)$');
# any side-by-side.sh option given here replaces those.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
die() {
    echo "spdk-side-by-side: $*" >&2
    exit 2
}

[ $# -ge 2 ] || die "usage: bench/spdk-side-by-side.sh SPDK_TREE ISAL_TREE [--build-only] [side-by-side options]"
SPDK_SRC=$1
ISAL_SRC=$2
shift 2
BUILD_ONLY=0
if [ "${1:-}" = --build-only ]; then
    BUILD_ONLY=1
    shift
fi
[ -d "$SPDK_SRC" ] || die "$SPDK_SRC: not a directory (give a checkout of github.com/spdk/spdk)"
[ -f "$SPDK_SRC/configure" ] && [ -f "$SPDK_SRC/lib/env_dpdk/env.mk" ] && [ -f "$SPDK_SRC/lib/env_dpdk/pci_dpdk.c" ] ||
    die "$SPDK_SRC: not an SPDK source tree (configure, lib/env_dpdk/env.mk, lib/env_dpdk/pci_dpdk.c missing)"
[ -d "$ISAL_SRC" ] || die "$ISAL_SRC: not a directory (give a checkout of github.com/intel/isa-l)"
[ -f "$ISAL_SRC/autogen.sh" ] && [ -f "$ISAL_SRC/include/crc.h" ] ||
    die "$ISAL_SRC: not an isa-l source tree (autogen.sh, include/crc.h missing)"
pkg-config --exists libdpdk || die "DPDK not found by pkg-config: apt-get install libdpdk-dev"
for t in make gcc nasm autoreconf libtoolize; do
    command -v "$t" >/dev/null || die "$t not found (see the SPDK section of bench/packages.txt)"
done
/usr/bin/python3 -c 'import tabulate, jinja2, yaml' 2>/dev/null ||
    die "Debian's python3 lacks tabulate/jinja2/yaml: apt-get install python3-tabulate python3-jinja2 python3-yaml"

OUT=${SPDK_BUILD:-$root/build/spdk}
stamp() { # what the build was made from: the trees' commits (or "unknown") and this script
    echo "spdk $(git -C "$SPDK_SRC" rev-parse HEAD 2>/dev/null || echo unknown)"
    echo "isa-l $(git -C "$ISAL_SRC" rev-parse HEAD 2>/dev/null || echo unknown)"
    sha256sum "$0" | cut -d' ' -f1
}
VHOST=$OUT/build/bin/vhost
if [ -x "$VHOST" ] && [ -f "$OUT/.vhd-stamp" ] && [ "$(stamp)" = "$(cat "$OUT/.vhd-stamp")" ]; then
    echo "spdk-side-by-side: reusing $VHOST" >&2
else
    echo "spdk-side-by-side: building SPDK in $OUT (log: $OUT.log)" >&2
    rm -rf "$OUT"
    mkdir -p "$OUT"
    # Copy (without .git): the recipe edits files; the given trees stay as they are.
    (cd "$SPDK_SRC" && tar --exclude=.git -cf - .) | (cd "$OUT" && tar -xf -)
    rm -rf "$OUT/isa-l"
    mkdir -p "$OUT/isa-l"
    (cd "$ISAL_SRC" && tar --exclude=.git -cf - .) | (cd "$OUT/isa-l" && tar -xf -)

    # edit FILE SED-EXPR CHECK-REGEX: apply, and fail if the result lacks CHECK-REGEX.
    edit() {
        sed -i -E "$2" "$OUT/$1"
        grep -Eq "$3" "$OUT/$1" || die "$1: the recipe's edit did not apply (a newer SPDK?): $2"
    }
    # rte_log and rte_argparse are not libraries of DPDK 22.11.
    edit lib/env_dpdk/env.mk 's/^(DPDK_LIB_LIST[^#]*) rte_log( |$)/\1\2/; s/^(DPDK_LIB_LIST[^#]*) rte_argparse( |$)/\1\2/' \
        '^DPDK_LIB_LIST = rte_eal'
    ! grep -Eq '^DPDK_LIB_LIST.*rte_(log|argparse)( |$)' "$OUT/lib/env_dpdk/env.mk" ||
        die "lib/env_dpdk/env.mk: rte_log/rte_argparse still listed"
    # 22.11 minor releases above 4 (Debian ships 22.11.x): PCI is not used (-u).
    grep -q 'if (minor > 4) {' "$OUT/lib/env_dpdk/pci_dpdk.c" ||
        die "lib/env_dpdk/pci_dpdk.c: no 22.11 minor-release check to relax (a newer SPDK?)"
    edit lib/env_dpdk/pci_dpdk.c 's/if \(minor > 4\) \{/if (minor > 99) {/' 'if \(minor > 99\) \{'

    export PATH=/usr/bin:$PATH # Debian's python3 (with the modules checked above) first
    # (set -e does not apply inside a subshell on the left of ||: every step is chained.)
    (
        cd "$OUT" &&
            ./configure --with-dpdk --without-isal-crypto --without-crypto --disable-tests \
                --disable-unit-tests --disable-examples --without-vfio-user --without-xnvme \
                --without-ocf --without-nvme-cuse --without-rdma --without-usdt --without-idxd &&
            ! grep -q 'Configuration failed' "$OUT.log" &&
            [ -f mk/config.mk ] &&
            sed -i -E 's/^CONFIG_IPSEC_MB\?=y$/CONFIG_IPSEC_MB?=n/' mk/config.mk &&
            grep -q '^CONFIG_IPSEC_MB?=n$' mk/config.mk &&
            nice make -j"$(nproc)"
    ) >"$OUT.log" 2>&1 || die "the SPDK build failed: see $OUT.log (last lines: $(tail -3 "$OUT.log" | tr '\n' ' '))"
    [ -x "$VHOST" ] || die "the build ended without $VHOST: see $OUT.log"
    stamp >"$OUT/.vhd-stamp"
    echo "spdk-side-by-side: built $VHOST" >&2
fi
[ "$BUILD_ONLY" = 1 ] && exit 0

args=("$@")
[ ${#args[@]} -gt 0 ] || args=(--configs adaptive-benchpoll,adaptive,event --only 'null-randread-q1-d(1|32)$')
exec "$root/bench/side-by-side.sh" --spdk-vhost "$VHOST" --spdk-rpc "$OUT/scripts/rpc.py" "${args[@]}"
