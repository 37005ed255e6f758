#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# DPDK interop: dpdk-testpmd's virtio-user PMD (net_virtio_user, the same
# driver DPDK applications use) against vhostd's virtio-net loopback, in
# txonly, rxonly and io modes, split and packed rings, with and without
# mergeable receive buffers, with and without VIRTIO_F_IN_ORDER (checked
# negotiated as asked), one and two queue pairs, and one pair more than
# the device has (refused). Frame counts are
# checked on both sides: testpmd's port statistics and vhostd's per-queue
# counters (logged when the front-end disconnects); vhostd must exit 0 on
# SIGTERM after each case. Ends with "N passed, N failed[, N skipped]".
#
# Env: VHOSTD (default build/vhostd), TESTPMD (default dpdk-testpmd),
#      TESTPMD_SECONDS traffic time per case (default 5),
#      TESTPMD_CASES to run a subset (space-separated case names; the others
#      are shown and counted as skipped).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
vhostd=${VHOSTD:-$root/build/vhostd}
testpmd=${TESTPMD:-dpdk-testpmd}
secs=${TESTPMD_SECONDS:-5}
work=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-testpmd-XXXXXX")
passed=0
failed=0
pids=()  # every process we started and have not reaped
in_fd="" # write end of the current testpmd's command FIFO
# shellcheck source=tests/common/cases.sh
. "$root/tests/common/cases.sh"

# Stop one process we started: SIGTERM, up to 10 s, then SIGKILL. By pid only. Its exit
# status in stop_status.
stop_status=0
stop_pid() {
    local pid=$1 i
    stop_status=0
    kill -TERM "$pid" 2>/dev/null
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        echo "   (pid $pid did not stop on SIGTERM: SIGKILL)"
        kill -KILL "$pid" 2>/dev/null
    fi
    wait "$pid" 2>/dev/null || stop_status=$?
    return 0
}

