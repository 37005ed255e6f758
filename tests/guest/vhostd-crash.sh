#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
#
# vhostd-crash.sh: vhostd is killed with SIGKILL, again and again, under a Linux guest's
# verifying write workload, and restarted on the same socket and image each time. QEMU
# (-chardev socket,reconnect=1 -device vhost-user-blk-pci) reconnects, hands the kept inflight
# area back (SET_INFLIGHT_FD) and restarts the rings; the new vhostd resubmits what the dead one
# had taken. Nothing may be lost and no I/O may fail:
#   - the guest's guest-blkcheck runs its random-write workload (every write read back and
#     verified at once, then a final pass that every block holds its newest generation), then
#     flush, discard, write-zeroes and the manifest for the host; every check must pass;
#   - the guest kernel logs no I/O error and no virtqueue complaint;
#   - the host kills vhostd only while the random-write workload runs, each time after the
#     restarted vhostd got its session back (its log shows SET_FEATURES) and a random delay;
#   - every restarted vhostd was handed the inflight area (SET_INFLIGHT_FD, in its log), and
#     some of them resubmitted requests from it ("resubmitting N requests" in their logs);
#   - after the guest powered off, vhostd ends cleanly on SIGTERM and host-verify.sh replays the
#     workload and checks every block of the image file.
# One "PASS|FAIL vhostd-crash/<case>" line per case (split and packed rings; a "SKIP" line for
# each case CASES leaves out), then "N passed, N failed[, N skipped]". A case passes only with all
# KILLS kills done while the workload ran.
#
# Env: VHOSTD (default build/vhostd), GUEST_DIR (build/guest), LOG_DIR (build/vhostd-crash),
# KILLS (15: kills per case; fewer, because the workload ended first, fails the case),
# OPS_4K (16000: 4 KiB writes per guest thread; sized so the workload outlasts KILLS kills on
# a fast host, where each kill costs the workload only the random delay below),
# ATTEMPTS (3: a case whose kills caught no request in flight, data clean, runs again, this often),
# GUEST_TIMEOUT (300 s per boot), CASES (subset of "split packed").
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
VHOSTD=${VHOSTD:-$REPO/build/vhostd}
GUEST_DIR=${GUEST_DIR:-$REPO/build/guest}
LOG_DIR=${LOG_DIR:-$REPO/build/vhostd-crash}
KILLS=${KILLS:-15}
ATTEMPTS=${ATTEMPTS:-3}
OPS_4K=${OPS_4K:-16000}
GUEST_TIMEOUT=${GUEST_TIMEOUT:-300}
IMG_SIZE=$((64 * 1024 * 1024))
SECTORS=$((IMG_SIZE / 512))
QUEUES=2
# Random delay before each kill, after the restarted vhostd got its session back (ms).
MIN_DELAY_MS=50
MAX_DELAY_MS=700
# Bound on waiting for QEMU to reconnect to a restarted vhostd (its reconnect period is 1 s).
SESSION_WAIT_S=30

SCRIPT_NAME=vhostd-crash
# shellcheck source=tests/guest/lib.sh
. "$HERE/lib.sh"
# shellcheck source=tests/common/cases.sh
. "$HERE/../common/cases.sh"

[ -x "$VHOSTD" ] || { echo "vhostd-crash: $VHOSTD not built"; echo "0 passed, 1 failed"; exit 1; }
"$HERE/build-guest.sh" "$GUEST_DIR" | sed 's/^/  /'
mkdir -p "$LOG_DIR"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/vhostd-crash.XXXXXX")

# start_vhostd DIR LOG: one vhostd instance on DIR/rw.sock and DIR/rw.img.
start_vhostd() {
    "$VHOSTD" --workers 2 --log-level info \
        --blk "socket=$1/rw.sock,image=$1/rw.img,queues=$QUEUES,serial=crash-rw" >"$2" 2>&1 &
    vhostd_pid=$!
}

# wait_session LOG: until QEMU is setting the device up on this instance (SET_FEATURES logged);
# fails after SESSION_WAIT_S or when the guest is gone.
wait_session() {
    local i=0
    while ! grep -q ': features 0x' "$1" 2>/dev/null; do
        kill -0 "$guest_pid" 2>/dev/null || return 1
        [ $i -lt $((SESSION_WAIT_S * 20)) ] || return 1
        sleep 0.05
        i=$((i + 1))
    done
}

# in_workload CONSOLE: the guest's random-write workload is running (started, not finished).
in_workload() {
    grep -q '^INFO guest-blkcheck' "$1" 2>/dev/null && ! grep -q '^PERF total' "$1" 2>/dev/null
}

