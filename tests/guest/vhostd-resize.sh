#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# vhostd-resize.sh: a running Linux guest sees its vhostd disk grow. vhostd serves a 16 MiB image
# with --rpc; the guest (run-guest.sh --test cmd) says RESIZE-READY with its capacity and polls
# /sys/block/vda/size; the host runs `vhostctl resize rw.sock 32M` (vhostd grows the image and
# sends VHOST_USER_BACKEND_CONFIG_CHANGE_MSG; QEMU re-reads the config space and tells the guest);
# the guest sees the new capacity and writes a marker naming it into the last sector; the host
# checks the guest's report, the image's size and the marker at its new end, and that vhostd
# exits 0 on SIGTERM having logged no error or warning. Cases: split, packed (CASES=).
#
# Env: VHOSTD, VHOSTCTL (default build/vhostd, build/vhostctl), GUEST_DIR (build/guest), LOG_DIR
# (build/vhostd-resize), GUEST_TIMEOUT (180 s per boot), RESIZE_DEADLINE (600 s: no case starts
# after it), CASES.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VHOSTD=${VHOSTD:-$REPO/build/vhostd}
VHOSTCTL=${VHOSTCTL:-$(dirname "$VHOSTD")/vhostctl}
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
LOG_DIR=${LOG_DIR:-$REPO/build/vhostd-resize}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-180}
RESIZE_DEADLINE=${RESIZE_DEADLINE:-600}
OLD=$((16 * 1024 * 1024))
NEW=$((32 * 1024 * 1024))

SCRIPT_NAME=vhostd-resize
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"

[ -x "$VHOSTD" ] || { echo "vhostd-resize: $VHOSTD not built"; exit 1; }
[ -x "$VHOSTCTL" ] || { echo "vhostd-resize: $VHOSTCTL not built"; exit 1; }
"$HERE/build-guest.sh" "$GUEST_DIR" | sed 's/^/  /'
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-resize.XXXXXX")
start_all=$(date +%s)

# The guest's part: a shell line for init.sh's cmd test (no quotes: it travels in
# vhostd.args="..."). It waits at most 60 s for the capacity to change, then writes
# VHOSTD-RESIZE-MARKER-<sectors> into the last sector (padded with zeros) and flushes it.
# shellcheck disable=SC2016 # expanded by the guest's shell, not here
GUEST_LINE='s0=$(cat /sys/block/vda/size); echo INFO RESIZE-READY $s0; i=0;
while [ $(cat /sys/block/vda/size) -eq $s0 ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done;
s1=$(cat /sys/block/vda/size); echo INFO RESIZED $s0 $s1;
[ $s1 -gt $s0 ] && printf VHOSTD-RESIZE-MARKER-$s1 >/tmp/m &&
dd if=/tmp/m of=/dev/vda bs=512 seek=$((s1-1)) conv=sync,fsync 2>/dev/null && sync &&
echo INFO MARKER-WRITTEN'
GUEST_LINE=$(echo "$GUEST_LINE" | tr '\n' ' ')

# run_case NAME PACKED(on|off)
run_case() {
    local name=$1 packed=$2
    # shellcheck disable=SC2034 # seed: set by case_begin, unused here
    local dir=$WORK/$name seed rc=0 reason="" t0 st i out
    case_begin "$name" RESIZE_DEADLINE || return 0
    echo "--- vhostd-resize/$name: packed=$packed, $OLD -> $NEW bytes"
    local log=$LOG_DIR/$name.console.log vlog=$LOG_DIR/$name.vhostd.log
    rm -f "$log"
    truncate -s "$OLD" "$dir/rw.img"
    "$VHOSTD" --log-level info --rpc "$dir/rpc.sock" \
        --blk "socket=$dir/rw.sock,image=$dir/rw.img" >"$vlog" 2>&1 &
    vhostd_pid=$!
    "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
        --log "$log" --sock "$dir/rw.sock" --packed "$packed" --test cmd \
        --guest-args "$GUEST_LINE" &
    guest_pid=$!
    # The guest is ready (its driver runs): resize, bounded by the boot timeout.
    i=0
    # Anchored: the GUEST-START line echoes the guest's command, RESIZE-READY included.
    while ! grep -Eq '^INFO RESIZE-READY [0-9]+' "$log" 2>/dev/null &&
        kill -0 "$guest_pid" 2>/dev/null &&
        [ $i -lt $((GUEST_TIMEOUT * 10)) ]; do
        sleep 0.1
        i=$((i + 1))
    done
    if grep -Eq "^INFO RESIZE-READY $((OLD / 512))\b" "$log" 2>/dev/null; then
        out=$(timeout 30 "$VHOSTCTL" --rpc "$dir/rpc.sock" resize rw.sock 32M 2>&1) ||
            reason="vhostctl resize failed: $out"
        echo "  vhostctl: $out"
    else
        reason="the guest never said RESIZE-READY $((OLD / 512)) (see $log)"
    fi
    wait "$guest_pid" || rc=$?
    guest_pid=""
    [ "$rc" = 0 ] || reason="${reason:+$reason; }guest: see $log"
    grep -Eq "^INFO RESIZED $((OLD / 512)) $((NEW / 512))\b" "$log" ||
        reason="${reason:+$reason; }the guest did not see $((NEW / 512)) sectors: $(grep -E '^INFO RESIZED' "$log" || echo none)"
    grep -Eq '^INFO MARKER-WRITTEN' "$log" || reason="${reason:+$reason; }the guest wrote no marker"
    if ! kill -0 "$vhostd_pid" 2>/dev/null; then
        reason="${reason:+$reason; }vhostd died: $(tail -n 1 "$vlog")"
    fi
    stop_vhostd
    st=$vhostd_status
    [ "$st" = 0 ] || reason="${reason:+$reason; }vhostd exited with status $st on SIGTERM"
    # The one warning --rpc gives as root without --user (what runtime adds may reach) is not this test's.
    local bad
    bad=$(grep -E ' (error|warn):' "$vlog" | grep -v 'sandbox: --rpc as root without --user' | head -n 1 || true)
    [ -z "$bad" ] || reason="${reason:+$reason; }vhostd logged: $bad"
    st=$(stat -c %s "$dir/rw.img")
    [ "$st" = "$NEW" ] || reason="${reason:+$reason; }the image has $st bytes, not $NEW"
    local want="VHOSTD-RESIZE-MARKER-$((NEW / 512))"
    local got
    got=$(dd if="$dir/rw.img" bs=512 skip=$((NEW / 512 - 1)) count=1 2>/dev/null | head -c ${#want})
    [ "$got" = "$want" ] || reason="${reason:+$reason; }last sector holds '$got', not '$want'"
    [ -n "$reason" ] || echo "  HOST-CHECK: image $st bytes, '$got' in its last sector"
    case_end "$name" "$reason"
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" split packed
run_case split off
run_case packed on

echo "vhostd-resize: total $(($(date +%s) - start_all))s, logs in $LOG_DIR"
cases_summary
[ "$failed" = 0 ]
