#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# qsd-smoke.sh: end-to-end proof of the guest harness against qemu-storage-daemon's
# vhost-user-blk export (the reference backend until vhostd serves disks). For each case:
# fresh sparse images, host-verify.sh --prepare, start qsd, run-guest.sh, stop qsd,
# host-verify.sh on every image. One "PASS|FAIL qsd-smoke/<case>" line per case (a "SKIP" line
# for each case CASES leaves out) and a final "N passed, N failed[, N skipped]". Every qsd and QEMU we start is stopped, and the scratch directory
# (images, sockets) removed, also on failure or Ctrl-C. Bounded: each guest has
# GUEST_TIMEOUT seconds (default 180) and the run stops starting cases after SMOKE_DEADLINE
# seconds (default 900).
#
# Env: GUEST_DIR (default build/guest), LOG_DIR (default build/qsd-smoke: console and qsd
# logs are kept there), QSD (default qemu-storage-daemon), CASES (space-separated subset).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
LOG_DIR=${LOG_DIR:-$REPO/build/qsd-smoke}
QSD=${QSD:-qemu-storage-daemon}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-180}
SMOKE_DEADLINE=${SMOKE_DEADLINE:-900}
IMG_SIZE=$((64 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))
# qsd's vhost-user-blk answers VIRTIO_BLK_T_GET_ID with this fixed string (no serial option).
QSD_SERIAL=vhost_user_blk

SCRIPT_NAME=qsd-smoke
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"

command -v "$QSD" >/dev/null || { echo "qsd-smoke: $QSD not found (apt-get install qemu-system-common)"; exit 1; }
"$HERE/build-guest.sh" "$GUEST_DIR" | sed 's/^/  /'
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-qsd-smoke.XXXXXX")
start_all=$(date +%s)

