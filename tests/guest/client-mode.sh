#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# client-mode.sh: vhostd in vhost-user client mode (--blk ...,client=on) under a real Linux
# guest. QEMU listens (-chardev socket,server=on,wait=off; run-guest.sh --server) and vhostd
# connects to it. Two cases, each with a fresh stamped image, the guest's blk check and
# host-verify.sh afterwards, and vhostd ending with status 0 on SIGTERM:
#   vhostd-first: vhostd starts before QEMU and retries (back-off) until QEMU's socket appears;
#   qemu-first:   QEMU starts first and waits in device realize; vhostd comes 3 s later;
#   restart:      the guest writes, reads back and compares 64 KiB blocks (O_DIRECT) in a loop
#                 while vhostd is stopped (SIGTERM: in-flight I/O completes) and started again
#                 twice; QEMU keeps listening, the new vhostd connects and QEMU restarts the
#                 rings; every compare must pass;
#   net:          a virtio-net device (-netdev vhost-user on a server=on chardev): the guest's
#                 eth0 has vhostd's MAC and comes up, and vhostd loops its frames back.
# One "PASS|FAIL client-mode/<case>" line per case (a "SKIP" line for each case CASES leaves
# out) and a final "N passed, N failed[, N skipped]". Everything
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
IMG_SIZE=$((64 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))

SCRIPT_NAME=client-mode
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"

[ -x "$VHOSTD" ] || { echo "client-mode: $VHOSTD not built" >&2; exit 2; }
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhd-cm.XXXXXX")

start_vhostd() { # $1: log file (appended to)
    "$VHOSTD" --log-level info \
        --blk "socket=$WORK/blk.sock,image=$WORK/disk.img,queues=2,serial=cm0,client=on,reconnect-max=500" \
        >>"$1" 2>&1 &
    vhostd_pid=$!
}

# Wait (bounded) until file $1 holds $2 lines matching $3.
wait_lines() {
    local i=0 n
    while :; do
        n=$(grep -c -- "$3" "$1" 2>/dev/null || true)
        [ "${n:-0}" -lt "$2" ] || return 0
        [ $i -lt $((GUEST_TIMEOUT * 10)) ] || return 1
        sleep 0.1
        i=$((i + 1))
    done
}

# The restart case's guest: 40 rounds of write 64 KiB of fresh random data at block i
# (O_DIRECT, fsync), read it back (O_DIRECT), compare; ~0.3 s apart. No quotes (kernel cmdline).
RESTART_CMD='i=0; while [ $i -lt 40 ]; do dd if=/dev/urandom of=/tmp/a bs=64k count=1 2>/dev/null;
dd if=/tmp/a of=/dev/vda bs=64k seek=$i oflag=direct conv=fsync 2>/dev/null || exit 1;
dd if=/dev/vda of=/tmp/b bs=64k skip=$i count=1 iflag=direct 2>/dev/null || exit 1;
cmp /tmp/a /tmp/b || exit 1; echo ROUND $i; i=$((i+1)); sleep 0.3; done'
RESTART_CMD=${RESTART_CMD//$'\n'/ }

run_case() {
    local name=$1 seed=$RANDOM$RANDOM reason=""
    local vlog=$LOG_DIR/$name.vhostd.log glog=$LOG_DIR/$name.console.log
    rm -f "$WORK/disk.img" "$WORK/blk.sock" "$WORK/net.sock" "$vlog" "$glog"
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
    restart)
        start_vhostd "$vlog"
        "$HERE/run-guest.sh" --server --no-build --guest-dir "$GUEST_DIR" --sock "$WORK/blk.sock" \
            --queues 2 --timeout "$GUEST_TIMEOUT" --log "$glog" --test cmd \
            --guest-args "$RESTART_CMD" >/dev/null &
        guest_pid=$!
        local round
        for round in 1 2; do
            # A few rounds through this vhostd, then stop it and start a new one.
            wait_lines "$glog" $((round * 5)) '^ROUND' || { reason="guest rounds stalled"; break; }
            stop_vhostd
            [ "$vhostd_status" = 0 ] || { reason="vhostd exit status $vhostd_status"; break; }
            sleep 0.5
            start_vhostd "$vlog"
        done
        wait "$guest_pid" || reason=${reason:-"guest command failed (see $glog)"}
        guest_pid=""
        [ "$(grep -c '^ROUND' "$glog")" = 40 ] || reason=${reason:-"not all 40 rounds ran"}
        [ "$(grep -c 'connected to the front-end' "$vlog")" -ge 3 ] ||
            reason=${reason:-"vhostd did not connect three times"}
        ;;
    net)
        "$VHOSTD" --log-level info --net "socket=$WORK/net.sock,client=on,mac=52:54:00:c1:1e:47" \
            >>"$vlog" 2>&1 &
        vhostd_pid=$!
        "$HERE/run-guest.sh" --server --no-build --guest-dir "$GUEST_DIR" --net-sock "$WORK/net.sock" \
            --mac 52:54:00:c1:1e:47 --timeout "$GUEST_TIMEOUT" --log "$glog" --test cmd \
            --guest-args 'cat /sys/class/net/eth0/address; ip link set eth0 up; sleep 1; cat /sys/class/net/eth0/operstate' \
            >/dev/null || reason="guest command failed"
        grep -q '^52:54:00:c1:1e:47' "$glog" || reason=${reason:-"eth0 does not have vhostd's MAC"}
        grep -q '^up' "$glog" || reason=${reason:-"eth0 did not come up"}
        wait_lines "$vlog" 1 "stats (session end): total: tx_packets=[1-9]" ||
            reason=${reason:-"no frames looped back"}
        ;;
    esac
    grep -q "connected to the front-end" "$vlog" || reason=${reason:-"vhostd never connected"}
    stop_vhostd
    [ "$vhostd_status" = 0 ] || reason=${reason:-"vhostd exit status $vhostd_status"}
    if [ "$name" != restart ] && [ "$name" != net ]; then
        "$HERE/host-verify.sh" --image "$WORK/disk.img" --seed "$seed" >"$LOG_DIR/$name.verify.log" ||
            reason=${reason:-"host verify failed"}
    fi
    if [ -z "$reason" ]; then
        echo "PASS client-mode/$name"
        passed=$((passed + 1))
    else
        echo "FAIL client-mode/$name: $reason (logs in $LOG_DIR)"
        failed=$((failed + 1))
    fi
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" vhostd-first qemu-first restart net
for c in $cases_run; do
    run_case "$c"
done
cases_summary
[ "$failed" = 0 ]