# run_case NAME PACKED(on|off) [ATTEMPT]
run_case() {
    local name=$1 packed=$2 attempt=${3:-1} dir=$WORK/$1 seed rc=0 reason="" t0 kills=0 n=0 console resub
    case_selected "$name" || return 0
    t0=$(date +%s)
    mkdir -p "$dir"
    console=$LOG_DIR/$name.console.log
    rm -f "$LOG_DIR/$name".vhostd.*.log
    seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
    echo "--- vhostd-crash/$name: ring=$([ "$packed" = on ] && echo packed || echo split) queues=$QUEUES kills=$KILLS seed=$seed"
    truncate -s "$IMG_SIZE" "$dir/rw.img"
    "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --prepare --image "$dir/rw.img" --seed "$seed" >/dev/null ||
        reason="preparing rw.img failed"
    if [ -z "$reason" ]; then
        start_vhostd "$dir" "$LOG_DIR/$name.vhostd.0.log"
        : >"$console"
        "$HERE/run-guest.sh" --no-build --guest-dir "$GUEST_DIR" --timeout "$GUEST_TIMEOUT" \
            --log "$console" --sock "$dir/rw.sock" --queues "$QUEUES" --packed "$packed" \
            --reconnect 1 --sectors "$SECTORS" --serial crash-rw --seed "$seed" \
            --require EVENT_IDX,FLUSH --guest-args "--ops-4k $OPS_4K" &
        guest_pid=$!
        # The killer: wait for the workload, then kill and restart while it runs.
        while [ "$kills" -lt "$KILLS" ] && kill -0 "$guest_pid" 2>/dev/null; do
            if ! wait_session "$LOG_DIR/$name.vhostd.$n.log"; then
                kill -0 "$guest_pid" 2>/dev/null &&
                    reason="QEMU did not reconnect to vhostd instance $n within ${SESSION_WAIT_S}s"
                break
            fi
            if ! in_workload "$console"; then
                grep -q '^PERF total' "$console" && break # the workload is over
                sleep 0.1
                continue
            fi
            sleep "$(awk -v a=$MIN_DELAY_MS -v b=$MAX_DELAY_MS -v r=$RANDOM 'BEGIN { printf "%.3f", (a + (b - a) * r / 32767) / 1000 }')"
            in_workload "$console" || break
            kill -9 "$vhostd_pid"
            wait "$vhostd_pid" 2>/dev/null || true
            kills=$((kills + 1))
            n=$((n + 1))
            start_vhostd "$dir" "$LOG_DIR/$name.vhostd.$n.log"
        done
        wait "$guest_pid" || rc=$?
        guest_pid=""
        [ "$rc" = 0 ] || reason="${reason:+$reason; }guest: $(grep -E '^run-guest: FAIL|^GUEST-RESULT' "$console" | tail -n 1) (see $console)"
        if ! kill -0 "$vhostd_pid" 2>/dev/null; then
            reason="${reason:+$reason; }vhostd instance $n died: $(tail -n 1 "$LOG_DIR/$name.vhostd.$n.log")"
        fi
        stop_vhostd
        [ "$vhostd_status" = 0 ] || reason="${reason:+$reason; }vhostd exited with status $vhostd_status on SIGTERM"
        [ "$kills" -ge "$KILLS" ] ||
            reason="${reason:+$reason; }only $kills of $KILLS kills before the workload ended (raise OPS_4K)"
        if tr -d '\r' <"$console" | grep -qE '^DMESG .*(I/O error|blk_update_request|broken)'; then
            reason="${reason:+$reason; }guest kernel: $(tr -d '\r' <"$console" | grep -E '^DMESG .*(I/O error|blk_update_request|broken)' | head -n 1)"
        fi
        # Each restarted instance got QEMU's kept inflight area (SET_INFLIGHT_FD): the
        # resubmission path, not luck, is what kept the data.
        for i in $(seq 1 "$n"); do
            grep -q 'inflight area set' "$LOG_DIR/$name.vhostd.$i.log" ||
                reason="${reason:+$reason; }vhostd instance $i never got the inflight area"
        done
        if grep -hqE ' error:' "$LOG_DIR/$name".vhostd.*.log; then
            reason="${reason:+$reason; }vhostd logged: $(grep -hE ' error:' "$LOG_DIR/$name".vhostd.*.log | head -n 1)"
        fi
    fi
    if [ -z "$reason" ]; then
        "$HERE/host-verify.sh" --guest-dir "$GUEST_DIR" --image "$dir/rw.img" --seed "$seed" | sed 's/^/  /' ||
            reason="host-verify of rw.img failed"
    fi
    # What the restarted vhostd instances resubmitted from the inflight area (their log lines).
    resub=$(awk 'match($0, /resubmit[a-z]* [0-9]+/) {
            n = split(substr($0, RSTART, RLENGTH), w, " "); s += w[n]; seen = 1
        } END { print seen ? s " requests resubmitted by restarted vhostd instances" : "resubmissions not in the vhostd logs" }' "$LOG_DIR/$name".vhostd.*.log)
    # Some request the killed instances had taken must have come back through the area.
    case "$resub" in
    0\ * | resubmissions\ not*) reason="${reason:+$reason; }no resubmission in the vhostd logs ($resub)" ;;
    esac
    rm -rf "$dir"
    # A clean run whose kills all fell between requests proved nothing about resubmission: on a
    # fast host the guest's few requests are in vhostd only part of the time. Run it again.
    if [ "$reason" = "no resubmission in the vhostd logs ($resub)" ] && [ "$attempt" -lt "$ATTEMPTS" ]; then
        echo "    vhostd-crash/$name: $kills kills, none caught a request in flight (data verified clean); again ($((attempt + 1))/$ATTEMPTS)"
        run_case "$name" "$packed" $((attempt + 1))
        return
    fi
    if [ -z "$reason" ]; then
        echo "PASS vhostd-crash/$name ($(($(date +%s) - t0))s): $kills kills survived, $resub, guest and host-verify clean"
        passed=$((passed + 1))
    else
        echo "FAIL vhostd-crash/$name ($(($(date +%s) - t0))s, $kills kills): $reason"
        failed=$((failed + 1))
    fi
}

cases_plan "$SCRIPT_NAME" "${CASES:-}" split packed
run_case split off
run_case packed on

echo "vhostd-crash: logs in $LOG_DIR"
cases_summary
[ "$failed" = 0 ]
