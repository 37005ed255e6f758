#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/nbd-side-by-side.sh: an NBD disk served by vhostd (backend=nbd) and by
# qemu-storage-daemon (its nbd block driver, a vhost-user-blk export), both in
# front of the same nbdkit (memory plugin, Unix socket), driven by the same
# vhostd-bench settings, run alternately (A B, then B A, ...) for N rounds so
# that the machine's drift hits both alike. Per run: IOPS, p50/p99 latency, and
# the daemon's CPU time per I/O (utime+stime from /proc/PID/stat).
#
# Pinning (2 CPUs): the daemon under test on --daemon-cpu (default 1); the
# bench and nbdkit on --bench-cpu (default 0). vhostd runs one worker in event
# mode (--poll never), qsd one iothread with polling off (poll-max-ns=0): the
# same single thread, no busy polling on either side.
#
# Every process started here is stopped by pid on every exit path.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
ROUNDS=3
RUNTIME=5
OUT="$root/build/bench-nbd"
BUILD="$root/build"
DAEMON_CPU=1
BENCH_CPU=0
CASES="randread-d1 randread-d32 randwrite-d32"

usage() {
    cat <<'EOF'
usage: bench/nbd-side-by-side.sh [--rounds N] [--runtime S] [--out DIR] [--build DIR]
                                 [--cases "randread-d1 randread-d32 randwrite-d32"]
                                 [--daemon-cpu N] [--bench-cpu N]
Cases are RW-dDEPTH with RW one of vhostd-bench's --rw modes; 4 KiB, one queue.
EOF
}

while [ $# -gt 0 ]; do
    case "$1" in
    --rounds) ROUNDS=$2; shift 2 ;;
    --runtime) RUNTIME=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    --daemon-cpu) DAEMON_CPU=$2; shift 2 ;;
    --bench-cpu) BENCH_CPU=$2; shift 2 ;;
    --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done

for tool in qemu-storage-daemon nbdkit jq taskset timeout; do
    command -v "$tool" >/dev/null || { echo "nbd-side-by-side: $tool not found" >&2; exit 2; }
done
[ -x "$BUILD/vhostd" ] && [ -x "$BUILD/vhostd-bench" ] ||
    { echo "nbd-side-by-side: build $BUILD first" >&2; exit 2; }

mkdir -p "$OUT/logs" "$OUT/raw"
RUN=$(mktemp -d /tmp/vhd-nbdbench-XXXXXX)
NBD_SOCK="$RUN/nbd.sock"
BLK_SOCK="$RUN/blk.sock"
NBDKIT_PID=""
DAEMON_PID=""

stop_pid() { # stop_pid PID: SIGTERM, wait up to 10 s, then SIGKILL
    local pid=$1 i
    [ -n "$pid" ] || return 0
    kill "$pid" 2>/dev/null || return 0
    for i in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    stop_pid "$DAEMON_PID"
    stop_pid "$NBDKIT_PID"
    rm -f "$NBD_SOCK" "$BLK_SOCK"
    rm -rf "$RUN"
}
trap cleanup EXIT
trap 'echo "nbd-side-by-side: interrupted" >&2; exit 130' INT TERM

