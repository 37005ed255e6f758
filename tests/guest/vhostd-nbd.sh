#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# vhostd-nbd.sh: a real Linux guest on a vhostd disk served from an NBD server. nbdkit's file
# plugin exports an image stamped by host-verify.sh --prepare on a Unix socket; vhostd serves it
# with backend=nbd (2 queues on 2 workers: one NBD connection each, multi-conn); run-guest.sh's
# checks run in the guest (queues, capacity, serial, verified O_DIRECT writes, flush, WCE
# toggle, discard, write-zeroes); then vhostd must exit 0 on SIGTERM and host-verify.sh checks
# the image behind nbdkit; nbdkit's log filter records the commands. Cases:
#   nbd-q2           as above; the guest's write-through writes reach the server with FUA, its
#                    write-back flushes as NBD_CMD_FLUSH
#   nbd-q2-restart   the same (with a 256 MiB verified workload) while nbdkit is killed
#                    (SIGKILL) and started again on the same socket every second: the guest's
#                    checks still pass (requests are delayed, never failed) and vhostd logs
#                    that it reconnected
# One "PASS|FAIL|SKIP vhostd-nbd/<case>" line per case and a final "N passed, N failed[, N
# skipped]" (tests/common/cases.sh).
#
# Env: VHOSTD (default build/vhostd), GUEST_DIR (build/guest), LOG_DIR (build/vhostd-nbd),
# GUEST_TIMEOUT (300 s per boot), NBD_DEADLINE (1200 s: no case starts after it),
# CASES (space-separated subset; the guest is slow under TCG: run one case at a time).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VHOSTD=${VHOSTD:-$REPO/build/vhostd}
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
LOG_DIR=${LOG_DIR:-$REPO/build/vhostd-nbd}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-300}
NBD_DEADLINE=${NBD_DEADLINE:-1200}
IMG_SIZE=$((64 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))

SCRIPT_NAME=vhostd-nbd
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"
nbdkit_pid=""
restarter_pid=""
nbd_cleanup() {
    if [ -n "$restarter_pid" ]; then
        kill "$restarter_pid" 2>/dev/null || true
        wait "$restarter_pid" 2>/dev/null || true
    fi
    if [ -n "$nbdkit_pid" ]; then
        kill -9 "$nbdkit_pid" 2>/dev/null || true
        wait "$nbdkit_pid" 2>/dev/null || true
    fi
    cleanup
}
trap nbd_cleanup EXIT

[ -x "$VHOSTD" ] || { echo "vhostd-nbd: $VHOSTD not built"; exit 1; }
command -v nbdkit >/dev/null || { echo "vhostd-nbd: nbdkit not installed (scripts/deps.sh test)"; exit 1; }
"$HERE/build-guest.sh" "$GUEST_DIR" | sed 's/^/  /'
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-nbd.XXXXXX")
start_all=$(date +%s)

# start_nbdkit IMG SOCK LOG: nbdkit (filters: $NBDKIT_FILTERS, their parameters: $NBDKIT_PARAMS,
# both word-split) in the foreground of a background job; waits (10 s) for SOCK.
NBDKIT_FILTERS=""
NBDKIT_PARAMS=""
start_nbdkit() {
    local i
    rm -f "$2"
    # shellcheck disable=SC2086 # the filters are words
    nbdkit -f -U "$2" $NBDKIT_FILTERS file "$1" $NBDKIT_PARAMS >>"$3" 2>&1 &
    nbdkit_pid=$!
    for i in $(seq 200); do
        [ -S "$2" ] && return 0
        kill -0 "$nbdkit_pid" 2>/dev/null || return 1
        sleep 0.05
    done
    return 1
}

