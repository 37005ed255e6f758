#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/profile.sh: where does each daemon's time go, per I/O? For vhostd and
# qemu-storage-daemon under the same vhostd-bench load (null backend, 4 KiB
# randread, 1 queue, iodepth 32 by default; daemon pinned to CPU 1, bench to
# CPU 0, as in bench/side-by-side.sh):
#   1. syscalls and context switches per I/O: `perf stat` on every
#      syscalls:sys_enter_* tracepoint of the daemon's threads (cheap: no
#      ptrace, unlike strace -c, so batching is not distorted);
#   2. CPU profile: `perf record -e cpu-clock -g` (software clock: this VM has
#      no hardware counters), kernel/user split and the top symbols;
#   3. user-space instructions per I/O: `valgrind --tool=callgrind` on the
#      daemon for a fixed number of I/Os (--callgrind-ios), total Ir / I/Os and
#      the top functions (self cost). Kernel instructions are not counted.
#   4. the machine's sleep/wake-up cost: bench/wakeup_pingpong (eventfd
#      ping-pong across the two CPUs and on one CPU).
# Output: DIR/profile/ (default build/bench/profile), summary in profile.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

usage() {
    cat <<'EOF'
usage: bench/profile.sh [options]
  --runtime S          seconds per measured run (default 5)
  --iodepth N          (default 32)
  --backend B          null (default) | file (a 256 MiB image in DIR, page cache warmed)
  --rw MODE            randread (default) | randwrite
  --poll MODE          never (default: event mode, vhostd --poll never and qsd
                       poll-max-ns=0; spin loops would blur per-I/O counts) | adaptive
  --completion MODE    interrupt (default) | poll (the bench's)
  --callgrind-ios N    I/Os under callgrind (default 200000; 0 skips callgrind)
  --daemons LIST       vhostd,qsd (default both)
  --daemon-cpu N       (default 1)
  --bench-cpu N        (default 0)
  --out DIR            (default build/bench/profile)
  --build DIR          (default build)
EOF
}

RUNTIME=5
DEPTH=32
BACKEND=null
RW=randread
POLL=never
COMPL=interrupt
CG_IOS=200000
DAEMONS=vhostd,qsd
DCPU=1
BCPU=0
OUT="$root/build/bench/profile"
BUILD="$root/build"
while [ $# -gt 0 ]; do
    case $1 in
    --runtime=*) RUNTIME=${1#*=} ;;
    --iodepth=*) DEPTH=${1#*=} ;;
    --backend=*) BACKEND=${1#*=} ;;
    --rw=*) RW=${1#*=} ;;
    --poll=*) POLL=${1#*=} ;;
    --completion=*) COMPL=${1#*=} ;;
    --callgrind-ios=*) CG_IOS=${1#*=} ;;
    --daemons=*) DAEMONS=${1#*=} ;;
    --daemon-cpu=*) DCPU=${1#*=} ;;
    --bench-cpu=*) BCPU=${1#*=} ;;
    --out=*) OUT=${1#*=} ;;
    --build=*) BUILD=${1#*=} ;;
    --help | -h) usage; exit 0 ;;
    *) echo "profile: unknown option $1 (options take --opt=VALUE)" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
case $POLL in never | adaptive) ;; *) echo "profile: --poll never|adaptive" >&2; exit 2 ;; esac
case $BACKEND in null | file) ;; *) echo "profile: --backend null|file" >&2; exit 2 ;; esac
case $RW in randread | randwrite) ;; *) echo "profile: --rw randread|randwrite" >&2; exit 2 ;; esac

for tool in perf valgrind callgrind_annotate qemu-storage-daemon jq taskset cc; do
    command -v "$tool" >/dev/null || { echo "profile: $tool not found (see bench/packages.txt)" >&2; exit 1; }
done
mkdir -p "$OUT"
IMAGE="$OUT/profile.img"
RUN=$(mktemp -d /tmp/vhd-prof.XXXXXX)
cp "$BUILD/vhostd" "$BUILD/vhostd-bench" "$RUN/"
VHOSTD="$RUN/vhostd"
BENCH="$RUN/vhostd-bench"
cc -O2 -pthread -o "$RUN/wakeup_pingpong" "$root/bench/wakeup_pingpong.c"