wait_sock() { # wait_sock PATH PID: up to 10 s
    local i
    for i in $(seq 200); do
        [ -S "$1" ] && return 0
        kill -0 "$2" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

cpu_ticks() { # utime+stime of pid $1
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
    stat=${stat##*) }
    echo "$stat" | awk '{ print $12 + $13 }'
}

taskset -c "$BENCH_CPU" nbdkit -f -U "$NBD_SOCK" memory size=1G >"$OUT/logs/nbdkit.log" 2>&1 &
NBDKIT_PID=$!
wait_sock "$NBD_SOCK" "$NBDKIT_PID" || { echo "nbd-side-by-side: nbdkit did not start" >&2; exit 1; }
# Fill the export once so reads do not hit the memory plugin's sparse holes.
taskset -c "$BENCH_CPU" "$BUILD/vhostd" --workers 1 --log-level warn \
    --blk "socket=$BLK_SOCK,backend=nbd,uri=nbd+unix:///?socket=$NBD_SOCK" >"$OUT/logs/fill.log" 2>&1 &
DAEMON_PID=$!
wait_sock "$BLK_SOCK" "$DAEMON_PID" || { echo "nbd-side-by-side: vhostd did not start" >&2; exit 1; }
timeout 300 "$BUILD/vhostd-bench" --socket="$BLK_SOCK" --rw=write --bs=1m --iodepth=4 >/dev/null
stop_pid "$DAEMON_PID"; DAEMON_PID=""; rm -f "$BLK_SOCK"

start_daemon() { # start_daemon vhostd|qsd LOG
    local cmd
    if [ "$1" = vhostd ]; then
        cmd=("$BUILD/vhostd" --workers 1 --poll never --log-level warn
            --blk "socket=$BLK_SOCK,backend=nbd,uri=nbd+unix:///?socket=$NBD_SOCK")
    else
        cmd=(qemu-storage-daemon --object "iothread,id=io0,poll-max-ns=0"
            --blockdev "driver=nbd,node-name=n,server.type=unix,server.path=$NBD_SOCK"
            --export "type=vhost-user-blk,id=e,node-name=n,addr.type=unix,addr.path=$BLK_SOCK,writable=on,num-queues=1,iothread=io0")
    fi
    taskset -c "$DAEMON_CPU" "${cmd[@]}" >"$2" 2>&1 &
    DAEMON_PID=$!
    wait_sock "$BLK_SOCK" "$DAEMON_PID"
}

echo "case,daemon,round,iops,p50_us,p99_us,cpu_us_per_io" >"$OUT/runs.csv"
for c in $CASES; do
    rw=${c%-d*}
    depth=${c##*-d}
    for r in $(seq "$ROUNDS"); do
        order="vhostd qsd"
        [ $((r % 2)) -eq 0 ] && order="qsd vhostd"
        for dmn in $order; do
            tag="$c-$dmn-$r"
            start_daemon "$dmn" "$OUT/logs/$tag.log" || { echo "nbd-side-by-side: $dmn did not start" >&2; exit 1; }
            t0=$(cpu_ticks "$DAEMON_PID")
            taskset -c "$BENCH_CPU" timeout $((RUNTIME + 60)) "$BUILD/vhostd-bench" --socket="$BLK_SOCK" \
                --rw="$rw" --bs=4k --iodepth="$depth" --runtime="$RUNTIME" --completion=interrupt \
                --json >"$OUT/raw/$tag.json"
            t1=$(cpu_ticks "$DAEMON_PID")
            stop_pid "$DAEMON_PID"; DAEMON_PID=""; rm -f "$BLK_SOCK"
            read -r iops p50 p99 ios < <(jq -r '.total | "\(.iops) \(.lat_us.p50) \(.lat_us.p99) \(.ios)"' "$OUT/raw/$tag.json")
            hz=$(getconf CLK_TCK)
            cpu=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v n="$ios" 'BEGIN { printf "%.2f", n ? d / hz * 1e6 / n : 0 }')
            echo "$c,$dmn,$r,$iops,$p50,$p99,$cpu" >>"$OUT/runs.csv"
            echo "$tag: $iops IOPS, p50 $p50 us, p99 $p99 us, $cpu us CPU/IO"
        done
    done
done

# Median per case and daemon.
{
    echo "| case | daemon | IOPS (median) | p50 us | p99 us | daemon CPU us/IO |"
    echo "|---|---|---|---|---|---|"
    for c in $CASES; do
        for dmn in vhostd qsd; do
            awk -F, -v c="$c" -v d="$dmn" '$1 == c && $2 == d { print $4, $5, $6, $7 }' "$OUT/runs.csv" |
                sort -n | awk -v c="$c" -v d="$dmn" '{ l[NR] = $0 } END { split(l[int((NR + 1) / 2)], f, " ");
                    printf "| %s | %s | %.0f | %.1f | %.1f | %.2f |\n", c, d, f[1], f[2], f[3], f[4] }'
        done
    done
} | tee "$OUT/side-by-side.md"
