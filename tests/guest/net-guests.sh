#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# Linux guests on vhostd's virtio-net: (a) a guest on a TAP port pings the
# TAP's address (5 of 5 replies); (b) two guests on one vhostd switch ping
# each other (5 of 5 each). Real
# kernels (Linux 6.1, virtio_net) under QEMU TCG via run-guest.sh. (d) A
# guest moves 10 MiB of random data each way over TCP through a TAP with TSO
# negotiated (frames above the MTU both ways; MD5s match). (c) QEMU (no
# guest) takes as many queue pairs as GET_QUEUE_NUM says, and no more. In
# every case vhostd must run to the end and exit 0 on SIGTERM.
# Network hygiene: vhostd and its TAP live in a network namespace this
# script creates (vhostd-test-PID) and removes; every address is in
# 192.0.2.0/24 (TEST-NET-1) inside it; every loop is bounded. Ends with
# "N passed, N failed[, N skipped]".
#
# Env: VHOSTD (default build/vhostd), GUEST_TIMEOUT (default 240 per guest),
# CASES (subset of "tap switch tap-offloads queue-pairs"; the others show as skipped).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
vhostd=${VHOSTD:-$root/build/vhostd}
gtimeout=${GUEST_TIMEOUT:-240}
work=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-netguests-XXXXXX")
ns=vhostd-test-$$
ns_made=0
passed=0
failed=0
pids=() # every process we started and have not reaped

# stop_pid PID: SIGTERM, up to 10 s, then SIGKILL; its exit status in stop_status.
stop_status=0
stop_pid() {
    local pid=$1
    stop_status=0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null || stop_status=$?
    return 0
}

cleanup() {
    local p
    [ -n "${vpid:-}" ] && stop_pid "$vpid"
    for p in "${pids[@]}"; do stop_pid "$p"; done
    pids=()
    [ "$ns_made" = 1 ] && ip netns del "$ns" 2>/dev/null
    ns_made=0
    rm -rf "$work"
}
trap cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

# shellcheck source=tests/common/cases.sh
. "$root/tests/common/cases.sh"

ok() { passed=$((passed + 1)); echo "PASS $*"; }
ko() { failed=$((failed + 1)); echo "FAIL $*"; }

# Start vhostd inside the netns with the given --net specs; log in $work/$1.log. Not in pids:
# stop_vhostd_checked stops it and judges its exit status.
start_vhostd() {
    local log=$work/$1.log
    shift
    ip netns exec "$ns" "$vhostd" --log-level info "$@" >"$log" 2>&1 &
    vpid=$!
}

