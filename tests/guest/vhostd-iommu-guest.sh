#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# vhostd-iommu-guest.sh: real Linux guests behind an emulated Intel IOMMU (q35, intel-iommu with
# a device IOTLB; run-guest.sh --iommu puts each device on a PCIe root port with ats=on) on
# vhost-user devices with iommu_platform=on: the back-end negotiates VIRTIO_F_ACCESS_PLATFORM
# and sees only IOVAs, translated through the IOTLB QEMU feeds it. In every case the guest's
# /init proves DMA remapping is on (/sys/class/iommu, each virtio device in a DMA-FQ (lazy) or
# DMA (strict) IOMMU group: "CHECK iommu: PASS").
#   net-testpmd   reference peer, not vhostd: two guests ping each other (5 of 5) through
#                 dpdk-testpmd's vhost PMD (iommu-support=1, io forwarding between its 2 ports);
#                 validates the harness independently of vhostd.
#   blk-*         the guest disk checks of vhostd-matrix.sh (verified O_DIRECT writes, flush,
#                 discard...) on a vhostd disk, split/packed x 1/2 queues x lazy/strict, then
#                 host-verify.sh; vhostd exits 0 on SIGTERM with no error or warning logged, and
#                 its (debug) log shows the IOTLB updates and, strict, the invalidations.
#   net-switch    two guests ping each other through a vhostd switch, both behind their
#                 IOMMU (strict): 5 replies to at most 6 pings each (receive buffers are
#                 translated when posted).
#   crash         vhostd killed (SIGKILL) KILLS times under the guest's verified write workload
#                 (strict, QEMU reconnect=1): each restarted instance gets the inflight area
#                 back and rebuilds its IOTLB from QEMU's updates; guest checks and host-verify
#                 clean.
# One "PASS|FAIL vhostd-iommu-guest/<case>" line per case, then "N passed, N failed[, N skipped]".
#
# Env: VHOSTD (default build/vhostd), TESTPMD (dpdk-testpmd), GUEST_DIR (build/guest),
# LOG_DIR (build/vhostd-iommu-guest), GUEST_TIMEOUT (300 s per boot: the emulated IOMMU is slow
# under TCG), IOMMU_DEADLINE (1800 s: no case starts after it), KILLS (3), CASES (subset).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VHOSTD=${VHOSTD:-$REPO/build/vhostd}
TESTPMD=${TESTPMD:-dpdk-testpmd}
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
LOG_DIR=${LOG_DIR:-$REPO/build/vhostd-iommu-guest}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-300}
IOMMU_DEADLINE=${IOMMU_DEADLINE:-1800}
KILLS=${KILLS:-3}
IMG_SIZE=$((64 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))
DEV_OPTS=iommu_platform=on,ats=on,disable-legacy=on
# vectors=0: QEMU 7.2 under TCG crashes when a vhost-user NIC starts with MSI-X.
NET_DEV_OPTS=vectors=0,$DEV_OPTS
# Bound on waiting for QEMU to reconnect to a restarted vhostd (its reconnect period is 1 s).
SESSION_WAIT_S=30

SCRIPT_NAME=vhostd-iommu-guest
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"

[ -x "$VHOSTD" ] || { echo "$SCRIPT_NAME: $VHOSTD not built"; echo "0 passed, 1 failed"; exit 1; }
"$HERE/build-guest.sh" "$GUEST_DIR" | sed 's/^/  /'
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-iommu-guest.XXXXXX")
start_all=$(date +%s)

# why TEXT: add TEXT to the case's reason.
why() {
    reason="${reason:+$reason; }$1"
}

# iommu_seen CONSOLE: the guest's /init found DMA remapping on for its devices.
iommu_seen() {
    tr -d '\r' <"$1" | grep -q '^CHECK iommu: PASS'
}

