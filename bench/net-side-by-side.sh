#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# net-side-by-side.sh - 64-byte packet rate of vhostd's net device against
# DPDK's own vhost PMD (dpdk-testpmd --vdev net_vhost0), both driven by the
# same dpdk-testpmd virtio-user client. A benchmark, not a test: it prints a
# table of median Mpps and ratios, it checks nothing.
#
# Modes (the client's --forward-mode), split and packed rings:
#   txonly  the client only sends: the back-end's dequeue rate (client Tx-pps).
#           Both back-ends try to hand every frame back and find the client's
#           RX ring full (txonly never reads it). DPDK's io forwarding copies
#           each frame into an mbuf before its enqueue finds the ring full;
#           vhostd reads the frame's header and copies the rest only when a
#           receive buffer takes it. Both back-ends idle here: the client's
#           CPU sets the rate (docs/perf-log/2026-12-02.md).
#   io      the client sends back what it receives (start tx_first 8 puts 256
#           frames in circulation): the round-trip rate, one dequeue plus one
#           enqueue per frame on the back-end (client Rx-pps).
#   rxonly  the client only receives: the back-end's enqueue rate (client
#           Rx-pps). Both back-ends generate 64-byte frames: DPDK's vhost
#           testpmd in txonly mode, vhostd with backend=gen (an enqueue with
#           no dequeue on both sides).
# Back-ends: DPDK's vhost testpmd forwards (io) in txonly and io rows;
# vhostd uses backend=loopback there (the same work: each frame dequeued is
# handed back) and backend=gen in the rxonly row.
#
# CPU placement (2-CPU box): the back-end on CPU 0, the client's forwarding
# lcore on CPU 1; the testpmd main lcores float ('0@(0,1),1@N', the issue's
# recipe); vhostd runs under taskset -c 0 with one worker. Runs alternate
# A/B (DPDK, vhostd, DPDK, ...) so slow drift of the machine's load hits
# both; the median of REPS runs is reported.
#
# Environment: REPS (default 3), SECS (measured seconds per run, default 5),
# VHOSTD (default build/vhostd), TESTPMD (default dpdk-testpmd), MODES
# (default "txonly io rxonly"), RINGS (default "split packed"), VHOSTD_ARGS
# (extra global options for vhostd, e.g. "--poll adaptive"),
# BACKEND_CPU (0), CLIENT_CPU (1). Every process is started here, stopped by
# its pid (SIGTERM, then SIGKILL), and sockets and DPDK runtime files are
# removed on exit.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
vhostd=${VHOSTD:-$root/build/vhostd}
testpmd=${TESTPMD:-dpdk-testpmd}
reps=${REPS:-3}
secs=${SECS:-5}
modes=${MODES:-txonly io rxonly}
rings=${RINGS:-split packed}
bcpu=${BACKEND_CPU:-0}
ccpu=${CLIENT_CPU:-1}
work=$(mktemp -d "${TMPDIR:-/tmp}/vhd-netsbs-XXXXXX")
pids=()
fds=()

stop_pid() {
    local pid=$1 i
    kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 0
}

