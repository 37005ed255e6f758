#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/side-by-side.sh: vhostd against qemu-storage-daemon (qsd), and SPDK's
# vhost target when --spdk-vhost is given (null cases), driven by the very same
# vhostd-bench settings, run alternately (A B [C], then B [C] A, ...) for N
# rounds so that the machine's drift hits every daemon alike. For every run it
# keeps the bench's --json, and the daemon's CPU time (utime+stime from
# /proc/PID/stat, plus the per-thread schedstat sum in ns as a finer cross-check)
# read before and after the run: CPU per I/O = delta / I/Os done.
#
# Output (default build/bench/): runs.csv (one line per run), raw/*.json (the
# bench's output), logs/ (daemon logs), side-by-side.md (the table, also on
# stdout), iops-by-iodepth.png (gnuplot), env.txt (versions, load average, CPU
# pressure, and the wake-up cost of the machine from bench/wakeup_pingpong.c).
#
# Pinning (2-CPU machine): the daemon under test, all its threads, on
# --daemon-cpu (default 1); vhostd-bench, all its jobs, on --bench-cpu (default
# 0). Each side owns one CPU, so a polling daemon cannot starve the bench and
# vice versa; vhostd runs with --workers 1, the same single thread that serves
# every queue in qsd (one iothread). See docs/perf-log/2026-11-30.md ("Method") for the rationale.
#
# Every process the script starts is stopped by pid on every exit path (normal
# end, error, SIGINT/SIGTERM); sockets are removed, the image too unless
# --keep-image.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

usage() {
    cat <<'EOF'
usage: bench/side-by-side.sh [options]

  --rounds N          A/B rounds per case (default 3)
  --runtime S         seconds per run (default 5)
  --out DIR           results directory (default build/bench)
  --configs LIST      comma-separated subset of: event,adaptive,adaptive-benchpoll,
                      qsd-aio-threads,shared-event (default: all)
  --only REGEX        run only the cases whose name matches REGEX (e.g. 'null-.*-q1-')
  --file-mode MODE    cache (default: buffered I/O, image warmed in the page cache
                      before every file run) | direct (O_DIRECT on both daemons)
  --image-size SIZE   file-backend image size, written with dd (default 1G)
  --daemon-cpu N      CPU for the daemon under test (default 1)
  --bench-cpu N       CPU for vhostd-bench (default 0)
  --vhostd-sandbox M  vhostd --sandbox on|off|log (default on: vhostd's default)
  --build DIR         where vhostd and vhostd-bench are built (default build)
  --spdk-vhost PATH   also run SPDK's vhost target (an SPDK tree's build/bin/vhost,
                      e.g. as built by bench/spdk-side-by-side.sh) in the null cases:
                      a null bdev (8 GiB, 4 KiB blocks), one vhost-blk controller,
                      reactor and controller on the daemon CPU, --no-huge -s 1024 -u
  --spdk-rpc PATH     its scripts/rpc.py (default: ../../scripts/rpc.py from the binary)
  --keep-image        do not remove the image at the end
  --no-plot           skip the gnuplot PNG
  --help

Cases: null-randread-q{1,2}-d{1,32,128}; file-randread-q1-d32,
file-randwrite-q1-d32 (4 KiB, numjobs = queues).
EOF
}

ROUNDS=3
RUNTIME=5
OUT="$root/build/bench"
CONFIGS="event,adaptive,adaptive-benchpoll,qsd-aio-threads,shared-event"
ONLY=""
FILE_MODE=cache
IMAGE_SIZE=1G
DCPU=1
BCPU=0
VHOSTD_SANDBOX=on
BUILD="$root/build"
KEEP_IMAGE=0
PLOT=1
SPDK_VHOST=""
SPDK_RPC=""

