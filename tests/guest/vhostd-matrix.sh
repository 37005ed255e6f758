#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# vhostd-matrix.sh: real Linux guests on vhostd disks. For each case of the matrix
# {split, packed} x {1, 2 queues} x {1, 2 workers} (plus a 4 KiB-block case): fresh sparse
# images stamped by host-verify.sh --prepare, one vhostd serving a read-write disk and (in the
# 2-queue cases) a read-only second disk, run-guest.sh (the guest's virtio_blk checks queues,
# capacity, serial, block size, ring layout, verified O_DIRECT writes at 4K/64K/1M, flush, WCE
# toggle, discard, write-zeroes, RO rejection), then SIGTERM vhostd (must exit 0 and remove its
# sockets) and host-verify.sh on every image. One "PASS|FAIL vhostd-matrix/<case>" line per case
# (a "SKIP" line for each case CASES leaves out) and a final "N passed, N failed[, N skipped]".
#
# Env: VHOSTD (default build/vhostd), GUEST_DIR (build/guest), LOG_DIR (build/vhostd-matrix),
# GUEST_TIMEOUT (180 s per boot), MATRIX_DEADLINE (1200 s: no case starts after it),
# CASES (space-separated subset).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VHOSTD=${VHOSTD:-$REPO/build/vhostd}
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
LOG_DIR=${LOG_DIR:-$REPO/build/vhostd-matrix}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-180}
MATRIX_DEADLINE=${MATRIX_DEADLINE:-1200}
IMG_SIZE=$((64 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))

SCRIPT_NAME=vhostd-matrix
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"

[ -x "$VHOSTD" ] || { echo "vhostd-matrix: $VHOSTD not built"; exit 1; }
"$HERE/build-guest.sh" "$GUEST_DIR" | sed 's/^/  /'
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-matrix.XXXXXX")
start_all=$(date +%s)

# run_case NAME RING(split|packed) QUEUES WORKERS LBS RO_DISK(0|1)
run_case() {
    local name=$1 ring=$2 queues=$3 workers=$4 lbs=$5 ro=$6
    local dir=$WORK/$name seed rc=0 reason="" t0 st packed=off
    [ "$ring" = packed ] && packed=on
    case_begin "$name" MATRIX_DEADLINE || return 0
    echo "--- vhostd-matrix/$name: ring=$ring queues=$queues workers=$workers lbs=$lbs ro-disk=$ro seed=$seed"
    local args=(--workers "$workers" --log-level info
        --blk "socket=$dir/rw.sock,image=$dir/rw.img,queues=$queues,serial=$name-rw,block-size=$lbs")
    local guest_args=(--sock "$dir/rw.sock" --queues "$queues" --packed "$packed" --expect-ring "$ring"
        --sectors "$SECTORS" --serial "$name-rw" --lbs "$lbs" --seed "$seed"
        --require EVENT_IDX,FLUSH --discard yes)
    local imgs=(rw)
    if [ "$ro" = 1 ]; then
        imgs+=(ro)
        args+=(--blk "socket=$dir/ro.sock,image=$dir/ro.img,queues=$queues,serial=$name-ro,ro=on,block-size=$lbs")
        guest_args+=(--ro-sock "$dir/ro.sock" --ro-sectors "$SECTORS" --ro-serial "$name-ro")
    fi
    for i in "${imgs[@]}"; do
        truncate -s "$IMG_SIZE" "$dir/$i.img"
        "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$dir/$i.img" --seed "$seed" >/dev/null ||
            reason="preparing $i.img failed"
    done

    if [ -z "$reason" ]; then
        "$VHOSTD" "${args[@]}" >"$LOG_DIR/$name.vhostd.log" 2>&1 &
        vhostd_pid=$!
        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --log "$LOG_DIR/$name.console.log" "${guest_args[@]}" &
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
        for i in "${imgs[@]}"; do
            [ ! -e "$dir/$i.sock" ] || reason="${reason:+$reason; }$i.sock not removed at exit"
        done
        if grep -qE ' (error|warn):' "$LOG_DIR/$name.vhostd.log"; then
            reason="${reason:+$reason; }vhostd logged: $(grep -E ' (error|warn):' "$LOG_DIR/$name.vhostd.log" | head -n 1)"
        fi
    fi
    if [ -z "$reason" ]; then
        "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" | sed 's/^/  /' ||
            reason="host-verify of rw.img failed"
        if [ "$ro" = 1 ]; then
            "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --ro --image "$dir/ro.img" --seed "$seed" | sed 's/^/  /' ||
                reason="${reason:+$reason; }host-verify of ro.img failed"
        fi
    fi
    case_end "$name" "$reason"
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" split-q1-w1 split-q1-w2 split-q2-w1 split-q2-w2 \
    packed-q1-w1 packed-q1-w2 packed-q2-w1 packed-q2-w2 split-q2-w2-lbs4k
#        name                ring   queues workers lbs  ro-disk
run_case split-q1-w1         split  1      1       512  0
run_case split-q1-w2         split  1      2       512  0
run_case split-q2-w1         split  2      1       512  1
run_case split-q2-w2         split  2      2       512  1
run_case packed-q1-w1        packed 1      1       512  0
run_case packed-q1-w2        packed 1      2       512  0
run_case packed-q2-w1        packed 2      1       512  1
run_case packed-q2-w2        packed 2      2       512  1
run_case split-q2-w2-lbs4k   split  2      2       4096 0

echo "vhostd-matrix: total $(($(date +%s) - start_all))s, logs in $LOG_DIR"
cases_summary
[ "$failed" = 0 ]