# guest_result CONSOLE: the guest's verdict line, or why there is none.
guest_result() {
    tr -d '\r' <"$1" | grep -aE '^GUEST-RESULT' | tail -n 1 | grep . ||
        echo "no GUEST-RESULT line (hung until GUEST_TIMEOUT, or QEMU failed: $(tr -d '\r' <"$1" | grep -a '^qemu' | tail -n 1))"
}

# vhostd_log_clean LOG...: no error or warning in vhostd's logs.
vhostd_log_clean() {
    if grep -hqE ' (error|warn):' "$@"; then
        why "vhostd logged: $(grep -hE ' (error|warn):' "$@" | head -n 1)"
    fi
}

# ---- disks -------------------------------------------------------------------------------

# blk_case NAME RING(split|packed) QUEUES MODE(lazy|strict)
blk_case() {
    local name=$1 ring=$2 queues=$3 mode=$4
    local dir=$WORK/$name seed rc=0 reason="" t0 packed=off vlog=$LOG_DIR/$1.vhostd.log
    local console=$LOG_DIR/$1.console.log upd inv
    [ "$ring" = packed ] && packed=on
    case_begin "$name" IOMMU_DEADLINE || return 0
    echo "--- $SCRIPT_NAME/$name: ring=$ring queues=$queues iommu=$mode seed=$seed"
    truncate -s "$IMG_SIZE" "$dir/rw.img"
    "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$dir/rw.img" --seed "$seed" >/dev/null ||
        why "preparing rw.img failed"
    if [ -z "$reason" ]; then
        # debug: one line per IOTLB message, counted below
        "$VHOSTD" --workers "$queues" --log-level debug \
            --blk "socket=$dir/rw.sock,image=$dir/rw.img,queues=$queues,serial=$name" >"$vlog" 2>&1 &
        vhostd_pid=$!
        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --log "$console" --sock "$dir/rw.sock" --queues "$queues" --packed "$packed" \
            --expect-ring "$ring" --sectors "$SECTORS" --serial "$name" --seed "$seed" \
            --require EVENT_IDX,FLUSH,ACCESS_PLATFORM --iommu "$mode" --dev-opts "$DEV_OPTS" \
            --threads 2 --work-mb 4 &
        guest_pid=$!
        wait "$guest_pid" || rc=$?
        guest_pid=""
        [ "$rc" = 0 ] || why "guest: $(guest_result "$console") (see $console)"
        iommu_seen "$console" || why "the guest did not report DMA remapping (CHECK iommu)"
        kill -0 "$vhostd_pid" 2>/dev/null || why "vhostd died: $(tail -n 1 "$vlog")"
        stop_vhostd
        [ "$vhostd_status" = 0 ] || why "vhostd exited with status $vhostd_status on SIGTERM"
        vhostd_log_clean "$vlog"
        upd=$(grep -c 'IOTLB update' "$vlog" || true)
        inv=$(grep -c 'IOTLB invalidate' "$vlog" || true)
        [ "$upd" -gt 0 ] || why "no IOTLB update in vhostd's log (ACCESS_PLATFORM not negotiated?)"
        # strict: every unmap is invalidated at once, so a whole workload brings many
        [ "$mode" != strict ] || [ "$inv" -gt 0 ] || why "strict guest, but no IOTLB invalidation reached vhostd"
    fi
    if [ -z "$reason" ]; then
        "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" | sed 's/^/  /' ||
            why "host-verify of rw.img failed"
    fi
    case_end "$name" "$reason" "$upd IOTLB updates, $inv invalidations"
}

# ---- NICs --------------------------------------------------------------------------------

# A guest's shell line: address, link up, then one-shot pings to PEER until 5 were answered
# (at most 80 pings), "PINGS: <replies> replies to <pings> pings", then LINGER seconds more for
# the peer. Not "5 of 5" here: behind a strict IOMMU every receive buffer the guest posts is a
# new mapping, and DPDK drops a frame that meets a receive buffer not yet translated (the miss
# is asked, the next frame gets through). vhostd translates receive buffers when they are
# posted (vhd_vq_prefault): net_switch_case asks 5 replies to at most 6 pings.
ping_cmd() { # ping_cmd ADDR PEER LINGER
    echo "ip addr add $1/24 dev eth0 && ip link set eth0 up && n=0 && i=0 && while [ \$i -lt 80 ] && [ \$n -lt 5 ]; do ping -c 1 -W 1 $2 >/dev/null && n=\$((n+1)); i=\$((i+1)); done; echo PINGS: \$n replies to \$i pings; [ \$n -ge 5 ] && sleep $3"
}