cleanup() {
    local p
    [ -n "$in_fd" ] && exec {in_fd}>&- 2>/dev/null
    in_fd=""
    for p in "${pids[@]}"; do stop_pid "$p"; done
    pids=()
    rm -rf "$work"
    # testpmd's runtime files (one directory per --file-prefix)
    rm -rf "${XDG_RUNTIME_DIR:-/var/run}/dpdk/vhostd-$$-"* /var/run/dpdk/vhostd-$$-* 2>/dev/null
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

forget_pid() {
    local keep=() p
    for p in "${pids[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    pids=("${keep[@]}")
}

# wait_for FILE REGEX SECONDS PID: until REGEX shows up in FILE; fails early if PID exits.
wait_for() {
    local file=$1 re=$2 t=$3 pid=$4 i
    for i in $(seq 1 $((t * 10))); do
        grep -Eq "$re" "$file" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# The value after "KEY:" in the last NIC statistics block of a testpmd log.
nic_stat() {
    awk -v k="$2:" '/NIC statistics for port/ {blk=""} {blk = blk "\n" $0} END {print blk}' "$1" |
        grep -Eo "$2: +[0-9]+" | tail -n 1 | grep -Eo '[0-9]+$'
}

# Rx-pps / Tx-pps of the second "show port stats": the rate over the traffic period.
pps() {
    grep -Eo "$2: +[0-9]+" "$1" | sed -n 2p | grep -Eo '[0-9]+$'
}

# A key=value of vhostd's "total:" line at session end; per-queue with QUEUE.
vstat() {
    grep "stats (session end): total:" "$1" | tail -n 1 | grep -Eo "$2=[0-9]+" | cut -d= -f2
}
vqstat() { # LOG QUEUE KEY
    grep "stats (session end): queue $2 " "$1" | tail -n 1 | grep -Eo "$3=[0-9]+" | cut -d= -f2
}

check() { # NAME DESCRIPTION CONDITION...
    local name=$1 what=$2
    shift 2
    if "$@"; then
        return 0
    fi
    echo "   $name: check failed: $what"
    return 1
}

# run_case NAME QUEUES MODE VDEV_EXTRA
run_case() {
    local name=$1 q=$2 mode=$3 extra=$4
    local sock=$work/$name.sock vlog=$work/$name.vhostd.log tlog=$work/$name.testpmd.log
    local fifo=$work/$name.in vpid tpid ok=1 start_cmd=start

    case_selected "$name" || return 0
    # Two workers when there are two pairs: each pair's rings on its own worker.
    "$vhostd" --workers "$q" --net "socket=$sock,backend=loopback,queues=$q" >"$vlog" 2>&1 &
    vpid=$!
    pids+=("$vpid")
    if ! wait_for "$vlog" "listening on" 10 "$vpid"; then
        echo "   $name: vhostd did not start"; sed 's/^/      /' "$vlog" | tail -n 5
        stop_pid "$vpid"; forget_pid "$vpid"; failed=$((failed + 1)); return 1
    fi

    # testpmd reads its commands from a FIFO we hold open read-write (no blocking open).
    mkfifo "$fifo"
    exec {in_fd}<>"$fifo"
    "$testpmd" --no-huge -m 2048 --no-pci --lcores '0@(0,1),1@(0,1)' \
        --file-prefix="vhostd-$$-$name" \
        --vdev "net_virtio_user0,path=$sock,queues=$q$extra" -- \
        -i --rxq="$q" --txq="$q" --nb-cores=1 --total-num-mbufs=16384 \
        --forward-mode="$mode" <"$fifo" >"$tlog" 2>&1 &
    tpid=$!
    pids+=("$tpid")
    if ! wait_for "$tlog" '^testpmd> ' 90 "$tpid"; then
        echo "   $name: testpmd did not reach its prompt"; tail -n 15 "$tlog" | sed 's/^/      /'
        ok=0
    else
        # io and rxonly: an initial burst from every stream (rxonly then only receives it).
        case $mode in
        io) start_cmd="start tx_first" ;;
        rxonly) start_cmd="start tx_first 4" ;;
        esac
        echo "$start_cmd" >&"$in_fd"
        sleep 1
        echo "show port stats all" >&"$in_fd" # baseline for the pps of the next show
        sleep "$secs"
        echo "show port stats all" >&"$in_fd"
        sleep 0.5
        echo "stop" >&"$in_fd"
        sleep 0.5
        echo "show port stats all" >&"$in_fd" # final counts, forwarding stopped
        echo "quit" >&"$in_fd"
        local i
        for i in $(seq 1 300); do
            kill -0 "$tpid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    exec {in_fd}>&-
    in_fd=""
    stop_pid "$tpid"; forget_pid "$tpid"
    # The session-end counters are logged at disconnect; give the control thread a moment.
    wait_for "$vlog" "stats \(session end\)" 5 "$vpid"
    if ! kill -0 "$vpid" 2>/dev/null; then
        echo "   $name: vhostd exited during the case"; tail -n 5 "$vlog" | sed 's/^/      /'
        ok=0
    fi
    stop_pid "$vpid"; forget_pid "$vpid"
    if [ "$stop_status" != 0 ]; then
        echo "   $name: vhostd exit status $stop_status on SIGTERM"; tail -n 5 "$vlog" | sed 's/^/      /'
        ok=0
    fi
    rm -f "$fifo" "$sock"
    if [ $ok = 0 ]; then
        failed=$((failed + 1)); return 1
    fi

    # ---- the checks ----
    local t_tx t_rx v_tx v_txd v_txe v_rx v_rxd v_rxe txpps rxpps
    t_tx=$(nic_stat "$tlog" TX-packets); t_rx=$(nic_stat "$tlog" RX-packets)
    v_tx=$(vstat "$vlog" tx_packets); v_txd=$(vstat "$vlog" tx_drops); v_txe=$(vstat "$vlog" tx_errors)
    v_rx=$(vstat "$vlog" rx_packets); v_rxd=$(vstat "$vlog" rx_drops); v_rxe=$(vstat "$vlog" rx_errors)
    txpps=$(pps "$tlog" Tx-pps); rxpps=$(pps "$tlog" Rx-pps)
    if [ -z "$t_tx" ] || [ -z "$t_rx" ] || [ -z "$v_tx" ] || [ -z "$v_rx" ]; then
        echo "   $name: counters missing (testpmd TX '${t_tx:-}' RX '${t_rx:-}'," \
            "vhostd tx '${v_tx:-}' rx '${v_rx:-}')"
        grep -iE "error|fail|warn" "$vlog" | head -n 5 | sed 's/^/      /'
        failed=$((failed + 1)); return 1
    fi
    # VIRTIO_F_IN_ORDER (bit 35): DPDK's virtio-user takes it unless in_order=0, and then
    # vhostd uses each transmit run with one used entry (2.7.9 / 2.8.8): DPDK must accept it.
    local feat want_io=1
    feat=$(grep -Eo ": features 0x[0-9a-f]+" "$vlog" | tail -n 1 | grep -Eo '0x[0-9a-f]+$')
    case $extra in *in_order=0*) want_io=0 ;; esac
    check "$name" "VIRTIO_F_IN_ORDER negotiated: $want_io (features ${feat:-none})" \
        test -n "$feat" -a $(((${feat:-0} >> 35) & 1)) -eq "$want_io" || ok=0
    check "$name" "no malformed frames or buffers (vhostd tx_errors $v_txe, rx_errors $v_rxe)" \
        test "$v_txe" -eq 0 -a "$v_rxe" -eq 0 || ok=0
    check "$name" "vhostd took every frame testpmd sent (testpmd TX $t_tx, vhostd tx $v_tx)" \
        test "$t_tx" -eq "$v_tx" || ok=0
    check "$name" "loopback conservation: tx $v_tx = rx $v_rx + rx drops $v_rxd + tx drops $v_txd" \
        test "$v_tx" -eq $((v_rx + v_rxd + v_txd)) || ok=0
    check "$name" "testpmd received no more than vhostd delivered (RX $t_rx, delivered $v_rx)" \
        test "$t_rx" -le "$v_rx" || ok=0
    local qi
    case $mode in
    txonly)
        check "$name" "traffic flowed (testpmd TX $t_tx)" test "$t_tx" -gt 10000 || ok=0
        check "$name" "txonly receives nothing (testpmd RX $t_rx)" test "$t_rx" -eq 0 || ok=0
        # The receive rings fill up (txonly never reads them): vhostd delivers what fits, drops the rest.
        check "$name" "receive rings filled ($v_rx delivered)" test "$v_rx" -gt 0 || ok=0
        ;;
    rxonly)
        # 4 bursts of 32 per queue, all looped back and all received: exact.
        check "$name" "every looped frame received (testpmd TX $t_tx, RX $t_rx, want $((128 * q)))" \
            test "$t_tx" -eq $((128 * q)) -a "$t_rx" -eq "$t_tx" -a "$v_rx" -eq "$t_tx" || ok=0
        ;;
    io)
        check "$name" "frames circulated (testpmd RX $t_rx)" test "$t_rx" -gt 10000 || ok=0
        # What testpmd had not read yet when it stopped is at most the frames in flight.
        check "$name" "delivered but unread at stop <= frames in flight ($((v_rx - t_rx)))" \
            test $((v_rx - t_rx)) -le $((32 * q)) || ok=0
        check "$name" "io forwarding sends what it receives plus its first bursts" \
            test "$t_tx" -ge "$t_rx" || ok=0
        ;;
    esac
    # With two pairs both carry traffic: the per-queue counters of each transmit queue.
    if [ "$mode" != rxonly ] || [ "$q" -gt 1 ]; then
        for ((qi = 0; qi < q; qi++)); do
            local n
            n=$(vqstat "$vlog" $((2 * qi + 1)) packets)
            check "$name" "pair $qi carried traffic (tx queue $((2 * qi + 1)): ${n:-none})" \
                test "${n:-0}" -gt 0 || ok=0
        done
    fi
    local rate
    case $mode in
    txonly) rate=$txpps ;;
    *) rate=$rxpps ;;
    esac
    printf '   %-26s %s  testpmd TX %s RX %s | vhostd tx %s rx %s drops %s/%s | %s Mpps\n' \
        "$name" "$([ $ok = 1 ] && echo ok || echo FAIL)" "$t_tx" "$t_rx" "$v_tx" "$v_rx" \
        "$v_rxd" "$v_txd" "$(awk -v p="${rate:-0}" 'BEGIN {printf "%.2f", p / 1e6}')"
    if [ $ok = 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

# run_refused NAME DEVICE_PAIRS: testpmd asks one pair more than the device has. DPDK's
# virtio-user does not ask GET_QUEUE_NUM (QEMU does: tests/guest/net-guests.sh); its first
# ring beyond the device is refused with an error and the session ends, vhostd keeps serving.
run_refused() {
    local name=$1 q=$2
    local sock=$work/$name.sock vlog=$work/$name.vhostd.log tlog=$work/$name.testpmd.log vpid tpid i
    local ok=1
    case_selected "$name" || return 0
    "$vhostd" --workers 1 --net "socket=$sock,backend=loopback,queues=$q" >"$vlog" 2>&1 &
    vpid=$!
    pids+=("$vpid")
    if ! wait_for "$vlog" "listening on" 10 "$vpid"; then
        echo "   $name: vhostd did not start"; stop_pid "$vpid"; forget_pid "$vpid"
        failed=$((failed + 1)); return 1
    fi
    "$testpmd" --no-huge -m 1024 --no-pci --lcores '0@(0,1),1@(0,1)' \
        --file-prefix="vhostd-$$-$name" --vdev "net_virtio_user0,path=$sock,queues=$((q + 1))" -- \
        --rxq=$((q + 1)) --txq=$((q + 1)) --nb-cores=1 --total-num-mbufs=8192 \
        --stats-period=1 </dev/null >"$tlog" 2>&1 &
    tpid=$!
    pids+=("$tpid")
    wait_for "$vlog" "session ended" 60 "$vpid"
    stop_pid "$tpid"; forget_pid "$tpid"
    check "$name" "vhostd refused ring $((2 * q)) and beyond (ring index out of range)" \
        grep -q "ring index out of range" "$vlog" || ok=0
    check "$name" "the session ended" grep -q "session ended" "$vlog" || ok=0
    check "$name" "vhostd still running" kill -0 "$vpid" || ok=0
    stop_pid "$vpid"; forget_pid "$vpid"
    check "$name" "vhostd exit status 0 on SIGTERM (got $stop_status)" test "$stop_status" = 0 || ok=0
    rm -f "$sock"
    printf '   %-26s %s  testpmd queues=%u on a %u-pair device refused\n' "$name" \
        "$([ $ok = 1 ] && echo ok || echo FAIL)" $((q + 1)) "$q"
    if [ $ok = 1 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
}

if ! command -v "$testpmd" >/dev/null 2>&1; then
    echo "dpdk-testpmd not found (Debian: apt-get install dpdk-dev)"
    echo "0 passed, 1 failed"
    exit 1
fi
if [ ! -x "$vhostd" ]; then
    echo "$vhostd not built"
    echo "0 passed, 1 failed"
    exit 1
fi
echo "testpmd interop: DPDK $(dpkg-query -W -f='${Version}' dpdk-dev 2>/dev/null || echo '?'),"\
    "${secs} s of traffic per case, $(nproc) CPUs"

cases_plan testpmd-loopback "${TESTPMD_CASES:-}" split-txonly-q1 split-io-q1 split-io-q1-nomrg \
    split-rxonly-q1 packed-txonly-q1 packed-io-q1 packed-io-q1-nomrg split-io-q2 \
    split-txonly-q2-nomrg packed-io-q2 packed-rxonly-q2 split-io-q1-noinorder \
    packed-txonly-q1-noinorder queues-over-limit
# name                         pairs mode    vdev options
run_case split-txonly-q1       1 txonly ""
run_case split-io-q1           1 io     ""
run_case split-io-q1-nomrg     1 io     ",mrg_rxbuf=0"
run_case split-rxonly-q1       1 rxonly ""
run_case packed-txonly-q1      1 txonly ",packed_vq=1"
run_case packed-io-q1          1 io     ",packed_vq=1"
run_case packed-io-q1-nomrg    1 io     ",packed_vq=1,mrg_rxbuf=0"
run_case split-io-q2           2 io     ""
run_case split-txonly-q2-nomrg 2 txonly ",mrg_rxbuf=0"
run_case packed-io-q2          2 io     ",packed_vq=1"
run_case packed-rxonly-q2      2 rxonly ",packed_vq=1,mrg_rxbuf=0"
# without VIRTIO_F_IN_ORDER (every case above has it): one used entry per transmitted frame
run_case split-io-q1-noinorder      1 io     ",in_order=0"
run_case packed-txonly-q1-noinorder 1 txonly ",packed_vq=1,in_order=0"
# the pair limit: 2 pairs work above, 3 on a 2-pair device do not
run_refused queues-over-limit  2

cases_summary
[ "$failed" -eq 0 ]