# wait_tap NAME: until vhostd created TAP NAME in the netns (5 s), or vhostd is gone.
wait_tap() {
    for _ in $(seq 1 50); do
        ip -n "$ns" link show "$1" >/dev/null 2>&1 && return 0
        kill -0 "$vpid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# stop_vhostd_checked: SIGTERM the case's vhostd; it must have been running until then and
# exit with status 0 (a crash, sandbox kill or sanitizer abort shows here); else the case's
# reason says so.
stop_vhostd_checked() {
    [ -n "$vpid" ] || return 0
    if ! kill -0 "$vpid" 2>/dev/null; then
        reason="${reason:+$reason; }vhostd exited during the test"
        tail -n 10 "$work/$case_name.log" | sed 's/^/   | /'
    fi
    stop_pid "$vpid"
    [ "$stop_status" = 0 ] || reason="${reason:+$reason; }vhostd exit status $stop_status"
    vpid=""
}

# run_net_case NAME FUNCTION: one case: FUNCTION sets reason (empty: passed) and what; vhostd's
# exit status is part of the verdict; everything the case started is stopped.
run_net_case() {
    case_name=$1
    reason=""
    what=""
    vpid=""
    local rc=0
    "$2" || rc=$?
    [ "$rc" = 0 ] || reason="${reason:+$reason; }$2 returned $rc"
    [ -n "$reason" ] || [ -n "$what" ] || reason="$2 gave no verdict"
    stop_vhostd_checked
    stop_all
    if [ -z "$reason" ]; then ok "$1: $what"; else ko "$1: $reason"; fi
}

stop_all() {
    local p
    for p in "${pids[@]}"; do stop_pid "$p"; done
    pids=()
}

guest() { # guest NAME SOCK MAC CMD: run one guest, its output in $work/NAME.out
    local name=$1 sock=$2 mac=$3 cmd=$4
    GUEST_TIMEOUT=$gtimeout bash "$root/tests/guest/run-guest.sh" --no-build --test cmd \
        --smp 1 --mem 256M --net-sock "$sock" --mac "$mac" --guest-args "$cmd" \
        --log "$work/$name.console" >"$work/$name.out" 2>&1
}

[ -x "$vhostd" ] || { echo "no $vhostd (build first)"; echo "0 passed, 1 failed"; exit 1; }
[ "$(id -u)" = 0 ] || { echo "needs root (network namespace, TAP)"; echo "0 passed, 1 failed"; exit 1; }
[ -s "$root/build/guest/vmlinuz" ] || bash "$root/tests/guest/build-guest.sh" "$root/build/guest" >/dev/null ||
    { echo "build-guest.sh failed"; echo "0 passed, 1 failed"; exit 1; }
ip netns add "$ns" || { echo "ip netns add $ns failed"; echo "0 passed, 1 failed"; exit 1; }
ns_made=1
ip -n "$ns" link set lo up

# A guest's shell line: address, link up, then ping PEER until it answers (bounded: 90 tries
# of 1 s), then 5 pings that must all be answered (ping alone succeeds on one reply: the guest
# checks its summary line); LINGER seconds more so a peer guest can finish.
ping_cmd() { # ping_cmd ADDR PEER LINGER
    echo "ip addr add $1/24 dev eth0 && ip link set eth0 up && i=0 && while [ \$i -lt 90 ] && ! ping -c 1 -W 1 $2 >/dev/null; do i=\$((i+1)); done && { ping -c 5 -W 2 $2 >/tmp/ping; cat /tmp/ping; grep -q '5 packets transmitted, 5 packets received' /tmp/ping; } && sleep $3"
}
# all_replies NAME: guest NAME's console shows 5 of 5 ping replies; ping_summary NAME: that line.
all_replies() {
    tr -d '\r' <"$work/$1.console" | grep -q '5 packets transmitted, 5 packets received'
}
ping_summary() {
    (tr -d '\r' <"$work/$1.console" | grep -Eo '[0-9]+ packets transmitted, [0-9]+ packets received' ||
        echo "no ping summary") | tail -n 1
}

# ---- (a) guest <-> host through TAP ----
case_tap() {
    echo "== tap: guest 192.0.2.2 pings the TAP (192.0.2.1) in netns $ns"
    start_vhostd tap --net "socket=$work/tap.sock,backend=tap,tap=vhdtap0"
    if ! wait_tap vhdtap0 || ! ip -n "$ns" addr add 192.0.2.1/24 dev vhdtap0 ||
        ! ip -n "$ns" link set vhdtap0 up; then
        reason="vhostd did not create vhdtap0"
        sed 's/^/   | /' "$work/tap.log" | tail -n 10
    elif ! guest tap "$work/tap.sock" 52:54:00:00:02:02 "$(ping_cmd 192.0.2.2 192.0.2.1 0)" ||
        ! all_replies tap; then
        reason="guest ping failed: $(ping_summary tap)"
        tail -n 20 "$work/tap.out" | sed 's/^/   | /'
    elif ! ip -n "$ns" neigh show 192.0.2.2 | grep -qi 52:54:00:00:02:02; then
        # the host side saw the guest too: its neighbour entry for 192.0.2.2
        reason="no neighbour entry for the guest on the host"
    else
        what="guest pinged 192.0.2.1 (5 of 5 replies); host learned the guest's MAC"
    fi
}

# ---- (b) two guests on one switch ----
case_switch() {
    echo "== switch: guests 192.0.2.10 and 192.0.2.11 on switch sw0 ping each other"
    start_vhostd switch --net "socket=$work/a.sock,backend=switch,switch=sw0" \
        --net "socket=$work/b.sock,backend=switch,switch=sw0"
    guest a "$work/a.sock" 52:54:00:00:02:0a "$(ping_cmd 192.0.2.10 192.0.2.11 15)" &
    local ga=$! gb ra=0 rb=0
    guest b "$work/b.sock" 52:54:00:00:02:0b "$(ping_cmd 192.0.2.11 192.0.2.10 15)" &
    gb=$!
    wait "$ga" || ra=$?
    wait "$gb" || rb=$?
    if [ "$ra" = 0 ] && [ "$rb" = 0 ] && all_replies a && all_replies b; then
        what="both guests got 5 of 5 replies"
    else
        reason="guest a status $ra ($(ping_summary a)), guest b status $rb ($(ping_summary b))"
        tail -n 12 "$work/a.out" | sed 's/^/   a| /'
        tail -n 12 "$work/b.out" | sed 's/^/   b| /'
    fi
}

# ---- (d) segmentation offloads through TAP: 10 MiB each way over TCP ----
# The guest negotiates HOST_TSO4 and GUEST_TSO4 (the TAP offers them when the kernel takes
# TUN_F_TSO4): vhostd's per-queue counters must show frames larger than the MTU (largest=) in
# both directions, and every byte must arrive intact: the data is random (the host's file from
# /dev/urandom, the guest's likewise) and each side's MD5 must match the sender's. busybox nc
# and httpd on the host. (Not the average frame: it mixes in the pure ACKs, and how big the
# senders' TSO bursts get depends on their pacing, so on a loaded host it can stay under the MTU
# with segmentation offload working.)
case_tap_offloads() {
    echo "== tap offloads: 10 MiB guest -> host and host -> guest over TCP through the TAP"
    start_vhostd tso --net "socket=$work/tso.sock,backend=tap,tap=vhdtso0"
    if ! wait_tap vhdtso0 || ! ip -n "$ns" addr add 192.0.2.1/24 dev vhdtso0 ||
        ! ip -n "$ns" link set vhdtso0 up; then
        reason="vhostd did not create vhdtso0"
        return
    fi
    # host side: a sink on 5001 (busybox nc, whose stdin is a FIFO we keep open, so it reads
    # until the guest closes; bounded by timeout) and busybox httpd serving the guest's download
    mkdir -p "$work/www"
    head -c $((160 * 65536)) /dev/urandom >"$work/www/data"
    local want_down hold_fd
    want_down=$(md5sum <"$work/www/data" | cut -d' ' -f1)
    mkfifo "$work/hold"
    exec {hold_fd}<>"$work/hold"
    (ip netns exec "$ns" timeout "$gtimeout" busybox nc -l -p 5001 <"$work/hold" >"$work/sink") &
    pids+=($!)
    local sink_pid=$!
    ip netns exec "$ns" timeout "$gtimeout" busybox httpd -f -p 192.0.2.1:8080 -h "$work/www" &
    pids+=($!)
    local gcmd="ip addr add 192.0.2.2/24 dev eth0 && ip link set eth0 up && i=0 && while [ \$i -lt 90 ] && ! ping -c 1 -W 1 192.0.2.1 >/dev/null; do i=\$((i+1)); done && dd if=/dev/urandom of=/tmp/up bs=65536 count=160 2>/dev/null && echo TXMD5=\$(md5sum /tmp/up) && nc 192.0.2.1 5001 </tmp/up && echo RXMD5=\$(wget -q -O - http://192.0.2.1:8080/data | md5sum)"
    guest tso "$work/tso.sock" 52:54:00:00:02:04 "$gcmd"
    # the sink ends when the guest closes its connection
    for _ in $(seq 1 50); do kill -0 "$sink_pid" 2>/dev/null || break; sleep 0.1; done
    exec {hold_fd}>&-
    local sent_up got_up got_down
    sent_up=$(grep -aEho 'TXMD5=[0-9a-f]{32}' "$work/tso.console" "$work/tso.out" 2>/dev/null | head -n 1 | cut -d= -f2)
    got_down=$(grep -aEho 'RXMD5=[0-9a-f]{32}' "$work/tso.console" "$work/tso.out" 2>/dev/null | head -n 1 | cut -d= -f2)
    got_up=$(md5sum <"$work/sink" | cut -d' ' -f1)
    local up_bytes
    up_bytes=$(stat -c %s "$work/sink")
    stop_vhostd_checked # session-end counters
    local txq rxq tavg ravg tmax rmax
    txq=$(grep -E "stats \(session end\): queue 1 \(" "$work/tso.log" | tail -n 1)
    rxq=$(grep -E "stats \(session end\): queue 0 \(" "$work/tso.log" | tail -n 1)
    avg() { # avg LINE: bytes / packets
        local p b
        p=$(grep -Eo 'packets=[0-9]+' <<<"$1" | cut -d= -f2)
        b=$(grep -Eo 'bytes=[0-9]+' <<<"$1" | cut -d= -f2)
        [ -n "$p" ] && [ "$p" -gt 0 ] && echo $((b / p)) || echo 0
    }
    tavg=$(avg "$txq")
    ravg=$(avg "$rxq")
    tmax=$(grep -Eo 'largest=[0-9]+' <<<"$txq" | cut -d= -f2)
    rmax=$(grep -Eo 'largest=[0-9]+' <<<"$rxq" | cut -d= -f2)
    if [ -z "$sent_up" ] || [ "$got_up" != "$sent_up" ]; then
        reason="guest -> host: the host got $up_bytes bytes, MD5 $got_up, the guest sent MD5 ${sent_up:-none}"
        tail -n 15 "$work/tso.out" | sed 's/^/   | /'
    elif [ "$got_down" != "$want_down" ]; then
        reason="host -> guest: the guest got MD5 ${got_down:-none}, the host sent $want_down"
        tail -n 15 "$work/tso.out" | sed 's/^/   | /'
    elif [ "${tmax:-0}" -le 1514 ] || [ "${rmax:-0}" -le 1514 ]; then
        reason="largest frame guest->host ${tmax:-none}, host->guest ${rmax:-none} bytes (no GSO?)"
    else
        what="10 MiB of random data each way, MD5s match; largest frame guest->host $tmax, host->guest $rmax bytes (average $tavg, $ravg: pure ACKs and the senders' pacing make it vary)"
    fi
}

# ---- (c) queue pairs and GET_QUEUE_NUM, as QEMU reads it (no guest needed) ----
# QEMU's vhost-user netdev compares queues=N (queue pairs) with the GET_QUEUE_NUM reply and
# refuses more ("you are asking more queues than supported: M"); -S keeps the CPU stopped.
qemu_netdev() { # qemu_netdev NAME SOCK QUEUES: QEMU for 5 s (then killed), its stderr in $work/NAME.qemu
    timeout 5 qemu-system-x86_64 -M pc -accel tcg -m 64M -nodefaults -display none -S -monitor none \
        -object memory-backend-memfd,id=mem,size=64M,share=on -numa node,memdev=mem \
        -chardev "socket,id=c0,path=$2" -netdev "vhost-user,id=n0,chardev=c0,queues=$3" \
        -device virtio-net-pci,netdev=n0,mq=on >"$work/$1.qemu" 2>&1
}
case_queue_pairs() {
    echo "== queue pairs: QEMU netdev vhost-user queues=2 accepted, queues=3 refused by a 2-pair device"
    if ! command -v qemu-system-x86_64 >/dev/null; then
        reason="qemu-system-x86_64 not found"
        return
    fi
    start_vhostd qnum --net "socket=$work/q.sock,backend=loopback,queues=2"
    for _ in $(seq 1 50); do [ -S "$work/q.sock" ] && break; sleep 0.1; done
    local q2rc=0
    qemu_netdev q2 "$work/q.sock" 2 || q2rc=$?
    qemu_netdev q3 "$work/q.sock" 3
    # queues=2 must still be running when timeout stops it (status 124), with no refusal.
    if [ "$q2rc" != 124 ] || grep -q "more queues than supported" "$work/q2.qemu"; then
        reason="QEMU did not keep running with queues=2 on a 2-pair device (status $q2rc)"
        head -n 3 "$work/q2.qemu" | sed 's/^/   | /'
    elif ! grep -q "more queues than supported: 2" "$work/q3.qemu"; then
        reason="QEMU did not refuse queues=3 with 'supported: 2'"
        head -n 3 "$work/q3.qemu" | sed 's/^/   | /'
    else
        what="GET_QUEUE_NUM says 2 (pairs); QEMU took 2 and refused 3"
    fi
}

cases_plan net-guests "${CASES:-}" tap switch tap-offloads queue-pairs
for c in $cases_run; do
    run_net_case "$c" "case_${c//-/_}"
done

cases_summary
[ "$failed" = 0 ]
