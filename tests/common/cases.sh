# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash disable=SC2034,SC2154 # passed/failed are the sourcing script's counters
#
# cases.sh: sourced by the guest and interop scripts. A group states the cases it must run
# (cases_plan); a selection such as CASES or TESTPMD_CASES narrows it, and what it leaves out is
# shown and counted as skipped, never silent; a selected name that is no case fails. The group's
# last line (cases_summary) is "N passed, N failed[, N skipped]", and a selected case that
# reported neither PASS nor FAIL counts as failed. The script keeps its own passed/failed.

cases_group=""
cases_all=""
cases_run=""
cases_skipped=0
cases_unknown=0

# cases_plan GROUP SELECTION CASE...: GROUP must run every CASE; a non-empty SELECTION (space
# separated names) runs only those. One "SKIP GROUP/case" line per case left out.
cases_plan() {
    cases_group=$1
    local sel=$2 c n=0
    shift 2
    cases_all="$*"
    cases_run=""
    for c in "$@"; do
        if [ -z "$sel" ] || [[ " $sel " == *" $c "* ]]; then
            cases_run+="$c "
            n=$((n + 1))
        else
            echo "SKIP $cases_group/$c (not selected: '$sel')"
            cases_skipped=$((cases_skipped + 1))
        fi
    done
    for c in $sel; do
        if [[ " $* " != *" $c "* ]]; then
            echo "FAIL $cases_group/$c: no such case (cases: $*)"
            failed=$((failed + 1))
            cases_unknown=$((cases_unknown + 1))
        fi
    done
    echo "$cases_group: must run $# cases; running $n, skipping $cases_skipped"
}

# case_selected NAME: 0 when NAME is one of the cases to run; a NAME the plan does not list is
# a FAIL (a case added to a script but not to its plan must not go unnoticed).
case_selected() {
    if [[ " $cases_all " != *" $1 "* ]]; then
        echo "FAIL $cases_group/$1: not in the group's plan ($cases_all)"
        failed=$((failed + 1))
        cases_unknown=$((cases_unknown + 1))
        return 1
    fi
    [[ " $cases_run " == *" $1 "* ]]
}

# cases_summary: the group's last line. Fewer PASS/FAIL results than selected cases (a case
# that returned early without a verdict) are counted as failed.
cases_summary() {
    local want got
    want=$(wc -w <<<"$cases_run")
    got=$((passed + failed - cases_unknown))
    if [ "$got" -lt "$want" ]; then
        echo "FAIL $cases_group: $((want - got)) of $want selected cases reported no result"
        failed=$((failed + want - got))
    fi
    if [ "$cases_skipped" -gt 0 ]; then
        echo "$passed passed, $failed failed, $cases_skipped skipped"
    else
        echo "$passed passed, $failed failed"
    fi
}
