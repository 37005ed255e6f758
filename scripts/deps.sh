#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Install the Debian packages vhostd needs, skipping those already present.
# Usage: scripts/deps.sh [build|test|demo]   (default: test — everything)
set -euo pipefail

what=${1:-test}
# librbd-dev: the Ceph RBD backend (src/backend/rbd.c)
build_pkgs=(gcc make meson ninja-build pkg-config liburing-dev libseccomp-dev libnbd-dev libjson-c-dev librbd-dev)
# dpdk-dev: dpdk-testpmd; its virtio-user PMD and mempool driver are plugins (interop tests)
# nbdkit: the NBD server of test_nbd (its memory and file plugins, delay and error filters)
# systemd: systemd-analyze verify on the installed unit (tests/integration/install-check.sh)
test_pkgs=(systemd clang libclang-rt-14-dev valgrind dpdk-dev librte-net-virtio23 librte-mempool-ring23 nbdkit)
# A throwaway single-node Ceph cluster for the RBD tests (tests/ceph/cluster.sh)
ceph_pkgs=(ceph-mon ceph-mgr ceph-osd ceph-common)
guest_pkgs=(qemu-system-x86 qemu-utils qemu-system-common busybox-static cpio xz-utils kmod)

pkgs=("${build_pkgs[@]}")
case "$what" in
build) ;;
demo) pkgs+=("${guest_pkgs[@]}") ;;
test) pkgs+=("${test_pkgs[@]}" "${ceph_pkgs[@]}" "${guest_pkgs[@]}") ;;
*) echo "deps.sh: unknown set '$what' (build|test|demo)" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")/.." && pwd)
if [ "$what" != build ] && [ -f "$here/tests/guest/packages.txt" ]; then
    while read -r p; do
        [ -n "$p" ] && [ "${p#\#}" = "$p" ] && pkgs+=("$p")
    done < "$here/tests/guest/packages.txt"
fi

missing=()
for p in "${pkgs[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "deps.sh: missing packages: ${missing[*]} (run as root, or install them)" >&2
    exit 1
fi
echo "deps.sh: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