# need "$@": the option's value, from --opt=VALUE or from the next argument.
need() {
    if [ -z "$val" ]; then
        [ $# -ge 2 ] || { echo "side-by-side: $arg needs a value" >&2; exit 2; }
        val=$2
        shift_extra=1
    fi
}
while [ $# -gt 0 ]; do
    arg=$1
    val=""
    shift_extra=0
    case $arg in
    --*=*) val=${arg#*=}; arg=${arg%%=*} ;;
    esac
    case $arg in
    --rounds) need "$@"; ROUNDS=$val ;;
    --runtime) need "$@"; RUNTIME=$val ;;
    --out) need "$@"; OUT=$val ;;
    --configs) need "$@"; CONFIGS=$val ;;
    --only) need "$@"; ONLY=$val ;;
    --file-mode) need "$@"; FILE_MODE=$val ;;
    --image-size) need "$@"; IMAGE_SIZE=$val ;;
    --daemon-cpu) need "$@"; DCPU=$val ;;
    --bench-cpu) need "$@"; BCPU=$val ;;
    --vhostd-sandbox) need "$@"; VHOSTD_SANDBOX=$val ;;
    --build) need "$@"; BUILD=$val ;;
    --spdk-vhost) need "$@"; SPDK_VHOST=$val ;;
    --spdk-rpc) need "$@"; SPDK_RPC=$val ;;
    --keep-image) KEEP_IMAGE=1 ;;
    --no-plot) PLOT=0 ;;
    --help | -h) usage; exit 0 ;;
    *) echo "side-by-side: unknown option $arg" >&2; usage >&2; exit 2 ;;
    esac
    shift $((1 + shift_extra))
done