# two_guests_ping NAME MODE: guests a (192.0.2.10) and b (.11) on $dir/a.sock and $dir/b.sock
# ping each other; the case's reason says what failed.
two_guests_ping() {
    local name=$1 mode=$2 ga gb ra=0 rb=0 g
    declare -gA pings=()
    for g in a b; do
        local addr=192.0.2.10 peer=192.0.2.11 mac=52:54:00:00:03:0a
        [ "$g" = b ] && addr=192.0.2.11 peer=192.0.2.10 mac=52:54:00:00:03:0b
        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --wait-socket 60 --test cmd --smp 1 --mem 256M --iommu "$mode" \
            --net-sock "$dir/$g.sock" --mac "$mac" --net-dev-opts "$NET_DEV_OPTS" \
            --guest-args "$(ping_cmd "$addr" "$peer" 30)" \
            --log "$LOG_DIR/$name.$g.console.log" >"$dir/$g.out" 2>&1 &
        if [ "$g" = a ]; then ga=$!; else gb=$!; fi
    done
    wait "$ga" || ra=$?
    wait "$gb" || rb=$?
    for g in a b; do
        local c=$LOG_DIR/$name.$g.console.log
        iommu_seen "$c" || why "guest $g did not report DMA remapping (CHECK iommu)"
        pings[$g]=$(tr -d '\r' <"$c" | grep -aEo '^PINGS: [0-9]+ replies to [0-9]+ pings' | tail -n 1 | cut -c8-)
        [[ "${pings[$g]}" == "5 replies"* ]] || why "guest $g: ${pings[$g]:-no PINGS line} (see $c)"
    done
    if [ "$ra" != 0 ] || [ "$rb" != 0 ]; then why "guest status a=$ra b=$rb"; fi
}

# net_testpmd_case NAME MODE: the reference peer (DPDK's vhost PMD, not vhostd).
net_testpmd_case() {
    local name=$1 mode=$2 dir=$WORK/$1 seed reason="" t0 tlog=$LOG_DIR/$1.testpmd.log hold hold_fd
    case_begin "$name" IOMMU_DEADLINE || return 0
    echo "--- $SCRIPT_NAME/$name: two guests through dpdk-testpmd (iommu-support=1), iommu=$mode"
    if ! command -v "$TESTPMD" >/dev/null; then
        case_end "$name" "$TESTPMD not found (Debian: apt-get install dpdk)"
        return 0
    fi
    # testpmd forwards until its stdin gets a line; a FIFO we hold open keeps it forwarding.
    hold=$dir/hold
    mkfifo "$hold"
    exec {hold_fd}<>"$hold"
    "$TESTPMD" --no-huge -m 2048 --no-pci --lcores '0@(0,1),1@1' --file-prefix="vhostd-iog-$$" \
        --vdev "net_vhost0,iface=$dir/a.sock,queues=1,iommu-support=1" \
        --vdev "net_vhost1,iface=$dir/b.sock,queues=1,iommu-support=1" -- \
        --nb-cores=1 --total-num-mbufs=16384 --forward-mode=io --port-topology=paired \
        <"$hold" >"$tlog" 2>&1 &
    backend_pid=$!
    two_guests_ping "$name" "$mode"
    kill -0 "$backend_pid" 2>/dev/null || why "testpmd died: $(tail -n 1 "$tlog")"
    stop_backend
    exec {hold_fd}>&-
    rm -rf "${XDG_RUNTIME_DIR:-/var/run}/dpdk/vhostd-iog-$$" /var/run/dpdk/vhostd-iog-$$ 2>/dev/null || true
    case_end "$name" "$reason" "5 echo replies each: guest a ${pings[a]:-}, guest b ${pings[b]:-}"
}

