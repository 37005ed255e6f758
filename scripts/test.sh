#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# The test command: installs what is missing, builds (warnings are errors),
# runs the unit tests, the same under ASan+UBSan, a smoke run of every
# libFuzzer target, and the style check; ends with "N passed, N failed".
# Env: FUZZ_SECONDS (default 20) per fuzz target; VHD_TESTS_QUICK=1 skips fuzzing.
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
    "$@" >"$log" 2>&1
    count "$name" "$log" $?
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

unit_tests=(test_mem test_vq test_options test_runtime test_blk test_vu test_frontend test_sandbox
    test_net test_net_switch test_net_driver test_memguard test_client test_chaos)
unit_tests+=(test_inflight)
unit_tests+=(test_net_gen)
unit_tests+=(test_crash)
unit_tests+=(test_dirtylog)
unit_tests+=(test_access)

note "build (gcc, -Wall -Wextra -Werror)"
run build build build
for t in "${unit_tests[@]}"; do
    if [ -x "build/$t" ]; then run "unit-$t" "build/$t"; else failed=$((failed + 1)); echo "   unit-$t not built"; fi
done

note "build with ASan+UBSan"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:halt_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
run build-asan build build-asan -Db_sanitize=address,undefined -Db_lundef=false \
    -Dc_args=-fno-sanitize-recover=all -Dbuildtype=debug
for t in "${unit_tests[@]}"; do
    if [ -x "build-asan/$t" ]; then run "asan-$t" "build-asan/$t"; else failed=$((failed + 1)); echo "   asan-$t not built"; fi
done

note "build with TSan (threaded parts)"
run build-tsan build build-tsan -Db_sanitize=thread -Db_lundef=false -Dc_args=-Wno-tsan \
    -Dbuildtype=debugoptimized
for t in test_runtime test_blk test_vu test_frontend test_net test_net_switch test_net_driver \
    test_net_gen test_crash test_inflight test_client test_dirtylog; do
    if [ -x "build-tsan/$t" ]; then
        TSAN_OPTIONS=halt_on_error=1 run "tsan-$t" "build-tsan/$t"
    else
        failed=$((failed + 1)); echo "   tsan-$t not built"
    fi
done

if [ "${VHD_TESTS_QUICK:-0}" != 1 ]; then
    note "libFuzzer smoke runs (${FUZZ_SECONDS:-20} s each)"
    CC=clang run build-fuzz build build-fuzz -Dfuzz=true -Dbuildtype=debugoptimized
    for f in fuzz_mem fuzz_vq_split fuzz_vq_packed fuzz_blk fuzz_vu fuzz_inflight fuzz_net; do
        if [ -x "build-fuzz/$f" ]; then
            work=$(mktemp -d)
            cp -r "tests/fuzz/corpus/$f/." "$work/" 2>/dev/null || true
            run "$f" "build-fuzz/$f" -max_total_time="${FUZZ_SECONDS:-20}" -timeout=10 \
                -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$logdir/$f-" "$work"
            rm -rf "$work"
        else
            failed=$((failed + 1)); echo "   $f not built"
        fi
    done
fi

note "real Linux guests (QEMU TCG) on vhostd disks and NICs, and the harness against qemu-storage-daemon"
if [ -x build/vhostd ]; then
    run guest-vhostd-matrix bash tests/guest/vhostd-matrix.sh
    run guest-qsd-smoke bash tests/guest/qsd-smoke.sh
    run guest-net bash tests/guest/net-guests.sh
    run guest-crash bash tests/guest/vhostd-crash.sh
    # Live migration mid-workload (dirty logging), split rings: ~1 min; CASES="split packed" for both.
    run guest-migrate env CASES=split bash tests/guest/vhostd-migrate.sh
else
    failed=$((failed + 1)); echo "   build/vhostd not built: guest tests not run"
fi

note "DPDK interop: dpdk-testpmd (virtio-user) against vhostd's virtio-net loopback"
if [ -x build/vhostd ]; then
    run interop-testpmd bash tests/interop/testpmd-loopback.sh
else
    failed=$((failed + 1)); echo "   build/vhostd not built: interop tests not run"
fi

note "style (clang-format)"
run clang-format bash -c 'git ls-files "*.c" "*.h" | xargs -r clang-format --dry-run -Werror'

echo
if [ "$skipped" -gt 0 ]; then
    echo "$passed passed, $failed failed, $skipped skipped"
else
    echo "$passed passed, $failed failed"
fi
[ "$failed" -eq 0 ]
