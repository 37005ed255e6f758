#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/rbd-side-by-side.sh: vhostd's rbd backend against qemu-storage-daemon's
# rbd driver (qsd), on the same RBD image of a throwaway cluster
# (tests/ceph/cluster.sh), driven by the same vhostd-bench settings: 4 KiB
# random read and write at queue depth 1 and 32, one queue, alternately
# (vhostd then qsd, then qsd then vhostd, ...) for N rounds. For each run: IOPS
# and the daemon's CPU time per I/O (sum of its threads' schedstat run time,
# librbd's threads included: both daemons use the same library). librbd's
# cache is off on both (vhostd direct=on; qsd cache.direct=on). vhostd runs
# with its default adaptive polling ("vhostd") and in pure event mode
# ("vhostd-ev": --poll never, the hand-over's cost alone). No pinning: the
# cluster's daemons need the CPUs too. Prints a table; raw JSON under --out.
#
# Every process the script starts is stopped by pid; the cluster is removed.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=2
RUNTIME=5
OUT="$root/build/bench-rbd"
BUILD="$root/build"
while [ $# -gt 0 ]; do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds N] [--runtime S] [--out DIR] [--build DIR]" >&2; exit 2 ;;
    esac
done
for tool in qemu-storage-daemon jq "$BUILD/vhostd" "$BUILD/vhostd-bench"; do
    command -v "$tool" >/dev/null || { echo "rbd-side-by-side: $tool not found" >&2; exit 1; }
done
mkdir -p "$OUT/raw"
RUN=$(mktemp -d "${TMPDIR:-/tmp}/vhd-rbdbench-XXXXXX")
CLUSTER="$RUN/ceph"
DPID=""
cleanup() {
    [ -n "$DPID" ] && kill "$DPID" 2>/dev/null && wait "$DPID" 2>/dev/null
    "$root/tests/ceph/cluster.sh" stop "$CLUSTER" || true
    rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$root/tests/ceph/cluster.sh" start "$CLUSTER" >"$RUN/cluster.out"
CONF="$CLUSTER/ceph.conf"
IMG=bench
rbd -c "$CONF" create --size 1G "rbd/$IMG"
# Allocate every object: random reads then read data, not absent objects.
rbd -c "$CONF" bench --io-type write --io-size 4M --io-threads 4 --io-total 1G \
    --io-pattern seq "rbd/$IMG" >/dev/null

sched_ns() {
    local ns=0 t v
    for t in /proc/"$1"/task/*/schedstat; do
        read -r v _ <"$t" 2>/dev/null && ns=$((ns + v))
    done
    echo "$ns"
}

run() { # daemon rw depth round
    local daemon=$1 rw=$2 depth=$3 round=$4 sock="$RUN/$1.sock" json
    json="$OUT/raw/$daemon-$rw-d$depth-r$round.json"
    if [ "$daemon" = vhostd ] || [ "$daemon" = vhostd-ev ]; then
        "$BUILD/vhostd" --workers 1 --sandbox off --log-level warn \
            --poll "$([ "$daemon" = vhostd ] && echo adaptive || echo never)" \
            --blk "socket=$sock,backend=rbd,pool=rbd,image=$IMG,conf=$CONF,direct=on" \
            >"$RUN/$daemon.log" 2>&1 &
    else
        qemu-storage-daemon --object iothread,id=io0 \
            --blockdev "driver=rbd,node-name=n,pool=rbd,image=$IMG,conf=$CONF,cache.direct=on" \
            --export "type=vhost-user-blk,id=e,node-name=n,addr.type=unix,addr.path=$sock,writable=on,iothread=io0" \
            >"$RUN/$daemon.log" 2>&1 &
    fi
    DPID=$!
    for _ in $(seq 400); do [ -S "$sock" ] && break; sleep 0.05; done
    [ -S "$sock" ] || { cat "$RUN/$daemon.log" >&2; echo "$daemon did not start" >&2; exit 1; }
    local c0 c1
    c0=$(sched_ns "$DPID")
    timeout -k 5 $((RUNTIME + 60)) "$BUILD/vhostd-bench" --socket="$sock" --rw="$rw" --bs=4k \
        --iodepth="$depth" --runtime="$RUNTIME" --json >"$json"
    c1=$(sched_ns "$DPID")
    kill "$DPID"
    wait "$DPID" 2>/dev/null || true
    DPID=""
    rm -f "$sock"
    read -r iops ios p99 < <(jq -r '.total | "\(.iops) \(.ios) \(.lat_us.p99)"' "$json")
    awk -v d="$daemon" -v rw="$rw" -v q="$depth" -v r="$round" -v iops="$iops" -v ios="$ios" \
        -v p99="$p99" -v a="$c0" -v b="$c1" 'BEGIN {
        printf "%-9s %-9s d%-3s r%s %9.0f IOPS  p99 %9.1f us  %7.1f us CPU/IO\n",
            d, rw, q, r, iops, p99, (ios > 0 ? (b - a) / 1000 / ios : 0) }' | tee -a "$OUT/results.txt"
}

: >"$OUT/results.txt"
echo "load: $(cat /proc/loadavg)  cluster: $(cat "$RUN/cluster.out")" | tee -a "$OUT/results.txt"
for rw in randread randwrite; do
    for depth in 1 32; do
        for round in $(seq 1 "$ROUNDS"); do
            if [ $((round % 2)) = 1 ]; then order="vhostd vhostd-ev qsd"; else order="qsd vhostd-ev vhostd"; fi
            for d in $order; do run "$d" "$rw" "$depth" "$round"; done
        done
    done
done
echo "load: $(cat /proc/loadavg)" | tee -a "$OUT/results.txt"