# net_switch_case NAME MODE: two guests on one vhostd switch.
net_switch_case() {
    local name=$1 mode=$2 dir=$WORK/$1 seed reason="" t0 vlog=$LOG_DIR/$1.vhostd.log upd drops
    case_begin "$name" IOMMU_DEADLINE || return 0
    echo "--- $SCRIPT_NAME/$name: two guests on a vhostd switch, iommu=$mode"
    "$VHOSTD" --log-level debug --net "socket=$dir/a.sock,backend=switch,switch=sw0" \
        --net "socket=$dir/b.sock,backend=switch,switch=sw0" >"$vlog" 2>&1 &
    vhostd_pid=$!
    two_guests_ping "$name" "$mode"
    for g in a b; do # one lost ping at most (5 of 5 measured; was 5 replies to 19-38 pings)
        [[ "${pings[$g]:-}" =~ ^5\ replies\ to\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -le 6 ] ||
            why "guest $g: ${pings[$g]:-no PINGS line}: more than one ping lost"
    done
    kill -0 "$vhostd_pid" 2>/dev/null || why "vhostd died: $(tail -n 1 "$vlog")"
    stop_vhostd
    [ "$vhostd_status" = 0 ] || why "vhostd exited with status $vhostd_status on SIGTERM"
    vhostd_log_clean "$vlog"
    upd=$(grep -c 'IOTLB update' "$vlog" || true)
    [ "$upd" -gt 0 ] || why "no IOTLB update in vhostd's log (ACCESS_PLATFORM not negotiated?)"
    # frames dropped on receive (untranslated receive buffers among them), both ports
    drops=$(grep -Eo 'total: .* rx_drops=[0-9]+' "$vlog" | awk -F= '{ s += $NF } END { print s + 0 }')
    case_end "$name" "$reason" "5 echo replies each: guest a ${pings[a]:-}, guest b ${pings[b]:-}; $upd IOTLB updates; rx drops ${drops:-?}"
}

# ---- vhostd killed under the guest -----------------------------------------------------

# crash_start DIR LOG: one vhostd instance on DIR/rw.sock and DIR/rw.img.
crash_start() {
    "$VHOSTD" --workers 1 --log-level debug \
        --blk "socket=$1/rw.sock,image=$1/rw.img,queues=1,serial=iommu-crash" >"$2" 2>&1 &
    vhostd_pid=$!
}

# in_workload CONSOLE: the guest's random-write workload runs (started, not finished).
in_workload() {
    grep -aq '^INFO guest-blkcheck' "$1" 2>/dev/null && ! grep -aq '^PERF total' "$1" 2>/dev/null
}

# crash_case NAME MODE: as vhostd-crash.sh, fewer kills, behind the IOMMU.
crash_case() {
    local name=$1 mode=$2 dir=$WORK/$1 seed rc=0 reason="" t0 kills=0 n=0 i waited
    local console=$LOG_DIR/$1.console.log
    case_begin "$name" IOMMU_DEADLINE || return 0
    echo "--- $SCRIPT_NAME/$name: split, 1 queue, iommu=$mode, $KILLS kills, seed=$seed"
    rm -f "$LOG_DIR/$name".vhostd.*.log
    truncate -s "$IMG_SIZE" "$dir/rw.img"
    "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$dir/rw.img" --seed "$seed" >/dev/null ||
        why "preparing rw.img failed"
    if [ -z "$reason" ]; then
        crash_start "$dir" "$LOG_DIR/$name.vhostd.0.log"
        : >"$console"
        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --log "$console" --sock "$dir/rw.sock" --reconnect 1 --sectors "$SECTORS" \
            --serial iommu-crash --seed "$seed" --require EVENT_IDX,FLUSH,ACCESS_PLATFORM \
            --iommu "$mode" --dev-opts "$DEV_OPTS" --threads 2 --guest-args "--ops-4k 4000" &
        guest_pid=$!
        while [ "$kills" -lt "$KILLS" ] && kill -0 "$guest_pid" 2>/dev/null; do
            # the instance has its session (features set) and translations (an IOTLB update)
            waited=0
            until grep -q 'IOTLB update' "$LOG_DIR/$name.vhostd.$n.log" 2>/dev/null; do
                kill -0 "$guest_pid" 2>/dev/null || break 2
                if [ "$waited" -ge $((SESSION_WAIT_S * 20)) ]; then
                    why "vhostd instance $n got no IOTLB update within ${SESSION_WAIT_S}s"
                    break 2
                fi
                sleep 0.05
                waited=$((waited + 1))
            done
            if ! in_workload "$console"; then
                grep -aq '^PERF total' "$console" && break
                sleep 0.1
                continue
            fi
            sleep "0.$((RANDOM % 5 + 2))"
            in_workload "$console" || break
            kill -9 "$vhostd_pid"
            wait "$vhostd_pid" 2>/dev/null || true
            kills=$((kills + 1))
            n=$((n + 1))
            crash_start "$dir" "$LOG_DIR/$name.vhostd.$n.log"
        done
        wait "$guest_pid" || rc=$?
        guest_pid=""
        [ "$rc" = 0 ] || why "guest: $(guest_result "$console") (see $console)"
        iommu_seen "$console" || why "the guest did not report DMA remapping (CHECK iommu)"
        kill -0 "$vhostd_pid" 2>/dev/null || why "vhostd instance $n died: $(tail -n 1 "$LOG_DIR/$name.vhostd.$n.log")"
        stop_vhostd
        [ "$vhostd_status" = 0 ] || why "vhostd exited with status $vhostd_status on SIGTERM"
        [ "$kills" -ge "$KILLS" ] || why "only $kills of $KILLS kills before the workload ended"
        if tr -d '\r' <"$console" | grep -qE '^DMESG .*(I/O error|blk_update_request|broken)'; then
            why "guest kernel: $(tr -d '\r' <"$console" | grep -E '^DMESG .*(I/O error|blk_update_request|broken)' | head -n 1)"
        fi
        # Each restarted instance got the inflight area back and translations anew.
        for i in $(seq 1 "$n"); do
            grep -q 'inflight area set' "$LOG_DIR/$name.vhostd.$i.log" ||
                why "vhostd instance $i never got the inflight area"
            grep -q 'IOTLB update' "$LOG_DIR/$name.vhostd.$i.log" ||
                why "vhostd instance $i got no IOTLB update"
        done
        vhostd_log_clean "$LOG_DIR/$name".vhostd.*.log
    fi
    if [ -z "$reason" ]; then
        "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" | sed 's/^/  /' ||
            why "host-verify of rw.img failed"
    fi
    case_end "$name" "$reason" "$kills kills survived, inflight area and IOTLB rebuilt each time"
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" net-testpmd \
    blk-split-q1-strict blk-split-q2-strict blk-packed-q1-strict blk-packed-q2-strict \
    blk-split-q1-lazy blk-split-q2-lazy blk-packed-q1-lazy blk-packed-q2-lazy \
    net-switch crash
net_testpmd_case net-testpmd strict
#        name                  ring   queues mode
blk_case blk-split-q1-strict   split  1      strict
blk_case blk-split-q2-strict   split  2      strict
blk_case blk-packed-q1-strict  packed 1      strict
blk_case blk-packed-q2-strict  packed 2      strict
blk_case blk-split-q1-lazy     split  1      lazy
blk_case blk-split-q2-lazy     split  2      lazy
blk_case blk-packed-q1-lazy    packed 1      lazy
blk_case blk-packed-q2-lazy    packed 2      lazy
net_switch_case net-switch strict
crash_case crash strict

echo "$SCRIPT_NAME: total $(($(date +%s) - start_all))s, logs in $LOG_DIR"
cases_summary
[ "$failed" = 0 ]
