#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The blk driver as the IOMMU against this build's vhostd: vhostd-bench
# --iommu with --verify=1 (every block written is stamped and read back
# through IOTLB-mapped buffers) on a file-backed disk, strict and lazy
# invalidation, 4 KiB and 2 MiB pages, split and packed rings (vhostd offers
# VIRTIO_F_ACCESS_PLATFORM: a refusal fails the case; the driver's refusal
# of a back-end without it is checked against testpmd in testpmd-iommu.sh).
# Ends with "N passed, N failed".
#
# Then the net driver as the IOMMU (build/iommu-net-peer) against a vhostd
# loopback NIC: frames sent and checked on return, strict and lazy, and a
# config change notification (ANNOUNCE) passed on by the driver's miss
# thread.
#
# Env: VHOSTD (default build/vhostd), BENCH (default build/vhostd-bench),
#      IOMMU_NET_PEER (default build/iommu-net-peer).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
vhostd=${VHOSTD:-$root/build/vhostd}
bench=${BENCH:-$(dirname "$vhostd")/vhostd-bench}
peer=${IOMMU_NET_PEER:-$(dirname "$vhostd")/iommu-net-peer}
work=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-iommu-XXXXXX")
passed=0
failed=0
vpid=""

cleanup() {
    if [ -n "$vpid" ]; then
        kill -TERM "$vpid" 2>/dev/null
        wait "$vpid" 2>/dev/null
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

result() { # NAME OK DETAIL
    if [ "$2" = 1 ]; then
        echo "PASS vhostd-iommu/$1"
        passed=$((passed + 1))
    else
        echo "FAIL vhostd-iommu/$1: $3"
        failed=$((failed + 1))
    fi
}

[ -x "$vhostd" ] && [ -x "$bench" ] ||
    { echo "vhostd-iommu: $vhostd or $bench not built"; echo "0 passed, 1 failed"; exit 1; }

truncate -s 64M "$work/disk.img"
"$vhostd" --blk="socket=$work/blk.sock,image=$work/disk.img,queues=2" \
    --net="socket=$work/net.sock,backend=loopback" >"$work/vhostd.log" 2>&1 &
vpid=$!
for _ in $(seq 1 100); do
    [ -S "$work/blk.sock" ] && [ -S "$work/net.sock" ] && break
    sleep 0.1
done

# case NAME BENCH-ARGS...
run_case() {
    local name=$1 log=$work/bench.$1.log
    shift
    timeout 120 "$bench" --socket="$work/blk.sock" --rw=randrw --verify=1 --size=16m \
        --number_ios=2000 --iodepth=16 "$@" >"$log" 2>&1
    local rc=$?
    if [ $rc = 0 ] && grep -Eq "verify: [1-9][0-9]* blocks checked, 0 failed" "$log" &&
        grep -Eq "^iommu +updates [1-9]" "$log"; then
        result "$name" 1 ""
        grep -E "^verify|^iommu" "$log" | sed 's/^/   /'
    else
        result "$name" 0 "exit $rc: $(tail -n 3 "$log" | tr '\n' ' ')"
    fi
}

run_case strict-4k --iommu --iommu-strict
run_case strict-4k-exact --iommu --iommu-strict --iommu-exact
run_case lazy-4k --iommu
run_case strict-2m --iommu=2m --iommu-strict
run_case lazy-2m-packed --iommu=2m --ring=packed --bs=64k
run_case static-4k --iommu --iommu-static=8m
run_case lazy-4k-2jobs --iommu --iommu-batch=8 --numjobs=2 --bs=16k

# net_case NAME PEER-ARGS...
net_case() {
    local name=$1 log=$work/peer.$1.log
    shift
    timeout 120 "$peer" "$work/net.sock" "$@" >"$log" 2>&1
    local rc=$?
    if [ $rc = 0 ]; then
        result "$name" 1 ""
        grep -E "^frames|^announce" "$log" | sed 's/^/   /'
    else
        result "$name" 0 "exit $rc: $(tail -n 3 "$log" | tr '\n' ' ')"
    fi
}

if [ -x "$peer" ]; then
    net_case net-strict-4k --strict --frames 1000
    net_case net-lazy-2m --page $((2 << 20)) --frames 1000
    net_case net-announce --frames 100 --announce
    net_case net-static --frames 1000 --static
else
    result net "0" "$peer not built"
fi

kill -TERM "$vpid" 2>/dev/null
wait "$vpid" 2>/dev/null
vpid=""
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
