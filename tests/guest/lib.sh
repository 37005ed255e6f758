# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash disable=SC2034,SC2154 # the variables are the sourcing script's
#
# lib.sh: sourced by the guest scripts that run a vhost-user back-end under a QEMU guest
# (vhostd-crash.sh, vhostd-matrix.sh, client-mode.sh, qsd-smoke.sh, vhostd-migrate.sh) after they set SCRIPT_NAME
# (theirs, for messages): the pass/fail counters, the pids of the vhostd (or other back-end, such
# as qemu-storage-daemon) and the guest (run-guest.sh) they started, the scratch directory,
# stopping them, the start and end of a case (case_begin, case_end), and traps that stop what the
# script started (by pid) and remove WORK on any exit.

passed=0
failed=0
vhostd_pid=""
backend_pid="" # a back-end other than vhostd (qemu-storage-daemon)
guest_pid=""
WORK=""

# stop_pid PID: SIGTERM, wait up to 10 s, then SIGKILL; its exit status in $stop_status (137
# if it had to be killed; 0 without a PID). Not for a $(...) subshell: wait needs the parent shell.
stop_status=0
stop_pid() {
    local pid=$1 i=0 st=0
    stop_status=0
    [ -n "$pid" ] || return 0
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" || st=$?
    stop_status=$st
}

# stop_vhostd: stop_pid of vhostd; its exit status in $vhostd_status.
vhostd_status=0
stop_vhostd() {
    stop_pid "$vhostd_pid"
    vhostd_pid=""
    vhostd_status=$stop_status
}

# stop_backend: stop_pid of the other back-end.
stop_backend() {
    stop_pid "$backend_pid"
    backend_pid=""
}

# case_begin NAME DEADLINE_VAR: 0 when case NAME runs now, with the caller's t0, dir (made) and
# seed set; 1 when it does not: not selected (cases_plan, tests/common/cases.sh), or more than
# ${!DEADLINE_VAR} seconds since start_all (counted as failed).
case_begin() {
    local name=$1 limit=${!2}
    case_selected "$name" || return 1
    if [ $(($(date +%s) - start_all)) -gt "$limit" ]; then
        echo "FAIL $SCRIPT_NAME/$name: not started, $2=${limit}s exceeded"
        failed=$((failed + 1))
        return 1
    fi
    t0=$(date +%s)
    mkdir -p "$dir"
    seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
}

# case_end NAME REASON [WHAT-PASSED]: remove the caller's dir; one PASS (REASON empty) or FAIL
# line with the seconds since t0, counted.
case_end() {
    rm -rf "$dir"
    if [ -z "$2" ]; then
        echo "PASS $SCRIPT_NAME/$1 ($(($(date +%s) - t0))s)${3:+: $3}"
        passed=$((passed + 1))
    else
        echo "FAIL $SCRIPT_NAME/$1 ($(($(date +%s) - t0))s): $2"
        failed=$((failed + 1))
    fi
}

# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    # Only processes this script started, by pid.
    if [ -n "$guest_pid" ]; then
        kill "$guest_pid" 2>/dev/null || true # run-guest.sh stops its QEMU in its own trap
        wait "$guest_pid" 2>/dev/null || true
    fi
    stop_vhostd
    stop_backend
    [ -n "$WORK" ] && rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "$SCRIPT_NAME: interrupted"; exit 130' INT TERM
