#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The test command: installs what is missing, builds (warnings are errors),
# runs the unit and integration tests, the same under ASan+UBSan (leak checks
# on) and the threaded ones under TSan, a smoke run of every libFuzzer target,
# the guest and interop scripts, and the style check; ends with "N passed,
# N failed[, N skipped]". The tests are the ones meson.build defines, by suite
# (unit, integration, tsan, guest, interop): this script names none of them.
# Env: FUZZ_SECONDS (default 20) per fuzz target; VHD_TESTS_QUICK=1 skips
# fuzzing (each target is counted as skipped).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
logdir="$root/build-logs"
mkdir -p "$logdir"

passed=0
failed=0
skipped=0

note() { printf '== %s\n' "$*"; }

# count NAME LOG RC: add the "N passed, N failed[, N skipped]" line of a log to the
# totals; a run that printed no such line counts as one pass or one failure by RC.
count() {
    local name=$1 log=$2 rc=$3 line
    line=$(grep -Eo '[0-9]+ passed, [0-9]+ failed(, [0-9]+ skipped)?' "$log" | tail -n 1)
    if [ -n "$line" ]; then
        local p f s
        p=$(echo "$line" | sed -E 's/^([0-9]+) passed.*/\1/')
        f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
        s=$(echo "$line" | grep -Eo '[0-9]+ skipped' | grep -Eo '[0-9]+' || echo 0)
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
        passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
        printf '   %-28s %s\n' "$name" "$line"
    elif [ "$rc" -eq 0 ]; then
        passed=$((passed + 1)); printf '   %-28s ok\n' "$name"
    else
        failed=$((failed + 1)); printf '   %-28s FAILED (rc %d, log %s)\n' "$name" "$rc" "$log"
    fi
    # A failure's own lines first (a guest's console can print pages before them), then the
    # context a test printed around its failures.
    if [ "$rc" -ne 0 ]; then
        {
            grep -E '^FAIL' "$log" | head -n 20
            grep -E '^  |ERROR|error:|SUMMARY' "$log" | head -n 40
        } | sed 's/^/      /'
    fi
}

# run NAME CMD...: run a step, log to build-logs/NAME.log, count its result.
run() {
    local name=$1; shift
    local log="$logdir/$name.log"
    "$@" >"$log" 2>&1 </dev/null
    count "$name" "$log" $?
}

# suite_tests DIR SUITE: the tests meson defines in SUITE for build DIR, one a line:
# NAME, TAB, TIMEOUT, TAB, then the command with its environment (env K=V... CMD ARGS...),
# shell-quoted.
suite_tests() {
    meson introspect "$1" --tests | python3 -c '
import json, shlex, sys
suite = sys.argv[1]
for t in json.load(sys.stdin):
    if not any(s == suite or s.endswith(":" + suite) for s in t["suite"]):
        continue
    env = ["%s=%s" % kv for kv in sorted((t.get("env") or {}).items())]
    cmd = ["env"] + env + t["cmd"]
    print("%s\t%d\t%s" % (t["name"], t["timeout"] or 0, " ".join(shlex.quote(c) for c in cmd)))
' "$2"
}

# run_suite DIR SUITE PREFIX: run every test of SUITE in build DIR (one count() line each, as
# PREFIX-NAME), each bounded by its meson timeout. A suite meson lists no test for is a failure.
run_suite() {
    local dir=$1 suite=$2 prefix=$3 n=0 name tmo cmd list
    if ! list=$(suite_tests "$dir" "$suite"); then
        failed=$((failed + 1)); echo "   $prefix: cannot list the $suite tests of $dir"; return
    fi
    while IFS=$'\t' read -r -u 3 name tmo cmd; do
        [ -n "$name" ] || continue
        n=$((n + 1))
        [ "$tmo" -gt 0 ] || tmo=3600
        eval "run \"\$prefix-\$name\" timeout --kill-after=30 \"\$tmo\" $cmd"
    done 3<<<"$list"
    if [ "$n" -eq 0 ]; then
        failed=$((failed + 1)); echo "   $prefix: meson defines no $suite tests in $dir"
    fi
}

note "dependencies"
if ! bash scripts/deps.sh test; then
    echo "dependency installation failed"; echo "0 passed, 1 failed"; exit 1
fi

# build DIR ARGS...: configure (once) and build a variant.
build() {
    local dir=$1; shift
    if [ ! -f "$dir/build.ninja" ]; then
        meson setup "$dir" "$@" || return 1
    else
        meson configure "$dir" "$@" >/dev/null || return 1
    fi
    ninja -C "$dir"
}

note "build (gcc, -Wall -Wextra -Werror)"
run build build build
run_suite build unit unit
run_suite build integration integration

note "build with ASan+UBSan (leak checks on)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run build-asan build build-asan -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fno-sanitize-recover=all -Dbuildtype=debug
run_suite build-asan unit asan
run_suite build-asan integration asan

note "build with TSan (threaded parts)"
run build-tsan build build-tsan -Db_sanitize=thread -Db_lundef=false -Dc_args=-Wno-tsan \
    -Dbuildtype=debugoptimized
TSAN_OPTIONS=halt_on_error=1 run_suite build-tsan tsan tsan

nfuzz=$(find tests/fuzz -maxdepth 1 -name 'fuzz_*.c' | wc -l)
if [ "${VHD_TESTS_QUICK:-0}" != 1 ]; then
    note "libFuzzer smoke runs (${FUZZ_SECONDS:-20} s each)"
    CC=clang run build-fuzz build build-fuzz -Dfuzz=true -Dbuildtype=debugoptimized
    # The targets are the fuzz_* executables meson defines (one per tests/fuzz/fuzz_*.c).
    fuzzers=$(meson introspect build-fuzz --targets 2>/dev/null |
        python3 -c 'import json, sys; print("\n".join(t["name"] for t in json.load(sys.stdin) if t["type"] == "executable" and t["name"].startswith("fuzz_")))')
    if [ "$(wc -w <<<"$fuzzers")" != "$nfuzz" ]; then
        failed=$((failed + 1)); echo "   meson defines $(wc -w <<<"$fuzzers") fuzz targets for $nfuzz tests/fuzz/fuzz_*.c"
    fi
    for f in $fuzzers; do
        work=$(mktemp -d)
        cp -r "tests/fuzz/corpus/$f/." "$work/" 2>/dev/null || true
        run "$f" "build-fuzz/$f" -max_total_time="${FUZZ_SECONDS:-20}" -timeout=10 \
            -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$logdir/$f-" "$work"
        rm -rf "$work"
    done
else
    note "libFuzzer smoke runs: skipped (VHD_TESTS_QUICK=1)"
    skipped=$((skipped + nfuzz)); printf '   %-28s %s\n' fuzz "$nfuzz skipped (VHD_TESTS_QUICK=1)"
fi

note "real Linux guests (QEMU TCG) on vhostd disks and NICs, and the harness against qemu-storage-daemon"
run_suite build guest guest

note "DPDK interop: dpdk-testpmd (virtio-user) against vhostd's virtio-net loopback, server and client"
run_suite build interop interop

note "style (clang-format)"
run clang-format bash -c 'git ls-files "*.c" "*.h" | xargs -r clang-format --dry-run -Werror'
run layers python3 scripts/check-layers.py

echo
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
