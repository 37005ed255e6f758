#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# iommu-guest.sh: a Linux guest behind an emulated Intel IOMMU (q35, intel-iommu with a device
# IOTLB) on a vhostd disk with iommu_platform=on: vhostd negotiates VIRTIO_F_ACCESS_PLATFORM and
# translates every ring and buffer address through the IOTLB QEMU feeds it (UPDATE,
# INVALIDATE, answers to its misses). The guest's virtio_blk checks run as in vhostd-matrix.sh
# (verified O_DIRECT writes, flush, discard...), then host-verify.sh checks the image, vhostd
# must exit 0 on SIGTERM having logged no error, and its log must show IOTLB traffic.
# Cases: split-strict and packed-q2-strict (an INVALIDATE per unmap), split-lazy and
# packed-q2-lazy (iommu.strict=0: unmapped IOVAs wait in the guest's flush queue; each flush is
# a device-IOTLB invalidation of the whole space, which reaches vhostd as INVALIDATE
# [0, 0xfee00000) and [0xfef00000, 2^64), before the guest reuses any of those IOVAs).
# run-guest.sh puts the disk behind a PCIe root port so that ats=on gives it a device IOTLB:
# without one QEMU 7.2 never forwards the flushes of IOVAs mapped and unmapped between two of
# them, and no back-end can stay correct in lazy mode.
# One "PASS|FAIL iommu-guest/<case>" line per case.
#
# Env: VHOSTD (default build/vhostd), GUEST_DIR (build/guest), LOG_DIR (build/iommu-guest),
# GUEST_TIMEOUT (300 s per boot: the emulated IOMMU is slow under TCG), IOMMU_DEADLINE (1200 s),
# CASES (space-separated subset).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VHOSTD=${VHOSTD:-$REPO/build/vhostd}
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
LOG_DIR=${LOG_DIR:-$REPO/build/iommu-guest}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-300}
IOMMU_DEADLINE=${IOMMU_DEADLINE:-1200}
IMG_SIZE=$((64 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))

SCRIPT_NAME=iommu-guest
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"

[ -x "$VHOSTD" ] || { echo "iommu-guest: $VHOSTD not built"; exit 1; }
"$HERE/build-guest.sh" "$GUEST_DIR" | sed 's/^/  /'
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/iommu-guest.XXXXXX")
start_all=$(date +%s)

# run_case NAME RING(split|packed) QUEUES MODE(lazy|strict)
run_case() {
    local name=$1 ring=$2 queues=$3 mode=$4
    local dir=$WORK/$name seed rc=0 reason="" st packed=off
    [ "$ring" = packed ] && packed=on
    case_begin "$name" IOMMU_DEADLINE || return 0
    echo "--- iommu-guest/$name: ring=$ring queues=$queues iommu=$mode seed=$seed"
    truncate -s "$IMG_SIZE" "$dir/rw.img"
    "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$dir/rw.img" --seed "$seed" >/dev/null ||
        reason="preparing rw.img failed"
    if [ -z "$reason" ]; then
        "$VHOSTD" --workers 2 --log-level debug \
            --blk "socket=$dir/rw.sock,image=$dir/rw.img,queues=$queues,serial=$name" \
            >"$LOG_DIR/$name.vhostd.log" 2>&1 &
        vhostd_pid=$!
        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --log "$LOG_DIR/$name.console.log" --sock "$dir/rw.sock" --queues "$queues" \
            --packed "$packed" --expect-ring "$ring" --sectors "$SECTORS" --serial "$name" \
            --seed "$seed" --iommu "$mode" --dev-opts iommu_platform=on,ats=on,disable-legacy=on \
            --work-mb 8 &
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
        if grep -qE ' error:' "$LOG_DIR/$name.vhostd.log"; then
            reason="${reason:+$reason; }vhostd logged: $(grep -E ' error:' "$LOG_DIR/$name.vhostd.log" | head -n 1)"
        fi
        # The translations came through the IOTLB (debug lines of each message).
        grep -q 'IOTLB_MSG' "$LOG_DIR/$name.vhostd.log" ||
            reason="${reason:+$reason; }no IOTLB message in vhostd's log (ACCESS_PLATFORM not negotiated?)"
    fi
    if [ -z "$reason" ]; then
        "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" | sed 's/^/  /' ||
            reason="host-verify of rw.img failed"
    fi
    case_end "$name" "$reason"
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" split-lazy split-strict packed-q2-strict packed-q2-lazy
#        name              ring   queues mode
run_case split-lazy        split  1      lazy
run_case split-strict      split  1      strict
run_case packed-q2-strict  packed 2      strict
run_case packed-q2-lazy    packed 2      lazy

echo "iommu-guest: total $(($(date +%s) - start_all))s, logs in $LOG_DIR"
cases_summary
[ "$failed" = 0 ]
