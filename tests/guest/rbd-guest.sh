#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# rbd-guest.sh: real Linux guests on a vhostd disk served from Ceph RBD (backend=rbd), on a
# throwaway single-node cluster (tests/ceph/cluster.sh). For each case of {split, packed} x
# {1, 2 queues}: an image stamped by host-verify.sh --prepare is imported into the pool
# (`rbd import`), vhostd serves it, run-guest.sh runs the guest's checks (queues, capacity,
# serial, ring layout, verified O_DIRECT writes, flush, WCE toggle, discard, write-zeroes),
# vhostd is stopped with SIGTERM (exit 0), and the image, exported with `rbd export`, goes
# through host-verify.sh. One "PASS|FAIL rbd-guest/<case>" line per case and a final
# "N passed, N failed[, N skipped]". The cluster is stopped (by pid) and removed at exit.
#
# Env: VHOSTD (default build/vhostd), GUEST_DIR (build/guest), LOG_DIR (build/rbd-guest),
# GUEST_TIMEOUT (300 s per boot), RBD_DEADLINE (1500 s: no case starts after it),
# CASES (space-separated subset).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VHOSTD=${VHOSTD:-$REPO/build/vhostd}
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
LOG_DIR=${LOG_DIR:-$REPO/build/rbd-guest}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-300}
RBD_DEADLINE=${RBD_DEADLINE:-1500}
IMG_SIZE=$((64 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))

SCRIPT_NAME=rbd-guest
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"

[ -x "$VHOSTD" ] || { echo "rbd-guest: $VHOSTD not built"; exit 1; }
"$HERE/build-guest.sh" "$GUEST_DIR" | sed 's/^/  /'
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/rbd-guest.XXXXXX")
CLUSTER=$WORK/ceph
start_all=$(date +%s)

# lib.sh's cleanup, then the cluster (before WORK, which holds it, is removed).
rbd_cleanup() {
    "$REPO/tests/ceph/cluster.sh" stop "$CLUSTER" || true
}
trap 'rbd_cleanup; cleanup' EXIT

if ! "$REPO/tests/ceph/cluster.sh" start "$CLUSTER" | sed 's/^/  /'; then
    echo "rbd-guest: the Ceph cluster did not start"
    echo "0 passed, 1 failed"
    exit 1
fi
CONF=$CLUSTER/ceph.conf

# run_case NAME RING(split|packed) QUEUES WORKERS
run_case() {
    local name=$1 ring=$2 queues=$3 workers=$4
    local dir=$WORK/$name seed rc=0 reason="" st packed=off
    [ "$ring" = packed ] && packed=on
    case_begin "$name" RBD_DEADLINE || return 0
    echo "--- rbd-guest/$name: ring=$ring queues=$queues workers=$workers seed=$seed"
    truncate -s "$IMG_SIZE" "$dir/rw.img"
    "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$dir/rw.img" --seed "$seed" >/dev/null ||
        reason="preparing rw.img failed"
    [ -n "$reason" ] || rbd -c "$CONF" import --no-progress "$dir/rw.img" "rbd/$name" >/dev/null ||
        reason="rbd import failed"
    if [ -z "$reason" ]; then
        # --user: librados's threads block signals, so dropping capabilities without a user
        # change cannot reach them (vhostd warns); a user change (setresuid) reaches every thread.
        # The socket's directory is the user's, so that vhostd removes the socket at exit.
        chmod 711 "$WORK"
        chown nobody "$dir"
        "$VHOSTD" --workers "$workers" --log-level info --sandbox off --user nobody \
            --blk "socket=$dir/rw.sock,backend=rbd,pool=rbd,image=$name,conf=$CONF,queues=$queues,serial=$name-rw" \
            >"$LOG_DIR/$name.vhostd.log" 2>&1 &
        vhostd_pid=$!
        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --log "$LOG_DIR/$name.console.log" --sock "$dir/rw.sock" --queues "$queues" \
            --packed "$packed" --expect-ring "$ring" --sectors "$SECTORS" --serial "$name-rw" \
            --lbs 512 --seed "$seed" --require EVENT_IDX,FLUSH --discard yes &
        guest_pid=$!
        wait "$guest_pid" || rc=$?
        guest_pid=""
        [ "$rc" = 0 ] || reason="guest: see $LOG_DIR/$name.console.log"
        if ! kill -0 "$vhostd_pid" 2>/dev/null; then
            reason="${reason:+$reason; }vhostd died: $(tail -n 1 "$LOG_DIR/$name.vhostd.log")"
        fi
        stop_vhostd
        st=$vhostd_status
        [ "$st" = 0 ] || reason="${reason:+$reason; }vhostd exited with status $st on SIGTERM"
        if grep -qE ' (error|warn):' "$LOG_DIR/$name.vhostd.log"; then
            reason="${reason:+$reason; }vhostd logged: $(grep -E ' (error|warn):' "$LOG_DIR/$name.vhostd.log" | head -n 1)"
        fi
    fi
    if [ -z "$reason" ]; then
        rm -f "$dir/rw.img"
        if rbd -c "$CONF" export --no-progress "rbd/$name" "$dir/rw.img" >/dev/null; then
            "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" | sed 's/^/  /' ||
                reason="host-verify of the exported image failed"
        else
            reason="rbd export failed"
        fi
    fi
    rm -f "$dir/rw.img"
    rbd -c "$CONF" rm --no-progress "rbd/$name" >/dev/null 2>&1 || true
    case_end "$name" "$reason"
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" split-q1-w1 packed-q1-w1 split-q2-w2 packed-q2-w2
#        name           ring   queues workers
run_case split-q1-w1    split  1      1
run_case packed-q1-w1   packed 1      1
run_case split-q2-w2    split  2      2
run_case packed-q2-w2   packed 2      2

echo "rbd-guest: total $(($(date +%s) - start_all))s, logs in $LOG_DIR"
cases_summary
[ "$failed" = 0 ]
