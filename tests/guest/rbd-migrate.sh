#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# rbd-migrate.sh: vhostd-migrate.sh (a Linux guest live-migrated between two QEMUs mid-workload,
# each QEMU on its own vhostd) with the disk on Ceph RBD: both daemons open the same RBD image
# of a throwaway single-node cluster (tests/ceph/cluster.sh); no file is shared. RBD's exclusive
# lock moves to the destination daemon at its first write. The cluster is stopped (by pid) and
# removed at exit. Env: as vhostd-migrate.sh (CASES, VHOSTD, ...).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbd-migrate.XXXXXX")
cleanup() {
    "$REPO/tests/ceph/cluster.sh" stop "$WORK/ceph" || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! "$REPO/tests/ceph/cluster.sh" start "$WORK/ceph" | sed 's/^/  /'; then
    echo "rbd-migrate: the Ceph cluster did not start"
    echo "0 passed, 1 failed"
    exit 1
fi
CONF=$WORK/ceph/ceph.conf
# One image per case, created fresh (vhostd-migrate.sh starts every case on an empty disk):
# one run of vhostd-migrate.sh per case; its summary lines are replaced by one for all.
passed=0 failed=0
for c in ${CASES:-split packed}; do
    img=migrate-$c-$$
    if ! rbd -c "$CONF" create --size 64M "rbd/$img"; then
        echo "FAIL vhostd-migrate/$c: rbd create failed"
        failed=$((failed + 1))
        continue
    fi
    out=$WORK/$c.out
    CASES=$c BLK_KEYS="backend=rbd,pool=rbd,image=$img,conf=$CONF" VHOSTD_ARGS="--sandbox off" \
        LOG_DIR=${LOG_DIR:-$REPO/build/rbd-migrate} "$HERE/vhostd-migrate.sh" >"$out" 2>&1 || true
    grep -vE '^[0-9]+ passed, [0-9]+ failed' "$out" | grep -v ' skipping ' || true
    if grep -q "^PASS vhostd-migrate/$c" "$out"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
    fi
    rbd -c "$CONF" rm --no-progress "rbd/$img" >/dev/null 2>&1 || true
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