# run_case NAME RESTARTS(0|1)
run_case() {
    local name=$1 restarts=$2
    local dir=$WORK/$name seed rc=0 reason="" t0 st n=0
    # The restarts need a guest busy for several seconds: a larger verified workload.
    GUEST_WORK_MB=""
    [ "$restarts" = 1 ] && GUEST_WORK_MB=256
    case_begin "$name" NBD_DEADLINE || return 0
    echo "--- vhostd-nbd/$name: restarts=$restarts seed=$seed"
    truncate -s "$IMG_SIZE" "$dir/rw.img"
    "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$dir/rw.img" --seed "$seed" >/dev/null ||
        reason="preparing rw.img failed"
    : >"$LOG_DIR/$name.nbdkit.log"
    # Every command the server gets, in cmd.log (the log filter; a restarted server starts it
    # again, so only the case without restarts checks it).
    NBDKIT_FILTERS="--filter=log"
    NBDKIT_PARAMS="logfile=$dir/cmd.log"
    if [ -z "$reason" ] && ! start_nbdkit "$dir/rw.img" "$dir/nbd.sock" "$LOG_DIR/$name.nbdkit.log"; then
        reason="nbdkit did not start"
    fi
    if [ -z "$reason" ]; then
        "$VHOSTD" --workers 2 --log-level info \
            --blk "socket=$dir/rw.sock,backend=nbd,uri=nbd+unix:///?socket=$dir/nbd.sock,queues=2,serial=$name" \
            >"$LOG_DIR/$name.vhostd.log" 2>&1 &
        vhostd_pid=$!
        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --log "$LOG_DIR/$name.console.log" --sock "$dir/rw.sock" --queues 2 \
            --sectors "$SECTORS" --serial "$name" --seed "$seed" --require EVENT_IDX,FLUSH \
            --discard yes ${GUEST_WORK_MB:+--work-mb "$GUEST_WORK_MB"} &
        guest_pid=$!
        if [ "$restarts" = 1 ]; then
            # Every second while the guest runs: kill nbdkit, leave it down 0.3 s (several
            # reconnect attempts fail), start it again.
            # The subshell takes over nbdkit_pid (the parent's first, then its own) and stops
            # its last one when told to (TERM).
            (
                trap 'kill -9 "$nbdkit_pid" 2>/dev/null; wait "$nbdkit_pid" 2>/dev/null; exit 0' TERM
                # First the parent's nbdkit (vhostd's start-up probe needs it): wait for vhostd.
                for n in $(seq 200); do [ -S "$dir/rw.sock" ] && break; sleep 0.05; done
                for n in $(seq 300); do
                    sleep 1
                    kill -0 "$guest_pid" 2>/dev/null || break
                    kill -9 "$nbdkit_pid" 2>/dev/null || true
                    wait "$nbdkit_pid" 2>/dev/null || true
                    echo "  nbdkit killed ($n)"
                    sleep 0.3
                    start_nbdkit "$dir/rw.img" "$dir/nbd.sock" "$LOG_DIR/$name.nbdkit.log" || exit 1
                done
                kill -9 "$nbdkit_pid" 2>/dev/null || true
                wait "$nbdkit_pid" 2>/dev/null || true
            ) &
            restarter_pid=$!
            nbdkit_pid="" # the subshell owns it now
        fi
        wait "$guest_pid" || rc=$?
        guest_pid=""
        [ "$rc" = 0 ] || reason="guest: see $LOG_DIR/$name.console.log"
        if ! kill -0 "$vhostd_pid" 2>/dev/null; then
            reason="${reason:+$reason; }vhostd died: $(tail -n 1 "$LOG_DIR/$name.vhostd.log")"
        fi
        if [ "$restarts" = 1 ]; then
            # Back up for vhostd's final flush, then the restarter stops.
            kill "$restarter_pid" 2>/dev/null || true
            wait "$restarter_pid" 2>/dev/null || true
            restarter_pid=""
            start_nbdkit "$dir/rw.img" "$dir/nbd.sock" "$LOG_DIR/$name.nbdkit.log" ||
                reason="${reason:+$reason; }nbdkit did not start again"
            grep -q "reconnected" "$LOG_DIR/$name.vhostd.log" ||
                reason="${reason:+$reason; }vhostd never reconnected (no restart under I/O?)"
        fi
        stop_vhostd
        st=$vhostd_status
        [ "$st" = 0 ] || reason="${reason:+$reason; }vhostd exited with status $st on SIGTERM"
        # Restarts log a warning per lost connection; an error is a failure in every case.
        local bad=' (error|warn):'
        [ "$restarts" = 1 ] && bad=' error:'
        if grep -qE "$bad" "$LOG_DIR/$name.vhostd.log"; then
            reason="${reason:+$reason; }vhostd logged: $(grep -E "$bad" "$LOG_DIR/$name.vhostd.log" | head -n 1)"
        fi
        stop_pid "$nbdkit_pid"
        nbdkit_pid=""
        # The guest's write-through phase (wce-toggle) makes durable writes: they carry FUA
        # (nbdkit's file plugin offers it); its write-back phase sends flushes.
        if [ "$restarts" = 0 ] && ! grep -qE " Write .* fua=1" "$dir/cmd.log"; then
            reason="${reason:+$reason; }no write reached the server with FUA"
        fi
        if [ "$restarts" = 0 ] && ! grep -qE " Flush " "$dir/cmd.log"; then
            reason="${reason:+$reason; }no flush reached the server"
        fi
        [ -s "$dir/cmd.log" ] && cp "$dir/cmd.log" "$LOG_DIR/$name.commands.log"
    fi
    if [ -z "$reason" ]; then
        "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" | sed 's/^/  /' ||
            reason="host-verify of rw.img failed"
    fi
    case_end "$name" "$reason"
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" nbd-q2 nbd-q2-restart
#        name             restarts
run_case nbd-q2           0
run_case nbd-q2-restart   1

echo "vhostd-nbd: total $(($(date +%s) - start_all))s, logs in $LOG_DIR"
cases_summary
[ "$failed" = 0 ]
