#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# DPDK interop, the driver as the IOMMU: libvhostd's virtio-net driver
# (build/iommu-net-peer) with VIRTIO_F_ACCESS_PLATFORM against dpdk-testpmd's
# vhost PMD (iommu-support=1) forwarding in io mode on a looped port. Every
# frame goes out through an IOTLB-mapped TX slot and comes back into an
# IOTLB-mapped receive buffer, at IOVAs testpmd can only resolve through the
# UPDATEs (and misses) of the driver; contents are checked byte for byte.
# Cases: strict and lazy invalidation with 4 KiB and 2 MiB pages, packed
# rings once, pools mapped for good (static), and a testpmd without
# iommu-support, which the driver must refuse with a clear reason. Ends with "N passed, N failed[, N skipped]".
#
# Env: TESTPMD (default dpdk-testpmd), IOMMU_NET_PEER (default
#      build/iommu-net-peer), IOMMU_FRAMES frames per case (default 2000),
#      TESTPMD_CASES to run a subset (space-separated case names).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
testpmd=${TESTPMD:-dpdk-testpmd}
peer=${IOMMU_NET_PEER:-$root/build/iommu-net-peer}
frames=${IOMMU_FRAMES:-2000}
work=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-tpiommu-XXXXXX")
passed=0
failed=0
skipped=0
tpid=""
in_fd=""

# Stop a process we started, by pid: SIGTERM, up to 10 s, then SIGKILL.
stop_pid() {
    local pid=$1 i
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
}

testpmd_stop() {
    if [ -n "$in_fd" ]; then
        echo "quit" >&"$in_fd" 2>/dev/null
        local i
        for i in $(seq 1 100); do
            kill -0 "$tpid" 2>/dev/null || break
            sleep 0.1
        done
        exec {in_fd}>&- 2>/dev/null
        in_fd=""
    fi
    stop_pid "$tpid"
    tpid=""
}

cleanup() {
    testpmd_stop
    rm -rf "$work"
    rm -rf "${XDG_RUNTIME_DIR:-/var/run}/dpdk/vhostd-tpi-$$-"* /var/run/dpdk/vhostd-tpi-$$-* 2>/dev/null
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

# wait_for FILE REGEX SECONDS: until REGEX shows up in FILE (testpmd must stay alive).
wait_for() {
    local i
    for i in $(seq 1 $(($3 * 10))); do
        grep -Eq "$2" "$1" 2>/dev/null && return 0
        kill -0 "$tpid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

result() { # NAME OK DETAIL
    if [ "$2" = 1 ]; then
        echo "PASS testpmd-iommu/$1"
        passed=$((passed + 1))
    else
        echo "FAIL testpmd-iommu/$1: $3"
        failed=$((failed + 1))
    fi
}

wanted() { # NAME: is the case selected?
    [ -z "${TESTPMD_CASES:-}" ] && return 0
    case " $TESTPMD_CASES " in *" $1 "*) return 0 ;; esac
    echo "SKIP testpmd-iommu/$1 (not in TESTPMD_CASES)"
    skipped=$((skipped + 1))
    return 1
}

# testpmd_start NAME IOMMU(0|1): a vhost port at $work/NAME.sock, io forwarding, looped.
testpmd_start() {
    local name=$1 iommu=$2 fifo=$work/in.$1
    tlog=$work/testpmd.$name.log
    sock=$work/$name.sock
    mkfifo "$fifo"
    exec {in_fd}<>"$fifo"
    "$testpmd" --no-huge -m 2048 --no-pci --lcores '0@(0,1),1@1' --file-prefix="vhostd-tpi-$$-$name" \
        --vdev "net_vhost0,iface=$sock,queues=1,iommu-support=$iommu" -- \
        -i --nb-cores=1 --total-num-mbufs=16384 --forward-mode=io --port-topology=loop \
        <"$fifo" >"$tlog" 2>&1 &
    tpid=$!
    if ! wait_for "$tlog" '^testpmd> ' 90; then
        return 1
    fi
    echo "start" >&"$in_fd"
    wait_for "$tlog" 'io packet forwarding' 30
}

# peer_case NAME ARGS...: run the driver against the current testpmd.
peer_case() {
    local name=$1 log=$work/peer.$1.log
    shift
    wanted "$name" || return 0
    if timeout 120 "$peer" "$sock" "$@" >"$log" 2>&1; then
        result "$name" 1 ""
        grep -E "^frames|refused" "$log" | sed 's/^/   /'
    else
        result "$name" 0 "$(tail -n 3 "$log" | tr '\n' ' ') (testpmd log: $tlog)"
    fi
}

command -v "$testpmd" >/dev/null ||
    { echo "testpmd-iommu: $testpmd not found (Debian: apt-get install dpdk-dev)"; echo "0 passed, 1 failed"; exit 1; }
[ -x "$peer" ] || { echo "testpmd-iommu: $peer not built"; echo "0 passed, 1 failed"; exit 1; }

if testpmd_start iommu 1; then
    peer_case strict-4k --strict --frames "$frames"
    peer_case lazy-4k --frames "$frames"
    peer_case strict-2m --strict --page $((2 << 20)) --frames "$frames"
    peer_case lazy-2m --page $((2 << 20)) --batch 64 --frames "$frames"
    peer_case lazy-4k-packed --packed --frames "$frames"
    peer_case static-4k --static --frames "$frames"
else
    result testpmd-start 0 "testpmd (iommu-support=1) did not start: $(tail -n 3 "$tlog" | tr '\n' ' ')"
fi
testpmd_stop

if testpmd_start noiommu 0; then
    peer_case refused-without-iommu --expect-unsupported
else
    result testpmd-start-noiommu 0 "testpmd did not start: $(tail -n 3 "$tlog" | tr '\n' ' ')"
fi
testpmd_stop

if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" = 0 ]