DPID=""
PPID_PERF=""
BPID=""
stop_pid() {
    local pid=$1 sig=${2:-TERM}
    [ -n "$pid" ] || return 0
    kill -"$sig" "$pid" 2>/dev/null || true
    for _ in $(seq 300); do # valgrind needs a while to write its output
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    stop_pid "$BPID"
    stop_pid "$PPID_PERF" INT
    stop_pid "$DPID"
    rm -rf "$RUN"
    rm -f "$IMAGE"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [ "$BACKEND" = file ]; then
    [ "$(stat -c %s "$IMAGE" 2>/dev/null)" = $((256 << 20)) ] ||
        dd if=/dev/zero of="$IMAGE" bs=1M count=256 conv=fsync status=none
fi

# daemon_cmd DAEMON SOCK: the daemon's command line (1 queue).
daemon_cmd() {
    local d=$1 sock=$2
    if [ "$d" = vhostd ]; then
        local be="backend=null,size=8G"
        [ "$BACKEND" = file ] && be="image=$IMAGE"
        # --sandbox off: valgrind and perf need syscalls the filter refuses.
        echo "$VHOSTD --workers 1 --poll $POLL --sandbox off --log-level warn --blk socket=$sock,$be,queues=1"
    else
        local p="" bdev="driver=null-co,node-name=n,size=8589934592,read-zeroes=on"
        [ "$POLL" = never ] && p=",poll-max-ns=0"
        [ "$BACKEND" = file ] && bdev="driver=file,node-name=n,filename=$IMAGE,aio=io_uring,cache.direct=off"
        echo "qemu-storage-daemon --object iothread,id=io0$p --blockdev $bdev --export type=vhost-user-blk,id=e,node-name=n,addr.type=unix,addr.path=$sock,writable=on,num-queues=1,iothread=io0"
    fi
}

start_daemon() { # start_daemon PREFIX-CMD... : sets DPID, waits for $SOCK
    rm -f "$SOCK"
    if [ "$BACKEND" = file ]; then cat "$IMAGE" >/dev/null; fi
    # shellcheck disable=SC2068
    taskset -c "$DCPU" $@ >"$LOG" 2>&1 &
    DPID=$!
    for _ in $(seq 600); do
        [ -S "$SOCK" ] && return 0
        kill -0 "$DPID" 2>/dev/null || { echo "profile: daemon died, see $LOG" >&2; exit 1; }
        sleep 0.05
    done
    echo "profile: no socket $SOCK" >&2
    exit 1
}

run_bench() { # run_bench JSON EXTRA-ARGS...
    local json=$1
    shift
    taskset -c "$BCPU" "$BENCH" --socket="$SOCK" --rw="$RW" --bs=4k --iodepth="$DEPTH" \
        --numjobs=1 --completion="$COMPL" --json "$@" >"$json" 2>/dev/null &
    BPID=$!
    wait "$BPID"
    BPID=""
}

MD="$OUT/profile.md"
{
    echo "# profile: $BACKEND 4K $RW, 1 queue, iodepth $DEPTH, poll=$POLL, bench completion=$COMPL"
    echo
    echo "loadavg at start: $(cat /proc/loadavg)"
    echo
} >"$MD"

IFS=, read -r -a dlist <<<"$DAEMONS"
for d in "${dlist[@]}"; do
    SOCK="$RUN/$d.sock"
    LOG="$OUT/$d-daemon.log"
    cmd=$(daemon_cmd "$d" "$SOCK")

    # ---- 1. syscalls and context switches per I/O ----
    echo "profile: $d: syscalls (perf stat)" >&2
    start_daemon "$cmd"
    perf stat -x, -o "$OUT/$d-perfstat.csv" \
        -e 'syscalls:sys_enter_*' -e context-switches,cpu-migrations,task-clock -p "$DPID" &
    PPID_PERF=$!
    sleep 0.5
    run_bench "$OUT/$d-perfstat-bench.json" --runtime="$RUNTIME"
    stop_pid "$PPID_PERF" INT
    PPID_PERF=""
    stop_pid "$DPID"
    DPID=""
    ios=$(jq .total.ios "$OUT/$d-perfstat-bench.json")
    kicks=$(jq '.jobs[0].kicks' "$OUT/$d-perfstat-bench.json")
    sleeps=$(jq '.jobs[0].sleeps' "$OUT/$d-perfstat-bench.json")
    {
        echo "## $d"
        echo
        daemon_cmd "$d" SOCK | sed "s|$RUN/||"
        echo
        echo "### syscalls per I/O (perf stat, ${RUNTIME}s, $ios I/Os, $(jq .total.iops "$OUT/$d-perfstat-bench.json") IOPS)"
        echo
        echo "bench side: $(awk -v k="$kicks" -v n="$ios" 'BEGIN { printf "%.4f", k / n }') kicks/IO, $(awk -v k="$sleeps" -v n="$ios" 'BEGIN { printf "%.4f", k / n }') bench sleeps (waits on the call eventfd)/IO"
        echo
        echo "| event | count | per I/O |"
        echo "|---|--:|--:|"
        awk -F, -v n="$ios" '
            $1 ~ /^[0-9.]+$/ && $3 ~ /syscalls:sys_enter_/ && $1 > 0 {
                name = $3; sub("syscalls:sys_enter_", "", name); tot += $1
                line[name] = $1 }
            $3 == "context-switches" || $3 == "cpu-migrations" { other[$3] = $1 }
            $3 == "task-clock" { tc = $1 }
            END {
                for (k in line) printf "| %s | %d | %.4f |\n", k, line[k], line[k] / n | "sort -t\"|\" -k3 -nr"
                close("sort -t\"|\" -k3 -nr")
                printf "| **all syscalls** | %d | **%.4f** |\n", tot, tot / n
                for (k in other) printf "| %s | %d | %.4f |\n", k, other[k], other[k] / n
                printf "| task-clock ms | %.1f | %.3f us |\n", tc, tc * 1000 / n
            }' "$OUT/$d-perfstat.csv"
        echo
    } >>"$MD"

    # ---- 2. CPU profile ----
    echo "profile: $d: perf record" >&2
    start_daemon "$cmd"
    perf record -q -e cpu-clock -F 2999 -g -o "$OUT/$d-perf.data" -p "$DPID" 2>/dev/null &
    PPID_PERF=$!
    sleep 0.5
    run_bench "$OUT/$d-record-bench.json" --runtime="$RUNTIME"
    stop_pid "$PPID_PERF" INT
    PPID_PERF=""
    stop_pid "$DPID"
    DPID=""
    {
        echo "### CPU profile (perf record -e cpu-clock, self time)"
        echo
        echo '```'
        perf report -i "$OUT/$d-perf.data" --stdio --no-children --sort dso -g none 2>/dev/null |
            grep -E '^ +[0-9]' | head -8 || true
        echo
        perf report -i "$OUT/$d-perf.data" --stdio --no-children --sort sym -g none \
            --percent-limit 1.5 2>/dev/null | grep -E '^ +[0-9]' | head -30 || true
        echo '```'
        echo
    } >>"$MD"

    # ---- 3. instructions per I/O (callgrind, user space) ----
    if [ "$CG_IOS" != 0 ]; then
        echo "profile: $d: callgrind ($CG_IOS I/Os)" >&2
        start_daemon valgrind --tool=callgrind --callgrind-out-file="$OUT/$d-callgrind.out" \
            --separate-threads=no "$cmd"
        run_bench "$OUT/$d-callgrind-bench.json" --number_ios="$CG_IOS"
        stop_pid "$DPID"
        DPID=""
        cg_ios=$(jq .total.ios "$OUT/$d-callgrind-bench.json")
        callgrind_annotate --auto=no --threshold=100 "$OUT/$d-callgrind.out" >"$OUT/$d-callgrind.txt" 2>/dev/null || true
        total_ir=$(awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }' "$OUT/$d-callgrind.txt")
        # memset: the null backend zeroes each 4 KiB read buffer (qsd: read-zeroes=on);
        # valgrind counts every iteration of `rep stosb` as one instruction, so it is
        # shown apart.
        memset_ir=$(awk '/^ *[0-9,]+ \(/ && /:[_a-z0-9]*memset/ { gsub(",", "", $1); t += $1 } END { print t + 0 }' "$OUT/$d-callgrind.txt")
        {
            echo "### user-space instructions per I/O (callgrind, $cg_ios I/Os, includes start-up and connection set-up)"
            echo
            awk -v t="$total_ir" -v m="$memset_ir" -v n="$cg_ios" 'BEGIN {
                printf "total Ir %d: %.0f instructions per I/O; memset (zeroing the 4 KiB buffer, one Ir per rep-stosb byte) %.0f per I/O; **without memset: %.0f instructions per I/O**\n", t, t / n, m / n, (t - m) / n }'
            echo
            echo '```'
            grep -E '^ *[0-9,]+ \(' "$OUT/$d-callgrind.txt" | sed -E 's|/tmp/vhd-prof[^/]*/||; s|\[/usr/lib/x86_64-linux-gnu/|[|' | head -25 || true
            echo '```'
            echo
        } >>"$MD"
    fi
done

# ---- 4. the machine: sleep/wake-up cost ----
echo "profile: wake-up ping-pong" >&2
{
    echo "## the machine: eventfd ping-pong (bench/wakeup_pingpong.c)"
    echo
    echo '```'
    echo "cross-CPU ($BCPU <-> $DCPU): $("$RUN/wakeup_pingpong" "$BCPU" "$DCPU" 2)"
    echo "same CPU ($DCPU <-> $DCPU):   $("$RUN/wakeup_pingpong" "$DCPU" "$DCPU" 2)"
    echo '```'
    echo
    echo "loadavg at end: $(cat /proc/loadavg)"
} >>"$MD"
cat "$MD"