# run_case NAME QUEUES PACKED EXPECT_RING RO(0|1) LBS DISCARD(ignore|unmap) [run-guest args...]
run_case() {
    local name=$1 queues=$2 packed=$3 ring=$4 ro=$5 lbs=$6 discard=$7
    shift 7
    local dir=$WORK/$name seed rc=0 reason="" t0
    case_begin "$name" SMOKE_DEADLINE || return 0
    echo "--- qsd-smoke/$name: queues=$queues packed=$packed ro-disk=$ro lbs=$lbs discard=$discard seed=$seed"

    # prepare IMG: a fresh sparse image with the host-to-guest pattern.
    prepare() {
        truncate -s "$IMG_SIZE" "$1" &&
            "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$1" --seed "$seed" >/dev/null
    }
    prepare "$dir/rw.img" || reason="preparing rw.img failed"
    local qsd_args=(
        --blockdev "driver=file,node-name=rw,filename=$dir/rw.img,discard=$discard"
        --export "type=vhost-user-blk,id=rw,node-name=rw,addr.type=unix,addr.path=$dir/rw.sock,writable=on,num-queues=$queues,logical-block-size=$lbs"
    )
    local guest_args=(--sock "$dir/rw.sock" --queues "$queues" --packed "$packed" --expect-ring "$ring"
        --sectors "$SECTORS" --serial "$QSD_SERIAL" --lbs "$lbs" --seed "$seed")
    if [ "$ro" = 1 ]; then
        prepare "$dir/ro.img" || reason="preparing ro.img failed"
        qsd_args+=(
            --blockdev "driver=file,node-name=ro,filename=$dir/ro.img,read-only=on"
            --export "type=vhost-user-blk,id=ro,node-name=ro,addr.type=unix,addr.path=$dir/ro.sock,writable=off,num-queues=$queues,logical-block-size=$lbs"
        )
        guest_args+=(--ro-sock "$dir/ro.sock" --ro-sectors "$SECTORS" --ro-serial "$QSD_SERIAL")
    fi

    if [ -z "$reason" ]; then
        "$QSD" "${qsd_args[@]}" >"$LOG_DIR/$name.qsd.log" 2>&1 &
        backend_pid=$!

        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --log "$LOG_DIR/$name.console.log" "${guest_args[@]}" "$@" &
        guest_pid=$!
        wait "$guest_pid" || rc=$?
        guest_pid=""
        [ "$rc" = 0 ] || reason="guest: see $LOG_DIR/$name.console.log"

        if ! kill -0 "$backend_pid" 2>/dev/null; then
            local st=0
            wait "$backend_pid" || st=$?
            backend_pid=""
            reason="${reason:+$reason; }qsd exited early (status $st): $(tail -n 1 "$LOG_DIR/$name.qsd.log")"
        fi
        stop_backend
    else
        rc=1
    fi

    if [ "$rc" = 0 ]; then
        if ! "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" | sed 's/^/  /'; then
            reason="${reason:+$reason; }host-verify of rw.img failed"
        fi
        if [ "$ro" = 1 ] &&
            ! "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --ro --image "$dir/ro.img" --seed "$seed" | sed 's/^/  /'; then
            reason="${reason:+$reason; }host-verify of ro.img failed"
        fi
    fi
    case_end "$name" "$reason"
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" q1-split q2-split-ro q2-packed-fallback q4-lbs4k \
    negative-detection
# One queue, split ring, one disk; discard is a no-op in qsd's default (discard=ignore).
run_case q1-split 1 off split 0 512 ignore
# Two queues on two vCPUs plus a read-only second disk; discard punches holes (unmap).
run_case q2-split-ro 2 off split 1 512 unmap
# packed=on: qsd (libvhost-user) does not offer VIRTIO_F_RING_PACKED, so QEMU silently falls
# back to a split ring. The guest checks that this is what was negotiated.
run_case q2-packed-fallback 2 on split 1 512 unmap
# More queues than vCPUs (Linux uses min(4, 2) = 2) and 4 KiB logical blocks.
run_case q4-lbs4k 4 off split 0 4096 unmap

# The harness must also fail when it should. One boot with two wrong expectations (a packed
# ring, which qsd cannot give, and a capacity one sector too large) must fail exactly those two
# checks; then host-verify must pass on the intact image and catch one flipped byte.
run_negative() {
    local name=negative-detection dir=$WORK/negative-detection seed rc=0 reason="" t0 out
    case_begin "$name" SMOKE_DEADLINE || return 0
    out=$LOG_DIR/$name.run-guest.txt
    echo "--- qsd-smoke/$name: expecting packed ring and $((SECTORS + 1)) sectors (both wrong), seed=$seed"
    truncate -s "$IMG_SIZE" "$dir/rw.img"
    "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$dir/rw.img" --seed "$seed" >/dev/null ||
        reason="preparing rw.img failed"
    if [ -z "$reason" ]; then
        "$QSD" --blockdev "driver=file,node-name=rw,filename=$dir/rw.img" \
            --export "type=vhost-user-blk,id=rw,node-name=rw,addr.type=unix,addr.path=$dir/rw.sock,writable=on,num-queues=2" \
            >"$LOG_DIR/$name.qsd.log" 2>&1 &
        backend_pid=$!
        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --log "$LOG_DIR/$name.console.log" --sock "$dir/rw.sock" --queues 2 --packed on \
            --expect-ring packed --sectors $((SECTORS + 1)) --seed "$seed" >"$out" 2>&1 &
        guest_pid=$!
        wait "$guest_pid" || rc=$?
        guest_pid=""
        stop_backend
        tail -n 1 "$out" | sed 's/^/  /'
        if [ "$rc" = 0 ]; then
            reason="run-guest passed despite two wrong expectations"
        elif ! grep -q 'run-guest: FAIL failed checks (2): capacity,ring-layout' "$out"; then
            reason="run-guest failed for another reason: $(tail -n 1 "$out")"
        fi
    fi
    if [ -z "$reason" ]; then
        if ! "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" >/dev/null; then
            reason="host-verify failed on the intact image"
        else
            # Complement one byte of the guest's pattern (1 MiB + 4 KiB + 100).
            local off=$((1048576 + 4096 + 100)) byte
            byte=$(od -An -tu1 -j "$off" -N1 "$dir/rw.img" | tr -d ' ')
            # shellcheck disable=SC2059 # the format is the octal escape we build
            printf "\\$(printf %03o $((255 - byte)))" |
                dd of="$dir/rw.img" bs=1 seek="$off" conv=notrunc status=none
            if "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" >"$dir/hv.txt"; then
                reason="host-verify missed a corrupted byte"
            else
                grep 'FAIL' "$dir/hv.txt" | head -n 1 | sed 's/^/  /'
            fi
        fi
    fi
    case_end "$name" "$reason" "wrong expectations and a corrupted byte were caught"
}
run_negative

echo "qsd-smoke: total $(($(date +%s) - start_all))s, logs in $LOG_DIR"
cases_summary
[ "$failed" = 0 ]
