#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# DPDK interop in vhost-user client mode: dpdk-testpmd's virtio-user PMD listens
# (net_virtio_user ...,server=1) and vhostd connects to it (--net ...,client=on).
# vhostd starts first and retries until testpmd's socket appears; frames circulate in io
# mode (testpmd's TX count must equal vhostd's tx count, and what testpmd receives must
# have been delivered by vhostd); testpmd then quits and a new testpmd listens on the same
# path: vhostd connects again and the second run passes the same checks. vhostd exits 0 on
# SIGTERM. Ends with "N passed, N failed".
#
# Env: VHOSTD (default build/vhostd), TESTPMD (default dpdk-testpmd), TESTPMD_SECONDS
#      traffic time per run (default 3).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
vhostd=${VHOSTD:-$root/build/vhostd}
testpmd=${TESTPMD:-dpdk-testpmd}
secs=${TESTPMD_SECONDS:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-tpc-XXXXXX")
passed=0
failed=0
vpid=""
tpid=""
in_fd=""

# Stop one process we started: SIGTERM, up to 10 s, then SIGKILL. By pid only.
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

cleanup() {
    [ -n "$in_fd" ] && exec {in_fd}>&- 2>/dev/null
    stop_pid "$tpid"
    stop_pid "$vpid"
    rm -rf "$work"
    rm -rf "${XDG_RUNTIME_DIR:-/var/run}/dpdk/vhostd-tpc-$$-"* /var/run/dpdk/vhostd-tpc-$$-* 2>/dev/null
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

# wait_for FILE REGEX SECONDS [COUNT]: until REGEX matches COUNT (default 1) lines of FILE.
wait_for() {
    local i n
    for i in $(seq 1 $(($3 * 10))); do
        n=$(grep -Ec "$2" "$1" 2>/dev/null)
        [ "${n:-0}" -ge "${4:-1}" ] && return 0
        sleep 0.1
    done
    return 1
}

nic_stat() { # LOG KEY: the value in the last NIC statistics block
    grep -Eo "$2: +[0-9]+" "$1" | tail -n 1 | grep -Eo '[0-9]+$'
}
vstat() { # LOG KEY RUN: a total of vhostd's RUN-th session-end line
    grep "stats (session end): total:" "$1" | sed -n "${3}p" | grep -Eo "$2=[0-9]+" | cut -d= -f2
}

result() { # NAME OK DETAIL
    if [ "$2" = 1 ]; then
        echo "PASS testpmd-client/$1"
        passed=$((passed + 1))
    else
        echo "FAIL testpmd-client/$1: $3"
        failed=$((failed + 1))
    fi
}

# One testpmd run (the RUN-th session of vhostd): listen, forward in io mode, quit.
testpmd_run() {
    local run=$1 tlog=$work/testpmd.$1.log fifo=$work/in.$1 ok=1 why=""
    mkfifo "$fifo"
    exec {in_fd}<>"$fifo"
    "$testpmd" --no-huge -m 1024 --no-pci --lcores '0@(0,1),1@(0,1)' \
        --file-prefix="vhostd-tpc-$$-$run" \
        --vdev "net_virtio_user0,path=$work/tp.sock,server=1,queues=1" -- \
        -i --nb-cores=1 --total-num-mbufs=16384 --forward-mode=io <"$fifo" >"$tlog" 2>&1 &
    tpid=$!
    if ! wait_for "$tlog" '^testpmd> ' 90; then
        ok=0 why="testpmd did not reach its prompt (vhostd did not connect?)"
    else
        echo "start tx_first" >&"$in_fd"
        sleep "$secs"
        echo "stop" >&"$in_fd"
        sleep 0.5
        echo "show port stats all" >&"$in_fd"
        echo "quit" >&"$in_fd"
        local i
        for i in $(seq 1 300); do
            kill -0 "$tpid" 2>/dev/null || break
            sleep 0.1
        done
    fi
    exec {in_fd}>&-
    in_fd=""
    stop_pid "$tpid"
    tpid=""
    if [ $ok = 1 ] && ! wait_for "$work/vhostd.log" "stats \(session end\): total" 10 "$run"; then
        ok=0 why="vhostd logged no session end"
    fi
    if [ $ok = 1 ]; then
        local t_tx t_rx v_tx v_rx v_err
        t_tx=$(nic_stat "$tlog" TX-packets)
        t_rx=$(nic_stat "$tlog" RX-packets)
        v_tx=$(vstat "$work/vhostd.log" tx_packets "$run")
        v_rx=$(vstat "$work/vhostd.log" rx_packets "$run")
        v_err=$(($(vstat "$work/vhostd.log" tx_errors "$run") + $(vstat "$work/vhostd.log" rx_errors "$run")))
        if [ -z "$t_tx" ] || [ -z "$t_rx" ] || [ -z "$v_tx" ] || [ -z "$v_rx" ]; then
            ok=0 why="counters missing"
        elif [ "$t_rx" -le 10000 ]; then
            ok=0 why="too little traffic (testpmd RX $t_rx)"
        elif [ "$t_tx" != "$v_tx" ] || [ "$t_rx" -gt "$v_rx" ] || [ "$v_err" != 0 ]; then
            ok=0 why="counts disagree: testpmd TX $t_tx RX $t_rx, vhostd tx $v_tx rx $v_rx errors $v_err"
        fi
    fi
    rm -f "$fifo"
    result "run$run" "$ok" "$why (logs: $tlog)"
}

command -v "$testpmd" >/dev/null ||
    { echo "testpmd-client: $testpmd not found (Debian: apt-get install dpdk-dev)"; echo "0 passed, 1 failed"; exit 1; }
[ -x "$vhostd" ] || { echo "testpmd-client: $vhostd not built"; echo "0 passed, 1 failed"; exit 1; }

"$vhostd" --net "socket=$work/tp.sock,backend=loopback,client=on,reconnect-max=300" \
    >"$work/vhostd.log" 2>&1 &
vpid=$!
# It starts first: nothing listens yet, it retries.
ok=0
wait_for "$work/vhostd.log" "No such file or directory \(attempt 1\)" 10 && ok=1
result vhostd-retries $ok "no failed first attempt in the vhostd log"
testpmd_run 1
testpmd_run 2 # a new testpmd on the same path: vhostd connects again
n=$(grep -c "connected to the front-end" "$work/vhostd.log")
ok=0
[ "$n" = 2 ] && ok=1
result two-sessions $ok "vhostd connected $n times, expected 2"
stop_pid "$vpid"
st=$?
vpid=""
ok=0
[ "$st" = 0 ] && ok=1
result vhostd-exit $ok "vhostd exit status $st after SIGTERM"
[ "$failed" = 0 ] || sed 's/^/   | /' "$work/vhostd.log" | tail -n 20
echo "testpmd-client: $passed passed, $failed failed"
[ "$failed" = 0 ]