cleanup() {
    local p f
    for f in "${fds[@]}"; do exec {f}>&- 2>/dev/null; done
    fds=()
    for p in "${pids[@]}"; do stop_pid "$p"; done
    pids=()
    rm -rf "$work"
    rm -rf "${XDG_RUNTIME_DIR:-/var/run}/dpdk/vhdsbs-$$-"* /var/run/dpdk/vhdsbs-$$-* 2>/dev/null
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

wait_for() { # FILE REGEX SECONDS PID
    local i
    for i in $(seq 1 $(($3 * 10))); do
        grep -Eq "$2" "$1" 2>/dev/null && return 0
        kill -0 "$4" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# The rate of the second "show port stats all" (the first is the baseline).
pps() { grep -Eo "$2: +[0-9]+" "$1" | sed -n 2p | grep -Eo '[0-9]+$'; }

# Start an interactive testpmd reading commands from a FIFO; sets tp_pid, tp_fd.
start_testpmd() { # NAME LCORES VDEV MODE LOG
    local fifo=$work/$1.in
    mkfifo "$fifo"
    exec {tp_fd}<>"$fifo"
    fds+=("$tp_fd")
    "$testpmd" --no-huge -m 1024 --no-pci --lcores "$2" --file-prefix="vhdsbs-$$-$1" \
        --vdev "$3" -- -i --rxq=1 --txq=1 --nb-cores=1 --total-num-mbufs=16384 \
        --forward-mode="$4" <"$fifo" >"$5" 2>&1 &
    tp_pid=$!
    pids+=("$tp_pid")
}

close_fd() {
    local keep=() f fd=$1
    exec {fd}>&- 2>/dev/null
    for f in "${fds[@]}"; do [ "$f" = "$1" ] || keep+=("$f"); done
    fds=("${keep[@]}")
}

forget() {
    local keep=() p
    for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    pids=("${keep[@]}")
}

# One run: sets res_tx and res_rx (the client's pps, "-" when something failed).
# Runs in this shell (not a subshell), so the EXIT trap knows every pid.
run_one() { # BACKEND(dpdk|vhostd) MODE RING N
    local be=$1 mode=$2 ring=$3 n=$4
    local tag=$be-$mode-$ring-$n sock=$work/$be-$n.sock
    local blog=$work/$tag.backend.log clog=$work/$tag.client.log
    local bpid bfd="" cpid cfd extra="" bmode=io start=start vbe=loopback
    [ "$ring" = packed ] && extra=",packed_vq=1"
    [ "$mode" = rxonly ] && bmode=txonly vbe=gen
    case $mode in io) start="start tx_first 8" ;; esac

    if [ "$be" = dpdk ]; then
        start_testpmd "$tag-be" "0@($bcpu,$ccpu),1@$bcpu" "net_vhost0,iface=$sock,queues=1" \
            "$bmode" "$blog"
        bpid=$tp_pid bfd=$tp_fd
        if ! wait_for "$blog" '^testpmd> ' 60 "$bpid"; then
            echo "   $tag: vhost testpmd did not start" >&2; tail -n 5 "$blog" >&2
            stop_pid "$bpid"; forget "$bpid"; res_tx=- res_rx=-; return
        fi
        echo start >&"$bfd"
    else
        # shellcheck disable=SC2086 # VHOSTD_ARGS is a list of words
        taskset -c "$bcpu" "$vhostd" --workers 1 --poll always ${VHOSTD_ARGS:-} \
            --net "socket=$sock,backend=$vbe,queues=1" >"$blog" 2>&1 &
        bpid=$!
        pids+=("$bpid")
        if ! wait_for "$blog" "listening on" 10 "$bpid"; then
            echo "   $tag: vhostd did not start" >&2; tail -n 5 "$blog" >&2
            stop_pid "$bpid"; forget "$bpid"; res_tx=- res_rx=-; return
        fi
    fi
    start_testpmd "$tag-cl" "0@($bcpu,$ccpu),1@$ccpu" "net_virtio_user0,path=$sock,queues=1$extra" \
        "$mode" "$clog"
    cpid=$tp_pid cfd=$tp_fd
    local tx="-" rx="-"
    if wait_for "$clog" '^testpmd> ' 60 "$cpid"; then
        echo "$start" >&"$cfd"
        sleep 1
        echo "show port stats all" >&"$cfd"
        sleep "$secs"
        echo "show port stats all" >&"$cfd"
        sleep 0.5
        echo "stop" >&"$cfd"
        echo "quit" >&"$cfd"
        local i
        for i in $(seq 1 100); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.1; done
        tx=$(pps "$clog" Tx-pps); rx=$(pps "$clog" Rx-pps)
    else
        echo "   $tag: client testpmd did not start" >&2; tail -n 5 "$clog" >&2
    fi
    close_fd "$cfd"; stop_pid "$cpid"; forget "$cpid"
    if [ -n "$bfd" ]; then
        echo stop >&"$bfd"; echo quit >&"$bfd"
        sleep 0.3
        close_fd "$bfd"
    fi
    stop_pid "$bpid"; forget "$bpid"
    rm -f "$sock" "$work/$tag-be.in" "$work/$tag-cl.in"
    res_tx=${tx:--} res_rx=${rx:--}
}

median() { tr ' ' '\n' | grep -E '^[0-9]+$' | sort -n | awk '{a[NR]=$1} END {
    if (NR == 0) print "-"; else if (NR % 2) print a[(NR + 1) / 2];
    else printf "%d\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }

mpps() { awk -v p="$1" 'BEGIN { if (p == "-") print "-"; else printf "%.3f", p / 1e6 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) print "-";
    else printf "%.2fx", a / b }'; }

command -v "$testpmd" >/dev/null 2>&1 || { echo "dpdk-testpmd not found"; exit 1; }
[ -x "$vhostd" ] || { echo "$vhostd not built"; exit 1; }

echo "# net side by side: $(date -u +%FT%TZ), $(nproc) CPUs, load average$(cut -d' ' -f1-3 /proc/loadavg | sed 's/^/ /')"
echo "# DPDK $(dpkg-query -W -f='${Version}' dpdk-dev 2>/dev/null || echo '?'), vhostd $("$vhostd" --version 2>/dev/null | head -n 1)"
echo "# $reps alternating runs of ${secs} s per cell, 64-byte frames, 1 queue pair;" \
    "back-end on CPU $bcpu, client on CPU $ccpu"
printf '%-7s %-7s %12s %12s %8s   %s\n' mode ring "DPDK Mpps" "vhostd Mpps" ratio "runs (DPDK | vhostd, Mpps)"
for ring in $rings; do
    for mode in $modes; do
        d_all="" v_all=""
        for ((r = 1; r <= reps; r++)); do
            run_one dpdk "$mode" "$ring" "$r"
            if [ "$mode" = txonly ]; then d_all+=" $res_tx"; else d_all+=" $res_rx"; fi
            run_one vhostd "$mode" "$ring" "$r"
            if [ "$mode" = txonly ]; then v_all+=" $res_tx"; else v_all+=" $res_rx"; fi
        done
        dm=$(echo "$d_all" | median); vm=$(echo "$v_all" | median)
        printf '%-7s %-7s %12s %12s %8s   %s |%s\n' "$mode" "$ring" "$(mpps "$dm")" "$(mpps "$vm")" \
            "$(ratio "$vm" "$dm")" "$(for x in $d_all; do printf ' %s' "$(mpps "$x")"; done)" \
            "$(for x in $v_all; do printf ' %s' "$(mpps "$x")"; done)"
    done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