case $FILE_MODE in cache | direct) ;; *) echo "side-by-side: --file-mode cache|direct" >&2; exit 2 ;; esac
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || { echo "side-by-side: --rounds N" >&2; exit 2; }
[[ $RUNTIME =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "side-by-side: --runtime SECONDS" >&2; exit 2; }

for tool in qemu-storage-daemon jq python3 taskset timeout; do
    command -v "$tool" >/dev/null || { echo "side-by-side: $tool not found (see bench/packages.txt)" >&2; exit 1; }
done
for b in vhostd vhostd-bench; do
    [ -x "$BUILD/$b" ] || { echo "side-by-side: $BUILD/$b missing: build first (ninja -C build)" >&2; exit 1; }
done

DAEMONS="vhostd qsd"
if [ -n "$SPDK_VHOST" ]; then
    [ -x "$SPDK_VHOST" ] || { echo "side-by-side: --spdk-vhost $SPDK_VHOST: not an executable (an SPDK tree's build/bin/vhost)" >&2; exit 2; }
    [ -n "$SPDK_RPC" ] || SPDK_RPC=$(dirname "$SPDK_VHOST")/../../scripts/rpc.py
    [ -f "$SPDK_RPC" ] || { echo "side-by-side: SPDK's rpc.py not found at $SPDK_RPC (--spdk-rpc PATH)" >&2; exit 2; }
    python3 "$SPDK_RPC" --help >/dev/null 2>&1 || { echo "side-by-side: python3 $SPDK_RPC does not run (python3-tabulate, python3-jinja2, python3-yaml?)" >&2; exit 2; }
    DAEMONS="vhostd qsd spdk"
fi

mkdir -p "$OUT/raw" "$OUT/logs" "$OUT/bin"
RUN=$(mktemp -d /tmp/vhd-sbs.XXXXXX) # sockets (short paths: sun_path is 108 bytes)
IMAGE="$OUT/bench.img"

# Snapshot the binaries: others rebuild build/ while we measure; every run of
# this invocation must use the same code.
cp "$BUILD/vhostd" "$BUILD/vhostd-bench" "$OUT/bin/"
if command -v cc >/dev/null; then
    cc -O2 -pthread -o "$OUT/bin/wakeup_pingpong" "$root/bench/wakeup_pingpong.c" ||
        echo "side-by-side: cannot build bench/wakeup_pingpong.c: no calibration" >&2
fi
VHOSTD="$OUT/bin/vhostd"
BENCH="$OUT/bin/vhostd-bench"

DPID="" # daemon under test
BPID="" # vhostd-bench (through timeout)

# Stop pid $1: SIGTERM, up to 5 s, then SIGKILL; reap it.
stop_pid() {
    local pid=$1
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
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
    BPID=""
    stop_pid "$DPID"
    DPID=""
    rm -rf "$RUN"
    if [ "$KEEP_IMAGE" = 0 ]; then rm -f "$IMAGE"; fi
    exit "$rc"
}
trap cleanup EXIT
trap 'echo "side-by-side: interrupted" >&2; exit 130' INT TERM

# CPU seconds (utime+stime, whole process) of pid $1, and the sum of its
# threads' schedstat run times in ns. Prints "ticks ns".
read_cpu() {
    local pid=$1 stat ns=0 t
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || { echo "0 0"; return; }
    stat=${stat##*) } # the comm field may hold spaces: cut after its ')'
    for t in /proc/"$pid"/task/*/schedstat; do
        read -r v _ <"$t" 2>/dev/null && ns=$((ns + v))
    done
    echo "$stat" | awk -v ns="$ns" '{ print $12 + $13, ns }'
}

# CPU seconds (user+sys) of this shell's reaped children so far: the bench's
# share is the difference around its wait (timeout's own is negligible).
# (`times` runs in this shell, not in a subshell: a fork starts with zero times).
children_cpu() {
    times >"$RUN/times"
    awk 'NR == 2 {
        n = split($0, f, " "); t = 0
        for (i = 1; i <= n; i++) { split(f[i], ms, "m"); t += ms[1] * 60 + ms[2] }
        printf "%.3f", t }' "$RUN/times"
}

wait_socket() {
    local sock=$1 pid=$2
    for _ in $(seq 100); do
        [ -S "$sock" ] && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# ---- configurations: how each daemon is run, and the bench's completion mode ----
#  event              vhostd --poll never      / qsd iothread poll-max-ns=0 ; bench interrupt
#  adaptive           vhostd --poll adaptive   / qsd iothread (poll-max-ns 32768, its
#                     --poll-us 50 (default)     default adaptive polling)   ; bench interrupt
#  adaptive-benchpoll as adaptive, bench --completion=poll (1 queue only: two polling
#                     jobs on one bench CPU would starve each other)
#  qsd-aio-threads    as adaptive, qsd with aio=threads (its default) instead of
#                     aio=io_uring; file cases only
#  shared-event       as event, but the bench shares the daemon's CPU: no cross-CPU
#                     wake-ups (which cost ~100 us on a loaded 2-vCPU VM), so the sum
#                     of both sides' CPU per I/O bounds IOPS
cfg_vhostd_poll() { case $1 in event | shared-event) echo "--poll never" ;; *) echo "--poll adaptive --poll-us 50" ;; esac; }
cfg_qsd_poll() { case $1 in event | shared-event) echo ",poll-max-ns=0" ;; *) echo "" ;; esac; }
cfg_completion() { case $1 in adaptive-benchpoll) echo poll ;; *) echo interrupt ;; esac; }
cfg_qsd_aio() { case $1 in qsd-aio-threads) echo threads ;; *) echo io_uring ;; esac; }
cfg_bench_cpu() { case $1 in shared-event) echo "$DCPU" ;; *) echo "$BCPU" ;; esac; }

# ---- cases: name backend rw queues iodepth ----
CASES=()
for q in 1 2; do
    for d in 1 32 128; do CASES+=("null-randread-q$q-d$d null randread $q $d"); done
done
CASES+=("file-randread-q1-d32 file randread 1 32" "file-randwrite-q1-d32 file randwrite 1 32")

# Rows: "config case..." applicable and selected.
ROWS=()
IFS=, read -r -a cfgs <<<"$CONFIGS"
for cfg in "${cfgs[@]}"; do
    case $cfg in event | adaptive | adaptive-benchpoll | qsd-aio-threads | shared-event) ;; *) echo "side-by-side: unknown config $cfg" >&2; exit 2 ;; esac
    for c in "${CASES[@]}"; do
        read -r name backend _ q _ <<<"$c"
        [ "$cfg" = adaptive-benchpoll ] && [ "$q" != 1 ] && continue
        [ "$cfg" = qsd-aio-threads ] && [ "$backend" != file ] && continue
        if [ -n "$ONLY" ] && ! [[ $name =~ $ONLY ]]; then continue; fi
        ROWS+=("$cfg $c")
    done
done
[ ${#ROWS[@]} -gt 0 ] || { echo "side-by-side: no case selected" >&2; exit 2; }

need_file=0
for r in "${ROWS[@]}"; do [[ $r == *" file "* ]] && need_file=1; done

# ---- the image (file backend): preallocated with real blocks, shared by both daemons ----
if [ "$need_file" = 1 ]; then
    want=$(numfmt --from=iec "$IMAGE_SIZE")
    if [ ! -f "$IMAGE" ] || [ "$(stat -c %s "$IMAGE")" != "$want" ]; then
        echo "side-by-side: writing a $IMAGE_SIZE image $IMAGE" >&2
        rm -f "$IMAGE"
        dd if=/dev/zero of="$IMAGE" bs=1M count=$((want >> 20)) conv=fsync status=none
    fi
fi

# ---- one run ----
CSV="$OUT/runs.csv"
echo "config,case,backend,rw,queues,iodepth,completion,daemon,round,iops,p50_us,p99_us,ios,runtime_s,cpu_s,cpu_sched_s,cpu_us_per_io,bench_cpu_s,load1,status" >"$CSV"

# run_one CONFIG CASE BACKEND RW QUEUES DEPTH DAEMON ROUND
run_one() {
    local cfg=$1 name=$2 backend=$3 rw=$4 q=$5 depth=$6 daemon=$7 round=$8
    local sock="$RUN/$daemon.sock" tag="${cfg}_${name}_${daemon}_r${round}"
    local json="$OUT/raw/$tag.json" log="$OUT/logs/$tag.log" compl
    compl=$(cfg_completion "$cfg")
    rm -f "$sock"

    if [ "$backend" = file ] && [ "$FILE_MODE" = cache ]; then
        cat "$IMAGE" >/dev/null # same warm page cache for both daemons
    fi
    local -a cmd
    if [ "$daemon" = vhostd ]; then
        local spec="socket=$sock,queues=$q"
        if [ "$backend" = null ]; then
            spec+=",backend=null,size=8G"
        else
            spec+=",image=$IMAGE,direct=$([ "$FILE_MODE" = direct ] && echo on || echo off)"
        fi
        # shellcheck disable=SC2207
        cmd=("$VHOSTD" --workers 1 $(cfg_vhostd_poll "$cfg") --sandbox "$VHOSTD_SANDBOX"
            --log-level warn --blk "$spec")
    elif [ "$daemon" = spdk ]; then
        # SPDK always polls (its reactor): the config only changes the bench's completion.
        # The controller is named after the socket file SPDK creates in -S DIR.
        cmd=("$SPDK_VHOST" -S "$RUN" --no-huge -s 1024 -m "$(printf '0x%x' $((1 << DCPU)))" -u
            -r "$RUN/spdk-rpc.sock")
    else
        local bdev
        if [ "$backend" = null ]; then
            # read-zeroes=on: vhostd's null backend zeroes read buffers too (same work).
            bdev="driver=null-co,node-name=n,size=8589934592,read-zeroes=on"
        else
            bdev="driver=file,node-name=n,filename=$IMAGE,aio=$(cfg_qsd_aio "$cfg")"
            bdev+=",cache.direct=$([ "$FILE_MODE" = direct ] && echo on || echo off)"
        fi
        cmd=(qemu-storage-daemon --object "iothread,id=io0$(cfg_qsd_poll "$cfg")"
            --blockdev "$bdev"
            --export "type=vhost-user-blk,id=e,node-name=n,addr.type=unix,addr.path=$sock,writable=on,num-queues=$q,iothread=io0")
    fi
    echo "${cmd[*]}" >"$log"
    if [ "$daemon" = spdk ]; then
        # A build against packaged DPDK is shared: its libraries stay in the tree (build/lib).
        LD_LIBRARY_PATH="$(dirname "$SPDK_VHOST")/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            taskset -c "$DCPU" "${cmd[@]}" >>"$log" 2>&1 &
    else
        taskset -c "$DCPU" "${cmd[@]}" >>"$log" 2>&1 &
    fi
    DPID=$!
    local status=ok
    if [ "$daemon" = spdk ]; then
        local mask
        mask=$(printf '0x%x' $((1 << DCPU)))
        if ! wait_socket "$RUN/spdk-rpc.sock" "$DPID" ||
            ! python3 "$SPDK_RPC" -s "$RUN/spdk-rpc.sock" bdev_null_create Null0 8192 4096 >>"$log" 2>&1 ||
            ! python3 "$SPDK_RPC" -s "$RUN/spdk-rpc.sock" vhost_create_blk_controller --cpumask "$mask" \
                "$(basename "$sock")" Null0 >>"$log" 2>&1; then
            status="daemon-start-failed"
        fi
    fi
    if [ "$status" = ok ] && ! wait_socket "$sock" "$DPID"; then
        status="daemon-start-failed"
    fi
    local c0 c1 load1 brc=0 t0 t1
    load1=$(cut -d' ' -f1 /proc/loadavg)
    if [ "$status" = ok ]; then
        c0=$(read_cpu "$DPID")
        children_cpu >"$RUN/t0"
        taskset -c "$(cfg_bench_cpu "$cfg")" timeout -k 5 "$(awk -v r="$RUNTIME" 'BEGIN { print int(r) + 40 }')" \
            "$BENCH" --socket="$sock" --rw="$rw" --bs=4k --iodepth="$depth" --numjobs="$q" \
            --runtime="$RUNTIME" --completion="$compl" --json >"$json" 2>>"$log" &
        BPID=$!
        wait "$BPID" || brc=$?
        BPID=""
        c1=$(read_cpu "$DPID")
        children_cpu >"$RUN/t1"
        t0=$(cat "$RUN/t0")
        t1=$(cat "$RUN/t1")
        if ! kill -0 "$DPID" 2>/dev/null; then
            status="daemon-died"
        elif [ "$brc" != 0 ]; then
            status=bench-rc-$brc
        fi
    fi
    stop_pid "$DPID"
    [ "$daemon" = spdk ] && rm -rf "/var/run/dpdk/spdk_pid$DPID" "$RUN/spdk-rpc.sock"
    DPID=""
    rm -f "$sock"

    local iops=0 p50=0 p99=0 ios=0 secs=0 cpu=0 cpus=0 per=0 bcpu
    bcpu=$(awk -v a="${t0:-0}" -v b="${t1:-0}" 'BEGIN { printf "%.3f", b - a }')
    if [ "$status" = ok ] && jq -e .total "$json" >/dev/null 2>&1; then
        read -r iops p50 p99 ios secs < <(jq -r '.total | "\(.iops) \(.lat_us.p50) \(.lat_us.p99) \(.ios) \(.runtime_s)"' "$json")
        read -r cpu cpus per < <(awk -v a="$c0" -v b="$c1" -v n="$ios" -v hz="$(getconf CLK_TCK)" 'BEGIN {
            split(a, x, " "); split(b, y, " ");
            t = (y[1] - x[1]) / hz; s = (y[2] - x[2]) / 1e9;
            printf "%.3f %.4f %.4f\n", t, s, (n > 0 ? s * 1e6 / n : 0) }')
    elif [ "$status" = ok ]; then
        status=no-json
    fi
    echo "$cfg,$name,$backend,$rw,$q,$depth,$compl,$daemon,$round,$iops,$p50,$p99,$ios,$secs,$cpu,$cpus,$per,$bcpu,$load1,$status" >>"$CSV"
    printf '  %-19s %-22s %-7s r%s %10.0f IOPS  p99 %8.1f us  %6.2f us CPU/IO  %s\n' \
        "$cfg" "$name" "$daemon" "$round" "$iops" "$p99" "$per" "$status" >&2
}

# ---- environment ----
# CPU pressure: microseconds during which some runnable task waited for a CPU
# (PSI; 0 when the kernel has no PSI). The VM reports no steal time, so this
# and the load average are the noise indicators.
psi_some_us() { awk '/^some/ { sub("total=", "", $5); print $5 + 0; f = 1 } END { if (!f) print 0 }' /proc/pressure/cpu 2>/dev/null || echo 0; }

# The machine's sleep/wake-up cost (bench/wakeup_pingpong.c): eventfd ping-pong
# across the daemon and bench CPUs, and on one CPU.
calibrate() {
    if [ -x "$OUT/bin/wakeup_pingpong" ]; then
        echo "wake-up ping-pong $1, CPUs $BCPU<->$DCPU: $("$OUT/bin/wakeup_pingpong" "$BCPU" "$DCPU" 2)"
        echo "wake-up ping-pong $1, CPUs $DCPU<->$DCPU: $("$OUT/bin/wakeup_pingpong" "$DCPU" "$DCPU" 2)"
    fi
}
{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -srm), $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')"
    echo "vhostd: $(cd "$root" && git describe --always --dirty 2>/dev/null || echo unknown) ($("$VHOSTD" --version 2>&1 | head -1))"
    echo "qsd: $(qemu-storage-daemon --version | head -1)"
    if [ -n "$SPDK_VHOST" ]; then
        echo "spdk: $SPDK_VHOST ($(cat "$(dirname "$SPDK_VHOST")/../../VERSION" 2>/dev/null || git -C "$(dirname "$SPDK_VHOST")" describe --always 2>/dev/null || echo unknown))"
    fi
    echo "buildtype: $(meson introspect "$BUILD" --buildoptions 2>/dev/null | jq -r '.[] | select(.name=="buildtype") | .value' 2>/dev/null || echo unknown)"
    echo "settings: rounds=$ROUNDS runtime=${RUNTIME}s daemon-cpu=$DCPU bench-cpu=$BCPU file-mode=$FILE_MODE image=$IMAGE_SIZE vhostd-sandbox=$VHOSTD_SANDBOX"
    echo "loadavg before: $(cat /proc/loadavg)"
    calibrate before
} >"$OUT/env.txt"
psi0=$(psi_some_us)
t_start=$(date +%s)

read -r -a daemons <<<"$DAEMONS"
echo "side-by-side: ${#ROWS[@]} cases x ${#daemons[@]} daemons ($DAEMONS) x $ROUNDS rounds, ${RUNTIME}s each; results in $OUT" >&2
for round in $(seq "$ROUNDS"); do
    # Rotate who goes first: round 1 vhostd qsd [spdk], round 2 qsd [spdk] vhostd, ...
    order=""
    for i in $(seq 0 $((${#daemons[@]} - 1))); do
        order+=" ${daemons[$(((round - 1 + i) % ${#daemons[@]}))]}"
    done
    for row in "${ROWS[@]}"; do
        read -r cfg name backend rw q depth <<<"$row"
        for daemon in $order; do
            # SPDK has a null bdev here, no file-backed one.
            [ "$daemon" = spdk ] && [ "$backend" != null ] && continue
            run_one "$cfg" "$name" "$backend" "$rw" "$q" "$depth" "$daemon" "$round"
        done
    done
done

psi1=$(psi_some_us)
wall=$(($(date +%s) - t_start))
{
    echo "loadavg after: $(cat /proc/loadavg)"
    echo "wall: $wall s"
    awk -v a="$psi0" -v b="$psi1" -v w="$wall" \
        'BEGIN { printf "CPU pressure during the runs: some task waited for a CPU %.0f%% of the time (PSI)\n", (w > 0 ? (b - a) / 1e4 / w : 0) }'
    calibrate after
} >>"$OUT/env.txt"

python3 "$root/bench/summarize.py" "$OUT"
if [ "$PLOT" = 1 ]; then
    if command -v gnuplot >/dev/null; then
        # (columns of cases not run are NaN: gnuplot warns about them, harmlessly)
        rm -f "$OUT/iops-by-iodepth.png"
        gnuplot -e "datadir='$OUT'" "$root/bench/iops-by-iodepth.gp" 2> >(grep -v 'no valid points' >&2) || true
        if [ -s "$OUT/iops-by-iodepth.png" ]; then
            echo "side-by-side: plot $OUT/iops-by-iodepth.png" >&2
        fi
    else
        echo "side-by-side: gnuplot not found: no plot (see bench/packages.txt)" >&2
    fi
fi
