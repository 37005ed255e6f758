# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash disable=SC2034 # the variables are the sourcing script's
#
# lib.sh: sourced by the guest scripts that run vhostd under a QEMU guest (vhostd-crash.sh,
# vhostd-matrix.sh) after they set SCRIPT_NAME (theirs, for messages): the pass/fail counters, the
# pids of the vhostd and the guest (run-guest.sh) they started, the scratch directory, stopping
# vhostd, and traps that stop what the script started (by pid) and remove WORK on any exit.

passed=0
failed=0
vhostd_pid=""
guest_pid=""
WORK=""

# stop_vhostd: SIGTERM, wait up to 10 s; vhostd's exit status in $vhostd_status (137 if it
# had to be killed). Not for a $(...) subshell: wait needs the parent shell.
vhostd_status=0
stop_vhostd() {
    local i=0 st=0
    vhostd_status=0
    [ -n "$vhostd_pid" ] || return 0
    kill -TERM "$vhostd_pid" 2>/dev/null || true
    while kill -0 "$vhostd_pid" 2>/dev/null && [ $i -lt 100 ]; do
        sleep 0.1
        i=$((i + 1))
    done
    kill -9 "$vhostd_pid" 2>/dev/null || true
    wait "$vhostd_pid" || st=$?
    vhostd_pid=""
    vhostd_status=$st
}

# shellcheck disable=SC2317 # invoked from the EXIT trap
cleanup() {
    # Only processes this script started, by pid.
    if [ -n "$guest_pid" ]; then
        kill "$guest_pid" 2>/dev/null || true # run-guest.sh stops its QEMU in its own trap
        wait "$guest_pid" 2>/dev/null || true
    fi
    stop_vhostd
    [ -n "$WORK" ] && rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "$SCRIPT_NAME: interrupted"; exit 130' INT TERM
