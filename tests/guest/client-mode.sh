#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# client-mode.sh: vhostd in vhost-user client mode (--blk ...,client=on) under a real Linux
# guest. QEMU listens (-chardev socket,server=on,wait=off; run-guest.sh --server) and vhostd
# connects to it. Two cases, each with a fresh stamped image, the guest's blk check and
# host-verify.sh afterwards, and vhostd ending with status 0 on SIGTERM:
#   vhostd-first: vhostd starts before QEMU and retries (back-off) until QEMU's socket appears;
#   qemu-first:   QEMU starts first and waits in device realize; vhostd comes 3 s later.
# One "PASS|FAIL client-mode/<case>" line per case and a final "N passed, N failed". Everything
# we start is stopped and the scratch directory removed, also on failure. Bounded by
# GUEST_TIMEOUT (default 180 s) per guest.
#
# Env: GUEST_DIR (default build/guest), VHOSTD (default build/vhostd), LOG_DIR (default
# build/client-mode: console and vhostd logs are kept there), CASES (subset).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
VHOSTD=${VHOSTD:-$REPO/build/vhostd}
LOG_DIR=${LOG_DIR:-$REPO/build/client-mode}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-180}
CASES=${CASES:-vhostd-first qemu-first}
IMG_SIZE=$((64 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))

passed=0
failed=0
vhostd_pid=""
guest_pid=""
WORK=""

# SIGTERM and wait (bounded); the exit status goes to STOP_STATUS ("killed" when it had to be).
STOP_STATUS=""
stop_vhostd() {
    [ -n "$vhostd_pid" ] || return 0
    kill -TERM "$vhostd_pid" 2>/dev/null || true
    local i=0
    while kill -0 "$vhostd_pid" 2>/dev/null && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if kill -0 "$vhostd_pid" 2>/dev/null; then
        kill -KILL "$vhostd_pid" 2>/dev/null || true
        wait "$vhostd_pid" 2>/dev/null || true
        STOP_STATUS=killed
    else
        STOP_STATUS=0
        wait "$vhostd_pid" || STOP_STATUS=$?
    fi
    vhostd_pid=""
}

# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    [ -n "$guest_pid" ] && kill "$guest_pid" 2>/dev/null || true
    stop_vhostd
    [ -n "$WORK" ] && rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ -x "$VHOSTD" ] || { echo "client-mode: $VHOSTD not built" >&2; exit 2; }
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhd-cm.XXXXXX")

start_vhostd() { # $1: log file
    "$VHOSTD" --log-level info \
        --blk "socket=$WORK/blk.sock,image=$WORK/disk.img,queues=2,serial=cm0,client=on,reconnect-max=500" \
        >"$1" 2>&1 &
    vhostd_pid=$!
}

run_case() {
    local name=$1 seed=$RANDOM$RANDOM reason=""
    local vlog=$LOG_DIR/$name.vhostd.log glog=$LOG_DIR/$name.console.log
    rm -f "$WORK/disk.img" "$WORK/blk.sock"
    truncate -s "$IMG_SIZE" "$WORK/disk.img"
    "$HERE/host-verify.sh" --prepare --image "$WORK/disk.img" --seed "$seed" >/dev/null
    local guest=("$HERE/run-guest.sh" --server --no-build --guest-dir "$GUEST_DIR"
        --sock "$WORK/blk.sock" --queues 2 --sectors "$SECTORS" --serial cm0 --seed "$seed"
        --timeout "$GUEST_TIMEOUT" --log "$glog")
    case "$name" in
    vhostd-first)
        start_vhostd "$vlog"
        sleep 1 # it retries meanwhile: no socket yet
        grep -q "No such file or directory" "$vlog" || reason="no failed attempt logged before QEMU"
        "${guest[@]}" || reason=${reason:-"guest check failed"}
        ;;
    qemu-first)
        "${guest[@]}" &
        guest_pid=$!
        sleep 3
        start_vhostd "$vlog"
        wait "$guest_pid" || reason="guest check failed"
        guest_pid=""
        ;;
    esac
    grep -q "connected to the front-end" "$vlog" || reason=${reason:-"vhostd never connected"}
    stop_vhostd
    [ "$STOP_STATUS" = 0 ] || reason=${reason:-"vhostd exit status $STOP_STATUS"}
    "$HERE/host-verify.sh" --image "$WORK/disk.img" --seed "$seed" >"$LOG_DIR/$name.verify.log" ||
        reason=${reason:-"host verify failed"}
    if [ -z "$reason" ]; then
        echo "PASS client-mode/$name"
        passed=$((passed + 1))
    else
        echo "FAIL client-mode/$name: $reason (logs in $LOG_DIR)"
        failed=$((failed + 1))
    fi
}

for c in $CASES; do
    run_case "$c"
done
echo "client-mode: $passed passed, $failed failed"
[ "$failed" = 0 ]
